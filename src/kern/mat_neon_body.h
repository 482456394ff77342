/* The NEON kernels of kern_matmul over the 4-row interleaved layout (simd_mat.h, G = 4:
 * one 16-byte vector holds 4 quants of each of the 4 rows, so one int32 lane per row).
 * Included three times, with NEON_RUN naming the entry point: by mat_neon.c (ARMv8-A
 * NEON: SMULL pairs and SADALP), by mat_neondot.c with NEON_DOT defined (ARMv8.2-A SDOT
 * by element) and by mat_neoni8mm.c with NEON_I8MM too (SMMLA for each pair of
 * activation rows: two k-groups of two weight rows zipped into one 2x8 operand, against
 * 8 quants of each of the two activation rows; an odd activation row left over takes
 * SDOT). Integer sums are exact either way; the float steps are those of kern.h, 4 rows
 * at a time (FMLA is a fused multiply-add, SCVTF rounds to nearest), so every output is
 * bitwise the reference's.
 *
 * Quants enter the products signed: Q8_0 as stored (the repacker adds no bias for G = 4),
 * 4- and 5-bit quants as their unsigned value (< 32), Q6_K as q - 32, Q2_K's 0..3 and
 * Q3_K's 0..7 (value + 4) as they are, the levels of IQ4_NL/IQ4_XS/MXFP4 signed out of a
 * table lookup (TBL). A plain-NEON pair sum is at most 2 * 128 * 127 = 32512, within
 * int16. */
#include <arm_neon.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

#define G 4
#define VB 16      /* bytes per vector: 4 rows x 4 quants */
#define NB_MAX 4   /* activation rows per pass over a group's tiles (quantized types) */
#define NBF_MAX 4  /* activation rows per pass (float types) */
#define RF 1       /* weight rows per pass (float types) */

#define INLINE static inline __attribute__((always_inline))

#ifdef NEON_DOT
/* acc[r] += sum_t w[4r+t] * x[4*lane+t] */
#define DOT4(acc, w, xv, lane) vdotq_laneq_s32(acc, w, xv, lane)
#else
INLINE int32x4_t dot4_bcast(int32x4_t acc, int8x16_t w, int8x16_t xb)
{
    int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(xb));
    int16x8_t hi = vmull_high_s8(w, xb);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi)); /* lane r: the 4 products of row r */
}
#define DOT4(acc, w, xv, lane)                                                             \
    dot4_bcast(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xv), lane)))
#endif

/* Four k-groups of 4 quants (w0..w3) against the 16 activation bytes xv, in order. */
#define DOT4X4(acc, w0, w1, w2, w3, xv)                                                    \
    do {                                                                                   \
        acc = DOT4(acc, w0, xv, 0);                                                        \
        acc = DOT4(acc, w1, xv, 1);                                                        \
        acc = DOT4(acc, w2, xv, 2);                                                        \
        acc = DOT4(acc, w3, xv, 3);                                                        \
    } while (0)

INLINE uint8x16_t load16(const uint8_t *p) { return vld1q_u8(p); }

/* s[b] += the integer dot products, one int32 lane per weight row, of nk k-groups of
 * weights w[0..nk) (nk = 4 or 8) with activation row b's quants xp[b][0 .. 4nk), for
 * b < NB. */
INLINE void dots(const int NB, const int nk, const int8x16_t *w, const int8_t *const *xp,
                 int32x4_t *s)
{
    int b = 0;
#ifdef NEON_I8MM
    if (NB >= 2) {
        /* zip k-groups 2m, 2m+1: rows 0-1 (wz01) and 2-3 (wz23), 8 quants each */
        int8x16_t wz01[4], wz23[4];
        for (int m = 0; m < nk / 2; m++) {
            int32x4_t a = vreinterpretq_s32_s8(w[2 * m]), c = vreinterpretq_s32_s8(w[2 * m + 1]);
            wz01[m] = vreinterpretq_s8_s32(vzip1q_s32(a, c));
            wz23[m] = vreinterpretq_s8_s32(vzip2q_s32(a, c));
        }
        for (; b + 1 < NB; b += 2) {
            int32x4_t a01 = vdupq_n_s32(0), a23 = vdupq_n_s32(0);
            for (int m = 0; m < nk / 2; m += 2) {
                int64x2_t x0 = vreinterpretq_s64_s8(vld1q_s8(xp[b] + 8 * m));
                int64x2_t x1 = vreinterpretq_s64_s8(vld1q_s8(xp[b + 1] + 8 * m));
                int8x16_t lo = vreinterpretq_s8_s64(vzip1q_s64(x0, x1));
                int8x16_t hi = vreinterpretq_s8_s64(vzip2q_s64(x0, x1));
                a01 = vmmlaq_s32(a01, wz01[m], lo);
                a23 = vmmlaq_s32(a23, wz23[m], lo);
                a01 = vmmlaq_s32(a01, wz01[m + 1], hi);
                a23 = vmmlaq_s32(a23, wz23[m + 1], hi);
            }
            /* a01 = {r0.b, r0.b+1, r1.b, r1.b+1}, a23 the same for rows 2, 3 */
            s[b] = vaddq_s32(s[b], vuzp1q_s32(a01, a23));
            s[b + 1] = vaddq_s32(s[b + 1], vuzp2q_s32(a01, a23));
        }
    }
#endif
    for (; b < NB; b++) {
        int32x4_t acc = s[b];
        for (int q = 0; q < nk; q += 4) {
            int8x16_t xv = vld1q_s8(xp[b] + 4 * q);
            DOT4X4(acc, w[q], w[q + 1], w[q + 2], w[q + 3], xv);
        }
        s[b] = acc;
    }
}


INLINE float32x4_t half4(const uint8_t *p)
{
    uint16_t h[4];
    memcpy(h, p, sizeof h);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* Bit s of each byte moved to bit 4, others cleared (s in 0..7). */
INLINE uint8x16_t bit4_of(uint8x16_t plane, int s)
{
    return vandq_u8(vshlq_u8(plane, vdupq_n_s8((int8_t)(4 - s))), vdupq_n_u8(0x10));
}

/* Four unsigned bytes (one per row) widened to int32 lanes. */
INLINE int32x4_t u8x4_to_s32(const uint8_t *p)
{
    uint8_t b[8] = {0};
    memcpy(b, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vld1_u8(b)))));
}

/* Scales stored in pairs (x[2r + j%2] for sub-blocks 2u, 2u+1): the two as int32 lanes. */
INLINE void pair_s32(const uint8_t *p, bool is_signed, int32x4_t *even, int32x4_t *odd)
{
    int16x8_t v = is_signed ? vmovl_s8(vld1_s8((const int8_t *)p))
                            : vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p)));
    *even = vmovl_s16(vget_low_s16(vuzp1q_s16(v, v)));
    *odd = vmovl_s16(vget_low_s16(vuzp2q_s16(v, v)));
}

/* The rows [lo, hi) of one group of 4 (other lanes neither read nor written). */
INLINE void store_rows(float *y, int lo, int hi, float32x4_t v)
{
    if (lo == 0 && hi == G) {
        vst1q_f32(y, v);
        return;
    }
    float t[G];
    vst1q_f32(t, v);
    for (int r = lo; r < hi; r++)
        y[r] = t[r];
}

INLINE float32x4_t load_rows(const float *y, int lo, int hi)
{
    if (lo == 0 && hi == G)
        return vld1q_f32(y);
    float t[G] = {0};
    for (int r = lo; r < hi; r++)
        t[r] = y[r];
    return vld1q_f32(t);
}

/* ---- legacy types: blocks of 32, ACT_Q8_32 activations ---- */

INLINE void group_q32(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                      const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const size_t tile = type == DT_Q4_0   ? KM_Q4_0_TILE(G)
                        : type == DT_Q4_1 ? KM_Q4_1_TILE(G)
                        : type == DT_Q5_0 ? KM_Q5_0_TILE(G)
                        : type == DT_Q5_1 ? KM_Q5_1_TILE(G)
                                          : KM_Q8_0_TILE(G);
    const size_t doff = type == DT_Q4_0   ? KM_Q4_0_D(G)
                        : type == DT_Q4_1 ? KM_Q4_1_D(G)
                        : type == DT_Q5_0 ? KM_Q5_0_D(G)
                        : type == DT_Q5_1 ? KM_Q5_1_D(G)
                                          : KM_Q8_0_D(G);
    const size_t moff = type == DT_Q4_1 ? KM_Q4_1_M(G) : KM_Q5_1_M(G);
    const size_t qhoff = type == DT_Q5_0 ? KM_Q5_0_QH(G) : KM_Q5_1_QH(G);
    const bool q5 = type == DT_Q5_0 || type == DT_Q5_1;
    const bool has_m = type == DT_Q4_1 || type == DT_Q5_1;
    /* isum = sum q*x - off*xsum for Q4_0/Q5_0 */
    const int off = type == DT_Q4_0 ? 8 : type == DT_Q5_0 ? 16 : 0;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);

    float32x4_t acc[NB_MAX];
    for (int b = 0; b < NB; b++)
        acc[b] = first ? vdupq_n_f32(0.0f) : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        __builtin_prefetch(t + 4 * tile);
        int8x16_t w[8]; /* k-group kg of the block: 4 quants of each row */
        if (type == DT_Q8_0) {
            for (int kg = 0; kg < 8; kg++)
                w[kg] = vreinterpretq_s8_u8(load16(t + VB * kg));
        } else {
            uint8x16_t plane = q5 ? load16(t + qhoff) : vdupq_n_u8(0);
            for (int v = 0; v < 4; v++) {
                uint8x16_t n = load16(t + VB * v);
                uint8x16_t wl = vandq_u8(n, m4), wh = vshrq_n_u8(n, 4);
                if (q5) {
                    wl = vorrq_u8(wl, bit4_of(plane, v));
                    wh = vorrq_u8(wh, bit4_of(plane, v + 4));
                }
                w[v] = vreinterpretq_s8_u8(wl);
                w[v + 4] = vreinterpretq_s8_u8(wh);
            }
        }
        float32x4_t d = half4(t + doff);
        float32x4_t m = has_m ? half4(t + moff) : d;
        const struct act_q8_32 *xa[NB_MAX];
        const int8_t *xp[NB_MAX];
        int32x4_t s[NB_MAX];
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_32 *)(x + (size_t)b * ldx) + i;
            xp[b] = xa[b]->q;
            s[b] = vdupq_n_s32(-off * xa[b]->sum);
        }
        dots(NB, 8, w, xp, s);
        for (int b = 0; b < NB; b++) {
            acc[b] = vfmaq_f32(acc[b], vmulq_n_f32(d, xa[b]->d), vcvtq_f32_s32(s[b]));
            if (has_m)
                acc[b] = vfmaq_f32(acc[b], vmulq_n_f32(m, xa[b]->d), vdupq_n_f32((float)xa[b]->sum));
        }
    }
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

/* ---- K-quants: super-blocks of 256, ACT_Q8_256 activations ---- */

INLINE void group_k(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                    const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const bool k5 = type == DT_Q5_K;
    const size_t tile = k5 ? KM_Q5_K_TILE(G) : KM_Q4_K_TILE(G);
    const size_t scoff = k5 ? KM_Q5_K_SC(G) : KM_Q4_K_SC(G);
    const size_t mnoff = k5 ? KM_Q5_K_MN(G) : KM_Q4_K_MN(G);
    const size_t doff = k5 ? KM_Q5_K_D(G) : KM_Q4_K_D(G);
    const size_t dminoff = k5 ? KM_Q5_K_DMIN(G) : KM_Q4_K_DMIN(G);
    const uint8x16_t m4 = vdupq_n_u8(0x0f);

    float32x4_t acc[NB_MAX];
    for (int b = 0; b < NB; b++)
        acc[b] = first ? vdupq_n_f32(0.0f) : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        __builtin_prefetch(t + 2 * tile);
        const struct act_q8_256 *xa[NB_MAX];
        int32x4_t is[NB_MAX], ms[NB_MAX];
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
            is[b] = ms[b] = vdupq_n_s32(0);
        }
        for (int j = 0; j < 8; j++) {
            /* sub-block j: nibble vectors 8*(j/2) + p (low nibbles for even j) */
            const uint8_t *tq = t + VB * 8 * (j / 2);
            uint8x16_t plane = k5 ? load16(t + KM_Q5_K_QH(G) + VB * j) : vdupq_n_u8(0);
            int8x16_t w[8];
            for (int p = 0; p < 8; p++) {
                uint8x16_t n = load16(tq + VB * p);
                n = j & 1 ? vshrq_n_u8(n, 4) : vandq_u8(n, m4);
                if (k5)
                    n = vorrq_u8(n, bit4_of(plane, p));
                w[p] = vreinterpretq_s8_u8(n);
            }
            int32x4_t sc = u8x4_to_s32(t + scoff + G * j);
            const int8_t *xp[NB_MAX];
            int32x4_t s[NB_MAX];
            for (int b = 0; b < NB; b++) {
                xp[b] = xa[b]->q + 32 * j;
                s[b] = vdupq_n_s32(0);
            }
            dots(NB, 8, w, xp, s);
            for (int b = 0; b < NB; b++)
                is[b] = vmlaq_s32(is[b], s[b], sc);
        }
        /* msum = sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
        for (int u = 0; u < 4; u++) {
            int32x4_t mn_even, mn_odd;
            pair_s32(t + mnoff + 2 * G * u, false, &mn_even, &mn_odd);
            for (int b = 0; b < NB; b++) {
                const int16_t *bs = xa[b]->bsums + 4 * u; /* sub-blocks 2u, 2u+1: 4 sums of 16 */
                ms[b] = vmlaq_n_s32(ms[b], mn_even, (int32_t)bs[0] + bs[1]);
                ms[b] = vmlaq_n_s32(ms[b], mn_odd, (int32_t)bs[2] + bs[3]);
            }
        }
        float32x4_t d = half4(t + doff), dmin = half4(t + dminoff);
        for (int b = 0; b < NB; b++) {
            acc[b] = vfmaq_f32(acc[b], vmulq_n_f32(d, xa[b]->d), vcvtq_f32_s32(is[b]));
            acc[b] = vfmaq_f32(acc[b], vnegq_f32(vmulq_n_f32(dmin, xa[b]->d)), vcvtq_f32_s32(ms[b]));
        }
    }
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

INLINE void group_q6k(const int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,
                      size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const size_t tile = KM_Q6_K_TILE(G);
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(0x30);
    const int8x16_t bias = vdupq_n_s8(32);

    float32x4_t acc[NB_MAX];
    for (int b = 0; b < NB; b++)
        acc[b] = first ? vdupq_n_f32(0.0f) : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        __builtin_prefetch(t + 2 * tile);
        const struct act_q8_256 *xa[NB_MAX];
        int32x4_t is[NB_MAX];
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
            is[b] = vdupq_n_s32(0);
        }
        for (int u = 0; u < 8; u++) {
            int32x4_t sc[2];
            pair_s32(t + KM_Q6_K_SC(G) + 2 * G * u, true, &sc[0], &sc[1]);
            for (int h = 0; h < 2; h++) {
                /* sub-block j = 2u + h: nibble vectors 4u + s (low nibbles for h = 0),
                 * bits 4..5 from the high-bit vector of j at bits 2s..2s+1 */
                const int j = 2 * u + h;
                const uint8_t *tq = t + VB * 4 * u;
                uint8x16_t hv = load16(t + KM_Q6_K_QH(G) + VB * j);
                int8x16_t w[4];
                for (int s = 0; s < 4; s++) {
                    uint8x16_t n = load16(tq + VB * s);
                    n = h ? vshrq_n_u8(n, 4) : vandq_u8(n, m4);
                    uint8x16_t hb = vandq_u8(vshlq_u8(hv, vdupq_n_s8((int8_t)(4 - 2 * s))), m2);
                    w[s] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(n, hb)), bias);
                }
                const int8_t *xp[NB_MAX];
                int32x4_t sj[NB_MAX];
                for (int b = 0; b < NB; b++) {
                    xp[b] = xa[b]->q + 16 * j;
                    sj[b] = vdupq_n_s32(0);
                }
                dots(NB, 4, w, xp, sj);
                for (int b = 0; b < NB; b++)
                    is[b] = vmlaq_s32(is[b], sj[b], sc[h]);
            }
        }
        float32x4_t d = half4(t + KM_Q6_K_D(G));
        for (int b = 0; b < NB; b++)
            acc[b] = vfmaq_f32(acc[b], vmulq_n_f32(d, xa[b]->d), vcvtq_f32_s32(is[b]));
    }
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

/* ---- Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 (the layouts of simd_mat.h's later types) ---- */

INLINE bool is_lut(const int type)
{
    return type == DT_IQ4_NL || type == DT_IQ4_XS || type == DT_MXFP4;
}

/* Four bytes (one per row) widened to int32 lanes, signed or not. */
INLINE int32x4_t b4_to_s32(const uint8_t *p, const bool is_signed)
{
    uint32_t u;
    memcpy(&u, p, 4);
    uint8x8_t v = vreinterpret_u8_u32(vdup_n_u32(u));
    if (is_signed)
        return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(v))));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(v))));
}

/* 2^(e-128) of 4 E8M0 bytes, as kern_e8m0_half (e = 0, 1: subnormal). */
INLINE float32x4_t e8m0_half4(const uint8_t *p)
{
    int32x4_t e = b4_to_s32(p, false);
    int32x4_t normal = vshlq_n_s32(vsubq_s32(e, vdupq_n_s32(1)), 23);
    int32x4_t sub = vshlq_s32(vdupq_n_s32(0x00200000), e);
    uint32x4_t small = vcltq_s32(e, vdupq_n_s32(2));
    return vreinterpretq_f32_s32(vbslq_s32(small, sub, normal));
}

/* The weights of sub-block j of a tile (8 k-groups, or 4 for Q2_K/Q3_K), as signed bytes. */
INLINE void lowbit_weights(const int type, const uint8_t *t, const int j, const int8x16_t lut,
                           int8x16_t *w)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3);
    if (is_lut(type)) {
        /* IQ4_NL/MXFP4: nibble vector v holds k-groups v and v+4; IQ4_XS as Q4_K */
        const bool xs = type == DT_IQ4_XS;
        for (int p = 0; p < 8; p++) {
            const int v = xs ? 8 * (j / 2) + p : p % 4;
            const bool hi = xs ? (j & 1) : p >= 4;
            uint8x16_t n = load16(t + VB * v);
            n = hi ? vshrq_n_u8(n, 4) : vandq_u8(n, m4);
            w[p] = vqtbl1q_s8(lut, n);
        }
        return;
    }
    /* Q2_K/Q3_K: sub-block j of 16 is vector j, k-group 4j+s at bits 2s..2s+1; Q3_K's
     * third bit is bit 4(j%2)+s of plane j/2 */
    uint8x16_t q = load16(t + VB * j);
    uint8x16_t plane = type == DT_Q3_K ? load16(t + KM_Q3_K_QH(G) + VB * (j / 2)) : m4;
    for (int s = 0; s < 4; s++) {
        uint8x16_t v = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * s))), m3);
        if (type == DT_Q3_K) {
            const int bit = 4 * (j % 2) + s;
            v = vorrq_u8(v, vandq_u8(vshlq_u8(plane, vdupq_n_s8((int8_t)(2 - bit))), vdupq_n_u8(4)));
        }
        w[s] = vreinterpretq_s8_u8(v);
    }
}

INLINE void group_lowbit(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                         const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi,
                         int first)
{
    const size_t tile = km_lowbit_tile(type, G);
    const bool q32 = type == DT_IQ4_NL || type == DT_MXFP4;
    const int nsub = q32 ? 1 : type == DT_IQ4_XS ? 8 : 16; /* sub-blocks per block */
    const int nk = q32 || type == DT_IQ4_XS ? 8 : 4;       /* k-groups per sub-block */
    const size_t scoff = km_lowbit_sc_off(type, G);
    const size_t doff = km_lowbit_d_off(type, G);
    const size_t ablk = q32 ? sizeof(struct act_q8_32) : sizeof(struct act_q8_256);
    const int8x16_t lut = vld1q_s8(type == DT_MXFP4 ? kern_mxfp4_values : kern_iq4nl_values);

    float32x4_t acc[NB_MAX];
    for (int b = 0; b < NB; b++)
        acc[b] = first ? vdupq_n_f32(0.0f) : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        __builtin_prefetch(t + 2 * tile);
        const uint8_t *xb[NB_MAX];
        const int8_t *xq[NB_MAX];
        float xd[NB_MAX];
        int32x4_t is[NB_MAX], ms[NB_MAX];
        for (int b = 0; b < NB; b++) {
            xb[b] = x + (size_t)b * ldx + (size_t)i * ablk;
            xq[b] = q32 ? ((const struct act_q8_32 *)xb[b])->q : ((const struct act_q8_256 *)xb[b])->q;
            xd[b] = q32 ? ((const struct act_q8_32 *)xb[b])->d : ((const struct act_q8_256 *)xb[b])->d;
            is[b] = ms[b] = vdupq_n_s32(0);
        }
        for (int j = 0; j < nsub; j++) {
            int8x16_t w[8];
            lowbit_weights(type, t, j, lut, w);
            const int8_t *xp[NB_MAX];
            const int16_t *bsums[NB_MAX];
            int32x4_t s[NB_MAX];
            for (int b = 0; b < NB; b++) {
                xp[b] = xq[b] + 4 * nk * j;
                bsums[b] = q32 ? NULL : ((const struct act_q8_256 *)xb[b])->bsums;
                /* Q3_K: sum (q-4)*x = sum q*x - 4 * sum x */
                s[b] = vdupq_n_s32(type == DT_Q3_K ? -4 * bsums[b][j] : 0);
            }
            dots(NB, nk, w, xp, s);
            if (q32) {
                for (int b = 0; b < NB; b++)
                    is[b] = s[b];
                continue;
            }
            int32x4_t scb = b4_to_s32(t + scoff + G * j, type != DT_Q2_K);
            int32x4_t sc = type == DT_Q2_K ? vandq_s32(scb, vdupq_n_s32(15)) : scb;
            for (int b = 0; b < NB; b++)
                is[b] = vmlaq_s32(is[b], s[b], sc);
            if (type == DT_Q2_K) {
                int32x4_t mn = vshrq_n_s32(scb, 4);
                for (int b = 0; b < NB; b++)
                    ms[b] = vmlaq_n_s32(ms[b], mn, bsums[b][j]);
            }
        }
        float32x4_t d = type == DT_MXFP4 ? e8m0_half4(t + doff) : half4(t + doff);
        float32x4_t dmin = type == DT_Q2_K ? half4(t + KM_Q2_K_DMIN(G)) : d;
        for (int b = 0; b < NB; b++) {
            acc[b] = vfmaq_f32(acc[b], vmulq_n_f32(d, xd[b]), vcvtq_f32_s32(is[b]));
            if (type == DT_Q2_K)
                acc[b] = vfmaq_f32(acc[b], vnegq_f32(vmulq_n_f32(dmin, xd[b])), vcvtq_f32_s32(ms[b]));
        }
    }
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

/* One kernel per type with NB a constant (1..4), so the loops over b unroll. */
#define GROUP_FN(name, CALL)                                                              \
    static void name(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,       \
                     size_t ldx, float *y, size_t ldy, int lo, int hi, int first)         \
    {                                                                                     \
        _Static_assert(NB_MAX == 4, "cases 1..4");                                        \
        switch (NB) {                                                                     \
        case 1: CALL(1); break;                                                           \
        case 2: CALL(2); break;                                                           \
        case 3: CALL(3); break;                                                           \
        default: CALL(4); break;                                                          \
        }                                                                                 \
    }

#define Q4_0_CALL(n) group_q32(DT_Q4_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q4_1_CALL(n) group_q32(DT_Q4_1, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q5_0_CALL(n) group_q32(DT_Q5_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q5_1_CALL(n) group_q32(DT_Q5_1, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q8_0_CALL(n) group_q32(DT_Q8_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q4_K_CALL(n) group_k(DT_Q4_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q5_K_CALL(n) group_k(DT_Q5_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q6_K_CALL(n) group_q6k(n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q2_K_CALL(n) group_lowbit(DT_Q2_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define Q3_K_CALL(n) group_lowbit(DT_Q3_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define IQ4_NL_CALL(n) group_lowbit(DT_IQ4_NL, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define IQ4_XS_CALL(n) group_lowbit(DT_IQ4_XS, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define MXFP4_CALL(n) group_lowbit(DT_MXFP4, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)

GROUP_FN(q4_0, Q4_0_CALL)
GROUP_FN(q4_1, Q4_1_CALL)
GROUP_FN(q5_0, Q5_0_CALL)
GROUP_FN(q5_1, Q5_1_CALL)
GROUP_FN(q8_0, Q8_0_CALL)
GROUP_FN(q4_k, Q4_K_CALL)
GROUP_FN(q5_k, Q5_K_CALL)
GROUP_FN(q6_k, Q6_K_CALL)
GROUP_FN(q2_k, Q2_K_CALL)
GROUP_FN(q3_k, Q3_K_CALL)
GROUP_FN(iq4_nl, IQ4_NL_CALL)
GROUP_FN(iq4_xs, IQ4_XS_CALL)
GROUP_FN(mxfp4, MXFP4_CALL)

/* ---- float weights: 16 lanes per row as four float32x4, element k in lane k%16 ---- */

INLINE float32x4_t fload(const int type, const uint8_t *row, int64_t k)
{
    if (type == DT_F32)
        return vld1q_f32((const float *)row + k);
    uint16x4_t h = vld1_u16((const uint16_t *)row + k);
    if (type == DT_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

INLINE float fscalar(const int type, const uint8_t *row, int64_t k)
{
    if (type == DT_F32)
        return ((const float *)row)[k];
    uint16_t h;
    memcpy(&h, row + 2 * k, 2);
    if (type == DT_F16)
        return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Lanes 0-15, the elements k0..cols-1 of a tail added lane by lane, then the fixed tree
 * of kern.h: lane[l] += lane[l+s] for s = 8, 4, 2, 1. */
INLINE float reduce16(float32x4_t v[4], const int type, const uint8_t *row, const float *x,
                      int64_t k0, int64_t cols)
{
    if (k0 < cols) {
        float lane[16];
        for (int q = 0; q < 4; q++)
            vst1q_f32(lane + 4 * q, v[q]);
        for (int64_t k = k0; k < cols; k++)
            lane[k % 16] = fmaf(fscalar(type, row, k), x[k], lane[k % 16]);
        for (int q = 0; q < 4; q++)
            v[q] = vld1q_f32(lane + 4 * q);
    }
    float32x4_t a = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
    float32x2_t b = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(b, 0) + vget_lane_f32(b, 1);
}

INLINE void rows_float(const int type, const int NB, const struct km_fcall *c)
{
    float32x4_t acc[NBF_MAX][4];
    const float *xb[NBF_MAX];
    for (int b = 0; b < NB; b++) {
        xb[b] = (const float *)(c->x + (size_t)b * c->ldx);
        const float *l = c->lanes + (size_t)b * 16;
        for (int q = 0; q < 4; q++)
            acc[b][q] = c->first ? vdupq_n_f32(0.0f) : vld1q_f32(l + 4 * q);
    }
    int64_t k = c->k0, kend = c->k0 + c->kn;
    for (; k + 16 <= kend; k += 16) {
        __builtin_prefetch(c->w + (size_t)k * (type == DT_F32 ? 4 : 2) + 2048);
        float32x4_t w[4];
        for (int q = 0; q < 4; q++)
            w[q] = fload(type, c->w, k + 4 * q);
        for (int b = 0; b < NB; b++)
            for (int q = 0; q < 4; q++)
                acc[b][q] = vfmaq_f32(acc[b][q], w[q], vld1q_f32(xb[b] + k + 4 * q));
    }
    for (int b = 0; b < NB; b++) {
        if (c->last) {
            c->y[(size_t)b * c->ldy] = reduce16(acc[b], type, c->w, xb[b], k, kend);
        } else {
            float *l = c->lanes + (size_t)b * 16;
            for (int q = 0; q < 4; q++)
                vst1q_f32(l + 4 * q, acc[b][q]);
        }
    }
}

#define FLOAT_FN(name, T)                                                                 \
    static void name(int R, int NB, const struct km_fcall *c)                             \
    {                                                                                     \
        _Static_assert(NBF_MAX == 4 && RF == 1, "cases");                                 \
        (void)R;                                                                          \
        switch (NB) {                                                                     \
        case 1: rows_float(T, 1, c); break;                                               \
        case 2: rows_float(T, 2, c); break;                                               \
        case 3: rows_float(T, 3, c); break;                                               \
        default: rows_float(T, 4, c); break;                                              \
        }                                                                                 \
    }

FLOAT_FN(f32, DT_F32)
FLOAT_FN(f16, DT_F16)
FLOAT_FN(bf16, DT_BF16)

void NEON_RUN(const struct km_view *v, const void *xq, size_t ldx, int B, float *y, size_t ldy,
              int64_t r0, int64_t r1)
{
    const uint8_t *x = xq;
    const size_t a32 = sizeof(struct act_q8_32), a256 = sizeof(struct act_q8_256);
#define tiles(fn, a) km_drive_tiles(fn, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a)
#define rows(fn) km_drive_rows(fn, RF, NBF_MAX, v, x, ldx, B, y, ldy, r0, r1)
    switch (v->type) {
    case DT_Q4_0: tiles(q4_0, a32); break;
    case DT_Q4_1: tiles(q4_1, a32); break;
    case DT_Q5_0: tiles(q5_0, a32); break;
    case DT_Q5_1: tiles(q5_1, a32); break;
    case DT_Q8_0: tiles(q8_0, a32); break;
    case DT_Q4_K: tiles(q4_k, a256); break;
    case DT_Q5_K: tiles(q5_k, a256); break;
    case DT_Q6_K: tiles(q6_k, a256); break;
    case DT_Q2_K: tiles(q2_k, a256); break;
    case DT_Q3_K: tiles(q3_k, a256); break;
    case DT_IQ4_NL: tiles(iq4_nl, a32); break;
    case DT_IQ4_XS: tiles(iq4_xs, a256); break;
    case DT_MXFP4: tiles(mxfp4, a32); break;
    case DT_F32: rows(f32); break;
    case DT_F16: rows(f16); break;
    case DT_BF16: rows(bf16); break;
    default: break;
    }
#undef tiles
#undef rows
}
