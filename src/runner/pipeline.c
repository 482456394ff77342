#include "runner/pipeline.h"

#include "base/array.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "engine/sample.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static_assert((int)DP_ROW_LOGITS == (int)SCHED_NEED_LOGITS && (int)DP_ROW_SAMPLE == (int)SCHED_NEED_SAMPLE &&
                  (int)DP_ROW_SKIP == (int)SCHED_NEED_SKIP, "the wire's needs are the scheduler's");
static_assert(DP_MAX_TOP == SCHED_MAX_TOP_LOGPROBS, "top log-probabilities on the wire");

/* How often a wait looks at the other link: a rank waiting on prev learns within this
 * time that next has ended (the RESULT it waits for can then never come). */
#define POLL_SLICE_MS 50

struct pipeline {
    struct pipeline_config cfg;
    const struct model *m;
    int n_embd, n_vocab, max_batch;
    bool last;
    bool observing;         /* the kv observer is ours */
    int next_rank, prev_rank;

    /* Rank 0: the step last sent, the steps sent whose RESULT is not collected yet
     * (oldest first, at most world_size), and the KV ops recorded since the last step. */
    uint64_t step;
    struct pending *pend;
    int pend_head, n_pend;
    struct dp_ctl *ops;
    int n_ops;
    size_t cap_ops;
    bool ops_lost;          /* an op could not be recorded: the mirror is unknown */
    /* Rank 0: the asks staged by pipeline_asks for the next step (n_staged < 0: none),
     * with their bias entries and windows, and where the answers go. */
    int n_staged;
    struct dp_ask *st_ask;              /* max_batch */
    struct dp_bias *st_bias;
    int32_t *st_hist;
    size_t n_st_bias, cap_st_bias, n_st_hist, cap_st_hist;
    struct sched_token *st_answer;

    /* Last rank: sampling (rows of a SAMPLED RESULT, max_batch each; tops DP_MAX_TOP
     * per row) and a bias list in the sampler's form. */
    struct sampler *smp;
    uint8_t *r_need;
    int32_t *r_tok, *r_ntop, *r_top_tok;
    float *r_prob, *r_lp, *r_top_lp;
    struct logit_bias *lb;
    size_t cap_lb;

    /* Buffers, allocated once (the last rank's logits grow to the largest step seen). */
    float *act;             /* max_batch x n_embd: this slice's output activations */
    float *logits;          /* last rank: logits_rows x n_vocab */
    int64_t logits_rows;
    uint8_t *want;          /* rank 0: max_batch */
    int32_t *w_seq;         /* last rank: its RESULT's (seq, pos) entries, max_batch */
    int64_t *w_pos;

    /* Ranks > 0: the first KV op that could not be applied; written by the serving
     * thread under mu, read by it without. */
    char mirror_err[DP_REASON_MAX];
    int engine_prepares;    /* ranks > 0: kv_prepare calls seen since reset */

    pthread_mutex_t mu;     /* guards broken and st */
    char broken[DP_REASON_MAX]; /* "" while usable */
    struct pipeline_stats st;
};

/* Rank 0: a step in flight, and the (seq, pos) of its wanted tokens that its RESULT
 * must carry, in batch order. */
struct pending {
    uint64_t step;
    int tokens, n_want;
    int32_t *w_seq; /* max_batch each */
    int64_t *w_pos;
    bool asked;                 /* asks went with it: the RESULT answers each */
    uint8_t *need;              /* max_batch: each wanted token's need */
    struct sched_token *answer; /* the scheduler's, for the SAMPLE rows */
};

static int64_t now_us(void) { return clock_ns() / 1000; }

/* ---- state and counters ---- */

static void stat_add(struct pipeline *p, int64_t *field, int64_t us)
{
    pthread_mutex_lock(&p->mu);
    *field += us;
    pthread_mutex_unlock(&p->mu);
}

static void count_step(struct pipeline *p, int tokens, bool failed)
{
    pthread_mutex_lock(&p->mu);
    p->st.steps++;
    p->st.tokens += (uint64_t)tokens;
    p->st.failures += failed;
    pthread_mutex_unlock(&p->mu);
}

static bool is_broken(struct pipeline *p, char *err, size_t errlen)
{
    pthread_mutex_lock(&p->mu);
    bool b = p->broken[0] != '\0';
    if (b)
        cairn_fail(err, errlen, CAIRN_EIO, "%s", p->broken);
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Marks the pipeline broken for good with the reason (the first one stays), logs it and
 * returns CAIRN_EIO with it. */
static int breaks(struct pipeline *p, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int breaks(struct pipeline *p, char *err, size_t errlen, const char *fmt, ...)
{
    char why[DP_REASON_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&p->mu);
    bool first = p->broken[0] == '\0';
    if (first)
        snprintf(p->broken, sizeof p->broken, "pipeline rank %d: %s", p->cfg.rank, why);
    pthread_mutex_unlock(&p->mu);
    if (first)
        log_error("pipeline rank %d: %s", p->cfg.rank, why);
    return cairn_fail(err, errlen, CAIRN_EIO, "pipeline rank %d: %s", p->cfg.rank, why);
}

/* Fills why when the link has ended, or has been silent too long; false otherwise. */
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

/* ---- the KV mirror ---- */

bool pipeline_ctl_from_op(const struct kv_op *op, struct dp_ctl *out)
{
    struct dp_ctl c = {.seq = op->seq};
    switch (op->kind) {
    case KV_OP_PREPARE:
        if (op->n > INT32_MAX)
            return false;
        c.op = DP_CTL_PREPARE;
        c.seq2 = (int32_t)op->n;
        c.pos = op->pos;
        break;
    case KV_OP_TRUNCATE:
        c.op = op->pos == 0 ? DP_CTL_CLEAR : DP_CTL_TRUNCATE;
        c.pos = op->pos;
        break;
    case KV_OP_FORK:
        c.op = DP_CTL_FORK;
        c.seq2 = op->seq2;
        break;
    default: return false;
    }
    *out = c;
    return true;
}

static void on_kv_op(void *arg, const struct kv_op *op)
{
    struct pipeline *p = arg;
    if (p->cfg.rank > 0) { /* counts what engine_forward did before it failed */
        p->engine_prepares += op->kind == KV_OP_PREPARE;
        return;
    }
    struct dp_ctl c;
    if (!pipeline_ctl_from_op(op, &c)) {
        p->ops_lost = true;
        return;
    }
    if (p->n_ops == INT_MAX ||
        array_reserve(&p->ops, &p->cap_ops, (size_t)p->n_ops + 1, sizeof *p->ops, 64)) {
        p->ops_lost = true;
        return;
    }
    p->ops[p->n_ops++] = c;
}

/* Applies one mirrored op to this rank's cache; 0 or a negative code with the reason. */
int pipeline_apply_ctl(struct kv_cache *kv, const struct dp_ctl *o, char *err, size_t errlen)
{
    int max_seqs = kv_config(kv)->max_seqs;
    if (o->seq >= max_seqs || (o->op == DP_CTL_FORK && o->seq2 >= max_seqs))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "op %u on sequence %d/%d: the cache has %d", o->op, o->seq,
                          o->seq2, max_seqs);
    int rc = 0;
    switch (o->op) {
    case DP_CTL_CLEAR:
    case DP_CTL_CANCEL: kv_seq_clear(kv, o->seq); break;
    case DP_CTL_TRUNCATE: kv_truncate(kv, o->seq, o->pos); break;
    case DP_CTL_CLEAR_ALL:
        for (int s = 0; s < max_seqs; s++)
            kv_seq_clear(kv, s);
        break;
    case DP_CTL_FORK:
        if ((rc = kv_fork(kv, o->seq, o->seq2)))
            return cairn_fail(err, errlen, rc, "fork of sequence %d into %d: %s", o->seq, o->seq2,
                              cairn_strerror(rc));
        break;
    case DP_CTL_PREPARE:
        if ((rc = kv_prepare(kv, o->seq, o->pos, o->seq2)))
            return cairn_fail(err, errlen, rc, "prepare of sequence %d at %" PRId64 " for %d (length %" PRId64
                              ", %" PRId64 " blocks free): %s", o->seq, o->pos, o->seq2, kv_seq_len(kv, o->seq),
                              kv_free_blocks(kv), cairn_strerror(rc));
        break;
    default: return cairn_fail(err, errlen, CAIRN_EINVAL, "unknown op %u", o->op);
    }
    return 0;
}

/* ---- lifetime ---- */

static int check_config(const struct pipeline_config *c, char *err, size_t errlen)
{
    if (!c || !c->e || !c->kv || !c->next || !c->prev)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: needs an engine, a KV cache and both links");
    if (c->world_size < 2 || c->rank < 0 || c->rank >= c->world_size)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: rank %d of %d (need 0 <= rank < world_size, "
                          "world_size >= 2)", c->rank, c->world_size);
    if (c->next == c->prev)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: next and prev are the same connection");
    if (c->timeout_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: timeout_ms %d is negative", c->timeout_ms);
    const struct model *m = engine_model(c->e);
    bool last = c->rank == c->world_size - 1;
    if (m->first != (c->rank == 0) || m->last != last)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: rank %d of %d holds layers [%d, %d) of %d: rank 0 "
                          "must hold the first layers and the last rank the last ones, and only they",
                          c->rank, c->world_size, m->layer_begin, m->layer_end, m->hp.n_layers);
    const struct kv_config *kc = kv_config(c->kv);
    if (kc->n_layers != m->layer_end - m->layer_begin)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: the KV cache has %d layers, the slice %d",
                          kc->n_layers, m->layer_end - m->layer_begin);
    int dt = c->wire_dtype;
    if (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16 && dt != DT_Q8_0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: wire dtype %s (F32, F16, BF16 or Q8_0)",
                          dtype_name(dt));
    if (dp_wire_bytes(dt, m->hp.n_embd) < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: activations of %d cannot travel as %s",
                          m->hp.n_embd, dtype_name(dt));
    int next = (c->rank + 1) % c->world_size, prev = (c->rank - 1 + c->world_size) % c->world_size;
    if (dp_peer_rank(c->next) != next || dp_peer_rank(c->prev) != prev)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline: rank %d needs next = rank %d and prev = rank %d, "
                          "got %d and %d", c->rank, next, prev, dp_peer_rank(c->next), dp_peer_rank(c->prev));
    return 0;
}

int pipeline_create(struct pipeline **out, const struct pipeline_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_config(cfg, err, errlen);
    if (rc)
        return rc;
    struct pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "pipeline: out of memory");
    p->cfg = *cfg;
    if (!p->cfg.timeout_ms)
        p->cfg.timeout_ms = PIPELINE_TIMEOUT_MS_DEFAULT;
    p->m = engine_model(cfg->e);
    p->n_embd = p->m->hp.n_embd;
    p->n_vocab = p->m->hp.n_vocab;
    p->max_batch = engine_max_batch(cfg->e);
    p->last = cfg->rank == cfg->world_size - 1;
    p->next_rank = (cfg->rank + 1) % cfg->world_size;
    p->prev_rank = (cfg->rank - 1 + cfg->world_size) % cfg->world_size;
    pthread_mutex_init(&p->mu, NULL);
    p->st.next_rtt_us = p->st.prev_rtt_us = -1;
    size_t mb = (size_t)p->max_batch;
    if (!p->last)
        p->act = malloc(mb * (size_t)p->n_embd * sizeof *p->act);
    p->want = malloc(mb);
    p->w_seq = malloc(mb * sizeof *p->w_seq);
    p->w_pos = malloc(mb * sizeof *p->w_pos);
    bool pend_ok = p->w_seq && p->w_pos;
    p->n_staged = -1;
    if (cfg->rank == 0) {
        p->pend = calloc((size_t)cfg->world_size, sizeof *p->pend);
        p->st_ask = calloc(mb, sizeof *p->st_ask);
        pend_ok = p->pend && p->st_ask;
        for (int i = 0; pend_ok && i < cfg->world_size; i++) {
            p->pend[i].w_seq = malloc(mb * sizeof *p->pend[i].w_seq);
            p->pend[i].w_pos = malloc(mb * sizeof *p->pend[i].w_pos);
            p->pend[i].need = malloc(mb);
            pend_ok = p->pend[i].w_seq && p->pend[i].w_pos && p->pend[i].need;
        }
    }
    if (p->last) {
        p->r_need = malloc(mb);
        p->r_tok = malloc(mb * sizeof *p->r_tok);
        p->r_ntop = malloc(mb * sizeof *p->r_ntop);
        p->r_prob = malloc(mb * sizeof *p->r_prob);
        p->r_lp = malloc(mb * sizeof *p->r_lp);
        p->r_top_tok = malloc(mb * DP_MAX_TOP * sizeof *p->r_top_tok);
        p->r_top_lp = malloc(mb * DP_MAX_TOP * sizeof *p->r_top_lp);
        pend_ok = pend_ok && p->r_need && p->r_tok && p->r_ntop && p->r_prob && p->r_lp && p->r_top_tok &&
                  p->r_top_lp && sample_create(&p->smp, p->n_vocab) == 0;
    }
    if ((!p->last && !p->act) || !p->want || !pend_ok) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "pipeline: out of memory for a batch of %d x %d", p->max_batch,
                        p->n_embd);
        pipeline_release(p);
        return rc;
    }
    kv_set_observer(cfg->kv, on_kv_op, p);
    p->observing = true;
    *out = p;
    return 0;
}

void pipeline_release(struct pipeline *p)
{
    if (!p)
        return;
    if (p->observing)
        kv_set_observer(p->cfg.kv, NULL, NULL);
    pthread_mutex_destroy(&p->mu);
    free(p->ops);
    free(p->act);
    free(p->logits);
    free(p->want);
    free(p->w_seq);
    free(p->w_pos);
    for (int i = 0; p->pend && i < p->cfg.world_size; i++) {
        free(p->pend[i].w_seq);
        free(p->pend[i].w_pos);
        free(p->pend[i].need);
    }
    free(p->pend);
    free(p->st_ask);
    free(p->st_bias);
    free(p->st_hist);
    sample_release(p->smp);
    free(p->r_need);
    free(p->r_tok);
    free(p->r_ntop);
    free(p->r_prob);
    free(p->r_lp);
    free(p->r_top_tok);
    free(p->r_top_lp);
    free(p->lb);
    free(p);
}

/* ---- rank 0 ---- */

/* Sends the recorded KV ops ahead of step (in frames of at most DP_MAX_CTL_OPS). */
static int send_ops(struct pipeline *p, uint64_t step, char *err, size_t errlen)
{
    char why[DP_REASON_MAX];
    for (int at = 0; at < p->n_ops;) {
        int n = p->n_ops - at < DP_MAX_CTL_OPS ? p->n_ops - at : DP_MAX_CTL_OPS;
        struct dp_control ctl = {.step = step, .n = n, .ops = p->ops + at};
        int rc = dp_send_control(p->cfg.next, &ctl, p->cfg.timeout_ms, why, sizeof why);
        if (rc)
            return breaks(p, err, errlen, "sending %d KV ops to rank %d (%s): %s", n, p->next_rank,
                          dp_peer_addr(p->cfg.next), why);
        at += n;
    }
    pthread_mutex_lock(&p->mu);
    p->st.ctl_ops += (uint64_t)p->n_ops;
    pthread_mutex_unlock(&p->mu);
    p->n_ops = 0;
    return 0;
}

/* Waits for the RESULT of pending step w on prev and copies its rows to logits. */
static int wait_result(struct pipeline *p, const struct pending *w, float *logits, char *err, size_t errlen)
{
    uint64_t step = w->step;
    int n_want = w->n_want;
    char why[DP_REASON_MAX];
    int64_t t0 = now_us(), deadline = t0 + (int64_t)p->cfg.timeout_ms * 1000;
    int rc = 0;
    for (;;) {
        int64_t left_us = deadline - now_us();
        if (left_us <= 0) {
            dp_inflight_done(p->cfg.next, step);
            rc = cairn_fail(err, errlen, CAIRN_EIO, "pipeline step %" PRIu64 ": no result from rank %d within %d ms",
                            step, p->prev_rank, p->cfg.timeout_ms);
            log_warn("%s", err ? err : "pipeline step timed out");
            break;
        }
        if (link_down(p->cfg.next, "to", p->next_rank, why, sizeof why)) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": %s", step, why);
            break;
        }
        int slice = left_us / 1000 < POLL_SLICE_MS ? (int)(left_us / 1000) + 1 : POLL_SLICE_MS;
        struct dp_frame f;
        int got = dp_recv(p->cfg.prev, &f, slice, why, sizeof why);
        if (got == 0)
            continue;
        /* When rank 1 dies, the ranks after it close their links too: name the first. */
        if ((got < 0 || f.type == DP_T_GOODBYE) && link_down(p->cfg.next, "to", p->next_rank, why, sizeof why)) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": %s", step, why);
            break;
        }
        if (got < 0) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": link from rank %d (%s) ended: %s", step, p->prev_rank,
                        dp_peer_addr(p->cfg.prev), why);
            break;
        }
        if (f.type == DP_T_GOODBYE) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": rank %d (%s) closed the link: %s", step, p->prev_rank,
                        dp_peer_addr(p->cfg.prev), f.bye.reason);
            break;
        }
        if (f.type != DP_T_RESULT) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": unexpected frame of type %d from rank %d", step,
                        (int)f.type, p->prev_rank);
            break;
        }
        const struct dp_result *r = &f.res;
        if (r->step < step) /* the late result of a step that timed out */
            continue;
        if (r->step > step) {
            rc = breaks(p, err, errlen, "result for step %" PRIu64 " while step %" PRIu64 " runs", r->step, step);
            break;
        }
        dp_inflight_done(p->cfg.next, step);
        if (r->status < 0) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "pipeline step %" PRIu64 " failed: %s", step,
                            r->message[0] ? r->message : cairn_strerror(r->status));
            break;
        }
        enum dp_result_kind kind = w->asked && n_want > 0 ? DP_RESULT_SAMPLED : DP_RESULT_LOGITS;
        if (r->kind != kind || r->n != n_want || r->n_vocab != p->n_vocab) {
            rc = breaks(p, err, errlen, "step %" PRIu64 ": rank %d sent %d rows of kind %d (n_vocab %d), expected %d "
                        "of kind %d (n_vocab %d)", step, p->prev_rank, r->n, (int)r->kind, r->n_vocab, n_want,
                        (int)kind, p->n_vocab);
            break;
        }
        for (int i = 0; i < n_want; i++)
            if (r->seq[i] != w->w_seq[i] || r->pos[i] != w->w_pos[i] ||
                (kind == DP_RESULT_SAMPLED && r->need[i] != w->need[i])) {
                rc = breaks(p, err, errlen, "step %" PRIu64 ": result row %d is sequence %d position %" PRId64
                            " (need %d), expected %d at %" PRId64 " (need %d)", step, i, r->seq[i], r->pos[i],
                            kind == DP_RESULT_SAMPLED ? r->need[i] : DP_ROW_LOGITS, w->w_seq[i], w->w_pos[i],
                            w->asked ? w->need[i] : DP_ROW_LOGITS);
                goto out;
            }
        uint64_t sampled = 0, rows = 0, skipped = 0;
        if (kind == DP_RESULT_LOGITS) {
            if (n_want)
                memcpy(logits, r->logits, (size_t)n_want * (size_t)p->n_vocab * sizeof *logits);
            rows = (uint64_t)n_want;
        } else {
            int si = 0, li = 0, ti = 0;
            for (int i = 0; i < n_want; i++) {
                if (r->need[i] == DP_ROW_LOGITS) {
                    memcpy(logits + (size_t)i * (size_t)p->n_vocab, r->logits + (size_t)li++ * (size_t)p->n_vocab,
                           (size_t)p->n_vocab * sizeof *logits);
                    rows++;
                } else if (r->need[i] == DP_ROW_SAMPLE) {
                    struct sched_token *t = &w->answer[i];
                    memset(t, 0, sizeof *t);
                    t->token = r->token[si];
                    t->prob = r->prob[si];
                    t->logprob = r->logprob[si];
                    t->n_top = r->n_top[si++];
                    for (int k = 0; k < t->n_top; k++, ti++) {
                        t->top_token[k] = r->top_token[ti];
                        t->top_logprob[k] = r->top_logprob[ti];
                    }
                    sampled++;
                } else {
                    skipped++;
                }
            }
        }
        pthread_mutex_lock(&p->mu);
        p->st.rows_sampled += sampled;
        p->st.rows_logits += rows;
        p->st.rows_skipped += skipped;
        p->st.result_bytes += dp_result_wire_bytes(r);
        pthread_mutex_unlock(&p->mu);
        break;
    }
out:;
    int64_t waited = now_us() - t0;
    pthread_mutex_lock(&p->mu);
    p->st.wait_us += waited;
    if (waited > p->st.wait_max_us)
        p->st.wait_max_us = waited;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int pipeline_submit(void *pv, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen)
{
    struct pipeline *p = pv;
    if (p->cfg.rank != 0 || kv != p->cfg.kv)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_submit: only rank 0 runs steps, on its own cache");
    if (p->n_pend == p->cfg.world_size)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_submit: %d steps in flight already", p->n_pend);
    if (is_broken(p, err, errlen)) {
        count_step(p, b->n, true);
        return CAIRN_EIO;
    }
    if (p->ops_lost) {
        count_step(p, b->n, true);
        return breaks(p, err, errlen, "KV ops could not be recorded (out of memory): the ranks' caches differ");
    }
    int n_staged = p->n_staged, n_want = 0;
    p->n_staged = -1; /* the asks go with this step or not at all */
    for (int i = 0; i < b->n; i++)
        n_want += !b->logits || b->logits[i];
    if (n_staged >= 0 && n_staged != n_want) {
        count_step(p, b->n, true);
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_submit: %d asks for %d wanted tokens", n_staged,
                          n_want);
    }
    /* The engine's own kv_prepare calls are recorded too; they are dropped below once the
     * slice has run, since every other rank's engine_forward makes them again. */
    int mark = p->n_ops;
    int64_t t0 = now_us();
    int rc = engine_forward(p->cfg.e, kv, b, p->act, err, errlen);
    stat_add(p, &p->st.compute_us, now_us() - t0);
    if (rc) {
        count_step(p, b->n, true);
        return rc;
    }
    p->n_ops = mark;
    struct pending *w = &p->pend[(p->pend_head + p->n_pend) % p->cfg.world_size];
    w->step = ++p->step;
    w->tokens = b->n;
    w->n_want = 0;
    for (int i = 0; i < b->n; i++) {
        p->want[i] = !b->logits || b->logits[i];
        if (p->want[i]) {
            w->w_seq[w->n_want] = b->seq[i];
            w->w_pos[w->n_want++] = b->pos[i];
        }
    }
    w->asked = n_staged >= 0;
    w->answer = p->st_answer;
    for (int i = 0; i < n_staged; i++)
        w->need[i] = (uint8_t)p->st_ask[i].need;
    t0 = now_us();
    rc = send_ops(p, w->step, err, errlen);
    if (!rc) {
        char why[DP_REASON_MAX];
        struct dp_activations a = {.step = w->step, .n = b->n, .n_embd = p->n_embd, .wire_dtype = p->cfg.wire_dtype,
                                   .seq = b->seq, .pos = b->pos, .want = p->want, .x = p->act,
                                   .n_asks = n_staged > 0 ? n_staged : 0, .asks = p->st_ask, .bias = p->st_bias,
                                   .hist = p->st_hist};
        if ((rc = dp_send_activations(p->cfg.next, &a, p->cfg.timeout_ms, why, sizeof why)))
            rc = breaks(p, err, errlen, "step %" PRIu64 ": sending %d activations to rank %d (%s): %s", w->step,
                        b->n, p->next_rank, dp_peer_addr(p->cfg.next), why);
    }
    stat_add(p, &p->st.send_us, now_us() - t0);
    if (rc) {
        count_step(p, b->n, true);
        return rc;
    }
    p->n_pend++;
    return 0;
}

int pipeline_asks(void *pv, const struct sched_ask *ask, int n, struct sched_token *answer, char *err,
                  size_t errlen)
{
    struct pipeline *p = pv;
    if (p->cfg.rank != 0)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_asks: only rank 0 runs steps");
    p->n_staged = -1;
    if (n < 0 || n > p->max_batch || (n && (!ask || !answer)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline_asks: %d asks (at most %d)", n, p->max_batch);
    p->n_st_bias = p->n_st_hist = 0;
    for (int i = 0; i < n; i++) {
        const struct sched_ask *a = &ask[i];
        struct dp_ask *d = &p->st_ask[i];
        memset(d, 0, sizeof *d);
        d->need = (uint32_t)a->need;
        if (a->need == SCHED_NEED_LOGITS || a->need == SCHED_NEED_SKIP)
            continue;
        if (a->need != SCHED_NEED_SAMPLE || a->n_top < -1 || a->n_top > DP_MAX_TOP || a->pos < 0 ||
            a->p.n_bias < 0 || a->p.n_bias > DP_MAX_BIAS || (a->p.n_bias && !a->p.bias) || a->n_window < 0 ||
            a->n_window > DP_MAX_HIST || (a->n_window && !a->window))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "pipeline_asks: ask %d (need %d, n_top %d, %d bias entries, "
                              "a window of %" PRId64 ") cannot travel", i, a->need, a->n_top, a->p.n_bias, a->n_window);
        const struct sample_params *sp = &a->p;
        *d = (struct dp_ask){.need = DP_ROW_SAMPLE, .n_top = a->n_top, .pos = a->pos, .seed = sp->seed,
                             .temperature = sp->temperature, .top_p = sp->top_p, .min_p = sp->min_p,
                             .repeat_penalty = sp->repeat_penalty, .presence_penalty = sp->presence_penalty,
                             .frequency_penalty = sp->frequency_penalty, .top_k = sp->top_k,
                             .penalty_last_n = sp->penalty_last_n, .n_bias = (uint32_t)sp->n_bias,
                             .n_hist = (uint32_t)a->n_window};
        if (array_reserve(&p->st_bias, &p->cap_st_bias, p->n_st_bias + (size_t)sp->n_bias, sizeof *p->st_bias,
                          256) ||
            array_reserve(&p->st_hist, &p->cap_st_hist, p->n_st_hist + (size_t)a->n_window, sizeof *p->st_hist,
                          256))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "pipeline_asks: out of memory");
        for (int k = 0; k < sp->n_bias; k++)
            p->st_bias[p->n_st_bias++] = (struct dp_bias){.token = sp->bias[k].token, .bias = sp->bias[k].bias};
        if (a->n_window)
            memcpy(p->st_hist + p->n_st_hist, a->window, (size_t)a->n_window * sizeof *p->st_hist);
        p->n_st_hist += (size_t)a->n_window;
    }
    p->n_staged = n;
    p->st_answer = answer;
    return 0;
}

int pipeline_collect(void *pv, float *logits, char *err, size_t errlen)
{
    struct pipeline *p = pv;
    if (p->cfg.rank != 0 || p->n_pend == 0)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_collect: no step in flight");
    const struct pending *w = &p->pend[p->pend_head];
    p->pend_head = (p->pend_head + 1) % p->cfg.world_size;
    p->n_pend--;
    int rc = is_broken(p, err, errlen) ? CAIRN_EIO : wait_result(p, w, logits, err, errlen);
    count_step(p, w->tokens, rc != 0);
    return rc;
}

int pipeline_forward(void *pv, struct kv_cache *kv, const struct batch *b, float *logits, char *err, size_t errlen)
{
    struct pipeline *p = pv;
    if (p->n_pend > 0)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_forward: %d steps in flight", p->n_pend);
    int rc = pipeline_submit(pv, kv, b, err, errlen);
    return rc ? rc : pipeline_collect(pv, logits, err, errlen);
}

int pipeline_queued_ops(const struct pipeline *p) { return p->n_ops; }

/* ---- ranks > 0 ---- */

/* Records why this rank's cache no longer mirrors rank 0's: every later step fails. */
static void mirror_broken(struct pipeline *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mirror_broken(struct pipeline *p, const char *fmt, ...)
{
    char why[DP_REASON_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&p->mu);
    snprintf(p->mirror_err, sizeof p->mirror_err, "rank %d: KV mirror broken %s", p->cfg.rank, why);
    pthread_mutex_unlock(&p->mu);
    log_error("pipeline %s", p->mirror_err);
}

/* Sends a failed step's RESULT on: status, message, and as its entries every token's
 * (seq, pos) (kind TOKENS, token 0), from which the ranks after this one make the step's
 * kv_prepare calls. Without memory for the entries, none are sent. */
static int send_error(struct pipeline *p, const struct dp_activations *a, int status, const char *msg, char *err,
                      size_t errlen)
{
    char why[DP_REASON_MAX];
    int32_t *tok = calloc((size_t)a->n, sizeof *tok);
    float *lp = calloc((size_t)a->n, sizeof *lp);
    struct dp_result r = {.step = a->step, .n = tok && lp ? a->n : 0, .kind = DP_RESULT_TOKENS, .status = status,
                          .message = msg, .seq = a->seq, .pos = a->pos, .token = tok, .logprob = lp};
    int rc = dp_send_result(p->cfg.next, &r, p->cfg.timeout_ms, why, sizeof why);
    free(tok);
    free(lp);
    uint64_t step = a->step;
    if (rc)
        return breaks(p, err, errlen, "step %" PRIu64 ": sending an error to rank %d (%s): %s", step, p->next_rank,
                      dp_peer_addr(p->cfg.next), why);
    return 1;
}

static int handle_control(struct pipeline *p, const struct dp_control *ctl, char *err, size_t errlen)
{
    int64_t t0 = now_us();
    for (int i = 0; i < ctl->n && !p->mirror_err[0]; i++) {
        char why[DP_REASON_MAX - 64];
        if (pipeline_apply_ctl(p->cfg.kv, &ctl->ops[i], why, sizeof why))
            mirror_broken(p, "before step %" PRIu64 ": %s", ctl->step, why);
    }
    pthread_mutex_lock(&p->mu);
    p->st.ctl_us += now_us() - t0;
    p->st.ctl_ops += (uint64_t)ctl->n;
    pthread_mutex_unlock(&p->mu);
    if (p->last)
        return 1;
    char why[DP_REASON_MAX];
    t0 = now_us();
    int rc = dp_send_control(p->cfg.next, ctl, p->cfg.timeout_ms, why, sizeof why);
    stat_add(p, &p->st.send_us, now_us() - t0);
    if (rc)
        return breaks(p, err, errlen, "sending %d KV ops to rank %d (%s): %s", ctl->n, p->next_rank,
                      dp_peer_addr(p->cfg.next), why);
    return 1;
}

/* After this rank failed a step that rank 0 ran: makes the kv_prepare calls rank 0's
 * engine_forward made and this rank's did not (all but the first `done`, in the same
 * order), so the caches stay block for block equal and the pipeline usable. */
static void complete_prepares(struct pipeline *p, uint64_t step, int n, const int32_t *seq, const int64_t *pos,
                              int done)
{
    int k = 0;
    for (int i = 0; i < n && !p->mirror_err[0]; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = seq[j] != seq[i];
        if (!first || k++ < done)
            continue;
        int64_t count = 0;
        for (int j = i; j < n; j++)
            count += seq[j] == seq[i];
        int rc = seq[i] < kv_config(p->cfg.kv)->max_seqs ? kv_prepare(p->cfg.kv, seq[i], pos[i], count) : CAIRN_EINVAL;
        if (rc)
            mirror_broken(p, "at step %" PRIu64 ": prepare of sequence %d at %" PRId64 " for %" PRId64 ": %s", step,
                          seq[i], pos[i], count, cairn_strerror(rc));
    }
}

/* Last rank: answers a step's asks from its logits rows (n_asks of them in p->logits):
 * samples the SAMPLE rows, packs the LOGITS rows to the front of p->logits, and makes r
 * a SAMPLED result of them. CAIRN_ENOMEM when a bias list does not fit. */
static int answer_asks(struct pipeline *p, const struct dp_activations *a, struct dp_result *r)
{
    const struct dp_bias *bias = a->bias;
    const int32_t *hist = a->hist;
    size_t nv = (size_t)p->n_vocab;
    int ns = 0, nl = 0, nt = 0, skipped = 0;
    for (int i = 0; i < a->n_asks; i++) {
        const struct dp_ask *d = &a->asks[i];
        p->r_need[i] = (uint8_t)d->need;
        if (d->need == DP_ROW_LOGITS) {
            if (nl != i)
                memmove(p->logits + (size_t)nl * nv, p->logits + (size_t)i * nv, nv * sizeof *p->logits);
            nl++;
            continue;
        }
        if (d->need != DP_ROW_SAMPLE) {
            skipped++;
            continue;
        }
        if (array_reserve(&p->lb, &p->cap_lb, d->n_bias, sizeof *p->lb, 256))
            return CAIRN_ENOMEM;
        for (uint32_t k = 0; k < d->n_bias; k++)
            p->lb[k] = (struct logit_bias){.token = bias[k].token, .bias = bias[k].bias};
        struct sched_ask sa = {
            .need = SCHED_NEED_SAMPLE, .n_top = d->n_top, .pos = d->pos, .window = hist, .n_window = d->n_hist,
            .p = {.temperature = d->temperature, .top_k = d->top_k, .top_p = d->top_p, .min_p = d->min_p,
                  .repeat_penalty = d->repeat_penalty, .presence_penalty = d->presence_penalty,
                  .frequency_penalty = d->frequency_penalty, .penalty_last_n = d->penalty_last_n, .seed = d->seed,
                  .bias = p->lb, .n_bias = (int)d->n_bias}};
        bias += d->n_bias;
        hist += d->n_hist;
        struct sched_token t;
        sched_sample_row(p->smp, p->n_vocab, &sa, p->logits + (size_t)i * nv, &t);
        p->r_tok[ns] = t.token;
        p->r_prob[ns] = t.prob;
        p->r_lp[ns] = t.logprob;
        p->r_ntop[ns++] = t.n_top;
        memcpy(p->r_top_tok + nt, t.top_token, (size_t)t.n_top * sizeof *p->r_top_tok);
        memcpy(p->r_top_lp + nt, t.top_logprob, (size_t)t.n_top * sizeof *p->r_top_lp);
        nt += t.n_top;
    }
    r->kind = DP_RESULT_SAMPLED;
    r->need = p->r_need;
    r->token = p->r_tok;
    r->prob = p->r_prob;
    r->logprob = p->r_lp;
    r->n_top = p->r_ntop;
    r->top_token = p->r_top_tok;
    r->top_logprob = p->r_top_lp;
    pthread_mutex_lock(&p->mu);
    p->st.rows_sampled += (uint64_t)ns;
    p->st.rows_logits += (uint64_t)nl;
    p->st.rows_skipped += (uint64_t)skipped;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int handle_activations(struct pipeline *p, const struct dp_activations *a, char *err, size_t errlen)
{
    char msg[DP_REASON_MAX], why[DP_REASON_MAX - 32];
    int status = 0;
    int n_want = 0;
    for (int i = 0; i < a->n; i++)
        n_want += a->want[i] != 0;
    if (p->mirror_err[0]) {
        status = CAIRN_ESTATE;
        snprintf(msg, sizeof msg, "%s", p->mirror_err);
    } else if (a->n_embd != p->n_embd) {
        status = CAIRN_EINVAL;
        snprintf(msg, sizeof msg, "rank %d: activations of %d values per token, the model has %d", p->cfg.rank,
                 a->n_embd, p->n_embd);
    } else if (p->last && n_want > p->logits_rows && a->n <= p->max_batch) { /* else the engine refuses it */
        float *l = realloc(p->logits, (size_t)n_want * (size_t)p->n_vocab * sizeof *l);
        if (l) {
            p->logits = l;
            p->logits_rows = n_want;
        } else {
            status = CAIRN_ENOMEM;
            snprintf(msg, sizeof msg, "rank %d: out of memory for %d rows of logits", p->cfg.rank, n_want);
        }
    }
    p->engine_prepares = 0;
    if (!status) {
        struct batch b = {.n = a->n, .embd = a->x, .seq = a->seq, .pos = a->pos, .logits = a->want};
        int64_t t0 = now_us();
        status = engine_forward(p->cfg.e, p->cfg.kv, &b, p->last ? p->logits : p->act, why, sizeof why);
        stat_add(p, &p->st.compute_us, now_us() - t0);
        if (status)
            snprintf(msg, sizeof msg, "rank %d: %s", p->cfg.rank, why);
    }
    count_step(p, a->n, status != 0);
    if (status) {
        complete_prepares(p, a->step, a->n, a->seq, a->pos, p->engine_prepares);
        return send_error(p, a, status, msg, err, errlen);
    }

    int64_t t0 = now_us();
    int rc;
    if (!p->last) {
        struct dp_activations o = {.step = a->step, .n = a->n, .n_embd = p->n_embd, .wire_dtype = p->cfg.wire_dtype,
                                   .seq = a->seq, .pos = a->pos, .want = a->want, .x = p->act,
                                   .n_asks = a->n_asks, .asks = a->asks, .bias = a->bias, .hist = a->hist};
        rc = dp_send_activations(p->cfg.next, &o, p->cfg.timeout_ms, why, sizeof why);
        /* Results bypass this link (they go from the last rank to rank 0): rank 0 bounds
         * the steps in flight, so this link's slot is released as soon as it is taken. */
        if (!rc)
            dp_inflight_done(p->cfg.next, a->step);
    } else {
        int k = 0;
        for (int i = 0; i < a->n; i++)
            if (a->want[i]) {
                p->w_seq[k] = a->seq[i];
                p->w_pos[k++] = a->pos[i];
            }
        struct dp_result r = {.step = a->step, .n = n_want, .kind = DP_RESULT_LOGITS, .n_vocab = p->n_vocab,
                              .message = "", .seq = p->w_seq, .pos = p->w_pos, .logits = p->logits};
        if (!a->n_asks) {
            pthread_mutex_lock(&p->mu);
            p->st.rows_logits += (uint64_t)n_want;
            pthread_mutex_unlock(&p->mu);
        }
        if (a->n_asks && answer_asks(p, a, &r) < 0) {
            snprintf(msg, sizeof msg, "rank %d: out of memory for a logit bias list", p->cfg.rank);
            return send_error(p, a, CAIRN_ENOMEM, msg, err, errlen);
        }
        rc = dp_send_result(p->cfg.next, &r, p->cfg.timeout_ms, why, sizeof why);
    }
    stat_add(p, &p->st.send_us, now_us() - t0);
    if (rc)
        return breaks(p, err, errlen, "step %" PRIu64 ": sending to rank %d (%s): %s", a->step, p->next_rank,
                      dp_peer_addr(p->cfg.next), why);
    return 1;
}

int pipeline_serve(struct pipeline *p, int timeout_ms, char *err, size_t errlen)
{
    if (p->cfg.rank == 0)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pipeline_serve: rank 0 runs steps with pipeline_forward");
    if (is_broken(p, err, errlen))
        return CAIRN_EIO;
    char why[DP_REASON_MAX - 64];
    int64_t t0 = now_us(), deadline = timeout_ms < 0 ? INT64_MAX : t0 + (int64_t)timeout_ms * 1000;
    struct dp_frame f;
    int got = 0;
    for (;;) {
        if (link_down(p->cfg.next, "to", p->next_rank, why, sizeof why)) {
            stat_add(p, &p->st.wait_us, now_us() - t0);
            return breaks(p, err, errlen, "%s", why);
        }
        int64_t left_ms = deadline == INT64_MAX ? POLL_SLICE_MS : (deadline - now_us() + 999) / 1000;
        int slice = left_ms < POLL_SLICE_MS ? (int)(left_ms > 0 ? left_ms : 0) : POLL_SLICE_MS;
        got = dp_recv(p->cfg.prev, &f, slice, why, sizeof why);
        if (got != 0 || now_us() >= deadline)
            break;
    }
    stat_add(p, &p->st.wait_us, now_us() - t0);
    if (got < 0)
        return breaks(p, err, errlen, "link from rank %d (%s) ended: %s", p->prev_rank, dp_peer_addr(p->cfg.prev), why);
    if (got == 0)
        return 0;
    switch (f.type) {
    case DP_T_CONTROL: return handle_control(p, &f.ctl, err, errlen);
    case DP_T_ACTIVATIONS: return handle_activations(p, &f.act, err, errlen);
    case DP_T_RESULT: {
        /* An error from an earlier rank, on its way to rank 0: this rank makes the
         * step's kv_prepare calls all the same (rank 0's engine made them). */
        if (f.res.status < 0)
            complete_prepares(p, f.res.step, f.res.n, f.res.seq, f.res.pos, 0);
        char w2[DP_REASON_MAX];
        int rc = dp_send_result(p->cfg.next, &f.res, p->cfg.timeout_ms, w2, sizeof w2);
        if (rc)
            return breaks(p, err, errlen, "passing on a result to rank %d (%s): %s", p->next_rank,
                          dp_peer_addr(p->cfg.next), w2);
        return 1;
    }
    case DP_T_GOODBYE:
        return breaks(p, err, errlen, "rank %d (%s) closed the link: %s", p->prev_rank, dp_peer_addr(p->cfg.prev),
                      f.bye.reason);
    default:
        return breaks(p, err, errlen, "unexpected frame of type %d from rank %d", (int)f.type, p->prev_rank);
    }
}

/* ---- queries ---- */

bool pipeline_alive(const struct pipeline *p, char *why, size_t whylen)
{
    struct pipeline *m = (struct pipeline *)p; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    const char *b = p->broken[0] ? p->broken : p->mirror_err;
    bool broken = b[0] != '\0';
    if (broken && why)
        snprintf(why, whylen, "%s", b);
    pthread_mutex_unlock(&m->mu);
    if (broken)
        return false;
    char w[DP_REASON_MAX];
    if (link_down(p->cfg.next, "to", p->next_rank, w, sizeof w) ||
        link_down(p->cfg.prev, "from", p->prev_rank, w, sizeof w)) {
        if (why)
            snprintf(why, whylen, "%s", w);
        return false;
    }
    return true;
}

void pipeline_get_stats(const struct pipeline *p, struct pipeline_stats *out)
{
    struct pipeline *m = (struct pipeline *)p;
    pthread_mutex_lock(&m->mu);
    *out = p->st;
    pthread_mutex_unlock(&m->mu);
    struct dp_stats n, v;
    dp_get_stats(p->cfg.next, &n);
    dp_get_stats(p->cfg.prev, &v);
    out->next_rtt_us = n.hb_rtt_us;
    out->prev_rtt_us = v.hb_rtt_us;
    out->bytes_sent = n.bytes_sent + v.bytes_sent;
    out->bytes_received = n.bytes_received + v.bytes_received;
    out->sealed_bytes_sent = n.sealed_bytes_sent + v.sealed_bytes_sent;
}
