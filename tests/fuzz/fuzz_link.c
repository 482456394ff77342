/* libFuzzer harness of what the link reads from a peer before it trusts it
 * (net/link_wire.c); the first input byte picks what the rest goes to:
 *   0 the header decoder: what it accepts encodes back to the same bytes, and a header
 *     made from the input encodes and decodes to the same fields exactly when valid;
 *   1 the HELLO / WELCOME payload: what it accepts is a short printable namespace and a
 *     port, and our own payload of those reads back the same;
 *   2 a whole message as a peer sends it (frames over a ZeroMQ inproc pair): received as
 *     link_read_router and link_read_dealer do, it is kept in order and counted, and the
 *     frame check accepts only a valid header and a payload of its length within max_msg;
 *   3 the REJECT reason and the log text of peer bytes: printable and within bounds.
 * A refusal must say why. Built and run by run.sh. */
#include "base/err.h"
#include "net/link_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "fuzz_link: %s:%d: %s\n", __FILE__, __LINE__, #c);    \
            abort();                                                              \
        }                                                                         \
    } while (0)

#define MAX_FRAMES 8

static bool printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

static void header(const uint8_t *b, size_t n)
{
    char why[256] = "";
    struct link_hdr h;
    uint8_t again[LINK_HDR_SIZE];
    if (link_hdr_decode(b, n, &h, why, sizeof why) == 0) {
        CHECK(n == LINK_HDR_SIZE && h.version == LINK_VERSION && link_valid_id(h.sender));
        link_hdr_encode(&h, again);
        CHECK(!memcmp(again, b, LINK_HDR_SIZE)); /* one encoding per header */
    } else {
        CHECK(why[0]);
    }
    /* A header of our own from the input: type, length and sender. */
    if (n < 5)
        return;
    struct link_hdr mine = {.version = LINK_VERSION, .type = b[0]}, back;
    mine.len = (uint32_t)b[1] << 24 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 8 | b[4];
    size_t k = n - 5 < LINK_ID_MAX - 1 ? n - 5 : LINK_ID_MAX - 1;
    memcpy(mine.sender, b + 5, k);
    mine.sender[k] = 0;
    bool valid = link_valid_id(mine.sender) &&
                 ((mine.type >= LINK_T_HELLO && mine.type <= LINK_T_WHO) ||
                  (mine.type >= LINK_T_APP_FIRST && mine.type <= LINK_T_APP_LAST));
    link_hdr_encode(&mine, again);
    int rc = link_hdr_decode(again, sizeof again, &back, why, sizeof why);
    CHECK(valid == (rc == 0));
    CHECK(rc || (back.version == mine.version && back.type == mine.type && back.len == mine.len &&
                 !strcmp(back.sender, mine.sender)));
}

static int parse_intro(const void *b, size_t n, char ns[LINK_NS_MAX], int *port)
{
    char why[256] = "";
    zmq_msg_t m;
    CHECK(zmq_msg_init_size(&m, n) == 0);
    if (n)
        memcpy(zmq_msg_data(&m), b, n);
    int rc = link_parse_intro(&m, ns, port, why, sizeof why);
    zmq_msg_close(&m);
    CHECK(rc == 0 || (rc == CAIRN_EFORMAT && why[0]));
    return rc;
}

static void intro(const uint8_t *b, size_t n)
{
    char ns[LINK_NS_MAX], ns2[LINK_NS_MAX];
    int port = -1, port2 = -1;
    if (parse_intro(b, n, ns, &port))
        return;
    CHECK(strlen(ns) < LINK_NS_MAX && printable(ns) && port >= 0 && port <= 65535);
    struct link *l = calloc(1, sizeof *l);
    CHECK(l);
    memcpy(l->ns, ns, sizeof l->ns);
    l->port = port;
    size_t len;
    char *payload = link_intro_payload(l, &len);
    CHECK(payload);
    CHECK(parse_intro(payload, len, ns2, &port2) == 0 && !strcmp(ns, ns2) && port == port2);
    free(payload);
    free(l);
}

/* Sockets made once: a PAIR that sends as a peer would, and one the link reads. */
static void *ctx, *tx, *rx;

static void frames(const uint8_t *b, size_t n)
{
    if (n < 2)
        return;
    if (!ctx) {
        ctx = zmq_ctx_new();
        tx = ctx ? zmq_socket(ctx, ZMQ_PAIR) : NULL;
        rx = ctx ? zmq_socket(ctx, ZMQ_PAIR) : NULL;
        CHECK(rx && tx && zmq_bind(rx, "inproc://fuzz-link") == 0 && zmq_connect(tx, "inproc://fuzz-link") == 0);
    }
    /* b[0]: how many frames the reader keeps (2 for a DEALER, 3 for the ROUTER, whose
     * first frame is the routing id) and max_msg; then frames as a length byte and
     * that many bytes (cut at the end), at least one. */
    int keep = b[0] & 1 ? 3 : 2;
    static const size_t maxes[] = {0, 1, 72, 4096};
    struct link l = {.max_msg = maxes[(b[0] >> 1) & 3]};
    const uint8_t *f[MAX_FRAMES];
    size_t flen[MAX_FRAMES];
    int sent = 0;
    size_t at = 1;
    do {
        size_t want = at < n ? b[at++] : 0;
        f[sent] = b + at;
        flen[sent] = want < n - at ? want : n - at;
        at += flen[sent];
        sent++;
    } while (at < n && sent < MAX_FRAMES);
    for (int i = 0; i < sent; i++)
        CHECK(zmq_send(tx, f[i], flen[i], i + 1 < sent ? ZMQ_SNDMORE : 0) == (int)flen[i]);
    zmq_pollitem_t it = {.socket = rx, .events = ZMQ_POLLIN};
    CHECK(zmq_poll(&it, 1, 5000) == 1);
    zmq_msg_t parts[3];
    int total = -1;
    int kept = link_recv_msg(rx, parts, keep, &total);
    CHECK(total == sent && kept == (sent < keep ? sent : keep));
    for (int i = 0; i < kept; i++)
        CHECK(zmq_msg_size(&parts[i]) == flen[i] && !memcmp(zmq_msg_data(&parts[i]), f[i], flen[i]));
    CHECK(link_recv_msg(rx, parts + kept, 0, &total) == -1); /* nothing of it is left behind */
    /* As the readers do: after the routing id when there is one. */
    int skip = keep == 3 ? 1 : 0;
    struct link_hdr h;
    char why[256] = "";
    int rc = link_check_frames(&l, parts + skip, kept - skip, total - skip, &h, why, sizeof why);
    if (rc == 0) {
        CHECK(total - skip == 2 && kept - skip == 2 && link_valid_id(h.sender));
        CHECK(h.len <= l.max_msg && zmq_msg_size(&parts[skip + 1]) == h.len);
    } else {
        CHECK(rc == CAIRN_EFORMAT && why[0]);
    }
    link_close_parts(parts, kept);
}

static void text(const uint8_t *b, size_t n)
{
    char dst[200];
    if (n < 1)
        return;
    size_t cap = (size_t)b[0] % sizeof dst + 1; /* then the text */
    b++;
    n--;
    link_reject_reason(b, n, dst, cap);
    CHECK(strlen(dst) < cap && printable(dst));
    link_printable(dst, cap, (const char *)b, n);
    CHECK(strlen(dst) < cap && strlen(dst) <= n && printable(dst));
    char *s = malloc(n + 1);
    CHECK(s);
    memcpy(s, b, n);
    s[n] = 0;
    const char *u = link_unmapped(s);
    CHECK(u >= s && u <= s + strlen(s));
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0:
        header(b, n);
        break;
    case 1:
        intro(b, n);
        break;
    case 2:
        frames(b, n);
        break;
    default:
        text(b, n);
    }
    return 0;
}
