#include "engine/engine.h"

#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/pool.h"
#include "engine/attn.h"
#include "engine/moe.h"
#include "engine/vec.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define N_ACT_KINDS 3

/* Inputs of the matrix products have one of three lengths. */
enum act_dim { DIM_EMBD = 0, DIM_Q, DIM_FF, N_DIMS };

struct engine {
    const struct model *m;
    struct engine_config cfg;
    struct pool *pool;
    bool pool_borrowed; /* engine_config.pool: another engine's */
    const struct vec_ops *vec;
    int64_t q_dim, kv_dim;

    /* Buffers for max_batch tokens, allocated once. */
    float *x;        /* residual stream (B, n_embd) */
    float *xn;       /* normed input of a block (B, n_embd) */
    float *q;        /* (B, q_dim) */
    float *k, *v;    /* (B, kv_dim) */
    float *attn;     /* attention output (B, q_dim) */
    float *tmp;      /* block output before the residual add (B, n_embd) */
    float *gate, *up; /* (B, n_ff) */
    void *act[N_ACT_KINDS][N_DIMS]; /* quantized activations (B rows) or NULL */
    size_t act_row[N_ACT_KINDS][N_DIMS];
    float *rope_cs;  /* (B, n_rot/2, 2): cos, sin per token */
    float *rope_cs_swa; /* the same for sliding-window layers (their own base), or NULL */
    int64_t *slot;   /* KV slot per token (B) */
    int32_t *out_rows; /* tokens whose logits are wanted (B) */
    void *embd_row;  /* one embedding row as stored in the file */
    struct attn *att; /* attention scratch */
    struct moe *moe;  /* mixture-of-experts scratch (n_expert > 0) or NULL */

    /* Tensor parallelism (engine.h, engine_tp); tp_world 1 when not split. Parts are
     * column (= output row) ranges per rank: part[r] .. part[r+1]. */
    int tp_rank, tp_world;
    bool windowed; /* the model holds only this rank's rows of each matrix (model.h, struct model_tp) */
    int n_head_loc, n_head_kv_loc;
    int64_t q_part[ENGINE_TP_MAX + 1], kv_part[ENGINE_TP_MAX + 1];
    int64_t embd_part[ENGINE_TP_MAX + 1], ff_part[ENGINE_TP_MAX + 1], vocab_part[ENGINE_TP_MAX + 1];
    int64_t q_loc_dim, kv_loc_dim;
    float *q_loc, *k_loc, *v_loc, *attn_loc; /* this rank's heads (B, *_loc_dim); world 1: q, k, v, attn */
    struct engine_tp_stats tp_stats;

    /* profiling (engine_profile) */
    bool prof;
    int prof_phase;
    int64_t prof_t; /* when the current phase began */
    long long prof_ns[N_ENGINE_PHASES];
    double prof_bytes[N_ENGINE_PHASES];
    unsigned long long prof_forwards;
    long long prof_forward_ns;
};

/* Ends the current phase of a profiled forward and begins ph (N_ENGINE_PHASES: none). */
static void phase(struct engine *e, int ph)
{
    if (!e->prof)
        return;
    int64_t now = clock_ns();
    if (e->prof_phase < N_ENGINE_PHASES)
        e->prof_ns[e->prof_phase] += now - e->prof_t;
    e->prof_t = now;
    e->prof_phase = ph;
    pool_set_tag(e->pool, ph); /* N_ENGINE_PHASES: jobs outside a forward (a draft on the same pool) */
}
_Static_assert(N_ENGINE_PHASES < POOL_MAX_TAGS, "a pool tag for each phase and one for outside a forward");

static void count_bytes(struct engine *e, size_t bytes)
{
    if (e->prof && e->prof_phase < N_ENGINE_PHASES)
        e->prof_bytes[e->prof_phase] += (double)bytes;
}

/* ---- parallel jobs ---- */
struct mm_item {
    const struct kern_mat *m;
    const void *xq;
    size_t ldx;
    float *y;
    size_t ldy;
    int64_t r0, r1; /* the rows computed (a tensor-parallel rank's part; else all) */
};

/* The products of one job are shared out in units of row groups: each thread's own part
 * first (mm_claim), or where the parts do not fit, by guided self-scheduling alone: each
 * claim takes a share of what is left (at least MM_MIN_CLAIM bytes of weights), so a
 * thread slowed by a neighbour on this shared machine takes less instead of holding the
 * others at the barrier. Every row is still computed whole by one call, so which thread
 * takes it changes no bit. */
#define MM_MIN_CLAIM (32 << 10)

struct mm_job {
    struct mm_item item[3];
    int n_items;
    int B;
    long unit_rows[3];   /* rows per unit of each item */
    long first_unit[4];  /* item i's units are [first_unit[i], first_unit[i+1]) */
    long min_claim;      /* units */
    _Atomic long next;   /* first unit not yet claimed (without parts) */
    struct mm_part *parts; /* each thread's part (mm_claim), or NULL: guided self-scheduling */
    long own_min;        /* units: the least run a thread claims from its own part */
    int n_parts;         /* the pool's threads the parts were made for */
    /* Lines the calling thread writes after the job (a decode's KV cache block), asked
     * for by it (thread 0) once its claims are done. By the first thread done instead, the
     * lines came to that thread's core and the write then waited longer than for memory. */
    const char *warm_at[2];
    size_t warm_bytes[2];
};

/* Each thread first works through its own contiguous part of the units, front to back,
 * so its reads of the weights are one stream from the part's start to its end: under
 * guided self-scheduling alone the two threads' claims alternate, every claim restarts
 * the kernel's 4 streams cold, and the last claims (MM_MIN_CLAIM, 2-3 row groups) are
 * too short for 4 streams at all. A thread claims a quarter of what is left of its part
 * (at least MM_OWN_MIN bytes) at a time; once its part is done it takes the back half of
 * what is left of another's and makes it its own, so a thread slowed by a neighbour on
 * this shared machine still leaves the others at most half of its remainder (but for its
 * current claim: a part no longer than MM_OWN_MIN is one claim). A part is
 * (first unit << 32 | end unit) in one atomic word, moved by compare-and-swap, from the
 * front by its owner and from the back by a taker. Which thread computes a row changes
 * no bit: every row is still computed whole by one call. Measured on small (Q8_0, Zen 5
 * VM, 2 threads, loaded machine, the least time of each job over 800 alternated steps):
 * its layers' products 2-5% faster than guided claims alone. Each claim still starts
 * its 4 streams cold, and on AMD Zen 4 (whose B = 1 products leave the prefetch to the
 * hardware) a restart costs much: one thread sweeping a 100 MiB Q8_0 matrix in calls of
 * 128 KiB read 19-26 GB/s a CPU second, in one call 29-32. So a claim takes at least
 * MM_OWN_MIN = 1 MiB: a part of up to 1 MiB (all of small's but gate+up's 1.6 MiB) is
 * one claim. Measured on small (Zen 4 VM, 2 threads, load average 6-7, variants in turn
 * every 8 steps of one process, the sum over phases of each phase's least time in 300
 * steps): layers' products 1.96 -> 1.57 ms a step (128 KiB -> 1 MiB), the step's sum
 * 3.83 -> 3.45 ms. A batch's claim is B times the arithmetic: it keeps 128 KiB, so a
 * thread that finishes early can still take half of a slow neighbour's part. */
#define MM_MAX_PARTS 64
#define MM_OWN_MIN (1 << 20)
#define MM_OWN_MIN_BATCH (128 << 10)
/* Only short products take parts: on llama-1b (2.3-18 MiB jobs) Q4_0 decoded ~5% slower
 * with parts for every job than with guided claims (quiet A/B, session 19), while small's
 * 0.3-3.3 MiB jobs gained 4-11%. */
#define MM_PARTS_MAX_BYTES ((size_t)4 << 20)

struct mm_part {
    _Alignas(64) _Atomic uint64_t range;
};

static uint64_t mm_range(long lo, long hi) { return (uint64_t)lo << 32 | (uint64_t)hi; }

/* Parts for nth threads over j's `total` units of unit_bytes each (into parts, which
 * must outlive the job); without room for them j keeps guided self-scheduling. */
static void mm_parts_init(struct mm_job *j, struct mm_part *parts, long total, int nth, size_t unit_bytes)
{
    if (nth < 1 || nth > MM_MAX_PARTS || total >= (1L << 31) || (size_t)total * unit_bytes > MM_PARTS_MAX_BYTES)
        return;
    for (int i = 0; i < nth; i++) {
        long lo, hi;
        pool_split(total, 1, i, nth, &lo, &hi);
        atomic_init(&parts[i].range, mm_range(lo, hi));
    }
    j->own_min = (long)((j->B == 1 ? MM_OWN_MIN : MM_OWN_MIN_BATCH) / (unit_bytes ? unit_bytes : 1));
    j->own_min = j->own_min < 1 ? 1 : j->own_min;
    j->parts = parts;
    j->n_parts = nth;
}

static bool mm_claim(struct mm_job *j, int ith, int nth, long *lo, long *hi)
{
    if (!j->parts || nth != j->n_parts)
        return pool_claim(&j->next, j->first_unit[j->n_items], j->min_claim, nth, lo, hi);
    _Atomic uint64_t *own = &j->parts[ith].range;
    for (;;) {
        uint64_t r = atomic_load_explicit(own, memory_order_relaxed);
        long a = (long)(r >> 32), b = (long)(r & 0xffffffffu);
        if (a < b) {
            long n = (b - a) / 4;
            n = n < j->own_min ? j->own_min : n;
            n = n > b - a ? b - a : n;
            if (atomic_compare_exchange_weak_explicit(own, &r, mm_range(a + n, b), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *lo = a;
                *hi = a + n;
                return true;
            }
            continue; /* a taker moved the end */
        }
        /* own part done: take the back half of another's */
        bool took = false;
        for (int k = 1; k < nth && !took; k++) {
            _Atomic uint64_t *other = &j->parts[(ith + k) % nth].range;
            uint64_t o = atomic_load_explicit(other, memory_order_relaxed);
            for (;;) {
                long oa = (long)(o >> 32), ob = (long)(o & 0xffffffffu);
                if (oa >= ob)
                    break;
                long take = (ob - oa + 1) / 2;
                if (atomic_compare_exchange_weak_explicit(other, &o, mm_range(oa, ob - take), memory_order_relaxed,
                                                          memory_order_relaxed)) {
                    /* only this thread moves its own part's front; takers leave an empty part alone */
                    atomic_store_explicit(own, mm_range(ob - take, ob), memory_order_relaxed);
                    took = true;
                    break;
                }
            }
        }
        if (!took)
            return false;
    }
}

/* mm_job.warm_at: thread 0 asks for every line, to write. */
static void mm_warm(const struct mm_job *j, int ith)
{
    if (ith != 0)
        return;
    for (int i = 0; i < 2; i++)
        for (size_t c = 0; j->warm_at[i] && c < j->warm_bytes[i]; c += 64)
            __builtin_prefetch(j->warm_at[i] + c, 1, 2);
}

static void mm_run(void *ctx, int ith, int nth)
{
    struct mm_job *j = ctx;
    long lo, hi;
    while (mm_claim(j, ith, nth, &lo, &hi)) {
        for (int i = 0; i < j->n_items; i++) {
            long a = lo > j->first_unit[i] ? lo : j->first_unit[i];
            long b = hi < j->first_unit[i + 1] ? hi : j->first_unit[i + 1];
            if (a >= b)
                continue;
            const struct mm_item *it = &j->item[i];
            int64_t r0 = it->r0 + (a - j->first_unit[i]) * j->unit_rows[i];
            int64_t r1 = it->r0 + (b - j->first_unit[i]) * j->unit_rows[i];
            kern_matmul(it->m, it->xq, it->ldx, j->B, it->y, it->ldy, r0, r1 < it->r1 ? r1 : it->r1);
        }
    }
    mm_warm(j, ith);
}

/* Runs the products of items (at most 3, all over the same B activation rows); warm_at
 * (or NULL): mm_job's lines to ask for at the end. */
static void matmul_items_warm(struct engine *e, int B, const struct mm_item *items, int n_items,
                              const char *const *warm_at, const size_t *warm_bytes)
{
    struct mm_job j = {.n_items = n_items, .B = B};
    for (int i = 0; warm_at && i < 2; i++) {
        j.warm_at[i] = warm_at[i];
        j.warm_bytes[i] = warm_bytes[i];
    }
    size_t bytes = 0;
    for (int i = 0; i < n_items; i++) {
        j.item[i] = items[i];
        j.unit_rows[i] = kern_mat_row_align(items[i].m);
        int64_t rows = items[i].r1 - items[i].r0;
        j.first_unit[i + 1] = j.first_unit[i] + (rows + j.unit_rows[i] - 1) / j.unit_rows[i];
        bytes += (size_t)((double)kern_mat_bytes(items[i].m) * (double)rows / (double)kern_mat_rows(items[i].m));
    }
    long units = j.first_unit[n_items];
    size_t unit_bytes = units ? bytes / (size_t)units : 1;
    j.min_claim = (long)(MM_MIN_CLAIM / (unit_bytes ? unit_bytes : 1));
    j.min_claim = j.min_claim < 1 ? 1 : j.min_claim;
    atomic_init(&j.next, 0);
    struct mm_part parts[MM_MAX_PARTS];
    mm_parts_init(&j, parts, units, pool_threads(e->pool), unit_bytes);
    count_bytes(e, bytes);
    pool_run_claims(e->pool, mm_run, &j); /* mm_claim: the caller takes what others leave */
}

static void matmul_items(struct engine *e, int B, const struct mm_item *items, int n_items)
{
    matmul_items_warm(e, B, items, n_items, NULL, NULL);
}

/* Quantizes B rows of x (length n) into the activation formats the listed matrices use. */
struct quant_job {
    struct engine *e;
    const float *x;
    int64_t n;
    enum act_dim dim;
    int B;
    bool kinds[N_ACT_KINDS];
};

static const int kind_rep_type[N_ACT_KINDS] = {DT_F32, DT_Q8_0, DT_Q4_K};

/* Quantizes elements [lo, hi) of row b (x: that row) in each listed kind; lo is a multiple
 * of every kind's block, and blocks are quantized on their own, so any such split of a
 * row gives the same bytes as the whole row at once. */
static void quantize_row_part(struct engine *e, const bool *kinds, enum act_dim dim, long b, const float *x,
                              int64_t lo, int64_t hi)
{
    for (int k = 0; k < N_ACT_KINDS; k++) {
        if (!kinds[k])
            continue;
        char *row = (char *)e->act[k][dim] + (size_t)b * e->act_row[k][dim];
        kern_act_quantize(kind_rep_type[k], x + lo, row + kern_act_row_bytes(kind_rep_type[k], lo), hi - lo);
    }
}

static void quant_row(void *ctx, long b)
{
    struct quant_job *j = ctx;
    quantize_row_part(j->e, j->kinds, j->dim, b, j->x + b * j->n, 0, j->n);
}

static void kinds_for(bool *kinds, const struct kern_mat *const *mats, int n_mats)
{
    for (int i = 0; i < n_mats; i++)
        kinds[kern_act_kind(kern_mat_type(mats[i]))] = true;
}

/* A job of rows, each done whole by one thread (row(ctx, b) for b in [0, rows)). */
typedef void (*row_fn)(void *ctx, long b);

struct rows_job {
    row_fn row;
    void *ctx;
    long rows;
    _Atomic long next; /* first row not yet claimed */
};

static void rows_run(void *ctx, int ith, int nth)
{
    struct rows_job *j = ctx;
    long lo, hi;
    (void)ith;
    while (pool_claim(&j->next, j->rows, 1, nth, &lo, &hi))
        for (long b = lo; b < hi; b++)
            j->row(j->ctx, b);
}

/* Runs row(ctx, b) for every row. One row is done on the calling thread: a hand-off to the
 * pool would leave all threads but one idle for a step that takes about as long as the
 * hand-off itself. More are claimed (pool_run_claims), so the caller never waits for a
 * worker that a neighbour's process holds off its CPU; each row is the same operations on
 * whichever thread, so the bits do not depend on the claims. */
static void run_rows(struct engine *e, row_fn row, void *ctx, int rows)
{
    if (rows == 1) {
        row(ctx, 0);
    } else if (rows > 1) {
        struct rows_job j = {.row = row, .ctx = ctx, .rows = rows};
        atomic_init(&j.next, 0);
        pool_run_claims(e->pool, rows_run, &j);
    }
}

static void quantize_for(struct engine *e, const float *x, int64_t n, enum act_dim dim, int B,
                         const struct kern_mat *const *mats, int n_mats)
{
    struct quant_job j = {.e = e, .x = x, .n = n, .dim = dim, .B = B};
    kinds_for(j.kinds, mats, n_mats);
    run_rows(e, quant_row, &j, B);
}

static struct mm_item mm_item_for(struct engine *e, const struct kern_mat *m, enum act_dim dim, float *y, size_t ldy)
{
    int kind = kern_act_kind(kern_mat_type(m));
    return (struct mm_item){m, e->act[kind][dim], e->act_row[kind][dim], y, ldy, 0, kern_mat_rows(m)};
}

/* The product of this rank's rows (part[rank] .. part[rank+1]) of m, into those columns
 * of y. A model that holds only this rank's rows has them from its row 0. */
static struct mm_item mm_item_part(struct engine *e, const struct kern_mat *m, enum act_dim dim, float *y, size_t ldy,
                                   const int64_t *part)
{
    struct mm_item it = mm_item_for(e, m, dim, y, ldy);
    if (e->windowed) {
        it.y = y + part[e->tp_rank];
        it.r0 = 0;
        it.r1 = part[e->tp_rank + 1] - part[e->tp_rank];
    } else {
        it.r0 = part[e->tp_rank];
        it.r1 = part[e->tp_rank + 1];
    }
    return it;
}

/* ---- tensor-parallel exchanges ---- */

/* Completes the columns of buf from every rank (engine_tp.gather); nothing on one node. */
static int tp_gather(struct engine *e, float *buf, int rows, size_t ld, const int64_t *part, int to_root, char *err,
                     size_t errlen)
{
    if (e->tp_world == 1)
        return 0;
    e->tp_stats.gathers++;
    e->tp_stats.part_bytes += (uint64_t)rows * (uint64_t)(part[e->tp_rank + 1] - part[e->tp_rank]) * sizeof(float);
    return e->cfg.tp.gather(e->cfg.tp.ctx, buf, rows, ld, part, to_root, err, errlen);
}

/* Copies columns [c0, c0 + n) of rows rows of src (row stride lds) to dst (stride ldd) at
 * column d0. */
static void copy_cols(float *dst, size_t ldd, int64_t d0, const float *src, size_t lds, int64_t c0, int64_t n, int rows)
{
    for (int b = 0; b < rows; b++)
        memcpy(dst + (size_t)b * ldd + d0, src + (size_t)b * lds + c0, (size_t)n * sizeof(float));
}

/* ---- element-wise steps ---- */

static void rms_norm(const struct vec_ops *vec, const float *x, const float *w, float *y, int64_t n, float eps)
{
    float ss = vec->dot_f32(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

struct norm_job {
    struct engine *e;
    const float *x;
    const float *w;
    float *y;
    int64_t n;
    int B;
    const int32_t *rows; /* NULL: rows 0..B-1; else input row of output row b */
};

static void norm_row(void *ctx, long b)
{
    struct norm_job *j = ctx;
    long src = j->rows ? j->rows[b] : b;
    rms_norm(j->e->vec, j->x + src * j->n, j->w, j->y + b * j->n, j->n, j->e->m->hp.norm_eps);
}

static void rope_apply(const struct model_hparams *hp, float *x, int n_heads, const float *cs)
{
    int half = hp->n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * hp->head_dim;
        for (int i = 0; i < half; i++) {
            int i0 = hp->rope == ROPE_NEOX ? i : 2 * i;
            int i1 = hp->rope == ROPE_NEOX ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = v[i0], b = v[i1];
            v[i0] = a * c - b * s;
            v[i1] = a * s + b * c;
        }
    }
}

/* After the q/k/v products: biases, per-head norms, RoPE, and the KV cache write. */
struct qkv_post_job {
    struct engine *e;
    const struct model_layer *L;
    struct kv_cache *kv;
    int layer; /* index within the slice */
    int B;
    const float *rope_cs; /* (B, n_rot/2, 2) of this layer's RoPE */
};

/* Token b's query heads of KV head h and its K and V of head h (attn_prep_fn): each step
 * on those columns alone is the same float operations as on the whole vectors, so which
 * thread takes which (b, h), and when, changes no bit. */
static void qkv_post_head(void *ctx, int b, int h)
{
    struct qkv_post_job *j = ctx;
    struct engine *e = j->e;
    const struct model_hparams *hp = &e->m->hp;
    const struct model_layer *L = j->L;
    int hd = hp->head_dim, group = e->n_head_loc / e->n_head_kv_loc;
    /* This rank's heads (all of them on one node): columns from q0 / kv0 of the full vectors. */
    int64_t qd = e->q_loc_dim, kvd = e->kv_loc_dim, q0 = e->q_part[e->tp_rank], kv0 = e->kv_part[e->tp_rank];
    int64_t qc = (int64_t)h * group * hd, qn = (int64_t)group * hd, kc = (int64_t)h * hd; /* this head's columns */
    float *q = e->q_loc + b * qd, *k = e->k_loc + b * kvd, *v = e->v_loc + b * kvd;
    /* each bias on its own (a file may carry some of them only), at this rank's columns */
    for (int64_t i = qc; L->bq && i < qc + qn; i++)
        q[i] = q[i] + L->bq[q0 + i];
    for (int64_t i = kc; L->bk && i < kc + hd; i++)
        k[i] = k[i] + L->bk[kv0 + i];
    for (int64_t i = kc; L->bv && i < kc + hd; i++)
        v[i] = v[i] + L->bv[kv0 + i];
    if (L->q_norm) {
        for (int g = 0; g < group; g++)
            rms_norm(e->vec, q + qc + (int64_t)g * hd, L->q_norm, q + qc + (int64_t)g * hd, hd, hp->norm_eps);
        rms_norm(e->vec, k + kc, L->k_norm, k + kc, hd, hp->norm_eps);
    }
    const float *cs = j->rope_cs + b * hp->n_rot;
    rope_apply(hp, q + qc, group, cs);
    rope_apply(hp, k + kc, 1, cs);
    attn_kv_write_heads(j->kv, e->vec, j->layer, e->slot[b], hd, h, h + 1, k, v);
}

/* x += tmp, and for the feed-forward: gate = silu(gate) * up. */
struct ew_job {
    const struct vec_ops *vec;
    float *a;
    const float *b;
    int64_t n; /* elements in all (of each row with rows > 0) */
    int op;    /* 0: a += b; 1: a = silu(a) * b; 2: a = gelu(a) * b (gemma3) */
    int rows;  /* 0: a and b are n contiguous elements; else rows of ld, n elements each */
    size_t ld;
};

/* GELU with tanh (gemma's activation): 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in
 * this order of float operations on every path. */
static void gelu_mul(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = a[i];
        float inner = 0.7978845608028654f * x * (1.0f + 0.044715f * x * x);
        a[i] = 0.5f * x * (1.0f + tanhf(inner)) * b[i];
    }
}

static void ew_range(const struct ew_job *j, long lo, long hi);

/* A job of columns claimed in runs of `unit` (pool_run_claims: the caller alone can do
 * them all): cols(ctx, lo, hi) for runs [lo, hi) of [0, n). */
struct cols_job {
    void (*cols)(const void *ctx, long lo, long hi);
    const void *ctx;
    long n, unit;
    _Atomic long next; /* first unit not yet claimed */
};

static void cols_run(void *ctx, int ith, int nth)
{
    struct cols_job *j = ctx;
    long units = (j->n + j->unit - 1) / j->unit, lo, hi;
    (void)ith;
    while (pool_claim(&j->next, units, 1, nth, &lo, &hi))
        j->cols(j->ctx, lo * j->unit, hi * j->unit < j->n ? hi * j->unit : j->n);
}

static void run_cols(struct engine *e, void (*cols)(const void *, long, long), const void *ctx, long n, long unit)
{
    struct cols_job j = {.cols = cols, .ctx = ctx, .n = n, .unit = unit};
    atomic_init(&j.next, 0);
    pool_run_claims(e->pool, cols_run, &j);
}

static void ew_cols(const void *ctx, long lo, long hi)
{
    const struct ew_job *j = ctx;
    if (j->rows == 0) {
        ew_range(j, lo, hi);
        return;
    }
    for (int r = 0; r < j->rows; r++) {
        struct ew_job row = *j;
        row.a = j->a + (size_t)r * j->ld;
        row.b = j->b + (size_t)r * j->ld;
        ew_range(&row, lo, hi);
    }
}

/* Every element is computed on its own (vec.h's silu has one order on every path), so
 * how the elements are split changes no bit. */
static void ew_range(const struct ew_job *j, long lo, long hi)
{
    if (j->op == 0) {
        for (long i = lo; i < hi; i++)
            j->a[i] = j->a[i] + j->b[i];
    } else if (j->op == 2) {
        gelu_mul(j->a + lo, j->b + lo, hi - lo);
    } else {
        j->vec->silu_mul(j->a + lo, j->b + lo, hi - lo);
    }
}

/* The end of a block and the start of the next, per row: tmp += bias, tmp = norm(tmp),
 * x += tmp, xn = norm(x) and xn quantized for the next products, each step where asked.
 * Each is the same float operations as run on its own, so one job gives the same bits
 * as the five hand-offs it replaces. */
struct resid_job {
    struct engine *e;
    int B;
    const float *bias;       /* or NULL */
    const float *post_norm;  /* or NULL */
    bool add;                /* x += tmp */
    const float *next_norm;  /* or NULL (then nothing is quantized) */
    bool kinds[N_ACT_KINDS]; /* xn's quantized rows (DIM_EMBD) */
};

static void resid_row(void *ctx, long b)
{
    struct resid_job *j = ctx;
    struct engine *e = j->e;
    int64_t n = e->m->hp.n_embd;
    float eps = e->m->hp.norm_eps;
    float *t = e->tmp + b * n, *x = e->x + b * n, *xn = e->xn + b * n;
    for (int64_t i = 0; j->bias && i < n; i++)
        t[i] = t[i] + j->bias[i];
    if (j->post_norm)
        rms_norm(e->vec, t, j->post_norm, t, n, eps);
    for (int64_t i = 0; j->add && i < n; i++)
        x[i] = x[i] + t[i];
    if (j->next_norm) {
        rms_norm(e->vec, x, j->next_norm, xn, n, eps);
        quantize_row_part(e, j->kinds, DIM_EMBD, b, xn, 0, n);
    }
}

/* gate = act(gate) * up over the feed-forward's columns, and gate quantized for the down
 * product in the same pass: the columns are split in runs of whole blocks of every
 * activation format, and each element's activation is computed on its own (vec.h), so
 * the split changes no bit. */
#define ACT_SPLIT 256 /* a multiple of every activation format's block (32, 256) */

struct act_quant_job {
    struct engine *e;
    int B;
    bool gelu;               /* gemma's GELU; else SiLU */
    bool kinds[N_ACT_KINDS]; /* gate's quantized rows (DIM_FF) */
};

/* Columns [lo, hi) of rows [b0, b1); lo a multiple of every activation block (gate_up_unit). */
static void act_quant_range(const struct act_quant_job *j, long b0, long b1, int64_t lo, int64_t hi)
{
    struct engine *e = j->e;
    int64_t n = e->m->hp.n_ff;
    for (long b = b0; b < b1; b++) {
        float *g = e->gate + b * n;
        const float *u = e->up + b * n;
        if (j->gelu)
            gelu_mul(g + lo, u + lo, hi - lo);
        else
            e->vec->silu_mul(g + lo, u + lo, hi - lo);
        quantize_row_part(e, j->kinds, DIM_FF, b, g, lo, hi);
    }
}

/* The gate and up products with the activation and quantizing of each run of columns
 * done by the thread that computed it, right after it: one job instead of two. Runs are
 * whole units of rows of both matrices, claimed as matmul_items claims (each row still
 * computed whole by one kern_matmul call). A unit is the least run that both matrices'
 * row groups and the down product's activation blocks divide (gate_up_unit): a decode
 * step's last claims are then as short as the other products', where 256-row units
 * (a fixed ACT_SPLIT) left one thread up to a unit (0.6-1.1 MiB of weights) behind the
 * other at the barrier. */
struct gate_up_job {
    struct mm_job mm; /* items 0 (gate) and 1 (up) over the same rows; units of `unit` rows */
    struct act_quant_job act;
    int64_t unit;
};

/* A batch's activation rows go through a unit in parts of at least this many: the part's
 * gate and up outputs are still in L2 when the activation reads them (all of a prompt's
 * 512 rows, 1 MiB of outputs a unit, were read back from L3). A row's products do not
 * depend on how many rows share the call (test_mat), so the parts give the same bits;
 * 64 rows keep each part on the kernels' large-batch path, the fast one for prompts. */
#define GATE_UP_PART_ROWS 64

static void gate_up_run(void *ctx, int ith, int nth)
{
    struct gate_up_job *j = ctx;
    int64_t n = j->mm.item[0].r1;
    int B = j->mm.B, parts = B / GATE_UP_PART_ROWS > 1 ? B / GATE_UP_PART_ROWS : 1;
    long lo, hi;
    while (mm_claim(&j->mm, ith, nth, &lo, &hi)) {
        int64_t r0 = lo * j->unit, r1 = hi * j->unit < n ? hi * j->unit : n;
        for (int p = 0; p < parts; p++) {
            long b0, b1;
            pool_split(B, 1, p, parts, &b0, &b1);
            for (int i = 0; i < 2; i++) {
                const struct mm_item *it = &j->mm.item[i];
                kern_matmul(it->m, (const char *)it->xq + (size_t)b0 * it->ldx, it->ldx, (int)(b1 - b0),
                            it->y + (size_t)b0 * it->ldy, it->ldy, r0, r1);
            }
            act_quant_range(&j->act, b0, b1, r0, r1);
        }
    }
}

/* The rows of gate_up_run's unit: a multiple of both matrices' row groups and of the
 * block of every activation format the down product takes (32 or 256 elements). */
static int64_t gate_up_unit(const struct kern_mat *gate, const struct kern_mat *up, const bool *kinds)
{
    static const int64_t block[N_ACT_KINDS] = {[KERN_ACT_F32] = 1, [KERN_ACT_Q8_32] = 32, [KERN_ACT_Q8_256] = 256};
    int64_t u = row_align_lcm(kern_mat_row_align(gate), kern_mat_row_align(up));
    for (int k = 0; k < N_ACT_KINDS; k++)
        if (kinds[k])
            u = row_align_lcm(u, block[k]);
    return u;
}

/* Whether gate_up_run can split these products (a unit of gate_up_unit within ACT_SPLIT's bound). */
static bool gate_up_fusable(const struct kern_mat *gate, const struct kern_mat *up, const bool *kinds)
{
    return gate_up_unit(gate, up, kinds) <= ACT_SPLIT && kern_mat_rows(gate) == kern_mat_rows(up);
}

static void gate_up_act(struct engine *e, int B, const struct mm_item *gu, const struct act_quant_job *act)
{
    struct gate_up_job j = {.mm = {.n_items = 2, .B = B}, .act = *act};
    j.mm.item[0] = gu[0];
    j.mm.item[1] = gu[1];
    /* a batch keeps ACT_SPLIT's longer runs: its products reuse each activation row over them */
    j.unit = gate_up_unit(gu[0].m, gu[1].m, act->kinds);
    j.unit = B == 1 ? j.unit : row_align_lcm(j.unit, ACT_SPLIT);
    long units = (long)((gu[0].r1 + j.unit - 1) / j.unit);
    j.mm.first_unit[1] = j.mm.first_unit[2] = units; /* mm_claim's total */
    size_t bytes = kern_mat_bytes(gu[0].m) + kern_mat_bytes(gu[1].m);
    size_t unit_bytes = units ? bytes / (size_t)units : 1;
    j.mm.min_claim = (long)(MM_MIN_CLAIM / (unit_bytes ? unit_bytes : 1));
    j.mm.min_claim = j.mm.min_claim < 1 ? 1 : j.mm.min_claim;
    atomic_init(&j.mm.next, 0);
    struct mm_part parts[MM_MAX_PARTS];
    mm_parts_init(&j.mm, parts, units, pool_threads(e->pool), unit_bytes);
    count_bytes(e, bytes);
    /* mm_claim: the caller takes what a worker that never started leaves */
    pool_run_claims(e->pool, gate_up_run, &j);
}

static void act_quant_cols(const void *ctx, long lo, long hi)
{
    const struct act_quant_job *j = ctx;
    act_quant_range(j, 0, j->B, lo, hi);
}

/* ---- setup ---- */

struct kv_config engine_kv_config(const struct model *m, int64_t n_ctx, int n_seqs, int block_tokens)
{
    return engine_kv_config_tp(m, 1, n_ctx, n_seqs, block_tokens);
}

struct kv_config engine_kv_config_tp(const struct model *m, int world, int64_t n_ctx, int n_seqs, int block_tokens)
{
    int64_t per_seq = (n_ctx + block_tokens - 1) / block_tokens;
    world = world < 1 ? 1 : world;
    return (struct kv_config){
        .n_layers = m->layer_end - m->layer_begin,
        .kv_dim = (int64_t)(m->hp.n_head_kv / world) * m->hp.head_dim,
        .block_tokens = block_tokens,
        .n_blocks = per_seq * n_seqs,
        .max_seqs = n_seqs,
        .type_k = DT_F16,
        .type_v = DT_F16,
    };
}

int engine_kv_type(const char *name)
{
    int t = dtype_kv_from_name(name);
    return t >= 0 ? t : CAIRN_EINVAL;
}

static void *zalloc(size_t n) { return calloc(1, n ? n : 1); }

/* ---- tensor-parallel parts ---- */

int engine_tp_check_hparams(const struct model_hparams *hp, int world, char *err, size_t errlen)
{
    return model_tp_check_hparams(hp, world, err, errlen);
}

/* The row alignment every matrix of one kind in every layer accepts (kinds: 0 wq, 1 wk
 * and wv, 2 wo and w_down, 3 w_gate and w_up, 4 the head). */
static int64_t kind_align(const struct model *m, int kind)
{
    int64_t a = 1;
    if (kind == MODEL_TP_VOCAB)
        return m->output ? kern_mat_row_align(m->output) : 1;
    for (int il = 0; il < m->layer_end - m->layer_begin; il++) {
        const struct model_layer *L = &m->layers[il];
        const struct kern_mat *mats[2] = {NULL, NULL};
        if (kind == MODEL_TP_Q)
            mats[0] = L->wq;
        else if (kind == MODEL_TP_KV)
            mats[0] = L->wk, mats[1] = L->wv;
        else if (kind == MODEL_TP_EMBD)
            mats[0] = L->wo, mats[1] = L->w_down;
        else
            mats[0] = L->w_gate, mats[1] = L->w_up;
        for (int i = 0; i < 2; i++)
            if (mats[i])
                a = row_align_lcm(a, kern_mat_row_align(mats[i]));
    }
    return a;
}

/* Fills e's parts for rank `rank` of `world`, or says why m cannot be split so: the
 * model's own parts when it holds one rank's rows only (model_load_opts.tp_world), else
 * the same split of the whole matrices. */
static int tp_parts(struct engine *e, const struct model *m, int rank, int world, char *err, size_t errlen)
{
    const struct model_hparams *hp = &m->hp;
    struct model_tp tp;
    int rc;
    if (m->tp.world > 1) {
        if (world != m->tp.world || rank != m->tp.rank)
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "the model holds the rows of tensor-parallel rank %d of %d, not of rank %d of %d",
                              m->tp.rank, m->tp.world, rank, world);
        tp = m->tp;
    } else {
        if ((rc = engine_tp_check_hparams(hp, world, err, errlen)))
            return rc;
        if (world > 1 && (!m->first || !m->last))
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "a tensor-parallel rank holds the whole model (layers %d..%d given)", m->layer_begin,
                              m->layer_end);
        int64_t align[MODEL_TP_KINDS];
        for (int k = 0; k < MODEL_TP_KINDS; k++)
            align[k] = kind_align(m, k);
        if ((rc = model_tp_split(hp, rank, world, align, &tp, err, errlen)))
            return rc;
    }
    size_t n = (size_t)(world + 1) * sizeof(int64_t);
    memcpy(e->q_part, tp.q_part, n);
    memcpy(e->kv_part, tp.kv_part, n);
    memcpy(e->embd_part, tp.embd_part, n);
    memcpy(e->ff_part, tp.ff_part, n);
    memcpy(e->vocab_part, tp.vocab_part, n);
    e->windowed = m->tp.world > 1;
    int kv_per = hp->n_head_kv / world, group = hp->n_head / hp->n_head_kv;
    e->n_head_loc = kv_per * group;
    e->n_head_kv_loc = kv_per;
    e->q_loc_dim = e->q_part[1];
    e->kv_loc_dim = e->kv_part[1];
    return 0;
}

/* Bytes of rows [part[rank], part[rank+1]) of m (0 for no matrix). */
static uint64_t part_bytes(const struct kern_mat *m, const int64_t *part, int rank)
{
    if (!m)
        return 0;
    return (uint64_t)((double)kern_mat_bytes(m) * (double)(part[rank + 1] - part[rank]) / (double)kern_mat_rows(m));
}

/* What this rank's products read per token: its rows of every layer's matrices and of the head. */
static uint64_t tp_weight_bytes(const struct engine *e)
{
    const struct model *m = e->m;
    int r = e->tp_rank;
    uint64_t b = part_bytes(m->output, e->vocab_part, r);
    for (int il = 0; il < m->layer_end - m->layer_begin; il++) {
        const struct model_layer *L = &m->layers[il];
        b += part_bytes(L->wq, e->q_part, r) + part_bytes(L->wk, e->kv_part, r) + part_bytes(L->wv, e->kv_part, r) +
             part_bytes(L->wo, e->embd_part, r) + part_bytes(L->w_down, e->embd_part, r) +
             part_bytes(L->w_gate, e->ff_part, r) + part_bytes(L->w_up, e->ff_part, r);
    }
    return b;
}

int engine_tp_check(const struct model *m, int world, char *err, size_t errlen)
{
    struct engine e = {0};
    return tp_parts(&e, m, m->tp.world > 1 ? m->tp.rank : 0, world, err, errlen);
}

int engine_create(struct engine **out, const struct model *m, const struct engine_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->n_threads < 1 || cfg->max_batch < 1 || cfg->max_ctx < 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "engine needs threads, max_batch and max_ctx >= 1");
    /* per-thread buffers (attention's among them) are sized by n_threads */
    if (cfg->pool && pool_threads(cfg->pool) != cfg->n_threads)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "a borrowed pool of %d threads for an engine of %d",
                          pool_threads(cfg->pool), cfg->n_threads);
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    e->m = m;
    e->cfg = *cfg;
    e->vec = vec_ops_best();
    const struct model_hparams *hp = &m->hp;
    e->q_dim = (int64_t)hp->n_head * hp->head_dim;
    e->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    e->tp_world = cfg->tp.world > 1 ? cfg->tp.world : 1;
    e->tp_rank = e->tp_world > 1 ? cfg->tp.rank : 0;
    int rc = 0;
    if (e->tp_world > 1 && (e->tp_rank < 0 || e->tp_rank >= e->tp_world || !cfg->tp.gather))
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "tensor-parallel rank %d of %d (or no gather)", cfg->tp.rank,
                        cfg->tp.world);
    if (rc || (rc = tp_parts(e, m, e->tp_rank, e->tp_world, err, errlen))) {
        free(e);
        return rc;
    }
    size_t B = (size_t)cfg->max_batch, f = sizeof(float);
    e->x = zalloc(B * (size_t)hp->n_embd * f);
    e->xn = zalloc(B * (size_t)hp->n_embd * f);
    e->tmp = zalloc(B * (size_t)hp->n_embd * f);
    e->q = zalloc(B * (size_t)e->q_dim * f);
    e->attn = zalloc(B * (size_t)e->q_dim * f);
    e->k = zalloc(B * (size_t)e->kv_dim * f);
    e->v = zalloc(B * (size_t)e->kv_dim * f);
    e->gate = zalloc(B * (size_t)hp->n_ff * f);
    e->up = zalloc(B * (size_t)hp->n_ff * f);
    e->rope_cs = zalloc(B * (size_t)hp->n_rot * f);
    if (hp->swa_window > 0 && hp->gemma) /* gpt-oss's sliding layers rotate as its others */
        e->rope_cs_swa = zalloc(B * (size_t)hp->n_rot * f);
    e->slot = zalloc(B * sizeof *e->slot);
    e->out_rows = zalloc(B * sizeof *e->out_rows);
    e->embd_row = zalloc(m->tok_embd_row_bytes);
    if (e->tp_world > 1) {
        e->q_loc = zalloc(B * (size_t)e->q_loc_dim * f);
        e->attn_loc = zalloc(B * (size_t)e->q_loc_dim * f);
        e->k_loc = zalloc(B * (size_t)e->kv_loc_dim * f);
        e->v_loc = zalloc(B * (size_t)e->kv_loc_dim * f);
    } else {
        e->q_loc = e->q, e->attn_loc = e->attn, e->k_loc = e->k, e->v_loc = e->v;
    }
    struct attn_shape ash = {e->n_head_loc, e->n_head_kv_loc, hp->head_dim};
    bool ok = e->x && e->xn && e->tmp && e->q && e->attn && e->k && e->v && e->gate && e->up &&
              e->q_loc && e->attn_loc && e->k_loc && e->v_loc &&
              e->rope_cs && (e->rope_cs_swa || hp->swa_window <= 0 || !hp->gemma) && e->slot && e->out_rows && e->embd_row &&
              attn_create(&e->att, &ash, cfg->n_threads, cfg->max_batch, cfg->max_ctx) == 0;
    int64_t dims[N_DIMS] = {hp->n_embd, e->q_dim, hp->n_ff};
    for (int k = 0; k < N_ACT_KINDS && ok; k++)
        for (int d = 0; d < N_DIMS && ok; d++) {
            int blk = dtype_info(kind_rep_type[k])->block_elems;
            if (dims[d] % blk)
                continue; /* no matrix of this kind can have this input length */
            e->act_row[k][d] = kern_act_row_bytes(kind_rep_type[k], dims[d]);
            e->act[k][d] = aligned_alloc(64, (B * e->act_row[k][d] + 63) / 64 * 64);
            ok = e->act[k][d] != NULL;
        }
    if (ok && hp->n_expert > 0)
        ok = moe_create(&e->moe, hp, cfg->max_batch) == 0;
    if (ok)
        attn_set_scale(e->att, hp->attn_scale);
    if (ok && hp->n_expert == 0)
        e->tp_stats.weight_bytes = tp_weight_bytes(e);
    if (ok && cfg->pool) {
        e->pool = cfg->pool;
        e->pool_borrowed = true;
    }
    if (!ok || (!e->pool && pool_create(&e->pool, cfg->n_threads))) {
        engine_release(e);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for engine buffers (batch %d)", cfg->max_batch);
    }
    *out = e;
    return 0;
}

void engine_release(struct engine *e)
{
    if (!e)
        return;
    if (!e->pool_borrowed)
        pool_release(e->pool);
    attn_release(e->att);
    moe_release(e->moe);
    float *bufs[] = {e->x, e->xn, e->tmp, e->q, e->attn, e->k, e->v, e->gate, e->up, e->rope_cs, e->rope_cs_swa};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    if (e->tp_world > 1) {
        free(e->q_loc);
        free(e->attn_loc);
        free(e->k_loc);
        free(e->v_loc);
    }
    for (int k = 0; k < N_ACT_KINDS; k++)
        for (int d = 0; d < N_DIMS; d++)
            free(e->act[k][d]);
    free(e->slot);
    free(e->out_rows);
    free(e->embd_row);
    free(e);
}

const struct model *engine_model(const struct engine *e) { return e->m; }
int engine_threads(const struct engine *e) { return e->cfg.n_threads; }
int engine_max_batch(const struct engine *e) { return e->cfg.max_batch; }
int64_t engine_max_ctx(const struct engine *e) { return e->cfg.max_ctx; }

struct engine_tp_stats engine_get_tp_stats(const struct engine *e) { return e->tp_stats; }

unsigned long long engine_dispatches(const struct engine *e) { return pool_dispatches(e->pool); }

struct pool *engine_pool(const struct engine *e) { return e->pool; }

struct moe_stats engine_moe_stats(const struct engine *e)
{
    return e->moe ? moe_get_stats(e->moe) : (struct moe_stats){0};
}

/* ---- forward ---- */

/* The pair of YaRN's ramp (arch.h): below dimension pair lo angles are kept, above hi
 * interpolated (llama.cpp's ggml_rope_yarn_corr_dims). */
static void yarn_dims(const struct model_hparams *hp, double *lo, double *hi)
{
    double n = hp->n_rot, ctx = (double)hp->rope_yarn_orig_ctx, base = hp->rope_base;
    double d_fast = n * log(ctx / (hp->rope_yarn_beta_fast * 6.283185307179586)) / (2.0 * log(base));
    double d_slow = n * log(ctx / (hp->rope_yarn_beta_slow * 6.283185307179586)) / (2.0 * log(base));
    *lo = fmax(0.0, floor(d_fast));
    *hi = fmin(n - 1.0, ceil(d_slow));
}

/* cos and sin of a sliding-window layer (gemma3): its own base, no scaling. */
static void rope_table_swa(const struct model_hparams *hp, int64_t pos, float *cs)
{
    int half = hp->n_rot / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * pow((double)hp->rope_base_swa, -2.0 * i / hp->n_rot);
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

static void rope_table(const struct model *m, int64_t pos, float *cs)
{
    const struct model_hparams *hp = &m->hp;
    int half = hp->n_rot / 2;
    double p = (double)pos / hp->rope_linear_scale;
    double factor = hp->rope_yarn_factor, lo = 0.0, hi = 0.0, mscale = 1.0;
    if (factor > 1.0) {
        yarn_dims(hp, &lo, &hi);
        mscale = hp->rope_yarn_attn_factor * (1.0 + 0.1 * log(factor));
    }
    for (int i = 0; i < half; i++) {
        double freq = pow((double)hp->rope_base, -2.0 * i / hp->n_rot);
        if (m->rope_freq_factors)
            freq /= m->rope_freq_factors[i];
        double theta = p * freq;
        if (factor > 1.0) {
            double keep = 1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)));
            theta = theta / factor * (1.0 - keep) + theta * keep;
        }
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

/* Tells the cache which of its layers slide (kv.h: it releases what their windows passed). */
static void set_kv_windows(struct engine *e, struct kv_cache *kv)
{
    const struct model *m = e->m;
    if (m->hp.swa_window <= 0)
        return;
    for (int il = 0; il < m->layer_end - m->layer_begin; il++) {
        int64_t w = model_layer_swa(&m->hp, m->layer_begin + il) ? m->hp.swa_window : 0;
        if (kv_window(kv, il) != w)
            kv_set_window(kv, il, w);
    }
}

static int check_batch(struct engine *e, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen)
{
    const struct model *m = e->m;
    const struct kv_config *kc = kv_config(kv);
    if (b->n < 1 || b->n > e->cfg.max_batch)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "batch of %d tokens (engine takes 1..%d)", b->n, e->cfg.max_batch);
    if (kc->n_layers != m->layer_end - m->layer_begin || kc->kv_dim != e->kv_loc_dim)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "KV cache shape does not match the model slice");
    for (int i = 0; i < 2; i++) {
        int t = i ? kc->type_v : kc->type_k;
        if ((t == DT_Q8_0 || t == DT_Q4_0) && m->hp.head_dim % 32)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "a %s cache of type %s needs a head size that is a multiple of 32 (this model's: %d)",
                              i ? "V" : "K", dtype_name(t), m->hp.head_dim);
    }
    if (m->first ? !b->token : !b->embd)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "batch lacks %s", m->first ? "tokens" : "input activations");
    for (int i = 0; i < b->n; i++) {
        if (b->seq[i] < 0 || b->seq[i] >= kc->max_seqs)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: sequence id %d outside [0, %d)", i, b->seq[i], kc->max_seqs);
        if (b->pos[i] < 0 || b->pos[i] >= e->cfg.max_ctx)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: position %lld outside the context of %lld", i,
                              (long long)b->pos[i], (long long)e->cfg.max_ctx);
        if (m->first && (b->token[i] < 0 || b->token[i] >= m->hp.n_vocab))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: id %d outside the vocabulary of %d", i, b->token[i], m->hp.n_vocab);
        int prev = -1;
        for (int k = i - 1; k >= 0 && prev < 0; k--)
            if (b->seq[k] == b->seq[i])
                prev = k;
        if (prev >= 0 ? b->pos[i] != b->pos[prev] + 1 : b->pos[i] > kv_seq_len(kv, b->seq[i]))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: position %lld of sequence %d does not follow its previous position",
                              i, (long long)b->pos[i], b->seq[i]);
        if (prev < 0 && b->pos[i] < kv_seq_min_resume(kv, b->seq[i]))
            return cairn_fail(err, errlen, CAIRN_ERANGE,
                              "token %d: sequence %d cannot resume at position %lld: its sliding-window layers released "
                              "the positions it needs (it can resume at %lld or later)",
                              i, b->seq[i], (long long)b->pos[i], (long long)kv_seq_min_resume(kv, b->seq[i]));
    }
    return 0;
}

static void scale_rows(float *x, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * s;
}

/* Final logit softcapping (gemma): tanh(x * (1 / cap)) * cap, as llama.cpp orders it. */
static void softcap_rows(float *x, int64_t n, float cap)
{
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++)
        x[i] = tanhf(x[i] * inv) * cap;
}

static int forward(struct engine *e, struct kv_cache *kv, const struct batch *b, float *out, char *err, size_t errlen);

int engine_forward(struct engine *e, struct kv_cache *kv, const struct batch *b, float *out, char *err, size_t errlen)
{
    if (!e->prof)
        return forward(e, kv, b, out, err, errlen);
    int64_t t0 = clock_ns();
    e->prof_t = t0;
    e->prof_phase = EP_INPUT;
    pool_set_tag(e->pool, EP_INPUT);
    int rc = forward(e, kv, b, out, err, errlen);
    phase(e, N_ENGINE_PHASES);
    e->prof_forwards++;
    e->prof_forward_ns += e->prof_t - t0;
    return rc;
}

static const char *const phase_names[N_ENGINE_PHASES] = {
    [EP_INPUT] = "input", [EP_QKV] = "qkv", [EP_QKV_POST] = "rope+kv", [EP_ATTN] = "attention",
    [EP_WO] = "out", [EP_RESID_ATTN] = "add+norm", [EP_FFN] = "gate+up+act", [EP_DOWN] = "down",
    [EP_RESID_FFN] = "add+norm2", [EP_HEAD] = "head",
};

const char *engine_phase_name(int ph) { return ph >= 0 && ph < N_ENGINE_PHASES ? phase_names[ph] : "?"; }

int engine_profile(struct engine *e, bool on)
{
    memset(e->prof_ns, 0, sizeof e->prof_ns);
    memset(e->prof_bytes, 0, sizeof e->prof_bytes);
    e->prof_forwards = 0;
    e->prof_forward_ns = 0;
    e->prof = on;
    e->prof_phase = N_ENGINE_PHASES;
    int rc = pool_profile(e->pool, on);
    pool_set_tag(e->pool, N_ENGINE_PHASES);
    if (rc)
        e->prof = false;
    return rc;
}

struct engine_phase_stats engine_phase_stats(const struct engine *e, int ph)
{
    if (ph < 0 || ph >= N_ENGINE_PHASES)
        return (struct engine_phase_stats){0};
    return (struct engine_phase_stats){e->prof_ns[ph], pool_tag_stats(e->pool, ph), e->prof_bytes[ph]};
}

void engine_profile_totals(const struct engine *e, unsigned long long *forwards, long long *ns_forward)
{
    *forwards = e->prof_forwards;
    *ns_forward = e->prof_forward_ns;
}

static int forward(struct engine *e, struct kv_cache *kv, const struct batch *b, float *out, char *err, size_t errlen)
{
    int rc = check_batch(e, kv, b, err, errlen);
    if (rc)
        return rc;
    set_kv_windows(e, kv);
    e->tp_stats.forwards++;
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    int B = b->n;
    int64_t n_embd = hp->n_embd;

    /* Reserve cache room for each sequence's run of positions (first token of each). */
    for (int i = 0; i < B; i++) {
        bool first_of_seq = true;
        for (int k = 0; k < i && first_of_seq; k++)
            first_of_seq = b->seq[k] != b->seq[i];
        if (!first_of_seq)
            continue;
        int64_t count = 0;
        for (int k = i; k < B; k++)
            count += b->seq[k] == b->seq[i];
        if ((rc = kv_prepare(kv, b->seq[i], b->pos[i], count)))
            return cairn_fail(err, errlen, rc, "KV cache full: no room for %lld positions of sequence %d",
                              (long long)count, b->seq[i]);
    }
    for (int i = 0; i < B; i++) {
        e->slot[i] = kv_slot(kv, b->seq[i], b->pos[i]);
        rope_table(m, b->pos[i], e->rope_cs + (int64_t)i * hp->n_rot);
        if (e->rope_cs_swa)
            rope_table_swa(hp, b->pos[i], e->rope_cs_swa + (int64_t)i * hp->n_rot);
    }

    if (m->first) {
        for (int i = 0; i < B; i++)
            model_embed(m, b->token[i], e->embd_row, e->x + (int64_t)i * n_embd);
        if (hp->gemma)
            scale_rows(e->x, (int64_t)B * n_embd, sqrtf((float)n_embd));
    } else {
        memcpy(e->x, b->embd, (size_t)B * (size_t)n_embd * sizeof(float));
    }

    /* Each layer starts with xn = norm(x) quantized for its q, k, v products: the first from
     * here, the others from the previous layer's last job. */
    int n_layers = m->layer_end - m->layer_begin;
    if (n_layers > 0) {
        const struct model_layer *L0 = &m->layers[0];
        struct resid_job rj = {.e = e, .B = B, .next_norm = L0->attn_norm};
        kinds_for(rj.kinds, (const struct kern_mat *const[]){L0->wq, L0->wk, L0->wv}, 3);
        run_rows(e, resid_row, &rj, B);
    }
    for (int il = 0; il < n_layers; il++) {
        const struct model_layer *L = &m->layers[il];
        /* attention block */
        phase(e, EP_QKV);
        struct mm_item qkv_items[3] = {
            mm_item_part(e, L->wq, DIM_EMBD, e->q, (size_t)e->q_dim, e->q_part),
            mm_item_part(e, L->wk, DIM_EMBD, e->k, (size_t)e->kv_dim, e->kv_part),
            mm_item_part(e, L->wv, DIM_EMBD, e->v, (size_t)e->kv_dim, e->kv_part),
        };
        /* a decode's K and V go to a block that the weights' stream pushed out of the caches
         * since the last step: its lines asked for at the products' end (rope+kv waited on
         * them, 384 lines of K on small, one store each) */
        const char *kv_at[2] = {NULL, NULL};
        size_t kv_bytes[2] = {0, 0};
        if (B == 1)
            attn_kv_write_span(kv, il, e->slot[0], hp->head_dim, kv_at, kv_bytes);
        matmul_items_warm(e, B, qkv_items, 3, kv_at, kv_bytes);
        if (e->tp_world > 1) {
            int64_t q0 = e->q_part[e->tp_rank], kv0 = e->kv_part[e->tp_rank];
            copy_cols(e->q_loc, (size_t)e->q_loc_dim, 0, e->q, (size_t)e->q_dim, q0, e->q_loc_dim, B);
            copy_cols(e->k_loc, (size_t)e->kv_loc_dim, 0, e->k, (size_t)e->kv_dim, kv0, e->kv_loc_dim, B);
            copy_cols(e->v_loc, (size_t)e->kv_loc_dim, 0, e->v, (size_t)e->kv_dim, kv0, e->kv_loc_dim, B);
        }
        /* biases, norms, RoPE and the K and V written, per token and KV head, inside
         * attention's job: a decode's by the threads that attend over those heads, where the
         * caller did them alone before and the others idled (their time now counts in the
         * attention phase; rope+kv stays in the profile, empty) */
        phase(e, EP_QKV_POST);
        bool swa = model_layer_swa(hp, m->layer_begin + il);
        struct qkv_post_job pj = {e, L, kv, il, B, swa && e->rope_cs_swa ? e->rope_cs_swa : e->rope_cs};
        phase(e, EP_ATTN);
        /* the sinks of this rank's heads (tensor parallelism refuses the mixtures that have them) */
        attn_forward_prep(e->att, e->pool, e->vec, kv, il, B, b->seq, b->pos, e->q_loc, e->attn_loc,
                          swa ? hp->swa_window : 0, L->sinks ? L->sinks + e->q_part[e->tp_rank] / hp->head_dim : NULL,
                          qkv_post_head, &pj);
        if (e->tp_world > 1) {
            copy_cols(e->attn, (size_t)e->q_dim, e->q_part[e->tp_rank], e->attn_loc, (size_t)e->q_loc_dim, 0, e->q_loc_dim, B);
            if ((rc = tp_gather(e, e->attn, B, (size_t)e->q_dim, e->q_part, 0, err, errlen)))
                return rc;
        }
        phase(e, EP_WO);
        const struct kern_mat *wo[1] = {L->wo};
        quantize_for(e, e->attn, e->q_dim, DIM_Q, B, wo, 1);
        struct mm_item wo_item = mm_item_part(e, L->wo, DIM_Q, e->tmp, (size_t)n_embd, e->embd_part);
        matmul_items(e, B, &wo_item, 1);
        if ((rc = tp_gather(e, e->tmp, B, (size_t)n_embd, e->embd_part, 0, err, errlen)))
            return rc;
        /* the bias on the whole vector (the same on every rank), the residual add, and the
         * feed-forward's norm and quantized input in one job */
        phase(e, EP_RESID_ATTN);
        struct resid_job rj = {.e = e, .B = B, .bias = L->bo, .post_norm = L->attn_post_norm, .add = true,
                               .next_norm = L->ffn_norm};
        const float *ffn_post_norm = NULL;
        bool ffn_added = false; /* a mixture of experts adds its output to x itself */
        if (!L->router)
            kinds_for(rj.kinds, (const struct kern_mat *const[]){L->w_gate, L->w_up}, 2);
        run_rows(e, resid_row, &rj, B);

        /* feed-forward block */
        phase(e, EP_FFN);
        if (L->router) {
            /* the experts' bytes (and the router's) count as this phase's products, so the
             * bench's product rate covers the whole step's weights */
            uint64_t experts_before = e->prof ? moe_get_stats(e->moe).expert_bytes : 0;
            moe_forward(e->moe, e->pool, e->vec, L, e->xn, B, e->x); /* adds to x itself */
            if (e->prof)
                count_bytes(e, (size_t)(moe_get_stats(e->moe).expert_bytes - experts_before) + kern_mat_bytes(L->router));
            ffn_added = true;
        } else {
            struct mm_item gu_items[2] = {
                mm_item_part(e, L->w_gate, DIM_EMBD, e->gate, (size_t)hp->n_ff, e->ff_part),
                mm_item_part(e, L->w_up, DIM_EMBD, e->up, (size_t)hp->n_ff, e->ff_part),
            };
            const struct kern_mat *down[1] = {L->w_down};
            struct act_quant_job aj = {.e = e, .B = B, .gelu = hp->gemma};
            kinds_for(aj.kinds, down, 1);
            if (e->tp_world == 1 && gate_up_fusable(L->w_gate, L->w_up, aj.kinds)) {
                gate_up_act(e, B, gu_items, &aj);
            } else if (e->tp_world == 1) {
                matmul_items(e, B, gu_items, 2);
                run_cols(e, act_quant_cols, &aj, (long)hp->n_ff, ACT_SPLIT);
            } else { /* this rank's columns of each row, then all columns from every rank */
                matmul_items(e, B, gu_items, 2);
                int64_t f0 = e->ff_part[e->tp_rank];
                struct ew_job act = {e->vec, e->gate + f0, e->up + f0, e->ff_part[e->tp_rank + 1] - f0,
                                     hp->gemma ? 2 : 1, B, (size_t)hp->n_ff};
                run_cols(e, ew_cols, &act, (long)act.n, 64);
                if ((rc = tp_gather(e, e->gate, B, (size_t)hp->n_ff, e->ff_part, 0, err, errlen)))
                    return rc;
                quantize_for(e, e->gate, hp->n_ff, DIM_FF, B, down, 1);
            }
            phase(e, EP_DOWN);
            struct mm_item down_item = mm_item_part(e, L->w_down, DIM_FF, e->tmp, (size_t)n_embd, e->embd_part);
            matmul_items(e, B, &down_item, 1);
            if ((rc = tp_gather(e, e->tmp, B, (size_t)n_embd, e->embd_part, 0, err, errlen)))
                return rc;
            ffn_post_norm = L->ffn_post_norm;
        }
        /* the residual add, and the next layer's norm and quantized input */
        phase(e, EP_RESID_FFN);
        rj = (struct resid_job){.e = e, .B = B, .post_norm = ffn_post_norm, .add = !ffn_added};
        if (il + 1 < n_layers) {
            const struct model_layer *N = &m->layers[il + 1];
            rj.next_norm = N->attn_norm;
            kinds_for(rj.kinds, (const struct kern_mat *const[]){N->wq, N->wk, N->wv}, 3);
        }
        run_rows(e, resid_row, &rj, B);
    }

    phase(e, EP_HEAD);
    if (!m->last) {
        memcpy(out, e->x, (size_t)B * (size_t)n_embd * sizeof(float));
        return 0;
    }
    int n_out = 0;
    for (int i = 0; i < B; i++)
        if (!b->logits || b->logits[i])
            e->out_rows[n_out++] = i;
    if (n_out == 0)
        return 0;
    struct norm_job nj = {e, e->x, m->output_norm, e->xn, n_embd, n_out, e->out_rows};
    run_rows(e, norm_row, &nj, n_out);
    if (b->hidden) {
        memcpy(out, e->xn, (size_t)n_out * (size_t)n_embd * sizeof(float));
        return 0;
    }
    const struct kern_mat *head[1] = {m->output};
    quantize_for(e, e->xn, n_embd, DIM_EMBD, n_out, head, 1);
    struct mm_item head_item = mm_item_part(e, m->output, DIM_EMBD, out, (size_t)hp->n_vocab, e->vocab_part);
    matmul_items(e, n_out, &head_item, 1);
    if ((rc = tp_gather(e, out, n_out, (size_t)hp->n_vocab, e->vocab_part, 1, err, errlen)))
        return rc;
    if (hp->logit_softcap > 0 && e->tp_rank == 0)
        softcap_rows(out, (int64_t)n_out * hp->n_vocab, hp->logit_softcap);
    return 0;
}
