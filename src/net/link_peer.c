/* The link's table of connections and peers (link.h): routes, strangers and peer
 * up/down notices; sending; receiving, with the link's handshake (HELLO, WELCOME,
 * REJECT, WHO) and strikes against malformed messages; heartbeat and silence timers;
 * the peer list and counters. */
#include <jansson.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "net/link_int.h"

#define HELLO_RETRY_MS 100     /* a connector not yet welcomed says HELLO this often */
#define FAIL_LOG_EVERY_NS ((int64_t)10 * 1000000000) /* handshake failures: one line per 10 s */
#define MS 1000000LL           /* ns */

/* ---- the table -------------------------------------------------------------------- */

static int push_notice(struct link *l, enum link_event ev, const char *peer)
{
    if (l->notice_head + l->n_notices == l->cap_notices) {
        if (l->notice_head) {
            memmove(l->notices, l->notices + l->notice_head, l->n_notices * sizeof *l->notices);
            l->notice_head = 0;
        } else if (array_reserve(&l->notices, &l->cap_notices, l->n_notices + 1, sizeof *l->notices, 16)) {
            log_error("link %s: out of memory; peer %s notice lost", l->id, peer);
            return CAIRN_ENOMEM;
        }
    }
    struct link_notice *n = &l->notices[l->notice_head + l->n_notices++];
    n->event = ev;
    snprintf(n->peer, sizeof n->peer, "%s", peer);
    return 0;
}

bool link_pop_notice(struct link *l, struct link_msg *out)
{
    if (!l->n_notices)
        return false;
    struct link_notice *n = &l->notices[l->notice_head++];
    l->n_notices--;
    if (!l->n_notices)
        l->notice_head = 0;
    out->event = n->event;
    memcpy(out->peer, n->peer, sizeof out->peer);
    out->type = 0;
    out->data = NULL;
    out->len = 0;
    return true;
}

bool link_live(const struct link_route *r) { return r->ready && !r->dead; }

static bool peer_live(const struct link *l, const char *peer)
{
    for (size_t i = 0; i < l->n_routes; i++)
        if (link_live(l->routes[i]) && !strcmp(l->routes[i]->peer, peer))
            return true;
    return false;
}

static const char *route_name(const struct link_route *r)
{
    return r->peer[0] ? r->peer : "unknown peer";
}

static void set_ready(struct link *l, struct link_route *r)
{
    if (r->ready)
        return;
    bool was_up = peer_live(l, r->peer);
    r->ready = true;
    if (!was_up) {
        log_info("link %s: peer %s up (%s %s)", l->id, r->peer, r->out ? "connected to" : "from", r->endpoint);
        push_notice(l, LINK_EV_PEER_UP, r->peer);
    }
}

void link_set_unready(struct link *l, struct link_route *r, const char *why)
{
    if (!r->ready)
        return;
    r->ready = false;
    if (!peer_live(l, r->peer)) {
        log_info("link %s: peer %s down (%s)", l->id, r->peer, why);
        push_notice(l, LINK_EV_PEER_DOWN, r->peer);
    } else {
        log_debug("link %s: one connection of %s closed (%s)", l->id, r->peer, why);
    }
}

static struct link_stranger *stranger_find(struct link *l, const uint8_t *rid, size_t len, bool create)
{
    struct link_stranger *oldest = &l->strangers[0];
    for (int i = 0; i < LINK_STRANGERS; i++) {
        struct link_stranger *s = &l->strangers[i];
        if (s->rid_len == len && !memcmp(s->rid, rid, len))
            return s;
        if (s->last < oldest->last)
            oldest = s;
    }
    if (!create || len > sizeof oldest->rid)
        return NULL;
    memset(oldest, 0, sizeof *oldest);
    memcpy(oldest->rid, rid, len);
    oldest->rid_len = len;
    oldest->last = clock_ns();
    return oldest;
}

static struct link_route *find_in_route(struct link *l, const uint8_t *rid, size_t len)
{
    for (size_t i = 0; i < l->n_routes; i++) {
        struct link_route *r = l->routes[i];
        if (!r->out && !r->dead && r->rid_len == len && !memcmp(r->rid, rid, len))
            return r;
    }
    return NULL;
}

int link_add_route(struct link *l, struct link_route *r)
{
    if (array_reserve(&l->routes, &l->cap_routes, l->n_routes + 1, sizeof *l->routes, 8))
        return CAIRN_ENOMEM;
    l->routes[l->n_routes++] = r;
    l->gen++;
    return 0;
}
static void remove_route(struct link *l, size_t i, const char *why)
{
    struct link_route *r = l->routes[i];
    r->dead = true;
    link_set_unready(l, r, why);
    l->routes[i] = l->routes[--l->n_routes];
    l->gen++;
    if (l->held_route == r)
        l->held_route = NULL;
    link_free_route(r, 0);
}

static void remove_route_ptr(struct link *l, struct link_route *r, const char *why)
{
    for (size_t i = 0; i < l->n_routes; i++)
        if (l->routes[i] == r) {
            remove_route(l, i, why);
            return;
        }
}

/* ---- sending ------------------------------------------------------------------------ */

int link_send_frames(struct link *l, void *sock, const uint8_t *rid, size_t rid_len, int type,
                       const void *payload, size_t len)
{
    struct link_hdr h = {.version = LINK_VERSION, .type = (uint8_t)type, .len = (uint32_t)len};
    memcpy(h.sender, l->id, sizeof h.sender);
    uint8_t hdr[LINK_HDR_SIZE];
    link_hdr_encode(&h, hdr);
    if ((rid && zmq_send(sock, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        zmq_send(sock, hdr, sizeof hdr, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, len ? payload : "", len, ZMQ_DONTWAIT) < 0)
        return errno == EHOSTUNREACH ? CAIRN_ENOTFOUND : errno == EAGAIN ? CAIRN_EFULL : CAIRN_EIO;
    return 0;
}

/* A send on sock may have consumed its descriptor's edge: ask ZMQ_EVENTS again. */
static void touched(struct link *l, struct link_route *r)
{
    if (r && r->out)
        r->sock_w.quiet = false;
    else
        l->router_w.quiet = false;
}

/* Sends on a route; an incoming route whose connection is gone is marked dead. */
int link_send_route(struct link *l, struct link_route *r, int type, const void *payload, size_t len)
{
    r->last_tx = clock_ns();
    touched(l, r);
    int rc = r->out ? link_send_frames(l, r->sock, NULL, 0, type, payload, len)
                    : link_send_frames(l, l->router, r->rid, r->rid_len, type, payload, len);
    if (rc == CAIRN_ENOTFOUND && !r->out) {
        r->dead = true;
        link_set_unready(l, r, "connection gone");
    }
    return rc;
}

static void send_intro(struct link *l, struct link_route *r, int type)
{
    size_t len;
    char *p = link_intro_payload(l, &len);
    if (!p)
        return;
    link_send_route(l, r, type, p, len);
    free(p);
}

static void send_hello(struct link *l, struct link_route *r)
{
    r->last_hello = clock_ns();
    send_intro(l, r, LINK_T_HELLO);
}

static void send_reason(struct link *l, const uint8_t *rid, size_t rid_len, int type, const char *reason)
{
    json_t *j = json_pack("{s:s}", "reason", reason);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) {
        link_send_frames(l, l->router, rid, rid_len, type, s, strlen(s));
        touched(l, NULL);
    }
    free(s);
    json_decref(j);
}

int link_send(struct link *l, const char *peer, int type, const void *payload, size_t len)
{
    if (!l || type < LINK_T_APP_FIRST || type > LINK_T_APP_LAST || (!payload && len))
        return CAIRN_EINVAL;
    if (len > l->max_msg)
        return CAIRN_ERANGE;
    int sent = 0, last_err = CAIRN_ENOTFOUND;
    for (size_t i = 0; i < l->n_routes; i++) {
        struct link_route *r = l->routes[i];
        if (!link_live(r) || (peer && strcmp(r->peer, peer)))
            continue;
        bool first = true; /* one copy per peer: skip peers an earlier route served */
        for (size_t k = 0; k < i && first; k++)
            first = !(link_live(l->routes[k]) && !strcmp(l->routes[k]->peer, r->peer));
        if (!first)
            continue;
        /* Try this peer's routes, most recently heard first. */
        bool done = false;
        for (int attempt = 0; attempt < 4 && !done; attempt++) {
            struct link_route *best = NULL;
            for (size_t k = 0; k < l->n_routes; k++) {
                struct link_route *c = l->routes[k];
                if (link_live(c) && !strcmp(c->peer, r->peer) && (!best || c->last_rx > best->last_rx))
                    best = c;
            }
            if (!best)
                break;
            int rc = link_send_route(l, best, type, payload, len);
            if (rc == 0) {
                done = true;
                sent++;
                l->stats.sent++;
            } else {
                last_err = rc;
                if (rc != CAIRN_ENOTFOUND)
                    break;
            }
        }
        if (!done)
            log_debug("link %s: message of type %d to %s not queued: %s", l->id, type, r->peer,
                      cairn_strerror(last_err));
        if (peer)
            break;
    }
    if (peer && !sent)
        return last_err;
    return sent;
}

/* ---- receiving ------------------------------------------------------------------------- */

static int deliver(struct link *l, const struct link_route *r, const struct link_hdr *h, zmq_msg_t *body,
                   struct link_msg *out)
{
    zmq_msg_init(&l->held);
    zmq_msg_move(&l->held, body);
    l->has_held = true;
    l->held_route = r;
    out->event = LINK_EV_MESSAGE;
    snprintf(out->peer, sizeof out->peer, "%s", r->peer);
    out->type = h->type;
    out->data = zmq_msg_data(&l->held);
    out->len = zmq_msg_size(&l->held);
    l->stats.received++;
    return 1;
}

/* Shuts the TCP connection a bad message came on, if fd is still that connection. */
static void shutdown_conn(int fd, const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[NI_MAXHOST];
    if (fd < 0 || !addr || getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) != 0 ||
        strcmp(link_unmapped(ip), addr))
        return;
    shutdown(fd, SHUT_RDWR);
}

/* A malformed message from our ROUTER's side: count it against the connection and cut
 * the connection once it has LINK_MAX_STRIKES. */
static void strike_in(struct link *l, struct link_route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                      int fd, const char *why)
{
    l->stats.malformed++;
    struct link_stranger *s = r ? NULL : stranger_find(l, rid, rid_len, true);
    int n = r ? ++r->strikes : s ? ++s->strikes : LINK_MAX_STRIKES;
    if (s)
        s->last = clock_ns();
    log_warn("link %s: dropped a malformed message from %s at %s: %s (strike %d of %d)", l->id,
             r ? route_name(r) : "unknown peer", addr, why, n, LINK_MAX_STRIKES);
    if (n < LINK_MAX_STRIKES)
        return;
    l->stats.cut++;
    log_warn("link %s: cut the connection from %s at %s after %d malformed messages", l->id,
             r ? route_name(r) : "unknown peer", addr, n);
    if (!s)
        s = stranger_find(l, rid, rid_len, true);
    if (s)
        s->banned = true;
    if (r) {
        r->dead = true;
        link_set_unready(l, r, "cut after malformed messages");
    }
    shutdown_conn(fd, addr);
}

/* Refuses a HELLO: logged, answered with REJECT, the routing id ignored from then on. */
static void refuse_in(struct link *l, struct link_route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                      const char *peer, const char *reason)
{
    l->stats.refused++;
    log_warn("link %s: refused node %s at %s: %s", l->id, peer, addr, reason);
    send_reason(l, rid, rid_len, LINK_T_REJECT, reason);
    struct link_stranger *s = stranger_find(l, rid, rid_len, true);
    if (s) {
        s->banned = true;
        s->last = clock_ns();
    }
    if (r) {
        r->dead = true;
        link_set_unready(l, r, "refused");
    }
}

static void hello_in(struct link *l, struct link_route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                     int fd, const struct link_hdr *h, zmq_msg_t *body)
{
    char ns[LINK_NS_MAX], why[160], shown[LINK_NS_MAX];
    int port = 0;
    if (link_parse_intro(body, ns, &port, why, sizeof why)) {
        strike_in(l, r, rid, rid_len, addr, fd, why);
        return;
    }
    if (strcmp(ns, l->ns)) {
        snprintf(why, sizeof why, "namespace '%s' is not ours ('%s')",
                 link_printable(shown, sizeof shown, ns, strlen(ns)), l->ns);
        refuse_in(l, r, rid, rid_len, addr, h->sender, why);
        return;
    }
    if (!strcmp(h->sender, l->id)) {
        refuse_in(l, r, rid, rid_len, addr, h->sender, "it has our own node id");
        return;
    }
    if (r && strcmp(r->peer, h->sender)) {
        link_set_unready(l, r, "node id changed");
        snprintf(r->peer, sizeof r->peer, "%s", h->sender);
    }
    if (!r) {
        if (l->n_routes >= LINK_MAX_ROUTES || rid_len > sizeof r->rid) {
            refuse_in(l, NULL, rid, rid_len, addr, h->sender, "too many connections");
            return;
        }
        r = calloc(1, sizeof *r);
        if (!r || link_add_route(l, r)) {
            free(r);
            log_error("link %s: out of memory for the connection of %s", l->id, h->sender);
            return;
        }
        memcpy(r->rid, rid, rid_len);
        r->rid_len = rid_len;
        r->fd = fd;
        snprintf(r->endpoint, sizeof r->endpoint, "%s", addr);
        snprintf(r->peer, sizeof r->peer, "%s", h->sender);
    }
    r->port = port;
    r->last_rx = clock_ns();
    send_intro(l, r, LINK_T_WELCOME);
    if (!r->dead)
        set_ready(l, r);
}

/* One message from our ROUTER; returns 1 when it filled out. */
int link_read_router(struct link *l, struct link_msg *out)
{
    zmq_msg_t parts[3];
    int total;
    int kept = link_recv_msg(l->router, parts, 3, &total);
    if (kept < 0)
        return -1;
    const uint8_t *rid = zmq_msg_data(&parts[0]);
    size_t rid_len = zmq_msg_size(&parts[0]);
    /* The routing id frame lacks the connection's properties when zmq_poll prefetched
     * the message (libzmq 4.3), so they are read from the first frame that has them. */
    const char *a = NULL;
    int fd = -1;
    for (int i = kept - 1; i >= 0; i--) {
        const char *pa = zmq_msg_gets(&parts[i], "Peer-Address");
        int f = zmq_msg_get(&parts[i], ZMQ_SRCFD);
        if (pa)
            a = pa;
        if (f >= 0)
            fd = f;
    }
    char addr[128];
    snprintf(addr, sizeof addr, "%.127s", a ? link_unmapped(a) : "?");
    int got = 0;

    struct link_stranger *s = stranger_find(l, rid, rid_len, false);
    if (s && s->banned)
        goto done;
    struct link_route *r = find_in_route(l, rid, rid_len);
    struct link_hdr h;
    char why[160];
    if (link_check_frames(l, parts + 1, kept - 1, total - 1, &h, why, sizeof why)) {
        strike_in(l, r, rid, rid_len, addr, fd, why);
        goto done;
    }
    if (h.type == LINK_T_HELLO) {
        hello_in(l, r, rid, rid_len, addr, fd, &h, &parts[2]);
        goto done;
    }
    if (h.type == LINK_T_WELCOME || h.type == LINK_T_REJECT || h.type == LINK_T_WHO) {
        snprintf(why, sizeof why, "message type %u sent to the bound side", h.type);
        strike_in(l, r, rid, rid_len, addr, fd, why);
        goto done;
    }
    if (!r) {
        /* Probably a peer whose connection we timed out: ask it to say HELLO again. */
        if (h.type != LINK_T_BYE) {
            link_send_frames(l, l->router, rid, rid_len, LINK_T_WHO, NULL, 0);
            touched(l, NULL);
        }
        goto done;
    }
    if (strcmp(h.sender, r->peer)) {
        snprintf(why, sizeof why, "sender id %s on the connection of %s", h.sender, r->peer);
        strike_in(l, r, rid, rid_len, addr, fd, why);
        goto done;
    }
    r->last_rx = clock_ns();
    if (fd >= 0)
        r->fd = fd;
    if (h.type == LINK_T_BYE) {
        r->dead = true;
        link_set_unready(l, r, "it said bye");
    } else if (h.type >= LINK_T_APP_FIRST) {
        got = r->ready ? deliver(l, r, &h, &parts[2], out) : 0;
    }
done:
    link_close_parts(parts, kept);
    return got;
}

static void strike_out(struct link *l, struct link_route *r, const char *why)
{
    l->stats.malformed++;
    int n = ++r->strikes;
    log_warn("link %s: dropped a malformed message from %s at %s: %s (strike %d of %d)", l->id, route_name(r),
             r->endpoint, why, n, LINK_MAX_STRIKES);
    if (n >= LINK_MAX_STRIKES) {
        l->stats.cut++;
        log_warn("link %s: closed the connection to %s at %s after %d malformed messages", l->id, route_name(r),
                 r->endpoint, n);
        remove_route_ptr(l, r, "cut after malformed messages");
    }
}

void link_strike(struct link *l, const char *peer, const char *why)
{
    if (!l || !peer)
        return;
    struct link_route *r = NULL;
    for (size_t i = 0; i < l->n_routes && !r; i++)
        if (l->routes[i] == l->held_route && !l->routes[i]->dead && !strcmp(l->routes[i]->peer, peer))
            r = l->routes[i];
    /* Not the message link_poll returned last: the peer's connection heard from last. */
    for (size_t i = 0; i < l->n_routes && !r; i++) {
        struct link_route *c = l->routes[i];
        if (link_live(c) && !strcmp(c->peer, peer))
            r = c;
    }
    for (size_t i = 0; r && r != l->held_route && i < l->n_routes; i++) {
        struct link_route *c = l->routes[i];
        if (link_live(c) && !strcmp(c->peer, peer) && c->last_rx > r->last_rx)
            r = c;
    }
    if (!r)
        return;
    if (!why)
        why = "malformed payload";
    bool last = r->strikes + 1 >= LINK_MAX_STRIKES;
    if (r->out)
        strike_out(l, r, why); /* may free r */
    else
        strike_in(l, r, r->rid, r->rid_len, r->endpoint, r->fd, why);
    /* Its handshake proved who sent these: the peer's other connections go too. */
    for (size_t i = 0; last && i < l->n_routes;) {
        struct link_route *c = l->routes[i];
        if (!link_live(c) || strcmp(c->peer, peer)) {
            i++;
            continue;
        }
        l->stats.cut++;
        log_warn("link %s: cut the other connection of %s (%s %s) after its malformed messages", l->id, peer,
                 c->out ? "to" : "from", c->endpoint);
        if (c->out) {
            remove_route_ptr(l, c, "cut after malformed messages");
            continue; /* routes[i] is another route now */
        }
        struct link_stranger *s = stranger_find(l, c->rid, c->rid_len, true);
        if (s) {
            s->banned = true;
            s->last = clock_ns();
        }
        c->dead = true;
        link_set_unready(l, c, "cut after malformed messages");
        shutdown_conn(c->fd, c->endpoint);
        i++;
    }
}

static void welcome_out(struct link *l, struct link_route *r, const struct link_hdr *h, zmq_msg_t *body)
{
    char ns[LINK_NS_MAX], why[160], shown[LINK_NS_MAX];
    int port = 0;
    if (link_parse_intro(body, ns, &port, why, sizeof why)) {
        strike_out(l, r, why);
        return;
    }
    if (strcmp(ns, l->ns) || !strcmp(h->sender, l->id)) {
        l->stats.refused++;
        if (strcmp(ns, l->ns))
            log_warn("link %s: gave up on %s at %s: namespace '%s' is not ours ('%s')", l->id, h->sender,
                     r->endpoint, link_printable(shown, sizeof shown, ns, strlen(ns)), l->ns);
        else
            log_warn("link %s: gave up on %s: it is ourselves", l->id, r->endpoint);
        remove_route_ptr(l, r, "refused");
        return;
    }
    if (r->ready && strcmp(r->peer, h->sender))
        link_set_unready(l, r, "node id changed");
    snprintf(r->peer, sizeof r->peer, "%s", h->sender);
    r->port = port;
    r->last_rx = clock_ns();
    set_ready(l, r);
}

/* One message from a DEALER; returns 1 when it filled out. r may be freed. */
int link_read_dealer(struct link *l, struct link_route *r, struct link_msg *out)
{
    zmq_msg_t parts[2];
    int total;
    int kept = link_recv_msg(r->sock, parts, 2, &total);
    if (kept < 0)
        return -1;
    int got = 0;
    struct link_hdr h;
    char why[160];
    if (link_check_frames(l, parts, kept, total, &h, why, sizeof why)) {
        strike_out(l, r, why);
        goto done;
    }
    switch (h.type) {
    case LINK_T_WELCOME:
        welcome_out(l, r, &h, &parts[1]);
        break;
    case LINK_T_REJECT: {
        char shown[200];
        l->stats.refused++;
        log_error("link %s: %s at %s refused us: %s", l->id, h.sender, r->endpoint,
                  link_reject_reason(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), shown, sizeof shown));
        remove_route_ptr(l, r, "refused");
        break;
    }
    case LINK_T_WHO:
        link_set_unready(l, r, "it no longer knows us");
        send_hello(l, r);
        break;
    case LINK_T_HELLO:
        strike_out(l, r, "HELLO sent to the connecting side");
        break;
    default: /* heartbeat, bye, application */
        if (!r->ready) {
            if (clock_ns() - r->last_hello >= HELLO_RETRY_MS * MS)
                send_hello(l, r);
            break;
        }
        if (strcmp(h.sender, r->peer)) {
            snprintf(why, sizeof why, "sender id %s on the connection of %s", h.sender, r->peer);
            strike_out(l, r, why);
            break;
        }
        r->last_rx = clock_ns();
        if (h.type == LINK_T_BYE)
            link_set_unready(l, r, "it said bye");
        else if (h.type >= LINK_T_APP_FIRST)
            got = deliver(l, r, &h, &parts[1], out);
    }
done:
    link_close_parts(parts, kept);
    return got;
}

static const char *handshake_why(unsigned ev, unsigned value)
{
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return "key refused by the cluster's authenticator (another cluster secret?)";
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return "one side has a cluster secret and the other none";
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        return "encryption failed (another cluster secret?)";
    return "protocol error (not a cairn node, or another secret?)";
}

/* One monitor event of our ROUTER (r NULL) or of a DEALER. */
int link_read_monitor(struct link *l, void *mon, struct link_route *r)
{
    zmq_msg_t parts[2];
    int total;
    int kept = link_recv_msg(mon, parts, 2, &total);
    if (kept < 0)
        return -1;
    if (kept == 2 && zmq_msg_size(&parts[0]) == 6) {
        uint16_t ev;
        uint32_t value;
        memcpy(&ev, zmq_msg_data(&parts[0]), 2);
        memcpy(&value, (uint8_t *)zmq_msg_data(&parts[0]) + 2, 4);
        int64_t now = clock_ns();
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            l->stats.handshake_failed++;
            int64_t *last = r ? &r->last_fail_log : &l->router_fail_log;
            if (!*last || now - *last >= FAIL_LOG_EVERY_NS) {
                *last = now;
                log_warn("link %s: %s handshake %s %s failed: %s", l->id, r ? "outgoing" : "incoming",
                         r ? "with" : "on", r ? r->endpoint : "our port", handshake_why(ev, value));
            }
        } else if (r && ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (!r->ready)
                send_hello(l, r);
        } else if (r && ev == ZMQ_EVENT_DISCONNECTED) {
            link_set_unready(l, r, "connection lost");
        }
    }
    link_close_parts(parts, kept);
    return 0;
}

/* ---- timers --------------------------------------------------------------------------- */

void link_tick(struct link *l, int64_t now)
{
    for (size_t i = 0; i < l->n_routes;) {
        struct link_route *r = l->routes[i];
        if (r->dead) {
            remove_route(l, i, "connection gone");
            continue;
        }
        if (r->ready && now - r->last_rx >= (int64_t)l->timeout_ms * MS) {
            char why[64];
            snprintf(why, sizeof why, "silent for %lld ms", (long long)((now - r->last_rx) / MS));
            if (!r->out) {
                remove_route(l, i, why);
                continue;
            }
            link_set_unready(l, r, why);
        }
        if (r->ready && now - r->last_tx >= (int64_t)l->hb_ms * MS)
            link_send_route(l, r, LINK_T_HEARTBEAT, NULL, 0);
        if (!r->ready && r->out && now - r->last_hello >= HELLO_RETRY_MS * MS)
            send_hello(l, r);
        i++;
    }
}

/* When the next timer of tick falls due (INT64_MAX when none). */
int64_t link_next_due(const struct link *l)
{
    int64_t due = INT64_MAX;
    for (size_t i = 0; i < l->n_routes; i++) {
        const struct link_route *r = l->routes[i];
        int64_t t = INT64_MAX;
        if (r->dead)
            t = 0;
        else if (r->ready) {
            int64_t a = r->last_rx + (int64_t)l->timeout_ms * MS, b = r->last_tx + (int64_t)l->hb_ms * MS;
            t = a < b ? a : b;
        } else if (r->out)
            t = r->last_hello + HELLO_RETRY_MS * MS;
        if (t < due)
            due = t;
    }
    return due;
}

/* ---- peers and stats -------------------------------------------------------------------- */

size_t link_peers(const struct link *l, struct link_peer *out, size_t max)
{
    size_t count = 0;
    int64_t now = clock_ns();
    for (size_t i = 0; l && i < l->n_routes; i++) {
        const struct link_route *r = l->routes[i];
        if (!link_live(r))
            continue;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++)
            seen = link_live(l->routes[k]) && !strcmp(l->routes[k]->peer, r->peer);
        if (seen)
            continue;
        if (count < max) {
            struct link_peer *p = &out[count];
            memset(p, 0, sizeof *p);
            snprintf(p->id, sizeof p->id, "%s", r->peer);
            int64_t last = 0;
            for (size_t k = i; k < l->n_routes; k++) {
                const struct link_route *c = l->routes[k];
                if (!link_live(c) || strcmp(c->peer, r->peer))
                    continue;
                if (c->out)
                    p->outgoing = true;
                else
                    p->incoming = true;
                if (c->out || !p->addr[0])
                    snprintf(p->addr, sizeof p->addr, "%s", c->endpoint);
                p->port = c->port;
                if (c->last_rx > last)
                    last = c->last_rx;
            }
            p->silent_ms = (now - last) / MS;
        }
        count++;
    }
    return count;
}

bool link_peer_up(const struct link *l, const char *peer) { return l && peer && peer_live(l, peer); }

void link_get_stats(const struct link *l, struct link_stats *out)
{
    *out = l->stats;
    out->auth_denied = atomic_load(&l->zap.denied);
}
