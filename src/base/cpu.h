/* Run-time CPU feature detection, so one binary picks the best kernels on any x86-64. */
#ifndef CAIRN_BASE_CPU_H
#define CAIRN_BASE_CPU_H

#include <stdbool.h>

struct cpu_features {
    bool avx2, fma, f16c, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool amx_tile, amx_int8, amx_bf16;
    bool amx_granted; /* the OS allowed tile state (arch_prctl ARCH_REQ_XCOMP_PERM) */
    char model[64];
};

/* Features of this CPU, detected once (thread-safe). AMX is granted on first call. */
const struct cpu_features *cpu_features(void);

/* Space-separated list of the features above that are present, for logs and bench. */
void cpu_features_string(const struct cpu_features *f, char *buf, int len);

#endif
