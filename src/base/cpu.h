/* Run-time CPU feature detection, so one binary picks the best kernels on any x86-64 or
 * ARM64 CPU. Fields of the other architecture stay false. */
#ifndef CAIRN_BASE_CPU_H
#define CAIRN_BASE_CPU_H

#include <stdbool.h>

struct cpu_features {
    bool avx2, fma, f16c, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool gfni; /* GF(2^8) affine byte transforms (Intel Ice Lake on, AMD Zen 4 on) */
    bool amx_tile, amx_int8, amx_bf16;
    bool amx_granted; /* the OS allowed tile state (arch_prctl ARCH_REQ_XCOMP_PERM) */
    /* ARM64 (from getauxval AT_HWCAP/AT_HWCAP2): NEON, the dot product (sdot/udot,
     * ARMv8.2), the int8 matrix multiply (smmla), half-float arithmetic */
    bool asimd, asimddp, i8mm, fp16;
    int cache_line; /* bytes of a data cache line (64 when the system does not say) */
    /* x86: AMD's vendor string, and the display family of CPUID leaf 1 (base plus
     * extended family), for tuning by microarchitecture (AMD Zen 4 is family 0x19 with
     * AVX-512, Zen 3 the same family without it, Zen 5 0x1a); 0 elsewhere */
    bool x86_amd;
    int x86_family;
    char model[64];
};

/* Features of this CPU, detected once (thread-safe). AMX is granted on first call. */
const struct cpu_features *cpu_features(void);

/* Space-separated list of the features above that are present, for logs and bench. */
void cpu_features_string(const struct cpu_features *f, char *buf, int len);

/* A hint inside a spin-wait loop (x86 PAUSE, ARM64 YIELD): lets the sibling hardware
 * thread run and saves power; a plain compiler barrier elsewhere. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#else
    __asm__ volatile("" ::: "memory");
#endif
}

#endif
