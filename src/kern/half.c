/* IEEE half and bfloat16 conversions, bit-exact with F16C (vcvtps2ph/vcvtph2ps with
 * round-to-nearest-even and MXCSR at its default) and with AVX-512 BF16's rounding. */
#include "kern/kern.h"

#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f)  /* inf, or NaN made quiet as vcvtph2ps does */
        return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24, exact in float */
        exp = 113;  /* biased float exponent of 2^-14 */
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        return bits_f32(sign | (exp << 23) | ((man & 0x3ff) << 13));
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kern_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)  /* NaN: keep the top payload bits, set the quiet bit */
        return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    if (x >= 0x38800000u) {  /* |f| >= 2^-14: normal half, or overflow to inf */
        uint32_t r = x - 0x38000000u;  /* rebias the exponent from 127 to 15 */
        r = (r + 0xfffu + ((r >> 13) & 1)) >> 13;  /* round to nearest even; carries ripple up */
        if (r >= 0x7c00)
            return (uint16_t)(sign | 0x7c00);
        return (uint16_t)(sign | r);
    }
    if (x <= 0x33000000u)  /* |f| <= 2^-25 (the tie rounds to even zero), float subnormals too */
        return sign;
    /* half subnormal: value in units of 2^-24 is man * 2^(e - 126), a right shift by 126 - e */
    uint32_t e = x >> 23;
    uint32_t man = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  /* 14 .. 24 */
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return (uint16_t)(sign | q);  /* q may reach 0x400, the smallest normal: still right */
}

float kern_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t kern_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);  /* quiet NaN, never rounded into inf */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
