/* libFuzzer harness of the HTTP front-ends' request bodies: the first input byte picks a
 * route, the rest is the body, parsed as the server parses it (http_req.c: its depth and
 * value limits, jansson without options; a body that is not JSON reaches the handler as
 * NULL) and given to that route's parser: OpenAI chat and completions, Ollama chat and
 * generate, Anthropic messages, OpenAI responses (api/openai.c, ollama.c, anthropic.c,
 * responses.c), and the cluster's
 * place, create and draft model commands (ctl/command.c). A refusal must be a 4xx (500
 * only for out of memory) with a message. Accepted parameters must be within the
 * documented limits (README, "Security"), nest no deeper than a body may, and reach the
 * runner as gen_node sends them (taskbody), coming out of the runner's own check the
 * same; an accepted command must go over the wire to the master and back unchanged.
 * Built and run by run.sh. */
#include "api/anthropic.h"
#include "api/http.h"
#include "api/json_scan.h"
#include "api/ollama.h"
#include "api/openai.h"
#include "api/responses.h"
#include "base/err.h"
#include "ctl/command.h"
#include "node/taskbody.h"
#include "proto/ids.h"
#include "proto/textgen.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "fuzz_api: %s:%d: %s\n", __FILE__, __LINE__, #c);     \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* The levels a front-end nests around a client's own values, at most: a tool call's
 * arguments sit in params.messages[i].tool_calls[j].function. */
#define FRONT_END_LEVELS 6

enum route {
    R_OPENAI_CHAT,
    R_OPENAI_COMPLETION,
    R_OLLAMA_CHAT,
    R_OLLAMA_GENERATE,
    R_ANTHROPIC,
    R_PLACE,
    R_CREATE,
    R_DRAFT,
    R_RESPONSES,
    R_COUNT
};

/* A refusal: a client error, or 500 for out of memory, always saying why; a message
 * about a field starts with its path. */
static void check_refusal(int status, const struct json_err *e)
{
    CHECK((status >= 400 && status <= 499) || (status == 500 && !strcmp(e->message, "out of memory")));
    CHECK(e->message[0]);
    if (e->path[0] && strncmp(e->message, e->path, strlen(e->path))) {
        fprintf(stderr, "path '%s', message '%s'\n", e->path, e->message);
        CHECK(!"the message names its path");
    }
}

static bool same_sampling(const struct runner_sampling *a, const struct runner_sampling *b)
{
    return a->temperature == b->temperature && a->top_p == b->top_p && a->min_p == b->min_p &&
           a->repeat_penalty == b->repeat_penalty && a->presence_penalty == b->presence_penalty &&
           a->frequency_penalty == b->frequency_penalty && a->top_k == b->top_k &&
           a->penalty_last_n == b->penalty_last_n && a->seed == b->seed;
}

/* Nesting depth of j: 0 for a scalar. */
static int depth(const json_t *j)
{
    int d = 0, dv;
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(j))
        json_object_foreach((json_t *)j, k, v) d = (dv = depth(v)) > d ? dv : d;
    else if (json_is_array(j))
        json_array_foreach(j, i, v) d = (dv = depth(v)) > d ? dv : d;
    else
        return 0;
    return d + 1;
}

static bool same_json(const json_t *a, const json_t *b)
{
    return (!a && !b) || (a && b && json_equal((json_t *)a, (json_t *)b));
}

/* The limits README's "Security" section promises for an accepted request. */
static void check_limits(const struct textgen_params *p)
{
    CHECK(ids_valid_model(p->model));
    CHECK(!p->messages != (!p->prompt && !p->prompt_ids && !p->batch));
    CHECK(!p->batch || (p->n_batch >= 2 && p->n_batch * p->n <= TEXTGEN_MAX_N && !p->prompt && !p->prompt_ids));
    for (int i = 0; p->batch && i < p->n_batch; i++)
        CHECK(!p->batch[i].text != !p->batch[i].ids &&
              (!p->batch[i].ids || (p->batch[i].n_ids >= 1 && p->batch[i].n_ids <= TEXTGEN_MAX_PROMPT_IDS)));
    CHECK(!p->prompt || !p->prompt_ids);
    CHECK(!p->prompt_ids || (p->n_prompt_ids >= 1 && p->n_prompt_ids <= TEXTGEN_MAX_PROMPT_IDS));
    for (int64_t i = 0; p->prompt_ids && i < p->n_prompt_ids; i++)
        CHECK(p->prompt_ids[i] >= 0);
    if (p->messages) {
        size_t n = json_array_size(p->messages);
        if (n < 1 || n > TEXTGEN_MAX_MESSAGES)
            fprintf(stderr, "%zu messages\n", n);
        CHECK(n >= 1 && n <= TEXTGEN_MAX_MESSAGES);
    }
    CHECK(p->n >= 1 && p->n <= TEXTGEN_MAX_N);
    CHECK(p->n_stop >= 0 && p->n_stop <= TEXTGEN_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++)
        CHECK(strlen(p->stop[i]) >= 1 && strlen(p->stop[i]) <= TEXTGEN_MAX_STOP_BYTES);
    CHECK(p->n_bias >= 0 && p->n_bias <= TEXTGEN_MAX_BIAS && (!p->n_bias || p->bias));
    for (int i = 0; i < p->n_bias; i++)
        CHECK(p->bias[i].token >= 0 && isfinite(p->bias[i].bias) && fabsf(p->bias[i].bias) <= 100);
    CHECK(p->top_logprobs >= 0 && p->top_logprobs <= TEXTGEN_MAX_TOP_LOGPROBS);
    CHECK(p->max_tokens >= 0 && p->max_tokens <= RUNNER_MAX_GENERATE);
    CHECK(p->num_draft_tokens >= -1 && p->num_draft_tokens <= TEXTGEN_MAX_DRAFT);
    CHECK(p->sampling.seed <= IDS_COUNTER_MAX);
}

/* What gen_node submits (taskbody_encode of textgen_params_to_json) is what the runner
 * reads (taskbody_put, taskbody_take, textgen_params_from_json), field by field. */
static void check_runner_reads(const struct textgen_params *p)
{
    char err[512] = "";
    json_t *j = textgen_params_to_json(p), *got = NULL;
    CHECK(j);
    /* Nothing a client sends nests deeper than a body may (what a template walks). */
    int d = depth(j);
    if (d > HTTP_JSON_DEPTH_DEFAULT + FRONT_END_LEVELS)
        fprintf(stderr, "params nested %d levels deep\n", d);
    CHECK(d <= HTTP_JSON_DEPTH_DEFAULT + FRONT_END_LEVELS);
    char *body = NULL;
    size_t len = 0;
    int64_t bytes = 0;
    int rc = taskbody_encode("task-1", j, &body, &len, &bytes, err, sizeof err);
    json_decref(j);
    if (rc == CAIRN_ERANGE)
        return; /* too big: gen_node answers 413 */
    CHECK(rc == 0);
    struct taskbody_store *s = taskbody_create();
    CHECK(s);
    rc = taskbody_put(s, "node-a", body, len, 0, err, sizeof err);
    free(body);
    if (rc)
        fprintf(stderr, "taskbody_put: %s\n", err);
    CHECK(rc == 0);
    CHECK(taskbody_take(s, "task-1", "node-a", &got, err, sizeof err) == 0);
    taskbody_release(s);
    struct textgen_params q;
    rc = textgen_params_from_json(got, &q, err, sizeof err);
    json_decref(got);
    if (rc)
        fprintf(stderr, "the runner refuses what the API accepted: %s\n", err);
    CHECK(rc == 0);
    CHECK(!strcmp(p->model, q.model));
    CHECK(same_json(p->messages, q.messages) && same_json(p->tools, q.tools) &&
          same_json(p->template_kwargs, q.template_kwargs));
    CHECK(!p->prompt == !q.prompt && (!p->prompt || !strcmp(p->prompt, q.prompt)));
    CHECK(p->n_prompt_ids == q.n_prompt_ids && !p->prompt_ids == !q.prompt_ids &&
          (!p->prompt_ids || !memcmp(p->prompt_ids, q.prompt_ids, (size_t)p->n_prompt_ids * sizeof *p->prompt_ids)));
    CHECK(p->n_batch == q.n_batch);
    for (int i = 0; i < p->n_batch; i++)
        CHECK(!p->batch[i].text == !q.batch[i].text && (!p->batch[i].text || !strcmp(p->batch[i].text, q.batch[i].text)) &&
              p->batch[i].n_ids == q.batch[i].n_ids &&
              (!p->batch[i].ids || !memcmp(p->batch[i].ids, q.batch[i].ids, (size_t)p->batch[i].n_ids * 4)));
    CHECK(p->add_generation_prompt == q.add_generation_prompt && p->max_tokens == q.max_tokens && p->n == q.n &&
          p->logprobs == q.logprobs && p->top_logprobs == q.top_logprobs && p->ignore_eos == q.ignore_eos &&
          p->reasoning == q.reasoning && p->num_draft_tokens == q.num_draft_tokens &&
          p->prompt_lookup == q.prompt_lookup);
    CHECK(same_sampling(&p->sampling, &q.sampling));
    CHECK(p->n_stop == q.n_stop);
    for (int i = 0; i < p->n_stop; i++)
        CHECK(!strcmp(p->stop[i], q.stop[i]));
    if (p->n_bias != q.n_bias)
        fprintf(stderr, "%d logit_bias entries, the runner reads %d\n", p->n_bias, q.n_bias);
    CHECK(p->n_bias == q.n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        bool found = false; /* a JSON object need not keep its order */
        for (int k = 0; k < q.n_bias && !found; k++)
            found = q.bias[k].token == p->bias[i].token && q.bias[k].bias == p->bias[i].bias;
        CHECK(found);
    }
    textgen_params_clear(&q);
}

static void generation(enum route route, const json_t *body)
{
    struct textgen_params p;
    struct json_err e = {{0}, {0}};
    int status;
    bool load = false;
    textgen_params_init(&p);
    if (route == R_OPENAI_CHAT || route == R_OPENAI_COMPLETION) {
        struct openai_reply_opts o = {0};
        status = openai_parse_request(route == R_OPENAI_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION, body, &p, &o, &e);
        CHECK(status || !o.include_usage || o.stream);
    } else if (route == R_RESPONSES) {
        struct responses_req q = {0};
        status = responses_parse_request(NULL, body, &p, &q, &e);
        CHECK(status || (json_is_array(q.input) && json_is_object(q.echo)));
        CHECK(status || json_array_size(p.messages) >= json_array_size(q.input));
        responses_req_clear(&q);
    } else if (route == R_ANTHROPIC) {
        bool stream;
        status = anthropic_parse_request(body, &p, &stream, &e);
    } else {
        struct ollama_request o;
        status = ollama_parse_request(route == R_OLLAMA_CHAT ? OLLAMA_CHAT : OLLAMA_GENERATE, body, &p, &o, &e);
        CHECK(status || (o.model && o.model[0]));
        load = !status && o.load;
        /* The handler resolves the name to a model's id; any valid id will do here. */
        snprintf(p.model, sizeof p.model, "%s", "fuzz-model");
    }
    if (status) {
        check_refusal(status, &e);
    } else if (!load) {
        check_limits(&p);
        check_runner_reads(&p);
    }
    textgen_params_clear(&p);
}

/* An accepted command is within its limits and crosses the wire to the master unchanged. */
static void command(enum route route, const json_t *body, const char *instance_id)
{
    static const enum command_kind kinds[] = {
        [R_PLACE] = COMMAND_PLACE_INSTANCE,
        [R_CREATE] = COMMAND_CREATE_INSTANCE,
        [R_DRAFT] = COMMAND_SET_INSTANCE_DRAFT_MODEL,
    };
    struct command c, d;
    char err[COMMAND_MESSAGE_MAX] = "";
    int rc = command_from_request(kinds[route], body, instance_id, &c, err, sizeof err);
    if (rc) {
        /* routes_cluster answers all but out of memory as 400 */
        CHECK((rc == CAIRN_EFORMAT || rc == CAIRN_ENOMEM || rc == CAIRN_EIO) && err[0]);
        return;
    }
    if (c.kind == COMMAND_PLACE_INSTANCE) {
        CHECK(ids_valid_model(c.place_instance.model_id));
        CHECK(c.place_instance.min_nodes >= 1 && c.place_instance.min_nodes <= CLUSTER_MAX_SHARDS);
    } else if (c.kind == COMMAND_CREATE_INSTANCE) {
        CHECK(c.create_instance.n_shards >= 1 && c.create_instance.n_shards <= CLUSTER_MAX_SHARDS);
    }
    snprintf(c.id, sizeof c.id, "%s", "command-1");
    json_t *j = command_to_jsonv(&c);
    CHECK(j);
    rc = command_from_jsonv(j, &d, err, sizeof err);
    if (rc)
        fprintf(stderr, "the master refuses what the API accepted: %s\n", err);
    CHECK(rc == 0);
    json_t *k = command_to_jsonv(&d);
    CHECK(k && json_equal(j, k));
    json_decref(j);
    json_decref(k);
    command_clear(&c);
    command_clear(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum route route = (enum route)(data[0] % R_COUNT);
    bool bad_id = (data[0] / R_COUNT) & 1; /* draft model: a URL id no instance can have */
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    json_t *body = NULL;
    if (len) {
        int depth;
        size_t values;
        http_json_scan(text, len, HTTP_JSON_DEPTH_DEFAULT, HTTP_JSON_VALUES_DEFAULT, &depth, &values);
        if (depth > HTTP_JSON_DEPTH_DEFAULT || values > HTTP_JSON_VALUES_DEFAULT)
            return 0; /* the server's defaults (http.h): it answers 400 or 413 itself */
        body = json_loadb(text, len, 0, NULL);
    }
    if (route <= R_ANTHROPIC || route == R_RESPONSES)
        generation(route, body);
    else
        command(route, body, bad_id ? "no such id" : "instance-1");
    json_decref(body);
    return 0;
}
