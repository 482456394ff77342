/* Ollama-compatible endpoints (ollama.h): requests checked into textgen_params, events
 * turned into NDJSON lines or one object. A generation request's life (submit, cancel
 * on hang-up, the one free) is apireq's; its struct oreq is the reply's state. */
#define _GNU_SOURCE /* strcasestr */
#include "api/ollama.h"
#include "api/ollama_pull.h"
#include "node/hubref.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "api/apireq.h"
#include "api/apiutil.h"
#include "api/json_scan.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "base/version.h"
#include "proto/ids.h"

#define ERR_MAX 512
#define NAME_SHOWN 300 /* bytes of a client's model name quoted in an error */

/* ---------- small helpers ---------- */

/* Time as RFC 3339 in UTC with nanoseconds, as Ollama writes "created_at". */
static void rfc3339(char *buf, size_t cap, time_t sec, long nsec)
{
    struct tm tm;
    char day[40];
    gmtime_r(&sec, &tm);
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%09ldZ", day, nsec);
}

static void rfc3339_now(char *buf, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rfc3339(buf, cap, ts.tv_sec, ts.tv_nsec);
}

/* Ollama's error body: {"error": message}. */
json_t *ollama_error_json(int status, const char *message, const char *param)
{
    (void)status;
    (void)param;
    json_t *o = json_object();
    if (o && !apiutil_put(o, "error", apiutil_text_json(message))) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static void reply_error(struct http_request *req, int status, const char *message)
{
    apiutil_reply_error(req, ollama_error_json, status, message, NULL);
}

/* ---------- checked request members ---------- */

/* "images": absent, null or empty; any image is refused (text-only models). */
static int no_images(const json_t *o, const char *path, struct json_err *e)
{
    const json_t *v = json_object_get(o, "images");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return json_fail(e, NULL, "%s%simages: expected an array", path, *path ? "." : "");
    if (json_array_size(v) > 0)
        return json_fail(e, NULL, "%s%simages: images are not supported (text models only)", path,
                         *path ? "." : "");
    return 0;
}

/* The model a request names ("model", or "name" where allowed): 400 when missing. */
static int request_model(const json_t *body, bool name_too, const char **out, struct json_err *e)
{
    const json_t *v = json_object_get(body, "model");
    if ((!v || json_is_null(v)) && name_too)
        v = json_object_get(body, "name");
    if (v && !json_is_null(v) && !json_is_string(v))
        return json_fail(e, NULL, "model: expected a string");
    if (!v || json_is_null(v) || json_string_length(v) == 0)
        return json_fail(e, NULL, "model is required");
    *out = json_string_value(v);
    return 0;
}

/* ---------- request parameters ---------- */

static const char *const ROLES[] = {"system", "user", "assistant", "tool"};

/* An Ollama tool call {"function": {"name", "arguments": object}} as the common form's
 * {"id", "type": "function", "function": {"name", "arguments": object}}. */
static int tool_call_in(const json_t *call, const char *path, size_t msg_i, size_t j, json_t *out_arr,
                        struct json_err *e)
{
    const json_t *fn = json_object_get(call, "function");
    if (!json_is_object(call) || !json_is_object(fn))
        return json_fail(e, NULL, "%s.tool_calls[%zu].function: expected an object", path, j);
    const json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return json_fail(e, NULL, "%s.tool_calls[%zu].function.name: expected a string", path,
                         j);
    const json_t *args = json_object_get(fn, "arguments");
    json_t *obj = NULL;
    if (!args || json_is_null(args))
        obj = json_object();
    else if (json_is_object(args))
        obj = json_deep_copy(args);
    else if (json_is_string(args)) { /* as OpenAI sends them, JSON text */
        /* Parsed here, so held to the limits of a body: else a string of 16 MiB would
         * make millions of values, or nesting no later recursion expects. */
        const char *text = json_string_value(args);
        size_t len = json_string_length(args), values;
        int depth;
        http_json_scan(text, len, HTTP_JSON_DEPTH_DEFAULT, HTTP_JSON_VALUES_DEFAULT, &depth, &values);
        if (depth > HTTP_JSON_DEPTH_DEFAULT || values > HTTP_JSON_VALUES_DEFAULT)
            return json_fail(e, NULL,
                             "%s.tool_calls[%zu].function.arguments: JSON text deeper than %d levels or of more "
                             "than %zu values", path, j, HTTP_JSON_DEPTH_DEFAULT, HTTP_JSON_VALUES_DEFAULT);
        obj = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    }
    if (obj && !json_is_object(obj)) {
        json_decref(obj);
        obj = NULL;
    }
    if (!obj)
        return json_fail(e, NULL, "%s.tool_calls[%zu].function.arguments: expected an object",
                         path, j);
    char idbuf[64];
    const char *id = json_string_value(json_object_get(call, "id"));
    if (!id || !*id) {
        snprintf(idbuf, sizeof idbuf, "call_%zu_%zu", msg_i, j);
        id = idbuf;
    }
    json_t *o = json_pack("{s:s,s:s,s:{s:O,s:o}}", "id", id, "type", "function", "function", "name", (json_t *)name,
                          "arguments", obj);
    if (!o || json_array_append_new(out_arr, o) != 0)
        return CAIRN_ENOMEM;
    return 0;
}

/* /api/chat's messages in the common form (textgen.h). */
static int chat_messages(const json_t *msgs, json_t *out, struct json_err *e)
{
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char path[48];
        snprintf(path, sizeof path, "messages[%zu]", i);
        if (!json_is_object(m))
            return json_fail(e, NULL, "%s: expected an object", path);
        const char *role = json_string_value(json_object_get(m, "role"));
        bool known = false;
        for (size_t k = 0; role && k < sizeof ROLES / sizeof ROLES[0]; k++)
            known |= strcmp(role, ROLES[k]) == 0;
        if (!known)
            return json_fail(e, NULL, "%s.role: expected system, user, assistant or tool", path);
        const char *content, *thinking, *tool_name, *name, *tool_call_id;
        int rc;
        if ((rc = json_opt_string(m, path, "content", &content, e)) ||
            (rc = json_opt_string(m, path, "thinking", &thinking, e)) ||
            (rc = json_opt_string(m, path, "tool_name", &tool_name, e)) ||
            (rc = json_opt_string(m, path, "name", &name, e)) ||
            (rc = json_opt_string(m, path, "tool_call_id", &tool_call_id, e)) ||
            (rc = no_images(m, path, e)))
            return rc;
        json_t *o = json_pack("{s:s,s:s}", "role", role, "content", content ? content : "");
        if (!o || json_array_append_new(out, o) != 0)
            return CAIRN_ENOMEM;
        if (thinking && *thinking && !apiutil_put(o, "reasoning_content", json_string(thinking)))
            return CAIRN_ENOMEM;
        if ((tool_name || name) && !apiutil_put(o, "name", json_string(tool_name ? tool_name : name)))
            return CAIRN_ENOMEM;
        if (tool_call_id && !apiutil_put(o, "tool_call_id", json_string(tool_call_id)))
            return CAIRN_ENOMEM;
        const json_t *tc = json_object_get(m, "tool_calls");
        if (!tc || json_is_null(tc))
            continue;
        if (!json_is_array(tc))
            return json_fail(e, NULL, "%s.tool_calls: expected an array", path);
        if (json_array_size(tc) == 0)
            continue;
        json_t *calls = json_array();
        if (!apiutil_put(o, "tool_calls", calls))
            return CAIRN_ENOMEM;
        size_t j;
        const json_t *call;
        json_array_foreach(tc, j, call)
            if ((rc = tool_call_in(call, path, i, j, calls, e)))
                return rc;
    }
    return 0;
}

/* "tools": [{"type": "function", "function": {"name", "description", "parameters"}}]. */
static int read_tools(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools))
        return 0;
    if (!json_is_array(tools))
        return json_fail(e, NULL, "tools: expected an array");
    if (json_array_size(tools) == 0)
        return 0;
    if (!(p->tools = json_array()))
        return CAIRN_ENOMEM;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t))
            return json_fail(e, NULL, "tools[%zu]: expected an object", i);
        if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
            return json_fail(e, NULL, "tools[%zu].type: expected \"function\"", i);
        if (!json_is_object(fn))
            return json_fail(e, NULL, "tools[%zu].function: expected an object", i);
        const json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
                     *params = json_object_get(fn, "parameters");
        if (!json_is_string(name) || json_string_length(name) == 0)
            return json_fail(e, NULL, "tools[%zu].function.name: expected a string", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return json_fail(e, NULL, "tools[%zu].function.description: expected a string", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return json_fail(e, NULL, "tools[%zu].function.parameters: expected an object", i);
        json_t *f = json_pack("{s:O}", "name", (json_t *)name);
        json_t *o = f ? json_pack("{s:s,s:o}", "type", "function", "function", f) : NULL;
        if (!o || json_array_append_new(p->tools, o) != 0 ||
            (json_is_string(desc) && json_object_set(f, "description", (json_t *)desc) != 0) ||
            (json_is_object(params) && json_object_set(f, "parameters", (json_t *)params) != 0))
            return CAIRN_ENOMEM;
    }
    return 0;
}

/* "options" into the sampling parameters, max_tokens and stop strings. */
static int read_options(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *o = json_object_get(body, "options");
    struct runner_sampling *s = &p->sampling;
    s->seed = apiutil_random_seed();
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return json_fail(e, NULL, "options: expected an object");
    const char *path = "options";
    double d = 0;
    int64_t x = 0;
    bool given;
    int rc;
#define NUM(key, lo, hi, open, dst)                                                             \
    if ((rc = json_opt_number(o, path, key, lo, hi, open, &d, &given, e)))                \
        return rc;                                                                              \
    if (given)                                                                                  \
        dst = (float)d;
#define INT(key, lo, hi, dst)                                                                   \
    if ((rc = json_opt_int(o, path, key, lo, hi, &x, &given, e)))                         \
        return rc;                                                                              \
    if (given)                                                                                  \
        dst = (int)x;
    NUM("temperature", 0, 100, false, s->temperature)
    NUM("top_p", 0, 1, true, s->top_p)
    NUM("min_p", 0, 1, false, s->min_p)
    NUM("repeat_penalty", 0, 100, true, s->repeat_penalty)
    NUM("presence_penalty", -100, 100, false, s->presence_penalty)
    NUM("frequency_penalty", -100, 100, false, s->frequency_penalty)
    INT("top_k", 0, 1 << 24, s->top_k)
    INT("repeat_last_n", -1, 1 << 24, s->penalty_last_n)
#undef NUM
#undef INT
    if ((rc = json_opt_int(o, path, "seed", INT64_MIN, IDS_COUNTER_MAX, &x, &given, e)))
        return rc;
    if (given && x >= 0)
        s->seed = (uint64_t)x;
    if ((rc = json_opt_int(o, path, "num_ctx", 0, INT64_MAX, &x, &given, e)))
        return rc; /* accepted and ignored: the instance's context is fixed when placed */
    if ((rc = json_opt_int(o, path, "num_predict", -2, INT64_MAX, &x, &given, e)))
        return rc;
    if (given && x == 0)
        return json_fail(e, "options.num_predict", "0 generates nothing; expected -1 (no limit) or a count");
    if (given)
        p->max_tokens = x < 0 ? 0 : x > RUNNER_MAX_GENERATE ? RUNNER_MAX_GENERATE : x;
    return apiutil_opt_stop(o, path, "stop", false, p, e);
}

/* "think": true/false or a level, into the template's kwargs. */
static int read_think(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *v = json_object_get(body, "think");
    if (!v || json_is_null(v))
        return 0;
    const char *level = json_string_value(v);
    bool is_level = level && (!strcmp(level, "low") || !strcmp(level, "medium") || !strcmp(level, "high"));
    if (!json_is_boolean(v) && !is_level)
        return json_fail(e, NULL, "think: expected true, false, \"low\", \"medium\" or \"high\"");
    p->template_kwargs = json_pack("{s:b}", "enable_thinking", is_level || json_is_true(v));
    if (!p->template_kwargs || (is_level && !apiutil_put(p->template_kwargs, "reasoning_effort", json_string(level))))
        return CAIRN_ENOMEM;
    return 0;
}

/* Members both generation endpoints share. */
static int read_common(const json_t *body, struct textgen_params *p, bool *stream, bool *unload,
                       struct json_err *e)
{
    int rc;
    if ((rc = json_opt_bool(body, NULL, "stream", stream, NULL, e)) || (rc = read_options(body, p, e)) ||
        (rc = read_think(body, p, e)))
        return rc;
    const json_t *fmt = json_object_get(body, "format");
    if (fmt && !json_is_null(fmt) && !(json_is_string(fmt) && json_string_length(fmt) == 0)) {
        if (json_is_string(fmt) && strcmp(json_string_value(fmt), "json") == 0)
            rc = apiutil_grammar_schema(NULL, "format", p, e);
        else if (json_is_object(fmt))
            rc = apiutil_grammar_schema(fmt, "format", p, e);
        else
            rc = json_fail(e, "format", "expected \"json\" or a JSON Schema");
        if (rc)
            return rc;
    }
    const json_t *ka = json_object_get(body, "keep_alive");
    if (ka && !json_is_null(ka) && !json_is_string(ka) && !json_is_number(ka))
        return json_fail(e, NULL, "keep_alive: expected a duration (\"5m\") or seconds");
    *unload = ka && ((json_is_number(ka) && json_number_value(ka) == 0) ||
                     (json_is_string(ka) && strspn(json_string_value(ka), "0") == json_string_length(ka) &&
                      json_string_length(ka) > 0));
    return 0;
}

static int chat_params(const json_t *body, struct textgen_params *p, bool *load, struct json_err *e)
{
    const json_t *msgs = json_object_get(body, "messages");
    int rc;
    if (msgs && !json_is_null(msgs) && !json_is_array(msgs))
        return json_fail(e, NULL, "messages: expected an array");
    size_t n = json_array_size(msgs);
    if (n > TEXTGEN_MAX_MESSAGES)
        return json_fail(e, NULL, "messages: %zu messages, at most %d", n,
                         TEXTGEN_MAX_MESSAGES);
    *load = n == 0;
    if (!(p->messages = json_array()))
        return CAIRN_ENOMEM;
    if ((rc = chat_messages(msgs, p->messages, e)) || (rc = read_tools(body, p, e)))
        return rc;
    return 0;
}

static int generate_params(const json_t *body, struct textgen_params *p, bool *load, struct json_err *e)
{
    const char *prompt, *system, *tmpl, *suffix;
    bool raw = false;
    int rc;
    if ((rc = json_opt_string(body, NULL, "prompt", &prompt, e)) ||
        (rc = json_opt_string(body, NULL, "system", &system, e)) ||
        (rc = json_opt_string(body, NULL, "template", &tmpl, e)) ||
        (rc = json_opt_string(body, NULL, "suffix", &suffix, e)) ||
        (rc = json_opt_bool(body, NULL, "raw", &raw, NULL, e)) || (rc = no_images(body, "", e)))
        return rc;
    if (suffix && *suffix)
        return json_fail(e, NULL, "suffix: fill-in-the-middle is not supported");
    const json_t *ctx = json_object_get(body, "context");
    if (ctx && !json_is_null(ctx) && !json_is_array(ctx))
        return json_fail(e, NULL, "context: expected an array");
    *load = !prompt || !*prompt;
    if (*load)
        return 0;
    if (raw) {
        if (!(p->prompt = strdup(prompt)))
            return CAIRN_ENOMEM;
        return 0;
    }
    p->messages = json_array();
    json_t *sys = system && *system ? json_pack("{s:s,s:s}", "role", "system", "content", system) : NULL;
    json_t *user = json_pack("{s:s,s:s}", "role", "user", "content", prompt);
    bool ok = p->messages && user && (!system || !*system || sys) &&
              (!sys || json_array_append(p->messages, sys) == 0) && json_array_append(p->messages, user) == 0;
    json_decref(sys);
    json_decref(user);
    return ok ? 0 : CAIRN_ENOMEM;
}

static int parse_request(enum ollama_route route, const json_t *body, struct textgen_params *p,
                         struct ollama_request *out, struct json_err *e)
{
    if (!json_is_object(body))
        return json_fail(e, NULL, "request body: expected a JSON object");
    int rc = request_model(body, false, &out->model, e);
    if (!rc)
        rc = route == OLLAMA_CHAT ? chat_params(body, p, &out->load, e)
                                  : generate_params(body, p, &out->load, e);
    if (!rc)
        rc = read_common(body, p, &out->stream, &out->unload, e);
    return rc;
}

int ollama_parse_request(enum ollama_route route, const json_t *body, struct textgen_params *p,
                         struct ollama_request *out, struct json_err *e)
{
    *out = (struct ollama_request){.stream = true};
    return apiutil_parse_status(parse_request(route, body, p, out, e), e);
}

/* ---------- models ---------- */

/* The card of name among models (borrowed): an exact id, or "<id>:latest" for an id
 * without a tag. */
static const json_t *find_model(const json_t *models, const char *name)
{
    char canon[HUBREF_TEXT_MAX];
    if (hubref_canonical(name, canon)) /* a pulled model, named as typed */
        name = canon;
    size_t i, n = strlen(name);
    const json_t *m;
    json_array_foreach(models, i, m) {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (id && strcmp(id, name) == 0)
            return m;
    }
    if (n <= 7 || strcmp(name + n - 7, ":latest") != 0)
        return NULL;
    json_array_foreach(models, i, m) {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (id && strlen(id) == n - 7 && strncmp(id, name, n - 7) == 0 && !strchr(id, ':'))
            return m;
    }
    return NULL;
}

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* Parameters of a transformer from its card's shape: embeddings (and the head when not
 * tied), attention and feed-forward weights (of a mixture: every expert and the router),
 * norms. */
static double param_count(const json_t *c)
{
    double layers = num(c, "n_layers"), embd = num(c, "hidden_size"), ff = num(c, "feed_forward_size"),
           heads = num(c, "n_head"), kv = num(c, "n_head_kv"), hd = num(c, "head_dim"),
           vocab = num(c, "vocab_size");
    bool tied = json_is_true(json_object_get(c, "tied_output"));
    double attn = 2 * embd * heads * hd + 2 * embd * kv * hd;
    double experts = num(c, "expert_count");
    double ffn = experts > 0 ? experts * 3 * embd * num(c, "expert_feed_forward_size") + embd * experts : 3 * embd * ff;
    return layers * (attn + ffn + 2 * embd) + embd + vocab * embd * (tied ? 1 : 2);
}

/* Ollama's "parameter_size" ("8.0B", "494.03M"). */
static void human_count(double n, char *buf, size_t cap)
{
    if (n >= 1e9)
        snprintf(buf, cap, "%.1fB", n / 1e9);
    else if (n >= 1e6)
        snprintf(buf, cap, "%.2fM", n / 1e6);
    else if (n >= 1e3)
        snprintf(buf, cap, "%.2fK", n / 1e3);
    else
        snprintf(buf, cap, "%.0f", n);
}

/* The quantization named in a file name ("...-Q4_K_M.gguf"), longest names first so
 * Q4_K_M wins over Q4_K; "unknown" when none. */
static const char *quant_level(const char *file)
{
    static const char *const names[] = {
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
        "IQ4_XS", "IQ4_NL", "TQ1_0", "TQ2_0", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
        "Q5_K_S", "Q5_K_M", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
        "Q8_0", "MXFP4", "BF16", "F16", "F32"};
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n = strlen(names[k]);
        for (const char *s = base; (s = strcasestr(s, names[k])) != NULL; s++) {
            bool left = s == base || !isalnum((unsigned char)s[-1]);
            bool right = !isalnum((unsigned char)s[n]);
            if (left && right)
                return names[k];
        }
    }
    return "unknown";
}

/* "<id>:latest" for an id without a tag, as Ollama lists its models. */
static void listed_name(const char *id, char *dst, size_t cap)
{
    snprintf(dst, cap, "%s%s", id, strchr(id, ':') ? "" : ":latest");
}

static json_t *details_json(const json_t *c)
{
    char size[32];
    human_count(param_count(c), size, sizeof size);
    const char *arch = apiutil_str(c, "architecture");
    return json_pack("{s:s,s:s,s:s,s:[s],s:s,s:s}", "parent_model", "", "format", "gguf", "family", arch,
                     "families", arch, "parameter_size", size, "quantization_level", quant_level(apiutil_str(c, "file")));
}

/* The file's modification time where this node can see the file, else now. */
static void modified_at(const json_t *c, char *buf, size_t cap)
{
    struct stat st;
    if (stat(apiutil_str(c, "file"), &st) == 0)
        rfc3339(buf, cap, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    else
        rfc3339_now(buf, cap);
}

/* One entry of /api/tags (or /api/ps with ps). */
static json_t *model_entry(const json_t *c, bool ps)
{
    char name[IDS_MODEL_MAX + 16], mod[64];
    listed_name(apiutil_str(c, "id"), name, sizeof name);
    modified_at(c, mod, sizeof mod);
    json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:s,s:o}", "name", name, "model", name, "modified_at", mod, "size",
                          (json_int_t)num(c, "bytes"), "digest", apiutil_str(c, "sha256"), "details", details_json(c));
    /* An instance stays until it is deleted: it never expires the way Ollama's do. */
    if (o && ps && !(apiutil_put(o, "expires_at", json_string("9999-12-31T23:59:59Z")) && apiutil_put(o, "size_vram", json_integer(0)))) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static bool usable(const json_t *c)
{
    const json_t *e = json_object_get(c, "error");
    return json_is_string(json_object_get(c, "id")) && (!e || json_is_null(e));
}

static void list_models(struct http_request *req, const struct gen *g, bool ps)
{
    json_t *models = g->ops->models(g->self), *arr = json_array();
    bool ok = models && arr;
    size_t i;
    const json_t *c;
    json_array_foreach(models, i, c) {
        if (!ok || !usable(c) || (ps && !json_is_true(json_object_get(c, "ready"))))
            continue;
        json_t *e = model_entry(c, ps);
        ok = e && json_array_append_new(arr, e) == 0;
    }
    json_decref(models);
    if (!ok) {
        json_decref(arr);
        reply_error(req, 500, "out of memory");
        return;
    }
    http_reply_json(req, 200, json_pack("{s:o}", "models", arr));
}

static void h_tags(struct http_request *req, void *ctx) { list_models(req, ctx, false); }

static void h_ps(struct http_request *req, void *ctx) { list_models(req, ctx, true); }

static void h_version(struct http_request *req, void *ctx)
{
    (void)ctx;
    http_reply_json(req, 200, json_pack("{s:s}", "version", CAIRN_VERSION));
}

static json_t *show_json(const json_t *c)
{
    const char *arch = apiutil_str(c, "architecture");
    const char *tmpl = json_string_value(json_object_get(c, "chat_template"));
    char mod[64], key[96];
    modified_at(c, mod, sizeof mod);
    struct strbuf mf = {0};
    bool ok = strbuf_put(&mf, "# Modelfile generated by cairn\nFROM ", 36) == 0 &&
              strbuf_put(&mf, apiutil_str(c, "file"), strlen(apiutil_str(c, "file"))) == 0 && strbuf_put(&mf, "\n", 1) == 0;
    if (ok && tmpl)
        ok = strbuf_put(&mf, "TEMPLATE \"\"\"", 12) == 0 && strbuf_put(&mf, tmpl, strlen(tmpl)) == 0 &&
             strbuf_put(&mf, "\"\"\"\n", 4) == 0;
    /* an embedding model (pooled) embeds and does not complete, as Ollama lists it */
    const char *pooling = apiutil_str(c, "pooling");
    bool embeds = !strcmp(pooling, "mean") || !strcmp(pooling, "cls") || !strcmp(pooling, "last");
    json_t *info = json_object(), *caps = json_pack("[s]", embeds ? "embedding" : "completion");
    ok = ok && info && caps && apiutil_put(info, "general.architecture", json_string(arch)) &&
         apiutil_put(info, "general.parameter_count", json_integer((json_int_t)param_count(c)));
    if (ok && *apiutil_str(c, "name"))
        ok = apiutil_put(info, "general.name", json_string(apiutil_str(c, "name")));
    static const char *const fields[][2] = {
        {"context_length", "context_length"},     {"embedding_length", "hidden_size"},
        {"block_count", "n_layers"},              {"feed_forward_length", "feed_forward_size"},
        {"attention.head_count", "n_head"},       {"attention.head_count_kv", "n_head_kv"},
        {"attention.key_length", "head_dim"},     {"vocab_size", "vocab_size"}};
    for (size_t i = 0; ok && i < sizeof fields / sizeof fields[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, fields[i][0]);
        ok = apiutil_put(info, key, json_integer((json_int_t)num(c, fields[i][1])));
    }
    if (ok && tmpl && strstr(tmpl, "tools"))
        ok = json_array_append_new(caps, json_string("tools")) == 0;
    if (ok && tmpl && (strstr(tmpl, "<think>") || strstr(tmpl, "enable_thinking") || strstr(tmpl, "reasoning_content")))
        ok = json_array_append_new(caps, json_string("thinking")) == 0;
    json_t *o = ok ? json_pack("{s:s,s:s,s:s,s:s,s:o,s:O,s:O,s:s}", "license", "", "modelfile", apiutil_text(&mf),
                               "parameters", "", "template", tmpl ? tmpl : "", "details", details_json(c),
                               "model_info", info, "capabilities", caps, "modified_at", mod)
                   : NULL;
    json_decref(info);
    json_decref(caps);
    strbuf_free(&mf);
    return o;
}

static void h_show(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const json_t *body = http_req_json(req);
    char err[ERR_MAX];
    const char *name = NULL;
    if (!json_is_object(body)) {
        reply_error(req, 400, "request body: expected a JSON object");
        return;
    }
    struct json_err e = {{0}, {0}};
    if (request_model(body, true, &name, &e)) {
        reply_error(req, 400, e.message);
        return;
    }
    json_t *models = g->ops->models(g->self);
    const json_t *c = models ? find_model(models, name) : NULL;
    if (!models) {
        reply_error(req, 500, "out of memory");
    } else if (!c) {
        snprintf(err, sizeof err, "model '%.*s' not found", NAME_SHOWN, name);
        reply_error(req, 404, err);
    } else {
        json_t *o = show_json(c);
        if (o)
            http_reply_json(req, 200, o);
        else
            reply_error(req, 500, "out of memory");
    }
    json_decref(models);
}

/* ---------- generation ---------- */

/* A generation request's state (apireq's self): set by the handler, then used by the
 * event callback alone. */
struct oreq {
    enum ollama_route kind;
    char *model; /* the name the client gave, echoed */
    int64_t t0, t_start, t_first;
    int64_t prompt_tokens, eval_tokens;
    const char *done_reason;
    struct strbuf content, thinking;
    json_t *tool_calls; /* Ollama-shaped, or NULL */
};

static void oreq_free(void *self)
{
    struct oreq *r = self;
    free(r->model);
    strbuf_free(&r->content);
    strbuf_free(&r->thinking);
    json_decref(r->tool_calls);
    free(r);
}

/* {"model", "created_at"} of every reply object. */
static json_t *reply_base(const struct oreq *r)
{
    char now[64];
    rfc3339_now(now, sizeof now);
    return json_pack("{s:s,s:s}", "model", r->model, "created_at", now);
}

/* Adds the text fields: chat's "message" or generate's "response" (and "thinking"). */
static bool add_text(const struct oreq *r, json_t *o, const char *content, const char *thinking,
                     const json_t *tool_calls)
{
    if (r->kind == OLLAMA_GENERATE)
        return apiutil_put(o, "response", json_string(content)) && (!*thinking || apiutil_put(o, "thinking", json_string(thinking)));
    json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", content);
    return apiutil_put(o, "message", m) && (!*thinking || apiutil_put(m, "thinking", json_string(thinking))) &&
           (!tool_calls || json_object_set(m, "tool_calls", (json_t *)tool_calls) == 0);
}

/* Gen's tool calls (arguments as JSON text) in Ollama's shape (arguments as an object). */
static json_t *tool_calls_out(const json_t *calls)
{
    json_t *arr = json_array();
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const json_t *args = json_object_get(fn, "arguments");
        json_t *obj = json_is_object(args) ? json_deep_copy(args)
                                           : json_loads(json_string_value(args) ? json_string_value(args) : "",
                                                        JSON_DECODE_ANY, NULL);
        if (!json_is_object(obj)) {
            log_warn("ollama: tool call %s: arguments are not a JSON object", apiutil_str(fn, "name"));
            json_decref(obj);
            obj = json_object();
        }
        json_t *o = json_pack("{s:s,s:{s:s,s:o}}", "id", apiutil_str(c, "id"), "function", "name", apiutil_str(fn, "name"),
                              "arguments", obj);
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static void reply_final(struct apireq *a, struct oreq *r)
{
    int64_t t_end = clock_ns(), t_start = r->t_start ? r->t_start : r->t0;
    int64_t t_first = r->t_first ? r->t_first : t_end;
    json_t *o = reply_base(r);
    bool whole = !apireq_streamed(a);
    bool ok = o &&
              add_text(r, o, whole ? apiutil_text(&r->content) : "", whole ? apiutil_text(&r->thinking) : "",
                       whole ? r->tool_calls : NULL) &&
              apiutil_put(o, "done", json_true()) &&
              apiutil_put(o, "done_reason", json_string(r->done_reason ? r->done_reason : "stop")) &&
              apiutil_put(o, "total_duration", json_integer(t_end - r->t0)) &&
              apiutil_put(o, "load_duration", json_integer(t_start - r->t0)) &&
              apiutil_put(o, "prompt_eval_count", json_integer(r->prompt_tokens)) &&
              apiutil_put(o, "prompt_eval_duration", json_integer(t_first - t_start)) &&
              apiutil_put(o, "eval_count", json_integer(r->eval_tokens)) &&
              apiutil_put(o, "eval_duration", json_integer(t_end - t_first));
    if (!ok) {
        json_decref(o);
        apireq_fail(a, 500, "out of memory");
    } else if (whole) {
        apireq_reply(a, o);
    } else {
        apireq_send(a, NULL, o);
        apireq_finish(a);
    }
}

/* A line of a streamed reply that is not the last: text or tool calls. */
static void send_part(struct apireq *a, struct oreq *r, const char *content, const char *thinking,
                      const json_t *tool_calls)
{
    json_t *o = reply_base(r);
    if (o && (!add_text(r, o, content, thinking, tool_calls) || !apiutil_put(o, "done", json_false()))) {
        json_decref(o);
        o = NULL;
    }
    apireq_send(a, NULL, o);
}

static void on_event(struct apireq *a, void *self, const struct gen_event *ev)
{
    struct oreq *r = self;
    bool stream = apireq_streamed(a);
    switch (ev->kind) {
    case GEN_EVENT_START:
        r->t_start = clock_ns();
        r->prompt_tokens = ev->usage.prompt_tokens;
        break;
    case GEN_EVENT_DELTA: {
        const char *c = ev->content ? ev->content : "", *t = ev->reasoning ? ev->reasoning : "";
        if (ev->seq != 0 || (!*c && !*t))
            break;
        if (!r->t_first)
            r->t_first = clock_ns();
        if (stream)
            send_part(a, r, c, t, NULL);
        else if (strbuf_put(&r->content, c, strlen(c)) || strbuf_put(&r->thinking, t, strlen(t)))
            apireq_fail(a, 500, "out of memory");
        break;
    }
    case GEN_EVENT_SEQ_DONE: {
        const char *finish = ev->finish ? ev->finish : "stop";
        if (ev->seq != 0)
            break;
        if (!strcmp(finish, "error") || !strcmp(finish, "cancelled")) {
            apireq_fail(a, 500, !strcmp(finish, "error") ? "generation failed" : "generation was cancelled");
            break;
        }
        r->done_reason = !strcmp(finish, "length") ? "length" : "stop";
        r->eval_tokens = ev->usage.completion_tokens;
        if (!ev->tool_calls || json_array_size(ev->tool_calls) == 0)
            break;
        if (!(r->tool_calls = tool_calls_out(ev->tool_calls)))
            apireq_fail(a, 500, "out of memory");
        else if (stream && r->kind == OLLAMA_CHAT)
            send_part(a, r, "", "", r->tool_calls);
        break;
    }
    case GEN_EVENT_END:
        if (ev->usage.prompt_tokens > 0)
            r->prompt_tokens = ev->usage.prompt_tokens;
        r->eval_tokens = ev->usage.completion_tokens;
        reply_final(a, r);
        break;
    case GEN_EVENT_EMBEDDING: /* not asked for */
    case GEN_EVENT_ERROR: /* apireq's */
        break;
    }
}

static const struct apireq_api OLLAMA_API = {
    .name = "ollama",
    .framing = APIREQ_NDJSON,
    .error_json = ollama_error_json,
    .event = on_event,
    .free = oreq_free,
};

/* Ollama's answer to a request without prompt or messages: the model is "loaded". */
static void reply_load(struct http_request *req, enum ollama_route kind, const char *model, bool unload)
{
    struct oreq shape = {.kind = kind, .model = (char *)model};
    json_t *o = reply_base(&shape);
    if (!o || !add_text(&shape, o, "", "", NULL) || !apiutil_put(o, "done", json_true()) ||
        !apiutil_put(o, "done_reason", json_string(unload ? "unload" : "load"))) {
        json_decref(o);
        reply_error(req, 500, "out of memory");
        return;
    }
    http_reply_json(req, 200, o);
}

static void generate(struct http_request *req, const struct gen *g, enum ollama_route kind)
{
    int64_t t0 = clock_ns();
    char err[ERR_MAX] = "";
    struct textgen_params p;
    struct ollama_request o;
    struct json_err e = {{0}, {0}};
    textgen_params_init(&p);
    int status = ollama_parse_request(kind, http_req_json(req), &p, &o, &e);
    if (status) {
        textgen_params_clear(&p);
        reply_error(req, status, e.message);
        return;
    }
    const char *name = o.model;
    json_t *models = g->ops->models(g->self);
    const json_t *card = models ? find_model(models, name) : NULL;
    if (card)
        snprintf(p.model, sizeof p.model, "%s", apiutil_str(card, "id"));
    json_decref(models);
    if (!card) {
        textgen_params_clear(&p);
        if (!models) {
            reply_error(req, 500, "out of memory");
        } else {
            apiutil_missing_model(name, err, sizeof err);
            reply_error(req, 404, err);
        }
        return;
    }
    if (o.load) {
        textgen_params_clear(&p);
        reply_load(req, kind, name, o.unload);
        return;
    }

    struct oreq *r = calloc(1, sizeof *r);
    if (!r || !(r->model = strdup(name))) {
        free(r);
        textgen_params_clear(&p);
        reply_error(req, 500, "out of memory");
        return;
    }
    r->kind = kind;
    r->t0 = t0;
    apireq_run(req, g, &OLLAMA_API, r, o.stream, &p);
}

static void h_chat(struct http_request *req, void *ctx) { generate(req, ctx, OLLAMA_CHAT); }

static void h_generate(struct http_request *req, void *ctx) { generate(req, ctx, OLLAMA_GENERATE); }

/* Paths under /api that Ollama has and cairn does not (embed, pull, ...): answered in
 * Ollama's error shape, so its clients show the message. */
static void h_unknown(struct http_request *req, void *ctx)
{
    (void)ctx;
    char msg[300];
    snprintf(msg, sizeof msg, "%.200s %s is not served by cairn", http_req_method(req), http_req_path(req));
    reply_error(req, 404, msg);
}

int ollama_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen)
{
    static const struct {
        const char *method, *path;
        http_handler_fn fn;
    } routes[] = {
        {"POST", "/api/chat", h_chat}, {"POST", "/api/generate", h_generate}, {"GET", "/api/tags", h_tags},
        {"POST", "/api/show", h_show}, {"GET", "/api/ps", h_ps},             {"GET", "/api/version", h_version},
        {"POST", "/api/pull", ollama_h_pull}, {"DELETE", "/api/delete", ollama_h_delete},
        {"GET", "/api/*rest", h_unknown}, {"POST", "/api/*rest", h_unknown}, {"DELETE", "/api/*rest", h_unknown},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int rc = http_route_errors(srv, routes[i].method, routes[i].path, routes[i].fn, (void *)g, ollama_error_json);
        if (rc)
            return cairn_fail(err, errlen, rc, "ollama: route %s %s: %s", routes[i].method, routes[i].path,
                              cairn_strerror(rc));
    }
    return 0;
}
