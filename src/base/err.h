/* Error codes shared by every layer. Functions return 0 on success or a negative
 * CAIRN_E* code, and fill a caller-owned message buffer where detail helps. */
#ifndef CAIRN_BASE_ERR_H
#define CAIRN_BASE_ERR_H

#include <stddef.h>

#define CAIRN_ERRNO_MAP(X)                                   \
    X(INVAL, "invalid argument")                             \
    X(NOMEM, "out of memory")                                \
    X(IO, "input/output error")                              \
    X(FORMAT, "malformed file or message")                   \
    X(UNSUPPORTED, "not supported")                          \
    X(RANGE, "value out of range")                           \
    X(NOTFOUND, "not found")                                 \
    X(FULL, "capacity exhausted")                            \
    X(STATE, "operation not valid in this state")            \
    X(PERM, "not permitted")

enum cairn_err {
    CAIRN_OK = 0,
#define X(name, msg) CAIRN_E##name,
    CAIRN_ERR_FIRST_ = -100,
    CAIRN_ERRNO_MAP(X)
#undef X
};

/* Static description of an error code (never NULL). */
const char *cairn_strerror(int err);

/* snprintf into err (size errlen) when err is not NULL; returns code unchanged so a
 * caller can write `return cairn_fail(err, errlen, CAIRN_EFORMAT, "...", ...)`. */
int cairn_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The HTTP status a client gets for a CAIRN_E* code (the one table: the API and the
 * runner's refusals use it): 0 200, ENOTFOUND 404, ERANGE 413 (too large), EFULL 503,
 * EFORMAT and EINVAL 400, others 500. */
int cairn_http_status(int code);

#endif
