/* The node's HTTP server: routing with path parameters, bounded bodies, JSON with a
 * nesting limit, bearer API key, CORS, an access log, and streams that another thread
 * writes (SSE, NDJSON) and that report when the client has gone.
 *
 * Threading: libmicrohttpd runs one thread per open connection (capped by
 * max_connections). A handler runs on its connection's thread and may block; a stream
 * or deferred reply parks that thread in poll() on the client socket and an eventfd,
 * so a writer never waits for the client and a client that hangs up is noticed at
 * once, whether or not anything was written yet. */
#ifndef CAIRN_API_HTTP_H
#define CAIRN_API_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct http_server;
struct http_request;
struct http_stream;

#define HTTP_JSON_DEPTH_DEFAULT 64                   /* http_config.max_json_depth */
#define HTTP_JSON_VALUES_DEFAULT ((size_t)1 << 18)   /* http_config.max_json_values */

/* Zero fields take the defaults in brackets. */
struct http_config {
    const char *bind_addr;           /* numeric IPv4/IPv6 address ["127.0.0.1"] */
    uint16_t port;                   /* 0: an ephemeral port, see http_server_port */
    unsigned max_connections;        /* open connections, one thread each [256] */
    unsigned max_per_client;         /* open connections from one client address [64] */
    size_t max_json_values;          /* a JSON body with more values gets 413 before it is
                                        parsed: the parse's memory budget [262144] */
    unsigned head_timeout_s;         /* a request head not whole this long after the
                                        connection opened (or the last reply) closes it [15] */
    unsigned body_timeout_s;         /* a body not whole this long after its head [120] */
    size_t max_body_bytes;           /* larger request bodies get 413 [16 MiB] */
    int max_json_depth;              /* deeper JSON bodies get 400 [64] */
    const char *api_key;             /* NULL or "": no auth; else Bearer or x-api-key */
    const char *const *cors_origins; /* NULL-terminated; "*" allows any; NULL: no CORS */
    const char *const *allowed_hosts; /* Host names allowed besides IP literals, localhost
                                        and this machine's name (NULL-terminated; "*" any) */
    unsigned idle_timeout_s;         /* idle or half-sent request closed after [30] */
    size_t stream_queue_bytes;       /* unsent bytes a stream may hold [1 MiB] */
    unsigned keepalive_ms;           /* idle SSE streams send a comment this often [15000] */
    unsigned stop_grace_ms;          /* http_server_stop waits this long for streams [2000] */
    bool access_log;                 /* one log_info line per request */
};

/* A route handler; runs on the connection's thread and must reply exactly once through
 * http_reply_* (or hand off with http_reply_stream/http_reply_defer) before returning,
 * else the client gets 500. req is valid only until the handler returns. */
typedef void (*http_handler_fn)(struct http_request *req, void *ctx);

/* An API's error body for an HTTP status and message (param: the request field it is
 * about, or NULL); a new object, NULL when out of memory. */
typedef json_t *(*http_error_fn)(int status, const char *message, const char *param);

/* Binds the listening socket (close-on-exec) without serving yet; *out owned by the
 * caller (http_server_release). Fails with a message on bad config or bind errors. */
int http_server_create(struct http_server **out, const struct http_config *cfg, char *err,
                       size_t errlen);

/* The bound port (the ephemeral one when cfg->port was 0). */
uint16_t http_server_port(const struct http_server *srv);

/* Adds a route before http_server_start. method: "GET", "POST", ... (HEAD matches GET).
 * pattern: "/" and segments, each literal, ":name" (one non-empty segment) or "*name"
 * (the rest of the path, zero or more segments; last only), e.g. "/instance/:id".
 * The most specific match wins
 * (literal over parameter over rest, segment by segment). EINVAL on a bad or duplicate
 * pattern, ESTATE once started, ENOMEM. */
int http_route(struct http_server *srv, const char *method, const char *pattern,
               http_handler_fn fn, void *ctx);

/* As http_route; besides, the server's own error replies on this route (body too
 * large, JSON that is malformed or nested too deep, a handler that made no reply) take
 * their body from errors (param NULL), so that an API answers in its own error shape.
 * errors NULL (or an errors that returns NULL): http_reply_error's shape. */
int http_route_errors(struct http_server *srv, const char *method, const char *pattern,
                      http_handler_fn fn, void *ctx, http_error_fn errors);

/* As http_route, for a route served without the API key (the dashboard's page and
 * assets, which hold no data: the page asks for the key and sends it on every API call). */
int http_route_open(struct http_server *srv, const char *method, const char *pattern,
                    http_handler_fn fn, void *ctx);

/* Starts serving on the socket bound by create. */
int http_server_start(struct http_server *srv, char *err, size_t errlen);

/* Stops serving: new requests get 503, open streams are closed as STOPPED (their
 * queued bytes are flushed for up to stop_grace_ms, then sockets are shut), deferred
 * replies get 503, and every connection thread is joined (a handler still blocked in
 * user code delays this). Idempotent. Streams stay valid until released. */
void http_server_stop(struct http_server *srv);

/* Stops the server and frees it; accepts NULL. */
void http_server_release(struct http_server *srv);

#include "api/json_scan.h" /* http_json_depth, http_json_values */

/* --- Request (valid inside the handler only; strings owned by the request) --- */

const char *http_req_method(const struct http_request *req);
/* Decoded path without the query string. */
const char *http_req_path(const struct http_request *req);
/* Value of a path parameter of the route (":id" -> "id"), NULL when absent. */
const char *http_req_param(const struct http_request *req, const char *name);
/* First value of a query argument (decoded), NULL when absent. */
const char *http_req_query(const struct http_request *req, const char *name);
/* A request header (case-insensitive name), NULL when absent. */
const char *http_req_header(const struct http_request *req, const char *name);
/* The body (NUL-terminated, "" when empty); *len gets its length when len is set. */
const char *http_req_body(const struct http_request *req, size_t *len);
/* The body parsed as JSON (borrowed), or NULL when empty or not JSON. A body sent as
 * JSON (Content-Type application/json or +json) that does not parse, or any JSON-typed
 * or '{'/'['-led body nested deeper than max_json_depth, was already refused with 400. */
json_t *http_req_json(const struct http_request *req);
/* Remote address as text ("127.0.0.1"). */
const char *http_req_remote(const struct http_request *req);
/* True when the client has closed its side of the connection (non-blocking check). */
bool http_req_client_gone(const struct http_request *req);

/* --- Replies (from the handler, once; ESTATE when a reply was already made) --- */

/* Adds a header to the reply made next by this handler (e.g. Retry-After). */
int http_reply_header(struct http_request *req, const char *name, const char *value);
/* Replies with body as compact JSON; takes the reference to body (NULL gives 500). */
int http_reply_json(struct http_request *req, int status, json_t *body);
/* Replies {"error":{"message":..., "type":..., "code":status}}; message is printf-like
 * and any invalid UTF-8 in it is replaced. */
int http_reply_error(struct http_request *req, int status, const char *type,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Replies text/plain; charset=utf-8. */
int http_reply_text(struct http_request *req, int status, const char *text);
/* Replies len bytes of data (copied) with the given content type. */
int http_reply_bytes(struct http_request *req, int status, const char *content_type,
                     const void *data, size_t len);

/* Replies len bytes of the open file fd from offset (sent by the server from the file,
 * nothing copied; for HEAD only the headers). Takes fd: it is closed when the reply is
 * done, and on failure. */
int http_reply_file(struct http_request *req, int status, const char *content_type, int fd,
                    uint64_t offset, uint64_t len);

/* Rewrites n bytes of a file reply in place before they are sent (file_offset: where
 * buf[0] sits in the file). Runs on the connection's thread, one piece at a time. */
typedef void (*http_xform_fn)(void *ctx, uint8_t *buf, size_t n, uint64_t file_offset);

/* As http_reply_file, but the server reads the file piece by piece (pread at offset +
 * position) and passes each piece through fn before sending it; Content-Length stays
 * len. Takes fd and ctx: fd is closed and ctx_free(ctx) called (when not NULL) once the
 * reply is done, and on failure. For HEAD only the headers go and fn never runs. */
int http_reply_file_xform(struct http_request *req, int status, const char *content_type, int fd,
                          uint64_t offset, uint64_t len, http_xform_fn fn, void *ctx,
                          void (*ctx_free)(void *ctx));

/* Starts a streamed reply (chunked; the connection closes when it ends) and gives the
 * handler a stream any thread may write until it finishes. Sending starts when the
 * handler returns; what is written before that waits in the queue (stream_queue_bytes
 * at most). *out is owned by the caller (http_stream_release). */
int http_reply_stream(struct http_request *req, int status, const char *content_type,
                      struct http_stream **out);
/* Defers the reply: the handler returns and another thread later answers through
 * http_stream_reply_json/_error or starts a stream with http_stream_start; meanwhile a
 * client that hangs up closes the stream as GONE. *out owned by the caller. */
int http_reply_defer(struct http_request *req, struct http_stream **out);

/* --- Streams (any thread) --- */

enum http_stream_state {
    HTTP_STREAM_OPEN = 0,  /* writable */
    HTTP_STREAM_FINISHED,  /* the writer finished or replied */
    HTTP_STREAM_GONE,      /* the client closed the connection (or the reply ended) */
    HTTP_STREAM_TOO_SLOW,  /* a write overflowed stream_queue_bytes; connection shut */
    HTTP_STREAM_STOPPED,   /* the server is stopping */
};

/* Called once when a stream closes as GONE or STOPPED (not on the writer's own finish
 * or a write that returned EFULL), on the connection's or the stopping thread, without
 * locks held. It may call http_stream_* on s and must not block long; it may release s
 * as its last act (the stream then frees itself once the connection is done with it). */
typedef void (*http_stream_close_fn)(void *arg, struct http_stream *s,
                                     enum http_stream_state why);

/* Registers the close callback (one per stream); when the stream is already GONE or
 * STOPPED, fn runs now on the caller's thread. Never called after release returns. */
void http_stream_on_close(struct http_stream *s, http_stream_close_fn fn, void *arg);
/* Adds a header to a deferred reply before http_stream_start or _reply_*. */
int http_stream_header(struct http_stream *s, const char *name, const char *value);
/* Starts streaming on a deferred reply; ESTATE when already started or closed. */
int http_stream_start(struct http_stream *s, int status, const char *content_type);
/* Answers a deferred reply in full and finishes the stream; takes the reference to
 * body. ESTATE when it already started or closed. */
int http_stream_reply_json(struct http_stream *s, int status, json_t *body);
int http_stream_reply_error(struct http_stream *s, int status, const char *type,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Queues len bytes without blocking (write each SSE event or NDJSON line whole).
 * ESTATE when the stream is closed; EFULL when the unsent bytes would exceed
 * stream_queue_bytes: the stream is then closed as TOO_SLOW and its socket shut. */
int http_stream_write(struct http_stream *s, const void *data, size_t len);
int http_stream_printf(struct http_stream *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Writes j as one compact JSON line ending in "\n" (NDJSON). */
int http_stream_json_line(struct http_stream *s, const json_t *j);
/* Sets bytes the stream sends after interval_ms without data (SSE ": ping\n\n");
 * interval 0 takes the server's keepalive_ms, bytes NULL turns it off. */
void http_stream_keepalive(struct http_stream *s, const char *bytes, unsigned interval_ms);
/* The writer is done: queued bytes are sent, then the reply ends. Idempotent. */
void http_stream_finish(struct http_stream *s);
enum http_stream_state http_stream_state(const struct http_stream *s);
/* True once the stream is not OPEN (gone, finished, too slow or stopped). */
bool http_stream_closed(const struct http_stream *s);
/* Waits up to timeout_ms (negative: forever) for the stream to close; true if closed. */
bool http_stream_wait_closed(struct http_stream *s, int timeout_ms);
/* Bytes handed to the connection so far (for tests and logs). */
uint64_t http_stream_bytes_sent(const struct http_stream *s);
/* Finishes the stream if open, drops the caller's reference; accepts NULL. After it
 * returns the close callback no longer runs. */
void http_stream_release(struct http_stream *s);

#endif
