/* AVX2 kernels of kern_matmul over the 8-row interleaved layout (simd_mat.h). Integer
 * sums come from PMADDUBSW (unsigned weights x signed activations in [-127, 127]) and
 * PMADDWD, one int32 lane per row. 16-bit partial sums are added only where they cannot
 * overflow: a PMADDUBSW lane is at most 2*127*q_max, so up to 8 of them for 4-bit
 * quants, 4 for 5-bit, 2 for 6-bit, and 1 for Q8_0 (which takes |w| x sign(x, w)).
 * K-quant sub-block scales enter as the PMADDWD multiplier. The float steps are those
 * of kern.h, 8 rows at a time, so every output is bitwise the reference's. */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

#define G 8
#define NB_MAX 4   /* activation rows per pass over a group's tiles (quantized types) */
#define NBF_MAX 3  /* activation rows per pass (float types) */
#define RF 2       /* weight rows per pass (float types) */
#define PF_AHEAD 8192

#define INLINE static inline __attribute__((always_inline))

INLINE __m256i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

INLINE __m256 half8(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

INLINE __m256i load32(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* The weights PF_AHEAD bytes ahead of the stream, into L1 (T0) or L2 (T1). */
INLINE void prefetch_at(const uint8_t *t, size_t tile, const int hint)
{
    /* one prefetch per cache line: the lines that start within this tile */
    uintptr_t a = ((uintptr_t)t + PF_AHEAD + 63) & ~(uintptr_t)63;
    for (uintptr_t e = (uintptr_t)t + PF_AHEAD + tile; a < e; a += 64) {
        if (hint == _MM_HINT_T0)
            _mm_prefetch((const char *)a, _MM_HINT_T0);
        else
            _mm_prefetch((const char *)a, _MM_HINT_T1);
    }
}

INLINE void prefetch_tile(const uint8_t *t, size_t tile)
{
    prefetch_at(t, tile, _MM_HINT_T0);
}

/* Q6_K's tile (nibbles, then high bits read beside them) prefetched into L2, not L1:
 * from DRAM on AMD Zen 4 (this path timed with bench_kern_rate -p avx2 -t 2 131072) it
 * read 29-30 GB/s a thread per CPU second at B = 1 against 9-15 with T0, near its 31 in
 * L2, and 22-23 (B = 2) and 16 (B = 4) against 8-10; T1 2048 and 4096 bytes ahead read
 * 15 and 22 at B = 1, 16384 the same as 8192; no software prefetch read 6.5. */
INLINE void prefetch_tile_l2(const uint8_t *t, size_t tile)
{
    prefetch_at(t, tile, _MM_HINT_T1);
}

/* Bit s of each byte of a bit plane moved to bit 4 (other bits garbage). */
INLINE __m256i plane_bit4(__m256i plane, const int s)
{
    return s < 4   ? _mm256_slli_epi16(plane, 4 - s)
           : s > 4 ? _mm256_srli_epi16(plane, s - 4)
                   : plane;
}

INLINE __m256i or_bit4(__m256i q, __m256i h)
{
    return _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}

INLINE __m256i rows_mask(int lo, int hi)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx),
                            _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)));
}

/* The rows [lo, hi) of one group of 8 (masked lanes are neither read nor written). */
INLINE void store_rows(float *y, int lo, int hi, __m256 v)
{
    if (lo == 0 && hi == G)
        _mm256_storeu_ps(y, v);
    else
        _mm256_maskstore_ps(y, rows_mask(lo, hi), v);
}

INLINE __m256 load_rows(const float *y, int lo, int hi)
{
    if (lo == 0 && hi == G)
        return _mm256_loadu_ps(y);
    return _mm256_maskload_ps(y, rows_mask(lo, hi));
}

/* ---- legacy types: blocks of 32, ACT_Q8_32 activations ---- */

INLINE void group_q32(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                      const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const size_t tile = type == DT_Q4_0   ? KM_Q4_0_TILE(G)
                        : type == DT_Q4_1 ? KM_Q4_1_TILE(G)
                        : type == DT_Q5_0 ? KM_Q5_0_TILE(G)
                        : type == DT_Q5_1 ? KM_Q5_1_TILE(G)
                                          : KM_Q8_0_TILE(G);
    const size_t doff = type == DT_Q4_0   ? KM_Q4_0_D(G)
                        : type == DT_Q4_1 ? KM_Q4_1_D(G)
                        : type == DT_Q5_0 ? KM_Q5_0_D(G)
                        : type == DT_Q5_1 ? KM_Q5_1_D(G)
                                          : KM_Q8_0_D(G);
    const size_t moff = type == DT_Q4_1 ? KM_Q4_1_M(G) : KM_Q5_1_M(G);
    const size_t qhoff = type == DT_Q5_0 ? KM_Q5_0_QH(G) : KM_Q5_1_QH(G);
    const bool q5 = type == DT_Q5_0 || type == DT_Q5_1;
    const bool has_m = type == DT_Q4_1 || type == DT_Q5_1;
    /* isum = sum q*x - off*xsum for Q4_0/Q5_0 (Q8_0 is stored signed here) */
    const int off = type == DT_Q4_0 ? 8 : type == DT_Q5_0 ? 16 : 0;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);

    __m256 acc[NB_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm256_setzero_ps() : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        prefetch_tile(t, tile);
        const struct act_q8_32 *xa[NB_MAX];
        __m256i s[NB_MAX];
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_32 *)(x + (size_t)b * ldx) + i;
            s[b] = _mm256_set1_epi32(-off * xa[b]->sum);
        }
        if (type == DT_Q8_0) {
#pragma GCC unroll 8
            for (int kg = 0; kg < 8; kg++) {
                __m256i w = load32(t + 32 * kg), aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++) {
                    __m256i sx = _mm256_sign_epi8(bcast4(xa[b]->q + 4 * kg), w);
                    s[b] = _mm256_add_epi32(
                        s[b], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
                }
            }
        } else {
            __m256i a16[NB_MAX];
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                a16[b] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                __m256i w = load32(t + 32 * v);
                __m256i wl = _mm256_and_si256(w, m4);
                __m256i wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                if (q5) {
                    __m256i plane = load32(t + qhoff);
                    wl = or_bit4(wl, plane_bit4(plane, v));
                    wh = or_bit4(wh, plane_bit4(plane, v + 4));
                }
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++) {
                    __m256i p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(wl, bcast4(xa[b]->q + 4 * v)),
                        _mm256_maddubs_epi16(wh, bcast4(xa[b]->q + 16 + 4 * v)));
                    a16[b] = _mm256_add_epi16(a16[b], p);
                }
                if (q5 && v == 1) { /* 4 products of 5-bit quants: flush to 32 bits */
#pragma GCC unroll 8
                    for (int b = 0; b < NB; b++) {
                        s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(a16[b], ones));
                        a16[b] = _mm256_setzero_si256();
                    }
                }
            }
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(a16[b], ones));
        }
        __m256 d = half8(t + doff);
        __m256 m = has_m ? half8(t + moff) : d;
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256 dx = _mm256_set1_ps(xa[b]->d);
            acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(s[b]), acc[b]);
            if (has_m)
                acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), _mm256_set1_ps((float)xa[b]->sum),
                                         acc[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

/* ---- K-quants: super-blocks of 256, ACT_Q8_256 activations ---- */

/* msum pairs: int32 p of the result holds (xs[2p], xs[2p+1]) as int16, where
 * xs[j] = bsums[2j] + bsums[2j+1] (|xs| <= 4064). */
INLINE void min_pairs(const struct act_q8_256 *xa, int32_t pair[4])
{
    __m256i xs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xa->bsums),
                                   _mm256_set1_epi16(1));
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(xs), _mm256_extracti128_si256(xs, 1));
    _mm_storeu_si128((__m128i *)pair, p);
}

INLINE void group_k(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                    const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const bool k5 = type == DT_Q5_K;
    const size_t tile = k5 ? KM_Q5_K_TILE(G) : KM_Q4_K_TILE(G);
    const size_t scoff = k5 ? KM_Q5_K_SC(G) : KM_Q4_K_SC(G);
    const size_t mnoff = k5 ? KM_Q5_K_MN(G) : KM_Q4_K_MN(G);
    const size_t doff = k5 ? KM_Q5_K_D(G) : KM_Q4_K_D(G);
    const size_t dminoff = k5 ? KM_Q5_K_DMIN(G) : KM_Q4_K_DMIN(G);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int flush = k5 ? 4 : 8;

    __m256 acc[NB_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm256_setzero_ps() : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        prefetch_tile(t, tile);
        const struct act_q8_256 *xa[NB_MAX];
        __m256i is[NB_MAX];
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
            is[b] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *tq = t + 32 * 8 * (j / 2);
            /* sc[j] of each row in both int16 halves of its lane */
            __m256i sc =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t + scoff + G * j)));
            sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
            __m256i a16[NB_MAX];
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                __m256i w = load32(tq + 32 * p);
                w = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(w, 4) : w, m4);
                if (k5)
                    w = or_bit4(w, plane_bit4(load32(t + KM_Q5_K_QH(G) + 32 * j), p));
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++) {
                    __m256i q = _mm256_maddubs_epi16(w, bcast4(xa[b]->q + 32 * j + 4 * p));
                    a16[b] = p % flush == 0 ? q : _mm256_add_epi16(a16[b], q);
                }
                if (p % flush == flush - 1) {
#pragma GCC unroll 8
                    for (int b = 0; b < NB; b++)
                        is[b] = _mm256_add_epi32(is[b], _mm256_madd_epi16(a16[b], sc));
                }
            }
        }
        __m256 d = half8(t + doff), dmin = half8(t + dminoff);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256 dx = _mm256_set1_ps(xa[b]->d);
            acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(is[b]), acc[b]);
            int32_t pair[4];
            min_pairs(xa[b], pair);
            __m256i ms = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                __m256i mn = _mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(t + mnoff + 2 * G * p)));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mn, _mm256_set1_epi32(pair[p])));
            }
            __m256 ndm = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), sign);
            acc[b] = _mm256_fmadd_ps(ndm, _mm256_cvtepi32_ps(ms), acc[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

INLINE void group_q6k(const int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,
                      size_t ldx, float *y, size_t ldy, int lo, int hi, int first)
{
    const size_t tile = KM_Q6_K_TILE(G);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    const __m256i dup_even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                              0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup_odd = _mm256_add_epi8(dup_even, _mm256_set1_epi8(2));

    __m256 acc[NB_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm256_setzero_ps() : load_rows(y + (size_t)b * ldy, lo, hi);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        prefetch_tile_l2(t, tile);
        const struct act_q8_256 *xa[NB_MAX];
        __m256i is[NB_MAX];
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
            is[b] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 16; j++) {
            const uint8_t *tq = t + 32 * 4 * (j / 2);
            __m256i hv = load32(t + KM_Q6_K_QH(G) + 32 * j);
            __m256i scp = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(t + KM_Q6_K_SC(G) + 2 * G * (j / 2))));
            __m256i sc = _mm256_shuffle_epi8(scp, j & 1 ? dup_odd : dup_even);
            __m256i a16[NB_MAX];
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                __m256i w = load32(tq + 32 * s);
                w = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(w, 4) : w, m4);
                __m256i h = s == 0 ? _mm256_slli_epi16(hv, 4)
                            : s == 1 ? _mm256_slli_epi16(hv, 2)
                            : s == 2 ? hv
                                     : _mm256_srli_epi16(hv, 2);
                w = _mm256_or_si256(w, _mm256_and_si256(h, m2));
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++) {
                    __m256i q = _mm256_maddubs_epi16(w, bcast4(xa[b]->q + 16 * j + 4 * s));
                    a16[b] = s % 2 == 0 ? q : _mm256_add_epi16(a16[b], q);
                }
                if (s % 2 == 1) {
#pragma GCC unroll 8
                    for (int b = 0; b < NB; b++)
                        is[b] = _mm256_add_epi32(is[b], _mm256_madd_epi16(a16[b], sc));
                }
            }
        }
        /* sum_j sc[j]*sum (q-32)*x = (that with q) - 32 * sum_j sc[j]*bsums[j] */
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256i corr = _mm256_setzero_si256();
            for (int u = 0; u < 8; u++) {
                __m256i scp = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(t + KM_Q6_K_SC(G) + 2 * G * u)));
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scp, bcast4(&xa[b]->bsums[2 * u])));
            }
            is[b] = _mm256_sub_epi32(is[b], _mm256_slli_epi32(corr, 5));
        }
        __m256 d = half8(t + KM_Q6_K_D(G));
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256 dx = _mm256_set1_ps(xa[b]->d);
            acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(is[b]), acc[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, lo, hi, acc[b]);
}

#define GROUP_FN(name)                                                                    \
    static void name(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,       \
                     size_t ldx, float *y, size_t ldy, int lo, int hi, int first)         \
    {                                                                                     \
        _Static_assert(NB_MAX == 4, "cases 1..4");                                        \
        switch (NB) {                                                                     \
        case 1: name##_CALL(1); break;                                                    \
        case 2: name##_CALL(2); break;                                                    \
        case 3: name##_CALL(3); break;                                                    \
        default: name##_CALL(4); break;                                                   \
        }                                                                                 \
    }

#define q4_0_CALL(n) group_q32(DT_Q4_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q4_1_CALL(n) group_q32(DT_Q4_1, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q5_0_CALL(n) group_q32(DT_Q5_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q5_1_CALL(n) group_q32(DT_Q5_1, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q8_0_CALL(n) group_q32(DT_Q8_0, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q4_k_CALL(n) group_k(DT_Q4_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q5_k_CALL(n) group_k(DT_Q5_K, n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
#define q6_k_CALL(n) group_q6k(n, tiles, nblk, x, ldx, y, ldy, lo, hi, first)

GROUP_FN(q4_0)
GROUP_FN(q4_1)
GROUP_FN(q5_0)
GROUP_FN(q5_1)
GROUP_FN(q8_0)
GROUP_FN(q4_k)
GROUP_FN(q5_k)
GROUP_FN(q6_k)

/* ---- float weights: 16 lanes per row as two ymm, element k in lane k%16 ---- */

#define PF_ROW_AHEAD 2048 /* bytes ahead in each weight row */

INLINE size_t fsize(const int type)
{
    return type == DT_F32 ? 4 : 2;
}

INLINE __m256 fload(const int type, const uint8_t *row, int64_t k)
{
    if (type == DT_F32)
        return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (type == DT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float fscalar(const int type, const uint8_t *row, int64_t k)
{
    if (type == DT_F32)
        return ((const float *)row)[k];
    uint16_t h;
    memcpy(&h, row + 2 * k, 2);
    if (type == DT_F16)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Lanes 0-15 as (lo, hi), the elements k0..cols-1 of a tail added lane by lane, then
 * the fixed tree of kern.h: lane[l] += lane[l+s] for s = 8, 4, 2, 1. */
INLINE float reduce16(__m256 lo, __m256 hi, const int type, const uint8_t *row, const float *x,
                      int64_t k0, int64_t cols)
{
    if (k0 < cols) {
        float lane[16];
        _mm256_storeu_ps(lane, lo);
        _mm256_storeu_ps(lane + 8, hi);
        for (int64_t k = k0; k < cols; k++)
            lane[k % 16] = fmaf(fscalar(type, row, k), x[k], lane[k % 16]);
        lo = _mm256_loadu_ps(lane);
        hi = _mm256_loadu_ps(lane + 8);
    }
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

INLINE void rows_float(const int type, const int R, const int NB, const struct km_fcall *c)
{
    __m256 acc[RF][NBF_MAX][2];
    const float *xb[NBF_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        xb[b] = (const float *)(c->x + (size_t)b * c->ldx);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float *l = c->lanes + ((size_t)r * c->lstride + b) * 16;
            acc[r][b][0] = c->first ? _mm256_setzero_ps() : _mm256_loadu_ps(l);
            acc[r][b][1] = c->first ? _mm256_setzero_ps() : _mm256_loadu_ps(l + 8);
        }
    }
    int64_t k = c->k0, kend = c->k0 + c->kn;
    for (; k + 16 <= kend; k += 16) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (type == DT_F32 || k % 32 == 0) /* one prefetch per cache line */
                _mm_prefetch((const char *)((uintptr_t)c->w + (size_t)r * c->rb +
                                            (size_t)k * fsize(type) + PF_ROW_AHEAD),
                             _MM_HINT_T0);
            __m256 w0 = fload(type, c->w + (size_t)r * c->rb, k);
            __m256 w1 = fload(type, c->w + (size_t)r * c->rb, k + 8);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++) {
                acc[r][b][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb[b] + k), acc[r][b][0]);
                acc[r][b][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb[b] + k + 8), acc[r][b][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (c->last) {
                c->y[(size_t)b * c->ldy + (size_t)r] = reduce16(
                    acc[r][b][0], acc[r][b][1], type, c->w + (size_t)r * c->rb, xb[b], k, kend);
            } else {
                float *l = c->lanes + ((size_t)r * c->lstride + b) * 16;
                _mm256_storeu_ps(l, acc[r][b][0]);
                _mm256_storeu_ps(l + 8, acc[r][b][1]);
            }
        }
}

#define RF_CASES(T, R)                                                                    \
    switch (NB) {                                                                         \
    case 1: rows_float(T, R, 1, c); break;                                                \
    case 2: rows_float(T, R, 2, c); break;                                                \
    default: rows_float(T, R, 3, c); break;                                               \
    }

#define FLOAT_FN(name, T)                                                                 \
    static void name(int R, int NB, const struct km_fcall *c)                             \
    {                                                                                     \
        _Static_assert(NBF_MAX == 3 && RF == 2, "cases");                                 \
        if (R == 1)                                                                       \
            RF_CASES(T, 1)                                                                \
        else                                                                              \
            RF_CASES(T, 2)                                                                \
    }

FLOAT_FN(f32, DT_F32)
FLOAT_FN(f16, DT_F16)
FLOAT_FN(bf16, DT_BF16)

void kern_mat_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                       size_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *x = xq;
    const size_t a32 = sizeof(struct act_q8_32), a256 = sizeof(struct act_q8_256);
#define tiles(fn, a) km_drive_tiles(fn, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a)
#define rows(fn) km_drive_rows(fn, RF, NBF_MAX, v, x, ldx, B, y, ldy, r0, r1)
    switch (v->type) {
    case DT_Q4_0: tiles(q4_0, a32); break;
    case DT_Q4_1: tiles(q4_1, a32); break;
    case DT_Q5_0: tiles(q5_0, a32); break;
    case DT_Q5_1: tiles(q5_1, a32); break;
    case DT_Q8_0: tiles(q8_0, a32); break;
    case DT_Q4_K: tiles(q4_k, a256); break;
    case DT_Q5_K: tiles(q5_k, a256); break;
    case DT_Q6_K: tiles(q6_k, a256); break;
    case DT_F32: rows(f32); break;
    case DT_F16: rows(f16); break;
    case DT_BF16: rows(bf16); break;
    default: break;
    }
#undef tiles
#undef rows
}

#endif
