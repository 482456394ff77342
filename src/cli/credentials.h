/* The node's secrets as `cairn node` finds them: a cluster secret or an API key read
 * from a file, and the API key a node makes at first start when its API is reachable
 * from other machines. */
#ifndef CAIRN_CLI_CREDENTIALS_H
#define CAIRN_CLI_CREDENTIALS_H

#include <stdbool.h>
#include <stddef.h>

#define CRED_KEY_BYTES 24 /* random bytes of a made API key (48 hex digits) */

/* Reads the first line of path (what names it in messages: "cluster secret") into buf
 * (cap bytes with the NUL): printable characters without spaces. Warns on stderr when
 * others may read the file. CAIRN_EIO, CAIRN_ERANGE (too long), CAIRN_EFORMAT. */
int cred_read_file(const char *path, const char *what, char *buf, size_t cap, char *err, size_t errlen);

/* The API key kept in data_dir/api_key, made now (random, mode 0600, synced, the folder
 * made when missing) when there is none; *created says which. */
int cred_api_key(const char *data_dir, char *buf, size_t cap, bool *created, char *err, size_t errlen);

#endif
