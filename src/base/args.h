/* Small helpers for parsing sub-command options: `--name value` and `--name=value`. */
#ifndef CAIRN_BASE_ARGS_H
#define CAIRN_BASE_ARGS_H

#include <stdbool.h>
#include <stdint.h>

struct args {
    int argc;
    char **argv;
    int i;            /* index of the option being looked at */
    const char *cmd;  /* sub-command name for messages */
    bool bad;         /* a value was missing or malformed (message printed) */
};

/* True when argv[i] is the option `name` (or one of its aliases, `|`-separated);
 * then *value is its value (from `=` or the next argument) if value is not NULL. */
bool args_opt(struct args *a, const char *names, const char **value);

/* Parse helpers: print "cairn CMD: bad value for NAME: ..." and set a->bad on error. */
int64_t args_int(struct args *a, const char *name, const char *s, int64_t lo, int64_t hi);
double args_float(struct args *a, const char *name, const char *s, double lo, double hi);

/* Parses "1,2,3" into ids (at most max); returns the count or -1 (message printed). */
int64_t args_int_list(struct args *a, const char *name, const char *s, int32_t *ids, int64_t max);

#include <stddef.h>

/* Whole file as NUL-terminated bytes (malloc'd; *len without the NUL), NULL when it cannot
 * be read (up to 1 GiB). */
char *args_read_file(const char *path, size_t *len);

#endif
