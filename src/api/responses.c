/* OpenAI's Responses API: a request is checked field by field and turned into a chat
 * completion's body, which openai.c's parser turns into textgen_params (one reading of
 * the shared fields); generation events become typed SSE events (streamed) or one
 * response object. Finished responses go to a bounded store for previous_response_id
 * and GET. The request's life (submit, cancel on hang-up, the one free) is apireq's. */
#define _GNU_SOURCE
#include "api/responses.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/apireq.h"
#include "api/apiutil.h"
#include "api/openai.h"
#include "base/err.h"
#include "base/strbuf.h"
#include "proto/ids.h"

#define MAX_TOOLS 1024
#define ID_MAX 48

/* ---------- the store ---------- */

struct stored {
    char id[ID_MAX], parent[ID_MAX]; /* parent "" when none */
    json_t *messages;                /* this response's input and output as chat messages */
    json_t *response;                /* the response object */
    size_t bytes;
};

struct responses {
    const struct gen *g;
    pthread_mutex_t mu;
    struct stored ring[RESPONSES_STORE_MAX]; /* oldest at head */
    int head, count;
    size_t bytes;
};

int responses_create(struct responses **out, const struct gen *g)
{
    struct responses *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    r->g = g;
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

static void stored_free(struct stored *s)
{
    json_decref(s->messages);
    json_decref(s->response);
    memset(s, 0, sizeof *s);
}

void responses_release(struct responses *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->count; i++)
        stored_free(&r->ring[(r->head + i) % RESPONSES_STORE_MAX]);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void evict_oldest(struct responses *r)
{
    struct stored *s = &r->ring[r->head];
    r->bytes -= s->bytes;
    stored_free(s);
    r->head = (r->head + 1) % RESPONSES_STORE_MAX;
    r->count--;
}

/* Keeps a finished response (messages and response taken). */
static void store_put(struct responses *r, const char *id, const char *parent, json_t *messages,
                      json_t *response)
{
    size_t bytes = json_dumpb(messages, NULL, 0, JSON_COMPACT) + json_dumpb(response, NULL, 0, JSON_COMPACT);
    if (bytes > RESPONSES_STORE_BYTES) {
        json_decref(messages);
        json_decref(response);
        return;
    }
    pthread_mutex_lock(&r->mu);
    while (r->count > 0 && (r->count == RESPONSES_STORE_MAX || r->bytes + bytes > RESPONSES_STORE_BYTES))
        evict_oldest(r);
    struct stored *s = &r->ring[(r->head + r->count) % RESPONSES_STORE_MAX];
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->parent, sizeof s->parent, "%s", parent ? parent : "");
    s->messages = messages;
    s->response = response;
    s->bytes = bytes;
    r->bytes += bytes;
    r->count++;
    pthread_mutex_unlock(&r->mu);
}

/* The stored entry of id, or NULL (under mu). */
static struct stored *store_find(struct responses *r, const char *id)
{
    for (int i = r->count - 1; i >= 0; i--) {
        struct stored *s = &r->ring[(r->head + i) % RESPONSES_STORE_MAX];
        if (strcmp(s->id, id) == 0)
            return s;
    }
    return NULL;
}

/* Appends to msgs the conversation that led to and includes response id, oldest first.
 * CAIRN_EFORMAT (e names previous_response_id) when id or a response it continues is
 * not stored. */
static int store_chain(struct responses *r, const char *id, json_t *msgs, struct json_err *e)
{
    if (!r)
        return json_fail(e, "previous_response_id", "no stored response has id '%.64s'", id);
    pthread_mutex_lock(&r->mu);
    struct stored *chain[RESPONSES_STORE_MAX];
    int n = 0;
    const char *want = id;
    int rc = 0;
    while (want[0]) {
        struct stored *s = n < RESPONSES_STORE_MAX ? store_find(r, want) : NULL;
        if (!s) {
            if (n)
                rc = json_fail(e, "previous_response_id", "response '%.64s' continues '%.64s', which is no longer stored",
                               id, want);
            else
                rc = json_fail(e, "previous_response_id", "no stored response has id '%.64s'", want);
            break;
        }
        chain[n++] = s;
        want = s->parent;
    }
    for (int i = n - 1; !rc && i >= 0; i--) {
        json_t *copy = json_deep_copy(chain[i]->messages);
        if (!copy || json_array_extend(msgs, copy))
            rc = CAIRN_ENOMEM;
        json_decref(copy);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---------- errors ---------- */

static json_t *error_json(int status, const char *message, const char *param)
{
    return openai_error_json(status, message, param, "not_found");
}

/* ---------- the request ---------- */

void responses_req_clear(struct responses_req *q)
{
    json_decref(q->echo);
    json_decref(q->input);
    memset(q, 0, sizeof *q);
}

/* Text of a content: a string, or parts of type input_text, output_text, text (joined
 * with "\n") or refusal. */
static int content_text(const json_t *c, const char *path, char **out, struct json_err *e)
{
    char p[JSON_ERR_PATH_MAX];
    *out = NULL;
    if (json_is_string(c))
        return (*out = strndup(json_string_value(c), json_string_length(c))) ? 0 : CAIRN_ENOMEM;
    if (!json_is_array(c))
        return json_fail(e, path, "expected a string or an array of content parts");
    struct strbuf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = json_is_object(part) ? json_string_value(json_object_get(part, "type")) : NULL;
        bool refusal = type && strcmp(type, "refusal") == 0;
        const json_t *text = json_object_get(part, refusal ? "refusal" : "text");
        int rc = 0;
        json_path(p, sizeof p, "%s[%zu]", path, i);
        if (!json_is_object(part))
            rc = json_fail(e, p, "expected a content part object");
        else if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
                           !refusal))
            rc = json_fail(e, p, "content parts of type \"%.40s\" are not supported, only input_text and output_text",
                           type ? type : "(none)");
        else if (!json_is_string(text))
            rc = json_fail(e, p, "%s: expected a string", refusal ? "refusal" : "text");
        else if ((i > 0 && strbuf_put(&b, "\n", 1)) ||
                 strbuf_put(&b, json_string_value(text), json_string_length(text)))
            rc = CAIRN_ENOMEM;
        if (rc) {
            strbuf_free(&b);
            return rc;
        }
    }
    if (!b.p && strbuf_put(&b, "", 0))
        return CAIRN_ENOMEM;
    *out = b.p;
    return 0;
}

/* A required string member of item at path into *s (borrowed). */
static int need_string(const json_t *item, const char *path, const char *key, const char **s, struct json_err *e)
{
    char p[JSON_ERR_PATH_MAX];
    json_member_path(p, sizeof p, path, key);
    const json_t *v = json_object_get(item, key);
    if (!json_is_string(v))
        return json_fail(e, p, v && !json_is_null(v) ? "expected a string" : "required");
    *s = json_string_value(v);
    return 0;
}

static int add_message(json_t *msgs, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s,s:s}", "role", role, "content", content);
    return m && json_array_append_new(msgs, m) == 0 ? 0 : CAIRN_ENOMEM;
}

/* One input item, appended to msgs as chat messages. */
static int input_item(const json_t *it, size_t i, json_t *msgs, struct json_err *e)
{
    char path[JSON_ERR_PATH_MAX], p[JSON_ERR_PATH_MAX];
    json_path(path, sizeof path, "input[%zu]", i);
    if (!json_is_object(it))
        return json_fail(e, path, "expected an input item object");
    const json_t *tv = json_object_get(it, "type");
    if (tv && !json_is_null(tv) && !json_is_string(tv))
        return json_fail(e, path, "type: expected a string");
    const char *type = json_is_string(tv) ? json_string_value(tv) : "message";
    int rc;
    if (strcmp(type, "message") == 0) {
        const char *role = NULL;
        if ((rc = need_string(it, path, "role", &role, e)))
            return rc;
        if (strcmp(role, "developer") == 0)
            role = "system";
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")) {
            json_path(p, sizeof p, "%s.role", path);
            return json_fail(e, p, "unknown role \"%.40s\" (user, assistant, system or developer)", role);
        }
        json_path(p, sizeof p, "%s.content", path);
        const json_t *c = json_object_get(it, "content");
        if (!c || json_is_null(c))
            return json_fail(e, p, "required");
        char *text;
        if ((rc = content_text(c, p, &text, e)))
            return rc;
        rc = add_message(msgs, role, text);
        free(text);
        return rc;
    }
    if (strcmp(type, "function_call") == 0) {
        const char *call_id = NULL, *name = NULL, *args = NULL;
        if ((rc = need_string(it, path, "call_id", &call_id, e)) || (rc = need_string(it, path, "name", &name, e)) ||
            (rc = need_string(it, path, "arguments", &args, e)))
            return rc;
        if (!name[0]) {
            json_path(p, sizeof p, "%s.name", path);
            return json_fail(e, p, "must not be empty");
        }
        json_t *call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", call_id, "type", "function", "function", "name",
                                 name, "arguments", args);
        if (!call)
            return CAIRN_ENOMEM;
        /* Calls that follow an assistant message (or other calls) join it. */
        size_t n = json_array_size(msgs);
        json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
        if (last && strcmp(apiutil_str(last, "role"), "assistant") == 0) {
            json_t *calls = json_object_get(last, "tool_calls");
            if (!calls) {
                calls = json_array();
                if (!calls || json_object_set_new(last, "tool_calls", calls)) {
                    json_decref(call);
                    return CAIRN_ENOMEM;
                }
            }
            return json_array_append_new(calls, call) ? CAIRN_ENOMEM : 0;
        }
        json_t *m = json_pack("{s:s,s:n,s:[o]}", "role", "assistant", "content", "tool_calls", call);
        return m && json_array_append_new(msgs, m) == 0 ? 0 : CAIRN_ENOMEM;
    }
    if (strcmp(type, "function_call_output") == 0) {
        const char *call_id = NULL;
        if ((rc = need_string(it, path, "call_id", &call_id, e)))
            return rc;
        json_path(p, sizeof p, "%s.output", path);
        const json_t *o = json_object_get(it, "output");
        if (!o || json_is_null(o))
            return json_fail(e, p, "required");
        char *text;
        if ((rc = content_text(o, p, &text, e)))
            return rc;
        json_t *m = json_pack("{s:s,s:s,s:s}", "role", "tool", "content", text, "tool_call_id", call_id);
        free(text);
        return m && json_array_append_new(msgs, m) == 0 ? 0 : CAIRN_ENOMEM;
    }
    if (strcmp(type, "reasoning") == 0)
        return 0; /* the model's own earlier thoughts: templates drop them anyway */
    if (strcmp(type, "item_reference") == 0)
        return json_fail(e, path, "item_reference is not supported; give the items, or previous_response_id");
    return json_fail(e, path, "input items of type \"%.40s\" are not supported (message, function_call, "
                              "function_call_output, reasoning)", type);
}

/* body.input as chat messages appended to msgs. */
static int parse_input(const json_t *body, json_t *msgs, struct json_err *e)
{
    const json_t *in = json_object_get(body, "input");
    if (!in || json_is_null(in))
        return 0;
    if (json_is_string(in))
        return add_message(msgs, "user", json_string_value(in));
    if (!json_is_array(in))
        return json_fail(e, "input", "expected a string or an array of input items");
    if (json_array_size(in) > TEXTGEN_MAX_MESSAGES)
        return json_fail(e, "input", "%zu items, at most %d", json_array_size(in), TEXTGEN_MAX_MESSAGES);
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        int rc = input_item(it, i, msgs, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* Responses' function tools in the chat form, and tool_choice likewise, into cb. */
static int parse_tools(const json_t *body, json_t *cb, struct json_err *e)
{
    char path[JSON_ERR_PATH_MAX];
    const json_t *v = json_object_get(body, "tools");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v))
            return json_fail(e, "tools", "expected an array of tools");
        if (json_array_size(v) > MAX_TOOLS)
            return json_fail(e, "tools", "%zu tools, at most %d", json_array_size(v), MAX_TOOLS);
        json_t *tools = json_array();
        if (!tools || json_object_set_new(cb, "tools", tools))
            return CAIRN_ENOMEM;
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) {
            json_path(path, sizeof path, "tools[%zu]", i);
            const char *type = NULL, *name = NULL, *desc = NULL;
            int rc;
            if (!json_is_object(t))
                return json_fail(e, path, "expected a tool object");
            if ((rc = need_string(t, path, "type", &type, e)))
                return rc;
            if (strcmp(type, "function"))
                return json_fail(e, path, "tools of type \"%.40s\" are not supported, only \"function\"", type);
            if ((rc = need_string(t, path, "name", &name, e)) ||
                (rc = json_opt_string(t, path, "description", &desc, e)))
                return rc;
            if (!name[0])
                return json_fail(e, path, "name: must not be empty");
            const json_t *params = json_object_get(t, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                return json_fail(e, path, "parameters: expected a JSON schema object");
            json_t *f = json_pack("{s:s}", "name", name);
            json_t *tool = f ? json_pack("{s:s,s:o}", "type", "function", "function", f) : NULL;
            if (!tool || (desc && !apiutil_put(f, "description", json_string(desc))) ||
                (json_is_object(params) && !apiutil_put(f, "parameters", json_deep_copy(params))) ||
                json_array_append_new(tools, tool)) {
                json_decref(tool);
                return CAIRN_ENOMEM;
            }
        }
    }
    const json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc))
        return 0;
    if (json_is_string(tc)) /* none, auto, required: as chat's (checked there) */
        return json_object_set(cb, "tool_choice", (json_t *)tc) ? CAIRN_ENOMEM : 0;
    const char *type = NULL, *name = NULL;
    int rc;
    if (!json_is_object(tc))
        return json_fail(e, "tool_choice", "expected none, auto, required or {\"type\": \"function\", \"name\"}");
    if ((rc = need_string(tc, "tool_choice", "type", &type, e)))
        return rc;
    if (strcmp(type, "function"))
        return json_fail(e, "tool_choice", "type \"%.40s\" is not supported, only \"function\"", type);
    if ((rc = need_string(tc, "tool_choice", "name", &name, e)))
        return rc;
    size_t i;
    json_t *t;
    bool found = false;
    json_array_foreach(json_object_get(cb, "tools"), i, t)
        found = found || strcmp(apiutil_str(json_object_get(t, "function"), "name"), name) == 0;
    if (!found)
        return json_fail(e, "tool_choice.name", "no tool is named \"%.100s\"", name);
    json_t *c = json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", name);
    return c && json_object_set_new(cb, "tool_choice", c) == 0 ? 0 : CAIRN_ENOMEM;
}

/* text.format into p->grammar; *fmt gets the format object to echo (borrowed, or NULL). */
static int parse_text_format(const json_t *body, struct textgen_params *p, const json_t **fmt, struct json_err *e)
{
    *fmt = NULL;
    const json_t *text = json_object_get(body, "text");
    if (!text || json_is_null(text))
        return 0;
    if (!json_is_object(text))
        return json_fail(e, "text", "expected an object");
    const json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f))
        return 0;
    const char *type = NULL;
    int rc;
    if (!json_is_object(f))
        return json_fail(e, "text.format", "expected {\"type\": \"text\", \"json_object\" or \"json_schema\"}");
    if ((rc = need_string(f, "text.format", "type", &type, e)))
        return rc;
    *fmt = f;
    if (strcmp(type, "text") == 0)
        return 0;
    if (strcmp(type, "json_object") == 0)
        return apiutil_grammar_schema(NULL, "text.format", p, e);
    if (strcmp(type, "json_schema") == 0) {
        const json_t *sc = json_object_get(f, "schema");
        if (!json_is_object(sc))
            return json_fail(e, "text.format.schema", sc ? "expected a JSON schema object" : "required");
        return apiutil_grammar_schema(sc, "text.format.schema", p, e);
    }
    return json_fail(e, "text.format.type", "unknown type \"%.40s\" (text, json_object or json_schema)", type);
}

/* Fields of the chat body that mean the same on both APIs. */
static const char *const SAME_FIELDS[] = {
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "ignore_eos", "num_draft_tokens", "prompt_lookup", "chat_template_kwargs",
    "enable_thinking", "stream", "parallel_tool_calls", NULL,
};

/* Fields a response object repeats from its request. */
static const char *const ECHO_FIELDS[] = {
    "instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "tools",
    "previous_response_id", "metadata", "parallel_tool_calls", "text", "reasoning", NULL,
};

static int parse_request(struct responses *r, const json_t *body, struct textgen_params *p,
                         struct responses_req *q, struct json_err *e)
{
    if (!json_is_object(body))
        return json_fail(e, "", "the request body must be a JSON object");
    json_t *cb = json_object(), *msgs = json_array();
    q->input = json_array();
    q->echo = json_object();
    if (!cb || !msgs || !q->input || !q->echo) {
        json_decref(cb);
        json_decref(msgs);
        return CAIRN_ENOMEM;
    }
    int rc = 0;
    const char *instr = NULL, *prev = NULL, *effort = NULL;
    int64_t max_out = 0;
    bool given_max = false;
    q->store = true;
    const json_t *reasoning = json_object_get(body, "reasoning");
    if ((rc = json_opt_string(body, NULL, "instructions", &instr, e)) ||
        (rc = json_opt_string(body, NULL, "previous_response_id", &prev, e)) ||
        (rc = json_opt_int(body, NULL, "max_output_tokens", 1, IDS_COUNTER_MAX, &max_out, &given_max, e)) ||
        (rc = json_opt_bool(body, NULL, "store", &q->store, NULL, e)) ||
        (rc = json_opt_bool(body, NULL, "stream", &q->stream, NULL, e)))
        goto out;
    if (reasoning && !json_is_null(reasoning) && !json_is_object(reasoning)) {
        rc = json_fail(e, "reasoning", "expected an object");
        goto out;
    }
    if (json_is_object(reasoning) && (rc = json_opt_string(reasoning, "reasoning", "effort", &effort, e)))
        goto out;
    const json_t *meta = json_object_get(body, "metadata");
    if (meta && !json_is_null(meta) && !json_is_object(meta)) {
        rc = json_fail(e, "metadata", "expected an object");
        goto out;
    }
    if (instr && (rc = add_message(msgs, "system", instr)))
        goto out;
    if (prev && (rc = store_chain(r, prev, msgs, e)))
        goto out;
    if ((rc = parse_input(body, q->input, e)))
        goto out;
    if (json_array_size(q->input) == 0 && !prev) {
        rc = json_fail(e, "input", "required (text or at least one item)");
        goto out;
    }
    if (json_array_extend(msgs, q->input)) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    if (json_array_size(msgs) > TEXTGEN_MAX_MESSAGES) {
        rc = json_fail(e, "input", "%zu messages with the previous responses', at most %d", json_array_size(msgs),
                       TEXTGEN_MAX_MESSAGES);
        goto out;
    }
    for (const char *const *k = SAME_FIELDS; *k; k++) {
        json_t *v = json_object_get(body, *k);
        if (v && json_object_set(cb, *k, v)) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
    }
    if (json_object_set(cb, "messages", msgs) || (given_max && json_object_set_new(cb, "max_completion_tokens",
                                                                                   json_integer(max_out))) ||
        (effort && json_object_set_new(cb, "reasoning_effort", json_string(effort)))) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    if ((rc = parse_tools(body, cb, e)))
        goto out;
    struct openai_reply_opts o = {0};
    int status = openai_parse_request(OPENAI_CHAT, cb, p, &o, e);
    if (status) { /* back from an HTTP status to the code apiutil_parse_status maps */
        rc = status == 500 ? CAIRN_ENOMEM : CAIRN_EFORMAT;
        goto out;
    }
    q->one_tool_call = o.one_tool_call;
    const json_t *fmt;
    if ((rc = parse_text_format(body, p, &fmt, e)))
        goto out;
    for (const char *const *k = ECHO_FIELDS; *k; k++) {
        json_t *v = json_object_get(body, *k);
        if (v && json_object_set(q->echo, *k, v)) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
    }
out:
    json_decref(cb);
    json_decref(msgs);
    return rc;
}

int responses_parse_request(struct responses *r, const json_t *body, struct textgen_params *p,
                            struct responses_req *q, struct json_err *e)
{
    return apiutil_parse_status(parse_request(r, body, p, q, e), e);
}

/* ---------- replies ---------- */

/* A request's state (apireq's self), used by the event callback alone. */
struct rreq {
    struct responses *owner;
    char id[ID_MAX], model[IDS_MODEL_MAX + 1];
    int64_t created;
    struct responses_req q;
    struct gen_usage start_usage, end_usage;
    struct strbuf text, reasoning;
    json_t *tool_calls; /* from SEQ_DONE, or NULL */
    char finish[16];
    bool seq_done;
    /* streamed */
    int64_t seqno;
    int n_out;                     /* output items so far */
    int reasoning_index, text_index; /* their output_index, -1 until opened */
    bool reasoning_closed;
    char reasoning_id[ID_MAX], msg_id[ID_MAX];
};

static json_t *usage_json(const struct rreq *r)
{
    const struct gen_usage *u = &r->end_usage, *st = &r->start_usage;
    int64_t in = u->prompt_tokens ? u->prompt_tokens : st->prompt_tokens;
    int64_t cached = u->cached_tokens ? u->cached_tokens : st->cached_tokens;
    int64_t out = u->completion_tokens;
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)in, "input_tokens_details",
                     "cached_tokens", (json_int_t)cached, "output_tokens", (json_int_t)out,
                     "output_tokens_details", "reasoning_tokens", (json_int_t)0, "total_tokens",
                     (json_int_t)(in + out));
}

static json_t *reasoning_item(const char *id, const char *text, const char *status)
{
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:s}],s:s}", "type", "reasoning", "id", id, "summary", "content",
                     "type", "reasoning_text", "text", text, "status", status);
}

static json_t *text_part(const char *text)
{
    json_t *t = apiutil_text_json(text);
    return t ? json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text", t, "annotations", "logprobs")
             : NULL;
}

static json_t *message_item(const char *id, const char *text, const char *status)
{
    json_t *content = text ? json_pack("[o]", text_part(text)) : json_array();
    return content ? json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", id, "status", status, "role",
                               "assistant", "content", content)
                   : NULL;
}

/* The backend's tool call tc as a function_call item. */
static json_t *call_item(const json_t *tc, const char *args_override)
{
    const json_t *fn = json_object_get(tc, "function"), *args = json_object_get(fn, "arguments");
    char id[ID_MAX], call_id[ID_MAX], *args_text = NULL;
    apiutil_random_id(id, sizeof id, "fc_");
    const char *cid = apiutil_str(tc, "id");
    if (!cid[0]) {
        apiutil_random_id(call_id, sizeof call_id, "call_");
        cid = call_id;
    }
    if (args && !json_is_string(args) && !json_is_null(args))
        args_text = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    const char *a = args_override ? args_override
                    : args_text   ? args_text
                    : json_is_string(args) ? json_string_value(args)
                                           : "{}";
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", id, "call_id", cid, "name",
                          apiutil_str(fn, "name"), "arguments", a, "status", args_override ? "in_progress" : "completed");
    free(args_text);
    return o;
}

static bool incomplete(const struct rreq *r)
{
    return r->seq_done && strcmp(r->finish, "length") == 0;
}

/* The response object; output (taken, NULL: []) its items. */
static json_t *response_json(const struct rreq *r, const char *status, json_t *output)
{
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:s}", "id", r->id, "object", "response", "created_at",
                          (json_int_t)r->created, "status", status, "error", "incomplete_details", "model",
                          r->model);
    if (!output)
        output = json_array();
    bool ok = o && output && json_object_set(o, "output", output) == 0;
    json_decref(output);
    static const struct {
        const char *key;
        int kind; /* 0 null, 1 true, 2 {}, 3 [], 4 "auto", 5 text format, 6 1.0 */
    } defaults[] = {
        {"instructions", 0}, {"max_output_tokens", 0}, {"previous_response_id", 0}, {"metadata", 2},
        {"parallel_tool_calls", 1}, {"temperature", 6}, {"top_p", 6}, {"tool_choice", 4}, {"tools", 3},
        {"text", 5}, {"reasoning", 0},
    };
    for (size_t i = 0; ok && i < sizeof defaults / sizeof *defaults; i++) {
        json_t *v = json_object_get(r->q.echo, defaults[i].key);
        if (v && !json_is_null(v)) {
            ok = json_object_set(o, defaults[i].key, v) == 0;
            continue;
        }
        switch (defaults[i].kind) {
        case 0: v = json_null(); break;
        case 1: v = json_true(); break;
        case 2: v = json_object(); break;
        case 3: v = json_array(); break;
        case 4: v = json_string("auto"); break;
        case 5: v = json_pack("{s:{s:s}}", "format", "type", "text"); break;
        default: v = json_real(1.0); break;
        }
        ok = apiutil_put(o, defaults[i].key, v);
    }
    ok = ok && apiutil_put(o, "store", json_boolean(r->q.store)) &&
         apiutil_put(o, "truncation", json_string("disabled")) && apiutil_put(o, "usage", usage_json(r));
    if (ok && strcmp(status, "incomplete") == 0)
        ok = apiutil_put(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The output items of a finished request, and (into *said, when not NULL) the
 * assistant's chat message for the store. */
static json_t *final_output(struct rreq *r, json_t **said)
{
    json_t *out = json_array();
    const char *text = apiutil_text(&r->text), *why = apiutil_text(&r->reasoning);
    bool ok = out != NULL;
    json_t *calls = json_array();
    if (ok && why[0]) {
        if (!r->reasoning_id[0])
            apiutil_random_id(r->reasoning_id, sizeof r->reasoning_id, "rs_");
        ok = json_array_append_new(out, reasoning_item(r->reasoning_id, why, "completed")) == 0;
    }
    if (ok && (text[0] || !json_array_size(r->tool_calls))) {
        if (!r->msg_id[0])
            apiutil_random_id(r->msg_id, sizeof r->msg_id, "msg_");
        ok = json_array_append_new(out, message_item(r->msg_id, text, "completed")) == 0;
    }
    size_t i;
    json_t *tc;
    json_array_foreach(r->tool_calls, i, tc) {
        json_t *item = ok ? call_item(tc, NULL) : NULL;
        ok = item && json_array_append_new(out, item) == 0 &&
             json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", apiutil_str(item, "call_id"),
                                                    "type", "function", "function", "name",
                                                    apiutil_str(item, "name"), "arguments",
                                                    apiutil_str(item, "arguments"))) == 0;
    }
    if (ok && said) {
        *said = json_pack("{s:s,s:o}", "role", "assistant", "content",
                          text[0] || !json_array_size(calls) ? apiutil_text_json(text) : json_null());
        if (*said && json_array_size(calls))
            json_object_set(*said, "tool_calls", calls);
        ok = *said != NULL;
    }
    json_decref(calls);
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* Stores a finished response with its conversation. */
static void keep(struct rreq *r, const json_t *response, json_t *said)
{
    json_t *msgs = json_deep_copy(r->q.input);
    json_t *resp = json_deep_copy(response);
    if (!r->q.store || !msgs || !resp || !said || json_array_append(msgs, said)) {
        json_decref(msgs);
        json_decref(resp);
        return;
    }
    const char *prev = json_string_value(json_object_get(r->q.echo, "previous_response_id"));
    store_put(r->owner, r->id, prev, msgs, resp);
}

/* Queues one typed event (data taken) with its sequence_number. */
static void send_event(struct apireq *a, struct rreq *r, const char *type, json_t *data)
{
    if (data && (!apiutil_put(data, "type", json_string(type)) ||
                 !apiutil_put(data, "sequence_number", json_integer(r->seqno++)))) {
        json_decref(data);
        data = NULL;
    }
    apireq_send(a, type, data);
}

static void send_item(struct apireq *a, struct rreq *r, const char *type, int index, json_t *item)
{
    send_event(a, r, type, item ? json_pack("{s:i,s:o}", "output_index", index, "item", item) : NULL);
}

static void close_reasoning(struct apireq *a, struct rreq *r)
{
    if (r->reasoning_index < 0 || r->reasoning_closed)
        return;
    r->reasoning_closed = true;
    const char *why = apiutil_text(&r->reasoning);
    json_t *t = apiutil_text_json(why);
    send_event(a, r, "response.reasoning_text.done",
               t ? json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->reasoning_id, "output_index", r->reasoning_index,
                             "content_index", 0, "text", t)
                 : NULL);
    send_item(a, r, "response.output_item.done", r->reasoning_index, reasoning_item(r->reasoning_id, why, "completed"));
}

static void open_text(struct apireq *a, struct rreq *r)
{
    if (r->text_index >= 0)
        return;
    close_reasoning(a, r);
    r->text_index = r->n_out++;
    apiutil_random_id(r->msg_id, sizeof r->msg_id, "msg_");
    send_item(a, r, "response.output_item.added", r->text_index, message_item(r->msg_id, NULL, "in_progress"));
    send_event(a, r, "response.content_part.added",
               json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->msg_id, "output_index", r->text_index, "content_index",
                         0, "part", text_part("")));
}

static void stream_delta(struct apireq *a, struct rreq *r, const char *content, const char *reasoning)
{
    if (reasoning[0] && r->text_index < 0) {
        if (r->reasoning_index < 0) {
            r->reasoning_index = r->n_out++;
            apiutil_random_id(r->reasoning_id, sizeof r->reasoning_id, "rs_");
            send_item(a, r, "response.output_item.added", r->reasoning_index,
                      json_pack("{s:s,s:s,s:[],s:[],s:s}", "type", "reasoning", "id", r->reasoning_id, "summary",
                                "content", "status", "in_progress"));
        }
        json_t *d = apiutil_text_json(reasoning);
        send_event(a, r, "response.reasoning_text.delta",
                   d ? json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->reasoning_id, "output_index",
                                 r->reasoning_index, "content_index", 0, "delta", d)
                     : NULL);
    }
    if (!content[0])
        return;
    open_text(a, r);
    json_t *d = apiutil_text_json(content);
    send_event(a, r, "response.output_text.delta",
               d ? json_pack("{s:s,s:i,s:i,s:o,s:[]}", "item_id", r->msg_id, "output_index", r->text_index,
                             "content_index", 0, "delta", d, "logprobs")
                 : NULL);
}

/* The end of the stream: what is open closes, tool calls go out, then completed. */
static void stream_end(struct apireq *a, struct rreq *r)
{
    close_reasoning(a, r);
    const char *text = apiutil_text(&r->text);
    if (r->text_index < 0 && !json_array_size(r->tool_calls))
        open_text(a, r); /* an empty answer is still one message */
    if (r->text_index >= 0) {
        json_t *t = apiutil_text_json(text);
        send_event(a, r, "response.output_text.done",
                   t ? json_pack("{s:s,s:i,s:i,s:o,s:[]}", "item_id", r->msg_id, "output_index", r->text_index,
                                 "content_index", 0, "text", t, "logprobs")
                     : NULL);
        send_event(a, r, "response.content_part.done",
                   json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->msg_id, "output_index", r->text_index,
                             "content_index", 0, "part", text_part(text)));
        send_item(a, r, "response.output_item.done", r->text_index, message_item(r->msg_id, text, "completed"));
    }
    /* The finished items, so that the function calls' ids match what was streamed. */
    json_t *said = NULL, *out = final_output(r, &said);
    size_t i;
    json_t *item;
    json_array_foreach(out, i, item) {
        if (strcmp(apiutil_str(item, "type"), "function_call"))
            continue;
        int index = r->n_out++;
        const char *id = apiutil_str(item, "id"), *args = apiutil_str(item, "arguments");
        json_t *added = json_deep_copy(item);
        if (added) {
            json_object_set_new(added, "arguments", json_string(""));
            json_object_set_new(added, "status", json_string("in_progress"));
        }
        send_item(a, r, "response.output_item.added", index, added);
        send_event(a, r, "response.function_call_arguments.delta",
                   json_pack("{s:s,s:i,s:s}", "item_id", id, "output_index", index, "delta", args));
        send_event(a, r, "response.function_call_arguments.done",
                   json_pack("{s:s,s:i,s:s,s:s}", "item_id", id, "output_index", index, "arguments", args, "name",
                             apiutil_str(item, "name")));
        send_item(a, r, "response.output_item.done", index, json_incref(item));
    }
    const char *status = incomplete(r) ? "incomplete" : "completed";
    json_t *resp = out ? response_json(r, status, out) : NULL;
    if (resp)
        keep(r, resp, said);
    json_decref(said);
    send_event(a, r, incomplete(r) ? "response.incomplete" : "response.completed",
               resp ? json_pack("{s:O}", "response", resp) : NULL);
    json_decref(resp);
    apireq_finish(a);
}

static const char *finish_error(const char *finish, int *status)
{
    bool error = strcmp(finish, "error") == 0;
    if (!error && strcmp(finish, "cancelled") != 0)
        return NULL;
    *status = error ? 500 : 503;
    return error ? "generation failed" : "generation was cancelled";
}

static void on_event(struct apireq *a, void *self, const struct gen_event *ev)
{
    struct rreq *r = self;
    bool streamed = apireq_streamed(a);
    switch (ev->kind) {
    case GEN_EVENT_START:
        r->start_usage = ev->usage;
        if (streamed) {
            json_t *resp = response_json(r, "in_progress", NULL);
            send_event(a, r, "response.created", resp ? json_pack("{s:O}", "response", resp) : NULL);
            send_event(a, r, "response.in_progress", resp ? json_pack("{s:O}", "response", resp) : NULL);
            json_decref(resp);
        }
        break;
    case GEN_EVENT_DELTA: {
        if (ev->seq != 0 || r->seq_done)
            break;
        const char *content = ev->content ? ev->content : "";
        const char *reasoning = ev->reasoning ? ev->reasoning : "";
        if (streamed && r->text_index >= 0)
            reasoning = ""; /* once text streams, its output item is already placed */
        if (strbuf_put(&r->reasoning, reasoning, strlen(reasoning)) ||
            strbuf_put(&r->text, content, strlen(content))) {
            apireq_fail(a, 500, "out of memory");
            break;
        }
        if (streamed)
            stream_delta(a, r, content, reasoning);
        break;
    }
    case GEN_EVENT_SEQ_DONE:
        if (ev->seq != 0 || r->seq_done)
            break;
        r->seq_done = true;
        snprintf(r->finish, sizeof r->finish, "%s", ev->finish ? ev->finish : "stop");
        if (json_is_array(ev->tool_calls) && json_array_size(ev->tool_calls))
            r->tool_calls = json_deep_copy(ev->tool_calls);
        while (r->q.one_tool_call && json_array_size(r->tool_calls) > 1)
            json_array_remove(r->tool_calls, json_array_size(r->tool_calls) - 1);
        break;
    case GEN_EVENT_END: {
        int status;
        const char *error = finish_error(r->finish[0] ? r->finish : "stop", &status);
        r->end_usage = ev->usage;
        if (error) {
            apireq_fail(a, status, error);
            break;
        }
        if (streamed) {
            stream_end(a, r);
            break;
        }
        json_t *said = NULL, *out = final_output(r, &said);
        json_t *resp = out ? response_json(r, incomplete(r) ? "incomplete" : "completed", out) : NULL;
        if (resp)
            keep(r, resp, said);
        json_decref(said);
        apireq_reply(a, resp);
        break;
    }
    case GEN_EVENT_ERROR:
    case GEN_EVENT_EMBEDDING:
        break;
    }
}

static void rreq_free(void *self)
{
    struct rreq *r = self;
    responses_req_clear(&r->q);
    strbuf_free(&r->text);
    strbuf_free(&r->reasoning);
    json_decref(r->tool_calls);
    free(r);
}

static const struct apireq_api RESPONSES_API = {
    .name = "responses",
    .framing = APIREQ_SSE,
    .error_event = "error",
    .error_json = error_json,
    .event = on_event,
    .free = rreq_free,
};

static void h_create(struct http_request *req, void *ctx)
{
    struct responses *owner = ctx;
    struct textgen_params p;
    textgen_params_init(&p);
    struct responses_req q = {0};
    struct json_err e = {{0}, {0}};
    int status = responses_parse_request(owner, http_req_json(req), &p, &q, &e);
    struct rreq *r = status ? NULL : calloc(1, sizeof *r);
    if (!r) {
        textgen_params_clear(&p);
        responses_req_clear(&q);
        apiutil_reply_error(req, error_json, status ? status : 500, status ? e.message : "out of memory",
                            status ? e.path : NULL);
        return;
    }
    r->owner = owner;
    r->q = q;
    r->created = (int64_t)time(NULL);
    r->reasoning_index = r->text_index = -1;
    snprintf(r->model, sizeof r->model, "%s", p.model);
    apiutil_random_id(r->id, sizeof r->id, "resp_");
    p.n = 1;
    apireq_run(req, owner->g, &RESPONSES_API, r, q.stream, &p);
}

static void h_get(struct http_request *req, void *ctx)
{
    struct responses *r = ctx;
    const char *id = http_req_param(req, "id");
    json_t *found = NULL;
    bool stored = false;
    pthread_mutex_lock(&r->mu);
    struct stored *s = id ? store_find(r, id) : NULL;
    if (s) {
        stored = true;
        found = json_deep_copy(s->response);
    }
    pthread_mutex_unlock(&r->mu);
    if (found) {
        http_reply_json(req, 200, found);
        return;
    }
    char msg[200];
    snprintf(msg, sizeof msg, "No response with id '%.64s' is stored", id ? id : "");
    apiutil_reply_error(req, error_json, stored ? 500 : 404, stored ? "out of memory" : msg, stored ? NULL : "id");
}

static void h_delete(struct http_request *req, void *ctx)
{
    struct responses *r = ctx;
    const char *id = http_req_param(req, "id");
    bool found = false;
    pthread_mutex_lock(&r->mu);
    struct stored *s = id ? store_find(r, id) : NULL;
    if (s) { /* a hole in the ring: eviction passes over it */
        found = true;
        r->bytes -= s->bytes;
        stored_free(s);
    }
    pthread_mutex_unlock(&r->mu);
    if (!found) {
        char msg[200];
        snprintf(msg, sizeof msg, "No response with id '%.64s' is stored", id ? id : "");
        apiutil_reply_error(req, error_json, 404, msg, "id");
        return;
    }
    json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response.deleted", "deleted", 1);
    if (!o)
        apiutil_reply_error(req, error_json, 500, "out of memory", NULL);
    else
        http_reply_json(req, 200, o);
}

int responses_register(struct responses *r, struct http_server *srv, char *err, size_t errlen)
{
    static const struct {
        const char *method, *pattern;
        http_handler_fn fn;
    } routes[] = {
        {"POST", "/v1/responses", h_create},
        {"GET", "/v1/responses/:id", h_get},
        {"DELETE", "/v1/responses/:id", h_delete},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        int rc = http_route_errors(srv, routes[i].method, routes[i].pattern, routes[i].fn, r, error_json);
        if (rc)
            return cairn_fail(err, errlen, rc, "route %s %s: %s", routes[i].method, routes[i].pattern,
                              cairn_strerror(rc));
    }
    return 0;
}
