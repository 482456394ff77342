/* Small helpers shared by the API front-ends (openai.c, ollama.c, anthropic.c): a
 * refusal that names the request field it is about, checked optional members of a
 * request object, OpenAI-style content parts flattened to text, JSON text that may hold
 * invalid UTF-8, error replies in an API's own shape, and random ids and seeds. Text
 * is gathered in tok's struct strbuf. Nothing here knows any one API's error shape. */
#ifndef CAIRN_API_APIUTIL_H
#define CAIRN_API_APIUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api/http.h"
#include "proto/textgen.h"
#include "base/strbuf.h"

#define APIUTIL_PARAM_MAX 128
#define APIUTIL_MSG_MAX 512

/* Why a request was refused: the field (a path such as "messages[2].content[0].type",
 * "" when it is about no one field) and a message that starts with that path. */
struct apiutil_err {
    char param[APIUTIL_PARAM_MAX];
    char message[APIUTIL_MSG_MAX];
};

/* Fills e (when not NULL) with param and "param: <fmt...>" (just the text when param
 * is "" or NULL); returns CAIRN_EFORMAT, so a parser can `return apiutil_fail(...)`. */
int apiutil_fail(struct apiutil_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* path "." key into dst (just key when path is NULL or ""), cut short to fit. */
void apiutil_member_path(char *dst, size_t cap, const char *path, const char *key);

/* An integer, or a real with an integral value below 2^53 in magnitude (JavaScript
 * clients send 100.0), into *out; false for anything else. */
bool apiutil_int_value(const json_t *v, int64_t *out);

/* Optional members key of object obj, whose own path is path (NULL or "" at the top:
 * errors then name "key", else "path.key"). A missing member or JSON null leaves *out
 * untouched and sets *given false (given may be NULL); a member of the wrong type or
 * out of range fails with CAIRN_EFORMAT: "key: expected a number in [lo, hi]" ("(lo"
 * with lo_open; the upper bound is always inclusive), "expected an integer in [lo,
 * hi]" (see apiutil_int_value), "expected true or false", "expected a string" (*out
 * then borrowed from obj). */
int apiutil_opt_number(const json_t *obj, const char *path, const char *key, double lo, double hi,
                       bool lo_open, double *out, bool *given, struct apiutil_err *e);
int apiutil_opt_int(const json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                    int64_t *out, bool *given, struct apiutil_err *e);
int apiutil_opt_bool(const json_t *obj, const char *path, const char *key, bool *out, bool *given,
                     struct apiutil_err *e);
int apiutil_opt_string(const json_t *obj, const char *path, const char *key, const char **out,
                       struct apiutil_err *e);

/* Optional stop strings, member key of obj (path as above), appended to p->stop: an
 * array of at most TEXTGEN_MAX_STOP strings of 1..TEXTGEN_MAX_STOP_BYTES bytes, or
 * with one_string also a single string. CAIRN_EFORMAT naming the member or the entry
 * ("stop[1]: expected a string of 1..1024 bytes"), CAIRN_ENOMEM. */
int apiutil_opt_stop(const json_t *obj, const char *path, const char *key, bool one_string,
                     struct textgen_params *p, struct apiutil_err *e);

/* Message content as text into *out (malloc'd, owned by the caller): a string as is, an
 * array of parts [{"type": "text", "text": string}] joined with "\n", JSON null as
 * *out = NULL. Any other part type or shape fails naming path (the content's own
 * path, e.g. "messages[1].content") and the part: "messages[1].content[0].type". */
int apiutil_flatten_content(const json_t *content, const char *path, char **out,
                            struct apiutil_err *e);

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

#endif
