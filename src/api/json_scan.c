/* Scans of a JSON body before it is parsed (json_scan.h). Pure: no allocation. */
#include "api/json_scan.h"

#include <stdbool.h>
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

size_t http_json_values(const char *text, size_t len, size_t limit)
{
    size_t n = 0;
    bool in_str = false, esc = false;
    char prev = '['; /* the last structural character outside strings */
    for (size_t i = 0; i < len && n <= limit; i++) {
        char c = text[i];
        bool was_in = in_str;
        if (string_byte(c, &in_str, &esc)) {
            n += !was_in; /* a key or a string begins: each is a copy */
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
            continue;
        if (c == '{' || c == '[')
            n++;
        else if (strchr(":,[", prev) && c && strchr("-0123456789tfn", c))
            n++; /* a number, true, false or null begins */
        prev = c;
    }
    return n;
}

int http_json_depth(const char *text, size_t len, int limit)
{
    int depth = 0, max = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (string_byte(c, &in_str, &esc))
            continue;
        if (c == '[' || c == '{') {
            if (++depth > max) {
                max = depth;
                if (max > limit)
                    return limit + 1;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return max;
}
