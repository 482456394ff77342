#include "async_fwd.h"

#include "base/err.h"
#include "model/model.h"

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
    for (int i = 0; i < SCHED_MAX_LANES; i++)
        free(a->slot[i].logits);
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
    f->n = b->n;
    f->n_want = 0;
    memcpy(f->tok, b->token, (size_t)b->n * sizeof *f->tok);
    memcpy(f->seq, b->seq, (size_t)b->n * sizeof *f->seq);
    memcpy(f->pos, b->pos, (size_t)b->n * sizeof *f->pos);
    memcpy(f->want, b->logits, (size_t)b->n);
    for (int i = 0; i < b->n; i++)
        f->n_want += f->want[i];
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
    return 0;
}
