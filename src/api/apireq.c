/* The life of one front-end request (apireq.h). */
#include "api/apireq.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/apiutil.h"
#include "api/sse.h"
#include "base/err.h"
#include "base/thread.h"
#include "base/log.h"

#define ERR_MAX 512

struct apireq {
    const struct apireq_api *api;
    void *self; /* the front-end's state, freed with the request */
    const struct gen *g;
    struct http_stream *s; /* the deferred reply, released with the last reference */
    bool stream;

    pthread_mutex_t mu; /* the lifecycle fields below */
    int refs;           /* the handler's and the generation's */
    bool gen_live;      /* events may still come */
    bool have_handle;   /* submit returned: handle is known */
    bool cancel_wanted; /* a cancel came before that: the handler makes it */
    bool cancelling;    /* a canceller claimed the cancel and the generation's reference */
    uint64_t handle;

    /* The reply: the handler's until submit returns, then the event callback's alone
     * (events come one at a time, and none after a refused submit). */
    bool started; /* a non-ERROR event came (streamed: the reply started) */
    bool over;    /* nothing more goes to the client */
};

static void unref(struct apireq *r)
{
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    /* The last reference may go inside the stream's close callback (after a cancel);
     * releasing there is allowed (http.h). A close callback running on another thread
     * is waited for by the release; it finds gen_live false and returns. */
    http_stream_release(r->s);
    r->api->free(r->self);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Cancels the generation (the caller claimed it by setting cancelling) and drops the
 * generation's reference: no event runs once cancel has returned. */
static void cancel_claimed(struct apireq *r)
{
    r->g->ops->cancel(r->g->self, r->handle);
    pthread_mutex_lock(&r->mu);
    r->gen_live = false;
    pthread_mutex_unlock(&r->mu);
    unref(r);
}

/* Claims the cancel of a generation still running; r->mu held. True when the caller
 * must now call cancel_claimed; before submit returned the handler is asked to. */
static bool claim_cancel(struct apireq *r)
{
    if (!r->gen_live || r->cancelling)
        return false;
    if (!r->have_handle) {
        r->cancel_wanted = true;
        return false;
    }
    r->cancelling = true;
    return true;
}

/* The client went away or the server is stopping. */
static void on_close(void *arg, struct http_stream *s, enum http_stream_state why)
{
    struct apireq *r = arg;
    (void)s;
    (void)why;
    pthread_mutex_lock(&r->mu);
    bool cancel = claim_cancel(r);
    pthread_mutex_unlock(&r->mu);
    if (cancel)
        cancel_claimed(r);
}

static void *cancel_thread(void *arg)
{
    cancel_claimed(arg);
    return NULL;
}

/* The client reads too slowly and its stream was shut (TOO_SLOW, which runs no close
 * callback). We are on the backend's callback, which must not cancel (cancel may wait
 * for this very callback), so a short-lived thread does. */
static void cut_off(struct apireq *r)
{
    pthread_mutex_lock(&r->mu);
    bool cancel = claim_cancel(r);
    pthread_mutex_unlock(&r->mu);
    if (!cancel)
        return;
    if (thread_start_detached(cancel_thread, r, 0)) {
        pthread_mutex_lock(&r->mu);
        r->cancelling = false; /* the generation runs to its end unseen */
        pthread_mutex_unlock(&r->mu);
        log_warn("%s: could not start a thread to cancel a stream too slow to read",
                 r->api->name);
    }
}

bool apireq_streamed(const struct apireq *r)
{
    return r->stream;
}

bool apireq_over(const struct apireq *r)
{
    return r->over;
}

/* Ends the reply after a failed write: EFULL cut the client off; anything else (out of
 * memory, a closed stream) finishes what may still be open. */
static int write_failed(struct apireq *r, int rc)
{
    r->over = true;
    if (rc == CAIRN_EFULL)
        cut_off(r);
    else
        http_stream_finish(r->s);
    return rc;
}

int apireq_send(struct apireq *r, const char *event, json_t *j)
{
    if (r->over) {
        json_decref(j);
        return CAIRN_ESTATE;
    }
    int rc = !j                                  ? CAIRN_ENOMEM
             : r->api->framing == APIREQ_NDJSON ? http_stream_json_line(r->s, j)
                                                 : sse_json(r->s, event, j);
    json_decref(j);
    return rc ? write_failed(r, rc) : 0;
}

int apireq_send_text(struct apireq *r, const char *event, const char *data)
{
    if (r->over)
        return CAIRN_ESTATE;
    int rc;
    if (r->api->framing == APIREQ_SSE) {
        rc = sse_send(r->s, event, NULL, data);
    } else {
        size_t n = strlen(data);
        char *line = malloc(n + 1);
        if (line) {
            memcpy(line, data, n);
            line[n] = '\n';
        }
        rc = line ? http_stream_write(r->s, line, n + 1) : CAIRN_ENOMEM;
        free(line);
    }
    return rc ? write_failed(r, rc) : 0;
}

void apireq_finish(struct apireq *r)
{
    r->over = true;
    http_stream_finish(r->s);
}

void apireq_fail(struct apireq *r, int status, const char *message)
{
    if (r->over)
        return;
    status = status >= 400 && status <= 599 ? status : 500;
    if (r->stream && r->started) {
        apireq_send(r, r->api->error_event, r->api->error_json(status, message, NULL));
        apireq_finish(r);
        return;
    }
    r->over = true;
    apiutil_stream_reply_error(r->s, r->api->error_json, status, message, NULL);
}

void apireq_reply(struct apireq *r, json_t *body)
{
    if (r->over) {
        json_decref(body);
        return;
    }
    if (!body) {
        apireq_fail(r, 500, "out of memory");
        return;
    }
    r->over = true;
    http_stream_reply_json(r->s, 200, body);
}

/* A backend's refusal or ERROR, in the API's terms. */
static void backend_error(struct apireq *r, int status, const char *message)
{
    char text[ERR_MAX];
    status = status >= 400 && status <= 599 ? status : 500;
    if (r->api->backend_status) {
        status = r->api->backend_status(status, message, text, sizeof text);
        message = text;
    }
    apireq_fail(r, status, message);
}

static void deliver(struct apireq *r, const struct gen_event *ev)
{
    if (r->over)
        return;
    if (ev->kind == GEN_EVENT_ERROR) {
        backend_error(r, ev->status,
                      ev->message && ev->message[0] ? ev->message : "generation failed");
        return;
    }
    if (!r->started) {
        r->started = true;
        int rc = !r->stream                         ? 0
                 : r->api->framing == APIREQ_SSE ? sse_start_deferred(r->s)
                                                  : http_stream_start(r->s, 200, "application/x-ndjson");
        if (rc) {
            r->over = true;
            return;
        }
        if (ev->kind != GEN_EVENT_START) {
            struct gen_event start = {.kind = GEN_EVENT_START};
            r->api->event(r, r->self, &start);
        }
    } else if (ev->kind == GEN_EVENT_START) {
        return; /* START comes once */
    }
    if (!r->over)
        r->api->event(r, r->self, ev);
}

static void on_event(void *arg, const struct gen_event *ev)
{
    struct apireq *r = arg;
    pthread_mutex_lock(&r->mu);
    bool cancelling = r->cancelling;
    pthread_mutex_unlock(&r->mu);
    if (!cancelling)
        deliver(r, ev);
    if (ev->kind != GEN_EVENT_END && ev->kind != GEN_EVENT_ERROR)
        return;
    pthread_mutex_lock(&r->mu);
    bool mine = !r->cancelling; /* else the canceller drops the reference */
    if (mine)
        r->gen_live = false;
    pthread_mutex_unlock(&r->mu);
    if (mine)
        unref(r);
}

void apireq_run(struct http_request *req, const struct gen *g, const struct apireq_api *api,
                void *self, bool stream, struct textgen_params *p)
{
    struct apireq *r = calloc(1, sizeof *r);
    if (!r || http_reply_defer(req, &r->s) != 0) {
        free(r);
        api->free(self);
        textgen_params_clear(p);
        apiutil_reply_error(req, api->error_json, 500, "out of memory", NULL);
        return;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->api = api;
    r->self = self;
    r->g = g;
    r->stream = stream;
    r->refs = 2;
    r->gen_live = true;
    http_stream_on_close(r->s, on_close, r);

    char err[ERR_MAX] = "";
    uint64_t handle = 0;
    int status = g->ops->submit(g->self, p, on_event, r, &handle, err, sizeof err);
    textgen_params_clear(p); /* submit took what p owned */
    if (status != 0) {
        pthread_mutex_lock(&r->mu);
        r->gen_live = false;
        pthread_mutex_unlock(&r->mu);
        backend_error(r, status, err[0] ? err : "the request was refused");
        unref(r); /* the generation's: no event will come */
    } else {
        pthread_mutex_lock(&r->mu);
        r->handle = handle;
        r->have_handle = true;
        bool cancel = r->cancel_wanted && r->gen_live && !r->cancelling;
        if (cancel)
            r->cancelling = true;
        pthread_mutex_unlock(&r->mu);
        if (cancel)
            cancel_claimed(r);
    }
    unref(r);
}
