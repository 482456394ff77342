/* OpenAI's and Ollama's embedding routes (embeddings.h). */
#include "api/embeddings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/apireq.h"
#include "api/apiutil.h"
#include "api/ollama.h"
#include "api/openai.h"
#include "base/clock.h"
#include "base/err.h"
#include "proto/ids.h"

/* ---------- errors ---------- */

static json_t *openai_error(int status, const char *message, const char *param)
{
    return openai_error_json(status, message, param, "model_not_found");
}

/* ---------- requests ---------- */

static int parse_inputs(const json_t *input, const char *name, struct textgen_params *p, struct json_err *e)
{
    char err[JSON_ERR_MAX];
    if (!input || json_is_null(input))
        return json_fail(e, name, "required");
    int rc = textgen_embed_inputs(input, name, p, err, sizeof err);
    if (rc == CAIRN_ENOMEM)
        return rc;
    if (rc) {
        snprintf(e->path, sizeof e->path, "%s", name);
        snprintf(e->message, sizeof e->message, "%s", err);
        return CAIRN_EFORMAT;
    }
    return 0;
}

static int parse_request(enum embeddings_route route, const json_t *body, struct textgen_params *p,
                         struct embeddings_opts *o, struct json_err *e)
{
    if (!json_is_object(body))
        return json_fail(e, "", "the body must be a JSON object");
    int rc = apiutil_parse_model(body, p, e);
    if (rc)
        return rc;
    bool given;
    int64_t dims = 0;
    switch (route) {
    case EMBEDDINGS_OPENAI: {
        const char *fmt = NULL;
        if ((rc = parse_inputs(json_object_get(body, "input"), "input", p, e)) ||
            (rc = json_opt_string(body, NULL, "encoding_format", &fmt, e)))
            return rc;
        if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
            return json_fail(e, "encoding_format", "expected \"float\" or \"base64\"");
        o->base64 = fmt && !strcmp(fmt, "base64");
        p->truncate = false;
        break;
    }
    case EMBEDDINGS_OLLAMA:
        p->truncate = true;
        if ((rc = parse_inputs(json_object_get(body, "input"), "input", p, e)) ||
            (rc = json_opt_bool(body, NULL, "truncate", &p->truncate, &given, e)))
            return rc;
        break;
    case EMBEDDINGS_OLLAMA_LEGACY: {
        const json_t *prompt = json_object_get(body, "prompt");
        if (!json_is_string(prompt))
            return json_fail(e, "prompt", "expected a string");
        if ((rc = parse_inputs(prompt, "prompt", p, e)))
            return rc;
        p->truncate = true;
        break;
    }
    }
    if ((rc = json_opt_int(body, NULL, "dimensions", 1, TEXTGEN_MAX_EMBED_DIM, &dims, &given, e)))
        return rc;
    p->dimensions = (int)dims;
    return 0;
}

int embeddings_parse_request(enum embeddings_route route, const json_t *body, struct textgen_params *p,
                             struct embeddings_opts *o, struct json_err *e)
{
    return apiutil_parse_status(parse_request(route, body, p, o, e), e);
}

/* ---------- replies ---------- */

struct ereq {
    enum embeddings_route route;
    bool base64;
    char model[IDS_MODEL_MAX + 1];
    int n;
    json_t **vec;    /* n: each input's vector as the reply writes it, NULL until it came */
    int64_t prompt_tokens;
    int64_t started_ns;
};

static void ereq_free(void *self)
{
    struct ereq *r = self;
    for (int i = 0; r && i < r->n; i++)
        json_decref(r->vec[i]);
    free(r ? r->vec : NULL);
    free(r);
}

static json_t *floats_json(const float *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real((double)v[i]))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

static json_t *reply_json(struct ereq *r)
{
    json_t *data = json_array(), *o = NULL;
    bool ok = data != NULL;
    for (int i = 0; ok && i < r->n; i++) {
        if (r->route == EMBEDDINGS_OPENAI)
            ok = json_array_append_new(data, json_pack("{s:s,s:i,s:O}", "object", "embedding", "index", i, "embedding",
                                                       r->vec[i])) == 0;
        else
            ok = json_array_append(data, r->vec[i]) == 0;
    }
    if (!ok) {
        json_decref(data);
        return NULL;
    }
    json_int_t tokens = (json_int_t)r->prompt_tokens;
    switch (r->route) {
    case EMBEDDINGS_OPENAI:
        o = json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", r->model, "usage",
                      "prompt_tokens", tokens, "total_tokens", tokens);
        break;
    case EMBEDDINGS_OLLAMA: {
        json_int_t ns = (json_int_t)(clock_ns() - r->started_ns);
        o = json_pack("{s:s,s:o,s:I,s:I,s:I}", "model", r->model, "embeddings", data, "total_duration", ns,
                      "load_duration", (json_int_t)0, "prompt_eval_count", tokens);
        break;
    }
    case EMBEDDINGS_OLLAMA_LEGACY:
        o = json_pack("{s:O}", "embedding", json_array_get(data, 0));
        json_decref(data);
        break;
    }
    return o;
}

static void on_event(struct apireq *a, void *self, const struct gen_event *ev)
{
    struct ereq *r = self;
    switch (ev->kind) {
    case GEN_EVENT_EMBEDDING:
        if (ev->index < 0 || ev->index >= r->n || r->vec[ev->index])
            break; /* gen_node checked the index; a repeat is ignored */
        r->vec[ev->index] = r->base64 ? json_string(ev->embedding_b64) : floats_json(ev->embedding, ev->dim);
        if (!r->vec[ev->index])
            apireq_fail(a, 500, "out of memory");
        break;
    case GEN_EVENT_END:
        r->prompt_tokens = ev->usage.prompt_tokens;
        for (int i = 0; i < r->n; i++)
            if (!r->vec[i]) {
                apireq_fail(a, 500, "the runner sent no vector for an input");
                return;
            }
        apireq_reply(a, reply_json(r));
        break;
    case GEN_EVENT_START:
    case GEN_EVENT_DELTA:
    case GEN_EVENT_SEQ_DONE:
    case GEN_EVENT_ERROR:
        break;
    }
}

static const struct apireq_api OPENAI_EMBEDDINGS = {
    .name = "openai",
    .framing = APIREQ_SSE,
    .error_json = openai_error,
    .event = on_event,
    .free = ereq_free,
};

static const struct apireq_api OLLAMA_EMBEDDINGS = {
    .name = "ollama",
    .framing = APIREQ_NDJSON,
    .error_json = ollama_error_json,
    .event = on_event,
    .free = ereq_free,
};

static void handle(struct http_request *req, const struct gen *g, enum embeddings_route route)
{
    struct textgen_params p;
    textgen_params_init(&p);
    struct embeddings_opts o = {0};
    struct json_err e = {{0}, {0}};
    int status = embeddings_parse_request(route, http_req_json(req), &p, &o, &e);
    http_error_fn errors = route == EMBEDDINGS_OPENAI ? openai_error : ollama_error_json;
    struct ereq *r = status ? NULL : calloc(1, sizeof *r);
    if (r && !(r->vec = calloc((size_t)p.n_embed, sizeof *r->vec))) {
        free(r);
        r = NULL;
    }
    if (!r) {
        textgen_params_clear(&p);
        apiutil_reply_error(req, errors, status ? status : 500, status ? e.message : "out of memory",
                            status && e.path[0] ? e.path : NULL);
        return;
    }
    r->route = route;
    r->base64 = o.base64;
    r->n = p.n_embed;
    r->started_ns = clock_ns();
    snprintf(r->model, sizeof r->model, "%s", p.model);
    apireq_run(req, g, route == EMBEDDINGS_OPENAI ? &OPENAI_EMBEDDINGS : &OLLAMA_EMBEDDINGS, r, false, &p);
}

static void h_openai(struct http_request *req, void *ctx) { handle(req, ctx, EMBEDDINGS_OPENAI); }
static void h_ollama(struct http_request *req, void *ctx) { handle(req, ctx, EMBEDDINGS_OLLAMA); }
static void h_ollama_legacy(struct http_request *req, void *ctx) { handle(req, ctx, EMBEDDINGS_OLLAMA_LEGACY); }

int embeddings_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen)
{
    static const struct {
        const char *path;
        http_handler_fn fn;
        http_error_fn errors;
    } routes[] = {
        {"/v1/embeddings", h_openai, openai_error},
        {"/api/embed", h_ollama, ollama_error_json},
        {"/api/embeddings", h_ollama_legacy, ollama_error_json},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        int rc = http_route_errors(srv, "POST", routes[i].path, routes[i].fn, (void *)g, routes[i].errors);
        if (rc)
            return cairn_fail(err, errlen, rc, "route POST %s: %s", routes[i].path, cairn_strerror(rc));
    }
    return 0;
}
