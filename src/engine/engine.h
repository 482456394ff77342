/* The engine's one core call: a forward pass of a model slice over a batch of tokens
 * from many sequences, each with its own sequence id and position (DESIGN.md).
 *
 * Bitwise batch invariance: the result for a token depends only on its sequence's
 * tokens at positions <= its own, never on what else is in the batch, how the prompt
 * was chunked, or the thread count. Every element is computed by one thread in one
 * fixed order (kern.h states the order of the matrix products; the vector helpers in
 * vec.h that of norms and RoPE; attn.h that of attention, tile by tile from position 0). */
#ifndef CAIRN_ENGINE_ENGINE_H
#define CAIRN_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "engine/kv.h"
#include "engine/moe.h"
#include "model/model.h"

/* Tensor parallelism (issue 22): `world` ranks, each with its own engine over the whole
 * model or over only its rows of every matrix (model_load_opts.tp_world: struct model_tp
 * gives the parts, the same either way), compute one forward together. Every matrix is split by OUTPUT rows: each rank
 * computes the rows of its part, so every dot product is still computed whole, by one
 * rank, in the kernels' canonical order (kern.h), and the logits are the same bits as one
 * node's. Attention is split by KV heads (rank r holds KV heads [r*h/W, (r+1)*h/W) and
 * their query heads, and only their KV cache: engine_kv_config_tp); the attention
 * output, wo's output, the feed-forward's activation (silu(gate) * up) and w_down's
 * output are completed by `gather` on every rank (4 exchanges per layer); the head is
 * split by vocabulary rows and its logits gathered on rank 0 only. Norms, residual adds
 * and activation quantization run whole on every rank (the same bits everywhere).
 * Refused: a world that does not divide the KV heads, parts that do not fall on a
 * matrix's row alignment, mixtures of experts, a slice that is not the whole model. */
struct engine_tp {
    int rank, world; /* 0 <= rank < world; world 0 or 1: not split */
    /* Completes buf, `rows` rows of ld floats: on entry columns [part[rank], part[rank+1])
     * of each row are this rank's; on return columns [0, part[world]) hold every rank's
     * parts (to_root: only on rank 0; the others need only give theirs). Every rank calls
     * it with the same rows, ld and part, in the same order. 0, or a negative code with
     * err filled (the forward fails with it). */
    int (*gather)(void *ctx, float *buf, int rows, size_t ld, const int64_t *part, int to_root, char *err,
                  size_t errlen);
    void *ctx;
};

#define ENGINE_TP_MAX MODEL_TP_MAX

struct pool;

struct engine_config {
    int n_threads;   /* >= 1 */
    int max_batch;   /* largest batch engine_forward accepts */
    int64_t max_ctx; /* longest sequence (positions) attention will see */
    struct engine_tp tp; /* zero: one node */
    /* Borrowed: run on this pool (another engine's, engine_pool) instead of making one, so
     * that a draft and its target, which run in turn on one thread, share their threads
     * and never leave a second pool's threads spinning beside the working one. The pool's
     * owner must outlive this engine and never run at the same time. NULL: its own. */
    struct pool *pool;
};

/* A batch of n tokens. Tokens of one sequence must have consecutive positions in
 * batch order, the first of them <= the sequence's current length in the KV cache
 * (writing at an earlier position drops the sequence's tail from there on). */
struct batch {
    int n;
    const int32_t *token; /* first slice: token ids (n) */
    const float *embd;    /* other slices: input activations (n x n_embd) */
    const int32_t *seq;   /* sequence id per token (n) */
    const int64_t *pos;   /* position per token (n) */
    const uint8_t *logits; /* last slice: tokens whose logits are wanted (n); NULL: all */
    bool hidden;           /* last slice: out gets the wanted tokens' hidden states after the
                              final norm (n_embd each) instead of logits: what embedding
                              models pool */
};

struct engine;

/* Creates an engine over a loaded model slice (borrowed: must outlive the engine).
 * All buffers are allocated here for cfg->max_batch tokens. */
int engine_create(struct engine **out, const struct model *m, const struct engine_config *cfg,
                  char *err, size_t errlen);
void engine_release(struct engine *e); /* accepts NULL */

/* The pool e's forwards run on (for engine_config.pool of an engine run in turn with e). */
struct pool *engine_pool(const struct engine *e);

/* The KV cache type of a name ("f16", "f32", "q8_0", "q4_0", any case, as llama.cpp's
 * -ctk/-ctv), or CAIRN_EINVAL. */
int engine_kv_type(const char *name);

/* KV cache config for this slice: n_ctx positions for each of n_seqs sequences, K and V
 * in F16 (set type_k / type_v for others). */
struct kv_config engine_kv_config(const struct model *m, int64_t n_ctx, int n_seqs, int block_tokens);
/* The same for one of `world` tensor-parallel ranks: its KV heads only (1/world of them). */
struct kv_config engine_kv_config_tp(const struct model *m, int world, int64_t n_ctx, int n_seqs, int block_tokens);

/* Whether m can be split over `world` tensor-parallel ranks (engine_tp's rules, the row
 * alignments of m's matrices included): 0, or CAIRN_EINVAL saying why not. */
int engine_tp_check(const struct model *m, int world, char *err, size_t errlen);
/* The same from the hyper-parameters alone (no row alignments): for placement. */
int engine_tp_check_hparams(const struct model_hparams *hp, int world, char *err, size_t errlen);

/* Runs the slice over the batch. out receives, for the last slice, one row of n_vocab
 * logits (n_embd normed hidden values with b->hidden) per token whose logits are wanted,
 * in batch order; for other slices n rows of
 * n_embd activations. Returns 0, CAIRN_EINVAL for a malformed batch (message says
 * which token and why), or CAIRN_EFULL when the KV cache has no room. Allocates nothing. */
int engine_forward(struct engine *e, struct kv_cache *kv, const struct batch *b, float *out,
                   char *err, size_t errlen);

const struct model *engine_model(const struct engine *e);
int engine_threads(const struct engine *e);
/* The largest batch engine_forward accepts (engine_config.max_batch). */
int engine_max_batch(const struct engine *e);
/* The longest sequence it serves (engine_config.max_ctx). */
int64_t engine_max_ctx(const struct engine *e);

/* Exchanges (engine_tp.gather calls) and the bytes of this rank's own parts in them,
 * so far (a rank's part goes to world - 1 others, or to rank 0 alone for the logits). */
struct engine_tp_stats {
    uint64_t forwards, gathers, part_bytes;
    uint64_t weight_bytes; /* bytes of weights this rank's products read per token (its rows) */
};
struct engine_tp_stats engine_get_tp_stats(const struct engine *e);

/* The mixture-of-experts work done so far (zeros for a dense model). */
struct moe_stats engine_moe_stats(const struct engine *e);

/* Jobs handed to the engine's threads so far (pool_dispatches): each costs a barrier, so
 * tests hold the count per decode step to what the layer loop needs. */
unsigned long long engine_dispatches(const struct engine *e);

/* Where the time of forwards goes (off unless asked; bench's decode breakdown). A forward
 * is cut into phases on the calling thread's clock; each phase's jobs handed to the
 * threads are timed by the pool (pool_tag_stats), and its products' weight bytes
 * counted. A phase's wall time less its jobs' is work the calling thread did alone. */
enum engine_phase {
    EP_INPUT,      /* cache room, RoPE tables, the embedding, the first norm */
    EP_QKV,        /* the q, k, v products */
    EP_QKV_POST,   /* empty: attention's job does the biases, head norms, RoPE and KV cache write */
    EP_ATTN,       /* the biases, head norms, RoPE, the KV cache write, attention (attn_forward_prep) */
    EP_WO,         /* the output product and its input's quantizing */
    EP_RESID_ATTN, /* residual add, the feed-forward's norm and quantizing */
    EP_FFN,        /* gate and up, the activation, down's quantizing (a mixture: all of it) */
    EP_DOWN,       /* the down product */
    EP_RESID_FFN,  /* residual add, the next layer's norm and quantizing */
    EP_HEAD,       /* the final norm, its quantizing, the output head, softcapping */
    N_ENGINE_PHASES
};
const char *engine_phase_name(int phase);
struct engine_phase_stats {
    long long ns;   /* the calling thread's wall time in the phase */
    struct pool_tag_stats jobs;
    double weight_bytes; /* of the products run */
};
/* Turns profiling on (sums zeroed) or off; 0, or CAIRN_ENOMEM. */
int engine_profile(struct engine *e, bool on);
/* The sums of phase ph so far; *forwards and *ns_forward: forwards timed and their time. */
struct engine_phase_stats engine_phase_stats(const struct engine *e, int ph);
void engine_profile_totals(const struct engine *e, unsigned long long *forwards, long long *ns_forward);

#endif
