/* NEON activation quantization: the same bits as the reference in ref.c (maximum of |x|
 * ignoring NaN, one float multiply, round half to even, clamp to ±127, NaN to 0). */
#if defined(__aarch64__)  /* an ARM64 file: empty on other architectures */
#include "kern/quant.h"

#include <arm_neon.h>
#include <stdint.h>

/* Quantizes one block of 16*k values (k = 2 or 16); sums of each 16 go to sums16. */
static float quantize_block(const float *x, int n, int8_t *q, int32_t *sums16)
{
    float32x4_t amax = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 4) {
        /* amax = |x| > amax ? |x| : amax, as the reference: a NaN |x| changes nothing */
        float32x4_t a = vabsq_f32(vld1q_f32(x + i));
        amax = vbslq_f32(vcgtq_f32(a, amax), a, amax);
    }
    float m = vmaxvq_f32(amax);
    float id = m != 0.0f ? 127.0f / m : 0.0f;
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    for (int i = 0; i < n; i += 16) {
        int32x4_t qi[4];
        for (int u = 0; u < 4; u++) {
            float32x4_t v = vmulq_n_f32(vld1q_f32(x + i + 4 * u), id);
            float32x4_t r = vminq_f32(vmaxq_f32(vrndnq_f32(v), lo), hi); /* ties to even */
            uint32x4_t num = vceqq_f32(r, r);                            /* NaN -> 0 */
            qi[u] = vcvtq_s32_f32(vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), num)));
        }
        int16x8_t h0 = vcombine_s16(vmovn_s32(qi[0]), vmovn_s32(qi[1]));
        int16x8_t h1 = vcombine_s16(vmovn_s32(qi[2]), vmovn_s32(qi[3]));
        vst1q_s8(q + i, vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
        sums16[i / 16] = vaddvq_s32(vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3])));
    }
    return m;
}

void kern_act_q8_32_neon(const float *x, struct act_q8_32 *a, int64_t n_blocks)
{
    for (int64_t b = 0; b < n_blocks; b++, a++, x += QK32) {
        int32_t s[2];
        float m = quantize_block(x, QK32, a->q, s);
        a->d = m / 127.0f;
        a->sum = s[0] + s[1];
    }
}

void kern_act_q8_256_neon(const float *x, struct act_q8_256 *a, int64_t n_blocks)
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
