/* Ollama-compatible endpoints over a text generation backend (api/gen.h), in the JSON
 * shapes of Ollama's API as its JS client (npm "ollama") and Open WebUI read them:
 *   POST /api/chat      {"model", "messages", "tools", "options", "stream" (true),
 *                        "think", "format", "keep_alive"}: NDJSON lines
 *                        {"model", "created_at", "message": {"role": "assistant",
 *                        "content", "thinking"?, "tool_calls"?}, "done": false}, then
 *                        {"done": true, "done_reason": "stop"|"length", "total_duration",
 *                        "load_duration", "prompt_eval_count", "prompt_eval_duration",
 *                        "eval_count", "eval_duration"}; with "stream": false one object
 *                        holding the whole message and the final fields. No messages:
 *                        the model-load call, answered done_reason "load" at once.
 *   POST /api/generate  {"model", "prompt", "system", "raw", "options", "stream",
 *                        "think", ...}: as /api/chat with "response" (and "thinking")
 *                        instead of "message"; no prompt: the model-load call.
 *   GET  /api/tags      {"models": [{"name", "model", "modified_at", "size", "digest",
 *                        "details": {"parent_model", "format", "family", "families",
 *                        "parameter_size", "quantization_level"}}]}
 *   POST /api/show      {"model"} or {"name"}: {"license", "modelfile", "parameters",
 *                        "template", "details", "model_info", "capabilities",
 *                        "modified_at"}
 *   GET  /api/ps        the models with a ready instance (tags' shape plus "expires_at",
 *                        "size_vram")
 *   GET  /api/version   {"version"}
 *
 * Model names: a model whose id has no tag is listed as "<id>:latest" (as Ollama lists
 * its models), and both "<id>" and "<id>:latest" name it; replies echo the name asked.
 * Options: temperature, top_k, top_p, min_p, seed (negative or absent: a random seed),
 * num_predict (-1, -2: no limit), stop, repeat_penalty, presence_penalty,
 * frequency_penalty, repeat_last_n; the rest (num_ctx, mirostat, num_thread ...) are
 * accepted and ignored. think true/false sets the template's enable_thinking (a level
 * "low"/"medium"/"high" sets it true and passes reasoning_effort); reasoning text comes
 * back apart as "thinking". Tool calls come back as message.tool_calls
 * [{"id", "function": {"name", "arguments": object}}].
 *
 * Errors are {"error": message} with the status: 400 for a wrong type or range (naming
 * the field), images, "format" (structured output) and "suffix" (not supported), 404
 * {"error": "model 'x' not found"}, and the backend's status otherwise (413 prompt too
 * long, 503 busy). A stream starts when the backend takes the request; an error after
 * that is an {"error"} line that ends the stream. A client that hangs up cancels the
 * generation. */
#ifndef CAIRN_API_OLLAMA_H
#define CAIRN_API_OLLAMA_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"
#include "base/json.h"

enum ollama_route { OLLAMA_CHAT, OLLAMA_GENERATE };

/* What a generation request asks besides its parameters. */
struct ollama_request {
    const char *model; /* the name the client gave, borrowed from the body */
    bool stream;       /* true unless "stream": false */
    bool load;         /* no messages (chat) or prompt (generate): the model-load call */
    bool unload;       /* "keep_alive": 0 */
};

/* Checks the body of a POST to /api/chat (OLLAMA_CHAT) or /api/generate (parsed JSON,
 * NULL when it is none) into p (textgen_params_init'ed; the caller clears it, also on
 * failure; p->model is left for the caller to resolve from out->model) and out. Returns
 * 0, or the HTTP status of the refusal (400; 500 out of memory) with e's message saying
 * why (never empty). */
int ollama_parse_request(enum ollama_route route, const json_t *body, struct textgen_params *p,
                         struct ollama_request *out, struct json_err *e);

/* Adds the routes above to srv (before http_server_start). g (and what it points to)
 * must outlive the server: requests in flight use it until http_server_stop returns.
 * CAIRN_EINVAL or CAIRN_ENOMEM from http_route, with the route in err. */
int ollama_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen);

/* Ollama's error body, {"error": message} (status and param unused: an http_error_fn). */
json_t *ollama_error_json(int status, const char *message, const char *param);

#endif
