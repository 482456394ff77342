/* One table of the row conversions each type has (convert.h), behind the two entry
 * points of kern.h. */
#include "kern/convert.h"

#include <string.h>

#include "base/dtype.h"
#include "base/err.h"
#include "kern/kern.h"

static void f32_to_float(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *src, float *y, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f16_to_f32(h[i]);
}

static void bf16_to_float(const void *src, float *y, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_bf16_to_f32(h[i]);
}

static void f32_from_float(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * sizeof(float)); }

static void f16_from_float(const float *x, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = kern_f32_to_f16(x[i]);
}

static void bf16_from_float(const float *x, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = kern_f32_to_bf16(x[i]);
}

struct type_traits {
    void (*to_float)(const void *src, float *y, int64_t nb);
    void (*from_float)(const float *x, void *dst, int64_t nb);
};

static const struct type_traits traits[DT_COUNT] = {
    [DT_F32] = {f32_to_float, f32_from_float},
    [DT_F16] = {f16_to_float, f16_from_float},
    [DT_BF16] = {bf16_to_float, bf16_from_float},
    [DT_Q4_0] = {kern_deq_q4_0, kern_quant_q4_0},
    [DT_Q4_1] = {kern_deq_q4_1, kern_quant_q4_1},
    [DT_Q5_0] = {kern_deq_q5_0, kern_quant_q5_0},
    [DT_Q5_1] = {kern_deq_q5_1, kern_quant_q5_1},
    [DT_Q8_0] = {kern_deq_q8_0, kern_quant_q8_0},
    [DT_Q4_K] = {kern_deq_q4_k, kern_quant_q4_k},
    [DT_Q5_K] = {kern_deq_q5_k, kern_quant_q5_k},
    [DT_Q6_K] = {kern_deq_q6_k, kern_quant_q6_k},
    [DT_Q2_K] = {kern_deq_q2_k, kern_quant_q2_k},
    [DT_Q3_K] = {kern_deq_q3_k, kern_quant_q3_k},
    [DT_IQ4_NL] = {kern_deq_iq4_nl, kern_quant_iq4_nl},
    [DT_IQ4_XS] = {kern_deq_iq4_xs, kern_quant_iq4_xs},
    [DT_MXFP4] = {kern_deq_mxfp4, kern_quant_mxfp4},
};

/* The traits of a supported type and the blocks of n elements; NULL with *rc set. */
static const struct type_traits *lookup(int type, int64_t n, int64_t *nb, int *rc)
{
    const struct dtype_info *t = dtype_info(type);
    if (!t || !t->supported || type < 0 || type >= DT_COUNT || !traits[type].to_float) {
        *rc = CAIRN_EUNSUPPORTED;
        return NULL;
    }
    if (n < 0 || n % t->block_elems) {
        *rc = CAIRN_EINVAL;
        return NULL;
    }
    *nb = n / t->block_elems;
    return &traits[type];
}

int kern_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    int64_t nb = 0;
    int rc = 0;
    const struct type_traits *tr = lookup(type, n, &nb, &rc);
    if (tr)
        tr->to_float(src, dst, nb);
    return rc;
}

int kern_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    int64_t nb = 0;
    int rc = 0;
    const struct type_traits *tr = lookup(type, n, &nb, &rc);
    if (tr)
        tr->from_float(src, dst, nb);
    return rc;
}
