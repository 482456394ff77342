/* AVX-512 VNNI kernels of kern_matmul for the types of few bits per weight: Q2_K, Q3_K,
 * IQ4_NL, IQ4_XS and MXFP4, over the 16-row layouts of simd_mat.h. Each k-group's quants
 * are widened in registers to unsigned bytes (a byte shuffle through the level table for
 * the non-linear types, biased by +128; Q3_K's -4..3 by +4), the bias comes off with the
 * activation sums, and VPDPBUSD gives each row's integer sum in its own lane. The float
 * steps are those of kern.h, 16 rows at a time, so every output is bitwise the
 * reference's. (The small helpers repeat mat_avx512.c's, which keeps them private.) */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

#define G 16
#define NB_MAX 8 /* activation rows per pass over a group's tiles */
#define PF_AHEAD 8192

#define INLINE static inline __attribute__((always_inline))

/* acc += w (unsigned bytes) . the 4 signed bytes at p broadcast (see mat_avx512.c). */
INLINE __m512i dp_bcast(__m512i acc, __m512i w, const int8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
}

INLINE __m512i load64(const uint8_t *p)
{
    return _mm512_loadu_si512((const void *)p);
}

INLINE void prefetch_tile(const uint8_t *t, size_t tile)
{
    uintptr_t a = ((uintptr_t)t + PF_AHEAD + 63) & ~(uintptr_t)63;
    for (uintptr_t e = (uintptr_t)t + PF_AHEAD + tile; a < e; a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T1);
}

/* MXFP4's streams (streams_q32) prefetch a short distance ahead into L1, as mat_avx512.c's
 * Q4_0 and Q8_0 streams do (PF_STREAM_AHEAD there: 4 x 24 lines in flight a thread),
 * where they took PF_AHEAD into L2 as the one-stream tiles do. AMD Zen 5 VM, 2 threads,
 * both ways in one binary, alternated, load 3.3-6.9 (other work on the host):
 * bench_moe_stream mxfp4 2 2 4 (gpt-oss-20b's shape, 1.6 GiB of experts, the engine's
 * fused schedule) 39.8-46.7 GB/s a CPU second against 37.2-41.4 in 4 of 5 pairs (38.8
 * against 45.2 in the fifth), wall 11.0-20.4 against 10.4-13.4; bench_kern_rate -t 2 -b 1
 * 262144 mxfp4 (256 MiB) about the same (24.4-31.9 against 21.4-35.2). The bits do not
 * change (a prefetch). */
#define PF_STREAM_AHEAD 1536
INLINE void prefetch_stream(const uint8_t *t, size_t tile)
{
    uintptr_t a = ((uintptr_t)t + PF_STREAM_AHEAD + 63) & ~(uintptr_t)63;
    for (uintptr_t e = (uintptr_t)t + PF_STREAM_AHEAD + tile; a < e; a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T0);
}

INLINE bool is_lut(const int type)
{
    return type == DT_IQ4_NL || type == DT_IQ4_XS || type == DT_MXFP4;
}

INLINE bool is_q32(const int type)
{
    return type == DT_IQ4_NL || type == DT_MXFP4;
}

/* The level table plus 128, in each 128-bit lane, for VPSHUFB. */
INLINE __m512i level_lut(const int type)
{
    const int8_t *kv = type == DT_MXFP4 ? kern_mxfp4_values : kern_iq4nl_values;
    uint8_t t[16];
    for (int i = 0; i < 16; i++)
        t[i] = (uint8_t)(kv[i] + 128);
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
}

/* Unsigned operand bytes of k-group kg of tile t: the value plus the type's bias. */
INLINE __m512i kg_bytes(const int type, const uint8_t *t, const int kg, __m512i lut)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (is_lut(type)) {
        const int P = type == DT_IQ4_XS ? 8 : 4;
        const int v = (kg / (2 * P)) * P + kg % P, hi = (kg / P) & 1;
        __m512i w = load64(t + 64 * v);
        w = _mm512_and_si512(hi ? _mm512_srli_epi16(w, 4) : w, m4);
        return _mm512_shuffle_epi8(lut, w);
    }
    __m512i w = _mm512_and_si512(_mm512_srli_epi16(load64(t + 64 * (kg / 4)), 2 * (kg % 4)),
                                 _mm512_set1_epi8(3));
    if (type == DT_Q3_K) {
        const int s = kg % 8;
        __m512i p = load64(t + KM_Q3_K_QH(G) + 64 * (kg / 8));
        p = s < 2 ? _mm512_slli_epi16(p, 2 - s) : s > 2 ? _mm512_srli_epi16(p, s - 2) : p;
        w = _mm512_ternarylogic_epi32(w, p, _mm512_set1_epi8(4), 0xf8); /* w | (p & 4) */
    }
    return w;
}

/* 2^(e-128) of 16 E8M0 bytes, as kern_e8m0_half. */
INLINE __m512 e8m0_half16(const uint8_t *p)
{
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
}

INLINE void group_lowbit(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                         const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi,
                         int first)
{
    const size_t tile = km_lowbit_tile(type, G);
    const bool q32 = is_q32(type);
    const int nsub = q32 ? 1 : type == DT_IQ4_XS ? 8 : 16; /* sub-blocks per block */
    const int kpj = q32 ? 8 : 64 / nsub;                   /* k-groups per sub-block */
    const int bias = is_lut(type) ? 128 : type == DT_Q3_K ? 4 : 0;
    const size_t scoff = km_lowbit_sc_off(type, G);
    const size_t doff = km_lowbit_d_off(type, G);
    const size_t ablk = q32 ? sizeof(struct act_q8_32) : sizeof(struct act_q8_256);
    const __m512i lut = is_lut(type) ? level_lut(type) : _mm512_setzero_si512();
    const __m512 sign = _mm512_set1_ps(-0.0f);

    const __mmask16 km = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    __m512 acc[NB_MAX];
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(km, y + (size_t)b * ldy);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        prefetch_tile(t, tile);
        const struct act_q8_32 *x32[NB_MAX];
        const struct act_q8_256 *x256[NB_MAX];
        const int8_t *xq[NB_MAX];
        float xd[NB_MAX];
        __m512i is[NB_MAX], ms[NB_MAX];
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++) {
            const uint8_t *xb = x + (size_t)b * ldx + (size_t)i * ablk;
            x32[b] = (const struct act_q8_32 *)xb;
            x256[b] = (const struct act_q8_256 *)xb;
            xq[b] = q32 ? x32[b]->q : x256[b]->q;
            xd[b] = q32 ? x32[b]->d : x256[b]->d;
            is[b] = ms[b] = _mm512_setzero_si512();
        }
#pragma GCC unroll 16
        for (int j = 0; j < nsub; j++) {
            __m512i dt[NB_MAX];
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++) {
                int bsum = q32 ? x32[b]->sum
                           : nsub == 16 ? x256[b]->bsums[j]
                                        : x256[b]->bsums[2 * j] + x256[b]->bsums[2 * j + 1];
                dt[b] = _mm512_set1_epi32(-bias * bsum);
            }
#pragma GCC unroll 8
            for (int k = 0; k < kpj; k++) {
                const int kg = j * kpj + k;
                __m512i w = kg_bytes(type, t, kg, lut);
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    dt[b] = dp_bcast(dt[b], w, xq[b] + 4 * kg);
            }
            if (q32) {
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    is[b] = dt[b];
                continue;
            }
            __m128i scb = _mm_loadu_si128((const __m128i *)(t + scoff + G * j));
            __m512i sc = type == DT_Q2_K ? _mm512_and_si512(_mm512_cvtepu8_epi32(scb), _mm512_set1_epi32(15))
                                         : _mm512_cvtepi8_epi32(scb);
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++)
                is[b] = _mm512_add_epi32(is[b], _mm512_mullo_epi32(dt[b], sc));
            if (type == DT_Q2_K) {
                __m512i mn = _mm512_srli_epi32(_mm512_cvtepu8_epi32(scb), 4);
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    ms[b] = _mm512_add_epi32(
                        ms[b], _mm512_mullo_epi32(mn, _mm512_set1_epi32(x256[b]->bsums[j])));
            }
        }
        __m512 d = type == DT_MXFP4
                       ? e8m0_half16(t + doff)
                       : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + doff)));
        __m512 dmin = type == DT_Q2_K
                          ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + KM_Q2_K_DMIN(G))))
                          : d;
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++) {
            __m512 dx = _mm512_set1_ps(xd[b]);
            acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(is[b]), acc[b]);
            if (type == DT_Q2_K)
                acc[b] = _mm512_fmadd_ps(_mm512_xor_ps(_mm512_mul_ps(dmin, dx), sign),
                                         _mm512_cvtepi32_ps(ms[b]), acc[b]);
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++)
        _mm512_mask_storeu_ps(y + (size_t)b * ldy, km, acc[b]);
}

#define GROUP_FN(name, T)                                                                 \
    static void name(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,       \
                     size_t ldx, float *y, size_t ldy, int lo, int hi, int first)         \
    {                                                                                     \
        switch (NB) {                                                                     \
        case 1: group_lowbit(T, 1, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 2: group_lowbit(T, 2, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 3: group_lowbit(T, 3, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 4: group_lowbit(T, 4, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 5: group_lowbit(T, 5, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 6: group_lowbit(T, 6, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 7: group_lowbit(T, 7, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        default: group_lowbit(T, 8, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;   \
        }                                                                                 \
    }

GROUP_FN(q2_k, DT_Q2_K)
GROUP_FN(q3_k, DT_Q3_K)
GROUP_FN(iq4_nl, DT_IQ4_NL)
GROUP_FN(iq4_xs, DT_IQ4_XS)
GROUP_FN(mxfp4, DT_MXFP4)

/* NS (2..KM_STREAMS) whole groups of IQ4_NL or MXFP4 side by side for NB (1..2)
 * activation rows, as km_streams_fn: block i of every group before block i+1 of any,
 * each group's steps those of group_lowbit (the integer sum from -128 * sum, the scale
 * times the activation's, one FMA a block), so the bits are too. Their tiles are small
 * (272-288 bytes a group and block), as Q4_0's, which reads DRAM faster in several
 * streams a thread (mat_avx512.c); two rows are an expert chosen by two tokens of a
 * decode batch. */
INLINE void streams_q32(const int type, const int NS, const int NB, const bool pf, const uint8_t *const *tiles,
                        int64_t nblk, const uint8_t *x, size_t ldx, float *const *y, size_t ldy)
{
    const size_t tile = km_lowbit_tile(type, G);
    const size_t doff = km_lowbit_d_off(type, G);
    const __m512i lut = level_lut(type);
    __m512 acc[KM_STREAMS][2];
#pragma GCC unroll 4
    for (int s = 0; s < NS; s++)
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++)
            acc[s][b] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nblk; i++) {
        const struct act_q8_32 *xa[2];
        __m512 dx[2];
        __m512i base[2];
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_32 *)(x + (size_t)b * ldx) + i;
            dx[b] = _mm512_set1_ps(xa[b]->d);
            base[b] = _mm512_set1_epi32(-128 * xa[b]->sum);
        }
#pragma GCC unroll 4
        for (int s = 0; s < NS; s++) {
            const uint8_t *t = tiles[s] + (size_t)i * tile;
            if (pf && type == DT_MXFP4)
                prefetch_stream(t, tile);
            else if (pf)
                prefetch_tile(t, tile);
            __m512i dt[2];
#pragma GCC unroll 2
            for (int b = 0; b < NB; b++)
                dt[b] = base[b];
#pragma GCC unroll 8
            for (int kg = 0; kg < 8; kg++) {
                __m512i w = kg_bytes(type, t, kg, lut);
#pragma GCC unroll 2
                for (int b = 0; b < NB; b++)
                    dt[b] = dp_bcast(dt[b], w, xa[b]->q + 4 * kg);
            }
            __m512 d = type == DT_MXFP4
                           ? e8m0_half16(t + doff)
                           : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + doff)));
#pragma GCC unroll 2
            for (int b = 0; b < NB; b++)
                acc[s][b] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx[b]), _mm512_cvtepi32_ps(dt[b]), acc[s][b]);
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < NS; s++)
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++)
            _mm512_storeu_ps(y[s] + (size_t)b * ldy, acc[s][b]);
}

#define STREAMS_NB 2 /* activation rows up to which a product runs in streams */

/* MXFP4 at B = 1 on AMD Zen 4 (km_view.b1_hw_prefetch) leaves the prefetch to the
 * hardware, as the dense types do (mat.c): gpt-oss-20b's experts in moe.c's schedule
 * read 58.5-60.7 GB/s a CPU second without it against 52.6-56.9 with it
 * (bench_moe_stream mxfp4 2 2 4, 2 threads, alternated, load 5.6-6.6). */

#define STREAMS_FN(name, T, PF)                                                            \
    static void name##_streams(int NS, int NB, const uint8_t *const *tiles, int64_t nblk,  \
                               const uint8_t *x, size_t ldx, float *const *y, size_t ldy)  \
    {                                                                                      \
        _Static_assert(KM_STREAMS == 4 && STREAMS_NB == 2, "cases");                       \
        switch (NS * 2 + NB - 1) {                                                         \
        case 4: streams_q32(T, 2, 1, PF, tiles, nblk, x, ldx, y, ldy); break;                  \
        case 5: streams_q32(T, 2, 2, PF, tiles, nblk, x, ldx, y, ldy); break;                  \
        case 6: streams_q32(T, 3, 1, PF, tiles, nblk, x, ldx, y, ldy); break;                  \
        case 7: streams_q32(T, 3, 2, PF, tiles, nblk, x, ldx, y, ldy); break;                  \
        case 8: streams_q32(T, 4, 1, PF, tiles, nblk, x, ldx, y, ldy); break;                  \
        default: streams_q32(T, 4, 2, PF, tiles, nblk, x, ldx, y, ldy); break;                 \
        }                                                                                  \
    }

STREAMS_FN(iq4_nl, DT_IQ4_NL, true)
STREAMS_FN(mxfp4, DT_MXFP4, true)
STREAMS_FN(mxfp4_hw, DT_MXFP4, false)

void kern_mat_lowbit_avx512_run(const struct km_view *v, const void *xq, size_t ldx, int B,
                                float *y, size_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *x = xq;
    const size_t a32 = sizeof(struct act_q8_32), a256 = sizeof(struct act_q8_256);
    switch (v->type) {
    case DT_Q2_K: km_drive_tiles(q2_k, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_Q3_K: km_drive_tiles(q3_k, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_IQ4_NL: km_drive_streams(iq4_nl_streams, STREAMS_NB, iq4_nl, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a32); break;
    case DT_IQ4_XS: km_drive_tiles(iq4_xs, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_MXFP4:
        if (B == 1 && v->b1_hw_prefetch) {
            km_drive_streams(mxfp4_hw_streams, 1, mxfp4, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a32);
            break;
        }
        km_drive_streams(mxfp4_streams, STREAMS_NB, mxfp4, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a32); break;
    default: break;
    }
}

#endif
