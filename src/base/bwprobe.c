/* Memory read bandwidth in several access patterns (see bwprobe.h). */
#include "base/bwprobe.h"

#include "base/clock.h"
#include "base/cpu.h"
#include "base/mem.h"
#include "base/pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STREAM_CHUNK 32 /* words (256 bytes) read from one stream before the next */

struct bw_job {
    const uint64_t *buf;
    size_t n;
    int style; /* enum bw_style */
    uint64_t sums[64];
};

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

/* A pool task: sums this thread's share of the block in the job's style. */
static void bw_read(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    long lo, hi;
    pool_split((long)j->n, 1024, ith, nth, &lo, &hi);
    const uint64_t *p = j->buf + lo;
    uint64_t s;
#if defined(__x86_64__)
    if (j->style <= BW_PF_L2 && cpu_features()->avx512f)
        s = sum_avx512(p, hi - lo, j->style);
    else
#endif
        s = sum_streams(p, hi - lo, style_streams(j->style), j->style == BW_STREAMS8_PF || j->style == BW_PF_L2);
    j->sums[ith % 64] = s;
}

int bw_probe(struct pool *p, size_t bytes, int reps, struct bw_reading *out)
{
    return bw_probe_until(p, bytes, reps, NULL, out);
}

/* Words touched between looks at the stop flag (64 MiB). */
#define STOP_EVERY ((size_t)1 << 23)

int bw_probe_until(struct pool *p, size_t bytes, int reps, const atomic_bool *stop, struct bw_reading *out)
{
    memset(out, 0, sizeof *out);
    uint64_t *buf = mem_alloc_stream(bytes);
    if (!buf)
        return -1;
    size_t n = bytes / sizeof *buf;
    for (size_t i = 0; i < n; i++) { /* touched, so every page is present before timing */
        if (stop && i % STOP_EVERY == 0 && atomic_load(stop))
            break;
        buf[i] = i;
    }
    struct bw_job j = {.buf = buf, .n = n};
    int nth = pool_threads(p);
    /* The words are 0..n-1: a read that skipped or repeated some would overstate the
     * bandwidth, and its sum tells. */
    uint64_t want = n % 2 ? (uint64_t)n * ((n - 1) / 2) : (uint64_t)(n / 2) * (n - 1);
    int rc = 0;
    for (int r = 0; r < reps; r++) {
        if (stop && atomic_load(stop)) {
            rc = -1;
            break;
        }
        j.style = r % N_BW_STYLES;
        memset(j.sums, 0, sizeof j.sums);
        double t0 = clock_sec();
        pool_run(p, bw_read, &j);
        double bw = (double)bytes / (clock_sec() - t0);
        uint64_t got = 0;
        for (int t = 0; t < nth && t < 64; t++)
            got += j.sums[t];
        if (nth <= 64 && got != want) {
            rc = -1; /* a read that missed words counts for nothing */
            break;
        }
        out->reads++;
        if (bw > out->by_style[j.style])
            out->by_style[j.style] = bw;
        if (bw > out->best) {
            out->best = bw;
            out->best_style = j.style;
        }
    }
    free(buf);
    return rc;
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

size_t bw_llc_bytes(void)
{
#ifdef _SC_LEVEL3_CACHE_SIZE
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0)
        return (size_t)l3;
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
    long l2 = 0;
#endif
    size_t best = l2 > 0 ? (size_t)l2 : 0;
    for (int i = 0; i < 8; i++) { /* index0..: L1d, L1i, L2, L3 where the kernel lists them */
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        size_t n = sysfs_cache_size(path);
        best = n > best ? n : best;
    }
    return best;
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
