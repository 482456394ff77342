/* Model files for peers (node/download.h has the protocol):
 *   GET|HEAD /files/models/<id>   the GGUF file of model id, whole (200) or one
 *                                 "Range: bytes=a-b" (206 with Content-Range; 416, with
 *                                 the file's size in Content-Range, for a range it
 *                                 cannot serve; If-Range other than the ETag sends it
 *                                 whole)
 * Reply headers: X-Cairn-Sha256 (lowercase hex), ETag ("<sha256>"), Accept-Ranges,
 * X-Cairn-Node (this node) and, with a secret, X-Cairn-Auth over "<path>|<sha256>".
 * With a cluster secret a request needs X-Cairn-Node and a valid X-Cairn-Auth, else
 * 401, and a GET needs X-Cairn-Nonce (48 hex), else 400: its body goes sealed
 * (XChaCha20 from the file offset, X-Cairn-Sealed: xchacha20; download_seal_* in
 * node/download.h), while HEAD and error replies carry no file bytes and go as they are.
 * 404 for a model this node has no usable file of. The hash of a file is computed
 * on its first request (seconds per GiB) and kept while its (size, mtime) stay. */
#ifndef CAIRN_API_ROUTES_FILES_H
#define CAIRN_API_ROUTES_FILES_H

#include <stddef.h>

#include "api/http.h"
#include "ctl/master.h"

#define ROUTES_FILES_CACHE 64 /* file hashes kept */

struct routes_files_config {
    const char *node_id; /* required: this node (X-Cairn-Node of the replies) */
    const char *secret;  /* cluster secret; NULL or "" = files are open to the API's clients */
    master_card_fn card; /* required: a model id's usable card (node_card) */
    void *card_ctx;
};

struct routes_files;

/* Adds the route to srv (before http_server_start); cfg's strings are copied. *out
 * (caller-owned) is the routes' context; release it after http_server_stop. CAIRN_EINVAL
 * for a bad config, CAIRN_ENOMEM, or http_route's error. */
int routes_files_create(struct routes_files **out, struct http_server *srv,
                        const struct routes_files_config *cfg, char *err, size_t errlen);

/* Frees r; accepts NULL. Call after http_server_stop. */
void routes_files_release(struct routes_files *r);

#endif
