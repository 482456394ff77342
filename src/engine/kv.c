#include "engine/kv.h"

#include "base/dtype.h"
#include "base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One sequence: its length in positions and its block table. The tables of all
 * sequences live in one lazily committed mapping of max_seqs rows of n_blocks entries
 * (a sequence never holds a block twice, so n_blocks entries always suffice), which
 * is why kv_prepare never allocates. */
struct kv_seq {
    int64_t len;      /* positions stored */
    int64_t n_blocks; /* entries of table in use: ceil(len / block_tokens) */
    int32_t *table;   /* block ids, max n_blocks entries */
    int64_t released; /* table entries [0, released) were passed by the window (their window
                         rows released where this sequence alone held them) */
};

struct kv_cache {
    struct kv_config cfg;
    size_t row_bytes[2];   /* K, V: bytes of kv_dim elements of their type */
    size_t block_bytes[2]; /* row_bytes * block_tokens */
    size_t layer_bytes[2]; /* block_bytes * n_blocks: one K or V mapping */
    uint8_t **k, **v;      /* [n_layers] mappings of layer_bytes[0] / [1] */
    int32_t *refs;       /* [n_blocks] sequences holding each block */
    int32_t *free_stack; /* [n_blocks] free block ids, top at n_free - 1 */
    int64_t n_free;
    struct kv_seq *seqs; /* [max_seqs] */
    int32_t *tables;     /* mapping of max_seqs * n_blocks entries */
    size_t tables_bytes;
    void (*observer)(void *arg, const struct kv_op *op); /* NULL: none */
    void *observer_arg;
    int64_t *window;     /* [n_layers] sliding window of each layer (0: none) */
    int64_t max_window;  /* the largest of them */
    uint8_t *dropped;    /* [n_blocks] window rows released since the block was taken */
    int64_t n_dropped;
};

/* Sizes of a config, or an error message when it is invalid or overflows. */
struct kv_sizes {
    size_t row_bytes[2], block_bytes[2], layer_bytes[2], tables_bytes;
    uint64_t total;
};

static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static int compute_sizes(const struct kv_config *c, struct kv_sizes *s, char *err, size_t errlen)
{
    if (!c)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "kv: no config");
    int types[2] = {c->type_k, c->type_v};
    for (int i = 0; i < 2; i++)
        if (types[i] != DT_F16 && types[i] != DT_F32 && types[i] != DT_Q8_0 && types[i] != DT_Q4_0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "kv: %s type %s not supported (f16, f32, q8_0 or q4_0)",
                              i ? "V" : "K", dtype_name(types[i]));
    if (c->n_layers <= 0 || c->kv_dim <= 0 || c->block_tokens <= 0 || c->n_blocks <= 0 ||
        c->max_seqs <= 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "kv: sizes must be positive (n_layers %d, kv_dim %lld, block_tokens %d, "
                          "n_blocks %lld, max_seqs %d)",
                          c->n_layers, (long long)c->kv_dim, c->block_tokens,
                          (long long)c->n_blocks, c->max_seqs);
    if (c->n_blocks > INT32_MAX)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "kv: n_blocks %lld exceeds block ids (int32)",
                          (long long)c->n_blocks);
    uint64_t total = 0;
    for (int i = 0; i < 2; i++) {
        const struct dtype_info *ti = dtype_info(types[i]);
        if (c->kv_dim % ti->block_elems)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "kv: %s type %s needs kv_dim %lld a multiple of %d",
                              i ? "V" : "K", dtype_name(types[i]), (long long)c->kv_dim, (int)ti->block_elems);
        size_t two_layers;
        if ((uint64_t)c->kv_dim > SIZE_MAX || (uint64_t)c->n_blocks > SIZE_MAX ||
            !mul_ok((size_t)(c->kv_dim / ti->block_elems), (size_t)ti->block_bytes, &s->row_bytes[i]) ||
            !mul_ok(s->row_bytes[i], (size_t)c->block_tokens, &s->block_bytes[i]) ||
            !mul_ok(s->block_bytes[i], (size_t)c->n_blocks, &s->layer_bytes[i]) ||
            !mul_ok(s->layer_bytes[i], (size_t)c->n_layers, &two_layers) ||
            !mul_ok((size_t)c->max_seqs * sizeof(int32_t), (size_t)c->n_blocks, &s->tables_bytes) ||
            s->layer_bytes[i] > (size_t)INT64_MAX || total + two_layers < total)
            return cairn_fail(err, errlen, CAIRN_ERANGE,
                              "kv: size overflows (%d layers x %lld blocks x %d tokens x %lld dims)",
                              c->n_layers, (long long)c->n_blocks, c->block_tokens,
                              (long long)c->kv_dim);
        total += two_layers;
    }
    s->total = total;
    return 0;
}

uint64_t kv_bytes_for(const struct kv_config *cfg)
{
    struct kv_sizes s = {0};
    if (compute_sizes(cfg, &s, NULL, 0))
        return 0;
    return s.total;
}

/* Anonymous private mappings are committed page by page on first touch, so a big
 * cache costs only what its sequences have used. */
static void *map_lazy(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* map_lazy for a layer's K or V, advised to use huge pages: a decode at depth reads
 * every block of every layer (512 MiB at 16384 positions of llama-1b, where the TLB
 * covers ~12 MiB of small pages), and its block pieces are too short for a page walk to
 * hide behind. Committed in 2 MiB steps then, not 4 KiB. Only advice: where huge pages
 * are off or short the map keeps small pages; a window layer's maps go back to small pages
 * (kv_set_window). */
static void *map_lazy_huge(size_t bytes)
{
    void *p = map_lazy(bytes);
    if (p)
        (void)madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void kv_release(struct kv_cache *kv)
{
    if (!kv)
        return;
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (kv->k && kv->k[l])
            munmap(kv->k[l], kv->layer_bytes[0]);
        if (kv->v && kv->v[l])
            munmap(kv->v[l], kv->layer_bytes[1]);
    }
    if (kv->tables)
        munmap(kv->tables, kv->tables_bytes);
    free(kv->k);
    free(kv->v);
    free(kv->refs);
    free(kv->window);
    free(kv->dropped);
    free(kv->free_stack);
    free(kv->seqs);
    free(kv);
}

int kv_create(struct kv_cache **out, const struct kv_config *cfg, char *err, size_t errlen)
{
    struct kv_sizes s = {0};
    int rc = compute_sizes(cfg, &s, err, errlen);
    if (rc)
        return rc;
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "kv: out of memory");
    kv->cfg = *cfg;
    memcpy(kv->row_bytes, s.row_bytes, sizeof kv->row_bytes);
    memcpy(kv->block_bytes, s.block_bytes, sizeof kv->block_bytes);
    memcpy(kv->layer_bytes, s.layer_bytes, sizeof kv->layer_bytes);
    kv->tables_bytes = s.tables_bytes;
    size_t nb = (size_t)cfg->n_blocks;
    kv->k = calloc((size_t)cfg->n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)cfg->n_layers, sizeof *kv->v);
    kv->refs = calloc(nb, sizeof *kv->refs);
    kv->free_stack = malloc(nb * sizeof *kv->free_stack);
    kv->seqs = calloc((size_t)cfg->max_seqs, sizeof *kv->seqs);
    kv->window = calloc((size_t)cfg->n_layers, sizeof *kv->window);
    kv->dropped = calloc(nb, sizeof *kv->dropped);
    if (!kv->k || !kv->v || !kv->refs || !kv->free_stack || !kv->seqs || !kv->window || !kv->dropped) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "kv: out of memory for bookkeeping of %lld blocks",
                        (long long)cfg->n_blocks);
        goto fail;
    }
    kv->tables = map_lazy(s.tables_bytes);
    if (!kv->tables) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "kv: mmap of %zu bytes for block tables: %s",
                        s.tables_bytes, strerror(errno));
        goto fail;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        kv->k[l] = map_lazy_huge(s.layer_bytes[0]);
        if (!kv->k[l]) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "kv: mmap of %zu bytes for layer %d K: %s",
                            s.layer_bytes[0], l, strerror(errno));
            goto fail;
        }
        kv->v[l] = map_lazy_huge(s.layer_bytes[1]);
        if (!kv->v[l]) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "kv: mmap of %zu bytes for layer %d V: %s",
                            s.layer_bytes[1], l, strerror(errno));
            goto fail;
        }
    }
    /* Pop order is 0, 1, 2 ... so a fresh cache hands out blocks in address order. */
    for (size_t i = 0; i < nb; i++)
        kv->free_stack[i] = (int32_t)(nb - 1 - i);
    kv->n_free = (int64_t)nb;
    for (int i = 0; i < cfg->max_seqs; i++)
        kv->seqs[i].table = kv->tables + (size_t)i * nb;
    *out = kv;
    return 0;
fail:
    kv_release(kv);
    return rc;
}

const struct kv_config *kv_config(const struct kv_cache *kv) { return &kv->cfg; }

static struct kv_seq *seq_of(const struct kv_cache *kv, int seq)
{
    if (!kv || seq < 0 || seq >= kv->cfg.max_seqs)
        return NULL;
    return &kv->seqs[seq];
}

static void notify(struct kv_cache *kv, enum kv_op_kind kind, int seq, int seq2, int64_t pos, int64_t n)
{
    if (kv->observer) {
        struct kv_op op = {.kind = kind, .seq = seq, .seq2 = seq2, .pos = pos, .n = n};
        kv->observer(kv->observer_arg, &op);
    }
}

void kv_set_observer(struct kv_cache *kv, void (*fn)(void *arg, const struct kv_op *op), void *arg)
{
    kv->observer = fn;
    kv->observer_arg = fn ? arg : NULL;
}

static int64_t blocks_for(int64_t len, int bt) { return len / bt + (len % bt != 0); }

static void block_unref(struct kv_cache *kv, int32_t b)
{
    if (--kv->refs[b] == 0)
        kv->free_stack[kv->n_free++] = b;
}

static int32_t block_take(struct kv_cache *kv)
{
    int32_t b = kv->free_stack[--kv->n_free];
    kv->refs[b] = 1;
    if (kv->dropped[b]) { /* its window rows come back as zero pages when written */
        kv->dropped[b] = 0;
        kv->n_dropped--;
    }
    return b;
}

/* Releases the whole pages inside [p, p + len). */
static void release_pages(uint8_t *p, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + len) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* The window layers' rows of the blocks s has passed by more than the window and the slack
 * (kv.h), where s alone holds them. */
/* from: the first position just prepared. The queries of the coming forward start there and
 * see back to from - window + 1, so positions from there on must stay, whatever length the
 * preparation reserved (a prompt chunk longer than the slack would otherwise release the
 * positions its first rows need). */
static void seq_release_behind(struct kv_cache *kv, struct kv_seq *s, int64_t from)
{
    if (kv->max_window <= 0)
        return;
    int bt = kv->cfg.block_tokens;
    int64_t keep_from = from - kv->max_window - KV_WINDOW_SLACK; /* positions >= this stay */
    for (; s->released < s->n_blocks && (s->released + 1) * bt <= keep_from; s->released++) {
        int32_t b = s->table[s->released];
        if (kv->refs[b] != 1 || kv->dropped[b])
            continue;
        for (int l = 0; l < kv->cfg.n_layers; l++) {
            if (!kv->window[l])
                continue;
            release_pages(kv->k[l] + (size_t)b * kv->block_bytes[0], kv->block_bytes[0]);
            release_pages(kv->v[l] + (size_t)b * kv->block_bytes[1], kv->block_bytes[1]);
        }
        kv->dropped[b] = 1;
        kv->n_dropped++;
    }
}

int kv_set_window(struct kv_cache *kv, int layer, int64_t window)
{
    if (layer < 0 || layer >= kv->cfg.n_layers || window < 0)
        return CAIRN_EINVAL;
    kv->window[layer] = window;
    /* A window layer holds a few blocks and gives the rest back (release_pages); on huge
     * pages khugepaged would gather the given-back pages into whole 2 MiB again. */
    (void)madvise(kv->k[layer], kv->layer_bytes[0], window > 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    (void)madvise(kv->v[layer], kv->layer_bytes[1], window > 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    kv->max_window = 0;
    for (int l = 0; l < kv->cfg.n_layers; l++)
        kv->max_window = kv->window[l] > kv->max_window ? kv->window[l] : kv->max_window;
    return 0;
}

int64_t kv_window(const struct kv_cache *kv, int layer)
{
    return layer >= 0 && layer < kv->cfg.n_layers ? kv->window[layer] : 0;
}

int64_t kv_seq_min_resume(const struct kv_cache *kv, int seq)
{
    const struct kv_seq *s = seq_of(kv, seq);
    if (!s || s->released == 0)
        return 0;
    /* a query at pos sees (pos - window, pos]: all of it must lie at or after the released blocks */
    return s->released * kv->cfg.block_tokens + kv->max_window - 1;
}

int64_t kv_released_blocks(const struct kv_cache *kv) { return kv->n_dropped; }

/* Drops table entries [keep, n_blocks) of s and sets its length to len. */
static void seq_drop(struct kv_cache *kv, struct kv_seq *s, int64_t keep, int64_t len)
{
    for (int64_t i = keep; i < s->n_blocks; i++)
        block_unref(kv, s->table[i]);
    s->n_blocks = keep;
    s->len = len;
    if (s->released > keep)
        s->released = keep;
}

int kv_prepare(struct kv_cache *kv, int seq, int64_t pos, int64_t n)
{
    struct kv_seq *s = seq_of(kv, seq);
    if (!s || pos < 0 || pos > s->len || n < 0 || n > INT64_MAX - pos)
        return CAIRN_EINVAL;
    int bt = kv->cfg.block_tokens;
    int64_t keep = blocks_for(pos, bt);     /* blocks holding positions < pos */
    int64_t want = blocks_for(pos + n, bt); /* blocks after the call */
    /* The block holding pos is written in place only when no other sequence sees it. */
    int cow = n > 0 && pos % bt != 0 && kv->refs[s->table[keep - 1]] > 1;

    /* Count before changing anything, so that CAIRN_EFULL leaves the sequence as it was. */
    int64_t avail = kv->n_free;
    for (int64_t i = keep; i < s->n_blocks; i++)
        avail += kv->refs[s->table[i]] == 1;
    if (want - keep + cow > avail)
        return CAIRN_EFULL;

    seq_drop(kv, s, keep, pos);
    if (cow) {
        int32_t old = s->table[keep - 1];
        int32_t fresh = block_take(kv);
        size_t kb = kv->block_bytes[0], vb = kv->block_bytes[1];
        for (int l = 0; l < kv->cfg.n_layers; l++) {
            memcpy(kv->k[l] + (size_t)fresh * kb, kv->k[l] + (size_t)old * kb, kb);
            memcpy(kv->v[l] + (size_t)fresh * vb, kv->v[l] + (size_t)old * vb, vb);
        }
        block_unref(kv, old);
        s->table[keep - 1] = fresh;
    }
    while (s->n_blocks < want)
        s->table[s->n_blocks++] = block_take(kv);
    s->len = pos + n;
    seq_release_behind(kv, s, pos);
    notify(kv, KV_OP_PREPARE, seq, 0, pos, n);
    return 0;
}

int64_t kv_seq_len(const struct kv_cache *kv, int seq)
{
    const struct kv_seq *s = seq_of(kv, seq);
    return s ? s->len : CAIRN_EINVAL;
}

int64_t kv_slot(const struct kv_cache *kv, int seq, int64_t pos)
{
    const struct kv_seq *s = seq_of(kv, seq);
    if (!s || pos < 0 || pos >= s->len)
        return -1;
    int bt = kv->cfg.block_tokens;
    return (int64_t)s->table[pos / bt] * bt + pos % bt;
}

const int32_t *kv_seq_blocks(const struct kv_cache *kv, int seq, int64_t *n)
{
    const struct kv_seq *s = seq_of(kv, seq);
    *n = s ? s->n_blocks : 0;
    return s ? s->table : NULL;
}

static void *row(const struct kv_cache *kv, int which, int layer, int64_t slot)
{
    if (layer < 0 || layer >= kv->cfg.n_layers || slot < 0 ||
        slot >= kv->cfg.n_blocks * kv->cfg.block_tokens)
        return NULL;
    return (which ? kv->v : kv->k)[layer] + (size_t)slot * kv->row_bytes[which];
}

void *kv_k(struct kv_cache *kv, int layer, int64_t slot) { return row(kv, 0, layer, slot); }

void *kv_v(struct kv_cache *kv, int layer, int64_t slot) { return row(kv, 1, layer, slot); }

void kv_truncate(struct kv_cache *kv, int seq, int64_t pos)
{
    struct kv_seq *s = seq_of(kv, seq);
    if (!s || pos < 0 || pos >= s->len)
        return;
    seq_drop(kv, s, blocks_for(pos, kv->cfg.block_tokens), pos);
    notify(kv, KV_OP_TRUNCATE, seq, 0, pos, 0);
}

void kv_seq_clear(struct kv_cache *kv, int seq) { kv_truncate(kv, seq, 0); }

int kv_fork(struct kv_cache *kv, int src, int dst)
{
    struct kv_seq *s = seq_of(kv, src), *d = seq_of(kv, dst);
    if (!s || !d || src == dst)
        return CAIRN_EINVAL;
    if (d->len != 0)
        return CAIRN_ESTATE;
    for (int64_t i = 0; i < s->n_blocks; i++) {
        d->table[i] = s->table[i];
        kv->refs[s->table[i]]++;
    }
    d->n_blocks = s->n_blocks;
    d->len = s->len;
    d->released = s->released;
    notify(kv, KV_OP_FORK, src, dst, 0, 0);
    return 0;
}

int64_t kv_free_blocks(const struct kv_cache *kv) { return kv->n_free; }

int kv_block_refs(const struct kv_cache *kv, int32_t block)
{
    if (!kv || block < 0 || block >= kv->cfg.n_blocks)
        return CAIRN_EINVAL;
    return kv->refs[block];
}
