/* NEON variants of vec.h (ARM64): the same operations in the same order as the reference
 * (lanes 0-15 in four registers; no fused multiply-add where the reference has none,
 * FMLA exactly where it calls fmaf). The attention tile products (attn_qk, attn_pv) are
 * the reference's own functions here: they give the same bits by definition, and their
 * NEON forms are not written yet. */
#if defined(__aarch64__)  /* an ARM64 file: empty on other architectures */
#include "engine/vec.h"

#include <arm_neon.h>
#include <pthread.h>
#include <stdint.h>

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

static struct vec_ops neon_ops;
static pthread_once_t neon_once = PTHREAD_ONCE_INIT;

static void neon_init(void)
{
    const struct vec_ops *ref = vec_ops_ref();
    neon_ops = (struct vec_ops){dot_f32, exp_sub, silu_mul, ref->attn_qk, ref->attn_pv, softmax_tile,
                              ref->attn_qk_paged, ref->f16_to_f32, ref->q8_query, NULL, NULL};
}

const struct vec_ops *vec_ops_neon(void)
{
    pthread_once(&neon_once, neon_init);
    return &neon_ops;
}

#endif
