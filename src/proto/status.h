/* A runner's lifecycle (DESIGN.md, "Runner state machine"): the runner reports it to
 * its node (proto/runner_proto.h), the node records it in the replicated state. */
#ifndef CAIRN_PROTO_STATUS_H
#define CAIRN_PROTO_STATUS_H

enum cluster_runner_status {
    CLUSTER_RUNNER_IDLE,
    CLUSTER_RUNNER_CONNECTING,
    CLUSTER_RUNNER_LOADING,
    CLUSTER_RUNNER_WARMING_UP,
    CLUSTER_RUNNER_READY,
    CLUSTER_RUNNER_RUNNING,
    CLUSTER_RUNNER_SHUTTING_DOWN,
    CLUSTER_RUNNER_SHUTDOWN,
    CLUSTER_RUNNER_FAILED,
    CLUSTER_RUNNER_STATUS_COUNT
};

/* Static JSON name of a status ("Idle", "WarmingUp" ...); NULL for a value out of range. */
const char *cluster_runner_status_name(int v);

#endif
