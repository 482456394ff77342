/* Dequantization of GGUF rows to float, with ggml's block layouts and its float
 * formulas (so our values equal ggml's bit for bit). */
#include "kern/kern.h"
#include "kern/convert.h"
#include "kern/quant.h"

#include <string.h>

#include "base/err.h"

void kern_deq_q4_0(const void *src, float *y, int64_t nb)
{
    const struct block_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d);
        for (int j = 0; j < QK32 / 2; j++) {
            y[j] = (float)((b->qs[j] & 0xf) - 8) * d;
            y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

void kern_deq_q4_1(const void *src, float *y, int64_t nb)
{
    const struct block_q4_1 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d), m = kern_f16_to_f32(b->m);
        for (int j = 0; j < QK32 / 2; j++) {
            y[j] = (float)(b->qs[j] & 0xf) * d + m;
            y[j + 16] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

static uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kern_deq_q5_0(const void *src, float *y, int64_t nb)
{
    const struct block_q5_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d);
        uint32_t qh = load_u32le(b->qh);
        for (int j = 0; j < QK32 / 2; j++) {
            int q0 = (b->qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            int q1 = (b->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

void kern_deq_q5_1(const void *src, float *y, int64_t nb)
{
    const struct block_q5_1 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d), m = kern_f16_to_f32(b->m);
        uint32_t qh = load_u32le(b->qh);
        for (int j = 0; j < QK32 / 2; j++) {
            int q0 = (b->qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            int q1 = (b->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

void kern_deq_q8_0(const void *src, float *y, int64_t nb)
{
    const struct block_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d);
        for (int j = 0; j < QK32; j++)
            y[j] = (float)b->qs[j] * d;
    }
}

/* Q4_K: 4 chunks of 64; chunk c holds sub-blocks 2c (low nibbles of qs[32c..32c+31])
 * and 2c+1 (high nibbles). */
void kern_deq_q4_k(const void *src, float *y, int64_t nb)
{
    const struct block_q4_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = kern_f16_to_f32(b->d), dmin = kern_f16_to_f32(b->dmin);
        const uint8_t *q = b->qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, m;
            kern_k4_scale_min(2 * c, b->scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            kern_k4_scale_min(2 * c + 1, b->scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* Q5_K: as Q4_K; the fifth bit of element l of sub-block j is bit j of qh[l]. */
void kern_deq_q5_k(const void *src, float *y, int64_t nb)
{
    const struct block_q5_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = kern_f16_to_f32(b->d), dmin = kern_f16_to_f32(b->dmin);
        const uint8_t *q = b->qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, m;
            kern_k4_scale_min(2 * c, b->scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            kern_k4_scale_min(2 * c + 1, b->scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xf) | ((b->qh[l] >> (2 * c)) & 1) << 4) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) | ((b->qh[l] >> (2 * c + 1)) & 1) << 4) - m2;
        }
    }
}

/* Q6_K: two halves of 128; in half h, element 32k + l (k = 0..3, l = 0..31) has its low
 * 4 bits in ql[64h + l + 32(k&1)] (low nibble for k < 2, high for k >= 2) and its high
 * 2 bits at bit 2k of qh[32h + l]; its scale is scales[(128h + 32k + l) / 16]. */
void kern_deq_q6_k(const void *src, float *y, int64_t nb)
{
    const struct block_q6_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = kern_f16_to_f32(b->d);
        for (int e = 0; e < QK_K; e++)
            y[e] = d * (float)b->scales[e / 16] * (float)(kern_q6k_get(b, e) - 32);
        y += QK_K;
    }
}

/* Q2_K: sub-block j = e/16 has value d*(sc&15)*q - dmin*(sc>>4). */
void kern_deq_q2_k(const void *src, float *y, int64_t nb)
{
    const struct block_q2_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
        float d = kern_f16_to_f32(b->d), dmin = kern_f16_to_f32(b->dmin);
        for (int j = 0; j < 16; j++) {
            float dl = d * (float)(b->scales[j] & 0xf), ml = dmin * (float)(b->scales[j] >> 4);
            for (int e = 16 * j; e < 16 * j + 16; e++)
                y[e] = dl * (float)kern_q2bits_get(b->qs, e) - ml;
        }
    }
}

/* Q3_K: sub-block j = e/16 has value d*(sc-32)*(q-4). */
void kern_deq_q3_k(const void *src, float *y, int64_t nb)
{
    const struct block_q3_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
        float d = kern_f16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            float dl = d * (float)(kern_q3k_scale(b->scales, j) - 32);
            for (int e = 16 * j; e < 16 * j + 16; e++)
                y[e] = dl * (float)(kern_q3k_get(b, e) - 4);
        }
    }
}

void kern_deq_iq4_nl(const void *src, float *y, int64_t nb)
{
    const struct block_iq4_nl *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_f16_to_f32(b->d);
        for (int e = 0; e < QK32; e++)
            y[e] = d * (float)kern_iq4nl_values[kern_nib32_get(b->qs, e)];
    }
}

void kern_deq_iq4_xs(const void *src, float *y, int64_t nb)
{
    const struct block_iq4_xs *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
        float d = kern_f16_to_f32(b->d);
        for (int j = 0; j < 8; j++) {
            float dl = d * (float)(kern_iq4xs_scale(b, j) - 32);
            for (int e = 32 * j; e < 32 * j + 32; e++)
                y[e] = dl * (float)kern_iq4nl_values[kern_iq4xs_get(b, e)];
        }
    }
}

void kern_deq_mxfp4(const void *src, float *y, int64_t nb)
{
    const struct block_mxfp4 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += QK32) {
        float d = kern_e8m0_half(b->e);
        for (int e = 0; e < QK32; e++)
            y[e] = (float)kern_mxfp4_values[kern_nib32_get(b->qs, e)] * d;
    }
}
