/* ARM64 kernels of kern_matmul with the ARMv8.2-A dot product (SDOT by element), compiled
 * with -march=armv8.2-a+dotprod and called only where the CPU reports asimddp: the body
 * is mat_neon_body.h. */
#if defined(__aarch64__)  /* an ARM64 file: empty on other architectures */
#define NEON_DOT 1
#define NEON_RUN kern_mat_neondot_run
#include "kern/mat_neon_body.h"
#endif
