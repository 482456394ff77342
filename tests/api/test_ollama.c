/* Ollama endpoints over a real HTTP server on 127.0.0.1 and the fake generation backend
 * (fake_gen.h): request fields into the common parameters, reply shapes (streamed and
 * whole), tool calls both ways, thinking, the model list, errors, and cancellation when
 * the client hangs up or the server stops. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/ollama.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/version.h" /* CAIRN_VERSION, to check /api/version against */
#include "fake_gen.h"
#include "rawhttp.h"
#include "testutil.h"

/* The NDJSON lines of a body as a JSON array (a line that does not parse is null). */
static json_t *ndjson(const struct rh_resp *r)
{
    json_t *arr = json_array();
    const char *p = r->body;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        json_t *j = json_loadb(p, len, 0, NULL);
        json_array_append_new(arr, j ? j : json_null());
        p = nl ? nl + 1 : p + len;
    }
    return arr;
}

/* "2024-01-02T03:04:05.123456789Z". */
static bool is_rfc3339(const char *s)
{
    const char *pat = "dddd-dd-ddTdd:dd:dd.dddddddddZ";
    if (!s || strlen(s) != strlen(pat))
        return false;
    for (size_t i = 0; pat[i]; i++)
        if (pat[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != pat[i])
            return false;
    return true;
}

/* ---------- fixture ---------- */

static struct fake_gen F;
static struct gen G = {&fake_gen_ops, &F};
static char tmpdir[64];
static char file_a[128];

static void set_models(void)
{
    char text[4096];
    snprintf(text, sizeof text,
             "[{\"id\":\"qwen3-0.6b-Q8_0\",\"file\":\"%s\",\"bytes\":12345,\"name\":\"Qwen3 0.6B\","
             "\"architecture\":\"qwen3\",\"n_layers\":2,\"hidden_size\":64,\"feed_forward_size\":128,"
             "\"n_head\":4,\"n_head_kv\":2,\"head_dim\":16,\"context_length\":4096,\"vocab_size\":1000,"
             "\"tied_output\":true,\"sha256\":\"abc123\",\"error\":null,\"ready\":true,\"nodes\":[\"n1\"],"
             "\"chat_template\":\"{%% for m in messages %%}{{ m.content }}{%% endfor %%}"
             "{%% if tools %%}T{%% endif %%}{%% if enable_thinking %%}<think>{%% endif %%}\"},"
             "{\"id\":\"mistral:7b\",\"file\":\"/nonexistent/mistral-7b.F16.gguf\",\"bytes\":999,\"name\":\"\","
             "\"architecture\":\"llama\",\"n_layers\":32,\"hidden_size\":4096,\"feed_forward_size\":14336,"
             "\"n_head\":32,\"n_head_kv\":8,\"head_dim\":128,\"context_length\":32768,\"vocab_size\":32000,"
             "\"tied_output\":false,\"sha256\":null,\"error\":null,\"ready\":false,\"nodes\":[],"
             "\"chat_template\":null},"
             "{\"id\":\"broken\",\"file\":\"/x/broken.gguf\",\"bytes\":5,\"error\":\"truncated\",\"ready\":false,"
             "\"nodes\":[]}]",
             file_a);
    json_decref(F.models);
    F.models = json_loads(text, 0, NULL);
    CHECK(F.models != NULL, "models fixture parses");
}

static const char *M = "qwen3-0.6b-Q8_0:latest";

/* ---------- tests ---------- */

static void test_version(uint16_t port)
{
    struct rh_resp r;
    rh_request(port, "GET", "/api/version", NULL, NULL, &r);
    json_t *j = rh_json(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(rh_streq(rh_jstr(j, "version"), CAIRN_VERSION), "version %s, want %s", rh_jstr(j, "version"), CAIRN_VERSION);
    json_decref(j);
    rh_free(&r);
}

static void test_tags_ps_show(uint16_t port)
{
    struct rh_resp r;
    rh_request(port, "GET", "/api/tags", NULL, NULL, &r);
    json_t *j = rh_json(&r);
    json_t *models = json_object_get(j, "models");
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_array_size(models), 2); /* the broken file is not listed */
    json_t *a = json_array_get(models, 0), *b = json_array_get(models, 1);
    CHECK(rh_streq(rh_jstr(a, "name"), M) && rh_streq(rh_jstr(a, "model"), M), "untagged id listed as :latest: %s",
          rh_jstr(a, "name"));
    CHECK(rh_streq(rh_jstr(b, "name"), "mistral:7b"), "tagged id listed as is: %s", rh_jstr(b, "name"));
    CHECK_EQ_INT(rh_jint(a, "size"), 12345);
    CHECK(rh_streq(rh_jstr(a, "digest"), "abc123") && rh_streq(rh_jstr(b, "digest"), ""), "digests");
    CHECK(rh_streq(rh_jstr(a, "modified_at"), "2024-01-02T03:04:05.000000006Z"), "modified_at from the file: %s",
          rh_jstr(a, "modified_at"));
    CHECK(is_rfc3339(rh_jstr(b, "modified_at")), "modified_at without a file: %s", rh_jstr(b, "modified_at"));
    /* 2 layers x (attention 12288 + ffn 24576 + norms 128) + norm 64 + tied embedding
     * 64000 = 138048; Mistral 7B's shape gives 7.24e9. */
    CHECK(rh_json_same(json_object_get(a, "details"),
                       "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"qwen3\",\"families\":[\"qwen3\"],"
                       "\"parameter_size\":\"138.05K\",\"quantization_level\":\"Q8_0\"}"),
          "details of the untagged model");
    CHECK(rh_json_same(json_object_get(b, "details"),
                       "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"llama\",\"families\":[\"llama\"],"
                       "\"parameter_size\":\"7.2B\",\"quantization_level\":\"F16\"}"),
          "details of the tagged model");
    json_decref(j);
    rh_free(&r);

    rh_request(port, "GET", "/api/ps", NULL, NULL, &r);
    j = rh_json(&r);
    models = json_object_get(j, "models");
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_array_size(models), 1);
    a = json_array_get(models, 0);
    CHECK(rh_streq(rh_jstr(a, "name"), M) && rh_jstr(a, "expires_at") && json_is_integer(json_object_get(a, "size_vram")),
          "ps lists the ready model with expires_at and size_vram");
    json_decref(j);
    rh_free(&r);

    rh_post(port, "/api/show", "{\"model\":\"qwen3-0.6b-Q8_0:latest\"}", &r);
    j = rh_json(&r);
    CHECK_EQ_INT(r.status, 200);
    json_t *info = json_object_get(j, "model_info");
    CHECK(rh_streq(rh_jstr(info, "general.architecture"), "qwen3"), "model_info architecture");
    CHECK_EQ_INT(rh_jint(info, "qwen3.context_length"), 4096);
    CHECK_EQ_INT(rh_jint(info, "qwen3.block_count"), 2);
    CHECK_EQ_INT(rh_jint(info, "qwen3.attention.head_count_kv"), 2);
    CHECK_EQ_INT(rh_jint(info, "general.parameter_count"), 138048);
    CHECK(rh_streq(rh_jstr(j, "template"), json_string_value(json_object_get(json_array_get(F.models, 0), "chat_template"))),
          "template is the chat template");
    CHECK(strstr(rh_jstr(j, "modelfile") ? rh_jstr(j, "modelfile") : "", file_a) != NULL, "modelfile names the file");
    CHECK(rh_json_same(json_object_get(j, "capabilities"), "[\"completion\",\"tools\",\"thinking\"]"), "capabilities");
    CHECK(rh_streq(rh_jstr(json_object_get(j, "details"), "quantization_level"), "Q8_0"), "show details");
    json_decref(j);
    rh_free(&r);

    const struct {
        const char *body;
        int status;
        const char *error;
    } cases[] = {
        {"{\"name\":\"mistral:7b\"}", 200, NULL},
        {"{\"model\":\"qwen3-0.6b-Q8_0\"}", 200, NULL},
        {"{\"model\":\"nope\"}", 404, "model 'nope' not found"},
        {"{\"model\":\"mistral:7b:latest\"}", 404, "model 'mistral:7b:latest' not found"},
        {"{\"model\":\"mistral\"}", 404, "model 'mistral' not found"},
        {"{\"model\":\"broken:latest\"}", 200, NULL},
        {"{}", 400, "model is required"},
        {"{\"model\":5}", 400, "model: expected a string"},
        {"[1]", 400, "request body: expected a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rh_post(port, "/api/show", cases[i].body, &r);
        j = rh_json(&r);
        CHECK(r.status == cases[i].status, "show %s: status %d, want %d", cases[i].body, r.status, cases[i].status);
        if (cases[i].error)
            CHECK(rh_streq(rh_jstr(j, "error"), cases[i].error), "show %s: error %s", cases[i].body, rh_jstr(j, "error"));
        json_decref(j);
        rh_free(&r);
    }
}

static void test_chat_mapping(uint16_t port)
{
    F.script = S_THINK;
    const char *body =
        "{\"model\":\"qwen3-0.6b-Q8_0:latest\",\"stream\":false,\"think\":true,\"keep_alive\":\"5m\","
        "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\",\"images\":[]},"
        "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"need a tool\",\"tool_calls\":[{\"function\":"
        "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
        "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_name\":\"get_weather\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
        "\"options\":{\"temperature\":0.3,\"top_k\":20,\"top_p\":0.9,\"min_p\":0.1,\"seed\":42,"
        "\"num_predict\":100,\"stop\":[\"\\n\\n\",\"END\"],\"repeat_penalty\":1.2,\"presence_penalty\":0.5,"
        "\"frequency_penalty\":0.25,\"repeat_last_n\":33,\"num_ctx\":8192,\"mirostat\":0}}";
    struct rh_resp r;
    int64_t t0 = clock_ns();
    rh_post(port, "/api/chat", body, &r);
    int64_t elapsed = clock_ns() - t0;
    CHECK_EQ_INT(r.status, 200);
    CHECK(strcasestr(r.head, "Content-Type: application/json") != NULL, "whole reply is JSON: %s", r.head);
    json_t *j = rh_json(&r);
    const struct textgen_params *p = &F.last;
    CHECK(rh_streq(p->model, "qwen3-0.6b-Q8_0"), "model id without :latest: %s", p->model);
    CHECK(rh_json_same(p->messages,
                       "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                       "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"need a tool\","
                       "\"tool_calls\":[{\"id\":\"call_2_0\",\"type\":\"function\",\"function\":{\"name\":"
                       "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                       "{\"role\":\"tool\",\"content\":\"sunny\",\"name\":\"get_weather\"}]"),
          "messages in the common form");
    CHECK(rh_json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
                              "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
                              "{\"type\":\"string\"}}}}}]"),
          "tools");
    CHECK(rh_json_same(p->template_kwargs, "{\"enable_thinking\":true}"), "think -> enable_thinking");
    CHECK(p->reasoning, "reasoning text kept apart");
    CHECK_EQ_INT(p->max_tokens, 100);
    CHECK(p->n_stop == 2 && rh_streq(p->stop[0], "\n\n") && rh_streq(p->stop[1], "END"), "stop strings");
    CHECK(p->sampling.temperature == 0.3f && p->sampling.top_k == 20 && p->sampling.top_p == 0.9f &&
              p->sampling.min_p == 0.1f && p->sampling.repeat_penalty == 1.2f &&
              p->sampling.presence_penalty == 0.5f && p->sampling.frequency_penalty == 0.25f &&
              p->sampling.penalty_last_n == 33 && p->sampling.seed == 42,
          "sampling: t %g k %d p %g min_p %g rep %g pres %g freq %g last_n %d seed %llu", p->sampling.temperature,
          p->sampling.top_k, p->sampling.top_p, p->sampling.min_p, p->sampling.repeat_penalty,
          p->sampling.presence_penalty, p->sampling.frequency_penalty, p->sampling.penalty_last_n,
          (unsigned long long)p->sampling.seed);
    CHECK(p->n == 1 && p->add_generation_prompt, "n 1 with a generation prompt");

    CHECK(rh_streq(rh_jstr(j, "model"), M), "model echoed as asked: %s", rh_jstr(j, "model"));
    CHECK(is_rfc3339(rh_jstr(j, "created_at")), "created_at %s", rh_jstr(j, "created_at"));
    CHECK(rh_json_same(json_object_get(j, "message"),
                       "{\"role\":\"assistant\",\"content\":\"Answer\",\"thinking\":\"Let me think.\"}"),
          "message with thinking");
    CHECK(json_is_true(json_object_get(j, "done")) && rh_streq(rh_jstr(j, "done_reason"), "stop"), "done, stop");
    CHECK_EQ_INT(rh_jint(j, "prompt_eval_count"), 7);
    CHECK_EQ_INT(rh_jint(j, "eval_count"), 3);
    long long total = rh_jint(j, "total_duration"), load = rh_jint(j, "load_duration"),
              pe = rh_jint(j, "prompt_eval_duration"), ev = rh_jint(j, "eval_duration");
    CHECK(load >= 0 && pe >= 0 && ev > 0 && total == load + pe + ev && total <= elapsed,
          "durations: total %lld = load %lld + prompt %lld + eval %lld, within %lld", total, load, pe, ev,
          (long long)elapsed);
    json_decref(j);
    rh_free(&r);
}

static void test_chat_stream(uint16_t port)
{
    F.script = S_TEXT;
    struct rh_resp r;
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
            &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strcasestr(r.head, "Content-Type: application/x-ndjson") != NULL, "NDJSON stream: %s", r.head);
    json_t *lines = ndjson(&r);
    size_t n = json_array_size(lines);
    CHECK_EQ_INT(n, 4);
    char text[64] = "";
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *l = json_array_get(lines, i), *m = json_object_get(l, "message");
        CHECK(json_is_false(json_object_get(l, "done")) && rh_streq(rh_jstr(m, "role"), "assistant") &&
                  rh_streq(rh_jstr(l, "model"), "qwen3-0.6b-Q8_0") && is_rfc3339(rh_jstr(l, "created_at")) &&
                  !json_object_get(m, "thinking") && !json_object_get(l, "done_reason"),
              "line %zu shape", i);
        strncat(text, rh_jstr(m, "content") ? rh_jstr(m, "content") : "?", sizeof text - strlen(text) - 1);
    }
    CHECK(rh_streq(text, "Hello world"), "streamed text %s", text);
    json_t *last = json_array_get(lines, n - 1);
    CHECK(json_is_true(json_object_get(last, "done")) && rh_streq(rh_jstr(last, "done_reason"), "stop") &&
              rh_jint(last, "eval_count") == 3 && rh_jint(last, "prompt_eval_count") == 7 &&
              json_is_integer(json_object_get(last, "total_duration")) &&
              rh_json_same(json_object_get(last, "message"), "{\"role\":\"assistant\",\"content\":\"\"}"),
          "final line");
    json_decref(lines);
    rh_free(&r);

    /* Defaults: no limit, no stop strings, template defaults, a random seed each time. */
    const struct textgen_params *p = &F.last;
    uint64_t seed1 = p->sampling.seed;
    CHECK(p->max_tokens == 0 && p->n_stop == 0 && !p->template_kwargs && !p->tools, "defaults");
    CHECK(p->sampling.temperature == 0.8f && p->sampling.top_k == 40, "sampling defaults");
    rh_post(port, "/api/chat",
            "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":true,\"think\":\"low\",\"options\":{\"seed\":-1,"
            "\"num_predict\":-1},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
            &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(seed1 != p->sampling.seed && seed1 < ((uint64_t)1 << 53) && p->sampling.seed < ((uint64_t)1 << 53),
          "random seeds %llu %llu", (unsigned long long)seed1, (unsigned long long)p->sampling.seed);
    CHECK(rh_json_same(p->template_kwargs, "{\"enable_thinking\":true,\"reasoning_effort\":\"low\"}"), "think level");
    CHECK_EQ_INT(p->max_tokens, 0);
    rh_free(&r);

    /* Thinking streamed apart. */
    F.script = S_THINK;
    rh_post(port, "/api/chat",
            "{\"model\":\"qwen3-0.6b-Q8_0\",\"think\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    lines = ndjson(&r);
    CHECK(rh_json_same(p->template_kwargs, "{\"enable_thinking\":false}"), "think false");
    CHECK_EQ_INT(json_array_size(lines), 4);
    CHECK(rh_json_same(json_object_get(json_array_get(lines, 0), "message"),
                       "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Let me \"}") &&
              rh_json_same(json_object_get(json_array_get(lines, 2), "message"),
                           "{\"role\":\"assistant\",\"content\":\"Answer\"}"),
          "thinking lines then content");
    json_decref(lines);
    rh_free(&r);

    /* Length. */
    F.script = S_LENGTH;
    rh_post(port, "/api/chat",
            "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    json_t *j = rh_json(&r);
    CHECK(rh_streq(rh_jstr(j, "done_reason"), "length"), "done_reason length: %s", rh_jstr(j, "done_reason"));
    json_decref(j);
    rh_free(&r);
}

static void test_tools(uint16_t port)
{
    F.script = S_TOOL;
    struct rh_resp r;
    const char *req = "{\"model\":\"qwen3-0.6b-Q8_0\",\"stream\":false,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"Weather?\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]}";
    rh_post(port, "/api/chat", req, &r);
    json_t *j = rh_json(&r);
    CHECK_EQ_INT(r.status, 200);
    json_t *msg = json_object_get(j, "message");
    CHECK(rh_json_same(msg, "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_abc\","
                         "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]}"),
          "tool call with arguments as an object");
    CHECK(rh_streq(rh_jstr(j, "done_reason"), "stop") && rh_jint(j, "eval_count") == 12, "done_reason, eval_count");

    /* Round trip: the reply's message and a tool result go back as history. */
    json_t *back = json_loads(req, 0, NULL);
    json_t *msgs = json_object_get(back, "messages");
    json_array_append(msgs, msg);
    json_array_append_new(msgs, json_pack("{s:s,s:s,s:s}", "role", "tool", "content", "{\"temp\":21}",
                                          "tool_name", "get_weather"));
    char *text = json_dumps(back, JSON_COMPACT);
    F.script = S_TEXT;
    rh_free(&r);
    rh_post(port, "/api/chat", text, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(rh_json_same(json_array_get(F.last.messages, 1),
                       "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_abc\",\"type\":"
                       "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\","
                       "\"days\":2}}}]}") &&
              rh_json_same(json_array_get(F.last.messages, 2),
                           "{\"role\":\"tool\",\"content\":\"{\\\"temp\\\":21}\",\"name\":\"get_weather\"}"),
          "tool round trip into the common form");
    free(text);
    json_decref(back);
    json_decref(j);
    rh_free(&r);

    /* Streamed: the calls come in a line of their own before the final one. */
    F.script = S_TOOL;
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"w\"}]}",
            &r);
    json_t *lines = ndjson(&r);
    CHECK_EQ_INT(json_array_size(lines), 2);
    json_t *l0 = json_array_get(lines, 0);
    CHECK(json_is_false(json_object_get(l0, "done")) &&
              rh_json_same(json_object_get(json_object_get(l0, "message"), "tool_calls"),
                           "[{\"id\":\"call_abc\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                           "\"Paris\",\"days\":2}}}]"),
          "streamed tool calls");
    CHECK(json_is_true(json_object_get(json_array_get(lines, 1), "done")), "then done");
    json_decref(lines);
    rh_free(&r);
}

static void test_generate(uint16_t port)
{
    F.script = S_TEXT;
    struct rh_resp r;
    rh_post(port, "/api/generate",
            "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"Why?\",\"system\":\"Be brief.\",\"template\":\"ignored\","
            "\"context\":[1,2],\"options\":{\"temperature\":0}}",
            &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(rh_json_same(F.last.messages, "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                     "{\"role\":\"user\",\"content\":\"Why?\"}]") &&
              !F.last.prompt && F.last.sampling.temperature == 0.0f,
          "generate: system and prompt as messages");
    json_t *lines = ndjson(&r);
    size_t n = json_array_size(lines);
    CHECK_EQ_INT(n, 4);
    CHECK(rh_streq(rh_jstr(json_array_get(lines, 0), "response"), "Hel") &&
              !json_object_get(json_array_get(lines, 0), "message"),
          "generate lines carry response");
    json_t *last = json_array_get(lines, n - 1);
    CHECK(json_is_true(json_object_get(last, "done")) && rh_streq(rh_jstr(last, "response"), "") &&
              rh_streq(rh_jstr(last, "done_reason"), "stop"),
          "generate final line");
    json_decref(lines);
    rh_free(&r);

    rh_post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"[INST]x[/INST]\",\"raw\":true,"
                                "\"system\":\"dropped\",\"stream\":false}",
         &r);
    json_t *j = rh_json(&r);
    CHECK(rh_streq(F.last.prompt, "[INST]x[/INST]") && !F.last.messages, "raw prompt");
    CHECK(rh_streq(rh_jstr(j, "response"), "Hello world") && json_is_true(json_object_get(j, "done")), "whole response");
    json_decref(j);
    rh_free(&r);

    F.script = S_THINK;
    rh_post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"think\":true,\"stream\":false}",
            &r);
    j = rh_json(&r);
    CHECK(rh_streq(rh_jstr(j, "response"), "Answer") && rh_streq(rh_jstr(j, "thinking"), "Let me think."), "generate thinking");
    json_decref(j);
    rh_free(&r);

    /* The load calls answer at once, without a generation. */
    int submits = F.submits;
    rh_post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\"}", &r);
    j = rh_json(&r);
    CHECK(r.status == 200 && rh_streq(rh_jstr(j, "response"), "") && json_is_true(json_object_get(j, "done")) &&
              rh_streq(rh_jstr(j, "done_reason"), "load") && rh_streq(rh_jstr(j, "model"), "qwen3-0.6b-Q8_0"),
          "generate load call");
    json_decref(j);
    rh_free(&r);
    rh_post(port, "/api/chat", "{\"model\":\"mistral:7b\",\"messages\":[],\"keep_alive\":0}", &r);
    j = rh_json(&r);
    CHECK(r.status == 200 && rh_json_same(json_object_get(j, "message"), "{\"role\":\"assistant\",\"content\":\"\"}") &&
              rh_streq(rh_jstr(j, "done_reason"), "unload"),
          "chat unload call");
    json_decref(j);
    rh_free(&r);
    rh_post(port, "/api/chat", "{\"model\":\"ghost\",\"messages\":[]}", &r);
    CHECK_EQ_INT(r.status, 404);
    rh_free(&r);
    CHECK_EQ_INT(F.submits, submits);
}

static void test_errors(uint16_t port)
{
    const struct {
        const char *path, *body;
        int status;
        const char *error; /* expected prefix */
    } cases[] = {
        {"/api/chat", "[1,2]", 400, "request body: expected a JSON object"},
        {"/api/chat", "{\"messages\":[]}", 400, "model is required"},
        {"/api/chat", "{\"model\":3}", 400, "model: expected a string"},
        {"/api/chat", "{\"model\":\"ghost\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'ghost' not found"},
        {"/api/chat", "{\"model\":\"ghost:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'ghost:latest' not found"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":{}}", 400, "messages: expected an array"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[5]}", 400, "messages[0]: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
         "messages[0].role"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
         "messages[0].content: expected a string"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"iVBO\"]}]}",
         400, "messages[0].images: images are not supported"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
         "\"assistant\",\"tool_calls\":\"x\"}]}",
         400, "messages[1].tool_calls: expected an array"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
         "{\"name\":\"f\",\"arguments\":5}}]}]}",
         400, "messages[0].tool_calls[0].function.arguments: expected an object"},
        {"/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
         "{\"arguments\":{}}}]}]}",
         400, "messages[0].tool_calls[0].function.name"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":\"x\"}", 400,
         "tools: expected an array"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":[{\"type\":\"function\"}]}", 400,
         "tools[0].function: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"tools\":[{\"type\":\"web\",\"function\":{}}]}",
         400, "tools[0].type"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":5}", 400,
         "options: expected an object"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"temperature\":\"hot\"}}", 400,
         "options.temperature"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"temperature\":-1}}", 400,
         "options.temperature"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"top_p\":0}}", 400,
         "options.top_p"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"top_k\":1.5}}", 400,
         "options.top_k"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"num_predict\":0}}", 400,
         "options.num_predict"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"num_predict\":-3}}", 400,
         "options.num_predict"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"stop\":\"x\"}}", 400,
         "options.stop"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"stop\":[\"\"]}}", 400,
         "options.stop[0]"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"seed\":\"x\"}}", 400,
         "options.seed"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"options\":{\"repeat_last_n\":-2}}", 400,
         "options.repeat_last_n"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"stream\":\"yes\"}", 400, "stream"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"think\":\"maybe\"}", 400, "think"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"format\":\"yaml\"}", 400, "format"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"format\":{\"type\":\"string\",\"pattern\":\"a\"}}",
         400, "format: unsupported JSON Schema keyword 'pattern'"},
        {"/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[],\"keep_alive\":[]}", 400, "keep_alive"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":5}", 400, "prompt: expected a string"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"images\":[\"iVBO\"]}", 400,
         "images: images are not supported"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"raw\":\"yes\"}", 400, "raw"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"system\":1}", 400, "system"},
        {"/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"context\":\"abc\"}", 400, "context"},
    };
    int submits = F.submits;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rh_resp r;
        rh_post(port, cases[i].path, cases[i].body, &r);
        json_t *j = rh_json(&r);
        const char *e = rh_jstr(j, "error");
        CHECK(r.status == cases[i].status && e && strncmp(e, cases[i].error, strlen(cases[i].error)) == 0 &&
                  json_object_size(j) == 1,
              "%s %s: %d %s, want %d %s", cases[i].path, cases[i].body, r.status, r.body, cases[i].status,
              cases[i].error);
        json_decref(j);
        rh_free(&r);
    }
    CHECK_EQ_INT(F.submits, submits); /* nothing reached the backend */

    /* Bodies that are not JSON: refused by the server (declared JSON) or by the handler. */
    struct rh_resp r;
    rh_post(port, "/api/chat", "{\"model\":", &r);
    json_t *j = rh_json(&r);
    const char *e = rh_jstr(j, "error");
    CHECK(r.status == 400 && e && strncmp(e, "malformed JSON", 14) == 0 && json_object_size(j) == 1,
          "malformed JSON, refused by the server in Ollama's shape: %d %s", r.status, r.body);
    json_decref(j);
    rh_free(&r);
    rh_request(port, "POST", "/api/chat", NULL, "hello", &r);
    j = rh_json(&r);
    CHECK(r.status == 400 && rh_streq(rh_jstr(j, "error"), "request body: expected a JSON object"), "plain text body: %d %s",
          r.status, r.body);
    json_decref(j);
    rh_free(&r);

    /* The backend refuses at submit: its status and message. */
    F.refuse_status = 413;
    F.refuse_msg = "prompt is too long: 9000 tokens, the context holds 4096";
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    j = rh_json(&r);
    CHECK(r.status == 413 && rh_streq(rh_jstr(j, "error"), "prompt is too long: 9000 tokens, the context holds 4096"),
          "refused at submit: %d %s", r.status, r.body);
    F.refuse_status = 0;
    json_decref(j);
    rh_free(&r);

    /* ERROR before START: a plain error reply, streaming asked or not. */
    F.script = S_ERR_BEFORE;
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    j = rh_json(&r);
    CHECK(r.status == 503 && rh_streq(rh_jstr(j, "error"), "no instance ready") &&
              strcasestr(r.head, "Content-Type: application/json") && strcasestr(r.head, "Retry-After: 1"),
          "error before start: %d %s %s", r.status, r.head, r.body);
    json_decref(j);
    rh_free(&r);

    /* ERROR after START: an error line ends the stream; a whole reply gets the status. */
    F.script = S_ERR_AFTER;
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    json_t *lines = ndjson(&r);
    CHECK(r.status == 200 && json_array_size(lines) == 2 &&
              rh_streq(rh_jstr(json_object_get(json_array_get(lines, 0), "message"), "content"), "partial") &&
              rh_json_same(json_array_get(lines, 1), "{\"error\":\"runner failed\"}"),
          "error after start, streamed: %s", r.body);
    json_decref(lines);
    rh_free(&r);
    rh_post(port, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"stream\":false}", &r);
    j = rh_json(&r);
    CHECK(r.status == 500 && rh_json_same(j, "{\"error\":\"runner failed\"}"), "error after start, whole: %d %s",
          r.status, r.body);
    json_decref(j);
    rh_free(&r);

    F.script = S_SEQ_ERROR;
    rh_post(port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    lines = ndjson(&r);
    CHECK(json_array_size(lines) == 2 && rh_json_same(json_array_get(lines, 1), "{\"error\":\"generation failed\"}"),
          "a sequence that ends in error: %s", r.body);
    json_decref(lines);
    rh_free(&r);
}

/* Sends a request and hangs up after the first bytes of the reply (or at once when
 * wait_bytes is false, after a short pause so the handler has submitted). */
static void hang_up(uint16_t port, const char *path, const char *body, bool wait_bytes)
{
    int before = fake_gen_count(&F, &F.submits);
    int fd = rh_connect(port);
    CHECK(fd >= 0 && rh_send_request(fd, "POST", path, "application/json", body) == 0, "send");
    if (wait_bytes) {
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        CHECK(n > 0, "reply bytes before hanging up");
    } else {
        for (int i = 0; i < 2500 && fake_gen_count(&F, &F.submits) == before; i++)
            usleep(2000);
        usleep(20 * 1000);
    }
    close(fd);
}

static void test_disconnects(uint16_t port)
{
    const struct {
        int script;
        const char *path, *body;
        bool wait_bytes;
    } cases[] = {
        {S_HANG, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         true},
        {S_HANG, "/api/generate", "{\"model\":\"qwen3-0.6b-Q8_0\",\"prompt\":\"x\",\"stream\":false}", false},
        {S_HANG_EARLY, "/api/chat",
         "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        F.script = cases[i].script;
        int submits = F.submits;
        hang_up(port, cases[i].path, cases[i].body, cases[i].wait_bytes);
        CHECK_EQ_INT(F.submits, submits + 1);
        struct fake_gen_req *q = fake_gen_newest(&F);
        CHECK(fake_gen_wait_cancels(&F, q, 1, 5000), "case %zu: cancelled after the client left", i);
        usleep(50 * 1000);
        CHECK_EQ_INT(fake_gen_req_cancels(&F, q), 1);
    }
}

struct par {
    uint16_t port;
    bool ok;
    pthread_t th;
};

static void *par_main(void *arg)
{
    struct par *a = arg;
    struct rh_resp r;
    rh_post(a->port, "/api/chat", "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            &r);
    json_t *lines = ndjson(&r);
    char text[64] = "";
    for (size_t i = 0; i < json_array_size(lines); i++) {
        const char *c = rh_jstr(json_object_get(json_array_get(lines, i), "message"), "content");
        strncat(text, c ? c : "?", sizeof text - strlen(text) - 1);
    }
    a->ok = r.status == 200 && json_array_size(lines) == 4 && strcmp(text, "Hello world") == 0;
    json_decref(lines);
    rh_free(&r);
    return NULL;
}

static void test_parallel(uint16_t port)
{
    F.script = S_TEXT;
    struct par a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (struct par){.port = port};
        pthread_create(&a[i].th, NULL, par_main, &a[i]);
    }
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(a[i].th, NULL);
        ok += a[i].ok;
    }
    CHECK_EQ_INT(ok, 8);
}

/* An assistant message whose one tool call has the arguments (JSON text) {"a": v}, v
 * being levels nested arrays around items zeros; NULL when out of memory. */
static json_t *args_body(size_t levels, size_t items)
{
    char *text = malloc(16 + 2 * levels + 2 * items), *at = text;
    if (!text)
        return NULL;
    at += sprintf(at, "{\"a\":");
    for (size_t i = 0; i < levels; i++)
        *at++ = '[';
    for (size_t i = 0; i < items; i++)
        at += sprintf(at, i ? ",0" : "0");
    for (size_t i = 0; i < levels; i++)
        *at++ = ']';
    sprintf(at, "}");
    json_t *body = json_pack("{s:s,s:[{s:s,s:s,s:[{s:{s:s,s:s}}]}]}", "model", "m", "messages", "role", "assistant",
                             "content", "", "tool_calls", "function", "name", "f", "arguments", text);
    free(text);
    return body;
}

/* Found by fuzz_api: tool call arguments sent as JSON text were parsed without the
 * limits a body has, so a string could nest 2000 levels deep, or make millions of
 * values out of 16 MiB. They are held to the body's limits now. */
static void test_arguments_limits(void)
{
    static const struct {
        size_t levels, items;
        int status;
    } cases[] = {
        {HTTP_JSON_DEPTH_DEFAULT - 1, 0, 0}, /* {"a": [[...]]}: 64 levels in all */
        {HTTP_JSON_DEPTH_DEFAULT, 0, 400},
        {1000, 0, 400},
        {1, HTTP_JSON_VALUES_DEFAULT - 3, 0}, /* the object, its key, the array */
        {1, HTTP_JSON_VALUES_DEFAULT - 2, 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *body = args_body(cases[i].levels, cases[i].items);
        struct textgen_params p;
        struct ollama_request o;
        struct json_err e = {{0}, {0}};
        textgen_params_init(&p);
        int status = body ? ollama_parse_request(OLLAMA_CHAT, body, &p, &o, &e) : -1;
        CHECK(status == cases[i].status && (!status || strstr(e.message, "function.arguments: JSON text deeper")),
              "case %zu: status %d '%s'", i, status, e.message);
        textgen_params_clear(&p);
        json_decref(body);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_ERROR);
    fake_gen_init(&F);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cairn-ollama-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    snprintf(file_a, sizeof file_a, "%s/qwen3-0.6b-Q8_0.gguf", tmpdir);
    int fd = open(file_a, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    struct timespec times[2] = {{.tv_sec = 1704164645, .tv_nsec = 6}, {.tv_sec = 1704164645, .tv_nsec = 6}};
    CHECK(fd >= 0 && futimens(fd, times) == 0, "file with a known mtime");
    close(fd);
    set_models();

    char err[256] = "";
    struct http_server *srv = NULL;
    struct http_config cfg = {.port = 0};
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    CHECK(ollama_register(srv, &G, err, sizeof err) == 0, "register: %s", err);
    CHECK(ollama_register(srv, &G, err, sizeof err) != 0 && strstr(err, "/api/chat"), "twice: %s", err);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);

    RUN(test_version, port);
    RUN(test_tags_ps_show, port);
    RUN(test_chat_mapping, port);
    RUN(test_chat_stream, port);
    RUN(test_tools, port);
    RUN(test_generate, port);
    RUN(test_errors, port);
    int cancels = F.cancels;
    CHECK_EQ_INT(cancels, 0); /* no request that ran to its end was cancelled */
    RUN(test_disconnects, port);
    RUN(test_parallel, port);
    RUN(test_arguments_limits);
    CHECK_EQ_INT(F.cancels, cancels + 3);
    CHECK_EQ_INT(F.cancels_after_end, 0);

    /* The server stops with a stream open and a request inside submit: the stream's
     * generation is cancelled at once, the other one as soon as submit returns. */
    const char *chat = "{\"model\":\"qwen3-0.6b-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    F.script = S_HANG;
    int fd2 = rh_connect(port);
    CHECK(rh_send_request(fd2, "POST", "/api/chat", "application/json", chat) == 0, "send");
    char buf[256];
    CHECK(recv(fd2, buf, sizeof buf, 0) > 0, "stream open");
    struct fake_gen_req *q = fake_gen_newest(&F);
    pthread_mutex_lock(&F.mu);
    F.submit_delay_ms = 300;
    pthread_mutex_unlock(&F.mu);
    int fd3 = rh_connect(port);
    CHECK(rh_send_request(fd3, "POST", "/api/chat", "application/json", chat) == 0, "send");
    bool in_submit = false;
    for (int i = 0; i < 2500 && !in_submit; i++) {
        pthread_mutex_lock(&F.mu);
        in_submit = F.in_submit;
        pthread_mutex_unlock(&F.mu);
        if (!in_submit)
            usleep(1000);
    }
    CHECK(in_submit, "second request inside submit");
    http_server_stop(srv);
    struct fake_gen_req *q2 = fake_gen_newest(&F);
    CHECK(q2 != q, "the second request was submitted");
    CHECK(fake_gen_wait_cancels(&F, q, 1, 5000) && fake_gen_req_cancels(&F, q) == 1, "stop cancels the open stream once");
    CHECK(fake_gen_wait_cancels(&F, q2, 1, 5000) && fake_gen_req_cancels(&F, q2) == 1, "and the one that was in submit");
    close(fd2);
    close(fd3);
    http_server_release(srv);

    CHECK_EQ_INT(F.double_cancels + F.cancels_in_callback, 0);
    fake_gen_release(&F);
    unlink(file_a);
    rmdir(tmpdir);
    return test_main_end();
}
