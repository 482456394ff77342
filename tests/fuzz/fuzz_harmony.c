/* libFuzzer harness of the harmony splitter (tok/harmony.c), which reads a model's
 * output: any text, fed whole, cut at two points chosen by the input, or byte by byte,
 * gives the same reasoning, content and calls, and never crashes or leaks. Built and run
 * by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok/harmony.h"

struct result {
    struct strbuf reasoning, content;
    char *calls;
};

static void run(const char *text, size_t len, const size_t *cuts, size_t n_cuts, struct result *r)
{
    struct harmony *h;
    char err[64];
    memset(r, 0, sizeof *r);
    if (harmony_create(&h, 7, err, sizeof err))
        abort();
    size_t at = 0;
    for (size_t k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : len;
        if (harmony_feed(h, text + at, end - at, &r->reasoning, &r->content))
            abort();
        at = end;
    }
    json_t *calls = NULL;
    if (harmony_finish(h, &r->reasoning, &r->content, &calls) || !json_is_array(calls))
        abort();
    for (size_t i = 0; i < json_array_size(calls); i++)
        if (!json_is_string(json_object_get(json_object_get(json_array_get(calls, i), "function"), "name")))
            abort();
    r->calls = json_dumps(calls, JSON_COMPACT);
    json_decref(calls);
    harmony_release(h);
}

static void same(const struct result *a, const struct result *b)
{
    if (a->reasoning.len != b->reasoning.len || a->content.len != b->content.len || strcmp(a->calls, b->calls) ||
        (a->reasoning.len && memcmp(a->reasoning.p, b->reasoning.p, a->reasoning.len)) ||
        (a->content.len && memcmp(a->content.p, b->content.p, a->content.len)))
        abort();
}

static void result_free(struct result *r)
{
    strbuf_free(&r->reasoning);
    strbuf_free(&r->content);
    free(r->calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 4096)
        return 0;
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    size_t cuts[2] = {len ? data[0] % (len + 1) : 0, len ? data[1] % (len + 1) : 0};
    if (cuts[0] > cuts[1]) {
        size_t t = cuts[0];
        cuts[0] = cuts[1];
        cuts[1] = t;
    }
    struct result whole, cut, bytes;
    run(text, len, NULL, 0, &whole);
    run(text, len, cuts, 2, &cut);
    size_t *every = malloc((len + 1) * sizeof *every);
    if (!every)
        abort();
    for (size_t i = 0; i + 1 < len; i++)
        every[i] = i + 1;
    run(text, len, every, len ? len - 1 : 0, &bytes);
    free(every);
    same(&whole, &cut);
    same(&whole, &bytes);
    result_free(&whole);
    result_free(&cut);
    result_free(&bytes);
    return 0;
}
