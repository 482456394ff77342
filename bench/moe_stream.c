/* How fast the experts' products read their weights, by the way their rows are shared
 * between threads: what `cairn bench` cannot separate (a MoE decode step mixes the
 * experts with dense attention and the head). Builds L layers of E experts (gate and up
 * n_ff x n_embd, down n_embd x n_ff, each its own kern_mat as the loader makes them;
 * together past the last-level cache), then times decode steps of B=1: per layer, K
 * experts chosen at random, their gate and up, then their down, in these schedules:
 *   units:  moe.c's before this bench: units of about 48 KiB claimed one at a time
 *           (gate+up by 32 columns of every chosen expert, down by output rows over all
 *           chosen experts);
 *   halves: each thread a contiguous half of every chosen matrix's rows;
 *   stack:  the chosen experts' gate and up as one list of row ranges, cut into one
 *           contiguous run per thread (and the same for down);
 *   flat:   as guided for gate and up; down by units of one expert's rows, in expert order,
 *           claimed as guided (each claim a run within one or two experts' matrices);
 *   fused:  as flat, gate and up one matrix per expert, their rows in turns of the kernels'
 *           row group (the loader's exp_gate_up): a claim reads one run, not two;
 * plus `dense`: one matrix of the same rows as K gates, split in halves (what a dense
 * matrix of those bytes reads at), and one thread over one expert, hot in cache and cold.
 * Each schedule's down products are also counted alone (bytes per CPU second inside them).
 * MOE_HUGE=1 moves every expert's matrices into one block on huge pages first (as the
 * loader's place_experts does); without it each is a buffer of its own (below 2 MiB: 4 KiB
 * pages).
 *   usage: bench_moe_stream [mxfp4|q4_k|q6_k] [THREADS 2] [STEPS 2] [PASSES 8]
 * (q6_k: the qwen3 shape with its down matrices Q6_K, as in half of Q4_K_M's layers) */
#include "base/dtype.h"
#include "base/mem.h"
#include "base/pool.h"
#include "kern/kern.h"
#include "bench_util.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Atomic long long work_cpu_ns, down_cpu_ns;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
} /* the threads' CPU time inside the products */

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

struct shape {
    int type_gu, type_down;
    int n_embd, n_ff, n_layers, n_expert, k;
};

static void *quantized(int type, int64_t rows, int64_t cols)
{
    float *f = malloc((size_t)cols * sizeof *f);
    size_t rb = (size_t)dtype_row_bytes(type, cols);
    char *q = malloc((size_t)rows * rb);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            f[c] = ((float)(next_rand() % 2001) - 1000.0f) / 1000.0f;
        kern_quantize_row(type, f, q + (size_t)r * rb, cols);
    }
    free(f);
    return q;
}

static struct kern_mat *mat(int type, const void *src, int64_t rows, int64_t cols)
{
    struct kern_mat *m;
    char err[256];
    if (kern_mat_create(&m, type, src, rows, cols, KERN_PATH_AUTO, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return m;
}

enum sched { S_UNITS, S_GUIDED, S_HALVES, S_STACK, S_FLAT, S_FUSED, N_SCHED };
static const char *sched_name[N_SCHED] = {"units", "guided", "halves", "stack", "flat", "fused"};

struct job {
    enum sched s;
    struct kern_mat **mats; /* n_mats matrices over the same activation */
    int n_mats;
    const void *xq;
    size_t ldx;
    float *y;   /* n_mats rows of out_rows */
    int64_t out_rows;
    long unit_rows;
    int group; /* units: matrices per unit (their same rows, one after the other) */
    _Atomic long long *acc; /* CPU time inside, besides work_cpu_ns */
    _Atomic long next;
};

static void job_run(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    double c0 = bench_thread_cpu_s();
    int64_t rows = kern_mat_rows(j->mats[0]);
    long align = kern_mat_row_align(j->mats[0]);
    if (j->s == S_GUIDED || j->s == S_FLAT || j->s == S_FUSED) { /* the units of `units`, claimed as the engine's dense products claim */
        long per = (long)((rows + j->unit_rows - 1) / j->unit_rows), total = per * (j->n_mats / j->group);
        long cur = atomic_load_explicit(&j->next, memory_order_relaxed);
        for (;;) {
            if (cur >= total)
                break;
            long n = (total - cur) / (2L * nth);
            n = n < 1 ? 1 : n > total - cur ? total - cur : n;
            if (!atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + n, memory_order_relaxed,
                                                       memory_order_relaxed))
                continue;
            for (long u = cur; u < cur + n;) { /* one matrix group's run of units at a time */
                long g = u / per, ue = (g + 1) * per < cur + n ? (g + 1) * per : cur + n;
                int64_t r0 = (u % per) * j->unit_rows, r1 = (ue - g * per) * j->unit_rows;
                r1 = r1 < rows ? r1 : rows;
                for (int i = (int)g * j->group; i < (int)(g + 1) * j->group; i++)
                    kern_matmul(j->mats[i], j->xq, j->ldx, 1, j->y + i * j->out_rows, 0, r0, r1);
                u = ue;
            }
            cur = atomic_load_explicit(&j->next, memory_order_relaxed);
        }
    } else if (j->s == S_UNITS) {
        long per = (long)((rows + j->unit_rows - 1) / j->unit_rows), total = per * (j->n_mats / j->group);
        for (long u; (u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < total;) {
            int i0 = (int)(u / per) * j->group;
            int64_t r0 = (u % per) * j->unit_rows, r1 = r0 + j->unit_rows < rows ? r0 + j->unit_rows : rows;
            for (int i = i0; i < i0 + j->group; i++)
                kern_matmul(j->mats[i], j->xq, j->ldx, 1, j->y + i * j->out_rows, 0, r0, r1);
        }
    } else if (j->s == S_HALVES) {
        long lo, hi;
        pool_split(rows, align, ith, nth, &lo, &hi);
        for (int i = 0; i < j->n_mats; i++)
            kern_matmul(j->mats[i], j->xq, j->ldx, 1, j->y + i * j->out_rows, 0, lo, hi);
    } else {
        long lo, hi; /* over the rows of all matrices in turn */
        pool_split(rows * j->n_mats, align, ith, nth, &lo, &hi);
        for (int i = 0; i < j->n_mats; i++) {
            int64_t a = lo > i * rows ? lo - i * rows : 0, b = hi < (i + 1) * rows ? hi - i * rows : rows;
            if (a < b)
                kern_matmul(j->mats[i], j->xq, j->ldx, 1, j->y + i * j->out_rows, 0, a, b);
        }
    }
    long long ns = (long long)((bench_thread_cpu_s() - c0) * 1e9);
    atomic_fetch_add(&work_cpu_ns, ns);
    if (j->acc)
        atomic_fetch_add(j->acc, ns);
}

static void run_mats(struct pool *p, enum sched s, struct kern_mat **mats, int n, const void *xq, float *y,
                     long unit_rows, int group, _Atomic long long *acc)
{
    struct job j = {.s = s, .mats = mats, .n_mats = n, .xq = xq, .ldx = 0, .y = y,
                    .out_rows = kern_mat_rows(mats[0]), .unit_rows = unit_rows, .group = group, .acc = acc};
    atomic_init(&j.next, 0);
    pool_run(p, job_run, &j);
}

int main(int argc, char **argv)
{
    const char *tname = argc > 1 ? argv[1] : "mxfp4";
    int threads = argc > 2 ? atoi(argv[2]) : 2, steps = argc > 3 ? atoi(argv[3]) : 2;
    struct shape sh;
    if (!strcmp(tname, "mxfp4")) /* gpt-oss-20b: 32 experts of 2880 */
        sh = (struct shape){DT_MXFP4, DT_MXFP4, 2880, 2880, 16, 8, 4};
    else if (!strcmp(tname, "q6_k"))
        sh = (struct shape){DT_Q4_K, DT_Q6_K, 2048, 768, 24, 32, 8};
    else /* qwen3-30b-a3b: 128 experts of 768, Q4_K_M's experts Q4_K (down Q6_K in half the layers) */
        sh = (struct shape){DT_Q4_K, DT_Q4_K, 2048, 768, 24, 32, 8};
    struct pool *pool;
    if (pool_create(&pool, threads))
        return 1;
    void *src_gu = quantized(sh.type_gu, sh.n_ff, sh.n_embd), *src_d = quantized(sh.type_down, sh.n_embd, sh.n_ff);
    int n_ex = sh.n_layers * sh.n_expert;
    struct kern_mat **gate = malloc((size_t)n_ex * sizeof *gate), **up = malloc((size_t)n_ex * sizeof *up),
                    **down = malloc((size_t)n_ex * sizeof *down);
    size_t bytes_all = 0;
    int turn = kern_row_align(sh.type_gu, KERN_PATH_AUTO);
    size_t gu_rb = (size_t)dtype_row_bytes(sh.type_gu, sh.n_embd);
    char *src_fused = malloc(2 * gu_rb * (size_t)sh.n_ff);
    for (int64_t r = 0, o = 0; r < sh.n_ff; r += turn) { /* gate and up in turns (both src_gu) */
        size_t n = (size_t)(sh.n_ff - r < turn ? sh.n_ff - r : turn) * gu_rb;
        memcpy(src_fused + o, (char *)src_gu + (size_t)r * gu_rb, n);
        memcpy(src_fused + o + n, (char *)src_gu + (size_t)r * gu_rb, n);
        o += 2 * (int64_t)n;
    }
    struct kern_mat **fused = malloc((size_t)n_ex * sizeof *fused);
    for (int i = 0; i < n_ex; i++) {
        fused[i] = mat(sh.type_gu, src_fused, 2 * (int64_t)sh.n_ff, sh.n_embd);
        gate[i] = mat(sh.type_gu, src_gu, sh.n_ff, sh.n_embd);
        up[i] = mat(sh.type_gu, src_gu, sh.n_ff, sh.n_embd);
        down[i] = mat(sh.type_down, src_d, sh.n_embd, sh.n_ff);
        bytes_all += kern_mat_bytes(gate[i]) * 2 + kern_mat_bytes(down[i]);
    }
    if (getenv("MOE_HUGE") && atoi(getenv("MOE_HUGE"))) { /* every expert's matrices in one block on huge pages */
        size_t total = 0;
        struct kern_mat **all[4] = {fused, gate, up, down};
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < n_ex; i++)
                total += (kern_mat_own_bytes(all[k][i]) + 255) / 256 * 256;
        char *block = mem_alloc_stream(total);
        size_t off = 0;
        for (int k = 0; block && k < 4; k++)
            for (int i = 0; i < n_ex; i++) {
                size_t b = kern_mat_own_bytes(all[k][i]);
                kern_mat_move(all[k][i], block + off);
                off += (b + 255) / 256 * 256;
            }
        printf("experts moved to one block of %.0f MiB on huge pages\n", (double)total / (1 << 20));
    }
    /* one dense matrix of K gates' rows, several copies to be cold */
    int n_dense = 64;
    void *src_dense = quantized(sh.type_gu, (int64_t)sh.n_ff * sh.k, sh.n_embd);
    struct kern_mat **dense = malloc((size_t)n_dense * sizeof *dense);
    for (int i = 0; i < n_dense; i++)
        dense[i] = mat(sh.type_gu, src_dense, (int64_t)sh.n_ff * sh.k, sh.n_embd);
    int ff = sh.n_ff > sh.n_embd ? sh.n_ff : sh.n_embd;
    float *x = malloc((size_t)ff * sizeof *x), *y = malloc((size_t)ff * sh.k * 2 * sizeof *y);
    for (int i = 0; i < ff; i++)
        x[i] = ((float)(next_rand() % 2001) - 1000.0f) / 1000.0f;
    void *xq_e = aligned_alloc(64, 1 << 20), *xq_f = aligned_alloc(64, 1 << 20);
    kern_act_quantize(sh.type_gu, x, xq_e, sh.n_embd);
    kern_act_quantize(sh.type_down, x, xq_f, sh.n_ff);
    printf("%s: %d layers of %d experts (%d per token), n_embd %d, n_ff %d, %.0f MiB of experts; expert "
           "matrix %.2f MiB (gate), %.2f MiB (down); %d threads\n",
           tname, sh.n_layers, sh.n_expert, sh.k, sh.n_embd, sh.n_ff, (double)bytes_all / (1 << 20),
           (double)kern_mat_bytes(gate[0]) / (1 << 20), (double)kern_mat_bytes(down[0]) / (1 << 20), threads);

    /* one thread, one matrix: hot (the same expert again and again), then cold */
    {
        int reps = 200;
        double t0 = bench_wall_s(), c0 = bench_thread_cpu_s();
        for (int r = 0; r < reps; r++)
            kern_matmul(gate[0], xq_e, 0, 1, y, 0, 0, sh.n_ff);
        double hot = (double)kern_mat_bytes(gate[0]) * reps / (bench_wall_s() - t0) / 1e9;
        double hot_cpu = (double)kern_mat_bytes(gate[0]) * reps / (bench_thread_cpu_s() - c0) / 1e9;
        t0 = bench_wall_s();
        c0 = bench_thread_cpu_s();
        for (int r = 0; r < n_ex; r++)
            kern_matmul(gate[r], xq_e, 0, 1, y, 0, 0, sh.n_ff);
        double cold = (double)kern_mat_bytes(gate[0]) * n_ex / (bench_wall_s() - t0) / 1e9;
        double cold_cpu = (double)kern_mat_bytes(gate[0]) * n_ex / (bench_thread_cpu_s() - c0) / 1e9;
        printf("one thread, one expert's gate: hot %.2f GB/s (%.2f per CPU second), cold %.2f GB/s (%.2f per CPU "
               "second)\n", hot, hot_cpu, cold, cold_cpu);
    }
    /* decode steps */
    long units_gu = 32, units_d, units_flat;
    {
        size_t rb = kern_mat_bytes(down[0]) / (size_t)sh.n_embd * (size_t)sh.k;
        long al = kern_mat_row_align(down[0]);
        units_d = (long)((48 << 10) / rb) / al * al;
        units_d = units_d < al ? al : units_d;
        units_flat = (long)((48 << 10) / (rb / (size_t)sh.k)) / al * al;
        units_flat = units_flat < al ? al : units_flat;
        size_t gb = kern_mat_bytes(gate[0]) * 2 / (size_t)sh.n_ff;
        long ga = sh.type_down == DT_MXFP4 ? 32 : 256; /* the down input's activation block */
        long n = (long)((48 << 10) / gb) / ga * ga;
        units_gu = n < ga ? ga : n;
    }
    /* passes of `steps` steps, each schedule (and dense) in turn within a pass, so a
     * neighbour's load falls on all alike; medians over the passes */
    enum { N_ROW = N_SCHED + 1, MAX_PASS = 64 };
    double wall[N_ROW][MAX_PASS], cpu[N_ROW][MAX_PASS], dcpu[N_ROW][MAX_PASS], gcpu[N_ROW][MAX_PASS];
    int passes = argc > 4 ? atoi(argv[4]) : 8;
    passes = passes < 1 ? 1 : passes > MAX_PASS ? MAX_PASS : passes;
    int dense_i = 0;
    for (int pass = 0; pass < passes; pass++) {
        for (int s = 0; s < N_ROW; s++) {
            size_t bytes = 0, dbytes = 0;
            double t = 0;
            atomic_store(&work_cpu_ns, 0);
            atomic_store(&down_cpu_ns, 0);
            for (int st = 0; st < steps; st++) {
                for (int l = 0; l < sh.n_layers; l++) {
                    if (s == N_SCHED) { /* dense: a matrix of K gates' bytes */
                        struct kern_mat *d = dense[dense_i++ % n_dense];
                        double t0 = bench_wall_s();
                        run_mats(pool, S_HALVES, &d, 1, xq_e, y, 0, 1, NULL);
                        t += bench_wall_s() - t0;
                        bytes += kern_mat_bytes(d);
                        continue;
                    }
                    struct kern_mat *gu[16], *dn[8], *fu[8];
                    int chosen[8];
                    for (int k = 0; k < sh.k; k++) { /* distinct experts */
                        int e, dup;
                        do {
                            e = (int)(next_rand() % (uint32_t)sh.n_expert);
                            dup = 0;
                            for (int q = 0; q < k; q++)
                                dup |= chosen[q] == e;
                        } while (dup);
                        chosen[k] = e;
                    }
                    for (int k = 0; k < sh.k; k++) {
                        int i = l * sh.n_expert + chosen[k];
                        gu[2 * k] = gate[i];
                        gu[2 * k + 1] = up[i];
                        fu[k] = fused[i];
                        dn[k] = down[i];
                        bytes += kern_mat_bytes(gate[i]) * 2 + kern_mat_bytes(down[i]);
                        dbytes += kern_mat_bytes(down[i]);
                    }
                    double t0 = bench_wall_s();
                    if (s == S_UNITS || s == S_GUIDED) { /* moe.c's interleave: gate and up of a unit together */
                        run_mats(pool, (enum sched)s, gu, 2 * sh.k, xq_e, y, units_gu, 2, NULL);
                        run_mats(pool, (enum sched)s, dn, sh.k, xq_f, y, units_d, sh.k, &down_cpu_ns);
                    } else if (s == S_FUSED) {
                        run_mats(pool, S_FUSED, fu, sh.k, xq_e, y, 2 * units_gu, 1, NULL);
                        run_mats(pool, S_FLAT, dn, sh.k, xq_f, y, units_flat, 1, &down_cpu_ns);
                    } else if (s == S_FLAT) {
                        run_mats(pool, S_GUIDED, gu, 2 * sh.k, xq_e, y, units_gu, 2, NULL);
                        run_mats(pool, S_FLAT, dn, sh.k, xq_f, y, units_flat, 1, &down_cpu_ns);
                    } else {
                        run_mats(pool, (enum sched)s, gu, 2 * sh.k, xq_e, y, 0, 1, NULL);
                        run_mats(pool, (enum sched)s, dn, sh.k, xq_f, y, 0, 1, &down_cpu_ns);
                    }
                    t += bench_wall_s() - t0;
                }
            }
            wall[s][pass] = (double)bytes / t / 1e9;
            cpu[s][pass] = (double)bytes / (double)atomic_load(&work_cpu_ns) * threads;
            long long dns = atomic_load(&down_cpu_ns);
            dcpu[s][pass] = dns ? (double)dbytes / (double)dns * threads : 0;
            long long gns = atomic_load(&work_cpu_ns) - dns;
            gcpu[s][pass] = dns && gns > 0 ? (double)(bytes - dbytes) / (double)gns * threads : 0;
        }
    }
    printf("GB/s, median of %d passes of %d steps (wall time; per thread's CPU second in the products x %d):\n",
           passes, steps, threads);
    double ratio[MAX_PASS]; /* fused against flat's gate and up, pass by pass (the same load) */
    for (int pass = 0; pass < passes; pass++)
        ratio[pass] = gcpu[S_FLAT][pass] > 0 ? gcpu[S_FUSED][pass] / gcpu[S_FLAT][pass] : 0;
    qsort(ratio, (size_t)passes, sizeof(double), cmp_double);
    printf("  gate+up fused / flat, per pass: median %.3f (lowest %.3f, highest %.3f)\n", ratio[passes / 2], ratio[0],
           ratio[passes - 1]);
    for (int s = 0; s < N_ROW; s++) {
        qsort(wall[s], (size_t)passes, sizeof(double), cmp_double);
        qsort(cpu[s], (size_t)passes, sizeof(double), cmp_double);
        qsort(dcpu[s], (size_t)passes, sizeof(double), cmp_double);
        qsort(gcpu[s], (size_t)passes, sizeof(double), cmp_double);
        printf("  %-7s %6.2f  %6.2f  (CPU: lowest %.2f, highest %.2f)  down alone %6.2f  gate+up alone %6.2f\n",
               s == N_SCHED ? "dense" : sched_name[s], wall[s][passes / 2], cpu[s][passes / 2], cpu[s][0],
               cpu[s][passes - 1], dcpu[s][passes / 2], gcpu[s][passes / 2]);
    }
    pool_release(pool);
    return 0;
}
