/* Which byte ranges of a file are there (ranges.h). */
#include "node/ranges.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/err.h"
#include "base/files.h"


void ranges_free(struct ranges *h)
{
    free(h->r);
    memset(h, 0, sizeof *h);
}

static bool put(struct ranges *h, uint64_t a, uint64_t b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        void *r = realloc(h->r, cap * sizeof *h->r);
        if (!r)
            return false;
        h->r = r;
        h->cap = cap;
    }
    h->r[h->n][0] = a;
    h->r[h->n][1] = b;
    h->n++;
    return true;
}

/* Adds [a, b): the ranges it touches become one. */
bool ranges_add(struct ranges *h, uint64_t a, uint64_t b)
{
    struct ranges out = {.size = h->size};
    bool ok = true, placed = false;
    for (size_t i = 0; i < h->n && ok; i++) {
        uint64_t x = h->r[i][0], y = h->r[i][1];
        if (y < a || x > b) {
            if (!placed && x > b) {
                ok = put(&out, a, b);
                placed = true;
            }
            ok = ok && put(&out, x, y);
        } else {
            a = x < a ? x : a;
            b = y > b ? y : b;
        }
    }
    if (ok && !placed)
        ok = put(&out, a, b);
    if (!ok) {
        ranges_free(&out);
        return false;
    }
    ranges_free(h);
    *h = out;
    return true;
}

/* Bytes of [a, b) that h lacks. */
uint64_t ranges_missing(const struct ranges *h, uint64_t a, uint64_t b)
{
    uint64_t miss = b - a;
    for (size_t i = 0; i < h->n; i++) {
        uint64_t x = h->r[i][0] > a ? h->r[i][0] : a, y = h->r[i][1] < b ? h->r[i][1] : b;
        if (x < y)
            miss -= y - x;
    }
    return miss;
}

/* Reads path's record for a file of size bytes; a missing, malformed or other-sized one
 * reads as empty (its bytes are fetched again). */
void ranges_load(const char *path, uint64_t size, struct ranges *h)
{
    memset(h, 0, sizeof *h);
    h->size = size;
    json_t *j = json_load_file(path, 0, NULL), *e;
    json_t *ranges = json_object_get(j, "ranges");
    size_t i;
    bool ok = (uint64_t)json_integer_value(json_object_get(j, "size")) == size && json_is_array(ranges) &&
              json_array_size(ranges) <= RANGES_MAX;
    uint64_t last = 0;
    json_array_foreach(ranges, i, e) {
        json_int_t a = json_integer_value(json_array_get(e, 0)), b = json_integer_value(json_array_get(e, 1));
        ok = ok && json_array_size(e) == 2 && a >= 0 && a < b && (uint64_t)b <= size && (i == 0 || (uint64_t)a > last);
        ok = ok && put(h, (uint64_t)a, (uint64_t)b);
        last = (uint64_t)b;
        if (!ok)
            break;
    }
    json_decref(j);
    if (!ok) {
        ranges_free(h);
        h->size = size;
    }
}

int ranges_store(const char *path, const struct ranges *h, bool durable, char *err, size_t errlen)
{
    json_t *ranges = json_array();
    for (size_t i = 0; ranges && i < h->n; i++)
        json_array_append_new(ranges, json_pack("[I, I]", (json_int_t)h->r[i][0], (json_int_t)h->r[i][1]));
    json_t *j = json_pack("{s:I, s:o}", "size", (json_int_t)h->size, "ranges", ranges);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = 0;
    if (!j || json_dump_file(j, tmp, 0) || (durable && files_sync(tmp, O_RDONLY)) || rename(tmp, path))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot write %s: %s", path, strerror(errno));
    json_decref(j);
    return rc;
}

bool ranges_next_hole(const struct ranges *h, uint64_t at, uint64_t end, uint64_t *hole, uint64_t *hole_end)
{
    for (size_t i = 0; i < h->n && at < end; i++) {
        if (h->r[i][1] <= at)
            continue;
        if (h->r[i][0] > at) {
            *hole = at;
            *hole_end = h->r[i][0] < end ? h->r[i][0] : end;
            return true;
        }
        at = h->r[i][1];
    }
    if (at >= end)
        return false;
    *hole = at;
    *hole_end = end;
    return true;
}
