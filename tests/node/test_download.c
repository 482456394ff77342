/* Model downloads from peers (node/download.h): Range parsing, the HMAC tokens (good,
 * wrong secret, stale, wrong path or node, malformed), the sealed bodies' keystream at
 * any offset against one run from offset 0, their keys and nonces, destination paths,
 * sources from a state, and download_fetch against a small HTTP server in this test (a
 * thread on 127.0.0.1) that serves a random file, sealed when it has a secret, and can
 * cut a reply short, lie about the hash or the size, drag its feet, flip a bit on the
 * wire, send a sealed cluster's file in clear, or answer as another node: a whole fetch,
 * a resume after a cut connection and after a restart (partial file left on disk), a
 * hash mismatch and a tampered body (the partial deleted, the next fetch from zero), a
 * clear reply refused, a file larger than the disk, refused tokens both ways, and the
 * manager's thread (an open cluster: no nonce sent) with its status and its cancel on
 * release. Every wait is bounded. */
#include "node/download.h"
#include "ctl/master.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "testutil.h"

#define FILE_BYTES (300 * 1024 + 17)
#define SECRET "test-secret"

static char err[2048];
static char root[256];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- Range ---- */

static void test_range(void)
{
    static const struct {
        const char *h;
        uint64_t size;
        int rc;
        bool partial;
        uint64_t first, len;
    } cases[] = {
        {NULL, 100, 0, false, 0, 100},
        {"items=0-5", 100, 0, false, 0, 100},
        {"bytes=0-9", 100, 0, true, 0, 10},
        {"bytes=10-", 100, 0, true, 10, 90},
        {"bytes=99-", 100, 0, true, 99, 1},
        {"bytes=90-1000", 100, 0, true, 90, 10},
        {"bytes=-30", 100, 0, true, 70, 30},
        {"bytes=-300", 100, 0, true, 0, 100},
        {"Bytes = 5-5", 100, 0, true, 5, 1},
        {"bytes=100-", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=100-200", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=9-3", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=-0", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=-", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=0-1,5-6", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=x-1", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=1-2x", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=0-", 0, CAIRN_ERANGE, false, 0, 0},
        {"bytes=-5", 0, CAIRN_ERANGE, false, 0, 0},
        {"bytes=99999999999999999999999-", 100, CAIRN_ERANGE, false, 0, 0},
        {"bytes=0-18446744073709551615", 100, 0, true, 0, 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool partial = true;
        uint64_t first = 7, len = 7;
        err[0] = 0;
        int rc = download_range_parse(cases[i].h, cases[i].size, &partial, &first, &len, err, sizeof err);
        CHECK(rc == cases[i].rc, "range '%s' of %" PRIu64 ": rc %d, want %d (%s)", cases[i].h ? cases[i].h : "(null)",
              cases[i].size, rc, cases[i].rc, err);
        if (rc == 0 && cases[i].rc == 0)
            CHECK(partial == cases[i].partial && first == cases[i].first && len == cases[i].len,
                  "range '%s': partial %d first %" PRIu64 " len %" PRIu64 ", want %d %" PRIu64 " %" PRIu64,
                  cases[i].h ? cases[i].h : "(null)", partial, first, len, cases[i].partial, cases[i].first,
                  cases[i].len);
        if (rc)
            CHECK(err[0] != 0, "range '%s': no reason", cases[i].h);
    }
}

/* ---- tokens ---- */

static void test_auth(void)
{
    char tok[DOWNLOAD_AUTH_MAX];
    int64_t now = 1700000000;
    const char *path = DOWNLOAD_ROUTE_PREFIX "m1";
    CHECK_EQ_INT(download_auth_token(SECRET, "node-a", path, now, tok), 0);
    CHECK(strlen(tok) == 10 + 1 + 64, "token '%s'", tok);
    CHECK_EQ_INT(download_auth_check(SECRET, "node-a", path, tok, now, err, sizeof err), 0);
    CHECK_EQ_INT(download_auth_check(SECRET, "node-a", path, tok, now + DOWNLOAD_AUTH_WINDOW_S, err, sizeof err), 0);
    CHECK_EQ_INT(download_auth_check(SECRET, "node-a", path, tok, now - DOWNLOAD_AUTH_WINDOW_S, err, sizeof err), 0);
    int rc = download_auth_check("other-secret", "node-a", path, tok, now, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "secret"), "wrong secret: %d %s", rc, err);
    rc = download_auth_check(SECRET, "node-a", path, tok, now + DOWNLOAD_AUTH_WINDOW_S + 1, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "stale"), "stale: %d %s", rc, err);
    rc = download_auth_check(SECRET, "node-a", path, tok, now - DOWNLOAD_AUTH_WINDOW_S - 1, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "stale"), "from the future: %d %s", rc, err);
    rc = download_auth_check(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m2", tok, now, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "wrong path accepted: %s", err);
    rc = download_auth_check(SECRET, "node-b", path, tok, now, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "wrong node accepted: %s", err);
    /* The time is inside the MAC: moving it breaks the token. */
    char moved[DOWNLOAD_AUTH_MAX];
    snprintf(moved, sizeof moved, "%" PRId64 "%s", now + 1, strchr(tok, ':'));
    rc = download_auth_check(SECRET, "node-a", path, moved, now, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "moved time accepted: %s", err);
    /* Each hex digit of the MAC matters. */
    char flipped[DOWNLOAD_AUTH_MAX];
    snprintf(flipped, sizeof flipped, "%s", tok);
    char *last = flipped + strlen(flipped) - 1;
    *last = *last == '0' ? '1' : '0';
    CHECK(download_auth_check(SECRET, "node-a", path, flipped, now, err, sizeof err) == CAIRN_EINVAL, "flipped");
    static const char *const bad[] = {"", "123", "123:", ":abc", "12a:00", "1700000000:zz", "-5:00", NULL};
    for (size_t i = 0; bad[i]; i++) {
        rc = download_auth_check(SECRET, "node-a", path, bad[i], now, err, sizeof err);
        CHECK(rc == CAIRN_EINVAL && err[0], "malformed token '%s' accepted", bad[i]);
    }
    CHECK(download_auth_check(SECRET, "node-a", path, NULL, now, err, sizeof err) == CAIRN_EINVAL, "no token");
    char none[DOWNLOAD_AUTH_MAX];
    CHECK(download_auth_token("", "node-a", path, now, none) == CAIRN_EINVAL && !none[0], "empty secret made a token");
    CHECK(download_auth_token(NULL, "node-a", path, now, none) == CAIRN_EINVAL, "no secret made a token");
    CHECK(download_auth_token(SECRET, "", path, now, none) == CAIRN_EINVAL, "no node made a token");
    CHECK(download_auth_check(NULL, "node-a", path, tok, now, err, sizeof err) == CAIRN_EINVAL, "checked w/o secret");
    /* Two tokens of different times differ. */
    char tok2[DOWNLOAD_AUTH_MAX];
    download_auth_token(SECRET, "node-a", path, now + 1, tok2);
    CHECK(strcmp(strchr(tok, ':'), strchr(tok2, ':')) != 0, "same MAC for two times");
}

/* ---- sealed bodies ---- */

/* Pieces at any offset and length match one keystream run from offset 0 (the reference),
 * and unsealing what was sealed gives the bytes back. */
static void test_seal(void)
{
    enum { N = 1000 };
    uint8_t key[DOWNLOAD_SEAL_KEY_BYTES], nonce[DOWNLOAD_NONCE_BYTES], plain[N], ref[N], buf[N];
    for (int i = 0; i < DOWNLOAD_NONCE_BYTES; i++)
        nonce[i] = (uint8_t)(7 * i + 1);
    CHECK_EQ_INT(download_seal_key(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", nonce, key), 0);
    uint64_t seed = 9;
    for (int i = 0; i < N; i++)
        plain[i] = (uint8_t)test_rand_u64(&seed);
    memset(ref, 0, sizeof ref);
    crypto_stream_xchacha20_xor(ref, ref, N, nonce, key); /* the keystream, bytes 0..N-1 */
    static const size_t offs[] = {0, 1, 2, 63, 64, 65, 100, 127, 128, 129, 191, 500, 936, 999};
    static const size_t lens[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 200, 1000};
    int bad = 0;
    for (size_t a = 0; a < sizeof offs / sizeof offs[0]; a++)
        for (size_t b = 0; b < sizeof lens / sizeof lens[0]; b++) {
            size_t off = offs[a], len = lens[b] < N - off ? lens[b] : N - off;
            memcpy(buf, plain + off, len);
            download_seal_xor(buf, len, off, nonce, key);
            for (size_t i = 0; i < len; i++)
                if (buf[i] != (plain[off + i] ^ ref[off + i])) {
                    if (bad++ < 5)
                        fprintf(stderr, "piece at %zu of %zu bytes: byte %zu is %02x, want %02x\n", off, len, i,
                                buf[i], plain[off + i] ^ ref[off + i]);
                    break;
                }
            download_seal_xor(buf, len, off, nonce, key);
            if (memcmp(buf, plain + off, len) && bad++ < 5)
                fprintf(stderr, "piece at %zu of %zu bytes: not unsealed back\n", off, len);
        }
    CHECK(bad == 0, "%d pieces differ from the reference keystream", bad);
    /* A whole file sealed in pieces of odd sizes is the reference; a zero length
     * touches nothing (nor does a NULL buffer). */
    memcpy(buf, plain, N);
    for (size_t off = 0, step = 1; off < N; off += step, step = step * 3 % 97 + 1)
        download_seal_xor(buf + off, step < N - off ? step : N - off, off, nonce, key);
    bool same = true;
    for (int i = 0; i < N; i++)
        same = same && buf[i] == (plain[i] ^ ref[i]);
    CHECK(same, "pieces of odd sizes differ from one run");
    download_seal_xor(NULL, 0, 77, nonce, key);
    /* Offsets far into a file: the block counter goes past 32 bits. */
    uint64_t far = ((uint64_t)1 << 40) + 3;
    uint8_t two[130], one[130];
    memset(two, 0, sizeof two);
    memset(one, 0, sizeof one);
    download_seal_xor(two, 61, far, nonce, key);
    download_seal_xor(two + 61, sizeof two - 61, far + 61, nonce, key);
    download_seal_xor(one, sizeof one, far, nonce, key);
    CHECK(!memcmp(one, two, sizeof one) && memcmp(one, ref, sizeof one), "far offset");

    /* The key depends on each field; the same fields give the same key. */
    uint8_t k2[DOWNLOAD_SEAL_KEY_BYTES], n2[DOWNLOAD_NONCE_BYTES];
    memcpy(n2, nonce, sizeof n2);
    download_seal_key(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", n2, k2);
    CHECK(!memcmp(key, k2, sizeof key), "same fields, another key");
    n2[23] ^= 1;
    download_seal_key(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", n2, k2);
    CHECK(memcmp(key, k2, sizeof key), "another nonce, same key");
    download_seal_key("other-secret", "node-a", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", nonce, k2);
    CHECK(memcmp(key, k2, sizeof key), "another secret, same key");
    download_seal_key(SECRET, "node-b", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", nonce, k2);
    CHECK(memcmp(key, k2, sizeof key), "another node, same key");
    download_seal_key(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m2", "ab12", nonce, k2);
    CHECK(memcmp(key, k2, sizeof key), "another file, same key");
    download_seal_key(SECRET, "node-a", DOWNLOAD_ROUTE_PREFIX "m1", "ab13", nonce, k2);
    CHECK(memcmp(key, k2, sizeof key), "another hash, same key");
    download_seal_key(SECRET, "node-a|", DOWNLOAD_ROUTE_PREFIX "m1", "ab12", nonce, k2);
    CHECK(memcmp(key, k2, sizeof key), "fields moved across a boundary, same key");
    CHECK_EQ_INT(download_seal_key("", "node-a", "/r", "ab", nonce, k2), CAIRN_EINVAL);
    CHECK_EQ_INT(download_seal_key(SECRET, NULL, "/r", "ab", nonce, k2), CAIRN_EINVAL);
    CHECK_EQ_INT(download_seal_key(SECRET, "node-a", "", "ab", nonce, k2), CAIRN_EINVAL);
    CHECK_EQ_INT(download_seal_key(SECRET, "node-a", "/r", NULL, nonce, k2), CAIRN_EINVAL);

    /* Nonces: exactly 48 hex digits. */
    char hex[DOWNLOAD_NONCE_HEX];
    sodium_bin2hex(hex, sizeof hex, nonce, sizeof nonce);
    CHECK(download_nonce_parse(hex, n2) == 0 && !memcmp(n2, nonce, sizeof n2), "nonce '%s'", hex);
    char bad_nonce[64];
    static const char *const wrong[] = {"", "00", "0123456789abcdef0123456789abcdef0123456789abcde",
                                        "0123456789abcdef0123456789abcdef0123456789abcdef0",
                                        "0123456789abcdef0123456789abcdef0123456789abcdeg", NULL};
    for (size_t i = 0; wrong[i]; i++)
        CHECK(download_nonce_parse(wrong[i], n2) == CAIRN_EINVAL, "nonce '%s' accepted", wrong[i]);
    snprintf(bad_nonce, sizeof bad_nonce, "%.47s ", hex);
    CHECK(download_nonce_parse(bad_nonce, n2) == CAIRN_EINVAL, "nonce '%s' accepted", bad_nonce);
    CHECK(download_nonce_parse(NULL, n2) == CAIRN_EINVAL, "no nonce accepted");
}

/* ---- paths and sources ---- */

static void test_paths(void)
{
    char a[256], b[256];
    CHECK_EQ_INT(download_paths("/m", "llama-3.2:1b", a, b, sizeof a), 0);
    CHECK(!strcmp(a, "/m/llama-3.2:1b.gguf") && !strcmp(b, "/m/.llama-3.2:1b.gguf.partial"), "%s %s", a, b);
    CHECK_EQ_INT(download_paths("/m", "org/model", a, b, sizeof a), CAIRN_EINVAL);
    /* a pulled model's id: its file has the pull's name (hubref_local_name) */
    CHECK_EQ_INT(download_paths("/m", "hf.co/org/model:Q8_0", a, b, sizeof a), 0);
    CHECK(!strcmp(a, "/m/hf.co~org~model:Q8_0.gguf") && !strcmp(b, "/m/.hf.co~org~model:Q8_0.gguf.partial"), "%s %s", a,
          b);
    CHECK_EQ_INT(download_paths("/m", "hf.co/org/model:q8_0", a, b, sizeof a), CAIRN_EINVAL); /* not canonical */
    CHECK_EQ_INT(download_paths("/m", "hf.co/org/../x.gguf", a, b, sizeof a), CAIRN_EINVAL);
    CHECK_EQ_INT(download_paths("/m", ".hidden", a, b, sizeof a), CAIRN_EINVAL);
    CHECK_EQ_INT(download_paths("/m", "", a, b, sizeof a), CAIRN_EINVAL);
    CHECK_EQ_INT(download_paths("/m", "a b", a, b, sizeof a), CAIRN_EINVAL);
    CHECK_EQ_INT(download_paths("/m", "m", a, b, 8), CAIRN_ERANGE);
    CHECK_EQ_INT(download_disk_check(root, 1, err, sizeof err), 0);
    int rc = download_disk_check(root, (uint64_t)1 << 62, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "not enough disk"), "huge need: %d %s", rc, err);
    /* The headroom: a file that fits but would leave less than it free is refused. */
    struct statvfs sv;
    if (statvfs(root, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize > 4 * DOWNLOAD_DISK_HEADROOM) {
        uint64_t free_now = (uint64_t)sv.f_bavail * sv.f_frsize;
        rc = download_disk_check(root, free_now - DOWNLOAD_DISK_HEADROOM / 2, err, sizeof err);
        CHECK(rc == CAIRN_EFULL && strstr(err, "kept free"), "a file eating the headroom: %d %s", rc, err);
        CHECK_EQ_INT(download_disk_check(root, free_now - 2 * DOWNLOAD_DISK_HEADROOM, err, sizeof err), 0);
    }
    CHECK_EQ_INT(download_disk_check("/nonexistent/cairn", 1, err, sizeof err), CAIRN_EIO);
}

static const char *node_json(const char *id, int api_port, const char *ifaces)
{
    static char buf[8][2048];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0],
             "\"%s\": {\"node_id\": \"%s\", \"last_seen_ms\": 1, \"info\": {\"memory_total_bytes\": 1,"
             " \"memory_available_bytes\": 1, \"disk_free_bytes\": 1, \"disk_total_bytes\": 1, \"cpu_model\": \"c\","
             " \"cpu_cores\": 1, \"isa\": \"\", \"os\": \"linux\", \"hostname\": \"h\", \"interfaces\": [%s],"
             " \"api_port\": %d, \"cluster_port\": 9}}",
             id, id, ifaces, api_port);
    return b;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Partial files untouched for longer than the limit go at start; fresh ones (to resume)
 * and other files stay. */
static void test_clean_partials(void)
{
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/clean", root);
    mkdir(dir, 0755);
    const char *names[] = {".old.gguf.partial", ".fresh.gguf.partial", "old.gguf", ".old-but-not.partial"};
    int64_t now = (int64_t)time(NULL);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        CHECK(f && fputs("x", f) >= 0, "wrote %s", path);
        if (f)
            fclose(f);
        if (i != 1) { /* all but the fresh one: last changed 8 days ago */
            struct timespec t[2] = {{.tv_sec = now - 8 * 86400}, {.tv_sec = now - 8 * 86400}};
            CHECK(utimensat(AT_FDCWD, path, t, 0) == 0, "aged %s", path);
        }
    }
    CHECK_EQ_INT(download_clean_partials(dir, DOWNLOAD_PARTIAL_MAX_AGE_S, now), 1);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        CHECK(exists(path) == (i != 0), "%s %s", names[i], i ? "stays" : "is deleted");
    }
    CHECK_EQ_INT(download_clean_partials(dir, DOWNLOAD_PARTIAL_MAX_AGE_S, now + 2 * DOWNLOAD_PARTIAL_MAX_AGE_S), 1);
    CHECK_EQ_INT(download_clean_partials("/nonexistent/cairn", DOWNLOAD_PARTIAL_MAX_AGE_S, now), 0);
}

static void test_sources(void)
{
    const char *lo = "{\"name\": \"lo\", \"loopback\": true, \"addresses\": [\"127.0.0.1\", \"::1\"]}";
    const char *eth = "{\"name\": \"eth0\", \"loopback\": false, \"addresses\": [\"10.0.0.2\", \"2001:db8::2\","
                      " \"fe80::1\"]}";
    char ifs[1024], text[8192];
    snprintf(ifs, sizeof ifs, "%s, %s", lo, eth);
    snprintf(text, sizeof text,
             "{\"last_applied\": {\"term\": 1, \"index\": 5}, \"master\": {\"node_id\": \"n-master\", \"term\": 1},"
             " \"nodes\": {%s, %s, %s, %s, %s}, \"edges\": [], \"instances\": {}, \"runners\": {}, \"tasks\": {},"
             " \"downloads\": [{\"node_id\": \"n-has\", \"model_id\": \"m1\", \"bytes_done\": 5, \"bytes_total\": 5,"
             " \"status\": \"Completed\", \"error\": null}, {\"node_id\": \"n-half\", \"model_id\": \"m1\","
             " \"bytes_done\": 2, \"bytes_total\": 5, \"status\": \"Ongoing\", \"error\": null}]}",
             node_json("n-half", 7002, ifs), node_json("n-has", 7001, lo), node_json("n-master", 7000, ifs),
             node_json("n-noapi", 0, ifs), node_json("n-self", 7003, ifs));
    struct cluster_state *s = NULL;
    int rc = cluster_state_from_json(text, strlen(text), &s, err, sizeof err);
    CHECK(rc == 0, "state: %s", err);
    if (rc)
        return;
    struct download_source src[8];
    size_t n = download_sources(s, "n-self", "m1", src, 8);
    CHECK(n == 3, "%zu sources", n);
    if (n == 3) {
        CHECK(!strcmp(src[0].node_id, "n-master") && !strcmp(src[1].node_id, "n-has") &&
                  !strcmp(src[2].node_id, "n-half"),
              "order %s %s %s", src[0].node_id, src[1].node_id, src[2].node_id);
        CHECK(src[0].n_urls == 4, "master urls: %zu", src[0].n_urls);
        if (src[0].n_urls == 4)
            CHECK(!strcmp(src[0].urls[0], "http://10.0.0.2:7000") && !strcmp(src[0].urls[1], "http://[2001:db8::2]:7000") &&
                      !strcmp(src[0].urls[2], "http://127.0.0.1:7000") && !strcmp(src[0].urls[3], "http://[::1]:7000"),
                  "urls %s %s %s %s", src[0].urls[0], src[0].urls[1], src[0].urls[2], src[0].urls[3]);
        CHECK(src[1].n_urls == 2 && !strcmp(src[1].urls[0], "http://127.0.0.1:7001"), "n-has urls %zu %s",
              src[1].n_urls, src[1].urls[0]);
    }
    /* Another model: no Completed download, so the master, then the others. */
    n = download_sources(s, "n-self", "m2", src, 8);
    CHECK(n == 3 && !strcmp(src[0].node_id, "n-master") && !strcmp(src[1].node_id, "n-half"), "m2: %zu", n);
    CHECK(download_sources(s, "n-self", "m1", src, 1) == 1, "max not kept");
    /* The master asking: never itself. */
    n = download_sources(s, "n-master", "m1", src, 8);
    CHECK(n == 3 && !strcmp(src[0].node_id, "n-has"), "from the master: %zu %s", n, n ? src[0].node_id : "");
    cluster_state_release(s);
}

/* ---- reports: the master turns a node's downloads into NodeDownloadProgress ---- */

static size_t report_events(struct cluster_state *s, const char *from, const char *text, int *rc_out,
                            struct master_events *evs)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    CHECK(j != NULL, "report JSON: %s", je.text);
    memset(evs, 0, sizeof *evs);
    *rc_out = master_report_events(s, from, j, 1000, evs, err, sizeof err);
    json_decref(j);
    return evs->n;
}

static void test_report(void)
{
    struct cluster_state *s = cluster_state_create();
    s->last_term = 1; /* as if a term had started */
    struct master_events evs;
    int rc;
    const char *rep = "{\"node_id\": \"n1\", \"info\": null, \"runners\": null, \"edges\": null, \"downloads\":"
                      " [{\"node_id\": \"n1\", \"model_id\": \"m1\", \"bytes_done\": 10, \"bytes_total\": 100,"
                      " \"status\": \"Ongoing\", \"error\": null}]}";
    size_t n = report_events(s, "n1", rep, &rc, &evs);
    CHECK(rc == 0 && n == 1 && evs.ev[0].kind == EVENT_NODE_DOWNLOAD_PROGRESS &&
              evs.ev[0].node_download_progress.bytes_done == 10 &&
              !strcmp(evs.ev[0].node_download_progress.model_id, "m1"),
          "first report: rc %d, %zu events (%s)", rc, n, err);
    if (rc == 0 && n == 1) {
        evs.ev[0].term = 1;
        evs.ev[0].index = 1;
        CHECK(cluster_apply(s, &evs.ev[0], err, sizeof err) == 0, "apply: %s", err);
    }
    master_events_clear(&evs);
    CHECK(cluster_state_find_download(s, "n1", "m1") != NULL, "download not in the state");
    n = report_events(s, "n1", rep, &rc, &evs);
    CHECK(rc == 0 && n == 0, "same report again: rc %d, %zu events", rc, n);
    master_events_clear(&evs);
    /* Progress, then a refusal of anything that is not the sender's own or not valid. */
    const char *more = "{\"node_id\": \"n1\", \"downloads\": [{\"node_id\": \"n1\", \"model_id\": \"m1\","
                       " \"bytes_done\": 100, \"bytes_total\": 100, \"status\": \"Completed\", \"error\": null}]}";
    n = report_events(s, "n1", more, &rc, &evs);
    CHECK(rc == 0 && n == 1 && evs.ev[0].node_download_progress.status == CLUSTER_DOWNLOAD_COMPLETED,
          "progress: rc %d, %zu events", rc, n);
    master_events_clear(&evs);
    static const char *const bad[] = {
        "{\"node_id\": \"n1\", \"downloads\": [{\"node_id\": \"n2\", \"model_id\": \"m1\", \"bytes_done\": 1,"
        " \"bytes_total\": 1, \"status\": \"Completed\", \"error\": null}]}",
        "{\"node_id\": \"n1\", \"downloads\": [{\"node_id\": \"n1\", \"model_id\": \"m1\", \"bytes_done\": 2,"
        " \"bytes_total\": 1, \"status\": \"Ongoing\", \"error\": null}]}",
        "{\"node_id\": \"n1\", \"downloads\": [{\"node_id\": \"n1\", \"model_id\": \"m1\", \"bytes_done\": 1,"
        " \"bytes_total\": 1, \"status\": \"Done\", \"error\": null}]}",
        "{\"node_id\": \"n1\", \"downloads\": {}}",
        NULL,
    };
    for (size_t i = 0; bad[i]; i++) {
        n = report_events(s, "n1", bad[i], &rc, &evs);
        CHECK(rc == CAIRN_EFORMAT && n == 0 && strstr(err, "downloads"), "bad report %zu: rc %d, %zu events, %s", i,
              rc, n, err);
        master_events_clear(&evs);
    }
    cluster_state_release(s);
}

/* ---- a small HTTP server ---- */

struct srv {
    int fd, port;
    pthread_t thread;
    volatile bool stop;
    unsigned char *data;
    size_t size;
    char sha[65];
    const char *node_id;  /* X-Cairn-Node of replies */
    const char *secret;   /* checks requests and signs replies; NULL: open */
    const char *sign_secret; /* signs replies with this one instead (NULL: secret) */
    /* knobs */
    int cut_gets;         /* this many GETs are cut after cut_bytes of body */
    size_t cut_bytes;
    bool lie_sha;         /* advertise a wrong hash */
    uint64_t lie_size;    /* HEAD advertises this size (0: the real one) */
    int slow_ms;          /* per 8 KiB chunk of body */
    bool ignore_range;    /* answers 200 to a Range */
    bool plain;           /* with a secret: sends the body in clear all the same */
    int64_t flip_at;      /* flips the sent byte of the file at this offset once (-1: never) */
    /* what it saw */
    pthread_mutex_t mu;
    int heads, gets, unauthorized, nonces, no_nonce;
    long long ranges[16]; /* start of each GET's range, -1 for none */
};

static bool send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

static const char *header_of(const char *req, const char *name, char *out, size_t n)
{
    const char *p = req;
    size_t len = strlen(name);
    while ((p = strstr(p, "\r\n"))) {
        p += 2;
        if (!strncasecmp(p, name, len) && p[len] == ':') {
            const char *v = p + len + 1;
            while (*v == ' ')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t l = e ? (size_t)(e - v) : strlen(v);
            if (l >= n)
                l = n - 1;
            memcpy(out, v, l);
            out[l] = 0;
            return out;
        }
    }
    return NULL;
}

static void reply_status(int c, int status, const char *msg)
{
    char h[256];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status, msg);
    send_all(c, h, (size_t)n);
}

static void handle(struct srv *s, int c)
{
    char req[8192];
    size_t len = 0;
    while (len < sizeof req - 1) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0)
            return;
        ssize_t r = recv(c, req + len, sizeof req - 1 - len, 0);
        if (r <= 0)
            return;
        len += (size_t)r;
        req[len] = 0;
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    bool head = !strncmp(req, "HEAD ", 5);
    char path[512] = "", v[512], range_h[128], why[512];
    sscanf(req, "%*s %511s", path);
    const char *route = strstr(path, DOWNLOAD_ROUTE_PREFIX);
    char who[128] = "";
    if (s->secret) {
        header_of(req, "X-Cairn-Node", who, sizeof who);
        const char *tok = header_of(req, "X-Cairn-Auth", v, sizeof v);
        if (!route || download_auth_check(s->secret, who, route, tok, (int64_t)time(NULL), why, sizeof why)) {
            pthread_mutex_lock(&s->mu);
            s->unauthorized++;
            pthread_mutex_unlock(&s->mu);
            reply_status(c, 401, "Unauthorized");
            return;
        }
    }
    const char *sha = s->lie_sha ? "0000000000000000000000000000000000000000000000000000000000000000" : s->sha;
    uint64_t first = 0, n = s->size;
    bool partial = false;
    const char *rh = s->ignore_range ? NULL : header_of(req, "Range", range_h, sizeof range_h);
    char etag[80];
    snprintf(etag, sizeof etag, "\"%s\"", sha);
    if (rh && header_of(req, "If-Range", v, sizeof v) && strcmp(v, etag))
        rh = NULL;
    if (download_range_parse(rh, s->size, &partial, &first, &n, why, sizeof why)) {
        reply_status(c, 416, "Range Not Satisfiable");
        return;
    }
    /* A sealed cluster's GET names its nonce, and its body goes sealed with it. */
    uint8_t nonce[DOWNLOAD_NONCE_BYTES], key[DOWNLOAD_SEAL_KEY_BYTES];
    bool has_nonce = !download_nonce_parse(header_of(req, "X-Cairn-Nonce", v, sizeof v), nonce);
    bool seal = s->secret && !head && !s->plain;
    if (s->secret && !head && !has_nonce) {
        pthread_mutex_lock(&s->mu);
        s->no_nonce++;
        pthread_mutex_unlock(&s->mu);
        reply_status(c, 400, "Bad Request");
        return;
    }
    if (seal)
        download_seal_key(s->secret, who, route, sha, nonce, key);
    pthread_mutex_lock(&s->mu);
    s->nonces += has_nonce;
    bool cut = false;
    if (head)
        s->heads++;
    else {
        if (s->gets < 16)
            s->ranges[s->gets] = partial ? (long long)first : -1;
        s->gets++;
        if (s->cut_gets > 0) {
            s->cut_gets--;
            cut = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    char h[1024], auth[DOWNLOAD_AUTH_MAX] = "", cr[128] = "";
    const char *signer = s->sign_secret ? s->sign_secret : s->secret;
    if (signer) {
        char what[600];
        snprintf(what, sizeof what, "%s|%s", route, sha);
        download_auth_token(signer, s->node_id, what, (int64_t)time(NULL), auth);
    }
    if (partial)
        snprintf(cr, sizeof cr, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%zu\r\n", first, first + n - 1, s->size);
    uint64_t advertised = head && s->lie_size ? s->lie_size : n;
    int hl = snprintf(h, sizeof h,
                      "HTTP/1.1 %d %s\r\nContent-Length: %" PRIu64 "\r\nX-Cairn-Sha256: %s\r\nETag: %s\r\n"
                      "X-Cairn-Node: %s\r\n%s%s%s%s%sConnection: close\r\n\r\n",
                      partial ? 206 : 200, partial ? "Partial Content" : "OK", advertised, sha, etag, s->node_id,
                      auth[0] ? "X-Cairn-Auth: " : "", auth, auth[0] ? "\r\n" : "", cr,
                      seal ? "X-Cairn-Sealed: " DOWNLOAD_SEALED "\r\n" : "");
    if (!send_all(c, h, (size_t)hl) || head)
        return;
    uint64_t stop_at = cut && s->cut_bytes < n ? s->cut_bytes : n;
    unsigned char piece[8192];
    for (uint64_t off = 0; off < stop_at && !s->stop;) {
        size_t chunk = stop_at - off < 8192 ? (size_t)(stop_at - off) : 8192;
        memcpy(piece, s->data + first + off, chunk);
        if (seal)
            download_seal_xor(piece, chunk, first + off, nonce, key);
        if (s->flip_at >= 0 && (uint64_t)s->flip_at >= first + off && (uint64_t)s->flip_at < first + off + chunk) {
            piece[s->flip_at - (int64_t)(first + off)] ^= 0x20; /* a bit changed on the wire */
            s->flip_at = -1;
        }
        if (!send_all(c, piece, chunk))
            return;
        off += chunk;
        if (s->slow_ms)
            sleep_ms(s->slow_ms);
    }
}

static void *srv_main(void *arg)
{
    struct srv *s = arg;
    while (!s->stop) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            continue;
        handle(s, c);
        shutdown(c, SHUT_RDWR);
        close(c);
    }
    return NULL;
}

static bool srv_start(struct srv *s, const unsigned char *data, size_t size, const char *sha)
{
    memset(s, 0, sizeof *s);
    s->data = (unsigned char *)data;
    s->size = size;
    snprintf(s->sha, sizeof s->sha, "%s", sha);
    s->node_id = "src-node";
    s->flip_at = -1;
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 16) ||
        getsockname(s->fd, (struct sockaddr *)&a, &al))
        return false;
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, srv_main, s) == 0;
}

static void srv_stop(struct srv *s)
{
    s->stop = true;
    pthread_join(s->thread, NULL);
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
}

/* ---- fetches ---- */

static unsigned char *data;
static char data_sha[65];

struct seen {
    int calls, ongoing, completed, failed;
    int64_t last_done, total;
    bool monotonic, bounded;
    char error[1024];
};

static void on_progress(void *ctx, const struct cluster_download *d)
{
    struct seen *s = ctx;
    s->calls++;
    if (d->status == CLUSTER_DOWNLOAD_ONGOING)
        s->ongoing++;
    if (d->status == CLUSTER_DOWNLOAD_COMPLETED)
        s->completed++;
    if (d->status == CLUSTER_DOWNLOAD_FAILED) {
        s->failed++;
        snprintf(s->error, sizeof s->error, "%s", d->error ? d->error : "");
    }
    if (d->bytes_done > d->bytes_total)
        s->bounded = false;
    if (d->status == CLUSTER_DOWNLOAD_ONGOING && d->bytes_done < s->last_done && d->bytes_done != 0)
        s->monotonic = false;
    s->last_done = d->bytes_done;
    s->total = d->bytes_total;
}

static void source_of(struct download_source *src, const struct srv *s, const char *node)
{
    memset(src, 0, sizeof *src);
    snprintf(src->node_id, sizeof src->node_id, "%s", node);
    snprintf(src->urls[0], sizeof src->urls[0], "http://127.0.0.1:%d", s->port);
    src->n_urls = 1;
}

static bool same_as_data(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    unsigned char *buf = malloc(FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, FILE_BYTES + 1, f) : 0;
    fclose(f);
    bool same = n == FILE_BYTES && !memcmp(buf, data, FILE_BYTES);
    free(buf);
    return same;
}


static void paths_of(const char *dir, const char *model, char *fin, char *part)
{
    download_paths(dir, model, fin, part, 512);
}

static void test_fetch(void)
{
    char dir[300], fin[512], part[512];
    snprintf(dir, sizeof dir, "%s/models", root); /* made by the fetch */
    struct srv s;
    CHECK(srv_start(&s, data, FILE_BYTES, data_sha), "server");
    s.secret = SECRET;
    struct download_source src[2];
    /* A first address that refuses connections: the next one serves. */
    source_of(&src[0], &s, "src-node");
    memmove(src[0].urls[1], src[0].urls[0], sizeof src[0].urls[0]);
    snprintf(src[0].urls[0], sizeof src[0].urls[0], "http://127.0.0.1:1");
    src[0].n_urls = 2;
    struct download_config cfg = {.models_dir = dir, .node_id = "me", .secret = SECRET, .backoff_ms = 20};

    /* Whole file, with progress. */
    struct seen seen = {.monotonic = true, .bounded = true};
    int rc = download_fetch(&cfg, "whole", src, 1, on_progress, &seen, NULL, err, sizeof err);
    paths_of(dir, "whole", fin, part);
    CHECK(rc == 0, "whole: %d %s", rc, err);
    CHECK(same_as_data(fin), "whole: the file differs");
    CHECK(!exists(part), "whole: the partial file stayed");
    CHECK(seen.ongoing >= 1 && seen.completed == 1 && seen.failed == 0 && seen.monotonic && seen.bounded,
          "whole: progress ongoing %d completed %d failed %d", seen.ongoing, seen.completed, seen.failed);
    CHECK(seen.last_done == FILE_BYTES && seen.total == FILE_BYTES, "whole: last %" PRId64 "/%" PRId64,
          seen.last_done, seen.total);
    CHECK(s.gets == 1 && s.ranges[0] == -1 && s.unauthorized == 0, "whole: %d GETs, range %lld, %d refused", s.gets,
          s.ranges[0], s.unauthorized);
    CHECK(s.nonces == 1 && s.no_nonce == 0, "whole: %d GETs with a nonce, %d without", s.nonces, s.no_nonce);
    /* The final file exists now: a second fetch refuses. */
    rc = download_fetch(&cfg, "whole", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_ESTATE, "second fetch of a file in place: %d %s", rc, err);

    /* Cut twice mid-way: resumed from where each cut left off, then whole. */
    s.gets = 0;
    s.cut_gets = 2;
    s.cut_bytes = 100000;
    memset(&seen, 0, sizeof seen);
    seen.monotonic = seen.bounded = true;
    rc = download_fetch(&cfg, "cut", src, 1, on_progress, &seen, NULL, err, sizeof err);
    paths_of(dir, "cut", fin, part);
    CHECK(rc == 0, "cut: %d %s", rc, err);
    CHECK(same_as_data(fin), "cut: the file differs");
    CHECK(s.gets == 3, "cut: %d GETs", s.gets);
    CHECK(s.ranges[0] == -1 && s.ranges[1] == 100000 && s.ranges[2] == 200000, "cut: ranges %lld %lld %lld",
          s.ranges[0], s.ranges[1], s.ranges[2]);
    CHECK(seen.completed == 1 && seen.monotonic && seen.bounded, "cut: progress");

    /* A partial left by an earlier run: the first GET resumes from its size. */
    paths_of(dir, "restart", fin, part);
    FILE *f = fopen(part, "wb");
    CHECK(f && fwrite(data, 1, 123457, f) == 123457, "partial written");
    if (f)
        fclose(f);
    s.gets = 0;
    rc = download_fetch(&cfg, "restart", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && same_as_data(fin), "restart: %d %s", rc, err);
    CHECK(s.gets == 1 && s.ranges[0] == 123457, "restart: %d GETs from %lld", s.gets, s.ranges[0]);

    /* A bit changed on the wire: the bytes unseal to something else, the hash check at
     * the end refuses them and deletes the partial; the next fetch starts from zero. */
    s.flip_at = 200001;
    s.gets = 0;
    rc = download_fetch(&cfg, "tampered", src, 1, NULL, NULL, NULL, err, sizeof err);
    paths_of(dir, "tampered", fin, part);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "SHA-256"), "tampered: %d %s", rc, err);
    CHECK(!exists(fin) && !exists(part) && s.flip_at == -1, "tampered: a file stayed");
    rc = download_fetch(&cfg, "tampered", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && same_as_data(fin), "after tampering: %d %s", rc, err);
    CHECK(s.gets == 2 && s.ranges[1] == -1, "after tampering: %d GETs, the second from %lld", s.gets, s.ranges[1]);

    /* A source that sends a sealed cluster's file in clear is refused before a byte is
     * written. */
    s.plain = true;
    s.gets = 0;
    struct download_config once = cfg;
    once.max_attempts = 1;
    rc = download_fetch(&once, "clear", src, 1, NULL, NULL, NULL, err, sizeof err);
    paths_of(dir, "clear", fin, part);
    struct stat pst;
    CHECK(rc == CAIRN_EIO && strstr(err, "not sealed"), "clear reply: %d %s", rc, err);
    CHECK(s.gets == 1 && !exists(fin) && (!exists(part) || (stat(part, &pst) == 0 && pst.st_size == 0)),
          "clear reply: %d GETs, a file written", s.gets);
    s.plain = false;

    /* A source that ignores the range sends it whole: the partial starts again. */
    paths_of(dir, "norange", fin, part);
    f = fopen(part, "wb");
    if (f) {
        fwrite("garbage", 1, 7, f);
        fclose(f);
    }
    s.ignore_range = true;
    rc = download_fetch(&cfg, "norange", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && same_as_data(fin), "ignored range: %d %s", rc, err);
    s.ignore_range = false;

    /* A hash that does not match: refused, the partial deleted. */
    s.lie_sha = true;
    memset(&seen, 0, sizeof seen);
    rc = download_fetch(&cfg, "liar", src, 1, on_progress, &seen, NULL, err, sizeof err);
    paths_of(dir, "liar", fin, part);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "SHA-256"), "hash mismatch: %d %s", rc, err);
    CHECK(!exists(fin) && !exists(part), "hash mismatch left a file");
    CHECK(seen.failed == 1 && strstr(seen.error, "SHA-256"), "hash mismatch: failed %d '%s'", seen.failed, seen.error);
    s.lie_sha = false;

    /* Larger than the disk: refused before a byte is written. */
    s.lie_size = (uint64_t)1 << 50;
    s.gets = 0;
    rc = download_fetch(&cfg, "huge", src, 1, NULL, NULL, NULL, err, sizeof err);
    paths_of(dir, "huge", fin, part);
    CHECK(rc == CAIRN_EFULL && strstr(err, "not enough disk"), "huge: %d %s", rc, err);
    CHECK(s.gets == 0 && !exists(part) && !exists(fin), "huge: %d GETs", s.gets);
    s.lie_size = 0;

    /* A requester without the secret is refused (401 each attempt); so is a source that
     * cannot prove it, and a source that is another node. */
    struct download_config wrong = cfg;
    wrong.secret = "not-the-secret";
    wrong.max_attempts = 2;
    s.unauthorized = 0;
    rc = download_fetch(&wrong, "nope", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "401"), "wrong secret: %d %s", rc, err);
    CHECK(s.unauthorized == 2, "wrong secret: %d refusals", s.unauthorized);
    struct download_config none = cfg;
    none.secret = NULL;
    none.max_attempts = 1;
    rc = download_fetch(&none, "nope", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "401"), "no secret: %d %s", rc, err);
    s.sign_secret = "forged";
    struct download_config one = cfg;
    one.max_attempts = 1;
    rc = download_fetch(&one, "forged", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "X-Cairn-Auth"), "forged reply: %d %s", rc, err);
    s.sign_secret = NULL;
    struct download_source other;
    source_of(&other, &s, "another-node");
    rc = download_fetch(&one, "other", &other, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "another-node"), "other node: %d %s", rc, err);
    /* Nothing to fetch from, or a bad id. */
    rc = download_fetch(&one, "empty", NULL, 0, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EIO, "no source: %d %s", rc, err);
    rc = download_fetch(&one, "../x", src, 1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL, "bad id: %d %s", rc, err);
    srv_stop(&s);
}

/* ---- the manager ---- */

static atomic_int changes;
static void on_changed(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&changes, 1);
}

static enum cluster_download_status wait_status(struct download_mgr *m, const char *model, int ms)
{
    struct cluster_download d;
    enum cluster_download_status st = CLUSTER_DOWNLOAD_PENDING;
    for (int t = 0; t < ms; t += 20) {
        if (!download_mgr_get(m, model, &d)) {
            st = d.status;
            cluster_download_clear(&d);
            if (st == CLUSTER_DOWNLOAD_COMPLETED || st == CLUSTER_DOWNLOAD_FAILED)
                return st;
        }
        sleep_ms(20);
    }
    return st;
}

static void test_mgr(void)
{
    char dir[300], fin[512], part[512];
    snprintf(dir, sizeof dir, "%s/mgr", root);
    struct srv s;
    CHECK(srv_start(&s, data, FILE_BYTES, data_sha), "server");
    struct download_source src;
    source_of(&src, &s, "src-node");
    struct download_config cfg = {.models_dir = dir, .node_id = "me", .backoff_ms = 20};
    struct download_mgr *m = NULL;
    int rc = download_mgr_create(&m, &cfg, on_changed, NULL, err, sizeof err);
    CHECK(rc == 0, "mgr: %s", err);
    if (rc) {
        srv_stop(&s);
        return;
    }
    struct cluster_download d;
    CHECK(download_mgr_get(m, "m1", &d) == CAIRN_ENOTFOUND, "status before any");
    CHECK(download_mgr_start(m, "m1", &src, 0, err, sizeof err) == CAIRN_ENOTFOUND, "no source accepted");
    CHECK(download_mgr_start(m, "a/b", &src, 1, err, sizeof err) == CAIRN_EINVAL, "bad id accepted");
    rc = download_mgr_start(m, "m1", &src, 1, err, sizeof err);
    CHECK(rc == 0, "start: %s", err);
    CHECK(download_mgr_start(m, "m1", &src, 1, err, sizeof err) == 0, "second start");
    CHECK(wait_status(m, "m1", 20000) == CLUSTER_DOWNLOAD_COMPLETED, "m1 not completed");
    paths_of(dir, "m1", fin, part);
    CHECK(same_as_data(fin), "m1: the file differs");
    CHECK(s.gets == 1, "m1: %d GETs (a second start must not fetch again)", s.gets);
    CHECK(s.nonces == 0, "an open cluster's download sent a nonce (%d)", s.nonces);
    CHECK(atomic_load(&changes) >= 2, "changes: %d", atomic_load(&changes));
    json_t *j = download_mgr_json(m);
    json_t *e = json_array_get(j, 0);
    CHECK(json_array_size(j) == 1 && !strcmp(json_string_value(json_object_get(e, "status")), "Completed") &&
              json_integer_value(json_object_get(e, "bytes_done")) == FILE_BYTES &&
              !strcmp(json_string_value(json_object_get(e, "node_id")), "me"),
          "json");
    json_decref(j);
    /* Completed and in place: starting again fetches nothing. */
    CHECK(download_mgr_start(m, "m1", &src, 1, err, sizeof err) == 0 && s.gets == 1, "restart of a done one");

    /* A failed one says why, and is not retried at once. */
    s.lie_sha = true;
    CHECK(download_mgr_start(m, "m2", &src, 1, err, sizeof err) == 0, "m2 start");
    CHECK(wait_status(m, "m2", 20000) == CLUSTER_DOWNLOAD_FAILED, "m2 did not fail");
    rc = download_mgr_start(m, "m2", &src, 1, err, sizeof err);
    CHECK(rc == CAIRN_ESTATE && strstr(err, "SHA-256"), "m2 again: %d %s", rc, err);
    s.lie_sha = false;

    /* Release during a slow fetch: returns promptly, the partial kept. */
    s.slow_ms = 100;
    CHECK(download_mgr_start(m, "slow", &src, 1, err, sizeof err) == 0, "slow start");
    paths_of(dir, "slow", fin, part);
    for (int t = 0; t < 5000 && !exists(part); t += 20)
        sleep_ms(20);
    sleep_ms(250);
    double t0 = clock_sec();
    download_mgr_release(m);
    double took = clock_sec() - t0;
    CHECK(took < 3, "release took %.2f s", took);
    struct stat st;
    CHECK(stat(part, &st) == 0 && st.st_size > 0 && st.st_size < FILE_BYTES, "slow: partial of %lld bytes kept",
          exists(part) ? (long long)st.st_size : -1LL);
    CHECK(!exists(fin), "slow: final file made");
    printf("release during a fetch: %.3f s\n", took);
    srv_stop(&s);
}

/* Downloads the manager does not run (pulls from the hub) are noted: a rate appears
 * once half a second of progress was seen, goes when the download ends, and a status
 * that no report could carry is dropped. */
static void test_note(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/note", root);
    struct download_config cfg = {.models_dir = dir, .node_id = "me"};
    struct download_mgr *m = NULL;
    CHECK(download_mgr_create(&m, &cfg, NULL, NULL, err, sizeof err) == 0, "mgr: %s", err);
    if (!m)
        return;
    struct cluster_download d = {.node_id = "me", .model_id = "hf.co/o/r:Q8_0", .status = CLUSTER_DOWNLOAD_ONGOING,
                                 .bytes_total = 100000000};
    download_mgr_note(m, &d);
    struct cluster_download got;
    CHECK(download_mgr_get(m, d.model_id, &got) == 0 && got.status == CLUSTER_DOWNLOAD_ONGOING &&
              got.bytes_per_s == 0, "noted, no rate yet");
    cluster_download_clear(&got);
    struct timespec ts = {0, 600 * 1000000L};
    nanosleep(&ts, NULL);
    d.bytes_done = 6000000;
    download_mgr_note(m, &d);
    CHECK(download_mgr_get(m, d.model_id, &got) == 0 && got.bytes_per_s > 0 && got.bytes_per_s <= 10000000,
          "a rate after 600 ms: %lld bytes/s (6 MB in at least 0.6 s)", (long long)got.bytes_per_s);
    cluster_download_clear(&got);
    d.bytes_done = d.bytes_total = 7; /* another file: its size is below what the first reached */
    d.status = CLUSTER_DOWNLOAD_COMPLETED;
    download_mgr_note(m, &d);
    CHECK(download_mgr_get(m, d.model_id, &got) == 0 && got.status == CLUSTER_DOWNLOAD_COMPLETED &&
              got.bytes_per_s == 0, "done: no rate");
    cluster_download_clear(&got);
    d.bytes_done = 9; /* more than the total: no report could carry it */
    download_mgr_note(m, &d);
    CHECK(download_mgr_get(m, d.model_id, &got) == 0 && got.bytes_done == 7, "a bad status is dropped");
    cluster_download_clear(&got);
    download_mgr_release(m);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_WARN);
    snprintf(root, sizeof root, "/tmp/cairn-test-download-%d", (int)getpid());
    mkdir(root, 0755);
    data = malloc(FILE_BYTES);
    uint64_t seed = 42;
    for (size_t i = 0; i < FILE_BYTES; i++)
        data[i] = (unsigned char)test_rand_u64(&seed);
    unsigned char h[32];
    crypto_hash_sha256(h, data, FILE_BYTES);
    sodium_bin2hex(data_sha, sizeof data_sha, h, sizeof h);

    RUN(test_range);
    RUN(test_auth);
    RUN(test_seal);
    RUN(test_paths);
    RUN(test_clean_partials);
    RUN(test_sources);
    RUN(test_report);
    RUN(test_fetch);
    RUN(test_mgr);
    RUN(test_note);

    free(data);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_main_end();
}
