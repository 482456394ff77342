/* The cluster key (net/keys.h): the same secret and namespace give the same key on
 * every node; another secret or another namespace gives another; the key is not the
 * secret (nor any simple function of it that skips Argon2id, checked against a plain
 * hash); an empty secret is refused. */
#include <sodium.h>
#include <string.h>

#include "base/err.h"
#include "net/keys.h"
#include "testutil.h"

static void test_derive(void)
{
    char a[KEYS_HEX], b[KEYS_HEX], c[KEYS_HEX], d[KEYS_HEX], err[256] = "";
    CHECK(keys_cluster_key("correct horse", "", a, err, sizeof err) == 0, "derive: %s", err);
    CHECK(keys_cluster_key("correct horse", NULL, b, err, sizeof err) == 0, "derive again: %s", err);
    CHECK(strlen(a) == 64 && strspn(a, "0123456789abcdef") == 64, "64 hex digits: %s", a);
    CHECK(!strcmp(a, b), "the same key for the same secret (NULL namespace = \"\")");
    CHECK(keys_cluster_key("correct horsf", "", c, err, sizeof err) == 0 && strcmp(a, c), "another secret");
    CHECK(keys_cluster_key("correct horse", "lab", d, err, sizeof err) == 0 && strcmp(a, d) && strcmp(c, d),
          "another namespace");
    unsigned char h[32];
    char plain[KEYS_HEX];
    crypto_generichash(h, sizeof h, (const unsigned char *)"correct horse", 13, NULL, 0);
    sodium_bin2hex(plain, sizeof plain, h, sizeof h);
    CHECK(strcmp(a, plain), "not a plain hash of the secret");
    CHECK(keys_cluster_key("", "", a, err, sizeof err) == CAIRN_EINVAL && !a[0], "an empty secret: %s", err);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_derive);
    return test_main_end();
}
