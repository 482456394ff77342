/* AVX-512 variants of vec.h: lanes 0-15 of the canonical order are one zmm register;
 * the same multiplies and adds in the same order as the reference (no fused
 * multiply-add), and the reduction tree done in registers. */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include "engine/vec.h"

#include "base/dtype.h"
#include "kern/quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

/* lane[l] += lane[l+s] for s = 8, 4, 2, 1: the reference's tree. */
static inline float reduce16(__m512 v)
{
    __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    __m128 v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
    return _mm_cvtss_f32(v1);
}

/* The tail (n % 16 elements) goes into lanes 0..n%16-1 as in the reference. */
static inline __mmask16 tail_mask(int64_t rem) { return (__mmask16)((1u << rem) - 1); }

/* The masks of four neighbouring runs of 16 lanes (keys, or dimensions) with `left` lanes
 * left from the first one's start: each run whole, in part, or empty. */
static inline void masks4(int64_t left, __mmask16 m[4])
{
    for (int c = 0; c < 4; c++) {
        int64_t w = left - 16 * c;
        m[c] = w >= 16 ? (__mmask16)0xffff : w <= 0 ? (__mmask16)0 : tail_mask(w);
    }
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k)));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        acc = _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k)));
    }
    return reduce16(acc);
}

/* vec.h's exp on 16 lanes. */
static inline __m512 exp16(__m512 t)
{
    t = _mm512_max_ps(_mm512_set1_ps(VEC_EXP_LO), t); /* a NaN t passes */
    t = _mm512_min_ps(_mm512_set1_ps(VEC_EXP_HI), t);
    __m512 n = _mm512_mul_ps(t, _mm512_set1_ps(VEC_EXP_LOG2E));
    n = _mm512_add_ps(n, _mm512_set1_ps(VEC_EXP_ROUND));
    n = _mm512_sub_ps(n, _mm512_set1_ps(VEC_EXP_ROUND));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C1), t);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C2), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(VEC_EXP_P0), r, _mm512_set1_ps(VEC_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P5));
    __m512 e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    e = _mm512_add_ps(e, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
}

/* vec.h's VEC_SEXP on 16 lanes. */
static inline __m512 sexp16(__m512 t)
{
    t = _mm512_max_ps(_mm512_set1_ps(VEC_SEXP_LO), t); /* a NaN t passes */
    __m512 tr = _mm512_fmadd_ps(t, _mm512_set1_ps(VEC_EXP_LOG2E), _mm512_set1_ps(VEC_EXP_ROUND));
    __m512 n = _mm512_sub_ps(tr, _mm512_set1_ps(VEC_EXP_ROUND));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C1), t);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-VEC_EXP_C2), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(VEC_SEXP_S5), r, _mm512_set1_ps(VEC_SEXP_S4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_SEXP_S0));
    /* p * 2^n, 2^n's bits from tr's low bits (the multiply is exact for t in [-87, 0]).
     * Adding n to p's exponent bits instead saves the multiply (0.6 us of a 165 us prefill
     * tile) but turns a NaN p with payload into a number; a cmp and blend to keep NaNs cost
     * more than the multiply (bench_attn_tile: softmax 13.4, 14.0 with the multiply, 15.5). */
    __m512i two_n = _mm512_add_epi32(_mm512_slli_epi32(_mm512_castps_si512(tr), 23), _mm512_set1_epi32(127 << 23));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
}

static void exp_sub(float *x, float sub, int64_t n)
{
    __m512 vs = _mm512_set1_ps(sub);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(x + k, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + k), vs)));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm512_mask_storeu_ps(x + k, m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + k), vs)));
    }
}

static inline __m512 silu_mul16(__m512 a, __m512 b)
{
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));
    return _mm512_mul_ps(_mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), b);
}

static void silu_mul(float *a, const float *b, int64_t n)
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(a + k, silu_mul16(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k)));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm512_mask_storeu_ps(a + k, m, silu_mul16(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k)));
    }
}

/* vec.h's swiglu_oai steps on 16 lanes (the clamps as compares and blends: a NaN takes
 * the scalar comparisons' branch). */
static inline __m512 swiglu_oai16(__m512 x, __m512 y)
{
    const __m512 lim = _mm512_set1_ps(7.0f), nlim = _mm512_set1_ps(-7.0f);
    x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lim, _CMP_LT_OQ), lim, x);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, lim, _CMP_GT_OQ), y, lim);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, nlim, _CMP_LT_OQ), y, nlim);
    __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(1.702f), _mm512_sub_ps(_mm512_setzero_ps(), x)));
    __m512 h = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    return _mm512_mul_ps(h, _mm512_add_ps(y, _mm512_set1_ps(1.0f)));
}

static void swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int64_t n)
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 x = _mm512_add_ps(_mm512_loadu_ps(g + k), _mm512_loadu_ps(bg + k));
        __m512 y = _mm512_add_ps(_mm512_loadu_ps(u + k), _mm512_loadu_ps(bu + k));
        _mm512_storeu_ps(g + k, swiglu_oai16(x, y));
    }
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, g + k), _mm512_maskz_loadu_ps(m, bg + k));
        __m512 y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, u + k), _mm512_maskz_loadu_ps(m, bu + k));
        _mm512_mask_storeu_ps(g + k, m, swiglu_oai16(x, y));
    }
}

/* ---- attention tiles (vec.h): one fused multiply-add chain per result element ---- */

#define INLINE static inline __attribute__((always_inline))

/* vec.h vec_prefetch spread over a kernel's steps: per lines at each step, the rest at the
 * end (pf_end). */
struct pf_cur {
    const char *at;
    int64_t left, per;
};

INLINE struct pf_cur pf_begin(const struct vec_prefetch *pf, int64_t steps)
{
    struct pf_cur c = {NULL, 0, 0};
    if (pf && pf->lines > 0) {
        c.at = pf->at;
        c.left = pf->lines;
        c.per = steps > 0 ? (pf->lines + steps - 1) / steps : pf->lines;
    }
    return c;
}

INLINE void pf_step(struct pf_cur *c)
{
    for (int64_t i = 0; i < c->per && c->left > 0; i++, c->left--, c->at += 64)
        __builtin_prefetch(c->at, 0, 2);
}

INLINE void pf_end(struct pf_cur *c)
{
    for (; c->left > 0; c->left--, c->at += 64)
        __builtin_prefetch(c->at, 0, 2);
}

INLINE __m512 load16(const void *p, int f16, int64_t i, __mmask16 m)
{
    return f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i))
               : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* load16 of a whole vector: the load goes into the conversion (a masked load is an
 * instruction of its own). */
INLINE __m512 load16_full(const void *p, int f16, int64_t i)
{
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
               : _mm512_loadu_ps((const float *)p + i);
}

/* The codes of K(d, j0..j0+15) (mask m) of Q4_0, as floats (Q8_0 K: the byte dot products below). */
INLINE __m512 load_codes(const void *kt, const int type, int64_t ld, int64_t d, int j0, __mmask16 m)
{
    (void)type;
    int64_t c = d / 32, i = d % 32;
    __m512i x = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, (const uint8_t *)kt + (16 * c + i % 16) * ld + j0));
    x = i < 16 ? _mm512_and_si512(x, _mm512_set1_epi32(15)) : _mm512_srli_epi32(x, 4);
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(x, _mm512_set1_epi32(8)));
}

/* R (constant, <= 8) rows by the 16 keys j0.. (mask m). */
INLINE void qk_rows(const float *q, int64_t ldq, const int R, const void *kt, const uint16_t *ks, int64_t ld, int j0,
                    __mmask16 m, int64_t hd, const int type, float *s, int64_t lds)
{
    __m512 a[8];
    for (int r = 0; r < R; r++)
        a[r] = _mm512_setzero_ps();
    if (type == DT_F16 || type == DT_F32) {
        for (int64_t d = 0; d < hd; d++) {
            __m512 k = load16(kt, type == DT_F16, d * ld + j0, m);
            for (int r = 0; r < R; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * ldq + d]), k, a[r]);
        }
    } else {
        for (int64_t c = 0; c < hd / 32; c++) {
            __m512 u[8];
            for (int r = 0; r < R; r++)
                u[r] = _mm512_setzero_ps();
            for (int64_t d = 32 * c; d < 32 * c + 32; d++) {
                __m512 k = load_codes(kt, type, ld, d, j0, m);
                for (int r = 0; r < R; r++)
                    u[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * ldq + d]), k, u[r]);
            }
            __m512 sc = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + c * ld + j0));
            for (int r = 0; r < R; r++)
                a[r] = _mm512_fmadd_ps(u[r], sc, a[r]);
        }
    }
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(s + r * lds + j0, m, a[r]);
}

INLINE void qk_impl16(const float *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                    int64_t hd, const int type, float *s, int64_t lds, int jstart)
{
    n += jstart;
    for (int j0 = jstart; j0 < n; j0 += 16) {
        __mmask16 m = n - j0 >= 16 ? (__mmask16)0xffff : tail_mask(n - j0);
        int r = 0;
        for (; r + 8 <= rows; r += 8)
            qk_rows(q + r * ldq, ldq, 8, kt, ks, ld, j0, m, hd, type, s + r * lds, lds);
        const float *qr = q + r * ldq;
        float *sr = s + r * lds;
        switch (rows - r) {
        case 7: qk_rows(qr, ldq, 7, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 6: qk_rows(qr, ldq, 6, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 5: qk_rows(qr, ldq, 5, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 4: qk_rows(qr, ldq, 4, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 3: qk_rows(qr, ldq, 3, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 2: qk_rows(qr, ldq, 2, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        case 1: qk_rows(qr, ldq, 1, kt, ks, ld, j0, m, hd, type, sr, lds); break;
        default: break;
        }
    }
}

/* R (constant, <= 6) rows by the 64 keys from j0 (vector c of 16 under mask m[c]) of F16 or
 * F32 K: 24 independent chains, enough to keep both FMA ports busy whatever R is. */
INLINE void qk_rows_f(const float *q, int64_t ldq, const int R, const void *kt, int64_t ld, int j0,
                      const __mmask16 *m, int64_t hd, const int f16, float *s, int64_t lds)
{
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d++) {
        __m512 k[4];
        for (int c = 0; c < 4; c++)
            k[c] = load16(kt, f16, d * ld + j0 + 16 * c, m[c]);
        for (int r = 0; r < R; r++) {
            __m512 qb = _mm512_set1_ps(q[r * ldq + d]);
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm512_fmadd_ps(qb, k[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(s + r * lds + j0 + 16 * c, m[c], a[r][c]);
}

INLINE void qk_impl_f(const float *q, int64_t ldq, int rows, const void *kt, int64_t ld, int n, int64_t hd,
                      const int f16, float *s, int64_t lds)
{
    int j0 = 0;
    for (; j0 + 48 < n; j0 += 64) {
        __mmask16 m[4];
        masks4(n - j0, m);
        for (int r = 0; r < rows; r += 6) {
            const float *qr = q + r * ldq;
            float *sr = s + r * lds;
            switch (rows - r < 6 ? rows - r : 6) {
            case 6: qk_rows_f(qr, ldq, 6, kt, ld, j0, m, hd, f16, sr, lds); break;
            case 5: qk_rows_f(qr, ldq, 5, kt, ld, j0, m, hd, f16, sr, lds); break;
            case 4: qk_rows_f(qr, ldq, 4, kt, ld, j0, m, hd, f16, sr, lds); break;
            case 3: qk_rows_f(qr, ldq, 3, kt, ld, j0, m, hd, f16, sr, lds); break;
            case 2: qk_rows_f(qr, ldq, 2, kt, ld, j0, m, hd, f16, sr, lds); break;
            default: qk_rows_f(qr, ldq, 1, kt, ld, j0, m, hd, f16, sr, lds); break;
            }
        }
    }
    if (j0 < n) /* the last 1-48 keys: 16 at a time */
        qk_impl16(q, ldq, rows, kt, NULL, ld, n - j0, hd, f16 ? DT_F16 : DT_F32, s, lds, j0);
}

/* ---- Q8_0 K: byte dot products with a vec_q8_query row (vec.h attn_qk). The int32 sums are
 * exact whichever instructions make them, so both ways below give the reference's bits. ---- */

/* 16 keys' codes of 4 dimensions (one int32 lane a key), ready for dot4: with VNNI the codes
 * plus 128 (VPDPBUSD multiplies unsigned by signed bytes; the query row's bias takes the 128s
 * away again); without, their magnitudes and signs (VPMADDUBSW on |k| and the query's codes
 * negated where k < 0: pairs of at most 128 * 127 fit its int16 sums). */
struct k8 {
    __m512i x;     /* VNNI: k + 128; else |k| */
    __mmask64 neg; /* else: the bytes where k < 0 */
};

INLINE struct k8 k8_load(const int8_t *p, __mmask16 m, const int vnni)
{
    __m512i raw = _mm512_maskz_loadu_epi32(m, p);
    struct k8 k;
    if (vnni) {
        k.x = _mm512_xor_si512(raw, _mm512_set1_epi8((char)0x80));
        k.neg = 0;
    } else {
        k.x = _mm512_abs_epi8(raw);
        k.neg = _mm512_movepi8_mask(raw);
    }
    return k;
}

/* acc + the dot products of each key's 4 codes with the query's 4 (qb, broadcast). */
INLINE __m512i dot4(__m512i acc, struct k8 k, __m512i qb, const int vnni)
{
    if (vnni)
        return _mm512_dpbusd_epi32(acc, k.x, qb);
    __m512i qs = _mm512_mask_sub_epi8(qb, k.neg, _mm512_setzero_si512(), qb);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(k.x, qs), _mm512_set1_epi16(1)));
}

/* The query row's codes of dims 4g..4g+3 broadcast, its block scales and biases. */
INLINE __m512i q8_codes4(const char *row, int64_t g)
{
    int32_t v;
    memcpy(&v, row + 4 * g, sizeof v);
    return _mm512_set1_epi32(v);
}

INLINE float q8_scale(const char *row, int64_t hd, int64_t c)
{
    float v;
    memcpy(&v, row + hd + 4 * c, sizeof v);
    return v;
}

INLINE __m512i q8_bias(const char *row, int64_t hd, int64_t c)
{
    int32_t v;
    memcpy(&v, row + hd + 4 * (hd / 32) + 4 * c, sizeof v);
    return _mm512_set1_epi32(v);
}

/* s = fma((float)i, qd * scale, s) of one block c of 16 keys, i the exact sum. */
INLINE __m512 q8_step(__m512i acc, const char *row, int64_t hd, int64_t c, __m512 kd, __m512 s, const int vnni)
{
    __m512i i = vnni ? _mm512_sub_epi32(acc, q8_bias(row, hd, c)) : acc;
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_set1_ps(q8_scale(row, hd, c)), kd), s);
}

/* R (constant, <= 8) rows by the 16 keys j0.. (mask m). */
INLINE void qk8_rows(const char *q, int64_t ldq, const int R, const int8_t *kt, const uint16_t *ks, int64_t ld, int j0,
                     __mmask16 m, int64_t hd, float *s, int64_t lds, const int vnni)
{
    __m512 a[8];
    for (int r = 0; r < R; r++)
        a[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd / 32; c++) {
        __m512i acc[8];
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_setzero_si512();
        for (int64_t g = 8 * c; g < 8 * c + 8; g++) {
            struct k8 k = k8_load(kt + 4 * (g * ld + j0), m, vnni);
            for (int r = 0; r < R; r++)
                acc[r] = dot4(acc[r], k, q8_codes4(q + r * ldq, g), vnni);
        }
        __m512 kd = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + c * ld + j0));
        for (int r = 0; r < R; r++)
            a[r] = q8_step(acc[r], q + r * ldq, hd, c, kd, a[r], vnni);
    }
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(s + r * lds + j0, m, a[r]);
}

INLINE void qk8_impl(const char *q, int64_t ldq, int rows, const int8_t *kt, const uint16_t *ks, int64_t ld, int n,
                     int64_t hd, float *s, int64_t lds, const int vnni)
{
    for (int j0 = 0; j0 < n; j0 += 16) {
        __mmask16 m = n - j0 >= 16 ? (__mmask16)0xffff : tail_mask(n - j0);
        int r = 0;
        for (; r + 8 <= rows; r += 8)
            qk8_rows(q + r * ldq, ldq, 8, kt, ks, ld, j0, m, hd, s + r * lds, lds, vnni);
        const char *qr = q + r * ldq;
        float *sr = s + r * lds;
        switch (rows - r) {
        case 7: qk8_rows(qr, ldq, 7, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 6: qk8_rows(qr, ldq, 6, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 5: qk8_rows(qr, ldq, 5, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 4: qk8_rows(qr, ldq, 4, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 3: qk8_rows(qr, ldq, 3, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 2: qk8_rows(qr, ldq, 2, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        case 1: qk8_rows(qr, ldq, 1, kt, ks, ld, j0, m, hd, sr, lds, vnni); break;
        default: break;
        }
    }
}

INLINE void qk_dispatch(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                        int64_t hd, int type, float *s, int64_t lds, const int vnni)
{
    switch (type) {
    case DT_F16: qk_impl_f(q, ldq, rows, kt, ld, n, hd, 1, s, lds); break;
    case DT_F32: qk_impl_f(q, ldq, rows, kt, ld, n, hd, 0, s, lds); break;
    case DT_Q8_0: qk8_impl(q, ldq, rows, kt, ks, ld, n, hd, s, lds, vnni); break;
    default: qk_impl16(q, ldq, rows, kt, ks, ld, n, hd, DT_Q4_0, s, lds, 0); break;
    }
}

static void attn_qk(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                    int64_t hd, int type, float *s, int64_t lds)
{
    qk_dispatch(q, ldq, rows, kt, ks, ld, n, hd, type, s, lds, 1);
}

static void attn_qk_novnni(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                           int64_t hd, int type, float *s, int64_t lds)
{
    qk_dispatch(q, ldq, rows, kt, ks, ld, n, hd, type, s, lds, 0);
}

/* R (constant, <= 6) rows by the keys of blocks b0..b0+3 of 16 keys (block c under mask
 * m[c]; a block of mask 0 is not read) of F16 or F32 K: 24 chains, as qk_rows_f. full
 * (constant): every mask is whole, the loads unmasked (load16_full). */
INLINE void qkp_rows_m(const float *q, int64_t ldq, const int R, const void *const *kt, int b0, const __mmask16 *m,
                       int64_t hd, const int f16, float *s, int64_t lds, struct pf_cur *pf, const int full)
{
    __m512 a[6][4];
    const void *kb[4];
    for (int c = 0; c < 4; c++)
        kb[c] = m[c] ? kt[b0 + c] : kt[b0];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d++) {
        __m512 k[4];
        for (int c = 0; c < 4; c++)
            k[c] = full ? load16_full(kb[c], f16, d * 16) : load16(kb[c], f16, d * 16, m[c]);
        pf_step(pf);
        for (int r = 0; r < R; r++) {
            __m512 qb = _mm512_set1_ps(q[r * ldq + d]);
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm512_fmadd_ps(qb, k[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(s + r * lds + 16 * (b0 + c), m[c], a[r][c]);
}

INLINE void qkp_rows(const float *q, int64_t ldq, const int R, const void *const *kt, int b0, const __mmask16 *m,
                     int64_t hd, const int f16, float *s, int64_t lds, struct pf_cur *pf)
{
    qkp_rows_m(q, ldq, R, kt, b0, m, hd, f16, s, lds, pf, 0);
}

INLINE void qkp_impl(const float *q, int64_t ldq, int rows, const void *const *kt, int n, int64_t hd, const int f16,
                     float *s, int64_t lds, const struct vec_prefetch *pfq)
{
    struct pf_cur pc = pf_begin(pfq, hd * ((n + 63) / 64) * ((rows + 5) / 6)), *pf = &pc;
    for (int b0 = 0; 16 * b0 < n; b0 += 4) {
        __mmask16 m[4];
        masks4(n - 16 * b0, m);
        for (int r = 0; r < rows; r += 6) {
            const float *qr = q + r * ldq;
            float *sr = s + r * lds;
            if (rows - r == 4 && ldq == 64 && hd == 64) {
                /* a decode's 4 rows of 64 dims: with the strides constant the 4 rows' q are one
                 * address register, not 4 (the loop spilled its pointers) */
                if (n - 16 * b0 >= 64)
                    qkp_rows_m(qr, 64, 4, kt, b0, m, 64, f16, sr, lds, pf, 1);
                else
                    qkp_rows(qr, 64, 4, kt, b0, m, 64, f16, sr, lds, pf);
                continue;
            }
            switch (rows - r < 6 ? rows - r : 6) {
            case 6: qkp_rows(qr, ldq, 6, kt, b0, m, hd, f16, sr, lds, pf); break;
            case 5: qkp_rows(qr, ldq, 5, kt, b0, m, hd, f16, sr, lds, pf); break;
            case 4: qkp_rows(qr, ldq, 4, kt, b0, m, hd, f16, sr, lds, pf); break;
            case 3: qkp_rows(qr, ldq, 3, kt, b0, m, hd, f16, sr, lds, pf); break;
            case 2: qkp_rows(qr, ldq, 2, kt, b0, m, hd, f16, sr, lds, pf); break;
            default: qkp_rows(qr, ldq, 1, kt, b0, m, hd, f16, sr, lds, pf); break;
            }
        }
    }
    pf_end(pf);
}

/* R (constant, <= 4) rows by blocks b0..b0+3 of 16 keys of Q8_0 or Q4_0 K (mask m[c]): the
 * chains u of each 32 dimensions in registers, the sums s = fma(u, scale, s) kept in s. */
INLINE void qkpq_rows(const float *q, int64_t ldq, const int R, const void *const *kt, const uint16_t *const *ks,
                      int b0, const __mmask16 *m, int64_t hd, const int type, float *s, int64_t lds, struct pf_cur *pf)
{
    const void *kb[4];
    const uint16_t *sb[4];
    for (int c = 0; c < 4; c++) {
        kb[c] = m[c] ? kt[b0 + c] : kt[b0];
        sb[c] = m[c] ? ks[b0 + c] : ks[b0];
    }
    for (int64_t cc = 0; cc < hd / 32; cc++) {
        __m512 u[4][4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++)
                u[r][c] = _mm512_setzero_ps();
        for (int64_t d = 32 * cc; d < 32 * cc + 32; d++) {
            __m512 k[4];
            for (int c = 0; c < 4; c++)
                k[c] = load_codes(kb[c], type, 16, d, 0, m[c]);
            pf_step(pf);
            for (int r = 0; r < R; r++) {
                __m512 qb = _mm512_set1_ps(q[r * ldq + d]);
                for (int c = 0; c < 4; c++)
                    u[r][c] = _mm512_fmadd_ps(qb, k[c], u[r][c]);
            }
        }
        for (int c = 0; c < 4; c++) {
            __m512 sc = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[c], sb[c] + cc * 16));
            for (int r = 0; r < R; r++) {
                float *at = s + r * lds + 16 * (b0 + c);
                __m512 acc = cc ? _mm512_maskz_loadu_ps(m[c], at) : _mm512_setzero_ps();
                _mm512_mask_storeu_ps(at, m[c], _mm512_fmadd_ps(u[r][c], sc, acc));
            }
        }
    }
}

INLINE void qkpq_impl(const float *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks, int n,
                      int64_t hd, const int type, float *s, int64_t lds, const struct vec_prefetch *pfq)
{
    struct pf_cur pc = pf_begin(pfq, hd * ((n + 63) / 64) * ((rows + 3) / 4)), *pf = &pc;
    for (int b0 = 0; 16 * b0 < n; b0 += 4) {
        __mmask16 m[4];
        masks4(n - 16 * b0, m);
        for (int r = 0; r < rows; r += 4) {
            const float *qr = q + r * ldq;
            float *sr = s + r * lds;
            switch (rows - r < 4 ? rows - r : 4) {
            case 4: qkpq_rows(qr, ldq, 4, kt, ks, b0, m, hd, type, sr, lds, pf); break;
            case 3: qkpq_rows(qr, ldq, 3, kt, ks, b0, m, hd, type, sr, lds, pf); break;
            case 2: qkpq_rows(qr, ldq, 2, kt, ks, b0, m, hd, type, sr, lds, pf); break;
            default: qkpq_rows(qr, ldq, 1, kt, ks, b0, m, hd, type, sr, lds, pf); break;
            }
        }
    }
    pf_end(pf);
}

/* R (constant, <= 4) rows by blocks b0..b0+3 of 16 keys of Q8_0 K (mask m[c]): the exact
 * sums of each 32 dimensions in registers, the float sums kept in s. */
INLINE void qkp8_rows(const char *q, int64_t ldq, const int R, const void *const *kt, const uint16_t *const *ks,
                      int b0, const __mmask16 *m, int64_t hd, float *s, int64_t lds, const int vnni, struct pf_cur *pf)
{
    const int8_t *kb[4];
    const uint16_t *sb[4];
    for (int c = 0; c < 4; c++) {
        kb[c] = m[c] ? kt[b0 + c] : kt[b0];
        sb[c] = m[c] ? ks[b0 + c] : ks[b0];
    }
    for (int64_t cc = 0; cc < hd / 32; cc++) {
        __m512i acc[4][4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_setzero_si512();
        for (int64_t g = 8 * cc; g < 8 * cc + 8; g++) {
            struct k8 k[4];
            for (int c = 0; c < 4; c++)
                k[c] = k8_load(kb[c] + 64 * g, m[c], vnni);
            pf_step(pf);
            for (int r = 0; r < R; r++) {
                __m512i qb = q8_codes4(q + r * ldq, g);
                for (int c = 0; c < 4; c++)
                    acc[r][c] = dot4(acc[r][c], k[c], qb, vnni);
            }
        }
        for (int c = 0; c < 4; c++) {
            __m512 kd = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[c], sb[c] + cc * 16));
            for (int r = 0; r < R; r++) {
                float *at = s + r * lds + 16 * (b0 + c);
                __m512 prev = cc ? _mm512_maskz_loadu_ps(m[c], at) : _mm512_setzero_ps();
                _mm512_mask_storeu_ps(at, m[c], q8_step(acc[r][c], q + r * ldq, hd, cc, kd, prev, vnni));
            }
        }
    }
}

INLINE void qkp8_impl(const char *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks, int n,
                      int64_t hd, float *s, int64_t lds, const int vnni, const struct vec_prefetch *pfq)
{
    struct pf_cur pc = pf_begin(pfq, hd / 4 * ((n + 63) / 64) * ((rows + 3) / 4)), *pf = &pc;
    for (int b0 = 0; 16 * b0 < n; b0 += 4) {
        __mmask16 m[4];
        masks4(n - 16 * b0, m);
        for (int r = 0; r < rows; r += 4) {
            const char *qr = q + r * ldq;
            float *sr = s + r * lds;
            switch (rows - r < 4 ? rows - r : 4) {
            case 4: qkp8_rows(qr, ldq, 4, kt, ks, b0, m, hd, sr, lds, vnni, pf); break;
            case 3: qkp8_rows(qr, ldq, 3, kt, ks, b0, m, hd, sr, lds, vnni, pf); break;
            case 2: qkp8_rows(qr, ldq, 2, kt, ks, b0, m, hd, sr, lds, vnni, pf); break;
            default: qkp8_rows(qr, ldq, 1, kt, ks, b0, m, hd, sr, lds, vnni, pf); break;
            }
        }
    }
    pf_end(pf);
}

/* Blocks of 16 keys four at a time; other block sizes one block at a time. */
INLINE void qk_paged_dispatch(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks,
                              int bt, int n, int64_t hd, int type, float *s, int64_t lds, const int vnni,
                              const struct vec_prefetch *pf)
{
    if (bt == 16 && type == DT_F16) {
        qkp_impl(q, ldq, rows, kt, n, hd, 1, s, lds, pf);
        return;
    }
    if (bt == 16 && type == DT_F32) {
        qkp_impl(q, ldq, rows, kt, n, hd, 0, s, lds, pf);
        return;
    }
    if (bt == 16 && type == DT_Q8_0) {
        qkp8_impl(q, ldq, rows, kt, ks, n, hd, s, lds, vnni, pf);
        return;
    }
    if (bt == 16 && type == DT_Q4_0) {
        qkpq_impl(q, ldq, rows, kt, ks, n, hd, DT_Q4_0, s, lds, pf);
        return;
    }
    vec_prefetch_all(pf);
    for (int j0 = 0, b = 0; j0 < n; j0 += bt, b++)
        qk_dispatch(q, ldq, rows, kt[b], ks ? ks[b] : NULL, bt, n - j0 < bt ? n - j0 : bt, hd, type, s + j0, lds, vnni);
}

static void attn_qk_paged(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks,
                          int bt, int n, int64_t hd, int type, float *s, int64_t lds, const struct vec_prefetch *pf)
{
    qk_paged_dispatch(q, ldq, rows, kt, ks, bt, n, hd, type, s, lds, 1, pf);
}

static void attn_qk_paged_novnni(const void *q, int64_t ldq, int rows, const void *const *kt,
                                 const uint16_t *const *ks, int bt, int n, int64_t hd, int type, float *s, int64_t lds,
                                 const struct vec_prefetch *pf)
{
    qk_paged_dispatch(q, ldq, rows, kt, ks, bt, n, hd, type, s, lds, 0, pf);
}

/* Columns [16c, 16c+16) of V_j's 64-column window from c0, as floats, and the scale of
 * its 32-column block (quantized types; 1 otherwise, unused). */
INLINE __m512 load_v(const void *vj, const int type, int64_t c0, int c, __mmask16 m)
{
    if (type == DT_F16 || type == DT_F32)
        return load16(vj, type == DT_F16, c0 + 16 * c, m);
    int64_t blk = (c0 + 16 * c) / 32;
    int half = c % 2;
    if (type == DT_Q8_0) {
        const struct block_q8_0 *b = (const struct block_q8_0 *)vj + blk;
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b->qs + 16 * half)));
    }
    const struct block_q4_0 *b = (const struct block_q4_0 *)vj + blk;
    __m512i x = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, b->qs));
    x = half ? _mm512_srli_epi32(x, 4) : _mm512_and_si512(x, _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(x, _mm512_set1_epi32(8)));
}

/* The half scale of V_j's 32-column block holding col. */
INLINE uint16_t v_scale(const void *vj, const int type, int64_t col)
{
    if (type == DT_Q8_0)
        return ((const struct block_q8_0 *)vj)[col / 32].d;
    return ((const struct block_q4_0 *)vj)[col / 32].d;
}

/* F16 or F32 V: R (constant, <= 6) rows, keys [j0, j1), the 64 columns from c0 (chunk c of
 * 16 under mask mc[c]; full (constant): every mask whole, the loads unmasked), added into o;
 * or with f (attn_pv_merge's factors of the R rows, 2 a row) from zero, then merged into o. */
INLINE void pv_rows_m(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                      const void *const *v, int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf,
                      const int full, const float *f)
{
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = f ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mc[c], o + r * ldo + c0 + 16 * c);
    for (int j = j0; j < j1; j++) {
        __m512 x[4];
        for (int c = 0; c < 4; c++)
            x[c] = full ? load16_full(v[j], type == DT_F16, c0 + 16 * c) : load_v(v[j], type, c0, c, mc[c]);
        pf_step(pf);
        for (int r = 0; r < R; r++) {
            __m512 pr = _mm512_set1_ps(p[r * ldp + j]);
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm512_fmadd_ps(pr, x[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m512 fa = f ? _mm512_set1_ps(f[2 * r]) : _mm512_setzero_ps();
        __m512 fb = f ? _mm512_set1_ps(f[2 * r + 1]) : _mm512_setzero_ps();
        for (int c = 0; c < 4; c++) {
            float *at = o + r * ldo + c0 + 16 * c;
            __m512 y = a[r][c];
            if (f)
                y = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mc[c], at), fa), _mm512_mul_ps(y, fb));
            _mm512_mask_storeu_ps(at, mc[c], y);
        }
    }
}

INLINE void pv_rows(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                    const void *const *v, int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf)
{
    pv_rows_m(o, ldo, R, p, ldp, j0, j1, v, c0, mc, type, pf, 0, NULL);
}

/* pv_rows of R (1..6) rows, keys [0, j1). */
INLINE void pv_rows_n(float *o, int64_t ldo, int R, const float *p, int64_t ldp, int j1, const void *const *v,
                      int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf)
{
    switch (R) {
    case 6: pv_rows(o, ldo, 6, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    case 5: pv_rows(o, ldo, 5, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    case 4: pv_rows(o, ldo, 4, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    case 3: pv_rows(o, ldo, 3, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    case 2: pv_rows(o, ldo, 2, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    default: pv_rows(o, ldo, 1, p, ldp, 0, j1, v, c0, mc, type, pf); break;
    }
}

/* Quantized V: R (constant, <= 6) rows, keys ja..ja+nj-1 (nj <= 64), the 64 columns from c0,
 * with w = p * scale of each row, key and 32-column block already in w[r][h][jj]; the codes
 * from V, or (xf not NULL) as floats already, key ja+jj's 64 at xf + 64*jj. */
INLINE void pvq_rows(float *o, int64_t ldo, const int R, const float *w, int ja, int nj, const void *const *v,
                     const float *xf, int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf)
{
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_maskz_loadu_ps(mc[c], o + r * ldo + c0 + 16 * c);
    for (int jj = 0; jj < nj; jj++) {
        __m512 x[4];
        for (int c = 0; c < 4; c++)
            x[c] = xf ? _mm512_load_ps(xf + 64 * jj + 16 * c) : load_v(v[ja + jj], type, c0, c, mc[c]);
        pf_step(pf);
        for (int r = 0; r < R; r++) {
            __m512 w0 = _mm512_set1_ps(w[(2 * r) * 64 + jj]), w1 = _mm512_set1_ps(w[(2 * r + 1) * 64 + jj]);
            a[r][0] = _mm512_fmadd_ps(w0, x[0], a[r][0]);
            a[r][1] = _mm512_fmadd_ps(w0, x[1], a[r][1]);
            a[r][2] = _mm512_fmadd_ps(w1, x[2], a[r][2]);
            a[r][3] = _mm512_fmadd_ps(w1, x[3], a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o + r * ldo + c0 + 16 * c, mc[c], a[r][c]);
}

/* Quantized V, keys [j0, j1): the products w = p * scale 16 keys at a time (the same
 * multiplies as one at a time), 64 keys per pass. */
INLINE void pvq(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                const void *const *v, int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf)
{
    float w[6 * 2 * 64] __attribute__((aligned(64)));
    uint16_t sc[2 * 64] __attribute__((aligned(64))); /* halves, converted 16 at a time */
    for (int ja = j0; ja < j1; ja += 64) {
        int nj = j1 - ja < 64 ? j1 - ja : 64;
        for (int jj = 0; jj < nj; jj++) {
            sc[jj] = v_scale(v[ja + jj], type, c0);
            sc[64 + jj] = mc[2] ? v_scale(v[ja + jj], type, c0 + 32) : sc[jj];
        }
        for (int jj = 0; jj < nj; jj += 16) {
            __mmask16 m = nj - jj >= 16 ? (__mmask16)0xffff : tail_mask(nj - jj);
            __m512 s0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc + jj));
            __m512 s1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc + 64 + jj));
            for (int r = 0; r < R; r++) {
                __m512 pr = _mm512_maskz_loadu_ps(m, p + r * ldp + ja + jj);
                _mm512_store_ps(w + (2 * r) * 64 + jj, _mm512_mul_ps(pr, s0));
                _mm512_store_ps(w + (2 * r + 1) * 64 + jj, _mm512_mul_ps(pr, s1));
            }
        }
        pvq_rows(o, ldo, R, w, ja, nj, v, NULL, c0, mc, type, pf);
    }
}

/* pvq over keys [j0, j1) of a chunk of 64 from ja whose codes are floats already (key j's 64
 * at xf + 64*(j - ja)) and whose scales too (sf[j - ja] and sf[64 + j - ja]): the same
 * products w = p * scale. */
INLINE void pvq_conv(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int ja, int j0, int j1,
                     const float *xf, const float *sf, int64_t c0, const __mmask16 *mc, const int type)
{
    float w[6 * 2 * 64] __attribute__((aligned(64)));
    int nj = j1 - j0, at = j0 - ja;
    for (int jj = 0; jj < nj; jj += 16) {
        __mmask16 m = nj - jj >= 16 ? (__mmask16)0xffff : tail_mask(nj - jj);
        __m512 s0 = _mm512_maskz_loadu_ps(m, sf + at + jj), s1 = _mm512_maskz_loadu_ps(m, sf + 64 + at + jj);
        for (int r = 0; r < R; r++) {
            __m512 pr = _mm512_maskz_loadu_ps(m, p + r * ldp + j0 + jj);
            _mm512_store_ps(w + (2 * r) * 64 + jj, _mm512_mul_ps(pr, s0));
            _mm512_store_ps(w + (2 * r + 1) * 64 + jj, _mm512_mul_ps(pr, s1));
        }
    }
    struct pf_cur none = {NULL, 0, 0};
    pvq_rows(o, ldo, R, w, j0, nj, NULL, xf + 64 * at, c0, mc, type, &none);
}

/* pvq_conv of R (1..6) rows. */
INLINE void pvq_conv_n(float *o, int64_t ldo, int R, const float *p, int64_t ldp, int ja, int j0, int j1,
                       const float *xf, const float *sf, int64_t c0, const __mmask16 *mc, const int type)
{
    switch (R) {
    case 6: pvq_conv(o, ldo, 6, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    case 5: pvq_conv(o, ldo, 5, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    case 4: pvq_conv(o, ldo, 4, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    case 3: pvq_conv(o, ldo, 3, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    case 2: pvq_conv(o, ldo, 2, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    default: pvq_conv(o, ldo, 1, p, ldp, ja, j0, j1, xf, sf, c0, mc, type); break;
    }
}

/* Quantized V, more rows than one group (Q8_0: two): 64 keys' codes and scales of the 64-column window
 * from c0 are converted to floats once (the conversion is exact) and shared by every group
 * of 6 rows, which converted them anew each (8 of the 32 operations a key and group). Each
 * row still takes its keys in order, a chunk's common keys with its group, the rest alone. */
INLINE void pvq_many(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                     const void *const *v, int64_t c0, const __mmask16 *mc, const int type, struct pf_cur *pf)
{
    float xf[64 * 64] __attribute__((aligned(64))), sf[2 * 64] __attribute__((aligned(64)));
    int nmax = 0;
    for (int r = 0; r < rows; r++)
        nmax = n[r] > nmax ? n[r] : nmax;
    for (int ja = 0; ja < nmax; ja += 64) {
        int je = nmax - ja < 64 ? nmax : ja + 64;
        for (int j = ja; j < je; j++) {
            for (int c = 0; c < 4; c++)
                _mm512_store_ps(xf + 64 * (j - ja) + 16 * c, load_v(v[j], type, c0, c, mc[c]));
            uint16_t h0 = v_scale(v[j], type, c0), h1 = mc[2] ? v_scale(v[j], type, c0 + 32) : h0;
            sf[j - ja] = _cvtsh_ss(h0);
            sf[64 + j - ja] = _cvtsh_ss(h1);
            pf_step(pf);
        }
        for (int r = 0; r < rows; r += 6) {
            int R = rows - r < 6 ? rows - r : 6;
            int jmin = n[r];
            for (int g = 1; g < R; g++)
                jmin = n[r + g] < jmin ? n[r + g] : jmin;
            int jc = jmin < je ? jmin : je; /* the group's common keys in this chunk: [ja, jc) */
            if (jc > ja)
                pvq_conv_n(o + r * ldo, ldo, R, p + r * ldp, ldp, ja, ja, jc, xf, sf, c0, mc, type);
            for (int g = 0; g < R; g++) {
                int j0 = jc > ja ? jc : ja, j1 = n[r + g] < je ? n[r + g] : je;
                if (j1 > j0)
                    pvq_conv(o + (r + g) * ldo, ldo, 1, p + (r + g) * ldp, ldp, ja, j0, j1, xf, sf, c0, mc, type);
            }
        }
    }
}

INLINE void pv_impl(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, const int type, const struct vec_prefetch *pfq)
{
    struct pf_cur pc = pf_begin(pfq, rows > 0 ? (int64_t)n[0] * ((hd + 63) / 64) : 0), *pf = &pc;
    for (int64_t c0 = 0; c0 < hd; c0 += 64) {
        __mmask16 mc[4];
        masks4(hd - c0, mc);
        /* 6 rows a group, quantized V too: its code conversions per key are shared by 24
         * fused multiply-adds rather than 16 */
        const int step = 6;
        const bool quantized = type == DT_Q8_0 || type == DT_Q4_0;
        /* Q8_0's conversion is cheap enough that two groups gained nothing from sharing it
         * (8 rows: 3% slower shared); Q4_0's unpacking gains from two groups on */
        if (quantized && rows > (type == DT_Q8_0 ? 2 * step : step)) {
            pvq_many(o, ldo, rows, p, ldp, n, v, c0, mc, type, pf);
            continue;
        }
        for (int r = 0; r < rows; r += step) {
            int R = rows - r < step ? rows - r : step;
            int jmin = n[r];
            for (int g = 1; g < R; g++)
                jmin = n[r + g] < jmin ? n[r + g] : jmin;
            float *orow = o + r * ldo;
            const float *prow = p + r * ldp;
            if (quantized) {
                switch (R) {
                case 6: pvq(orow, ldo, 6, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                case 5: pvq(orow, ldo, 5, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                case 4: pvq(orow, ldo, 4, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                case 3: pvq(orow, ldo, 3, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                case 2: pvq(orow, ldo, 2, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                default: pvq(orow, ldo, 1, prow, ldp, 0, jmin, v, c0, mc, type, pf); break;
                }
                for (int g = 0; g < R; g++)
                    if (n[r + g] > jmin)
                        pvq(orow + g * ldo, ldo, 1, prow + g * ldp, ldp, jmin, n[r + g], v, c0, mc, type, pf);
                continue;
            }
            if (R == 4 && ldo == 64 && ldp == 256 && hd == 64) {
                /* a decode's 4 rows of 64 columns (scores a tile of 256 apart): with the strides
                 * constant the rows' p and o take one address register each (the loop spilled
                 * its pointers), and every mask is whole */
                pv_rows_m(orow, 64, 4, prow, 256, 0, jmin, v, 0, mc, type, pf, 1, NULL);
            } else if (R == 6 && ldo == 64 && ldp == 256 && hd == 64) {
                /* a prefill tile's rows, the same way (the loop reloaded six row offsets from
                 * the stack every key) */
                pv_rows_m(orow, 64, 6, prow, 256, 0, jmin, v, 0, mc, type, pf, 1, NULL);
            } else {
                pv_rows_n(orow, ldo, R, prow, ldp, jmin, v, c0, mc, type, pf);
            }
            for (int g = 0; g < R; g++)
                if (n[r + g] > jmin)
                    pv_rows(orow + g * ldo, ldo, 1, prow + g * ldp, ldp, jmin, n[r + g], v, c0, mc, type, pf);
        }
    }
    pf_end(pf);
}

static void attn_pv(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, int type, const struct vec_prefetch *pf)
{
    switch (type) {
    case DT_F16: pv_impl(o, ldo, rows, p, ldp, n, v, hd, DT_F16, pf); break;
    case DT_F32: pv_impl(o, ldo, rows, p, ldp, n, v, hd, DT_F32, pf); break;
    case DT_Q8_0: pv_impl(o, ldo, rows, p, ldp, n, v, hd, DT_Q8_0, pf); break;
    default: pv_impl(o, ldo, rows, p, ldp, n, v, hd, DT_Q4_0, pf); break;
    }
}

/* vec.h attn_pv_merge: 6 rows a group, each over the 64 columns from c0 in turn. */
INLINE void pv_merge_impl(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, int n, const void *const *v,
                          int64_t hd, const int type, const float *f)
{
    struct pf_cur none = {NULL, 0, 0};
    for (int64_t c0 = 0; c0 < hd; c0 += 64) {
        __mmask16 mc[4];
        masks4(hd - c0, mc);
        for (int r = 0; r < rows; r += 6) {
            float *orow = o + r * ldo;
            const float *prow = p + r * ldp, *fr = f + 2 * r;
            if (rows - r >= 6 && ldo == 64 && ldp == 256 && hd == 64) { /* a prefill tile's, as pv_impl */
                pv_rows_m(orow, 64, 6, prow, 256, 0, n, v, 0, mc, type, &none, 1, fr);
                continue;
            }
            switch (rows - r < 6 ? rows - r : 6) {
            case 6: pv_rows_m(orow, ldo, 6, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            case 5: pv_rows_m(orow, ldo, 5, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            case 4: pv_rows_m(orow, ldo, 4, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            case 3: pv_rows_m(orow, ldo, 3, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            case 2: pv_rows_m(orow, ldo, 2, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            default: pv_rows_m(orow, ldo, 1, prow, ldp, 0, n, v, c0, mc, type, &none, 0, fr); break;
            }
        }
    }
}

static void attn_pv_merge(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, int n, const void *const *v,
                          int64_t hd, int type, const float *f)
{
    if (type == DT_F16)
        pv_merge_impl(o, ldo, rows, p, ldp, n, v, hd, DT_F16, f);
    else
        pv_merge_impl(o, ldo, rows, p, ldp, n, v, hd, DT_F32, f);
}

/* The max of s[0..n) in mx's lanes. Four running maxima: one alone waited for each max's
 * latency (2 cycles a vector, a fifth of softmax_tile's time over a prefill tile's rows); a
 * max is the same whatever order the elements come in (NaN aside, which vec.h leaves
 * unspecified; a max of +0 and -0 may give either, and s[j] - m then exp give the same bits). */
INLINE float row_max(const float *s, int64_t n)
{
    __m512 mx = _mm512_set1_ps(-__builtin_inff()), m1 = mx, m2 = mx, m3 = mx;
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + k));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + k + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(s + k + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(s + k + 48));
    }
    mx = _mm512_max_ps(_mm512_max_ps(mx, m1), _mm512_max_ps(m2, m3));
    for (; k + 16 <= n; k += 16)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + k));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + k));
    }
    return _mm512_reduce_max_ps(mx);
}

/* s[k] = exp(s[k] - m) (VEC_SEXP); returns their sum in the 16 lanes' order. */
INLINE float row_exps(float *s, int64_t n, float m)
{
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) { /* the sum in the same pass: the same adds in the same lanes */
        __m512 e = sexp16(_mm512_sub_ps(_mm512_loadu_ps(s + k), vm));
        _mm512_storeu_ps(s + k, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (k < n) {
        __mmask16 mk = tail_mask(n - k);
        __m512 e = sexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + k), vm));
        _mm512_mask_storeu_ps(s + k, mk, e);
        acc = _mm512_mask_add_ps(acc, mk, acc, e);
    }
    return reduce16(acc);
}

static float softmax_tile(float *s, int64_t n, float *l)
{
    float m = row_max(s, n);
    *l = row_exps(s, n, m);
    return m;
}

/* Each row's max comes before the exps of the row above it, so its loads and its reduction's
 * latency overlap that row's exps rather than wait in line behind them. */
static void softmax_rows(float *s, int64_t lds, int rows, const int32_t *n, float *m, float *l)
{
    float next = rows > 0 ? row_max(s, n[0]) : 0.0f;
    for (int r = 0; r < rows; r++) {
        m[r] = next;
        if (r + 1 < rows)
            next = row_max(s + (r + 1) * lds, n[r + 1]);
        l[r] = row_exps(s + r * lds, n[r], m[r]);
    }
}

static void f16_to_f32(const uint16_t *x, int64_t ldx, float *y, int64_t ldy, int rows, int64_t n)
{
    for (int r = 0; r < rows; r++, x += ldx, y += ldy) {
        int64_t k = 0;
        for (; k + 16 <= n; k += 16)
            _mm512_storeu_ps(y + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + k))));
        if (k < n) {
            __mmask16 m = tail_mask(n - k);
            _mm512_mask_storeu_ps(y + k, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + k)));
        }
    }
}

/* vec.h vec_q8_query, 16 values a step: the same max, divisions, multiplies and rounding. */
static void q8_query(const float *x, int64_t hd, void *row)
{
    int8_t *code = row;
    float *qd = (float *)(code + hd);
    int32_t *bias = (int32_t *)(qd + hd / 32);
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t c = 0; c < hd / 32; c++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * c), x1 = _mm512_loadu_ps(x + 32 * c + 16);
        /* max(|x|, acc) keeps acc where |x| is NaN, as the reference's > does */
        __m512 mx = _mm512_max_ps(_mm512_and_ps(x0, absm), _mm512_setzero_ps());
        mx = _mm512_max_ps(_mm512_and_ps(x1, absm), mx);
        float amax = _mm512_reduce_max_ps(mx);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512i sum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512 v = _mm512_mul_ps(h ? x1 : x0, _mm512_set1_ps(id));
            __mmask16 num = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
            v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            __m512 f = _mm512_sub_ps(v, _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
            __m512i i = _mm512_maskz_cvttps_epi32(num, v);
            i = _mm512_mask_add_epi32(i, num & _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), i,
                                      _mm512_set1_epi32(1));
            i = _mm512_mask_sub_epi32(i, num & _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), i,
                                      _mm512_set1_epi32(1));
            _mm_storeu_si128((__m128i *)(code + 32 * c + 16 * h), _mm512_cvtepi32_epi8(i));
            sum = _mm512_add_epi32(sum, i);
        }
        qd[c] = d;
        int32_t b = 128 * _mm512_reduce_add_epi32(sum);
        memcpy(bias + c, &b, sizeof b);
    }
}

/* 16 a step; the tail masked. A strided y (K's transposed rows) takes the halves one by one. */
static void f32_to_f16(const float *x, int64_t n, uint16_t *y, int64_t ldy)
{
    for (int64_t k = 0; k < n; k += 16) {
        int64_t w = n - k < 16 ? n - k : 16;
        __mmask16 m = w == 16 ? (__mmask16)0xffff : tail_mask(w);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (ldy == 1) {
            _mm256_mask_storeu_epi16(y + k, m, h);
            continue;
        }
        uint16_t t[16];
        _mm256_storeu_si256((__m256i *)t, h);
        for (int64_t i = 0; i < w; i++)
            y[(k + i) * ldy] = t[i];
    }
}

static const struct vec_ops avx512_ops = {dot_f32,      exp_sub,       silu_mul,   attn_qk,  attn_pv,
                                          softmax_tile, attn_qk_paged, f16_to_f32, q8_query, f32_to_f16,
                                          attn_pv_merge, softmax_rows, swiglu_oai};
static const struct vec_ops avx512_novnni_ops = {dot_f32,        exp_sub,      silu_mul,
                                                 attn_qk_novnni, attn_pv,      softmax_tile,
                                                 attn_qk_paged_novnni, f16_to_f32, q8_query, f32_to_f16,
                                          attn_pv_merge, softmax_rows, swiglu_oai};

const struct vec_ops *vec_ops_avx512(void) { return &avx512_ops; }
const struct vec_ops *vec_ops_avx512_novnni(void) { return &avx512_novnni_ops; }

#endif
