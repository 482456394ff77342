/* The matrix kernels in isolation (issue 23): one thread runs kern_matmul over one matrix
 * again and again, and prints the weight bytes it consumed per second and the nanoseconds
 * per 16 x 256 weights (one interleaved group-row of 256 columns), for B = 1, 2, 4, 8.
 * A matrix of about 512 KiB stays in L2: its rate is what the instructions allow (the
 * compute bound); one of 256 MiB comes from DRAM.
 *   usage: bench_kern_rate [-t THREADS] [-s claim|halves] [-b MAX_B] [KIB] [TYPE...]
 *          (default: 1 thread, 512 KiB, q8_0 q4_0 q4_k)
 * With -t N the rows are shared among N threads of a pool as the engine shares a decode
 * product: `claim` (the default) by guided self-scheduling with the engine's smallest
 * claim (32 KiB of weights), `halves` as one contiguous part per thread. Each B also
 * prints, in brackets, each thread's best rate over its own CPU time (the bytes of its
 * rows per CPU second: its rate while it ran, steadier under a neighbour's load).
 * Pin it (taskset -c 1, or the two cores with -t 2) and read it beside the load average:
 * it is a timing. -b 1 measures B = 1 alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "base/pool.h"
#include "kern/kern.h"
#include "bench_util.h"

#include <stdatomic.h>

#define MIN_CLAIM_BYTES (32 << 10) /* the engine's MM_MIN_CLAIM */
#define MAX_THREADS 64

struct mm_share {
    const struct kern_mat *m;
    const uint8_t *xq;
    size_t ldx;
    int B;
    float *y;
    int64_t rows, units, min_claim;
    int align;
    int halves;
    _Atomic long next;
    double busy[MAX_THREADS];   /* CPU seconds each thread spent in this run */
    int64_t rows_of[MAX_THREADS];
};

static void mm_share_run(void *ctx, int ith, int nth)
{
    struct mm_share *j = ctx;
    double t0 = bench_thread_cpu_s();
    long lo, hi;
    int64_t done = 0;
    if (j->halves) {
        pool_split((long)j->units, 1, ith, nth, &lo, &hi);
        if (lo < hi) {
            int64_t r0 = lo * j->align, r1 = hi * j->align < j->rows ? hi * j->align : j->rows;
            kern_matmul(j->m, j->xq, j->ldx, j->B, j->y, (size_t)j->rows, r0, r1);
            done += r1 - r0;
        }
    } else {
        while (pool_claim(&j->next, (long)j->units, (long)j->min_claim, nth, &lo, &hi)) {
            int64_t r0 = lo * j->align, r1 = hi * j->align < j->rows ? hi * j->align : j->rows;
            kern_matmul(j->m, j->xq, j->ldx, j->B, j->y, (size_t)j->rows, r0, r1);
            done += r1 - r0;
        }
    }
    if (ith < MAX_THREADS) {
        j->busy[ith] += bench_thread_cpu_s() - t0;
        j->rows_of[ith] += done;
    }
}

/* One product of the whole matrix, shared over the pool's threads (a pool of one runs
 * it on the calling thread). */
static void product(struct pool *pool, struct mm_share *j)
{
    atomic_store(&j->next, 0);
    pool_run(pool, mm_share_run, j);
}

static int max_b = 8;

static int run_type(int type, size_t kib, int64_t cols, struct pool *pool, int halves)
{
    size_t row_bytes = (size_t)dtype_row_bytes(type, cols);
    int64_t rows = (int64_t)(kib * 1024 / row_bytes) & ~(int64_t)15;
    if (rows < 16)
        rows = 16;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    float *row = malloc((size_t)cols * sizeof *row);
    uint8_t *w = malloc((size_t)rows * row_bytes);
    if (!row || !w)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        if (kern_quantize_row(type, row, w + (size_t)r * row_bytes, cols) != 0) {
            fprintf(stderr, "%s: cannot quantize\n", dtype_name(type));
            return -1;
        }
    }
    struct kern_mat *m;
    char err[256];
    if (kern_mat_create(&m, type, w, rows, cols, KERN_PATH_AUTO, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", dtype_name(type), err);
        return -1;
    }
    enum { BMAX = 8 };
    size_t ldx = kern_act_row_bytes(type, cols);
    uint8_t *xq = malloc(ldx * BMAX);
    float *y = malloc((size_t)rows * BMAX * sizeof *y);
    if (!xq || !y)
        return -1;
    for (int b = 0; b < BMAX; b++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        kern_act_quantize(type, row, xq + (size_t)b * ldx, cols);
    }
    double bytes = (double)kern_mat_bytes(m);
    int nth = pool_threads(pool);
    struct mm_share *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->m = m;
    j->xq = xq;
    j->ldx = ldx;
    j->y = y;
    j->rows = rows;
    j->align = kern_mat_row_align(m);
    j->units = (rows + j->align - 1) / j->align;
    j->min_claim = (int64_t)(MIN_CLAIM_BYTES / (bytes / (double)j->units));
    j->min_claim = j->min_claim < 1 ? 1 : j->min_claim;
    j->halves = halves;
    printf("%-7s %-7s %8.0f KiB %5lld cols", dtype_name(type), kern_path_name(kern_mat_path(m)), bytes / 1024,
           (long long)cols);
    double b1 = 0;
    for (int B = 1; B <= BMAX && B <= max_b; B *= 2) {
        j->B = B;
        product(pool, j); /* warm */
        /* the best of 60 rounds of at least 2 ms each: short enough that some round
         * runs within one time slice on a loaded machine */
        double best = 1e30, best_cpu[MAX_THREADS] = {0};
        for (int round = 0; round < 60; round++) {
            long n = 0;
            memset(j->busy, 0, sizeof j->busy);
            memset(j->rows_of, 0, sizeof j->rows_of);
            double t0 = bench_wall_s(), t;
#define RATE(t) (j->busy[t] > 0 ? bytes * (double)j->rows_of[t] / (double)rows / j->busy[t] : 0.0)
            do {
                product(pool, j);
                n++;
            } while ((t = bench_wall_s() - t0) < 0.002);
            if (t / (double)n < best)
                best = t / (double)n;
            for (int th = 0; th < nth && th < MAX_THREADS; th++)
                if (RATE(th) > best_cpu[th])
                    best_cpu[th] = RATE(th);
        }
        double groups = (double)rows / 16 * (double)cols / 256;
        if (B == 1)
            b1 = best;
        printf("  B=%d %6.1f GB/s %6.1f ns/grp %4.2fx", B, bytes / best / 1e9, best * 1e9 / groups, best / b1);
        /* each thread's best rate over its own CPU time (bytes of its rows / CPU s) */
        printf(" [cpu");
        for (int t = 0; t < nth && t < MAX_THREADS; t++)
            printf(" %.1f", best_cpu[t] / 1e9);
        printf("]");
    }
    printf("\n");
    free(j);
    kern_mat_release(m);
    free(row);
    free(w);
    free(xq);
    free(y);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = 1, halves = 0, a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "-t"))
            threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-b"))
            max_b = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-s"))
            halves = !strcmp(argv[a + 1], "halves");
        else
            break;
    }
    if (threads < 1 || threads > MAX_THREADS || (a < argc && argv[a][0] == '-')) {
        fprintf(stderr, "usage: bench_kern_rate [-t THREADS] [-s claim|halves] [-b MAX_B] [KIB] [TYPE...]\n");
        return 2;
    }
    size_t kib = a < argc ? (size_t)strtoul(argv[a++], NULL, 10) : 512;
    const char *deflt[] = {"q8_0", "q4_0", "q4_k"};
    const char *env = getenv("COLS");
    int64_t cols = env ? strtoll(env, NULL, 10) : 4096;
    if (cols < 256 || cols % 256) {
        fprintf(stderr, "COLS must be a positive multiple of 256\n");
        return 2;
    }
    int ntypes = a < argc ? argc - a : 3;
    struct pool *pool = NULL;
    if (pool_create(&pool, threads) != 0)
        return 1;
    int rc = 0;
    for (int i = 0; i < ntypes && !rc; i++) {
        const char *name = a < argc ? argv[a + i] : deflt[i];
        int type = dtype_from_name(name);
        if (type < 0) {
            fprintf(stderr, "unknown type %s\n", name);
            rc = 2;
        } else if (run_type(type, kib, cols, pool, halves) != 0)
            rc = 1;
    }
    pool_release(pool);
    return rc;
}
