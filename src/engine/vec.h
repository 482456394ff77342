/* Vector helpers of the forward pass (norms, RoPE, attention), each with one fixed
 * order of float operations so results are identical on every path:
 *   dot products: 16 lanes, element k into lane k%16 with lane += a*b (a multiply then
 *   an add, never fused), then for s = 8,4,2,1: lane[l] += lane[l+s]; result lane[0].
 *   axpy: y[k] = y[k] + a*x[k] (multiply then add).
 * vec_init picks the SIMD variant for this CPU; the scalar ones are the reference. */
#ifndef CAIRN_ENGINE_VEC_H
#define CAIRN_ENGINE_VEC_H

#include <stdint.h>

struct vec_ops {
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f16)(const float *a, const uint16_t *b, int64_t n); /* b is IEEE half */
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*to_f16)(uint16_t *dst, const float *src, int64_t n);     /* round to nearest even */
    /* Attention over n cached rows of half floats: out[p] = dot_f16(q, rows[p], hd), and
     * acc[i] = acc[i] + w[p]*rows[p][i] for p in order: the same bits as the single-row
     * calls, with the accumulators kept in registers. */
    void (*dots_f16)(const float *q, const uint16_t *const *rows, int64_t n, int64_t hd, float *out);
    void (*wsum_f16)(float *acc, const float *w, const uint16_t *const *rows, int64_t n, int64_t hd);
};

/* The reference (scalar) variant. */
const struct vec_ops *vec_ops_ref(void);
/* A variant by name ("ref", "avx2", "avx512"), or NULL when this CPU lacks it. */
const struct vec_ops *vec_ops_variant(const char *name);
/* The fastest variant this CPU runs. */
const struct vec_ops *vec_ops_best(void);

#endif
