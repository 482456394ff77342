/* The link (link.h): its sockets and their options, the ZAP handler, link_poll's wait
 * on every socket, and create / connect / disconnect / release. Messages and keys are
 * in link_wire.c, the table of connections and peers in link_peer.c. */
#include "net/link_int.h"

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#include <czmq.h> /* zsys_handler_set only; the link itself speaks libzmq */
#include <errno.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a draft option of libzmq 4.3; Debian builds it in */
#endif

#define BYE_LINGER_MS 100      /* how long release/disconnect waits for a BYE to leave */
#define DRAIN_BATCH 64         /* messages read from one socket per wake-up */
#define MS 1000000LL           /* ns */

static const char *const ZAP_ENDPOINT = "inproc://zeromq.zap.01";

/* ---- sockets ---------------------------------------------------------------------- */

static void set_int(void *sock, int opt, int v) { zmq_setsockopt(sock, opt, &v, sizeof v); }

static void close_with_linger(void *sock, int linger_ms)
{
    if (!sock)
        return;
    set_int(sock, ZMQ_LINGER, linger_ms);
    zmq_close(sock);
}

void link_free_route(struct link_route *r, int linger_ms)
{
    if (r->sock)
        zmq_socket_monitor(r->sock, NULL, 0);
    close_with_linger(r->mon, 0);
    close_with_linger(r->sock, linger_ms);
    free(r);
}

/* ---- poll -------------------------------------------------------------------------------- */

static bool grow_items(struct link *l, size_t need)
{
    if (need <= l->cap_items)
        return true;
    zmq_pollitem_t *it = realloc(l->items, need * sizeof *it);
    if (it)
        l->items = it;
    struct link_zwatch **iw = realloc(l->item_w, need * sizeof *iw);
    if (iw)
        l->item_w = iw;
    struct pollfd *pf = realloc(l->pfds, need * sizeof *pf);
    if (pf)
        l->pfds = pf;
    struct link_route **ir = realloc(l->item_route, need * sizeof *ir);
    if (ir)
        l->item_route = ir;
    enum link_item *ik = realloc(l->item_kind, need * sizeof *ik);
    if (ik)
        l->item_kind = ik;
    if (!it || !iw || !pf || !ir || !ik)
        return false;
    l->cap_items = need;
    return true;
}

static void add_item(struct link *l, size_t *n, enum link_item kind, void *sock, int fd, struct link_zwatch *w,
                     struct link_route *r)
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
    add_item(l, &n, LINK_ITEM_ROUTER, l->router, -1, &l->router_w, NULL);
    if (l->router_mon)
        add_item(l, &n, LINK_ITEM_ROUTER_MON, l->router_mon, -1, &l->router_mon_w, NULL);
    for (int i = 0; i < LINK_WAKE_FDS; i++)
        if (l->wake_fds[i])
            add_item(l, &n, LINK_ITEM_WAKE, NULL, l->wake_fds[i] - 1, NULL, NULL);
    for (size_t i = 0; i < l->n_routes; i++) {
        struct link_route *r = l->routes[i];
        if (!r->out)
            continue;
        add_item(l, &n, LINK_ITEM_DEALER, r->sock, -1, &r->sock_w, r);
        if (r->mon)
            add_item(l, &n, LINK_ITEM_DEALER_MON, r->mon, -1, &r->mon_w, r);
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
        case LINK_ITEM_ROUTER:
            got = link_read_router(l, out);
            break;
        case LINK_ITEM_ROUTER_MON:
            got = link_read_monitor(l, l->router_mon, NULL);
            break;
        case LINK_ITEM_DEALER:
            got = link_read_dealer(l, l->item_route[k], out);
            break;
        default:
            got = link_read_monitor(l, l->item_route[k]->mon, l->item_route[k]);
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
        if (link_pop_notice(l, out))
            return 1;
        int64_t now = clock_ns();
        link_tick(l, now);
        if (link_pop_notice(l, out))
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
            struct link_zwatch *w = l->item_w[k];
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
        int64_t until = link_next_due(l);
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
            if (l->item_kind[k] == LINK_ITEM_WAKE)
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

int link_port(const struct link *l) { return l ? l->port : -1; }

/* ---- ZAP handler (RFC 27) ------------------------------------------------------------------ */

static bool frame_is(zmq_msg_t *m, const char *s)
{
    return zmq_msg_size(m) == strlen(s) && !memcmp(zmq_msg_data(m), s, strlen(s));
}

static void zap_serve(struct link_zap *z)
{
    zmq_msg_t f[8];
    int total;
    int kept = link_recv_msg(z->sock, f, 8, &total);
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
            link_printable(addr, sizeof addr, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
        const char *shown = link_unmapped(addr);
        if (n <= 10 || n % 1000 == 0)
            log_warn("link %s: refused a connection from %s: %s (%llu refused so far)", z->node_id, shown, text,
                     (unsigned long long)n);
    }
    link_close_parts(f, kept);
}

static void *zap_main(void *arg)
{
    struct link_zap *z = arg;
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
    struct link_zap *z = &l->zap;
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
    struct link_route *r = calloc(1, sizeof *r);
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
    if ((rc = link_add_route(l, r))) {
        cairn_fail(err, errlen, rc, "out of memory");
        goto fail;
    }
    log_debug("link %s: connecting to %s", l->id, endpoint);
    return 0;
fail:
    link_free_route(r, 0);
    return rc;
}

int link_disconnect(struct link *l, const char *endpoint)
{
    if (!l || !endpoint)
        return CAIRN_EINVAL;
    for (size_t i = 0; i < l->n_routes; i++) {
        struct link_route *r = l->routes[i];
        if (!r->out || strcmp(r->endpoint, endpoint))
            continue;
        bool bye = link_live(r) && link_send_route(l, r, LINK_T_BYE, NULL, 0) == 0;
        r->dead = true;
        link_set_unready(l, r, "disconnected by us");
        l->routes[i] = l->routes[--l->n_routes];
        l->gen++;
        if (l->held_route == r)
            l->held_route = NULL;
        link_free_route(r, bye ? BYE_LINGER_MS : 0);
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
        struct link_route *r = l->routes[i];
        r->ready = link_live(r) && link_send_frames(l, r->out ? r->sock : l->router, r->out ? NULL : r->rid, r->rid_len,
                                          LINK_T_BYE, NULL, 0) == 0;
    }
    for (size_t i = 0; i < l->n_routes; i++)
        link_free_route(l->routes[i], l->routes[i]->ready && l->routes[i]->out ? BYE_LINGER_MS : 0);
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
