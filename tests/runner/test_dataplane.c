/* Data plane (runner/dataplane.h) on loopback: headers and checksums, the handshake
 * and each of its refusals, every frame type and wire encoding, large frames, the
 * in-flight and queue bounds, dead and silent peers (forked children killed or
 * stopped), garbage injected by a proxy mid-stream, and round-trip timings (printed). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "runner/dataplane.h"
#include "runner/dataplane_int.h"
#include "kern/kern.h"

#include <sodium.h>
#include "testutil.h"

#define ERRLEN 700

static uint64_t rng = 0x5eed0da7a91a4eULL;

static double ms_since(int64_t t0) { return (double)(clock_ns() - t0) / 1e6; }

static void base_cfg(struct dp_config *c, int rank, int peer_rank)
{
    memset(c, 0, sizeof *c);
    c->instance_id = "inst-1";
    c->epoch = 7;
    c->model_id = "sha256:0123abcd";
    c->rank = rank;
    c->peer_rank = peer_rank;
}

/* ---- opening pairs: the acceptor in a thread, the connector here ---- */

struct acceptor {
    struct dp_listener *l;
    struct dp_config cfg;
    int timeout_ms;
    struct dp_conn *conn;
    int rc;
    char err[ERRLEN];
    pthread_t th;
};

static void *acceptor_main(void *arg)
{
    struct acceptor *a = arg;
    a->rc = dp_accept(a->l, &a->cfg, a->timeout_ms, &a->conn, a->err, sizeof a->err);
    return NULL;
}

static void acceptor_start(struct acceptor *a, struct dp_listener *l, const struct dp_config *cfg)
{
    memset(a, 0, sizeof *a);
    a->l = l;
    a->cfg = *cfg;
    a->timeout_ms = 10000;
    pthread_create(&a->th, NULL, acceptor_main, a);
}

/* Connects ca (to port) while the listener accepts with cb. Returns true when both
 * ends are open. */
static bool pair_open(struct dp_listener *l, int port, const struct dp_config *ca, const struct dp_config *cb,
                      struct dp_conn **a, struct dp_conn **b, int *rca, int *rcb, char *erra, char *errb)
{
    struct acceptor acc;
    acceptor_start(&acc, l, cb);
    erra[0] = 0;
    *rca = dp_connect(a, "127.0.0.1", port, ca, 10000, erra, ERRLEN);
    pthread_join(acc.th, NULL);
    *b = acc.conn;
    *rcb = acc.rc;
    snprintf(errb, ERRLEN, "%s", acc.err);
    return *rca == 0 && *rcb == 1;
}

static bool simple_pair(struct dp_listener *l, const struct dp_config *ca, const struct dp_config *cb,
                        struct dp_conn **a, struct dp_conn **b)
{
    int rca, rcb;
    char ea[ERRLEN], eb[ERRLEN];
    bool ok = pair_open(l, dp_listener_port(l), ca, cb, a, b, &rca, &rcb, ea, eb);
    CHECK(ok, "pair: connect rc %d (%s), accept rc %d (%s)", rca, ea, rcb, eb);
    return ok;
}

/* Sends a one-token frame on a and checks it arrives on b. */
static bool ping(struct dp_conn *a, struct dp_conn *b, uint64_t step)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)step + (float)i;
    int32_t seq = 3;
    int64_t pos = 11;
    struct dp_activations act = {.step = step, .n = 1, .n_embd = 32, .seq = &seq, .pos = &pos, .x = x};
    char err[ERRLEN];
    int rc = dp_send_activations(a, &act, 2000, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ping send: %s\n", err);
        return false;
    }
    struct dp_frame f;
    rc = dp_recv(b, &f, 5000, err, sizeof err);
    if (rc != 1) {
        fprintf(stderr, "ping recv rc %d: %s\n", rc, rc < 0 ? err : "timeout");
        return false;
    }
    return f.type == DP_T_ACTIVATIONS && f.act.step == step && f.act.x[31] == x[31];
}

/* ---- a proxy that forwards one connection and can inject bytes between frames ---- */

#define INJECT_MAX ((size_t)128 << 10)

struct proxy {
    int lfd, port, target_port;
    int cfd, sfd; /* client side, server side */
    pthread_t th;
    atomic_bool stop, blackhole;
    pthread_mutex_t mu;
    uint8_t *inject; /* INJECT_MAX bytes */
    size_t inject_len;
    bool inject_pending, close_after;
    atomic_bool injected;
    atomic_bool flip_next;  /* flip a bit of the next payload byte client -> server */
    uint8_t *cap;           /* client -> server bytes as they came (INJECT_MAX at most) */
    size_t cap_len;         /* under mu */
    /* frame boundaries of client -> server */
    uint8_t hdr[DP_HDR_SIZE];
    size_t hdr_got;
    uint64_t pay_left;
};

static bool write_full(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static void proxy_maybe_inject(struct proxy *p)
{
    if (p->hdr_got || p->pay_left)
        return;
    pthread_mutex_lock(&p->mu);
    if (p->inject_pending) {
        write_full(p->sfd, p->inject, p->inject_len);
        p->inject_pending = false;
        if (p->close_after) {
            shutdown(p->sfd, SHUT_RDWR);
        }
        atomic_store(&p->injected, true);
    }
    pthread_mutex_unlock(&p->mu);
}

static void proxy_c2s(struct proxy *p, const uint8_t *d, size_t n)
{
    pthread_mutex_lock(&p->mu);
    size_t keep = n < INJECT_MAX - p->cap_len ? n : INJECT_MAX - p->cap_len;
    memcpy(p->cap + p->cap_len, d, keep);
    p->cap_len += keep;
    pthread_mutex_unlock(&p->mu);
    while (n) {
        size_t k;
        if (p->pay_left && atomic_exchange(&p->flip_next, false)) {
            uint8_t b = d[0] ^ 0x01;
            write_full(p->sfd, &b, 1);
            p->pay_left--;
            d++;
            n--;
            continue;
        }
        if (p->pay_left) {
            k = p->pay_left < n ? (size_t)p->pay_left : n;
            p->pay_left -= k;
        } else {
            k = DP_HDR_SIZE - p->hdr_got < n ? DP_HDR_SIZE - p->hdr_got : n;
            memcpy(p->hdr + p->hdr_got, d, k);
            p->hdr_got += k;
            if (p->hdr_got == DP_HDR_SIZE) {
                uint32_t len;
                memcpy(&len, p->hdr + 8, 4);
                p->pay_left = len;
                p->hdr_got = 0;
            }
        }
        if (!atomic_load(&p->injected))
            write_full(p->sfd, d, k);
        d += k;
        n -= k;
        proxy_maybe_inject(p);
    }
}

static void *proxy_main(void *arg)
{
    struct proxy *p = arg;
    struct pollfd lp = {.fd = p->lfd, .events = POLLIN};
    while (!atomic_load(&p->stop) && poll(&lp, 1, 50) == 0) {
    }
    if (atomic_load(&p->stop))
        return NULL;
    p->cfd = accept(p->lfd, NULL, NULL);
    p->sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->target_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (p->cfd < 0 || connect(p->sfd, (struct sockaddr *)&sa, sizeof sa))
        return NULL;
    uint8_t buf[65536];
    bool c_open = true, s_open = true;
    while (!atomic_load(&p->stop) && (c_open || s_open)) {
        proxy_maybe_inject(p);
        bool hole = atomic_load(&p->blackhole);
        struct pollfd pf[2] = {{.fd = c_open && !hole ? p->cfd : -1, .events = POLLIN},
                               {.fd = s_open && !hole ? p->sfd : -1, .events = POLLIN}};
        if (poll(pf, 2, 10) <= 0)
            continue;
        if (pf[0].revents) {
            ssize_t n = recv(p->cfd, buf, sizeof buf, 0);
            if (n <= 0) {
                c_open = false;
                shutdown(p->sfd, SHUT_WR);
            } else {
                proxy_c2s(p, buf, (size_t)n);
            }
        }
        if (pf[1].revents) {
            ssize_t n = recv(p->sfd, buf, sizeof buf, 0);
            if (n <= 0) {
                s_open = false;
                shutdown(p->cfd, SHUT_WR);
            } else {
                write_full(p->cfd, buf, (size_t)n);
            }
        }
    }
    return NULL;
}

static void proxy_start(struct proxy *p, int target_port)
{
    memset(p, 0, sizeof *p);
    p->cfd = p->sfd = -1;
    p->target_port = target_port;
    p->inject = malloc(INJECT_MAX);
    p->cap = malloc(INJECT_MAX);
    pthread_mutex_init(&p->mu, NULL);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(p->lfd, (struct sockaddr *)&sa, sizeof sa);
    listen(p->lfd, 4);
    socklen_t sl = sizeof sa;
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    pthread_create(&p->th, NULL, proxy_main, p);
}

static void proxy_inject(struct proxy *p, const void *bytes, size_t n, bool close_after)
{
    pthread_mutex_lock(&p->mu);
    memcpy(p->inject, bytes, n);
    p->inject_len = n;
    p->close_after = close_after;
    p->inject_pending = true;
    pthread_mutex_unlock(&p->mu);
}

static void proxy_stop(struct proxy *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->th, NULL);
    close(p->lfd);
    if (p->cfd >= 0)
        close(p->cfd);
    if (p->sfd >= 0)
        close(p->sfd);
    pthread_mutex_destroy(&p->mu);
    free(p->inject);
    free(p->cap);
}

/* ---- headers and checksums ---- */

static void test_header(void)
{
    CHECK(dp_crc32c(0, "123456789", 9) == 0xe3069283u, "crc32c check value %08x", dp_crc32c(0, "123456789", 9));
    CHECK(dp_crc32c(dp_crc32c(0, "1234", 4), "56789", 5) == 0xe3069283u, "crc32c continued");

    uint8_t b[DP_HDR_SIZE];
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_RESULT, .flags = DP_F_PAYLOAD_CRC, .len = 4096,
                       .payload_crc = 0xdeadbeef}, g;
    dp_hdr_pack(b, &h);
    char err[ERRLEN];
    CHECK(dp_hdr_parse(b, &g, 1 << 20, err, sizeof err) == 0, "parse: %s", err);
    CHECK(g.type == h.type && g.flags == h.flags && g.len == h.len && g.payload_crc == h.payload_crc &&
          g.version == h.version, "header round trip");
    /* every single-bit flip is refused */
    int refused = 0;
    for (int bit = 0; bit < DP_HDR_SIZE * 8; bit++) {
        uint8_t c[DP_HDR_SIZE];
        memcpy(c, b, sizeof c);
        c[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        refused += dp_hdr_parse(c, &g, 1 << 20, NULL, 0) == CAIRN_EFORMAT;
    }
    CHECK_EQ_INT(refused, DP_HDR_SIZE * 8);
    /* each field out of range, with a valid checksum */
    struct {
        struct dp_hdr h;
        const char *want;
    } bad[] = {
        {{.version = 2, .type = DP_T_RESULT}, "version"},
        {{.version = 1, .type = 99}, "unknown frame type"},
        {{.version = 1, .type = 0}, "unknown frame type"},
        {{.version = 1, .type = DP_T_RESULT, .flags = 0x8000}, "flags"},
        {{.version = 1, .type = DP_T_RESULT, .len = (1 << 20) + 1}, "over the limit"},
        {{.version = 1, .type = DP_T_RESULT, .len = 0xffffffffu}, "over the limit"},
        {{.version = 1, .type = DP_T_HELLO, .len = DP_HANDSHAKE_MAX + 1}, "over the limit"},
        {{.version = 1, .type = DP_T_HEARTBEAT, .len = 25}, "over the limit"},
        {{.version = 1, .type = DP_T_RESULT, .payload_crc = 5}, "without its flag"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_hdr_pack(b, &bad[i].h);
        err[0] = 0;
        int rc = dp_hdr_parse(b, &g, 1 << 20, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, bad[i].want), "bad header %zu: rc %d '%s', want '%s'", i, rc,
              err, bad[i].want);
    }
    memset(b, 0x41, sizeof b);
    CHECK(dp_hdr_parse(b, &g, 1 << 20, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "magic"), "magic: %s", err);
}

/* ---- encodings ---- */

/* Activation-like data: mostly N(0,1)-ish, some channels 20..100x larger. */
static void fill_acts(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float u = test_rand_float(&rng) + test_rand_float(&rng) + test_rand_float(&rng);
        if (i % 97 == 5)
            u *= 20.0f + 80.0f * fabsf(test_rand_float(&rng));
        x[i] = u;
    }
}

static void measure(const float *x, const float *y, int64_t n, struct dp_enc_error *e)
{
    memset(e, 0, sizeof *e);
    double se = 0, sx = 0;
    for (int64_t b = 0; b < n; b += 32) {
        double bm = 0, be = 0;
        for (int64_t i = b; i < b + 32 && i < n; i++) {
            double d = fabs((double)y[i] - (double)x[i]);
            se += d * d;
            sx += (double)x[i] * x[i];
            e->max_abs = fmax(e->max_abs, d);
            if (x[i] != 0)
                e->max_rel = fmax(e->max_rel, d / fabs((double)x[i]));
            bm = fmax(bm, fabs((double)x[i]));
            be = fmax(be, d);
        }
        if (bm > 0)
            e->max_rel_block = fmax(e->max_rel_block, be / bm);
    }
    e->rms_rel = sqrt(se / sx);
}

/* The error bound of each wire type: per element for BF16 (round to nearest, 8 bits
 * of mantissa, float's exponent range); for F16 relative to the block's largest value
 * (11 bits, but values under 2^-14 lose relative precision as subnormals); per block
 * of 32 for Q8_0 (half a step of amax/127, plus the F16 rounding of the scale). */
static bool within_bound(int dt, const struct dp_enc_error *e)
{
    switch (dt) {
    case DT_F32: return e->max_abs == 0;
    case DT_F16: return e->max_rel_block <= 1.0 / 2048 * (1 + 1e-6);
    case DT_BF16: return e->max_rel <= 1.0 / 256 * (1 + 1e-6);
    case DT_Q8_0: return e->max_rel_block <= (1.0 / 254 + 1.0 / 2048) * (1 + 1e-5);
    default: return false;
    }
}

static void test_encoding_error(void)
{
    const int64_t n = 64 * 2048;
    float *x = malloc(n * sizeof *x);
    fill_acts(x, n);
    const int types[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
    printf("wire encoding errors on %lld activation-like values (max_abs, max_rel, max_rel_block, rms_rel):\n",
           (long long)n);
    double rms_prev = -1;
    for (int t = 0; t < 4; t++) {
        struct dp_enc_error e;
        int rc = dp_encoding_error(types[t], x, n, &e);
        CHECK(rc == 0, "encoding error %s rc %d", dtype_name(types[t]), rc);
        CHECK(within_bound(types[t], &e), "%s error over its bound: rel %.3g block %.3g", dtype_name(types[t]),
              e.max_rel, e.max_rel_block);
        printf("  %-5s %.3e %.3e %.3e %.3e  (%lld bytes per 2048 floats)\n", dtype_name(types[t]), e.max_abs,
               e.max_rel, e.max_rel_block, e.rms_rel, (long long)dp_wire_bytes(types[t], 2048));
        if (t >= 1 && t <= 2)
            CHECK(e.rms_rel > rms_prev, "%s rms %.3g not above the finer type's %.3g", dtype_name(types[t]),
                  e.rms_rel, rms_prev);
        rms_prev = e.rms_rel;
    }
    struct dp_enc_error e;
    CHECK(dp_encoding_error(DT_Q8_0, x, 33, &e) == CAIRN_EINVAL, "Q8_0 of 33 values refused");
    CHECK(dp_encoding_error(DT_Q4_0, x, 64, &e) == CAIRN_EINVAL, "Q4_0 is no wire type");
    CHECK(dp_wire_bytes(DT_Q8_0, 64) == 68 && dp_wire_bytes(DT_F16, 3) == 6 && dp_wire_bytes(DT_Q8_0, 31) < 0,
          "wire bytes");
    free(x);
}

/* ---- handshake ---- */

static void test_handshake_ok(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.secret = cb.secret = "cluster secret";
    struct dp_conn *a = NULL, *b = NULL;
    if (simple_pair(l, &ca, &cb, &a, &b)) {
        CHECK_EQ_INT(dp_peer_rank(a), 1);
        CHECK_EQ_INT(dp_peer_rank(b), 0);
        CHECK(!strncmp(dp_peer_addr(a), "127.0.0.1:", 10), "peer addr %s", dp_peer_addr(a));
        CHECK(dp_peer_alive(a) && dp_peer_alive(b), "alive");
        CHECK(dp_error(a)[0] == 0, "no error while open: %s", dp_error(a));
        CHECK(ping(a, b, 1) && ping(b, a, 2), "frames both ways");
    }
    dp_close(a, "done");
    dp_close(b, "done");
}

static void test_handshake_refused(struct dp_listener *l)
{
    struct {
        const char *name;
        const char *want;  /* in both errors */
        bool one_sided;    /* only the connector checks: the acceptor hears it from the peer */
    } cases[] = {
        {"version", "protocol version mismatch", false},
        {"instance", "instance mismatch", false},
        {"epoch", "epoch mismatch", false},
        {"model", "model mismatch", false},
        {"secret", "cluster secret mismatch", false},
        {"secret_only_a", "cluster secret mismatch", false},
        {"secret_only_b", "cluster secret mismatch", false},
        {"rank", "rank mismatch", true},
        {"same_rank", "rank mismatch", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct dp_config ca, cb;
        base_cfg(&ca, 0, -1);
        base_cfg(&cb, 1, -1);
        const char *n = cases[i].name;
        if (!strcmp(n, "version"))
            cb.proto_version = DP_PROTO_VERSION + 1;
        else if (!strcmp(n, "instance"))
            cb.instance_id = "inst-2";
        else if (!strcmp(n, "epoch"))
            cb.epoch = 8;
        else if (!strcmp(n, "model"))
            cb.model_id = "sha256:ffff";
        else if (!strcmp(n, "secret")) {
            ca.secret = "one secret";
            cb.secret = "another secret";
        } else if (!strcmp(n, "secret_only_a"))
            ca.secret = "one secret";
        else if (!strcmp(n, "secret_only_b"))
            cb.secret = "one secret";
        else if (!strcmp(n, "rank"))
            ca.peer_rank = 2;
        else if (!strcmp(n, "same_rank"))
            cb.rank = 0;
        struct dp_conn *a = NULL, *b = NULL;
        int rca, rcb;
        char ea[ERRLEN], eb[ERRLEN];
        int64_t t0 = clock_ns();
        pair_open(l, dp_listener_port(l), &ca, &cb, &a, &b, &rca, &rcb, ea, eb);
        CHECK(rca == CAIRN_EIO && !a, "%s: connect rc %d", n, rca);
        CHECK(rcb == CAIRN_EIO && !b, "%s: accept rc %d", n, rcb);
        CHECK(strstr(ea, cases[i].want), "%s: connector's error '%s'", n, ea);
        CHECK(strstr(eb, cases[i].want), "%s: acceptor's error '%s'", n, eb);
        if (cases[i].one_sided)
            CHECK(strstr(eb, "refused by the peer"), "%s: acceptor's error names the peer: '%s'", n, eb);
        CHECK(ms_since(t0) < 3000, "%s: refusal took %.0f ms", n, ms_since(t0));
        dp_close(a, NULL);
        dp_close(b, NULL);
    }
    /* the listener still works */
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    struct dp_conn *a = NULL, *b = NULL;
    if (simple_pair(l, &ca, &cb, &a, &b))
        CHECK(ping(a, b, 5), "after refusals");
    dp_close(a, NULL);
    dp_close(b, NULL);
    /* bad configs */
    char err[ERRLEN];
    base_cfg(&ca, 0, 1);
    ca.instance_id = "";
    CHECK(dp_connect(&a, "127.0.0.1", dp_listener_port(l), &ca, 100, err, sizeof err) == CAIRN_EINVAL,
          "empty instance id refused");
    base_cfg(&ca, 0, 1);
    ca.model_id = "has\nnewline";
    CHECK(dp_connect(&a, "127.0.0.1", dp_listener_port(l), &ca, 100, err, sizeof err) == CAIRN_EINVAL,
          "model id with a control character refused");
    /* nobody listening: retries, then a clear error */
    struct dp_listener *tmp;
    dp_listen(&tmp, "127.0.0.1", 0, err, sizeof err);
    int dead_port = dp_listener_port(tmp);
    dp_listener_close(tmp);
    base_cfg(&ca, 0, 1);
    int64_t t0 = clock_ns();
    int rc = dp_connect(&a, "127.0.0.1", dead_port, &ca, 400, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "refused"), "connect to nobody: rc %d '%s'", rc, err);
    CHECK(ms_since(t0) >= 300 && ms_since(t0) < 3000, "connect retried for %.0f ms", ms_since(t0));
}

/* ---- frames ---- */

static void test_frames(struct dp_listener *l, bool crc, const char *secret)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.payload_crc = cb.payload_crc = crc;
    ca.secret = cb.secret = secret;
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    char err[ERRLEN];
    struct dp_frame f;
    const int n = 5, ne = 256;
    float *x = malloc(sizeof(float) * n * ne), *ref = malloc(sizeof(float) * n * ne);
    uint8_t *wire = malloc((size_t)dp_wire_bytes(DT_F32, n * ne));
    fill_acts(x, n * ne);
    int32_t seq[5] = {0, 0, 4, 9, 2};
    int64_t pos[5] = {0, 1, 77, 3, 100000};
    uint8_t want[5] = {0, 1, 1, 0, 1};
    const int types[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
    for (int t = 0; t < 4; t++) {
        struct dp_activations act = {.step = 100 + (uint64_t)t, .n = n, .n_embd = ne, .wire_dtype = types[t],
                                     .seq = seq, .pos = pos, .want = t == 3 ? NULL : want, .x = x};
        int rc = dp_send_activations(a, &act, 1000, err, sizeof err);
        CHECK(rc == 0, "send %s: %s", dtype_name(types[t]), err);
        rc = dp_recv(b, &f, 5000, err, sizeof err);
        CHECK(rc == 1 && f.type == DP_T_ACTIVATIONS, "recv %s rc %d", dtype_name(types[t]), rc);
        if (rc != 1 || f.type != DP_T_ACTIVATIONS)
            continue;
        CHECK(f.act.step == act.step && f.act.n == n && f.act.n_embd == ne && f.act.wire_dtype == types[t],
              "%s fields", dtype_name(types[t]));
        CHECK(!memcmp(f.act.seq, seq, sizeof seq) && !memcmp(f.act.pos, pos, sizeof pos), "seq/pos");
        for (int i = 0; i < n; i++)
            CHECK(f.act.want[i] == (t == 3 ? 1 : want[i]), "want[%d] = %u", i, f.act.want[i]);
        /* bit-exact with a local encode/decode, and within the type's bound vs F32 */
        kern_quantize_row(types[t], x, wire, n * ne);
        kern_dequantize_row(types[t], wire, ref, n * ne);
        CHECK(!memcmp(f.act.x, ref, sizeof(float) * n * ne), "%s values equal the local decode",
              dtype_name(types[t]));
        struct dp_enc_error e, e2;
        measure(x, f.act.x, n * ne, &e);
        dp_encoding_error(types[t], x, n * ne, &e2);
        CHECK(within_bound(types[t], &e), "%s received error rel %.3g block %.3g", dtype_name(types[t]), e.max_rel,
              e.max_rel_block);
        CHECK(fabs(e.max_abs - e2.max_abs) <= 1e-12 * (1 + e.max_abs) && fabs(e.rms_rel - e2.rms_rel) <= 1e-9,
              "%s: dp_encoding_error %.6g/%.6g agrees with the wire %.6g/%.6g", dtype_name(types[t]), e2.max_abs,
              e2.rms_rel, e.max_abs, e.rms_rel);
    }

    /* results: tokens, logits, an error */
    int32_t rseq[3] = {4, 9, 2}, tok[3] = {17, 0, 151000};
    int64_t rpos[3] = {77, 3, 100000};
    float lp[3] = {-0.25f, 0.0f, -INFINITY};
    struct dp_result r = {.step = 100, .n = 3, .kind = DP_RESULT_TOKENS, .seq = rseq, .pos = rpos, .token = tok,
                          .logprob = lp};
    CHECK(dp_send_result(b, &r, 1000, err, sizeof err) == 0, "send result: %s", err);
    int rc = dp_recv(a, &f, 5000, err, sizeof err);
    CHECK(rc == 1 && f.type == DP_T_RESULT && f.res.kind == DP_RESULT_TOKENS && f.res.n == 3 && f.res.step == 100 &&
          f.res.status == 0 && f.res.message[0] == 0, "tokens result");
    if (rc == 1 && f.type == DP_T_RESULT && f.res.n == 3)
        CHECK(!memcmp(f.res.token, tok, sizeof tok) && !memcmp(f.res.logprob, lp, sizeof lp) &&
              !memcmp(f.res.seq, rseq, sizeof rseq) && !memcmp(f.res.pos, rpos, sizeof rpos), "tokens result values");
    const int nv = 1000;
    float *logits = malloc(sizeof(float) * 2 * nv);
    fill_acts(logits, 2 * nv);
    struct dp_result rl = {.step = 101, .n = 2, .kind = DP_RESULT_LOGITS, .n_vocab = nv, .seq = rseq, .pos = rpos,
                           .logits = logits, .message = "partial"};
    CHECK(dp_send_result(b, &rl, 1000, err, sizeof err) == 0, "send logits: %s", err);
    rc = dp_recv(a, &f, 5000, err, sizeof err);
    CHECK(rc == 1 && f.type == DP_T_RESULT && f.res.kind == DP_RESULT_LOGITS && f.res.n_vocab == nv &&
          f.res.n == 2 && !strcmp(f.res.message, "partial"), "logits result");
    if (rc == 1 && f.type == DP_T_RESULT && f.res.kind == DP_RESULT_LOGITS)
        CHECK(!memcmp(f.res.logits, logits, sizeof(float) * 2 * nv), "logits values");
    struct dp_result re = {.step = 102, .n = 0, .kind = DP_RESULT_TOKENS, .status = CAIRN_EFULL,
                           .message = "rank 1: KV cache full for seq 4"};
    CHECK(dp_send_result(b, &re, 1000, err, sizeof err) == 0, "send error result: %s", err);
    rc = dp_recv(a, &f, 5000, err, sizeof err);
    CHECK(rc == 1 && f.type == DP_T_RESULT && f.res.status == CAIRN_EFULL && f.res.n == 0 &&
          strstr(f.res.message, "KV cache full"), "error result");

    /* asks with the activations: every field back as sent, after values whose size is
     * not a multiple of 8 (5 rows of 3 F16) */
    {
        struct dp_ask asks[3] = {
            {.need = DP_ROW_SAMPLE, .n_top = 20, .pos = 2, .seed = 99, .temperature = 0.7f, .top_p = 0.9f,
             .min_p = 0.05f, .repeat_penalty = 1.1f, .presence_penalty = -0.5f, .frequency_penalty = 0.25f,
             .top_k = 40, .penalty_last_n = -1, .n_bias = 2, .n_hist = 3},
            {.need = DP_ROW_LOGITS},
            {.need = DP_ROW_SAMPLE, .n_top = -1, .pos = 100001, .top_p = 1, .repeat_penalty = 1, .n_hist = 1}};
        struct dp_bias bias[2] = {{5, 2.5f}, {0, -INFINITY}};
        int32_t hist[4] = {7, 8, 9, 151000};
        struct dp_activations act = {.step = 150, .n = n, .n_embd = 3, .wire_dtype = DT_F16, .seq = seq, .pos = pos,
                                     .want = want, .x = x, .n_asks = 3, .asks = asks, .bias = bias, .hist = hist};
        CHECK(dp_send_activations(a, &act, 1000, err, sizeof err) == 0, "send asks: %s", err);
        int rc = dp_recv(b, &f, 5000, err, sizeof err);
        CHECK(rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.n_asks == 3 && f.act.n_embd == 3, "asks arrive");
        if (rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.n_asks == 3)
            CHECK(!memcmp(f.act.asks, asks, sizeof asks) && !memcmp(f.act.bias, bias, sizeof bias) &&
                  !memcmp(f.act.hist, hist, sizeof hist), "asks, bias entries and windows as sent");
        /* refused on send: a count that is not the wanted tokens', a field out of range */
        act.n_asks = 2;
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "2 asks for 3 wanted tokens");
        act.n_asks = 3;
        asks[0].n_top = 21;
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "n_top 21");
        asks[0].n_top = 0;
        asks[0].temperature = NAN;
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "temperature NaN");
        asks[0].temperature = 1;
        asks[1].pos = 3; /* a LOGITS ask with a field set */
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "LOGITS ask with a position");
        asks[1].pos = 0;
        hist[1] = -2;
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "window token -2");
        hist[1] = 8;
        bias[1].bias = NAN;
        CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == CAIRN_EINVAL, "bias NaN");
    }

    /* a SAMPLED result: tokens with and without top log-probabilities, a sampler's
     * error, a logits row and a skipped row, in an odd count of entries */
    {
        int32_t sseq[5] = {1, 2, 3, 4, 5}, stok[3] = {42, -99, 7}, ntop[3] = {2, 0, 0}, ttok[2] = {42, 3};
        int64_t spos[5] = {10, 11, 12, 13, 14};
        uint8_t need[5] = {DP_ROW_SAMPLE, DP_ROW_LOGITS, DP_ROW_SAMPLE, DP_ROW_SKIP, DP_ROW_SAMPLE};
        float prob[3] = {0.5f, 0, 1}, slp[3] = {-0.69f, 0, -0.01f}, tlp[2] = {-0.69f, -1.5f};
        const int snv = 33;
        float row[33];
        fill_acts(row, snv);
        struct dp_result rs = {.step = 160, .n = 5, .kind = DP_RESULT_SAMPLED, .n_vocab = snv, .message = "",
                               .seq = sseq, .pos = spos, .need = need, .token = stok, .prob = prob, .logprob = slp,
                               .n_top = ntop, .top_token = ttok, .top_logprob = tlp, .logits = row};
        CHECK(dp_send_result(b, &rs, 1000, err, sizeof err) == 0, "send sampled: %s", err);
        int rc = dp_recv(a, &f, 5000, err, sizeof err);
        CHECK(rc == 1 && f.type == DP_T_RESULT && f.res.kind == DP_RESULT_SAMPLED && f.res.n == 5 &&
              f.res.n_sampled == 3 && f.res.n_logits == 1 && f.res.n_tops == 2 && f.res.n_vocab == snv,
              "sampled result: rc %d", rc);
        if (rc == 1 && f.type == DP_T_RESULT && f.res.kind == DP_RESULT_SAMPLED && f.res.n_sampled == 3)
            CHECK(!memcmp(f.res.need, need, sizeof need) && !memcmp(f.res.token, stok, sizeof stok) &&
                  !memcmp(f.res.prob, prob, sizeof prob) && !memcmp(f.res.logprob, slp, sizeof slp) &&
                  !memcmp(f.res.n_top, ntop, sizeof ntop) && !memcmp(f.res.top_token, ttok, sizeof ttok) &&
                  !memcmp(f.res.top_logprob, tlp, sizeof tlp) && !memcmp(f.res.logits, row, sizeof row) &&
                  !memcmp(f.res.seq, sseq, sizeof sseq) && !memcmp(f.res.pos, spos, sizeof spos),
                  "sampled result values");
        CHECK(dp_result_wire_bytes(&rs) == (uint64_t)(DP_HDR_SIZE + 32 + 60 + 5 + 7 + 48 + 16 + 4 * snv), "wire bytes %llu",
              (unsigned long long)dp_result_wire_bytes(&rs));
        ntop[1] = 1; /* an error token with top log-probabilities */
        CHECK(dp_send_result(b, &rs, 0, err, sizeof err) == CAIRN_EINVAL, "error token with tops");
        ntop[1] = 0;
        stok[1] = DP_TOKEN_ERR_MIN;
        CHECK(dp_send_result(b, &rs, 0, err, sizeof err) == CAIRN_EINVAL, "token %d", DP_TOKEN_ERR_MIN);
        stok[1] = 5;
        need[3] = 4;
        CHECK(dp_send_result(b, &rs, 0, err, sizeof err) == CAIRN_EINVAL, "need 4");
        CHECK(dp_result_wire_bytes(&rs) == 0, "wire bytes of a malformed result");
    }

    /* control */
    struct dp_ctl ops[5] = {{.op = DP_CTL_CLEAR, .seq = 4},
                            {.op = DP_CTL_TRUNCATE, .seq = 9, .pos = 12},
                            {.op = DP_CTL_CANCEL, .seq = 2},
                            {.op = DP_CTL_FORK, .seq = 0, .seq2 = 7},
                            {.op = DP_CTL_CLEAR_ALL}};
    struct dp_control ctl = {.step = 103, .n = 5, .ops = ops};
    CHECK(dp_send_control(a, &ctl, 1000, err, sizeof err) == 0, "send control: %s", err);
    rc = dp_recv(b, &f, 5000, err, sizeof err);
    CHECK(rc == 1 && f.type == DP_T_CONTROL && f.ctl.n == 5 && f.ctl.step == 103 &&
          !memcmp(f.ctl.ops, ops, sizeof ops), "control round trip");

    /* malformed frames are refused on send */
    struct dp_activations bad = {.step = 1, .n = 1, .n_embd = 30, .wire_dtype = DT_Q8_0, .seq = seq, .pos = pos,
                                 .x = x};
    CHECK(dp_send_activations(a, &bad, 0, err, sizeof err) == CAIRN_EINVAL, "Q8_0 rows of 30");
    bad.n_embd = 32;
    bad.wire_dtype = DT_Q4_0;
    CHECK(dp_send_activations(a, &bad, 0, err, sizeof err) == CAIRN_EINVAL, "Q4_0 on the wire");
    int32_t neg = -1;
    bad.wire_dtype = DT_F32;
    bad.seq = &neg;
    CHECK(dp_send_activations(a, &bad, 0, err, sizeof err) == CAIRN_EINVAL, "seq -1");
    bad.seq = seq;
    bad.n = 0;
    CHECK(dp_send_activations(a, &bad, 0, err, sizeof err) == CAIRN_EINVAL, "0 tokens");
    struct dp_ctl bop = {.op = DP_CTL_FORK, .seq = 3, .seq2 = 3};
    struct dp_control bctl = {.n = 1, .ops = &bop};
    CHECK(dp_send_control(a, &bctl, 0, err, sizeof err) == CAIRN_EINVAL, "fork onto itself");
    bop = (struct dp_ctl){.op = 9};
    CHECK(dp_send_control(a, &bctl, 0, err, sizeof err) == CAIRN_EINVAL, "op 9");
    struct dp_result br = {.n = 1, .kind = DP_RESULT_TOKENS, .seq = seq, .pos = pos, .token = &neg, .logprob = lp};
    CHECK(dp_send_result(a, &br, 0, err, sizeof err) == CAIRN_EINVAL, "token -1");
    CHECK(ping(a, b, 104), "still open after refused sends");

    /* nothing arrives: recv times out */
    int64_t t0 = clock_ns();
    rc = dp_recv(b, &f, 150, err, sizeof err);
    CHECK(rc == 0 && ms_since(t0) >= 140, "recv timeout rc %d after %.0f ms", rc, ms_since(t0));

    /* a graceful close flushes what was queued, then says goodbye */
    for (int i = 0; i < 10; i++) {
        struct dp_activations act = {.step = 200 + (uint64_t)i, .n = n, .n_embd = ne, .seq = seq, .pos = pos,
                                     .x = x};
        CHECK(dp_send_activations(a, &act, 1000, err, sizeof err) == 0, "queue %d: %s", i, err);
    }
    dp_close(a, "shutting down");
    a = NULL;
    int got = 0;
    while ((rc = dp_recv(b, &f, 5000, err, sizeof err)) == 1 && f.type == DP_T_ACTIVATIONS)
        got += f.act.step == 200 + (uint64_t)got;
    CHECK_EQ_INT(got, 10);
    CHECK(rc == 1 && f.type == DP_T_GOODBYE && strstr(f.bye.reason, "shutting down"), "goodbye after the frames");
    rc = dp_recv(b, &f, 5000, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "shutting down"), "after goodbye: rc %d '%s'", rc, err);
    CHECK(!dp_peer_alive(b), "not alive after goodbye");
    CHECK(dp_send_activations(b, &(struct dp_activations){.n = 1, .n_embd = 32, .seq = seq, .pos = pos, .x = x},
                              0, err, sizeof err) == CAIRN_EIO, "send after the end");
    struct dp_stats st;
    dp_get_stats(b, &st);
    CHECK(st.activations_received == 16 && st.results_sent == 4 && st.controls_received == 1, "stats %llu %llu %llu",
          (unsigned long long)st.activations_received, (unsigned long long)st.results_sent,
          (unsigned long long)st.controls_received);
    dp_close(b, NULL);
    free(x);
    free(ref);
    free(wire);
    free(logits);
}

static void test_large(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    const int n = 512, ne = 4096;
    float *x = malloc(sizeof(float) * n * ne);
    int32_t *seq = malloc(sizeof(int32_t) * n);
    int64_t *pos = malloc(sizeof(int64_t) * n);
    fill_acts(x, (int64_t)n * ne);
    for (int i = 0; i < n; i++) {
        seq[i] = i / 64;
        pos[i] = i % 64;
    }
    char err[ERRLEN];
    struct dp_frame f;
    for (int dir = 0; dir < 2; dir++) {
        struct dp_conn *s = dir ? b : a, *r = dir ? a : b;
        for (int rep = 0; rep < 3; rep++) {
            struct dp_activations act = {.step = (uint64_t)rep, .n = n, .n_embd = ne, .seq = seq, .pos = pos, .x = x};
            int rc = dp_send_activations(s, &act, 5000, err, sizeof err);
            CHECK(rc == 0, "large send: %s", err);
        }
        for (int rep = 0; rep < 3; rep++) {
            int rc = dp_recv(r, &f, 10000, err, sizeof err);
            CHECK(rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.n == n && f.act.n_embd == ne &&
                  f.act.step == (uint64_t)rep, "large recv %d rc %d", rep, rc);
            if (rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.n == n)
                CHECK(!memcmp(f.act.x, x, sizeof(float) * n * ne) && !memcmp(f.act.seq, seq, 4 * n) &&
                      !memcmp(f.act.pos, pos, 8 * n), "large values dir %d rep %d", dir, rep);
        }
    }
    /* over max_payload: refused on send */
    struct dp_conn *c2 = NULL, *d2 = NULL;
    ca.max_payload = cb.max_payload = 1 << 20;
    if (simple_pair(l, &ca, &cb, &c2, &d2)) {
        struct dp_activations act = {.n = n, .n_embd = ne, .seq = seq, .pos = pos, .x = x};
        CHECK(dp_send_activations(c2, &act, 0, err, sizeof err) == CAIRN_EINVAL && strstr(err, "max_payload"),
              "over max_payload: %s", err);
    }
    dp_close(c2, NULL);
    dp_close(d2, NULL);
    dp_close(a, NULL);
    dp_close(b, NULL);
    free(x);
    free(seq);
    free(pos);
}

/* ---- bounds ---- */

static void test_inflight(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.max_inflight = 2;
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    char err[ERRLEN];
    float x[64] = {0};
    int32_t seq = 0;
    int64_t pos = 0;
    struct dp_activations act = {.n = 1, .n_embd = 64, .seq = &seq, .pos = &pos, .x = x};
    act.step = 1;
    CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == 0, "step 1: %s", err);
    act.step = 2;
    CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == 0, "step 2: %s", err);
    act.step = 3;
    int rc = dp_send_activations(a, &act, 0, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "in flight"), "step 3 without waiting: rc %d '%s'", rc, err);
    int64_t t0 = clock_ns();
    rc = dp_send_activations(a, &act, 200, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && ms_since(t0) >= 190, "step 3 waiting 200 ms: rc %d after %.0f ms", rc, ms_since(t0));
    struct dp_stats st;
    dp_get_stats(a, &st);
    CHECK(st.inflight == 2 && st.send_wait_us >= 190000, "inflight %d, waited %lld us", st.inflight,
          (long long)st.send_wait_us);
    /* a RESULT for step 1 frees one slot; a waiting sender gets it */
    struct dp_frame f;
    CHECK(dp_recv(b, &f, 2000, err, sizeof err) == 1 && f.act.step == 1, "b got step 1");
    int32_t tok = 5;
    float lp = -1;
    struct dp_result r = {.step = 1, .n = 1, .kind = DP_RESULT_TOKENS, .seq = &seq, .pos = &pos, .token = &tok,
                          .logprob = &lp};
    dp_send_result(b, &r, 1000, err, sizeof err);
    t0 = clock_ns();
    rc = dp_send_activations(a, &act, 3000, err, sizeof err);
    CHECK(rc == 0 && ms_since(t0) < 2500, "step 3 once step 1 returned: rc %d after %.0f ms", rc, ms_since(t0));
    CHECK(dp_recv(a, &f, 2000, err, sizeof err) == 1 && f.type == DP_T_RESULT, "a got the result");
    /* ring topology: released by the caller */
    CHECK(dp_inflight_done(a, 99) == CAIRN_ENOTFOUND, "unknown step");
    CHECK(dp_inflight_done(a, 2) == 0, "step 2 done by hand");
    act.step = 4;
    CHECK(dp_send_activations(a, &act, 0, err, sizeof err) == 0, "step 4 after a release: %s", err);
    dp_get_stats(a, &st);
    CHECK(st.inflight == 2 && st.steps_done == 2, "inflight %d, steps done %llu", st.inflight,
          (unsigned long long)st.steps_done);
    dp_close(a, NULL);
    dp_close(b, NULL);
}

/* emulate_delay_us: each data frame arrives no sooner than the delay after it was sent,
 * in order, while heartbeats keep the link alive; a delay out of range is refused. */
static void test_emulated_delay(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.emulate_delay_us = 30000;
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    char err[ERRLEN];
    float x[64] = {0};
    int32_t seq = 0;
    int64_t pos = 0;
    struct dp_activations act = {.n = 1, .n_embd = 64, .seq = &seq, .pos = &pos, .x = x};
    int64_t t0 = clock_ns();
    for (int i = 1; i <= 3; i++) {
        act.step = (uint64_t)i;
        CHECK(dp_send_activations(a, &act, 1000, err, sizeof err) == 0, "step %d: %s", i, err);
    }
    struct dp_frame f;
    for (int i = 1; i <= 3; i++) {
        int rc = dp_recv(b, &f, 5000, err, sizeof err);
        CHECK(rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.step == (uint64_t)i, "step %d in order: rc %d", i, rc);
        if (i == 1)
            CHECK(ms_since(t0) >= 29, "first frame after %.1f ms (delay 30 ms)", ms_since(t0));
    }
    /* the other way: no delay configured on b */
    int32_t tok = 1;
    float lp = 0;
    struct dp_result r = {.step = 1, .n = 1, .kind = DP_RESULT_TOKENS, .seq = &seq, .pos = &pos, .token = &tok,
                          .logprob = &lp};
    CHECK(dp_send_result(b, &r, 1000, err, sizeof err) == 0, "result: %s", err);
    CHECK(dp_recv(a, &f, 5000, err, sizeof err) == 1 && f.type == DP_T_RESULT, "a got the result");
    dp_close(a, NULL);
    dp_close(b, NULL);
    ca.emulate_delay_us = -1;
    CHECK(dp_connect(&a, "127.0.0.1", dp_listener_port(l), &ca, 0, err, sizeof err) == CAIRN_EINVAL &&
              strstr(err, "emulate_delay_us"),
          "a negative delay is refused: %s", err);
}

/* A receiver that does not read for longer than TCP_USER_TIMEOUT and dead_ms: the
 * receiver's window and then the sender's queue fill and the sender is refused; the
 * link survives, both sides keep hearing heartbeats, and nothing is lost. */
static void test_queue_bound(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.send_queue_bytes = 1 << 20;
    cb.recv_queue_bytes = 1 << 20;
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    const int ne = 65536; /* 256 KiB frames */
    float *x = calloc(ne, sizeof(float));
    int32_t seq = 0;
    int64_t pos = 0;
    char err[ERRLEN];
    int sent = 0, rc = 0;
    for (; sent < 400; sent++) {
        x[0] = (float)sent;
        struct dp_activations act = {.step = (uint64_t)sent, .n = 1, .n_embd = ne, .seq = &seq, .pos = &pos, .x = x};
        rc = dp_send_activations(a, &act, 300, err, sizeof err);
        if (rc)
            break;
    }
    CHECK(rc == CAIRN_EFULL && strstr(err, "send queue full"), "queue fills: rc %d '%s' after %d", rc, err, sent);
    CHECK(sent >= 4 && sent <= 12, "%d frames of 256 KiB accepted (1 MiB window + 1 MiB queue)", sent);
    struct dp_stats st;
    dp_get_stats(a, &st);
    CHECK(st.send_queued <= (1 << 20) + (300 << 10), "send queue holds %zu bytes", st.send_queued);
    /* longer than dead_ms: b is paused by its reader, a still hears b's heartbeats */
    struct timespec ts = {6, 0};
    nanosleep(&ts, NULL);
    CHECK(dp_peer_alive(a) && dp_peer_alive(b), "both alive after 6 s of back-pressure: '%s' '%s'", dp_error(a),
          dp_error(b));
    dp_get_stats(a, &st);
    CHECK(st.hb_rtt_us >= 0 && st.hb_rtt_us < 1000000 && st.hb_rtt_min_us >= 0 && st.hb_rtt_min_us <= st.hb_rtt_us,
          "heartbeat round trip %lld us (min %lld)", (long long)st.hb_rtt_us, (long long)st.hb_rtt_min_us);
    CHECK(st.heartbeats_received >= 10, "%llu heartbeats in 6 s", (unsigned long long)st.heartbeats_received);
    CHECK(st.credit_wait_us == 0 && st.send_queued > 0, "still waiting for credit: %lld us so far, %zu queued",
          (long long)st.credit_wait_us, st.send_queued);
    dp_get_stats(b, &st);
    CHECK(st.recv_queued <= (1 << 20) + 4 * 1024, "receive queue holds %zu bytes (window 1 MiB)", st.recv_queued);
    CHECK(st.heartbeats_received >= 10, "b heard %llu heartbeats", (unsigned long long)st.heartbeats_received);
    struct dp_frame f;
    int got = 0;
    while (got < sent && dp_recv(b, &f, 5000, err, sizeof err) == 1)
        got += f.type == DP_T_ACTIVATIONS && f.act.step == (uint64_t)got && f.act.x[0] == (float)got;
    CHECK_EQ_INT(got, sent);
    dp_get_stats(a, &st);
    CHECK(st.credit_wait_us >= 5000000, "a waited %lld us for credit", (long long)st.credit_wait_us);
    /* b has every frame; a's sender thread counts the last write a moment after it. */
    for (int i = 0; i < 500 && st.send_queued; i++) {
        struct timespec pause = {0, 10 * 1000000L};
        nanosleep(&pause, NULL);
        dp_get_stats(a, &st);
    }
    CHECK(st.send_queued == 0, "send queue drained: %zu", st.send_queued);
    dp_close(a, NULL);
    dp_close(b, NULL);
    free(x);
}

/* ---- dead and silent peers ---- */

/* A forked child connects as rank 0 and then sends a ping every 100 ms forever. */
static pid_t spawn_child(int port)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid)
        return pid;
    struct dp_config c;
    base_cfg(&c, 0, 1);
    struct dp_conn *conn;
    char err[ERRLEN];
    if (dp_connect(&conn, "127.0.0.1", port, &c, 5000, err, sizeof err))
        _exit(3);
    float x[32] = {0};
    int32_t seq = 0;
    int64_t pos = 0;
    for (uint64_t s = 0;; s++) {
        struct dp_activations act = {.step = s, .n = 1, .n_embd = 32, .seq = &seq, .pos = &pos, .x = x};
        if (dp_send_activations(conn, &act, 1000, err, sizeof err) == CAIRN_EIO)
            _exit(4);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
}

/* Accepts the child and reads until the connection ends; returns ms from `at` (set by
 * the caller's action through act()) to the error. */
static void test_dead_child(struct dp_listener *l, int sig)
{
    pid_t pid = spawn_child(dp_listener_port(l));
    struct dp_config cb;
    base_cfg(&cb, 1, 0);
    struct dp_conn *b = NULL;
    char err[ERRLEN];
    int rc = dp_accept(l, &cb, 10000, &b, err, sizeof err);
    CHECK(rc == 1, "accept child: rc %d %s", rc, err);
    if (rc != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return;
    }
    struct dp_frame f;
    int pings = 0;
    while (pings < 3 && dp_recv(b, &f, 3000, err, sizeof err) == 1)
        pings++;
    CHECK_EQ_INT(pings, 3);
    int64_t t0 = clock_ns();
    kill(pid, sig);
    while ((rc = dp_recv(b, &f, 10000, err, sizeof err)) == 1) {
    }
    double ms = ms_since(t0);
    bool alive = dp_peer_alive(b);
    if (sig == SIGKILL) {
        CHECK(rc == CAIRN_EIO && strstr(err, "closed by rank 0"), "killed child: rc %d '%s'", rc, err);
        CHECK(ms < 2000, "killed child noticed in %.0f ms", ms);
        printf("dead peer (SIGKILL) detected in %.1f ms: %s\n", ms, err);
    } else {
        CHECK(rc == CAIRN_EIO && strstr(err, "silent"), "stopped child: rc %d '%s'", rc, err);
        CHECK(ms >= 2500 && ms < 5000, "stopped child noticed in %.0f ms (dead after 3000 ms of silence)", ms);
        printf("silent peer (SIGSTOP) detected in %.1f ms: %s\n", ms, err);
    }
    CHECK(!alive, "peer not alive");
    CHECK(strlen(dp_error(b)) > 0, "dp_error says why");
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    dp_close(b, NULL);
}

/* A link where nothing passes any more (the proxy drops everything): both sides call
 * the peer dead. */
static void test_blackhole(struct dp_listener *l)
{
    struct proxy p;
    proxy_start(&p, dp_listener_port(l));
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.dead_ms = cb.dead_ms = 1500;
    struct dp_conn *a = NULL, *b = NULL;
    int rca, rcb;
    char ea[ERRLEN], eb[ERRLEN];
    if (pair_open(l, p.port, &ca, &cb, &a, &b, &rca, &rcb, ea, eb)) {
        CHECK(ping(a, b, 1), "through the proxy");
        int64_t t0 = clock_ns();
        atomic_store(&p.blackhole, true);
        struct dp_frame f;
        int ra = dp_recv(a, &f, 10000, ea, sizeof ea);
        int rb = dp_recv(b, &f, 10000, eb, sizeof eb);
        double ms = ms_since(t0);
        CHECK(ra == CAIRN_EIO && strstr(ea, "silent") && rb == CAIRN_EIO && strstr(eb, "silent"),
              "black hole: '%s' / '%s'", ea, eb);
        CHECK(ms >= 1000 && ms < 4000, "black hole noticed in %.0f ms (dead after 1500)", ms);
    } else {
        CHECK(false, "proxy pair: %s / %s", ea, eb);
    }
    dp_close(a, NULL);
    dp_close(b, NULL);
    proxy_stop(&p);
}

/* ---- garbage ---- */

static size_t mk_frame(uint8_t *out, int version, int type, uint16_t flags, uint32_t len, uint32_t pcrc,
                       const void *payload, size_t plen)
{
    struct dp_hdr h = {.version = (uint8_t)version, .type = (uint8_t)type, .flags = flags, .len = len,
                       .payload_crc = pcrc};
    dp_hdr_pack(out, &h);
    memcpy(out + DP_HDR_SIZE, payload, plen);
    return DP_HDR_SIZE + plen;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void test_garbage(struct dp_listener *l)
{
    /* a good connection that must keep working throughout */
    struct dp_config ga, gb;
    base_cfg(&ga, 0, 1);
    base_cfg(&gb, 1, 0);
    ga.instance_id = gb.instance_id = "good";
    struct dp_conn *g1 = NULL, *g2 = NULL;
    if (!simple_pair(l, &ga, &gb, &g1, &g2))
        return;
    uint64_t gstep = 1000;
    char err[ERRLEN];

    /* before the handshake, straight at the listener */
    struct {
        const char *name, *want;
    } pre[] = {{"random", "magic"}, {"long hello", "over the limit"}, {"hangup", "closed"},
               {"data frame", "unexpected ACTIVATIONS"}};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
        int fd = raw_connect(dp_listener_port(l));
        uint8_t buf[256];
        size_t n = 0;
        if (i == 0) {
            for (n = 0; n < 64; n++)
                buf[n] = (uint8_t)test_rand_u64(&rng);
        } else if (i == 1) {
            n = mk_frame(buf, 1, DP_T_HELLO, 0, 100000, 0, "", 0);
        } else if (i == 3) {
            n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 8, 0, "12345678", 8);
        }
        if (n)
            write_full(fd, buf, n);
        else
            shutdown(fd, SHUT_WR);
        struct dp_config cb;
        base_cfg(&cb, 1, 0);
        struct dp_conn *b = NULL;
        err[0] = 0;
        int rc = dp_accept(l, &cb, 5000, &b, err, sizeof err);
        CHECK(rc < 0 && !b && strstr(err, pre[i].want), "pre-handshake %s: rc %d '%s'", pre[i].name, rc, err);
        close(fd);
        dp_close(b, NULL);
        CHECK(ping(g1, g2, gstep++), "good connection after %s", pre[i].name);
    }

    /* after the handshake, through a proxy that injects between two frames */
    uint8_t act_bad[64] = {0};
    {   /* ACTIVATIONS claiming 1000000 x 4096 in 64 bytes */
        uint64_t step = 1;
        uint32_t n = 1000000, ne = 4096, dt = DT_F32;
        memcpy(act_bad, &step, 8);
        memcpy(act_bad + 8, &n, 4);
        memcpy(act_bad + 12, &ne, 4);
        memcpy(act_bad + 16, &dt, 4);
    }
    uint8_t act_neg[64] = {0};
    {   /* one token of 4 F32 at position -5 */
        uint64_t step = 2;
        uint32_t n = 1, ne = 4;
        int64_t pos = -5;
        memcpy(act_neg, &step, 8);
        memcpy(act_neg + 8, &n, 4);
        memcpy(act_neg + 12, &ne, 4);
        memcpy(act_neg + 24, &pos, 8);
    }
    /* one token of 4 F32 with an ask: need (7: none such) at byte 56 */
    uint8_t act_ask[120] = {0};
    {
        uint64_t step = 3;
        uint32_t n = 1, ne = 4, na = 1, need = 7;
        memcpy(act_ask, &step, 8);
        memcpy(act_ask + 8, &n, 4);
        memcpy(act_ask + 12, &ne, 4);
        memcpy(act_ask + 20, &na, 4);
        act_ask[36] = 1; /* wanted */
        memcpy(act_ask + 56, &need, 4);
    }
    uint8_t act_unwanted[120];
    memcpy(act_unwanted, act_ask, sizeof act_ask);
    act_unwanted[36] = 0;
    act_unwanted[56] = DP_ROW_LOGITS;
    /* a SAMPLED RESULT of one entry (need at byte 44) and one token (n_top at byte 60) */
    uint8_t res_sampled[64] = {0};
    {
        uint32_t n = 1, kind = DP_RESULT_SAMPLED, nv = 10;
        int32_t ntop = 5;
        memcpy(res_sampled + 8, &n, 4);
        memcpy(res_sampled + 12, &kind, 4);
        memcpy(res_sampled + 16, &nv, 4);
        res_sampled[44] = 9;
        memcpy(res_sampled + 60, &ntop, 4);
    }
    uint8_t res_short[64];
    memcpy(res_short, res_sampled, sizeof res_sampled);
    res_short[44] = DP_ROW_SAMPLE;
    struct {
        const char *name, *want;
    } post[] = {
        {"ask need 7", "ask 0 out of range"},
        {"ask for an unwanted token", "1 asks for 0 wanted tokens"},
        {"sampled need 9", "need 9"},
        {"sampled tops missing", "5 top and 0 logits rows of 10 needs 104 bytes"},
        {"random", "magic"},
        {"huge length", "over the limit"},
        {"version", "unsupported frame version"},
        {"truncated", "in the middle of a ACTIVATIONS frame (10 of 1000"},
        {"truncated header", "in the middle of a frame header (7 of"},
        {"sizes", "need"},
        {"negative pos", "pos -5"},
        {"payload crc", "checksum"},
        {"unknown type", "unknown frame type"},
        {"late hello", "unexpected HELLO"},
        {"window overrun", "overran the flow-control window"},
        {"bad credit", "CREDIT for"},
    };
    uint8_t *buf = malloc(INJECT_MAX);
    for (size_t i = 0; i < sizeof post / sizeof post[0]; i++) {
        size_t n = 0;
        bool close_after = false;
        switch ((int)i - 4) {
        case -4: n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 120, 0, act_ask, 120); break;
        case -3: n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 120, 0, act_unwanted, 120); break;
        case -2: n = mk_frame(buf, 1, DP_T_RESULT, 0, 64, 0, res_sampled, 64); break;
        case -1: n = mk_frame(buf, 1, DP_T_RESULT, 0, 64, 0, res_short, 64); break;
        case 0:
            for (n = 0; n < 100; n++)
                buf[n] = (uint8_t)test_rand_u64(&rng);
            buf[0] = 0; /* never the magic by chance */
            break;
        case 1: n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 0xfffffff0u, 0, "", 0); break;
        case 2: n = mk_frame(buf, 9, DP_T_ACTIVATIONS, 0, 8, 0, "12345678", 8); break;
        case 3:
            n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 1000, 0, "0123456789", 10);
            close_after = true;
            break;
        case 4:
            n = 7;
            mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 0, 0, "", 0);
            close_after = true;
            break;
        case 5: n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 64, 0, act_bad, 64); break;
        case 6: n = mk_frame(buf, 1, DP_T_ACTIVATIONS, 0, 56, 0, act_neg, 56); break;
        case 7: n = mk_frame(buf, 1, DP_T_CONTROL, DP_F_PAYLOAD_CRC, 16, 12345, act_bad, 16); break;
        case 8: n = mk_frame(buf, 1, 99, 0, 0, 0, "", 0); break;
        case 9: n = mk_frame(buf, 1, DP_T_HELLO, 0, 8, 0, "12345678", 8); break;
        case 10: { /* five well-formed frames of 20 KiB into a 64 KiB window nobody reads */
            const uint32_t ne = 5000;
            size_t plen = 40 + 4 * (size_t)ne;
            uint8_t *pl = calloc(1, plen);
            uint32_t one = 1;
            memcpy(pl + 8, &one, 4);
            memcpy(pl + 12, &ne, 4);
            for (int k = 0; k < 5; k++)
                n += mk_frame(buf + n, 1, DP_T_ACTIVATIONS, 0, (uint32_t)plen, 0, pl, plen);
            free(pl);
            break;
        }
        case 11: { /* credit for bytes never sent */
            uint64_t v = (uint64_t)1 << 40;
            n = mk_frame(buf, 1, DP_T_CREDIT, 0, 8, 0, &v, 8);
            break;
        }
        }
        struct proxy p;
        proxy_start(&p, dp_listener_port(l));
        struct dp_config ca, cb;
        base_cfg(&ca, 0, 1);
        base_cfg(&cb, 1, 0);
        cb.recv_queue_bytes = DP_MIN_WINDOW;
        struct dp_conn *a = NULL, *b = NULL;
        int rca, rcb;
        char ea[ERRLEN], eb[ERRLEN];
        if (!pair_open(l, p.port, &ca, &cb, &a, &b, &rca, &rcb, ea, eb)) {
            CHECK(false, "%s: proxied pair: %s / %s", post[i].name, ea, eb);
            dp_close(a, NULL);
            dp_close(b, NULL);
            proxy_stop(&p);
            continue;
        }
        CHECK(ping(a, b, 1), "%s: proxied pair works", post[i].name);
        int64_t t0 = clock_ns();
        proxy_inject(&p, buf, n, close_after);
        struct dp_frame f;
        int rc;
        while (!atomic_load(&p.injected) && ms_since(t0) < 2000) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        struct timespec settle = {0, 100000000}; /* b's reader stays away while the bytes land */
        nanosleep(&settle, NULL);
        while ((rc = dp_recv(b, &f, 5000, eb, sizeof eb)) == 1) {
        }
        CHECK(rc == CAIRN_EIO && strstr(eb, post[i].want), "%s: acceptor rc %d '%s'", post[i].name, rc, eb);
        CHECK(ms_since(t0) < 1500, "%s: noticed in %.0f ms", post[i].name, ms_since(t0));
        /* the sender learns it too: the goodbye names the bad frame, or the link closed */
        while ((rc = dp_recv(a, &f, 5000, ea, sizeof ea)) == 1) {
        }
        CHECK(rc == CAIRN_EIO, "%s: connector rc %d '%s'", post[i].name, rc, ea);
        if (!close_after)
            CHECK(strstr(ea, "bad frame"), "%s: connector told why: '%s'", post[i].name, ea);
        dp_close(a, NULL);
        dp_close(b, NULL);
        proxy_stop(&p);
        CHECK(ping(g1, g2, gstep++) && ping(g2, g1, gstep++), "good connection after %s", post[i].name);
    }
    free(buf);
    CHECK(dp_peer_alive(g1) && dp_peer_alive(g2), "good connection alive");
    dp_close(g1, NULL);
    dp_close(g2, NULL);
}

/* ---- one waiter over two connections ---- */

struct waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
};

static void waker_notify(void *arg)
{
    struct waker *w = arg;
    pthread_mutex_lock(&w->mu);
    w->count++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- sealed connections ---- */

/* Where the last frame of type in p's capture starts (walking its headers); -1: none.
 * *len gets its size. */
static long last_frame_of(struct proxy *p, int type, size_t *len)
{
    long at = -1;
    pthread_mutex_lock(&p->mu);
    for (size_t off = 0; off + DP_HDR_SIZE <= p->cap_len;) {
        uint32_t plen;
        memcpy(&plen, p->cap + off + 8, 4);
        size_t whole = DP_HDR_SIZE + (size_t)plen;
        if (off + whole > p->cap_len)
            break;
        if (p->cap[off + 5] == type) {
            at = (long)off;
            *len = whole;
        }
        off += whole;
    }
    pthread_mutex_unlock(&p->mu);
    return at;
}

/* Sends 4 x 256 floats of one recognizable value from a to b through p; true when they
 * arrive intact. Then reports whether 64 bytes of that value were seen on the wire. */
static bool send_marked(struct proxy *p, struct dp_conn *a, struct dp_conn *b, bool *in_clear)
{
    enum { N = 4, NE = 256 };
    static float x[N * NE];
    for (int i = 0; i < N * NE; i++)
        x[i] = 1234.5f;
    int32_t seq[N] = {0, 1, 2, 3};
    int64_t pos[N] = {0, 0, 0, 0};
    struct dp_activations act = {.step = 42, .n = N, .n_embd = NE, .seq = seq, .pos = pos, .x = x};
    char err[ERRLEN];
    struct dp_frame f;
    bool ok = dp_send_activations(a, &act, 2000, err, sizeof err) == 0 && dp_recv(b, &f, 5000, err, sizeof err) == 1 &&
              f.type == DP_T_ACTIVATIONS && f.act.n == N && !memcmp(f.act.x, x, sizeof x);
    uint8_t pattern[64];
    for (int i = 0; i < 16; i++)
        memcpy(pattern + 4 * i, &x[0], 4);
    size_t got = 0;
    for (int t = 0; t < 200 && got < sizeof x; t++) { /* the proxy may still be copying it */
        pthread_mutex_lock(&p->mu);
        got = p->cap_len;
        pthread_mutex_unlock(&p->mu);
        if (got < sizeof x)
            usleep(10000);
    }
    pthread_mutex_lock(&p->mu);
    *in_clear = memmem(p->cap, p->cap_len, pattern, sizeof pattern) != NULL;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

/* With a secret, frames after the handshake are sealed: a proxy in the middle sees no
 * activation values in clear (without a secret it does, so the check can fail), and a
 * frame it alters, replays or slips in unsealed ends the connection with the reason. */
static void test_sealed(struct dp_listener *l)
{
    const char *secrets[] = {NULL, "a cluster key"};
    for (int k = 0; k < 2; k++) {
        struct proxy p;
        proxy_start(&p, dp_listener_port(l));
        struct dp_config ca, cb;
        base_cfg(&ca, 0, 1);
        base_cfg(&cb, 1, 0);
        ca.secret = cb.secret = secrets[k];
        struct dp_conn *a = NULL, *b = NULL;
        int rca, rcb;
        char ea[ERRLEN], eb[ERRLEN];
        bool in_clear = false;
        if (pair_open(l, p.port, &ca, &cb, &a, &b, &rca, &rcb, ea, eb)) {
            CHECK(send_marked(&p, a, b, &in_clear), "%s: the values arrive", k ? "sealed" : "open");
            CHECK(in_clear == !k, "%s: the values are %s on the wire", k ? "sealed" : "open",
                  in_clear ? "readable" : "not readable");
            CHECK(ping(a, b, 7) && ping(b, a, 8), "%s: frames both ways", k ? "sealed" : "open");
        } else {
            CHECK(false, "proxied pair: %s / %s", ea, eb);
        }
        dp_close(a, NULL);
        dp_close(b, NULL);
        proxy_stop(&p);
    }

    /* tampering on a sealed connection */
    const char *cases[] = {"flip", "replay", "unsealed"};
    for (int c = 0; c < 3; c++) {
        struct proxy p;
        proxy_start(&p, dp_listener_port(l));
        struct dp_config ca, cb;
        base_cfg(&ca, 0, 1);
        base_cfg(&cb, 1, 0);
        ca.secret = cb.secret = "a cluster key";
        struct dp_conn *a = NULL, *b = NULL;
        int rca, rcb;
        char ea[ERRLEN], eb[ERRLEN];
        if (!pair_open(l, p.port, &ca, &cb, &a, &b, &rca, &rcb, ea, eb)) {
            CHECK(false, "%s: proxied pair: %s / %s", cases[c], ea, eb);
            proxy_stop(&p);
            continue;
        }
        CHECK(ping(a, b, 1), "%s: the pair works", cases[c]);
        const char *want = "does not open";
        if (c == 0) {
            atomic_store(&p.flip_next, true);
            ping(a, b, 2);
        } else if (c == 1) {
            size_t len = 0;
            long at = last_frame_of(&p, DP_T_ACTIVATIONS, &len);
            CHECK(at >= 0, "replay: the ping's frame was captured");
            if (at >= 0)
                proxy_inject(&p, p.cap + at, len, false);
        } else {
            uint8_t buf[64], hb[24] = {0};
            size_t n = mk_frame(buf, 1, DP_T_HEARTBEAT, 0, sizeof hb, 0, hb, sizeof hb);
            proxy_inject(&p, buf, n, false);
            want = "an unsealed frame on a sealed connection";
        }
        struct dp_frame f;
        int rc;
        while ((rc = dp_recv(b, &f, 5000, eb, sizeof eb)) == 1) {
        }
        CHECK(rc == CAIRN_EIO && strstr(eb, want), "%s: the acceptor ends the connection: rc %d '%s'", cases[c], rc,
              eb);
        while ((rc = dp_recv(a, &f, 5000, ea, sizeof ea)) == 1) {
        }
        CHECK(rc == CAIRN_EIO && strstr(ea, "bad frame"), "%s: the connector is told why: rc %d '%s'", cases[c], rc,
              ea);
        dp_close(a, NULL);
        dp_close(b, NULL);
        proxy_stop(&p);
    }
}

/* Sealing runs in OpenSSL (dataplane_seal.c); its frames are libsodium's bytes both
 * ways, and one altered bit, or the same frame twice, does not open. */
static void test_seal_bits(void)
{
    static const size_t sizes[] = {0, 1, 17, 64, 4096, 16389, 300001};
    struct dp_seal_dir tx = {.key = {9, 8, 7, 6, 5}}, rx = tx;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t len = sizes[i];
        uint8_t *f = malloc(DP_HDR_SIZE + len + DP_SEAL_TAG), *ref = malloc(len + DP_SEAL_TAG);
        struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_ACTIVATIONS, .len = (uint32_t)len};
        dp_hdr_pack(f, &h);
        for (size_t k = 0; k < len; k++)
            f[DP_HDR_SIZE + k] = (uint8_t)(k * 131 + i);
        memcpy(ref, f + DP_HDR_SIZE, len);
        uint64_t n = tx.n;
        size_t whole = dp_seal_frame(&tx, f, len);
        uint8_t nonce[12] = {0};
        memcpy(nonce, &n, 8);
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(ref, ref + len, NULL, ref, len, f, DP_HDR_SIZE, NULL,
                                                           nonce, tx.key);
        CHECK(whole == DP_HDR_SIZE + len + DP_SEAL_TAG && !memcmp(f + DP_HDR_SIZE, ref, len + DP_SEAL_TAG),
              "%zu bytes: sealed as libsodium seals them", len);
        uint8_t *g = malloc(len + DP_SEAL_TAG + 1);
        memcpy(g, f + DP_HDR_SIZE, len + DP_SEAL_TAG);
        g[len / 2] ^= 0x10; /* the tag's first byte when len is 0 */
        CHECK(dp_open_frame(&rx, f, g, len + DP_SEAL_TAG) == -1 && rx.n == n, "%zu bytes: one bit off does not open",
              len);
        CHECK(crypto_aead_chacha20poly1305_ietf_decrypt_detached(ref, NULL, ref, len, ref + len, f, DP_HDR_SIZE,
                                                                 nonce, tx.key) == 0,
              "%zu bytes: libsodium opens it", len);
        memcpy(g, f + DP_HDR_SIZE, len + DP_SEAL_TAG);
        bool same = true;
        CHECK(dp_open_frame(&rx, f, f + DP_HDR_SIZE, len + DP_SEAL_TAG) == (long)len, "%zu bytes: opens", len);
        for (size_t k = 0; k < len; k++)
            same = same && f[DP_HDR_SIZE + k] == (uint8_t)(k * 131 + i) && ref[k] == f[DP_HDR_SIZE + k];
        CHECK(same, "%zu bytes: opened to the plain bytes", len);
        CHECK(dp_open_frame(&rx, f, g, len + DP_SEAL_TAG) == -1, "%zu bytes: a replay does not open", len);
        free(f);
        free(ref);
        free(g);
    }
    dp_seal_release(&tx);
    dp_seal_release(&rx);
    dp_seal_release(&rx); /* twice is harmless */
}

struct late_send {
    struct dp_conn *c;
    int delay_ms;
    uint64_t step;
    int rc;
};

static void *late_send_main(void *arg)
{
    struct late_send *ls = arg;
    usleep((useconds_t)ls->delay_ms * 1000);
    float x[32] = {[31] = (float)ls->step};
    int32_t seq = 0;
    int64_t pos = 0;
    struct dp_activations act = {.step = ls->step, .n = 1, .n_embd = 32, .seq = &seq, .pos = &pos, .x = x};
    char err[ERRLEN];
    ls->rc = dp_send_activations(ls->c, &act, 2000, err, sizeof err);
    return NULL;
}

/* dp_recv_spin on a sealed pair: frames small and larger than the socket takes at once
 * (the caller's write leaves the rest to the I/O thread) arrive whole and in order both
 * ways; a frame that comes after the spin budget still arrives (blocking); and once no
 * caller spins, the I/O thread reads again for a plain dp_recv. */
static void test_spin(struct dp_listener *l)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.secret = cb.secret = "spin key";
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    static const int widths[] = {32, 1024, 4096, 1 << 20};
    float *x = malloc(((size_t)1 << 20) * sizeof *x);
    int32_t seq = 0;
    int64_t pos = 0;
    char err[ERRLEN];
    int ok = 0, rounds = 64;
    for (int r = 0; r < rounds; r++) {
        int w = widths[r % 4];
        struct dp_conn *from = r % 2 ? b : a, *to = r % 2 ? a : b;
        for (int k = 0; k < w; k++)
            x[k] = (float)(r * 7 + k % 1000);
        struct dp_activations act = {.step = (uint64_t)r + 1, .n = 1, .n_embd = w, .seq = &seq, .pos = &pos, .x = x};
        if (dp_send_activations(from, &act, 5000, err, sizeof err)) {
            CHECK(false, "spin round %d: send: %s", r, err);
            break;
        }
        struct dp_frame f;
        int rc = dp_recv_spin(to, &f, 5000, 5000, err, sizeof err);
        bool same = rc == 1 && f.type == DP_T_ACTIVATIONS && f.act.step == (uint64_t)r + 1 && f.act.n_embd == w;
        for (int k = 0; same && k < w; k += 97)
            same = f.act.x[k] == (float)(r * 7 + k % 1000);
        ok += same && f.act.x[w - 1] == (float)(r * 7 + (w - 1) % 1000);
    }
    CHECK(ok == rounds, "spin: %d of %d frames arrived whole and in order", ok, rounds);

    /* later than the spin budget: the wait blocks and the I/O thread reads it */
    struct late_send ls = {.c = a, .delay_ms = 100, .step = 1000};
    pthread_t th;
    pthread_create(&th, NULL, late_send_main, &ls);
    struct dp_frame f;
    int rc = dp_recv_spin(b, &f, 200, 5000, err, sizeof err);
    pthread_join(th, NULL);
    CHECK(ls.rc == 0 && rc == 1 && f.act.step == 1000 && f.act.x[31] == 1000.0f,
          "a frame after the spin budget arrives: rc %d", rc);

    /* spin (direct reading on), then a plain wait: the I/O thread must read again */
    CHECK(ping(a, b, 1001), "a ping");
    ls = (struct late_send){.c = a, .delay_ms = 50, .step = 1002};
    pthread_create(&th, NULL, late_send_main, &ls);
    rc = dp_recv_spin(b, &f, 100000, 5000, err, sizeof err);
    pthread_join(th, NULL);
    CHECK(rc == 1 && f.act.step == 1002, "a frame within the spin: rc %d", rc);
    ls = (struct late_send){.c = a, .delay_ms = 50, .step = 1003};
    pthread_create(&th, NULL, late_send_main, &ls);
    rc = dp_recv(b, &f, 3000, err, sizeof err);
    pthread_join(th, NULL);
    CHECK(rc == 1 && f.act.step == 1003, "after a spin, a plain dp_recv gets the next frame: rc %d", rc);
    struct dp_stats sa, sb;
    dp_get_stats(a, &sa);
    dp_get_stats(b, &sb);
    CHECK(sb.activations_received == (uint64_t)rounds / 2 + 4 && sa.activations_sent == (uint64_t)rounds / 2 + 4 &&
              sa.sealed_bytes_sent == sa.bytes_sent,
          "counts: a sent %llu activations, b took %llu; every byte sealed",
          (unsigned long long)sa.activations_sent, (unsigned long long)sb.activations_received);
    free(x);
    dp_close(a, NULL);
    dp_close(b, NULL);
}

static void test_notify(struct dp_listener *l)
{
    struct waker w = {.count = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    /* the middle rank 1: one connection from rank 0, one to rank 2 */
    struct dp_listener *l2;
    char err[ERRLEN];
    dp_listen(&l2, "127.0.0.1", 0, err, sizeof err);
    struct dp_config c0, c1a, c1b, c2;
    base_cfg(&c0, 0, 1);
    base_cfg(&c1a, 1, 0);
    base_cfg(&c1b, 1, 2);
    base_cfg(&c2, 2, 1);
    c1a.notify = c1b.notify = waker_notify;
    c1a.notify_arg = c1b.notify_arg = &w;
    struct dp_conn *r0 = NULL, *r1_prev = NULL, *r1_next = NULL, *r2 = NULL;
    bool ok = simple_pair(l, &c0, &c1a, &r0, &r1_prev) && simple_pair(l2, &c1b, &c2, &r1_next, &r2);
    if (ok) {
        float x[32] = {1};
        int32_t seq = 0;
        int64_t pos = 0;
        struct dp_activations act = {.step = 1, .n = 1, .n_embd = 32, .seq = &seq, .pos = &pos, .x = x};
        int32_t tok = 7;
        float lp = 0;
        struct dp_result r = {.step = 9, .n = 1, .kind = DP_RESULT_TOKENS, .seq = &seq, .pos = &pos, .token = &tok,
                              .logprob = &lp};
        dp_send_activations(r0, &act, 1000, err, sizeof err);
        dp_send_result(r2, &r, 1000, err, sizeof err);
        /* wait on the one condition variable until both frames are in */
        int got_act = 0, got_res = 0;
        int64_t deadline = clock_ns() + 5000 * 1000000LL;
        while ((!got_act || !got_res) && clock_ns() < deadline) {
            struct dp_frame f;
            if (dp_recv(r1_prev, &f, 0, err, sizeof err) == 1)
                got_act += f.type == DP_T_ACTIVATIONS;
            if (dp_recv(r1_next, &f, 0, err, sizeof err) == 1)
                got_res += f.type == DP_T_RESULT;
            pthread_mutex_lock(&w.mu);
            if (!w.count) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&w.cv, &w.mu, &ts);
            }
            w.count = 0;
            pthread_mutex_unlock(&w.mu);
        }
        CHECK(got_act == 1 && got_res == 1, "one waiter saw both: act %d res %d", got_act, got_res);
        /* the end of a connection notifies too */
        pthread_mutex_lock(&w.mu);
        w.count = 0;
        pthread_mutex_unlock(&w.mu);
        dp_close(r2, "bye");
        r2 = NULL;
        pthread_mutex_lock(&w.mu);
        for (int i = 0; i < 50 && !w.count; i++) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&w.cv, &w.mu, &ts);
        }
        CHECK(w.count > 0, "notified of the goodbye");
        pthread_mutex_unlock(&w.mu);
    }
    dp_close(r0, NULL);
    dp_close(r1_prev, NULL);
    dp_close(r1_next, NULL);
    dp_close(r2, NULL);
    dp_listener_close(l2);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
}

/* ---- timings ---- */

struct echo {
    struct dp_conn *c;
    int reps;
};

/* The "last rank": answers every ACTIVATIONS with one sampled token per token. */
static void *echo_main(void *arg)
{
    struct echo *e = arg;
    char err[ERRLEN];
    static int32_t tok[512];
    static float lp[512];
    for (int i = 0; i < e->reps; i++) {
        struct dp_frame f;
        if (dp_recv(e->c, &f, 10000, err, sizeof err) != 1 || f.type != DP_T_ACTIVATIONS)
            break;
        struct dp_result r = {.step = f.act.step, .n = 1, .kind = DP_RESULT_TOKENS, .seq = f.act.seq,
                              .pos = f.act.pos, .token = tok, .logprob = lp};
        if (dp_send_result(e->c, &r, 10000, err, sizeof err))
            break;
    }
    return NULL;
}

static void bench_one(struct dp_listener *l, int n, int ne, int dt, int reps, const char *secret)
{
    struct dp_config ca, cb;
    base_cfg(&ca, 0, 1);
    base_cfg(&cb, 1, 0);
    ca.max_inflight = 1;
    ca.secret = cb.secret = secret;
    struct dp_conn *a = NULL, *b = NULL;
    if (!simple_pair(l, &ca, &cb, &a, &b))
        return;
    float *x = malloc(sizeof(float) * n * ne);
    int32_t *seq = calloc((size_t)n, sizeof *seq);
    int64_t *pos = calloc((size_t)n, sizeof *pos);
    fill_acts(x, (int64_t)n * ne);
    struct echo e = {.c = b, .reps = reps + 3};
    pthread_t th;
    pthread_create(&th, NULL, echo_main, &e);
    char err[ERRLEN];
    int64_t t0 = 0;
    int done = 0;
    for (int i = 0; i < reps + 3; i++) {
        if (i == 3)
            t0 = clock_ns(); /* after warm-up */
        struct dp_activations act = {.step = (uint64_t)i, .n = n, .n_embd = ne, .wire_dtype = dt, .seq = seq,
                                     .pos = pos, .x = x};
        if (dp_send_activations(a, &act, 10000, err, sizeof err))
            break;
        struct dp_frame f;
        if (dp_recv(a, &f, 10000, err, sizeof err) != 1 || f.type != DP_T_RESULT || f.res.step != (uint64_t)i)
            break;
        done++;
    }
    double us = (double)(clock_ns() - t0) / 1e3 / reps;
    CHECK_EQ_INT(done, reps + 3);
    pthread_join(th, NULL);
    struct dp_stats st;
    dp_get_stats(a, &st);
    printf("round trip %4d x %4d %-4s %-6s (%8lld bytes on the wire): %9.1f us (step rtt avg %.1f us, heartbeat rtt "
           "%lld us)\n", n, ne, dtype_name(dt), secret ? "sealed" : "open", (long long)(dp_wire_bytes(dt, (int64_t)n * ne) + 24 + 13 * n), us,
           st.steps_done ? (double)st.step_rtt_us / (double)st.steps_done : 0.0, (long long)st.hb_rtt_us);
    CHECK(st.steps_done == (uint64_t)(reps + 3), "steps done %llu", (unsigned long long)st.steps_done);
    dp_close(a, NULL);
    dp_close(b, NULL);
    free(x);
    free(seq);
    free(pos);
}

static void test_bench(struct dp_listener *l)
{
    /* sealed beside open, alternately: the seal's cost is the difference */
    for (int k = 0; k < 2; k++) {
        bench_one(l, 1, 2048, DT_F32, 2000, NULL);
        bench_one(l, 1, 2048, DT_F32, 2000, "bench key");
    }
    bench_one(l, 1, 2048, DT_F16, 2000, NULL);
    bench_one(l, 8, 2048, DT_F32, 1000, NULL);
    bench_one(l, 8, 2048, DT_F32, 1000, "bench key");
    for (int k = 0; k < 2; k++) {
        bench_one(l, 512, 2048, DT_F32, 30, NULL);
        bench_one(l, 512, 2048, DT_F32, 30, "bench key");
    }
    bench_one(l, 512, 2048, DT_F16, 30, NULL);
    bench_one(l, 512, 2048, DT_Q8_0, 30, NULL);
    bench_one(l, 512, 4096, DT_F32, 20, NULL);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    (void)argv;
    log_set_level(getenv("CAIRN_TEST_DEBUG") ? LOG_DEBUG : LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    struct dp_listener *l = NULL;
    char err[ERRLEN];
    int rc = dp_listen(&l, "127.0.0.1", 0, err, sizeof err);
    CHECK(rc == 0 && dp_listener_port(l) > 0, "listen: %s", err);
    if (rc)
        return test_main_end();
    RUN(test_header);
    RUN(test_encoding_error);
    RUN(test_handshake_ok, l);
    RUN(test_handshake_refused, l);
    RUN(test_frames, l, false, NULL);
    RUN(test_frames, l, true, NULL);
    RUN(test_frames, l, false, "s"); /* sealed */
    RUN(test_large, l);
    RUN(test_inflight, l);
    RUN(test_emulated_delay, l);
    RUN(test_notify, l);
    RUN(test_garbage, l);
    RUN(test_sealed, l);
    RUN(test_seal_bits);
    RUN(test_spin, l);
    RUN(test_dead_child, l, SIGKILL);
    RUN(test_dead_child, l, SIGSTOP);
    RUN(test_blackhole, l);
    RUN(test_queue_bound, l);
    RUN(test_bench, l);
    dp_listener_close(l);
    return test_main_end();
}
