/* OpenAI endpoints: requests checked field by field into textgen_params, generation
 * events turned into chunks (streamed) or one object (not streamed). The request's life
 * (submit, cancel on hang-up, the one free) is apireq's. */
#define _GNU_SOURCE
#include "api/openai.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/apireq.h"
#include "api/apiutil.h"
#include "base/err.h"
#include "base/json.h"
#include "proto/ids.h"

#define MAX_TOOLS 1024

struct choice {
    struct strbuf content, reasoning; /* not streamed: collected text */
    json_t *tool_calls;               /* not streamed: from SEQ_DONE, or NULL */
    json_t *logprobs;                 /* not streamed: chat-form entries, or NULL */
    size_t text_bytes;                /* streamed completions: text sent so far */
    char finish[16];
    bool done;
};

/* A generation request's state (apireq's self): used by the event callback alone. */
struct oreq {
    enum openai_route kind;
    char id[48];
    int64_t created;
    char model[IDS_MODEL_MAX + 1];
    int n;
    bool include_usage, logprobs, one_tool_call;
    struct gen_usage start_usage, seq_usage;
    struct choice *choices; /* n */
};

json_t *openai_error_json(int status, const char *message, const char *param, const char *not_found_code)
{
    const char *code = status == 404 ? not_found_code : status == 413 ? "context_length_exceeded" : NULL;
    json_t *e = json_object(), *o = json_object();
    if (!e || !o || !apiutil_put(e, "message", apiutil_text_json(message)) ||
        !apiutil_put(e, "type", json_string(status >= 500 ? "server_error" : "invalid_request_error")) ||
        !apiutil_put(e, "param", param && param[0] ? apiutil_text_json(param) : json_null()) ||
        !apiutil_put(e, "code", code ? json_string(code) : json_null()) || json_object_set(o, "error", e)) {
        json_decref(e);
        json_decref(o);
        return NULL;
    }
    json_decref(e);
    return o;
}

/* OpenAI's error object for status (a 404 is a model not found). */
static json_t *error_json(int status, const char *message, const char *param)
{
    return openai_error_json(status, message, param, "model_not_found");
}

static void reply_error(struct http_request *req, int status, const char *message,
                        const char *param)
{
    apiutil_reply_error(req, error_json, status, message, param);
}

/* ---------- request fields ---------- */

static int oom(void)
{
    return CAIRN_ENOMEM;
}

/* An assistant message's tool_calls, checked and normalized into *out. */
static int parse_tool_calls(const json_t *tc, const char *path, json_t **out,
                            struct json_err *e)
{
    char p[JSON_ERR_PATH_MAX];
    *out = NULL;
    if (!tc || json_is_null(tc))
        return 0;
    if (!json_is_array(tc))
        return json_fail(e, path, "expected an array of tool calls");
    json_t *arr = json_array();
    if (!arr)
        return oom();
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        json_path(p, sizeof p, "%s[%zu]", path, i);
        const char *id = NULL, *type = NULL, *name = NULL;
        const json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        int rc = 0;
        if (!json_is_object(c))
            rc = json_fail(e, p, "expected a tool call object");
        else if ((rc = json_opt_string(c, p, "id", &id, e)) || (rc = json_opt_string(c, p, "type", &type, e)))
            ;
        else if (type && strcmp(type, "function") != 0)
            rc = json_fail(e, p, "type \"%s\" is not supported, only \"function\"", type);
        else if (!json_is_object(fn))
            rc = json_fail(e, p, "function: expected an object");
        if (rc) {
            json_decref(arr);
            return rc;
        }
        json_path(p, sizeof p, "%s[%zu].function", path, i);
        const json_t *args = json_object_get(fn, "arguments");
        if ((rc = json_opt_string(fn, p, "name", &name, e)) ||
            (!name && (rc = json_fail(e, p, "name: required")))) {
            json_decref(arr);
            return rc;
        }
        if (args && !json_is_null(args) && !json_is_string(args) && !json_is_object(args)) {
            json_decref(arr);
            json_path(p, sizeof p, "%s[%zu].function.arguments", path, i);
            return json_fail(e, p, "expected a JSON text or an object");
        }
        json_t *f = json_object(), *call = json_object();
        bool ok = f && call && apiutil_put(f, "name", json_string(name)) &&
                  apiutil_put(f, "arguments", args && !json_is_null(args) ? json_deep_copy(args)
                                                                  : json_string("{}")) &&
                  (!id || apiutil_put(call, "id", json_string(id))) &&
                  apiutil_put(call, "type", json_string("function")) &&
                  json_object_set(call, "function", f) == 0 && json_array_append(arr, call) == 0;
        json_decref(f);
        json_decref(call);
        if (!ok) {
            json_decref(arr);
            return oom();
        }
    }
    *out = arr;
    return 0;
}

static int parse_message(const json_t *m, size_t i, json_t **out, struct json_err *e)
{
    char path[JSON_ERR_PATH_MAX], p[JSON_ERR_PATH_MAX];
    json_path(path, sizeof path, "messages[%zu]", i);
    *out = NULL;
    if (!json_is_object(m))
        return json_fail(e, path, "expected a message object");
    const json_t *role = json_object_get(m, "role");
    json_path(p, sizeof p, "%s.role", path);
    if (!role || json_is_null(role))
        return json_fail(e, p, "required");
    if (!json_is_string(role))
        return json_fail(e, p, "expected a string");
    const char *r = json_string_value(role);
    if (strcmp(r, "developer") == 0)
        r = "system";
    bool assistant = strcmp(r, "assistant") == 0;
    if (strcmp(r, "system") && strcmp(r, "user") && !assistant && strcmp(r, "tool"))
        return json_fail(e, p, "unknown role \"%s\" (system, developer, user, assistant or tool)",
                         r);
    const char *call_id, *name, *reasoning;
    int rc;
    if ((rc = json_opt_string(m, path, "tool_call_id", &call_id, e)) ||
        (rc = json_opt_string(m, path, "name", &name, e)) ||
        (rc = json_opt_string(m, path, "reasoning_content", &reasoning, e)))
        return rc;
    json_t *calls = NULL;
    json_path(p, sizeof p, "%s.tool_calls", path);
    const json_t *tc = json_object_get(m, "tool_calls");
    if (tc && !json_is_null(tc) && !assistant)
        return json_fail(e, p, "only assistant messages carry tool calls");
    if ((rc = parse_tool_calls(tc, p, &calls, e)))
        return rc;
    char *text = NULL;
    json_path(p, sizeof p, "%s.content", path);
    if ((rc = apiutil_flatten_content(json_object_get(m, "content"), p, &text, e))) {
        json_decref(calls);
        return rc;
    }
    if (!text && !assistant) {
        json_decref(calls);
        return json_fail(e, p, "required for a %s message", r);
    }
    json_t *msg = json_object();
    bool ok = msg && apiutil_put(msg, "role", json_string(r)) &&
              apiutil_put(msg, "content", text ? json_string(text) : json_null()) &&
              (!calls || json_object_set(msg, "tool_calls", calls) == 0) &&
              (!call_id || apiutil_put(msg, "tool_call_id", json_string(call_id))) &&
              (!name || apiutil_put(msg, "name", json_string(name))) &&
              (!reasoning || apiutil_put(msg, "reasoning_content", json_string(reasoning)));
    free(text);
    json_decref(calls);
    if (!ok) {
        json_decref(msg);
        return oom();
    }
    *out = msg;
    return 0;
}

static int parse_messages(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *ms = json_object_get(body, "messages");
    if (!ms || json_is_null(ms))
        return json_fail(e, "messages", "required");
    if (!json_is_array(ms))
        return json_fail(e, "messages", "expected an array of messages");
    size_t n = json_array_size(ms);
    if (n == 0 || n > TEXTGEN_MAX_MESSAGES)
        return json_fail(e, "messages", "%zu messages, expected 1..%d", n, TEXTGEN_MAX_MESSAGES);
    p->messages = json_array();
    if (!p->messages)
        return oom();
    for (size_t i = 0; i < n; i++) {
        json_t *m;
        int rc = parse_message(json_array_get(ms, i), i, &m, e);
        if (rc)
            return rc;
        if (json_array_append_new(p->messages, m))
            return oom();
    }
    return 0;
}

/* prompt: text, token ids, or an array of either (a batch: choice i * n + j is the j-th
 * of prompt i, as OpenAI numbers them). */
static int parse_prompt(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *v = json_object_get(body, "prompt");
    if (!v || json_is_null(v))
        return json_fail(e, "prompt", "required");
    if (!json_is_string(v) && !json_is_array(v))
        return json_fail(e, "prompt", "expected a string, token ids, or an array of one of them");
    char err[JSON_ERR_MAX];
    struct textgen_input *in = NULL;
    int n = 0;
    int rc = textgen_inputs(v, "prompt", TEXTGEN_MAX_N, true, &in, &n, err, sizeof err);
    if (rc) {
        textgen_inputs_free(in, n);
        if (rc == CAIRN_ENOMEM)
            return oom();
        const char *colon = strchr(err, ':');
        char path[JSON_ERR_PATH_MAX];
        json_path(path, sizeof path, "%.*s", colon ? (int)(colon - err) : 6, err);
        return json_fail(e, path, "%s", colon ? colon + 2 : err);
    }
    if (n > 1) {
        p->batch = in;
        p->n_batch = n;
        return 0;
    }
    if (in[0].text) {
        p->prompt = in[0].text;
        in[0].text = NULL;
    } else {
        p->prompt_ids = in[0].ids;
        p->n_prompt_ids = in[0].n_ids;
        in[0].ids = NULL;
    }
    textgen_inputs_free(in, n);
    return 0;
}

static int parse_logit_bias(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *v = json_object_get(body, "logit_bias");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return json_fail(e, "logit_bias", "expected an object of token ids to biases");
    size_t n = json_object_size(v);
    if (n > TEXTGEN_MAX_BIAS)
        return json_fail(e, "logit_bias", "%zu entries, at most %d", n, TEXTGEN_MAX_BIAS);
    if (n == 0)
        return 0;
    p->bias = calloc(n, sizeof *p->bias);
    if (!p->bias)
        return oom();
    const char *key;
    json_t *b;
    json_object_foreach((json_t *)v, key, b) {
        char path[JSON_ERR_PATH_MAX];
        json_path(path, sizeof path, "logit_bias.%s", key);
        size_t klen = strlen(key);
        /* One spelling per id ("7", never "07"): keys are unique, so ids are too, and
         * the runner, which reads them back from an object, gets every entry. */
        bool digits = klen > 0 && klen <= 10 && strspn(key, "0123456789") == klen && (key[0] != '0' || klen == 1);
        long long id = digits ? strtoll(key, NULL, 10) : -1;
        if (id < 0 || id > INT32_MAX)
            return json_fail(e, path, "the key is not a token id (a decimal integer without leading zeros)");
        if (!json_is_number(b))
            return json_fail(e, path, "expected a number");
        double d = json_number_value(b);
        if (!(d >= -100 && d <= 100))
            return json_fail(e, path, "%g is out of range, expected [-100, 100]", d);
        p->bias[p->n_bias].token = (int32_t)id;
        p->bias[p->n_bias].bias = (float)d;
        p->n_bias++;
    }
    return 0;
}

static int parse_sampling(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    struct runner_sampling *s = &p->sampling;
    double d;
    bool given;
    int64_t k, seed = -1;
    int rc;
    if ((rc = json_opt_number(body, NULL, "temperature", 0, 2, false, &d, &given, e)))
        return rc;
    if (given)
        s->temperature = (float)d;
    if ((rc = json_opt_number(body, NULL, "top_p", 0, 1, true, &d, &given, e)))
        return rc;
    if (given)
        s->top_p = (float)d;
    if ((rc = json_opt_number(body, NULL, "min_p", 0, 1, false, &d, &given, e)))
        return rc;
    if (given)
        s->min_p = (float)d;
    if ((rc = json_opt_number(body, NULL, "presence_penalty", -2, 2, false, &d, &given, e)))
        return rc;
    if (given)
        s->presence_penalty = (float)d;
    if ((rc = json_opt_number(body, NULL, "frequency_penalty", -2, 2, false, &d, &given, e)))
        return rc;
    if (given)
        s->frequency_penalty = (float)d;
    if ((rc = json_opt_number(body, NULL, "repetition_penalty", 0, 100, true, &d, &given, e)))
        return rc;
    if (given)
        s->repeat_penalty = (float)d;
    if ((rc = json_opt_int(body, NULL, "top_k", -1, 1 << 24, &k, &given, e)))
        return rc;
    if (given)
        s->top_k = k > 0 ? (int)k : 0; /* -1 and 0: off */
    if ((rc = json_opt_int(body, NULL, "seed", -1, IDS_COUNTER_MAX, &seed, NULL, e)))
        return rc;
    /* OpenAI draws a fresh seed for each unseeded request; so do we (-1 asks the same). */
    s->seed = seed >= 0 ? (uint64_t)seed : apiutil_random_seed();
    return 0;
}

static int parse_max_tokens(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    int64_t a = 0, b = 0;
    bool ga, gb;
    int rc;
    if ((rc = json_opt_int(body, NULL, "max_tokens", 1, IDS_COUNTER_MAX, &a, &ga, e)) ||
        (rc = json_opt_int(body, NULL, "max_completion_tokens", 1, IDS_COUNTER_MAX, &b, &gb, e)))
        return rc;
    int64_t n = gb ? b : ga ? a : 0; /* the newer name wins */
    p->max_tokens = n > RUNNER_MAX_GENERATE ? RUNNER_MAX_GENERATE : n;
    return 0;
}

static int parse_logprobs(enum openai_route kind, const json_t *body, struct textgen_params *p,
                          struct json_err *e)
{
    bool given;
    int64_t top = 0;
    int rc;
    if (kind == OPENAI_COMPLETION) {
        /* The legacy API's "logprobs" is the number of alternatives (0: only the
         * sampled token); true and false are taken too. */
        const json_t *v = json_object_get(body, "logprobs");
        if (json_is_boolean(v)) {
            p->logprobs = json_is_true(v);
            return 0;
        }
        if ((rc = json_opt_int(body, NULL, "logprobs", 0, TEXTGEN_MAX_TOP_LOGPROBS, &top, &given, e)))
            return rc;
        p->logprobs = given;
        p->top_logprobs = (int)top;
        return 0;
    }
    if ((rc = json_opt_bool(body, NULL, "logprobs", &p->logprobs, NULL, e)) ||
        (rc = json_opt_int(body, NULL, "top_logprobs", 0, TEXTGEN_MAX_TOP_LOGPROBS, &top, &given, e)))
        return rc;
    p->top_logprobs = (int)top;
    return 0;
}

static int parse_tools(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *v = json_object_get(body, "tools");
    char path[JSON_ERR_PATH_MAX];
    if (v && !json_is_null(v)) {
        if (!json_is_array(v))
            return json_fail(e, "tools", "expected an array of tools");
        if (json_array_size(v) > MAX_TOOLS)
            return json_fail(e, "tools", "%zu tools, at most %d", json_array_size(v), MAX_TOOLS);
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) {
            json_path(path, sizeof path, "tools[%zu]", i);
            const char *type, *name, *desc;
            const json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
            int rc = 0;
            if (!json_is_object(t))
                return json_fail(e, path, "expected a tool object");
            if ((rc = json_opt_string(t, path, "type", &type, e)))
                return rc;
            if (type && strcmp(type, "function") != 0)
                return json_fail(e, path, "type \"%s\" is not supported, only \"function\"", type);
            if (!json_is_object(fn))
                return json_fail(e, path, "function: expected an object");
            json_path(path, sizeof path, "tools[%zu].function", i);
            if ((rc = json_opt_string(fn, path, "name", &name, e)) ||
                (rc = json_opt_string(fn, path, "description", &desc, e)))
                return rc;
            if (!name || !name[0])
                return json_fail(e, path, "name: required");
            const json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                return json_fail(e, path, "parameters: expected a JSON schema object");
            json_t *f = json_object(), *tool = json_object();
            if (!p->tools)
                p->tools = json_array();
            bool ok = f && tool && p->tools && apiutil_put(f, "name", json_string(name)) &&
                      (!desc || apiutil_put(f, "description", json_string(desc))) &&
                      (!params || json_is_null(params) ||
                       apiutil_put(f, "parameters", json_deep_copy(params))) &&
                      apiutil_put(tool, "type", json_string("function")) &&
                      json_object_set(tool, "function", f) == 0 &&
                      json_array_append(p->tools, tool) == 0;
            json_decref(f);
            json_decref(tool);
            if (!ok)
                return oom();
        }
    }
    const json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc))
        return 0;
    if (json_is_string(tc)) {
        const char *c = json_string_value(tc);
        if (strcmp(c, "none") == 0) { /* no tools offered to the model */
            json_decref(p->tools);
            p->tools = NULL;
            return 0;
        }
        if (strcmp(c, "auto") == 0)
            return 0;
        if (strcmp(c, "required") == 0) {
            if (!json_array_size(p->tools))
                return json_fail(e, "tool_choice", "\"required\" with no tools");
            return (p->force_tool = strdup("")) ? 0 : oom();
        }
        return json_fail(e, "tool_choice", "\"%s\" is not one of none, auto, required", c);
    }
    const json_t *fn = json_is_object(tc) ? json_object_get(tc, "function") : NULL;
    const json_t *type = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
    if (!json_is_object(tc) || !json_is_string(type) ||
        strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn) ||
        !json_is_string(json_object_get(fn, "name")))
        return json_fail(e, "tool_choice",
                         "expected none, auto, required or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
    const char *name = json_string_value(json_object_get(fn, "name"));
    size_t i;
    json_t *tool;
    json_array_foreach(p->tools, i, tool) {
        const char *n = json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
        if (n && strcmp(n, name) == 0)
            return (p->force_tool = strdup(name)) ? 0 : oom();
    }
    return json_fail(e, "tool_choice.function.name", "no tool is named \"%.100s\"", name);
}

static int parse_template_kwargs(const json_t *body, struct textgen_params *p,
                                 struct json_err *e)
{
    const char *effort = NULL;
    bool thinking, given;
    int rc;
    if ((rc = json_opt_string(body, NULL, "reasoning_effort", &effort, e)))
        return rc;
    if (effort && strcmp(effort, "none") && strcmp(effort, "minimal") && strcmp(effort, "low") &&
        strcmp(effort, "medium") && strcmp(effort, "high"))
        return json_fail(e, "reasoning_effort", "\"%s\" is not one of none, minimal, low, medium, high",
                         effort);
    if ((rc = json_opt_bool(body, NULL, "enable_thinking", &thinking, &given, e)))
        return rc;
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return json_fail(e, "chat_template_kwargs", "expected an object");
    if (!effort && !given && (!kw || json_is_null(kw) || json_object_size(kw) == 0))
        return 0;
    json_t *o = json_object();
    if (!o)
        return oom();
    p->template_kwargs = o;
    if (effort && strcmp(effort, "none") == 0) {
        if (!apiutil_put(o, "enable_thinking", json_false()))
            return oom();
    } else if (effort && !apiutil_put(o, "reasoning_effort", json_string(effort))) {
        return oom();
    }
    if (given && !apiutil_put(o, "enable_thinking", json_boolean(thinking)))
        return oom();
    if (json_is_object(kw) && json_object_update(o, (json_t *)kw))
        return oom();
    return 0;
}

static int parse_misc(enum openai_route kind, const json_t *body, struct textgen_params *p,
                      struct openai_reply_opts *o, struct json_err *e)
{
    int64_t n = 1, k = -1;
    int rc;
    /* ignore_eos, num_draft_tokens and prompt_lookup are cairn's (and llama.cpp's) own */
    if ((rc = json_opt_int(body, NULL, "n", 1, TEXTGEN_MAX_N, &n, NULL, e)) ||
        (rc = json_opt_bool(body, NULL, "ignore_eos", &p->ignore_eos, NULL, e)) ||
        (rc = json_opt_int(body, NULL, "num_draft_tokens", -1, TEXTGEN_MAX_DRAFT, &k, NULL, e)) ||
        (rc = json_opt_bool(body, NULL, "prompt_lookup", &p->prompt_lookup, NULL, e)) ||
        (rc = json_opt_bool(body, NULL, "stream", &o->stream, NULL, e)))
        return rc;
    bool parallel = true;
    if ((rc = json_opt_bool(body, NULL, "parallel_tool_calls", &parallel, NULL, e)))
        return rc;
    o->one_tool_call = !parallel;
    p->n = (int)n;
    p->num_draft_tokens = (int)k;
    const json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return json_fail(e, "stream_options", "expected an object");
        bool inc = false;
        if ((rc = json_opt_bool(so, "stream_options", "include_usage", &inc, NULL, e)))
            return rc;
        o->include_usage = inc && o->stream;
    }
    const json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf)) {
        const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t))
            return json_fail(e, "response_format", "expected {\"type\": \"text\", \"json_object\" or \"json_schema\"}");
        const char *type = json_string_value(t);
        if (strcmp(type, "json_object") == 0) {
            /* llama.cpp's server also takes a schema beside json_object */
            const json_t *sc = json_object_get(rf, "schema");
            if ((rc = apiutil_grammar_schema(json_is_object(sc) ? sc : NULL, "response_format", p, e)))
                return rc;
        } else if (strcmp(type, "json_schema") == 0) {
            const json_t *js = json_object_get(rf, "json_schema");
            const json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(js))
                return json_fail(e, "response_format.json_schema", "expected {\"name\", \"schema\", \"strict\"}");
            if ((rc = apiutil_grammar_schema(sc ? sc : json_true(), "response_format.json_schema.schema", p, e)))
                return rc;
        } else if (strcmp(type, "text") != 0) {
            return json_fail(e, "response_format", "unknown type \"%s\"", type);
        }
    }
    const json_t *gr = json_object_get(body, "grammar"); /* llama.cpp's: GBNF text */
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr))
            return json_fail(e, "grammar", "expected GBNF text");
        if (p->grammar)
            return json_fail(e, "grammar", "give either grammar or response_format, not both");
        if ((rc = apiutil_grammar_gbnf(json_string_value(gr), json_string_length(gr), "grammar", p, e)))
            return rc;
    }
    if (kind == OPENAI_COMPLETION)
        p->reasoning = false; /* a raw prompt's text comes back whole */
    return 0;
}

/* Checks every field the API knows into p and o; CAIRN_EFORMAT (e says where) or
 * CAIRN_ENOMEM. */
static int parse_request(enum openai_route kind, const json_t *body, struct textgen_params *p,
                         struct openai_reply_opts *o, struct json_err *e)
{
    if (!json_is_object(body))
        return json_fail(e, "", "the request body must be a JSON object");
    int rc;
    if ((rc = apiutil_parse_model(body, p, e)))
        return rc;
    if (kind == OPENAI_CHAT) {
        if ((rc = parse_messages(body, p, e)) || (rc = parse_tools(body, p, e)) ||
            (rc = parse_template_kwargs(body, p, e)))
            return rc;
    } else if ((rc = parse_prompt(body, p, e))) {
        return rc;
    }
    if ((rc = parse_max_tokens(body, p, e)) || (rc = parse_sampling(body, p, e)) ||
        (rc = apiutil_opt_stop(body, NULL, "stop", true, p, e)) || (rc = parse_logit_bias(body, p, e)) ||
        (rc = parse_logprobs(kind, body, p, e)) || (rc = parse_misc(kind, body, p, o, e)))
        return rc;
    if (p->batch && (int64_t)p->n_batch * p->n > TEXTGEN_MAX_N)
        return json_fail(e, "prompt", "%d prompts with n %d are %d choices; at most %d in one request", p->n_batch,
                         p->n, p->n_batch * p->n, TEXTGEN_MAX_N);
    return 0;
}

int openai_parse_request(enum openai_route route, const json_t *body, struct textgen_params *p,
                         struct openai_reply_opts *o, struct json_err *e)
{
    return apiutil_parse_status(parse_request(route, body, p, o, e), e);
}

/* ---------- replies ---------- */

static json_t *usage_json(const struct oreq *r, const struct gen_usage *end)
{
    const struct gen_usage *st = &r->start_usage, *sq = &r->seq_usage;
    int64_t prompt = end && end->prompt_tokens ? end->prompt_tokens : st->prompt_tokens;
    int64_t cached = end && end->cached_tokens ? end->cached_tokens : st->cached_tokens;
    int64_t compl = end && end->completion_tokens ? end->completion_tokens : sq->completion_tokens;
    int64_t draft = end && end->draft_tokens ? end->draft_tokens : sq->draft_tokens;
    int64_t acc = end && end->accepted_draft_tokens ? end->accepted_draft_tokens
                                                     : sq->accepted_draft_tokens;
    return json_pack("{s:I,s:I,s:I,s:{s:I},s:I,s:I}", "prompt_tokens", (json_int_t)prompt,
                     "completion_tokens", (json_int_t)compl, "total_tokens",
                     (json_int_t)(prompt + compl), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)cached, "draft_tokens", (json_int_t)draft,
                     "accepted_draft_tokens", (json_int_t)acc);
}

/* llama-server's "timings" extension from the runner's own times, or NULL when unknown:
 * clients and benchmarks set TTFT against the prefill time it reports. */
static json_t *timings_json(const struct oreq *r, const struct gen_usage *u)
{
    if (!u || u->prompt_ms <= 0)
        return NULL;
    int64_t prompt = u->prompt_tokens ? u->prompt_tokens : r->start_usage.prompt_tokens;
    int64_t cached = u->cached_tokens ? u->cached_tokens : r->start_usage.cached_tokens;
    return json_pack("{s:I,s:f,s:I,s:f}", "prompt_n", (json_int_t)(prompt - cached), "prompt_ms", u->prompt_ms,
                     "predicted_n", (json_int_t)u->completion_tokens, "predicted_ms", u->predicted_ms);
}

/* One tool call of the backend in OpenAI's form (arguments as JSON text); with index
 * >= 0 it carries "index" as streamed deltas do. */
static json_t *tool_call_json(const json_t *tc, long index)
{
    const json_t *fn = json_object_get(tc, "function");
    const json_t *id = json_object_get(tc, "id"), *args = json_object_get(fn, "arguments");
    const char *name = json_string_value(json_object_get(fn, "name"));
    char gen_id[40], *args_text = NULL;
    if (!json_is_string(id))
        apiutil_random_id(gen_id, sizeof gen_id, "call_");
    if (args && !json_is_string(args) && !json_is_null(args))
        args_text = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    json_t *f = json_pack("{s:s,s:s}", "name", name ? name : "", "arguments",
                          args_text ? args_text : json_is_string(args) ? json_string_value(args) : "{}");
    free(args_text);
    json_t *c = json_object();
    bool ok = f && c && (index < 0 || apiutil_put(c, "index", json_integer(index))) &&
              apiutil_put(c, "id", json_string(json_is_string(id) ? json_string_value(id) : gen_id)) &&
              apiutil_put(c, "type", json_string("function")) && json_object_set(c, "function", f) == 0;
    json_decref(f);
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

static json_t *tool_calls_json(const json_t *calls, bool indexed, bool first_only)
{
    json_t *arr = json_array();
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        if (first_only && i > 0)
            break;
        if (!arr || json_array_append_new(arr, tool_call_json(tc, indexed ? (long)i : -1))) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* The legacy completions' logprobs object of chat-form entries; text offsets start at
 * *offset, which advances by each token's bytes. */
static json_t *completion_logprobs(const json_t *entries, size_t *offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    json_t *o = json_object();
    bool ok = tokens && lps && tops && offs && o;
    size_t i;
    json_t *en;
    json_array_foreach(entries, i, en) {
        if (!ok)
            break;
        const json_t *tok = json_object_get(en, "token");
        const char *t = json_is_string(tok) ? json_string_value(tok) : "";
        json_t *top = json_object();
        size_t k;
        json_t *alt;
        json_array_foreach(json_object_get(en, "top_logprobs"), k, alt) {
            const char *at = json_string_value(json_object_get(alt, "token"));
            if (top && at)
                json_object_set_new(top, at, json_real(json_number_value(json_object_get(alt, "logprob"))));
        }
        ok = top && json_array_append_new(tokens, json_string(t)) == 0 &&
             json_array_append_new(lps, json_real(json_number_value(json_object_get(en, "logprob")))) == 0 &&
             json_array_append_new(tops, top) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)*offset)) == 0;
        *offset += strlen(t);
    }
    ok = ok && json_object_set(o, "tokens", tokens) == 0 && json_object_set(o, "token_logprobs", lps) == 0 &&
         json_object_set(o, "top_logprobs", tops) == 0 && json_object_set(o, "text_offset", offs) == 0;
    json_decref(tokens);
    json_decref(lps);
    json_decref(tops);
    json_decref(offs);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *response_head(const struct oreq *r, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", r->id, "object", object, "created",
                     (json_int_t)r->created, "model", r->model);
}

/* The finish_reason OpenAI names for a sequence's finish. */
static const char *finish_reason(const char *finish, bool tool_calls)
{
    if (finish && strcmp(finish, "length") == 0)
        return "length";
    if (tool_calls || (finish && strcmp(finish, "tool_calls") == 0))
        return "tool_calls";
    return "stop";
}

static bool has_calls(const json_t *calls)
{
    return json_is_array(calls) && json_array_size(calls) > 0;
}

/* The whole reply of a request that was not streamed. */
static json_t *full_response(struct oreq *r, const struct gen_usage *end)
{
    json_t *o = response_head(r, r->kind == OPENAI_CHAT ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    bool ok = o && choices;
    for (int i = 0; ok && i < r->n; i++) {
        struct choice *c = &r->choices[i];
        bool calls = has_calls(c->tool_calls);
        json_t *ch = json_object(), *lp = NULL;
        ok = ch && apiutil_put(ch, "index", json_integer(i));
        if (r->kind == OPENAI_CHAT) {
            json_t *msg = json_object();
            const char *text = apiutil_text(&c->content);
            ok = ok && msg && apiutil_put(msg, "role", json_string("assistant")) &&
                 apiutil_put(msg, "content", calls && !text[0] ? json_null() : apiutil_text_json(text)) &&
                 (!c->reasoning.len ||
                  apiutil_put(msg, "reasoning_content", apiutil_text_json(apiutil_text(&c->reasoning)))) &&
                 (!calls || apiutil_put(msg, "tool_calls", tool_calls_json(c->tool_calls, false, r->one_tool_call)));
            ok = ok && json_object_set(ch, "message", msg) == 0;
            json_decref(msg);
            if (r->logprobs)
                lp = json_pack("{s:o}", "content",
                               c->logprobs ? json_incref(c->logprobs) : json_array());
        } else {
            ok = ok && apiutil_put(ch, "text", apiutil_text_json(apiutil_text(&c->content)));
            size_t off = 0;
            if (r->logprobs) {
                json_t *none = c->logprobs ? NULL : json_array();
                lp = completion_logprobs(c->logprobs ? c->logprobs : none, &off);
                json_decref(none);
            }
        }
        ok = ok && (r->logprobs ? apiutil_put(ch, "logprobs", lp) : apiutil_put(ch, "logprobs", json_null())) &&
             apiutil_put(ch, "finish_reason", json_string(finish_reason(c->finish, calls))) &&
             json_array_append(choices, ch) == 0;
        json_decref(ch);
    }
    ok = ok && json_object_set(o, "choices", choices) == 0 && apiutil_put(o, "usage", usage_json(r, end));
    json_t *tm = timings_json(r, end);
    ok = ok && (!tm || apiutil_put(o, "timings", tm));
    json_decref(choices);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Queues one SSE chunk with choices, usage and timings (all taken; choices NULL means out
 * of memory; timings NULL: none). */
static void send_chunk(struct apireq *a, struct oreq *r, json_t *choices, json_t *usage, json_t *timings)
{
    json_t *o = response_head(r, r->kind == OPENAI_CHAT ? "chat.completion.chunk" : "text_completion");
    bool ok = o && choices && json_object_set(o, "choices", choices) == 0;
    json_decref(choices);
    if (ok && timings)
        ok = apiutil_put(o, "timings", timings);
    else
        json_decref(timings);
    if (ok && r->include_usage)
        ok = apiutil_put(o, "usage", usage ? usage : json_null());
    else
        json_decref(usage);
    if (!ok) {
        json_decref(o);
        o = NULL;
    }
    apireq_send(a, NULL, o);
}

/* One choice of a chunk: chat ({"delta"}, taken; NULL is {}) or completion ({"text"});
 * logprobs taken (NULL is null). NULL when out of memory. */
static json_t *chunk_choice(const struct oreq *r, int index, json_t *delta, const char *text,
                            json_t *logprobs, const char *finish)
{
    json_t *c = json_object();
    bool ok = c && apiutil_put(c, "index", json_integer(index));
    if (r->kind == OPENAI_CHAT) {
        if (!delta)
            delta = json_object();
        ok = ok && delta && json_object_set(c, "delta", delta) == 0;
    } else {
        ok = ok && apiutil_put(c, "text", apiutil_text_json(text ? text : ""));
    }
    json_decref(delta);
    if (!logprobs)
        logprobs = json_null();
    ok = ok && json_object_set(c, "logprobs", logprobs) == 0 &&
         apiutil_put(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_decref(logprobs);
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

static json_t *one(json_t *choice)
{
    json_t *a = json_array();
    if (!a || !choice || json_array_append_new(a, choice)) {
        json_decref(a);
        return NULL;
    }
    return a;
}

/* The error a sequence's finish stands for, or NULL with *status untouched. */
static const char *finish_error(const char *finish, int *status)
{
    bool error = strcmp(finish, "error") == 0;
    if (!error && strcmp(finish, "cancelled") != 0)
        return NULL;
    *status = error ? 500 : 503;
    return error ? "generation failed" : "generation was cancelled";
}

static void stream_event(struct apireq *a, struct oreq *r, const struct gen_event *ev)
{
    struct choice *c = ev->seq >= 0 && ev->seq < r->n ? &r->choices[ev->seq] : NULL;
    switch (ev->kind) {
    case GEN_EVENT_START:
        for (int i = 0; r->kind == OPENAI_CHAT && i < r->n; i++)
            send_chunk(a, r, one(chunk_choice(r, i, json_pack("{s:s,s:s}", "role", "assistant",
                                                               "content", ""),
                                              NULL, NULL, NULL)),
                       NULL, NULL);
        break;
    case GEN_EVENT_DELTA: {
        const char *content = ev->content ? ev->content : "";
        const char *reasoning = ev->reasoning ? ev->reasoning : "";
        if (!c || (!content[0] && !reasoning[0] && !ev->logprobs))
            break;
        json_t *lp = NULL, *delta = NULL;
        char *text = NULL;
        if (r->kind == OPENAI_CHAT) {
            delta = json_object();
            if (delta && content[0])
                apiutil_put(delta, "content", apiutil_text_json(content));
            if (delta && reasoning[0])
                apiutil_put(delta, "reasoning_content", apiutil_text_json(reasoning));
            if (ev->logprobs)
                lp = json_pack("{s:o}", "content", json_deep_copy(ev->logprobs));
        } else {
            /* A raw completion has no reasoning channel; any such text stays in place. */
            if (asprintf(&text, "%s%s", reasoning, content) < 0)
                text = NULL;
            if (ev->logprobs)
                lp = completion_logprobs(ev->logprobs, &c->text_bytes);
        }
        send_chunk(a, r, one(chunk_choice(r, ev->seq, delta, text, lp, NULL)), NULL, NULL);
        free(text);
        break;
    }
    case GEN_EVENT_SEQ_DONE: {
        const char *finish = ev->finish ? ev->finish : "stop", *error;
        int status;
        if ((error = finish_error(finish, &status))) {
            apireq_fail(a, status, error);
            break;
        }
        bool calls = r->kind == OPENAI_CHAT && has_calls(ev->tool_calls);
        if (calls) {
            json_t *delta = json_object();
            if (delta)
                apiutil_put(delta, "tool_calls", tool_calls_json(ev->tool_calls, true, r->one_tool_call));
            send_chunk(a, r, one(chunk_choice(r, ev->seq, delta, NULL, NULL, NULL)), NULL, NULL);
        }
        send_chunk(a, r, one(chunk_choice(r, ev->seq, NULL, "", NULL, finish_reason(finish, calls))),
                   NULL, timings_json(r, &ev->usage));
        break;
    }
    case GEN_EVENT_END:
        if (r->include_usage)
            send_chunk(a, r, json_array(), usage_json(r, &ev->usage), NULL);
        apireq_send_text(a, NULL, "[DONE]");
        apireq_finish(a);
        break;
    case GEN_EVENT_EMBEDDING: /* not asked for */
    case GEN_EVENT_ERROR: /* apireq's */
        break;
    }
}

static void collect_event(struct apireq *a, struct oreq *r, const struct gen_event *ev)
{
    struct choice *c = ev->seq >= 0 && ev->seq < r->n ? &r->choices[ev->seq] : NULL;
    switch (ev->kind) {
    case GEN_EVENT_DELTA: {
        if (!c)
            break;
        const char *content = ev->content ? ev->content : "";
        const char *reasoning = ev->reasoning ? ev->reasoning : "";
        bool ok = strbuf_put(r->kind == OPENAI_CHAT ? &c->reasoning : &c->content, reasoning,
                             strlen(reasoning)) == 0 &&
                  strbuf_put(&c->content, content, strlen(content)) == 0;
        if (ok && ev->logprobs && r->logprobs) {
            json_t *copy = json_deep_copy(ev->logprobs);
            if (!c->logprobs)
                c->logprobs = json_array();
            ok = copy && c->logprobs && json_array_extend(c->logprobs, copy) == 0;
            json_decref(copy);
        }
        if (!ok)
            apireq_fail(a, 500, "out of memory");
        break;
    }
    case GEN_EVENT_SEQ_DONE:
        snprintf(c->finish, sizeof c->finish, "%s", ev->finish ? ev->finish : "stop");
        if (has_calls(ev->tool_calls))
            c->tool_calls = json_deep_copy(ev->tool_calls);
        break;
    case GEN_EVENT_END: {
        for (int i = 0; i < r->n; i++) {
            int status;
            const char *error = finish_error(r->choices[i].finish, &status);
            if (error) {
                apireq_fail(a, status, error);
                return;
            }
        }
        apireq_reply(a, full_response(r, &ev->usage));
        break;
    }
    case GEN_EVENT_START:
    case GEN_EVENT_ERROR:
    case GEN_EVENT_EMBEDDING:
        break;
    }
}

static void on_event(struct apireq *a, void *self, const struct gen_event *ev)
{
    struct oreq *r = self;
    struct choice *c = ev->seq >= 0 && ev->seq < r->n ? &r->choices[ev->seq] : NULL;
    if (ev->kind == GEN_EVENT_START)
        r->start_usage = ev->usage;
    if ((ev->kind == GEN_EVENT_DELTA || ev->kind == GEN_EVENT_SEQ_DONE) && (!c || c->done))
        return; /* no such choice, or one that has finished */
    if (ev->kind == GEN_EVENT_SEQ_DONE) {
        c->done = true;
        r->seq_usage.completion_tokens += ev->usage.completion_tokens;
        r->seq_usage.draft_tokens += ev->usage.draft_tokens;
        r->seq_usage.accepted_draft_tokens += ev->usage.accepted_draft_tokens;
    }
    if (apireq_streamed(a))
        stream_event(a, r, ev);
    else
        collect_event(a, r, ev);
}

/* ---------- requests ---------- */

static void oreq_free(void *self)
{
    struct oreq *r = self;
    for (int i = 0; r->choices && i < r->n; i++) {
        strbuf_free(&r->choices[i].content);
        strbuf_free(&r->choices[i].reasoning);
        json_decref(r->choices[i].tool_calls);
        json_decref(r->choices[i].logprobs);
    }
    free(r->choices);
    free(r);
}

static const struct apireq_api OPENAI_API = {
    .name = "openai",
    .framing = APIREQ_SSE,
    .error_json = error_json,
    .event = on_event,
    .free = oreq_free,
};

static struct oreq *oreq_new(enum openai_route kind, const struct textgen_params *p,
                             const struct openai_reply_opts *o)
{
    struct oreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->choices = calloc((size_t)textgen_seqs(p), sizeof *r->choices);
    if (!r->choices) {
        free(r);
        return NULL;
    }
    r->kind = kind;
    r->n = textgen_seqs(p);
    r->include_usage = o->include_usage;
    r->one_tool_call = o->one_tool_call;
    r->logprobs = p->logprobs;
    r->created = (int64_t)time(NULL);
    snprintf(r->model, sizeof r->model, "%s", p->model);
    apiutil_random_id(r->id, sizeof r->id, kind == OPENAI_CHAT ? "chatcmpl-" : "cmpl-");
    return r;
}

static void handle_generation(struct http_request *req, const struct gen *g, enum openai_route kind)
{
    struct textgen_params p;
    textgen_params_init(&p);
    struct openai_reply_opts o = {0};
    struct json_err e = {{0}, {0}};
    int status = openai_parse_request(kind, http_req_json(req), &p, &o, &e);
    struct oreq *r = status ? NULL : oreq_new(kind, &p, &o);
    if (!r) {
        textgen_params_clear(&p);
        if (status)
            reply_error(req, status, e.message, e.path);
        else
            reply_error(req, 500, "out of memory", NULL);
        return;
    }
    snprintf(p.request_id, sizeof p.request_id, "%s", r->id);
    apireq_run(req, g, &OPENAI_API, r, o.stream, &p);
}

/* OpenAI's error object, a 404 naming no model. */
static json_t *cancel_error_json(int status, const char *message, const char *param)
{
    return openai_error_json(status, message, param, NULL);
}

/* POST /v1/chat/completions/:id/cancel, /v1/completions/:id/cancel and /v1/cancel/:id:
 * ends a running generation by the id its reply carries; the reply (or stream) ends
 * normally, each choice with finish_reason "stop" and the text it had. */
static void h_cancel(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const char *id = http_req_param(req, "id");
    char err[256];
    if (!g->ops->stop) {
        reply_error(req, 501, "this server cannot cancel requests", NULL);
        return;
    }
    int status = g->ops->stop(g->self, id ? id : "", err, sizeof err);
    if (status) {
        apiutil_reply_error(req, cancel_error_json, status, err, "id");
        return;
    }
    http_reply_json(req, 200, json_pack("{s:s,s:s,s:b}", "id", id, "object", "cancel", "cancelled", 1));
}

static void h_chat(struct http_request *req, void *ctx)
{
    handle_generation(req, ctx, OPENAI_CHAT);
}

static void h_completions(struct http_request *req, void *ctx)
{
    handle_generation(req, ctx, OPENAI_COMPLETION);
}

/* ---------- models ---------- */

static json_t *model_json(const json_t *card, int64_t created)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", json_string_value(json_object_get(card, "id")),
                     "object", "model", "created", (json_int_t)created, "owned_by", "cairn");
}

static void h_models(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    json_t *cards = g->ops->models(g->self);
    json_t *data = json_array();
    bool ok = cards && data;
    int64_t now = (int64_t)time(NULL);
    size_t i;
    json_t *card;
    json_array_foreach(cards, i, card) {
        if (ok && json_is_string(json_object_get(card, "id")))
            ok = json_array_append_new(data, model_json(card, now)) == 0;
    }
    json_decref(cards);
    json_t *o = ok ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL;
    if (!o) {
        if (!ok)
            json_decref(data);
        reply_error(req, 500, "out of memory", NULL);
        return;
    }
    http_reply_json(req, 200, o);
}

static void h_model(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const char *id = http_req_param(req, "id");
    json_t *cards = g->ops->models(g->self);
    if (!cards) {
        reply_error(req, 500, "out of memory", NULL);
        return;
    }
    json_t *found = NULL;
    size_t i;
    json_t *card;
    json_array_foreach(cards, i, card) {
        const char *cid = json_string_value(json_object_get(card, "id"));
        if (!found && cid && id && strcmp(cid, id) == 0)
            found = model_json(card, (int64_t)time(NULL));
    }
    json_decref(cards);
    if (found) {
        http_reply_json(req, 200, found);
        return;
    }
    char msg[400];
    snprintf(msg, sizeof msg, "The model '%.300s' does not exist", id ? id : "");
    reply_error(req, 404, msg, "model");
}

int openai_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen)
{
    static const struct {
        const char *method, *pattern;
        http_handler_fn fn;
    } routes[] = {
        {"POST", "/v1/chat/completions", h_chat},
        {"POST", "/v1/completions", h_completions},
        {"GET", "/v1/models", h_models},
        {"GET", "/v1/models/*id", h_model},
        {"POST", "/v1/chat/completions/:id/cancel", h_cancel},
        {"POST", "/v1/completions/:id/cancel", h_cancel},
        {"POST", "/v1/cancel/:id", h_cancel},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        /* Handlers only read through g; the route context is untyped. */
        int rc = http_route_errors(srv, routes[i].method, routes[i].pattern, routes[i].fn,
                                   (void *)g, error_json);
        if (rc)
            return cairn_fail(err, errlen, rc, "route %s %s: %s", routes[i].method,
                              routes[i].pattern, cairn_strerror(rc));
    }
    return 0;
}
