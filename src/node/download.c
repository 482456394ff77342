/* Model files from peers (download.h). */
#include "node/download.h"
#include "node/hub.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <sodium.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/files.h"
#include "base/log.h"
#include "node/catalog.h"

#define MAC_BYTES crypto_auth_hmacsha256_BYTES
#define HDR_VALUE_MAX 256 /* longest reply header value kept */

static int64_t mono_ms(void) { return clock_ns() / 1000000; }

/* ---- Range ---- */

/* Reads decimal digits at *p into *v (no sign, no overflow); false when none or too big. */
static bool read_u64(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    if (!isdigit((unsigned char)*s))
        return false;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *p = s;
    *v = x;
    return true;
}

static const char *skip_ws(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

int download_range_parse(const char *header, uint64_t size, bool *partial, uint64_t *first,
                         uint64_t *len, char *err, size_t errlen)
{
    *partial = false;
    *first = 0;
    *len = size;
    if (!header)
        return 0;
    const char *p = skip_ws(header);
    if (strncasecmp(p, "bytes", 5))
        return 0; /* another unit: ignored, the whole file is sent */
    p = skip_ws(p + 5);
    if (*p != '=')
        return 0;
    p = skip_ws(p + 1);
    if (strchr(p, ','))
        return cairn_fail(err, errlen, CAIRN_ERANGE, "only one range is served");
    uint64_t a = 0, b = 0;
    bool has_a = read_u64(&p, &a);
    if (*p != '-')
        return cairn_fail(err, errlen, CAIRN_ERANGE, "malformed range '%.64s'", header);
    p++;
    bool has_b = read_u64(&p, &b);
    if (*skip_ws(p) || (!has_a && !has_b))
        return cairn_fail(err, errlen, CAIRN_ERANGE, "malformed range '%.64s'", header);
    if (!has_a) { /* suffix: the last b bytes */
        if (b == 0 || size == 0)
            return cairn_fail(err, errlen, CAIRN_ERANGE, "empty suffix range of a %" PRIu64 "-byte file",
                              size);
        *first = b >= size ? 0 : size - b;
        *len = size - *first;
        *partial = true;
        return 0;
    }
    if (has_b && b < a)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "range %" PRIu64 "-%" PRIu64 " ends before it starts", a,
                          b);
    if (a >= size)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "range starts at %" PRIu64 ", past the %" PRIu64 "-byte file",
                          a, size);
    uint64_t last = has_b && b < size - 1 ? b : size - 1;
    *first = a;
    *len = last - a + 1;
    *partial = true;
    return 0;
}

/* ---- authentication ---- */

static int mac_of(const char *secret, const char *node_id, const char *what, int64_t t,
                  unsigned char mac[MAC_BYTES])
{
    if (!secret || !secret[0] || !node_id || !node_id[0] || !what || !what[0])
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_EIO;
    char ts[32];
    int n = snprintf(ts, sizeof ts, "%" PRId64, t);
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)secret, strlen(secret));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)node_id, strlen(node_id));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)"|", 1);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)what, strlen(what));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)"|", 1);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)ts, (unsigned long long)n);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
    return 0;
}

int download_auth_token(const char *secret, const char *node_id, const char *what, int64_t now_s,
                        char *out)
{
    unsigned char mac[MAC_BYTES];
    out[0] = 0;
    int rc = mac_of(secret, node_id, what, now_s, mac);
    if (rc)
        return rc;
    char hex[2 * MAC_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, mac, sizeof mac);
    snprintf(out, DOWNLOAD_AUTH_MAX, "%" PRId64 ":%s", now_s, hex);
    return 0;
}

int download_auth_check(const char *secret, const char *node_id, const char *what,
                        const char *token, int64_t now_s, char *err, size_t errlen)
{
    if (!token || !token[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no auth token");
    if (!node_id || !node_id[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no node id");
    const char *p = token;
    uint64_t t;
    if (!read_u64(&p, &t) || *p != ':' || t > (uint64_t)INT64_MAX / 2)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "malformed auth token");
    p++;
    unsigned char got[MAC_BYTES];
    size_t n = 0;
    const char *end = NULL;
    if (strlen(p) != 2 * MAC_BYTES || sodium_hex2bin(got, sizeof got, p, strlen(p), NULL, &n, &end) ||
        n != MAC_BYTES || *end)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "malformed auth token");
    int64_t skew = (int64_t)t - now_s;
    if (skew > DOWNLOAD_AUTH_WINDOW_S || skew < -DOWNLOAD_AUTH_WINDOW_S)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "stale auth token (%" PRId64 " s from this node's clock)",
                          skew);
    unsigned char want[MAC_BYTES];
    int rc = mac_of(secret, node_id, what, (int64_t)t, want);
    if (rc)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no cluster secret to check the token with");
    if (sodium_memcmp(got, want, MAC_BYTES))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "auth token does not prove the cluster secret");
    return 0;
}

/* ---- sealed bodies ---- */

#define SEAL_BLOCK 64 /* bytes of keystream per XChaCha20 block (counter step) */

int download_seal_key(const char *secret, const char *node_id, const char *route, const char *sha256_hex,
                      const uint8_t nonce[DOWNLOAD_NONCE_BYTES], uint8_t key[DOWNLOAD_SEAL_KEY_BYTES])
{
    if (!secret || !secret[0] || !node_id || !node_id[0] || !route || !route[0] || !sha256_hex || !sha256_hex[0])
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_EIO;
    /* BLAKE2b takes keys of 16..64 bytes; the secret is text of any length (tests use
     * short ones), so its hash is the key. The fields go in with their NULs: no two
     * different field lists make the same input. */
    static const char label[] = "cairn file v1";
    unsigned char k0[32];
    crypto_generichash(k0, sizeof k0, (const unsigned char *)secret, strlen(secret), NULL, 0);
    crypto_generichash_state st;
    crypto_generichash_init(&st, k0, sizeof k0, DOWNLOAD_SEAL_KEY_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)label, sizeof label);
    crypto_generichash_update(&st, (const unsigned char *)node_id, strlen(node_id) + 1);
    crypto_generichash_update(&st, (const unsigned char *)route, strlen(route) + 1);
    crypto_generichash_update(&st, (const unsigned char *)sha256_hex, strlen(sha256_hex) + 1);
    crypto_generichash_update(&st, nonce, DOWNLOAD_NONCE_BYTES);
    crypto_generichash_final(&st, key, DOWNLOAD_SEAL_KEY_BYTES);
    sodium_memzero(k0, sizeof k0);
    sodium_memzero(&st, sizeof st);
    return 0;
}

void download_seal_xor(uint8_t *buf, size_t n, uint64_t offset, const uint8_t nonce[DOWNLOAD_NONCE_BYTES],
                       const uint8_t key[DOWNLOAD_SEAL_KEY_BYTES])
{
    size_t skip = (size_t)(offset % SEAL_BLOCK);
    if (n && skip) {
        /* libsodium starts at a block's first byte: run the whole first block over a
         * copy placed at its position in the block. */
        uint8_t block[SEAL_BLOCK] = {0};
        size_t take = n < SEAL_BLOCK - skip ? n : SEAL_BLOCK - skip;
        memcpy(block + skip, buf, take);
        crypto_stream_xchacha20_xor_ic(block, block, SEAL_BLOCK, nonce, offset / SEAL_BLOCK, key);
        memcpy(buf, block + skip, take);
        sodium_memzero(block, sizeof block);
        buf += take;
        n -= take;
        offset += take;
    }
    if (n)
        crypto_stream_xchacha20_xor_ic(buf, buf, n, nonce, offset / SEAL_BLOCK, key);
}

int download_nonce_parse(const char *hex, uint8_t nonce[DOWNLOAD_NONCE_BYTES])
{
    size_t n = 0;
    const char *end = NULL;
    if (!hex || strlen(hex) != 2 * DOWNLOAD_NONCE_BYTES ||
        sodium_hex2bin(nonce, DOWNLOAD_NONCE_BYTES, hex, strlen(hex), NULL, &n, &end) || n != DOWNLOAD_NONCE_BYTES ||
        *end)
        return CAIRN_EINVAL;
    return 0;
}

/* ---- files ---- */

int download_paths(const char *models_dir, const char *model_id, char *final_path,
                   char *partial_path, size_t n)
{
    char canon[HUBREF_TEXT_MAX], local[HUBREF_TEXT_MAX];
    if (!models_dir || !models_dir[0] || !model_id || !ids_valid_model(model_id) || model_id[0] == '.')
        return CAIRN_EINVAL;
    if (strchr(model_id, '/')) { /* only a pulled model's id holds '/': its file has the pull's name */
        if (!hubref_canonical(model_id, canon) || strcmp(canon, model_id))
            return CAIRN_EINVAL;
        hubref_local_name(model_id, 1, 1, local);
        local[strlen(local) - 5] = 0; /* the stem: ".gguf" is added below */
    } else {
        snprintf(local, sizeof local, "%s", model_id);
    }
    int a = snprintf(final_path, n, "%s/%s.gguf", models_dir, local);
    int b = snprintf(partial_path, n, "%s/.%s.gguf.partial", models_dir, local);
    if (a < 0 || b < 0 || (size_t)a >= n || (size_t)b >= n)
        return CAIRN_ERANGE;
    return 0;
}

int download_disk_check(const char *dir, uint64_t need, char *err, size_t errlen)
{
    struct statvfs st;
    if (statvfs(dir, &st))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot read the free space of %s: %s", dir, strerror(errno));
    uint64_t unit = st.f_frsize ? st.f_frsize : st.f_bsize;
    uint64_t avail = (uint64_t)st.f_bavail;
    uint64_t free_bytes = unit && avail > UINT64_MAX / unit ? UINT64_MAX : avail * unit;
    if (need > free_bytes || free_bytes - need < DOWNLOAD_DISK_HEADROOM)
        return cairn_fail(err, errlen, CAIRN_EFULL,
                          "not enough disk space in %s: %" PRIu64 " bytes needed and %" PRIu64 " kept free, %" PRIu64
                          " free",
                          dir, need, DOWNLOAD_DISK_HEADROOM, free_bytes);
    return 0;
}

/* Whether a file name is a partial download's: "." + something + ".gguf.partial". */
static bool partial_name(const char *name)
{
    static const char tail[] = ".gguf.partial";
    size_t n = strlen(name), t = sizeof tail - 1;
    return name[0] == '.' && n > t + 1 && !strcmp(name + n - t, tail);
}

int download_clean_partials(const char *models_dir, int64_t max_age_s, int64_t now_s)
{
    DIR *d = opendir(models_dir);
    if (!d)
        return 0;
    int deleted = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[4096];
        struct stat st;
        if (!partial_name(e->d_name) || snprintf(path, sizeof path, "%s/%s", models_dir, e->d_name) >= (int)sizeof path ||
            lstat(path, &st) || !S_ISREG(st.st_mode) || now_s - (int64_t)st.st_mtime <= max_age_s)
            continue;
        if (unlink(path) == 0) {
            log_info("downloads: deleted %s, untouched for %lld days", path,
                     (long long)((now_s - (int64_t)st.st_mtime) / 86400));
            deleted++;
        }
    }
    closedir(d);
    return deleted;
}

/* ---- sources ---- */

static bool is_loopback_addr(const char *a) { return !strncmp(a, "127.", 4) || !strcmp(a, "::1"); }

static void add_url(struct download_source *s, const char *addr, int port)
{
    char host[IDS_ADDR_MAX + 1], url[DOWNLOAD_URL_MAX];
    snprintf(host, sizeof host, "%s", addr);
    char *slash = strchr(host, '/'); /* a prefix length */
    if (slash)
        *slash = 0;
    if (!host[0] || strchr(host, '%') || !strncasecmp(host, "fe80:", 5))
        return; /* link-local IPv6 needs a scope this node cannot name */
    bool v6 = strchr(host, ':') != NULL;
    int w = snprintf(url, sizeof url, v6 ? "http://[%s]:%d" : "http://%s:%d", host, port);
    if (w < 0 || (size_t)w >= sizeof url || s->n_urls == DOWNLOAD_MAX_URLS)
        return;
    for (size_t i = 0; i < s->n_urls; i++)
        if (!strcmp(s->urls[i], url))
            return;
    memcpy(s->urls[s->n_urls++], url, sizeof url);
}

/* Pass 0: IPv4 not loopback; 1: IPv6 not loopback; 2: loopback. */
static void add_node_urls(struct download_source *s, const struct cluster_node *nd)
{
    const struct cluster_node_info *in = &nd->info;
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = 0; i < in->n_ifaces; i++)
            for (size_t k = 0; k < in->ifaces[i].n_addrs; k++) {
                const char *a = in->ifaces[i].addrs[k];
                bool lo = in->ifaces[i].loopback || is_loopback_addr(a);
                bool v6 = strchr(a, ':') != NULL;
                if ((pass == 2 && lo) || (pass == 0 && !lo && !v6) || (pass == 1 && !lo && v6))
                    add_url(s, a, in->api_port);
            }
}

size_t download_sources(const struct cluster_state *s, const char *self_id, const char *model_id,
                        struct download_source *out, size_t max)
{
    size_t n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < s->n_nodes && n < max; i++) {
            const struct cluster_node *nd = &s->nodes[i];
            const struct cluster_download *d = cluster_state_find_download(s, nd->id, model_id);
            bool master = !strcmp(nd->id, s->master_node_id);
            bool has = d && d->status == CLUSTER_DOWNLOAD_COMPLETED && !d->layer_end; /* a whole copy */
            bool take = pass == 0 ? master : pass == 1 ? !master && has : !master && !has;
            if (!take || !strcmp(nd->id, self_id) || nd->info.api_port <= 0)
                continue;
            struct download_source *src = &out[n];
            memset(src, 0, sizeof *src);
            snprintf(src->node_id, sizeof src->node_id, "%s", nd->id);
            add_node_urls(src, nd);
            if (src->n_urls)
                n++;
        }
    }
    return n;
}

/* ---- one fetch ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_start(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

struct fetch {
    const struct download_config *cfg;
    const char *model_id;
    char route[sizeof DOWNLOAD_ROUTE_PREFIX + IDS_MODEL_MAX];
    char final_path[4096], partial_path[4096];
    download_progress_fn fn;
    void *ctx;
    const atomic_bool *cancel;
    struct cluster_download d;
    int64_t reported_ms;
};

/* A sealed GET's key and the buffer its body is unsealed in (curl's own is left alone). */
struct seal {
    uint8_t key[DOWNLOAD_SEAL_KEY_BYTES], nonce[DOWNLOAD_NONCE_BYTES];
    const char *sha; /* the hash the key was made with, which the reply must name */
    uint8_t buf[16384];
};

/* One HTTP request and what its reply said. */
struct xfer {
    struct fetch *f;
    long status;
    bool headers_done;
    char sha[HDR_VALUE_MAX], node[HDR_VALUE_MAX], auth[HDR_VALUE_MAX], crange[HDR_VALUE_MAX];
    char clen[HDR_VALUE_MAX], sealed[HDR_VALUE_MAX];
    /* GET only */
    int fd;
    struct seal *seal;   /* with a secret: the body must come sealed */
    uint64_t have, size; /* bytes asked from (have), the file's size */
    uint64_t offset;     /* where the body goes in the file */
    uint64_t written;
    char bad[512];       /* why the reply was refused while it arrived */
    bool local;          /* bad is about this node's file: no retry */
};

static bool cancelled(const struct fetch *f) { return f->cancel && atomic_load(f->cancel); }

static void report(struct fetch *f, bool force)
{
    int64_t now = mono_ms();
    if (!f->fn || (!force && now - f->reported_ms < DOWNLOAD_PROGRESS_MS))
        return;
    f->reported_ms = now;
    f->fn(f->ctx, &f->d);
}

/* Keeps a header's value when its name is one we read. */
static void keep_header(struct xfer *x, const char *line, size_t n)
{
    static const struct {
        const char *name;
        size_t off;
    } keys[] = {
        {"x-cairn-sha256", offsetof(struct xfer, sha)},     {"x-cairn-node", offsetof(struct xfer, node)},
        {"x-cairn-auth", offsetof(struct xfer, auth)},      {"content-range", offsetof(struct xfer, crange)},
        {"content-length", offsetof(struct xfer, clen)},   {"x-cairn-sealed", offsetof(struct xfer, sealed)},
    };
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return;
    size_t name_len = (size_t)(colon - line);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i].name) != name_len || strncasecmp(line, keys[i].name, name_len))
            continue;
        const char *v = colon + 1, *end = line + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t len = (size_t)(end - v);
        char *dst = (char *)x + keys[i].off;
        if (len >= HDR_VALUE_MAX)
            len = HDR_VALUE_MAX - 1;
        memcpy(dst, v, len);
        dst[len] = 0;
    }
}

/* Checks a GET's headers once they are all in: 206 from where we asked, or 200 (the
 * source ignored the range: start again from zero). Returns false with x->bad set. */
static bool accept_get(struct xfer *x)
{
    if ((x->status == 200 || x->status == 206) && x->seal) {
        if (strcmp(x->sealed, DOWNLOAD_SEALED)) {
            snprintf(x->bad, sizeof x->bad,
                     "reply not sealed (X-Cairn-Sealed '%.64s'): a sealed cluster's files do not travel in clear",
                     x->sealed);
            return false;
        }
        if (strcmp(x->sha, x->seal->sha)) { /* the key is bound to the hash: these bytes would not unseal */
            snprintf(x->bad, sizeof x->bad, "the source's file changed (SHA-256 %.64s, not %s)", x->sha, x->seal->sha);
            return false;
        }
    }
    if (x->status == 206) {
        uint64_t a, b, total;
        const char *p = x->crange;
        if (strncasecmp(p, "bytes ", 6))
            goto bad_range;
        p += 6;
        if (!read_u64(&p, &a) || *p++ != '-' || !read_u64(&p, &b) || *p++ != '/' || !read_u64(&p, &total) ||
            *p)
            goto bad_range;
        if (a != x->have || b + 1 != x->size || total != x->size)
            goto bad_range;
        x->offset = x->have;
        return true;
    bad_range:
        snprintf(x->bad, sizeof x->bad, "unexpected Content-Range '%s' for bytes %" PRIu64 "- of %" PRIu64, x->crange,
                 x->have, x->size);
        return false;
    }
    if (x->status == 200) {
        if (ftruncate(x->fd, 0)) {
            snprintf(x->bad, sizeof x->bad, "cannot truncate the partial file: %s", strerror(errno));
            x->local = true;
            return false;
        }
        x->offset = 0;
        return true;
    }
    snprintf(x->bad, sizeof x->bad, "HTTP %ld", x->status);
    return false;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
    struct xfer *x = arg;
    size_t n = size * nmemb;
    if (n >= 5 && !strncmp(data, "HTTP/", 5)) { /* a new reply (after a 100 Continue, say) */
        long st = 0;
        const char *sp = memchr(data, ' ', n);
        if (sp)
            st = strtol(sp + 1, NULL, 10);
        struct xfer keep = {.f = x->f, .fd = x->fd, .seal = x->seal, .have = x->have, .size = x->size, .status = st};
        *x = keep;
        return n;
    }
    if ((n == 2 && data[0] == '\r') || (n == 1 && data[0] == '\n')) {
        if (x->status >= 100 && x->status < 200)
            return n; /* interim reply: the real one follows */
        x->headers_done = true;
        if (x->fd >= 0 && !accept_get(x))
            return 0; /* aborts the transfer */
        return n;
    }
    keep_header(x, data, n);
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct xfer *x = arg;
    size_t n = size * nmemb;
    if (x->fd < 0 || !x->headers_done)
        return n; /* a HEAD (or an error body): nothing to keep */
    if (x->offset + x->written + n > x->size) {
        snprintf(x->bad, sizeof x->bad, "the source sent more than its %" PRIu64 " bytes", x->size);
        return 0;
    }
    size_t done = 0;
    while (done < n) {
        uint64_t at = x->offset + x->written + done;
        const char *p = data + done;
        size_t len = n - done;
        if (x->seal) { /* unsealed piece by piece, each at its place in the file */
            if (len > sizeof x->seal->buf)
                len = sizeof x->seal->buf;
            memcpy(x->seal->buf, p, len);
            download_seal_xor(x->seal->buf, len, at, x->seal->nonce, x->seal->key);
            p = (const char *)x->seal->buf;
        }
        ssize_t w = pwrite(x->fd, p, len, (off_t)at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(x->bad, sizeof x->bad, "cannot write %.400s: %s", x->f->partial_path,
                     w < 0 ? strerror(errno) : "no progress");
            x->local = true;
            return 0;
        }
        done += (size_t)w;
    }
    x->written += n;
    x->f->d.bytes_done = (int64_t)(x->offset + x->written);
    report(x->f, false);
    return n;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    struct xfer *x = arg;
    return cancelled(x->f) ? 1 : 0;
}

/* A curl handle for url + the route, with our headers; *hdrs to free after. */
static CURL *make_handle(struct fetch *f, const char *url, struct xfer *x, struct curl_slist **hdrs,
                         char *curl_err)
{
    char full[DOWNLOAD_URL_MAX + sizeof f->route], h[512];
    snprintf(full, sizeof full, "%s%s", url, f->route);
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    struct curl_slist *l = NULL;
    snprintf(h, sizeof h, "X-Cairn-Node: %s", f->cfg->node_id);
    l = curl_slist_append(l, h);
    if (f->cfg->secret && f->cfg->secret[0]) {
        char tok[DOWNLOAD_AUTH_MAX];
        download_auth_token(f->cfg->secret, f->cfg->node_id, f->route, (int64_t)time(NULL), tok);
        snprintf(h, sizeof h, "X-Cairn-Auth: %s", tok);
        l = l ? curl_slist_append(l, h) : NULL;
    }
    if (f->cfg->api_key && f->cfg->api_key[0]) {
        snprintf(h, sizeof h, "Authorization: Bearer %.400s", f->cfg->api_key);
        l = l ? curl_slist_append(l, h) : NULL;
    }
    if (!l) {
        curl_easy_cleanup(c);
        return NULL;
    }
    *hdrs = l;
    curl_err[0] = 0;
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, l);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); /* peers are reached directly, whatever the environment says */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)DOWNLOAD_CONNECT_MS);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    return c;
}

static bool is_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f'))
            return false;
    return true;
}

/* HEAD of one address of src: the file's size and hash. */
static int probe(struct fetch *f, const struct download_source *src, const char *url, uint64_t *size,
                 char *sha, char *err, size_t errlen)
{
    struct xfer x = {.f = f, .fd = -1};
    struct curl_slist *hdrs = NULL;
    char curl_err[CURL_ERROR_SIZE];
    CURL *c = make_handle(f, url, &x, &hdrs, curl_err);
    if (!c)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)DOWNLOAD_HEAD_TIMEOUT_S);
    CURLcode cc = curl_easy_perform(c);
    curl_off_t len = -1;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    if (cc != CURLE_OK)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", url, curl_err[0] ? curl_err : curl_easy_strerror(cc));
    if (x.status != 200)
        return cairn_fail(err, errlen, x.status == 404 ? CAIRN_ENOTFOUND : CAIRN_EIO, "%s%s: HTTP %ld", url,
                          f->route, x.status);
    if (!is_hex64(x.sha))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: no valid X-Cairn-Sha256 in the reply", url);
    if (len < 0 || (uint64_t)len > (uint64_t)IDS_BYTES_MAX)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: no valid Content-Length in the reply", url);
    if (src->node_id[0] && strcmp(x.node, src->node_id))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s is node '%.64s', not %s", url, x.node, src->node_id);
    if (f->cfg->secret && f->cfg->secret[0]) {
        char what[sizeof f->route + DOWNLOAD_SHA256_HEX + 1], why[256];
        snprintf(what, sizeof what, "%s|%.64s", f->route, x.sha); /* is_hex64: 64 characters */
        if (download_auth_check(f->cfg->secret, x.node, what, x.auth, (int64_t)time(NULL), why, sizeof why))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the reply's X-Cairn-Auth: %s", url, why);
    }
    *size = (uint64_t)len;
    memcpy(sha, x.sha, DOWNLOAD_SHA256_HEX);
    return 0;
}

/* GET from `have` to the end into the partial file. CAIRN_EIO to retry; CAIRN_ESTATE
 * when cancelled or the local file failed (no retry). */
static int get_rest(struct fetch *f, const char *url, const char *sha, uint64_t size, uint64_t have, char *err,
                    size_t errlen)
{
    int fd = open(f->partial_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "cannot open %s: %s", f->partial_path, strerror(errno));
    struct xfer x = {.f = f, .fd = fd, .have = have, .size = size};
    struct seal seal;
    struct curl_slist *hdrs = NULL;
    char curl_err[CURL_ERROR_SIZE];
    CURL *c = make_handle(f, url, &x, &hdrs, curl_err);
    struct curl_slist *more = NULL;
    char h[128];
    int rc = 0;
    if (c) {
        snprintf(h, sizeof h, "If-Range: \"%s\"", sha);
        more = curl_slist_append(hdrs, h);
    }
    if (c && more && f->cfg->secret && f->cfg->secret[0]) {
        /* A fresh nonce per GET: no two transfers share a keystream. */
        char hex[DOWNLOAD_NONCE_HEX];
        randombytes_buf(seal.nonce, sizeof seal.nonce);
        seal.sha = sha;
        if (download_seal_key(f->cfg->secret, f->cfg->node_id, f->route, sha, seal.nonce, seal.key)) {
            rc = cairn_fail(err, errlen, CAIRN_ESTATE, "cannot make the transfer's key");
            goto out;
        }
        x.seal = &seal;
        sodium_bin2hex(hex, sizeof hex, seal.nonce, sizeof seal.nonce);
        snprintf(h, sizeof h, "X-Cairn-Nonce: %s", hex);
        struct curl_slist *with = curl_slist_append(more, h);
        if (!with) {
            rc = cairn_fail(err, errlen, CAIRN_ESTATE, "out of memory");
            goto out;
        }
        more = with;
    }
    if (!c || !more) {
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "out of memory");
        goto out;
    }
    char range[64];
    snprintf(range, sizeof range, "%" PRIu64 "-", have);
    if (have)
        curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(f->cfg->stall_s > 0 ? f->cfg->stall_s : DOWNLOAD_STALL_S));
    CURLcode cc = curl_easy_perform(c);
    if (cancelled(f))
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "cancelled");
    else if (x.bad[0] && x.local)
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "%s", x.bad);
    else if (x.bad[0])
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", url, x.bad);
    else if (cc != CURLE_OK)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s: %s (%" PRIu64 " bytes of %" PRIu64 " in)", url,
                        curl_err[0] ? curl_err : curl_easy_strerror(cc), x.offset + x.written, size);
    else if (!x.headers_done || x.offset + x.written != size)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s: the reply ended at %" PRIu64 " bytes of %" PRIu64, url,
                        x.offset + x.written, size);
out:
    if (c)
        curl_easy_cleanup(c);
    curl_slist_free_all(more ? more : hdrs);
    sodium_memzero(&seal, sizeof seal);
    if (close(fd) && !rc)
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "cannot write %s: %s", f->partial_path, strerror(errno));
    return rc;
}

/* fsync of a file or folder by path. */
/* Checks the partial file's hash, then moves it in place. */
static int finish(struct fetch *f, const char *sha, char *err, size_t errlen)
{
    char got[CATALOG_SHA256_HEX], why[512];
    int rc = catalog_file_sha256(f->partial_path, got, NULL, NULL, why, sizeof why);
    if (rc)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s", why);
    if (strcmp(got, sha)) {
        unlink(f->partial_path);
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "model %s: SHA-256 %s of the downloaded file is not the source's %s",
                          f->model_id, got, sha);
    }
    if (files_sync(f->partial_path, O_RDONLY))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot sync %s: %s", f->partial_path, strerror(errno));
    /* A pulled model keeps its name: the sidecar goes first, so the catalog never lists
     * the file under another. */
    if (strchr(f->model_id, '/') && (rc = hub_sidecar_put(f->cfg->models_dir, f->model_id, got, f->d.bytes_total,
                                                          err, errlen)))
        return rc;
    if (rename(f->partial_path, f->final_path))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot rename %s: %s", f->partial_path, strerror(errno));
    files_sync(f->cfg->models_dir, O_RDONLY | O_DIRECTORY);
    return 0;
}

/* Waits ms, in slices, unless cancelled. */
static void nap(struct fetch *f, int ms)
{
    for (int t = 0; t < ms && !cancelled(f); t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int run_fetch(struct fetch *f, const struct download_source *src, size_t n_src, char *err, size_t errlen)
{
    const struct download_config *cfg = f->cfg;
    struct stat st;
    if (!stat(f->final_path, &st))
        return cairn_fail(err, errlen, CAIRN_ESTATE, "%s exists already", f->final_path);
    int rc = files_make_dirs(cfg->models_dir, 0755, err, errlen);
    if (rc)
        return rc;
    int attempts = cfg->max_attempts > 0 ? cfg->max_attempts : DOWNLOAD_MAX_ATTEMPTS;
    int wait = cfg->backoff_ms > 0 ? cfg->backoff_ms : DOWNLOAD_BACKOFF_MS;
    char last[1024] = "no source to fetch from", sha_before[DOWNLOAD_SHA256_HEX] = "";
    for (int attempt = 0; attempt < attempts; attempt++) {
        if (attempt) {
            log_info("download %s: attempt %d of %d in %d ms (%s)", f->model_id, attempt + 1, attempts, wait,
                     last);
            nap(f, wait);
            wait = wait * 2 > DOWNLOAD_BACKOFF_MAX_MS ? DOWNLOAD_BACKOFF_MAX_MS : wait * 2;
        }
        if (cancelled(f))
            return cairn_fail(err, errlen, CAIRN_EIO, "cancelled");
        uint64_t size = 0;
        char sha[DOWNLOAD_SHA256_HEX] = "";
        const char *url = NULL;
        for (size_t i = 0; i < n_src && !url; i++)
            for (size_t k = 0; k < src[i].n_urls && !url; k++)
                if (!probe(f, &src[i], src[i].urls[k], &size, sha, last, sizeof last))
                    url = src[i].urls[k];
        if (!url)
            continue;
        if (sha_before[0] && strcmp(sha_before, sha)) {
            log_warn("download %s: the source's file changed; starting again", f->model_id);
            unlink(f->partial_path);
        }
        memcpy(sha_before, sha, sizeof sha);
        uint64_t have = 0;
        if (!stat(f->partial_path, &st)) {
            have = (uint64_t)st.st_size;
            if (have > size) {
                unlink(f->partial_path);
                have = 0;
            }
        }
        f->d.bytes_total = (int64_t)size;
        f->d.bytes_done = (int64_t)have;
        report(f, true);
        if ((rc = download_disk_check(cfg->models_dir, size - have, err, errlen)))
            return rc;
        if (have < size) {
            log_info("download %s: bytes %" PRIu64 "..%" PRIu64 " from %s", f->model_id, have, size, url);
            rc = get_rest(f, url, sha, size, have, last, sizeof last);
            if (rc == CAIRN_ESTATE)
                return cairn_fail(err, errlen, CAIRN_EIO, "%s", last);
            if (rc)
                continue;
        } else {
            /* An empty file, or a partial already whole: make sure the file exists. */
            int fd = open(f->partial_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0)
                return cairn_fail(err, errlen, CAIRN_EIO, "cannot open %s: %s", f->partial_path, strerror(errno));
            close(fd);
        }
        f->d.bytes_done = (int64_t)size;
        return finish(f, sha, err, errlen);
    }
    return cairn_fail(err, errlen, CAIRN_EIO, "model %s: no source served it in %d attempts: %s", f->model_id,
                      attempts, last);
}

int download_fetch(const struct download_config *cfg, const char *model_id,
                   const struct download_source *src, size_t n_src, download_progress_fn fn,
                   void *ctx, const atomic_bool *cancel, char *err, size_t errlen)
{
    if (!cfg || !cfg->models_dir || !cfg->node_id || !ids_valid_id(cfg->node_id) || (!src && n_src))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "download: models_dir and a valid node_id are required");
    struct fetch *f = calloc(1, sizeof *f);
    if (!f)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    int rc = download_paths(cfg->models_dir, model_id, f->final_path, f->partial_path, sizeof f->final_path);
    if (rc) {
        free(f);
        return cairn_fail(err, errlen, rc, "model id '%.255s' cannot be downloaded into %s", model_id ? model_id : "",
                          cfg->models_dir);
    }
    pthread_once(&curl_once, curl_start);
    char msg[1024];
    f->cfg = cfg;
    f->model_id = model_id;
    snprintf(f->route, sizeof f->route, "%s%s", DOWNLOAD_ROUTE_PREFIX, model_id);
    f->fn = fn;
    f->ctx = ctx;
    f->cancel = cancel;
    snprintf(f->d.node_id, sizeof f->d.node_id, "%s", cfg->node_id);
    snprintf(f->d.model_id, sizeof f->d.model_id, "%s", model_id);
    f->d.status = CLUSTER_DOWNLOAD_ONGOING;
    report(f, true);
    rc = run_fetch(f, src, n_src, msg, sizeof msg);
    f->d.status = rc ? CLUSTER_DOWNLOAD_FAILED : CLUSTER_DOWNLOAD_COMPLETED;
    if (rc)
        f->d.error = msg;
    else
        f->d.bytes_done = f->d.bytes_total;
    report(f, true);
    if (rc) {
        log_warn("download %s: %s", model_id, msg);
        cairn_fail(err, errlen, rc, "%s", msg);
    } else
        log_info("download %s: done, %" PRId64 " bytes in %s", model_id, f->d.bytes_total, f->final_path);
    free(f);
    return rc;
}

/* ---- the manager ---- */

struct dl_entry {
    struct cluster_download d;
    struct download_source *src; /* while Pending; malloc'd */
    size_t n_src;
    int64_t failed_ms; /* monotonic, when it failed */
    int64_t sample_ms, sample_bytes; /* the last progress the rate was measured from */
};

#define RATE_SAMPLE_MS 500 /* the rate is measured over at least this long */

/* The download's rate from its progress: bytes over time since the last sample, a
 * quarter of each new measure into the rate (it moves, but not with every hiccup); 0
 * when it is not Ongoing. Under mu. */
static void update_rate(struct dl_entry *x, int64_t now)
{
    if (x->d.status != CLUSTER_DOWNLOAD_ONGOING || x->d.bytes_done < x->sample_bytes) {
        x->d.bytes_per_s = 0;
        x->sample_ms = now;
        x->sample_bytes = x->d.bytes_done;
        return;
    }
    int64_t dt = now - x->sample_ms;
    if (!x->sample_ms || dt < RATE_SAMPLE_MS) {
        if (!x->sample_ms) {
            x->sample_ms = now;
            x->sample_bytes = x->d.bytes_done;
        }
        return;
    }
    int64_t measured = (x->d.bytes_done - x->sample_bytes) * 1000 / dt;
    x->d.bytes_per_s = x->d.bytes_per_s ? (3 * x->d.bytes_per_s + measured) / 4 : measured;
    x->sample_ms = now;
    x->sample_bytes = x->d.bytes_done;
}

struct download_mgr {
    char *models_dir, *node_id, *secret, *api_key;
    struct download_config cfg;
    download_changed_fn changed;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dl_entry *e; /* sorted by model id */
    size_t n, cap;
    pthread_t thread;
    bool started, stop;
    atomic_bool cancel;
};

static struct dl_entry *entry_find(struct download_mgr *m, const char *model_id)
{
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->e[i].d.model_id, model_id))
            return &m->e[i];
    return NULL;
}

static struct dl_entry *entry_add(struct download_mgr *m, const char *model_id)
{
    if (array_reserve(&m->e, &m->cap, m->n + 1, sizeof *m->e, 8))
        return NULL;
    size_t at = 0;
    while (at < m->n && strcmp(m->e[at].d.model_id, model_id) < 0)
        at++;
    memmove(&m->e[at + 1], &m->e[at], (m->n - at) * sizeof *m->e);
    m->n++;
    struct dl_entry *x = &m->e[at];
    memset(x, 0, sizeof *x);
    snprintf(x->d.node_id, sizeof x->d.node_id, "%s", m->node_id);
    snprintf(x->d.model_id, sizeof x->d.model_id, "%s", model_id);
    return x;
}

static void notify(struct download_mgr *m)
{
    if (m->changed)
        m->changed(m->ctx);
}

/* Takes d's status into its entry (made when add and missing); under no lock. */
static void take_progress(struct download_mgr *m, const struct cluster_download *d, bool add)
{
    pthread_mutex_lock(&m->mu);
    struct dl_entry *x = entry_find(m, d->model_id);
    if (!x && add)
        x = entry_add(m, d->model_id);
    if (x) {
        free(x->d.error);
        x->d.error = NULL;
        x->d.status = d->status;
        x->d.bytes_done = d->bytes_done;
        x->d.bytes_total = d->bytes_total;
        x->d.layer_begin = d->layer_begin;
        x->d.layer_end = d->layer_end;
        update_rate(x, mono_ms());
        if (d->status == CLUSTER_DOWNLOAD_FAILED) {
            x->d.error = strdup(d->error ? d->error : "download failed");
            x->failed_ms = mono_ms();
        }
    }
    pthread_mutex_unlock(&m->mu);
    notify(m);
}

static void on_fetch_progress(void *ctx, const struct cluster_download *d) { take_progress(ctx, d, false); }

void download_mgr_note(struct download_mgr *m, const struct cluster_download *d)
{
    if (!m || d->status == CLUSTER_DOWNLOAD_PENDING || !ids_valid_model(d->model_id) || d->bytes_done < 0 ||
        d->bytes_done > d->bytes_total || d->bytes_total > IDS_BYTES_MAX) {
        if (m)
            log_warn("download %s: a status that a report could not carry (%lld of %lld bytes), dropped",
                     d->model_id, (long long)d->bytes_done, (long long)d->bytes_total);
        return;
    }
    take_progress(m, d, true);
}

static void *mgr_main(void *arg)
{
    struct download_mgr *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        struct dl_entry *x = NULL;
        for (size_t i = 0; i < m->n && !x; i++)
            if (m->e[i].d.status == CLUSTER_DOWNLOAD_PENDING && m->e[i].src)
                x = &m->e[i];
        if (!x) {
            pthread_cond_wait(&m->cv, &m->mu);
            continue;
        }
        char model[IDS_MODEL_MAX + 1];
        memcpy(model, x->d.model_id, sizeof model);
        struct download_source *src = x->src;
        size_t n_src = x->n_src;
        x->src = NULL;
        x->n_src = 0;
        pthread_mutex_unlock(&m->mu);
        char err[1024];
        int rc = download_fetch(&m->cfg, model, src, n_src, on_fetch_progress, m, &m->cancel, err, sizeof err);
        free(src);
        pthread_mutex_lock(&m->mu);
        /* A fetch refused before it began reports nothing: settle its entry here. */
        x = entry_find(m, model);
        if (x && (x->d.status == CLUSTER_DOWNLOAD_PENDING || x->d.status == CLUSTER_DOWNLOAD_ONGOING) && !x->src) {
            x->d.status = rc ? CLUSTER_DOWNLOAD_FAILED : CLUSTER_DOWNLOAD_COMPLETED;
            if (rc) {
                free(x->d.error);
                x->d.error = strdup(err);
                x->failed_ms = mono_ms();
            }
        }
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int download_mgr_create(struct download_mgr **out, const struct download_config *cfg,
                        download_changed_fn changed, void *ctx, char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !cfg->models_dir || !cfg->models_dir[0] || !cfg->node_id || !ids_valid_id(cfg->node_id))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "downloads: models_dir and a valid node_id are required");
    struct download_mgr *m = calloc(1, sizeof *m);
    if (!m)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    m->models_dir = strdup(cfg->models_dir);
    m->node_id = strdup(cfg->node_id);
    m->secret = cfg->secret && cfg->secret[0] ? strdup(cfg->secret) : NULL;
    m->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    if (!m->models_dir || !m->node_id || (cfg->secret && cfg->secret[0] && !m->secret) ||
        (cfg->api_key && cfg->api_key[0] && !m->api_key)) {
        free(m->models_dir);
        free(m->node_id);
        free(m->secret);
        free(m->api_key);
        free(m);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    m->cfg = *cfg;
    m->cfg.models_dir = m->models_dir;
    m->cfg.node_id = m->node_id;
    m->cfg.secret = m->secret;
    m->cfg.api_key = m->api_key;
    m->changed = changed;
    m->ctx = ctx;
    download_clean_partials(m->models_dir, DOWNLOAD_PARTIAL_MAX_AGE_S, (int64_t)time(NULL));
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    *out = m;
    return 0;
}

void download_mgr_release(struct download_mgr *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    atomic_store(&m->cancel, true);
    pthread_cond_broadcast(&m->cv);
    bool started = m->started;
    pthread_mutex_unlock(&m->mu);
    if (started)
        pthread_join(m->thread, NULL);
    for (size_t i = 0; i < m->n; i++) {
        cluster_download_clear(&m->e[i].d);
        free(m->e[i].src);
    }
    free(m->e);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m->models_dir);
    free(m->node_id);
    if (m->secret)
        sodium_memzero(m->secret, strlen(m->secret));
    free(m->secret);
    free(m->api_key);
    free(m);
}

/* Whether x still stands (see download_mgr_start); under mu. */
static int entry_stands(struct download_mgr *m, const struct dl_entry *x, char *err, size_t errlen)
{
    switch (x->d.status) {
    case CLUSTER_DOWNLOAD_PENDING:
    case CLUSTER_DOWNLOAD_ONGOING:
        return 0;
    case CLUSTER_DOWNLOAD_COMPLETED: {
        char final_path[4096], partial[4096];
        struct stat st;
        if (!download_paths(m->models_dir, x->d.model_id, final_path, partial, sizeof final_path) &&
            !stat(final_path, &st))
            return 0;
        return 1; /* the file went away: fetch it again */
    }
    default:
        if (mono_ms() - x->failed_ms < DOWNLOAD_RETRY_MS)
            return cairn_fail(err, errlen, CAIRN_ESTATE, "%s", x->d.error ? x->d.error : "download failed");
        return 1;
    }
}

int download_mgr_start(struct download_mgr *m, const char *model_id,
                       const struct download_source *src, size_t n_src, char *err, size_t errlen)
{
    char a[4096], b[4096];
    if (!model_id || download_paths(m->models_dir, model_id, a, b, sizeof a))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "model id '%.255s' cannot be downloaded",
                          model_id ? model_id : "");
    if (!n_src)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no other node of the cluster serves files to fetch model %s from",
                          model_id);
    struct download_source *copy = malloc(n_src * sizeof *copy);
    if (!copy)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    memcpy(copy, src, n_src * sizeof *copy);
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    struct dl_entry *x = entry_find(m, model_id);
    if (x && (rc = entry_stands(m, x, err, errlen)) <= 0) {
        pthread_mutex_unlock(&m->mu);
        free(copy);
        return rc;
    }
    rc = 0;
    if (!x && !(x = entry_add(m, model_id)))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (!rc && !m->started) {
        if (pthread_create(&m->thread, NULL, mgr_main, m))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "downloads: cannot start a thread");
        else
            m->started = true;
    }
    if (!rc) {
        free(x->d.error);
        x->d.error = NULL;
        x->d.status = CLUSTER_DOWNLOAD_PENDING;
        x->d.bytes_done = x->d.bytes_total = 0;
        free(x->src);
        x->src = copy;
        x->n_src = n_src;
        copy = NULL;
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    free(copy);
    if (!rc) {
        log_info("download %s: queued (%zu source%s, first %s)", model_id, n_src, n_src == 1 ? "" : "s",
                 src[0].node_id);
        notify(m);
    }
    return rc;
}

int download_mgr_ensure(struct download_mgr *m, const struct cluster_state *s, const char *model_id,
                        char *why, size_t whylen)
{
    pthread_mutex_lock(&m->mu);
    struct dl_entry *x = entry_find(m, model_id);
    int rc = x ? entry_stands(m, x, why, whylen) : 1;
    pthread_mutex_unlock(&m->mu);
    if (rc <= 0)
        return rc;
    struct download_source *src = calloc(DOWNLOAD_MAX_SOURCES, sizeof *src);
    if (!src)
        return cairn_fail(why, whylen, CAIRN_ENOMEM, "out of memory");
    size_t n = download_sources(s, m->node_id, model_id, src, DOWNLOAD_MAX_SOURCES);
    rc = download_mgr_start(m, model_id, src, n, why, whylen);
    free(src);
    return rc;
}

int download_mgr_get(struct download_mgr *m, const char *model_id, struct cluster_download *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&m->mu);
    struct dl_entry *x = entry_find(m, model_id);
    int rc = !x ? CAIRN_ENOTFOUND : cluster_download_copy(out, &x->d);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

json_t *download_mgr_json(struct download_mgr *m)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; arr && i < m->n; i++) {
        json_t *j = cluster_download_to_json(&m->e[i].d);
        if (!j || json_array_append_new(arr, j)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return arr;
}
