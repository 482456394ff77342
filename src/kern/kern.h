/* Compute kernels over GGUF's tensor types: conversion, quantization, and the matrix
 * product that every linear layer of the engine goes through.
 *
 * Bitwise contract (what makes batching, speculation and pipelines testable by exact
 * comparison, see DESIGN.md): each output element y[b][r] = dot(W row r, x row b) is
 * computed by ONE canonical sequence of float operations that does not depend on the
 * batch size B, on which rows/threads compute it, or on the ISA path. Integer parts are
 * exact, so any SIMD arrangement of them is allowed; the float part is fixed:
 *
 *   Activations of quantized weight types are quantized per row to 8 bits first:
 *     ACT_Q8_32  (weights Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4): blocks of 32 values;
 *     ACT_Q8_256 (weights Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS): blocks of 256 values;
 *     each block: amax = max |x|; d = amax / 127.0f; id = amax ? 127.0f / amax : 0;
 *     q[i] = (int8) nearbyintf(x[i] * id)   (round half to even); plus the block's
 *     integer sums (sum of q over the block, or over each 16 for ACT_Q8_256).
 *   Dot of one weight row with one activation row, acc = 0.0f, blocks in order, every
 *   step one fmaf (never contracted otherwise), with dw = weight scale as float:
 *     Q8_0:  isum = sum w_q*x_q                          acc = fmaf(dw*dx, (float)isum, acc)
 *     Q4_0:  isum = sum (w_q-8)*x_q                      acc = fmaf(dw*dx, (float)isum, acc)
 *     Q5_0:  isum = sum (w_q-16)*x_q                     acc = fmaf(dw*dx, (float)isum, acc)
 *     Q4_1, Q5_1 (value = d*q + m): isum = sum w_q*x_q, xsum = sum x_q
 *            acc = fmaf(dw*dx, (float)isum, acc); acc = fmaf(m*dx, (float)xsum, acc)
 *     Q4_K, Q5_K (per 256: value = d*sc[j]*q - dmin*mn[j], 8 sub-blocks j of 32):
 *            isum = sum_j sc[j] * sum_{i in j} w_q*x_q;  msum = sum_j mn[j] * sum_{i in j} x_q
 *            acc = fmaf(d*dx, (float)isum, acc); acc = fmaf(-(dmin*dx), (float)msum, acc)
 *     Q6_K   (per 256: value = d*sc[j]*(q-32), 16 sub-blocks j of 16, sc signed):
 *            isum = sum_j sc[j] * sum_{i in j} (w_q-32)*x_q     acc = fmaf(d*dx, (float)isum, acc)
 *     Q2_K   (per 256: value = d*sc[j]*q - dmin*mn[j], 16 sub-blocks j of 16, q in 0..3):
 *            isum = sum_j sc[j] * sum_{i in j} w_q*x_q;  msum = sum_j mn[j] * bsums[j]
 *            acc = fmaf(d*dx, (float)isum, acc); acc = fmaf(-(dmin*dx), (float)msum, acc)
 *     Q3_K   (per 256: value = d*(sc[j]-32)*(q-4), 16 sub-blocks j of 16, q in 0..7):
 *            isum = sum_j (sc[j]-32) * sum_{i in j} (w_q-4)*x_q  acc = fmaf(d*dx, (float)isum, acc)
 *     IQ4_NL (value = d*kv[q], kv the 16 levels of kern_iq4nl_values):
 *            isum = sum kv[w_q]*x_q                      acc = fmaf(d*dx, (float)isum, acc)
 *     MXFP4  (value = s*kv[q], s = 2^(e-128) as kern_e8m0_half, kv kern_mxfp4_values):
 *            isum = sum kv[w_q]*x_q                      acc = fmaf(s*dx, (float)isum, acc)
 *     IQ4_XS (per 256: value = d*(ls[j]-32)*kv[q], 8 sub-blocks j of 32):
 *            isum = sum_j (ls[j]-32) * sum_{i in j} kv[w_q]*x_q  acc = fmaf(d*dx, (float)isum, acc)
 *     F32, F16, BF16 (x stays F32): 16 lanes; element k goes to lane k%16 in order of k:
 *            lane[k%16] = fmaf((float)w[k], x[k], lane[k%16]); then for s = 8,4,2,1:
 *            lane[l] = lane[l] + lane[l+s] for l < s; result lane[0].
 *   The int32 sums cannot overflow for these formats. (float)isum rounds to nearest.
 *
 * Paths: a scalar reference (*_ref, the definition above, on GGUF's own row layout),
 * AVX2+FMA, AVX-512 VNNI, and AMX where the OS grants tile state on x86-64; NEON,
 * NEON with the dot product (sdot) and NEON with the int8 matrix multiply (smmla) on ARM64. A type without a kernel on the best path
 * falls back to the next path that has one, finally the reference. Fast paths may keep
 * weights in a repacked layout prepared once at load (struct kern_mat). */
#ifndef CAIRN_KERN_KERN_H
#define CAIRN_KERN_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* ---- scalars ---- */
float kern_f16_to_f32(uint16_t h);
uint16_t kern_f32_to_f16(float f);   /* round to nearest even, as F16C does */
float kern_bf16_to_f32(uint16_t h);
uint16_t kern_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */

/* ---- rows in GGUF layout (reference code; fast enough for loading) ---- */

/* Converts n elements (a multiple of the block size) of type to float. */
int kern_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Quantizes n floats to type (any supported type incl. K-quants), bit-compatible with
 * GGUF's block layout, choosing scales to minimize squared error as llama.cpp's
 * quantizers do (not necessarily bit-identical to them). */
int kern_quantize_row(int type, const float *src, void *dst, int64_t n);

/* ---- activations ---- */

/* Bytes of one quantized activation row of n elements for products with weights of
 * `wtype` (F32 rows for float weight types). */
size_t kern_act_row_bytes(int wtype, int64_t n);

/* Activation formats: weights of equal kind share one quantized activation row. */
enum kern_act_kind { KERN_ACT_F32 = 0, KERN_ACT_Q8_32 = 1, KERN_ACT_Q8_256 = 2 };

static inline enum kern_act_kind kern_act_kind(int wtype)
{
    switch (wtype) {
    case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_Q8_0:
    case DT_IQ4_NL: case DT_MXFP4:
        return KERN_ACT_Q8_32;
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K:
    case DT_Q2_K: case DT_Q3_K: case DT_IQ4_XS:
        return KERN_ACT_Q8_256;
    default:
        return KERN_ACT_F32;
    }
}

/* Quantizes one activation row per the contract above. Deterministic and identical on
 * every path. */
void kern_act_quantize(int wtype, const float *x, void *xq, int64_t n);
/* The scalar definition of kern_act_quantize (what the SIMD variants are tested against). */
void kern_act_quantize_ref(int wtype, const float *x, void *xq, int64_t n);

/* ---- matrix product ---- */

/* A weight matrix [rows][cols] prepared for products: owns a repacked copy of the
 * weights when the chosen path uses one (then the caller may drop the source pages). */
struct kern_mat;

/* NEON: ARM64's baseline SIMD; NEON_DOT: with the ARMv8.2 dot product (sdot); NEON_I8MM:
 * with the int8 matrix multiply too (smmla for pairs of activation rows, sdot for one). */
enum kern_path { KERN_PATH_AUTO = 0, KERN_PATH_REF, KERN_PATH_AVX2, KERN_PATH_AVX512, KERN_PATH_AMX,
                 KERN_PATH_NEON, KERN_PATH_NEON_DOT, KERN_PATH_NEON_I8MM };

/* Prepares W (GGUF row layout, rows x cols of `type`) for the best path available on
 * this CPU (or `path` when not AUTO; CAIRN_EUNSUPPORTED if this CPU lacks it). When the
 * path needs no repacking, the kern_mat points at `data`, which must outlive it. */
int kern_mat_create(struct kern_mat **out, int type, const void *data, int64_t rows,
                    int64_t cols, enum kern_path path, char *err, size_t errlen);
void kern_mat_release(struct kern_mat *m);  /* accepts NULL */
/* Bytes of the weights the matrix owns (its repacked copy), 0 when it reads the caller's. */
size_t kern_mat_own_bytes(const struct kern_mat *m);
/* Moves the matrix's own copy of its weights to dst (kern_mat_own_bytes of room, aligned
 * to 64 bytes; the same bits): from then on the matrix reads dst, which the caller owns
 * and frees after kern_mat_release. A loader puts a model's matrices in one block this
 * way. Nothing is moved when kern_mat_own_bytes is 0. */
void kern_mat_move(struct kern_mat *m, void *dst);
int kern_mat_type(const struct kern_mat *m);
int64_t kern_mat_rows(const struct kern_mat *m);
int64_t kern_mat_cols(const struct kern_mat *m);
enum kern_path kern_mat_path(const struct kern_mat *m);
/* Bytes of weights one full product reads (for the roofline). */
size_t kern_mat_bytes(const struct kern_mat *m);
/* Rows must be split between threads at multiples of this (e.g. 16 for interleaved
 * layouts); the last part may end at `rows`. */
int kern_mat_row_align(const struct kern_mat *m);
/* The row alignment a matrix of `type` prepared for `path` (AUTO: as kern_mat_create
 * chooses) would have, known before preparing it: what a loader that prepares only some
 * rows of a matrix splits at. 1 for a type or path this CPU cannot prepare. */
int kern_row_align(int type, enum kern_path path);

/* y[b*ldy + r] = dot(W row r, activation row b) for r in [r0, r1), b in [0, B).
 * xq: B activation rows from kern_act_quantize, row b at xq + b*ldx bytes.
 * Reads each weight block once for all B rows (small B) or tiles (large B). Allocates
 * nothing; safe to call concurrently on disjoint row ranges. */
void kern_matmul(const struct kern_mat *m, const void *xq, size_t ldx, int B, float *y,
                 size_t ldy, int64_t r0, int64_t r1);

/* The reference product on GGUF row layout, same contract as kern_matmul. */
void kern_matmul_ref(int type, const void *w, int64_t cols, const void *xq, size_t ldx, int B,
                     float *y, size_t ldy, int64_t r0, int64_t r1);

/* Name of a path ("avx512"). */
const char *kern_path_name(enum kern_path p);
/* Best path this CPU supports. */
enum kern_path kern_best_path(void);
/* Whether this CPU (and build) runs path p (REF always). */
int kern_path_on_cpu(enum kern_path p);

#endif
