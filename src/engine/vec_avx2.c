/* AVX2 + F16C variants of vec.h: the same operations in the same order as the
 * reference (lanes 0-7 in one register, 8-15 in another; no fused multiply-add). */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include "engine/vec.h"

#include "base/dtype.h"
#include "kern/kern.h"
#include "kern/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* lane[l] += lane[l+s] for s = 8, 4, 2, 1: the reference's tree, in registers. */
static inline float reduce16(__m256 lo, __m256 hi)
{
    __m256 v8 = _mm256_add_ps(lo, hi);
    __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    __m128 v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
    return _mm_cvtss_f32(v1);
}

static inline float half_to_float(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k)));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8)));
    }
    float lane[16];
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + 8, hi);
    for (; k < n; k++)
        lane[k % 16] = lane[k % 16] + a[k] * b[k];
    return reduce16(_mm256_loadu_ps(lane), _mm256_loadu_ps(lane + 8));
}

/* vec.h's exp on 8 lanes. */
static inline __m256 exp8(__m256 t)
{
    t = _mm256_max_ps(_mm256_set1_ps(VEC_EXP_LO), t); /* a NaN t passes */
    t = _mm256_min_ps(_mm256_set1_ps(VEC_EXP_HI), t);
    __m256 n = _mm256_mul_ps(t, _mm256_set1_ps(VEC_EXP_LOG2E));
    n = _mm256_add_ps(n, _mm256_set1_ps(VEC_EXP_ROUND));
    n = _mm256_sub_ps(n, _mm256_set1_ps(VEC_EXP_ROUND));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-VEC_EXP_C1), t);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-VEC_EXP_C2), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(VEC_EXP_P0), r, _mm256_set1_ps(VEC_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P5));
    __m256 e = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    e = _mm256_add_ps(e, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}

/* vec.h's VEC_SEXP on 8 lanes. */
static inline __m256 sexp8(__m256 t)
{
    t = _mm256_max_ps(_mm256_set1_ps(VEC_SEXP_LO), t); /* a NaN t passes */
    __m256 tr = _mm256_fmadd_ps(t, _mm256_set1_ps(VEC_EXP_LOG2E), _mm256_set1_ps(VEC_EXP_ROUND));
    __m256 n = _mm256_sub_ps(tr, _mm256_set1_ps(VEC_EXP_ROUND));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-VEC_EXP_C1), t);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-VEC_EXP_C2), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(VEC_SEXP_S5), r, _mm256_set1_ps(VEC_SEXP_S4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_SEXP_S3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_SEXP_S2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_SEXP_S1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_SEXP_S0));
    __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(tr), 23), _mm256_set1_epi32(127 << 23));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* Lanes [0, rem) of an 8-lane mask for maskload/maskstore. */
static inline __m256i tail8(int64_t rem)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void exp_sub(float *x, float sub, int64_t n)
{
    __m256 vs = _mm256_set1_ps(sub);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(x + k, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + k), vs)));
    if (k < n) {
        __m256i m = tail8(n - k);
        _mm256_maskstore_ps(x + k, m, exp8(_mm256_sub_ps(_mm256_maskload_ps(x + k, m), vs)));
    }
}

static inline __m256 silu_mul8(__m256 a, __m256 b)
{
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
    return _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), b);
}

static void silu_mul(float *a, const float *b, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(a + k, silu_mul8(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k)));
    if (k < n) {
        __m256i m = tail8(n - k);
        _mm256_maskstore_ps(a + k, m, silu_mul8(_mm256_maskload_ps(a + k, m), _mm256_maskload_ps(b + k, m)));
    }
}

/* vec.h's swiglu_oai steps on 8 lanes (the clamps as compares and blends: a NaN takes
 * the scalar comparisons' branch). */
static inline __m256 swiglu_oai8(__m256 x, __m256 y)
{
    const __m256 lim = _mm256_set1_ps(7.0f), nlim = _mm256_set1_ps(-7.0f);
    x = _mm256_blendv_ps(lim, x, _mm256_cmp_ps(x, lim, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, lim, _mm256_cmp_ps(y, lim, _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, nlim, _mm256_cmp_ps(y, nlim, _CMP_LT_OQ));
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(1.702f), _mm256_sub_ps(_mm256_setzero_ps(), x)));
    __m256 h = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_mul_ps(h, _mm256_add_ps(y, _mm256_set1_ps(1.0f)));
}

static void swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 x = _mm256_add_ps(_mm256_loadu_ps(g + k), _mm256_loadu_ps(bg + k));
        __m256 y = _mm256_add_ps(_mm256_loadu_ps(u + k), _mm256_loadu_ps(bu + k));
        _mm256_storeu_ps(g + k, swiglu_oai8(x, y));
    }
    if (k < n) {
        __m256i m = tail8(n - k);
        __m256 x = _mm256_add_ps(_mm256_maskload_ps(g + k, m), _mm256_maskload_ps(bg + k, m));
        __m256 y = _mm256_add_ps(_mm256_maskload_ps(u + k, m), _mm256_maskload_ps(bu + k, m));
        _mm256_maskstore_ps(g + k, m, swiglu_oai8(x, y));
    }
}

/* ---- attention tiles (vec.h): one fused multiply-add chain per result element; 8 keys
 * or 8 columns to a register, the ragged ends one element at a time ---- */

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load8(const void *p, int f16, int64_t i)
{
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
               : _mm256_loadu_ps((const float *)p + i);
}

INLINE float elem(const void *p, int f16, int64_t i)
{
    return f16 ? half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* R (constant, <= 4) rows by the 8 keys j0.. */
INLINE void qk_rows(const float *q, int64_t ldq, const int R, const void *kt, int64_t ld, int j0, int64_t hd,
                    const int f16, float *s, int64_t lds)
{
    __m256 a[4];
    for (int r = 0; r < R; r++)
        a[r] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d++) {
        __m256 k = load8(kt, f16, d * ld + j0);
        for (int r = 0; r < R; r++)
            a[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[r * ldq + d]), k, a[r]);
    }
    for (int r = 0; r < R; r++)
        _mm256_storeu_ps(s + r * lds + j0, a[r]);
}

INLINE void qk_impl(const float *q, int64_t ldq, int rows, const void *kt, int64_t ld, int n, int64_t hd,
                    const int f16, float *s, int64_t lds)
{
    int j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            qk_rows(q + r * ldq, ldq, 4, kt, ld, j0, hd, f16, s + r * lds, lds);
        switch (rows - r) {
        case 3: qk_rows(q + r * ldq, ldq, 3, kt, ld, j0, hd, f16, s + r * lds, lds); break;
        case 2: qk_rows(q + r * ldq, ldq, 2, kt, ld, j0, hd, f16, s + r * lds, lds); break;
        case 1: qk_rows(q + r * ldq, ldq, 1, kt, ld, j0, hd, f16, s + r * lds, lds); break;
        default: break;
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = j0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++)
                acc = fmaf(q[r * ldq + d], elem(kt, f16, d * ld + j), acc);
            s[r * lds + j] = acc;
        }
}

/* Q8_0 K (vec.h attn_qk): R (constant, <= 4) rows of vec_q8_query rows by the 8 keys j0..;
 * each key's 4 codes one int32 lane, their products with the query's 4 codes summed exactly
 * by VPMADDUBSW on |k| and the query's codes negated where k < 0 (pairs of at most 128 x 127
 * fit its int16 sums), then VPMADDWD. */
INLINE void qk8_rows(const char *q, int64_t ldq, const int R, const int8_t *kt, const uint16_t *ks, int64_t ld, int j0,
                     int64_t hd, float *s, int64_t lds)
{
    __m256 a[4];
    for (int r = 0; r < R; r++)
        a[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd / 32; c++) {
        __m256i acc[4];
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_setzero_si256();
        for (int64_t g = 8 * c; g < 8 * c + 8; g++) {
            __m256i k = _mm256_loadu_si256((const __m256i *)(kt + 4 * (g * ld + j0)));
            __m256i ka = _mm256_abs_epi8(k);
            for (int r = 0; r < R; r++) {
                int32_t v;
                memcpy(&v, q + r * ldq + 4 * g, sizeof v);
                __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(v), k);
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ka, qs), _mm256_set1_epi16(1)));
            }
        }
        __m256 kd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ks + c * ld + j0)));
        for (int r = 0; r < R; r++) {
            float qd;
            memcpy(&qd, q + r * ldq + hd + 4 * c, sizeof qd);
            a[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(_mm256_set1_ps(qd), kd), a[r]);
        }
    }
    for (int r = 0; r < R; r++)
        _mm256_storeu_ps(s + r * lds + j0, a[r]);
}

/* Whole groups of 8 keys here, the last n % 8 by the reference (the same bits). */
static void qk8_impl(const char *q, int64_t ldq, int rows, const int8_t *kt, const uint16_t *ks, int64_t ld, int n,
                     int64_t hd, float *s, int64_t lds)
{
    int j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            qk8_rows(q + r * ldq, ldq, 4, kt, ks, ld, j0, hd, s + r * lds, lds);
        switch (rows - r) {
        case 3: qk8_rows(q + r * ldq, ldq, 3, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        case 2: qk8_rows(q + r * ldq, ldq, 2, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        case 1: qk8_rows(q + r * ldq, ldq, 1, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        default: break;
        }
    }
    if (j0 < n)
        vec_ops_ref()->attn_qk(q, ldq, rows, kt + 4 * j0, ks + j0, ld, n - j0, hd, DT_Q8_0, s + j0, lds);
}

/* Q4_0 K (vec.h attn_qk): R (constant, <= 4) float query rows by the 8 keys j0..; per 32
 * dimensions the low nibbles of the block's 16 byte rows (dimensions 32c..32c+15) then the
 * high ones (32c+16..), each code widened to int32, minus 8 and made a float (exact), so u
 * is the reference's chain, then s = fma(u, scale, s). */
INLINE void qk4_rows(const float *q, int64_t ldq, const int R, const uint8_t *kt, const uint16_t *ks, int64_t ld,
                     int j0, int64_t hd, float *s, int64_t lds)
{
    const __m256i low = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    __m256 a[4];
    for (int r = 0; r < R; r++)
        a[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd / 32; c++) {
        __m256 u[4];
        for (int r = 0; r < R; r++)
            u[r] = _mm256_setzero_ps();
        for (int half = 0; half < 2; half++)
            for (int64_t i = 0; i < 16; i++) {
                __m128i b8 = _mm_loadl_epi64((const __m128i *)(kt + (16 * c + i) * ld + j0));
                __m256i code = _mm256_cvtepu8_epi32(b8);
                code = half ? _mm256_srli_epi32(code, 4) : _mm256_and_si256(code, low);
                __m256 k = _mm256_cvtepi32_ps(_mm256_sub_epi32(code, eight));
                int64_t d = 32 * c + 16 * half + i;
                for (int r = 0; r < R; r++)
                    u[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[r * ldq + d]), k, u[r]);
            }
        __m256 kd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ks + c * ld + j0)));
        for (int r = 0; r < R; r++)
            a[r] = _mm256_fmadd_ps(u[r], kd, a[r]);
    }
    for (int r = 0; r < R; r++)
        _mm256_storeu_ps(s + r * lds + j0, a[r]);
}

/* Whole groups of 8 keys here, the last n % 8 by the reference (the same bits). */
static void qk4_impl(const float *q, int64_t ldq, int rows, const uint8_t *kt, const uint16_t *ks, int64_t ld,
                     int n, int64_t hd, float *s, int64_t lds)
{
    int j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            qk4_rows(q + r * ldq, ldq, 4, kt, ks, ld, j0, hd, s + r * lds, lds);
        switch (rows - r) {
        case 3: qk4_rows(q + r * ldq, ldq, 3, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        case 2: qk4_rows(q + r * ldq, ldq, 2, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        case 1: qk4_rows(q + r * ldq, ldq, 1, kt, ks, ld, j0, hd, s + r * lds, lds); break;
        default: break;
        }
    }
    if (j0 < n)
        vec_ops_ref()->attn_qk(q, ldq, rows, kt + j0, ks + j0, ld, n - j0, hd, DT_Q4_0, s + j0, lds);
}

static void attn_qk(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                    int64_t hd, int type, float *s, int64_t lds)
{
    if (type == DT_Q8_0) {
        qk8_impl(q, ldq, rows, kt, ks, ld, n, hd, s, lds);
        return;
    }
    if (type == DT_Q4_0) {
        qk4_impl(q, ldq, rows, kt, ks, ld, n, hd, s, lds);
        return;
    }
    if (type == DT_F16)
        qk_impl(q, ldq, rows, kt, ld, n, hd, 1, s, lds);
    else
        qk_impl(q, ldq, rows, kt, ld, n, hd, 0, s, lds);
}

/* R (constant, <= 2) rows, keys [j0, j1), NC (constant) chunks of 8 columns from c0. */
INLINE void pv_rows(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                    const void *const *v, int64_t c0, const int NC, const int f16)
{
    __m256 a[2][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++)
            a[r][c] = _mm256_loadu_ps(o + r * ldo + c0 + 8 * c);
    for (int j = j0; j < j1; j++) {
        __m256 x[4];
        for (int c = 0; c < NC; c++)
            x[c] = load8(v[j], f16, c0 + 8 * c);
        for (int r = 0; r < R; r++) {
            __m256 pr = _mm256_set1_ps(p[r * ldp + j]);
            for (int c = 0; c < NC; c++)
                a[r][c] = _mm256_fmadd_ps(pr, x[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(o + r * ldo + c0 + 8 * c, a[r][c]);
}

INLINE void pv_cols(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t c0, const int NC, const int f16)
{
    for (int r = 0; r < rows; r += 2) {
        int R = rows - r < 2 ? rows - r : 2;
        int jmin = R == 2 && n[r + 1] < n[r] ? n[r + 1] : n[r];
        if (R == 2)
            pv_rows(o + r * ldo, ldo, 2, p + r * ldp, ldp, 0, jmin, v, c0, NC, f16);
        else
            pv_rows(o + r * ldo, ldo, 1, p + r * ldp, ldp, 0, jmin, v, c0, NC, f16);
        for (int g = 0; g < R; g++)
            if (n[r + g] > jmin)
                pv_rows(o + (r + g) * ldo, ldo, 1, p + (r + g) * ldp, ldp, jmin, n[r + g], v, c0, NC, f16);
    }
}

INLINE void pv_impl(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, const int f16)
{
    int64_t c0 = 0;
    for (; c0 + 32 <= hd; c0 += 32)
        pv_cols(o, ldo, rows, p, ldp, n, v, c0, 4, f16);
    for (; c0 + 8 <= hd; c0 += 8)
        pv_cols(o, ldo, rows, p, ldp, n, v, c0, 1, f16);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n[r]; j++)
            for (int64_t i = c0; i < hd; i++)
                o[r * ldo + i] = fmaf(p[r * ldp + j], elem(v[j], f16, i), o[r * ldo + i]);
}

/* A quantized V block's 32 codes as floats, 8 columns a register (exact): Q4_0's columns
 * 0-15 are its 16 bytes' low nibbles, 16-31 their high ones, each minus 8. */
INLINE void v_codes(const void *blk, const int q4, __m256 x[4])
{
    if (!q4) {
        const int8_t *qs = ((const struct block_q8_0 *)blk)->qs;
        for (int i = 0; i < 4; i++)
            x[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i))));
        return;
    }
    __m128i bytes = _mm_loadu_si128((const __m128i *)((const struct block_q4_0 *)blk)->qs);
    __m128i nib[2] = {_mm_and_si128(bytes, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15))};
    for (int i = 0; i < 4; i++) {
        __m128i eight = i % 2 ? _mm_srli_si128(nib[i / 2], 8) : nib[i / 2];
        x[i] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(eight), _mm256_set1_epi32(8)));
    }
}

/* R (constant, <= 2) rows of the 32 columns of block c, keys [j0, j1): w = p * scale as the
 * reference makes it, o = fma(w, code, o), the codes converted once for the R rows. */
INLINE void pvq_rows(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                     const void *const *v, int64_t c, const int q4)
{
    const size_t bsize = q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    __m256 a[2][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++)
            a[r][i] = _mm256_loadu_ps(o + r * ldo + 32 * c + 8 * i);
    for (int j = j0; j < j1; j++) {
        const char *blk = (const char *)v[j] + c * bsize;
        uint16_t dh;
        memcpy(&dh, blk, sizeof dh); /* both block types open with their half scale */
        float d = half_to_float(dh);
        __m256 x[4];
        v_codes(blk, q4, x);
        for (int r = 0; r < R; r++) {
            __m256 w = _mm256_set1_ps(p[r * ldp + j] * d);
            for (int i = 0; i < 4; i++)
                a[r][i] = _mm256_fmadd_ps(w, x[i], a[r][i]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(o + r * ldo + 32 * c + 8 * i, a[r][i]);
}

/* Q8_0 and Q4_0 V: rows in pairs over the keys both have, then each row's own. */
INLINE void pvq_impl(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                     const void *const *v, int64_t hd, const int q4)
{
    for (int r = 0; r < rows; r += 2) {
        int R = rows - r < 2 ? rows - r : 2;
        int jmin = R == 2 && n[r + 1] < n[r] ? n[r + 1] : n[r];
        for (int64_t c = 0; c < hd / 32; c++) {
            if (R == 2)
                pvq_rows(o + r * ldo, ldo, 2, p + r * ldp, ldp, 0, jmin, v, c, q4);
            else
                pvq_rows(o + r * ldo, ldo, 1, p + r * ldp, ldp, 0, jmin, v, c, q4);
            for (int g = 0; g < R; g++)
                if (n[r + g] > jmin)
                    pvq_rows(o + (r + g) * ldo, ldo, 1, p + (r + g) * ldp, ldp, jmin, n[r + g], v, c, q4);
        }
    }
}

static void attn_pv(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, int type, const struct vec_prefetch *pf)
{
    vec_prefetch_all(pf);
    if (type == DT_Q8_0 || type == DT_Q4_0) {
        if (type == DT_Q4_0)
            pvq_impl(o, ldo, rows, p, ldp, n, v, hd, 1);
        else
            pvq_impl(o, ldo, rows, p, ldp, n, v, hd, 0);
        return;
    }
    if (type == DT_F16)
        pv_impl(o, ldo, rows, p, ldp, n, v, hd, 1);
    else
        pv_impl(o, ldo, rows, p, ldp, n, v, hd, 0);
}

static float softmax_tile(float *s, int64_t n, float *l)
{
    __m256 mx = _mm256_set1_ps(-__builtin_inff());
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + k));
    float lane8[8];
    _mm256_storeu_ps(lane8, mx);
    float m = lane8[0];
    for (int i = 1; i < 8; i++)
        m = lane8[i] > m ? lane8[i] : m;
    for (; k < n; k++)
        m = s[k] > m ? s[k] : m;
    __m256 vm = _mm256_set1_ps(m);
    for (k = 0; k + 8 <= n; k += 8)
        _mm256_storeu_ps(s + k, sexp8(_mm256_sub_ps(_mm256_loadu_ps(s + k), vm)));
    if (k < n) {
        __m256i mk = tail8(n - k);
        _mm256_maskstore_ps(s + k, mk, sexp8(_mm256_sub_ps(_mm256_maskload_ps(s + k, mk), vm)));
    }
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (k = 0; k + 16 <= n; k += 16) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(s + k));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(s + k + 8));
    }
    float lane[16];
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + 8, hi);
    for (; k < n; k++)
        lane[k % 16] = lane[k % 16] + s[k];
    *l = reduce16(_mm256_loadu_ps(lane), _mm256_loadu_ps(lane + 8));
    return m;
}

/* One attn_qk per block. */
static void attn_qk_paged(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks,
                          int bt, int n, int64_t hd, int type, float *s, int64_t lds, const struct vec_prefetch *pf)
{
    vec_prefetch_all(pf);
    for (int j0 = 0, b = 0; j0 < n; j0 += bt, b++)
        attn_qk(q, ldq, rows, kt[b], ks ? ks[b] : NULL, bt, n - j0 < bt ? n - j0 : bt, hd, type, s + j0, lds);
}

static void f16_to_f32(const uint16_t *x, int64_t ldx, float *y, int64_t ldy, int rows, int64_t n)
{
    for (int r = 0; r < rows; r++, x += ldx, y += ldy) {
        int64_t k = 0;
        for (; k + 8 <= n; k += 8)
            _mm256_storeu_ps(y + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + k))));
        for (; k < n; k++)
            y[k] = _cvtsh_ss(x[k]);
    }
}

static void f32_to_f16(const float *x, int64_t n, uint16_t *y, int64_t ldy)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + k), _MM_FROUND_TO_NEAREST_INT);
        if (ldy == 1) {
            _mm_storeu_si128((__m128i *)(y + k), h);
            continue;
        }
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, h);
        for (int i = 0; i < 8; i++)
            y[(k + i) * ldy] = t[i];
    }
    for (; k < n; k++)
        y[k * ldy] = kern_f32_to_f16(x[k]);
}

static const struct vec_ops avx2_ops = {dot_f32, exp_sub, silu_mul, attn_qk, attn_pv, softmax_tile, attn_qk_paged,
                                        f16_to_f32, vec_q8_query, f32_to_f16, NULL, NULL, swiglu_oai};

const struct vec_ops *vec_ops_avx2(void) { return &avx2_ops; }

#endif
