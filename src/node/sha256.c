/* SHA-256 (sha256.h). */
#include "node/sha256.h"

#include <openssl/evp.h>

#include "base/err.h"

int sha256_init(struct sha256 *s)
{
    if (!s->ctx)
        s->ctx = EVP_MD_CTX_new();
    if (!s->ctx || EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) != 1)
        return CAIRN_ENOMEM;
    return 0;
}

void sha256_update(struct sha256 *s, const void *data, size_t len)
{
    EVP_DigestUpdate(s->ctx, data, len);
}

void sha256_final_hex(struct sha256 *s, char hex[SHA256_HEX])
{
    unsigned char d[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(s->ctx, d, &n);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = 0;
    sha256_drop(s);
}

void sha256_drop(struct sha256 *s)
{
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}
