/* One file of a pull (hub_int.h): resumed, hashed as it arrives, checked. */
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
#include "node/ranges.h"
#include "node/sha256.h"
#include "proto/ids.h"

/* ---- one file ---- */


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

/* Whether a connection that has brought `bytes` in `ms` is too slow to fetch the rest of
 * f alone: after HUB_SLOW_AFTER_MS, below HUB_FAST_CONNECTION bytes a second, with more
 * than HUB_PARALLEL_MIN left and more than one connection allowed. */
static bool slow_alone(const struct file_fetch *f, uint64_t bytes, int64_t ms)
{
    return f->h->connections > 1 && ms >= HUB_SLOW_AFTER_MS && bytes * 1000 / (uint64_t)ms < HUB_FAST_CONNECTION &&
           f->src->size - f->have >= HUB_PARALLEL_MIN;
}

static int on_file_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct file_fetch *f = arg;
    if (hub_cancelled(f->h))
        return 1;
    if (f->body_ok && slow_alone(f, f->have - f->get_have0, clock_ns() / 1000000 - f->get_t0_ms)) {
        f->go_parallel = true; /* stops this GET: the rest comes over several connections */
        return 1;
    }
    return 0;
}

/* One GET of the rest of the file from url. 0 when the file is whole; CAIRN_EIO to try
 * again (f->r says why); other codes end the fetch. */
static int get_rest(struct file_fetch *f, const char *url, char *err, size_t errlen)
{
    char curl_err[CURL_ERROR_SIZE], range[48];
    f->r = (struct reply){0};
    f->body_checked = f->body_ok = false;
    f->bad[0] = 0;
    f->get_t0_ms = clock_ns() / 1000000;
    f->get_have0 = f->have;
    CURL *c = hub_handle(f->h, url, &f->r, curl_err);
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
    if (hub_cancelled(f->h))
        return cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
    if (f->go_parallel)
        return 0;
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
    if (hub_retryable(f->r.status))
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: HTTP %ld", what, f->r.status);
    if (f->r.status != 200 && f->r.status != 206)
        return hub_status_error(f->h, &f->r, what, err, errlen);
    if (f->have != f->src->size)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: the answer ended at %" PRIu64 " of %" PRIu64 " bytes", what,
                          f->have, f->src->size);
    return 0;
}

/* ---- several connections at once ---- */

#define HASH_STEP ((size_t)8 << 20)

struct par {
    struct file_fetch *f;
    const char *url, *have_path;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a range recorded, or a connection done */
    struct ranges have;  /* under mu, as the rest */
    uint64_t next;       /* the next offset to hand out */
    int running;         /* connections at work */
    int rc;              /* the first failure */
    char err[512];
};

/* The next chunk to fetch: the first hole from p->next, at most HUB_CHUNK long. */
static bool take_chunk(struct par *p, uint64_t *a, uint64_t *b)
{
    pthread_mutex_lock(&p->mu);
    bool got = !p->rc && !hub_cancelled(p->f->h) && ranges_next_hole(&p->have, p->next, p->f->src->size, a, b);
    if (got) {
        if (*b - *a > HUB_CHUNK)
            *b = *a + HUB_CHUNK;
        p->next = *b;
    }
    pthread_mutex_unlock(&p->mu);
    return got;
}

/* One connection's chunk: [a, a + got) has arrived, [a, a + recorded) is in the record. */
struct conn {
    struct par *p;
    uint64_t a, got, recorded;
};

/* Records the bytes of c's chunk that arrived (under p->mu), so a killed pull loses at
 * most HUB_RECORD_EVERY per connection. Not synced: a power cut may leave a record
 * naming bytes that never reached the disk, which the file's hash then refuses (the
 * pull starts that file again); syncing every few MiB would cost more than it saves. */
static int record(struct conn *c, char *err, size_t errlen)
{
    struct par *p = c->p;
    if (c->got == c->recorded)
        return 0;
    pthread_mutex_lock(&p->mu);
    int rc = ranges_add(&p->have, c->a + c->recorded, c->a + c->got) ? 0
                                                                    : cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (!rc)
        rc = ranges_store(p->have_path, &p->have, false, err, errlen);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (!rc)
        c->recorded = c->got;
    return rc;
}

static void par_bytes(void *ctx, uint64_t n)
{
    struct conn *c = ctx;
    struct par *p = c->p;
    pthread_mutex_lock(&p->mu);
    p->f->have += n;
    p->f->fetched += n;
    report(p->f, false);
    pthread_mutex_unlock(&p->mu);
    c->got += n;
    char ignored[256];
    if (c->got - c->recorded >= HUB_RECORD_EVERY)
        record(c, ignored, sizeof ignored); /* a failure here shows again at the chunk's end */
}

static void *par_main(void *arg)
{
    struct par *p = arg;
    uint64_t a, b;
    char err[512];
    while (take_chunk(p, &a, &b)) {
        struct conn c = {.p = p, .a = a};
        int rc = hub_fetch_range(p->f->h, p->url, p->f->fd, a, b - a, par_bytes, &c, err, sizeof err);
        int rrc = record(&c, err, sizeof err); /* what arrived stays, even when the rest failed */
        rc = rc ? rc : rrc;
        pthread_mutex_lock(&p->mu);
        if (rc && !p->rc) {
            p->rc = rc;
            snprintf(p->err, sizeof p->err, "%s", err);
        }
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_lock(&p->mu);
    p->running--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Fetches the holes of f's partial file (sized to the whole file, with its record at
 * have_path) over the pull's connections; 0 once every byte is there. */
/* continuing: f->sha holds the hash of the file's first f->have bytes (a single
 * connection's, handing over); else the hash starts here. */
static int fetch_parallel(struct file_fetch *f, const char *url, const char *have_path, bool continuing, char *err,
                          size_t errlen)
{
    uint64_t hashed = continuing ? f->have : 0;
    struct par p = {.f = f, .url = url, .have_path = have_path};
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    uint64_t size = f->src->size;
    ranges_load(have_path, size, &p.have);
    f->have = size - ranges_missing(&p.have, 0, size);
    report(f, true);
    int rc = !continuing && sha256_init(&f->sha) ? cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory") : 0;
    unsigned char *buf = rc ? NULL : malloc(HASH_STEP);
    if (!rc && !buf)
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_t th[HUB_CONNECTIONS_MAX];
    int n = 0;
    if (!rc && !pthread_create(&th[0], NULL, par_main, &p))
        n = p.running = 1;
    else if (!rc)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot start a thread");
    /* One connection first, more when it proves slow (a CDN limits each one), at once
     * when one already did; meanwhile this thread hashes the bytes as they become a
     * prefix of the file. */
    int64_t t0 = clock_ns() / 1000000;
    uint64_t fetched0 = f->fetched;
    pthread_mutex_lock(&p.mu);
    while (!rc) {
        uint64_t prefix, ignored;
        if (!ranges_next_hole(&p.have, 0, size, &prefix, &ignored))
            prefix = size;
        if (prefix > hashed) {
            pthread_mutex_unlock(&p.mu);
            size_t step = prefix - hashed < HASH_STEP ? (size_t)(prefix - hashed) : HASH_STEP;
            ssize_t got = pread(f->fd, buf, step, (off_t)hashed);
            pthread_mutex_lock(&p.mu);
            if (got <= 0) {
                rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot read the partial file back: %s",
                                got < 0 ? strerror(errno) : "short");
                break;
            }
            sha256_update(&f->sha, buf, (size_t)got);
            hashed += (uint64_t)got;
            continue;
        }
        if (!p.running)
            break;
        int64_t ms = clock_ns() / 1000000 - t0;
        if (n < f->h->connections && (continuing || slow_alone(f, f->fetched - fetched0, ms))) {
            for (; n < f->h->connections && !pthread_create(&th[n], NULL, par_main, &p); n++)
                p.running++;
            log_info("hub: %s: %d connections (one was slow)", f->src->path, n);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000000L;
        if (until.tv_nsec >= 1000000000L)
            until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p.cv, &p.mu, &until);
    }
    if (rc) /* the workers stop at their next chunk */
        p.rc = p.rc ? p.rc : rc;
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(buf);
    if (hub_cancelled(f->h))
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
    else if (!rc && p.rc)
        rc = cairn_fail(err, errlen, p.rc, "%s: %s", f->src->path, p.err);
    else if (!rc && hashed != size)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s: holes remain after the fetch", f->src->path);
    ranges_free(&p.have);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    return rc;
}

/* Turns a partial file of f->have bytes (a prefix) into one of a parallel fetch: its
 * record of that prefix first, then the file's whole size. */
static int to_parallel(struct file_fetch *f, const char *have_path, char *err, size_t errlen)
{
    struct ranges r = {.size = f->src->size};
    int rc = f->have && !ranges_add(&r, 0, f->have) ? cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory") : 0;
    if (!rc)
        rc = ranges_store(have_path, &r, true, err, errlen);
    if (!rc && ftruncate(f->fd, (off_t)f->src->size))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot size the partial file: %s", strerror(errno));
    ranges_free(&r);
    return rc;
}

/* Fetches src into partial_path (resuming what is there) and checks its SHA-256: 0 when
 * the partial file is whole and right. */
int hub_fetch_file(struct file_fetch *f, const char *url, const char *partial_path, char *err, size_t errlen)
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
    char have_path[4200];
    snprintf(have_path, sizeof have_path, "%s" RANGES_SUFFIX, partial_path);
    bool par = !rc && !access(have_path, F_OK); /* a parallel fetch's file, to resume */
    if (par) {
        rc = fetch_parallel(f, url, have_path, false, err, errlen); /* hashed as its prefix grows */
    } else if (!rc && f->have) {
        rc = hash_partial(f, err, errlen);
    } else if (!rc && sha256_init(&f->sha)) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    if (!par)
        report(f, true);
    for (int k = 0; !par && !rc && f->have < f->src->size; k++) {
        if (k == f->h->attempts) {
            rc = CAIRN_EIO; /* err holds the last reason */
            break;
        }
        if (k)
            hub_wait_before_retry(f->h, &f->r, k);
        rc = get_rest(f, url, err, errlen);
        if (rc == CAIRN_EIO && !f->local && !hub_cancelled(f->h)) {
            log_warn("hub: %s", err);
            rc = 0;
        }
        if (!rc && f->go_parallel) { /* the prefix so far is hashed: the rest in ranges */
            par = true;
            rc = to_parallel(f, have_path, err, errlen);
            if (!rc)
                rc = fetch_parallel(f, url, have_path, true, err, errlen);
        }
    }
    if (!rc)
        report(f, true); /* the whole file: the last word of "downloading" */
    if (!rc && f->r.etag[0]) { /* the hub's own word on the hash, beside the listing's */
        char tag[HDR_MAX];
        snprintf(tag, sizeof tag, "%s", f->r.etag + (f->r.etag[0] == '"'));
        tag[strcspn(tag, "\"")] = 0;
        if (want && hub_is_hex(tag, 64) && strcmp(tag, want))
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
            unlink(have_path);
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT,
                            "%s: the SHA-256 of the downloaded bytes is %s, not the hub's %s: the file was deleted",
                            f->src->path, hex, want);
        }
    }
    if (!rc && par)
        unlink(have_path); /* whole and right: the record has done its work */
    sha256_drop(&f->sha); /* when it was not finished */
    if (fsync(f->fd) && !rc)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot sync %s: %s", partial_path, strerror(errno));
    close(f->fd);
    f->fd = -1;
    return rc;
}

/* ---- a byte range ---- */

struct range_fetch {
    const struct hub *h;
    int fd;
    uint64_t offset, len, have; /* have: bytes of the range written */
    bool checked, ok;
    char bad[512];
    struct reply r;
    hub_range_fn fn;
    void *ctx;
};

static size_t on_range_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct range_fetch *g = arg;
    size_t n = size * nmemb;
    if (!g->checked) {
        g->checked = true;
        uint64_t a = 0, b = 0;
        g->ok = g->r.status == 206 && sscanf(g->r.crange, "bytes %" SCNu64 "-%" SCNu64, &a, &b) == 2 &&
                a == g->offset + g->have && b == g->offset + g->len - 1;
        if (!g->ok && g->r.status == 206) {
            snprintf(g->bad, sizeof g->bad, "the storage answered Content-Range '%.200s' for bytes %" PRIu64 "-%" PRIu64,
                     g->r.crange, g->offset + g->have, g->offset + g->len - 1);
            return 0;
        }
        if (!g->ok && g->r.status == 200) {
            snprintf(g->bad, sizeof g->bad, "the storage does not answer range requests (200 for bytes %" PRIu64 "-)",
                     g->offset + g->have);
            return 0;
        }
    }
    if (!g->ok)
        return n; /* an error's body */
    if (n > g->len - g->have) {
        snprintf(g->bad, sizeof g->bad, "the storage sent more than the %" PRIu64 " bytes asked for", g->len);
        return 0;
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(g->fd, data + done, n - done, (off_t)(g->offset + g->have + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(g->bad, sizeof g->bad, "cannot write the model file: %s", w < 0 ? strerror(errno) : "no room");
            return 0;
        }
        done += (size_t)w;
    }
    g->have += n;
    g->fn(g->ctx, n);
    return n;
}

static int on_range_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    return hub_cancelled(((struct range_fetch *)arg)->h) ? 1 : 0;
}

int hub_fetch_range(const struct hub *h, const char *url, int fd, uint64_t offset, uint64_t len, hub_range_fn fn,
                    void *ctx, char *err, size_t errlen)
{
    struct range_fetch g = {.h = h, .fd = fd, .offset = offset, .len = len, .fn = fn, .ctx = ctx};
    int rc = 0;
    for (int k = 0; g.have < len; k++) {
        if (k == h->attempts)
            return CAIRN_EIO; /* err holds the last reason */
        if (k)
            hub_wait_before_retry(h, &g.r, k);
        char curl_err[CURL_ERROR_SIZE], range[48];
        g.r = (struct reply){0};
        g.checked = g.ok = false;
        g.bad[0] = 0;
        CURL *c = hub_handle(h, url, &g.r, curl_err);
        if (!c)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, offset + g.have, offset + len - 1);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_range_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &g);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_range_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &g);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)h->stall_s);
        CURLcode cc = curl_easy_perform(c);
        curl_easy_cleanup(c);
        if (hub_cancelled(h))
            return cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
        if (g.bad[0])
            return cairn_fail(err, errlen, CAIRN_EIO, "bytes %s: %s", range, g.bad);
        if (cc != CURLE_OK)
            rc = cairn_fail(err, errlen, CAIRN_EIO, "bytes %s: %s", range, curl_err[0] ? curl_err : curl_easy_strerror(cc));
        else if (hub_retryable(g.r.status))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "bytes %s: HTTP %ld", range, g.r.status);
        else if (g.r.status != 206)
            return hub_status_error(h, &g.r, url, err, errlen);
        else
            continue; /* the loop's test says whether the range is whole */
        log_warn("hub: %s", err);
        (void)rc;
    }
    return 0;
}
