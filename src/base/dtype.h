/* Tensor element types as GGUF numbers them (ggml's type ids). The table gives each
 * type's block: how many elements one block holds and how many bytes it takes. Every
 * type a GGUF file may carry is listed, so a file opens and is validated even when
 * its types cannot be computed with; `supported` says which ones the kernels handle. */
#ifndef CAIRN_BASE_DTYPE_H
#define CAIRN_BASE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

enum dtype {
    DT_F32 = 0, DT_F16 = 1, DT_Q4_0 = 2, DT_Q4_1 = 3, DT_Q5_0 = 6, DT_Q5_1 = 7,
    DT_Q8_0 = 8, DT_Q8_1 = 9, DT_Q2_K = 10, DT_Q3_K = 11, DT_Q4_K = 12, DT_Q5_K = 13,
    DT_Q6_K = 14, DT_Q8_K = 15, DT_IQ2_XXS = 16, DT_IQ2_XS = 17, DT_IQ3_XXS = 18,
    DT_IQ1_S = 19, DT_IQ4_NL = 20, DT_IQ3_S = 21, DT_IQ2_S = 22, DT_IQ4_XS = 23,
    DT_I8 = 24, DT_I16 = 25, DT_I32 = 26, DT_I64 = 27, DT_F64 = 28, DT_IQ1_M = 29,
    DT_BF16 = 30, DT_TQ1_0 = 34, DT_TQ2_0 = 35, DT_MXFP4 = 39,
    DT_COUNT = 40
};

struct dtype_info {
    const char *name;     /* "Q4_K"; NULL for ids that name no type */
    int block_elems;      /* elements per block */
    int block_bytes;      /* bytes per block */
    bool supported;       /* the kernels can compute with it */
};

/* Info of a type id, or NULL when the id names no type. */
const struct dtype_info *dtype_info(int type);

/* Name of a type id ("Q4_K"), or "type#N" for an unknown id (static buffer per call
 * site is not used: unknown ids return "unknown"). */
const char *dtype_name(int type);

/* Type id for a name, case-insensitive ("q4_k" -> DT_Q4_K), or -1. */
int dtype_from_name(const char *name);

/* Bytes of a row of n elements, or -1 when n is not a multiple of the block size or
 * the type is unknown. */
int64_t dtype_row_bytes(int type, int64_t n);

/* The types a KV cache may hold (F16, F32, Q8_0, Q4_0, as llama.cpp's -ctk/-ctv):
 * the id for a name, case-insensitive, or -1 for any other; and the lowercase name of
 * such an id ("q8_0"), or NULL for any other. */
int dtype_kv_from_name(const char *name);
const char *dtype_kv_name(int type);

#endif
