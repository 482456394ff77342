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
 * Q6_K for G = 16 (AVX-512, KM_Q6_K_BYTES) instead: whole 6-bit quants, three vectors
 * per sub-block h: vector 3h+m (m = 0..2), byte 4r+t, holds element 4(4h+m)+t in bits
 * 0..5 and bits 2m..2m+1 of element 4(4h+3)+t in bits 6..7. Three k-groups come out
 * with one mask each and the fourth with six operations, where nibbles and high-bit
 * vectors took 13 for the four; the same 48 vectors, one sub-block after another.
 * Q8_0 quants are stored as q+128 (unsigned) for AVX-512 and as q for AVX2.
 * Scales: d, m, dmin as arrays of G half floats; Q4_K/Q5_K sub-block scales as G bytes
 * per sub-block (sc[j][r]); Q4_K/Q5_K mins and Q6_K scales in pairs of sub-blocks
 * (mn[j/2][r][j%2]), ready for 16-bit madds.
 *
 * Tile offsets in bytes, for G rows: */
#ifndef CAIRN_KERN_SIMD_MAT_H
#define CAIRN_KERN_SIMD_MAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

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
#define KM_Q6_K_BYTES(G) ((G) == 16) /* the quants as 6-bit bytes (above) */
#define KM_Q6_K_SC(G) (192 * (G))
#define KM_Q6_K_D(G) (208 * (G))
/* 210 * G bytes of data padded to a whole number of vectors (53: 3392 bytes for G = 16),
 * so that every tile starts on a vector's boundary: with 3360-byte tiles every other one
 * began mid-line, and on AMD Zen 4 Q6_K read DRAM at B = 1 slower (bench_kern_rate -t 2
 * -b 1 -r 3 131072: 31-33 GB/s a thread per CPU second against 23-27). */
#define KM_Q6_K_TILE(G) (212 * (G))

/* Types added later (kernels in mat_lowbit_*.c), quants stored as indices and widened in
 * registers: IQ4_NL/MXFP4 nibbles as Q4_0's (P = 4), IQ4_XS nibbles as Q4_K's (P = 8),
 * looked up in the level table by a byte shuffle; Q2_K/Q3_K 2-bit quants in one vector
 * per sub-block h of 16 (byte 4r+t, bits 2s..2s+1 = element 4(4h+s)+t, as Q6_K's high
 * bits), Q3_K's third bit in bit planes as Q5_K's fifth. Q2_K scale and min as the file
 * has them, one byte (scale | min << 4) per sub-block and row (G per sub-block, so a
 * tile is no larger than the blocks); Q3_K/IQ4_XS factors (scale - 32) as int8, G per
 * sub-block; MXFP4's E8M0 exponents as G bytes. */
#define KM_Q2_K_SC(G) (64 * (G))
#define KM_Q2_K_D(G) (80 * (G))
#define KM_Q2_K_DMIN(G) (82 * (G))
#define KM_Q2_K_TILE(G) (84 * (G))

#define KM_Q3_K_QH(G) (64 * (G))
#define KM_Q3_K_SC(G) (96 * (G))
#define KM_Q3_K_D(G) (112 * (G))
#define KM_Q3_K_TILE(G) (114 * (G))

#define KM_IQ4_NL_D(G) (16 * (G))
#define KM_IQ4_NL_TILE(G) (18 * (G))

#define KM_MXFP4_E(G) (16 * (G))
#define KM_MXFP4_TILE(G) (17 * (G))

#define KM_IQ4_XS_SC(G) (128 * (G))
#define KM_IQ4_XS_D(G) (136 * (G))
#define KM_IQ4_XS_TILE(G) (138 * (G))

/* Tile bytes of the types above, for G rows (0 for other types). */
static inline size_t km_lowbit_tile(int type, int G)
{
    switch (type) {
    case DT_Q2_K: return KM_Q2_K_TILE(G);
    case DT_Q3_K: return KM_Q3_K_TILE(G);
    case DT_IQ4_NL: return KM_IQ4_NL_TILE(G);
    case DT_MXFP4: return KM_MXFP4_TILE(G);
    case DT_IQ4_XS: return KM_IQ4_XS_TILE(G);
    default: return 0;
    }
}

/* Offsets in a low-bit tile of its sub-block scales (Q2_K, Q3_K, IQ4_XS) and of its
 * block scales (MXFP4: the shared exponents). */
static inline size_t km_lowbit_sc_off(int type, int G)
{
    return type == DT_Q2_K ? KM_Q2_K_SC(G) : type == DT_Q3_K ? KM_Q3_K_SC(G) : KM_IQ4_XS_SC(G);
}

static inline size_t km_lowbit_d_off(int type, int G)
{
    switch (type) {
    case DT_Q2_K: return KM_Q2_K_D(G);
    case DT_Q3_K: return KM_Q3_K_D(G);
    case DT_IQ4_NL: return KM_IQ4_NL_D(G);
    case DT_MXFP4: return KM_MXFP4_E(G);
    default: return KM_IQ4_XS_D(G);
    }
}

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
    /* B = 1 products of the AVX-512 path issue no software prefetch of the weights and
     * leave the stream to the hardware prefetcher (kern_mat_create: on AMD Zen 4) */
    bool b1_hw_prefetch;
    /* the AVX-512 path may use GFNI's byte affine transform (kern_mat_create: where the
     * CPU has it and CAIRN_GFNI is not off) */
    bool gfni;
};

/* A kernel over tiles [k0, k0+nblk) of one group, for NB activation rows (x at the
 * first of them, block k0), writing group rows [lo, hi) of y. With first == 0 it
 * resumes the accumulators stored in y by the previous call over the earlier blocks:
 * a float stored and reloaded is exact, so splitting k changes no bit. */
typedef void km_group_fn(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,
                         size_t ldx, float *y, size_t ldy, int lo, int hi, int first);

#ifndef KM_ACT_CHUNK
#define KM_ACT_CHUNK 4096     /* bytes of one activation row per k-chunk (large B) */
#endif
#define KM_W_CHUNK (192 << 10) /* bytes of weight tiles per row tile and k-chunk */

/* Runs fn over groups and activation rows in chunks of at most nb_max. With one chunk
 * the group's tiles stream once, k in registers. With more (prefill) it tiles: k-chunks
 * whose activation rows stay in L1, row tiles whose weights stay in L2 while every
 * chunk of activation rows passes over them. */
static inline void km_drive_tiles(km_group_fn *fn, int nb_max, const struct km_view *v,
                                  const uint8_t *x, size_t ldx, int B, float *y, size_t ldy,
                                  int64_t r0, int64_t r1, size_t act_block)
{
    const int G = v->G;
    int nch = (B + nb_max - 1) / nb_max;
    int64_t g0 = r0 / G, g1 = (r1 + G - 1) / G;
    int64_t kc = v->nblk, rt = 1;
    if (nch > 1) {
        kc = (int64_t)(KM_ACT_CHUNK / act_block);
        kc = kc < 1 ? 1 : kc > v->nblk ? v->nblk : kc;
        rt = (int64_t)(KM_W_CHUNK / ((size_t)kc * v->tile));
        rt = rt < 1 ? 1 : rt;
    }
    for (int64_t gt = g0; gt < g1; gt += rt) {
        int64_t gte = gt + rt < g1 ? gt + rt : g1;
        for (int64_t k0 = 0; k0 < v->nblk; k0 += kc) {
            int64_t kn = v->nblk - k0 < kc ? v->nblk - k0 : kc;
            for (int c = 0, b0 = 0; c < nch; c++) {
                int nb = (B - b0 + (nch - c) - 1) / (nch - c);
                for (int64_t g = gt; g < gte; g++) {
                    int lo = r0 > g * G ? (int)(r0 - g * G) : 0;
                    int hi = r1 < (g + 1) * G ? (int)(r1 - g * G) : G;
                    fn(nb, v->data + ((size_t)g * (size_t)v->nblk + (size_t)k0) * v->tile, kn,
                       x + (size_t)b0 * ldx + (size_t)k0 * act_block, ldx,
                       y + (size_t)b0 * ldy + (size_t)(g * G), ldy, lo, hi, k0 == 0);
                }
                b0 += nb;
            }
        }
    }
}

/* A kernel over NS (2..KM_STREAMS) whole groups at once for NB activation rows (x at
 * block 0, rows ldx bytes apart): the tiles of group s start at tiles[s], its G outputs
 * go to y[s] (activation row b's at y[s] + b * ldy). It reads block i of every group
 * before block i+1 of any, so a core keeps NS streams of misses in flight where one group
 * is one stream; each row's float steps are those of a single group's, so the bits are
 * too. */
typedef void km_streams_fn(int NS, int NB, const uint8_t *const *tiles, int64_t nblk,
                           const uint8_t *x, size_t ldx, float *const *y, size_t ldy);

#define KM_STREAMS 4 /* streams per thread of a decode product (B = 1) */

/* km_drive_tiles, but for up to streams_nb activation rows (what sfn takes) the whole
 * groups of [r0, r1) are cut into KM_STREAMS runs far apart in memory, walked together
 * by sfn, a group of each run in turn, as the probe of bwprobe.c reads DRAM fastest with
 * several streams a thread. Partial groups at either end go through fn. */
static inline void km_drive_streams(km_streams_fn *sfn, int streams_nb, km_group_fn *fn,
                                    int nb_max, const struct km_view *v, const uint8_t *x,
                                    size_t ldx, int B, float *y, size_t ldy, int64_t r0, int64_t r1,
                                    size_t act_block)
{
    const int G = v->G;
    if (B > streams_nb) {
        km_drive_tiles(fn, nb_max, v, x, ldx, B, y, ldy, r0, r1, act_block);
        return;
    }
    int64_t cur = r0;
    if (cur % G) { /* the partial first group */
        int64_t e = (cur / G + 1) * G < r1 ? (cur / G + 1) * G : r1;
        km_drive_tiles(fn, nb_max, v, x, ldx, B, y, ldy, cur, e, act_block);
        cur = e;
    }
    int64_t ga = cur / G, gb = r1 / G, n = gb - ga;
    if (n > 0) {
        int ns = n < KM_STREAMS ? (int)n : KM_STREAMS;
        int64_t len = n / ns, rem = n % ns, start[KM_STREAMS];
        for (int s = 0; s < ns; s++)
            start[s] = ga + s * len + (s < rem ? s : rem);
        const size_t gbytes = (size_t)v->nblk * v->tile;
        const uint8_t *tl[KM_STREAMS];
        float *ys[KM_STREAMS];
        for (int64_t j = 0; j <= len; j++) {
            int k = j < len ? ns : (int)rem; /* the last step: the runs one group longer */
            for (int s = 0; s < k; s++) {
                tl[s] = v->data + (size_t)(start[s] + j) * gbytes;
                ys[s] = y + (size_t)((start[s] + j) * G);
            }
            if (k >= 2)
                sfn(k, B, tl, v->nblk, x, ldx, ys, ldy);
            else if (k == 1)
                fn(B, tl[0], v->nblk, x, ldx, ys[0], ldy, 0, G, 1);
        }
        cur = gb * G;
    }
    if (cur < r1) /* the partial last group */
        km_drive_tiles(fn, nb_max, v, x, ldx, B, y, ldy, cur, r1, act_block);
}

/* One call of a float-weight kernel: R rows of w (row_bytes rb) times NB activation rows
 * over elements [k0, k0+kn). A single pass (first and last) keeps the 16 lanes of each
 * dot in registers; otherwise they are parked in `lanes` (16 floats per row and
 * activation row, (r*lstride + b)*16) between k-chunks, which changes no bit. */
struct km_fcall {
    const uint8_t *w;
    size_t rb;
    const uint8_t *x;
    size_t ldx;
    float *y;
    size_t ldy;
    int64_t k0, kn, cols;
    float *lanes;
    int lstride;
    int first, last;
};
typedef void km_rows_fn(int R, int NB, const struct km_fcall *c);

#define KM_F_KCHUNK 512 /* elements per k-chunk (large B), a multiple of 16 */
#define KM_F_ROWS 32    /* rows per row tile (large B) */
#define KM_F_BS_MAX 12  /* activation rows per lane scratch: at most 2 chunks */

/* Float weights: rows in steps of rf, activation rows in chunks of at most nbf. With
 * more than one chunk, row tiles of KM_F_ROWS and k-chunks keep weights and
 * activations in cache, with the lanes in a scratch on the stack (24 KiB). */
static inline void km_drive_rows(km_rows_fn *fn, int rf, int nbf, const struct km_view *v,
                                 const uint8_t *x, size_t ldx, int B, float *y, size_t ldy,
                                 int64_t r0, int64_t r1)
{
    struct km_fcall c = {.rb = v->row_bytes, .ldx = ldx, .ldy = ldy, .cols = v->cols};
    if (B <= nbf) {
        c.x = x;
        c.k0 = 0;
        c.kn = v->cols;
        c.first = c.last = 1;
        for (int64_t r = r0; r < r1; r += rf) {
            c.w = v->data + (size_t)r * v->row_bytes;
            c.y = y + r;
            fn(r1 - r < rf ? (int)(r1 - r) : rf, B, &c);
        }
        return;
    }
    float lanes[KM_F_ROWS * KM_F_BS_MAX * 16];
    int bs = 2 * nbf <= KM_F_BS_MAX ? 2 * nbf : nbf;
    c.lstride = bs;
    for (int64_t rt = r0; rt < r1; rt += KM_F_ROWS) {
        int64_t rte = rt + KM_F_ROWS < r1 ? rt + KM_F_ROWS : r1;
        for (int bs0 = 0; bs0 < B; bs0 += bs) {
            int nbs = B - bs0 < bs ? B - bs0 : bs;
            int nch = (nbs + nbf - 1) / nbf;
            for (int64_t k0 = 0; k0 < v->cols; k0 += KM_F_KCHUNK) {
                c.k0 = k0;
                c.kn = v->cols - k0 < KM_F_KCHUNK ? v->cols - k0 : KM_F_KCHUNK;
                c.first = k0 == 0;
                c.last = k0 + c.kn == v->cols;
                for (int ch = 0, b0 = bs0; ch < nch; ch++) {
                    int nb = (bs0 + nbs - b0 + (nch - ch) - 1) / (nch - ch);
                    for (int64_t r = rt; r < rte; r += rf) {
                        c.w = v->data + (size_t)r * v->row_bytes;
                        c.x = x + (size_t)b0 * ldx;
                        c.y = y + (size_t)b0 * ldy + r;
                        c.lanes = lanes + ((size_t)(r - rt) * (size_t)bs + (size_t)(b0 - bs0)) * 16;
                        fn(rte - r < rf ? (int)(rte - r) : rf, nb, &c);
                    }
                    b0 += nb;
                }
            }
        }
    }
}

/* Tile bytes for G rows of `type`, or 0 when the type has no interleaved layout among
 * those of kern_mat_avx*_run (km_lowbit_tile gives the low-bit types'). */
size_t kern_mat_tile_bytes(int type, int G);

/* The product of kern.h's kern_matmul on one path, for the types mat.c lets that path
 * take; arguments already checked (B >= 1, 0 <= r0 < r1 <= rows). Writes exactly the
 * rows [r0, r1) of each y row, whatever the alignment of r0 and r1. */
void kern_mat_avx512_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                         size_t ldy, int64_t r0, int64_t r1);
void kern_mat_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                       size_t ldy, int64_t r0, int64_t r1);
/* The same for Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 (mat_lowbit_*.c). */
void kern_mat_lowbit_avx512_run(const struct km_view *v, const void *xq, size_t ldx, int B,
                                float *y, size_t ldy, int64_t r0, int64_t r1);
void kern_mat_lowbit_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B,
                              float *y, size_t ldy, int64_t r0, int64_t r1);
/* ARM64, 4-row groups (G = 4), Q8_0 stored signed: mat_neon.c without the dot product
 * instructions, mat_neondot.c with sdot, mat_neoni8mm.c with smmla too. */
void kern_mat_neon_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                       size_t ldy, int64_t r0, int64_t r1);
void kern_mat_neondot_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                          size_t ldy, int64_t r0, int64_t r1);
void kern_mat_neoni8mm_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                           size_t ldy, int64_t r0, int64_t r1);
/* The types the NEON paths compute (false on other architectures). */
bool kern_mat_neon_has_type(int type);

#endif
