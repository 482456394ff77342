#include "proto/ids.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/err.h"

static bool id_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '-';
}

static bool model_char(unsigned char c)
{
    return id_char(c) || c == '/' || c == '@' || c == '+';
}

/* Checks s (len bytes) against an alphabet; returns the offset of the first byte
 * outside it, or len. */
static size_t first_bad(const char *s, size_t len, bool (*ok)(unsigned char))
{
    for (size_t i = 0; i < len; i++)
        if (!ok((unsigned char)s[i]))
            return i;
    return len;
}

void ids_path(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

bool ids_valid_id(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 1 && n <= IDS_ID_MAX && first_bad(s, n, id_char) == n;
}

bool ids_valid_model(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 1 && n <= IDS_MODEL_MAX && first_bad(s, n, model_char) == n;
}

int ids_random(char *dst, char *err, size_t errlen)
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r <= 0)
            return cairn_fail(err, errlen, CAIRN_EIO, "getrandom failed");
        got += (size_t)r;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(dst + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int ids_json_keys(const json_t *j, const char *path, const char *const *keys, char *err,
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

int ids_json_member(const json_t *j, const char *path, const char *key, json_type type,
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
    ids_path(fp, fpsize, "%s.%s", path, key);
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

static int check_alphabet(const char *fp, const char *s, size_t len, bool (*ok)(unsigned char),
                          const char *alphabet, char *err, size_t errlen)
{
    if (len == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: empty", fp);
    size_t bad = first_bad(s, len, ok);
    if (bad < len)
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "%s: byte 0x%02x at offset %zu is not one of %s", fp,
                          (unsigned char)s[bad], bad, alphabet);
    return 0;
}

static int id_member(const json_t *j, const char *path, const char *key, bool nullable,
                     char *dst, char *err, size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, nullable, IDS_ID_MAX, &s, &len, err, errlen);
    if (rc == 0 && s)
        rc = check_alphabet(fp, s, len, id_char, "A-Z a-z 0-9 . _ : -", err, errlen);
    if (rc == 0)
        memcpy(dst, s ? s : "", len + 1);
    return rc;
}

int ids_json_id(const json_t *j, const char *path, const char *key, char *dst, char *err,
                size_t errlen)
{
    return id_member(j, path, key, false, dst, err, errlen);
}

int ids_json_id_or_null(const json_t *j, const char *path, const char *key, char *dst,
                        char *err, size_t errlen)
{
    return id_member(j, path, key, true, dst, err, errlen);
}

int ids_json_model(const json_t *j, const char *path, const char *key, bool nullable,
                   char *dst, char *err, size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, nullable, IDS_MODEL_MAX, &s, &len, err, errlen);
    if (rc == 0 && s)
        rc = check_alphabet(fp, s, len, model_char, "A-Z a-z 0-9 . _ : - / @ +", err, errlen);
    if (rc == 0)
        memcpy(dst, s ? s : "", len + 1);
    return rc;
}

int ids_json_name_value(const json_t *v, const char *path, size_t max, char *dst, char *err,
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

int ids_json_name(const json_t *j, const char *path, const char *key, size_t max, char *dst,
                  char *err, size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
    json_t *v;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    return rc ? rc : ids_json_name_value(v, fp, max, dst, err, errlen);
}

int ids_json_text(const json_t *j, const char *path, const char *key, char **dst, char *err,
                  size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    *dst = NULL;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, true, IDS_TEXT_MAX, &s, &len, err, errlen);
    if (rc || !s)
        return rc;
    *dst = malloc(len + 1);
    if (!*dst)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", fp);
    memcpy(*dst, s, len + 1);
    return 0;
}

int ids_json_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *dst, char *err, size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
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

int ids_json_bool(const json_t *j, const char *path, const char *key, bool *dst, char *err,
                  size_t errlen)
{
    json_t *v;
    int rc = ids_json_member(j, path, key, JSON_TRUE, &v, err, errlen);
    if (rc == 0)
        *dst = json_is_true(v);
    return rc;
}

int ids_json_enum(const json_t *j, const char *path, const char *key,
                  const char *(*name)(int), int n, int *dst, char *err, size_t errlen)
{
    char fp[IDS_PATH_MAX + 64];
    json_t *v;
    const char *s = NULL;
    size_t len = 0;
    int rc = member(j, path, key, &v, fp, sizeof fp, err, errlen);
    if (rc == 0)
        rc = string_value(v, fp, false, IDS_NAME_MAX, &s, &len, err, errlen);
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

json_t *ids_json_string_or_null(const char *s, bool empty_is_null)
{
    if (!s || (empty_is_null && !s[0]))
        return json_null();
    return json_string(s);
}
