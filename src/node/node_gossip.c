/* Control messages between nodes (node_int.h): peers told and connected to, pings,
 * the master's head, probe acks, and leaving. */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "node/node_int.h"

/* ---- control messages: peers, pings, head ---- */

/* The endpoint to reach a peer at, "tcp://host:port". */
static bool peer_endpoint(const struct link_peer *p, char *out, size_t n)
{
    if (!strncmp(p->addr, "tcp://", 6))
        return snprintf(out, n, "%s", p->addr) < (int)n;
    if (p->port <= 0 || !p->addr[0])
        return false;
    bool v6 = strchr(p->addr, ':') != NULL;
    return snprintf(out, n, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", p->addr, p->port) < (int)n;
}

void node_gossip(struct node *n, const char *to, int64_t now)
{
    struct link_peer peers[NODE_MAX_PEERS];
    size_t k = link_peers(n->link, peers, NODE_MAX_PEERS);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < k; i++) {
        char ep[LINK_ADDR_MAX + 16];
        if (peer_endpoint(&peers[i], ep, sizeof ep))
            json_array_append_new(arr, json_pack("{s:s, s:s}", "id", peers[i].id, "endpoint", ep));
    }
    if (arr)
        node_send_json(n, to, NODE_T_CONTROL, json_pack("{s:s, s:o}", "type", "peers", "peers", arr));
    node_send_json(n, to, NODE_T_CONTROL,
              json_pack("{s:s, s:I}", "type", "ping", "t", (json_int_t)(clock_ns() / 1000)));
    (void)now;
}

/* Whether to connect to a peer we were told of (by gossip or discovery) and are not
 * linked to. Both nodes of a pair hear of each other at about the same time, and if both
 * connected, every pair would keep two connections, each with heartbeats both ways: the
 * node with the smaller id connects, the other waits NODE_CONNECT_DEFER_MS for it before
 * connecting itself (so a peer that cannot reach us is still linked). */
static bool should_connect(struct node *n, const char *peer, int64_t now)
{
    if (strcmp(n->id, peer) < 0)
        return true;
    struct perf *p = node_perf_find(n, peer, true);
    if (!p)
        return true;
    if (!p->told_ms) {
        p->told_ms = now;
        return false;
    }
    return now - p->told_ms >= NODE_CONNECT_DEFER_MS;
}

static void on_peers(struct node *n, const char *from, const json_t *j, int64_t now)
{
    const json_t *arr = json_object_get(j, "peers");
    if (!json_is_array(arr)) {
        node_strike(n, from, "peers message without a peers array", NULL);
        return;
    }
    size_t k = json_array_size(arr);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    for (size_t i = 0; i < k; i++) {
        const json_t *p = json_array_get(arr, i);
        const char *id = json_string_value(json_object_get(p, "id"));
        const char *ep = json_string_value(json_object_get(p, "endpoint"));
        if (!id || !ep) {
            node_strike(n, from, "peers message with an entry that is not {id, endpoint}", NULL);
            return;
        }
        /* an id the link takes but the cluster does not: the peer's fault, not from's */
        if (!ids_valid_id(id) || !strcmp(id, n->id) || link_peer_up(n->link, id) || !should_connect(n, id, now))
            continue;
        char err[256];
        if (link_connect(n->link, ep, err, sizeof err))
            log_debug("node %s: peer %s told by %s at %s: %s", n->id, id, from, ep, err);
        else
            log_debug("node %s: connecting to %s at %s (told by %s)", n->id, id, ep, from);
    }
}

int node_left_index(const struct node *n, const char *id)
{
    for (int i = 0; i < n->n_left; i++)
        if (!strcmp(n->left[i], id))
            return i;
    return -1;
}

/* A peer said it leaves (left) or came back (!left). The oldest entry makes room. */
void node_note_left(struct node *n, const char *id, bool left)
{
    int i = node_left_index(n, id);
    if (!left) {
        if (i >= 0)
            memmove(n->left[i], n->left[i + 1], (size_t)(--n->n_left - i) * sizeof n->left[0]);
        return;
    }
    if (i >= 0)
        return;
    if (n->n_left == NODE_LEFT_MAX)
        memmove(n->left[0], n->left[1], (size_t)(--n->n_left) * sizeof n->left[0]);
    snprintf(n->left[n->n_left++], sizeof n->left[0], "%s", id);
}

/* A peer's "leave": it is stopping (node_leave). Noted, so that whoever is master now or
 * later times it out at once, and acknowledged, so that it knows we read it before it
 * closes its links. */
static void on_leave(struct node *n, const char *from, int64_t now)
{
    log_info("node %s: node %s says it leaves", n->id, from);
    node_note_left(n, from, true);
    n->next_timeout_ms = now; /* the master's next check is on this pass */
    node_send_json(n, from, NODE_T_CONTROL, json_pack("{s:s}", "type", "leave_ack"));
}

static void on_leave_ack(struct node *n, const char *from)
{
    for (int i = 0; i < n->n_leave_wait; i++)
        if (!strcmp(n->leave_wait[i], from)) {
            memmove(n->leave_wait[i], n->leave_wait[i + 1], (size_t)(--n->n_leave_wait - i) * sizeof n->leave_wait[0]);
            return;
        }
}

/* Our leave starts: "leave" to every live peer; node_main waits for their acks. */
void node_start_leave(struct node *n, int64_t now)
{
    struct link_peer peers[NODE_LEFT_MAX];
    size_t k = link_peers(n->link, peers, NODE_LEFT_MAX);
    n->leaving = true;
    n->leave_deadline_ms = now + NODE_LEAVE_WAIT_MS;
    n->n_leave_wait = 0;
    for (size_t i = 0; i < k && i < NODE_LEFT_MAX; i++) {
        if (!ids_valid_id(peers[i].id) || !link_peer_up(n->link, peers[i].id))
            continue;
        snprintf(n->leave_wait[n->n_leave_wait++], sizeof n->leave_wait[0], "%.*s", IDS_ID_MAX, peers[i].id);
        node_send_json(n, peers[i].id, NODE_T_CONTROL, json_pack("{s:s}", "type", "leave"));
    }
    log_info("node %s: leaving the cluster (%d peers to tell)", n->id, n->n_leave_wait);
}

/* Control messages: {"type": "peers"|"ping"|"pong"|"head"|"probe_ack"|"leave"|"leave_ack",
 * ...}. A message that is not one of them, or lacks their fields, is a strike against its
 * sender. */
void node_on_control(struct node *n, const char *from, const char *data, size_t len,
                       int64_t now)
{
    json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *bad = NULL;
    if (!type) {
        bad = "control message without a type";
    } else if (!strcmp(type, "peers")) {
        on_peers(n, from, j, now);
    } else if (!strcmp(type, "ping")) {
        json_t *t = json_object_get(j, "t");
        if (json_is_integer(t))
            node_send_json(n, from, NODE_T_CONTROL,
                      json_pack("{s:s, s:I}", "type", "pong", "t", json_integer_value(t)));
        else
            bad = "ping without an integer t";
    } else if (!strcmp(type, "pong")) {
        json_t *t = json_object_get(j, "t");
        int64_t us = clock_ns() / 1000 - (json_is_integer(t) ? json_integer_value(t) : 0);
        struct perf *p = json_is_integer(t) && us >= 0 && us < 60000000 ? node_perf_find(n, from, true) : NULL;
        if (p)
            p->rtt_us = p->rtt_us ? (3 * p->rtt_us + us) / 4 : us;
        if (!json_is_integer(t))
            bad = "pong without an integer t";
    } else if (!strcmp(type, "head")) {
        json_t *t = json_object_get(j, "term"), *i = json_object_get(j, "index");
        if (!json_is_integer(t) || !json_is_integer(i))
            bad = "head without an integer term and index";
        else if (!strcmp(node_current_master(n), from) &&
                 !node_pos_reached(n->state, json_integer_value(t), json_integer_value(i)))
            node_request_events(n, false, now);
    } else if (!strcmp(type, "leave")) {
        on_leave(n, from, now);
    } else if (!strcmp(type, "leave_ack")) {
        on_leave_ack(n, from);
    } else if (!strcmp(type, "probe_ack")) {
        json_t *q = json_object_get(j, "seq"), *b = json_object_get(j, "bytes");
        if (json_is_integer(q) && json_is_integer(b))
            node_on_probe_ack(n, from, json_integer_value(q), json_integer_value(b));
        else
            bad = "probe_ack without an integer seq and bytes";
    } else {
        bad = "control message of an unknown type";
    }
    if (bad)
        node_strike(n, from, bad, NULL);
    json_decref(j);
}

/* Discovery hook: with discovery off (node_config's NULL, `cairn node --discovery off`)
 * there is no discovery object and this does nothing; otherwise every node it hears of
 * is connected to. */
void node_discover(struct node *n, int64_t now)
{
    if (!n->disc)
        return;
    struct discovery_peer p;
    for (int i = 0; i < 16 && discovery_poll(n->disc, 0, &p) == 1; i++) {
        if (p.change == DISCOVERY_REFRESHED && link_peer_up(n->link, p.node_id))
            continue;
        char ep[LINK_ADDR_MAX], err[256];
        snprintf(ep, sizeof ep, "tcp://%s:%d", p.addr, p.cluster_port);
        if (!link_peer_up(n->link, p.node_id) && should_connect(n, p.node_id, now) &&
            link_connect(n->link, ep, err, sizeof err))
            log_debug("node %s: discovered %s at %s: %s", n->id, p.node_id, ep, err);
    }
}
