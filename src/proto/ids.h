/* Identifiers and checked JSON fields for the cluster's data model. Ids (node, instance,
 * runner, task) appear in URL paths, so they keep to a small alphabet; model ids may
 * also hold '/', '@' and '+'. Every reader names the field it refused as
 * "<path>.<key>: <why>", so a bad event from the network or from disk says where it
 * is wrong. No reader keeps a reference into the JSON it read. */
#ifndef CAIRN_PROTO_IDS_H
#define CAIRN_PROTO_IDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define IDS_ID_MAX 64        /* node/instance/runner/task id: [A-Za-z0-9._:-]{1,64} */
#define IDS_MODEL_MAX 255    /* model id: [A-Za-z0-9._:/@+-]{1,255} */
#define IDS_NAME_MAX 511     /* short text (CPU model, OS, ISA flags), no control bytes */
#define IDS_IFNAME_MAX 63    /* network interface name, short text */
#define IDS_ADDR_MAX 63      /* network address as text, e.g. "fe80::1%eth0/64" */
#define IDS_TEXT_MAX 8192    /* long text (error messages, stderr tails), no NUL */
#define IDS_BYTES_MAX ((int64_t)1 << 52) /* bound on every byte count (4 PiB) */
#define IDS_COUNTER_MAX (((int64_t)1 << 53) - 1) /* terms, indices, epochs, times in ms:
                                                  exact in a double, so in any JSON reader */
#define IDS_PATH_MAX 256     /* bytes of a field path kept in messages */
#define CLUSTER_MAX_SHARDS 256       /* nodes (ranks) per instance */
#define CLUSTER_MAX_DRAFT_TOKENS 256 /* draft tokens per speculation step */

/* Formats a field path into dst (n bytes), cut short quietly when it does not fit. */
void ids_path(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* True when s is a valid node/instance/runner/task id. */
bool ids_valid_id(const char *s);

/* True when s is a valid model id. */
bool ids_valid_model(const char *s);

/* Writes a fresh random id (32 lowercase hex digits from getrandom) into dst, which
 * holds IDS_ID_MAX + 1 bytes. CAIRN_EIO when the kernel gives no randomness. */
int ids_random(char *dst, char *err, size_t errlen);

/* CAIRN_EFORMAT unless j is an object whose keys are all in keys (NULL-terminated);
 * missing keys are left to the readers below. */
int ids_json_keys(const json_t *j, const char *path, const char *const *keys, char *err,
                  size_t errlen);

/* Required member key of object j with type type (JSON_OBJECT, JSON_ARRAY...) into *out
 * (borrowed). CAIRN_EFORMAT when missing or of another type. */
int ids_json_member(const json_t *j, const char *path, const char *key, json_type type,
                    json_t **out, char *err, size_t errlen);

/* Required id into dst (IDS_ID_MAX + 1 bytes). */
int ids_json_id(const json_t *j, const char *path, const char *key, char *dst, char *err,
                size_t errlen);

/* As ids_json_id, but JSON null gives "". */
int ids_json_id_or_null(const json_t *j, const char *path, const char *key, char *dst,
                        char *err, size_t errlen);

/* Model id into dst (IDS_MODEL_MAX + 1 bytes); with nullable, JSON null gives "". */
int ids_json_model(const json_t *j, const char *path, const char *key, bool nullable,
                   char *dst, char *err, size_t errlen);

/* Short text of at most max bytes (no control bytes) into dst (max + 1 bytes). */
int ids_json_name(const json_t *j, const char *path, const char *key, size_t max, char *dst,
                  char *err, size_t errlen);

/* As ids_json_name for a bare value v (an array element) whose full path is path. */
int ids_json_name_value(const json_t *v, const char *path, size_t max, char *dst, char *err,
                        size_t errlen);

/* Nullable long text (at most IDS_TEXT_MAX bytes, no NUL) into *dst: a malloc'd copy
 * owned by the caller, or NULL for JSON null. */
int ids_json_text(const json_t *j, const char *path, const char *key, char **dst, char *err,
                  size_t errlen);

/* Required integer in [lo, hi] into *dst. */
int ids_json_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi,
                 int64_t *dst, char *err, size_t errlen);

/* Required boolean into *dst. */
int ids_json_bool(const json_t *j, const char *path, const char *key, bool *dst, char *err,
                  size_t errlen);

/* Required string equal to one of name(0) .. name(n - 1); its index into *dst. */
int ids_json_enum(const json_t *j, const char *path, const char *key,
                  const char *(*name)(int), int n, int *dst, char *err, size_t errlen);

/* New JSON string of s, or JSON null when s is NULL (or "" with empty_is_null). */
json_t *ids_json_string_or_null(const char *s, bool empty_is_null);

#endif
