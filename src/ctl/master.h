/* The master's decisions, as functions of the state: a command becomes events (or a
 * refusal with a reason), a worker's report becomes events, and placement previews are
 * computed from the state's nodes and a model card. Nothing here touches the network,
 * the log or the clock: the node (node.h) numbers, logs, applies and broadcasts what
 * these functions return, so tests drive them with plain states.
 *
 * Model cards (catalog.h) say what placement needs to know of a model; the node looks
 * a model id up in its catalog of --models-dir through a master_card_fn.
 *
 * Memory a node can give: its reported memory_available (a node reports at most its
 * --memory-limit) minus what the instances already placed on it hold: their layers,
 * KV cache (a runner's pool for the instance's context, runner_kv_pool_positions, of
 * its K and V types), embeddings on rank 0 (with the draft model and its F16 KV), norm
 * and head on the last rank. Instances whose model has no card count as holding nothing.
 *
 * The context of a new instance: the one asked for (at most the model's trained
 * context), or else the largest that fits, trying the trained context and halving it
 * down to min(trained, MASTER_CTX_LEN). */
#ifndef CAIRN_CTL_MASTER_H
#define CAIRN_CTL_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/card.h"
#include "ctl/command.h"
#include "ctl/event.h"
#include "ctl/place.h"
#include "proto/runner_proto.h"
#include "ctl/state.h"

#define MASTER_CTX_LEN 4096 /* the least context placement falls back to (capped by the model's);
                              also an instance's that does not say its own */
#define MASTER_EDGE_RTT_SLACK_US 1000 /* reported rtt changes below max(this, 50%) make no event */
#define MASTER_EDGE_THROUGHPUT_SLACK_PCT 25 /* throughput changes within this % of the larger make
                                              no event (and a node reports none) */

/* Looks up the usable card of model_id into *out (zeroed first; the caller clears it
 * with catalog_card_clear, also on failure). 0, CAIRN_ENOTFOUND when the model is
 * unknown, or another error with a message (a file that cannot be used). Called from
 * the node thread and from HTTP threads at once. */
typedef int (*master_card_fn)(void *ctx, const char *model_id, struct catalog_card *out,
                              char *err, size_t errlen);

/* Writes a fresh id into dst (IDS_ID_MAX + 1 bytes); 0 or a CAIRN_E* code. */
typedef int (*master_id_fn)(void *ctx, char *dst, char *err, size_t errlen);

/* Whether draft_id may serve model_id in speculative decoding (vocab.h): 0, or a code
 * with the reason. */
typedef int (*master_draft_fn)(void *ctx, const char *model_id, const char *draft_id, char *err,
                               size_t errlen);

struct master_env {
    master_card_fn card; /* required */
    void *card_ctx;
    master_draft_fn draft_check; /* NULL: drafts are not checked; ctx: card_ctx */
    master_id_fn new_id; /* NULL: ids_random */
    void *id_ctx;
};

/* Events without a position yet (term and index 0): the node numbers them. */
struct master_events {
    struct event *ev; /* n entries, malloc'd */
    size_t n, cap;
};

/* Context positions of an instance that says none: min(trained, MASTER_CTX_LEN). */
uint32_t master_card_ctx(const struct catalog_card *c);

/* Bytes of K and V of one token in one layer of card's model, with kv's types; 0 when a
 * type does not divide the model's heads (q8_0 and q4_0 need multiples of 32). */
uint64_t master_kv_token_layer_bytes(const struct catalog_card *card, const struct cluster_kv *kv);

/* Positions of a pool of `pool` that one sliding-window layer of card's model keeps
 * resident on a runner (runner_kv_window_positions with RUNNER_DEFAULT_SLOTS slots, pages
 * of MASTER_PAGE_BYTES); pool for a model without sliding-window layers or a cache type
 * whose blocks cannot be released. */
uint64_t master_window_positions(const struct catalog_card *card, const struct cluster_kv *kv, uint64_t pool);

/* Frees the events and zeroes *out; accepts a zeroed one. */
void master_events_clear(struct master_events *out);

/* Placement of model_id over s's nodes (see the top) into *res, released by the caller
 * with place_result_free even on failure, for the KV cache kv (NULL: f16 and the
 * context chosen as at the top); *ctx_len (may be NULL) gets the context counted.
 * draft_model may be NULL or "". 0 (whether or not a candidate was accepted),
 * CAIRN_ENOTFOUND when a model has no card (message names it), CAIRN_EINVAL for a bad
 * min_nodes, a context beyond the model's or a type its KV rows cannot hold, CAIRN_ENOMEM. */
int master_previews(const struct cluster_state *s, const struct master_env *env,
                    const char *model_id, enum cluster_sharding sharding, int min_nodes,
                    const char *draft_model, const struct cluster_kv *kv, int64_t *ctx_len,
                    struct place_result *res, char *err, size_t errlen);

/* Adds to each candidate of previews (place_result_to_json of res, candidates in the
 * same order) its "estimate" of one stream's decode speed (ctl/estimate.h), from the
 * nodes' bandwidth and the links' figures in s. 0, CAIRN_ENOTFOUND without a card
 * (message in err), CAIRN_ENOMEM. */
int master_preview_estimates(const struct cluster_state *s, const struct master_env *env, const char *model_id,
                             const struct place_result *res, json_t *previews, char *err, size_t errlen);

/* Bytes the shard i of instance in holds on its node, given the cards of its model and
 * of its draft (NULL when none or unknown). */
uint64_t master_shard_bytes(const struct catalog_card *card, const struct catalog_card *draft,
                            const struct cluster_instance *in, size_t i);

/* Turns command c into events appended to *out and fills *res (command_id copied, code,
 * message, instance_id; the position is the node's to fill). Returns res->code: 0, or
 * the refusal (ENOTFOUND unknown instance or model, EFORMAT naming the field, ESTATE
 * for an instance id already in use, EFULL when no placement fits, EUNSUPPORTED for a
 * placement that cannot run yet) with nothing appended. CAIRN_ENOMEM too. */
int master_command(const struct cluster_state *s, const struct master_env *env,
                   const struct command *c, struct master_events *out,
                   struct command_result *res);

/* Turns a worker's report into events appended to *out. from is the node that sent it
 * (authenticated by the link); report is
 *   {"node_id": from, "info": node info (state.h)|null,
 *    "runners": [runner]|null (every runner of that node: missing ones are deleted),
 *    "edges": [{"to", "rtt_us", "throughput_bytes_per_s"}]|null (every link from it),
 *    "downloads": [download]|null (its model downloads, NodeDownloadProgress where they
 *    differ from s; optional)}
 * Info becomes NodeGatheredInfo stamped now_ms, runners and edges give events, only
 * where they differ from s (edges: rtt beyond MASTER_EDGE_RTT_SLACK_US, throughput
 * beyond MASTER_EDGE_THROUGHPUT_SLACK_PCT), so an idle cluster's reports add nothing to the log. A
 * runner of a pipelined instance that the state has Ready or Running at the instance's
 * epoch and that now reports Failed, or a higher restart_count, at that epoch also makes
 * InstanceEpochAdvanced to the next epoch (once per instance and report): its KV is
 * lost, so every rank starts again (plan.h). CAIRN_EFORMAT naming the field (nothing
 * appended), CAIRN_ENOMEM. */
int master_report_events(const struct cluster_state *s, const char *from, const json_t *report,
                         int64_t now_ms, struct master_events *out, char *err, size_t errlen);

#endif
