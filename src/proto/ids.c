#include "proto/ids.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/err.h"
#include "base/json.h"

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

/* String member key of j (null gives "" with nullable) of at most max bytes of the
 * alphabet ok (described in messages as alphabet) into dst (max + 1 bytes). */
static int alphabet_member(const json_t *j, const char *path, const char *key, bool nullable,
                           size_t max, bool (*ok)(unsigned char), const char *alphabet,
                           char *dst, char *err, size_t errlen)
{
    const char *s = NULL;
    size_t len = 0;
    int rc = json_get_string(j, path, key, nullable, max, &s, &len, err, errlen);
    if (rc == 0 && s) {
        char fp[JSON_PATH_MAX + 64];
        json_path(fp, sizeof fp, "%s.%s", path, key);
        rc = check_alphabet(fp, s, len, ok, alphabet, err, errlen);
    }
    if (rc == 0)
        memcpy(dst, s ? s : "", len + 1);
    return rc;
}

#define ID_ALPHABET "A-Z a-z 0-9 . _ : -"

int ids_json_id(const json_t *j, const char *path, const char *key, char *dst, char *err,
                size_t errlen)
{
    return alphabet_member(j, path, key, false, IDS_ID_MAX, id_char, ID_ALPHABET, dst, err, errlen);
}

int ids_json_id_or_null(const json_t *j, const char *path, const char *key, char *dst,
                        char *err, size_t errlen)
{
    return alphabet_member(j, path, key, true, IDS_ID_MAX, id_char, ID_ALPHABET, dst, err, errlen);
}

int ids_json_model(const json_t *j, const char *path, const char *key, bool nullable,
                   char *dst, char *err, size_t errlen)
{
    return alphabet_member(j, path, key, nullable, IDS_MODEL_MAX, model_char,
                           "A-Z a-z 0-9 . _ : - / @ +", dst, err, errlen);
}

json_t *ids_json_string_or_null(const char *s, bool empty_is_null)
{
    if (!s || (empty_is_null && !s[0]))
        return json_null();
    return json_string(s);
}
