/* The harmony splitter (gpt-oss): channels to reasoning and content, recipients to tool
 * calls, text that is not harmony left as it is; streaming at every split point equal to
 * the whole text; and what gpt-oss's own template renders for an assistant turn (its
 * reasoning and a call) parsed back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"
#include "tmpl/tmpl.h"
#include "tok/harmony.h"

#define SEED 0x5eedull

/* One stream's results: reasoning, content and the calls as compact JSON. */
struct out {
    char *reasoning, *content, *calls;
};

static void out_free(struct out *o)
{
    free(o->reasoning);
    free(o->content);
    free(o->calls);
}

/* Feeds text cut at cuts[0..n) (ascending) and finishes. */
static struct out run(const char *text, const size_t *cuts, size_t n)
{
    struct harmony *h = NULL;
    char err[128];
    CHECK_EQ_INT(harmony_create(&h, SEED, err, sizeof err), 0);
    struct strbuf r = {0}, c = {0};
    size_t len = strlen(text), at = 0;
    for (size_t k = 0; k <= n; k++) {
        size_t end = k < n ? cuts[k] : len;
        CHECK_EQ_INT(harmony_feed(h, text + at, end - at, &r, &c), 0);
        at = end;
    }
    json_t *calls = NULL;
    CHECK_EQ_INT(harmony_finish(h, &r, &c, &calls), 0);
    struct out o = {r.p ? r.p : strdup(""), c.p ? c.p : strdup(""), json_dumps(calls, JSON_COMPACT)};
    json_decref(calls);
    harmony_release(h);
    return o;
}

static struct out whole(const char *text) { return run(text, NULL, 0); }

/* Checks a text's results, whole and cut at every point and byte by byte. */
static void expect(const char *text, const char *reasoning, const char *content, const char *calls)
{
    struct out w = whole(text);
    CHECK(!strcmp(w.reasoning, reasoning), "reasoning of %s: '%s', want '%s'", text, w.reasoning, reasoning);
    CHECK(!strcmp(w.content, content), "content of %s: '%s', want '%s'", text, w.content, content);
    CHECK(!strcmp(w.calls, calls), "calls of %s: %s, want %s", text, w.calls, calls);
    size_t len = strlen(text);
    size_t *bytes = malloc((len + 1) * sizeof *bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] = i;
    for (size_t cut = 1; cut < len; cut++) {
        struct out s = run(text, &cut, 1);
        CHECK(!strcmp(s.reasoning, w.reasoning) && !strcmp(s.content, w.content) && !strcmp(s.calls, w.calls),
              "cut at %zu of %s: '%s' '%s' %s", cut, text, s.reasoning, s.content, s.calls);
        out_free(&s);
    }
    struct out b = run(text, bytes + 1, len ? len - 1 : 0);
    CHECK(!strcmp(b.reasoning, w.reasoning) && !strcmp(b.content, w.content) && !strcmp(b.calls, w.calls),
          "byte by byte: %s", text);
    out_free(&b);
    free(bytes);
    out_free(&w);
}

static void test_channels(void)
{
    expect("<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!",
           "Think first.", "Hi there!", "[]");
    /* <|return|> ends the generation, so it rarely reaches the text; when it does, it ends the body */
    expect("<|channel|>final<|message|>Just the answer.<|return|>", "", "Just the answer.", "[]");
    /* a preamble on commentary is for the user */
    expect("<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
           "", "Let me look.Done.", "[]");
    /* markers' look-alikes inside a body stay text */
    expect("<|channel|>final<|message|>a <| b |> <|en c", "", "a <| b |> <|en c", "[]");
    /* a model that leaves out <|end|> before the next message */
    expect("<|channel|>analysis<|message|>x<|start|>assistant<|channel|>final<|message|>y", "x", "y", "[]");
}

static void test_calls(void)
{
    const char *want =
        "[{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]";
    struct out w = whole("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}");
    json_t *calls = json_loads(w.calls, 0, NULL);
    const char *id = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
    CHECK(id && !strncmp(id, "call_", 5) && strlen(id) == 21, "a call id: %s", w.calls);
    char expect_calls[512];
    snprintf(expect_calls, sizeof expect_calls, want, id ? id : "");
    json_decref(calls);
    out_free(&w);
    /* the recipient in the header's role part, as the template writes calls back */
    expect("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
           "<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
           "Need weather.", "", expect_calls);
    expect("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|> {\"city\": \"Paris\"}\n",
           "", "", expect_calls);
    /* two calls, ids distinct; a recipient without "functions." keeps its whole name */
    w = whole("<|channel|>commentary to=functions.a<|message|>{}<|end|>"
              "<|start|>assistant<|channel|>commentary to=browser.search<|message|>{\"q\":1}<|call|>");
    calls = json_loads(w.calls, 0, NULL);
    const char *n0 = json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name"));
    const char *n1 = json_string_value(json_object_get(json_object_get(json_array_get(calls, 1), "function"), "name"));
    const char *i0 = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
    const char *i1 = json_string_value(json_object_get(json_array_get(calls, 1), "id"));
    CHECK(json_array_size(calls) == 2 && n0 && !strcmp(n0, "a") && n1 && !strcmp(n1, "browser.search") && i0 && i1 &&
              strcmp(i0, i1),
          "two calls: %s", w.calls);
    json_decref(calls);
    out_free(&w);
}

static void test_not_harmony(void)
{
    /* a model that just writes: content as it is */
    expect("Hello, world.", "", "Hello, world.", "[]");
    expect("<b>bold</b> <|channel|>", "", "<b>bold</b> <|channel|>", "[]");
    /* a header that never ends is given up as content */
    char *longhead = malloc(HARMONY_MAX_HEAD + 64);
    strcpy(longhead, "<|channel|>");
    memset(longhead + 11, 'x', HARMONY_MAX_HEAD + 20);
    longhead[HARMONY_MAX_HEAD + 31] = 0;
    struct out w = whole(longhead);
    CHECK(!strcmp(w.content, longhead) && !w.reasoning[0], "a header past the limit is content");
    out_free(&w);
    free(longhead);
    /* a header cut short by the end of the stream is not lost */
    expect("<|channel|>anal", "", "<|channel|>anal", "[]");
    CHECK(harmony_detect("{{ '<|channel|>' }}x<|message|>", 31) && !harmony_detect("<|im_start|>", 12),
          "detection");
}

/* gpt-oss's template renders an assistant turn with reasoning and a call; the splitter
 * gets them back from the text after the generation prompt. */
static void test_template_roundtrip(void)
{
    size_t len = 0;
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/templates/openai-gpt-oss-120b.jinja", CAIRN_SHARED_DIR);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s", path);
    if (!f)
        return;
    char *src = malloc(1 << 20);
    len = fread(src, 1, (1 << 20) - 1, f);
    fclose(f);
    src[len] = 0;
    CHECK(harmony_detect(src, len), "gpt-oss's template is harmony");
    struct tmpl *t = NULL;
    char err[512];
    CHECK_EQ_INT(tmpl_parse(&t, src, len, err, sizeof err), 0);
    json_t *vars = json_loads(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\":"
        "   {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
        " \"add_generation_prompt\": true}",
        0, NULL);
    char *prompt = NULL, *full = NULL;
    size_t plen = 0, flen = 0;
    CHECK(tmpl_render(t, vars, &prompt, &plen, err, sizeof err) == 0, "render: %s", err);
    json_object_set_new(vars, "add_generation_prompt", json_false());
    json_array_append_new(json_object_get(vars, "messages"),
                          json_loads("{\"role\": \"assistant\", \"content\": \"\", \"thinking\": \"Use the tool.\","
                                     " \"tool_calls\": [{\"id\": \"x\", \"type\": \"function\", \"function\":"
                                     " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}",
                                     0, NULL));
    CHECK_EQ_INT(tmpl_render(t, vars, &full, &flen, err, sizeof err), 0);
    CHECK(prompt && full && plen < flen && !memcmp(prompt, full, plen), "the turn extends the generation prompt");
    if (prompt && full && plen < flen) {
        struct out o = whole(full + plen);
        json_t *calls = json_loads(o.calls, 0, NULL);
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")) ?: "", 0, NULL);
        CHECK(!strcmp(o.reasoning, "Use the tool.") && !o.content[0] && json_array_size(calls) == 1 &&
                  !strcmp(json_string_value(json_object_get(fn, "name")) ?: "", "get_weather") &&
                  !strcmp(json_string_value(json_object_get(args, "city")) ?: "", "Paris"),
              "parsed back from '%s': '%s' '%s' %s", full + plen, o.reasoning, o.content, o.calls);
        json_decref(args);
        json_decref(calls);
        out_free(&o);
    }
    free(prompt);
    free(full);
    json_decref(vars);
    tmpl_free(t);
    free(src);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_channels);
    RUN(test_calls);
    RUN(test_not_harmony);
    RUN(test_template_roundtrip);
    return test_main_end();
}
