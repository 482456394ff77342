/* Weight matrices prepared for products: the run-time choice of kernel path and the
 * repacking of quantized weights into the interleaved layout of simd_mat.h. */
#include "base/mem.h"
#include "kern/kern.h"

#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/err.h"
#include "kern/quant.h"
#include "kern/simd_mat.h"

struct kern_mat {
    enum kern_path path;
    const void *data;    /* GGUF row layout (borrowed); the reference path reads it */
    uint8_t *packed;     /* owned copy for the SIMD paths (interleaved when quantized);
                          * NULL after kern_mat_move, when view.data is the caller's */
    size_t bytes;        /* weight bytes one full product reads */
    struct km_view view; /* what the SIMD kernels read */
};

const char *kern_path_name(enum kern_path p)
{
    switch (p) {
    case KERN_PATH_AUTO: return "auto";
    case KERN_PATH_REF: return "ref";
    case KERN_PATH_AVX2: return "avx2";
    case KERN_PATH_AVX512: return "avx512";
    case KERN_PATH_AMX: return "amx";
    case KERN_PATH_NEON: return "neon";
    case KERN_PATH_NEON_DOT: return "neondot";
    case KERN_PATH_NEON_I8MM: return "neoni8mm";
    }
    return "unknown";
}

static bool cpu_has(enum kern_path p)
{
    const struct cpu_features *f = cpu_features();
    switch (p) {
    case KERN_PATH_REF: return true;
#if defined(__x86_64__)
    case KERN_PATH_AVX2: return f->avx2 && f->fma && f->f16c;
    case KERN_PATH_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl &&
               f->avx512dq && f->avx512vnni;
#elif defined(__aarch64__)
    case KERN_PATH_NEON: return f->asimd;
    case KERN_PATH_NEON_DOT: return f->asimd && f->asimddp;
    case KERN_PATH_NEON_I8MM: return f->asimd && f->asimddp && f->i8mm;
#endif
    default: (void)f; return false;
    }
}

int kern_path_on_cpu(enum kern_path p) { return cpu_has(p); }

enum kern_path kern_best_path(void)
{
    static const enum kern_path order[] = {KERN_PATH_AVX512, KERN_PATH_AVX2, KERN_PATH_NEON_I8MM,
                                           KERN_PATH_NEON_DOT, KERN_PATH_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (cpu_has(order[i]))
            return order[i];
    return KERN_PATH_REF;
}

/* The path to try when p lacks a type: the next slower one of the same architecture. */
static enum kern_path slower_path(enum kern_path p)
{
    switch (p) {
    case KERN_PATH_AVX512: return KERN_PATH_AVX2;
    case KERN_PATH_NEON_I8MM: return KERN_PATH_NEON_DOT;
    case KERN_PATH_NEON_DOT: return KERN_PATH_NEON;
    default: return KERN_PATH_REF;
    }
}

static bool is_float_type(int type)
{
    return type == DT_F32 || type == DT_F16 || type == DT_BF16;
}

/* The types of mat_lowbit_*.c (tile layouts by km_lowbit_tile, not kern_mat_tile_bytes,
 * so that a path claims them only by naming them). */
static bool is_lowbit(int type)
{
    return km_lowbit_tile(type, 1) > 0;
}

/* Types a SIMD path computes (the reference computes every supported type). The NEON
 * paths name theirs (mat_neon.c), so a type given a tile layout for x86 alone falls
 * back to the reference on ARM64. */
static bool path_has_type(enum kern_path p, int type)
{
    switch (p) {
    case KERN_PATH_REF: return true;
    case KERN_PATH_AVX512:
    case KERN_PATH_AVX2:
        return is_float_type(type) || kern_mat_tile_bytes(type, 16) > 0 || is_lowbit(type);
    case KERN_PATH_NEON:
    case KERN_PATH_NEON_DOT:
    case KERN_PATH_NEON_I8MM: return kern_mat_neon_has_type(type);
    default: return false;
    }
}

/* Interleaved rows per group of a path: one SIMD register of int32 lanes. */
static int path_group(enum kern_path p)
{
    switch (p) {
    case KERN_PATH_AVX512: return 16;
    case KERN_PATH_AVX2: return 8;
    case KERN_PATH_NEON:
    case KERN_PATH_NEON_DOT:
    case KERN_PATH_NEON_I8MM: return 4;
    default: return 1;
    }
}

size_t kern_mat_tile_bytes(int type, int G)
{
    switch (type) {
    case DT_Q4_0: return KM_Q4_0_TILE(G);
    case DT_Q4_1: return KM_Q4_1_TILE(G);
    case DT_Q5_0: return KM_Q5_0_TILE(G);
    case DT_Q5_1: return KM_Q5_1_TILE(G);
    case DT_Q8_0: return KM_Q8_0_TILE(G);
    case DT_Q4_K: return KM_Q4_K_TILE(G);
    case DT_Q5_K: return KM_Q5_K_TILE(G);
    case DT_Q6_K: return KM_Q6_K_TILE(G);
    default: return 0;
    }
}

/* ---- repacking ---- */

/* One GGUF block of one row, decoded to integer quants and raw scales. */
struct decoded {
    uint8_t q[QK_K];   /* quant as the unsigned operand of the products */
    uint16_t d, m;     /* half floats: d, and m (Q4_1/Q5_1) or dmin (Q4_K/Q5_K) */
    uint8_t sc[16];    /* K-quant sub-block scales (Q6_K, Q3_K, IQ4_XS: int8 bits) */
    uint8_t mn[16];    /* Q4_K/Q5_K/Q2_K sub-block mins */
};

/* The types of mat_lowbit_*.c: quants as indices (nibbles, or Q3_K's 0..7), factors as
 * int8 bits, MXFP4's exponent in d. */
static void decode_lowbit(int type, const uint8_t *blk, struct decoded *o)
{
    switch (type) {
    case DT_Q2_K: {
        const struct block_q2_K *b = (const void *)blk;
        for (int e = 0; e < QK_K; e++)
            o->q[e] = (uint8_t)kern_q2bits_get(b->qs, e);
        for (int j = 0; j < 16; j++) {
            o->sc[j] = b->scales[j] & 0xf;
            o->mn[j] = b->scales[j] >> 4;
        }
        o->d = b->d;
        o->m = b->dmin;
        break;
    }
    case DT_Q3_K: {
        const struct block_q3_K *b = (const void *)blk;
        for (int e = 0; e < QK_K; e++)
            o->q[e] = (uint8_t)kern_q3k_get(b, e);
        for (int j = 0; j < 16; j++)
            o->sc[j] = (uint8_t)(int8_t)(kern_q3k_scale(b->scales, j) - 32);
        o->d = b->d;
        break;
    }
    case DT_IQ4_NL: {
        const struct block_iq4_nl *b = (const void *)blk;
        for (int e = 0; e < QK32; e++)
            o->q[e] = (uint8_t)kern_nib32_get(b->qs, e);
        o->d = b->d;
        break;
    }
    case DT_MXFP4: {
        const struct block_mxfp4 *b = (const void *)blk;
        for (int e = 0; e < QK32; e++)
            o->q[e] = (uint8_t)kern_nib32_get(b->qs, e);
        o->d = b->e;
        break;
    }
    case DT_IQ4_XS: {
        const struct block_iq4_xs *b = (const void *)blk;
        for (int e = 0; e < QK_K; e++)
            o->q[e] = (uint8_t)kern_iq4xs_get(b, e);
        for (int j = 0; j < 8; j++)
            o->sc[j] = (uint8_t)(int8_t)(kern_iq4xs_scale(b, j) - 32);
        o->d = b->d;
        break;
    }
    default:
        break;
    }
}

static void decode_block(int type, const uint8_t *blk, int q8_bias, struct decoded *o)
{
    switch (type) {
    case DT_Q4_0:
    case DT_Q4_1: {
        const uint8_t *qs = type == DT_Q4_0 ? ((const struct block_q4_0 *)blk)->qs
                                            : ((const struct block_q4_1 *)blk)->qs;
        for (int e = 0; e < QK32; e++)
            o->q[e] = e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
        memcpy(&o->d, blk, 2);
        if (type == DT_Q4_1)
            memcpy(&o->m, blk + 2, 2);
        break;
    }
    case DT_Q5_0:
    case DT_Q5_1: {
        const uint8_t *qh, *qs;
        if (type == DT_Q5_0) {
            qh = ((const struct block_q5_0 *)blk)->qh;
            qs = ((const struct block_q5_0 *)blk)->qs;
        } else {
            qh = ((const struct block_q5_1 *)blk)->qh;
            qs = ((const struct block_q5_1 *)blk)->qs;
            memcpy(&o->m, blk + 2, 2);
        }
        for (int e = 0; e < QK32; e++) {
            int lo = e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
            o->q[e] = (uint8_t)(lo | ((qh[e / 8] >> (e % 8)) & 1) << 4);
        }
        memcpy(&o->d, blk, 2);
        break;
    }
    case DT_Q8_0: {
        const struct block_q8_0 *b = (const void *)blk;
        for (int e = 0; e < QK32; e++)
            o->q[e] = (uint8_t)(b->qs[e] + q8_bias);
        memcpy(&o->d, blk, 2);
        break;
    }
    case DT_Q4_K:
    case DT_Q5_K: {
        const uint8_t *scales;
        if (type == DT_Q4_K) {
            const struct block_q4_K *b = (const void *)blk;
            for (int e = 0; e < QK_K; e++)
                o->q[e] = (uint8_t)kern_q4k_get(b, e);
            scales = b->scales;
        } else {
            const struct block_q5_K *b = (const void *)blk;
            for (int e = 0; e < QK_K; e++)
                o->q[e] = (uint8_t)kern_q5k_get(b, e);
            scales = b->scales;
        }
        for (int j = 0; j < 8; j++)
            kern_k4_scale_min(j, scales, &o->sc[j], &o->mn[j]);
        memcpy(&o->d, blk, 2);
        memcpy(&o->m, blk + 2, 2);
        break;
    }
    case DT_Q6_K: {
        const struct block_q6_K *b = (const void *)blk;
        for (int e = 0; e < QK_K; e++)
            o->q[e] = (uint8_t)kern_q6k_get(b, e);
        memcpy(o->sc, b->scales, 16);
        o->d = b->d;
        break;
    }
    default:
        decode_lowbit(type, blk, o);
        break;
    }
}

/* Low 4 bits of nkg k-groups of row r as nibble vectors with pairing unit P. */
static void put_nibbles(uint8_t *t, const uint8_t *q, int r, int G, int P, int nkg)
{
    for (int v = 0; v < nkg / 2; v++) {
        int lo = 2 * (v / P) * P + v % P, hi = lo + P;
        for (int i = 0; i < 4; i++)
            t[v * 4 * G + 4 * r + i] =
                (uint8_t)((q[4 * lo + i] & 0xf) | (q[4 * hi + i] & 0xf) << 4);
    }
}

/* Bit 4 of each quant of row r into bit planes of 8 k-groups each. */
static void put_bit4(uint8_t *t, const uint8_t *q, int r, int G, int nkg)
{
    for (int kg = 0; kg < nkg; kg++)
        for (int i = 0; i < 4; i++)
            t[(kg / 8) * 4 * G + 4 * r + i] |= (uint8_t)(((q[4 * kg + i] >> 4) & 1) << (kg % 8));
}

/* Q6_K's 256 quants of row r as 6-bit bytes (KM_Q6_K_BYTES): per sub-block h, k-groups
 * 4h..4h+2 whole, k-group 4h+3 in three 2-bit pieces on top of them. */
static void put_q6_bytes(uint8_t *t, const uint8_t *q, int r, int G)
{
    for (int h = 0; h < 16; h++)
        for (int m = 0; m < 3; m++)
            for (int i = 0; i < 4; i++)
                t[(3 * h + m) * 4 * G + 4 * r + i] =
                    (uint8_t)((q[4 * (4 * h + m) + i] & 0x3f) |
                              ((q[4 * (4 * h + 3) + i] >> (2 * m)) & 3) << 6);
}

/* Q6_K's 256 quants of row r as nibble vectors and high-bit vectors (G = 8, 4). */
static void put_q6_nibbles(uint8_t *t, const uint8_t *q, int r, int G)
{
    put_nibbles(t, q, r, G, 4, 64);
    uint8_t *qh = t + KM_Q6_K_QH(G);
    for (int h = 0; h < 16; h++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 4; i++)
                qh[h * 4 * G + 4 * r + i] |= (uint8_t)(((q[4 * (4 * h + s) + i] >> 4) & 3) << (2 * s));
}

static void put_half(uint8_t *t, uint16_t h, int r)
{
    memcpy(t + 2 * r, &h, 2);
}

/* Bit `bit` of each quant of row r into bit planes of 8 k-groups each (as put_bit4). */
static void put_bit_plane(uint8_t *t, const uint8_t *q, int r, int G, int nkg, int bit)
{
    for (int kg = 0; kg < nkg; kg++)
        for (int i = 0; i < 4; i++)
            t[(kg / 8) * 4 * G + 4 * r + i] |= (uint8_t)(((q[4 * kg + i] >> bit) & 1) << (kg % 8));
}

/* Row r of a tile of the types of mat_lowbit_*.c (layouts in simd_mat.h). */
static void pack_row_lowbit(int type, int G, const struct decoded *dc, int r, uint8_t *t)
{
    switch (type) {
    case DT_Q2_K:
    case DT_Q3_K: {
        for (int h = 0; h < 16; h++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 4; i++)
                    t[h * 4 * G + 4 * r + i] |= (uint8_t)((dc->q[4 * (4 * h + s) + i] & 3) << (2 * s));
        if (type == DT_Q2_K) {
            for (int j = 0; j < 16; j++)
                t[KM_Q2_K_SC(G) + j * G + r] = (uint8_t)(dc->sc[j] | dc->mn[j] << 4);
            put_half(t + KM_Q2_K_D(G), dc->d, r);
            put_half(t + KM_Q2_K_DMIN(G), dc->m, r);
        } else {
            put_bit_plane(t + KM_Q3_K_QH(G), dc->q, r, G, 64, 2);
            for (int j = 0; j < 16; j++)
                t[KM_Q3_K_SC(G) + j * G + r] = dc->sc[j];
            put_half(t + KM_Q3_K_D(G), dc->d, r);
        }
        break;
    }
    case DT_IQ4_NL:
        put_nibbles(t, dc->q, r, G, 4, 8);
        put_half(t + KM_IQ4_NL_D(G), dc->d, r);
        break;
    case DT_MXFP4:
        put_nibbles(t, dc->q, r, G, 4, 8);
        t[KM_MXFP4_E(G) + r] = (uint8_t)dc->d;
        break;
    case DT_IQ4_XS:
        put_nibbles(t, dc->q, r, G, 8, 64);
        for (int j = 0; j < 8; j++)
            t[KM_IQ4_XS_SC(G) + j * G + r] = dc->sc[j];
        put_half(t + KM_IQ4_XS_D(G), dc->d, r);
        break;
    default:
        break;
    }
}

/* Row r of one (group, block) tile; the tile was zeroed (padding rows stay zero). */
static void pack_row(int type, int G, const struct decoded *dc, int r, uint8_t *t)
{
    switch (type) {
    case DT_Q4_0:
        put_nibbles(t, dc->q, r, G, 4, 8);
        put_half(t + KM_Q4_0_D(G), dc->d, r);
        break;
    case DT_Q4_1:
        put_nibbles(t, dc->q, r, G, 4, 8);
        put_half(t + KM_Q4_1_D(G), dc->d, r);
        put_half(t + KM_Q4_1_M(G), dc->m, r);
        break;
    case DT_Q5_0:
        put_nibbles(t, dc->q, r, G, 4, 8);
        put_bit4(t + KM_Q5_0_QH(G), dc->q, r, G, 8);
        put_half(t + KM_Q5_0_D(G), dc->d, r);
        break;
    case DT_Q5_1:
        put_nibbles(t, dc->q, r, G, 4, 8);
        put_bit4(t + KM_Q5_1_QH(G), dc->q, r, G, 8);
        put_half(t + KM_Q5_1_D(G), dc->d, r);
        put_half(t + KM_Q5_1_M(G), dc->m, r);
        break;
    case DT_Q8_0:
        for (int kg = 0; kg < 8; kg++)
            memcpy(t + kg * 4 * G + 4 * r, dc->q + 4 * kg, 4);
        put_half(t + KM_Q8_0_D(G), dc->d, r);
        break;
    case DT_Q4_K:
    case DT_Q5_K: {
        bool k5 = type == DT_Q5_K;
        put_nibbles(t, dc->q, r, G, 8, 64);
        if (k5)
            put_bit4(t + KM_Q5_K_QH(G), dc->q, r, G, 64);
        uint8_t *sc = t + (k5 ? KM_Q5_K_SC(G) : KM_Q4_K_SC(G));
        uint8_t *mn = t + (k5 ? KM_Q5_K_MN(G) : KM_Q4_K_MN(G));
        for (int j = 0; j < 8; j++) {
            sc[j * G + r] = dc->sc[j];
            mn[(j / 2) * 2 * G + 2 * r + j % 2] = dc->mn[j];
        }
        put_half(t + (k5 ? KM_Q5_K_D(G) : KM_Q4_K_D(G)), dc->d, r);
        put_half(t + (k5 ? KM_Q5_K_DMIN(G) : KM_Q4_K_DMIN(G)), dc->m, r);
        break;
    }
    case DT_Q6_K: {
        if (KM_Q6_K_BYTES(G))
            put_q6_bytes(t, dc->q, r, G);
        else
            put_q6_nibbles(t, dc->q, r, G);
        for (int j = 0; j < 16; j++)
            t[KM_Q6_K_SC(G) + (j / 2) * 2 * G + 2 * r + j % 2] = dc->sc[j];
        put_half(t + KM_Q6_K_D(G), dc->d, r);
        break;
    }
    default:
        pack_row_lowbit(type, G, dc, r, t);
        break;
    }
}

static void repack(int type, const uint8_t *src, int64_t rows, int64_t cols, int G,
                   int q8_bias, uint8_t *dst, size_t tile)
{
    const struct dtype_info *ti = dtype_info(type);
    int64_t nblk = cols / ti->block_elems, ngroups = (rows + G - 1) / G;
    size_t rb = (size_t)dtype_row_bytes(type, cols);
    struct decoded dc;
    for (int64_t g = 0; g < ngroups; g++) {
        for (int64_t i = 0; i < nblk; i++) {
            uint8_t *t = dst + (size_t)(g * nblk + i) * tile;
            memset(t, 0, tile);
            for (int r = 0; r < G && g * G + r < rows; r++) {
                const uint8_t *blk = src + (size_t)(g * G + r) * rb + (size_t)i * ti->block_bytes;
                decode_block(type, blk, q8_bias, &dc);
                pack_row(type, G, &dc, r, t);
            }
        }
    }
}

/* Whether the AVX-512 path's B = 1 products leave prefetching to the hardware. On AMD
 * Zen 4 (family 0x19 with AVX-512: 512-bit ops on 256-bit units) its stream prefetcher
 * alone read DRAM 12-25% faster a CPU second than the software prefetch tuned on Zen 5
 * (bench_kern_rate -t 2 -b 1, 128 MiB: Q8_0 27-31 against 23-26 GB/s a thread, Q4_0
 * 32-36 against 27-31, Q4_K 26-29 against 21-22), while at B >= 2 it read slower without
 * (Q4_K at B = 4: 10-11 against 21); Q6_K too since its tiles are read in order (6-bit
 * bytes, KM_Q6_K_BYTES: 28-30 GB/s without, 19-24 with; on the old nibble tiles 10-11
 * without, 21-23 with); MXFP4 (mat_lowbit_avx512.c) leaves it too. CAIRN_B1_PREFETCH=sw or hw
 * overrides the choice (for A/B runs on one binary). */
static int b1_prefetch_override; /* 0: none, 1: sw, 2: hw */
static pthread_once_t b1_prefetch_once = PTHREAD_ONCE_INIT;

static void b1_prefetch_read_env(void)
{
    const char *env = getenv("CAIRN_B1_PREFETCH");
    b1_prefetch_override = !env ? 0 : !strcmp(env, "sw") ? 1 : !strcmp(env, "hw") ? 2 : 0;
}

static bool b1_hw_prefetch(enum kern_path path)
{
    if (path != KERN_PATH_AVX512)
        return false;
    pthread_once(&b1_prefetch_once, b1_prefetch_read_env);
    if (b1_prefetch_override)
        return b1_prefetch_override == 2;
    const struct cpu_features *f = cpu_features();
    return f->x86_amd && f->x86_family == 0x19;
}

/* Whether the AVX-512 path may use GFNI (Q6_K at B = 1: mat_avx512.c). CAIRN_GFNI=off
 * keeps to the instructions of the AVX-512 CPUs without it (Intel Skylake-X), so the tests
 * check both kernels on one CPU. */
static bool gfni_off;
static pthread_once_t gfni_once = PTHREAD_ONCE_INIT;

static void gfni_read_env(void)
{
    const char *env = getenv("CAIRN_GFNI");
    gfni_off = env && !strcmp(env, "off");
}

static bool use_gfni(enum kern_path path)
{
    if (path != KERN_PATH_AVX512 || !cpu_features()->gfni)
        return false;
    pthread_once(&gfni_once, gfni_read_env);
    return !gfni_off;
}

int kern_mat_create(struct kern_mat **out, int type, const void *data, int64_t rows,
                    int64_t cols, enum kern_path path, char *err, size_t errlen)
{
    *out = NULL;
    const struct dtype_info *ti = dtype_info(type);
    if (!ti || !ti->supported || kern_act_row_bytes(type, ti->block_elems) == 0)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "kern_mat: type %s not supported",
                          dtype_name(type));
    int64_t rb = dtype_row_bytes(type, cols);
    if (!data || rows <= 0 || cols <= 0 || rb <= 0 || rows > INT64_MAX / 2 / rb)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "kern_mat: bad shape %lld x %lld of %s",
                          (long long)rows, (long long)cols, dtype_name(type));
    if (path == KERN_PATH_AUTO) {
        path = kern_best_path();
        while (!path_has_type(path, type))
            path = slower_path(path);
    }
    if (!cpu_has(path))
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "kern_mat: this CPU lacks path %s",
                          kern_path_name(path));
    if (!path_has_type(path, type))
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "kern_mat: path %s lacks type %s",
                          kern_path_name(path), dtype_name(type));

    struct kern_mat *m = calloc(1, sizeof *m);
    if (!m)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "kern_mat: out of memory");
    m->path = path;
    m->data = data;
    m->bytes = (size_t)(rows * rb);
    struct km_view *v = &m->view;
    v->type = type;
    v->rows = rows;
    v->cols = cols;
    v->nblk = cols / ti->block_elems;
    v->row_bytes = (size_t)rb;
    v->data = data;
    v->b1_hw_prefetch = b1_hw_prefetch(path);
    v->gfni = use_gfni(path);
    v->G = path_group(path);
    v->tile = is_lowbit(type) ? km_lowbit_tile(type, v->G) : kern_mat_tile_bytes(type, v->G);
    if (path != KERN_PATH_REF) {
        /* SIMD paths always own their weights, so the caller may drop the source pages:
         * quantized types interleaved, float types copied as they are. */
        size_t size = v->tile > 0 ? (size_t)((rows + v->G - 1) / v->G) * (size_t)v->nblk * v->tile
                                  : m->bytes;
        m->packed = mem_alloc_stream(size);
        if (!m->packed) {
            free(m);
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "kern_mat: no memory for %zu bytes",
                              size);
        }
        if (v->tile > 0)
            repack(type, data, rows, cols, v->G, path == KERN_PATH_AVX512 ? 128 : 0, m->packed,
                   v->tile);
        else
            memcpy(m->packed, data, size);
        v->data = m->packed;
        m->bytes = size;
    }
    *out = m;
    return 0;
}

void kern_mat_release(struct kern_mat *m)
{
    if (!m)
        return;
    free(m->packed);
    free(m);
}

size_t kern_mat_own_bytes(const struct kern_mat *m) { return m->packed ? m->bytes : 0; }

void kern_mat_move(struct kern_mat *m, void *dst)
{
    if (!m->packed)
        return;
    memcpy(dst, m->packed, m->bytes);
    free(m->packed);
    m->packed = NULL;
    m->view.data = dst;
}

int kern_mat_type(const struct kern_mat *m) { return m->view.type; }
int64_t kern_mat_rows(const struct kern_mat *m) { return m->view.rows; }
int64_t kern_mat_cols(const struct kern_mat *m) { return m->view.cols; }
enum kern_path kern_mat_path(const struct kern_mat *m) { return m->path; }
size_t kern_mat_bytes(const struct kern_mat *m) { return m->bytes; }
int kern_mat_row_align(const struct kern_mat *m) { return m->view.G; }

int kern_row_align(int type, enum kern_path path)
{
    const struct dtype_info *ti = dtype_info(type);
    if (!ti || !ti->supported)
        return 1;
    if (path == KERN_PATH_AUTO) { /* kern_mat_create's choice */
        path = kern_best_path();
        while (!path_has_type(path, type))
            path = slower_path(path);
    }
    return cpu_has(path) && path_has_type(path, type) ? path_group(path) : 1;
}

void kern_matmul(const struct kern_mat *m, const void *xq, size_t ldx, int B, float *y,
                 size_t ldy, int64_t r0, int64_t r1)
{
    const struct km_view *v = &m->view;
    if (B <= 0 || r0 < 0 || r1 > v->rows || r0 >= r1)
        return;
    switch (m->path) {
#if defined(__x86_64__)
    case KERN_PATH_AVX512:
        (is_lowbit(v->type) ? kern_mat_lowbit_avx512_run : kern_mat_avx512_run)(v, xq, ldx, B, y, ldy, r0, r1);
        break;
    case KERN_PATH_AVX2:
        (is_lowbit(v->type) ? kern_mat_lowbit_avx2_run : kern_mat_avx2_run)(v, xq, ldx, B, y, ldy, r0, r1);
        break;
#elif defined(__aarch64__)
    case KERN_PATH_NEON:
        kern_mat_neon_run(v, xq, ldx, B, y, ldy, r0, r1);
        break;
    case KERN_PATH_NEON_DOT:
        kern_mat_neondot_run(v, xq, ldx, B, y, ldy, r0, r1);
        break;
    case KERN_PATH_NEON_I8MM:
        kern_mat_neoni8mm_run(v, xq, ldx, B, y, ldy, r0, r1);
        break;
#endif
    default:
        kern_matmul_ref(v->type, m->data, v->cols, xq, ldx, B, y, ldy, r0, r1);
        break;
    }
}
