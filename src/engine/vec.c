#include "engine/vec.h"

#include "base/cpu.h"
#include "base/dtype.h"
#include "kern/kern.h"
#include "kern/quant.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static float reduce16(float lane[16])
{
    for (int s = 8; s >= 1; s /= 2)
        for (int l = 0; l < s; l++)
            lane[l] = lane[l] + lane[l + s];
    return lane[0];
}

static float dot_f32_ref(const float *a, const float *b, int64_t n)
{
    float lane[16] = {0};
    for (int64_t k = 0; k < n; k++)
        lane[k % 16] = lane[k % 16] + a[k] * b[k];
    return reduce16(lane);
}

/* vec.h's exp, one float at a time. The clamps are written as the SIMD max/min
 * instructions behave: max(LO, t) is LO > t ? LO : t, so a NaN t passes through. */
static float exp_ref(float t)
{
    t = VEC_EXP_LO > t ? VEC_EXP_LO : t;
    t = VEC_EXP_HI < t ? VEC_EXP_HI : t;
    float n = t * VEC_EXP_LOG2E;
    n = n + VEC_EXP_ROUND;
    n = n - VEC_EXP_ROUND;
    float r = fmaf(n, -VEC_EXP_C1, t);
    r = fmaf(n, -VEC_EXP_C2, r);
    float p = fmaf(VEC_EXP_P0, r, VEC_EXP_P1);
    p = fmaf(p, r, VEC_EXP_P2);
    p = fmaf(p, r, VEC_EXP_P3);
    p = fmaf(p, r, VEC_EXP_P4);
    p = fmaf(p, r, VEC_EXP_P5);
    float e = fmaf(p, r * r, r);
    e = e + 1.0f;
    /* n is a whole number in [-126, 127]; a NaN converts as CVTTPS2DQ does it */
    uint32_t bits = ((n == n ? (uint32_t)(int32_t)n : 0x80000000u) + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return e * scale;
}

/* vec.h's VEC_SEXP, one float at a time. */
static float sexp_ref(float t)
{
    t = VEC_SEXP_LO > t ? VEC_SEXP_LO : t;
    float tr = fmaf(t, VEC_EXP_LOG2E, VEC_EXP_ROUND);
    float n = tr - VEC_EXP_ROUND;
    float r = fmaf(n, -VEC_EXP_C1, t);
    r = fmaf(n, -VEC_EXP_C2, r);
    float p = fmaf(VEC_SEXP_S5, r, VEC_SEXP_S4);
    p = fmaf(p, r, VEC_SEXP_S3);
    p = fmaf(p, r, VEC_SEXP_S2);
    p = fmaf(p, r, VEC_SEXP_S1);
    p = fmaf(p, r, VEC_SEXP_S0);
    uint32_t bits;
    memcpy(&bits, &tr, sizeof bits);
    bits = (bits << 23) + (127u << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static void exp_sub_ref(float *x, float sub, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        x[k] = exp_ref(x[k] - sub);
}

static void silu_mul_ref(float *a, const float *b, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        a[k] = (a[k] / (1.0f + exp_ref(-a[k]))) * b[k];
}

static void swiglu_oai_ref(float *g, const float *u, const float *bg, const float *bu, int64_t n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t k = 0; k < n; k++) {
        float x = g[k] + bg[k], y = u[k] + bu[k];
        x = x < limit ? x : limit;
        y = y < -limit ? -limit : y > limit ? limit : y;
        g[k] = x / (1.0f + exp_ref(alpha * -x)) * (y + 1.0f);
    }
}

/* K(d, j) of vec.h's attn_qk as its code (quantized) or value (F16/F32). */
static float k_code(const void *kt, int type, int64_t ld, int64_t d, int64_t j)
{
    switch (type) {
    case DT_F16: return kern_f16_to_f32(((const uint16_t *)kt)[d * ld + j]);
    case DT_F32: return ((const float *)kt)[d * ld + j];
    case DT_Q8_0: return (float)((const int8_t *)kt)[4 * ((d / 4) * ld + j) + d % 4];
    default: {
        int64_t c = d / 32, i = d % 32;
        uint8_t b = ((const uint8_t *)kt)[(16 * c + i % 16) * ld + j];
        return (float)((i < 16 ? b & 15 : b >> 4) - 8);
    }
    }
}

/* roundf(v) as an int8 for |v| <= 127 (x * id reaches at most 127 and a few ulps); beyond,
 * +-127 (an infinite id of a tiny scale), a NaN 0. No libm call: a decode quantizes every
 * query row of every layer. */
static int8_t round_code(float v)
{
    if (v != v)
        return 0;
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    int i = (int)v;
    float f = v - (float)i; /* exact: v's fraction */
    return (int8_t)(f >= 0.5f ? i + 1 : f <= -0.5f ? i - 1 : i);
}

void vec_q8_query(const float *x, int64_t hd, void *row)
{
    int8_t *code = row;
    float *qd = (float *)(code + hd);
    int32_t *bias = (int32_t *)(qd + hd / 32);
    for (int64_t c = 0; c < hd / 32; c++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fabsf(x[32 * c + i]) > amax ? fabsf(x[32 * c + i]) : amax;
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            code[32 * c + i] = round_code(x[32 * c + i] * id);
            sum += code[32 * c + i];
        }
        qd[c] = d;
        bias[c] = 128 * sum;
    }
}

/* Q8_0 K (vec.h attn_qk): integer dot products of each 32 dimensions with the query's codes. */
static void attn_qk_q8_ref(const void *q, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld,
                           int n, int64_t hd, float *s, int64_t lds)
{
    for (int r = 0; r < rows; r++) {
        const int8_t *qc = (const int8_t *)q + r * ldq;
        const float *qd = (const float *)(qc + hd);
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < hd / 32; c++) {
                int32_t dot = 0;
                for (int64_t d = 32 * c; d < 32 * c + 32; d++)
                    dot += (int32_t)qc[d] * ((const int8_t *)kt)[4 * ((d / 4) * ld + j) + d % 4];
                acc = fmaf((float)dot, qd[c] * kern_f16_to_f32(ks[c * ld + j]), acc);
            }
            s[r * lds + j] = acc;
        }
    }
}

static void attn_qk_ref(const void *qv, int64_t ldq, int rows, const void *kt, const uint16_t *ks, int64_t ld, int n,
                        int64_t hd, int type, float *s, int64_t lds)
{
    if (type == DT_Q8_0) {
        attn_qk_q8_ref(qv, ldq, rows, kt, ks, ld, n, hd, s, lds);
        return;
    }
    const float *q = qv;
    bool quant = type == DT_Q4_0;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            if (!quant) {
                for (int64_t d = 0; d < hd; d++)
                    acc = fmaf(q[r * ldq + d], k_code(kt, type, ld, d, j), acc);
            } else {
                for (int64_t c = 0; c < hd / 32; c++) {
                    float u = 0.0f;
                    for (int64_t d = 32 * c; d < 32 * c + 32; d++)
                        u = fmaf(q[r * ldq + d], k_code(kt, type, ld, d, j), u);
                    acc = fmaf(u, kern_f16_to_f32(ks[c * ld + j]), acc);
                }
            }
            s[r * lds + j] = acc;
        }
}

static void attn_pv_ref(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, const int32_t *n,
                        const void *const *v, int64_t hd, int type, const struct vec_prefetch *pf)
{
    vec_prefetch_all(pf);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n[r]; j++) {
            float pj = p[r * ldp + j], *y = o + r * ldo;
            if (type == DT_F16 || type == DT_F32) {
                for (int64_t i = 0; i < hd; i++)
                    y[i] = fmaf(pj, type == DT_F16 ? kern_f16_to_f32(((const uint16_t *)v[j])[i]) : ((const float *)v[j])[i], y[i]);
            } else if (type == DT_Q8_0) {
                const struct block_q8_0 *b = v[j];
                for (int64_t c = 0; c < hd / 32; c++) {
                    float w = pj * kern_f16_to_f32(b[c].d);
                    for (int i = 0; i < 32; i++)
                        y[32 * c + i] = fmaf(w, (float)b[c].qs[i], y[32 * c + i]);
                }
            } else {
                const struct block_q4_0 *b = v[j];
                for (int64_t c = 0; c < hd / 32; c++) {
                    float w = pj * kern_f16_to_f32(b[c].d);
                    for (int i = 0; i < 32; i++) {
                        uint8_t x = b[c].qs[i % 16];
                        y[32 * c + i] = fmaf(w, (float)((i < 16 ? x & 15 : x >> 4) - 8), y[32 * c + i]);
                    }
                }
            }
        }
}

static float softmax_tile_ref(float *s, int64_t n, float *l)
{
    float m = s[0];
    for (int64_t j = 1; j < n; j++)
        m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < n; j++)
        s[j] = sexp_ref(s[j] - m);
    float lane[16] = {0};
    for (int64_t j = 0; j < n; j++)
        lane[j % 16] = lane[j % 16] + s[j];
    *l = reduce16(lane);
    return m;
}

/* attn_qk_paged as one attn_qk per block (the reference's and the variants' without their own). */
#define QK_PAGED_BY_BLOCK(name, qk)                                                                           \
    void name(const void *q, int64_t ldq, int rows, const void *const *kt, const uint16_t *const *ks, int bt,  \
              int n, int64_t hd, int type, float *s, int64_t lds, const struct vec_prefetch *pf)               \
    {                                                                                                         \
        vec_prefetch_all(pf);                                                                                 \
        for (int j0 = 0, b = 0; j0 < n; j0 += bt, b++)                                                        \
            qk(q, ldq, rows, kt[b], ks ? ks[b] : NULL, bt, n - j0 < bt ? n - j0 : bt, hd, type, s + j0, lds);   \
    }

static QK_PAGED_BY_BLOCK(attn_qk_paged_ref, attn_qk_ref)

static void f16_to_f32_ref(const uint16_t *x, int64_t ldx, float *y, int64_t ldy, int rows, int64_t n)
{
    for (int r = 0; r < rows; r++)
        for (int64_t k = 0; k < n; k++)
            y[r * ldy + k] = kern_f16_to_f32(x[r * ldx + k]);
}

static void f32_to_f16_ref(const float *x, int64_t n, uint16_t *y, int64_t ldy)
{
    for (int64_t k = 0; k < n; k++)
        y[k * ldy] = kern_f32_to_f16(x[k]);
}

static void attn_pv_merge_ref(float *o, int64_t ldo, int rows, const float *p, int64_t ldp, int n,
                              const void *const *v, int64_t hd, int type, const float *f)
{
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < hd; i++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++)
                acc = fmaf(p[r * ldp + j],
                           type == DT_F16 ? kern_f16_to_f32(((const uint16_t *)v[j])[i]) : ((const float *)v[j])[i], acc);
            o[r * ldo + i] = o[r * ldo + i] * f[2 * r] + acc * f[2 * r + 1];
        }
}

static const struct vec_ops ref_ops = {dot_f32_ref,      exp_sub_ref,       silu_mul_ref,   attn_qk_ref,
                                       attn_pv_ref,      softmax_tile_ref,  attn_qk_paged_ref,
                                       f16_to_f32_ref,   vec_q8_query,      f32_to_f16_ref, attn_pv_merge_ref, NULL,
                                       swiglu_oai_ref};

const struct vec_ops *vec_ops_ref(void) { return &ref_ops; }

/* In vec_avx2.c and vec_avx512.c (x86-64) and vec_neon.c (ARM64), compiled for those
 * ISAs; called only after a CPU check. */
const struct vec_ops *vec_ops_avx2(void);
const struct vec_ops *vec_ops_avx512(void);
const struct vec_ops *vec_ops_avx512_novnni(void);
const struct vec_ops *vec_ops_neon(void);

static bool has_avx512(const struct cpu_features *f)
{
    return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
}

static bool has_avx2(const struct cpu_features *f) { return f->avx2 && f->fma && f->f16c; }

const struct vec_ops *vec_ops_variant(const char *name)
{
    const struct cpu_features *f = cpu_features();
    if (!strcmp(name, "ref"))
        return &ref_ops;
#if defined(__x86_64__)
    if (!strcmp(name, "avx2") && has_avx2(f))
        return vec_ops_avx2();
    if (!strcmp(name, "avx512") && has_avx512(f))
        return f->avx512vnni ? vec_ops_avx512() : vec_ops_avx512_novnni();
    if (!strcmp(name, "avx512-novnni") && has_avx512(f))
        return vec_ops_avx512_novnni();
#elif defined(__aarch64__)
    if (!strcmp(name, "neon") && f->asimd)
        return vec_ops_neon();
#endif
    (void)f;
    return NULL;
}

const struct vec_ops *vec_ops_best(void)
{
    const struct cpu_features *f = cpu_features();
#if defined(__x86_64__)
    if (has_avx512(f))
        return f->avx512vnni ? vec_ops_avx512() : vec_ops_avx512_novnni();
    if (has_avx2(f))
        return vec_ops_avx2();
#elif defined(__aarch64__)
    if (f->asimd)
        return vec_ops_neon();
#endif
    (void)f;
    (void)has_avx2;
    (void)has_avx512;
    return &ref_ops;
}
