/* Sealing the data plane (dataplane_int.h): with a cluster key, every frame after the
 * handshake travels encrypted and authenticated with ChaCha20-Poly1305 (IETF). The
 * header stays readable (the reader needs the length before the payload) but is the
 * AEAD's associated data, so it cannot be altered either. Nonces are not sent: each side
 * counts the frames of each direction, which TCP delivers in order, so a frame that is
 * dropped, replayed or moved fails to open and ends the connection.
 *
 * The cipher runs in OpenSSL's libcrypto (its ChaCha20 and Poly1305 use AVX-512 or NEON
 * where the CPU has them: about 3x libsodium's speed on this project's machines, which
 * a tensor-parallel exchange of a few KiB feels on every layer); the algorithm is the
 * same, so the bytes are libsodium's (tests/runner/test_dataplane.c checks both ways),
 * and libsodium seals and opens when OpenSSL cannot make a context. */
#include <limits.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <string.h>

#include "runner/dataplane_int.h"

_Static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == DP_SEAL_TAG, "the tag is Poly1305's");
_Static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == 32, "a 32-byte key");
_Static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == 12, "a 96-bit nonce");

static const char SEAL_LABEL[] = "cairn dataplane seal v1";

void dp_seal_keys(const char *secret, const struct dp_hellos *hs, bool connector, struct dp_seal_dir *tx,
                  struct dp_seal_dir *rx)
{
    /* role 'c': what the connector sends; 'a': what the acceptor sends */
    dp_hellos_mac(secret, SEAL_LABEL, connector ? 'c' : 'a', hs, tx->key);
    dp_hellos_mac(secret, SEAL_LABEL, connector ? 'a' : 'c', hs, rx->key);
    tx->n = rx->n = 0;
    tx->evp = rx->evp = NULL;
}

void dp_seal_release(struct dp_seal_dir *d)
{
    EVP_CIPHER_CTX_free(d->evp);
    d->evp = NULL;
}

static void nonce_of(uint64_t n, uint8_t out[12])
{
    memset(out, 0, 12);
    memcpy(out, &n, 8); /* little-endian hosts only (dataplane_wire.c) */
}

/* d's context with d's key for encrypting (enc) or decrypting, or NULL. A direction
 * only ever does one of them. */
static EVP_CIPHER_CTX *ctx_of(struct dp_seal_dir *d, int enc)
{
    if (d->evp)
        return d->evp;
    EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
    if (x && EVP_CipherInit_ex(x, EVP_chacha20_poly1305(), NULL, d->key, NULL, enc) == 1) {
        d->evp = x;
        return x;
    }
    EVP_CIPHER_CTX_free(x);
    return NULL;
}

/* Runs the cipher over len bytes in place, in pieces an int can count. */
static bool update(EVP_CIPHER_CTX *x, uint8_t *p, size_t len)
{
    while (len) {
        int k = len > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)len, out = 0;
        if (EVP_CipherUpdate(x, p, &out, p, k) != 1 || out != k)
            return false;
        p += k;
        len -= (size_t)k;
    }
    return true;
}

static bool evp_seal(struct dp_seal_dir *tx, const uint8_t nonce[12], const uint8_t *ad, uint8_t *p, size_t len)
{
    EVP_CIPHER_CTX *x = ctx_of(tx, 1);
    int out = 0;
    return x && EVP_CipherInit_ex(x, NULL, NULL, NULL, nonce, 1) == 1 &&
           EVP_CipherUpdate(x, NULL, &out, ad, DP_HDR_SIZE) == 1 && update(x, p, len) &&
           EVP_CipherFinal_ex(x, p + len, &out) == 1 &&
           EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, DP_SEAL_TAG, p + len) == 1;
}

size_t dp_seal_frame(struct dp_seal_dir *tx, uint8_t *frame, size_t plain_len)
{
    struct dp_hdr h = {.version = frame[4], .type = frame[5], .flags = DP_F_SEALED,
                       .len = (uint32_t)(plain_len + DP_SEAL_TAG)};
    dp_hdr_pack(frame, &h);
    uint8_t nonce[12];
    nonce_of(tx->n++, nonce);
    uint8_t *p = frame + DP_HDR_SIZE;
    /* OpenSSL fails only before it has touched p (no context); libsodium then does it */
    if (!evp_seal(tx, nonce, frame, p, plain_len))
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(p, p + plain_len, NULL, p, plain_len, frame, DP_HDR_SIZE,
                                                           NULL, nonce, tx->key);
    return DP_HDR_SIZE + plain_len + DP_SEAL_TAG;
}

long dp_open_frame(struct dp_seal_dir *rx, const uint8_t hdr[DP_HDR_SIZE], uint8_t *payload, size_t len)
{
    if (len < DP_SEAL_TAG)
        return -1;
    size_t plain = len - DP_SEAL_TAG;
    uint8_t nonce[12];
    nonce_of(rx->n, nonce);
    EVP_CIPHER_CTX *x = ctx_of(rx, 0);
    if (x) {
        /* decrypts in place before the tag is checked: a frame that fails is dropped whole */
        int out = 0;
        uint8_t tag[DP_SEAL_TAG];
        memcpy(tag, payload + plain, DP_SEAL_TAG);
        if (EVP_CipherInit_ex(x, NULL, NULL, NULL, nonce, 0) != 1 ||
            EVP_CipherUpdate(x, NULL, &out, hdr, DP_HDR_SIZE) != 1 || !update(x, payload, plain) ||
            EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, DP_SEAL_TAG, tag) != 1 ||
            EVP_CipherFinal_ex(x, payload + plain, &out) != 1)
            return -1;
    } else if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, plain, payload + plain, hdr,
                                                                  DP_HDR_SIZE, nonce, rx->key)) {
        return -1;
    }
    rx->n++;
    return (long)plain;
}
