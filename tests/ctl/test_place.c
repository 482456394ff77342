/* Placement: hand cases with known layouts and reasons, randomized invariants with a
 * brute-force oracle on small clusters, determinism, bounded work on large clusters. */
#include "ctl/place.h"

#include "base/err.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GiB ((uint64_t)1 << 30)
#define MiB ((uint64_t)1 << 20)

/* A request under construction: nodes and links held by value. */
struct req {
    struct place_node nodes[PLACE_MAX_NODES];
    char ids[PLACE_MAX_NODES][16];
    struct place_link links[33000];
    struct place_request r;
};

static void req_init(struct req *q)
{
    memset(q, 0, sizeof *q);
    q->r.nodes = q->nodes;
    q->r.links = q->links;
    q->r.min_nodes = 1;
    q->r.model.n_layers = 32;
    q->r.model.layer_bytes = 100 * MiB;
    q->r.model.embed_bytes = 500 * MiB;
    q->r.model.head_bytes = 500 * MiB;
    q->r.model.norm_bytes = 16 * 1024;
    q->r.model.kv_bytes_per_token_layer = 1024;
    q->r.model.ctx_len = 4096;
    q->r.model.n_slots = 1;
    q->r.model.n_head = 32;
    q->r.model.n_head_kv = 8;
    q->r.model.id = "m1";
}

static void add_node(struct req *q, const char *id, uint64_t avail)
{
    size_t i = q->r.n_nodes++;
    snprintf(q->ids[i], sizeof q->ids[i], "%s", id);
    q->nodes[i] = (struct place_node){.id = q->ids[i], .available = avail, .total = avail * 2};
}

static void add_link(struct req *q, const char *a, const char *b, uint32_t rtt)
{
    q->links[q->r.n_links++] = (struct place_link){.from = a, .to = b, .rtt_us = rtt};
}

static void full_mesh(struct req *q, uint32_t rtt)
{
    for (size_t i = 0; i < q->r.n_nodes; i++)
        for (size_t j = i + 1; j < q->r.n_nodes; j++)
            add_link(q, q->ids[i], q->ids[j], rtt);
}

static int run_place(struct req *q, struct place_result *res)
{
    char err[256] = "";
    int rc = place_compute(&q->r, res, err, sizeof err);
    CHECK(rc == 0, "place_compute: %d %s", rc, err);
    return rc;
}

static const struct place_candidate *best(const struct place_result *res)
{
    return res->best >= 0 ? &res->cands[res->best] : NULL;
}

static const struct place_candidate *find_cand(const struct place_result *res, const char *ids)
{
    /* ids: comma-separated node ids in rank order */
    for (size_t i = 0; i < res->n_cands; i++) {
        char buf[512] = "";
        for (uint32_t r = 0; r < res->cands[i].n_nodes; r++) {
            if (r)
                strcat(buf, ",");
            strcat(buf, res->cands[i].shares[r].id);
        }
        if (strcmp(buf, ids) == 0)
            return &res->cands[i];
    }
    return NULL;
}

static uint64_t model_kv_layer(const struct place_model *m, uint32_t l)
{
    if (m->layer_window && m->layer_window[l])
        return m->kv_bytes_per_token_layer * m->window_positions;
    return m->kv_bytes_per_token_layer * m->ctx_len * m->n_slots;
}

static void test_one_node_fits(void)
{
    static struct req q;
    req_init(&q);
    add_node(&q, "a", 16 * GiB);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b != NULL, "no best candidate");
    if (b) {
        const struct place_share *s = &b->shares[0];
        uint64_t kv = 1024ull * 4096 * 32;
        CHECK_EQ_INT(b->n_nodes, 1);
        CHECK(b->accepted && b->executable, "accepted %d executable %d", b->accepted, b->executable);
        CHECK_EQ_INT(s->layer_begin, 0);
        CHECK_EQ_INT(s->layer_end, 32);
        CHECK_EQ_INT(s->need.layers, 3200 * MiB);
        CHECK_EQ_INT(s->need.embedding, 500 * MiB);
        CHECK_EQ_INT(s->need.head, 500 * MiB + 16 * 1024);
        CHECK_EQ_INT(s->need.kv, kv);
        CHECK_EQ_INT(s->need.draft, 0);
        CHECK_EQ_INT(s->need.total, 4200 * MiB + 16 * 1024 + kv);
        CHECK_EQ_INT(b->free_left, 16 * GiB - s->need.total);
        CHECK(strcmp(s->id, "a") == 0, "id %s", s->id);
    }
    CHECK_EQ_INT(res.n_cands, 1);
    CHECK(!res.truncated, "truncated");
    place_result_free(&res);
}

static void test_two_nodes_needed(void)
{
    static struct req q;
    req_init(&q);
    add_node(&q, "a", 3 * GiB);
    add_node(&q, "b", 3 * GiB);
    add_link(&q, "a", "b", 500);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 2, "best has %u nodes", b ? b->n_nodes : 0);
    if (b && b->n_nodes == 2) {
        CHECK(strcmp(b->shares[0].id, "a") == 0 && strcmp(b->shares[1].id, "b") == 0,
              "order %s,%s", b->shares[0].id, b->shares[1].id);
        CHECK_EQ_INT(b->shares[0].layer_end, 16);
        CHECK_EQ_INT(b->shares[1].layer_begin, 16);
        CHECK_EQ_INT(b->shares[1].layer_end, 32);
        CHECK_EQ_INT(b->shares[0].need.embedding, 500 * MiB);
        CHECK_EQ_INT(b->shares[0].need.head, 0);
        CHECK_EQ_INT(b->shares[1].need.embedding, 0);
        CHECK_EQ_INT(b->shares[1].need.head, 500 * MiB + 16 * 1024);
        CHECK_EQ_INT(b->max_rtt_us, 500);
        CHECK_EQ_INT(b->sum_rtt_us, 500);
    }
    /* The single-node set is refused with the node's need and free memory. */
    const struct place_candidate *one = find_cand(&res, "a");
    CHECK(one && !one->accepted, "single a %s", one ? "accepted" : "missing");
    if (one)
        CHECK(strstr(one->reason, "node a: needs 4.2 GiB, has 3.0 GiB free") != NULL, "reason '%s'",
              one->reason);
    place_result_free(&res);
}

static void test_three_unequal(void)
{
    static struct req q;
    req_init(&q);
    q.r.model.n_layers = 7;
    q.r.model.layer_bytes = 10 * MiB;
    q.r.model.embed_bytes = 0;
    q.r.model.head_bytes = 0;
    q.r.model.norm_bytes = 0;
    q.r.model.kv_bytes_per_token_layer = 0;
    q.r.min_nodes = 3;
    add_node(&q, "c", 2 * GiB);
    add_node(&q, "a", 5 * GiB);
    add_node(&q, "b", 3 * GiB);
    full_mesh(&q, 100);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 3, "best %u nodes", b ? b->n_nodes : 0);
    if (b && b->n_nodes == 3) {
        /* quotas 3.5, 2.1, 1.4 -> floors 3,2,1, the one left goes to the largest
         * remainder (a) -> 4,2,1 in order a,b,c (most free first). */
        CHECK(strcmp(b->shares[0].id, "a") == 0 && strcmp(b->shares[1].id, "b") == 0 &&
                  strcmp(b->shares[2].id, "c") == 0,
              "order %s,%s,%s", b->shares[0].id, b->shares[1].id, b->shares[2].id);
        uint32_t want[3] = {4, 2, 1}, at = 0;
        for (int r = 0; r < 3; r++) {
            CHECK_EQ_INT(b->shares[r].layer_begin, at);
            CHECK_EQ_INT(b->shares[r].layer_end - b->shares[r].layer_begin, want[r]);
            at = b->shares[r].layer_end;
        }
        CHECK_EQ_INT(at, 7);
    }
    /* 20 layers over 8:1:1 GiB: 16, 2, 2. And 3 layers over 100:1:1: one each. */
    q.r.model.n_layers = 20;
    q.nodes[0].available = 1 * GiB;
    q.nodes[1].available = 8 * GiB;
    q.nodes[2].available = 1 * GiB;
    place_result_free(&res);
    if (run_place(&q, &res))
        return;
    b = best(&res);
    CHECK(b && b->n_nodes == 3, "best");
    if (b && b->n_nodes == 3) {
        CHECK_EQ_INT(b->shares[0].layer_end, 16);
        CHECK_EQ_INT(b->shares[1].layer_end - b->shares[1].layer_begin, 2);
        CHECK_EQ_INT(b->shares[2].layer_end - b->shares[2].layer_begin, 2);
    }
    q.r.model.n_layers = 3;
    q.nodes[1].available = 100 * GiB;
    place_result_free(&res);
    if (run_place(&q, &res))
        return;
    b = best(&res);
    CHECK(b && b->n_nodes == 3, "best");
    if (b && b->n_nodes == 3)
        for (int r = 0; r < 3; r++)
            CHECK_EQ_INT(b->shares[r].layer_end - b->shares[r].layer_begin, 1);
    place_result_free(&res);
}

static void test_tied_head(void)
{
    static struct req q;
    req_init(&q);
    q.r.model.tied = 1;
    q.r.model.head_bytes = 999 * MiB; /* ignored when tied */
    add_node(&q, "a", 16 * GiB);
    add_node(&q, "b", 16 * GiB);
    add_link(&q, "a", "b", 10);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *one = find_cand(&res, "a");
    CHECK(one && one->accepted, "single a");
    if (one) {
        CHECK_EQ_INT(one->shares[0].need.embedding, 500 * MiB);
        CHECK_EQ_INT(one->shares[0].need.head, 16 * 1024); /* the embedding serves as head */
    }
    place_result_free(&res);
    q.r.min_nodes = 2;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 2, "best");
    if (b && b->n_nodes == 2) {
        CHECK_EQ_INT(b->shares[0].need.embedding, 500 * MiB);
        CHECK_EQ_INT(b->shares[0].need.head, 0);
        CHECK_EQ_INT(b->shares[1].need.embedding, 0);
        CHECK_EQ_INT(b->shares[1].need.head, 500 * MiB + 16 * 1024); /* second copy */
    }
    place_result_free(&res);
}

static void test_draft_rank0(void)
{
    static struct req q;
    req_init(&q);
    q.r.model.draft_bytes = 300 * MiB;
    q.r.model.draft_kv_bytes_per_token = 2048;
    q.r.model.n_slots = 2;
    q.r.min_nodes = 3;
    add_node(&q, "a", 8 * GiB);
    add_node(&q, "b", 8 * GiB);
    add_node(&q, "c", 8 * GiB);
    full_mesh(&q, 10);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 3, "best");
    if (b && b->n_nodes == 3) {
        CHECK_EQ_INT(b->shares[0].need.draft, 300 * MiB + 2048ull * 4096 * 2);
        CHECK_EQ_INT(b->shares[1].need.draft, 0);
        CHECK_EQ_INT(b->shares[2].need.draft, 0);
        uint32_t n0 = b->shares[0].layer_end - b->shares[0].layer_begin;
        CHECK_EQ_INT(b->shares[0].need.kv, 1024ull * 4096 * 2 * n0);
    }
    place_result_free(&res);
}

static void test_refusal_reason(void)
{
    static struct req q;
    req_init(&q);
    q.r.model.n_layers = 1;
    q.r.model.layer_bytes = 3435973837ull; /* 3.2 GiB */
    q.r.model.embed_bytes = 0;
    q.r.model.head_bytes = 0;
    q.r.model.norm_bytes = 0;
    q.r.model.kv_bytes_per_token_layer = 0;
    add_node(&q, "b", 2 * GiB + 100 * MiB);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    CHECK_EQ_INT(res.best, -1);
    CHECK_EQ_INT(res.n_cands, 1);
    if (res.n_cands == 1) {
        CHECK(!res.cands[0].accepted, "accepted");
        CHECK(strcmp(res.cands[0].reason, "node b: needs 3.2 GiB, has 2.1 GiB free") == 0,
              "reason '%s'", res.cands[0].reason);
    }
    place_result_free(&res);

    /* held memory is not free: 10 GiB available, 7 GiB held by another instance. */
    req_init(&q);
    add_node(&q, "x", 10 * GiB);
    q.nodes[0].held = 7 * GiB;
    if (run_place(&q, &res))
        return;
    CHECK_EQ_INT(res.best, -1);
    if (res.n_cands)
        CHECK(strstr(res.cands[0].reason, "has 3.0 GiB free") != NULL, "reason '%s'",
              res.cands[0].reason);
    place_result_free(&res);
    q.nodes[0].held = 12 * GiB; /* more than available: nothing free, no underflow */
    if (run_place(&q, &res))
        return;
    CHECK(res.n_cands == 1 && res.cands[0].shares[0].free == 0, "free %llu",
          res.n_cands ? (unsigned long long)res.cands[0].shares[0].free : 0ull);
    place_result_free(&res);
}

static void test_min_nodes(void)
{
    static struct req q;
    req_init(&q);
    add_node(&q, "a", 16 * GiB);
    add_node(&q, "b", 16 * GiB);
    add_link(&q, "b", "a", 10);
    q.r.min_nodes = 2;
    struct place_result res;
    if (run_place(&q, &res))
        return;
    for (size_t i = 0; i < res.n_cands; i++)
        CHECK(res.cands[i].n_nodes >= 2, "candidate %zu has %u nodes", i, res.cands[i].n_nodes);
    CHECK(best(&res) && best(&res)->n_nodes == 2, "best");
    place_result_free(&res);

    q.r.min_nodes = 3;
    if (run_place(&q, &res))
        return;
    CHECK_EQ_INT(res.best, -1);
    CHECK_EQ_INT(res.n_cands, 1);
    if (res.n_cands == 1)
        CHECK(strcmp(res.cands[0].reason, "fewer than min_nodes=3 nodes (the cluster has 2)") == 0,
              "reason '%s'", res.cands[0].reason);
    place_result_free(&res);

    /* max_nodes bounds the sizes; a pipeline longer than the layers is refused. */
    q.r.min_nodes = 1;
    q.r.max_nodes = 1;
    if (run_place(&q, &res))
        return;
    for (size_t i = 0; i < res.n_cands; i++)
        CHECK_EQ_INT(res.cands[i].n_nodes, 1);
    place_result_free(&res);
    q.r.max_nodes = 0;
    q.r.model.n_layers = 1;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *last = res.n_cands ? &res.cands[res.n_cands - 1] : NULL;
    CHECK(last && last->n_nodes == 2 && !last->accepted &&
              strstr(last->reason, "2 nodes but the model has only 1 layers") != NULL,
          "last '%s'", last ? last->reason : "");
    place_result_free(&res);
}

static void test_tensor(void)
{
    static struct req q;
    req_init(&q);
    q.r.sharding = PLACE_TENSOR;
    q.r.model.n_head = 14;
    q.r.model.n_head_kv = 2;
    q.r.min_nodes = 3;
    add_node(&q, "a", 8 * GiB);
    add_node(&q, "b", 8 * GiB);
    add_node(&q, "c", 8 * GiB);
    full_mesh(&q, 10);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    CHECK_EQ_INT(res.best, -1);
    CHECK_EQ_INT(res.n_cands, 1);
    if (res.n_cands == 1)
        CHECK(strcmp(res.cands[0].reason, "tensor parallel: 14 heads do not divide by 3 nodes") == 0,
              "reason '%s'", res.cands[0].reason);
    place_result_free(&res);

    q.r.model.n_head = 12;
    if (run_place(&q, &res))
        return;
    CHECK(res.n_cands == 1 && strcmp(res.cands[0].reason,
                                     "tensor parallel: 2 KV heads do not divide by 3 nodes") == 0,
          "reason '%s'", res.n_cands ? res.cands[0].reason : "");
    place_result_free(&res);

    /* a mixture of experts is not split (heads that divide) */
    q.r.model.n_head = 12;
    q.r.model.n_head_kv = 3;
    q.r.model.n_expert = 8;
    if (run_place(&q, &res))
        return;
    CHECK(res.n_cands == 1 && strstr(res.cands[0].reason, "a mixture of experts is not split"), "reason '%s'",
          res.n_cands ? res.cands[0].reason : "");
    place_result_free(&res);
    q.r.model.n_expert = 0;
    q.r.model.n_head_kv = 2;

    /* 2 nodes: heads divide; each holds half of every matrix (its rows), the layers'
     * vectors whole (4 norm-sized per layer) and half the KV; the embedding lookup reads
     * rows on demand. */
    q.r.min_nodes = 2;
    q.r.max_nodes = 2;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 2 && b->executable, "best tensor");
    if (b && b->n_nodes == 2) {
        for (int r = 0; r < 2; r++) {
            CHECK_EQ_INT(b->shares[r].layer_begin, 0);
            CHECK_EQ_INT(b->shares[r].layer_end, 32);
            CHECK_EQ_INT(b->shares[r].need.layers, 1600 * MiB + 32 * 4 * 16 * 1024);
            CHECK_EQ_INT(b->shares[r].need.kv, 1024ull * 4096 * 16);
            CHECK_EQ_INT(b->shares[r].need.embedding, 0);
            CHECK_EQ_INT(b->shares[r].need.head, 250 * MiB + 16 * 1024);
        }
    }
    place_result_free(&res);

    /* Nodes that cannot hold the whole model (4.2 GiB of weights) but each its share: a
     * tensor placement over two runs; a single node fits nowhere. */
    req_init(&q);
    q.r.sharding = PLACE_TENSOR;
    q.r.model.n_head = 32;
    q.r.model.n_head_kv = 8;
    add_node(&q, "a", 3 * GiB);
    add_node(&q, "b", 3 * GiB);
    full_mesh(&q, 10);
    if (run_place(&q, &res))
        return;
    b = best(&res);
    CHECK(b && b->n_nodes == 2 && b->executable && b->shares[0].need.total < 2 * GiB, "tensor share of a model "
          "no node holds (%u nodes, need %llu)", b ? b->n_nodes : 0, b ? (unsigned long long)b->shares[0].need.total : 0);
    for (size_t i = 0; i < res.n_cands; i++)
        CHECK(res.cands[i].n_nodes != 1 || !res.cands[i].accepted, "one node of 3 GiB accepted");
    place_result_free(&res);

    /* Tensor needs every pair linked. */
    req_init(&q);
    q.r.sharding = PLACE_TENSOR;
    q.r.min_nodes = 2;
    add_node(&q, "a", 8 * GiB);
    add_node(&q, "b", 8 * GiB);
    if (run_place(&q, &res))
        return;
    CHECK(res.n_cands == 1 && strcmp(res.cands[0].reason, "nodes a and b are not connected") == 0,
          "reason '%s'", res.n_cands ? res.cands[0].reason : "");
    place_result_free(&res);
}

static void test_disconnected(void)
{
    static struct req q;
    req_init(&q);
    q.r.min_nodes = 2;
    q.r.max_nodes = 2;
    add_node(&q, "a", 6 * GiB);
    add_node(&q, "b", 5 * GiB);
    add_node(&q, "c", (uint64_t)(5.5 * GiB));
    add_link(&q, "a", "b", 100);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *ac = find_cand(&res, "a,c");
    CHECK(ac && !ac->accepted && strcmp(ac->reason, "nodes a and c are not connected") == 0,
          "a,c: %s", ac ? ac->reason : "missing");
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 2 &&
              ((strcmp(b->shares[0].id, "a") == 0 && strcmp(b->shares[1].id, "b") == 0) ||
               (strcmp(b->shares[0].id, "b") == 0 && strcmp(b->shares[1].id, "a") == 0)),
          "best is not a,b");
    place_result_free(&res);

    /* A chain a-b-c: the only orders put b in the middle. */
    req_init(&q);
    q.r.min_nodes = 3;
    add_node(&q, "a", 8 * GiB);
    add_node(&q, "b", 8 * GiB);
    add_node(&q, "c", 8 * GiB);
    add_link(&q, "a", "b", 100);
    add_link(&q, "c", "b", 300);
    if (run_place(&q, &res))
        return;
    b = best(&res);
    CHECK(b && b->n_nodes == 3 && strcmp(b->shares[1].id, "b") == 0, "middle %s",
          b ? b->shares[1].id : "none");
    if (b) {
        CHECK_EQ_INT(b->max_rtt_us, 300);
        CHECK_EQ_INT(b->sum_rtt_us, 400);
    }
    place_result_free(&res);

    /* A full mesh with one slow link: the order avoids it (lowest max rtt). */
    req_init(&q);
    q.r.min_nodes = 3;
    add_node(&q, "a", 8 * GiB);
    add_node(&q, "b", 8 * GiB);
    add_node(&q, "c", 8 * GiB);
    add_link(&q, "a", "b", 100);
    add_link(&q, "b", "c", 120);
    add_link(&q, "a", "c", 900);
    if (run_place(&q, &res))
        return;
    b = best(&res);
    CHECK(b && b->n_nodes == 3 && strcmp(b->shares[1].id, "b") == 0 && b->max_rtt_us == 120,
          "middle %s max rtt %u", b ? b->shares[1].id : "none", b ? b->max_rtt_us : 0);
    place_result_free(&res);

    /* A star: connected, but no path visits every node once. */
    req_init(&q);
    q.r.min_nodes = 4;
    add_node(&q, "hub", 8 * GiB);
    add_node(&q, "x", 8 * GiB);
    add_node(&q, "y", 8 * GiB);
    add_node(&q, "z", 8 * GiB);
    add_link(&q, "hub", "x", 1);
    add_link(&q, "hub", "y", 1);
    add_link(&q, "hub", "z", 1);
    if (run_place(&q, &res))
        return;
    CHECK(res.n_cands == 1 && strstr(res.cands[0].reason, "visits each node once") != NULL,
          "reason '%s'", res.n_cands ? res.cands[0].reason : "");
    place_result_free(&res);
}

static void test_shift(void)
{
    /* Two nodes of 5 GiB; 10 layers of 0.5 GiB; a 3 GiB embedding on rank 0. The
     * proportional 5/5 split needs 5.5 GiB on rank 0; moving layers to rank 1 fits,
     * and the most balanced fit (max need/free lowest) gives rank 0 two layers. */
    static struct req q;
    req_init(&q);
    q.r.model.n_layers = 10;
    q.r.model.layer_bytes = GiB / 2;
    q.r.model.embed_bytes = 3 * GiB;
    q.r.model.head_bytes = GiB / 10;
    q.r.model.norm_bytes = 0;
    q.r.model.kv_bytes_per_token_layer = 0;
    q.r.min_nodes = 2;
    add_node(&q, "a", 5 * GiB);
    add_node(&q, "b", 5 * GiB);
    add_link(&q, "a", "b", 100);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 2, "no 2-node placement");
    if (b && b->n_nodes == 2) {
        CHECK_EQ_INT(b->shares[0].layer_end, 2);
        CHECK_EQ_INT(b->shares[1].layer_end, 10);
        CHECK(b->shares[0].need.total <= b->shares[0].free, "rank 0 over");
        CHECK(b->shares[1].need.total <= b->shares[1].free, "rank 1 over");
    }
    place_result_free(&res);

    /* 4.08 GiB each (8.16 together, more than the 8.1 needed): rank 0 with k layers needs
     * 3 + k/2, rank 1 5.1 - k/2; no integer k fits both. */
    q.nodes[0].available = q.nodes[1].available = 4 * GiB + 82 * MiB;
    if (run_place(&q, &res))
        return;
    CHECK_EQ_INT(res.best, -1);
    CHECK(res.n_cands == 1 && strstr(res.cands[0].reason, "no contiguous split of the 10 layers") &&
              strstr(res.cands[0].reason, "needs 5.5 GiB, has 4.1 GiB free"),
          "reason '%s'", res.n_cands ? res.cands[0].reason : "");
    place_result_free(&res);
}

static void test_per_layer_bytes(void)
{
    static struct req q;
    req_init(&q);
    uint64_t each[6] = {100 * MiB, 300 * MiB, 100 * MiB, 200 * MiB, 100 * MiB, 400 * MiB};
    q.r.model.n_layers = 6;
    q.r.model.layer_bytes_each = each;
    q.r.min_nodes = 2;
    q.r.max_nodes = 2;
    add_node(&q, "a", 4 * GiB);
    add_node(&q, "b", 2 * GiB);
    add_link(&q, "a", "b", 5);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    const struct place_candidate *b = best(&res);
    CHECK(b != NULL, "no placement");
    for (uint32_t r = 0; b && r < b->n_nodes; r++) {
        uint64_t want = 0;
        for (uint32_t l = b->shares[r].layer_begin; l < b->shares[r].layer_end; l++)
            want += each[l];
        CHECK_EQ_INT(b->shares[r].need.layers, want);
    }
    place_result_free(&res);
}

static void test_invalid(void)
{
    static struct req q;
    struct place_result res;
    char err[256];
    int rc;

    req_init(&q);
    add_node(&q, "a", GiB);
    q.r.min_nodes = 0;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "min_nodes"), "rc %d '%s'", rc, err);
    CHECK(res.n_cands == 0 && res.cands == NULL && res.best == -1, "result not empty");
    place_result_free(&res);

    req_init(&q);
    add_node(&q, "a", GiB);
    add_node(&q, "a", GiB);
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "share the id"), "rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    add_node(&q, "a b", GiB);
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "space in id: rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    q.r.model.n_layers = 0;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "n_layers 0: rc %d", rc);
    place_result_free(&res);

    req_init(&q);
    q.r.model.kv_bytes_per_token_layer = UINT64_MAX / 2;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_ERANGE && strstr(err, "KV"), "kv overflow: rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    static const uint8_t slides[64] = {1};
    q.r.model.layer_window = slides;
    q.r.model.window_positions = (uint64_t)q.r.model.ctx_len * q.r.model.n_slots + 1;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "window_positions"), "a window beyond the pool: rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    q.r.model.layer_bytes = PLACE_BYTES_MAX;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_ERANGE, "layers overflow: rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    add_node(&q, "a", UINT64_MAX);
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_ERANGE, "node bytes: rc %d '%s'", rc, err);
    place_result_free(&res);

    req_init(&q);
    q.r.max_nodes = 1;
    q.r.min_nodes = 2;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "max < min: rc %d", rc);
    place_result_free(&res);

    req_init(&q);
    q.r.sharding = (enum place_sharding)7;
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "sharding: rc %d", rc);
    place_result_free(&res);

    rc = place_compute(NULL, &res, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "NULL request: rc %d", rc);
    place_result_free(&res);
    place_result_free(NULL);

    /* Empty cluster: not an error, one refusal. Links to unknown nodes are ignored. */
    req_init(&q);
    add_link(&q, "ghost", "other", 3);
    rc = place_compute(&q.r, &res, err, sizeof err);
    CHECK(rc == 0 && res.n_cands == 1 && res.best == -1 &&
              strstr(res.cands[0].reason, "the cluster has 0"),
          "empty: rc %d n %zu", rc, res.n_cands);
    place_result_free(&res);

    enum place_sharding sh;
    CHECK(place_sharding_parse("tensor", &sh) == 0 && sh == PLACE_TENSOR, "parse tensor");
    CHECK(place_sharding_parse("pipeline", &sh) == 0 && sh == PLACE_PIPELINE, "parse pipeline");
    CHECK(place_sharding_parse("ring", &sh) == CAIRN_EINVAL, "parse ring");
    CHECK(strcmp(place_sharding_name(PLACE_TENSOR), "tensor") == 0, "name");
}

static void test_json(void)
{
    static struct req q;
    req_init(&q);
    add_node(&q, "a", 3 * GiB);
    add_node(&q, "b", 3 * GiB);
    add_link(&q, "a", "b", 500);
    struct place_result res;
    if (run_place(&q, &res))
        return;
    json_t *j = place_result_to_json(&res);
    CHECK(j != NULL, "json");
    if (j) {
        json_t *cands = json_object_get(j, "candidates");
        CHECK(json_is_array(cands) && json_array_size(cands) == res.n_cands, "candidates");
        json_t *bj = json_object_get(j, "best");
        CHECK(json_is_integer(bj) && json_integer_value(bj) == res.best, "best");
        json_t *c0 = json_array_get(cands, (size_t)res.best);
        json_t *sh = json_object_get(c0, "shares");
        CHECK(json_array_size(sh) == 2, "shares");
        json_t *s1 = json_array_get(sh, 1);
        CHECK(strcmp(json_string_value(json_object_get(s1, "node")), "b") == 0, "node");
        CHECK(json_integer_value(json_object_get(json_object_get(s1, "need"), "head")) ==
                  (json_int_t)(500 * MiB + 16 * 1024),
              "need.head");
        CHECK(json_is_true(json_object_get(c0, "accepted")) &&
                  json_is_null(json_object_get(c0, "reason")),
              "accepted");
        json_t *r0 = json_array_get(cands, 0);
        CHECK(json_is_false(json_object_get(r0, "accepted")) &&
                  strstr(json_string_value(json_object_get(r0, "reason")), "needs"),
              "refused has reason");
        CHECK(strcmp(json_string_value(json_object_get(j, "sharding")), "pipeline") == 0, "sharding");
        json_decref(j);
    }
    place_result_free(&res);
}

/* ---- randomized ---- */

static uint32_t rnd(uint64_t *s, uint32_t n)
{
    return (uint32_t)(test_rand_u64(s) % n);
}

static void random_request(struct req *q, uint64_t *s, uint64_t *each)
{
    req_init(q);
    uint32_t n = rnd(s, 7); /* 0..6 nodes */
    for (uint32_t i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "n%u", i);
        add_node(q, id, (uint64_t)(1 + rnd(s, 64)) * 256 * MiB);
        if (rnd(s, 4) == 0)
            q->nodes[i].held = (uint64_t)rnd(s, 16) * 256 * MiB;
    }
    uint32_t p = rnd(s, 4); /* link density 0, 1/3, 2/3, 1 */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++)
            if (rnd(s, 3) < p) {
                if (rnd(s, 2))
                    add_link(q, q->ids[i], q->ids[j], 1 + rnd(s, 1000));
                else
                    add_link(q, q->ids[j], q->ids[i], 1 + rnd(s, 1000));
            }
    struct place_model *m = &q->r.model;
    m->n_layers = 1 + rnd(s, 10);
    m->layer_bytes = (uint64_t)(1 + rnd(s, 64)) * 64 * MiB;
    if (rnd(s, 2)) {
        for (uint32_t l = 0; l < m->n_layers; l++)
            each[l] = (uint64_t)(1 + rnd(s, 64)) * 64 * MiB;
        m->layer_bytes_each = each;
    }
    m->embed_bytes = (uint64_t)rnd(s, 16) * 128 * MiB;
    m->head_bytes = (uint64_t)rnd(s, 16) * 128 * MiB;
    m->tied = rnd(s, 2);
    m->norm_bytes = rnd(s, 100000);
    m->kv_bytes_per_token_layer = rnd(s, 3) * 4096;
    m->ctx_len = 1 + rnd(s, 8192);
    m->n_slots = 1 + rnd(s, 4);
    static uint8_t window[16]; /* n_layers <= 10 */
    if (rnd(s, 3) == 0) { /* some layers slide and hold a part of the positions */
        for (uint32_t l = 0; l < m->n_layers; l++)
            window[l] = (uint8_t)rnd(s, 2);
        m->layer_window = window;
        m->window_positions = rnd(s, m->ctx_len * m->n_slots + 1);
    }
    m->n_head = 1 + rnd(s, 16);
    m->n_head_kv = 1 + rnd(s, 8);
    if (rnd(s, 3) == 0) {
        m->draft_bytes = (uint64_t)rnd(s, 8) * 128 * MiB;
        m->draft_kv_bytes_per_token = rnd(s, 2) * 8192;
    }
    q->r.sharding = rnd(s, 4) == 0 ? PLACE_TENSOR : PLACE_PIPELINE;
    q->r.min_nodes = 1 + rnd(s, 3);
    q->r.max_nodes = rnd(s, 3) == 0 ? q->r.min_nodes + rnd(s, 3) : 0;
}

static uint64_t free_of(const struct place_node *nd)
{
    return nd->available > nd->held ? nd->available - nd->held : 0;
}

static int linked(const struct req *q, const char *a, const char *b)
{
    for (size_t l = 0; l < q->r.n_links; l++)
        if ((strcmp(q->links[l].from, a) == 0 && strcmp(q->links[l].to, b) == 0) ||
            (strcmp(q->links[l].from, b) == 0 && strcmp(q->links[l].to, a) == 0))
            return 1;
    return 0;
}

static uint64_t layer_b(const struct place_model *m, uint32_t l)
{
    return m->layer_bytes_each ? m->layer_bytes_each[l] : m->layer_bytes;
}

/* Independent need of a pipeline rank. */
static uint64_t oracle_pipe_need(const struct place_model *m, uint32_t r, uint32_t k, uint32_t b,
                                 uint32_t e)
{
    uint64_t t = 0;
    for (uint32_t l = b; l < e; l++)
        t += layer_b(m, l) + model_kv_layer(m, l);
    if (r == 0)
        t += m->embed_bytes + m->draft_bytes + m->draft_kv_bytes_per_token * m->ctx_len * m->n_slots;
    if (r == k - 1)
        t += m->norm_bytes + (m->tied ? (k > 1 ? m->embed_bytes : 0) : m->head_bytes);
    return t;
}

/* Does some contiguous split (all compositions) of an ordered node list fit? */
static int oracle_split(const struct req *q, const size_t *ord, uint32_t k, uint32_t r, uint32_t b)
{
    const struct place_model *m = &q->r.model;
    uint32_t L = m->n_layers;
    if (r == k - 1)
        return oracle_pipe_need(m, r, k, b, L) <= free_of(&q->nodes[ord[r]]);
    for (uint32_t e = b + 1; e + (k - 1 - r) <= L; e++)
        if (oracle_pipe_need(m, r, k, b, e) <= free_of(&q->nodes[ord[r]]) &&
            oracle_split(q, ord, k, r + 1, e))
            return 1;
    return 0;
}

static int oracle_perm(const struct req *q, size_t *ord, uint32_t k, uint32_t at)
{
    if (at == k) {
        for (uint32_t i = 0; i + 1 < k; i++)
            if (!linked(q, q->ids[ord[i]], q->ids[ord[i + 1]]))
                return 0;
        return oracle_split(q, ord, k, 0, 0);
    }
    for (uint32_t i = at; i < k; i++) {
        size_t t = ord[at];
        ord[at] = ord[i];
        ord[i] = t;
        int ok = oracle_perm(q, ord, k, at + 1);
        ord[i] = ord[at];
        ord[at] = t;
        if (ok)
            return 1;
    }
    return 0;
}

static int oracle_tensor(const struct req *q, const size_t *set, uint32_t k)
{
    const struct place_model *m = &q->r.model;
    if (k > 1 && (m->n_head % k || m->n_head_kv % k))
        return 0;
    for (uint32_t i = 0; i < k; i++)
        for (uint32_t j = i + 1; j < k; j++)
            if (!linked(q, q->ids[set[i]], q->ids[set[j]]))
                return 0;
    uint64_t layers = 0, kv = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        layers += layer_b(m, l);
        kv += model_kv_layer(m, l);
    }
    /* one node holds every weight; of k > 1, each rank 1/k of every matrix, each layer's 4
     * norm-sized vectors whole, and of a tied embedding its head rows; 1/k of the KV */
    uint64_t per = k == 1 ? layers + kv + m->embed_bytes + m->norm_bytes + (m->tied ? 0 : m->head_bytes)
                          : (layers + k - 1) / k + (uint64_t)m->n_layers * 4 * m->norm_bytes + (kv + k - 1) / k +
                                (m->tied ? (m->embed_bytes + k - 1) / k : 0) + m->norm_bytes +
                                (m->tied ? 0 : (m->head_bytes + k - 1) / k);
    /* rank 0 (draft) may be any node: the one with most free memory is best */
    uint64_t draft = m->draft_bytes + m->draft_kv_bytes_per_token * m->ctx_len * m->n_slots;
    size_t top = set[0];
    for (uint32_t i = 0; i < k; i++) {
        if (free_of(&q->nodes[set[i]]) < per)
            return 0;
        if (free_of(&q->nodes[set[i]]) > free_of(&q->nodes[top]))
            top = set[i];
    }
    return free_of(&q->nodes[top]) >= per + draft;
}

/* Smallest size k in [min, kmax] (k <= 4) for which some node set fits, 0 if none. */
static uint32_t oracle_min_size(const struct req *q, uint32_t kmax)
{
    uint32_t n = (uint32_t)q->r.n_nodes;
    for (uint32_t k = q->r.min_nodes; k <= kmax && k <= 4; k++) {
        if (q->r.sharding == PLACE_PIPELINE && k > q->r.model.n_layers)
            break;
        for (uint32_t mask = 0; mask < (1u << n); mask++) {
            if ((uint32_t)__builtin_popcount(mask) != k)
                continue;
            size_t set[8];
            uint32_t c = 0;
            for (uint32_t i = 0; i < n; i++)
                if (mask >> i & 1)
                    set[c++] = i;
            int ok = q->r.sharding == PLACE_TENSOR ? oracle_tensor(q, set, k) : oracle_perm(q, set, k, 0);
            if (ok)
                return k;
        }
    }
    return 0;
}

static int node_index(const struct req *q, const char *id)
{
    for (size_t i = 0; i < q->r.n_nodes; i++)
        if (strcmp(q->ids[i], id) == 0)
            return (int)i;
    return -1;
}

static void check_invariants(const struct req *q, const struct place_result *res, uint64_t seed)
{
    const struct place_model *m = &q->r.model;
    uint32_t kmax = q->r.max_nodes && q->r.max_nodes < q->r.n_nodes ? q->r.max_nodes
                                                                    : (uint32_t)q->r.n_nodes;
    int fails0 = test_failed;
    for (size_t ci = 0; ci < res->n_cands && test_failed == fails0; ci++) {
        const struct place_candidate *cd = &res->cands[ci];
        CHECK(cd->accepted == (cd->reason[0] == '\0'), "seed %llu cand %zu: accepted %d reason '%s'",
              (unsigned long long)seed, ci, cd->accepted, cd->reason);
        if (!cd->accepted)
            continue;
        uint32_t k = cd->n_nodes;
        CHECK(k >= q->r.min_nodes && k <= kmax, "seed %llu: %u nodes outside [%u, %u]",
              (unsigned long long)seed, k, q->r.min_nodes, kmax);
        uint32_t at = 0;
        uint64_t left = 0;
        for (uint32_t r = 0; r < k; r++) {
            const struct place_share *s = &cd->shares[r];
            int ni = node_index(q, s->id);
            CHECK(ni >= 0 && (size_t)ni == s->node, "seed %llu: share id %s index %zu",
                  (unsigned long long)seed, s->id, s->node);
            if (ni < 0)
                return;
            for (uint32_t r2 = 0; r2 < r; r2++)
                CHECK(cd->shares[r2].node != s->node, "seed %llu: node %s twice",
                      (unsigned long long)seed, s->id);
            CHECK_EQ_INT(s->rank, r);
            CHECK(s->free == free_of(&q->nodes[ni]), "seed %llu: free", (unsigned long long)seed);
            CHECK(s->need.total <= s->free, "seed %llu cand %zu rank %u: need %llu > free %llu",
                  (unsigned long long)seed, ci, r, (unsigned long long)s->need.total,
                  (unsigned long long)s->free);
            CHECK(s->need.total == s->need.layers + s->need.embedding + s->need.head + s->need.kv +
                                       s->need.draft,
                  "seed %llu: total is not the sum", (unsigned long long)seed);
            left += s->free - s->need.total;
            if (q->r.sharding == PLACE_PIPELINE) {
                CHECK(s->layer_begin == at && s->layer_end > s->layer_begin,
                      "seed %llu rank %u: [%u, %u) after %u", (unsigned long long)seed, r,
                      s->layer_begin, s->layer_end, at);
                at = s->layer_end;
                CHECK(s->need.total == oracle_pipe_need(m, r, k, s->layer_begin, s->layer_end),
                      "seed %llu rank %u: need %llu, oracle %llu", (unsigned long long)seed, r,
                      (unsigned long long)s->need.total,
                      (unsigned long long)oracle_pipe_need(m, r, k, s->layer_begin, s->layer_end));
                if (r > 0)
                    CHECK(linked(q, cd->shares[r - 1].id, s->id), "seed %llu: %s-%s not linked",
                          (unsigned long long)seed, cd->shares[r - 1].id, s->id);
            } else {
                CHECK(s->layer_begin == 0 && s->layer_end == m->n_layers, "seed %llu: tensor range",
                      (unsigned long long)seed);
            }
        }
        if (q->r.sharding == PLACE_PIPELINE)
            CHECK(at == m->n_layers, "seed %llu: layers sum to %u, not %u", (unsigned long long)seed,
                  at, m->n_layers);
        else
            CHECK(k == 1 || (m->n_head % k == 0 && m->n_head_kv % k == 0 && k <= PLACE_TENSOR_MAX && cd->executable),
                  "seed %llu: tensor heads %u/%u on %u nodes", (unsigned long long)seed, m->n_head,
                  m->n_head_kv, k);
        CHECK(left == cd->free_left, "seed %llu: free_left", (unsigned long long)seed);
    }
    /* The best is the smallest size that fits (oracle over all sets and orders, k <= 4). */
    uint32_t ko = oracle_min_size(q, kmax);
    const struct place_candidate *b = best(res);
    if (ko)
        CHECK(b && b->n_nodes == ko, "seed %llu: oracle fits %u nodes, best has %u",
              (unsigned long long)seed, ko, b ? b->n_nodes : 0);
    else if (b && b->n_nodes <= 4)
        CHECK(0, "seed %llu: best has %u nodes, oracle finds none", (unsigned long long)seed,
              b->n_nodes);
    for (size_t ci = 0; b && ci < res->n_cands; ci++)
        if (res->cands[ci].accepted && res->cands[ci].n_nodes == b->n_nodes)
            CHECK(res->cands[ci].free_left <= b->free_left, "seed %llu: a candidate leaves more",
                  (unsigned long long)seed);
    CHECK(!res->truncated, "seed %llu: truncated on a small cluster", (unsigned long long)seed);
}

static char *dump(const struct place_result *res)
{
    json_t *j = place_result_to_json(res);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

static void test_random(void)
{
    uint64_t s = 0x5eed;
    int accepted = 0, refused = 0;
    for (int it = 0; it < 4000; it++) {
        uint64_t seed = s;
        static struct req q;
        uint64_t each[16];
        random_request(&q, &s, each);
        struct place_result res;
        char err[256];
        int rc = place_compute(&q.r, &res, err, sizeof err);
        CHECK(rc == 0, "seed %llu: rc %d %s", (unsigned long long)seed, rc, err);
        if (rc)
            continue;
        int fails0 = test_failed;
        check_invariants(&q, &res, seed);
        if (test_failed > fails0) {
            char *d = dump(&res);
            fprintf(stderr, "seed %llu request: n=%zu links=%zu L=%u sharding=%d min=%u max=%u\n%s\n",
                    (unsigned long long)seed, q.r.n_nodes, q.r.n_links, q.r.model.n_layers,
                    q.r.sharding, q.r.min_nodes, q.r.max_nodes, d ? d : "");
            free(d);
        }
        if (res.best >= 0)
            accepted++;
        else
            refused++;

        /* Determinism: again, and with nodes and links given in reverse order. */
        char *a = dump(&res);
        struct place_result res2;
        place_compute(&q.r, &res2, err, sizeof err);
        char *b = dump(&res2);
        CHECK(a && b && strcmp(a, b) == 0, "seed %llu: second run differs", (unsigned long long)seed);
        place_result_free(&res2);
        static struct req rq;
        rq = q;
        for (size_t i = 0; i < q.r.n_nodes; i++) {
            rq.nodes[i] = q.nodes[q.r.n_nodes - 1 - i];
            rq.nodes[i].id = q.ids[q.r.n_nodes - 1 - i];
        }
        for (size_t l = 0; l < q.r.n_links; l++)
            rq.links[l] = q.links[q.r.n_links - 1 - l];
        rq.r.nodes = rq.nodes;
        rq.r.links = rq.links;
        place_compute(&rq.r, &res2, err, sizeof err);
        char *c = dump(&res2);
        CHECK(a && c && strcmp(a, c) == 0, "seed %llu: node order changes the result\n%s\n%s",
              (unsigned long long)seed, a ? a : "", c ? c : "");
        place_result_free(&res2);
        free(a);
        free(b);
        free(c);
        place_result_free(&res);
        if (test_failed > fails0 + 5)
            break;
    }
    printf("random: %d with a placement, %d without\n", accepted, refused);
    CHECK(accepted > 500 && refused > 200, "mix: %d accepted, %d refused", accepted, refused);
}

/* Large clusters: the candidate budget bounds the work and the smallest fitting size is
 * still found. */
static void test_large(void)
{
    static struct req q;
    req_init(&q);
    q.r.model.n_layers = 80;
    q.r.model.layer_bytes = 500 * MiB; /* 40 GiB: needs 3 nodes of 16 GiB */
    for (int i = 0; i < 64; i++) {
        char id[16];
        snprintf(id, sizeof id, "node%02d", i);
        add_node(&q, id, 16 * GiB + (uint64_t)i * MiB);
    }
    full_mesh(&q, 200);
    struct place_result res;
    clock_t t0 = clock();
    if (run_place(&q, &res))
        return;
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("64 nodes, full mesh: %zu candidates in %.3f s\n", res.n_cands, secs);
    CHECK(res.n_cands <= PLACE_DEFAULT_CANDIDATES, "%zu candidates", res.n_cands);
    CHECK(res.truncated, "not truncated");
    const struct place_candidate *b = best(&res);
    CHECK(b && b->n_nodes == 3, "best %u nodes", b ? b->n_nodes : 0);
    if (b && b->n_nodes == 3) /* the three with most memory */
        CHECK(strcmp(b->shares[0].id, "node63") == 0, "rank 0 %s", b->shares[0].id);
    place_result_free(&res);

    /* 256 nodes on a ring (sparse links), min 8 nodes: bounded, deterministic. */
    req_init(&q);
    q.r.model.n_layers = 64;
    q.r.min_nodes = 8;
    for (int i = 0; i < 256; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%03d", i);
        add_node(&q, id, 8 * GiB);
    }
    for (int i = 0; i < 256; i++)
        add_link(&q, q.ids[i], q.ids[(i + 1) % 256], 100);
    q.r.max_candidates = 64;
    t0 = clock();
    if (run_place(&q, &res))
        return;
    secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("256 nodes, ring: %zu candidates in %.3f s\n", res.n_cands, secs);
    CHECK(res.n_cands <= 64, "%zu candidates", res.n_cands);
    /* Equal memory: the first set by id is r000..r007, consecutive on the ring. */
    b = best(&res);
    CHECK(b && b->n_nodes == 8 && strcmp(b->shares[0].id, "r000") == 0, "ring best %s",
          b ? b->shares[0].id : "none");
    char *a = dump(&res);
    place_result_free(&res);
    run_place(&q, &res);
    char *b2 = dump(&res);
    CHECK(a && b2 && strcmp(a, b2) == 0, "large run differs");
    free(a);
    free(b2);
    place_result_free(&res);

    /* 256 nodes, full mesh, big sets: each order search stays bounded. */
    req_init(&q);
    q.r.model.n_layers = 512;
    q.r.model.layer_bytes = 64 * MiB;
    q.r.min_nodes = 200;
    for (int i = 0; i < 256; i++) {
        char id[16];
        snprintf(id, sizeof id, "m%03d", i);
        add_node(&q, id, 8 * GiB);
    }
    full_mesh(&q, 100); /* 32640 links */
    q.r.max_candidates = 16;
    t0 = clock();
    if (run_place(&q, &res))
        return;
    secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("256 nodes, mesh, sizes 200..256: %zu candidates in %.3f s\n", res.n_cands, secs);
    b = best(&res);
    CHECK(b && b->n_nodes == 200, "best %u nodes", b ? b->n_nodes : 0);
    place_result_free(&res);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_one_node_fits);
    RUN(test_two_nodes_needed);
    RUN(test_three_unequal);
    RUN(test_tied_head);
    RUN(test_draft_rank0);
    RUN(test_refusal_reason);
    RUN(test_min_nodes);
    RUN(test_tensor);
    RUN(test_disconnected);
    RUN(test_shift);
    RUN(test_per_layer_bytes);
    RUN(test_invalid);
    RUN(test_json);
    RUN(test_random);
    RUN(test_large);
    return test_main_end();
}
