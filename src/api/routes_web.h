/* The dashboard: the page of web/ (embedded in the binary at build time by
 * cmake/embed_web.cmake) served on the API's port, open to any client of the API (the
 * page holds no data; with --api-key it asks for the key and sends it on each call):
 *   GET /             web/index.html
 *   GET /assets/NAME  web/NAME (one level, no other files)
 * Each reply carries its content type, an ETag (the file's SHA-256; If-None-Match gets
 * 304), Cache-Control: no-cache (the browser revalidates, so a new binary's page is
 * seen at once), the gzip form where the client accepts it (Vary: Accept-Encoding), and
 * a Content-Security-Policy that lets the page load only its own scripts and styles and
 * talk only to its own origin. */
#ifndef CAIRN_API_ROUTES_WEB_H
#define CAIRN_API_ROUTES_WEB_H

#include <stddef.h>

#include "api/http.h"

/* One embedded file (the generated web_assets.c holds the table). */
struct web_asset {
    const char *name;          /* "index.html", "app.js" */
    const unsigned char *data; /* the file */
    size_t len;
    const unsigned char *gz;   /* the file through gzip -9n */
    size_t gz_len;
    const char *etag;          /* "\"<first 32 hex of SHA-256>\"" */
};

extern const struct web_asset web_assets[];
extern const size_t web_assets_count;

/* The Content-Security-Policy of the page's replies. */
#define ROUTES_WEB_CSP                                                                             \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "            \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* The embedded file called name, or NULL. */
const struct web_asset *routes_web_find(const char *name);

/* Adds the page's routes to srv (before http_server_start); CAIRN_EINVAL, CAIRN_ENOMEM
 * or CAIRN_ESTATE from http_route_open. */
int routes_web_register(struct http_server *srv, char *err, size_t errlen);

#endif
