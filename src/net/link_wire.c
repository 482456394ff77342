/* The link's wire format and keys (link.h): the message header, the CURVE keypair and
 * the HMAC challenge derived from the cluster secret, reading a message's frames and
 * checking them, and the JSON payload of HELLO and WELCOME. */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "net/link_int.h"

_Static_assert(crypto_auth_KEYBYTES == 32 && crypto_auth_BYTES == LINK_MAC_BYTES, "crypto_auth sizes");
_Static_assert(crypto_box_PUBLICKEYBYTES == LINK_KEY_BYTES && crypto_box_SECRETKEYBYTES == LINK_KEY_BYTES,
               "curve25519 key sizes");
_Static_assert(crypto_box_SEEDBYTES == 32, "seed size");
_Static_assert(4 + 4 + LINK_ID_MAX == LINK_HDR_SIZE, "header layout");

static const char *const CURVE_CONTEXT = "cairn link curve v1";
static const char *const AUTH_CONTEXT = "cairn link auth v1";

/* ---- wire header ---------------------------------------------------------------- */

bool link_valid_id(const char *s)
{
    if (!s)
        return false;
    size_t n = strnlen(s, LINK_ID_MAX);
    if (n == 0 || n >= LINK_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

static bool valid_type(unsigned t)
{
    return (t >= LINK_T_HELLO && t <= LINK_T_WHO) || (t >= LINK_T_APP_FIRST && t <= LINK_T_APP_LAST);
}

void link_hdr_encode(const struct link_hdr *h, uint8_t out[LINK_HDR_SIZE])
{
    memset(out, 0, LINK_HDR_SIZE);
    out[0] = 'c';
    out[1] = 'l';
    out[2] = h->version;
    out[3] = h->type;
    out[4] = (uint8_t)(h->len >> 24);
    out[5] = (uint8_t)(h->len >> 16);
    out[6] = (uint8_t)(h->len >> 8);
    out[7] = (uint8_t)h->len;
    memcpy(out + 8, h->sender, strnlen(h->sender, LINK_ID_MAX - 1));
}

int link_hdr_decode(const void *buf, size_t n, struct link_hdr *out, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    if (n != LINK_HDR_SIZE)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "header of %zu bytes, expected %d", n, LINK_HDR_SIZE);
    if (b[0] != 'c' || b[1] != 'l')
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad magic %02x %02x", b[0], b[1]);
    if (b[2] != LINK_VERSION)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "protocol version %u, ours is %d", b[2], LINK_VERSION);
    if (!valid_type(b[3]))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown message type %u", b[3]);
    const uint8_t *id = b + 8;
    size_t len = 0;
    while (len < LINK_ID_MAX && id[len])
        len++;
    if (len == LINK_ID_MAX)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id not terminated");
    if (len == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "empty sender id");
    for (size_t i = 0; i < len; i++)
        if (id[i] <= 0x20 || id[i] >= 0x7f)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id holds byte 0x%02x", id[i]);
    for (size_t i = len; i < LINK_ID_MAX; i++)
        if (id[i])
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "sender id padding not zero");
    out->version = b[2];
    out->type = b[3];
    out->len = (uint32_t)b[4] << 24 | (uint32_t)b[5] << 16 | (uint32_t)b[6] << 8 | b[7];
    memcpy(out->sender, id, len + 1);
    return 0;
}

/* ---- keys and the HMAC challenge ---------------------------------------------------- */

static int derive(const char *secret, const char *context, uint8_t out[32])
{
    if (!secret || !*secret)
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_EIO;
    crypto_generichash(out, 32, (const unsigned char *)secret, strlen(secret), (const unsigned char *)context,
                       strlen(context));
    return 0;
}

int link_curve_keypair(const char *secret, uint8_t pk[LINK_KEY_BYTES], uint8_t sk[LINK_KEY_BYTES])
{
    uint8_t seed[crypto_box_SEEDBYTES];
    int rc = derive(secret, CURVE_CONTEXT, seed);
    if (rc)
        return rc;
    crypto_box_seed_keypair(pk, sk, seed);
    sodium_memzero(seed, sizeof seed);
    return 0;
}

void link_auth_nonce(uint8_t nonce[LINK_NONCE_BYTES])
{
    if (sodium_init() >= 0)
        randombytes_buf(nonce, LINK_NONCE_BYTES);
}

int link_auth_challenge(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES], uint8_t mac_out[LINK_MAC_BYTES])
{
    uint8_t key[crypto_auth_KEYBYTES];
    int rc = derive(secret, AUTH_CONTEXT, key);
    if (rc)
        return rc;
    crypto_auth(mac_out, nonce, LINK_NONCE_BYTES, key);
    sodium_memzero(key, sizeof key);
    return 0;
}

int link_auth_verify(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES], const uint8_t mac[LINK_MAC_BYTES])
{
    uint8_t key[crypto_auth_KEYBYTES];
    int rc = derive(secret, AUTH_CONTEXT, key);
    if (rc)
        return rc;
    rc = crypto_auth_verify(mac, nonce, LINK_NONCE_BYTES, key) == 0 ? 0 : CAIRN_EINVAL;
    sodium_memzero(key, sizeof key);
    return rc;
}

/* ---- messages ---------------------------------------------------------------------- */

int link_recv_msg(void *sock, zmq_msg_t *parts, int keep, int *total)
{
    int n = 0;
    for (;;) {
        zmq_msg_t spill;
        zmq_msg_t *m = n < keep ? &parts[n] : &spill;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            if (n == 0)
                return -1;
            break; /* frames of one message arrive together; not reached */
        }
        int more = zmq_msg_more(m);
        if (m == &spill)
            zmq_msg_close(&spill);
        n++;
        if (!more)
            break;
    }
    *total = n;
    return n < keep ? n : keep;
}

void link_close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

int link_check_frames(const struct link *l, zmq_msg_t *parts, int kept, int total, struct link_hdr *h,
                      char *why, size_t whylen)
{
    if (total != 2 || kept != 2)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "%d frames, expected 2", total);
    int rc = link_hdr_decode(zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]), h, why, whylen);
    if (rc)
        return rc;
    size_t body = zmq_msg_size(&parts[1]);
    if (h->len > l->max_msg)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "payload of %u bytes over the %zu limit", h->len, l->max_msg);
    if (body != h->len)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "length field says %u bytes, payload has %zu", h->len, body);
    return 0;
}

/* ---- HELLO and WELCOME: {"namespace", "port"} ------------------------------------------ */

char *link_intro_payload(const struct link *l, size_t *len)
{
    json_t *j = json_pack("{s:s, s:i}", "namespace", l->ns, "port", l->port);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    *len = s ? strlen(s) : 0;
    return s;
}

int link_parse_intro(zmq_msg_t *body, char ns[LINK_NS_MAX], int *port, char *why, size_t whylen)
{
    json_error_t e;
    json_t *j = json_loadb(zmq_msg_data(body), zmq_msg_size(body), JSON_REJECT_DUPLICATES, &e);
    int rc = 0;
    json_t *n = json_object_get(j, "namespace"), *p = json_object_get(j, "port");
    if (!j)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake payload is not JSON: %s", e.text);
    else if (!json_is_string(n) || json_string_length(n) >= LINK_NS_MAX)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake without a namespace of at most %d bytes",
                        LINK_NS_MAX - 1);
    else if (!json_is_integer(p) || json_integer_value(p) < 0 || json_integer_value(p) > 65535)
        rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake without a port in 0..65535");
    else {
        const char *s = json_string_value(n);
        size_t len = json_string_length(n);
        for (size_t i = 0; i < len && !rc; i++)
            if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f)
                rc = cairn_fail(why, whylen, CAIRN_EFORMAT, "handshake namespace holds byte 0x%02x",
                                (unsigned char)s[i]);
        if (!rc) {
            memcpy(ns, s, len + 1);
            *port = (int)json_integer_value(p);
        }
    }
    json_decref(j);
    return rc;
}

const char *link_reject_reason(const void *payload, size_t len, char *dst, size_t n)
{
    json_t *j = json_loadb(payload, len, 0, NULL);
    const char *reason = json_string_value(json_object_get(j, "reason"));
    if (reason)
        link_printable(dst, n, reason, strlen(reason));
    else
        snprintf(dst, n, "%s", "no reason given");
    json_decref(j);
    return dst;
}

/* ---- text for logs ------------------------------------------------------------------- */

const char *link_printable(char *dst, size_t n, const char *s, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < n; i++)
        dst[k++] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    dst[k] = 0;
    return dst;
}

const char *link_unmapped(const char *ip)
{
    return !strncmp(ip, "::ffff:", 7) && strchr(ip + 7, '.') ? ip + 7 : ip;
}

