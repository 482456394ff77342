/* Model files between nodes (node/download.h, api/routes_files.h).
 *
 * In this process: the real HTTP server with GET|HEAD /files/models/<id> over a
 * folder of files, spoken to over a socket: whole file, one range (206 and its
 * Content-Range), a range past the end (416), If-Range of another file (whole), HEAD,
 * 401 without a token, with a stale one or one for another file, 400 for a GET without
 * a nonce, 404 for an unknown model, the reply's own token; sealed bodies as a capture
 * sees them (not the file, a repeated pattern nowhere, another nonce other bytes) that
 * unseal to the file from their offset; then download_fetch from it writes a
 * byte-identical file, resumes a partial file (a wrong one fails its hash, then comes
 * whole), and a server without a secret serves anyone in clear.
 *
 * Two `cairn node` processes on 127.0.0.1 (--discovery off, --peer, separate
 * --models-dir, a cluster secret): A holds a model made by `cairn mkmodel` and offers
 * almost no memory, so placing the model puts its shard on B, which lacks the file. B
 * fetches it from A: /state shows B's download Completed with the file's size, B's
 * file is byte-identical, B's runner reaches Ready, and A's GET /models lists B among
 * the nodes with the model. Every wait is bounded; children die with this process. */
#define _GNU_SOURCE /* memmem */
#include "testutil.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/http.h"
#include "api/routes_files.h"
#include "base/err.h"
#include "base/log.h"
#include "node/catalog.h"
#include "node/download.h"
#include "nodes.h"

#define SECRET "download-secret"
#define FILE_BYTES ((1 << 20) + 333)

static char dir[256];
static char err[2048];

/* A reply: status, the header block, the body (binary). */
struct reply {
    int status;
    char head[4096];
    unsigned char *body;
    size_t len;
};

static void reply_free(struct reply *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Sends req (the whole request text) to 127.0.0.1:port and reads the reply until the
 * server closes (Connection: close). Status -1 when nothing came within 10 s. */
static void http_raw(int port, const char *req, struct reply *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int fd = connect_to(port, 10000);
    if (fd < 0 || !send_all(fd, req, strlen(req))) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            unsigned char *b = realloc(buf, cap + 1);
            if (!b)
                break;
            buf = b;
        }
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = 0;
    const char *end = strstr((char *)buf, "\r\n\r\n");
    if (!end || sscanf((char *)buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        r->status = -1;
        return;
    }
    size_t hl = (size_t)(end - (char *)buf) + 2;
    snprintf(r->head, sizeof r->head, "%.*s", (int)(hl < sizeof r->head ? hl : sizeof r->head - 1), buf);
    r->len = len - (hl + 2);
    r->body = malloc(r->len + 1);
    memcpy(r->body, buf + hl + 2, r->len);
    r->body[r->len] = 0;
    free(buf);
}

/* Value of header name in r (static buffer), or NULL. */
static const char *hdr(const struct reply *r, const char *name)
{
    static char v[512];
    return header_of(r->head, name, v, sizeof v) ? v : NULL;
}

static void request(char *out, size_t n, const char *method, const char *id, const char *node, const char *token,
                    const char *extra)
{
    snprintf(out, n, "%s %s%s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s%s%s%s\r\n", method,
             DOWNLOAD_ROUTE_PREFIX, id, node ? "X-Cairn-Node: " : "", node ? node : "", node ? "\r\n" : "",
             token ? "X-Cairn-Auth: " : "", token ? token : "", token ? "\r\n" : "", extra ? extra : "");
}

/* A fresh nonce into nonce, and its header line into line. */
static void new_nonce(uint8_t nonce[DOWNLOAD_NONCE_BYTES], char *line, size_t n)
{
    char hex[DOWNLOAD_NONCE_HEX];
    randombytes_buf(nonce, DOWNLOAD_NONCE_BYTES);
    sodium_bin2hex(hex, sizeof hex, nonce, DOWNLOAD_NONCE_BYTES);
    snprintf(line, n, "X-Cairn-Nonce: %s\r\n", hex);
}

/* Unseals r's body, which starts at offset in the file of route and hash sha, as the
 * requester "asker" holding SECRET would. */
static void unseal(struct reply *r, uint64_t offset, const uint8_t nonce[DOWNLOAD_NONCE_BYTES], const char *route,
                   const char *sha)
{
    uint8_t key[DOWNLOAD_SEAL_KEY_BYTES];
    CHECK(download_seal_key(SECRET, "asker", route, sha, nonce, key) == 0, "seal key");
    download_seal_xor(r->body, r->len, offset, nonce, key);
}

/* ---- in process ---- */

static char files_dir[300];

/* A card lookup over files_dir/<id>.bin (routes_files needs only the path). */
static int card_of(void *ctx, const char *id, struct catalog_card *out, char *e, size_t elen)
{
    (void)ctx;
    memset(out, 0, sizeof *out);
    char path[600];
    snprintf(path, sizeof path, "%s/%s.bin", files_dir, id);
    struct stat st;
    if (stat(path, &st))
        return cairn_fail(e, elen, CAIRN_ENOTFOUND, "model %s not found", id);
    snprintf(out->id, sizeof out->id, "%s", id);
    out->path = strdup(path);
    out->file_bytes = (uint64_t)st.st_size;
    return out->path ? 0 : CAIRN_ENOMEM;
}

static unsigned char *data;
static char data_sha[65];

static void test_inprocess(void)
{
    snprintf(files_dir, sizeof files_dir, "%s/files", dir);
    mkdir(files_dir, 0755);
    char path[600];
    snprintf(path, sizeof path, "%s/f1.bin", files_dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, FILE_BYTES, f) == FILE_BYTES, "file written");
    if (f)
        fclose(f);

    struct http_config hc = {.bind_addr = "127.0.0.1"};
    struct http_server *srv = NULL, *open_srv = NULL;
    struct routes_files *rf = NULL, *open_rf = NULL;
    struct routes_files_config fc = {.node_id = "holder", .secret = SECRET, .card = card_of};
    int rc = http_server_create(&srv, &hc, err, sizeof err);
    if (!rc)
        rc = routes_files_create(&rf, srv, &fc, err, sizeof err);
    if (!rc)
        rc = http_server_start(srv, err, sizeof err);
    CHECK(rc == 0, "server: %s", err);
    if (rc)
        goto out;
    int port = http_server_port(srv);
    const char *route = DOWNLOAD_ROUTE_PREFIX "f1";
    char tok[DOWNLOAD_AUTH_MAX], req[2048];
    download_auth_token(SECRET, "asker", route, (int64_t)time(NULL), tok);
    struct reply r;

    /* No token, a stale one, one for another file, one from another secret: 401. */
    request(req, sizeof req, "GET", "f1", NULL, NULL, NULL);
    http_raw(port, req, &r);
    CHECK(r.status == 401, "no token: %d", r.status);
    reply_free(&r);
    char stale[DOWNLOAD_AUTH_MAX];
    download_auth_token(SECRET, "asker", route, (int64_t)time(NULL) - 3600, stale);
    request(req, sizeof req, "GET", "f1", "asker", stale, NULL);
    http_raw(port, req, &r);
    CHECK(r.status == 401 && strstr((char *)r.body, "stale"), "stale token: %d %s", r.status, r.body);
    reply_free(&r);
    char other[DOWNLOAD_AUTH_MAX];
    download_auth_token(SECRET, "asker", DOWNLOAD_ROUTE_PREFIX "f2", (int64_t)time(NULL), other);
    request(req, sizeof req, "GET", "f1", "asker", other, NULL);
    http_raw(port, req, &r);
    CHECK(r.status == 401, "token of another file: %d", r.status);
    reply_free(&r);
    request(req, sizeof req, "GET", "f1", "impostor", tok, NULL);
    http_raw(port, req, &r);
    CHECK(r.status == 401, "token of another node: %d", r.status);
    reply_free(&r);

    /* A GET without a nonce, or with a malformed one: 400 (its body would go sealed). */
    uint8_t nonce[DOWNLOAD_NONCE_BYTES];
    char nl[128], extra[400];
    request(req, sizeof req, "GET", "f1", "asker", tok, NULL);
    http_raw(port, req, &r);
    CHECK(r.status == 400 && strstr((char *)r.body, "X-Cairn-Nonce"), "no nonce: %d %s", r.status, r.body);
    reply_free(&r);
    request(req, sizeof req, "GET", "f1", "asker", tok, "X-Cairn-Nonce: 0123456789abcdef\r\n");
    http_raw(port, req, &r);
    CHECK(r.status == 400, "short nonce: %d", r.status);
    reply_free(&r);

    /* The whole file, its hash and the server's proof; the body on the wire is not the
     * file, and unseals to it. */
    new_nonce(nonce, nl, sizeof nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, nl);
    http_raw(port, req, &r);
    const char *sealed = hdr(&r, "X-Cairn-Sealed");
    CHECK(sealed && !strcmp(sealed, DOWNLOAD_SEALED), "X-Cairn-Sealed: %s", sealed ? sealed : "(none)");
    CHECK(r.status == 200 && r.len == FILE_BYTES && memcmp(r.body, data, FILE_BYTES), "whole: %d, %zu bytes%s",
          r.status, r.len, r.len == FILE_BYTES ? ", in clear" : "");
    unsigned char *first_body = r.len == FILE_BYTES ? memcpy(malloc(FILE_BYTES), r.body, FILE_BYTES) : NULL;
    unseal(&r, 0, nonce, route, data_sha);
    CHECK(r.len == FILE_BYTES && !memcmp(r.body, data, FILE_BYTES), "whole: does not unseal to the file");
    const char *sha = hdr(&r, "X-Cairn-Sha256");
    CHECK(sha && !strcmp(sha, data_sha), "X-Cairn-Sha256: %s", sha ? sha : "(none)");
    const char *node = hdr(&r, "X-Cairn-Node");
    CHECK(node && !strcmp(node, "holder"), "X-Cairn-Node: %s", node ? node : "(none)");
    const char *proof = hdr(&r, "X-Cairn-Auth");
    char what[512], proof_copy[DOWNLOAD_AUTH_MAX] = "";
    snprintf(what, sizeof what, "%s|%s", route, data_sha);
    if (proof)
        snprintf(proof_copy, sizeof proof_copy, "%.*s", (int)sizeof proof_copy - 1, proof);
    CHECK(proof && download_auth_check(SECRET, "holder", what, proof_copy, (int64_t)time(NULL), err, sizeof err) == 0,
          "reply proof: %s", proof ? err : "(none)");
    reply_free(&r);

    /* Another nonce, another keystream: the same file looks different on the wire. */
    new_nonce(nonce, nl, sizeof nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, nl);
    http_raw(port, req, &r);
    CHECK(r.status == 200 && r.len == FILE_BYTES && first_body && memcmp(r.body, first_body, FILE_BYTES),
          "a second nonce: %d, %zu bytes, %s", r.status, r.len, first_body ? "the same bytes" : "");
    free(first_body);
    reply_free(&r);

    /* One range (unsealed from its offset); a range past the end; If-Range of another
     * file sends it whole. */
    new_nonce(nonce, nl, sizeof nl);
    snprintf(extra, sizeof extra, "Range: bytes=1000-1999\r\n%s", nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, extra);
    http_raw(port, req, &r);
    const char *cr = hdr(&r, "Content-Range");
    char want_cr[64];
    snprintf(want_cr, sizeof want_cr, "bytes 1000-1999/%d", FILE_BYTES);
    bool cr_ok = cr && !strcmp(cr, want_cr);
    unseal(&r, 1000, nonce, route, data_sha);
    CHECK(r.status == 206 && r.len == 1000 && !memcmp(r.body, data + 1000, 1000) && cr_ok, "range: %d, %zu bytes, %s",
          r.status, r.len, cr_ok ? "" : "a wrong Content-Range");
    reply_free(&r);
    snprintf(extra, sizeof extra, "Range: bytes=%d-\r\n%s", FILE_BYTES, nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, extra);
    http_raw(port, req, &r);
    cr = hdr(&r, "Content-Range");
    snprintf(want_cr, sizeof want_cr, "bytes */%d", FILE_BYTES);
    CHECK(r.status == 416 && cr && !strcmp(cr, want_cr), "past the end: %d %s", r.status, cr ? cr : "");
    reply_free(&r);
    snprintf(extra, sizeof extra, "Range: bytes=10-\r\nIf-Range: \"%064d\"\r\n%s", 0, nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, extra);
    http_raw(port, req, &r);
    CHECK(r.status == 200 && r.len == FILE_BYTES, "If-Range of another file: %d, %zu bytes", r.status, r.len);
    reply_free(&r);
    snprintf(extra, sizeof extra, "Range: bytes=10-\r\nIf-Range: \"%s\"\r\n%s", data_sha, nl);
    request(req, sizeof req, "GET", "f1", "asker", tok, extra);
    http_raw(port, req, &r);
    CHECK(r.status == 206 && r.len == FILE_BYTES - 10, "If-Range of this file: %d, %zu bytes", r.status, r.len);
    reply_free(&r);

    /* HEAD: headers only, no nonce needed. */
    request(req, sizeof req, "HEAD", "f1", "asker", tok, NULL);
    http_raw(port, req, &r);
    const char *cl = hdr(&r, "Content-Length");
    CHECK(r.status == 200 && r.len == 0 && cl && atoll(cl) == FILE_BYTES && hdr(&r, "X-Cairn-Sha256"),
          "HEAD: %d, %zu body bytes, length %s", r.status, r.len, cl ? cl : "(none)");
    reply_free(&r);

    /* What a capture of the wire shows: a file of one repeated 16-byte pattern, asked
     * from an odd offset, holds the pattern nowhere in the body sent, and unseals back. */
    static const char pattern[] = "cairn model file";
    char path2[600], sha2[CATALOG_SHA256_HEX];
    snprintf(path2, sizeof path2, "%s/f2.bin", files_dir);
    unsigned char *pat = malloc(FILE_BYTES);
    for (size_t i = 0; i < FILE_BYTES; i++)
        pat[i] = (unsigned char)pattern[i % 16];
    f = fopen(path2, "wb");
    CHECK(f && fwrite(pat, 1, FILE_BYTES, f) == FILE_BYTES, "pattern file written");
    if (f)
        fclose(f);
    CHECK(catalog_file_sha256(path2, sha2, NULL, NULL, err, sizeof err) == 0, "pattern hash: %s", err);
    const char *route2 = DOWNLOAD_ROUTE_PREFIX "f2";
    char tok_f2[DOWNLOAD_AUTH_MAX];
    download_auth_token(SECRET, "asker", route2, (int64_t)time(NULL), tok_f2);
    new_nonce(nonce, nl, sizeof nl);
    snprintf(extra, sizeof extra, "Range: bytes=77-\r\n%s", nl);
    request(req, sizeof req, "GET", "f2", "asker", tok_f2, extra);
    http_raw(port, req, &r);
    CHECK(r.status == 206 && r.len == FILE_BYTES - 77, "pattern: %d, %zu bytes", r.status, r.len);
    CHECK(r.body && !memmem(r.body, r.len, pattern, 16) && !memmem(r.body, r.len, "cairn", 5),
          "pattern: the body on the wire shows the file's bytes");
    unseal(&r, 77, nonce, route2, sha2);
    CHECK(r.len == FILE_BYTES - 77 && !memcmp(r.body, pat + 77, r.len), "pattern: does not unseal to the file");
    reply_free(&r);
    free(pat);

    /* An unknown model. */
    char tok2[DOWNLOAD_AUTH_MAX];
    download_auth_token(SECRET, "asker", DOWNLOAD_ROUTE_PREFIX "ghost", (int64_t)time(NULL), tok2);
    request(req, sizeof req, "GET", "ghost", "asker", tok2, nl);
    http_raw(port, req, &r);
    CHECK(r.status == 404, "unknown model: %d", r.status);
    reply_free(&r);

    /* download_fetch from the real route. */
    char models[300], fin[600], part[600];
    snprintf(models, sizeof models, "%s/fetched", dir);
    struct download_config cfg = {.models_dir = models, .node_id = "asker", .secret = SECRET};
    struct download_source src = {.node_id = "holder", .n_urls = 1};
    snprintf(src.urls[0], sizeof src.urls[0], "http://127.0.0.1:%d", port);
    rc = download_fetch(&cfg, "f1", &src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == 0, "fetch from the route: %s", err);
    download_paths(models, "f1", fin, part, sizeof fin);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", fin, path);
    CHECK(rc == 0 && system(cmd) == 0, "fetched file differs");

    /* A resume through the route: a partial of the first 123457 bytes (not a multiple
     * of the cipher's 64-byte block) is completed from there. A partial whose first
     * bytes are wrong shows that only the rest came: the whole fails its hash and is
     * deleted, and the next fetch starts from zero. */
    for (int wrong = 0; wrong < 2; wrong++) {
        const char *id = wrong ? "f1-bad" : "f1-resume";
        char fpath[700];
        snprintf(fpath, sizeof fpath, "%s/%s.bin", files_dir, id);
        CHECK(link(path, fpath) == 0, "link %s: %s", fpath, strerror(errno));
        download_paths(models, id, fin, part, sizeof fin);
        unsigned char *head = malloc(123457);
        memcpy(head, data, 123457);
        if (wrong)
            memset(head + 5000, 0, 1000);
        f = fopen(part, "wb");
        CHECK(f && fwrite(head, 1, 123457, f) == 123457, "partial written");
        if (f)
            fclose(f);
        free(head);
        rc = download_fetch(&cfg, id, &src, 1, NULL, NULL, NULL, err, sizeof err);
        snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", fin, path);
        if (!wrong) {
            CHECK(rc == 0 && system(cmd) == 0, "resume: %d %s", rc, err);
            continue;
        }
        struct stat pst;
        CHECK(rc == CAIRN_EFORMAT && strstr(err, "SHA-256") && stat(part, &pst) && stat(fin, &pst),
              "resume over wrong bytes: %d %s", rc, err);
        rc = download_fetch(&cfg, id, &src, 1, NULL, NULL, NULL, err, sizeof err);
        CHECK(rc == 0 && system(cmd) == 0, "from zero after a failed hash: %d %s", rc, err);
    }

    /* Without a secret the route is open (the API's own key aside). */
    struct routes_files_config open_fc = {.node_id = "holder", .card = card_of};
    rc = http_server_create(&open_srv, &hc, err, sizeof err);
    if (!rc)
        rc = routes_files_create(&open_rf, open_srv, &open_fc, err, sizeof err);
    if (!rc)
        rc = http_server_start(open_srv, err, sizeof err);
    CHECK(rc == 0, "open server: %s", err);
    if (!rc) {
        request(req, sizeof req, "GET", "f1", NULL, NULL, "Range: bytes=-5\r\n");
        http_raw(http_server_port(open_srv), req, &r);
        CHECK(r.status == 206 && r.len == 5 && !memcmp(r.body, data + FILE_BYTES - 5, 5) && !hdr(&r, "X-Cairn-Auth"),
              "open server: %d %zu", r.status, r.len);
        reply_free(&r);
        /* A nonce changes nothing there: the file goes in clear, unmarked. */
        new_nonce(nonce, nl, sizeof nl);
        snprintf(extra, sizeof extra, "Range: bytes=-5\r\n%s", nl);
        request(req, sizeof req, "GET", "f1", NULL, NULL, extra);
        http_raw(http_server_port(open_srv), req, &r);
        CHECK(r.status == 206 && r.len == 5 && !memcmp(r.body, data + FILE_BYTES - 5, 5) && !hdr(&r, "X-Cairn-Sealed"),
              "open server with a nonce: %d %zu", r.status, r.len);
        reply_free(&r);
    }
out:
    http_server_stop(srv);
    http_server_stop(open_srv);
    routes_files_release(rf);
    routes_files_release(open_rf);
    http_server_release(srv);
    http_server_release(open_srv);
}

/* ---- two processes ---- */

/* Node i (of nodes.h's nodes[]) with its own models dir, the cluster secret and one
 * thread; data and log under dir. peer: the index of a node to connect to, or -1. */
static void start_with_models(int i, const char *models, const char *memory, int peer, bool master)
{
    struct proc *p = &nodes[i];
    char api[16], cl[16], data_dir[512], peer_arg[64];
    p->api = free_port();
    p->cluster = free_port();
    snprintf(api, sizeof api, "%d", p->api);
    snprintf(cl, sizeof cl, "%d", p->cluster);
    snprintf(data_dir, sizeof data_dir, "%s/data%d", dir, i);
    snprintf(p->log, sizeof p->log, "%s/node%d.log", dir, i);
    char *argv[40];
    int k = 0;
    argv[k++] = (char *)CAIRN_BINARY;
    argv[k++] = "node";
    argv[k++] = "--api-port";
    argv[k++] = api;
    argv[k++] = "--cluster-port";
    argv[k++] = cl;
    argv[k++] = "--bind";
    argv[k++] = "127.0.0.1";
    argv[k++] = "--data-dir";
    argv[k++] = data_dir;
    argv[k++] = "--models-dir";
    argv[k++] = (char *)models;
    argv[k++] = "--discovery";
    argv[k++] = "off";
    argv[k++] = "--memory-limit";
    argv[k++] = (char *)memory;
    argv[k++] = "--cluster-secret";
    argv[k++] = SECRET;
    argv[k++] = "--threads";
    argv[k++] = "1";
    argv[k++] = "-v";
    if (master)
        argv[k++] = "--force-master";
    if (peer >= 0) {
        snprintf(peer_arg, sizeof peer_arg, "127.0.0.1:%d", nodes[peer].cluster);
        argv[k++] = "--peer";
        argv[k++] = peer_arg;
    }
    argv[k] = NULL;
    p->pid = spawn(p->log, argv);
}

/* In A's /state: B's download of m1 (status into st, sizes), and B's runner status. */
static void look(const char *iid, char *st, size_t stn, int64_t *done, int64_t *total, char *runner, size_t rn)
{
    st[0] = runner[0] = 0;
    json_t *s = get_json(nodes[0].api, "/state");
    json_t *dls = json_object_get(s, "downloads");
    for (size_t i = 0; i < json_array_size(dls); i++) {
        json_t *d = json_array_get(dls, i);
        if (!strcmp(json_string_value(json_object_get(d, "node_id")) ?: "", nodes[1].id) &&
            !strcmp(json_string_value(json_object_get(d, "model_id")) ?: "", "m1")) {
            snprintf(st, stn, "%s", json_string_value(json_object_get(d, "status")) ?: "");
            *done = json_integer_value(json_object_get(d, "bytes_done"));
            *total = json_integer_value(json_object_get(d, "bytes_total"));
        }
    }
    json_t *in = json_object_get(json_object_get(s, "instances"), iid);
    json_t *shards = json_object_get(in, "shards");
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_t *sh = json_array_get(shards, i);
        if (strcmp(json_string_value(json_object_get(sh, "node_id")) ?: "", nodes[1].id))
            continue;
        const char *rid = json_string_value(json_object_get(sh, "runner_id"));
        json_t *r = rid ? json_object_get(json_object_get(s, "runners"), rid) : NULL;
        snprintf(runner, rn, "%s", r ? json_string_value(json_object_get(r, "status")) ?: "" : "(none)");
    }
    json_decref(s);
}

static void test_two_nodes(void)
{
    static char out[1 << 20];
    char models_a[300], models_b[300], model_a[400], model_b[400], vocab[512];
    snprintf(models_a, sizeof models_a, "%s/models-a", dir);
    snprintf(models_b, sizeof models_b, "%s/models-b", dir); /* made by the download */
    mkdir(models_a, 0755);
    snprintf(model_a, sizeof model_a, "%s/m1.gguf", models_a);
    snprintf(model_b, sizeof model_b, "%s/m1.gguf", models_b);
    snprintf(vocab, sizeof vocab, "%s", test_data_path("vocab/ggml-vocab-llama-spm.gguf"));
    int rc = run_cmd("%s mkmodel --shape tiny --vocab %s -o %s >%s/mkmodel.log 2>&1", CAIRN_BINARY, vocab, model_a,
                     dir);
    CHECK(rc == 0, "mkmodel failed (%d), see %s/mkmodel.log", rc, dir);
    if (rc)
        return;
    struct stat st_a;
    stat(model_a, &st_a);

    /* A: the model, the master, next to no memory. B: memory, no model. */
    start_with_models(0, models_a, "1K", -1, true);
    start_with_models(1, models_b, "4G", 0, false);
    bool up = read_id(0) && read_id(1);
    CHECK(up, "both APIs answer /node_id");
    bool joined = false;
    for (double t0 = now_s(); up && !joined && now_s() - t0 < 30; sleep_ms(100)) {
        json_t *s = get_json(nodes[0].api, "/state");
        json_t *ns = json_object_get(s, "nodes");
        json_t *b = json_object_get(ns, nodes[1].id);
        joined = json_object_size(ns) == 2 &&
                 json_integer_value(json_object_get(json_object_get(b, "info"), "api_port")) == nodes[1].api;
        json_decref(s);
    }
    CHECK(joined, "A's state shows both nodes with B's API port (bound 30 s)");
    if (!joined)
        goto out;
    double t0 = now_s();
    int st = http(nodes[0].api, "POST", "/place_instance", "{\"model_id\":\"m1\"}", out, sizeof out);
    json_t *placed = json_loads(out, 0, NULL);
    char iid[80];
    snprintf(iid, sizeof iid, "%s", json_string_value(json_object_get(placed, "instance_id")) ?: "");
    bool on_b = strstr(out, nodes[1].id) != NULL;
    json_decref(placed);
    CHECK(st == 200 && iid[0] && on_b, "place_instance puts a shard on B: %d %s", st, out);
    if (st != 200)
        goto out;
    char dl[32] = "", runner[32] = "";
    int64_t done = 0, total = 0;
    double t_done = -1, t_ready = -1;
    while (now_s() - t0 < 90 && (t_done < 0 || t_ready < 0)) {
        look(iid, dl, sizeof dl, &done, &total, runner, sizeof runner);
        if (t_done < 0 && !strcmp(dl, "Completed"))
            t_done = now_s() - t0;
        if (t_ready < 0 && (!strcmp(runner, "Ready") || !strcmp(runner, "Running")))
            t_ready = now_s() - t0;
        if (!strcmp(dl, "Failed") || !strcmp(runner, "Failed"))
            break;
        sleep_ms(100);
    }
    CHECK(t_done >= 0 && done == (int64_t)st_a.st_size && total == (int64_t)st_a.st_size,
          "B's download in /state: '%s' %" PRId64 "/%" PRId64 " of %lld", dl, done, total, (long long)st_a.st_size);
    CHECK(run_cmd("cmp -s '%s' '%s'", model_a, model_b) == 0, "B's file differs from A's");
    CHECK(t_ready >= 0, "B's runner reaches Ready after the download (now '%s')", runner);
    printf("figure: download Completed %.2f s, runner Ready %.2f s after placement\n", t_done, t_ready);
    json_t *models = get_json(nodes[0].api, "/models");
    bool listed = false;
    json_t *arr = json_object_get(models, "models");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *m = json_array_get(arr, i);
        if (strcmp(json_string_value(json_object_get(m, "id")) ?: "", "m1"))
            continue;
        json_t *ns = json_object_get(m, "nodes");
        for (size_t k = 0; k < json_array_size(ns); k++)
            listed = listed || !strcmp(json_string_value(json_array_get(ns, k)) ?: "", nodes[1].id);
    }
    json_decref(models);
    CHECK(listed, "A's /models lists B among the nodes with m1");
    /* A's file route refuses a request without the secret's token. */
    st = http(nodes[0].api, "GET", DOWNLOAD_ROUTE_PREFIX "m1", NULL, out, sizeof out);
    CHECK(st == 401, "A's file route without a token: %d", st);
out:
    if (test_failed)
        for (int i = 0; i < 2; i++)
            print_log_tail(i);
    for (int i = 0; i < 2; i++)
        if (nodes[i].pid > 0)
            kill(nodes[i].pid, SIGTERM);
    for (int i = 0; i < 2; i++)
        if (nodes[i].pid > 0)
            CHECK(wait_exit(nodes[i].pid, 20) == 0, "node %d did not exit cleanly on SIGTERM", i);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    log_set_level(LOG_WARN);
    snprintf(dir, sizeof dir, "/tmp/cairn-test-dlnodes-%d", (int)getpid());
    mkdir(dir, 0700);
    data = malloc(FILE_BYTES);
    uint64_t seed = 7;
    for (size_t i = 0; i < FILE_BYTES; i++)
        data[i] = (unsigned char)test_rand_u64(&seed);
    unsigned char h[32];
    if (sodium_init() < 0)
        return 1;
    crypto_hash_sha256(h, data, FILE_BYTES);
    sodium_bin2hex(data_sha, sizeof data_sha, h, sizeof h);

    RUN(test_inprocess);
    RUN(test_two_nodes);

    free(data);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!test_failed && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_main_end();
}
