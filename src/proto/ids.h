/* Identifiers and the bounds of the cluster's data model. Ids (node, instance, runner,
 * task) appear in URL paths, so they keep to a small alphabet; model ids may also hold
 * '/', '@' and '+'. The id readers are built on base/json.h's required-member readers
 * and name the field they refused the same way: "<path>.<key>: <why>". */
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
#define CLUSTER_MAX_SHARDS 256       /* nodes (ranks) per instance */
#define CLUSTER_MAX_DRAFT_TOKENS 256 /* draft tokens per speculation step */

/* True when s is a valid node/instance/runner/task id. */
bool ids_valid_id(const char *s);

/* True when s is a valid model id. */
bool ids_valid_model(const char *s);

/* Writes a fresh random id (32 lowercase hex digits from getrandom) into dst, which
 * holds IDS_ID_MAX + 1 bytes. CAIRN_EIO when the kernel gives no randomness. */
int ids_random(char *dst, char *err, size_t errlen);

/* Required id into dst (IDS_ID_MAX + 1 bytes); errors as json_get_* (base/json.h). */
int ids_json_id(const json_t *j, const char *path, const char *key, char *dst, char *err,
                size_t errlen);

/* As ids_json_id, but JSON null gives "". */
int ids_json_id_or_null(const json_t *j, const char *path, const char *key, char *dst,
                        char *err, size_t errlen);

/* Model id into dst (IDS_MODEL_MAX + 1 bytes); with nullable, JSON null gives "". */
int ids_json_model(const json_t *j, const char *path, const char *key, bool nullable,
                   char *dst, char *err, size_t errlen);

/* New JSON string of s, or JSON null when s is NULL (or "" with empty_is_null). */
json_t *ids_json_string_or_null(const char *s, bool empty_is_null);

#endif
