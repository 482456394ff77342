/* Model catalog: the GGUF files of a models folder, each described by a card read from
 * the file's own metadata (DESIGN.md, "Where things live on disk"). The scan lists the
 * regular files (symbolic links followed) directly in the folder whose name ends in
 * ".gguf" (any case) and does not start with '.'; sub-folders are not entered. A model
 * split by gguf-split is listed once, by its first part ("NAME-00001-of-0000N.gguf",
 * whose id keeps that name); its card's tensors are those of every part, its file bytes
 * and hash the first part's (what identifies the file for the card cache).
 *
 * Id rule: the file name without its ".gguf" ending, each byte outside the model-id
 * alphabet [A-Za-z0-9._:/@+-] replaced by '_', cut to IDS_MODEL_MAX bytes; a name that
 * would leave an empty id gives "_". A model pulled from the hub (node/hub.h) is named
 * by the reference its sidecar file records instead. general.name is shown on the card but never used
 * as the id (two quantizations of one model share it). Two files whose ids collide: the
 * one whose file name sorts later is listed with an error.
 *
 * A file that cannot be used (truncated, corrupt, unsupported architecture or tensor
 * type, layers without tensors) is listed with its error instead of a card: a scan never
 * fails because of one file. Cards are kept across scans while a file's (size, mtime)
 * stays the same, so a rescan re-reads only what changed, and the SHA-256 of a file,
 * computed lazily, is cached by (path, size, mtime) the same way.
 *
 * Not thread-safe: a caller that shares a catalog between threads serializes the calls
 * (and may hash outside its lock with catalog_file_sha256 + catalog_put_sha256). */
#ifndef CAIRN_NODE_CATALOG_H
#define CAIRN_NODE_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/card.h"
#include "proto/ids.h"

#define CATALOG_MAX_FILES 4096 /* files listed per folder; more are ignored (logged) */

struct catalog;

/* Reads the card of one file into *out (zeroed first; the caller releases it with
 * catalog_card_clear, also on failure). A file that cannot be used returns its error
 * code with the reason in err; out->path, file_bytes and mtime_ns are still filled when
 * the file could be stat'ed. The id is derived from the file name by the rule above. */
int catalog_card_read(struct catalog_card *out, const char *path, char *err, size_t errlen);

/* Writes the id of a file name (no folder) by the rule above into id
 * (IDS_MODEL_MAX + 1 bytes). */
void catalog_id_from_file_name(const char *file_name, char *id);

/* Creates an empty catalog of folder dir (copied), owned by the caller; nothing is read
 * until catalog_scan. CAIRN_EINVAL for an empty dir, CAIRN_ENOMEM. */
int catalog_create(struct catalog **out, const char *dir, char *err, size_t errlen);

/* Frees the catalog and its cards; accepts NULL. */
void catalog_release(struct catalog *c);

/* Folder the catalog lists. */
const char *catalog_dir(const struct catalog *c);

/* Lists the folder again: new and changed files are read, unchanged ones keep their
 * card (and hash), removed ones are dropped. A folder that does not exist gives an
 * empty catalog and 0. CAIRN_EIO when it exists but cannot be read, CAIRN_ENOMEM;
 * on failure the previous list stays. Card pointers are invalid after a scan. */
int catalog_scan(struct catalog *c, char *err, size_t errlen);

/* Number of files listed (cards and errors), and the i-th in id order. */
size_t catalog_count(const struct catalog *c);
const struct catalog_card *catalog_at(const struct catalog *c, size_t i);

/* Card of an id, or NULL. */
const struct catalog_card *catalog_find(const struct catalog *c, const char *id);

/* SHA-256 of the file of id into hex (CATALOG_SHA256_HEX bytes): the cached value, or
 * read now (the whole file: seconds per GiB) and cached. CAIRN_ENOTFOUND for an unknown
 * id, CAIRN_ESTATE when the file's size or mtime changed since the scan (rescan first),
 * CAIRN_EIO when it cannot be read. */
int catalog_sha256(struct catalog *c, const char *id, char *hex, char *err, size_t errlen);

/* SHA-256 of a file (node/sha256.h, streamed in 1 MiB reads) into hex; with size_out and
 * mtime_out not NULL, the file's (size, mtime) before reading; CAIRN_ESTATE when they
 * changed while it was read. CAIRN_EIO when it cannot be read. */
int catalog_file_sha256(const char *path, char *hex, uint64_t *size_out, int64_t *mtime_out,
                        char *err, size_t errlen);

/* Stores a hash computed by catalog_file_sha256 for the card of that path when its
 * (size, mtime) still match; returns 0 when stored, CAIRN_ENOTFOUND otherwise. */
int catalog_put_sha256(struct catalog *c, const char *path, uint64_t size, int64_t mtime_ns,
                       const char *hex);

/* New JSON array of every card in id order, NULL when out of memory. */
json_t *catalog_to_json(const struct catalog *c);

#endif
