/* The hub's listing as the hub sends it (node/hub_int.h): a page's entries become files
 * (folders, malformed entries and bad hashes skipped, a page that is not an array
 * refused), and a Link header's next page is followed only on the hub itself: a URL that
 * merely starts with the endpoint's text ("https://huggingface.co.evil.example",
 * "https://huggingface.co@evil.example") is not, or the token would go with it. */
#include <jansson.h>
#include <string.h>

#include "base/err.h"
#include "node/hub_int.h"
#include "testutil.h"

#define HUB "https://huggingface.co"

static void test_next_page(void)
{
    char url[256];
    CHECK(hub_next_page(HUB, "<" HUB "/api/models/a/b/tree/c?cursor=x>; rel=\"next\"", url, sizeof url) &&
              !strcmp(url, HUB "/api/models/a/b/tree/c?cursor=x"),
          "next page: %s", url);
    CHECK(hub_next_page(HUB, "<" HUB "/p1>; rel=\"prev\", <" HUB "/p3>; rel=\"next\"", url, sizeof url) &&
              !strcmp(url, HUB "/p3"),
          "the next of two links: %s", url);
    const char *refused[] = {
        "<https://huggingface.co.evil.example/api/x>; rel=\"next\"",
        "<https://huggingface.co@evil.example/api/x>; rel=\"next\"",
        "<https://huggingface.co:444/api/x>; rel=\"next\"",
        "<" HUB ">; rel=\"next\"",
        "<http://huggingface.co/api/x>; rel=\"next\"",
        "<" HUB "/p>; rel=\"prev\"",
        "<" HUB "/p; rel=\"next\"",
        "",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        CHECK(!hub_next_page(HUB, refused[i], url, sizeof url), "followed '%s'", refused[i]);
    char small[16];
    CHECK(!hub_next_page(HUB, "<" HUB "/a/long/path>; rel=\"next\"", small, sizeof small), "a URL too long fits");
}

static void test_listing_page(void)
{
    const char *sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    char text[1024];
    snprintf(text, sizeof text,
             "[{\"type\": \"directory\", \"path\": \"sub\", \"size\": 0},"
             " {\"type\": \"file\", \"path\": \"m-Q4_K_M.gguf\", \"size\": 1000, \"lfs\": {\"oid\": \"%s\"}},"
             " {\"type\": \"file\", \"path\": \"README.md\", \"size\": 12},"
             " {\"type\": \"file\", \"path\": \"bad-oid.gguf\", \"size\": 5, \"lfs\": {\"oid\": \"%.63s\"}},"
             " {\"type\": \"file\", \"path\": \"neg.gguf\", \"size\": -1},"
             " {\"type\": \"file\", \"size\": 3}, 7, null]",
             sha, sha);
    json_t *page = json_loads(text, 0, NULL);
    CHECK(page != NULL, "page JSON");
    struct listing l = {0};
    CHECK(hub_listing_add_page(&l, page) == 0 && l.n == 3, "%zu files", l.n);
    if (l.n == 3) {
        CHECK(!strcmp(l.f[0].path, "m-Q4_K_M.gguf") && l.f[0].size == 1000 && l.f[0].sha256 &&
                  !strcmp(l.f[0].sha256, sha),
              "first file");
        CHECK(!strcmp(l.f[1].path, "README.md") && !l.f[1].sha256, "a file not in LFS");
        CHECK(!strcmp(l.f[2].path, "bad-oid.gguf") && !l.f[2].sha256, "a malformed hash is no hash");
    }
    json_decref(page);
    json_t *obj = json_loads("{\"error\": \"x\"}", 0, NULL);
    CHECK(hub_listing_add_page(&l, obj) == CAIRN_EFORMAT && l.n == 3, "an object is no page");
    CHECK(hub_listing_add_page(&l, NULL) == CAIRN_EFORMAT, "no page");
    json_decref(obj);
    hub_listing_free(&l);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_next_page);
    RUN(test_listing_page);
    return test_main_end();
}
