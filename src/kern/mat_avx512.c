/* AVX-512 VNNI kernels of kern_matmul over the 16-row interleaved layout (simd_mat.h).
 * Integer sums come from VPDPBUSD (unsigned weights x signed activations), one int32 lane
 * per row; the float steps are those of kern.h, done 16 rows at a time, so every output
 * is bitwise the reference's. Each weight tile is decoded once per call for up to NB_MAX
 * activation rows. */
#if defined(__x86_64__)  /* an x86 file: empty on other architectures */
#include <assert.h>
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

#define G 16
#define NB_MAX 8   /* activation rows per pass over a group's tiles (quantized types) */
#define NBF_MAX 6  /* activation rows per pass (float types) */
#define RF 4       /* weight rows per pass (float types) */

#define INLINE static inline __attribute__((always_inline))

/* acc += w (unsigned bytes) . the 4 signed bytes at p, broadcast to every lane. The
 * broadcast is folded into VPDPBUSD's memory operand ({1to16}), which the intrinsic does
 * not do: a separate broadcast per product took a register each, and at 8 activation
 * rows the kernels spilled. */
INLINE __m512i dp_bcast(__m512i acc, __m512i w, const int8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
}

/* acc += the 16-bit pairs of w . the 2 int16 at p, broadcast from memory as in dp_bcast */
INLINE __m512i dpw_bcast(__m512i acc, __m512i w, const int32_t *p)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}

INLINE __m512 half16(const uint8_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

INLINE __m512i load64(const uint8_t *p)
{
    return _mm512_loadu_si512((const void *)p);
}

/* Software prefetch of the weights PF_AHEAD bytes ahead of the stream: measured faster
 * from DRAM at every B, most of all when B > 1 consumes weights slowly. Into L2 (T1), not
 * L1, at this distance: with both cores streaming, Q4_0 and Q4_K decode reached 3-8% more
 * of the read bandwidth than with T0 8 KiB ahead (fewer L1 fill buffers held by lines not
 * yet needed). Q4_0/Q8_0's 4 streams at B = 1 are the exception: a short distance into L1
 * (PF_STREAM_AHEAD). */
#define PF_AHEAD 8192
/* The small-tile types walk 4 streams a thread (km_drive_streams): there a short distance
 * into L1 keeps 4 x 24 lines in flight: llama-1b decoded 19-21% faster (Q8_0) and 2-10%
 * (Q4_0) than at PF_AHEAD into L2 (quiet A/B, Zen 5 VM, both cores). The one-stream
 * Q4_K tiles did not gain from it quietly and keep PF_AHEAD. */
#define PF_STREAM_AHEAD 1536
/* Q4_K's 4 streams at B = 1 (2368-byte tiles): 4 KiB ahead into L1. 1.5 KiB read between
 * the one stream and 4 KiB, 8 KiB as 4 KiB in one round (and Q6_K's 3392-byte tiles 15%
 * slower than one stream); bench_kern_rate -t 2 -b 1 -r 3 1048576 q4_k q6_k, Zen 5 VM. */
#define PF_KSTREAM_AHEAD 4096
INLINE void prefetch_at(const uint8_t *t, size_t tile, const size_t ahead, const int hint)
{
    /* one prefetch per cache line: the lines that start within this tile */
    uintptr_t a = ((uintptr_t)t + ahead + 63) & ~(uintptr_t)63;
    for (uintptr_t e = (uintptr_t)t + ahead + tile; a < e; a += 64) {
        if (hint == _MM_HINT_T0)
            _mm_prefetch((const char *)a, _MM_HINT_T0);
        else
            _mm_prefetch((const char *)a, _MM_HINT_T1);
    }
}

INLINE void prefetch_tile(const uint8_t *t, size_t tile)
{
    prefetch_at(t, tile, PF_AHEAD, _MM_HINT_T1);
}

/* v kept in a register: the compiler otherwise folds one load into each of v's uses,
 * which loads a nibble vector twice (once for each nibble). */
INLINE __m512i in_reg(__m512i v)
{
    __asm__("" : "+v"(v));
    return v;
}

/* Bit s of each byte of a bit plane moved to bit 4 (other bits garbage). */
INLINE __m512i plane_bit4(__m512i plane, const int s)
{
    return s < 4   ? _mm512_slli_epi16(plane, 4 - s)
           : s > 4 ? _mm512_srli_epi16(plane, s - 4)
                   : plane;
}

/* q | (h & 0x10) */
INLINE __m512i or_bit4(__m512i q, __m512i h)
{
    return _mm512_ternarylogic_epi32(q, h, _mm512_set1_epi8(0x10), 0xf8);
}

/* y rows of one group: lanes in km only, so splits need not be aligned. */
INLINE void store_rows(float *y, __mmask16 km, __m512 v)
{
    _mm512_mask_storeu_ps(y, km, v);
}

/* ---- legacy types: blocks of 32, ACT_Q8_32 activations ---- */

/* NS groups (tiles[s], outputs y[s]) side by side, block i of each before block i+1:
 * NS > 1 only for whole groups of a few activation rows (km_drive_streams). pf: software
 * prefetch of the weights (off only at B = 1 on AMD Zen 4, km_view.b1_hw_prefetch). */
INLINE void group_q32(const int type, const int NB, const int NS, const bool pf, const uint8_t *const *tiles,
                      int64_t nblk, const uint8_t *x, size_t ldx, float *const *y, size_t ldy, int lo,
                      int hi, int first)
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
    /* isum = sum q*x - off*xsum for the types whose quants carry an offset */
    const int off = type == DT_Q4_0 ? 8 : type == DT_Q5_0 ? 16 : type == DT_Q8_0 ? 128 : 0;
    const __m512i m4 = _mm512_set1_epi8(0x0f);

    const __mmask16 km = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    __m512 acc[KM_STREAMS][NB_MAX];
#pragma GCC unroll 4
    for (int st = 0; st < NS; st++)
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++)
            acc[st][b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(km, y[st] + (size_t)b * ldy);
    for (int64_t i = 0; i < nblk; i++) {
#pragma GCC unroll 4
        for (int st = 0; st < NS; st++) {
            const uint8_t *t = tiles[st] + (size_t)i * tile;
            if (pf && NS > 1)
                prefetch_at(t, tile, PF_STREAM_AHEAD, _MM_HINT_T0);
            else if (pf)
                prefetch_tile(t, tile);
            const struct act_q8_32 *xa[NB_MAX];
            __m512i s[NB_MAX];
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++) {
                xa[b] = (const struct act_q8_32 *)(x + (size_t)b * ldx) + i;
                s[b] = _mm512_set1_epi32(-off * xa[b]->sum);
            }
            if (type == DT_Q8_0) {
#pragma GCC unroll 8
                for (int kg = 0; kg < 8; kg++) {
                    __m512i w = load64(t + 64 * kg);
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++)
                        s[b] = dp_bcast(s[b], w, xa[b]->q + 4 * kg);
                }
            } else if (!q5) {
                /* High nibbles stay in place (16 times their value) in sums of their own,
                 * shifted down once per block: one shift instead of four. */
                __m512i sh[NB_MAX];
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    sh[b] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    __m512i w = in_reg(load64(t + 64 * v));
                    __m512i wl = _mm512_and_si512(w, m4);
                    __m512i wh = _mm512_andnot_si512(m4, w);
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++) {
                        s[b] = dp_bcast(s[b], wl, xa[b]->q + 4 * v);
                        sh[b] = dp_bcast(sh[b], wh, xa[b]->q + 16 + 4 * v);
                    }
                }
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    s[b] = _mm512_add_epi32(s[b], _mm512_srai_epi32(sh[b], 4));
            } else {
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    __m512i w = in_reg(load64(t + 64 * v));
                    __m512i wl = _mm512_and_si512(w, m4);
                    __m512i wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                    if (q5) {
                        __m512i plane = load64(t + qhoff);
                        wl = or_bit4(wl, plane_bit4(plane, v));
                        wh = or_bit4(wh, plane_bit4(plane, v + 4));
                    }
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++) {
                        s[b] = dp_bcast(s[b], wl, xa[b]->q + 4 * v);
                        s[b] = dp_bcast(s[b], wh, xa[b]->q + 16 + 4 * v);
                    }
                }
            }
            __m512 d = half16(t + doff);
            __m512 m = has_m ? half16(t + moff) : d;
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++) {
                __m512 dx = _mm512_set1_ps(xa[b]->d);
                acc[st][b] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(s[b]), acc[st][b]);
                if (has_m)
                    acc[st][b] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx),
                                                 _mm512_set1_ps((float)xa[b]->sum), acc[st][b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int st = 0; st < NS; st++)
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++)
            store_rows(y[st] + (size_t)b * ldy, km, acc[st][b]);
}

/* ---- K-quants: super-blocks of 256, ACT_Q8_256 activations ---- */

/* Q4_K at B = 1 without software prefetch (km_view.b1_hw_prefetch): the integer sums of
 * one tile, its 32 nibble lines read first, in order, and its scale lines after them. The
 * scales read between the nibble lines (as group_k's other path does) send the reads
 * forward and back, and Zen 4's prefetcher, which alone serves these reads, kept up less
 * well: Q4_K read 0.90-0.99 of Q4_0's DRAM rate a CPU second that way, 0.96-1.06 this way
 * (bench_kern_rate -t 2 -b 1 -r 3 131072 q4_0 q4_k, 8 runs each, alternated, load 3.7-4.9,
 * AMD Zen 4). Integer sums in another order: the same bits. */
INLINE __m512i q4k_b1_sums(const uint8_t *t, const int8_t *q)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i dl[4], dh[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
        dl[u] = dh[u] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            __m512i w = in_reg(load64(t + 64 * (8 * u + p)));
            dl[u] = dp_bcast(dl[u], _mm512_and_si512(w, m4), q + 64 * u + 4 * p);
            dh[u] = dp_bcast(dh[u], _mm512_andnot_si512(m4, w), q + 64 * u + 32 + 4 * p);
        }
    }
    /* The high sums stay 16 times their value through the scale products, shifted down
     * once: exact, as each is a multiple of 16, and no overflow (|16 sum q*x| * 63 * 4 <
     * 2^28). */
    __m512i il = _mm512_setzero_si512(), ih = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
        const uint8_t *sc = t + KM_Q4_K_SC(G) + G * 2 * u;
        __m512i scl = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc));
        __m512i sch = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + G)));
        il = _mm512_add_epi32(il, _mm512_mullo_epi32(dl[u], scl));
        ih = _mm512_add_epi32(ih, _mm512_mullo_epi32(dh[u], sch));
    }
    return _mm512_add_epi32(il, _mm512_srai_epi32(ih, 4));
}

/* NS > 1 (whole groups, block i of each before block i+1) as group_q32's. */
INLINE void group_k(const int type, const int NB, const int NS, const bool pf, const uint8_t *const *tiles,
                    int64_t nblk, const uint8_t *x, size_t ldx, float *const *y, size_t ldy, int lo,
                    int hi, int first)
{
    const bool k5 = type == DT_Q5_K;
    const size_t tile = k5 ? KM_Q5_K_TILE(G) : KM_Q4_K_TILE(G);
    const size_t scoff = k5 ? KM_Q5_K_SC(G) : KM_Q4_K_SC(G);
    const size_t mnoff = k5 ? KM_Q5_K_MN(G) : KM_Q4_K_MN(G);
    const size_t doff = k5 ? KM_Q5_K_D(G) : KM_Q4_K_D(G);
    const size_t dminoff = k5 ? KM_Q5_K_DMIN(G) : KM_Q4_K_DMIN(G);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512 sign = _mm512_set1_ps(-0.0f);

    const __mmask16 km = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    __m512 acc_s[KM_STREAMS][NB_MAX];
#pragma GCC unroll 4
    for (int st = 0; st < NS; st++)
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++)
            acc_s[st][b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(km, y[st] + (size_t)b * ldy);
    for (int64_t i = 0; i < nblk; i++) {
#pragma GCC unroll 4
        for (int st = 0; st < NS; st++) {
            __m512 *acc = acc_s[st];
            const uint8_t *t = tiles[st] + (size_t)i * tile;
            if (pf && NS > 1)
                prefetch_at(t, tile, PF_KSTREAM_AHEAD, _MM_HINT_T0);
            else if (pf)
                prefetch_tile(t, tile);
            const struct act_q8_256 *xa[NB_MAX];
            __m512i is[NB_MAX];
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++) {
                xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
                is[b] = _mm512_setzero_si512();
            }
            if (!k5 && NB == 1 && !pf) {
                is[0] = q4k_b1_sums(t, xa[0]->q);
            } else if (NB <= 4) {
                /* Few rows: each nibble vector is loaded once for both sub-blocks of its
                 * pair. Q4_K: the odd one's nibbles stay high (16 times its sum) and are
                 * shifted down once per sub-block instead of once per vector. Q5_K: the
                 * pair's two bit planes are loaded once, not once per nibble vector. */
                for (int u = 0; u < 4; u++) {
                    const uint8_t *tq = t + 64 * 8 * u;
                    __m512i dl[NB_MAX], dh[NB_MAX], pl = m4, ph = m4;
                    if (k5) {
                        pl = in_reg(load64(t + KM_Q5_K_QH(G) + 64 * (2 * u)));
                        ph = in_reg(load64(t + KM_Q5_K_QH(G) + 64 * (2 * u + 1)));
                    }
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++)
                        dl[b] = dh[b] = _mm512_setzero_si512();
#pragma GCC unroll 8
                    for (int p = 0; p < 8; p++) {
                        __m512i w = in_reg(load64(tq + 64 * p));
                        __m512i wl = _mm512_and_si512(w, m4), wh = _mm512_andnot_si512(m4, w);
                        if (k5) {
                            wl = or_bit4(wl, plane_bit4(pl, p));
                            wh = or_bit4(_mm512_and_si512(_mm512_srli_epi16(w, 4), m4),
                                         plane_bit4(ph, p));
                        }
#pragma GCC unroll 16
                        for (int b = 0; b < NB; b++) {
                            dl[b] = dp_bcast(dl[b], wl, xa[b]->q + 64 * u + 4 * p);
                            dh[b] = dp_bcast(dh[b], wh, xa[b]->q + 64 * u + 32 + 4 * p);
                        }
                    }
                    __m512i scl = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(t + scoff + G * 2 * u)));
                    __m512i sch = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(t + scoff + G * (2 * u + 1))));
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++) {
                        __m512i lo = _mm512_mullo_epi32(dl[b], scl);
                        __m512i hi = _mm512_mullo_epi32(k5 ? dh[b] : _mm512_srai_epi32(dh[b], 4), sch);
                        is[b] = _mm512_add_epi32(is[b], _mm512_add_epi32(lo, hi));
                    }
                }
            } else for (int j = 0; j < 8; j++) {
                const uint8_t *tq = t + 64 * 8 * (j / 2);
                __m512i dt[NB_MAX];
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    dt[b] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    __m512i w = load64(tq + 64 * p);
                    w = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(w, 4) : w, m4);
                    if (k5)
                        w = or_bit4(w, plane_bit4(load64(t + KM_Q5_K_QH(G) + 64 * j), p));
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++)
                        dt[b] = dp_bcast(dt[b], w, xa[b]->q + 32 * j + 4 * p);
                }
                __m512i sc =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(t + scoff + G * j)));
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    is[b] = _mm512_add_epi32(is[b], _mm512_mullo_epi32(dt[b], sc));
            }
            __m512 d = half16(t + doff), dmin = half16(t + dminoff);
            __m512i mn[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                mn[p] = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(t + mnoff + 2 * G * p)));
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++) {
                __m512 dx = _mm512_set1_ps(xa[b]->d);
                acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(is[b]), acc[b]);
                /* msum = sum_j mn[j]*(bsums[2j]+bsums[2j+1]), pairs of j per 16-bit madd */
                __m256i bs = _mm256_loadu_si256((const __m256i *)xa[b]->bsums);
                __m256i xs = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
                __m128i xs16 = _mm256_cvtepi32_epi16(xs);
                int32_t pair[4];
                _mm_storeu_si128((__m128i *)pair, xs16);
                __m512i ms = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    ms = dpw_bcast(ms, mn[p], pair + p);
                __m512 ndm = _mm512_xor_ps(_mm512_mul_ps(dmin, dx), sign);
                acc[b] = _mm512_fmadd_ps(ndm, _mm512_cvtepi32_ps(ms), acc[b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int st = 0; st < NS; st++)
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++)
            store_rows(y[st] + (size_t)b * ldy, km, acc_s[st][b]);
}

/* GFNI's VGF2P8AFFINEQB: every byte of x times the 8x8 bit matrix in its qword of a
 * (byte 7-i of the matrix selects the bits whose parity is result bit i). In asm, as
 * dp_bcast, so that this file is built without -mgfni: the compiler then emits GFNI
 * nowhere else, and the kernels without it run on AVX-512 CPUs that lack it. Run only
 * where km_view.gfni says the CPU has it. */
INLINE __m512i gf_affine(__m512i x, __m512i a)
{
    __m512i r;
    __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(a));
    return r;
}

/* The bit matrix of gf_affine that moves bits 2..7 of a byte to bits 0..5 and clears 6..7 */
#define GF_DOWN2 ((long long)0x0408102040800000ull)

/* The four k-groups of Q6_K sub-block h (KM_Q6_K_BYTES: the three vectors at p) as
 * 6-bit quant vectors: three by a mask each; the fourth from the 2-bit pieces in bits 6..7
 * of each. Without GFNI: shifted down to bits 0..1, 2..3 and 4..5 (a 16-bit shift: a
 * byte's low bits are its own), merged by two bit selects and masked (the top bits came
 * from the next byte): six operations for the fourth, nine for the four, where the nibbles
 * and high-bit vectors of the other layout took 13. With GFNI (gf): merged to bits 2..7
 * (two shifts, two bit selects) and moved down, clean, by one affine transform: five. */
INLINE void q6_quants(const bool gf, const uint8_t *p, __m512i w[4])
{
    const __m512i m6 = _mm512_set1_epi8(0x3f);
    __m512i v0 = in_reg(load64(p)), v1 = in_reg(load64(p + 64)), v2 = in_reg(load64(p + 128));
    w[0] = _mm512_and_si512(v0, m6);
    w[1] = _mm512_and_si512(v1, m6);
    w[2] = _mm512_and_si512(v2, m6);
    /* 0xe4: bits of the first operand where the third is set, else the second's */
    if (gf) {
        __m512i hi = _mm512_ternarylogic_epi32(v2, _mm512_srli_epi16(v1, 2),
                                               _mm512_set1_epi8((char)0xc0), 0xe4);
        hi = _mm512_ternarylogic_epi32(hi, _mm512_srli_epi16(v0, 4), _mm512_set1_epi8((char)0xf0), 0xe4);
        w[3] = gf_affine(hi, _mm512_set1_epi64(GF_DOWN2));
        return;
    }
    __m512i lo = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v0, 6), _mm512_srli_epi16(v1, 4),
                                           _mm512_set1_epi8(0x03), 0xe4);
    __m512i all = _mm512_ternarylogic_epi32(lo, _mm512_srli_epi16(v2, 2), _mm512_set1_epi8(0x0f), 0xe4);
    w[3] = _mm512_and_si512(all, m6);
}

/* gf: GFNI for the fourth k-group of each sub-block (q6_quants; km_view.gfni only).
 * pf: software prefetch of the weights. Q6_K at B = 1 on AMD Zen 4 goes without
 * (km_view.b1_hw_prefetch), as Q4_K: its 6-bit-byte tiles are read in order but for the
 * scales, and Zen 4's prefetcher alone read them at 28-30 GB/s a thread per CPU second
 * where a software prefetch one tile ahead read 19-24 and 8 KiB ahead 22-27 (Q4_0 32-38
 * in the same rounds; bench_kern_rate -t 2 -b 1 -r 2 131072 q6_k q4_0, load 5-7); in L2
 * it saved the prefetches' cost too (51.4 against 58.8 ns a group). The -32 comes off
 * once per block: sum_h sc[h] * sum (q-32)*x = sum_h sc[h] * sum q*x -
 * 32 * sum_h sc[h]*bsums[h], the last sum in one 16-bit madd per pair of sub-blocks (the
 * scale pairs against the bsums pairs). With few rows in sums of its own, shifted and
 * subtracted at the end; with more (no registers for those sums) straight into the
 * sums, by the scale pairs times -32, where the -32*bsums[h] each sub-block's sums
 * started from took four operations a row (AMD Zen 5: 119.7-129.2 ns a group at B = 8
 * against 132.0-137.2 in L2, 23.4 GB/s a thread per CPU second against 20.0 from
 * DRAM). Exact integers in another order: the same bits. */
INLINE void group_q6k(const int NB, const bool gf, const bool pf, const uint8_t *tiles,
                      int64_t nblk, const uint8_t *x, size_t ldx, float *y, size_t ldy, int lo,
                      int hi, int first)
{
    const size_t tile = KM_Q6_K_TILE(G);
    const bool corr_once = NB <= 4;

    const __mmask16 km = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    __m512 acc[NB_MAX];
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++)
        acc[b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(km, y + (size_t)b * ldy);
    for (int64_t i = 0; i < nblk; i++) {
        const uint8_t *t = tiles + (size_t)i * tile;
        if (pf)
            prefetch_tile(t, tile);
        const struct act_q8_256 *xa[NB_MAX];
        __m512i is[NB_MAX], corr[NB_MAX];
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++) {
            xa[b] = (const struct act_q8_256 *)(x + (size_t)b * ldx) + i;
            is[b] = corr[b] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            /* sc pairs (sc[2u], sc[2u+1]) per row as int16 in each int32 lane */
            __m512i scp = _mm512_cvtepi8_epi16(
                _mm256_loadu_si256((const __m256i *)(t + KM_Q6_K_SC(G) + 2 * G * u)));
            /* the pairs times -32 (|32 sc| <= 4096: still int16) */
            const __m512i nscp = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(scp, 5));
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int h = 2 * u + e;
                __m512i w[4], dt[NB_MAX];
                q6_quants(gf, t + 3 * 64 * h, w);
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    dt[b] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
#pragma GCC unroll 16
                    for (int b = 0; b < NB; b++)
                        dt[b] = dp_bcast(dt[b], w[c], xa[b]->q + 16 * h + 4 * c);
                __m512i sc = _mm512_srai_epi32(e ? scp : _mm512_slli_epi32(scp, 16), 16);
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    is[b] = in_reg(_mm512_add_epi32(is[b], _mm512_mullo_epi32(dt[b], sc)));
            }
            if (corr_once)
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++) {
                    int32_t bp;
                    memcpy(&bp, xa[b]->bsums + 2 * u, sizeof bp);
                    corr[b] = _mm512_dpwssd_epi32(corr[b], scp, _mm512_set1_epi32(bp));
                }
            else
#pragma GCC unroll 16
                for (int b = 0; b < NB; b++)
                    is[b] = dpw_bcast(is[b], nscp, (const int32_t *)(const void *)(xa[b]->bsums + 2 * u));
        }
        if (corr_once)
#pragma GCC unroll 16
            for (int b = 0; b < NB; b++)
                is[b] = _mm512_sub_epi32(is[b], _mm512_slli_epi32(corr[b], 5));
        __m512 d = half16(t + KM_Q6_K_D(G));
#pragma GCC unroll 16
        for (int b = 0; b < NB; b++) {
            __m512 dx = _mm512_set1_ps(xa[b]->d);
            acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(is[b]), acc[b]);
        }
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++)
        store_rows(y + (size_t)b * ldy, km, acc[b]);
}

#define NB_CASES(CALL)                                                                    \
    switch (NB) {                                                                         \
    case 1: CALL(1); break;                                                               \
    case 2: CALL(2); break;                                                               \
    case 3: CALL(3); break;                                                               \
    case 4: CALL(4); break;                                                               \
    case 5: CALL(5); break;                                                               \
    case 6: CALL(6); break;                                                               \
    case 7: CALL(7); break;                                                               \
    default: CALL(8); break;                                                              \
    }

#define GROUP_FN(name)                                                                    \
    static void name(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,       \
                     size_t ldx, float *y, size_t ldy, int lo, int hi, int first)         \
    {                                                                                     \
        NB_CASES(name##_CALL)                                                             \
    }

#define q4_0_CALL(n) group_q32(DT_Q4_0, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q4_1_CALL(n) group_q32(DT_Q4_1, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q5_0_CALL(n) group_q32(DT_Q5_0, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q5_1_CALL(n) group_q32(DT_Q5_1, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q8_0_CALL(n) group_q32(DT_Q8_0, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q4_k_CALL(n) group_k(DT_Q4_K, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q5_k_CALL(n) group_k(DT_Q5_K, n, 1, true, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first)
#define q6_k_CALL(n) group_q6k(n, false, true, tiles, nblk, x, ldx, y, ldy, lo, hi, first)
/* GFNI at B = 1 only: its transform shares AMD Zen 4's two pipes of VPDPBUSD, and at B = 4
 * and 8 (four and eight VPDPBUSD a k-group) it cost more than the operation it saves */
#define q6_k_gfni_CALL(n) group_q6k(n, n == 1, true, tiles, nblk, x, ldx, y, ldy, lo, hi, first)

GROUP_FN(q4_0)
GROUP_FN(q4_1)
GROUP_FN(q5_0)
GROUP_FN(q5_1)
GROUP_FN(q8_0)
GROUP_FN(q4_k)
GROUP_FN(q5_k)
GROUP_FN(q6_k)
GROUP_FN(q6_k_gfni)

/* B = 1 with no software prefetch (km_view.b1_hw_prefetch): one activation row only. */
#define GROUP_HW_FN(name, CALL1)                                                          \
    static void name##_hw(int NB, const uint8_t *tiles, int64_t nblk, const uint8_t *x,  \
                          size_t ldx, float *y, size_t ldy, int lo, int hi, int first)    \
    {                                                                                     \
        assert(NB == 1); /* chosen only at B = 1 (kern_mat_avx512_run) */                 \
        (void)NB;                                                                         \
        CALL1;                                                                            \
    }

GROUP_HW_FN(q4_0, group_q32(DT_Q4_0, 1, 1, false, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first))
GROUP_HW_FN(q8_0, group_q32(DT_Q8_0, 1, 1, false, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first))
GROUP_HW_FN(q4_k, group_k(DT_Q4_K, 1, 1, false, &tiles, nblk, x, ldx, &y, ldy, lo, hi, first))
GROUP_HW_FN(q6_k, group_q6k(1, false, false, tiles, nblk, x, ldx, y, ldy, lo, hi, first))
GROUP_HW_FN(q6_k_gfni, group_q6k(1, true, false, tiles, nblk, x, ldx, y, ldy, lo, hi, first))

/* NS whole groups at once for NB activation rows, as km_streams_fn: for the types of
 * small tiles (288 and 544 bytes a group and block), which read DRAM 12-30% faster a CPU
 * second that way on the AMD Zen 5 VM (bench_kern_rate -t 2, 256 MiB, both ways in
 * alternate rounds). The K-quants' tiles (2-3 KiB) are long runs already; with
 * PF_AHEAD into L2 they read 6-33% slower in 2-4 streams. Q4_K at B = 1 takes 4 streams
 * with PF_KSTREAM_AHEAD into L1 (q4_k_streams); Q6_K, whose decode is closer to its
 * compute bound, read no faster that way (26-28 GB/s a thread per CPU second both ways,
 * 1 GiB) and keeps one. A few activation rows (a speculative
 * step's verify, a few served streams) take the streams too: in one stream B = 2 read
 * DRAM at 0.75-0.8 of B = 1's rate. On the AMD Zen 5 VM, 2 threads, 128 MiB, old and new
 * alternated (bench_kern_rate -t 2 -b 4 -r 1 131072 q4_0 q8_0, load 0.7): B = 2 Q4_0
 * 83.7-86.2 GB/s against 66.7-70.9, Q8_0 82.5-92.7 against 67.6-69.0 (B = 1 82-95);
 * B = 4 Q8_0 72.4-85.4 against 73.8-75.8, while Q4_0's B = 4 (16 accumulators beside
 * its 8 sums) was 4% slower in L2 and no faster from DRAM, so it stops at 2 rows. */
#define STREAMS_NB_Q4_0 2
#define STREAMS_NB_Q8_0 4

#define STREAMS_NS_CASES(T, NB, PF)                                                       \
    switch (NS) {                                                                         \
    case 2: group_q32(T, NB, 2, PF, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;         \
    case 3: group_q32(T, NB, 3, PF, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;         \
    default: group_q32(T, NB, 4, PF, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;        \
    }

/* NB: 1..4, the driver's streams_nb at most */
#define STREAMS_FN(name, T, PF)                                                           \
    static void name##_streams(int NS, int NB, const uint8_t *const *tiles, int64_t nblk, \
                               const uint8_t *x, size_t ldx, float *const *y, size_t ldy) \
    {                                                                                     \
        _Static_assert(KM_STREAMS == 4, "cases");                                         \
        switch (NB) {                                                                     \
        case 1: STREAMS_NS_CASES(T, 1, PF) break;                                         \
        case 2: STREAMS_NS_CASES(T, 2, PF) break;                                         \
        case 3: STREAMS_NS_CASES(T, 3, PF) break;                                         \
        default: STREAMS_NS_CASES(T, 4, PF) break;                                        \
        }                                                                                 \
    }

/* The same at B = 1 without software prefetch (km_view.b1_hw_prefetch). */
#define STREAMS1_FN(name, T)                                                              \
    static void name##_streams(int NS, int NB, const uint8_t *const *tiles, int64_t nblk, \
                               const uint8_t *x, size_t ldx, float *const *y, size_t ldy) \
    {                                                                                     \
        assert(NB == 1);                                                                  \
        (void)NB;                                                                         \
        STREAMS_NS_CASES(T, 1, false)                                                     \
    }

STREAMS_FN(q4_0, DT_Q4_0, true)
STREAMS_FN(q8_0, DT_Q8_0, true)
STREAMS1_FN(q4_0_hw, DT_Q4_0)
STREAMS1_FN(q8_0_hw, DT_Q8_0)

/* Q4_K at B = 1 in 4 streams (km_drive_streams with streams_nb 1): 1 GiB from DRAM, 2
 * threads, old and new in alternate rounds (bench_kern_rate -t 2 -b 1 -r 3 1048576 q4_k,
 * Zen 5 VM, load 2-6): 29.7-33.8 GB/s a thread per CPU second against 24.7-29.7 (one
 * stream, PF_AHEAD into L2) in 3 of 4 alternated pairs, 28.2-31.9 against 30.7-35.2 in
 * the fourth. Each row still whole in one group's float
 * steps: the same bits. */
static void q4_k_streams(int NS, int NB, const uint8_t *const *tiles, int64_t nblk,
                         const uint8_t *x, size_t ldx, float *const *y, size_t ldy)
{
    _Static_assert(KM_STREAMS == 4, "cases");
    assert(NB == 1);
    (void)NB;
    switch (NS) {
    case 2: group_k(DT_Q4_K, 1, 2, true, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;
    case 3: group_k(DT_Q4_K, 1, 3, true, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;
    default: group_k(DT_Q4_K, 1, 4, true, tiles, nblk, x, ldx, y, ldy, 0, G, 1); break;
    }
}

/* ---- float weights: 16 lanes per row, element k in lane k%16 ---- */

#define PF_ROW_AHEAD 2048 /* bytes ahead in each weight row */

INLINE size_t fsize(const int type)
{
    return type == DT_F32 ? 4 : 2;
}

INLINE __m512 fload(const int type, const uint8_t *row, int64_t k)
{
    if (type == DT_F32)
        return _mm512_loadu_ps((const float *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (type == DT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE __m512 fload_mask(const int type, const uint8_t *row, int64_t k, __mmask16 m)
{
    if (type == DT_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    if (type == DT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The fixed tree of kern.h: lane[l] += lane[l+s] for s = 8, 4, 2, 1. */
INLINE float reduce16(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

INLINE void rows_float(const int type, const int R, const int NB, const struct km_fcall *c)
{
    __m512 acc[RF][NBF_MAX];
    const float *xb[NBF_MAX];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        xb[b] = (const float *)(c->x + (size_t)b * c->ldx);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r][b] = c->first ? _mm512_setzero_ps()
                                 : _mm512_loadu_ps(c->lanes + ((size_t)r * c->lstride + b) * 16);
    }
    int64_t k = c->k0, kend = c->k0 + c->kn;
    for (; k + 16 <= kend; k += 16) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (type == DT_F32 || k % 32 == 0) /* one prefetch per cache line */
                _mm_prefetch((const char *)((uintptr_t)c->w + (size_t)r * c->rb +
                                            (size_t)k * fsize(type) + PF_ROW_AHEAD),
                             _MM_HINT_T0);
            __m512 wv = fload(type, c->w + (size_t)r * c->rb, k);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                acc[r][b] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xb[b] + k), acc[r][b]);
        }
    }
    if (k < kend) {
        __mmask16 m = (__mmask16)((1u << (kend - k)) - 1);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = fload_mask(type, c->w + (size_t)r * c->rb, k, m);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++)
                acc[r][b] = _mm512_mask3_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xb[b] + k),
                                                  acc[r][b], m);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (c->last)
                c->y[(size_t)b * c->ldy + (size_t)r] = reduce16(acc[r][b]);
            else
                _mm512_storeu_ps(c->lanes + ((size_t)r * c->lstride + b) * 16, acc[r][b]);
        }
}

#define RF_CASES(T, R)                                                                    \
    switch (NB) {                                                                         \
    case 1: rows_float(T, R, 1, c); break;                                                \
    case 2: rows_float(T, R, 2, c); break;                                                \
    case 3: rows_float(T, R, 3, c); break;                                                \
    case 4: rows_float(T, R, 4, c); break;                                                \
    case 5: rows_float(T, R, 5, c); break;                                                \
    default: rows_float(T, R, 6, c); break;                                               \
    }

#define FLOAT_FN(name, T)                                                                 \
    static void name(int R, int NB, const struct km_fcall *c)                             \
    {                                                                                     \
        _Static_assert(NBF_MAX == 6 && RF == 4, "cases");                                 \
        switch (R) {                                                                      \
        case 1: RF_CASES(T, 1) break;                                                     \
        case 2: RF_CASES(T, 2) break;                                                     \
        case 3: RF_CASES(T, 3) break;                                                     \
        default: RF_CASES(T, 4) break;                                                    \
        }                                                                                 \
    }

FLOAT_FN(f32, DT_F32)
FLOAT_FN(f16, DT_F16)
FLOAT_FN(bf16, DT_BF16)

void kern_mat_avx512_run(const struct km_view *v, const void *xq, size_t ldx, int B, float *y,
                         size_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *x = xq;
    const size_t a32 = sizeof(struct act_q8_32), a256 = sizeof(struct act_q8_256);
#define tiles(fn, a) km_drive_tiles(fn, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a)
#define streams(fn, a, nb) km_drive_streams(fn##_streams, nb, fn, NB_MAX, v, x, ldx, B, y, ldy, r0, r1, a)
#define rows(fn) km_drive_rows(fn, RF, NBF_MAX, v, x, ldx, B, y, ldy, r0, r1)
    if (B == 1 && v->b1_hw_prefetch) {
        switch (v->type) {
        case DT_Q4_0: streams(q4_0_hw, a32, 1); return;
        case DT_Q8_0: streams(q8_0_hw, a32, 1); return;
        case DT_Q4_K: tiles(q4_k_hw, a256); return;
        case DT_Q6_K:
            if (v->gfni)
                tiles(q6_k_gfni_hw, a256);
            else
                tiles(q6_k_hw, a256);
            return;
        default: break; /* the others as at B > 1 */
        }
    }
    switch (v->type) {
    case DT_Q4_0: streams(q4_0, a32, STREAMS_NB_Q4_0); break;
    case DT_Q4_1: tiles(q4_1, a32); break;
    case DT_Q5_0: tiles(q5_0, a32); break;
    case DT_Q5_1: tiles(q5_1, a32); break;
    case DT_Q8_0: streams(q8_0, a32, STREAMS_NB_Q8_0); break;
    case DT_Q4_K: streams(q4_k, a256, 1); break;
    case DT_Q5_K: tiles(q5_k, a256); break;
    case DT_Q6_K:
        if (v->gfni)
            tiles(q6_k_gfni, a256);
        else
            tiles(q6_k, a256);
        break;
    case DT_F32: rows(f32); break;
    case DT_F16: rows(f16); break;
    case DT_BF16: rows(bf16); break;
    default: break;
    }
#undef tiles
#undef streams
#undef rows
}

#endif
