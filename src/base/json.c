#include "base/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* Strings json_get_enum compares; a longer one names no value. */
#define ENUM_NAME_MAX 511

void json_path(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

void json_member_path(char *dst, size_t cap, const char *path, const char *key)
{
    bool top = !path || !path[0];
    json_path(dst, cap, "%s%s%s", top ? "" : path, top ? "" : ".", key);
}

static int vfail(struct json_err *e, const char *path, const char *fmt, va_list ap)
{
    if (!e)
        return CAIRN_EFORMAT;
    snprintf(e->path, sizeof e->path, "%s", path ? path : "");
    char why[JSON_ERR_MAX - JSON_ERR_PATH_MAX - 2]; /* so path and why always fit */
    vsnprintf(why, sizeof why, fmt, ap);
    if (e->path[0])
        snprintf(e->message, sizeof e->message, "%s: %s", e->path, why);
    else
        snprintf(e->message, sizeof e->message, "%s", why);
    return CAIRN_EFORMAT;
}

int json_fail(struct json_err *e, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(e, path, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- required members ---- */

int json_get_keys(const json_t *j, const char *path, const char *const *keys, char *err,
                  size_t errlen)
{
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: must be an object", path);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        bool known = false;
        for (size_t i = 0; keys[i] && !known; i++)
            known = strcmp(keys[i], key) == 0;
        if (!known)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: unknown field \"%.64s\"", path,
                              key);
    }
    return 0;
}

static const char *type_name(json_type t)
{
    switch (t) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int json_get_member(const json_t *j, const char *path, const char *key, json_type type,
                    json_t **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: missing", path, key);
    if (json_typeof(v) != type && !(type == JSON_TRUE && json_is_boolean(v)))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: must be %s", path, key,
                          type_name(type));
    *out = v;
    return 0;
}

/* Member key of j into *v; fills fp with "path.key" for messages. */
static int member(const json_t *j, const char *path, const char *key, json_t **v, char *fp,
                  size_t fpsize, char *err, size_t errlen)
{
    json_path(fp, fpsize, "%s.%s", path, key);
    *v = json_object_get(j, key);
    if (!*v)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: missing", fp);
    return 0;
}

/* String value (or, with nullable, null) without NUL bytes, at most max bytes; *s is
 * NULL for null. */
static int string_value(const json_t *v, const char *fp, bool nullable, size_t max,
                        const char **s, size_t *len, char *err, size_t errlen)
{
    if (nullable && json_is_null(v)) {
        *s = NULL;
        *len = 0;
        return 0;
    }
    if (!json_is_string(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: must be a string%s", fp,
                          nullable ? " or null" : "");
    *s = json_string_value(v);
    *len = json_string_length(v);
    if (*len > max)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: %zu bytes, more than %zu", fp,
                          *len, max);
    if (strlen(*s) != *len)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: holds a NUL byte", fp);
    return 0;
}

int json_get_string(const json_t *j, const char *path, const char *key, bool nullable, size_t max,
                    const char **s, size_t *len, char *err, size_t errlen)
{
    char fp[JSON_PATH_MAX + 64];
    json_t *v;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    return rc ? rc : string_value(v, fp, nullable, max, s, len, err, errlen);
}

int json_get_name_value(const json_t *v, const char *path, size_t max, char *dst, char *err,
                        size_t errlen)
{
    const char *s = NULL;
    size_t len = 0;
    int rc = string_value(v, path, false, max, &s, &len, err, errlen);
    if (rc)
        return rc;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: control byte 0x%02x at offset %zu",
                              path, (unsigned char)s[i], i);
    memcpy(dst, s, len + 1);
    return 0;
}

int json_get_name(const json_t *j, const char *path, const char *key, size_t max, char *dst,
                  char *err, size_t errlen)
{
    char fp[JSON_PATH_MAX + 64];
    json_t *v;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    return rc ? rc : json_get_name_value(v, fp, max, dst, err, errlen);
}

int json_get_text(const json_t *j, const char *path, const char *key, size_t max, char **dst,
                  char *err, size_t errlen)
{
    char fp[JSON_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    *dst = NULL;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, true, max, &s, &len, err, errlen);
    if (rc || !s)
        return rc;
    *dst = malloc(len + 1);
    if (!*dst)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", fp);
    memcpy(*dst, s, len + 1);
    return 0;
}

int json_get_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *dst, char *err, size_t errlen)
{
    char fp[JSON_PATH_MAX + 64];
    json_t *v;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc)
        return rc;
    if (!json_is_integer(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: must be an integer", fp);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "%s: %lld is outside [%" PRId64 ", %" PRId64 "]", fp, (long long)x,
                          lo, hi);
    *dst = (int64_t)x;
    return 0;
}

int json_get_bool(const json_t *j, const char *path, const char *key, bool *dst, char *err,
                  size_t errlen)
{
    json_t *v;
    int rc = json_get_member(j, path, key, JSON_TRUE, &v, err, errlen);
    if (rc == 0)
        *dst = json_is_true(v);
    return rc;
}

int json_get_enum(const json_t *j, const char *path, const char *key,
                  const char *(*name)(int), int n, int *dst, char *err, size_t errlen)
{
    char fp[JSON_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, false, ENUM_NAME_MAX, &s, &len, err, errlen);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        if (strcmp(s, name(i)) == 0) {
            *dst = i;
            return 0;
        }
    }
    char list[512] = "";
    for (int i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", name(i));
    }
    return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: \"%.64s\" is not one of %s", fp, s, list);
}

/* ---- optional members ---- */

/* Refuses member key of an object at path: e names "path.key", or "key" at the top. */
static int opt_fail(struct json_err *e, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int opt_fail(struct json_err *e, const char *path, const char *key, const char *fmt, ...)
{
    char p[JSON_ERR_PATH_MAX];
    json_member_path(p, sizeof p, path, key);
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(e, p, fmt, ap);
    va_end(ap);
    return rc;
}

const json_t *json_opt_get(const json_t *obj, const char *key, bool *given)
{
    const json_t *v = json_object_get(obj, key);
    if (v && json_is_null(v))
        v = NULL;
    if (given)
        *given = v != NULL;
    return v;
}

bool json_int_value(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    double d = json_is_real(v) ? json_real_value(v) : NAN;
    /* Below 2^53 every integral double is exact and converts without overflow. */
    if (!isfinite(d) || d != floor(d) || fabs(d) >= 9007199254740992.0)
        return false;
    *out = (int64_t)d;
    return true;
}

int json_opt_number(const json_t *obj, const char *path, const char *key, double lo, double hi,
                    bool lo_open, double *out, bool *given, struct json_err *e)
{
    const json_t *v = json_opt_get(obj, key, given);
    if (!v)
        return 0;
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo))
        return opt_fail(e, path, key, "expected a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
    *out = d;
    return 0;
}

int json_opt_int(const json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *out, bool *given, struct json_err *e)
{
    const json_t *v = json_opt_get(obj, key, given);
    if (!v)
        return 0;
    int64_t n;
    if (!json_int_value(v, &n) || n < lo || n > hi)
        return opt_fail(e, path, key, "expected an integer in [%lld, %lld]", (long long)lo,
                        (long long)hi);
    *out = n;
    return 0;
}

int json_opt_bool(const json_t *obj, const char *path, const char *key, bool *out, bool *given,
                  struct json_err *e)
{
    const json_t *v = json_opt_get(obj, key, given);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return opt_fail(e, path, key, "expected true or false");
    *out = json_is_true(v);
    return 0;
}

int json_opt_string(const json_t *obj, const char *path, const char *key, const char **out,
                    struct json_err *e)
{
    const json_t *v = json_opt_get(obj, key, NULL);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return opt_fail(e, path, key, "expected a string");
    *out = json_string_value(v);
    return 0;
}
