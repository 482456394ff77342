#include "ctl/estimate.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FLOAT_BYTES 4.0
#define TOKEN_BYTES 16.0 /* a sampled token's result on the ring's last hop */

static void unknown(struct estimate *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void unknown(struct estimate *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->why, sizeof out->why, fmt, ap);
    va_end(ap);
    out->known = false;
}

/* Bytes/s the node reads memory at, 0 when it has not said. */
static double node_bandwidth(const struct cluster_state *s, const char *id)
{
    const struct cluster_node *n = cluster_state_find_node(s, id);
    return n && n->info.memory_bandwidth > 0 ? (double)n->info.memory_bandwidth : 0;
}

/* Seconds one hop from a to b takes with `bytes`: half the round trip plus the bytes over
 * the throughput (either direction's edge); < 0 when the link has no figures yet. */
static double hop_seconds(const struct cluster_state *s, const char *a, const char *b, double bytes)
{
    const struct cluster_edge *e = cluster_state_find_edge(s, a, b);
    if (!e || e->rtt_us <= 0 || e->throughput <= 0)
        e = cluster_state_find_edge(s, b, a);
    if (!e || e->rtt_us <= 0 || e->throughput <= 0)
        return -1;
    return (double)e->rtt_us / 2e6 + bytes / (double)e->throughput;
}

/* Bytes read per token by layer l: a mixture of experts reads its active bytes, the
 * experts it skips taken from every layer alike. */
static double layer_read(const struct catalog_card *c, int l, double skipped_share)
{
    return (double)c->layer_bytes[l] * (1.0 - skipped_share);
}

static double skipped_share(const struct catalog_card *c)
{
    double layers = 0;
    for (int l = 0; l < c->n_layers; l++)
        layers += (double)c->layer_bytes[l];
    double skipped = c->weight_bytes > c->active_bytes && c->active_bytes > 0
                         ? (double)(c->weight_bytes - c->active_bytes)
                         : 0;
    return layers > 0 && skipped < layers ? skipped / layers : 0;
}

static void estimate_pipeline(const struct catalog_card *c, const struct cluster_state *s,
                              const struct place_candidate *cd, struct estimate *out)
{
    double skip = skipped_share(c), compute = 0, link = 0, sent = 0;
    uint32_t W = cd->n_nodes;
    for (uint32_t r = 0; r < W; r++) {
        const struct place_share *sh = &cd->shares[r];
        double bw = node_bandwidth(s, sh->id);
        if (bw <= 0)
            return unknown(out, "node %s has not measured its memory bandwidth", sh->id);
        double bytes = 0;
        for (uint32_t l = sh->layer_begin; l < sh->layer_end && l < (uint32_t)c->n_layers; l++)
            bytes += layer_read(c, (int)l, skip);
        if (r == 0)
            bytes += c->n_vocab > 0 ? (double)c->embd_bytes / c->n_vocab : 0;
        if (r == W - 1)
            bytes += (double)c->head_bytes + (double)c->output_norm_bytes;
        compute += bytes / bw;
        if (W > 1) { /* to the next rank, and from the last back to rank 0 */
            double hop_bytes = r == W - 1 ? TOKEN_BYTES : (double)c->n_embd * FLOAT_BYTES;
            double t = hop_seconds(s, sh->id, cd->shares[(r + 1) % W].id, hop_bytes);
            if (t < 0)
                return unknown(out, "the link %s to %s has no round trip or throughput yet", sh->id,
                               cd->shares[(r + 1) % W].id);
            link += t;
            sent += hop_bytes;
        }
    }
    out->compute_ms = compute * 1e3;
    out->link_ms = link * 1e3;
    out->bytes_per_token = sent;
    out->exchanges = W > 1 ? (int)W : 0;
}

/* Seconds of one ring all-gather of a vector of `floats` over the candidate's ranks: each
 * part goes W - 1 hops; the slowest link of the ring sets the pace. */
static double gather_seconds(const struct cluster_state *s, const struct place_candidate *cd, double floats,
                             double *sent)
{
    uint32_t W = cd->n_nodes;
    double part = floats * FLOAT_BYTES / W, slowest = 0;
    for (uint32_t r = 0; r < W; r++) {
        double t = hop_seconds(s, cd->shares[r].id, cd->shares[(r + 1) % W].id, part);
        if (t < 0)
            return -1;
        slowest = t > slowest ? t : slowest;
    }
    *sent += part * W * (W - 1);
    return slowest * (W - 1);
}

static void estimate_tensor(const struct catalog_card *c, const struct cluster_state *s,
                            const struct place_candidate *cd, struct estimate *out)
{
    double skip = skipped_share(c), layers = 0;
    uint32_t W = cd->n_nodes;
    for (int l = 0; l < c->n_layers; l++)
        layers += layer_read(c, l, skip);
    double per_rank = (layers + (double)c->head_bytes) / W + (double)c->output_norm_bytes +
                      (c->n_vocab > 0 ? (double)c->embd_bytes / c->n_vocab : 0);
    double compute = 0;
    for (uint32_t r = 0; r < W; r++) {
        double bw = node_bandwidth(s, cd->shares[r].id);
        if (bw <= 0)
            return unknown(out, "node %s has not measured its memory bandwidth", cd->shares[r].id);
        compute = per_rank / bw > compute ? per_rank / bw : compute;
    }
    double link = 0, sent = 0;
    if (W > 1) {
        double q_dim = (double)c->n_head * c->head_dim;
        const double vecs[ESTIMATE_TP_GATHERS_PER_LAYER] = {q_dim, c->n_embd, c->n_ff, c->n_embd};
        for (int k = 0; k < ESTIMATE_TP_GATHERS_PER_LAYER; k++) {
            double t = gather_seconds(s, cd, vecs[k], &sent);
            if (t < 0)
                return unknown(out, "a link of the candidate has no round trip or throughput yet");
            link += t * c->n_layers;
        }
        sent *= c->n_layers;
        /* the logits to rank 0: rank 1's part goes W - 1 hops, and the last link carries
         * W - 1 parts */
        double part = (double)c->n_vocab * FLOAT_BYTES / W;
        double t = hop_seconds(s, cd->shares[W - 1].id, cd->shares[0].id, part);
        if (t < 0)
            return unknown(out, "a link of the candidate has no round trip or throughput yet");
        link += t * (W - 1);
        sent += part * W * (W - 1) / 2;
    }
    out->compute_ms = compute * 1e3;
    out->link_ms = link * 1e3;
    out->bytes_per_token = sent;
    out->exchanges = W > 1 ? ESTIMATE_TP_GATHERS_PER_LAYER * c->n_layers + 1 : 0;
}

void estimate_candidate(const struct catalog_card *card, const struct cluster_state *s,
                        enum place_sharding sh, const struct place_candidate *cd, struct estimate *out)
{
    memset(out, 0, sizeof *out);
    out->known = true;
    if (!card->layer_bytes || card->n_layers < 1 || cd->n_nodes < 1 || !cd->shares)
        return unknown(out, "the model card has no layer sizes");
    if (sh == PLACE_TENSOR && cd->n_nodes > 1 && card->n_expert > 0)
        unknown(out, "tensor parallelism does not split a mixture of experts");
    else if (sh == PLACE_TENSOR)
        estimate_tensor(card, s, cd, out);
    else
        estimate_pipeline(card, s, cd, out);
    double t = (out->compute_ms + out->link_ms) / 1e3;
    if (out->known)
        out->tokens_per_s = t > 0 ? 1.0 / t : 0;
}

json_t *estimate_to_json(const struct estimate *e)
{
    if (!e->known)
        return json_pack("{s:s}", "unknown", e->why);
    return json_pack("{s:f, s:f, s:f, s:f, s:i}", "tokens_per_s", e->tokens_per_s, "compute_ms", e->compute_ms,
                     "link_ms", e->link_ms, "link_bytes_per_token", e->bytes_per_token, "exchanges", e->exchanges);
}
