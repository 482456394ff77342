/* The terminal's HTTP client of a node's public API (libcurl): JSON exchanges, and
 * streamed replies read line by line (SSE, Ollama's NDJSON). Everything the node says is
 * held to limits: a JSON body to CLIENT_BODY_MAX bytes, a streamed line to
 * CLIENT_LINE_MAX. Used by cairn run, status, ps and stop. */
#ifndef CAIRN_CLI_CLIENT_H
#define CAIRN_CLI_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#define CLIENT_DEFAULT_PORT 52415
#define CLIENT_BODY_MAX ((size_t)16 << 20) /* a /state of a big cluster fits */
#define CLIENT_LINE_MAX ((size_t)1 << 20)  /* one SSE or NDJSON line */
#define CLIENT_CONNECT_S 5

/* Where the node's API is, and its key. A value: copy it freely. */
struct client {
    char base[300]; /* "http://HOST:PORT", no trailing slash */
    char key[300];  /* "" or the API key (Authorization: Bearer) */
};

/* Settles the node's address: host ("HOST:PORT", "HOST", ":PORT" or an http:// URL),
 * else $CAIRN_HOST, else the address a node of the user's data dir noted there
 * (DATA_DIR/api_address), else 127.0.0.1:52415; the key from $CAIRN_API_KEY. 0, or
 * CAIRN_EINVAL with the reason in err. */
int client_init(struct client *c, const char *host, char *err, size_t errlen);

/* One exchange: method on path with body (JSON, may be NULL). Returns the HTTP status
 * (0 when no answer came, with the reason in err); *out (when not NULL) gets the reply's
 * JSON, or NULL when it was not JSON. On a status >= 400 err gets the node's message. */
int client_json(const struct client *c, const char *method, const char *path, const json_t *body, json_t **out,
                char *err, size_t errlen);

/* The reply's body as text (NUL-terminated, malloc'd into *out) of a GET of path; the
 * status as client_json's. */
int client_text(const struct client *c, const char *path, char **out, char *err, size_t errlen);

/* Called with each line of a streamed reply (without its end of line, NUL-terminated);
 * nonzero stops the transfer. */
typedef int (*client_line_fn)(void *ctx, char *line, size_t len);

/* A streamed exchange: POST (body JSON) to path, fn called with each line as it comes.
 * Stops when the node closes the reply, fn returns nonzero, or *cancel becomes true (the
 * connection is closed, which cancels the request on the node); *cancelled says which.
 * Returns the HTTP status (0: no answer, err says why); on a status >= 400 the lines are
 * not given to fn and err gets the node's message. */
int client_stream(const struct client *c, const char *path, const json_t *body, const atomic_bool *cancel,
                  client_line_fn fn, void *ctx, bool *cancelled, char *err, size_t errlen);

/* Whether a node answers on c (GET /node_id, within about a second). */
bool client_alive(const struct client *c);

#endif
