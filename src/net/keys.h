/* The cluster key: what every MAC and key of cairn is derived from. A cluster secret is
 * something a person chose or pasted (it may be weak), and every beacon carries a MAC
 * keyed from it, so anyone on the network can try guesses offline; the secret therefore
 * goes through Argon2id (libsodium's crypto_pwhash, its "interactive" limits: about
 * 0.1-0.3 s and 64 MiB once per node start) before anything else sees it. The salt is
 * fixed per namespace, so the nodes of one cluster derive the same key. */
#ifndef CAIRN_NET_KEYS_H
#define CAIRN_NET_KEYS_H

#include <stddef.h>

#define KEYS_HEX 65 /* 32 bytes as 64 hex digits and the NUL */

/* Derives the cluster key of secret (non-empty) in namespace ns (NULL = "") into hex.
 * CAIRN_ENOMEM when Argon2id cannot get its memory, CAIRN_EINVAL for an empty secret. */
int keys_cluster_key(const char *secret, const char *ns, char hex[KEYS_HEX], char *err, size_t errlen);

/* The API key of a sealed cluster's nodes, derived from the cluster key (hex, as
 * keys_cluster_key writes it) into hex: the same on every node, so peers fetch models
 * from each other's APIs with it. */
void keys_api_key(const char *cluster_key, char hex[KEYS_HEX]);

#endif
