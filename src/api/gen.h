/* Text generation as the API front-ends (openai.c, ollama.c, anthropic.c) see it: submit
 * a request in the common form (proto/textgen.h), then receive its events until END or
 * ERROR. The real backend (gen_node.c) resolves the model to a ready instance (placing
 * one when the cluster has the model but no instance), turns the request into a
 * TextGeneration command and relays what the runner streams back; tests of the
 * front-ends may give their own ops.
 *
 * Events of one request, in order: START once (the runner took it: prompt tokens known),
 * DELTA any number of times per sequence, SEQ_DONE once per sequence (an embedding task:
 * EMBEDDING once per input instead, in any order), END last; or ERROR
 * at any point, last (before START the request was refused: answer with its status).
 * Callbacks run on a backend thread and must not block (write to an http_stream, or
 * collect). Pointers in an event are valid during the callback only. */
#ifndef CAIRN_API_GEN_H
#define CAIRN_API_GEN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "node/hub.h"
#include "proto/textgen.h"

struct gen_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens;       /* prompt tokens reused from the prefix cache */
    int64_t draft_tokens;        /* speculative decoding: drafted */
    int64_t accepted_draft_tokens;
    /* The runner's own times (0: not known): prompt_ms from the scheduler admitting the
     * request to its first token (prefill), predicted_ms from there to the end. */
    double prompt_ms, predicted_ms;
};

enum gen_event_kind {
    GEN_EVENT_START,
    GEN_EVENT_DELTA,
    GEN_EVENT_SEQ_DONE,
    GEN_EVENT_END,
    GEN_EVENT_ERROR,
    GEN_EVENT_EMBEDDING,
};

struct gen_event {
    enum gen_event_kind kind;
    int seq;                  /* DELTA, SEQ_DONE: the choice index, 0..n-1 */
    const char *content;      /* DELTA: text to show, "" when none */
    const char *reasoning;    /* DELTA: reasoning text (think tags), "" when none */
    /* DELTA with logprobs asked: OpenAI's "logprobs.content" entries of this delta's
     * tokens: [{"token", "logprob", "bytes": [int], "top_logprobs": [{"token",
     * "logprob", "bytes"}]}]; NULL otherwise. */
    const json_t *logprobs;
    /* SEQ_DONE: "stop", "length", "tool_calls", "cancelled" or "error". */
    const char *finish;
    const char *stop_sequence; /* SEQ_DONE: the stop string that ended it, or NULL */
    const json_t *tool_calls;  /* SEQ_DONE: [{"id", "type": "function", "function":
                                  {"name", "arguments": JSON text}}] or NULL */
    /* START: prompt_tokens and cached_tokens; SEQ_DONE: that sequence's
     * completion_tokens (and draft counts); END: the totals over the sequences. */
    struct gen_usage usage;
    /* EMBEDDING: input `index` (0..n_embed-1) has the vector embedding (dim values, also
     * as embedding_b64: little-endian float32 in base64) of usage.prompt_tokens tokens. */
    int index, dim;
    const float *embedding;
    const char *embedding_b64;
    int status;               /* ERROR: HTTP status (400, 404, 413, 500, 503 ...) */
    const char *message;      /* ERROR: what went wrong */
};

typedef void (*gen_event_fn)(void *ctx, const struct gen_event *ev);

/* The end of a pull: rc 0 with the model's id, or the HTTP status of the failure with
 * its message. */
typedef void (*gen_pull_done_fn)(void *ctx, int rc, const char *id, const char *message);

struct gen_ops {
    /* Starts a request; takes what *p owns (p is cleared, also on failure). On success
     * *handle names it and events follow (fn with ctx, which must stay valid until END
     * or ERROR was delivered or cancel returned). On failure returns the HTTP status
     * (400 bad field, 404 unknown model, 413 prompt too long, 503 busy or no instance
     * ready in time) with the message in err, and no event is delivered. */
    int (*submit)(void *self, struct textgen_params *p, gen_event_fn fn, void *ctx,
                  uint64_t *handle, char *err, size_t errlen);
    /* Cancels a request (client gone): once it returns no callback of that handle runs
     * or will run. No-op after END or ERROR. Any thread. */
    void (*cancel)(void *self, uint64_t handle);
    /* Ends the generation of the live request whose params had this request_id (a cancel
     * route): its sequences end with finish "stop" and what they generated so far, and
     * END follows as usual. 0, or 404 with err when no request of that id is live on
     * this node. NULL: this gen cannot. */
    int (*stop)(void *self, const char *request_id, char *err, size_t errlen);
    /* New JSON array of the models the cluster can serve: each the card object of
     * GET /models (catalog_card_to_json plus "nodes"), plus "ready": bool (an instance
     * is ready) and "chat_template": template source text or null. NULL when out of
     * memory. */
    json_t *(*models)(void *self);
    /* Pulls a model reference from the hub onto this node (node/hub.h) on a thread of its
     * own: progress (fn) as it goes, then done once; ctx must stay valid until done ran.
     * *cancel, set by another thread, stops it. Returns 0 (done will follow) or an HTTP
     * status with err (done will not run). NULL: this gen cannot pull. */
    int (*pull)(void *self, const char *ref, const atomic_bool *cancel, hub_progress_fn fn, gen_pull_done_fn done,
                void *ctx, char *err, size_t errlen);
    /* Deletes a model's files from this node: 0, or an HTTP status (404 unknown) with
     * err. NULL: this gen cannot. */
    int (*remove)(void *self, const char *model, char *err, size_t errlen);
};

struct gen {
    const struct gen_ops *ops;
    void *self;
};


#endif
