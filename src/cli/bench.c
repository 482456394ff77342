/* cairn bench: prefill and decode speed, like llama-bench, plus the decode roofline
 * (bytes read per token against memory bandwidth measured in the same run) and the
 * cost of one forward over B = 1..16 tokens relative to B = 1. */
#include "base/clock.h"
#include "base/cpu.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/pool.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "model/model.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bw_job {
    const uint64_t *buf;
    size_t n;
    uint64_t sums[64];
};

/* Sums a range with the widest loads this CPU has and software prefetch, as the kernels
 * read weights, so the figure is the ceiling they can reach (plain scalar loads
 * understate it by a third on this machine). */
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, long n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(p + i) + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 2112, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 2176, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 2240, _MM_HINT_T0);
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, long n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(p + i) + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 2112, _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t sum_scalar(const uint64_t *p, long n)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long i = 0; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

static void bw_read(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    long lo, hi;
    pool_split((long)j->n, 1024, ith, nth, &lo, &hi);
    const struct cpu_features *f = cpu_features();
    const uint64_t *p = j->buf + lo;
    uint64_t s = f->avx512f ? sum_avx512(p, hi - lo) : f->avx2 ? sum_avx2(p, hi - lo) : sum_scalar(p, hi - lo);
    j->sums[ith % 64] = s;
}

/* Read bandwidth in bytes/s over a block of `bytes` (>= 1 GiB), best of reps. */
static double measure_bandwidth(struct pool *p, size_t bytes, int reps)
{
    uint64_t *buf = malloc(bytes);
    if (!buf)
        return 0;
    size_t n = bytes / sizeof *buf;
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    struct bw_job j = {.buf = buf, .n = n};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_sec();
        pool_run(p, bw_read, &j);
        double bw = (double)bytes / (clock_sec() - t0);
        best = bw > best ? bw : best;
    }
    free(buf);
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct bench {
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    float *logits;
    int32_t *tokens, *seqs;
    int64_t *pos;
    uint8_t *want;
    char err[512];
};

static int run(struct bench *bn, int n)
{
    struct batch b = {.n = n, .token = bn->tokens, .seq = bn->seqs, .pos = bn->pos, .logits = bn->want};
    return engine_forward(bn->e, bn->kv, &b, bn->logits, bn->err, sizeof bn->err);
}

int cli_bench(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "bench", false};
    const char *model_path = NULL, *v;
    int64_t n_prompt = 512, n_gen = 128, threads = 2, reps = 3, max_b = 16, bw_mib = 1024;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "-m|--model", &v)) model_path = v;
        else if (args_opt(&a, "-p|--n-prompt", &v)) n_prompt = args_int(&a, "-p", v, 0, 1 << 16);
        else if (args_opt(&a, "-n|--n-gen", &v)) n_gen = args_int(&a, "-n", v, 0, 1 << 16);
        else if (args_opt(&a, "-t|--threads", &v)) threads = args_int(&a, "-t", v, 1, 512);
        else if (args_opt(&a, "-r|--repetitions", &v)) reps = args_int(&a, "-r", v, 1, 100);
        else if (args_opt(&a, "--batch-curve", &v)) max_b = args_int(&a, "--batch-curve", v, 0, 64);
        else if (args_opt(&a, "--bandwidth-mib", &v)) bw_mib = args_int(&a, "--bandwidth-mib", v, 1, 1 << 20);
        else if (args_opt(&a, "-h|--help", NULL)) {
            fprintf(stderr, "usage: cairn bench -m MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3] [--batch-curve 16]\n");
            return 0;
        } else {
            fprintf(stderr, "cairn bench: unknown option '%s'\n", argv[a.i]);
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!model_path) {
        fprintf(stderr, "cairn bench: -m MODEL is required\n");
        return 2;
    }
    struct bench bn = {0};
    struct pool *bwp = NULL;
    int ret = 1;
    int64_t ctx = n_prompt + n_gen + 16;
    int max_batch = (int)(n_prompt > max_b ? n_prompt : max_b);
    if (max_batch < 1)
        max_batch = 1;
    if (model_load(&bn.m, model_path, NULL, bn.err, sizeof bn.err)) {
        fprintf(stderr, "cairn bench: %s: %s\n", model_path, bn.err);
        return 1;
    }
    int n_seqs = max_b > 1 ? (int)max_b : 1;
    struct engine_config ec = {.n_threads = (int)threads, .max_batch = max_batch, .max_ctx = ctx};
    struct kv_config kc = engine_kv_config(bn.m, ctx, n_seqs, 16);
    if (engine_create(&bn.e, bn.m, &ec, bn.err, sizeof bn.err) || kv_create(&bn.kv, &kc, bn.err, sizeof bn.err)) {
        fprintf(stderr, "cairn bench: %s\n", bn.err);
        goto out;
    }
    size_t nb = (size_t)max_batch;
    bn.logits = malloc(nb * (size_t)bn.m->hp.n_vocab * sizeof(float));
    bn.tokens = malloc(nb * sizeof *bn.tokens);
    bn.seqs = calloc(nb, sizeof *bn.seqs);
    bn.pos = malloc(nb * sizeof *bn.pos);
    bn.want = calloc(nb, 1);
    if (!bn.logits || !bn.tokens || !bn.seqs || !bn.pos || !bn.want) {
        fprintf(stderr, "cairn bench: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < nb; i++)
        bn.tokens[i] = (int32_t)((i * 7919 + 13) % (size_t)bn.m->hp.n_vocab);

    const struct model_hparams *hp = &bn.m->hp;
    char feats[256];
    cpu_features_string(cpu_features(), feats, sizeof feats);
    printf("model: %s (%s, %d layers, n_embd %d, vocab %d, %.1f MiB file)\n", model_path, hp->arch, hp->n_layers,
           hp->n_embd, hp->n_vocab, (double)bn.m->file_bytes / (1 << 20));
    printf("cpu: %s; kernels: %s; threads: %lld\n", feats, kern_path_name(kern_mat_path(bn.m->output)),
           (long long)threads);

    /* Bandwidth with the engine's own thread count, measured in this run. */
    if (pool_create(&bwp, (int)threads))
        goto out;
    /* Shared machines vary: the ceiling is the best of reads before and after decode. */
    double bw = measure_bandwidth(bwp, (size_t)bw_mib << 20, 10);
    printf("memory read bandwidth (%lld MiB block, %lld threads): %.2f GB/s\n", (long long)bw_mib, (long long)threads, bw / 1e9);

    double *t = malloc((size_t)reps * sizeof *t);
    if (!t)
        goto out;
    if (n_prompt > 0) {
        for (int r = 0; r < reps; r++) {
            kv_seq_clear(bn.kv, 0);
            for (int64_t i = 0; i < n_prompt; i++) {
                bn.pos[i] = i;
                bn.want[i] = i == n_prompt - 1;
            }
            double t0 = clock_sec();
            if (run(&bn, (int)n_prompt)) {
                fprintf(stderr, "cairn bench: %s\n", bn.err);
                free(t);
                goto out;
            }
            t[r] = clock_sec() - t0;
        }
        double med = median(t, (int)reps);
        printf("pp%lld: %.2f tok/s (median of %lld, %.3f s)\n", (long long)n_prompt, (double)n_prompt / med,
               (long long)reps, med);
    }
    /* Bytes one decode step reads: every weight of the slice once, plus one embedding row. */
    double bytes_per_tok = (double)bn.m->weight_bytes + (double)bn.m->tok_embd_row_bytes;
    if (n_gen > 0) {
        memset(bn.want, 0, nb);
        bn.want[0] = 1;
        for (int r = 0; r < reps; r++) {
            kv_seq_clear(bn.kv, 0);
            double t0 = clock_sec();
            for (int64_t i = 0; i < n_gen; i++) {
                bn.pos[0] = i;
                if (run(&bn, 1)) {
                    fprintf(stderr, "cairn bench: %s\n", bn.err);
                    free(t);
                    goto out;
                }
            }
            t[r] = clock_sec() - t0;
        }
        double med = median(t, (int)reps);
        double bw_after = measure_bandwidth(bwp, (size_t)bw_mib << 20, 10);
        if (bw_after > bw) {
            printf("memory read bandwidth after decode: %.2f GB/s (the higher figure is the ceiling)\n", bw_after / 1e9);
            bw = bw_after;
        }
        double tps = (double)n_gen / med, roof = bw / bytes_per_tok;
        printf("tg%lld: %.2f tok/s (median of %lld); reads %.1f MiB/token; roofline %.2f tok/s; %.1f%% of roofline\n",
               (long long)n_gen, tps, (long long)reps, bytes_per_tok / (1 << 20), roof, 100.0 * tps / roof);
    }
    if (max_b > 0) {
        /* B sequences each decode one token per forward; cost relative to B = 1. */
        const int steps = 8;
        double base = 0;
        printf("batch cost (one forward over B tokens of B sequences, relative to B = 1):\n");
        for (int B = 1; B <= max_b; B++) {
            for (int s = 0; s < n_seqs; s++)
                kv_seq_clear(bn.kv, s);
            for (int r = 0; r < reps; r++) {
                double t0 = clock_sec();
                for (int k = 0; k < steps; k++) {
                    for (int i = 0; i < B; i++) {
                        bn.seqs[i] = i;
                        bn.pos[i] = (int64_t)r * steps + k;
                        bn.want[i] = 1;
                    }
                    if (run(&bn, B)) {
                        fprintf(stderr, "cairn bench: %s\n", bn.err);
                        free(t);
                        goto out;
                    }
                }
                t[r] = (clock_sec() - t0) / steps;
            }
            double med = median(t, (int)reps);
            if (B == 1)
                base = med;
            printf("  B=%2d: %7.2f ms  x%.2f  (%.1f tok/s)\n", B, med * 1e3, med / base, B / med);
        }
        memset(bn.seqs, 0, nb * sizeof *bn.seqs);
    }
    free(t);
    pool_release(bwp);
    bwp = NULL;
    /* Resident memory against what the model and cache need (the bandwidth block is freed). */
    double mib = 1 << 20;
    printf("resident memory: %.1f MiB now (model file %.1f MiB, weights read %.1f MiB, KV %.1f MiB)\n",
           (double)mem_rss() / mib, (double)bn.m->file_bytes / mib, (double)bn.m->weight_bytes / mib,
           (double)kv_bytes_for(&kc) / mib);
    ret = 0;
out:
    pool_release(bwp);
    free(bn.logits);
    free(bn.tokens);
    free(bn.seqs);
    free(bn.pos);
    free(bn.want);
    kv_release(bn.kv);
    engine_release(bn.e);
    model_release(bn.m);
    return ret;
}
