#include "model/model.h"

#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "gguf/gguf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

struct loader {
    struct model *m;
    enum kern_path path;
    char *err;
    size_t errlen;
    uint64_t weight_bytes; /* of what this loader loaded, read per token */
    uint64_t all_bytes;    /* of what this loader loaded */
};

static const struct gguf_tensor *find_tensor(struct loader *ld, const char *name, int n_dims,
                                             int64_t ne0, int64_t ne1, bool required, int *rc)
{
    *rc = 0;
    const struct gguf_tensor *t = gguf_find_tensor(ld->m->file, name);
    if (!t) {
        if (required)
            *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT, "tensor %s is missing", name);
        return NULL;
    }
    int64_t ne1_file = t->n_dims >= 2 ? t->ne[1] : 1;
    bool extra = false;
    for (int d = 2; d < t->n_dims; d++)
        extra |= t->ne[d] != 1;
    if (t->n_dims > n_dims && extra) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT, "tensor %s has %d dimensions, expected %d",
                         name, t->n_dims, n_dims);
        return NULL;
    }
    if (t->ne[0] != ne0 || ne1_file != ne1) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT,
                         "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
                         (long long)t->ne[0], (long long)ne1_file, (long long)ne0, (long long)ne1);
        return NULL;
    }
    const struct dtype_info *ti = dtype_info(t->type);
    if (!ti || !ti->supported) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EUNSUPPORTED, "tensor %s has type %s, which is not supported",
                         name, dtype_name(t->type));
        return NULL;
    }
    return t;
}

/* The kernels keep a repacked copy on every path but the reference: the file pages of
 * the source are then dropped so they do not stay resident beside the copy. */
static void drop_source_pages(const void *data, uint64_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)data + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)data + size) & ~(uintptr_t)(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Rows [row0, row0 + rows) of a matrix tensor t (already checked) as one matrix; only
 * their file pages are read (and dropped once repacked). */
static int load_mat_rows(struct loader *ld, struct kern_mat **out, const struct gguf_tensor *t, int64_t row0,
                         int64_t rows)
{
    int64_t cols = t->ne[0];
    int64_t rb = dtype_row_bytes(t->type, cols);
    const char *data = (const char *)t->data + (size_t)row0 * (size_t)rb;
    char kerr[256];
    int rc = kern_mat_create(out, t->type, data, rows, cols, ld->path, kerr, sizeof kerr);
    if (rc && row0 == 0 && rows == t->ne[1])
        return cairn_fail(ld->err, ld->errlen, rc, "tensor %s: %s", t->name, kerr);
    if (rc)
        return cairn_fail(ld->err, ld->errlen, rc, "tensor %s (rows %lld..%lld): %s", t->name, (long long)row0,
                          (long long)(row0 + rows), kerr);
    if (kern_mat_path(*out) != KERN_PATH_REF)
        drop_source_pages(data, (uint64_t)rows * (uint64_t)rb);
    ld->weight_bytes += kern_mat_bytes(*out);
    ld->all_bytes += kern_mat_bytes(*out);
    return 0;
}

/* This rank's rows of a split matrix: part (a struct model_tp's) on a tensor-parallel
 * rank, else (or part NULL: a matrix never split) [0, rows). */
static void rank_rows(const struct loader *ld, const int64_t *part, int64_t rows, int64_t *row0, int64_t *n)
{
    const struct model_tp *tp = &ld->m->tp;
    if (tp->world > 1 && part) {
        *row0 = part[tp->rank];
        *n = part[tp->rank + 1] - part[tp->rank];
    } else {
        *row0 = 0;
        *n = rows;
    }
}

/* Matrix `name` of rows x cols, of which this rank's rows of part (NULL: all). */
static int load_mat(struct loader *ld, struct kern_mat **out, const char *name, int64_t rows, int64_t cols,
                    const int64_t *part)
{
    int rc;
    const struct gguf_tensor *t = find_tensor(ld, name, 2, cols, rows, true, &rc);
    if (!t)
        return rc;
    int64_t row0, n;
    rank_rows(ld, part, rows, &row0, &n);
    return load_mat_rows(ld, out, t, row0, n);
}

/* phi3: attn_qkv (q, k, v rows) and ffn_up (gate rows, then up rows). */
static int load_fused(struct loader *ld, int il, struct model_layer *L)
{
    const struct model_hparams *hp = &ld->m->hp;
    const struct model_tp *tp = &ld->m->tp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t q0, nq, kv0, nkv, f0, nf;
    rank_rows(ld, tp->q_part, q_dim, &q0, &nq);
    rank_rows(ld, tp->kv_part, kv_dim, &kv0, &nkv);
    rank_rows(ld, tp->ff_part, hp->n_ff, &f0, &nf);
    char name[96];
    int rc;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    const struct gguf_tensor *t = find_tensor(ld, name, 2, hp->n_embd, q_dim + 2 * kv_dim, true, &rc);
    if (!t || (rc = load_mat_rows(ld, &L->wq, t, q0, nq)) || (rc = load_mat_rows(ld, &L->wk, t, q_dim + kv0, nkv)) ||
        (rc = load_mat_rows(ld, &L->wv, t, q_dim + kv_dim + kv0, nkv)))
        return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);
    t = find_tensor(ld, name, 2, hp->n_embd, 2 * (int64_t)hp->n_ff, true, &rc);
    if (!t || (rc = load_mat_rows(ld, &L->w_gate, t, f0, nf)) || (rc = load_mat_rows(ld, &L->w_up, t, hp->n_ff + f0, nf)))
        return rc;
    return 0;
}

static int load_vec(struct loader *ld, float **out, const char *name, int64_t n, bool required)
{
    int rc;
    *out = NULL;
    const struct gguf_tensor *t = find_tensor(ld, name, 1, n, 1, required, &rc);
    if (!t)
        return rc;
    if (t->type != DT_F32 && t->type != DT_F16 && t->type != DT_BF16)
        return cairn_fail(ld->err, ld->errlen, CAIRN_EUNSUPPORTED, "tensor %s has type %s; vectors must be F32, F16 or BF16",
                          name, dtype_name(t->type));
    *out = malloc((size_t)n * sizeof(float));
    if (!*out)
        return cairn_fail(ld->err, ld->errlen, CAIRN_ENOMEM, "out of memory for %s", name);
    kern_dequantize_row(t->type, t->data, *out, n);
    ld->weight_bytes += (uint64_t)n * sizeof(float);
    ld->all_bytes += (uint64_t)n * sizeof(float);
    return 0;
}

/* One of a layer's 3-D expert tensors, [cols, rows, n_expert] in GGUF's order (a matrix
 * per expert, each the next rows * row_bytes of the tensor's data), checked. */
static const struct gguf_tensor *find_experts(struct loader *ld, const char *name, int64_t rows, int64_t cols, int *rc)
{
    const struct model_hparams *hp = &ld->m->hp;
    const struct gguf_tensor *t = gguf_find_tensor(ld->m->file, name);
    *rc = 0;
    if (!t) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT, "tensor %s is missing", name);
        return NULL;
    }
    int64_t ne2 = t->n_dims >= 3 ? t->ne[2] : 1;
    bool extra = false;
    for (int d = 3; d < t->n_dims; d++)
        extra |= t->ne[d] != 1;
    if (t->n_dims < 3 || extra || t->ne[0] != cols || t->ne[1] != rows || ne2 != hp->n_expert) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT,
                         "tensor %s has shape [%lld, %lld, %lld] (%d dimensions), expected [%lld, %lld, %d]", name,
                         (long long)t->ne[0], (long long)(t->n_dims >= 2 ? t->ne[1] : 1), (long long)ne2, t->n_dims,
                         (long long)cols, (long long)rows, hp->n_expert);
        return NULL;
    }
    const struct dtype_info *ti = dtype_info(t->type);
    if (!ti || !ti->supported) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EUNSUPPORTED, "tensor %s has type %s, which is not supported", name,
                         dtype_name(t->type));
        return NULL;
    }
    int64_t row_bytes = dtype_row_bytes(t->type, cols);
    if (row_bytes <= 0 || (uint64_t)row_bytes * (uint64_t)rows * (uint64_t)hp->n_expert != t->size) {
        *rc = cairn_fail(ld->err, ld->errlen, CAIRN_EFORMAT, "tensor %s: %llu bytes do not hold %d experts of %s rows",
                         name, (unsigned long long)t->size, hp->n_expert, dtype_name(t->type));
        return NULL;
    }
    return t;
}

/* The bytes of every expert's matrix counted: all of them, and n_expert_used read a token. */
static void count_experts(struct loader *ld, struct kern_mat *const *mats)
{
    const struct model_hparams *hp = &ld->m->hp;
    uint64_t all = 0;
    for (int e = 0; e < hp->n_expert; e++)
        all += kern_mat_bytes(mats[e]);
    ld->all_bytes += all;
    ld->weight_bytes += all / (uint64_t)hp->n_expert * (uint64_t)hp->n_expert_used;
}

/* One matrix per expert of the checked tensor t (rows x cols each). */
static int load_experts(struct loader *ld, struct kern_mat ***out, const struct gguf_tensor *t, int64_t rows, int64_t cols)
{
    const struct model_hparams *hp = &ld->m->hp;
    *out = calloc((size_t)hp->n_expert, sizeof **out);
    if (!*out)
        return cairn_fail(ld->err, ld->errlen, CAIRN_ENOMEM, "out of memory for %s", t->name);
    uint64_t expert_bytes = (uint64_t)dtype_row_bytes(t->type, cols) * (uint64_t)rows;
    for (int e = 0; e < hp->n_expert; e++) {
        const char *data = (const char *)t->data + (uint64_t)e * expert_bytes;
        char kerr[256];
        int rc = kern_mat_create(&(*out)[e], t->type, data, rows, cols, ld->path, kerr, sizeof kerr);
        if (rc)
            return cairn_fail(ld->err, ld->errlen, rc, "tensor %s, expert %d: %s", t->name, e, kerr);
        if (kern_mat_path((*out)[e]) != KERN_PATH_REF)
            drop_source_pages(data, expert_bytes);
    }
    count_experts(ld, *out);
    return 0;
}

/* The rows of gate and up an expert's fused matrix takes in turns: the kernels' row
 * group, when that divides the smallest activation block (so that every unit and
 * activation group of moe.c starts on a turn); 0 when they are not fused (different
 * types, or a path that reads the file's layout in place). */
static int gate_up_turn(const struct loader *ld, const struct gguf_tensor *g, const struct gguf_tensor *u)
{
    int turn = kern_row_align(g->type, ld->path);
    return g->type == u->type && turn > 1 && 32 % turn == 0 ? turn : 0;
}

/* Expert e's gate and up rows (rows each, row_bytes a row) into dst in turns of `turn`
 * rows, gate's first; the last turn has what is left of each. */
static void interleave_gate_up(char *dst, const char *gate, const char *up, int64_t rows, size_t row_bytes, int turn)
{
    for (int64_t r = 0; r < rows; r += turn) {
        size_t n = (size_t)(rows - r < turn ? rows - r : turn) * row_bytes;
        memcpy(dst, gate + (size_t)r * row_bytes, n);
        memcpy(dst + n, up + (size_t)r * row_bytes, n);
        dst += 2 * n;
    }
}

/* Each expert's gate and up as one matrix of 2 x rows rows (model.h's exp_gate_up), the
 * file pages of both dropped once repacked; 0 with L->exp_gate_up NULL where the path
 * keeps no copy of its own (then the two load apart). */
static int load_gate_up(struct loader *ld, struct model_layer *L, const struct gguf_tensor *g,
                        const struct gguf_tensor *u, int64_t rows, int64_t cols, int turn)
{
    const struct model_hparams *hp = &ld->m->hp;
    size_t row_bytes = (size_t)dtype_row_bytes(g->type, cols), expert_bytes = row_bytes * (size_t)rows;
    char *buf = malloc(2 * expert_bytes);
    L->exp_gate_up = calloc((size_t)hp->n_expert, sizeof *L->exp_gate_up);
    if (!buf || !L->exp_gate_up) {
        free(buf);
        return cairn_fail(ld->err, ld->errlen, CAIRN_ENOMEM, "out of memory for %s", g->name);
    }
    int rc = 0;
    for (int e = 0; e < hp->n_expert && !rc; e++) {
        const char *gd = (const char *)g->data + (size_t)e * expert_bytes, *ud = (const char *)u->data + (size_t)e * expert_bytes;
        interleave_gate_up(buf, gd, ud, rows, row_bytes, turn);
        char kerr[256];
        rc = kern_mat_create(&L->exp_gate_up[e], g->type, buf, 2 * rows, cols, ld->path, kerr, sizeof kerr);
        if (rc) {
            rc = cairn_fail(ld->err, ld->errlen, rc, "tensors %s and %s, expert %d: %s", g->name, u->name, e, kerr);
        } else if (kern_mat_own_bytes(L->exp_gate_up[e]) == 0) { /* it reads buf: not this path */
            for (int i = 0; i <= e; i++)
                kern_mat_release(L->exp_gate_up[i]);
            free(L->exp_gate_up);
            L->exp_gate_up = NULL;
            break;
        } else {
            drop_source_pages(gd, expert_bytes);
            drop_source_pages(ud, expert_bytes);
        }
    }
    free(buf);
    if (!rc && L->exp_gate_up) {
        L->exp_gu_rows = turn;
        count_experts(ld, L->exp_gate_up);
    }
    return rc;
}

/* A matrix of biases, one row of cols per expert (gpt-oss's ffn_*_exps.bias, GGUF shape
 * [cols, n_expert]), as floats. */
static int load_bias_rows(struct loader *ld, float **out, const char *name, int64_t cols)
{
    const struct model_hparams *hp = &ld->m->hp;
    int rc;
    *out = NULL;
    const struct gguf_tensor *t = find_tensor(ld, name, 2, cols, hp->n_expert, true, &rc);
    if (!t)
        return rc;
    if (t->type != DT_F32 && t->type != DT_F16 && t->type != DT_BF16)
        return cairn_fail(ld->err, ld->errlen, CAIRN_EUNSUPPORTED, "tensor %s has type %s; biases must be F32, F16 or BF16",
                          name, dtype_name(t->type));
    size_t n = (size_t)cols * (size_t)hp->n_expert;
    *out = malloc(n * sizeof(float));
    if (!*out)
        return cairn_fail(ld->err, ld->errlen, CAIRN_ENOMEM, "out of memory for %s", name);
    int64_t row_bytes = dtype_row_bytes(t->type, cols);
    for (int e = 0; e < hp->n_expert; e++)
        kern_dequantize_row(t->type, (const char *)t->data + (size_t)e * (size_t)row_bytes, *out + (size_t)e * (size_t)cols,
                            cols);
    ld->weight_bytes += (uint64_t)cols * (uint64_t)hp->n_expert_used * sizeof(float);
    ld->all_bytes += (uint64_t)n * sizeof(float);
    return 0;
}

#define WEIGHT_SLOT_ALIGN 256

static size_t slot_bytes(const struct kern_mat *m)
{
    return m ? (kern_mat_own_bytes(m) + WEIGHT_SLOT_ALIGN - 1) / WEIGHT_SLOT_ALIGN * WEIGHT_SLOT_ALIGN : 0;
}

/* Moves the layer's experts' own copies into one block on huge pages (mem_alloc_stream),
 * expert by expert (gate and up, then down). Each alone was a buffer of its own: below
 * 2 MiB (every Qwen3-30B-A3B expert matrix) on 4 KiB pages, so a step's expert products
 * paid a TLB walk every 4 KiB and read 0.83-0.87 of a dense matrix's rate per CPU second,
 * against 0.94-0.99 from one block (bench_moe_stream q4_k, MOE_HUGE). The same bits;
 * without the memory for the block each keeps its own. */
static void place_experts(struct model_layer *L, int n_expert)
{
    struct kern_mat **sets[] = {L->exp_gate_up, L->exp_gate, L->exp_up, L->exp_down};
    size_t n_sets = sizeof sets / sizeof sets[0], total = 0;
    for (int e = 0; e < n_expert; e++)
        for (size_t k = 0; k < n_sets; k++)
            total += sets[k] ? slot_bytes(sets[k][e]) : 0;
    uint8_t *block = total ? mem_alloc_stream(total) : NULL;
    if (!block)
        return;
    size_t off = 0;
    for (int e = 0; e < n_expert; e++)
        for (size_t k = 0; k < n_sets; k++) {
            if (!sets[k])
                continue;
            size_t b = slot_bytes(sets[k][e]);
            kern_mat_move(sets[k][e], block + off);
            off += b;
        }
    L->exp_block = block;
}

/* The router and the experts of a mixture-of-experts layer (gpt-oss: with their biases). */
static int load_moe(struct loader *ld, int il, struct model_layer *L)
{
    const struct model_hparams *hp = &ld->m->hp;
    const struct gguf_tensor *g, *u, *d;
    char name[96];
    int rc;
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", il, suffix), name)
    if ((rc = load_mat(ld, &L->router, NAME("ffn_gate_inp.weight"), hp->n_expert, hp->n_embd, NULL)) ||
        !(g = find_experts(ld, NAME("ffn_gate_exps.weight"), hp->n_ff_exp, hp->n_embd, &rc)) ||
        !(u = find_experts(ld, NAME("ffn_up_exps.weight"), hp->n_ff_exp, hp->n_embd, &rc)) ||
        !(d = find_experts(ld, NAME("ffn_down_exps.weight"), hp->n_embd, hp->n_ff_exp, &rc)))
        return rc;
    int turn = gate_up_turn(ld, g, u);
    if ((turn && (rc = load_gate_up(ld, L, g, u, hp->n_ff_exp, hp->n_embd, turn))) ||
        (!L->exp_gate_up && ((rc = load_experts(ld, &L->exp_gate, g, hp->n_ff_exp, hp->n_embd)) ||
                             (rc = load_experts(ld, &L->exp_up, u, hp->n_ff_exp, hp->n_embd)))) ||
        (rc = load_experts(ld, &L->exp_down, d, hp->n_embd, hp->n_ff_exp)))
        return rc;
    place_experts(L, hp->n_expert);
    /* The experts' freed buffers stay in glibc's heaps otherwise: Qwen3-30B-A3B's load
     * peaked at 24.3 GB and was killed on a 23.5 GB machine, 19.5 GB with this. */
    malloc_trim(0);
    if (hp->oss && ((rc = load_vec(ld, &L->router_b, NAME("ffn_gate_inp.bias"), hp->n_expert, true)) ||
                    (rc = load_bias_rows(ld, &L->exp_gate_b, NAME("ffn_gate_exps.bias"), hp->n_ff_exp)) ||
                    (rc = load_bias_rows(ld, &L->exp_up_b, NAME("ffn_up_exps.bias"), hp->n_ff_exp)) ||
                    (rc = load_bias_rows(ld, &L->exp_down_b, NAME("ffn_down_exps.bias"), hp->n_embd))))
        return rc;
#undef NAME
    return 0;
}

static int load_layer(struct loader *ld, int il, struct model_layer *L)
{
    const struct model_hparams *hp = &ld->m->hp;
    const struct model_tp *tp = &ld->m->tp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    int rc;
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", il, suffix), name)
    /* gpt-oss names its FFN norm post_attention_norm (a norm before the FFN, not gemma3's) */
    if ((rc = load_vec(ld, &L->attn_norm, NAME("attn_norm.weight"), hp->n_embd, true)) ||
        (rc = load_mat(ld, &L->wo, NAME("attn_output.weight"), hp->n_embd, q_dim, tp->embd_part)) ||
        (rc = load_vec(ld, &L->ffn_norm, NAME(hp->oss ? "post_attention_norm.weight" : "ffn_norm.weight"), hp->n_embd,
                       true)))
        return rc;
    if (hp->oss && ((rc = load_vec(ld, &L->bo, NAME("attn_output.bias"), hp->n_embd, true)) ||
                    (rc = load_vec(ld, &L->sinks, NAME("attn_sinks.weight"), hp->n_head, true))))
        return rc;
    if (hp->fused) { /* q, k, v and gate, up from two fused matrices */
        if ((rc = load_fused(ld, il, L)))
            return rc;
    } else if ((rc = load_mat(ld, &L->wq, NAME("attn_q.weight"), q_dim, hp->n_embd, tp->q_part)) ||
               (rc = load_mat(ld, &L->wk, NAME("attn_k.weight"), kv_dim, hp->n_embd, tp->kv_part)) ||
               (rc = load_mat(ld, &L->wv, NAME("attn_v.weight"), kv_dim, hp->n_embd, tp->kv_part))) {
        return rc;
    }
    if (hp->n_expert > 0) {
        if ((rc = load_moe(ld, il, L)))
            return rc;
    } else if ((!hp->fused && ((rc = load_mat(ld, &L->w_gate, NAME("ffn_gate.weight"), hp->n_ff, hp->n_embd, tp->ff_part)) ||
                               (rc = load_mat(ld, &L->w_up, NAME("ffn_up.weight"), hp->n_ff, hp->n_embd, tp->ff_part)))) ||
               (rc = load_mat(ld, &L->w_down, NAME("ffn_down.weight"), hp->n_embd, hp->n_ff, tp->embd_part))) {
        return rc;
    }
    if (hp->gemma &&
        ((rc = load_vec(ld, &L->attn_post_norm, NAME("post_attention_norm.weight"), hp->n_embd, true)) ||
         (rc = load_vec(ld, &L->ffn_post_norm, NAME("post_ffw_norm.weight"), hp->n_embd, true))))
        return rc;
    /* Biases are part of qwen2; llama files may carry them too (some fine-tunes). */
    if ((rc = load_vec(ld, &L->bq, NAME("attn_q.bias"), q_dim, hp->qkv_bias)) ||
        (rc = load_vec(ld, &L->bk, NAME("attn_k.bias"), kv_dim, hp->qkv_bias)) ||
        (rc = load_vec(ld, &L->bv, NAME("attn_v.bias"), kv_dim, hp->qkv_bias)))
        return rc;
    if (hp->qk_norm &&
        ((rc = load_vec(ld, &L->q_norm, NAME("attn_q_norm.weight"), hp->head_dim, true)) ||
         (rc = load_vec(ld, &L->k_norm, NAME("attn_k_norm.weight"), hp->head_dim, true))))
        return rc;
#undef NAME
    return 0;
}

/* The output head (tied or not: the embedding lookup reads its rows with pread), of a
 * tensor-parallel rank its vocabulary rows only. */
static int load_head(struct loader *ld)
{
    const struct model_hparams *hp = &ld->m->hp;
    const char *head = hp->tied_output ? "token_embd.weight" : "output.weight";
    return load_mat(ld, &ld->m->output, head, hp->n_vocab, hp->n_embd, ld->m->tp.vocab_part);
}

/* ---- tensor-parallel parts ---- */

int model_tp_check_hparams(const struct model_hparams *hp, int world, char *err, size_t errlen)
{
    if (world < 1 || world > MODEL_TP_MAX)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor parallelism over %d ranks (1..%d)", world, MODEL_TP_MAX);
    if (hp->n_head_kv % world)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "tensor parallelism over %d ranks needs a KV-head count they divide (this model has %d KV heads)",
                          world, hp->n_head_kv);
    if (hp->n_expert > 0 && world > 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor parallelism of a mixture of experts is not supported");
    return 0;
}

/* Rows [0, n) split over world ranks at multiples of align (the last part ends at n). */
static void split_rows(int64_t n, int64_t align, int world, int64_t *part)
{
    for (int r = 0; r < world; r++)
        part[r] = n * r / world / align * align;
    part[world] = n;
}

int model_tp_split(const struct model_hparams *hp, int rank, int world, const int64_t align[MODEL_TP_KINDS],
                   struct model_tp *out, char *err, size_t errlen)
{
    int rc = model_tp_check_hparams(hp, world, err, errlen);
    if (rc)
        return rc;
    if (rank < 0 || rank >= world)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor-parallel rank %d of %d", rank, world);
    for (int k = 0; k < MODEL_TP_KINDS; k++)
        if (align[k] < 1)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor parallelism: row alignment %lld", (long long)align[k]);
    memset(out, 0, sizeof *out);
    out->rank = rank;
    out->world = world;
    int kv_per = hp->n_head_kv / world, group = hp->n_head / hp->n_head_kv;
    for (int r = 0; r <= world; r++) {
        out->q_part[r] = (int64_t)r * kv_per * group * hp->head_dim;
        out->kv_part[r] = (int64_t)r * kv_per * hp->head_dim;
        if (out->q_part[r] % align[MODEL_TP_Q] || out->kv_part[r] % align[MODEL_TP_KV])
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "tensor parallelism over %d ranks: a rank's %d KV heads of %d rows do not fall on the "
                              "matrices' row alignment (%lld, %lld)",
                              world, kv_per, hp->head_dim, (long long)align[MODEL_TP_Q], (long long)align[MODEL_TP_KV]);
    }
    split_rows(hp->n_embd, align[MODEL_TP_EMBD], world, out->embd_part);
    split_rows(hp->n_ff, align[MODEL_TP_FF], world, out->ff_part);
    split_rows(hp->n_vocab, align[MODEL_TP_VOCAB], world, out->vocab_part);
    return 0;
}

/* The row alignment of each kind of split matrix over every layer of f, from the types of
 * its tensors (kern_row_align): what engine.c's kind_align finds on the prepared
 * matrices. A missing tensor counts for nothing (loading it fails later, by name). */
static void file_tp_aligns(const struct model *m, enum kern_path path, int64_t align[MODEL_TP_KINDS])
{
    const struct model_hparams *hp = &m->hp;
    static const char *const plain[MODEL_TP_KINDS - 1][2] = {
        [MODEL_TP_Q] = {"attn_q.weight", NULL},
        [MODEL_TP_KV] = {"attn_k.weight", "attn_v.weight"},
        [MODEL_TP_EMBD] = {"attn_output.weight", "ffn_down.weight"},
        [MODEL_TP_FF] = {"ffn_gate.weight", "ffn_up.weight"},
    };
    static const char *const fused[MODEL_TP_KINDS - 1][2] = { /* phi3 */
        [MODEL_TP_Q] = {"attn_qkv.weight", NULL},
        [MODEL_TP_KV] = {"attn_qkv.weight", NULL},
        [MODEL_TP_EMBD] = {"attn_output.weight", "ffn_down.weight"},
        [MODEL_TP_FF] = {"ffn_up.weight", NULL},
    };
    for (int k = 0; k < MODEL_TP_KINDS; k++)
        align[k] = 1;
    char name[96];
    for (int il = 0; il < hp->n_layers; il++)
        for (int k = 0; k < MODEL_TP_KINDS - 1; k++)
            for (int i = 0; i < 2; i++) {
                const char *suffix = (hp->fused ? fused : plain)[k][i];
                if (!suffix)
                    continue;
                snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
                const struct gguf_tensor *t = gguf_find_tensor(m->file, name);
                if (t)
                    align[k] = row_align_lcm(align[k], kern_row_align(t->type, path));
            }
    const struct gguf_tensor *t = gguf_find_tensor(m->file, hp->tied_output ? "token_embd.weight" : "output.weight");
    if (t)
        align[MODEL_TP_VOCAB] = kern_row_align(t->type, path);
}

/* Repacking the matrices is most of a load: jobs (the head first, being the largest,
 * then each layer) go to `threads` workers, each with a loader of its own. */
#define LOAD_MAX_THREADS 16

struct load_jobs {
    struct model *m;
    enum kern_path path;
    int n_jobs;            /* head (when last) + layers */
    bool head;
    atomic_int next;
    int *rc;               /* per job */
    char (*err)[256];      /* per job */
    uint64_t *bytes;       /* per job */
    uint64_t *all_bytes;   /* per job */
};

static void *load_worker(void *arg)
{
    struct load_jobs *j = arg;
    for (int k; (k = atomic_fetch_add(&j->next, 1)) < j->n_jobs;) {
        struct loader ld = {.m = j->m, .path = j->path, .err = j->err[k], .errlen = sizeof j->err[k]};
        int layer = k - j->head;
        j->rc[k] = layer < 0 ? load_head(&ld)
                             : load_layer(&ld, j->m->layer_begin + layer, &j->m->layers[layer]);
        j->bytes[k] = ld.weight_bytes;
        j->all_bytes[k] = ld.all_bytes;
    }
    return NULL;
}

static int load_matrices(struct model *m, const struct model_load_opts *opts, char *err, size_t errlen)
{
    struct load_jobs j = {.m = m, .path = opts->path, .head = m->last};
    j.n_jobs = (m->layer_end - m->layer_begin) + j.head;
    atomic_init(&j.next, 0);
    j.rc = calloc((size_t)j.n_jobs, sizeof *j.rc);
    j.err = calloc((size_t)j.n_jobs, sizeof *j.err);
    j.bytes = calloc((size_t)j.n_jobs, sizeof *j.bytes);
    j.all_bytes = calloc((size_t)j.n_jobs, sizeof *j.all_bytes);
    if (!j.rc || !j.err || !j.bytes || !j.all_bytes) {
        free(j.rc);
        free(j.err);
        free(j.bytes);
        free(j.all_bytes);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = opts->threads > 0 ? opts->threads : cpus > 0 ? (int)cpus : 1;
    n = n > LOAD_MAX_THREADS ? LOAD_MAX_THREADS : n > j.n_jobs ? j.n_jobs : n;
    pthread_t th[LOAD_MAX_THREADS];
    int started = 0;
    while (started < n - 1 && pthread_create(&th[started], NULL, load_worker, &j) == 0)
        started++;
    load_worker(&j); /* this thread too; it finishes whatever threads could not start */
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    int rc = 0;
    for (int k = 0; k < j.n_jobs; k++) {
        m->weight_bytes += j.bytes[k];
        m->all_weight_bytes += j.all_bytes[k];
        if (j.rc[k] && !rc) /* the first failure in file order, whatever the threads did */
            rc = cairn_fail(err, errlen, j.rc[k], "%s", j.err[k]);
    }
    free(j.rc);
    free(j.err);
    free(j.bytes);
    free(j.all_bytes);
    return rc;
}

/* Moves the dense matrices' weights into one block in the order a step reads them: each
 * layer's q, k, v, output, gate, up, down (a mixture's router in place of the last
 * three), then the head. The block is on huge pages (mem_alloc_stream) where a matrix of
 * a small model alone would be on 4 KiB ones, which cost a TLB walk each and stop the
 * hardware prefetchers at every boundary; and one product's end runs into the next one's
 * start. Experts have blocks of their own, a layer each (place_experts). Without the memory
 * for the block the matrices keep their own: the same bits either way. */

static void place_weights(struct model *m)
{
    int n_layers = m->layer_end - m->layer_begin;
    size_t n_mats = (size_t)n_layers * 8 + 1;
    struct kern_mat **mats = calloc(n_mats, sizeof *mats);
    if (!mats)
        return;
    size_t n = 0;
    for (int i = 0; i < n_layers; i++) {
        const struct model_layer *L = &m->layers[i];
        struct kern_mat *lm[] = {L->wq, L->wk, L->wv, L->wo, L->router, L->w_gate, L->w_up, L->w_down};
        for (size_t k = 0; k < sizeof lm / sizeof lm[0]; k++)
            if (lm[k])
                mats[n++] = lm[k];
    }
    if (m->output)
        mats[n++] = m->output;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += slot_bytes(mats[i]);
    uint8_t *block = total ? mem_alloc_stream(total) : NULL;
    if (block) {
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            size_t b = slot_bytes(mats[i]);
            kern_mat_move(mats[i], block + off);
            off += b;
        }
        m->weight_block = block;
    }
    free(mats);
#if defined(__GLIBC__)
    /* The matrices' old buffers below glibc's mmap threshold (which rises as large blocks
     * are freed) are free chunks of a heap, resident until trimmed: without this a draft
     * loaded after its target would hold its dense weights twice. */
    malloc_trim(0);
#endif
}

int model_load(struct model **out, const char *path, const struct model_load_opts *opts, char *err, size_t errlen)
{
    *out = NULL;
    struct model_load_opts def = {.layer_begin = 0, .layer_end = -1, .path = KERN_PATH_AUTO};
    if (!opts)
        opts = &def;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    m->tok_embd_fd = -1;
    int rc = gguf_open(&m->file, path, err, errlen);
    if (rc)
        goto fail;
    m->file_bytes = gguf_file_size(m->file);
    if ((rc = model_read_hparams(m->file, &m->hp, err, errlen)))
        goto fail;
    const struct model_hparams *hp = &m->hp;
    m->layer_begin = opts->layer_begin;
    m->layer_end = opts->layer_end < 0 ? hp->n_layers : opts->layer_end;
    if (m->layer_begin < 0 || m->layer_begin >= m->layer_end || m->layer_end > hp->n_layers) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "layer range [%d, %d) outside the model's %d layers",
                        m->layer_begin, m->layer_end, hp->n_layers);
        goto fail;
    }
    m->first = m->layer_begin == 0;
    m->last = m->layer_end == hp->n_layers;
    m->tp.world = 1;
    if (opts->tp_world > 1) { /* only this rank's rows of every matrix */
        if (!m->first || !m->last) {
            rc = cairn_fail(err, errlen, CAIRN_EINVAL, "a tensor-parallel rank holds every layer (layers %d..%d given)",
                            m->layer_begin, m->layer_end);
            goto fail;
        }
        int64_t align[MODEL_TP_KINDS];
        file_tp_aligns(m, opts->path, align);
        if ((rc = model_tp_split(hp, opts->tp_rank, opts->tp_world, align, &m->tp, err, errlen)))
            goto fail;
    }
    struct loader ld = {.m = m, .path = opts->path, .err = err, .errlen = errlen};

    const struct gguf_tensor *emb = NULL;
    if (m->first || (m->last && hp->tied_output)) {
        emb = find_tensor(&ld, "token_embd.weight", 2, hp->n_embd, hp->n_vocab, true, &rc);
        if (!emb)
            goto fail;
    }
    if (m->first) {
        m->tok_embd = emb->data;
        m->tok_embd_type = emb->type;
        m->tok_embd_row_bytes = (size_t)dtype_row_bytes(emb->type, hp->n_embd);
        m->tok_embd_offset = gguf_tensor_file_offset(m->file, emb); /* in its part, for a split model */
        m->tok_embd_fd = open(gguf_tensor_file(m->file, emb), O_RDONLY | O_CLOEXEC);
        drop_source_pages(emb->data, emb->size); /* rows are read with pread from here on */
    }
    if (m->last && (rc = load_vec(&ld, &m->output_norm, "output_norm.weight", hp->n_embd, true)))
        goto fail;
    if ((rc = load_vec(&ld, &m->rope_freq_factors, "rope_freqs.weight", hp->n_rot / 2, false)))
        goto fail;
    m->layers = calloc((size_t)(m->layer_end - m->layer_begin), sizeof *m->layers);
    if (!m->layers) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto fail;
    }
    m->weight_bytes += ld.weight_bytes;
    m->all_weight_bytes += ld.all_bytes;
    if ((rc = load_matrices(m, opts, err, errlen)))
        goto fail;
    place_weights(m);
    *out = m;
    return 0;
fail:
    model_release(m);
    return rc;
}

static void release_experts(struct kern_mat **x, int n)
{
    if (x)
        for (int e = 0; e < n; e++)
            kern_mat_release(x[e]);
    free(x);
}

static void release_layer(struct model_layer *L, int n_expert)
{
    kern_mat_release(L->router);
    release_experts(L->exp_gate, n_expert);
    release_experts(L->exp_up, n_expert);
    release_experts(L->exp_gate_up, n_expert);
    release_experts(L->exp_down, n_expert);
    free(L->exp_block); /* after the matrices that read it */
    struct kern_mat *mats[] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        kern_mat_release(mats[i]);
    float *vecs[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv, L->q_norm, L->k_norm, L->attn_post_norm,
                     L->ffn_post_norm, L->bo, L->sinks, L->router_b, L->exp_gate_b, L->exp_up_b, L->exp_down_b};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        free(vecs[i]);
}

void model_release(struct model *m)
{
    if (!m)
        return;
    if (m->layers)
        for (int i = 0; i < m->layer_end - m->layer_begin; i++)
            release_layer(&m->layers[i], m->hp.n_expert);
    free(m->layers);
    kern_mat_release(m->output);
    free(m->weight_block); /* after the matrices that read it */
    free(m->output_norm);
    free(m->rope_freq_factors);
    gguf_close(m->file);
    if (m->tok_embd_fd >= 0)
        close(m->tok_embd_fd);
    free(m);
}

uint64_t model_expert_gate_up_bytes(const struct model_layer *L, int e)
{
    if (L->exp_gate_up)
        return kern_mat_bytes(L->exp_gate_up[e]);
    return kern_mat_bytes(L->exp_gate[e]) + kern_mat_bytes(L->exp_up[e]);
}

uint64_t model_expert_bias_bytes(const struct model_layer *L, int e)
{
    uint64_t n_embd = (uint64_t)kern_mat_rows(L->exp_down[e]), n_ff = (uint64_t)kern_mat_cols(L->exp_down[e]);
    return ((L->exp_gate_b ? n_ff : 0) + (L->exp_up_b ? n_ff : 0) + (L->exp_down_b ? n_embd : 0)) * sizeof(float);
}

uint64_t model_expert_bytes(const struct model_layer *L, int e)
{
    return model_expert_gate_up_bytes(L, e) + model_expert_bias_bytes(L, e) + kern_mat_bytes(L->exp_down[e]);
}

int model_embed(const struct model *m, int32_t token, void *row_buf, float *out)
{
    if (!m->first)
        return CAIRN_ESTATE;
    if (token < 0 || token >= m->hp.n_vocab)
        return CAIRN_ERANGE;
    size_t rb = m->tok_embd_row_bytes;
    const char *row = (const char *)m->tok_embd + (size_t)token * rb;
    if (m->tok_embd_fd >= 0 &&
        pread(m->tok_embd_fd, row_buf, rb, (off_t)(m->tok_embd_offset + (uint64_t)token * rb)) == (ssize_t)rb)
        row = row_buf;
    return kern_dequantize_row(m->tok_embd_type, row, out, m->hp.n_embd);
}
