/* Private to the HTTP server, shared by its three files: http.c (the server's lifecycle),
 * http_req.c (routing and requests in: checks, limits, body, JSON, the libmicrohttpd
 * callbacks) and http_reply.c (replies and streams out). Included only from those. */
#ifndef CAIRN_API_HTTP_INT_H
#define CAIRN_API_HTTP_INT_H

#include "api/http.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_PARAMS 16 /* path parameters of one route */

struct seg; /* a pattern's segment (http_req.c) */

/* A route: a method, a pattern split into segments, its handler and error shape. */
struct route {
    char *method;
    char *pattern;
    struct seg *segs;
    int nseg;
    http_handler_fn fn;
    void *ctx;
    http_error_fn errors; /* the route's error shape, or NULL */
    bool open;            /* served without the API key (http_route_open) */
};

/* A header for a reply, in a list. */
struct hdr {
    char *name, *value;
    struct hdr *next;
};

/* The server: settings, socket, daemon, routes, and the streams attached to a connection. */
struct http_server {
    char *bind_addr, *api_key;
    char **cors;     /* allowed origins (owned) */
    size_t n_cors;
    bool cors_any;
    char **hosts;    /* Host names allowed besides IP literals, localhost and ours (owned) */
    size_t n_hosts;
    bool hosts_any;
    char own_host[256]; /* gethostname(), "" if unknown */
    unsigned max_connections, idle_timeout_s, keepalive_ms, stop_grace_ms;
    unsigned max_per_client, head_timeout_s, body_timeout_s;
    size_t max_body, stream_queue, max_json_values;
    int max_depth;
    bool access_log;

    int listen_fd; /* owned until the daemon takes it */
    uint16_t port;
    struct MHD_Daemon *daemon;
    struct route *routes;
    size_t n_routes, cap_routes;
    bool started, stopped;
    atomic_bool stopping;

    /* deadlines of requests in (http_guard.c) */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv; /* CLOCK_MONOTONIC */
    struct http_guard_conn *guarded;
    pthread_t guard_thread;
    bool guard_running, guard_stop;
    uint64_t guard_cuts; /* connections closed for a deadline */

    pthread_mutex_t mu; /* guards the stream list */
    pthread_cond_t cond;
    struct http_stream *streams; /* streams still attached to a connection */
    size_t n_streams;
};

/* One request, from its first call on the connection to its completion. */
struct http_request {
    struct http_server *srv;
    struct MHD_Connection *conn;
    int sockfd;
    int64_t t0;
    char *method, *path;
    char remote[INET6_ADDRSTRLEN];
    const char *origin_ok; /* Origin to echo in CORS headers, or NULL */
    const struct route *route;
    const char *param_name[HTTP_MAX_PARAMS];
    char *param_val[HTTP_MAX_PARAMS];
    int n_params;
    char *body;
    size_t body_len, body_cap;
    json_t *json;
    struct hdr *hdrs; /* extra headers for the next reply */
    bool replied;
    int status;
    uint64_t bytes;
    struct http_stream *stream; /* one reference, dropped when the request completes */
};

/* A deferred or streamed reply; its writer and its connection each hold a reference. */
struct http_stream {
    struct http_server *srv;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int efd;    /* wakes the connection thread waiting in poll() */
    int sockfd; /* the connection's socket; -1 once the request completed */
    enum http_stream_state state;
    bool waiting; /* the connection thread sits in poll() */

    bool started, replied;
    int status;
    char *ctype;
    struct hdr *hdrs;
    char *reply_body; /* a deferred full reply */
    size_t reply_len;

    char *q; /* unsent bytes are q[q_off, q_len) */
    size_t q_off, q_len, q_cap, q_max;
    char *ka;
    size_t ka_len;
    unsigned ka_ms;
    uint64_t sent;

    http_stream_close_fn cb;
    void *cb_arg;
    bool cb_done, cb_running, cb_pending;
    pthread_t cb_thread;

    struct http_stream *prev, *next; /* server list */
    bool listed;
};

/* ---- http_req.c ---- */

/* libmicrohttpd's access handler (cls: the server): checks a request's headers, reads
 * its body, then runs its route's handler. */
enum MHD_Result http_on_access(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version,
                               const char *upload_data, size_t *upload_size, void **req_cls);

/* libmicrohttpd's completion callback (cls: the server): detaches the request's stream,
 * writes the access log line and frees the request. */
void http_on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                       enum MHD_RequestTerminationCode toe);

/* Frees the server's routes. */
void http_routes_free(struct http_server *srv);

/* ---- http_reply.c ---- */

/* Frees a list of headers; accepts NULL. */
void http_hdr_free(struct hdr *h);

/* Queues resp (taken, NULL gives MHD_NO) with the CORS, the request's and the extra
 * headers; records the status and the body's size for the access log. */
enum MHD_Result http_queue(struct http_request *req, int status, struct MHD_Response *resp,
                           const struct hdr *extra, uint64_t bytes);

/* Queues an error reply in the route's error shape, else http_reply_error's. */
enum MHD_Result http_queue_error(struct http_request *req, int status, const char *type,
                                 const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* After the handler deferred or started a stream: waits (on the connection's thread)
 * until it has something to send, then queues the response. */
enum MHD_Result http_serve_stream(struct http_request *req);

/* The request of s completed: an OPEN s closes as GONE (its close callback runs), s
 * leaves the server's list and the request's reference is dropped. *bytes becomes what
 * a started stream sent. */
void http_stream_detach(struct http_stream *s, uint64_t *bytes);

/* Closes every stream attached to a connection as STOPPED (writers stop, readers flush
 * what is queued) and waits up to stop_grace_ms for their connections to let them go. */
void http_stop_streams(struct http_server *srv);

/* ---- http_guard.c: deadlines a trickle of bytes does not reset ---- */

#define HTTP_GUARD_HEAD 0 /* waiting for a request head */
#define HTTP_GUARD_BODY 1 /* head in, waiting for the body */
#define HTTP_GUARD_BUSY 2 /* handler or reply under way: no deadline */

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION: tracks a connection from its start. */
void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe);
/* Moves conn to a phase (HTTP_GUARD_*), starting that phase's deadline now. */
void http_guard_phase(struct http_server *srv, struct MHD_Connection *conn, int phase);
/* Starts / stops the thread that closes connections past their deadline; 0 or -1. */
int http_guard_start(struct http_server *srv);
void http_guard_stop(struct http_server *srv);

#endif
