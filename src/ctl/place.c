#include "ctl/place.h"

#include "base/array.h"
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

#define NO_LINK UINT32_MAX
#define FIX_BITS 12 /* fixed-point scale of the utilisation searched when repairing */
#define DP_CELLS ((size_t)1 << 18) /* ranks x boundaries for the exact split search */

struct ctx {
    const struct place_request *req;
    const struct place_model *m;
    struct place_result *out;
    size_t n;
    uint32_t L;            /* layers */
    uint64_t *free;        /* [n] available - held */
    uint32_t *rtt;         /* [n*n] NO_LINK where no link */
    size_t *byfree;        /* [n] node indices, most free memory first, ties by id */
    const char **id;       /* [n] result-owned copies */
    uint64_t *prefix;      /* [L+1] bytes of layers [0, i) */
    uint64_t *kv_prefix;   /* [L+1] KV of layers [0, i) (a sliding-window layer holds less) */
    uint64_t draft_all;    /* draft weights + draft KV */
    size_t cap;            /* candidates allocated in out */
    /* scratch for one node set, each sized n (or n*n) */
    size_t *mem;           /* members (node indices), most free first */
    size_t *ord;           /* members in rank order */
    size_t *path;          /* DFS path, local positions */
    unsigned char *on;     /* local position on the path */
    uint64_t *nbr;         /* [n*n] per local position: (rtt << 16 | neighbour), sorted */
    size_t *nnbr;          /* [n] */
    uint32_t *cnt;         /* layers per rank */
    uint32_t *want;        /* proportional layers per rank, the repair's target */
    uint32_t *idx, *idx2;  /* rank orders for the largest remainder */
    uint64_t *aux;         /* remainders, capacities */
    unsigned char *reach;  /* [min(n*(L+1), DP_CELLS)]: boundaries ranks can reach */
    size_t reach_cap;
    struct place_share *tmp, *first, *keep;
};

/* ---- small helpers ---- */

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(buf, len, "%.1f GiB", (double)b / (double)((uint64_t)1 << 30));
    else if (b >= (uint64_t)1 << 20)
        snprintf(buf, len, "%.1f MiB", (double)b / (double)((uint64_t)1 << 20));
    else if (b >= 1024)
        snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)b);
}

/* Two sizes as text that a reader can tell apart (exact bytes when the rounding hides
 * the difference). */
static void fmt_pair(char *a, char *b, size_t len, uint64_t x, uint64_t y)
{
    fmt_bytes(a, len, x);
    fmt_bytes(b, len, y);
    if (x != y && strcmp(a, b) == 0) {
        snprintf(a, len, "%llu bytes", (unsigned long long)x);
        snprintf(b, len, "%llu bytes", (unsigned long long)y);
    }
}

__attribute__((format(printf, 2, 3))) static void reason_add(char *r, const char *fmt, ...)
{
    size_t len = strlen(r);
    if (len + 4 >= PLACE_REASON_MAX)
        return;
    if (len) {
        memcpy(r + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(r + len, PLACE_REASON_MAX - len, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= PLACE_REASON_MAX - len)
        memcpy(r + PLACE_REASON_MAX - 4, "...", 4);
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

static uint32_t link_rtt(const struct ctx *c, size_t a, size_t b)
{
    return c->rtt[a * c->n + b];
}

/* ---- per-rank needs ---- */

static void pipe_fixed(const struct ctx *c, uint32_t r, uint32_t k, struct place_need *nd)
{
    memset(nd, 0, sizeof *nd);
    if (r == 0) {
        nd->embedding = c->m->embed_bytes;
        nd->draft = c->draft_all;
    }
    if (r == k - 1) {
        uint64_t head = c->m->tied ? (k == 1 ? 0 : c->m->embed_bytes) : c->m->head_bytes;
        nd->head = c->m->norm_bytes + head;
    }
}

/* Layer weights and KV of layers [b, e) on one rank. */
static uint64_t range_bytes(const struct ctx *c, uint32_t b, uint32_t e)
{
    return c->prefix[e] - c->prefix[b] + c->kv_prefix[e] - c->kv_prefix[b];
}

static uint64_t pipe_total_need(const struct ctx *c, uint32_t k)
{
    uint64_t t = range_bytes(c, 0, c->L);
    for (uint32_t r = 0; r < k; r += (k > 1 ? k - 1 : 1)) {
        struct place_need nd;
        pipe_fixed(c, r, k, &nd);
        t += nd.embedding + nd.head + nd.draft;
    }
    return t;
}

/* Norms and biases of one layer, held whole by every tensor rank: at most 4 vectors of the
 * output norm's size (two norms; qwen2's q, k and v biases are about one more). */
#define TENSOR_LAYER_VECTORS 4

static void tensor_need(const struct ctx *c, uint32_t r, uint32_t k, struct place_need *nd)
{
    memset(nd, 0, sizeof *nd);
    nd->kv = ceil_div(c->kv_prefix[c->L], k); /* its KV heads */
    nd->draft = r == 0 ? c->draft_all : 0;
    if (k == 1) { /* one node: the whole model */
        nd->layers = c->prefix[c->L];
        nd->embedding = c->m->embed_bytes;
        nd->head = c->m->norm_bytes + (c->m->tied ? 0 : c->m->head_bytes);
    } else {
        /* A rank loads only its rows of every matrix (model.h, struct model_tp): 1/k of the
         * layers and of the head, the layers' vectors whole. The embedding lookup reads
         * rows from the file on demand (pread): nothing of it stays resident but, tied, the
         * rank's rows of it as the head. */
        nd->layers = ceil_div(c->prefix[c->L], k) + (uint64_t)c->L * TENSOR_LAYER_VECTORS * c->m->norm_bytes;
        nd->embedding = c->m->tied ? ceil_div(c->m->embed_bytes, k) : 0;
        nd->head = c->m->norm_bytes + (c->m->tied ? 0 : ceil_div(c->m->head_bytes, k));
    }
    nd->total = nd->layers + nd->kv + nd->embedding + nd->head + nd->draft;
}

static uint64_t tensor_total_need(const struct ctx *c, uint32_t k)
{
    struct place_need nd;
    tensor_need(c, 1, k, &nd);
    return nd.total * k + c->draft_all;
}

/* ---- pipeline splits ---- */

/* Layers in proportion to free memory, largest remainder (ties: lower rank), then at
 * least one layer per rank taken from the largest share (ties: lower rank). */
static void split_prop(struct ctx *c, const size_t *ord, uint32_t k, uint32_t *cnt)
{
    u128 S = 0;
    for (uint32_t i = 0; i < k; i++)
        S += c->free[ord[i]];
    int equal = S == 0;
    if (equal)
        S = k;
    uint32_t given = 0;
    for (uint32_t i = 0; i < k; i++) {
        u128 q = (u128)c->L * (equal ? 1 : c->free[ord[i]]);
        cnt[i] = (uint32_t)(q / S);
        c->aux[i] = (uint64_t)(q % S);
        given += cnt[i];
    }
    /* The leftover layers (fewer than k) go to the largest remainders, ties to the
     * lower rank: a stable merge sort of the ranks by remainder, O(k log k). */
    uint32_t *ix = c->idx, *tmp = c->idx2;
    for (uint32_t i = 0; i < k; i++)
        ix[i] = i;
    for (uint32_t w = 1; w < k; w *= 2) {
        for (uint32_t lo = 0; lo < k; lo += 2 * w) {
            uint32_t mid = lo + w < k ? lo + w : k, hi = lo + 2 * w < k ? lo + 2 * w : k;
            uint32_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = c->aux[ix[b]] > c->aux[ix[a]] ? ix[b++] : ix[a++];
            while (a < mid)
                tmp[o++] = ix[a++];
            while (b < hi)
                tmp[o++] = ix[b++];
        }
        uint32_t *t = ix;
        ix = tmp;
        tmp = t;
    }
    for (uint32_t i = 0; i < c->L - given; i++)
        cnt[ix[i]]++;
    /* Ranks left with none take one from the largest share (ties: lower rank), which
     * has at least two: L >= k layers sit on fewer than k ranks. */
    for (uint32_t i = 0; i < k; i++) {
        if (cnt[i] > 0)
            continue;
        uint32_t big = 0;
        for (uint32_t j = 1; j < k; j++)
            if (cnt[j] > cnt[big])
                big = j;
        cnt[big]--;
        cnt[i] = 1;
    }
}

/* Fills sh from the counts; returns the number of ranks whose need exceeds their free
 * memory. */
static uint32_t fill_pipe(const struct ctx *c, const size_t *ord, uint32_t k,
                          const uint32_t *cnt, struct place_share *sh)
{
    uint32_t b = 0, bad = 0;
    for (uint32_t r = 0; r < k; r++) {
        struct place_share *s = &sh[r];
        uint32_t e = b + cnt[r];
        s->node = ord[r];
        s->id = c->id[ord[r]];
        s->rank = r;
        s->layer_begin = b;
        s->layer_end = e;
        s->free = c->free[ord[r]];
        pipe_fixed(c, r, k, &s->need);
        s->need.layers = c->prefix[e] - c->prefix[b];
        s->need.kv = c->kv_prefix[e] - c->kv_prefix[b];
        s->need.total = s->need.layers + s->need.kv + s->need.embedding + s->need.head +
                        s->need.draft;
        bad += s->need.total > s->free;
        b = e;
    }
    return bad;
}

static uint64_t rank_room(const struct ctx *c, uint32_t r, uint32_t k, uint64_t cap, int *ok)
{
    struct place_need nd;
    pipe_fixed(c, r, k, &nd);
    uint64_t fixed = nd.embedding + nd.head + nd.draft;
    *ok = fixed <= cap;
    return *ok ? cap - fixed : 0;
}

/* Fallback for very long pipelines (k * (L+1) > DP_CELLS): each rank takes the longest
 * run that fits, leaving one layer per later rank. It may miss a split when a later
 * rank is forced onto a layer too big for it. */
static int split_greedy(const struct ctx *c, uint32_t k, const uint64_t *caps, uint32_t *cnt)
{
    uint32_t b = 0;
    for (uint32_t r = 0; r < k; r++) {
        int ok;
        uint64_t room = rank_room(c, r, k, caps[r], &ok);
        if (!ok)
            return -1;
        if (r == k - 1) {
            if (range_bytes(c, b, c->L) > room)
                return -1;
            cnt[r] = c->L - b;
            return 0;
        }
        if (range_bytes(c, b, b + 1) > room)
            return -1;
        uint32_t lo = b + 1, hi = c->L - (k - 1 - r);
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if (range_bytes(c, b, mid) <= room)
                lo = mid;
            else
                hi = mid - 1;
        }
        cnt[r] = lo - b;
        b = lo;
    }
    return 0;
}

/* Is there a contiguous split (>= 1 layer per rank) with every rank within caps? Exact:
 * R[r][b] says ranks 0..r-1 can cover layers [0, b). Rank r from a reachable b can end
 * anywhere in [b+1, emax(b)], and emax never decreases with b, so each rank is one sweep.
 * The split is read back from the last rank choosing, for each rank, the start nearest
 * the proportional one (want). O(k * L). */
static int split_fit(struct ctx *c, uint32_t k, const uint64_t *caps, const uint32_t *want,
                     uint32_t *cnt)
{
    uint32_t L = c->L;
    size_t W = (size_t)L + 1;
    if ((size_t)k * W > c->reach_cap)
        return split_greedy(c, k, caps, cnt);
    unsigned char *R = c->reach;
    memset(R, 0, (size_t)k * W);
    R[0] = 1;
    int ok;
    for (uint32_t r = 0; r + 1 < k; r++) {
        uint64_t room = rank_room(c, r, k, caps[r], &ok);
        if (!ok)
            return -1;
        const unsigned char *cur = R + (size_t)r * W;
        unsigned char *nxt = R + (size_t)(r + 1) * W;
        uint32_t lim = L - (k - 1 - r); /* furthest end of rank r */
        uint32_t e = 0, marked = 0;     /* nxt[1..marked] already set */
        for (uint32_t b = 0; b < lim; b++) {
            if (!cur[b])
                continue;
            if (e < b)
                e = b;
            while (e < lim && range_bytes(c, b, e + 1) <= room)
                e++;
            for (uint32_t x = (b + 1 > marked + 1 ? b + 1 : marked + 1); x <= e; x++)
                nxt[x] = 1;
            if (e > marked)
                marked = e;
        }
    }
    uint32_t end = L, start = 0;
    for (uint32_t rr = k; rr-- > 0;) {
        uint64_t room = rank_room(c, rr, k, caps[rr], &ok);
        if (!ok)
            return -1;
        start = 0;
        for (uint32_t r2 = 0; r2 < rr; r2++)
            start += want[r2];
        const unsigned char *cur = R + (size_t)rr * W;
        uint32_t pick = UINT32_MAX, dist = UINT32_MAX;
        for (uint32_t b = 0; b < end; b++) {
            if (!cur[b] || range_bytes(c, b, end) > room)
                continue;
            uint32_t d = b > start ? b - start : start - b;
            if (d < dist) {
                dist = d;
                pick = b;
            }
        }
        if (pick == UINT32_MAX)
            return -1; /* only possible at the last rank: each earlier end was reachable */
        cnt[rr] = end - pick;
        end = pick;
    }
    return 0;
}

static void scaled_caps(struct ctx *c, const size_t *ord, uint32_t k, uint64_t scale)
{
    for (uint32_t r = 0; r < k; r++)
        c->aux[r] = (uint64_t)(((u128)c->free[ord[r]] * scale) >> FIX_BITS);
}

/* The fitting split with the lowest max need/free (to 2^-FIX_BITS), nearest the
 * proportional one: layers move from full ranks toward ranks with slack. -1 when no
 * contiguous split fits. */
static int split_balanced(struct ctx *c, const size_t *ord, uint32_t k, uint32_t *cnt)
{
    uint64_t lo = 0, hi = (uint64_t)1 << FIX_BITS;
    scaled_caps(c, ord, k, hi);
    if (split_fit(c, k, c->aux, c->want, cnt) != 0)
        return -1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        scaled_caps(c, ord, k, mid);
        if (split_fit(c, k, c->aux, c->want, cnt) == 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    scaled_caps(c, ord, k, hi);
    return split_fit(c, k, c->aux, c->want, cnt);
}

/* Proportional split, repaired when a rank does not fit. Returns 1 when it fits; else
 * sh holds the proportional split, for the refusal. */
static int eval_pipe_order(struct ctx *c, const size_t *ord, uint32_t k, struct place_share *sh)
{
    split_prop(c, ord, k, c->cnt);
    if (fill_pipe(c, ord, k, c->cnt, sh) == 0)
        return 1;
    memcpy(c->want, c->cnt, k * sizeof *c->want);
    if (split_balanced(c, ord, k, c->cnt) == 0 && fill_pipe(c, ord, k, c->cnt, sh) == 0)
        return 1;
    split_prop(c, ord, k, c->cnt);
    fill_pipe(c, ord, k, c->cnt, sh);
    return 0;
}

static void fill_tensor(const struct ctx *c, const size_t *ord, uint32_t k, struct place_share *sh)
{
    for (uint32_t r = 0; r < k; r++) {
        struct place_share *s = &sh[r];
        s->node = ord[r];
        s->id = c->id[ord[r]];
        s->rank = r;
        s->layer_begin = 0;
        s->layer_end = c->L;
        s->free = c->free[ord[r]];
        tensor_need(c, r, k, &s->need);
    }
}

/* ---- candidates ---- */

static struct place_candidate *cand_new(struct ctx *c, uint32_t k)
{
    struct place_result *out = c->out;
    if (array_reserve(&out->cands, &c->cap, out->n_cands + 1, sizeof *out->cands, 16))
        return NULL;
    struct place_candidate *cd = &out->cands[out->n_cands];
    memset(cd, 0, sizeof *cd);
    if (k) {
        cd->shares = calloc(k, sizeof *cd->shares);
        if (!cd->shares)
            return NULL;
    }
    cd->n_nodes = k;
    out->n_cands++;
    return cd;
}

static void reason_memory(char *reason, const struct place_share *sh, uint32_t k)
{
    for (uint32_t r = 0; r < k; r++) {
        if (sh[r].need.total <= sh[r].free)
            continue;
        char a[40], b[40];
        fmt_pair(a, b, sizeof a, sh[r].need.total, sh[r].free);
        reason_add(reason, "node %s: needs %s, has %s free", sh[r].id, a, b);
    }
}

static void rtt_of(const struct ctx *c, struct place_candidate *cd, int all_pairs)
{
    cd->max_rtt_us = 0;
    cd->sum_rtt_us = 0;
    for (uint32_t i = 0; i + 1 < cd->n_nodes; i++) {
        uint32_t jend = all_pairs ? cd->n_nodes : i + 2;
        for (uint32_t j = i + 1; j < jend; j++) {
            uint32_t t = link_rtt(c, cd->shares[i].node, cd->shares[j].node);
            if (t == NO_LINK)
                continue;
            if (t > cd->max_rtt_us)
                cd->max_rtt_us = t;
            cd->sum_rtt_us += t;
        }
    }
}

static void finish(struct place_candidate *cd)
{
    cd->accepted = cd->reason[0] == '\0';
    cd->free_left = 0;
    if (cd->accepted)
        for (uint32_t r = 0; r < cd->n_nodes; r++)
            cd->free_left += cd->shares[r].free - cd->shares[r].need.total;
}

/* A refused candidate on the given members (most free first) whose shares show the
 * layout the sharding would give them. */
static int emit_refused(struct ctx *c, const size_t *mem, uint32_t k, const char *reason)
{
    struct place_candidate *cd = cand_new(c, k);
    if (!cd)
        return CAIRN_ENOMEM;
    if (c->req->sharding == PLACE_TENSOR) {
        fill_tensor(c, mem, k, cd->shares);
        cd->executable = 1;
    } else {
        if (k > 0 && k <= c->L) {
            split_prop(c, mem, k, c->cnt);
            fill_pipe(c, mem, k, c->cnt, cd->shares);
        } else {
            for (uint32_t r = 0; r < k; r++) {
                cd->shares[r].node = mem[r];
                cd->shares[r].id = c->id[mem[r]];
                cd->shares[r].rank = r;
                cd->shares[r].free = c->free[mem[r]];
            }
        }
        cd->executable = 1;
    }
    snprintf(cd->reason, sizeof cd->reason, "%s", reason);
    finish(cd);
    return 0;
}

/* Local positions reachable from position 0 over links among the members; returns the
 * first unreachable position or k. */
static uint32_t first_unreached(struct ctx *c, uint32_t k)
{
    memset(c->on, 0, k);
    size_t *queue = c->path;
    size_t head = 0, tail = 0;
    queue[tail++] = 0;
    c->on[0] = 1;
    while (head < tail) {
        size_t u = queue[head++];
        for (size_t i = 0; i < c->nnbr[u]; i++) {
            size_t v = (size_t)(c->nbr[u * c->n + i] & 0xffff);
            if (!c->on[v]) {
                c->on[v] = 1;
                queue[tail++] = v;
            }
        }
    }
    for (uint32_t i = 0; i < k; i++)
        if (!c->on[i])
            return i;
    return k;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

struct search {
    uint32_t k;
    size_t steps;
    int stop, cut;     /* cut: the step bound ended the search */
    uint32_t orders;
    int have_fit;
    uint32_t fit_max;
    uint64_t fit_sum;
};

static void order_rtt(const struct ctx *c, const size_t *ord, uint32_t k, uint32_t *mx, uint64_t *sum)
{
    *mx = 0;
    *sum = 0;
    for (uint32_t i = 0; i + 1 < k; i++) {
        uint32_t t = link_rtt(c, ord[i], ord[i + 1]);
        if (t > *mx)
            *mx = t;
        *sum += t;
    }
}

static void on_path(struct ctx *c, struct search *s)
{
    uint32_t k = s->k;
    for (uint32_t i = 0; i < k; i++)
        c->ord[i] = c->mem[c->path[i]];
    struct place_share *dst = s->orders == 0 ? c->first : c->tmp;
    int fits = eval_pipe_order(c, c->ord, k, dst);
    uint32_t mx;
    uint64_t sum;
    order_rtt(c, c->ord, k, &mx, &sum);
    if (fits && (!s->have_fit || mx < s->fit_max || (mx == s->fit_max && sum < s->fit_sum))) {
        memcpy(c->keep, dst, k * sizeof *dst);
        s->have_fit = 1;
        s->fit_max = mx;
        s->fit_sum = sum;
    }
    if (++s->orders >= PLACE_MAX_ORDERS)
        s->stop = 1;
}

static void dfs(struct ctx *c, struct search *s, uint32_t depth)
{
    if (depth == s->k) {
        on_path(c, s);
        return;
    }
    size_t u = c->path[depth - 1];
    for (size_t i = 0; i < c->nnbr[u] && !s->stop; i++) {
        size_t v = (size_t)(c->nbr[u * c->n + i] & 0xffff);
        if (c->on[v])
            continue;
        if (++s->steps > PLACE_DFS_STEPS) {
            s->stop = s->cut = 1;
            return;
        }
        c->on[v] = 1;
        c->path[depth] = v;
        dfs(c, s, depth + 1);
        c->on[v] = 0;
    }
}

static void names(const struct ctx *c, const size_t *mem, uint32_t k, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < k && used + 1 < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", c->id[mem[i]]);
        if (w < 0)
            return;
        used += (size_t)w;
    }
    if (used >= len && len > 4)
        memcpy(buf + len - 4, "...", 4);
}

/* Evaluates one node set (c->mem[0..k), most free first) into a new candidate. */
static int eval_set(struct ctx *c, uint32_t k)
{
    for (uint32_t u = 0; u < k; u++) {
        size_t m = 0;
        for (uint32_t v = 0; v < k; v++) {
            uint32_t t = u == v ? NO_LINK : link_rtt(c, c->mem[u], c->mem[v]);
            if (t != NO_LINK)
                c->nbr[u * c->n + m++] = ((uint64_t)t << 16) | v;
        }
        qsort(&c->nbr[u * c->n], m, sizeof(uint64_t), cmp_u64);
        c->nnbr[u] = m;
    }
    struct place_candidate *cd = cand_new(c, k);
    if (!cd)
        return CAIRN_ENOMEM;

    if (c->req->sharding == PLACE_TENSOR) {
        cd->executable = 1;
        fill_tensor(c, c->mem, k, cd->shares);
        for (uint32_t i = 0; i < k && !cd->reason[0]; i++)
            for (uint32_t j = i + 1; j < k; j++)
                if (link_rtt(c, c->mem[i], c->mem[j]) == NO_LINK) {
                    reason_add(cd->reason, "nodes %s and %s are not connected",
                               c->id[c->mem[i]], c->id[c->mem[j]]);
                    break;
                }
        reason_memory(cd->reason, cd->shares, k);
        rtt_of(c, cd, 1);
        finish(cd);
        return 0;
    }

    cd->executable = 1;
    uint32_t miss = first_unreached(c, k);
    if (miss < k) {
        split_prop(c, c->mem, k, c->cnt);
        fill_pipe(c, c->mem, k, c->cnt, cd->shares);
        reason_add(cd->reason, "nodes %s and %s are not connected", c->id[c->mem[0]],
                   c->id[c->mem[miss]]);
        rtt_of(c, cd, 0);
        finish(cd);
        return 0;
    }
    struct search s = {.k = k};
    memset(c->on, 0, k);
    for (uint32_t st = 0; st < k && !s.stop; st++) {
        c->path[0] = st;
        c->on[st] = 1;
        dfs(c, &s, 1);
        c->on[st] = 0;
    }
    if (s.have_fit) {
        memcpy(cd->shares, c->keep, k * sizeof *cd->shares);
    } else if (s.orders > 0) {
        memcpy(cd->shares, c->first, k * sizeof *cd->shares);
        reason_memory(cd->reason, cd->shares, k);
        if (k > 1)
            reason_add(cd->reason, "no contiguous split of the %u layers fits %s", c->L,
                       s.orders > 1 ? "any order tried" : "this order");
    } else {
        char list[160];
        split_prop(c, c->mem, k, c->cnt);
        fill_pipe(c, c->mem, k, c->cnt, cd->shares);
        names(c, c->mem, k, list, sizeof list);
        if (s.cut)
            reason_add(cd->reason, "no pipeline order through the links of %s found in %d steps",
                       list, PLACE_DFS_STEPS);
        else
            reason_add(cd->reason, "no path through the links of %s visits each node once", list);
    }
    rtt_of(c, cd, 0);
    finish(cd);
    return 0;
}

/* ---- enumeration of k-subsets, best-first by total free memory ----
 * A subset is a tuple of increasing positions into byfree. Its parent decrements the
 * first position not at its initial value; children increment position f-1 or f where
 * f is that first displaced position. That makes a tree rooted at (0..k-1) in which a
 * child never has more free memory than its parent, so a max-heap visits subsets in
 * non-increasing total (ties: lexicographic) with at most two pushes per pop. */

struct heap {
    uint32_t k;
    uint16_t *tuples; /* pool of k-tuples */
    uint64_t *sums;
    size_t used, cap; /* tuples in the pool */
    size_t *h;        /* heap of pool indices */
    size_t hn;
};

static int heap_before(const struct heap *hp, size_t a, size_t b)
{
    if (hp->sums[a] != hp->sums[b])
        return hp->sums[a] > hp->sums[b];
    const uint16_t *x = &hp->tuples[a * hp->k], *y = &hp->tuples[b * hp->k];
    for (uint32_t i = 0; i < hp->k; i++)
        if (x[i] != y[i])
            return x[i] < y[i];
    return 0;
}

static int heap_push(struct heap *hp, const struct ctx *c, const uint16_t *t)
{
    /* Three arrays of one capacity: each grows from a copy of it to the same size. */
    size_t cap_t = hp->cap, cap_s = hp->cap, cap_h = hp->cap;
    if (array_reserve(&hp->tuples, &cap_t, hp->used + 1, hp->k * sizeof *hp->tuples, 64) ||
        array_reserve(&hp->sums, &cap_s, hp->used + 1, sizeof *hp->sums, 64) ||
        array_reserve(&hp->h, &cap_h, hp->used + 1, sizeof *hp->h, 64))
        return CAIRN_ENOMEM;
    hp->cap = cap_t;
    size_t id = hp->used++;
    memcpy(&hp->tuples[id * hp->k], t, hp->k * sizeof *t);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < hp->k; i++)
        sum += c->free[c->byfree[t[i]]];
    hp->sums[id] = sum;
    size_t i = hp->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(hp, id, hp->h[p]))
            break;
        hp->h[i] = hp->h[p];
        i = p;
    }
    hp->h[i] = id;
    return 0;
}

static size_t heap_pop(struct heap *hp)
{
    size_t top = hp->h[0];
    size_t last = hp->h[--hp->hn];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        size_t mv = last;
        if (l < hp->hn && heap_before(hp, hp->h[l], mv)) {
            m = l;
            mv = hp->h[l];
        }
        if (r < hp->hn && heap_before(hp, hp->h[r], mv))
            m = r;
        if (m == i)
            break;
        hp->h[i] = hp->h[m];
        i = m;
    }
    if (hp->hn > 0)
        hp->h[i] = last;
    return top;
}

static void heap_free(struct heap *hp)
{
    free(hp->tuples);
    free(hp->sums);
    free(hp->h);
}

static int enumerate_size(struct ctx *c, uint32_t k, size_t quota)
{
    const struct place_model *m = c->m;
    int tensor = c->req->sharding == PLACE_TENSOR;
    char reason[PLACE_REASON_MAX];
    reason[0] = '\0';
    if (tensor && k > 1) {
        if (m->n_head == 0 || m->n_head_kv == 0)
            reason_add(reason, "tensor parallel: the model card gives no head counts");
        else if (m->n_head % k)
            reason_add(reason, "tensor parallel: %u heads do not divide by %u nodes", m->n_head, k);
        else if (m->n_head_kv % k)
            reason_add(reason, "tensor parallel: %u KV heads do not divide by %u nodes",
                       m->n_head_kv, k);
        else if (k > PLACE_TENSOR_MAX)
            reason_add(reason, "tensor parallel: at most %d nodes", PLACE_TENSOR_MAX);
        else if (m->n_expert > 0)
            reason_add(reason, "tensor parallel: a mixture of experts is not split (place it as a pipeline)");
        if (reason[0]) {
            for (uint32_t i = 0; i < k; i++)
                c->mem[i] = c->byfree[i];
            return emit_refused(c, c->mem, k, reason);
        }
    }
    uint64_t need = tensor ? tensor_total_need(c, k) : pipe_total_need(c, k);

    struct heap hp = {.k = k};
    uint16_t t[PLACE_MAX_NODES];
    for (uint32_t i = 0; i < k; i++)
        t[i] = (uint16_t)i;
    int rc = heap_push(&hp, c, t);
    size_t seen = 0;
    while (rc == 0 && hp.hn > 0) {
        if (seen == quota) {
            c->out->truncated = 1;
            break;
        }
        size_t id = heap_pop(&hp);
        memcpy(t, &hp.tuples[id * k], k * sizeof *t);
        uint64_t sum = hp.sums[id];
        seen++;
        for (uint32_t i = 0; i < k; i++)
            c->mem[i] = c->byfree[t[i]];
        if (sum < need) {
            /* Every later subset of this size has no more free memory. */
            char a[40], b[40];
            fmt_pair(a, b, sizeof a, need, sum);
            if (k == 1) {
                reason_add(reason, "node %s: needs %s, has %s free", c->id[c->mem[0]], a, b);
            } else {
                char list[160];
                names(c, c->mem, k, list, sizeof list);
                reason_add(reason, "nodes %s have %s free together; %u nodes need %s", list, b,
                           k, a);
            }
            rc = emit_refused(c, c->mem, k, reason);
            break;
        }
        rc = eval_set(c, k);
        if (rc)
            break;
        uint32_t f = 0;
        while (f < k && t[f] == f)
            f++;
        for (uint32_t j = f ? f - 1 : 0; j <= f && j < k && rc == 0; j++) {
            uint32_t next = j + 1 < k ? t[j + 1] : (uint32_t)c->n;
            if ((uint32_t)t[j] + 1 >= next)
                continue;
            t[j]++;
            rc = heap_push(&hp, c, t);
            t[j]--;
        }
    }
    heap_free(&hp);
    return rc;
}

/* ---- validation and set-up ---- */

static int check_bytes(char *err, size_t errlen, const char *who, const char *what, u128 v)
{
    if (v > PLACE_BYTES_MAX) {
        char a[40];
        if (v >> 64)
            snprintf(a, sizeof a, "more than 2^64");
        else
            snprintf(a, sizeof a, "%llu", (unsigned long long)v);
        return cairn_fail(err, errlen, CAIRN_ERANGE, "%s: %s %s bytes is over the 4 PiB bound",
                          who, what, a);
    }
    return 0;
}

/* Ids and model names travel in JSON and in messages: printable ASCII only. */
static int printable(const char *s, int space_ok)
{
    for (; *s; s++)
        if ((unsigned char)*s < (space_ok ? 0x20 : 0x21) || (unsigned char)*s > 0x7e)
            return 0;
    return 1;
}

static int validate(const struct place_request *req, char *err, size_t errlen)
{
    if (!req)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no request");
    const struct place_model *m = &req->model;
    if (req->sharding != PLACE_PIPELINE && req->sharding != PLACE_TENSOR)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "unknown sharding %d", (int)req->sharding);
    if (req->min_nodes < 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "min_nodes must be at least 1");
    if (req->max_nodes && req->max_nodes < req->min_nodes)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_nodes=%u is below min_nodes=%u",
                          req->max_nodes, req->min_nodes);
    if (req->max_candidates > PLACE_MAX_CANDIDATES)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "max_candidates=%u is over %d",
                          req->max_candidates, PLACE_MAX_CANDIDATES);
    if (req->n_nodes > PLACE_MAX_NODES)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "%zu nodes is over %d", req->n_nodes,
                          PLACE_MAX_NODES);
    if (req->n_nodes && !req->nodes)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "nodes missing");
    if (req->n_links && !req->links)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "links missing");
    for (size_t i = 0; i < req->n_nodes; i++) {
        const struct place_node *nd = &req->nodes[i];
        if (!nd->id || !nd->id[0])
            return cairn_fail(err, errlen, CAIRN_EINVAL, "node %zu has no id", i);
        if (!printable(nd->id, 0))
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "node %zu: id must be printable ASCII without spaces", i);
        if (strlen(nd->id) > PLACE_MAX_ID)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "node %zu: id longer than %d bytes", i,
                              PLACE_MAX_ID);
        for (size_t j = 0; j < i; j++)
            if (strcmp(req->nodes[j].id, nd->id) == 0)
                return cairn_fail(err, errlen, CAIRN_EINVAL, "nodes %zu and %zu share the id %s",
                                  j, i, nd->id);
        int rc;
        if ((rc = check_bytes(err, errlen, nd->id, "available", nd->available)) ||
            (rc = check_bytes(err, errlen, nd->id, "held", nd->held)) ||
            (rc = check_bytes(err, errlen, nd->id, "total", nd->total)))
            return rc;
    }
    if (m->id && !printable(m->id, 1))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "model id must be printable ASCII");
    if (m->n_layers < 1 || m->n_layers > PLACE_MAX_LAYERS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "model: n_layers=%u is not in 1..%d",
                          m->n_layers, PLACE_MAX_LAYERS);
    if (m->ctx_len < 1 || m->n_slots < 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "model: ctx_len=%u and n_slots=%u must be >= 1",
                          m->ctx_len, m->n_slots);
    if (m->layer_window && m->window_positions > (uint64_t)m->ctx_len * m->n_slots)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "model: window_positions=%llu is beyond ctx_len * n_slots = %llu",
                          (unsigned long long)m->window_positions, (unsigned long long)m->ctx_len * m->n_slots);
    u128 layers = 0;
    for (uint32_t i = 0; i < m->n_layers; i++)
        layers += m->layer_bytes_each ? m->layer_bytes_each[i] : m->layer_bytes;
    u128 kv = (u128)m->kv_bytes_per_token_layer * m->n_layers * m->ctx_len * m->n_slots;
    u128 dkv = (u128)m->draft_kv_bytes_per_token * m->ctx_len * m->n_slots;
    int rc;
    if ((rc = check_bytes(err, errlen, "model", "layers", layers)) ||
        (rc = check_bytes(err, errlen, "model", "KV cache", kv)) ||
        (rc = check_bytes(err, errlen, "model", "draft KV cache", dkv)) ||
        (rc = check_bytes(err, errlen, "model", "embedding", m->embed_bytes)) ||
        (rc = check_bytes(err, errlen, "model", "head", m->head_bytes)) ||
        (rc = check_bytes(err, errlen, "model", "norm", m->norm_bytes)) ||
        (rc = check_bytes(err, errlen, "model", "draft", m->draft_bytes)))
        return rc;
    return 0;
}

static int cmp_free_ctx(const struct ctx *c, size_t a, size_t b)
{
    if (c->free[a] != c->free[b])
        return c->free[a] > c->free[b] ? -1 : 1;
    return strcmp(c->id[a], c->id[b]);
}

static int setup(struct ctx *c, const struct place_request *req, struct place_result *out)
{
    size_t n = req->n_nodes;
    c->req = req;
    c->m = &req->model;
    c->out = out;
    c->n = n;
    c->L = req->model.n_layers;
    size_t nn = n ? n : 1;
    c->free = calloc(nn, sizeof *c->free);
    c->rtt = malloc(nn * nn * sizeof *c->rtt);
    c->byfree = calloc(nn, sizeof *c->byfree);
    c->id = calloc(nn, sizeof *c->id);
    c->prefix = calloc((size_t)c->L + 1, sizeof *c->prefix);
    c->kv_prefix = calloc((size_t)c->L + 1, sizeof *c->kv_prefix);
    c->mem = calloc(nn, sizeof *c->mem);
    c->ord = calloc(nn, sizeof *c->ord);
    c->path = calloc(nn, sizeof *c->path);
    c->on = calloc(nn, 1);
    c->nbr = calloc(nn * nn, sizeof *c->nbr);
    c->nnbr = calloc(nn, sizeof *c->nnbr);
    c->cnt = calloc(nn, sizeof *c->cnt);
    c->want = calloc(nn, sizeof *c->want);
    c->idx = calloc(nn, sizeof *c->idx);
    c->idx2 = calloc(nn, sizeof *c->idx2);
    c->aux = calloc(nn, sizeof *c->aux);
    c->reach_cap = nn * ((size_t)c->L + 1) < DP_CELLS ? nn * ((size_t)c->L + 1) : DP_CELLS;
    c->reach = malloc(c->reach_cap);
    c->tmp = calloc(nn, sizeof *c->tmp);
    c->first = calloc(nn, sizeof *c->first);
    c->keep = calloc(nn, sizeof *c->keep);
    size_t idbytes = 1;
    for (size_t i = 0; i < n; i++)
        idbytes += strlen(req->nodes[i].id) + 1;
    out->ids = malloc(idbytes);
    if (req->model.id)
        out->model_id = strdup(req->model.id);
    if (!c->free || !c->rtt || !c->byfree || !c->id || !c->prefix || !c->kv_prefix || !c->mem || !c->ord ||
        !c->path || !c->on || !c->nbr || !c->nnbr || !c->cnt || !c->want || !c->idx || !c->idx2 || !c->aux || !c->reach || !c->tmp ||
        !c->first || !c->keep || !out->ids || (req->model.id && !out->model_id))
        return CAIRN_ENOMEM;

    char *p = out->ids;
    for (size_t i = 0; i < n; i++) {
        const struct place_node *nd = &req->nodes[i];
        size_t len = strlen(nd->id) + 1;
        memcpy(p, nd->id, len);
        c->id[i] = p;
        p += len;
        c->free[i] = nd->available > nd->held ? nd->available - nd->held : 0;
    }
    for (size_t i = 0; i < nn * nn; i++)
        c->rtt[i] = NO_LINK;
    for (size_t l = 0; l < req->n_links; l++) {
        const struct place_link *lk = &req->links[l];
        size_t a = n, b = n;
        for (size_t i = 0; i < n && lk->from && lk->to; i++) {
            if (strcmp(c->id[i], lk->from) == 0)
                a = i;
            if (strcmp(c->id[i], lk->to) == 0)
                b = i;
        }
        if (a == n || b == n || a == b)
            continue;
        uint32_t t = lk->rtt_us == NO_LINK ? NO_LINK - 1 : lk->rtt_us;
        if (t < c->rtt[a * n + b]) {
            c->rtt[a * n + b] = t;
            c->rtt[b * n + a] = t;
        }
    }
    /* Insertion sort: n <= 256 and it keeps the order total without a qsort context. */
    for (size_t i = 0; i < n; i++) {
        size_t v = i, j = i;
        while (j > 0 && cmp_free_ctx(c, v, c->byfree[j - 1]) < 0) {
            c->byfree[j] = c->byfree[j - 1];
            j--;
        }
        c->byfree[j] = v;
    }
    const struct place_model *m = c->m;
    for (uint32_t i = 0; i < c->L; i++)
        c->prefix[i + 1] = c->prefix[i] + (m->layer_bytes_each ? m->layer_bytes_each[i] : m->layer_bytes);
    uint64_t kv_full = m->kv_bytes_per_token_layer * m->ctx_len * m->n_slots;
    uint64_t kv_window = m->kv_bytes_per_token_layer * m->window_positions;
    for (uint32_t i = 0; i < c->L; i++)
        c->kv_prefix[i + 1] = c->kv_prefix[i] + (m->layer_window && m->layer_window[i] ? kv_window : kv_full);
    c->draft_all = m->draft_bytes + m->draft_kv_bytes_per_token * m->ctx_len * m->n_slots;
    return 0;
}

static void ctx_free(struct ctx *c)
{
    free(c->free);
    free(c->rtt);
    free(c->byfree);
    free(c->id);
    free(c->prefix);
    free(c->kv_prefix);
    free(c->mem);
    free(c->ord);
    free(c->path);
    free(c->on);
    free(c->nbr);
    free(c->nnbr);
    free(c->cnt);
    free(c->aux);
    free(c->want);
    free(c->idx);
    free(c->idx2);
    free(c->reach);
    free(c->tmp);
    free(c->first);
    free(c->keep);
}

/* 1 when a is better than b under the policy stated in place.h. */
static int better(const struct place_candidate *a, const struct place_candidate *b)
{
    if (a->n_nodes != b->n_nodes)
        return a->n_nodes < b->n_nodes;
    if (a->free_left != b->free_left)
        return a->free_left > b->free_left;
    if (a->max_rtt_us != b->max_rtt_us)
        return a->max_rtt_us < b->max_rtt_us;
    return a->sum_rtt_us < b->sum_rtt_us;
}

static int run(struct ctx *c)
{
    const struct place_request *req = c->req;
    struct place_result *out = c->out;
    size_t n = c->n;
    size_t budget = out->max_candidates;
    char reason[PLACE_REASON_MAX];
    reason[0] = '\0';

    if (n < req->min_nodes) {
        reason_add(reason, "fewer than min_nodes=%u nodes (the cluster has %zu)", req->min_nodes, n);
        return emit_refused(c, c->byfree, (uint32_t)n, reason);
    }
    uint32_t kmax = out->max_nodes;
    int tensor = req->sharding == PLACE_TENSOR;
    if (!tensor && req->min_nodes > c->L) {
        reason_add(reason, "pipeline: %u nodes but the model has only %u layers (one each at least)",
                   req->min_nodes, c->L);
        return emit_refused(c, c->byfree, req->min_nodes, reason);
    }
    uint32_t kend = !tensor && kmax > c->L ? c->L : kmax;
    for (uint32_t k = req->min_nodes; k <= kend; k++) {
        if (out->n_cands >= budget) {
            out->truncated = 1;
            return 0;
        }
        size_t left = budget - out->n_cands, sizes = kend - k + 1;
        int rc = enumerate_size(c, k, (left + sizes - 1) / sizes);
        if (rc)
            return rc;
    }
    if (kend < kmax && out->n_cands < budget) {
        reason_add(reason, "pipeline: %u nodes but the model has only %u layers (one each at least)",
                   kend + 1, c->L);
        return emit_refused(c, c->byfree, kend + 1, reason);
    }
    return 0;
}

int place_compute(const struct place_request *req, struct place_result *out, char *err,
                  size_t errlen)
{
    if (!out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no result");
    memset(out, 0, sizeof *out);
    out->best = -1;
    int rc = validate(req, err, errlen);
    if (rc)
        return rc;
    out->sharding = req->sharding;
    out->min_nodes = req->min_nodes;
    out->max_nodes = req->max_nodes && req->max_nodes < req->n_nodes ? req->max_nodes
                                                                     : (uint32_t)req->n_nodes;
    out->max_candidates = req->max_candidates ? req->max_candidates : PLACE_DEFAULT_CANDIDATES;

    struct ctx c;
    memset(&c, 0, sizeof c);
    rc = setup(&c, req, out);
    if (rc == 0)
        rc = run(&c);
    ctx_free(&c);
    if (rc) {
        place_result_free(out);
        out->best = -1;
        return cairn_fail(err, errlen, rc, "placement: %s", cairn_strerror(rc));
    }
    for (size_t i = 0; i < out->n_cands; i++)
        if (out->cands[i].accepted && (out->best < 0 || better(&out->cands[i], &out->cands[out->best])))
            out->best = (long)i;
    return 0;
}

void place_result_free(struct place_result *res)
{
    if (!res)
        return;
    for (size_t i = 0; i < res->n_cands; i++)
        free(res->cands[i].shares);
    free(res->cands);
    free(res->ids);
    free(res->model_id);
    memset(res, 0, sizeof *res);
    res->best = -1;
}

/* ---- JSON ---- */

static int set_new(json_t *obj, const char *key, json_t *v)
{
    return v ? json_object_set_new(obj, key, v) : -1;
}

static json_t *share_json(const struct place_share *s)
{
    json_t *o = json_object();
    json_t *nd = json_object();
    if (!o || !nd) {
        json_decref(o);
        json_decref(nd);
        return NULL;
    }
    int bad = 0;
    bad |= set_new(nd, "layers", json_integer((json_int_t)s->need.layers));
    bad |= set_new(nd, "embedding", json_integer((json_int_t)s->need.embedding));
    bad |= set_new(nd, "head", json_integer((json_int_t)s->need.head));
    bad |= set_new(nd, "kv", json_integer((json_int_t)s->need.kv));
    bad |= set_new(nd, "draft", json_integer((json_int_t)s->need.draft));
    bad |= set_new(nd, "total", json_integer((json_int_t)s->need.total));
    bad |= set_new(o, "node", json_string(s->id ? s->id : ""));
    bad |= set_new(o, "rank", json_integer(s->rank));
    bad |= set_new(o, "layer_begin", json_integer(s->layer_begin));
    bad |= set_new(o, "layer_end", json_integer(s->layer_end));
    bad |= set_new(o, "free", json_integer((json_int_t)s->free));
    bad |= set_new(o, "fits", json_boolean(s->need.total <= s->free));
    bad |= set_new(o, "need", nd);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *cand_json(const struct place_candidate *cd)
{
    json_t *o = json_object();
    json_t *nodes = json_array();
    json_t *shares = json_array();
    if (!o || !nodes || !shares) {
        json_decref(o);
        json_decref(nodes);
        json_decref(shares);
        return NULL;
    }
    int bad = 0;
    for (uint32_t r = 0; r < cd->n_nodes; r++) {
        bad |= json_array_append_new(nodes, json_string(cd->shares[r].id ? cd->shares[r].id : ""));
        json_t *s = share_json(&cd->shares[r]);
        bad |= s ? json_array_append_new(shares, s) : -1;
    }
    bad |= set_new(o, "nodes", nodes);
    bad |= set_new(o, "accepted", json_boolean(cd->accepted));
    bad |= set_new(o, "executable", json_boolean(cd->executable));
    bad |= set_new(o, "reason", cd->accepted ? json_null() : json_string(cd->reason));
    bad |= set_new(o, "free_left", cd->accepted ? json_integer((json_int_t)cd->free_left) : json_null());
    bad |= set_new(o, "max_rtt_us", json_integer(cd->max_rtt_us));
    bad |= set_new(o, "sum_rtt_us", json_integer((json_int_t)cd->sum_rtt_us));
    bad |= set_new(o, "shares", shares);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *place_result_to_json(const struct place_result *res)
{
    if (!res)
        return NULL;
    json_t *o = json_object();
    json_t *cands = json_array();
    if (!o || !cands) {
        json_decref(o);
        json_decref(cands);
        return NULL;
    }
    int bad = 0;
    for (size_t i = 0; i < res->n_cands; i++) {
        json_t *cd = cand_json(&res->cands[i]);
        bad |= cd ? json_array_append_new(cands, cd) : -1;
    }
    bad |= set_new(o, "model_id", res->model_id ? json_string(res->model_id) : json_null());
    bad |= set_new(o, "sharding", json_string(place_sharding_name(res->sharding)));
    bad |= set_new(o, "min_nodes", json_integer(res->min_nodes));
    bad |= set_new(o, "max_nodes", json_integer(res->max_nodes));
    bad |= set_new(o, "max_candidates", json_integer(res->max_candidates));
    bad |= set_new(o, "truncated", json_boolean(res->truncated));
    bad |= set_new(o, "policy",
                   json_string("fewest nodes, then most free memory left, then lowest max rtt, "
                               "then lowest total rtt, then first examined"));
    bad |= set_new(o, "best", res->best >= 0 ? json_integer(res->best) : json_null());
    bad |= set_new(o, "candidates", cands);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int place_sharding_parse(const char *s, enum place_sharding *out)
{
    if (s && strcmp(s, "pipeline") == 0)
        *out = PLACE_PIPELINE;
    else if (s && strcmp(s, "tensor") == 0)
        *out = PLACE_TENSOR;
    else
        return CAIRN_EINVAL;
    return 0;
}

const char *place_sharding_name(enum place_sharding s)
{
    switch (s) {
    case PLACE_PIPELINE:
        return "pipeline";
    case PLACE_TENSOR:
        return "tensor";
    }
    return "unknown";
}
