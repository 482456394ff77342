/* Embeddings: whole token sequences through the engine's one forward (engine_forward with
 * batch.hidden: the hidden state after the final norm, no head), pooled as the model's
 * file declares (<arch>.pooling_type: mean, cls = first token, last = last token) and
 * L2-normalised, as llama.cpp's server returns them (Qwen3-Embedding: last token,
 * normalised).
 *
 * Sequences are packed into forwards of up to the engine's max_batch tokens, a long one
 * cut into chunks across forwards (the KV cache holds its earlier positions), so that a
 * batch of short texts costs few forwards. Each sequence attends only to itself (its own
 * KV sequence id), and engine_forward is batch invariant, so a text's vector is the same
 * bits alone or in any batch.
 *
 * Order of the float operations (what embed_pool_ref in the tests mirrors): mean sums the
 * rows in token order in double, divides by n in double and rounds to float; cls and last
 * copy one row. embed_normalize sums the squares in index order in double, and multiplies
 * each element by (float)(1 / sqrt(sum)) (a zero vector stays zero). */
#ifndef CAIRN_ENGINE_EMBED_H
#define CAIRN_ENGINE_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv.h"

/* Sequences one embed_run keeps in flight: KV sequence ids [0, EMBED_MAX_SEQS). */
#define EMBED_MAX_SEQS 64

struct embed_input {
    const int32_t *ids; /* n token ids, each in the model's vocabulary */
    int64_t n;          /* >= 1 */
};

/* Counts of one embed_run (tests assert them instead of times). */
struct embed_stats {
    int64_t forwards; /* engine_forward calls */
    int64_t tokens;   /* tokens run through the model */
};

/* A KV cache config able to hold what embed_run needs for sequences up to max_len
 * tokens with an engine of max_batch: EMBED_MAX_SEQS ids, max_len + max_batch positions
 * plus a block of slack per sequence. */
struct kv_config embed_kv_config(const struct model *m, int64_t max_len, int max_batch);

/* Pools n hidden rows of dim values (a sequence's tokens in order) into out (dim) by
 * pooling (MODEL_POOLING_MEAN, _CLS or _LAST). n >= 1. */
void embed_pool(int pooling, const float *rows, int64_t n, int dim, float *out);

/* Scales v (dim) to unit Euclidean length (order above); a zero vector is left zero. */
void embed_normalize(float *v, int dim);

/* Embeds n_in sequences through e (a whole model: first and last slice) with cache kv
 * (empty, from embed_kv_config or larger; left empty): out gets n_in rows of n_embd
 * pooled, normalised values. pooling as embed_pool. Each input's length must fit the
 * engine's max_ctx and the cache. CAIRN_EINVAL naming the input and why (empty, too
 * long, a token outside the vocabulary, pooling none or rank), CAIRN_ENOMEM, or the
 * forward's error. stats may be NULL. */
int embed_run(struct engine *e, struct kv_cache *kv, int pooling, const struct embed_input *in, int n_in,
              float *out, struct embed_stats *stats, char *err, size_t errlen);

/* The same, one forward at a time (a runner interleaves it with generation steps and
 * heartbeats), each of at most max_tokens tokens (0: the engine's max_batch). create
 * checks everything embed_run checks and borrows in and out (they and e, kv must outlive
 * the job); step runs one forward: 1 while inputs remain, 0 when
 * every vector is in out, or the forward's error; release accepts NULL and frees the
 * job's KV sequences. */
struct embed_job;
int embed_job_create(struct embed_job **out_job, struct engine *e, struct kv_cache *kv, int pooling,
                     const struct embed_input *in, int n_in, float *out, int max_tokens, char *err, size_t errlen);
int embed_job_step(struct embed_job *j, char *err, size_t errlen);
struct embed_stats embed_job_stats(const struct embed_job *j);
void embed_job_release(struct embed_job *j);

#endif
