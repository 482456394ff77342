#include "ctl/command.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"

const char *command_kind_name(int kind)
{
    static const char *const names[] = {"PlaceInstance", "CreateInstance", "DeleteInstance",
                                        "SetInstanceDraftModel", "TextGeneration", "CancelTask",
                                        "FinishTask"};
    _Static_assert(sizeof names / sizeof names[0] == COMMAND_KIND_COUNT, "one name per kind");
    return kind >= 0 && kind < COMMAND_KIND_COUNT ? names[kind] : NULL;
}

void command_init(struct command *c, enum command_kind kind)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
}

void command_clear(struct command *c)
{
    if (c->kind == COMMAND_CREATE_INSTANCE)
        cluster_instance_clear(&c->create_instance);
    memset(c, 0, sizeof *c);
}

/* ---- JSON out ---- */

static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

json_t *command_to_jsonv(const struct command *c)
{
    const char *kind = command_kind_name((int)c->kind);
    if (!kind)
        return NULL;
    json_t *o = json_object();
    bool ok = o && put(o, "kind", json_string(kind)) &&
              put(o, "command_id", json_string(c->id));
    switch (c->kind) {
    case COMMAND_PLACE_INSTANCE: {
        const char *sh = c->place_instance.sharding_auto ? "auto"
                                                         : cluster_sharding_name((int)c->place_instance.sharding);
        ok = ok && sh && put(o, "model_id", json_string(c->place_instance.model_id)) &&
             put(o, "sharding", json_string(sh)) &&
             put(o, "min_nodes", json_integer(c->place_instance.min_nodes)) &&
             put(o, "draft_model", ids_json_string_or_null(c->place_instance.draft_model, true)) &&
             put(o, "num_draft_tokens", json_integer(c->place_instance.num_draft_tokens)) &&
             cluster_kv_put(o, &c->place_instance.kv);
        break;
    }
    case COMMAND_CREATE_INSTANCE:
        ok = ok && put(o, "instance", cluster_instance_to_json(&c->create_instance));
        break;
    case COMMAND_DELETE_INSTANCE:
        ok = ok && put(o, "instance_id", json_string(c->delete_instance.instance_id));
        break;
    case COMMAND_SET_INSTANCE_DRAFT_MODEL:
        ok = ok && put(o, "instance_id", json_string(c->set_draft_model.instance_id)) &&
             put(o, "draft_model", ids_json_string_or_null(c->set_draft_model.draft_model, true)) &&
             put(o, "num_draft_tokens", json_integer(c->set_draft_model.num_draft_tokens));
        break;
    case COMMAND_TEXT_GENERATION:
        ok = ok && put(o, "task_id", json_string(c->text_generation.task_id)) &&
             put(o, "instance_id", json_string(c->text_generation.instance_id)) &&
             put(o, "node_id", json_string(c->text_generation.node_id)) &&
             put(o, "bytes", json_integer(c->text_generation.bytes));
        break;
    case COMMAND_CANCEL_TASK:
        ok = ok && put(o, "task_id", json_string(c->cancel_task.task_id));
        break;
    case COMMAND_FINISH_TASK:
        ok = ok && cluster_task_status_name((int)c->finish_task.status) &&
             put(o, "task_id", json_string(c->finish_task.task_id)) &&
             put(o, "status", json_string(cluster_task_status_name((int)c->finish_task.status))) &&
             put(o, "error", ids_json_string_or_null(c->finish_task.error, true));
        break;
    default:
        ok = false;
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *command_to_json(const struct command *c)
{
    json_t *j = command_to_jsonv(c);
    if (!j)
        return NULL;
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return text;
}

/* ---- JSON in ---- */

static int get_int(const json_t *j, const char *path, const char *key, int lo, int hi, int *dst,
                   char *err, size_t errlen)
{
    int64_t v = 0;
    int rc = json_get_int(j, path, key, lo, hi, &v, err, errlen);
    if (!rc)
        *dst = (int)v;
    return rc;
}

/* Fields of kind c->kind from body (all present; the caller checked the key set). */
static int body_from_json(const json_t *body, const char *path, struct command *c, char *err,
                          size_t errlen)
{
    int rc, x = 0;
    json_t *v;
    char p[JSON_PATH_MAX];
    switch (c->kind) {
    case COMMAND_PLACE_INSTANCE:
        rc = ids_json_model(body, path, "model_id", false, c->place_instance.model_id, err,
                            errlen);
        c->place_instance.sharding_auto = json_is_string(v = json_object_get(body, "sharding")) &&
                                          !strcmp(json_string_value(v), "auto");
        if (!rc && !c->place_instance.sharding_auto)
            rc = json_get_enum(body, path, "sharding", cluster_sharding_name,
                               CLUSTER_SHARDING_COUNT, &x, err, errlen);
        c->place_instance.sharding = (enum cluster_sharding)x;
        if (!rc)
            rc = get_int(body, path, "min_nodes", 1, CLUSTER_MAX_SHARDS,
                         &c->place_instance.min_nodes, err, errlen);
        if (!rc)
            rc = ids_json_model(body, path, "draft_model", true, c->place_instance.draft_model,
                                err, errlen);
        if (!rc)
            rc = get_int(body, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS,
                         &c->place_instance.num_draft_tokens, err, errlen);
        if (!rc)
            rc = cluster_kv_from_json(body, path, &c->place_instance.kv, err, errlen);
        return rc;
    case COMMAND_CREATE_INSTANCE:
        rc = json_get_member(body, path, "instance", JSON_OBJECT, &v, err, errlen);
        if (!rc) {
            json_path(p, sizeof p, "%s.instance", path);
            rc = cluster_instance_from_json(v, p, &c->create_instance, err, errlen);
        }
        return rc;
    case COMMAND_DELETE_INSTANCE:
        return ids_json_id(body, path, "instance_id", c->delete_instance.instance_id, err,
                           errlen);
    case COMMAND_SET_INSTANCE_DRAFT_MODEL:
        rc = ids_json_id(body, path, "instance_id", c->set_draft_model.instance_id, err, errlen);
        if (!rc)
            rc = ids_json_model(body, path, "draft_model", true, c->set_draft_model.draft_model,
                                err, errlen);
        if (!rc)
            rc = get_int(body, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS,
                         &c->set_draft_model.num_draft_tokens, err, errlen);
        return rc;
    case COMMAND_TEXT_GENERATION:
        rc = ids_json_id(body, path, "task_id", c->text_generation.task_id, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "instance_id", c->text_generation.instance_id, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "node_id", c->text_generation.node_id, err, errlen);
        if (!rc)
            rc = json_get_int(body, path, "bytes", 1, (int64_t)CLUSTER_MAX_PARAMS, &c->text_generation.bytes, err,
                              errlen);
        return rc;
    case COMMAND_CANCEL_TASK:
        return ids_json_id(body, path, "task_id", c->cancel_task.task_id, err, errlen);
    case COMMAND_FINISH_TASK: {
        rc = ids_json_id(body, path, "task_id", c->finish_task.task_id, err, errlen);
        if (!rc)
            rc = json_get_enum(body, path, "status", cluster_task_status_name, CLUSTER_TASK_STATUS_COUNT, &x, err,
                               errlen);
        c->finish_task.status = (enum cluster_task_status)x;
        if (!rc && (x == CLUSTER_TASK_PENDING || x == CLUSTER_TASK_RUNNING))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.status: not a final status", path);
        char *error = NULL;
        if (!rc)
            rc = json_get_text(body, path, "error", IDS_TEXT_MAX, &error, err, errlen);
        if (!rc && error)
            snprintf(c->finish_task.error, sizeof c->finish_task.error, "%s", error);
        free(error);
        return rc;
    }
    default:
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: unknown kind", path);
    }
}

int command_from_jsonv(const json_t *j, struct command *out, char *err, size_t errlen)
{
    static const char *const place_keys[] = {"kind", "command_id", "model_id", "sharding",
                                             "min_nodes", "draft_model", "num_draft_tokens",
                                             "ctx_len", "cache_type_k", "cache_type_v", NULL};
    static const char *const create_keys[] = {"kind", "command_id", "instance", NULL};
    static const char *const delete_keys[] = {"kind", "command_id", "instance_id", NULL};
    static const char *const draft_keys[] = {"kind", "command_id", "instance_id", "draft_model",
                                             "num_draft_tokens", NULL};
    static const char *const textgen_keys[] = {"kind", "command_id", "task_id", "instance_id", "node_id",
                                               "bytes", NULL};
    static const char *const cancel_keys[] = {"kind", "command_id", "task_id", NULL};
    static const char *const finish_keys[] = {"kind", "command_id", "task_id", "status", "error", NULL};
    static const char *const *const keys[] = {place_keys,   create_keys, delete_keys, draft_keys,
                                              textgen_keys, cancel_keys, finish_keys};
    _Static_assert(sizeof keys / sizeof keys[0] == COMMAND_KIND_COUNT, "keys per kind");
    int kind = 0;
    memset(out, 0, sizeof *out);
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "command: must be an object");
    int rc = json_get_enum(j, "command", "kind", command_kind_name, COMMAND_KIND_COUNT, &kind,
                           err, errlen);
    if (rc)
        return rc;
    const char *path = command_kind_name(kind);
    command_init(out, (enum command_kind)kind);
    rc = json_get_keys(j, path, keys[kind], err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "command_id", out->id, err, errlen);
    if (!rc)
        rc = body_from_json(j, path, out, err, errlen);
    if (rc)
        command_clear(out);
    return rc;
}

int command_from_json(const char *text, size_t len, struct command *out, char *err,
                      size_t errlen)
{
    json_error_t je;
    memset(out, 0, sizeof *out);
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "command: JSON line %d column %d: %s",
                          je.line, je.column, je.text);
    int rc = command_from_jsonv(j, out, err, errlen);
    json_decref(j);
    return rc;
}

/* ---- API requests ---- */

/* Sets key to v in o unless o has it already; false when out of memory. */
static bool fill(json_t *o, const char *key, json_t *v)
{
    if (json_object_get(o, key)) {
        json_decref(v);
        return true;
    }
    return v && json_object_set_new(o, key, v) == 0;
}

/* The full instance object from what a client gave, defaults filled in. */
static int instance_request(const json_t *given, json_t **out, char *err, size_t errlen)
{
    static const char *const keys[] = {"instance_id", "model_id", "sharding", "shards", "draft_model",
                                       "num_draft_tokens", "epoch", "ctx_len", "cache_type_k",
                                       "cache_type_v", NULL};
    static const char *const shard_keys[] = {"node_id", "runner_id", "rank", "world_size",
                                             "layer_begin", "layer_end", NULL};
    char id[IDS_ID_MAX + 1], p[JSON_PATH_MAX];
    json_t *shards;
    *out = NULL;
    int rc = json_get_keys(given, "instance", keys, err, errlen);
    if (!rc)
        rc = json_get_member(given, "instance", "shards", JSON_ARRAY, &shards, err, errlen);
    if (rc)
        return rc;
    size_t n = json_array_size(shards);
    if (n < 1 || n > CLUSTER_MAX_SHARDS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "instance.shards: %zu entries, expected 1..%d",
                          n, CLUSTER_MAX_SHARDS);
    json_t *o = json_deep_copy(given);
    if (!o)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "instance: out of memory");
    bool ok = true;
    if (!json_object_get(o, "instance_id")) {
        if ((rc = ids_random(id, err, errlen)))
            goto fail;
        ok = fill(o, "instance_id", json_string(id));
    }
    ok = ok && fill(o, "sharding", json_string("pipeline")) &&
         fill(o, "draft_model", json_null()) &&
         fill(o, "num_draft_tokens", json_integer(COMMAND_DEFAULT_DRAFT_TOKENS)) &&
         fill(o, "epoch", json_integer(1));
    json_t *sh = json_object_get(o, "shards");
    for (size_t i = 0; ok && i < n; i++) {
        json_t *s = json_array_get(sh, i);
        json_path(p, sizeof p, "instance.shards[%zu]", i);
        if ((rc = json_get_keys(s, p, shard_keys, err, errlen)))
            goto fail;
        if (!json_object_get(s, "runner_id")) {
            if ((rc = ids_random(id, err, errlen)))
                goto fail;
            ok = fill(s, "runner_id", json_string(id));
        }
        ok = ok && fill(s, "rank", json_integer((json_int_t)i)) &&
             fill(s, "world_size", json_integer((json_int_t)n));
    }
    if (!ok) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "instance: out of memory");
        goto fail;
    }
    *out = o;
    return 0;
fail:
    json_decref(o);
    return rc;
}

int command_from_request(enum command_kind kind, const json_t *body, const char *instance_id,
                         struct command *out, char *err, size_t errlen)
{
    static const char *const place_keys[] = {"model_id",     "sharding",     "min_nodes",
                                             "draft_model",  "num_draft_tokens", "instance_meta",
                                             "ctx_len",      "cache_type_k", "cache_type_v",
                                             NULL};
    static const char *const draft_keys[] = {"draft_model", "num_draft_tokens", NULL};
    static const char *const create_keys[] = {"instance", NULL};
    json_t *j = NULL, *given;
    int rc;
    memset(out, 0, sizeof *out);
    if (kind < 0 || kind >= COMMAND_KIND_COUNT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "command: unknown kind %d", (int)kind);
    command_init(out, kind);
    if ((kind == COMMAND_DELETE_INSTANCE || kind == COMMAND_SET_INSTANCE_DRAFT_MODEL) &&
        (!instance_id || !ids_valid_id(instance_id))) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT,
                        "instance_id: must be 1..%d bytes of A-Z a-z 0-9 . _ : -", IDS_ID_MAX);
        goto fail;
    }
    if (kind == COMMAND_DELETE_INSTANCE) {
        snprintf(out->delete_instance.instance_id, sizeof out->delete_instance.instance_id, "%s",
                 instance_id);
        return 0;
    }
    if (!json_is_object(body)) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "body: must be a JSON object");
        goto fail;
    }
    switch (kind) {
    case COMMAND_PLACE_INSTANCE: {
        rc = json_get_keys(body, "body", place_keys, err, errlen);
        if (rc)
            goto fail;
        j = json_deep_copy(body);
        json_object_del(j, "instance_meta"); /* exo's MLX backend choice: nothing to us */
        if (!j || !fill(j, "sharding", json_string("pipeline")) ||
            !fill(j, "min_nodes", json_integer(1)) || !fill(j, "draft_model", json_null()) ||
            !fill(j, "num_draft_tokens", json_integer(COMMAND_DEFAULT_DRAFT_TOKENS))) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "body: out of memory");
            goto fail;
        }
        if (!json_object_get(j, "model_id")) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "model_id: required");
            goto fail;
        }
        break;
    }
    case COMMAND_CREATE_INSTANCE:
        given = json_object_get(body, "instance");
        if (given) {
            if ((rc = json_get_keys(body, "body", create_keys, err, errlen)))
                goto fail;
            if (!json_is_object(given)) {
                rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "instance: must be an object");
                goto fail;
            }
        } else {
            given = (json_t *)body;
        }
        if ((rc = instance_request(given, &j, err, errlen)))
            goto fail;
        rc = cluster_instance_from_json(j, "instance", &out->create_instance, err, errlen);
        json_decref(j);
        j = NULL;
        if (rc)
            goto fail;
        return 0;
    case COMMAND_SET_INSTANCE_DRAFT_MODEL:
        rc = json_get_keys(body, "body", draft_keys, err, errlen);
        if (rc)
            goto fail;
        if (!json_object_get(body, "draft_model")) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "draft_model: required (null for none)");
            goto fail;
        }
        j = json_deep_copy(body);
        if (!j || json_object_set_new(j, "instance_id", json_string(instance_id)) != 0 ||
            !fill(j, "num_draft_tokens", json_integer(COMMAND_DEFAULT_DRAFT_TOKENS))) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "body: out of memory");
            goto fail;
        }
        break;
    default:
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "command: unknown kind");
        goto fail;
    }
    /* Messages name the field as the client sent it, without a path prefix. */
    char inner[COMMAND_MESSAGE_MAX];
    rc = body_from_json(j, "", out, inner, sizeof inner);
    if (rc) {
        cairn_fail(err, errlen, rc, "%s", inner[0] == '.' ? inner + 1 : inner);
        goto fail;
    }
    json_decref(j);
    return 0;
fail:
    json_decref(j);
    command_clear(out);
    return rc;
}

/* ---- results ---- */

/* The message as a JSON string; text that is not UTF-8 is replaced by a note. */
static json_t *message_json(const char *msg, size_t cap)
{
    json_t *s = json_stringn(msg, strnlen(msg, cap));
    return s ? s : json_string("(message not UTF-8)");
}

json_t *command_result_to_jsonv(const struct command_result *r)
{
    json_t *o = json_object();
    bool ok = o && put(o, "command_id", json_string(r->command_id)) &&
              put(o, "code", json_integer(r->code)) &&
              put(o, "message", message_json(r->message, sizeof r->message)) &&
              put(o, "instance_id", ids_json_string_or_null(r->instance_id, true)) &&
              put(o, "term", json_integer(r->term)) && put(o, "index", json_integer(r->index));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int command_result_from_jsonv(const json_t *j, struct command_result *out, char *err,
                              size_t errlen)
{
    static const char *const keys[] = {"command_id", "code", "message", "instance_id", "term",
                                       "index", NULL};
    int64_t code = 0;
    char *msg = NULL;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, "result", keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, "result", "command_id", out->command_id, err, errlen);
    if (!rc)
        rc = json_get_int(j, "result", "code", CAIRN_ERR_FIRST_ + 1, 0, &code, err, errlen);
    if (!rc)
        rc = json_get_text(j, "result", "message", IDS_TEXT_MAX, &msg, err, errlen);
    if (!rc)
        rc = ids_json_id_or_null(j, "result", "instance_id", out->instance_id, err, errlen);
    if (!rc)
        rc = json_get_int(j, "result", "term", 0, IDS_COUNTER_MAX, &out->term, err, errlen);
    if (!rc)
        rc = json_get_int(j, "result", "index", 0, IDS_COUNTER_MAX, &out->index, err, errlen);
    if (rc) {
        free(msg);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->code = (int)code;
    snprintf(out->message, sizeof out->message, "%s", msg ? msg : "");
    free(msg);
    return 0;
}
