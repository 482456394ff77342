/* Discovery: beacon encoding, strict validation and MAC without any network; the "off"
 * mode opens no socket; then real beacons, but only inside network namespaces this
 * test creates (ip netns + a veth pair, addresses of its own): the test runs itself
 * again inside them (--node / --garbage) and checks what each instance found.
 *
 * SAFETY: nothing here beacons on the machine's real interfaces. The main process only
 * creates "off" instances; the --node and --garbage modes refuse to run in the initial
 * network namespace. Namespaces are deleted at the end, and by a janitor process when
 * the test dies any other way. */
#define _GNU_SOURCE /* pipe2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "net/discovery.h"
#include "testutil.h"

#define SECRET "correct horse battery staple"
#define OTHER_SECRET "another cluster's secret"
#define NODE_INTERVAL_MS 250
#define NODE_MIN_MS 3000     /* every node listens at least this long (foreign beacons) */
#define NODE_MAX_MS 20000    /* and gives up after this long */
#define GARBAGE_MS 4000
#define CHILDREN_MAX_MS 45000

static struct discovery_beacon sample(void)
{
    struct discovery_beacon b = {.api_port = 52415, .cluster_port = 52416, .epoch = 1700000000123ull,
                                 .seq = 42};
    snprintf(b.node_id, sizeof b.node_id, "node-0123456789abcdef");
    snprintf(b.ns, sizeof b.ns, "lab");
    return b;
}

static bool same_beacon(const struct discovery_beacon *a, const struct discovery_beacon *b)
{
    return !strcmp(a->node_id, b->node_id) && !strcmp(a->ns, b->ns) && a->api_port == b->api_port &&
           a->cluster_port == b->cluster_port && a->epoch == b->epoch && a->seq == b->seq;
}

/* Decodes a heap copy of exactly n bytes, so ASan sees any read past the end. */
static int decode_copy(const uint8_t *buf, size_t n, const uint8_t *key, struct discovery_beacon *out,
                       char *err, size_t errlen)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        return CAIRN_ENOMEM;
    if (n)
        memcpy(copy, buf, n);
    int rc = discovery_beacon_decode(copy, n, key, out, err, errlen);
    free(copy);
    return rc;
}

static void test_roundtrip(void)
{
    uint8_t key[DISCOVERY_KEY_BYTES], buf[DISCOVERY_BEACON_MAX];
    CHECK_EQ_INT(discovery_beacon_key(SECRET, key), 0);
    struct discovery_beacon b = sample(), got;
    size_t len = 0;
    char err[160] = "";
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), 0);
    CHECK_EQ_INT(len, DISCOVERY_HDR_SIZE + strlen(b.node_id) + strlen(b.ns));
    CHECK(!memcmp(buf, "CRNB\x01\x00", 6), "header starts %02x %02x %02x %02x %02x %02x", buf[0], buf[1],
          buf[2], buf[3], buf[4], buf[5]);
    CHECK(buf[6] == 0xcc && buf[7] == 0xbf && buf[8] == 0xcc && buf[9] == 0xc0, "ports big-endian: %02x%02x %02x%02x",
          buf[6], buf[7], buf[8], buf[9]);
    CHECK_EQ_INT(decode_copy(buf, len, NULL, &got, err, sizeof err), 0);
    CHECK(same_beacon(&b, &got), "plain roundtrip: %s %s %d %d", got.node_id, got.ns, got.api_port,
          got.cluster_port);

    CHECK_EQ_INT(discovery_beacon_encode(&b, key, buf, &len), 0);
    CHECK_EQ_INT(len, DISCOVERY_HDR_SIZE + strlen(b.node_id) + strlen(b.ns) + DISCOVERY_MAC_BYTES);
    CHECK_EQ_INT(buf[5], 1);
    memset(&got, 0, sizeof got);
    CHECK_EQ_INT(decode_copy(buf, len, key, &got, err, sizeof err), 0);
    CHECK(same_beacon(&b, &got), "MAC roundtrip: %s", err);

    /* Extremes: longest id and namespace give the largest beacon; empty namespace and
     * API port 0 are allowed. */
    memset(b.node_id, 'x', 63);
    b.node_id[63] = 0;
    memset(b.ns, '~', 63);
    b.ns[63] = 0;
    b.epoch = UINT64_MAX;
    b.seq = UINT64_MAX;
    CHECK_EQ_INT(discovery_beacon_encode(&b, key, buf, &len), 0);
    CHECK_EQ_INT(len, DISCOVERY_BEACON_MAX);
    CHECK_EQ_INT(decode_copy(buf, len, key, &got, err, sizeof err), 0);
    CHECK(same_beacon(&b, &got), "largest beacon roundtrip: %s", err);
    b = sample();
    b.ns[0] = 0;
    b.api_port = 0;
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), 0);
    CHECK_EQ_INT(decode_copy(buf, len, NULL, &got, err, sizeof err), 0);
    CHECK(same_beacon(&b, &got), "empty namespace roundtrip: %s", err);
}

static void test_encode_refuses(void)
{
    uint8_t buf[DISCOVERY_BEACON_MAX];
    size_t len;
    struct discovery_beacon b = sample();
    CHECK_EQ_INT(discovery_beacon_encode(NULL, NULL, buf, &len), CAIRN_EINVAL);
    b.node_id[0] = 0;
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    snprintf(b.node_id, sizeof b.node_id, "has space");
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    b.ns[1] = '\n';
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    memset(b.ns, 'n', sizeof b.ns); /* not terminated within DISCOVERY_NS_MAX */
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    b.cluster_port = 0;
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    b.api_port = 65536;
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
    b = sample();
    b.api_port = -1;
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, buf, &len), CAIRN_EINVAL);
}

/* Every strict rule of the decoder, one field at a time. */
static void test_decode_refuses(void)
{
    uint8_t key[DISCOVERY_KEY_BYTES], good[DISCOVERY_BEACON_MAX], buf[DISCOVERY_BEACON_MAX + 8];
    CHECK_EQ_INT(discovery_beacon_key(SECRET, key), 0);
    struct discovery_beacon b = sample(), got;
    size_t len;
    char err[160];
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, good, &len), 0);

    int bad = 0;
    for (size_t n = 0; n < len; n++)   /* every truncation */
        bad += decode_copy(good, n, NULL, &got, err, sizeof err) == CAIRN_EFORMAT;
    CHECK_EQ_INT(bad, len);
    memcpy(buf, good, len);
    buf[len] = 0;
    CHECK_EQ_INT(decode_copy(buf, len + 1, NULL, &got, err, sizeof err), CAIRN_EFORMAT);
    CHECK_EQ_INT(discovery_beacon_decode(NULL, 0, NULL, &got, err, sizeof err), CAIRN_EINVAL);

    struct {
        size_t off;
        uint8_t val;
        int want;
        const char *what;
    } cases[] = {
        {0, 'X', CAIRN_EFORMAT, "magic"},
        {3, 'b', CAIRN_EFORMAT, "magic (last byte)"},
        {4, 2, CAIRN_EUNSUPPORTED, "version 2"},
        {4, 0, CAIRN_EUNSUPPORTED, "version 0"},
        {5, 0x02, CAIRN_EFORMAT, "unknown flag"},
        {5, 0x80, CAIRN_EFORMAT, "unknown high flag"},
        {5, 0x01, CAIRN_EFORMAT, "MAC flag without the MAC bytes"},
        {8, 0, CAIRN_EFORMAT, "cluster port 0 (high byte)"},
        {26, 0, CAIRN_EFORMAT, "id length 0"},
        {26, 64, CAIRN_EFORMAT, "id length 64"},
        {26, 255, CAIRN_EFORMAT, "id length 255"},
        {27, 64, CAIRN_EFORMAT, "namespace length 64"},
        {27, 4, CAIRN_EFORMAT, "namespace length one too many"},
        {DISCOVERY_HDR_SIZE, ' ', CAIRN_EFORMAT, "space in the id"},
        {DISCOVERY_HDR_SIZE + 2, 0, CAIRN_EFORMAT, "NUL in the id"},
        {DISCOVERY_HDR_SIZE + 4, 0xc3, CAIRN_EFORMAT, "non-ASCII id"},
        {DISCOVERY_HDR_SIZE + 21, 0x07, CAIRN_EFORMAT, "control byte in the namespace"},
        {DISCOVERY_HDR_SIZE + 22, 0, CAIRN_EFORMAT, "NUL in the namespace"},
        {DISCOVERY_HDR_SIZE + 23, 0x7f, CAIRN_EFORMAT, "DEL in the namespace"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, good, len);
        buf[cases[i].off] = cases[i].val;
        if (cases[i].off == 8)
            buf[9] = 0;
        err[0] = 0;
        int rc = decode_copy(buf, len, NULL, &got, err, sizeof err);
        CHECK(rc == cases[i].want, "%s: rc %d (%s), want %d", cases[i].what, rc, err, cases[i].want);
        CHECK(err[0] != 0, "%s: no message", cases[i].what);
    }

    /* Authentication. */
    uint8_t mac_beacon[DISCOVERY_BEACON_MAX], other[DISCOVERY_KEY_BYTES];
    size_t mlen;
    CHECK_EQ_INT(discovery_beacon_encode(&b, key, mac_beacon, &mlen), 0);
    CHECK_EQ_INT(discovery_beacon_key(OTHER_SECRET, other), 0);
    CHECK_EQ_INT(decode_copy(mac_beacon, mlen, other, &got, err, sizeof err), CAIRN_EINVAL);
    CHECK(strstr(err, "MAC") != NULL, "other secret: message '%s'", err);
    CHECK_EQ_INT(decode_copy(good, len, key, &got, err, sizeof err), CAIRN_EINVAL);     /* no MAC */
    CHECK_EQ_INT(decode_copy(mac_beacon, mlen, NULL, &got, err, sizeof err), CAIRN_EINVAL); /* MAC, no key */
    int refused = 0;
    for (size_t i = 0; i < mlen; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(buf, mac_beacon, mlen);
            buf[i] ^= (uint8_t)(1u << bit);
            refused += decode_copy(buf, mlen, key, &got, err, sizeof err) != 0;
        }
    CHECK_EQ_INT(refused, mlen * 8);
    /* Fields changed and the MAC kept: a forgery. */
    memcpy(buf, mac_beacon, mlen);
    buf[19] ^= 1; /* sequence */
    CHECK_EQ_INT(decode_copy(buf, mlen, key, &got, err, sizeof err), CAIRN_EINVAL);
}

static void test_key(void)
{
    uint8_t a[DISCOVERY_KEY_BYTES], b[DISCOVERY_KEY_BYTES], c[DISCOVERY_KEY_BYTES];
    CHECK_EQ_INT(discovery_beacon_key(SECRET, a), 0);
    CHECK_EQ_INT(discovery_beacon_key(SECRET, b), 0);
    CHECK_EQ_INT(discovery_beacon_key(OTHER_SECRET, c), 0);
    CHECK(!memcmp(a, b, sizeof a), "one secret, two keys");
    CHECK(memcmp(a, c, sizeof a) != 0, "two secrets, one key");
    CHECK_EQ_INT(discovery_beacon_key("", a), CAIRN_EINVAL);
    CHECK_EQ_INT(discovery_beacon_key(NULL, a), CAIRN_EINVAL);
}

/* Random datagrams and random bit flips of a valid one: never a crash, never an
 * accepted beacon with an invalid field. */
static void test_fuzz(void)
{
    uint64_t rs = 0x5eed;
    uint8_t key[DISCOVERY_KEY_BYTES], good[DISCOVERY_BEACON_MAX], buf[400];
    CHECK_EQ_INT(discovery_beacon_key(SECRET, key), 0);
    struct discovery_beacon b = sample(), got;
    size_t len;
    char err[160];
    CHECK_EQ_INT(discovery_beacon_encode(&b, NULL, good, &len), 0);
    int accepted_random = 0, bad_fields = 0, accepted_mac = 0;
    for (int i = 0; i < 20000; i++) {
        size_t n = test_rand_u64(&rs) % sizeof buf;
        for (size_t j = 0; j < n; j++)
            buf[j] = (uint8_t)test_rand_u64(&rs);
        if (i % 2 && n >= 4)
            memcpy(buf, "CRNB\x01", n >= 5 ? 5 : 4);
        accepted_random += decode_copy(buf, n, NULL, &got, err, sizeof err) == 0;
        accepted_mac += decode_copy(buf, n, key, &got, err, sizeof err) == 0;
    }
    for (int i = 0; i < 20000; i++) {
        memcpy(buf, good, len);
        int flips = 1 + (int)(test_rand_u64(&rs) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = test_rand_u64(&rs) % len;
            buf[at] ^= (uint8_t)(1u << (test_rand_u64(&rs) % 8));
        }
        if (decode_copy(buf, len, NULL, &got, err, sizeof err) == 0) {
            uint8_t again[DISCOVERY_BEACON_MAX];
            size_t alen;
            /* Whatever was accepted must be a beacon we could have sent. */
            bad_fields += discovery_beacon_encode(&got, NULL, again, &alen) != 0 || alen != len ||
                          memcmp(again, buf, len) != 0;
        }
    }
    CHECK_EQ_INT(accepted_random, 0);
    CHECK_EQ_INT(accepted_mac, 0);
    CHECK_EQ_INT(bad_fields, 0);
}

static int count_fds(void)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

static struct discovery_config off_config(void)
{
    return (struct discovery_config){.node_id = "node-off", .ns = "lab", .secret = SECRET, .mode = "off",
                                     .api_port = 52415, .cluster_port = 52416};
}

static void test_config(void)
{
    int fds = count_fds();
    struct discovery *d = (struct discovery *)1;
    char err[200] = "";
    struct {
        struct discovery_config cfg;
        int want;
        const char *what;
    } cases[] = {
        {{.node_id = NULL, .mode = "off", .cluster_port = 1}, CAIRN_EINVAL, "no node id"},
        {{.node_id = "bad id", .mode = "off", .cluster_port = 1}, CAIRN_EINVAL, "space in node id"},
        {{.node_id = "n", .ns = "a\tb", .mode = "off", .cluster_port = 1}, CAIRN_EINVAL, "tab in namespace"},
        {{.node_id = "n", .mode = "off", .cluster_port = 0}, CAIRN_EINVAL, "cluster port 0"},
        {{.node_id = "n", .mode = "off", .cluster_port = 70000}, CAIRN_EINVAL, "cluster port 70000"},
        {{.node_id = "n", .mode = "off", .cluster_port = 1, .api_port = -1}, CAIRN_EINVAL, "API port -1"},
        {{.node_id = "n", .mode = "off", .cluster_port = 1, .udp_port = 65536}, CAIRN_EINVAL, "UDP port"},
        {{.node_id = "n", .mode = "off", .cluster_port = 1, .interval_ms = 10}, CAIRN_EINVAL, "interval 10 ms"},
        {{.node_id = "n", .mode = "off", .cluster_port = 1, .interval_ms = 3600000}, CAIRN_EINVAL, "interval 1 h"},
        {{.node_id = "n", .mode = "", .cluster_port = 1}, CAIRN_EINVAL, "empty mode"},
        {{.node_id = "n", .mode = "a-very-long-interface-name", .cluster_port = 1}, CAIRN_EINVAL, "long name"},
        /* Interfaces are looked up before any socket exists. */
        {{.node_id = "n", .mode = "cairnnosuch0", .cluster_port = 1}, CAIRN_ENOTFOUND, "no such interface"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        int rc = discovery_create(&d, &cases[i].cfg, err, sizeof err);
        CHECK(rc == cases[i].want, "%s: rc %d (%s), want %d", cases[i].what, rc, err, cases[i].want);
        CHECK(d == NULL, "%s: output not cleared", cases[i].what);
        CHECK(err[0] != 0, "%s: no message", cases[i].what);
    }
    CHECK_EQ_INT(discovery_create(&d, NULL, err, sizeof err), CAIRN_EINVAL);
    CHECK_EQ_INT(count_fds(), fds);
    discovery_release(NULL);
}

/* "off": no socket, nothing sent or received, poll only waits. */
static void test_off_mode(void)
{
    int fds = count_fds();
    struct discovery_config cfg = off_config();
    struct discovery *d = NULL;
    char err[200] = "";
    CHECK_EQ_INT(discovery_create(&d, &cfg, err, sizeof err), 0);
    if (!d) {
        fprintf(stderr, "off mode: %s\n", err);
        return;
    }
    CHECK_EQ_INT(count_fds(), fds);
    CHECK_EQ_INT(discovery_fd(d), -1);
    struct discovery_peer p;
    int64_t t0 = clock_ns();
    CHECK_EQ_INT(discovery_poll(d, 40, &p), 0);
    int64_t waited_ms = (clock_ns() - t0) / 1000000;
    CHECK(waited_ms >= 30 && waited_ms < 2000, "off poll of 40 ms took %lld ms", (long long)waited_ms);
    CHECK_EQ_INT(discovery_poll(d, 0, &p), 0);
    CHECK_EQ_INT(discovery_poll(d, -1, &p), CAIRN_EINVAL);
    CHECK_EQ_INT(discovery_poll(d, 0, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(discovery_poll(NULL, 0, &p), CAIRN_EINVAL);
    struct discovery_stats s;
    memset(&s, 0xff, sizeof s);
    discovery_get_stats(d, &s);
    CHECK(s.sent == 0 && s.received == 0 && s.send_failed == 0, "off mode counted sent %llu received %llu",
          (unsigned long long)s.sent, (unsigned long long)s.received);
    CHECK_EQ_INT(count_fds(), fds);
    discovery_release(d);
    CHECK_EQ_INT(count_fds(), fds);
}

/* ---- network namespaces ---------------------------------------------------------- */

/* Refuses to go on in the machine's own network namespace (that of PID 1, or the one
 * the parent test ran in). */
static bool inside_test_netns(const char *home)
{
    char self[64] = "", init[64] = "";
    ssize_t a = readlink("/proc/self/ns/net", self, sizeof self - 1);
    ssize_t b = readlink("/proc/1/ns/net", init, sizeof init - 1);
    if (a <= 0)
        return false;
    self[a] = 0;
    if (b > 0)
        init[b] = 0;
    return strcmp(self, init) != 0 && (!home || strcmp(self, home) != 0);
}

struct node_args {
    const char *id, *ns, *secret, *mode, *expect, *forbid, *need, *home, *dst, *self;
    int api, cluster, ifaces;
};

static void parse_args(int argc, char **argv, struct node_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq)
            continue;
        *eq = 0;
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "id")) a->id = v;
        else if (!strcmp(k, "ns")) a->ns = v;
        else if (!strcmp(k, "secret")) a->secret = *v ? v : NULL;
        else if (!strcmp(k, "mode")) a->mode = v;
        else if (!strcmp(k, "expect")) a->expect = v;
        else if (!strcmp(k, "forbid")) a->forbid = v;
        else if (!strcmp(k, "need")) a->need = v;
        else if (!strcmp(k, "home")) a->home = v;
        else if (!strcmp(k, "dst")) a->dst = v;
        else if (!strcmp(k, "self")) a->self = v;
        else if (!strcmp(k, "api")) a->api = atoi(v);
        else if (!strcmp(k, "cluster")) a->cluster = atoi(v);
        else if (!strcmp(k, "ifaces")) a->ifaces = atoi(v);
    }
}

#define MAX_LIST 8

struct want {
    char id[DISCOVERY_ID_MAX], addr[DISCOVERY_ADDR_MAX];
    int api, cluster;
    bool found;
};

/* "id@addr/api/cluster,..." */
static int parse_wants(const char *s, struct want *w)
{
    int n = 0;
    char copy[512];
    snprintf(copy, sizeof copy, "%s", s ? s : "");
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < MAX_LIST; t = strtok_r(NULL, ",", &save)) {
        memset(&w[n], 0, sizeof w[n]);
        if (sscanf(t, "%63[^@]@%63[^/]/%d/%d", w[n].id, w[n].addr, &w[n].api, &w[n].cluster) == 4)
            n++;
    }
    return n;
}

static bool in_list(const char *list, const char *id)
{
    char copy[512];
    snprintf(copy, sizeof copy, "%s", list ? list : "");
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (!strcmp(t, id))
            return true;
    return false;
}

static uint64_t stat_named(const struct discovery_stats *s, const char *name)
{
    if (!strcmp(name, "malformed")) return s->malformed;
    if (!strcmp(name, "unauthenticated")) return s->unauthenticated;
    if (!strcmp(name, "other_ns")) return s->other_ns;
    if (!strcmp(name, "own")) return s->own;
    if (!strcmp(name, "stale")) return s->stale;
    return 0;
}

static bool needs_met(const struct discovery_stats *s, const char *need)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", need ? need : "");
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (stat_named(s, t) == 0)
            return false;
    return true;
}

/* One discovery instance inside a test namespace: listens until every expected peer
 * was found (at the expected address and ports) and every needed counter moved, for at
 * least NODE_MIN_MS and at most NODE_MAX_MS; fails on a forbidden peer. */
static int node_main(int argc, char **argv)
{
    struct node_args a;
    parse_args(argc, argv, &a);
    if (!inside_test_netns(a.home)) {
        fprintf(stderr, "node: refusing to beacon outside a test network namespace\n");
        return 2;
    }
    struct want w[MAX_LIST];
    int nw = parse_wants(a.expect, w);
    struct discovery_config cfg = {.node_id = a.id, .ns = a.ns, .secret = a.secret, .mode = a.mode,
                                   .api_port = a.api, .cluster_port = a.cluster, .interval_ms = NODE_INTERVAL_MS};
    struct discovery *d;
    char err[200];
    if (discovery_create(&d, &cfg, err, sizeof err)) {
        fprintf(stderr, "node %s: %s\n", a.id, err);
        return 1;
    }
    /* Tell the parent we listen (fd 3 is its pipe; absent when run by hand). */
    if (write(3, "r", 1) == 1)
        close(3);
    int failures = 0, reports = 0;
    int64_t t0 = clock_ns(), elapsed_ms = 0;
    for (int round = 0; round < NODE_MAX_MS / 50; round++) {
        struct discovery_peer p;
        int rc = discovery_poll(d, 50, &p);
        if (rc < 0) {
            fprintf(stderr, "node %s: poll failed: %d\n", a.id, rc);
            failures++;
            break;
        }
        if (rc == 1) {
            reports++;
            bool known = false;
            for (int i = 0; i < nw; i++)
                if (!strcmp(w[i].id, p.node_id)) {
                    known = true;
                    if (strcmp(w[i].addr, p.addr) || w[i].api != p.api_port || w[i].cluster != p.cluster_port) {
                        fprintf(stderr, "node %s: %s reported at %s/%d/%d, expected %s/%d/%d\n", a.id, p.node_id,
                                p.addr, p.api_port, p.cluster_port, w[i].addr, w[i].api, w[i].cluster);
                        failures++;
                    }
                    if (!w[i].found)
                        fprintf(stderr, "node %s: found %s at %s/%d/%d after %lld ms (change %d)\n", a.id,
                                p.node_id, p.addr, p.api_port, p.cluster_port,
                                (long long)((clock_ns() - t0) / 1000000), p.change);
                    if (!w[i].found && p.change != DISCOVERY_NEW) {
                        fprintf(stderr, "node %s: first report of %s is change %d\n", a.id, p.node_id, p.change);
                        failures++;
                    }
                    w[i].found = true;
                }
            if (!known) {
                fprintf(stderr, "node %s: found %s at %s, which it must not (%s)\n", a.id, p.node_id, p.addr,
                        in_list(a.forbid, p.node_id) ? "another cluster, namespace or a forgery"
                                                     : "unknown node");
                failures++;
            }
        }
        elapsed_ms = (clock_ns() - t0) / 1000000;
        bool all = true;
        for (int i = 0; i < nw; i++)
            all = all && w[i].found;
        struct discovery_stats s;
        discovery_get_stats(d, &s);
        if (all && needs_met(&s, a.need) && elapsed_ms >= NODE_MIN_MS)
            break;
        if (elapsed_ms >= NODE_MAX_MS)
            break;
    }
    struct discovery_stats s;
    discovery_get_stats(d, &s);
    elapsed_ms = (clock_ns() - t0) / 1000000;
    fprintf(stderr,
            "node %s: %lld ms, %d reports; sent %llu (failed %llu), received %llu, accepted %llu, malformed %llu, "
            "unauthenticated %llu, other_ns %llu, other_iface %llu, own %llu, stale %llu\n",
            a.id, (long long)elapsed_ms, reports, (unsigned long long)s.sent, (unsigned long long)s.send_failed,
            (unsigned long long)s.received, (unsigned long long)s.accepted, (unsigned long long)s.malformed,
            (unsigned long long)s.unauthenticated, (unsigned long long)s.other_ns,
            (unsigned long long)s.other_iface, (unsigned long long)s.own, (unsigned long long)s.stale);
    for (int i = 0; i < nw; i++)
        if (!w[i].found) {
            fprintf(stderr, "node %s: never found %s\n", a.id, w[i].id);
            failures++;
        }
    if (!needs_met(&s, a.need)) {
        fprintf(stderr, "node %s: counters %s did not all move\n", a.id, a.need);
        failures++;
    }
    /* Rate limit: one beacon per interval per interface, however often poll ran; and
     * auto mode beacons on every interface. */
    int ifaces = a.ifaces > 0 ? a.ifaces : 1;
    uint64_t most = ((uint64_t)(elapsed_ms / NODE_INTERVAL_MS) + 2) * (uint64_t)ifaces;
    uint64_t least = (uint64_t)(elapsed_ms / NODE_INTERVAL_MS / 2) * (uint64_t)ifaces;
    if (s.sent < least || s.sent > most) {
        fprintf(stderr, "node %s: sent %llu beacons in %lld ms on %d interfaces (%llu..%llu expected)\n", a.id,
                (unsigned long long)s.sent, (long long)elapsed_ms, ifaces, (unsigned long long)least,
                (unsigned long long)most);
        failures++;
    }
    discovery_release(d);
    return failures ? 1 : 0;
}

/* Sends garbage, forgeries and replays to the beacon port inside a test namespace. */
static int garbage_main(int argc, char **argv)
{
    struct node_args a;
    parse_args(argc, argv, &a);
    if (!inside_test_netns(a.home)) {
        fprintf(stderr, "garbage: refusing to send outside a test network namespace\n");
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int on = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &on, sizeof on) ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on)) {
        perror("garbage: socket");
        return 1;
    }
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(DISCOVERY_PORT_DEFAULT)};
    if (bind(fd, (struct sockaddr *)&me, sizeof me)) {
        perror("garbage: bind");
        return 1;
    }
    struct sockaddr_in dst[4];
    int ndst = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", a.dst ? a.dst : "");
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && ndst < 4; t = strtok_r(NULL, ",", &save)) {
        dst[ndst] = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(DISCOVERY_PORT_DEFAULT)};
        if (inet_pton(AF_INET, t, &dst[ndst].sin_addr) == 1)
            ndst++;
    }
    struct in_addr self = {0};
    if (!a.self || inet_pton(AF_INET, a.self, &self) != 1) {
        fprintf(stderr, "garbage: needs self=<our address>\n");
        return 1;
    }
    uint8_t key[DISCOVERY_KEY_BYTES], fake[DISCOVERY_KEY_BYTES];
    if (!a.secret || discovery_beacon_key(a.secret, key) || discovery_beacon_key("forger's guess", fake)) {
        fprintf(stderr, "garbage: needs secret=\n");
        return 1;
    }
    uint64_t rs = 0xbadbeef;
    static uint8_t big[3000];
    int sent = 0, replayed = 0;
    int64_t t0 = clock_ns();
    for (int round = 0; round < GARBAGE_MS / 100; round++) {
        uint8_t pkt[8][DISCOVERY_BEACON_MAX + 16];
        size_t len[8];
        len[0] = 0;
        len[1] = 1;
        pkt[1][0] = 'C';
        len[2] = test_rand_u64(&rs) % (DISCOVERY_BEACON_MAX + 16);
        for (size_t j = 0; j < len[2]; j++)
            pkt[2][j] = (uint8_t)test_rand_u64(&rs);
        len[3] = DISCOVERY_HDR_SIZE;
        memcpy(pkt[3], "CRNB\x01", 5);
        for (size_t j = 5; j < len[3]; j++)
            pkt[3][j] = (uint8_t)test_rand_u64(&rs);
        struct discovery_beacon b = {.api_port = 1, .cluster_port = 2, .epoch = UINT64_MAX / 2, .seq = 1};
        snprintf(b.node_id, sizeof b.node_id, "forged");
        snprintf(b.ns, sizeof b.ns, "%s", a.ns ? a.ns : "");
        discovery_beacon_encode(&b, fake, pkt[4], &len[4]);  /* forged: a MAC under a guessed key */
        discovery_beacon_encode(&b, NULL, pkt[5], &len[5]);  /* one too long */
        pkt[5][len[5]] = 'z';
        len[5]++;
        discovery_beacon_encode(&b, key, pkt[6], &len[6]);   /* another version, good MAC */
        pkt[6][4] = 2;
        discovery_beacon_encode(&b, key, pkt[7], &len[7]);   /* MAC cut short */
        len[7] -= 5;
        for (int d = 0; d < ndst; d++) {
            for (int k = 0; k < 8; k++)
                sent += sendto(fd, pkt[k], len[k], 0, (struct sockaddr *)&dst[d], sizeof dst[d]) >= 0;
            sent += sendto(fd, big, sizeof big, 0, (struct sockaddr *)&dst[d], sizeof dst[d]) >= 0;
        }
        /* Replay every genuine beacon we hear from elsewhere, from our own address. */
        for (int k = 0; k < 64; k++) {
            uint8_t in[512];
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(fd, in, sizeof in, 0, (struct sockaddr *)&from, &fl);
            if (n <= 0)
                break;
            if (from.sin_addr.s_addr == self.s_addr)
                continue;
            struct discovery_beacon got;
            if (discovery_beacon_decode(in, (size_t)n, key, &got, NULL, 0) == 0 && strcmp(got.node_id, "forged"))
                for (int d = 0; d < ndst; d++)
                    replayed += sendto(fd, in, (size_t)n, 0, (struct sockaddr *)&dst[d], sizeof dst[d]) >= 0;
        }
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "garbage: %d datagrams and %d replays in %lld ms\n", sent, replayed,
            (long long)((clock_ns() - t0) / 1000000));
    close(fd);
    return sent > 0 && replayed > 0 ? 0 : 1;
}

/* Runs argv, quietly unless verbose; its exit status, or -1. */
static int run(const char *const *argv, bool verbose)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (!verbose) {
            int nul = open("/dev/null", O_WRONLY);
            if (nul >= 0) {
                dup2(nul, 1);
                dup2(nul, 2);
            }
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define NETNS 3

static void delete_netns(char names[NETNS][64])
{
    for (int i = 0; i < NETNS; i++) {
        const char *del[] = {"ip", "netns", "del", names[i], NULL};
        run(del, false);
    }
}

/* A process that deletes the namespaces once the test is gone, however it ends: it
 * waits for the end of a pipe whose only writer is the test. */
static pid_t start_janitor(char names[NETNS][64], int *wfd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[1]);
        setsid();
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        for (;;) {
            char c;
            ssize_t r = read(p[0], &c, 1);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
        }
        delete_netns(names);
        _exit(0);
    }
    close(p[0]);
    *wfd = p[1];
    return pid;
}

struct child {
    const char *name;
    pid_t pid;
    int status;
    bool done;
};

/* Runs exe args inside netns; ready_fd (or -1) becomes the child's fd 3. */
static pid_t spawn_in(const char *netns, const char *exe, const char *const *args, int ready_fd)
{
    const char *argv[24];
    int n = 0;
    argv[n++] = "ip";
    argv[n++] = "netns";
    argv[n++] = "exec";
    argv[n++] = netns;
    argv[n++] = exe;
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        if (getppid() != parent)
            _exit(1);
        if (ready_fd >= 0 && dup2(ready_fd, 3) != 3)
            _exit(1);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void wait_children(struct child *c, int n)
{
    int64_t t0 = clock_ns();
    for (int left = n, i = 0; left > 0 && i < CHILDREN_MAX_MS / 50; i++) {
        for (int k = 0; k < n; k++) {
            if (c[k].done || c[k].pid <= 0)
                continue;
            int st;
            pid_t r = waitpid(c[k].pid, &st, WNOHANG);
            if (r == c[k].pid) {
                c[k].done = true;
                c[k].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
                left--;
            }
        }
        if (left > 0) {
            struct timespec ts = {0, 50 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    for (int k = 0; k < n; k++)
        if (!c[k].done && c[k].pid > 0) {
            fprintf(stderr, "%s: still running after %lld ms, killed\n", c[k].name,
                    (long long)((clock_ns() - t0) / 1000000));
            kill(c[k].pid, SIGKILL);
            waitpid(c[k].pid, NULL, 0);
            c[k].status = -1;
        }
}

/* Three namespaces: a and b joined by one veth pair (10.231.X.0/24), a and c by
 * another (10.232.X.0/24); addresses of the test's own choosing, only inside them.
 *
 *   a: node-a (secret S, namespace "t", beacons on the a-b link by name)
 *      node-c (namespace "other"), node-e (no secret), node-i (S, "t", auto: both links)
 *   b: node-b (S, "t", auto), node-d (another secret, on its link by name),
 *      node-f (no secret), garbage (garbage, forgeries, replays of a's beacons)
 *   c: node-h (S, "t", auto)
 *
 * a, b, i find each other; i and h find each other; h never hears a (a beacons on the
 * a-b link only) and a never hears h (h's beacons arrive on the other link); e and f
 * (no secret) find only each other; c and d find nobody; nobody finds "forged". */
static void test_netns(void)
{
    if (geteuid() != 0) {
        printf("SKIP netns discovery: needs root to create network namespaces\n");
        return;
    }
    const char *ver[] = {"ip", "-V", NULL};
    if (run(ver, false) != 0) {
        printf("SKIP netns discovery: no usable `ip` (iproute2)\n");
        return;
    }
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char home[64];
    ssize_t hl = readlink("/proc/self/ns/net", home, sizeof home - 1);
    if (el <= 0 || hl <= 0) {
        printf("SKIP netns discovery: cannot read /proc/self\n");
        return;
    }
    exe[el] = 0;
    home[hl] = 0;
    int pid = (int)getpid(), x = pid % 250;
    char names[NETNS][64];
    for (int i = 0; i < NETNS; i++)
        snprintf(names[i], sizeof names[i], "cairn-test-%d-%c", pid, 'a' + i);
    const char *nsa = names[0], *nsb = names[1], *nsc = names[2];
    char va[16], vb[16], va2[16], vc[16], ipa[32], ipb[32], ipa2[32], ipc[32];
    char cidr_a[40], cidr_b[40], cidr_a2[40], cidr_c[40], bcast[32];
    snprintf(va, sizeof va, "cv%da", pid % 10000000);
    snprintf(vb, sizeof vb, "cv%db", pid % 10000000);
    snprintf(va2, sizeof va2, "cw%da", pid % 10000000);
    snprintf(vc, sizeof vc, "cw%dc", pid % 10000000);
    snprintf(ipa, sizeof ipa, "10.231.%d.1", x);
    snprintf(ipb, sizeof ipb, "10.231.%d.2", x);
    snprintf(ipa2, sizeof ipa2, "10.232.%d.1", x);
    snprintf(ipc, sizeof ipc, "10.232.%d.3", x);
    snprintf(cidr_a, sizeof cidr_a, "%s/24", ipa);
    snprintf(cidr_b, sizeof cidr_b, "%s/24", ipb);
    snprintf(cidr_a2, sizeof cidr_a2, "%s/24", ipa2);
    snprintf(cidr_c, sizeof cidr_c, "%s/24", ipc);
    snprintf(bcast, sizeof bcast, "10.231.%d.255", x);

    int wfd = -1;
    pid_t janitor = start_janitor(names, &wfd);
    if (janitor < 0) {
        printf("SKIP netns discovery: cannot fork the janitor\n");
        return;
    }
    /* The veth ends are created straight inside the namespaces, never in ours. */
    const char *setup[][16] = {
        {"ip", "netns", "add", nsa, NULL},
        {"ip", "netns", "add", nsb, NULL},
        {"ip", "netns", "add", nsc, NULL},
        {"ip", "link", "add", va, "netns", nsa, "type", "veth", "peer", "name", vb, "netns", nsb, NULL},
        {"ip", "link", "add", va2, "netns", nsa, "type", "veth", "peer", "name", vc, "netns", nsc, NULL},
        {"ip", "-n", nsa, "addr", "add", cidr_a, "brd", "+", "dev", va, NULL},
        {"ip", "-n", nsb, "addr", "add", cidr_b, "brd", "+", "dev", vb, NULL},
        {"ip", "-n", nsa, "addr", "add", cidr_a2, "brd", "+", "dev", va2, NULL},
        {"ip", "-n", nsc, "addr", "add", cidr_c, "brd", "+", "dev", vc, NULL},
        {"ip", "-n", nsa, "link", "set", "lo", "up", NULL},
        {"ip", "-n", nsb, "link", "set", "lo", "up", NULL},
        {"ip", "-n", nsc, "link", "set", "lo", "up", NULL},
        {"ip", "-n", nsa, "link", "set", va, "up", NULL},
        {"ip", "-n", nsb, "link", "set", vb, "up", NULL},
        {"ip", "-n", nsa, "link", "set", va2, "up", NULL},
        {"ip", "-n", nsc, "link", "set", vc, "up", NULL},
    };
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++)
        if (run(setup[i], true) != 0) {
            printf("SKIP netns discovery: `%s %s %s %s` failed (the kernel or container refuses network "
                   "namespaces)\n",
                   setup[i][0], setup[i][1], setup[i][2], setup[i][3]);
            delete_netns(names);
            close(wfd);
            waitpid(janitor, NULL, 0);
            return;
        }

    char home_arg[80], secret1[64], secret2[64], mode_a[40], mode_d[40], dst[80], self_arg[48];
    char exp_a[200], exp_b[200], exp_e[128], exp_f[128], exp_h[128], exp_i[200];
    snprintf(home_arg, sizeof home_arg, "home=%s", home);
    snprintf(secret1, sizeof secret1, "secret=%s", SECRET);
    snprintf(secret2, sizeof secret2, "secret=%s", OTHER_SECRET);
    snprintf(mode_a, sizeof mode_a, "mode=%s", va);
    snprintf(mode_d, sizeof mode_d, "mode=%s", vb);
    snprintf(exp_a, sizeof exp_a, "expect=node-b@%s/1002/2002,node-i@%s/1009/2009", ipb, ipa);
    snprintf(exp_b, sizeof exp_b, "expect=node-a@%s/1001/2001,node-i@%s/1009/2009", ipa, ipa);
    snprintf(exp_e, sizeof exp_e, "expect=node-f@%s/1006/2006", ipb);
    snprintf(exp_f, sizeof exp_f, "expect=node-e@%s/1005/2005", ipa);
    snprintf(exp_h, sizeof exp_h, "expect=node-i@%s/1009/2009", ipa2);
    snprintf(exp_i, sizeof exp_i, "expect=node-a@%s/1001/2001,node-b@%s/1002/2002,node-h@%s/1008/2008", ipa,
             ipb, ipc);
    snprintf(dst, sizeof dst, "dst=%s,%s", bcast, ipa);
    snprintf(self_arg, sizeof self_arg, "self=%s", ipb);
    const char *forbid = "forbid=node-a,node-b,node-c,node-d,node-e,node-f,node-h,node-i,forged";
    const char *args_a[] = {"--node", "id=node-a", "ns=t", secret1, mode_a, "api=1001", "cluster=2001", exp_a,
                            forbid, "need=malformed,unauthenticated,own", home_arg, NULL};
    const char *args_b[] = {"--node", "id=node-b", "ns=t", secret1, "mode=auto", "api=1002", "cluster=2002", exp_b,
                            forbid, "need=malformed,unauthenticated,own,stale", home_arg, NULL};
    const char *args_c[] = {"--node", "id=node-c", "ns=other", secret1, "mode=auto", "api=1003", "cluster=2003",
                            forbid, "need=other_ns,malformed", "ifaces=2", home_arg, NULL};
    const char *args_d[] = {"--node", "id=node-d", "ns=t", secret2, mode_d, "api=1004", "cluster=2004",
                            forbid, "need=unauthenticated", home_arg, NULL};
    const char *args_e[] = {"--node", "id=node-e", "ns=t", "secret=", "mode=auto", "api=1005", "cluster=2005",
                            exp_e, forbid, "need=unauthenticated,malformed", "ifaces=2", home_arg, NULL};
    const char *args_f[] = {"--node", "id=node-f", "ns=t", "secret=", "mode=auto", "api=1006", "cluster=2006",
                            exp_f, forbid, "need=unauthenticated", home_arg, NULL};
    const char *args_h[] = {"--node", "id=node-h", "ns=t", secret1, "mode=auto", "api=1008", "cluster=2008",
                            exp_h, forbid, "need=unauthenticated", home_arg, NULL};
    const char *args_i[] = {"--node", "id=node-i", "ns=t", secret1, "mode=auto", "api=1009", "cluster=2009",
                            exp_i, forbid, "need=malformed", "ifaces=2", home_arg, NULL};
    const char *args_g[] = {"--garbage", "ns=t", secret1, dst, self_arg, home_arg, NULL};
    struct child c[] = {{"node-a", 0, 0, false}, {"node-b", 0, 0, false}, {"node-c", 0, 0, false},
                        {"node-d", 0, 0, false}, {"node-e", 0, 0, false}, {"node-f", 0, 0, false},
                        {"node-h", 0, 0, false}, {"node-i", 0, 0, false}, {"garbage", 0, 0, false}};
    const char *const *args[] = {args_a, args_b, args_c, args_d, args_e, args_f, args_h, args_i, args_g};
    const char *where[] = {nsa, nsb, nsa, nsb, nsa, nsb, nsc, nsa, nsb};
    int n = (int)(sizeof c / sizeof c[0]);
    int64_t t0 = clock_ns();
    /* The garbage sender starts once every node listens, so each hears a genuine
     * beacon before any replay of it. */
    int ready[2];
    CHECK_EQ_INT(pipe2(ready, O_CLOEXEC), 0);
    for (int i = 0; i < n - 1; i++) {
        c[i].pid = spawn_in(where[i], exe, args[i], ready[1]);
        CHECK(c[i].pid > 0, "%s: fork failed", c[i].name);
    }
    close(ready[1]);
    int got = 0;
    for (int i = 0; i < 400 && got < n - 1; i++) {
        struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0) {
            char buf[16];
            ssize_t r = read(ready[0], buf, sizeof buf);
            if (r <= 0)
                break; /* every node exited or wrote */
            got += (int)r;
        }
    }
    close(ready[0]);
    CHECK(got == n - 1, "%d of %d nodes said they listen", got, n - 1);
    c[n - 1].pid = spawn_in(where[n - 1], exe, args[n - 1], -1);
    wait_children(c, n);
    printf("netns discovery: all instances done in %.1f s\n", (double)(clock_ns() - t0) * 1e-9);
    for (int i = 0; i < n; i++)
        CHECK(c[i].status == 0, "%s exited with %d (see its lines above)", c[i].name, c[i].status);

    delete_netns(names);
    close(wfd);
    waitpid(janitor, NULL, 0);
    for (int i = 0; i < NETNS; i++) {
        char path[96];
        snprintf(path, sizeof path, "/run/netns/%.63s", names[i]);
        CHECK(access(path, F_OK) != 0, "namespace %s still there after the test", names[i]);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--node"))
        return node_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "--garbage"))
        return garbage_main(argc, argv);
    test_begin(argc, argv);
    RUN(test_roundtrip);
    RUN(test_encode_refuses);
    RUN(test_decode_refuses);
    RUN(test_key);
    RUN(test_fuzz);
    RUN(test_config);
    RUN(test_off_mode);
    RUN(test_netns);
    return test_main_end();
}
