/* The terminal's HTTP client of a node's API (client.h). */
#include "cli/client.h"

#include <ctype.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "cli/cli.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_start(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* The address a node of this user's data dir noted (cli.h), into buf; NULL when there is
 * none or it is not a plain HOST:PORT line. */
static const char *noted_address(char *buf, size_t cap)
{
    char path[4096];
    if (cli_data_path(path, sizeof path, CLI_API_ADDRESS_FILE))
        return NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok)
        return NULL;
    buf[strcspn(buf, "\r\n")] = 0;
    for (const char *p = buf; *p; p++) /* a name or an address, and a port */
        if (!isalnum((unsigned char)*p) && !strchr(".:[]-", *p))
            return NULL;
    return buf[0] ? buf : NULL;
}

int client_init(struct client *c, const char *host, char *err, size_t errlen)
{
    *c = (struct client){0};
    char noted[300];
    if (!host || !host[0])
        host = getenv("CAIRN_HOST");
    if (!host || !host[0])
        host = noted_address(noted, sizeof noted);
    if (!host || !host[0])
        host = "127.0.0.1";
    const char *key = getenv("CAIRN_API_KEY");
    if (key && snprintf(c->key, sizeof c->key, "%s", key) >= (int)sizeof c->key)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "CAIRN_API_KEY is longer than %zu bytes", sizeof c->key - 1);
    const char *rest = host;
    if (!strncmp(rest, "http://", 7))
        rest += 7;
    else if (strstr(rest, "://"))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "'%s': only http:// nodes", host);
    size_t n = strcspn(rest, "/");
    /* the port's colon: after the address, which may be a bracketed IPv6 one */
    const char *close = rest[0] == '[' ? memchr(rest, ']', n) : NULL;
    const char *after = close ? close + 1 : rest;
    const char *colon = memchr(after, ':', n - (size_t)(after - rest));
    int w;
    if (n == 0)
        w = -1;
    else if (colon == rest) /* ":PORT" */
        w = snprintf(c->base, sizeof c->base, "http://127.0.0.1%.*s", (int)n, rest);
    else if (colon)
        w = snprintf(c->base, sizeof c->base, "http://%.*s", (int)n, rest);
    else
        w = snprintf(c->base, sizeof c->base, "http://%.*s:%d", (int)n, rest, CLIENT_DEFAULT_PORT);
    if (w < 0 || (size_t)w >= sizeof c->base)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "'%s' is not HOST:PORT", host);
    return 0;
}

/* A body kept in memory, at most max bytes. */
struct body {
    struct strbuf b;
    size_t max;
    bool too_big;
};

static bool body_add(struct body *b, const char *data, size_t n)
{
    if (n > b->max - b->b.len) {
        b->too_big = true;
        return false;
    }
    return strbuf_put(&b->b, data, n) == 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    return body_add(arg, data, size * nmemb) ? size * nmemb : 0;
}

/* The node's message of an error reply ({"error": {"message"}}, {"error": "..."},
 * {"message"}) into err, else the status alone. */
static void error_of(long status, const char *text, char *err, size_t errlen)
{
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    const json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!msg)
        msg = json_string_value(e);
    if (!msg)
        msg = json_string_value(json_object_get(j, "message"));
    if (msg)
        snprintf(err, errlen, "%s (HTTP %ld)", msg, status);
    else
        snprintf(err, errlen, "HTTP %ld", status);
    json_decref(j);
}

/* A handle for method on path with body (compact JSON, owned by the caller) and the
 * headers of c; NULL when curl cannot make one. */
static CURL *handle_for(const struct client *c, const char *method, const char *path, const char *body,
                        struct curl_slist **headers)
{
    pthread_once(&curl_once, curl_start);
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    char url[4096], auth[360];
    snprintf(url, sizeof url, "%s%s", c->base, path);
    *headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->key[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->key);
        *headers = curl_slist_append(*headers, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *headers);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)CLIENT_CONNECT_S);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    if (body)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    return h;
}

/* Performs h; the status, or 0 with curl's reason in err. */
static int perform(CURL *h, const char *what, char *err, size_t errlen)
{
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "%s: %s", what, curl_easy_strerror(rc));
        return 0;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    return (int)status;
}

int client_json(const struct client *c, const char *method, const char *path, const json_t *body, json_t **out,
                char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct curl_slist *headers = NULL;
    struct body b = {.max = CLIENT_BODY_MAX};
    CURL *h = handle_for(c, method, path, text, &headers);
    int status = 0;
    if (!h) {
        snprintf(err, errlen, "out of memory");
    } else {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
        status = perform(h, c->base, err, errlen);
        if (b.too_big) {
            snprintf(err, errlen, "%s%s: the reply is over %zu bytes", c->base, path, b.max);
            status = 0;
        }
    }
    if (status >= 400)
        error_of(status, b.b.p, err, errlen);
    else if (status && out && b.b.p)
        *out = json_loads(b.b.p, 0, NULL);
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    free(text);
    strbuf_free(&b.b);
    return status;
}

int client_text(const struct client *c, const char *path, char **out, char *err, size_t errlen)
{
    *out = NULL;
    struct curl_slist *headers = NULL;
    struct body b = {.max = CLIENT_BODY_MAX};
    CURL *h = handle_for(c, "GET", path, NULL, &headers);
    int status = 0;
    if (h) {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
        status = perform(h, c->base, err, errlen);
    }
    if (status >= 400)
        error_of(status, b.b.p, err, errlen);
    if (status && status < 400 && !b.too_big)
        *out = b.b.p ? b.b.p : strdup(""); /* the strbuf's bytes become the caller's */
    else
        strbuf_free(&b.b);
    if (!*out && status < 400)
        status = 0;
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    return status;
}

/* A streamed reply: lines cut out of what arrives, or the body of an error kept. */
struct stream {
    CURL *h;
    client_line_fn fn;
    void *ctx;
    const atomic_bool *cancel;
    bool cancelled, stopped, too_long;
    long status;
    struct body line;  /* the line being read */
    struct body error; /* the body of a reply >= 400 */
};

static size_t on_stream(char *data, size_t size, size_t nmemb, void *arg)
{
    struct stream *s = arg;
    size_t n = size * nmemb;
    if (s->cancel && atomic_load(s->cancel)) { /* at once, not at the next progress call */
        s->cancelled = true;
        return 0;
    }
    if (!s->status)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status >= 400) /* kept whole (to its limit) for the message */
        return body_add(&s->error, data, n) || s->error.too_big ? n : 0;
    for (size_t i = 0; i < n; i++) {
        if (data[i] != '\n') {
            if (!body_add(&s->line, data + i, 1)) {
                s->too_long = s->line.too_big;
                return 0;
            }
            continue;
        }
        size_t len = s->line.b.len;
        if (len && s->line.b.p[len - 1] == '\r')
            len--;
        char empty = 0, *text = s->line.b.p ? s->line.b.p : &empty;
        text[len] = 0;
        int stop = s->fn(s->ctx, text, len);
        strbuf_clear(&s->line.b);
        if (stop) {
            s->stopped = true;
            return 0;
        }
    }
    return n;
}

static int on_xfer(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct stream *s = arg;
    if (s->cancel && atomic_load(s->cancel)) {
        s->cancelled = true;
        return 1;
    }
    return 0;
}

int client_stream(const struct client *c, const char *path, const json_t *body, const atomic_bool *cancel,
                  client_line_fn fn, void *ctx, bool *cancelled, char *err, size_t errlen)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct curl_slist *headers = NULL;
    struct stream s = {.fn = fn, .ctx = ctx, .cancel = cancel, .line.max = CLIENT_LINE_MAX, .error.max = 65536};
    s.h = handle_for(c, "POST", path, text ? text : "{}", &headers);
    int status = 0;
    if (!s.h) {
        snprintf(err, errlen, "out of memory");
    } else {
        curl_easy_setopt(s.h, CURLOPT_WRITEFUNCTION, on_stream);
        curl_easy_setopt(s.h, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(s.h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(s.h, CURLOPT_XFERINFOFUNCTION, on_xfer);
        curl_easy_setopt(s.h, CURLOPT_XFERINFODATA, &s);
        /* No overall timeout: an answer may take long; a node that goes silent is seen by
         * the keep-alive comments it stops sending (a minute without a byte ends it). */
        curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_TIME, 60L);
        CURLcode rc = curl_easy_perform(s.h);
        long st = 0;
        curl_easy_getinfo(s.h, CURLINFO_RESPONSE_CODE, &st);
        status = (int)st;
        if (s.too_long) {
            snprintf(err, errlen, "%s%s: a streamed line is over %zu bytes", c->base, path, s.line.max);
            status = 0;
        } else if (rc != CURLE_OK && !s.cancelled && !s.stopped && status < 400) {
            snprintf(err, errlen, "%s: %s", c->base, curl_easy_strerror(rc));
            status = 0;
        }
        if (status >= 400)
            error_of(status, s.error.b.p, err, errlen);
        else if (status && s.line.b.len && !s.cancelled && !s.stopped) /* a last line without its end */
            fn(ctx, s.line.b.p, s.line.b.len);
    }
    if (cancelled)
        *cancelled = s.cancelled;
    curl_easy_cleanup(s.h);
    curl_slist_free_all(headers);
    free(text);
    strbuf_free(&s.line.b);
    strbuf_free(&s.error.b);
    return status;
}

bool client_alive(const struct client *c)
{
    struct curl_slist *headers = NULL;
    struct body b = {.max = 4096};
    CURL *h = handle_for(c, "GET", "/node_id", NULL, &headers);
    char err[512];
    int status = 0;
    if (h) {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 3000L);
        status = perform(h, c->base, err, sizeof err);
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    strbuf_free(&b.b);
    return status == 200;
}
