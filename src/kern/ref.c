/* The reference product: activation quantization and one dot product per output
 * element, written as the canonical float sequence of kern.h that every SIMD path must
 * reproduce bit for bit. Every float step is an explicit fmaf or a plain operation
 * (the build uses -ffp-contract=off, so nothing is fused behind our back). */
#include "base/cpu.h"
#include "kern/kern.h"
#include "kern/quant.h"

#include <math.h>
#include <string.h>

/* Activation format of a weight type, or -1 for types the kernels do not handle. */
static int act_kind(int wtype)
{
    const struct dtype_info *t = dtype_info(wtype);
    return t && t->supported ? (int)kern_act_kind(wtype) : -1;
}

size_t kern_act_row_bytes(int wtype, int64_t n)
{
    if (n < 0)
        return 0;
    switch (act_kind(wtype)) {
    case KERN_ACT_F32: return (size_t)n * sizeof(float);
    case KERN_ACT_Q8_32: return (size_t)(n / QK32) * sizeof(struct act_q8_32);
    case KERN_ACT_Q8_256: return (size_t)(n / QK_K) * sizeof(struct act_q8_256);
    default: return 0;
    }
}

/* Scale of a block per kern.h: d = amax/127, id = 127/amax (0 for an all-zero block). */
static void act_scale(const float *x, int n, float *d, float *id)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax)
            amax = a;
    }
    *d = amax / 127.0f;
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
}

/* nearbyintf(v) as int8; only non-finite input can leave [-127, 127], and it is
 * clamped (NaN to 0) so that it stays defined. */
static int8_t act_round(float v)
{
    float r = nearbyintf(v);
    if (r >= 127.0f)
        return 127;
    if (r <= -127.0f)
        return -127;
    if (r != r)
        return 0;
    return (int8_t)r;
}

/* In act_avx512.c (x86-64) and act_neon.c (ARM64): the same bits, a vector at a time. */
void kern_act_q8_32_avx512(const float *x, struct act_q8_32 *a, int64_t n_blocks);
void kern_act_q8_256_avx512(const float *x, struct act_q8_256 *a, int64_t n_blocks);
void kern_act_q8_32_neon(const float *x, struct act_q8_32 *a, int64_t n_blocks);
void kern_act_q8_256_neon(const float *x, struct act_q8_256 *a, int64_t n_blocks);

void kern_act_quantize(int wtype, const float *x, void *xq, int64_t n)
{
    const struct cpu_features *f = cpu_features();
#if defined(__x86_64__)
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) {
        if (act_kind(wtype) == KERN_ACT_Q8_32) {
            kern_act_q8_32_avx512(x, xq, n / QK32);
            return;
        }
        if (act_kind(wtype) == KERN_ACT_Q8_256) {
            kern_act_q8_256_avx512(x, xq, n / QK_K);
            return;
        }
    }
#elif defined(__aarch64__)
    if (f->asimd) {
        if (act_kind(wtype) == KERN_ACT_Q8_32) {
            kern_act_q8_32_neon(x, xq, n / QK32);
            return;
        }
        if (act_kind(wtype) == KERN_ACT_Q8_256) {
            kern_act_q8_256_neon(x, xq, n / QK_K);
            return;
        }
    }
#endif
    (void)f;
    kern_act_quantize_ref(wtype, x, xq, n);
}

void kern_act_quantize_ref(int wtype, const float *x, void *xq, int64_t n)
{
    switch (act_kind(wtype)) {
    case KERN_ACT_F32:
        memcpy(xq, x, (size_t)n * sizeof(float));
        break;
    case KERN_ACT_Q8_32: {
        struct act_q8_32 *a = xq;
        for (int64_t b = 0; b < n / QK32; b++, a++, x += QK32) {
            float id;
            act_scale(x, QK32, &a->d, &id);
            int32_t sum = 0;
            for (int i = 0; i < QK32; i++) {
                a->q[i] = act_round(x[i] * id);
                sum += a->q[i];
            }
            a->sum = sum;
        }
        break;
    }
    case KERN_ACT_Q8_256: {
        struct act_q8_256 *a = xq;
        for (int64_t b = 0; b < n / QK_K; b++, a++, x += QK_K) {
            float id;
            act_scale(x, QK_K, &a->d, &id);
            for (int j = 0; j < QK_K / 16; j++) {
                int sum = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++) {
                    a->q[i] = act_round(x[i] * id);
                    sum += a->q[i];
                }
                a->bsums[j] = (int16_t)sum;
            }
        }
        break;
    }
    default:
        break;
    }
}

/* ---- one dot product per weight type ---- */

/* Float weights: 16 lanes, element k into lane k%16, then a halving tree. */
static float lanes_reduce(float *lane)
{
    for (int s = 8; s >= 1; s /= 2)
        for (int l = 0; l < s; l++)
            lane[l] = lane[l] + lane[l + s];
    return lane[0];
}

static float dot_f32(const float *w, const float *x, int64_t n)
{
    float lane[16] = {0};
    for (int64_t k = 0; k < n; k++)
        lane[k % 16] = fmaf(w[k], x[k], lane[k % 16]);
    return lanes_reduce(lane);
}

static float dot_f16(const uint16_t *w, const float *x, int64_t n)
{
    float lane[16] = {0};
    for (int64_t k = 0; k < n; k++)
        lane[k % 16] = fmaf(kern_f16_to_f32(w[k]), x[k], lane[k % 16]);
    return lanes_reduce(lane);
}

static float dot_bf16(const uint16_t *w, const float *x, int64_t n)
{
    float lane[16] = {0};
    for (int64_t k = 0; k < n; k++)
        lane[k % 16] = fmaf(kern_bf16_to_f32(w[k]), x[k], lane[k % 16]);
    return lanes_reduce(lane);
}

static float dot_q4_0(const struct block_q4_0 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((w[i].qs[j] & 0xf) - 8) * x[i].q[j];
            isum += ((w[i].qs[j] >> 4) - 8) * x[i].q[j + 16];
        }
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q4_1(const struct block_q4_1 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (w[i].qs[j] & 0xf) * x[i].q[j];
            isum += (w[i].qs[j] >> 4) * x[i].q[j + 16];
        }
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
        acc = fmaf(kern_f16_to_f32(w[i].m) * x[i].d, (float)x[i].sum, acc);
    }
    return acc;
}

static int q5_get(const uint8_t *qs, const uint8_t *qh, int e)
{
    int lo = e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
    return lo | ((qh[e / 8] >> (e % 8)) & 1) << 4;
}

static float dot_q5_0(const struct block_q5_0 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < QK32; e++)
            isum += (q5_get(w[i].qs, w[i].qh, e) - 16) * x[i].q[e];
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q5_1(const struct block_q5_1 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < QK32; e++)
            isum += q5_get(w[i].qs, w[i].qh, e) * x[i].q[e];
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
        acc = fmaf(kern_f16_to_f32(w[i].m) * x[i].d, (float)x[i].sum, acc);
    }
    return acc;
}

static float dot_q8_0(const struct block_q8_0 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < QK32; e++)
            isum += w[i].qs[e] * x[i].q[e];
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q4_k(const struct block_q4_K *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            kern_k4_scale_min(j, w[i].scales, &sc, &mn);
            int32_t s = 0;
            for (int e = 32 * j; e < 32 * j + 32; e++)
                s += kern_q4k_get(&w[i], e) * x[i].q[e];
            isum += sc * s;
            msum += mn * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        float dx = x[i].d;
        acc = fmaf(kern_f16_to_f32(w[i].d) * dx, (float)isum, acc);
        acc = fmaf(-(kern_f16_to_f32(w[i].dmin) * dx), (float)msum, acc);
    }
    return acc;
}

static float dot_q5_k(const struct block_q5_K *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            kern_k4_scale_min(j, w[i].scales, &sc, &mn);
            int32_t s = 0;
            for (int e = 32 * j; e < 32 * j + 32; e++)
                s += kern_q5k_get(&w[i], e) * x[i].q[e];
            isum += sc * s;
            msum += mn * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        float dx = x[i].d;
        acc = fmaf(kern_f16_to_f32(w[i].d) * dx, (float)isum, acc);
        acc = fmaf(-(kern_f16_to_f32(w[i].dmin) * dx), (float)msum, acc);
    }
    return acc;
}

static float dot_q6_k(const struct block_q6_K *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                s += (kern_q6k_get(&w[i], e) - 32) * x[i].q[e];
            isum += w[i].scales[j] * s;
        }
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q2_k(const struct block_q2_K *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                s += kern_q2bits_get(w[i].qs, e) * x[i].q[e];
            isum += (w[i].scales[j] & 0xf) * s;
            msum += (w[i].scales[j] >> 4) * x[i].bsums[j];
        }
        float dx = x[i].d;
        acc = fmaf(kern_f16_to_f32(w[i].d) * dx, (float)isum, acc);
        acc = fmaf(-(kern_f16_to_f32(w[i].dmin) * dx), (float)msum, acc);
    }
    return acc;
}

static float dot_q3_k(const struct block_q3_K *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                s += (kern_q3k_get(&w[i], e) - 4) * x[i].q[e];
            isum += (kern_q3k_scale(w[i].scales, j) - 32) * s;
        }
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_iq4_nl(const struct block_iq4_nl *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < QK32; e++)
            isum += kern_iq4nl_values[kern_nib32_get(w[i].qs, e)] * x[i].q[e];
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_mxfp4(const struct block_mxfp4 *w, const struct act_q8_32 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < QK32; e++)
            isum += kern_mxfp4_values[kern_nib32_get(w[i].qs, e)] * x[i].q[e];
        acc = fmaf(kern_e8m0_half(w[i].e) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_iq4_xs(const struct block_iq4_xs *w, const struct act_q8_256 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int e = 32 * j; e < 32 * j + 32; e++)
                s += kern_iq4nl_values[kern_iq4xs_get(&w[i], e)] * x[i].q[e];
            isum += (kern_iq4xs_scale(&w[i], j) - 32) * s;
        }
        acc = fmaf(kern_f16_to_f32(w[i].d) * x[i].d, (float)isum, acc);
    }
    return acc;
}

static float dot_row(int type, const void *w, const void *x, int64_t cols)
{
    switch (type) {
    case DT_F32: return dot_f32(w, x, cols);
    case DT_F16: return dot_f16(w, x, cols);
    case DT_BF16: return dot_bf16(w, x, cols);
    case DT_Q4_0: return dot_q4_0(w, x, cols / QK32);
    case DT_Q4_1: return dot_q4_1(w, x, cols / QK32);
    case DT_Q5_0: return dot_q5_0(w, x, cols / QK32);
    case DT_Q5_1: return dot_q5_1(w, x, cols / QK32);
    case DT_Q8_0: return dot_q8_0(w, x, cols / QK32);
    case DT_Q4_K: return dot_q4_k(w, x, cols / QK_K);
    case DT_Q5_K: return dot_q5_k(w, x, cols / QK_K);
    case DT_Q6_K: return dot_q6_k(w, x, cols / QK_K);
    case DT_Q2_K: return dot_q2_k(w, x, cols / QK_K);
    case DT_Q3_K: return dot_q3_k(w, x, cols / QK_K);
    case DT_IQ4_NL: return dot_iq4_nl(w, x, cols / QK32);
    case DT_MXFP4: return dot_mxfp4(w, x, cols / QK32);
    case DT_IQ4_XS: return dot_iq4_xs(w, x, cols / QK_K);
    default: return 0.0f;
    }
}

void kern_matmul_ref(int type, const void *w, int64_t cols, const void *xq, size_t ldx, int B,
                     float *y, size_t ldy, int64_t r0, int64_t r1)
{
    int64_t rb = dtype_row_bytes(type, cols);
    if (rb < 0 || act_kind(type) < 0)
        return;
    for (int b = 0; b < B; b++) {
        const uint8_t *x = (const uint8_t *)xq + (size_t)b * ldx;
        for (int64_t r = r0; r < r1; r++)
            y[(size_t)b * ldy + (size_t)r] = dot_row(type, (const uint8_t *)w + r * rb, x, cols);
    }
}
