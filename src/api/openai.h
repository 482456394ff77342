/* OpenAI-compatible endpoints over a text generation backend (api/gen.h):
 *   POST /v1/chat/completions   chat.completion, or with "stream": true an SSE stream
 *                               of chat.completion.chunk objects ending "data: [DONE]"
 *   POST /v1/completions        text_completion (raw prompt, no template), same streaming
 *   GET  /v1/models             {"object": "list", "data": [{"id", "object": "model",
 *                                "created", "owned_by": "cairn"}]}
 *   GET  /v1/models/<id>        one of them (ids may hold '/'), 404 when unknown
 *
 * Request fields follow OpenAI's reference (model, messages or prompt, max_tokens /
 * max_completion_tokens, temperature, top_p, stop, n, logprobs, top_logprobs,
 * logit_bias, presence/frequency_penalty, seed, tools, tool_choice, response_format,
 * stream, stream_options) plus the extensions of common local servers: top_k, min_p,
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

#include <stddef.h>

#include "api/gen.h"
#include "api/http.h"

/* Adds the routes above to srv (before http_server_start). g (and what it points to)
 * must outlive the server: requests in flight hold it until they end. CAIRN_EINVAL or
 * CAIRN_ENOMEM from http_route, with the route in err. */
int openai_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen);

#endif
