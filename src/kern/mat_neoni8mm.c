/* ARM64 kernels of kern_matmul with the int8 matrix multiply (SMMLA) for pairs of
 * activation rows and the dot product (SDOT) for a row left over, compiled with
 * -march=armv8.2-a+dotprod+i8mm and called only where the CPU reports asimddp and i8mm:
 * the body is mat_neon_body.h. */
#if defined(__aarch64__)  /* an ARM64 file: empty on other architectures */
#define NEON_DOT 1
#define NEON_I8MM 1
#define NEON_RUN kern_mat_neoni8mm_run
#include "kern/mat_neon_body.h"
#endif
