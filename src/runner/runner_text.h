/* The text of one generated sequence, as a runner's text task streams it: token ids are
 * detokenized incrementally, then pass through the stop strings, the reasoning splitter
 * (think tags) and the tool-call splitter, in that order (or, for gpt-oss, the harmony
 * splitter, which does both), so that a stop string ends the
 * text wherever it falls and no marker or tag reaches the client. What each token
 * makes ready is taken with text_seq_take; text_seq_finish flushes every stage and
 * returns the tool calls found. */
#ifndef CAIRN_RUNNER_RUNNER_TEXT_H
#define CAIRN_RUNNER_RUNNER_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/sched.h"
#include "tok/harmony.h"
#include "tok/reasoning.h"
#include "tok/stopstr.h"
#include "tok/tok.h"
#include "tok/toolcall.h"

struct text_seq_opts {
    const struct tok *tok;
    const char *const *stops; /* n_stops stop strings */
    size_t n_stops;
    bool reasoning;           /* split think tags (reasoning_opts below) */
    struct reasoning_opts reasoning_opts;
    enum toolcall_format tools; /* TOOLCALL_NONE: no tool calls parsed */
    bool harmony;             /* gpt-oss's channels and calls (tok/harmony.h), instead of the
                                 reasoning and tool-call splitters */
    uint64_t id_seed;         /* tool call ids */
    bool logprobs;
};

struct text_seq;

int text_seq_create(struct text_seq **out, const struct text_seq_opts *o, char *err, size_t errlen);
void text_seq_release(struct text_seq *s);

/* Feeds one generated token. Returns 1 when a stop string matched (the sequence should
 * end now), 0 to go on, CAIRN_ENOMEM. */
int text_seq_token(struct text_seq *s, const struct sched_token *t);

/* Ends the text: flushes every stage; *tool_calls gets a new array (NULL when there is
 * none or tools are off). 0 or CAIRN_ENOMEM. */
int text_seq_finish(struct text_seq *s, json_t **tool_calls);

/* What is ready to send: content and reasoning text (NUL-terminated, valid until the
 * next call) and the logprobs entries (a new array or NULL). Returns false when nothing
 * is ready. The buffers are emptied. */
bool text_seq_take(struct text_seq *s, const char **content, const char **reasoning, json_t **logprobs);

/* The stop string that matched (index into opts.stops) or -1. */
int text_seq_stop_matched(const struct text_seq *s);

#endif
