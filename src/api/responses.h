/* OpenAI's Responses API over a text generation backend (api/gen.h):
 *   POST /v1/responses        a "response" object, or with "stream": true an SSE stream
 *                             of typed events (response.created, response.in_progress,
 *                             response.output_item.added, response.content_part.added,
 *                             response.output_text.delta / .done,
 *                             response.reasoning_text.delta / .done,
 *                             response.function_call_arguments.delta / .done,
 *                             response.content_part.done, response.output_item.done,
 *                             then response.completed, or response.incomplete when
 *                             max_output_tokens cut it), each with its sequence_number
 *   GET  /v1/responses/<id>   a stored response (404 when unknown or evicted)
 *   DELETE /v1/responses/<id> drops a stored response ({"id", "object":
 *                             "response.deleted", "deleted": true}; 404 when unknown)
 *
 * A request is turned into a chat completion's (openai.c checks the shared fields):
 * "input" is text (one user message) or items: messages (role user, assistant, system
 * or developer; content text or input_text / output_text parts), function_call items
 * (an assistant's tool call: call_id, name, arguments) and function_call_output items
 * (call_id, output); reasoning items are skipped. "instructions" comes first as a system
 * message and is not carried to the next response. "tools" are function tools ({type:
 * "function", name, description, parameters}); "tool_choice" none, auto, required or
 * {type: "function", name}; "text": {"format": {type: text, json_object, or json_schema
 * with "schema"}} constrains the output (tok/jschema.h); "max_output_tokens",
 * "temperature", "top_p", "reasoning": {"effort"}, and cairn's sampling extensions as on
 * /v1/chat/completions. "previous_response_id" continues a response this node stored:
 * its input and output come before the new input. Responses are stored (unless "store":
 * false) in a bounded memory of RESPONSES_STORE_MAX responses and RESPONSES_STORE_BYTES
 * bytes, oldest evicted first; a chain that reaches an evicted response is refused (400).
 *
 * Output items: a reasoning item (its text as reasoning_text content) when the model
 * thought, a message with one output_text part when it wrote text, and a function_call
 * item per tool call. Errors have OpenAI's shape; an error after the stream started is
 * an "error" event with that body. */
#ifndef CAIRN_API_RESPONSES_H
#define CAIRN_API_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"
#include "base/json.h"

#define RESPONSES_STORE_MAX 1024
#define RESPONSES_STORE_BYTES ((size_t)64 << 20)

struct responses;

/* The front-end over g (borrowed: g must outlive it) with an empty store. CAIRN_ENOMEM. */
int responses_create(struct responses **out, const struct gen *g);

/* Frees r and its store; after the server stopped (requests in flight hold r). Accepts
 * NULL. */
void responses_release(struct responses *r);

/* What a request asks of the reply, and what the response object echoes. */
struct responses_req {
    bool stream, store;
    bool one_tool_call; /* parallel_tool_calls false */
    json_t *echo;  /* owned: the request's fields a response object repeats */
    json_t *input; /* owned: this request's input as chat messages (no instructions) */
};

/* Frees what q owns; accepts a zeroed one. */
void responses_req_clear(struct responses_req *q);

/* Checks the body of a POST to /v1/responses (parsed JSON, NULL when it is none) into p
 * (textgen_params_init'ed; the caller clears it, also on failure) and q (zeroed; the
 * caller clears it). r (NULL: no store, so previous_response_id is always unknown) gives
 * the conversation of previous_response_id. Returns 0, or the HTTP status of the refusal
 * (400; 500 out of memory) with e saying why. */
int responses_parse_request(struct responses *r, const json_t *body, struct textgen_params *p,
                            struct responses_req *q, struct json_err *e);

/* Adds the routes above to srv (before http_server_start). CAIRN_EINVAL or CAIRN_ENOMEM
 * from http_route, with the route in err. */
int responses_register(struct responses *r, struct http_server *srv, char *err, size_t errlen);

#endif
