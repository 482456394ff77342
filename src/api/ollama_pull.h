/* Ollama's model management routes, served through gen.h's pull and remove:
 *   POST   /api/pull    {"model": REF, "stream": true}: NDJSON lines as Ollama writes them,
 *                       {"status":"pulling manifest"}, {"status":"pulling <digest>",
 *                       "digest":"sha256:...","total":N,"completed":M} ...,
 *                       {"status":"verifying sha256 digest"}, {"status":"writing manifest"},
 *                       {"status":"success"}; a failure mid-way is a last {"error": ...}
 *                       line. "stream": false answers {"status":"success"} at the end.
 *   DELETE /api/delete  {"model": NAME}: 200 with an empty body, 404 for an unknown model.
 * REF is a hub reference (node/hubref.h): Ollama's own library names are refused (400)
 * with a message that says how to name a model on the hub. */
#ifndef CAIRN_API_OLLAMA_PULL_H
#define CAIRN_API_OLLAMA_PULL_H

#include "api/http.h"

void ollama_h_pull(struct http_request *req, void *ctx);
void ollama_h_delete(struct http_request *req, void *ctx);

#endif
