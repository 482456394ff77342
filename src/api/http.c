/* HTTP server on libmicrohttpd in thread-per-connection mode.
 *
 * Why one thread per connection: a handler may block (a non-streamed completion waits
 * for its tokens), and a stream's content reader may wait for the writer, without
 * holding up any other client. libmicrohttpd's pooled modes would need
 * suspend/resume for that, and stopping a daemon that still has a suspended connection
 * aborts the process; here a waiting connection simply sits in poll() on its socket
 * and an eventfd, which also tells us the moment its client hangs up. The cost is a
 * thread per open connection, capped by max_connections and reclaimed by the idle
 * timeout.
 *
 * This file: the server's lifecycle. Routing and requests in are in http_req.c, replies
 * and streams in http_reply.c; what they share is in http_int.h. */
#define _GNU_SOURCE
#include "api/http_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"

/* Copies a NULL-terminated list of strings (a "*" among them sets *any). */
static int copy_list(const char *const *src, char ***dst, size_t *n, bool *any)
{
    for (const char *const *o = src; o && *o; o++) {
        char **c = realloc(*dst, (*n + 1) * sizeof *c);
        if (!c)
            return CAIRN_ENOMEM;
        *dst = c;
        if (!((*dst)[*n] = strdup(*o)))
            return CAIRN_ENOMEM;
        if (strcmp(*o, "*") == 0)
            *any = true;
        (*n)++;
    }
    return 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    log_debug("http: libmicrohttpd: %s", line);
}

/* ---------- server ---------- */

int http_server_create(struct http_server **out, const struct http_config *cfg, char *err,
                       size_t errlen)
{
    *out = NULL;
    struct http_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    srv->listen_fd = -1;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cond, NULL);
    atomic_init(&srv->stopping, false);
    srv->bind_addr = strdup(cfg->bind_addr ? cfg->bind_addr : "127.0.0.1");
    srv->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    srv->max_connections = cfg->max_connections ? cfg->max_connections : 256;
    srv->max_per_client = cfg->max_per_client ? cfg->max_per_client : 64;
    srv->max_json_values = cfg->max_json_values ? cfg->max_json_values : HTTP_JSON_VALUES_DEFAULT;
    srv->head_timeout_s = cfg->head_timeout_s ? cfg->head_timeout_s : 15;
    srv->body_timeout_s = cfg->body_timeout_s ? cfg->body_timeout_s : 120;
    pthread_mutex_init(&srv->guard_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&srv->guard_cv, &ca);
    pthread_condattr_destroy(&ca);
    srv->max_body = cfg->max_body_bytes ? cfg->max_body_bytes : (size_t)16 << 20;
    srv->max_depth = cfg->max_json_depth > 0 ? cfg->max_json_depth : HTTP_JSON_DEPTH_DEFAULT;
    srv->idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 30;
    srv->stream_queue = cfg->stream_queue_bytes ? cfg->stream_queue_bytes : (size_t)1 << 20;
    srv->keepalive_ms = cfg->keepalive_ms ? cfg->keepalive_ms : 15000;
    srv->stop_grace_ms = cfg->stop_grace_ms ? cfg->stop_grace_ms : 2000;
    srv->access_log = cfg->access_log;
    int rc = CAIRN_ENOMEM;
    if (!srv->bind_addr || (cfg->api_key && cfg->api_key[0] && !srv->api_key))
        goto err;
    if (srv->max_body > ((size_t)1 << 40)) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "max_body_bytes too large");
        goto fail;
    }
    if (copy_list(cfg->cors_origins, &srv->cors, &srv->n_cors, &srv->cors_any) ||
        copy_list(cfg->allowed_hosts, &srv->hosts, &srv->n_hosts, &srv->hosts_any))
        goto err;
    if (gethostname(srv->own_host, sizeof srv->own_host))
        srv->own_host[0] = 0;
    srv->own_host[sizeof srv->own_host - 1] = 0;

    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } addr = {0};
    socklen_t alen;
    if (inet_pton(AF_INET, srv->bind_addr, &addr.in.sin_addr) == 1) {
        addr.in.sin_family = AF_INET;
        addr.in.sin_port = htons(cfg->port);
        alen = sizeof addr.in;
    } else if (inet_pton(AF_INET6, srv->bind_addr, &addr.in6.sin6_addr) == 1) {
        addr.in6.sin6_family = AF_INET6;
        addr.in6.sin6_port = htons(cfg->port);
        alen = sizeof addr.in6;
    } else {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "bind address %s is not a numeric address",
                        srv->bind_addr);
        goto fail;
    }
    srv->listen_fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->listen_fd < 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "socket: %s", strerror(errno));
        goto fail;
    }
    int one = 1;
    setsockopt(srv->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(srv->listen_fd, &addr.sa, alen) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "bind %s:%u: %s", srv->bind_addr,
                        (unsigned)cfg->port, strerror(errno));
        goto fail;
    }
    if (listen(srv->listen_fd, 256) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "listen: %s", strerror(errno));
        goto fail;
    }
    alen = sizeof addr;
    if (getsockname(srv->listen_fd, &addr.sa, &alen) != 0) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "getsockname: %s", strerror(errno));
        goto fail;
    }
    srv->port = ntohs(addr.sa.sa_family == AF_INET ? addr.in.sin_port : addr.in6.sin6_port);
    *out = srv;
    return 0;
err:
    rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
fail:
    http_server_release(srv);
    return rc;
}

uint16_t http_server_port(const struct http_server *srv) { return srv->port; }

int http_server_start(struct http_server *srv, char *err, size_t errlen)
{
    if (srv->started || srv->stopped)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "server already started");
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (http_guard_start(srv))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot start the HTTP deadline thread");
    srv->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, http_on_access, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
        MHD_OPTION_LISTEN_SOCKET, srv->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
        srv->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, srv->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
        http_on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, http_guard_notify, srv,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, srv->max_per_client, MHD_OPTION_END);
    if (!srv->daemon) {
        http_guard_stop(srv);
        return cairn_fail(err, errlen, CAIRN_EIO, "libmicrohttpd did not start on %s:%u",
                          srv->bind_addr, (unsigned)srv->port);
    }
    srv->listen_fd = -1; /* the daemon closes it */
    srv->started = true;
    return 0;
}

void http_server_stop(struct http_server *srv)
{
    if (!srv || srv->stopped)
        return;
    srv->stopped = true;
    if (!srv->started)
        return;
    atomic_store(&srv->stopping, true);
    /* Writers see their streams STOPPED and stop; readers flush what is queued and end
     * the reply. */
    http_stop_streams(srv);
    /* Shuts every socket down (a stream still flushing ends with an error) and joins
     * the connection threads. */
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    http_guard_stop(srv);
}

void http_server_release(struct http_server *srv)
{
    if (!srv)
        return;
    http_server_stop(srv);
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    http_routes_free(srv);
    for (size_t i = 0; i < srv->n_cors; i++)
        free(srv->cors[i]);
    free(srv->cors);
    for (size_t i = 0; i < srv->n_hosts; i++)
        free(srv->hosts[i]);
    free(srv->hosts);
    free(srv->bind_addr);
    free(srv->api_key);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cond);
    pthread_mutex_destroy(&srv->guard_mu);
    pthread_cond_destroy(&srv->guard_cv);
    free(srv);
}
