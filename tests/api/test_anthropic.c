/* The Anthropic Messages endpoint over a real HTTP server on 127.0.0.1 and a fake
 * generation backend written here: request fields into the common parameters, reply
 * shapes (whole, and streamed events that accumulate to the same message), tool use
 * both ways, thinking, stop sequences, errors, and cancellation when the client hangs up
 * or the server stops. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/anthropic.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "testutil.h"

#define IO_TIMEOUT_S 10

/* ---------- the fake backend ---------- */

enum script {
    S_TEXT,       /* "Hel" "lo" " world", stop */
    S_THINK,      /* reasoning "Let me " "think.", then "Answer" */
    S_TOOL,       /* one tool call get_weather {"city": "Paris", "days": 2} */
    S_LENGTH,     /* "abc", length */
    S_ERR_BEFORE, /* ERROR 503 before START */
    S_ERR_AFTER,  /* START, "partial", ERROR 500 */
    S_SEQ_ERROR,  /* START, "x", SEQ_DONE finish "error", END */
    S_HANG,       /* START, "x", then nothing until cancelled */
    S_HANG_EARLY, /* nothing until cancelled */
    S_STOPSEQ,    /* "abc", stop on "END" */
    S_MODELSTOP,  /* "abc", stop on the model's own "<|im_end|>" */
    S_MIXED,      /* reasoning "Plan.", text "Calling.", two tool calls */
    S_EMPTY,      /* START, SEQ_DONE, END: no text at all */
};

struct fake;

struct fake_req {
    struct fake *f;
    gen_event_fn fn;
    void *ctx;
    uint64_t handle;
    int script;
    pthread_t th;
    bool cancelled, in_cb, ended;
    int cancels;
    struct fake_req *next;
};

struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int script;                  /* of the next submit */
    int refuse_status;           /* submit refuses with this status when not 0 */
    const char *refuse_msg;      /* and this message */
    int submit_delay_ms;         /* submit sleeps this long first (in_submit set) */
    bool in_submit;
    struct textgen_params last;  /* of the last submit */
    int submits, cancels, cancels_after_end;
    uint64_t next_handle;
    struct fake_req *reqs;
    json_t *models;
};

/* Delivers one event unless cancelled; false once cancelled. */
static bool emit(struct fake_req *q, const struct gen_event *ev)
{
    struct fake *f = q->f;
    pthread_mutex_lock(&f->mu);
    if (q->cancelled) {
        pthread_mutex_unlock(&f->mu);
        return false;
    }
    q->in_cb = true;
    pthread_mutex_unlock(&f->mu);
    q->fn(q->ctx, ev);
    pthread_mutex_lock(&f->mu);
    q->in_cb = false;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    usleep(1000);
    return true;
}

static void wait_cancel(struct fake_req *q)
{
    struct fake *f = q->f;
    int64_t until = clock_ns() + 20 * (int64_t)1000000000;
    pthread_mutex_lock(&f->mu);
    while (!q->cancelled && clock_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&f->cond, &f->mu, &ts);
    }
    pthread_mutex_unlock(&f->mu);
}

static void *fake_main(void *arg)
{
    struct fake_req *q = arg;
    struct gen_event start = {.kind = GEN_EVENT_START, .usage = {.prompt_tokens = 7, .cached_tokens = 2}};
    struct gen_event end = {.kind = GEN_EVENT_END, .usage = {.prompt_tokens = 7, .cached_tokens = 2}};
    struct gen_event d = {.kind = GEN_EVENT_DELTA, .content = "", .reasoning = ""};
    struct gen_event done = {.kind = GEN_EVENT_SEQ_DONE, .finish = "stop"};
    struct gen_event err = {.kind = GEN_EVENT_ERROR};
    json_t *calls = NULL;
    bool ok = true;
    switch (q->script) {
    case S_TEXT:
    case S_THINK:
    case S_LENGTH: {
        const char *const text[] = {"Hel", "lo", " world"};
        ok = emit(q, &start);
        if (q->script == S_THINK) {
            d.reasoning = "Let me ";
            ok = ok && emit(q, &d);
            d.reasoning = "think.";
            ok = ok && emit(q, &d);
            d.reasoning = "";
            d.content = "Answer";
            ok = ok && emit(q, &d);
        } else if (q->script == S_LENGTH) {
            d.content = "abc";
            ok = ok && emit(q, &d);
            done.finish = "length";
        } else {
            for (int i = 0; i < 3 && ok; i++) {
                d.content = text[i];
                ok = emit(q, &d);
            }
        }
        done.usage.completion_tokens = end.usage.completion_tokens = 3;
        ok = ok && emit(q, &done) && emit(q, &end);
        break;
    }
    case S_TOOL:
        calls = json_loads("[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":2}\"}}]",
                           0, NULL);
        done.finish = "tool_calls";
        done.tool_calls = calls;
        done.usage.completion_tokens = end.usage.completion_tokens = 12;
        ok = emit(q, &start) && emit(q, &d) && emit(q, &done) && emit(q, &end);
        break;
    case S_ERR_BEFORE:
        err.status = 503;
        err.message = "no instance ready";
        emit(q, &err);
        break;
    case S_ERR_AFTER:
        d.content = "partial";
        err.status = 500;
        err.message = "runner failed";
        ok = emit(q, &start) && emit(q, &d) && emit(q, &err);
        break;
    case S_SEQ_ERROR:
        d.content = "x";
        done.finish = "error";
        ok = emit(q, &start) && emit(q, &d) && emit(q, &done) && emit(q, &end);
        break;
    case S_HANG:
        d.content = "x";
        if (emit(q, &start) && emit(q, &d))
            wait_cancel(q);
        ok = emit(q, &end); /* only when never cancelled (a failed test) */
        break;
    case S_HANG_EARLY:
        wait_cancel(q);
        ok = emit(q, &end);
        break;
    case S_STOPSEQ:
    case S_MODELSTOP:
        d.content = "abc";
        done.stop_sequence = q->script == S_STOPSEQ ? "END" : "<|im_end|>";
        done.usage.completion_tokens = end.usage.completion_tokens = 2;
        ok = emit(q, &start) && emit(q, &d) && emit(q, &done) && emit(q, &end);
        break;
    case S_MIXED:
        calls = json_loads("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"\",\"type\":\"function\","
                           "\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]",
                           0, NULL);
        d.reasoning = "Plan.";
        ok = emit(q, &start) && emit(q, &d);
        d.reasoning = "";
        d.content = "Calling.";
        done.finish = "tool_calls";
        done.tool_calls = calls;
        done.usage.completion_tokens = end.usage.completion_tokens = 20;
        ok = ok && emit(q, &d) && emit(q, &done) && emit(q, &end);
        break;
    case S_EMPTY:
        ok = emit(q, &start) && emit(q, &done) && emit(q, &end);
        break;
    }
    (void)ok;
    json_decref(calls);
    pthread_mutex_lock(&q->f->mu);
    q->ended = true;
    pthread_cond_broadcast(&q->f->cond);
    pthread_mutex_unlock(&q->f->mu);
    return NULL;
}

static int fake_submit(void *self, struct textgen_params *p, gen_event_fn fn, void *ctx, uint64_t *handle,
                       char *err, size_t errlen)
{
    struct fake *f = self;
    pthread_mutex_lock(&f->mu);
    int delay = f->submit_delay_ms;
    f->in_submit = delay > 0;
    pthread_mutex_unlock(&f->mu);
    if (delay)
        usleep((useconds_t)delay * 1000);
    pthread_mutex_lock(&f->mu);
    f->in_submit = false;
    f->submits++;
    textgen_params_clear(&f->last);
    f->last = *p;
    memset(p, 0, sizeof *p);
    if (f->refuse_status) {
        int st = f->refuse_status;
        pthread_mutex_unlock(&f->mu);
        snprintf(err, errlen, "%s", f->refuse_msg);
        return st;
    }
    struct fake_req *q = calloc(1, sizeof *q);
    q->f = f;
    q->fn = fn;
    q->ctx = ctx;
    q->handle = ++f->next_handle;
    q->script = f->script;
    q->next = f->reqs;
    f->reqs = q;
    *handle = q->handle;
    pthread_create(&q->th, NULL, fake_main, q);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static void fake_cancel(void *self, uint64_t handle)
{
    struct fake *f = self;
    pthread_mutex_lock(&f->mu);
    for (struct fake_req *q = f->reqs; q; q = q->next) {
        if (q->handle != handle)
            continue;
        if (q->ended)
            f->cancels_after_end++;
        f->cancels++;
        q->cancels++;
        q->cancelled = true;
        pthread_cond_broadcast(&f->cond);
        while (q->in_cb && !pthread_equal(q->th, pthread_self()))
            pthread_cond_wait(&f->cond, &f->mu);
    }
    pthread_mutex_unlock(&f->mu);
}

static json_t *fake_models(void *self)
{
    struct fake *f = self;
    pthread_mutex_lock(&f->mu);
    json_t *m = json_deep_copy(f->models);
    pthread_mutex_unlock(&f->mu);
    return m;
}

static const struct gen_ops fake_ops = {fake_submit, fake_cancel, fake_models};

/* The request with the newest handle. */
static struct fake_req *fake_newest(struct fake *f)
{
    pthread_mutex_lock(&f->mu);
    struct fake_req *q = f->reqs;
    pthread_mutex_unlock(&f->mu);
    return q;
}

static int fake_req_cancels(struct fake *f, struct fake_req *q)
{
    pthread_mutex_lock(&f->mu);
    int n = q ? q->cancels : -1;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* Waits up to ms for request q to be cancelled count times. */
static bool wait_cancels(struct fake *f, struct fake_req *q, int count, int ms)
{
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    while (clock_ns() < until) {
        if (fake_req_cancels(f, q) >= count)
            return true;
        usleep(2000);
    }
    return fake_req_cancels(f, q) >= count;
}

static void fake_release(struct fake *f)
{
    for (struct fake_req *q = f->reqs, *next; q; q = next) {
        next = q->next;
        pthread_join(q->th, NULL);
        free(q);
    }
    f->reqs = NULL;
    textgen_params_clear(&f->last);
    json_decref(f->models);
}

/* ---------- a small HTTP client ---------- */

struct resp {
    int status;
    char head[4096];
    char *body; /* decoded, malloc'd */
    size_t body_len;
};

static int tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = IO_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static int send_request(int fd, const char *method, const char *path, const char *ctype, const char *body)
{
    size_t blen = body ? strlen(body) : 0;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%sContent-Length: %zu\r\n\r\n",
                     method, path, ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "", blen);
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n)
        return -1;
    for (size_t off = 0; off < blen;) {
        ssize_t w = send(fd, body + off, blen - off, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

/* Decodes a chunked body in place into out. */
static void dechunk(const char *p, size_t n, char *out, size_t *out_len)
{
    size_t i = 0, len = 0;
    while (i < n) {
        char *end;
        unsigned long sz = strtoul(p + i, &end, 16);
        const char *crlf = memmem(p + i, n - i, "\r\n", 2);
        if (!crlf || end == p + i || sz == 0)
            break;
        i = (size_t)(crlf - p) + 2;
        if (i + sz > n)
            sz = n - i;
        memcpy(out + len, p + i, sz);
        len += sz;
        i += sz + 2;
    }
    out[len] = 0;
    *out_len = len;
}

/* One request; reads the reply until the server closes. ctype NULL sends none. */
static void request(uint16_t port, const char *method, const char *path, const char *ctype, const char *body,
                    struct resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = tcp_connect(port);
    if (fd < 0 || send_request(fd, method, path, ctype, body) != 0) {
        if (fd >= 0)
            close(fd);
        r->body = calloc(1, 1);
        return;
    }
    size_t cap = 1 << 16, n = 0;
    char *raw = malloc(cap + 1);
    for (;;) {
        if (n == cap)
            raw = realloc(raw, (cap *= 2) + 1);
        ssize_t got = recv(fd, raw + n, cap - n, 0);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    raw[n] = 0;
    char *hend = memmem(raw, n, "\r\n\r\n", 4);
    r->body = malloc(n + 1);
    r->body[0] = 0;
    if (hend && sscanf(raw, "HTTP/1.%*d %d", &r->status) == 1) {
        size_t hl = (size_t)(hend - raw) + 2;
        snprintf(r->head, sizeof r->head, "%.*s", (int)hl, raw);
        const char *b = hend + 4;
        size_t bl = n - (size_t)(b - raw);
        if (strcasestr(r->head, "Transfer-Encoding: chunked")) {
            dechunk(b, bl, r->body, &r->body_len);
        } else {
            memcpy(r->body, b, bl);
            r->body[bl] = 0;
            r->body_len = bl;
        }
    }
    free(raw);
}

static void post(uint16_t port, const char *path, const char *body, struct resp *r)
{
    request(port, "POST", path, "application/json", body, r);
}

static void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

static json_t *body_json(const struct resp *r) { return json_loads(r->body ? r->body : "", 0, NULL); }

static const char *jstr(const json_t *j, const char *key) { return json_string_value(json_object_get(j, key)); }

static long long jint(const json_t *j, const char *key) { return json_integer_value(json_object_get(j, key)); }

static bool streq(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* JSON equality of a value and JSON text, printing both when they differ. */
static bool json_same(const json_t *got, const char *want_text)
{
    json_t *want = json_loads(want_text, JSON_DECODE_ANY, NULL);
    bool same = want && got && json_equal((json_t *)got, want);
    if (!same) {
        char *g = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        char *w = want ? json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        fprintf(stderr, "  got:  %s\n  want: %s\n", g ? g : "(null)", w ? w : "(bad want)");
        free(g);
        free(w);
    }
    json_decref(want);
    return same;
}


static struct fake F;
static struct gen G = {&fake_ops, &F};

/* The events of an SSE body: [{"event": name, "data": parsed data}], comments skipped;
 * *comments counts the comment lines. */
static json_t *sse_events(const char *body, int *comments)
{
    json_t *arr = json_array();
    *comments = 0;
    const char *p = body;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        size_t blen = end ? (size_t)(end - p) : strlen(p);
        char *block = strndup(p, blen);
        const char *event = NULL, *data = NULL;
        for (char *save = NULL, *line = strtok_r(block, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (line[0] == ':')
                (*comments)++;
            else if (!strncmp(line, "event: ", 7))
                event = line + 7;
            else if (!strncmp(line, "data: ", 6))
                data = line + 6;
        }
        if (event || data) {
            json_t *d = data ? json_loads(data, 0, NULL) : NULL;
            json_array_append_new(arr, json_pack("{s:s?,s:o?}", "event", event, "data", d));
        }
        free(block);
        p = end ? end + 2 : p + blen;
    }
    return arr;
}

/* Rebuilds the message from stream events the way the SDKs accumulate them; NULL when
 * the events come in an order they refuse. */
static json_t *accumulate(const json_t *events)
{
    json_t *msg = NULL;
    json_t *partial = json_object(); /* block index -> accumulated input JSON text */
    size_t i;
    const json_t *e;
    bool bad = false;
    json_array_foreach(events, i, e) {
        const json_t *d = json_object_get(e, "data");
        const char *type = jstr(d, "type");
        if (!streq(type, jstr(e, "event")))
            bad = true;
        if (streq(type, "message_start")) {
            bad |= msg != NULL;
            msg = json_deep_copy(json_object_get(d, "message"));
            continue;
        }
        if (!msg || streq(type, "ping"))
            continue;
        json_t *content = json_object_get(msg, "content");
        size_t idx = (size_t)jint(d, "index");
        json_t *block = json_array_get(content, idx);
        const json_t *delta = json_object_get(d, "delta");
        char key[16];
        snprintf(key, sizeof key, "%zu", idx);
        if (streq(type, "content_block_start")) {
            bad |= idx != json_array_size(content);
            json_array_append_new(content, json_deep_copy(json_object_get(d, "content_block")));
        } else if (streq(type, "content_block_delta") && block) {
            const char *dt = jstr(delta, "type");
            const char *field = streq(dt, "text_delta") ? "text" : streq(dt, "thinking_delta") ? "thinking" : NULL;
            if (field) {
                char *joined = NULL;
                bad |= asprintf(&joined, "%s%s", jstr(block, field) ? jstr(block, field) : "", jstr(delta, field)) < 0;
                json_object_set_new(block, field, json_string(joined));
                free(joined);
            } else if (streq(dt, "input_json_delta")) {
                char *joined = NULL;
                const char *had = jstr(partial, key);
                bad |= asprintf(&joined, "%s%s", had ? had : "", jstr(delta, "partial_json")) < 0;
                json_object_set_new(partial, key, json_string(joined));
                free(joined);
            } else {
                bad = true;
            }
        } else if (streq(type, "content_block_stop") && block) {
            if (jstr(partial, key))
                json_object_set_new(block, "input", json_loads(jstr(partial, key), 0, NULL));
        } else if (streq(type, "message_delta")) {
            json_object_set(msg, "stop_reason", json_object_get(delta, "stop_reason"));
            json_object_set(msg, "stop_sequence", json_object_get(delta, "stop_sequence"));
            json_object_set(json_object_get(msg, "usage"), "output_tokens",
                            json_object_get(json_object_get(d, "usage"), "output_tokens"));
        } else if (!streq(type, "message_stop")) {
            bad = true;
        }
    }
    json_decref(partial);
    if (bad) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

/* The event names of a stream, space-separated. */
static void event_names(const json_t *events, char *buf, size_t cap)
{
    buf[0] = 0;
    size_t i;
    const json_t *e;
    json_array_foreach(events, i, e) {
        const char *name = jstr(e, "event");
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", len ? " " : "", name ? name : "?");
    }
}

/* A copy of msg without its id, and with generated tool_use ids ("toolu_...") as
 * "toolu_*": they are random in each reply. */
static json_t *without_id(const json_t *msg)
{
    json_t *c = json_deep_copy(msg);
    json_object_del(c, "id");
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(c, "content"), i, b)
        if (jstr(b, "id") && !strncmp(jstr(b, "id"), "toolu_", 6))
            json_object_set_new(b, "id", json_string("toolu_*"));
    return c;
}

/* One request, streamed and whole, with the same script: the stream must accumulate to
 * the whole reply. Returns the whole reply (the caller frees it); *events gets the
 * stream's events when not NULL. */
static json_t *both_ways(uint16_t port, int script, const char *body_fmt, json_t **events)
{
    char body[4096];
    struct resp r;
    F.script = script;
    snprintf(body, sizeof body, body_fmt, "false");
    post(port, "/v1/messages", body, &r);
    CHECK(r.status == 200 && strcasestr(r.head, "Content-Type: application/json"), "whole reply: %d %s", r.status,
          r.body);
    json_t *whole = body_json(&r);
    resp_free(&r);
    snprintf(body, sizeof body, body_fmt, "true");
    post(port, "/v1/messages", body, &r);
    CHECK(r.status == 200 && strcasestr(r.head, "Content-Type: text/event-stream"), "stream: %d %s", r.status,
          r.head);
    int comments;
    json_t *ev = sse_events(r.body, &comments);
    json_t *acc = accumulate(ev);
    json_t *a = acc ? without_id(acc) : NULL, *w = whole ? without_id(whole) : NULL;
    bool same = a && w && json_equal(a, w);
    char *as = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *ws = w ? json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(same, "stream accumulates to the whole reply:\n  stream %s\n  whole  %s", as ? as : "(bad order)",
          ws ? ws : "(null)");
    const char *id = jstr(acc, "id");
    CHECK(id && !strncmp(id, "msg_", 4) && strlen(id) == 28 && !streq(id, jstr(whole, "id")), "message ids %s %s",
          id, jstr(whole, "id"));
    free(as);
    free(ws);
    json_decref(a);
    json_decref(w);
    json_decref(acc);
    resp_free(&r);
    if (events)
        *events = ev;
    else
        json_decref(ev);
    return whole;
}

static const char *BASIC = "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,"
                           "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

static void test_mapping(uint16_t port)
{
    F.script = S_TEXT;
    const char *body =
        "{\"model\":\"qwen3\",\"max_tokens\":256,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":10,"
        "\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],\"metadata\":{\"user_id\":\"u1\"},"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\",\"cache_control\":{\"type\":\"ephemeral\"}},"
        "{\"type\":\"text\",\"text\":\"Use tools.\"}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather\",\"input_schema\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"}}}},{\"name\":\"get_time\",\"input_schema\":{\"type\":"
        "\"object\"},\"type\":\"custom\"}],\"tool_choice\":{\"type\":\"auto\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"need the tool\",\"signature\":\"s\"},"
        "{\"type\":\"redacted_thinking\",\"data\":\"x\"},{\"type\":\"text\",\"text\":\"Checking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"is_error\":true,\"content\":[{\"type\":\"text\","
        "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},{\"type\":\"text\",\"text\":\"Thanks.\"},"
        "{\"type\":\"text\",\"text\":\"And tomorrow?\"}]}]}";
    struct resp r;
    post(port, "/v1/messages", body, &r);
    CHECK_EQ_INT(r.status, 200);
    const struct textgen_params *p = &F.last;
    CHECK(streq(p->model, "qwen3"), "model %s", p->model);
    CHECK(json_same(p->messages,
                    "[{\"role\":\"system\",\"content\":\"Be brief.\\nUse tools.\"},"
                    "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                    "{\"role\":\"assistant\",\"content\":\"Checking.\",\"reasoning_content\":\"need the tool\","
                    "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                    "\"arguments\":{\"city\":\"Paris\"}}}]},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"toolu_2\",\"content\":\"a\\nb\"},"
                    "{\"role\":\"user\",\"content\":\"Thanks.\\nAnd tomorrow?\"}]"),
          "messages in the common form");
    CHECK(json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
                              "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                              "\"string\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\","
                              "\"parameters\":{\"type\":\"object\"}}}]"),
          "tools as functions");
    CHECK(json_same(p->template_kwargs, "{\"enable_thinking\":true}"), "thinking enabled");
    CHECK_EQ_INT(p->max_tokens, 256);
    CHECK(p->n_stop == 2 && streq(p->stop[0], "END") && streq(p->stop[1], "\n\nHuman:"), "stop sequences");
    CHECK(p->sampling.temperature == 0.5f && p->sampling.top_p == 0.9f && p->sampling.top_k == 10 && p->n == 1,
          "sampling t %g p %g k %d", p->sampling.temperature, p->sampling.top_p, p->sampling.top_k);
    uint64_t seed = p->sampling.seed;
    json_t *j = body_json(&r);
    CHECK(json_same(json_object_get(j, "content"), "[{\"type\":\"text\",\"text\":\"Hello world\"}]"), "content");
    CHECK(streq(jstr(j, "type"), "message") && streq(jstr(j, "role"), "assistant") && streq(jstr(j, "model"), "qwen3") &&
              streq(jstr(j, "stop_reason"), "end_turn") && json_is_null(json_object_get(j, "stop_sequence")),
          "message fields");
    CHECK(json_same(json_object_get(j, "usage"), "{\"input_tokens\":5,\"output_tokens\":3,"
                                                 "\"cache_read_input_tokens\":2,\"cache_creation_input_tokens\":0}"),
          "usage: uncached input, output, cache reads");
    json_decref(j);
    resp_free(&r);

    /* Defaults: no stops, no tools, no kwargs, a fresh random seed. */
    post(port, "/v1/messages",
         "{\"model\":\"qwen3\",\"max_tokens\":99999999999,\"thinking\":{\"type\":\"disabled\"},"
         "\"tool_choice\":{\"type\":\"none\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
         "\"system\":\"sys\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
         &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(p->n_stop == 0 && !p->tools && json_same(p->template_kwargs, "{\"enable_thinking\":false}") &&
              p->max_tokens == RUNNER_MAX_GENERATE && p->sampling.seed != seed && p->sampling.seed < ((uint64_t)1 << 53),
          "tool_choice none, thinking disabled, max_tokens capped, random seed");
    CHECK(json_same(p->messages, "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"\"}]"),
          "string system, empty user content");
    resp_free(&r);

    post(port, "/v1/messages",
         "{\"model\":\"qwen3\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\"},"
         "\"tools\":[{\"name\":\"a\",\"input_schema\":{}},{\"name\":\"b\",\"input_schema\":{\"type\":\"object\"}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         &r);
    CHECK(r.status == 200 && json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":"
                                                 "{\"type\":\"object\"}}}]"),
          "tool_choice tool keeps the named tool");
    resp_free(&r);
}

static void test_streams(uint16_t port)
{
    json_t *events = NULL;
    char names[1024];
    json_t *w = both_ways(port, S_TEXT, BASIC, &events);
    event_names(events, names, sizeof names);
    CHECK(streq(names, "message_start ping content_block_start content_block_delta content_block_delta "
                       "content_block_delta content_block_stop message_delta message_stop"),
          "text stream events: %s", names);
    const json_t *start = json_object_get(json_array_get(events, 0), "data");
    const char *start_id = jstr(json_object_get(start, "message"), "id");
    char want_start[512];
    snprintf(want_start, sizeof want_start,
             "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
             "\"model\":\"qwen3\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
             "\"input_tokens\":5,\"output_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2}}}",
             start_id ? start_id : "");
    CHECK(json_same(start, want_start), "message_start");
    CHECK(json_same(json_object_get(json_array_get(events, 3), "data"),
                    "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}"),
          "text delta");
    CHECK(json_same(json_object_get(json_array_get(events, 7), "data"),
                    "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},"
                    "\"usage\":{\"output_tokens\":3}}"),
          "message_delta");
    json_decref(events);
    json_decref(w);

    /* Thinking, text and two tool calls in one reply. */
    w = both_ways(port, S_MIXED, BASIC, &events);
    event_names(events, names, sizeof names);
    CHECK(streq(names, "message_start ping content_block_start content_block_delta content_block_stop "
                       "content_block_start content_block_delta content_block_stop content_block_start "
                       "content_block_delta content_block_stop content_block_start content_block_delta "
                       "content_block_stop message_delta message_stop"),
          "mixed stream events: %s", names);
    json_t *content = json_object_get(w, "content");
    const char *id2 = jstr(json_array_get(content, 3), "id");
    CHECK(id2 && !strncmp(id2, "toolu_", 6) && strlen(id2) == 30, "a generated tool_use id: %s", id2 ? id2 : "(null)");
    char want[1024];
    snprintf(want, sizeof want,
             "[{\"type\":\"thinking\",\"thinking\":\"Plan.\",\"signature\":\"\"},{\"type\":\"text\",\"text\":"
             "\"Calling.\"},{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"get_weather\",\"input\":{\"city\":"
             "\"Paris\"}},{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":\"get_time\",\"input\":{}}]",
             id2 ? id2 : "");
    CHECK(json_same(content, want), "thinking, text, tool_use blocks");
    CHECK(streq(jstr(w, "stop_reason"), "tool_use") && jint(json_object_get(w, "usage"), "output_tokens") == 20,
          "stop_reason tool_use");
    CHECK(json_same(json_object_get(json_array_get(events, 8), "data"),
                    "{\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":"
                    "\"call_1\",\"name\":\"get_weather\",\"input\":{}}}") &&
              json_same(json_object_get(json_array_get(events, 9), "data"),
                        "{\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\","
                        "\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}") &&
              json_same(json_object_get(json_array_get(events, 2), "data"),
                        "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\","
                        "\"thinking\":\"\",\"signature\":\"\"}}") &&
              json_same(json_object_get(json_array_get(events, 3), "data"),
                        "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\","
                        "\"thinking\":\"Plan.\"}}"),
          "tool_use and thinking events");
    json_decref(events);
    json_decref(w);

    w = both_ways(port, S_EMPTY, BASIC, NULL);
    CHECK(json_same(json_object_get(w, "content"), "[{\"type\":\"text\",\"text\":\"\"}]"), "empty reply: one text block");
    json_decref(w);
    w = both_ways(port, S_THINK, BASIC, NULL);
    CHECK(json_same(json_object_get(w, "content"), "[{\"type\":\"thinking\",\"thinking\":\"Let me think.\","
                                                   "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Answer\"}]"),
          "thinking then text");
    json_decref(w);
    w = both_ways(port, S_LENGTH, BASIC, NULL);
    CHECK(streq(jstr(w, "stop_reason"), "max_tokens"), "length -> max_tokens");
    json_decref(w);
    w = both_ways(port, S_STOPSEQ,
                  "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,\"stop_sequences\":[\"STOP\",\"END\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  NULL);
    CHECK(streq(jstr(w, "stop_reason"), "stop_sequence") && streq(jstr(w, "stop_sequence"), "END"),
          "the client's stop sequence: %s %s", jstr(w, "stop_reason"), jstr(w, "stop_sequence"));
    json_decref(w);
    w = both_ways(port, S_MODELSTOP,
                  "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,\"stop_sequences\":[\"END\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  NULL);
    CHECK(streq(jstr(w, "stop_reason"), "end_turn") && json_is_null(json_object_get(w, "stop_sequence")),
          "the model's own stop is end_turn");
    json_decref(w);

    /* Tool round trip: the reply's content goes back as the assistant turn. */
    w = both_ways(port, S_TOOL, BASIC, NULL);
    json_t *req = json_loads("{\"model\":\"qwen3\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":"
                             "\"w\"}]}",
                             0, NULL);
    json_t *msgs = json_object_get(req, "messages");
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", json_object_get(w, "content")));
    json_array_append_new(msgs, json_loads("{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
                                           "\"call_abc\",\"content\":\"21C\"}]}",
                                           0, NULL));
    char *text = json_dumps(req, JSON_COMPACT);
    struct resp r;
    F.script = S_TEXT;
    post(port, "/v1/messages", text, &r);
    CHECK(r.status == 200 && json_same(F.last.messages,
                                       "[{\"role\":\"user\",\"content\":\"w\"},{\"role\":\"assistant\",\"content\":\"\","
                                       "\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":"
                                       "\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]},{\"role\":"
                                       "\"tool\",\"tool_call_id\":\"call_abc\",\"content\":\"21C\"}]"),
          "tool round trip");
    resp_free(&r);
    free(text);
    json_decref(req);
    json_decref(w);
}

static bool error_shape(const json_t *j, const char *type, const char *prefix)
{
    const json_t *e = json_object_get(j, "error");
    const char *msg = jstr(e, "message");
    return json_object_size(j) == 2 && streq(jstr(j, "type"), "error") && json_object_size(e) == 2 &&
           streq(jstr(e, "type"), type) && msg && strncmp(msg, prefix, strlen(prefix)) == 0;
}

static void test_errors(uint16_t port)
{
    const struct {
        const char *body;
        int status;
        const char *error; /* expected message prefix */
    } cases[] = {
        {"[1]", 400, "request body: expected a JSON object"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "model: field required"},
        {"{\"model\":7,\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "model: expected"},
        {"{\"model\":\"q\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens: field required"},
        {"{\"model\":\"q\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "max_tokens: expected an integer >= 1"},
        {"{\"model\":\"q\",\"max_tokens\":-5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":\"100\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":5}", 400, "messages: field required"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[]}", 400, "messages: expected a non-empty array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":{}}", 400, "messages: expected a non-empty array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[3]}", 400, "messages[0]: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400,
         "messages[0].role"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
         "messages[0].content: expected a string or an array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400,
         "messages[0].content[0].type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
         "\"source\":{}}]}]}",
         400, "messages[0].content[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"document\"}]}]}",
         400, "messages[0].content[0]: document content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
         400, "messages[0].content[0].text"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
         400, "messages[0].content[0].tool_use_id"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\"}]}]}]}",
         400, "messages[0].content[0].content[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\",\"is_error\":\"no\"}]}]}",
         400, "messages[0].content[0].is_error"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"f\",\"input\":{}}]}]}",
         400, "messages[0].content[0].type: tool_use blocks belong to assistant messages"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"f\",\"input\":\"x\"}]}]}",
         400, "messages[0].content[0].input: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"name\":\"f\",\"input\":{}}]}]}",
         400, "messages[0].content[0].id"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\"}]}]}",
         400, "messages[0].content[0].type: tool_result blocks belong to user messages"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}", 400,
         "messages[0].content[0].type: unsupported content block type 'video'"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "system: expected a string or an array of text blocks"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "system[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "temperature: expected a number in [0, 1]"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"temperature\":\"hot\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "temperature"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"top_p\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "top_p"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"top_k\":-1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "top_k"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":[\"\"],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences[0]"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
         "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences: expected an array of at most 16"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "tools: expected an array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"name\":\"f\"}],\"messages\":[{\"role\":\"user\",\"content\":"
         "\"x\"}]}",
         400, "tools[0].input_schema"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"input_schema\":{}}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "tools[0].name"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tools[0].type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tool_choice: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"maybe\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "tool_choice.type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"},\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tool_choice.name: no tool named 'nope'"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":\"on\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "thinking: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":{\"type\":\"sometimes\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "thinking.type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":0},\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "thinking.budget_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stream\":\"yes\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stream"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"metadata\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "metadata"},
        {"{\"model\":\"no such model!\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'no such model!' not found"},
    };
    int submits = F.submits;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct resp r;
        post(port, "/v1/messages", cases[i].body, &r);
        json_t *j = body_json(&r);
        const char *type = cases[i].status == 404 ? "not_found_error" : "invalid_request_error";
        CHECK(r.status == cases[i].status && error_shape(j, type, cases[i].error), "%s: %d %s, want %d %s",
              cases[i].body, r.status, r.body, cases[i].status, cases[i].error);
        json_decref(j);
        resp_free(&r);
    }
    CHECK_EQ_INT(F.submits, submits); /* nothing reached the backend */

    /* Refusals by the backend at submit, as Anthropic words them. */
    const struct {
        int backend;
        const char *msg;
        int status;
        const char *type, *error;
    } refusals[] = {
        {404, "model 'qwen9' not found", 404, "not_found_error", "model 'qwen9' not found"},
        {413, "prompt is too long: 9000 tokens > 4096", 400, "invalid_request_error", "prompt is too long: 9000 tokens"},
        {413, "9000 tokens > 4096", 400, "invalid_request_error", "prompt is too long: 9000 tokens > 4096"},
        {503, "busy", 529, "overloaded_error", "busy"},
        {500, "boom", 500, "api_error", "boom"},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        struct resp r;
        F.refuse_status = refusals[i].backend;
        F.refuse_msg = refusals[i].msg;
        post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                                   "\"content\":\"x\"}]}",
             &r);
        json_t *j = body_json(&r);
        CHECK(r.status == refusals[i].status && error_shape(j, refusals[i].type, refusals[i].error) &&
                  (refusals[i].status != 529 || strcasestr(r.head, "Retry-After: 1")),
              "refusal %d: %d %s", refusals[i].backend, r.status, r.body);
        json_decref(j);
        resp_free(&r);
    }
    F.refuse_status = 0;

    /* ERROR before START: a plain error reply; after START: an error event ends the
     * stream, and a whole reply gets the status. */
    struct resp r;
    F.script = S_ERR_BEFORE;
    post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}]}",
         &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 529 && error_shape(j, "overloaded_error", "no instance ready") &&
              strcasestr(r.head, "Content-Type: application/json"),
          "error before start: %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);
    F.script = S_ERR_AFTER;
    post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}]}",
         &r);
    int comments;
    json_t *events = sse_events(r.body, &comments);
    char names[512];
    event_names(events, names, sizeof names);
    CHECK(r.status == 200 && streq(names, "message_start ping content_block_start content_block_delta error") &&
              error_shape(json_object_get(json_array_get(events, 4), "data"), "api_error", "runner failed"),
          "error after start, streamed: %s", names);
    json_decref(events);
    resp_free(&r);
    post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         &r);
    j = body_json(&r);
    CHECK(r.status == 500 && error_shape(j, "api_error", "runner failed"), "error after start, whole: %d %s", r.status,
          r.body);
    json_decref(j);
    resp_free(&r);
    F.script = S_SEQ_ERROR;
    post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         &r);
    j = body_json(&r);
    CHECK(r.status == 500 && error_shape(j, "api_error", "generation failed"), "a sequence that failed: %d %s",
          r.status, r.body);
    json_decref(j);
    resp_free(&r);

    /* Bodies that are not JSON. */
    request(port, "POST", "/v1/messages", NULL, "hello", &r);
    j = body_json(&r);
    CHECK(r.status == 400 && error_shape(j, "invalid_request_error", "request body"), "text body: %d %s", r.status,
          r.body);
    json_decref(j);
    resp_free(&r);
    post(port, "/v1/messages", "{\"model\":", &r);
    CHECK_EQ_INT(r.status, 400);
    resp_free(&r);
}

static int fake_submits(struct fake *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->submits;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void test_disconnects(uint16_t port)
{
    const struct {
        int script;
        const char *body;
        bool wait_bytes;
    } cases[] = {
        {S_HANG, "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         true},
        {S_HANG, "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
        {S_HANG_EARLY,
         "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        F.script = cases[i].script;
        int before = fake_submits(&F);
        int fd = tcp_connect(port);
        CHECK(fd >= 0 && send_request(fd, "POST", "/v1/messages", "application/json", cases[i].body) == 0, "send");
        if (cases[i].wait_bytes) {
            char buf[512];
            CHECK(recv(fd, buf, sizeof buf, 0) > 0, "reply bytes before hanging up");
        } else {
            for (int k = 0; k < 2500 && fake_submits(&F) == before; k++)
                usleep(2000);
            usleep(20 * 1000);
        }
        close(fd);
        CHECK_EQ_INT(fake_submits(&F), before + 1);
        struct fake_req *q = fake_newest(&F);
        CHECK(wait_cancels(&F, q, 1, 5000), "case %zu: cancelled after the client left", i);
        usleep(50 * 1000);
        CHECK_EQ_INT(fake_req_cancels(&F, q), 1);
    }
}

int main(void)
{
    log_set_level(LOG_ERROR);
    pthread_mutex_init(&F.mu, NULL);
    pthread_cond_init(&F.cond, NULL);
    F.models = json_array();

    char err[256] = "";
    struct http_server *srv = NULL;
    struct http_config cfg = {.port = 0, .keepalive_ms = 20};
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    CHECK(anthropic_register(srv, &G, err, sizeof err) == 0, "register: %s", err);
    CHECK(anthropic_register(srv, &G, err, sizeof err) != 0 && strstr(err, "/v1/messages"), "twice: %s", err);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);

    test_mapping(port);
    test_streams(port);
    test_errors(port);
    CHECK_EQ_INT(F.cancels, 0); /* no request that ran to its end was cancelled */
    test_disconnects(port);
    CHECK_EQ_INT(F.cancels, 3);
    CHECK_EQ_INT(F.cancels_after_end, 0);

    /* Idle streams get comments, which clients ignore. */
    F.script = S_HANG;
    int fd = tcp_connect(port);
    CHECK(send_request(fd, "POST", "/v1/messages", "application/json",
                       "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"x\"}]}") == 0,
          "send");
    char buf[8192];
    size_t got = 0;
    int64_t until = clock_ns() + 3 * (int64_t)1000000000;
    while (got < sizeof buf - 1 && clock_ns() < until) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, MSG_DONTWAIT);
        if (n > 0)
            got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf, "\n: ping\n"))
            break;
        usleep(5000);
    }
    CHECK(strstr(buf, "event: message_start") && strstr(buf, "\n: ping\n"), "keepalive comments: %s", buf);

    /* The server stops with that stream open: cancelled once. */
    struct fake_req *q = fake_newest(&F);
    http_server_stop(srv);
    CHECK(wait_cancels(&F, q, 1, 5000) && fake_req_cancels(&F, q) == 1, "stop cancels the open stream once");
    close(fd);
    http_server_release(srv);

    fake_release(&F);
    pthread_mutex_destroy(&F.mu);
    pthread_cond_destroy(&F.cond);
    return test_main_end();
}
