/* Vector helpers of the forward pass (norms, RoPE, attention), each with one fixed
 * order of float operations so results are identical on every path:
 *   dot products: 16 lanes, element k into lane k%16 with lane += a*b (a multiply then
 *   an add, never fused), then for s = 8,4,2,1: lane[l] += lane[l+s]; result lane[0].
 *   exp: the steps of VEC_EXP below (fused multiply-adds where it says fma, which every
 *   path has: the scalar reference calls fmaf), about 2 ulp from exp over all floats.
 * vec_init picks the SIMD variant for this CPU; the scalar ones are the reference. */
#ifndef CAIRN_ENGINE_VEC_H
#define CAIRN_ENGINE_VEC_H

#include <stdint.h>

/* Lines a tile product asks the memory for while it runs (software prefetch), so that a
 * decode's reads of the next K and V stay in flight during its arithmetic: `lines` lines of
 * 64 bytes from `at`. No result depends on it; a variant may ask for them all at once
 * (vec_prefetch_all) or spread them over its steps (the AVX-512 one: asked for in one burst
 * they filled the core's miss buffers, and the arithmetic waited for the reads instead of
 * overlapping them). */
struct vec_prefetch {
    const char *at;
    int64_t lines;
};

static inline void vec_prefetch_all(const struct vec_prefetch *pf)
{
    for (int64_t i = 0; pf && i < pf->lines; i++)
        __builtin_prefetch(pf->at + 64 * i, 0, 2);
}

struct vec_ops {
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*exp_sub)(float *x, float sub, int64_t n);          /* x[k] = exp(x[k] - sub) */
    void (*silu_mul)(float *a, const float *b, int64_t n);    /* a[k] = silu(a[k]) * b[k] */

    /* Tile products of attention (attn.h), K and V of type DT_F16, DT_F32, DT_Q8_0 or
     * DT_Q4_0 (quantized: head_dim a multiple of 32). Each result element is a chain of
     * fused multiply-adds in a fixed order, so how a variant groups rows and keys into
     * registers changes no bit.
     *   attn_qk: s[r*lds + j] for r < rows, j < n: with K(d, j) the element at kt[d*ld + j]
     *     (keys transposed: the n keys of one dimension are contiguous),
     *     F16/F32 (q floats, row r at q + r*ldq):
     *       fma(q[r*ldq + hd-1], K(hd-1, j), ... fma(q[r*ldq], K(0, j), 0));
     *     Q4_0 (q floats): per 32 dimensions c in turn, u_c = that chain over the 32 dims with
     *     the integer codes as K, then s = fma(u_c, scale(c, j), s) from s = 0, where the half
     *     scale(c, j) is at ks[c*ld + j]; byte kt[(16c + i)*ld + j] holds dims 32c+i (low
     *     nibble) and 32c+16+i (high), each nibble minus 8;
     *     Q8_0 (q rows made by vec_q8_query, row r at (const char *)q + r*ldq, ldq in bytes):
     *     integer dot products, as llama.cpp's Q8_0 x Q8_0: per 32 dimensions c in turn,
     *     i_c = sum of qcode(d) * K(d, j) over the 32 dims (exact, in int32), then
     *     s = fma((float)i_c, qd_c * scale(c, j), s) from s = 0 (qd_c the query block's
     *     float scale, the product of the two scales rounded once); K(d, j) is the int8 at
     *     kt[4*((d/4)*ld + j) + d%4] (a key's 4 dimensions together, for 4-way byte dot
     *     products), the half scale(c, j) at ks[c*ld + j].
     *     Reads no K(d, j) with j >= n.
     *   attn_pv: for r < rows, for j = 0 .. n[r]-1 in turn, o[r*ldo + i] += p[r*ldp + j] *
     *     V_j[i] as o = fma(p, V_j[i], o) (F16/F32, v[j] the row of hd elements), or per 32
     *     columns c with w = p * scale: o = fma(w, code, o) (v[j] hd/32 GGUF blocks).
     *   softmax_tile: m = max of s[0..n) (n >= 1; NaN unspecified), s[j] = exp(s[j] - m)
     *     as VEC_SEXP below (not exp_sub's exp), *l = their sum in dot_f32's 16 lanes (s[j]
     *     into lane j % 16, then the tree); returns m. */
    void (*attn_qk)(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                    int64_t hd, int type, float *s, int64_t lds);
    void (*attn_pv)(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, int type, const struct vec_prefetch *pf);
    float (*softmax_tile)(float *s, int64_t n, float *l);
    /* attn_qk over keys in blocks of bt: key j is column j % bt of block j / bt, whose K
     * (transposed, ld = bt) is at kt[j / bt] and its scales at ks[j / bt] (quantized
     * types); the same bits as attn_qk on the keys gathered. Lets a decode's few rows run
     * over several blocks at once. attn_pv and attn_qk_paged ask for pf's lines (NULL: none). */
    void (*attn_qk_paged)(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks,
                          int bt, int n, int64_t hd, int type, float *s, int64_t lds, const struct vec_prefetch *pf);
    /* y[r*ldy + k] = x[r*ldx + k] as float for r < rows, k < n (F16 to F32 is exact: every
     * variant gives the same bits). */
    void (*f16_to_f32)(const uint16_t *x, int64_t ldx, float *y, int64_t ldy, int rows, int64_t n);
    /* vec_q8_query below, the same bytes (a prefill quantizes every query row once a
     * layer: as a scalar loop it took longer than the byte dot products themselves). */
    void (*q8_query)(const float *x, int64_t hd, void *row);
    /* y[k*ldy] = x[k] as F16 for k < n, rounded to nearest even: kern_f32_to_f16's bits
     * (F16C's conversion) on every variant. A KV cache write: ldy > 1 for K's transposed
     * rows (as a scalar call per element it was most of a decode's lone work per layer). */
    void (*f32_to_f16)(const float *x, int64_t n, uint16_t *y, int64_t ldy);
    /* attn_pv of rows that all see keys [0, n) of F16 or F32 V, from zero (acc: each
     * element's chain from 0), merged into o as attn.h merges a tile's partial:
     * o[r*ldo + i] = o[r*ldo + i] * f[2r] + acc * f[2r+1] (two multiplies, then an add). The
     * same bits as attn_pv into a cleared o_t, then that merge; saves a prefill tile's clearing,
     * store and reload of o_t. NULL in a variant without it. */
    void (*attn_pv_merge)(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, int n,
                          const void *const *v, int64_t hd, int type, const float *f);
    /* softmax_tile of rows r < rows, row r at s + r*lds over n[r] (>= 1) scores: m[r] its
     * return, l[r] its sum; the same bits. A variant may find a row's max while it takes the
     * exps of the row before (each row's max waited on its reduction). NULL in a variant
     * without it. */
    void (*softmax_rows)(float *s, int64_t lds, int rows, const int32_t *n, float *m, float *l);
    /* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7) of the biased
     * gate and up, for k < n, each element in these steps:
     *   x = g[k] + bg[k], y = u[k] + bu[k];
     *   x = x < 7 ? x : 7 (a NaN x gives 7); y = y < -7 ? -7 : y > 7 ? 7 : y (a NaN stays);
     *   g[k] = x / (1 + exp(1.702 * -x)) * (y + 1), exp as VEC_EXP below. */
    void (*swiglu_oai)(float *g, const float *u, const float *bg, const float *bu, int64_t n);
};

/* A query row for Q8_0 K (attn_qk): per 32 dimensions c, GGUF Q8_0's rounding of x as
 * llama.cpp quantizes activations, but with the scale kept as a float:
 *   amax = max |x[d]| over the block, qd_c = amax / 127, id = qd_c != 0 ? 1 / qd_c : 0,
 *   qcode(d) = roundf(x[d] * id) (a NaN gives 0; beyond +-127, only reached through an
 *   infinite id, +-127).
 * The row is VEC_Q8_ROW_BYTES(hd) bytes (hd a multiple of 32; rows 4-byte aligned): hd
 * int8 codes, hd/32 floats qd_c, then hd/32 int32 of 128 times the block's sum of codes
 * (what a variant's unsigned-times-signed byte products subtract). This is the reference;
 * vec_ops q8_query of every variant does the same steps and gives the same bytes. */
#define VEC_Q8_ROW_BYTES(hd) ((hd) + 8 * ((hd) / 32))
void vec_q8_query(const float *x, int64_t hd, void *row);

/* exp(t) in fixed steps (Cephes' expf: t clamped to [EXP_LO, EXP_HI], n = t*log2(e)
 * rounded to nearest even by adding and subtracting 1.5*2^23, r = t - n*ln2 in two fma
 * steps, a degree-7 polynomial in r, times 2^n built in the exponent bits). Inputs below
 * EXP_LO give about 1.6e-38 instead of a smaller number (or 0), above EXP_HI about
 * 1.65e38 instead of a larger one (or inf): no caller tells these apart. NaN stays NaN.
 * (The shift of the exponent works mod 2^32, so the NaN case builds no undefined value.)
 * silu(a) = (a / (1 + exp(-a))). */
#define VEC_EXP_LO (-87.0f)
#define VEC_EXP_HI 88.0f
#define VEC_EXP_LOG2E 1.44269504088896341f
#define VEC_EXP_ROUND 12582912.0f
#define VEC_EXP_C1 0.693359375f
#define VEC_EXP_C2 (-2.12194440e-4f)
#define VEC_EXP_P0 1.9875691500E-4f
#define VEC_EXP_P1 1.3981999507E-3f
#define VEC_EXP_P2 8.3334519073E-3f
#define VEC_EXP_P3 4.1665795894E-2f
#define VEC_EXP_P4 1.6666665459E-1f
#define VEC_EXP_P5 5.0000001201E-1f

/* The softmax's exp (softmax_tile), for t = s - max <= 0: cheaper than VEC_EXP (13
 * operations against 19; about a sixth of prefill attention's time went to exp) and as exact
 * for these inputs (at most 1.95 ulp, relative error 1.8e-7, over every float in
 * [-87, 0] against double exp). Every path does these steps, fused where it says fma:
 *   t = max(SEXP_LO, t) (a NaN t passes, as VEC_EXP's clamp);
 *   tr = fma(t, LOG2E, ROUND): n = tr - ROUND is t*log2(e) rounded to nearest even, once;
 *   r = fma(n, -C1, t), r = fma(n, -C2, r) (VEC_EXP's two steps);
 *   p = fma(S5, r, S4), p = fma(p, r, S3), ..., p = fma(p, r, S0): degree 5, minimax
 *     on [-ln2/2, ln2/2] (the coefficients of Arm's optimized-routines vector expf);
 *   2^n's bits = (tr's bits << 23) + (127 << 23) mod 2^32 (tr's low mantissa bits are n
 *     plus 0x400000, whose shift vanishes), result p * 2^n.
 * t in [-87, 0] gives n in [-126, 0], so 2^n is a normal float; t < -87 gives exp(-87),
 * about 1.6e-38 (a weight no sum tells from 0). t > 0 is outside the contract. */
#define VEC_SEXP_LO (-87.0f)
#define VEC_SEXP_S0 1.0f
#define VEC_SEXP_S1 0x1.ffffecp-1f
#define VEC_SEXP_S2 0x1.fffdb6p-2f
#define VEC_SEXP_S3 0x1.555e66p-3f
#define VEC_SEXP_S4 0x1.573e2ep-5f
#define VEC_SEXP_S5 0x1.0e4020p-7f

/* The reference (scalar) variant. */
const struct vec_ops *vec_ops_ref(void);
/* A variant by name ("ref", "avx2", "avx512", "neon"; "avx512-novnni": the AVX-512 one
 * without VNNI's byte dot products, as a CPU without them runs it), or NULL when this CPU
 * lacks it. */
const struct vec_ops *vec_ops_variant(const char *name);
/* The fastest variant this CPU runs. */
const struct vec_ops *vec_ops_best(void);

#endif
