/* The reference product and activation quantization: kern_act_quantize against the
 * contract of kern.h (zero rows, huge values, ties), kern_matmul_ref against float64
 * sums, against a transcription of kern.h's canonical arithmetic written here from the
 * GGUF bit fields (bitwise), and its independence of batch size and row range. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern/kern.h"
#include "kern/quant.h"
#include "testutil.h"

static uint64_t rng = 0xabcdef;

static double gauss(void)
{
    double u1 = ((double)(test_rand_u64(&rng) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = (double)(test_rand_u64(&rng) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static const int all_types[] = {DT_F32, DT_F16, DT_BF16, DT_Q4_0, DT_Q4_1, DT_Q5_0,
                                DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                                DT_Q2_K, DT_Q3_K, DT_IQ4_NL, DT_IQ4_XS, DT_MXFP4};
#define NTYPES ((int)(sizeof all_types / sizeof *all_types))

static int act_block(int type)
{
    switch (type) {
    case DT_F32: case DT_F16: case DT_BF16: return 1;
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: return QK_K;
    case DT_Q2_K: case DT_Q3_K: case DT_IQ4_XS: return QK_K;
    default: return QK32;
    }
}

/* ---- activations ---- */

static void test_act_row_bytes(void)
{
    CHECK_EQ_INT(kern_act_row_bytes(DT_F32, 100), 400);
    CHECK_EQ_INT(kern_act_row_bytes(DT_F16, 64), 256);
    CHECK_EQ_INT(kern_act_row_bytes(DT_BF16, 64), 256);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q4_0, 4096), 128 * 40);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q8_0, 64), 80);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q5_1, 32), 40);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q4_K, 4096), 16 * 292);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q6_K, 256), 292);
    CHECK_EQ_INT(kern_act_row_bytes(DT_Q2_K, 256), 292);
    CHECK_EQ_INT(kern_act_row_bytes(DT_IQ4_NL, 64), 80);
    CHECK_EQ_INT(kern_act_row_bytes(DT_MXFP4, 64), 80);
    CHECK_EQ_INT(kern_act_row_bytes(DT_IQ2_XXS, 256), 0);
    CHECK_EQ_INT(kern_act_row_bytes(12345, 256), 0);
}

/* kern.h's block rule, transcribed: amax, d = amax/127, id = 127/amax, nearbyintf. */
static void spec_act_block(const float *x, int n, float *d, int8_t *q)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    *d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (int8_t)nearbyintf(x[i] * id);
}

/* Checks one activation row against the transcription, plus the sums. */
static int act_row_matches(int wtype, const float *x, const void *xq, int n)
{
    int bad = 0;
    float d;
    int8_t q[QK_K];
    if (act_block(wtype) == QK32) {
        const struct act_q8_32 *a = xq;
        for (int b = 0; b < n / QK32; b++) {
            spec_act_block(x + b * QK32, QK32, &d, q);
            int sum = 0;
            for (int i = 0; i < QK32; i++)
                sum += q[i];
            bad += fbits(a[b].d) != fbits(d) || memcmp(a[b].q, q, QK32) || a[b].sum != sum;
        }
    } else {
        const struct act_q8_256 *a = xq;
        for (int b = 0; b < n / QK_K; b++) {
            spec_act_block(x + b * QK_K, QK_K, &d, q);
            bad += fbits(a[b].d) != fbits(d) || memcmp(a[b].q, q, QK_K);
            for (int j = 0; j < 16; j++) {
                int sum = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++)
                    sum += q[i];
                bad += a[b].bsums[j] != sum;
            }
        }
    }
    return bad;
}

static void test_act_quantize(void)
{
    enum { N = 1024 };
    float x[N];
    static uint8_t xq[N * 4];
    int wtypes[] = {DT_Q8_0, DT_Q4_K};
    for (int t = 0; t < 2; t++) {
        int wt = wtypes[t];
        const char *name = t ? "ACT_Q8_256" : "ACT_Q8_32";

        /* zero row: d = 0, every q and sum 0 */
        memset(x, 0, sizeof x);
        memset(xq, 0x55, sizeof xq);
        kern_act_quantize(wt, x, xq, N);
        CHECK(act_row_matches(wt, x, xq, N) == 0, "%s zero row", name);
        if (t == 0)
            CHECK(((struct act_q8_32 *)xq)->d == 0.0f && ((struct act_q8_32 *)xq)->q[5] == 0, "%s zero row d", name);

        /* random rows with the transcription */
        for (int rep = 0; rep < 20; rep++) {
            for (int i = 0; i < N; i++)
                x[i] = (float)gauss() * (rep % 2 ? 3.0f : 0.01f);
            kern_act_quantize(wt, x, xq, N);
            int bad = act_row_matches(wt, x, xq, N);
            CHECK(bad == 0, "%s random row %d: %d blocks differ from kern.h's rule", name, rep, bad);
        }

        /* one huge value per block: it gets +-127, everything else 0 */
        for (int i = 0; i < N; i++)
            x[i] = (float)gauss() * 0.1f;
        x[7] = 1e30f;
        x[300] = -3e38f;
        kern_act_quantize(wt, x, xq, N);
        CHECK(act_row_matches(wt, x, xq, N) == 0, "%s huge-value row", name);
        int8_t q7, q300;
        float d7;
        int zeros = 0;
        if (t == 0) {
            const struct act_q8_32 *a = (const struct act_q8_32 *)xq;
            q7 = a[0].q[7], q300 = a[300 / 32].q[300 % 32], d7 = a[0].d;
            for (int i = 0; i < 32; i++)
                zeros += i != 7 && a[0].q[i] == 0;
            CHECK(zeros == 31, "%s: %d of 31 small values in the huge block are 0", name, zeros);
        } else {
            const struct act_q8_256 *a = (const struct act_q8_256 *)xq;
            q7 = a[0].q[7], q300 = a[1].q[300 - 256], d7 = a[0].d;
        }
        CHECK(q7 == 127 && q300 == -127, "%s huge values -> %d, %d", name, q7, q300);
        CHECK(d7 == 1e30f / 127.0f, "%s huge d = %g", name, d7);

        /* ties round half to even: amax 127 makes id exactly 1 */
        float tie[QK_K];
        for (int i = 0; i < QK_K; i++)
            tie[i] = 0.0f;
        tie[0] = 127.0f, tie[1] = 2.5f, tie[2] = 3.5f, tie[3] = -2.5f, tie[4] = 0.5f, tie[5] = -1.5f;
        kern_act_quantize(wt, tie, xq, QK_K);
        const int8_t *q = t == 0 ? ((const struct act_q8_32 *)xq)->q : ((const struct act_q8_256 *)xq)->q;
        CHECK(q[0] == 127 && q[1] == 2 && q[2] == 4 && q[3] == -2 && q[4] == 0 && q[5] == -2,
              "%s ties: %d %d %d %d %d %d", name, q[0], q[1], q[2], q[3], q[4], q[5]);
    }
    /* float weights: the row is copied */
    float src[5] = {1.5f, -2.0f, 0.0f, 1e-30f, 3.0f}, dst[5];
    kern_act_quantize(DT_F16, src, dst, 5);
    CHECK(memcmp(src, dst, sizeof src) == 0, "F32 activations are copied");
}

/* The dispatched quantizer (AVX-512 or NEON where the CPU has it) against the scalar
 * reference, byte for byte: every block count from 1 to 40 (the vector kernels take
 * blocks in groups, then a tail), with zero blocks, NaN, infinities, ties and
 * denormals mixed in. */
static void test_act_quantize_vs_ref(void)
{
    enum { MAX_BLOCKS = 40 };
    static float x[MAX_BLOCKS * QK_K];
    static uint8_t got[MAX_BLOCKS * 300], want[MAX_BLOCKS * 300];
    int wtypes[] = {DT_Q8_0, DT_Q4_K};
    for (int t = 0; t < 2; t++) {
        int bs = t ? QK_K : QK32;
        for (int nb = 1; nb <= MAX_BLOCKS; nb++) {
            int n = nb * bs;
            for (int i = 0; i < n; i++)
                x[i] = (float)gauss() * (i / bs % 3 ? 2.0f : 1e-3f);
            for (int b = 0; b < nb; b += 5)  /* a zero block every fifth */
                memset(x + b * bs, 0, (size_t)bs * sizeof(float));
            if (nb > 2)
                x[bs + 3] = NAN, x[2 * bs + 1] = -NAN;
            if (nb > 4)
                x[3 * bs + 7] = INFINITY, x[4 * bs] = NAN, x[4 * bs + 1] = -INFINITY;
            if (nb > 6)
                x[6 * bs] = 127.0f, x[6 * bs + 1] = 2.5f, x[6 * bs + 2] = -0.5f;
            if (nb > 7)
                for (int i = 0; i < bs; i++)  /* a block of NaN only */
                    x[7 * bs + i] = NAN;
            if (nb > 8)
                for (int i = 0; i < bs; i++)  /* denormals: 127/amax overflows to infinity */
                    x[8 * bs + i] = i % 3 ? 1e-45f * (float)(i % 4) : 0.0f;
            memset(got, 0x55, sizeof got);
            memset(want, 0x55, sizeof want);
            kern_act_quantize(wtypes[t], x, got, n);
            kern_act_quantize_ref(wtypes[t], x, want, n);
            size_t bytes = kern_act_row_bytes(wtypes[t], n);
            CHECK(memcmp(got, want, bytes) == 0, "%s, %d blocks: the fast quantizer differs from the reference",
                  t ? "ACT_Q8_256" : "ACT_Q8_32", nb);
        }
    }
}

/* ---- the canonical arithmetic, transcribed from kern.h with our own bit decoding ---- */

static float h2f(uint16_t h)
{
    return kern_f16_to_f32(h);
}

static int nib(const uint8_t *qs, int e)  /* legacy: e < 16 low nibble of qs[e] */
{
    return e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
}

/* ggml's level tables (ggml-common.h), written out here independently of quant.h. */
static const int iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void k4_sm(const uint8_t *s, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

static float spec_dot(int type, const void *w, const void *xq, int n)
{
    float acc = 0.0f;
    if (type == DT_F32 || type == DT_F16 || type == DT_BF16) {
        float lane[16] = {0};
        for (int k = 0; k < n; k++) {
            float wk = type == DT_F32 ? ((const float *)w)[k]
                     : type == DT_F16 ? h2f(((const uint16_t *)w)[k])
                                      : kern_bf16_to_f32(((const uint16_t *)w)[k]);
            lane[k % 16] = fmaf(wk, ((const float *)xq)[k], lane[k % 16]);
        }
        for (int s = 8; s >= 1; s /= 2)
            for (int l = 0; l < s; l++)
                lane[l] = lane[l] + lane[l + s];
        return lane[0];
    }
    if (act_block(type) == QK32) {
        const struct act_q8_32 *x = xq;
        for (int b = 0; b < n / QK32; b++) {
            float dx = x[b].d, dw, m = 0.0f;
            int isum = 0, xsum = 0;
            for (int e = 0; e < 32; e++) {
                int wq;
                if (type == DT_Q4_0) {
                    const struct block_q4_0 *bw = (const struct block_q4_0 *)w + b;
                    wq = nib(bw->qs, e) - 8, dw = h2f(bw->d);
                } else if (type == DT_Q4_1) {
                    const struct block_q4_1 *bw = (const struct block_q4_1 *)w + b;
                    wq = nib(bw->qs, e), dw = h2f(bw->d), m = h2f(bw->m);
                } else if (type == DT_Q5_0) {
                    const struct block_q5_0 *bw = (const struct block_q5_0 *)w + b;
                    uint32_t qh = (uint32_t)bw->qh[0] | (uint32_t)bw->qh[1] << 8 | (uint32_t)bw->qh[2] << 16 | (uint32_t)bw->qh[3] << 24;
                    wq = (nib(bw->qs, e) | (int)((qh >> e) & 1) << 4) - 16, dw = h2f(bw->d);
                } else if (type == DT_Q5_1) {
                    const struct block_q5_1 *bw = (const struct block_q5_1 *)w + b;
                    uint32_t qh = (uint32_t)bw->qh[0] | (uint32_t)bw->qh[1] << 8 | (uint32_t)bw->qh[2] << 16 | (uint32_t)bw->qh[3] << 24;
                    wq = nib(bw->qs, e) | (int)((qh >> e) & 1) << 4, dw = h2f(bw->d), m = h2f(bw->m);
                } else if (type == DT_IQ4_NL) {
                    const uint8_t *bw = (const uint8_t *)w + 18 * b;  /* d, qs[16] */
                    uint16_t h;
                    memcpy(&h, bw, 2);
                    wq = iq4nl_levels[nib(bw + 2, e)], dw = h2f(h);
                } else if (type == DT_MXFP4) {
                    const uint8_t *bw = (const uint8_t *)w + 17 * b;  /* e, qs[16] */
                    wq = e2m1_doubled[nib(bw + 1, e)], dw = ldexpf(1.0f, bw[0] - 128);
                } else {
                    const struct block_q8_0 *bw = (const struct block_q8_0 *)w + b;
                    wq = bw->qs[e], dw = h2f(bw->d);
                }
                isum += wq * x[b].q[e];
                xsum += x[b].q[e];
            }
            acc = fmaf(dw * dx, (float)isum, acc);
            if (type == DT_Q4_1 || type == DT_Q5_1)
                acc = fmaf(m * dx, (float)xsum, acc);
        }
        return acc;
    }
    const struct act_q8_256 *x = xq;
    for (int b = 0; b < n / QK_K; b++) {
        float dx = x[b].d;
        if (type == DT_Q2_K) {  /* scales[16], qs[64], d, dmin */
            const uint8_t *bw = (const uint8_t *)w + 84 * b;
            uint16_t d, dmin;
            memcpy(&d, bw + 80, 2);
            memcpy(&dmin, bw + 82, 2);
            int isum = 0, msum = 0;
            for (int j = 0; j < 16; j++) {
                int s = 0, xs = 0;
                for (int e = 16 * j; e < 16 * j + 16; e++) {
                    int h = e / 128, k = (e % 128) / 32, l = e % 32;
                    s += ((bw[16 + 32 * h + l] >> (2 * k)) & 3) * x[b].q[e];
                    xs += x[b].q[e];
                }
                isum += (bw[j] & 15) * s;
                msum += (bw[j] >> 4) * xs;
            }
            acc = fmaf(h2f(d) * dx, (float)isum, acc);
            acc = fmaf(-(h2f(dmin) * dx), (float)msum, acc);
            continue;
        }
        if (type == DT_Q3_K) {  /* hmask[32], qs[64], scales[12], d */
            const uint8_t *bw = (const uint8_t *)w + 110 * b;
            uint16_t d;
            memcpy(&d, bw + 108, 2);
            /* ggml's unpacking: three little-endian words into four of 4 scales each */
            uint32_t a[4], t2;
            memcpy(a, bw + 96, 12);
            t2 = a[2];
            a[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((t2 >> 4) & 0x03030303) << 4);
            a[3] = ((a[1] >> 4) & 0x0f0f0f0f) | (((t2 >> 6) & 0x03030303) << 4);
            a[0] = (a[0] & 0x0f0f0f0f) | (((t2 >> 0) & 0x03030303) << 4);
            a[1] = (a[1] & 0x0f0f0f0f) | (((t2 >> 2) & 0x03030303) << 4);
            const uint8_t *sc = (const uint8_t *)a;
            int isum = 0;
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int e = 16 * j; e < 16 * j + 16; e++) {
                    int h = e / 128, k = (e % 128) / 32, l = e % 32;
                    int q = (bw[32 + 32 * h + l] >> (2 * k)) & 3;
                    if (!(bw[l] & (1 << (e / 32))))
                        q -= 4;
                    s += q * x[b].q[e];
                }
                isum += (sc[j] - 32) * s;
            }
            acc = fmaf(h2f(d) * dx, (float)isum, acc);
            continue;
        }
        if (type == DT_IQ4_XS) {  /* d, scales_h, scales_l[4], qs[128] */
            const uint8_t *bw = (const uint8_t *)w + 136 * b;
            uint16_t d, sh;
            memcpy(&d, bw, 2);
            memcpy(&sh, bw + 2, 2);
            int isum = 0;
            for (int j = 0; j < 8; j++) {
                int ls = ((bw[4 + j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4;
                int s = 0;
                for (int e = 0; e < 32; e++)
                    s += iq4nl_levels[nib(bw + 8 + 16 * j, e)] * x[b].q[32 * j + e];
                isum += (ls - 32) * s;
            }
            acc = fmaf(h2f(d) * dx, (float)isum, acc);
            continue;
        }
        if (type == DT_Q6_K) {
            const struct block_q6_K *bw = (const struct block_q6_K *)w + b;
            int isum = 0;
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int e = 16 * j; e < 16 * j + 16; e++) {
                    int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
                    int lo = (bw->ql[64 * h + (k % 2) * 32 + l] >> (k / 2 * 4)) & 15;
                    int hi = (bw->qh[32 * h + l] >> (2 * k)) & 3;
                    s += ((lo | hi << 4) - 32) * x[b].q[e];
                }
                isum += bw->scales[j] * s;
            }
            acc = fmaf(h2f(bw->d) * dx, (float)isum, acc);
            continue;
        }
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t d, dmin;
        if (type == DT_Q4_K) {
            const struct block_q4_K *bw = (const struct block_q4_K *)w + b;
            scales = bw->scales, qs = bw->qs, d = bw->d, dmin = bw->dmin;
        } else {
            const struct block_q5_K *bw = (const struct block_q5_K *)w + b;
            scales = bw->scales, qs = bw->qs, qh = bw->qh, d = bw->d, dmin = bw->dmin;
        }
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, mn, s = 0, xs = 0;
            k4_sm(scales, j, &sc, &mn);
            for (int l = 0; l < 32; l++) {
                int wq = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                if (qh)
                    wq |= ((qh[l] >> j) & 1) << 4;
                s += wq * x[b].q[32 * j + l];
                xs += x[b].q[32 * j + l];
            }
            isum += sc * s;
            msum += mn * xs;
        }
        acc = fmaf(h2f(d) * dx, (float)isum, acc);
        acc = fmaf(-(h2f(dmin) * dx), (float)msum, acc);
    }
    return acc;
}

/* ---- products ---- */

enum { ROWS = 12, COLS = 2048, BATCH = 3 };

struct fixture {
    int type;
    size_t rb, ab;
    uint8_t *w;      /* ROWS quantized rows */
    float *wd;       /* dequantized weights */
    float *x;        /* BATCH activation rows */
    uint8_t *xq;     /* quantized activations, row b at xq + b*ab */
};

static void fixture_make(struct fixture *f, int type)
{
    f->type = type;
    f->rb = (size_t)dtype_row_bytes(type, COLS);
    f->ab = kern_act_row_bytes(type, COLS);
    f->w = malloc(f->rb * ROWS);
    f->wd = malloc(sizeof(float) * ROWS * COLS);
    f->x = malloc(sizeof(float) * BATCH * COLS);
    f->xq = malloc(f->ab * BATCH);
    float *row = malloc(sizeof(float) * COLS);
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < COLS; c++) {
            row[c] = (float)gauss() * 0.02f;
            if (test_rand_u64(&rng) % 500 == 0)
                row[c] *= 15.0f;
        }
        if (r == 3)
            for (int c = 0; c < COLS; c++)
                row[c] = 0.01f + fabsf(row[c]);  /* all positive: mins at their limit */
        kern_quantize_row(type, row, f->w + f->rb * r, COLS);
        kern_dequantize_row(type, f->w + f->rb * r, f->wd + (size_t)r * COLS, COLS);
    }
    for (int b = 0; b < BATCH; b++) {
        float *x = f->x + (size_t)b * COLS;
        for (int c = 0; c < COLS; c++)
            x[c] = (float)gauss() * (b == 1 ? 30.0f : 1.0f);
        if (b == 2)
            x[77] = 500.0f;  /* an activation outlier, as real models have */
        kern_act_quantize(type, x, f->xq + f->ab * b, COLS);
    }
    free(row);
}

static void fixture_free(struct fixture *f)
{
    free(f->w);
    free(f->wd);
    free(f->x);
    free(f->xq);
}

/* x as the product sees it: d*q per block, or the float row. */
static void act_dequant(const struct fixture *f, int b, double *out)
{
    const uint8_t *xq = f->xq + f->ab * b;
    int blk = act_block(f->type);
    for (int c = 0; c < COLS; c++) {
        if (blk == 1)
            out[c] = ((const float *)xq)[c];
        else if (blk == QK32)
            out[c] = (double)((const struct act_q8_32 *)xq)[c / 32].d * ((const struct act_q8_32 *)xq)[c / 32].q[c % 32];
        else
            out[c] = (double)((const struct act_q8_256 *)xq)[c / 256].d * ((const struct act_q8_256 *)xq)[c / 256].q[c % 256];
    }
}

/* Tolerances, relative to sum |w x| (tight: activations as quantized, so only float
 * rounding differs) and to |w|*|x| (loose: activations before quantization; the third
 * activation row carries a 500-sigma outlier that coarsens its block's scale). Measured
 * worst cases on this fixture: tight <= 2.8e-7 for every type; loose F32/F16/BF16
 * <= 1.6e-8, ACT_Q8_32 types <= 1.05e-3 (Q5_0), ACT_Q8_256 types <= 2.6e-3 (Q5_K). */
#define TOL_TIGHT 2e-6
#define TOL_LOOSE_F 1e-6
#define TOL_LOOSE_Q8_32 2.5e-3
#define TOL_LOOSE_Q8_256 5e-3

static void test_matmul_type(int type)
{
    struct fixture f;
    fixture_make(&f, type);
    const char *name = dtype_name(type);
    float y[BATCH * ROWS];
    const size_t ldy = ROWS;
    kern_matmul_ref(type, f.w, COLS, f.xq, f.ab, BATCH, y, ldy, 0, ROWS);

    double xd[COLS], worst_tight = 0.0, worst_loose = 0.0;
    int spec_bad = 0;
    for (int b = 0; b < BATCH; b++) {
        act_dequant(&f, b, xd);
        const float *x = f.x + (size_t)b * COLS;
        for (int r = 0; r < ROWS; r++) {
            const float *w = f.wd + (size_t)r * COLS;
            double t = 0.0, tabs = 0.0, l = 0.0, w2 = 0.0, x2 = 0.0;
            for (int c = 0; c < COLS; c++) {
                t += (double)w[c] * xd[c];
                tabs += fabs((double)w[c] * xd[c]);
                l += (double)w[c] * x[c];
                w2 += (double)w[c] * w[c];
                x2 += (double)x[c] * x[c];
            }
            double got = y[(size_t)b * ldy + (size_t)r];
            double et = fabs(got - t) / tabs, el = fabs(got - l) / sqrt(w2 * x2);
            if (et > worst_tight)
                worst_tight = et;
            if (el > worst_loose)
                worst_loose = el;
            float s = spec_dot(type, f.w + f.rb * r, f.xq + f.ab * b, COLS);
            if (fbits(s) != fbits((float)got) && spec_bad++ < 3)
                CHECK(0, "%s row %d batch %d: matmul_ref %a, kern.h transcription %a", name, r, b,
                      got, (double)s);
        }
    }
    double tol_loose = act_block(type) == 1 ? TOL_LOOSE_F : act_block(type) == QK32 ? TOL_LOOSE_Q8_32 : TOL_LOOSE_Q8_256;
    printf("%-5s matmul_ref error: vs quantized activations %.2e (tol %.0e), vs float activations %.2e (tol %.0e)\n",
           name, worst_tight, TOL_TIGHT, worst_loose, tol_loose);
    CHECK(worst_tight <= TOL_TIGHT, "%s: %g relative to sum |w x| exceeds %g", name, worst_tight, TOL_TIGHT);
    CHECK(worst_loose <= tol_loose, "%s: %g relative to |w||x| exceeds %g", name, worst_loose, tol_loose);
    CHECK(spec_bad == 0, "%s: %d outputs differ from the transcription of kern.h", name, spec_bad);

    /* the same outputs, bit for bit, one batch row and a few rows at a time, with
     * padded strides */
    size_t ldx2 = f.ab + 64, ldy2 = ROWS + 5;
    uint8_t *xq2 = calloc(BATCH, ldx2);
    float y2[BATCH * (ROWS + 5)];
    for (int b = 0; b < BATCH; b++)
        memcpy(xq2 + ldx2 * b, f.xq + f.ab * b, f.ab);
    for (int b = 0; b < BATCH; b++)
        for (int r0 = 0; r0 < ROWS; r0 += 5) {
            int r1 = r0 + 5 < ROWS ? r0 + 5 : ROWS;
            kern_matmul_ref(type, f.w, COLS, xq2 + ldx2 * b, ldx2, 1, y2 + ldy2 * b, ldy2, r0, r1);
        }
    int diff = 0;
    for (int b = 0; b < BATCH; b++)
        for (int r = 0; r < ROWS; r++)
            diff += fbits(y[(size_t)b * ldy + r]) != fbits(y2[ldy2 * b + r]);
    CHECK(diff == 0, "%s: %d outputs change with batch size or row split", name, diff);
    free(xq2);
    fixture_free(&f);
}

/* The float path sums 16 lanes and then a halving tree: 1e8 at element 0 and -1e8 at
 * element 8 cancel in the tree's first step, so the 1 at element 1 survives (a sequential
 * sum would return 0). */
static void test_lane_order(void)
{
    float w[32] = {0}, x[32], y = -1.0f;
    for (int i = 0; i < 32; i++)
        x[i] = 1.0f;
    w[0] = 1e8f, w[1] = 1.0f, w[8] = -1e8f;
    kern_matmul_ref(DT_F32, w, 32, x, 0, 1, &y, 1, 0, 1);
    CHECK(y == 1.0f, "lane order: got %g, want 1", y);
    /* element 16 shares lane 0 with element 0: 1e8 + 1 rounds to 1e8 in the lane */
    memset(w, 0, sizeof w);
    w[0] = 1e8f, w[16] = 1.0f, w[8] = -1e8f;
    kern_matmul_ref(DT_F32, w, 32, x, 0, 1, &y, 1, 0, 1);
    CHECK(y == 0.0f, "lane order: got %g, want 0", y);
}

/* A zero activation row gives exactly 0 for every type (no NaN from 0 * scale). */
static void test_zero_activations(void)
{
    for (int t = 0; t < NTYPES; t++) {
        int type = all_types[t];
        float x[QK_K] = {0}, w[QK_K];
        for (int i = 0; i < QK_K; i++)
            w[i] = (float)gauss();
        uint8_t wq[QK_K * 4], xq[QK_K * 4];
        kern_quantize_row(type, w, wq, QK_K);
        kern_act_quantize(type, x, xq, QK_K);
        float y = 1.0f;
        kern_matmul_ref(type, wq, QK_K, xq, 0, 1, &y, 1, 0, 1);
        CHECK(y == 0.0f, "%s: zero activations give %g", dtype_name(type), y);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_act_row_bytes);
    RUN(test_act_quantize);
    RUN(test_act_quantize_vs_ref);
    RUN(test_lane_order);
    RUN(test_zero_activations);
    for (int t = 0; t < NTYPES; t++)
        RUN(test_matmul_type, all_types[t]);
    return test_main_end();
}
