/* Anthropic Messages endpoint (anthropic.h): content blocks checked into
 * textgen_params, events turned into SSE events or one message. A request's life
 * (submit, cancel on hang-up, the one free) is apireq's; its struct areq is the reply's
 * state. */
#include "api/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/apireq.h"
#include "api/apiutil.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "proto/ids.h"

#define NAME_SHOWN 300 /* bytes of a client's model name quoted in an error */

/* ---------- small helpers ---------- */

static bool absent(const json_t *v) { return !v || json_is_null(v); }

/* ---------- errors ---------- */

static const char *error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 529:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

/* {"type": "error", "error": {"type", "message"}} for an Anthropic status. */
static json_t *error_json(int status, const char *msg, const char *param)
{
    (void)param;
    json_t *e = json_pack("{s:s}", "type", error_type(status));
    if (!e || !apiutil_put(e, "message", apiutil_text_json(msg))) {
        json_decref(e);
        return NULL;
    }
    return json_pack("{s:s,s:o}", "type", "error", "error", e);
}

/* The status an Anthropic client gets for a backend's (and the message in out): a
 * prompt too long is a 400 saying so, as Anthropic words it; busy is 529. */
static int anthropic_status(int status, const char *msg, char *out, size_t cap)
{
    if (status == 413) {
        bool worded = strncmp(msg, "prompt is too long", 18) == 0;
        snprintf(out, cap, "%s%s", worded ? "" : "prompt is too long: ", msg);
        return 400;
    }
    snprintf(out, cap, "%s", msg);
    if (status == 503)
        return 529;
    return status >= 400 && status <= 599 ? status : 500;
}

static void reply_error(struct http_request *req, int status, const char *msg)
{
    apiutil_reply_error(req, error_json, status, msg, NULL);
}

/* ---------- checked request members ---------- */

/* ---------- messages ---------- */

/* Text blocks ([{"type": "text", "text"}]) or a string, joined with "\n" into out. */
static int text_blocks(const json_t *c, const char *path, struct strbuf *out, struct json_err *e)
{
    if (absent(c))
        return 0;
    if (json_is_string(c))
        return strbuf_put(out, json_string_value(c), json_string_length(c)) ? CAIRN_ENOMEM : 0;
    if (!json_is_array(c))
        return json_fail(e, NULL, "%s: expected a string or an array of text blocks", path);
    size_t j;
    const json_t *b;
    json_array_foreach(c, j, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        const json_t *text = json_object_get(b, "text");
        if (!type)
            return json_fail(e, NULL, "%s[%zu].type: expected a string", path, j);
        if (!strcmp(type, "image") || !strcmp(type, "document"))
            return json_fail(e, NULL, "%s[%zu]: %s content is not supported (text models only)",
                             path, j, type);
        if (strcmp(type, "text") != 0)
            return json_fail(e, NULL, "%s[%zu].type: expected \"text\"", path, j);
        if (!json_is_string(text))
            return json_fail(e, NULL, "%s[%zu].text: expected a string", path, j);
        if ((j > 0 && strbuf_put(out, "\n", 1)) || strbuf_put(out, json_string_value(text), json_string_length(text)))
            return CAIRN_ENOMEM;
    }
    return 0;
}

static int append_msg(json_t *out, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s,s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(out, m) != 0)
        return CAIRN_ENOMEM;
    return 0;
}

/* Refuses a block that no message may hold here; 0 for the types the caller handles. */
static int other_block(const char *type, const char *path, struct json_err *e)
{
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return json_fail(e, NULL, "%s: %s content is not supported (text models only)", path,
                         type);
    return json_fail(e, NULL, "%s.type: unsupported content block type '%.64s'", path, type);
}

/* A user message's blocks: text joined into a user message, each tool_result a "tool"
 * message, in their order. */
static int user_blocks(const json_t *blocks, const char *path, json_t *out, struct json_err *e)
{
    struct strbuf text = {0};
    bool have_text = false, emitted = false;
    int rc = 0;
    size_t j;
    const json_t *b;
    json_array_foreach(blocks, j, b) {
        char bp[128];
        snprintf(bp, sizeof bp, "%s[%zu]", path, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            rc = json_fail(e, NULL, "%s.type: expected a string", bp);
            break;
        }
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                rc = json_fail(e, NULL, "%s.text: expected a string", bp);
                break;
            }
            if ((have_text && strbuf_put(&text, "\n", 1)) || strbuf_put(&text, json_string_value(t), json_string_length(t))) {
                rc = CAIRN_ENOMEM;
                break;
            }
            have_text = true;
        } else if (!strcmp(type, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id"), *is_err = json_object_get(b, "is_error");
            if (!json_is_string(id) || json_string_length(id) == 0) {
                rc = json_fail(e, NULL, "%s.tool_use_id: expected a string", bp);
                break;
            }
            if (!absent(is_err) && !json_is_boolean(is_err)) {
                rc = json_fail(e, NULL, "%s.is_error: expected true or false", bp);
                break;
            }
            if (have_text) { /* text before a result stays before it */
                if ((rc = append_msg(out, "user", apiutil_text(&text))))
                    break;
                strbuf_free(&text);
                have_text = false;
            }
            struct strbuf result = {0};
            char cp[144];
            snprintf(cp, sizeof cp, "%s.content", bp);
            rc = text_blocks(json_object_get(b, "content"), cp, &result, e);
            json_t *m = rc ? NULL
                           : json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id", (json_t *)id, "content",
                                       apiutil_text(&result));
            strbuf_free(&result);
            if (!rc && (!m || json_array_append_new(out, m) != 0))
                rc = CAIRN_ENOMEM;
            if (rc)
                break;
            emitted = true;
        } else if (!strcmp(type, "tool_use") || !strcmp(type, "thinking")) {
            rc = json_fail(e, NULL, "%s.type: %s blocks belong to assistant messages", bp, type);
            break;
        } else {
            rc = other_block(type, bp, e);
            break;
        }
    }
    if (!rc && (have_text || !emitted))
        rc = append_msg(out, "user", apiutil_text(&text));
    strbuf_free(&text);
    return rc;
}

/* An assistant message's blocks: text, thinking as reasoning_content, tool_use as
 * tool_calls with the input as the arguments object. */
static int assistant_blocks(const json_t *blocks, const char *path, json_t *out, struct json_err *e)
{
    struct strbuf text = {0}, thinking = {0};
    json_t *calls = json_array(), *m = NULL;
    int rc = calls ? 0 : CAIRN_ENOMEM;
    size_t j;
    const json_t *b;
    json_array_foreach(blocks, j, b) {
        if (rc)
            break;
        char bp[128];
        snprintf(bp, sizeof bp, "%s[%zu]", path, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            rc = json_fail(e, NULL, "%s.type: expected a string", bp);
        } else if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            bool is_text = !strcmp(type, "text");
            const json_t *t = json_object_get(b, type);
            struct strbuf *dst = is_text ? &text : &thinking;
            if (!json_is_string(t))
                rc = json_fail(e, NULL, "%s.%s: expected a string", bp, type);
            else if ((dst->len && strbuf_put(dst, "\n", 1)) || strbuf_put(dst, json_string_value(t), json_string_length(t)))
                rc = CAIRN_ENOMEM;
        } else if (!strcmp(type, "redacted_thinking")) {
            continue; /* opaque: nothing a local model can read */
        } else if (!strcmp(type, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
                         *input = json_object_get(b, "input");
            json_t *call = NULL;
            if (!json_is_string(id) || json_string_length(id) == 0)
                rc = json_fail(e, NULL, "%s.id: expected a string", bp);
            else if (!json_is_string(name) || json_string_length(name) == 0)
                rc = json_fail(e, NULL, "%s.name: expected a string", bp);
            else if (!absent(input) && !json_is_object(input))
                rc = json_fail(e, NULL, "%s.input: expected an object", bp);
            else if (!(call = json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", (json_t *)id, "type", "function", "function",
                                        "name", (json_t *)name, "arguments",
                                        absent(input) ? json_object() : json_deep_copy(input))) ||
                     json_array_append_new(calls, call) != 0)
                rc = CAIRN_ENOMEM;
        } else if (!strcmp(type, "tool_result")) {
            rc = json_fail(e, NULL, "%s.type: tool_result blocks belong to user messages", bp);
        } else {
            rc = other_block(type, bp, e);
        }
    }
    if (!rc) {
        m = json_pack("{s:s,s:s}", "role", "assistant", "content", apiutil_text(&text));
        if (!m || json_array_append_new(out, m) != 0 ||
            (thinking.len && !apiutil_put(m, "reasoning_content", json_string(apiutil_text(&thinking)))) ||
            (json_array_size(calls) && json_object_set(m, "tool_calls", calls) != 0))
            rc = CAIRN_ENOMEM;
    }
    json_decref(calls);
    strbuf_free(&text);
    strbuf_free(&thinking);
    return rc;
}

static int read_messages(const json_t *body, json_t *out, struct json_err *e)
{
    const json_t *sys = json_object_get(body, "system"), *msgs = json_object_get(body, "messages");
    struct strbuf st = {0};
    int rc = text_blocks(sys, "system", &st, e);
    if (!rc && st.len)
        rc = append_msg(out, "system", apiutil_text(&st));
    strbuf_free(&st);
    if (rc)
        return rc;
    if (absent(msgs))
        return json_fail(e, NULL, "messages: field required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return json_fail(e, NULL, "messages: expected a non-empty array");
    if (json_array_size(msgs) > TEXTGEN_MAX_MESSAGES)
        return json_fail(e, NULL, "messages: at most %d messages", TEXTGEN_MAX_MESSAGES);
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char path[64];
        snprintf(path, sizeof path, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        if (!json_is_object(m))
            return json_fail(e, NULL, "%s: expected an object", path);
        if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0))
            return json_fail(e, NULL, "%s.role: expected \"user\" or \"assistant\"", path);
        bool user = !strcmp(role, "user");
        char cp[80];
        snprintf(cp, sizeof cp, "%s.content", path);
        if (json_is_string(c))
            rc = append_msg(out, role, json_string_value(c));
        else if (json_is_array(c))
            rc = user ? user_blocks(c, cp, out, e) : assistant_blocks(c, cp, out, e);
        else
            rc = json_fail(e, NULL, "%s: expected a string or an array of content blocks", cp);
        if (rc)
            return rc;
    }
    /* The system prompt and each tool result are messages of their own to the runner,
     * which takes at most TEXTGEN_MAX_MESSAGES. */
    if (json_array_size(out) > TEXTGEN_MAX_MESSAGES)
        return json_fail(e, NULL, "messages: %zu messages once the system prompt and each tool_result are "
                         "counted, at most %d", json_array_size(out), TEXTGEN_MAX_MESSAGES);
    return 0;
}

/* ---------- tools, thinking, the rest ---------- */

static int read_tools(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *tools = json_object_get(body, "tools"), *choice = json_object_get(body, "tool_choice");
    if (!absent(tools)) {
        if (!json_is_array(tools))
            return json_fail(e, NULL, "tools: expected an array");
        if (json_array_size(tools) && !(p->tools = json_array()))
            return CAIRN_ENOMEM;
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name"),
                         *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
            if (!json_is_object(t))
                return json_fail(e, NULL, "tools[%zu]: expected an object", i);
            if (!absent(type) && !(json_is_string(type) && !strcmp(json_string_value(type), "custom")))
                return json_fail(e, NULL,
                                 "tools[%zu].type: only client tools (\"custom\", with input_schema) are supported",
                                 i);
            if (!json_is_string(name) || json_string_length(name) == 0)
                return json_fail(e, NULL, "tools[%zu].name: expected a string", i);
            if (!absent(desc) && !json_is_string(desc))
                return json_fail(e, NULL, "tools[%zu].description: expected a string", i);
            if (!json_is_object(schema))
                return json_fail(e, NULL, "tools[%zu].input_schema: expected an object", i);
            json_t *f = json_pack("{s:O,s:O}", "name", (json_t *)name, "parameters", (json_t *)schema);
            json_t *o = f ? json_pack("{s:s,s:o}", "type", "function", "function", f) : NULL;
            if (!o || json_array_append_new(p->tools, o) != 0 ||
                (json_is_string(desc) && json_object_set(f, "description", (json_t *)desc) != 0))
                return CAIRN_ENOMEM;
        }
    }
    if (absent(choice))
        return 0;
    const char *type = json_string_value(json_object_get(choice, "type"));
    const json_t *dp = json_object_get(choice, "disable_parallel_tool_use");
    if (!json_is_object(choice))
        return json_fail(e, NULL, "tool_choice: expected an object");
    if (!type || (strcmp(type, "auto") && strcmp(type, "any") && strcmp(type, "tool") && strcmp(type, "none")))
        return json_fail(e, NULL, "tool_choice.type: expected auto, any, tool or none");
    if (!absent(dp) && !json_is_boolean(dp))
        return json_fail(e, NULL, "tool_choice.disable_parallel_tool_use: expected true or false");
    if (!strcmp(type, "none")) {
        json_decref(p->tools);
        p->tools = NULL;
    } else if (!strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(choice, "name"));
        if (!name)
            return json_fail(e, NULL, "tool_choice.name: expected a string");
        json_t *only = NULL;
        size_t i;
        json_t *t;
        json_array_foreach(p->tools, i, t)
            if (!only && !strcmp(apiutil_str(json_object_get(t, "function"), "name"), name))
                only = json_pack("[O]", t);
        if (!only)
            return json_fail(e, NULL, "tool_choice.name: no tool named '%.64s'", name);
        json_decref(p->tools);
        p->tools = only;
    }
    /* any and tool: the output is a call (constrained decoding, in the template's format) */
    if ((!strcmp(type, "any") || !strcmp(type, "tool")) && json_array_size(p->tools) && !(p->force_tool = strdup("")))
        return CAIRN_ENOMEM;
    return 0;
}

static int read_thinking(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *t = json_object_get(body, "thinking");
    if (absent(t))
        return 0;
    if (!json_is_object(t))
        return json_fail(e, NULL, "thinking: expected an object");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
        return json_fail(e, NULL, "thinking.type: expected enabled, disabled or adaptive");
    const json_t *budget = json_object_get(t, "budget_tokens");
    int64_t b;
    if (!absent(budget) && (!json_int_value(budget, &b) || b < 1))
        return json_fail(e, NULL, "thinking.budget_tokens: expected an integer >= 1");
    if (!(p->template_kwargs = json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled") != 0)))
        return CAIRN_ENOMEM;
    return 0;
}

/* The whole request into p (textgen_params_init'ed); *model borrowed from body. */
static int read_request(const json_t *body, struct textgen_params *p, bool *stream, const char **model, struct json_err *e)
{
    const json_t *m = json_object_get(body, "model"), *mt = json_object_get(body, "max_tokens"),
                 *meta = json_object_get(body, "metadata");
    int64_t n, top_k;
    double t, top_p;
    bool given_k, given_t, given_p;
    int rc;
    if (absent(m))
        return json_fail(e, NULL, "model: field required");
    if (!json_is_string(m) || json_string_length(m) == 0)
        return json_fail(e, NULL, "model: expected a non-empty string");
    *model = json_string_value(m);
    if (absent(mt))
        return json_fail(e, NULL, "max_tokens: field required");
    if (!json_int_value(mt, &n) || n < 1)
        return json_fail(e, NULL, "max_tokens: expected an integer >= 1");
    p->max_tokens = n > RUNNER_MAX_GENERATE ? RUNNER_MAX_GENERATE : n;
    if ((rc = json_opt_bool(body, NULL, "stream", stream, NULL, e)))
        return rc;
    if (!absent(meta) && !json_is_object(meta))
        return json_fail(e, NULL, "metadata: expected an object");
    if ((rc = json_opt_int(body, NULL, "top_k", 0, 1 << 24, &top_k, &given_k, e)) ||
        (rc = json_opt_number(body, NULL, "temperature", 0, 1, false, &t, &given_t, e)) ||
        (rc = json_opt_number(body, NULL, "top_p", 0, 1, true, &top_p, &given_p, e)) ||
        (rc = apiutil_opt_stop(body, NULL, "stop_sequences", false, p, e)) ||
        (rc = read_tools(body, p, e)) || (rc = read_thinking(body, p, e)))
        return rc;
    if (given_k)
        p->sampling.top_k = (int)top_k;
    if (given_t)
        p->sampling.temperature = (float)t;
    if (given_p)
        p->sampling.top_p = (float)top_p;
    p->sampling.seed = apiutil_random_seed();
    if (!(p->messages = json_array()))
        return CAIRN_ENOMEM;
    return read_messages(body, p->messages, e);
}

int anthropic_parse_request(const json_t *body, struct textgen_params *p, bool *stream, struct json_err *e)
{
    const char *model = NULL;
    *stream = false;
    if (!json_is_object(body))
        return apiutil_parse_status(json_fail(e, NULL, "request body: expected a JSON object"), e);
    int status = apiutil_parse_status(read_request(body, p, stream, &model, e), e);
    if (status)
        return status;
    if (!ids_valid_model(model)) { /* no model can have that id */
        json_fail(e, NULL, "model '%.*s' not found", NAME_SHOWN, model);
        return 404;
    }
    snprintf(p->model, sizeof p->model, "%s", model);
    return 0;
}

/* ---------- generation ---------- */

enum block { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING };

/* A request's state (apireq's self): set by the handler, then used by the event
 * callback alone. */
struct areq {
    char *model; /* the name the client gave, echoed */
    char id[48];
    char *stops[TEXTGEN_MAX_STOP]; /* the client's stop sequences */
    int n_stops;
    int64_t prompt_tokens, cached_tokens, output_tokens;
    const char *stop_reason;
    char *stop_sequence;
    int next_index;               /* streamed: index of the next content block */
    enum block open;              /* streamed: the block being written */
    struct strbuf text, thinking; /* whole reply */
    json_t *tool_uses;            /* whole reply: tool_use blocks */
};

static void areq_free(void *self)
{
    struct areq *r = self;
    free(r->model);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    free(r->stop_sequence);
    strbuf_free(&r->text);
    strbuf_free(&r->thinking);
    json_decref(r->tool_uses);
    free(r);
}

static json_t *usage_json(const struct areq *r, int64_t output)
{
    int64_t input = r->prompt_tokens - r->cached_tokens;
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(input > 0 ? input : 0), "output_tokens",
                     (json_int_t)output, "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
                     (json_int_t)r->cached_tokens);
}

/* The message object without content: message_start's, and the whole reply's base. */
static json_t *message_json(const struct areq *r, json_t *content, bool final)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", r->id, "type", "message", "role", "assistant", "model",
                          r->model, "content", content);
    bool ok = o && apiutil_put(o, "stop_reason", final ? json_string(r->stop_reason) : json_null()) &&
              apiutil_put(o, "stop_sequence", final && r->stop_sequence ? json_string(r->stop_sequence) : json_null()) &&
              apiutil_put(o, "usage", usage_json(r, final ? r->output_tokens : 0));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void close_block(struct apireq *a, struct areq *r)
{
    if (r->open == BLOCK_NONE)
        return;
    r->open = BLOCK_NONE;
    apireq_send(a, "content_block_stop",
                json_pack("{s:s,s:i}", "type", "content_block_stop", "index", r->next_index - 1));
}

static void open_block(struct apireq *a, struct areq *r, json_t *block)
{
    apireq_send(a, "content_block_start",
                json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", r->next_index, "content_block",
                          block));
    r->next_index++;
}

/* Streams text into a block of kind, opening one when another kind is open. */
static void block_delta(struct apireq *a, struct areq *r, enum block kind, const char *text)
{
    bool is_text = kind == BLOCK_TEXT;
    if (r->open != kind) {
        close_block(a, r);
        open_block(a, r,
                   is_text ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                           : json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
        r->open = kind;
    }
    apireq_send(a, "content_block_delta",
                json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", r->next_index - 1,
                          "delta", "type", is_text ? "text_delta" : "thinking_delta", is_text ? "text" : "thinking",
                          text));
}

/* Gen's tool call as a tool_use block (input: the arguments parsed as an object). */
static json_t *tool_use_json(const json_t *call)
{
    const json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
    json_t *input = json_is_object(args) ? json_deep_copy(args)
                                         : json_loads(json_string_value(args) ? json_string_value(args) : "",
                                                      JSON_DECODE_ANY, NULL);
    if (!json_is_object(input)) {
        log_warn("anthropic: tool call %s: arguments are not a JSON object", apiutil_str(fn, "name"));
        json_decref(input);
        input = json_object();
    }
    char idbuf[48];
    const char *id = apiutil_str(call, "id");
    if (!*id) {
        apiutil_random_id(idbuf, sizeof idbuf, "toolu_");
        id = idbuf;
    }
    return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", id, "name", apiutil_str(fn, "name"), "input",
                     input);
}

static void seq_done(struct apireq *a, struct areq *r, const struct gen_event *ev)
{
    const char *finish = ev->finish ? ev->finish : "stop";
    if (!strcmp(finish, "error") || !strcmp(finish, "cancelled")) {
        apireq_fail(a, 500, !strcmp(finish, "error") ? "generation failed" : "generation was cancelled");
        return;
    }
    r->output_tokens = ev->usage.completion_tokens;
    r->stop_reason = !strcmp(finish, "length") ? "max_tokens" : !strcmp(finish, "tool_calls") ? "tool_use" : "end_turn";
    for (int i = 0; ev->stop_sequence && !strcmp(finish, "stop") && i < r->n_stops; i++) {
        if (strcmp(ev->stop_sequence, r->stops[i]) == 0) { /* the client's, not the model's own */
            r->stop_reason = "stop_sequence";
            r->stop_sequence = strdup(r->stops[i]);
            break;
        }
    }
    size_t i;
    const json_t *call;
    json_array_foreach(ev->tool_calls, i, call) {
        json_t *b = tool_use_json(call);
        if (!b) {
            apireq_fail(a, 500, "out of memory");
            return;
        }
        if (!apireq_streamed(a)) {
            if (json_array_append_new(r->tool_uses, b) != 0)
                apireq_fail(a, 500, "out of memory");
            continue;
        }
        close_block(a, r);
        json_t *input = json_incref(json_object_get(b, "input"));
        char *partial = json_dumps(input, JSON_COMPACT);
        json_object_set_new(b, "input", json_object());
        open_block(a, r, b);
        apireq_send(a, "content_block_delta",
                    partial ? json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                                        r->next_index - 1, "delta", "type", "input_json_delta", "partial_json", partial)
                            : NULL);
        apireq_send(a, "content_block_stop",
                    json_pack("{s:s,s:i}", "type", "content_block_stop", "index", r->next_index - 1));
        free(partial);
        json_decref(input);
    }
}

static void end(struct apireq *a, struct areq *r, const struct gen_event *ev)
{
    if (ev->usage.prompt_tokens > 0) {
        r->prompt_tokens = ev->usage.prompt_tokens;
        r->cached_tokens = ev->usage.cached_tokens;
    }
    r->output_tokens = ev->usage.completion_tokens;
    if (!r->stop_reason)
        r->stop_reason = "end_turn";
    if (apireq_streamed(a)) {
        close_block(a, r);
        if (r->next_index == 0) { /* nothing came: one empty text block, as a reply has */
            open_block(a, r, json_pack("{s:s,s:s}", "type", "text", "text", ""));
            r->open = BLOCK_TEXT;
            close_block(a, r);
        }
        /* usage as Anthropic sends it now: every count, cumulative (the SDK takes the
         * cache counts from here) */
        apireq_send(a, "message_delta",
                    json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason",
                              r->stop_reason, "stop_sequence",
                              r->stop_sequence ? json_string(r->stop_sequence) : json_null(), "usage",
                              usage_json(r, r->output_tokens)));
        apireq_send(a, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        apireq_finish(a);
        return;
    }
    json_t *content = json_array();
    bool ok = content != NULL;
    if (ok && r->thinking.len)
        ok = json_array_append_new(content, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                                                      apiutil_text(&r->thinking), "signature", "")) == 0;
    if (ok && (r->text.len || (!r->thinking.len && !json_array_size(r->tool_uses))))
        ok = json_array_append_new(content,
                                   json_pack("{s:s,s:s}", "type", "text", "text", apiutil_text(&r->text))) == 0;
    ok = ok && json_array_extend(content, r->tool_uses) == 0;
    json_t *msg = ok ? message_json(r, content, true) : NULL;
    if (!ok)
        json_decref(content);
    apireq_reply(a, msg);
}

static void on_event(struct apireq *a, void *self, const struct gen_event *ev)
{
    struct areq *r = self;
    bool stream = apireq_streamed(a);
    switch (ev->kind) {
    case GEN_EVENT_START:
        r->prompt_tokens = ev->usage.prompt_tokens;
        r->cached_tokens = ev->usage.cached_tokens;
        if (!stream)
            break;
        apireq_send(a, "message_start",
                    json_pack("{s:s,s:o}", "type", "message_start", "message", message_json(r, json_array(), false)));
        apireq_send(a, "ping", json_pack("{s:s}", "type", "ping"));
        break;
    case GEN_EVENT_DELTA: {
        const char *c = ev->content ? ev->content : "", *t = ev->reasoning ? ev->reasoning : "";
        if (ev->seq != 0)
            break;
        if (*t && stream)
            block_delta(a, r, BLOCK_THINKING, t);
        else if (*t && strbuf_put(&r->thinking, t, strlen(t)))
            apireq_fail(a, 500, "out of memory");
        if (*c && stream && !apireq_over(a))
            block_delta(a, r, BLOCK_TEXT, c);
        else if (*c && !stream && strbuf_put(&r->text, c, strlen(c)))
            apireq_fail(a, 500, "out of memory");
        break;
    }
    case GEN_EVENT_SEQ_DONE:
        if (ev->seq == 0)
            seq_done(a, r, ev);
        break;
    case GEN_EVENT_END:
        end(a, r, ev);
        break;
    case GEN_EVENT_EMBEDDING: /* not asked for */
    case GEN_EVENT_ERROR: /* apireq's */
        break;
    }
}

static const struct apireq_api ANTHROPIC_API = {
    .name = "anthropic",
    .framing = APIREQ_SSE,
    .error_event = "error",
    .error_json = error_json,
    .backend_status = anthropic_status,
    .event = on_event,
    .free = areq_free,
};

static void h_messages(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    struct json_err e = {{0}, {0}};
    bool stream;
    struct textgen_params p;
    textgen_params_init(&p);
    int status = anthropic_parse_request(http_req_json(req), &p, &stream, &e);
    if (status) {
        textgen_params_clear(&p);
        reply_error(req, status, e.message);
        return;
    }
    const char *model = p.model; /* valid ids are kept whole */

    struct areq *r = calloc(1, sizeof *r);
    bool ok = r && (r->model = strdup(model)) && (r->tool_uses = json_array());
    for (int i = 0; ok && i < p.n_stop; i++)
        ok = (r->stops[r->n_stops++] = strdup(p.stop[i])) != NULL;
    if (!ok) {
        if (r)
            areq_free(r);
        textgen_params_clear(&p);
        reply_error(req, 500, "out of memory");
        return;
    }
    apiutil_random_id(r->id, sizeof r->id, "msg_");
    apireq_run(req, g, &ANTHROPIC_API, r, stream, &p);
}

int anthropic_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen)
{
    int rc = http_route_errors(srv, "POST", "/v1/messages", h_messages, (void *)g, error_json);
    if (rc)
        return cairn_fail(err, errlen, rc, "anthropic: route POST /v1/messages: %s", cairn_strerror(rc));
    return 0;
}
