/* Which byte ranges of a file are there: a file fetched by ranges (a pipeline rank's
 * layers, node/hub.h; a pull over several connections) is written where its bytes go,
 * with holes, and this record beside it, stored after the bytes it names are written, so
 * a later fetch (this process or another) asks only for the holes. On disk:
 * {"size": N, "ranges": [[begin, end], ...]}, sorted and apart; a record that is not
 * that reads as empty (its bytes are fetched again). */
#ifndef CAIRN_NODE_RANGES_H
#define CAIRN_NODE_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RANGES_SUFFIX ".have"
#define RANGES_MAX 65536 /* a record with more is refused (read as empty) */

struct ranges {
    uint64_t size;
    uint64_t (*r)[2]; /* [begin, end), sorted, apart */
    size_t n, cap;
};

void ranges_free(struct ranges *h);
/* Adds [a, b) (a < b); the ranges it touches become one. false when out of memory. */
bool ranges_add(struct ranges *h, uint64_t a, uint64_t b);
/* Bytes of [a, b) that h lacks. */
uint64_t ranges_missing(const struct ranges *h, uint64_t a, uint64_t b);
/* The first hole of [at, end) into [*hole, *hole_end): false when there is none. */
bool ranges_next_hole(const struct ranges *h, uint64_t at, uint64_t end, uint64_t *hole, uint64_t *hole_end);
/* Reads path's record of a file of size bytes into h (empty when missing or not valid). */
void ranges_load(const char *path, uint64_t size, struct ranges *h);
/* Stores h at path (a temporary file, renamed over it). durable: the file is synced
 * first, and the caller has synced the bytes it names, so the record holds across a
 * power cut; without, it holds across a killed process only (the page cache keeps
 * both), for a caller whose file is checked by its hash before use. */
int ranges_store(const char *path, const struct ranges *h, bool durable, char *err, size_t errlen);

#endif
