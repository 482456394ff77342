/* The worker's pure planner (plan.h). */
#include "ctl/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"

struct acts {
    struct plan_action *a;
    size_t n, cap;
};

static struct plan_action *push(struct acts *v, enum plan_action_kind kind, const char *runner_id,
                                const char *instance_id)
{
    if (array_reserve(&v->a, &v->cap, v->n + 1, sizeof *v->a, 8))
        return NULL;
    struct plan_action *x = &v->a[v->n++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    snprintf(x->runner_id, sizeof x->runner_id, "%s", runner_id);
    snprintf(x->instance_id, sizeof x->instance_id, "%s", instance_id);
    return x;
}

/* The shard of instance_id that runner_id runs on node_id, or NULL. */
static const struct cluster_shard *shard_here(const struct cluster_state *s, const char *node_id,
                                              const char *instance_id, const char *runner_id)
{
    const struct cluster_instance *in = cluster_state_find_instance(s, instance_id);
    if (!in)
        return NULL;
    for (size_t i = 0; i < in->n_shards; i++)
        if (!strcmp(in->shards[i].node_id, node_id) && !strcmp(in->shards[i].runner_id, runner_id))
            return &in->shards[i];
    return NULL;
}

static const struct plan_runner *find_held(const struct plan_runner *held, size_t n_held,
                                           const char *runner_id)
{
    for (size_t i = 0; i < n_held; i++)
        if (!strcmp(held[i].runner_id, runner_id))
            return &held[i];
    return NULL;
}

int plan_compute(const struct cluster_state *s, const char *node_id, const struct plan_runner *held,
                 size_t n_held, plan_model_fn model, void *model_ctx, struct plan_action **out,
                 size_t *n_out)
{
    if (!s || !node_id || (!held && n_held) || !model || !out || !n_out)
        return CAIRN_EINVAL;
    *out = NULL;
    *n_out = 0;
    struct acts v = {0};
    for (size_t i = 0; i < n_held; i++) {
        const struct plan_runner *h = &held[i];
        if (h->status == CLUSTER_RUNNER_SHUTTING_DOWN || h->status == CLUSTER_RUNNER_SHUTDOWN)
            continue;
        const struct cluster_instance *in = cluster_state_find_instance(s, h->instance_id);
        if (shard_here(s, node_id, h->instance_id, h->runner_id) && h->epoch == in->epoch)
            continue;
        if (!push(&v, PLAN_STOP, h->runner_id, h->instance_id))
            goto oom;
    }
    for (size_t k = 0; k < s->n_instances; k++) {
        const struct cluster_instance *in = &s->instances[k];
        for (size_t i = 0; i < in->n_shards; i++) {
            const struct cluster_shard *sh = &in->shards[i];
            if (strcmp(sh->node_id, node_id))
                continue;
            const struct plan_runner *h = find_held(held, n_held, sh->runner_id);
            /* A runner id held for another instance is being stopped above; its new
             * shard starts once it is gone. */
            if (h)
                continue;
            char path[RUNNER_PATH_MAX], why[PLAN_REASON_MAX];
            why[0] = 0;
            int rc = model(model_ctx, in->model_id, sh->layer_begin, sh->layer_end, path, sizeof path, why,
                           sizeof why);
            struct plan_action *x = push(&v, rc ? PLAN_FAIL : PLAN_START, sh->runner_id, in->id);
            if (!x)
                goto oom;
            x->cfg.epoch = in->epoch;
            x->cfg.layer_begin = sh->layer_begin; /* FAIL too: a fetch of the shard's layers */
            x->cfg.layer_end = sh->layer_end;
            if (rc) {
                /* The lookup's message names the model; a bare code gets it here. */
                if (why[0])
                    memcpy(x->reason, why, sizeof x->reason);
                else
                    snprintf(x->reason, sizeof x->reason, "model %s: %s", in->model_id,
                             cairn_strerror(rc));
                x->reason[sizeof x->reason - 1] = 0;
                continue;
            }
            runner_config_defaults(&x->cfg);
            x->cfg.epoch = in->epoch;
            snprintf(x->cfg.instance_id, sizeof x->cfg.instance_id, "%s", in->id);
            snprintf(x->cfg.runner_id, sizeof x->cfg.runner_id, "%s", sh->runner_id);
            snprintf(x->cfg.model_path, sizeof x->cfg.model_path, "%s", path);
            x->cfg.layer_begin = sh->layer_begin;
            x->cfg.layer_end = sh->layer_end;
            x->cfg.num_draft_tokens = in->num_draft_tokens;
            x->cfg.ctx = in->kv.ctx_len;
            if (in->kv.type_k[0])
                x->cfg.cache_type_k = dtype_kv_from_name(in->kv.type_k);
            if (in->kv.type_v[0])
                x->cfg.cache_type_v = dtype_kv_from_name(in->kv.type_v);
            x->cfg.rank = sh->rank;
            x->cfg.world_size = (int)in->n_shards;
            x->cfg.tensor = in->sharding == CLUSTER_SHARDING_TENSOR && in->n_shards > 1;
            /* the data plane's handshake refuses ranks that name the model otherwise */
            snprintf(x->cfg.model_identity, sizeof x->cfg.model_identity, "%.*s", RUNNER_IDENTITY_MAX, in->model_id);
            /* The draft runs on the first rank; a draft this node cannot find only
             * leaves the instance without one (the worker says so). */
            if (sh->rank == 0 && in->draft_model[0] &&
                model(model_ctx, in->draft_model, 0, -1, x->cfg.draft_model_path, sizeof x->cfg.draft_model_path, why,
                      sizeof why))
                x->cfg.draft_model_path[0] = 0;
        }
    }
    *out = v.a;
    *n_out = v.n;
    return 0;
oom:
    free(v.a);
    return CAIRN_ENOMEM;
}
