/* A conversation through a node's OpenAI API (chat.h). */
#include "cli/convo.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/strbuf.h"

#define TOOL_CALLS_MAX 64
#define ANSWER_MAX ((size_t)64 << 20) /* text kept of one answer; more is refused */

#define DIM "\033[2m"
#define BOLD_CYAN "\033[1;36m"
#define RESET "\033[0m"

/* The sampling settings /set knows: the request member, its range and whether it is a
 * whole number. */
static const struct setting {
    const char *name;
    double lo, hi;
    bool integer;
} settings[] = {
    {"temperature", 0, 2, false},      {"top_p", 0, 1, false},   {"top_k", -1, 1 << 24, true},
    {"min_p", 0, 1, false},            {"seed", -1, 1e15, true}, {"max_tokens", 1, 1 << 24, true},
    {"repeat_penalty", 0, 10, false},  {"presence_penalty", -2, 2, false},
    {"frequency_penalty", -2, 2, false}, {"num_draft_tokens", 0, 32, true},
};

int convo_init(struct convo *c, const struct client *api, const char *model, bool color, bool json, FILE *out)
{
    *c = (struct convo){.api = *api, .color = color, .json = json, .out = out};
    snprintf(c->model, sizeof c->model, "%s", model);
    c->messages = json_array();
    c->options = json_object();
    if (!c->messages || !c->options) {
        convo_release(c);
        return CAIRN_ENOMEM;
    }
    return 0;
}

void convo_release(struct convo *c)
{
    json_decref(c->messages);
    json_decref(c->options);
    c->messages = c->options = NULL;
}

static bool is_system(const json_t *m)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && !strcmp(role, "system");
}

int convo_set_system(struct convo *c, const char *text)
{
    json_t *first = json_array_get(c->messages, 0);
    if (first && is_system(first))
        json_array_remove(c->messages, 0);
    if (!text || !text[0])
        return 0;
    json_t *m = json_pack("{s:s,s:s}", "role", "system", "content", text);
    return m && !json_array_insert_new(c->messages, 0, m) ? 0 : CAIRN_ENOMEM;
}

int convo_set_option(struct convo *c, const char *name, const char *value, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        const struct setting *s = &settings[i];
        if (strcmp(name, s->name))
            continue;
        if (!strcmp(value, "default")) {
            json_object_del(c->options, name);
            return 0;
        }
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v) || v < s->lo || v > s->hi || (s->integer && v != floor(v)))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "%s: a %s from %g to %g (or 'default')", name,
                              s->integer ? "whole number" : "number", s->lo, s->hi);
        json_t *j = s->integer ? json_integer((json_int_t)v) : json_real(v);
        return j && !json_object_set_new(c->options, name, j) ? 0 : CAIRN_ENOMEM;
    }
    char names[512] = "";
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", settings[i].name);
    return cairn_fail(err, errlen, CAIRN_EINVAL, "no setting '%s' (system, %s)", name, names);
}

void convo_show_settings(const struct convo *c, FILE *f)
{
    const char *key;
    json_t *v;
    if (!json_object_size(c->options))
        fprintf(f, "sampling: the model's defaults\n");
    json_object_foreach(c->options, key, v) {
        if (json_is_integer(v))
            fprintf(f, "%s %lld\n", key, (long long)json_integer_value(v));
        else
            fprintf(f, "%s %g\n", key, json_real_value(v));
    }
    json_t *first = json_array_get(c->messages, 0);
    if (first && is_system(first))
        fprintf(f, "system \"%s\"\n", json_string_value(json_object_get(first, "content")));
}

/* ---- one answer ---- */

/* A tool call as its deltas build it. */
struct tool_call {
    struct strbuf id, name, args;
};

/* What one streamed answer has said so far. */
struct answer {
    struct convo *c;
    struct strbuf content, reasoning;
    struct tool_call calls[TOOL_CALLS_MAX];
    int n_calls;
    bool in_reasoning; /* the dim reasoning text is open on the terminal */
    bool done;         /* [DONE] came */
    bool any_text;     /* something was printed */
    int64_t t0, t_first, t_end;
    char error[512];
    json_t *usage, *timings;
    char finish[32];
};

static void print_text(struct answer *a, const char *text, bool reasoning)
{
    struct convo *c = a->c;
    if (c->json || !text[0])
        return;
    if (reasoning != a->in_reasoning) {
        if (c->color)
            fputs(reasoning ? DIM : RESET, c->out);
        if (!reasoning && a->any_text)
            fputs("\n\n", c->out); /* the answer after the thoughts */
        a->in_reasoning = reasoning;
    }
    fputs(text, c->out);
    fflush(c->out);
    a->any_text = true;
}

/* Adds a delta's tool call pieces to the calls being built. */
static int add_tool_deltas(struct answer *a, const json_t *calls)
{
    size_t i;
    const json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_int_t index = json_integer_value(json_object_get(tc, "index"));
        if (!json_is_integer(json_object_get(tc, "index")))
            index = (json_int_t)i;
        if (index < 0 || index >= TOOL_CALLS_MAX)
            return snprintf(a->error, sizeof a->error, "a tool call index out of range (%lld)", (long long)index), -1;
        struct tool_call *t = &a->calls[index];
        if (index >= a->n_calls)
            a->n_calls = (int)index + 1;
        const json_t *fn = json_object_get(tc, "function");
        const char *id = json_string_value(json_object_get(tc, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        if ((id && strbuf_put(&t->id, id, strlen(id))) || (name && strbuf_put(&t->name, name, strlen(name))) ||
            (args && strbuf_put(&t->args, args, strlen(args))))
            return snprintf(a->error, sizeof a->error, "out of memory"), -1;
    }
    return 0;
}

/* One chunk of the stream. */
static int on_chunk(struct answer *a, const json_t *j)
{
    const json_t *e = json_object_get(j, "error");
    if (e) {
        const char *msg = json_string_value(json_object_get(e, "message"));
        snprintf(a->error, sizeof a->error, "%s", msg ? msg : json_string_value(e) ? json_string_value(e) : "error");
        return -1;
    }
    const json_t *usage = json_object_get(j, "usage"), *timings = json_object_get(j, "timings");
    if (json_is_object(usage)) {
        json_decref(a->usage);
        a->usage = json_incref((json_t *)usage);
    }
    if (json_is_object(timings)) {
        json_decref(a->timings);
        a->timings = json_incref((json_t *)timings);
    }
    const json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const json_t *delta = json_object_get(choice, "delta");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    if (finish)
        snprintf(a->finish, sizeof a->finish, "%s", finish);
    const char *reasoning = json_string_value(json_object_get(delta, "reasoning_content"));
    const char *content = json_string_value(json_object_get(delta, "content"));
    const json_t *calls = json_object_get(delta, "tool_calls");
    if ((reasoning && reasoning[0]) || (content && content[0]) || json_array_size(calls)) {
        if (!a->t_first)
            a->t_first = clock_ns();
    }
    if (reasoning && reasoning[0]) {
        if (a->reasoning.len + strlen(reasoning) > ANSWER_MAX || strbuf_put(&a->reasoning, reasoning, strlen(reasoning)))
            return snprintf(a->error, sizeof a->error, "the answer is too long to keep"), -1;
        print_text(a, reasoning, true);
    }
    if (content && content[0]) {
        if (a->content.len + strlen(content) > ANSWER_MAX || strbuf_put(&a->content, content, strlen(content)))
            return snprintf(a->error, sizeof a->error, "the answer is too long to keep"), -1;
        print_text(a, content, false);
    }
    if (json_is_array(calls))
        return add_tool_deltas(a, calls);
    return 0;
}

/* An SSE line of the answer's stream; nonzero stops it. */
static int on_line(void *ctx, char *line, size_t len)
{
    struct answer *a = ctx;
    if (len < 5 || strncmp(line, "data:", 5)) /* comments (": ping"), event names, blank lines */
        return 0;
    const char *data = line + 5;
    while (*data == ' ')
        data++;
    if (!strcmp(data, "[DONE]")) {
        a->done = true;
        return 1;
    }
    json_error_t je;
    json_t *j = json_loads(data, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(a->error, sizeof a->error, "a malformed chunk from the node: %s", je.text);
        return -1;
    }
    int rc = on_chunk(a, j);
    json_decref(j);
    return rc;
}

static const char *text_of(const struct strbuf *b) { return b->p ? b->p : ""; }

/* The assistant's message of a whole answer (content and tool calls). */
static json_t *assistant_message(const struct answer *a)
{
    json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", text_of(&a->content));
    if (m && a->n_calls) {
        json_t *calls = json_array();
        for (int i = 0; calls && i < a->n_calls; i++)
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", text_of(&a->calls[i].id), "type",
                                                   "function", "function", "name", text_of(&a->calls[i].name),
                                                   "arguments", text_of(&a->calls[i].args)));
        json_object_set_new(m, "tool_calls", calls);
    }
    return m;
}

static int64_t usage_int(const json_t *usage, const char *key)
{
    return json_integer_value(json_object_get(usage, key));
}

/* The figures of a whole answer into c->last. */
static void keep_stats(struct convo *c, const struct answer *a)
{
    struct convo_stats *s = &c->last;
    *s = (struct convo_stats){.valid = true};
    int64_t first = a->t_first ? a->t_first : a->t_end;
    s->ttft_ms = (double)(first - a->t0) / 1e6;
    s->gen_ms = (double)(a->t_end - first) / 1e6;
    s->prompt_tokens = usage_int(a->usage, "prompt_tokens");
    s->completion_tokens = usage_int(a->usage, "completion_tokens");
    s->cached_tokens = usage_int(json_object_get(a->usage, "prompt_tokens_details"), "cached_tokens");
    s->draft_tokens = usage_int(a->usage, "draft_tokens");
    s->accepted_draft_tokens = usage_int(a->usage, "accepted_draft_tokens");
    s->prompt_ms = json_number_value(json_object_get(a->timings, "prompt_ms"));
    s->predicted_ms = json_number_value(json_object_get(a->timings, "predicted_ms"));
    snprintf(s->finish, sizeof s->finish, "%s", a->finish);
}

static double tokens_per_s(const struct convo_stats *s)
{
    /* the first token came at TTFT; the rest over gen_ms */
    return s->completion_tokens > 1 && s->gen_ms > 0 ? (double)(s->completion_tokens - 1) / (s->gen_ms / 1e3) : 0;
}

/* Ends the answer on the terminal: its tool calls, a reset colour and a newline. */
static void print_end(struct convo *c, struct answer *a, bool cancelled)
{
    if (c->json) {
        if (cancelled)
            return;
        json_t *o = json_pack("{s:s,s:s,s:s,s:f,s:f}", "model", c->model, "content", text_of(&a->content),
                              "finish_reason", a->finish, "ttft_ms", c->last.ttft_ms, "tokens_per_s",
                              tokens_per_s(&c->last));
        if (o && a->reasoning.len)
            json_object_set_new(o, "reasoning_content", json_string(text_of(&a->reasoning)));
        json_t *m = a->n_calls ? assistant_message(a) : NULL;
        if (o && m)
            json_object_set(o, "tool_calls", json_object_get(m, "tool_calls"));
        json_decref(m);
        if (o && a->usage)
            json_object_set(o, "usage", a->usage);
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (text)
            fprintf(c->out, "%s\n", text);
        free(text);
        json_decref(o);
        fflush(c->out);
        return;
    }
    if (a->in_reasoning && c->color)
        fputs(RESET, c->out);
    for (int i = 0; i < a->n_calls; i++)
        fprintf(c->out, "%s%s[tool call] %s(%s)%s", a->any_text || i ? "\n" : "", c->color ? BOLD_CYAN : "",
                text_of(&a->calls[i].name), text_of(&a->calls[i].args), c->color ? RESET : "");
    if (cancelled)
        fprintf(c->out, "%s%s(stopped)%s", a->any_text ? "\n" : "", c->color ? DIM : "", c->color ? RESET : "");
    fputs("\n", c->out);
    fflush(c->out);
}

static void answer_free(struct answer *a)
{
    strbuf_free(&a->content);
    strbuf_free(&a->reasoning);
    for (int i = 0; i < a->n_calls; i++) {
        strbuf_free(&a->calls[i].id);
        strbuf_free(&a->calls[i].name);
        strbuf_free(&a->calls[i].args);
    }
    json_decref(a->usage);
    json_decref(a->timings);
}

/* The request body for the conversation so far; NULL when out of memory. */
static json_t *request_body(const struct convo *c)
{
    json_t *b = json_pack("{s:s,s:O,s:b,s:{s:b}}", "model", c->model, "messages", c->messages, "stream", 1,
                          "stream_options", "include_usage", 1);
    if (b && json_object_update(b, c->options)) {
        json_decref(b);
        return NULL;
    }
    return b;
}

/* Drops the oldest turns (after a system prompt) until a request has room for one
 * more message. */
static void make_room(struct convo *c)
{
    size_t first = json_array_size(c->messages) && is_system(json_array_get(c->messages, 0));
    for (int i = 0; i < CONVO_MESSAGES_MAX && json_array_size(c->messages) + 1 > CONVO_MESSAGES_MAX; i++)
        json_array_remove(c->messages, first);
}

int convo_ask(struct convo *c, const char *text, const atomic_bool *cancel, char *err, size_t errlen)
{
    make_room(c);
    json_t *user = json_pack("{s:s,s:s}", "role", "user", "content", text);
    if (!user || json_array_append_new(c->messages, user))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    json_t *body = request_body(c);
    struct answer a = {.c = c, .t0 = clock_ns()};
    bool cancelled = false;
    int status = body ? client_stream(&c->api, "/v1/chat/completions", body, cancel, on_line, &a, &cancelled, err,
                                      errlen)
                      : 0;
    a.t_end = clock_ns();
    json_decref(body);
    int rc = 0;
    if (!body)
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    else if (cancelled)
        rc = 1;
    else if (a.error[0])
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s", a.error);
    else if (status != 200)
        rc = CAIRN_EIO; /* err holds the node's message or curl's */
    else if (!a.done)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "the node closed the answer before its end");
    if (rc == 0 || rc == 1) {
        if (rc == 0)
            keep_stats(c, &a);
        print_end(c, &a, rc == 1);
    } else if (a.any_text) {
        print_end(c, &a, false);
    }
    json_t *reply = rc == 0 ? assistant_message(&a) : NULL;
    if (rc == 0 && (!reply || json_array_append_new(c->messages, reply)))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (rc) /* the turn is dropped: the next question is asked without it */
        json_array_remove(c->messages, json_array_size(c->messages) - 1);
    answer_free(&a);
    return rc;
}

void convo_show_stats(const struct convo *c, FILE *f)
{
    const struct convo_stats *s = &c->last;
    if (!s->valid) {
        fprintf(f, "no answer yet\n");
        return;
    }
    fprintf(f, "time to first token  %.1f ms\n", s->ttft_ms);
    fprintf(f, "tokens/s             %.1f (%lld tokens in %.1f ms after the first)\n", tokens_per_s(s),
            (long long)s->completion_tokens, s->gen_ms);
    fprintf(f, "prompt               %lld tokens (%lld from the cache)\n", (long long)s->prompt_tokens,
            (long long)s->cached_tokens);
    if (s->prompt_ms > 0)
        fprintf(f, "runner               prefill %.1f ms, decode %.1f ms\n", s->prompt_ms, s->predicted_ms);
    fprintf(f, "drafted / accepted   %lld / %lld", (long long)s->draft_tokens, (long long)s->accepted_draft_tokens);
    if (s->draft_tokens)
        fprintf(f, " (%.0f%%)", 100.0 * (double)s->accepted_draft_tokens / (double)s->draft_tokens);
    fprintf(f, "\nfinish               %s\n", s->finish[0] ? s->finish : "-");
}
