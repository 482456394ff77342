/* Small helpers shared by the API front-ends (openai.c, and later ollama.c and
 * anthropic.c): a refusal that names the request field it is about, checked optional
 * members of a request object, OpenAI-style content parts flattened to text, a growable
 * text buffer and random ids. Nothing here knows any one API's error shape. */
#ifndef CAIRN_API_APIUTIL_H
#define CAIRN_API_APIUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

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

/* Optional members of object obj. A missing member or JSON null leaves *out untouched
 * and sets *given false (given may be NULL); a member of the wrong type or out of range
 * fails with CAIRN_EFORMAT naming key. Numbers accept integers and reals; lo_open makes
 * the lower bound exclusive (the upper one is always inclusive). Integers accept reals
 * with an integral value ("2.0"). */
int apiutil_opt_number(const json_t *obj, const char *key, double lo, double hi, bool lo_open,
                       double *out, bool *given, struct apiutil_err *e);
int apiutil_opt_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *given, struct apiutil_err *e);
int apiutil_opt_bool(const json_t *obj, const char *key, bool *out, bool *given,
                     struct apiutil_err *e);

/* Message content as text into *out (malloc'd, owned by the caller): a string as is, an
 * array of parts [{"type": "text", "text": string}] joined with "\n", JSON null as
 * *out = NULL. Any other part type or shape fails naming path (the content's own
 * path, e.g. "messages[1].content") and the part: "messages[1].content[0].type". */
int apiutil_flatten_content(const json_t *content, const char *path, char **out,
                            struct apiutil_err *e);

/* A growable NUL-terminated text; zero-initialize, apiutil_buf_free when done. */
struct apiutil_buf {
    char *p; /* NULL until the first append */
    size_t len, cap;
};

/* Appends n bytes of s; CAIRN_ENOMEM (buffer unchanged) when out of memory. */
int apiutil_buf_add(struct apiutil_buf *b, const char *s, size_t n);
/* The text so far ("" when empty; valid until the next append or free). */
const char *apiutil_buf_str(const struct apiutil_buf *b);
void apiutil_buf_free(struct apiutil_buf *b);

/* 64 random bits from the kernel (getrandom), mixed from the clock if it fails. */
uint64_t apiutil_random_u64(void);

/* Writes prefix followed by 24 random lowercase hex digits into dst (cap bytes, cut
 * short when it does not fit), e.g. "chatcmpl-3f9c..." or "call_...". */
void apiutil_random_id(char *dst, size_t cap, const char *prefix);

#endif
