#include "engine/attn.h"

#include "base/dtype.h"
#include "base/err.h"
#include "kern/kern.h"
#include "kern/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* About this many query rows (tokens x heads of one KV head's group) share a tile of K
 * and V: enough to reuse each loaded key many times (a prompt's K and V are read from
 * L3 or memory again for each query tile: at 16k, 4 MiB per KV head of 64 dims), few
 * enough that a thread's scratch (the scores, rows x ATTN_TILE floats, 256 KiB; q', o and
 * o_t, 64 KiB each at 64 dims) stays in L2. 256 rather than 128: about 5% more
 * multiply-adds per CPU-second at 16k in bench/attn_long.c (session 13). */
#define ATTN_ROWS 256

struct attn {
    struct attn_shape sh;
    float scale;        /* of the queries */
    int n_threads, max_batch;
    int group;          /* query heads per KV head */
    int qt;             /* tokens per query tile */
    int rows;           /* qt * group */
    int64_t n_tiles;    /* tiles of max_ctx positions */
    size_t thread_floats;
    float *buf;         /* per thread: q' (rows x hd), s (rows x T), o, o_t (rows x hd), m, l, m_t, l_t (rows), fx (2 rows),
                         * kf (hd x T), vf (T x hd), qq (rows x VEC_Q8_ROW_BYTES(hd) bytes) */
    int32_t *nv;        /* per thread (rows): positions of the current tile each row sees */
    int32_t *st;        /* per thread (rows): the first of them (a sliding window's start) */
    const void **vrows; /* per thread (3T): V row of each position of the tile, K and scales of each block */
    const void **hrows; /* per thread (n_head_kv x 3T): the same for every KV head (decode_tile) */
    int32_t *run_start, *run_len; /* (max_batch) query tiles of the batch */
    int64_t *run_items; /* (max_batch + 1) first item of each run (split mode) */
    _Atomic uint64_t *ends; /* (n_threads / 2 + 1) decode_tile: each pair of threads' items left, front << 32 | back */
    float *split;       /* (ATTN_SPLIT_MAX x n_head x n_tiles x (hd + 2)) tile partials */
};

struct scratch {
    float *q, *s, *o, *ot, *m, *l, *mt, *lt;
    float *fx; /* (2 rows) the differences of maxima whose exps merge a tile (merge_rows) */
    float *kf, *vf; /* an F16 tile's K (transposed, [hd][T]) and V ([T][hd]) as floats */
    char *qq;       /* (Q8_0 K) the rows of q as vec_q8_query makes them */
    int32_t *nv, *st;
    const void **vrows;
    const void **kblk;       /* K piece of each block of the tile (attn_qk_paged) */
    const uint16_t **ksblk;  /* and its scales (quantized K) */
};

/* decode_tile's pointers, per KV head h: kblk and ksblk [h * ATTN_TILE/bt + b], vrows
 * [h * ATTN_TILE + j] */
struct scratch_heads {
    const void **kblk, **vrows;
    const uint16_t **ksblk;
};

static struct scratch_heads scratch_heads_of(struct attn *a, int ith)
{
    size_t per = (size_t)a->sh.n_head_kv * ATTN_TILE;
    struct scratch_heads h;
    h.vrows = a->hrows + (size_t)ith * 3 * per;
    h.kblk = h.vrows + per;
    h.ksblk = (const uint16_t **)(h.kblk + per);
    return h;
}

static struct scratch scratch_of(struct attn *a, int ith)
{
    size_t R = (size_t)a->rows, hd = (size_t)a->sh.head_dim;
    float *p = a->buf + (size_t)ith * a->thread_floats;
    struct scratch s;
    s.q = p;
    s.s = s.q + R * hd;
    s.o = s.s + R * ATTN_TILE;
    s.ot = s.o + R * hd;
    s.m = s.ot + R * hd;
    s.l = s.m + R;
    s.mt = s.l + R;
    s.lt = s.mt + R;
    s.fx = s.lt + R;
    s.kf = s.fx + 2 * R;
    s.vf = s.kf + hd * ATTN_TILE;
    s.qq = (char *)(s.vf + hd * ATTN_TILE);
    s.nv = a->nv + (size_t)ith * R;
    s.st = a->st + (size_t)ith * R;
    s.vrows = a->vrows + (size_t)ith * 3 * ATTN_TILE;
    s.kblk = s.vrows + ATTN_TILE;
    s.ksblk = (const uint16_t **)(s.kblk + ATTN_TILE);
    return s;
}

int attn_create(struct attn **out, const struct attn_shape *sh, int n_threads, int max_batch, int64_t max_ctx)
{
    *out = NULL;
    struct attn *a = calloc(1, sizeof *a);
    if (!a)
        return CAIRN_ENOMEM;
    a->sh = *sh;
    a->scale = 1.0f / sqrtf((float)sh->head_dim);
    a->n_threads = n_threads;
    a->max_batch = max_batch;
    a->group = sh->n_head / sh->n_head_kv;
    a->qt = ATTN_ROWS / a->group > 1 ? ATTN_ROWS / a->group : 1;
    a->rows = a->qt * a->group;
    a->n_tiles = (max_ctx + ATTN_TILE - 1) / ATTN_TILE;
    size_t R = (size_t)a->rows, hd = (size_t)sh->head_dim;
    /* whole cache lines per thread, so threads never share one */
    a->thread_floats = (R * (3 * hd + ATTN_TILE + 6) + 2 * hd * ATTN_TILE + R * (VEC_Q8_ROW_BYTES(hd) + 3) / 4 + 15) / 16 * 16;
    size_t split = (size_t)ATTN_SPLIT_MAX * (size_t)sh->n_head * (size_t)a->n_tiles * (hd + 2);
    a->buf = aligned_alloc(64, (size_t)n_threads * a->thread_floats * sizeof(float));
    a->nv = calloc((size_t)n_threads * R, sizeof *a->nv);
    a->st = calloc((size_t)n_threads * R, sizeof *a->st);
    a->vrows = calloc((size_t)n_threads * 3 * ATTN_TILE, sizeof *a->vrows);
    a->hrows = calloc((size_t)n_threads * (size_t)sh->n_head_kv * 3 * ATTN_TILE, sizeof *a->hrows);
    a->run_start = calloc((size_t)max_batch, sizeof *a->run_start);
    a->run_len = calloc((size_t)max_batch, sizeof *a->run_len);
    a->run_items = calloc((size_t)max_batch + 1, sizeof *a->run_items);
    a->ends = calloc((size_t)n_threads / 2 + 1, sizeof *a->ends);
    a->split = calloc(split, sizeof *a->split); /* committed as touched */
    if (!a->buf || !a->nv || !a->st || !a->vrows || !a->hrows || !a->run_start || !a->run_len || !a->run_items ||
        !a->ends || !a->split) {
        attn_release(a);
        return CAIRN_ENOMEM;
    }
    *out = a;
    return 0;
}

void attn_set_scale(struct attn *a, float scale)
{
    if (scale > 0)
        a->scale = scale;
}

void attn_release(struct attn *a)
{
    if (!a)
        return;
    free(a->buf);
    free(a->nv);
    free(a->st);
    free(a->vrows);
    free(a->hrows);
    free(a->run_start);
    free(a->run_len);
    free(a->run_items);
    free((void *)a->ends);
    free(a->split);
    free(a);
}

/* Bytes of n elements of type (n a multiple of its block). */
static size_t type_bytes(int type, int64_t n)
{
    const struct dtype_info *ti = dtype_info(type);
    return (size_t)(n / ti->block_elems) * (size_t)ti->block_bytes;
}

/* GGUF's Q8_0 and Q4_0 blocks of 32 values as llama.cpp's reference quantizers make
 * them for its KV cache (scale from the largest magnitude, round to nearest). */
static void quant_q8_0(const float *x, struct block_q8_0 *b)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = kern_f32_to_f16(d);
    for (int i = 0; i < 32; i++) {
        float v = roundf(x[i] * id);
        b->qs[i] = (int8_t)(v == v ? v : 0.0f); /* a NaN becomes 0, never an undefined conversion */
    }
}

static void quant_q4_0(const float *x, struct block_q4_0 *b)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = kern_f32_to_f16(d);
    for (int i = 0; i < 16; i++) {
        float fl = x[i] * id + 8.5f, fh = x[i + 16] * id + 8.5f;
        int lo = fl >= 0.0f && fl < 16.0f ? (int)fl : fl >= 16.0f ? 15 : 0; /* NaN: 0 */
        int hi = fh >= 0.0f && fh < 16.0f ? (int)fh : fh >= 16.0f ? 15 : 0;
        b->qs[i] = (uint8_t)(lo | hi << 4);
    }
}

/* One head's 32-value blocks of x (hd values) in Q8_0 or Q4_0. */
static void quant_head(int type, const float *x, int hd, void *dst)
{
    for (int c = 0; c < hd / 32; c++) {
        if (type == DT_Q8_0)
            quant_q8_0(x + 32 * c, (struct block_q8_0 *)dst + c);
        else
            quant_q4_0(x + 32 * c, (struct block_q4_0 *)dst + c);
    }
}

void attn_kv_write(struct kv_cache *kv, const struct vec_ops *vec, int layer, int64_t slot, int head_dim,
                   const float *k, const float *v)
{
    attn_kv_write_heads(kv, vec, layer, slot, head_dim, 0, (int)(kv_config(kv)->kv_dim / head_dim), k, v);
}

void attn_kv_write_heads(struct kv_cache *kv, const struct vec_ops *vec, int layer, int64_t slot, int head_dim,
                         int h0, int h1, const float *k, const float *v)
{
    const struct kv_config *c = kv_config(kv);
    int bt = c->block_tokens, hd = head_dim;
    int64_t off = slot % bt, n_kv = c->kv_dim / hd;
    size_t k_head = type_bytes(c->type_k, hd), v_head = type_bytes(c->type_v, hd); /* one row of one head */
    uint8_t *kb = (uint8_t *)kv_k(kv, layer, 0) + (size_t)(slot - off) * (size_t)n_kv * k_head;
    uint8_t *vb = (uint8_t *)kv_v(kv, layer, 0) + (size_t)(slot - off) * (size_t)n_kv * v_head;
    for (int64_t h = h0; h < h1; h++) {
        const float *kh = k + h * hd, *vh = v + h * hd;
        uint8_t *kp = kb + (size_t)h * (size_t)bt * k_head; /* the head's piece of the block */
        uint8_t *vr = vb + ((size_t)h * (size_t)bt + (size_t)off) * v_head;
        switch (c->type_k) {
        case DT_F16:
            vec->f32_to_f16(kh, hd, (uint16_t *)kp + off, bt);
            break;
        case DT_F32:
            for (int d = 0; d < hd; d++)
                ((float *)kp)[d * bt + off] = kh[d];
            break;
        default: {
            /* codes transposed (Q8_0: [hd/4][bt][4], a key's 4 dims together), then the
             * scales [hd/32][bt] (vec.h attn_qk) */
            union { struct block_q8_0 q8[8]; struct block_q4_0 q4[8]; } blk;
            for (int c0 = 0; c0 < hd; c0 += 256) {
                int w = hd - c0 < 256 ? hd - c0 : 256;
                quant_head(c->type_k, kh + c0, w, &blk);
                for (int cb = 0; cb < w / 32; cb++) {
                    int cc = c0 / 32 + cb;
                    if (c->type_k == DT_Q8_0) {
                        for (int i = 0; i < 32; i++)
                            ((int8_t *)kp)[4 * ((8 * cc + i / 4) * bt + off) + i % 4] = blk.q8[cb].qs[i];
                        ((uint16_t *)(kp + (size_t)hd * bt))[cc * bt + off] = blk.q8[cb].d;
                    } else {
                        for (int i = 0; i < 16; i++)
                            kp[(16 * cc + i) * bt + off] = blk.q4[cb].qs[i];
                        ((uint16_t *)(kp + (size_t)hd / 2 * bt))[cc * bt + off] = blk.q4[cb].d;
                    }
                }
            }
        }
        }
        switch (c->type_v) {
        case DT_F16:
            vec->f32_to_f16(vh, hd, (uint16_t *)vr, 1);
            break;
        case DT_F32:
            memcpy(vr, vh, (size_t)hd * sizeof *vh);
            break;
        default:
            quant_head(c->type_v, vh, hd, vr);
        }
    }
}

void attn_kv_write_span(struct kv_cache *kv, int layer, int64_t slot, int head_dim, const char *at[2],
                        size_t bytes[2])
{
    const struct kv_config *c = kv_config(kv);
    int64_t bt = c->block_tokens, first = slot - slot % bt, n_kv = c->kv_dim / head_dim;
    size_t k_blk = type_bytes(c->type_k, head_dim) * (size_t)bt * (size_t)n_kv;
    size_t v_blk = type_bytes(c->type_v, head_dim) * (size_t)bt * (size_t)n_kv;
    at[0] = (const char *)kv_k(kv, layer, 0) + (size_t)(first / bt) * k_blk;
    at[1] = (const char *)kv_v(kv, layer, 0) + (size_t)(first / bt) * v_blk;
    bytes[0] = k_blk;
    bytes[1] = v_blk;
}

void attn_kv_read(struct kv_cache *kv, int layer, int64_t slot, int head_dim, float *k, float *v)
{
    const struct kv_config *c = kv_config(kv);
    int bt = c->block_tokens, hd = head_dim;
    int64_t off = slot % bt, n_kv = c->kv_dim / hd;
    size_t k_head = type_bytes(c->type_k, hd), v_head = type_bytes(c->type_v, hd);
    const uint8_t *kb = (const uint8_t *)kv_k(kv, layer, 0) + (size_t)(slot - off) * (size_t)n_kv * k_head;
    const uint8_t *vb = (const uint8_t *)kv_v(kv, layer, 0) + (size_t)(slot - off) * (size_t)n_kv * v_head;
    for (int64_t h = 0; h < n_kv; h++) {
        float *kh = k + h * hd, *vh = v + h * hd;
        const uint8_t *kp = kb + (size_t)h * (size_t)bt * k_head;
        const uint8_t *vr = vb + ((size_t)h * (size_t)bt + (size_t)off) * v_head;
        for (int d = 0; d < hd; d++) {
            switch (c->type_k) {
            case DT_F16: kh[d] = kern_f16_to_f32(((const uint16_t *)kp)[d * bt + off]); break;
            case DT_F32: kh[d] = ((const float *)kp)[d * bt + off]; break;
            case DT_Q8_0:
                kh[d] = (float)((const int8_t *)kp)[4 * ((d / 4) * bt + off) + d % 4] *
                        kern_f16_to_f32(((const uint16_t *)(kp + (size_t)hd * bt))[d / 32 * bt + off]);
                break;
            default: {
                uint8_t x = kp[(16 * (d / 32) + d % 16) * bt + off];
                kh[d] = (float)((d % 32 < 16 ? x & 15 : x >> 4) - 8) *
                        kern_f16_to_f32(((const uint16_t *)(kp + (size_t)hd / 2 * bt))[d / 32 * bt + off]);
            }
            }
        }
        switch (c->type_v) {
        case DT_F16:
            for (int d = 0; d < hd; d++)
                vh[d] = kern_f16_to_f32(((const uint16_t *)vr)[d]);
            break;
        case DT_F32:
            memcpy(vh, vr, (size_t)hd * sizeof *vh);
            break;
        case DT_Q8_0:
            for (int d = 0; d < hd; d++) {
                const struct block_q8_0 *b = (const struct block_q8_0 *)vr + d / 32;
                vh[d] = (float)b->qs[d % 32] * kern_f16_to_f32(b->d);
            }
            break;
        default:
            for (int d = 0; d < hd; d++) {
                const struct block_q4_0 *b = (const struct block_q4_0 *)vr + d / 32;
                uint8_t x = b->qs[d % 16];
                vh[d] = (float)((d % 32 < 16 ? x & 15 : x >> 4) - 8) * kern_f16_to_f32(b->d);
            }
        }
    }
}

struct attn_job {
    struct attn *a;
    const struct vec_ops *vec;
    struct kv_cache *kv;
    int layer;
    const int32_t *seq;
    const int64_t *pos;
    const float *q;
    float *out;
    int n_runs;
    bool split; /* each item one tile of one run and KV head; partials merged after */
    bool by_tile; /* (split) each item one tile of one run and every KV head (decode_tile) */
    bool cold;  /* a decode-sized batch: its K and V are not in cache */
    bool by_heads; /* (cold, no split) run_item's items taken by pairs of threads (take_pair_heads) */
    long n_items;
    _Atomic long next;
    _Atomic long merge_next; /* merge_work's next (token, query head) */
    const char *k_base, *v_base;
    size_t k_head, v_head; /* bytes of one head's K / V of one position */
    int bt, type_k, type_v;
    int64_t kv_dim, q_dim;
    float scale;
    int64_t window; /* > 0: a sliding window of this many positions */
    const float *sinks; /* (n_head) or NULL */
    attn_prep_fn prep;  /* or NULL (attn_forward_prep) */
    void *prep_ctx;
    _Atomic long prep_next; /* prep_work's next (token, KV head) */
    long n_prep;            /* prep_work's items: tokens x KV heads */
};

/* The first position a token at pos sees. */
static int64_t first_seen(const struct attn_job *j, int64_t pos)
{
    return j->window > 0 && pos >= j->window ? pos - j->window + 1 : 0;
}

/* Q.K's query row r of the scratch: q' as floats (ldq in floats), or with Q8_0 K its
 * vec_q8_query row (ldq in bytes); q_rows_ready makes the latter. */
static const void *qk_row(const struct attn_job *j, const struct scratch *sc, int r, int64_t *ldq)
{
    int hd = j->a->sh.head_dim;
    if (j->type_k != DT_Q8_0) {
        *ldq = hd;
        return sc->q + (size_t)r * hd;
    }
    *ldq = VEC_Q8_ROW_BYTES(hd);
    return sc->qq + (size_t)r * VEC_Q8_ROW_BYTES(hd);
}

/* Rows [r0, r1) of q' written: with Q8_0 K, quantizes them for the byte dot products. */
static void q_rows_ready(const struct attn_job *j, struct scratch *sc, int r0, int r1)
{
    int hd = j->a->sh.head_dim;
    for (int r = r0; j->type_k == DT_Q8_0 && r < r1; r++)
        j->vec->q8_query(sc->q + (size_t)r * hd, hd, sc->qq + (size_t)r * VEC_Q8_ROW_BYTES(hd));
}

/* Asks for the K or V piece (one block's positions, of KV head h: 2 KiB for 16
 * positions of 64 dims) that holds position p. Pieces are too short for the hardware to
 * prefetch; a decode finds them cold, so it asks for the K a few blocks ahead of the one
 * it computes with, and for the V of that one before its scores are done. */
#define PREFETCH_AHEAD 4 /* blocks */
#define SOFTMAX_ROWS 8   /* rows of a tile a softmax_rows call takes */

static void prefetch_piece(const struct attn_job *j, const int32_t *table, int h, int64_t p, bool v)
{
    int bt = j->bt;
    size_t piece = (v ? j->v_head : j->k_head) * (size_t)bt;
    size_t blk = (size_t)table[p / bt];
    const char *at = (v ? j->v_base : j->k_base) + (blk * (size_t)j->a->sh.n_head_kv + (size_t)h) * piece;
    for (size_t c = 0; c < piece; c += 64)
        __builtin_prefetch(at + c, 0, 2);
}

/* The K and V pieces (KV head h) of the blocks holding positions [p0, p1) (p0 a block's
 * first), asked for in steps: each block's K piece then its V piece, per lines a step. */
struct ahead_cursor {
    const struct attn_job *j;
    const int32_t *table; /* from the block being asked for */
    int h;
    int64_t blocks;       /* left, that one included */
    const char *k, *v;    /* its pieces */
    size_t c, per;        /* its next line (K's lines, then V's), lines a step */
};

/* Lines of a block's K piece (k_only) or K and V pieces. */
static size_t ahead_lines(const struct attn_job *j, bool k_only)
{
    size_t k = (j->k_head * (size_t)j->bt + 63) / 64;
    return k_only ? k : k + (j->v_head * (size_t)j->bt + 63) / 64;
}

static void ahead_block(struct ahead_cursor *ac)
{
    const struct attn_job *j = ac->j;
    size_t blk = (size_t)ac->table[0] * (size_t)j->a->sh.n_head_kv + (size_t)ac->h;
    ac->k = j->k_base + blk * j->k_head * (size_t)j->bt;
    ac->v = j->v_base + blk * j->v_head * (size_t)j->bt;
    ac->c = 0;
}

static struct ahead_cursor ahead_begin(const struct attn_job *j, const int32_t *table, int h, int64_t p0, int64_t p1,
                                       int steps)
{
    struct ahead_cursor ac = {.j = j, .table = table, .h = h};
    ac.blocks = p1 > p0 ? (p1 - p0 + j->bt - 1) / j->bt : 0;
    size_t lines = (size_t)ac.blocks * ahead_lines(j, false);
    ac.per = steps > 0 ? (lines + (size_t)steps - 1) / (size_t)steps : lines;
    if (ac.blocks) {
        ac.table += p0 / j->bt;
        ahead_block(&ac);
    }
    return ac;
}

static void ahead_step(struct ahead_cursor *ac)
{
    const struct attn_job *j = ac->j;
    size_t k_lines = ahead_lines(j, true), lines = ahead_lines(j, false);
    for (size_t i = 0; i < ac->per && ac->blocks > 0; i++) {
        __builtin_prefetch(ac->c < k_lines ? ac->k + 64 * ac->c : ac->v + 64 * (ac->c - k_lines), 0, 2);
        if (++ac->c == lines && --ac->blocks > 0) {
            ac->table++;
            ahead_block(ac);
        }
    }
}

static void merge_factors(struct attn_job *j, struct scratch *sc, int b0, int r0, int r1, int64_t t);

/* Q.K of rows [r0, R) of the scratch over the tile's float K from key js, QK_CAUSAL_ROWS
 * rows at a time, each run of rows over the keys up to the last that one of them sees
 * (nv): the tile on a prompt's diagonal skips about half its products, which only fill
 * scores that the softmax and P.V never read. Each score is its own chain (vec.h), so
 * the cut changes no bit. */
#define QK_CAUSAL_ROWS 24 /* a multiple of the float kernel's 6 rows a step */

static void qk_causal(const struct vec_ops *vec, struct scratch *sc, int hd, int r0, int R, int js)
{
    for (int ra = r0; ra < R; ra += QK_CAUSAL_ROWS) {
        int rb = R - ra < QK_CAUSAL_ROWS ? R : ra + QK_CAUSAL_ROWS;
        int n = 0;
        for (int r = ra; r < rb; r++)
            n = sc->nv[r] > n ? sc->nv[r] : n;
        if (n > js)
            vec->attn_qk(sc->q + (size_t)ra * hd, hd, rb - ra, sc->kf + js, NULL, ATTN_TILE, n - js, hd, DT_F32,
                         sc->s + (size_t)ra * ATTN_TILE + js, ATTN_TILE);
    }
}

/* The partials (o_t, m_t, l_t) of rows [r0, R) over tile positions [t0 + js, t0 + nmax) of a
 * sequence's block table, each row seeing its positions [st[r], nv[r]) of them (js <= st[r] <
 * nv[r]; st[r] is 0 without a window). fuse (rows [r0, R) of run b0's, each seeing the whole
 * [0, nmax), none of them first here): merged into the state (o, m, l) at once, as merge_rows
 * would, o_t neither cleared nor written. */
static void tile_partial(struct attn_job *j, struct scratch *sc, const int32_t *table, int h, int64_t t0, int r0,
                         int R, int js, int nmax, int64_t end, bool fuse, int b0)
{
    struct attn *a = j->a;
    const struct vec_ops *vec = j->vec;
    int hd = a->sh.head_dim, bt = j->bt;
    int nr = R - r0;
    size_t k_piece = j->k_head * (size_t)bt, v_piece = j->v_head * (size_t)bt;
    size_t n_kv = (size_t)a->sh.n_head_kv;
    bool quant_k = j->type_k == DT_Q8_0 || j->type_k == DT_Q4_0;
    size_t code_bytes = j->type_k == DT_Q8_0 ? (size_t)hd * bt : (size_t)hd / 2 * bt; /* before the scales */
    size_t k_esize = j->type_k == DT_F16 ? 2 : j->type_k == DT_F32 || j->type_k == DT_Q8_0 ? 4 : 1; /* per key */
    int64_t ldq;
    const void *q0 = qk_row(j, sc, r0, &ldq);
    /* F16 K and V are converted to floats once per tile (exact, so the products give
     * the same bits): every row group then reads floats, and Q.K runs over the whole tile's
     * keys at once rather than one block's. Only when several row groups share them (a
     * decode's few rows read the cache's halves directly). */
    bool kf = j->type_k == DT_F16 && nr > 4, vf = j->type_v == DT_F16 && nr > 4;
    int pj0 = nmax, nb = 0; /* otherwise: the whole blocks from key pj0 go to attn_qk_paged together
                             * (quantized K: a decode's; many rows reuse codes better 16 keys at a time) */
    for (int jj = js; jj < nmax;) {
        int64_t p = t0 + jj;
        int off = (int)(p % bt);
        int cnt = bt - off < nmax - jj ? bt - off : nmax - jj;
        size_t blk = (size_t)table[p / bt];
        const char *kp = j->k_base + (blk * n_kv + (size_t)h) * k_piece;
        const char *vp = j->v_base + (blk * n_kv + (size_t)h) * v_piece;
        const uint16_t *ks = quant_k ? (const uint16_t *)(kp + code_bytes) + off : NULL;
        if (j->cold) {
            int64_t ahead = p - off + PREFETCH_AHEAD * bt; /* below end: within the sequence's blocks */
            if (ahead < end)
                prefetch_piece(j, table, h, ahead, false);
            prefetch_piece(j, table, h, p, true);
        }
        if (kf) {
            vec->f16_to_f32((const uint16_t *)kp + off, bt, sc->kf + jj, ATTN_TILE, hd, cnt);
        } else if (off == 0 && (nr <= 4 || !quant_k)) { /* every block after this starts at its first position too */
            pj0 = pj0 < jj ? pj0 : jj;
            sc->kblk[nb] = kp;
            sc->ksblk[nb++] = ks;
        } else {
            vec->attn_qk(q0, ldq, nr, kp + k_esize * (size_t)off, ks, bt, cnt, hd, j->type_k,
                         sc->s + (size_t)r0 * ATTN_TILE + jj, ATTN_TILE);
        }
        if (vf) {
            vec->f16_to_f32((const uint16_t *)(vp + (size_t)off * j->v_head), 0, sc->vf + (size_t)jj * hd, 0, 1,
                            (int64_t)cnt * hd);
            for (int c = 0; c < cnt; c++)
                sc->vrows[jj + c] = sc->vf + (size_t)(jj + c) * hd;
        } else {
            for (int c = 0; c < cnt; c++)
                sc->vrows[jj + c] = vp + (size_t)(off + c) * j->v_head;
        }
        jj += cnt;
    }
    if (nb)
        vec->attn_qk_paged(q0, ldq, nr, sc->kblk, quant_k ? sc->ksblk : NULL, bt, nmax - pj0, hd,
                           j->type_k, sc->s + (size_t)r0 * ATTN_TILE + pj0, ATTN_TILE, NULL);
    if (kf)
        qk_causal(vec, sc, hd, r0, R, js);
    int type_v = vf ? DT_F32 : j->type_v;
    bool cut = false;
    /* Many rows: the next tile's blocks (those of this tile's positions, a tile on) are asked
     * for long before their use, a few lines a row while the softmax runs (a prompt's K and V
     * come from L3 or memory in pieces too short for the hardware prefetcher). Asked for all
     * at once beside the F16 conversion, they filled the miss buffers and the conversion
     * waited behind them. */
    int64_t next0 = t0 + js - (t0 + js) % bt + ATTN_TILE, next1 = t0 + nmax + ATTN_TILE;
    if (j->cold || nr <= 4)
        next1 = next0; /* none (a decode's blocks are asked for above) */
    else if (next1 > end)
        next1 = end;
    struct ahead_cursor ac = ahead_begin(j, table, h, next0, next1, nr);
    for (int r = r0; r < R; r++)
        cut |= sc->st[r] > 0;
    /* SOFTMAX_ROWS rows at a time, each row's lines asked for before them */
    for (int ra = r0; ra < R; ra += SOFTMAX_ROWS) {
        int rb = R - ra < SOFTMAX_ROWS ? R : ra + SOFTMAX_ROWS;
        for (int r = ra; r < rb; r++)
            ahead_step(&ac);
        if (!cut && vec->softmax_rows) {
            vec->softmax_rows(sc->s + (size_t)ra * ATTN_TILE, ATTN_TILE, rb - ra, sc->nv + ra, sc->mt + ra, sc->lt + ra);
            continue;
        }
        for (int r = ra; r < rb; r++)
            sc->mt[r] = vec->softmax_tile(sc->s + (size_t)r * ATTN_TILE + sc->st[r], sc->nv[r] - sc->st[r], &sc->lt[r]);
    }
    if (fuse) {
        merge_factors(j, sc, b0, r0, R, t0 / ATTN_TILE);
        for (int r = r0; r < R; r++)
            sc->l[r] = sc->l[r] * sc->fx[2 * (r - r0)] + sc->lt[r] * sc->fx[2 * (r - r0) + 1];
        vec->attn_pv_merge(sc->o + (size_t)r0 * hd, hd, nr, sc->s + (size_t)r0 * ATTN_TILE, ATTN_TILE, nmax,
                           sc->vrows, hd, type_v, sc->fx);
        return;
    }
    memset(sc->ot + (size_t)r0 * hd, 0, (size_t)nr * (size_t)hd * sizeof(float));
    if (!cut) {
        vec->attn_pv(sc->ot + (size_t)r0 * hd, hd, nr, sc->s + (size_t)r0 * ATTN_TILE, ATTN_TILE, sc->nv + r0,
                     sc->vrows, hd, type_v, NULL);
        return;
    }
    /* rows of a window that starts inside the tile: each over its own positions */
    for (int r = r0; r < R; r++) {
        int st = sc->st[r];
        int32_t cnt = sc->nv[r] - st;
        vec->attn_pv(sc->ot + (size_t)r * hd, hd, 1, sc->s + (size_t)r * ATTN_TILE + st, ATTN_TILE, &cnt,
                     sc->vrows + st, hd, type_v, NULL);
    }
}

/* The state (o, m, l) merged with a tile's partial; first: the state is the partial. */
static void merge(const struct vec_ops *vec, float *o, float *m, float *l, const float *ot, float mt, float lt,
                  int hd, bool first)
{
    if (first) {
        memcpy(o, ot, (size_t)hd * sizeof *o);
        *m = mt;
        *l = lt;
        return;
    }
    float mx = *m > mt ? *m : mt;
    float f[2] = {*m, mt};
    vec->exp_sub(f, mx, 2);
    *l = *l * f[0] + lt * f[1];
    for (int i = 0; i < hd; i++)
        o[i] = o[i] * f[0] + ot[i] * f[1];
    *m = mx;
}

/* The factors merge_rows merges rows [r0, r1) with, into fx (two a row: a and b of attn.h's
 * merge), the maxima into m (rows whose first tile this is left out); the exps of all rows in
 * one exp_sub: exp_sub(x, 0) of x = m - mx is exp_sub(m, mx) of merge, bit for bit (x - 0 is
 * x). */
static void merge_factors(struct attn_job *j, struct scratch *sc, int b0, int r0, int r1, int64_t t)
{
    int group = j->a->group, k = 0;
    for (int r = r0; r < r1; r++) {
        if (t == first_seen(j, j->pos[b0 + r / group]) / ATTN_TILE)
            continue;
        float mx = sc->m[r] > sc->mt[r] ? sc->m[r] : sc->mt[r];
        sc->fx[k++] = sc->m[r] - mx;
        sc->fx[k++] = sc->mt[r] - mx;
        sc->m[r] = mx;
    }
    j->vec->exp_sub(sc->fx, 0.0f, k);
}

/* merge of rows [r0, r1) with their tile partials (a row whose first tile this is: the
 * state is the partial). */
static void merge_rows(struct attn_job *j, struct scratch *sc, int b0, int r0, int r1, int64_t t)
{
    int hd = j->a->sh.head_dim, group = j->a->group, k = 0;
    merge_factors(j, sc, b0, r0, r1, t);
    for (int r = r0; r < r1; r++) {
        float *o = sc->o + (size_t)r * hd;
        const float *ot = sc->ot + (size_t)r * hd;
        if (t == first_seen(j, j->pos[b0 + r / group]) / ATTN_TILE) {
            memcpy(o, ot, (size_t)hd * sizeof *o);
            sc->m[r] = sc->mt[r];
            sc->l[r] = sc->lt[r];
            continue;
        }
        float fa = sc->fx[k++], fb = sc->fx[k++];
        sc->l[r] = sc->l[r] * fa + sc->lt[r] * fb;
        for (int i = 0; i < hd; i++)
            o[i] = o[i] * fa + ot[i] * fb;
    }
}

/* out = o / l; with a sink s (attn.h): o and l first scaled to the max of m and s, and
 * exp(s - max) added to l. */
static void finish_row(const struct vec_ops *vec, float *out, const float *o, float m, float l, int hd,
                       const float *sink)
{
    if (!sink) {
        float inv = 1.0f / l;
        for (int i = 0; i < hd; i++)
            out[i] = o[i] * inv;
        return;
    }
    float mx = m > *sink ? m : *sink;
    float f[2] = {m, *sink};
    vec->exp_sub(f, mx, 2);
    float inv = 1.0f / (l * f[0] + f[1]);
    for (int i = 0; i < hd; i++)
        out[i] = (o[i] * f[0]) * inv;
}

/* A decode's K and V come from memory. One KV head's piece of a block is short (2 KiB for
 * 16 positions of 64 dims) and the next lies a block further (16 KiB with 8 KV heads): read
 * head by head, as run_item does, no hardware prefetcher follows and the reads are
 * scattered. So a decode of a few tokens over a long context takes a tile at a time for
 * every KV head together (each thread a contiguous range of tiles), STREAM_KEYS positions
 * at a time across the heads, and asks for the bytes ahead of their use in address order
 * (whole blocks), a part before each head's step so that reads stay in flight while the
 * arithmetic runs: the tile's V during Q.K, the next tile's K during P.V. (On this machine,
 * single thread, per CPU-second: 1.4x run_item's reads; the same asks in one burst per tile
 * 1.25x, a head's pieces at a time 0.85x.) The same bits as tile_partial: every score is
 * its own chain, P.V adds the positions into o in the same order, and the partials merge
 * as in split mode. */
#define STREAM_KEYS 64

/* The K or V of every KV head of the blocks holding positions [p0, p1) (below end), in
 * the order of their addresses (a block's heads lie together). */
static void prefetch_blocks(const struct attn_job *j, const int32_t *table, int64_t p0, int64_t p1, int64_t end,
                            bool v)
{
    int bt = j->bt;
    size_t bytes = (v ? j->v_head : j->k_head) * (size_t)bt * (size_t)j->a->sh.n_head_kv; /* one block */
    for (int64_t p = p0 - p0 % bt; p < p1 && p < end; p += bt) {
        const char *at = (v ? j->v_base : j->k_base) + (size_t)table[p / bt] * bytes;
        for (size_t c = 0; c < bytes; c += 64)
            __builtin_prefetch(at + c, 0, 2);
    }
}

/* prefetch_blocks's lines (in the same order) cut into parts taken one after another, spread
 * over the steps of a tile, so some of the reads are always in flight while the arithmetic
 * runs. Each part's first contiguous run goes to the next kernel to ask for along its steps
 * (vec.h vec_prefetch: asked for at once, 128 lines filled the miss buffers and the
 * arithmetic then waited for them; a cold step read 1.65x faster spread), the rest (a part
 * that crosses a block) is asked for at once. The cursor carries where the last part ended,
 * so a part costs one division, not five (a fifth of decode_tile's own time). */
struct pf_parts {
    const char *base;
    const int32_t *table; /* from the first block */
    size_t bytes;         /* of one block's K or V, every KV head */
    size_t per_block;     /* lines of a block */
    size_t lines;         /* of all the blocks */
    size_t b, c;          /* the next part's first line: block b, its line c */
    size_t done;          /* lines handed out */
    int parts, next;      /* parts, and the next one's index */
};

/* The K or V (v) of the blocks holding positions [p0, p1) (below end), in parts parts. */
static struct pf_parts prefetch_parts(const struct attn_job *j, const int32_t *table, int64_t p0, int64_t p1,
                                      int64_t end, bool v, int parts)
{
    struct pf_parts pp = {0};
    if (parts <= 0)
        return pp; /* nothing to ask for (no next tile) */
    int bt = j->bt;
    pp.bytes = (v ? j->v_head : j->k_head) * (size_t)bt * (size_t)j->a->sh.n_head_kv;
    pp.base = v ? j->v_base : j->k_base;
    p1 = p1 < end ? p1 : end;
    p0 -= p0 % bt;
    pp.per_block = (pp.bytes + 63) / 64;
    pp.lines = p1 > p0 ? (size_t)((p1 - p0 + bt - 1) / bt) * pp.per_block : 0;
    pp.table = pp.lines ? table + p0 / bt : table; /* p0 may be past the table's end when there is nothing */
    pp.parts = parts;
    return pp;
}

/* The next part of pp (parts are taken in order): its first run into *pf, the rest asked for. */
static void prefetch_next(struct pf_parts *pp, struct vec_prefetch *pf)
{
    pf->at = NULL;
    pf->lines = 0;
    if (pp->next >= pp->parts)
        return;
    size_t hi = pp->lines * (size_t)++pp->next / (size_t)pp->parts;
    size_t left = hi - pp->done;
    if (left == 0)
        return;
    size_t run = pp->per_block - pp->c < left ? pp->per_block - pp->c : left;
    pf->at = pp->base + (size_t)pp->table[pp->b] * pp->bytes + 64 * pp->c;
    pf->lines = (int64_t)run;
    pp->c += run;
    left -= run;
    while (left > 0) { /* the part's lines in the blocks after */
        pp->b++;
        pp->c = 0;
        const char *at = pp->base + (size_t)pp->table[pp->b] * pp->bytes;
        for (; pp->c < pp->per_block && left > 0; pp->c++, left--)
            __builtin_prefetch(at + 64 * pp->c, 0, 2);
    }
    if (pp->c == pp->per_block) {
        pp->b++;
        pp->c = 0;
    }
    pp->done = hi;
}

/* Whether decode_tile can take this batch (no window; whole blocks in a tile and a step;
 * every head's rows of a run in the scratch). */
static bool by_tile_fits(const struct attn_job *j)
{
    const struct attn *a = j->a;
    int max_len = 0;
    for (int ri = 0; ri < j->n_runs; ri++)
        max_len = a->run_len[ri] > max_len ? a->run_len[ri] : max_len;
    return j->window == 0 && j->bt <= STREAM_KEYS && STREAM_KEYS % j->bt == 0 && ATTN_TILE % STREAM_KEYS == 0 &&
           (int64_t)max_len * a->sh.n_head <= a->rows && max_len * a->group <= ATTN_ROWS;
}

/* rows[c] = the V row c of a block's piece at vp (rows of row_bytes), c < bt: four at a time
 * (one a loop turn was a quarter of decode_tile's own time, a pointer per key and KV head). */
static void v_rows(const void **rows, const char *vp, size_t row_bytes, int bt)
{
    int c = 0;
    for (; c + 4 <= bt; c += 4, vp += 4 * row_bytes) {
        rows[c] = vp;
        rows[c + 1] = vp + row_bytes;
        rows[c + 2] = vp + 2 * row_bytes;
        rows[c + 3] = vp + 3 * row_bytes;
    }
    for (; c < bt; c++, vp += row_bytes)
        rows[c] = vp;
}

/* Tile t of run ri for every KV head: partials into a->split. first: the thread's first
 * item (its K is asked for now); next: the tile of the same run the thread likely takes
 * next (its K is asked for during P.V), or -1; fresh: the scratch's q' rows are not this
 * run's yet (a thread's items of one run share them: every tile sees the same rows or
 * fewer, and a row's q' does not depend on the tile). */
static void decode_tile(struct attn_job *j, struct scratch *sc, const struct scratch_heads *hs, int ri, int64_t t,
                        bool first, int64_t next, bool fresh)
{
    struct attn *a = j->a;
    const struct vec_ops *vec = j->vec;
    int hd = a->sh.head_dim, group = a->group, n_kv = a->sh.n_head_kv, bt = j->bt;
    int b0 = a->run_start[ri], len = a->run_len[ri], R = len * group;
    int64_t n_blocks;
    const int32_t *table = kv_seq_blocks(j->kv, j->seq[b0], &n_blocks);
    int64_t t0 = t * ATTN_TILE, end = j->pos[b0 + len - 1] + 1;
    int r0 = R, nmax = 0;
    for (int i = 0; i < len; i++) {
        int64_t cnt = j->pos[b0 + i] + 1 - t0;
        cnt = cnt < 0 ? 0 : cnt > ATTN_TILE ? ATTN_TILE : cnt;
        for (int g = 0; g < group; g++)
            sc->nv[i * group + g] = (int32_t)cnt;
        if (cnt > 0 && r0 == R)
            r0 = i * group;
        nmax = cnt > nmax ? (int)cnt : nmax;
    }
    if (first && r0 < R)
        prefetch_blocks(j, table, t0, t0 + ATTN_TILE, end, false);
    /* head h's rows at h*R of q, s, ot, mt, lt */
    for (int h = 0; fresh && h < n_kv; h++) {
        for (int r = 0; r < R; r++) {
            const float *q = j->q + (size_t)(b0 + r / group) * (size_t)j->q_dim + (size_t)(h * group + r % group) * hd;
            float *qs = sc->q + (size_t)(h * R + r) * hd;
            for (int d = 0; d < hd; d++)
                qs[d] = q[d] * j->scale;
        }
        q_rows_ready(j, sc, h * R, h * R + R);
    }
    if (r0 == R)
        return;
    int nr = R - r0;
    bool quant_k = j->type_k == DT_Q8_0 || j->type_k == DT_Q4_0;
    size_t k_piece = j->k_head * (size_t)bt, v_piece = j->v_head * (size_t)bt;
    size_t code_bytes = j->type_k == DT_Q8_0 ? (size_t)hd * bt : (size_t)hd / 2 * bt;
    int nbt = (nmax + bt - 1) / bt, per_head = ATTN_TILE / bt;
    for (int b = 0; b < nbt; b++) {
        size_t blk = (size_t)table[(t0 + (int64_t)b * bt) / bt];
        for (int h = 0; h < n_kv; h++) {
            const char *kp = j->k_base + (blk * (size_t)n_kv + (size_t)h) * k_piece;
            const char *vp = j->v_base + (blk * (size_t)n_kv + (size_t)h) * v_piece;
            hs->kblk[h * per_head + b] = kp;
            hs->ksblk[h * per_head + b] = quant_k ? (const uint16_t *)(kp + code_bytes) : NULL;
            v_rows(hs->vrows + h * ATTN_TILE + b * bt, vp, j->v_head, bt);
        }
    }
    int step = STREAM_KEYS / bt;
    int parts = (nmax + STREAM_KEYS - 1) / STREAM_KEYS * n_kv;
    struct pf_parts pv = prefetch_parts(j, table, t0, t0 + ATTN_TILE, end, true, parts);
    for (int b = 0; b < nbt; b += step) {
        int k0 = b * bt, k1 = k0 + STREAM_KEYS < nmax ? k0 + STREAM_KEYS : nmax;
        for (int h = 0; h < n_kv; h++) {
            struct vec_prefetch pf;
            prefetch_next(&pv, &pf);
            int64_t ldq;
            const void *qh = qk_row(j, sc, h * R + r0, &ldq);
            vec->attn_qk_paged(qh, ldq, nr, hs->kblk + h * per_head + b,
                               quant_k ? hs->ksblk + h * per_head + b : NULL, bt, k1 - k0, hd, j->type_k,
                               sc->s + (size_t)(h * R + r0) * ATTN_TILE + k0, ATTN_TILE, &pf);
        }
    }
    for (int h = 0; h < n_kv; h++)
        for (int r = r0; r < R; r++)
            sc->mt[h * R + r] = vec->softmax_tile(sc->s + (size_t)(h * R + r) * ATTN_TILE, sc->nv[r], &sc->lt[h * R + r]);
    for (int h = 0; h < n_kv; h++)
        memset(sc->ot + (size_t)(h * R + r0) * hd, 0, (size_t)nr * (size_t)hd * sizeof(float));
    int32_t cnt[ATTN_ROWS];
    struct pf_parts pk = prefetch_parts(j, table, next * ATTN_TILE, (next + 1) * ATTN_TILE, end, false,
                                        next >= 0 ? parts : 0);
    for (int k0 = 0; k0 < nmax; k0 += STREAM_KEYS) {
        for (int r = r0; r < R; r++)
            cnt[r - r0] = sc->nv[r] - k0 < 0 ? 0 : sc->nv[r] - k0 > STREAM_KEYS ? STREAM_KEYS : sc->nv[r] - k0;
        for (int h = 0; h < n_kv; h++) {
            struct vec_prefetch pf;
            prefetch_next(&pk, &pf);
            vec->attn_pv(sc->ot + (size_t)(h * R + r0) * hd, hd, nr, sc->s + (size_t)(h * R + r0) * ATTN_TILE + k0,
                         ATTN_TILE, cnt, hs->vrows + h * ATTN_TILE + k0, hd, j->type_v, &pf);
        }
    }
    for (int h = 0; h < n_kv; h++)
        for (int r = r0; r < R; r++) {
            int b = b0 + r / group, qh = h * group + r % group;
            float *dst = a->split + ((size_t)(b * a->sh.n_head + qh) * (size_t)a->n_tiles + (size_t)t) * (size_t)(hd + 2);
            memcpy(dst, sc->ot + (size_t)(h * R + r) * hd, (size_t)hd * sizeof *dst);
            dst[hd] = sc->mt[h * R + r];
            dst[hd + 1] = sc->lt[h * R + r];
        }
}

/* One item: the rows of run ri for KV head h over tiles [ta, tb). */
static void run_item(struct attn_job *j, struct scratch *sc, int ri, int h, int64_t ta, int64_t tb)
{
    struct attn *a = j->a;
    int hd = a->sh.head_dim, group = a->group;
    int b0 = a->run_start[ri], len = a->run_len[ri];
    int R = len * group;
    int64_t n_blocks;
    const int32_t *table = kv_seq_blocks(j->kv, j->seq[b0], &n_blocks);
    for (int i = 0; i < len; i++)
        for (int g = 0; g < group; g++) {
            const float *q = j->q + (size_t)(b0 + i) * (size_t)j->q_dim + (size_t)(h * group + g) * (size_t)hd;
            float *qs = sc->q + (size_t)(i * group + g) * hd;
            for (int d = 0; d < hd; d++)
                qs[d] = q[d] * j->scale;
        }
    q_rows_ready(j, sc, 0, R);
    int64_t end = j->pos[b0 + len - 1] + 1; /* positions the run sees */
    int64_t from = first_seen(j, j->pos[b0]);
    from = from > ta * ATTN_TILE ? from : ta * ATTN_TILE; /* this item's first position */
    for (int64_t p = from - from % j->bt; j->cold && p < end && p < from + PREFETCH_AHEAD * j->bt; p += j->bt)
        prefetch_piece(j, table, h, p, false);
    for (int64_t t = ta; t < tb; t++) {
        int64_t t0 = t * ATTN_TILE;
        int r0 = R, r1 = R, nmax = 0, nmin = ATTN_TILE;
        for (int i = 0; i < len; i++) {
            int64_t cnt = j->pos[b0 + i] + 1 - t0;
            cnt = cnt < 0 ? 0 : cnt > ATTN_TILE ? ATTN_TILE : cnt;
            int64_t st = first_seen(j, j->pos[b0 + i]) - t0;
            st = st < 0 ? 0 : st > ATTN_TILE ? ATTN_TILE : st;
            for (int g = 0; g < group; g++) {
                sc->nv[i * group + g] = (int32_t)cnt;
                sc->st[i * group + g] = (int32_t)st;
            }
            /* positions and window starts rise along a run: rows [r0, r1) see the tile */
            if (cnt > st && r0 == R)
                r0 = i * group;
            if (cnt <= st && r0 < R && r1 == R)
                r1 = i * group;
            nmax = cnt > nmax ? (int)cnt : nmax;
            nmin = cnt < nmin ? (int)cnt : nmin;
        }
        if (r0 == R)
            continue;
        /* a prompt's whole tiles after its first: P.V merges into the state as it ends */
        bool fuse = !j->split && j->window == 0 && t > 0 && nmin == nmax && j->vec->attn_pv_merge &&
                    (j->type_v == DT_F16 || j->type_v == DT_F32);
        tile_partial(j, sc, table, h, t0, r0, r1, sc->st[r0], nmax, end, fuse, b0);
        if (!j->split) {
            if (!fuse)
                merge_rows(j, sc, b0, r0, r1, t);
            continue;
        }
        for (int r = r0; r < r1; r++) {
            int b = b0 + r / group, qh = h * group + r % group;
            float *dst = a->split + ((size_t)(b * a->sh.n_head + qh) * (size_t)a->n_tiles + (size_t)t) * (size_t)(hd + 2);
            memcpy(dst, sc->ot + (size_t)r * hd, (size_t)hd * sizeof *dst);
            dst[hd] = sc->mt[r];
            dst[hd + 1] = sc->lt[r];
        }
    }
    if (j->split)
        return;
    for (int r = 0; r < R; r++) {
        int b = b0 + r / group, qh = h * group + r % group;
        finish_row(j->vec, j->out + (size_t)b * (size_t)j->q_dim + (size_t)qh * hd, sc->o + (size_t)r * hd, sc->m[r],
                   sc->l[r], hd, j->sinks ? j->sinks + qh : NULL);
    }
}

/* Items [lo, hi) of pair p of nth threads: its two threads' shares of pool_split (the
 * last thread of an odd count alone). */
static void pair_range(long n_items, int p, int nth, long *lo, long *hi)
{
    long lo2;
    pool_split(n_items, 1, 2 * p, nth, lo, hi);
    if (2 * p + 1 < nth)
        pool_split(n_items, 1, 2 * p + 1, nth, &lo2, hi);
}

/* A thread's place in decode_tile's items: the run whose q' its scratch holds, and
 * whether it has taken an item yet (its first item's K is asked for at once). */
struct tile_taker {
    struct scratch sc;
    struct scratch_heads hs;
    int ri, q_ri;
    bool first;
};

/* Takes one item of a pair's range (ends: front << 32 | rear) from its back or its front
 * into *w; false when none is left. */
static bool pair_take(_Atomic uint64_t *ends, bool back, long *w)
{
    uint64_t cur = atomic_load_explicit(ends, memory_order_relaxed);
    for (;;) {
        uint64_t front = cur >> 32, rear = cur & 0xffffffffu;
        if (front >= rear)
            return false;
        uint64_t want = back ? front << 32 | (rear - 1) : (front + 1) << 32 | rear;
        if (atomic_compare_exchange_weak_explicit(ends, &cur, want, memory_order_relaxed, memory_order_relaxed)) {
            *w = back ? (long)rear - 1 : (long)front;
            return true;
        }
    }
}

/* Takes pair p's items one at a time, from the back of its range or the front, until none
 * is left. */
static void take_pair_items(struct attn_job *j, struct tile_taker *tk, int p, int nth, bool back)
{
    struct attn *a = j->a;
    long lo, hi, w;
    pair_range(j->n_items, p, nth, &lo, &hi);
    while (pair_take(&a->ends[p], back, &w)) {
        long nw = back ? w - 1 : w + 1;
        int ri = tk->ri;
        while (ri > 0 && a->run_items[ri] > w)
            ri--;
        while (a->run_items[ri + 1] <= w)
            ri++;
        int64_t t = w - a->run_items[ri];
        bool same_run = nw >= a->run_items[ri] && nw < a->run_items[ri + 1] && nw >= lo && nw < hi;
        decode_tile(j, &tk->sc, &tk->hs, ri, t, tk->first, same_run ? nw - a->run_items[ri] : -1, ri != tk->q_ri);
        tk->ri = tk->q_ri = ri;
        tk->first = false;
    }
}

/* A cold batch's KV heads (the items of run_item's mode, no split) taken by pairs of
 * threads as decode_tile's tiles are: each pair a contiguous range of items, its first
 * thread from the front, its second from the back, then the other pairs' from their
 * backs. Each thread first asks for the K and V pieces of its share (pool_split) of the
 * items, block by block, in address order: a block's heads lie together, so a share's
 * pieces of one block are one run of bytes. Asked for head by head as run_item goes, each
 * head's 2 KiB pieces arrived one after another: small's decode (Zen 5 VM, 128 steps from
 * position 0) read its ~2.3 MiB of K and V a step in 0.14-0.26 ms, 9-17 GB/s where the
 * memory gives 50-55; its attention functions' perf samples per product-kernel sample fell
 * by a quarter with the shares asked for first. The items, and so the bits, are run_item's. */
#define HEADS_AHEAD_MAX ((size_t)512 << 10) /* bytes a thread asks for up front, at most */

/* Run-by-head item w: its run and KV head (the last runs first: later positions attend
 * over more of the cache). */
static void head_item(const struct attn_job *j, long w, int *ri, int *h)
{
    int n_kv = j->a->sh.n_head_kv;
    *ri = j->n_runs - 1 - (int)(w / n_kv);
    *h = (int)(w % n_kv);
}

/* Asks for (or with ask false, counts) the K and V bytes of run-by-head items [lo, hi). */
static size_t heads_ahead(const struct attn_job *j, long lo, long hi, bool ask)
{
    const struct attn *a = j->a;
    int n_kv = a->sh.n_head_kv, bt = j->bt;
    size_t k_piece = j->k_head * (size_t)bt, v_piece = j->v_head * (size_t)bt, bytes = 0;
    for (long w = lo; w < hi;) {
        int ri, h0;
        head_item(j, w, &ri, &h0);
        long w1 = (w / n_kv + 1) * n_kv < hi ? (w / n_kv + 1) * n_kv : hi; /* the run's items in range */
        size_t heads = (size_t)(w1 - w);
        int b0 = a->run_start[ri];
        int64_t end = j->pos[b0 + a->run_len[ri] - 1] + 1, from = first_seen(j, j->pos[b0]), n_blocks;
        const int32_t *table = kv_seq_blocks(j->kv, j->seq[b0], &n_blocks);
        for (int64_t p = from - from % bt; p < end; p += bt) {
            size_t blk = (size_t)table[p / bt] * (size_t)n_kv + (size_t)h0;
            const char *k = j->k_base + blk * k_piece, *v = j->v_base + blk * v_piece;
            bytes += heads * (k_piece + v_piece);
            for (size_t c = 0; ask && c < heads * k_piece; c += 64)
                __builtin_prefetch(k + c, 0, 2);
            for (size_t c = 0; ask && c < heads * v_piece; c += 64)
                __builtin_prefetch(v + c, 0, 2);
        }
        w = w1;
    }
    return bytes;
}

/* Takes pair p's run-by-head items one at a time, from the back of its range or the
 * front, until none is left. */
static void take_pair_heads(struct attn_job *j, struct scratch *sc, int p, bool back)
{
    struct attn *a = j->a;
    long w;
    while (pair_take(&a->ends[p], back, &w)) {
        int ri, h;
        head_item(j, w, &ri, &h);
        int64_t last = j->pos[a->run_start[ri] + a->run_len[ri] - 1];
        int64_t t_first = first_seen(j, j->pos[a->run_start[ri]]) / ATTN_TILE;
        for (int i = 0; j->prep && i < a->run_len[ri]; i++) /* the run's tokens are its sequence's only ones */
            j->prep(j->prep_ctx, a->run_start[ri] + i, h);
        run_item(j, sc, ri, h, t_first, last / ATTN_TILE + 1);
    }
}

static void attn_work(void *ctx, int ith, int nth)
{
    struct attn_job *j = ctx;
    struct attn *a = j->a;
    struct scratch sc = scratch_of(a, ith);
    int n_kv = a->sh.n_head_kv;
    if (j->by_tile) {
        /* Threads in pairs, each pair a contiguous range of items (its two threads' shares of
         * pool_split): the first takes items from the range's front up, the second from its
         * back down, one at a time, until they meet, so each reads on where it left off and
         * neither waits for the other at the end (a step's last tile is short, the calling
         * thread has more to do, other processes take a CPU for a while: a fixed split left a
         * thread idle at the barrier for a fifth of the step). A thread out of its pair's
         * items then takes the other pairs' from their backs, so every item is taken even
         * by the calling thread alone (pool_run_claims). The tiles' partials, and so the
         * bits, do not depend on which thread makes them. */
        struct tile_taker tk = {.sc = sc, .hs = scratch_heads_of(a, ith), .q_ri = -1, .first = true};
        int n_pairs = (nth + 1) / 2;
        take_pair_items(j, &tk, ith / 2, nth, ith % 2 == 1);
        for (int k = 1; k < n_pairs; k++)
            take_pair_items(j, &tk, (ith / 2 + k) % n_pairs, nth, true);
        return;
    }
    if (j->by_heads) {
        long lo, hi;
        pool_split(j->n_items, 1, ith, nth, &lo, &hi);
        if (heads_ahead(j, lo, hi, false) <= HEADS_AHEAD_MAX)
            heads_ahead(j, lo, hi, true);
        int n_pairs = (nth + 1) / 2;
        take_pair_heads(j, &sc, ith / 2, ith % 2 == 1);
        for (int k = 1; k < n_pairs; k++)
            take_pair_heads(j, &sc, (ith / 2 + k) % n_pairs, true);
        return;
    }
    for (;;) {
        long w = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (w >= j->n_items)
            return;
        if (!j->split) {
            /* the last runs first: later positions attend over more of the cache */
            int ri = j->n_runs - 1 - (int)(w / n_kv);
            int64_t last = j->pos[a->run_start[ri] + a->run_len[ri] - 1];
            int64_t t_first = first_seen(j, j->pos[a->run_start[ri]]) / ATTN_TILE;
            run_item(j, &sc, ri, (int)(w % n_kv), t_first, last / ATTN_TILE + 1);
            continue;
        }
        int ri = 0;
        while (a->run_items[ri + 1] <= w)
            ri++;
        long k = w - a->run_items[ri];
        long tiles = (a->run_items[ri + 1] - a->run_items[ri]) / n_kv;
        int64_t t_first = first_seen(j, j->pos[a->run_start[ri]]) / ATTN_TILE;
        run_item(j, &sc, ri, (int)(k / tiles), t_first + k % tiles, t_first + k % tiles + 1);
    }
}

/* prep of every (token, KV head), claimed a few at a time (the caller alone can do them all). */
static void prep_work(void *ctx, int ith, int nth)
{
    struct attn_job *j = ctx;
    long n_kv = j->a->sh.n_head_kv, lo, hi;
    (void)ith;
    while (pool_claim(&j->prep_next, j->n_prep, 1, nth, &lo, &hi))
        for (long w = lo; w < hi; w++)
            j->prep(j->prep_ctx, (int)(w / n_kv), (int)(w % n_kv));
}

/* merge of n tile partials in order ((hd + 2) floats each: o_t, m_t, l_t) into the state
 * sc->o, m[0], l[0], the first starting it. The maxima are a running max, known before any
 * exp, so the exps of up to max_rows tiles go to one exp_sub (merge's pairs one call each
 * were a fifth of a decode's merge step, waiting on each exp's latency): exp_sub(x, 0) of
 * x = m - mx is exp_sub(m, mx), bit for bit, as in merge_rows. */
static void merge_tiles(const struct vec_ops *vec, struct scratch *sc, const float *src, int64_t n, int max_rows,
                        int hd)
{
    merge(vec, sc->o, sc->m, sc->l, src, src[hd], src[hd + 1], hd, true);
    for (int64_t t0 = 1; t0 < n; t0 += max_rows) {
        int64_t cnt = n - t0 < max_rows ? n - t0 : max_rows;
        const float *p = src + (size_t)t0 * (size_t)(hd + 2);
        float m = sc->m[0];
        for (int64_t i = 0; i < cnt; i++, p += hd + 2) {
            /* the partial's lines, for the pass below: written long before by decode_tile,
             * they come from L3 */
            for (size_t c = 0; c < (size_t)(hd + 2) * sizeof *p; c += 64)
                __builtin_prefetch((const char *)p + c, 0, 3);
            float mt = p[hd], mx = m > mt ? m : mt;
            sc->fx[2 * i] = m - mx;
            sc->fx[2 * i + 1] = mt - mx;
            m = mx;
        }
        vec->exp_sub(sc->fx, 0.0f, 2 * cnt);
        p = src + (size_t)t0 * (size_t)(hd + 2);
        float *o = sc->o, l = sc->l[0];
        for (int64_t i = 0; i < cnt; i++, p += hd + 2) {
            float fa = sc->fx[2 * i], fb = sc->fx[2 * i + 1];
            l = l * fa + p[hd + 1] * fb;
            for (int k = 0; k < hd; k++)
                o[k] = o[k] * fa + p[k] * fb;
        }
        sc->m[0] = m;
        sc->l[0] = l;
    }
}

/* Split mode, second step: each (token, query head) merges its tiles in order. */
static void merge_work(void *ctx, int ith, int nth)
{
    struct attn_job *j = ctx;
    struct attn *a = j->a;
    int hd = a->sh.head_dim, n_head = a->sh.n_head;
    struct scratch sc = scratch_of(a, ith);
    long n_pairs = 0;
    for (int ri = 0; ri < j->n_runs; ri++)
        n_pairs += (long)a->run_len[ri] * n_head;
    (void)nth;
    for (;;) { /* claimed one at a time, so the calling thread alone can do them all */
        long w = atomic_fetch_add_explicit(&j->merge_next, 1, memory_order_relaxed);
        if (w >= n_pairs)
            return;
        int b = (int)(w / n_head), qh = (int)(w % n_head);
        int64_t t_first = first_seen(j, j->pos[b]) / ATTN_TILE, n_t = j->pos[b] / ATTN_TILE + 1;
        const float *src = a->split + ((size_t)(b * n_head + qh) * (size_t)a->n_tiles + (size_t)t_first) * (size_t)(hd + 2);
        merge_tiles(j->vec, &sc, src, n_t - t_first, a->rows, hd);
        finish_row(j->vec, j->out + (size_t)b * (size_t)j->q_dim + (size_t)qh * hd, sc.o, sc.m[0], sc.l[0], hd,
                   j->sinks ? j->sinks + qh : NULL);
    }
}

void attn_forward(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                  int n, const int32_t *seq, const int64_t *pos, const float *q, float *out)
{
    attn_forward_window(a, pool, vec, kv, layer, n, seq, pos, q, out, 0);
}

void attn_forward_window(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                         int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window)
{
    attn_forward_sinks(a, pool, vec, kv, layer, n, seq, pos, q, out, window, NULL);
}

void attn_forward_sinks(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                        int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window,
                        const float *sinks)
{
    attn_forward_prep(a, pool, vec, kv, layer, n, seq, pos, q, out, window, sinks, NULL, NULL);
}

void attn_forward_prep(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                       int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window,
                       const float *sinks, attn_prep_fn prep, void *prep_ctx)
{
    const struct kv_config *kc = kv_config(kv);
    int hd = a->sh.head_dim;
    struct attn_job j = {.a = a, .vec = vec, .kv = kv, .layer = layer, .seq = seq, .pos = pos, .q = q, .out = out};
    j.k_base = kv_k(kv, layer, 0);
    j.v_base = kv_v(kv, layer, 0);
    j.type_k = kc->type_k;
    j.type_v = kc->type_v;
    j.k_head = type_bytes(kc->type_k, hd);
    j.v_head = type_bytes(kc->type_v, hd);
    j.bt = kc->block_tokens;
    j.kv_dim = kc->kv_dim;
    j.q_dim = (int64_t)a->sh.n_head * hd;
    j.scale = a->scale;
    j.window = window > 0 ? window : 0;
    j.sinks = sinks;
    /* query tiles: runs of at most qt tokens of one sequence that follow each other */
    int n_runs = 0;
    int64_t max_pos = 0;
    for (int b = 0; b < n; b++) {
        max_pos = pos[b] > max_pos ? pos[b] : max_pos;
        if (n_runs && seq[b] == seq[b - 1] && a->run_len[n_runs - 1] < a->qt) {
            a->run_len[n_runs - 1]++;
            continue;
        }
        a->run_start[n_runs] = b;
        a->run_len[n_runs++] = 1;
    }
    j.n_runs = n_runs;
    int n_kv = a->sh.n_head_kv;
    /* Splitting the tiles costs a second pass over the threads (a barrier), worth it when
     * KV heads alone would leave threads idle; either way gives the same bits. */
    j.cold = n <= ATTN_SPLIT_MAX;
    j.split = j.cold && max_pos >= ATTN_TILE && n_runs * n_kv < 2 * pool_threads(pool);
    j.by_tile = j.cold && max_pos >= ATTN_TILE && by_tile_fits(&j);
    if (j.by_tile) {
        a->run_items[0] = 0;
        for (int ri = 0; ri < n_runs; ri++)
            a->run_items[ri + 1] = a->run_items[ri] + pos[a->run_start[ri] + a->run_len[ri] - 1] / ATTN_TILE + 1;
        j.n_items = (long)a->run_items[n_runs];
        j.split = true;
        int nth = pool_threads(pool);
        for (int p = 0; 2 * p < nth; p++) { /* attn_work's pairs of threads */
            long lo, hi;
            pair_range(j.n_items, p, nth, &lo, &hi);
            atomic_store_explicit(&a->ends[p], (uint64_t)lo << 32 | (uint64_t)hi, memory_order_relaxed);
        }
    } else if (j.split) {
        a->run_items[0] = 0;
        for (int ri = 0; ri < n_runs; ri++) {
            int64_t last = pos[a->run_start[ri] + a->run_len[ri] - 1];
            int64_t t_first = first_seen(&j, pos[a->run_start[ri]]) / ATTN_TILE;
            a->run_items[ri + 1] = a->run_items[ri] + (last / ATTN_TILE + 1 - t_first) * n_kv;
        }
        j.n_items = (long)a->run_items[n_runs];
    } else {
        j.n_items = (long)n_runs * n_kv;
        j.by_heads = j.cold;
        int nth = pool_threads(pool);
        for (int p = 0; j.by_heads && 2 * p < nth; p++) {
            long lo, hi;
            pair_range(j.n_items, p, nth, &lo, &hi);
            atomic_store_explicit(&a->ends[p], (uint64_t)lo << 32 | (uint64_t)hi, memory_order_relaxed);
        }
    }
    atomic_init(&j.next, 0);
    atomic_init(&j.merge_next, 0);
    atomic_init(&j.prep_next, 0);
    /* A run-by-head item preps its own tokens' head when no other run holds its sequence
     * (whose tokens would see them); else every (token, head) is prepped first: on the
     * caller for one token (a hand-off would cost about what it saves), on the pool for more. */
    bool runs_own_seqs = true;
    for (int r = 1; r < n_runs && runs_own_seqs; r++)
        for (int q0 = 0; q0 < r && runs_own_seqs; q0++)
            runs_own_seqs = seq[a->run_start[r]] != seq[a->run_start[q0]];
    if (prep && j.by_heads && runs_own_seqs) {
        j.prep = prep;
        j.prep_ctx = prep_ctx;
    } else if (prep && n == 1) {
        for (int h = 0; h < n_kv; h++)
            prep(prep_ctx, 0, h);
    } else if (prep) {
        j.prep = prep;
        j.prep_ctx = prep_ctx;
        j.n_prep = (long)n * n_kv;
        pool_run_claims(pool, prep_work, &j);
        j.prep = NULL;
    }
    /* Every item is claimed (tiles by pairs of threads, or KV heads or split tiles one at
     * a time, then the merges one at a time): the caller takes what others leave. */
    pool_run_claims(pool, attn_work, &j);
    if (j.split)
        pool_run_claims(pool, merge_work, &j);
}
