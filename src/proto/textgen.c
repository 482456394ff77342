/* TextGeneration task parameters (textgen.h). */
#include "proto/textgen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void textgen_params_init(struct textgen_params *p)
{
    memset(p, 0, sizeof *p);
    p->add_generation_prompt = true;
    p->n = 1;
    p->reasoning = true;
    p->num_draft_tokens = -1;
    p->sampling = runner_sampling_defaults();
}

void textgen_params_clear(struct textgen_params *p)
{
    if (!p)
        return;
    json_decref(p->messages);
    json_decref(p->tools);
    json_decref(p->template_kwargs);
    free(p->prompt);
    free(p->prompt_ids);
    free(p->grammar);
    free(p->force_tool);
    textgen_inputs_free(p->embed, p->n_embed);
    textgen_inputs_free(p->batch, p->n_batch);
    for (int i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    free(p->bias);
    memset(p, 0, sizeof *p);
}

int textgen_prompt_ids(const json_t *a, int32_t **ids, int64_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    size_t len = json_array_size(a);
    if (!json_is_array(a) || len < 1 || (int64_t)len > TEXTGEN_MAX_PROMPT_IDS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "prompt: expected 1..%lld token ids",
                          (long long)TEXTGEN_MAX_PROMPT_IDS);
    int32_t *out = malloc(len * sizeof *out);
    if (!out)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > INT32_MAX) {
            free(out);
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "prompt[%zu]: expected a token id (an integer 0..%d)", i,
                              INT32_MAX);
        }
        out[i] = (int32_t)id;
    }
    *ids = out;
    *n = (int64_t)len;
    return 0;
}

/* One list of ids of an embedding input (1..TEXTGEN_MAX_PROMPT_IDS, each 0..INT32_MAX). */
static int embed_ids(const json_t *a, const char *name, size_t at, struct textgen_input *x, char *err,
                     size_t errlen)
{
    size_t len = json_array_size(a);
    if (len < 1 || (int64_t)len > TEXTGEN_MAX_PROMPT_IDS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu]: expected 1..%lld token ids", name, at,
                          (long long)TEXTGEN_MAX_PROMPT_IDS);
    if (!(x->ids = malloc(len * sizeof *x->ids)))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > INT32_MAX)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu][%zu]: expected a token id (an integer 0..%d)", name,
                              at, i, INT32_MAX);
        x->ids[i] = (int32_t)id;
    }
    x->n_ids = (int64_t)len;
    return 0;
}

void textgen_inputs_free(struct textgen_input *in, int n)
{
    for (int i = 0; in && i < n; i++) {
        free(in[i].text);
        free(in[i].ids);
    }
    free(in);
}

int textgen_seqs(const struct textgen_params *p) { return p->n * (p->n_batch > 1 ? p->n_batch : 1); }

int textgen_inputs(const json_t *input, const char *name, int max, bool allow_empty, struct textgen_input **out,
                   int *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    size_t n = json_is_array(input) ? json_array_size(input) : 1;
    bool one_list = json_is_array(input) && n > 0 && json_is_integer(json_array_get(input, 0));
    if (one_list)
        n = 1;
    if (!json_is_string(input) && !json_is_array(input))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected a text, a list of texts, a list of token ids or a "
                          "list of lists of token ids", name);
    if (n < 1 || n > (size_t)max)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: expected 1..%d inputs, got %zu", name, max, n);
    struct textgen_input *in = calloc(n, sizeof *in);
    if (!in)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    *out = in;
    *n_out = (int)n;
    int64_t total_ids = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_is_string(input) || one_list ? input : json_array_get(input, i);
        struct textgen_input *x = &in[i];
        int rc;
        if (json_is_string(v)) {
            if (json_string_length(v) > TEXTGEN_MAX_EMBED_TEXT)
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu]: longer than %zu bytes", name, i,
                                  TEXTGEN_MAX_EMBED_TEXT);
            if (json_string_length(v) == 0 && !allow_empty)
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu]: empty text", name, i);
            if (!(x->text = strndup(json_string_value(v), json_string_length(v))))
                return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        } else if (json_is_array(v)) {
            if ((rc = embed_ids(v, name, i, x, err, errlen)))
                return rc;
            total_ids += x->n_ids;
            if (total_ids > TEXTGEN_MAX_PROMPT_IDS)
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: more than %lld token ids in all", name,
                                  (long long)TEXTGEN_MAX_PROMPT_IDS);
        } else {
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s[%zu]: expected a text or a list of token ids", name, i);
        }
    }
    return 0;
}

int textgen_embed_inputs(const json_t *input, const char *name, struct textgen_params *p, char *err, size_t errlen)
{
    if (p->embed)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%s: inputs given twice", name);
    return textgen_inputs(input, name, TEXTGEN_MAX_EMBED_INPUTS, false, &p->embed, &p->n_embed, err, errlen);
}

static bool put(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0; }

static json_t *ids_array(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i]))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

static json_t *inputs_json(const struct textgen_input *in, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, in[i].text ? json_string(in[i].text) : ids_array(in[i].ids, in[i].n_ids))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

json_t *textgen_params_to_json(const struct textgen_params *p)
{
    json_t *o = json_object();
    json_t *stop = json_array(), *bias = json_object();
    bool ok = o && stop && bias && put(o, "model", json_string(p->model)) &&
              put(o, "add_generation_prompt", json_boolean(p->add_generation_prompt)) &&
              put(o, "max_tokens", json_integer(p->max_tokens)) && put(o, "n", json_integer(p->n)) &&
              put(o, "logprobs", json_boolean(p->logprobs)) && put(o, "top_logprobs", json_integer(p->top_logprobs)) &&
              put(o, "sampling", runner_sampling_to_json(&p->sampling)) &&
              put(o, "ignore_eos", json_boolean(p->ignore_eos)) && put(o, "reasoning", json_boolean(p->reasoning)) &&
              put(o, "num_draft_tokens", json_integer(p->num_draft_tokens)) &&
              put(o, "prompt_lookup", json_boolean(p->prompt_lookup));
    if (ok && p->messages)
        ok = json_object_set(o, "messages", p->messages) == 0;
    if (ok && p->prompt)
        ok = put(o, "prompt", json_string(p->prompt));
    if (ok && p->prompt_ids) {
        json_t *ids = json_array();
        for (int64_t i = 0; ids && i < p->n_prompt_ids; i++)
            if (json_array_append_new(ids, json_integer(p->prompt_ids[i]))) {
                json_decref(ids);
                ids = NULL;
            }
        ok = put(o, "prompt", ids);
    }
    if (ok && p->embed)
        ok = put(o, "embed", inputs_json(p->embed, p->n_embed)) && put(o, "truncate", json_boolean(p->truncate)) &&
             put(o, "dimensions", json_integer(p->dimensions));
    if (ok && p->batch)
        ok = put(o, "prompts", inputs_json(p->batch, p->n_batch));
    if (ok && p->grammar)
        ok = put(o, "grammar", json_string(p->grammar));
    if (ok && p->force_tool)
        ok = put(o, "force_tool", json_string(p->force_tool));
    if (ok && p->tools)
        ok = json_object_set(o, "tools", p->tools) == 0;
    if (ok && p->template_kwargs)
        ok = json_object_set(o, "template_kwargs", p->template_kwargs) == 0;
    for (int i = 0; ok && i < p->n_stop; i++)
        ok = json_array_append_new(stop, json_string(p->stop[i])) == 0;
    for (int i = 0; ok && i < p->n_bias; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", (int)p->bias[i].token);
        ok = put(bias, key, json_real(p->bias[i].bias));
    }
    ok = ok && json_object_set(o, "stop", stop) == 0 && json_object_set(o, "logit_bias", bias) == 0;
    json_decref(stop);
    json_decref(bias);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int opt_bool(const json_t *j, const char *key, bool *dst, char *err, size_t errlen)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not a boolean", key);
    *dst = json_is_true(v);
    return 0;
}

static int opt_int(const json_t *j, const char *key, int64_t lo, int64_t hi, int64_t *dst, char *err,
                   size_t errlen)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not an integer in [%lld, %lld]", key, (long long)lo,
                          (long long)hi);
    *dst = json_integer_value(v);
    return 0;
}

static const char *const roles[] = {"system", "user", "assistant", "tool"};

static int check_messages(const json_t *msgs, char *err, size_t errlen)
{
    size_t n = json_array_size(msgs);
    if (n == 0 || n > TEXTGEN_MAX_MESSAGES)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages: %zu messages, expected 1..%d", n,
                          TEXTGEN_MAX_MESSAGES);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages[%zu]: not an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        bool known = false;
        for (size_t k = 0; role && k < sizeof roles / sizeof roles[0]; k++)
            known |= !strcmp(role, roles[k]);
        if (!known)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages[%zu].role: expected system, user, assistant or tool", i);
        const json_t *c = json_object_get(m, "content");
        if (c && !json_is_string(c) && !json_is_null(c))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages[%zu].content: not text", i);
        const json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_array(tc) && !json_is_null(tc))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages[%zu].tool_calls: not an array", i);
    }
    return 0;
}

static int read_stop(const json_t *j, struct textgen_params *p, char *err, size_t errlen)
{
    const json_t *stop = json_object_get(j, "stop");
    if (!stop || json_is_null(stop))
        return 0;
    if (!json_is_array(stop) || json_array_size(stop) > TEXTGEN_MAX_STOP)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "stop: expected an array of at most %d strings",
                          TEXTGEN_MAX_STOP);
    for (size_t i = 0; i < json_array_size(stop); i++) {
        const json_t *s = json_array_get(stop, i);
        size_t len = json_string_length(s);
        if (!json_is_string(s) || len < 1 || len > TEXTGEN_MAX_STOP_BYTES)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "stop[%zu]: expected text of 1..%d bytes", i,
                              TEXTGEN_MAX_STOP_BYTES);
        if (!(p->stop[p->n_stop] = strdup(json_string_value(s))))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        p->n_stop++;
    }
    return 0;
}

static int read_bias(const json_t *j, struct textgen_params *p, char *err, size_t errlen)
{
    const json_t *bias = json_object_get(j, "logit_bias");
    if (!bias || json_is_null(bias))
        return 0;
    if (!json_is_object(bias) || json_object_size(bias) > TEXTGEN_MAX_BIAS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "logit_bias: expected an object of at most %d entries",
                          TEXTGEN_MAX_BIAS);
    if (json_object_size(bias) && !(p->bias = calloc(json_object_size(bias), sizeof *p->bias)))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)bias, key, v) {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id > INT32_MAX)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "logit_bias: '%.32s' is not a token id", key);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "logit_bias.%.32s: not a number", key);
        p->bias[p->n_bias].token = (int32_t)id;
        p->bias[p->n_bias].bias = (float)json_number_value(v);
        p->n_bias++;
    }
    return 0;
}

static int read_params(const json_t *j, struct textgen_params *p, char *err, size_t errlen)
{
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "params: not an object");
    int rc = ids_json_model(j, "params", "model", false, p->model, err, errlen);
    if (rc)
        return rc;
    const json_t *msgs = json_object_get(j, "messages"), *prompt = json_object_get(j, "prompt");
    if (msgs && json_is_null(msgs))
        msgs = NULL;
    if (prompt && json_is_null(prompt))
        prompt = NULL;
    const json_t *embed = json_object_get(j, "embed"), *prompts = json_object_get(j, "prompts");
    if (embed && json_is_null(embed))
        embed = NULL;
    if (prompts && json_is_null(prompts))
        prompts = NULL;
    if ((msgs != NULL) + (prompt != NULL) + (embed != NULL) + (prompts != NULL) != 1)
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "params: exactly one of messages, prompt, prompts and embed is needed");
    if (prompts) {
        if (!json_is_array(prompts) || json_array_size(prompts) < 2)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "prompts: expected a list of 2..%d prompts", TEXTGEN_MAX_N);
        if ((rc = textgen_inputs(prompts, "prompts", TEXTGEN_MAX_N, true, &p->batch, &p->n_batch, err, errlen)))
            return rc;
    } else if (embed) {
        if (!json_is_array(embed))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "embed: not an array");
        if ((rc = textgen_embed_inputs(embed, "embed", p, err, errlen)) ||
            (rc = opt_bool(j, "truncate", &p->truncate, err, errlen)))
            return rc;
        const json_t *dims = json_object_get(j, "dimensions");
        json_int_t d = dims ? (json_is_integer(dims) ? json_integer_value(dims) : -1) : 0;
        if (d < 0 || d > TEXTGEN_MAX_EMBED_DIM)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "dimensions: expected 0..%d", TEXTGEN_MAX_EMBED_DIM);
        p->dimensions = (int)d;
    } else if (msgs) {
        if (!json_is_array(msgs))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "messages: not an array");
        if ((rc = check_messages(msgs, err, errlen)))
            return rc;
        p->messages = json_incref((json_t *)msgs);
    } else if (json_is_array(prompt)) {
        if ((rc = textgen_prompt_ids(prompt, &p->prompt_ids, &p->n_prompt_ids, err, errlen)))
            return rc;
    } else {
        if (!json_is_string(prompt))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "prompt: not text");
        if (!(p->prompt = strdup(json_string_value(prompt))))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    const json_t *grammar = json_object_get(j, "grammar");
    if (grammar && !json_is_null(grammar)) {
        if (!json_is_string(grammar) || json_string_length(grammar) > TEXTGEN_MAX_GRAMMAR)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "grammar: not text of at most %zu bytes", TEXTGEN_MAX_GRAMMAR);
        if (!(p->grammar = strdup(json_string_value(grammar))))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    const json_t *force = json_object_get(j, "force_tool");
    if (force && !json_is_null(force)) {
        if (!json_is_string(force) || json_string_length(force) > 256)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "force_tool: not a tool name");
        if (!(p->force_tool = strdup(json_string_value(force))))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    const json_t *tools = json_object_get(j, "tools"), *kw = json_object_get(j, "template_kwargs");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "tools: not an array");
        p->tools = json_incref((json_t *)tools);
    }
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "template_kwargs: not an object");
        p->template_kwargs = json_incref((json_t *)kw);
    }
    int64_t n = p->n, top = p->top_logprobs, k = p->num_draft_tokens;
    if ((rc = opt_bool(j, "add_generation_prompt", &p->add_generation_prompt, err, errlen)) ||
        (rc = opt_int(j, "max_tokens", 0, RUNNER_MAX_GENERATE, &p->max_tokens, err, errlen)) ||
        (rc = opt_int(j, "n", 1, TEXTGEN_MAX_N, &n, err, errlen)) ||
        (rc = opt_bool(j, "logprobs", &p->logprobs, err, errlen)) ||
        (rc = opt_int(j, "top_logprobs", 0, TEXTGEN_MAX_TOP_LOGPROBS, &top, err, errlen)) ||
        (rc = opt_bool(j, "ignore_eos", &p->ignore_eos, err, errlen)) ||
        (rc = opt_bool(j, "reasoning", &p->reasoning, err, errlen)) ||
        (rc = opt_int(j, "num_draft_tokens", -1, TEXTGEN_MAX_DRAFT, &k, err, errlen)) ||
        (rc = opt_bool(j, "prompt_lookup", &p->prompt_lookup, err, errlen)) ||
        (rc = runner_sampling_from_json(json_object_get(j, "sampling"), "sampling", &p->sampling, err, errlen)) ||
        (rc = read_stop(j, p, err, errlen)) || (rc = read_bias(j, p, err, errlen)))
        return rc;
    p->n = (int)n;
    p->top_logprobs = (int)top;
    p->num_draft_tokens = (int)k;
    if (p->batch && (p->n_batch < 2 || (int64_t)p->n_batch * p->n > TEXTGEN_MAX_N))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "prompts: %d prompts of n %d each: 2..%d sequences in all",
                          p->n_batch, p->n, TEXTGEN_MAX_N);
    return 0;
}

int textgen_params_from_json(const json_t *j, struct textgen_params *out, char *err, size_t errlen)
{
    textgen_params_init(out);
    int rc = read_params(j, out, err, errlen);
    if (rc)
        textgen_params_clear(out);
    return rc;
}
