/* The node's secrets as `cairn node` finds them: a cluster secret or an API key read
 * from a file, the API key a node makes at first start when its API is reachable from
 * other machines, and the cluster secret `cairn seal` makes and `cairn join` keeps in the
 * data dir. */
#ifndef CAIRN_CLI_CREDENTIALS_H
#define CAIRN_CLI_CREDENTIALS_H

#include <stdbool.h>
#include <stddef.h>

#define CRED_KEY_BYTES 24    /* random bytes of a made API key (48 hex digits) */
#define CRED_SECRET_BYTES 32 /* random bytes of a made cluster secret (64 hex digits) */
#define CRED_SECRET_FILE "cluster_secret" /* in the data dir: the secret `cairn seal` made or `cairn join` kept */

/* Reads the first line of path (what names it in messages: "cluster secret") into buf
 * (cap bytes with the NUL): printable characters without spaces. Warns on stderr when
 * others may read the file. CAIRN_EIO, CAIRN_ERANGE (too long), CAIRN_EFORMAT. */
int cred_read_file(const char *path, const char *what, char *buf, size_t cap, char *err, size_t errlen);

/* The API key kept in data_dir/api_key, made now (random, mode 0600, synced, the folder
 * made when missing) when there is none; *created says which. */
int cred_api_key(const char *data_dir, char *buf, size_t cap, bool *created, char *err, size_t errlen);

/* The cluster secret kept in data_dir/cluster_secret; with make, one is made now (random,
 * mode 0600, synced) when there is none, and *created says so. CAIRN_ENOTFOUND when there
 * is none and make is false. */
int cred_cluster_secret(const char *data_dir, bool make, char *buf, size_t cap, bool *created, char *err,
                        size_t errlen);

/* Keeps secret (from a join token) in data_dir/cluster_secret: written (0600, synced)
 * when there is none, accepted when it holds the same, CAIRN_ESTATE when it holds
 * another cluster's. */
int cred_store_secret(const char *data_dir, const char *secret, char *err, size_t errlen);

#endif
