/* libFuzzer harness of what the hub answers a pull with (node/hub_http.c, hubref.c): the
 * input's first line is a Link header, the rest a page of the repo's listing (JSON).
 * A page is added or refused (not an array); every file kept has a path of at most
 * HUBREF_PATH_MAX bytes and a hash that is NULL or 64 hex digits; the files are then
 * chosen for a few references, and a chosen file is one of them. A next page is followed
 * only to a URL on the endpoint that fits. Built and run by tests/fuzz/run.sh. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "node/hub_int.h"
#include "node/hubref.h"

#define HUB "https://huggingface.co"

static void check_link(const char *link)
{
    char url[64], big[4096];
    if (hub_next_page(HUB, link, url, sizeof url) && (strlen(url) >= sizeof url || strncmp(url, HUB "/", 23)))
        abort();
    if (hub_next_page(HUB, link, big, sizeof big) && (strncmp(big, HUB "/", 23) || strchr(big, '>')))
        abort();
}

static void choose(const struct listing *l)
{
    static const char *refs[] = {"bartowski/Llama-3.2-1B-Instruct-GGUF", "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
                                 "hf.co/a/b:Q8_0", "hf.co/a/b/model-00001-of-00002.gguf"};
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) {
        struct hub_ref r;
        size_t pick[HUBREF_MAX_PARTS], n = 0;
        char tag[HUBREF_TAG_MAX + 1], err[512] = "";
        if (hubref_parse(refs[i], &r, err, sizeof err))
            abort();
        int rc = hubref_choose(&r, l->f, l->n, pick, &n, tag, err, sizeof err);
        if (rc && !err[0])
            abort();
        for (size_t k = 0; !rc && k < n; k++)
            if (pick[k] >= l->n)
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ln = nl ? (size_t)(nl - data) : 0;
    char *link = malloc(ln + 1);
    if (!link)
        return 0;
    memcpy(link, data, ln);
    link[ln] = 0;
    check_link(link);
    free(link);
    size_t off = nl ? ln + 1 : 0;
    json_t *page = json_loadb((const char *)data + off, size - off, JSON_DECODE_ANY, NULL);
    struct listing l = {0};
    int rc = hub_listing_add_page(&l, page);
    if (rc && rc != CAIRN_EFORMAT && rc != CAIRN_ERANGE && rc != CAIRN_ENOMEM)
        abort();
    if (rc == CAIRN_EFORMAT && json_is_array(page))
        abort();
    for (size_t i = 0; i < l.n; i++)
        if (!l.f[i].path || strlen(l.f[i].path) > HUBREF_PATH_MAX || (l.f[i].sha256 && !hub_is_hex(l.f[i].sha256, 64)))
            abort();
    choose(&l);
    hub_listing_free(&l);
    json_decref(page);
    return 0;
}
