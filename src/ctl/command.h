/* Commands: imperative requests ("place this model", "delete that instance") that any
 * node may make and only the master turns into events (master.h). They travel from the
 * node whose API took the request to the master as LINK_T_COMMAND, and the master
 * answers with a result (NODE_T_COMMAND_RESULT, node.h).
 *
 * Wire JSON: one flat object {"kind", "command_id", <fields of the kind>}; every field is
 * required (nullable ones as null) and unknown fields are refused:
 *   PlaceInstance          model_id, sharding ("pipeline"|"tensor"), min_nodes (1..256),
 *                          draft_model (model id|null), num_draft_tokens (0..256), and
 *                          optionally the KV cache's ctx_len, cache_type_k, cache_type_v
 *                          (cluster_kv in state.h; without ctx_len the master chooses)
 *   CreateInstance         instance (an instance as in state.h)
 *   DeleteInstance         instance_id
 *   SetInstanceDraftModel  instance_id, draft_model (model id|null), num_draft_tokens
 *   TextGeneration         task_id, instance_id, node_id (whose API holds the request: the
 *                          sender), bytes (of the request body, sent to the first rank's
 *                          node apart: node/taskbody.h)
 *   CancelTask             task_id (the client went away)
 *   FinishTask             task_id, status ("Complete"|"Failed"|"Cancelled"), error (text|null)
 *
 * API bodies (command_from_request) carry the same fields without kind and command_id,
 * and fill what is missing: sharding "pipeline" (or "auto": ctl/estimate.h decides), min_nodes 1,
 * draft_model null,
 * num_draft_tokens COMMAND_DEFAULT_DRAFT_TOKENS; CreateInstance takes {"instance": {...}}
 * or the instance itself, whose instance_id, runner ids, ranks, world sizes, sharding,
 * draft fields and epoch may be left out. Errors name the field ("min_nodes: ..."). */
#ifndef CAIRN_CTL_COMMAND_H
#define CAIRN_CTL_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/state.h"

#define COMMAND_DEFAULT_DRAFT_TOKENS 4
#define COMMAND_MESSAGE_MAX 1024 /* bytes of a result's message, with the NUL */

enum command_kind {
    COMMAND_PLACE_INSTANCE,
    COMMAND_CREATE_INSTANCE,
    COMMAND_DELETE_INSTANCE,
    COMMAND_SET_INSTANCE_DRAFT_MODEL,
    COMMAND_TEXT_GENERATION,
    COMMAND_CANCEL_TASK,
    COMMAND_FINISH_TASK,
    COMMAND_KIND_COUNT
};

/* One command. The member of the union named after the kind holds its fields;
 * create_instance's shards are owned by the command and
 * freed by command_clear. */
struct command {
    enum command_kind kind;
    char id[IDS_ID_MAX + 1]; /* command_id: names the result; "" until assigned */
    union {
        struct {
            char model_id[IDS_MODEL_MAX + 1];
            enum cluster_sharding sharding;
            bool sharding_auto;                  /* "auto": the master takes the sharding whose best
                                                    candidate it estimates faster (sharding unused) */
            int min_nodes;                       /* 1..CLUSTER_MAX_SHARDS */
            char draft_model[IDS_MODEL_MAX + 1]; /* "" = none */
            int num_draft_tokens;                /* 0..CLUSTER_MAX_DRAFT_TOKENS */
            struct cluster_kv kv;                /* ctx_len 0: the master chooses */
        } place_instance;
        struct cluster_instance create_instance;
        struct {
            char instance_id[IDS_ID_MAX + 1];
        } delete_instance;
        struct {
            char instance_id[IDS_ID_MAX + 1];
            char draft_model[IDS_MODEL_MAX + 1]; /* "" = none */
            int num_draft_tokens;
        } set_draft_model;
        struct {
            char task_id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1], node_id[IDS_ID_MAX + 1];
            int64_t bytes; /* of the request body, which goes to the instance's first rank, not here */
        } text_generation;
        struct {
            char task_id[IDS_ID_MAX + 1];
        } cancel_task;
        struct {
            char task_id[IDS_ID_MAX + 1];
            enum cluster_task_status status; /* Complete, Failed or Cancelled */
            char error[COMMAND_MESSAGE_MAX]; /* "" = none */
        } finish_task;
    };
};

/* What the master answers to a command. code is 0 or a CAIRN_E* code: ENOTFOUND for an
 * unknown instance or model, EFORMAT/EINVAL for a command that cannot be carried out as
 * given, EFULL when no placement fits, ESTATE when no master could take it. On success
 * (term, index) is the position of the last event it produced (the reader waits for its
 * state to get there), and instance_id names the instance concerned.
 * JSON {"command_id", "code", "message", "instance_id": id|null, "term", "index"}. */
struct command_result {
    char command_id[IDS_ID_MAX + 1];
    int code;
    char message[COMMAND_MESSAGE_MAX];
    char instance_id[IDS_ID_MAX + 1]; /* "" = none */
    int64_t term, index;
};

/* Static JSON name of a kind ("PlaceInstance" ...), NULL when out of range. */
const char *command_kind_name(int kind);

/* Zeroes *c and sets its kind. */
void command_init(struct command *c, enum command_kind kind);

/* Frees what c owns and zeroes it; accepts a zeroed command. */
void command_clear(struct command *c);

/* New JSON object of c (wire form, see the top); NULL when out of memory or when a field
 * cannot be encoded (unknown kind or enum). */
json_t *command_to_jsonv(const struct command *c);

/* c as compact JSON text with sorted keys, malloc'd (free()); NULL as command_to_jsonv. */
char *command_to_json(const struct command *c);

/* Checks every field of wire JSON j and fills *out (caller clears it with
 * command_clear). CAIRN_EFORMAT naming the field ("PlaceInstance.min_nodes: ..."),
 * CAIRN_ENOMEM; *out is zeroed on failure. */
int command_from_jsonv(const json_t *j, struct command *out, char *err, size_t errlen);

/* As command_from_jsonv, from len bytes of JSON text (duplicate keys refused). */
int command_from_json(const char *text, size_t len, struct command *out, char *err,
                      size_t errlen);

/* Builds a command of kind from an API request: body is the parsed JSON body (may be
 * NULL for DeleteInstance), instance_id the id from the URL path (DeleteInstance,
 * SetInstanceDraftModel; NULL otherwise). Missing fields take the defaults above; ids
 * left out of a CreateInstance are made with ids_random. The command's own id stays "".
 * CAIRN_EFORMAT naming the field for bad input (unknown fields included), CAIRN_ENOMEM,
 * CAIRN_EIO when no random id can be made; *out is zeroed on failure. */
int command_from_request(enum command_kind kind, const json_t *body, const char *instance_id,
                         struct command *out, char *err, size_t errlen);

/* New JSON object of r (see struct command_result); NULL when out of memory. */
json_t *command_result_to_jsonv(const struct command_result *r);

/* Checks and reads a result; CAIRN_EFORMAT naming the field, *out zeroed on failure. */
int command_result_from_jsonv(const json_t *j, struct command_result *out, char *err,
                              size_t errlen);

#endif
