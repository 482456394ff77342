/* Block layouts of GGUF's quantized types (bit-compatible with ggml's), and of the
 * 8-bit activation blocks the integer dot products use (ours, in memory only).
 * Scales `d`, `m`, `dmin` are IEEE half floats stored as uint16_t. */
#ifndef CAIRN_KERN_QUANT_H
#define CAIRN_KERN_QUANT_H

#include <assert.h>
#include <stdint.h>

#define QK32 32   /* elements per block of the legacy types */
#define QK_K 256  /* elements per super-block of the K-quants */

/* value = d * (q - 8); element i < 16 in the low nibble of qs[i], i >= 16 in the high nibble of qs[i-16] */
struct block_q4_0 { uint16_t d; uint8_t qs[QK32 / 2]; };
/* value = d * q + m; nibbles as Q4_0 */
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK32 / 2]; };
/* value = d * (q - 16); low 4 bits as Q4_0, bit 4 of element i is bit i of qh (little-endian u32) */
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK32 / 2]; };
/* value = d * q + m; bits as Q5_0 */
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK32 / 2]; };
/* value = d * q */
struct block_q8_0 { uint16_t d; int8_t qs[QK32]; };
/* 8 sub-blocks of 32, 6-bit scale and min each packed in scales[12];
 * value = d * sc * q - dmin * m, q in 0..15 */
struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
/* as Q4_K with a fifth bit per element in qh; q in 0..31 */
struct block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
/* 16 sub-blocks of 16 with int8 scales; value = d * sc * (q - 32), q in 0..63 from 4 low bits (ql) and 2 high bits (qh) */
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };

static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block size");
static_assert(sizeof(struct block_q4_1) == 20, "q4_1 block size");
static_assert(sizeof(struct block_q5_0) == 22, "q5_0 block size");
static_assert(sizeof(struct block_q5_1) == 24, "q5_1 block size");
static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block size");
static_assert(sizeof(struct block_q4_K) == 144, "q4_K block size");
static_assert(sizeof(struct block_q5_K) == 176, "q5_K block size");
static_assert(sizeof(struct block_q6_K) == 210, "q6_K block size");

/* Activation blocks (see kern.h for how they are made). */
struct act_q8_32 { float d; int32_t sum; int8_t q[QK32]; };               /* sum = sum of q */
struct act_q8_256 { float d; int16_t bsums[QK_K / 16]; int8_t q[QK_K]; }; /* bsums[j] = sum of q[16j..16j+15] */

static_assert(sizeof(struct act_q8_32) == 40, "act_q8_32 size");
static_assert(sizeof(struct act_q8_256) == 292, "act_q8_256 size");

/* Scale and min (6 bits each) of sub-block j (0..7) of a Q4_K/Q5_K block's scales[12]:
 * j < 4 in the low 6 bits of bytes j and j+4; j >= 4 in the nibbles of byte j+4 with
 * their top 2 bits in the top bits of bytes j-4 (scale) and j (min). */
static inline void kern_k4_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

/* Quant q (0..15) of element e (0..255) of a Q4_K block: sub-block j = e/32 lives in
 * qs[32*(j/2) ..] as low nibbles (j even) or high nibbles (j odd). */
static inline int kern_q4k_get(const struct block_q4_K *b, int e)
{
    return (b->qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) & 1))) & 0xf;
}

/* Quant q (0..31) of element e of a Q5_K block: low 4 bits as Q4_K, bit 4 is bit e/32
 * of qh[e%32]. */
static inline int kern_q5k_get(const struct block_q5_K *b, int e)
{
    int lo = (b->qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) & 1))) & 0xf;
    return lo | ((b->qh[e % 32] >> (e / 32)) & 1) << 4;
}

/* Quant q (0..63) of element e of a Q6_K block: in half h = e/128, element 32k + l has
 * its low 4 bits in ql[64h + 32(k&1) + l] (low nibble for k < 2, high for k >= 2) and
 * its high 2 bits at bit 2k of qh[32h + l]. */
static inline int kern_q6k_get(const struct block_q6_K *b, int e)
{
    int h = e / 128, k = (e / 32) & 3, l = e % 32;
    int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
    return lo | ((b->qh[32 * h + l] >> (2 * k)) & 3) << 4;
}

/* ---- types added later (appended; ggml's layouts) ---- */

/* 16 sub-blocks of 16; scales[j] = scale (low nibble) | min << 4;
 * value = d * sc * q - dmin * mn, q in 0..3 (see kern_q2k_get) */
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
/* 16 sub-blocks of 16 with 6-bit scales packed in scales[12] (kern_q3k_scale);
 * value = d * (sc - 32) * q, q in -4..3 from 2 low bits (qs) and a high bit (hmask)
 * that, when clear, subtracts 4 */
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
/* value = d * kern_iq4nl_values[q]; nibbles as Q4_0 */
struct block_iq4_nl { uint16_t d; uint8_t qs[QK32 / 2]; };
/* 8 sub-blocks of 32, 6-bit scales ls (4 low bits in scales_l, 2 high in scales_h);
 * value = d * (ls - 32) * kern_iq4nl_values[q]; sub-block j's nibbles in qs[16j..16j+15]
 * as Q4_0's */
struct block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
/* OCP microscaling FP4: value = 2^(e-128) * kern_mxfp4_values[q] (e2m1 doubled, so the
 * scale is half of E8M0's 2^(e-127)); nibbles as Q4_0 */
struct block_mxfp4 { uint8_t e; uint8_t qs[QK32 / 2]; };

static_assert(sizeof(struct block_q2_K) == 84, "q2_K block size");
static_assert(sizeof(struct block_q3_K) == 110, "q3_K block size");
static_assert(sizeof(struct block_iq4_nl) == 18, "iq4_nl block size");
static_assert(sizeof(struct block_iq4_xs) == 136, "iq4_xs block size");
static_assert(sizeof(struct block_mxfp4) == 17, "mxfp4 block size");

/* The non-linear 4-bit levels of IQ4_NL/IQ4_XS and the doubled e2m1 values of MXFP4. */
static const int8_t kern_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t kern_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-128) as float, as ggml computes it (e = 0 and 1 are subnormal). */
static inline float kern_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

/* Nibble q (0..15) of element e (0..31) of a 32-element block laid out as Q4_0's. */
static inline int kern_nib32_get(const uint8_t *qs, int e)
{
    return e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
}

/* 2-bit quant of element e of Q2_K/Q3_K: in half n = e/128, element 32k + l has it at
 * bits 2k of qs[32n + l]. */
static inline int kern_q2bits_get(const uint8_t *qs, int e)
{
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) & 3))) & 3;
}

/* Q3_K's quant of element e as 0..7 (the value is this minus 4): 2 low bits, and bit 2
 * from bit e/32 of hmask[e%32]. */
static inline int kern_q3k_get(const struct block_q3_K *b, int e)
{
    return kern_q2bits_get(b->qs, e) | ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
}

/* Q3_K's 6-bit scale j (0..15) as stored, 0..63 (the factor is this minus 32): 4 low bits
 * in the low (j < 8) or high nibble of scales[j % 8], 2 high bits at bits 2(j/4) of
 * scales[8 + j % 4]. */
static inline int kern_q3k_scale(const uint8_t *scales, int j)
{
    int lo = (scales[j % 8] >> (4 * (j / 8))) & 0xf;
    return lo | ((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* IQ4_XS's 6-bit scale of sub-block j (0..7), 0..63 (the factor is this minus 32). */
static inline int kern_iq4xs_scale(const struct block_iq4_xs *b, int j)
{
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | ((b->scales_h >> (2 * j)) & 3) << 4;
}

/* Nibble of element e (0..255) of an IQ4_XS block. */
static inline int kern_iq4xs_get(const struct block_iq4_xs *b, int e)
{
    return kern_nib32_get(b->qs + 16 * (e / 32), e % 32);
}

#endif
