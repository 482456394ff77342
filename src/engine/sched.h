/* Continuous batching (DESIGN.md, "The engine's one core call"): a scheduler over one
 * engine_forward for a whole model (first and last slice in one process). Requests wait
 * in a queue behind `slots` running sequences; every sched_step runs ONE forward pass
 * that holds one decode token of every running sequence plus chunks of the prompts
 * being prefilled (at most chunk_tokens prompt tokens per step, so running streams keep
 * flowing while a long prompt is read), samples each sequence with its own parameters,
 * and reports each token through a callback.
 *
 * Admission is by free KV blocks. When the cache runs out mid-generation, cached
 * prefixes are evicted first, then the newest running sequence is preempted: its KV is
 * dropped and it goes back to the front of the queue with its prompt plus what it
 * generated so far, recomputed later. Because engine_forward is batch invariant and the
 * sampler draws per (seed, position), a sequence's tokens are the same alone, in any
 * batch, chunked any way, preempted or not.
 *
 * Prefix reuse: a finished sequence's KV (prompt and generated tokens) stays in a cache
 * of up to cache_seqs entries (least recently used evicted first); a new request whose
 * prompt starts with the tokens of a cached entry forks that entry's blocks (no copy)
 * and prefills only the rest (at least its last prompt token, whose logits it needs).
 *
 * Sequences of one request (n_seqs > 1, OpenAI's `n`) share the prompt's KV: the prompt
 * is prefilled once and forked; sequence i samples with seed + i.
 *
 * Speculative decoding: with a draft model set (sched_set_draft: a second engine and KV
 * cache over a small model of the same vocabulary), every decoding sequence that drafts
 * gets k tokens proposed by the draft (k draft forwards per step, each over all drafting
 * sequences), sampled from the draft's distribution with the request's own parameters;
 * the step's one target forward then holds each such sequence's last token and its k
 * drafts beside the other sequences' decode tokens and prompt chunks. Greedy requests
 * keep the longest prefix the target's argmax agrees with, then the target's own next
 * token, so their tokens are exactly those without a draft. Sampled requests use
 * rejection sampling (Leviathan et al. 2023, Chen et al. 2023): draft token x is kept
 * with probability min(1, p(x)/q(x)), p the target's distribution after the request's
 * sampling steps and q the one the draft drew from; at the first rejection a token is
 * drawn from norm(max(0, p - q)); when all k are kept one more is drawn from p. Each
 * token is thus distributed exactly as without a draft. Draws are per (seed, position):
 * the draft's, the acceptance test's and the residual's from seeds derived from the
 * request's, the extra token's as sample_token's; a sampled request's tokens are
 * deterministic and batch invariant for a given drafting schedule (the k of each step),
 * but differ from the tokens it draws without drafting. Rejected positions are dropped
 * from both KV caches. Prompt lookup (per request) drafts without a model: the tokens
 * that followed the latest earlier occurrence of the longest n-gram ending the
 * sequence (q is then one token with probability 1).
 *
 * Threading: one thread calls everything (the runner's loop); callbacks run inside
 * sched_step, sched_cancel and sched_release on that thread. A callback may call
 * sched_submit, sched_idle and sched_get_stats, nothing else (to stop a sequence from the
 * token callback, return 1). */
#ifndef CAIRN_ENGINE_SCHED_H
#define CAIRN_ENGINE_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "tok/grammar.h"
#include "tok/tok.h"

#define SCHED_MAX_TOP_LOGPROBS 20
#define SCHED_MAX_SEQS_PER_REQUEST 128
#define SCHED_MAX_DRAFT 16        /* draft tokens per sequence and step */
#define SCHED_MAX_LOOKUP_NGRAM 8  /* longest n-gram prompt lookup matches */
#define SCHED_MAX_LANES 8         /* micro-batches in flight */

enum sched_finish {
    SCHED_FINISH_STOP,      /* an end-of-generation token (not reported as a token) */
    SCHED_FINISH_LENGTH,    /* max_tokens generated, or the context is full */
    SCHED_FINISH_STOPPED,   /* the token callback asked to stop (e.g. a stop string) */
    SCHED_FINISH_CANCELLED, /* sched_cancel or sched_release */
    SCHED_FINISH_ERROR,     /* could not run (message in the done callback) */
    SCHED_FINISH_COUNT
};

struct sched_token;

/* What the forward returns for one wanted token (sched_config.asks). */
enum sched_need {
    SCHED_NEED_LOGITS = 1, /* its row of logits */
    SCHED_NEED_SAMPLE = 2, /* the token sched_sample_row draws from the row */
    SCHED_NEED_SKIP = 3,   /* nothing: the scheduler will not read it */
};

/* One wanted token's ask. SAMPLE: the sequence's parameters (seed already + its index;
 * bias points into the scheduler), the position drawn, the penalty window (the tokens
 * of the history the penalties read: its last penalty_last_n, or all with -1, none
 * when no penalty applies) and how many top log-probabilities to return (-1: no
 * log-probabilities at all). Other needs leave the rest zero. */
struct sched_ask {
    int need;               /* enum sched_need */
    int n_top;              /* -1, or 0..SCHED_MAX_TOP_LOGPROBS */
    int64_t pos;
    struct sample_params p;
    const int32_t *window;  /* n_window tokens */
    int64_t n_window;
};

/* Samples row (n_vocab logits) for ask a exactly as the scheduler samples a row itself:
 * sample_token over the window at a->pos, then with n_top >= 0 the token's and the
 * n_top most probable tokens' log-softmax of the raw row. Fills out (zeroed first; on
 * a sampler error out->token is its negative code) and returns out->token. smp has
 * n_vocab's scratch; allocates nothing. */
int32_t sched_sample_row(struct sampler *smp, int n_vocab, const struct sched_ask *a, const float *row,
                         struct sched_token *out);

struct sched_config {
    int slots;        /* sequences running at once, 1..256 */
    int64_t ctx;      /* positions per sequence (prompt + generated), >= 2; at most the
                         engine's max_ctx (engine_forward refuses later positions) */
    int chunk_tokens; /* prompt tokens prefilled per step over all sequences; 0: the
                         engine's max_batch minus slots (at least 1), and paced: while
                         sequences decode, a step's prompt tokens are cut so that the
                         step takes about SCHED_PACE_STEPS decode steps (timed as they
                         run), keeping the decoding streams' token gaps even; more
                         while more sequences wait for their prompt than decode (a
                         burst of arrivals), and the whole chunk while only sequences
                         in their first few tokens decode (see SCHED_PACE_STEPS and
                         SCHED_PACE_YOUNG in sched.c) */
    int queue_max;    /* sched_submit refuses a request while this many queue items wait
                         (stats.queued, preempted sequences included); 0: 4 * slots */
    int cache_seqs;   /* finished sequences kept for prefix reuse; 0: none */
    const struct tok *tok; /* end-of-generation tokens (tok_is_eog); NULL: none */
    /* The target's forward pass; NULL: engine_forward on the sched's engine. A pipeline's
     * rank 0 sets it to run the batch through every rank (runner/pipeline.h); the
     * sched's engine is then only the first slice. Same contract as engine_forward
     * (logits: a row of n_vocab per wanted token, in batch order). The draft model's
     * forwards stay local. */
    int (*forward)(void *ctx, struct kv_cache *kv, const struct batch *b, float *logits, char *err,
                   size_t errlen);
    void *forward_ctx;
    /* Micro-batches in flight (a pipeline of stages, each busy with another batch): 0 or
     * 1, one forward at a time; L in 2..SCHED_MAX_LANES, the running sequences are split
     * into up to L micro-batches of about running / L sequences each, and a step either
     * submits one (submit: starts the forward of b and returns; b may be reused at once)
     * or collects the oldest one's logits (collect: waits for the forward submitted
     * first of those not collected, same logits contract as forward). Results come back
     * in submission order. A sequence is in at most one micro-batch in flight, and is
     * never preempted while it is; its tokens are the same as with one lane (the forward
     * is batch invariant). submit and collect take forward_ctx; forward is then unused. */
    int lanes;
    int (*submit)(void *ctx, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen);
    int (*collect)(void *ctx, float *logits, char *err, size_t errlen);
    /* Sampling where the logits are (a pipeline's last rank, so that a token instead of
     * a row of n_vocab floats crosses the network); NULL: the scheduler samples every
     * row itself. With forward, or submit and collect, set: right before each forward
     * or submit the scheduler calls asks(forward_ctx, ask, n, answer) with one ask per
     * wanted token of that batch, in batch order (struct sched_ask; ask and what it
     * points to stay valid until that forward or submit returns). That forward (or its
     * collect) then writes, for ask i, answer[i] as sched_sample_row computes it from the
     * row (SAMPLE), or the row's logits at their usual place (LOGITS), or nothing (SKIP);
     * logits rows of SAMPLE and SKIP asks are not read. answer stays the forward's until
     * its results are collected. Rows whose reader needs the whole distribution (a
     * sampled request's drafts, verified by rejection sampling; the prompt's last token
     * of a request with n_seqs > 1, sampled once per sequence) ask LOGITS, and so does a
     * row whose penalty window and bias list weigh as much as its logits. Tokens are
     * the same either way (the sampler is deterministic). A negative return fails the
     * step like a failed forward. */
    int (*asks)(void *ctx, const struct sched_ask *ask, int n, struct sched_token *answer, char *err,
                size_t errlen);
};

/* Sequence ids the KV cache must have for cfg: slots + cache_seqs. */
int sched_kv_seqs(const struct sched_config *cfg);

/* One generated token as the token callback sees it. */
struct sched_token {
    int32_t token;
    float prob;    /* probability after all sampling steps (1 when greedy) */
    /* With logprobs: log-softmax of the raw logits (temperature 1, before bias and
     * penalties), computed in double; else 0 and n_top 0. */
    float logprob;
    int n_top;     /* top_logprobs alternatives, most probable first (ties: lower id) */
    int32_t top_token[SCHED_MAX_TOP_LOGPROBS];
    float top_logprob[SCHED_MAX_TOP_LOGPROBS];
};

/* Counts of one sequence, as usage reports them. */
struct sched_usage {
    int64_t prompt_tokens;    /* of the request's prompt */
    int64_t cached_tokens;    /* prompt tokens not computed thanks to prefix reuse (first admission) */
    int64_t generated_tokens; /* tokens reported (eog not counted) */
    int64_t draft_tokens;     /* tokens drafted for it (draft model or prompt lookup) */
    int64_t accepted_draft_tokens; /* drafted tokens the target kept */
};

struct sched_request {
    uint64_t id;           /* the caller's, unique among live requests */
    const int32_t *prompt; /* n_prompt ids, copied by sched_submit */
    int64_t n_prompt;      /* 1..ctx-1 */
    int64_t max_tokens;    /* >= 1; generation also ends when the context is full */
    int n_seqs;            /* 1..SCHED_MAX_SEQS_PER_REQUEST (and <= slots) */
    struct sample_params sample; /* bias entries copied by sched_submit */
    bool ignore_eos;       /* end-of-generation tokens are reported like others */
    bool logprobs;
    int top_logprobs;      /* 0..SCHED_MAX_TOP_LOGPROBS, with logprobs */
    /* Speculation: tokens drafted per step, at most SCHED_MAX_DRAFT; -1: the default
     * (sched_set_draft's, or with prompt lookup sched_spec_options.lookup_tokens); 0:
     * none (also what a zeroed request gets). */
    int num_draft_tokens;
    /* > 0: draft by prompt lookup, matching n-grams of lookup_ngram down to 1 tokens
     * (at most SCHED_MAX_LOOKUP_NGRAM), instead of with the draft model; 0: off. */
    int lookup_ngram;
    /* Constrained decoding: each sequence's tokens follow this grammar (borrowed; must
     * outlive the request's done callbacks; NULL: none). Every sequence has its own
     * matcher; sampling bans what the grammar does not allow (sample_params.allow), and
     * near the end of max_tokens or the context only tokens after which the output can
     * still be completed (tok/grammar.h), so a finished sequence holds a complete output
     * whenever the budget allows one. A sequence whose output is complete finishes as
     * STOP. Drafts (model or prompt lookup) are verified under the mask of the state
     * the kept tokens lead to, so a rejected draft never reaches the matcher; a draft
     * model's drafts are drawn under the grammar too (a scratch matcher per sequence
     * follows them). With sched_config.asks their rows come back as logits and are
     * sampled here. */
    struct grammar_ctx *grammar;
};

/* index counts tokens of that sequence from 0. Return 0 to go on, 1 to finish the
 * sequence now (STOPPED; its slot is free before the next step). */
typedef int (*sched_token_fn)(void *ctx, uint64_t id, int seq, int64_t index,
                              const struct sched_token *t);
/* Once per sequence, last; error is NULL unless ERROR. */
typedef void (*sched_done_fn)(void *ctx, uint64_t id, int seq, enum sched_finish why,
                              const struct sched_usage *usage, const char *error);

/* Once per request, when it first gets its slots (prompt and cached prompt tokens
 * known); optional. */
typedef void (*sched_admitted_fn)(void *ctx, uint64_t id, const struct sched_usage *usage);

struct sched_callbacks {
    sched_token_fn token;
    sched_done_fn done;
    sched_admitted_fn admitted; /* NULL: not told */
    void *ctx;
};

struct sched_stats {
    int running;              /* sequences holding a slot (prefilling or decoding) */
    int queued;               /* queue items: requests waiting, and preempted sequences */
    int cached;               /* prefix cache entries */
    int64_t kv_blocks_used, kv_blocks_total;
    /* prompt_tokens_computed: tokens run through the model other than decode steps (prompt
     * chunks, and prompt + generated tokens recomputed after a preemption); cached_tokens:
     * positions reused from the prefix cache, re-admissions included. */
    int64_t steps, prompt_tokens_computed, cached_tokens, generated_tokens, preemptions;
    int64_t last_batch;       /* tokens in the last step's forward */
    int last_decoding, last_prompt; /* of them: sequences decoding (with their drafts), prompt tokens */
    /* The last step's forward in ns of the monotonic clock (with lanes > 1: the wait for its
     * results); the rest of a step is the scheduler's own work (admitting, building the
     * batch, sampling and reporting each token). */
    int64_t last_forward_ns;
    /* Speculation: tokens drafted and kept; draft_rejections: drafts the target rejected
     * (at most one per sequence and step; the drafts after it are not evaluated), so that
     * accepted / (accepted + rejections) estimates the acceptance rate alpha;
     * draft_forwards: draft engine_forward calls; draft_prefill_tokens: context tokens run
     * through the draft to catch up (a prompt, or everything after the draft was set);
     * draft_failures: draft forwards that failed (the step went on without those drafts). */
    int64_t draft_tokens, accepted_draft_tokens, draft_rejections, draft_forwards, draft_prefill_tokens,
        draft_failures;
};

/* Tuning of speculation for the whole scheduler. */
struct sched_spec_options {
    bool adaptive;     /* each sequence drafts the k (up to its request's) that its running
                          acceptance rate makes best, possibly none for a while */
    int max_decoding;  /* no drafting in a step where more sequences decode; 0: no limit */
    int lookup_tokens; /* k of prompt lookup requests asking for the default, 1..SCHED_MAX_DRAFT */
    float draft_cost;  /* adaptive: a draft token's cost relative to a target decode step;
                          < 0: the ratio of the two models' weight bytes */
    float verify_cost; /* adaptive: extra cost of each verified token beyond the first,
                          relative to a target decode step, >= 0 */
};

struct sched;

/* Creates a scheduler over engine e (a whole model: first and last slice; with
 * cfg->forward, or lanes > 1 with submit and collect, at least the first slice) and cache kv
 * (empty, with at least sched_kv_seqs(cfg) sequence ids); both borrowed, must outlive
 * it. CAIRN_EINVAL naming the bad field, CAIRN_ENOMEM. */
int sched_create(struct sched **out, struct engine *e, struct kv_cache *kv,
                 const struct sched_config *cfg, const struct sched_callbacks *cb, char *err,
                 size_t errlen);

/* Cancels everything still live (done callbacks with CANCELLED) and frees; accepts NULL.
 * Micro-batches still in flight are abandoned: their forwards' owner must drop them. */
void sched_release(struct sched *s);

/* Queues a request. CAIRN_EFULL when the queue is full, CAIRN_ERANGE when the prompt
 * does not fit the context (n_prompt >= ctx), CAIRN_EINVAL for other bad fields (a token
 * outside the vocabulary, n_seqs, sampling parameters: message names it), CAIRN_ESTATE
 * for an id already live. Nothing is reported for a refused request. */
int sched_submit(struct sched *s, const struct sched_request *r, char *err, size_t errlen);

/* Finishes every sequence of request id as CANCELLED (done callbacks run before this
 * returns) and frees its slots; no-op for an unknown id. */
void sched_cancel(struct sched *s, uint64_t id);

/* One step: admits what fits, runs one forward pass, samples, reports. Returns 1 when
 * it did work, 0 when there was nothing to do, or a negative code when the engine
 * failed (every live request then finished as ERROR with the message, err too).
 * With lanes > 1 a step does one of the two halves: it submits a micro-batch while fewer
 * than `lanes` are in flight and a sequence is free to run, else it collects the oldest
 * one (samples, reports). A failed submit or collect finishes every live request; the
 * micro-batches still in flight are collected by later steps, their results ignored. */
int sched_step(struct sched *s, char *err, size_t errlen);

/* True when nothing is running, queued or in flight. */
bool sched_idle(const struct sched *s);

void sched_get_stats(const struct sched *s, struct sched_stats *out);

/* Defaults: not adaptive, max_decoding 16, lookup_tokens 4, draft_cost -1, verify_cost 0.05. */
struct sched_spec_options sched_spec_defaults(void);

/* Replaces the options (CAIRN_EINVAL naming a field out of range). */
int sched_set_spec_options(struct sched *s, const struct sched_spec_options *o, char *err, size_t errlen);

/* Sets the draft model: an engine over a whole model with the target's vocabulary, its
 * KV cache with at least `slots` sequence ids (empty, unless it is the one set now),
 * both borrowed until the draft is replaced or dropped or the scheduler released, and
 * the default number of tokens drafted per step (1..SCHED_MAX_DRAFT). draft NULL drops
 * the draft (draft_kv and num_draft_tokens are then ignored). May be called between
 * steps while sequences run: the old draft's KV sequences are cleared; running
 * sequences prefill their context into the new draft's cache (in chunks, within the
 * step's chunk budget) and draft once it has caught up; nothing they generate changes.
 * The draft engine's max_batch must be >= slots and its max_ctx >= ctx. CAIRN_EINVAL
 * with a message; on error the previous draft stays. Allocates scratch for slots rows
 * of logits (CAIRN_ENOMEM). */
int sched_set_draft(struct sched *s, struct engine *draft, struct kv_cache *draft_kv, int num_draft_tokens,
                    char *err, size_t errlen);

/* Static name: "stop", "length", "stopped", "cancelled", "error"; NULL out of range. */
const char *sched_finish_name(int why);

#endif
