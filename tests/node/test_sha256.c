/* SHA-256 (node/sha256.h) against FIPS 180-2's vectors ("", "abc", the 448-bit message,
 * a million 'a'), and streamed in uneven pieces against libsodium's one-shot hash of the
 * same random bytes; a state dropped unfinished and one reused after its final. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "node/sha256.h"
#include "testutil.h"

static void hex_of(const void *data, size_t len, char out[SHA256_HEX])
{
    struct sha256 s = {0};
    CHECK(sha256_init(&s) == 0, "init");
    sha256_update(&s, data, len);
    sha256_final_hex(&s, out);
}

static void test_vectors(void)
{
    char h[SHA256_HEX];
    hex_of("", 0, h);
    CHECK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "empty: %s", h);
    hex_of("abc", 3, h);
    CHECK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "abc: %s", h);
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m, strlen(m), h);
    CHECK(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "448 bits: %s", h);
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    hex_of(a, 1000000, h);
    CHECK(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "a million a: %s", h);
    free(a);
}

static void test_streamed(void)
{
    size_t n = 3 << 20;
    unsigned char *b = malloc(n), ref[32];
    randombytes_buf(b, n);
    crypto_hash_sha256(ref, b, n);
    char want[SHA256_HEX], got[SHA256_HEX];
    sodium_bin2hex(want, sizeof want, ref, sizeof ref);
    struct sha256 s = {0};
    for (int round = 0; round < 2; round++) { /* the second reuses the state */
        CHECK(sha256_init(&s) == 0, "init");
        uint64_t seed = 7 + (uint64_t)round;
        for (size_t at = 0; at < n;) {
            size_t k = (size_t)(test_rand_u64(&seed) % 100000);
            k = k > n - at ? n - at : k;
            sha256_update(&s, b + at, k);
            at += k;
        }
        sha256_final_hex(&s, got);
        CHECK(!strcmp(got, want), "round %d: %s vs %s", round, got, want);
    }
    CHECK(sha256_init(&s) == 0, "init again");
    sha256_update(&s, b, 10);
    sha256_drop(&s); /* never finished: ASan sees nothing left behind */
    sha256_drop(&s);
    free(b);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_vectors);
    RUN(test_streamed);
    return test_main_end();
}
