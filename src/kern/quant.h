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

#endif
