/* Placement's speed estimates (ctl/estimate.h) against the same model worked by hand
 * from the state's figures: a pipeline's ranks add up and each ring hop costs half a
 * round trip plus its bytes; a tensor candidate's ranks share the reading and pay 4
 * all-gathers per layer and the logits' gather. Fast links favour tensor parallelism,
 * slow ones the pipeline; a node without a bandwidth or a link without figures leaves
 * the estimate unknown, saying which. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/estimate.h"
#include "testutil.h"

#define L 16
#define EMBD 2048
#define FF 8192
#define VOCAB 128256
#define LAYER_BYTES 30000000ull
#define HEAD_BYTES 140000000ull

static uint64_t layer_bytes[L];

static struct catalog_card card_of(void)
{
    struct catalog_card c = {0};
    c.n_layers = L;
    c.n_embd = EMBD;
    c.n_ff = FF;
    c.n_head = 32;
    c.n_head_kv = 8;
    c.head_dim = 64;
    c.n_vocab = VOCAB;
    for (int l = 0; l < L; l++)
        layer_bytes[l] = LAYER_BYTES;
    c.layer_bytes = layer_bytes;
    c.embd_bytes = HEAD_BYTES;
    c.head_bytes = HEAD_BYTES;
    c.tied_output = true;
    c.weight_bytes = c.active_bytes = LAYER_BYTES * L + HEAD_BYTES;
    return c;
}

/* A state of nodes "a" and "b" reading at bw bytes/s (0: not measured), linked both ways
 * with rtt_us and throughput (no edge when rtt_us < 0). */
static struct cluster_state *state_of(int64_t bw_a, int64_t bw_b, int64_t rtt_us, int64_t thr)
{
    struct cluster_state *s = cluster_state_create();
    CHECK(s != NULL, "state");
    const char *ids[2] = {"a", "b"};
    int64_t bw[2] = {bw_a, bw_b};
    for (int i = 0; i < 2; i++) {
        struct cluster_node n = {0};
        snprintf(n.id, sizeof n.id, "%s", ids[i]);
        n.info.memory_bandwidth = bw[i];
        CHECK(cluster_state_put_node(s, &n) == 0, "put node");
    }
    if (rtt_us >= 0)
        for (int i = 0; i < 2; i++) {
            struct cluster_edge e = {.rtt_us = rtt_us, .throughput = thr};
            snprintf(e.from, sizeof e.from, "%s", ids[i]);
            snprintf(e.to, sizeof e.to, "%s", ids[1 - i]);
            CHECK(cluster_state_put_edge(s, &e) == 0, "put edge");
        }
    return s;
}

static struct place_share shares[2];

/* A candidate over "a" (and "b" when two): the pipeline's ranks split the layers at 9. */
static struct place_candidate cand_of(uint32_t n, enum place_sharding sh)
{
    const char *ids[2] = {"a", "b"};
    for (uint32_t r = 0; r < 2; r++) {
        shares[r] = (struct place_share){.node = r, .id = ids[r], .rank = r};
        shares[r].layer_begin = sh == PLACE_TENSOR || n == 1 ? 0 : r == 0 ? 0 : 9;
        shares[r].layer_end = sh == PLACE_TENSOR || n == 1 ? L : r == 0 ? 9 : L;
    }
    return (struct place_candidate){.n_nodes = n, .shares = shares, .accepted = 1};
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-12; }

static void test_by_hand(void)
{
    struct catalog_card c = card_of();
    const double bw = 20e9, rtt = 100, thr = 1e9;
    struct cluster_state *s = state_of((int64_t)bw, (int64_t)bw, (int64_t)rtt, (int64_t)thr);
    double embd_row = (double)HEAD_BYTES / VOCAB;
    struct estimate e;

    /* one node: every byte on one node, nothing on a link */
    struct place_candidate one = cand_of(1, PLACE_PIPELINE);
    estimate_candidate(&c, s, PLACE_PIPELINE, &one, &e);
    double t1 = (LAYER_BYTES * L + HEAD_BYTES + embd_row) / bw;
    CHECK(e.known && near(e.compute_ms, t1 * 1e3) && e.link_ms == 0 && e.exchanges == 0, "one node: %s %f %f",
          e.why, e.compute_ms, t1 * 1e3);
    CHECK(near(e.tokens_per_s, 1 / t1), "one node: %f tok/s", e.tokens_per_s);

    /* pipeline over two: the same reading in turn, two hops (activations there, a token back) */
    struct place_candidate pipe = cand_of(2, PLACE_PIPELINE);
    estimate_candidate(&c, s, PLACE_PIPELINE, &pipe, &e);
    double hops = 2 * rtt / 2e6 + (EMBD * 4.0 + 16) / thr;
    CHECK(e.known && near(e.compute_ms, t1 * 1e3) && near(e.link_ms, hops * 1e3) && e.exchanges == 2,
          "pipeline: %f %f (%f)", e.compute_ms, e.link_ms, hops * 1e3);

    /* tensor over two: half the reading each; 4 gathers per layer of one hop each and the logits' */
    struct place_candidate tp = cand_of(2, PLACE_TENSOR);
    estimate_candidate(&c, s, PLACE_TENSOR, &tp, &e);
    double tc = ((LAYER_BYTES * L + HEAD_BYTES) / 2.0 + embd_row) / bw;
    double per_layer = 4 * rtt / 2e6 + (32 * 64 + EMBD + FF + EMBD) * 4.0 / 2 / thr;
    double tl = L * per_layer + rtt / 2e6 + VOCAB * 4.0 / 2 / thr;
    CHECK(e.known && near(e.compute_ms, tc * 1e3) && near(e.link_ms, tl * 1e3) && e.exchanges == 4 * L + 1,
          "tensor: %f %f (%f %f)", e.compute_ms, e.link_ms, tc * 1e3, tl * 1e3);
    double tensor_fast = e.tokens_per_s;
    estimate_candidate(&c, s, PLACE_PIPELINE, &pipe, &e);
    CHECK(tensor_fast > 1.5 * e.tokens_per_s, "a 100 us link: tensor %f against pipeline %f tok/s", tensor_fast,
          e.tokens_per_s);
    cluster_state_release(s);

    /* a 2 ms link: 64 gathers of 1 ms each outweigh half the reading */
    s = state_of((int64_t)bw, (int64_t)bw, 2000, (int64_t)thr);
    estimate_candidate(&c, s, PLACE_TENSOR, &tp, &e);
    double tensor_slow = e.tokens_per_s;
    estimate_candidate(&c, s, PLACE_PIPELINE, &pipe, &e);
    CHECK(tensor_slow < e.tokens_per_s, "a 2 ms link: tensor %f against pipeline %f tok/s", tensor_slow,
          e.tokens_per_s);
    cluster_state_release(s);
}

static void test_unknown(void)
{
    struct catalog_card c = card_of();
    struct estimate e;
    struct place_candidate pipe = cand_of(2, PLACE_PIPELINE);
    struct cluster_state *s = state_of(20000000000, 0, 100, 1000000000);
    estimate_candidate(&c, s, PLACE_PIPELINE, &pipe, &e);
    CHECK(!e.known && strstr(e.why, "node b") && strstr(e.why, "bandwidth"), "no bandwidth: %s", e.why);
    json_t *j = estimate_to_json(&e);
    CHECK(j && json_is_string(json_object_get(j, "unknown")), "unknown in JSON");
    json_decref(j);
    cluster_state_release(s);
    s = state_of(20000000000, 20000000000, -1, 0);
    estimate_candidate(&c, s, PLACE_PIPELINE, &pipe, &e);
    CHECK(!e.known && strstr(e.why, "link a to b"), "no link: %s", e.why);
    struct place_candidate tp = cand_of(2, PLACE_TENSOR);
    estimate_candidate(&c, s, PLACE_TENSOR, &tp, &e);
    CHECK(!e.known && strstr(e.why, "link"), "no link, tensor: %s", e.why);
    cluster_state_release(s);
    /* a mixture of experts reads its active bytes */
    c.active_bytes = c.weight_bytes - LAYER_BYTES * L / 2;
    s = state_of(20000000000, 20000000000, 100, 1000000000);
    struct place_candidate one = cand_of(1, PLACE_PIPELINE);
    estimate_candidate(&c, s, PLACE_PIPELINE, &one, &e);
    double t = (LAYER_BYTES * L / 2.0 + HEAD_BYTES + (double)HEAD_BYTES / VOCAB) / 20e9;
    CHECK(e.known && near(e.compute_ms, t * 1e3), "experts: %f against %f ms", e.compute_ms, t * 1e3);
    j = estimate_to_json(&e);
    CHECK(j && json_real_value(json_object_get(j, "tokens_per_s")) > 0, "tokens_per_s in JSON");
    json_decref(j);
    cluster_state_release(s);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_by_hand);
    RUN(test_unknown);
    return test_main_end();
}
