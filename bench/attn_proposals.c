/* What two changes of prefill attention's numerical contract would give, measured, not
 * built into the engine (each changes bits): a shorter exp polynomial in the softmax
 * (degree 4 or 3 instead of vec.h VEC_SEXP's 5) and Q.K as BF16 pair products (VDPBF16PS:
 * 32 multiply-adds an instruction against an FMA's 16). Prints per CPU-second of this
 * thread, on a prefill tile (256 rows, 256 keys, head dim 64, in L1/L2): the engine's
 * softmax_tile and attn_qk against each, and the relative error of whole attention rows
 * (8192 keys, F16 K and V, float64 reference) of the engine's float path and of each
 * change. AVX-512 with BF16 only (Zen 4, Sapphire Rapids).
 *   usage: bench_attn_proposals [REPS 200] */
#include "base/dtype.h"
#include "engine/vec.h"
#include "kern/kern.h"
#include "bench_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

enum { HD = 64, T = 256, R = 256, NKEYS = 8192 };

#define ATTR __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx512dq,fma")))

/* degree-4 and degree-3 polynomials for exp(r) on [-ln2/2, ln2/2] with p(0) = 1 (near
 * minimax in relative error, Lawson's iteration: 2.83e-6 and 1.01e-4 at most) */
static const float D4[4] = {0x1.fffba8p-1f, 0x1.0003f4p-1f, 0x1.57ceb8p-3f, 0x1.5414d4p-5f};
static const float D3[3] = {0x1.000cd6p+0f, 0x1.021d62p-1f, 0x1.5249bap-3f};

/* VEC_SEXP with a polynomial of degree deg (5: vec.h's own) */
ATTR static inline __m512 sexp_deg(__m512 t, const int deg)
{
    t = _mm512_max_ps(_mm512_set1_ps(VEC_SEXP_LO), t);
    __m512 tr = _mm512_fmadd_ps(t, _mm512_set1_ps(VEC_EXP_LOG2E), _mm512_set1_ps(VEC_EXP_ROUND));
    __m512 n = _mm512_sub_ps(tr, _mm512_set1_ps(VEC_EXP_ROUND));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C1), t);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C2), r);
    __m512 p;
    if (deg == 5) {
        p = _mm512_fmadd_ps(_mm512_set1_ps(VEC_SEXP_S5), r, _mm512_set1_ps(VEC_SEXP_S4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S1));
    } else if (deg == 4) {
        p = _mm512_fmadd_ps(_mm512_set1_ps(D4[3]), r, _mm512_set1_ps(D4[2]));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(D4[1]));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(D4[0]));
    } else {
        p = _mm512_fmadd_ps(_mm512_set1_ps(D3[2]), r, _mm512_set1_ps(D3[1]));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(D3[0]));
    }
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(tr), 23));
    return _mm512_castsi512_ps(e);
}

/* softmax_tile's steps with sexp_deg (n a multiple of 64) */
ATTR static float softmax_deg(float *s, int64_t n, float *l, const int deg)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t k = 0; k < n; k += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + k));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + k + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(s + k + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(s + k + 48));
    }
    float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        __m512 e = sexp_deg(_mm512_sub_ps(_mm512_loadu_ps(s + k), vm), deg);
        _mm512_storeu_ps(s + k, e);
        acc = _mm512_add_ps(acc, e);
    }
    *l = _mm512_reduce_add_ps(acc);
    return m;
}

/* Q.K of 6 rows by 64 keys from j0 in BF16 pairs: q2[r][i] holds dims 2i, 2i+1 of row r,
 * k2[i][j] those of key j (i < HD/2) */
ATTR static inline void qk_bf16_rows(const uint32_t *q2, const uint32_t *k2, int j0, float *s)
{
    __m512 a[6][4];
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < HD / 2; i++) {
        __m512bh k[4];
        for (int c = 0; c < 4; c++)
            k[c] = (__m512bh)_mm512_loadu_si512(k2 + (size_t)i * T + j0 + 16 * c);
        for (int r = 0; r < 6; r++) {
            __m512bh qb = (__m512bh)_mm512_set1_epi32((int)q2[r * (HD / 2) + i]);
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm512_dpbf16_ps(a[r][c], qb, k[c]);
        }
    }
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(s + (size_t)r * T + j0 + 16 * c, a[r][c]);
}

ATTR static void qk_bf16(const uint32_t *q2, const uint32_t *k2, float *s)
{
    for (int j0 = 0; j0 < T; j0 += 64)
        for (int r = 0; r + 6 <= R; r += 6)
            qk_bf16_rows(q2 + (size_t)r * (HD / 2), k2, j0, s + (size_t)r * T);
}

/* the tile's F16 K (transposed, [d][T]) as BF16 pairs, rounded to nearest even */
ATTR static void k_to_bf16(const float *kf, uint32_t *k2)
{
    for (int i = 0; i < HD / 2; i++)
        for (int j = 0; j < T; j += 16) {
            __m512 lo = _mm512_loadu_ps(kf + (size_t)(2 * i) * T + j), hi = _mm512_loadu_ps(kf + (size_t)(2 * i + 1) * T + j);
            __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);           /* lanes: lo 0..15, hi 0..15 */
            __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                           5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            _mm512_storeu_si512(k2 + (size_t)i * T + j, _mm512_permutexvar_epi16(idx, ab));
        }
}

static uint16_t to_bf16(float x) /* round to nearest even (no NaN here) */
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- accuracy of a whole row: scores, softmax, P.V, /l ---- */

enum { PATH_FLOAT, PATH_DEG4, PATH_DEG3, PATH_BF16, N_PATHS };

ATTR static void row_attn(int path, const float *q, const float *k, const float *v, int n, float *out, float *s)
{
    for (int j = 0; j < n; j++) {
        float acc = 0;
        for (int d = 0; d < HD; d++) {
            float a = q[d], b = k[(size_t)j * HD + d];
            if (path == PATH_BF16) {
                a = from_bf16(to_bf16(a));
                b = from_bf16(to_bf16(b));
            }
            acc = fmaf(a, b, acc);
        }
        s[j] = acc;
    }
    float l;
    int deg = path == PATH_DEG4 ? 4 : path == PATH_DEG3 ? 3 : 5;
    softmax_deg(s, n, &l, deg);
    for (int d = 0; d < HD; d++) {
        float o = 0;
        for (int j = 0; j < n; j++)
            o = fmaf(s[j], v[(size_t)j * HD + d], o);
        out[d] = o / l;
    }
}

static void row_ref(const float *q, const float *k, const float *v, int n, double *out)
{
    double *s = malloc((size_t)n * sizeof *s), m = -INFINITY, l = 0;
    for (int j = 0; j < n; j++) {
        double acc = 0;
        for (int d = 0; d < HD; d++)
            acc += (double)q[d] * k[(size_t)j * HD + d];
        s[j] = acc;
        m = acc > m ? acc : m;
    }
    for (int j = 0; j < n; j++)
        l += s[j] = exp(s[j] - m);
    for (int d = 0; d < HD; d++) {
        double o = 0;
        for (int j = 0; j < n; j++)
            o += s[j] * v[(size_t)j * HD + d];
        out[d] = o / l;
    }
    free(s);
}

static void accuracy(double q_scale)
{
    uint64_t seed = 5;
    float *k = malloc((size_t)NKEYS * HD * sizeof *k), *v = malloc((size_t)NKEYS * HD * sizeof *v);
    float *s = malloc((size_t)NKEYS * sizeof *s), q[HD], out[HD];
    double ref[HD], worst[N_PATHS] = {0}, sum[N_PATHS] = {0};
    const int rows = 24;
    for (int row = 0; row < rows; row++) {
        for (int i = 0; i < NKEYS * HD; i++) { /* the cache's F16 values */
            k[i] = kern_f16_to_f32(kern_f32_to_f16(bench_rnd_lcg(&seed)));
            v[i] = kern_f16_to_f32(kern_f32_to_f16(bench_rnd_lcg(&seed)));
        }
        for (int d = 0; d < HD; d++)
            q[d] = (float)(bench_rnd_lcg(&seed) * q_scale);
        row_ref(q, k, v, NKEYS, ref);
        double nr = 0;
        for (int d = 0; d < HD; d++)
            nr += ref[d] * ref[d];
        for (int p = 0; p < N_PATHS; p++) {
            row_attn(p, q, k, v, NKEYS, out, s);
            double ne = 0;
            for (int d = 0; d < HD; d++)
                ne += (out[d] - ref[d]) * (out[d] - ref[d]);
            double rel = sqrt(ne / nr);
            worst[p] = rel > worst[p] ? rel : worst[p];
            sum[p] += rel;
        }
    }
    static const char *names[N_PATHS] = {"engine (float, exp degree 5)", "exp degree 4", "exp degree 3",
                                         "Q.K in BF16"};
    printf("rows of %d keys, q uniform in +-%.1f (score std ~%.1f): |o - o64| / |o64|\n", NKEYS, q_scale,
           q_scale * sqrt(HD / 9.0));
    for (int p = 0; p < N_PATHS; p++)
        printf("  %-30s mean %.3g, worst %.3g\n", names[p], sum[p] / rows, worst[p]);
    free(k);
    free(v);
    free(s);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    if (!__builtin_cpu_supports("avx512bf16") || reps < 1) {
        fprintf(stderr, "bench_attn_proposals: needs AVX-512 BF16\n");
        return 2;
    }
    const struct vec_ops *vec = vec_ops_best();
    float *q = aligned_alloc(64, sizeof(float) * R * HD), *kf = aligned_alloc(64, sizeof(float) * HD * T);
    float *s = aligned_alloc(64, sizeof(float) * R * T);
    uint32_t *q2 = aligned_alloc(64, sizeof(uint32_t) * R * HD / 2), *k2 = aligned_alloc(64, sizeof(uint32_t) * HD / 2 * T);
    uint64_t seed = 3;
    for (int i = 0; i < R * HD; i++)
        q[i] = bench_rnd_lcg(&seed) * 0.125f;
    for (int i = 0; i < HD * T; i++)
        kf[i] = bench_rnd_lcg(&seed);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < HD / 2; i++)
            q2[r * (HD / 2) + i] = (uint32_t)to_bf16(q[r * HD + 2 * i]) | (uint32_t)to_bf16(q[r * HD + 2 * i + 1]) << 16;
    k_to_bf16(kf, k2);
    double us[6];
    for (int kind = 0; kind < 6; kind++) {
        double best = 1e30;
        for (int round = 0; round < 5; round++) {
            vec->attn_qk(q, HD, R, kf, NULL, T, T, HD, DT_F32, s, T);
            double c0 = bench_thread_cpu_s();
            for (int i = 0; i < reps; i++) {
                float l;
                switch (kind) {
                case 0: vec->attn_qk(q, HD, R, kf, NULL, T, T, HD, DT_F32, s, T); break;
                case 1: qk_bf16(q2, k2, s); break;
                case 2: k_to_bf16(kf, k2); break;
                case 3:
                    for (int r = 0; r < R; r++)
                        vec->softmax_tile(s + (size_t)r * T, T, &l);
                    break;
                case 4:
                    for (int r = 0; r < R; r++)
                        softmax_deg(s + (size_t)r * T, T, &l, 4);
                    break;
                default:
                    for (int r = 0; r < R; r++)
                        softmax_deg(s + (size_t)r * T, T, &l, 3);
                }
            }
            double t = (bench_thread_cpu_s() - c0) / reps * 1e6;
            best = t < best ? t : best;
        }
        us[kind] = best;
    }
    printf("a tile of 256 rows x 256 keys, us per CPU-second of one thread:\n");
    printf("  Q.K float (attn_qk) %.2f, Q.K BF16 pairs %.2f (of 252 rows) + K to BF16 %.2f\n", us[0], us[1], us[2]);
    printf("  softmax_tile (degree 5) %.2f, degree 4 %.2f, degree 3 %.2f\n", us[3], us[4], us[5]);
    accuracy(1.0);
    accuracy(3.0);
    free(q);
    free(kf);
    free(s);
    free(q2);
    free(k2);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "bench_attn_proposals: x86-64 only\n");
    return 2;
}
#endif
