/* Link tests on real sockets, 127.0.0.1 only. Every wait is bounded in time and in
 * count; time bounds are generous (nothing is asserted about speed). */
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "net/link.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <czmq.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#define MS 1000000LL
#define MAX_EVS 4096

struct ev {
    enum link_event event;
    char peer[LINK_ID_MAX];
    int type;
    size_t len;
    char data[64]; /* first bytes of the payload, NUL-terminated */
    uint64_t sum;  /* of every payload byte, to check big messages */
};

struct node {
    struct link *l;
    const char *id;
    struct ev *evs;
    size_t n_evs;
};

static char errbuf[256];

static int node_open(struct node *n, const char *id, const char *ns, const char *secret, int hb, int timeout)
{
    memset(n, 0, sizeof *n);
    n->id = id;
    n->evs = calloc(MAX_EVS, sizeof *n->evs);
    struct link_config cfg = {.node_id = id, .ns = ns, .secret = secret, .bind_addr = "127.0.0.1",
                              .heartbeat_ms = hb, .timeout_ms = timeout, .max_msg = 4 << 20};
    int rc = link_create(&n->l, &cfg, errbuf, sizeof errbuf);
    CHECK(rc == 0, "link_create %s: %s", id, errbuf);
    return rc;
}

static void node_close(struct node *n)
{
    link_release(n->l);
    n->l = NULL;
    free(n->evs);
    n->evs = NULL;
}

static char *endpoint_of(const struct node *n)
{
    static char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", link_port(n->l));
    return ep;
}

static void record(struct node *n, const struct link_msg *m)
{
    if (n->n_evs == MAX_EVS)
        return;
    struct ev *e = &n->evs[n->n_evs++];
    e->event = m->event;
    memcpy(e->peer, m->peer, sizeof e->peer);
    e->type = m->type;
    e->len = m->len;
    size_t k = m->len < sizeof e->data - 1 ? m->len : sizeof e->data - 1;
    if (k)
        memcpy(e->data, m->data, k);
    e->data[k] = 0;
    e->sum = 0;
    for (size_t i = 0; i < m->len; i++)
        e->sum += ((const uint8_t *)m->data)[i];
}

/* Polls each live node once (up to wait_ms for the first), recording what comes. */
static void pump_once(struct node **nodes, int n, int wait_ms)
{
    for (int i = 0; i < n; i++) {
        if (!nodes[i] || !nodes[i]->l)
            continue;
        struct link_msg m;
        int w = wait_ms;
        for (int k = 0; k < 2000; k++) {
            int rc = link_poll(nodes[i]->l, w, &m);
            CHECK(rc >= 0, "link_poll %s: %d", nodes[i]->id, rc);
            if (rc != 1)
                break;
            record(nodes[i], &m);
            w = 0;
        }
    }
}

typedef bool (*pred_fn)(void *ctx);

/* Pumps until pred holds or ms pass; returns whether it held. */
static bool pump_until(struct node **nodes, int n, int ms, pred_fn pred, void *ctx)
{
    int64_t end = clock_ns() + (int64_t)ms * MS;
    while (clock_ns() < end) {
        if (pred && pred(ctx))
            return true;
        pump_once(nodes, n, 2);
    }
    return pred && pred(ctx);
}

static void pump_for(struct node **nodes, int n, int ms) { pump_until(nodes, n, ms, NULL, NULL); }

static size_t count_ev(const struct node *n, enum link_event ev, const char *peer, int type, const char *data)
{
    size_t c = 0;
    for (size_t i = 0; i < n->n_evs; i++) {
        const struct ev *e = &n->evs[i];
        if (e->event == ev && (!peer || !strcmp(e->peer, peer)) && (!type || e->type == type) &&
            (!data || !strcmp(e->data, data)))
            c++;
    }
    return c;
}

struct up_ctx {
    struct node *a;
    const char *peer;
    bool want_up;
};

static bool is_up(void *p)
{
    struct up_ctx *c = p;
    return link_peer_up(c->a->l, c->peer) == c->want_up;
}

struct got_ctx {
    struct node *n;
    enum link_event ev;
    const char *peer;
    const char *data;
    size_t want;
};

static bool got(void *p)
{
    struct got_ctx *c = p;
    return count_ev(c->n, c->ev, c->peer, 0, c->data) >= c->want;
}

static bool wait_up(struct node **all, int n, struct node *a, const char *peer, int ms)
{
    struct up_ctx c = {a, peer, true};
    return pump_until(all, n, ms, is_up, &c);
}

static bool wait_msg(struct node **all, int n, struct node *to, const char *from, const char *data, int ms)
{
    struct got_ctx c = {to, LINK_EV_MESSAGE, from, data, 1};
    return pump_until(all, n, ms, got, &c);
}

static bool wait_event(struct node **all, int n, struct node *to, enum link_event ev, const char *peer, int ms)
{
    struct got_ctx c = {to, ev, peer, NULL, 1};
    return pump_until(all, n, ms, got, &c);
}

/* Sends text from a to b and waits for it. */
static bool exchange(struct node **all, int n, struct node *a, struct node *b, const char *text)
{
    int rc = link_send(a->l, b->id, LINK_T_COMMAND, text, strlen(text));
    CHECK(rc == 1, "%s -> %s send '%s': %d", a->id, b->id, text, rc);
    bool ok = wait_msg(all, n, b, a->id, text, 10000);
    CHECK(ok, "%s did not receive '%s' from %s", b->id, text, a->id);
    return ok;
}

/* ---- headers, keys, HMAC -------------------------------------------------------------- */

static void test_header(void)
{
    struct link_hdr h = {.version = LINK_VERSION, .type = LINK_T_EVENT, .len = 0x01020304}, back;
    strcpy(h.sender, "node-1");
    uint8_t buf[LINK_HDR_SIZE + 1];
    link_hdr_encode(&h, buf);
    CHECK(buf[0] == 'c' && buf[1] == 'l' && buf[2] == 1 && buf[3] == LINK_T_EVENT, "header bytes %02x %02x %02x %02x",
          buf[0], buf[1], buf[2], buf[3]);
    CHECK(buf[4] == 1 && buf[5] == 2 && buf[6] == 3 && buf[7] == 4, "length not big-endian");
    char err[128];
    CHECK(link_hdr_decode(buf, LINK_HDR_SIZE, &back, err, sizeof err) == 0, "decode: %s", err);
    CHECK(back.type == h.type && back.len == h.len && !strcmp(back.sender, "node-1"), "round trip type %u len %u '%s'",
          back.type, back.len, back.sender);
    for (size_t n = 0; n <= LINK_HDR_SIZE + 1; n++)
        if (n != LINK_HDR_SIZE)
            CHECK(link_hdr_decode(buf, n, &back, err, sizeof err) == CAIRN_EFORMAT, "header of %zu bytes accepted", n);
    struct {
        int at;
        uint8_t value;
        const char *want;
    } bad[] = {
        {0, 'x', "magic"},   {2, 2, "version"},     {2, 0, "version"},     {3, 0, "type"},
        {3, 7, "type"},      {3, 15, "type"},       {3, 64, "type"},       {3, 255, "type"},
        {8, 0, "empty"},     {9, ' ', "0x20"},      {9, 0x7f, "0x7f"},     {20, 'x', "padding"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t t[LINK_HDR_SIZE];
        memcpy(t, buf, sizeof t);
        t[bad[i].at] = bad[i].value;
        err[0] = 0;
        CHECK(link_hdr_decode(t, sizeof t, &back, err, sizeof err) == CAIRN_EFORMAT && strstr(err, bad[i].want),
              "byte %d = %u: '%s' (want %s)", bad[i].at, bad[i].value, err, bad[i].want);
    }
    uint8_t t[LINK_HDR_SIZE];
    memcpy(t, buf, sizeof t);
    memset(t + 8, 'a', LINK_ID_MAX);
    CHECK(link_hdr_decode(t, sizeof t, &back, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "terminated"),
          "unterminated sender: %s", err);
    /* Every type of the application range and every link type decodes. */
    for (int ty = 1; ty < 256; ty++) {
        t[3] = (uint8_t)ty;
        memcpy(t + 8, buf + 8, LINK_ID_MAX);
        bool ok = (ty >= 1 && ty <= 6) || (ty >= LINK_T_APP_FIRST && ty <= LINK_T_APP_LAST);
        CHECK((link_hdr_decode(t, sizeof t, &back, err, sizeof err) == 0) == ok, "type %d accepted=%d", ty, !ok);
    }
    CHECK(link_valid_id("a") && link_valid_id("node-01.example:7") && !link_valid_id("") && !link_valid_id("a b") &&
              !link_valid_id(NULL),
          "link_valid_id");
    char longid[LINK_ID_MAX + 1];
    memset(longid, 'x', LINK_ID_MAX);
    longid[LINK_ID_MAX] = 0;
    CHECK(!link_valid_id(longid), "64-byte id accepted");
    longid[LINK_ID_MAX - 1] = 0;
    CHECK(link_valid_id(longid), "63-byte id refused");
}

static void test_keys_and_hmac(void)
{
    uint8_t pk1[32], sk1[32], pk2[32], sk2[32], pk3[32], sk3[32], check[32];
    CHECK(link_curve_keypair("secret", pk1, sk1) == 0, "keypair");
    CHECK(link_curve_keypair("secret", pk2, sk2) == 0, "keypair again");
    CHECK(!memcmp(pk1, pk2, 32) && !memcmp(sk1, sk2, 32), "keypair not deterministic");
    CHECK(link_curve_keypair("secreT", pk3, sk3) == 0, "keypair 3");
    CHECK(memcmp(pk1, pk3, 32) != 0, "different secrets gave one key");
    crypto_scalarmult_base(check, sk1);
    CHECK(!memcmp(check, pk1, 32), "public key is not the secret key's");
    CHECK(link_curve_keypair("", pk3, sk3) == CAIRN_EINVAL && link_curve_keypair(NULL, pk3, sk3) == CAIRN_EINVAL,
          "empty secret accepted");

    uint8_t nonce[LINK_NONCE_BYTES], nonce2[LINK_NONCE_BYTES], mac[LINK_MAC_BYTES], mac2[LINK_MAC_BYTES];
    link_auth_nonce(nonce);
    link_auth_nonce(nonce2);
    CHECK(memcmp(nonce, nonce2, sizeof nonce) != 0, "two nonces equal");
    CHECK(link_auth_challenge("cluster pw", nonce, mac) == 0, "challenge");
    CHECK(link_auth_verify("cluster pw", nonce, mac) == 0, "right secret refused");
    CHECK(link_auth_verify("cluster pw!", nonce, mac) == CAIRN_EINVAL, "wrong secret accepted");
    CHECK(link_auth_verify("cluster pw", nonce2, mac) == CAIRN_EINVAL, "proof replayed on another nonce accepted");
    CHECK(link_auth_challenge("cluster pw", nonce, mac2) == 0 && !memcmp(mac, mac2, sizeof mac),
          "challenge not deterministic");
    for (int bit = 0; bit < 8 * LINK_MAC_BYTES; bit += 37) {
        memcpy(mac2, mac, sizeof mac);
        mac2[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        CHECK(link_auth_verify("cluster pw", nonce, mac2) == CAIRN_EINVAL, "mac with bit %d flipped accepted", bit);
    }
    CHECK(link_auth_challenge("", nonce, mac2) == CAIRN_EINVAL && link_auth_verify(NULL, nonce, mac) == CAIRN_EINVAL,
          "empty secret in HMAC accepted");
    /* The HMAC key is not the CURVE seed: a proof never equals key material. */
    CHECK(memcmp(mac, sk1, 32) && memcmp(mac, pk1, 32), "mac equals a key");
}

static void test_config(void)
{
    struct link *l = NULL;
    char err[256];
    struct link_config ok = {.node_id = "n1", .bind_addr = "127.0.0.1"};
    struct link_config c;
    c = ok;
    c.node_id = "bad id";
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL && !l, "id with a space accepted");
    c = ok;
    c.node_id = NULL;
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "NULL id accepted");
    c = ok;
    c.ns = "0123456789012345678901234567890123456789012345678901234567890123456789";
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "long namespace accepted");
    c = ok;
    c.ns = "tab\there";
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "namespace with a tab accepted");
    c = ok;
    c.port = 70000;
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "port 70000 accepted");
    c = ok;
    c.heartbeat_ms = 500;
    c.timeout_ms = 500;
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "timeout == heartbeat accepted");
    c = ok;
    c.max_msg = 100;
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "max_msg 100 accepted");
    c = ok;
    c.bind_addr = "127.0.0.1/x";
    CHECK(link_create(&l, &c, err, sizeof err) == CAIRN_EINVAL, "bad bind address accepted");
    CHECK(link_create(&l, NULL, err, sizeof err) == CAIRN_EINVAL, "NULL config accepted");

    /* A port in use is an I/O error that names the endpoint. */
    struct link *a = NULL, *b = NULL;
    CHECK(link_create(&a, &ok, err, sizeof err) == 0, "create: %s", err);
    if (a) {
        c = ok;
        c.node_id = "n2";
        c.secret = "the ZAP thread must stop on this failure too";
        c.port = link_port(a);
        int rc = link_create(&b, &c, err, sizeof err);
        CHECK(rc == CAIRN_EIO && !b && strstr(err, "bind"), "second bind on port %d: rc %d '%s'", c.port, rc, err);
        CHECK(link_connect(a, "udp://1.2.3.4:5", err, sizeof err) == CAIRN_EINVAL, "udp endpoint accepted");
        CHECK(link_connect(a, "tcp://nohost", err, sizeof err) == CAIRN_EINVAL, "endpoint without port accepted");
        CHECK(link_connect(a, "tcp://127.0.0.1:1", err, sizeof err) == 0, "connect: %s", err);
        CHECK(link_connect(a, "tcp://127.0.0.1:1", err, sizeof err) == 0, "second connect: %s", err);
        CHECK(link_disconnect(a, "tcp://127.0.0.1:1") == 0, "disconnect");
        CHECK(link_disconnect(a, "tcp://127.0.0.1:1") == CAIRN_ENOTFOUND, "second disconnect found something");
        CHECK(link_send(a, "nobody", LINK_T_COMMAND, "x", 1) == CAIRN_ENOTFOUND, "send to nobody");
        CHECK(link_send(a, NULL, LINK_T_EVENT, "x", 1) == 0, "broadcast to no peers");
        CHECK(link_send(a, NULL, LINK_T_HELLO, "x", 1) == CAIRN_EINVAL, "internal type sent");
        CHECK(link_send(a, NULL, 64, "x", 1) == CAIRN_EINVAL, "type 64 sent");
        CHECK(link_send(a, NULL, LINK_T_EVENT, NULL, 3) == CAIRN_EINVAL, "NULL payload with length");
        CHECK(link_send(a, NULL, LINK_T_EVENT, "x", LINK_MAX_MSG_DEFAULT + 1) == CAIRN_ERANGE, "oversize sent");
        struct link_msg m;
        CHECK(link_poll(a, 0, &m) == 0, "poll of an idle link returned something");
        int64_t t0 = clock_ns();
        CHECK(link_poll(a, 50, &m) == 0, "timed poll returned something");
        CHECK(clock_ns() - t0 >= 45 * MS, "poll(50) returned after %lld ms", (long long)((clock_ns() - t0) / MS));
    }
    link_release(a);
    link_release(NULL);
}

/* ---- talking -------------------------------------------------------------------------------- */

static void test_pair(const char *secret)
{
    struct node a, b;
    if (node_open(&a, "alpha", "ns1", secret, 0, 0) || node_open(&b, "beta", "ns1", secret, 0, 0))
        return;
    struct node *all[] = {&a, &b};
    CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "connect: %s", errbuf);
    CHECK(wait_up(all, 2, &a, "beta", 10000) && wait_up(all, 2, &b, "alpha", 10000), "pair (%s) never came up",
          secret ? "secret" : "plain");
    CHECK(count_ev(&a, LINK_EV_PEER_UP, "beta", 0, NULL) == 1 && count_ev(&b, LINK_EV_PEER_UP, "alpha", 0, NULL) == 1,
          "up notices: a %zu, b %zu", count_ev(&a, LINK_EV_PEER_UP, "beta", 0, NULL),
          count_ev(&b, LINK_EV_PEER_UP, "alpha", 0, NULL));

    exchange(all, 2, &b, &a, "command from beta");
    exchange(all, 2, &a, &b, "reply from alpha");
    /* Types come through, empty payloads too. */
    CHECK(link_send(a.l, NULL, LINK_T_EVENT, NULL, 0) == 1, "empty broadcast");
    struct got_ctx gc = {&b, LINK_EV_MESSAGE, "alpha", "", 1};
    CHECK(pump_until(all, 2, 5000, got, &gc), "empty message lost");
    CHECK(count_ev(&b, LINK_EV_MESSAGE, "alpha", LINK_T_EVENT, "") == 1, "empty event type");

    /* A large message arrives whole. */
    size_t big = 3 << 20;
    uint8_t *buf = malloc(big);
    uint64_t sum = 0, state = 7;
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)test_rand_u64(&state);
    memcpy(buf, "BIG", 4);
    for (size_t i = 0; i < big; i++)
        sum += buf[i];
    CHECK(link_send(b.l, "alpha", LINK_T_SNAPSHOT, buf, big) == 1, "big send");
    CHECK(wait_msg(all, 2, &a, "beta", "BIG", 10000), "big message lost");
    for (size_t i = 0; i < a.n_evs; i++)
        if (!strcmp(a.evs[i].data, "BIG"))
            CHECK(a.evs[i].len == big && a.evs[i].sum == sum && a.evs[i].type == LINK_T_SNAPSHOT,
                  "big message len %zu sum %llu type %d", a.evs[i].len, (unsigned long long)a.evs[i].sum,
                  a.evs[i].type);
    free(buf);

    /* Order is kept. */
    size_t before = a.n_evs;
    for (int i = 0; i < 300; i++) {
        char t[32];
        snprintf(t, sizeof t, "seq %d", i);
        CHECK(link_send(b.l, "alpha", LINK_T_EVENT, t, strlen(t)) == 1, "seq send %d", i);
    }
    CHECK(wait_msg(all, 2, &a, "beta", "seq 299", 10000), "sequence incomplete");
    int next = 0;
    for (size_t i = before; i < a.n_evs; i++)
        if (!strncmp(a.evs[i].data, "seq ", 4)) {
            CHECK(atoi(a.evs[i].data + 4) == next, "got '%s', expected seq %d", a.evs[i].data, next);
            next++;
        }
    CHECK_EQ_INT(next, 300);

    struct link_peer peers[4];
    CHECK(link_peers(a.l, peers, 4) == 1 && !strcmp(peers[0].id, "beta") && peers[0].incoming && !peers[0].outgoing,
          "a's peers: %s in %d out %d", peers[0].id, peers[0].incoming, peers[0].outgoing);
    CHECK(!strcmp(peers[0].addr, "127.0.0.1") && peers[0].port == link_port(b.l) && peers[0].silent_ms < 10000,
          "a's view of beta: addr %s port %d (b listens on %d) silent %lld", peers[0].addr, peers[0].port,
          link_port(b.l), (long long)peers[0].silent_ms);
    CHECK(link_peers(b.l, peers, 4) == 1 && peers[0].outgoing && peers[0].port == link_port(a.l) &&
              !strcmp(peers[0].addr, endpoint_of(&a)),
          "b's view of alpha: %s out %d port %d", peers[0].addr, peers[0].outgoing, peers[0].port);
    struct link_stats st;
    link_get_stats(a.l, &st);
    CHECK(st.malformed == 0 && st.refused == 0 && st.auth_denied == 0 && st.received == 302,
          "a stats: malformed %llu refused %llu denied %llu received %llu", (unsigned long long)st.malformed,
          (unsigned long long)st.refused, (unsigned long long)st.auth_denied, (unsigned long long)st.received);

    /* Disconnect says bye: both sides see the peer go at once. */
    CHECK(link_disconnect(b.l, endpoint_of(&a)) == 0, "disconnect");
    CHECK(wait_event(all, 2, &a, LINK_EV_PEER_DOWN, "beta", 3000), "a did not see beta go");
    CHECK(count_ev(&b, LINK_EV_PEER_DOWN, "alpha", 0, NULL) == 1 || wait_event(all, 2, &b, LINK_EV_PEER_DOWN, "alpha", 3000),
          "b did not report alpha down");
    CHECK(!link_peer_up(a.l, "beta") && !link_peer_up(b.l, "alpha"), "still up after disconnect");
    node_close(&a);
    node_close(&b);
}

static void test_three(void)
{
    struct node a, b, c;
    if (node_open(&a, "a", "", "three", 0, 0) || node_open(&b, "b", "", "three", 0, 0) ||
        node_open(&c, "c", "", "three", 0, 0))
        return;
    struct node *all[] = {&a, &b, &c};
    char ea[64], eb[64];
    snprintf(ea, sizeof ea, "%s", endpoint_of(&a));
    snprintf(eb, sizeof eb, "%s", endpoint_of(&b));
    CHECK(link_connect(b.l, ea, errbuf, sizeof errbuf) == 0, "b->a");
    CHECK(link_connect(c.l, ea, errbuf, sizeof errbuf) == 0, "c->a");
    CHECK(link_connect(c.l, eb, errbuf, sizeof errbuf) == 0, "c->b");
    CHECK(link_connect(a.l, eb, errbuf, sizeof errbuf) == 0, "a->b (second connection between a and b)");
    bool up = wait_up(all, 3, &a, "b", 10000) && wait_up(all, 3, &a, "c", 10000) && wait_up(all, 3, &b, "a", 10000) &&
              wait_up(all, 3, &b, "c", 10000) && wait_up(all, 3, &c, "a", 10000) && wait_up(all, 3, &c, "b", 10000);
    CHECK(up, "three nodes not all up");
    pump_for(all, 3, 300); /* let a's second connection to b finish its handshake */
    CHECK(count_ev(&a, LINK_EV_PEER_UP, "b", 0, NULL) == 1, "a saw b come up %zu times",
          count_ev(&a, LINK_EV_PEER_UP, "b", 0, NULL));
    struct link_peer peers[4];
    CHECK(link_peers(a.l, peers, 4) == 2, "a has %zu peers", link_peers(a.l, peers, 4));
    CHECK(link_peers(a.l, peers, 1) == 2, "link_peers with max 1 says %zu", link_peers(a.l, peers, 1));

    /* Broadcast reaches every peer exactly once, whatever the number of connections. */
    CHECK(link_send(a.l, NULL, LINK_T_EVENT, "event 1", 7) == 2, "a's broadcast count");
    CHECK(link_send(c.l, NULL, LINK_T_EVENT, "from c", 6) == 2, "c's broadcast count");
    CHECK(link_send(b.l, NULL, LINK_T_EVENT, "from b", 6) == 2, "b's broadcast count");
    CHECK(wait_msg(all, 3, &b, "a", "event 1", 5000) && wait_msg(all, 3, &c, "a", "event 1", 5000), "event 1 lost");
    CHECK(wait_msg(all, 3, &a, "c", "from c", 5000) && wait_msg(all, 3, &b, "c", "from c", 5000), "c's broadcast lost");
    CHECK(wait_msg(all, 3, &a, "b", "from b", 5000) && wait_msg(all, 3, &c, "b", "from b", 5000), "b's broadcast lost");
    pump_for(all, 3, 300);
    CHECK(count_ev(&b, LINK_EV_MESSAGE, "a", 0, "event 1") == 1 && count_ev(&c, LINK_EV_MESSAGE, "a", 0, "event 1") == 1,
          "event 1 copies: b %zu c %zu", count_ev(&b, LINK_EV_MESSAGE, "a", 0, "event 1"),
          count_ev(&c, LINK_EV_MESSAGE, "a", 0, "event 1"));
    CHECK(count_ev(&a, LINK_EV_MESSAGE, "b", 0, "from b") == 1, "a got b's broadcast %zu times",
          count_ev(&a, LINK_EV_MESSAGE, "b", 0, "from b"));
    /* Directed messages both ways on every pair. */
    exchange(all, 3, &a, &b, "a to b");
    exchange(all, 3, &b, &a, "b to a");
    exchange(all, 3, &a, &c, "a to c");
    exchange(all, 3, &c, &a, "c to a");
    exchange(all, 3, &b, &c, "b to c");
    exchange(all, 3, &c, &b, "c to b");

    /* Release says bye: the others see c go long before any timeout (4 s default). */
    int64_t t0 = clock_ns();
    node_close(&c);
    CHECK(wait_event(all, 2, &a, LINK_EV_PEER_DOWN, "c", 3000) && wait_event(all, 2, &b, LINK_EV_PEER_DOWN, "c", 3000),
          "c's departure not seen");
    CHECK(clock_ns() - t0 < 3500 * MS, "bye took %lld ms", (long long)((clock_ns() - t0) / MS));
    exchange(all, 2, &a, &b, "still talking");
    node_close(&a);
    node_close(&b);
}

/* Nodes that must never talk: nothing is delivered and no peer comes up. */
static void expect_apart(struct node *a, struct node *b, int ms, const char *what)
{
    struct node *all[] = {a, b};
    int64_t end = clock_ns() + (int64_t)ms * MS;
    int sends = 0;
    while (clock_ns() < end) {
        pump_once(all, 2, 5);
        if (link_send(b->l, NULL, LINK_T_COMMAND, "let me in", 9) > 0 ||
            link_send(a->l, NULL, LINK_T_COMMAND, "let me in", 9) > 0)
            sends++;
    }
    CHECK(sends == 0, "%s: %d sends found a peer", what, sends);
    CHECK(count_ev(a, LINK_EV_MESSAGE, NULL, 0, NULL) == 0 && count_ev(b, LINK_EV_MESSAGE, NULL, 0, NULL) == 0,
          "%s: messages delivered (a %zu, b %zu)", what, count_ev(a, LINK_EV_MESSAGE, NULL, 0, NULL),
          count_ev(b, LINK_EV_MESSAGE, NULL, 0, NULL));
    CHECK(count_ev(a, LINK_EV_PEER_UP, NULL, 0, NULL) == 0 && count_ev(b, LINK_EV_PEER_UP, NULL, 0, NULL) == 0,
          "%s: a peer came up", what);
    CHECK(!link_peer_up(a->l, b->id) && !link_peer_up(b->l, a->id), "%s: peer up", what);
}

static void test_secret_mismatch(void)
{
    struct {
        const char *sa, *sb, *what;
    } cases[] = {
        {"one secret", "another secret", "different secrets"},
        {"one secret", NULL, "connector without a secret"},
        {NULL, "one secret", "listener without a secret"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct node a, b;
        if (node_open(&a, "a", "", cases[i].sa, 0, 0) || node_open(&b, "b", "", cases[i].sb, 0, 0))
            return;
        CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "connect");
        expect_apart(&a, &b, 2000, cases[i].what);
        struct link_stats sa, sb;
        link_get_stats(a.l, &sa);
        link_get_stats(b.l, &sb);
        CHECK(sa.handshake_failed + sb.handshake_failed > 0, "%s: no handshake failure counted", cases[i].what);
        node_close(&a);
        node_close(&b);
    }
}

/* ---- raw peers ------------------------------------------------------------------------------ */

static void *raw_dealer(void *ctx, int port, const uint8_t *server_pk, const uint8_t *pk, const uint8_t *sk)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (server_pk) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pk, 32);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pk, 32);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sk, 32);
    }
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(s, ep);
    return s;
}

/* Sends a message built from a well-formed header, then tampered with. */
static void raw_send(void *s, int type, const char *sender, const void *p, size_t len, int tamper_at, int tamper_val)
{
    struct link_hdr h = {.version = LINK_VERSION, .type = (uint8_t)type, .len = (uint32_t)len};
    snprintf(h.sender, sizeof h.sender, "%s", sender);
    uint8_t hdr[LINK_HDR_SIZE];
    link_hdr_encode(&h, hdr);
    if (tamper_at >= 0)
        hdr[tamper_at] = (uint8_t)tamper_val;
    if (zmq_send(s, hdr, sizeof hdr, ZMQ_SNDMORE | ZMQ_DONTWAIT) == (int)sizeof hdr)
        zmq_send(s, len ? p : "", len, ZMQ_DONTWAIT);
}

static void raw_hello(void *s, const char *sender, const char *ns)
{
    char p[128];
    snprintf(p, sizeof p, "{\"namespace\":\"%s\",\"port\":0}", ns);
    raw_send(s, LINK_T_HELLO, sender, p, strlen(p), -1, 0);
}

/* Type of the next message on a raw socket within ms (-1 if none). */
static int raw_recv_type(void *s, int ms, struct node **all, int n)
{
    int64_t end = clock_ns() + (int64_t)ms * MS;
    while (clock_ns() < end) {
        pump_once(all, n, 2);
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0) {
            int type = zmq_msg_size(&m) == LINK_HDR_SIZE ? ((uint8_t *)zmq_msg_data(&m))[3] : -2;
            while (zmq_msg_more(&m)) {
                zmq_msg_close(&m);
                zmq_msg_init(&m);
                zmq_msg_recv(&m, s, 0);
            }
            zmq_msg_close(&m);
            return type;
        }
        zmq_msg_close(&m);
    }
    return -1;
}

static void test_zap(void)
{
    struct node a;
    if (node_open(&a, "a", "", "zap secret", 0, 0))
        return;
    struct node *all[] = {&a};
    uint8_t cpk[32], csk[32], rpk[32], rsk[32];
    CHECK(link_curve_keypair("zap secret", cpk, csk) == 0, "keypair");
    crypto_box_keypair(rpk, rsk);
    void *ctx = zmq_ctx_new();
    /* Knows the cluster's public key but not its secret: the crypto handshake works, ZAP says no. */
    void *intruder = raw_dealer(ctx, link_port(a.l), cpk, rpk, rsk);
    int64_t end = clock_ns() + 2000 * MS;
    for (int i = 0; clock_ns() < end && i < 1000; i++) {
        raw_hello(intruder, "intruder", "");
        pump_once(all, 1, 10);
    }
    struct link_stats st;
    link_get_stats(a.l, &st);
    CHECK(st.auth_denied >= 1, "ZAP refused nobody (auth_denied %llu)", (unsigned long long)st.auth_denied);
    CHECK(count_ev(&a, LINK_EV_PEER_UP, NULL, 0, NULL) == 0 && !link_peer_up(a.l, "intruder"), "intruder admitted");
    /* A peer holding the cluster keypair, speaking the documented wire format, is admitted. */
    void *member = raw_dealer(ctx, link_port(a.l), cpk, cpk, csk);
    int type = -1;
    for (int i = 0; i < 50 && type != LINK_T_WELCOME; i++) {
        raw_hello(member, "member", "");
        type = raw_recv_type(member, 200, all, 1);
    }
    CHECK(type == LINK_T_WELCOME, "raw member got type %d, not WELCOME", type);
    CHECK(wait_up(all, 1, &a, "member", 5000), "raw member not up");
    raw_send(member, LINK_T_REPORT, "member", "report", 6, -1, 0);
    CHECK(wait_msg(all, 1, &a, "member", "report", 5000), "raw member's report lost");
    zmq_close(intruder);
    zmq_close(member);
    zmq_ctx_term(ctx);
    node_close(&a);
}

static void test_namespace(void)
{
    struct node a, b;
    if (node_open(&a, "a", "alpha", "same", 0, 0) || node_open(&b, "b", "beta", "same", 0, 0))
        return;
    CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "connect");
    expect_apart(&a, &b, 1500, "different namespaces");
    struct link_stats sa, sb;
    link_get_stats(a.l, &sa);
    link_get_stats(b.l, &sb);
    CHECK(sa.refused >= 1 && sb.refused >= 1, "refusals a %llu b %llu", (unsigned long long)sa.refused,
          (unsigned long long)sb.refused);
    CHECK(sa.refused <= 2, "a refused %llu times: b kept retrying", (unsigned long long)sa.refused);
    node_close(&a);
    node_close(&b);

    /* A node that connects to itself refuses itself. */
    struct node s;
    if (node_open(&s, "self", "", NULL, 0, 0))
        return;
    struct node *one[] = {&s};
    CHECK(link_connect(s.l, endpoint_of(&s), errbuf, sizeof errbuf) == 0, "self connect");
    pump_for(one, 1, 800);
    struct link_stats ss;
    link_get_stats(s.l, &ss);
    CHECK(count_ev(&s, LINK_EV_PEER_UP, NULL, 0, NULL) == 0 && ss.refused >= 1, "self: up %zu refused %llu",
          count_ev(&s, LINK_EV_PEER_UP, NULL, 0, NULL), (unsigned long long)ss.refused);
    node_close(&s);
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static bool monitor_saw(void *mon, int event, int ms, struct node **all, int n)
{
    int64_t end = clock_ns() + (int64_t)ms * MS;
    while (clock_ns() < end) {
        pump_once(all, n, 2);
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) >= 0) {
            uint16_t ev = 0;
            if (zmq_msg_size(&m) == 6)
                memcpy(&ev, zmq_msg_data(&m), 2);
            bool more = zmq_msg_more(&m);
            zmq_msg_close(&m);
            zmq_msg_init(&m);
            if (more)
                zmq_msg_recv(&m, mon, 0);
            if (ev == event) {
                zmq_msg_close(&m);
                return true;
            }
        }
        zmq_msg_close(&m);
    }
    return false;
}

static void test_garbage(void)
{
    struct node a, b;
    if (node_open(&a, "a", "", NULL, 0, 0) || node_open(&b, "b", "", NULL, 0, 0))
        return;
    struct node *all[] = {&a, &b};
    CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "connect");
    CHECK(wait_up(all, 2, &a, "b", 10000) && wait_up(all, 2, &b, "a", 10000), "a, b not up");
    int port = link_port(a.l);

    /* Raw TCP: random bytes, a ZMTP greeting followed by junk, an idle connection. */
    uint64_t state = 99;
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)test_rand_u64(&state);
    int fds[3];
    fds[0] = tcp_connect(port);
    fds[1] = tcp_connect(port);
    fds[2] = tcp_connect(port);
    CHECK(fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0, "raw tcp connect");
    if (fds[0] >= 0)
        CHECK(write(fds[0], junk, sizeof junk) >= 0, "write junk");
    uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    memcpy(greet + 12, "NULL", 4);
    if (fds[1] >= 0) {
        CHECK(write(fds[1], greet, sizeof greet) == sizeof greet, "write greeting");
        CHECK(write(fds[1], junk, 1024) >= 0, "write junk 2");
    }
    pump_for(all, 2, 300);
    exchange(all, 2, &a, &b, "after raw tcp");
    exchange(all, 2, &b, &a, "after raw tcp, back");
    /* Random bytes may parse as ZMTP 1.0 frames, which then count as malformed messages. */
    struct link_stats st0, st;
    link_get_stats(a.l, &st0);

    /* A plain ZeroMQ DEALER sending malformed messages is dropped, then cut. */
    void *ctx = zmq_ctx_new();
    void *bad = raw_dealer(ctx, port, NULL, NULL, NULL);
    zmq_socket_monitor(bad, "inproc://bad-mon", ZMQ_EVENT_DISCONNECTED);
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    zmq_connect(mon, "inproc://bad-mon");
    /* An application message before any HELLO is not malformed: the answer is WHO. */
    raw_send(bad, LINK_T_COMMAND, "bad", "hi", 2, -1, 0);
    int type = raw_recv_type(bad, 3000, all, 2);
    CHECK(type == LINK_T_WHO, "message before HELLO answered with type %d", type);
    zmq_send(bad, "single frame", 12, ZMQ_DONTWAIT);                 /* 1 */
    zmq_send(bad, "short", 5, ZMQ_SNDMORE | ZMQ_DONTWAIT);               /* 2 */
    zmq_send(bad, "", 0, ZMQ_DONTWAIT);
    raw_send(bad, LINK_T_COMMAND, "bad", "x", 1, 2, 9);    /* 3: version 9 */
    raw_send(bad, LINK_T_COMMAND, "bad", "x", 1, 3, 99);   /* 4: type 99 */
    pump_for(all, 2, 300);
    link_get_stats(a.l, &st);
    CHECK(st.malformed - st0.malformed == 4 && st.cut == st0.cut, "after 4 bad messages: malformed +%llu cut +%llu",
          (unsigned long long)(st.malformed - st0.malformed), (unsigned long long)(st.cut - st0.cut));
    exchange(all, 2, &b, &a, "between bad messages");
    raw_send(bad, LINK_T_COMMAND, "bad", "x", 1, 7, 9);    /* 5: length 9, payload 1 */
    CHECK(monitor_saw(mon, ZMQ_EVENT_DISCONNECTED, 3000, all, 2), "bad dealer not cut after 5 strikes");
    link_get_stats(a.l, &st);
    CHECK(st.malformed - st0.malformed == 5 && st.cut - st0.cut == 1, "malformed +%llu cut +%llu",
          (unsigned long long)(st.malformed - st0.malformed), (unsigned long long)(st.cut - st0.cut));
    exchange(all, 2, &a, &b, "after the cut");

    /* It reconnects (ZeroMQ does) under a new routing id: each kind of bad message again. */
    void *bad2 = raw_dealer(ctx, port, NULL, NULL, NULL);
    zmq_send(bad2, "a", 1, ZMQ_SNDMORE | ZMQ_DONTWAIT);                  /* three frames */
    zmq_send(bad2, "b", 1, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(bad2, "c", 1, ZMQ_DONTWAIT);
    raw_send(bad2, LINK_T_COMMAND, "bad", "x", 1, 0, 'X'); /* magic */
    raw_send(bad2, LINK_T_COMMAND, "bad", "x", 1, 4, 0x40); /* length field 1 GiB */
    raw_send(bad2, LINK_T_HELLO, "bad", "not json", 8, -1, 0);
    raw_send(bad2, LINK_T_HELLO, "bad", "{\"namespace\":3}", 15, -1, 0);
    pump_for(all, 2, 300);
    link_get_stats(a.l, &st);
    CHECK(st.malformed - st0.malformed == 10 && st.cut - st0.cut == 2, "second bad dealer: malformed +%llu cut +%llu",
          (unsigned long long)(st.malformed - st0.malformed), (unsigned long long)(st.cut - st0.cut));

    /* A peer that completed its handshake, then misbehaves, goes down when cut. */
    void *turn = raw_dealer(ctx, port, NULL, NULL, NULL);
    type = -1;
    for (int i = 0; i < 20 && type != LINK_T_WELCOME; i++) {
        raw_hello(turn, "turncoat", "");
        type = raw_recv_type(turn, 300, all, 2);
    }
    CHECK(type == LINK_T_WELCOME, "turncoat not welcomed (%d)", type);
    CHECK(wait_up(all, 2, &a, "turncoat", 3000), "turncoat not up");
    raw_send(turn, LINK_T_COMMAND, "someone-else", "x", 1, -1, 0); /* sender changed */
    raw_send(turn, LINK_T_WELCOME, "turncoat", "{}", 2, -1, 0);    /* wrong direction */
    for (int i = 0; i < 3; i++)
        raw_send(turn, LINK_T_COMMAND, "turncoat", "x", 1, 9, ' ');
    CHECK(wait_event(all, 2, &a, LINK_EV_PEER_DOWN, "turncoat", 3000), "turncoat not reported down");
    CHECK(count_ev(&a, LINK_EV_MESSAGE, "turncoat", 0, NULL) == 0, "turncoat delivered something");
    /* Oversize frames: ZeroMQ's limit closes the connection, nothing is delivered. */
    void *big = raw_dealer(ctx, port, NULL, NULL, NULL);
    size_t n = (size_t)(4 << 20) + 100;
    char *p = calloc(1, n);
    type = -1;
    for (int i = 0; i < 20 && type != LINK_T_WELCOME; i++) {
        raw_hello(big, "bigmouth", "");
        type = raw_recv_type(big, 300, all, 2);
    }
    raw_send(big, LINK_T_COMMAND, "bigmouth", p, n, -1, 0);
    free(p);
    pump_for(all, 2, 500);
    CHECK(count_ev(&a, LINK_EV_MESSAGE, "bigmouth", 0, NULL) == 0, "oversize message delivered");

    exchange(all, 2, &a, &b, "still serving");
    exchange(all, 2, &b, &a, "still serving, back");
    CHECK(link_peer_up(a.l, "b") && count_ev(&a, LINK_EV_PEER_DOWN, "b", 0, NULL) == 0, "legit peer lost");
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    zmq_close(mon);
    zmq_close(bad);
    zmq_close(bad2);
    zmq_close(turn);
    zmq_close(big);
    zmq_ctx_term(ctx);
    node_close(&a);
    node_close(&b);
}

/* ---- strikes from the application --------------------------------------------------------------- */

/* Polls x for up to ms until a message from peer comes; strikes it when strike is set. */
static bool take_and_strike(struct node *x, const char *peer, bool strike, int ms)
{
    int64_t end = clock_ns() + (int64_t)ms * MS;
    struct link_msg m;
    while (clock_ns() < end) {
        if (link_poll(x->l, 10, &m) != 1)
            continue;
        record(x, &m);
        if (m.event == LINK_EV_MESSAGE && !strcmp(m.peer, peer)) {
            if (strike)
                link_strike(x->l, peer, "test: bad payload");
            return true;
        }
    }
    return false;
}

/* link_strike counts against the connection a message came on, with the frame strikes:
 * LINK_MAX_STRIKES cut it, on the bound side (the connector comes back under a new
 * routing id) and on the connecting side (its connection is closed); other peers and
 * the counts below the limit are untouched. */
static void test_app_strikes(void)
{
    struct node a, b, c;
    if (node_open(&a, "a", "", NULL, 0, 0) || node_open(&b, "b", "", NULL, 0, 0) ||
        node_open(&c, "c", "", NULL, 0, 0))
        return;
    struct node *all[] = {&a, &b, &c};
    CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "b connects to a");
    CHECK(link_connect(c.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "c connects to a");
    CHECK(wait_up(all, 3, &a, "b", 10000) && wait_up(all, 3, &b, "a", 10000) && wait_up(all, 3, &a, "c", 10000) &&
              wait_up(all, 3, &c, "a", 10000),
          "a, b, c not up");
    link_strike(a.l, "nobody", "no such peer"); /* a no-op */
    struct link_stats st0, st;
    link_get_stats(a.l, &st0);
    CHECK(st0.malformed == 0, "no strikes yet: %llu", (unsigned long long)st0.malformed);

    /* a (the bound side) strikes b's messages: b stays up until the fifth. */
    struct node *only_a[] = {&a}, *only_b[] = {&b};
    for (int i = 1; i <= LINK_MAX_STRIKES; i++) {
        char text[32];
        snprintf(text, sizeof text, "bad %d", i);
        CHECK(link_send(b.l, "a", LINK_T_COMMAND, text, strlen(text)) == 1, "b sends '%s'", text);
        CHECK(take_and_strike(&a, "b", true, 5000), "a got '%s'", text);
        link_get_stats(a.l, &st);
        CHECK(st.malformed - st0.malformed == (uint64_t)i, "strike %d counted: %llu", i,
              (unsigned long long)(st.malformed - st0.malformed));
        if (i < LINK_MAX_STRIKES)
            CHECK(link_peer_up(a.l, "b") && st.cut == st0.cut, "b still up after %d strikes", i);
    }
    CHECK(st.cut - st0.cut == 1 && !link_peer_up(a.l, "b"), "b cut after %d strikes (cut +%llu)", LINK_MAX_STRIKES,
          (unsigned long long)(st.cut - st0.cut));
    CHECK(wait_event(only_b, 1, &b, LINK_EV_PEER_DOWN, "a", 5000), "b saw its connection cut");
    CHECK(link_peer_up(a.l, "c"), "c untouched");
    exchange(all, 3, &c, &a, "c still served");
    /* b reconnects (a new routing id), its strikes start again. */
    CHECK(wait_up(all, 3, &a, "b", 10000) && wait_up(all, 3, &b, "a", 10000), "b did not come back");
    exchange(all, 3, &b, &a, "b back");
    link_get_stats(a.l, &st0);

    /* c (the connecting side) strikes a's messages: it closes its own connection. */
    for (int i = 1; i <= LINK_MAX_STRIKES; i++) {
        char text[32];
        snprintf(text, sizeof text, "worse %d", i);
        CHECK(link_send(a.l, "c", LINK_T_COMMAND, text, strlen(text)) == 1, "a sends '%s'", text);
        CHECK(take_and_strike(&c, "a", true, 5000), "c got '%s'", text);
    }
    CHECK(!link_peer_up(c.l, "a"), "c closed its connection to a");
    link_get_stats(c.l, &st);
    CHECK(st.malformed == LINK_MAX_STRIKES && st.cut == 1, "c: malformed %llu cut %llu", (unsigned long long)st.malformed,
          (unsigned long long)st.cut);
    CHECK(wait_event(only_a, 1, &a, LINK_EV_PEER_DOWN, "c", 10000), "a saw c go");
    exchange(all, 3, &a, &b, "b still served");
    link_get_stats(a.l, &st);
    CHECK(st.malformed == st0.malformed, "a struck nothing meanwhile");
    node_close(&a);
    node_close(&b);
    node_close(&c);
}

/* ---- liveness ---------------------------------------------------------------------------------- */

static void test_timeout(void)
{
    const int hb = 100, timeout = 700;
    struct node a, b;
    if (node_open(&a, "a", "", "t", hb, timeout) || node_open(&b, "b", "", "t", hb, timeout))
        return;
    struct node *all[] = {&a, &b};
    CHECK(link_connect(b.l, endpoint_of(&a), errbuf, sizeof errbuf) == 0, "connect");
    CHECK(wait_up(all, 2, &a, "b", 10000) && wait_up(all, 2, &b, "a", 10000), "not up");
    pump_for(all, 2, 3 * timeout); /* heartbeats keep an idle pair up */
    CHECK(count_ev(&a, LINK_EV_PEER_DOWN, NULL, 0, NULL) == 0 && count_ev(&b, LINK_EV_PEER_DOWN, NULL, 0, NULL) == 0,
          "idle pair went down");

    /* b stops polling (its process alive, its TCP connection answered by ZeroMQ). */
    struct node *only_a[] = {&a};
    int64_t t0 = clock_ns();
    bool down = wait_event(only_a, 1, &a, LINK_EV_PEER_DOWN, "b", 10000);
    int64_t took = (clock_ns() - t0) / MS;
    CHECK(down, "silent b never reported down");
    CHECK(took >= timeout - 2 * hb, "b reported down after %lld ms, before the %d ms timeout", (long long)took, timeout);
    /* b comes back: both see each other again. */
    CHECK(wait_up(all, 2, &a, "b", 10000) && wait_up(all, 2, &b, "a", 10000), "b did not come back");
    exchange(all, 2, &a, &b, "welcome back");
    exchange(all, 2, &b, &a, "thanks");
    node_close(&a);
    node_close(&b);

    /* A peer process killed outright: its connection closes and it is reported down well
     * before a 20 s timeout. */
    struct node k;
    if (node_open(&k, "keeper", "", NULL, hb, 20000))
        return;
    struct node *one[] = {&k};
    int port = link_port(k.l);
    pid_t pid = fork();
    if (pid == 0) {
        struct link *c = NULL;
        struct link_config cfg = {.node_id = "doomed", .bind_addr = "127.0.0.1", .heartbeat_ms = hb, .timeout_ms = 20000};
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        if (link_create(&c, &cfg, NULL, 0) || link_connect(c, ep, NULL, 0))
            _exit(1);
        struct link_msg m;
        for (int i = 0; i < 60000; i++) /* bounded: 60 s at most */
            link_poll(c, 1, &m);
        _exit(0);
    }
    CHECK(pid > 0, "fork");
    if (pid > 0) {
        CHECK(wait_up(one, 1, &k, "doomed", 10000), "child never came up");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        t0 = clock_ns();
        down = wait_event(one, 1, &k, LINK_EV_PEER_DOWN, "doomed", 15000);
        took = (clock_ns() - t0) / MS;
        CHECK(down && took < 10000, "killed peer reported down: %d after %lld ms", down, (long long)took);
    }
    node_close(&k);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    RUN(test_header);
    RUN(test_keys_and_hmac);
    RUN(test_config);
    RUN(test_pair, NULL);
    RUN(test_pair, "pair secret");
    RUN(test_three);
    RUN(test_secret_mismatch);
    RUN(test_zap);
    RUN(test_namespace);
    RUN(test_garbage);
    RUN(test_app_strikes);
    RUN(test_timeout);
    zsys_shutdown();
    return test_main_end();
}
