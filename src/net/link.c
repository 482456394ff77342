#include "net/link.h"

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#include <czmq.h> /* zsys_handler_set only; the link itself speaks libzmq */
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a draft option of libzmq 4.3; Debian builds it in */
#endif

_Static_assert(crypto_auth_KEYBYTES == 32 && crypto_auth_BYTES == LINK_MAC_BYTES, "crypto_auth sizes");
_Static_assert(crypto_box_PUBLICKEYBYTES == LINK_KEY_BYTES && crypto_box_SECRETKEYBYTES == LINK_KEY_BYTES,
               "curve25519 key sizes");
_Static_assert(crypto_box_SEEDBYTES == 32, "seed size");
_Static_assert(4 + 4 + LINK_ID_MAX == LINK_HDR_SIZE, "header layout");

#define STRANGERS 64           /* routing ids without a route that we keep strikes for */
#define HELLO_RETRY_MS 100     /* a connector not yet welcomed says HELLO this often */
#define FAIL_LOG_EVERY_NS ((int64_t)10 * 1000000000) /* handshake failures: one line per 10 s */
#define BYE_LINGER_MS 100      /* how long release/disconnect waits for a BYE to leave */
#define DRAIN_BATCH 64         /* messages read from one socket per wake-up */
#define MS 1000000LL           /* ns */

static const char *const CURVE_CONTEXT = "cairn link curve v1";
static const char *const AUTH_CONTEXT = "cairn link auth v1";
static const char *const ZAP_ENDPOINT = "inproc://zeromq.zap.01";

/* How link_poll waits on one ZeroMQ socket. A socket signals through a file descriptor
 * (ZMQ_FD) that is edge-triggered: it turns readable when the socket's state may have
 * changed, and any send or receive on the socket may consume that edge. So a socket is
 * quiet only after ZMQ_EVENTS showed nothing to read with no send or receive since;
 * link_poll asks ZMQ_EVENTS of the other sockets only and sleeps in one poll() on every
 * descriptor. (zmq_poll asked every socket every time, two system calls each: with many
 * peers that was most of an idle node's work.) Zeroed: descriptor unknown, not quiet. */
struct zwatch {
    int fd1;    /* ZMQ_FD + 1; 0 until asked */
    bool quiet;
};

/* One connection: one we opened (a DEALER), or one a peer opened to our ROUTER. */
struct route {
    bool out;
    bool ready; /* handshake done and not since lost */
    bool dead;  /* an incoming route whose connection is gone; removed at the next tick */
    void *sock, *mon;             /* out: the DEALER and the PAIR reading its monitor */
    char endpoint[LINK_ADDR_MAX]; /* out: what we connected to; in: the IP it came from */
    uint8_t rid[256];             /* in: ROUTER routing id */
    size_t rid_len;
    char peer[LINK_ID_MAX];       /* node id from the handshake, "" before */
    int port;                     /* the cluster port the peer announced */
    int fd;                       /* in: the TCP socket its last message came on, -1 unknown */
    struct zwatch sock_w, mon_w;  /* out: how link_poll waits on the DEALER and its monitor */
    int strikes;
    int64_t last_rx, last_tx, last_hello, last_fail_log; /* clock_ns */
};

/* A routing id of our ROUTER that has no route (yet): strikes and bans. */
struct stranger {
    uint8_t rid[256];
    size_t rid_len;
    int strikes;
    bool banned;
    int64_t last;
};

struct notice {
    enum link_event event;
    char peer[LINK_ID_MAX];
};

/* What the ZAP thread reads; written before the thread starts, except denied. */
struct zap {
    void *sock, *stop;
    uint8_t pk[LINK_KEY_BYTES];
    char node_id[LINK_ID_MAX];
    _Atomic uint64_t denied;
};

enum item_kind { ITEM_ROUTER, ITEM_ROUTER_MON, ITEM_DEALER, ITEM_DEALER_MON, ITEM_WAKE };

struct link {
    char id[LINK_ID_MAX], ns[LINK_NS_MAX];
    bool secure;
    uint8_t pk[LINK_KEY_BYTES], sk[LINK_KEY_BYTES];
    int port, hb_ms, timeout_ms;
    size_t max_msg;

    void *ctx, *router, *router_mon, *zap_stop;
    struct zap zap;
    pthread_t zap_thread;
    bool zap_running;
    int64_t router_fail_log;
    int next_mon;

    struct route **routes;
    size_t n_routes, cap_routes;
    uint64_t gen; /* bumped whenever routes are added or removed */
    struct stranger strangers[STRANGERS];

    struct notice *notices;
    size_t notice_head, n_notices, cap_notices;

    zmq_msg_t held; /* payload of the message link_poll returned last */
    bool has_held;
    const struct route *held_route; /* where it came from (compared, never read: link_strike) */

    int wake_fds[LINK_WAKE_FDS]; /* + 1: 0 is none (link_set_wake_fd) */

    struct zwatch router_w, router_mon_w;
    zmq_pollitem_t *items;  /* socket, or fd for ITEM_WAKE */
    struct zwatch **item_w; /* NULL for ITEM_WAKE */
    struct pollfd *pfds;
    struct route **item_route;
    enum item_kind *item_kind;
    size_t cap_items, rr;

    struct link_stats stats;
};

/* ---- wire header ---------------------------------------------------------------- */

bool link_valid_id(const char *s)
{
    if (!s)
        return false;
    size_t n = strnlen(s, LINK_ID_MAX);
    if (n == 0 || n >= LINK_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

static bool valid_type(unsigned t)
{
    return (t >= LINK_T_HELLO && t <= LINK_T_WHO) || (t >= LINK_T_APP_FIRST && t <= LINK_T_APP_LAST);
}

void link_hdr_encode(const struct link_hdr *h, uint8_t out[LINK_HDR_SIZE])
{
    memset(out, 0, LINK_HDR_SIZE);
    out[0] = 'c';
    out[1] = 'l';
    out[2] = h->version;
    out[3] = h->type;
    out[4] = (uint8_t)(h->len >> 24);
    out[5] = (uint8_t)(h->len >> 16);
    out[6] = (uint8_t)(h->len >> 8);
    out[7] = (uint8_t)h->len;
    memcpy(out + 8, h->sender, strnlen(h->sender, LINK_ID_MAX - 1));
}

int link_hdr_decode(const void *buf, size_t n, struct link_hdr *out, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    if (n != LINK_HDR_SIZE)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "header of %zu bytes, expected %d", n, LINK_HDR_SIZE);
    if (b[0] != 'c' || b[1] != 'l')
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad magic %02x %02x", b[0], b[1]);
    if (b[2] != LINK_VERSION)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "protocol version %u, ours is %d", b[2], LINK_VERSION);
    if (!valid_type(b[3]))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown message type %u", b[3]);
    const uint8_t *id = b + 8;
    size_t len = 0;
    while (len < LINK_ID_MAX && id[len])
        len++;
    if (len == LINK_ID_MAX)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id not terminated");
    if (len == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "empty sender id");
    for (size_t i = 0; i < len; i++)
        if (id[i] <= 0x20 || id[i] >= 0x7f)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id holds byte 0x%02x", id[i]);
    for (size_t i = len; i < LINK_ID_MAX; i++)
        if (id[i])
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id padding not zero");
    out->version = b[2];
    out->type = b[3];
    out->len = (uint32_t)b[4] << 24 | (uint32_t)b[5] << 16 | (uint32_t)b[6] << 8 | b[7];
    memcpy(out->sender, id, len + 1);
    return 0;
}

/* ---- keys and the HMAC challenge ---------------------------------------------------- */

static int derive(const char *secret, const char *context, uint8_t out[32])
{
    if (!secret || !*secret)
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_EIO;
    crypto_generichash(out, 32, (const unsigned char *)secret, strlen(secret), (const unsigned char *)context,
                       strlen(context));
    return 0;
}

int link_curve_keypair(const char *secret, uint8_t pk[LINK_KEY_BYTES], uint8_t sk[LINK_KEY_BYTES])
{
    uint8_t seed[crypto_box_SEEDBYTES];
    int rc = derive(secret, CURVE_CONTEXT, seed);
    if (rc)
        return rc;
    crypto_box_seed_keypair(pk, sk, seed);
    sodium_memzero(seed, sizeof seed);
    return 0;
}

void link_auth_nonce(uint8_t nonce[LINK_NONCE_BYTES])
{
    if (sodium_init() >= 0)
        randombytes_buf(nonce, LINK_NONCE_BYTES);
}

int link_auth_challenge(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES], uint8_t mac_out[LINK_MAC_BYTES])
{
    uint8_t key[crypto_auth_KEYBYTES];
    int rc = derive(secret, AUTH_CONTEXT, key);
    if (rc)
        return rc;
    crypto_auth(mac_out, nonce, LINK_NONCE_BYTES, key);
    sodium_memzero(key, sizeof key);
    return 0;
}

int link_auth_verify(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES], const uint8_t mac[LINK_MAC_BYTES])
{
    uint8_t key[crypto_auth_KEYBYTES];
    int rc = derive(secret, AUTH_CONTEXT, key);
    if (rc)
        return rc;
    rc = crypto_auth_verify(mac, nonce, LINK_NONCE_BYTES, key) == 0 ? 0 : CAIRN_EINVAL;
    sodium_memzero(key, sizeof key);
    return rc;
}

/* ---- small helpers ---------------------------------------------------------------- */

/* Copies at most n - 1 bytes of s into dst for a log line, with '?' for unprintables. */
static const char *printable(char *dst, size_t n, const char *s, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < n; i++)
        dst[k++] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    dst[k] = 0;
    return dst;
}

/* Receives one whole message: keeps its first `keep` frames in parts (initialized, to
 * be closed by the caller), drops the rest, and returns how many it kept (-1 when no
 * message was waiting); *total is its frame count. */
static int recv_msg(void *sock, zmq_msg_t *parts, int keep, int *total)
{
    int n = 0;
    for (;;) {
        zmq_msg_t spill;
        zmq_msg_t *m = n < keep ? &parts[n] : &spill;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            if (n == 0)
                return -1;
            break; /* frames of one message arrive together; not reached */
        }
        int more = zmq_msg_more(m);
        if (m == &spill)
            zmq_msg_close(&spill);
        n++;
        if (!more)
            break;
    }
    *total = n;
    return n < keep ? n : keep;
}

static void close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static void set_int(void *sock, int opt, int v) { zmq_setsockopt(sock, opt, &v, sizeof v); }

static int push_notice(struct link *l, enum link_event ev, const char *peer)
{
    if (l->notice_head + l->n_notices == l->cap_notices) {
        if (l->notice_head) {
            memmove(l->notices, l->notices + l->notice_head, l->n_notices * sizeof *l->notices);
            l->notice_head = 0;
        } else {
            size_t cap = l->cap_notices ? 2 * l->cap_notices : 16;
            struct notice *n = realloc(l->notices, cap * sizeof *n);
            if (!n) {
                log_error("link %s: out of memory; peer %s notice lost", l->id, peer);
                return CAIRN_ENOMEM;
            }
            l->notices = n;
            l->cap_notices = cap;
        }
    }
    struct notice *n = &l->notices[l->notice_head + l->n_notices++];
    n->event = ev;
    snprintf(n->peer, sizeof n->peer, "%s", peer);
    return 0;
}

static bool pop_notice(struct link *l, struct link_msg *out)
{
    if (!l->n_notices)
        return false;
    struct notice *n = &l->notices[l->notice_head++];
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

static bool live(const struct route *r) { return r->ready && !r->dead; }

static bool peer_live(const struct link *l, const char *peer)
{
    for (size_t i = 0; i < l->n_routes; i++)
        if (live(l->routes[i]) && !strcmp(l->routes[i]->peer, peer))
            return true;
    return false;
}

static const char *route_name(const struct route *r)
{
    return r->peer[0] ? r->peer : "unknown peer";
}

static void set_ready(struct link *l, struct route *r)
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

static void set_unready(struct link *l, struct route *r, const char *why)
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

static struct stranger *stranger_find(struct link *l, const uint8_t *rid, size_t len, bool create)
{
    struct stranger *oldest = &l->strangers[0];
    for (int i = 0; i < STRANGERS; i++) {
        struct stranger *s = &l->strangers[i];
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

static struct route *find_in_route(struct link *l, const uint8_t *rid, size_t len)
{
    for (size_t i = 0; i < l->n_routes; i++) {
        struct route *r = l->routes[i];
        if (!r->out && !r->dead && r->rid_len == len && !memcmp(r->rid, rid, len))
            return r;
    }
    return NULL;
}

static int add_route(struct link *l, struct route *r)
{
    if (l->n_routes == l->cap_routes) {
        size_t cap = l->cap_routes ? 2 * l->cap_routes : 8;
        struct route **n = realloc(l->routes, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        l->routes = n;
        l->cap_routes = cap;
    }
    l->routes[l->n_routes++] = r;
    l->gen++;
    return 0;
}

static void close_with_linger(void *sock, int linger_ms)
{
    if (!sock)
        return;
    set_int(sock, ZMQ_LINGER, linger_ms);
    zmq_close(sock);
}

static void free_route(struct route *r, int linger_ms)
{
    if (r->sock)
        zmq_socket_monitor(r->sock, NULL, 0);
    close_with_linger(r->mon, 0);
    close_with_linger(r->sock, linger_ms);
    free(r);
}

static void remove_route(struct link *l, size_t i, const char *why)
{
    struct route *r = l->routes[i];
    r->dead = true;
    set_unready(l, r, why);
    l->routes[i] = l->routes[--l->n_routes];
    l->gen++;
    if (l->held_route == r)
        l->held_route = NULL;
    free_route(r, 0);
}

static void remove_route_ptr(struct link *l, struct route *r, const char *why)
{
    for (size_t i = 0; i < l->n_routes; i++)
        if (l->routes[i] == r) {
            remove_route(l, i, why);
            return;
        }
}

/* ---- sending ------------------------------------------------------------------------ */

static int send_frames(struct link *l, void *sock, const uint8_t *rid, size_t rid_len, int type,
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
static void touched(struct link *l, struct route *r)
{
    if (r && r->out)
        r->sock_w.quiet = false;
    else
        l->router_w.quiet = false;
}

/* Sends on a route; an incoming route whose connection is gone is marked dead. */
static int send_route(struct link *l, struct route *r, int type, const void *payload, size_t len)
{
    r->last_tx = clock_ns();
    touched(l, r);
    int rc = r->out ? send_frames(l, r->sock, NULL, 0, type, payload, len)
                    : send_frames(l, l->router, r->rid, r->rid_len, type, payload, len);
    if (rc == CAIRN_ENOTFOUND && !r->out) {
        r->dead = true;
        set_unready(l, r, "connection gone");
    }
    return rc;
}

/* HELLO and WELCOME carry {"namespace", "port"}. */
static char *intro_payload(const struct link *l, size_t *len)
{
    json_t *j = json_pack("{s:s, s:i}", "namespace", l->ns, "port", l->port);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    *len = s ? strlen(s) : 0;
    return s;
}

static void send_intro(struct link *l, struct route *r, int type)
{
    size_t len;
    char *p = intro_payload(l, &len);
    if (!p)
        return;
    send_route(l, r, type, p, len);
    free(p);
}

static void send_hello(struct link *l, struct route *r)
{
    r->last_hello = clock_ns();
    send_intro(l, r, LINK_T_HELLO);
}

static void send_reason(struct link *l, const uint8_t *rid, size_t rid_len, int type, const char *reason)
{
    json_t *j = json_pack("{s:s}", "reason", reason);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) {
        send_frames(l, l->router, rid, rid_len, type, s, strlen(s));
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
        struct route *r = l->routes[i];
        if (!live(r) || (peer && strcmp(r->peer, peer)))
            continue;
        bool first = true; /* one copy per peer: skip peers an earlier route served */
        for (size_t k = 0; k < i && first; k++)
            first = !(live(l->routes[k]) && !strcmp(l->routes[k]->peer, r->peer));
        if (!first)
            continue;
        /* Try this peer's routes, most recently heard first. */
        bool done = false;
        for (int attempt = 0; attempt < 4 && !done; attempt++) {
            struct route *best = NULL;
            for (size_t k = 0; k < l->n_routes; k++) {
                struct route *c = l->routes[k];
                if (live(c) && !strcmp(c->peer, r->peer) && (!best || c->last_rx > best->last_rx))
                    best = c;
            }
            if (!best)
                break;
            int rc = send_route(l, best, type, payload, len);
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

/* Frames after the routing id: exactly a header and a payload that agree. */
static int check_frames(const struct link *l, zmq_msg_t *parts, int kept, int total, struct link_hdr *h,
                        char *why, size_t whylen)
{
    if (total != 2 || kept != 2)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "%d frames, expected 2", total);
    int rc = link_hdr_decode(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), h, why, whylen);
    if (rc)
        return rc;
    size_t body = zmq_msg_size(&parts[1]);
    if (h->len > l->max_msg)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "payload of %u bytes over the %zu limit", h->len, l->max_msg);
    if (body != h->len)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "length field says %u bytes, payload has %zu", h->len, body);
    return 0;
}

static int parse_intro(zmq_msg_t *body, char ns[LINK_NS_MAX], int *port, char *why, size_t whylen)
{
    json_error_t e;
    json_t *j = json_loadb(zmq_msg_data(body), zmq_msg_size(body), JSON_REJECT_DUPLICATES, &e);
    int rc = 0;
    json_t *n = json_object_get(j, "namespace"), *p = json_object_get(j, "port");
    if (!j)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake payload is not JSON: %s", e.text);
    else if (!json_is_string(n) || json_string_length(n) >= LINK_NS_MAX)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake without a namespace of at most %d bytes",
                        LINK_NS_MAX - 1);
    else if (!json_is_integer(p) || json_integer_value(p) < 0 || json_integer_value(p) > 65535)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake without a port in 0..65535");
    else {
        const char *s = json_string_value(n);
        size_t len = json_string_length(n);
        for (size_t i = 0; i < len && !rc; i++)
            if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f)
                rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake namespace holds byte 0x%02x",
                                (unsigned char)s[i]);
        if (!rc) {
            memcpy(ns, s, len + 1);
            *port = (int)json_integer_value(p);
        }
    }
    json_decref(j);
    return rc;
}

static int deliver(struct link *l, const struct route *r, const struct link_hdr *h, zmq_msg_t *body,
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

/* "::ffff:1.2.3.4" (IPv4 on a dual-stack socket) as "1.2.3.4". */
static const char *unmapped(const char *ip)
{
    return !strncmp(ip, "::ffff:", 7) && strchr(ip + 7, '.') ? ip + 7 : ip;
}

/* Shuts the TCP connection a bad message came on, if fd is still that connection. */
static void shutdown_conn(int fd, const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[NI_MAXHOST];
    if (fd < 0 || !addr || getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) != 0 ||
        strcmp(unmapped(ip), addr))
        return;
    shutdown(fd, SHUT_RDWR);
}

/* A malformed message from our ROUTER's side: count it against the connection and cut
 * the connection once it has LINK_MAX_STRIKES. */
static void strike_in(struct link *l, struct route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                      int fd, const char *why)
{
    l->stats.malformed++;
    struct stranger *s = r ? NULL : stranger_find(l, rid, rid_len, true);
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
        set_unready(l, r, "cut after malformed messages");
    }
    shutdown_conn(fd, addr);
}

/* Refuses a HELLO: logged, answered with REJECT, the routing id ignored from then on. */
static void refuse_in(struct link *l, struct route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                      const char *peer, const char *reason)
{
    l->stats.refused++;
    log_warn("link %s: refused node %s at %s: %s", l->id, peer, addr, reason);
    send_reason(l, rid, rid_len, LINK_T_REJECT, reason);
    struct stranger *s = stranger_find(l, rid, rid_len, true);
    if (s) {
        s->banned = true;
        s->last = clock_ns();
    }
    if (r) {
        r->dead = true;
        set_unready(l, r, "refused");
    }
}

static void hello_in(struct link *l, struct route *r, const uint8_t *rid, size_t rid_len, const char *addr,
                     int fd, const struct link_hdr *h, zmq_msg_t *body)
{
    char ns[LINK_NS_MAX], why[160], shown[LINK_NS_MAX];
    int port = 0;
    if (parse_intro(body, ns, &port, why, sizeof why)) {
        strike_in(l, r, rid, rid_len, addr, fd, why);
        return;
    }
    if (strcmp(ns, l->ns)) {
        snprintf(why, sizeof why, "namespace '%s' is not ours ('%s')", printable(shown, sizeof shown, ns, strlen(ns)),
                 l->ns);
        refuse_in(l, r, rid, rid_len, addr, h->sender, why);
        return;
    }
    if (!strcmp(h->sender, l->id)) {
        refuse_in(l, r, rid, rid_len, addr, h->sender, "it has our own node id");
        return;
    }
    if (r && strcmp(r->peer, h->sender)) {
        set_unready(l, r, "node id changed");
        snprintf(r->peer, sizeof r->peer, "%s", h->sender);
    }
    if (!r) {
        if (l->n_routes >= LINK_MAX_ROUTES || rid_len > sizeof r->rid) {
            refuse_in(l, NULL, rid, rid_len, addr, h->sender, "too many connections");
            return;
        }
        r = calloc(1, sizeof *r);
        if (!r || add_route(l, r)) {
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
static int read_router(struct link *l, struct link_msg *out)
{
    zmq_msg_t parts[3];
    int total;
    int kept = recv_msg(l->router, parts, 3, &total);
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
    snprintf(addr, sizeof addr, "%.127s", a ? unmapped(a) : "?");
    int got = 0;

    struct stranger *s = stranger_find(l, rid, rid_len, false);
    if (s && s->banned)
        goto done;
    struct route *r = find_in_route(l, rid, rid_len);
    struct link_hdr h;
    char why[160];
    if (check_frames(l, parts + 1, kept - 1, total - 1, &h, why, sizeof why)) {
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
            send_frames(l, l->router, rid, rid_len, LINK_T_WHO, NULL, 0);
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
        set_unready(l, r, "it said bye");
    } else if (h.type >= LINK_T_APP_FIRST) {
        got = r->ready ? deliver(l, r, &h, &parts[2], out) : 0;
    }
done:
    close_parts(parts, kept);
    return got;
}

static void strike_out(struct link *l, struct route *r, const char *why)
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
    struct route *r = NULL;
    for (size_t i = 0; i < l->n_routes && !r; i++)
        if (l->routes[i] == l->held_route && !l->routes[i]->dead && !strcmp(l->routes[i]->peer, peer))
            r = l->routes[i];
    /* Not the message link_poll returned last: the peer's connection heard from last. */
    for (size_t i = 0; i < l->n_routes && !r; i++) {
        struct route *c = l->routes[i];
        if (live(c) && !strcmp(c->peer, peer))
            r = c;
    }
    for (size_t i = 0; r && r != l->held_route && i < l->n_routes; i++) {
        struct route *c = l->routes[i];
        if (live(c) && !strcmp(c->peer, peer) && c->last_rx > r->last_rx)
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
        struct route *c = l->routes[i];
        if (!live(c) || strcmp(c->peer, peer)) {
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
        struct stranger *s = stranger_find(l, c->rid, c->rid_len, true);
        if (s) {
            s->banned = true;
            s->last = clock_ns();
        }
        c->dead = true;
        set_unready(l, c, "cut after malformed messages");
        shutdown_conn(c->fd, c->endpoint);
        i++;
    }
}

static void welcome_out(struct link *l, struct route *r, const struct link_hdr *h, zmq_msg_t *body)
{
    char ns[LINK_NS_MAX], why[160], shown[LINK_NS_MAX];
    int port = 0;
    if (parse_intro(body, ns, &port, why, sizeof why)) {
        strike_out(l, r, why);
        return;
    }
    if (strcmp(ns, l->ns) || !strcmp(h->sender, l->id)) {
        l->stats.refused++;
        if (strcmp(ns, l->ns))
            log_warn("link %s: gave up on %s at %s: namespace '%s' is not ours ('%s')", l->id, h->sender,
                     r->endpoint, printable(shown, sizeof shown, ns, strlen(ns)), l->ns);
        else
            log_warn("link %s: gave up on %s: it is ourselves", l->id, r->endpoint);
        remove_route_ptr(l, r, "refused");
        return;
    }
    if (r->ready && strcmp(r->peer, h->sender))
        set_unready(l, r, "node id changed");
    snprintf(r->peer, sizeof r->peer, "%s", h->sender);
    r->port = port;
    r->last_rx = clock_ns();
    set_ready(l, r);
}

/* One message from a DEALER; returns 1 when it filled out. r may be freed. */
static int read_dealer(struct link *l, struct route *r, struct link_msg *out)
{
    zmq_msg_t parts[2];
    int total;
    int kept = recv_msg(r->sock, parts, 2, &total);
    if (kept < 0)
        return -1;
    int got = 0;
    struct link_hdr h;
    char why[160];
    if (check_frames(l, parts, kept, total, &h, why, sizeof why)) {
        strike_out(l, r, why);
        goto done;
    }
    switch (h.type) {
    case LINK_T_WELCOME:
        welcome_out(l, r, &h, &parts[1]);
        break;
    case LINK_T_REJECT: {
        json_t *j = json_loadb(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), 0, NULL);
        const char *reason = json_string_value(json_object_get(j, "reason"));
        char shown[200];
        l->stats.refused++;
        log_error("link %s: %s at %s refused us: %s", l->id, h.sender, r->endpoint,
                  reason ? printable(shown, sizeof shown, reason, strlen(reason)) : "no reason given");
        json_decref(j);
        remove_route_ptr(l, r, "refused");
        break;
    }
    case LINK_T_WHO:
        set_unready(l, r, "it no longer knows us");
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
            set_unready(l, r, "it said bye");
        else if (h.type >= LINK_T_APP_FIRST)
            got = deliver(l, r, &h, &parts[1], out);
    }
done:
    close_parts(parts, kept);
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
static int read_monitor(struct link *l, void *mon, struct route *r)
{
    zmq_msg_t parts[2];
    int total;
    int kept = recv_msg(mon, parts, 2, &total);
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
            set_unready(l, r, "connection lost");
        }
    }
    close_parts(parts, kept);
    return 0;
}

/* ---- timers --------------------------------------------------------------------------- */

static void tick(struct link *l, int64_t now)
{
    for (size_t i = 0; i < l->n_routes;) {
        struct route *r = l->routes[i];
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
            set_unready(l, r, why);
        }
        if (r->ready && now - r->last_tx >= (int64_t)l->hb_ms * MS)
            send_route(l, r, LINK_T_HEARTBEAT, NULL, 0);
        if (!r->ready && r->out && now - r->last_hello >= HELLO_RETRY_MS * MS)
            send_hello(l, r);
        i++;
    }
}

/* When the next timer of tick falls due (INT64_MAX when none). */
static int64_t next_due(const struct link *l)
{
    int64_t due = INT64_MAX;
    for (size_t i = 0; i < l->n_routes; i++) {
        const struct route *r = l->routes[i];
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

/* ---- poll -------------------------------------------------------------------------------- */

static bool grow_items(struct link *l, size_t need)
{
    if (need <= l->cap_items)
        return true;
    zmq_pollitem_t *it = realloc(l->items, need * sizeof *it);
    if (it)
        l->items = it;
    struct zwatch **iw = realloc(l->item_w, need * sizeof *iw);
    if (iw)
        l->item_w = iw;
    struct pollfd *pf = realloc(l->pfds, need * sizeof *pf);
    if (pf)
        l->pfds = pf;
    struct route **ir = realloc(l->item_route, need * sizeof *ir);
    if (ir)
        l->item_route = ir;
    enum item_kind *ik = realloc(l->item_kind, need * sizeof *ik);
    if (ik)
        l->item_kind = ik;
    if (!it || !iw || !pf || !ir || !ik)
        return false;
    l->cap_items = need;
    return true;
}

static void add_item(struct link *l, size_t *n, enum item_kind kind, void *sock, int fd, struct zwatch *w,
                     struct route *r)
{
    if (w && !w->fd1) {
        int zfd = -1;
        size_t sz = sizeof zfd;
        if (zmq_getsockopt(sock, ZMQ_FD, &zfd, &sz) == 0 && zfd >= 0)
            w->fd1 = zfd + 1;
    }
    size_t k = (*n)++;
    l->items[k] = (zmq_pollitem_t){.socket = sock, .fd = fd};
    l->item_w[k] = w;
    l->pfds[k] = (struct pollfd){.fd = w ? w->fd1 - 1 : fd, .events = POLLIN};
    l->item_route[k] = r;
    l->item_kind[k] = kind;
}

static int build_items(struct link *l, size_t *n_out)
{
    if (!grow_items(l, 2 + LINK_WAKE_FDS + 2 * l->n_routes))
        return CAIRN_ENOMEM;
    size_t n = 0;
    add_item(l, &n, ITEM_ROUTER, l->router, -1, &l->router_w, NULL);
    if (l->router_mon)
        add_item(l, &n, ITEM_ROUTER_MON, l->router_mon, -1, &l->router_mon_w, NULL);
    for (int i = 0; i < LINK_WAKE_FDS; i++)
        if (l->wake_fds[i])
            add_item(l, &n, ITEM_WAKE, NULL, l->wake_fds[i] - 1, NULL, NULL);
    for (size_t i = 0; i < l->n_routes; i++) {
        struct route *r = l->routes[i];
        if (!r->out)
            continue;
        add_item(l, &n, ITEM_DEALER, r->sock, -1, &r->sock_w, r);
        if (r->mon)
            add_item(l, &n, ITEM_DEALER_MON, r->mon, -1, &r->mon_w, r);
    }
    *n_out = n;
    return 0;
}

/* Whether a socket has a message to read (ZMQ_EVENTS); this may consume its edge. */
static bool zsock_readable(void *sock)
{
    int ev = 0;
    size_t sz = sizeof ev;
    return zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &sz) == 0 && (ev & ZMQ_POLLIN);
}

/* Reads up to DRAIN_BATCH messages from item k; 1 when out was filled. Stops early when
 * notices are waiting or the route table changed (items may point at freed routes). */
static int drain(struct link *l, size_t k, struct link_msg *out)
{
    uint64_t gen = l->gen;
    for (int i = 0; i < DRAIN_BATCH; i++) {
        int got;
        switch (l->item_kind[k]) {
        case ITEM_ROUTER:
            got = read_router(l, out);
            break;
        case ITEM_ROUTER_MON:
            got = read_monitor(l, l->router_mon, NULL);
            break;
        case ITEM_DEALER:
            got = read_dealer(l, l->item_route[k], out);
            break;
        default:
            got = read_monitor(l, l->item_route[k]->mon, l->item_route[k]);
            break;
        }
        if (got != 0)
            return got > 0 ? 1 : 0;
        if (l->n_notices || l->gen != gen)
            return 0;
    }
    return 0;
}

int link_poll(struct link *l, int timeout_ms, struct link_msg *out)
{
    if (!l || !out)
        return CAIRN_EINVAL;
    if (l->has_held) {
        zmq_msg_close(&l->held);
        l->has_held = false;
    }
    l->held_route = NULL;
    memset(out, 0, sizeof *out);
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : clock_ns() + (int64_t)timeout_ms * MS;
    for (;;) {
        if (pop_notice(l, out))
            return 1;
        int64_t now = clock_ns();
        tick(l, now);
        if (pop_notice(l, out))
            return 1;
        size_t n;
        if (build_items(l, &n))
            return CAIRN_ENOMEM;
        /* First the sockets that may hold messages, in turn from where the last call
         * left off; a socket found empty is quiet until its descriptor signals or a
         * send or receive touches it. */
        bool read_some = false;
        for (size_t i = 0; i < n; i++) {
            size_t k = (l->rr + i) % n;
            struct zwatch *w = l->item_w[k];
            if (!w || w->quiet)
                continue;
            if (!zsock_readable(l->items[k].socket)) {
                w->quiet = w->fd1 != 0; /* a socket without a descriptor is asked every time */
                continue;
            }
            uint64_t gen = l->gen;
            if (drain(l, k, out)) {
                l->rr = k + 1;
                return 1;
            }
            read_some = true;
            if (l->n_notices || l->gen != gen)
                break; /* the items may point at freed routes: build them again */
        }
        l->rr++;
        if (read_some)
            continue; /* what was read may have left more, or made notices */
        int64_t until = next_due(l);
        if (deadline < until)
            until = deadline;
        now = clock_ns();
        int wait_ms = until == INT64_MAX ? -1 : until <= now ? 0 : (int)((until - now + MS - 1) / MS);
        int rc = poll(l->pfds, n, wait_ms);
        if (rc < 0) {
            if (errno == EINTR)
                return 0;
            log_error("link %s: poll: %s", l->id, strerror(errno));
            return CAIRN_EIO;
        }
        for (size_t k = 0; rc > 0 && k < n; k++) {
            if (!l->pfds[k].revents)
                continue;
            if (l->item_kind[k] == ITEM_WAKE)
                return 0; /* the owner has work of its own; it drains the fd */
            l->item_w[k]->quiet = false;
        }
        if (clock_ns() >= deadline && !l->n_notices)
            return 0;
    }
}

void link_set_wake_fd(struct link *l, int slot, int fd)
{
    if (l && slot >= 0 && slot < LINK_WAKE_FDS)
        l->wake_fds[slot] = fd >= 0 ? fd + 1 : 0;
}

/* ---- peers and stats -------------------------------------------------------------------- */

size_t link_peers(const struct link *l, struct link_peer *out, size_t max)
{
    size_t count = 0;
    int64_t now = clock_ns();
    for (size_t i = 0; l && i < l->n_routes; i++) {
        const struct route *r = l->routes[i];
        if (!live(r))
            continue;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++)
            seen = live(l->routes[k]) && !strcmp(l->routes[k]->peer, r->peer);
        if (seen)
            continue;
        if (count < max) {
            struct link_peer *p = &out[count];
            memset(p, 0, sizeof *p);
            snprintf(p->id, sizeof p->id, "%s", r->peer);
            int64_t last = 0;
            for (size_t k = i; k < l->n_routes; k++) {
                const struct route *c = l->routes[k];
                if (!live(c) || strcmp(c->peer, r->peer))
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

int link_port(const struct link *l) { return l ? l->port : -1; }

/* ---- ZAP handler (RFC 27) ------------------------------------------------------------------ */

static bool frame_is(zmq_msg_t *m, const char *s)
{
    return zmq_msg_size(m) == strlen(s) && !memcmp(zmq_msg_data(m), s, strlen(s));
}

static void zap_serve(struct zap *z)
{
    zmq_msg_t f[8];
    int total;
    int kept = recv_msg(z->sock, f, 8, &total);
    if (kept < 0)
        return;
    const char *status = "400", *text = "not the cluster key";
    if (kept < 2 || !frame_is(&f[0], "1.0")) {
        status = "500";
        text = "bad ZAP request";
    } else if (total < 7 || kept < 7) {
        status = "500";
        text = "short ZAP request";
    } else if (!frame_is(&f[2], LINK_ZAP_DOMAIN)) {
        text = "wrong ZAP domain";
    } else if (!frame_is(&f[5], "CURVE")) {
        text = "not CURVE";
    } else if (zmq_msg_size(&f[6]) == LINK_KEY_BYTES && !sodium_memcmp(zmq_msg_data(&f[6]), z->pk, LINK_KEY_BYTES)) {
        status = "200";
        text = "OK";
    }
    zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
    if (kept >= 2)
        zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, status, 3, ZMQ_SNDMORE);
    zmq_send(z->sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, 0);
    if (strcmp(status, "200")) {
        uint64_t n = atomic_fetch_add(&z->denied, 1) + 1;
        char addr[64] = "?";
        if (kept >= 4)
            printable(addr, sizeof addr, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
        const char *shown = unmapped(addr);
        if (n <= 10 || n % 1000 == 0)
            log_warn("link %s: refused a connection from %s: %s (%llu refused so far)", z->node_id, shown, text,
                     (unsigned long long)n);
    }
    close_parts(f, kept);
}

static void *zap_main(void *arg)
{
    struct zap *z = arg;
    zmq_pollitem_t it[2] = {{.socket = z->sock, .events = ZMQ_POLLIN}, {.socket = z->stop, .events = ZMQ_POLLIN}};
    for (;;) {
        if (zmq_poll(it, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (it[1].revents & ZMQ_POLLIN)
            break;
        if (it[0].revents & ZMQ_POLLIN)
            zap_serve(z);
    }
    zmq_close(z->sock);
    zmq_close(z->stop);
    return NULL;
}

/* ---- create, connect, release ---------------------------------------------------------------- */

static void *monitor_open(struct link *l, void *sock, int events)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://cairn-link-monitor-%d", l->next_mon++);
    if (zmq_socket_monitor(sock, ep, events) != 0)
        return NULL;
    void *m = zmq_socket(l->ctx, ZMQ_PAIR);
    if (!m || zmq_connect(m, ep) != 0) {
        if (m)
            zmq_close(m);
        zmq_socket_monitor(sock, NULL, 0);
        return NULL;
    }
    set_int(m, ZMQ_LINGER, 0);
    return m;
}

/* Options every socket of the link has. */
static void common_options(const struct link *l, void *s)
{
    int64_t max = (int64_t)(l->max_msg > LINK_HDR_SIZE ? l->max_msg : LINK_HDR_SIZE);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    set_int(s, ZMQ_LINGER, 0);
    set_int(s, ZMQ_SNDHWM, 10000);
    set_int(s, ZMQ_RCVHWM, 10000);
    set_int(s, ZMQ_HEARTBEAT_IVL, l->hb_ms);
    set_int(s, ZMQ_HEARTBEAT_TIMEOUT, l->timeout_ms);
    set_int(s, ZMQ_HEARTBEAT_TTL, l->timeout_ms < 6553500 ? l->timeout_ms : 6553500);
    set_int(s, ZMQ_HANDSHAKE_IVL, 2 * l->timeout_ms > 5000 ? 2 * l->timeout_ms : 5000);
    set_int(s, ZMQ_IPV6, 1);
}

static int security_options(const struct link *l, void *s, bool server, char *err, size_t errlen)
{
    if (!l->secure)
        return 0;
    int one = 1;
    int rc;
    if (server)
        rc = zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) ||
             zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, l->sk, LINK_KEY_BYTES) ||
             zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, LINK_ZAP_DOMAIN, strlen(LINK_ZAP_DOMAIN));
    else
        rc = zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, l->pk, LINK_KEY_BYTES) ||
             zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, l->pk, LINK_KEY_BYTES) ||
             zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, l->sk, LINK_KEY_BYTES);
    if (rc)
        return cairn_fail(err, errlen, CAIRN_EIO, "CURVE options: %s", zmq_strerror(errno));
    /* Without this, a server socket whose ZAP handler is missing would admit anyone. */
    if (server && zmq_setsockopt(s, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0)
        log_debug("link %s: ZMQ_ZAP_ENFORCE_DOMAIN unavailable (%s); the ZAP handler is bound first", l->id,
                  zmq_strerror(errno));
    return 0;
}

static int start_zap(struct link *l, char *err, size_t errlen)
{
    struct zap *z = &l->zap;
    memcpy(z->pk, l->pk, LINK_KEY_BYTES);
    memcpy(z->node_id, l->id, LINK_ID_MAX);
    z->sock = zmq_socket(l->ctx, ZMQ_REP);
    z->stop = zmq_socket(l->ctx, ZMQ_PAIR);
    l->zap_stop = zmq_socket(l->ctx, ZMQ_PAIR);
    if (!z->sock || !z->stop || !l->zap_stop)
        goto fail;
    set_int(z->sock, ZMQ_LINGER, 0);
    set_int(z->stop, ZMQ_LINGER, 0);
    set_int(l->zap_stop, ZMQ_LINGER, 0);
    if (zmq_bind(z->sock, ZAP_ENDPOINT) || zmq_bind(z->stop, "inproc://cairn-link-zap-stop") ||
        zmq_connect(l->zap_stop, "inproc://cairn-link-zap-stop"))
        goto fail;
    /* The thread takes no signals: they stay with the node's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&l->zap_thread, NULL, zap_main, z);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        goto fail;
    }
    l->zap_running = true;
    return 0;
fail:;
    int e = errno;
    if (z->sock)
        zmq_close(z->sock);
    if (z->stop)
        zmq_close(z->stop);
    z->sock = z->stop = NULL;
    return cairn_fail(err, errlen, CAIRN_EIO, "ZAP handler: %s", zmq_strerror(e));
}

int link_create(struct link **out, const struct link_config *cfg, char *err, size_t errlen)
{
    if (!out || !cfg)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "link_create: NULL argument");
    *out = NULL;
    if (!link_valid_id(cfg->node_id))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "node id must be 1..%d printable ASCII bytes without spaces",
                          LINK_ID_MAX - 1);
    const char *ns = cfg->ns ? cfg->ns : "";
    if (strlen(ns) >= LINK_NS_MAX)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "namespace longer than %d bytes", LINK_NS_MAX - 1);
    for (const char *p = ns; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "namespace holds byte 0x%02x", (unsigned char)*p);
    if (cfg->port < 0 || cfg->port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "port %d out of 0..65535", cfg->port);
    if (cfg->heartbeat_ms < 0 || cfg->timeout_ms < 0 || cfg->heartbeat_ms > 3600000 || cfg->timeout_ms > 3600000)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "heartbeat %d ms / timeout %d ms out of range",
                          cfg->heartbeat_ms, cfg->timeout_ms);
    int hb = cfg->heartbeat_ms ? cfg->heartbeat_ms : LINK_HEARTBEAT_MS_DEFAULT;
    int to = cfg->timeout_ms ? cfg->timeout_ms : LINK_TIMEOUT_MS_DEFAULT;
    if (to <= hb)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "timeout %d ms must exceed the heartbeat %d ms", to, hb);
    size_t max_msg = cfg->max_msg ? cfg->max_msg : LINK_MAX_MSG_DEFAULT;
    if (max_msg < 1024 || max_msg > LINK_MAX_MSG_LIMIT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_msg %zu out of 1024..%zu", max_msg, LINK_MAX_MSG_LIMIT);
    const char *bind_addr = cfg->bind_addr ? cfg->bind_addr : "*";
    if (!*bind_addr || strlen(bind_addr) > 200 || strpbrk(bind_addr, "/ "))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "bad bind address '%s'", bind_addr);

    /* CZMQ (discovery) may share this process: it must never install its own handlers. */
    zsys_handler_set(NULL);

    struct link *l = calloc(1, sizeof *l);
    if (!l)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    snprintf(l->id, sizeof l->id, "%s", cfg->node_id);
    snprintf(l->ns, sizeof l->ns, "%s", ns);
    l->hb_ms = hb;
    l->timeout_ms = to;
    l->max_msg = max_msg;
    atomic_init(&l->zap.denied, 0);
    int rc;
    if (cfg->secret && *cfg->secret) {
        l->secure = true;
        if ((rc = link_curve_keypair(cfg->secret, l->pk, l->sk))) {
            cairn_fail(err, errlen, rc, "cannot derive the cluster keys (libsodium)");
            goto fail;
        }
    }
    l->ctx = zmq_ctx_new();
    if (!l->ctx) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto fail;
    }
    zmq_ctx_set(l->ctx, ZMQ_BLOCKY, 0);
    if (l->secure && (rc = start_zap(l, err, errlen)))
        goto fail;

    l->router = zmq_socket(l->ctx, ZMQ_ROUTER);
    if (!l->router) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "ROUTER socket: %s", zmq_strerror(errno));
        goto fail;
    }
    common_options(l, l->router);
    set_int(l->router, ZMQ_ROUTER_MANDATORY, 1);
    if ((rc = security_options(l, l->router, true, err, errlen)))
        goto fail;
    l->router_mon = monitor_open(l, l->router,
                                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    char ep[256];
    if (cfg->port)
        snprintf(ep, sizeof ep, "tcp://%s:%d", bind_addr, cfg->port);
    else
        snprintf(ep, sizeof ep, "tcp://%s:*", bind_addr);
    if (zmq_bind(l->router, ep) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "bind %s: %s", ep, zmq_strerror(errno));
        goto fail;
    }
    char last[256] = "";
    size_t last_len = sizeof last;
    zmq_getsockopt(l->router, ZMQ_LAST_ENDPOINT, last, &last_len);
    const char *colon = strrchr(last, ':');
    l->port = colon ? atoi(colon + 1) : 0;
    if (l->port <= 0 || l->port > 65535) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "bound %s but cannot read the port", last);
        goto fail;
    }
    log_info("link %s: listening on %s (%s, namespace '%s')", l->id, last,
             l->secure ? "CURVE with the cluster secret" : "no cluster secret: unencrypted", l->ns);
    *out = l;
    return 0;
fail:
    link_release(l);
    return rc;
}

int link_connect(struct link *l, const char *endpoint, char *err, size_t errlen)
{
    if (!l || !endpoint)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "link_connect: NULL argument");
    if (strncmp(endpoint, "tcp://", 6) || strlen(endpoint) >= LINK_ADDR_MAX || !strchr(endpoint + 6, ':'))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "endpoint '%.64s' is not tcp://host:port", endpoint);
    for (size_t i = 0; i < l->n_routes; i++)
        if (l->routes[i]->out && !strcmp(l->routes[i]->endpoint, endpoint))
            return 0;
    if (l->n_routes >= LINK_MAX_ROUTES)
        return cairn_fail(err, errlen, CAIRN_EFULL, "already %d connections", LINK_MAX_ROUTES);
    struct route *r = calloc(1, sizeof *r);
    if (!r)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    r->out = true;
    r->fd = -1;
    snprintf(r->endpoint, sizeof r->endpoint, "%s", endpoint);
    r->sock = zmq_socket(l->ctx, ZMQ_DEALER);
    int rc;
    if (!r->sock) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "DEALER socket: %s", zmq_strerror(errno));
        goto fail;
    }
    common_options(l, r->sock);
    set_int(r->sock, ZMQ_IMMEDIATE, 1); /* nothing queues for a peer not connected */
    set_int(r->sock, ZMQ_RECONNECT_IVL, 100);
    set_int(r->sock, ZMQ_RECONNECT_IVL_MAX, 5000);
    if ((rc = security_options(l, r->sock, false, err, errlen)))
        goto fail;
    r->mon = monitor_open(l, r->sock,
                          ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                              ZMQ_EVENT_DISCONNECTED);
    if (zmq_connect(r->sock, endpoint) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "connect %s: %s", endpoint, zmq_strerror(errno));
        goto fail;
    }
    r->last_rx = r->last_tx = clock_ns();
    if ((rc = add_route(l, r))) {
        cairn_fail(err, errlen, rc, "out of memory");
        goto fail;
    }
    log_debug("link %s: connecting to %s", l->id, endpoint);
    return 0;
fail:
    free_route(r, 0);
    return rc;
}

int link_disconnect(struct link *l, const char *endpoint)
{
    if (!l || !endpoint)
        return CAIRN_EINVAL;
    for (size_t i = 0; i < l->n_routes; i++) {
        struct route *r = l->routes[i];
        if (!r->out || strcmp(r->endpoint, endpoint))
            continue;
        bool bye = live(r) && send_route(l, r, LINK_T_BYE, NULL, 0) == 0;
        r->dead = true;
        set_unready(l, r, "disconnected by us");
        l->routes[i] = l->routes[--l->n_routes];
        l->gen++;
        if (l->held_route == r)
            l->held_route = NULL;
        free_route(r, bye ? BYE_LINGER_MS : 0);
        return 0;
    }
    return CAIRN_ENOTFOUND;
}

void link_release(struct link *l)
{
    if (!l)
        return;
    if (l->has_held)
        zmq_msg_close(&l->held);
    /* Bye first, on every connection, then close: a DEALER lingers so its bye leaves. */
    for (size_t i = 0; i < l->n_routes; i++) {
        struct route *r = l->routes[i];
        r->ready = live(r) && send_frames(l, r->out ? r->sock : l->router, r->out ? NULL : r->rid, r->rid_len,
                                          LINK_T_BYE, NULL, 0) == 0;
    }
    for (size_t i = 0; i < l->n_routes; i++)
        free_route(l->routes[i], l->routes[i]->ready && l->routes[i]->out ? BYE_LINGER_MS : 0);
    free(l->routes);
    if (l->router) {
        zmq_socket_monitor(l->router, NULL, 0);
        close_with_linger(l->router, BYE_LINGER_MS);
    }
    close_with_linger(l->router_mon, 0);
    if (l->zap_running) {
        zmq_send(l->zap_stop, "", 0, 0);
        pthread_join(l->zap_thread, NULL);
    }
    close_with_linger(l->zap_stop, 0);
    if (l->ctx)
        zmq_ctx_term(l->ctx);
    free(l->notices);
    free(l->items);
    free(l->item_w);
    free(l->pfds);
    free(l->item_route);
    free(l->item_kind);
    sodium_memzero(l->sk, sizeof l->sk);
    free(l);
}
