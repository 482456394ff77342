#include "ctl/event.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"

const char *event_kind_name(int kind)
{
    static const char *const names[] = {
        "NodeGatheredInfo", "NodeTimedOut",       "TopologyEdgeCreated",
        "TopologyEdgeDeleted", "InstanceCreated", "InstanceDeleted",
        "InstanceDraftModelUpdated", "RunnerStatusUpdated", "RunnerDeleted",
        "NodeDownloadProgress", "TaskCreated",    "TaskStatusUpdated",
        "TaskAcknowledged",   "TaskDeleted",      "MasterElected",
        "InstanceEpochAdvanced", "StateSnapshot",
    };
    _Static_assert(sizeof names / sizeof names[0] == EVENT_KIND_COUNT, "one name per kind");
    return kind >= 0 && kind < EVENT_KIND_COUNT ? names[kind] : NULL;
}

void event_init(struct event *e, enum event_kind kind, int64_t term, int64_t index)
{
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->term = term;
    e->index = index;
}

void event_clear(struct event *e)
{
    switch (e->kind) {
    case EVENT_NODE_GATHERED_INFO:
        cluster_node_info_clear(&e->node_gathered_info.info);
        break;
    case EVENT_INSTANCE_CREATED:
        cluster_instance_clear(&e->instance_created);
        break;
    case EVENT_RUNNER_STATUS_UPDATED:
        cluster_runner_clear(&e->runner_status_updated);
        break;
    case EVENT_NODE_DOWNLOAD_PROGRESS:
        cluster_download_clear(&e->node_download_progress);
        break;
    case EVENT_TASK_STATUS_UPDATED:
        free(e->task_status_updated.error);
        break;
    case EVENT_STATE_SNAPSHOT:
        cluster_state_release(e->state_snapshot.state);
        break;
    default:
        break;
    }
    memset(e, 0, sizeof *e);
}

int event_copy(struct event *dst, const struct event *src)
{
    int rc = 0;
    *dst = *src;
    switch (src->kind) {
    case EVENT_NODE_GATHERED_INFO:
        rc = cluster_node_info_copy(&dst->node_gathered_info.info, &src->node_gathered_info.info);
        break;
    case EVENT_INSTANCE_CREATED:
        rc = cluster_instance_copy(&dst->instance_created, &src->instance_created);
        break;
    case EVENT_RUNNER_STATUS_UPDATED:
        rc = cluster_runner_copy(&dst->runner_status_updated, &src->runner_status_updated);
        break;
    case EVENT_NODE_DOWNLOAD_PROGRESS:
        rc = cluster_download_copy(&dst->node_download_progress, &src->node_download_progress);
        break;
    case EVENT_TASK_STATUS_UPDATED:
        if (src->task_status_updated.error) {
            dst->task_status_updated.error = strdup(src->task_status_updated.error);
            rc = dst->task_status_updated.error ? 0 : CAIRN_ENOMEM;
        }
        break;
    case EVENT_STATE_SNAPSHOT:
        if (src->state_snapshot.state) {
            dst->state_snapshot.state = cluster_state_copy(src->state_snapshot.state);
            rc = dst->state_snapshot.state ? 0 : CAIRN_ENOMEM;
        }
        break;
    default:
        break;
    }
    if (rc)
        memset(dst, 0, sizeof *dst);
    return rc;
}

/* ---- JSON out ---- */

static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

/* Copies the members of the element object v into o and drops v. */
static bool merge(json_t *o, json_t *v)
{
    bool ok = v && json_object_update(o, v) == 0;
    json_decref(v);
    return ok;
}

json_t *event_to_jsonv(const struct event *e)
{
    const char *name = event_kind_name((int)e->kind);
    json_t *o = json_object();
    bool ok = o && name && put(o, "kind", json_string(name)) &&
              put(o, "term", json_integer(e->term)) && put(o, "index", json_integer(e->index));
    if (!ok)
        goto fail;
    switch (e->kind) {
    case EVENT_NODE_GATHERED_INFO:
        ok = put(o, "node_id", json_string(e->node_gathered_info.node_id)) &&
             put(o, "when_ms", json_integer(e->node_gathered_info.when_ms)) &&
             put(o, "info", cluster_node_info_to_json(&e->node_gathered_info.info));
        break;
    case EVENT_NODE_TIMED_OUT:
        ok = put(o, "node_id", json_string(e->node_timed_out.node_id));
        break;
    case EVENT_TOPOLOGY_EDGE_CREATED:
        ok = merge(o, cluster_edge_to_json(&e->topology_edge_created));
        break;
    case EVENT_TOPOLOGY_EDGE_DELETED:
        ok = put(o, "from", json_string(e->topology_edge_deleted.from)) &&
             put(o, "to", json_string(e->topology_edge_deleted.to));
        break;
    case EVENT_INSTANCE_CREATED:
        ok = put(o, "instance", cluster_instance_to_json(&e->instance_created));
        break;
    case EVENT_INSTANCE_DELETED:
        ok = put(o, "instance_id", json_string(e->instance_deleted.instance_id));
        break;
    case EVENT_INSTANCE_DRAFT_MODEL_UPDATED:
        ok = put(o, "instance_id", json_string(e->instance_draft_model_updated.instance_id)) &&
             put(o, "draft_model",
                 ids_json_string_or_null(e->instance_draft_model_updated.draft_model, true)) &&
             put(o, "num_draft_tokens",
                 json_integer(e->instance_draft_model_updated.num_draft_tokens));
        break;
    case EVENT_RUNNER_STATUS_UPDATED:
        ok = merge(o, cluster_runner_to_json(&e->runner_status_updated));
        break;
    case EVENT_RUNNER_DELETED:
        ok = put(o, "runner_id", json_string(e->runner_deleted.runner_id));
        break;
    case EVENT_NODE_DOWNLOAD_PROGRESS:
        ok = merge(o, cluster_download_to_json(&e->node_download_progress));
        break;
    case EVENT_TASK_CREATED:
        ok = put(o, "task_id", json_string(e->task_created.task_id)) &&
             put(o, "task_kind", json_string(cluster_task_kind_name(e->task_created.kind))) &&
             put(o, "instance_id", json_string(e->task_created.instance_id)) &&
             put(o, "node_id", json_string(e->task_created.node_id)) &&
             put(o, "bytes", json_integer(e->task_created.bytes));
        break;
    case EVENT_TASK_STATUS_UPDATED:
        ok = put(o, "task_id", json_string(e->task_status_updated.task_id)) &&
             put(o, "status",
                 json_string(cluster_task_status_name(e->task_status_updated.status))) &&
             put(o, "error", ids_json_string_or_null(e->task_status_updated.error, false));
        break;
    case EVENT_TASK_ACKNOWLEDGED:
        ok = put(o, "task_id", json_string(e->task_acknowledged.task_id));
        break;
    case EVENT_TASK_DELETED:
        ok = put(o, "task_id", json_string(e->task_deleted.task_id));
        break;
    case EVENT_MASTER_ELECTED:
        ok = put(o, "node_id", json_string(e->master_elected.node_id));
        break;
    case EVENT_STATE_SNAPSHOT:
        ok = e->state_snapshot.state &&
             put(o, "state", cluster_state_to_jsonv(e->state_snapshot.state));
        break;
    case EVENT_INSTANCE_EPOCH_ADVANCED:
        ok = put(o, "instance_id", json_string(e->instance_epoch_advanced.instance_id)) &&
             put(o, "epoch", json_integer(e->instance_epoch_advanced.epoch));
        break;
    default:
        ok = false;
        break;
    }
    if (ok)
        return o;
fail:
    json_decref(o);
    return NULL;
}

char *event_to_json(const struct event *e)
{
    json_t *j = event_to_jsonv(e);
    if (!j)
        return NULL;
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return text;
}

/* ---- JSON in ---- */

/* Reads the fields of kind k from body (the event object without kind, term, index);
 * path is the kind's name. */
static int body_from_json(const json_t *body, const char *path, struct event *e, char *err,
                          size_t errlen)
{
    static const char *const node_keys[] = {"node_id", NULL};
    static const char *const gathered_keys[] = {"node_id", "when_ms", "info", NULL};
    static const char *const edge_keys[] = {"from", "to", NULL};
    static const char *const instance_keys[] = {"instance", NULL};
    static const char *const instance_id_keys[] = {"instance_id", NULL};
    static const char *const draft_keys[] = {"instance_id", "draft_model", "num_draft_tokens",
                                             NULL};
    static const char *const runner_id_keys[] = {"runner_id", NULL};
    static const char *const task_keys[] = {"task_id", "task_kind", "instance_id", "node_id",
                                            "bytes", NULL};
    static const char *const task_status_keys[] = {"task_id", "status", "error", NULL};
    static const char *const task_id_keys[] = {"task_id", NULL};
    static const char *const snapshot_keys[] = {"state", NULL};
    static const char *const epoch_keys[] = {"instance_id", "epoch", NULL};
    char p[JSON_PATH_MAX];
    json_t *v;
    int rc, x = 0;

    switch (e->kind) {
    case EVENT_NODE_GATHERED_INFO:
        rc = json_get_keys(body, path, gathered_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "node_id", e->node_gathered_info.node_id, err, errlen);
        if (!rc)
            rc = json_get_int(body, path, "when_ms", 0, IDS_COUNTER_MAX,
                              &e->node_gathered_info.when_ms, err, errlen);
        if (!rc)
            rc = json_get_member(body, path, "info", JSON_OBJECT, &v, err, errlen);
        if (!rc) {
            json_path(p, sizeof p, "%s.info", path);
            rc = cluster_node_info_from_json(v, p, &e->node_gathered_info.info, err, errlen);
        }
        return rc;
    case EVENT_NODE_TIMED_OUT:
        rc = json_get_keys(body, path, node_keys, err, errlen);
        return rc ? rc : ids_json_id(body, path, "node_id", e->node_timed_out.node_id, err, errlen);
    case EVENT_TOPOLOGY_EDGE_CREATED:
        return cluster_edge_from_json(body, path, &e->topology_edge_created, err, errlen);
    case EVENT_TOPOLOGY_EDGE_DELETED:
        rc = json_get_keys(body, path, edge_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "from", e->topology_edge_deleted.from, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "to", e->topology_edge_deleted.to, err, errlen);
        return rc;
    case EVENT_INSTANCE_CREATED:
        rc = json_get_keys(body, path, instance_keys, err, errlen);
        if (!rc)
            rc = json_get_member(body, path, "instance", JSON_OBJECT, &v, err, errlen);
        if (!rc) {
            json_path(p, sizeof p, "%s.instance", path);
            rc = cluster_instance_from_json(v, p, &e->instance_created, err, errlen);
        }
        return rc;
    case EVENT_INSTANCE_DELETED:
        rc = json_get_keys(body, path, instance_id_keys, err, errlen);
        return rc ? rc
                  : ids_json_id(body, path, "instance_id", e->instance_deleted.instance_id, err,
                                errlen);
    case EVENT_INSTANCE_DRAFT_MODEL_UPDATED: {
        int64_t n = 0;
        rc = json_get_keys(body, path, draft_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "instance_id",
                             e->instance_draft_model_updated.instance_id, err, errlen);
        if (!rc)
            rc = ids_json_model(body, path, "draft_model", true,
                                e->instance_draft_model_updated.draft_model, err, errlen);
        if (!rc)
            rc = json_get_int(body, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS, &n,
                              err, errlen);
        e->instance_draft_model_updated.num_draft_tokens = (int)n;
        return rc;
    }
    case EVENT_RUNNER_STATUS_UPDATED:
        return cluster_runner_from_json(body, path, &e->runner_status_updated, err, errlen);
    case EVENT_RUNNER_DELETED:
        rc = json_get_keys(body, path, runner_id_keys, err, errlen);
        return rc ? rc
                  : ids_json_id(body, path, "runner_id", e->runner_deleted.runner_id, err, errlen);
    case EVENT_NODE_DOWNLOAD_PROGRESS:
        return cluster_download_from_json(body, path, &e->node_download_progress, err, errlen);
    case EVENT_TASK_CREATED:
        rc = json_get_keys(body, path, task_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "task_id", e->task_created.task_id, err, errlen);
        if (!rc)
            rc = json_get_enum(body, path, "task_kind", cluster_task_kind_name,
                               CLUSTER_TASK_KIND_COUNT, &x, err, errlen);
        e->task_created.kind = (enum cluster_task_kind)x;
        if (!rc)
            rc = ids_json_id(body, path, "instance_id", e->task_created.instance_id, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "node_id", e->task_created.node_id, err, errlen);
        if (!rc)
            rc = json_get_int(body, path, "bytes", 1, (int64_t)CLUSTER_MAX_PARAMS, &e->task_created.bytes, err,
                              errlen);
        return rc;
    case EVENT_TASK_STATUS_UPDATED:
        rc = json_get_keys(body, path, task_status_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "task_id", e->task_status_updated.task_id, err, errlen);
        if (!rc)
            rc = json_get_enum(body, path, "status", cluster_task_status_name,
                               CLUSTER_TASK_STATUS_COUNT, &x, err, errlen);
        e->task_status_updated.status = (enum cluster_task_status)x;
        if (!rc)
            rc = json_get_text(body, path, "error", IDS_TEXT_MAX, &e->task_status_updated.error, err, errlen);
        if (!rc && e->task_status_updated.error && x != CLUSTER_TASK_FAILED)
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT,
                            "%s.error: must be null unless status is Failed", path);
        return rc;
    case EVENT_TASK_ACKNOWLEDGED:
    case EVENT_TASK_DELETED: {
        char *id = e->kind == EVENT_TASK_DELETED ? e->task_deleted.task_id
                                                 : e->task_acknowledged.task_id;
        rc = json_get_keys(body, path, task_id_keys, err, errlen);
        return rc ? rc : ids_json_id(body, path, "task_id", id, err, errlen);
    }
    case EVENT_MASTER_ELECTED:
        rc = json_get_keys(body, path, node_keys, err, errlen);
        return rc ? rc : ids_json_id(body, path, "node_id", e->master_elected.node_id, err, errlen);
    case EVENT_STATE_SNAPSHOT:
        rc = json_get_keys(body, path, snapshot_keys, err, errlen);
        if (!rc)
            rc = json_get_member(body, path, "state", JSON_OBJECT, &v, err, errlen);
        if (!rc) {
            rc = cluster_state_from_jsonv(v, &e->state_snapshot.state, err, errlen);
            if (rc && err && errlen) { /* root the state's own path under this event */
                char inner[512];
                snprintf(inner, sizeof inner, "%s", err);
                snprintf(err, errlen, "%s.%s", path, inner);
            }
        }
        return rc;
    case EVENT_INSTANCE_EPOCH_ADVANCED:
        rc = json_get_keys(body, path, epoch_keys, err, errlen);
        if (!rc)
            rc = ids_json_id(body, path, "instance_id", e->instance_epoch_advanced.instance_id,
                             err, errlen);
        if (!rc)
            rc = json_get_int(body, path, "epoch", 1, IDS_COUNTER_MAX,
                              &e->instance_epoch_advanced.epoch, err, errlen);
        return rc;
    default:
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: unknown kind", path);
    }
}

int event_from_jsonv(const json_t *j, struct event *out, char *err, size_t errlen)
{
    int kind = 0;
    memset(out, 0, sizeof *out);
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "event: must be an object");
    int rc = json_get_enum(j, "event", "kind", event_kind_name, EVENT_KIND_COUNT, &kind, err,
                           errlen);
    if (rc)
        return rc;
    const char *path = event_kind_name(kind);
    event_init(out, (enum event_kind)kind, 0, 0);
    rc = json_get_int(j, path, "term", 1, IDS_COUNTER_MAX, &out->term, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "index", 0, IDS_COUNTER_MAX, &out->index, err, errlen);
    if (rc) {
        event_clear(out);
        return rc;
    }
    /* The body readers refuse unknown keys, so they see the object without the three
     * keys every event has. */
    json_t *body = json_copy((json_t *)j);
    if (!body) {
        event_clear(out);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", path);
    }
    json_object_del(body, "kind");
    json_object_del(body, "term");
    json_object_del(body, "index");
    rc = body_from_json(body, path, out, err, errlen);
    json_decref(body);
    if (rc)
        event_clear(out);
    return rc;
}

int event_from_json(const char *text, size_t len, struct event *out, char *err, size_t errlen)
{
    json_error_t je;
    memset(out, 0, sizeof *out);
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "event: JSON line %d column %d: %s",
                          je.line, je.column, je.text);
    int rc = event_from_jsonv(j, out, err, errlen);
    json_decref(j);
    return rc;
}

int event_validate(const struct event *e, char *err, size_t errlen)
{
    json_t *j = event_to_jsonv(e);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "%s: cannot be encoded (unknown kind or enum, missing snapshot, text "
                          "that is not UTF-8, or out of memory)",
                          event_kind_name((int)e->kind) ? event_kind_name((int)e->kind) : "event");
    struct event back;
    int rc = event_from_jsonv(j, &back, err, errlen);
    json_decref(j);
    event_clear(&back);
    return rc;
}
