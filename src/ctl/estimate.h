/* How fast a placement candidate would decode one stream: an estimate from what the
 * state measured (each node's memory read bandwidth, each link's round trip and
 * throughput) and what the model card says (the bytes each rank reads per token, the
 * vectors the ranks exchange). For the previews, so a person (and the dashboard) can
 * compare a pipeline with tensor parallelism on the links they have.
 *
 * Decode reads every weight a token uses once per step, so a rank's compute time is the
 * bytes it reads over its node's bandwidth. Then:
 *  - pipeline over W ranks: the ranks run one after another, and each of the W hops of
 *    the ring (the last carries the sampled token back to rank 0) costs half a round trip
 *    plus its bytes (n_embd floats) over the link's throughput;
 *  - tensor over W ranks (engine.h's engine_tp): the ranks run at once, each reading 1/W
 *    of every layer and of the head, and wait for 4 ring all-gathers per layer (attention
 *    output, wo's output, the feed-forward activation, w_down's output) and the logits'
 *    gather to rank 0; an all-gather is W - 1 hops, each half a round trip plus a part
 *    (1/W of the vector) over the throughput.
 * Ranks on one node (W = 1) exchange nothing. A mixture of experts reads its active
 * bytes (card.active_bytes) spread over its layers.
 *
 * Unknown (known = false, with why) when a node has not reported its bandwidth or a
 * link used has no round trip or throughput yet. */
#ifndef CAIRN_CTL_ESTIMATE_H
#define CAIRN_CTL_ESTIMATE_H

#include <stdbool.h>

#include "ctl/card.h"
#include "ctl/place.h"
#include "ctl/state.h"

#define ESTIMATE_TP_GATHERS_PER_LAYER 4

struct estimate {
    bool known;
    char why[96];           /* when not known */
    double tokens_per_s;    /* one stream's decode */
    double compute_ms;      /* per token: reading weights (the slowest rank's, for tensor) */
    double link_ms;         /* per token: the exchanges */
    double bytes_per_token; /* sent over links per token, all ranks together */
    int exchanges;          /* per token: hops (pipeline) or gathers (tensor) */
};

/* The estimate of candidate cd of a placement of card's model with sharding sh, from the
 * nodes and edges of s. */
void estimate_candidate(const struct catalog_card *card, const struct cluster_state *s,
                        enum place_sharding sh, const struct place_candidate *cd, struct estimate *out);

/* JSON {"tokens_per_s", "compute_ms", "link_ms", "link_bytes_per_token", "exchanges"} or
 * {"unknown": why}; NULL when out of memory. */
json_t *estimate_to_json(const struct estimate *e);

#endif
