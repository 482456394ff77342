#include "engine/moe.h"

#include "base/dtype.h"
#include "base/err.h"
#include "kern/kern.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define N_KINDS 3

/* The weight type that stands for each activation kind when quantizing. */
static const int kind_type[N_KINDS] = {DT_F32, DT_Q8_0, DT_Q4_K};

/* One product of a step: a matrix over B activation rows. */
struct moe_item {
    const struct kern_mat *m;
    const void *xq;
    size_t ldx;
    int B;
    float *y;
    size_t ldy;
    long unit_rows;
};

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
    int32_t *row_token; /* (max_batch * n_used) token of each gathered row */
    int32_t *row_expert; /* (max_batch * n_used) expert of each gathered row */
    /* Activations quantized per kind: the batch's rows (n_embd), those rows gathered by
     * expert (n_embd), and the experts' gathered down inputs (n_ff). */
    void *xq[N_KINDS], *xg[N_KINDS], *hq[N_KINDS];
    size_t xrow[N_KINDS], hrow[N_KINDS];
    float *gate, *up;   /* (max_batch * n_used, n_ff) gathered */
    float *out;         /* (max_batch * n_used, n_embd) gathered */
    struct moe_item *items; /* 2 * n_expert + 1 */
    long *first_unit;       /* 2 * n_expert + 2 */
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
    mo->row_token = zalloc(R * sizeof(int32_t));
    mo->row_expert = zalloc(R * sizeof(int32_t));
    mo->gate = zalloc(R * (size_t)mo->n_ff * sizeof(float));
    mo->up = zalloc(R * (size_t)mo->n_ff * sizeof(float));
    mo->out = zalloc(R * (size_t)mo->n_embd * sizeof(float));
    mo->items = zalloc((2 * (size_t)mo->n_expert + 1) * sizeof *mo->items);
    mo->first_unit = zalloc((2 * (size_t)mo->n_expert + 2) * sizeof *mo->first_unit);
    bool ok = mo->logits && mo->sel && mo->w && mo->row && mo->count && mo->first && mo->row_token &&
              mo->row_expert && mo->gate && mo->up && mo->out && mo->items && mo->first_unit;
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
    void *bufs[] = {mo->logits, mo->sel, mo->w, mo->row, mo->count, mo->first, mo->row_token, mo->row_expert,
                    mo->gate, mo->up, mo->out, mo->items, mo->first_unit};
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

/* A unit is a run of rows of one item (about UNIT_BYTES of weights, a multiple of the
 * matrix's row alignment); threads claim units one at a time. Each output row is
 * computed whole by one kern_matmul call, so which thread takes it changes no bit. */
#define UNIT_BYTES (48 << 10)

struct mm_job {
    const struct moe_item *items;
    const long *first_unit; /* item i's units are [first_unit[i], first_unit[i+1]) */
    int n_items;
    _Atomic long next;
};

static void mm_run(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct mm_job *j = ctx;
    long total = j->first_unit[j->n_items];
    for (long u; (u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < total;) {
        int lo = 0, hi = j->n_items - 1; /* the item whose units hold u */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (j->first_unit[mid] <= u)
                lo = mid;
            else
                hi = mid - 1;
        }
        const struct moe_item *it = &j->items[lo];
        int64_t rows = kern_mat_rows(it->m);
        int64_t r0 = (u - j->first_unit[lo]) * it->unit_rows, r1 = r0 + it->unit_rows;
        kern_matmul(it->m, it->xq, it->ldx, it->B, it->y, it->ldy, r0, r1 < rows ? r1 : rows);
    }
}

static void run_items(struct moe *mo, struct pool *pool, int n_items)
{
    mo->first_unit[0] = 0;
    for (int i = 0; i < n_items; i++) {
        struct moe_item *it = &mo->items[i];
        int64_t rows = kern_mat_rows(it->m);
        long align = kern_mat_row_align(it->m);
        size_t row_bytes = kern_mat_bytes(it->m) / (size_t)(rows > 0 ? rows : 1);
        long n = (long)(UNIT_BYTES / (row_bytes ? row_bytes : 1)) / align * align;
        it->unit_rows = n < align ? align : n;
        mo->first_unit[i + 1] = mo->first_unit[i] + (long)((rows + it->unit_rows - 1) / it->unit_rows);
    }
    struct mm_job j = {.items = mo->items, .first_unit = mo->first_unit, .n_items = n_items};
    atomic_init(&j.next, 0);
    pool_run(pool, mm_run, &j);
}

/* ---- element-wise steps, split by rows ---- */

struct rows_job {
    struct moe *mo;
    const struct model_layer *L;
    const struct vec_ops *vec;
    const float *x;
    int n;              /* rows */
    int kind[2];        /* activation kinds wanted (-1: none) */
    float *y;           /* combine: the output */
};

/* The batch's rows quantized for the router's and the experts' kinds. */
static void quant_x_run(void *ctx, int ith, int nth)
{
    struct rows_job *j = ctx;
    struct moe *mo = j->mo;
    long lo, hi;
    pool_split(j->n, 1, ith, nth, &lo, &hi);
    for (int k = 0; k < 2; k++) {
        int kd = j->kind[k];
        if (kd < 0 || (k == 1 && kd == j->kind[0]))
            continue;
        for (long b = lo; b < hi; b++)
            kern_act_quantize(kind_type[kd], j->x + b * mo->n_embd, (char *)mo->xq[kd] + b * mo->xrow[kd], mo->n_embd);
    }
}

/* gpt-oss's SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7) of the biased gate and up:
 * x = min(g + bg, 7), y = clamp(u + bu, -7, 7), h = x / (1 + exp(1.702 * -x)) * (y + 1). */
static void swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int64_t n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        float x = g[i] + bg[i], y = u[i] + bu[i];
        x = x < limit ? x : limit;
        y = y < -limit ? -limit : y > limit ? limit : y;
        g[i] = x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
    }
}

/* h = silu(gate) * up over the gathered rows (gpt-oss: swiglu_oai), quantized for the down
 * products. */
static void act_run(void *ctx, int ith, int nth)
{
    struct rows_job *j = ctx;
    struct moe *mo = j->mo;
    long lo, hi;
    pool_split(j->n, 1, ith, nth, &lo, &hi);
    int kd = j->kind[0];
    for (long r = lo; r < hi; r++) {
        float *g = mo->gate + r * mo->n_ff;
        if (mo->oss) {
            size_t e = (size_t)mo->row_expert[r];
            swiglu_oai(g, mo->up + r * mo->n_ff, j->L->exp_gate_b + e * (size_t)mo->n_ff,
                       j->L->exp_up_b + e * (size_t)mo->n_ff, mo->n_ff);
        } else {
            j->vec->silu_mul(g, mo->up + r * mo->n_ff, mo->n_ff);
        }
        kern_act_quantize(kind_type[kd], g, (char *)mo->hq[kd] + r * mo->hrow[kd], mo->n_ff);
    }
}

/* y[b] = sum over the token's choices, in top-k order, of its experts' outputs times their weights. */
static void combine_run(void *ctx, int ith, int nth)
{
    struct rows_job *j = ctx;
    struct moe *mo = j->mo;
    long lo, hi;
    pool_split(j->n, 1, ith, nth, &lo, &hi);
    int64_t n = mo->n_embd;
    for (long b = lo; b < hi; b++) {
        float *y = j->y + b * n;
        for (int k = 0; k < mo->n_used; k++) {
            int r = mo->row[b * mo->n_used + k];
            float *o = mo->out + (int64_t)r * n;
            float w = mo->w[b * mo->n_used + k];
            if (mo->oss) { /* the down product's bias first (its own row: each gathered row is one choice) */
                const float *bd = j->L->exp_down_b + (int64_t)mo->row_expert[r] * n;
                for (int64_t i = 0; i < n; i++)
                    o[i] = o[i] + bd[i];
            }
            if (k == 0)
                for (int64_t i = 0; i < n; i++)
                    y[i] = o[i] * w;
            else
                for (int64_t i = 0; i < n; i++)
                    y[i] = y[i] + o[i] * w;
        }
    }
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

void moe_forward(struct moe *mo, struct pool *pool, const struct vec_ops *vec, const struct model_layer *L,
                 const float *x, int B, float *y)
{
    int K = mo->n_used;
    int k_router = kern_act_kind(kern_mat_type(L->router));
    int k_gate = kern_act_kind(kern_mat_type(L->exp_gate[0]));
    int k_up = kern_act_kind(kern_mat_type(L->exp_up[0]));
    int k_down = kern_act_kind(kern_mat_type(L->exp_down[0]));

    /* router logits */
    struct rows_job qj = {.mo = mo, .vec = vec, .x = x, .n = B, .kind = {k_router, -1}};
    pool_run(pool, quant_x_run, &qj);
    mo->items[0] = (struct moe_item){L->router, mo->xq[k_router], mo->xrow[k_router], B, mo->logits,
                                     (size_t)mo->n_expert, 0};
    run_items(mo, pool, 1);

    /* choices, grouped by expert: gathered rows in expert order, tokens ascending */
    memset(mo->count, 0, (size_t)mo->n_expert * sizeof *mo->count);
    for (int b = 0; b < B; b++) {
        route(mo, L, b);
        for (int k = 0; k < K; k++)
            mo->count[mo->sel[b * K + k]]++;
    }
    mo->first[0] = 0;
    for (int e = 0; e < mo->n_expert; e++)
        mo->first[e + 1] = mo->first[e] + mo->count[e];
    memset(mo->count, 0, (size_t)mo->n_expert * sizeof *mo->count);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) {
            int e = mo->sel[b * K + k];
            int r = mo->first[e] + mo->count[e]++;
            mo->row[b * K + k] = r;
            mo->row_token[r] = b;
            mo->row_expert[r] = e;
        }

    /* the experts' inputs, gathered */
    qj.kind[0] = k_gate;
    qj.kind[1] = k_up;
    pool_run(pool, quant_x_run, &qj);
    int R = B * K;
    for (int kd = 0; kd < N_KINDS; kd++) {
        if (kd != k_gate && kd != k_up)
            continue;
        for (int r = 0; r < R; r++)
            memcpy((char *)mo->xg[kd] + (size_t)r * mo->xrow[kd],
                   (const char *)mo->xq[kd] + (size_t)mo->row_token[r] * mo->xrow[kd], mo->xrow[kd]);
    }

    /* gate and up of every chosen expert over its tokens */
    int n = 0;
    uint64_t bytes = 0;
    for (int e = 0; e < mo->n_expert; e++) {
        int cnt = mo->first[e + 1] - mo->first[e];
        if (!cnt)
            continue;
        size_t r0 = (size_t)mo->first[e];
        mo->items[n++] = (struct moe_item){L->exp_gate[e], (char *)mo->xg[k_gate] + r0 * mo->xrow[k_gate],
                                           mo->xrow[k_gate], cnt, mo->gate + r0 * (size_t)mo->n_ff, (size_t)mo->n_ff, 0};
        mo->items[n++] = (struct moe_item){L->exp_up[e], (char *)mo->xg[k_up] + r0 * mo->xrow[k_up],
                                           mo->xrow[k_up], cnt, mo->up + r0 * (size_t)mo->n_ff, (size_t)mo->n_ff, 0};
        bytes += kern_mat_bytes(L->exp_gate[e]) + kern_mat_bytes(L->exp_up[e]) + kern_mat_bytes(L->exp_down[e]);
        mo->stats.expert_runs++;
    }
    run_items(mo, pool, n);

    struct rows_job aj = {.mo = mo, .L = L, .vec = vec, .n = R, .kind = {k_down, -1}};
    pool_run(pool, act_run, &aj);

    /* down of every chosen expert */
    n = 0;
    for (int e = 0; e < mo->n_expert; e++) {
        int cnt = mo->first[e + 1] - mo->first[e];
        if (!cnt)
            continue;
        size_t r0 = (size_t)mo->first[e];
        mo->items[n++] = (struct moe_item){L->exp_down[e], (char *)mo->hq[k_down] + r0 * mo->hrow[k_down],
                                           mo->hrow[k_down], cnt, mo->out + r0 * (size_t)mo->n_embd,
                                           (size_t)mo->n_embd, 0};
    }
    run_items(mo, pool, n);

    struct rows_job cj = {.mo = mo, .L = L, .vec = vec, .n = B, .y = y};
    pool_run(pool, combine_run, &cj);
    mo->stats.steps++;
    mo->stats.token_choices += (uint64_t)R;
    mo->stats.expert_bytes += bytes;
}
