/* A runner's text path (runner/runner_text.h) with a real vocabulary (Qwen2's byte-level
 * BPE from ../shared/testdata): token ids fed one at a time come out as the text they
 * encode (multi-byte characters split across tokens included), a stop string ends the
 * text where it falls, think tags split reasoning from content, a Hermes tool call
 * becomes a call and leaves no markup in the content, and logprobs come one entry per
 * token. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "gguf/gguf.h"
#include "runner/runner_text.h"
#include "testutil.h"

static struct gguf_file *file;
static struct tok *tk;

struct result {
    struct strbuf content, reasoning;
    int stopped_at;    /* index of the token that ended the text by a stop string, or -1 */
    int logprob_items; /* logprobs entries taken */
    json_t *calls;
    int stop_matched;
};

/* Encodes text, feeds its tokens one by one into a sequence made with o, takes what
 * each makes ready, then finishes it. */
static void run(const char *text, struct text_seq_opts o, struct result *r)
{
    memset(r, 0, sizeof *r);
    r->stopped_at = -1;
    o.tok = tk;
    static int32_t ids[4096];
    int64_t n = 0;
    char err[256] = "";
    CHECK(tok_encode(tk, text, strlen(text), 0, 0, ids, 4096, &n) == 0 && n > 0, "encode '%s'", text);
    struct text_seq *s = NULL;
    CHECK(text_seq_create(&s, &o, err, sizeof err) == 0, "create: %s", err);
    for (int64_t i = 0; s && i < n && r->stopped_at < 0; i++) {
        struct sched_token t = {.token = ids[i], .prob = 1, .logprob = -0.25f * (float)(i % 4)};
        int rc = text_seq_token(s, &t);
        CHECK(rc == 0 || rc == 1, "token %lld: %d", (long long)i, rc);
        if (rc == 1)
            r->stopped_at = (int)i;
        const char *c, *re;
        json_t *lp = NULL;
        if (text_seq_take(s, &c, &re, &lp)) {
            strbuf_put(&r->content, c, strlen(c));
            strbuf_put(&r->reasoning, re, strlen(re));
            r->logprob_items += (int)json_array_size(lp);
        }
        json_decref(lp);
    }
    if (s) {
        CHECK(text_seq_finish(s, &r->calls) == 0, "finish");
        const char *c, *re;
        json_t *lp = NULL;
        if (text_seq_take(s, &c, &re, &lp)) {
            strbuf_put(&r->content, c, strlen(c));
            strbuf_put(&r->reasoning, re, strlen(re));
            r->logprob_items += (int)json_array_size(lp);
        }
        json_decref(lp);
        r->stop_matched = text_seq_stop_matched(s);
    }
    strbuf_put(&r->content, "", 0); /* a NUL-terminated "" when nothing came */
    strbuf_put(&r->reasoning, "", 0);
    text_seq_release(s);
}

static void clear(struct result *r)
{
    strbuf_free(&r->content);
    strbuf_free(&r->reasoning);
    json_decref(r->calls);
}

static void test_plain(void)
{
    const char *texts[] = {"Hello world, this is a test.", "héllo 世界 🎉 — ünïcödé", "  spaces\n\tand tabs\n"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        struct result r;
        run(texts[i], (struct text_seq_opts){0}, &r);
        CHECK(!strcmp(r.content.p, texts[i]), "text back: '%s' (want '%s')", r.content.p, texts[i]);
        CHECK(r.stopped_at < 0 && !r.calls && r.stop_matched == -1 && !r.reasoning.p[0], "nothing else: %s",
              texts[i]);
        clear(&r);
    }
}

static void test_stop(void)
{
    const char *stops[] = {"never", "STOP"};
    struct result r;
    run("abc STOP def ghi", (struct text_seq_opts){.stops = stops, .n_stops = 2}, &r);
    CHECK(!strcmp(r.content.p, "abc "), "text up to the stop string: '%s'", r.content.p);
    CHECK(r.stopped_at >= 0 && r.stop_matched == 1, "the stop ended it (token %d, stop %d)", r.stopped_at,
          r.stop_matched);
    clear(&r);
}

static void test_reasoning(void)
{
    struct result r;
    run("<think>plan the answer</think>The answer is 4.", (struct text_seq_opts){.reasoning = true}, &r);
    CHECK(!strcmp(r.reasoning.p, "plan the answer"), "reasoning: '%s'", r.reasoning.p);
    CHECK(!strcmp(r.content.p, "The answer is 4."), "content: '%s'", r.content.p);
    clear(&r);
    /* Reasoning off: the tags are text. */
    run("<think>x</think>y", (struct text_seq_opts){0}, &r);
    CHECK(!strcmp(r.content.p, "<think>x</think>y") && !r.reasoning.p[0], "tags kept: '%s'", r.content.p);
    clear(&r);
}

static void test_tool_call(void)
{
    struct result r;
    run("Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        (struct text_seq_opts){.tools = TOOLCALL_HERMES, .id_seed = 7}, &r);
    json_t *fn = json_object_get(json_array_get(r.calls, 0), "function");
    CHECK(json_array_size(r.calls) == 1 && !strcmp(json_string_value(json_object_get(fn, "name")) ?: "", "get_weather"),
          "one call of get_weather");
    json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")) ?: "", 0, NULL);
    CHECK(args && !strcmp(json_string_value(json_object_get(args, "city")) ?: "", "Oslo"), "its arguments");
    json_decref(args);
    CHECK(!strcmp(r.content.p, "Let me check."), "no markup in the content: '%s'", r.content.p);
    clear(&r);
}

static void test_logprobs(void)
{
    const char *text = "one two three four five";
    static int32_t ids[256];
    int64_t n = 0;
    CHECK(tok_encode(tk, text, strlen(text), 0, 0, ids, 256, &n) == 0, "encode");
    struct result r;
    run(text, (struct text_seq_opts){.logprobs = true}, &r);
    CHECK(r.logprob_items == n, "%d logprobs entries for %lld tokens", r.logprob_items, (long long)n);
    CHECK(!strcmp(r.content.p, text), "text: '%s'", r.content.p);
    clear(&r);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    char err[256] = "";
    if (!test_listing()) {
        const char *path = test_data_path("vocab/ggml-vocab-qwen2.gguf");
        if (gguf_open(&file, path, err, sizeof err) || tok_load(&tk, file, err, sizeof err)) {
            CHECK(0, "load %s: %s", path, err);
            return test_main_end();
        }
    }
    RUN(test_plain);
    RUN(test_stop);
    RUN(test_reasoning);
    RUN(test_tool_call);
    RUN(test_logprobs);
    tok_release(tk);
    gguf_close(file);
    return test_main_end();
}
