/* AVX-512 variants of vec.h: lanes 0-15 of the canonical order are one zmm register;
 * the same multiplies and adds in the same order as the reference (no fused
 * multiply-add), and the reduction tree done in registers. */
#include "engine/vec.h"

#include <immintrin.h>

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

static float dot_f16(const float *a, const uint16_t *b, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 vb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + k)));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + k), vb));
    }
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 vb = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, b + k));
        acc = _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + k), vb));
    }
    return reduce16(acc);
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 vx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + k)));
        _mm512_storeu_ps(y + k, _mm512_add_ps(_mm512_loadu_ps(y + k), _mm512_mul_ps(va, vx)));
    }
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 vx = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + k));
        _mm512_mask_storeu_ps(y + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + k), _mm512_mul_ps(va, vx)));
    }
}

static void axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(y + k, _mm512_add_ps(_mm512_loadu_ps(y + k), _mm512_mul_ps(va, _mm512_loadu_ps(x + k))));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm512_mask_storeu_ps(y + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + k), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + k))));
    }
}

static void to_f16(uint16_t *dst, const float *src, int64_t n)
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm256_storeu_si256((__m256i *)(dst + k), _mm512_cvtps_ph(_mm512_loadu_ps(src + k), _MM_FROUND_TO_NEAREST_INT));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm256_mask_storeu_epi16(dst + k, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + k), _MM_FROUND_TO_NEAREST_INT));
    }
}

static const struct vec_ops avx512_ops = {dot_f32, dot_f16, axpy_f16, axpy_f32, to_f16};

const struct vec_ops *vec_ops_avx512(void) { return &avx512_ops; }
