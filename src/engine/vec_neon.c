/* NEON variants of vec.h (ARM64): the same operations in the same order as the reference
 * (lanes 0-15 in four registers; no fused multiply-add where the reference has none,
 * FMLA exactly where it calls fmaf). Attention's tile products take 4 keys (Q.K) or 4
 * columns (P.V) a register, each lane the reference's chain; the few keys past the last
 * whole group are the reference's own code. Baseline ARMv8-A only:
 * Q8_0's byte products widen to int16 (exact) where a dot-product core would use SDOT. */
#if defined(__aarch64__)  /* an ARM64 file: empty on other architectures */
#include "engine/vec.h"

#include "base/dtype.h"
#include "kern/quant.h"

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* lane[l] += lane[l+s] for s = 8, 4, 2, 1: the reference's tree, in registers. */
static inline float reduce16(float32x4_t v[4])
{
    float32x4_t a = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
    float32x2_t b = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(b, 0) + vget_lane_f32(b, 1);
}

/* Lanes as stored, the tail k..n-1 of a + a[k]*b[k] (or + a[k] when b is NULL) added
 * lane by lane, then the tree. */
static float finish16(float32x4_t v[4], const float *a, const float *b, int64_t k, int64_t n)
{
    float lane[16];
    for (int q = 0; q < 4; q++)
        vst1q_f32(lane + 4 * q, v[q]);
    for (; k < n; k++)
        lane[k % 16] = lane[k % 16] + (b ? a[k] * b[k] : a[k]);
    for (int q = 0; q < 4; q++)
        v[q] = vld1q_f32(lane + 4 * q);
    return reduce16(v);
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
    float32x4_t v[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        for (int q = 0; q < 4; q++)
            v[q] = vaddq_f32(v[q], vmulq_f32(vld1q_f32(a + k + 4 * q), vld1q_f32(b + k + 4 * q)));
    return finish16(v, a, b, k, n);
}

/* vec.h's exp on 4 lanes. FMAX/FMIN return a NaN operand, as the reference's clamps do;
 * a NaN n converts to 0 here and to INT_MIN in the reference, which changes only the
 * finite scale that a NaN e is multiplied by: the result is that NaN either way. */
static inline float32x4_t exp4(float32x4_t t)
{
    t = vmaxq_f32(vdupq_n_f32(VEC_EXP_LO), t);
    t = vminq_f32(vdupq_n_f32(VEC_EXP_HI), t);
    float32x4_t n = vmulq_f32(t, vdupq_n_f32(VEC_EXP_LOG2E));
    n = vaddq_f32(n, vdupq_n_f32(VEC_EXP_ROUND));
    n = vsubq_f32(n, vdupq_n_f32(VEC_EXP_ROUND));
    float32x4_t r = vfmaq_f32(t, n, vdupq_n_f32(-VEC_EXP_C1));
    r = vfmaq_f32(r, n, vdupq_n_f32(-VEC_EXP_C2));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(VEC_EXP_P1), vdupq_n_f32(VEC_EXP_P0), r);
    p = vfmaq_f32(vdupq_n_f32(VEC_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_EXP_P5), p, r);
    float32x4_t e = vfmaq_f32(r, p, vmulq_f32(r, r));
    e = vaddq_f32(e, vdupq_n_f32(1.0f));
    int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(e, vreinterpretq_f32_s32(bits));
}

/* vec.h's VEC_SEXP on 4 lanes (FMAX passes a NaN t, as the reference's clamp). */
static inline float32x4_t sexp4(float32x4_t t)
{
    t = vmaxq_f32(vdupq_n_f32(VEC_SEXP_LO), t);
    float32x4_t tr = vfmaq_f32(vdupq_n_f32(VEC_EXP_ROUND), t, vdupq_n_f32(VEC_EXP_LOG2E));
    float32x4_t n = vsubq_f32(tr, vdupq_n_f32(VEC_EXP_ROUND));
    float32x4_t r = vfmaq_f32(t, n, vdupq_n_f32(-VEC_EXP_C1));
    r = vfmaq_f32(r, n, vdupq_n_f32(-VEC_EXP_C2));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(VEC_SEXP_S4), vdupq_n_f32(VEC_SEXP_S5), r);
    p = vfmaq_f32(vdupq_n_f32(VEC_SEXP_S3), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_SEXP_S2), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_SEXP_S1), p, r);
    p = vfmaq_f32(vdupq_n_f32(VEC_SEXP_S0), p, r);
    uint32x4_t bits = vaddq_u32(vshlq_n_u32(vreinterpretq_u32_f32(tr), 23), vdupq_n_u32(127u << 23));
    return vmulq_f32(p, vreinterpretq_f32_u32(bits));
}

static inline float32x4_t silu_mul4(float32x4_t a, float32x4_t b)
{
    float32x4_t e = exp4(vsubq_f32(vdupq_n_f32(0.0f), a));
    return vmulq_f32(vdivq_f32(a, vaddq_f32(vdupq_n_f32(1.0f), e)), b);
}

static void exp_sub(float *x, float sub, int64_t n)
{
    float32x4_t vs = vdupq_n_f32(sub);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        vst1q_f32(x + k, exp4(vsubq_f32(vld1q_f32(x + k), vs)));
    if (k < n) {
        float t[4] = {0};
        for (int64_t i = k; i < n; i++)
            t[i - k] = x[i];
        vst1q_f32(t, exp4(vsubq_f32(vld1q_f32(t), vs)));
        for (int64_t i = k; i < n; i++)
            x[i] = t[i - k];
    }
}

/* vec.h's swiglu_oai steps on 4 lanes (the clamps as compares and selects: a NaN takes
 * the scalar comparisons' branch). */
static inline float32x4_t swiglu_oai4(float32x4_t x, float32x4_t y)
{
    const float32x4_t lim = vdupq_n_f32(7.0f), nlim = vdupq_n_f32(-7.0f);
    x = vbslq_f32(vcltq_f32(x, lim), x, lim);
    y = vbslq_f32(vcgtq_f32(y, lim), lim, y);
    y = vbslq_f32(vcltq_f32(y, nlim), nlim, y);
    float32x4_t e = exp4(vmulq_f32(vdupq_n_f32(1.702f), vsubq_f32(vdupq_n_f32(0.0f), x)));
    float32x4_t h = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), e));
    return vmulq_f32(h, vaddq_f32(y, vdupq_n_f32(1.0f)));
}

static void swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int64_t n)
{
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        float32x4_t x = vaddq_f32(vld1q_f32(g + k), vld1q_f32(bg + k));
        vst1q_f32(g + k, swiglu_oai4(x, vaddq_f32(vld1q_f32(u + k), vld1q_f32(bu + k))));
    }
    if (k < n) {
        float t[4][4] = {{0}};
        for (int64_t i = k; i < n; i++) {
            t[0][i - k] = g[i];
            t[1][i - k] = u[i];
            t[2][i - k] = bg[i];
            t[3][i - k] = bu[i];
        }
        float32x4_t x = vaddq_f32(vld1q_f32(t[0]), vld1q_f32(t[2]));
        vst1q_f32(t[0], swiglu_oai4(x, vaddq_f32(vld1q_f32(t[1]), vld1q_f32(t[3]))));
        for (int64_t i = k; i < n; i++)
            g[i] = t[0][i - k];
    }
}

static void silu_mul(float *a, const float *b, int64_t n)
{
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        vst1q_f32(a + k, silu_mul4(vld1q_f32(a + k), vld1q_f32(b + k)));
    if (k < n) {
        float ta[4] = {0}, tb[4] = {0};
        for (int64_t i = k; i < n; i++) {
            ta[i - k] = a[i];
            tb[i - k] = b[i];
        }
        vst1q_f32(ta, silu_mul4(vld1q_f32(ta), vld1q_f32(tb)));
        for (int64_t i = k; i < n; i++)
            a[i] = ta[i - k];
    }
}

static float softmax_tile(float *s, int64_t n, float *l)
{
    /* the maximum as the reference takes it: s[j] > m ? s[j] : m, in order of j (a max
     * of the lanes could differ from it only with NaN, which vec.h leaves unspecified) */
    float m = s[0];
    for (int64_t j = 1; j < n; j++)
        m = s[j] > m ? s[j] : m;
    float32x4_t vm = vdupq_n_f32(m);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        vst1q_f32(s + k, sexp4(vsubq_f32(vld1q_f32(s + k), vm)));
    if (k < n) {
        float t[4] = {0};
        for (int64_t i = k; i < n; i++)
            t[i - k] = s[i];
        vst1q_f32(t, sexp4(vsubq_f32(vld1q_f32(t), vm)));
        for (int64_t i = k; i < n; i++)
            s[i] = t[i - k];
    }
    float32x4_t v[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    k = 0;
    for (; k + 16 <= n; k += 16)
        for (int q = 0; q < 4; q++)
            v[q] = vaddq_f32(v[q], vld1q_f32(s + k + 4 * q));
    *l = finish16(v, s, NULL, k, n);
    return m;
}

/* ---- attention tiles (vec.h attn_qk, attn_pv) ---- */

INLINE float half_to_float(uint16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

INLINE float32x4_t load4(const void *p, const int f16, int64_t i)
{
    if (f16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
    return vld1q_f32((const float *)p + i);
}

/* F16/F32 K: R (constant, <= 4) rows by the 8 keys j0..j0+7, two registers a row. */
INLINE void qk_rows(const float *q, int64_t ldq, const int R, const void *kt, int64_t ld, int j0, int64_t hd,
                    const int f16, float *s, int64_t lds)
{
    float32x4_t a[4][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = vdupq_n_f32(0.0f);
    for (int64_t d = 0; d < hd; d++) {
        float32x4_t k0 = load4(kt, f16, d * ld + j0), k1 = load4(kt, f16, d * ld + j0 + 4);
        for (int r = 0; r < R; r++) {
            a[r][0] = vfmaq_n_f32(a[r][0], k0, q[r * ldq + d]);
            a[r][1] = vfmaq_n_f32(a[r][1], k1, q[r * ldq + d]);
        }
    }
    for (int r = 0; r < R; r++) {
        vst1q_f32(s + r * lds + j0, a[r][0]);
        vst1q_f32(s + r * lds + j0 + 4, a[r][1]);
    }
}

/* Q4_0 K: the codes of 8 keys for dimension 32c + 16*high + i, widened and minus 8 (exact). */
INLINE void q4_keys(const uint8_t *kt, int64_t ld, int64_t c, int64_t i, int j0, const int high, float32x4_t k[2])
{
    uint16x8_t b = vmovl_u8(vld1_u8(kt + (16 * c + i) * ld + j0));
    b = high ? vshrq_n_u16(b, 4) : vandq_u16(b, vdupq_n_u16(15));
    int16x8_t x = vsubq_s16(vreinterpretq_s16_u16(b), vdupq_n_s16(8));
    k[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(x)));
    k[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(x)));
}

/* Q4_0 K: per 32 dimensions the chain u over the low nibbles then the high ones, then
 * s = fma(u, scale, s). */
INLINE void qk4_rows(const float *q, int64_t ldq, const int R, const uint8_t *kt, const uint16_t *ks, int64_t ld,
                     int j0, int64_t hd, float *s, int64_t lds)
{
    float32x4_t a[4][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = vdupq_n_f32(0.0f);
    for (int64_t c = 0; c < hd / 32; c++) {
        float32x4_t u[4][2];
        for (int r = 0; r < R; r++)
            u[r][0] = u[r][1] = vdupq_n_f32(0.0f);
        for (int high = 0; high < 2; high++)
            for (int64_t i = 0; i < 16; i++) {
                float32x4_t k[2];
                q4_keys(kt, ld, c, i, j0, high, k);
                int64_t d = 32 * c + 16 * high + i;
                for (int r = 0; r < R; r++) {
                    u[r][0] = vfmaq_n_f32(u[r][0], k[0], q[r * ldq + d]);
                    u[r][1] = vfmaq_n_f32(u[r][1], k[1], q[r * ldq + d]);
                }
            }
        float32x4_t kd0 = load4(ks, 1, c * ld + j0), kd1 = load4(ks, 1, c * ld + j0 + 4);
        for (int r = 0; r < R; r++) {
            a[r][0] = vfmaq_f32(a[r][0], u[r][0], kd0);
            a[r][1] = vfmaq_f32(a[r][1], u[r][1], kd1);
        }
    }
    for (int r = 0; r < R; r++) {
        vst1q_f32(s + r * lds + j0, a[r][0]);
        vst1q_f32(s + r * lds + j0 + 4, a[r][1]);
    }
}

/* Q8_0 K: R (constant, <= 4) vec_q8_query rows by 8 keys. Per 4 dimensions g, the 16 bytes
 * at kt + 4*(g*ld + j0) hold keys j0..j0+3 (4 codes each): times the query's 4 codes
 * repeated, as int16 (|products| <= 128*127), pairs added into int32 lanes; the 32
 * dimensions' exact sums, then s = fma((float)sum, qd * scale, s). */
INLINE void qk8_rows(const char *q, int64_t ldq, const int R, const int8_t *kt, const uint16_t *ks, int64_t ld,
                     int j0, int64_t hd, float *s, int64_t lds)
{
    float32x4_t a[4][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = vdupq_n_f32(0.0f);
    for (int64_t c = 0; c < hd / 32; c++) {
        int32x4_t acc[4][4]; /* row, keys {0-1, 2-3, 4-5, 6-7}: two lanes a key */
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 4; h++)
                acc[r][h] = vdupq_n_s32(0);
        for (int64_t g = 8 * c; g < 8 * c + 8; g++) {
            int8x16_t k0 = vld1q_s8(kt + 4 * (g * ld + j0)), k1 = vld1q_s8(kt + 4 * (g * ld + j0 + 4));
            for (int r = 0; r < R; r++) {
                int32_t v;
                memcpy(&v, q + r * ldq + 4 * g, sizeof v);
                int8x16_t qr = vreinterpretq_s8_s32(vdupq_n_s32(v));
                acc[r][0] = vpadalq_s16(acc[r][0], vmull_s8(vget_low_s8(k0), vget_low_s8(qr)));
                acc[r][1] = vpadalq_s16(acc[r][1], vmull_high_s8(k0, qr));
                acc[r][2] = vpadalq_s16(acc[r][2], vmull_s8(vget_low_s8(k1), vget_low_s8(qr)));
                acc[r][3] = vpadalq_s16(acc[r][3], vmull_high_s8(k1, qr));
            }
        }
        float32x4_t kd0 = load4(ks, 1, c * ld + j0), kd1 = load4(ks, 1, c * ld + j0 + 4);
        for (int r = 0; r < R; r++) {
            float qd;
            memcpy(&qd, q + r * ldq + hd + 4 * c, sizeof qd);
            int32x4_t d0 = vpaddq_s32(acc[r][0], acc[r][1]), d1 = vpaddq_s32(acc[r][2], acc[r][3]);
            a[r][0] = vfmaq_f32(a[r][0], vcvtq_f32_s32(d0), vmulq_n_f32(kd0, qd));
            a[r][1] = vfmaq_f32(a[r][1], vcvtq_f32_s32(d1), vmulq_n_f32(kd1, qd));
        }
    }
    for (int r = 0; r < R; r++) {
        vst1q_f32(s + r * lds + j0, a[r][0]);
        vst1q_f32(s + r * lds + j0 + 4, a[r][1]);
    }
}

/* R rows of one type's kernel over the keys [j0, j0 + 8). */
INLINE void qk_group(const void *q, int64_t ldq, const int R, const void *kt, const uint16_t *ks, int64_t ld, int j0,
                     int64_t hd, int type, float *s, int64_t lds)
{
    switch (type) {
    case DT_F16: qk_rows(q, ldq, R, kt, ld, j0, hd, 1, s, lds); break;
    case DT_F32: qk_rows(q, ldq, R, kt, ld, j0, hd, 0, s, lds); break;
    case DT_Q8_0: qk8_rows(q, ldq, R, kt, ks, ld, j0, hd, s, lds); break;
    default: qk4_rows(q, ldq, R, kt, ks, ld, j0, hd, s, lds); break;
    }
}

/* Whole groups of 8 keys here (rows 4 at a time), the last n % 8 keys by the reference. */
static void attn_qk(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                    int64_t hd, int type, float *s, int64_t lds)
{
    /* a query row's bytes (Q8_0: ldq counts bytes) and K's element size */
    size_t qsize = type == DT_Q8_0 ? 1 : sizeof(float);
    int j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            qk_group((const char *)q + r * ldq * qsize, ldq, 4, kt, ks, ld, j0, hd, type, s + r * lds, lds);
        const void *qr = (const char *)q + r * ldq * qsize;
        switch (rows - r) {
        case 3: qk_group(qr, ldq, 3, kt, ks, ld, j0, hd, type, s + r * lds, lds); break;
        case 2: qk_group(qr, ldq, 2, kt, ks, ld, j0, hd, type, s + r * lds, lds); break;
        case 1: qk_group(qr, ldq, 1, kt, ks, ld, j0, hd, type, s + r * lds, lds); break;
        default: break;
        }
    }
    if (j0 == n)
        return;
    /* the element offset of key j0 in each layout (Q8_0: 4 bytes a key a group) */
    size_t kat = type == DT_F16 ? 2 * (size_t)j0 : type == DT_F32 ? 4 * (size_t)j0 : type == DT_Q8_0 ? 4 * (size_t)j0 : (size_t)j0;
    vec_ops_ref()->attn_qk(q, ldq, rows, (const char *)kt + kat, ks ? ks + j0 : NULL, ld, n - j0, hd, type, s + j0, lds);
}

/* F16/F32 V: R (constant, <= 4) rows, keys [j0, j1), the 16 columns from c0. */
INLINE void pv_rows(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                    const void *const *v, int64_t c0, const int f16)
{
    float32x4_t a[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = vld1q_f32(o + r * ldo + c0 + 4 * c);
    for (int j = j0; j < j1; j++) {
        float32x4_t x[4];
        for (int c = 0; c < 4; c++)
            x[c] = load4(v[j], f16, c0 + 4 * c);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++)
                a[r][c] = vfmaq_n_f32(a[r][c], x[c], p[r * ldp + j]);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            vst1q_f32(o + r * ldo + c0 + 4 * c, a[r][c]);
}

/* A quantized V block's 32 codes as floats, 4 columns a register (exact): Q4_0's columns
 * 0-15 are its 16 bytes' low nibbles, 16-31 their high ones, each minus 8. */
INLINE void v_codes(const void *blk, const int q4, float32x4_t x[8])
{
    int8x16_t b[2];
    if (q4) {
        uint8x16_t u = vld1q_u8(((const struct block_q4_0 *)blk)->qs);
        b[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(15))), vdupq_n_s8(8));
        b[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(u, 4)), vdupq_n_s8(8));
    } else {
        b[0] = vld1q_s8(((const struct block_q8_0 *)blk)->qs);
        b[1] = vld1q_s8(((const struct block_q8_0 *)blk)->qs + 16);
    }
    for (int h = 0; h < 2; h++) {
        int16x8_t lo = vmovl_s8(vget_low_s8(b[h])), hi = vmovl_s8(vget_high_s8(b[h]));
        x[4 * h + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
        x[4 * h + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
        x[4 * h + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
        x[4 * h + 3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
    }
}

/* Q8_0/Q4_0 V: R (constant; 2 keeps the 16 sums and 8 codes in registers) rows of the 32 columns of block c, keys [j0, j1): w = p *
 * scale as the reference makes it, o = fma(w, code, o), the codes converted once a key. */
INLINE void pvq_rows(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                     const void *const *v, int64_t c, const int q4)
{
    const size_t bsize = q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    float32x4_t a[4][8];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 8; i++)
            a[r][i] = vld1q_f32(o + r * ldo + 32 * c + 4 * i);
    for (int j = j0; j < j1; j++) {
        const char *blk = (const char *)v[j] + c * bsize;
        uint16_t dh;
        memcpy(&dh, blk, sizeof dh); /* both block types open with their half scale */
        float d = half_to_float(dh);
        float32x4_t x[8];
        v_codes(blk, q4, x);
        for (int r = 0; r < R; r++) {
            float w = p[r * ldp + j] * d;
            for (int i = 0; i < 8; i++)
                a[r][i] = vfmaq_n_f32(a[r][i], x[i], w);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 8; i++)
            vst1q_f32(o + r * ldo + 32 * c + 4 * i, a[r][i]);
}

/* One step of P.V for R rows over keys [j0, j1): every 16 (float) or 32 (quantized)
 * columns; columns past the last whole group of a float V by the reference's loop. */
INLINE void pv_step(float *o, int64_t ldo, const int R, const float *p, int64_t ldp, int j0, int j1,
                    const void *const *v, int64_t hd, int type)
{
    if (type == DT_Q8_0 || type == DT_Q4_0) {
        for (int64_t c = 0; c < hd / 32; c++) {
            if (type == DT_Q4_0)
                pvq_rows(o, ldo, R, p, ldp, j0, j1, v, c, 1);
            else
                pvq_rows(o, ldo, R, p, ldp, j0, j1, v, c, 0);
        }
        return;
    }
    const int f16 = type == DT_F16;
    int64_t c0 = 0;
    for (; c0 + 16 <= hd; c0 += 16) {
        if (f16)
            pv_rows(o, ldo, R, p, ldp, j0, j1, v, c0, 1);
        else
            pv_rows(o, ldo, R, p, ldp, j0, j1, v, c0, 0);
    }
    for (int r = 0; r < R; r++)
        for (int j = j0; j < j1; j++)
            for (int64_t i = c0; i < hd; i++) {
                float x = f16 ? half_to_float(((const uint16_t *)v[j])[i]) : ((const float *)v[j])[i];
                o[r * ldo + i] = fmaf(p[r * ldp + j], x, o[r * ldo + i]);
            }
}

/* Rows in groups (4 for a float V, 2 for a quantized one) over the keys all of the group
 * have, then each row's own keys. */
static void attn_pv(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                    const void *const *v, int64_t hd, int type, const struct vec_prefetch *pf)
{
    vec_prefetch_all(pf);
    const int G = type == DT_F16 || type == DT_F32 ? 4 : 2;
    for (int r = 0; r < rows; r += G) {
        int R = rows - r < G ? rows - r : G, jmin = n[r];
        for (int g = 1; g < R; g++)
            jmin = n[r + g] < jmin ? n[r + g] : jmin;
        float *og = o + r * ldo;
        const float *pg = p + r * ldp;
        switch (R) {
        case 4: pv_step(og, ldo, 4, pg, ldp, 0, jmin, v, hd, type); break;
        case 3: pv_step(og, ldo, 3, pg, ldp, 0, jmin, v, hd, type); break;
        case 2: pv_step(og, ldo, 2, pg, ldp, 0, jmin, v, hd, type); break;
        default: pv_step(og, ldo, 1, pg, ldp, 0, jmin, v, hd, type); break;
        }
        for (int g = 0; g < R; g++)
            if (n[r + g] > jmin)
                pv_step(o + (r + g) * ldo, ldo, 1, p + (r + g) * ldp, ldp, jmin, n[r + g], v, hd, type);
    }
}

/* One attn_qk per block. */
static void attn_qk_paged(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks,
                          int bt, int n, int64_t hd, int type, float *s, int64_t lds, const struct vec_prefetch *pf)
{
    vec_prefetch_all(pf);
    for (int j0 = 0, b = 0; j0 < n; j0 += bt, b++)
        attn_qk(q, ldq, rows, kt[b], ks ? ks[b] : NULL, bt, n - j0 < bt ? n - j0 : bt, hd, type, s + j0, lds);
}

static void f16_to_f32(const uint16_t *x, int64_t ldx, float *y, int64_t ldy, int rows, int64_t n)
{
    for (int r = 0; r < rows; r++, x += ldx, y += ldy) {
        int64_t k = 0;
        for (; k + 4 <= n; k += 4)
            vst1q_f32(y + k, load4(x, 1, k));
        for (; k < n; k++)
            y[k] = half_to_float(x[k]);
    }
}

/* vec_q8_query's steps: amax ignores a NaN as the reference's comparison does (|x| > m ?
 * |x| : m per lane, a compare and a select: FMAXNM would return a NaN for a signalling one,
 * and the lane's later steps would drop its maximum so far), the clamp keeps it (FMAX/FMIN),
 * and FCVTAS rounds half away from zero as roundf and turns a NaN into 0. */
static void q8_query(const float *x, int64_t hd, void *row)
{
    int8_t *code = row;
    float *qd = (float *)(code + hd);
    int32_t *bias = (int32_t *)(qd + hd / 32);
    for (int64_t c = 0; c < hd / 32; c++) {
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(x + 32 * c + 4 * i);
            float32x4_t a = vabsq_f32(v[i]);
            m = vbslq_f32(vcgtq_f32(a, m), a, m);
        }
        float d = vmaxvq_f32(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32x4_t sum = vdupq_n_s32(0);
        int16x8_t h[4];
        for (int i = 0; i < 8; i += 2) {
            int32x4_t k[2];
            for (int e = 0; e < 2; e++) {
                float32x4_t t = vmulq_n_f32(v[i + e], id);
                t = vminq_f32(vmaxq_f32(t, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
                k[e] = vcvtaq_s32_f32(t);
                sum = vaddq_s32(sum, k[e]);
            }
            h[i / 2] = vcombine_s16(vmovn_s32(k[0]), vmovn_s32(k[1]));
        }
        vst1q_s8(code + 32 * c, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
        vst1q_s8(code + 32 * c + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
        qd[c] = d;
        bias[c] = 128 * vaddvq_s32(sum);
    }
}

/* FCVTN rounds to nearest even (the default FPCR) and keeps a NaN's top payload bits, quieted,
 * as F16C and kern_f32_to_f16 do. */
static void f32_to_f16(const float *x, int64_t n, uint16_t *y, int64_t ldy)
{
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + k)));
        if (ldy == 1) {
            vst1_u16(y + k, h);
            continue;
        }
        uint16_t t[4];
        vst1_u16(t, h);
        for (int i = 0; i < 4; i++)
            y[(k + i) * ldy] = t[i];
    }
    for (; k < n; k++)
        y[k * ldy] = vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(x[k]))), 0);
}

static const struct vec_ops neon_ops = {dot_f32, exp_sub, silu_mul, attn_qk, attn_pv, softmax_tile, attn_qk_paged,
                                        f16_to_f32, q8_query, f32_to_f16, NULL, NULL, swiglu_oai};

const struct vec_ops *vec_ops_neon(void) { return &neon_ops; }

#endif
