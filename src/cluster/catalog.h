/* Model catalog: the GGUF files of a models folder, each described by a card read from
 * the file's own metadata (DESIGN.md, "Where things live on disk"). The scan lists the
 * regular files (symbolic links followed) directly in the folder whose name ends in
 * ".gguf" (any case) and does not start with '.'; sub-folders are not entered.
 *
 * Id rule: the file name without its ".gguf" ending, each byte outside the model-id
 * alphabet [A-Za-z0-9._:/@+-] replaced by '_', cut to IDS_MODEL_MAX bytes; a name that
 * would leave an empty id gives "_". general.name is shown on the card but never used
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
#ifndef CAIRN_CLUSTER_CATALOG_H
#define CAIRN_CLUSTER_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cluster/ids.h"
#include "cluster/place.h"

#define CATALOG_MAX_FILES 4096 /* files listed per folder; more are ignored (logged) */
#define CATALOG_SHA256_HEX 65  /* 64 hex digits and the NUL */

/* One file of the catalog. With error set, only id, path, file_bytes and mtime_ns are
 * meaningful; the other fields are zero. */
struct catalog_card {
    char id[IDS_MODEL_MAX + 1];
    char *path;                 /* malloc'd: folder + "/" + file name */
    char *error;                /* malloc'd; NULL for a usable file */
    uint64_t file_bytes;
    int64_t mtime_ns;           /* modification time, ns since the epoch */
    char name[IDS_NAME_MAX + 1]; /* general.name (control bytes dropped) or "" */
    char arch[32];              /* general.architecture */
    int n_layers, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
    int64_t n_ctx;              /* trained context length */
    bool chat_template;         /* tokenizer.chat_template present and not empty */
    bool tied_output;           /* no output.weight: the head is token_embd */
    uint64_t *layer_bytes;      /* n_layers entries, malloc'd: sum of blk.N.* tensor sizes */
    uint64_t embd_bytes;        /* token_embd.weight */
    uint64_t head_bytes;        /* output.weight, or token_embd.weight when tied */
    uint64_t output_norm_bytes; /* output_norm.weight */
    uint64_t other_bytes;       /* every other tensor (rope_freqs.weight ...) */
    uint64_t weight_bytes;      /* all tensors of the file once (a tied head counted once) */
    uint64_t kv_bytes_per_token_layer; /* F16 K and V: 2 * n_head_kv * head_dim * 2 */
    char sha256[CATALOG_SHA256_HEX]; /* lowercase hex, "" until computed */
};

struct catalog;

/* Reads the card of one file into *out (zeroed first; the caller releases it with
 * catalog_card_clear, also on failure). A file that cannot be used returns its error
 * code with the reason in err; out->path, file_bytes and mtime_ns are still filled when
 * the file could be stat'ed. The id is derived from the file name by the rule above. */
int catalog_card_read(struct catalog_card *out, const char *path, char *err, size_t errlen);

/* Frees what a card owns and zeroes it; accepts a zeroed card. */
void catalog_card_clear(struct catalog_card *card);

/* Makes dst an independent deep copy of src (dst is overwritten, not freed); CAIRN_ENOMEM
 * leaves dst zeroed. */
int catalog_card_copy(struct catalog_card *dst, const struct catalog_card *src);

/* Writes the id of a file name (no folder) by the rule above into id
 * (IDS_MODEL_MAX + 1 bytes). */
void catalog_id_from_file_name(const char *file_name, char *id);

/* New JSON object of a card for GET /models, NULL when out of memory:
 *   {"id", "file", "bytes", "name", "architecture", "n_layers", "hidden_size",
 *    "feed_forward_size", "n_head", "n_head_kv", "head_dim", "context_length",
 *    "vocab_size", "chat_template", "tied_output", "layer_bytes": [..],
 *    "embedding_bytes", "head_bytes", "output_norm_bytes", "other_bytes",
 *    "weight_bytes", "kv_bytes_per_token_layer", "sha256": hex|null, "error": null}
 * and for an unusable file {"id", "file", "bytes", "error": text}. */
json_t *catalog_card_to_json(const struct catalog_card *card);

/* Fills the model part of a placement request from a usable card (id points into the
 * card); ctx_len and n_slots as given. CAIRN_ESTATE for a card with an error,
 * CAIRN_ERANGE when a count is beyond place.h's bounds. */
int catalog_card_place_model(const struct catalog_card *card, uint32_t ctx_len, uint32_t n_slots,
                             struct place_model *out, char *err, size_t errlen);

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

/* SHA-256 of a file (libsodium, streamed in 1 MiB reads) into hex; with size_out and
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
