/* OpenAI-compatible endpoints over a text generation backend (api/gen.h):
 *   POST /v1/chat/completions   chat.completion, or with "stream": true an SSE stream
 *                               of chat.completion.chunk objects ending "data: [DONE]"
 *   POST /v1/completions        text_completion (raw prompt, no template: text, token ids,
 *                               or an array of one of them), same streaming
 *   GET  /v1/models             {"object": "list", "data": [{"id", "object": "model",
 *                                "created", "owned_by": "cairn"}]}
 *   GET  /v1/models/<id>        one of them (ids may hold '/'), 404 when unknown
 *
 * Request fields follow OpenAI's reference (model, messages or prompt, max_tokens /
 * max_completion_tokens, temperature, top_p, stop, n, logprobs, top_logprobs,
 * logit_bias, presence/frequency_penalty, seed, tools, tool_choice, parallel_tool_calls
 * (false: a choice carries only the model's first call), response_format, stream,
 * stream_options) plus the extensions of common local servers: top_k, min_p,
 * repetition_penalty, ignore_eos, chat_template_kwargs, enable_thinking and
 * reasoning_effort (into the template's kwargs: reasoning_effort "none" sets
 * enable_thinking false, another level passes reasoning_effort; enable_thinking wins
 * over reasoning_effort and chat_template_kwargs over both). Unknown fields are
 * ignored. Without a seed each request draws a random one; without max_tokens
 * generation runs to its end or a full context (also for /v1/completions, where
 * OpenAI's default is 16). A wrong type or range is refused with 400 in OpenAI's error
 * shape {"error": {"message", "type": "invalid_request_error", "param": field,
 * "code": null}}; backend refusals keep their status (404 code "model_not_found", 413
 * code "context_length_exceeded", 503 type "server_error" with Retry-After: 1), and a
 * reply not streamed whose generation failed or was cancelled gets 500 or 503.
 *
 * Streams start when the backend takes the request (an error before that is a plain
 * JSON error with its status); each choice's first chunk carries delta.role
 * "assistant"; a choice that ends "cancelled" or "error" ends the stream with a
 * data: {"error": {...}} event and no [DONE]. A client that hangs up cancels the
 * generation, and so does one too slow to read (its stream queue overflowed). */
#ifndef CAIRN_API_OPENAI_H
#define CAIRN_API_OPENAI_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"
#include "base/json.h"

enum openai_route { OPENAI_CHAT, OPENAI_COMPLETION };

/* What a request asks of the reply rather than of the generation. */
struct openai_reply_opts {
    bool stream, include_usage;
    bool one_tool_call; /* parallel_tool_calls false: the first call of a choice only */
};

/* Checks the body of a POST to /v1/chat/completions (OPENAI_CHAT) or /v1/completions
 * (parsed JSON, NULL when it is none) into p (textgen_params_init'ed; the caller clears
 * it, also on failure) and o. Returns 0, or the HTTP status of the refusal (400; 500
 * out of memory) with e saying why (message never empty; path the field, or ""). */
int openai_parse_request(enum openai_route route, const json_t *body, struct textgen_params *p,
                         struct openai_reply_opts *o, struct json_err *e);

/* Adds the routes above to srv (before http_server_start). g (and what it points to)
 * must outlive the server: requests in flight hold it until they end. CAIRN_EINVAL or
 * CAIRN_ENOMEM from http_route, with the route in err. */
int openai_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen);

/* OpenAI's error object {"error": {"message", "type", "param", "code"}} for an HTTP status
 * (code: not_found_code for a 404, context_length_exceeded for a 413); NULL when out of
 * memory. */
json_t *openai_error_json(int status, const char *message, const char *param, const char *not_found_code);

#endif
