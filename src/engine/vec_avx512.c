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

/* Head sizes up to 256 keep q in registers; one reduction per row. */
static void dots_f16(const float *q, const uint16_t *const *rows, int64_t n, int64_t hd, float *out)
{
    if (hd % 16 || hd > 256) {
        for (int64_t p = 0; p < n; p++)
            out[p] = dot_f16(q, rows[p], hd);
        return;
    }
    int chunks = (int)(hd / 16);
    __m512 vq[16];
    for (int c = 0; c < chunks; c++)
        vq[c] = _mm512_loadu_ps(q + 16 * c);
    for (int64_t p = 0; p < n; p++) {
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < chunks; c++) {
            __m512 vk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rows[p] + 16 * c)));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(vq[c], vk));
        }
        out[p] = reduce16(acc);
    }
}

/* Sixteen columns at a time over all rows, so each accumulator stays in a register. */
static void wsum_f16(float *acc, const float *w, const uint16_t *const *rows, int64_t n, int64_t hd)
{
    int64_t k = 0;
    for (; k + 16 <= hd; k += 16) {
        __m512 a = _mm512_loadu_ps(acc + k);
        for (int64_t p = 0; p < n; p++) {
            __m512 vx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rows[p] + k)));
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_set1_ps(w[p]), vx));
        }
        _mm512_storeu_ps(acc + k, a);
    }
    if (k < hd) {
        __mmask16 m = tail_mask(hd - k);
        __m512 a = _mm512_maskz_loadu_ps(m, acc + k);
        for (int64_t p = 0; p < n; p++) {
            __m512 vx = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, rows[p] + k));
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_set1_ps(w[p]), vx));
        }
        _mm512_mask_storeu_ps(acc + k, m, a);
    }
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

static const struct vec_ops avx512_ops = {dot_f32, dot_f16, axpy_f16, axpy_f32, to_f16, dots_f16, wsum_f16,
                                          exp_sub, silu_mul};

const struct vec_ops *vec_ops_avx512(void) { return &avx512_ops; }
