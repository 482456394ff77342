/* Where a prefill tile's time goes, each step alone with its data in L1/L2, on llama-1b's
 * shape (256 query rows of one KV head's group, a tile of 256 keys, head dim 64, F16 K and
 * V in blocks of 16 positions), per CPU-second of this thread: a loop of independent
 * 512-bit fused multiply-adds (the peak), attn_qk and attn_pv over the tile's floats,
 * softmax_tile of every row, the F16 conversion of K and V, the clearing of o_t and the
 * merge of the partial into the state, then all of them in turn as tile_partial does; and,
 * as alternatives, P.V and Q.K (attn_qk_paged) reading the F16 pieces without the conversion,
 * the clearing, P.V and merge as one (attn_pv_merge), and the softmax of every row in one call
 * (softmax_rows).
 * Prints each step's microseconds a tile and its share, and the multiply-adds a second of
 * the whole tile against the peak.
 *   usage: bench_attn_tile [VARIANT best] [REPS 200] */
#include "base/dtype.h"
#include "engine/attn.h"
#include "engine/vec.h"
#include "kern/kern.h"
#include "bench_util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { HD = 64, T = 256, R = 256, BT = 16 };

struct tile {
    float q[R * HD], s[R * T], o[R * HD], ot[R * HD], m[R], l[R], mt[R], lt[R], fx[2 * R];
    float kf[HD * T], vf[T * HD];
    uint16_t kh[T / BT][HD * BT], vh[T / BT][BT * HD]; /* the cache's pieces */
    const void *vrows[T], *vhrows[T], *kblk[T / BT];
    int32_t nv[R];
};

/* G multiply-adds per CPU-second of a loop of 12 independent 512-bit FMA chains (0 where
 * there is no AVX-512). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static double fma_peak(void)
{
    if (!__builtin_cpu_supports("avx512f"))
        return 0;
    __m512 a[12], x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    long n = 20000000;
    double c0 = bench_thread_cpu_s();
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], x, y);
    double t = bench_thread_cpu_s() - c0;
    float sink = 0;
    for (int i = 0; i < 12; i++)
        sink += _mm512_reduce_add_ps(a[i]);
    if (sink == 12345.0f)
        printf("%f\n", sink);
    return (double)n * 12 * 16 / t / 1e9;
}
#else
static double fma_peak(void) { return 0; }
#endif

static void step_qk(const struct vec_ops *vec, struct tile *t)
{
    vec->attn_qk(t->q, HD, R, t->kf, NULL, T, T, HD, DT_F32, t->s, T);
}

static void step_softmax(const struct vec_ops *vec, struct tile *t)
{
    for (int r = 0; r < R; r++)
        t->mt[r] = vec->softmax_tile(t->s + (size_t)r * T, T, &t->lt[r]);
}

/* the same with softmax_rows (the variant's softmax_tile a row at a time otherwise) */
static void step_softmax_rows(const struct vec_ops *vec, struct tile *t)
{
    if (!vec->softmax_rows) {
        step_softmax(vec, t);
        return;
    }
    vec->softmax_rows(t->s, T, R, t->nv, t->mt, t->lt);
}

static void step_clear(const struct vec_ops *vec, struct tile *t)
{
    (void)vec;
    memset(t->ot, 0, sizeof t->ot);
}

static void step_pv(const struct vec_ops *vec, struct tile *t)
{
    vec->attn_pv(t->ot, HD, R, t->s, T, t->nv, t->vrows, HD, DT_F32, NULL);
}

/* P.V and Q.K on the cache's F16 pieces, converting as they load (no conversion step) */
static void step_pv_f16(const struct vec_ops *vec, struct tile *t)
{
    vec->attn_pv(t->ot, HD, R, t->s, T, t->nv, t->vhrows, HD, DT_F16, NULL);
}

static void step_qk_paged_f16(const struct vec_ops *vec, struct tile *t)
{
    vec->attn_qk_paged(t->q, HD, R, t->kblk, NULL, BT, T, HD, DT_F16, t->s, T, NULL);
}

static void step_convert(const struct vec_ops *vec, struct tile *t)
{
    for (int b = 0; b < T / BT; b++) {
        vec->f16_to_f32(t->kh[b], BT, t->kf + b * BT, T, HD, BT);
        vec->f16_to_f32(t->vh[b], 0, t->vf + (size_t)b * BT * HD, 0, 1, (int64_t)BT * HD);
        for (int c = 0; c < BT; c++)
            t->vrows[b * BT + c] = t->vf + (size_t)(b * BT + c) * HD;
    }
}

/* as attn.c's merge_rows */
static void step_merge(const struct vec_ops *vec, struct tile *t)
{
    int k = 0;
    for (int r = 0; r < R; r++) {
        float mx = t->m[r] > t->mt[r] ? t->m[r] : t->mt[r];
        t->fx[k++] = t->m[r] - mx;
        t->fx[k++] = t->mt[r] - mx;
        t->m[r] = mx;
    }
    vec->exp_sub(t->fx, 0.0f, k);
    k = 0;
    for (int r = 0; r < R; r++) {
        float *o = t->o + (size_t)r * HD;
        const float *ot = t->ot + (size_t)r * HD;
        float fa = t->fx[k++], fb = t->fx[k++];
        t->l[r] = t->l[r] * fa + t->lt[r] * fb;
        for (int i = 0; i < HD; i++)
            o[i] = o[i] * fa + ot[i] * fb;
    }
}

/* clear o_t, P.V and the merge as one step: the merge's factors, then attn_pv_merge into o
 * (what a prefill's whole tiles after the first do; the variant's P.V otherwise) */
static void step_pv_merge(const struct vec_ops *vec, struct tile *t)
{
    if (!vec->attn_pv_merge) {
        step_clear(vec, t);
        step_pv(vec, t);
        step_merge(vec, t);
        return;
    }
    int k = 0;
    for (int r = 0; r < R; r++) {
        float mx = t->m[r] > t->mt[r] ? t->m[r] : t->mt[r];
        t->fx[k++] = t->m[r] - mx;
        t->fx[k++] = t->mt[r] - mx;
        t->m[r] = mx;
    }
    vec->exp_sub(t->fx, 0.0f, k);
    for (int r = 0; r < R; r++)
        t->l[r] = t->l[r] * t->fx[2 * r] + t->lt[r] * t->fx[2 * r + 1];
    vec->attn_pv_merge(t->o, HD, R, t->s, T, T, t->vrows, HD, DT_F32, t->fx);
}

typedef void (*step_fn)(const struct vec_ops *, struct tile *);

static void step_all(const struct vec_ops *vec, struct tile *t)
{
    step_convert(vec, t);
    step_qk(vec, t);
    step_softmax(vec, t);
    step_clear(vec, t);
    step_pv(vec, t);
    step_merge(vec, t);
}

/* CPU microseconds of one call, best of 5 rounds of reps calls */
static double time_step(step_fn f, const struct vec_ops *vec, struct tile *t, int reps)
{
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        double c0 = bench_thread_cpu_s();
        for (int i = 0; i < reps; i++)
            f(vec, t);
        double us = (bench_thread_cpu_s() - c0) / reps * 1e6;
        best = us < best ? us : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    const struct vec_ops *vec = argc > 1 && strcmp(argv[1], "best") ? vec_ops_variant(argv[1]) : vec_ops_best();
    int reps = argc > 2 ? atoi(argv[2]) : 200;
    struct tile *t = aligned_alloc(64, (sizeof(struct tile) + 63) / 64 * 64);
    if (!vec || reps < 1 || !t) {
        fprintf(stderr, "usage: bench_attn_tile [ref|avx2|avx512|neon] [REPS]\n");
        return 2;
    }
    uint64_t seed = 7;
    for (int i = 0; i < R * HD; i++) {
        t->q[i] = bench_rnd_lcg(&seed) * 0.125f;
        t->o[i] = 0;
    }
    for (int b = 0; b < T / BT; b++)
        for (int i = 0; i < HD * BT; i++) {
            t->kh[b][i] = kern_f32_to_f16(bench_rnd_lcg(&seed));
            t->vh[b][i] = kern_f32_to_f16(bench_rnd_lcg(&seed));
        }
    for (int r = 0; r < R; r++) {
        t->nv[r] = T;
        t->m[r] = -1.0f;
        t->l[r] = 1.0f;
    }
    step_convert(vec, t);
    for (int j = 0; j < T; j++)
        t->vhrows[j] = t->vh[j / BT] + (size_t)(j % BT) * HD;
    for (int b = 0; b < T / BT; b++)
        t->kblk[b] = t->kh[b];
    static const struct {
        const char *name;
        step_fn f;
        bool alt; /* another way to a step: not in the sum */
    } steps[] = {{"f16->f32 K and V", step_convert, false}, {"Q.K", step_qk, false},
                 {"softmax", step_softmax, false},          {"clear o_t", step_clear, false},
                 {"P.V", step_pv, false},                   {"merge", step_merge, false},
                 {"P.V on F16 V", step_pv_f16, true},       {"Q.K on F16 K", step_qk_paged_f16, true},
                 {"clear+P.V+merge", step_pv_merge, true},  /* attn_pv_merge */
                 {"softmax, rows", step_softmax_rows, true},
                 {"whole tile", step_all, false}};
    double peak = fma_peak();
    double macs = 2.0 * R * T * HD, sum = 0;
    printf("FMA peak: %.1f G multiply-adds per CPU-second\n", peak);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        step_all(vec, t); /* the scores the step expects */
        double us = time_step(steps[i].f, vec, t, reps);
        bool whole = steps[i].f == step_all;
        sum += whole || steps[i].alt ? 0 : us;
        double at_peak = macs / (peak * 1e3); /* us of the tile's products at the peak */
        printf("%-18s %8.2f us a tile (%5.1f%% of the products at the peak)%s", steps[i].name, us,
               100.0 * us / at_peak, whole ? "" : "\n");
        if (whole)
            printf(", steps summed %.2f us; the tile at %.1f%% of the peak\n", sum, 100.0 * at_peak / us);
    }
    free(t);
    return 0;
}
