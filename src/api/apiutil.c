#define _GNU_SOURCE
#include "api/apiutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/clock.h"
#include "base/err.h"
#include "cluster/ids.h"

int apiutil_fail(struct apiutil_err *e, const char *param, const char *fmt, ...)
{
    if (!e)
        return CAIRN_EFORMAT;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    char why[APIUTIL_MSG_MAX - APIUTIL_PARAM_MAX - 2]; /* so param and why always fit */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (e->param[0])
        snprintf(e->message, sizeof e->message, "%s: %s", e->param, why);
    else
        snprintf(e->message, sizeof e->message, "%s", why);
    return CAIRN_EFORMAT;
}

/* The member, or NULL when missing or JSON null. */
static const json_t *member(const json_t *obj, const char *key, bool *given)
{
    const json_t *v = json_object_get(obj, key);
    if (v && json_is_null(v))
        v = NULL;
    if (given)
        *given = v != NULL;
    return v;
}

int apiutil_opt_number(const json_t *obj, const char *key, double lo, double hi, bool lo_open,
                       double *out, bool *given, struct apiutil_err *e)
{
    const json_t *v = member(obj, key, given);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return apiutil_fail(e, key, "expected a number");
    double d = json_number_value(v);
    if (!isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo))
        return apiutil_fail(e, key, "%g is out of range, expected %s%g, %g]", d,
                            lo_open ? "(" : "[", lo, hi);
    *out = d;
    return 0;
}

int apiutil_opt_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *given, struct apiutil_err *e)
{
    const json_t *v = member(obj, key, given);
    if (!v)
        return 0;
    int64_t n;
    if (json_is_integer(v)) {
        n = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        /* Only integral values inside [lo, hi] convert; bounds are exact for |x| < 2^53. */
        if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
            return apiutil_fail(e, key, "expected an integer in [%lld, %lld]", (long long)lo,
                                (long long)hi);
        n = (int64_t)d;
    } else {
        return apiutil_fail(e, key, "expected an integer");
    }
    if (n < lo || n > hi)
        return apiutil_fail(e, key, "%lld is out of range, expected [%lld, %lld]", (long long)n,
                            (long long)lo, (long long)hi);
    *out = n;
    return 0;
}

int apiutil_opt_bool(const json_t *obj, const char *key, bool *out, bool *given,
                     struct apiutil_err *e)
{
    const json_t *v = member(obj, key, given);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return apiutil_fail(e, key, "expected true or false");
    *out = json_is_true(v);
    return 0;
}

int apiutil_flatten_content(const json_t *content, const char *path, char **out,
                            struct apiutil_err *e)
{
    *out = NULL;
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        *out = strndup(json_string_value(content), json_string_length(content));
        return *out ? 0 : CAIRN_ENOMEM;
    }
    if (!json_is_array(content))
        return apiutil_fail(e, path, "expected a string or an array of content parts");
    struct apiutil_buf b = {0};
    char p[APIUTIL_PARAM_MAX];
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        const json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        int rc = 0;
        if (!json_is_object(part)) {
            ids_path(p, sizeof p, "%s[%zu]", path, i);
            rc = apiutil_fail(e, p, "expected a content part object");
        } else if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            ids_path(p, sizeof p, "%s[%zu].type", path, i);
            rc = apiutil_fail(e, p, "%s%s%s content parts are not supported, only \"text\"",
                              json_is_string(type) ? "\"" : "",
                              json_is_string(type) ? json_string_value(type) : "untyped",
                              json_is_string(type) ? "\"" : "");
        } else if (!json_is_string(text)) {
            ids_path(p, sizeof p, "%s[%zu].text", path, i);
            rc = apiutil_fail(e, p, "expected a string");
        } else if ((i > 0 && apiutil_buf_add(&b, "\n", 1)) ||
                   apiutil_buf_add(&b, json_string_value(text), json_string_length(text))) {
            rc = CAIRN_ENOMEM;
        }
        if (rc) {
            apiutil_buf_free(&b);
            return rc;
        }
    }
    if (!b.p && apiutil_buf_add(&b, "", 0))
        return CAIRN_ENOMEM;
    *out = b.p;
    return 0;
}

int apiutil_buf_add(struct apiutil_buf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 4 || b->len > SIZE_MAX / 4)
        return CAIRN_ENOMEM;
    if (!b->p || b->cap - b->len <= n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len <= n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return CAIRN_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

const char *apiutil_buf_str(const struct apiutil_buf *b)
{
    return b->p ? b->p : "";
}

void apiutil_buf_free(struct apiutil_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

uint64_t apiutil_random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v)
        return v;
    /* splitmix64's finalizer over the clock and a stack address: unique enough for ids
     * when the kernel gives nothing. */
    uint64_t z = (uint64_t)clock_ns() ^ (uint64_t)(uintptr_t)&v;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void apiutil_random_id(char *dst, size_t cap, const char *prefix)
{
    uint64_t a = apiutil_random_u64(), b = apiutil_random_u64();
    snprintf(dst, cap, "%s%016llx%08llx", prefix ? prefix : "", (unsigned long long)a,
             (unsigned long long)(b & 0xffffffffull));
}
