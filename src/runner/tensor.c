#include "runner/tensor.h"

#include "base/array.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "runner/pipeline.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How often a wait looks at the other link (a dead next rank means no part will come). */
#define POLL_SLICE_MS 50
/* How long a rank in the middle of a step waits for a part by reading the socket itself
 * (dp_recv_spin) before it blocks: the peer is computing its own part of the same
 * product, so the part is usually due within this. A rank waiting for work (tensor_serve)
 * spins only just after a step (NEXT_STEP_SPIN_US). */
#define PART_SPIN_US 2000
/* How long after a step a rank > 0 waits for rank 0's next batch by reading the socket
 * itself before it blocks: in a run of steps the batch is due as soon as rank 0 has
 * sampled, and a rank woken from sleep starts its part late, so rank 0 waits for it at
 * the step's first exchange. Past this (no request running) it blocks: idle ranks take no
 * CPU. */
#define NEXT_STEP_SPIN_US 10000
/* Step numbers: a batch frame has the top bit; a part (exchange x, part of rank q, chunk
 * c) is x << 32 | q << 24 | c. */
#define STEP_BATCH (UINT64_C(1) << 63)

struct tensor {
    int rank, world, timeout_ms;
    struct engine *e;
    struct kv_cache *kv;
    struct dp_conn *next, *prev;
    const struct model *m;
    int max_batch, n_vocab;
    bool started, observing;
    uint64_t step, xchg;
    int step_xchg;        /* exchanges so far in the running step */
    int64_t wait_now_us;  /* waiting for parts in the running exchange */
    int64_t step_end_us;  /* when the last step ended; 0 before one */
    struct tensor_stats lined; /* the figures at tensor_steps_line's last line */

    /* Rank 0: KV ops recorded since the last step. */
    struct dp_ctl *ops;
    int n_ops;
    size_t cap_ops;
    bool ops_lost;

    /* Buffers, allocated at start (the logits of ranks > 0 grow to the most wanted rows). */
    float *pack;     /* a chunk of this rank's part, rows packed */
    size_t pack_floats;
    float *tokf;     /* max_batch: token ids as F32 (exact below 2^24) */
    int32_t *tok;    /* max_batch */
    uint8_t *want;   /* max_batch */
    int32_t *seq;    /* ranks > 0: the batch's, max_batch (a frame's arrays last only until the
                        next dp_recv, and the exchanges receive) */
    int64_t *pos;
    int32_t *zseq;   /* max_batch zeros: a part's frame carries no sequences */
    int64_t *zpos;
    uint8_t *zwant;
    float *logits;   /* ranks > 0: logits_rows x n_vocab, their columns of the head */
    int64_t logits_rows;

    pthread_mutex_t mu; /* guards broken and st */
    char broken[DP_REASON_MAX];
    struct tensor_stats st;
};

static int64_t now_us(void) { return clock_ns() / 1000; }

static int breaks(struct tensor *t, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int breaks(struct tensor *t, char *err, size_t errlen, const char *fmt, ...)
{
    char why[DP_REASON_MAX - 40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&t->mu);
    bool first = t->broken[0] == '\0';
    if (first)
        snprintf(t->broken, sizeof t->broken, "tensor rank %d: %s", t->rank, why);
    pthread_mutex_unlock(&t->mu);
    if (first)
        log_error("tensor rank %d: %s", t->rank, why);
    return cairn_fail(err, errlen, CAIRN_EIO, "tensor rank %d: %s", t->rank, why);
}

static bool is_broken(struct tensor *t, char *err, size_t errlen)
{
    pthread_mutex_lock(&t->mu);
    bool b = t->broken[0] != '\0';
    if (b)
        cairn_fail(err, errlen, CAIRN_EIO, "%s", t->broken);
    pthread_mutex_unlock(&t->mu);
    return b;
}

static bool link_down(const struct dp_conn *c, const char *dir, int peer, char *why, size_t whylen)
{
    const char *e = dp_error(c);
    if (e[0]) {
        snprintf(why, whylen, "link %s rank %d (%s) ended: %s", dir, peer, dp_peer_addr(c), e);
        return true;
    }
    if (!dp_peer_alive(c)) {
        snprintf(why, whylen, "link %s rank %d (%s) is silent", dir, peer, dp_peer_addr(c));
        return true;
    }
    return false;
}

static int next_rank(const struct tensor *t) { return (t->rank + 1) % t->world; }
static int prev_rank(const struct tensor *t) { return (t->rank - 1 + t->world) % t->world; }

/* Waits up to timeout_ms (-1: no limit) for a frame from prev, spinning for the first
 * spin_us of it (0: none): 1, 0 on timeout, or the broken instance's CAIRN_EIO (a link
 * that ended or went silent, a GOODBYE). */
static int wait_frame(struct tensor *t, struct dp_frame *f, int timeout_ms, int spin_us, char *err, size_t errlen)
{
    char why[DP_REASON_MAX - 64];
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_us() + (int64_t)timeout_ms * 1000;
    for (;;) {
        if (link_down(t->next, "to", next_rank(t), why, sizeof why))
            return breaks(t, err, errlen, "%s", why);
        int64_t left_ms = deadline == INT64_MAX ? POLL_SLICE_MS : (deadline - now_us() + 999) / 1000;
        int slice = left_ms < POLL_SLICE_MS ? (int)(left_ms > 0 ? left_ms : 0) : POLL_SLICE_MS;
        int got = dp_recv_spin(t->prev, f, spin_us, slice, why, sizeof why);
        spin_us = 0;
        if (got < 0 || (got == 1 && f->type == DP_T_GOODBYE)) {
            /* When one rank dies the others close their links too: name the first. */
            char w2[DP_REASON_MAX - 64];
            if (link_down(t->next, "to", next_rank(t), w2, sizeof w2))
                return breaks(t, err, errlen, "%s", w2);
            if (got < 0)
                return breaks(t, err, errlen, "link from rank %d (%s) ended: %s", prev_rank(t),
                              dp_peer_addr(t->prev), why);
            return breaks(t, err, errlen, "rank %d (%s) closed the link: %s", prev_rank(t), dp_peer_addr(t->prev),
                          f->bye.reason);
        }
        if (got == 1)
            return 1;
        if (now_us() >= deadline)
            return 0;
    }
}

/* ---- the exchange (engine_tp.gather) ---- */

static uint64_t part_step(uint64_t x, int q, int64_t chunk)
{
    return (x & 0x7fffffffu) << 32 | (uint64_t)q << 24 | (uint64_t)chunk;
}

/* Rows per frame of a part `width` wide: at most TENSOR_CHUNK_BYTES, at least one row. */
static int chunk_rows(int64_t width, int rows)
{
    int64_t r = (int64_t)(TENSOR_CHUNK_BYTES / ((size_t)width * sizeof(float)));
    r = r < 1 ? 1 : r;
    return r < rows ? (int)r : rows;
}

static int send_frame(struct tensor *t, const struct dp_activations *a, char *err, size_t errlen)
{
    char why[DP_REASON_MAX - 64];
    int rc = dp_send_activations(t->next, a, t->timeout_ms, why, sizeof why);
    if (rc)
        return breaks(t, err, errlen, "sending to rank %d (%s): %s", next_rank(t), dp_peer_addr(t->next), why);
    /* The ring has no results on this link: the in-flight slot is not used. */
    dp_inflight_done(t->next, a->step);
    return 0;
}

/* Sends part q (columns [c0, c0 + width) of rows rows of buf) to next, chunk by chunk;
 * an empty part (a split at a coarse row alignment) sends nothing, on every rank alike. */
static int send_part(struct tensor *t, const float *buf, int rows, size_t ld, int64_t c0, int64_t width, int q,
                     char *err, size_t errlen)
{
    if (width <= 0)
        return 0;
    int cr = chunk_rows(width, rows);
    for (int r0 = 0, c = 0; r0 < rows; r0 += cr, c++) {
        int n = rows - r0 < cr ? rows - r0 : cr;
        const float *x = buf + (size_t)r0 * ld + c0; /* one row (a decode step) is contiguous already */
        if (n > 1) {
            for (int i = 0; i < n; i++)
                memcpy(t->pack + (size_t)i * (size_t)width, buf + (size_t)(r0 + i) * ld + c0,
                       (size_t)width * sizeof(float));
            x = t->pack;
        }
        struct dp_activations a = {.step = part_step(t->xchg, q, c), .n = n, .n_embd = (int)width,
                                   .wire_dtype = DT_F32, .seq = t->zseq, .pos = t->zpos, .want = t->zwant, .x = x};
        int rc = send_frame(t, &a, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Takes part q from prev into its columns of buf, passing each chunk on to next when
 * forward is set. */
static int recv_part(struct tensor *t, float *buf, int rows, size_t ld, int64_t c0, int64_t width, int q,
                     bool forward, char *err, size_t errlen)
{
    if (width <= 0)
        return 0;
    int cr = chunk_rows(width, rows);
    for (int r0 = 0, c = 0; r0 < rows; r0 += cr, c++) {
        int n = rows - r0 < cr ? rows - r0 : cr;
        struct dp_frame f;
        int64_t w0 = now_us();
        int got = wait_frame(t, &f, t->timeout_ms, PART_SPIN_US, err, errlen);
        t->wait_now_us += now_us() - w0;
        if (got < 0)
            return got;
        if (got == 0)
            return breaks(t, err, errlen, "no part from rank %d within %d ms", prev_rank(t), t->timeout_ms);
        uint64_t want = part_step(t->xchg, q, c);
        if (f.type != DP_T_ACTIVATIONS || f.act.step != want || f.act.n != n || f.act.n_embd != width ||
            f.act.wire_dtype != DT_F32)
            return breaks(t, err, errlen,
                          "exchange %" PRIu64 ": expected part %d chunk %d (%d x %lld F32) from rank %d, got a frame "
                          "of type %d, step %#" PRIx64 ", %d x %d",
                          t->xchg, q, c, n, (long long)width, prev_rank(t), (int)f.type,
                          f.type == DP_T_ACTIVATIONS ? f.act.step : 0, f.type == DP_T_ACTIVATIONS ? f.act.n : 0,
                          f.type == DP_T_ACTIVATIONS ? f.act.n_embd : 0);
        for (int i = 0; i < n; i++)
            memcpy(buf + (size_t)(r0 + i) * ld + c0, f.act.x + (size_t)i * (size_t)width, (size_t)width * sizeof(float));
        if (forward) {
            struct dp_activations a = f.act;
            a.n_asks = 0;
            int rc = send_frame(t, &a, err, errlen);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int ring_gather(void *ctx, float *buf, int rows, size_t ld, const int64_t *part, int to_root, char *err,
                       size_t errlen)
{
    struct tensor *t = ctx;
    if (!t->started)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "tensor rank %d: not linked to the other ranks yet", t->rank);
    if (is_broken(t, err, errlen))
        return CAIRN_EIO;
    if (rows > t->max_batch)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor rank %d: an exchange of %d rows (at most %d)", t->rank,
                          rows, t->max_batch);
    int64_t t0 = now_us();
    t->xchg++;
    t->wait_now_us = 0;
    bool first = t->step_xchg++ == 0;
    int W = t->world, r = t->rank, rc = 0;
    if (!to_root) {
        rc = send_part(t, buf, rows, ld, part[r], part[r + 1] - part[r], r, err, errlen);
        for (int k = 1; k < W && !rc; k++) { /* round k brings the part of rank r - k */
            int q = (r - k + W) % W;
            rc = recv_part(t, buf, rows, ld, part[q], part[q + 1] - part[q], q, k < W - 1, err, errlen);
        }
    } else if (r == 0) {
        for (int q = 1; q < W && !rc; q++)
            rc = recv_part(t, buf, rows, ld, part[q], part[q + 1] - part[q], q, false, err, errlen);
    } else { /* pass on the parts of ranks 1..r-1, then add this rank's */
        for (int q = 1; q < r && !rc; q++)
            rc = recv_part(t, buf, rows, ld, part[q], part[q + 1] - part[q], q, true, err, errlen);
        if (!rc)
            rc = send_part(t, buf, rows, ld, part[r], part[r + 1] - part[r], r, err, errlen);
    }
    pthread_mutex_lock(&t->mu);
    t->st.exchanges++;
    t->st.xchg_us += now_us() - t0;
    t->st.wait_us += t->wait_now_us;
    if (first)
        t->st.wait_first_us += t->wait_now_us;
    if (to_root)
        t->st.wait_logits_us += t->wait_now_us;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ---- lifetime ---- */

int tensor_create(struct tensor **out, int rank, int world, int timeout_ms, char *err, size_t errlen)
{
    *out = NULL;
    if (world < 2 || world > ENGINE_TP_MAX || rank < 0 || rank >= world)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor: rank %d of %d (need 0 <= rank < world, 2 <= world <= %d)",
                          rank, world, ENGINE_TP_MAX);
    if (timeout_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor: timeout_ms %d is negative", timeout_ms);
    struct tensor *t = calloc(1, sizeof *t);
    if (!t)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "tensor: out of memory");
    t->rank = rank;
    t->world = world;
    t->timeout_ms = timeout_ms ? timeout_ms : TENSOR_TIMEOUT_MS_DEFAULT;
    t->st.next_rtt_us = t->st.prev_rtt_us = -1;
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return 0;
}

struct engine_tp tensor_engine_tp(struct tensor *t)
{
    return (struct engine_tp){.rank = t->rank, .world = t->world, .gather = ring_gather, .ctx = t};
}

static void on_kv_op(void *arg, const struct kv_op *op)
{
    struct tensor *t = arg;
    struct dp_ctl c;
    if (!pipeline_ctl_from_op(op, &c) || t->n_ops == INT_MAX ||
        array_reserve(&t->ops, &t->cap_ops, (size_t)t->n_ops + 1, sizeof *t->ops, 64)) {
        t->ops_lost = true;
        return;
    }
    t->ops[t->n_ops++] = c;
}

int tensor_start(struct tensor *t, struct engine *e, struct kv_cache *kv, struct dp_conn *next, struct dp_conn *prev,
                 char *err, size_t errlen)
{
    if (t->started)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "tensor: started already");
    if (!e || !kv || !next || !prev || next == prev)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor: needs an engine, a KV cache and both links (two connections)");
    const struct model *m = engine_model(e);
    int rc = engine_tp_check(m, t->world, err, errlen);
    if (rc)
        return rc;
    const struct kv_config *kc = kv_config(kv);
    struct kv_config want = engine_kv_config_tp(m, t->world, 1, 1, 1);
    if (kc->kv_dim != want.kv_dim || kc->n_layers != want.n_layers)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor: the KV cache (%d layers of %lld) is not this rank's "
                          "(%d of %lld: engine_kv_config_tp)", kc->n_layers, (long long)kc->kv_dim, want.n_layers,
                          (long long)want.kv_dim);
    if (dp_peer_rank(next) != next_rank(t) || dp_peer_rank(prev) != prev_rank(t))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor: rank %d needs next = rank %d and prev = rank %d, got %d "
                          "and %d", t->rank, next_rank(t), prev_rank(t), dp_peer_rank(next), dp_peer_rank(prev));
    t->e = e;
    t->kv = kv;
    t->next = next;
    t->prev = prev;
    t->m = m;
    t->max_batch = engine_max_batch(e);
    t->n_vocab = m->hp.n_vocab;
    size_t mb = (size_t)t->max_batch;
    t->pack_floats = TENSOR_CHUNK_BYTES / sizeof(float);
    int64_t widest = m->hp.n_vocab > m->hp.n_ff ? m->hp.n_vocab : m->hp.n_ff;
    if ((size_t)widest > t->pack_floats)
        t->pack_floats = (size_t)widest;
    t->pack = malloc(t->pack_floats * sizeof *t->pack);
    t->tokf = malloc(mb * sizeof *t->tokf);
    t->tok = malloc(mb * sizeof *t->tok);
    t->want = malloc(mb);
    t->seq = malloc(mb * sizeof *t->seq);
    t->pos = malloc(mb * sizeof *t->pos);
    t->zseq = calloc(mb, sizeof *t->zseq);
    t->zpos = calloc(mb, sizeof *t->zpos);
    t->zwant = calloc(mb, 1);
    if (!t->pack || !t->tokf || !t->tok || !t->want || !t->seq || !t->pos || !t->zseq || !t->zpos || !t->zwant)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "tensor: out of memory for a batch of %d", t->max_batch);
    if (t->rank == 0) {
        kv_set_observer(kv, on_kv_op, t);
        t->observing = true;
    }
    t->started = true;
    return 0;
}

void tensor_release(struct tensor *t)
{
    if (!t)
        return;
    if (t->observing)
        kv_set_observer(t->kv, NULL, NULL);
    pthread_mutex_destroy(&t->mu);
    free(t->ops);
    free(t->pack);
    free(t->tokf);
    free(t->tok);
    free(t->want);
    free(t->seq);
    free(t->pos);
    free(t->zseq);
    free(t->zpos);
    free(t->zwant);
    free(t->logits);
    free(t);
}

/* A step starts (its gap since the last one counted) at t0: */
static void begin_step(struct tensor *t, int64_t t0)
{
    t->step_xchg = 0;
    int64_t gap = t->step_end_us ? t0 - t->step_end_us : -1;
    if (gap < 0 || gap >= TENSOR_GAP_MAX_US)
        return;
    pthread_mutex_lock(&t->mu);
    t->st.gaps++;
    t->st.gap_us += gap;
    pthread_mutex_unlock(&t->mu);
}

static void count_step(struct tensor *t, int tokens, bool failed, int64_t us)
{
    t->step_end_us = now_us();
    pthread_mutex_lock(&t->mu);
    t->st.steps++;
    t->st.tokens += (uint64_t)tokens;
    t->st.failures += failed;
    t->st.compute_us += us;
    pthread_mutex_unlock(&t->mu);
}

/* ---- rank 0 ---- */

int tensor_forward(void *tv, struct kv_cache *kv, const struct batch *b, float *logits, char *err, size_t errlen)
{
    struct tensor *t = tv;
    if (t->rank != 0 || !t->started || kv != t->kv)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "tensor_forward: only a started rank 0 runs steps, on its cache");
    if (is_broken(t, err, errlen))
        return CAIRN_EIO;
    if (t->ops_lost)
        return breaks(t, err, errlen, "KV ops could not be recorded: the ranks' caches differ");
    if (b->n < 1 || b->n > t->max_batch || !b->token)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tensor_forward: a batch of %d tokens (1..%d, with ids)", b->n,
                          t->max_batch);
    uint64_t step = ++t->step;
    begin_step(t, now_us());
    char why[DP_REASON_MAX - 64];
    for (int at = 0; at < t->n_ops;) {
        int n = t->n_ops - at < DP_MAX_CTL_OPS ? t->n_ops - at : DP_MAX_CTL_OPS;
        struct dp_control ctl = {.step = STEP_BATCH | step, .n = n, .ops = t->ops + at};
        if (dp_send_control(t->next, &ctl, t->timeout_ms, why, sizeof why))
            return breaks(t, err, errlen, "sending %d KV ops to rank %d (%s): %s", n, next_rank(t),
                          dp_peer_addr(t->next), why);
        at += n;
    }
    pthread_mutex_lock(&t->mu);
    t->st.ctl_ops += (uint64_t)t->n_ops;
    pthread_mutex_unlock(&t->mu);
    t->n_ops = 0;
    for (int i = 0; i < b->n; i++) {
        t->tokf[i] = (float)b->token[i];
        t->want[i] = !b->logits || b->logits[i];
    }
    struct dp_activations a = {.step = STEP_BATCH | step, .n = b->n, .n_embd = 1, .wire_dtype = DT_F32,
                               .seq = b->seq, .pos = b->pos, .want = t->want, .x = t->tokf};
    int rc = send_frame(t, &a, err, errlen);
    if (rc)
        return rc;
    int64_t t0 = now_us();
    rc = engine_forward(t->e, kv, b, logits, err, errlen);
    /* The engine's own kv_prepare calls: every rank's engine makes them from the batch. */
    t->n_ops = 0;
    count_step(t, b->n, rc != 0, now_us() - t0);
    return rc;
}

/* ---- ranks > 0 ---- */

static int handle_batch(struct tensor *t, const struct dp_activations *a, int64_t arrived_us, char *err,
                        size_t errlen)
{
    if (!(a->step & STEP_BATCH) || a->n_embd != 1 || a->n > t->max_batch || a->n_asks)
        return breaks(t, err, errlen, "expected a batch from rank %d, got step %#" PRIx64 " of %d x %d", prev_rank(t),
                      a->step, a->n, a->n_embd);
    if (next_rank(t) != 0) { /* on around the ring first, so every rank computes at once */
        struct dp_activations o = *a;
        int rc = send_frame(t, &o, err, errlen);
        if (rc)
            return rc;
    }
    int n_want = 0;
    for (int i = 0; i < a->n; i++) {
        float v = a->x[i];
        if (!(v >= 0.0f && v < (float)t->n_vocab) || v != floorf(v))
            return breaks(t, err, errlen, "batch token %d is not a token id (%g)", i, (double)v);
        t->tok[i] = (int32_t)v;
        t->seq[i] = a->seq[i];
        t->pos[i] = a->pos[i];
        t->want[i] = a->want[i];
        n_want += a->want[i] != 0;
    }
    if (n_want > t->logits_rows) {
        float *l = realloc(t->logits, (size_t)n_want * (size_t)t->n_vocab * sizeof *l);
        if (!l)
            return breaks(t, err, errlen, "out of memory for %d rows of logits", n_want);
        t->logits = l;
        t->logits_rows = n_want;
    }
    struct batch b = {.n = a->n, .token = t->tok, .seq = t->seq, .pos = t->pos, .logits = t->want};
    char why[DP_REASON_MAX - 64];
    begin_step(t, arrived_us);
    int64_t t0 = now_us();
    int rc = engine_forward(t->e, t->kv, &b, t->logits, why, sizeof why);
    count_step(t, a->n, rc != 0, now_us() - t0);
    if (rc && is_broken(t, err, errlen))
        return CAIRN_EIO;
    if (rc) /* rank 0's engine refused the same batch the same way */
        log_warn("tensor rank %d: a step: %s", t->rank, why);
    return 1;
}

static int handle_control(struct tensor *t, const struct dp_control *c, char *err, size_t errlen)
{
    if (next_rank(t) != 0) {
        char why[DP_REASON_MAX - 64];
        if (dp_send_control(t->next, c, t->timeout_ms, why, sizeof why))
            return breaks(t, err, errlen, "passing on %d KV ops to rank %d (%s): %s", c->n, next_rank(t),
                          dp_peer_addr(t->next), why);
    }
    for (int i = 0; i < c->n; i++) {
        char why[DP_REASON_MAX - 64];
        if (pipeline_apply_ctl(t->kv, &c->ops[i], why, sizeof why))
            return breaks(t, err, errlen, "the KV cache cannot mirror rank 0's: %s", why);
    }
    pthread_mutex_lock(&t->mu);
    t->st.ctl_ops += (uint64_t)c->n;
    pthread_mutex_unlock(&t->mu);
    return 1;
}

int tensor_serve(struct tensor *t, int timeout_ms, char *err, size_t errlen)
{
    if (t->rank == 0 || !t->started)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "tensor_serve: a started rank other than 0 serves");
    if (is_broken(t, err, errlen))
        return CAIRN_EIO;
    struct dp_frame f;
    int64_t since = t->step_end_us ? now_us() - t->step_end_us : NEXT_STEP_SPIN_US;
    int spin = since < NEXT_STEP_SPIN_US ? (int)(NEXT_STEP_SPIN_US - since) : 0;
    int got = wait_frame(t, &f, timeout_ms, spin, err, errlen);
    if (got <= 0)
        return got;
    int64_t arrived = now_us();
    switch (f.type) {
    case DP_T_CONTROL: return handle_control(t, &f.ctl, err, errlen);
    case DP_T_ACTIVATIONS: return handle_batch(t, &f.act, arrived, err, errlen);
    default: return breaks(t, err, errlen, "unexpected frame of type %d from rank %d", (int)f.type, prev_rank(t));
    }
}

/* ---- queries ---- */

bool tensor_alive(const struct tensor *t, char *why, size_t whylen)
{
    struct tensor *m = (struct tensor *)t; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    bool broken = t->broken[0] != '\0';
    if (broken && why)
        snprintf(why, whylen, "%s", t->broken);
    pthread_mutex_unlock(&m->mu);
    if (broken)
        return false;
    if (!t->started)
        return true;
    char w[DP_REASON_MAX];
    if (link_down(t->next, "to", next_rank(t), w, sizeof w) || link_down(t->prev, "from", prev_rank(t), w, sizeof w)) {
        if (why)
            snprintf(why, whylen, "%s", w);
        return false;
    }
    return true;
}

void tensor_get_stats(const struct tensor *t, struct tensor_stats *out)
{
    struct tensor *m = (struct tensor *)t;
    pthread_mutex_lock(&m->mu);
    *out = t->st;
    pthread_mutex_unlock(&m->mu);
    if (!t->started)
        return;
    struct dp_stats n, v;
    dp_get_stats(t->next, &n);
    dp_get_stats(t->prev, &v);
    out->next_rtt_us = n.hb_rtt_us;
    out->prev_rtt_us = v.hb_rtt_us;
    out->frames_sent = n.frames_sent;
    out->bytes_sent = n.bytes_sent;
    out->bytes_received = v.bytes_received;
}

int tensor_steps_line(struct tensor *t, char *line, size_t len)
{
    struct tensor_stats s, p = t->lined;
    tensor_get_stats(t, &s);
    uint64_t n = s.steps - p.steps;
    if (n == 0)
        return 0;
    t->lined = s;
    double k = 1.0 / 1000.0 / (double)n;
    uint64_t gaps = s.gaps - p.gaps;
    snprintf(line, len,
             "tensor rank %d: %" PRIu64 " steps (%" PRIu64 " tokens), per step: %.2f ms in its part, %.2f ms in %.1f "
             "exchanges, of which %.2f ms waiting for parts (%.2f at the first exchange, %.2f at the logits); %.2f ms "
             "between steps",
             t->rank, n, s.tokens - p.tokens, (double)(s.compute_us - p.compute_us - (s.xchg_us - p.xchg_us)) * k,
             (double)(s.xchg_us - p.xchg_us) * k, (double)(s.exchanges - p.exchanges) / (double)n,
             (double)(s.wait_us - p.wait_us) * k, (double)(s.wait_first_us - p.wait_first_us) * k,
             (double)(s.wait_logits_us - p.wait_logits_us) * k,
             gaps ? (double)(s.gap_us - p.gap_us) / 1000.0 / (double)gaps : 0.0);
    return 1;
}
