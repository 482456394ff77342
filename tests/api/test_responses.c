/* The Responses API over a real HTTP server on 127.0.0.1 and the fake generation backend
 * (fake_gen.h): input items, instructions and tools into the common parameters, the
 * response object of each script, the streamed events (order, sequence numbers, output
 * indexes, and that they accumulate to the final response), errors after the stream
 * started, and the store: previous_response_id, GET, store false, and eviction past
 * RESPONSES_STORE_MAX. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/responses.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fake_gen.h"
#include "rawhttp.h"
#include "testutil.h"

static struct fake_gen F;
static struct gen G = {&fake_gen_ops, &F};

/* [{"event", "data"}] of an SSE body. */
static json_t *sse_events(const char *body)
{
    json_t *arr = json_array();
    const char *p = body;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        size_t blen = end ? (size_t)(end - p) : strlen(p);
        char *block = strndup(p, blen);
        const char *event = NULL, *data = NULL;
        for (char *save = NULL, *line = strtok_r(block, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, "event: ", 7))
                event = line + 7;
            else if (!strncmp(line, "data: ", 6))
                data = line + 6;
        }
        if (event || data)
            json_array_append_new(arr, json_pack("{s:s?,s:o?}", "event", event, "data",
                                                 data ? json_loads(data, 0, NULL) : NULL));
        free(block);
        p = end ? end + 2 : p + blen;
    }
    return arr;
}

static json_t *post(uint16_t port, const char *body, int *status)
{
    struct rh_resp r;
    rh_post(port, "/v1/responses", body, &r);
    *status = r.status;
    json_t *j = rh_json(&r);
    rh_free(&r);
    return j;
}

static void test_mapping(uint16_t port)
{
    fake_gen_reset(&F, S_TEXT);
    int status;
    json_t *j = post(port,
                     "{\"model\":\"q\",\"instructions\":\"Be brief.\",\"max_output_tokens\":9,\"temperature\":0.5,"
                     "\"top_p\":0.5,\"input\":[{\"role\":\"developer\",\"content\":\"dev\"},"
                     "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                     "{\"type\":\"input_text\",\"text\":\"b\"}]},"
                     "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]},"
                     "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
                     "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"},"
                     "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"},"
                     "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]}],"
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\","
                     "\"parameters\":{\"type\":\"object\"}},{\"type\":\"function\",\"name\":\"g\"}],"
                     "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}",
                     &status);
    CHECK(status == 200, "status %d", status);
    json_t *want = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                              "{\"role\":\"system\",\"content\":\"dev\"},{\"role\":\"user\",\"content\":\"a\\nb\"},"
                              "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":["
                              "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                              "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":"
                              "\"{\\\"x\\\":1}\"}}]},"
                              "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"}]",
                              0, NULL);
    pthread_mutex_lock(&F.mu);
    CHECK(want && json_equal(F.last.messages, want), "messages: %s",
          F.last.messages ? json_dumps(F.last.messages, JSON_COMPACT) : "null");
    CHECK(F.last.max_tokens == 9 && F.last.sampling.temperature == 0.5f && F.last.sampling.top_p == 0.5f &&
              F.last.n == 1,
          "sampling");
    CHECK(json_array_size(F.last.tools) == 2 &&
              rh_streq(json_string_value(json_object_get(
                           json_object_get(json_array_get(F.last.tools, 0), "function"), "description")),
                       "d"),
          "tools");
    CHECK(F.last.force_tool && !strcmp(F.last.force_tool, "g"), "forced tool");
    pthread_mutex_unlock(&F.mu);
    json_decref(want);
    CHECK(rh_streq(rh_jstr(j, "object"), "response") && rh_streq(rh_jstr(j, "status"), "completed") &&
              rh_streq(rh_jstr(j, "instructions"), "Be brief.") && rh_jint(j, "max_output_tokens") == 9,
          "response");
    json_decref(j);

    /* text.format json_schema becomes a grammar */
    fake_gen_reset(&F, S_TEXT);
    j = post(port,
             "{\"model\":\"q\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"p\","
             "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}",
             &status);
    pthread_mutex_lock(&F.mu);
    CHECK(status == 200 && F.last.grammar && strstr(F.last.grammar, "root"), "grammar");
    pthread_mutex_unlock(&F.mu);
    CHECK(rh_streq(rh_jstr(json_object_get(json_object_get(j, "text"), "format"), "type"), "json_schema"),
          "text.format echoed");
    json_decref(j);
}

/* The output of S_MIXED: reasoning, a message, two function calls. */
static void check_mixed_output(const json_t *resp, const char *what)
{
    const json_t *out = json_object_get(resp, "output");
    CHECK(json_array_size(out) == 4, "%s: %zu output items", what, json_array_size(out));
    const json_t *rs = json_array_get(out, 0), *msg = json_array_get(out, 1);
    const json_t *c1 = json_array_get(out, 2), *c2 = json_array_get(out, 3);
    CHECK(rh_streq(rh_jstr(rs, "type"), "reasoning") &&
              rh_streq(rh_jstr(json_array_get(json_object_get(rs, "content"), 0), "text"), "Plan."),
          "%s: reasoning", what);
    CHECK(rh_streq(rh_jstr(msg, "type"), "message") &&
              rh_streq(rh_jstr(json_array_get(json_object_get(msg, "content"), 0), "text"), "Calling."),
          "%s: message", what);
    CHECK(rh_streq(rh_jstr(c1, "type"), "function_call") && rh_streq(rh_jstr(c1, "call_id"), "call_1") &&
              rh_streq(rh_jstr(c1, "name"), "get_weather") &&
              rh_streq(rh_jstr(c1, "arguments"), "{\"city\":\"Paris\"}") && rh_streq(rh_jstr(c1, "status"), "completed"),
          "%s: first call", what);
    CHECK(rh_streq(rh_jstr(c2, "name"), "get_time") && !strncmp(rh_jstr(c2, "call_id") ? rh_jstr(c2, "call_id") : "",
                                                               "call_", 5),
          "%s: second call (an id made up)", what);
    const json_t *u = json_object_get(resp, "usage");
    CHECK(rh_jint(u, "input_tokens") == 7 && rh_jint(u, "output_tokens") == 20 && rh_jint(u, "total_tokens") == 27,
          "%s: usage", what);
}

static void test_replies(uint16_t port)
{
    fake_gen_reset(&F, S_MIXED);
    int status;
    json_t *whole = post(port, "{\"model\":\"q\",\"input\":\"x\"}", &status);
    CHECK(status == 200, "status %d", status);
    check_mixed_output(whole, "whole");

    fake_gen_reset(&F, S_MIXED);
    struct rh_resp r;
    rh_post(port, "/v1/responses", "{\"model\":\"q\",\"input\":\"x\",\"stream\":true}", &r);
    json_t *ev = sse_events(r.body);
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    };
    size_t n = sizeof want / sizeof *want;
    CHECK(json_array_size(ev) == n, "%zu events: %s", json_array_size(ev), r.body);
    long long seq = -1;
    const json_t *final = NULL;
    for (size_t i = 0; i < json_array_size(ev) && i < n; i++) {
        const json_t *e = json_array_get(ev, i), *d = json_object_get(e, "data");
        CHECK(rh_streq(rh_jstr(e, "event"), want[i]) && rh_streq(rh_jstr(d, "type"), want[i]), "event %zu: %s", i,
              rh_jstr(e, "event"));
        CHECK(rh_jint(d, "sequence_number") == seq + 1, "event %zu: sequence %lld", i, rh_jint(d, "sequence_number"));
        seq = rh_jint(d, "sequence_number");
        if (rh_streq(want[i], "response.output_item.done")) { /* the item at its index in the final output */
            const json_t *item = json_object_get(d, "item");
            json_t *fin = json_object_get(json_object_get(json_object_get(json_array_get(ev, n - 1), "data"),
                                                          "response"),
                                          "output");
            CHECK(json_equal((json_t *)item, json_array_get(fin, (size_t)rh_jint(d, "output_index"))),
                  "event %zu: item matches the final output's", i);
        }
        if (i == n - 1)
            final = json_object_get(d, "response");
    }
    check_mixed_output(final, "streamed");
    json_decref(ev);
    rh_free(&r);
    json_decref(whole);

    /* max_output_tokens cut: incomplete, whole and streamed */
    fake_gen_reset(&F, S_LENGTH);
    whole = post(port, "{\"model\":\"q\",\"input\":\"x\"}", &status);
    CHECK(rh_streq(rh_jstr(whole, "status"), "incomplete") &&
              rh_streq(rh_jstr(json_object_get(whole, "incomplete_details"), "reason"), "max_output_tokens"),
          "incomplete");
    json_decref(whole);
    fake_gen_reset(&F, S_LENGTH);
    rh_post(port, "/v1/responses", "{\"model\":\"q\",\"input\":\"x\",\"stream\":true}", &r);
    ev = sse_events(r.body);
    CHECK(rh_streq(rh_jstr(json_array_get(ev, json_array_size(ev) - 1), "event"), "response.incomplete"),
          "streamed incomplete: %s", r.body);
    json_decref(ev);
    rh_free(&r);

    /* an error after the stream started is an error event, last */
    fake_gen_reset(&F, S_ERR_AFTER);
    rh_post(port, "/v1/responses", "{\"model\":\"q\",\"input\":\"x\",\"stream\":true}", &r);
    ev = sse_events(r.body);
    const json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    CHECK(r.status == 200 && rh_streq(rh_jstr(last, "event"), "error") &&
              rh_jstr(json_object_get(json_object_get(last, "data"), "error"), "message"),
          "error event: %s", r.body);
    json_decref(ev);
    rh_free(&r);
    fake_gen_reset(&F, S_ERR_BEFORE);
    json_decref(post(port, "{\"model\":\"q\",\"input\":\"x\",\"stream\":true}", &status));
    CHECK(status == 503, "refused before start: %d", status);

    /* parallel_tool_calls false: the first call only */
    fake_gen_reset(&F, S_MIXED);
    whole = post(port, "{\"model\":\"q\",\"input\":\"x\",\"parallel_tool_calls\":false}", &status);
    CHECK(json_array_size(json_object_get(whole, "output")) == 3, "one call: %zu items",
          json_array_size(json_object_get(whole, "output")));
    json_decref(whole);
}

static void test_store(uint16_t port)
{
    fake_gen_reset(&F, S_TEXT);
    int status;
    json_t *a = post(port, "{\"model\":\"q\",\"input\":\"first\"}", &status);
    char body[512], path[128];
    snprintf(body, sizeof body, "{\"model\":\"q\",\"input\":\"second\",\"previous_response_id\":\"%s\"}",
             rh_jstr(a, "id"));
    json_t *b = post(port, body, &status);
    CHECK(status == 200 && rh_streq(rh_jstr(b, "previous_response_id"), rh_jstr(a, "id")), "continued");
    snprintf(body, sizeof body, "{\"model\":\"q\",\"input\":\"third\",\"previous_response_id\":\"%s\"}",
             rh_jstr(b, "id"));
    json_decref(post(port, body, &status));
    json_t *want = json_loads("[{\"role\":\"user\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":"
                              "\"Hello world\"},{\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\","
                              "\"content\":\"Hello world\"},{\"role\":\"user\",\"content\":\"third\"}]",
                              0, NULL);
    pthread_mutex_lock(&F.mu);
    CHECK(json_equal(F.last.messages, want), "chain: %s", json_dumps(F.last.messages, JSON_COMPACT));
    pthread_mutex_unlock(&F.mu);
    json_decref(want);

    struct rh_resp r;
    snprintf(path, sizeof path, "/v1/responses/%s", rh_jstr(a, "id"));
    rh_request(port, "GET", path, NULL, NULL, &r);
    json_t *got = rh_json(&r);
    CHECK(r.status == 200 && json_equal(got, a), "GET: %s", r.body);
    json_decref(got);
    rh_free(&r);
    rh_request(port, "GET", "/v1/responses/resp_none", NULL, NULL, &r);
    CHECK(r.status == 404, "GET unknown: %d", r.status);
    rh_free(&r);

    /* DELETE drops one: GET and a chain through it then fail; a second DELETE is a 404 */
    json_t *d = post(port, "{\"model\":\"q\",\"input\":\"to drop\"}", &status);
    snprintf(path, sizeof path, "/v1/responses/%s", rh_jstr(d, "id"));
    rh_request(port, "DELETE", path, NULL, NULL, &r);
    json_t *del = rh_json(&r);
    CHECK(r.status == 200 && json_is_true(json_object_get(del, "deleted")) &&
              rh_streq(rh_jstr(del, "object"), "response.deleted") && rh_streq(rh_jstr(del, "id"), rh_jstr(d, "id")),
          "DELETE: %s", r.body);
    json_decref(del);
    rh_free(&r);
    rh_request(port, "DELETE", path, NULL, NULL, &r);
    CHECK(r.status == 404, "DELETE twice: %d", r.status);
    rh_free(&r);
    rh_request(port, "GET", path, NULL, NULL, &r);
    CHECK(r.status == 404, "GET deleted: %d", r.status);
    rh_free(&r);
    snprintf(body, sizeof body, "{\"model\":\"q\",\"input\":\"x\",\"previous_response_id\":\"%s\"}", rh_jstr(d, "id"));
    json_decref(post(port, body, &status));
    CHECK(status == 400, "chain through a deleted one: %d", status);
    json_decref(d);

    json_t *c = post(port, "{\"model\":\"q\",\"input\":\"x\",\"store\":false}", &status);
    snprintf(path, sizeof path, "/v1/responses/%s", rh_jstr(c, "id"));
    rh_request(port, "GET", path, NULL, NULL, &r);
    CHECK(r.status == 404, "store false: %d", r.status);
    rh_free(&r);
    json_decref(c);

    /* Past RESPONSES_STORE_MAX the oldest go: a chain reaching one is refused. */
    for (int i = 0; i < RESPONSES_STORE_MAX; i++) {
        fake_gen_reset(&F, S_EMPTY);
        json_decref(post(port, "{\"model\":\"q\",\"input\":\"x\"}", &status));
        if (status != 200) {
            CHECK(status == 200, "fill %d: %d", i, status);
            break;
        }
    }
    snprintf(body, sizeof body, "{\"model\":\"q\",\"input\":\"x\",\"previous_response_id\":\"%s\"}", rh_jstr(a, "id"));
    json_t *e = post(port, body, &status);
    CHECK(status == 400 && strstr(rh_jstr(json_object_get(e, "error"), "message"), "previous_response_id"),
          "evicted: %d", status);
    json_decref(e);
    json_decref(a);
    json_decref(b);
}

static void test_refusals(uint16_t port)
{
    static const struct {
        const char *body, *word;
    } cases[] = {
        {"[]", "JSON object"},
        {"{\"model\":\"q\"}", "input"},
        {"{\"model\":\"q\",\"input\":[]}", "input"},
        {"{\"model\":\"q\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0]"},
        {"{\"model\":\"q\",\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"model\":\"q\",\"input\":[{\"role\":\"user\"}]}", "input[0].content"},
        {"{\"model\":\"q\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
         "input[0].call_id"},
        {"{\"model\":\"q\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0].output"},
        {"{\"model\":\"q\",\"input\":\"x\",\"tools\":[{\"type\":\"file_search\"}]}", "tools[0]"},
        {"{\"model\":\"q\",\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
        {"{\"model\":\"q\",\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"{\"model\":\"q\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type"},
        {"{\"model\":\"q\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":"
         "{\"not\":{}}}}}",
         "text.format.schema"},
        {"{\"model\":\"q\",\"input\":\"x\",\"max_output_tokens\":\"5\"}", "max_output_tokens"},
        {"{\"model\":\"q\",\"input\":\"x\",\"temperature\":3}", "temperature"},
        {"{\"model\":\"q\",\"input\":\"x\",\"previous_response_id\":\"resp_x\"}", "previous_response_id"},
        {"{\"model\":\"q\",\"input\":\"x\",\"reasoning\":[]}", "reasoning"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int status;
        json_t *j = post(port, cases[i].body, &status);
        const char *msg = rh_jstr(json_object_get(j, "error"), "message");
        CHECK(status == 400 && msg && strstr(msg, cases[i].word), "case %zu: %d %s", i, status, msg ? msg : "");
        json_decref(j);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    log_set_level(LOG_ERROR);
    fake_gen_init(&F);
    char err[256] = "";
    struct http_server *srv = NULL;
    struct responses *resp = NULL;
    struct http_config cfg = {.port = 0, .keepalive_ms = 20};
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    CHECK(responses_create(&resp, &G) == 0, "create");
    CHECK(responses_register(resp, srv, err, sizeof err) == 0, "register: %s", err);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);
    RUN(test_mapping, port);
    RUN(test_replies, port);
    RUN(test_refusals, port);
    RUN(test_store, port);
    http_server_release(srv);
    responses_release(resp);
    fake_gen_release(&F);
    return test_main_end();
}
