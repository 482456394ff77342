/* Opening data-plane connections (dataplane.h): sockets, the handshake, dp_listen,
 * dp_accept and dp_connect; dp_conn_start (dataplane.c) takes a connection over once
 * its handshake is done. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "runner/dataplane_int.h"

#define MS ((int64_t)1000000)      /* ns */
#define CONNECT_RETRY_MS 100
#define REJECT_DRAIN_MS 500        /* after a REJECT, wait this long for the peer to close */

/* ---- socket helpers ---- */

static int set_sockopts(int fd, int user_timeout_ms, char *err, size_t errlen)
{
    int one = 1, idle = 1, intvl = 1, cnt = 3;
    unsigned ut = (unsigned)user_timeout_ms;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt TCP_NODELAY: %s", strerror(errno));
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt SO_KEEPALIVE: %s", strerror(errno));
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt TCP_KEEPIDLE: %s", strerror(errno));
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt TCP_KEEPINTVL: %s", strerror(errno));
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt TCP_KEEPCNT: %s", strerror(errno));
    if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut))
        return cairn_fail(err, errlen, CAIRN_EIO, "setsockopt TCP_USER_TIMEOUT: %s", strerror(errno));
    return 0;
}

/* The peer's address as "ip:port" ("[ip]:port" for IPv6), or "?". */
static void peer_text(int fd, char *out, size_t outlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(out, outlen, "?");
    } else if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, outlen, "%s:%d", ip, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, outlen, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        snprintf(out, outlen, "?");
    }
}

static int remaining_ms(int64_t deadline)
{
    int64_t left = deadline - clock_ns();
    if (left <= 0)
        return 0;
    int64_t ms = (left + MS - 1) / MS;
    return ms > 1000000 ? 1000000 : (int)ms;
}

/* Writes all of buf before deadline (non-blocking socket). */
static int write_all(int fd, const void *buf, size_t len, int64_t deadline, char *err, size_t errlen)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return cairn_fail(err, errlen, CAIRN_EIO, "send: %s", strerror(errno));
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int ms = remaining_ms(deadline);
        if (ms == 0)
            return cairn_fail(err, errlen, CAIRN_EIO, "timed out sending");
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
            return cairn_fail(err, errlen, CAIRN_EIO, "poll: %s", strerror(errno));
    }
    return 0;
}

/* Reads exactly len bytes before deadline. */
static int read_all(int fd, void *buf, size_t len, int64_t deadline, char *err, size_t errlen)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return cairn_fail(err, errlen, CAIRN_EIO, "connection closed by the peer");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return cairn_fail(err, errlen, CAIRN_EIO, "recv: %s", strerror(errno));
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = remaining_ms(deadline);
        if (ms == 0)
            return cairn_fail(err, errlen, CAIRN_EIO, "timed out waiting for the peer");
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
            return cairn_fail(err, errlen, CAIRN_EIO, "poll: %s", strerror(errno));
    }
    return 0;
}

/* ---- handshake ---- */

static int hs_send(int fd, int type, const void *payload, size_t len, int64_t deadline, char *err,
                   size_t errlen)
{
    uint8_t buf[DP_HDR_SIZE + DP_HANDSHAKE_MAX];
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = (uint8_t)type, .len = (uint32_t)len};
    dp_hdr_pack(buf, &h);
    if (len)
        memcpy(buf + DP_HDR_SIZE, payload, len);
    return write_all(fd, buf, DP_HDR_SIZE + len, deadline, err, errlen);
}

/* Reads one handshake frame into payload (DP_HANDSHAKE_MAX + 1 bytes, NUL-terminated). */
static int hs_recv(int fd, int *type, uint8_t *payload, size_t *len, int64_t deadline, char *err,
                   size_t errlen)
{
    uint8_t hb[DP_HDR_SIZE];
    struct dp_hdr h;
    int rc = read_all(fd, hb, sizeof hb, deadline, err, errlen);
    if (rc)
        return rc;
    if (dp_hdr_parse(hb, &h, DP_HANDSHAKE_MAX, err, errlen))
        return CAIRN_EFORMAT;
    if (!dp_type_is_handshake(h.type))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unexpected %s frame during the handshake",
                          dp_type_name(h.type));
    rc = read_all(fd, payload, h.len, deadline, err, errlen);
    if (rc)
        return rc;
    if ((h.flags & DP_F_PAYLOAD_CRC) && dp_crc32c(0, payload, h.len) != h.payload_crc)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad payload checksum");
    payload[h.len] = 0;
    if (h.type == DP_T_REJECT) /* a reason for logs: printable ASCII only */
        for (size_t i = 0; i < h.len; i++)
            if (payload[i] < 0x20 || payload[i] > 0x7e)
                payload[i] = '?';
    *type = h.type;
    *len = h.len;
    return 0;
}

/* Tells the peer why we refuse, then closes our side and waits briefly for it to
 * close, so the REJECT is read before any reset. */
static void hs_reject(int fd, const char *reason)
{
    size_t len = strnlen(reason, DP_REASON_MAX);
    int64_t deadline = clock_ns() + REJECT_DRAIN_MS * MS;
    if (hs_send(fd, DP_T_REJECT, reason, len, deadline, NULL, 0))
        return;
    shutdown(fd, SHUT_WR);
    uint8_t sink[512];
    for (;;) {
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return;
        if (n > 0)
            continue;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = remaining_ms(deadline);
        if (ms == 0 || poll(&pfd, 1, ms) <= 0)
            return;
    }
}

/* The peer's answer to our step: REJECT (with its reason) or another type than want
 * (or a non-empty OK) end the handshake with an error in err. */
static int expect(int type, const uint8_t *payload, size_t len, int want, char *err, size_t errlen)
{
    if (type == DP_T_REJECT)
        return cairn_fail(err, errlen, CAIRN_EIO, "refused by the peer: %s", (const char *)payload);
    if (type != want || (want == DP_T_OK && len != 0))
        return cairn_fail(err, errlen, CAIRN_EIO, "expected %s, got %s", dp_type_name(want), dp_type_name(type));
    return 0;
}

/* Sends our frame of a step and reads the peer's into in (DP_HANDSHAKE_MAX + 1 bytes). */
static int exchange(int fd, int type, const void *out, size_t out_len, uint8_t *in, size_t *in_len, int *in_type,
                    int64_t deadline, char *err, size_t errlen)
{
    int rc = hs_send(fd, type, out, out_len, deadline, err, errlen);
    if (!rc)
        rc = hs_recv(fd, in_type, in, in_len, deadline, err, errlen);
    return rc ? CAIRN_EIO : 0;
}

/* Refuses the peer (REJECT with why) and fails with prefix and why. */
static int refuse(int fd, const char *prefix, const char *why, char *err, size_t errlen)
{
    hs_reject(fd, why);
    return cairn_fail(err, errlen, CAIRN_EIO, "%s%s", prefix, why);
}

/* Runs the handshake on a connected socket: HELLO, AUTH, OK both ways; fills the peer's
 * rank and window, and with a secret the keys that seal the connection from now on
 * (*sealed). Errors say who refused. */
static int handshake(int fd, const struct dp_config *cfg, bool connector, int64_t deadline, int *peer_rank,
                     uint64_t *peer_window, struct dp_seal_dir seal[2], bool *sealed, char *err, size_t errlen)
{
    const char *secret = cfg->secret && cfg->secret[0] ? cfg->secret : NULL;
    struct dp_hello me = {.version = cfg->proto_version ? cfg->proto_version : DP_PROTO_VERSION,
                          .rank = cfg->rank, .epoch = cfg->epoch,
                          .window = cfg->recv_queue_bytes ? cfg->recv_queue_bytes : DP_QUEUE_BYTES_DEFAULT};
    randombytes_buf(me.nonce, sizeof me.nonce);
    snprintf(me.instance, sizeof me.instance, "%s", cfg->instance_id);
    snprintf(me.model, sizeof me.model, "%s", cfg->model_id);
    uint8_t mine[DP_HANDSHAKE_MAX], theirs[DP_HANDSHAKE_MAX + 1], buf[DP_HANDSHAKE_MAX + 1];
    size_t mine_len = dp_hello_pack(&me, mine), theirs_len = 0, len = 0;
    char why[DP_REASON_MAX + 1];
    int type = 0;
    *peer_rank = -1;
    *peer_window = 0;

    int rc = exchange(fd, DP_T_HELLO, mine, mine_len, theirs, &theirs_len, &type, deadline, err, errlen);
    if (!rc)
        rc = expect(type, theirs, theirs_len, DP_T_HELLO, err, errlen);
    if (rc)
        return rc;
    struct dp_hello peer;
    bool version_only;
    if (dp_hello_parse(theirs, theirs_len, &peer, &version_only, why, sizeof why))
        return refuse(fd, "", why, err, errlen);
    *peer_rank = peer.rank;
    *peer_window = peer.window;
    if (!dp_hello_matches(&me, &peer, cfg->peer_rank, why, sizeof why))
        return refuse(fd, "refused: ", why, err, errlen);

    struct dp_hellos hs = {.c = connector ? mine : theirs, .a = connector ? theirs : mine,
                           .len_c = connector ? mine_len : theirs_len, .len_a = connector ? theirs_len : mine_len};
    uint8_t auth[1 + DP_PROOF_BYTES];
    size_t auth_len = dp_auth_pack(secret, connector, &hs, auth);
    rc = exchange(fd, DP_T_AUTH, auth, auth_len, buf, &len, &type, deadline, err, errlen);
    if (!rc && type == DP_T_REJECT)
        rc = expect(type, buf, len, DP_T_AUTH, err, errlen);
    if (rc)
        return rc;
    if (type != DP_T_AUTH || !dp_auth_wellformed(buf, len)) {
        snprintf(why, sizeof why, "malformed AUTH from rank %d", peer.rank);
        return refuse(fd, "", why, err, errlen);
    }
    if (!dp_auth_verify(secret, connector, &hs, buf, me.rank, peer.rank, why, sizeof why))
        return refuse(fd, "refused: ", why, err, errlen);
    rc = exchange(fd, DP_T_OK, NULL, 0, buf, &len, &type, deadline, err, errlen);
    if (!rc)
        rc = expect(type, buf, len, DP_T_OK, err, errlen);
    *sealed = !rc && secret;
    if (*sealed)
        dp_seal_keys(secret, &hs, connector, &seal[0], &seal[1]);
    return rc;
}

/* ---- listen, accept, connect ---- */

static int check_config(const struct dp_config *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no config");
    if (!cfg->instance_id || !dp_valid_id(cfg->instance_id, strlen(cfg->instance_id)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "instance id must be 1..%d printable ASCII bytes", DP_ID_MAX);
    if (!cfg->model_id || !dp_valid_id(cfg->model_id, strlen(cfg->model_id)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "model identity must be 1..%d printable ASCII bytes",
                          DP_ID_MAX);
    if (cfg->rank < 0 || cfg->peer_rank < -1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "bad rank %d / peer rank %d", cfg->rank, cfg->peer_rank);
    if (cfg->max_inflight < 0 || cfg->max_inflight > 4096)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_inflight %d out of 0..4096", cfg->max_inflight);
    if (cfg->recv_queue_bytes && (cfg->recv_queue_bytes < DP_MIN_WINDOW || cfg->recv_queue_bytes > DP_MAX_WINDOW))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "recv_queue_bytes %zu out of %zu..%zu", cfg->recv_queue_bytes,
                          DP_MIN_WINDOW, DP_MAX_WINDOW);
    if (cfg->max_payload > DP_MAX_PAYLOAD_LIMIT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_payload over %zu", DP_MAX_PAYLOAD_LIMIT);
    if (cfg->heartbeat_ms < 0 || cfg->dead_ms < 0 || cfg->user_timeout_ms < 0 || cfg->handshake_ms < 0 ||
        cfg->close_linger_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "negative timing in the config");
    if (cfg->emulate_delay_us < 0 || cfg->emulate_delay_us > 1000000)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "emulate_delay_us %d outside 0..1000000",
                          cfg->emulate_delay_us);
    return 0;
}

struct dp_listener {
    int fd;
    int port;
};

int dp_listen(struct dp_listener **out, const char *bind_addr, int port, char *err, size_t errlen)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "bad port %d", port);
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium failed to initialize");
    struct addrinfo hints = {.ai_family = bind_addr ? AF_UNSPEC : AF_INET, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gr = getaddrinfo(bind_addr, ps, &hints, &res);
    if (gr)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "address '%s': %s", bind_addr ? bind_addr : "*",
                          gai_strerror(gr));
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0)
            break;
        last = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "listen on %s:%d: %s", bind_addr ? bind_addr : "*", port,
                          strerror(last));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    struct dp_listener *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    l->fd = fd;
    l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = l;
    return 0;
}

int dp_listener_port(const struct dp_listener *l) { return l->port; }

void dp_listener_close(struct dp_listener *l)
{
    if (!l)
        return;
    close(l->fd);
    free(l);
}

/* What dp_accept and dp_connect do with a connected socket fd, which it takes: socket
 * options, the handshake, then the connection. who names the peer in errors and logs. */
static int finish(int fd, const struct dp_config *cfg, bool connector, const char *who, struct dp_conn **out,
                  char *err, size_t errlen)
{
    char why[DP_REASON_MAX + 64];
    int peer_rank = -1;
    uint64_t peer_window = 0;
    struct dp_seal_dir seal[2];
    bool sealed = false;
    int rc = set_sockopts(fd, cfg->user_timeout_ms ? cfg->user_timeout_ms : DP_USER_TIMEOUT_MS_DEFAULT, why,
                          sizeof why);
    if (!rc) {
        int64_t hs_deadline = clock_ns() + (cfg->handshake_ms ? cfg->handshake_ms : DP_HANDSHAKE_MS_DEFAULT) * MS;
        rc = handshake(fd, cfg, connector, hs_deadline, &peer_rank, &peer_window, seal, &sealed, why,
                       sizeof why);
    }
    if (rc) {
        close(fd);
        log_warn("dataplane rank %d: handshake with %s failed: %s", cfg->rank, who, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "handshake with %s: %s", who, why);
    }
    char addr[INET6_ADDRSTRLEN + 8];
    peer_text(fd, addr, sizeof addr);
    rc = dp_conn_start(out, fd, cfg, connector, peer_rank, peer_window, sealed ? seal : NULL, addr, err, errlen);
    sodium_memzero(seal, sizeof seal);
    if (rc)
        close(fd);
    return rc;
}

int dp_accept(struct dp_listener *l, const struct dp_config *cfg, int timeout_ms, struct dp_conn **out,
              char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_config(cfg, err, errlen);
    if (rc)
        return rc;
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : clock_ns() + timeout_ms * MS;
    int fd = -1;
    for (;;) {
        fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return cairn_fail(err, errlen, CAIRN_EIO, "accept: %s", strerror(errno));
        struct pollfd pfd = {.fd = l->fd, .events = POLLIN};
        int ms = timeout_ms < 0 ? 1000 : remaining_ms(deadline);
        if (ms == 0)
            return 0;
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
            return cairn_fail(err, errlen, CAIRN_EIO, "poll: %s", strerror(errno));
    }
    char addr[INET6_ADDRSTRLEN + 8];
    peer_text(fd, addr, sizeof addr);
    rc = finish(fd, cfg, false, addr, out, err, errlen);
    return rc ? rc : 1;
}

/* One connect attempt to every address of host. *retry: worth trying again. */
static int connect_once(const char *host, int port, int64_t deadline, int *fd_out, bool *retry, char *err,
                        size_t errlen)
{
    *retry = false;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr) {
        *retry = gr == EAI_AGAIN;
        return cairn_fail(err, errlen, CAIRN_EIO, "address '%s': %s", host, gai_strerror(gr));
    }
    int last = ETIMEDOUT;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int e = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            freeaddrinfo(res);
            *fd_out = fd;
            return 0;
        }
        if (errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int ms = remaining_ms(deadline);
            int pr = ms ? poll(&pfd, 1, ms) : 0;
            if (pr > 0) {
                socklen_t el = sizeof e;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (!e) {
                    freeaddrinfo(res);
                    *fd_out = fd;
                    return 0;
                }
            } else {
                e = pr == 0 ? ETIMEDOUT : errno;
            }
        } else {
            e = errno;
        }
        last = e;
        close(fd);
    }
    freeaddrinfo(res);
    *retry = last == ECONNREFUSED || last == ENETUNREACH || last == EHOSTUNREACH || last == ETIMEDOUT ||
             last == ECONNRESET;
    return cairn_fail(err, errlen, CAIRN_EIO, "connect to %s:%d: %s", host, port, strerror(last));
}

int dp_connect(struct dp_conn **out, const char *host, int port, const struct dp_config *cfg, int timeout_ms,
               char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_config(cfg, err, errlen);
    if (rc)
        return rc;
    if (!host || port < 1 || port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "bad address %s:%d", host ? host : "(null)", port);
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium failed to initialize");
    int64_t start = clock_ns();
    int64_t deadline = start + (timeout_ms > 0 ? timeout_ms : DP_HANDSHAKE_MS_DEFAULT) * MS;
    int fd = -1;
    for (;;) {
        bool retry;
        rc = connect_once(host, port, deadline, &fd, &retry, err, errlen);
        if (!rc)
            break;
        if (!retry || timeout_ms <= 0 || clock_ns() + CONNECT_RETRY_MS * MS >= deadline)
            return CAIRN_EIO;
        struct timespec ts = {0, CONNECT_RETRY_MS * MS};
        nanosleep(&ts, NULL);
    }
    char who[NI_MAXHOST + 8];
    snprintf(who, sizeof who, "%s:%d", host, port);
    return finish(fd, cfg, true, who, out, err, errlen);
}
