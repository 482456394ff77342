/* HTTP server tests over real sockets on 127.0.0.1, with a small client (rawhttp.h):
 * routing, limits, JSON, auth, CORS, SSE streams, disconnects, garbage, concurrency,
 * stop. Every wait is bounded (socket timeouts, deadlines). */
#define _GNU_SOURCE
#include "api/hosts.h"
#include "api/http.h"
#include "api/sse.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "rawhttp.h"
#include "testutil.h"

/* ---------- the client (rawhttp.h) ---------- */

static int raw_request(uint16_t port, const void *req, size_t len, struct rh_resp *r)
{
    return rh_raw(port, req, len, r, RH_IO_TIMEOUT_S);
}

/* One request with Connection: close; extra is "Name: value\r\n" lines or NULL. */
static int request(uint16_t port, const char *method, const char *path, const char *extra,
                   const char *body, struct rh_resp *r)
{
    size_t blen = body ? strlen(body) : 0;
    char *req = malloc(blen + 4096);
    int n = snprintf(req, 4096,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", blen);
    if (blen)
        memcpy(req + n, body, blen);
    int rc = raw_request(port, req, (size_t)n + blen, r);
    free(req);
    return rc;
}

static const char *err_field(json_t *j, const char *key)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), key));
}

/* ---------- handlers ---------- */

/* Shared state of the asynchronous handlers; one test uses it at a time. */
struct bg {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct http_stream *s;
    pthread_t th;
    bool have_th, done;
    int mode;
    int rc, writes, cb_calls;
    enum http_stream_state st, cb_why;
    int64_t t_end;
};

static void bg_reset(struct bg *b)
{
    pthread_mutex_lock(&b->mu);
    b->s = NULL;
    b->have_th = b->done = false;
    b->rc = b->writes = b->cb_calls = 0;
    b->st = b->cb_why = HTTP_STREAM_OPEN;
    b->t_end = 0;
    pthread_mutex_unlock(&b->mu);
}

/* Waits up to ms for the writer thread to finish, then joins it. */
static bool bg_join(struct bg *b, int ms)
{
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    pthread_mutex_lock(&b->mu);
    while (!b->done && clock_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cond, &b->mu, &ts);
    }
    bool done = b->done, have = b->have_th;
    pthread_mutex_unlock(&b->mu);
    if (have && done)
        pthread_join(b->th, NULL);
    return done;
}

/* Waits up to ms for a handler to hand over its stream. */
static bool bg_wait_stream(struct bg *b, int ms)
{
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    bool have = false;
    while (!have && clock_ns() < until) {
        pthread_mutex_lock(&b->mu);
        have = b->s != NULL;
        pthread_mutex_unlock(&b->mu);
        if (!have)
            usleep(2000);
    }
    return have;
}

static void bg_finish(struct bg *b, int rc, enum http_stream_state st)
{
    pthread_mutex_lock(&b->mu);
    b->rc = rc;
    b->st = st;
    b->t_end = clock_ns();
    b->done = true;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->mu);
}

static void on_close_cb(void *arg, struct http_stream *s, enum http_stream_state why)
{
    struct bg *b = arg;
    (void)s;
    pthread_mutex_lock(&b->mu);
    b->cb_calls++;
    b->cb_why = why;
    pthread_mutex_unlock(&b->mu);
}

enum {
    BG_SSE100, BG_TICK, BG_IDLE, BG_DEFER_OK, BG_DEFER_WAIT, BG_FLOOD, BG_NDJSON, BG_SSE_LATE,
    BG_LATE_CB
};

static void *bg_main(void *arg)
{
    struct bg *b = arg;
    struct http_stream *s = b->s;
    int rc = 0, writes = 0;
    switch (b->mode) {
    case BG_SSE100:
        for (int i = 0; i < 100 && rc == 0; i++) {
            char data[32];
            snprintf(data, sizeof data, "%d", i);
            rc = sse_event(s, i % 2 ? "odd" : NULL, data);
            writes += rc == 0;
            if (i % 10 == 0)
                usleep(1000);
        }
        if (rc == 0)
            rc = sse_done(s);
        http_stream_finish(s);
        break;
    case BG_TICK: /* an event every 10 ms until the stream closes (at most 10 s) */
        for (int i = 0; i < 1000 && rc == 0; i++) {
            rc = http_stream_printf(s, "data: tick %d\n\n", i);
            writes += rc == 0;
            if (rc == 0 && http_stream_wait_closed(s, 10))
                break;
        }
        break;
    case BG_IDLE:
        http_stream_wait_closed(s, 5000);
        break;
    case BG_LATE_CB: /* registered after the close: runs at once, on this thread */
        http_stream_wait_closed(s, 5000);
        http_stream_on_close(s, on_close_cb, b);
        pthread_mutex_lock(&b->mu);
        rc = b->cb_calls == 1 ? 0 : -1;
        pthread_mutex_unlock(&b->mu);
        break;
    case BG_DEFER_OK:
        usleep(100 * 1000);
        http_stream_header(s, "X-Late", "yes");
        rc = http_stream_reply_json(s, 202, json_pack("{s:s}", "late", "reply"));
        break;
    case BG_DEFER_WAIT:
        http_stream_wait_closed(s, 5000);
        break;
    case BG_FLOOD: { /* writes never block; a client that does not read gets cut off */
        char chunk[1024];
        memset(chunk, 'x', sizeof chunk);
        chunk[sizeof chunk - 2] = chunk[sizeof chunk - 1] = '\n';
        for (int i = 0; i < 256 * 1024 && rc == 0; i++) {
            rc = http_stream_write(s, chunk, sizeof chunk);
            writes += rc == 0;
            if (i % 64 == 0)
                usleep(100);
        }
        break;
    }
    case BG_NDJSON:
        for (int i = 0; i < 20 && rc == 0; i++) {
            json_t *j = json_pack("{s:i,s:s}", "n", i, "text", "line\nbreak");
            rc = http_stream_json_line(s, j);
            json_decref(j);
            writes += rc == 0;
        }
        http_stream_finish(s);
        break;
    case BG_SSE_LATE: /* nothing for 350 ms (keepalive comments go out), then one event */
        usleep(350 * 1000);
        rc = sse_event(s, NULL, "late");
        http_stream_finish(s);
        break;
    }
    enum http_stream_state st = http_stream_state(s);
    pthread_mutex_lock(&b->mu);
    b->writes = writes;
    pthread_mutex_unlock(&b->mu);
    http_stream_release(s);
    bg_finish(b, rc, st);
    return NULL;
}

static void start_bg(struct bg *b, struct http_stream *s, int mode)
{
    pthread_mutex_lock(&b->mu);
    b->s = s;
    b->mode = mode;
    if (mode != BG_LATE_CB)
        http_stream_on_close(s, on_close_cb, b);
    b->have_th = pthread_create(&b->th, NULL, bg_main, b) == 0;
    pthread_mutex_unlock(&b->mu);
}

static void h_hello(struct http_request *req, void *ctx)
{
    (void)ctx;
    http_reply_text(req, 200, "hello");
}

static void h_params(struct http_request *req, void *ctx)
{
    json_t *j = json_object();
    json_object_set_new(j, "route", json_string(ctx));
    const char *names[] = {"id", "rest", "x", "y"};
    for (size_t i = 0; i < 4; i++) {
        const char *v = http_req_param(req, names[i]);
        if (v)
            json_object_set_new(j, names[i], json_string(v));
    }
    json_object_set_new(j, "method", json_string(http_req_method(req)));
    json_object_set_new(j, "path", json_string(http_req_path(req)));
    http_reply_json(req, 200, j);
}

static void h_echo(struct http_request *req, void *ctx)
{
    (void)ctx;
    json_t *j = http_req_json(req);
    if (j) {
        http_reply_json(req, 200, json_incref(j));
        return;
    }
    size_t n;
    const char *body = http_req_body(req, &n);
    http_reply_json(req, 200, json_pack("{s:s%,s:b}", "raw", body, n, "json", 0));
}

static void h_query(struct http_request *req, void *ctx)
{
    (void)ctx;
    const char *q = http_req_query(req, "q"), *h = http_req_header(req, "x-test");
    http_reply_header(req, "X-Reply", "1");
    http_reply_json(req, 200, json_pack("{s:s?,s:s?,s:s?,s:s}", "q", q, "h", h, "missing",
                                        http_req_query(req, "nope"), "remote",
                                        http_req_remote(req)));
}

static void h_sleep(struct http_request *req, void *ctx)
{
    (void)ctx;
    usleep(200 * 1000);
    http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

static void h_noreply(struct http_request *req, void *ctx)
{
    (void)req;
    (void)ctx;
}

static void h_twice(struct http_request *req, void *ctx)
{
    struct bg *b = ctx;
    http_reply_text(req, 200, "first");
    int rc = http_reply_text(req, 500, "second");
    pthread_mutex_lock(&b->mu);
    b->rc = rc;
    pthread_mutex_unlock(&b->mu);
}

static void h_big(struct http_request *req, void *ctx)
{
    (void)ctx;
    size_t n = 3u << 20;
    char *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)('a' + i % 26);
    http_reply_bytes(req, 200, "application/octet-stream", p, n);
    free(p);
}

static void h_stream(struct http_request *req, void *ctx, int mode)
{
    struct bg *b = ctx;
    struct http_stream *s = NULL;
    int rc;
    if (mode == BG_DEFER_OK || mode == BG_DEFER_WAIT)
        rc = http_reply_defer(req, &s);
    else if (mode == BG_NDJSON || mode == BG_FLOOD)
        rc = http_reply_stream(req, 200, "application/x-ndjson", &s);
    else
        rc = sse_start(req, &s);
    if (rc == 0)
        start_bg(b, s, mode);
}

static void h_sse100(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_SSE100); }
static void h_tick(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_TICK); }
static void h_idle(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_IDLE); }
static void h_late_cb(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_LATE_CB); }
static void h_defer_ok(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_DEFER_OK); }
static void h_defer_wait(struct http_request *req, void *ctx)
{
    h_stream(req, ctx, BG_DEFER_WAIT);
}
static void h_flood(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_FLOOD); }
static void h_ndjson(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_NDJSON); }
static void h_sse_late(struct http_request *req, void *ctx) { h_stream(req, ctx, BG_SSE_LATE); }

static struct http_server *start_server(const struct http_config *cfg, struct bg *b)
{
    struct http_server *srv = NULL;
    char err[256] = "";
    int rc = http_server_create(&srv, cfg, err, sizeof err);
    CHECK(rc == 0, "http_server_create: %d %s", rc, err);
    if (rc)
        return NULL;
    static const struct {
        const char *method, *pattern;
        http_handler_fn fn;
        int ctx; /* 0: pattern as ctx, 1: bg */
    } routes[] = {
        {"GET", "/hello", h_hello, 0},
        {"GET", "/instance/:id", h_params, 0},
        {"DELETE", "/instance/:id", h_params, 0},
        {"GET", "/instance/previews", h_params, 0},
        {"GET", "/state/*rest", h_params, 0},
        {"GET", "/a/:x/b/:y", h_params, 0},
        {"GET", "/a/*rest", h_params, 0},
        {"POST", "/echo", h_echo, 0},
        {"PUT", "/echo", h_echo, 0},
        {"GET", "/query", h_query, 0},
        {"GET", "/sleep", h_sleep, 0},
        {"GET", "/noreply", h_noreply, 0},
        {"GET", "/twice", h_twice, 1},
        {"GET", "/big", h_big, 0},
        {"GET", "/sse100", h_sse100, 1},
        {"GET", "/tick", h_tick, 1},
        {"GET", "/idle", h_idle, 1},
        {"GET", "/late_cb", h_late_cb, 1},
        {"GET", "/defer", h_defer_ok, 1},
        {"GET", "/defer_wait", h_defer_wait, 1},
        {"GET", "/flood", h_flood, 1},
        {"GET", "/ndjson", h_ndjson, 1},
        {"GET", "/sse_late", h_sse_late, 1},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        rc = http_route(srv, routes[i].method, routes[i].pattern, routes[i].fn,
                        routes[i].ctx ? (void *)b : (void *)routes[i].pattern);
        CHECK(rc == 0, "http_route %s %s: %d", routes[i].method, routes[i].pattern, rc);
    }
    rc = http_server_start(srv, err, sizeof err);
    CHECK(rc == 0, "http_server_start: %d %s", rc, err);
    CHECK(http_server_port(srv) != 0, "port %u", (unsigned)http_server_port(srv));
    return srv;
}

/* ---------- tests ---------- */

/* The values a parse would make: containers, keys, strings, numbers and literals. */
static void test_json_values(void)
{
    const struct {
        const char *text;
        size_t want;
    } cases[] = {
        {"{}", 1},
        {"[]", 1},
        {"{\"a\":\"x\\\"y,{[\",\"b\":[1,true,null,-2.5e3]}", 9}, /* an escaped quote; brackets in a string */
        {"[{},{},{}]", 4},
        {" [ 1 , 2 ] ", 3},
        {"\"just a string\"", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t got = http_json_values(cases[i].text, strlen(cases[i].text), 100);
        CHECK(got == cases[i].want, "values of %s: %zu, want %zu", cases[i].text, got, cases[i].want);
    }
    CHECK(http_json_values("[1,2,3,4,5,6,7,8,9]", 19, 3) <= 5, "counting stops past the limit");
}

static void test_json_depth(void)
{
    const struct {
        const char *text;
        int limit, want;
    } cases[] = {
        {"{}", 10, 1},
        {"[[[]]]", 10, 3},
        {"[[[]]]", 2, 3}, /* stops at limit + 1 */
        {"[[[[[[[[]]]]]]]]", 3, 4},
        {"{\"a\":\"[[[[[[\"}", 2, 1},          /* brackets inside strings do not count */
        {"{\"a\":\"\\\"[[[[\"}", 2, 1},        /* escaped quote stays in the string */
        {"{\"a\":\"\\\\\",\"b\":[[1]]}", 5, 3}, /* escaped backslash ends before the quote */
        {"]]]][[", 5, 2},                       /* closers never go below zero */
        {"", 5, 0},
        {"123", 5, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = http_json_depth(cases[i].text, strlen(cases[i].text), cases[i].limit);
        CHECK(got == cases[i].want, "depth(%s, limit %d) = %d, want %d", cases[i].text,
              cases[i].limit, got, cases[i].want);
    }
    /* A deep document is refused after scanning no further than the limit. */
    size_t n = 1u << 20;
    char *deep = malloc(n);
    memset(deep, '[', n);
    CHECK_EQ_INT(http_json_depth(deep, n, 64), 65);
    free(deep);
}

static void test_sse_format(void)
{
    char buf[256];
    long n = sse_format(buf, sizeof buf, "tok", "7", "a\nb\r\nc\rd");
    const char *want = "event: tok\nid: 7\ndata: a\ndata: b\ndata: c\ndata: d\n\n";
    CHECK(n == (long)strlen(want) && strcmp(buf, want) == 0, "got %ld [%s]", n, buf);
    n = sse_format(buf, sizeof buf, NULL, NULL, "");
    CHECK(strcmp(buf, "data: \n\n") == 0, "empty data: [%s]", buf);
    n = sse_format(buf, 8, NULL, NULL, "0123456789");
    CHECK(n == 18 && strcmp(buf, "data: 0") == 0, "truncated: %ld [%s]", n, buf);
    CHECK_EQ_INT(sse_format(buf, sizeof buf, "a\nb", NULL, "x"), -1);
    CHECK_EQ_INT(sse_format(buf, sizeof buf, NULL, "1\r", "x"), -1);
}

/* An API's error body for the server's own refusals on its routes (http_route_errors). */
static json_t *shaped_error(int status, const char *message, const char *param)
{
    if (strstr(message, "nested deeper"))
        return NULL; /* a formatter that fails: the default shape stands in */
    return json_pack("{s:s,s:i,s:s,s:b}", "shape", "test", "status", status, "message", message,
                     "param", param != NULL);
}

/* The server's own error replies (too large, malformed, too deep, no reply) take the
 * shape of the route's API; other routes and requests that match none keep the default. */
static void test_error_shape(void)
{
    struct http_config cfg = {.max_body_bytes = 64, .max_json_depth = 4};
    struct http_server *srv = NULL;
    char err[256] = "";
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    if (!srv)
        return;
    CHECK_EQ_INT(http_route_errors(srv, "POST", "/shaped", h_echo, NULL, shaped_error), 0);
    CHECK_EQ_INT(http_route_errors(srv, "GET", "/shaped/noreply", h_noreply, NULL, shaped_error), 0);
    CHECK_EQ_INT(http_route_errors(srv, "POST", "/plain", h_echo, NULL, NULL), 0);
    CHECK_EQ_INT(http_route_errors(srv, "POST", "/shaped", h_echo, NULL, NULL), CAIRN_EINVAL);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);
    const char *ct = "Content-Type: application/json\r\n";
    const struct {
        const char *method, *path, *body;
        int status;
        const char *message; /* prefix; NULL: the default shape */
    } cases[] = {
        {"POST", "/shaped", "{\"a\":", 400, "malformed JSON"},
        {"POST", "/shaped", "0123456789012345678901234567890123456789012345678901234567890123456789", 413,
         "request body over the limit"},
        {"GET", "/shaped/noreply", NULL, 500, "handler made no reply"},
        {"POST", "/shaped", "[[[[[1]]]]]", 400, NULL},
        {"POST", "/plain", "{\"a\":", 400, NULL},
        {"POST", "/nowhere", "{}", 404, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct rh_resp r;
        request(port, cases[i].method, cases[i].path, ct, cases[i].body, &r);
        json_t *j = rh_json(&r);
        const char *m = cases[i].message ? rh_jstr(j, "message") : err_field(j, "message");
        bool shape = cases[i].message
                         ? rh_streq(rh_jstr(j, "shape"), "test") && rh_jint(j, "status") == cases[i].status &&
                               json_is_false(json_object_get(j, "param")) && m &&
                               strncmp(m, cases[i].message, strlen(cases[i].message)) == 0
                         : m && rh_jint(json_object_get(j, "error"), "code") == cases[i].status;
        CHECK(r.status == cases[i].status && shape, "%s %s: %d %s", cases[i].method, cases[i].path,
              r.status, r.body);
        json_decref(j);
        rh_free(&r);
    }
    http_server_release(srv);
}

static void test_route_errors(struct bg *b)
{
    struct http_server *srv = NULL;
    struct http_config cfg = {0};
    char err[256];
    CHECK_EQ_INT(http_server_create(&srv, &cfg, err, sizeof err), 0);
    if (!srv)
        return;
    CHECK_EQ_INT(http_route(srv, "GET", "/x/:id", h_hello, NULL), 0);
    CHECK_EQ_INT(http_route(srv, "GET", "/x/:other", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "POST", "/x/:other", h_hello, NULL), 0);
    CHECK_EQ_INT(http_route(srv, "GET", "/x/*rest/y", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "GET", "noslash", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "GET", "/a/:", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "GET", "/a/*", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "get", "/lower", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "OPTIONS", "/o", h_hello, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "GET", "/n", NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(http_route(srv, "GET", "/", h_hello, NULL), 0);
    CHECK_EQ_INT(http_server_start(srv, err, sizeof err), 0);
    CHECK_EQ_INT(http_route(srv, "GET", "/late", h_hello, NULL), CAIRN_ESTATE);
    CHECK_EQ_INT(http_server_start(srv, err, sizeof err), CAIRN_ESTATE);
    struct rh_resp r;
    request(http_server_port(srv), "GET", "/", NULL, NULL, &r);
    CHECK(r.status == 200 && strcmp(r.body, "hello") == 0, "GET /: %d [%s]", r.status, r.body);
    rh_free(&r);
    http_server_release(srv);

    /* Bad configurations fail with a message. */
    cfg.bind_addr = "not-an-address";
    err[0] = 0;
    CHECK_EQ_INT(http_server_create(&srv, &cfg, err, sizeof err), CAIRN_EINVAL);
    CHECK(srv == NULL && strstr(err, "not-an-address"), "err [%s]", err);
    /* A port in use is reported. */
    struct http_server *a = NULL, *c = NULL;
    cfg.bind_addr = NULL;
    CHECK_EQ_INT(http_server_create(&a, &cfg, err, sizeof err), 0);
    if (a) {
        cfg.port = http_server_port(a);
        int rc = http_server_create(&c, &cfg, err, sizeof err);
        CHECK(rc == CAIRN_EIO && strstr(err, "bind"), "second bind: %d [%s]", rc, err);
        http_server_release(c);
    }
    http_server_release(a); /* never started: just closes its socket */
    (void)b;
}

static void test_routing(uint16_t port)
{
    const struct {
        const char *method, *path, *route, *k1, *v1, *k2, *v2;
    } cases[] = {
        {"GET", "/instance/abc", "/instance/:id", "id", "abc", NULL, NULL},
        {"DELETE", "/instance/abc", "/instance/:id", "id", "abc", NULL, NULL},
        {"GET", "/instance/previews", "/instance/previews", NULL, NULL, NULL, NULL},
        {"GET", "/state", "/state/*rest", "rest", "", NULL, NULL},
        {"GET", "/state/nodes/n1/memory", "/state/*rest", "rest", "nodes/n1/memory", NULL, NULL},
        {"GET", "/a/1/b/2", "/a/:x/b/:y", "x", "1", "y", "2"},
        {"GET", "/a/1/b", "/a/*rest", "rest", "1/b", NULL, NULL},
        {"GET", "/a/1/b/2/c", "/a/*rest", "rest", "1/b/2/c", NULL, NULL},
        {"GET", "/instance/a%20b", "/instance/:id", "id", "a b", NULL, NULL},
        {"HEAD", "/instance/x", NULL, NULL, NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct rh_resp r;
        request(port, cases[i].method, cases[i].path, NULL, NULL, &r);
        CHECK(r.status == 200, "%s %s: status %d", cases[i].method, cases[i].path, r.status);
        if (!cases[i].route) { /* HEAD: headers of the GET, no body */
            CHECK(r.body_len == 0, "HEAD body %zu bytes", r.body_len);
            rh_free(&r);
            continue;
        }
        json_t *j = rh_json(&r);
        const char *route = rh_jstr(j, "route");
        CHECK(route && strcmp(route, cases[i].route) == 0, "%s %s: route %s, want %s",
              cases[i].method, cases[i].path, route ? route : "(none)", cases[i].route);
        const char *kv[2][2] = {{cases[i].k1, cases[i].v1}, {cases[i].k2, cases[i].v2}};
        for (int k = 0; k < 2; k++) {
            if (!kv[k][0])
                continue;
            const char *v = rh_jstr(j, kv[k][0]);
            CHECK(v && strcmp(v, kv[k][1]) == 0, "%s: param %s = %s, want %s", cases[i].path,
                  kv[k][0], v ? v : "(none)", kv[k][1]);
        }
        json_decref(j);
        rh_free(&r);
    }

    /* Query arguments, request headers, extra reply headers. */
    struct rh_resp r;
    request(port, "GET", "/query?q=hello%20world&x=1", "X-Test: yes\r\n", NULL, &r);
    json_t *j = rh_json(&r);
    char v[64];
    CHECK(r.status == 200 && rh_jstr(j, "q") && strcmp(rh_jstr(j, "q"), "hello world") == 0 &&
              rh_jstr(j, "h") && strcmp(rh_jstr(j, "h"), "yes") == 0 && !rh_jstr(j, "missing") &&
              rh_jstr(j, "remote") && strcmp(rh_jstr(j, "remote"), "127.0.0.1") == 0,
          "query: %d %s", r.status, r.body);
    CHECK(rh_header(&r, "X-Reply", v, sizeof v) && strcmp(v, "1") == 0, "X-Reply missing");
    json_decref(j);
    rh_free(&r);

    /* Unknown path: 404 in the error shape. */
    request(port, "GET", "/nope", NULL, NULL, &r);
    j = rh_json(&r);
    json_t *code = json_object_get(json_object_get(j, "error"), "code");
    CHECK(r.status == 404 && err_field(j, "type") && strcmp(err_field(j, "type"), "not_found") == 0 &&
              strstr(err_field(j, "message"), "/nope") && json_integer_value(code) == 404,
          "404: %d %s", r.status, r.body);
    CHECK(rh_header(&r, "Content-Type", v, sizeof v) && strcmp(v, "application/json") == 0,
          "404 content type");
    json_decref(j);
    rh_free(&r);

    /* A path that does not start with '/' and one with very many segments. */
    const char *star = "GET * HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    raw_request(port, star, strlen(star), &r);
    CHECK(r.status == 404 || r.status == 400, "GET *: %d", r.status);
    rh_free(&r);
    char deep[2048] = "/a";
    for (int i = 0; i < 300; i++)
        strcat(deep, "/z");
    request(port, "GET", deep, NULL, NULL, &r);
    j = rh_json(&r);
    CHECK(r.status == 200 && rh_jstr(j, "rest") && strlen(rh_jstr(j, "rest")) == 599,
          "deep rest: %d", r.status);
    json_decref(j);
    rh_free(&r);
    deep[1] = 'q';
    request(port, "GET", deep, NULL, NULL, &r);
    CHECK(r.status == 404, "deep unknown: %d", r.status);
    rh_free(&r);

    /* Known path, other method: 405 with Allow. */
    request(port, "POST", "/instance/abc", NULL, "{}", &r);
    CHECK(r.status == 405, "405: %d %s", r.status, r.body);
    CHECK(rh_header(&r, "Allow", v, sizeof v) && strstr(v, "GET") && strstr(v, "DELETE") &&
              !strstr(v, "POST"),
          "Allow: %s", rh_header(&r, "Allow", v, sizeof v) ? v : "(none)");
    rh_free(&r);
    request(port, "PATCH", "/hello", NULL, NULL, &r);
    CHECK(r.status == 405, "PATCH /hello: %d", r.status);
    rh_free(&r);

    /* A handler that makes no reply gets 500; a second reply is refused. */
    request(port, "GET", "/noreply", NULL, NULL, &r);
    CHECK(r.status == 500, "noreply: %d", r.status);
    rh_free(&r);

    /* A large buffered reply arrives whole. */
    request(port, "GET", "/big", NULL, NULL, &r);
    bool same = r.body_len == (3u << 20);
    for (size_t i = 0; same && i < r.body_len; i++)
        same = r.body[i] == (char)('a' + i % 26);
    CHECK(r.status == 200 && same, "big: %d, %zu bytes", r.status, r.body_len);
    rh_free(&r);
}

/* One access log line per request, through base/log at info level. */
static void test_access_log(uint16_t port)
{
    char path[] = "/tmp/cairn_http_log_XXXXXX";
    int tmp = mkstemp(path);
    if (tmp < 0)
        return;
    fflush(stderr);
    int saved = dup(2);
    dup2(tmp, 2);
    enum log_level level = log_get_level();
    log_set_level(LOG_INFO);
    struct rh_resp r;
    request(port, "GET", "/instance/logged?x=1", NULL, NULL, &r);
    rh_free(&r);
    request(port, "POST", "/nope", NULL, "{}", &r);
    rh_free(&r);
    /* The line is written when the request completes, just after the reply went out. */
    char buf[4096] = "";
    for (int i = 0; i < 200; i++) {
        ssize_t n = pread(tmp, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = 0;
        if (strstr(buf, "/nope"))
            break;
        usleep(10000);
    }
    log_set_level(level);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(tmp);
    unlink(path);
    CHECK(strstr(buf, "info: http 127.0.0.1 \"GET /instance/logged\" 200 ") != NULL,
          "access log: [%s]", buf);
    CHECK(strstr(buf, "\"POST /nope\" 404 ") != NULL && strstr(buf, " ms"), "access log 404: [%s]",
          buf);
}

static void test_twice(uint16_t port, struct bg *b)
{
    struct rh_resp r;
    request(port, "GET", "/twice", NULL, NULL, &r);
    CHECK(r.status == 200 && strcmp(r.body, "first") == 0, "twice: %d %s", r.status, r.body);
    pthread_mutex_lock(&b->mu);
    CHECK_EQ_INT(b->rc, CAIRN_ESTATE);
    pthread_mutex_unlock(&b->mu);
    rh_free(&r);
}

static void test_keepalive_connection(uint16_t port)
{
    /* Two pipelined requests on one connection, the second closing it. */
    const char *two = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                      "GET /instance/k HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    struct rh_resp r;
    raw_request(port, two, strlen(two), &r);
    CHECK(r.status == 200 && memmem(r.raw, r.raw_len, "\nhello", 6) &&
              memmem(r.raw, r.raw_len, "\"id\":\"k\"", 8),
          "pipelined: %d, %zu bytes", r.status, r.raw_len);
    rh_free(&r);
}

static void test_json(uint16_t port)
{
    const char *ct = "Content-Type: application/json\r\n";
    struct rh_resp r;
    const char *doc = "{\"a\":[1,2,{\"b\":\"c\\u00e9\"}],\"n\":null,\"f\":1.5}";
    request(port, "POST", "/echo", ct, doc, &r);
    json_t *want = json_loads(doc, 0, NULL), *got = rh_json(&r);
    CHECK(r.status == 200 && json_equal(want, got), "echo: %d %s", r.status, r.body);
    json_decref(want);
    json_decref(got);
    rh_free(&r);

    /* JSON sent without a JSON content type is still parsed when it parses. */
    request(port, "PUT", "/echo", "Content-Type: application/x-www-form-urlencoded\r\n",
            "{\"k\":1}", &r);
    got = rh_json(&r);
    CHECK(r.status == 200 && json_integer_value(json_object_get(got, "k")) == 1,
          "form-typed json: %d %s", r.status, r.body);
    json_decref(got);
    rh_free(&r);
    /* A web page's form or text/plain POST (Origin or Sec-Fetch-Site present) is refused
     * with 415: pages can send those anywhere without a preflight. JSON from a page, and
     * any type from a client that is not a browser (curl -d), are taken. */
    const char *page[] = {"Origin: http://evil.example\r\nContent-Type: text/plain\r\n",
                          "Origin: null\r\nContent-Type: application/x-www-form-urlencoded\r\n",
                          "Sec-Fetch-Site: cross-site\r\nContent-Type: multipart/form-data; boundary=x\r\n",
                          "Origin: http://evil.example\r\n"};
    for (size_t i = 0; i < sizeof page / sizeof *page; i++) {
        request(port, "POST", "/echo", page[i], "{\"k\":1}", &r);
        got = rh_json(&r);
        const char *m = err_field(got, "message");
        CHECK(r.status == 415 && m && strstr(m, "application/json"), "page body %zu: %d %s", i, r.status, r.body);
        json_decref(got);
        rh_free(&r);
    }
    request(port, "POST", "/echo", "Origin: http://127.0.0.1\r\nContent-Type: application/json\r\n", "{\"k\":1}", &r);
    CHECK(r.status == 200, "a page's JSON body is taken: %d %s", r.status, r.body);
    rh_free(&r);
    /* ... and a body that is not JSON reaches the handler raw. */
    request(port, "POST", "/echo", "Content-Type: text/plain\r\n", "{not json", &r);
    got = rh_json(&r);
    CHECK(r.status == 200 && rh_jstr(got, "raw") && strcmp(rh_jstr(got, "raw"), "{not json") == 0,
          "raw body: %d %s", r.status, r.body);
    json_decref(got);
    rh_free(&r);

    const char *bad[] = {"{\"a\":", "{\"a\" 1}", "[1,2,]", "{\"s\":\"\xff\xfe\"}", "nul\x01l"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        request(port, "POST", "/echo", ct, bad[i], &r);
        got = rh_json(&r);
        const char *m = err_field(got, "message");
        CHECK(r.status == 400 && m && strstr(m, "malformed JSON"), "bad json %zu: %d %s", i,
              r.status, r.body);
        json_decref(got);
        rh_free(&r);
    }

    /* Nesting: the limit (8) passes, one more is refused naming the limit, also when the
     * content type does not say JSON; brackets inside strings do not count. */
    char nest[64];
    for (int depth = 8; depth <= 9; depth++) {
        int k = 0;
        for (int i = 0; i < depth; i++)
            nest[k++] = '[';
        for (int i = 0; i < depth; i++)
            nest[k++] = ']';
        nest[k] = 0;
        for (int typed = 0; typed < 2; typed++) {
            request(port, "POST", "/echo", typed ? ct : NULL, nest, &r);
            got = rh_json(&r);
            const char *m = err_field(got, "message");
            if (depth == 8)
                CHECK(r.status == 200, "depth 8: %d %s", r.status, r.body);
            else
                CHECK(r.status == 400 && m && strstr(m, "8 levels"), "depth 9: %d %s",
                      r.status, r.body);
            json_decref(got);
            rh_free(&r);
        }
    }
    request(port, "POST", "/echo", ct, "{\"s\":\"[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{\"}", &r);
    CHECK(r.status == 200, "brackets in a string: %d %s", r.status, r.body);
    rh_free(&r);
}

/* GET /hello with the Host line host (NULL: none, HTTP/1.0); the status. */
static int hello_as(uint16_t port, const char *host)
{
    char req[512];
    if (host)
        snprintf(req, sizeof req, "GET /hello HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host);
    else
        snprintf(req, sizeof req, "GET /hello HTTP/1.0\r\n\r\n");
    struct rh_resp r;
    raw_request(port, req, strlen(req), &r);
    int st = r.status;
    if (st == 403) {
        json_t *j = rh_json(&r);
        const char *m = err_field(j, "message");
        CHECK(m && strstr(m, "--allowed-host"), "a refused Host says how to allow it: %s", r.body);
        json_decref(j);
    }
    rh_free(&r);
    return st;
}

/* DNS rebinding: a page on a name the attacker controls, pointed at 127.0.0.1, reaches
 * the server with that name in Host. Only IP literals, localhost, this machine's name
 * and the configured names are answered; every route refuses the others with 403. */
/* Which listening addresses count as this machine only (an API elsewhere needs a key). */
static void test_loopback_addr(void)
{
    const char *yes[] = {NULL, "", "127.0.0.1", "127.1.2.3", "::1", "localhost", "LocalHost", "::ffff:127.0.0.9"};
    const char *no[] = {"0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "fe80::1", "::ffff:10.0.0.1", "my.box",
                        "128.0.0.1", "127.0.0.1.example", " 127.0.0.1"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        CHECK(http_addr_is_loopback(yes[i]), "'%s' is loopback", yes[i] ? yes[i] : "(null)");
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        CHECK(!http_addr_is_loopback(no[i]), "'%s' is not loopback", no[i]);
}

static void test_host(uint16_t port)
{
    const char *ok[] = {"127.0.0.1", "127.0.0.1:8080", "localhost", "LocalHost:52415", "localhost.",
                        "app.localhost:3000", "[::1]:52415", "[::1]", "10.1.2.3", NULL};
    for (int i = 0; ok[i]; i++)
        CHECK(hello_as(port, ok[i]) == 200, "Host %s is answered", ok[i]);
    CHECK(hello_as(port, NULL) == 200, "a request without Host (HTTP/1.0) is answered");
    char own[256];
    if (gethostname(own, sizeof own) == 0 && own[0]) {
        own[sizeof own - 1] = 0;
        CHECK(hello_as(port, own) == 200, "this machine's name %s is answered", own);
        char local[300];
        snprintf(local, sizeof local, "%s.local:52415", own);
        CHECK(hello_as(port, local) == 200, "%s is answered", local);
    }
    const char *bad[] = {"evil.example", "evil.example:52415", "127.0.0.1.evil.example", "localhost.evil.example",
                         "127.0.0.1:80x", "[::1", "[::1]x", "", "evil.localhostx", NULL};
    for (int i = 0; bad[i]; i++)
        CHECK(hello_as(port, bad[i]) == 403, "Host '%s' is refused", bad[i]);
    /* A POST with a body and the event stream are refused the same way. */
    struct rh_resp r;
    const char *post = "POST /echo HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
                       "Content-Length: 7\r\nConnection: close\r\n\r\n{\"k\":1}";
    raw_request(port, post, strlen(post), &r);
    CHECK(r.status == 403, "POST with a foreign Host: %d", r.status);
    rh_free(&r);
    const char *sse = "GET /sse100 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n";
    raw_request(port, sse, strlen(sse), &r);
    CHECK(r.status == 403, "a stream with a foreign Host: %d", r.status);
    rh_free(&r);
}

/* --allowed-host names: answered (any port, any case); "*" answers every name. */
static void test_allowed_hosts(struct bg *b)
{
    const char *names[] = {"my.box", NULL};
    struct http_config cfg = {.allowed_hosts = names};
    struct http_server *srv = start_server(&cfg, b);
    if (!srv)
        return;
    uint16_t port = http_server_port(srv);
    CHECK(hello_as(port, "my.box:8080") == 200 && hello_as(port, "MY.BOX") == 200, "an allowed name is answered");
    CHECK(hello_as(port, "other.box") == 403, "another name is still refused");
    http_server_release(srv);
    const char *any[] = {"*", NULL};
    cfg.allowed_hosts = any;
    srv = start_server(&cfg, b);
    if (!srv)
        return;
    CHECK(hello_as(http_server_port(srv), "other.box") == 200, "\"*\" answers every name");
    http_server_release(srv);
}

static void test_body_limit(uint16_t port)
{
    /* max_body_bytes = 4096: exactly 4096 passes, 4097 is refused. */
    char *body = malloc(4098);
    for (int extra = 0; extra < 2; extra++) {
        size_t n = 4096 + (size_t)extra;
        memset(body, 'a', n);
        memcpy(body, "{\"s\":\"", 6);
        memcpy(body + n - 2, "\"}", 2);
        body[n] = 0;
        struct rh_resp r;
        request(port, "POST", "/echo", "Content-Type: application/json\r\n", body, &r);
        json_t *j = rh_json(&r);
        if (extra == 0) {
            CHECK(r.status == 200 && rh_jstr(j, "s") && strlen(rh_jstr(j, "s")) == 4088,
                  "4096 bytes: %d", r.status);
        } else {
            CHECK(r.status == 413 && err_field(j, "message") &&
                      strstr(err_field(j, "message"), "4096"),
                  "4097 bytes: %d %s", r.status, r.body);
        }
        json_decref(j);
        rh_free(&r);
    }
    free(body);

    /* A huge Content-Length is refused from the headers alone: the body is never sent. */
    int64_t t0 = clock_ns();
    const char *hdr = "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000\r\n"
                      "Content-Type: application/json\r\n\r\n";
    struct rh_resp r;
    raw_request(port, hdr, strlen(hdr), &r);
    CHECK(r.status == 413, "huge Content-Length: %d", r.status);
    CHECK(clock_ns() - t0 < 5000000000LL, "413 took %.2f s", (double)(clock_ns() - t0) * 1e-9);
    rh_free(&r);
    /* Also before authentication-free routes read anything with Expect: 100-continue. */
    const char *expect = "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999\r\n"
                         "Expect: 100-continue\r\n\r\n";
    raw_request(port, expect, strlen(expect), &r);
    CHECK(r.status == 413, "Expect 100-continue over limit: %d", r.status);
    rh_free(&r);

    /* A chunked body over the limit: the connection is dropped, no 200. */
    int fd = rh_connect(port);
    const char *ch = "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    rh_send_all(fd, ch, strlen(ch));
    char chunk[1100];
    int len = snprintf(chunk, sizeof chunk, "400\r\n");
    memset(chunk + len, 'a', 1024);
    memcpy(chunk + len + 1024, "\r\n", 2);
    for (int i = 0; i < 16; i++)
        if (rh_send_all(fd, chunk, (size_t)len + 1026) != 0)
            break;
    rh_send_all(fd, "0\r\n\r\n", 5);
    char *raw;
    size_t n = rh_read_all(fd, &raw, NULL);
    close(fd);
    CHECK(n == 0 || strncmp(raw, "HTTP/1.1 200", 12) != 0, "chunked over limit answered: %.40s",
          raw);
    free(raw);
}

static void test_auth_cors(struct bg *b)
{
    const char *origins[] = {"http://ok.example", "http://also.example", NULL};
    struct http_config cfg = {.api_key = "s3cret-key", .cors_origins = origins};
    struct http_server *srv = start_server(&cfg, b);
    if (!srv)
        return;
    uint16_t port = http_server_port(srv);
    const struct {
        const char *hdr;
        int want;
    } cases[] = {
        {NULL, 401},
        {"Authorization: Bearer wrong\r\n", 401},
        {"Authorization: Bearer s3cret-ke\r\n", 401},
        {"Authorization: Bearer s3cret-key2\r\n", 401},
        {"Authorization: Basic s3cret-key\r\n", 401},
        {"Authorization: Bearer \r\n", 401},
        {"Authorization: Bearer s3cret-key\r\n", 200},
        {"Authorization: bearer s3cret-key\r\n", 200},
        {"x-api-key: s3cret-key\r\n", 200},
        {"x-api-key: nope\r\n", 401},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct rh_resp r;
        request(port, "GET", "/hello", cases[i].hdr, NULL, &r);
        CHECK(r.status == cases[i].want, "auth case %zu (%s): %d, want %d", i,
              cases[i].hdr ? cases[i].hdr : "none", r.status, cases[i].want);
        if (cases[i].want == 401) {
            json_t *j = rh_json(&r);
            char v[64];
            CHECK(err_field(j, "type") && strcmp(err_field(j, "type"), "authentication_error") == 0,
                  "401 body %s", r.body);
            CHECK(rh_header(&r, "WWW-Authenticate", v, sizeof v) != NULL, "no WWW-Authenticate");
            json_decref(j);
        }
        rh_free(&r);
    }
    /* Unknown paths are not revealed to a client without the key. */
    struct rh_resp r;
    request(port, "GET", "/nope", NULL, NULL, &r);
    CHECK(r.status == 401, "unauthenticated 404: %d", r.status);
    rh_free(&r);

    /* Preflight from an allowed origin: no key needed, methods and headers granted. */
    char v[256];
    request(port, "OPTIONS", "/instance/x",
            "Origin: http://ok.example\r\nAccess-Control-Request-Method: DELETE\r\n"
            "Access-Control-Request-Headers: authorization, content-type\r\n",
            NULL, &r);
    CHECK(r.status == 204, "preflight: %d %s", r.status, r.body);
    CHECK(rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
              strcmp(v, "http://ok.example") == 0,
          "ACAO: %s", rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v) ? v : "(none)");
    CHECK(rh_header(&r, "Access-Control-Allow-Methods", v, sizeof v) && strstr(v, "DELETE") &&
              strstr(v, "GET"),
          "ACAM: %s", rh_header(&r, "Access-Control-Allow-Methods", v, sizeof v) ? v : "(none)");
    CHECK(rh_header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
              strcasestr(v, "authorization"),
          "ACAH missing");
    CHECK(rh_header(&r, "Access-Control-Max-Age", v, sizeof v) != NULL, "no max-age");
    rh_free(&r);
    /* Preflight from another origin: refused, no CORS headers. */
    request(port, "OPTIONS", "/hello",
            "Origin: http://evil.example\r\nAccess-Control-Request-Method: GET\r\n", NULL, &r);
    CHECK(r.status == 403 && !rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v),
          "evil preflight: %d", r.status);
    rh_free(&r);
    /* Preflight for an unknown path. */
    request(port, "OPTIONS", "/nope",
            "Origin: http://ok.example\r\nAccess-Control-Request-Method: GET\r\n", NULL, &r);
    CHECK(r.status == 404, "preflight unknown: %d", r.status);
    rh_free(&r);
    /* Header names that are not a token list are not echoed. */
    request(port, "OPTIONS", "/hello",
            "Origin: http://ok.example\r\nAccess-Control-Request-Method: GET\r\n"
            "Access-Control-Request-Headers: x;y=\"z\"\r\n",
            NULL, &r);
    CHECK(r.status == 204 && rh_header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
              !strchr(v, ';'),
          "odd ACRH: %d %s", r.status, v);
    rh_free(&r);
    /* Actual requests: the allowed origin is echoed, even on errors; others are not. */
    request(port, "GET", "/hello",
            "Origin: http://also.example\r\nAuthorization: Bearer s3cret-key\r\n", NULL, &r);
    CHECK(r.status == 200 && rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
              strcmp(v, "http://also.example") == 0,
          "CORS GET: %d", r.status);
    rh_free(&r);
    request(port, "GET", "/hello", "Origin: http://ok.example\r\n", NULL, &r);
    CHECK(r.status == 401 && rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v),
          "CORS 401 without ACAO: %d", r.status);
    rh_free(&r);
    request(port, "GET", "/hello",
            "Origin: http://evil.example\r\nAuthorization: Bearer s3cret-key\r\n", NULL, &r);
    CHECK(r.status == 200 && !rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v),
          "evil GET: %d", r.status);
    rh_free(&r);
    /* Plain OPTIONS lists the methods. */
    request(port, "OPTIONS", "/echo", NULL, NULL, &r);
    CHECK(r.status == 204 && rh_header(&r, "Allow", v, sizeof v) && strstr(v, "POST") &&
              strstr(v, "PUT"),
          "OPTIONS: %d", r.status);
    rh_free(&r);
    http_server_release(srv);

    /* "*" allows any origin. */
    const char *any[] = {"*", NULL};
    struct http_config cfg2 = {.cors_origins = any};
    srv = start_server(&cfg2, b);
    if (!srv)
        return;
    request(http_server_port(srv), "GET", "/hello", "Origin: https://x.test\r\n", NULL, &r);
    CHECK(r.status == 200 && rh_header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
              strcmp(v, "https://x.test") == 0,
          "any origin: %d", r.status);
    rh_free(&r);
    http_server_release(srv);
}

/* Parses SSE text: data lines of events (comments skipped) into out (max n). */
static int parse_sse(const char *text, char out[][32], int n, int *pings)
{
    int count = 0;
    *pings = 0;
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        if (strncmp(line, ": ping", 6) == 0)
            (*pings)++;
        if (strncmp(line, "data: ", 6) == 0 && count < n) {
            size_t dl = len - 6 < 31 ? len - 6 : 31;
            memcpy(out[count], line + 6, dl);
            out[count][dl] = 0;
            count++;
        }
        line += len;
        if (*line)
            line++;
    }
    return count;
}

static void test_sse100(uint16_t port, struct bg *b)
{
    bg_reset(b);
    struct rh_resp r;
    request(port, "GET", "/sse100", NULL, NULL, &r);
    CHECK(bg_join(b, 10000), "sse100 writer did not finish");
    char v[64];
    CHECK(r.status == 200 && rh_header(&r, "Content-Type", v, sizeof v) &&
              strncmp(v, "text/event-stream", 17) == 0,
          "sse100: %d", r.status);
    CHECK(r.complete, "sse100 stream not terminated cleanly");
    static char data[128][32];
    int pings;
    int n = parse_sse(r.body ? r.body : "", data, 128, &pings);
    CHECK_EQ_INT(n, 101);
    bool in_order = true;
    for (int i = 0; i < 100 && i < n && in_order; i++) {
        char want[32];
        snprintf(want, sizeof want, "%d", i);
        in_order = strcmp(data[i], want) == 0;
        CHECK(in_order, "event %d = %s", i, data[i]);
    }
    CHECK(n == 101 && strcmp(data[100], "[DONE]") == 0, "last event %s", n ? data[n - 1] : "");
    CHECK(r.body && strstr(r.body, "event: odd\ndata: 1\n\n"), "named event missing");
    CHECK_EQ_INT(b->writes, 100);
    CHECK_EQ_INT(b->rc, 0);
    CHECK_EQ_INT(b->cb_calls, 0); /* the writer's own finish does not call back */
    rh_free(&r);
}

/* A real client (curl, when installed) reads the same stream and posts JSON. */
static void test_curl(uint16_t port, struct bg *b)
{
    if (system("curl --version > /dev/null 2>&1") != 0) {
        printf("skipped curl test: curl not installed\n");
        return;
    }
    bg_reset(b);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "curl -s -N --max-time 10 http://127.0.0.1:%u/sse100", port);
    FILE *p = popen(cmd, "r");
    int events = 0, last = -1;
    bool in_order = true;
    char line[256];
    while (p && events < 1000 && fgets(line, sizeof line, p)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        events++;
        if (strncmp(line + 6, "[DONE]", 6) != 0) {
            int v = atoi(line + 6);
            in_order = in_order && v == last + 1;
            last = v;
        }
    }
    int st = p ? pclose(p) : -1;
    CHECK(st == 0 && events == 101 && last == 99 && in_order,
          "curl sse: exit %d, %d events, last %d, in order %d", st, events, last, in_order);
    CHECK(bg_join(b, 5000), "curl sse writer did not finish");

    snprintf(cmd, sizeof cmd,
             "curl -s --max-time 10 -H 'Content-Type: application/json' "
             "-d '{\"m\":[1,{\"k\":\"v\"}]}' http://127.0.0.1:%u/echo",
             port);
    p = popen(cmd, "r");
    char out[256] = "";
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    st = p ? pclose(p) : -1;
    CHECK(st == 0 && strcmp(out, "{\"m\":[1,{\"k\":\"v\"}]}") == 0, "curl echo: %d [%s]", st,
          out);
}

static void test_ndjson(uint16_t port, struct bg *b)
{
    bg_reset(b);
    struct rh_resp r;
    request(port, "GET", "/ndjson", NULL, NULL, &r);
    CHECK(bg_join(b, 10000), "ndjson writer did not finish");
    int lines = 0;
    bool ok = r.status == 200 && r.complete;
    for (char *line = r.body; ok && line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = 0;
        json_t *j = json_loads(line, 0, NULL);
        ok = j && json_integer_value(json_object_get(j, "n")) == lines &&
             strcmp(rh_jstr(j, "text"), "line\nbreak") == 0;
        json_decref(j);
        lines++;
        line = nl + 1;
    }
    CHECK(ok && lines == 20, "ndjson: %d, %d lines ok=%d", r.status, lines, ok);
    rh_free(&r);
}

static void test_sse_keepalive(uint16_t port, struct bg *b)
{
    bg_reset(b);
    struct rh_resp r;
    request(port, "GET", "/sse_late", NULL, NULL, &r);
    CHECK(bg_join(b, 10000), "sse_late writer did not finish");
    static char data[4][32];
    int pings = 0;
    int n = parse_sse(r.body ? r.body : "", data, 4, &pings);
    CHECK(n == 1 && strcmp(data[0], "late") == 0 && pings >= 1, "keepalive: %d events, %d pings",
          n, pings);
    rh_free(&r);
}

/* The client reads three events and hangs up; the writer must see it. */
static void test_disconnect_mid_stream(uint16_t port, struct bg *b)
{
    bg_reset(b);
    int fd = rh_connect(port);
    const char *req = "GET /tick HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    rh_send_all(fd, req, strlen(req));
    char buf[8192];
    size_t n = 0;
    int events = 0;
    int64_t until = clock_ns() + 10000000000LL;
    while (events < 3 && n < sizeof buf - 1 && clock_ns() < until) {
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
        buf[n] = 0;
        events = 0;
        for (const char *p = buf; (p = strstr(p, "data: tick")); p++)
            events++;
    }
    CHECK(events >= 3, "saw %d events before hanging up", events);
    printf("first 3 events (10 ms apart) after %.1f ms\n",
           (double)(clock_ns() - (until - 10000000000LL)) * 1e-6);
    int64_t t_close = clock_ns();
    close(fd);
    CHECK(bg_join(b, 5000), "writer did not notice the disconnect within 5 s");
    double s = (double)(b->t_end - t_close) * 1e-9;
    CHECK(b->st == HTTP_STREAM_GONE, "state %d", b->st);
    CHECK(b->cb_calls == 1 && b->cb_why == HTTP_STREAM_GONE, "close callback %d calls, why %d",
          b->cb_calls, b->cb_why);
    CHECK(s < 5.0, "noticed after %.3f s", s);
    printf("mid-stream disconnect noticed after %.1f ms (%d writes)\n", s * 1e3, b->writes);
}

/* The client hangs up before anything was written (stream and deferred reply). */
static void test_disconnect_early(uint16_t port, struct bg *b, const char *path)
{
    bg_reset(b);
    int fd = rh_connect(port);
    char req[128];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    rh_send_all(fd, req, strlen(req));
    CHECK(bg_wait_stream(b, 5000), "%s: handler did not run", path);
    int64_t t_close = clock_ns();
    close(fd);
    CHECK(bg_join(b, 6000), "%s: writer did not finish", path);
    double s = (double)(b->t_end - t_close) * 1e-9;
    CHECK(b->st == HTTP_STREAM_GONE, "%s: state %d", path, b->st);
    CHECK(b->cb_calls == 1 && b->cb_why == HTTP_STREAM_GONE, "%s: callback %d why %d", path,
          b->cb_calls, b->cb_why);
    CHECK(s < 4.5, "%s: noticed after %.3f s", path, s);
    CHECK(b->rc == 0, "%s: late close callback did not run at registration", path);
    printf("%s: early disconnect noticed after %.1f ms\n", path, s * 1e3);
}

/* HEAD on a streaming route ends without a body: the writer learns the client is gone. */
static void test_head_stream(uint16_t port, struct bg *b)
{
    bg_reset(b);
    struct rh_resp r;
    request(port, "HEAD", "/idle", NULL, NULL, &r);
    CHECK(r.status == 200 && r.body_len == 0, "HEAD /idle: %d, %zu bytes", r.status, r.body_len);
    rh_free(&r);
    CHECK(bg_join(b, 6000), "HEAD: writer did not finish");
    CHECK(b->st == HTTP_STREAM_GONE, "HEAD: state %d", b->st);
}

static void test_ipv6(struct bg *b)
{
    struct http_config cfg = {.bind_addr = "::1"};
    struct http_server *srv = NULL;
    char err[256];
    if (http_server_create(&srv, &cfg, err, sizeof err) != 0) {
        printf("skipped IPv6: %s\n", err);
        return;
    }
    CHECK(http_route(srv, "GET", "/hello", h_hello, b) == 0, "route");
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start ::1: %s", err);
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = RH_IO_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(http_server_port(srv))};
    a.sin6_addr = in6addr_loopback;
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    const char *req = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    char *raw = NULL;
    if (ok && rh_send_all(fd, req, strlen(req)) == 0)
        rh_read_all(fd, &raw, NULL);
    CHECK(raw && strncmp(raw, "HTTP/1.1 200", 12) == 0, "IPv6 reply: %.20s", raw ? raw : "");
    free(raw);
    close(fd);
    http_server_release(srv);
}

static void test_defer(uint16_t port, struct bg *b)
{
    bg_reset(b);
    struct rh_resp r;
    request(port, "GET", "/defer", NULL, NULL, &r);
    CHECK(bg_join(b, 5000), "defer writer did not finish");
    json_t *j = rh_json(&r);
    char v[16];
    CHECK(r.status == 202 && rh_jstr(j, "late") && strcmp(rh_jstr(j, "late"), "reply") == 0,
          "deferred: %d %s", r.status, r.body);
    CHECK(rh_header(&r, "X-Late", v, sizeof v) != NULL, "deferred header missing");
    CHECK_EQ_INT(b->rc, 0);
    json_decref(j);
    rh_free(&r);
}

/* A client that never reads: the writer gets EFULL, never blocks, and others are served. */
static void test_slow_client(uint16_t port, struct bg *b)
{
    bg_reset(b);
    int fd = rh_connect(port);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    const char *req = "GET /flood HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    rh_send_all(fd, req, strlen(req));
    int64_t t0 = clock_ns();
    CHECK(bg_join(b, 20000), "flood writer did not finish");
    double s = (double)(clock_ns() - t0) * 1e-9;
    CHECK(b->rc == CAIRN_EFULL && b->st == HTTP_STREAM_TOO_SLOW, "flood: rc %d state %d", b->rc,
          b->st);
    CHECK(b->writes < 256 * 1024, "flood wrote %d KiB", b->writes);
    printf("slow client cut off after %d KiB in %.2f s\n", b->writes, s);
    close(fd);
    struct rh_resp r;
    request(port, "GET", "/hello", NULL, NULL, &r);
    CHECK(r.status == 200, "after flood: %d", r.status);
    rh_free(&r);
}

static void test_garbage(uint16_t port)
{
    /* Garbage, a half-sent request and a half-sent body stay open while others are served. */
    int g = rh_connect(port), h = rh_connect(port), k = rh_connect(port);
    char junk[4096];
    uint64_t st = 42;
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)test_rand_u64(&st);
    rh_send_all(g, "\x01\x02\x03 GARBAGE\r\n\r\n", 15);
    rh_send_all(g, junk, sizeof junk);
    rh_send_all(h, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half", 44);
    rh_send_all(k, "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"a\":", 66);
    const char *bad[] = {
        "GET /hello HTTP/9.9\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "\r\n\r\n\r\n",
        "GET /hello\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct rh_resp r;
        rh_raw(port, bad[i], strlen(bad[i]), &r, 1); /* some wait for more bytes */
        CHECK(r.status != 200 || i == 5, "bad request %zu answered %d", i, r.status);
        rh_free(&r);
        struct rh_resp ok;
        request(port, "GET", "/hello", NULL, NULL, &ok);
        CHECK(ok.status == 200 && strcmp(ok.body, "hello") == 0, "after bad %zu: %d", i,
              ok.status);
        rh_free(&ok);
    }
    struct rh_resp r;
    request(port, "GET", "/hello", NULL, NULL, &r);
    CHECK(r.status == 200, "while garbage connections are open: %d", r.status);
    rh_free(&r);
    close(g);
    close(h);
    close(k);
}

struct conc {
    uint16_t port;
    int status;
    char body[64];
};

static void *conc_main(void *arg)
{
    struct conc *c = arg;
    struct rh_resp r;
    request(c->port, "GET", "/sleep", NULL, NULL, &r);
    c->status = r.status;
    snprintf(c->body, sizeof c->body, "%s", r.body ? r.body : "");
    rh_free(&r);
    return NULL;
}

static void test_concurrent(uint16_t port)
{
    enum { N = 50 };
    struct conc c[N];
    pthread_t th[N];
    bool started[N];
    int64_t t0 = clock_ns();
    for (int i = 0; i < N; i++) {
        c[i] = (struct conc){.port = port};
        started[i] = pthread_create(&th[i], NULL, conc_main, &c[i]) == 0;
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        ok += c[i].status == 200 && strstr(c[i].body, "\"ok\":true") != NULL;
    }
    double s = (double)(clock_ns() - t0) * 1e-9;
    CHECK(ok == N, "%d of %d concurrent clients answered", ok, N);
    /* Each handler sleeps 200 ms: one after another would take 10 s. */
    CHECK(s < 6.0, "50 clients took %.2f s", s);
    printf("50 concurrent clients (200 ms handlers) in %.2f s\n", s);
}

struct stop_ctx {
    struct http_server *srv;
    double stop_s;
};

static void test_stop(struct bg *b)
{
    struct http_config cfg = {.stop_grace_ms = 1000, .keepalive_ms = 100};
    struct http_server *srv = start_server(&cfg, b);
    if (!srv)
        return;
    uint16_t port = http_server_port(srv);
    bg_reset(b);
    int fd = rh_connect(port);
    const char *req = "GET /tick HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    rh_send_all(fd, req, strlen(req));
    CHECK(bg_wait_stream(b, 5000), "tick handler did not run");
    usleep(50 * 1000);
    int idle = rh_connect(port); /* an idle keep-alive connection */
    int64_t t0 = clock_ns();
    http_server_stop(srv);
    double s = (double)(clock_ns() - t0) * 1e-9;
    CHECK(s < 5.0, "stop took %.2f s", s);
    CHECK(bg_join(b, 5000), "writer did not stop");
    CHECK(b->st == HTTP_STREAM_STOPPED && b->cb_calls == 1 && b->cb_why == HTTP_STREAM_STOPPED,
          "after stop: state %d, %d callbacks why %d", b->st, b->cb_calls, b->cb_why);
    char *raw;
    size_t n = rh_read_all(fd, &raw, NULL);
    CHECK(n > 0 && strstr(raw, "data: tick 0") && strstr(raw, "\r\n0\r\n\r\n"),
          "stream did not end cleanly: %zu bytes", n);
    free(raw);
    close(fd);
    close(idle);
    /* Refused once stopped. */
    fd = rh_connect(port);
    CHECK(fd < 0, "connect after stop succeeded");
    if (fd >= 0)
        close(fd);
    http_server_stop(srv); /* idempotent */
    http_server_release(srv);
    printf("stop with an open stream took %.2f s\n", s);

    /* A deferred reply pending at stop gets 503. */
    srv = start_server(&cfg, b);
    if (!srv)
        return;
    bg_reset(b);
    fd = rh_connect(http_server_port(srv));
    req = "GET /defer_wait HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    rh_send_all(fd, req, strlen(req));
    CHECK(bg_wait_stream(b, 5000), "defer_wait handler did not run");
    http_server_stop(srv);
    struct rh_resp r = {0};
    r.raw_len = rh_read_all(fd, &r.raw, NULL);
    rh_parse(&r);
    CHECK(r.status == 503, "deferred at stop: %d", r.status);
    rh_free(&r);
    close(fd);
    CHECK(bg_join(b, 5000), "defer_wait writer did not finish");
    CHECK(b->st == HTTP_STREAM_STOPPED, "deferred state %d", b->st);
    http_server_release(srv);
}

/* A socket to 127.0.0.1:port from source address src (another loopback address is
 * another client), or -1. */
static int connect_from(const char *src, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &a.sin_addr);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    struct timeval tv = {RH_IO_TIMEOUT_S, 0};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || connect(fd, (struct sockaddr *)&to, sizeof to)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static double now_s(void) { return (double)clock_ns() / 1e9; }

/* Sends text one byte every 300 ms until the server closes the connection; the seconds
 * that took, or -1 when text ran out first. */
static double trickle(int fd, const char *text)
{
    double t0 = now_s();
    for (size_t i = 0; text[i]; i++) {
        if (send(fd, text + i, 1, MSG_NOSIGNAL) != 1)
            return now_s() - t0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 300) == 1) {
            char c;
            if (recv(fd, &c, 1, 0) <= 0)
                return now_s() - t0;
        }
    }
    return -1;
}

/* Deadlines a trickle of bytes does not reset, and the JSON parse's budget. */
static void test_deadlines(struct bg *b)
{
    struct http_config cfg = {.max_body_bytes = 1 << 20, .head_timeout_s = 2, .body_timeout_s = 2,
                              .idle_timeout_s = 30, .max_per_client = 8, .max_json_values = 1000};
    struct http_server *srv = start_server(&cfg, b);
    if (!srv)
        return;
    uint16_t port = http_server_port(srv);
    /* a head sent a byte at a time, each well within the idle timeout */
    char head[1024] = "GET /hello HTTP/1.1\r\n";
    for (int i = 0; i < 30; i++)
        strcat(head, "X-Slow: aaaaaaaaaa\r\n");
    int fd = rh_connect(port);
    double t = fd >= 0 ? trickle(fd, head) : -2;
    CHECK(t >= 1.5 && t < 10, "a head trickled byte by byte is cut after its 2 s deadline (%.2f s)", t);
    if (fd >= 0)
        close(fd);
    /* a body likewise, after a whole head */
    fd = rh_connect(port);
    const char *post =
        "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 200\r\n\r\n";
    CHECK(fd >= 0 && rh_send_all(fd, post, strlen(post)) == 0, "a POST head sent");
    char body[201];
    memset(body, 'b', 200);
    body[200] = 0;
    t = fd >= 0 ? trickle(fd, body) : -2;
    CHECK(t >= 1.5 && t < 10, "a body trickled byte by byte is cut after its 2 s deadline (%.2f s)", t);
    if (fd >= 0)
        close(fd);
    struct rh_resp r = {0};
    /* a JSON body with more values than the budget: 413 before it is parsed */
    size_t n = 2000;
    char *many = malloc(3 * n + 2);
    size_t k = 0;
    many[k++] = '[';
    for (size_t i = 0; i < n; i++) {
        memcpy(many + k, "{},", 3);
        k += 3;
    }
    many[k - 1] = ']';
    many[k] = 0;
    rh_post(port, "/echo", many, &r);
    CHECK(r.status == 413 && strstr(r.body, "values"), "2001 values over a budget of 1000: %d %.120s", r.status,
          r.body);
    rh_free(&r);
    many[3 * 500] = ']'; /* 500 objects in an array: parsed */
    many[3 * 500 + 1] = 0;
    rh_post(port, "/echo", many, &r);
    CHECK(r.status == 200, "501 values within the budget: %d %.120s", r.status, r.body);
    rh_free(&r);
    free(many);
    http_server_release(srv);
}

/* One client's connections are capped at max_per_client; another client is still
 * served. A server of its own, whose head deadline (120 s) cannot cut the idle eight
 * while the ninth is tried on a busy machine. */
static void test_per_client(struct bg *b)
{
    struct http_config cfg = {.head_timeout_s = 120, .body_timeout_s = 120, .idle_timeout_s = 120,
                              .max_per_client = 8};
    struct http_server *srv = start_server(&cfg, b);
    if (!srv)
        return;
    uint16_t port = http_server_port(srv);
    struct rh_resp r = {0};
    int idle[8];
    for (int i = 0; i < 8; i++)
        idle[i] = rh_connect(port);
    struct timespec settle = {0, 200 * 1000000L};
    nanosleep(&settle, NULL);
    const char *ninth = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    /* the eight are accepted by the server's threads in their own time: on a busy
     * machine the ninth may come first, so it is tried again (bound: 10 tries, 1 s apart) */
    for (int tries = 0; tries < 10; tries++) {
        rh_free(&r);
        rh_raw(port, ninth, strlen(ninth), &r, 5);
        if (r.status == 0)
            break;
        sleep(1);
    }
    CHECK(r.status == 0, "a ninth connection from the same client gets no reply (%d)", r.status);
    rh_free(&r);
    int fd = connect_from("127.0.0.2", port);
    const char *get = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    char *raw = NULL;
    if (fd >= 0 && rh_send_all(fd, get, strlen(get)) == 0)
        rh_read_all(fd, &raw, NULL);
    CHECK(raw && strstr(raw, " 200 "), "another client (127.0.0.2) is served: %.80s", raw ? raw : "(nothing)");
    free(raw);
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 8; i++)
        if (idle[i] >= 0)
            close(idle[i]);
    nanosleep(&settle, NULL);
    http_server_release(srv);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("HTTP_TEST_DEBUG"))
        log_set_level(LOG_DEBUG);
    struct bg b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cond, NULL);

    RUN(test_json_depth);
    RUN(test_json_values);
    RUN(test_sse_format);
    RUN(test_route_errors, &b);
    RUN(test_error_shape);

    struct http_config cfg = {
        .max_body_bytes = 4096,
        .max_json_depth = 8,
        .stream_queue_bytes = 64 * 1024,
        .keepalive_ms = 100,
        .idle_timeout_s = 5,
        .access_log = true,
    };
    struct http_server *srv = start_server(&cfg, &b);
    if (srv) {
        uint16_t port = http_server_port(srv);
        RUN(test_routing, port);
        RUN(test_loopback_addr);
        RUN(test_host, port);
        RUN(test_twice, port, &b);
        RUN(test_access_log, port);
        RUN(test_keepalive_connection, port);
        RUN(test_json, port);
        RUN(test_body_limit, port);
        RUN(test_sse100, port, &b);
        RUN(test_ndjson, port, &b);
        RUN(test_curl, port, &b);
        RUN(test_sse_keepalive, port, &b);
        RUN(test_disconnect_mid_stream, port, &b);
        RUN(test_disconnect_early, port, &b, "/idle");
        RUN(test_disconnect_early, port, &b, "/defer_wait");
        RUN(test_disconnect_early, port, &b, "/late_cb");
        RUN(test_head_stream, port, &b);
        RUN(test_defer, port, &b);
        RUN(test_slow_client, port, &b);
        RUN(test_garbage, port);
        RUN(test_concurrent, port);
        http_server_release(srv);
    }
    RUN(test_deadlines, &b);
    RUN(test_per_client, &b);
    RUN(test_auth_cors, &b);
    RUN(test_allowed_hosts, &b);
    RUN(test_ipv6, &b);
    RUN(test_stop, &b);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cond);
    return test_main_end();
}
