/* Every SIMD variant of the forward pass's vector helpers gives the reference's bits. */
#include "base/dtype.h"
#include "engine/vec.h"
#include "kern/quant.h"
#include "kern/kern.h"
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAXN 300

/* The reference exp against double precision: every float in [-87, 88] at a stride,
 * within 2 ulp (relative 2.4e-7); the clamps, NaN, and silu within 3 ulp. */
static void test_exp_accuracy(const struct vec_ops *ref)
{
    double worst = 0;
    float worst_at = 0;
    int n = 0;
    for (float t = -87.0f; t <= 88.0f; t = nextafterf(t, INFINITY) + fabsf(t) * 1e-6f + 1e-6f, n++) {
        float x = t;
        ref->exp_sub(&x, 0.0f, 1);
        double want = exp((double)t), rel = fabs((double)x - want) / want;
        if (rel > worst) {
            worst = rel;
            worst_at = t;
        }
    }
    CHECK(worst <= 2.4e-7, "exp: worst relative error %.3g at %.9g over %d points", worst, worst_at, n);
    printf("exp: %d points in [-87, 88], worst relative error %.3g (at %.9g)\n", n, worst, worst_at);
    float edge[5] = {-1000.0f, 1000.0f, -INFINITY, INFINITY, NAN};
    ref->exp_sub(edge, 0.0f, 5);
    CHECK(edge[0] > 0 && edge[0] < 2e-38f, "exp(-1000) = %g, tiny and not negative", edge[0]);
    CHECK(edge[1] > 1e38f && isfinite(edge[1]), "exp(1000) = %g, huge and finite", edge[1]);
    CHECK(edge[2] > 0 && edge[2] < 2e-38f && edge[3] > 1e38f, "exp(-inf) = %g, exp(inf) = %g", edge[2], edge[3]);
    CHECK(isnan(edge[4]), "exp(NaN) = %g", edge[4]);
    double worst_silu = 0;
    for (int i = -4000; i <= 4000; i++) {
        float g = (float)i * 0.01f, one = 1.0f;
        ref->silu_mul(&g, &one, 1);
        double x = (double)((float)i * 0.01f), want = x / (1.0 + exp(-x));
        double rel = fabs((double)g - want) / (fabs(want) + 1e-30);
        worst_silu = rel > worst_silu ? rel : worst_silu;
    }
    CHECK(worst_silu <= 3.6e-7, "silu: worst relative error %.3g over [-40, 40]", worst_silu);
    /* gpt-oss's SwiGLU against its definition in double, inside and past both clamps */
    double worst_oai = 0;
    for (int i = -2000; i <= 2000; i++) {
        float g = (float)i * 0.01f, u = (float)(i % 900) * 0.01f, zero = 0.0f;
        ref->swiglu_oai(&g, &u, &zero, &zero, 1);
        double x = fmin((double)((float)i * 0.01f), 7.0), y = fmax(fmin((double)u, 7.0), -7.0);
        double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
        double rel = fabs((double)g - want) / (fabs(want) + 1e-30);
        worst_oai = fabs(want) > 1e-6 && rel > worst_oai ? rel : worst_oai;
    }
    CHECK(worst_oai <= 1e-6, "swiglu_oai: worst relative error %.3g over gate [-20, 20]", worst_oai);
    float nan_g = NAN, nan_u = NAN, one = 1.0f, zero = 0.0f;
    ref->swiglu_oai(&nan_g, &one, &zero, &zero, 1);
    CHECK(nan_g > 13.9f && nan_g < 14.0f, "swiglu_oai(NaN gate, up 1) = %g: the gate clamps to 7", nan_g);
    float g7 = 1.0f;
    ref->swiglu_oai(&g7, &nan_u, &zero, &zero, 1);
    CHECK(isnan(g7), "swiglu_oai(gate 1, NaN up) = %g, NaN", g7);
}

/* softmax_tile's exp (vec.h VEC_SEXP) against double precision: rows whose max is 0 and
 * whose other scores step through [-87, 0] (and below, and -inf), within 1.95 ulp
 * (relative 1.9e-7) in the reference; every variant the reference's bits, the sum too. */
static void test_softmax_exp(const struct vec_ops *ref, const struct vec_ops *const *ops, int n_ops)
{
    enum { N = 253 }; /* not a multiple of 16: every tail */
    static float s0[N], s1[N];
    double worst = 0;
    float worst_at = 0;
    int n_points = 0, bad = 0;
    float t = 0.0f;
    while (t > -87.0f) {
        float in[N];
        in[0] = 0.0f;
        for (int j = 1; j < N; j++, n_points++) {
            in[j] = t;
            t = t > -87.0f ? nextafterf(t, -INFINITY) - fabsf(t) * 3e-6f - 1e-7f : t;
        }
        memcpy(s0, in, sizeof in);
        float l0, l1;
        ref->softmax_tile(s0, N, &l0);
        for (int j = 1; j < N && in[j] >= -87.0f; j++) {
            double want = exp((double)in[j]), rel = fabs((double)s0[j] - want) / want;
            if (rel > worst) {
                worst = rel;
                worst_at = in[j];
            }
        }
        for (int v = 0; v < n_ops; v++) {
            memcpy(s1, in, sizeof in);
            ops[v]->softmax_tile(s1, N, &l1);
            bad += memcmp(s0, s1, sizeof s0) != 0 || memcmp(&l0, &l1, sizeof l0) != 0;
        }
    }
    CHECK(worst <= 1.9e-7, "softmax exp: worst relative error %.3g at %.9g over %d points", worst, worst_at, n_points);
    printf("softmax exp: %d points in [-87, 0], worst relative error %.3g (at %.9g)\n", n_points, worst, worst_at);
    float edge[5] = {0.0f, -100.0f, -1000.0f, -INFINITY, -0.0f};
    float l;
    ref->softmax_tile(edge, 5, &l);
    CHECK(edge[0] == 1.0f && edge[4] == 1.0f, "exp(0) = %g, exp(-0) = %g", edge[0], edge[4]);
    CHECK(edge[1] > 0 && edge[1] < 2e-38f && edge[2] == edge[1] && edge[3] == edge[1],
          "exp(-100) = %g, exp(-1000) = %g, exp(-inf) = %g: tiny, not negative", edge[1], edge[2], edge[3]);
    CHECK(bad == 0, "softmax exp: %d rows of a variant differ from the reference in bits", bad);
    /* A NaN score (a hostile file's F32 weights can carry any payload) stays NaN on every
     * path: the exponent add of AVX-512's 2^n must not turn a payload into a finite number. */
    uint32_t payloads[4] = {0x7fc00000u, 0x7fc001ffu, 0xffc00123u, 0x7fffffffu};
    int finite = 0;
    for (int v = -1; v < n_ops; v++)
        for (int k = 0; k < 4; k++) {
            float row[37];
            for (int j = 0; j < 37; j++)
                row[j] = -0.25f * (float)j;
            for (int j = 3; j < 37; j += 16)
                memcpy(&row[j], &payloads[k], sizeof row[j]);
            (v < 0 ? ref : ops[v])->softmax_tile(row, 37, &l);
            for (int j = 3; j < 37; j += 16)
                finite += !isnan(row[j]);
        }
    CHECK(finite == 0, "softmax exp: %d NaN scores came out as numbers", finite);
}

/* q8_query: every variant's bytes are vec_q8_query's, on rows of every scale, with zeros,
 * NaNs (quiet, and signalling after the block's largest |x| in the same 4-lane column: an
 * FMAXNM running max turned that lane into a NaN there and lost the maximum), infinities,
 * ties (x * id at k + 0.5) and tiny values (a subnormal scale). */
static void test_q8_query(const struct vec_ops *ops, const char *name)
{
    enum { HD = 128 };
    float x[HD];
    char r0[VEC_Q8_ROW_BYTES(HD)] __attribute__((aligned(4))), r1[VEC_Q8_ROW_BYTES(HD)] __attribute__((aligned(4)));
    uint64_t seed = 11;
    int bad = 0;
    for (int rep = 0; rep < 2000; rep++) {
        float scale = powf(10.0f, (float)(int)(test_rand_u64(&seed) % 90) - 45.0f);
        for (int i = 0; i < HD; i++)
            x[i] = test_rand_float(&seed) * scale;
        int kind = rep % 8;
        if (kind == 1)
            x[test_rand_u64(&seed) % HD] = NAN;
        if (kind == 2)
            x[test_rand_u64(&seed) % HD] = rep % 16 < 8 ? INFINITY : -INFINITY;
        if (kind == 3)
            for (int i = 0; i < 32; i++)
                x[i] = 0.0f;
        if (kind == 4) /* amax 127: codes at exact halves */
            for (int i = 0; i < 32; i++)
                x[i] = i == 0 ? 127.0f : (float)(int)(test_rand_u64(&seed) % 254 - 127) + 0.5f;
        if (kind == 5) { /* block 1: the largest |x| at dimension 32 + l, a signalling NaN at 32 + 28 + l */
            int l = (int)(test_rand_u64(&seed) % 4);
            uint32_t snan = 0x7fa00000u | (uint32_t)(test_rand_u64(&seed) % 0x1000);
            x[32 + l] = (rep % 16 < 8 ? 2.0f : -2.0f) * scale;
            memcpy(&x[32 + 28 + l], &snan, sizeof snan);
        }
        memset(r0, 0x55, sizeof r0);
        memset(r1, 0x55, sizeof r1);
        vec_q8_query(x, HD, r0);
        ops->q8_query(x, HD, r1);
        bad += memcmp(r0, r1, sizeof r0) != 0;
    }
    CHECK(bad == 0, "%s: %d of 2000 quantized query rows differ from vec_q8_query", name, bad);
}

/* f16_to_f32: every half (NaNs, subnormals, infinities), as rows of 4093 with a stride of
 * 4099 (tails of every length past the last whole register), gives kern_f16_to_f32's bits. */
static void test_f16_to_f32(const struct vec_ops *ops, const char *name)
{
    enum { N = 4093, LD = 4099, ROWS = 65536 / N + 1 };
    static uint16_t x[ROWS * LD];
    static float y[ROWS * LD];
    for (int i = 0; i < ROWS * LD; i++)
        x[i] = (uint16_t)(i % LD < N ? (i / LD) * N + i % LD : 0);
    memset(y, 0x55, sizeof y);
    ops->f16_to_f32(x, LD, y, LD, ROWS, N);
    int bad = 0, kept = 0;
    for (int i = 0; i < ROWS * LD; i++) {
        if (i % LD >= N) { /* past a row's n: untouched */
            uint32_t u;
            memcpy(&u, &y[i], sizeof u);
            kept += u == 0x55555555u;
            continue;
        }
        float want = kern_f16_to_f32(x[i]);
        bad += memcmp(&want, &y[i], sizeof want) != 0;
    }
    CHECK(bad == 0 && kept == ROWS * (LD - N), "%s: %d halves converted to other bits, %d of %d gaps kept", name,
          bad, kept, ROWS * (LD - N));
}

/* Byte i of K(d, j)'s storage for a key stride ld (vec.h attn_qk's layouts; Q4_0: the byte
 * holding the nibble pair of dims 32c+i and 32c+16+i is indexed as d = 32c+i). */
static int64_t k_at(int type, int64_t d, int64_t ld, int64_t j)
{
    return type == DT_Q8_0 ? 4 * ((d / 4) * ld + j) + d % 4 : d * ld + j;
}

/* Queries in [-2, 2) and the outputs attn_pv adds to (both copies the same), n of each. */
static void random_q_o(float *q, float *o0, float *o1, int n, uint64_t *seed)
{
    for (int i = 0; i < n; i++) {
        q[i] = test_rand_float(seed) * 2.0f;
        o0[i] = o1[i] = test_rand_float(seed);
    }
}

/* attn_qk, attn_pv and softmax_tile on random shapes (rows 1-19, keys 1-150, head sizes
 * 8-136, rows of different lengths; F16, F32, and Q8_0 and Q4_0 with head sizes a
 * multiple of 32; Q8_0 K's random bytes include -128, which its writer never makes):
 * the reference's bits. */
static void test_attn_tiles(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { ROWS = 19, KEYS = 150, HD = 136 };
    static char q8[ROWS * VEC_Q8_ROW_BYTES(HD)] __attribute__((aligned(4)));
    static float q[ROWS * HD], s0[ROWS * KEYS], s1[ROWS * KEYS], o0[ROWS * HD], o1[ROWS * HD], kf[HD * KEYS];
    static uint16_t kh[HD * KEYS], ks[HD * KEYS];
    static uint8_t kb[HD * KEYS];
    static struct block_q8_0 v8[KEYS * HD / 32];
    static struct block_q4_0 v4[KEYS * HD / 32];
    const int types[4] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0};
    uint64_t seed = 5;
    int bad = 0;
    for (int rep = 0; rep < 400; rep++) {
        int type = types[rep % 4], quant = rep % 4 >= 2;
        int rows = 1 + (int)(test_rand_u64(&seed) % ROWS), n = 1 + (int)(test_rand_u64(&seed) % KEYS);
        int hd = quant ? 32 * (1 + (int)(test_rand_u64(&seed) % (HD / 32)))
                       : 8 * (1 + (int)(test_rand_u64(&seed) % (HD / 8))) - (rep % 5 == 0 ? 3 : 0);
        random_q_o(q, o0, o1, ROWS * HD, &seed);
        for (int i = 0; i < HD * KEYS; i++) {
            kf[i] = test_rand_float(&seed);
            kh[i] = kern_f32_to_f16(kf[i]);
            ks[i] = kern_f32_to_f16(test_rand_float(&seed) * 0.1f);
            kb[i] = (uint8_t)test_rand_u64(&seed);
        }
        for (int i = 0; i < KEYS * HD / 32; i++) {
            v8[i].d = v4[i].d = kern_f32_to_f16(test_rand_float(&seed) * 0.05f);
            for (int e = 0; e < 32; e++)
                v8[i].qs[e] = (int8_t)test_rand_u64(&seed);
            for (int e = 0; e < 16; e++)
                v4[i].qs[e] = (uint8_t)test_rand_u64(&seed);
        }
        const void *kt = type == DT_F16 ? (const void *)kh : type == DT_F32 ? (const void *)kf : (const void *)kb;
        /* Q8_0 K takes the rows quantized (some blocks all zero: a zero scale) */
        int64_t ldq = type == DT_Q8_0 ? VEC_Q8_ROW_BYTES(hd) : hd;
        if (rep % 13 == 2)
            memset(q, 0, 32 * sizeof *q);
        for (int r = 0; type == DT_Q8_0 && r < rows; r++)
            vec_q8_query(q + r * hd, hd, q8 + r * ldq);
        const void *qa = type == DT_Q8_0 ? (const void *)q8 : (const void *)q;
        ref->attn_qk(qa, ldq, rows, kt, ks, KEYS, n, hd, type, s0, KEYS);
        ops->attn_qk(qa, ldq, rows, kt, ks, KEYS, n, hd, type, s1, KEYS);
        for (int r = 0; r < rows; r++)
            bad += memcmp(s0 + r * KEYS, s1 + r * KEYS, (size_t)n * sizeof *s0) != 0;
        int32_t nr[ROWS];
        for (int r = 0; r < rows; r++) {
            nr[r] = 1 + (int)(test_rand_u64(&seed) % (unsigned)n);
            float l0, l1;
            float m0 = ref->softmax_tile(s0 + r * KEYS, nr[r], &l0), m1 = ops->softmax_tile(s1 + r * KEYS, nr[r], &l1);
            bad += memcmp(&m0, &m1, sizeof m0) != 0 || memcmp(&l0, &l1, sizeof l0) != 0 ||
                   memcmp(s0 + r * KEYS, s1 + r * KEYS, (size_t)nr[r] * sizeof *s0) != 0;
        }
        const void *v[KEYS];
        for (int j = 0; j < n; j++) {
            int at = (j * 37) % (HD * KEYS - HD);
            v[j] = type == DT_F16 ? (const void *)(kh + at) : type == DT_F32 ? (const void *)(kf + at)
                 : type == DT_Q8_0 ? (const void *)(v8 + (j * 3) % (KEYS * HD / 32 - HD / 32))
                                   : (const void *)(v4 + (j * 3) % (KEYS * HD / 32 - HD / 32));
        }
        /* asks for lines while they run (some reps none, some more lines than steps): no bit changes */
        struct vec_prefetch pf = {(const char *)kh, (int64_t)(rep % 3) * 97};
        /* the same keys in blocks of 16 or of 7: attn_qk_paged */
        int bt = rep % 8 < 4 ? 16 : 7;
        const void *kblk[KEYS];
        const uint16_t *ksblk[KEYS];
        static uint16_t khp[HD * (KEYS + 16)], ksp[HD * (KEYS + 16)]; /* whole blocks */
        static float kfp[HD * (KEYS + 16)];
        static uint8_t kbp[HD * (KEYS + 16)];
        static float sp[ROWS * KEYS];
        for (int b = 0; b * bt < n; b++) {
            size_t at = (size_t)b * (size_t)hd * (size_t)bt; /* each block a piece of its own */
            for (int64_t d = 0; d < hd; d++)
                for (int c = 0; c < bt && b * bt + c < n; c++) {
                    khp[at + (size_t)d * bt + c] = kh[d * KEYS + b * bt + c];
                    kfp[at + (size_t)d * bt + c] = kf[d * KEYS + b * bt + c];
                    kbp[at + (size_t)k_at(type, d, bt, c)] = kb[k_at(type, d, KEYS, b * bt + c)];
                    ksp[at + (size_t)d * bt + c] = ks[d * KEYS + b * bt + c];
                }
            kblk[b] = type == DT_F16 ? (const void *)(khp + at) : type == DT_F32 ? (const void *)(kfp + at) : (const void *)(kbp + at);
            ksblk[b] = ksp + at;
        }
        ops->attn_qk_paged(qa, ldq, rows, kblk, quant ? ksblk : NULL, bt, n, hd, type, sp, KEYS, &pf);
        ref->attn_qk(qa, ldq, rows, kt, ks, KEYS, n, hd, type, s1, KEYS);
        for (int r = 0; r < rows; r++)
            bad += memcmp(sp + r * KEYS, s1 + r * KEYS, (size_t)n * sizeof *sp) != 0;
        ref->attn_pv(o0, hd, rows, s0, KEYS, nr, v, hd, type, NULL);
        ops->attn_pv(o1, hd, rows, s0, KEYS, nr, v, hd, type, &pf);
        bad += memcmp(o0, o1, (size_t)(rows * hd) * sizeof *o0) != 0;
    }
    CHECK(bad == 0, "%s: %d attention tile results differ from the reference in bits", name, bad);
}

/* Regions whose last byte is followed by an unmapped page: an operand placed at a region's
 * end (guard_end) faults on any read or write past it. */
enum { GUARD_BYTES = 4 << 12 };

static char *guard_map(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (GUARD_BYTES + page - 1) / page * page;
    char *p = mmap(NULL, len + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (mprotect(p + len, page, PROT_NONE) != 0) {
        munmap(p, len + page);
        return NULL;
    }
    return p + len - GUARD_BYTES;
}

static void *guard_end(char *region, size_t bytes) { return region + GUARD_BYTES - bytes; }

/* Unmaps guard_map's region (NULL: nothing). */
static void guard_unmap(char *region)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (GUARD_BYTES + page - 1) / page * page;
    if (region)
        munmap(region + GUARD_BYTES - len, len + page);
}

/* The tile products with each operand at the end of a guarded region (tight strides: K's ld
 * and the scores' lds the key count, paged blocks of bt keys each at a region's end, each V
 * row at one's end), keys 1-33 past every whole group, rows 1-5, every type: no read or write
 * past an operand (a fault ends the test), and the reference's bits. */
static void test_attn_edges(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { NMAX = 33, ROWS = 5, BLOCKS = 5 };
    char *kr = guard_map(), *ksr = guard_map(), *qr = guard_map(), *sr = guard_map(), *vr[NMAX] = {0};
    char *kbr[BLOCKS] = {0}, *ksbr[BLOCKS] = {0};
    bool ok = kr && ksr && qr && sr;
    for (int i = 0; i < NMAX; i++)
        ok = ok && (vr[i] = guard_map()) != NULL;
    for (int i = 0; i < BLOCKS; i++)
        ok = ok && (kbr[i] = guard_map()) != NULL && (ksbr[i] = guard_map()) != NULL;
    CHECK(ok, "%s: guarded regions not mapped", name);
    static float s0[ROWS * NMAX], o0[ROWS * 64], o1[ROWS * 64], qf[ROWS * 64];
    static char q8[ROWS * VEC_Q8_ROW_BYTES(64)] __attribute__((aligned(4)));
    const int types[4] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0};
    uint64_t seed = 23;
    int bad = 0;
    for (int rep = 0; ok && rep < 4 * NMAX * 2; rep++) {
        int type = types[rep % 4], n = 1 + rep / 4 % NMAX, rows = 1 + rep % ROWS, bt = rep % 8 < 4 ? 8 : 7;
        int hd = type == DT_F16 || type == DT_F32 ? (rep / 4 / NMAX ? 13 : 64) : (rep / 4 / NMAX ? 32 : 64);
        size_t esize = type == DT_F16 ? 2 : type == DT_F32 ? 4 : 1;
        size_t krow = type == DT_Q4_0 ? (size_t)hd / 2 : (size_t)hd; /* byte rows (Q8_0: hd/4 of 4 bytes a key) */
        size_t vbytes = type == DT_Q8_0 ? hd / 32 * sizeof(struct block_q8_0)
                      : type == DT_Q4_0 ? hd / 32 * sizeof(struct block_q4_0) : hd * esize;
        for (int i = 0; i < GUARD_BYTES; i++) {
            kr[i] = (char)(test_rand_u64(&seed) & 0x77); /* small, finite as halves and floats */
            for (int v = 0; v < NMAX; v++)
                vr[v][i] = (char)(i % 2 ? 0x3c : test_rand_u64(&seed) & 0x3f); /* halves near 1 */
        }
        for (int i = 0; i < GUARD_BYTES / 2; i++)
            ((uint16_t *)ksr)[i] = kern_f32_to_f16(test_rand_float(&seed) * 0.1f);
        for (int i = 0; i < ROWS * 64; i++)
            qf[i] = test_rand_float(&seed);
        const void *kt = guard_end(kr, krow * (size_t)n * esize);
        const uint16_t *ks = guard_end(ksr, (size_t)hd / 32 * (size_t)n * 2);
        int64_t ldq = type == DT_Q8_0 ? VEC_Q8_ROW_BYTES(hd) : hd;
        for (int r = 0; type == DT_Q8_0 && r < rows; r++)
            vec_q8_query(qf + r * hd, hd, q8 + r * ldq);
        size_t qbytes = (size_t)rows * (size_t)ldq * (type == DT_Q8_0 ? 1 : sizeof(float));
        void *q = guard_end(qr, qbytes);
        memcpy(q, type == DT_Q8_0 ? (const void *)q8 : (const void *)qf, qbytes);
        float *s1 = guard_end(sr, (size_t)rows * (size_t)n * sizeof(float));
        ref->attn_qk(q, ldq, rows, kt, ks, n, n, hd, type, s0, n);
        ops->attn_qk(q, ldq, rows, kt, ks, n, n, hd, type, s1, n);
        bad += memcmp(s0, s1, (size_t)(rows * n) * sizeof *s0) != 0;
        /* paged: block b holds keys [b*bt, b*bt + bt), K's rows bt wide, the last block partly used */
        const void *kb[BLOCKS];
        const uint16_t *ksb[BLOCKS];
        for (int b = 0; b * bt < n; b++) {
            kb[b] = guard_end(kbr[b], krow * (size_t)bt * esize);
            ksb[b] = guard_end(ksbr[b], (size_t)hd / 32 * (size_t)bt * 2);
            for (int64_t d = 0; d < (int64_t)krow; d++)
                for (int c = 0; c < bt && b * bt + c < n; c++) {
                    if (type == DT_Q8_0) /* row d: dimension d's byte of each key, 4 a group */
                        ((char *)kb[b])[4 * ((d / 4) * bt + c) + d % 4] = ((const char *)kt)[4 * ((d / 4) * n + b * bt + c) + d % 4];
                    else
                        memcpy((char *)kb[b] + ((size_t)d * bt + c) * esize, (const char *)kt + ((size_t)d * n + b * bt + c) * esize, esize);
                }
            for (int64_t c32 = 0; c32 < hd / 32; c32++)
                for (int c = 0; c < bt && b * bt + c < n; c++)
                    ((uint16_t *)ksb[b])[c32 * bt + c] = ks[c32 * n + b * bt + c];
        }
        bool quant = type == DT_Q8_0 || type == DT_Q4_0;
        ops->attn_qk_paged(q, ldq, rows, (const void *const *)kb, quant ? ksb : NULL, bt, n, hd, type, s1, n, NULL);
        bad += memcmp(s0, s1, (size_t)(rows * n) * sizeof *s0) != 0;
        /* P.V: each key's V row at a region's end, rows of different lengths */
        const void *v[NMAX];
        int32_t nr[ROWS];
        for (int j = 0; j < n; j++)
            v[j] = guard_end(vr[j], vbytes);
        for (int r = 0; r < rows; r++)
            nr[r] = r % 2 ? n : 1 + (int)(test_rand_u64(&seed) % (unsigned)n);
        for (int i = 0; i < ROWS * 64; i++)
            o0[i] = o1[i] = test_rand_float(&seed);
        float *ov = guard_end(sr, (size_t)rows * (size_t)hd * sizeof(float));
        memcpy(ov, o1, (size_t)rows * (size_t)hd * sizeof(float));
        ref->attn_pv(o0, hd, rows, s0, n, nr, v, hd, type, NULL);
        ops->attn_pv(ov, hd, rows, s0, n, nr, v, hd, type, NULL);
        bad += memcmp(o0, ov, (size_t)(rows * hd) * sizeof *o0) != 0;
        /* f16_to_f32 of a block's K rows at a region's end, and q8_query of a row at one's */
        if (type == DT_F16) {
            float *y = guard_end(sr, (size_t)n * sizeof(float));
            ops->f16_to_f32((const uint16_t *)kt + (size_t)(hd - 1) * n, n, y, n, 1, n);
            for (int j = 0; j < n; j++)
                bad += kern_f16_to_f32(((const uint16_t *)kt)[(size_t)(hd - 1) * n + j]) != y[j];
        }
        if (type == DT_Q8_0) {
            float *x = guard_end(qr, (size_t)hd * sizeof(float));
            memcpy(x, qf, (size_t)hd * sizeof(float));
            char *row = guard_end(sr, VEC_Q8_ROW_BYTES((size_t)hd));
            ops->q8_query(x, hd, row);
            vec_q8_query(qf, hd, q8);
            bad += memcmp(row, q8, VEC_Q8_ROW_BYTES((size_t)hd)) != 0;
        }
    }
    CHECK(bad == 0, "%s: %d tile results at guarded ends differ from the reference", name, bad);
    char *all[] = {kr, ksr, qr, sr};
    for (int i = 0; i < 4; i++)
        guard_unmap(all[i]);
    for (int i = 0; i < NMAX; i++)
        guard_unmap(vr[i]);
    for (int i = 0; i < BLOCKS; i++) {
        guard_unmap(kbr[i]);
        guard_unmap(ksbr[i]);
    }
}

/* A decode step's shape, as decode_tile calls the kernels (4 query rows of 64 dims, q' rows 64
 * apart, scores a tile of 256 apart, o rows 64 apart, keys in blocks of 16, 64 keys a call or
 * fewer), F16 and F32, and a prefill tile's P.V (16 rows: groups of 6, 6 and 4 with those
 * strides): the reference's bits (the AVX-512 kernels take paths of their own here). */
static void test_attn_decode_shape(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { HD = 64, ROWS = 16, LDS = 256, KEYS = 64, BT = 16 };
    static float q[ROWS * HD], s0[ROWS * LDS], s1[ROWS * LDS], o0[ROWS * HD], o1[ROWS * HD];
    static float kf[HD * KEYS], kfp[HD * KEYS], vf[KEYS * HD];
    static uint16_t kh[HD * KEYS], khp[HD * KEYS], vh[KEYS * HD];
    uint64_t seed = 11;
    int bad = 0;
    for (int rep = 0; rep < 40; rep++) {
        int type = rep % 2 ? DT_F32 : DT_F16;
        int n = rep < 20 ? KEYS : 1 + (int)(test_rand_u64(&seed) % KEYS);
        int rows = rep % 4 < 2 ? 4 : ROWS;
        random_q_o(q, o0, o1, ROWS * HD, &seed);
        for (int i = 0; i < HD * KEYS; i++) {
            kf[i] = test_rand_float(&seed);
            kh[i] = kern_f32_to_f16(kf[i]);
            vf[i] = test_rand_float(&seed);
            vh[i] = kern_f32_to_f16(vf[i]);
        }
        const void *kblk[KEYS / BT], *v[KEYS];
        for (int b = 0; b < KEYS / BT; b++) {
            for (int d = 0; d < HD; d++)
                for (int c = 0; c < BT; c++) {
                    khp[b * HD * BT + d * BT + c] = kh[d * KEYS + b * BT + c];
                    kfp[b * HD * BT + d * BT + c] = kf[d * KEYS + b * BT + c];
                }
            kblk[b] = type == DT_F16 ? (const void *)(khp + b * HD * BT) : (const void *)(kfp + b * HD * BT);
        }
        for (int j = 0; j < KEYS; j++)
            v[j] = type == DT_F16 ? (const void *)(vh + j * HD) : (const void *)(vf + j * HD);
        const void *kt = type == DT_F16 ? (const void *)kh : (const void *)kf;
        ref->attn_qk(q, HD, rows, kt, NULL, KEYS, n, HD, type, s0, LDS);
        ops->attn_qk_paged(q, HD, rows, kblk, NULL, BT, n, HD, type, s1, LDS, NULL);
        for (int r = 0; r < rows; r++)
            bad += memcmp(s0 + r * LDS, s1 + r * LDS, (size_t)n * sizeof *s0) != 0;
        int32_t nr[ROWS];
        for (int r = 0; r < rows; r++)
            nr[r] = rep % 3 == 0 ? 1 + (int)(test_rand_u64(&seed) % (unsigned)n) : n;
        ref->attn_pv(o0, HD, rows, s0, LDS, nr, v, HD, type, NULL);
        ops->attn_pv(o1, HD, rows, s0, LDS, nr, v, HD, type, NULL);
        bad += memcmp(o0, o1, sizeof o0) != 0;
    }
    CHECK(bad == 0, "%s: %d decode- and prefill-shaped tile results differ from the reference in bits", name, bad);
}

/* f32_to_f16 over floats of every kind F16 meets (normals, ties, overflow, half and float
 * subnormals, infinities, NaNs with payloads, signalling ones too), contiguous and strided,
 * every length up to 40 (each tail): the reference's bits, and nothing written between
 * the strided halves. */
static void test_f32_to_f16(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { N = 40, STRIDE = 3 };
    static const uint32_t special[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                                       0xffa00fff, 0x7fbfe000, 0x477fe000, 0x477ff000, 0x47800000, 0x38800000,
                                       0x387fffff, 0x33000000, 0x33000001, 0x33800000, 0x00000001, 0x80400000,
                                       0x3f801000, 0x3f803000, 0x3f800fff, 0xc7ffffff};
    uint64_t seed = 7;
    float x[N];
    uint16_t y0[N * STRIDE], y1[N * STRIDE];
    int bad = 0;
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = (uint32_t)test_rand_u64(&seed);
            if (rep % 3 == 0)
                u = special[(size_t)(u % (sizeof special / sizeof special[0]))];
            else if (rep % 3 == 1) /* exponents around the half's range, any mantissa */
                u = (u & 0x807fffffu) | (uint32_t)(100 + (u >> 8) % 50) << 23;
            memcpy(&x[i], &u, sizeof u);
        }
        int n = 1 + rep % N;
        int64_t ld = rep % 2 ? STRIDE : 1;
        memset(y0, 0xa5, sizeof y0);
        memset(y1, 0xa5, sizeof y1);
        ref->f32_to_f16(x, n, y0, ld);
        ops->f32_to_f16(x, n, y1, ld);
        bad += memcmp(y0, y1, sizeof y0) != 0;
        for (int i = 0; i < n; i++)
            bad += y0[i * ld] != kern_f32_to_f16(x[i]);
    }
    CHECK(bad == 0, "%s: %d F16 conversions differ from kern_f32_to_f16 in bits (or wrote between strides)", name, bad);
}

/* attn_pv_merge (where a variant has it; the reference's own too) against the reference's
 * attn_pv into a cleared o_t, then attn.h's merge o*a + o_t*b, on random shapes (rows 1-19,
 * keys 1-150, head sizes 8-136) and a prefill tile's (256 rows of 64 dims, o rows 64 apart,
 * scores 256 apart), F16 and F32: the same bits. */
static void test_attn_pv_merge(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { ROWS = 256, KEYS = 256, HD = 136 };
    static float p[ROWS * KEYS], o0[ROWS * HD], o1[ROWS * HD], ot[ROWS * HD], f[2 * ROWS], vf[KEYS * HD];
    static uint16_t vh[KEYS * HD];
    if (!ops->attn_pv_merge) {
        printf("%s: no attn_pv_merge, skipped\n", name);
        return;
    }
    uint64_t seed = 13;
    int bad = 0;
    for (int rep = 0; rep < 60; rep++) {
        int type = rep % 2 ? DT_F32 : DT_F16, prefill = rep % 10 < 2;
        int rows = prefill ? ROWS - rep % 3 : 1 + (int)(test_rand_u64(&seed) % 19);
        int n = prefill ? KEYS : 1 + (int)(test_rand_u64(&seed) % 150);
        int hd = prefill ? 64 : 8 * (1 + (int)(test_rand_u64(&seed) % (HD / 8))) - (rep % 5 == 0 ? 3 : 0);
        int64_t ldp = prefill ? KEYS : n + 3;
        for (int i = 0; i < ROWS * KEYS; i++)
            p[i] = test_rand_float(&seed) * 0.5f + 0.5f;
        for (int i = 0; i < KEYS * HD; i++) {
            vf[i] = test_rand_float(&seed);
            vh[i] = kern_f32_to_f16(vf[i]);
        }
        for (int i = 0; i < ROWS * HD; i++)
            o0[i] = o1[i] = test_rand_float(&seed);
        for (int r = 0; r < ROWS; r++) {
            f[2 * r] = test_rand_float(&seed) * 0.5f + 0.5f;
            f[2 * r + 1] = r % 7 ? test_rand_float(&seed) * 0.5f + 0.5f : 1.0f;
        }
        const void *v[KEYS];
        int32_t nr[ROWS];
        for (int j = 0; j < n; j++)
            v[j] = type == DT_F16 ? (const void *)(vh + j * hd) : (const void *)(vf + j * hd);
        for (int r = 0; r < rows; r++)
            nr[r] = n;
        memset(ot, 0, sizeof ot);
        ref->attn_pv(ot, hd, rows, p, ldp, nr, v, hd, type, NULL);
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < hd; i++)
                o0[r * hd + i] = o0[r * hd + i] * f[2 * r] + ot[r * hd + i] * f[2 * r + 1];
        ops->attn_pv_merge(o1, hd, rows, p, ldp, n, v, hd, type, f);
        bad += memcmp(o0, o1, sizeof o0) != 0;
    }
    CHECK(bad == 0, "%s: %d of 60 attn_pv_merge results differ from attn_pv and the merge in bits", name, bad);
}

/* softmax_rows (where a variant has it) against the reference's softmax_tile of each row, rows
 * of 1-256 scores (a tile's 256 apart, some rows shorter): the same bits. */
static void test_softmax_rows(const struct vec_ops *ref, const struct vec_ops *ops, const char *name)
{
    enum { ROWS = 40, LDS = 256 };
    static float s0[ROWS * LDS], s1[ROWS * LDS];
    float m0[ROWS], m1[ROWS], l0[ROWS], l1[ROWS];
    int32_t n[ROWS];
    if (!ops->softmax_rows) {
        printf("%s: no softmax_rows, skipped\n", name);
        return;
    }
    uint64_t seed = 17;
    int bad = 0;
    for (int rep = 0; rep < 40; rep++) {
        int rows = 1 + (int)(test_rand_u64(&seed) % ROWS);
        for (int i = 0; i < ROWS * LDS; i++)
            s0[i] = s1[i] = test_rand_float(&seed) * 30.0f;
        for (int r = 0; r < rows; r++) {
            n[r] = rep % 2 ? LDS : 1 + (int)(test_rand_u64(&seed) % LDS);
            m0[r] = ref->softmax_tile(s0 + r * LDS, n[r], &l0[r]);
        }
        ops->softmax_rows(s1, LDS, rows, n, m1, l1);
        bad += memcmp(s0, s1, sizeof s0) != 0 || memcmp(m0, m1, (size_t)rows * sizeof *m0) != 0 ||
               memcmp(l0, l1, (size_t)rows * sizeof *l0) != 0;
    }
    CHECK(bad == 0, "%s: %d of 40 softmax_rows results differ from softmax_tile's in bits", name, bad);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    const struct vec_ops *ref = vec_ops_ref();
    const char *names[] = {"avx2", "avx512", "neon", "avx512-novnni"};
    uint64_t seed = 42;
    float a[MAXN], b[MAXN], y0[MAXN], y1[MAXN], u[MAXN];
    for (int v = 0; v < 4; v++) {
        const struct vec_ops *ops = vec_ops_variant(names[v]);
        if (!ops) {
            printf("%s: not on this CPU, skipped\n", names[v]);
            continue;
        }
        int bad = 0;
        for (int rep = 0; rep < 400; rep++) {
            int n = 1 + (int)(test_rand_u64(&seed) % MAXN);
            float scale = powf(10.0f, (float)(int)(test_rand_u64(&seed) % 7) - 3.0f);
            for (int i = 0; i < n; i++) {
                a[i] = test_rand_float(&seed) * scale;
                b[i] = test_rand_float(&seed);
            }
            for (int i = n; i < MAXN; i++) {
                a[i] = b[i] = 0.0f;
                y0[i] = y1[i] = test_rand_float(&seed);
            }
            float r0 = ref->dot_f32(a, b, n), r1 = ops->dot_f32(a, b, n);
            bad += memcmp(&r0, &r1, sizeof r0) != 0;
            /* exp and silu over a range wider than the clamps, with a NaN now and then */
            for (int i = 0; i < n; i++)
                y0[i] = y1[i] = test_rand_float(&seed) * 100.0f;
            if (rep % 7 == 0)
                y0[n / 2] = y1[n / 2] = NAN;
            ref->exp_sub(y0, b[0], n);
            ops->exp_sub(y1, b[0], n);
            bad += memcmp(y0, y1, (size_t)n * sizeof *y0) != 0;
            for (int i = 0; i < n; i++)
                y0[i] = y1[i] = a[i] * 30.0f / scale;
            ref->silu_mul(y0, b, n);
            ops->silu_mul(y1, b, n);
            bad += memcmp(y0, y1, (size_t)n * sizeof *y0) != 0;
            /* gpt-oss's SwiGLU past both clamps (gate and up up to +-30 with the biases), a
             * NaN in the gate and in up now and then; u's tail beyond n stays unread */
            for (int i = 0; i < n; i++) {
                y0[i] = y1[i] = test_rand_float(&seed) * 30.0f;
                u[i] = test_rand_float(&seed) * 30.0f;
            }
            if (rep % 5 == 0) {
                y0[n / 3] = y1[n / 3] = NAN;
                u[n / 2] = NAN;
            }
            ref->swiglu_oai(y0, u, b, a, n);
            ops->swiglu_oai(y1, u, b, a, n);
            bad += memcmp(y0, y1, (size_t)n * sizeof *y0) != 0;
        }
        CHECK(bad == 0, "%s: %d of 1600 results differ from the reference in bits", names[v], bad);
        RUN(test_attn_tiles, ref, ops, names[v]);
        RUN(test_attn_decode_shape, ref, ops, names[v]);
        RUN(test_q8_query, ops, names[v]);
        RUN(test_f32_to_f16, ref, ops, names[v]);
        RUN(test_attn_pv_merge, ref, ops, names[v]);
        RUN(test_softmax_rows, ref, ops, names[v]);
        RUN(test_f16_to_f32, ops, names[v]);
        RUN(test_attn_edges, ref, ops, names[v]);
    }
    RUN(test_attn_pv_merge, ref, ref, "ref");
    RUN(test_exp_accuracy, ref);
    const struct vec_ops *avail[3];
    int n_avail = 0;
    for (int v = 0; v < 3; v++)
        if (vec_ops_variant(names[v]))
            avail[n_avail++] = vec_ops_variant(names[v]);
    RUN(test_softmax_exp, ref, avail, n_avail);
    return test_main_end();
}
