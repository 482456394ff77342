#include "proto/status.h"

#include <stddef.h>

const char *cluster_runner_status_name(int v)
{
    static const char *const names[] = {"Idle",  "Connecting", "Loading",
                                        "WarmingUp", "Ready", "Running",
                                        "ShuttingDown", "Shutdown", "Failed"};
    return v >= 0 && v < CLUSTER_RUNNER_STATUS_COUNT ? names[v] : NULL;
}

