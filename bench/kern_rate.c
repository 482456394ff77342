/* The matrix kernels in isolation (issue 23): one thread runs kern_matmul over one matrix
 * again and again, and prints the weight bytes it consumed per second and the nanoseconds
 * per 16 x 256 weights (one interleaved group-row of 256 columns), for B = 1, 2, 4, 8.
 * A matrix of about 512 KiB stays in L2: its rate is what the instructions allow (the
 * compute bound); one of 256 MiB comes from DRAM.
 *   usage: bench_kern_rate [KIB] [TYPE...]     (default: 512 q8_0 q4_0 q4_k)
 * COLS=N in the environment sets the matrix's columns (default 4096; a MoE expert's down
 * matrix has few: 768 in Qwen3-30B-A3B), so short rows' fixed costs show.
 * Pin it (taskset -c 1) and read it beside the load average: it is a timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "kern/kern.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift: seeded weights and activations in [-1, 1) */
static float rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static int run_type(int type, size_t kib, int64_t cols)
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
            row[c] = rnd(&seed);
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
            row[c] = rnd(&seed);
        kern_act_quantize(type, row, xq + (size_t)b * ldx, cols);
    }
    double bytes = (double)kern_mat_bytes(m);
    printf("%-7s %-7s %8.0f KiB %5lld cols", dtype_name(type), kern_path_name(kern_mat_path(m)), bytes / 1024,
           (long long)cols);
    double b1 = 0;
    for (int B = 1; B <= BMAX; B *= 2) {
        kern_matmul(m, xq, ldx, B, y, (size_t)rows, 0, rows); /* warm */
        /* the best of 60 rounds of at least 2 ms each: short enough that some round
         * runs within one time slice on a loaded machine */
        double best = 1e30;
        for (int round = 0; round < 60; round++) {
            long n = 0;
            double t0 = now_s(), t;
            do {
                kern_matmul(m, xq, ldx, B, y, (size_t)rows, 0, rows);
                n++;
            } while ((t = now_s() - t0) < 0.002);
            if (t / (double)n < best)
                best = t / (double)n;
        }
        double groups = (double)rows / 16 * (double)cols / 256;
        if (B == 1)
            b1 = best;
        printf("  B=%d %6.1f GB/s %6.1f ns/grp %4.2fx", B, bytes / best / 1e9, best * 1e9 / groups, best / b1);
    }
    printf("\n");
    kern_mat_release(m);
    free(row);
    free(w);
    free(xq);
    free(y);
    return 0;
}

int main(int argc, char **argv)
{
    size_t kib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 512;
    const char *deflt[] = {"q8_0", "q4_0", "q4_k"};
    const char *env = getenv("COLS");
    int64_t cols = env ? strtoll(env, NULL, 10) : 4096;
    if (cols < 256 || cols % 256) {
        fprintf(stderr, "COLS must be a positive multiple of 256\n");
        return 2;
    }
    int ntypes = argc > 2 ? argc - 2 : 3;
    for (int i = 0; i < ntypes; i++) {
        const char *name = argc > 2 ? argv[2 + i] : deflt[i];
        int type = dtype_from_name(name);
        if (type < 0) {
            fprintf(stderr, "unknown type %s\n", name);
            return 2;
        }
        if (run_type(type, kib, cols) != 0)
            return 1;
    }
    return 0;
}
