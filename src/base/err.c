#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>

const char *cairn_strerror(int err)
{
    switch (err) {
    case CAIRN_OK:
        return "success";
#define X(name, msg) \
    case CAIRN_E##name: \
        return msg;
        CAIRN_ERRNO_MAP(X)
#undef X
    default:
        return "unknown error";
    }
}

int cairn_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int cairn_http_status(int code)
{
    switch (code) {
    case 0:
        return 200;
    case CAIRN_ENOTFOUND:
        return 404;
    case CAIRN_ERANGE:
        return 413;
    case CAIRN_EFULL:
        return 503;
    case CAIRN_EPERM:
        return 403;
    case CAIRN_EFORMAT:
    case CAIRN_EINVAL:
        return 400;
    default:
        return 500;
    }
}
