/* Data plane between runners (dataplane.h): a connection once its handshake is done
 * (dataplane_open.c): the I/O thread, the send and receive queues, flow control and
 * in-flight slots. Frame layouts are in dataplane_wire.c. */
#define _GNU_SOURCE /* pipe2, ppoll */
#include <sched.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
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
#include "base/err.h"
#include "base/log.h"
#include "runner/dataplane_int.h"

#define MS ((int64_t)1000000)      /* ns */
#define RBUF_SIZE ((size_t)64 << 10) /* staging buffer of the reader */

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
    struct dp_decoded d; /* receive: the frame as dp_recv returns it */
};

#define DATA_OFF ((sizeof(struct frame) + DP_HDR_SIZE + 15) & ~(size_t)15)

/* A frame of len payload bytes, with room bytes more after them (a seal's tag). */
static struct frame *frame_new(size_t len, size_t room)
{
    if (len > SIZE_MAX - DATA_OFF - room)
        return NULL;
    struct frame *f = malloc(DATA_OFF + len + room);
    if (!f)
        return NULL;
    memset(f, 0, sizeof *f);
    f->payload = (uint8_t *)f + DATA_OFF;
    f->hdr = f->payload - DP_HDR_SIZE;
    f->len = len;
    f->mem = DATA_OFF + len + room;
    f->wire = DP_HDR_SIZE + len + room;
    return f;
}

static void frame_free(struct frame *f)
{
    if (!f)
        return;
    free(f->d.x);
    free(f->d.text);
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

/* What the writer is writing: a queued frame or the I/O thread's own (ibuf). */
struct out {
    uint8_t *p;
    size_t len, off;
    struct frame *f;  /* a queued frame, or NULL for ibuf */
    bool is_bye;
};

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
    bool sealed;              /* frames are sealed with tx (wr_mu) and opened with rx (rd_mu) */
    struct dp_seal_dir tx, rx;
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

    /* Reading in the caller's thread (dp_recv_spin): while `direct` is set the I/O thread
     * leaves the socket's input to a spinning caller (it does not poll for it, so an
     * arriving frame wakes no thread), until spin_at, the caller's last look, is older
     * than DIRECT_STALE_NS. Whoever reads holds rd_mu (before mu). */
    _Atomic int direct;
    _Atomic int64_t spin_at;
    pthread_mutex_t rd_mu;
    /* The writer: the I/O thread, or a caller whose frame finds nothing queued before it
     * (enqueue writes it at once instead of waking the thread). Holds wr_mu (before mu). */
    pthread_mutex_t wr_mu;
    struct out o;             /* being written */

    /* the reader (rd_mu) */
    uint8_t *rbuf;
    size_t rbuf_len, rbuf_off;
    uint8_t in_hdr[DP_HDR_SIZE];
    size_t in_hdr_got;
    struct dp_hdr in_h;
    struct frame *in_f;       /* payload being read */
    size_t in_got;
    /* under mu */
    uint64_t hb_peer_t;       /* the peer's clock in its last heartbeat */
    int64_t hb_peer_rx;       /* when that heartbeat arrived */
    bool pushed;              /* frames queued since the last notify */
};

/* The I/O thread polls the socket's input again once no caller has spun for this long
 * (a rank between exchanges mostly computes for less), or at once when a caller waits in
 * dp_recv (an idle one never spins). */
#define DIRECT_STALE_NS (2 * MS)

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

/* ---- the I/O thread ---- */

/* A protocol error of the peer's: tell it why when nothing half-written is in the way
 * and no one else is writing (one non-blocking try), then end. */
static void fail_protocol(struct dp_conn *c, const char *why)
{
    if (pthread_mutex_trylock(&c->wr_mu) == 0) {
        if (!c->o.p) {
            uint8_t buf[DP_IBUF_SIZE + DP_SEAL_TAG];
            char reason[DP_REASON_MAX + 1];
            snprintf(reason, sizeof reason, "bad frame from rank %d: %.440s", c->peer_rank, why);
            size_t n = dp_pack_goodbye(buf, CAIRN_EFORMAT, reason);
            if (c->sealed)
                n = dp_seal_frame(&c->tx, buf, n - DP_HDR_SIZE);
            ssize_t r = send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)r;
        }
        pthread_mutex_unlock(&c->wr_mu);
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

/* A HEARTBEAT has arrived: note the peer's clock and our round trip. Returns -1 when
 * the connection ended. */
static int heartbeat_in(struct dp_conn *c, struct frame *f, int64_t now)
{
    uint64_t t, echo, age;
    bool ok = dp_parse_heartbeat(f->payload, f->len, &t, &echo, &age);
    frame_free(f);
    if (!ok) {
        fail_protocol(c, "HEARTBEAT of the wrong size");
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    c->hb_peer_t = t;
    c->hb_peer_rx = now;
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

/* A CREDIT has arrived: the peer's reader took more. Returns -1 when the connection
 * ended. */
static int credit_in(struct dp_conn *c, struct frame *f)
{
    uint64_t v;
    bool ok = dp_parse_credit(f->payload, f->len, &v);
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
        char why[DP_REASON_MAX];
        snprintf(why, sizeof why, "CREDIT for %" PRIu64 " bytes of %" PRIu64 " sent", v, sent);
        fail_protocol(c, why);
        return -1;
    }
    return 0;
}

/* A whole frame has arrived. Returns -1 when the connection ended. */
static int frame_done(struct dp_conn *c, struct frame *f)
{
    char why[DP_REASON_MAX];
    int64_t now = clock_ns();
    const struct dp_hdr *h = &c->in_h;
    if (c->sealed) {
        long plain = dp_open_frame(&c->rx, c->in_hdr, f->payload, f->len);
        if (plain < 0) {
            frame_free(f);
            fail_protocol(c, "a frame that does not open with this connection's key (forged, altered, replayed "
                                "or reordered)");
            return -1;
        }
        f->len = (size_t)plain; /* wire keeps the sealed size, which the window counts */
    }
    if ((h->flags & DP_F_PAYLOAD_CRC) && dp_crc32c(0, f->payload, f->len) != h->payload_crc) {
        frame_free(f);
        fail_protocol(c, "bad payload checksum");
        return -1;
    }
    f->type = h->type;
    if (h->type == DP_T_HEARTBEAT)
        return heartbeat_in(c, f, now);
    if (h->type == DP_T_CREDIT)
        return credit_in(c, f);
    int rc = dp_decode(h->type, f->payload, f->len, &f->d, why, sizeof why);
    if (rc) {
        frame_free(f);
        if (rc == CAIRN_ENOMEM)
            conn_end(c, true, "%s", why);
        else
            fail_protocol(c, why);
        return -1;
    }
    f->mem += f->d.x_bytes;
    char bye[DP_REASON_MAX + 32] = "";
    int bye_code = 0;
    if (h->type == DP_T_GOODBYE) { /* copied now: the frame may be freed once queued */
        bye_code = f->d.view.bye.code;
        snprintf(bye, sizeof bye, "%s", f->d.view.bye.reason);
    }
    pthread_mutex_lock(&c->mu);
    c->st.frames_received++;
    bool closing = c->closing, released = false;
    if (h->type == DP_T_ACTIVATIONS)
        c->st.activations_received++;
    else if (h->type == DP_T_RESULT) {
        c->st.results_received++;
        released = win_release(c, f->d.view.res.step, now);
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
static int consume(struct dp_conn *c, const uint8_t *p, size_t n)
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
                fail_protocol(c, why);
                return -1;
            }
            if (c->sealed != !!(c->in_h.flags & DP_F_SEALED)) {
                fail_protocol(c, c->sealed ? "an unsealed frame on a sealed connection"
                                              : "a sealed frame on a connection without a secret");
                return -1;
            }
            if (dp_type_is_data(c->in_h.type)) { /* the window is checked before anything is allocated */
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
                    fail_protocol(c, why);
                    return -1;
                }
            }
            c->in_f = frame_new(c->in_h.len, 0);
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
            if (frame_done(c, f))
                return -1;
        }
    }
    return 0;
}

/* Reads what the socket has (the peer's flow control bounds it). Returns -1 when the
 * connection ended. */
static int do_read(struct dp_conn *c)
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
                    if (frame_done(c, f))
                        return -1;
                }
            } else if (consume(c, c->rbuf, (size_t)r)) {
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
                         c->peer_rank, dp_type_name(c->in_h.type), c->in_got, c->in_f->len);
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
    bool ok = !dp_type_is_data(f->type) || u + f->wire <= w || u < w / 4;
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
        size_t n = dp_pack_heartbeat(ibuf, (uint64_t)now, c->hb_peer_t,
                                     c->hb_peer_t ? (uint64_t)(now - c->hb_peer_rx) : 0);
        *o = (struct out){.p = ibuf, .len = n};
        *next_hb = now + c->hb_ns;
        c->st.heartbeats_sent++;
    } else if (!closing && c->consumed - c->announced >= c->rx_cap / 4) {
        *o = (struct out){.p = ibuf, .len = dp_pack_credit(ibuf, c->consumed)};
        c->announced = c->consumed;
    } else if (c->txh && has_credit(c, c->txh, now) && now >= c->txh->t_queued + c->delay_ns) {
        struct frame *f = c->txh;
        c->txh = f->next;
        if (!c->txh)
            c->txt = NULL;
        if (dp_type_is_data(f->type))
            c->sent_data += f->wire;
        *o = (struct out){.p = f->hdr, .len = DP_HDR_SIZE + f->len, .f = f};
    } else if (closing && !c->txh && !*bye_queued) {
        size_t n = dp_pack_goodbye(ibuf, 0, c->close_reason);
        *o = (struct out){.p = ibuf, .len = n, .is_bye = true};
        *bye_queued = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (o->p && c->sealed) /* sealed as it is picked: the nonces follow the order on the wire */
        o->len = dp_seal_frame(&c->tx, o->p, o->len - DP_HDR_SIZE);
}

/* n more bytes of o have left (wr_mu held): counts them; once the whole frame has left,
 * frees it, clears o and returns true. */
static bool wrote(struct dp_conn *c, struct out *o, size_t n)
{
    o->off += n;
    bool done = o->off == o->len;
    pthread_mutex_lock(&c->mu);
    c->st.bytes_sent += (uint64_t)n;
    if (c->sealed)
        c->st.sealed_bytes_sent += (uint64_t)n;
    if (done) {
        c->st.frames_sent++;
        if (o->f) {
            c->tx_bytes -= o->f->mem;
            c->st.queue_us += (clock_ns() - o->f->t_queued) / 1000;
            pthread_cond_broadcast(&c->tx_cv);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (done) {
        frame_free(o->f);
        *o = (struct out){0};
    }
    return done;
}

/* Writes until the socket is full or nothing is left (wr_mu held). Returns 1 when it
 * would block, 0 when everything was written, -1 when the connection ended. */
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
        bool bye = o->is_bye;
        if (wrote(c, o, (size_t)n) && bye)
            *bye_sent = true;
    }
}

/* A frame of at most DIRECT_MAX_BYTES that finds nothing queued or being written before
 * it (and no emulated delay) leaves from the caller's thread at once: one send, no
 * wake-up of the I/O thread and no switch to it. Larger frames (a prefill's activations)
 * are sealed and written by the I/O thread, while the caller computes on. Takes f and
 * returns true when it went (what the socket did not take at once is left to the I/O
 * thread); false when it must be queued. */
#define DIRECT_MAX_BYTES ((size_t)256 << 10)
static bool write_now(struct dp_conn *c, struct frame *f)
{
    if (c->delay_ns || f->len > DIRECT_MAX_BYTES || pthread_mutex_trylock(&c->wr_mu))
        return false;
    bool took = false, rest = false;
    if (!c->o.p) {
        pthread_mutex_lock(&c->mu);
        took = !c->txh && !c->closing && !atomic_load(&c->ended) && has_credit(c, f, clock_ns());
        if (took && dp_type_is_data(f->type))
            c->sent_data += f->wire;
        pthread_mutex_unlock(&c->mu);
    }
    if (took) {
        c->o = (struct out){.p = f->hdr, .len = DP_HDR_SIZE + f->len, .f = f};
        if (c->sealed)
            c->o.len = dp_seal_frame(&c->tx, c->o.p, c->o.len - DP_HDR_SIZE);
        ssize_t n = send(c->fd, c->o.p, c->o.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        rest = !(n > 0 && wrote(c, &c->o, (size_t)n)); /* errors too: the I/O thread meets them */
    }
    pthread_mutex_unlock(&c->wr_mu);
    if (rest)
        wake_io(c);
    return took;
}

static void *io_main(void *arg)
{
    struct dp_conn *c = arg;
    uint8_t ibuf[DP_IBUF_SIZE + DP_SEAL_TAG];
    int64_t next_hb = clock_ns();
    bool bye_queued = false, bye_sent = false, wr_shut = false;
    while (!atomic_load(&c->ended)) {
        pthread_mutex_lock(&c->wr_mu);
        int wr = do_write(c, &c->o, ibuf, &next_hb, &bye_queued, &bye_sent);
        pthread_mutex_unlock(&c->wr_mu);
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
        /* A caller spinning in dp_recv_spin reads; look again once it may have stopped. */
        bool direct = atomic_load(&c->direct) != 0;
        if (direct && now - atomic_load(&c->spin_at) > DIRECT_STALE_NS) {
            int on = 1;
            atomic_compare_exchange_strong(&c->direct, &on, 0);
            direct = false;
        }
        if (direct && now + DIRECT_STALE_NS < wake_at)
            wake_at = now + DIRECT_STALE_NS;
        int64_t left = wake_at <= now ? 0 : wake_at - now;
        struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        struct pollfd pfd[2] = {{.fd = c->wake[0], .events = POLLIN}, {.fd = c->fd, .events = direct ? 0 : POLLIN}};
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
            pthread_mutex_lock(&c->rd_mu);
            int rr = do_read(c);
            pthread_mutex_unlock(&c->rd_mu);
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
    pthread_mutex_lock(&c->wr_mu);
    frame_free(c->o.f);
    c->o = (struct out){0};
    pthread_mutex_unlock(&c->wr_mu);
    frame_free(c->in_f);
    c->in_f = NULL;
    shutdown(c->fd, SHUT_RDWR);
    return NULL;
}

/* ---- connections: start, send, receive, close ---- */

int dp_conn_start(struct dp_conn **out, int fd, const struct dp_config *cfg, bool connector, int peer_rank,
                  uint64_t peer_window, const struct dp_seal_dir seal[2], const char *peer_addr, char *err,
                  size_t errlen)
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
    c->payload_crc = cfg->payload_crc && !seal; /* a seal's tag covers the payload already */
    c->sealed = seal != NULL;
    if (seal) {
        c->tx = seal[0];
        c->rx = seal[1];
    }
    c->notify = cfg->notify;
    c->notify_arg = cfg->notify_arg;
    c->st.hb_rtt_us = c->st.hb_rtt_min_us = -1;
    atomic_store(&c->last_rx, clock_ns()); /* the handshake was just heard */
    snprintf(c->peer_addr, sizeof c->peer_addr, "%s", peer_addr);
    snprintf(c->label, sizeof c->label, "rank %d %s rank %d (%s)", c->rank, connector ? "->" : "<-", peer_rank,
             c->peer_addr);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->rd_mu, NULL);
    pthread_mutex_init(&c->wr_mu, NULL);
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

/* Waits on cv (mu held) until signalled or until deadline (clock_ns time; INT64_MAX:
 * none). The conditions use the monotonic clock that clock_ns reads. */
static void wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline)
{
    if (deadline == INT64_MAX) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
    pthread_cond_timedwait(cv, mu, &ts);
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
        wait_until(&c->tx_cv, &c->mu, deadline);
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
                          dp_type_name(type), len, c->max_payload);
    size_t mem = DATA_OFF + len + (c->sealed ? DP_SEAL_TAG : 0); /* as frame_new counts it */
    pthread_mutex_lock(&c->mu);
    int rc = reserve(c, mem, act, step, timeout_ms, err, errlen);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    struct frame *f = frame_new(len, c->sealed ? DP_SEAL_TAG : 0);
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
    if (type == DP_T_ACTIVATIONS)
        c->st.activations_sent++;
    else if (type == DP_T_RESULT)
        c->st.results_sent++;
    else if (type == DP_T_CONTROL)
        c->st.controls_sent++;
    pthread_mutex_unlock(&c->mu);
    if (write_now(c, f))
        return 0;
    pthread_mutex_lock(&c->mu);
    if (c->txt)
        c->txt->next = f;
    else
        c->txh = f;
    c->txt = f;
    pthread_mutex_unlock(&c->mu);
    wake_io(c);
    return 0;
}

int dp_send_activations(struct dp_conn *c, const struct dp_activations *a, int timeout_ms, char *err,
                        size_t errlen)
{
    struct dp_act_enc e;
    int rc = dp_act_layout(a, &e, err, errlen);
    if (rc)
        return rc;
    return enqueue(c, DP_T_ACTIVATIONS, e.len, dp_encode_act, &e, true, a->step, timeout_ms, err, errlen);
}

int dp_send_result(struct dp_conn *c, const struct dp_result *r, int timeout_ms, char *err, size_t errlen)
{
    struct dp_res_enc e;
    int rc = dp_result_layout(r, &e, err, errlen);
    if (rc)
        return rc;
    return enqueue(c, DP_T_RESULT, e.len, dp_encode_result, &e, false, 0, timeout_ms, err, errlen);
}

int dp_send_control(struct dp_conn *c, const struct dp_control *ctl, int timeout_ms, char *err, size_t errlen)
{
    size_t len;
    int rc = dp_control_layout(ctl, &len, err, errlen);
    if (rc)
        return rc;
    return enqueue(c, DP_T_CONTROL, len, dp_encode_control, ctl, false, 0, timeout_ms, err, errlen);
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

/* Takes the head of the receive queue into *f (1), or says the connection ended
 * (CAIRN_EIO) or that nothing is there (0). Called with mu held; *credit says whether
 * the I/O thread should announce credit. */
static int take_frame(struct dp_conn *c, struct dp_frame *f, bool *credit, char *err, size_t errlen)
{
    if (c->rxh) {
        struct frame *q = c->rxh;
        c->rxh = q->next;
        if (!c->rxh)
            c->rxt = NULL;
        c->rx_bytes -= q->mem;
        if (dp_type_is_data(q->type)) {
            /* wake the I/O thread only when this take crosses the credit threshold */
            uint64_t before = c->consumed - c->announced, q4 = c->rx_cap / 4;
            c->consumed += q->wire;
            *credit = before < q4 && c->consumed - c->announced >= q4;
        }
        q->next = NULL;
        c->cur = q;
        *f = q->d.view;
        return 1;
    }
    if (atomic_load(&c->ended))
        return cairn_fail(err, errlen, CAIRN_EIO, "%s", c->reason);
    return 0;
}

int dp_recv(struct dp_conn *c, struct dp_frame *f, int timeout_ms, char *err, size_t errlen)
{
    if (atomic_exchange(&c->direct, 0)) /* a spin has ended: the I/O thread reads again, now */
        wake_io(c);
    int64_t t0 = clock_ns();
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : t0 + timeout_ms * MS;
    pthread_mutex_lock(&c->mu);
    struct frame *old = c->cur;
    c->cur = NULL;
    while (!c->rxh && !atomic_load(&c->ended)) {
        if (clock_ns() >= deadline)
            break;
        wait_until(&c->rx_cv, &c->mu, deadline);
    }
    c->st.recv_wait_us += (clock_ns() - t0) / 1000;
    bool credit = false;
    int rc = take_frame(c, f, &credit, err, errlen);
    pthread_mutex_unlock(&c->mu);
    frame_free(old);
    if (credit)
        wake_io(c);
    return rc;
}

int dp_recv_spin(struct dp_conn *c, struct dp_frame *f, int spin_us, int timeout_ms, char *err, size_t errlen)
{
    if (spin_us <= 0 || timeout_ms == 0)
        return dp_recv(c, f, timeout_ms, err, errlen);
    int64_t t0 = clock_ns();
    int64_t spin_end = t0 + (int64_t)spin_us * 1000;
    atomic_store(&c->spin_at, t0);
    atomic_store(&c->direct, 1);
    pthread_mutex_lock(&c->mu);
    struct frame *old = c->cur;
    c->cur = NULL;
    pthread_mutex_unlock(&c->mu);
    frame_free(old);
    for (;;) {
        bool credit = false;
        pthread_mutex_lock(&c->mu);
        c->st.spin_looks++;
        int rc = take_frame(c, f, &credit, err, errlen);
        if (rc)
            c->st.recv_wait_us += (clock_ns() - t0) / 1000;
        pthread_mutex_unlock(&c->mu);
        if (credit)
            wake_io(c);
        if (rc)
            return rc;
        /* Read the socket here: the frame wakes no thread, and this core stays awake. */
        if (pthread_mutex_trylock(&c->rd_mu) == 0) {
            do_read(c);
            pthread_mutex_unlock(&c->rd_mu);
            pthread_mutex_lock(&c->mu);
            bool got = c->rxh || atomic_load(&c->ended);
            c->pushed = c->pushed && !got; /* this caller takes what it pushed */
            pthread_mutex_unlock(&c->mu);
            if (got)
                continue;
        }
        int64_t now = clock_ns();
        atomic_store(&c->spin_at, now);
        if (now >= spin_end)
            break;
        sched_yield(); /* this process's other threads (the I/O threads that send) may need the core */
    }
    /* Nothing within the budget: block, with the I/O thread reading again (dp_recv). */
    int left = timeout_ms;
    if (timeout_ms > 0) {
        int64_t spent = (clock_ns() - t0) / MS;
        left = spent >= timeout_ms ? 1 : timeout_ms - (int)spent;
    }
    return dp_recv(c, f, left, err, errlen);
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
    pthread_mutex_destroy(&c->rd_mu);
    pthread_mutex_destroy(&c->wr_mu);
    dp_seal_release(&c->tx);
    dp_seal_release(&c->rx);
    sodium_memzero(c, sizeof *c); /* the seal's keys */
    free(c);
}
