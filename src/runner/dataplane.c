/* Data plane between runners (dataplane.h). */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "runner/dataplane.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "kern/kern.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the data plane reads little-endian arrays of frames in place"
#endif

_Static_assert(crypto_auth_hmacsha256_BYTES == DP_PROOF_BYTES, "proof is one HMAC-SHA256");
_Static_assert(offsetof(struct dp_ctl, pos) == 16, "dp_ctl layout");

#define MS ((int64_t)1000000)      /* ns */
#define RBUF_SIZE ((size_t)64 << 10) /* staging buffer of the reader */
#define CONNECT_RETRY_MS 100
#define REJECT_DRAIN_MS 500        /* after a REJECT, wait this long for the peer to close */
#define HELLO_FIXED 56             /* HELLO bytes before the id strings */
#define HB_PAYLOAD 24
#define CREDIT_PAYLOAD 8
#define ACT_FIXED 24
#define RES_FIXED 32
#define CTL_FIXED 16
#define BYE_FIXED 8
#define IBUF_SIZE (DP_HDR_SIZE + BYE_FIXED + DP_REASON_MAX)

static const char AUTH_LABEL[] = "cairn dataplane auth v1";

/* ---- little-endian fields ---- */

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* ---- CRC32C, four bits at a time (headers are 16 bytes; payload CRCs are optional) ---- */

static const uint32_t CRC32C_NIBBLE[16] = {
    0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1, 0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
    0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9, 0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
};

uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ CRC32C_NIBBLE[crc & 15];
        crc = (crc >> 4) ^ CRC32C_NIBBLE[crc & 15];
    }
    return ~crc;
}

/* ---- headers ---- */

void dp_hdr_pack(uint8_t out[DP_HDR_SIZE], const struct dp_hdr *h)
{
    put_u32(out, DP_MAGIC);
    out[4] = h->version;
    out[5] = h->type;
    put_u16(out + 6, h->flags);
    put_u32(out + 8, h->len);
    put_u32(out + 12, h->payload_crc);
    put_u32(out + 16, dp_crc32c(0, out, 16));
}

static bool known_type(int t)
{
    return (t >= DP_T_HELLO && t <= DP_T_CREDIT) || (t >= DP_T_ACTIVATIONS && t <= DP_T_CONTROL);
}

/* Frames that count against the receiver's window. */
static bool data_type(int t) { return t >= DP_T_ACTIVATIONS && t <= DP_T_CONTROL; }

static bool handshake_type(int t) { return t >= DP_T_HELLO && t <= DP_T_REJECT; }

static const char *type_name(int t)
{
    switch (t) {
    case DP_T_HELLO: return "HELLO";
    case DP_T_AUTH: return "AUTH";
    case DP_T_OK: return "OK";
    case DP_T_REJECT: return "REJECT";
    case DP_T_HEARTBEAT: return "HEARTBEAT";
    case DP_T_GOODBYE: return "GOODBYE";
    case DP_T_CREDIT: return "CREDIT";
    case DP_T_ACTIVATIONS: return "ACTIVATIONS";
    case DP_T_RESULT: return "RESULT";
    case DP_T_CONTROL: return "CONTROL";
    default: return "unknown";
    }
}

int dp_hdr_parse(const uint8_t in[DP_HDR_SIZE], struct dp_hdr *h, size_t max_payload, char *err,
                 size_t errlen)
{
    uint32_t magic = get_u32(in);
    if (magic != DP_MAGIC)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad frame magic 0x%08" PRIx32, magic);
    uint32_t crc = dp_crc32c(0, in, 16);
    if (crc != get_u32(in + 16))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad frame header checksum");
    h->version = in[4];
    h->type = in[5];
    h->flags = get_u16(in + 6);
    h->len = get_u32(in + 8);
    h->payload_crc = get_u32(in + 12);
    if (h->version != DP_WIRE_VERSION)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unsupported frame version %u (ours is %d)",
                          h->version, DP_WIRE_VERSION);
    if (!known_type(h->type))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown frame type %u", h->type);
    if (h->flags & ~DP_F_KNOWN)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown frame flags 0x%04x", h->flags);
    if (!(h->flags & DP_F_PAYLOAD_CRC) && h->payload_crc)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "payload checksum set without its flag");
    size_t limit = handshake_type(h->type) ? DP_HANDSHAKE_MAX : max_payload;
    if (h->type == DP_T_HEARTBEAT)
        limit = HB_PAYLOAD;
    else if (h->type == DP_T_CREDIT)
        limit = CREDIT_PAYLOAD;
    if (h->len > limit)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s payload of %" PRIu32 " bytes over the limit of %zu",
                          type_name(h->type), h->len, limit);
    return 0;
}

/* ---- wire encodings ---- */

static bool wire_dtype_ok(int dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_Q8_0; }

int64_t dp_wire_bytes(int dtype, int64_t n)
{
    if (!wire_dtype_ok(dtype) || n < 0 || n > ((int64_t)1 << 40))
        return -1;
    return dtype_row_bytes(dtype, n);
}

int dp_encoding_error(int dtype, const float *x, int64_t n, struct dp_enc_error *out)
{
    memset(out, 0, sizeof *out);
    int64_t wb = dp_wire_bytes(dtype, n);
    if (wb < 0 || (n > 0 && !x))
        return CAIRN_EINVAL;
    void *wire = malloc((size_t)wb + 1);
    float *y = malloc((size_t)n * sizeof(float) + 1);
    if (!wire || !y) {
        free(wire);
        free(y);
        return CAIRN_ENOMEM;
    }
    int rc = kern_quantize_row(dtype, x, wire, n);
    if (!rc)
        rc = kern_dequantize_row(dtype, wire, y, n);
    if (!rc) {
        double se = 0, sx = 0;
        for (int64_t b = 0; b < n; b += 32) {
            int64_t e = b + 32 < n ? b + 32 : n;
            double bmax = 0, berr = 0;
            for (int64_t i = b; i < e; i++) {
                double xi = x[i], d = fabs((double)y[i] - xi);
                se += d * d;
                sx += xi * xi;
                if (d > out->max_abs)
                    out->max_abs = d;
                if (xi != 0 && d / fabs(xi) > out->max_rel)
                    out->max_rel = d / fabs(xi);
                if (fabs(xi) > bmax)
                    bmax = fabs(xi);
                if (d > berr)
                    berr = d;
            }
            double br = bmax > 0 ? berr / bmax : (berr > 0 ? INFINITY : 0);
            if (br > out->max_rel_block)
                out->max_rel_block = br;
        }
        out->rms_rel = sx > 0 ? sqrt(se / sx) : (se > 0 ? INFINITY : 0);
    }
    free(wire);
    free(y);
    return rc ? CAIRN_EINVAL : 0;
}

/* ---- frames in memory ---- */

/* A frame in a queue, either direction: the struct, then (16-aligned) the payload,
 * preceded by its header. */
struct frame {
    struct frame *next;
    uint8_t *hdr, *payload;
    size_t len;       /* payload bytes */
    size_t mem;       /* bytes counted against its queue */
    size_t wire;      /* header and payload: what a data frame counts against the window */
    int type;
    int64_t t_queued; /* send: clock_ns when queued */
    float *x;         /* receive: decoded activations when they did not travel as F32 */
    char *text;       /* receive: NUL-terminated message or reason */
    struct dp_frame view;
};

#define DATA_OFF ((sizeof(struct frame) + DP_HDR_SIZE + 15) & ~(size_t)15)

static struct frame *frame_new(size_t len)
{
    if (len > SIZE_MAX - DATA_OFF)
        return NULL;
    struct frame *f = malloc(DATA_OFF + len);
    if (!f)
        return NULL;
    memset(f, 0, sizeof *f);
    f->payload = (uint8_t *)f + DATA_OFF;
    f->hdr = f->payload - DP_HDR_SIZE;
    f->len = len;
    f->mem = DATA_OFF + len;
    f->wire = DP_HDR_SIZE + len;
    return f;
}

static void frame_free(struct frame *f)
{
    if (!f)
        return;
    free(f->x);
    free(f->text);
    free(f);
}

static void frames_free(struct frame *f)
{
    while (f) {
        struct frame *n = f->next;
        frame_free(f);
        f = n;
    }
}

/* ---- the connection ---- */

struct win_slot {
    uint64_t step;
    int64_t t_sent;
};

struct dp_conn {
    int fd;
    int wake[2];              /* pipe: callers -> I/O thread */
    pthread_t io;
    bool io_started;
    bool connector;

    /* settings (after defaults) */
    int rank, peer_rank;
    int max_inflight;
    size_t max_payload, tx_cap, rx_cap; /* rx_cap is our window, announced in HELLO */
    uint64_t peer_window;
    int64_t hb_ns, dead_ns, linger_ns;
    int64_t delay_ns;         /* emulated one-way delay of data frames (dp_config.emulate_delay_us) */
    bool payload_crc;
    void (*notify)(void *arg);
    void *notify_arg;
    char peer_addr[INET6_ADDRSTRLEN + 8];
    char label[96];           /* "rank 0 -> rank 1 (127.0.0.1:5000)" for logs */

    pthread_mutex_t mu;
    pthread_cond_t tx_cv;     /* room in the send queue, a free in-flight slot, the end */
    pthread_cond_t rx_cv;     /* a frame in the receive queue, the end */
    /* under mu */
    struct frame *txh, *txt;
    size_t tx_bytes;          /* queued, reserved and being written */
    struct frame *rxh, *rxt;
    size_t rx_bytes;
    struct frame *cur;        /* returned by the last dp_recv */
    struct win_slot *win;     /* max_inflight slots */
    int win_n;
    bool closing;
    int64_t close_deadline;
    /* flow control: totals of data-frame bytes (header and payload) */
    uint64_t sent_data;       /* handed to the socket */
    uint64_t peer_consumed;   /* the peer's last CREDIT */
    uint64_t recv_data;       /* received */
    uint64_t consumed;        /* returned by dp_recv (or dropped) */
    uint64_t announced;       /* consumed as of our last CREDIT */
    int64_t stall_since;      /* clock_ns when the head frame began waiting for credit; 0 */
    char close_reason[DP_REASON_MAX + 1];
    struct dp_stats st;

    _Atomic bool ended;       /* set once, after reason */
    _Atomic int64_t last_rx;  /* clock_ns of the last byte from the peer */
    char reason[DP_REASON_MAX + 64];

    /* I/O thread only */
    uint8_t *rbuf;
    size_t rbuf_len, rbuf_off;
    uint8_t in_hdr[DP_HDR_SIZE];
    size_t in_hdr_got;
    struct dp_hdr in_h;
    struct frame *in_f;       /* payload being read */
    size_t in_got;
    uint64_t hb_peer_t;       /* the peer's clock in its last heartbeat */
    int64_t hb_peer_rx;       /* when that heartbeat arrived */
    bool pushed;              /* frames queued since the last notify */
};

static void wake_io(struct dp_conn *c)
{
    char b = 1;
    ssize_t r = write(c->wake[1], &b, 1);
    (void)r; /* a full pipe already wakes the thread */
}

/* Ends the connection once (the first reason wins); wakes every waiter. */
static void conn_end(struct dp_conn *c, bool error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_end(struct dp_conn *c, bool error, const char *fmt, ...)
{
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->ended)) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reason, sizeof c->reason, fmt, ap);
    va_end(ap);
    atomic_store(&c->ended, true);
    pthread_cond_broadcast(&c->tx_cv);
    pthread_cond_broadcast(&c->rx_cv);
    bool closing = c->closing;
    pthread_mutex_unlock(&c->mu);
    if (error && !closing)
        log_error("dataplane %s: %s", c->label, c->reason);
    else
        log_info("dataplane %s: %s", c->label, c->reason);
    if (c->notify)
        c->notify(c->notify_arg);
}

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

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t outlen)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(out, outlen, "%s:%d", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(out, outlen, "[%s]:%d", ip, port);
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

struct hello {
    uint16_t version;
    int32_t rank;
    uint64_t epoch;
    uint8_t nonce[DP_NONCE_BYTES];
    uint64_t window; /* bytes of data frames the sender of the HELLO will buffer */
    char instance[DP_ID_MAX + 1];
    char model[DP_ID_MAX + 1];
};

static bool valid_id(const char *s, size_t len)
{
    if (len < 1 || len > DP_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return false;
    return true;
}

static size_t hello_pack(const struct hello *h, uint8_t *out)
{
    size_t li = strlen(h->instance), lm = strlen(h->model);
    put_u16(out, h->version);
    put_u16(out + 2, 0);
    put_u32(out + 4, (uint32_t)h->rank);
    put_u64(out + 8, h->epoch);
    memcpy(out + 16, h->nonce, DP_NONCE_BYTES);
    put_u64(out + 48, h->window);
    size_t o = HELLO_FIXED;
    put_u16(out + o, (uint16_t)li);
    memcpy(out + o + 2, h->instance, li);
    o += 2 + li;
    put_u16(out + o, (uint16_t)lm);
    memcpy(out + o + 2, h->model, lm);
    return o + 2 + lm;
}

/* Reads the version and rank (stable across versions); the rest only when the version
 * is ours. */
static int hello_parse(const uint8_t *p, size_t len, struct hello *h, bool *version_only, char *why,
                       size_t whylen)
{
    memset(h, 0, sizeof *h);
    *version_only = false;
    if (len < 8)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO (%zu bytes)", len);
    h->version = get_u16(p);
    h->rank = (int32_t)get_u32(p + 4);
    if (h->version != DP_PROTO_VERSION) {
        *version_only = true;
        return 0;
    }
    if (len < HELLO_FIXED + 2 || get_u16(p + 2) != 0)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO");
    h->epoch = get_u64(p + 8);
    memcpy(h->nonce, p + 16, DP_NONCE_BYTES);
    h->window = get_u64(p + 48);
    if (h->window < DP_MIN_WINDOW || h->window > DP_MAX_WINDOW)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: window of %" PRIu64 " bytes", h->window);
    size_t o = HELLO_FIXED;
    size_t li = get_u16(p + o);
    if (li > DP_ID_MAX || o + 2 + li + 2 > len || !valid_id((const char *)p + o + 2, li))
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: bad instance id");
    memcpy(h->instance, p + o + 2, li);
    o += 2 + li;
    size_t lm = get_u16(p + o);
    if (lm > DP_ID_MAX || o + 2 + lm != len || !valid_id((const char *)p + o + 2, lm))
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: bad model identity");
    memcpy(h->model, p + o + 2, lm);
    if (h->rank < 0)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: rank %d", h->rank);
    return 0;
}

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
    if (!handshake_type(h.type))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unexpected %s frame during the handshake",
                          type_name(h.type));
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

/* HMAC-SHA256(secret, label || prover's role || connector's HELLO || acceptor's HELLO):
 * both nonces are in it, and the role keeps a proof from being reflected back. */
static void auth_proof(const char *secret, bool prover_is_connector, const uint8_t *hello_c, size_t len_c,
                       const uint8_t *hello_a, size_t len_a, uint8_t out[DP_PROOF_BYTES])
{
    crypto_auth_hmacsha256_state st;
    uint8_t role = prover_is_connector ? 'C' : 'A';
    uint8_t l[2];
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)secret, strlen(secret));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)AUTH_LABEL, sizeof AUTH_LABEL);
    crypto_auth_hmacsha256_update(&st, &role, 1);
    put_u16(l, (uint16_t)len_c);
    crypto_auth_hmacsha256_update(&st, l, 2);
    crypto_auth_hmacsha256_update(&st, hello_c, len_c);
    put_u16(l, (uint16_t)len_a);
    crypto_auth_hmacsha256_update(&st, l, 2);
    crypto_auth_hmacsha256_update(&st, hello_a, len_a);
    crypto_auth_hmacsha256_final(&st, out);
}

/* Checks the peer's HELLO against ours; fills why with the reason of a mismatch. */
static bool hello_matches(const struct hello *me, const struct hello *peer, int want_rank, char *why,
                          size_t whylen)
{
    if (peer->version != me->version) {
        snprintf(why, whylen, "protocol version mismatch: rank %d speaks %u, rank %d speaks %u", me->rank,
                 me->version, peer->rank, peer->version);
        return false;
    }
    if (strcmp(me->instance, peer->instance)) {
        snprintf(why, whylen, "instance mismatch: rank %d is in '%s', rank %d in '%s'", me->rank,
                 me->instance, peer->rank, peer->instance);
        return false;
    }
    if (me->epoch != peer->epoch) {
        snprintf(why, whylen, "epoch mismatch: rank %d is at epoch %" PRIu64 ", rank %d at %" PRIu64,
                 me->rank, me->epoch, peer->rank, peer->epoch);
        return false;
    }
    if (strcmp(me->model, peer->model)) {
        snprintf(why, whylen, "model mismatch: rank %d has '%s', rank %d has '%s'", me->rank, me->model,
                 peer->rank, peer->model);
        return false;
    }
    if (peer->rank == me->rank) {
        snprintf(why, whylen, "rank mismatch: both sides are rank %d", me->rank);
        return false;
    }
    if (want_rank >= 0 && peer->rank != want_rank) {
        snprintf(why, whylen, "rank mismatch: rank %d expected rank %d, the peer is rank %d", me->rank,
                 want_rank, peer->rank);
        return false;
    }
    if (!memcmp(me->nonce, peer->nonce, DP_NONCE_BYTES)) {
        snprintf(why, whylen, "the peer repeated our nonce");
        return false;
    }
    return true;
}

/* Runs the handshake on a connected socket; fills *peer_rank. Errors say who refused. */
static int handshake(int fd, const struct dp_config *cfg, uint16_t version, bool connector,
                     int64_t deadline, int *peer_rank, uint64_t *peer_window, char *err, size_t errlen)
{
    const char *secret = cfg->secret && cfg->secret[0] ? cfg->secret : NULL;
    struct hello me = {.version = version, .rank = cfg->rank, .epoch = cfg->epoch,
                       .window = cfg->recv_queue_bytes ? cfg->recv_queue_bytes : DP_QUEUE_BYTES_DEFAULT};
    randombytes_buf(me.nonce, sizeof me.nonce);
    snprintf(me.instance, sizeof me.instance, "%s", cfg->instance_id);
    snprintf(me.model, sizeof me.model, "%s", cfg->model_id);
    uint8_t mine[DP_HANDSHAKE_MAX], theirs[DP_HANDSHAKE_MAX + 1], buf[DP_HANDSHAKE_MAX + 1];
    size_t mine_len = hello_pack(&me, mine), theirs_len = 0, len = 0;
    char why[DP_REASON_MAX + 1];
    int type = 0;
    *peer_rank = -1;
    *peer_window = 0;

    int rc = hs_send(fd, DP_T_HELLO, mine, mine_len, deadline, err, errlen);
    if (!rc)
        rc = hs_recv(fd, &type, theirs, &theirs_len, deadline, err, errlen);
    if (rc)
        return CAIRN_EIO;
    if (type == DP_T_REJECT)
        return cairn_fail(err, errlen, CAIRN_EIO, "refused by the peer: %s", (char *)theirs);
    if (type != DP_T_HELLO)
        return cairn_fail(err, errlen, CAIRN_EIO, "expected HELLO, got %s", type_name(type));
    struct hello peer;
    bool version_only;
    if (hello_parse(theirs, theirs_len, &peer, &version_only, why, sizeof why)) {
        hs_reject(fd, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "%s", why);
    }
    *peer_rank = peer.rank;
    *peer_window = peer.window;
    if (!hello_matches(&me, &peer, cfg->peer_rank, why, sizeof why)) {
        hs_reject(fd, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "refused: %s", why);
    }

    const uint8_t *hc = connector ? mine : theirs, *ha = connector ? theirs : mine;
    size_t lc = connector ? mine_len : theirs_len, la = connector ? theirs_len : mine_len;
    uint8_t auth[1 + DP_PROOF_BYTES] = {0};
    size_t auth_len = 1;
    if (secret) {
        auth[0] = DP_PROOF_BYTES;
        auth_proof(secret, connector, hc, lc, ha, la, auth + 1);
        auth_len += DP_PROOF_BYTES;
    }
    rc = hs_send(fd, DP_T_AUTH, auth, auth_len, deadline, err, errlen);
    if (!rc)
        rc = hs_recv(fd, &type, buf, &len, deadline, err, errlen);
    if (rc)
        return CAIRN_EIO;
    if (type == DP_T_REJECT)
        return cairn_fail(err, errlen, CAIRN_EIO, "refused by the peer: %s", (char *)buf);
    if (type != DP_T_AUTH || len < 1 || (buf[0] != 0 && buf[0] != DP_PROOF_BYTES) || len != 1u + buf[0]) {
        snprintf(why, sizeof why, "malformed AUTH from rank %d", peer.rank);
        hs_reject(fd, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "%s", why);
    }
    bool ok = true;
    if (secret && buf[0] == 0) {
        snprintf(why, sizeof why, "cluster secret mismatch: rank %d has a secret, rank %d has none", me.rank,
                 peer.rank);
        ok = false;
    } else if (!secret && buf[0] != 0) {
        snprintf(why, sizeof why, "cluster secret mismatch: rank %d has no secret, rank %d has one", me.rank,
                 peer.rank);
        ok = false;
    } else if (secret) {
        uint8_t expect[DP_PROOF_BYTES];
        auth_proof(secret, !connector, hc, lc, ha, la, expect);
        if (crypto_verify_32(expect, buf + 1)) {
            snprintf(why, sizeof why,
                     "cluster secret mismatch: the proof of rank %d does not match the secret of rank %d",
                     peer.rank, me.rank);
            ok = false;
        }
    }
    if (!ok) {
        hs_reject(fd, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "refused: %s", why);
    }
    rc = hs_send(fd, DP_T_OK, NULL, 0, deadline, err, errlen);
    if (!rc)
        rc = hs_recv(fd, &type, buf, &len, deadline, err, errlen);
    if (rc)
        return CAIRN_EIO;
    if (type == DP_T_REJECT)
        return cairn_fail(err, errlen, CAIRN_EIO, "refused by the peer: %s", (char *)buf);
    if (type != DP_T_OK || len != 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "expected OK, got %s", type_name(type));
    return 0;
}

/* ---- asks and sampled results ---- */

static bool ask_ok(const struct dp_ask *a)
{
    if (a->need == DP_ROW_LOGITS || a->need == DP_ROW_SKIP) {
        struct dp_ask z = {.need = a->need};
        return !memcmp(a, &z, sizeof z);
    }
    return a->need == DP_ROW_SAMPLE && a->n_top >= -1 && a->n_top <= DP_MAX_TOP && a->pos >= 0 &&
           !isnan(a->temperature) && a->top_p > 0 && a->top_p <= 1 && a->min_p >= 0 && a->min_p <= 1 &&
           isfinite(a->repeat_penalty) && a->repeat_penalty > 0 && isfinite(a->presence_penalty) &&
           isfinite(a->frequency_penalty) && a->penalty_last_n >= -1 && a->n_bias <= DP_MAX_BIAS &&
           a->n_hist <= DP_MAX_HIST;
}

/* Checks n asks and sums their bias entries and window tokens; the index of the first
 * bad ask, or -1. */
static int64_t asks_check(const struct dp_ask *asks, int64_t n, uint64_t *n_bias, uint64_t *n_hist)
{
    *n_bias = *n_hist = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!ask_ok(&asks[i]))
            return i;
        *n_bias += asks[i].n_bias;
        *n_hist += asks[i].n_hist;
    }
    return -1;
}

/* Where a SAMPLED result's arrays lie after the need bytes (offsets from the start of
 * the token array): sizes in bytes. */
static uint64_t sampled_bytes(uint64_t n_sampled, uint64_t n_tops, uint64_t n_logits, uint64_t n_vocab)
{
    return 16 * n_sampled + 8 * n_tops + 4 * n_logits * n_vocab;
}

/* ---- decoding received frames (I/O thread) ---- */

static int decode_act(struct frame *f, char *why, size_t wl)
{
    const uint8_t *p = f->payload;
    size_t len = f->len;
    if (len < ACT_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %zu bytes", len);
    struct dp_activations *a = &f->view.act;
    a->step = get_u64(p);
    uint32_t n = get_u32(p + 8), ne = get_u32(p + 12), dt = get_u32(p + 16), na = get_u32(p + 20);
    if (n < 1 || n > DP_MAX_TOKENS || ne < 1 || ne > DP_MAX_EMBD)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %" PRIu32 " tokens x %" PRIu32, n, ne);
    if (!wire_dtype_ok((int)dt))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS in unsupported type %" PRIu32, dt);
    if (na > n)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %" PRIu32 " tokens with %" PRIu32 " asks", n, na);
    int64_t row = dp_wire_bytes((int)dt, ne);
    if (row < 0)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS rows of %" PRIu32 " not blocks of %s", ne,
                          dtype_name((int)dt));
    size_t off = align8(ACT_FIXED + 13 * (size_t)n);
    uint64_t vals_end = (uint64_t)off + (uint64_t)n * (uint64_t)row;
    uint64_t asks_off = na ? (vals_end + 7) & ~(uint64_t)7 : vals_end;
    uint64_t base = asks_off + 64u * (uint64_t)na;
    if ((uint64_t)len < base || (!na && (uint64_t)len != vals_end))
        return cairn_fail(why, wl, CAIRN_EFORMAT,
                          "ACTIVATIONS of %" PRIu32 " x %" PRIu32 " %s with %" PRIu32 " asks need %" PRIu64
                          " bytes, got %zu", n, ne, dtype_name((int)dt), na, base, len);
    a->n = (int)n;
    a->n_embd = (int)ne;
    a->wire_dtype = (int)dt;
    a->pos = (const int64_t *)(p + ACT_FIXED);
    a->seq = (const int32_t *)(p + ACT_FIXED + 8 * (size_t)n);
    a->want = p + ACT_FIXED + 12 * (size_t)n;
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (a->pos[i] < 0 || a->seq[i] < 0 || a->want[i] > 1)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS token %" PRIu32 ": seq %d pos %" PRId64
                              " want %u", i, a->seq[i], a->pos[i], a->want[i]);
        n_want += a->want[i];
    }
    for (size_t i = ACT_FIXED + 13 * (size_t)n; i < off; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS padding not zero");
    a->n_asks = (int)na;
    a->asks = NULL;
    a->bias = NULL;
    a->hist = NULL;
    if (na) {
        if (na != n_want)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS with %" PRIu32 " asks for %" PRIu32
                              " wanted tokens", na, n_want);
        for (uint64_t i = vals_end; i < asks_off; i++)
            if (p[i])
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS padding not zero");
        a->asks = (const struct dp_ask *)(p + asks_off);
        uint64_t nb, nh;
        int64_t bad = asks_check(a->asks, na, &nb, &nh);
        if (bad >= 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS ask %" PRId64 " out of range (need %" PRIu32
                              ", n_top %d, pos %" PRId64 ", %" PRIu32 " bias entries, %" PRIu32 " window tokens)",
                              bad, a->asks[bad].need, a->asks[bad].n_top, a->asks[bad].pos, a->asks[bad].n_bias,
                              a->asks[bad].n_hist);
        if ((uint64_t)len != base + 8 * nb + 4 * nh)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS asks with %" PRIu64 " bias entries and %" PRIu64
                              " window tokens need %" PRIu64 " bytes, got %zu", nb, nh, base + 8 * nb + 4 * nh, len);
        a->bias = (const struct dp_bias *)(p + base);
        a->hist = (const int32_t *)(p + base + 8 * nb);
        for (uint64_t i = 0; i < nb; i++)
            if (a->bias[i].token < 0 || isnan(a->bias[i].bias))
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS bias entry %" PRIu64 ": token %d", i,
                                  a->bias[i].token);
        for (uint64_t i = 0; i < nh; i++)
            if (a->hist[i] < 0)
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS window token %" PRIu64 ": %d", i, a->hist[i]);
    }
    int64_t count = (int64_t)n * ne;
    if (dt == DT_F32) {
        a->x = (const float *)(p + off);
        return 0;
    }
    f->x = malloc((size_t)count * sizeof(float));
    if (!f->x)
        return cairn_fail(why, wl, CAIRN_ENOMEM, "out of memory decoding %" PRId64 " activations", count);
    if (kern_dequantize_row((int)dt, p + off, f->x, count))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS: cannot decode %s", dtype_name((int)dt));
    f->mem += (size_t)count * sizeof(float);
    a->x = f->x;
    return 0;
}

static int copy_text(struct frame *f, const uint8_t *s, size_t len, const char **out, char *why, size_t wl)
{
    if (!len) {
        *out = "";
        return 0;
    }
    f->text = malloc(len + 1);
    if (!f->text)
        return cairn_fail(why, wl, CAIRN_ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) /* text for logs: no control characters */
        f->text[i] = s[i] < 0x20 || s[i] == 0x7f ? '?' : (char)s[i];
    f->text[len] = 0;
    *out = f->text;
    return 0;
}

/* The rest of a SAMPLED RESULT, its header checked (entries from off). */
static int decode_sampled(struct frame *f, uint32_t n, uint32_t nv, int32_t status, size_t off, char *why, size_t wl)
{
    const uint8_t *p = f->payload;
    size_t len = f->len;
    struct dp_result *r = &f->view.res;
    uint64_t need_off = (uint64_t)off + 12u * (uint64_t)n, arr = (need_off + n + 7) & ~(uint64_t)7;
    if ((uint64_t)len < arr)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu32 " entries in %zu bytes", n, len);
    r->pos = (const int64_t *)(p + off);
    r->seq = (const int32_t *)(p + off + 8 * (size_t)n);
    r->need = p + need_off;
    uint64_t ns = 0, nl = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (r->pos[i] < 0 || r->seq[i] < 0 || r->need[i] < DP_ROW_LOGITS || r->need[i] > DP_ROW_SKIP)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT entry %" PRIu32 ": seq %d pos %" PRId64
                              " need %u", i, r->seq[i], r->pos[i], r->need[i]);
        ns += r->need[i] == DP_ROW_SAMPLE;
        nl += r->need[i] == DP_ROW_LOGITS;
    }
    for (uint64_t i = need_off + n; i < arr; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT padding not zero");
    if ((uint64_t)len < arr + 16 * ns)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu64 " tokens in %zu bytes", ns, len);
    const uint8_t *q = p + arr;
    r->token = (const int32_t *)q;
    r->prob = (const float *)(q + 4 * ns);
    r->logprob = (const float *)(q + 8 * ns);
    r->n_top = (const int32_t *)(q + 12 * ns);
    uint64_t nt = 0;
    for (uint64_t i = 0; i < ns; i++) {
        if (r->token[i] <= DP_TOKEN_ERR_MIN || r->n_top[i] < 0 || r->n_top[i] > DP_MAX_TOP ||
            (r->token[i] < 0 && r->n_top[i] != 0))
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT token %" PRIu64 ": %d with %d top", i,
                              r->token[i], r->n_top[i]);
        nt += (uint64_t)r->n_top[i];
    }
    uint64_t want = arr + sampled_bytes(ns, nt, nl, nv);
    if ((uint64_t)len != want)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu64 " tokens, %" PRIu64 " top and %" PRIu64
                          " logits rows of %" PRIu32 " needs %" PRIu64 " bytes, got %zu", ns, nt, nl, nv, want, len);
    r->top_token = (const int32_t *)(q + 16 * ns);
    r->top_logprob = (const float *)(q + 16 * ns + 4 * nt);
    r->logits = (const float *)(q + 16 * ns + 8 * nt);
    for (uint64_t i = 0; i < nt; i++)
        if (r->top_token[i] < 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT top token %" PRIu64 ": %d", i, r->top_token[i]);
    r->n = (int)n;
    r->kind = DP_RESULT_SAMPLED;
    r->n_vocab = (int)nv;
    r->status = status;
    r->n_sampled = (int)ns;
    r->n_logits = (int)nl;
    r->n_tops = (int)nt;
    return copy_text(f, p + RES_FIXED, get_u16(p + 24), &r->message, why, wl);
}

static int decode_result(struct frame *f, char *why, size_t wl)
{
    const uint8_t *p = f->payload;
    size_t len = f->len;
    if (len < RES_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %zu bytes", len);
    struct dp_result *r = &f->view.res;
    r->step = get_u64(p);
    uint32_t n = get_u32(p + 8), kind = get_u32(p + 12), nv = get_u32(p + 16);
    int32_t status = (int32_t)get_u32(p + 20);
    size_t ml = get_u16(p + 24);
    if (n > DP_MAX_TOKENS)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %" PRIu32 " entries", n);
    if (kind == DP_RESULT_TOKENS ? nv != 0
                                 : (kind != DP_RESULT_LOGITS && kind != DP_RESULT_SAMPLED) || nv < 1 || nv > DP_MAX_VOCAB)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT kind %" PRIu32 " with n_vocab %" PRIu32, kind, nv);
    if (status > 0 || ml > DP_REASON_MAX || get_u16(p + 26) || get_u32(p + 28))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "malformed RESULT header");
    size_t off = align8(RES_FIXED + ml);
    if (kind == DP_RESULT_SAMPLED)
        return decode_sampled(f, n, nv, status, off, why, wl);
    uint64_t need = (uint64_t)off + 12u * (uint64_t)n +
                    (kind == DP_RESULT_TOKENS ? 8u * (uint64_t)n : 4u * (uint64_t)n * nv);
    if ((uint64_t)len != need)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %" PRIu32 " entries needs %" PRIu64
                          " bytes, got %zu", n, need, len);
    for (size_t i = RES_FIXED + ml; i < off; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT padding not zero");
    r->n = (int)n;
    r->kind = (enum dp_result_kind)kind;
    r->n_vocab = (int)nv;
    r->status = status;
    r->pos = (const int64_t *)(p + off);
    r->seq = (const int32_t *)(p + off + 8 * (size_t)n);
    for (uint32_t i = 0; i < n; i++)
        if (r->pos[i] < 0 || r->seq[i] < 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT entry %" PRIu32 ": seq %d pos %" PRId64, i,
                              r->seq[i], r->pos[i]);
    const uint8_t *q = p + off + 12 * (size_t)n;
    if (kind == DP_RESULT_TOKENS) {
        r->token = (const int32_t *)q;
        r->logprob = (const float *)(q + 4 * (size_t)n);
        for (uint32_t i = 0; i < n; i++)
            if (r->token[i] < 0)
                return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT entry %" PRIu32 ": token %d", i, r->token[i]);
    } else {
        r->logits = (const float *)q;
    }
    return copy_text(f, p + RES_FIXED, ml, &r->message, why, wl);
}

static bool ctl_ok(const struct dp_ctl *o)
{
    if (o->reserved || o->seq < 0)
        return false;
    switch (o->op) {
    case DP_CTL_CLEAR:
    case DP_CTL_CANCEL: return o->seq2 == 0 && o->pos == 0;
    case DP_CTL_TRUNCATE: return o->seq2 == 0 && o->pos >= 0;
    case DP_CTL_FORK: return o->seq2 >= 0 && o->seq2 != o->seq && o->pos == 0;
    case DP_CTL_CLEAR_ALL: return o->seq == 0 && o->seq2 == 0 && o->pos == 0;
    case DP_CTL_PREPARE: return o->seq2 >= 0 && o->pos >= 0;
    default: return false;
    }
}

static int decode_control(struct frame *f, char *why, size_t wl)
{
    const uint8_t *p = f->payload;
    if (f->len < CTL_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL of %zu bytes", f->len);
    uint32_t n = get_u32(p + 8);
    if (n > DP_MAX_CTL_OPS || get_u32(p + 12) || f->len != CTL_FIXED + (size_t)n * sizeof(struct dp_ctl))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL of %" PRIu32 " ops in %zu bytes", n, f->len);
    struct dp_control *c = &f->view.ctl;
    c->step = get_u64(p);
    c->n = (int)n;
    c->ops = (const struct dp_ctl *)(p + CTL_FIXED);
    for (uint32_t i = 0; i < n; i++)
        if (!ctl_ok(&c->ops[i]))
            return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL op %" PRIu32 ": op %" PRIu32 " seq %d seq2 %d pos %"
                              PRId64, i, c->ops[i].op, c->ops[i].seq, c->ops[i].seq2, c->ops[i].pos);
    return 0;
}

static int decode_goodbye(struct frame *f, char *why, size_t wl)
{
    const uint8_t *p = f->payload;
    if (f->len < BYE_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "GOODBYE of %zu bytes", f->len);
    size_t rl = get_u16(p + 4);
    if (rl > DP_REASON_MAX || get_u16(p + 6) || f->len != BYE_FIXED + rl)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "malformed GOODBYE");
    f->view.bye.code = (int32_t)get_u32(p);
    return copy_text(f, p + BYE_FIXED, rl, &f->view.bye.reason, why, wl);
}

/* ---- the I/O thread ---- */

struct out {
    const uint8_t *p;
    size_t len, off;
    struct frame *f;  /* a queued frame, or NULL for ibuf */
    bool is_bye;
};

static size_t pack_goodbye(uint8_t *buf, int code, const char *reason)
{
    size_t rl = strnlen(reason, DP_REASON_MAX);
    uint8_t *p = buf + DP_HDR_SIZE;
    put_u32(p, (uint32_t)code);
    put_u16(p + 4, (uint16_t)rl);
    put_u16(p + 6, 0);
    memcpy(p + BYE_FIXED, reason, rl);
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_GOODBYE, .len = (uint32_t)(BYE_FIXED + rl)};
    dp_hdr_pack(buf, &h);
    return DP_HDR_SIZE + BYE_FIXED + rl;
}

/* A protocol error of the peer's: tell it why when nothing half-written is in the way
 * (one non-blocking try), then end. */
static void fail_protocol(struct dp_conn *c, const struct out *o, const char *why)
{
    if (!o->p) {
        uint8_t buf[IBUF_SIZE];
        char reason[DP_REASON_MAX + 1];
        snprintf(reason, sizeof reason, "bad frame from rank %d: %s", c->peer_rank, why);
        size_t n = pack_goodbye(buf, CAIRN_EFORMAT, reason);
        ssize_t r = send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)r;
    }
    conn_end(c, true, "bad frame from the peer: %s", why);
}

/* Releases the in-flight slot of step (under mu). */
static bool win_release(struct dp_conn *c, uint64_t step, int64_t now)
{
    for (int i = 0; i < c->win_n; i++) {
        if (c->win[i].step != step)
            continue;
        int64_t us = (now - c->win[i].t_sent) / 1000;
        c->st.steps_done++;
        c->st.step_rtt_us += us;
        if (us > c->st.step_rtt_max_us)
            c->st.step_rtt_max_us = us;
        c->win[i] = c->win[--c->win_n];
        return true;
    }
    return false;
}

/* A whole frame has arrived. Returns -1 when the connection ended. */
static int frame_done(struct dp_conn *c, struct frame *f, const struct out *o)
{
    char why[DP_REASON_MAX];
    int64_t now = clock_ns();
    const struct dp_hdr *h = &c->in_h;
    if ((h->flags & DP_F_PAYLOAD_CRC) && dp_crc32c(0, f->payload, f->len) != h->payload_crc) {
        frame_free(f);
        fail_protocol(c, o, "bad payload checksum");
        return -1;
    }
    f->type = h->type;
    f->view.type = (enum dp_type)h->type;
    int rc = 0;
    switch (h->type) {
    case DP_T_HEARTBEAT: {
        if (f->len != HB_PAYLOAD) {
            frame_free(f);
            fail_protocol(c, o, "HEARTBEAT of the wrong size");
            return -1;
        }
        uint64_t t = get_u64(f->payload), echo = get_u64(f->payload + 8), age = get_u64(f->payload + 16);
        frame_free(f);
        c->hb_peer_t = t;
        c->hb_peer_rx = now;
        pthread_mutex_lock(&c->mu);
        c->st.heartbeats_received++;
        c->st.frames_received++;
        if (echo && echo <= (uint64_t)now && age <= (uint64_t)now - echo) {
            int64_t rtt = (int64_t)((uint64_t)now - echo - age) / 1000;
            c->st.hb_rtt_us = rtt;
            if (c->st.hb_rtt_min_us < 0 || rtt < c->st.hb_rtt_min_us)
                c->st.hb_rtt_min_us = rtt;
        }
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    case DP_T_CREDIT: {
        uint64_t v = f->len == CREDIT_PAYLOAD ? get_u64(f->payload) : 0;
        bool ok = f->len == CREDIT_PAYLOAD;
        frame_free(f);
        pthread_mutex_lock(&c->mu);
        c->st.frames_received++;
        if (ok && v >= c->peer_consumed && v <= c->sent_data)
            c->peer_consumed = v;
        else
            ok = false;
        uint64_t sent = c->sent_data;
        pthread_mutex_unlock(&c->mu);
        if (!ok) {
            snprintf(why, sizeof why, "CREDIT for %" PRIu64 " bytes of %" PRIu64 " sent", v, sent);
            fail_protocol(c, o, why);
            return -1;
        }
        return 0;
    }
    case DP_T_ACTIVATIONS: rc = decode_act(f, why, sizeof why); break;
    case DP_T_RESULT: rc = decode_result(f, why, sizeof why); break;
    case DP_T_CONTROL: rc = decode_control(f, why, sizeof why); break;
    case DP_T_GOODBYE: rc = decode_goodbye(f, why, sizeof why); break;
    default:
        snprintf(why, sizeof why, "unexpected %s after the handshake", type_name(h->type));
        rc = CAIRN_EFORMAT;
        break;
    }
    if (rc) {
        frame_free(f);
        if (rc == CAIRN_ENOMEM)
            conn_end(c, true, "%s", why);
        else
            fail_protocol(c, o, why);
        return -1;
    }
    char bye[DP_REASON_MAX + 32] = "";
    int bye_code = 0;
    if (h->type == DP_T_GOODBYE) { /* copied now: the frame may be freed once queued */
        bye_code = f->view.bye.code;
        snprintf(bye, sizeof bye, "%s", f->view.bye.reason);
    }
    pthread_mutex_lock(&c->mu);
    c->st.frames_received++;
    bool closing = c->closing, released = false;
    if (h->type == DP_T_ACTIVATIONS)
        c->st.activations_received++;
    else if (h->type == DP_T_RESULT) {
        c->st.results_received++;
        released = win_release(c, f->view.res.step, now);
    } else if (h->type == DP_T_CONTROL)
        c->st.controls_received++;
    if (closing) {
        frame_free(f); /* nobody reads any more; no credit is needed either */
    } else {
        if (c->rxt)
            c->rxt->next = f;
        else
            c->rxh = f;
        c->rxt = f;
        c->rx_bytes += f->mem;
        c->pushed = true;
        pthread_cond_broadcast(&c->rx_cv);
    }
    if (released)
        pthread_cond_broadcast(&c->tx_cv);
    pthread_mutex_unlock(&c->mu);
    if (h->type == DP_T_GOODBYE) {
        if (closing)
            conn_end(c, false, "closed (the peer said goodbye too)");
        else
            conn_end(c, bye_code < 0, "closed by rank %d: %s", c->peer_rank, bye);
        return -1;
    }
    return 0;
}

/* Feeds n staged bytes to the frame parser. Returns -1 when the connection ended. */
static int consume(struct dp_conn *c, const uint8_t *p, size_t n, const struct out *o)
{
    while (n) {
        if (!c->in_f) {
            size_t k = DP_HDR_SIZE - c->in_hdr_got;
            if (k > n)
                k = n;
            memcpy(c->in_hdr + c->in_hdr_got, p, k);
            c->in_hdr_got += k;
            p += k;
            n -= k;
            if (c->in_hdr_got < DP_HDR_SIZE)
                return 0;
            char why[DP_REASON_MAX];
            if (dp_hdr_parse(c->in_hdr, &c->in_h, c->max_payload, why, sizeof why)) {
                fail_protocol(c, o, why);
                return -1;
            }
            if (data_type(c->in_h.type)) { /* the window is checked before anything is allocated */
                size_t wire = DP_HDR_SIZE + (size_t)c->in_h.len;
                pthread_mutex_lock(&c->mu);
                uint64_t r = c->recv_data - c->announced, w = c->rx_cap;
                bool ok = r + wire <= w || r < w / 4;
                if (ok)
                    c->recv_data += wire;
                pthread_mutex_unlock(&c->mu);
                if (!ok) {
                    snprintf(why, sizeof why, "the peer overran the flow-control window (%" PRIu64 " + %zu bytes "
                             "uncredited, window %" PRIu64 ")", r, wire, w);
                    fail_protocol(c, o, why);
                    return -1;
                }
            }
            c->in_f = frame_new(c->in_h.len);
            if (!c->in_f) {
                conn_end(c, true, "out of memory for a frame of %" PRIu32 " bytes", c->in_h.len);
                return -1;
            }
            c->in_got = 0;
        }
        size_t k = c->in_f->len - c->in_got;
        if (k > n)
            k = n;
        memcpy(c->in_f->payload + c->in_got, p, k);
        c->in_got += k;
        p += k;
        n -= k;
        if (c->in_got == c->in_f->len) {
            struct frame *f = c->in_f;
            c->in_f = NULL;
            c->in_hdr_got = 0;
            if (frame_done(c, f, o))
                return -1;
        }
    }
    return 0;
}

/* Reads what the socket has (the peer's flow control bounds it). Returns -1 when the
 * connection ended. */
static int do_read(struct dp_conn *c, const struct out *o)
{
    for (int round = 0; round < 64; round++) {
        ssize_t r;
        bool direct = c->in_f && c->in_f->len - c->in_got >= RBUF_SIZE;
        if (direct)
            r = recv(c->fd, c->in_f->payload + c->in_got, c->in_f->len - c->in_got, 0);
        else
            r = recv(c->fd, c->rbuf, RBUF_SIZE, 0);
        if (r > 0) {
            atomic_store(&c->last_rx, clock_ns());
            pthread_mutex_lock(&c->mu);
            c->st.bytes_received += (uint64_t)r;
            pthread_mutex_unlock(&c->mu);
            if (direct) {
                c->in_got += (size_t)r;
                if (c->in_got == c->in_f->len) {
                    struct frame *f = c->in_f;
                    c->in_f = NULL;
                    c->in_hdr_got = 0;
                    if (frame_done(c, f, o))
                        return -1;
                }
            } else if (consume(c, c->rbuf, (size_t)r, o)) {
                return -1;
            }
            continue;
        }
        if (r == 0) {
            pthread_mutex_lock(&c->mu);
            bool closing = c->closing;
            pthread_mutex_unlock(&c->mu);
            if (closing)
                conn_end(c, false, "closed: %s", c->close_reason);
            else if (c->in_f)
                conn_end(c, true, "connection closed by rank %d in the middle of a %s frame (%zu of %zu payload bytes)",
                         c->peer_rank, type_name(c->in_h.type), c->in_got, c->in_f->len);
            else if (c->in_hdr_got)
                conn_end(c, true, "connection closed by rank %d in the middle of a frame header (%zu of %d bytes)",
                         c->peer_rank, c->in_hdr_got, DP_HDR_SIZE);
            else
                conn_end(c, true, "connection closed by rank %d without a goodbye", c->peer_rank);
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        conn_end(c, true, "recv from rank %d: %s", c->peer_rank, strerror(errno));
        return -1;
    }
    return 0;
}

/* May the head frame go now (under mu)? Tracks how long it waited for credit. */
static bool has_credit(struct dp_conn *c, const struct frame *f, int64_t now)
{
    uint64_t u = c->sent_data - c->peer_consumed, w = c->peer_window;
    bool ok = !data_type(f->type) || u + f->wire <= w || u < w / 4;
    if (!ok && !c->stall_since)
        c->stall_since = now;
    if (ok && c->stall_since) {
        c->st.credit_wait_us += (now - c->stall_since) / 1000;
        c->stall_since = 0;
    }
    return ok;
}

/* Picks what to write next when nothing is being written: a heartbeat that is due,
 * our credit, the head of the send queue when the peer's window allows, a goodbye. */
static void next_out(struct dp_conn *c, struct out *o, uint8_t *ibuf, int64_t now, int64_t *next_hb,
                     bool *bye_queued)
{
    if (o->p)
        return;
    pthread_mutex_lock(&c->mu);
    bool closing = c->closing;
    if (!*bye_queued && now >= *next_hb) {
        uint8_t *p = ibuf + DP_HDR_SIZE;
        put_u64(p, (uint64_t)now);
        put_u64(p + 8, c->hb_peer_t);
        put_u64(p + 16, c->hb_peer_t ? (uint64_t)(now - c->hb_peer_rx) : 0);
        struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_HEARTBEAT, .len = HB_PAYLOAD};
        dp_hdr_pack(ibuf, &h);
        *o = (struct out){.p = ibuf, .len = DP_HDR_SIZE + HB_PAYLOAD};
        *next_hb = now + c->hb_ns;
        c->st.heartbeats_sent++;
    } else if (!closing && c->consumed - c->announced >= c->rx_cap / 4) {
        put_u64(ibuf + DP_HDR_SIZE, c->consumed);
        struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_CREDIT, .len = CREDIT_PAYLOAD};
        dp_hdr_pack(ibuf, &h);
        *o = (struct out){.p = ibuf, .len = DP_HDR_SIZE + CREDIT_PAYLOAD};
        c->announced = c->consumed;
    } else if (c->txh && has_credit(c, c->txh, now) && now >= c->txh->t_queued + c->delay_ns) {
        struct frame *f = c->txh;
        c->txh = f->next;
        if (!c->txh)
            c->txt = NULL;
        if (data_type(f->type))
            c->sent_data += f->wire;
        *o = (struct out){.p = f->hdr, .len = DP_HDR_SIZE + f->len, .f = f};
    } else if (closing && !c->txh && !*bye_queued) {
        size_t n = pack_goodbye(ibuf, 0, c->close_reason);
        *o = (struct out){.p = ibuf, .len = n, .is_bye = true};
        *bye_queued = true;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Writes until the socket is full or nothing is left. Returns 1 when it would block, 0
 * when everything was written, -1 when the connection ended. */
static int do_write(struct dp_conn *c, struct out *o, uint8_t *ibuf, int64_t *next_hb, bool *bye_queued,
                    bool *bye_sent)
{
    for (;;) {
        next_out(c, o, ibuf, clock_ns(), next_hb, bye_queued);
        if (!o->p)
            return 0;
        ssize_t n = send(c->fd, o->p + o->off, o->len - o->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 1;
            conn_end(c, true, "send to rank %d: %s", c->peer_rank, strerror(errno));
            return -1;
        }
        o->off += (size_t)n;
        pthread_mutex_lock(&c->mu);
        c->st.bytes_sent += (uint64_t)n;
        if (o->off == o->len) {
            c->st.frames_sent++;
            if (o->f) {
                c->tx_bytes -= o->f->mem;
                c->st.queue_us += (clock_ns() - o->f->t_queued) / 1000;
                pthread_cond_broadcast(&c->tx_cv);
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (o->off == o->len) {
            if (o->is_bye)
                *bye_sent = true;
            frame_free(o->f);
            *o = (struct out){0};
        }
    }
}

static void *io_main(void *arg)
{
    struct dp_conn *c = arg;
    uint8_t ibuf[IBUF_SIZE];
    struct out o = {0};
    int64_t next_hb = clock_ns();
    bool bye_queued = false, bye_sent = false, wr_shut = false;
    while (!atomic_load(&c->ended)) {
        int wr = do_write(c, &o, ibuf, &next_hb, &bye_queued, &bye_sent);
        if (wr < 0)
            break;
        if (bye_sent && !wr_shut) {
            shutdown(c->fd, SHUT_WR);
            wr_shut = true;
        }
        int64_t now = clock_ns();
        pthread_mutex_lock(&c->mu);
        bool closing = c->closing;
        int64_t close_deadline = c->close_deadline;
        pthread_mutex_unlock(&c->mu);
        if (closing && now >= close_deadline) {
            conn_end(c, false, "closed: %s%s", c->close_reason, bye_sent ? "" : " (queue not flushed in time)");
            break;
        }
        int64_t last_rx = atomic_load(&c->last_rx);
        if (now - last_rx > c->dead_ns) {
            conn_end(c, true, "rank %d silent for %" PRId64 " ms (dead after %" PRId64 " ms)", c->peer_rank,
                     (now - last_rx) / MS, c->dead_ns / MS);
            break;
        }
        int64_t wake_at = bye_queued ? now + 1000 * MS : next_hb;
        if (last_rx + c->dead_ns + MS < wake_at)
            wake_at = last_rx + c->dead_ns + MS;
        if (closing && close_deadline < wake_at)
            wake_at = close_deadline;
        if (c->delay_ns) { /* the head frame's emulated delay ends */
            pthread_mutex_lock(&c->mu);
            if (c->txh && c->txh->t_queued + c->delay_ns < wake_at)
                wake_at = c->txh->t_queued + c->delay_ns;
            pthread_mutex_unlock(&c->mu);
        }
        int64_t left = wake_at <= now ? 0 : wake_at - now;
        struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        struct pollfd pfd[2] = {{.fd = c->wake[0], .events = POLLIN}, {.fd = c->fd, .events = POLLIN}};
        if (wr == 1)
            pfd[1].events |= POLLOUT;
        int pr = ppoll(pfd, 2, &ts, NULL);
        if (pr < 0 && errno != EINTR) {
            conn_end(c, true, "poll: %s", strerror(errno));
            break;
        }
        if (pr <= 0)
            continue;
        if (pfd[0].revents & POLLIN) {
            char sink[64];
            while (read(c->wake[0], sink, sizeof sink) > 0) {
            }
        }
        if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            int rr = do_read(c, &o);
            pthread_mutex_lock(&c->mu);
            bool pushed = c->pushed;
            c->pushed = false;
            pthread_mutex_unlock(&c->mu);
            if (pushed && c->notify && rr == 0)
                c->notify(c->notify_arg);
            if (rr < 0)
                break;
        }
    }
    if (o.f)
        frame_free(o.f);
    frame_free(c->in_f);
    c->in_f = NULL;
    shutdown(c->fd, SHUT_RDWR);
    return NULL;
}

/* ---- connections: create, send, receive, close ---- */

static int check_config(const struct dp_config *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no config");
    if (!cfg->instance_id || !valid_id(cfg->instance_id, strlen(cfg->instance_id)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "instance id must be 1..%d printable ASCII bytes", DP_ID_MAX);
    if (!cfg->model_id || !valid_id(cfg->model_id, strlen(cfg->model_id)))
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

static int conn_create(struct dp_conn **out, int fd, const struct dp_config *cfg, bool connector,
                       int peer_rank, uint64_t peer_window, char *err, size_t errlen)
{
    struct dp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    c->fd = fd;
    c->wake[0] = c->wake[1] = -1;
    c->connector = connector;
    c->rank = cfg->rank;
    c->peer_rank = peer_rank;
    c->max_inflight = cfg->max_inflight;
    c->max_payload = cfg->max_payload ? cfg->max_payload : DP_MAX_PAYLOAD_DEFAULT;
    c->tx_cap = cfg->send_queue_bytes ? cfg->send_queue_bytes : DP_QUEUE_BYTES_DEFAULT;
    c->rx_cap = cfg->recv_queue_bytes ? cfg->recv_queue_bytes : DP_QUEUE_BYTES_DEFAULT;
    c->peer_window = peer_window;
    c->hb_ns = (cfg->heartbeat_ms ? cfg->heartbeat_ms : DP_HEARTBEAT_MS_DEFAULT) * MS;
    c->dead_ns = (cfg->dead_ms ? cfg->dead_ms : DP_DEAD_MS_DEFAULT) * MS;
    c->delay_ns = (int64_t)cfg->emulate_delay_us * 1000;
    c->linger_ns = (cfg->close_linger_ms ? cfg->close_linger_ms : DP_CLOSE_LINGER_MS_DEFAULT) * MS;
    c->payload_crc = cfg->payload_crc;
    c->notify = cfg->notify;
    c->notify_arg = cfg->notify_arg;
    c->st.hb_rtt_us = c->st.hb_rtt_min_us = -1;
    atomic_store(&c->last_rx, clock_ns()); /* the handshake was just heard */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        addr_text(&ss, c->peer_addr, sizeof c->peer_addr);
    else
        snprintf(c->peer_addr, sizeof c->peer_addr, "?");
    snprintf(c->label, sizeof c->label, "rank %d %s rank %d (%s)", c->rank, connector ? "->" : "<-", peer_rank,
             c->peer_addr);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->tx_cv, &ca);
    pthread_cond_init(&c->rx_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (c->max_inflight) {
        c->win = calloc((size_t)c->max_inflight, sizeof *c->win);
        if (!c->win)
            goto nomem;
    }
    c->rbuf = malloc(RBUF_SIZE);
    if (!c->rbuf)
        goto nomem;
    int rc;
    if (pipe2(c->wake, O_NONBLOCK | O_CLOEXEC)) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "pipe: %s", strerror(errno));
        goto fail;
    }
    rc = pthread_create(&c->io, NULL, io_main, c);
    if (rc) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "pthread_create: %s", strerror(rc));
        goto fail;
    }
    c->io_started = true;
    log_info("dataplane %s: connected", c->label);
    *out = c;
    return 0;
nomem:
    rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
fail:
    c->fd = -1; /* the caller closes it */
    dp_close(c, NULL);
    return rc;
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
    char addr[INET6_ADDRSTRLEN + 8] = "?";
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        addr_text(&ss, addr, sizeof addr);
    char why[DP_REASON_MAX + 64];
    int peer_rank = -1;
    uint64_t peer_window = 0;
    rc = set_sockopts(fd, cfg->user_timeout_ms ? cfg->user_timeout_ms : DP_USER_TIMEOUT_MS_DEFAULT, why,
                      sizeof why);
    if (!rc) {
        int64_t hs_deadline = clock_ns() + (cfg->handshake_ms ? cfg->handshake_ms : DP_HANDSHAKE_MS_DEFAULT) * MS;
        rc = handshake(fd, cfg, cfg->proto_version ? cfg->proto_version : DP_PROTO_VERSION, false, hs_deadline,
                       &peer_rank, &peer_window, why, sizeof why);
    }
    if (rc) {
        close(fd);
        log_warn("dataplane rank %d: handshake with %s failed: %s", cfg->rank, addr, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "handshake with %s: %s", addr, why);
    }
    rc = conn_create(out, fd, cfg, false, peer_rank, peer_window, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    return 1;
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
    char why[DP_REASON_MAX + 64];
    int peer_rank = -1;
    uint64_t peer_window = 0;
    rc = set_sockopts(fd, cfg->user_timeout_ms ? cfg->user_timeout_ms : DP_USER_TIMEOUT_MS_DEFAULT, why,
                      sizeof why);
    if (!rc) {
        int64_t hs_deadline = clock_ns() + (cfg->handshake_ms ? cfg->handshake_ms : DP_HANDSHAKE_MS_DEFAULT) * MS;
        rc = handshake(fd, cfg, cfg->proto_version ? cfg->proto_version : DP_PROTO_VERSION, true, hs_deadline,
                       &peer_rank, &peer_window, why, sizeof why);
    }
    if (rc) {
        close(fd);
        log_warn("dataplane rank %d: handshake with %s:%d failed: %s", cfg->rank, host, port, why);
        return cairn_fail(err, errlen, CAIRN_EIO, "handshake with %s:%d: %s", host, port, why);
    }
    rc = conn_create(out, fd, cfg, true, peer_rank, peer_window, err, errlen);
    if (rc)
        close(fd);
    return rc;
}

static void deadline_ts(int64_t deadline, struct timespec *ts)
{
    ts->tv_sec = deadline / 1000000000;
    ts->tv_nsec = deadline % 1000000000;
}

/* Waits for room for a frame of mem bytes (and an in-flight slot when act), then
 * reserves them. Called and returns with mu held. */
static int reserve(struct dp_conn *c, size_t mem, bool act, uint64_t step, int timeout_ms, char *err,
                   size_t errlen)
{
    int64_t t0 = clock_ns();
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : t0 + timeout_ms * MS;
    int rc = 0;
    for (;;) {
        if (atomic_load(&c->ended)) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "connection to rank %d ended: %s", c->peer_rank, c->reason);
            break;
        }
        if (c->closing) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "connection is closing");
            break;
        }
        bool room = c->tx_bytes == 0 || c->tx_bytes + mem <= c->tx_cap;
        bool slot = !act || !c->max_inflight || c->win_n < c->max_inflight;
        if (room && slot)
            break;
        int64_t now = clock_ns();
        if (now >= deadline) {
            if (!slot)
                rc = cairn_fail(err, errlen, CAIRN_EFULL, "%d micro-batches in flight (the limit)", c->win_n);
            else
                rc = cairn_fail(err, errlen, CAIRN_EFULL, "send queue full (%zu bytes queued, limit %zu)",
                                c->tx_bytes, c->tx_cap);
            break;
        }
        if (deadline == INT64_MAX) {
            pthread_cond_wait(&c->tx_cv, &c->mu);
        } else {
            struct timespec ts;
            deadline_ts(deadline, &ts);
            pthread_cond_timedwait(&c->tx_cv, &c->mu, &ts);
        }
    }
    c->st.send_wait_us += (clock_ns() - t0) / 1000;
    if (rc)
        return rc;
    c->tx_bytes += mem;
    if (act && c->max_inflight)
        c->win[c->win_n++] = (struct win_slot){.step = step, .t_sent = clock_ns()};
    return 0;
}

static void unreserve(struct dp_conn *c, size_t mem, bool act, uint64_t step)
{
    c->tx_bytes -= mem;
    if (act && c->max_inflight)
        for (int i = c->win_n - 1; i >= 0; i--)
            if (c->win[i].step == step) {
                c->win[i] = c->win[--c->win_n];
                break;
            }
    pthread_cond_broadcast(&c->tx_cv);
}

typedef void (*encode_fn)(uint8_t *payload, const void *arg);

/* Reserves room, encodes the payload outside the lock, queues the frame. */
static int enqueue(struct dp_conn *c, int type, size_t len, encode_fn enc, const void *arg, bool act,
                   uint64_t step, int timeout_ms, char *err, size_t errlen)
{
    if (len > c->max_payload)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%s payload of %zu bytes over max_payload %zu",
                          type_name(type), len, c->max_payload);
    size_t mem = DATA_OFF + len;
    pthread_mutex_lock(&c->mu);
    int rc = reserve(c, mem, act, step, timeout_ms, err, errlen);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    struct frame *f = frame_new(len);
    if (!f) {
        pthread_mutex_lock(&c->mu);
        unreserve(c, mem, act, step);
        pthread_mutex_unlock(&c->mu);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for a frame of %zu bytes", len);
    }
    enc(f->payload, arg);
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = (uint8_t)type, .len = (uint32_t)len};
    if (c->payload_crc) {
        h.flags |= DP_F_PAYLOAD_CRC;
        h.payload_crc = dp_crc32c(0, f->payload, len);
    }
    dp_hdr_pack(f->hdr, &h);
    f->type = type;
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->ended)) {
        unreserve(c, mem, act, step);
        rc = cairn_fail(err, errlen, CAIRN_EIO, "connection to rank %d ended: %s", c->peer_rank, c->reason);
        pthread_mutex_unlock(&c->mu);
        frame_free(f);
        return rc;
    }
    f->t_queued = clock_ns();
    if (c->txt)
        c->txt->next = f;
    else
        c->txh = f;
    c->txt = f;
    if (type == DP_T_ACTIVATIONS)
        c->st.activations_sent++;
    else if (type == DP_T_RESULT)
        c->st.results_sent++;
    else if (type == DP_T_CONTROL)
        c->st.controls_sent++;
    pthread_mutex_unlock(&c->mu);
    wake_io(c);
    return 0;
}

struct act_enc {
    const struct dp_activations *a;
    int dt;
    size_t off;
    size_t vals_end, asks_off; /* asks: after the values, 8-aligned */
    uint64_t n_bias, n_hist;
};

static void encode_act(uint8_t *p, const void *arg)
{
    const struct act_enc *e = arg;
    const struct dp_activations *a = e->a;
    size_t n = (size_t)a->n;
    put_u64(p, a->step);
    put_u32(p + 8, (uint32_t)a->n);
    put_u32(p + 12, (uint32_t)a->n_embd);
    put_u32(p + 16, (uint32_t)e->dt);
    put_u32(p + 20, 0);
    memcpy(p + ACT_FIXED, a->pos, 8 * n);
    memcpy(p + ACT_FIXED + 8 * n, a->seq, 4 * n);
    if (a->want)
        memcpy(p + ACT_FIXED + 12 * n, a->want, n);
    else
        memset(p + ACT_FIXED + 12 * n, 1, n);
    memset(p + ACT_FIXED + 13 * n, 0, e->off - (ACT_FIXED + 13 * n));
    kern_quantize_row(e->dt, a->x, p + e->off, (int64_t)a->n * a->n_embd);
    put_u32(p + 20, (uint32_t)a->n_asks);
    if (a->n_asks) {
        memset(p + e->vals_end, 0, e->asks_off - e->vals_end);
        uint8_t *q = p + e->asks_off;
        memcpy(q, a->asks, 64 * (size_t)a->n_asks);
        q += 64 * (size_t)a->n_asks;
        if (e->n_bias)
            memcpy(q, a->bias, 8 * e->n_bias);
        if (e->n_hist)
            memcpy(q + 8 * e->n_bias, a->hist, 4 * e->n_hist);
    }
}

int dp_send_activations(struct dp_conn *c, const struct dp_activations *a, int timeout_ms, char *err,
                        size_t errlen)
{
    int dt = a->wire_dtype ? a->wire_dtype : DT_F32;
    if (a->n < 1 || a->n > DP_MAX_TOKENS || a->n_embd < 1 || a->n_embd > DP_MAX_EMBD)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations of %d x %d", a->n, a->n_embd);
    if (!a->seq || !a->pos || !a->x)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations without seq, pos or values");
    int64_t row = dp_wire_bytes(dt, a->n_embd);
    if (row < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations cannot travel as %s (rows of %d)",
                          dtype_name(dt), a->n_embd);
    int n_want = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->seq[i] < 0 || a->pos[i] < 0 || (a->want && a->want[i] > 1))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: seq %d pos %" PRId64, i, a->seq[i], a->pos[i]);
        n_want += !a->want || a->want[i];
    }
    size_t off = align8(ACT_FIXED + 13 * (size_t)a->n);
    size_t len = off + (size_t)a->n * (size_t)row;
    struct act_enc e = {.a = a, .dt = dt, .off = off, .vals_end = len, .asks_off = len};
    if (a->n_asks) {
        if (a->n_asks != n_want || !a->asks)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "%d asks for %d wanted tokens", a->n_asks, n_want);
        int64_t bad = asks_check(a->asks, a->n_asks, &e.n_bias, &e.n_hist);
        if (bad >= 0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "ask %" PRId64 " out of range", bad);
        if ((e.n_bias && !a->bias) || (e.n_hist && !a->hist))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "asks without their bias entries or windows");
        for (uint64_t i = 0; i < e.n_bias; i++)
            if (a->bias[i].token < 0 || isnan(a->bias[i].bias))
                return cairn_fail(err, errlen, CAIRN_EINVAL, "bias entry %" PRIu64 ": token %d", i, a->bias[i].token);
        for (uint64_t i = 0; i < e.n_hist; i++)
            if (a->hist[i] < 0)
                return cairn_fail(err, errlen, CAIRN_EINVAL, "window token %" PRIu64 ": %d", i, a->hist[i]);
        e.asks_off = align8(len);
        uint64_t total = (uint64_t)e.asks_off + 64u * (uint64_t)a->n_asks + 8 * e.n_bias + 4 * e.n_hist;
        if (total > c->max_payload)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "ACTIVATIONS payload of %" PRIu64 " bytes over max_payload %zu",
                              total, c->max_payload);
        len = (size_t)total;
    }
    return enqueue(c, DP_T_ACTIVATIONS, len, encode_act, &e, true, a->step, timeout_ms, err, errlen);
}

struct res_enc {
    const struct dp_result *r;
    size_t ml, off;
    uint64_t ns, nt, nl; /* SAMPLED: tokens, top entries, logits rows */
};

static void encode_result(uint8_t *p, const void *arg)
{
    const struct res_enc *e = arg;
    const struct dp_result *r = e->r;
    size_t n = (size_t)r->n;
    put_u64(p, r->step);
    put_u32(p + 8, (uint32_t)r->n);
    put_u32(p + 12, (uint32_t)r->kind);
    put_u32(p + 16, r->kind != DP_RESULT_TOKENS ? (uint32_t)r->n_vocab : 0);
    put_u32(p + 20, (uint32_t)r->status);
    put_u16(p + 24, (uint16_t)e->ml);
    put_u16(p + 26, 0);
    put_u32(p + 28, 0);
    if (e->ml)
        memcpy(p + RES_FIXED, r->message, e->ml);
    memset(p + RES_FIXED + e->ml, 0, e->off - (RES_FIXED + e->ml));
    uint8_t *q = p + e->off;
    if (n) {
        memcpy(q, r->pos, 8 * n);
        memcpy(q + 8 * n, r->seq, 4 * n);
        q += 12 * n;
        if (r->kind == DP_RESULT_TOKENS) {
            memcpy(q, r->token, 4 * n);
            memcpy(q + 4 * n, r->logprob, 4 * n);
        } else if (r->kind == DP_RESULT_LOGITS) {
            memcpy(q, r->logits, 4 * n * (size_t)r->n_vocab);
        } else {
            memcpy(q, r->need, n);
            size_t end = e->off + 13 * n, pad = align8(end) - end;
            memset(q + n, 0, pad);
            q += n + pad;
            size_t ns = (size_t)e->ns, nt = (size_t)e->nt;
            if (ns) {
                memcpy(q, r->token, 4 * ns);
                memcpy(q + 4 * ns, r->prob, 4 * ns);
                memcpy(q + 8 * ns, r->logprob, 4 * ns);
                memcpy(q + 12 * ns, r->n_top, 4 * ns);
            }
            q += 16 * ns;
            if (nt) {
                memcpy(q, r->top_token, 4 * nt);
                memcpy(q + 4 * nt, r->top_logprob, 4 * nt);
            }
            q += 8 * nt;
            if (e->nl)
                memcpy(q, r->logits, 4 * (size_t)e->nl * (size_t)r->n_vocab);
        }
    }
}

/* The payload length of r, with its SAMPLED counts; CAIRN_EINVAL when malformed. */
static int result_len(const struct dp_result *r, uint64_t *len, uint64_t *ns, uint64_t *nt, uint64_t *nl,
                      char *err, size_t errlen)
{
    if (r->n < 0 || r->n > DP_MAX_TOKENS || r->status > 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result of %d entries, status %d", r->n, r->status);
    if (r->kind != DP_RESULT_TOKENS && r->kind != DP_RESULT_LOGITS && r->kind != DP_RESULT_SAMPLED)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result kind %d", (int)r->kind);
    if (r->kind != DP_RESULT_TOKENS && (r->n_vocab < 1 || r->n_vocab > DP_MAX_VOCAB))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result n_vocab %d", r->n_vocab);
    if (r->n && (!r->seq || !r->pos || (r->kind == DP_RESULT_TOKENS ? !r->token || !r->logprob
                                        : r->kind == DP_RESULT_LOGITS ? !r->logits : !r->need)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its arrays");
    for (int i = 0; i < r->n; i++)
        if (r->seq[i] < 0 || r->pos[i] < 0 || (r->kind == DP_RESULT_TOKENS && r->token[i] < 0) ||
            (r->kind == DP_RESULT_SAMPLED && (r->need[i] < DP_ROW_LOGITS || r->need[i] > DP_ROW_SKIP)))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "result entry %d: seq %d pos %" PRId64, i, r->seq[i],
                              r->pos[i]);
    size_t ml = r->message ? strnlen(r->message, DP_REASON_MAX) : 0;
    uint64_t base = (uint64_t)align8(RES_FIXED + ml) + 12u * (uint64_t)r->n;
    *ns = *nt = *nl = 0;
    if (r->kind == DP_RESULT_TOKENS) {
        *len = base + 8u * (uint64_t)r->n;
        return 0;
    }
    if (r->kind == DP_RESULT_LOGITS) {
        *len = base + 4u * (uint64_t)r->n * (uint64_t)r->n_vocab;
        return 0;
    }
    for (int i = 0; i < r->n; i++) {
        *ns += r->need[i] == DP_ROW_SAMPLE;
        *nl += r->need[i] == DP_ROW_LOGITS;
    }
    if ((*ns && (!r->token || !r->prob || !r->logprob || !r->n_top)) || (*nl && !r->logits))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its arrays");
    for (uint64_t i = 0; i < *ns; i++) {
        if (r->token[i] <= DP_TOKEN_ERR_MIN || r->n_top[i] < 0 || r->n_top[i] > DP_MAX_TOP ||
            (r->token[i] < 0 && r->n_top[i]))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "sampled token %" PRIu64 ": %d with %d top", i, r->token[i],
                              r->n_top[i]);
        *nt += (uint64_t)r->n_top[i];
    }
    if (*nt && (!r->top_token || !r->top_logprob))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its top log-probabilities");
    for (uint64_t i = 0; i < *nt; i++)
        if (r->top_token[i] < 0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "top token %" PRIu64 ": %d", i, r->top_token[i]);
    *len = align8(base + (uint64_t)r->n) + sampled_bytes(*ns, *nt, *nl, (uint64_t)r->n_vocab);
    return 0;
}

uint64_t dp_result_wire_bytes(const struct dp_result *r)
{
    uint64_t len, ns, nt, nl;
    return r && result_len(r, &len, &ns, &nt, &nl, NULL, 0) == 0 ? DP_HDR_SIZE + len : 0;
}

int dp_send_result(struct dp_conn *c, const struct dp_result *r, int timeout_ms, char *err, size_t errlen)
{
    uint64_t len, ns, nt, nl;
    int rc = result_len(r, &len, &ns, &nt, &nl, err, errlen);
    if (rc)
        return rc;
    size_t ml = r->message ? strnlen(r->message, DP_REASON_MAX) : 0;
    size_t off = align8(RES_FIXED + ml);
    if (len > c->max_payload)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "RESULT payload of %" PRIu64 " bytes over max_payload %zu", len,
                          c->max_payload);
    struct res_enc e = {.r = r, .ml = ml, .off = off, .ns = ns, .nt = nt, .nl = nl};
    return enqueue(c, DP_T_RESULT, (size_t)len, encode_result, &e, false, 0, timeout_ms, err, errlen);
}

static void encode_control(uint8_t *p, const void *arg)
{
    const struct dp_control *ctl = arg;
    put_u64(p, ctl->step);
    put_u32(p + 8, (uint32_t)ctl->n);
    put_u32(p + 12, 0);
    if (ctl->n)
        memcpy(p + CTL_FIXED, ctl->ops, (size_t)ctl->n * sizeof(struct dp_ctl));
}

int dp_send_control(struct dp_conn *c, const struct dp_control *ctl, int timeout_ms, char *err, size_t errlen)
{
    if (ctl->n < 0 || ctl->n > DP_MAX_CTL_OPS || (ctl->n && !ctl->ops))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "control of %d ops", ctl->n);
    for (int i = 0; i < ctl->n; i++)
        if (!ctl_ok(&ctl->ops[i]))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "control op %d: op %" PRIu32 " seq %d seq2 %d pos %" PRId64,
                              i, ctl->ops[i].op, ctl->ops[i].seq, ctl->ops[i].seq2, ctl->ops[i].pos);
    size_t len = CTL_FIXED + (size_t)ctl->n * sizeof(struct dp_ctl);
    return enqueue(c, DP_T_CONTROL, len, encode_control, ctl, false, 0, timeout_ms, err, errlen);
}

int dp_inflight_done(struct dp_conn *c, uint64_t step)
{
    pthread_mutex_lock(&c->mu);
    bool found = win_release(c, step, clock_ns());
    if (found)
        pthread_cond_broadcast(&c->tx_cv);
    pthread_mutex_unlock(&c->mu);
    return found ? 0 : CAIRN_ENOTFOUND;
}

int dp_recv(struct dp_conn *c, struct dp_frame *f, int timeout_ms, char *err, size_t errlen)
{
    int64_t t0 = clock_ns();
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : t0 + timeout_ms * MS;
    pthread_mutex_lock(&c->mu);
    struct frame *old = c->cur;
    c->cur = NULL;
    while (!c->rxh && !atomic_load(&c->ended)) {
        if (clock_ns() >= deadline)
            break;
        if (deadline == INT64_MAX) {
            pthread_cond_wait(&c->rx_cv, &c->mu);
        } else {
            struct timespec ts;
            deadline_ts(deadline, &ts);
            pthread_cond_timedwait(&c->rx_cv, &c->mu, &ts);
        }
    }
    c->st.recv_wait_us += (clock_ns() - t0) / 1000;
    int rc = 0;
    bool credit = false;
    if (c->rxh) {
        struct frame *q = c->rxh;
        c->rxh = q->next;
        if (!c->rxh)
            c->rxt = NULL;
        c->rx_bytes -= q->mem;
        if (data_type(q->type)) {
            /* wake the I/O thread only when this take crosses the credit threshold */
            uint64_t before = c->consumed - c->announced, q4 = c->rx_cap / 4;
            c->consumed += q->wire;
            credit = before < q4 && c->consumed - c->announced >= q4;
        }
        q->next = NULL;
        c->cur = q;
        *f = q->view;
        rc = 1;
    } else if (atomic_load(&c->ended)) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s", c->reason);
    }
    pthread_mutex_unlock(&c->mu);
    frame_free(old);
    if (credit)
        wake_io(c);
    return rc;
}

bool dp_peer_alive(const struct dp_conn *c)
{
    if (atomic_load(&c->ended))
        return false;
    return clock_ns() - atomic_load(&c->last_rx) <= c->dead_ns;
}

const char *dp_error(const struct dp_conn *c) { return atomic_load(&c->ended) ? c->reason : ""; }

int dp_peer_rank(const struct dp_conn *c) { return c->peer_rank; }

const char *dp_peer_addr(const struct dp_conn *c) { return c->peer_addr; }

void dp_get_stats(const struct dp_conn *c, struct dp_stats *out)
{
    struct dp_conn *m = (struct dp_conn *)c; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    *out = c->st;
    out->inflight = c->win_n;
    out->send_queued = c->tx_bytes;
    out->recv_queued = c->rx_bytes;
    pthread_mutex_unlock(&m->mu);
}

void dp_close(struct dp_conn *c, const char *reason)
{
    if (!c)
        return;
    if (c->io_started) {
        pthread_mutex_lock(&c->mu);
        if (!c->closing) {
            c->closing = true;
            snprintf(c->close_reason, sizeof c->close_reason, "%s", reason ? reason : "closed");
            c->close_deadline = clock_ns() + c->linger_ns;
            frames_free(c->rxh); /* nobody reads any more */
            c->rxh = c->rxt = NULL;
            c->rx_bytes = 0;
        }
        pthread_mutex_unlock(&c->mu);
        wake_io(c);
        pthread_join(c->io, NULL);
    }
    if (c->fd >= 0)
        close(c->fd);
    if (c->wake[0] >= 0)
        close(c->wake[0]);
    if (c->wake[1] >= 0)
        close(c->wake[1]);
    frames_free(c->txh);
    frames_free(c->rxh);
    frame_free(c->cur);
    free(c->win);
    free(c->rbuf);
    pthread_cond_destroy(&c->tx_cv);
    pthread_cond_destroy(&c->rx_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
