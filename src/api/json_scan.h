/* What a JSON body would cost to parse, read before parsing it: its nesting depth and
 * the values it would make. The HTTP server refuses bodies past its limits with them. */
#ifndef CAIRN_API_JSON_SCAN_H
#define CAIRN_API_JSON_SCAN_H

#include <stddef.h>

/* Largest nesting depth of arrays and objects in JSON text (strings skipped), scanning
 * no further once the depth exceeds limit (then limit + 1 is returned). */
int http_json_depth(const char *text, size_t len, int limit);

/* The values a JSON text would make when parsed (objects, arrays, strings and keys,
 * numbers, literals: each one allocation), counting no further than limit + 1. */
size_t http_json_values(const char *text, size_t len, size_t limit);

/* Both in one pass over text: *depth_out as http_json_depth (limit depth_limit) and
 * *values_out as http_json_values (limit values_limit); the scan stops once either is
 * past its limit. */
void http_json_scan(const char *text, size_t len, int depth_limit, size_t values_limit, int *depth_out,
                    size_t *values_out);

#endif
