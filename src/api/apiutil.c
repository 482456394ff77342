#define _GNU_SOURCE
#include "api/apiutil.h"

#include "tok/grammar.h"
#include "tok/jschema.h"
#include "node/hubref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/json.h"
#include "proto/ids.h"

int apiutil_opt_stop(const json_t *obj, const char *path, const char *key, bool one_string,
                     struct textgen_params *p, struct json_err *e)
{
    const json_t *v = json_opt_get(obj, key, NULL);
    if (!v)
        return 0;
    char name[JSON_ERR_PATH_MAX], at[JSON_ERR_PATH_MAX];
    json_member_path(name, sizeof name, path, key);
    bool single = one_string && json_is_string(v);
    if ((!single && !json_is_array(v)) || json_array_size(v) > TEXTGEN_MAX_STOP)
        return json_fail(e, name, "expected %san array of at most %d strings",
                         one_string ? "a string or " : "", TEXTGEN_MAX_STOP);
    size_t n = single ? 1 : json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = single ? v : json_array_get(v, i);
        size_t len = json_string_length(s);
        json_path(at, sizeof at, single ? "%s" : "%s[%zu]", name, i);
        if (!json_is_string(s) || len < 1 || len > TEXTGEN_MAX_STOP_BYTES)
            return json_fail(e, at, "expected a string of 1..%d bytes", TEXTGEN_MAX_STOP_BYTES);
        if (p->n_stop >= TEXTGEN_MAX_STOP)
            return json_fail(e, name, "at most %d stop strings", TEXTGEN_MAX_STOP);
        if (!(p->stop[p->n_stop] = strndup(json_string_value(s), len)))
            return CAIRN_ENOMEM;
        p->n_stop++;
    }
    return 0;
}

int apiutil_parse_status(int rc, struct json_err *e)
{
    if (rc == CAIRN_ENOMEM) {
        json_fail(e, "", "out of memory");
        return 500;
    }
    return rc ? cairn_http_status(rc) : 0;
}

int apiutil_flatten_content(const json_t *content, const char *path, char **out,
                            struct json_err *e)
{
    *out = NULL;
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        *out = strndup(json_string_value(content), json_string_length(content));
        return *out ? 0 : CAIRN_ENOMEM;
    }
    if (!json_is_array(content))
        return json_fail(e, path, "expected a string or an array of content parts");
    struct strbuf b = {0};
    char p[JSON_ERR_PATH_MAX];
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        const json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        int rc = 0;
        if (!json_is_object(part)) {
            json_path(p, sizeof p, "%s[%zu]", path, i);
            rc = json_fail(e, p, "expected a content part object");
        } else if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            json_path(p, sizeof p, "%s[%zu].type", path, i);
            rc = json_fail(e, p, "%s%s%s content parts are not supported, only \"text\"",
                           json_is_string(type) ? "\"" : "",
                           json_is_string(type) ? json_string_value(type) : "untyped",
                           json_is_string(type) ? "\"" : "");
        } else if (!json_is_string(text)) {
            json_path(p, sizeof p, "%s[%zu].text", path, i);
            rc = json_fail(e, p, "expected a string");
        } else if ((i > 0 && strbuf_put(&b, "\n", 1)) ||
                   strbuf_put(&b, json_string_value(text), json_string_length(text))) {
            rc = CAIRN_ENOMEM;
        }
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

const char *apiutil_text(const struct strbuf *b)
{
    return b->p ? b->p : "";
}

json_t *apiutil_text_json(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j || !s)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return NULL;
    for (char *c = copy; *c; c++)
        if ((unsigned char)*c >= 0x80)
            *c = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

bool apiutil_put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

const char *apiutil_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static int clamp_status(int status)
{
    return status >= 400 && status <= 599 ? status : 500;
}

void apiutil_reply_error(struct http_request *req, http_error_fn fmt, int status,
                         const char *message, const char *param)
{
    status = clamp_status(status);
    json_t *j = fmt(status, message, param);
    if (!j) {
        http_reply_error(req, 500, "server_error", "out of memory");
        return;
    }
    if (status == 503 || status == 529)
        http_reply_header(req, "Retry-After", "1");
    http_reply_json(req, status, j);
}

void apiutil_stream_reply_error(struct http_stream *s, http_error_fn fmt, int status,
                                const char *message, const char *param)
{
    status = clamp_status(status);
    json_t *j = fmt(status, message, param);
    if (!j) {
        http_stream_reply_error(s, 500, "server_error", "out of memory");
        return;
    }
    if (status == 503 || status == 529)
        http_stream_header(s, "Retry-After", "1");
    http_stream_reply_json(s, status, j);
}

uint64_t apiutil_random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v)
        return v;
    /* splitmix64's finalizer over the clock and a stack address: unique enough for ids
     * when the kernel gives nothing. */
    uint64_t z = (uint64_t)clock_ns() ^ (uint64_t)(uintptr_t)&v;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t apiutil_random_seed(void)
{
    return apiutil_random_u64() & (uint64_t)IDS_COUNTER_MAX;
}

void apiutil_random_id(char *dst, size_t cap, const char *prefix)
{
    uint64_t a = apiutil_random_u64(), b = apiutil_random_u64();
    snprintf(dst, cap, "%s%016llx%08llx", prefix ? prefix : "", (unsigned long long)a,
             (unsigned long long)(b & 0xffffffffull));
}

void apiutil_missing_model(const char *name, char *out, size_t cap)
{
    if (hubref_looks_like(name))
        snprintf(out, cap, "model '%.200s' is not on any node of the cluster: pull it first (cairn pull %.200s, or "
                           "POST /api/pull)", name, name);
    else
        snprintf(out, cap, "model '%.200s' not found", name);
}

int apiutil_grammar_gbnf(const char *gbnf, size_t len, const char *path, struct textgen_params *p,
                         struct json_err *e)
{
    if (len > TEXTGEN_MAX_GRAMMAR)
        return json_fail(e, path, "a grammar of %zu bytes, at most %zu", len, TEXTGEN_MAX_GRAMMAR);
    char err[512];
    struct grammar *g = NULL;
    int rc = grammar_parse(&g, gbnf, len, "root", err, sizeof err);
    grammar_release(g);
    if (rc == CAIRN_ENOMEM)
        return rc;
    if (rc)
        return json_fail(e, path, "%s", err);
    char *copy = malloc(len + 1);
    if (!copy)
        return CAIRN_ENOMEM;
    memcpy(copy, gbnf, len);
    copy[len] = 0;
    free(p->grammar);
    p->grammar = copy;
    return 0;
}

int apiutil_grammar_schema(const json_t *schema, const char *path, struct textgen_params *p, struct json_err *e)
{
    if (!schema) {
        const char *any = jschema_any_object_gbnf();
        return apiutil_grammar_gbnf(any, strlen(any), path, p, e);
    }
    char *gbnf = NULL, err[512];
    int rc = jschema_to_gbnf(schema, &gbnf, err, sizeof err);
    if (rc == CAIRN_ENOMEM)
        return rc;
    if (rc)
        return json_fail(e, path, "%s", err);
    rc = apiutil_grammar_gbnf(gbnf, strlen(gbnf), path, p, e);
    free(gbnf);
    return rc;
}

int apiutil_parse_model(const json_t *body, struct textgen_params *p, struct json_err *e)
{
    const json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m))
        return json_fail(e, "model", "required");
    if (!json_is_string(m))
        return json_fail(e, "model", "expected a string");
    if (!ids_valid_model(json_string_value(m)))
        return json_fail(e, "model", "not a valid model id (1..%d of A-Z a-z 0-9 ._:/@+-)",
                         IDS_MODEL_MAX);
    snprintf(p->model, sizeof p->model, "%s", json_string_value(m));
    return 0;
}
