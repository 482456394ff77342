/* Private to the link (link.h), shared by its three files and included by no other:
 * link_wire.c (the message header, keys and the HMAC challenge, reading a message's
 * frames, the HELLO / WELCOME payload), link_peer.c (the table of connections and
 * peers, sending, receiving and the link's handshake, strikes, timers) and link.c
 * (sockets and options, the ZAP handler, link_poll's loop, create / connect /
 * release). */
#ifndef CAIRN_NET_LINK_INT_H
#define CAIRN_NET_LINK_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "net/link.h"

#define LINK_STRANGERS 64 /* routing ids without a route that we keep strikes for */

/* How link_poll waits on one ZeroMQ socket. A socket signals through a file descriptor
 * (ZMQ_FD) that is edge-triggered: it turns readable when the socket's state may have
 * changed, and any send or receive on the socket may consume that edge. So a socket is
 * quiet only after ZMQ_EVENTS showed nothing to read with no send or receive since;
 * link_poll asks ZMQ_EVENTS of the other sockets only and sleeps in one poll() on every
 * descriptor. (zmq_poll asked every socket every time, two system calls each: with many
 * peers that was most of an idle node's work.) Zeroed: descriptor unknown, not quiet. */
struct link_zwatch {
    int fd1;    /* ZMQ_FD + 1; 0 until asked */
    bool quiet;
};

/* One connection: one we opened (a DEALER), or one a peer opened to our ROUTER. */
struct link_route {
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
    struct link_zwatch sock_w, mon_w;  /* out: how link_poll waits on the DEALER and its monitor */
    int strikes;
    int64_t last_rx, last_tx, last_hello, last_fail_log; /* clock_ns */
};

/* A routing id of our ROUTER that has no route (yet): strikes and bans. */
struct link_stranger {
    uint8_t rid[256];
    size_t rid_len;
    int strikes;
    bool banned;
    int64_t last;
};

/* A peer up or down, waiting for link_poll to return it. */
struct link_notice {
    enum link_event event;
    char peer[LINK_ID_MAX];
};

/* What the ZAP thread reads; written before the thread starts, except denied. */
struct link_zap {
    void *sock, *stop;
    uint8_t pk[LINK_KEY_BYTES];
    char node_id[LINK_ID_MAX];
    _Atomic uint64_t denied;
};

/* What one entry of link_poll's wait list is. */
enum link_item { LINK_ITEM_ROUTER, LINK_ITEM_ROUTER_MON, LINK_ITEM_DEALER, LINK_ITEM_DEALER_MON, LINK_ITEM_WAKE };

/* The link: opaque outside src/net (link.h). */
struct link {
    char id[LINK_ID_MAX], ns[LINK_NS_MAX];
    bool secure;
    uint8_t pk[LINK_KEY_BYTES], sk[LINK_KEY_BYTES];
    int port, hb_ms, timeout_ms;
    size_t max_msg;

    void *ctx, *router, *router_mon, *zap_stop;
    struct link_zap zap;
    pthread_t zap_thread;
    bool zap_running;
    int64_t router_fail_log;
    int next_mon;

    struct link_route **routes;
    size_t n_routes, cap_routes;
    uint64_t gen; /* bumped whenever routes are added or removed */
    struct link_stranger strangers[LINK_STRANGERS];

    struct link_notice *notices;
    size_t notice_head, n_notices, cap_notices;

    zmq_msg_t held; /* payload of the message link_poll returned last */
    bool has_held;
    const struct link_route *held_route; /* where it came from (compared, never read: link_strike) */

    int wake_fds[LINK_WAKE_FDS]; /* + 1: 0 is none (link_set_wake_fd) */

    struct link_zwatch router_w, router_mon_w;
    zmq_pollitem_t *items;  /* socket, or fd for LINK_ITEM_WAKE */
    struct link_zwatch **item_w; /* NULL for LINK_ITEM_WAKE */
    struct pollfd *pfds;
    struct link_route **item_route;
    enum link_item *item_kind;
    size_t cap_items, rr;

    struct link_stats stats;
};

/* ---- link_wire.c ---- */

/* Copies at most n - 1 bytes of s (len bytes) into dst for a log line, with '?' for
 * unprintable bytes; returns dst. */
const char *link_printable(char *dst, size_t n, const char *s, size_t len);
/* "::ffff:1.2.3.4" (IPv4 on a dual-stack socket) as "1.2.3.4"; other text as it is. */
const char *link_unmapped(const char *ip);
/* Receives one whole message from sock without waiting: keeps its first keep frames in
 * parts (initialized; the caller closes them with link_close_parts), drops the rest,
 * and returns how many it kept, or -1 when no message was waiting; *total is its frame
 * count. */
int link_recv_msg(void *sock, zmq_msg_t *parts, int keep, int *total);
/* Closes the first n of parts. */
void link_close_parts(zmq_msg_t *parts, int n);
/* Checks the frames of a message after its routing id: exactly a header and a payload
 * that agree, within l's max_msg. CAIRN_EFORMAT with the reason in why. */
int link_check_frames(const struct link *l, zmq_msg_t *parts, int kept, int total, struct link_hdr *h,
                      char *why, size_t whylen);
/* The payload of our HELLO and WELCOME, {"namespace", "port"}, in a string the caller
 * frees; NULL when out of memory. */
char *link_intro_payload(const struct link *l, size_t *len);
/* Reads a HELLO or WELCOME payload: the namespace (printable, under LINK_NS_MAX bytes)
 * and the port. CAIRN_EFORMAT with the reason in why. */
int link_parse_intro(zmq_msg_t *body, char ns[LINK_NS_MAX], int *port, char *why, size_t whylen);

/* The reason in a REJECT payload ({"reason"}) as printable text in dst (n bytes, cut
 * short, '?' for unprintable bytes), or "no reason given"; returns dst. */
const char *link_reject_reason(const void *payload, size_t len, char *dst, size_t n);

/* ---- link_peer.c ---- */

/* True when r's handshake is done and its connection not gone. */
bool link_live(const struct link_route *r);
/* Marks r not ready; the peer goes down (a notice) when it has no other live route. */
void link_set_unready(struct link *l, struct link_route *r, const char *why);
/* Adds r to the table, which owns it from then on. CAIRN_ENOMEM. */
int link_add_route(struct link *l, struct link_route *r);
/* Sends one message (header and payload) on sock, to routing id rid when not NULL
 * (our ROUTER), without waiting. Returns 0, CAIRN_ENOTFOUND (no such connection),
 * CAIRN_EFULL (its queue is full) or CAIRN_EIO. */
int link_send_frames(struct link *l, void *sock, const uint8_t *rid, size_t rid_len, int type,
                     const void *payload, size_t len);
/* Sends on route r as link_send_frames does; an incoming route whose connection is gone
 * is marked dead. */
int link_send_route(struct link *l, struct link_route *r, int type, const void *payload, size_t len);
/* Takes the oldest peer up/down notice into out; false when there is none. */
bool link_pop_notice(struct link *l, struct link_msg *out);
/* Reads one message from our ROUTER; returns 1 when it filled out, 0 when it was the
 * link's own or dropped, -1 when none was waiting. */
int link_read_router(struct link *l, struct link_msg *out);
/* Reads one message from r's DEALER, as link_read_router; r may be freed. */
int link_read_dealer(struct link *l, struct link_route *r, struct link_msg *out);
/* Reads one monitor event from mon, of our ROUTER (r NULL) or of r's DEALER; 0, or -1
 * when none was waiting. */
int link_read_monitor(struct link *l, void *mon, struct link_route *r);
/* Runs the timers due at now: removes dead routes, times silent peers out, sends
 * heartbeats and repeats HELLOs. */
void link_tick(struct link *l, int64_t now);
/* When the next timer of link_tick falls due (clock_ns; INT64_MAX when none). */
int64_t link_next_due(const struct link *l);

/* ---- link.c ---- */

/* Closes r's sockets (the DEALER lingers linger_ms for what it still has to send) and
 * frees r. */
void link_free_route(struct link_route *r, int linger_ms);

#endif
