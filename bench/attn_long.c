/* Attention alone at long context, on llama-1b's shape (32 query heads, 8 KV heads of 64
 * dims, 16 layers, blocks of 16 positions): what bench/longctx.sh cannot show without
 * minutes of prefill. Prints, in one run:
 *   decode: one token at depth D over all layers (each layer's K and V cold, as in a
 *     model), its K+V bytes per second and that against this machine's read bandwidth;
 *   prefill: a chunk of 512 tokens at positions [0, 512) and [D-512, D) of one layer, the
 *     time per token of each and their ratio, and the multiply-adds per second.
 *   usage: bench_attn_long [DEPTH 16384] [THREADS 2] [KV_TYPE f16] [VARIANT best]
 * KV_TYPE is one type for K and V, or K's and V's apart: q8_0,f16. Environment:
 * ATTN_PREFILL_ONLY=1 skips the decode; ATTN_DEEP_REPS=N times only the chunk at depth,
 * best of N (for profiles). */
#include "base/dtype.h"
#include "base/pool.h"
#include "engine/attn.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/vec.h"
#include "bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_LAYERS 16
#define CHUNK 512


struct bw { const uint64_t *p; long n; uint64_t sum[64]; };

static void bw_run(void *ctx, int ith, int nth)
{
    struct bw *b = ctx;
    long lo, hi;
    pool_split(b->n, 8, ith, nth, &lo, &hi);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long i = lo; i < hi; i += 4) {
        s0 += b->p[i];
        s1 += b->p[i + 1];
        s2 += b->p[i + 2];
        s3 += b->p[i + 3];
    }
    b->sum[ith] = s0 + s1 + s2 + s3;
}

int main(int argc, char **argv)
{
    int64_t depth = argc > 1 ? atoll(argv[1]) : 16384;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int type = DT_F16, type_v = DT_F16;
    if (argc > 3) {
        char tk[16];
        const char *comma = strchr(argv[3], ',');
        size_t len = comma ? (size_t)(comma - argv[3]) : strlen(argv[3]);
        snprintf(tk, sizeof tk, "%.*s", (int)(len < sizeof tk - 1 ? len : sizeof tk - 1), argv[3]);
        type = engine_kv_type(tk);
        type_v = comma ? engine_kv_type(comma + 1) : type;
    }
    const struct vec_ops *vec = argc > 4 && strcmp(argv[4], "best") ? vec_ops_variant(argv[4]) : vec_ops_best();
    if (depth < CHUNK || threads < 1 || type < 0 || type_v < 0 || !vec) {
        fprintf(stderr, "usage: bench_attn_long [DEPTH >= 512] [THREADS] [f16|q8_0|q4_0|f32[,V type]] [ref|avx2|avx512|neon]\n");
        return 2;
    }
    struct attn_shape sh = {.n_head = 32, .n_head_kv = 8, .head_dim = 64};
    int64_t kv_dim = 512, q_dim = 2048;
    int bt = 16;
    struct kv_config kc = {.n_layers = N_LAYERS, .kv_dim = kv_dim, .block_tokens = bt,
                           .n_blocks = (depth + bt - 1) / bt, .max_seqs = 1, .type_k = type, .type_v = type_v};
    char err[256];
    struct kv_cache *kv;
    struct attn *a;
    struct pool *pool;
    if (kv_create(&kv, &kc, err, sizeof err) || attn_create(&a, &sh, threads, CHUNK, depth) ||
        pool_create(&pool, threads) || kv_prepare(kv, 0, 0, depth)) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    uint64_t seed = 42;
    float *k = malloc((size_t)kv_dim * sizeof *k), *v = malloc((size_t)kv_dim * sizeof *v);
    float *q = malloc((size_t)CHUNK * q_dim * sizeof *q), *out = malloc((size_t)CHUNK * q_dim * sizeof *out);
    for (int64_t p = 0; p < depth; p++) {
        for (int64_t i = 0; i < kv_dim; i++) {
            k[i] = bench_rnd_lcg(&seed) * 3.0f;
            v[i] = bench_rnd_lcg(&seed);
        }
        attn_kv_write(kv, vec_ops_best(), 0, kv_slot(kv, 0, p), sh.head_dim, k, v);
    }
    size_t layer_k = (size_t)((char *)kv_k(kv, 0, kc.n_blocks * bt - 1) - (char *)kv_k(kv, 0, 0)) +
                     (size_t)((char *)kv_k(kv, 0, 1) - (char *)kv_k(kv, 0, 0));
    size_t layer_v = (size_t)((char *)kv_v(kv, 0, kc.n_blocks * bt - 1) - (char *)kv_v(kv, 0, 0)) +
                     (size_t)((char *)kv_v(kv, 0, 1) - (char *)kv_v(kv, 0, 0));
    for (int l = 1; l < N_LAYERS; l++) {
        memcpy(kv_k(kv, l, 0), kv_k(kv, 0, 0), layer_k);
        memcpy(kv_v(kv, l, 0), kv_v(kv, 0, 0), layer_v);
    }
    for (int64_t i = 0; i < CHUNK * q_dim; i++)
        q[i] = bench_rnd_lcg(&seed);
    int32_t seq[CHUNK];
    int64_t pos[CHUNK];
    memset(seq, 0, sizeof seq);

    /* read bandwidth of this machine now: 1 GiB summed by the pool */
    size_t bw_bytes = (size_t)1 << 30;
    uint64_t *buf = malloc(bw_bytes);
    memset(buf, 1, bw_bytes);
    struct bw b = {.p = buf, .n = (long)(bw_bytes / 8)};
    double bw_best = 0, bw_cpu = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = bench_wall_s(), c0 = bench_process_cpu_s();
        pool_run(pool, bw_run, &b);
        double bw = (double)bw_bytes / (bench_wall_s() - t0), bwc = (double)bw_bytes / (bench_process_cpu_s() - c0);
        bw_best = bw > bw_best ? bw : bw_best;
        bw_cpu = bwc > bw_cpu ? bwc : bw_cpu;
    }
    free(buf);

    /* decode at depth: the last position, every layer in turn */
    pos[0] = depth - 1;
    double dec_best = 1e30, dec_cpu = 1e30;
    int dec_reps = getenv("ATTN_DECODE_ONLY") ? 50 : 5;
    for (int r = 0; r < dec_reps && !getenv("ATTN_PREFILL_ONLY") && !getenv("ATTN_HOT_ONLY"); r++) {
        double t0 = bench_wall_s(), c0 = bench_process_cpu_s();
        for (int l = 0; l < N_LAYERS; l++)
            attn_forward(a, pool, vec, kv, l, 1, seq, pos, q, out);
        double t = bench_wall_s() - t0, tc = bench_process_cpu_s() - c0;
        dec_best = t < dec_best ? t : dec_best;
        dec_cpu = tc < dec_cpu ? tc : dec_cpu;
    }
    double bytes = (double)(layer_k + layer_v) * N_LAYERS * (double)depth / (double)(kc.n_blocks * bt);
    printf("decode at depth %lld (%s KV, %d threads): %.3f ms per token's attention (16 layers), %.1f GB/s of K+V, "
           "read bandwidth %.1f GB/s: %.0f%% of the roofline\n",
           (long long)depth, argv[3] ? argv[3] : "f16", threads, dec_best * 1e3, bytes / dec_best / 1e9, bw_best / 1e9,
           100.0 * bytes / dec_best / bw_best);
    /* per CPU-second: with one thread, what a loaded machine's other processes leave
     * alone (its memory stalls count, its time off the CPU does not) */
    printf("decode at depth %lld, cold: %.1f GB/s of K+V per CPU-second, read bandwidth %.1f GB/s per CPU-second: "
           "%.0f%%\n", (long long)depth, bytes / dec_cpu / 1e9, bw_cpu / 1e9, 100.0 * bytes / dec_cpu / bw_cpu);

    /* the same with the K and V in cache (one layer of depth 512 again and again): how
     * fast the arithmetic alone goes, per CPU-second */
    if (!getenv("ATTN_PREFILL_ONLY")) {
        pos[0] = 511;
        attn_forward(a, pool, vec, kv, 0, 1, seq, pos, q, out);
        double c0 = bench_process_cpu_s();
        int hot_reps = getenv("ATTN_HOT_ONLY") ? 20000 : 200;
        for (int r = 0; r < hot_reps; r++)
            attn_forward(a, pool, vec, kv, 0, 1, seq, pos, q, out);
        double tc = (bench_process_cpu_s() - c0) / hot_reps;
        printf("decode at depth 512, K and V in L2: %.1f GB/s of K+V per CPU-second\n",
               (double)(layer_k + layer_v) * 512.0 / (double)(kc.n_blocks * bt) / tc / 1e9);
    }
    /* prefill chunks: [0, 512) and [depth-512, depth) of layer 0 */
    double per_tok[2] = {1, 1};
    for (int c = getenv("ATTN_DEEP_REPS") ? 1 : 0; c < 2 && !getenv("ATTN_DECODE_ONLY") && !getenv("ATTN_HOT_ONLY"); c++) {
        int64_t p0 = c == 0 ? 0 : depth - CHUNK;
        for (int i = 0; i < CHUNK; i++)
            pos[i] = p0 + i;
        double best = 1e30, best_cpu = 1e30;
        int reps = c == 0 ? 5 : getenv("ATTN_DEEP_REPS") ? atoi(getenv("ATTN_DEEP_REPS")) : 2;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_wall_s(), c0 = bench_process_cpu_s();
            attn_forward(a, pool, vec, kv, 0, CHUNK, seq, pos, q, out);
            double t = bench_wall_s() - t0, tc = bench_process_cpu_s() - c0;
            best = t < best ? t : best;
            best_cpu = tc < best_cpu ? tc : best_cpu;
        }
        per_tok[c] = best / CHUNK;
        double fma = 0; /* multiply-adds of Q.K and P.V, over the causal positions */
        for (int i = 0; i < CHUNK; i++)
            fma += (double)(pos[i] + 1) * 2.0 * sh.head_dim * sh.n_head;
        printf("prefill chunk [%lld, %lld): %.1f us per token per layer, %.1f G multiply-adds/s, %.1f G per CPU-second\n",
               (long long)p0, (long long)(p0 + CHUNK), per_tok[c] * 1e6, fma / best / 1e9, fma / best_cpu / 1e9);
    }
    printf("prefill attention per token at [%lld-512, %lld) / at [0, 512): %.1fx\n", (long long)depth,
           (long long)depth, per_tok[1] / per_tok[0]);
    free(k);
    free(v);
    free(q);
    free(out);
    attn_release(a);
    kv_release(kv);
    pool_release(pool);
    return 0;
}
