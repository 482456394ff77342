/* Small helpers shared by the API front-ends (openai.c, ollama.c, anthropic.c): stop
 * strings, OpenAI-style content parts flattened to text, JSON text that may hold
 * invalid UTF-8, error replies in an API's own shape, and random ids and seeds. A
 * refusal that names the request field it is about is base/json.h's struct json_err
 * (json_fail), and optional members of a request are read with its json_opt_*. Text is
 * gathered in base's struct strbuf. Nothing here knows any one API's error shape. */
#ifndef CAIRN_API_APIUTIL_H
#define CAIRN_API_APIUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api/http.h"
#include "proto/textgen.h"
#include "base/json.h"
#include "base/strbuf.h"

/* Optional stop strings, member key of obj (path as for json_opt_*), appended to
 * p->stop: an array of at most TEXTGEN_MAX_STOP strings of 1..TEXTGEN_MAX_STOP_BYTES
 * bytes, or with one_string also a single string. CAIRN_EFORMAT naming the member or the entry
 * ("stop[1]: expected a string of 1..1024 bytes"), CAIRN_ENOMEM. */
int apiutil_opt_stop(const json_t *obj, const char *path, const char *key, bool one_string,
                     struct textgen_params *p, struct json_err *e);

/* The request's "model" into p->model: required, a valid model id; CAIRN_EFORMAT naming
 * "model" otherwise. */
int apiutil_parse_model(const json_t *body, struct textgen_params *p, struct json_err *e);

/* The HTTP status for the code a front-end's request parser returned: 0 for 0, 500 for
 * CAIRN_ENOMEM (e then says "out of memory"), else cairn_http_status (400 for
 * CAIRN_EFORMAT, whose e the parser filled). */
int apiutil_parse_status(int rc, struct json_err *e);

/* Message content as text into *out (malloc'd, owned by the caller): a string as is, an
 * array of parts [{"type": "text", "text": string}] joined with "\n", JSON null as
 * *out = NULL. Any other part type or shape fails naming path (the content's own
 * path, e.g. "messages[1].content") and the part: "messages[1].content[0].type". */
int apiutil_flatten_content(const json_t *content, const char *path, char **out,
                            struct json_err *e);

/* The text of b ("" while b holds nothing; valid until b changes). */
const char *apiutil_text(const struct strbuf *b);

/* A new JSON string of s ("" for NULL); when s is not valid UTF-8 (text from a peer),
 * each byte >= 0x80 becomes '?'. NULL when out of memory. */
json_t *apiutil_text_json(const char *s);

/* Sets o[key] = v, taking v; false when v is NULL (a failed constructor) or the set
 * failed, so builders can chain `ok = ok && apiutil_put(...)`. */
bool apiutil_put(json_t *o, const char *key, json_t *v);

/* The string member key of o, or "" when it is missing or not a string. */
const char *apiutil_str(const json_t *o, const char *key);

/* Error replies in an API's shape: the body from fmt(status, message, param) (param
 * NULL or "" when about no field), status clamped to 400..599 (else 500), and
 * "Retry-After: 1" on 503 and 529 (busy). When fmt fails (out of memory) the reply is
 * http.c's own 500. The stream form answers a deferred reply (http_stream_reply_json). */
void apiutil_reply_error(struct http_request *req, http_error_fn fmt, int status,
                         const char *message, const char *param);
void apiutil_stream_reply_error(struct http_stream *s, http_error_fn fmt, int status,
                                const char *message, const char *param);

/* 64 random bits from the kernel (getrandom), mixed from the clock if it fails. */
uint64_t apiutil_random_u64(void);

/* A random sampling seed for a request that names none: 53 bits (IDS_COUNTER_MAX), so
 * it survives JSON numbers. */
uint64_t apiutil_random_seed(void);

/* Writes prefix followed by 24 random lowercase hex digits into dst (cap bytes, cut
 * short when it does not fit), e.g. "chatcmpl-3f9c...", "msg_..." or "call_...". */
void apiutil_random_id(char *dst, size_t cap, const char *prefix);

/* The 404 message for a model no node has: a hub reference gets how to pull it (a
 * request does not pull: a typo must not start a download of gigabytes, and Ollama's
 * clients pull first too). name is cut at 200 bytes. */
void apiutil_missing_model(const char *name, char *out, size_t cap);

/* Constrained decoding from a request: p->grammar gets GBNF text for a JSON Schema
 * (schema not NULL: tok/jschema.h), or for any JSON object (schema NULL), and is checked
 * by compiling it. CAIRN_EFORMAT naming path and, for a schema that uses what cairn does
 * not cover, the keyword ("response_format.json_schema.schema: unsupported JSON Schema
 * keyword 'pattern' at properties.name"), CAIRN_ENOMEM. */
int apiutil_grammar_schema(const json_t *schema, const char *path, struct textgen_params *p, struct json_err *e);

/* As apiutil_grammar_schema for GBNF text given as it is (llama.cpp's "grammar"). */
int apiutil_grammar_gbnf(const char *gbnf, size_t len, const char *path, struct textgen_params *p,
                         struct json_err *e);

#endif
