/* Join tokens: what `cairn seal` prints and `cairn join TOKEN` takes, so that a second
 * machine joins a sealed cluster with one pasted line (README, "Security"). A token
 * carries the cluster secret, the namespace and up to JOINTOKEN_MAX_PEERS addresses
 * (host:port of cluster ports) to dial where LAN discovery does not reach:
 *
 *     "cairn1-" base64url(no padding) of:
 *         u8 secret length (1..JOINTOKEN_SECRET_MAX), secret
 *         u8 namespace length (0..JOINTOKEN_NS_MAX), namespace
 *         u8 number of addresses (0..JOINTOKEN_MAX_PEERS), each: u8 length (1..JOINTOKEN_ADDR_MAX), "host:port"
 *         4 bytes: the start of BLAKE2b of everything before (a damaged paste is caught)
 *
 * Every field is printable ASCII without spaces, checked on decode with the field named
 * in the error. The token is the secret: whoever holds it can join. */
#ifndef CAIRN_NET_JOINTOKEN_H
#define CAIRN_NET_JOINTOKEN_H

#include <stddef.h>

#define JOINTOKEN_PREFIX "cairn1-"
#define JOINTOKEN_SECRET_MAX 128
#define JOINTOKEN_NS_MAX 63
#define JOINTOKEN_MAX_PEERS 8
#define JOINTOKEN_ADDR_MAX 80
#define JOINTOKEN_TEXT_MAX 2048 /* the longest token, with its NUL */

struct jointoken {
    char secret[JOINTOKEN_SECRET_MAX + 1];
    char ns[JOINTOKEN_NS_MAX + 1];
    char peers[JOINTOKEN_MAX_PEERS][JOINTOKEN_ADDR_MAX + 1];
    int n_peers;
};

/* Writes t as a token into out (JOINTOKEN_TEXT_MAX bytes). CAIRN_EINVAL (err says which
 * field) when a field is empty where it must not be, too long or not printable. */
int jointoken_encode(const struct jointoken *t, char out[JOINTOKEN_TEXT_MAX], char *err, size_t errlen);

/* Reads a token into *t. CAIRN_EFORMAT with what is wrong (prefix, base64, checksum, a
 * field's length or bytes, trailing bytes). */
int jointoken_decode(const char *text, struct jointoken *t, char *err, size_t errlen);

#endif
