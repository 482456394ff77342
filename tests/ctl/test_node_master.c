/* The master's decisions as pure functions of the state: commands become events or
 * refusals (placement with memory held by earlier instances, explicit instances checked
 * against the state and the model card), and workers' reports become events only where
 * they change something. Events are applied as the node would, and two states fed the
 * same events serialize alike. */
#include "ctl/master.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static char err[1024];

/* ---- fake catalog ---- */

static struct catalog_card cards[4];
static int n_cards;
static int card_calls;

static void add_card(const char *id, int n_layers, uint64_t layer, uint64_t embd, uint64_t head,
                     bool tied)
{
    struct catalog_card *c = &cards[n_cards++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", id);
    c->path = strdup("/nowhere/x.gguf");
    snprintf(c->arch, sizeof c->arch, "llama");
    c->n_layers = n_layers;
    c->n_embd = 4096;
    c->n_head = 32;
    c->n_head_kv = 8;
    c->head_dim = 128;
    c->n_ctx = 4096;
    c->tied_output = tied;
    c->layer_bytes = calloc((size_t)n_layers, sizeof *c->layer_bytes);
    for (int i = 0; i < n_layers; i++)
        c->layer_bytes[i] = layer;
    c->embd_bytes = embd;
    c->head_bytes = tied ? embd : head;
    c->output_norm_bytes = 16384;
    c->kv_bytes_per_token_layer = 2 * 8 * 128 * 2;
    c->weight_bytes = (uint64_t)n_layers * layer + embd + (tied ? 0 : head) + 16384;
    c->file_bytes = c->weight_bytes + 4096;
}

static int fake_card(void *ctx, const char *id, struct catalog_card *out, char *e, size_t elen)
{
    (void)ctx;
    card_calls++;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n_cards; i++)
        if (!strcmp(cards[i].id, id))
            return catalog_card_copy(out, &cards[i]);
    return cairn_fail(e, elen, CAIRN_ENOTFOUND, "model %s not found", id);
}

static int id_counter;

static int fake_id(void *ctx, char *dst, char *e, size_t elen)
{
    (void)ctx;
    (void)e;
    (void)elen;
    snprintf(dst, IDS_ID_MAX + 1, "id%d", ++id_counter);
    return 0;
}

static const struct master_env env = {.card = fake_card, .new_id = fake_id};

/* ---- state helpers ---- */

static void add_node(struct cluster_state *s, const char *id, uint64_t avail)
{
    struct cluster_node n;
    memset(&n, 0, sizeof n);
    snprintf(n.id, sizeof n.id, "%s", id);
    n.info.memory_available = (int64_t)avail;
    n.info.memory_total = (int64_t)avail * 2;
    CHECK(cluster_state_put_node(s, &n) == 0, "put node %s", id);
}

static void add_edge(struct cluster_state *s, const char *from, const char *to, int64_t rtt)
{
    struct cluster_edge e;
    memset(&e, 0, sizeof e);
    snprintf(e.from, sizeof e.from, "%s", from);
    snprintf(e.to, sizeof e.to, "%s", to);
    e.rtt_us = rtt;
    CHECK(cluster_state_put_edge(s, &e) == 0, "put edge");
}

/* Applies the events as the node numbers them; all must apply. */
static void apply_all(struct cluster_state *s, struct master_events *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        evs->ev[i].term = s->last_term;
        evs->ev[i].index = s->last_index + 1;
        int rc = cluster_apply(s, &evs->ev[i], err, sizeof err);
        CHECK(rc == 0, "apply %s: %s", event_kind_name((int)evs->ev[i].kind), err);
    }
}

static struct cluster_state *new_state(void)
{
    struct cluster_state *s = cluster_state_create();
    s->last_term = 1; /* as after a master's snapshot at (1, 0) */
    add_node(s, "a", 1 * GIB);
    add_node(s, "b", 2 * GIB);
    add_node(s, "c", 3 * GIB);
    return s;
}

/* Runs command c on s; returns the code, events in *evs (cleared by the caller). */
static int run(const struct cluster_state *s, struct command *c, struct master_events *evs,
               struct command_result *res)
{
    snprintf(c->id, sizeof c->id, "cmd");
    int rc = master_command(s, &env, c, evs, res);
    CHECK(rc == res->code && !strcmp(res->command_id, "cmd"), "result code %d vs %d, id '%s'", rc,
          res->code, res->command_id);
    CHECK(rc == 0 || evs->n == 0, "a refusal (%d: %s) makes no event (%zu)", rc, res->message,
          evs->n);
    return rc;
}

static int place_kv(struct cluster_state *s, const char *model, const struct cluster_kv *kv,
                    struct command_result *res, const struct cluster_instance **out);

static int place(struct cluster_state *s, const char *model, int min_nodes, const char *draft,
                 struct command_result *res, const struct cluster_instance **out)
{
    struct command c;
    struct master_events evs = {0};
    command_init(&c, COMMAND_PLACE_INSTANCE);
    snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "%s", model);
    c.place_instance.min_nodes = min_nodes;
    c.place_instance.num_draft_tokens = 4;
    snprintf(c.place_instance.draft_model, sizeof c.place_instance.draft_model, "%s",
             draft ? draft : "");
    int rc = run(s, &c, &evs, res);
    if (rc == 0) {
        CHECK(evs.n == 1 && evs.ev[0].kind == EVENT_INSTANCE_CREATED, "one InstanceCreated (%zu)",
              evs.n);
        apply_all(s, &evs);
    }
    master_events_clear(&evs);
    *out = rc ? NULL : cluster_state_find_instance(s, res->instance_id);
    CHECK(rc || *out, "placed instance %s is in the state", res->instance_id);
    return rc;
}

/* Places model with the KV cache kv (min_nodes 1, no draft). */
static int place_kv(struct cluster_state *s, const char *model, const struct cluster_kv *kv,
                    struct command_result *res, const struct cluster_instance **out)
{
    struct command c;
    struct master_events evs = {0};
    command_init(&c, COMMAND_PLACE_INSTANCE);
    snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "%s", model);
    c.place_instance.min_nodes = 1;
    c.place_instance.kv = *kv;
    int rc = run(s, &c, &evs, res);
    if (rc == 0)
        apply_all(s, &evs);
    master_events_clear(&evs);
    *out = rc ? NULL : cluster_state_find_instance(s, res->instance_id);
    return rc;
}

/* ---- tests ---- */

/* The context of a placement: the trained one where it fits, else halved down to 4096;
 * one asked for is kept or refused with the memory its KV needs; KV types count. */
static void test_context(void)
{
    struct catalog_card *lc = &cards[n_cards];
    add_card("long", 10, 100 * MIB, 50 * MIB, 50 * MIB, false);
    lc->n_ctx = 32768;
    struct cluster_state *s = new_state();
    struct command_result res;
    const struct cluster_instance *in;
    struct cluster_kv kv = {0};
    /* 1.1 GiB of weights, 40 KiB of F16 KV a position: 32768 (a pool of 36864) fits only on c */
    int rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->shards[0].node_id, "c") && in->kv.ctx_len == 32768,
          "the trained context where it fits: rc %d %s ctx %lld", rc, res.message, in ? (long long)in->kv.ctx_len : -1);
    uint64_t weights = 10 * 100 * MIB + 50 * MIB + 50 * MIB + 16384;
    CHECK(in && master_shard_bytes(lc, NULL, in, 0) == weights + (uint64_t)36864 * 4096 * 10,
          "it holds its weights and a pool of 36864 positions: %llu",
          in ? (unsigned long long)master_shard_bytes(lc, NULL, in, 0) : 0ull);
    /* b (2 GiB) takes the next one with half the context */
    rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->shards[0].node_id, "b") && in->kv.ctx_len == 16384,
          "halved where the trained one does not fit: rc %d %s ctx %lld", rc, res.message,
          in ? (long long)in->kv.ctx_len : -1);
    /* asked for, it is kept: refused with the KV it needs */
    kv.ctx_len = 32768;
    rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == CAIRN_EFULL && strstr(res.message, "32768 positions") && strstr(res.message, "1.41 GiB of KV"),
          "a context asked for that fits nowhere: %d %s", rc, res.message);
    kv.ctx_len = 65536;
    rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == CAIRN_EFORMAT && strstr(res.message, "beyond") && strstr(res.message, "32768"),
          "beyond the trained context: %d %s", rc, res.message);
    cluster_state_release(s);

    /* q8_0 K and V: 1088 bytes a row of 1024 instead of 2048, counted so */
    s = new_state();
    kv = (struct cluster_kv){.ctx_len = 32768};
    snprintf(kv.type_k, sizeof kv.type_k, "q8_0");
    snprintf(kv.type_v, sizeof kv.type_v, "q8_0");
    CHECK(master_kv_token_layer_bytes(lc, &kv) == 2 * 1088, "q8_0 bytes: %llu",
          (unsigned long long)master_kv_token_layer_bytes(lc, &kv));
    rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->kv.type_k, "q8_0") && !strcmp(in->kv.type_v, "q8_0") &&
              master_shard_bytes(lc, NULL, in, 0) == weights + (uint64_t)36864 * 2176 * 10,
          "q8_0 KV placed and counted: rc %d %s", rc, res.message);
    /* previews say which context they counted */
    struct place_result pr;
    int64_t ctx = 0;
    rc = master_previews(s, &env, "long", CLUSTER_SHARDING_PIPELINE, 1, NULL, NULL, &ctx, &pr, err, sizeof err);
    CHECK(rc == 0 && pr.best >= 0 && ctx == 16384, "previews count the context that fits: rc %d ctx %lld", rc,
          (long long)ctx);
    place_result_free(&pr);
    /* a type the heads cannot hold */
    lc->head_dim = 40;
    kv = (struct cluster_kv){0};
    snprintf(kv.type_k, sizeof kv.type_k, "q4_0");
    rc = place_kv(s, "long", &kv, &res, &in);
    CHECK(rc == CAIRN_EFORMAT && strstr(res.message, "multiples of 32"), "q4_0 on heads of 40: %d %s", rc,
          res.message);
    cluster_state_release(s);
}

/* Sliding-window layers keep only their window of each sequence (proto/runner_proto.h), so
 * a model whose layers mostly slide places a longer context where a dense one of the same
 * shape gets half; a KV type whose blocks are not whole pages is counted in full. */
static void test_sliding_window(void)
{
    struct catalog_card *sc = &cards[n_cards];
    add_card("slide", 10, 100 * MIB, 50 * MIB, 50 * MIB, false);
    sc->n_ctx = 32768;
    sc->swa_window = 128;
    sc->layer_swa = calloc(10, 1);
    for (int l = 0; l < 10; l++)
        sc->layer_swa[l] = l % 6 != 5; /* gemma3's pattern: 9 of these 10 layers slide */
    const struct catalog_card *lc = NULL;
    for (int i = 0; i < n_cards; i++)
        if (!strcmp(cards[i].id, "long"))
            lc = &cards[i];
    CHECK(lc != NULL, "test_context's card");
    struct cluster_kv kv = {0};
    /* 2 * 8 slots' sequences of 128 + 1024 positions */
    CHECK(master_window_positions(sc, &kv, 36864) == 18432 && master_window_positions(sc, &kv, 16000) == 16000 &&
              (!lc || master_window_positions(lc, &kv, 36864) == 36864),
          "window positions %llu", (unsigned long long)master_window_positions(sc, &kv, 36864));

    struct cluster_state *s = cluster_state_create();
    s->last_term = 1;
    add_node(s, "b", 2 * GIB);
    struct command_result res;
    const struct cluster_instance *in;
    /* dense: 1.41 GiB of KV at 32768 does not fit beside 1.1 GiB of weights; 16384 does */
    int rc = lc ? place_kv(s, "long", &kv, &res, &in) : -1;
    CHECK(rc == 0 && in && in->kv.ctx_len == 16384, "the dense model gets half its context: rc %d %s ctx %lld", rc,
          res.message, in ? (long long)in->kv.ctx_len : -1);
    cluster_state_release(s);
    s = cluster_state_create();
    s->last_term = 1;
    add_node(s, "b", 2 * GIB);
    rc = place_kv(s, "slide", &kv, &res, &in);
    uint64_t weights = 10 * 100 * MIB + 50 * MIB + 50 * MIB + 16384;
    uint64_t want = weights + (uint64_t)36864 * 4096 + (uint64_t)9 * 18432 * 4096;
    CHECK(rc == 0 && in && in->kv.ctx_len == 32768 && master_shard_bytes(sc, NULL, in, 0) == want,
          "the sliding model gets all of it: rc %d %s ctx %lld, holds %llu of %llu", rc, res.message,
          in ? (long long)in->kv.ctx_len : -1, in ? (unsigned long long)master_shard_bytes(sc, NULL, in, 0) : 0ull,
          (unsigned long long)want);
    cluster_state_release(s);

    /* q4_0 rows of 1024 values are 576 bytes: a block of 16 is 2.25 pages, released only in part */
    snprintf(kv.type_k, sizeof kv.type_k, "q4_0");
    CHECK(master_window_positions(sc, &kv, 36864) == 36864, "q4_0 K counted in full");
    s = cluster_state_create();
    s->last_term = 1;
    add_node(s, "b", 2 * GIB);
    kv.ctx_len = 32768;
    rc = place_kv(s, "slide", &kv, &res, &in);
    CHECK(rc == 0 && in && master_shard_bytes(sc, NULL, in, 0) == weights + (uint64_t)36864 * (576 + 2048) * 10,
          "q4_0 K, f16 V: every layer's pool counted: rc %d %s", rc, res.message);
    cluster_state_release(s);
}

static void test_place(void)
{
    struct cluster_state *s = new_state();
    struct command_result res;
    const struct cluster_instance *in;
    /* big: 10 x 100 MiB layers, 50 MiB embedding and head, KV 16 MiB a layer: ~1.27 GiB */
    int rc = place(s, "big", 1, NULL, &res, &in);
    CHECK(rc == 0 && in && in->n_shards == 1 && !strcmp(in->shards[0].node_id, "c") &&
              in->shards[0].layer_begin == 0 && in->shards[0].layer_end == 10 &&
              in->num_draft_tokens == 4 && in->epoch == 1,
          "first placement on c (most free): rc %d %s", rc, res.message);
    rc = place(s, "big", 1, NULL, &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->shards[0].node_id, "b"),
          "second placement on b: c holds the first (rc %d %s, on %s)", rc, res.message,
          in ? in->shards[0].node_id : "-");
    rc = place(s, "big", 1, NULL, &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->shards[0].node_id, "c"), "third on c again (%s)",
          in ? in->shards[0].node_id : res.message);
    rc = place(s, "big", 1, NULL, &res, &in);
    CHECK(rc == CAIRN_EFULL && strstr(res.message, "no placement of big fits"),
          "fourth does not fit on one node, and two are not linked: %d %s", rc, res.message);
    add_edge(s, "a", "b", 300);
    add_edge(s, "b", "c", 300);
    add_edge(s, "a", "c", 300);
    rc = place(s, "big", 1, NULL, &res, &in);
    CHECK(rc == 0 && in && in->n_shards == 2 && in->shards[0].layer_begin == 0 &&
              in->shards[0].layer_end == in->shards[1].layer_begin &&
              in->shards[1].layer_end == 10 && in->shards[1].rank == 1 &&
              in->shards[0].world_size == 2 && strcmp(in->shards[0].runner_id, in->shards[1].runner_id),
          "linked nodes take it in two: rc %d %s", rc, res.message);

    rc = place(s, "missing", 1, NULL, &res, &in);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(res.message, "missing"), "unknown model: %d %s", rc,
          res.message);
    rc = place(s, "small", 1, "missing-draft", &res, &in);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(res.message, "missing-draft"), "unknown draft: %d %s",
          rc, res.message);
    rc = place(s, "small", 4, NULL, &res, &in);
    CHECK(rc == CAIRN_EFULL && strstr(res.message, "min_nodes"), "min_nodes above the nodes: %s",
          res.message);
    rc = place(s, "small", 1, "small", &res, &in);
    CHECK(rc == 0 && in && !strcmp(in->draft_model, "small"), "placement with a draft: %s",
          res.message);

    /* Previews say the same as placement, with every candidate. */
    struct place_result pr;
    rc = master_previews(s, &env, "small", CLUSTER_SHARDING_PIPELINE, 1, NULL, NULL, NULL, &pr, err, sizeof err);
    CHECK(rc == 0 && pr.best >= 0 && pr.n_cands >= 3, "previews: rc %d best %ld cands %zu", rc,
          pr.best, pr.n_cands);
    place_result_free(&pr);
    rc = master_previews(s, &env, "small", CLUSTER_SHARDING_PIPELINE, 0, NULL, NULL, NULL, &pr, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "min_nodes"), "previews min_nodes 0: %s", err);
    place_result_free(&pr);
    rc = master_previews(s, &env, "nope", CLUSTER_SHARDING_PIPELINE, 1, NULL, NULL, NULL, &pr, err, sizeof err);
    CHECK(rc == CAIRN_ENOTFOUND, "previews of an unknown model: %d", rc);
    place_result_free(&pr);
    cluster_state_release(s);

    /* Held memory counts the head on the last rank and the embedding on the first. */
    struct cluster_instance one;
    struct cluster_shard sh[2];
    memset(&one, 0, sizeof one);
    memset(sh, 0, sizeof sh);
    one.shards = sh;
    one.n_shards = 2;
    sh[0] = (struct cluster_shard){.rank = 0, .world_size = 2, .layer_begin = 0, .layer_end = 4};
    sh[1] = (struct cluster_shard){.rank = 1, .world_size = 2, .layer_begin = 4, .layer_end = 10};
    uint64_t kv = 2 * 8 * 128 * 2 * (uint64_t)runner_kv_pool_positions(MASTER_CTX_LEN); /* per layer */
    uint64_t b0 = master_shard_bytes(&cards[0], NULL, &one, 0);
    uint64_t b1 = master_shard_bytes(&cards[0], NULL, &one, 1);
    CHECK(b0 == 4 * (100 * MIB + kv) + 50 * MIB, "rank 0 holds its layers and the embedding: %llu",
          (unsigned long long)b0);
    CHECK(b1 == 6 * (100 * MIB + kv) + 50 * MIB + 16384, "last rank holds its layers, norm and head: %llu",
          (unsigned long long)b1);
    CHECK(master_shard_bytes(&cards[0], NULL, &one, 2) == 0, "no shard 2");
}

static void test_commands(void)
{
    struct cluster_state *s = new_state();
    struct command c;
    struct command_result res;
    struct master_events evs = {0};

    /* CreateInstance checks nodes, ids and the model's layers. */
    json_t *body = json_loads("{\"instance_id\":\"x1\",\"model_id\":\"small\",\"shards\":["
                              "{\"node_id\":\"a\",\"layer_begin\":0,\"layer_end\":2},"
                              "{\"node_id\":\"b\",\"layer_begin\":2,\"layer_end\":4}]}",
                              0, NULL);
    CHECK(command_from_request(COMMAND_CREATE_INSTANCE, body, NULL, &c, err, sizeof err) == 0,
          "create request: %s", err);
    CHECK(run(s, &c, &evs, &res) == 0 && evs.n == 1 && !strcmp(res.instance_id, "x1"),
          "explicit instance: %s", res.message);
    apply_all(s, &evs);
    master_events_clear(&evs);
    CHECK(run(s, &c, &evs, &res) == CAIRN_ESTATE && strstr(res.message, "instance_id"),
          "same id again: %s", res.message);
    snprintf(c.create_instance.id, sizeof c.create_instance.id, "x2");
    CHECK(run(s, &c, &evs, &res) == CAIRN_ESTATE && strstr(res.message, "runner_id"),
          "runner ids in use: %s", res.message);
    snprintf(c.create_instance.shards[0].runner_id, sizeof c.create_instance.shards[0].runner_id, "r-a");
    snprintf(c.create_instance.shards[1].runner_id, sizeof c.create_instance.shards[1].runner_id, "r-b");
    snprintf(c.create_instance.shards[1].node_id, sizeof c.create_instance.shards[1].node_id, "zz");
    CHECK(run(s, &c, &evs, &res) == CAIRN_EFORMAT && strstr(res.message, "shards[1].node_id"),
          "unknown node: %s", res.message);
    snprintf(c.create_instance.shards[1].node_id, sizeof c.create_instance.shards[1].node_id, "c");
    c.create_instance.shards[1].layer_end = 3;
    CHECK(run(s, &c, &evs, &res) == CAIRN_EFORMAT && strstr(res.message, "layer_end"),
          "layers short of the model's: %s", res.message);
    c.create_instance.shards[1].layer_end = 4;
    snprintf(c.create_instance.model_id, sizeof c.create_instance.model_id, "nope");
    CHECK(run(s, &c, &evs, &res) == CAIRN_ENOTFOUND, "unknown model: %s", res.message);
    command_clear(&c);
    json_decref(body);

    /* Draft model. */
    command_init(&c, COMMAND_SET_INSTANCE_DRAFT_MODEL);
    snprintf(c.set_draft_model.instance_id, sizeof c.set_draft_model.instance_id, "x1");
    snprintf(c.set_draft_model.draft_model, sizeof c.set_draft_model.draft_model, "small");
    c.set_draft_model.num_draft_tokens = 6;
    CHECK(run(s, &c, &evs, &res) == 0 && evs.n == 1 &&
              evs.ev[0].kind == EVENT_INSTANCE_DRAFT_MODEL_UPDATED,
          "draft set: %s", res.message);
    apply_all(s, &evs);
    master_events_clear(&evs);
    const struct cluster_instance *in = cluster_state_find_instance(s, "x1");
    CHECK(in && !strcmp(in->draft_model, "small") && in->num_draft_tokens == 6, "draft applied");
    snprintf(c.set_draft_model.draft_model, sizeof c.set_draft_model.draft_model, "nope");
    CHECK(run(s, &c, &evs, &res) == CAIRN_ENOTFOUND, "unknown draft: %s", res.message);
    c.set_draft_model.draft_model[0] = 0;
    CHECK(run(s, &c, &evs, &res) == 0, "draft removed: %s", res.message);
    apply_all(s, &evs);
    master_events_clear(&evs);
    in = cluster_state_find_instance(s, "x1");
    CHECK(in && in->draft_model[0] == 0, "no draft any more");
    snprintf(c.set_draft_model.instance_id, sizeof c.set_draft_model.instance_id, "ghost");
    CHECK(run(s, &c, &evs, &res) == CAIRN_ENOTFOUND && strstr(res.message, "ghost"),
          "draft of an unknown instance: %s", res.message);
    command_clear(&c);

    /* Delete. */
    command_init(&c, COMMAND_DELETE_INSTANCE);
    snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "ghost");
    CHECK(run(s, &c, &evs, &res) == CAIRN_ENOTFOUND, "delete unknown: %s", res.message);
    snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "x1");
    CHECK(run(s, &c, &evs, &res) == 0 && evs.n == 1 && evs.ev[0].kind == EVENT_INSTANCE_DELETED,
          "delete: %s", res.message);
    apply_all(s, &evs);
    master_events_clear(&evs);
    CHECK(!cluster_state_find_instance(s, "x1"), "deleted");
    command_clear(&c);
    cluster_state_release(s);
}

static json_t *runner_json(const char *id, const char *node, const char *status)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:n, s:i}", "runner_id", id, "instance_id", "i1",
                     "node_id", node, "status", status, "error", "restart_count", 0);
}

static void test_reports(void)
{
    struct cluster_state *s = new_state();
    struct master_events evs = {0};
    json_t *info = json_pack("{s:I, s:I, s:I, s:I, s:s, s:i, s:s, s:s, s:s, s:[], s:i, s:i}",
                             "memory_total_bytes", (json_int_t)(8 * GIB), "memory_available_bytes",
                             (json_int_t)(4 * GIB), "disk_free_bytes", (json_int_t)GIB,
                             "disk_total_bytes", (json_int_t)(2 * GIB), "cpu_model", "cpu",
                             "cpu_cores", 4, "isa", "avx2", "os", "Linux", "hostname", "h",
                             "interfaces", "api_port", 52415, "cluster_port", 52416);
    json_t *report = json_pack("{s:s, s:O, s:[o,o], s:[{s:s, s:i, s:i}]}", "node_id", "d", "info",
                               info, "runners", runner_json("r1", "d", "Loading"),
                               runner_json("r2", "d", "Ready"), "edges", "to", "a", "rtt_us",
                               5000, "throughput_bytes_per_s", 0);
    int rc = master_report_events(s, "d", report, 12345, &evs, err, sizeof err);
    CHECK(rc == 0 && evs.n == 4, "info, two runners and an edge: rc %d, %zu events: %s", rc, evs.n,
          err);
    CHECK(evs.n >= 1 && evs.ev[0].kind == EVENT_NODE_GATHERED_INFO &&
              evs.ev[0].node_gathered_info.when_ms == 12345 &&
              evs.ev[0].node_gathered_info.info.memory_available == (int64_t)(4 * GIB),
          "NodeGatheredInfo stamped by the master");
    apply_all(s, &evs);
    master_events_clear(&evs);
    CHECK(cluster_state_find_node(s, "d") && cluster_state_find_runner(s, "r2") &&
              cluster_state_find_edge(s, "d", "a"),
          "report applied");

    /* Throughput: measured (from 0) is a change; moves within 25% are not; beyond are. */
    json_t *tp_edge = json_array_get(json_object_get(report, "edges"), 0);
    json_object_set_new(report, "info", json_null());
    int64_t tputs[] = {100000000, 120000000, 80000000, 140000000, 0};
    int want[] = {1, 0, 0, 1, 1};
    for (size_t i = 0; i < sizeof tputs / sizeof tputs[0]; i++) {
        json_object_set_new(tp_edge, "throughput_bytes_per_s", json_integer(tputs[i]));
        rc = master_report_events(s, "d", report, 12500, &evs, err, sizeof err);
        CHECK(rc == 0 && (int)evs.n == want[i] &&
                  (!want[i] || (evs.ev[0].kind == EVENT_TOPOLOGY_EDGE_CREATED &&
                                evs.ev[0].topology_edge_created.throughput == tputs[i])),
              "throughput %lld after %lld: %zu events, want %d", (long long)tputs[i],
              (long long)(i ? tputs[i - 1] : 0), evs.n, want[i]);
        apply_all(s, &evs);
        master_events_clear(&evs);
    }
    const struct cluster_edge *ed = cluster_state_find_edge(s, "d", "a");
    CHECK(ed && ed->throughput == 0 && ed->rtt_us == 5000, "the edge as last changed: %lld %lld",
          ed ? (long long)ed->throughput : -1LL, ed ? (long long)ed->rtt_us : -1LL);

    json_object_set(report, "info", info);

    /* The same info (later), runners and an rtt within the slack: no event at all. */
    json_t *edge = json_array_get(json_object_get(report, "edges"), 0);
    json_object_set_new(edge, "rtt_us", json_integer(5600));
    rc = master_report_events(s, "d", report, 12400, &evs, err, sizeof err);
    CHECK(rc == 0 && evs.n == 0, "a report that changes nothing makes no event: rc %d, %zu events (first %s)",
          rc, evs.n, evs.n ? event_kind_name((int)evs.ev[0].kind) : "-");
    master_events_clear(&evs);

    /* The info moves: NodeGatheredInfo with it, and nothing else. */
    json_object_set_new(json_object_get(report, "info"), "memory_available_bytes", json_integer((json_int_t)(3 * GIB)));
    rc = master_report_events(s, "d", report, 12450, &evs, err, sizeof err);
    CHECK(rc == 0 && evs.n == 1 && evs.ev[0].kind == EVENT_NODE_GATHERED_INFO &&
              evs.ev[0].node_gathered_info.info.memory_available == (int64_t)(3 * GIB) &&
              evs.ev[0].node_gathered_info.when_ms == 12450,
          "changed info makes its event: rc %d, %zu events", rc, evs.n);
    apply_all(s, &evs);
    master_events_clear(&evs);
    rc = master_report_events(s, "d", report, 12460, &evs, err, sizeof err);
    CHECK(rc == 0 && evs.n == 0, "then the same info again makes none: %zu", evs.n);
    master_events_clear(&evs);
    const struct cluster_node *nd = cluster_state_find_node(s, "d");
    CHECK(nd && nd->last_seen_ms == 12450, "last_seen_ms stays at the last change: %lld",
          nd ? (long long)nd->last_seen_ms : -1LL);

    /* r1 changes, r2 is gone, the edge to a is gone; no info this time. */
    json_object_set_new(report, "info", json_null());
    json_object_set_new(report, "runners", json_pack("[o]", runner_json("r1", "d", "Ready")));
    json_object_set_new(report, "edges", json_array());
    rc = master_report_events(s, "d", report, 12500, &evs, err, sizeof err);
    CHECK(rc == 0 && evs.n == 3 && evs.ev[0].kind == EVENT_RUNNER_STATUS_UPDATED &&
              evs.ev[1].kind == EVENT_RUNNER_DELETED && evs.ev[2].kind == EVENT_TOPOLOGY_EDGE_DELETED,
          "changes only: %zu events", evs.n);
    apply_all(s, &evs);
    master_events_clear(&evs);
    CHECK(!cluster_state_find_runner(s, "r2") && !cluster_state_find_edge(s, "d", "a"), "removed");

    /* Refusals: nothing is appended. */
    rc = master_report_events(s, "e", report, 1, &evs, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "node_id") && evs.n == 0, "sender mismatch: %s", err);
    json_object_set_new(report, "runners", json_pack("[o]", runner_json("r9", "a", "Ready")));
    rc = master_report_events(s, "d", report, 1, &evs, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "runners[0].node_id") && evs.n == 0,
          "a runner of another node: %s", err);
    json_object_set_new(report, "runners", json_null());
    json_object_set_new(report, "edges", json_pack("[{s:s, s:i, s:i}]", "to", "d", "rtt_us", 1,
                                                   "throughput_bytes_per_s", 0));
    rc = master_report_events(s, "d", report, 1, &evs, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "edges[0].to") && evs.n == 0, "an edge to itself: %s",
          err);
    json_object_set_new(report, "edges", json_null());
    json_object_set_new(report, "info", json_pack("{s:i}", "memory_total_bytes", -1));
    rc = master_report_events(s, "d", report, 1, &evs, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "report.info") && evs.n == 0, "bad info: %s", err);
    json_object_set_new(report, "extra", json_true());
    rc = master_report_events(s, "d", report, 1, &evs, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "extra"), "unknown field: %s", err);
    master_events_clear(&evs);
    json_decref(report);
    json_decref(info);
    cluster_state_release(s);
}

/* Two nodes applying what the master made hold equal states. */
static void test_replay(void)
{
    struct cluster_state *master = new_state();
    struct cluster_state *follower = cluster_state_copy(master);
    struct command_result res;
    const struct cluster_instance *in;
    struct master_events evs = {0};
    for (int i = 0; i < 3; i++) {
        struct command c;
        command_init(&c, COMMAND_PLACE_INSTANCE);
        snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "small");
        c.place_instance.min_nodes = 1;
        CHECK(run(master, &c, &evs, &res) == 0, "place %d: %s", i, res.message);
        command_clear(&c);
    }
    apply_all(master, &evs);
    /* The follower decodes what the master sent (JSON), as from the network. */
    for (size_t i = 0; i < evs.n; i++) {
        char *text = event_to_json(&evs.ev[i]);
        struct event e;
        CHECK(text && event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "decode: %s", err);
        CHECK(cluster_apply(follower, &e, err, sizeof err) == 0, "follower apply: %s", err);
        event_clear(&e);
        free(text);
    }
    master_events_clear(&evs);
    char *a = cluster_state_to_json(master), *b = cluster_state_to_json(follower);
    CHECK(a && b && !strcmp(a, b), "states differ:\n%s\n%s", a, b);
    free(a);
    free(b);
    (void)in;
    cluster_state_release(master);
    cluster_state_release(follower);
}

/* "sharding": "auto": tensor parallelism where its best candidate is estimated faster
 * than the best pipeline (fast links), the pipeline where the links are slow or a node
 * has not measured its bandwidth. */
static void test_auto_sharding(void)
{
    static const struct {
        int64_t bw, rtt_us;
        enum cluster_sharding want;
    } cases[] = {
        {10000000000, 100, CLUSTER_SHARDING_TENSOR},
        {10000000000, 20000, CLUSTER_SHARDING_PIPELINE},
        {0, 100, CLUSTER_SHARDING_PIPELINE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cluster_state *s = cluster_state_create();
        s->last_term = 1;
        const char *ids[2] = {"a", "b"};
        for (int k = 0; k < 2; k++) {
            struct cluster_node n;
            memset(&n, 0, sizeof n);
            snprintf(n.id, sizeof n.id, "%s", ids[k]);
            n.info.memory_available = (int64_t)(8 * GIB);
            n.info.memory_total = (int64_t)(16 * GIB);
            n.info.memory_bandwidth = cases[i].bw;
            CHECK(cluster_state_put_node(s, &n) == 0, "put node");
            struct cluster_edge e = {.rtt_us = cases[i].rtt_us, .throughput = 1000000000};
            snprintf(e.from, sizeof e.from, "%s", ids[k]);
            snprintf(e.to, sizeof e.to, "%s", ids[1 - k]);
            CHECK(cluster_state_put_edge(s, &e) == 0, "put edge");
        }
        struct command c;
        struct master_events evs = {0};
        struct command_result res;
        command_init(&c, COMMAND_PLACE_INSTANCE);
        snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "big");
        c.place_instance.min_nodes = 2;
        c.place_instance.sharding_auto = true;
        int rc = run(s, &c, &evs, &res);
        CHECK(rc == 0 && evs.n == 1, "case %zu: %s", i, res.message);
        if (rc == 0 && evs.n == 1) {
            const struct cluster_instance *in = &evs.ev[0].instance_created;
            CHECK(in->sharding == cases[i].want && in->n_shards == 2, "case %zu: sharding %d over %zu, want %d", i,
                  (int)in->sharding, in->n_shards, (int)cases[i].want);
        }
        master_events_clear(&evs);
        cluster_state_release(s);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    add_card("big", 10, 100 * MIB, 50 * MIB, 50 * MIB, false);
    add_card("small", 4, MIB, MIB, 0, true);
    RUN(test_place);
    RUN(test_commands);
    RUN(test_reports);
    RUN(test_replay);
    RUN(test_context);
    RUN(test_sliding_window);
    RUN(test_auto_sharding);
    for (int i = 0; i < n_cards; i++)
        catalog_card_clear(&cards[i]);
    return test_main_end();
}
