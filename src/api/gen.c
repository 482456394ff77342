/* Shared pieces of the generation interface (gen.h). */
#include "api/gen.h"

#include "base/err.h"

int gen_http_status(int code)
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
    case CAIRN_EFORMAT:
    case CAIRN_EINVAL:
        return 400;
    default:
        return 500;
    }
}
