/* The dashboard's page and assets (routes_web.h). */
#include "api/routes_web.h"

#include <string.h>

#include "base/err.h"

const struct web_asset *routes_web_find(const char *name)
{
    for (size_t i = 0; name && i < web_assets_count; i++)
        if (!strcmp(web_assets[i].name, name))
            return &web_assets[i];
    return NULL;
}

static const char *content_type(const char *name)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".json", "application/json"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i].ext))
            return types[i].type;
    return "application/octet-stream";
}

/* True when the Accept-Encoding list names gzip without q=0. */
static bool accepts_gzip(const char *ae)
{
    for (const char *p = ae; p && (p = strstr(p, "gzip")); p += 4) {
        bool start = p == ae || p[-1] == ' ' || p[-1] == ',';
        const char *q = p + 4;
        while (*q == ' ')
            q++;
        if (!start || (*q && *q != ',' && *q != ';'))
            continue;
        if (*q == ';') {
            const char *v = strstr(q, "q=");
            const char *end = strchr(q, ',');
            if (v && (!end || v < end) && strspn(v + 2, "0.") == strcspn(v + 2, ", "))
                return false; /* q=0, q=0.0 ... */
        }
        return true;
    }
    return false;
}

/* True when the If-None-Match list holds etag (or is "*"). */
static bool etag_matches(const char *inm, const char *etag)
{
    if (!inm)
        return false;
    if (!strcmp(inm, "*"))
        return true;
    size_t n = strlen(etag);
    for (const char *p = inm; (p = strstr(p, etag)); p += n)
        if (p[n] == 0 || p[n] == ',' || p[n] == ' ')
            return true;
    return false;
}

static void serve(struct http_request *req, const struct web_asset *a)
{
    if (!a) {
        http_reply_error(req, 404, "not_found", "the dashboard has no such file");
        return;
    }
    http_reply_header(req, "ETag", a->etag);
    http_reply_header(req, "Cache-Control", "no-cache");
    http_reply_header(req, "Vary", "Accept-Encoding");
    http_reply_header(req, "Content-Security-Policy", ROUTES_WEB_CSP);
    http_reply_header(req, "X-Content-Type-Options", "nosniff");
    http_reply_header(req, "X-Frame-Options", "DENY");
    http_reply_header(req, "Referrer-Policy", "no-referrer");
    if (etag_matches(http_req_header(req, "If-None-Match"), a->etag)) {
        http_reply_bytes(req, 304, content_type(a->name), "", 0);
        return;
    }
    if (a->gz_len && a->gz_len < a->len && accepts_gzip(http_req_header(req, "Accept-Encoding"))) {
        http_reply_header(req, "Content-Encoding", "gzip");
        http_reply_bytes(req, 200, content_type(a->name), a->gz, a->gz_len);
        return;
    }
    http_reply_bytes(req, 200, content_type(a->name), a->data, a->len);
}

static void h_index(struct http_request *req, void *ctx)
{
    (void)ctx;
    serve(req, routes_web_find("index.html"));
}

static void h_asset(struct http_request *req, void *ctx)
{
    (void)ctx;
    const char *name = http_req_param(req, "name");
    serve(req, name && !strchr(name, '/') && strcmp(name, "index.html") ? routes_web_find(name) : NULL);
}

int routes_web_register(struct http_server *srv, char *err, size_t errlen)
{
    int rc = http_route_open(srv, "GET", "/", h_index, NULL);
    if (!rc)
        rc = http_route_open(srv, "GET", "/assets/*name", h_asset, NULL);
    if (rc)
        return cairn_fail(err, errlen, rc, "dashboard routes: %s", cairn_strerror(rc));
    return 0;
}
