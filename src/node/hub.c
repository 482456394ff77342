/* Pulling models from the hub (hub.h). */
#define _GNU_SOURCE /* strcasestr */
#include "node/hub.h"

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
#include "node/sha256.h"
#include "proto/ids.h"

#define HDR_MAX 512

/* The settings once the environment is read. */
struct hub {
    const struct hub_config *cfg;
    char endpoint[512];
    const char *token;
    const char *revision;
    bool offline;
    int attempts, backoff_ms, stall_s;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_start(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static bool cancelled(const struct hub *h) { return h->cfg->cancel && atomic_load(h->cfg->cancel); }

static void nap_ms(const struct hub *h, int64_t ms)
{
    for (int64_t t = 0; t < ms && !cancelled(h); t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- one HTTP exchange ---- */

/* What an answer said, as far as we read it. */
struct reply {
    long status;
    char error_code[HDR_MAX]; /* X-Error-Code */
    char retry_after[HDR_MAX];
    char link[2048];          /* Link (listing pages) */
    char commit[HDR_MAX];     /* X-Repo-Commit: the hub's answer, before a redirect */
    char etag[HDR_MAX];       /* X-Linked-Etag */
    char crange[HDR_MAX];     /* Content-Range of the last answer */
    /* a body kept in memory (JSON) */
    char *body;
    size_t len, cap, max;
    bool too_big;
};

static void keep(char *dst, const char *v, size_t n)
{
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    if (n >= HDR_MAX)
        n = HDR_MAX - 1;
    memcpy(dst, v, n);
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
static CURL *handle(const struct hub *h, const char *url, struct reply *r, char *curl_err)
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

static bool retryable(long status) { return status == 429 || status == 408 || status >= 500; }

/* The error for an answer that is not a success and will not be retried. */
static int status_error(const struct hub *h, const struct reply *r, const char *what, char *err, size_t errlen)
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
static void wait_before_retry(const struct hub *h, const struct reply *r, int k)
{
    int64_t ms = retry_after_ms(r);
    if (ms < 0) {
        ms = h->backoff_ms;
        for (int i = 1; i < k && ms < HUB_BACKOFF_MAX_MS; i++)
            ms *= 2;
        ms = ms > HUB_BACKOFF_MAX_MS ? HUB_BACKOFF_MAX_MS : ms;
    }
    log_info("hub: %s; trying again in %" PRId64 " ms", r->status ? "the hub is busy or failing" : "no answer", ms);
    nap_ms(h, ms);
}

/* GET url as JSON into *out, retrying what is worth retrying. what names it in errors. */
static int get_json(const struct hub *h, const char *url, const char *what, json_t **out, struct reply *r, char *err,
                    size_t errlen)
{
    *out = NULL;
    char curl_err[CURL_ERROR_SIZE];
    for (int k = 0; k < h->attempts; k++) {
        if (k)
            wait_before_retry(h, r, k);
        if (cancelled(h))
            return cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
        free(r->body);
        *r = (struct reply){.max = HUB_LIST_MAX_BYTES};
        CURL *c = handle(h, url, r, curl_err);
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
        if (retryable(r->status)) {
            cairn_fail(err, errlen, CAIRN_EIO, "%s: HTTP %ld", what, r->status);
            continue;
        }
        if (r->status != 200)
            return status_error(h, r, what, err, errlen);
        json_error_t je;
        *out = json_loadb(r->body ? r->body : "", r->len, 0, &je);
        if (!*out)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not JSON (%s)", what, je.text);
        return 0;
    }
    return CAIRN_EIO; /* err holds the last reason */
}

/* ---- the listing ---- */

struct listing {
    struct hub_file *f; /* paths and hashes owned */
    size_t n, cap;
    char commit[48];
};

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->f[i].path);
        free((char *)l->f[i].sha256);
    }
    free(l->f);
    *l = (struct listing){0};
}

static bool is_hex(const char *s, size_t n)
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
    char *p = strdup(path), *s = oid && is_hex(oid, 64) ? strdup(oid) : NULL;
    if (!p || (oid && is_hex(oid, 64) && !s)) {
        free(p);
        free(s);
        return CAIRN_ENOMEM;
    }
    l->f[l->n++] = (struct hub_file){.path = p, .size = (uint64_t)json_integer_value(size), .sha256 = s};
    return 0;
}

/* The next page's URL from a Link header (`<url>; rel="next"`), if it is on the hub. */
static bool next_page(const struct hub *h, const char *link, char *url, size_t cap)
{
    for (const char *p = link; (p = strchr(p, '<')); p++) {
        const char *end = strchr(p, '>');
        if (!end)
            return false;
        const char *rel = strstr(end, "rel=\"next\"");
        const char *comma = strchr(end, ',');
        if (rel && (!comma || rel < comma)) {
            size_t n = (size_t)(end - p - 1);
            if (n >= cap || strncmp(p + 1, h->endpoint, strlen(h->endpoint)))
                return false;
            memcpy(url, p + 1, n);
            url[n] = 0;
            return true;
        }
    }
    return false;
}

/* The revision's commit, then every file of the repo at that commit. */
static int list_repo(const struct hub *h, const struct hub_ref *ref, struct listing *l, char *err, size_t errlen)
{
    char url[4096], what[512], rev[256] = "";
    for (const char *s = h->revision; *s && strlen(rev) + 4 < sizeof rev; s++) /* a branch may hold '/' */
        snprintf(rev + strlen(rev), sizeof rev - strlen(rev), *s == '/' ? "%%2F" : "%c", *s);
    snprintf(what, sizeof what, "%s/%s (revision %s)", ref->owner, ref->repo, h->revision);
    snprintf(url, sizeof url, "%s/api/models/%s/%s/revision/%s", h->endpoint, ref->owner, ref->repo, rev);
    struct reply r = {0};
    json_t *j = NULL;
    int rc = get_json(h, url, what, &j, &r, err, errlen);
    const char *sha = json_string_value(json_object_get(j, "sha"));
    if (!rc && (!sha || !is_hex(sha, 40)))
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
        rc = get_json(h, url, what, &j, &r, err, errlen);
        if (!rc && !json_is_array(j))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the listing is not an array", what);
        size_t i;
        json_t *e;
        json_array_foreach(rc ? NULL : j, i, e) {
            if ((rc = add_entry(l, e))) {
                cairn_fail(err, errlen, rc, "%s: more than %d files, or out of memory", what, HUB_LIST_MAX_FILES);
                break;
            }
        }
        json_decref(j);
        if (rc || !next_page(h, r.link, url, sizeof url))
            break;
    }
    free(r.body);
    return rc;
}

/* ---- one file ---- */

struct file_fetch {
    const struct hub *h;
    const struct hub_file *src;
    int fd;
    struct sha256 sha;
    uint64_t have;          /* bytes in the partial file, all hashed */
    uint64_t fetched;       /* bytes this pull downloaded, all attempts */
    bool body_checked;      /* the answer's status was looked at */
    bool body_ok;           /* it carries our bytes */
    char bad[512];
    bool local;             /* bad is about this machine (no retry) */
    struct reply r;
    /* progress */
    hub_progress_fn fn;
    void *ctx;
    struct hub_progress p;
    uint64_t done_before;   /* bytes of the earlier parts */
    int64_t reported_ms;
};

static void report(struct file_fetch *f, bool force)
{
    int64_t now = clock_ns() / 1000000;
    if (!f->fn || (!force && now - f->reported_ms < HUB_PROGRESS_MS))
        return;
    f->reported_ms = now;
    f->p.file_done = f->have;
    f->p.done = f->done_before + f->have;
    f->fn(f->ctx, &f->p);
}

/* (Re)hashes the partial file's bytes into f->sha; f->have is their count. */
static int hash_partial(struct file_fetch *f, char *err, size_t errlen)
{
    if (sha256_init(&f->sha))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF);
    if (!buf)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    int rc = 0;
    for (uint64_t at = 0; at < f->have && !rc;) {
        size_t want = f->have - at < BUF ? (size_t)(f->have - at) : BUF;
        ssize_t n = pread(f->fd, buf, want, (off_t)at);
        if (n <= 0)
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot read the partial file: %s", n < 0 ? strerror(errno) : "short");
        else
            sha256_update(&f->sha, buf, (size_t)n);
        at += n > 0 ? (uint64_t)n : 0;
    }
    free(buf);
    return rc;
}

/* Whether the answer that brings a body continues our file: 206 from f->have, or 200
 * (then the file starts again from its first byte). */
static bool accept_body(struct file_fetch *f)
{
    if (f->r.status == 206) {
        uint64_t a = 0;
        if (sscanf(f->r.crange, "bytes %" SCNu64 "-", &a) != 1 || a != f->have) {
            snprintf(f->bad, sizeof f->bad, "the storage answered Content-Range '%.200s' for bytes %" PRIu64 "-",
                     f->r.crange, f->have);
            return false;
        }
        return true;
    }
    if (f->r.status != 200)
        return false;
    if (f->have && ftruncate(f->fd, 0)) {
        snprintf(f->bad, sizeof f->bad, "cannot truncate the partial file: %s", strerror(errno));
        f->local = true;
        return false;
    }
    f->have = 0;
    if (sha256_init(&f->sha)) {
        snprintf(f->bad, sizeof f->bad, "out of memory");
        f->local = true;
        return false;
    }
    return true;
}

static size_t on_file_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct file_fetch *f = arg;
    size_t n = size * nmemb;
    if (!f->body_checked) {
        f->body_checked = true;
        f->body_ok = accept_body(f);
        if (!f->body_ok && f->bad[0])
            return 0;
    }
    if (!f->body_ok)
        return n; /* an error's body: not ours */
    if (f->have + n > f->src->size) {
        snprintf(f->bad, sizeof f->bad, "the storage sent more than the file's %" PRIu64 " bytes", f->src->size);
        return 0;
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(f->fd, data + done, n - done, (off_t)(f->have + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(f->bad, sizeof f->bad, "cannot write the partial file: %s", w < 0 ? strerror(errno) : "no room");
            f->local = true;
            return 0;
        }
        done += (size_t)w;
    }
    sha256_update(&f->sha, data, n);
    f->have += n;
    f->fetched += n;
    report(f, false);
    return n;
}

static int on_file_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct file_fetch *f = arg;
    return cancelled(f->h) ? 1 : 0;
}

/* One GET of the rest of the file from url. 0 when the file is whole; CAIRN_EIO to try
 * again (f->r says why); other codes end the fetch. */
static int get_rest(struct file_fetch *f, const char *url, char *err, size_t errlen)
{
    char curl_err[CURL_ERROR_SIZE], range[48];
    f->r = (struct reply){0};
    f->body_checked = f->body_ok = false;
    f->bad[0] = 0;
    CURL *c = handle(f->h, url, &f->r, curl_err);
    if (!c)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    snprintf(range, sizeof range, "%" PRIu64 "-", f->have);
    if (f->have)
        curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_file_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_file_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, f);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)f->h->stall_s);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    const char *what = f->src->path;
    if (cancelled(f->h))
        return cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
    if (f->bad[0])
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", what, f->bad);
    if (cc != CURLE_OK) {
        f->r.status = 0;
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: %s (%" PRIu64 " of %" PRIu64 " bytes here)", what,
                          curl_err[0] ? curl_err : curl_easy_strerror(cc), f->have, f->src->size);
    }
    if (f->r.status == 416) { /* our partial is not a prefix of this file: start again */
        if (ftruncate(f->fd, 0) == 0)
            f->have = 0;
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: the storage refused the range %s", what, range);
    }
    if (retryable(f->r.status))
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: HTTP %ld", what, f->r.status);
    if (f->r.status != 200 && f->r.status != 206)
        return status_error(f->h, &f->r, what, err, errlen);
    if (f->have != f->src->size)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: the answer ended at %" PRIu64 " of %" PRIu64 " bytes", what,
                          f->have, f->src->size);
    return 0;
}

/* Fetches src into partial_path (resuming what is there) and checks its SHA-256: 0 when
 * the partial file is whole and right. */
static int fetch_file(struct file_fetch *f, const char *url, const char *partial_path, char *err, size_t errlen)
{
    const char *want = f->src->sha256;
    f->fd = open(partial_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f->fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot open %s: %s", partial_path, strerror(errno));
    struct stat st;
    int rc = fstat(f->fd, &st) ? CAIRN_EIO : 0;
    f->have = rc ? 0 : (uint64_t)st.st_size;
    if (f->have > f->src->size && !ftruncate(f->fd, 0))
        f->have = 0;
    if (!rc && f->have)
        rc = hash_partial(f, err, errlen);
    else if (!rc && sha256_init(&f->sha))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    report(f, true);
    for (int k = 0; !rc && f->have < f->src->size; k++) {
        if (k == f->h->attempts) {
            rc = CAIRN_EIO; /* err holds the last reason */
            break;
        }
        if (k)
            wait_before_retry(f->h, &f->r, k);
        rc = get_rest(f, url, err, errlen);
        if (rc == CAIRN_EIO && !f->local && !cancelled(f->h)) {
            log_warn("hub: %s", err);
            rc = 0;
        }
    }
    if (!rc)
        report(f, true); /* the whole file: the last word of "downloading" */
    if (!rc && f->r.etag[0]) { /* the hub's own word on the hash, beside the listing's */
        char tag[HDR_MAX];
        snprintf(tag, sizeof tag, "%s", f->r.etag + (f->r.etag[0] == '"'));
        tag[strcspn(tag, "\"")] = 0;
        if (want && is_hex(tag, 64) && strcmp(tag, want))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub lists SHA-256 %s but serves %s", f->src->path,
                            want, tag);
    }
    if (!rc) {
        char hex[SHA256_HEX];
        sha256_final_hex(&f->sha, hex);
        f->p.status = "verifying";
        report(f, true);
        if (strcmp(hex, want)) {
            unlink(partial_path);
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT,
                            "%s: the SHA-256 of the downloaded bytes is %s, not the hub's %s: the file was deleted",
                            f->src->path, hex, want);
        }
    }
    sha256_drop(&f->sha); /* when it was not finished */
    if (fsync(f->fd) && !rc)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot sync %s: %s", partial_path, strerror(errno));
    close(f->fd);
    f->fd = -1;
    return rc;
}

/* ---- the sidecar ---- */

/* models_dir/name into out (cap bytes); false when it does not fit. */
static bool in_dir(const char *dir, const char *name, char *out, size_t cap)
{
    int w = snprintf(out, cap, "%s/%s", dir, name);
    return w > 0 && (size_t)w < cap;
}

/* Reads models_dir's sidecar of id; NULL when there is none or it is not one. */
static json_t *sidecar_load(const char *models_dir, const char *id)
{
    char name[HUBREF_TEXT_MAX + 16], path[4096];
    hubref_sidecar_name(id, name);
    if (!in_dir(models_dir, name, path, sizeof path))
        return NULL;
    json_t *j = json_load_file(path, 0, NULL);
    const char *ref = json_string_value(json_object_get(j, "ref"));
    if (!ref || strcmp(ref, id) || !json_is_array(json_object_get(j, "files"))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* Whether every file a sidecar lists is in place with its size (and, with commit, the
 * sidecar is of that commit); fills out's paths and sizes. */
static bool sidecar_complete(const char *models_dir, json_t *side, const char *commit, struct hub_pulled *out)
{
    const char *c = json_string_value(json_object_get(side, "commit"));
    json_t *files = json_object_get(side, "files"), *e;
    size_t i, n = json_array_size(files);
    if (!c || (commit && strcmp(c, commit)) || !n || n > HUBREF_MAX_PARTS)
        return false;
    uint64_t bytes = 0;
    json_array_foreach(files, i, e) {
        char path[4096];
        const char *local = json_string_value(json_object_get(e, "local"));
        json_int_t size = json_integer_value(json_object_get(e, "size"));
        struct stat st;
        if (!local || strchr(local, '/') || !in_dir(models_dir, local, path, sizeof path) || stat(path, &st) ||
            (json_int_t)st.st_size != size)
            return false;
        if (i == 0)
            snprintf(out->path, sizeof out->path, "%s", path);
        bytes += (uint64_t)size;
    }
    snprintf(out->commit, sizeof out->commit, "%s", c);
    out->bytes = bytes;
    out->parts = (int)n;
    return true;
}

/* Stores j (taken) as id's sidecar in models_dir, through a temporary file and a rename. */
static int sidecar_store(const char *models_dir, const char *id, json_t *j, char *err, size_t errlen)
{
    char name[HUBREF_TEXT_MAX + 16], path[4096], tmp[4200];
    hubref_sidecar_name(id, name);
    int rc = 0;
    if (!j || !in_dir(models_dir, name, path, sizeof path))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot write the sidecar of %s", id);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!rc && (json_dump_file(j, tmp, JSON_INDENT(1)) || files_sync(tmp, O_RDONLY) || rename(tmp, path)))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot write %s: %s", path, strerror(errno));
    json_decref(j);
    return rc;
}

/* Writes the sidecar of a pull. */
static int sidecar_write(const struct hub *h, const char *id, const struct hub_ref *ref, const struct listing *l,
                         const size_t *pick, size_t n_pick, char *err, size_t errlen)
{
    json_t *files = json_array();
    for (size_t k = 0; k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        char local[HUBREF_TEXT_MAX];
        hubref_local_name(id, (int)k + 1, (int)n_pick, local);
        json_array_append_new(files, json_pack("{s:s, s:s, s:s, s:I}", "path", f->path, "local", local, "sha256",
                                               f->sha256, "size", (json_int_t)f->size));
    }
    char repo[2 * HUBREF_NAME_MAX + 2];
    snprintf(repo, sizeof repo, "%s/%s", ref->owner, ref->repo);
    return sidecar_store(h->cfg->models_dir, id,
                         json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "ref", id, "repo", repo, "revision", h->revision,
                                   "commit", l->commit, "endpoint", h->endpoint, "files", files),
                         err, errlen);
}

int hub_sidecar_put(const char *models_dir, const char *id, const char *sha256, uint64_t size, char *err,
                    size_t errlen)
{
    char local[HUBREF_TEXT_MAX];
    hubref_local_name(id, 1, 1, local);
    return sidecar_store(models_dir, id,
                         json_pack("{s:s, s:s, s:s, s:[{s:s, s:s, s:s, s:I}]}", "ref", id, "commit", "", "source",
                                   "peer", "files", "path", local, "local", local, "sha256", sha256, "size",
                                   (json_int_t)size),
                         err, errlen);
}

bool hub_sidecar_id(const char *gguf_path, char *id)
{
    const char *slash = strrchr(gguf_path, '/');
    const char *base = slash ? slash + 1 : gguf_path;
    char dir[4096], stem[HUBREF_TEXT_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - gguf_path) : 1, slash ? gguf_path : ".");
    snprintf(stem, sizeof stem, "%s", base);
    int part, count;
    size_t n = strlen(stem);
    if (hubref_split_part(stem, &part, &count))
        stem[n - 20] = 0;
    else if (n > 5 && !strcasecmp(stem + n - 5, ".gguf"))
        stem[n - 5] = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s" HUB_SIDECAR, dir, stem);
    json_t *j = json_load_file(path, 0, NULL);
    const char *ref = json_string_value(json_object_get(j, "ref"));
    const char *first = json_string_value(json_object_get(json_array_get(json_object_get(j, "files"), 0), "local"));
    bool ok = ref && ids_valid_model(ref) && first && !strcmp(first, base);
    if (ok)
        snprintf(id, HUBREF_TEXT_MAX, "%s", ref);
    json_decref(j);
    return ok;
}

/* ---- a pull ---- */

static void settle(struct hub *h, const struct hub_config *cfg)
{
    const char *env = getenv("HF_ENDPOINT");
    snprintf(h->endpoint, sizeof h->endpoint, "%s", cfg->endpoint ? cfg->endpoint : env && env[0] ? env : HUB_DEFAULT_ENDPOINT);
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
}

/* The pull when the hub is not to be asked: the model must be here already. */
static int pull_offline(const struct hub *h, const struct hub_ref *ref, struct hub_pulled *out, char *err,
                        size_t errlen)
{
    hubref_text(ref, ref->path[0] || ref->tag[0] ? NULL : HUBREF_DEFAULT_TAG, out->id);
    json_t *side = sidecar_load(h->cfg->models_dir, out->id);
    bool here = side && sidecar_complete(h->cfg->models_dir, side, NULL, out);
    json_decref(side);
    if (!here)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "HF_HUB_OFFLINE is set and %s is not in %s", out->id,
                          h->cfg->models_dir);
    out->already = true;
    return 0;
}

/* Fetches the chosen files, then writes the sidecar and moves the files into place. */
static int fetch_all(const struct hub *h, const struct hub_ref *ref, const struct listing *l, const size_t *pick,
                     size_t n_pick, hub_progress_fn fn, void *ctx, struct hub_pulled *out, char *err, size_t errlen)
{
    uint64_t total = 0, need = 0;
    char partial[HUBREF_MAX_PARTS][4200], final[HUBREF_MAX_PARTS][4200];
    for (size_t k = 0; k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        if (!f->sha256)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub gives no SHA-256 of it (not an LFS file)",
                              f->path);
        char local[HUBREF_TEXT_MAX], dot[HUBREF_TEXT_MAX + 16];
        hubref_local_name(out->id, (int)k + 1, (int)n_pick, local);
        snprintf(dot, sizeof dot, ".%s.partial", local);
        if (!in_dir(h->cfg->models_dir, local, final[k], sizeof final[k]) ||
            !in_dir(h->cfg->models_dir, dot, partial[k], sizeof partial[k]))
            return cairn_fail(err, errlen, CAIRN_ERANGE, "the models folder's path is too long");
        struct stat st;
        uint64_t have = stat(partial[k], &st) ? 0 : (uint64_t)st.st_size;
        total += f->size;
        need += f->size > have ? f->size - have : 0;
    }
    int rc = download_disk_check(h->cfg->models_dir, need, err, errlen);
    struct file_fetch ff = {.h = h, .fd = -1, .fn = fn, .ctx = ctx};
    ff.p = (struct hub_progress){.status = "downloading", .id = out->id, .parts = (int)n_pick, .total = total};
    for (size_t k = 0; !rc && k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        char url[4096];
        snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", h->endpoint, ref->owner, ref->repo, l->commit, f->path);
        ff.src = f;
        ff.p.status = "downloading";
        ff.p.file = f->path;
        ff.p.sha256 = f->sha256;
        ff.p.part = (int)k + 1;
        ff.p.file_total = f->size;
        log_info("hub: %s: %s (%" PRIu64 " bytes), part %zu of %zu", out->id, f->path, f->size, k + 1, n_pick);
        rc = fetch_file(&ff, url, partial[k], err, errlen);
        ff.done_before += f->size;
    }
    out->fetched = ff.fetched;
    if (!rc)
        rc = sidecar_write(h, out->id, ref, l, pick, n_pick, err, errlen);
    for (size_t k = n_pick; !rc && k-- > 0;) /* the first part last: the catalog lists a whole model */
        if (rename(partial[k], final[k]))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot rename %s: %s", partial[k], strerror(errno));
    if (rc)
        return rc;
    files_sync(h->cfg->models_dir, O_RDONLY | O_DIRECTORY);
    snprintf(out->path, sizeof out->path, "%.4000s", final[0]);
    snprintf(out->commit, sizeof out->commit, "%s", l->commit);
    out->bytes = total;
    out->parts = (int)n_pick;
    ff.p.status = "success";
    ff.p.file_done = ff.src->size;
    ff.p.done = total;
    if (fn)
        fn(ctx, &ff.p);
    return 0;
}

int hub_pull(const struct hub_config *cfg, const char *text, hub_progress_fn fn, void *ctx, struct hub_pulled *out,
             char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    struct hub h;
    settle(&h, cfg);
    struct hub_ref ref;
    int rc = hubref_parse(text, &ref, err, errlen);
    if (rc)
        return rc;
    if (!cfg->models_dir || !cfg->models_dir[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no models folder");
    if ((rc = files_make_dirs(cfg->models_dir, 0755, err, errlen)))
        return rc;
    if (h.offline)
        return pull_offline(&h, &ref, out, err, errlen);
    pthread_once(&curl_once, curl_start);
    if (fn)
        fn(ctx, &(struct hub_progress){.status = "listing", .id = "", .file = "", .sha256 = ""});
    struct listing l = {0};
    size_t pick[HUBREF_MAX_PARTS], n_pick = 0;
    char tag[HUBREF_TAG_MAX + 1];
    rc = list_repo(&h, &ref, &l, err, errlen);
    if (!rc)
        rc = hubref_choose(&ref, l.f, l.n, pick, &n_pick, tag, err, errlen);
    if (!rc) {
        hubref_text(&ref, tag[0] ? tag : NULL, out->id);
        if (!ids_valid_model(out->id))
            rc = cairn_fail(err, errlen, CAIRN_EINVAL, "%.300s: longer than a model id (%d bytes)", out->id,
                            IDS_MODEL_MAX);
    }
    json_t *side = rc ? NULL : sidecar_load(cfg->models_dir, out->id);
    if (side && sidecar_complete(cfg->models_dir, side, l.commit, out)) {
        out->already = true;
        if (fn)
            fn(ctx, &(struct hub_progress){.status = "success", .id = out->id, .file = "", .sha256 = "",
                                           .done = out->bytes, .total = out->bytes});
    } else if (!rc) {
        rc = fetch_all(&h, &ref, &l, pick, n_pick, fn, ctx, out, err, errlen);
    }
    json_decref(side);
    listing_free(&l);
    if (!rc)
        log_info("hub: %s: %s (commit %.12s, %" PRIu64 " bytes in %d file%s)", out->id,
                 out->already ? "already here" : "pulled", out->commit, out->bytes, out->parts, out->parts > 1 ? "s" : "");
    return rc;
}

/* ---- removing ---- */

/* Unlinks path unless it is already gone; false (err set) when it cannot. */
static bool unlink_file(const char *path, char *err, size_t errlen)
{
    if (!unlink(path) || errno == ENOENT)
        return true;
    cairn_fail(err, errlen, CAIRN_EIO, "cannot delete %s: %s", path, strerror(errno));
    return false;
}

int hub_remove(const char *models_dir, const char *id, char *err, size_t errlen)
{
    json_t *side = sidecar_load(models_dir, id);
    char path[4200];
    if (side) {
        bool ok = true;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(side, "files"), i, e) { /* the first part first: out of the catalog at once */
            const char *local = json_string_value(json_object_get(e, "local"));
            char dot[HUBREF_TEXT_MAX + 16];
            if (!local || strchr(local, '/') || local[0] == '.')
                continue;
            snprintf(dot, sizeof dot, ".%s.partial", local);
            if (in_dir(models_dir, local, path, sizeof path))
                ok = ok && unlink_file(path, err, errlen);
            if (in_dir(models_dir, dot, path, sizeof path))
                ok = ok && unlink_file(path, err, errlen);
        }
        json_decref(side);
        char name[HUBREF_TEXT_MAX + 16];
        hubref_sidecar_name(id, name);
        if (ok && in_dir(models_dir, name, path, sizeof path))
            ok = unlink_file(path, err, errlen);
        return ok ? 0 : CAIRN_EIO;
    }
    struct catalog *c = NULL;
    int rc = catalog_create(&c, models_dir, err, errlen);
    if (!rc)
        rc = catalog_scan(c, err, errlen);
    const struct catalog_card *k = rc ? NULL : catalog_find(c, id);
    if (!rc && !k)
        rc = cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no model %s in %s", id, models_dir);
    if (!rc && !unlink_file(k->path, err, errlen))
        rc = CAIRN_EIO;
    catalog_release(c);
    return rc;
}
