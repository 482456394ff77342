#include "base/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"

bool args_opt(struct args *a, const char *names, const char **value)
{
    const char *arg = a->argv[a->i];
    const char *p = names;
    while (*p) {
        const char *end = strchr(p, '|');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!strncmp(arg, p, len) && (arg[len] == 0 || (arg[len] == '=' && value))) {
            if (!value)
                return true;
            if (arg[len] == '=') {
                *value = arg + len + 1;
            } else if (a->i + 1 < a->argc) {
                *value = a->argv[++a->i];
            } else {
                fprintf(stderr, "cairn %s: %.*s needs a value\n", a->cmd, (int)len, p);
                a->bad = true;
                *value = "";
            }
            return true;
        }
        p += len + (end ? 1 : 0);
    }
    return false;
}

int64_t args_int(struct args *a, const char *name, const char *s, int64_t lo, int64_t hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cairn %s: bad value for %s: '%s' (an integer in [%lld, %lld])\n", a->cmd, name, s,
                (long long)lo, (long long)hi);
        a->bad = true;
        return lo;
    }
    return v;
}

double args_float(struct args *a, const char *name, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "cairn %s: bad value for %s: '%s' (a number in [%g, %g])\n", a->cmd, name, s, lo, hi);
        a->bad = true;
        return lo;
    }
    return v;
}

int64_t args_int_list(struct args *a, const char *name, const char *s, int32_t *ids, int64_t max)
{
    int64_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "cairn %s: bad value for %s: '%s' (comma-separated token ids)\n", a->cmd, name, s);
            a->bad = true;
            return -1;
        }
        if (n == max) {
            fprintf(stderr, "cairn %s: %s: more than %lld ids\n", a->cmd, name, (long long)max);
            a->bad = true;
            return -1;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

char *args_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (n < cap)
            break;
        if (cap >= ((size_t)1 << 30) || array_reserve(&buf, &cap, n + 1, 1, 0)) {
            free(buf);
            buf = NULL;
            break;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    char *z = realloc(buf, n + 1); /* NUL-terminated for text */
    if (!z) {
        free(buf);
        return NULL;
    }
    z[n] = 0;
    *len = n;
    return z;
}
