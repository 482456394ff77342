/* The node of a cairn run session when none answers on this machine: `cairn node` started
 * in the background (its own session, so the terminal's Ctrl-C is not its), on loopback,
 * with the user's data dir and discovery, and stopped when the session ends. */
#ifndef CAIRN_CLI_LOCALNODE_H
#define CAIRN_CLI_LOCALNODE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "cli/client.h"

#define LOCALNODE_START_S 60 /* bound on waiting for its API */
#define LOCALNODE_STOP_S 15  /* bound on waiting for it to leave, then SIGKILL */

/* What the node is started with; NULL members are the node's defaults. */
struct localnode_config {
    const char *models_dir, *discovery, *cluster_port, *data_dir;
};

struct localnode {
    pid_t pid; /* 0: none started */
};

/* Starts a node whose API is api's address (a loopback one; else CAIRN_EINVAL) and waits
 * until it answers (bound LOCALNODE_START_S, or *cancel); 0, or a CAIRN_E* code with the
 * reason in err (the node is stopped then). */
int localnode_start(struct localnode *n, const struct client *api, const struct localnode_config *cfg,
                    const atomic_bool *cancel, char *err, size_t errlen);

/* Stops the node started (SIGTERM, then SIGKILL after LOCALNODE_STOP_S); accepts one never
 * started. */
void localnode_stop(struct localnode *n);

#endif
