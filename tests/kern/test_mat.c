/* kern_matmul on every path this CPU has must equal kern_matmul_ref bit for bit, for
 * every batch size and row split (the batch-invariance contract of kern.h).
 * CAIRN_KERN_BENCH=1 also prints weight GB/s for B=1 and the time ratio B=8/B=1 on a
 * 2048x8192 matrix per type and path (printed only, never asserted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/dtype.h"
#include "base/err.h"
#include "kern/kern.h"
#include "kern/simd_mat.h"
#include "testutil.h"

static const int types[] = {DT_F32, DT_F16, DT_BF16, DT_Q4_0, DT_Q4_1, DT_Q5_0,
                            DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                            DT_Q2_K, DT_Q3_K, DT_IQ4_NL, DT_IQ4_XS, DT_MXFP4};
#define NTYPES ((int)(sizeof types / sizeof types[0]))
static const enum kern_path paths[] = {KERN_PATH_REF, KERN_PATH_AVX2, KERN_PATH_AVX512,
                                       KERN_PATH_AMX, KERN_PATH_NEON, KERN_PATH_NEON_DOT,
                                       KERN_PATH_NEON_I8MM};
#define NPATHS ((int)(sizeof paths / sizeof paths[0]))

/* Random float with a per-row magnitude, and now and then an outlier. */
static float rand_weight(uint64_t *rng, int64_t r)
{
    float v = test_rand_float(rng) * (0.05f + 0.1f * (float)(r % 7));
    if ((test_rand_u64(rng) & 63) == 0)
        v *= 8.0f;
    return v;
}

/* Weights of `type` as GGUF rows: quantized from random floats (mode 0), random bytes
 * with finite scales, which reach every quant value the format can hold (mode 1), or
 * every quant at its extreme (all bits set; Q8_0 -128; Q6_K scales -128) (mode 2), which
 * with activations of +-127 pushes 16-bit partial sums to their limits, or all bits
 * clear (mode 3). */
static void *make_weights(int type, int64_t rows, int64_t cols, int mode, uint64_t *rng)
{
    int64_t rb = dtype_row_bytes(type, cols);
    uint8_t *w = malloc((size_t)(rows * rb));
    float *f = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++)
            f[k] = rand_weight(rng, r);
        uint8_t *row = w + r * rb;
        if (mode == 0 || type == DT_F32 || type == DT_F16 || type == DT_BF16) {
            int rc = kern_quantize_row(type, f, row, cols);
            CHECK(rc == 0, "kern_quantize_row(%s) = %d", dtype_name(type), rc);
            continue;
        }
        for (int64_t i = 0; i < rb; i++)
            row[i] = mode == 1 ? (uint8_t)test_rand_u64(rng) : mode == 3 ? 0 : type == DT_Q8_0 ? 0x80 : 0xff;
        if (type == DT_MXFP4) {
            /* exponents: the subnormal scales 2^-128, 2^-127, the smallest normal one, and
             * ones near 2^0 (larger would overflow d*dx, which is not what this tests) */
            static const uint8_t es[] = {0, 1, 2, 120, 127, 128, 131};
            for (int64_t b = 0; b < cols / 32; b++)
                row[b * 17] = es[test_rand_u64(rng) % sizeof es];
            continue;
        }
        if (mode == 2 && type == DT_Q6_K)
            for (int64_t b = 0; b < cols / 256; b++)
                memset(row + b * 210 + 192, 0x80, 16);
        /* Overwrite the half-float scales with finite ones. */
        const struct dtype_info *ti = dtype_info(type);
        for (int64_t b = 0; b < cols / ti->block_elems; b++) {
            uint8_t *blk = row + b * ti->block_bytes;
            int off[2] = {0, 2}, n = 1;
            if (type == DT_Q4_1 || type == DT_Q5_1 || type == DT_Q4_K || type == DT_Q5_K)
                n = 2;
            if (type == DT_Q6_K)
                off[0] = 208;
            if (type == DT_Q2_K)
                off[0] = 80, off[1] = 82, n = 2;
            if (type == DT_Q3_K)
                off[0] = 108;
            for (int s = 0; s < n; s++) {
                uint16_t h = kern_f32_to_f16(test_rand_float(rng) * 0.01f);
                memcpy(blk + off[s], &h, 2);
            }
        }
    }
    free(f);
    return w;
}

/* B activation rows (stride ldx bytes) quantized for `type` from random floats with
 * per-row magnitudes; row 1 is all zeros, rows 2 and 3 all +1 and all -1 (quants +-127). */
static uint8_t *make_acts(int type, int64_t cols, int B, size_t ldx, uint64_t *rng)
{
    uint8_t *xq = calloc((size_t)B, ldx);
    float *f = malloc((size_t)cols * sizeof(float));
    for (int b = 0; b < B; b++) {
        float mag = b == 1 ? 0.0f : powf(2.0f, (float)(b % 9) - 3.0f);
        for (int64_t k = 0; k < cols; k++)
            f[k] = test_rand_float(rng) * mag * ((k / 32) % 3 == 2 ? 10.0f : 1.0f);
        if (b == 2 || b == 3)
            for (int64_t k = 0; k < cols; k++)
                f[k] = b == 2 ? 1.0f : -1.0f;
        kern_act_quantize(type, f, xq + (size_t)b * ldx, cols);
    }
    free(f);
    return xq;
}

static bool path_on_cpu(enum kern_path p)
{
    return kern_path_on_cpu(p);
}

/* One (type, shape, weight mode) case over all paths, batch sizes and splits. */
static void check_case(int type, int64_t rows, int64_t cols, int mode, uint64_t *rng)
{
    static const int Bs_all[] = {1, 2, 3, 4, 5, 8, 16, 33}, Bs_big[] = {1, 9, 33};
    /* big shapes: fewer batch sizes (one pass, two chunks, many), to bound the run time */
    bool big = rows * cols > 100000;
    const int *Bs = big ? Bs_big : Bs_all;
    size_t nBs = big ? 3 : 8;
    void *w = make_weights(type, rows, cols, mode, rng);
    size_t ldx = kern_act_row_bytes(type, cols) + 8;
    size_t ldy = (size_t)rows + 3;
    int Bmax = 33;
    uint8_t *xq = make_acts(type, cols, Bmax, ldx, rng);
    float *want = malloc((size_t)Bmax * ldy * sizeof(float));
    float *got = malloc((size_t)Bmax * ldy * sizeof(float));
    memset(want, 0x7f, (size_t)Bmax * ldy * sizeof(float));
    kern_matmul_ref(type, w, cols, xq, ldx, Bmax, want, ldy, 0, rows);

    for (int pi = 0; pi < NPATHS; pi++) {
        enum kern_path p = paths[pi];
        struct kern_mat *m = NULL;
        char err[256] = "";
        size_t wbytes = (size_t)(rows * dtype_row_bytes(type, cols));
        uint8_t *wcopy = malloc(wbytes);
        memcpy(wcopy, w, wbytes);
        int rc = kern_mat_create(&m, type, wcopy, rows, cols, p, err, sizeof err);
        /* SIMD paths own their weights: the source may go away after create. */
        if (rc == 0 && p != KERN_PATH_REF)
            memset(wcopy, 0xaa, wbytes);
        if (!path_on_cpu(p)) {
            CHECK(rc == CAIRN_EUNSUPPORTED, "path %s not on this CPU but create gave %d",
                  kern_path_name(p), rc);
            kern_mat_release(m);
            free(wcopy);
            continue;
        }
        /* the NEON paths compute the types they name (the others run on the reference) */
        if ((p == KERN_PATH_NEON || p == KERN_PATH_NEON_DOT || p == KERN_PATH_NEON_I8MM) &&
            !kern_mat_neon_has_type(type)) {
            CHECK(rc == CAIRN_EUNSUPPORTED, "path %s lacks %s but create gave %d", kern_path_name(p),
                  dtype_name(type), rc);
            kern_mat_release(m);
            free(wcopy);
            continue;
        }
        CHECK(rc == 0, "create %s %s %lldx%lld: %d %s", dtype_name(type), kern_path_name(p),
              (long long)rows, (long long)cols, rc, err);
        if (rc) {
            free(wcopy);
            continue;
        }
        CHECK(kern_mat_path(m) == p, "path %d != %d", kern_mat_path(m), p);
        /* A loader may move a matrix's own weights into its block (kern_mat_move): then the
         * products below read the moved copy, the old one freed and the source poisoned.
         * Modes 1 and 3 move, 0 and 2 do not, so both are checked on every path. */
        size_t own = kern_mat_own_bytes(m);
        CHECK(p == KERN_PATH_REF ? own == 0 : own >= kern_mat_bytes(m), "%s %s: own bytes %zu, reads %zu",
              dtype_name(type), kern_path_name(p), own, kern_mat_bytes(m));
        void *moved = NULL;
        if (own && (mode == 1 || mode == 3)) {
            moved = aligned_alloc(64, (own + 63) / 64 * 64);
            kern_mat_move(m, moved);
            CHECK(kern_mat_own_bytes(m) == 0, "own bytes after the move: %zu", kern_mat_own_bytes(m));
        }
        CHECK_EQ_INT(kern_mat_rows(m), rows);
        CHECK_EQ_INT(kern_mat_cols(m), cols);
        CHECK_EQ_INT(kern_mat_type(m), type);
        int al = kern_mat_row_align(m);
        CHECK(al >= 1 && al <= 64, "row align %d", al);
        /* known before preparing (what a tensor-parallel rank's loader splits at) */
        CHECK(kern_row_align(type, p) == al, "%s %s: kern_row_align %d, prepared %d", dtype_name(type),
              kern_path_name(p), kern_row_align(type, p), al);
        /* Splits: whole, aligned parts (last ends at rows), and one unaligned part. */
        int64_t cut1 = al, cut2 = 2 * (int64_t)al;
        int64_t splits[][2] = {{0, rows}, {0, cut1}, {cut1, rows}, {0, cut1}, {cut1, cut2},
                               {cut2, rows}, {3, rows - 2}};
        for (size_t bi = 0; bi < nBs; bi++) {
            int B = Bs[bi];
            for (int s = 0; s < 7; s++) {
                int64_t r0 = splits[s][0], r1 = splits[s][1];
                if (r1 > rows || r0 >= r1)
                    continue;
                memset(got, 0x7f, (size_t)Bmax * ldy * sizeof(float));
                kern_matmul(m, xq, ldx, B, got, ldy, r0, r1);
                int bad = 0;
                for (int b = 0; b < B && !bad; b++) {
                    for (int64_t r = 0; r < (int64_t)ldy; r++) {
                        float *g = got + (size_t)b * ldy + r;
                        float *e = want + (size_t)b * ldy + r;
                        uint32_t sentinel = 0x7f7f7f7f, gv;
                        memcpy(&gv, g, 4);
                        bool inside = r >= r0 && r < r1;
                        if (inside ? memcmp(g, e, 4) != 0 : gv != sentinel) {
                            CHECK(0, "%s %s mode %d %lldx%lld B=%d rows [%lld,%lld): y[%d][%lld] = "
                                  "%a, want %a%s", dtype_name(type), kern_path_name(p), mode,
                                  (long long)rows, (long long)cols, B, (long long)r0,
                                  (long long)r1, b, (long long)r, *g, *e,
                                  inside ? "" : " (outside the range: must stay untouched)");
                            bad = 1;
                            break;
                        }
                    }
                }
                if (!bad)
                    test_passed++;
            }
        }
        kern_mat_release(m);
        free(moved);
        free(wcopy);
    }
    free(w);
    free(xq);
    free(want);
    free(got);
}

/* The types of few bits added later: mode 3 (all quant bits clear) reaches their other
 * extremes (Q3_K -4 with factor -32, the lowest level -127 of IQ4_*). */
static bool lowbit(int type)
{
    return type == DT_Q2_K || type == DT_Q3_K || type == DT_IQ4_NL || type == DT_IQ4_XS ||
           type == DT_MXFP4;
}

/* CAIRN_MAT_TYPES=q2_k,mxfp4 limits test_bitwise to those types (while iterating on a
 * kernel under emulation); unset, every type runs. */
static bool type_wanted(int type)
{
    const char *only = getenv("CAIRN_MAT_TYPES");
    if (!only || !*only)
        return true;
    const char *name = dtype_name(type);
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncasecmp(p, name, n) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

static void test_bitwise(void)
{
    uint64_t rng = 42;
    for (int t = 0; t < NTYPES; t++) {
        int type = types[t];
        if (!type_wanted(type))
            continue;
        int be = dtype_info(type)->block_elems;
        int64_t colss[] = {256, 896, 2048, 100, 1000};
        for (int c = 0; c < 5; c++) {
            int64_t cols = colss[c];
            if (cols % be)
                continue;
            check_case(type, 37, cols, 0, &rng);
            if (be > 1) {
                check_case(type, 37, cols, 1, &rng);
                check_case(type, 37, cols, 2, &rng);
            }
            if (lowbit(type))
                check_case(type, 37, cols, 3, &rng);
        }
        check_case(type, 5, be > 1 ? 256 : 48, 0, &rng);  /* fewer rows than one group */
        /* long rows and many groups: large B runs in k-chunks and row tiles */
        check_case(type, 133, 4608, 0, &rng);
        /* 23 whole groups of 16: one activation row walks runs of 6 and 5 groups in 4
         * streams (km_drive_streams), each split cutting them differently */
        check_case(type, 16 * 23 + 5, 256, 0, &rng);
    }
}

static void test_errors(void)
{
    struct kern_mat *m = (struct kern_mat *)1;
    char err[128] = "";
    uint8_t buf[64] = {0};
    CHECK(kern_mat_create(&m, DT_IQ2_XXS, buf, 1, 256, KERN_PATH_AUTO, err, sizeof err) ==
              CAIRN_EUNSUPPORTED && m == NULL, "IQ2_XXS must be refused (%s)", err);
    CHECK(kern_mat_create(&m, DT_Q4_0, buf, 1, 33, KERN_PATH_AUTO, err, sizeof err) ==
              CAIRN_EINVAL && m == NULL, "cols not a multiple of 32 must be refused (%s)", err);
    CHECK(kern_mat_create(&m, DT_Q4_0, buf, 0, 32, KERN_PATH_AUTO, err, sizeof err) ==
              CAIRN_EINVAL, "zero rows must be refused (%s)", err);
    CHECK(kern_mat_create(&m, DT_Q4_0, NULL, 1, 32, KERN_PATH_AUTO, err, sizeof err) ==
              CAIRN_EINVAL, "NULL data must be refused (%s)", err);
    CHECK(kern_mat_create(&m, DT_Q4_0, buf, 1, 32, KERN_PATH_NEON_I8MM + 1, err, sizeof err) ==
              CAIRN_EUNSUPPORTED, "an unknown path must be refused (%s)", err);
    kern_mat_release(NULL);
    enum kern_path best = kern_best_path();
    CHECK(best != KERN_PATH_AUTO, "best path is %s", kern_path_name(best));
    printf("best path: %s\n", kern_path_name(best));
    /* the run-time choice on an emulated CPU of known features (CMakeLists.txt, ARM64) */
    const char *want = getenv("CAIRN_EXPECT_BEST_PATH");
    if (want && *want)
        CHECK(!strcmp(want, kern_path_name(best)), "best path %s, expected %s",
              kern_path_name(best), want);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* this thread only: a loaded machine */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per product of B rows, best of a few runs. */
static double time_product(const struct kern_mat *m, const void *xq, size_t ldx, int B,
                           float *y, size_t ldy)
{
    double best = 1e30;
    int64_t rows = kern_mat_rows(m);
    for (int rep = 0; rep < 5; rep++) {
        int n = 0;
        double t0 = now_s(), t;
        do {
            kern_matmul(m, xq, ldx, B, y, ldy, 0, rows);
            n++;
            t = now_s() - t0;
        } while (t < 0.05);
        if (t / n < best)
            best = t / n;
    }
    return best;
}

/* One line per path: GB/s of weights at B=1 and the time ratio B=8/B=1. */
static void bench_type(int type, int64_t rows, int64_t cols, bool best_only, uint64_t *rng)
{
    void *w = make_weights(type, rows, cols, 0, rng);
    size_t ldx = kern_act_row_bytes(type, cols);
    uint8_t *xq = make_acts(type, cols, 8, ldx, rng);
    float *y = malloc((size_t)8 * (size_t)rows * sizeof(float));
    for (int pi = 0; pi < NPATHS; pi++) {
        struct kern_mat *m = NULL;
        if (best_only && paths[pi] != kern_best_path())
            continue;
        if (kern_mat_create(&m, type, w, rows, cols, paths[pi], NULL, 0))
            continue;
        double t1 = time_product(m, xq, ldx, 1, y, (size_t)rows);
        double t8 = time_product(m, xq, ldx, 8, y, (size_t)rows);
        printf("bench %-5s %-7s %5lldx%-5lld B=1 %7.2f GB/s (%8.3f ms)  B=8/B=1 %5.2f\n",
               dtype_name(type), kern_path_name(paths[pi]), (long long)rows, (long long)cols,
               (double)kern_mat_bytes(m) / t1 * 1e-9, t1 * 1e3, t8 / t1);
        kern_mat_release(m);
    }
    free(w);
    free(xq);
    free(y);
}

static void bench(void)
{
    uint64_t rng = 7;
    printf("bench: GB/s of weights read at B=1, time ratio B=8/B=1 (single thread)\n");
    for (int t = 0; t < NTYPES; t++)
        bench_type(types[t], 2048, 8192, false, &rng);
    /* larger than a 32 MiB L3: weights stream from memory */
    bench_type(DT_Q4_0, 16384, 8192, true, &rng);
    bench_type(DT_Q4_K, 16384, 8192, true, &rng);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_errors);
    RUN(test_bitwise);
    const char *b = getenv("CAIRN_KERN_BENCH");
    if (b && strcmp(b, "1") == 0)
        bench();
    return test_main_end();
}
