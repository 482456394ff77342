/* Anthropic-compatible Messages endpoint over a text generation backend (api/gen.h), in
 * the shapes the official SDKs (@anthropic-ai/sdk, anthropic) read:
 *   POST /v1/messages  {"model", "max_tokens" (required, >= 1), "messages", "system",
 *                       "stop_sequences", "temperature" (0..1), "top_p", "top_k",
 *                       "tools", "tool_choice", "thinking", "metadata", "stream"}
 * Reply: {"id": "msg_...", "type": "message", "role": "assistant", "model", "content":
 * [{"type": "thinking", "thinking", "signature": ""} | {"type": "text", "text"} |
 * {"type": "tool_use", "id", "name", "input": object}], "stop_reason": "end_turn" |
 * "max_tokens" | "stop_sequence" | "tool_use", "stop_sequence": text or null, "usage":
 * {"input_tokens" (prompt tokens not read from the prefix cache), "output_tokens",
 * "cache_read_input_tokens", "cache_creation_input_tokens": 0}}. With "stream": true,
 * server-sent events "event: <type>\ndata: <json>": message_start (the message with
 * empty content), ping, then per content block content_block_start, content_block_delta
 * (text_delta, thinking_delta, input_json_delta) and content_block_stop, then
 * message_delta ({"delta": {"stop_reason", "stop_sequence"}, "usage": {"output_tokens"}})
 * and message_stop. Idle streams get ": ping" comments.
 *
 * Messages map to the common form (textgen.h): system (a string or text blocks) first,
 * user text blocks joined with "\n", tool_result blocks as "tool" messages (tool_use_id
 * as tool_call_id), assistant tool_use blocks as tool_calls (input as the arguments
 * object), thinking blocks as reasoning_content. Tools become OpenAI-shaped functions
 * (input_schema as parameters); tool_choice "none" drops them and {"type": "tool"}
 * keeps only the named one ("auto" and "any" keep all: the model is not forced).
 * thinking {"type": "enabled"} (or "adaptive") sets the template's enable_thinking,
 * "disabled" clears it. Unset sampling parameters keep the node's defaults; every
 * request without a seed gets a random one.
 *
 * Errors: {"type": "error", "error": {"type", "message"}} with the status: 400
 * invalid_request_error for a wrong type or range (naming the field), images and
 * documents, and a prompt too long for the context ("prompt is too long: ...", the text
 * clients look for to compact a conversation); 404 not_found_error for an unknown
 * model; 529 overloaded_error (Retry-After: 1) when the backend is busy or has no
 * instance ready, the status Anthropic uses for overload, which the SDKs retry as they
 * retry any 5xx; 500 api_error otherwise. A stream starts when the backend takes the
 * request; an error after that is an "error" event that ends it. A client that hangs
 * up cancels the generation. */
#ifndef CAIRN_API_ANTHROPIC_H
#define CAIRN_API_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"
#include "base/json.h"

/* Checks the body of a POST to /v1/messages (parsed JSON, NULL when it is none) into p
 * (textgen_params_init'ed; the caller clears it, also on failure; p->model is the
 * model the client named) and *stream. Returns 0, or the HTTP status of the refusal
 * (400; 404 for a model name no model can have; 500 out of memory) with e's message
 * saying why (never empty). */
int anthropic_parse_request(const json_t *body, struct textgen_params *p, bool *stream, struct json_err *e);

/* Adds the route above to srv (before http_server_start). g (and what it points to)
 * must outlive the server: requests in flight use it until http_server_stop returns.
 * CAIRN_EINVAL or CAIRN_ENOMEM from http_route, with the route in err. */
int anthropic_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen);

#endif
