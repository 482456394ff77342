/* Quantization of float rows to GGUF's block types. The legacy types follow ggml's
 * formulas; the K-quants fit each sub-block's scale (and min) by a bounded search that
 * minimizes weighted squared error, then quantize those to 6 or 8 bits and pick every
 * element's quant again for the stored scales. Everything is scalar and sums run in a
 * fixed lane order, so results are identical for any build and machine. */
#include "kern/kern.h"
#include "kern/convert.h"
#include "kern/quant.h"

#include <math.h>
#include <string.h>

#include "base/err.h"

/* Round to nearest even for |v| < 2^22 (callers clamp first): adding 1.5 * 2^23 leaves
 * no fraction bits, so the float addition does the rounding. */
static inline float rne(float v)
{
    return (v + 12582912.0f) - 12582912.0f;
}

/* v clamped to [lo, hi] then rounded to nearest even, as int; NaN gives lo. */
static inline int quant_clamp(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (v > (float)hi)
        return hi;
    return (int)rne(v);
}

/* (int)v truncated toward zero as ggml's (int8_t) casts do, clamped to [lo, hi]. */
static inline int trunc_clamp(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)v;
}

/* ---- legacy types, per ggml ---- */

/* Value of largest magnitude (its sign kept; the first one on ties). */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

static void store_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

void kern_quant_q4_0(const float *x, void *dst, int64_t nb)
{
    struct block_q4_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float d = signed_absmax(x, QK32) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = kern_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp(x[j] * id + 8.5f, 0, 15);
            int q1 = trunc_clamp(x[j + 16] * id + 8.5f, 0, 15);
            y->qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void kern_quant_q4_1(const float *x, void *dst, int64_t nb)
{
    struct block_q4_1 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float mn, mx;
        min_max(x, QK32, &mn, &mx);
        float d = (mx - mn) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = kern_f32_to_f16(d);
        y->m = kern_f32_to_f16(mn);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 0, 15);
            int q1 = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 0, 15);
            y->qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void kern_quant_q5_0(const float *x, void *dst, int64_t nb)
{
    struct block_q5_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float d = signed_absmax(x, QK32) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = kern_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp(x[j] * id + 16.5f, 0, 31);
            int q1 = trunc_clamp(x[j + 16] * id + 16.5f, 0, 31);
            y->qs[j] = (uint8_t)((q0 & 0xf) | (q1 & 0xf) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y->qh, qh);
    }
}

void kern_quant_q5_1(const float *x, void *dst, int64_t nb)
{
    struct block_q5_1 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float mn, mx;
        min_max(x, QK32, &mn, &mx);
        float d = (mx - mn) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = kern_f32_to_f16(d);
        y->m = kern_f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 0, 31);
            int q1 = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 0, 31);
            y->qs[j] = (uint8_t)((q0 & 0xf) | (q1 & 0xf) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y->qh, qh);
    }
}

void kern_quant_q8_0(const float *x, void *dst, int64_t nb)
{
    struct block_q8_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float amax = 0.0f;
        for (int j = 0; j < QK32; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = kern_f32_to_f16(d);
        for (int j = 0; j < QK32; j++) {
            float v = roundf(x[j] * id);  /* half away from zero, as ggml */
            y->qs[j] = (int8_t)(!(v > -127.0f) ? -127 : v > 127.0f ? 127 : (int)v);
        }
    }
}

/* ---- K-quants ---- */

/* The searches below run on 4-lane vectors (GCC/Clang vector extensions, lowered to
 * whatever the target has): element i feeds lane i%4 and lanes are summed 0+1+2+3, a
 * fixed order, so the result does not depend on how the compiler maps them. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v4f v4_abs(v4f a)
{
    return (v4f)((v4i)a & 0x7fffffff);
}

static inline v4f v4_rne(v4f v)  /* as rne() per lane */
{
    return (v + 12582912.0f) - 12582912.0f;
}

/* min and max of integer-valued lanes of magnitude < 2^22, where these formulas are
 * exact; branch-free. */
static inline v4f v4_min_int(v4f a, v4f b)
{
    return 0.5f * (a + b - v4_abs(a - b));
}

static inline v4f v4_max_int(v4f a, v4f b)
{
    return 0.5f * (a + b + v4_abs(a - b));
}

static inline float v4_sum(v4f v)
{
    return ((v[0] + v[1]) + v[2]) + v[3];
}

/* Fits x[0..n-1] (n = 16 or 32) ~ s*l + m with l in 0..nmax and m <= 0, minimizing
 * sum w*(s*l + m - x)^2.
 * Candidate quantizations come from ncand inverse scales (nmax + r0 + c*rstep) / range;
 * for each, (s, m) is the weighted least-squares fit, and the error follows from the
 * sums without a second pass: E = sum w x^2 - s*sum w l x - m*sum w x. Returns s >= 0
 * and the magnitude of m. */
static void fit_scale_min(const float *x, const float *w, int n, int nmax, int ncand, float r0,
                          float rstep, float *s_out, float *m_out)
{
    float lo = 0.0f, hi = x[0], sw = 0.0f, sx = 0.0f;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (!(hi > lo)) {  /* constant block (or NaN): the min carries it */
        *s_out = 0.0f;
        *m_out = lo == lo ? -lo : 0.0f;
        return;
    }
    v4f vx[8], vw[8], vwx[8];
    for (int i = 0; i < n / 4; i++) {
        vx[i] = v4_load(x + 4 * i) - lo;
        vw[i] = v4_load(w + 4 * i);
        vwx[i] = vw[i] * v4_load(x + 4 * i);
    }
    float fmax = (float)nmax;
    v4f vmax = {fmax, fmax, fmax, fmax};
    float best = -INFINITY, bs = (hi - lo) / fmax, bm = lo;
    for (int c = 0; c < ncand; c++) {
        float is = (fmax + r0 + rstep * (float)c) / (hi - lo);
        v4f al = {0}, al2 = {0}, axl = {0};
        for (int i = 0; i < n / 4; i++) {
            v4f l = v4_min_int(v4_rne(is * vx[i]), vmax);  /* >= 0 as x >= lo */
            v4f wl = vw[i] * l;
            al += wl;
            al2 += wl * l;
            axl += vwx[i] * l;
        }
        float sl = v4_sum(al), sl2 = v4_sum(al2), sxl = v4_sum(axl);
        float D = sw * sl2 - sl * sl;
        if (!(D > 0.0f))
            continue;
        float s = (sw * sxl - sx * sl) / D;
        float m = (sl2 * sx - sl * sxl) / D;
        if (m > 0.0f) {
            m = 0.0f;
            s = sxl / sl2;
        }
        float score = s * sxl + m * sx;  /* larger is better: E = sum w x^2 - score */
        if (score > best && s > 0.0f) {
            best = score;
            bs = s;
            bm = m;
        }
    }
    *s_out = bs;
    *m_out = -bm;
}

/* Sub-block scales and mins of a Q4_K/Q5_K block: fits, then 6-bit quantization against
 * the half-precision super-scales d and dmin. Writes d, dmin and scales[12]. */
static void k4_scales(const float *x, int nmax, int ncand, float r0, float rstep, uint16_t *d,
                      uint16_t *dmin, uint8_t *scales)
{
    float s[8], m[8], w[32];
    float max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float sum2 = 0.0f;
        for (int i = 0; i < 32; i++)
            sum2 += xj[i] * xj[i];
        float av = sqrtf(sum2 / 32.0f);
        for (int i = 0; i < 32; i++)
            w[i] = av + fabsf(xj[i]);  /* favours large values without ignoring small ones */
        fit_scale_min(xj, w, 32, nmax, ncand, r0, rstep, &s[j], &m[j]);
        if (s[j] > max_s)
            max_s = s[j];
        if (m[j] > max_m)
            max_m = m[j];
    }
    *d = kern_f32_to_f16(max_s / 63.0f);
    *dmin = kern_f32_to_f16(max_m / 63.0f);
    float dq = kern_f16_to_f32(*d), mq = kern_f16_to_f32(*dmin);
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = dq > 0.0f ? quant_clamp(s[j] / dq, 0, 63) : 0;
        int lm = mq > 0.0f ? quant_clamp(m[j] / mq, 0, 63) : 0;
        if (j < 4) {
            scales[j] |= (uint8_t)ls;
            scales[j + 4] |= (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
}

/* Quants 0..nmax of one Q4_K/Q5_K block for its stored scales: L[e] = round((x + m)/d). */
static void k4_quants(const float *x, int nmax, uint16_t d, uint16_t dmin,
                      const uint8_t *scales, uint8_t *L)
{
    float dq = kern_f16_to_f32(d), mq = kern_f16_to_f32(dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        kern_k4_scale_min(j, scales, &sc, &mn);
        float dj = dq * (float)sc, mj = mq * (float)mn;
        for (int i = 32 * j; i < 32 * j + 32; i++)
            L[i] = dj != 0.0f ? (uint8_t)quant_clamp((x[i] + mj) / dj, 0, nmax) : 0;
    }
}

/* Search grids, each a bounded number of candidates per sub-block (speed: see the test). */
#define Q4K_NCAND 11
#define Q4K_R0 (-1.0f)
#define Q4K_RSTEP 0.2f
#define Q5K_NCAND 11
#define Q5K_R0 (-1.0f)
#define Q5K_RSTEP 0.2f

void kern_quant_q4_k(const float *x, void *dst, int64_t nb)
{
    struct block_q4_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        k4_scales(x, 15, Q4K_NCAND, Q4K_R0, Q4K_RSTEP, &y->d, &y->dmin, y->scales);
        k4_quants(x, 15, y->d, y->dmin, y->scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
}

void kern_quant_q5_k(const float *x, void *dst, int64_t nb)
{
    struct block_q5_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        k4_scales(x, 31, Q5K_NCAND, Q5K_R0, Q5K_RSTEP, &y->d, &y->dmin, y->scales);
        k4_quants(x, 31, y->d, y->dmin, y->scales, L);
        memset(y->qh, 0, sizeof y->qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int a = L[64 * c + l], b = L[64 * c + 32 + l];
                y->qs[32 * c + l] = (uint8_t)((a & 0xf) | (b & 0xf) << 4);
                y->qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
            }
    }
}

/* Fits x[0..15] ~ s*l with l in -nneg..nneg-1 (32 for Q6_K, 4 for Q3_K), weights x^2,
 * over inverse scales -(nneg + 0.1c)/max for c in -ncand..ncand (max the signed value of
 * largest magnitude, so it lands on the extra level -nneg). Returns s (its sign opposite
 * to max). */
#define Q6K_HALF_RANGE 6

static float fit_scale_sym(const float *x, int nneg)
{
    float max = signed_absmax(x, 16);
    if (!(fabsf(max) > 1e-15f))
        return 0.0f;
    v4f vx[4], vw[4], vwx[4];
    const float fn = (float)nneg;
    const v4f hi = {fn - 1.0f, fn - 1.0f, fn - 1.0f, fn - 1.0f}, lo = {-fn, -fn, -fn, -fn};
    for (int i = 0; i < 4; i++) {
        vx[i] = v4_load(x + 4 * i);
        vw[i] = vx[i] * vx[i];
        vwx[i] = vw[i] * vx[i];
    }
    float bs = 0.0f, best = -1.0f;
    for (int c = -Q6K_HALF_RANGE; c <= Q6K_HALF_RANGE; c++) {
        float is = -(fn + 0.1f * (float)c) / max;
        v4f alx = {0}, al2 = {0};
        for (int i = 0; i < 4; i++) {
            v4f l = v4_max_int(v4_min_int(v4_rne(is * vx[i]), hi), lo);
            alx += vwx[i] * l;
            al2 += vw[i] * l * l;
        }
        float slx = v4_sum(alx), sl2 = v4_sum(al2);
        if (!(sl2 > 0.0f))
            continue;
        float score = slx * slx / sl2;  /* error = sum w x^2 - score */
        if (score > best) {
            best = score;
            bs = slx / sl2;
        }
    }
    return bs;
}

void kern_quant_q6_k(const float *x, void *dst, int64_t nb)
{
    struct block_q6_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        float s[16], max_s = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_scale_sym(x + 16 * j, 32);
            if (fabsf(s[j]) > fabsf(max_s))
                max_s = s[j];
        }
        y->d = kern_f32_to_f16(max_s / -128.0f);
        float dq = kern_f16_to_f32(y->d);
        for (int j = 0; j < 16; j++) {
            int sc = dq != 0.0f ? quant_clamp(s[j] / dq, -128, 127) : 0;
            y->scales[j] = (int8_t)sc;
            float dj = dq * (float)sc;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                L[e] = (uint8_t)(dj != 0.0f ? quant_clamp(x[e] / dj, -32, 31) + 32 : 32);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                y->ql[64 * h + l] = (uint8_t)((Lh[l] & 0xf) | (Lh[l + 64] & 0xf) << 4);
                y->ql[64 * h + 32 + l] = (uint8_t)((Lh[l + 32] & 0xf) | (Lh[l + 96] & 0xf) << 4);
                y->qh[32 * h + l] = (uint8_t)((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 |
                                              (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
            }
        }
    }
}

/* ---- Q2_K, Q3_K: 16 sub-blocks of 16 ---- */

#define Q2K_NCAND 15
#define Q2K_R0 (-0.5f)
#define Q2K_RSTEP 0.1f

/* Q2_K: each sub-block fit as s*q - m (q 0..3) by the search of Q4_K, then scales and
 * mins quantized to 4 bits against d = max s / 15 and dmin = max m / 15, and every
 * element's quant picked again for the stored values. */
void kern_quant_q2_k(const float *x, void *dst, int64_t nb)
{
    struct block_q2_K *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        float s[16], m[16], w[16], max_s = 0.0f, max_m = 0.0f;
        for (int j = 0; j < 16; j++) {
            const float *xj = x + 16 * j;
            float sum2 = 0.0f;
            for (int e = 0; e < 16; e++)
                sum2 += xj[e] * xj[e];
            float av = sqrtf(sum2 / 16.0f);
            for (int e = 0; e < 16; e++)
                w[e] = av + fabsf(xj[e]);
            fit_scale_min(xj, w, 16, 3, Q2K_NCAND, Q2K_R0, Q2K_RSTEP, &s[j], &m[j]);
            if (s[j] > max_s)
                max_s = s[j];
            if (m[j] > max_m)
                max_m = m[j];
        }
        y->d = kern_f32_to_f16(max_s / 15.0f);
        y->dmin = kern_f32_to_f16(max_m / 15.0f);
        float dq = kern_f16_to_f32(y->d), mq = kern_f16_to_f32(y->dmin);
        memset(y->qs, 0, sizeof y->qs);
        for (int j = 0; j < 16; j++) {
            int ls = dq > 0.0f ? quant_clamp(s[j] / dq, 0, 15) : 0;
            int lm = mq > 0.0f ? quant_clamp(m[j] / mq, 0, 15) : 0;
            y->scales[j] = (uint8_t)(ls | lm << 4);
            float dj = dq * (float)ls, mj = mq * (float)lm;
            for (int e = 16 * j; e < 16 * j + 16; e++) {
                int q = dj != 0.0f ? quant_clamp((x[e] + mj) / dj, 0, 3) : 0;
                y->qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e / 32) & 3)));
            }
        }
    }
}

/* Q3_K: each sub-block fit as s*l (l -4..3) by the search of Q6_K, scales quantized to
 * 6 bits (factor -32..31) against d = -(the largest s)/32, quants picked again. */
void kern_quant_q3_k(const float *x, void *dst, int64_t nb)
{
    struct block_q3_K *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        float s[16], max_s = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_scale_sym(x + 16 * j, 4);
            if (fabsf(s[j]) > fabsf(max_s))
                max_s = s[j];
        }
        y->d = kern_f32_to_f16(max_s / -32.0f);
        float dq = kern_f16_to_f32(y->d);
        memset(y->qs, 0, sizeof y->qs);
        memset(y->hmask, 0, sizeof y->hmask);
        memset(y->scales, 0, sizeof y->scales);
        for (int j = 0; j < 16; j++) {
            int sc = dq != 0.0f ? quant_clamp(s[j] / dq, -32, 31) : 0;
            int u = sc + 32;
            y->scales[j % 8] |= (uint8_t)((u & 0xf) << (4 * (j / 8)));
            y->scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            float dj = dq * (float)sc;
            for (int e = 16 * j; e < 16 * j + 16; e++) {
                int q = (dj != 0.0f ? quant_clamp(x[e] / dj, -4, 3) : 0) + 4;
                y->qs[32 * (e / 128) + e % 32] |= (uint8_t)((q & 3) << (2 * ((e / 32) & 3)));
                y->hmask[e % 32] |= (uint8_t)((q >> 2) << (e / 32));
            }
        }
    }
}

/* ---- non-linear 4-bit levels: IQ4_NL, IQ4_XS, MXFP4 ---- */

/* Nearest level of kv[16] (ascending, within -128..127) by half-unit buckets: every
 * midpoint between neighbours is a multiple of 0.5, so no bucket straddles one. */
struct level_map {
    uint8_t idx[512]; /* bucket floor(2v) + 256 -> index */
};

static void level_map_init(const int8_t *kv, struct level_map *m)
{
    for (int b = 0; b < 512; b++) {
        float v = ((float)(b - 256) + 0.5f) * 0.5f; /* bucket centre */
        int k = 0;
        for (int i = 0; i < 15; i++)
            k += v > 0.5f * (float)(kv[i] + kv[i + 1]);
        m->idx[b] = (uint8_t)k;
    }
}

/* Index of the level nearest to v (NaN and values out of range clamp to an end). */
static inline int nearest_level(const struct level_map *m, float v)
{
    float t = 2.0f * v;
    t = !(t > -256.0f) ? -256.0f : t > 255.0f ? 255.0f : t;
    return m->idx[(int)floorf(t) + 256];
}

/* Fits x[0..n-1] ~ s*kv[l] minimizing squared error: for a few trial scales that put the
 * value of largest magnitude on or near the end level kv[0] = -127, each element takes
 * its nearest level and s is then the least-squares scale for those levels. Returns the
 * best s. */
static float fit_scale_levels(const float *x, int n, const int8_t *kv, const struct level_map *mid)
{
    float max = signed_absmax(x, n);
    if (!(fabsf(max) > 1e-30f))
        return 0.0f;
    float best = -1.0f, bs = 0.0f;
    for (int c = -3; c <= 3; c++) {
        float inv = (float)kv[0] * (1.0f + 0.03f * (float)c) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            float l = (float)kv[nearest_level(mid, x[i] * inv)];
            sxl += x[i] * l;
            sl2 += l * l;
        }
        if (!(sl2 > 0.0f))
            continue;
        float score = sxl * sxl / sl2;  /* error = sum x^2 - score */
        if (score > best) {
            best = score;
            bs = sxl / sl2;
        }
    }
    return bs;
}

void kern_quant_iq4_nl(const float *x, void *dst, int64_t nb)
{
    struct block_iq4_nl *y = dst;
    struct level_map map;
    level_map_init(kern_iq4nl_values, &map);
    const struct level_map *mid = &map;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        y->d = kern_f32_to_f16(fit_scale_levels(x, QK32, kern_iq4nl_values, mid));
        float d = kern_f16_to_f32(y->d);
        for (int j = 0; j < 16; j++) {
            int lo = d != 0.0f ? nearest_level(mid, x[j] / d) : 8;
            int hi = d != 0.0f ? nearest_level(mid, x[j + 16] / d) : 8;
            y->qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* IQ4_XS: each sub-block of 32 fit as for IQ4_NL, the scales quantized to 6 bits
 * (factor -32..31) against d = -(the largest)/32, quants picked again. */
void kern_quant_iq4_xs(const float *x, void *dst, int64_t nb)
{
    struct block_iq4_xs *y = dst;
    struct level_map map;
    level_map_init(kern_iq4nl_values, &map);
    const struct level_map *mid = &map;
    for (int64_t i = 0; i < nb; i++, y++, x += QK_K) {
        float s[8], max_s = 0.0f;
        for (int j = 0; j < 8; j++) {
            s[j] = fit_scale_levels(x + 32 * j, 32, kern_iq4nl_values, mid);
            if (fabsf(s[j]) > fabsf(max_s))
                max_s = s[j];
        }
        y->d = kern_f32_to_f16(max_s / -32.0f);
        float dq = kern_f16_to_f32(y->d);
        y->scales_h = 0;
        memset(y->scales_l, 0, sizeof y->scales_l);
        for (int j = 0; j < 8; j++) {
            int sc = dq != 0.0f ? quant_clamp(s[j] / dq, -32, 31) : 0;
            int u = sc + 32;
            y->scales_l[j / 2] |= (uint8_t)((u & 0xf) << (4 * (j % 2)));
            y->scales_h |= (uint16_t)((u >> 4) << (2 * j));
            float dj = dq * (float)sc;
            const float *xj = x + 32 * j;
            for (int e = 0; e < 16; e++) {
                int lo = dj != 0.0f ? nearest_level(mid, xj[e] / dj) : 8;
                int hi = dj != 0.0f ? nearest_level(mid, xj[e + 16] / dj) : 8;
                y->qs[16 * j + e] = (uint8_t)(lo | hi << 4);
            }
        }
    }
}

/* Index of the MXFP4 level nearest to v: the magnitude's among 0,1,2,3,4,6,8,12, plus 8
 * for negative values. */
static int nearest_mxfp4(float v)
{
    float a = fabsf(v);
    int k = 0;
    for (int i = 0; i < 7; i++)
        k += a > 0.5f * (float)(kern_mxfp4_values[i] + kern_mxfp4_values[i + 1]);
    return v < 0.0f && k ? k + 8 : k;
}

/* MXFP4: the exponent whose scale maps the block's largest magnitude into [8, 16) as
 * ggml chooses it, or one more (so it fits under the top level 12), whichever gives the
 * smaller squared error. */
void kern_quant_mxfp4(const float *x, void *dst, int64_t nb)
{
    struct block_mxfp4 *y = dst;
    for (int64_t i = 0; i < nb; i++, y++, x += QK32) {
        float amax = fabsf(signed_absmax(x, QK32));
        int e0 = amax > 0.0f && amax == amax ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        e0 = e0 < 0 ? 0 : e0 > 253 ? 253 : e0;
        float best = INFINITY;
        for (int e = e0; e <= e0 + 1; e++) {
            float d = kern_e8m0_half((uint8_t)e), err = 0.0f;
            uint8_t qs[16];
            for (int j = 0; j < 16; j++) {
                int lo = nearest_mxfp4(x[j] / d), hi = nearest_mxfp4(x[j + 16] / d);
                float dl = x[j] - (float)kern_mxfp4_values[lo] * d;
                float dh = x[j + 16] - (float)kern_mxfp4_values[hi] * d;
                err += dl * dl + dh * dh;
                qs[j] = (uint8_t)(lo | hi << 4);
            }
            if (e == e0 || err < best) {
                best = err;
                y->e = (uint8_t)e;
                memcpy(y->qs, qs, 16);
            }
        }
    }
}
