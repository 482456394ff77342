/* Token sampler. Steps, in this fixed order:
 *   1. logit bias (added);
 *   2. penalties over the last `penalty_last_n` tokens of the sequence's history
 *      (prompt and generated): repetition (logit/r if > 0, logit*r if <= 0, once per
 *      distinct token), then frequency (- f * count) and presence (- p if count > 0);
 *   3. temperature <= 0: greedy (argmax, lowest id on ties) and stop here;
 *   4. top-k (k <= 0: off), sorted by logit descending, ties by lower id;
 *   5. softmax with temperature (logit / T, in double);
 *   6. top-p (smallest prefix with cumulative probability >= p; 1.0: off);
 *   7. min-p (keep probability >= min_p * max probability; 0: off);
 *   8. renormalize and draw with u = uniform [0,1) from hash(seed, pos).
 * The draw depends only on (seed, position, logits, params, history), so the same
 * request gives the same tokens alone or in any batch.
 *
 * Details: NaN logits (after steps 1-2) count as banned (-inf), +inf as FLT_MAX. Tokens
 * whose probability relative to the top token is below e^-(20 + ln n_vocab) count as
 * probability 0 (together they weigh < 2e-9, below what a float top_p resolves). Top-p
 * uses the probabilities of step 5 over all candidates of step 4; min-p's bar is
 * relative to the top token, so top-p and min-p each keep a prefix of the ranking and
 * the result is the shorter prefix. The draw walks the kept tokens in ranking order and
 * picks the first whose cumulative probability reaches u. Nothing is fully sorted:
 * greedy is one pass for the max; top-k keeps a heap of k (one comparison per token in
 * the common case); softmax evaluates exp() only for the candidates of step 4, and
 * without top-p only for those above the min-p bar; top-p and the draw are weighted
 * quickselects, over a histogram of logit buckets when there are many candidates. The
 * exp() pass dominates when top-k is off (5-7 ns per token within reach of the top:
 * 0.7-1.1 ms for 152k tokens on a shared 2-core VM); with top-k 40, about 0.1 ms. */
#ifndef CAIRN_ENGINE_SAMPLE_H
#define CAIRN_ENGINE_SAMPLE_H

#include <stdint.h>

struct logit_bias {
    int32_t token;
    float bias;
};

struct sample_params {
    float temperature;       /* <= 0: greedy */
    int top_k;               /* <= 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    int penalty_last_n;      /* window of history for penalties (0: off, -1: all) */
    uint64_t seed;
    const struct logit_bias *bias;
    int n_bias;
    /* Constrained decoding: bit i of allow[i / 32] set when token i may be chosen; the
     * others are banned (-inf) before step 1. NULL: every token. */
    const uint32_t *allow;
};

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64,
 * seed 0, no bias. */
struct sample_params sample_defaults(void);

struct sampler;

/* A sampler owns scratch for a vocabulary of n_vocab (about 24 bytes per token); one per
 * thread that samples. CAIRN_EINVAL for n_vocab <= 0, CAIRN_ENOMEM. */
int sample_create(struct sampler **out, int n_vocab);
void sample_release(struct sampler *s); /* accepts NULL */

/* Chooses the next token for position pos from logits[n_vocab] (not modified).
 * history: the sequence's tokens so far (n_history of them). Returns the token id, or a
 * negative error for invalid params (e.g. a bias token out of range). When prob is not
 * NULL it receives the chosen token's probability after all steps (1 when greedy).
 * Allocates nothing. Errors: CAIRN_EINVAL for NULL s/p/logits, pos < 0, n_history < 0,
 * temperature NaN, top_p outside (0,1], min_p outside [0,1], repeat_penalty not finite
 * and > 0, presence/frequency penalty not finite, penalty_last_n < -1, a bias token out
 * of range or a NaN bias, a history token in the penalty window out of range (or history
 * NULL with a window); CAIRN_ERANGE when every token is banned (-inf or NaN). */
int32_t sample_token(struct sampler *s, const struct sample_params *p, const float *logits,
                     const int32_t *history, int64_t n_history, int64_t pos, float *prob);

/* The distribution sample_token draws from: the tokens kept after step 7 with their
 * probabilities after renormalization (step 8), in no particular order; ids and probs
 * must hold n_vocab entries. Greedy gives its one token with probability 1. Returns the
 * number of tokens kept (>= 1), or the errors of sample_token (pos is not needed: the
 * distribution does not depend on it). Allocates nothing; the probabilities are those
 * sample_token reports, up to the order of rounding. */
int sample_dist(struct sampler *s, const struct sample_params *p, const float *logits,
                const int32_t *history, int64_t n_history, int32_t *ids, float *probs);

/* Index of the entry of probs[0..n) (weights, not necessarily normalized) that u in
 * [0,1) selects: the first whose cumulative weight exceeds u times the total, in the
 * given order; each entry is chosen with probability weight / total when u is uniform.
 * CAIRN_EINVAL for n <= 0. */
int32_t sample_pick(const float *probs, int n, double u);

/* The u of step 8: the (pos+1)-th output of a splitmix64 generator started at seed, that
 * is mix64(seed + (pos + 1) * 0x9e3779b97f4a7c15) with splitmix64's finalizer, top 53
 * bits scaled to [0,1). */
double sample_uniform(uint64_t seed, int64_t pos);

#endif
