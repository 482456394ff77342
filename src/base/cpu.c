#include "base/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

static struct cpu_features detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

/* The data cache line from sysconf where the C library knows it (ARM64 reads CTR_EL0
 * for us), else 64. */
static int cache_line_bytes(void)
{
#ifdef _SC_LEVEL1_DCACHE_LINESIZE
    long n = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
    if (n >= 16 && n <= 1024 && (n & (n - 1)) == 0)
        return (int)n;
#endif
    return 64;
}

#if defined(__x86_64__)

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static unsigned long long xgetbv0(void)
{
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect_isa(struct cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    unsigned max_leaf = a;
    f->x86_amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* AuthenticAMD */
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    unsigned base_family = (a >> 8) & 0xf;
    f->x86_family = (int)(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
    bool osxsave = c & (1u << 27);
    bool avx = c & (1u << 28);
    f->fma = c & (1u << 12);
    f->f16c = c & (1u << 29);
    unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_ok = (xcr0 & 6) == 6;
    bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!avx || !ymm_ok)
        f->fma = f->f16c = false;
    /* leaf 7 (and its subleaf 1) only where the CPU has it: an older CPU answers a leaf
     * above its highest with the highest leaf's bits, which would read as features */
    a = b = c = d = 0;
    if (max_leaf >= 7)
        __cpuid_count(7, 0, a, b, c, d);
    unsigned max_subleaf7 = a;
    f->avx2 = avx && ymm_ok && (b & (1u << 5));
    f->bmi2 = b & (1u << 8);
    if (zmm_ok) {
        f->avx512f = b & (1u << 16);
        f->avx512dq = b & (1u << 17);
        f->avx512bw = b & (1u << 30);
        f->avx512vl = b & (1u << 31);
        f->avx512vnni = c & (1u << 11);
    }
    f->gfni = c & (1u << 8);
    f->amx_bf16 = d & (1u << 22);
    f->amx_tile = d & (1u << 24);
    f->amx_int8 = d & (1u << 25);
    a = 0;
    if (max_leaf >= 7 && max_subleaf7 >= 1)
        __cpuid_count(7, 1, a, b, c, d);
    f->avx512bf16 = zmm_ok && (a & (1u << 5));
    if (f->amx_tile)
        f->amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;

    unsigned brand[12] = {0};
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2],
                        &brand[4 * i + 3]);
        memcpy(f->model, brand, sizeof f->model - 1 < sizeof brand ? sizeof f->model - 1 : sizeof brand);
    }
}

#elif defined(__aarch64__)

/* Bits of the kernel's AT_HWCAP/AT_HWCAP2 (arch/arm64/include/uapi/asm/hwcap.h), spelled
 * out so that old C library headers do not matter. */
#define HWCAP_ASIMD_BIT (1ul << 1)
#define HWCAP_ASIMDHP_BIT (1ul << 10)
#define HWCAP_ASIMDDP_BIT (1ul << 20)
#define HWCAP2_I8MM_BIT (1ul << 13)

static void detect_isa(struct cpu_features *f)
{
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f->asimd = hw & HWCAP_ASIMD_BIT;
    f->fp16 = f->asimd && (hw & HWCAP_ASIMDHP_BIT);
    f->asimddp = f->asimd && (hw & HWCAP_ASIMDDP_BIT);
    f->i8mm = f->asimd && (hw2 & HWCAP2_I8MM_BIT);
}

#else

static void detect_isa(struct cpu_features *f) { (void)f; }

#endif

static void detect(void)
{
    detect_isa(&detected);
    detected.cache_line = cache_line_bytes();
}

const struct cpu_features *cpu_features(void)
{
    pthread_once(&detect_once, detect);
    return &detected;
}

void cpu_features_string(const struct cpu_features *f, char *buf, int len)
{
    struct { bool on; const char *name; } list[] = {
        {f->avx2, "avx2"},         {f->fma, "fma"},           {f->f16c, "f16c"},
        {f->avx512f, "avx512f"},   {f->avx512bw, "avx512bw"}, {f->avx512vnni, "avx512vnni"},
        {f->avx512bf16, "avx512bf16"}, {f->gfni, "gfni"}, {f->amx_tile, "amx"},  {f->amx_granted, "amx-granted"},
        {f->asimd, "asimd"},       {f->asimddp, "asimddp"},   {f->i8mm, "i8mm"},
        {f->fp16, "fp16"},
    };
    int n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0] && n < len; i++)
        if (list[i].on)
            n += snprintf(buf + n, (size_t)(len - n), "%s%s", n ? " " : "", list[i].name);
}
