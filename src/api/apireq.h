/* One generation request of an API front-end (openai.c, ollama.c, anthropic.c), from
 * the handler's deferred reply to its one free: submit, the events, cancel when the
 * client hangs up or reads too slowly, the plain error reply of a refusal or of an
 * ERROR before START, and the streamed reply started on START.
 *
 * Lifetime: the request holds two references, the handler's (until apireq_run returns)
 * and the generation's (until END or ERROR was delivered, or cancel returned). The
 * stream's close callback holds none but cannot outlive the stream, which is released
 * only with the last reference. Who ends the generation is decided under the request's
 * lock: the event callback at END or ERROR unless a cancel was claimed first, in which
 * case the canceller drops the generation's reference once cancel has returned (no
 * callback runs after that). A cancel wanted before submit returned (no handle yet) is
 * made by the handler when it does. cancel (which may wait for a callback of the
 * backend in flight) is never called with the lock held nor from the backend's callback:
 * a client too slow to read (its stream shut as TOO_SLOW, which runs no close callback)
 * is cut off by a short-lived thread.
 *
 * The front-end sees the events one at a time, in order, on the backend's thread (or
 * inside submit): START once and first (made up, with no usage, when the backend's first
 * event is another), then DELTA, SEQ_DONE and END; never ERROR, which apireq answers
 * itself; and nothing once the reply is over. A streamed reply has started (200, SSE or
 * NDJSON) when START reaches the front-end. */
#ifndef CAIRN_API_APIREQ_H
#define CAIRN_API_APIREQ_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"

struct apireq;

enum apireq_framing {
    APIREQ_SSE,    /* text/event-stream, ": ping" comments when idle */
    APIREQ_NDJSON, /* application/x-ndjson, one JSON object a line */
};

/* What a front-end tells apireq about its API (static, shared by its requests). */
struct apireq_api {
    const char *name;            /* in log lines: "openai" */
    enum apireq_framing framing; /* of a streamed reply */
    const char *error_event;     /* SSE event name of an error after START, or NULL */
    http_error_fn error_json;    /* the API's error body */
    /* Optional: the status an API client gets for a backend's refusal or ERROR status
     * (400..599, else 500 before this), with the message written into out. */
    int (*backend_status)(int status, const char *message, char *out, size_t cap);
    /* Each event but ERROR (see above); self is the front-end's state. */
    void (*event)(struct apireq *r, void *self, const struct gen_event *ev);
    /* Frees self; called once, when the request is freed. */
    void (*free)(void *self);
};

/* Runs one request for the handler of req: defers the reply, submits p to g (what p
 * owns is taken and p cleared) and answers a refusal as a plain error. stream: the
 * client asked for a streamed reply. self (not NULL) is the front-end's state, owned
 * by the request from now on (api->free frees it, also when this fails: then the reply
 * is a 500). Returns once submitted; the events run on the backend's thread. */
void apireq_run(struct http_request *req, const struct gen *g, const struct apireq_api *api,
                void *self, bool stream, struct textgen_params *p);

/* --- For the front-end's event callback --- */

/* True when the client asked for a streamed reply. */
bool apireq_streamed(const struct apireq *r);

/* True once nothing more goes to the client (answered, finished, failed or gone). */
bool apireq_over(const struct apireq *r);

/* Streamed: queues one message whose data is j (taken; NULL means out of memory): an
 * SSE event named event (NULL: none), or an NDJSON line (event unused). A failed write
 * ends the reply (a client too slow to read is cut off, its generation cancelled), out
 * of memory finishes the stream. 0, or the error (CAIRN_ESTATE once over). */
int apireq_send(struct apireq *r, const char *event, json_t *j);

/* As apireq_send with the data as text (SSE data, or an NDJSON line without "\n"). */
int apireq_send_text(struct apireq *r, const char *event, const char *data);

/* Ends the reply with an error: a streamed reply that started gets the API's error body
 * as its last message (error_event), any other a plain error reply (apiutil's rules:
 * Retry-After on 503 and 529). No-op once over. */
void apireq_fail(struct apireq *r, int status, const char *message);

/* Ends a streamed reply: what is queued still goes out, then the stream closes. */
void apireq_finish(struct apireq *r);

/* Answers a reply that was not streamed: 200 with body (taken; NULL: out of memory,
 * answered as a 500). No-op once over. */
void apireq_reply(struct apireq *r, json_t *body);

#endif
