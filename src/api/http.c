/* HTTP server on libmicrohttpd in thread-per-connection mode.
 *
 * Why one thread per connection: a handler may block (a non-streamed completion waits
 * for its tokens), and a stream's content reader may wait for the writer, without
 * holding up any other client. libmicrohttpd's pooled modes would need
 * suspend/resume for that, and stopping a daemon that still has a suspended connection
 * aborts the process; here a waiting connection simply sits in poll() on its socket
 * and an eventfd, which also tells us the moment its client hangs up. The cost is a
 * thread per open connection, capped by max_connections and reclaimed by the idle
 * timeout. */
#define _GNU_SOURCE
#include "api/http.h"

#include "api/hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#define MAX_PARAMS 16
#define MAX_SEGS 64
#define WAIT_SLICE_MS 1000 /* upper bound on one poll(), in case a wake-up is lost */

enum seg_kind { SEG_REST = 0, SEG_PARAM = 1, SEG_LIT = 2 }; /* value = specificity */

struct seg {
    enum seg_kind kind;
    char *text; /* literal text or parameter name */
};

struct route {
    char *method;
    char *pattern;
    struct seg *segs;
    int nseg;
    http_handler_fn fn;
    void *ctx;
    http_error_fn errors; /* the route's error shape, or NULL */
};

struct hdr {
    char *name, *value;
    struct hdr *next;
};

struct http_server {
    char *bind_addr, *api_key;
    char **cors;     /* allowed origins (owned) */
    size_t n_cors;
    bool cors_any;
    char **hosts;    /* Host names allowed besides IP literals, localhost and ours (owned) */
    size_t n_hosts;
    bool hosts_any;
    char own_host[256]; /* gethostname(), "" if unknown */
    unsigned max_connections, idle_timeout_s, keepalive_ms, stop_grace_ms;
    size_t max_body, stream_queue;
    int max_depth;
    bool access_log;

    int listen_fd; /* owned until the daemon takes it */
    uint16_t port;
    struct MHD_Daemon *daemon;
    struct route *routes;
    size_t n_routes, cap_routes;
    bool started, stopped;
    atomic_bool stopping;

    pthread_mutex_t mu; /* guards the stream list */
    pthread_cond_t cond;
    struct http_stream *streams; /* streams still attached to a connection */
    size_t n_streams;
};

struct http_request {
    struct http_server *srv;
    struct MHD_Connection *conn;
    int sockfd;
    int64_t t0;
    char *method, *path;
    char remote[INET6_ADDRSTRLEN];
    const char *origin_ok; /* Origin to echo in CORS headers, or NULL */
    const struct route *route;
    const char *param_name[MAX_PARAMS];
    char *param_val[MAX_PARAMS];
    int n_params;
    char *body;
    size_t body_len, body_cap;
    json_t *json;
    struct hdr *hdrs; /* extra headers for the next reply */
    bool replied;
    int status;
    uint64_t bytes;
    struct http_stream *stream; /* one reference, dropped when the request completes */
};

struct http_stream {
    struct http_server *srv;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int efd;    /* wakes the connection thread waiting in poll() */
    int sockfd; /* the connection's socket; -1 once the request completed */
    enum http_stream_state state;
    bool waiting; /* the connection thread sits in poll() */

    bool started, replied;
    int status;
    char *ctype;
    struct hdr *hdrs;
    char *reply_body; /* a deferred full reply */
    size_t reply_len;

    char *q; /* unsent bytes are q[q_off, q_len) */
    size_t q_off, q_len, q_cap, q_max;
    char *ka;
    size_t ka_len;
    unsigned ka_ms;
    uint64_t sent;

    http_stream_close_fn cb;
    void *cb_arg;
    bool cb_done, cb_running, cb_pending;
    pthread_t cb_thread;

    struct http_stream *prev, *next; /* server list */
    bool listed;
};

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

/* Copy of s for a log line: control bytes become '?', at most max bytes. */
static void log_clean(char *dst, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++)
        dst[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    dst[i] = 0;
}

static bool ct_equal(const char *given, const char *key)
{
    size_t gl = strlen(given), kl = strlen(key);
    unsigned diff = (unsigned)(gl != kl);
    /* The loop runs over the key's length whatever was given. */
    for (size_t i = 0; i < kl; i++) {
        unsigned char g = i < gl ? (unsigned char)given[i] : 0;
        diff |= (unsigned)(g ^ (unsigned char)key[i]);
    }
    return diff == 0;
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

static void hdr_free(struct hdr *h)
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

int http_json_depth(const char *text, size_t len, int limit)
{
    int depth = 0, max = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) {
                max = depth;
                if (max > limit)
                    return limit + 1;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return max;
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
    hdr_free(s->hdrs);
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

/* ---------- replies ---------- */

static enum MHD_Result queue(struct http_request *req, int status, struct MHD_Response *resp,
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
    return queue(req, status, resp, extra, len);
}

static enum MHD_Result queue_error(struct http_request *req, int status, const char *type,
                                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result queue_error(struct http_request *req, int status, const char *type,
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
    return queue(req, status, resp, NULL, len) == MHD_YES ? 0 : CAIRN_EIO;
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
        queue_error(req, 500, "server_error", "reply could not be encoded as JSON");
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

/* After the handler deferred or started a stream: waits (on the connection's thread)
 * until it has something to send, then queues the response. */
static enum MHD_Result serve_stream(struct http_request *req)
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
            r = queue(req, status, resp, extra, 0);
        }
        free(ctype);
    } else {
        enum http_stream_state st = s->state;
        pthread_mutex_unlock(&s->mu);
        if (st == HTTP_STREAM_STOPPED)
            r = queue_error(req, 503, "unavailable", "server is stopping");
        else if (st == HTTP_STREAM_GONE || st == HTTP_STREAM_TOO_SLOW)
            r = MHD_NO;
        else
            r = queue_error(req, 500, "server_error", "request ended without a reply");
    }
    hdr_free(extra);
    return r;
}

/* ---------- routing ---------- */

struct path_segs {
    const char *path;
    size_t off[MAX_SEGS], len[MAX_SEGS];
    int n;       /* segments recorded */
    bool excess; /* more than MAX_SEGS */
};

static bool split_path(const char *path, struct path_segs *ps)
{
    ps->path = path;
    ps->n = 0;
    ps->excess = false;
    if (path[0] != '/')
        return false;
    size_t i = 1;
    for (;;) {
        if (ps->n == MAX_SEGS) {
            ps->excess = true;
            return true;
        }
        size_t j = i;
        while (path[j] && path[j] != '/')
            j++;
        ps->off[ps->n] = i;
        ps->len[ps->n] = j - i;
        ps->n++;
        if (!path[j])
            return true;
        i = j + 1;
    }
}

static bool route_matches(const struct route *r, const struct path_segs *ps)
{
    for (int i = 0; i < r->nseg; i++) {
        const struct seg *g = &r->segs[i];
        if (g->kind == SEG_REST)
            return true;
        if (i >= ps->n)
            return false;
        const char *p = ps->path + ps->off[i];
        size_t n = ps->len[i];
        if (g->kind == SEG_LIT && (strlen(g->text) != n || memcmp(g->text, p, n) != 0))
            return false;
        if (g->kind == SEG_PARAM && n == 0)
            return false;
    }
    return r->nseg == ps->n && !ps->excess;
}

/* Positive when a is more specific than b. */
static int route_cmp(const struct route *a, const struct route *b)
{
    for (int i = 0; i < a->nseg && i < b->nseg; i++)
        if (a->segs[i].kind != b->segs[i].kind)
            return (int)a->segs[i].kind - (int)b->segs[i].kind;
    return 0;
}

static bool method_is(const char *route_method, const char *method)
{
    if (strcmp(route_method, method) == 0)
        return true;
    return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

/* Best route for the method, or NULL; *path_known tells whether any method matched. */
static const struct route *find_route(const struct http_server *srv, const char *method,
                                      const struct path_segs *ps, bool *path_known)
{
    const struct route *best = NULL;
    *path_known = false;
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct route *r = &srv->routes[i];
        if (!route_matches(r, ps))
            continue;
        *path_known = true;
        if (method && method_is(r->method, method) && (!best || route_cmp(r, best) > 0))
            best = r;
    }
    return best;
}

/* "GET, POST, OPTIONS" for the routes matching the path. */
static void allowed_methods(const struct http_server *srv, const struct path_segs *ps,
                            char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct route *r = &srv->routes[i];
        if (!route_matches(r, ps))
            continue;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++)
            seen = strcmp(srv->routes[k].method, r->method) == 0 &&
                   route_matches(&srv->routes[k], ps);
        if (!seen && len + strlen(r->method) + 3 < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s, ", r->method);
    }
    snprintf(buf + len, cap - len, "OPTIONS");
}

static int set_params(struct http_request *req, const struct route *r,
                      const struct path_segs *ps)
{
    for (int i = 0; i < r->nseg; i++) {
        const struct seg *g = &r->segs[i];
        if (g->kind == SEG_LIT)
            continue;
        char *v;
        if (g->kind == SEG_REST)
            v = strdup(i < ps->n ? ps->path + ps->off[i] : "");
        else
            v = strndup(ps->path + ps->off[i], ps->len[i]);
        if (!v)
            return CAIRN_ENOMEM;
        req->param_name[req->n_params] = g->text;
        req->param_val[req->n_params++] = v;
    }
    return 0;
}

static void route_free(struct route *r)
{
    for (int i = 0; i < r->nseg; i++)
        free(r->segs[i].text);
    free(r->segs);
    free(r->method);
    free(r->pattern);
}

static bool same_shape(const struct route *a, const struct route *b)
{
    if (a->nseg != b->nseg || strcmp(a->method, b->method) != 0)
        return false;
    for (int i = 0; i < a->nseg; i++) {
        if (a->segs[i].kind != b->segs[i].kind)
            return false;
        if (a->segs[i].kind == SEG_LIT && strcmp(a->segs[i].text, b->segs[i].text) != 0)
            return false;
    }
    return true;
}

int http_route(struct http_server *srv, const char *method, const char *pattern,
               http_handler_fn fn, void *ctx)
{
    return http_route_errors(srv, method, pattern, fn, ctx, NULL);
}

int http_route_errors(struct http_server *srv, const char *method, const char *pattern,
                      http_handler_fn fn, void *ctx, http_error_fn errors)
{
    if (!srv || !method || !pattern || !fn || pattern[0] != '/' || !method[0])
        return CAIRN_EINVAL;
    if (srv->started)
        return CAIRN_ESTATE;
    for (const char *m = method; *m; m++)
        if (*m < 'A' || *m > 'Z')
            return CAIRN_EINVAL;
    if (strcmp(method, "OPTIONS") == 0 || strcmp(method, "HEAD") == 0)
        return CAIRN_EINVAL; /* answered by the server itself */
    struct path_segs ps;
    if (!split_path(pattern, &ps) || ps.excess)
        return CAIRN_EINVAL;
    struct route r = {0};
    r.segs = calloc((size_t)ps.n, sizeof *r.segs);
    r.method = strdup(method);
    r.pattern = strdup(pattern);
    r.fn = fn;
    r.ctx = ctx;
    r.errors = errors;
    if (!r.segs || !r.method || !r.pattern) {
        route_free(&r);
        return CAIRN_ENOMEM;
    }
    int n_params = 0, rc = 0;
    for (int i = 0; i < ps.n && rc == 0; i++) {
        const char *p = pattern + ps.off[i];
        size_t n = ps.len[i];
        struct seg *g = &r.segs[r.nseg];
        if (n > 0 && (p[0] == ':' || p[0] == '*')) {
            g->kind = p[0] == ':' ? SEG_PARAM : SEG_REST;
            if (n == 1 || (g->kind == SEG_REST && i != ps.n - 1) || ++n_params > MAX_PARAMS)
                rc = CAIRN_EINVAL;
            g->text = strndup(p + 1, n - 1);
        } else {
            g->kind = SEG_LIT;
            g->text = strndup(p, n);
        }
        r.nseg++;
        if (!g->text && rc == 0)
            rc = CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < srv->n_routes && rc == 0; i++)
        if (same_shape(&srv->routes[i], &r))
            rc = CAIRN_EINVAL;
    if (rc == 0 && srv->n_routes == srv->cap_routes) {
        size_t cap = srv->cap_routes ? srv->cap_routes * 2 : 16;
        struct route *rs = realloc(srv->routes, cap * sizeof *rs);
        if (!rs)
            rc = CAIRN_ENOMEM;
        else {
            srv->routes = rs;
            srv->cap_routes = cap;
        }
    }
    if (rc) {
        route_free(&r);
        return rc;
    }
    srv->routes[srv->n_routes++] = r;
    return 0;
}

/* ---------- request handling ---------- */

const char *http_req_method(const struct http_request *req) { return req->method; }
const char *http_req_path(const struct http_request *req) { return req->path; }
const char *http_req_remote(const struct http_request *req) { return req->remote; }
json_t *http_req_json(const struct http_request *req) { return req->json; }

const char *http_req_param(const struct http_request *req, const char *name)
{
    for (int i = 0; i < req->n_params; i++)
        if (strcmp(req->param_name[i], name) == 0)
            return req->param_val[i];
    return NULL;
}

const char *http_req_query(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *http_req_header(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *http_req_body(const struct http_request *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

bool http_req_client_gone(const struct http_request *req)
{
    struct pollfd p = {.fd = req->sockfd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void request_free(struct http_request *req)
{
    for (int i = 0; i < req->n_params; i++)
        free(req->param_val[i]);
    free(req->method);
    free(req->path);
    free(req->body);
    json_decref(req->json);
    hdr_free(req->hdrs);
    free(req);
}

/* Copies a NULL-terminated list of strings (a "*" among them sets *any). */
static int copy_list(const char *const *src, char ***dst, size_t *n, bool *any)
{
    for (const char *const *o = src; o && *o; o++) {
        char **c = realloc(*dst, (*n + 1) * sizeof *c);
        if (!c)
            return CAIRN_ENOMEM;
        *dst = c;
        if (!((*dst)[*n] = strdup(*o)))
            return CAIRN_ENOMEM;
        if (strcmp(*o, "*") == 0)
            *any = true;
        (*n)++;
    }
    return 0;
}

static const char *origin_allowed(const struct http_server *srv, const char *origin)
{
    if (!origin)
        return NULL;
    if (srv->cors_any)
        return origin;
    for (size_t i = 0; i < srv->n_cors; i++)
        if (strcmp(srv->cors[i], origin) == 0)
            return origin;
    return NULL;
}

static bool header_token_list(const char *s)
{
    if (!s || !*s || strlen(s) > 512)
        return false;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') ||
              ('0' <= *s && *s <= '9') || *s == '-' || *s == '_' || *s == ',' || *s == ' '))
            return false;
    return true;
}

static enum MHD_Result handle_options(struct http_request *req, const struct path_segs *ps,
                                      bool path_ok)
{
    struct http_server *srv = req->srv;
    const char *origin = http_req_header(req, "Origin");
    const char *acrm = http_req_header(req, "Access-Control-Request-Method");
    bool known = false;
    if (path_ok)
        find_route(srv, NULL, ps, &known);
    if (origin && acrm && !req->origin_ok)
        return queue_error(req, 403, "forbidden", "origin not allowed");
    if (!known)
        return queue_error(req, 404, "not_found", "no route for this path");
    char methods[256];
    allowed_methods(srv, ps, methods, sizeof methods);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Allow", methods);
    if (origin && acrm) {
        const char *acrh = http_req_header(req, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                header_token_list(acrh) ? acrh
                                                        : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    return queue(req, 204, resp, NULL, 0);
}

static bool authorized(struct http_request *req)
{
    const char *key = req->srv->api_key;
    if (!key)
        return true;
    const char *auth = http_req_header(req, "Authorization");
    const char *token = NULL;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        token = auth + 7;
        while (*token == ' ')
            token++;
    } else {
        token = http_req_header(req, "x-api-key");
    }
    return token && ct_equal(token, key);
}

static bool json_content_type(const char *ct);

/* A browser's request with a body that is not declared JSON: what a web page can send
 * to any address without a CORS preflight (a form, text/plain), so a page the user visits
 * could drive the API. Browsers always send Origin (and Sec-Fetch-Site) with such a
 * request; curl and the SDKs send neither, so `curl -d` keeps working. */
static bool browser_non_json_body(struct http_request *req)
{
    const char *m = req->method;
    if (strcmp(m, "POST") && strcmp(m, "PUT") && strcmp(m, "PATCH") && strcmp(m, "DELETE"))
        return false;
    if (!http_req_header(req, "Origin") && !http_req_header(req, "Sec-Fetch-Site"))
        return false;
    const char *cl = http_req_header(req, "Content-Length");
    bool body = (cl && strspn(cl, "0") != strlen(cl)) || http_req_header(req, "Transfer-Encoding");
    return body && !json_content_type(http_req_header(req, "Content-Type"));
}

/* First call, headers only: everything that can be refused before the body is read. */
static enum MHD_Result request_begin(struct http_request *req)
{
    struct http_server *srv = req->srv;
    if (atomic_load(&srv->stopping)) {
        http_reply_header(req, "Connection", "close");
        return queue_error(req, 503, "unavailable", "server is stopping");
    }
    const char *host = http_req_header(req, "Host");
    if (!srv->hosts_any && !http_host_allowed(host, srv->own_host, (const char *const *)srv->hosts, srv->n_hosts)) {
        char shown[128];
        log_clean(shown, sizeof shown, host);
        http_reply_header(req, "Connection", "close");
        return queue_error(req, 403, "forbidden",
                           "Host %s is not this server's address (a web page may be trying to reach it); "
                           "start the node with --allowed-host NAME to allow a name",
                           shown);
    }
    req->origin_ok = origin_allowed(srv, http_req_header(req, "Origin"));
    struct path_segs ps;
    bool path_ok = split_path(req->path, &ps);
    if (strcmp(req->method, "OPTIONS") == 0)
        return handle_options(req, &ps, path_ok);
    if (!authorized(req)) {
        http_reply_header(req, "WWW-Authenticate", "Bearer");
        return queue_error(req, 401, "authentication_error", "missing or invalid API key");
    }
    bool known = false;
    const struct route *r = path_ok ? find_route(srv, req->method, &ps, &known) : NULL;
    if (!r && known) {
        char methods[256];
        allowed_methods(srv, &ps, methods, sizeof methods);
        http_reply_header(req, "Allow", methods);
        return queue_error(req, 405, "method_not_allowed", "%s is not allowed on %s",
                           req->method, req->path);
    }
    if (!r)
        return queue_error(req, 404, "not_found", "no route for %s %.200s", req->method,
                           req->path);
    if (set_params(req, r, &ps))
        return MHD_NO;
    req->route = r;
    if (browser_non_json_body(req)) {
        char shown[128];
        const char *ct = http_req_header(req, "Content-Type");
        log_clean(shown, sizeof shown, ct ? ct : "(none)");
        http_reply_header(req, "Connection", "close"); /* the body is not read */
        return queue_error(req, 415, "invalid_request_error",
                           "a request from a web page must send Content-Type: application/json (got %s)", shown);
    }
    const char *cl = http_req_header(req, "Content-Length");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || end == cl || n > srv->max_body) {
            http_reply_header(req, "Connection", "close");
            return queue_error(req, 413, "invalid_request_error",
                               "request body over the limit of %zu bytes", srv->max_body);
        }
    }
    return MHD_YES;
}

static int append_body(struct http_request *req, const char *data, size_t n)
{
    size_t max = req->srv->max_body;
    if (n > max || req->body_len > max - n)
        return CAIRN_EFULL;
    if (req->body_cap - req->body_len <= n) {
        size_t cap = req->body_cap ? req->body_cap : 1024;
        while (cap - req->body_len <= n)
            cap *= 2;
        if (cap > max + 1)
            cap = max + 1;
        char *b = realloc(req->body, cap);
        if (!b)
            return CAIRN_ENOMEM;
        req->body = b;
        req->body_cap = cap;
    }
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = 0;
    return 0;
}

static bool json_content_type(const char *ct)
{
    if (!ct)
        return false;
    size_t n = strcspn(ct, ";");
    if (n >= 16 && strncasecmp(ct, "application/json", 16) == 0)
        return true;
    for (size_t i = 0; i + 5 <= n; i++)
        if (strncasecmp(ct + i, "+json", 5) == 0)
            return true;
    return false;
}

/* Parses the body as JSON where it is JSON; false when a 400 was queued. */
static bool prepare_json(struct http_request *req, enum MHD_Result *r)
{
    struct http_server *srv = req->srv;
    if (req->body_len == 0)
        return true;
    bool declared = json_content_type(http_req_header(req, "Content-Type"));
    size_t i = strspn(req->body, " \t\r\n");
    bool looks = req->body[i] == '{' || req->body[i] == '[';
    if (!declared && !looks)
        return true;
    if (http_json_depth(req->body, req->body_len, srv->max_depth) > srv->max_depth) {
        *r = queue_error(req, 400, "invalid_request_error",
                         "JSON nested deeper than the limit of %d levels", srv->max_depth);
        return false;
    }
    json_error_t e;
    req->json = json_loadb(req->body, req->body_len, 0, &e);
    if (!req->json && declared) {
        *r = queue_error(req, 400, "invalid_request_error", "malformed JSON: %s (line %d, column %d)",
                         e.text, e.line, e.column);
        return false;
    }
    return true;
}

static enum MHD_Result request_finish(struct http_request *req)
{
    struct http_server *srv = req->srv;
    enum MHD_Result r = MHD_YES;
    if (!prepare_json(req, &r))
        return r;
    /* The handler and a deferred reply may take longer than the idle timeout; the
     * timeout is restored (and its clock restarted) once the reply is queued. */
    MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    req->route->fn(req, req->route->ctx);
    if (req->stream) {
        r = serve_stream(req);
        if (r == MHD_NO || req->stream->started)
            return r; /* a stream closes its connection when it ends */
    } else if (!req->replied) {
        log_warn("http: %s %s: handler made no reply", req->method, req->path);
        r = queue_error(req, 500, "server_error", "handler made no reply");
    }
    MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT, srv->idle_timeout_s);
    return r;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_size, void **req_cls)
{
    struct http_server *srv = cls;
    struct http_request *req = *req_cls;
    (void)version;
    if (!req) {
        req = calloc(1, sizeof *req);
        if (!req)
            return MHD_NO;
        req->srv = srv;
        req->conn = conn;
        req->t0 = clock_ns();
        req->method = strdup(method);
        req->path = strdup(url);
        req->sockfd = -1;
        *req_cls = req;
        if (!req->method || !req->path)
            return MHD_NO;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            req->sockfd = ci->connect_fd;
        ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            const struct sockaddr *sa = ci->client_addr;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, req->remote,
                          sizeof req->remote);
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr,
                          req->remote, sizeof req->remote);
        }
        return request_begin(req);
    }
    if (req->replied) { /* refused before the body: discard what still arrives */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        int rc = append_body(req, upload_data, *upload_size);
        if (rc) {
            /* A body without Content-Length went over the limit; libmicrohttpd cannot
             * answer in the middle of a body, so the connection is dropped. */
            log_warn("http: %s %s from %s: body over %zu bytes, connection closed",
                     req->method, req->path, req->remote, srv->max_body);
            return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return request_finish(req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct http_request *req = *req_cls;
    (void)conn;
    if (!req)
        return;
    *req_cls = NULL;
    uint64_t bytes = req->bytes;
    struct http_stream *s = req->stream;
    if (s) {
        pthread_mutex_lock(&s->mu);
        s->sockfd = -1;
        /* Nothing more reaches this client (an error, or a reply that ended without the
         * writer finishing, as for HEAD). */
        bool changed = stream_set_state(s, HTTP_STREAM_GONE);
        if (s->started)
            bytes = s->sent;
        pthread_mutex_unlock(&s->mu);
        if (changed)
            stream_fire(s);
        stream_unlist(s);
        stream_unref(s);
    }
    if (srv->access_log) {
        static const char *why[] = {"", " (error)", " (timeout)", " (stopping)",
                                    " (read error)", " (client gone)"};
        char path[256];
        log_clean(path, sizeof path, req->path);
        log_info("http %s \"%s %s\" %d %llu B %.1f ms%s", req->remote, req->method, path,
                 req->replied ? req->status : 0, (unsigned long long)bytes,
                 (double)(clock_ns() - req->t0) * 1e-6,
                 (unsigned)toe < sizeof why / sizeof *why ? why[toe] : " (aborted)");
    }
    request_free(req);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    log_debug("http: libmicrohttpd: %s", line);
}

/* ---------- server ---------- */

int http_server_create(struct http_server **out, const struct http_config *cfg, char *err,
                       size_t errlen)
{
    *out = NULL;
    struct http_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    srv->listen_fd = -1;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cond, NULL);
    atomic_init(&srv->stopping, false);
    srv->bind_addr = strdup(cfg->bind_addr ? cfg->bind_addr : "127.0.0.1");
    srv->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    srv->max_connections = cfg->max_connections ? cfg->max_connections : 256;
    srv->max_body = cfg->max_body_bytes ? cfg->max_body_bytes : (size_t)16 << 20;
    srv->max_depth = cfg->max_json_depth > 0 ? cfg->max_json_depth : 64;
    srv->idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 30;
    srv->stream_queue = cfg->stream_queue_bytes ? cfg->stream_queue_bytes : (size_t)1 << 20;
    srv->keepalive_ms = cfg->keepalive_ms ? cfg->keepalive_ms : 15000;
    srv->stop_grace_ms = cfg->stop_grace_ms ? cfg->stop_grace_ms : 2000;
    srv->access_log = cfg->access_log;
    int rc = CAIRN_ENOMEM;
    if (!srv->bind_addr || (cfg->api_key && cfg->api_key[0] && !srv->api_key))
        goto err;
    if (srv->max_body > ((size_t)1 << 40)) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "max_body_bytes too large");
        goto fail;
    }
    if (copy_list(cfg->cors_origins, &srv->cors, &srv->n_cors, &srv->cors_any) ||
        copy_list(cfg->allowed_hosts, &srv->hosts, &srv->n_hosts, &srv->hosts_any))
        goto err;
    if (gethostname(srv->own_host, sizeof srv->own_host))
        srv->own_host[0] = 0;
    srv->own_host[sizeof srv->own_host - 1] = 0;

    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } addr = {0};
    socklen_t alen;
    if (inet_pton(AF_INET, srv->bind_addr, &addr.in.sin_addr) == 1) {
        addr.in.sin_family = AF_INET;
        addr.in.sin_port = htons(cfg->port);
        alen = sizeof addr.in;
    } else if (inet_pton(AF_INET6, srv->bind_addr, &addr.in6.sin6_addr) == 1) {
        addr.in6.sin6_family = AF_INET6;
        addr.in6.sin6_port = htons(cfg->port);
        alen = sizeof addr.in6;
    } else {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "bind address %s is not a numeric address",
                        srv->bind_addr);
        goto fail;
    }
    srv->listen_fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->listen_fd < 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "socket: %s", strerror(errno));
        goto fail;
    }
    int one = 1;
    setsockopt(srv->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(srv->listen_fd, &addr.sa, alen) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "bind %s:%u: %s", srv->bind_addr,
                        (unsigned)cfg->port, strerror(errno));
        goto fail;
    }
    if (listen(srv->listen_fd, 256) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "listen: %s", strerror(errno));
        goto fail;
    }
    alen = sizeof addr;
    if (getsockname(srv->listen_fd, &addr.sa, &alen) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "getsockname: %s", strerror(errno));
        goto fail;
    }
    srv->port = ntohs(addr.sa.sa_family == AF_INET ? addr.in.sin_port : addr.in6.sin6_port);
    *out = srv;
    return 0;
err:
    rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
fail:
    http_server_release(srv);
    return rc;
}

uint16_t http_server_port(const struct http_server *srv) { return srv->port; }

int http_server_start(struct http_server *srv, char *err, size_t errlen)
{
    if (srv->started || srv->stopped)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "server already started");
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    srv->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
        MHD_OPTION_LISTEN_SOCKET, srv->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
        srv->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, srv->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, srv, MHD_OPTION_END);
    if (!srv->daemon)
        return cairn_fail(err, errlen, CAIRN_EIO, "libmicrohttpd did not start on %s:%u",
                          srv->bind_addr, (unsigned)srv->port);
    srv->listen_fd = -1; /* the daemon closes it */
    srv->started = true;
    return 0;
}

void http_server_stop(struct http_server *srv)
{
    if (!srv || srv->stopped)
        return;
    srv->stopped = true;
    if (!srv->started)
        return;
    atomic_store(&srv->stopping, true);
    /* Close every attached stream as STOPPED: writers see it and stop, readers flush
     * what is queued and end the reply. */
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
    /* Shuts every socket down (a stream still flushing ends with an error) and joins
     * the connection threads. */
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
}

void http_server_release(struct http_server *srv)
{
    if (!srv)
        return;
    http_server_stop(srv);
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    for (size_t i = 0; i < srv->n_routes; i++)
        route_free(&srv->routes[i]);
    free(srv->routes);
    for (size_t i = 0; i < srv->n_cors; i++)
        free(srv->cors[i]);
    free(srv->cors);
    for (size_t i = 0; i < srv->n_hosts; i++)
        free(srv->hosts[i]);
    free(srv->hosts);
    free(srv->bind_addr);
    free(srv->api_key);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cond);
    free(srv);
}
