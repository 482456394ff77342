/* Row conversions of each GGUF type, to float and from float, in block units (kern
 * only: the rest of cairn calls kern_dequantize_row and kern_quantize_row, which look
 * the type up in one table in convert.c). nb counts blocks (elements for F32/F16/BF16). */
#ifndef CAIRN_KERN_CONVERT_H
#define CAIRN_KERN_CONVERT_H

#include <stdint.h>

/* quant.c: blocks to floats */
void kern_deq_q4_0(const void *src, float *y, int64_t nb);
void kern_deq_q4_1(const void *src, float *y, int64_t nb);
void kern_deq_q5_0(const void *src, float *y, int64_t nb);
void kern_deq_q5_1(const void *src, float *y, int64_t nb);
void kern_deq_q8_0(const void *src, float *y, int64_t nb);
void kern_deq_q4_k(const void *src, float *y, int64_t nb);
void kern_deq_q5_k(const void *src, float *y, int64_t nb);
void kern_deq_q6_k(const void *src, float *y, int64_t nb);
void kern_deq_q2_k(const void *src, float *y, int64_t nb);
void kern_deq_q3_k(const void *src, float *y, int64_t nb);
void kern_deq_iq4_nl(const void *src, float *y, int64_t nb);
void kern_deq_iq4_xs(const void *src, float *y, int64_t nb);
void kern_deq_mxfp4(const void *src, float *y, int64_t nb);

/* quantize.c: floats to blocks */
void kern_quant_q4_0(const float *x, void *dst, int64_t nb);
void kern_quant_q4_1(const float *x, void *dst, int64_t nb);
void kern_quant_q5_0(const float *x, void *dst, int64_t nb);
void kern_quant_q5_1(const float *x, void *dst, int64_t nb);
void kern_quant_q8_0(const float *x, void *dst, int64_t nb);
void kern_quant_q4_k(const float *x, void *dst, int64_t nb);
void kern_quant_q5_k(const float *x, void *dst, int64_t nb);
void kern_quant_q6_k(const float *x, void *dst, int64_t nb);
void kern_quant_q2_k(const float *x, void *dst, int64_t nb);
void kern_quant_q3_k(const float *x, void *dst, int64_t nb);
void kern_quant_iq4_nl(const float *x, void *dst, int64_t nb);
void kern_quant_iq4_xs(const float *x, void *dst, int64_t nb);
void kern_quant_mxfp4(const float *x, void *dst, int64_t nb);

#endif
