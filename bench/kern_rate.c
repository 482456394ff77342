/* The matrix kernels in isolation (issue 23): one thread runs kern_matmul over one matrix
 * again and again, and prints the weight bytes it consumed per second and the nanoseconds
 * per 16 x 256 weights (one interleaved group-row of 256 columns), for B = 1, 2, 4, 8.
 * A matrix of about 512 KiB stays in L2: its rate is what the instructions allow (the
 * compute bound). A matrix read again and again must be well above the last-level cache to
 * come from DRAM: this L3 keeps part of a few times its size between passes (Zen 5 VM,
 * 32 MiB L3, 2 threads, Q8_0 768 columns, same minute: 100 MiB 84-99 GB/s, 1 GiB 59-68,
 * the bandwidth probe's best 16 MiB slice 72-77), so take DRAM rates at 1048576 KiB.
 *   usage: bench_kern_rate [-t THREADS] [-s claim|halves] [-b MAX_B] [-r ROUNDS] [-p PATH]
 *                          [KIB] [TYPE...]
 *          (default: 1 thread, 512 KiB, q8_0 q4_0 q4_k)
 * With -t N the rows are shared among N threads of a pool as the engine shares a decode
 * product: `claim` (the default) by guided self-scheduling with the engine's smallest
 * claim (32 KiB of weights), `halves` as one contiguous part per thread. Each B also
 * prints, in brackets, each thread's best rate over its own CPU time (the bytes of its
 * rows per CPU second: its rate while it ran, steadier under a neighbour's load).
 * Pin it (taskset -c 1, or the two cores with -t 2) and read it beside the load average:
 * it is a timing. -b 1 measures B = 1 alone. -r ROUNDS makes every type's matrix first, then
 * times the types in turn ROUNDS times, each line with its time and load average: readings
 * of different types seconds apart, on a host whose bandwidth swings minute to minute.
 * -p PATH (avx2, avx512, ref ...: kern_path_name's names) runs one path, not the best. */
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
static enum kern_path path = KERN_PATH_AUTO; /* -p NAME: one path instead of the best */

/* The path kern_path_name calls name, or -1. */
static int path_from_name(const char *name)
{
    for (int p = KERN_PATH_AUTO; p <= KERN_PATH_NEON_I8MM; p++)
        if (!strcmp(kern_path_name((enum kern_path)p), name))
            return p;
    return -1;
}

/* One matrix under test, with its activations, outputs and share of the pool. */
struct bench_mat {
    int type;
    int64_t cols, rows;
    double bytes;
    uint8_t *w, *xq;
    float *y;
    struct kern_mat *m;
    struct mm_share *j;
};

static void bench_mat_release(struct bench_mat *bm)
{
    free(bm->j);
    kern_mat_release(bm->m);
    free(bm->w);
    free(bm->xq);
    free(bm->y);
    memset(bm, 0, sizeof *bm);
}

static int bench_mat_init(struct bench_mat *bm, int type, size_t kib, int64_t cols, int halves)
{
    enum { BMAX = 8 };
    memset(bm, 0, sizeof *bm);
    size_t row_bytes = (size_t)dtype_row_bytes(type, cols);
    int64_t rows = (int64_t)(kib * 1024 / row_bytes) & ~(int64_t)15;
    if (rows < 16)
        rows = 16;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    float *row = malloc((size_t)cols * sizeof *row);
    bm->type = type;
    bm->cols = cols;
    bm->rows = rows;
    bm->w = malloc((size_t)rows * row_bytes);
    size_t ldx = kern_act_row_bytes(type, cols);
    bm->xq = malloc(ldx * BMAX);
    bm->y = malloc((size_t)rows * BMAX * sizeof *bm->y);
    bm->j = calloc(1, sizeof *bm->j);
    if (!row || !bm->w || !bm->xq || !bm->y || !bm->j)
        goto err;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        if (kern_quantize_row(type, row, bm->w + (size_t)r * row_bytes, cols) != 0) {
            fprintf(stderr, "%s: cannot quantize\n", dtype_name(type));
            goto err;
        }
    }
    char msg[256];
    if (kern_mat_create(&bm->m, type, bm->w, rows, cols, path, msg, sizeof msg) != 0) {
        fprintf(stderr, "%s: %s\n", dtype_name(type), msg);
        goto err;
    }
    for (int b = 0; b < BMAX; b++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        kern_act_quantize(type, row, bm->xq + (size_t)b * ldx, cols);
    }
    free(row);
    bm->bytes = (double)kern_mat_bytes(bm->m);
    struct mm_share *j = bm->j;
    j->m = bm->m;
    j->xq = bm->xq;
    j->ldx = ldx;
    j->y = bm->y;
    j->rows = rows;
    j->align = kern_mat_row_align(bm->m);
    j->units = (rows + j->align - 1) / j->align;
    j->min_claim = (int64_t)(MIN_CLAIM_BYTES / (bm->bytes / (double)j->units));
    j->min_claim = j->min_claim < 1 ? 1 : j->min_claim;
    j->halves = halves;
    return 0;
err:
    free(row);
    bench_mat_release(bm);
    return -1;
}

/* The best wall time of one product at B over 60 rounds of at least 2 ms each (short
 * enough that some round runs within one time slice on a loaded machine), and each
 * thread's best rate over its own CPU time (bytes of its rows / CPU s) in best_cpu. */
static double bench_mat_time(struct bench_mat *bm, struct pool *pool, int B, double *best_cpu)
{
    struct mm_share *j = bm->j;
    int nth = pool_threads(pool);
    j->B = B;
    product(pool, j); /* warm */
    double best = 1e30;
    for (int th = 0; th < nth && th < MAX_THREADS; th++)
        best_cpu[th] = 0;
    for (int round = 0; round < 60; round++) {
        long n = 0;
        memset(j->busy, 0, sizeof j->busy);
        memset(j->rows_of, 0, sizeof j->rows_of);
        double t0 = bench_wall_s(), t;
        do {
            product(pool, j);
            n++;
        } while ((t = bench_wall_s() - t0) < 0.002);
        if (t / (double)n < best)
            best = t / (double)n;
        for (int th = 0; th < nth && th < MAX_THREADS; th++) {
            double rate = j->busy[th] > 0
                              ? bm->bytes * (double)j->rows_of[th] / (double)bm->rows / j->busy[th]
                              : 0.0;
            if (rate > best_cpu[th])
                best_cpu[th] = rate;
        }
    }
    return best;
}

/* One line: the matrix, then for each B its rate, ns a group, cost against B = 1 and
 * each thread's rate per CPU second. */
static void bench_mat_line(struct bench_mat *bm, struct pool *pool)
{
    printf("%-7s %-7s %8.0f KiB %5lld cols", dtype_name(bm->type),
           kern_path_name(kern_mat_path(bm->m)), bm->bytes / 1024, (long long)bm->cols);
    int nth = pool_threads(pool);
    double b1 = 0, best_cpu[MAX_THREADS];
    for (int B = 1; B <= 8 && B <= max_b; B *= 2) {
        double best = bench_mat_time(bm, pool, B, best_cpu);
        double groups = (double)bm->rows / 16 * (double)bm->cols / 256;
        if (B == 1)
            b1 = best;
        printf("  B=%d %6.1f GB/s %6.1f ns/grp %4.2fx", B, bm->bytes / best / 1e9,
               best * 1e9 / groups, best / b1);
        printf(" [cpu");
        for (int t = 0; t < nth && t < MAX_THREADS; t++)
            printf(" %.1f", best_cpu[t] / 1e9);
        printf("]");
    }
    printf("\n");
    fflush(stdout);
}

/* The 1-minute load average, or -1 where /proc/loadavg cannot be read. */
static double load_average(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* -r ROUNDS: every type's matrix made first, then ROUNDS rounds that time each type in
 * turn, so that each type's reading sits seconds from the others' (the host's bandwidth
 * swings minute to minute). */
static int run_rounds(const int *types, int ntypes, int rounds, size_t kib, int64_t cols,
                      struct pool *pool, int halves)
{
    struct bench_mat *bm = calloc((size_t)ntypes, sizeof *bm);
    if (!bm)
        return 1;
    int rc = 0, made = 0;
    for (; made < ntypes && !rc; made++)
        if (bench_mat_init(&bm[made], types[made], kib, cols, halves) != 0)
            rc = 1;
    double t0 = bench_wall_s();
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < ntypes; i++) {
            printf("r%-2d %6.1fs load %5.2f  ", r, bench_wall_s() - t0, load_average());
            bench_mat_line(&bm[i], pool);
        }
    for (int i = 0; i < made; i++)
        bench_mat_release(&bm[i]);
    free(bm);
    return rc;
}

int main(int argc, char **argv)
{
    int threads = 1, halves = 0, rounds = 0, a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "-t"))
            threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-b"))
            max_b = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-s"))
            halves = !strcmp(argv[a + 1], "halves");
        else if (!strcmp(argv[a], "-r"))
            rounds = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-p")) {
            int p = path_from_name(argv[a + 1]);
            if (p < 0) {
                fprintf(stderr, "unknown path %s\n", argv[a + 1]);
                return 2;
            }
            path = (enum kern_path)p;
        }
        else
            break;
    }
    if (threads < 1 || threads > MAX_THREADS || rounds < 0 || (a < argc && argv[a][0] == '-')) {
        fprintf(stderr, "usage: bench_kern_rate [-t THREADS] [-s claim|halves] [-b MAX_B] "
                        "[-r ROUNDS] [-p PATH] [KIB] [TYPE...]\n");
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
    int *types = malloc((size_t)ntypes * sizeof *types);
    if (!types)
        return 1;
    for (int i = 0; i < ntypes; i++) {
        const char *name = a < argc ? argv[a + i] : deflt[i];
        types[i] = dtype_from_name(name);
        if (types[i] < 0) {
            fprintf(stderr, "unknown type %s\n", name);
            free(types);
            return 2;
        }
    }
    struct pool *pool = NULL;
    if (pool_create(&pool, threads) != 0) {
        free(types);
        return 1;
    }
    int rc = 0;
    if (rounds > 0)
        rc = run_rounds(types, ntypes, rounds, kib, cols, pool, halves);
    for (int i = 0; i < ntypes && !rc && rounds == 0; i++) {
        struct bench_mat bm;
        if (bench_mat_init(&bm, types[i], kib, cols, halves) != 0)
            rc = 1;
        else {
            bench_mat_line(&bm, pool);
            bench_mat_release(&bm);
        }
    }
    pool_release(pool);
    free(types);
    return rc;
}
