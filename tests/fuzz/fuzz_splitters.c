/* libFuzzer harness of the streaming filters over generated text (tok/toolcall.c,
 * reasoning.c, stopstr.c): tool calls in a model's output (Hermes, Llama 3, Mistral, or
 * none), reasoning tags and stop strings, whose tags and strings come from a request.
 * Input: a mode byte, two cut bytes, then for reasoning and stop strings a header (lines
 * up to a NUL: the open and close tags and a start-inside flag, or the stop strings),
 * then the text. Fed whole, cut at the two points, or byte by byte, a filter gives the
 * same output; a tag or stop string it refuses is refused with a reason; stop strings
 * output a prefix of the text, all of it when none matched; tool calls come as an array
 * of objects, the same as toolcall_parse's. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tok/reasoning.h"
#include "tok/stopstr.h"
#include "tok/toolcall.h"

struct out {
    struct strbuf a, b; /* content (or reasoning and content) */
    char *calls;
    int matched;
};

struct spec {
    int mode; /* 0..3: toolcall format, 4: reasoning, 5: stop strings */
    struct reasoning_opts ro;
    const char *stops[STOPSTR_MAX + 1]; /* one too many is refused */
    size_t n_stops;
};

static void out_free(struct out *o)
{
    strbuf_free(&o->a);
    strbuf_free(&o->b);
    free(o->calls);
}

static bool buf_eq(const struct strbuf *x, const struct strbuf *y)
{
    return x->len == y->len && (!x->len || !memcmp(x->p, y->p, x->len));
}

static void same(const struct out *x, const struct out *y)
{
    if (!buf_eq(&x->a, &y->a) || !buf_eq(&x->b, &y->b) || x->matched != y->matched ||
        (x->calls || y->calls ? !x->calls || !y->calls || strcmp(x->calls, y->calls) : false))
        abort();
}

static char *calls_text(json_t *calls)
{
    if (!json_is_array(calls))
        abort();
    for (size_t i = 0; i < json_array_size(calls); i++)
        if (!json_is_object(json_array_get(calls, i)))
            abort();
    char *s = json_dumps(calls, JSON_COMPACT);
    json_decref(calls);
    return s;
}

/* Runs the filter over text cut at cuts; false when it refused the spec. */
static bool run(const struct spec *sp, const char *text, size_t len, const size_t *cuts, size_t n_cuts,
                struct out *o)
{
    char err[256] = "";
    memset(o, 0, sizeof *o);
    struct toolcall *t = NULL;
    struct reasoning *r = NULL;
    struct stopstr *s = NULL;
    int rc = sp->mode < 4   ? toolcall_create(&t, (enum toolcall_format)sp->mode, 7, 0, err, sizeof err)
             : sp->mode == 4 ? reasoning_create(&r, &sp->ro, err, sizeof err)
                             : stopstr_create(&s, sp->stops, sp->n_stops, err, sizeof err);
    if (rc) {
        if (rc != CAIRN_EINVAL || !err[0])
            abort(); /* only a tag or a stop string is refused, and it says why */
        return false;
    }
    size_t at = 0;
    for (size_t k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : len;
        rc = t ? toolcall_feed(t, text + at, end - at, &o->a)
             : r ? reasoning_feed(r, text + at, end - at, &o->a, &o->b)
                 : stopstr_feed(s, text + at, end - at, &o->a);
        if (rc < 0 || rc > 1)
            abort();
        at = end;
    }
    json_t *calls = NULL;
    if (t) {
        if (toolcall_finish(t, &o->a, &calls))
            abort();
        o->calls = calls_text(calls);
    } else if (r) {
        if (reasoning_flush(r, &o->a, &o->b))
            abort();
    } else {
        o->matched = stopstr_flush(s, &o->a);
        if (o->matched < 0 || o->a.len > len || (o->a.len && memcmp(o->a.p, text, o->a.len)) ||
            (!o->matched && o->a.len != len) || (o->matched != (stopstr_matched(s) >= 0)))
            abort(); /* a prefix of the text, all of it when nothing matched */
    }
    toolcall_release(t);
    reasoning_release(r);
    stopstr_release(s);
    return true;
}

/* Reads the header (lines up to a NUL) into sp; returns where the text starts. */
static size_t read_header(struct spec *sp, char *buf, size_t len)
{
    char *nul = memchr(buf, 0, len);
    if (!nul || sp->mode < 4)
        return 0;
    char *lines[STOPSTR_MAX + 1];
    size_t n = 0;
    for (char *p = buf; p < nul && n <= STOPSTR_MAX;) {
        char *nl = memchr(p, '\n', (size_t)(nul - p));
        lines[n++] = p;
        if (!nl)
            break;
        *nl = 0;
        p = nl + 1;
    }
    if (sp->mode == 4) {
        sp->ro.open = n > 0 && lines[0][0] ? lines[0] : NULL;
        sp->ro.close = n > 1 && lines[1][0] ? lines[1] : NULL;
        sp->ro.start_in_reasoning = n > 2 && lines[2][0] == '1';
    } else {
        sp->n_stops = n;
        for (size_t i = 0; i < n; i++)
            sp->stops[i] = lines[i];
    }
    return (size_t)(nul - buf) + 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 4096)
        return 0;
    struct spec sp = {.mode = data[0] % 6};
    char *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data + 3, size - 3);
    size_t start = read_header(&sp, buf, size - 3);
    const char *text = buf + start;
    size_t len = size - 3 - start;
    size_t cuts[2] = {len ? data[1] % (len + 1) : 0, len ? data[2] % (len + 1) : 0};
    if (cuts[0] > cuts[1]) {
        size_t x = cuts[0];
        cuts[0] = cuts[1];
        cuts[1] = x;
    }
    struct out whole, cut, bytes;
    if (run(&sp, text, len, NULL, 0, &whole)) {
        run(&sp, text, len, cuts, 2, &cut);
        size_t *every = malloc((len + 1) * sizeof *every);
        if (!every)
            abort();
        for (size_t i = 0; i + 1 < len; i++)
            every[i] = i + 1;
        run(&sp, text, len, every, len ? len - 1 : 0, &bytes);
        free(every);
        same(&whole, &cut);
        same(&whole, &bytes);
        if (sp.mode < 4) { /* toolcall_parse is one feed and a finish */
            struct strbuf content = {0};
            json_t *calls = NULL;
            char err[128];
            if (toolcall_parse((enum toolcall_format)sp.mode, 7, text, len, &content, &calls, err, sizeof err))
                abort();
            char *c = calls_text(calls);
            if (!buf_eq(&content, &whole.a) || strcmp(c, whole.calls))
                abort();
            free(c);
            strbuf_free(&content);
        }
        out_free(&cut);
        out_free(&bytes);
    }
    out_free(&whole);
    free(buf);
    return 0;
}
