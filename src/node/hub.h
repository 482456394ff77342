/* Pulling models from the Hugging Face hub (issue 17): a model reference (hubref.h) is
 * listed through the hub's API, pinned to the commit its revision names, and its files
 * fetched into the models folder, resumable and verified.
 *
 * The hub's HTTP surface, as its own client uses it:
 *   GET {endpoint}/api/models/{owner}/{repo}/revision/{revision}  {"sha": commit, ...}
 *   GET {endpoint}/api/models/{owner}/{repo}/tree/{commit}?recursive=true
 *       [{"type": "file", "path", "size", "lfs": {"oid": sha256, "size"}}, ...], more
 *       pages named by a Link: <url>; rel="next" header
 *   GET {endpoint}/{owner}/{repo}/resolve/{commit}/{path}  the file, usually a 302 to a
 *       storage host (followed; the token is sent to the hub only), with X-Repo-Commit,
 *       X-Linked-Etag ("sha256") and X-Linked-Size on the hub's answer
 * HF_ENDPOINT, HF_TOKEN (a Bearer token for gated and private repos) and HF_HUB_OFFLINE
 * are honoured as the hub's client does. 401/403 say to set HF_TOKEN (or that the token
 * lacks access), 404 names what is missing from X-Error-Code, 429 and 5xx are retried
 * after Retry-After (at most HUB_RETRY_AFTER_MAX_S) or a doubling wait.
 *
 * On disk: each file goes to models_dir/.<local>.partial, hashed (SHA-256) as its bytes
 * arrive (a resumed file's existing bytes first), resumed with a Range request after an
 * interruption (also by a later process). When that one connection brings less than
 * HUB_FAST_CONNECTION bytes a second after HUB_SLOW_AFTER_MS (a CDN's limit per
 * connection) and HUB_PARALLEL_MIN bytes or more are left, the rest comes as HUB_CHUNK
 * ranges over several connections at once, written where they go with a record of the
 * ranges there (node/ranges.h, ".<local>.partial.have": a later pull asks only for the
 * holes) and hashed as they become a prefix of the file. Either way the file is checked
 * against the listing's LFS SHA-256
 * before it is renamed to models_dir/<local>, where <local> is the reference's canonical
 * text with '/' as '~' (hubref_local_name). A sidecar <stem>.pull.json records the
 * reference, repo, commit and each file's hash; the catalog names the model by the
 * reference it holds. It is written before the files are renamed into place (the first
 * part last), so the catalog never lists a model under another name or part-way. */
#ifndef CAIRN_NODE_HUB_H
#define CAIRN_NODE_HUB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "node/hubref.h"

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define HUB_MAX_ATTEMPTS 8         /* per file; each resumes the last */
#define HUB_BACKOFF_MS 1000        /* before the second attempt; doubled after each */
#define HUB_BACKOFF_MAX_MS 30000
#define HUB_RETRY_AFTER_MAX_S 120  /* a longer Retry-After is cut to this */
#define HUB_STALL_S 60             /* a transfer without a byte for this long is retried */
#define HUB_LIST_MAX_BYTES ((size_t)32 << 20) /* one page of a listing */
#define HUB_LIST_MAX_PAGES 64
#define HUB_LIST_MAX_FILES 20000
#define HUB_PROGRESS_MS 250
#define HUB_SIDECAR ".pull.json"
#define HUB_CONNECTIONS 4          /* ranges of one file fetched at once (a CDN limits each connection) */
#define HUB_CONNECTIONS_MAX 16
#define HUB_PARALLEL_MIN ((uint64_t)64 << 20) /* less than this left: one connection finishes it */
#define HUB_CHUNK ((uint64_t)16 << 20)        /* one range request of a parallel fetch */
#define HUB_RECORD_EVERY ((uint64_t)2 << 20)  /* a connection's bytes are synced and recorded this often */
#define HUB_SLOW_AFTER_MS 1000                 /* a file starts over one connection; after this */
#define HUB_FAST_CONNECTION ((uint64_t)64 << 20) /* ...below this many bytes/s, the rest over several */

struct hub_config {
    const char *endpoint;   /* NULL: HF_ENDPOINT, else HUB_DEFAULT_ENDPOINT */
    const char *token;      /* NULL: HF_TOKEN, if set */
    bool offline;           /* or HF_HUB_OFFLINE=1: only what is already here */
    const char *models_dir; /* required */
    const char *revision;   /* NULL: "main" */
    int max_attempts;       /* 0: HUB_MAX_ATTEMPTS */
    int backoff_ms;         /* 0: HUB_BACKOFF_MS */
    int stall_s;            /* 0: HUB_STALL_S */
    const atomic_bool *cancel; /* set by another thread: stop (the partial files stay) */
    int connections;        /* per file of at least HUB_PARALLEL_MIN bytes: 0: HUB_CONNECTIONS; 1: one */
};

/* Where a pull is, for a progress bar or Ollama's status lines. */
struct hub_progress {
    const char *status;   /* "listing", "downloading", "verifying", "success" */
    const char *id;       /* the model's id (canonical reference); "" while listing */
    const char *file;     /* the file being fetched (its path in the repo), or "" */
    const char *sha256;   /* its hash, or "" */
    int part, parts;      /* 1-based */
    uint64_t file_done, file_total;
    uint64_t done, total; /* bytes of every file of the model */
};
typedef void (*hub_progress_fn)(void *ctx, const struct hub_progress *p);

/* What a pull left in the models folder. */
struct hub_pulled {
    char id[HUBREF_TEXT_MAX];
    char commit[48];
    char path[4096];      /* the first (or only) file */
    uint64_t bytes;       /* of every file */
    int parts;
    uint64_t fetched;     /* bytes this pull downloaded (0 when the model was here) */
    bool already;         /* the model, at the hub's commit, was here already */
};

/* Pulls ref into cfg->models_dir (see the top); blocks until done, failed or cancelled.
 * 0 with *out filled; else, with the reason in err: CAIRN_EINVAL (a malformed
 * reference), CAIRN_ENOTFOUND (no such repo, revision, tag or file), CAIRN_EPERM (gated
 * or private: HF_TOKEN), CAIRN_EFORMAT (a file whose hash is not the hub's: deleted),
 * CAIRN_EFULL (not enough disk), CAIRN_EIO (the hub could not be reached or kept
 * failing), CAIRN_ESTATE (offline and not here; cancelled). */
int hub_pull(const struct hub_config *cfg, const char *ref, hub_progress_fn fn, void *ctx, struct hub_pulled *out,
             char *err, size_t errlen);

/* Searches the hub for repos with GGUF files whose names hold query (1..HUB_QUERY_MAX
 * bytes), most downloaded first, at most limit (1..HUB_SEARCH_MAX): *out is a new JSON
 * array of {"id": "OWNER/REPO", "ref": "hf.co/OWNER/REPO", "downloads", "likes",
 * "gated"}; entries whose id is not a repo name are left out. Errors as hub_pull's. */
#define HUB_QUERY_MAX 200
#define HUB_SEARCH_MAX 100
int hub_search(const struct hub_config *cfg, const char *query, int limit, json_t **out, char *err, size_t errlen);

/* Records model id, fetched from a peer into its local file (hubref_local_name) with
 * this hash and size, in a sidecar of models_dir, so the catalog names it as the peer
 * does. */
int hub_sidecar_put(const char *models_dir, const char *id, const char *sha256, uint64_t size, char *err,
                    size_t errlen);

/* Deletes model id from models_dir: a pulled model's files, partial files and sidecar,
 * or a local model's one file (found by the catalog's id rule). CAIRN_ENOTFOUND when
 * there is no such model, CAIRN_EIO when a file cannot be deleted. */
int hub_remove(const char *models_dir, const char *id, char *err, size_t errlen);

/* ---- models fetched by byte ranges (hub_sparse.c) ---- */

#define HUB_SPARSE_DIR ".sparse"             /* in the models folder; the catalog does not enter it */
#define HUB_HEADER_MAX ((uint64_t)64 << 20)  /* a GGUF header longer than this is refused */

/* models_dir/.sparse into out (cap bytes); CAIRN_ERANGE when it does not fit. */
int hub_sparse_dir(const char *models_dir, char *out, size_t cap);

/* Reads the header of ref's GGUF file(s) from the hub into models_dir/.sparse (see
 * hub_sparse.c): files of the model's sizes holding their headers only, so that a
 * catalog of that folder reads the model's card (placement, previews) before any layer
 * is here. id (HUBREF_TEXT_MAX bytes) gets the model's id. Already there at the hub's
 * commit: 0 without fetching. Errors as hub_pull's; CAIRN_EFORMAT for a file with no
 * GGUF header in its first HUB_HEADER_MAX bytes. */
int hub_sparse_header(const struct hub_config *cfg, const char *ref, char *id, char *err, size_t errlen);

struct hub_sparse_result {
    char path[4200];    /* the first file, in .sparse (or moved into the models folder) */
    uint64_t fetched;   /* bytes this call fetched */
    uint64_t needed;    /* bytes the layers read, all of them here now */
    bool promoted;      /* every byte is here: verified and moved into the models folder */
};

/* Fetches the byte ranges that layers [layer_begin, layer_end) (layer_end -1: to the
 * last) of the sparse model id read (model_slice_extents) and lacks, each synced before
 * the record names it, so a later call, in this process or another, asks only for what
 * is still missing. fn hears the progress (done/total: bytes of those ranges). When every
 * byte of the model is there, each file's SHA-256 is checked and the model moves into
 * the models folder. CAIRN_ENOTFOUND without hub_sparse_header first; CAIRN_EFULL;
 * CAIRN_EFORMAT when a hash differs (the sparse model is deleted); hub errors. */
int hub_sparse_fill(const struct hub_config *cfg, const char *id, int layer_begin, int layer_end, hub_progress_fn fn,
                    void *ctx, struct hub_sparse_result *out, char *err, size_t errlen);

/* Whether the sparse model id holds every byte layers [layer_begin, layer_end) read;
 * true with path (the first file) set. */
bool hub_sparse_covers(const char *models_dir, const char *id, int layer_begin, int layer_end, char *path,
                       size_t pathlen);

/* Deletes the sparse model id (files, records, sidecar). CAIRN_ENOTFOUND when there is
 * none, CAIRN_EIO. */
int hub_sparse_remove(const char *models_dir, const char *id, char *err, size_t errlen);

/* The id a sidecar file (models_dir/<stem>.pull.json) names for the GGUF file at gguf_path,
 * into id (HUBREF_TEXT_MAX bytes); false when there is none or it is not valid. */
bool hub_sidecar_id(const char *gguf_path, char *id);

#endif
