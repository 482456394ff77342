/* libFuzzer harness of the scans the HTTP server runs over a JSON body before parsing it
 * (api/json_scan.c): on any bytes they stop and stay within their limits, and for text
 * that jansson parses they never count less than the parse makes (values, depth), so a
 * body cannot slip past the budget by fooling the scan. Built and run by run.sh. */
#include "api/json_scan.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

/* Values and depth of a parsed JSON value, keys counted as values (each is a copy). */
static size_t count(const json_t *j, int depth, int *max_depth)
{
    size_t n = 1;
    if (json_is_object(j) || json_is_array(j)) {
        if (depth + 1 > *max_depth)
            *max_depth = depth + 1;
        const char *k;
        json_t *v;
        size_t i;
        if (json_is_object(j))
            json_object_foreach((json_t *)j, k, v) n += 1 + count(v, depth + 1, max_depth);
        else
            json_array_foreach(j, i, v) n += count(v, depth + 1, max_depth);
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    size_t values = http_json_values(text, size, 1000000);
    int depth = http_json_depth(text, size, 64);
    if (values > 1000001 || depth < 0 || depth > 65)
        abort();
    if (http_json_values(text, size, 3) > 4)
        abort(); /* counting stops just past the limit */
    int d1;
    size_t v1;
    http_json_scan(text, size, 64, 1000000, &d1, &v1);
    if ((d1 <= 64 && v1 <= 1000000) && (d1 != depth || v1 != values))
        abort(); /* one pass gives what the two give */
    json_t *j = json_loadb(text, size, JSON_DECODE_ANY, NULL);
    if (j) {
        int d = 0;
        size_t n = count(j, 0, &d);
        if (values < n || (depth < d && depth <= 64))
            abort(); /* the scan saw less than the parse made */
        json_decref(j);
    }
    return 0;
}
