/* Ollama endpoints over a real HTTP server on 127.0.0.1 and a fake generation backend
 * written here: request fields into the common parameters, reply shapes (streamed and
 * whole), tool calls both ways, thinking, the model list, errors, and cancellation when
 * the client hangs up or the server stops. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/ollama.h"

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
#include "cli/cli.h" /* CAIRN_VERSION, to check /api/version against */
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
        snprintf(err, errlen, "prompt is too long: 9000 tokens, the context holds 4096");
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

/* The NDJSON lines of a body as a JSON array (a line that does not parse is null). */
static json_t *ndjson(const struct resp *r)
{
    json_t *arr = json_array();
    const char *p = r->body;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        json_t *j = json_loadb(p, len, 0, NULL);
        json_array_append_new(arr, j ? j : json_null());
        p = nl ? nl + 1 : p + len;
    }
    return arr;
}

static const char *jstr(const json_t *j, const char *key) { return json_string_value(json_object_get(j, key)); }

static long long jint(const json_t *j, const char *key) { return json_integer_value(json_object_get(j, key)); }

static bool streq(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* "2024-01-02T03:04:05.123456789Z". */
static bool is_rfc3339(const char *s)
{
    const char *pat = "dddd-dd-ddTdd:dd:dd.dddddddddZ";
    if (!s || strlen(s) != strlen(pat))
        return false;
    for (size_t i = 0; pat[i]; i++)
        if (pat[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != pat[i])
            return false;
    return true;
}

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

/* ---------- fixture ---------- */

static struct fake F;
static struct gen G = {&fake_ops, &F};
static char tmpdir[64];
static char file_a[128];

static void set_models(void)
{
    char text[4096];
    snprintf(text, sizeof text,
             "[{\"id\":\"qwen3-0.6b-Q8_0\",\"file\":\"%s\",\"bytes\":12345,\"name\":\"Qwen3 0.6B\","
             "\"architecture\":\"qwen3\",\"n_layers\":2,\"hidden_size\":64,\"feed_forward_size\":128,"
             "\"n_head\":4,\"n_head_kv\":2,\"head_dim\":16,\"context_length\":4096,\"vocab_size\":1000,"
             "\"tied_output\":true,\"sha256\":\"abc123\",\"error\":null,\"ready\":true,\"nodes\":[\"n1\"],"
             "\"chat_template\":\"{%% for m in messages %%}{{ m.content }}{%% endfor %%}"
             "{%% if tools %%}T{%% endif %%}{%% if enable_thinking %%}<think>{%% endif %%}\"},"
             "{\"id\":\"mistral:7b\",\"file\":\"/nonexistent/mistral-7b.F16.gguf\",\"bytes\":999,\"name\":\"\","
             "\"architecture\":\"llama\",\"n_layers\":32,\"hidden_size\":4096,\"feed_forward_size\":14336,"
             "\"n_head\":32,\"n_head_kv\":8,\"head_dim\":128,\"context_length\":32768,\"vocab_size\":32000,"
             "\"tied_output\":false,\"sha256\":null,\"error\":null,\"ready\":false,\"nodes\":[],"
             "\"chat_template\":null},"
             "{\"id\":\"broken\",\"file\":\"/x/broken.gguf\",\"bytes\":5,\"error\":\"truncated\",\"ready\":false,"
             "\"nodes\":[]}]",
             file_a);
    F.models = json_loads(text, 0, NULL);
    CHECK(F.models != NULL, "models fixture parses");
}

static const char *M = "qwen3-0.6b-Q8_0:latest";

/* ---------- tests ---------- */

static void test_version(uint16_t port)
{
    struct resp r;
    request(port, "GET", "/api/version", NULL, NULL, &r);
    json_t *j = body_json(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(streq(jstr(j, "version"), CAIRN_VERSION), "version %s, want %s", jstr(j, "version"), CAIRN_VERSION);
    json_decref(j);
    resp_free(&r);
}

static void test_tags_ps_show(uint16_t port)
{
    struct resp r;
    request(port, "GET", "/api/tags", NULL, NULL, &r);
    json_t *j = body_json(&r);
    json_t *models = json_object_get(j, "models");
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_array_size(models), 2); /* the broken file is not listed */
    json_t *a = json_array_get(models, 0), *b = json_array_get(models, 1);
    CHECK(streq(jstr(a, "name"), M) && streq(jstr(a, "model"), M), "untagged id listed as :latest: %s",
          jstr(a, "name"));
    CHECK(streq(jstr(b, "name"), "mistral:7b"), "tagged id listed as is: %s", jstr(b, "name"));
    CHECK_EQ_INT(jint(a, "size"), 12345);
    CHECK(streq(jstr(a, "digest"), "abc123") && streq(jstr(b, "digest"), ""), "digests");
    CHECK(streq(jstr(a, "modified_at"), "2024-01-02T03:04:05.000000006Z"), "modified_at from the file: %s",
          jstr(a, "modified_at"));
    CHECK(is_rfc3339(jstr(b, "modified_at")), "modified_at without a file: %s", jstr(b, "modified_at"));
    /* 2 layers x (attention 12288 + ffn 24576 + norms 128) + norm 64 + tied embedding
     * 64000 = 138048; Mistral 7B's shape gives 7.24e9. */
    CHECK(json_same(json_object_get(a, "details"),
                    "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"qwen3\",\"families\":[\"qwen3\"],"
                    "\"parameter_size\":\"138.05K\",\"quantization_level\":\"Q8_0\"}"),
          "details of the untagged model");
    CHECK(json_same(json_object_get(b, "details"),
                    "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"llama\",\"families\":[\"llama\"],"
                    "\"parameter_size\":\"7.2B\",\"quantization_level\":\"F16\"}"),
          "details of the tagged model");
    json_decref(j);
    resp_free(&r);

    request(port, "GET", "/api/ps", NULL, NULL, &r);
    j = body_json(&r);
    models = json_object_get(j, "models");
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_array_size(models), 1);
    a = json_array_get(models, 0);
    CHECK(streq(jstr(a, "name"), M) && jstr(a, "expires_at") && json_is_integer(json_object_get(a, "size_vram")),
          "ps lists the ready model with expires_at and size_vram");
    json_decref(j);
    resp_free(&r);

    post(port, "/api/show", "{\"model\":\"qwen3-0.6b-Q8_0:latest\"}", &r);
    j = body_json(&r);
    CHECK_EQ_INT(r.status, 200);
    json_t *info = json_object_get(j, "model_info");
    CHECK(streq(jstr(info, "general.architecture"), "qwen3"), "model_info architecture");
    CHECK_EQ_INT(jint(info, "qwen3.context_length"), 4096);
    CHECK_EQ_INT(jint(info, "qwen3.block_count"), 2);
    CHECK_EQ_INT(jint(info, "qwen3.attention.head_count_kv"), 2);
    CHECK_EQ_INT(jint(info, "general.parameter_count"), 138048);
    CHECK(streq(jstr(j, "template"), json_string_value(json_object_get(json_array_get(F.models, 0), "chat_template"))),
          "template is the chat template");
    CHECK(strstr(jstr(j, "modelfile") ? jstr(j, "modelfile") : "", file_a) != NULL, "modelfile names the file");
    CHECK(json_same(json_object_get(j, "capabilities"), "[\"completion\",\"tools\",\"thinking\"]"), "capabilities");
    CHECK(streq(jstr(json_object_get(j, "details"), "quantization_level"), "Q8_0"), "show details");
    json_decref(j);
    resp_free(&r);

    const struct {
        const char *body;
        int status;
        const char *error;
    } cases[] = {
        {"{\"name\":\"mistral:7b\"}", 200, NULL},
        {"{\"model\":\"qwen3-0.6b-Q8_0\"}", 200, NULL},
        {"{\"model\":\"nope\"}", 404, "model 'nope' not found"},
        {"{\"model\":\"mistral:7b:latest\"}", 404, "model 'mistral:7b:latest' not found"},
        {"{\"model\":\"mistral\"}", 404, "model 'mistral' not found"},
        {"{\"model\":\"broken:latest\"}", 200, NULL},
        {"{}", 400, "model is required"},
        {"{\"model\":5}", 400, "model: expected a string"},
        {"[1]", 400, "request body: expected a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        post(port, "/api/show", cases[i].body, &r);
        j = body_json(&r);
        CHECK(r.status == cases[i].status, "show %s: status %d, want %d", cases[i].body, r.status, cases[i].status);
        if (cases[i].error)
            CHECK(streq(jstr(j, "error"), cases[i].error), "show %s: error %s", cases[i].body, jstr(j, "error"));
        json_decref(j);
        resp_free(&r);
    }
}

static void test_chat_mapping(uint16_t port)
{
    F.script = S_THINK;
    const char *body =
        "{\"model\":\"qwen3-0.6b-Q8_0:latest\",\"stream\":false,\"think\":true,\"keep_alive\":\"5m\","
        "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\",\"images\":[]},"
        "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"need a tool\",\"tool_calls\":[{\"function\":"
        "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
        "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_name\":\"get_weather\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
        "\"options\":{\"temperature\":0.3,\"top_k\":20,\"top_p\":0.9,\"min_p\":0.1,\"seed\":42,"
        "\"num_predict\":100,\"stop\":[\"\\n\\n\",\"END\"],\"repeat_penalty\":1.2,\"presence_penalty\":0.5,"
        "\"frequency_penalty\":0.25,\"repeat_last_n\":33,\"num_ctx\":8192,\"mirostat\":0}}";
    struct resp r;
    int64_t t0 = clock_ns();
    post(port, "/api/chat", body, &r);
    int64_t elapsed = clock_ns() - t0;
    CHECK_EQ_INT(r.status, 200);
    CHECK(strcasestr(r.head, "Content-Type: application/json") != NULL, "whole reply is JSON: %s", r.head);
    json_t *j = body_json(&r);
    const struct textgen_params *p = &F.last;
    CHECK(streq(p->model, "qwen3-0.6b-Q8_0"), "model id without :latest: %s", p->model);
    CHECK(json_same(p->messages,
                    "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                    "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"need a tool\","
                    "\"tool_calls\":[{\"id\":\"call_2_0\",\"type\":\"function\",\"function\":{\"name\":"
                    "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                    "{\"role\":\"tool\",\"content\":\"sunny\",\"name\":\"get_weather\"}]"),
          "messages in the common form");
    CHECK(json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
                              "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
                              "{\"type\":\"string\"}}}}}]"),
          "tools");
    CHECK(json_same(p->template_kwargs, "{\"enable_thinking\":true}"), "think -> enable_thinking");
    CHECK(p->reasoning, "reasoning text kept apart");
    CHECK_EQ_INT(p->max_tokens, 100);
    CHECK(p->n_stop == 2 && streq(p->stop[0], "\n\n") && streq(p->stop[1], "END"), "stop strings");
    CHECK(p->sampling.temperature == 0.3f && p->sampling.top_k == 20 && p->sampling.top_p == 0.9f &&
              p->sampling.min_p == 0.1f && p->sampling.repeat_penalty == 1.2f &&
              p->sampling.presence_penalty == 0.5f && p->sampling.frequency_penalty == 0.25f &&
              p->sampling.penalty_last_n == 33 && p->sampling.seed == 42,
          "sampling: t %g k %d p %g min_p %g rep %g pres %g freq %g last_n %d seed %llu", p->sampling.temperature,
          p->sampling.top_k, p->sampling.top_p, p->sampling.min_p, p->sampling.repeat_penalty,
          p->sampling.presence_penalty, p->sampling.frequency_penalty, p->sampling.penalty_last_n,
          (unsigned long long)p->sampling.seed);
    CHECK(p->n == 1 && p->add_generation_prompt, "n 1 with a generation prompt");

    CHECK(streq(jstr(j, "model"), M), "model echoed as asked: %s", jstr(j, "model"));
    CHECK(is_rfc3339(jstr(j, "created_at")), "created_at %s", jstr(j, "created_at"));
    CHECK(json_same(json_object_get(j, "message"),
                    "{\"role\":\"assistant\",\"content\":\"Answer\",\"thinking\":\"Let me think.\"}"),
          "message with thinking");
    CHECK(json_is_true(json_object_get(j, "done")) && streq(jstr(j, "done_reason"), "stop"), "done, stop");
    CHECK_EQ_INT(jint(j, "prompt_eval_count"), 7);
    CHECK_EQ_INT(jint(j, "eval_count"), 3);
    long long total = jint(j, "total_duration"), load = jint(j, "load_duration"),
              pe = jint(j, "prompt_eval_duration"), ev = jint(j, "eval_duration");
    CHECK(load >= 0 && pe >= 0 && ev > 0 && total == load + pe + ev && total <= elapsed,
          "durations: total %lld = load %lld + prompt %lld + eval %lld, within %lld", total, load, pe, ev,
          (long long)elapsed);
    json_decref(j);
    resp_free(&r);
}

static void test_chat_stream(uint16_t port)
{
    F.script = S_TEXT;
    struct resp r;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strcasestr(r.head, "Content-Type: application/x-ndjson") != NULL, "NDJSON stream: %s", r.head);
    json_t *lines = ndjson(&r);
    size_t n = json_array_size(lines);
    CHECK_EQ_INT(n, 4);
    char text[64] = "";
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *l = json_array_get(lines, i), *m = json_object_get(l, "message");
        CHECK(json_is_false(json_object_get(l, "done")) && streq(jstr(m, "role"), "assistant") &&
                  streq(jstr(l, "model"), "qwen3-0.6b-Q8_0") && is_rfc3339(jstr(l, "created_at")) &&
                  !json_object_get(m, "thinking") && !json_object_get(l, "done_reason"),
              "line %zu shape", i);
        strncat(text, jstr(m, "content") ? jstr(m, "content") : "?", sizeof text - strlen(text) - 1);
    }
    CHECK(streq(text, "Hello world"), "streamed text %s", text);
    json_t *last = json_array_get(lines, n - 1);
    CHECK(json_is_true(json_object_get(last, "done")) && streq(jstr(last, "done_reason"), "stop") &&
              jint(last, "eval_count") == 3 && jint(last, "prompt_eval_count") == 7 &&
              json_is_integer(json_object_get(last, "total_duration")) &&
              json_same(json_object_get(last, "message"), "{\"role\":\"assistant\",\"content\":\"\"}"),
          "final line");
    json_decref(lines);
    resp_free(&r);

    /* Defaults: no limit, no stop strings, template defaults, a random seed each time. */
    const struct textgen_params *p = &F.last;
    uint64_t seed1 = p->sampling.seed;
    CHECK(p->max_tokens == 0 && p->n_stop == 0 && !p->template_kwargs && !p->tools, "defaults");
    CHECK(p->sampling.temperature == 0.8f && p->sampling.top_k == 40, "sampling defaults");
    post(port, "/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":true,\"think\":\"low\",\"options\":{\"seed\":-1,"
         "\"num_predict\":-1},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(seed1 != p->sampling.seed && seed1 < ((uint64_t)1 << 53) && p->sampling.seed < ((uint64_t)1 << 53),
          "random seeds %llu %llu", (unsigned long long)seed1, (unsigned long long)p->sampling.seed);
    CHECK(json_same(p->template_kwargs, "{\"enable_thinking\":true,\"reasoning_effort\":\"low\"}"), "think level");
    CHECK_EQ_INT(p->max_tokens, 0);
    resp_free(&r);

    /* Thinking streamed apart. */
    F.script = S_THINK;
    post(port, "/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"think\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    lines = ndjson(&r);
    CHECK(json_same(p->template_kwargs, "{\"enable_thinking\":false}"), "think false");
    CHECK_EQ_INT(json_array_size(lines), 4);
    CHECK(json_same(json_object_get(json_array_get(lines, 0), "message"),
                    "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Let me \"}") &&
              json_same(json_object_get(json_array_get(lines, 2), "message"),
                        "{\"role\":\"assistant\",\"content\":\"Answer\"}"),
          "thinking lines then content");
    json_decref(lines);
    resp_free(&r);

    /* Length. */
    F.script = S_LENGTH;
    post(port, "/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    json_t *j = body_json(&r);
    CHECK(streq(jstr(j, "done_reason"), "length"), "done_reason length: %s", jstr(j, "done_reason"));
    json_decref(j);
    resp_free(&r);
}

static void test_tools(uint16_t port)
{
    F.script = S_TOOL;
    struct resp r;
    const char *req = "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":false,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"Weather?\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]}";
    post(port, "/api/chat", req, &r);
    json_t *j = body_json(&r);
    CHECK_EQ_INT(r.status, 200);
    json_t *msg = json_object_get(j, "message");
    CHECK(json_same(msg, "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_abc\","
                         "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]}"),
          "tool call with arguments as an object");
    CHECK(streq(jstr(j, "done_reason"), "stop") && jint(j, "eval_count") == 12, "done_reason, eval_count");

    /* Round trip: the reply's message and a tool result go back as history. */
    json_t *back = json_loads(req, 0, NULL);
    json_t *msgs = json_object_get(back, "messages");
    json_array_append(msgs, msg);
    json_array_append_new(msgs, json_pack("{s:s,s:s,s:s}", "role", "tool", "content", "{\"temp\":21}",
                                          "tool_name", "get_weather"));
    char *text = json_dumps(back, JSON_COMPACT);
    F.script = S_TEXT;
    resp_free(&r);
    post(port, "/api/chat", text, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(json_same(json_array_get(F.last.messages, 1),
                    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_abc\",\"type\":"
                    "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\","
                    "\"days\":2}}}]}") &&
              json_same(json_array_get(F.last.messages, 2),
                        "{\"role\":\"tool\",\"content\":\"{\\\"temp\\\":21}\",\"name\":\"get_weather\"}"),
          "tool round trip into the common form");
    free(text);
    json_decref(back);
    json_decref(j);
    resp_free(&r);

    /* Streamed: the calls come in a line of their own before the final one. */
    F.script = S_TOOL;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"w\"}]}",
         &r);
    json_t *lines = ndjson(&r);
    CHECK_EQ_INT(json_array_size(lines), 2);
    json_t *l0 = json_array_get(lines, 0);
    CHECK(json_is_false(json_object_get(l0, "done")) &&
              json_same(json_object_get(json_object_get(l0, "message"), "tool_calls"),
                        "[{\"id\":\"call_abc\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                        "\"Paris\",\"days\":2}}}]"),
          "streamed tool calls");
    CHECK(json_is_true(json_object_get(json_array_get(lines, 1), "done")), "then done");
    json_decref(lines);
    resp_free(&r);
}

static void test_generate(uint16_t port)
{
    F.script = S_TEXT;
    struct resp r;
    post(port, "/api/generate",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"Why?\",\"system\":\"Be brief.\",\"template\":\"ignored\","
         "\"context\":[1,2],\"options\":{\"temperature\":0}}",
         &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(json_same(F.last.messages, "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                     "{\"role\":\"user\",\"content\":\"Why?\"}]") &&
              !F.last.prompt && F.last.sampling.temperature == 0.0f,
          "generate: system and prompt as messages");
    json_t *lines = ndjson(&r);
    size_t n = json_array_size(lines);
    CHECK_EQ_INT(n, 4);
    CHECK(streq(jstr(json_array_get(lines, 0), "response"), "Hel") &&
              !json_object_get(json_array_get(lines, 0), "message"),
          "generate lines carry response");
    json_t *last = json_array_get(lines, n - 1);
    CHECK(json_is_true(json_object_get(last, "done")) && streq(jstr(last, "response"), "") &&
              streq(jstr(last, "done_reason"), "stop"),
          "generate final line");
    json_decref(lines);
    resp_free(&r);

    post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"[INST]x[/INST]\",\"raw\":true,"
                                "\"system\":\"dropped\",\"stream\":false}",
         &r);
    json_t *j = body_json(&r);
    CHECK(streq(F.last.prompt, "[INST]x[/INST]") && !F.last.messages, "raw prompt");
    CHECK(streq(jstr(j, "response"), "Hello world") && json_is_true(json_object_get(j, "done")), "whole response");
    json_decref(j);
    resp_free(&r);

    F.script = S_THINK;
    post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"think\":true,\"stream\":false}",
         &r);
    j = body_json(&r);
    CHECK(streq(jstr(j, "response"), "Answer") && streq(jstr(j, "thinking"), "Let me think."), "generate thinking");
    json_decref(j);
    resp_free(&r);

    /* The load calls answer at once, without a generation. */
    int submits = F.submits;
    post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\"}", &r);
    j = body_json(&r);
    CHECK(r.status == 200 && streq(jstr(j, "response"), "") && json_is_true(json_object_get(j, "done")) &&
              streq(jstr(j, "done_reason"), "load") && streq(jstr(j, "model"), "qwen3-0.6b-Q8_0"),
          "generate load call");
    json_decref(j);
    resp_free(&r);
    post(port, "/api/chat", "{\"model\":\"mistral:7b\",\"messages\":[],\"keep_alive\":0}", &r);
    j = body_json(&r);
    CHECK(r.status == 200 && json_same(json_object_get(j, "message"), "{\"role\":\"assistant\",\"content\":\"\"}") &&
              streq(jstr(j, "done_reason"), "unload"),
          "chat unload call");
    json_decref(j);
    resp_free(&r);
    post(port, "/api/chat", "{\"model\":\"ghost\",\"messages\":[]}", &r);
    CHECK_EQ_INT(r.status, 404);
    resp_free(&r);
    CHECK_EQ_INT(F.submits, submits);
}

static void test_errors(uint16_t port)
{
    const struct {
        const char *path, *body;
        int status;
        const char *error; /* expected prefix */
    } cases[] = {
        {"/api/chat", "[1,2]", 400, "request body: expected a JSON object"},
        {"/api/chat", "{\"messages\":[]}", 400, "model is required"},
        {"/api/chat", "{\"model\":3}", 400, "model: expected a string"},
        {"/api/chat", "{\"model\":\"ghost\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'ghost' not found"},
        {"/api/chat", "{\"model\":\"ghost:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'ghost:latest' not found"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":{}}", 400, "messages: expected an array"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[5]}", 400, "messages[0]: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
         "messages[0].role"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
         "messages[0].content: expected a string"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"iVBO\"]}]}",
         400, "messages[0].images: images are not supported"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
         "\"assistant\",\"tool_calls\":\"x\"}]}",
         400, "messages[1].tool_calls: expected an array"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
         "{\"name\":\"f\",\"arguments\":5}}]}]}",
         400, "messages[0].tool_calls[0].function.arguments: expected an object"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
         "{\"arguments\":{}}}]}]}",
         400, "messages[0].tool_calls[0].function.name"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":\"x\"}", 400,
         "tools: expected an array"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":[{\"type\":\"function\"}]}", 400,
         "tools[0].function: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":[{\"type\":\"web\",\"function\":{}}]}",
         400, "tools[0].type"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":5}", 400,
         "options: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"temperature\":\"hot\"}}", 400,
         "options.temperature"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"temperature\":-1}}", 400,
         "options.temperature"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"top_p\":0}}", 400,
         "options.top_p"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"top_k\":1.5}}", 400,
         "options.top_k"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"num_predict\":0}}", 400,
         "options.num_predict"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"num_predict\":-3}}", 400,
         "options.num_predict"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"stop\":\"x\"}}", 400,
         "options.stop"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"stop\":[\"\"]}}", 400,
         "options.stop[0]"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"seed\":\"x\"}}", 400,
         "options.seed"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"repeat_last_n\":-2}}", 400,
         "options.repeat_last_n"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"stream\":\"yes\"}", 400, "stream"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"think\":\"maybe\"}", 400, "think"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"format\":\"json\"}", 400, "format"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"format\":{\"type\":\"object\"}}", 400,
         "format"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"keep_alive\":[]}", 400, "keep_alive"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":5}", 400, "prompt: expected a string"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"images\":[\"iVBO\"]}", 400,
         "images: images are not supported"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"raw\":\"yes\"}", 400, "raw"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"system\":1}", 400, "system"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"context\":\"abc\"}", 400, "context"},
    };
    int submits = F.submits;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct resp r;
        post(port, cases[i].path, cases[i].body, &r);
        json_t *j = body_json(&r);
        const char *e = jstr(j, "error");
        CHECK(r.status == cases[i].status && e && strncmp(e, cases[i].error, strlen(cases[i].error)) == 0 &&
                  json_object_size(j) == 1,
              "%s %s: %d %s, want %d %s", cases[i].path, cases[i].body, r.status, r.body, cases[i].status,
              cases[i].error);
        json_decref(j);
        resp_free(&r);
    }
    CHECK_EQ_INT(F.submits, submits); /* nothing reached the backend */

    /* Bodies that are not JSON: refused by the server (declared JSON) or by the handler. */
    struct resp r;
    post(port, "/api/chat", "{\"model\":", &r);
    CHECK_EQ_INT(r.status, 400);
    resp_free(&r);
    request(port, "POST", "/api/chat", NULL, "hello", &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 400 && streq(jstr(j, "error"), "request body: expected a JSON object"), "plain text body: %d %s",
          r.status, r.body);
    json_decref(j);
    resp_free(&r);

    /* The backend refuses at submit: its status and message. */
    F.refuse_status = 413;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    j = body_json(&r);
    CHECK(r.status == 413 && streq(jstr(j, "error"), "prompt is too long: 9000 tokens, the context holds 4096"),
          "refused at submit: %d %s", r.status, r.body);
    F.refuse_status = 0;
    json_decref(j);
    resp_free(&r);

    /* ERROR before START: a plain error reply, streaming asked or not. */
    F.script = S_ERR_BEFORE;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    j = body_json(&r);
    CHECK(r.status == 503 && streq(jstr(j, "error"), "no instance ready") &&
              strcasestr(r.head, "Content-Type: application/json") && strcasestr(r.head, "Retry-After: 1"),
          "error before start: %d %s %s", r.status, r.head, r.body);
    json_decref(j);
    resp_free(&r);

    /* ERROR after START: an error line ends the stream; a whole reply gets the status. */
    F.script = S_ERR_AFTER;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    json_t *lines = ndjson(&r);
    CHECK(r.status == 200 && json_array_size(lines) == 2 &&
              streq(jstr(json_object_get(json_array_get(lines, 0), "message"), "content"), "partial") &&
              json_same(json_array_get(lines, 1), "{\"error\":\"runner failed\"}"),
          "error after start, streamed: %s", r.body);
    json_decref(lines);
    resp_free(&r);
    post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"stream\":false}", &r);
    j = body_json(&r);
    CHECK(r.status == 500 && json_same(j, "{\"error\":\"runner failed\"}"), "error after start, whole: %d %s",
          r.status, r.body);
    json_decref(j);
    resp_free(&r);

    F.script = S_SEQ_ERROR;
    post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    lines = ndjson(&r);
    CHECK(json_array_size(lines) == 2 && json_same(json_array_get(lines, 1), "{\"error\":\"generation failed\"}"),
          "a sequence that ends in error: %s", r.body);
    json_decref(lines);
    resp_free(&r);
}

/* Sends a request and hangs up after the first bytes of the reply (or at once when
 * wait_bytes is false, after a short pause so the handler has submitted). */
static int fake_submits(struct fake *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->submits;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void hang_up(uint16_t port, const char *path, const char *body, bool wait_bytes)
{
    int before = fake_submits(&F);
    int fd = tcp_connect(port);
    CHECK(fd >= 0 && send_request(fd, "POST", path, "application/json", body) == 0, "send");
    if (wait_bytes) {
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        CHECK(n > 0, "reply bytes before hanging up");
    } else {
        for (int i = 0; i < 2500 && fake_submits(&F) == before; i++)
            usleep(2000);
        usleep(20 * 1000);
    }
    close(fd);
}

static void test_disconnects(uint16_t port)
{
    const struct {
        int script;
        const char *path, *body;
        bool wait_bytes;
    } cases[] = {
        {S_HANG, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         true},
        {S_HANG, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"stream\":false}", false},
        {S_HANG_EARLY, "/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        F.script = cases[i].script;
        int submits = F.submits;
        hang_up(port, cases[i].path, cases[i].body, cases[i].wait_bytes);
        CHECK_EQ_INT(F.submits, submits + 1);
        struct fake_req *q = fake_newest(&F);
        CHECK(wait_cancels(&F, q, 1, 5000), "case %zu: cancelled after the client left", i);
        usleep(50 * 1000);
        CHECK_EQ_INT(fake_req_cancels(&F, q), 1);
    }
}

struct par {
    uint16_t port;
    bool ok;
    pthread_t th;
};

static void *par_main(void *arg)
{
    struct par *a = arg;
    struct resp r;
    post(a->port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         &r);
    json_t *lines = ndjson(&r);
    char text[64] = "";
    for (size_t i = 0; i < json_array_size(lines); i++) {
        const char *c = jstr(json_object_get(json_array_get(lines, i), "message"), "content");
        strncat(text, c ? c : "?", sizeof text - strlen(text) - 1);
    }
    a->ok = r.status == 200 && json_array_size(lines) == 4 && strcmp(text, "Hello world") == 0;
    json_decref(lines);
    resp_free(&r);
    return NULL;
}

static void test_parallel(uint16_t port)
{
    F.script = S_TEXT;
    struct par a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (struct par){.port = port};
        pthread_create(&a[i].th, NULL, par_main, &a[i]);
    }
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(a[i].th, NULL);
        ok += a[i].ok;
    }
    CHECK_EQ_INT(ok, 8);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    pthread_mutex_init(&F.mu, NULL);
    pthread_cond_init(&F.cond, NULL);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cairn-ollama-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    snprintf(file_a, sizeof file_a, "%s/qwen3-0.6b-Q8_0.gguf", tmpdir);
    int fd = open(file_a, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    struct timespec times[2] = {{.tv_sec = 1704164645, .tv_nsec = 6}, {.tv_sec = 1704164645, .tv_nsec = 6}};
    CHECK(fd >= 0 && futimens(fd, times) == 0, "file with a known mtime");
    close(fd);
    set_models();

    char err[256] = "";
    struct http_server *srv = NULL;
    struct http_config cfg = {.port = 0};
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    CHECK(ollama_register(srv, &G, err, sizeof err) == 0, "register: %s", err);
    CHECK(ollama_register(srv, &G, err, sizeof err) != 0 && strstr(err, "/api/chat"), "twice: %s", err);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);

    test_version(port);
    test_tags_ps_show(port);
    test_chat_mapping(port);
    test_chat_stream(port);
    test_tools(port);
    test_generate(port);
    test_errors(port);
    int cancels = F.cancels;
    CHECK_EQ_INT(cancels, 0); /* no request that ran to its end was cancelled */
    test_disconnects(port);
    test_parallel(port);
    CHECK_EQ_INT(F.cancels, cancels + 3);
    CHECK_EQ_INT(F.cancels_after_end, 0);

    /* The server stops with a stream open and a request inside submit: the stream's
     * generation is cancelled at once, the other one as soon as submit returns. */
    const char *chat = "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    F.script = S_HANG;
    int fd2 = tcp_connect(port);
    CHECK(send_request(fd2, "POST", "/api/chat", "application/json", chat) == 0, "send");
    char buf[256];
    CHECK(recv(fd2, buf, sizeof buf, 0) > 0, "stream open");
    struct fake_req *q = fake_newest(&F);
    pthread_mutex_lock(&F.mu);
    F.submit_delay_ms = 300;
    pthread_mutex_unlock(&F.mu);
    int fd3 = tcp_connect(port);
    CHECK(send_request(fd3, "POST", "/api/chat", "application/json", chat) == 0, "send");
    bool in_submit = false;
    for (int i = 0; i < 2500 && !in_submit; i++) {
        pthread_mutex_lock(&F.mu);
        in_submit = F.in_submit;
        pthread_mutex_unlock(&F.mu);
        if (!in_submit)
            usleep(1000);
    }
    CHECK(in_submit, "second request inside submit");
    http_server_stop(srv);
    struct fake_req *q2 = fake_newest(&F);
    CHECK(q2 != q, "the second request was submitted");
    CHECK(wait_cancels(&F, q, 1, 5000) && fake_req_cancels(&F, q) == 1, "stop cancels the open stream once");
    CHECK(wait_cancels(&F, q2, 1, 5000) && fake_req_cancels(&F, q2) == 1, "and the one that was in submit");
    close(fd2);
    close(fd3);
    http_server_release(srv);

    fake_release(&F);
    unlink(file_a);
    rmdir(tmpdir);
    pthread_mutex_destroy(&F.mu);
    pthread_cond_destroy(&F.cond);
    return test_main_end();
}
