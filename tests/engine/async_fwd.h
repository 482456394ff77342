/* A forward in two halves (sched_config.submit / collect), as a pipeline's rank 0 sees
 * it, over one engine holding a whole model, for testing micro-batches in flight.
 * Immediate: submit runs the forward at once (as rank 0 runs its slice before sending)
 * and collect hands the logits out later. Deferred: submit copies the batch and collect
 * runs it, so that a batch reads the KV cache after later batches were built and
 * submitted: a sequence in two batches in flight, or touched while in flight, shows in
 * its tokens. Both check that no sequence is in two batches in flight (misuse).
 * async_asks (sched_config.asks) answers the SAMPLE asks at collect with
 * sched_sample_row, as a pipeline's last rank would, and fills the rows of SAMPLE and
 * SKIP asks with NaN: a scheduler that read them would show it in its tokens. */
#ifndef CAIRN_TEST_ASYNC_FWD_H
#define CAIRN_TEST_ASYNC_FWD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sched.h"

#define ASYNC_FWD_MAX_BATCH 256

struct async_flight {
    int n, n_want;
    int32_t tok[ASYNC_FWD_MAX_BATCH], seq[ASYNC_FWD_MAX_BATCH];
    int64_t pos[ASYNC_FWD_MAX_BATCH];
    uint8_t want[ASYNC_FWD_MAX_BATCH];
    float *logits; /* n_want rows */
    int rc;
    char err[256];
    /* async_asks: the batch's asks (windows and bias lists copied), where the answers go */
    bool asked;
    int n_asks;
    struct sched_ask ask[ASYNC_FWD_MAX_BATCH];
    int32_t *windows;
    struct logit_bias *bias;
    struct sched_token *answer;
};

struct async_fwd {
    struct engine *e;
    struct kv_cache *kv;     /* the scheduler's (set after the rig is open) */
    bool deferred;
    int fail_collect;        /* this collect (1-based) fails; 0: none */
    struct async_flight slot[SCHED_MAX_LANES];
    int head, count;
    int submits, collects, max_in_flight, max_seqs, misuse;
    bool staged;             /* async_asks filled the next slot */
    struct sampler *smp;     /* async_asks' */
    int asks_calls, sampled, skipped; /* asks made, rows answered with a token, rows skipped */
};

void async_fwd_init(struct async_fwd *a, struct engine *e, bool deferred);
void async_fwd_free(struct async_fwd *a);
int async_submit(void *ctx, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen);
int async_collect(void *ctx, float *logits, char *err, size_t errlen);
int async_asks(void *ctx, const struct sched_ask *ask, int n, struct sched_token *answer, char *err, size_t errlen);

#endif
