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

int embed_run(struct engine *e, struct kv_cache *kv, int pooling, const struct embed_input *in, int n_in,
              float *out, struct embed_stats *stats, char *err, size_t errlen)
{
    const struct model *m = engine_model(e);
    const int dim = m->hp.n_embd, B = engine_max_batch(e);
    const struct kv_config *kc = kv_config(kv);
    int n_slots = kc->max_seqs < EMBED_MAX_SEQS ? kc->max_seqs : EMBED_MAX_SEQS;
    int64_t room = kc->n_blocks * kc->block_tokens - (int64_t)kc->block_tokens * n_slots - B;
    if (stats)
        *stats = (struct embed_stats){0};
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
        for (int64_t j = 0; j < in[i].n; j++)
            if (in[i].ids[j] < 0 || in[i].ids[j] >= m->hp.n_vocab)
                return cairn_fail(err, errlen, CAIRN_EINVAL, "input %d, token %lld: id %d is outside the vocabulary of %d",
                                  i, (long long)j, in[i].ids[j], m->hp.n_vocab);
    }
    int rc = 0;
    int32_t *tok = malloc((size_t)B * sizeof *tok), *seq = malloc((size_t)B * sizeof *seq);
    int64_t *pos = malloc((size_t)B * sizeof *pos);
    uint8_t *want = malloc((size_t)B);
    float *hidden = malloc((size_t)B * (size_t)dim * sizeof *hidden);
    struct slot *slots = calloc((size_t)n_slots, sizeof *slots);
    double *sums = pooling == MODEL_POOLING_MEAN ? calloc((size_t)n_slots * (size_t)dim, sizeof *sums) : NULL;
    if (!tok || !seq || !pos || !want || !hidden || !slots || (pooling == MODEL_POOLING_MEAN && !sums)) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < n_slots; s++) {
        slots[s].in = -1;
        slots[s].sum = sums ? sums + (size_t)s * (size_t)dim : NULL;
    }
    /* The order sequences run in: the slot started first fills the batch first, so the
     * one cut at the end of a batch goes on at the start of the next. */
    int order[EMBED_MAX_SEQS], n_active = 0, next_in = 0, done = 0;
    while (done < n_in) {
        int nb = 0;
        for (;;) {
            /* start new sequences into free slots while the batch has room */
            if (nb < B && next_in < n_in && n_active < n_slots) {
                int s = 0;
                while (slots[s].in >= 0)
                    s++;
                slots[s].in = next_in++;
                slots[s].next = 0;
                if (slots[s].sum)
                    memset(slots[s].sum, 0, (size_t)dim * sizeof *slots[s].sum);
                kv_seq_clear(kv, s);
                order[n_active++] = s;
            }
            /* fill the batch from the active sequences in order */
            int before = nb;
            for (int a = 0; a < n_active && nb < B; a++) {
                struct slot *sl = &slots[order[a]];
                const struct embed_input *x = &in[sl->in];
                int64_t queued = 0;
                for (int k = 0; k < nb; k++)
                    queued += seq[k] == order[a];
                for (int64_t p = sl->next + queued; p < x->n && nb < B; p++, nb++) {
                    tok[nb] = x->ids[p];
                    seq[nb] = order[a];
                    pos[nb] = p;
                    want[nb] = wanted(pooling, p, x->n);
                }
            }
            if (nb == before && !(nb < B && next_in < n_in && n_active < n_slots))
                break;
        }
        struct batch b = {.n = nb, .token = tok, .seq = seq, .pos = pos, .logits = want, .hidden = true};
        if ((rc = engine_forward(e, kv, &b, hidden, err, errlen)))
            goto out;
        if (stats) {
            stats->forwards++;
            stats->tokens += nb;
        }
        int row = 0;
        for (int k = 0; k < nb; k++) {
            struct slot *sl = &slots[seq[k]];
            const float *h = hidden + (size_t)row * (size_t)dim;
            float *o = out + (size_t)sl->in * (size_t)dim;
            sl->next = pos[k] + 1;
            if (want[k]) {
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
        for (int a = 0; a < n_active; a++) {
            struct slot *sl = &slots[order[a]];
            const struct embed_input *x = &in[sl->in];
            if (sl->next < x->n) {
                order[kept++] = order[a];
                continue;
            }
            float *o = out + (size_t)sl->in * (size_t)dim;
            if (pooling == MODEL_POOLING_MEAN)
                for (int d = 0; d < dim; d++)
                    o[d] = (float)(sl->sum[d] / (double)x->n);
            embed_normalize(o, dim);
            kv_seq_clear(kv, order[a]);
            sl->in = -1;
            done++;
        }
        n_active = kept;
    }
out:
    for (int s = 0; slots && s < n_slots; s++)
        if (slots[s].in >= 0)
            kv_seq_clear(kv, s);
    free(tok);
    free(seq);
    free(pos);
    free(want);
    free(hidden);
    free(slots);
    free(sums);
    return rc;
}
