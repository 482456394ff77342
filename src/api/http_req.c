/* The HTTP server's requests in: routing (patterns with parameters, most specific
 * match), the checks made on a request's headers (stopping, Host, CORS, API key,
 * browser bodies, size limits), its body and JSON, and the libmicrohttpd callbacks that
 * run the handler and log the request when it completes. */
#define _GNU_SOURCE
#include "api/http_int.h"

#include "api/hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#define MAX_SEGS 64

enum seg_kind { SEG_REST = 0, SEG_PARAM = 1, SEG_LIT = 2 }; /* value = specificity */

struct seg {
    enum seg_kind kind;
    char *text; /* literal text or parameter name */
};

/* ---------- small helpers ---------- */

/* Copy of s for a log line: control bytes become '?', at most max bytes. */
static void log_clean(char *dst, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++)
        dst[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    dst[i] = 0;
}
static bool ct_equal(const char *given, const char *key)
{
    size_t gl = strlen(given), kl = strlen(key);
    unsigned diff = (unsigned)(gl != kl);
    /* The loop runs over the key's length whatever was given. */
    for (size_t i = 0; i < kl; i++) {
        unsigned char g = i < gl ? (unsigned char)given[i] : 0;
        diff |= (unsigned)(g ^ (unsigned char)key[i]);
    }
    return diff == 0;
}
/* ---------- routing ---------- */

struct path_segs {
    const char *path;
    size_t off[MAX_SEGS], len[MAX_SEGS];
    int n;       /* segments recorded */
    bool excess; /* more than MAX_SEGS */
};

static bool split_path(const char *path, struct path_segs *ps)
{
    ps->path = path;
    ps->n = 0;
    ps->excess = false;
    if (path[0] != '/')
        return false;
    size_t i = 1;
    for (;;) {
        if (ps->n == MAX_SEGS) {
            ps->excess = true;
            return true;
        }
        size_t j = i;
        while (path[j] && path[j] != '/')
            j++;
        ps->off[ps->n] = i;
        ps->len[ps->n] = j - i;
        ps->n++;
        if (!path[j])
            return true;
        i = j + 1;
    }
}

static bool route_matches(const struct route *r, const struct path_segs *ps)
{
    for (int i = 0; i < r->nseg; i++) {
        const struct seg *g = &r->segs[i];
        if (g->kind == SEG_REST)
            return true;
        if (i >= ps->n)
            return false;
        const char *p = ps->path + ps->off[i];
        size_t n = ps->len[i];
        if (g->kind == SEG_LIT && (strlen(g->text) != n || memcmp(g->text, p, n) != 0))
            return false;
        if (g->kind == SEG_PARAM && n == 0)
            return false;
    }
    return r->nseg == ps->n && !ps->excess;
}

/* Positive when a is more specific than b. */
static int route_cmp(const struct route *a, const struct route *b)
{
    for (int i = 0; i < a->nseg && i < b->nseg; i++)
        if (a->segs[i].kind != b->segs[i].kind)
            return (int)a->segs[i].kind - (int)b->segs[i].kind;
    return 0;
}

static bool method_is(const char *route_method, const char *method)
{
    if (strcmp(route_method, method) == 0)
        return true;
    return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

/* Best route for the method, or NULL; *path_known tells whether any method matched. */
static const struct route *find_route(const struct http_server *srv, const char *method,
                                      const struct path_segs *ps, bool *path_known)
{
    const struct route *best = NULL;
    *path_known = false;
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct route *r = &srv->routes[i];
        if (!route_matches(r, ps))
            continue;
        *path_known = true;
        if (method && method_is(r->method, method) && (!best || route_cmp(r, best) > 0))
            best = r;
    }
    return best;
}

/* "GET, POST, OPTIONS" for the routes matching the path. */
static void allowed_methods(const struct http_server *srv, const struct path_segs *ps,
                            char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct route *r = &srv->routes[i];
        if (!route_matches(r, ps))
            continue;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++)
            seen = strcmp(srv->routes[k].method, r->method) == 0 &&
                   route_matches(&srv->routes[k], ps);
        if (!seen && len + strlen(r->method) + 3 < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s, ", r->method);
    }
    snprintf(buf + len, cap - len, "OPTIONS");
}

static int set_params(struct http_request *req, const struct route *r,
                      const struct path_segs *ps)
{
    for (int i = 0; i < r->nseg; i++) {
        const struct seg *g = &r->segs[i];
        if (g->kind == SEG_LIT)
            continue;
        char *v;
        if (g->kind == SEG_REST)
            v = strdup(i < ps->n ? ps->path + ps->off[i] : "");
        else
            v = strndup(ps->path + ps->off[i], ps->len[i]);
        if (!v)
            return CAIRN_ENOMEM;
        req->param_name[req->n_params] = g->text;
        req->param_val[req->n_params++] = v;
    }
    return 0;
}

static void route_free(struct route *r)
{
    for (int i = 0; i < r->nseg; i++)
        free(r->segs[i].text);
    free(r->segs);
    free(r->method);
    free(r->pattern);
}

static bool same_shape(const struct route *a, const struct route *b)
{
    if (a->nseg != b->nseg || strcmp(a->method, b->method) != 0)
        return false;
    for (int i = 0; i < a->nseg; i++) {
        if (a->segs[i].kind != b->segs[i].kind)
            return false;
        if (a->segs[i].kind == SEG_LIT && strcmp(a->segs[i].text, b->segs[i].text) != 0)
            return false;
    }
    return true;
}

void http_routes_free(struct http_server *srv)
{
    for (size_t i = 0; i < srv->n_routes; i++)
        route_free(&srv->routes[i]);
    free(srv->routes);
}

int http_route(struct http_server *srv, const char *method, const char *pattern,
               http_handler_fn fn, void *ctx)
{
    return http_route_errors(srv, method, pattern, fn, ctx, NULL);
}

static int add_route(struct http_server *srv, const char *method, const char *pattern,
                     http_handler_fn fn, void *ctx, http_error_fn errors, bool open);

int http_route_errors(struct http_server *srv, const char *method, const char *pattern,
                      http_handler_fn fn, void *ctx, http_error_fn errors)
{
    return add_route(srv, method, pattern, fn, ctx, errors, false);
}

int http_route_open(struct http_server *srv, const char *method, const char *pattern,
                    http_handler_fn fn, void *ctx)
{
    return add_route(srv, method, pattern, fn, ctx, NULL, true);
}

static int add_route(struct http_server *srv, const char *method, const char *pattern,
                     http_handler_fn fn, void *ctx, http_error_fn errors, bool open)
{
    if (!srv || !method || !pattern || !fn || pattern[0] != '/' || !method[0])
        return CAIRN_EINVAL;
    if (srv->started)
        return CAIRN_ESTATE;
    for (const char *m = method; *m; m++)
        if (*m < 'A' || *m > 'Z')
            return CAIRN_EINVAL;
    if (strcmp(method, "OPTIONS") == 0 || strcmp(method, "HEAD") == 0)
        return CAIRN_EINVAL; /* answered by the server itself */
    struct path_segs ps;
    if (!split_path(pattern, &ps) || ps.excess)
        return CAIRN_EINVAL;
    struct route r = {0};
    r.segs = calloc((size_t)ps.n, sizeof *r.segs);
    r.method = strdup(method);
    r.pattern = strdup(pattern);
    r.fn = fn;
    r.ctx = ctx;
    r.errors = errors;
    r.open = open;
    if (!r.segs || !r.method || !r.pattern) {
        route_free(&r);
        return CAIRN_ENOMEM;
    }
    int n_params = 0, rc = 0;
    for (int i = 0; i < ps.n && rc == 0; i++) {
        const char *p = pattern + ps.off[i];
        size_t n = ps.len[i];
        struct seg *g = &r.segs[r.nseg];
        if (n > 0 && (p[0] == ':' || p[0] == '*')) {
            g->kind = p[0] == ':' ? SEG_PARAM : SEG_REST;
            if (n == 1 || (g->kind == SEG_REST && i != ps.n - 1) || ++n_params > HTTP_MAX_PARAMS)
                rc = CAIRN_EINVAL;
            g->text = strndup(p + 1, n - 1);
        } else {
            g->kind = SEG_LIT;
            g->text = strndup(p, n);
        }
        r.nseg++;
        if (!g->text && rc == 0)
            rc = CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < srv->n_routes && rc == 0; i++)
        if (same_shape(&srv->routes[i], &r))
            rc = CAIRN_EINVAL;
    if (rc == 0 && array_reserve(&srv->routes, &srv->cap_routes, srv->n_routes + 1, sizeof *srv->routes, 16))
        rc = CAIRN_ENOMEM;
    if (rc) {
        route_free(&r);
        return rc;
    }
    srv->routes[srv->n_routes++] = r;
    return 0;
}
/* ---------- request handling ---------- */

const char *http_req_method(const struct http_request *req) { return req->method; }
const char *http_req_path(const struct http_request *req) { return req->path; }
const char *http_req_remote(const struct http_request *req) { return req->remote; }
json_t *http_req_json(const struct http_request *req) { return req->json; }

const char *http_req_param(const struct http_request *req, const char *name)
{
    for (int i = 0; i < req->n_params; i++)
        if (strcmp(req->param_name[i], name) == 0)
            return req->param_val[i];
    return NULL;
}

const char *http_req_query(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *http_req_header(const struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *http_req_body(const struct http_request *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

bool http_req_client_gone(const struct http_request *req)
{
    struct pollfd p = {.fd = req->sockfd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void request_free(struct http_request *req)
{
    for (int i = 0; i < req->n_params; i++)
        free(req->param_val[i]);
    free(req->method);
    free(req->path);
    free(req->body);
    json_decref(req->json);
    http_hdr_free(req->hdrs);
    free(req);
}

static const char *origin_allowed(const struct http_server *srv, const char *origin)
{
    if (!origin)
        return NULL;
    if (srv->cors_any)
        return origin;
    for (size_t i = 0; i < srv->n_cors; i++)
        if (strcmp(srv->cors[i], origin) == 0)
            return origin;
    return NULL;
}

static bool header_token_list(const char *s)
{
    if (!s || !*s || strlen(s) > 512)
        return false;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') ||
              ('0' <= *s && *s <= '9') || *s == '-' || *s == '_' || *s == ',' || *s == ' '))
            return false;
    return true;
}

static enum MHD_Result handle_options(struct http_request *req, const struct path_segs *ps,
                                      bool path_ok)
{
    struct http_server *srv = req->srv;
    const char *origin = http_req_header(req, "Origin");
    const char *acrm = http_req_header(req, "Access-Control-Request-Method");
    bool known = false;
    if (path_ok)
        find_route(srv, NULL, ps, &known);
    if (origin && acrm && !req->origin_ok)
        return http_queue_error(req, 403, "forbidden", "origin not allowed");
    if (!known)
        return http_queue_error(req, 404, "not_found", "no route for this path");
    char methods[256];
    allowed_methods(srv, ps, methods, sizeof methods);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Allow", methods);
    if (origin && acrm) {
        const char *acrh = http_req_header(req, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                header_token_list(acrh) ? acrh
                                                        : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    return http_queue(req, 204, resp, NULL, 0);
}

static bool authorized(struct http_request *req)
{
    const char *key = req->srv->api_key;
    if (!key)
        return true;
    const char *auth = http_req_header(req, "Authorization");
    const char *token = NULL;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        token = auth + 7;
        while (*token == ' ')
            token++;
    } else {
        token = http_req_header(req, "x-api-key");
    }
    return token && ct_equal(token, key);
}

static bool json_content_type(const char *ct);

/* A browser's request with a body that is not declared JSON: what a web page can send
 * to any address without a CORS preflight (a form, text/plain), so a page the user visits
 * could drive the API. Browsers always send Origin (and Sec-Fetch-Site) with such a
 * request; curl and the SDKs send neither, so `curl -d` keeps working. */
static bool browser_non_json_body(struct http_request *req)
{
    const char *m = req->method;
    if (strcmp(m, "POST") && strcmp(m, "PUT") && strcmp(m, "PATCH") && strcmp(m, "DELETE"))
        return false;
    if (!http_req_header(req, "Origin") && !http_req_header(req, "Sec-Fetch-Site"))
        return false;
    const char *cl = http_req_header(req, "Content-Length");
    bool body = (cl && strspn(cl, "0") != strlen(cl)) || http_req_header(req, "Transfer-Encoding");
    return body && !json_content_type(http_req_header(req, "Content-Type"));
}

/* First call, headers only: everything that can be refused before the body is read. */
static enum MHD_Result request_begin(struct http_request *req)
{
    struct http_server *srv = req->srv;
    if (atomic_load(&srv->stopping)) {
        http_reply_header(req, "Connection", "close");
        return http_queue_error(req, 503, "unavailable", "server is stopping");
    }
    const char *host = http_req_header(req, "Host");
    if (!srv->hosts_any && !http_host_allowed(host, srv->own_host, (const char *const *)srv->hosts, srv->n_hosts)) {
        char shown[128];
        log_clean(shown, sizeof shown, host);
        http_reply_header(req, "Connection", "close");
        return http_queue_error(req, 403, "forbidden",
                           "Host %s is not this server's address (a web page may be trying to reach it); "
                           "start the node with --allowed-host NAME to allow a name",
                           shown);
    }
    req->origin_ok = origin_allowed(srv, http_req_header(req, "Origin"));
    struct path_segs ps;
    bool path_ok = split_path(req->path, &ps);
    if (strcmp(req->method, "OPTIONS") == 0)
        return handle_options(req, &ps, path_ok);
    bool known = false;
    const struct route *r = path_ok ? find_route(srv, req->method, &ps, &known) : NULL;
    if (!(r && r->open) && !authorized(req)) {
        http_reply_header(req, "WWW-Authenticate", "Bearer");
        return http_queue_error(req, 401, "authentication_error", "missing or invalid API key");
    }
    if (!r && known) {
        char methods[256];
        allowed_methods(srv, &ps, methods, sizeof methods);
        http_reply_header(req, "Allow", methods);
        return http_queue_error(req, 405, "method_not_allowed", "%s is not allowed on %s",
                           req->method, req->path);
    }
    if (!r)
        return http_queue_error(req, 404, "not_found", "no route for %s %.200s", req->method,
                           req->path);
    if (set_params(req, r, &ps))
        return MHD_NO;
    req->route = r;
    if (browser_non_json_body(req)) {
        char shown[128];
        const char *ct = http_req_header(req, "Content-Type");
        log_clean(shown, sizeof shown, ct ? ct : "(none)");
        http_reply_header(req, "Connection", "close"); /* the body is not read */
        return http_queue_error(req, 415, "invalid_request_error",
                           "a request from a web page must send Content-Type: application/json (got %s)", shown);
    }
    const char *cl = http_req_header(req, "Content-Length");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || end == cl || n > srv->max_body) {
            http_reply_header(req, "Connection", "close");
            return http_queue_error(req, 413, "invalid_request_error",
                               "request body over the limit of %zu bytes", srv->max_body);
        }
    }
    return MHD_YES;
}

static int append_body(struct http_request *req, const char *data, size_t n)
{
    size_t max = req->srv->max_body;
    if (n > max || req->body_len > max - n)
        return CAIRN_EFULL;
    if (req->body_cap - req->body_len <= n) {
        size_t cap = req->body_cap ? req->body_cap : 1024;
        while (cap - req->body_len <= n)
            cap *= 2;
        if (cap > max + 1)
            cap = max + 1;
        char *b = realloc(req->body, cap);
        if (!b)
            return CAIRN_ENOMEM;
        req->body = b;
        req->body_cap = cap;
    }
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = 0;
    return 0;
}

static bool json_content_type(const char *ct)
{
    if (!ct)
        return false;
    size_t n = strcspn(ct, ";");
    if (n >= 16 && strncasecmp(ct, "application/json", 16) == 0)
        return true;
    for (size_t i = 0; i + 5 <= n; i++)
        if (strncasecmp(ct + i, "+json", 5) == 0)
            return true;
    return false;
}

/* Parses the body as JSON where it is JSON; false when a 400 was queued. */
static bool prepare_json(struct http_request *req, enum MHD_Result *r)
{
    struct http_server *srv = req->srv;
    if (req->body_len == 0)
        return true;
    bool declared = json_content_type(http_req_header(req, "Content-Type"));
    size_t i = strspn(req->body, " \t\r\n");
    bool looks = req->body[i] == '{' || req->body[i] == '[';
    if (!declared && !looks)
        return true;
    int depth;
    size_t values;
    http_json_scan(req->body, req->body_len, srv->max_depth, srv->max_json_values, &depth, &values);
    if (values > srv->max_json_values) {
        *r = http_queue_error(req, 413, "invalid_request_error",
                              "the JSON body has more than %zu values, over what this server parses", srv->max_json_values);
        return false;
    }
    if (depth > srv->max_depth) {
        *r = http_queue_error(req, 400, "invalid_request_error",
                         "JSON nested deeper than the limit of %d levels", srv->max_depth);
        return false;
    }
    json_error_t e;
    req->json = json_loadb(req->body, req->body_len, 0, &e);
    if (!req->json && declared) {
        *r = http_queue_error(req, 400, "invalid_request_error", "malformed JSON: %s (line %d, column %d)",
                         e.text, e.line, e.column);
        return false;
    }
    return true;
}

static enum MHD_Result request_finish(struct http_request *req)
{
    struct http_server *srv = req->srv;
    enum MHD_Result r = MHD_YES;
    http_guard_phase(srv, req->conn, HTTP_GUARD_BUSY);
    if (!prepare_json(req, &r))
        return r;
    /* The handler and a deferred reply may take longer than the idle timeout; the
     * timeout is restored (and its clock restarted) once the reply is queued. */
    MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    req->route->fn(req, req->route->ctx);
    if (req->stream) {
        r = http_serve_stream(req);
        if (r == MHD_NO || req->stream->started)
            return r; /* a stream closes its connection when it ends */
    } else if (!req->replied) {
        log_warn("http: %s %s: handler made no reply", req->method, req->path);
        r = http_queue_error(req, 500, "server_error", "handler made no reply");
    }
    MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT, srv->idle_timeout_s);
    return r;
}

enum MHD_Result http_on_access(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version,
                               const char *upload_data, size_t *upload_size, void **req_cls)
{
    struct http_server *srv = cls;
    struct http_request *req = *req_cls;
    (void)version;
    if (!req) {
        req = calloc(1, sizeof *req);
        if (!req)
            return MHD_NO;
        req->srv = srv;
        req->conn = conn;
        req->t0 = clock_ns();
        req->method = strdup(method);
        req->path = strdup(url);
        req->sockfd = -1;
        *req_cls = req;
        if (!req->method || !req->path)
            return MHD_NO;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            req->sockfd = ci->connect_fd;
        http_guard_phase(srv, conn, HTTP_GUARD_BODY); /* the head is in */
        ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            const struct sockaddr *sa = ci->client_addr;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, req->remote,
                          sizeof req->remote);
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr,
                          req->remote, sizeof req->remote);
        }
        return request_begin(req);
    }
    if (req->replied) { /* refused before the body: discard what still arrives */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        int rc = append_body(req, upload_data, *upload_size);
        if (rc) {
            /* A body without Content-Length went over the limit; libmicrohttpd cannot
             * answer in the middle of a body, so the connection is dropped. */
            log_warn("http: %s %s from %s: body over %zu bytes, connection closed",
                     req->method, req->path, req->remote, srv->max_body);
            return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return request_finish(req);
}

void http_on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                       enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct http_request *req = *req_cls;
    http_guard_phase(srv, conn, HTTP_GUARD_HEAD); /* a kept-alive connection waits for its next head */
    if (!req)
        return;
    *req_cls = NULL;
    uint64_t bytes = req->bytes;
    if (req->stream)
        http_stream_detach(req->stream, &bytes);
    if (srv->access_log) {
        static const char *why[] = {"", " (error)", " (timeout)", " (stopping)",
                                    " (read error)", " (client gone)"};
        char path[256];
        log_clean(path, sizeof path, req->path);
        log_info("http %s \"%s %s\" %d %llu B %.1f ms%s", req->remote, req->method, path,
                 req->replied ? req->status : 0, (unsigned long long)bytes,
                 (double)(clock_ns() - req->t0) * 1e-6,
                 (unsigned)toe < sizeof why / sizeof *why ? why[toe] : " (aborted)");
    }
    request_free(req);
}
