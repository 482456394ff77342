/* Embeddings over the generation backend (api/gen.h): an embedding task (textgen_params
 * with embed set) runs on the runner of a model that declares pooling, and each input's
 * vector comes back as a GEN_EVENT_EMBEDDING.
 *   POST /v1/embeddings   OpenAI: {"model", "input": text | [text] | [token id] |
 *                         [[token id]], "encoding_format": "float" (default) | "base64",
 *                         "dimensions": n, "user"} -> {"object": "list", "data":
 *                         [{"object": "embedding", "index", "embedding": [float] or
 *                         base64 of little-endian float32}], "model", "usage":
 *                         {"prompt_tokens", "total_tokens"}}; an input longer than the
 *                         context is refused (400), as OpenAI does
 *   POST /api/embed       Ollama: {"model", "input": text | [text], "truncate": true
 *                         (default; false refuses a long input), "dimensions", "options",
 *                         "keep_alive"} -> {"model", "embeddings": [[float]],
 *                         "total_duration", "load_duration", "prompt_eval_count"}
 *   POST /api/embeddings  Ollama's older route: {"model", "prompt": text} ->
 *                         {"embedding": [float]}
 * Vectors are unit length (engine/embed.h). A model that declares no pooling is refused
 * by its runner with 400, and so is an embedding model asked to generate. Errors are in
 * each API's shape (OpenAI's error object; Ollama's {"error"}). */
#ifndef CAIRN_API_EMBEDDINGS_H
#define CAIRN_API_EMBEDDINGS_H

#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"
#include "api/http.h"
#include "base/json.h"
#include "proto/textgen.h"

enum embeddings_route { EMBEDDINGS_OPENAI, EMBEDDINGS_OLLAMA, EMBEDDINGS_OLLAMA_LEGACY };

/* What a request asks of the reply. */
struct embeddings_opts {
    bool base64; /* OpenAI encoding_format "base64" */
};

/* Checks the body of a POST to the route (parsed JSON, NULL when it is none) into p
 * (textgen_params_init'ed; the caller clears it, also on failure) and o. Returns 0, or
 * the HTTP status of the refusal (400; 500 out of memory) with e saying why. */
int embeddings_parse_request(enum embeddings_route route, const json_t *body, struct textgen_params *p,
                             struct embeddings_opts *o, struct json_err *e);

/* Adds the three routes to srv (before http_server_start); g must outlive the server. */
int embeddings_register(struct http_server *srv, const struct gen *g, char *err, size_t errlen);

#endif
