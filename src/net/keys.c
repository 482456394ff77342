#include "net/keys.h"

#include <sodium.h>
#include <string.h>

#include "base/err.h"

int keys_cluster_key(const char *secret, const char *ns, char hex[KEYS_HEX], char *err, size_t errlen)
{
    hex[0] = 0;
    if (!secret || !secret[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "an empty cluster secret");
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium cannot start");
    /* salt: a hash of a version tag and the namespace */
    static const char tag[] = "cairn cluster key v1";
    unsigned char salt[crypto_pwhash_SALTBYTES];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof salt);
    crypto_generichash_update(&st, (const unsigned char *)tag, sizeof tag); /* with its NUL: a separator */
    crypto_generichash_update(&st, (const unsigned char *)(ns ? ns : ""), ns ? strlen(ns) : 0);
    crypto_generichash_final(&st, salt, sizeof salt);
    unsigned char key[32];
    if (crypto_pwhash(key, sizeof key, secret, strlen(secret), salt, crypto_pwhash_OPSLIMIT_INTERACTIVE,
                      crypto_pwhash_MEMLIMIT_INTERACTIVE, crypto_pwhash_ALG_ARGON2ID13))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot derive the cluster key (Argon2id needs %zu MiB)",
                          (size_t)(crypto_pwhash_MEMLIMIT_INTERACTIVE >> 20));
    sodium_bin2hex(hex, KEYS_HEX, key, sizeof key);
    sodium_memzero(key, sizeof key);
    return 0;
}

void keys_api_key(const char *cluster_key, char hex[KEYS_HEX])
{
    static const char tag[] = "cairn api key v1";
    unsigned char key[24];
    crypto_generichash(key, sizeof key, (const unsigned char *)tag, sizeof tag - 1, (const unsigned char *)cluster_key,
                       strlen(cluster_key));
    sodium_bin2hex(hex, KEYS_HEX, key, sizeof key);
}
