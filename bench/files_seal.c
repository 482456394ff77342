/* What sealing costs a model-file transfer (node/download.h): one file served by the
 * real route (api/routes_files.h) on 127.0.0.1, from an open server and a sealed one in
 * turn (alternating, so both meet the same machine), then the median of each and their
 * ratio, for two things: the transfer alone (one GET with libcurl whose body is
 * unsealed and written as download.c does it) and a whole download_fetch (HEAD, GET,
 * then the SHA-256 of the file, the same in both modes, and a rename); and the keystream
 * alone, in one thread.
 *
 *   cmake --build build --target bench_files_seal
 *   ./build/bench_files_seal [MiB (1024)] [rounds (3)] [dir (/dev/shm, else /tmp)]
 *
 * The file and the fetched copies live in dir: on tmpfs the disk stays out of it. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <sodium.h>

#include "api/http.h"
#include "api/routes_files.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "node/catalog.h"
#include "node/download.h"

#define SECRET "bench-secret"

static char file_path[512];

static int card_of(void *ctx, const char *id, struct catalog_card *out, char *err, size_t errlen)
{
    (void)ctx;
    memset(out, 0, sizeof *out);
    if (strcmp(id, "big"))
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s not found", id);
    snprintf(out->id, sizeof out->id, "%s", id);
    out->path = strdup(file_path);
    return out->path ? 0 : CAIRN_ENOMEM;
}

/* Writes mib MiB of pseudo-random bytes (a keystream: fast, and incompressible). */
static int make_file(const char *path, size_t mib)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    static unsigned char buf[1 << 20];
    unsigned char seed[randombytes_SEEDBYTES] = {1};
    for (size_t i = 0; i < mib; i++) {
        seed[1] = (unsigned char)i;
        seed[2] = (unsigned char)(i >> 8);
        randombytes_buf_deterministic(buf, sizeof buf, seed);
        if (fwrite(buf, 1, sizeof buf, f) != sizeof buf) {
            fclose(f);
            return -1;
        }
    }
    return fclose(f);
}

/* A HEAD, so that the server hashes the file before the timed fetches. */
static void prime(int port)
{
    char tok[DOWNLOAD_AUTH_MAX], req[512];
    download_auth_token(SECRET, "bench", DOWNLOAD_ROUTE_PREFIX "big", (int64_t)time(NULL), tok);
    int n = snprintf(req, sizeof req,
                     "HEAD " DOWNLOAD_ROUTE_PREFIX "big HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cairn-Node: bench\r\n"
                     "X-Cairn-Auth: %s\r\nConnection: close\r\n\r\n",
                     tok);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[4096];
    if (fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof a) && send(fd, req, (size_t)n, 0) == n)
        while (recv(fd, buf, sizeof buf, 0) > 0) {
        }
    if (fd >= 0)
        close(fd);
}

static int start(struct http_server **srv, struct routes_files **rf, const char *secret)
{
    char err[512];
    struct http_config hc = {.bind_addr = "127.0.0.1"};
    struct routes_files_config fc = {.node_id = "holder", .secret = secret, .card = card_of};
    int rc = http_server_create(srv, &hc, err, sizeof err);
    if (!rc)
        rc = routes_files_create(rf, *srv, &fc, err, sizeof err);
    if (!rc)
        rc = http_server_start(*srv, err, sizeof err);
    if (rc)
        fprintf(stderr, "server: %s\n", err);
    return rc;
}

/* Seconds of one fetch of "big" from port into models (the copy deleted after). */
static double fetch(const char *models, int port, const char *secret)
{
    char err[1024], fin[600], part[600];
    struct download_config cfg = {.models_dir = models, .node_id = "bench", .secret = secret};
    struct download_source src = {.node_id = "holder", .n_urls = 1};
    snprintf(src.urls[0], sizeof src.urls[0], "http://127.0.0.1:%d", port);
    download_paths(models, "big", fin, part, sizeof fin);
    double t0 = clock_sec();
    int rc = download_fetch(&cfg, "big", &src, 1, NULL, NULL, NULL, err, sizeof err);
    double t = clock_sec() - t0;
    unlink(fin);
    if (rc) {
        fprintf(stderr, "fetch: %s\n", err);
        return -1;
    }
    return t;
}

/* A raw GET's body: unsealed when sealed, written at its offset. */
struct sink {
    int fd;
    uint64_t at;
    bool sealed;
    uint8_t key[DOWNLOAD_SEAL_KEY_BYTES], nonce[DOWNLOAD_NONCE_BYTES];
    uint8_t buf[16384];
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct sink *k = arg;
    size_t n = size * nmemb;
    for (size_t done = 0; done < n;) {
        size_t len = n - done < sizeof k->buf ? n - done : sizeof k->buf;
        const void *p = data + done;
        if (k->sealed) {
            memcpy(k->buf, p, len);
            download_seal_xor(k->buf, len, k->at, k->nonce, k->key);
            p = k->buf;
        }
        if (pwrite(k->fd, p, len, (off_t)k->at) != (ssize_t)len)
            return 0;
        k->at += len;
        done += len;
    }
    return n;
}

/* Seconds of one GET of the whole file from port into models/raw.bin; -1 on failure. */
static double transfer(const char *models, int port, const char *secret, uint64_t size)
{
    static struct sink k;
    char url[128], path[600], tok[DOWNLOAD_AUTH_MAX], h1[160], h2[160], hex[DOWNLOAD_NONCE_HEX];
    char sha[CATALOG_SHA256_HEX], err[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d" DOWNLOAD_ROUTE_PREFIX "big", port);
    snprintf(path, sizeof path, "%s/raw.bin", models);
    memset(&k, 0, sizeof k);
    k.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    struct curl_slist *l = curl_slist_append(NULL, "X-Cairn-Node: bench");
    if (secret) {
        download_auth_token(secret, "bench", DOWNLOAD_ROUTE_PREFIX "big", (int64_t)time(NULL), tok);
        snprintf(h1, sizeof h1, "X-Cairn-Auth: %s", tok);
        randombytes_buf(k.nonce, sizeof k.nonce);
        sodium_bin2hex(hex, sizeof hex, k.nonce, sizeof k.nonce);
        snprintf(h2, sizeof h2, "X-Cairn-Nonce: %s", hex);
        l = curl_slist_append(curl_slist_append(l, h1), h2);
        catalog_file_sha256(file_path, sha, NULL, NULL, err, sizeof err); /* before the clock starts */
        download_seal_key(secret, "bench", DOWNLOAD_ROUTE_PREFIX "big", sha, k.nonce, k.key);
        k.sealed = true;
    }
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, l);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &k);
    double t0 = clock_sec();
    CURLcode cc = curl_easy_perform(c);
    double t = clock_sec() - t0;
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(l);
    close(k.fd);
    unlink(path);
    if (cc != CURLE_OK || status != 200 || k.at != size) {
        fprintf(stderr, "GET: %s, HTTP %ld, %" PRIu64 " bytes\n", curl_easy_strerror(cc), status, k.at);
        return -1;
    }
    return t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    struct stat st;
    const char *base = argc > 3 ? argv[3] : stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp";
    if (mib == 0 || rounds < 1 || rounds > 64 || sodium_init() < 0) {
        fprintf(stderr, "usage: bench_files_seal [MiB] [rounds 1..64] [dir]\n");
        return 1;
    }
    log_set_level(LOG_WARN);
    char dir[400], models[500];
    snprintf(dir, sizeof dir, "%s/cairn-bench-files-%d", base, (int)getpid());
    snprintf(models, sizeof models, "%s/models", dir);
    snprintf(file_path, sizeof file_path, "%s/big.bin", dir);
    mkdir(dir, 0700);
    if (make_file(file_path, mib)) {
        fprintf(stderr, "cannot write %s\n", file_path);
        return 1;
    }
    struct http_server *open_srv = NULL, *sealed_srv = NULL;
    struct routes_files *open_rf = NULL, *sealed_rf = NULL;
    int rc = start(&open_srv, &open_rf, NULL);
    if (!rc)
        rc = start(&sealed_srv, &sealed_rf, SECRET);
    double plain[64], sealed[64], raw_plain[64], raw_sealed[64];
    uint64_t size = (uint64_t)mib << 20;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    mkdir(models, 0700);
    if (!rc) {
        int po = http_server_port(open_srv), ps = http_server_port(sealed_srv);
        prime(po);
        prime(ps);
        for (int r = 0; r < rounds && !rc; r++) {
            bool sealed_first = r % 2; /* neither mode always runs second */
            double a = transfer(models, sealed_first ? ps : po, sealed_first ? SECRET : NULL, size);
            double b = transfer(models, sealed_first ? po : ps, sealed_first ? NULL : SECRET, size);
            raw_plain[r] = sealed_first ? b : a;
            raw_sealed[r] = sealed_first ? a : b;
            a = fetch(models, sealed_first ? ps : po, sealed_first ? SECRET : NULL);
            b = fetch(models, sealed_first ? po : ps, sealed_first ? NULL : SECRET);
            plain[r] = sealed_first ? b : a;
            sealed[r] = sealed_first ? a : b;
            if (a < 0 || b < 0 || raw_plain[r] < 0 || raw_sealed[r] < 0)
                rc = 1;
            else
                printf("round %d: transfer open %.3f s, sealed %.3f s; fetch open %.3f s, sealed %.3f s\n", r + 1,
                       raw_plain[r], raw_sealed[r], plain[r], sealed[r]);
        }
    }
    /* The keystream alone, 64 KiB at a time as the server seals. */
    size_t kn = 64 << 10;
    uint8_t *buf = calloc(1, kn), key[DOWNLOAD_SEAL_KEY_BYTES] = {0}, nonce[DOWNLOAD_NONCE_BYTES] = {0};
    double t0 = clock_sec();
    for (uint64_t off = 0; buf && off < ((uint64_t)mib << 20); off += kn)
        download_seal_xor(buf, kn, off + 1, nonce, key);
    double ks = clock_sec() - t0;
    if (!rc) {
        double gib = (double)mib / 1024;
        double tp = median(raw_plain, rounds), ts = median(raw_sealed, rounds);
        double mp = median(plain, rounds), ms = median(sealed, rounds);
        printf("file: %zu MiB in %s; medians of %d rounds\n", mib, base, rounds);
        printf("transfer: open %.3f s (%.2f GiB/s), sealed %.3f s (%.2f GiB/s), sealed/open %.3f\n", tp, gib / tp, ts,
               gib / ts, ts / tp);
        printf("fetch:    open %.3f s (%.2f GiB/s), sealed %.3f s (%.2f GiB/s), sealed/open %.3f\n", mp, gib / mp, ms,
               gib / ms, ms / mp);
        printf("keystream alone (one thread): %.2f GiB/s\n", gib / ks);
    }
    free(buf);
    http_server_stop(open_srv);
    http_server_stop(sealed_srv);
    routes_files_release(open_rf);
    routes_files_release(sealed_rf);
    http_server_release(open_srv);
    http_server_release(sealed_srv);
    unlink(file_path);
    rmdir(models);
    rmdir(dir);
    return rc;
}
