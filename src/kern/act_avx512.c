/* AVX-512 activation quantization: the same bits as the reference in ref.c (maximum of
 * |x| ignoring NaN, one float multiply, round half to even, clamp to ±127, NaN to 0). */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include "kern/quant.h"

#include <immintrin.h>
#include <stdint.h>

/* Quantizes one block of 16*k values (k = 2 or 16); sums of each 16 go to sums16. */
static float quantize_block(const float *x, int n, int8_t *q, int32_t *sums16)
{
    __m512 amax = _mm512_setzero_ps();
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 16)  /* max(|x|, acc): a NaN |x| leaves acc as it was */
        amax = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)), amax);
    float m = _mm512_reduce_max_ps(amax);
    float id = m != 0.0f ? 127.0f / m : 0.0f;
    __m512 vid = _mm512_set1_ps(id), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vid);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        r = _mm512_mask_mov_ps(r, nan, _mm512_setzero_ps());
        __m512i qi = _mm512_cvtps_epi32(r);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtsepi32_epi8(qi));
        sums16[i / 16] = _mm512_reduce_add_epi32(qi);
    }
    return m;
}

void kern_act_q8_32_avx512(const float *x, struct act_q8_32 *a, int64_t n_blocks)
{
    for (int64_t b = 0; b < n_blocks; b++, a++, x += QK32) {
        int32_t s[2];
        float m = quantize_block(x, QK32, a->q, s);
        a->d = m / 127.0f;
        a->sum = s[0] + s[1];
    }
}

void kern_act_q8_256_avx512(const float *x, struct act_q8_256 *a, int64_t n_blocks)
{
    for (int64_t b = 0; b < n_blocks; b++, a++, x += QK_K) {
        int32_t s[QK_K / 16];
        float m = quantize_block(x, QK_K, a->q, s);
        a->d = m / 127.0f;
        for (int j = 0; j < QK_K / 16; j++)
            a->bsums[j] = (int16_t)s[j];
    }
}

#endif
