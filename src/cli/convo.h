/* A conversation with a model through a node's OpenAI API, as cairn run holds it: the
 * messages so far (the node renders them through the model's chat template), sampling
 * settings and a system prompt, one streamed answer at a time printed as it comes
 * (reasoning dimmed, tool calls shown, colours only on a terminal) or as one JSON
 * object per answer (--json), and the last answer's timings. */
#ifndef CAIRN_CLI_CONVO_H
#define CAIRN_CLI_CONVO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "cli/client.h"

#define CONVO_MESSAGES_MAX 4096 /* the node's own limit per request */

/* The last answer's figures. */
struct convo_stats {
    bool valid;
    double ttft_ms;          /* from sending the request to its first text, this side */
    double gen_ms;           /* from the first text to the end */
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    int64_t draft_tokens, accepted_draft_tokens;
    double prompt_ms, predicted_ms; /* the runner's own clock (timings), 0 when absent */
    char finish[32];
};

struct convo {
    struct client api;
    char model[512];
    json_t *messages; /* the conversation, system prompt first when set */
    json_t *options;  /* sampling members added to each request (temperature, top_p ...) */
    bool color;       /* ANSI colours (a terminal, and NO_COLOR unset) */
    bool json;        /* one JSON object per answer instead of text */
    FILE *out;
    struct convo_stats last;
};

/* Starts a conversation with model on api; 0, or CAIRN_ENOMEM. Release with convo_release. */
int convo_init(struct convo *c, const struct client *api, const char *model, bool color, bool json, FILE *out);
void convo_release(struct convo *c);

/* Sets (text not NULL) or clears the system prompt, kept as the first message. */
int convo_set_system(struct convo *c, const char *text);

/* Sets a sampling setting from its text ("temperature" "0.7"); unknown names and values
 * out of range are refused with the reason in err (CAIRN_EINVAL). */
int convo_set_option(struct convo *c, const char *name, const char *value, char *err, size_t errlen);

/* Prints the settings and the system prompt. */
void convo_show_settings(const struct convo *c, FILE *f);

/* Asks the model for the answer to user text, printing it as it streams; the turn and
 * the answer join the conversation when it ends whole. *cancel set by another thread or
 * a signal handler stops it (the request is cancelled on the node; the turn is dropped).
 * 0 on a whole answer, 1 when cancelled, else a CAIRN_E* code with the reason in err. */
int convo_ask(struct convo *c, const char *text, const atomic_bool *cancel, char *err, size_t errlen);

/* Prints the last answer's figures. */
void convo_show_stats(const struct convo *c, FILE *f);

#endif
