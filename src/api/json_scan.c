/* Scans of a JSON body before it is parsed (json_scan.h). Pure: no allocation. */
#include "api/json_scan.h"

#include <stdbool.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* Steps the string state over one byte of JSON text; true when the byte is inside a
 * string (its quotes included), which the scanners below skip. */
static bool string_byte(char c, bool *in_str, bool *esc)
{
    if (*in_str) {
        if (*esc)
            *esc = false;
        else if (c == '\\')
            *esc = true;
        else if (c == '"')
            *in_str = false;
        return true;
    }
    if (c == '"') {
        *in_str = true;
        return true;
    }
    return false;
}

void http_json_scan(const char *text, size_t len, int depth_limit, size_t values_limit, int *depth_out,
                    size_t *values_out)
{
    size_t n = 0;
    int depth = 0, max = 0;
    bool in_str = false, esc = false;
    char prev = '['; /* the last structural character outside strings */
    for (size_t i = 0; i < len && n <= values_limit && max <= depth_limit; i++) {
        char c = text[i];
        bool was_in = in_str;
        if (string_byte(c, &in_str, &esc)) {
            n += !was_in; /* a key or a string begins: each is a copy */
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
            continue;
        if (c == '{' || c == '[') {
            n++;
            if (++depth > max)
                max = depth;
        } else if (c == ']' || c == '}') {
            depth -= depth > 0;
        } else if (strchr(":,[", prev) && c && strchr("-0123456789tfn", c)) {
            n++; /* a number, true, false or null begins */
        }
        prev = c;
    }
    *depth_out = max;
    *values_out = n;
}

size_t http_json_values(const char *text, size_t len, size_t limit)
{
    int depth;
    size_t n;
    http_json_scan(text, len, INT_MAX - 1, limit, &depth, &n);
    return n;
}

int http_json_depth(const char *text, size_t len, int limit)
{
    int depth;
    size_t n;
    http_json_scan(text, len, limit, SIZE_MAX - 1, &depth, &n);
    return depth;
}
