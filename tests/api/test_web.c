/* The dashboard's routes (api/routes_web.h) on a real server with an API key: the page
 * and its assets are served without the key and every other route still wants it; the
 * bytes are the embedded ones, gzip only where accepted, ETag revalidation, content types,
 * the CSP, and 404 for names that are not embedded. */
#include <stdio.h>
#include <string.h>

#include "api/routes_web.h"
#include "rawhttp.h"
#include "testutil.h"

static void h_secret(struct http_request *req, void *ctx)
{
    (void)ctx;
    http_reply_text(req, 200, "secret");
}

/* GET path with extra header lines (each ending in CRLF, or ""). */
static void get(uint16_t port, const char *method, const char *path, const char *extra, struct rh_resp *r)
{
    char req[1024];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n", method,
                     path, extra);
    memset(r, 0, sizeof *r);
    rh_raw(port, req, (size_t)n, r, RH_IO_TIMEOUT_S);
}

/* One request and its status against want. */
static void expect_status(uint16_t port, const char *method, const char *path, const char *extra, int want)
{
    struct rh_resp r;
    get(port, method, path, extra, &r);
    CHECK(r.status == want, "%s %s [%s]: %d, want %d", method, path, extra, r.status, want);
    CHECK(want != 304 || r.body_len == 0, "a 304 has no body");
    rh_free(&r);
}

static bool has_header(const struct rh_resp *r, const char *name, const char *want)
{
    char buf[512];
    const char *v = rh_header(r, name, buf, sizeof buf);
    return v && (!want || strstr(v, want));
}

static void test_page(uint16_t port)
{
    const struct web_asset *index = routes_web_find("index.html");
    CHECK(index && index->len > 0 && index->gz_len > 0, "index.html is embedded");
    if (!index)
        return;
    struct rh_resp r;
    get(port, "GET", "/", "", &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(has_header(&r, "Content-Type", "text/html"), "content type: %s", r.head);
    CHECK(has_header(&r, "Content-Security-Policy", "default-src 'none'"), "CSP: %s", r.head);
    CHECK(has_header(&r, "X-Content-Type-Options", "nosniff"), "nosniff");
    CHECK(has_header(&r, "ETag", index->etag), "etag %s: %s", index->etag, r.head);
    CHECK(!has_header(&r, "Content-Encoding", NULL), "no gzip unless asked");
    CHECK(r.body_len == index->len && !memcmp(r.body, index->data, index->len), "the embedded bytes (%zu of %zu)",
          r.body_len, index->len);
    rh_free(&r);

    get(port, "GET", "/", "Accept-Encoding: br, gzip;q=0.8\r\n", &r);
    CHECK(has_header(&r, "Content-Encoding", "gzip") && has_header(&r, "Vary", "Accept-Encoding"), "gzip: %s", r.head);
    CHECK(r.body_len == index->gz_len && !memcmp(r.body, index->gz, index->gz_len), "the gzipped bytes");
    rh_free(&r);
    get(port, "GET", "/", "Accept-Encoding: gzip;q=0, deflate\r\n", &r);
    CHECK(!has_header(&r, "Content-Encoding", NULL), "gzip;q=0 is a refusal: %s", r.head);
    rh_free(&r);
    get(port, "GET", "/", "Accept-Encoding: x-gzipped\r\n", &r);
    CHECK(!has_header(&r, "Content-Encoding", NULL), "another coding's name holding gzip");
    rh_free(&r);

    char inm[128];
    snprintf(inm, sizeof inm, "If-None-Match: \"old\", %s\r\n", index->etag);
    expect_status(port, "GET", "/", inm, 304);
    expect_status(port, "GET", "/", "If-None-Match: \"old\"\r\n", 200);
    expect_status(port, "HEAD", "/", "", 200);
}

static void test_assets(uint16_t port)
{
    static const struct {
        const char *path, *type;
        int status;
    } cases[] = {
        {"/assets/app.js", "text/javascript", 200}, {"/assets/style.css", "text/css", 200},
        {"/assets/md.js", "text/javascript", 200},  {"/assets/nothing.js", NULL, 404},
        {"/assets/../app.js", NULL, 404},          {"/assets/x/app.js", NULL, 404},
        {"/assets/", NULL, 404},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rh_resp r;
        get(port, "GET", cases[i].path, "", &r);
        CHECK(r.status == cases[i].status, "%s: %d, want %d", cases[i].path, r.status, cases[i].status);
        if (cases[i].type)
            CHECK(has_header(&r, "Content-Type", cases[i].type), "%s: %s", cases[i].path, r.head);
        rh_free(&r);
    }
    for (size_t i = 0; i < web_assets_count; i++) {
        const struct web_asset *a = &web_assets[i];
        CHECK(strlen(a->etag) == 34 && a->etag[0] == '"', "%s: etag %s", a->name, a->etag);
        CHECK(a->gz_len > 18 && a->gz[0] == 0x1f && a->gz[1] == 0x8b, "%s: a gzip stream", a->name);
    }
}

static void test_key(uint16_t port)
{
    expect_status(port, "GET", "/secret", "", 401);
    expect_status(port, "GET", "/secret", "Authorization: Bearer k3y\r\n", 200);
    expect_status(port, "GET", "/nowhere", "", 401); /* an unknown route wants the key too */
    expect_status(port, "GET", "/assets/app.js", "Authorization: Bearer wrong\r\n", 200);
    expect_status(port, "POST", "/", "Content-Length: 0\r\n", 401); /* no open POST route */
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    struct http_config cfg = {.api_key = "k3y"};
    struct http_server *srv = NULL;
    char err[256] = "";
    int rc = http_server_create(&srv, &cfg, err, sizeof err);
    CHECK(rc == 0, "create: %s", err);
    if (!rc)
        rc = routes_web_register(srv, err, sizeof err);
    if (!rc)
        rc = http_route(srv, "GET", "/secret", h_secret, NULL);
    if (!rc)
        rc = http_server_start(srv, err, sizeof err);
    CHECK(rc == 0, "start: %d %s", rc, err);
    if (!rc) {
        uint16_t port = http_server_port(srv);
        RUN(test_page, port);
        RUN(test_assets, port);
        RUN(test_key, port);
    }
    http_server_release(srv);
    return test_main_end();
}
