/* AVX2 kernels of kern_matmul over the 8-row interleaved layout (simd_mat.h). */
#include <immintrin.h>

#include "kern/simd_mat.h"

void kern_mat_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                       size_t ldy, int64_t r0, int64_t r1)
{
    (void)v, (void)xq, (void)ldx, (void)B, (void)y, (void)ldy, (void)r0, (void)r1;
}
