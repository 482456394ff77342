/* The runner side of a pipeline-parallel instance (issue 7): one model split by layer
 * ranges over ranks 0..W-1, each a separate process with its own slice, KV cache and
 * data-plane links (runner/dataplane.h).
 *
 * Topology: a ring. Rank r holds `next`, its connection to rank (r+1) % W, and `prev`,
 * the one from rank (r-1+W) % W (for W = 2 two connections between the same pair).
 * Activations flow 0 -> 1 -> ... -> W-1; the last rank sends a RESULT over its `next` to
 * rank 0, which receives it on `prev`: the logits rows of the wanted tokens (F32, in
 * batch order), or, when rank 0 sent asks with the step (pipeline_asks, the
 * scheduler's sched_config.asks), what each ask needs: a token sampled on the last rank
 * with the request's parameters (sched_sample_row: the same tokens, log-probabilities
 * included, as rank 0 would draw from the row), the row, or nothing. A sampled token
 * costs 16 bytes (plus 8 per top log-probability) instead of 4 * n_vocab.
 *
 * Rank 0 holds the scheduler (engine/sched.h) and sets pipeline_submit and
 * pipeline_collect as its target forward's halves (or pipeline_forward, both at once): a
 * step runs rank 0's slice, sends the KV operations the scheduler made since the last
 * step (CONTROL), then the activations; its RESULT is collected later. Up to world_size
 * steps are in flight, one micro-batch per stage, so every rank can compute at once;
 * RESULTs come back in the order the steps were sent (each rank handles its frames in
 * order), and the data plane's in-flight limit (world_size) keeps the ring from ever
 * holding more.
 *
 * KV mirror: every rank's cache must hold the same sequences in the same blocks as rank
 * 0's (so all caches are created with the same block_tokens, n_blocks and max_seqs,
 * e.g. engine_kv_config with the same arguments, and start empty). Rank 0 observes its cache (kv_set_observer) and replays, on every other rank and
 * in order with the activations, each kv_prepare / kv_truncate / kv_seq_clear / kv_fork
 * the scheduler made (as DP_CTL_PREPARE / TRUNCATE / CLEAR / FORK). The kv_prepare calls
 * engine_forward makes itself are not sent: each rank's engine_forward makes the same
 * ones from the same batch. When rank 0's forward fails part-way, the prepares it made
 * are sent with the next step; when another rank's fails, that rank and the ranks after
 * it (from the error RESULT's entries) make the prepares their engine_forward did not
 * (rank 0's succeeded), so the mirror stays exact and the pipeline usable. Rank 0's slice runs before anything is sent, so a step that fails
 * locally sends nothing.
 *
 * Errors: an engine error on rank r > 0 becomes a RESULT with status < 0, the message
 * ("rank r: ...") and, as its entries, every token's (seq, pos) (kind TOKENS, token 0),
 * passed along the ring to rank 0; pipeline_forward then fails with CAIRN_EIO and the
 * message. A link that ends (dp_error), a send that cannot proceed, a
 * frame out of protocol or a KV operation that cannot be mirrored breaks the pipeline
 * for good (every later call fails the same way, pipeline_alive is false); a step whose
 * RESULT does not come within timeout_ms fails alone (its late RESULT is dropped).
 *
 * Threads: pipeline_submit/collect/forward (rank 0) and pipeline_serve (ranks > 0) are called from one
 * thread, the one that owns the kv and the engine; pipeline_alive and
 * pipeline_get_stats from any thread. The connections stay the caller's: pipeline_
 * release does not close them, and only this module may dp_recv on `prev` while the
 * pipeline exists. */
#ifndef CAIRN_RUNNER_PIPELINE_H
#define CAIRN_RUNNER_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runner/dataplane.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sched.h"

#define PIPELINE_TIMEOUT_MS_DEFAULT 30000

struct pipeline_config {
    int rank, world_size;        /* 0 <= rank < world_size, world_size >= 2 */
    struct engine *e;            /* this rank's slice (borrowed) */
    struct kv_cache *kv;         /* this rank's cache (borrowed); rank 0: the sched's cache */
    struct dp_conn *next, *prev; /* borrowed, already connected (ring, see above) */
    int wire_dtype;              /* activations on the wire: 0/DT_F32 (default), DT_F16, DT_BF16, DT_Q8_0 */
    int timeout_ms;              /* rank 0: longest wait for a step's result before failing it;
                                    every rank: longest wait for send room (0: 30000) */
};

struct pipeline;

/* Checks the config (ranks, slices: rank 0 holds the first layers and not the last, the
 * last rank the last layers; the cache matches the slice; each link's peer has the
 * expected rank; a Q8_0 wire needs n_embd a multiple of 32), allocates the buffers for
 * the engine's max_batch and sets the kv observer (replacing any other).
 * CAIRN_EINVAL naming the field, CAIRN_ENOMEM. The caller releases with pipeline_release. */
int pipeline_create(struct pipeline **out, const struct pipeline_config *cfg, char *err, size_t errlen);
/* Removes the kv observer and frees; the connections, engine and cache stay the
 * caller's. Accepts NULL. */
void pipeline_release(struct pipeline *p);

/* Rank 0: sched_config.submit (p is the struct pipeline *). Runs the local slice, sends
 * the pending KV ops (CONTROL) then the activations to rank 1, and returns; b is not
 * used after. A local engine error: its code and message, nothing sent; a send that
 * fails breaks the pipeline (CAIRN_EIO); CAIRN_ESTATE when called on a rank other than
 * 0, with another cache, or with world_size steps in flight. */
int pipeline_submit(void *p, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen);

/* Rank 0: sched_config.collect. Waits for the RESULT of the oldest step in flight from
 * the last rank on prev and copies its logits rows (one per wanted token, in batch
 * order) to `logits`; with asks, only the rows of LOGITS asks, and the SAMPLE asks'
 * answers to the answer array pipeline_asks was given (a RESULT whose rows do not
 * match the asks breaks the pipeline). A link that ends, a RESULT with status < 0, a timeout: CAIRN_EIO
 * with the reason (naming the rank and peer); the step is no longer in flight either
 * way. CAIRN_ESTATE when nothing is in flight. */
int pipeline_collect(void *p, float *logits, char *err, size_t errlen);

/* Rank 0: sched_config.asks. Stages the asks (copied) for the next pipeline_submit or
 * pipeline_forward, which sends them with its activations (they must then be as many
 * as its wanted tokens, else that submit fails with CAIRN_ESTATE); its collect fills
 * answer (valid until then) for the SAMPLE asks and the logits rows of the LOGITS ones.
 * CAIRN_EINVAL for an ask the wire cannot carry (n over max_batch, a need, n_top,
 * window or bias list out of range: dataplane.h, struct dp_ask), CAIRN_ENOMEM,
 * CAIRN_ESTATE on a rank other than 0. */
int pipeline_asks(void *p, const struct sched_ask *ask, int n, struct sched_token *answer, char *err,
                  size_t errlen);

/* Rank 0: sched_config.forward, submit then collect (CAIRN_ESTATE while steps are in
 * flight). */
int pipeline_forward(void *p, struct kv_cache *kv, const struct batch *b, float *logits, char *err, size_t errlen);

/* Ranks > 0: waits up to timeout_ms (-1: no limit) for the next frame from prev and
 * handles it: CONTROL -> the ops applied to this rank's cache and sent on to next (not
 * the last rank); ACTIVATIONS -> engine_forward on this slice, then the activations to
 * next, or (last rank) a LOGITS RESULT to rank 0; RESULT (an error from an earlier rank)
 * -> sent on to next. An engine error is sent on as a RESULT with status < 0 and
 * "rank r: <message>" (see Errors above). Returns 1 when it handled a frame, 0 on timeout, CAIRN_EIO when a
 * link ended or the pipeline broke (err: which link and why), CAIRN_ESTATE on rank 0. */
int pipeline_serve(struct pipeline *p, int timeout_ms, char *err, size_t errlen);

/* Rank 0: KV ops recorded since the last step was sent (they go with the next one); its
 * thread only. While none are and no step is in flight, every rank's cache equals rank
 * 0's. */
int pipeline_queued_ops(const struct pipeline *p);

/* False, with why filled, once either link has ended or gone silent, the pipeline broke
 * or (ranks > 0) this rank's cache stopped mirroring rank 0's (see above). */
bool pipeline_alive(const struct pipeline *p, char *why, size_t whylen);

/* Counters since create. Rank 0: a step is one submitted batch; compute_us its own
 * slice; send_us in dp_send_* (queue room, encoding); wait_us time spent in
 * pipeline_collect waiting for RESULTs: with one step in flight the other ranks' compute
 * plus every hop on the wire (the wire's share: wait_us minus the other ranks'
 * compute_us), with several the part of it rank 0 could not fill with other batches. Ranks > 0: a step is one
 * ACTIVATIONS frame handled; wait_us is idle time in pipeline_serve waiting for a frame
 * (stage idle time). */
struct pipeline_stats {
    uint64_t steps;         /* steps handled (failed ones included) */
    uint64_t failures;      /* steps that ended with an error */
    uint64_t tokens;        /* tokens through this slice */
    uint64_t ctl_ops;       /* KV ops sent (rank 0) or applied (others) */
    int64_t compute_us;     /* engine_forward on this slice */
    int64_t wait_us;
    int64_t wait_max_us;    /* longest single wait of rank 0 for a RESULT */
    int64_t send_us;
    int64_t ctl_us;         /* ranks > 0: applying KV ops */
    int64_t next_rtt_us, prev_rtt_us; /* last heartbeat round trip of each link; -1 before one */
    uint64_t bytes_sent, bytes_received; /* both links, on the wire */
    uint64_t sealed_bytes_sent;          /* of bytes_sent, encrypted (a sealed cluster's links) */
    /* Wanted rows, by what came back for them (rank 0) or what this rank did with them
     * (last rank): a token sampled on the last rank, a row of logits, nothing (a skipped
     * row); result_bytes: rank 0, the RESULT frames of its steps on the wire, headers
     * included (per wanted row: result_bytes / (rows_sampled + rows_logits + rows_skipped)). */
    uint64_t rows_sampled, rows_logits, rows_skipped;
    uint64_t result_bytes;
};
void pipeline_get_stats(const struct pipeline *p, struct pipeline_stats *out);

/* The KV mirror's two halves, shared with tensor parallelism (runner/tensor.h): the wire
 * op of a cache operation rank 0 observed (false for one the wire cannot carry), and the
 * application of a received op to another rank's cache (0, or a negative code with why). */
bool pipeline_ctl_from_op(const struct kv_op *op, struct dp_ctl *out);
int pipeline_apply_ctl(struct kv_cache *kv, const struct dp_ctl *o, char *err, size_t errlen);

#endif
