/* What this node tells the master about itself (node_int.h): its info, runners,
 * downloads and edges to its peers, whose throughput the probes measure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/log.h"
#include "node/node_int.h"

/* ---- reports of this node ---- */

struct perf *node_perf_find(struct node *n, const char *id, bool create)
{
    for (size_t i = 0; i < n->n_perfs; i++)
        if (!strcmp(n->perfs[i].id, id))
            return &n->perfs[i];
    if (!create || n->n_perfs >= LINK_MAX_ROUTES || !ids_valid_id(id))
        return NULL;
    if (array_reserve(&n->perfs, &n->cap_perfs, n->n_perfs + 1, sizeof *n->perfs, 16))
        return NULL;
    struct perf *p = &n->perfs[n->n_perfs++];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    return p;
}

/* Links to the peers up now, as a report's "edges". */
static json_t *current_edges(struct node *n)
{
    struct link_peer peers[NODE_MAX_PEERS];
    size_t k = link_peers(n->link, peers, NODE_MAX_PEERS);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < k; i++) {
        if (!ids_valid_id(peers[i].id))
            continue;
        const struct perf *p = node_perf_find(n, peers[i].id, false);
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "to", peers[i].id, "rtt_us",
                                             (json_int_t)(p ? p->rtt_us : 0), "throughput_bytes_per_s",
                                             (json_int_t)(p ? p->tput : 0)));
    }
    return arr;
}

/* True when b and a are further apart than MASTER_EDGE_THROUGHPUT_SLACK_PCT of the larger
 * (from or to 0 is always a change). */
static bool tput_moved(int64_t a, int64_t b)
{
    int64_t hi = a > b ? a : b, d = a > b ? a - b : b - a;
    return d > 0 && (a == 0 || b == 0 || d > hi / 100 * MASTER_EDGE_THROUGHPUT_SLACK_PCT);
}

/* True when the edges differ in their set of peers, by more than the rtt slack or by
 * more than the throughput slack. */
static bool edges_changed(const json_t *a, const json_t *b)
{
    if (!a || !b || json_array_size(a) != json_array_size(b))
        return true;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i);
        const char *to = json_string_value(json_object_get(x, "to"));
        bool found = false;
        for (size_t k = 0; k < json_array_size(b) && !found; k++) {
            const json_t *y = json_array_get(b, k);
            if (to && !strcmp(to, json_string_value(json_object_get(y, "to")) ?: "")) {
                found = true;
                json_int_t p = json_integer_value(json_object_get(x, "rtt_us"));
                json_int_t q = json_integer_value(json_object_get(y, "rtt_us"));
                json_int_t slack = p / 2 > MASTER_EDGE_RTT_SLACK_US ? p / 2 : MASTER_EDGE_RTT_SLACK_US;
                if (p - q > slack || q - p > slack)
                    return true;
                if (tput_moved(json_integer_value(json_object_get(x, "throughput_bytes_per_s")),
                               json_integer_value(json_object_get(y, "throughput_bytes_per_s"))))
                    return true;
            }
        }
        if (!found)
            return true;
    }
    return false;
}

static json_t *info_json(struct node *n, const struct node_info *ni)
{
    json_t *j = nodeinfo_to_json(ni);
    if (j && (json_object_set_new(j, "api_port", json_integer(atomic_load(&n->api_port))) ||
              json_object_set_new(j, "cluster_port", json_integer(link_port(n->link))))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static void gather_info(struct node *n, int64_t now)
{
    char err[256];
    struct node_info ni;
    n->next_info_ms = now + NODE_INFO_INTERVAL_MS;
    if (nodeinfo_gather(&ni, n->models_dir, err, sizeof err)) {
        log_warn("node %s: node info: %s", n->id, err);
        return;
    }
    if (n->memory_limit > 0 && (ni.mem_available > n->memory_limit || ni.mem_available <= 0))
        ni.mem_available = n->memory_limit;
    if (!n->worker)
        ni.mem_available = 0; /* runs no runners: placement never picks it */
    ni.mem_bandwidth = atomic_load(&n->mem_bandwidth);
    n->info = ni;
    n->has_info = true;
    if (!n->has_reported || nodeinfo_changed(&n->reported, &n->info))
        n->report_due = true;
}

void node_set_memory_bandwidth(struct node *n, int64_t bytes_per_s)
{
    atomic_store(&n->mem_bandwidth, bytes_per_s > 0 ? bytes_per_s : 0);
    atomic_store(&n->info_asked, true); /* gathered (and reported) on the node thread's next pass */
    node_wake(n);
}

void node_maybe_report(struct node *n, int64_t now)
{
    if (n->leaving) /* a report would put us back in the state */
        return;
    bool info_due = atomic_exchange(&n->info_asked, false) || now >= n->next_info_ms;
    if (info_due)
        gather_info(n, now);
    if (atomic_exchange(&n->report_asked, false))
        n->report_due = true;
    const char *master = node_current_master(n);
    /* A master that does not list us (timed out, or it started from an older state). */
    if (master[0] && !strcmp(n->state->master_node_id, master) && !cluster_state_find_node(n->state, n->id))
        n->report_due = true;
    /* The links' figures are compared with the last report's on the info timer, not on
     * every pass of the loop (a pass follows every message: with many peers, building
     * the edges each time was most of an idle node's work). */
    if (!info_due && !n->report_due)
        return;
    json_t *edges = current_edges(n);
    if (edges && edges_changed(edges, n->reported_edges))
        n->report_due = true;
    if (!n->report_due || !n->has_info || !master[0] || now - n->last_report_ms < NODE_REPORT_MIN_MS ||
        !edges) {
        json_decref(edges);
        return;
    }
    /* The info last reported until it moves past nodeinfo_changed's thresholds: the
     * master makes no event for info it already holds. */
    bool fresh = !n->has_reported || nodeinfo_changed(&n->reported, &n->info);
    json_t *report = json_object();
    json_t *info = info_json(n, fresh ? &n->info : &n->reported);
    if (!report || !info || json_object_set_new(report, "node_id", json_string(n->id)) ||
        json_object_set_new(report, "info", info) ||
        json_object_set_new(report, "runners",
                            n->runners ? (n->runners(n->runners_ctx) ?: json_null()) : json_null()) ||
        json_object_set_new(report, "downloads",
                            n->downloads ? (download_mgr_json(n->downloads) ?: json_null()) : json_null()) ||
        json_object_set(report, "edges", edges)) {
        json_decref(report);
        json_decref(edges);
        return;
    }
    if (!strcmp(master, n->id)) {
        node_run_report(n, n->id, report);
        json_decref(report);
    } else {
        node_send_json(n, master, LINK_T_REPORT, report);
    }
    if (fresh)
        n->reported = n->info;
    n->has_reported = true;
    json_decref(n->reported_edges);
    n->reported_edges = edges;
    n->report_due = false;
    n->last_report_ms = now;
}

/* ---- throughput probes ---- */

/* A peer's link came up: its first probe goes soon (once pings gave a round trip). */
void node_probe_plan(struct node *n, const char *peer, int64_t now)
{
    struct perf *p = node_perf_find(n, peer, true);
    if (!p)
        return;
    p->probing = false;
    p->told_ms = 0;
    p->probe_every_ms = n->probe_interval_ms;
    p->next_probe_ms = now + (n->probe_interval_ms < NODE_PROBE_FIRST_MS ? n->probe_interval_ms
                                                                         : NODE_PROBE_FIRST_MS);
}

void node_probe_stop(struct node *n, const char *peer)
{
    struct perf *p = node_perf_find(n, peer, false);
    if (p) {
        p->probing = false;
        p->next_probe_ms = 0;
    }
}

/* Sends the probes that are due: at most one in flight per peer, and none over a link
 * that carried task outputs within NODE_PROBE_BUSY_MS (it waits, not the outputs). */
void node_send_probes(struct node *n, int64_t now)
{
    for (size_t i = 0; i < n->n_perfs; i++) {
        struct perf *p = &n->perfs[i];
        if (p->probing && now - p->probe_sent_ns / 1000000 >= NODE_PROBE_TIMEOUT_MS)
            p->probing = false; /* the probe or its ack was lost */
        if (p->probing || !p->next_probe_ms || now < p->next_probe_ms)
            continue;
        if (!link_peer_up(n->link, p->id)) {
            p->next_probe_ms = 0;
            continue;
        }
        if (p->last_output_ms && now - p->last_output_ms < NODE_PROBE_BUSY_MS) {
            p->next_probe_ms = now + NODE_PROBE_BUSY_MS;
            continue;
        }
        uint64_t seq = ++n->next_probe_seq;
        for (int k = 0; k < 8; k++)
            n->probe_buf[k] = (uint8_t)(seq >> (56 - 8 * k));
        p->next_probe_ms = now + (p->probe_every_ms ? p->probe_every_ms : n->probe_interval_ms);
        int64_t t = clock_ns();
        if (link_send(n->link, p->id, NODE_T_PROBE, n->probe_buf, NODE_PROBE_BYTES) == 1) {
            p->probing = true;
            p->probe_seq = seq;
            p->probe_sent_ns = t;
        }
    }
}

/* A peer's probe: answered at once with its sequence number and size. */
void node_on_probe(struct node *n, const char *from, const uint8_t *data, size_t len)
{
    if (len < 8) {
        node_strike(n, from, "probe of fewer than 8 bytes", NULL);
        return;
    }
    uint64_t seq = 0;
    for (int k = 0; k < 8; k++)
        seq = seq << 8 | data[k];
    if (seq > (uint64_t)IDS_COUNTER_MAX) {
        node_strike(n, from, "probe number out of range", NULL);
        return;
    }
    node_send_json(n, from, NODE_T_CONTROL,
              json_pack("{s:s, s:I, s:I}", "type", "probe_ack", "seq", (json_int_t)seq, "bytes",
                        (json_int_t)len));
}

/* The ack of our probe: the probe's bytes took the time to the ack less a round trip
 * (the ack's way back and the peer's reply time, as pings measure them). */
void node_on_probe_ack(struct node *n, const char *from, int64_t seq, int64_t bytes)
{
    struct perf *p = node_perf_find(n, from, false);
    if (!p || !p->probing || (uint64_t)seq != p->probe_seq || bytes != (int64_t)NODE_PROBE_BYTES)
        return; /* the ack of a probe given up on */
    p->probing = false;
    int64_t elapsed_us = (clock_ns() - p->probe_sent_ns) / 1000;
    int64_t xfer_us = elapsed_us - p->rtt_us;
    /* The round trip is a smoothed figure of small messages: where it takes up most of
     * this probe's time (a fast link, or noise), it is not trusted with the rest. */
    if (xfer_us < elapsed_us / 4)
        xfer_us = elapsed_us / 4;
    if (xfer_us < 1)
        xfer_us = 1;
    int64_t bps = bytes * 1000000 / xfer_us;
    if (bps > IDS_BYTES_MAX)
        bps = IDS_BYTES_MAX;
    if (bps < 1)
        bps = 1;
    int64_t before = p->tput;
    p->tput = p->tput ? (3 * p->tput + bps) / 4 : bps;
    /* Every pair of nodes probes both ways: at a steady figure the next probe waits twice
     * as long (up to NODE_PROBE_BACKOFF times the interval), so an idle cluster of many
     * nodes neither streams probes nor makes an event of each one's noise; a figure that
     * moves brings the interval back. */
    int64_t most = (int64_t)n->probe_interval_ms * NODE_PROBE_BACKOFF;
    if (before && !tput_moved(before, p->tput))
        p->probe_every_ms = 2 * p->probe_every_ms < most ? 2 * p->probe_every_ms : most;
    else
        p->probe_every_ms = n->probe_interval_ms;
    if (p->next_probe_ms)
        p->next_probe_ms = p->probe_sent_ns / 1000000 + p->probe_every_ms;
}
