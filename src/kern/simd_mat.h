/* Private to src/kern: the interleaved weight layout of the SIMD paths, shared by the
 * repacker (mat.c) and the kernels (mat_avx2.c, mat_avx512.c).
 *
 * Rows are taken in groups of G (16 for AVX-512: one zmm of int32 lanes; 8 for AVX2);
 * the last group is padded with zero rows. The matrix is stored group after group, and
 * within a group block after block (32 or 256 elements), one tile per (group, block),
 * so a kernel streams one group's tiles in order.
 *
 * Within a tile, a "vector" is 4*G bytes: for one k-group of 4 consecutive elements,
 * row r's 4 quants at bytes 4r..4r+3. A VPDPBUSD (or PMADDUBSW+PMADDWD) of a vector
 * against 4 broadcast activation bytes gives each row's partial sum in its own int32
 * lane, so a block's integer sums need no horizontal reduction.
 *
 * 4-bit parts are kept packed: a nibble vector holds two k-groups, kg_lo in the low
 * nibbles and kg_hi in the high ones. With P k-groups per pairing unit, nibble vector
 * v = u*P + p holds kg_lo = 2uP + p and kg_hi = 2uP + P + p (P = 4 for Q4_0/Q4_1/Q5_0/
 * Q5_1: the two halves of a block; P = 8 for Q4_K/Q5_K: sub-blocks 2u and 2u+1;
 * P = 4 for Q6_K: sub-blocks 2u and 2u+1 of 16 elements).
 * Fifth bits (Q5_*): bit planes, one vector per 8 k-groups 8P..8P+7 (one per Q5_0/Q5_1
 * block, 8 per Q5_K super-block): byte 4r+t, bit s = bit 4 of element 4(8P+s)+t of row r.
 * Q6_K high bits: one vector per sub-block h (16 elements = 4 k-groups), byte 4r+t
 * holds bits 4..5 of element 4(4h+s)+t at bits 2s..2s+1, s = 0..3.
 * Q8_0 quants are stored as q+128 (unsigned) for AVX-512 and as q for AVX2.
 * Scales: d, m, dmin as arrays of G half floats; Q4_K/Q5_K sub-block scales as G bytes
 * per sub-block (sc[j][r]); Q4_K/Q5_K mins and Q6_K scales in pairs of sub-blocks
 * (mn[j/2][r][j%2]), ready for 16-bit madds.
 *
 * Tile offsets in bytes, for G rows: */
#ifndef CAIRN_KERN_SIMD_MAT_H
#define CAIRN_KERN_SIMD_MAT_H

#include <stddef.h>
#include <stdint.h>

#define KM_Q4_0_D(G) (16 * (G))
#define KM_Q4_0_TILE(G) (18 * (G))

#define KM_Q4_1_D(G) (16 * (G))
#define KM_Q4_1_M(G) (18 * (G))
#define KM_Q4_1_TILE(G) (20 * (G))

#define KM_Q5_0_QH(G) (16 * (G))
#define KM_Q5_0_D(G) (20 * (G))
#define KM_Q5_0_TILE(G) (22 * (G))

#define KM_Q5_1_QH(G) (16 * (G))
#define KM_Q5_1_D(G) (20 * (G))
#define KM_Q5_1_M(G) (22 * (G))
#define KM_Q5_1_TILE(G) (24 * (G))

#define KM_Q8_0_D(G) (32 * (G))
#define KM_Q8_0_TILE(G) (34 * (G))

#define KM_Q4_K_SC(G) (128 * (G))
#define KM_Q4_K_MN(G) (136 * (G))
#define KM_Q4_K_D(G) (144 * (G))
#define KM_Q4_K_DMIN(G) (146 * (G))
#define KM_Q4_K_TILE(G) (148 * (G))

#define KM_Q5_K_QH(G) (128 * (G))
#define KM_Q5_K_SC(G) (160 * (G))
#define KM_Q5_K_MN(G) (168 * (G))
#define KM_Q5_K_D(G) (176 * (G))
#define KM_Q5_K_DMIN(G) (178 * (G))
#define KM_Q5_K_TILE(G) (180 * (G))

#define KM_Q6_K_QH(G) (128 * (G))
#define KM_Q6_K_SC(G) (192 * (G))
#define KM_Q6_K_D(G) (208 * (G))
#define KM_Q6_K_TILE(G) (210 * (G))

/* What a kernel needs of a kern_mat. Quantized types: `data` holds the tiles above
 * (ngroups * nblk tiles of `tile` bytes). Float types (F32/F16/BF16): `data` is the
 * GGUF row-major matrix, rows of `row_bytes`. */
struct km_view {
    int type;
    int G;
    int64_t rows, cols;
    int64_t nblk;      /* blocks per row */
    size_t tile;       /* bytes per (group, block) tile */
    size_t row_bytes;  /* float types */
    const uint8_t *data;
};

/* Tile bytes for G rows of `type`, or 0 when the type has no interleaved layout. */
size_t kern_mat_tile_bytes(int type, int G);

/* The product of kern.h's kern_matmul on one path, for the types mat.c lets that path
 * take; arguments already checked (B >= 1, 0 <= r0 < r1 <= rows). Writes exactly the
 * rows [r0, r1) of each y row, whatever the alignment of r0 and r1. */
void kern_mat_avx512_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                         size_t ldy, int64_t r0, int64_t r1);
void kern_mat_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                       size_t ldy, int64_t r0, int64_t r1);

#endif
