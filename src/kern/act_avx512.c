/* AVX-512 activation quantization: the same bits as the reference in ref.c (maximum of
 * |x| ignoring NaN, one float multiply, round half to even, clamp to ±127, NaN to 0). */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include "kern/quant.h"

#include <immintrin.h>
#include <stdint.h>

/* max(|x|, acc) over n values (a multiple of 16): a NaN |x| leaves acc as it was. */
static __m512 abs_max(const float *x, int n, __m512 acc)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 16)
        acc = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)), acc);
    return acc;
}

/* 127/m, or 0 where m is 0; lane by lane, the same division as the reference's. */
static __m512 inverse_scale(__m512 m)
{
    __mmask16 nonzero = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    return _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), m);
}

/* 16 values times vid, rounded half to even, clamped to +-127, NaN to 0; the values
 * are whole, so adding them up in float is exact in any order. */
static __m512 quantize16(const float *x, __m512 vid, int8_t *q)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), vid);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    /* clamping before rounding gives the same as after: 127 < |v| <= 127.5 rounds to 127 */
    __m512 c = _mm512_maskz_mov_ps(~nan, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
    __m512i r = _mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(r));
    return _mm512_cvtepi32_ps(r);
}

static inline __m512 fold(__m512 a, __m512 b, int is_max)
{
    return is_max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

/* Lane k of the result is the max (is_max) or sum of the 16 lanes of v[k]: the 16
 * horizontal reductions done together, halving the lanes per vector at each step while
 * pairing the vectors. Exact for max and for sums of whole numbers below 2^24, where
 * the order does not matter; v is overwritten. */
static inline __m512 reduce16x16(__m512 v[16], int is_max)
{
    for (int i = 0; i < 8; i++)  /* 256-bit halves: [v2i's 8 | v2i+1's 8] */
        v[i] = fold(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                    _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE), is_max);
    for (int i = 0; i < 4; i++)  /* 128-bit quarters: vectors 4i..4i+3, 4 lanes each */
        v[i] = fold(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                    _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD), is_max);
    for (int i = 0; i < 2; i++)  /* pairs within quarters */
        v[i] = fold(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44),
                    _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE), is_max);
    __m512 r = fold(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD), is_max);
    /* lane 4q+t now holds vector q+4t's result */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, r);
}

/* nb (1..16) blocks of 32: the maxima and the sums of the blocks are reduced together,
 * missing blocks counting as zeros. */
static inline void quantize_blocks32(const float *x, struct act_q8_32 *a, int nb)
{
    __m512 v[16];
    for (int b = 0; b < 16; b++)
        v[b] = b < nb ? abs_max(x + b * QK32, QK32, _mm512_setzero_ps()) : _mm512_setzero_ps();
    __m512 m = reduce16x16(v, 1);
    __m512 id = inverse_scale(m);
    float d[16];
    _mm512_storeu_ps(d, _mm512_div_ps(m, _mm512_set1_ps(127.0f)));
    for (int b = 0; b < nb; b++) {
        __m512 vid = _mm512_permutexvar_ps(_mm512_set1_epi32(b), id);
        const float *xb = x + b * QK32;
        v[b] = _mm512_add_ps(quantize16(xb, vid, a[b].q), quantize16(xb + 16, vid, a[b].q + 16));
    }
    for (int b = nb; b < 16; b++)
        v[b] = _mm512_setzero_ps();
    int32_t sum[16];
    _mm512_storeu_si512(sum, _mm512_cvtps_epi32(reduce16x16(v, 0)));
    for (int b = 0; b < nb; b++) {
        a[b].d = d[b];
        a[b].sum = sum[b];
    }
}

/* One block of 32, for the last few blocks. */
static void quantize_block32(const float *x, struct act_q8_32 *a)
{
    float m = _mm512_reduce_max_ps(abs_max(x, QK32, _mm512_setzero_ps()));
    __m512 vid = _mm512_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
    __m512 r = _mm512_add_ps(quantize16(x, vid, a->q), quantize16(x + 16, vid, a->q + 16));
    a->d = m / 127.0f;
    a->sum = (int32_t)_mm512_reduce_add_ps(r);
}

void kern_act_q8_32_avx512(const float *x, struct act_q8_32 *a, int64_t n_blocks)
{
    int64_t b = 0;
    for (; b + 16 <= n_blocks; b += 16)
        quantize_blocks32(x + b * QK32, a + b, 16);
    if (n_blocks - b >= 8) {  /* fewer reduce faster one at a time; a row's part is often 8 */
        quantize_blocks32(x + b * QK32, a + b, (int)(n_blocks - b));
        b = n_blocks;
    }
    for (; b < n_blocks; b++)
        quantize_block32(x + b * QK32, a + b);
}

/* One block of 256: its 16 sums of 16 are reduced together. */
static void quantize_block256(const float *x, struct act_q8_256 *a)
{
    float m = _mm512_reduce_max_ps(abs_max(x, QK_K, _mm512_setzero_ps()));
    __m512 vid = _mm512_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
    __m512 r[QK_K / 16];
    for (int j = 0; j < QK_K / 16; j++)
        r[j] = quantize16(x + 16 * j, vid, a->q + 16 * j);
    __m512i sums = _mm512_cvtps_epi32(reduce16x16(r, 0));
    _mm256_storeu_si256((__m256i *)a->bsums, _mm512_cvtepi32_epi16(sums));
    a->d = m / 127.0f;
}

void kern_act_q8_256_avx512(const float *x, struct act_q8_256 *a, int64_t n_blocks)
{
    for (int64_t b = 0; b < n_blocks; b++)
        quantize_block256(x + b * QK_K, a + b);
}

#endif
