/* AVX2 + F16C variants of vec.h: the same operations in the same order as the
 * reference (lanes 0-7 in one register, 8-15 in another; no fused multiply-add). */
#include "engine/vec.h"

#include <immintrin.h>

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

static float dot_f16(const float *a, const uint16_t *b, int64_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + k)));
        __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + k + 8)));
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + k), b0));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + k + 8), b1));
    }
    float lane[16];
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + 8, hi);
    for (; k < n; k++)
        lane[k % 16] = lane[k % 16] + a[k] * half_to_float(b[k]);
    return reduce16(_mm256_loadu_ps(lane), _mm256_loadu_ps(lane + 8));
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + k)));
        _mm256_storeu_ps(y + k, _mm256_add_ps(_mm256_loadu_ps(y + k), _mm256_mul_ps(va, vx)));
    }
    for (; k < n; k++)
        y[k] = y[k] + a * half_to_float(x[k]);
}

static void axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_add_ps(_mm256_loadu_ps(y + k), _mm256_mul_ps(va, _mm256_loadu_ps(x + k))));
    for (; k < n; k++)
        y[k] = y[k] + a * x[k];
}

static void to_f16(uint16_t *dst, const float *src, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm_storeu_si128((__m128i *)(dst + k), _mm256_cvtps_ph(_mm256_loadu_ps(src + k), _MM_FROUND_TO_NEAREST_INT));
    for (; k < n; k++)
        dst[k] = (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[k]), _MM_FROUND_TO_NEAREST_INT), 0);
}

static void dots_f16(const float *q, const uint16_t *const *rows, int64_t n, int64_t hd, float *out)
{
    for (int64_t p = 0; p < n; p++)
        out[p] = dot_f16(q, rows[p], hd);
}

/* Eight columns at a time over all rows, so each accumulator stays in a register. */
static void wsum_f16(float *acc, const float *w, const uint16_t *const *rows, int64_t n, int64_t hd)
{
    int64_t k = 0;
    for (; k + 8 <= hd; k += 8) {
        __m256 a = _mm256_loadu_ps(acc + k);
        for (int64_t p = 0; p < n; p++) {
            __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rows[p] + k)));
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(w[p]), vx));
        }
        _mm256_storeu_ps(acc + k, a);
    }
    for (; k < hd; k++)
        for (int64_t p = 0; p < n; p++)
            acc[k] = acc[k] + w[p] * half_to_float(rows[p][k]);
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

static const struct vec_ops avx2_ops = {dot_f32, dot_f16, axpy_f16, axpy_f32, to_f16, dots_f16, wsum_f16,
                                        exp_sub, silu_mul};

const struct vec_ops *vec_ops_avx2(void) { return &avx2_ops; }
