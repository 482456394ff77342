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

#endif
