/* A prefill product in isolation (issue 23): one thread runs kern_matmul over one matrix
 * for B activation rows (a prompt's batch), and prints the best time of several rounds
 * over the thread's own CPU time (steadier than wall time beside a neighbour's load) and
 * the rate in 64-byte multiply-adds a nanosecond (one VPDPBUSD's work each), to set
 * beside the core's VPDPBUSD throughput.
 *   usage: bench_gemm_rate [-b B] [-r ROUNDS] [ROWS COLS] [TYPE...]
 *          (default: B 512, 8 rounds, 2048 x 2048, q4_0 q8_0 q4_k q6_k)
 * Pin it (taskset -c 1) and read it beside the load average: it is a timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dtype.h"
#include "kern/kern.h"
#include "bench_util.h"

static int run_type(int type, int64_t rows, int64_t cols, int B, int rounds)
{
    size_t row_bytes = (size_t)dtype_row_bytes(type, cols);
    size_t ldx = kern_act_row_bytes(type, cols);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    float *row = malloc((size_t)cols * sizeof *row);
    uint8_t *w = malloc((size_t)rows * row_bytes);
    uint8_t *xq = malloc(ldx * (size_t)B);
    float *y = malloc((size_t)rows * (size_t)B * sizeof *y);
    int rc = -1;
    struct kern_mat *m = NULL;
    if (!row || !w || !xq || !y)
        goto out;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        if (kern_quantize_row(type, row, w + (size_t)r * row_bytes, cols) != 0)
            goto out;
    }
    char err[256];
    if (kern_mat_create(&m, type, w, rows, cols, KERN_PATH_AUTO, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", dtype_name(type), err);
        goto out;
    }
    for (int b = 0; b < B; b++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = bench_rnd_xorshift(&seed);
        kern_act_quantize(type, row, xq + (size_t)b * ldx, cols);
    }
    kern_matmul(m, xq, ldx, B, y, (size_t)rows, 0, rows); /* warm */
    double best = 1e30;
    for (int i = 0; i < rounds; i++) {
        double t0 = bench_thread_cpu_s();
        kern_matmul(m, xq, ldx, B, y, (size_t)rows, 0, rows);
        double t = bench_thread_cpu_s() - t0;
        best = t < best ? t : best;
    }
    double ops = (double)rows * (double)cols * (double)B / 64;
    printf("%-7s %-7s %5lld x %5lld B=%d  %8.3f ms  %.3f dp64/ns\n", dtype_name(type),
           kern_path_name(kern_mat_path(m)), (long long)rows, (long long)cols, B, best * 1e3,
           ops / best / 1e9);
    rc = 0;
out:
    kern_mat_release(m);
    free(row);
    free(w);
    free(xq);
    free(y);
    return rc;
}

int main(int argc, char **argv)
{
    int B = 512, rounds = 8, a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "-b"))
            B = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-r"))
            rounds = atoi(argv[a + 1]);
        else
            break;
    }
    if (B < 1 || rounds < 1 || (a < argc && argv[a][0] == '-')) {
        fprintf(stderr, "usage: bench_gemm_rate [-b B] [-r ROUNDS] [ROWS COLS] [TYPE...]\n");
        return 2;
    }
    int64_t rows = 2048, cols = 2048;
    if (a + 1 < argc && argv[a][0] >= '0' && argv[a][0] <= '9') {
        rows = strtoll(argv[a], NULL, 10);
        cols = strtoll(argv[a + 1], NULL, 10);
        a += 2;
    }
    if (rows < 1 || cols < 256 || cols % 256) {
        fprintf(stderr, "ROWS >= 1, COLS a positive multiple of 256\n");
        return 2;
    }
    const char *deflt[] = {"q4_0", "q8_0", "q4_k", "q6_k"};
    int ntypes = a < argc ? argc - a : 4;
    for (int i = 0; i < ntypes; i++) {
        const char *name = a < argc ? argv[a + i] : deflt[i];
        int type = dtype_from_name(name);
        if (type < 0) {
            fprintf(stderr, "unknown type %s\n", name);
            return 2;
        }
        if (run_type(type, rows, cols, B, rounds) != 0)
            return 1;
    }
    return 0;
}
