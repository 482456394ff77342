/* Embeddings through the engine's forward (embed.h). */
#include "engine/embed.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/arch.h"

struct kv_config embed_kv_config(const struct model *m, int64_t max_len, int max_batch)
{
    const int block = 16;
    int64_t positions = max_len + max_batch + (int64_t)block * EMBED_MAX_SEQS;
    struct kv_config kc = engine_kv_config(m, positions, 1, block);
    kc.max_seqs = EMBED_MAX_SEQS;
    return kc;
}

void embed_pool(int pooling, const float *rows, int64_t n, int dim, float *out)
{
    if (pooling == MODEL_POOLING_CLS) {
        memcpy(out, rows, (size_t)dim * sizeof *out);
        return;
    }
    if (pooling == MODEL_POOLING_LAST) {
        memcpy(out, rows + (size_t)(n - 1) * (size_t)dim, (size_t)dim * sizeof *out);
        return;
    }
    for (int d = 0; d < dim; d++) {
        double s = 0;
        for (int64_t i = 0; i < n; i++)
            s += rows[(size_t)i * (size_t)dim + (size_t)d];
        out[d] = (float)(s / (double)n);
    }
}

void embed_normalize(float *v, int dim)
{
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += (double)v[i] * (double)v[i];
    if (ss <= 0)
        return;
    float k = (float)(1.0 / sqrt(ss));
    for (int i = 0; i < dim; i++)
        v[i] *= k;
}

/* A sequence in flight: its input, the next position to run, and (mean) its sums. */
struct slot {
    int in;        /* input index; -1: free */
    int64_t next;  /* positions [0, next) have been run */
    double *sum;   /* dim, mean pooling */
};

static bool wanted(int pooling, int64_t pos, int64_t n)
{
    return pooling == MODEL_POOLING_MEAN || (pooling == MODEL_POOLING_CLS && pos == 0) ||
           (pooling == MODEL_POOLING_LAST && pos == n - 1);
}

struct embed_job {
    struct engine *e;
    struct kv_cache *kv;
    int pooling, dim, B, n_slots;
    const struct embed_input *in;
    int n_in;
    float *out;
    int32_t *tok, *seq;
    int64_t *pos;
    uint8_t *want;
    float *hidden;
    struct slot *slots;
    double *sums;
    /* The order sequences run in: the slot started first fills the batch first, so the
     * one cut at the end of a batch goes on at the start of the next. */
    int order[EMBED_MAX_SEQS], n_active, next_in, done;
    struct embed_stats stats;
};

void embed_job_release(struct embed_job *j)
{
    if (!j)
        return;
    for (int s = 0; j->slots && s < j->n_slots; s++)
        if (j->slots[s].in >= 0)
            kv_seq_clear(j->kv, s);
    free(j->tok);
    free(j->seq);
    free(j->pos);
    free(j->want);
    free(j->hidden);
    free(j->slots);
    free(j->sums);
    free(j);
}

int embed_job_create(struct embed_job **out_job, struct engine *e, struct kv_cache *kv, int pooling,
                     const struct embed_input *in, int n_in, float *out, int max_tokens, char *err, size_t errlen)
{
    *out_job = NULL;
    const struct model *m = engine_model(e);
    const int dim = m->hp.n_embd;
    const int B = max_tokens > 0 && max_tokens < engine_max_batch(e) ? max_tokens : engine_max_batch(e);
    const struct kv_config *kc = kv_config(kv);
    int n_slots = kc->max_seqs < EMBED_MAX_SEQS ? kc->max_seqs : EMBED_MAX_SEQS;
    int64_t room = kc->n_blocks * kc->block_tokens - (int64_t)kc->block_tokens * n_slots - B;
    if (pooling != MODEL_POOLING_MEAN && pooling != MODEL_POOLING_CLS && pooling != MODEL_POOLING_LAST)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "pooling '%s' gives no embedding of a sequence",
                          model_pooling_name(pooling) ? model_pooling_name(pooling) : "?");
    if (n_in < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "a negative number of inputs");
    for (int i = 0; i < n_in; i++) {
        if (in[i].n < 1)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "input %d is empty (no tokens)", i);
        if (in[i].n > engine_max_ctx(e))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "input %d has %lld tokens, more than the context of %lld",
                              i, (long long)in[i].n, (long long)engine_max_ctx(e));
        if (in[i].n > room)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "input %d has %lld tokens, more than the %lld this model's cache holds",
                              i, (long long)in[i].n, (long long)(room > 0 ? room : 0));
        for (int64_t k = 0; k < in[i].n; k++)
            if (in[i].ids[k] < 0 || in[i].ids[k] >= m->hp.n_vocab)
                return cairn_fail(err, errlen, CAIRN_EINVAL, "input %d, token %lld: id %d is outside the vocabulary of %d",
                                  i, (long long)k, in[i].ids[k], m->hp.n_vocab);
    }
    struct embed_job *j = calloc(1, sizeof *j);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    *j = (struct embed_job){.e = e, .kv = kv, .pooling = pooling, .dim = dim, .B = B, .n_slots = n_slots,
                            .in = in, .n_in = n_in, .out = out};
    j->tok = malloc((size_t)B * sizeof *j->tok);
    j->seq = malloc((size_t)B * sizeof *j->seq);
    j->pos = malloc((size_t)B * sizeof *j->pos);
    j->want = malloc((size_t)B);
    j->hidden = malloc((size_t)B * (size_t)dim * sizeof *j->hidden);
    j->slots = calloc((size_t)n_slots, sizeof *j->slots);
    if (pooling == MODEL_POOLING_MEAN)
        j->sums = calloc((size_t)n_slots * (size_t)dim, sizeof *j->sums);
    if (!j->tok || !j->seq || !j->pos || !j->want || !j->hidden || !j->slots ||
        (pooling == MODEL_POOLING_MEAN && !j->sums)) {
        embed_job_release(j);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    for (int s = 0; s < n_slots; s++) {
        j->slots[s].in = -1;
        j->slots[s].sum = j->sums ? j->sums + (size_t)s * (size_t)dim : NULL;
    }
    *out_job = j;
    return 0;
}

int embed_job_step(struct embed_job *j, char *err, size_t errlen)
{
    if (j->done >= j->n_in)
        return 0;
    const int B = j->B, dim = j->dim, pooling = j->pooling;
    struct slot *slots = j->slots;
    int nb = 0;
    for (;;) {
        /* start new sequences into free slots while the batch has room */
        if (nb < B && j->next_in < j->n_in && j->n_active < j->n_slots) {
            int s = 0;
            while (slots[s].in >= 0)
                s++;
            slots[s].in = j->next_in++;
            slots[s].next = 0;
            if (slots[s].sum)
                memset(slots[s].sum, 0, (size_t)dim * sizeof *slots[s].sum);
            kv_seq_clear(j->kv, s);
            j->order[j->n_active++] = s;
        }
        /* fill the batch from the active sequences in order */
        int before = nb;
        for (int a = 0; a < j->n_active && nb < B; a++) {
            struct slot *sl = &slots[j->order[a]];
            const struct embed_input *x = &j->in[sl->in];
            int64_t queued = 0;
            for (int k = 0; k < nb; k++)
                queued += j->seq[k] == j->order[a];
            for (int64_t p = sl->next + queued; p < x->n && nb < B; p++, nb++) {
                j->tok[nb] = x->ids[p];
                j->seq[nb] = j->order[a];
                j->pos[nb] = p;
                j->want[nb] = wanted(pooling, p, x->n);
            }
        }
        if (nb == before && !(nb < B && j->next_in < j->n_in && j->n_active < j->n_slots))
            break;
    }
    struct batch b = {.n = nb, .token = j->tok, .seq = j->seq, .pos = j->pos, .logits = j->want, .hidden = true};
    int rc = engine_forward(j->e, j->kv, &b, j->hidden, err, errlen);
    if (rc)
        return rc;
    j->stats.forwards++;
    j->stats.tokens += nb;
    int row = 0;
    for (int k = 0; k < nb; k++) {
        struct slot *sl = &slots[j->seq[k]];
        const float *h = j->hidden + (size_t)row * (size_t)dim;
        float *o = j->out + (size_t)sl->in * (size_t)dim;
        sl->next = j->pos[k] + 1;
        if (j->want[k]) {
            row++;
            if (pooling == MODEL_POOLING_MEAN)
                for (int d = 0; d < dim; d++)
                    sl->sum[d] += h[d];
            else
                memcpy(o, h, (size_t)dim * sizeof *o);
        }
    }
    /* finish the sequences whose last token ran */
    int kept = 0;
    for (int a = 0; a < j->n_active; a++) {
        struct slot *sl = &slots[j->order[a]];
        const struct embed_input *x = &j->in[sl->in];
        if (sl->next < x->n) {
            j->order[kept++] = j->order[a];
            continue;
        }
        float *o = j->out + (size_t)sl->in * (size_t)dim;
        if (pooling == MODEL_POOLING_MEAN)
            for (int d = 0; d < dim; d++)
                o[d] = (float)(sl->sum[d] / (double)x->n);
        embed_normalize(o, dim);
        kv_seq_clear(j->kv, j->order[a]);
        sl->in = -1;
        j->done++;
    }
    j->n_active = kept;
    return j->done < j->n_in;
}

struct embed_stats embed_job_stats(const struct embed_job *j) { return j->stats; }

int embed_run(struct engine *e, struct kv_cache *kv, int pooling, const struct embed_input *in, int n_in,
              float *out, struct embed_stats *stats, char *err, size_t errlen)
{
    struct embed_job *j;
    if (stats)
        *stats = (struct embed_stats){0};
    int rc = embed_job_create(&j, e, kv, pooling, in, n_in, out, 0, err, errlen);
    if (!rc)
        while ((rc = embed_job_step(j, err, errlen)) > 0)
            ;
    if (j && stats)
        *stats = j->stats;
    embed_job_release(j);
    return rc < 0 ? rc : 0;
}
