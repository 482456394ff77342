/* Conversions, dequantization and quantization of GGUF rows: half/bfloat16 against
 * independent references (and F16C where the CPU has it), every type's block layout
 * against hand-built blocks and against a decoder written here from ggml's bit fields,
 * quantization error bounds, determinism, and the error paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "kern/kern.h"
#include "kern/quant.h"
#include "testutil.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_F16C_TEST 1
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, 0);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}
#endif

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t rng = 0x5eed;

static double gauss(void)
{
    double u1 = ((double)(test_rand_u64(&rng) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = (double)(test_rand_u64(&rng) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- half precision ---- */

/* Value of a finite half, computed from its fields in double. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Reference f32 -> f16: the nearest half by search over the ordered positive halves,
 * ties to the even code, >= 65520 to inf, NaN to quiet NaN with the top payload bits. */
static uint16_t ref_f32_to_f16(float f)
{
    uint32_t u = fbits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    int lo = 0, hi = 0x7bff;  /* largest code with value <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (half_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo < 0x7bff) {
        double d0 = a - half_value((uint16_t)lo), d1 = half_value((uint16_t)(lo + 1)) - a;
        if (d1 < d0 || (d1 == d0 && (lo & 1)))
            lo++;
    }
    return (uint16_t)(sign | lo);
}

static void check_f16_one(float f, int *bad)
{
    uint16_t got = kern_f32_to_f16(f), want = ref_f32_to_f16(f);
    if (got != want && (*bad)++ < 5)
        CHECK(got == want, "f32_to_f16(%a bits %08x) = %04x, reference %04x", f, fbits(f), got, want);
#ifdef HAVE_F16C_TEST
    if (__builtin_cpu_supports("f16c")) {
        uint16_t hw = hw_f32_to_f16(f);
        if (got != hw && (*bad)++ < 5)
            CHECK(got == hw, "f32_to_f16(%08x) = %04x, F16C %04x", fbits(f), got, hw);
    }
#endif
}

static void test_f16(void)
{
    int bad = 0;
    /* every half: decodes to its value, round-trips (NaN: stays NaN, made quiet) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kern_f16_to_f32((uint16_t)h);
        uint16_t back = kern_f32_to_f16(f);
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        int ok;
        if (e == 31 && m) {
            ok = isnan(f) && back == (h | 0x200) && (fbits(f) >> 31) == (h >> 15);
        } else if (e == 31) {
            ok = isinf(f) && (f < 0) == (h >> 15) && back == h;
        } else {
            ok = (double)f == half_value((uint16_t)h) && back == h && (signbit(f) != 0) == (h >> 15);
        }
#ifdef HAVE_F16C_TEST
        if (__builtin_cpu_supports("f16c")) {
            float hw = hw_f16_to_f32((uint16_t)h);
            ok = ok && fbits(hw) == fbits(f);
        }
#endif
        if (!ok && bad++ < 5)
            CHECK(ok, "half %04x -> %a (bits %08x) -> %04x", h, f, fbits(f), back);
    }
    CHECK(bad == 0, "%d halves failed the decode/round trip", bad);

    /* random floats: any bit pattern, the half range, float subnormals */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        check_f16_one(bitsf((uint32_t)test_rand_u64(&rng)), &bad);
        int e = (int)(test_rand_u64(&rng) % 46) - 28;  /* 2^-28 .. 2^17 */
        float f = ldexpf(1.0f + (float)(test_rand_u64(&rng) & 0x7fffff) * 0x1.0p-23f, e);
        check_f16_one(i & 1 ? -f : f, &bad);
        check_f16_one(bitsf((uint32_t)test_rand_u64(&rng) & 0x807fffffu), &bad);
    }
    /* every tie between adjacent halves (exact in float), each side of it, and the
     * overflow threshold */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float mid = (float)((half_value((uint16_t)h) + half_value((uint16_t)(h + 1))) / 2);
        check_f16_one(mid, &bad);
        check_f16_one(-mid, &bad);
        check_f16_one(nextafterf(mid, 0.0f), &bad);
        check_f16_one(nextafterf(mid, INFINITY), &bad);
    }
    check_f16_one(65519.996f, &bad);
    check_f16_one(65520.0f, &bad);
    check_f16_one(0x1.0p-25f, &bad);
    check_f16_one(nextafterf(0x1.0p-25f, 1.0f), &bad);
    CHECK(bad == 0, "%d floats converted wrongly to half", bad);
    CHECK_EQ_INT(kern_f32_to_f16(65520.0f), 0x7c00);
    CHECK_EQ_INT(kern_f32_to_f16(65519.0f), 0x7bff);
    CHECK_EQ_INT(kern_f32_to_f16(-INFINITY), 0xfc00);
    CHECK_EQ_INT(kern_f32_to_f16(0x1.0p-24f), 0x0001);
    CHECK_EQ_INT(kern_f32_to_f16(0x1.0p-25f), 0x0000);        /* tie to even zero */
    CHECK_EQ_INT(kern_f32_to_f16(0x1.8p-24f), 0x0002);        /* tie to even 2 */
    CHECK_EQ_INT(kern_f32_to_f16(-0.0f), 0x8000);
    CHECK_EQ_INT(kern_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00); /* tie down to even */
    CHECK_EQ_INT(kern_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02); /* tie up to even */
#ifdef HAVE_F16C_TEST
    printf("f16: F16C comparison %s\n", __builtin_cpu_supports("f16c") ? "done" : "skipped (no F16C)");
#endif
}

/* Reference f32 -> bf16: the nearer of truncation and truncation + 1 ulp, ties even. */
static uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u = fbits(f);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    uint32_t t = u >> 16;
    double a = fabs((double)f), lo = fabs((double)bitsf(t << 16));
    double hi = (t & 0x7fff) == 0x7f7f ? ldexp(1.0, 128) : fabs((double)bitsf((t + 1) << 16));
    if (a - lo > hi - a || (a - lo == hi - a && (t & 1)))
        t++;
    return (uint16_t)t;
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kern_bf16_to_f32((uint16_t)h);
        int ok = fbits(f) == h << 16 && (kern_f32_to_bf16(f) == h || (isnan(f) && kern_f32_to_bf16(f) == (h | 0x40)));
        if (!ok && bad++ < 5)
            CHECK(ok, "bf16 %04x -> %08x -> %04x", h, fbits(f), kern_f32_to_bf16(f));
    }
    for (int i = 0; i < 300000; i++) {
        uint32_t u = (uint32_t)test_rand_u64(&rng);
        if (i % 3 == 1)
            u = (u & 0xffff0000u) | 0x8000u;  /* exact ties */
        float f = bitsf(u);
        uint16_t got = kern_f32_to_bf16(f), want = ref_f32_to_bf16(f);
        if (got != want && bad++ < 5)
            CHECK(got == want, "f32_to_bf16(%08x) = %04x, reference %04x", u, got, want);
    }
    CHECK(bad == 0, "%d bf16 conversions wrong", bad);
    CHECK_EQ_INT(kern_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80);  /* FLT_MAX rounds to inf */
    CHECK_EQ_INT(kern_f32_to_bf16(bitsf(0x7f800001u)) & 0x7fc0, 0x7fc0);  /* sNaN stays NaN */
}

/* ---- hand-built blocks ---- */

static void check_values(const char *what, const float *got, const float *want, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 4)
            CHECK(got[i] == want[i], "%s element %d: %g, want %g", what, i, got[i], want[i]);
    CHECK(bad == 0, "%s: %d elements wrong", what, bad);
}

static void test_hand_blocks(void)
{
    float y[QK_K], want[QK_K];

    /* Q4_0: d = 0.5; qs[0] = 0x1f: element 0 = (15-8)/2, element 16 = (1-8)/2 */
    struct block_q4_0 b40;
    b40.d = 0x3800;
    memset(b40.qs, 0x88, sizeof b40.qs);
    b40.qs[0] = 0x1f;
    b40.qs[3] = 0x80;  /* element 3 = -4, element 19 = 0 */
    for (int i = 0; i < 32; i++)
        want[i] = 0.0f;
    want[0] = 3.5f, want[16] = -3.5f, want[3] = -4.0f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q4_0, &b40, y, 32), 0);
    check_values("Q4_0", y, want, 32);

    /* Q4_1: d = 0.25, m = -1; qs[1] = 0x3a: element 1 = 10/4 - 1, element 17 = 3/4 - 1 */
    struct block_q4_1 b41;
    b41.d = 0x3400;
    b41.m = 0xbc00;
    memset(b41.qs, 0, sizeof b41.qs);
    b41.qs[1] = 0x3a;
    for (int i = 0; i < 32; i++)
        want[i] = -1.0f;
    want[1] = 1.5f, want[17] = -0.25f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q4_1, &b41, y, 32), 0);
    check_values("Q4_1", y, want, 32);

    /* Q5_0: d = 1; qh bit 2 (byte 0) and bit 20 (byte 2): element 2 = (3|16)-16,
     * element 18 = 5-16, element 4 = 0-16, element 20 = (7|16)-16; rest -16 */
    struct block_q5_0 b50;
    b50.d = 0x3c00;
    memset(b50.qs, 0, sizeof b50.qs);
    memset(b50.qh, 0, sizeof b50.qh);
    b50.qh[0] = 0x04;
    b50.qh[2] = 0x10;
    b50.qs[2] = 0x53;
    b50.qs[4] = 0x70;
    for (int i = 0; i < 32; i++)
        want[i] = -16.0f;
    want[2] = 3.0f, want[18] = -11.0f, want[4] = -16.0f, want[20] = 7.0f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q5_0, &b50, y, 32), 0);
    check_values("Q5_0", y, want, 32);

    /* Q5_1: d = 0.5, m = 1; qh bit 31 (byte 3, bit 7): element 31 = (0xf|16)/2 + 1 */
    struct block_q5_1 b51;
    b51.d = 0x3800;
    b51.m = 0x3c00;
    memset(b51.qs, 0, sizeof b51.qs);
    memset(b51.qh, 0, sizeof b51.qh);
    b51.qh[3] = 0x80;
    b51.qs[15] = 0xf2;  /* element 15 = 2/2 + 1, element 31 = 31/2 + 1 */
    for (int i = 0; i < 32; i++)
        want[i] = 1.0f;
    want[15] = 2.0f, want[31] = 16.5f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q5_1, &b51, y, 32), 0);
    check_values("Q5_1", y, want, 32);

    /* Q8_0: d = 0.125, qs[i] = i - 16 */
    struct block_q8_0 b80;
    b80.d = 0x3000;
    for (int i = 0; i < 32; i++) {
        b80.qs[i] = (int8_t)(i - 16);
        want[i] = (float)(i - 16) / 8.0f;
    }
    CHECK_EQ_INT(kern_dequantize_row(DT_Q8_0, &b80, y, 32), 0);
    check_values("Q8_0", y, want, 32);

    /* Q4_K: d = 1, dmin = 0.5; sub-block 0: sc 1, m 2 (bytes 0 and 4); sub-block 5:
     * sc 37 = 0b100101, m 50 = 0b110010: byte 9 = 0x25 (low nibbles), top bits in
     * byte 1 bits 6-7 (sc: 2) and byte 5 bits 6-7 (m: 3). Element 0 = low nibble of
     * qs[0] = 7 -> 7 - 1 = 6; element 163 (sub-block 5, high nibble of qs[67]) = 9 ->
     * 37*9 - 25 = 308. Other elements of sub-block 0: -1, of 5: -25, others 0. */
    struct block_q4_K b4k;
    memset(&b4k, 0, sizeof b4k);
    b4k.d = 0x3c00;
    b4k.dmin = 0x3800;
    b4k.scales[0] = 1;
    b4k.scales[4] = 2;
    b4k.scales[9] = 0x25;
    b4k.scales[1] = 0x80;
    b4k.scales[5] = 0xc0;
    b4k.qs[0] = 0x07;
    b4k.qs[67] = 0x90;
    for (int i = 0; i < QK_K; i++)
        want[i] = i < 32 ? -1.0f : (i >= 160 && i < 192) ? -25.0f : 0.0f;
    want[0] = 6.0f, want[163] = 308.0f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q4_K, &b4k, y, QK_K), 0);
    check_values("Q4_K", y, want, QK_K);

    /* Q5_K: same scales; element 163 also has qh[3] bit 5 -> q = 25 -> 37*25 - 25 = 900;
     * element 2 has qh[2] bit 0 -> q = 16 -> 16 - 1 = 15 */
    struct block_q5_K b5k;
    memset(&b5k, 0, sizeof b5k);
    b5k.d = 0x3c00;
    b5k.dmin = 0x3800;
    memcpy(b5k.scales, b4k.scales, 12);
    memcpy(b5k.qs, b4k.qs, sizeof b5k.qs);
    b5k.qh[3] = 0x20;
    b5k.qh[2] = 0x01;
    want[163] = 900.0f, want[2] = 15.0f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q5_K, &b5k, y, QK_K), 0);
    check_values("Q5_K", y, want, QK_K);

    /* Q6_K: d = 0.5, scales[j] = j - 8. Element 197 (half 1, quarter 2, l 5): low bits
     * in the high nibble of ql[69] = 0xa, high bits at bits 4-5 of qh[37] = 2 -> q = 42,
     * scale 12-8 = 4 -> 0.5*4*10 = 20. Element 40 (half 0, quarter 1, l 8): low nibble
     * of ql[40] = 3, bits 2-3 of qh[8] = 1 -> q = 19 -> 0.5*(-6)*(-13) = 39. All other
     * elements q = 0 -> 0.5*(j-8)*(-32). */
    struct block_q6_K b6k;
    memset(&b6k, 0, sizeof b6k);
    b6k.d = 0x3800;
    for (int j = 0; j < 16; j++)
        b6k.scales[j] = (int8_t)(j - 8);
    b6k.ql[69] = 0xa0;
    b6k.qh[37] = 0x20;
    b6k.ql[40] = 0x03;
    b6k.qh[8] = 0x04;
    for (int i = 0; i < QK_K; i++)
        want[i] = -16.0f * (float)(i / 16 - 8);
    want[197] = 20.0f, want[40] = 39.0f;
    CHECK_EQ_INT(kern_dequantize_row(DT_Q6_K, &b6k, y, QK_K), 0);
    check_values("Q6_K", y, want, QK_K);

    /* float types */
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    float hw[4] = {1.0f, -2.0f, 0x1.0p-24f, 65504.0f};
    CHECK_EQ_INT(kern_dequantize_row(DT_F16, h, y, 4), 0);
    check_values("F16", y, hw, 4);
    uint16_t bh[3] = {0x3f80, 0xc040, 0x4049};
    float bw[3] = {1.0f, -3.0f, 3.140625f};
    CHECK_EQ_INT(kern_dequantize_row(DT_BF16, bh, y, 3), 0);
    check_values("BF16", y, bw, 3);
}

/* ---- an independent decoder (double precision, straight from ggml's bit fields) ---- */

static double h2d(uint16_t h)
{
    return half_value(h);  /* scales are finite */
}

/* Q4_K in ggml's loop shape: chunks of 64 with sub-blocks is, is+1. */
static void decode_q4_k(const struct block_q4_K *b, double *y)
{
    double d = h2d(b->d), dmin = h2d(b->dmin);
    int is = 0;
    const uint8_t *q = b->qs;
    for (int j = 0; j < QK_K; j += 64, q += 32, is += 2) {
        int sc[2], mn[2];
        for (int t = 0; t < 2; t++) {
            int k = is + t;
            if (k < 4) {
                sc[t] = b->scales[k] & 63;
                mn[t] = b->scales[k + 4] & 63;
            } else {
                sc[t] = (b->scales[k + 4] & 0xf) | ((b->scales[k - 4] >> 6) << 4);
                mn[t] = (b->scales[k + 4] >> 4) | ((b->scales[k] >> 6) << 4);
            }
        }
        for (int l = 0; l < 32; l++) {
            y[j + l] = d * sc[0] * (q[l] & 0xf) - dmin * mn[0];
            y[j + 32 + l] = d * sc[1] * (q[l] >> 4) - dmin * mn[1];
        }
    }
}

/* Q6_K in ggml's loop shape: two halves, four quarters from ql/qh. */
static void decode_q6_k(const struct block_q6_K *b, double *y)
{
    double d = h2d(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
}

static void decode_q8_0(const struct block_q8_0 *b, double *y)
{
    for (int i = 0; i < 32; i++)
        y[i] = h2d(b->d) * b->qs[i];
}

/* Quantizes random rows, decodes them here and compares with kern_dequantize_row. */
static void test_independent_decode(void)
{
    enum { N = 4096 };
    static float x[N], y[N];
    static double ref[N];
    static uint8_t q[N * 2];
    int types[] = {DT_Q4_K, DT_Q6_K, DT_Q8_0};
    for (int t = 0; t < 3; t++) {
        int type = types[t];
        for (int i = 0; i < N; i++)
            x[i] = (float)(gauss() * 0.02);
        CHECK_EQ_INT(kern_quantize_row(type, x, q, N), 0);
        CHECK_EQ_INT(kern_dequantize_row(type, q, y, N), 0);
        const struct dtype_info *info = dtype_info(type);
        for (int b = 0; b < N / info->block_elems; b++) {
            const void *blk = q + (size_t)b * (size_t)info->block_bytes;
            double *r = ref + b * info->block_elems;
            if (type == DT_Q4_K)
                decode_q4_k(blk, r);
            else if (type == DT_Q6_K)
                decode_q6_k(blk, r);
            else
                decode_q8_0(blk, r);
        }
        /* our float formulas round each product once or twice */
        double worst = 0.0;
        for (int i = 0; i < N; i++) {
            double tol = 1e-6 * (fabs(ref[i]) + 0.1);
            double e = fabs((double)y[i] - ref[i]) / tol;
            if (e > worst)
                worst = e;
        }
        CHECK(worst <= 1.0, "%s: dequantized values differ from the bit-field decode by %g x tol",
              info->name, worst);
    }
}

/* ---- quantization error ---- */

struct qbound {
    int type;
    double gauss;     /* bound on RMS(error)/RMS(x) for gaussian rows */
    double outliers;  /* same with 0.5% of values x 20 */
};

/* Measured on 256k values each (this code, seed 0x5eed), gaussian / with outliers:
 *   Q4_0 .0860/.1403  Q4_1 .0782/.1044  Q5_0 .0427/.0820  Q5_1 .0377/.0498
 *   Q8_0 .0054/.0105  Q4_K .0718/.0967  Q5_K .0359/.0482  Q6_K .0179/.0307
 *   F16 .00021/.00020 BF16 .00165/.00164
 *   Q2_K .2746/.2443  Q3_K .1517/.1546  IQ4_NL .0747/.1144  IQ4_XS .0754/.1165
 *   MXFP4 .1110/.1504 (simple quantizers: a scale search per sub-block, no imatrix)
 * The bounds leave about 12% margin. */
static const struct qbound bounds[] = {
    {DT_Q4_0, 0.097, 0.16},  {DT_Q4_1, 0.088, 0.12},   {DT_Q5_0, 0.048, 0.092},
    {DT_Q5_1, 0.043, 0.056}, {DT_Q8_0, 0.006, 0.012},  {DT_Q4_K, 0.080, 0.11},
    {DT_Q5_K, 0.040, 0.055}, {DT_Q6_K, 0.020, 0.035},  {DT_F16, 0.00025, 0.00025},
    {DT_BF16, 0.0019, 0.0019},
    {DT_Q2_K, 0.31, 0.28},   {DT_Q3_K, 0.17, 0.175},   {DT_IQ4_NL, 0.084, 0.13},
    {DT_IQ4_XS, 0.085, 0.13}, {DT_MXFP4, 0.125, 0.17},
};

static double rel_rms_error(int type, const float *x, float *y, void *q, int64_t n)
{
    if (kern_quantize_row(type, x, q, n) || kern_dequantize_row(type, q, y, n))
        return INFINITY;
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_quantize_error(void)
{
    enum { N = 1 << 18 };
    float *xg = malloc(N * sizeof(float)), *xo = malloc(N * sizeof(float));
    float *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * sizeof(float)), *q2 = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        xg[i] = (float)(gauss() * 0.02);
        xo[i] = (test_rand_u64(&rng) % 200 == 0) ? xg[i] * 20.0f : xg[i];
    }
    for (size_t t = 0; t < sizeof bounds / sizeof *bounds; t++) {
        const struct qbound *b = &bounds[t];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        double eg = rel_rms_error(b->type, xg, y, q, N);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double eo = rel_rms_error(b->type, xo, y, q, N);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%-5s rel RMS error gaussian %.5f (bound %.4f), outliers %.5f (bound %.4f); "
               "quantize+dequantize %.0f M values/s\n",
               dtype_name(b->type), eg, b->gauss, eo, b->outliers, (double)N / sec / 1e6);
        CHECK(eg < b->gauss, "%s gaussian error %g >= %g", dtype_name(b->type), eg, b->gauss);
        CHECK(eo < b->outliers, "%s outlier error %g >= %g", dtype_name(b->type), eo, b->outliers);

        /* deterministic: same bytes again */
        int64_t rb = dtype_row_bytes(b->type, N);
        kern_quantize_row(b->type, xo, q, N);
        kern_quantize_row(b->type, xo, q2, N);
        CHECK(memcmp(q, q2, (size_t)rb) == 0, "%s quantization not deterministic", dtype_name(b->type));

        /* zeros stay exactly zero */
        float z[256] = {0}, zy[256];
        memset(zy, 0x7f, sizeof zy);
        CHECK_EQ_INT(kern_quantize_row(b->type, z, q, 256), 0);
        CHECK_EQ_INT(kern_dequantize_row(b->type, q, zy, 256), 0);
        int nz = 0;
        for (int i = 0; i < 256; i++)
            nz += zy[i] != 0.0f;
        CHECK(nz == 0, "%s: %d of 256 zeros came back non-zero", dtype_name(b->type), nz);

        /* a block whose values are all equal and one of each sign of a large value */
        float c[256];
        for (int i = 0; i < 256; i++)
            c[i] = (i % 7 == 3) ? -1.5f : 0.25f;
        c[100] = 40.0f;
        double ec = rel_rms_error(b->type, c, zy, q, 256);
        CHECK(ec < 4.0 * b->outliers + 0.02, "%s spiky block error %g", dtype_name(b->type), ec);
    }
    free(xg);
    free(xo);
    free(y);
    free(q);
    free(q2);
}

/* Q8_0 follows ggml exactly: d = amax/127 and q = round(x/d) half away from zero. */
static void test_q8_0_formula(void)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) * 0.5f;  /* amax 8 at element 0 */
    struct block_q8_0 b;
    kern_quantize_row(DT_Q8_0, x, &b, 32);
    CHECK_EQ_INT(b.d, kern_f32_to_f16(8.0f / 127.0f));
    CHECK_EQ_INT(b.qs[0], -127);
    CHECK_EQ_INT(b.qs[16], 0);
    CHECK_EQ_INT(b.qs[31], (int)roundf(7.5f * (127.0f / 8.0f)));
    /* Q4_0: d = max / -8 with the sign of the largest magnitude */
    x[0] = -10.0f;
    struct block_q4_0 b4;
    kern_quantize_row(DT_Q4_0, x, &b4, 32);
    CHECK_EQ_INT(b4.d, kern_f32_to_f16(10.0f / 8.0f));
    CHECK_EQ_INT(b4.qs[0] & 0xf, 0);  /* -10 / 1.25 + 8 = 0 */
}

static void test_errors(void)
{
    float x[64] = {0}, y[64];
    uint8_t q[512] = {0};
    CHECK_EQ_INT(kern_dequantize_row(DT_IQ2_XXS, q, y, 256), CAIRN_EUNSUPPORTED);
    CHECK_EQ_INT(kern_dequantize_row(DT_TQ1_0, q, y, 256), CAIRN_EUNSUPPORTED);
    CHECK_EQ_INT(kern_dequantize_row(999, q, y, 32), CAIRN_EUNSUPPORTED);
    CHECK_EQ_INT(kern_dequantize_row(DT_Q4_0, q, y, 33), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_dequantize_row(DT_Q4_K, q, y, 64), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_dequantize_row(DT_F32, q, y, -1), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_quantize_row(DT_IQ3_S, x, q, 256), CAIRN_EUNSUPPORTED);
    CHECK_EQ_INT(kern_dequantize_row(DT_Q2_K, q, y, 64), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_quantize_row(DT_IQ4_XS, x, q, 32), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_quantize_row(-1, x, q, 32), CAIRN_EUNSUPPORTED);
    CHECK_EQ_INT(kern_quantize_row(DT_Q8_0, x, q, 48), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_quantize_row(DT_Q6_K, x, q, 64), CAIRN_EINVAL);
    CHECK_EQ_INT(kern_quantize_row(DT_F16, x, q, 0), 0);

    /* non-finite input does not crash and gives well-formed blocks */
    float bad[256];
    for (int i = 0; i < 256; i++)
        bad[i] = (float)i * 0.01f;
    bad[5] = NAN;
    bad[77] = INFINITY;
    bad[200] = -INFINITY;
    int types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                   DT_Q2_K, DT_Q3_K, DT_IQ4_NL, DT_IQ4_XS, DT_MXFP4};
    for (int t = 0; t < 13; t++)
        CHECK_EQ_INT(kern_quantize_row(types[t], bad, q, 256), 0);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_f16);
    RUN(test_bf16);
    RUN(test_hand_blocks);
    RUN(test_independent_decode);
    RUN(test_q8_0_formula);
    RUN(test_quantize_error);
    RUN(test_errors);
    return test_main_end();
}
