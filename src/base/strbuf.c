#include "base/strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int strbuf_reserve(struct strbuf *b, size_t n)
{
    if (n > SIZE_MAX - 1 - b->len)
        return CAIRN_ERANGE;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return CAIRN_ENOMEM;
    if (!b->p)
        p[0] = '\0';
    b->p = p;
    b->cap = cap;
    return 0;
}

int strbuf_put(struct strbuf *b, const char *s, size_t n)
{
    int rc = strbuf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void strbuf_clear(struct strbuf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

void strbuf_free(struct strbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
