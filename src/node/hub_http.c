/* Talking to the hub (hub_int.h): one HTTP exchange with its retries and errors, and a
 * repo's listing at a commit. */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/files.h"
#include "base/log.h"
#include "base/version.h"
#include "node/catalog.h"
#include "node/download.h"
#include "node/hub_int.h"
#include "node/sha256.h"
#include "proto/ids.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_start(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

void hub_curl_init(void) { pthread_once(&curl_once, curl_start); }

void hub_settle(struct hub *h, const struct hub_config *cfg)
{
    const char *env = getenv("HF_ENDPOINT");
    snprintf(h->endpoint, sizeof h->endpoint, "%s",
             cfg->endpoint ? cfg->endpoint : env && env[0] ? env : HUB_DEFAULT_ENDPOINT);
    size_t n = strlen(h->endpoint);
    while (n && h->endpoint[n - 1] == '/')
        h->endpoint[--n] = 0;
    h->cfg = cfg;
    h->token = cfg->token ? cfg->token : getenv("HF_TOKEN");
    const char *off = getenv("HF_HUB_OFFLINE");
    h->offline = cfg->offline || (off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes")));
    h->revision = cfg->revision && cfg->revision[0] ? cfg->revision : "main";
    h->attempts = cfg->max_attempts > 0 ? cfg->max_attempts : HUB_MAX_ATTEMPTS;
    h->backoff_ms = cfg->backoff_ms > 0 ? cfg->backoff_ms : HUB_BACKOFF_MS;
    h->stall_s = cfg->stall_s > 0 ? cfg->stall_s : HUB_STALL_S;
    h->connections = cfg->connections > 0 ? cfg->connections : HUB_CONNECTIONS;
    if (h->connections > HUB_CONNECTIONS_MAX)
        h->connections = HUB_CONNECTIONS_MAX;
}

bool hub_cancelled(const struct hub *h) { return h->cfg->cancel && atomic_load(h->cfg->cancel); }

void hub_nap_ms(const struct hub *h, int64_t ms)
{
    for (int64_t t = 0; t < ms && !hub_cancelled(h); t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- one HTTP exchange ---- */


static void keep(char *dst, const char *v, size_t n)
{
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    if (n >= HDR_MAX)
        n = HDR_MAX - 1;
    for (size_t i = 0; i < n; i++) /* the hub's words reach logs and error messages */
        dst[i] = (unsigned char)v[i] < 0x20 || v[i] == 0x7f ? '?' : v[i];
    dst[n] = 0;
}

/* Keeps the headers we read; a new status line starts a new answer (after a redirect
 * the storage host's), whose hub headers do not replace the hub's. */
static void reply_header(struct reply *r, const char *line, size_t n)
{
    if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
        const char *sp = memchr(line, ' ', n);
        r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        r->crange[0] = r->retry_after[0] = r->error_code[0] = 0;
        return;
    }
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return;
    size_t name = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vn = n - name - 1;
    static const struct {
        const char *name;
        size_t off;
        bool first_only;
    } keys[] = {
        {"x-error-code", offsetof(struct reply, error_code), false},
        {"retry-after", offsetof(struct reply, retry_after), false},
        {"x-repo-commit", offsetof(struct reply, commit), true},
        {"x-linked-etag", offsetof(struct reply, etag), true},
        {"content-range", offsetof(struct reply, crange), false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char *dst = (char *)r + keys[i].off;
        if (strlen(keys[i].name) == name && !strncasecmp(line, keys[i].name, name) && !(keys[i].first_only && dst[0]))
            keep(dst, v, vn);
    }
    if (name == 4 && !strncasecmp(line, "link", 4)) {
        size_t k = vn < sizeof r->link - 1 ? vn : sizeof r->link - 1;
        memcpy(r->link, v, k);
        r->link[k] = 0;
    }
}

static size_t on_reply_header(char *data, size_t size, size_t nmemb, void *arg)
{
    reply_header(arg, data, size * nmemb);
    return size * nmemb;
}

static size_t on_json_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct reply *r = arg;
    size_t n = size * nmemb;
    if (r->len + n > r->max) {
        r->too_big = true;
        return 0;
    }
    if (r->len + n + 1 > r->cap) {
        size_t cap = (r->len + n + 1) * 2 < r->max + 1 ? (r->len + n + 1) * 2 : r->max + 1;
        char *b = realloc(r->body, cap);
        if (!b)
            return 0;
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = 0;
    return n;
}

/* A handle for url with the token (sent to the hub's host only: curl drops it on a
 * redirect to another host) and our limits. */
CURL *hub_handle(const struct hub *h, const char *url, struct reply *r, char *curl_err)
{
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_err[0] = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "cairn/" CAIRN_VERSION);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_reply_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    if (h->token && h->token[0]) {
        curl_easy_setopt(c, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
        curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, h->token);
    }
    return c;
}

/* Seconds a 429 or 503 asks us to wait (Retry-After in seconds), cut to the maximum;
 * -1 when it says nothing usable. */
static int64_t retry_after_ms(const struct reply *r)
{
    char *end;
    long s = strtol(r->retry_after, &end, 10);
    if (!r->retry_after[0] || *end || s < 0)
        return -1;
    return (int64_t)(s > HUB_RETRY_AFTER_MAX_S ? HUB_RETRY_AFTER_MAX_S : s) * 1000;
}

bool hub_retryable(long status) { return status == 429 || status == 408 || status >= 500; }

/* The error for an answer that is not a success and will not be retried. */
int hub_status_error(const struct hub *h, const struct reply *r, const char *what, char *err, size_t errlen)
{
    if (r->status == 401 || r->status == 403) {
        if (h->token && h->token[0])
            return cairn_fail(err, errlen, CAIRN_EPERM,
                              "%s: the hub refused HF_TOKEN (HTTP %ld%s%s): it has no access to this repo (a gated "
                              "repo wants its licence accepted on its page first)",
                              what, r->status, r->error_code[0] ? ", " : "", r->error_code);
        return cairn_fail(err, errlen, CAIRN_EPERM,
                          "%s is gated or private (HTTP %ld%s%s): set HF_TOKEN to a token with access to it", what,
                          r->status, r->error_code[0] ? ", " : "", r->error_code);
    }
    if (r->status == 404)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s: not on %s (%s)", what, h->endpoint,
                          r->error_code[0] ? r->error_code : "HTTP 404");
    return cairn_fail(err, errlen, CAIRN_EIO, "%s: HTTP %ld%s%s", what, r->status, r->error_code[0] ? " " : "",
                      r->error_code);
}

/* Waits before attempt k (from 1): Retry-After when the hub said one, else the doubling
 * backoff. */
void hub_wait_before_retry(const struct hub *h, const struct reply *r, int k)
{
    int64_t ms = retry_after_ms(r);
    if (ms < 0) {
        ms = h->backoff_ms;
        for (int i = 1; i < k && ms < HUB_BACKOFF_MAX_MS; i++)
            ms *= 2;
        ms = ms > HUB_BACKOFF_MAX_MS ? HUB_BACKOFF_MAX_MS : ms;
    }
    log_info("hub: %s; trying again in %" PRId64 " ms", r->status ? "the hub is busy or failing" : "no answer", ms);
    hub_nap_ms(h, ms);
}

/* GET url as JSON into *out, retrying what is worth retrying. what names it in errors. */
int hub_get_json(const struct hub *h, const char *url, const char *what, json_t **out, struct reply *r, char *err,
                    size_t errlen)
{
    *out = NULL;
    char curl_err[CURL_ERROR_SIZE];
    for (int k = 0; k < h->attempts; k++) {
        if (k)
            hub_wait_before_retry(h, r, k);
        if (hub_cancelled(h))
            return cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
        free(r->body);
        *r = (struct reply){.max = HUB_LIST_MAX_BYTES};
        CURL *c = hub_handle(h, url, r, curl_err);
        if (!c)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_json_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
        CURLcode cc = curl_easy_perform(c);
        curl_easy_cleanup(c);
        if (r->too_big)
            return cairn_fail(err, errlen, CAIRN_ERANGE, "%s: an answer over %zu bytes", what, r->max);
        if (cc != CURLE_OK) {
            cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", what, curl_err[0] ? curl_err : curl_easy_strerror(cc));
            r->status = 0;
            continue;
        }
        if (hub_retryable(r->status)) {
            cairn_fail(err, errlen, CAIRN_EIO, "%s: HTTP %ld", what, r->status);
            continue;
        }
        if (r->status != 200)
            return hub_status_error(h, r, what, err, errlen);
        json_error_t je;
        *out = json_loadb(r->body ? r->body : "", r->len, 0, &je);
        if (!*out)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not JSON (%s)", what, je.text);
        return 0;
    }
    return CAIRN_EIO; /* err holds the last reason */
}

/* ---- the listing ---- */


void hub_listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->f[i].path);
        free((char *)l->f[i].sha256);
    }
    free(l->f);
    *l = (struct listing){0};
}

bool hub_is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f'))
            return false;
    return true;
}

/* Adds a listing entry that is a file with a path, a size and, when it is LFS, a
 * SHA-256; other entries (folders, malformed ones) are skipped. */
static int add_entry(struct listing *l, json_t *e)
{
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *path = json_string_value(json_object_get(e, "path"));
    json_t *size = json_object_get(e, "size");
    const char *oid = json_string_value(json_object_get(json_object_get(e, "lfs"), "oid"));
    if (!type || strcmp(type, "file") || !path || strlen(path) > HUBREF_PATH_MAX || !json_is_integer(size) ||
        json_integer_value(size) < 0)
        return 0;
    if (l->n == HUB_LIST_MAX_FILES)
        return CAIRN_ERANGE;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct hub_file *f = realloc(l->f, cap * sizeof *f);
        if (!f)
            return CAIRN_ENOMEM;
        l->f = f;
        l->cap = cap;
    }
    char *p = strdup(path), *s = oid && hub_is_hex(oid, 64) ? strdup(oid) : NULL;
    if (!p || (oid && hub_is_hex(oid, 64) && !s)) {
        free(p);
        free(s);
        return CAIRN_ENOMEM;
    }
    l->f[l->n++] = (struct hub_file){.path = p, .size = (uint64_t)json_integer_value(size), .sha256 = s};
    return 0;
}

bool hub_next_page(const char *endpoint, const char *link, char *url, size_t cap)
{
    size_t en = strlen(endpoint);
    for (const char *p = link; (p = strchr(p, '<')); p++) {
        const char *end = strchr(p, '>');
        if (!end)
            return false;
        const char *rel = strstr(end, "rel=\"next\"");
        const char *comma = strchr(end, ',');
        if (rel && (!comma || rel < comma)) {
            size_t n = (size_t)(end - p - 1);
            /* on the hub: the endpoint, then a path ("https://hub.example.evil" or
             * "https://hub.example@evil" would take the token elsewhere) */
            if (n >= cap || n <= en || strncmp(p + 1, endpoint, en) || p[1 + en] != '/')
                return false;
            memcpy(url, p + 1, n);
            url[n] = 0;
            return true;
        }
    }
    return false;
}

int hub_listing_add_page(struct listing *l, const json_t *page)
{
    if (!json_is_array(page))
        return CAIRN_EFORMAT;
    size_t i;
    json_t *e;
    json_array_foreach(page, i, e) {
        int rc = add_entry(l, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* The revision's commit, then every file of the repo at that commit. */
int hub_list_repo(const struct hub *h, const struct hub_ref *ref, struct listing *l, char *err, size_t errlen)
{
    char url[4096], what[512], rev[256] = "";
    for (const char *s = h->revision; *s && strlen(rev) + 4 < sizeof rev; s++) /* a branch may hold '/' */
        snprintf(rev + strlen(rev), sizeof rev - strlen(rev), *s == '/' ? "%%2F" : "%c", *s);
    snprintf(what, sizeof what, "%s/%s (revision %s)", ref->owner, ref->repo, h->revision);
    snprintf(url, sizeof url, "%s/api/models/%s/%s/revision/%s", h->endpoint, ref->owner, ref->repo, rev);
    struct reply r = {0};
    json_t *j = NULL;
    int rc = hub_get_json(h, url, what, &j, &r, err, errlen);
    const char *sha = json_string_value(json_object_get(j, "sha"));
    if (!rc && (!sha || !hub_is_hex(sha, 40)))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub names no commit", what);
    if (!rc)
        snprintf(l->commit, sizeof l->commit, "%s", sha);
    json_decref(j);
    snprintf(url, sizeof url, "%s/api/models/%s/%s/tree/%s?recursive=true", h->endpoint, ref->owner, ref->repo,
             l->commit);
    for (int page = 0; !rc; page++) {
        if (page == HUB_LIST_MAX_PAGES) {
            rc = cairn_fail(err, errlen, CAIRN_ERANGE, "%s: more than %d pages of files", what, HUB_LIST_MAX_PAGES);
            break;
        }
        rc = hub_get_json(h, url, what, &j, &r, err, errlen);
        if (!rc && (rc = hub_listing_add_page(l, j)) == CAIRN_EFORMAT)
            cairn_fail(err, errlen, rc, "%s: the listing is not an array", what);
        else if (j && rc) /* hub_get_json gave no page when it failed */
            cairn_fail(err, errlen, rc, "%s: more than %d files, or out of memory", what, HUB_LIST_MAX_FILES);
        json_decref(j);
        if (rc || !hub_next_page(h->endpoint, r.link, url, sizeof url))
            break;
    }
    free(r.body);
    return rc;
}

/* ---- search ---- */

int hub_search(const struct hub_config *cfg, const char *query, int limit, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    struct hub h;
    hub_settle(&h, cfg);
    size_t qn = query ? strlen(query) : 0;
    if (!qn || qn > HUB_QUERY_MAX || limit < 1 || limit > HUB_SEARCH_MAX)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "a search of 1..%d bytes for 1..%d repos", HUB_QUERY_MAX,
                          HUB_SEARCH_MAX);
    if (h.offline)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "HF_HUB_OFFLINE is set: no search");
    hub_curl_init();
    char *q = curl_easy_escape(NULL, query, (int)qn);
    if (!q)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    char url[1024];
    snprintf(url, sizeof url, "%s/api/models?search=%s&filter=gguf&sort=downloads&direction=-1&limit=%d", h.endpoint,
             q, limit);
    curl_free(q);
    struct reply r = {0};
    json_t *j = NULL;
    int rc = hub_get_json(&h, url, "the hub's search", &j, &r, err, errlen);
    free(r.body);
    if (!rc && !json_is_array(j))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "the hub's search: not a list");
    json_t *arr = rc ? NULL : json_array(), *e;
    size_t i;
    json_array_foreach(arr ? j : NULL, i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        char ref[HUBREF_TEXT_MAX];
        struct hub_ref hr;
        if (!id || strlen(id) > 2 * HUBREF_NAME_MAX + 1 || hubref_parse(id, &hr, NULL, 0) || hr.tag[0] || hr.path[0] ||
            (int)json_array_size(arr) == limit)
            continue;
        snprintf(ref, sizeof ref, "hf.co/%s/%s", hr.owner, hr.repo);
        json_t *gated = json_object_get(e, "gated");
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:I, s:b}", "id", id, "ref", ref, "downloads",
                                             json_integer_value(json_object_get(e, "downloads")), "likes",
                                             json_integer_value(json_object_get(e, "likes")), "gated",
                                             json_is_string(gated) || json_is_true(gated)));
    }
    json_decref(j);
    *out = arr;
    return rc;
}
