/* Sealing the data plane (dataplane_int.h): with a cluster key, every frame after the
 * handshake travels encrypted and authenticated with ChaCha20-Poly1305 (IETF). The
 * header stays readable (the reader needs the length before the payload) but is the
 * AEAD's associated data, so it cannot be altered either. Nonces are not sent: each side
 * counts the frames of each direction, which TCP delivers in order, so a frame that is
 * dropped, replayed or moved fails to open and ends the connection. */
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
}

static void nonce_of(uint64_t n, uint8_t out[12])
{
    memset(out, 0, 12);
    memcpy(out, &n, 8); /* little-endian hosts only (dataplane_wire.c) */
}

size_t dp_seal_frame(struct dp_seal_dir *tx, uint8_t *frame, size_t plain_len)
{
    struct dp_hdr h = {.version = frame[4], .type = frame[5], .flags = DP_F_SEALED,
                       .len = (uint32_t)(plain_len + DP_SEAL_TAG)};
    dp_hdr_pack(frame, &h);
    uint8_t nonce[12];
    nonce_of(tx->n++, nonce);
    uint8_t *p = frame + DP_HDR_SIZE;
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
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, plain, payload + plain, hdr,
                                                           DP_HDR_SIZE, nonce, rx->key))
        return -1;
    rx->n++;
    return (long)plain;
}
