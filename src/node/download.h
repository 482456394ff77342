/* Model files from peers: a node that lacks a placed model's GGUF file fetches it over
 * HTTP from a node that has it (issue 4, parts 4 and 11).
 *
 * Serving side (api/routes_files.h): GET/HEAD /files/models/<id> on each node's API
 * port sends the file, honouring one "Range: bytes=a-b" (download_range_parse), with
 * X-Cairn-Sha256 (the file's SHA-256), ETag ("<sha256>", for If-Range), X-Cairn-Node
 * (the serving node) and Accept-Ranges.
 *
 * Authentication with a cluster secret (this file's download_auth_*): a request carries
 * X-Cairn-Node: <requester id> and X-Cairn-Auth: <unix seconds>:<hex HMAC-SHA256 keyed
 * with the secret of "<requester id>|<path>|<seconds>">, accepted within
 * DOWNLOAD_AUTH_WINDOW_S of the server's clock (path is DOWNLOAD_ROUTE_PREFIX + id). The
 * reply proves the server's side the same way, over "<server id>|<path>|<sha256>", so
 * the hash the downloader checks against comes from a holder of the secret. A token can
 * be replayed within its window for the same file only. Without a secret no token is
 * sent or checked, and the body travels in clear (the API's own key still applies; the
 * downloader sends it).
 *
 * Sealed bodies with a cluster secret (download_seal_*): each GET carries a fresh random
 * X-Cairn-Nonce (24 bytes, 48 hex; a GET without one gets 400), and the server sends the
 * body XORed with an XChaCha20 keystream under a per-transfer key, keyed BLAKE2b over
 * (requester id, path, the file's SHA-256, the nonce), with X-Cairn-Sealed: xchacha20.
 * Byte o of the file meets keystream byte o, so ranges and resumes work as in clear and
 * Content-Length stays the file's. The hash is in the key so that a request replayed
 * after the file changed never gets the same keystream over other bytes. The stream
 * cipher hides the bytes; it does not authenticate them: the SHA-256 of the whole file,
 * checked against the authenticated hash, catches any change on the wire (the partial
 * is then deleted, and the next fetch starts from zero). A sealed downloader refuses a
 * GET reply that is not sealed, or whose hash is not the one it made the key with.
 *
 * Downloading side: download_fetch writes models_dir/.<id>.gguf.partial, resuming from
 * that file's size with a Range request after an interruption (bounded attempts with
 * doubling waits), checks the SHA-256 of the whole file against the source's, fsyncs
 * and renames it to models_dir/<id>.gguf, where the catalog finds it on its next scan.
 * Each attempt starts with a HEAD to the sources in order (the first that answers
 * serves the attempt) and checks that the file fits in the free disk space. A source's
 * file whose hash changed between attempts restarts the partial from zero.
 *
 * download_mgr runs fetches on one thread of its own (first come, first served), keeps
 * each model's latest status as a cluster_download, and calls the owner back on changes
 * (at most every DOWNLOAD_PROGRESS_MS while bytes arrive); the node reports these to the
 * master, which turns them into NodeDownloadProgress events. */
#ifndef CAIRN_NODE_DOWNLOAD_H
#define CAIRN_NODE_DOWNLOAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/state.h"

#define DOWNLOAD_ROUTE_PREFIX "/files/models/"
#define DOWNLOAD_AUTH_WINDOW_S 120    /* a token's time may differ this much from the server's */
#define DOWNLOAD_AUTH_MAX 96          /* "<seconds>:<64 hex>" and the NUL */
#define DOWNLOAD_SHA256_HEX 65        /* 64 hex digits and the NUL */
#define DOWNLOAD_NONCE_BYTES 24       /* X-Cairn-Nonce: XChaCha20's nonce */
#define DOWNLOAD_NONCE_HEX 49         /* 48 hex digits and the NUL */
#define DOWNLOAD_SEAL_KEY_BYTES 32
#define DOWNLOAD_SEALED "xchacha20"   /* X-Cairn-Sealed of a sealed body */
#define DOWNLOAD_MAX_ATTEMPTS 6       /* attempts of one fetch (each resumes the last) */
#define DOWNLOAD_BACKOFF_MS 500       /* wait before the second attempt; doubled after each */
#define DOWNLOAD_BACKOFF_MAX_MS 8000
#define DOWNLOAD_PROGRESS_MS 250      /* Ongoing progress is reported at most this often */
#define DOWNLOAD_CONNECT_MS 3000      /* connect timeout per address */
#define DOWNLOAD_STALL_S 60           /* a transfer without a byte for this long is retried */
#define DOWNLOAD_HEAD_TIMEOUT_S 900   /* a first HEAD may wait while the source hashes its file */
#define DOWNLOAD_RETRY_MS 30000       /* a Failed download is started again after this */
#define DOWNLOAD_MAX_SOURCES 32       /* nodes tried per fetch */
#define DOWNLOAD_MAX_URLS 8           /* addresses tried per node */
#define DOWNLOAD_URL_MAX 96           /* "http://[v6 address]:port" */
#define DOWNLOAD_DISK_HEADROOM ((uint64_t)256 << 20) /* left free beyond a download (logs, the event log, the OS) */
#define DOWNLOAD_PARTIAL_MAX_AGE_S (7 * 86400) /* a partial file untouched this long is deleted at start */

/* --- Range requests (serving side) --- */

/* Parses a Range header against a file of size bytes. header NULL, or a unit other than
 * "bytes": *partial false (send the whole file). "bytes=a-b", "bytes=a-" or "bytes=-n"
 * (one range; b past the end is cut to the end, a suffix longer than the file is the
 * whole file): *partial true with [*first, *first + *len). CAIRN_ERANGE (reply 416,
 * reason in err) for a range that starts at or past the end, a zero suffix, b < a,
 * several ranges, or anything malformed after "bytes=". */
int download_range_parse(const char *header, uint64_t size, bool *partial, uint64_t *first,
                         uint64_t *len, char *err, size_t errlen);

/* --- Authentication (see the top) --- */

/* Writes "<now_s>:<hex HMAC-SHA256(secret, "<node_id>|<what>|<now_s>")>" into out
 * (DOWNLOAD_AUTH_MAX bytes). CAIRN_EINVAL for a NULL or empty secret, node_id or what. */
int download_auth_token(const char *secret, const char *node_id, const char *what, int64_t now_s,
                        char *out);

/* 0 when token (as made above) proves the secret for node_id and what, and its time is
 * within DOWNLOAD_AUTH_WINDOW_S of now_s (constant-time compare); else CAIRN_EINVAL with
 * the reason (missing, malformed, stale, wrong MAC) in err. */
int download_auth_check(const char *secret, const char *node_id, const char *what,
                        const char *token, int64_t now_s, char *err, size_t errlen);

/* --- Sealed bodies (see the top) --- */

/* The key of one transfer into key: BLAKE2b-256 keyed with BLAKE2b-256 of secret (any
 * length of text; a node's is its cluster key), over "cairn file v1", node_id (the
 * requester), route, sha256_hex (the file's) and nonce. CAIRN_EINVAL for a NULL or empty
 * secret, node_id, route or hash; CAIRN_EIO when libsodium cannot start. */
int download_seal_key(const char *secret, const char *node_id, const char *route, const char *sha256_hex,
                      const uint8_t nonce[DOWNLOAD_NONCE_BYTES], uint8_t key[DOWNLOAD_SEAL_KEY_BYTES]);

/* XORs the n bytes of buf, which sit at offset in the file, with the keystream of (key,
 * nonce) from that offset: seals and unseals alike, at any offset and length. */
void download_seal_xor(uint8_t *buf, size_t n, uint64_t offset, const uint8_t nonce[DOWNLOAD_NONCE_BYTES],
                       const uint8_t key[DOWNLOAD_SEAL_KEY_BYTES]);

/* Reads an X-Cairn-Nonce value (exactly 48 hex digits) into nonce; CAIRN_EINVAL for
 * NULL or anything else. */
int download_nonce_parse(const char *hex, uint8_t nonce[DOWNLOAD_NONCE_BYTES]);

/* --- Files --- */

/* The final and partial paths of model_id in models_dir (each n bytes):
 * "<dir>/<id>.gguf" and "<dir>/.<id>.gguf.partial". CAIRN_EINVAL for an id that is not
 * a valid model id or cannot be a file name ('/', or a leading '.'), CAIRN_ERANGE when a
 * path does not fit. */
int download_paths(const char *models_dir, const char *model_id, char *final_path,
                   char *partial_path, size_t n);

/* 0 when need bytes fit in the free space of dir's file system (statvfs, f_bavail) with
 * DOWNLOAD_DISK_HEADROOM to spare, CAIRN_EFULL naming the sizes, CAIRN_EIO when it
 * cannot be read. */
int download_disk_check(const char *dir, uint64_t need, char *err, size_t errlen);

/* Deletes the partial files ("."<id>".gguf.partial") of models_dir whose last change is
 * more than max_age_s before now_s (a download given up long ago would hold its disk
 * space for ever); fresher ones stay, to be resumed. Returns how many it deleted. */
int download_clean_partials(const char *models_dir, int64_t max_age_s, int64_t now_s);

/* --- Sources --- */

/* A node to fetch from: its id (checked against the reply's X-Cairn-Node; "" accepts
 * any) and base URLs of its API ("http://127.0.0.1:52415"), tried in order. */
struct download_source {
    char node_id[IDS_ID_MAX + 1];
    char urls[DOWNLOAD_MAX_URLS][DOWNLOAD_URL_MAX];
    size_t n_urls;
};

/* Sources for model_id from the state, for the node self_id, into out (max entries):
 * the master first, then nodes with a Completed download of the model, then the other
 * nodes; only nodes with an API port; never self. A node's URLs are its interfaces'
 * addresses with its api_port: IPv4 before IPv6 (link-local IPv6 skipped), loopback
 * addresses last. Returns the count. */
size_t download_sources(const struct cluster_state *s, const char *self_id, const char *model_id,
                        struct download_source *out, size_t max);

/* --- One fetch --- */

struct download_config {
    const char *models_dir; /* required */
    const char *node_id;    /* required: sent as X-Cairn-Node, the downloads' node_id */
    const char *secret;     /* cluster secret (tokens, sealed bodies); NULL or "" = none */
    const char *api_key;    /* sent as a Bearer token to the sources; NULL or "" = none */
    int max_attempts;       /* 0 = DOWNLOAD_MAX_ATTEMPTS */
    int backoff_ms;         /* 0 = DOWNLOAD_BACKOFF_MS */
    int stall_s;            /* 0 = DOWNLOAD_STALL_S */
};

/* Progress of a fetch: Ongoing (at most every DOWNLOAD_PROGRESS_MS, and when the size is
 * first known), then Completed or Failed (error set) once. d is valid for the call. */
typedef void (*download_progress_fn)(void *ctx, const struct cluster_download *d);

/* Fetches model_id from the sources (see the top); blocks until done, failed or
 * cancelled (*cancel set by another thread; the partial file is kept for a later
 * resume). 0 once models_dir/<id>.gguf is in place. Errors, with the reason in err:
 * CAIRN_EINVAL bad arguments, CAIRN_ESTATE the final file exists already, CAIRN_EFULL
 * the file does not fit on the disk, CAIRN_EFORMAT the hash does not match (the
 * partial is deleted), CAIRN_EIO no source served it within the attempts, or a local
 * file error, or cancelled. fn may be NULL. */
int download_fetch(const struct download_config *cfg, const char *model_id,
                   const struct download_source *src, size_t n_src, download_progress_fn fn,
                   void *ctx, const atomic_bool *cancel, char *err, size_t errlen);

/* --- The node's downloads --- */

struct download_mgr;

/* Called (on the manager's thread, no lock held) after a download's status changed. */
typedef void (*download_changed_fn)(void *ctx);

/* Creates a manager (cfg's strings copied); its thread starts with the first download.
 * *out owned by the caller. CAIRN_EINVAL without models_dir or node_id, CAIRN_ENOMEM. */
int download_mgr_create(struct download_mgr **out, const struct download_config *cfg,
                        download_changed_fn changed, void *ctx, char *err, size_t errlen);

/* Cancels the download in progress (its partial file stays), drops the queue, joins the
 * thread, frees m; accepts NULL. */
void download_mgr_release(struct download_mgr *m);

/* Queues a download of model_id (Pending) unless one is Pending or Ongoing, Completed
 * with the file still there, or Failed less than DOWNLOAD_RETRY_MS ago. CAIRN_ENOTFOUND
 * when n_src is 0, CAIRN_EINVAL for a bad id, CAIRN_EIO when no thread can be started,
 * CAIRN_ENOMEM. Any thread. */
int download_mgr_start(struct download_mgr *m, const char *model_id,
                       const struct download_source *src, size_t n_src, char *err, size_t errlen);

/* The worker's question for a shard whose model file is missing here: 0 while a
 * download of it is Pending or Ongoing (started now from download_sources of s when
 * needed, see download_mgr_start), or Completed and in place (the catalog picks it up);
 * otherwise the reason it cannot be had, in why: the Failed download's error, or no
 * node to fetch from (CAIRN_ENOTFOUND). Any thread. */
int download_mgr_ensure(struct download_mgr *m, const struct cluster_state *s, const char *model_id,
                        char *why, size_t whylen);

/* Copies the status of model_id's download into *out (caller clears it with
 * cluster_download_clear); CAIRN_ENOTFOUND when there is none, CAIRN_ENOMEM. */
int download_mgr_get(struct download_mgr *m, const char *model_id, struct cluster_download *out);

/* Records the status of a download the manager does not run itself (a pull from the
 * hub: Ongoing, Completed or Failed), so that it is reported with the others. m may be
 * NULL (no models folder: nothing to record). Any thread. */
void download_mgr_note(struct download_mgr *m, const struct cluster_download *d);

/* New JSON array of the downloads (cluster_download_to_json each, in model id order),
 * NULL when out of memory: the report's "downloads". Any thread. */
json_t *download_mgr_json(struct download_mgr *m);

#endif
