/* Checked members of JSON objects (jansson), read one way everywhere:
 *
 * - json_get_*: required members of what the cluster writes itself (events, wire
 *   messages, files). A refusal fills the caller's err with "<path>.<key>: <why>" and
 *   returns CAIRN_EFORMAT, so a bad event from the network or from disk says where it
 *   is wrong.
 * - json_opt_*: optional members of client requests. A missing member or JSON null
 *   leaves *out untouched and sets *given false; a refusal fills a struct json_err
 *   with the member's path ("key" at the top, else "path.key") and a message that
 *   starts with it.
 *
 * No reader keeps a reference into the JSON it read, except where it says borrowed. */
#ifndef CAIRN_BASE_JSON_H
#define CAIRN_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define JSON_PATH_MAX 256     /* bytes of a member path kept in messages */
#define JSON_ERR_PATH_MAX 128 /* bytes of json_err.path */
#define JSON_ERR_MAX 512      /* bytes of json_err.message */

/* Why a member was refused: its path (such as "messages[2].content[0].type", "" when
 * about no one member) and a message that starts with that path. */
struct json_err {
    char path[JSON_ERR_PATH_MAX];
    char message[JSON_ERR_MAX];
};

/* Formats a member path into dst (n bytes), cut short quietly when it does not fit. */
void json_path(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* path "." key into dst (just key when path is NULL or ""), cut short to fit. */
void json_member_path(char *dst, size_t cap, const char *path, const char *key);

/* Fills e (when not NULL) with path and "path: <fmt...>" (just the text when path is
 * "" or NULL); returns CAIRN_EFORMAT, so a parser can `return json_fail(...)`. */
int json_fail(struct json_err *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- required members: errors "<path>.<key>: <why>" into err (errlen bytes) ---- */

/* CAIRN_EFORMAT unless j is an object whose keys are all in keys (NULL-terminated);
 * missing keys are left to the readers below. */
int json_get_keys(const json_t *j, const char *path, const char *const *keys, char *err,
                  size_t errlen);

/* Required member key of object j with type type (JSON_OBJECT, JSON_ARRAY...; JSON_TRUE
 * for a boolean) into *out (borrowed). CAIRN_EFORMAT when missing or of another type. */
int json_get_member(const json_t *j, const char *path, const char *key, json_type type,
                    json_t **out, char *err, size_t errlen);

/* Required string of at most max bytes without NUL bytes, or with nullable also JSON
 * null, into *s (borrowed from j; NULL for null) and *len. */
int json_get_string(const json_t *j, const char *path, const char *key, bool nullable, size_t max,
                    const char **s, size_t *len, char *err, size_t errlen);

/* Short text of at most max bytes (no control bytes) into dst (max + 1 bytes). */
int json_get_name(const json_t *j, const char *path, const char *key, size_t max, char *dst,
                  char *err, size_t errlen);

/* As json_get_name for a bare value v (an array element) whose full path is path. */
int json_get_name_value(const json_t *v, const char *path, size_t max, char *dst, char *err,
                        size_t errlen);

/* Nullable long text (at most max bytes, no NUL) into *dst: a malloc'd copy owned by
 * the caller, or NULL for JSON null. CAIRN_ENOMEM when the copy fails. */
int json_get_text(const json_t *j, const char *path, const char *key, size_t max, char **dst,
                  char *err, size_t errlen);

/* Required integer in [lo, hi] into *dst. */
int json_get_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *dst, char *err, size_t errlen);

/* Required boolean into *dst. */
int json_get_bool(const json_t *j, const char *path, const char *key, bool *dst, char *err,
                  size_t errlen);

/* Required string equal to one of name(0) .. name(n - 1); its index into *dst. */
int json_get_enum(const json_t *j, const char *path, const char *key,
                  const char *(*name)(int), int n, int *dst, char *err, size_t errlen);

/* ---- optional members: refusals into e, CAIRN_EFORMAT ---- */

/* Member key of obj (borrowed), or NULL when it is missing or JSON null; *given says
 * which (given may be NULL). */
const json_t *json_opt_get(const json_t *obj, const char *key, bool *given);

/* An integer, or a real with an integral value below 2^53 in magnitude (JavaScript
 * clients send 100.0), into *out; false for anything else. */
bool json_int_value(const json_t *v, int64_t *out);

/* Optional members key of object obj, whose own path is path (NULL or "" at the top:
 * errors then name "key", else "path.key"). A missing member or JSON null leaves *out
 * untouched and sets *given false (given may be NULL); a member of the wrong type or
 * out of range fails with CAIRN_EFORMAT: "key: expected a number in [lo, hi]" ("(lo"
 * with lo_open; the upper bound is always inclusive), "expected an integer in [lo,
 * hi]" (see json_int_value), "expected true or false", "expected a string" (*out
 * then borrowed from obj, NULL when missing). */

/* Optional finite number in [lo, hi], or (lo, hi] with lo_open. */
int json_opt_number(const json_t *obj, const char *path, const char *key, double lo, double hi,
                    bool lo_open, double *out, bool *given, struct json_err *e);
/* Optional integer in [lo, hi] (an integral real counts, see json_int_value). */
int json_opt_int(const json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *out, bool *given, struct json_err *e);
/* Optional boolean. */
int json_opt_bool(const json_t *obj, const char *path, const char *key, bool *out, bool *given,
                  struct json_err *e);
/* Optional string, borrowed from obj; *out is NULL when missing or null. */
int json_opt_string(const json_t *obj, const char *path, const char *key, const char **out,
                    struct json_err *e);

#endif
