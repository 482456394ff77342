#include "ctl/master.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/json.h"
#include "ctl/estimate.h"

/* ---- model cards ---- */

uint32_t master_card_ctx(const struct catalog_card *c)
{
    return c->n_ctx > 0 && c->n_ctx < MASTER_CTX_LEN ? (uint32_t)c->n_ctx : MASTER_CTX_LEN;
}

uint64_t master_kv_token_layer_bytes(const struct catalog_card *card, const struct cluster_kv *kv)
{
    int64_t kv_dim = (int64_t)(card->kv_bytes_per_token_layer / 4); /* the card counts F16 K and V */
    int tk = kv && kv->type_k[0] ? dtype_kv_from_name(kv->type_k) : DT_F16;
    int tv = kv && kv->type_v[0] ? dtype_kv_from_name(kv->type_v) : DT_F16;
    /* the cache quantizes each head's row on its own (attn.h) */
    if (card->head_dim < 1 || dtype_row_bytes(tk, card->head_dim) < 0 || dtype_row_bytes(tv, card->head_dim) < 0)
        return 0;
    int64_t k = dtype_row_bytes(tk, kv_dim), v = dtype_row_bytes(tv, kv_dim);
    return k < 0 || v < 0 ? 0 : (uint64_t)k + (uint64_t)v;
}

/* Positions of the KV pool of an instance's runners (what the master counts). */
static uint64_t pool_positions(const struct catalog_card *card, const struct cluster_kv *kv)
{
    int64_t ctx = kv && kv->ctx_len > 0 ? kv->ctx_len : (int64_t)master_card_ctx(card);
    return (uint64_t)runner_kv_pool_positions(ctx);
}

#define MASTER_PAGE_BYTES 4096 /* the page size the master assumes of the nodes' caches */

uint64_t master_window_positions(const struct catalog_card *card, const struct cluster_kv *kv, uint64_t pool)
{
    if (!card->layer_swa || card->swa_window <= 0 || card->head_dim < 1 || pool > INT64_MAX)
        return pool;
    int tk = kv && kv->type_k[0] ? dtype_kv_from_name(kv->type_k) : DT_F16;
    int tv = kv && kv->type_v[0] ? dtype_kv_from_name(kv->type_v) : DT_F16;
    int64_t kv_dim = (int64_t)card->n_head_kv * card->head_dim;
    if (!runner_kv_window_releasable(dtype_row_bytes(tk, kv_dim), dtype_row_bytes(tv, kv_dim), MASTER_PAGE_BYTES))
        return pool;
    return (uint64_t)runner_kv_window_positions((int64_t)pool, card->swa_window, RUNNER_DEFAULT_SLOTS);
}

/* ---- events ---- */

void master_events_clear(struct master_events *out)
{
    for (size_t i = 0; i < out->n; i++)
        event_clear(&out->ev[i]);
    free(out->ev);
    memset(out, 0, sizeof *out);
}

/* A new zeroed event of kind at the end of out, or NULL when out of memory. */
static struct event *add_event(struct master_events *out, enum event_kind kind)
{
    if (array_reserve(&out->ev, &out->cap, out->n + 1, sizeof *out->ev, 4))
        return NULL;
    struct event *e = &out->ev[out->n++];
    event_init(e, kind, 0, 0);
    return e;
}

/* Checks an event built here as other nodes will check it; its position (not set yet)
 * is checked as a valid one. */
static int validate(struct event *e, char *err, size_t errlen)
{
    e->term = 1;
    int rc = event_validate(e, err, errlen);
    e->term = 0;
    return rc;
}

/* Drops the events from index `from` on (a refusal appends nothing). */
static void truncate_events(struct master_events *out, size_t from)
{
    while (out->n > from)
        event_clear(&out->ev[--out->n]);
}

/* ---- memory held by placed instances ---- */

static uint64_t sat_add(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* KV bytes of layers [b, e) for a pool of `pool` positions: a sliding-window layer holds
 * master_window_positions of them. */
static uint64_t kv_range_bytes(const struct catalog_card *card, const struct cluster_kv *kv, uint64_t pool,
                               uint32_t b, uint32_t e)
{
    uint64_t window = master_window_positions(card, kv, pool), positions = 0;
    for (uint32_t l = b; l < e && l < (uint32_t)card->n_layers; l++)
        positions = sat_add(positions, card->layer_swa && card->layer_swa[l] ? window : pool);
    return sat_mul(master_kv_token_layer_bytes(card, kv), positions);
}

/* The draft's weights and F16 KV for a pool of `positions`. */
static uint64_t draft_need(const struct catalog_card *draft, uint64_t positions)
{
    if (!draft)
        return 0;
    uint64_t kv = sat_mul(sat_mul(draft->kv_bytes_per_token_layer, (uint64_t)draft->n_layers), positions);
    return sat_add(draft->weight_bytes, kv);
}

uint64_t master_shard_bytes(const struct catalog_card *card, const struct catalog_card *draft,
                            const struct cluster_instance *in, size_t i)
{
    if (!card || card->error || !card->layer_bytes || card->n_layers < 1 || i >= in->n_shards)
        return 0;
    const struct cluster_shard *sh = &in->shards[i];
    uint32_t b = sh->layer_begin > 0 ? (uint32_t)sh->layer_begin : 0;
    uint32_t e = sh->layer_end > 0 ? (uint32_t)sh->layer_end : 0;
    if (e > (uint32_t)card->n_layers)
        e = (uint32_t)card->n_layers;
    uint64_t layers = 0;
    for (uint32_t l = b; l < e; l++)
        layers = sat_add(layers, card->layer_bytes[l]);
    uint64_t positions = pool_positions(card, &in->kv);
    uint64_t kv = kv_range_bytes(card, &in->kv, positions, b, e);
    uint64_t norm = card->output_norm_bytes + card->other_bytes;
    bool first = sh->rank == 0, last = (size_t)sh->rank + 1 == in->n_shards;
    uint64_t k = in->n_shards ? in->n_shards : 1;
    uint64_t total;
    if (in->sharding == CLUSTER_SHARDING_TENSOR) {
        total = sat_add(layers / k + (layers % k != 0), kv / k + (kv % k != 0));
        total = sat_add(total, sat_add(card->embd_bytes, norm));
        if (!card->tied_output)
            total = sat_add(total, card->head_bytes / k + (card->head_bytes % k != 0));
    } else {
        total = sat_add(layers, kv);
        if (first)
            total = sat_add(total, card->embd_bytes);
        if (last) {
            total = sat_add(total, norm);
            total = sat_add(total, card->tied_output ? (first ? 0 : card->embd_bytes) : card->head_bytes);
        }
    }
    if (first)
        total = sat_add(total, draft_need(draft, positions));
    return total;
}

/* The card of id, or of nothing when id is "" (*has false). */
static int lookup(const struct master_env *env, const char *id, struct catalog_card *card,
                  bool *has, char *err, size_t errlen)
{
    *has = false;
    memset(card, 0, sizeof *card);
    if (!id || !id[0])
        return 0;
    int rc = env->card(env->card_ctx, id, card, err, errlen);
    if (rc == 0)
        *has = true;
    return rc;
}

/* Bytes held on each node of s by the instances placed there, into held[n_nodes]. */
static int held_bytes(const struct cluster_state *s, const struct master_env *env,
                      uint64_t *held)
{
    for (size_t i = 0; i < s->n_instances; i++) {
        const struct cluster_instance *in = &s->instances[i];
        struct catalog_card card, draft;
        bool has_card, has_draft;
        char ignored[256];
        int rc = lookup(env, in->model_id, &card, &has_card, ignored, sizeof ignored);
        if (rc == CAIRN_ENOMEM)
            return rc;
        rc = lookup(env, in->draft_model, &draft, &has_draft, ignored, sizeof ignored);
        if (rc == CAIRN_ENOMEM) {
            catalog_card_clear(&card);
            return rc;
        }
        for (size_t k = 0; has_card && k < in->n_shards; k++) {
            for (size_t n = 0; n < s->n_nodes; n++) {
                if (!strcmp(s->nodes[n].id, in->shards[k].node_id)) {
                    held[n] = sat_add(held[n], master_shard_bytes(&card, has_draft ? &draft : NULL,
                                                                  in, k));
                    break;
                }
            }
        }
        catalog_card_clear(&card);
        catalog_card_clear(&draft);
    }
    return 0;
}

/* Placement over s for a context of ctx positions with kv's types. */
static int previews_at(const struct cluster_state *s, const struct master_env *env,
                       const struct catalog_card *card, const struct catalog_card *draft,
                       enum cluster_sharding sharding, int min_nodes, const struct cluster_kv *kv,
                       int64_t ctx, struct place_result *res, char *err, size_t errlen)
{
    struct place_node *nodes = NULL;
    struct place_link *links = NULL;
    uint64_t *held = NULL;
    place_result_free(res);
    memset(res, 0, sizeof *res);
    res->best = -1;
    size_t n = s->n_nodes < PLACE_MAX_NODES ? s->n_nodes : PLACE_MAX_NODES;
    nodes = calloc(n ? n : 1, sizeof *nodes);
    held = calloc(s->n_nodes ? s->n_nodes : 1, sizeof *held);
    links = calloc(s->n_edges ? s->n_edges : 1, sizeof *links);
    int rc = 0;
    if (!nodes || !held || !links) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = held_bytes(s, env, held))) {
        cairn_fail(err, errlen, rc, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct cluster_node *nd = &s->nodes[i];
        nodes[i].id = nd->id;
        nodes[i].available = (uint64_t)(nd->info.memory_available > 0 ? nd->info.memory_available : 0);
        nodes[i].total = (uint64_t)(nd->info.memory_total > 0 ? nd->info.memory_total : 0);
        nodes[i].held = held[i];
    }
    for (size_t i = 0; i < s->n_edges; i++) {
        links[i].from = s->edges[i].from;
        links[i].to = s->edges[i].to;
        links[i].rtt_us = s->edges[i].rtt_us > UINT32_MAX ? UINT32_MAX : (uint32_t)s->edges[i].rtt_us;
    }
    struct place_request req = {
        .nodes = nodes,
        .n_nodes = n,
        .links = links,
        .n_links = s->n_edges,
        .sharding = sharding == CLUSTER_SHARDING_TENSOR ? PLACE_TENSOR : PLACE_PIPELINE,
        .min_nodes = (uint32_t)min_nodes,
    };
    /* place counts kv_bytes_per_token_layer * ctx_len * n_slots: one pool of positions */
    int64_t positions = runner_kv_pool_positions(ctx);
    if ((rc = catalog_card_place_model(card, (uint32_t)positions, 1, &req.model, err, errlen)))
        goto out;
    req.model.kv_bytes_per_token_layer = master_kv_token_layer_bytes(card, kv);
    req.model.layer_window = card->layer_swa;
    req.model.window_positions = master_window_positions(card, kv, (uint64_t)positions);
    if (draft) {
        req.model.draft_bytes = draft->weight_bytes;
        req.model.draft_kv_bytes_per_token = sat_mul(draft->kv_bytes_per_token_layer, (uint64_t)draft->n_layers);
    }
    rc = place_compute(&req, res, err, errlen);
out:
    free(nodes);
    free(links);
    free(held);
    return rc;
}

int master_previews(const struct cluster_state *s, const struct master_env *env,
                    const char *model_id, enum cluster_sharding sharding, int min_nodes,
                    const char *draft_model, const struct cluster_kv *kv, int64_t *ctx_len,
                    struct place_result *res, char *err, size_t errlen)
{
    struct catalog_card card, draft;
    bool has_card = false, has_draft = false;
    struct cluster_kv none = {0};
    if (!kv)
        kv = &none;
    memset(res, 0, sizeof *res);
    res->best = -1;
    memset(&card, 0, sizeof card);
    memset(&draft, 0, sizeof draft);
    if (min_nodes < 1 || min_nodes > CLUSTER_MAX_SHARDS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "min_nodes: %d is outside [1, %d]",
                          min_nodes, CLUSTER_MAX_SHARDS);
    int rc = lookup(env, model_id, &card, &has_card, err, errlen);
    if (!rc && !has_card)
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "model_id: required");
    if (!rc)
        rc = lookup(env, draft_model, &draft, &has_draft, err, errlen);
    if (rc)
        goto out;
    int64_t trained = card.n_ctx > 0 ? (card.n_ctx < CLUSTER_MAX_CTX ? card.n_ctx : CLUSTER_MAX_CTX) : MASTER_CTX_LEN;
    if (kv->ctx_len > trained) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "ctx_len: %lld is beyond %s's trained context of %lld positions",
                        (long long)kv->ctx_len, model_id, (long long)trained);
        goto out;
    }
    if (!master_kv_token_layer_bytes(&card, kv)) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL,
                        "cache_type_k/cache_type_v: %s's heads of %d values cannot be held as %s/%s "
                        "(q8_0 and q4_0 need multiples of 32)",
                        model_id, card.head_dim, kv->type_k[0] ? kv->type_k : "f16", kv->type_v[0] ? kv->type_v : "f16");
        goto out;
    }
    /* The context asked for, or the largest that fits from the trained one down. */
    int64_t least = trained < MASTER_CTX_LEN ? trained : MASTER_CTX_LEN;
    int64_t ctx = kv->ctx_len > 0 ? kv->ctx_len : trained;
    for (;;) {
        rc = previews_at(s, env, &card, has_draft ? &draft : NULL, sharding, min_nodes, kv, ctx, res, err, errlen);
        if (rc || res->best >= 0 || kv->ctx_len > 0 || ctx <= least)
            break;
        ctx = ctx / 2 > least ? ctx / 2 : least;
    }
    if (ctx_len)
        *ctx_len = ctx;
out:
    catalog_card_clear(&card);
    catalog_card_clear(&draft);
    return rc;
}

int master_preview_estimates(const struct cluster_state *s, const struct master_env *env, const char *model_id,
                             const struct place_result *res, json_t *previews, char *err, size_t errlen)
{
    struct catalog_card card;
    bool has = false;
    int rc = lookup(env, model_id, &card, &has, err, errlen);
    if (rc || !has)
        return rc ? rc : cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s has no card", model_id);
    json_t *cands = json_object_get(previews, "candidates");
    for (size_t i = 0; !rc && i < res->n_cands && i < json_array_size(cands); i++) {
        struct estimate est;
        estimate_candidate(&card, s, res->sharding, &res->cands[i], &est);
        json_t *j = estimate_to_json(&est);
        if (!j || json_object_set_new(json_array_get(cands, i), "estimate", j))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    catalog_card_clear(&card);
    return rc;
}

/* ---- commands ---- */

static int new_id(const struct master_env *env, char *dst, char *err, size_t errlen)
{
    return env->new_id ? env->new_id(env->id_ctx, dst, err, errlen) : ids_random(dst, err, errlen);
}

static int refuse(struct command_result *res, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct command_result *res, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof res->message, fmt, ap);
    va_end(ap);
    res->code = code;
    return code;
}

/* Why the best refused candidate failed, for a placement that found nothing. */
static void no_fit_reason(const struct place_result *pr, size_t n_nodes, char *buf, size_t n)
{
    if (!pr->n_cands) {
        snprintf(buf, n, "no candidate among %zu node%s", n_nodes, n_nodes == 1 ? "" : "s");
        return;
    }
    snprintf(buf, n, "%s", pr->cands[0].reason);
}

/* Refuses a draft whose vocabulary does not match the model's. */
static int check_draft(const struct master_env *env, const char *model_id, const char *draft,
                       struct command_result *res)
{
    char err[512] = "";
    if (!draft[0] || !env->draft_check)
        return 0;
    int rc = env->draft_check(env->card_ctx, model_id, draft, err, sizeof err);
    if (rc)
        return refuse(res, rc == CAIRN_ENOMEM ? rc : CAIRN_EFORMAT, "draft_model %s cannot serve %s: %s", draft,
                      model_id, err);
    return 0;
}

/* Tokens/s estimated for the best candidate of model_id placed with sharding sh; 0 when
 * none fits, it cannot run, or a figure is missing. */
static double best_estimate(const struct cluster_state *s, const struct master_env *env,
                            const struct catalog_card *card, const struct command *c, enum cluster_sharding sh)
{
    struct place_result pr;
    char err[512];
    double tps = 0;
    if (master_previews(s, env, c->place_instance.model_id, sh, c->place_instance.min_nodes,
                        c->place_instance.draft_model, &c->place_instance.kv, NULL, &pr, err, sizeof err) == 0 &&
        pr.best >= 0 && pr.cands[pr.best].executable) {
        struct estimate e;
        estimate_candidate(card, s, pr.sharding, &pr.cands[pr.best], &e);
        tps = e.known ? e.tokens_per_s : 0;
    }
    place_result_free(&pr);
    return tps;
}

/* The sharding of a "sharding": "auto" placement: tensor parallelism where its best
 * candidate is estimated faster than the best pipeline (a dense model: the ranks do not
 * split experts), else the pipeline. */
static enum cluster_sharding auto_sharding(const struct cluster_state *s, const struct master_env *env,
                                           const struct command *c)
{
    struct catalog_card card;
    bool has = false;
    char err[512];
    enum cluster_sharding sh = CLUSTER_SHARDING_PIPELINE;
    if (lookup(env, c->place_instance.model_id, &card, &has, err, sizeof err) == 0 && has && card.n_expert == 0 &&
        best_estimate(s, env, &card, c, CLUSTER_SHARDING_TENSOR) >
            best_estimate(s, env, &card, c, CLUSTER_SHARDING_PIPELINE))
        sh = CLUSTER_SHARDING_TENSOR;
    catalog_card_clear(&card);
    return sh;
}

static int place(const struct cluster_state *s, const struct master_env *env,
                 const struct command *c, struct master_events *out, struct command_result *res)
{
    struct place_result pr;
    char err[512] = "";
    const char *draft = c->place_instance.draft_model;
    int checked = check_draft(env, c->place_instance.model_id, draft, res);
    if (checked)
        return checked;
    int64_t ctx = 0;
    const struct cluster_kv *kv = &c->place_instance.kv;
    enum cluster_sharding sharding =
        c->place_instance.sharding_auto ? auto_sharding(s, env, c) : c->place_instance.sharding;
    int rc = master_previews(s, env, c->place_instance.model_id, sharding, c->place_instance.min_nodes, draft, kv,
                             &ctx, &pr, err, sizeof err);
    if (rc) {
        place_result_free(&pr);
        if (rc == CAIRN_ENOTFOUND)
            return refuse(res, rc, "%s", err);
        return refuse(res, rc == CAIRN_ENOMEM ? rc : CAIRN_EFORMAT, "%s", err);
    }
    if (pr.best < 0) {
        char why[PLACE_REASON_MAX];
        no_fit_reason(&pr, s->n_nodes, why, sizeof why);
        place_result_free(&pr);
        struct catalog_card card;
        bool has = false;
        double kv_gib = 0;
        if (lookup(env, c->place_instance.model_id, &card, &has, err, sizeof err) == 0 && has)
            kv_gib = (double)kv_range_bytes(&card, kv, (uint64_t)runner_kv_pool_positions(ctx), 0,
                                            (uint32_t)card.n_layers) / (1 << 30);
        catalog_card_clear(&card);
        return refuse(res, CAIRN_EFULL,
                      "no placement of %s fits: %s (a context of %lld positions holds %.2f GiB of KV cache, "
                      "K %s, V %s: a smaller ctx_len or cache_type q8_0 needs less)",
                      c->place_instance.model_id, why, (long long)ctx, kv_gib, kv->type_k[0] ? kv->type_k : "f16",
                      kv->type_v[0] ? kv->type_v : "f16");
    }
    const struct place_candidate *best = &pr.cands[pr.best];
    if (!best->executable) {
        uint32_t k = best->n_nodes;
        place_result_free(&pr);
        return refuse(res, CAIRN_EUNSUPPORTED,
                      "the best placement is tensor sharding over %u nodes, which cannot run yet",
                      k);
    }
    struct event *e = add_event(out, EVENT_INSTANCE_CREATED);
    struct cluster_instance *in = e ? &e->instance_created : NULL;
    if (!in || !(in->shards = calloc(best->n_nodes, sizeof *in->shards))) {
        place_result_free(&pr);
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    }
    in->n_shards = best->n_nodes;
    if ((rc = new_id(env, in->id, err, sizeof err)))
        goto fail;
    snprintf(in->model_id, sizeof in->model_id, "%s", c->place_instance.model_id);
    in->sharding = sharding;
    snprintf(in->draft_model, sizeof in->draft_model, "%s", draft);
    in->num_draft_tokens = c->place_instance.num_draft_tokens;
    in->epoch = 1;
    in->kv = *kv;
    in->kv.ctx_len = ctx;
    for (uint32_t i = 0; i < best->n_nodes; i++) {
        const struct place_share *sh = &best->shares[i];
        struct cluster_shard *d = &in->shards[i];
        snprintf(d->node_id, sizeof d->node_id, "%s", sh->id);
        if ((rc = new_id(env, d->runner_id, err, sizeof err)))
            goto fail;
        d->rank = (int)sh->rank;
        d->world_size = (int)best->n_nodes;
        d->layer_begin = (int)sh->layer_begin;
        d->layer_end = (int)sh->layer_end;
    }
    place_result_free(&pr);
    snprintf(res->instance_id, sizeof res->instance_id, "%s", in->id);
    return 0;
fail:
    place_result_free(&pr);
    return refuse(res, rc, "%s", err);
}

static int create(const struct cluster_state *s, const struct master_env *env,
                  const struct command *c, struct master_events *out, struct command_result *res)
{
    const struct cluster_instance *in = &c->create_instance;
    char err[512] = "";
    if (cluster_state_find_instance(s, in->id))
        return refuse(res, CAIRN_ESTATE, "instance_id: %s already exists", in->id);
    for (size_t i = 0; i < in->n_shards; i++) {
        if (!cluster_state_find_node(s, in->shards[i].node_id))
            return refuse(res, CAIRN_EFORMAT, "instance.shards[%zu].node_id: unknown node %s", i,
                          in->shards[i].node_id);
        for (size_t r = 0; r < s->n_runners; r++)
            if (!strcmp(s->runners[r].id, in->shards[i].runner_id))
                return refuse(res, CAIRN_ESTATE, "instance.shards[%zu].runner_id: %s is in use", i,
                              in->shards[i].runner_id);
        for (size_t k = 0; k < s->n_instances; k++)
            for (size_t m = 0; m < s->instances[k].n_shards; m++)
                if (!strcmp(s->instances[k].shards[m].runner_id, in->shards[i].runner_id))
                    return refuse(res, CAIRN_ESTATE,
                                  "instance.shards[%zu].runner_id: %s is in use", i,
                                  in->shards[i].runner_id);
    }
    struct catalog_card card;
    bool has = false;
    int rc = lookup(env, in->model_id, &card, &has, err, sizeof err);
    if (rc)
        return refuse(res, rc, "%s", err);
    int n_layers = card.n_layers;
    catalog_card_clear(&card);
    int end = in->shards[in->n_shards - 1].layer_end;
    if (end != n_layers)
        return refuse(res, CAIRN_EFORMAT,
                      "instance.shards[%zu].layer_end: %d, but %s has %d layers", in->n_shards - 1,
                      end, in->model_id, n_layers);
    if (in->draft_model[0]) {
        rc = lookup(env, in->draft_model, &card, &has, err, sizeof err);
        catalog_card_clear(&card);
        if (rc)
            return refuse(res, rc, "%s", err);
    }
    struct event *e = add_event(out, EVENT_INSTANCE_CREATED);
    if (!e || cluster_instance_copy(&e->instance_created, in))
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    snprintf(res->instance_id, sizeof res->instance_id, "%s", in->id);
    return 0;
}

/* TextGeneration: a task for a ready instance, created Pending; the worker of the
 * instance's first rank hands it to its runner. */
static int text_generation(const struct cluster_state *s, const struct command *c, struct master_events *out,
                           struct command_result *res)
{
    const char *iid = c->text_generation.instance_id, *tid = c->text_generation.task_id;
    if (!cluster_state_find_instance(s, iid))
        return refuse(res, CAIRN_ENOTFOUND, "instance %s not found", iid);
    if (cluster_state_find_task(s, tid))
        return refuse(res, CAIRN_ESTATE, "task %s exists", tid);
    struct event *e = add_event(out, EVENT_TASK_CREATED);
    if (!e)
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    snprintf(e->task_created.task_id, sizeof e->task_created.task_id, "%s", tid);
    e->task_created.kind = CLUSTER_TASK_TEXT_GENERATION;
    snprintf(e->task_created.instance_id, sizeof e->task_created.instance_id, "%s", iid);
    snprintf(e->task_created.node_id, sizeof e->task_created.node_id, "%s", c->text_generation.node_id);
    e->task_created.bytes = c->text_generation.bytes;
    snprintf(res->instance_id, sizeof res->instance_id, "%s", iid);
    return 0;
}

/* CancelTask marks a live task Cancelled (its worker stops it and finishes it);
 * FinishTask records the final status and deletes the task (the log keeps its life). */
static int end_task(const struct cluster_state *s, const struct command *c, struct master_events *out,
                    struct command_result *res)
{
    bool cancel = c->kind == COMMAND_CANCEL_TASK;
    const char *tid = cancel ? c->cancel_task.task_id : c->finish_task.task_id;
    const struct cluster_task *t = cluster_state_find_task(s, tid);
    if (!t)
        return refuse(res, CAIRN_ENOTFOUND, "task %s not found", tid);
    if (cancel && t->status != CLUSTER_TASK_PENDING && t->status != CLUSTER_TASK_RUNNING)
        return 0; /* already over */
    struct event *e = add_event(out, EVENT_TASK_STATUS_UPDATED);
    if (!e)
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    snprintf(e->task_status_updated.task_id, sizeof e->task_status_updated.task_id, "%s", tid);
    e->task_status_updated.status = cancel ? CLUSTER_TASK_CANCELLED : c->finish_task.status;
    if (!cancel && c->finish_task.status == CLUSTER_TASK_FAILED && c->finish_task.error[0] &&
        !(e->task_status_updated.error = strdup(c->finish_task.error)))
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    if (cancel)
        return 0;
    if (!(e = add_event(out, EVENT_TASK_DELETED)))
        return refuse(res, CAIRN_ENOMEM, "out of memory");
    snprintf(e->task_deleted.task_id, sizeof e->task_deleted.task_id, "%s", tid);
    return 0;
}

int master_command(const struct cluster_state *s, const struct master_env *env,
                   const struct command *c, struct master_events *out,
                   struct command_result *res)
{
    memset(res, 0, sizeof *res);
    snprintf(res->command_id, sizeof res->command_id, "%s", c->id);
    size_t mark = out->n;
    int rc;
    char err[512] = "";
    switch (c->kind) {
    case COMMAND_PLACE_INSTANCE:
        rc = place(s, env, c, out, res);
        break;
    case COMMAND_CREATE_INSTANCE:
        rc = create(s, env, c, out, res);
        break;
    case COMMAND_DELETE_INSTANCE: {
        const char *id = c->delete_instance.instance_id;
        if (!cluster_state_find_instance(s, id)) {
            rc = refuse(res, CAIRN_ENOTFOUND, "instance %s not found", id);
            break;
        }
        struct event *e = add_event(out, EVENT_INSTANCE_DELETED);
        if (!e) {
            rc = refuse(res, CAIRN_ENOMEM, "out of memory");
            break;
        }
        snprintf(e->instance_deleted.instance_id, sizeof e->instance_deleted.instance_id, "%s", id);
        snprintf(res->instance_id, sizeof res->instance_id, "%s", id);
        rc = 0;
        break;
    }
    case COMMAND_SET_INSTANCE_DRAFT_MODEL: {
        const char *id = c->set_draft_model.instance_id;
        if (!cluster_state_find_instance(s, id)) {
            rc = refuse(res, CAIRN_ENOTFOUND, "instance %s not found", id);
            break;
        }
        struct catalog_card card;
        bool has;
        rc = lookup(env, c->set_draft_model.draft_model, &card, &has, err, sizeof err);
        catalog_card_clear(&card);
        if (rc) {
            refuse(res, rc, "%s", err);
            break;
        }
        if ((rc = check_draft(env, cluster_state_find_instance(s, id)->model_id, c->set_draft_model.draft_model,
                              res)))
            break;
        struct event *e = add_event(out, EVENT_INSTANCE_DRAFT_MODEL_UPDATED);
        if (!e) {
            rc = refuse(res, CAIRN_ENOMEM, "out of memory");
            break;
        }
        snprintf(e->instance_draft_model_updated.instance_id,
                 sizeof e->instance_draft_model_updated.instance_id, "%s", id);
        snprintf(e->instance_draft_model_updated.draft_model,
                 sizeof e->instance_draft_model_updated.draft_model, "%s",
                 c->set_draft_model.draft_model);
        e->instance_draft_model_updated.num_draft_tokens = c->set_draft_model.num_draft_tokens;
        snprintf(res->instance_id, sizeof res->instance_id, "%s", id);
        rc = 0;
        break;
    }
    case COMMAND_TEXT_GENERATION:
        rc = text_generation(s, c, out, res);
        break;
    case COMMAND_CANCEL_TASK:
    case COMMAND_FINISH_TASK:
        rc = end_task(s, c, out, res);
        break;
    default:
        rc = refuse(res, CAIRN_EINVAL, "unknown command kind %d", (int)c->kind);
    }
    for (size_t i = mark; rc == 0 && i < out->n; i++) {
        if ((rc = validate(&out->ev[i], err, sizeof err)))
            refuse(res, rc, "%s", err);
    }
    if (rc)
        truncate_events(out, mark);
    return rc;
}

/* ---- reports ---- */

static bool runner_same(const struct cluster_runner *a, const struct cluster_runner *b)
{
    return !strcmp(a->instance_id, b->instance_id) && !strcmp(a->node_id, b->node_id) &&
           a->status == b->status && a->restart_count == b->restart_count &&
           a->data_port == b->data_port && a->epoch == b->epoch &&
           !strcmp(a->error ? a->error : "", b->error ? b->error : "");
}

static int64_t abs64(int64_t x) { return x < 0 ? -x : x; }

/* True when throughputs a and b (bytes/s) are within MASTER_EDGE_THROUGHPUT_SLACK_PCT of
 * the larger; from or to 0 (not measured) is always a change. */
static bool throughput_close(int64_t a, int64_t b)
{
    int64_t hi = a > b ? a : b;
    return a == b || (a && b && abs64(a - b) <= hi / 100 * MASTER_EDGE_THROUGHPUT_SLACK_PCT);
}

/* A rank of a pipelined instance that served at the instance's epoch (the state has it
 * Ready or Running there) and now reports Failed or a restart: its KV is lost and the
 * ring is broken, so the instance moves to the next epoch and every rank starts again
 * (plan.h). A rank that fails before it ever served leaves the epoch alone: no rank
 * linked with it yet, and its supervisor's restarts (bounded) join the same ring. */
static bool ring_broken(const struct cluster_state *s, const struct cluster_runner *cur,
                        const struct cluster_runner *r)
{
    const struct cluster_instance *in = cluster_state_find_instance(s, r->instance_id);
    if (!in || in->n_shards < 2 || !cur || cur->epoch != in->epoch || r->epoch != in->epoch)
        return false;
    bool served = cur->status == CLUSTER_RUNNER_READY || cur->status == CLUSTER_RUNNER_RUNNING;
    return served && (r->status == CLUSTER_RUNNER_FAILED || r->restart_count > cur->restart_count);
}

/* InstanceEpochAdvanced to the epoch after the state's, unless out holds one for it. */
static int advance_epoch(const struct cluster_state *s, const char *instance_id,
                         struct master_events *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < out->n; i++)
        if (out->ev[i].kind == EVENT_INSTANCE_EPOCH_ADVANCED &&
            !strcmp(out->ev[i].instance_epoch_advanced.instance_id, instance_id))
            return 0;
    const struct cluster_instance *in = cluster_state_find_instance(s, instance_id);
    if (!in || in->epoch >= IDS_COUNTER_MAX)
        return 0;
    struct event *e = add_event(out, EVENT_INSTANCE_EPOCH_ADVANCED);
    if (!e)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    snprintf(e->instance_epoch_advanced.instance_id, sizeof e->instance_epoch_advanced.instance_id,
             "%s", instance_id);
    e->instance_epoch_advanced.epoch = in->epoch + 1;
    return 0;
}

static int report_runners(const struct cluster_state *s, const char *from, const json_t *arr,
                          struct master_events *out, char *err, size_t errlen)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        char p[JSON_PATH_MAX];
        struct cluster_runner r;
        json_path(p, sizeof p, "report.runners[%zu]", i);
        int rc = cluster_runner_from_json(json_array_get(arr, i), p, &r, err, errlen);
        if (!rc && strcmp(r.node_id, from))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.node_id: %s is not the reporting node",
                            p, r.node_id);
        if (rc)
            return rc;
        const struct cluster_runner *cur = cluster_state_find_runner(s, r.id);
        if (cur && runner_same(cur, &r)) {
            cluster_runner_clear(&r);
            continue;
        }
        bool broken = ring_broken(s, cur, &r);
        char instance_id[IDS_ID_MAX + 1];
        memcpy(instance_id, r.instance_id, sizeof instance_id);
        struct event *e = add_event(out, EVENT_RUNNER_STATUS_UPDATED);
        if (!e) {
            cluster_runner_clear(&r);
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        }
        e->runner_status_updated = r;
        if (broken && (rc = advance_epoch(s, instance_id, out, err, errlen)))
            return rc;
    }
    for (size_t k = 0; k < s->n_runners; k++) {
        const struct cluster_runner *cur = &s->runners[k];
        if (strcmp(cur->node_id, from))
            continue;
        bool listed = false;
        for (size_t i = 0; i < n && !listed; i++) {
            const char *id = json_string_value(json_object_get(json_array_get(arr, i), "runner_id"));
            listed = id && !strcmp(id, cur->id);
        }
        if (listed)
            continue;
        struct event *e = add_event(out, EVENT_RUNNER_DELETED);
        if (!e)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        snprintf(e->runner_deleted.runner_id, sizeof e->runner_deleted.runner_id, "%s", cur->id);
    }
    return 0;
}

static int report_edges(const struct cluster_state *s, const char *from, const json_t *arr,
                        struct master_events *out, char *err, size_t errlen)
{
    static const char *const keys[] = {"to", "rtt_us", "throughput_bytes_per_s", NULL};
    size_t n = json_array_size(arr);
    char (*seen)[IDS_ID_MAX + 1] = calloc(n ? n : 1, sizeof *seen);
    if (!seen)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char p[JSON_PATH_MAX];
        const json_t *j = json_array_get(arr, i);
        struct cluster_edge edge;
        memset(&edge, 0, sizeof edge);
        json_path(p, sizeof p, "report.edges[%zu]", i);
        rc = json_get_keys(j, p, keys, err, errlen);
        if (!rc)
            rc = ids_json_id(j, p, "to", edge.to, err, errlen);
        if (!rc)
            rc = json_get_int(j, p, "rtt_us", 0, UINT32_MAX, &edge.rtt_us, err, errlen);
        if (!rc)
            rc = json_get_int(j, p, "throughput_bytes_per_s", 0, IDS_BYTES_MAX, &edge.throughput,
                              err, errlen);
        if (!rc && !strcmp(edge.to, from))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.to: an edge to itself", p);
        if (rc)
            break;
        snprintf(seen[i], sizeof seen[i], "%s", edge.to);
        snprintf(edge.from, sizeof edge.from, "%s", from);
        const struct cluster_edge *cur = cluster_state_find_edge(s, from, edge.to);
        if (cur) {
            int64_t slack = cur->rtt_us / 2 > MASTER_EDGE_RTT_SLACK_US ? cur->rtt_us / 2
                                                                        : MASTER_EDGE_RTT_SLACK_US;
            if (abs64(cur->rtt_us - edge.rtt_us) <= slack && throughput_close(cur->throughput, edge.throughput))
                continue;
        }
        struct event *e = add_event(out, EVENT_TOPOLOGY_EDGE_CREATED);
        if (!e) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            break;
        }
        e->topology_edge_created = edge;
    }
    for (size_t k = 0; !rc && k < s->n_edges; k++) {
        const struct cluster_edge *cur = &s->edges[k];
        if (strcmp(cur->from, from))
            continue;
        bool listed = false;
        for (size_t i = 0; i < n && !listed; i++)
            listed = !strcmp(seen[i], cur->to);
        if (listed)
            continue;
        struct event *e = add_event(out, EVENT_TOPOLOGY_EDGE_DELETED);
        if (!e) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            break;
        }
        snprintf(e->topology_edge_deleted.from, sizeof e->topology_edge_deleted.from, "%s", from);
        snprintf(e->topology_edge_deleted.to, sizeof e->topology_edge_deleted.to, "%s", cur->to);
    }
    free(seen);
    return rc;
}

/* A node's downloads (download.h): NodeDownloadProgress for each one that differs from
 * the state's. Downloads it no longer lists stay (a Completed one says the node has the
 * file). */
static int report_downloads(const struct cluster_state *s, const char *from, const json_t *arr,
                            struct master_events *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char p[JSON_PATH_MAX];
        struct cluster_download d;
        json_path(p, sizeof p, "report.downloads[%zu]", i);
        int rc = cluster_download_from_json(json_array_get(arr, i), p, &d, err, errlen);
        if (!rc && strcmp(d.node_id, from))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.node_id: %s is not the reporting node", p, d.node_id);
        if (rc) {
            cluster_download_clear(&d);
            return rc;
        }
        const struct cluster_download *cur = cluster_state_find_download(s, from, d.model_id);
        if (cur && cur->status == d.status && cur->bytes_done == d.bytes_done && cur->bytes_total == d.bytes_total &&
            cur->bytes_per_s == d.bytes_per_s && cur->layer_begin == d.layer_begin && cur->layer_end == d.layer_end &&
            !strcmp(cur->error ? cur->error : "", d.error ? d.error : "")) {
            cluster_download_clear(&d);
            continue;
        }
        struct event *e = add_event(out, EVENT_NODE_DOWNLOAD_PROGRESS);
        if (!e) {
            cluster_download_clear(&d);
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        }
        e->node_download_progress = d;
    }
    return 0;
}

/* True when s holds node id with exactly this info (every field, compared as JSON). */
static bool info_same(const struct cluster_state *s, const char *id, const struct cluster_node_info *info)
{
    const struct cluster_node *cur = cluster_state_find_node(s, id);
    if (!cur)
        return false;
    json_t *a = cluster_node_info_to_json(&cur->info), *b = cluster_node_info_to_json(info);
    bool same = a && b && json_equal(a, b);
    json_decref(a);
    json_decref(b);
    return same;
}

/* Reports come with every change of a node's runners, downloads or links, each with the
 * node's info: info equal to the state's makes no NodeGatheredInfo, so they do not
 * flood the log (its last_seen_ms then stays at the last change; liveness is the link's,
 * node.h). */
int master_report_events(const struct cluster_state *s, const char *from, const json_t *report,
                         int64_t now_ms, struct master_events *out, char *err, size_t errlen)
{
    static const char *const keys[] = {"node_id", "info", "runners", "edges", "downloads", NULL};
    char id[IDS_ID_MAX + 1];
    size_t mark = out->n;
    json_t *v;
    int rc = json_get_keys(report, "report", keys, err, errlen);
    if (!rc)
        rc = ids_json_id(report, "report", "node_id", id, err, errlen);
    if (!rc && (!from || strcmp(id, from)))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "report.node_id: %s is not the sender %s", id,
                        from ? from : "(none)");
    if (rc)
        return rc;
    v = json_object_get(report, "info");
    if (v && !json_is_null(v)) {
        struct event *e = add_event(out, EVENT_NODE_GATHERED_INFO);
        if (!e)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        snprintf(e->node_gathered_info.node_id, sizeof e->node_gathered_info.node_id, "%s", id);
        e->node_gathered_info.when_ms = now_ms;
        rc = cluster_node_info_from_json(v, "report.info", &e->node_gathered_info.info, err,
                                         errlen);
        if (!rc && info_same(s, id, &e->node_gathered_info.info))
            truncate_events(out, out->n - 1);
    }
    v = json_object_get(report, "runners");
    if (!rc && v && !json_is_null(v))
        rc = json_is_array(v) ? report_runners(s, id, v, out, err, errlen)
                              : cairn_fail(err, errlen, CAIRN_EFORMAT,
                                           "report.runners: must be an array or null");
    v = json_object_get(report, "edges");
    if (!rc && v && !json_is_null(v))
        rc = json_is_array(v) ? report_edges(s, id, v, out, err, errlen)
                              : cairn_fail(err, errlen, CAIRN_EFORMAT,
                                           "report.edges: must be an array or null");
    v = json_object_get(report, "downloads");
    if (!rc && v && !json_is_null(v))
        rc = json_is_array(v) ? report_downloads(s, id, v, out, err, errlen)
                              : cairn_fail(err, errlen, CAIRN_EFORMAT,
                                           "report.downloads: must be an array or null");
    for (size_t i = mark; !rc && i < out->n; i++)
        rc = validate(&out->ev[i], err, errlen);
    if (rc)
        truncate_events(out, mark);
    return rc;
}
