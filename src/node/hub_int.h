/* Private to the hub's files, included by no other but the tests of the listing
 * (tests/node/test_hub.c, tests/fuzz/fuzz_hublist.c): hub_http.c (one exchange with the
 * hub, its retries and errors; a repo's listing), hub_fetch.c (one file of a pull),
 * hub_sparse.c and hub.c (the sidecar, a pull, removing a model). */
#ifndef CAIRN_NODE_HUB_INT_H
#define CAIRN_NODE_HUB_INT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "node/hub.h"
#include "node/sha256.h"

#define HDR_MAX 512 /* longest reply header value kept */

/* A pull's settings once the environment is read. */
struct hub {
    const struct hub_config *cfg;
    char endpoint[512];
    const char *token;
    const char *revision;
    bool offline;
    int attempts, backoff_ms, stall_s;
    int connections;
};

/* What an answer said, as far as we read it. */
struct reply {
    long status;
    char error_code[HDR_MAX]; /* X-Error-Code */
    char retry_after[HDR_MAX];
    char link[2048];          /* Link (listing pages) */
    char commit[HDR_MAX];     /* X-Repo-Commit: the hub's answer, before a redirect */
    char etag[HDR_MAX];       /* X-Linked-Etag */
    char crange[HDR_MAX];     /* Content-Range of the last answer */
    /* a body kept in memory (JSON) */
    char *body;
    size_t len, cap, max;
    bool too_big;
};

/* A repo's files at a commit. */
struct listing {
    struct hub_file *f; /* paths and hashes owned */
    size_t n, cap;
    char commit[48];
};

/* One file being fetched, and the pull's progress. */
struct file_fetch {
    const struct hub *h;
    const struct hub_file *src;
    int fd;
    struct sha256 sha;
    uint64_t have;          /* bytes in the partial file, all hashed */
    uint64_t fetched;       /* bytes this pull downloaded, all attempts */
    bool body_checked;      /* the answer's status was looked at */
    bool body_ok;           /* it carries our bytes */
    char bad[512];
    bool local;             /* bad is about this machine (no retry) */
    struct reply r;
    /* progress */
    hub_progress_fn fn;
    void *ctx;
    struct hub_progress p;
    uint64_t done_before;   /* bytes of the earlier parts */
    int64_t reported_ms;
    /* one connection that proves slow hands over to several (hub_fetch.c) */
    int64_t get_t0_ms;      /* when the current GET started */
    uint64_t get_have0;     /* f->have then */
    bool go_parallel;       /* the GET was stopped to go on over several connections */
};

/* ---- hub_http.c ---- */

/* The settings of cfg and the environment (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE). */
void hub_settle(struct hub *h, const struct hub_config *cfg);
/* libcurl's global start, once per process. */
void hub_curl_init(void);
bool hub_cancelled(const struct hub *h);
/* Waits ms in slices, unless cancelled. */
void hub_nap_ms(const struct hub *h, int64_t ms);
/* A curl handle for url with the token (sent to the hub's host only: curl drops it on a
 * redirect to another host), redirects followed, r's header callback. */
CURL *hub_handle(const struct hub *h, const char *url, struct reply *r, char *curl_err);
/* 429, 408 and 5xx are worth trying again. */
bool hub_retryable(long status);
/* The error of an answer that will not be retried: 401/403 say about HF_TOKEN, 404 names
 * what X-Error-Code says is missing. */
int hub_status_error(const struct hub *h, const struct reply *r, const char *what, char *err, size_t errlen);
/* Waits before attempt k (from 1): Retry-After when the hub said one, else the doubling
 * backoff. */
void hub_wait_before_retry(const struct hub *h, const struct reply *r, int k);
/* GET url as JSON into *out, retrying what is worth retrying; what names it in errors. */
int hub_get_json(const struct hub *h, const char *url, const char *what, json_t **out, struct reply *r, char *err,
                 size_t errlen);
bool hub_is_hex(const char *s, size_t n);
/* Adds the files of one page of a listing (the hub's JSON array of entries; folders and
 * malformed entries skipped) to l. CAIRN_EFORMAT when page is not an array, CAIRN_ERANGE
 * past HUB_LIST_MAX_FILES, CAIRN_ENOMEM; l keeps what was added (hub_listing_free). */
int hub_listing_add_page(struct listing *l, const json_t *page);
/* The next page's URL from a Link header (`<url>; rel="next"`) into url (cap bytes):
 * false unless there is one, it fits, and it is on endpoint (the endpoint, then '/'). */
bool hub_next_page(const char *endpoint, const char *link, char *url, size_t cap);
/* The revision's commit, then every file of the repo at that commit. */
int hub_list_repo(const struct hub *h, const struct hub_ref *ref, struct listing *l, char *err, size_t errlen);
void hub_listing_free(struct listing *l);

/* ---- hub.c ---- */

/* The start of every call on a reference: h settled from cfg and the environment, text
 * parsed into ref, a models folder named. */
int hub_begin(const struct hub_config *cfg, const char *text, struct hub *h, struct hub_ref *ref, char *err,
              size_t errlen);
/* Lists ref's repo at its revision's commit into l, chooses the files it names into pick
 * (*n_pick of them) and writes the model's id (HUBREF_TEXT_MAX bytes). */
int hub_resolve(const struct hub *h, const struct hub_ref *ref, struct listing *l, size_t pick[HUBREF_MAX_PARTS],
                size_t *n_pick, char *id, char *err, size_t errlen);

/* dir/name into out (cap bytes); false when it does not fit. */
bool hub_in_dir(const char *dir, const char *name, char *out, size_t cap);
/* dir's sidecar of id; NULL when there is none or it is not one. */
json_t *hub_sidecar_load(const char *dir, const char *id);
/* Stores j (taken) as id's sidecar in dir, through a temporary file and a rename. */
int hub_sidecar_store(const char *dir, const char *id, json_t *j, char *err, size_t errlen);
/* Writes the sidecar of the chosen files of a listing into dir. */
int hub_sidecar_write(const struct hub *h, const char *dir, const char *id, const struct hub_ref *ref,
                      const struct listing *l, const size_t *pick, size_t n_pick, char *err, size_t errlen);

/* ---- hub_fetch.c ---- */

/* Fetches f->src from url into partial_path (resuming what is there) and checks its
 * SHA-256: 0 when the partial file is whole and right. */
int hub_fetch_file(struct file_fetch *f, const char *url, const char *partial_path, char *err, size_t errlen);

/* Fetches bytes [offset, offset + len) of the file at url (a Range request, resumed
 * within the range after a failure, as the pull's attempts allow) and writes them at the
 * same offset of fd; *fetched counts the bytes that arrived (all attempts), and fn (not
 * NULL) hears of them as they do. The answer must be a 206 for exactly that range. */
typedef void (*hub_range_fn)(void *ctx, uint64_t bytes);
int hub_fetch_range(const struct hub *h, const char *url, int fd, uint64_t offset, uint64_t len, hub_range_fn fn,
                    void *ctx, char *err, size_t errlen);

#endif
