/* Model files for peers (routes_files.h). */
#include "api/routes_files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/err.h"
#include "base/log.h"
#include "node/catalog.h"
#include "node/download.h"

struct hash_entry {
    char *path;
    uint64_t size;
    int64_t mtime_ns;
    char hex[CATALOG_SHA256_HEX];
    uint64_t used; /* tick of the last use */
};

struct routes_files {
    char *node_id, *secret;
    master_card_fn card;
    void *card_ctx;
    pthread_mutex_t mu;      /* the cache */
    pthread_mutex_t hash_mu; /* one hash at a time: a second request waits for the first's */
    struct hash_entry cache[ROUTES_FILES_CACHE];
    uint64_t tick;
};

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

static bool cache_get(struct routes_files *r, const char *path, const struct stat *st, char *hex)
{
    bool hit = false;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < ROUTES_FILES_CACHE && !hit; i++) {
        struct hash_entry *e = &r->cache[i];
        if (e->path && !strcmp(e->path, path) && e->size == (uint64_t)st->st_size && e->mtime_ns == mtime_ns(st)) {
            memcpy(hex, e->hex, CATALOG_SHA256_HEX);
            e->used = ++r->tick;
            hit = true;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return hit;
}

static void cache_put(struct routes_files *r, const char *path, uint64_t size, int64_t mtime, const char *hex)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    pthread_mutex_lock(&r->mu);
    struct hash_entry *slot = &r->cache[0];
    for (size_t i = 0; i < ROUTES_FILES_CACHE; i++) {
        struct hash_entry *e = &r->cache[i];
        if (!e->path || !strcmp(e->path, path)) { /* a free slot, or this file's old hash */
            slot = e;
            break;
        }
        if (e->used < slot->used)
            slot = e;
    }
    free(slot->path);
    slot->path = copy;
    slot->size = size;
    slot->mtime_ns = mtime;
    memcpy(slot->hex, hex, CATALOG_SHA256_HEX);
    slot->used = ++r->tick;
    pthread_mutex_unlock(&r->mu);
}

/* The hash of the file open as fd (st its fstat) at path: cached, or read now. */
static int file_hash(struct routes_files *r, const char *path, const struct stat *st, char *hex, char *err,
                     size_t errlen)
{
    if (cache_get(r, path, st, hex))
        return 0;
    pthread_mutex_lock(&r->hash_mu);
    int rc = 0;
    if (!cache_get(r, path, st, hex)) {
        uint64_t size = 0;
        int64_t mtime = 0;
        rc = catalog_file_sha256(path, hex, &size, &mtime, err, errlen);
        if (!rc && (size != (uint64_t)st->st_size || mtime != mtime_ns(st)))
            rc = cairn_fail(err, errlen, CAIRN_ESTATE, "%s changed while it was read", path);
        if (!rc)
            cache_put(r, path, size, mtime, hex);
    }
    pthread_mutex_unlock(&r->hash_mu);
    return rc;
}

/* A sealed body's key and nonce (http_reply_file_xform's ctx). */
struct seal {
    uint8_t key[DOWNLOAD_SEAL_KEY_BYTES], nonce[DOWNLOAD_NONCE_BYTES];
};

static void seal_piece(void *ctx, uint8_t *buf, size_t n, uint64_t file_offset)
{
    struct seal *s = ctx;
    download_seal_xor(buf, n, file_offset, s->nonce, s->key);
}

static void seal_free(void *ctx)
{
    if (!ctx)
        return;
    sodium_memzero(ctx, sizeof(struct seal));
    free(ctx);
}

static void serve(struct http_request *req, void *ctx)
{
    struct routes_files *r = ctx;
    const char *id = http_req_param(req, "id");
    char route[sizeof DOWNLOAD_ROUTE_PREFIX + IDS_MODEL_MAX], why[1024];
    const char *who = NULL;
    struct seal *seal = NULL; /* with a secret, a GET's body goes sealed */
    if (!id || !ids_valid_model(id)) {
        http_reply_error(req, 404, "not_found", "no such model file");
        return;
    }
    snprintf(route, sizeof route, "%s%s", DOWNLOAD_ROUTE_PREFIX, id);
    if (r->secret) {
        who = http_req_header(req, "X-Cairn-Node");
        if (!who || !ids_valid_id(who)) {
            http_reply_error(req, 401, "authentication_error", "X-Cairn-Node: a node id is required");
            return;
        }
        if (download_auth_check(r->secret, who, route, http_req_header(req, "X-Cairn-Auth"), (int64_t)time(NULL), why,
                                sizeof why)) {
            log_warn("files: %s from %s (%s) refused: %s", route, who, http_req_remote(req), why);
            http_reply_error(req, 401, "authentication_error", "X-Cairn-Auth: %s", why);
            return;
        }
        if (strcmp(http_req_method(req), "HEAD")) { /* a HEAD has no body to seal */
            if (!(seal = malloc(sizeof *seal))) {
                http_reply_error(req, 500, "server_error", "out of memory");
                return;
            }
            if (download_nonce_parse(http_req_header(req, "X-Cairn-Nonce"), seal->nonce)) {
                free(seal);
                http_reply_error(req, 400, "invalid_request_error",
                                 "X-Cairn-Nonce: 48 hex digits are required: files of a sealed cluster go sealed");
                return;
            }
        }
    }
    struct catalog_card card;
    int rc = r->card(r->card_ctx, id, &card, why, sizeof why);
    if (rc) {
        catalog_card_clear(&card);
        free(seal);
        http_reply_error(req, rc == CAIRN_ENOTFOUND ? 404 : rc == CAIRN_ENOMEM ? 500 : 409,
                         rc == CAIRN_ENOTFOUND ? "not_found" : "conflict", "%s", why);
        return;
    }
    int fd = card.path ? open(card.path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        http_reply_error(req, 404, "not_found", "model %s: cannot open its file: %s", id, strerror(errno));
        if (fd >= 0)
            close(fd);
        catalog_card_clear(&card);
        free(seal);
        return;
    }
    char hex[CATALOG_SHA256_HEX], etag[CATALOG_SHA256_HEX + 2], tok[DOWNLOAD_AUTH_MAX];
    rc = file_hash(r, card.path, &st, hex, why, sizeof why);
    catalog_card_clear(&card);
    if (!rc && seal && download_seal_key(r->secret, who, route, hex, seal->nonce, seal->key))
        rc = cairn_fail(why, sizeof why, CAIRN_EIO, "cannot make the transfer's key");
    if (rc) {
        close(fd);
        seal_free(seal);
        http_reply_header(req, "Retry-After", "1");
        http_reply_error(req, 503, "unavailable", "model %s: %s", id, why);
        return;
    }
    snprintf(etag, sizeof etag, "\"%s\"", hex);
    http_reply_header(req, "X-Cairn-Sha256", hex);
    http_reply_header(req, "ETag", etag);
    http_reply_header(req, "Accept-Ranges", "bytes");
    http_reply_header(req, "X-Cairn-Node", r->node_id);
    if (r->secret) {
        char what[sizeof route + CATALOG_SHA256_HEX + 1];
        snprintf(what, sizeof what, "%s|%s", route, hex);
        if (!download_auth_token(r->secret, r->node_id, what, (int64_t)time(NULL), tok))
            http_reply_header(req, "X-Cairn-Auth", tok);
    }
    uint64_t size = (uint64_t)st.st_size, first = 0, len = size;
    bool partial = false;
    const char *range = http_req_header(req, "Range"), *if_range = http_req_header(req, "If-Range");
    if (range && if_range && strcmp(if_range, etag))
        range = NULL; /* the file is not the one the client has a part of: send it whole */
    if (download_range_parse(range, size, &partial, &first, &len, why, sizeof why)) {
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%" PRIu64, size);
        http_reply_header(req, "Content-Range", cr);
        close(fd);
        seal_free(seal);
        http_reply_error(req, 416, "invalid_request_error", "%s", why);
        return;
    }
    if (partial) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first, first + len - 1, size);
        http_reply_header(req, "Content-Range", cr);
    }
    if (!seal) {
        http_reply_file(req, partial ? 206 : 200, "application/octet-stream", fd, first, len);
        return;
    }
    http_reply_header(req, "X-Cairn-Sealed", DOWNLOAD_SEALED);
    http_reply_file_xform(req, partial ? 206 : 200, "application/octet-stream", fd, first, len, seal_piece, seal,
                          seal_free);
}

int routes_files_create(struct routes_files **out, struct http_server *srv,
                        const struct routes_files_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if (!srv || !cfg || !cfg->card || !cfg->node_id || !ids_valid_id(cfg->node_id))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "files: a node id and a card lookup are required");
    struct routes_files *r = calloc(1, sizeof *r);
    if (!r)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    r->node_id = strdup(cfg->node_id);
    r->secret = cfg->secret && cfg->secret[0] ? strdup(cfg->secret) : NULL;
    r->card = cfg->card;
    r->card_ctx = cfg->card_ctx;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->hash_mu, NULL);
    if (!r->node_id || (cfg->secret && cfg->secret[0] && !r->secret)) {
        routes_files_release(r);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    int rc = http_route(srv, "GET", DOWNLOAD_ROUTE_PREFIX "*id" /* a pulled model's id holds '/' */, serve, r);
    if (rc) {
        routes_files_release(r);
        return cairn_fail(err, errlen, rc, "files: cannot add the route GET %s*id", DOWNLOAD_ROUTE_PREFIX);
    }
    *out = r;
    return 0;
}

void routes_files_release(struct routes_files *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < ROUTES_FILES_CACHE; i++)
        free(r->cache[i].path);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->hash_mu);
    free(r->node_id);
    if (r->secret)
        sodium_memzero(r->secret, strlen(r->secret));
    free(r->secret);
    free(r);
}
