/* Anthropic Messages endpoint (anthropic.h).
 *
 * A request lives in a struct areq shared by the handler (until it returns), the
 * backend (until END or ERROR was delivered, or cancel returned) and the stream's close
 * callback. The first two hold a reference each; the close callback holds none but
 * cannot outlive the stream, which is released only with the last reference. Who ends
 * the generation is decided under r->mu: the event callback at END or ERROR unless a
 * cancel was claimed first, in which case the canceller drops the generation's
 * reference once cancel has returned (no callback runs after that). */
#include "api/anthropic.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/sse.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "cluster/ids.h"

#define ERR_MAX 512
#define NAME_SHOWN 300 /* bytes of a client's model name quoted in an error */

/* ---------- small helpers ---------- */

/* A growable NUL-terminated text. */
struct tbuf {
    char *p;
    size_t len, cap;
};

static int tbuf_add(struct tbuf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 4 - b->len)
        return CAIRN_ENOMEM;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return CAIRN_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static const char *tbuf_str(const struct tbuf *b) { return b->p ? b->p : ""; }

static void tbuf_free(struct tbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)clock_ns() * 0x9e3779b97f4a7c15ull;
    return v;
}

/* prefix and 24 random hex digits ("msg_...", "toolu_..."). */
static void random_id(char *dst, size_t cap, const char *prefix)
{
    uint64_t a = random_u64(), b = random_u64();
    snprintf(dst, cap, "%s%016llx%08llx", prefix, (unsigned long long)a, (unsigned long long)(b & 0xffffffffu));
}

/* A JSON string of text that may hold invalid UTF-8 (a backend message): such bytes
 * become '?'. */
static json_t *text_json(const char *text)
{
    json_t *j = json_string(text ? text : "");
    if (j || !text)
        return j;
    char *copy = strdup(text);
    if (!copy)
        return NULL;
    for (char *c = copy; *c; c++)
        if ((unsigned char)*c >= 0x80)
            *c = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

static bool put(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0; }

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

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
static json_t *error_json(int status, const char *msg)
{
    json_t *e = json_pack("{s:s}", "type", error_type(status));
    if (!e || !put(e, "message", text_json(msg))) {
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
    if (status == 529)
        http_reply_header(req, "Retry-After", "1");
    http_reply_json(req, status, error_json(status, msg));
}

/* ---------- checked request members ---------- */

/* Optional number member in [lo, hi] ((lo, hi] with lo_open); absent or null leaves
 * *out. */
static int opt_number(const json_t *o, const char *key, double lo, double hi, bool lo_open, float *out,
                      char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, key);
    if (absent(v))
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected a number in %c%g, %g]", key,
                          lo_open ? '(' : '[', lo, hi);
    *out = (float)d;
    return 0;
}

/* An integer (or a real with an integral value) into *out; false when v is neither. */
static bool int_value(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    double d = json_real_value(v);
    if (json_is_real(v) && isfinite(d) && d == floor(d) && fabs(d) < 9.0e15) {
        *out = (int64_t)d;
        return true;
    }
    return false;
}

/* ---------- messages ---------- */

/* Text blocks ([{"type": "text", "text"}]) or a string, joined with "\n" into out. */
static int text_blocks(const json_t *c, const char *path, struct tbuf *out, char *err, size_t errlen)
{
    if (absent(c))
        return 0;
    if (json_is_string(c))
        return tbuf_add(out, json_string_value(c), json_string_length(c)) ? cairn_fail(err, errlen, CAIRN_ENOMEM,
                                                                                        "out of memory")
                                                                          : 0;
    if (!json_is_array(c))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected a string or an array of text blocks", path);
    size_t j;
    const json_t *b;
    json_array_foreach(c, j, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        const json_t *text = json_object_get(b, "text");
        if (!type)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu].type: expected a string", path, j);
        if (!strcmp(type, "image") || !strcmp(type, "document"))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu]: %s content is not supported (text models only)",
                              path, j, type);
        if (strcmp(type, "text") != 0)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu].type: expected \"text\"", path, j);
        if (!json_is_string(text))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu].text: expected a string", path, j);
        if ((j > 0 && tbuf_add(out, "\n", 1)) || tbuf_add(out, json_string_value(text), json_string_length(text)))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    return 0;
}

static int append_msg(json_t *out, const char *role, const char *content, char *err, size_t errlen)
{
    json_t *m = json_pack("{s:s,s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(out, m) != 0)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    return 0;
}

/* Refuses a block that no message may hold here; 0 for the types the caller handles. */
static int other_block(const char *type, const char *path, char *err, size_t errlen)
{
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: %s content is not supported (text models only)", path,
                          type);
    return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.type: unsupported content block type '%.64s'", path, type);
}

/* A user message's blocks: text joined into a user message, each tool_result a "tool"
 * message, in their order. */
static int user_blocks(const json_t *blocks, const char *path, json_t *out, char *err, size_t errlen)
{
    struct tbuf text = {0};
    bool have_text = false, emitted = false;
    int rc = 0;
    size_t j;
    const json_t *b;
    json_array_foreach(blocks, j, b) {
        char bp[128];
        snprintf(bp, sizeof bp, "%s[%zu]", path, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.type: expected a string", bp);
            break;
        }
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.text: expected a string", bp);
                break;
            }
            if ((have_text && tbuf_add(&text, "\n", 1)) || tbuf_add(&text, json_string_value(t), json_string_length(t))) {
                rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
                break;
            }
            have_text = true;
        } else if (!strcmp(type, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id"), *is_err = json_object_get(b, "is_error");
            if (!json_is_string(id) || json_string_length(id) == 0) {
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.tool_use_id: expected a string", bp);
                break;
            }
            if (!absent(is_err) && !json_is_boolean(is_err)) {
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.is_error: expected true or false", bp);
                break;
            }
            if (have_text) { /* text before a result stays before it */
                if ((rc = append_msg(out, "user", tbuf_str(&text), err, errlen)))
                    break;
                tbuf_free(&text);
                have_text = false;
            }
            struct tbuf result = {0};
            char cp[144];
            snprintf(cp, sizeof cp, "%s.content", bp);
            rc = text_blocks(json_object_get(b, "content"), cp, &result, err, errlen);
            json_t *m = rc ? NULL
                           : json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id", (json_t *)id, "content",
                                       tbuf_str(&result));
            tbuf_free(&result);
            if (!rc && (!m || json_array_append_new(out, m) != 0))
                rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            if (rc)
                break;
            emitted = true;
        } else if (!strcmp(type, "tool_use") || !strcmp(type, "thinking")) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.type: %s blocks belong to assistant messages", bp, type);
            break;
        } else {
            rc = other_block(type, bp, err, errlen);
            break;
        }
    }
    if (!rc && (have_text || !emitted))
        rc = append_msg(out, "user", tbuf_str(&text), err, errlen);
    tbuf_free(&text);
    return rc;
}

/* An assistant message's blocks: text, thinking as reasoning_content, tool_use as
 * tool_calls with the input as the arguments object. */
static int assistant_blocks(const json_t *blocks, const char *path, json_t *out, char *err, size_t errlen)
{
    struct tbuf text = {0}, thinking = {0};
    json_t *calls = json_array(), *m = NULL;
    int rc = calls ? 0 : cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    size_t j;
    const json_t *b;
    json_array_foreach(blocks, j, b) {
        if (rc)
            break;
        char bp[128];
        snprintf(bp, sizeof bp, "%s[%zu]", path, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.type: expected a string", bp);
        } else if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            bool is_text = !strcmp(type, "text");
            const json_t *t = json_object_get(b, type);
            struct tbuf *dst = is_text ? &text : &thinking;
            if (!json_is_string(t))
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: expected a string", bp, type);
            else if ((dst->len && tbuf_add(dst, "\n", 1)) || tbuf_add(dst, json_string_value(t), json_string_length(t)))
                rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        } else if (!strcmp(type, "redacted_thinking")) {
            continue; /* opaque: nothing a local model can read */
        } else if (!strcmp(type, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
                         *input = json_object_get(b, "input");
            json_t *call = NULL;
            if (!json_is_string(id) || json_string_length(id) == 0)
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.id: expected a string", bp);
            else if (!json_is_string(name) || json_string_length(name) == 0)
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.name: expected a string", bp);
            else if (!absent(input) && !json_is_object(input))
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.input: expected an object", bp);
            else if (!(call = json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", (json_t *)id, "type", "function", "function",
                                        "name", (json_t *)name, "arguments",
                                        absent(input) ? json_object() : json_deep_copy(input))) ||
                     json_array_append_new(calls, call) != 0)
                rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        } else if (!strcmp(type, "tool_result")) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.type: tool_result blocks belong to user messages", bp);
        } else {
            rc = other_block(type, bp, err, errlen);
        }
    }
    if (!rc) {
        m = json_pack("{s:s,s:s}", "role", "assistant", "content", tbuf_str(&text));
        if (!m || json_array_append_new(out, m) != 0 ||
            (thinking.len && !put(m, "reasoning_content", json_string(tbuf_str(&thinking)))) ||
            (json_array_size(calls) && json_object_set(m, "tool_calls", calls) != 0))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    json_decref(calls);
    tbuf_free(&text);
    tbuf_free(&thinking);
    return rc;
}

static int read_messages(const json_t *body, json_t *out, char *err, size_t errlen)
{
    const json_t *sys = json_object_get(body, "system"), *msgs = json_object_get(body, "messages");
    struct tbuf st = {0};
    int rc = text_blocks(sys, "system", &st, err, errlen);
    if (!rc && st.len)
        rc = append_msg(out, "system", tbuf_str(&st), err, errlen);
    tbuf_free(&st);
    if (rc)
        return rc;
    if (absent(msgs))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages: field required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages: expected a non-empty array");
    if (json_array_size(msgs) > TEXTGEN_MAX_MESSAGES)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages: at most %d messages", TEXTGEN_MAX_MESSAGES);
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char path[64];
        snprintf(path, sizeof path, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        if (!json_is_object(m))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected an object", path);
        if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.role: expected \"user\" or \"assistant\"", path);
        bool user = !strcmp(role, "user");
        char cp[80];
        snprintf(cp, sizeof cp, "%s.content", path);
        if (json_is_string(c))
            rc = append_msg(out, role, json_string_value(c), err, errlen);
        else if (json_is_array(c))
            rc = user ? user_blocks(c, cp, out, err, errlen) : assistant_blocks(c, cp, out, err, errlen);
        else
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected a string or an array of content blocks", cp);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---------- tools, thinking, the rest ---------- */

static int read_tools(const json_t *body, struct textgen_params *p, char *err, size_t errlen)
{
    const json_t *tools = json_object_get(body, "tools"), *choice = json_object_get(body, "tool_choice");
    if (!absent(tools)) {
        if (!json_is_array(tools))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools: expected an array");
        if (json_array_size(tools) && !(p->tools = json_array()))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name"),
                         *desc = json_object_get(t, "description"), *schema = json_object_get(t, "input_schema");
            if (!json_is_object(t))
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools[%zu]: expected an object", i);
            if (!absent(type) && !(json_is_string(type) && !strcmp(json_string_value(type), "custom")))
                return cairn_fail(err, errlen, CAIRN_EFORMAT,
                                  "tools[%zu].type: only client tools (\"custom\", with input_schema) are supported", i);
            if (!json_is_string(name) || json_string_length(name) == 0)
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools[%zu].name: expected a string", i);
            if (!absent(desc) && !json_is_string(desc))
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools[%zu].description: expected a string", i);
            if (!json_is_object(schema))
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools[%zu].input_schema: expected an object", i);
            json_t *f = json_pack("{s:O,s:O}", "name", (json_t *)name, "parameters", (json_t *)schema);
            json_t *o = f ? json_pack("{s:s,s:o}", "type", "function", "function", f) : NULL;
            if (!o || json_array_append_new(p->tools, o) != 0 ||
                (json_is_string(desc) && json_object_set(f, "description", (json_t *)desc) != 0))
                return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        }
    }
    if (absent(choice))
        return 0;
    const char *type = json_string_value(json_object_get(choice, "type"));
    const json_t *dp = json_object_get(choice, "disable_parallel_tool_use");
    if (!json_is_object(choice))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tool_choice: expected an object");
    if (!type || (strcmp(type, "auto") && strcmp(type, "any") && strcmp(type, "tool") && strcmp(type, "none")))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tool_choice.type: expected auto, any, tool or none");
    if (!absent(dp) && !json_is_boolean(dp))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tool_choice.disable_parallel_tool_use: expected true or false");
    if (!strcmp(type, "none")) {
        json_decref(p->tools);
        p->tools = NULL;
    } else if (!strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(choice, "name"));
        if (!name)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "tool_choice.name: expected a string");
        json_t *only = NULL;
        size_t i;
        json_t *t;
        json_array_foreach(p->tools, i, t)
            if (!only && !strcmp(str(json_object_get(t, "function"), "name"), name))
                only = json_pack("[O]", t);
        if (!only)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "tool_choice.name: no tool named '%.64s'", name);
        json_decref(p->tools);
        p->tools = only;
    }
    return 0;
}

static int read_thinking(const json_t *body, struct textgen_params *p, char *err, size_t errlen)
{
    const json_t *t = json_object_get(body, "thinking");
    if (absent(t))
        return 0;
    if (!json_is_object(t))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "thinking: expected an object");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "thinking.type: expected enabled, disabled or adaptive");
    const json_t *budget = json_object_get(t, "budget_tokens");
    int64_t b;
    if (!absent(budget) && (!int_value(budget, &b) || b < 1))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "thinking.budget_tokens: expected an integer >= 1");
    if (!(p->template_kwargs = json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled") != 0)))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    return 0;
}

static int read_stop(const json_t *body, struct textgen_params *p, char *err, size_t errlen)
{
    const json_t *stop = json_object_get(body, "stop_sequences");
    if (absent(stop))
        return 0;
    if (!json_is_array(stop) || json_array_size(stop) > TEXTGEN_MAX_STOP)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "stop_sequences: expected an array of at most %d strings",
                          TEXTGEN_MAX_STOP);
    size_t i;
    const json_t *v;
    json_array_foreach(stop, i, v) {
        size_t len = json_string_length(v);
        if (!json_is_string(v) || len < 1 || len > TEXTGEN_MAX_STOP_BYTES)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "stop_sequences[%zu]: expected a string of 1..%d bytes", i,
                              TEXTGEN_MAX_STOP_BYTES);
        if (!(p->stop[p->n_stop] = strdup(json_string_value(v))))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        p->n_stop++;
    }
    return 0;
}

/* The whole request into p (textgen_params_init'ed); *model borrowed from body. */
static int read_request(const json_t *body, struct textgen_params *p, bool *stream, const char **model, char *err,
                        size_t errlen)
{
    const json_t *m = json_object_get(body, "model"), *mt = json_object_get(body, "max_tokens"),
                 *st = json_object_get(body, "stream"), *meta = json_object_get(body, "metadata"),
                 *tk = json_object_get(body, "top_k");
    int64_t n;
    int rc;
    if (absent(m))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "model: field required");
    if (!json_is_string(m) || json_string_length(m) == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "model: expected a non-empty string");
    *model = json_string_value(m);
    if (absent(mt))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "max_tokens: field required");
    if (!int_value(mt, &n) || n < 1)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "max_tokens: expected an integer >= 1");
    p->max_tokens = n > RUNNER_MAX_GENERATE ? RUNNER_MAX_GENERATE : n;
    if (!absent(st) && !json_is_boolean(st))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "stream: expected true or false");
    *stream = json_is_true(st);
    if (!absent(meta) && !json_is_object(meta))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata: expected an object");
    if (!absent(tk) && (!int_value(tk, &n) || n < 0 || n > (1 << 24)))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "top_k: expected an integer in [0, %d]", 1 << 24);
    if (!absent(tk))
        p->sampling.top_k = (int)n;
    p->sampling.seed = random_u64() & (((uint64_t)1 << 53) - 1);
    if ((rc = opt_number(body, "temperature", 0, 1, false, &p->sampling.temperature, err, errlen)) ||
        (rc = opt_number(body, "top_p", 0, 1, true, &p->sampling.top_p, err, errlen)) ||
        (rc = read_stop(body, p, err, errlen)) || (rc = read_tools(body, p, err, errlen)) ||
        (rc = read_thinking(body, p, err, errlen)))
        return rc;
    if (!(p->messages = json_array()))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    return read_messages(body, p->messages, err, errlen);
}

/* ---------- generation ---------- */

enum block { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING };

struct areq {
    pthread_mutex_t mu; /* the lifecycle fields below */
    int refs;           /* the handler's and the generation's */
    bool gen_live;      /* events may still come */
    bool have_handle, cancel_wanted, cancelling;
    uint64_t handle;

    /* Set by the handler before submit, then used by the event callbacks alone (events
     * of one request come one at a time, in order). */
    const struct gen *g;
    struct http_stream *s;
    bool stream;
    bool started; /* START seen */
    bool over;    /* the reply is complete, or failed */
    char *model;  /* the name the client gave, echoed */
    char id[48];
    char *stops[TEXTGEN_MAX_STOP]; /* the client's stop sequences */
    int n_stops;
    int64_t prompt_tokens, cached_tokens, output_tokens;
    const char *stop_reason;
    char *stop_sequence;
    int next_index;  /* streamed: index of the next content block */
    enum block open; /* streamed: the block being written */
    struct tbuf text, thinking; /* whole reply */
    json_t *tool_uses;          /* whole reply: tool_use blocks */
};

static void areq_unref(struct areq *r)
{
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    /* The last reference may go inside the stream's close callback (after a cancel);
     * releasing there is safe: http.c's release skips waiting for the callback running
     * on its own thread, and the thread that fired it holds its own reference. */
    http_stream_release(r->s);
    pthread_mutex_destroy(&r->mu);
    free(r->model);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    free(r->stop_sequence);
    tbuf_free(&r->text);
    tbuf_free(&r->thinking);
    json_decref(r->tool_uses);
    free(r);
}

/* Cancels the generation (claimed by setting cancelling) and drops its reference. */
static void areq_cancel(struct areq *r)
{
    r->g->ops->cancel(r->g->self, r->handle);
    pthread_mutex_lock(&r->mu);
    r->gen_live = false;
    pthread_mutex_unlock(&r->mu);
    areq_unref(r);
}

/* Close callback: the client went away or the server is stopping. */
static void on_close(void *arg, struct http_stream *s, enum http_stream_state why)
{
    struct areq *r = arg;
    (void)s;
    (void)why;
    pthread_mutex_lock(&r->mu);
    bool cancel = false;
    if (r->gen_live && !r->cancelling) {
        if (r->have_handle)
            cancel = r->cancelling = true;
        else
            r->cancel_wanted = true; /* submit has not returned: the handler cancels */
    }
    pthread_mutex_unlock(&r->mu);
    if (cancel)
        areq_cancel(r);
}

/* Sends one event whose data is j (taken); a failed write ends the reply. */
static void send_event(struct areq *r, const char *event, json_t *j)
{
    if (!j || sse_json(r->s, event, j) != 0)
        r->over = true;
    json_decref(j);
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
    bool ok = o && put(o, "stop_reason", final ? json_string(r->stop_reason) : json_null()) &&
              put(o, "stop_sequence", final && r->stop_sequence ? json_string(r->stop_sequence) : json_null()) &&
              put(o, "usage", usage_json(r, final ? r->output_tokens : 0));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void fail(struct areq *r, int backend_status, const char *msg)
{
    char text[ERR_MAX];
    int status = anthropic_status(backend_status, msg, text, sizeof text);
    r->over = true;
    if (r->stream && r->started) {
        json_t *e = error_json(status, text);
        if (e)
            sse_json(r->s, "error", e);
        json_decref(e);
        http_stream_finish(r->s);
        return;
    }
    if (status == 529)
        http_stream_header(r->s, "Retry-After", "1");
    http_stream_reply_json(r->s, status, error_json(status, text));
}

static void close_block(struct areq *r)
{
    if (r->open == BLOCK_NONE)
        return;
    r->open = BLOCK_NONE;
    send_event(r, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", r->next_index - 1));
}

static void open_block(struct areq *r, json_t *block)
{
    send_event(r, "content_block_start",
               json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", r->next_index, "content_block", block));
    r->next_index++;
}

/* Streams text into a block of kind, opening one when another kind is open. */
static void block_delta(struct areq *r, enum block kind, const char *text)
{
    bool is_text = kind == BLOCK_TEXT;
    if (r->open != kind) {
        close_block(r);
        open_block(r, is_text ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                              : json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
        r->open = kind;
    }
    send_event(r, "content_block_delta",
               json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", r->next_index - 1, "delta",
                         "type", is_text ? "text_delta" : "thinking_delta", is_text ? "text" : "thinking", text));
}

/* Gen's tool call as a tool_use block (input: the arguments parsed as an object). */
static json_t *tool_use_json(const json_t *call)
{
    const json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
    json_t *input = json_is_object(args) ? json_deep_copy(args)
                                         : json_loads(json_string_value(args) ? json_string_value(args) : "",
                                                      JSON_DECODE_ANY, NULL);
    if (!json_is_object(input)) {
        log_warn("anthropic: tool call %s: arguments are not a JSON object", str(fn, "name"));
        json_decref(input);
        input = json_object();
    }
    char idbuf[48];
    const char *id = str(call, "id");
    if (!*id) {
        random_id(idbuf, sizeof idbuf, "toolu_");
        id = idbuf;
    }
    return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", id, "name", str(fn, "name"), "input", input);
}

static void seq_done(struct areq *r, const struct gen_event *ev)
{
    const char *finish = ev->finish ? ev->finish : "stop";
    if (!strcmp(finish, "error") || !strcmp(finish, "cancelled")) {
        fail(r, 500, !strcmp(finish, "error") ? "generation failed" : "generation was cancelled");
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
            fail(r, 500, "out of memory");
            return;
        }
        if (!r->stream) {
            if (json_array_append_new(r->tool_uses, b) != 0)
                fail(r, 500, "out of memory");
            continue;
        }
        close_block(r);
        json_t *input = json_incref(json_object_get(b, "input"));
        char *partial = json_dumps(input, JSON_COMPACT);
        json_object_set_new(b, "input", json_object());
        open_block(r, b);
        send_event(r, "content_block_delta",
                   partial ? json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", r->next_index - 1,
                                       "delta", "type", "input_json_delta", "partial_json", partial)
                           : NULL);
        send_event(r, "content_block_stop",
                   json_pack("{s:s,s:i}", "type", "content_block_stop", "index", r->next_index - 1));
        free(partial);
        json_decref(input);
    }
}

static void end(struct areq *r, const struct gen_event *ev)
{
    if (ev->usage.prompt_tokens > 0) {
        r->prompt_tokens = ev->usage.prompt_tokens;
        r->cached_tokens = ev->usage.cached_tokens;
    }
    r->output_tokens = ev->usage.completion_tokens;
    if (!r->stop_reason)
        r->stop_reason = "end_turn";
    if (r->stream) {
        close_block(r);
        if (r->next_index == 0) { /* nothing came: one empty text block, as a reply has */
            open_block(r, json_pack("{s:s,s:s}", "type", "text", "text", ""));
            r->open = BLOCK_TEXT;
            close_block(r);
        }
        send_event(r, "message_delta",
                   json_pack("{s:s,s:{s:s,s:o},s:{s:I}}", "type", "message_delta", "delta", "stop_reason",
                             r->stop_reason, "stop_sequence", r->stop_sequence ? json_string(r->stop_sequence) : json_null(),
                             "usage", "output_tokens", (json_int_t)r->output_tokens));
        send_event(r, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        r->over = true;
        http_stream_finish(r->s);
        return;
    }
    json_t *content = json_array();
    bool ok = content != NULL;
    if (ok && r->thinking.len)
        ok = json_array_append_new(content, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                                                      tbuf_str(&r->thinking), "signature", "")) == 0;
    if (ok && (r->text.len || (!r->thinking.len && !json_array_size(r->tool_uses))))
        ok = json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", tbuf_str(&r->text))) == 0;
    ok = ok && json_array_extend(content, r->tool_uses) == 0;
    json_t *msg = ok ? message_json(r, content, true) : NULL;
    if (!ok)
        json_decref(content);
    if (!msg) {
        fail(r, 500, "out of memory");
        return;
    }
    r->over = true;
    http_stream_reply_json(r->s, 200, msg);
}

static void handle_event(struct areq *r, const struct gen_event *ev)
{
    if (r->over)
        return;
    switch (ev->kind) {
    case GEN_EVENT_START:
        r->started = true;
        r->prompt_tokens = ev->usage.prompt_tokens;
        r->cached_tokens = ev->usage.cached_tokens;
        if (!r->stream)
            break;
        if (sse_start_deferred(r->s) != 0) {
            r->over = true;
            break;
        }
        send_event(r, "message_start",
                   json_pack("{s:s,s:o}", "type", "message_start", "message", message_json(r, json_array(), false)));
        send_event(r, "ping", json_pack("{s:s}", "type", "ping"));
        break;
    case GEN_EVENT_DELTA: {
        const char *c = ev->content ? ev->content : "", *t = ev->reasoning ? ev->reasoning : "";
        if (ev->seq != 0)
            break;
        if (*t && r->stream)
            block_delta(r, BLOCK_THINKING, t);
        else if (*t && tbuf_add(&r->thinking, t, strlen(t)))
            fail(r, 500, "out of memory");
        if (*c && r->stream && !r->over)
            block_delta(r, BLOCK_TEXT, c);
        else if (*c && !r->stream && tbuf_add(&r->text, c, strlen(c)))
            fail(r, 500, "out of memory");
        break;
    }
    case GEN_EVENT_SEQ_DONE:
        if (ev->seq == 0)
            seq_done(r, ev);
        break;
    case GEN_EVENT_END:
        end(r, ev);
        break;
    case GEN_EVENT_ERROR:
        fail(r, ev->status, ev->message && *ev->message ? ev->message : "generation failed");
        break;
    }
}

static void on_event(void *arg, const struct gen_event *ev)
{
    struct areq *r = arg;
    pthread_mutex_lock(&r->mu);
    bool cancelling = r->cancelling;
    pthread_mutex_unlock(&r->mu);
    if (!cancelling)
        handle_event(r, ev);
    if (ev->kind != GEN_EVENT_END && ev->kind != GEN_EVENT_ERROR)
        return;
    pthread_mutex_lock(&r->mu);
    bool mine = !r->cancelling; /* else the canceller drops the reference */
    if (mine)
        r->gen_live = false;
    pthread_mutex_unlock(&r->mu);
    if (mine)
        areq_unref(r);
}

static void h_messages(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const json_t *body = http_req_json(req);
    char err[ERR_MAX] = "";
    const char *model = NULL;
    bool stream = false;
    struct textgen_params p;
    textgen_params_init(&p);
    if (!json_is_object(body)) {
        reply_error(req, 400, "request body: expected a JSON object");
        return;
    }
    int rc = read_request(body, &p, &stream, &model, err, sizeof err);
    if (rc) {
        textgen_params_clear(&p);
        reply_error(req, rc == CAIRN_ENOMEM ? 500 : 400, err);
        return;
    }
    if (!ids_valid_model(model)) { /* no model can have that id */
        textgen_params_clear(&p);
        snprintf(err, sizeof err, "model '%.*s' not found", NAME_SHOWN, model);
        reply_error(req, 404, err);
        return;
    }
    snprintf(p.model, sizeof p.model, "%s", model);

    struct areq *r = calloc(1, sizeof *r);
    bool ok = r && (r->model = strdup(model)) && (r->tool_uses = json_array());
    for (int i = 0; ok && i < p.n_stop; i++)
        ok = (r->stops[r->n_stops++] = strdup(p.stop[i])) != NULL;
    if (!ok || http_reply_defer(req, &r->s) != 0) {
        if (r) {
            for (int i = 0; i < r->n_stops; i++)
                free(r->stops[i]);
            free(r->model);
            json_decref(r->tool_uses);
        }
        free(r);
        textgen_params_clear(&p);
        reply_error(req, 500, "out of memory");
        return;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->refs = 2;
    r->gen_live = true;
    r->g = g;
    r->stream = stream;
    random_id(r->id, sizeof r->id, "msg_");
    http_stream_on_close(r->s, on_close, r);

    uint64_t handle = 0;
    err[0] = 0;
    int status = g->ops->submit(g->self, &p, on_event, r, &handle, err, sizeof err);
    textgen_params_clear(&p); /* submit took what p owned */
    if (status != 0) {
        pthread_mutex_lock(&r->mu);
        r->gen_live = false;
        pthread_mutex_unlock(&r->mu);
        fail(r, status, err[0] ? err : "request refused");
        areq_unref(r); /* no event will come */
    } else {
        pthread_mutex_lock(&r->mu);
        r->handle = handle;
        r->have_handle = true;
        bool cancel = r->cancel_wanted && r->gen_live && !r->cancelling;
        if (cancel)
            r->cancelling = true;
        pthread_mutex_unlock(&r->mu);
        if (cancel)
            areq_cancel(r);
    }
    areq_unref(r);
}

int anthropic_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen)
{
    int rc = http_route(srv, "POST", "/v1/messages", h_messages, (void *)g);
    if (rc)
        return cairn_fail(err, errlen, rc, "anthropic: route POST /v1/messages: %s", cairn_strerror(rc));
    return 0;
}
