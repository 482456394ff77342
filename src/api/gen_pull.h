/* Pulling and deleting models on a node for the API (gen.h's pull and remove, as
 * gen_node serves them): a pull runs hub_pull into the node's models folder on a
 * detached thread of its own; the catalog lists the model at its next scan. */
#ifndef CAIRN_API_GEN_PULL_H
#define CAIRN_API_GEN_PULL_H

#include "api/gen.h"
#include "node/node.h"

int gen_pull_start(struct node *n, const char *ref, const atomic_bool *cancel, hub_progress_fn fn,
                   gen_pull_done_fn done, void *ctx, char *err, size_t errlen);
int gen_pull_remove(struct node *n, const char *model, char *err, size_t errlen);

#endif
