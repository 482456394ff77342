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
 * request gives the same tokens alone or in any batch. */
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
};

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64. */
struct sample_params sample_defaults(void);

struct sampler;

/* A sampler owns scratch for a vocabulary of n_vocab; one per thread that samples. */
int sample_create(struct sampler **out, int n_vocab);
void sample_release(struct sampler *s); /* accepts NULL */

/* Chooses the next token for position pos from logits[n_vocab] (not modified).
 * history: the sequence's tokens so far (n_history of them). Returns the token id, or a
 * negative error for invalid params (e.g. a bias token out of range). When prob is not
 * NULL it receives the chosen token's probability after all steps. */
int32_t sample_token(struct sampler *s, const struct sample_params *p, const float *logits,
                     const int32_t *history, int64_t n_history, int64_t pos, float *prob);

#endif
