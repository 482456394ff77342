/* ARM64 kernels of kern_matmul with ARMv8-A NEON alone (every ARM64 CPU has it): the
 * body is mat_neon_body.h, here without the dot product instructions. */
#include <stdbool.h>

#include "base/dtype.h"
#include "kern/simd_mat.h"

/* The types mat_neon_body.h computes; any other (e.g. a type with an x86 kernel only)
 * takes the reference path on ARM64. */
bool kern_mat_neon_has_type(int type)
{
#if defined(__aarch64__)
    switch (type) {
    case DT_F32: case DT_F16: case DT_BF16:
    case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_Q8_0:
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K:
    case DT_Q2_K: case DT_Q3_K: case DT_IQ4_NL: case DT_IQ4_XS: case DT_MXFP4:
        return true;
    default:
        return false;
    }
#else
    (void)type;
    return false;
#endif
}

#if defined(__aarch64__)
#define NEON_RUN kern_mat_neon_run
#include "kern/mat_neon_body.h"
#endif
