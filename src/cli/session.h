/* Readying a model for cairn run through a node's public API: the model found in the
 * cluster (or pulled from the hub onto the node, with the pull's progress bar), an
 * instance of it found or placed (and where it went shown: which nodes, how many layers
 * each), and its runners waited for until they serve. Messages go to stderr. */
#ifndef CAIRN_CLI_SESSION_H
#define CAIRN_CLI_SESSION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "cli/client.h"
#include "node/hubref.h"
#include "proto/ids.h"

#define SESSION_READY_S 600 /* bound on waiting for an instance's runners to load */

/* What is ready to chat with. */
struct session_model {
    char id[HUBREF_TEXT_MAX];               /* the model's id in the cluster */
    char instance[IDS_ID_MAX + 1];          /* its instance */
};

/* Finds model (an id, or a hub reference as typed) in the cluster, pulling it onto the
 * node when it is a hub reference no node has; places an instance unless one exists and
 * waits (bound SESSION_READY_S, or *cancel) until its runners are ready. 0 with *out
 * filled, else a CAIRN_E* code with the reason in err. */
int session_ready(const struct client *api, const char *model, const atomic_bool *cancel, struct session_model *out,
                  char *err, size_t errlen);

/* The instance of model_id in a /state (the first found), or NULL. Borrowed from state. */
const char *session_instance_of(const json_t *state, const char *model_id);

#endif
