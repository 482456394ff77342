/* Memory read bandwidth in several access patterns (see bwprobe.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/bwprobe.h"

#include "base/clock.h"
#include "base/cpu.h"
#include "base/mem.h"
#include "base/pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STREAM_CHUNK 32 /* words (256 bytes) read from one stream before the next */

static const char *const STYLE_NAMES[N_BW_STYLES] = {"plain", "prefetch-L1", "prefetch-L2",
                                                     "4 streams", "8 streams", "8 streams+prefetch"};

const char *bw_style_name(int style)
{
    return style >= 0 && style < N_BW_STYLES ? STYLE_NAMES[style] : "?";
}

/* Streams per thread of a style. */
static int style_streams(int style)
{
    return style == BW_STREAMS4 ? 4 : style >= BW_STREAMS8 ? 8 : 1;
}

/* Sums n words with scalar loads: the path of machines without wide loads here (the
 * compiler vectorizes it with NEON on ARM64), and the tails of the others. */
static uint64_t sum_scalar(const uint64_t *p, long n)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    long i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    for (; i < n; i++)
        s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__)
/* Sums a range with the widest loads this CPU has (plain scalar loads understate the
 * bandwidth by a third on these machines). */
#define SUM_AVX512_LOOP(PF)                                                                 \
    for (; i + 32 <= n; i += 32) {                                                         \
        PF;                                                                                \
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));                              \
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));                          \
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));                         \
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));                         \
    }
#define PF4(dist, hint)                                                                     \
    do {                                                                                   \
        for (int l = 0; l < 4; l++)                                                        \
            _mm_prefetch((const char *)(p + i) + (dist) + 64 * l, hint);                   \
    } while (0)

/* Sums n words with 512-bit loads, one stream, prefetching as style says. */
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, long n, int style)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    if (style == BW_PF_L1)
        SUM_AVX512_LOOP(PF4(2048, _MM_HINT_T0))
    else if (style == BW_PF_L2)
        SUM_AVX512_LOOP(PF4(8192, _MM_HINT_T1))
    else
        SUM_AVX512_LOOP((void)0)
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))) +
           sum_scalar(p + i, n - i);
}

/* Sums `streams` consecutive runs of len words each (len a multiple of STREAM_CHUNK),
 * reading them in turn a chunk at a time, as a kernel reads several rows at once. */
__attribute__((target("avx512f"))) static uint64_t sum_streams_avx512(const uint64_t *p, long len, int streams,
                                                                      bool prefetch)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < len; i += STREAM_CHUNK)
        for (int s = 0; s < streams; s++) {
            const uint64_t *q = p + (long)s * len + i;
            if (prefetch) {
                _mm_prefetch((const char *)q + 4096, _MM_HINT_T1);
                _mm_prefetch((const char *)q + 4096 + 128, _MM_HINT_T1);
            }
            a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(q));
            a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(q + 8));
            a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(q + 16));
            a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(q + 24));
        }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

/* The same with 256-bit loads, for AVX2 machines. */
__attribute__((target("avx2"))) static uint64_t sum_streams_avx2(const uint64_t *p, long len, int streams,
                                                                 bool prefetch)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < len; i += STREAM_CHUNK)
        for (int s = 0; s < streams; s++) {
            const uint64_t *q = p + (long)s * len + i;
            if (prefetch)
                _mm_prefetch((const char *)q + 4096, _MM_HINT_T1);
            for (int k = 0; k < STREAM_CHUNK; k += 16) {
                a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(q + k)));
                a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(q + k + 4)));
                a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(q + k + 8)));
                a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(q + k + 12)));
            }
        }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

/* Sums n words in `streams` streams with the widest loads there are: the streams
 * cover whole chunks, the rest is read plainly. */
static uint64_t sum_streams(const uint64_t *p, long n, int streams, bool prefetch)
{
    long len = n / streams / STREAM_CHUNK * STREAM_CHUNK;
    long done = len * streams;
    uint64_t s = 0;
#if defined(__x86_64__)
    const struct cpu_features *f = cpu_features();
    if (f->avx512f)
        s = sum_streams_avx512(p, len, streams, prefetch);
    else if (f->avx2)
        s = sum_streams_avx2(p, len, streams, prefetch);
    else
        done = 0;
#else
    (void)prefetch;
    done = 0;
#endif
    return s + sum_scalar(p + done, n - done);
}

/* Words a thread claims at least at a time in a slice (64 KiB), and the unit claims are
 * cut in (1 KiB), so every claim starts on a cache line. */
#define CLAIM_UNIT 128
#define CLAIM_MIN_UNITS 64

struct bw_block {
    uint64_t *buf; /* word i holds i */
    size_t n;      /* words */
    size_t next;   /* the word the next slice starts at */
    int style;     /* the style of the next slice */
};

/* One slice's job: the threads claim its words a run at a time (as the engine's
 * products claim rows), so a thread that loses its CPU leaves its share to the others;
 * each notes when it began and ended reading, and its own rate over its CPU time. */
struct bw_slice {
    const uint64_t *buf; /* the slice's first word */
    long units;          /* its length in CLAIM_UNITs */
    int style;           /* enum bw_style */
    _Atomic long next;   /* the first unit not claimed */
    _Atomic uint64_t sum;
    _Atomic int64_t first_ns, last_ns; /* the earliest start and latest end of any thread's reading */
    _Atomic uint64_t cpu_rates;        /* the sum of the threads' bytes/s over their CPU time */
    _Atomic int readers;               /* threads that read a quarter of an even share or more */
    _Atomic int64_t max_rate;          /* the highest of those threads' rates (bytes/s) */
};

/* This thread's CPU time in ns (0 where the clock is missing). */
static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sums n words in style (one of the styles, or several streams). */
static uint64_t sum_style(const uint64_t *p, long n, int style)
{
#if defined(__x86_64__)
    if (style <= BW_PF_L2 && cpu_features()->avx512f)
        return sum_avx512(p, n, style);
#endif
    return sum_streams(p, n, style_streams(style), style == BW_STREAMS8_PF || style == BW_PF_L2);
}

/* *a = min(*a, v) (or max). */
static void atomic_min_i64(_Atomic int64_t *a, int64_t v)
{
    int64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

static void atomic_max_i64(_Atomic int64_t *a, int64_t v)
{
    int64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* A pool task: reads claims of the slice until none is left. */
static void bw_read_slice(void *ctx, int ith, int nth)
{
    (void)ith;
    struct bw_slice *sl = ctx;
    long lo, hi;
    uint64_t s = 0;
    int64_t t0 = 0, c0 = 0;
    long units = 0;
    while (pool_claim(&sl->next, sl->units, CLAIM_MIN_UNITS, nth, &lo, &hi)) {
        if (!t0) {
            t0 = clock_ns();
            c0 = thread_cpu_ns();
        }
        s += sum_style(sl->buf + lo * CLAIM_UNIT, (hi - lo) * CLAIM_UNIT, sl->style);
        units += hi - lo;
    }
    if (!t0)
        return; /* the others read it all */
    int64_t t1 = clock_ns(), cpu = thread_cpu_ns() - c0;
    atomic_fetch_add_explicit(&sl->sum, s, memory_order_relaxed);
    /* Its rate while it held a CPU, where it read a quarter of an even share or more (a
     * few claims' rate says little). */
    if (cpu > 0 && units * 4 * nth >= sl->units) {
        double rate = (double)units * CLAIM_UNIT * sizeof(uint64_t) / ((double)cpu * 1e-9);
        atomic_fetch_add_explicit(&sl->cpu_rates, (uint64_t)rate, memory_order_relaxed);
        atomic_fetch_add_explicit(&sl->readers, 1, memory_order_relaxed);
        atomic_max_i64(&sl->max_rate, (int64_t)rate);
    }
    atomic_min_i64(&sl->first_ns, t0);
    atomic_max_i64(&sl->last_ns, t1);
}

/* Words stop looks at the stop flag between (64 MiB) while the block is touched. */
#define STOP_EVERY ((size_t)1 << 23)

int bw_block_create(struct bw_block **out, size_t bytes, const atomic_bool *stop)
{
    *out = NULL;
    struct bw_block *b = calloc(1, sizeof *b);
    size_t n = bytes / sizeof(uint64_t) / CLAIM_UNIT * CLAIM_UNIT;
    if (!b || n == 0 || !(b->buf = mem_alloc_stream(n * sizeof(uint64_t)))) {
        free(b);
        return -1;
    }
    b->n = n;
    for (size_t i = 0; i < n; i++) { /* written, so every page is present before timing */
        if (stop && i % STOP_EVERY == 0 && atomic_load(stop)) {
            bw_block_release(b);
            return -1;
        }
        b->buf[i] = i;
    }
    *out = b;
    return 0;
}

void bw_block_release(struct bw_block *b)
{
    if (!b)
        return;
    free(b->buf);
    free(b);
}

size_t bw_slice_bytes(const struct bw_block *b, int threads)
{
    size_t want = (size_t)(threads < 1 ? 1 : threads) * BW_SLICE_MIB_PER_THREAD * ((size_t)1 << 20);
    size_t all = b->n * sizeof(uint64_t);
    /* A block under two slices is read whole each time: the walk starts over where the
     * next slice would run past the end, and would read only the first slice again and
     * again (a cache-sized block of 24 MiB, 16 MiB slices: its first 16 MiB only). */
    return 2 * want <= all ? want : all;
}

/* The sum of the words i..i+n-1 of the block (word i holds i), modulo 2^64. */
static uint64_t sum_of_indices(uint64_t i, uint64_t n)
{
    uint64_t tri = n % 2 ? n * ((n - 1) / 2) : (n / 2) * (n - 1); /* 0 + 1 + ... + n-1 */
    return i * n + tri;
}

/* The CPUs this process may run on (0 where unknown). */
static int usable_cpus(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 0;
}

int bw_block_read(struct bw_block *b, struct pool *p, int slices, const atomic_bool *stop, struct bw_reading *out)
{
    size_t words = bw_slice_bytes(b, pool_threads(p)) / sizeof(uint64_t) / CLAIM_UNIT * CLAIM_UNIT;
    int cpus = usable_cpus();
    for (int k = 0; k < slices; k++) {
        if (stop && atomic_load(stop))
            return -1;
        if (b->next + words > b->n)
            b->next = 0; /* the walk starts over: the block is large enough that none of it is cached */
        struct bw_slice sl = {.buf = b->buf + b->next, .units = (long)(words / CLAIM_UNIT), .style = b->style};
        atomic_init(&sl.first_ns, INT64_MAX);
        atomic_init(&sl.last_ns, 0);
        pool_run(p, bw_read_slice, &sl);
        /* A read that skipped or repeated words would overstate the bandwidth: its sum tells. */
        if (atomic_load(&sl.sum) != sum_of_indices(b->next, words))
            return -1;
        double secs = (double)(atomic_load(&sl.last_ns) - atomic_load(&sl.first_ns)) * 1e-9;
        double bw = bw_slice_rate((double)(words * sizeof(uint64_t)), secs, (double)atomic_load(&sl.cpu_rates),
                                  (double)atomic_load(&sl.max_rate), pool_threads(p), cpus);
        out->reads++;
        out->shared += atomic_load(&sl.readers) == pool_threads(p);
        if (bw > out->by_style[b->style])
            out->by_style[b->style] = bw;
        if (bw > out->best) {
            out->best = bw;
            out->best_style = b->style;
        }
        b->next += words;
        b->style = (b->style + 1) % N_BW_STYLES;
    }
    return 0;
}

double bw_slice_rate(double bytes, double span_s, double cpu_rates, double max_rate, int threads, int cpus)
{
    double wall = span_s > 0 ? bytes / span_s : 0;
    if (cpus > 0 && threads > cpus && cpu_rates > cpus * max_rate)
        cpu_rates = cpus * max_rate; /* no more threads read at once than there are CPUs */
    return fmax(wall, cpu_rates);
}

int bw_probe(struct pool *p, size_t bytes, int reps, struct bw_reading *out)
{
    return bw_probe_until(p, bytes, reps, NULL, out);
}

int bw_probe_until(struct pool *p, size_t bytes, int reps, const atomic_bool *stop, struct bw_reading *out)
{
    memset(out, 0, sizeof *out);
    struct bw_block *b;
    if (bw_block_create(&b, bytes, stop))
        return -1;
    int rc = bw_block_read(b, p, reps, stop, out);
    bw_block_release(b);
    return rc;
}

double bw_interleaved_roofline(const double *t, const double *bw, int n_groups)
{
    double secs = 0, bytes = 0;
    for (int g = 0; g < n_groups; g++) {
        double ceiling = bw[g] > bw[g + 1] ? bw[g] : bw[g + 1];
        secs += t[g];
        bytes += t[g] * ceiling;
    }
    return secs > 0 ? bytes / secs : 0;
}

/* The size in a sysfs cache file ("32768K", "508M"), in bytes; 0 when unreadable. */
static size_t sysfs_cache_size(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long n = 0;
    char unit = 0;
    int got = fscanf(f, "%llu%c", &n, &unit);
    fclose(f);
    if (got < 1 || n > (1ull << 40))
        return 0;
    return (size_t)(got == 2 && unit == 'K' ? n << 10 : got == 2 && unit == 'M' ? n << 20 : n);
}

size_t bw_llc_pick(size_t libc_l3, size_t libc_l2, size_t sys_l3, size_t sys_max)
{
    /* Both L3s: the smaller (on a Zen 4 VM the C library reports 320 MiB and the kernel
     * cpu0's 32 MiB, one CCD's, what its cores can hold). Only L3s are held against each
     * other: the C library's L2 against the kernel's L3 would take the L2. */
    if (libc_l3 && sys_l3)
        return libc_l3 < sys_l3 ? libc_l3 : sys_l3;
    if (libc_l3)
        return libc_l3;
    return libc_l2 > sys_max ? libc_l2 : sys_max;
}

/* The level in a sysfs cache's "level" file, 0 when unreadable. */
static int sysfs_cache_level(int index)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
    FILE *f = fopen(path, "r");
    int level = 0;
    if (f) {
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
    }
    return level;
}

size_t bw_llc_bytes(void)
{
#ifdef _SC_LEVEL3_CACHE_SIZE
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#else
    long l3 = 0;
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
    long l2 = 0;
#endif
    size_t sys_l3 = 0, sys_max = 0;
    for (int i = 0; i < 8; i++) { /* index0..: L1d, L1i, L2, L3 where the kernel lists them */
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        size_t n = sysfs_cache_size(path);
        sys_max = n > sys_max ? n : sys_max;
        if (n > sys_l3 && sysfs_cache_level(i) == 3)
            sys_l3 = n;
    }
    return bw_llc_pick(l3 > 0 ? (size_t)l3 : 0, l2 > 0 ? (size_t)l2 : 0, sys_l3, sys_max);
}

size_t bw_dram_block(size_t llc, long long avail)
{
    const size_t mib = 1 << 20;
    size_t want = (size_t)BW_DRAM_MIN_MIB * mib;
    if (llc > 0 && llc <= (size_t)BW_DRAM_MAX_MIB * mib / BW_DRAM_LLC_TIMES && llc * BW_DRAM_LLC_TIMES > want)
        want = llc * BW_DRAM_LLC_TIMES;
    else if (llc > (size_t)BW_DRAM_MAX_MIB * mib / BW_DRAM_LLC_TIMES)
        want = (size_t)BW_DRAM_MAX_MIB * mib;
    if (avail >= 0 && want > (size_t)(avail / BW_MEM_SHARE))
        want = (size_t)(avail / BW_MEM_SHARE);
    if (want < (size_t)BW_BLOCK_MIN_MIB * mib)
        want = (size_t)BW_BLOCK_MIN_MIB * mib;
    return want / mib * mib;
}

int bw_fits_llc(double bytes, size_t llc)
{
    return llc > 0 && bytes <= (double)llc;
}
