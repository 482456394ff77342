/* The placement speed model (ctl/estimate.h) as a table: one stream's decode of Q4_0
 * llama shapes on W = 1, 2, 4, 8 machines, pipeline against tensor parallelism, over
 * links of 1, 10 and 40 GbE. The machines read memory at --bandwidth GB/s (default 30: what
 * `cairn bench` measures on this project's 2-vCPU VMs); the links' round trips and
 * throughputs are typical figures for TCP over those Ethernets, not measurements.
 *
 *   cmake --build build --target bench_placement_model && ./build/bench_placement_model [GB/s]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/estimate.h"

struct shape {
    const char *name;
    int layers, embd, ff, heads, kv_heads, head_dim, vocab;
};

struct link_kind {
    const char *name;
    int64_t rtt_us, bytes_per_s;
};

#define Q4_0_BYTES_PER_WEIGHT (18.0 / 32.0)
#define MAX_W 8

static uint64_t layer_bytes[128];

static struct catalog_card card_of(const struct shape *s)
{
    struct catalog_card c = {0};
    double q = (double)s->heads * s->head_dim, kv = (double)s->kv_heads * s->head_dim;
    double weights = s->embd * (q + 2 * kv) + q * s->embd + 3.0 * s->embd * s->ff;
    c.n_layers = s->layers;
    c.n_embd = s->embd;
    c.n_ff = s->ff;
    c.n_head = s->heads;
    c.n_head_kv = s->kv_heads;
    c.head_dim = s->head_dim;
    c.n_vocab = s->vocab;
    for (int l = 0; l < s->layers; l++)
        layer_bytes[l] = (uint64_t)(weights * Q4_0_BYTES_PER_WEIGHT);
    c.layer_bytes = layer_bytes;
    c.embd_bytes = (uint64_t)((double)s->vocab * s->embd * Q4_0_BYTES_PER_WEIGHT);
    c.head_bytes = c.embd_bytes;
    c.weight_bytes = c.active_bytes = layer_bytes[0] * (uint64_t)s->layers + c.head_bytes;
    return c;
}

/* W machines "n0".."n{W-1}", every pair linked by lk. */
static struct cluster_state *cluster_of(int W, double bw, const struct link_kind *lk)
{
    struct cluster_state *st = cluster_state_create();
    for (int i = 0; i < W && st; i++) {
        struct cluster_node n = {0};
        snprintf(n.id, sizeof n.id, "n%d", i);
        n.info.memory_bandwidth = (int64_t)bw;
        cluster_state_put_node(st, &n);
        for (int j = 0; j < W; j++) {
            if (i == j)
                continue;
            struct cluster_edge e = {.rtt_us = lk->rtt_us, .throughput = lk->bytes_per_s};
            snprintf(e.from, sizeof e.from, "n%d", i);
            snprintf(e.to, sizeof e.to, "n%d", j);
            cluster_state_put_edge(st, &e);
        }
    }
    return st;
}

/* Tokens/s of one stream over W machines with sharding sh (a pipeline's layers split
 * evenly). */
static double tokens_per_s(const struct catalog_card *c, const struct cluster_state *st, int W, enum place_sharding sh)
{
    static char ids[MAX_W][8];
    struct place_share shares[MAX_W];
    for (int r = 0; r < W; r++) {
        snprintf(ids[r], sizeof ids[r], "n%d", r);
        shares[r] = (struct place_share){.node = (size_t)r, .id = ids[r], .rank = (uint32_t)r};
        shares[r].layer_begin = sh == PLACE_TENSOR ? 0 : (uint32_t)(c->n_layers * r / W);
        shares[r].layer_end = sh == PLACE_TENSOR ? (uint32_t)c->n_layers : (uint32_t)(c->n_layers * (r + 1) / W);
    }
    struct place_candidate cd = {.n_nodes = (uint32_t)W, .shares = shares, .accepted = 1, .executable = 1};
    struct estimate e;
    estimate_candidate(c, st, sh, &cd, &e);
    return e.known ? e.tokens_per_s : 0;
}

int main(int argc, char **argv)
{
    double bw = (argc > 1 ? atof(argv[1]) : 30.0) * 1e9;
    if (bw <= 0) {
        fprintf(stderr, "usage: bench_placement_model [GB/s]\n");
        return 2;
    }
    static const struct shape shapes[] = {
        {"llama-1b", 16, 2048, 8192, 32, 8, 64, 128256},
        {"llama-8b", 32, 4096, 14336, 32, 8, 128, 128256},
        {"llama-70b", 80, 8192, 28672, 64, 8, 128, 128256},
    };
    static const struct link_kind links[] = {
        {"1 GbE", 200, 117000000},
        {"10 GbE", 50, 1170000000},
        {"40 GbE", 25, 4700000000},
    };
    printf("one stream's decode, tokens/s, Q4_0, each machine reading %.0f GB/s (ctl/estimate.h)\n\n", bw / 1e9);
    printf("| model | link | 1 machine | pipeline W=2 | tensor W=2 | pipeline W=4 | tensor W=4 | pipeline W=8 | "
           "tensor W=8 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t m = 0; m < sizeof shapes / sizeof shapes[0]; m++) {
        struct catalog_card c = card_of(&shapes[m]);
        for (size_t l = 0; l < sizeof links / sizeof links[0]; l++) {
            printf("| %s | %s (%lld us, %.2f GB/s) |", shapes[m].name, links[l].name, (long long)links[l].rtt_us,
                   links[l].bytes_per_s / 1e9);
            struct cluster_state *one = cluster_of(1, bw, &links[l]);
            printf(" %.1f |", tokens_per_s(&c, one, 1, PLACE_PIPELINE));
            cluster_state_release(one);
            for (int W = 2; W <= MAX_W; W *= 2) {
                struct cluster_state *st = cluster_of(W, bw, &links[l]);
                printf(" %.1f | %.1f |", tokens_per_s(&c, st, W, PLACE_PIPELINE),
                       tokens_per_s(&c, st, W, PLACE_TENSOR));
                cluster_state_release(st);
            }
            printf("\n");
        }
    }
    return 0;
}
