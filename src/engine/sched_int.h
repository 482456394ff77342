/* Private to the scheduler (sched.c: admission, batching, sampling; spec.c: speculative
 * decoding): its state and what the two files share. Included only from src/engine/. */
#ifndef CAIRN_ENGINE_SCHED_INT_H
#define CAIRN_ENGINE_SCHED_INT_H

#include "engine/sched.h"

#include <stdbool.h>
#include <stdint.h>

/* Adaptive k: the acceptance rate a sequence starts from (and drifts back to while it
 * does not draft). */
#define SPEC_ACC_PRIOR 0.75

struct queue_item;  /* sched.c */
struct cache_entry; /* sched.c */

enum seq_state { SEQ_QUEUED, SEQ_RUNNING, SEQ_DONE };

/* Where a sequence's draft tokens come from in a step. */
enum spec_mode { SPEC_NONE, SPEC_MODEL, SPEC_LOOKUP };

/* One sequence of a request. Its history holds the prompt then the generated tokens;
 * the KV cache holds the first n_kv of them while it runs. */
struct seq {
    struct request *req;
    int index;            /* within the request: it samples with seed + index */
    enum seq_state state;
    int slot;             /* while running: its slot, which is also its KV sequence id */
    int32_t *hist;        /* n_hist of cap tokens; owned (handed to the prefix cache at the end) */
    int64_t n_hist, cap;
    int64_t n_kv;
    int64_t generated;
    int64_t cached;       /* prompt tokens reused at its first admission */
    bool admitted;        /* admitted once: cached is final */
    struct grammar_match *gm; /* constrained decoding: where its output is; owned; NULL: none */
    struct grammar_match *dgm; /* where its drafts of this step lead (model drafts); owned */

    /* Speculation. The draft's KV cache (same sequence id as the slot) holds hist[0..d_kv). */
    int64_t d_kv;
    double acc;           /* running acceptance rate of its drafts (adaptive k) */
    int64_t drafted, accepted;
    /* This step: drafts go to hist[n_hist .. n_hist + k_eff) (scratch beyond the history:
     * k never exceeds what the sequence may still generate), plan_k of them fed to the
     * target; catch_up: context tokens fed to the draft without drafting. */
    enum spec_mode mode;
    int plan_k, k_eff, d_row;
    int64_t catch_up;
    /* Sampled model drafts: the distribution draft j was drawn from (q_n entries of the
     * arena from q_off; 0: one token with probability 1) and the drafted token's q. */
    int64_t q_off[SCHED_MAX_DRAFT];
    int q_n[SCHED_MAX_DRAFT];
    double q_tot[SCHED_MAX_DRAFT], q_x[SCHED_MAX_DRAFT];

    /* Micro-batches (sched_config.lanes): picked for the batch being built; while a batch
     * that holds it is in flight, that lane and its entry in the lane's fed[]. */
    bool pick;
    struct lane *flight;
    int fed_idx;
};

struct request {
    struct request *prev, *next; /* the list of live requests */
    uint64_t id;
    int64_t n_prompt, max_tokens;
    int n_seqs;
    int live;             /* sequences not finished */
    bool fork_pending;    /* sequence 0 prefills the prompt for all; the others wait in their slots */
    bool ignore_eos, logprobs;
    int top_logprobs;
    int num_draft, lookup_ngram;
    struct sample_params sample; /* .bias points to bias */
    struct logit_bias *bias;     /* owned copy */
    struct seq seqs[];
};

/* What one running sequence puts into the batch: n tokens from batch index at, of which
 * the last `drafts` are draft tokens (all n then want logits). */
struct fed {
    struct seq *seq; /* NULL once it finished while its batch was in flight */
    int n, drafts, at;
    bool logits;
};

/* One micro-batch: what a forward pass is built in and its results are read from. With
 * sched_config.lanes = 1 there is one, used by every step; with L > 1, up to L are in
 * flight at once (submitted, their results not yet collected), each over sequences no
 * other in-flight lane holds. Everything a step keeps from building its batch to reading
 * its logits lives here. */
struct lane {
    /* Batch buffers, allocated once: max_batch tokens, a row of logits per slot (a
     * sequence wants at most one row per step, more with drafts). */
    int32_t *b_token, *b_seq;
    int64_t *b_pos;
    uint8_t *b_logits;
    struct fed *fed; /* [slots] */
    int n_fed, n_tokens;
    float *logits;   /* [logit_rows][n_vocab]: slots rows, grown for draft tokens */
    int64_t logit_rows;
    /* sched_config.asks: what each wanted row of the batch asked for, and the answers
     * (logit_rows each). */
    struct sched_ask *asks;
    struct sched_token *answers;
    int n_asks;
    /* Arena of the draft distributions drawn for this batch (read when verifying). */
    int32_t *q_ids;
    float *q_probs;
    int64_t a_used, a_cap;
    int step_prompt, step_decoding; /* prompt tokens and decoding sequences in the batch */
    int64_t t0;                     /* when building it began (pacing) */
    bool in_flight;
};

struct sched {
    struct engine *e;
    struct kv_cache *kv;
    struct sched_config cfg;
    struct sched_callbacks cb;
    struct sampler *smp;
    int n_vocab, max_batch, chunk_tokens, block_tokens;
    bool paced;                 /* chunk_tokens was left to the scheduler */
    double pace_decode_ns;      /* running mean of a step without prompt tokens; 0: none yet */
    double pace_prompt_ns;      /* running mean of one prompt token's share of a step; 0: none yet */
    int64_t n_blocks;

    struct seq **slot_seq; /* [slots]: the running sequence of each slot, or NULL */
    int *order;            /* [slots]: slots of running sequences, oldest admission first */
    int n_running;

    struct queue_item *queue; /* ring of q_cap items */
    int q_head, q_count, q_cap;

    struct request *live;  /* list of requests not finished */

    struct cache_entry *cache; /* [cache_seqs] */
    int n_cached;
    uint64_t tick;

    /* Micro-batches: lane[n_lanes]; ln the one being built or read; flight[] the lanes
     * in flight, oldest first (results are collected in submission order). */
    struct lane *lane, *ln;
    int n_lanes;
    int flight[SCHED_MAX_LANES], n_flight;

    /* Speculation. */
    struct sched_spec_options opt;
    struct engine *draft;    /* NULL: none */
    struct kv_cache *dkv;
    int draft_k, d_max_batch, d_block_tokens;
    double draft_cost;       /* a draft token relative to a target decode step (weights) */
    int32_t *d_token, *d_seq; /* draft batch buffers [d_max_batch] */
    int64_t *d_pos;
    uint8_t *d_logits;
    float *d_out;            /* [slots][n_vocab] */
    int32_t *p_ids;          /* a target distribution [n_vocab] */
    float *p_probs, *r_w;    /* its probabilities, residual weights [n_vocab] */
    float *q_dense;          /* [n_vocab] zeros between uses */

    struct sched_stats stats;
};

/* ---- shared helpers ---- */

/* KV blocks of bt positions that hold `positions` positions. */
static inline int64_t sched_blocks_for(int64_t positions, int bt) { return (positions + bt - 1) / bt; }

/* The smaller of a and b. */
static inline int64_t sched_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A running sequence that feeds one token: a decode step (or a one-token prompt). */
static inline bool sched_feeds_one(const struct seq *q) { return q->n_hist - q->n_kv == 1; }

/* ---- sched.c ---- */

/* q's sampling parameters: the request's, its seed plus q's index. */
struct sample_params sched_seq_params(const struct seq *q);

/* Reports tok as q's next token (row: the target's logits that chose it, for logprobs;
 * or ans, the forward's answer with them). Returns false when q finished (its request
 * may be freed). */
bool sched_report_token(struct sched *s, struct seq *q, int32_t tok, float prob, const float *row,
                        const struct sched_token *ans);

/* Constrained decoding: sets p->allow to the tokens q's grammar allows next (within
 * what q may still generate); no-op without a grammar. 0 or the matcher's error. */
int sched_grammar_allow(struct sched *s, struct seq *q, struct sample_params *p);
/* As sched_grammar_allow for matcher m, j tokens past what q generated. */
int sched_grammar_allow_at(struct sched *s, struct seq *q, struct grammar_match *m, int64_t j,
                           struct sample_params *p);

/* Finishes q with the error of a failed sampling (rc). */
void sched_finish_sampling_error(struct sched *s, struct seq *q, int rc);

/* The forward's answer for the wanted row `ans + j` of the lane being read, or NULL
 * when the row came back as logits. */
const struct sched_token *sched_answer_at(const struct sched *s, const struct sched_token *ans, int j);

/* ---- spec.c ---- */

/* Decides, before the batch is built, which picked decoding sequences draft this step
 * and how many tokens (prompt lookup drafts them here), and which feed their context to
 * the draft to catch up. Never fails: a sequence it cannot serve does not draft. */
void spec_plan(struct sched *s);

/* q gives up drafting this step; the draft context it would have fed still goes to the
 * draft (its room is reserved). */
void spec_drop_plan(struct seq *q);

/* Runs the draft model for the batch in s->ln and writes its drafts into the batch; a
 * sequence whose drafting stopped early keeps placeholder tokens, whose rows are not read. */
void spec_run_drafts(struct sched *s);

/* q fed its last token and k_eff drafts: reports the drafts the target keeps, then the
 * target's own next token, one by one; rolls back the rejected positions in both
 * caches. May finish q (and free its request). */
void spec_verify_and_report(struct sched *s, struct seq *q, const float *rows, const struct sched_token *ans);

#endif
