/* Tool calls: each format, several calls, calls mixed with text, malformed calls,
 * streaming at every split point against whole-text parsing, detection on the real
 * templates, and calls rendered by each template parsed back. */
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"
#include "tmpl/tmpl.h"
#include "tok/toolcall.h"

#define SEED 0x1234abcdull

/* One stream: content and the calls as JSON text (ids included). */
struct out {
    char *content;
    char *calls;
    size_t ncalls;
};

static void out_free(struct out *o)
{
    free(o->content);
    free(o->calls);
}

static struct out stream(struct toolcall *t, const char *text, size_t len, const size_t *cuts, size_t ncuts)
{
    struct strbuf c = {0};
    size_t at = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        CHECK_EQ_INT(toolcall_feed(t, text + at, end - at, &c), 0);
        at = end;
    }
    json_t *calls = NULL;
    CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
    struct out o = {c.p ? c.p : strdup(""), NULL, json_array_size(calls)};
    o.calls = json_dumps(calls, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(calls);
    return o;
}

static struct out whole(enum toolcall_format f, const char *text)
{
    struct strbuf c = {0};
    json_t *calls = NULL;
    char err[128];
    int rc = toolcall_parse(f, SEED, text, strlen(text), &c, &calls, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    struct out o = {c.p ? c.p : strdup(""), json_dumps(calls, JSON_COMPACT | JSON_ENCODE_ANY), json_array_size(calls)};
    json_decref(calls);
    return o;
}

/* Streaming cut at every point (one cut, and every pair of cuts for short texts)
 * equals the whole-text parse. */
static void check_splits(enum toolcall_format f, const char *text)
{
    struct out w = whole(f, text);
    size_t len = strlen(text);
    struct toolcall *t;
    char err[128];
    CHECK(toolcall_create(&t, f, SEED, 0, err, sizeof err) == 0, "%s", err);
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b = len <= 160 ? b + 1 : len + 1) {
            size_t cuts[2] = {a, b};
            /* a fresh splitter per run keeps the ids comparable */
            toolcall_release(t);
            CHECK(toolcall_create(&t, f, SEED, 0, err, sizeof err) == 0, "%s", err);
            struct out s = stream(t, text, len, cuts, len <= 160 ? 2 : 1);
            CHECK(strcmp(s.content, w.content) == 0 && strcmp(s.calls, w.calls) == 0,
                  "%s split at %zu, %zu:\n content \"%s\" calls %s\n whole content \"%s\" calls %s",
                  toolcall_format_name(f), a, b, s.content, s.calls, w.content, w.calls);
            out_free(&s);
        }
    }
    toolcall_release(t);
    out_free(&w);
}

/* The parse of text has the expected content and calls: names and arguments given as
 * "name1", "{json}", "name2", ... (arguments compared as JSON values). */
static void expect(enum toolcall_format f, const char *text, const char *want_content, size_t ncalls, ...)
{
    struct strbuf c = {0};
    json_t *calls = NULL;
    char err[128];
    CHECK_EQ_INT(toolcall_parse(f, SEED, text, strlen(text), &c, &calls, err, sizeof err), 0);
    CHECK(strcmp(c.p ? c.p : "", want_content) == 0, "%s \"%s\": content \"%s\", want \"%s\"",
          toolcall_format_name(f), text, c.p ? c.p : "", want_content);
    CHECK(json_is_array(calls) && json_array_size(calls) == ncalls, "%s \"%s\": %zu calls, want %zu",
          toolcall_format_name(f), text, json_array_size(calls), ncalls);
    va_list ap;
    va_start(ap, ncalls);
    for (size_t k = 0; k < ncalls && k < json_array_size(calls); k++) {
        const char *name = va_arg(ap, const char *);
        const char *args = va_arg(ap, const char *);
        json_t *call = json_array_get(calls, k);
        const char *id = json_string_value(json_object_get(call, "id"));
        const char *type = json_string_value(json_object_get(call, "type"));
        json_t *fn = json_object_get(call, "function");
        const char *got_name = json_string_value(json_object_get(fn, "name"));
        const char *got_args = json_string_value(json_object_get(fn, "arguments"));
        CHECK(type && strcmp(type, "function") == 0, "type %s", type ? type : "(none)");
        CHECK(got_name && strcmp(got_name, name) == 0, "call %zu name %s, want %s", k, got_name ? got_name : "-",
              name);
        json_t *ga = got_args ? json_loads(got_args, JSON_DECODE_ANY, NULL) : NULL;
        json_t *wa = json_loads(args, JSON_DECODE_ANY, NULL);
        CHECK(ga && wa && json_equal(ga, wa), "call %zu arguments %s, want %s", k, got_args ? got_args : "-", args);
        json_decref(ga);
        json_decref(wa);
        size_t idlen = id ? strlen(id) : 0;
        bool alnum = true;
        for (size_t i = f == TOOLCALL_MISTRAL ? 0 : 5; i < idlen; i++) {
            char ch = id[i];
            alnum = alnum && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'));
        }
        if (f == TOOLCALL_MISTRAL)
            CHECK(idlen == 9 && alnum, "mistral id %s", id ? id : "(none)");
        else
            CHECK(idlen == 21 && strncmp(id, "call_", 5) == 0 && alnum, "id %s", id ? id : "(none)");
        for (size_t j = 0; j < k; j++) {
            const char *other = json_string_value(json_object_get(json_array_get(calls, j), "id"));
            CHECK(strcmp(other, id) != 0, "calls %zu and %zu share id %s", j, k, id);
        }
    }
    va_end(ap);
    json_decref(calls);
    strbuf_free(&c);
    check_splits(f, text);
}

static void test_hermes(void)
{
    enum toolcall_format H = TOOLCALL_HERMES;
    expect(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", 1,
           "get_weather", "{\"city\": \"Paris\"}");
    expect(H,
           "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
           "Let me check both.\n", 2, "a", "{\"x\": [1, 2]}", "b", "{}");
    expect(H, "Before <tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"é\"}}</tool_call> and after.",
           "Before  and after.", 1, "f", "{\"q\": \"é\"}");
    /* arguments as a JSON string stay as they are; missing arguments are {} */
    expect(H, "<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"a\\\":  1}\"}</tool_call>", "", 1, "s",
           "{\"a\": 1}");
    expect(H, "<tool_call>{\"name\": \"noargs\"}</tool_call>", "", 1, "noargs", "{}");
    /* no close tag (the output was cut) */
    expect(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", "", 1, "f", "{\"a\": 1}");
    /* a close tag missing before the next call */
    expect(H, "<tool_call>{\"name\": \"f\", \"arguments\": {}}\n<tool_call>{\"name\": \"g\"}</tool_call>", "", 2,
           "f", "{}", "g", "{}");
    /* an array of calls in one tag */
    expect(H, "<tool_call>[{\"name\": \"f\"}, {\"name\": \"g\", \"arguments\": {\"z\": null}}]</tool_call>", "", 2,
           "f", "{}", "g", "{\"z\": null}");

    /* malformed: everything comes back as content, byte for byte */
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"x\", \"arguments\": {bad}\n</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 5}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>",
        "text <tool_call",
        "a <tools> b <tool_ c </tool_call>",
        "<tool_call>[]</tool_call>",
        "<tool_call>{\"name\": \"f\"} trailing</tool_call>",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        expect(H, bad[k], bad[k], 0);
    /* a malformed call next to a good one: the bad one is content */
    expect(H,
           "<tool_call>{\"name\": \"ok\"}</tool_call>\n<tool_call>{oops}</tool_call>",
           "<tool_call>{oops}</tool_call>", 1, "ok", "{}");
    /* other formats' markers are content here */
    expect(H, "[TOOL_CALLS][{\"name\": \"f\"}]", "[TOOL_CALLS][{\"name\": \"f\"}]", 0);
}

static void test_llama3(void)
{
    enum toolcall_format L = TOOLCALL_LLAMA3;
    expect(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1, "get_weather",
           "{\"city\": \"Paris\"}");
    expect(L, "  \n{\"name\": \"f\", \"arguments\": {\"n\": 1.5}}  ", "", 1, "f", "{\"n\": 1.5}");
    expect(L, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "", 1, "f", "{}");
    expect(L, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": 2}}", "", 2,
           "a", "{\"x\": 1}", "b", "{\"y\": 2}");
    expect(L, "{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\", \"parameters\": {}}", "", 2, "a", "{}", "b",
           "{}");
    const char *content[] = {
        "Hello there!",
        "  The answer is {x}.",
        "{not json",
        "{\"name\": \"f\", \"parameters\": {}} and some text",
        "{\"parameters\": {}}",
        "{\"answer\": 42}",
        "<|python_tag|>brave_search.call(query=\"weather\")",
        "<|python_tag|>",
        "<|pyth",
        "<b>bold</b>",
        "   ",
        "",
        "Sure: {\"name\": \"f\", \"parameters\": {}}",
    };
    for (size_t k = 0; k < sizeof content / sizeof content[0]; k++)
        expect(L, content[k], content[k], 0);
}

static void test_mistral(void)
{
    enum toolcall_format M = TOOLCALL_MISTRAL;
    expect(M, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", "", 2,
           "a", "{\"q\": 1}", "b", "{}");
    expect(M, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcDEF123\"}]", "", 1, "a", "{}");
    expect(M, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]other[ARGS] {}", "", 2, "get_weather",
           "{\"city\": \"Paris\"}", "other", "{}");
    expect(M, "[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{\"k\": \"v\"}", "", 1, "f", "{\"k\": \"v\"}");
    expect(M, "I will call it.[TOOL_CALLS]f[ARGS]{}", "I will call it.", 1, "f", "{}");
    const char *bad[] = {
        "[TOOL_CALLS][{\"name\": 1}]",
        "[TOOL_CALLS][]",
        "[TOOL_CALLS][{\"name\": \"f\"}",
        "[TOOL_CALLS]f[ARGS]",
        "[TOOL_CALLS]f[ARGS]{\"a\": ",
        "[TOOL_CALLS]f{}",
        "[TOOL_CALLS][ARGS]{}",
        "[TOOL_CALLS]",
        "[TOOL_CALL",
        "plain [TOOL text",
        "<tool_call>{\"name\": \"f\"}</tool_call>",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        expect(M, bad[k], bad[k], 0);
    /* one good and one bad segment */
    expect(M, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{broken", "[TOOL_CALLS]g[ARGS]{broken", 1, "f", "{}");
    /* text after the calls is content */
    expect(M, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}] and then some", " and then some", 1, "f", "{}");
}

static void test_none(void)
{
    expect(TOOLCALL_NONE, "<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call>", 0);
    expect(TOOLCALL_NONE, "{\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {}}", 0);
}

/* Content before a possible call streams out at once; the call is held. */
static void test_streaming(void)
{
    struct toolcall *t;
    char err[128];
    struct strbuf c = {0};
    json_t *calls;

    CHECK_EQ_INT(toolcall_create(&t, TOOLCALL_HERMES, SEED, 0, err, sizeof err), 0);
    CHECK_EQ_INT(toolcall_feed(t, "Hello <tool", 11, &c), 0);
    CHECK(c.len == 6 && memcmp(c.p, "Hello ", 6) == 0, "content \"%s\"", c.p);
    CHECK_EQ_INT(toolcall_feed(t, "s> are here", 11, &c), 0);
    CHECK(c.len == 22 && memcmp(c.p, "Hello <tools> are here", 22) == 0, "content \"%s\"", c.p);
    CHECK_EQ_INT(toolcall_feed(t, " <tool_call>{\"name\": \"f\"}", 25, &c), 0);
    CHECK_EQ_INT(c.len, 23);
    CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
    CHECK_EQ_INT(json_array_size(calls), 1);
    CHECK_EQ_INT(c.len, 23);
    json_decref(calls);
    /* the splitter starts over and ids stay unique across its streams */
    const char *id0 = NULL;
    char first[32] = "";
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(toolcall_feed(t, "<tool_call>{\"name\": \"f\"}</tool_call>", 36, &c), 0);
        CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
        id0 = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
        CHECK(id0 && strcmp(id0, first) != 0, "id %s repeated", id0 ? id0 : "-");
        if (id0)
            snprintf(first, sizeof first, "%s", id0);
        json_decref(calls);
    }
    toolcall_release(t);

    strbuf_clear(&c);
    CHECK_EQ_INT(toolcall_create(&t, TOOLCALL_LLAMA3, SEED, 0, err, sizeof err), 0);
    CHECK_EQ_INT(toolcall_feed(t, "  {\"na", 6, &c), 0);
    CHECK_EQ_INT(c.len, 0);
    CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
    CHECK(c.len == 6 && json_array_size(calls) == 0, "unfinished call as content: \"%s\"", c.p);
    json_decref(calls);
    strbuf_clear(&c);
    CHECK_EQ_INT(toolcall_feed(t, "\nHi", 3, &c), 0);
    CHECK(c.len == 3 && memcmp(c.p, "\nHi", 3) == 0, "plain text streams: \"%s\"", c.p);
    const char *obj = " {\"name\": \"f\"}";
    CHECK_EQ_INT(toolcall_feed(t, obj, strlen(obj), &c), 0);
    CHECK_EQ_INT(c.len, 3 + strlen(obj));
    CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
    CHECK_EQ_INT(json_array_size(calls), 0);
    json_decref(calls);
    toolcall_release(t);
    strbuf_free(&c);
}

/* Past max_held the held text is given up as content and the rest passes through. */
static void test_max_held(void)
{
    struct toolcall *t;
    char err[128];
    struct strbuf c = {0};
    json_t *calls;
    CHECK_EQ_INT(toolcall_create(&t, TOOLCALL_HERMES, SEED, 100, err, sizeof err), 0);
    char text[400];
    snprintf(text, sizeof text, "x<tool_call>{\"name\": \"f\", \"arguments\": {\"long\": \"%0200d\"}}</tool_call>", 7);
    size_t len = strlen(text);
    for (size_t i = 0; i < len; i += 7)
        CHECK_EQ_INT(toolcall_feed(t, text + i, len - i < 7 ? len - i : 7, &c), 0);
    CHECK_EQ_INT(toolcall_finish(t, &c, &calls), 0);
    CHECK(c.len == len && memcmp(c.p, text, len) == 0 && json_array_size(calls) == 0, "overflow: %zu bytes", c.len);
    json_decref(calls);
    toolcall_release(t);
    strbuf_free(&c);

    CHECK_EQ_INT(toolcall_create(&t, 99, SEED, 0, err, sizeof err), CAIRN_EINVAL);
    CHECK(t == NULL && strstr(err, "unknown") != NULL, "message: %s", err);
    toolcall_release(NULL);
    CHECK(strcmp(toolcall_format_name(TOOLCALL_MISTRAL), "mistral") == 0, "name");
}

/* Many open tags (with no close tag, or one at the very end) parse in linear time and
 * come back as content; the one call in a long text is found. */
static void test_many_markers(void)
{
    size_t reps = 200000;
    struct strbuf text = {0}, c = {0};
    for (size_t k = 0; k < reps; k++)
        strbuf_put(&text, "<tool_call>", 11);
    char err[64];
    json_t *calls;
    for (int pass = 0; pass < 2; pass++) {
        strbuf_clear(&c);
        CHECK_EQ_INT(toolcall_parse(TOOLCALL_HERMES, 1, text.p, text.len, &c, &calls, err, sizeof err), 0);
        CHECK(c.len == text.len && memcmp(c.p, text.p, c.len) == 0 && json_array_size(calls) == 0,
              "pass %d: %zu bytes of content, %zu calls", pass, c.len, json_array_size(calls));
        json_decref(calls);
        strbuf_put(&text, "</tool_call>", 12);
    }
    const char *last = "<tool_call>{\"name\": \"last\"}</tool_call>";
    strbuf_put(&text, last, strlen(last));
    strbuf_clear(&c);
    CHECK_EQ_INT(toolcall_parse(TOOLCALL_HERMES, 1, text.p, text.len, &c, &calls, err, sizeof err), 0);
    CHECK(json_array_size(calls) == 1 && c.len == text.len - strlen(last), "%zu calls, %zu bytes of content",
          json_array_size(calls), c.len);
    json_decref(calls);
    strbuf_free(&text);
    strbuf_free(&c);
}

/* Different seeds give different ids; the same seed the same ones. */
static void test_ids(void)
{
    const char *text = "<tool_call>{\"name\": \"f\"}</tool_call>";
    json_t *a, *b, *c;
    struct strbuf s = {0};
    char err[64];
    toolcall_parse(TOOLCALL_HERMES, 1, text, strlen(text), &s, &a, err, sizeof err);
    toolcall_parse(TOOLCALL_HERMES, 1, text, strlen(text), &s, &b, err, sizeof err);
    toolcall_parse(TOOLCALL_HERMES, 2, text, strlen(text), &s, &c, err, sizeof err);
    CHECK(json_equal(a, b), "same seed, different ids");
    /* arguments given as a string are kept byte for byte */
    const char *str = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":  1}\"}</tool_call>";
    json_t *d;
    toolcall_parse(TOOLCALL_HERMES, 1, str, strlen(str), &s, &d, err, sizeof err);
    const char *args = json_string_value(json_object_get(json_object_get(json_array_get(d, 0), "function"), "arguments"));
    CHECK(args && strcmp(args, "{\"a\":  1}") == 0, "string arguments: %s", args ? args : "-");
    json_decref(d);
    CHECK(!json_equal(a, c), "different seeds, same ids");
    json_decref(a);
    json_decref(b);
    json_decref(c);
    strbuf_free(&s);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    *len = fread(p, 1, (size_t)n, f);
    p[*len] = '\0';
    fclose(f);
    return p;
}

static char *read_template(const char *name, size_t *len)
{
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", name);
    char *p = read_file(test_data_path(rel), len);
    CHECK(p != NULL, "cannot read %s", rel);
    return p;
}

static const struct {
    const char *file;
    enum toolcall_format f;
} detect_cases[] = {
    {"Qwen-Qwen2.5-7B-Instruct.jinja", TOOLCALL_HERMES},
    {"Qwen-Qwen3-0.6B.jinja", TOOLCALL_HERMES},
    {"Qwen-QwQ-32B.jinja", TOOLCALL_HERMES},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", TOOLCALL_HERMES},
    {"MiMo-VL.jinja", TOOLCALL_HERMES},
    {"ibm-granite-granite-4.0.jinja", TOOLCALL_HERMES},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", TOOLCALL_LLAMA3},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", TOOLCALL_LLAMA3},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOLCALL_MISTRAL},
    {"Mistral-Small-3.2-24B-Instruct-2506.jinja", TOOLCALL_MISTRAL},
    {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", TOOLCALL_MISTRAL},
    /* no tools at all */
    {"google-gemma-2-2b-it.jinja", TOOLCALL_NONE},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TOOLCALL_NONE},
    /* tools in formats not parsed here: they must not be taken for one that is */
    {"Qwen3-Coder.jinja", TOOLCALL_NONE},             /* <tool_call><function=...> XML */
    {"StepFun3.5-Flash.jinja", TOOLCALL_NONE},
    {"GLM-4.6.jinja", TOOLCALL_NONE},                 /* <tool_call>name<arg_key> */
    {"poolside-Laguna-XS-2.1.jinja", TOOLCALL_NONE},
    {"MiniMax-M3.jinja", TOOLCALL_NONE},              /* <invoke name=...> */
    {"unsloth-Apriel-1.5.jinja", TOOLCALL_NONE},      /* <tool_calls>[...] */
    {"meetkai-functionary-medium-v3.1.jinja", TOOLCALL_NONE},
    {"meetkai-functionary-medium-v3.2.jinja", TOOLCALL_NONE},
    {"NVIDIA-Nemotron-Nano-v2.jinja", TOOLCALL_NONE}, /* <TOOLCALL>[...] */
    {"Cohere2MoE.jinja", TOOLCALL_NONE},
    {"openai-gpt-oss-120b.jinja", TOOLCALL_NONE},
    {"deepseek-ai-DeepSeek-V3.1.jinja", TOOLCALL_NONE},
    {"google-gemma-4-31B-it-interleaved.jinja", TOOLCALL_NONE},
};

static void test_detect(void)
{
    for (size_t k = 0; k < sizeof detect_cases / sizeof detect_cases[0]; k++) {
        size_t len;
        char *src = read_template(detect_cases[k].file, &len);
        if (!src)
            continue;
        enum toolcall_format f = toolcall_detect(src, len);
        CHECK(f == detect_cases[k].f, "%s: detected %s, want %s", detect_cases[k].file, toolcall_format_name(f),
              toolcall_format_name(detect_cases[k].f));
        free(src);
    }
    CHECK(toolcall_detect("", 0) == TOOLCALL_NONE, "empty template");
}

/* Strips end-of-turn markers and whitespace from the end of an assistant turn. */
static size_t strip_end(const char *s, size_t n)
{
    static const char *const ends[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|end_of_text|>",
                                       "<|end_of_turn|>"};
    bool again = true;
    while (again) {
        again = false;
        while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
            n--, again = true;
        for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++) {
            size_t l = strlen(ends[k]);
            if (n >= l && memcmp(s + n - l, ends[k], l) == 0)
                n -= l, again = true;
        }
    }
    return n;
}

/* Every template whose format is detected renders an assistant tool call in the history
 * that the parser reads back as the same call. */
static void test_roundtrip(void)
{
    const char *vars_text =
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
        "   \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
        " \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]}";
    const char *call_text =
        "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"abcDEF123\", \"type\": \"function\","
        " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]}";
    DIR *d = opendir(test_data_path("templates"));
    CHECK(d != NULL, "cannot list the templates");
    if (!d)
        return;
    int tried = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t nl = strlen(e->d_name);
        if (nl < 6 || strcmp(e->d_name + nl - 6, ".jinja") != 0)
            continue;
        size_t len;
        char *src = read_template(e->d_name, &len);
        enum toolcall_format f = src ? toolcall_detect(src, len) : TOOLCALL_NONE;
        struct tmpl *t = NULL;
        char err[512];
        if (f == TOOLCALL_NONE || tmpl_parse(&t, src, len, err, sizeof err) != 0) {
            CHECK(f == TOOLCALL_NONE, "%s: %s", e->d_name, err);
            free(src);
            continue;
        }
        tried++;
        json_t *vars = json_loads(vars_text, 0, NULL);
        json_object_set_new(vars, "add_generation_prompt", json_true());
        char *prompt = NULL, *full = NULL;
        size_t plen = 0, flen = 0;
        int rc = tmpl_render(t, vars, &prompt, &plen, err, sizeof err);
        CHECK(rc == 0, "%s: prompt: %s", e->d_name, err);
        json_object_set_new(vars, "add_generation_prompt", json_false());
        json_array_append_new(json_object_get(vars, "messages"), json_loads(call_text, 0, NULL));
        if (!rc) {
            rc = tmpl_render(t, vars, &full, &flen, err, sizeof err);
            CHECK(rc == 0, "%s: history: %s", e->d_name, err);
        }
        if (!rc) {
            /* The assistant turn starts where the history leaves the generation prompt
             * (which may go on with, e.g., an open <think>): at the end of their common
             * prefix, backed off to the end of a line or a tag. */
            size_t lcp = 0;
            while (lcp < plen && lcp < flen && prompt[lcp] == full[lcp])
                lcp++;
            if (lcp < plen) {
                while (lcp > 0 && full[lcp - 1] != '\n' && full[lcp - 1] != '>' && full[lcp - 1] != ']')
                    lcp--;
            }
            CHECK(lcp > 0 && flen > lcp, "%s: the history does not extend the prompt", e->d_name);
            plen = lcp;
            size_t n = strip_end(full, flen);
            struct strbuf c = {0};
            json_t *calls = NULL;
            CHECK_EQ_INT(toolcall_parse(f, SEED, full + plen, n - plen, &c, &calls, err, sizeof err), 0);
            json_t *fn = json_object_get(json_array_get(calls, 0), "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            const char *args = json_string_value(json_object_get(fn, "arguments"));
            json_t *a = args ? json_loads(args, 0, NULL) : NULL;
            json_t *want = json_pack("{s:s, s:i}", "city", "Paris", "days", 2);
            CHECK(json_array_size(calls) == 1 && name && strcmp(name, "get_weather") == 0 && json_equal(a, want),
                  "%s (%s): %zu calls from \"%.*s\"", e->d_name, toolcall_format_name(f), json_array_size(calls),
                  (int)(n - plen), full + plen);
            json_decref(a);
            json_decref(want);
            json_decref(calls);
            strbuf_free(&c);
        }
        free(prompt);
        free(full);
        json_decref(vars);
        tmpl_free(t);
        free(src);
    }
    closedir(d);
    CHECK(tried >= 8, "only %d templates with a tool call format", tried);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_hermes);
    RUN(test_llama3);
    RUN(test_mistral);
    RUN(test_none);
    RUN(test_streaming);
    RUN(test_max_held);
    RUN(test_ids);
    RUN(test_many_markers);
    RUN(test_detect);
    RUN(test_roundtrip);
    return test_main_end();
}
