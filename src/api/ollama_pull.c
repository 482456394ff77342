/* Ollama's /api/pull and /api/delete (ollama_pull.h). */
#include "api/ollama_pull.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/gen.h"
#include "node/hubref.h"

static void reply_error(struct http_request *req, int status, const char *message)
{
    http_reply_json(req, status, json_pack("{s:s}", "error", message));
}

/* The model a body names ("model", or Ollama's older "name"); NULL with a reply sent. */
static const char *body_model(struct http_request *req)
{
    const json_t *body = http_req_json(req), *v = json_object_get(body, "model");
    if (!json_is_object(body)) {
        reply_error(req, 400, "request body: expected a JSON object");
        return NULL;
    }
    if (!v || json_is_null(v))
        v = json_object_get(body, "name");
    if (!json_is_string(v) || !json_string_length(v)) {
        reply_error(req, 400, "model is required (a string)");
        return NULL;
    }
    return json_string_value(v);
}

/* One pull in flight: its stream, and what it last said. */
struct pull_req {
    struct http_stream *s;
    bool stream;           /* NDJSON lines; else one answer at the end */
    atomic_bool cancel;    /* the client went away */
    char file[HUBREF_PATH_MAX + 1];
};

static void line(struct pull_req *p, json_t *j)
{
    if (p->stream && j && http_stream_json_line(p->s, j))
        atomic_store(&p->cancel, true); /* closed or too slow: stop pulling */
    json_decref(j);
}

static void on_progress(void *ctx, const struct hub_progress *h)
{
    struct pull_req *p = ctx;
    if (http_stream_closed(p->s))
        atomic_store(&p->cancel, true);
    if (!strcmp(h->status, "listing"))
        line(p, json_pack("{s:s}", "status", "pulling manifest"));
    else if (!strcmp(h->status, "downloading") && h->sha256[0]) {
        char status[96], digest[80];
        snprintf(status, sizeof status, "pulling %.12s", h->sha256);
        snprintf(digest, sizeof digest, "sha256:%s", h->sha256);
        line(p, json_pack("{s:s, s:s, s:I, s:I}", "status", status, "digest", digest, "total",
                          (json_int_t)h->file_total, "completed", (json_int_t)h->file_done));
    } else if (!strcmp(h->status, "verifying"))
        line(p, json_pack("{s:s}", "status", "verifying sha256 digest"));
}

static void on_done(void *ctx, int rc, const char *id, const char *message)
{
    struct pull_req *p = ctx;
    if (!rc && p->stream) {
        line(p, json_pack("{s:s}", "status", "writing manifest"));
        line(p, json_pack("{s:s, s:s}", "status", "success", "model", id));
    } else if (p->stream) {
        line(p, json_pack("{s:s}", "error", message));
    } else if (!rc) {
        http_stream_reply_json(p->s, 200, json_pack("{s:s, s:s}", "status", "success", "model", id));
    } else {
        http_stream_reply_json(p->s, rc, json_pack("{s:s}", "error", message));
    }
    http_stream_finish(p->s);
    http_stream_release(p->s);
    free(p);
}

void ollama_h_pull(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const char *model = body_model(req);
    if (!model)
        return;
    const json_t *st = json_object_get(http_req_json(req), "stream");
    if (st && !json_is_boolean(st) && !json_is_null(st)) {
        reply_error(req, 400, "stream: expected a boolean");
        return;
    }
    if (!g->ops->pull) {
        reply_error(req, 501, "this server cannot pull models");
        return;
    }
    if (!hubref_looks_like(model)) {
        char msg[512];
        snprintf(msg, sizeof msg, "'%.100s' is not a model on the Hugging Face hub: cairn pulls GGUF models named "
                                  "hf.co/OWNER/REPO:TAG (e.g. hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M)",
                 model);
        reply_error(req, 400, msg);
        return;
    }
    struct pull_req *p = calloc(1, sizeof *p);
    if (!p) {
        reply_error(req, 500, "out of memory");
        return;
    }
    p->stream = !json_is_false(st);
    int rc = p->stream ? http_reply_stream(req, 200, "application/x-ndjson", &p->s) : http_reply_defer(req, &p->s);
    char err[512];
    if (!rc)
        rc = g->ops->pull(g->self, model, &p->cancel, on_progress, on_done, p, err, sizeof err);
    else
        snprintf(err, sizeof err, "cannot start the reply");
    if (rc) {
        if (p->s && p->stream)
            line(p, json_pack("{s:s}", "error", err));
        else if (p->s)
            http_stream_reply_json(p->s, rc >= 400 ? rc : 500, json_pack("{s:s}", "error", err));
        else
            reply_error(req, rc >= 400 ? rc : 500, err);
        if (p->s) {
            http_stream_finish(p->s);
            http_stream_release(p->s);
        }
        free(p);
    }
}

void ollama_h_delete(struct http_request *req, void *ctx)
{
    const struct gen *g = ctx;
    const char *model = body_model(req);
    if (!model)
        return;
    if (!g->ops->remove) {
        reply_error(req, 501, "this server cannot delete models");
        return;
    }
    char err[512];
    int rc = g->ops->remove(g->self, model, err, sizeof err);
    if (rc)
        reply_error(req, rc, err);
    else
        http_reply_bytes(req, 200, "application/json", "", 0);
}
