/* Join tokens (net/jointoken.h): a token decodes to what was encoded (secret, namespace,
 * addresses, at their limits too); fields out of their limits or with spaces are refused
 * when encoding, naming the field; every one-character change of a token is refused on
 * decode (the checksum or the base64), as are a wrong prefix, trailing bytes and a token
 * cut short; a decoded failure leaves nothing of the secret behind. */
#include <string.h>

#include "base/err.h"
#include "net/jointoken.h"
#include "testutil.h"

static struct jointoken sample(void)
{
    struct jointoken t = {.n_peers = 2};
    strcpy(t.secret, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    strcpy(t.ns, "lab");
    strcpy(t.peers[0], "192.168.1.20:52416");
    strcpy(t.peers[1], "[fe80::1]:52416");
    return t;
}

static bool same(const struct jointoken *a, const struct jointoken *b)
{
    if (strcmp(a->secret, b->secret) || strcmp(a->ns, b->ns) || a->n_peers != b->n_peers)
        return false;
    for (int i = 0; i < a->n_peers; i++)
        if (strcmp(a->peers[i], b->peers[i]))
            return false;
    return true;
}

static void test_round_trip(void)
{
    char text[JOINTOKEN_TEXT_MAX], err[256] = "";
    struct jointoken t = sample(), back;
    CHECK(jointoken_encode(&t, text, err, sizeof err) == 0, "encode: %s", err);
    CHECK(!strncmp(text, "cairn1-", 7) && !strchr(text, '=') && !strchr(text, '+') && !strchr(text, '/'),
          "prefix, URL-safe base64 without padding: %s", text);
    CHECK(jointoken_decode(text, &back, err, sizeof err) == 0 && same(&t, &back), "decode: %s", err);

    struct jointoken big = {.n_peers = JOINTOKEN_MAX_PEERS};
    memset(big.secret, 'S', JOINTOKEN_SECRET_MAX);
    memset(big.ns, 'n', JOINTOKEN_NS_MAX);
    for (int i = 0; i < JOINTOKEN_MAX_PEERS; i++)
        memset(big.peers[i], 'a' + i, JOINTOKEN_ADDR_MAX);
    CHECK(jointoken_encode(&big, text, err, sizeof err) == 0, "every field at its limit: %s", err);
    CHECK(strlen(text) < JOINTOKEN_TEXT_MAX && jointoken_decode(text, &back, err, sizeof err) == 0 &&
              same(&big, &back),
          "decodes at the limits (%zu characters): %s", strlen(text), err);

    struct jointoken bare = {.n_peers = 0};
    strcpy(bare.secret, "s");
    CHECK(jointoken_encode(&bare, text, err, sizeof err) == 0 && jointoken_decode(text, &back, err, sizeof err) == 0 &&
              same(&bare, &back) && !back.ns[0] && !back.n_peers,
          "no namespace, no addresses: %s", err);
}

static void test_encode_refused(void)
{
    char text[JOINTOKEN_TEXT_MAX], err[256];
    struct jointoken t = sample();
    t.secret[0] = 0;
    CHECK(jointoken_encode(&t, text, err, sizeof err) == CAIRN_EINVAL && strstr(err, "secret"), "%s", err);
    t = sample();
    strcpy(t.secret, "has space");
    CHECK(jointoken_encode(&t, text, err, sizeof err) == CAIRN_EINVAL && strstr(err, "secret"), "%s", err);
    t = sample();
    strcpy(t.ns, "my lab");
    CHECK(jointoken_encode(&t, text, err, sizeof err) == CAIRN_EINVAL && strstr(err, "namespace"), "%s", err);
    t = sample();
    t.n_peers = JOINTOKEN_MAX_PEERS + 1;
    CHECK(jointoken_encode(&t, text, err, sizeof err) == CAIRN_EINVAL && strstr(err, "addresses"), "%s", err);
    t = sample();
    strcpy(t.peers[1], "host\t:1");
    CHECK(jointoken_encode(&t, text, err, sizeof err) == CAIRN_EINVAL && strstr(err, "address 2"), "%s", err);
}

static void test_decode_refused(void)
{
    char text[JOINTOKEN_TEXT_MAX], bad[JOINTOKEN_TEXT_MAX + 8], err[256];
    struct jointoken t = sample(), back;
    CHECK(jointoken_encode(&t, text, err, sizeof err) == 0, "encode: %s", err);
    size_t n = strlen(text);
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    int accepted = 0, tried = 0;
    for (size_t i = 7; i < n; i++) /* every change of one character after the prefix */
        for (const char *c = alphabet; *c; c++) {
            if (*c == text[i])
                continue;
            memcpy(bad, text, n + 1);
            bad[i] = *c;
            tried++;
            if (jointoken_decode(bad, &back, err, sizeof err) == 0)
                accepted++;
            else if (back.secret[0])
                accepted += 1000; /* a refusal must not leave the secret behind */
        }
    /* The last character carries only a few bits: changing only those is the same token. */
    CHECK(accepted <= 3, "%d of %d one-character changes accepted", accepted, tried);
    const struct {
        const char *text, *want;
    } cases[] = {
        {"", "starts with"},
        {"cairn2-AAAA", "starts with"},
        {"cairn1-", "damaged"},
        {"cairn1-@@@@", "not whole"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(jointoken_decode(cases[i].text, &back, err, sizeof err) == CAIRN_EFORMAT && strstr(err, cases[i].want),
              "'%s': %s", cases[i].text, err);
    memcpy(bad, text, n - 6); /* cut short */
    bad[n - 6] = 0;
    CHECK(jointoken_decode(bad, &back, err, sizeof err) == CAIRN_EFORMAT, "a token cut short: %s", err);
    snprintf(bad, sizeof bad, "%sAAAA", text);
    CHECK(jointoken_decode(bad, &back, err, sizeof err) == CAIRN_EFORMAT, "trailing bytes: %s", err);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_round_trip);
    RUN(test_encode_refused);
    RUN(test_decode_refused);
    return test_main_end();
}
