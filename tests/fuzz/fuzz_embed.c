/* libFuzzer harness of the embedding requests and the lines that carry their vectors.
 * The first input byte picks what the rest is:
 *   0..2  the body of POST /v1/embeddings, /api/embed or /api/embeddings, parsed as the
 *         server parses it and given to embeddings_parse_request: a refusal is a 4xx (500
 *         only for out of memory) whose message starts with its path; accepted inputs are
 *         within the limits of proto/textgen.h and reach the runner (textgen_params JSON)
 *         unchanged;
 *   3     a task line from a runner (task_msg_decode): an accepted "embedding" line has a
 *         whole number of float32 values, decodes to them or is refused (not finite), and
 *         encodes back to the same base64;
 *   4     a task's params as the runner reads them (textgen_params_from_json): accepted
 *         embed inputs and prompt batches are within their limits and survive the trip.
 * Built and run by run.sh. */
#include "api/embeddings.h"
#include "api/http.h"
#include "api/json_scan.h"
#include "base/err.h"
#include "proto/ids.h"
#include "proto/taskmsg.h"
#include "proto/textgen.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "fuzz_embed: %s:%d: %s\n", __FILE__, __LINE__, #c);   \
            abort();                                                              \
        }                                                                         \
    } while (0)

static void check_inputs(const struct textgen_input *in, int n, int max)
{
    CHECK(n >= 1 && n <= max && in);
    int64_t ids = 0;
    for (int i = 0; i < n; i++) {
        CHECK(!in[i].text != !in[i].ids);
        CHECK(!in[i].text || strlen(in[i].text) <= TEXTGEN_MAX_EMBED_TEXT);
        CHECK(!in[i].ids || (in[i].n_ids >= 1 && in[i].n_ids <= TEXTGEN_MAX_PROMPT_IDS));
        for (int64_t k = 0; in[i].ids && k < in[i].n_ids; k++)
            CHECK(in[i].ids[k] >= 0);
        ids += in[i].n_ids;
    }
    CHECK(ids <= TEXTGEN_MAX_PROMPT_IDS);
}

static bool same_inputs(const struct textgen_input *a, int na, const struct textgen_input *b, int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++) {
        if (!a[i].text != !b[i].text || (a[i].text && strcmp(a[i].text, b[i].text)) || a[i].n_ids != b[i].n_ids ||
            (a[i].ids && memcmp(a[i].ids, b[i].ids, (size_t)a[i].n_ids * sizeof *a[i].ids)))
            return false;
    }
    return true;
}

/* The params JSON back through the runner's reader: the same inputs. */
static void round_trip(const struct textgen_params *p)
{
    char err[512];
    json_t *j = textgen_params_to_json(p);
    CHECK(j);
    struct textgen_params q;
    int rc = textgen_params_from_json(j, &q, err, sizeof err);
    json_decref(j);
    if (rc)
        fprintf(stderr, "the runner refuses what was accepted: %s\n", err);
    CHECK(rc == 0);
    CHECK(same_inputs(p->embed, p->n_embed, q.embed, q.n_embed));
    CHECK(same_inputs(p->batch, p->n_batch, q.batch, q.n_batch));
    CHECK(p->truncate == q.truncate && p->dimensions == q.dimensions && p->n == q.n);
    textgen_params_clear(&q);
}

static void request(enum embeddings_route route, const json_t *body)
{
    struct textgen_params p;
    struct embeddings_opts o = {0};
    struct json_err e = {{0}, {0}};
    textgen_params_init(&p);
    int status = embeddings_parse_request(route, body, &p, &o, &e);
    if (status) {
        CHECK((status >= 400 && status <= 499) || (status == 500 && !strcmp(e.message, "out of memory")));
        CHECK(e.message[0]);
        CHECK(!e.path[0] || !strncmp(e.message, e.path, strlen(e.path)));
    } else {
        CHECK(ids_valid_model(p.model));
        check_inputs(p.embed, p.n_embed, TEXTGEN_MAX_EMBED_INPUTS);
        CHECK(route != EMBEDDINGS_OLLAMA_LEGACY || (p.n_embed == 1 && p.embed[0].text));
        CHECK(p.dimensions >= 0 && p.dimensions <= TEXTGEN_MAX_EMBED_DIM);
        CHECK(!p.messages && !p.prompt && !p.prompt_ids && !p.batch);
        round_trip(&p);
    }
    textgen_params_clear(&p);
}

static void task_line(const char *text, size_t len)
{
    struct task_msg m;
    char err[256];
    if (task_msg_decode(text, len, &m, err, sizeof err)) {
        CHECK(err[0]);
        return;
    }
    if (m.type == RUNNER_MSG_EMBEDDING) {
        CHECK(m.index >= 0 && m.index < TEXTGEN_MAX_EMBED_INPUTS);
        CHECK(m.dim >= 1 && m.dim <= TEXTGEN_MAX_EMBED_DIM && m.embedding);
        float *v = malloc((size_t)m.dim * sizeof *v);
        CHECK(v);
        if (task_embedding_decode(&m, v, err, sizeof err) == 0) {
            for (int i = 0; i < m.dim; i++)
                CHECK(isfinite(v[i]));
            char *b64 = task_embedding_encode(v, m.dim);
            CHECK(b64);
            /* the canonical encoding: the same text unless the input's padding bits were set */
            float *w = malloc((size_t)m.dim * sizeof *w);
            struct task_msg again = m;
            again.embedding = b64;
            CHECK(w && task_embedding_decode(&again, w, err, sizeof err) == 0);
            CHECK(!memcmp(v, w, (size_t)m.dim * sizeof *v));
            free(w);
            free(b64);
        }
        free(v);
        json_t *j = task_msg_to_json(&m);
        CHECK(j);
        json_decref(j);
    }
    task_msg_clear(&m);
}

static void params(const json_t *body)
{
    struct textgen_params p;
    char err[512];
    if (textgen_params_from_json(body, &p, err, sizeof err)) {
        CHECK(err[0]);
        return;
    }
    if (p.embed)
        check_inputs(p.embed, p.n_embed, TEXTGEN_MAX_EMBED_INPUTS);
    if (p.batch) {
        check_inputs(p.batch, p.n_batch, TEXTGEN_MAX_N);
        CHECK(p.n_batch >= 2 && p.n_batch * p.n <= TEXTGEN_MAX_N);
    }
    CHECK((p.messages != NULL) + (p.prompt || p.prompt_ids) + (p.embed != NULL) + (p.batch != NULL) == 1);
    round_trip(&p);
    textgen_params_clear(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int what = data[0] % 5;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (what == 3) {
        task_line(text, len);
        return 0;
    }
    json_t *body = NULL;
    if (len) {
        int depth;
        size_t values;
        http_json_scan(text, len, HTTP_JSON_DEPTH_DEFAULT, HTTP_JSON_VALUES_DEFAULT, &depth, &values);
        if (depth > HTTP_JSON_DEPTH_DEFAULT || values > HTTP_JSON_VALUES_DEFAULT)
            return 0; /* the server answers 400 or 413 itself */
        body = json_loadb(text, len, 0, NULL);
    }
    if (what < 3)
        request((enum embeddings_route)what, body);
    else if (body)
        params(body);
    json_decref(body);
    return 0;
}
