/* Join tokens (jointoken.h). */
#include "net/jointoken.h"

#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"

#define CHECK_BYTES 4
#define RAW_MAX (1 + JOINTOKEN_SECRET_MAX + 1 + JOINTOKEN_NS_MAX + 1 + \
                 JOINTOKEN_MAX_PEERS * (1 + JOINTOKEN_ADDR_MAX) + CHECK_BYTES)

_Static_assert(sizeof JOINTOKEN_PREFIX - 1 + (RAW_MAX * 4 + 2) / 3 + 1 <= JOINTOKEN_TEXT_MAX, "room for a token");

static bool printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return false;
    return true;
}

static void checksum(const uint8_t *p, size_t n, uint8_t out[CHECK_BYTES])
{
    uint8_t h[crypto_generichash_BYTES_MIN];
    crypto_generichash(h, sizeof h, p, n, NULL, 0);
    memcpy(out, h, CHECK_BYTES);
}

/* Appends a length-prefixed field; false when it is too long, too short or not printable. */
static bool put_field(uint8_t *raw, size_t *at, const char *s, size_t min, size_t max)
{
    size_t n = strlen(s);
    if (n < min || n > max || !printable(s, n))
        return false;
    raw[(*at)++] = (uint8_t)n;
    memcpy(raw + *at, s, n);
    *at += n;
    return true;
}

int jointoken_encode(const struct jointoken *t, char out[JOINTOKEN_TEXT_MAX], char *err, size_t errlen)
{
    out[0] = 0;
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium cannot start");
    uint8_t raw[RAW_MAX];
    size_t at = 0;
    if (!put_field(raw, &at, t->secret, 1, JOINTOKEN_SECRET_MAX))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the secret must be 1..%d printable bytes without spaces",
                          JOINTOKEN_SECRET_MAX);
    if (!put_field(raw, &at, t->ns, 0, JOINTOKEN_NS_MAX))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the namespace must be 0..%d printable bytes without spaces",
                          JOINTOKEN_NS_MAX);
    if (t->n_peers < 0 || t->n_peers > JOINTOKEN_MAX_PEERS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%d addresses (at most %d)", t->n_peers, JOINTOKEN_MAX_PEERS);
    raw[at++] = (uint8_t)t->n_peers;
    for (int i = 0; i < t->n_peers; i++)
        if (!put_field(raw, &at, t->peers[i], 1, JOINTOKEN_ADDR_MAX))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "address %d must be 1..%d printable bytes without spaces",
                              i + 1, JOINTOKEN_ADDR_MAX);
    checksum(raw, at, raw + at);
    at += CHECK_BYTES;
    memcpy(out, JOINTOKEN_PREFIX, sizeof JOINTOKEN_PREFIX - 1);
    sodium_bin2base64(out + sizeof JOINTOKEN_PREFIX - 1, JOINTOKEN_TEXT_MAX - (sizeof JOINTOKEN_PREFIX - 1), raw, at,
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof raw);
    return 0;
}

/* Reads a length-prefixed field of min..max printable bytes into dst. */
static bool get_field(const uint8_t *raw, size_t len, size_t *at, char *dst, size_t min, size_t max)
{
    if (*at >= len)
        return false;
    size_t n = raw[(*at)++];
    if (n < min || n > max || n > len - *at || !printable((const char *)raw + *at, n))
        return false;
    memcpy(dst, raw + *at, n);
    dst[n] = 0;
    *at += n;
    return true;
}

int jointoken_decode(const char *text, struct jointoken *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium cannot start");
    size_t plen = sizeof JOINTOKEN_PREFIX - 1;
    if (strncmp(text, JOINTOKEN_PREFIX, plen))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a join token starts with '%s'", JOINTOKEN_PREFIX);
    uint8_t raw[RAW_MAX];
    size_t len = 0;
    const char *end = NULL;
    int rc = CAIRN_EFORMAT;
    if (strlen(text + plen) > (RAW_MAX * 4 + 2) / 3 ||
        sodium_base642bin(raw, sizeof raw, text + plen, strlen(text + plen), NULL, &len, &end,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) ||
        *end) {
        cairn_fail(err, errlen, rc, "the join token is not whole (bad characters or length after '%s')",
                   JOINTOKEN_PREFIX);
        goto out;
    }
    uint8_t sum[CHECK_BYTES] = {0};
    if (len >= CHECK_BYTES)
        checksum(raw, len - CHECK_BYTES, sum);
    if (len < CHECK_BYTES || memcmp(sum, raw + len - CHECK_BYTES, CHECK_BYTES)) {
        cairn_fail(err, errlen, rc, "the join token is damaged (its checksum does not match): paste it whole");
        goto out;
    }
    len -= CHECK_BYTES;
    size_t at = 0;
    if (!get_field(raw, len, &at, t->secret, 1, JOINTOKEN_SECRET_MAX)) {
        cairn_fail(err, errlen, rc, "the join token's secret is malformed");
        goto out;
    }
    if (!get_field(raw, len, &at, t->ns, 0, JOINTOKEN_NS_MAX)) {
        cairn_fail(err, errlen, rc, "the join token's namespace is malformed");
        goto out;
    }
    if (at >= len || raw[at] > JOINTOKEN_MAX_PEERS) {
        cairn_fail(err, errlen, rc, "the join token's address count is malformed");
        goto out;
    }
    t->n_peers = raw[at++];
    for (int i = 0; i < t->n_peers; i++)
        if (!get_field(raw, len, &at, t->peers[i], 1, JOINTOKEN_ADDR_MAX)) {
            cairn_fail(err, errlen, rc, "the join token's address %d is malformed", i + 1);
            goto out;
        }
    if (at != len) {
        cairn_fail(err, errlen, rc, "the join token has %zu bytes too many", len - at);
        goto out;
    }
    rc = 0;
out:
    sodium_memzero(raw, sizeof raw);
    if (rc)
        sodium_memzero(t, sizeof *t);
    return rc;
}
