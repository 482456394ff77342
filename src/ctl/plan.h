/* plan(state, node, runners) -> actions: the pure decision of what this node's worker
 * does next (DESIGN.md). It reads the cluster state, the node's id and the runners the
 * node's supervisor holds now, and returns the runners to start (one per shard placed
 * on this node whose runner is not held), those to stop (held, but their instance is
 * gone, the shard is no longer on this node, or the runner was started for an older
 * epoch of its instance: a rank's failure moved the instance to a new epoch, so every
 * rank stops and, once gone, starts again with the new one) and those that cannot
 * start (the model
 * file is unknown here: a Failed report with the reason). Actions come in a
 * deterministic order: stops in the order of the held runners, then starts and failures
 * in the state's instance order and rank order. Nothing else is touched. */
#ifndef CAIRN_CTL_PLAN_H
#define CAIRN_CTL_PLAN_H

#include <stddef.h>

#include "proto/runner_proto.h"
#include "ctl/state.h"

#define PLAN_REASON_MAX 512

/* A runner the node holds: any status; ShuttingDown and Shutdown are being stopped and
 * are never stopped again, Failed ones stay until their shard leaves this node. */
struct plan_runner {
    char runner_id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1];
    enum cluster_runner_status status;
    int64_t epoch; /* of its config (runner_config.epoch) */
};

enum plan_action_kind {
    PLAN_START, /* start a runner with cfg */
    PLAN_STOP,  /* stop runner_id */
    PLAN_FAIL,  /* runner_id cannot start: report it Failed with reason */
};

struct plan_action {
    enum plan_action_kind kind;
    char runner_id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1];
    struct runner_config cfg;      /* START; FAIL: only cfg.epoch (the instance's) and the layers */
    char reason[PLAN_REASON_MAX]; /* FAIL */
};

/* Finds the file of a model for this node, for a shard of layers [layer_begin,
 * layer_end) (a draft: 0, -1, the whole model): 0 with its path in path (pathlen bytes),
 * or a negative code with the reason (naming the model) in err, which becomes the FAIL
 * action's reason. Must be deterministic for plan to be. */
typedef int (*plan_model_fn)(void *ctx, const char *model_id, int layer_begin, int layer_end, char *path,
                             size_t pathlen, char *err, size_t errlen);

/* Computes the actions for node_id (see the top) into *out (malloc'd, *n_out entries;
 * NULL and 0 when none; free()). Started runners get runner_config_defaults plus the
 * ids, the model path and the shard's layer range. CAIRN_EINVAL for a NULL argument,
 * CAIRN_ENOMEM. */
int plan_compute(const struct cluster_state *s, const char *node_id, const struct plan_runner *held,
                 size_t n_held, plan_model_fn model, void *model_ctx, struct plan_action **out,
                 size_t *n_out);

#endif
