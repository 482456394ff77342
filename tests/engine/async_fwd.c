#include "async_fwd.h"

#include "base/err.h"
#include "engine/sample.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void async_fwd_init(struct async_fwd *a, struct engine *e, bool deferred)
{
    memset(a, 0, sizeof *a);
    a->e = e;
    a->deferred = deferred;
}

void async_fwd_free(struct async_fwd *a)
{
    for (int i = 0; i < SCHED_MAX_LANES; i++) {
        free(a->slot[i].logits);
        free(a->slot[i].windows);
        free(a->slot[i].bias);
    }
    sample_release(a->smp);
}

int async_asks(void *ctx, const struct sched_ask *ask, int n, struct sched_token *answer, char *err, size_t errlen)
{
    struct async_fwd *a = ctx;
    int n_vocab = engine_model(a->e)->hp.n_vocab;
    if (a->count == SCHED_MAX_LANES || n > ASYNC_FWD_MAX_BATCH || (!a->smp && sample_create(&a->smp, n_vocab))) {
        a->misuse++;
        return cairn_fail(err, errlen, CAIRN_ESTATE, "async_asks: misuse");
    }
    struct async_flight *f = &a->slot[(a->head + a->count) % SCHED_MAX_LANES];
    int64_t nw = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        nw += ask[i].n_window;
        nb += ask[i].p.n_bias;
    }
    free(f->windows);
    free(f->bias);
    f->windows = malloc((size_t)(nw + 1) * sizeof *f->windows);
    f->bias = malloc((size_t)(nb + 1) * sizeof *f->bias);
    if (!f->windows || !f->bias)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "async_asks: out of memory");
    nw = nb = 0;
    for (int i = 0; i < n; i++) {
        f->ask[i] = ask[i];
        if (ask[i].n_window)
            memcpy(f->windows + nw, ask[i].window, (size_t)ask[i].n_window * sizeof *f->windows);
        if (ask[i].p.n_bias)
            memcpy(f->bias + nb, ask[i].p.bias, (size_t)ask[i].p.n_bias * sizeof *f->bias);
        f->ask[i].window = f->windows + nw;
        f->ask[i].p.bias = f->bias + nb;
        nw += ask[i].n_window;
        nb += ask[i].p.n_bias;
    }
    f->n_asks = n;
    f->answer = answer;
    a->staged = true;
    a->asks_calls++;
    return 0;
}

static int distinct_seqs(const struct async_flight *f)
{
    int n = 0;
    for (int i = 0; i < f->n; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = f->seq[j] == f->seq[i];
        n += !seen;
    }
    return n;
}

static int run(struct async_fwd *a, struct async_flight *f)
{
    struct batch c = {.n = f->n, .token = f->tok, .seq = f->seq, .pos = f->pos, .logits = f->want};
    return engine_forward(a->e, a->kv, &c, f->logits, f->err, sizeof f->err);
}

int async_submit(void *ctx, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen)
{
    struct async_fwd *a = ctx;
    if (a->count == SCHED_MAX_LANES || kv != a->kv || b->n > ASYNC_FWD_MAX_BATCH) {
        a->misuse++;
        return cairn_fail(err, errlen, CAIRN_ESTATE, "async_submit: misuse");
    }
    struct async_flight *f = &a->slot[(a->head + a->count) % SCHED_MAX_LANES];
    f->asked = a->staged;
    a->staged = false;
    f->n = b->n;
    f->n_want = 0;
    memcpy(f->tok, b->token, (size_t)b->n * sizeof *f->tok);
    memcpy(f->seq, b->seq, (size_t)b->n * sizeof *f->seq);
    memcpy(f->pos, b->pos, (size_t)b->n * sizeof *f->pos);
    memcpy(f->want, b->logits, (size_t)b->n);
    for (int i = 0; i < b->n; i++)
        f->n_want += f->want[i];
    if (f->asked && f->n_asks != f->n_want) {
        a->misuse++;
        return cairn_fail(err, errlen, CAIRN_ESTATE, "async_submit: %d asks for %d wanted rows", f->n_asks, f->n_want);
    }
    for (int k = 0; k < a->count; k++) {
        const struct async_flight *o = &a->slot[(a->head + k) % SCHED_MAX_LANES];
        for (int i = 0; i < f->n; i++)
            for (int j = 0; j < o->n; j++)
                a->misuse += f->seq[i] == o->seq[j];
    }
    int seqs = distinct_seqs(f);
    a->max_seqs = seqs > a->max_seqs ? seqs : a->max_seqs;
    free(f->logits);
    size_t n_vocab = (size_t)engine_model(a->e)->hp.n_vocab;
    f->logits = malloc((size_t)(f->n_want ? f->n_want : 1) * n_vocab * sizeof *f->logits);
    if (!f->logits)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "async_submit: out of memory");
    f->rc = a->deferred ? 0 : run(a, f);
    if (f->rc) /* as rank 0's own slice failing: nothing is in flight */
        return cairn_fail(err, errlen, f->rc, "%s", f->err);
    a->count++;
    a->submits++;
    a->max_in_flight = a->count > a->max_in_flight ? a->count : a->max_in_flight;
    return 0;
}

int async_collect(void *ctx, float *logits, char *err, size_t errlen)
{
    struct async_fwd *a = ctx;
    if (a->count == 0) {
        a->misuse++;
        return cairn_fail(err, errlen, CAIRN_ESTATE, "async_collect: nothing in flight");
    }
    struct async_flight *f = &a->slot[a->head];
    a->head = (a->head + 1) % SCHED_MAX_LANES;
    a->count--;
    if (++a->collects == a->fail_collect)
        return cairn_fail(err, errlen, CAIRN_EIO, "injected failure of collect %d", a->collects);
    if (a->deferred)
        f->rc = run(a, f);
    if (f->rc)
        return cairn_fail(err, errlen, f->rc, "%s", f->err);
    size_t n_vocab = (size_t)engine_model(a->e)->hp.n_vocab;
    memcpy(logits, f->logits, (size_t)f->n_want * n_vocab * sizeof *logits);
    for (int i = 0; f->asked && i < f->n_asks; i++) {
        float *row = logits + (size_t)i * n_vocab;
        if (f->ask[i].need == SCHED_NEED_SAMPLE) {
            sched_sample_row(a->smp, (int)n_vocab, &f->ask[i], row, &f->answer[i]);
            a->sampled++;
        } else if (f->ask[i].need == SCHED_NEED_SKIP) {
            a->skipped++;
        } else {
            continue;
        }
        for (size_t k = 0; k < n_vocab; k++)
            row[k] = NAN;
    }
    return 0;
}
