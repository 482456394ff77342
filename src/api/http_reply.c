/* The HTTP server's replies and streams: full replies queued from the handler, and
 * streams (deferred or streamed replies) that any thread writes while the connection's
 * thread waits in poll() on the client's socket and the stream's eventfd. */
#define _GNU_SOURCE
#include "api/http_int.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#define WAIT_SLICE_MS 1000 /* upper bound on one poll(), in case a wake-up is lost */
#define XFORM_BLOCK (64 * 1024) /* bytes read and transformed at a time for a file reply */

/* ---------- small helpers ---------- */

/* Replaces every byte that is not part of valid UTF-8 with '?', in place. */
static void fix_utf8(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        bool ok = n >= 0;
        for (int i = 1; ok && i <= n; i++)
            ok = (p[i] & 0xC0) == 0x80;
        if (ok && n > 0) {
            uint32_t cp = c & (0x3F >> n);
            for (int i = 1; i <= n; i++)
                cp = (cp << 6) | (p[i] & 0x3F);
            static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
            ok = cp >= min_cp[n] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n + 1;
    }
}
static int hdr_add(struct hdr **list, const char *name, const char *value)
{
    if (!name || !value || strpbrk(name, "\r\n:") || strpbrk(value, "\r\n"))
        return CAIRN_EINVAL;
    struct hdr *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    h->name = strdup(name);
    h->value = strdup(value);
    if (!h->name || !h->value) {
        free(h->name);
        free(h->value);
        free(h);
        return CAIRN_ENOMEM;
    }
    struct hdr **tail = list;
    while (*tail)
        tail = &(*tail)->next;
    *tail = h;
    return 0;
}

void http_hdr_free(struct hdr *h)
{
    while (h) {
        struct hdr *next = h->next;
        free(h->name);
        free(h->value);
        free(h);
        h = next;
    }
}
static char *error_text(int status, const char *type, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fix_utf8(msg);
    json_t *j = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg, "type",
                          type ? type : "error", "code", status);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

/* ---------- streams ---------- */

static void stream_unref(struct http_stream *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    http_hdr_free(s->hdrs);
    free(s->ctype);
    free(s->reply_body);
    free(s->q);
    free(s->ka);
    free(s);
}

/* Wakes the connection thread if it waits; s->mu held. */
static void stream_kick(struct http_stream *s)
{
    if (s->waiting)
        (void)!eventfd_write(s->efd, 1);
}

/* Claims the close callback for the calling thread, which then runs stream_fire; the
 * claim is made with the state change, so a release that follows waits for it. */
static void stream_claim_cb(struct http_stream *s)
{
    if (s->cb && !s->cb_done &&
        (s->state == HTTP_STREAM_GONE || s->state == HTTP_STREAM_STOPPED)) {
        s->cb_done = true;
        s->cb_running = true;
        s->cb_pending = true;
        s->cb_thread = pthread_self();
    }
}

/* Moves an OPEN stream to state st; s->mu held. True when it changed, and then the
 * caller must call stream_fire once it has unlocked. */
static bool stream_set_state(struct http_stream *s, enum http_stream_state st)
{
    if (s->state != HTTP_STREAM_OPEN)
        return false;
    s->state = st;
    stream_claim_cb(s);
    pthread_cond_broadcast(&s->cond);
    (void)!eventfd_write(s->efd, 1);
    return true;
}

/* Runs the close callback claimed by this thread, if any; called without s->mu. */
static void stream_fire(struct http_stream *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->cb_pending && pthread_equal(s->cb_thread, pthread_self())) {
        http_stream_close_fn fn = s->cb;
        void *arg = s->cb_arg;
        enum http_stream_state why = s->state;
        s->cb_pending = false;
        pthread_mutex_unlock(&s->mu);
        fn(arg, s, why);
        pthread_mutex_lock(&s->mu);
        s->cb_running = false;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the client's socket to close or the eventfd to fire; true when gone. */
static bool wait_client(int sockfd, int efd, int timeout_ms)
{
    struct pollfd p[2] = {{.fd = sockfd, .events = POLLRDHUP}, {.fd = efd, .events = POLLIN}};
    int n = poll(p, 2, timeout_ms);
    if (n <= 0)
        return false;
    if (p[1].revents & POLLIN) {
        eventfd_t v;
        (void)!eventfd_read(efd, &v);
    }
    return (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int stream_new(struct http_request *req, struct http_stream **out)
{
    struct http_server *srv = req->srv;
    struct http_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->efd < 0) {
        free(s);
        return CAIRN_EIO;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->srv = srv;
    s->sockfd = req->sockfd;
    s->q_max = srv->stream_queue;
    atomic_init(&s->refs, 2); /* the caller's and the request's */
    req->stream = s;
    pthread_mutex_lock(&srv->mu);
    s->next = srv->streams;
    if (srv->streams)
        srv->streams->prev = s;
    srv->streams = s;
    s->listed = true;
    srv->n_streams++;
    pthread_mutex_unlock(&srv->mu);
    *out = s;
    return 0;
}

static void stream_unlist(struct http_stream *s)
{
    struct http_server *srv = s->srv;
    pthread_mutex_lock(&srv->mu);
    if (s->listed) {
        if (s->prev)
            s->prev->next = s->next;
        else
            srv->streams = s->next;
        if (s->next)
            s->next->prev = s->prev;
        s->listed = false;
        srv->n_streams--;
        pthread_cond_broadcast(&srv->cond);
    }
    pthread_mutex_unlock(&srv->mu);
}

void http_stream_on_close(struct http_stream *s, http_stream_close_fn fn, void *arg)
{
    pthread_mutex_lock(&s->mu);
    if (!s->cb_done) {
        s->cb = fn;
        s->cb_arg = arg;
        stream_claim_cb(s); /* already closed: runs now, on this thread */
    }
    pthread_mutex_unlock(&s->mu);
    stream_fire(s);
}

int http_stream_header(struct http_stream *s, const char *name, const char *value)
{
    pthread_mutex_lock(&s->mu);
    int rc = (s->started || s->replied) ? CAIRN_ESTATE : hdr_add(&s->hdrs, name, value);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int http_stream_start(struct http_stream *s, int status, const char *content_type)
{
    char *ct = strdup(content_type ? content_type : "application/octet-stream");
    if (!ct)
        return CAIRN_ENOMEM;
    pthread_mutex_lock(&s->mu);
    if (s->started || s->replied || s->state != HTTP_STREAM_OPEN) {
        pthread_mutex_unlock(&s->mu);
        free(ct);
        return CAIRN_ESTATE;
    }
    s->started = true;
    s->status = status;
    s->ctype = ct;
    stream_kick(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Hands a full reply body (malloc'd, taken) to a deferred stream. */
static int stream_reply(struct http_stream *s, int status, char *text)
{
    if (!text)
        return CAIRN_ENOMEM;
    pthread_mutex_lock(&s->mu);
    if (s->started || s->replied || s->state != HTTP_STREAM_OPEN) {
        pthread_mutex_unlock(&s->mu);
        free(text);
        return CAIRN_ESTATE;
    }
    s->replied = true;
    s->status = status;
    s->reply_body = text;
    s->reply_len = strlen(text);
    stream_set_state(s, HTTP_STREAM_FINISHED);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int http_stream_reply_json(struct http_stream *s, int status, json_t *body)
{
    if (!body)
        return CAIRN_EINVAL;
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return stream_reply(s, status, text);
}

int http_stream_reply_error(struct http_stream *s, int status, const char *type,
                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *text = error_text(status, type, fmt, ap);
    va_end(ap);
    return stream_reply(s, status, text);
}

int http_stream_write(struct http_stream *s, const void *data, size_t len)
{
    pthread_mutex_lock(&s->mu);
    if (s->state != HTTP_STREAM_OPEN || s->replied) {
        pthread_mutex_unlock(&s->mu);
        return CAIRN_ESTATE;
    }
    size_t pending = s->q_len - s->q_off;
    if (len > s->q_max || pending > s->q_max - len) {
        /* The client reads slower than we produce: give up on it rather than buffer
         * without bound or block the writer. */
        stream_set_state(s, HTTP_STREAM_TOO_SLOW);
        if (s->sockfd >= 0)
            shutdown(s->sockfd, SHUT_RDWR);
        pthread_mutex_unlock(&s->mu);
        return CAIRN_EFULL;
    }
    if (s->q_cap - s->q_len < len) {
        if (s->q_off > 0) {
            memmove(s->q, s->q + s->q_off, pending);
            s->q_len = pending;
            s->q_off = 0;
        }
        if (s->q_cap - s->q_len < len) {
            size_t cap = s->q_cap ? s->q_cap : 4096;
            while (cap - s->q_len < len)
                cap *= 2;
            char *q = realloc(s->q, cap);
            if (!q) {
                pthread_mutex_unlock(&s->mu);
                return CAIRN_ENOMEM;
            }
            s->q = q;
            s->q_cap = cap;
        }
    }
    memcpy(s->q + s->q_len, data, len);
    s->q_len += len;
    stream_kick(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int http_stream_printf(struct http_stream *s, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    int rc;
    if (n < 0) {
        rc = CAIRN_EINVAL;
    } else if ((size_t)n < sizeof small) {
        rc = http_stream_write(s, small, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            rc = CAIRN_ENOMEM;
        } else {
            vsnprintf(big, (size_t)n + 1, fmt, ap2);
            rc = http_stream_write(s, big, (size_t)n);
            free(big);
        }
    }
    va_end(ap2);
    return rc;
}

int http_stream_json_line(struct http_stream *s, const json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (!text)
        return CAIRN_EINVAL;
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return CAIRN_ENOMEM;
    }
    line[n] = '\n';
    int rc = http_stream_write(s, line, n + 1);
    free(line);
    return rc;
}

void http_stream_keepalive(struct http_stream *s, const char *bytes, unsigned interval_ms)
{
    char *ka = bytes && *bytes ? strdup(bytes) : NULL;
    pthread_mutex_lock(&s->mu);
    free(s->ka);
    s->ka = ka;
    s->ka_len = ka ? strlen(ka) : 0;
    s->ka_ms = interval_ms ? interval_ms : s->srv->keepalive_ms;
    stream_kick(s);
    pthread_mutex_unlock(&s->mu);
}

void http_stream_finish(struct http_stream *s)
{
    pthread_mutex_lock(&s->mu);
    stream_set_state(s, HTTP_STREAM_FINISHED);
    pthread_mutex_unlock(&s->mu);
}

enum http_stream_state http_stream_state(const struct http_stream *s)
{
    struct http_stream *m = (struct http_stream *)s; /* locking does not change it */
    pthread_mutex_lock(&m->mu);
    enum http_stream_state st = m->state;
    pthread_mutex_unlock(&m->mu);
    return st;
}

bool http_stream_closed(const struct http_stream *s)
{
    return http_stream_state(s) != HTTP_STREAM_OPEN;
}

bool http_stream_wait_closed(struct http_stream *s, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (s->state == HTTP_STREAM_OPEN && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cond, &s->mu);
        else if (pthread_cond_timedwait(&s->cond, &s->mu, &until) == ETIMEDOUT)
            break;
    }
    bool closed = s->state != HTTP_STREAM_OPEN;
    pthread_mutex_unlock(&s->mu);
    return closed;
}

uint64_t http_stream_bytes_sent(const struct http_stream *s)
{
    struct http_stream *m = (struct http_stream *)s;
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->sent;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void http_stream_release(struct http_stream *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    stream_set_state(s, HTTP_STREAM_FINISHED);
    s->cb_done = true; /* no new claim; one already claimed runs and is waited for */
    while (s->cb_running && !pthread_equal(s->cb_thread, pthread_self()))
        pthread_cond_wait(&s->cond, &s->mu);
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
}

/* libmicrohttpd's content reader: runs on the connection's thread, waits for bytes
 * from the writer while watching the client's socket. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct http_stream *s = cls;
    (void)pos;
    int64_t idle_from = clock_ns();
    pthread_mutex_lock(&s->mu);
    int sockfd = s->sockfd;
    for (;;) {
        size_t avail = s->q_len - s->q_off;
        if (avail > 0) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, s->q + s->q_off, n);
            s->q_off += n;
            if (s->q_off == s->q_len)
                s->q_off = s->q_len = 0;
            s->sent += n;
            pthread_mutex_unlock(&s->mu);
            return (ssize_t)n;
        }
        if (s->state == HTTP_STREAM_GONE || s->state == HTTP_STREAM_TOO_SLOW) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (s->state != HTTP_STREAM_OPEN) { /* finished or stopped, and drained */
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        int wait_ms = WAIT_SLICE_MS;
        if (s->ka_len > 0) {
            int64_t idle_ms = (clock_ns() - idle_from) / 1000000;
            if (idle_ms >= (int64_t)s->ka_ms && s->ka_len <= max) {
                memcpy(buf, s->ka, s->ka_len);
                s->sent += s->ka_len;
                pthread_mutex_unlock(&s->mu);
                return (ssize_t)s->ka_len;
            }
            if ((int64_t)s->ka_ms - idle_ms < wait_ms)
                wait_ms = (int)((int64_t)s->ka_ms - idle_ms);
        }
        s->waiting = true;
        pthread_mutex_unlock(&s->mu);
        bool gone = wait_client(sockfd, s->efd, wait_ms);
        pthread_mutex_lock(&s->mu);
        s->waiting = false;
        if (gone) {
            bool changed = stream_set_state(s, HTTP_STREAM_GONE);
            pthread_mutex_unlock(&s->mu);
            if (changed)
                stream_fire(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_read_free(void *cls)
{
    stream_unref(cls);
}

void http_stream_detach(struct http_stream *s, uint64_t *bytes)
{
    pthread_mutex_lock(&s->mu);
    s->sockfd = -1;
    /* Nothing more reaches this client (an error, or a reply that ended without the
     * writer finishing, as for HEAD). */
    bool changed = stream_set_state(s, HTTP_STREAM_GONE);
    if (s->started)
        *bytes = s->sent;
    pthread_mutex_unlock(&s->mu);
    if (changed)
        stream_fire(s);
    stream_unlist(s);
    stream_unref(s);
}

void http_stop_streams(struct http_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    size_t n = 0;
    struct http_stream **list = malloc((srv->n_streams + 1) * sizeof *list);
    for (struct http_stream *s = srv->streams; s && list; s = s->next) {
        atomic_fetch_add(&s->refs, 1);
        list[n++] = s;
    }
    pthread_mutex_unlock(&srv->mu);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&list[i]->mu);
        bool changed = stream_set_state(list[i], HTTP_STREAM_STOPPED);
        pthread_mutex_unlock(&list[i]->mu);
        if (changed)
            stream_fire(list[i]);
        stream_unref(list[i]);
    }
    free(list);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += srv->stop_grace_ms / 1000;
    until.tv_nsec += (long)(srv->stop_grace_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&srv->mu);
    while (srv->n_streams > 0)
        if (pthread_cond_timedwait(&srv->cond, &srv->mu, &until) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&srv->mu);
}

/* ---------- replies ---------- */

enum MHD_Result http_queue(struct http_request *req, int status, struct MHD_Response *resp,
                           const struct hdr *extra, uint64_t bytes)
{
    if (!resp)
        return MHD_NO;
    if (req->origin_ok)
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", req->origin_ok);
    if (req->srv->n_cors > 0)
        MHD_add_response_header(resp, "Vary", "Origin");
    for (const struct hdr *h = req->hdrs; h; h = h->next)
        MHD_add_response_header(resp, h->name, h->value);
    for (const struct hdr *h = extra; h; h = h->next)
        MHD_add_response_header(resp, h->name, h->value);
    enum MHD_Result r = MHD_queue_response(req->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    req->replied = true;
    req->status = status;
    req->bytes = bytes;
    return r;
}

/* Queues a malloc'd body (taken). */
static enum MHD_Result queue_body(struct http_request *req, int status, const char *ctype,
                                  char *body, size_t len, const struct hdr *extra)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    if (ctype)
        MHD_add_response_header(resp, "Content-Type", ctype);
    return http_queue(req, status, resp, extra, len);
}

enum MHD_Result http_queue_error(struct http_request *req, int status, const char *type,
                                 const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    char *text = NULL;
    if (req->route && req->route->errors) { /* the route's API answers in its own shape */
        char msg[1024];
        vsnprintf(msg, sizeof msg, fmt, ap);
        fix_utf8(msg);
        json_t *j = req->route->errors(status, msg, NULL);
        text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
    }
    if (!text)
        text = error_text(status, type, fmt, ap2);
    va_end(ap2);
    va_end(ap);
    if (!text)
        return MHD_NO;
    return queue_body(req, status, "application/json", text, strlen(text), NULL);
}

static int reply_check(struct http_request *req)
{
    if (req->replied || req->stream) {
        log_warn("http: %s %s: handler replied twice", req->method, req->path);
        return CAIRN_ESTATE;
    }
    return 0;
}

int http_reply_header(struct http_request *req, const char *name, const char *value)
{
    if (req->replied || req->stream)
        return CAIRN_ESTATE;
    return hdr_add(&req->hdrs, name, value);
}

int http_reply_bytes(struct http_request *req, int status, const char *content_type,
                     const void *data, size_t len)
{
    int rc = reply_check(req);
    if (rc)
        return rc;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return CAIRN_ENOMEM;
    if (len)
        memcpy(copy, data, len);
    return queue_body(req, status, content_type, copy, len, NULL) == MHD_YES ? 0 : CAIRN_EIO;
}

int http_reply_file(struct http_request *req, int status, const char *content_type, int fd,
                    uint64_t offset, uint64_t len)
{
    int rc = reply_check(req);
    if (rc || offset > (uint64_t)INT64_MAX - len) {
        close(fd);
        return rc ? rc : CAIRN_ERANGE;
    }
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
    if (!resp) {
        close(fd);
        return CAIRN_ENOMEM;
    }
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    return http_queue(req, status, resp, NULL, len) == MHD_YES ? 0 : CAIRN_EIO;
}

/* A file reply through a transform (http_reply_file_xform); owned by its response. */
struct xform_body {
    int fd;
    uint64_t offset, len;
    http_xform_fn fn;
    void *ctx;
    void (*ctx_free)(void *ctx);
};

static void xform_free(void *cls)
{
    struct xform_body *b = cls;
    close(b->fd);
    if (b->ctx_free)
        b->ctx_free(b->ctx);
    free(b);
}

static ssize_t xform_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct xform_body *b = cls;
    if (pos >= b->len)
        return MHD_CONTENT_READER_END_OF_STREAM;
    size_t want = b->len - pos < max ? (size_t)(b->len - pos) : max;
    ssize_t r;
    do
        r = pread(b->fd, buf, want, (off_t)(b->offset + pos));
    while (r < 0 && errno == EINTR);
    if (r <= 0) /* a read error, or the file shrank: the client sees a short reply */
        return MHD_CONTENT_READER_END_WITH_ERROR;
    b->fn(b->ctx, (uint8_t *)buf, (size_t)r, b->offset + pos);
    return r;
}

int http_reply_file_xform(struct http_request *req, int status, const char *content_type, int fd,
                          uint64_t offset, uint64_t len, http_xform_fn fn, void *ctx,
                          void (*ctx_free)(void *ctx))
{
    int rc = reply_check(req);
    struct xform_body *b = NULL;
    if (!rc && (!fn || offset > (uint64_t)INT64_MAX - len))
        rc = CAIRN_ERANGE;
    if (!rc && !(b = malloc(sizeof *b)))
        rc = CAIRN_ENOMEM;
    if (rc) {
        close(fd);
        if (ctx_free)
            ctx_free(ctx);
        return rc;
    }
    *b = (struct xform_body){.fd = fd, .offset = offset, .len = len, .fn = fn, .ctx = ctx, .ctx_free = ctx_free};
    struct MHD_Response *resp = MHD_create_response_from_callback(len, XFORM_BLOCK, xform_read, b, xform_free);
    if (!resp) {
        xform_free(b);
        return CAIRN_ENOMEM;
    }
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    return http_queue(req, status, resp, NULL, len) == MHD_YES ? 0 : CAIRN_EIO;
}

int http_reply_json(struct http_request *req, int status, json_t *body)
{
    int rc = reply_check(req);
    if (rc) {
        json_decref(body);
        return rc;
    }
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        http_queue_error(req, 500, "server_error", "reply could not be encoded as JSON");
        return CAIRN_EINVAL;
    }
    return queue_body(req, status, "application/json", text, strlen(text), NULL) == MHD_YES
               ? 0
               : CAIRN_EIO;
}

int http_reply_error(struct http_request *req, int status, const char *type, const char *fmt,
                     ...)
{
    int rc = reply_check(req);
    if (rc)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    char *text = error_text(status, type, fmt, ap);
    va_end(ap);
    if (!text)
        return CAIRN_ENOMEM;
    return queue_body(req, status, "application/json", text, strlen(text), NULL) == MHD_YES
               ? 0
               : CAIRN_EIO;
}

int http_reply_text(struct http_request *req, int status, const char *text)
{
    int rc = reply_check(req);
    if (rc)
        return rc;
    char *copy = strdup(text ? text : "");
    if (!copy)
        return CAIRN_ENOMEM;
    return queue_body(req, status, "text/plain; charset=utf-8", copy, strlen(copy), NULL) ==
                   MHD_YES
               ? 0
               : CAIRN_EIO;
}

int http_reply_defer(struct http_request *req, struct http_stream **out)
{
    int rc = reply_check(req);
    if (rc)
        return rc;
    rc = stream_new(req, out);
    if (rc)
        return rc;
    /* Headers added to the request so far go with whatever reply comes later. */
    (*out)->hdrs = req->hdrs;
    req->hdrs = NULL;
    return 0;
}

int http_reply_stream(struct http_request *req, int status, const char *content_type,
                      struct http_stream **out)
{
    int rc = http_reply_defer(req, out);
    if (rc)
        return rc;
    rc = http_stream_start(*out, status, content_type);
    if (rc) {
        http_stream_release(*out);
        *out = NULL;
    }
    return rc;
}

enum MHD_Result http_serve_stream(struct http_request *req)
{
    struct http_stream *s = req->stream;
    pthread_mutex_lock(&s->mu);
    while (!s->replied && !s->started && s->state == HTTP_STREAM_OPEN) {
        s->waiting = true;
        pthread_mutex_unlock(&s->mu);
        bool gone = wait_client(s->sockfd, s->efd, WAIT_SLICE_MS);
        pthread_mutex_lock(&s->mu);
        s->waiting = false;
        if (gone) {
            bool changed = stream_set_state(s, HTTP_STREAM_GONE);
            pthread_mutex_unlock(&s->mu);
            if (changed)
                stream_fire(s);
            return MHD_NO;
        }
    }
    struct hdr *extra = s->hdrs;
    s->hdrs = NULL;
    enum MHD_Result r;
    if (s->replied) {
        char *body = s->reply_body;
        size_t len = s->reply_len;
        int status = s->status;
        s->reply_body = NULL;
        pthread_mutex_unlock(&s->mu);
        r = queue_body(req, status, "application/json", body, len, extra);
    } else if (s->started) {
        int status = s->status;
        char *ctype = s->ctype;
        s->ctype = NULL;
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&s->refs, 1); /* the response's */
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_read_free);
        if (!resp) {
            stream_unref(s);
            r = MHD_NO;
        } else {
            MHD_add_response_header(resp, "Content-Type", ctype);
            MHD_add_response_header(resp, "Cache-Control", "no-cache");
            MHD_add_response_header(resp, "X-Accel-Buffering", "no");
            MHD_add_response_header(resp, "Connection", "close");
            r = http_queue(req, status, resp, extra, 0);
        }
        free(ctype);
    } else {
        enum http_stream_state st = s->state;
        pthread_mutex_unlock(&s->mu);
        if (st == HTTP_STREAM_STOPPED)
            r = http_queue_error(req, 503, "unavailable", "server is stopping");
        else if (st == HTTP_STREAM_GONE || st == HTTP_STREAM_TOO_SLOW)
            r = MHD_NO;
        else
            r = http_queue_error(req, 500, "server_error", "request ended without a reply");
    }
    http_hdr_free(extra);
    return r;
}
