/* AVX2 kernels of kern_matmul for Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 over the 8-row
 * layouts of simd_mat.h. Each k-group's quants are widened in registers: Q2_K's 0..3 and
 * Q3_K's 0..7 (value + 4) go to PMADDUBSW as unsigned bytes; the non-linear types' levels
 * come signed out of a byte shuffle and take |w| x sign(x, w), as Q8_0 does. Every
 * PMADDUBSW result is widened by PMADDWD at once (no 16-bit sums to overflow). The float
 * steps are those of kern.h, 8 rows at a time, so every output is bitwise the
 * reference's. */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

#define G 8
#define NB_MAX 4 /* activation rows per pass over a group's tiles */
#define PF_AHEAD 8192

#define INLINE static inline __attribute__((always_inline))

INLINE __m256i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

INLINE __m256i load32(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

INLINE void prefetch_tile(const uint8_t *t, size_t tile)
{
    uintptr_t a = ((uintptr_t)t + PF_AHEAD + 63) & ~(uintptr_t)63;
    for (uintptr_t e = (uintptr_t)t + PF_AHEAD + tile; a < e; a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T0);
}

INLINE __m256i rows_mask(int lo, int hi)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx),
                            _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)));
}

INLINE bool is_lut(const int type)
{
    return type == DT_IQ4_NL || type == DT_IQ4_XS || type == DT_MXFP4;
}

INLINE bool is_q32(const int type)
{
    return type == DT_IQ4_NL || type == DT_MXFP4;
}

/* The signed level table in both 128-bit lanes, for VPSHUFB. */
INLINE __m256i level_lut(const int type)
{
    const int8_t *kv = type == DT_MXFP4 ? kern_mxfp4_values : kern_iq4nl_values;
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kv));
}

/* Operand bytes of k-group kg of tile t: signed levels (LUT types), or Q2_K's 0..3 and
 * Q3_K's 0..7 unsigned. */
INLINE __m256i kg_bytes(const int type, const uint8_t *t, const int kg, __m256i lut)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (is_lut(type)) {
        const int P = type == DT_IQ4_XS ? 8 : 4;
        const int v = (kg / (2 * P)) * P + kg % P, hi = (kg / P) & 1;
        __m256i w = load32(t + 32 * v);
        w = _mm256_and_si256(hi ? _mm256_srli_epi16(w, 4) : w, m4);
        return _mm256_shuffle_epi8(lut, w);
    }
    __m256i w = _mm256_and_si256(_mm256_srli_epi16(load32(t + 32 * (kg / 4)), 2 * (kg % 4)),
                                 _mm256_set1_epi8(3));
    if (type == DT_Q3_K) {
        const int s = kg % 8;
        __m256i p = load32(t + KM_Q3_K_QH(G) + 32 * (kg / 8));
        p = s < 2 ? _mm256_slli_epi16(p, 2 - s) : s > 2 ? _mm256_srli_epi16(p, s - 2) : p;
        w = _mm256_or_si256(w, _mm256_and_si256(p, _mm256_set1_epi8(4)));
    }
    return w;
}

/* 2^(e-128) of 8 E8M0 bytes, as kern_e8m0_half. */
INLINE __m256 e8m0_half8(const uint8_t *p)
{
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
}

INLINE void group_lowbit(const int type, const int NB, const uint8_t *tiles, int64_t nblk,
                         const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo, int hi,
                         int first)
{
    const size_t tile = km_lowbit_tile(type, G);
    const bool q32 = is_q32(type), lutt = is_lut(type);
    const int nsub = q32 ? 1 : type == DT_IQ4_XS ? 8 : 16; /* sub-blocks per block */
    const int kpj = q32 ? 8 : 64 / nsub;                   /* k-groups per sub-block */
    const int bias = type == DT_Q3_K ? 4 : 0;
    const size_t scoff = km_lowbit_sc_off(type, G);
    const size_t doff = km_lowbit_d_off(type, G);
    const size_t ablk = q32 ? sizeof(struct act_q8_32) : sizeof(struct act_q8_256);
    const __m256i lut = lutt ? level_lut(type) : _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const bool all = lo == 0 && hi == G;
    const __m256i rm = rows_mask(lo, hi);

    __m256 acc[NB_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm256_setzero_ps()
                 : all ? _mm256_loadu_ps(y + (size_t)b * ldy)
                       : _mm256_maskload_ps(y + (size_t)b * ldy, rm);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        prefetch_tile(t, tile);
        const struct act_q8_32 *x32[NB_MAX];
        const struct act_q8_256 *x256[NB_MAX];
        const int8_t *xq[NB_MAX];
        float xd[NB_MAX];
        __m256i is[NB_MAX], ms[NB_MAX];
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            const uint8_t *xb = x + (size_t)b * ldx + (size_t)i * ablk;
            x32[b] = (const struct act_q8_32 *)xb;
            x256[b] = (const struct act_q8_256 *)xb;
            xq[b] = q32 ? x32[b]->q : x256[b]->q;
            xd[b] = q32 ? x32[b]->d : x256[b]->d;
            is[b] = ms[b] = _mm256_setzero_si256();
        }
#pragma GCC unroll 16
        for (int j = 0; j < nsub; j++) {
            __m256i dt[NB_MAX];
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                dt[b] = _mm256_set1_epi32(bias ? -bias * x256[b]->bsums[j] : 0);
#pragma GCC unroll 8
            for (int k = 0; k < kpj; k++) {
                const int kg = j * kpj + k;
                __m256i w = kg_bytes(type, t, kg, lut);
                __m256i aw = lutt ? _mm256_abs_epi8(w) : w;
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++) {
                    __m256i xv = bcast4(xq[b] + 4 * kg);
                    if (lutt)
                        xv = _mm256_sign_epi8(xv, w);
                    dt[b] = _mm256_add_epi32(
                        dt[b], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones));
                }
            }
            if (q32) {
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++)
                    is[b] = dt[b];
                continue;
            }
            __m128i scb = _mm_loadl_epi64((const __m128i *)(t + scoff + G * j));
            __m256i sc = type == DT_Q2_K ? _mm256_and_si256(_mm256_cvtepu8_epi32(scb), _mm256_set1_epi32(15))
                                         : _mm256_cvtepi8_epi32(scb);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                is[b] = _mm256_add_epi32(is[b], _mm256_mullo_epi32(dt[b], sc));
            if (type == DT_Q2_K) {
                __m256i mn = _mm256_srli_epi32(_mm256_cvtepu8_epi32(scb), 4);
#pragma GCC unroll 8
                for (int b = 0; b < NB; b++)
                    ms[b] = _mm256_add_epi32(
                        ms[b], _mm256_mullo_epi32(mn, _mm256_set1_epi32(x256[b]->bsums[j])));
            }
        }
        __m256 d = type == DT_MXFP4 ? e8m0_half8(t + doff)
                                    : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + doff)));
        __m256 dmin = type == DT_Q2_K
                          ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + KM_Q2_K_DMIN(G))))
                          : d;
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m256 dx = _mm256_set1_ps(xd[b]);
            acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(is[b]), acc[b]);
            if (type == DT_Q2_K)
                acc[b] = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(dmin, dx), sign),
                                         _mm256_cvtepi32_ps(ms[b]), acc[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        if (all)
            _mm256_storeu_ps(y + (size_t)b * ldy, acc[b]);
        else
            _mm256_maskstore_ps(y + (size_t)b * ldy, rm, acc[b]);
    }
}

#define GROUP_FN(name, T)                                                                 \
    static void name(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,       \
                     size_t ldx, float *y, size_t ldy, int lo, int hi, int first)         \
    {                                                                                     \
        switch (NB) {                                                                     \
        case 1: group_lowbit(T, 1, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 2: group_lowbit(T, 2, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        case 3: group_lowbit(T, 3, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;    \
        default: group_lowbit(T, 4, tiles, nblk, x, ldx, y, ldy, lo, hi, first); break;   \
        }                                                                                 \
    }

GROUP_FN(q2_k, DT_Q2_K)
GROUP_FN(q3_k, DT_Q3_K)
GROUP_FN(iq4_nl, DT_IQ4_NL)
GROUP_FN(iq4_xs, DT_IQ4_XS)
GROUP_FN(mxfp4, DT_MXFP4)

void kern_mat_lowbit_avx2_run(const struct km_view *v, const void *xq, size_t ldx, int B,
                              float *y, size_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *x = xq;
    const size_t a32 = sizeof(struct act_q8_32), a256 = sizeof(struct act_q8_256);
    switch (v->type) {
    case DT_Q2_K: km_drive_tiles(q2_k, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_Q3_K: km_drive_tiles(q3_k, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_IQ4_NL: km_drive_tiles(iq4_nl, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a32); break;
    case DT_IQ4_XS: km_drive_tiles(iq4_xs, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a256); break;
    case DT_MXFP4: km_drive_tiles(mxfp4, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a32); break;
    default: break;
    }
}

#endif
