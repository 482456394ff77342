#include "engine/moe.h"

#include "base/clock.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/pool.h"
#include "kern/kern.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define N_KINDS 3

/* The weight type that stands for each activation kind when quantizing. */
static const int kind_type[N_KINDS] = {DT_F32, DT_Q8_0, DT_Q4_K};

struct moe {
    int n_embd, n_expert, n_used, n_ff;
    bool norm;
    bool oss;           /* gpt-oss's routing and clamped SwiGLU (moe.h) */
    int max_batch;
    float *logits;      /* (max_batch, n_expert) */
    int32_t *sel;       /* (max_batch, n_used): experts in top-k order */
    float *w;           /* (max_batch, n_used): their weights */
    int32_t *row;       /* (max_batch, n_used): the gathered row of each choice */
    int32_t *count;     /* (n_expert) tokens that chose each expert this step */
    int32_t *first;     /* (n_expert + 1) first gathered row of each expert */
    int32_t *chosen;    /* (n_expert) the experts any token chose this step, ascending */
    int32_t *row_token; /* (max_batch * n_used) token of each gathered row */
    int32_t *row_expert; /* (max_batch * n_used) expert of each gathered row */
    /* Activations quantized per kind: the batch's rows (n_embd), those rows gathered by
     * expert (n_embd), and the experts' gathered down inputs (n_ff). */
    void *xq[N_KINDS], *xg[N_KINDS], *hq[N_KINDS];
    size_t xrow[N_KINDS], hrow[N_KINDS];
    float *gu;          /* (max_batch * n_used, 2 n_ff) gathered: gate's and up's outputs, in the
                           layer's turns of rows (gu_turn) */
    float *out;         /* (max_batch * n_used, n_embd) gathered */
    long groups_max;    /* n_ff / 32 + 1: activation groups of an expert, blocks of 32 or more */
    _Atomic int *group_left; /* (n_expert, groups_max): gu_job's counts */
    _Atomic long *h_left;    /* (n_expert): per chosen expert, the pieces of h not yet ready for down */
    struct moe_stats stats;
};

static void *zalloc(size_t n) { return calloc(1, n ? n : 1); }

static void *aalloc(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

int moe_create(struct moe **out, const struct model_hparams *hp, int max_batch)
{
    *out = NULL;
    if (hp->n_expert < 1 || hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert || max_batch < 1)
        return CAIRN_EINVAL;
    struct moe *mo = calloc(1, sizeof *mo);
    if (!mo)
        return CAIRN_ENOMEM;
    mo->n_embd = hp->n_embd;
    mo->n_expert = hp->n_expert;
    mo->n_used = hp->n_expert_used;
    mo->n_ff = hp->n_ff_exp;
    mo->norm = hp->expert_norm;
    mo->oss = hp->oss;
    mo->max_batch = max_batch;
    size_t B = (size_t)max_batch, K = (size_t)hp->n_expert_used, R = B * K;
    mo->logits = zalloc(B * (size_t)mo->n_expert * sizeof(float));
    mo->sel = zalloc(R * sizeof(int32_t));
    mo->w = zalloc(R * sizeof(float));
    mo->row = zalloc(R * sizeof(int32_t));
    mo->count = zalloc((size_t)mo->n_expert * sizeof(int32_t));
    mo->first = zalloc(((size_t)mo->n_expert + 1) * sizeof(int32_t));
    mo->chosen = zalloc((size_t)mo->n_expert * sizeof(int32_t));
    mo->row_token = zalloc(R * sizeof(int32_t));
    mo->row_expert = zalloc(R * sizeof(int32_t));
    mo->gu = zalloc(R * 2 * (size_t)mo->n_ff * sizeof(float));
    mo->out = zalloc(R * (size_t)mo->n_embd * sizeof(float));
    mo->groups_max = mo->n_ff / 32 + 1;
    mo->group_left = zalloc((size_t)mo->n_expert * (size_t)mo->groups_max * sizeof *mo->group_left);
    mo->h_left = zalloc((size_t)mo->n_expert * sizeof *mo->h_left);
    bool ok = mo->logits && mo->sel && mo->w && mo->row && mo->count && mo->first && mo->chosen && mo->row_token &&
              mo->row_expert && mo->gu && mo->out && mo->group_left && mo->h_left;
    for (int k = 0; k < N_KINDS && ok; k++) {
        int blk = dtype_info(kind_type[k])->block_elems;
        if (mo->n_embd % blk == 0) {
            mo->xrow[k] = kern_act_row_bytes(kind_type[k], mo->n_embd);
            mo->xq[k] = aalloc(B * mo->xrow[k]);
            mo->xg[k] = aalloc(R * mo->xrow[k]);
            ok = mo->xq[k] && mo->xg[k];
        }
        if (ok && mo->n_ff % blk == 0) {
            mo->hrow[k] = kern_act_row_bytes(kind_type[k], mo->n_ff);
            mo->hq[k] = aalloc(R * mo->hrow[k]);
            ok = mo->hq[k] != NULL;
        }
    }
    if (!ok) {
        moe_release(mo);
        return CAIRN_ENOMEM;
    }
    *out = mo;
    return 0;
}

void moe_release(struct moe *mo)
{
    if (!mo)
        return;
    void *bufs[] = {mo->logits, mo->sel, mo->w, mo->row, mo->count, mo->first, mo->chosen, mo->row_token, mo->row_expert,
                    mo->gu, mo->out, (void *)mo->group_left, (void *)mo->h_left};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    for (int k = 0; k < N_KINDS; k++) {
        free(mo->xq[k]);
        free(mo->xg[k]);
        free(mo->hq[k]);
    }
    free(mo);
}

struct moe_stats moe_get_stats(const struct moe *mo) { return mo->stats; }

/* ---- products: many matrices, each over its own rows ---- */

/* A unit of the experts' products is about UNIT_BYTES of weights (unit_rows). */
#define UNIT_BYTES (48 << 10)

/* ---- element-wise steps, split by rows ---- */

struct rows_job {
    struct moe *mo;
    const struct model_layer *L;
    const struct vec_ops *vec;
    const float *x;
    int n;              /* rows */
    int kind[3];        /* activation kinds wanted (-1: none) */
};

/* Rows [lo, hi) of the batch quantized for the router's and the experts' kinds. */
static void quant_x_rows(struct rows_job *j, long lo, long hi)
{
    struct moe *mo = j->mo;
    for (int k = 0; k < 3; k++) {
        int kd = j->kind[k];
        if (kd < 0 || (k >= 1 && kd == j->kind[0]) || (k == 2 && kd == j->kind[1]))
            continue;
        for (long b = lo; b < hi; b++)
            kern_act_quantize(kind_type[kd], j->x + b * mo->n_embd, (char *)mo->xq[kd] + b * mo->xrow[kd], mo->n_embd);
    }
}

static void quant_x_run(void *ctx, int ith, int nth)
{
    long lo, hi;
    pool_split(((struct rows_job *)ctx)->n, 1, ith, nth, &lo, &hi);
    quant_x_rows(ctx, lo, hi);
}

/* ---- routing ---- */

/* The top k of p[n] (largest first, ties to the lower index) into sel[k] and w[k]. */
static void top_k(const float *p, int n, int k_used, int32_t *sel, float *w)
{
    for (int k = 0; k < k_used; k++) { /* insertion into a sorted list of k */
        sel[k] = -1;
        w[k] = -1.0f;
    }
    for (int e = 0; e < n; e++) {
        int k = k_used;
        while (k > 0 && (sel[k - 1] < 0 || p[e] > w[k - 1])) /* strictly larger: ties keep the lower expert first */
            k--;
        if (k == k_used)
            continue;
        for (int i = k_used - 1; i > k; i--) {
            sel[i] = sel[i - 1];
            w[i] = w[i - 1];
        }
        sel[k] = e;
        w[k] = p[e];
    }
}

/* gpt-oss: the top k of the (biased) logits, then their softmax as llama.cpp's soft_max
 * orders it: w[j] = exp(w[j] - w[0]) (w[0] the largest), the sum in double, each times
 * (float)(1 / sum). */
static void route_oss(struct moe *mo, const float *l, int b)
{
    int32_t *sel = mo->sel + (int64_t)b * mo->n_used;
    float *w = mo->w + (int64_t)b * mo->n_used;
    top_k(l, mo->n_expert, mo->n_used, sel, w);
    float mx = w[0];
    double sum = 0.0;
    for (int k = 0; k < mo->n_used; k++) {
        w[k] = expf(w[k] - mx);
        sum += (double)w[k];
    }
    float inv = (float)(1.0 / sum);
    for (int k = 0; k < mo->n_used; k++)
        w[k] = w[k] * inv;
}

/* Softmax of one token's router logits, its top k (largest first, ties to the lower
 * expert) and their weights, per moe.h. */
static void route(struct moe *mo, const struct model_layer *L, int b)
{
    float *l = mo->logits + (int64_t)b * mo->n_expert;
    float p[1024]; /* n_expert <= 1024 (arch.c) */
    if (mo->oss) {
        for (int e = 0; e < mo->n_expert; e++)
            l[e] = l[e] + L->router_b[e];
        route_oss(mo, l, b);
        return;
    }
    float mx = l[0];
    for (int e = 1; e < mo->n_expert; e++)
        mx = l[e] > mx ? l[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < mo->n_expert; e++) {
        p[e] = expf(l[e] - mx);
        sum = sum + p[e];
    }
    for (int e = 0; e < mo->n_expert; e++)
        p[e] = p[e] / sum;
    int32_t *sel = mo->sel + (int64_t)b * mo->n_used;
    float *w = mo->w + (int64_t)b * mo->n_used;
    top_k(p, mo->n_expert, mo->n_used, sel, w);
    if (mo->norm) {
        float s = 0.0f;
        for (int k = 0; k < mo->n_used; k++)
            s = s + w[k];
        s = s < 6.103515625e-5f ? 6.103515625e-5f : s; /* llama.cpp's clamp, the least normal F16 */
        for (int k = 0; k < mo->n_used; k++)
            w[k] = w[k] / s;
    }
}

/* ---- the experts' products, fused with the element-wise steps around them ---- */

/* Spins, then yields, until *v is want (as the pool's waiters do). */
static void wait_long(_Atomic long *v, long want)
{
    for (int spins = 0; atomic_load_explicit(v, memory_order_acquire) != want; spins++)
        if (spins < 4000)
            cpu_relax();
        else
            sched_yield();
}

/* Gate and up with the activation: a unit is the columns [c0, c1) of h (rows of the gate
 * and up matrices) of one chosen expert over all the tokens that chose it. The activation
 * and h's quantization for down run by groups of columns, each a whole number of the
 * down input's activation blocks (a block's quantization reads that block alone): no pass
 * over h after the products, and one dispatch for all of it.
 *  - units of a group or more (a group is a unit): the unit applies the activation to
 *    its own columns;
 *  - units smaller than a block (Qwen3-30B-A3B: a Q8_K block of h is 256 columns, 576
 *    KiB of gate and up in Q4_K, three a chosen expert, so the last claims of a step
 *    were 576 KiB and a thread waited for the other at the end of each layer): a group
 *    is one block, and whichever thread finishes the group's last unit (a count per
 *    group) applies the activation to the whole group, reading what the other threads
 *    wrote before their count went down.
 * Either way each value of h is the same sequence of operations. */
struct gu_job {
    struct moe *mo;
    const struct model_layer *L;
    const struct vec_ops *vec;
    int k_gate, k_up, k_down;
    int n_sel;               /* chosen experts, ascending, in mo->chosen */
    long cols;               /* columns of h per unit */
    long units_per_expert;
    long group;              /* columns of an activation group (a multiple of cols, or cols) */
    long groups_per_expert;
    _Atomic int *left;       /* units not yet done of each group (chosen index x group), or
                                NULL when a unit is a group */
    _Atomic long next;
    _Atomic long experts_left; /* chosen experts whose h is not yet all ready */
    int64_t t_h_ready;       /* when the last of them was (the clock of the thread that made it) */
};

/* n pieces of chosen expert i's h are ready for down (activated and quantized): the
 * counts of mo->h_left, one piece a unit (a unit is a group) or a group. The release
 * pairs with the acquire of wait_long in down_run, so down reads the h this thread wrote. */
static void h_ready(struct gu_job *j, long i, long n)
{
    if (atomic_fetch_sub_explicit(&j->mo->h_left[i], n, memory_order_acq_rel) != n)
        return;
    if (atomic_fetch_sub_explicit(&j->experts_left, 1, memory_order_acq_rel) == 1)
        j->t_h_ready = clock_ns();
}

/* Units are claimed by guided self-scheduling (pool_claim), as the engine's dense
 * products claim theirs: a thread reads long runs of a matrix's rows, where claiming one
 * unit at a time had it start a new short stream every 50-100 KiB (the experts' products
 * read 10-15% slower than dense matrices that way: bench/moe_stream.c). */
static bool claim_units(_Atomic long *next, long total, int nth, long *lo, long *hi)
{
    return pool_claim(next, total, 1, nth, lo, hi);
}

/* Gate and up of one expert over columns [c0, c1) of h (c0 on a turn of the layer's fused
 * matrix), into its gathered rows of mo->gu. Fused, columns [c0, c1) of both are the
 * matrix's rows [2 c0, 2 c1): one run. */
static void gate_up_cols(struct gu_job *j, int e, int64_t c0, int64_t c1)
{
    struct moe *mo = j->mo;
    const struct model_layer *L = j->L;
    size_t ld = 2 * (size_t)mo->n_ff;
    size_t xg_row = mo->xrow[j->k_gate], xu_row = mo->xrow[j->k_up];
    size_t r0 = (size_t)mo->first[e];
    int cnt = mo->first[e + 1] - mo->first[e];
    float *y = mo->gu + r0 * ld;
    if (L->exp_gate_up) {
        kern_matmul(L->exp_gate_up[e], (char *)mo->xg[j->k_gate] + r0 * xg_row, xg_row, cnt, y, ld, 2 * c0, 2 * c1);
        return;
    }
    kern_matmul(L->exp_gate[e], (char *)mo->xg[j->k_gate] + r0 * xg_row, xg_row, cnt, y, ld, c0, c1);
    kern_matmul(L->exp_up[e], (char *)mo->xg[j->k_up] + r0 * xu_row, xu_row, cnt, y + mo->n_ff, ld, c0, c1);
}

/* Rows of gate, then of up, in each turn of a gathered row of mo->gu: the fused matrix's
 * (model.h), or n_ff (gate's outputs, then up's). */
static int64_t gu_turn(const struct moe *mo, const struct model_layer *L)
{
    return L->exp_gate_up ? L->exp_gu_rows : mo->n_ff;
}

/* Columns of h activated at once (on the stack): a multiple of every activation block. */
#define ACT_CHUNK 1024

/* h over columns [a, b) of gathered row r of expert e into h[0, b - a): each column's
 * gate and up from its turn of mo->gu. The activation is element by element (vec.h's
 * silu_mul, swiglu_oai), so its runs change no bit. */
static void act_run(struct gu_job *j, int e, size_t r, int64_t a, int64_t b, float *h)
{
    struct moe *mo = j->mo;
    const struct model_layer *L = j->L;
    int64_t n_ff = mo->n_ff, turn = gu_turn(mo, L);
    const float *row = mo->gu + r * 2 * (size_t)n_ff;
    for (int64_t c = a; c < b;) {
        int64_t t0 = c / turn * turn, len = n_ff - t0 < turn ? n_ff - t0 : turn;
        int64_t n = t0 + len < b ? t0 + len - c : b - c;
        const float *g = row + 2 * t0 + (c - t0), *up = g + len;
        float *hc = h + (c - a);
        memcpy(hc, g, (size_t)n * sizeof *hc);
        if (mo->oss)
            j->vec->swiglu_oai(hc, up, L->exp_gate_b + (size_t)e * n_ff + c, L->exp_up_b + (size_t)e * n_ff + c, n);
        else
            j->vec->silu_mul(hc, up, n);
        c += n;
    }
}

/* The activation of one expert's columns [c0, c1) of h and their quantization for down
 * (c0 and c1 on the down input's block boundaries, or c1 = n_ff). */
static void act_cols(struct gu_job *j, int e, int64_t c0, int64_t c1)
{
    struct moe *mo = j->mo;
    size_t h_row = mo->hrow[j->k_down];
    int blk = dtype_info(kind_type[j->k_down])->block_elems;
    size_t blk_bytes = kern_act_row_bytes(kind_type[j->k_down], blk);
    size_t r0 = (size_t)mo->first[e];
    int cnt = mo->first[e + 1] - mo->first[e];
    float h[ACT_CHUNK];
    for (size_t r = r0; r < r0 + (size_t)cnt; r++)
        for (int64_t a = c0; a < c1; a += ACT_CHUNK) {
            int64_t b = a + ACT_CHUNK < c1 ? a + ACT_CHUNK : c1;
            act_run(j, e, r, a, b, h);
            kern_act_quantize(kind_type[j->k_down], h, (char *)mo->hq[j->k_down] + r * h_row + (size_t)(a / blk) * blk_bytes,
                              b - a);
        }
}

/* Gate and up of chosen expert i over [c0, c1) (whole units), then the activation of
 * every group of it that they complete. */
static void gate_up_piece(struct gu_job *j, long i, int64_t c0, int64_t c1)
{
    int e = j->mo->chosen[i];
    gate_up_cols(j, e, c0, c1);
    if (!j->left) {
        act_cols(j, e, c0, c1);
        h_ready(j, i, (c1 - c0 + j->cols - 1) / j->cols);
        return;
    }
    int64_t n_ff = j->mo->n_ff;
    for (int64_t g0 = c0 / j->group * j->group; g0 < c1; g0 += j->group) {
        int64_t g1 = g0 + j->group < n_ff ? g0 + j->group : n_ff;
        int64_t a = c0 > g0 ? c0 : g0, b = c1 < g1 ? c1 : g1;
        int done = (int)((b - a + j->cols - 1) / j->cols); /* units of the group in this piece */
        _Atomic int *left = &j->left[i * j->groups_per_expert + g0 / j->group];
        /* acq_rel: the last to count down sees the others' gate and up outputs */
        if (atomic_fetch_sub_explicit(left, done, memory_order_acq_rel) == done) {
            act_cols(j, e, g0, g1);
            h_ready(j, i, 1);
        }
    }
}

/* Gate and up outputs one piece of a claim leaves for its activation (a large batch's
 * claim is cut so that they are still in cache). */
#define GU_PIECE_BYTES (256 << 10)

/* Why the fused decode dispatch cannot deadlock: gate and up work never waits, and a
 * thread starts down (down_run, which waits per expert for its h) only after every gate
 * and up unit has been claimed, so each unit it may wait for is held by a thread that is
 * running it. A wait inside gu_run, or claims of the two interleaved, would break this. */
static void gu_run(void *ctx, int ith, int nth)
{
    (void)ith;
    struct gu_job *j = ctx;
    struct moe *mo = j->mo;
    long upe = j->units_per_expert, total = (long)j->n_sel * upe, lo, hi;
    while (claim_units(&j->next, total, nth, &lo, &hi)) {
        for (long u = lo; u < hi;) { /* each chosen expert's run of the claim */
            long i = u / upe, ue = (i + 1) * upe < hi ? (i + 1) * upe : hi;
            int e = mo->chosen[i];
            int cnt = mo->first[e + 1] - mo->first[e];
            long piece = (long)(GU_PIECE_BYTES / (2 * sizeof(float) * (size_t)cnt)) / j->group * j->group;
            piece = piece < j->group ? j->group : piece;
            int64_t c0 = (u - i * upe) * j->cols, c1 = (ue - i * upe) * j->cols;
            c1 = c1 < mo->n_ff ? c1 : mo->n_ff;
            for (int64_t p0 = c0; p0 < c1; p0 += piece)
                gate_up_piece(j, i, p0, p0 + piece < c1 ? p0 + piece : c1);
            u = ue;
        }
    }
}

/* Down with the combination. Two schedules, the same products and sums per value:
 *  - by columns (a large batch): a unit is the output columns [r0, r1) (rows of the down
 *    matrices) of every chosen expert over its tokens, then of every token the
 *    combination over those columns;
 *  - by experts (a small batch: a decode step): a unit is a run of rows of one chosen
 *    expert's down matrix, units in expert order, so a claim streams one or two experts'
 *    matrices whole instead of short pieces of all of them (claims by columns read a
 *    Qwen3 expert's 0.4-0.6 MiB down matrix in pieces of 10-40 KiB each, 10-15% slower
 *    per CPU second: bench/moe_stream.c); the combination, a few thousand multiply-adds
 *    a token, then runs on the calling thread.
 * The combination (moe.h's order): the down bias, then m = o_0 * w_0 and m = m + o_j * w_j
 * in top-k order, added to the residual: y = y + m. */
struct down_job {
    struct moe *mo;
    const struct model_layer *L;
    int k_down;
    int n_sel;
    int B;
    bool by_expert;          /* by experts runs in gate and up's dispatch (step_run): an expert's
                                down waits there for its h */
    long rows;               /* output columns per unit */
    long units;              /* by columns: units in all; by experts: units per expert */
    float *y;
    _Atomic long next;
};

/* Down of chosen expert i over its output rows [r0, r1). */
static void down_rows(struct down_job *j, int i, int64_t r0, int64_t r1)
{
    struct moe *mo = j->mo;
    int e = mo->chosen[i];
    size_t g0 = (size_t)mo->first[e], h_row = mo->hrow[j->k_down];
    kern_matmul(j->L->exp_down[e], (char *)mo->hq[j->k_down] + g0 * h_row, h_row, mo->first[e + 1] - mo->first[e],
                mo->out + g0 * (size_t)mo->n_embd, (size_t)mo->n_embd, r0, r1);
}

/* Every token's mixture over the output columns [c0, c1), added to y. */
static void combine_cols(struct moe *mo, const struct model_layer *L, int B, float *y_all, int64_t c0, int64_t c1)
{
    int64_t n = mo->n_embd;
    for (int b = 0; b < B; b++) {
        float *m = NULL; /* the mixture, built in the first choice's output row */
        for (int k = 0; k < mo->n_used; k++) {
            int r = mo->row[b * mo->n_used + k];
            float *o = mo->out + (int64_t)r * n;
            float w = mo->w[b * mo->n_used + k];
            if (mo->oss) { /* the down product's bias first (its own row: each gathered row is one choice) */
                const float *bd = L->exp_down_b + (int64_t)mo->row_expert[r] * n;
                for (int64_t i = c0; i < c1; i++)
                    o[i] = o[i] + bd[i];
            }
            if (k == 0) {
                m = o;
                for (int64_t i = c0; i < c1; i++)
                    m[i] = o[i] * w;
            } else {
                for (int64_t i = c0; i < c1; i++)
                    m[i] = m[i] + o[i] * w;
            }
        }
        float *y = y_all + b * n;
        for (int64_t i = c0; i < c1; i++)
            y[i] = y[i] + m[i];
    }
}

static void down_run(void *ctx, int ith, int nth)
{
    (void)ith;
    struct down_job *j = ctx;
    struct moe *mo = j->mo;
    int64_t n = mo->n_embd;
    long lo, hi;
    if (j->by_expert) {
        long upe = j->units;
        while (claim_units(&j->next, (long)j->n_sel * upe, nth, &lo, &hi)) {
            for (long u = lo; u < hi;) { /* each chosen expert's run of the claim */
                long i = u / upe, ue = (i + 1) * upe < hi ? (i + 1) * upe : hi;
                int64_t r0 = (u - i * upe) * j->rows, r1 = (ue - i * upe) * j->rows;
                wait_long(&mo->h_left[i], 0);
                down_rows(j, (int)i, r0, r1 < n ? r1 : n);
                u = ue;
            }
        }
        return;
    }
    while (claim_units(&j->next, j->units, nth, &lo, &hi)) {
        int64_t c0 = lo * j->rows, c1 = hi * j->rows < n ? hi * j->rows : n;
        for (int i = 0; i < j->n_sel; i++)
            down_rows(j, i, c0, c1);
        combine_cols(mo, j->L, j->B, j->y, c0, c1);
    }
}

/* Rows per unit: about UNIT_BYTES of weights at row_bytes a row, a multiple of align. */
static long unit_rows(size_t row_bytes, long align)
{
    long n = (long)(UNIT_BYTES / (row_bytes ? row_bytes : 1)) / align * align;
    return n < align ? align : n;
}

/* Down's schedule for the n_sel chosen experts (dj's by_expert set). */
static void down_setup(struct down_job *dj, int n_sel)
{
    struct moe *mo = dj->mo;
    const struct kern_mat *d0 = dj->L->exp_down[mo->chosen[0]];
    size_t down_row_bytes = kern_mat_bytes(d0) / (size_t)mo->n_embd;
    dj->n_sel = n_sel;
    dj->rows = unit_rows(down_row_bytes * (dj->by_expert ? 1 : (size_t)n_sel), kern_mat_row_align(d0));
    dj->units = (mo->n_embd + dj->rows - 1) / dj->rows;
    atomic_init(&dj->next, 0);
}

/* ---- one dispatch from the router to the activation, or to down ---- */

/* The router's product with the experts' inputs quantized, the choices and the gathered
 * inputs, then gate, up and the activation, in one dispatch: the threads claim the batch's
 * rows to quantize for gate and up, then runs of the router's rows (all claimed, so the
 * caller alone can do it all: pool_run_claims); thread
 * 0 (the caller) waits for the last of that work, routes, groups and gathers, and
 * releases the others into gu_run. The router reads x itself when its activations are
 * F32 (a float router: every qwen3moe and gpt-oss file); otherwise its input was
 * quantized before. A decode step's router is 1 MiB of F32 weights a layer in
 * Qwen3-30B-A3B: on the calling thread alone it read at one thread's share of memory
 * while the others waited (5% of a token); as a dispatch of its own it added a barrier a
 * layer, which costs milliseconds when a neighbour holds the core of a thread that must
 * check in. Here a thread that comes late finds the router done and joins gate and up.
 * Each logit is one kern_matmul row whichever thread computes it, so the split changes
 * no bit.
 * A decode step (down by experts) runs down in the same dispatch: a thread out of gate
 * and up units claims down's units (experts in order, as the gate and up claims went)
 * and waits, per expert, until that expert's h is whole (mo->h_left). Down is then no
 * barrier of its own: a thread that finishes its last gate and up claim goes on to the
 * first experts' down while the other finishes the last expert's gate and up, where
 * the two dispatches had it wait for that at the barrier (and, with a neighbour on the
 * core, for the other thread's wake-up after it). The same products per value. */
struct step_job {
    struct rows_job q;       /* the kinds still to quantize (gate's and up's) */
    const struct kern_mat *router;
    const void *xr;          /* the router's input rows */
    size_t ldx;
    long rows, align;        /* the router's rows (n_expert), claimed in multiples of align */
    _Atomic long next_row;   /* the rows to quantize */
    _Atomic long next;       /* the router's units */
    _Atomic long work_left;  /* rows to quantize and router units not yet done */
    _Atomic long routed;     /* set by thread 0 when gj is ready */
    struct gu_job gj;        /* its n_sel and schedule set by thread 0 */
    struct down_job dj;      /* with dj.by_expert: down in this dispatch, its schedule set by thread 0 */
    uint64_t bytes, down_bytes; /* the chosen experts' */
    int64_t t_routed, t_gathered; /* thread 0's clock */
};

/* The choices of B tokens grouped by expert: gathered rows in expert order, tokens
 * ascending; the count of chosen experts. */
static int group_choices(struct moe *mo, const struct model_layer *L, int B)
{
    int K = mo->n_used;
    memset(mo->count, 0, (size_t)mo->n_expert * sizeof *mo->count);
    for (int b = 0; b < B; b++) {
        route(mo, L, b);
        for (int k = 0; k < K; k++)
            mo->count[mo->sel[b * K + k]]++;
    }
    int n_sel = 0;
    mo->first[0] = 0;
    for (int e = 0; e < mo->n_expert; e++) {
        mo->first[e + 1] = mo->first[e] + mo->count[e];
        if (mo->count[e])
            mo->chosen[n_sel++] = e;
    }
    memset(mo->count, 0, (size_t)mo->n_expert * sizeof *mo->count);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) {
            int e = mo->sel[b * K + k];
            int r = mo->first[e] + mo->count[e]++;
            mo->row[b * K + k] = r;
            mo->row_token[r] = b;
            mo->row_expert[r] = e;
        }
    return n_sel;
}

/* The experts' inputs gathered (their rows in gathered order) and the chosen experts'
 * bytes. */
static void gather_inputs(struct step_job *sj, int B, int n_sel)
{
    struct moe *mo = sj->q.mo;
    const struct model_layer *L = sj->gj.L;
    int R = B * mo->n_used, k_gate = sj->gj.k_gate, k_up = sj->gj.k_up;
    for (int kd = 0; kd < N_KINDS; kd++) {
        if (kd != k_gate && kd != k_up)
            continue;
        for (int r = 0; r < R; r++)
            memcpy((char *)mo->xg[kd] + (size_t)r * mo->xrow[kd],
                   (const char *)mo->xq[kd] + (size_t)mo->row_token[r] * mo->xrow[kd], mo->xrow[kd]);
    }
    uint64_t bytes = 0, down_bytes = 0;
    for (int i = 0; i < n_sel; i++) {
        int e = mo->chosen[i];
        bytes += model_expert_gate_up_bytes(L, e) + model_expert_bias_bytes(L, e);
        down_bytes += kern_mat_bytes(L->exp_down[e]);
    }
    sj->bytes = bytes;
    sj->down_bytes = down_bytes;
}

/* Gate and up's schedule: units and activation groups (gu_job), and the groups' counts. */
static void gu_setup(struct gu_job *gj_out, int n_sel)
{
    struct gu_job *j = gj_out;
    struct moe *mo = j->mo;
    const struct model_layer *L = j->L;
    int k_down = j->k_down;
    int e0 = mo->chosen[0];
    long align = L->exp_gate_up ? L->exp_gu_rows /* a turn: whole units read one run */
                                : (long)row_align_lcm(kern_mat_row_align(L->exp_gate[e0]), kern_mat_row_align(L->exp_up[e0]));
    long blk = dtype_info(kind_type[k_down])->block_elems;
    size_t col_bytes = model_expert_gate_up_bytes(L, e0) / (size_t)mo->n_ff;
    j->n_sel = n_sel;
    j->cols = unit_rows(col_bytes, align);
    while (j->cols > align && j->cols < blk && blk % j->cols) /* a unit smaller than a block: a divisor of it */
        j->cols -= align;
    if (j->cols >= blk || blk % j->cols || mo->n_ff / blk + 1 > mo->groups_max) { /* a unit is a group */
        j->cols = unit_rows(col_bytes, (long)row_align_lcm(align, blk));
        j->group = j->cols;
    } else {
        j->group = blk;
        j->left = mo->group_left;
    }
    j->units_per_expert = (mo->n_ff + j->cols - 1) / j->cols;
    j->groups_per_expert = (mo->n_ff + j->group - 1) / j->group;
    for (long i = 0; i < n_sel; i++)
        atomic_init(&mo->h_left[i], j->left ? j->groups_per_expert : j->units_per_expert);
    atomic_init(&j->experts_left, n_sel);
    for (long i = 0; j->left && i < n_sel; i++)
        for (long g = 0; g < j->groups_per_expert; g++) {
            long c0 = g * j->group, c1 = c0 + j->group < mo->n_ff ? c0 + j->group : mo->n_ff;
            atomic_init(&j->left[i * j->groups_per_expert + g], (int)((c1 - c0 + j->cols - 1) / j->cols));
        }
    atomic_init(&j->next, 0);
}

static void step_run(void *ctx, int ith, int nth)
{
    struct step_job *j = ctx;
    struct moe *mo = j->q.mo;
    long lo, hi;
    while (claim_units(&j->next_row, j->q.n, nth, &lo, &hi)) {
        quant_x_rows(&j->q, lo, hi);
        atomic_fetch_sub_explicit(&j->work_left, hi - lo, memory_order_release);
    }
    long units = (j->rows + j->align - 1) / j->align;
    while (claim_units(&j->next, units, nth, &lo, &hi)) {
        int64_t r1 = hi * j->align;
        kern_matmul(j->router, j->xr, j->ldx, j->q.n, mo->logits, (size_t)mo->n_expert, lo * j->align,
                    r1 < j->rows ? r1 : j->rows);
        atomic_fetch_sub_explicit(&j->work_left, hi - lo, memory_order_release);
    }
    if (ith == 0) {
        wait_long(&j->work_left, 0);
        int n_sel = group_choices(mo, j->gj.L, j->q.n);
        j->t_routed = clock_ns();
        gather_inputs(j, j->q.n, n_sel);
        gu_setup(&j->gj, n_sel);
        if (j->dj.by_expert)
            down_setup(&j->dj, n_sel);
        j->t_gathered = clock_ns();
        atomic_store_explicit(&j->routed, 1, memory_order_release);
    } else {
        wait_long(&j->routed, 1);
    }
    gu_run(&j->gj, ith, nth);
    if (j->dj.by_expert)
        down_run(&j->dj, ith, nth);
}

/* Down runs by experts, with the combination on the calling thread (choices x n_embd
 * multiply-adds), while the batch makes at most this many choices: a decode batch of up
 * to 8 tokens of Qwen3-30B-A3B (8 per token) or 16 of gpt-oss-20b (4). A prompt runs by
 * columns, so tests see both schedules give the same bits. */
#define DOWN_BY_EXPERT_CHOICES 64

void moe_forward(struct moe *mo, struct pool *pool, const struct vec_ops *vec, const struct model_layer *L,
                 const float *x, int B, float *y)
{
    int K = mo->n_used;
    int k_router = kern_act_kind(kern_mat_type(L->router));
    const struct kern_mat *gate0 = L->exp_gate_up ? L->exp_gate_up[0] : L->exp_gate[0];
    int k_gate = kern_act_kind(kern_mat_type(gate0));
    int k_up = kern_act_kind(kern_mat_type(L->exp_gate_up ? gate0 : L->exp_up[0]));
    int k_down = kern_act_kind(kern_mat_type(L->exp_down[0]));
    int64_t t0 = clock_ns(), t1;

    /* the router, the choices, the gathered inputs, then gate, up and the activation, and
     * in a decode step down: one dispatch (step_run) */
    int R = B * K;
    bool by_expert = R <= DOWN_BY_EXPERT_CHOICES;
    struct step_job sj = {.q = {.mo = mo, .vec = vec, .x = x, .n = B, .kind = {-1, k_gate, k_up}},
                          .router = L->router, .rows = kern_mat_rows(L->router),
                          .align = kern_mat_row_align(L->router),
                          .gj = {.mo = mo, .L = L, .vec = vec, .k_gate = k_gate, .k_up = k_up, .k_down = k_down},
                          .dj = {.mo = mo, .L = L, .k_down = k_down, .B = B, .y = y, .by_expert = by_expert}};
    if (k_router == KERN_ACT_F32) {
        sj.xr = x;
        sj.ldx = (size_t)mo->n_embd * sizeof(float);
    } else {
        struct rows_job qr = {.mo = mo, .vec = vec, .x = x, .n = B, .kind = {k_router, -1, -1}};
        pool_run(pool, quant_x_run, &qr);
        sj.xr = mo->xq[k_router];
        sj.ldx = mo->xrow[k_router];
        sj.q.kind[1] = k_gate == k_router ? -1 : k_gate; /* the kinds not yet quantized */
        sj.q.kind[2] = k_up == k_router || k_up == k_gate ? -1 : k_up;
    }
    atomic_init(&sj.next_row, 0);
    atomic_init(&sj.next, 0);
    atomic_init(&sj.work_left, B + (sj.rows + sj.align - 1) / sj.align);
    atomic_init(&sj.routed, 0);
    pool_run_claims(pool, step_run, &sj); /* all claimed: the caller takes what others leave */
    t1 = clock_ns();
    /* fused with down: gate+up's time ends when the last expert's h was whole */
    int64_t t_gu_end = by_expert ? sj.gj.t_h_ready : t1;
    mo->stats.ns_route += (uint64_t)(sj.t_routed - t0);
    mo->stats.ns_gather += (uint64_t)(sj.t_gathered - sj.t_routed);
    mo->stats.ns_gate_up += (uint64_t)(t_gu_end - sj.t_gathered);
    t0 = t_gu_end;
    int n_sel = sj.gj.n_sel;
    uint64_t bytes = sj.bytes, down_bytes = sj.down_bytes;

    /* down of every chosen expert (in a dispatch of its own for a batch of more than
     * DOWN_BY_EXPERT_CHOICES choices), and the combination */
    if (!by_expert) {
        down_setup(&sj.dj, n_sel);
        pool_run_claims(pool, down_run, &sj.dj);
    } else {
        combine_cols(mo, L, B, y, 0, mo->n_embd);
    }
    t1 = clock_ns();
    mo->stats.ns_down += (uint64_t)(t1 - t0);

    mo->stats.steps++;
    mo->stats.token_choices += (uint64_t)R;
    mo->stats.expert_runs += (uint64_t)n_sel;
    mo->stats.expert_bytes += bytes + down_bytes;
    mo->stats.down_bytes += down_bytes;
    mo->stats.down_by_expert += by_expert;
    mo->stats.act_shared += sj.gj.left != NULL;
}
