/* The runner side of a tensor-parallel instance (issue 22): every rank loads only its rows
 * of every matrix (model.h, struct model_tp; the norms whole) and computes its part of
 * every layer (engine.h, struct engine_tp: those rows, its KV heads), and the ranks complete each split vector over the data
 * plane's ring (runner/dataplane.h: the same connections, handshake, epochs, key and flow
 * control as a pipeline's; rank r's `next` goes to rank (r+1) % W, `prev` comes from
 * rank (r-1+W) % W).
 *
 * A step: rank 0 (which holds the scheduler and samples, as one node does) sends the KV
 * operations the scheduler made since the last step (CONTROL) and the batch (an
 * ACTIVATIONS frame whose one value per token is its id) around the ring; each rank
 * passes them on before it runs engine_forward itself, so all ranks compute at once. In
 * engine_forward, each exchange is a ring all-gather: a rank sends its part to next, then
 * W - 1 times takes a part from prev and passes it on (but the last), so every part goes
 * W - 1 hops; the logits only travel to rank 0 (rank r > 0 passes on the parts of ranks
 * 1..r-1, then sends its own). Parts travel as F32 ACTIVATIONS frames (exact), in chunks
 * of at most TENSOR_CHUNK_BYTES, each with a step number that names the exchange, the
 * part's rank and the chunk, checked on receipt. A rank waits for a part by reading the
 * socket itself for up to 2 ms (dp_recv_spin: the peer is computing the same product, and
 * waking a sleeping thread costs more than the frame), then blocks; waiting for the next
 * step, ranks > 0 read the socket themselves until 10 ms after their last step ended (in a
 * run of steps the batch comes once rank 0 has sampled), then block.
 *
 * KV mirror as pipelines have it (pipeline.h): every rank's cache holds the same
 * sequences in the same blocks (its KV heads only: engine_kv_config_tp), so every rank's
 * engine_forward makes the same kv_prepare calls and fails (or not) the same way.
 *
 * Errors: a link that ends or goes silent, a frame out of protocol or an op that cannot
 * be mirrored breaks the instance for good (every later call fails the same way; the
 * runner then fails and the node moves the instance to a new epoch). An engine error
 * before any exchange (a malformed batch, a full cache) is the same on every rank and
 * leaves it usable.
 *
 * Threads: tensor_forward (rank 0) and tensor_serve (ranks > 0) from the one thread that
 * owns the engine and the cache; the engine's gather runs inside them. tensor_alive and
 * tensor_get_stats from any thread. */
#ifndef CAIRN_RUNNER_TENSOR_H
#define CAIRN_RUNNER_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv.h"
#include "runner/dataplane.h"

#define TENSOR_CHUNK_BYTES ((size_t)4 << 20)
#define TENSOR_TIMEOUT_MS_DEFAULT 30000

struct tensor;

/* Rank `rank` of `world` (2..ENGINE_TP_MAX); timeout_ms bounds each wait for a part or
 * for send room (0: TENSOR_TIMEOUT_MS_DEFAULT). Made before the engine, which takes
 * tensor_engine_tp(t) in its config; its gathers fail until tensor_start. */
int tensor_create(struct tensor **out, int rank, int world, int timeout_ms, char *err, size_t errlen);
/* Stops observing the cache and frees; the connections, engine and cache stay the
 * caller's. Accepts NULL. */
void tensor_release(struct tensor *t);

/* What engine_config.tp must be for this rank. */
struct engine_tp tensor_engine_tp(struct tensor *t);

/* Links the rank: e (created with tensor_engine_tp), its cache, and the ring's
 * connections (peer ranks checked). Rank 0 observes kv (replacing any other observer).
 * Allocates the buffers for e's largest batch. CAIRN_EINVAL naming what is wrong,
 * CAIRN_ENOMEM. */
int tensor_start(struct tensor *t, struct engine *e, struct kv_cache *kv, struct dp_conn *next,
                 struct dp_conn *prev, char *err, size_t errlen);

/* Rank 0: sched_config.forward (t is the struct tensor *): sends the pending KV ops and
 * the batch around the ring, runs engine_forward with the other ranks, and leaves the
 * wanted tokens' logits in `logits` (n_vocab each, in batch order). engine_forward's
 * errors, CAIRN_EIO once broken, CAIRN_ESTATE on another rank or cache. */
int tensor_forward(void *t, struct kv_cache *kv, const struct batch *b, float *logits, char *err, size_t errlen);

/* Ranks > 0: waits up to timeout_ms (-1: no limit) for rank 0's next frame and handles
 * it (KV ops applied; a batch run through engine_forward with the other ranks). 1 when it
 * handled a frame, 0 on timeout, CAIRN_EIO when broken (err: which link and why),
 * CAIRN_ESTATE on rank 0. */
int tensor_serve(struct tensor *t, int timeout_ms, char *err, size_t errlen);

/* False, with why filled, once a link has ended or gone silent or the instance broke. */
bool tensor_alive(const struct tensor *t, char *why, size_t whylen);

/* Counters since start: steps (forwards run), exchanges (gathers) and the frames and
 * bytes (headers included) this rank sent on next, compute_us in engine_forward with the
 * exchanges inside it, xchg_us of that spent in the exchanges (sending, waiting, copying).
 * Where a rank's exchanges go: wait_us of xchg_us waiting for another rank's part (it is
 * behind: more work, a later start, its core taken), of which wait_first_us at each step's
 * first exchange (the other rank started the step later) and wait_logits_us at the
 * logits' gather (rank 0: the others' head rows); gap_us over gaps: between one step's
 * end and the next's start (rank 0: sampling and the scheduler; ranks > 0: waiting for
 * rank 0's next batch), only gaps under TENSOR_GAP_MAX_US (longer ones are idle). */
#define TENSOR_GAP_MAX_US 100000
struct tensor_stats {
    uint64_t steps, failures, tokens, exchanges, ctl_ops;
    uint64_t frames_sent, bytes_sent, bytes_received;
    int64_t compute_us, xchg_us;
    int64_t wait_us, wait_first_us, wait_logits_us;
    uint64_t gaps;
    int64_t gap_us;
    int64_t next_rtt_us, prev_rtt_us; /* last heartbeat round trips; -1 before one */
};
void tensor_get_stats(const struct tensor *t, struct tensor_stats *out);

/* One line (at most len bytes, NUL-terminated) of the steps since the previous call's
 * line, per step: "tensor rank R: N steps, per step ...". 0 when no step ran since (line
 * untouched). From the thread that runs the steps. */
int tensor_steps_line(struct tensor *t, char *line, size_t len);

#endif
