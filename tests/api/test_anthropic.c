/* The Anthropic Messages endpoint over a real HTTP server on 127.0.0.1 and the fake
 * generation backend (fake_gen.h): request fields into the common parameters, reply
 * shapes (whole, and streamed events that accumulate to the same message), tool use
 * both ways, thinking, stop sequences, errors, and cancellation when the client hangs up
 * or the server stops. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/anthropic.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "fake_gen.h"
#include "rawhttp.h"
#include "testutil.h"

static struct fake_gen F;
static struct gen G = {&fake_gen_ops, &F};

/* The events of an SSE body: [{"event": name, "data": parsed data}], comments skipped;
 * *comments counts the comment lines. */
static json_t *sse_events(const char *body, int *comments)
{
    json_t *arr = json_array();
    *comments = 0;
    const char *p = body;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        size_t blen = end ? (size_t)(end - p) : strlen(p);
        char *block = strndup(p, blen);
        const char *event = NULL, *data = NULL;
        for (char *save = NULL, *line = strtok_r(block, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (line[0] == ':')
                (*comments)++;
            else if (!strncmp(line, "event: ", 7))
                event = line + 7;
            else if (!strncmp(line, "data: ", 6))
                data = line + 6;
        }
        if (event || data) {
            json_t *d = data ? json_loads(data, 0, NULL) : NULL;
            json_array_append_new(arr, json_pack("{s:s?,s:o?}", "event", event, "data", d));
        }
        free(block);
        p = end ? end + 2 : p + blen;
    }
    return arr;
}

/* Rebuilds the message from stream events the way the SDKs accumulate them; NULL when
 * the events come in an order they refuse. */
static json_t *accumulate(const json_t *events)
{
    json_t *msg = NULL;
    json_t *partial = json_object(); /* block index -> accumulated input JSON text */
    size_t i;
    const json_t *e;
    bool bad = false;
    json_array_foreach(events, i, e) {
        const json_t *d = json_object_get(e, "data");
        const char *type = rh_jstr(d, "type");
        if (!rh_streq(type, rh_jstr(e, "event")))
            bad = true;
        if (rh_streq(type, "message_start")) {
            bad |= msg != NULL;
            msg = json_deep_copy(json_object_get(d, "message"));
            continue;
        }
        if (!msg || rh_streq(type, "ping"))
            continue;
        json_t *content = json_object_get(msg, "content");
        size_t idx = (size_t)rh_jint(d, "index");
        json_t *block = json_array_get(content, idx);
        const json_t *delta = json_object_get(d, "delta");
        char key[16];
        snprintf(key, sizeof key, "%zu", idx);
        if (rh_streq(type, "content_block_start")) {
            bad |= idx != json_array_size(content);
            json_array_append_new(content, json_deep_copy(json_object_get(d, "content_block")));
        } else if (rh_streq(type, "content_block_delta") && block) {
            const char *dt = rh_jstr(delta, "type");
            const char *field = rh_streq(dt, "text_delta") ? "text" : rh_streq(dt, "thinking_delta") ? "thinking" : NULL;
            if (field) {
                char *joined = NULL;
                bad |= asprintf(&joined, "%s%s", rh_jstr(block, field) ? rh_jstr(block, field) : "", rh_jstr(delta, field)) < 0;
                json_object_set_new(block, field, json_string(joined));
                free(joined);
            } else if (rh_streq(dt, "input_json_delta")) {
                char *joined = NULL;
                const char *had = rh_jstr(partial, key);
                bad |= asprintf(&joined, "%s%s", had ? had : "", rh_jstr(delta, "partial_json")) < 0;
                json_object_set_new(partial, key, json_string(joined));
                free(joined);
            } else {
                bad = true;
            }
        } else if (rh_streq(type, "content_block_stop") && block) {
            if (rh_jstr(partial, key))
                json_object_set_new(block, "input", json_loads(rh_jstr(partial, key), 0, NULL));
        } else if (rh_streq(type, "message_delta")) {
            json_object_set(msg, "stop_reason", json_object_get(delta, "stop_reason"));
            json_object_set(msg, "stop_sequence", json_object_get(delta, "stop_sequence"));
            json_object_set(json_object_get(msg, "usage"), "output_tokens",
                            json_object_get(json_object_get(d, "usage"), "output_tokens"));
        } else if (!rh_streq(type, "message_stop")) {
            bad = true;
        }
    }
    json_decref(partial);
    if (bad) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

/* The event names of a stream, space-separated. */
static void event_names(const json_t *events, char *buf, size_t cap)
{
    buf[0] = 0;
    size_t i;
    const json_t *e;
    json_array_foreach(events, i, e) {
        const char *name = rh_jstr(e, "event");
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", len ? " " : "", name ? name : "?");
    }
}

/* A copy of msg without its id, and with generated tool_use ids ("toolu_...") as
 * "toolu_*": they are random in each reply. */
static json_t *without_id(const json_t *msg)
{
    json_t *c = json_deep_copy(msg);
    json_object_del(c, "id");
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(c, "content"), i, b)
        if (rh_jstr(b, "id") && !strncmp(rh_jstr(b, "id"), "toolu_", 6))
            json_object_set_new(b, "id", json_string("toolu_*"));
    return c;
}

/* One request, streamed and whole, with the same script: the stream must accumulate to
 * the whole reply. Returns the whole reply (the caller frees it); *events gets the
 * stream's events when not NULL. */
static json_t *both_ways(uint16_t port, int script, const char *body_fmt, json_t **events)
{
    char body[4096];
    struct rh_resp r;
    F.script = script;
    snprintf(body, sizeof body, body_fmt, "false");
    rh_post(port, "/v1/messages", body, &r);
    CHECK(r.status == 200 && strcasestr(r.head, "Content-Type: application/json"), "whole reply: %d %s", r.status,
          r.body);
    json_t *whole = rh_json(&r);
    rh_free(&r);
    snprintf(body, sizeof body, body_fmt, "true");
    rh_post(port, "/v1/messages", body, &r);
    CHECK(r.status == 200 && strcasestr(r.head, "Content-Type: text/event-stream"), "stream: %d %s", r.status,
          r.head);
    int comments;
    json_t *ev = sse_events(r.body, &comments);
    json_t *acc = accumulate(ev);
    json_t *a = acc ? without_id(acc) : NULL, *w = whole ? without_id(whole) : NULL;
    bool same = a && w && json_equal(a, w);
    char *as = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *ws = w ? json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(same, "stream accumulates to the whole reply:\n  stream %s\n  whole  %s", as ? as : "(bad order)",
          ws ? ws : "(null)");
    const char *id = rh_jstr(acc, "id");
    CHECK(id && !strncmp(id, "msg_", 4) && strlen(id) == 28 && !rh_streq(id, rh_jstr(whole, "id")), "message ids %s %s",
          id, rh_jstr(whole, "id"));
    free(as);
    free(ws);
    json_decref(a);
    json_decref(w);
    json_decref(acc);
    rh_free(&r);
    if (events)
        *events = ev;
    else
        json_decref(ev);
    return whole;
}

static const char *BASIC = "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,"
                           "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

static void test_mapping(uint16_t port)
{
    F.script = S_TEXT;
    const char *body =
        "{\"model\":\"qwen3\",\"max_tokens\":256,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":10,"
        "\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],\"metadata\":{\"user_id\":\"u1\"},"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\",\"cache_control\":{\"type\":\"ephemeral\"}},"
        "{\"type\":\"text\",\"text\":\"Use tools.\"}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather\",\"input_schema\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"}}}},{\"name\":\"get_time\",\"input_schema\":{\"type\":"
        "\"object\"},\"type\":\"custom\"}],\"tool_choice\":{\"type\":\"auto\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"need the tool\",\"signature\":\"s\"},"
        "{\"type\":\"redacted_thinking\",\"data\":\"x\"},{\"type\":\"text\",\"text\":\"Checking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"is_error\":true,\"content\":[{\"type\":\"text\","
        "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},{\"type\":\"text\",\"text\":\"Thanks.\"},"
        "{\"type\":\"text\",\"text\":\"And tomorrow?\"}]}]}";
    struct rh_resp r;
    rh_post(port, "/v1/messages", body, &r);
    CHECK_EQ_INT(r.status, 200);
    const struct textgen_params *p = &F.last;
    CHECK(rh_streq(p->model, "qwen3"), "model %s", p->model);
    CHECK(rh_json_same(p->messages,
                       "[{\"role\":\"system\",\"content\":\"Be brief.\\nUse tools.\"},"
                       "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                       "{\"role\":\"assistant\",\"content\":\"Checking.\",\"reasoning_content\":\"need the tool\","
                       "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                       "\"arguments\":{\"city\":\"Paris\"}}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"toolu_2\",\"content\":\"a\\nb\"},"
                       "{\"role\":\"user\",\"content\":\"Thanks.\\nAnd tomorrow?\"}]"),
          "messages in the common form");
    CHECK(rh_json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
                              "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                              "\"string\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\","
                              "\"parameters\":{\"type\":\"object\"}}}]"),
          "tools as functions");
    CHECK(rh_json_same(p->template_kwargs, "{\"enable_thinking\":true}"), "thinking enabled");
    CHECK_EQ_INT(p->max_tokens, 256);
    CHECK(p->n_stop == 2 && rh_streq(p->stop[0], "END") && rh_streq(p->stop[1], "\n\nHuman:"), "stop sequences");
    CHECK(p->sampling.temperature == 0.5f && p->sampling.top_p == 0.9f && p->sampling.top_k == 10 && p->n == 1,
          "sampling t %g p %g k %d", p->sampling.temperature, p->sampling.top_p, p->sampling.top_k);
    uint64_t seed = p->sampling.seed;
    json_t *j = rh_json(&r);
    CHECK(rh_json_same(json_object_get(j, "content"), "[{\"type\":\"text\",\"text\":\"Hello world\"}]"), "content");
    CHECK(rh_streq(rh_jstr(j, "type"), "message") && rh_streq(rh_jstr(j, "role"), "assistant") && rh_streq(rh_jstr(j, "model"), "qwen3") &&
              rh_streq(rh_jstr(j, "stop_reason"), "end_turn") && json_is_null(json_object_get(j, "stop_sequence")),
          "message fields");
    CHECK(rh_json_same(json_object_get(j, "usage"), "{\"input_tokens\":5,\"output_tokens\":3,"
                                                 "\"cache_read_input_tokens\":2,\"cache_creation_input_tokens\":0}"),
          "usage: uncached input, output, cache reads");
    json_decref(j);
    rh_free(&r);

    /* Defaults: no stops, no tools, no kwargs, a fresh random seed. */
    rh_post(port, "/v1/messages",
            "{\"model\":\"qwen3\",\"max_tokens\":99999999999,\"thinking\":{\"type\":\"disabled\"},"
            "\"tool_choice\":{\"type\":\"none\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
            "\"system\":\"sys\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
            &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(p->n_stop == 0 && !p->tools && rh_json_same(p->template_kwargs, "{\"enable_thinking\":false}") &&
              p->max_tokens == RUNNER_MAX_GENERATE && p->sampling.seed != seed && p->sampling.seed < ((uint64_t)1 << 53),
          "tool_choice none, thinking disabled, max_tokens capped, random seed");
    CHECK(rh_json_same(p->messages, "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"\"}]"),
          "string system, empty user content");
    rh_free(&r);

    rh_post(port, "/v1/messages",
            "{\"model\":\"qwen3\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\"},"
            "\"tools\":[{\"name\":\"a\",\"input_schema\":{}},{\"name\":\"b\",\"input_schema\":{\"type\":\"object\"}}],"
            "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            &r);
    CHECK(r.status == 200 && rh_json_same(p->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":"
                                                 "{\"type\":\"object\"}}}]"),
          "tool_choice tool keeps the named tool");
    rh_free(&r);
}

static void test_streams(uint16_t port)
{
    json_t *events = NULL;
    char names[1024];
    json_t *w = both_ways(port, S_TEXT, BASIC, &events);
    event_names(events, names, sizeof names);
    CHECK(rh_streq(names, "message_start ping content_block_start content_block_delta content_block_delta "
                       "content_block_delta content_block_stop message_delta message_stop"),
          "text stream events: %s", names);
    const json_t *start = json_object_get(json_array_get(events, 0), "data");
    const char *start_id = rh_jstr(json_object_get(start, "message"), "id");
    char want_start[512];
    snprintf(want_start, sizeof want_start,
             "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
             "\"model\":\"qwen3\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
             "\"input_tokens\":5,\"output_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2}}}",
             start_id ? start_id : "");
    CHECK(rh_json_same(start, want_start), "message_start");
    CHECK(rh_json_same(json_object_get(json_array_get(events, 3), "data"),
                       "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}"),
          "text delta");
    CHECK(rh_json_same(json_object_get(json_array_get(events, 7), "data"),
                       "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},"
                       "\"usage\":{\"input_tokens\":5,\"output_tokens\":3,\"cache_creation_input_tokens\":0,"
                       "\"cache_read_input_tokens\":2}}"),
          "message_delta");
    json_decref(events);
    json_decref(w);

    /* Thinking, text and two tool calls in one reply. */
    w = both_ways(port, S_MIXED, BASIC, &events);
    event_names(events, names, sizeof names);
    CHECK(rh_streq(names, "message_start ping content_block_start content_block_delta content_block_stop "
                       "content_block_start content_block_delta content_block_stop content_block_start "
                       "content_block_delta content_block_stop content_block_start content_block_delta "
                       "content_block_stop message_delta message_stop"),
          "mixed stream events: %s", names);
    json_t *content = json_object_get(w, "content");
    const char *id2 = rh_jstr(json_array_get(content, 3), "id");
    CHECK(id2 && !strncmp(id2, "toolu_", 6) && strlen(id2) == 30, "a generated tool_use id: %s", id2 ? id2 : "(null)");
    char want[1024];
    snprintf(want, sizeof want,
             "[{\"type\":\"thinking\",\"thinking\":\"Plan.\",\"signature\":\"\"},{\"type\":\"text\",\"text\":"
             "\"Calling.\"},{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"get_weather\",\"input\":{\"city\":"
             "\"Paris\"}},{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":\"get_time\",\"input\":{}}]",
             id2 ? id2 : "");
    CHECK(rh_json_same(content, want), "thinking, text, tool_use blocks");
    CHECK(rh_streq(rh_jstr(w, "stop_reason"), "tool_use") && rh_jint(json_object_get(w, "usage"), "output_tokens") == 20,
          "stop_reason tool_use");
    CHECK(rh_json_same(json_object_get(json_array_get(events, 8), "data"),
                       "{\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":"
                       "\"call_1\",\"name\":\"get_weather\",\"input\":{}}}") &&
              rh_json_same(json_object_get(json_array_get(events, 9), "data"),
                           "{\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\","
                           "\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}") &&
              rh_json_same(json_object_get(json_array_get(events, 2), "data"),
                           "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\","
                           "\"thinking\":\"\",\"signature\":\"\"}}") &&
              rh_json_same(json_object_get(json_array_get(events, 3), "data"),
                           "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\","
                           "\"thinking\":\"Plan.\"}}"),
          "tool_use and thinking events");
    json_decref(events);
    json_decref(w);

    w = both_ways(port, S_EMPTY, BASIC, NULL);
    CHECK(rh_json_same(json_object_get(w, "content"), "[{\"type\":\"text\",\"text\":\"\"}]"), "empty reply: one text block");
    json_decref(w);
    w = both_ways(port, S_THINK, BASIC, NULL);
    CHECK(rh_json_same(json_object_get(w, "content"), "[{\"type\":\"thinking\",\"thinking\":\"Let me think.\","
                                                   "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Answer\"}]"),
          "thinking then text");
    json_decref(w);
    w = both_ways(port, S_LENGTH, BASIC, NULL);
    CHECK(rh_streq(rh_jstr(w, "stop_reason"), "max_tokens"), "length -> max_tokens");
    json_decref(w);
    w = both_ways(port, S_STOPSEQ,
                  "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,\"stop_sequences\":[\"STOP\",\"END\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  NULL);
    CHECK(rh_streq(rh_jstr(w, "stop_reason"), "stop_sequence") && rh_streq(rh_jstr(w, "stop_sequence"), "END"),
          "the client's stop sequence: %s %s", rh_jstr(w, "stop_reason"), rh_jstr(w, "stop_sequence"));
    json_decref(w);
    w = both_ways(port, S_MODELSTOP,
                  "{\"model\":\"qwen3\",\"max_tokens\":64,\"stream\":%s,\"stop_sequences\":[\"END\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  NULL);
    CHECK(rh_streq(rh_jstr(w, "stop_reason"), "end_turn") && json_is_null(json_object_get(w, "stop_sequence")),
          "the model's own stop is end_turn");
    json_decref(w);

    /* Tool round trip: the reply's content goes back as the assistant turn. */
    w = both_ways(port, S_TOOL, BASIC, NULL);
    json_t *req = json_loads("{\"model\":\"qwen3\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":"
                             "\"w\"}]}",
                             0, NULL);
    json_t *msgs = json_object_get(req, "messages");
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", json_object_get(w, "content")));
    json_array_append_new(msgs, json_loads("{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
                                           "\"call_abc\",\"content\":\"21C\"}]}",
                                           0, NULL));
    char *text = json_dumps(req, JSON_COMPACT);
    struct rh_resp r;
    F.script = S_TEXT;
    rh_post(port, "/v1/messages", text, &r);
    CHECK(r.status == 200 && rh_json_same(F.last.messages,
                                          "[{\"role\":\"user\",\"content\":\"w\"},{\"role\":\"assistant\",\"content\":\"\","
                                          "\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":"
                                          "\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]},{\"role\":"
                                          "\"tool\",\"tool_call_id\":\"call_abc\",\"content\":\"21C\"}]"),
          "tool round trip");
    rh_free(&r);
    free(text);
    json_decref(req);
    json_decref(w);
}

static bool error_shape(const json_t *j, const char *type, const char *prefix)
{
    const json_t *e = json_object_get(j, "error");
    const char *msg = rh_jstr(e, "message");
    return json_object_size(j) == 2 && rh_streq(rh_jstr(j, "type"), "error") && json_object_size(e) == 2 &&
           rh_streq(rh_jstr(e, "type"), type) && msg && strncmp(msg, prefix, strlen(prefix)) == 0;
}

static void test_errors(uint16_t port)
{
    const struct {
        const char *body;
        int status;
        const char *error; /* expected message prefix */
    } cases[] = {
        {"[1]", 400, "request body: expected a JSON object"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "model: field required"},
        {"{\"model\":7,\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "model: expected"},
        {"{\"model\":\"q\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens: field required"},
        {"{\"model\":\"q\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "max_tokens: expected an integer >= 1"},
        {"{\"model\":\"q\",\"max_tokens\":-5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":\"100\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":5}", 400, "messages: field required"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[]}", 400, "messages: expected a non-empty array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":{}}", 400, "messages: expected a non-empty array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[3]}", 400, "messages[0]: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400,
         "messages[0].role"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
         "messages[0].content: expected a string or an array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400,
         "messages[0].content[0].type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
         "\"source\":{}}]}]}",
         400, "messages[0].content[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"document\"}]}]}",
         400, "messages[0].content[0]: document content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
         400, "messages[0].content[0].text"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
         400, "messages[0].content[0].tool_use_id"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\"}]}]}]}",
         400, "messages[0].content[0].content[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\",\"is_error\":\"no\"}]}]}",
         400, "messages[0].content[0].is_error"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"f\",\"input\":{}}]}]}",
         400, "messages[0].content[0].type: tool_use blocks belong to assistant messages"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"f\",\"input\":\"x\"}]}]}",
         400, "messages[0].content[0].input: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"name\":\"f\",\"input\":{}}]}]}",
         400, "messages[0].content[0].id"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\"}]}]}",
         400, "messages[0].content[0].type: tool_result blocks belong to user messages"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}", 400,
         "messages[0].content[0].type: unsupported content block type 'video'"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "system: expected a string or an array of text blocks"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "system[0]: image content is not supported"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "temperature: expected a number in [0, 1]"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"temperature\":\"hot\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "temperature"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"top_p\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "top_p"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"top_k\":-1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "top_k"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":[\"\"],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences[0]"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
         "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stop_sequences: expected an array of at most 16"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "tools: expected an array"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"name\":\"f\"}],\"messages\":[{\"role\":\"user\",\"content\":"
         "\"x\"}]}",
         400, "tools[0].input_schema"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"input_schema\":{}}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "tools[0].name"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tools[0].type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tool_choice: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"maybe\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "tool_choice.type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"},\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "tool_choice.name: no tool named 'nope'"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":\"on\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "thinking: expected an object"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":{\"type\":\"sometimes\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         400, "thinking.type"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":0},\"messages\":"
         "[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "thinking.budget_tokens"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"stream\":\"yes\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "stream"},
        {"{\"model\":\"q\",\"max_tokens\":5,\"metadata\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "metadata"},
        {"{\"model\":\"no such model!\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
         "model 'no such model!' not found"},
    };
    int submits = F.submits;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rh_resp r;
        rh_post(port, "/v1/messages", cases[i].body, &r);
        json_t *j = rh_json(&r);
        const char *type = cases[i].status == 404 ? "not_found_error" : "invalid_request_error";
        CHECK(r.status == cases[i].status && error_shape(j, type, cases[i].error), "%s: %d %s, want %d %s",
              cases[i].body, r.status, r.body, cases[i].status, cases[i].error);
        json_decref(j);
        rh_free(&r);
    }
    CHECK_EQ_INT(F.submits, submits); /* nothing reached the backend */

    /* Refusals by the backend at submit, as Anthropic words them. */
    const struct {
        int backend;
        const char *msg;
        int status;
        const char *type, *error;
    } refusals[] = {
        {404, "model 'qwen9' not found", 404, "not_found_error", "model 'qwen9' not found"},
        {413, "prompt is too long: 9000 tokens > 4096", 400, "invalid_request_error", "prompt is too long: 9000 tokens"},
        {413, "9000 tokens > 4096", 400, "invalid_request_error", "prompt is too long: 9000 tokens > 4096"},
        {503, "busy", 529, "overloaded_error", "busy"},
        {500, "boom", 500, "api_error", "boom"},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        struct rh_resp r;
        F.refuse_status = refusals[i].backend;
        F.refuse_msg = refusals[i].msg;
        rh_post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                                   "\"content\":\"x\"}]}",
             &r);
        json_t *j = rh_json(&r);
        CHECK(r.status == refusals[i].status && error_shape(j, refusals[i].type, refusals[i].error) &&
                  (refusals[i].status != 529 || strcasestr(r.head, "Retry-After: 1")),
              "refusal %d: %d %s", refusals[i].backend, r.status, r.body);
        json_decref(j);
        rh_free(&r);
    }
    F.refuse_status = 0;

    /* ERROR before START: a plain error reply; after START: an error event ends the
     * stream, and a whole reply gets the status. */
    struct rh_resp r;
    F.script = S_ERR_BEFORE;
    rh_post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}]}",
         &r);
    json_t *j = rh_json(&r);
    CHECK(r.status == 529 && error_shape(j, "overloaded_error", "no instance ready") &&
              strcasestr(r.head, "Content-Type: application/json"),
          "error before start: %d %s", r.status, r.body);
    json_decref(j);
    rh_free(&r);
    F.script = S_ERR_AFTER;
    rh_post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}]}",
         &r);
    int comments;
    json_t *events = sse_events(r.body, &comments);
    char names[512];
    event_names(events, names, sizeof names);
    CHECK(r.status == 200 && rh_streq(names, "message_start ping content_block_start content_block_delta error") &&
              error_shape(json_object_get(json_array_get(events, 4), "data"), "api_error", "runner failed"),
          "error after start, streamed: %s", names);
    json_decref(events);
    rh_free(&r);
    rh_post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            &r);
    j = rh_json(&r);
    CHECK(r.status == 500 && error_shape(j, "api_error", "runner failed"), "error after start, whole: %d %s", r.status,
          r.body);
    json_decref(j);
    rh_free(&r);
    F.script = S_SEQ_ERROR;
    rh_post(port, "/v1/messages", "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            &r);
    j = rh_json(&r);
    CHECK(r.status == 500 && error_shape(j, "api_error", "generation failed"), "a sequence that failed: %d %s",
          r.status, r.body);
    json_decref(j);
    rh_free(&r);

    /* Bodies that are not JSON. */
    rh_request(port, "POST", "/v1/messages", NULL, "hello", &r);
    j = rh_json(&r);
    CHECK(r.status == 400 && error_shape(j, "invalid_request_error", "request body"), "text body: %d %s", r.status,
          r.body);
    json_decref(j);
    rh_free(&r);
    rh_post(port, "/v1/messages", "{\"model\":", &r);
    j = rh_json(&r);
    CHECK(r.status == 400 && error_shape(j, "invalid_request_error", "malformed JSON"),
          "malformed JSON, refused by the server in Anthropic's shape: %d %s", r.status, r.body);
    json_decref(j);
    rh_free(&r);
}

static void test_disconnects(uint16_t port)
{
    const struct {
        int script;
        const char *body;
        bool wait_bytes;
    } cases[] = {
        {S_HANG, "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         true},
        {S_HANG, "{\"model\":\"q\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
        {S_HANG_EARLY,
         "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        F.script = cases[i].script;
        int before = fake_gen_count(&F, &F.submits);
        int fd = rh_connect(port);
        CHECK(fd >= 0 && rh_send_request(fd, "POST", "/v1/messages", "application/json", cases[i].body) == 0, "send");
        if (cases[i].wait_bytes) {
            char buf[512];
            CHECK(recv(fd, buf, sizeof buf, 0) > 0, "reply bytes before hanging up");
        } else {
            for (int k = 0; k < 2500 && fake_gen_count(&F, &F.submits) == before; k++)
                usleep(2000);
            usleep(20 * 1000);
        }
        close(fd);
        CHECK_EQ_INT(fake_gen_count(&F, &F.submits), before + 1);
        struct fake_gen_req *q = fake_gen_newest(&F);
        CHECK(fake_gen_wait_cancels(&F, q, 1, 5000), "case %zu: cancelled after the client left", i);
        usleep(50 * 1000);
        CHECK_EQ_INT(fake_gen_req_cancels(&F, q), 1);
    }
}

/* A body of n user messages, with a system prompt when system, and one more user
 * message of tool_results results; NULL when out of memory. */
static json_t *many_messages(int n, bool system, int results)
{
    json_t *msgs = json_array(), *blocks = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "hi"));
    for (int i = 0; i < results; i++)
        json_array_append_new(blocks, json_pack("{s:s,s:s,s:s}", "type", "tool_result", "tool_use_id", "t1",
                                                "content", "ok"));
    if (results)
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", blocks));
    json_decref(blocks);
    json_t *body = json_pack("{s:s,s:i,s:o}", "model", "qwen3", "max_tokens", 8, "messages", msgs);
    if (body && system)
        json_object_set_new(body, "system", json_string("be brief"));
    return body;
}

/* The runner takes at most TEXTGEN_MAX_MESSAGES messages, and the system prompt and each
 * tool_result are messages of their own there: 4096 messages and a system prompt were
 * accepted here and refused by the runner. They are a 400 here now. */
static void test_message_count(void)
{
    static const struct {
        int n;
        bool system;
        int results, status;
    } cases[] = {
        {TEXTGEN_MAX_MESSAGES, false, 0, 0},
        {TEXTGEN_MAX_MESSAGES - 1, true, 0, 0},
        {TEXTGEN_MAX_MESSAGES, true, 0, 400},
        {1, false, TEXTGEN_MAX_MESSAGES - 1, 0},
        {1, false, TEXTGEN_MAX_MESSAGES, 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *body = many_messages(cases[i].n, cases[i].system, cases[i].results);
        struct textgen_params p;
        struct json_err e = {{0}, {0}};
        bool stream;
        textgen_params_init(&p);
        int status = body ? anthropic_parse_request(body, &p, &stream, &e) : -1;
        CHECK(status == cases[i].status && (status || json_array_size(p.messages) <= TEXTGEN_MAX_MESSAGES) &&
                  (!status || !strncmp(e.message, "messages: ", 10)),
              "case %zu: status %d, %zu messages, '%s'", i, status, json_array_size(p.messages), e.message);
        textgen_params_clear(&p);
        json_decref(body);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_ERROR);
    fake_gen_init(&F);

    char err[256] = "";
    struct http_server *srv = NULL;
    struct http_config cfg = {.port = 0, .keepalive_ms = 20};
    CHECK(http_server_create(&srv, &cfg, err, sizeof err) == 0, "server: %s", err);
    CHECK(anthropic_register(srv, &G, err, sizeof err) == 0, "register: %s", err);
    CHECK(anthropic_register(srv, &G, err, sizeof err) != 0 && strstr(err, "/v1/messages"), "twice: %s", err);
    CHECK(http_server_start(srv, err, sizeof err) == 0, "start: %s", err);
    uint16_t port = http_server_port(srv);

    RUN(test_mapping, port);
    RUN(test_streams, port);
    RUN(test_errors, port);
    CHECK_EQ_INT(F.cancels, 0); /* no request that ran to its end was cancelled */
    RUN(test_disconnects, port);
    RUN(test_message_count);
    CHECK_EQ_INT(F.cancels, 3);
    CHECK_EQ_INT(F.cancels_after_end, 0);

    /* Idle streams get comments, which clients ignore. */
    F.script = S_HANG;
    int fd = rh_connect(port);
    CHECK(rh_send_request(fd, "POST", "/v1/messages", "application/json",
                          "{\"model\":\"q\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
                          "\"content\":\"x\"}]}") == 0,
          "send");
    char buf[8192];
    size_t got = 0;
    int64_t until = clock_ns() + 3 * (int64_t)1000000000;
    while (got < sizeof buf - 1 && clock_ns() < until) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, MSG_DONTWAIT);
        if (n > 0)
            got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf, "\n: ping\n"))
            break;
        usleep(5000);
    }
    CHECK(strstr(buf, "event: message_start") && strstr(buf, "\n: ping\n"), "keepalive comments: %s", buf);

    /* The server stops with that stream open: cancelled once. */
    struct fake_gen_req *q = fake_gen_newest(&F);
    http_server_stop(srv);
    CHECK(fake_gen_wait_cancels(&F, q, 1, 5000) && fake_gen_req_cancels(&F, q) == 1, "stop cancels the open stream once");
    close(fd);
    http_server_release(srv);

    CHECK_EQ_INT(F.double_cancels + F.cancels_in_callback, 0);
    fake_gen_release(&F);
    return test_main_end();
}
