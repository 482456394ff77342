/* cluster_apply: the only code that changes a cluster state (see event.h for the rules).
 * Each handler prepares everything that can fail before it changes anything, so a
 * refused event leaves the state as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "ctl/event.h"

/* The state's own tables are writable here; the finders hand out const pointers for
 * everyone else. */
static struct cluster_instance *instance_mut(struct cluster_state *s, const char *id)
{
    return (struct cluster_instance *)cluster_state_find_instance(s, id);
}

static struct cluster_task *task_mut(struct cluster_state *s, const char *id)
{
    return (struct cluster_task *)cluster_state_find_task(s, id);
}

static int oom(const char *what, char *err, size_t errlen)
{
    return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", what);
}

static bool instance_on_node(const struct cluster_state *s, const char *instance_id,
                             const char *node_id)
{
    const struct cluster_instance *in = cluster_state_find_instance(s, instance_id);
    for (size_t i = 0; in && i < in->n_shards; i++)
        if (strcmp(in->shards[i].node_id, node_id) == 0)
            return true;
    return false;
}

static int node_gathered_info(struct cluster_state *s, const struct event *e, char *err,
                              size_t errlen)
{
    struct cluster_node n;
    memset(&n, 0, sizeof n);
    memcpy(n.id, e->node_gathered_info.node_id, sizeof n.id);
    n.last_seen_ms = e->node_gathered_info.when_ms;
    if (cluster_node_info_copy(&n.info, &e->node_gathered_info.info))
        return oom("NodeGatheredInfo", err, errlen);
    if (cluster_state_put_node(s, &n)) {
        cluster_node_info_clear(&n.info);
        return oom("NodeGatheredInfo", err, errlen);
    }
    return 0;
}

static int node_timed_out(struct cluster_state *s, const struct event *e, char *err,
                          size_t errlen)
{
    char node[IDS_ID_MAX + 1];
    memcpy(node, e->node_timed_out.node_id, sizeof node);

    /* The only allocations: the error texts of the tasks that fail. */
    char **why = s->n_tasks ? calloc(s->n_tasks, sizeof *why) : NULL;
    if (s->n_tasks && !why)
        return oom("NodeTimedOut", err, errlen);
    for (size_t i = 0; i < s->n_tasks; i++) {
        const struct cluster_task *t = &s->tasks[i];
        if ((t->status != CLUSTER_TASK_PENDING && t->status != CLUSTER_TASK_RUNNING) ||
            !instance_on_node(s, t->instance_id, node))
            continue;
        size_t len = strlen(node) + 32;
        why[i] = malloc(len);
        if (!why[i]) {
            for (size_t k = 0; k < i; k++)
                free(why[k]);
            free(why);
            return oom("NodeTimedOut", err, errlen);
        }
        snprintf(why[i], len, "node %s timed out", node);
    }

    for (size_t i = 0; i < s->n_tasks; i++) {
        if (!why[i])
            continue;
        free(s->tasks[i].error);
        s->tasks[i].error = why[i];
        s->tasks[i].status = CLUSTER_TASK_FAILED;
    }
    free(why);

    /* Backwards, so deleting entry i leaves the entries still to visit in place. */
    for (size_t i = s->n_runners; i-- > 0;) {
        const struct cluster_runner *r = &s->runners[i];
        if (strcmp(r->node_id, node) == 0 || instance_on_node(s, r->instance_id, node)) {
            char id[IDS_ID_MAX + 1];
            memcpy(id, r->id, sizeof id);
            cluster_state_del_runner(s, id);
        }
    }
    for (size_t i = s->n_instances; i-- > 0;) {
        if (instance_on_node(s, s->instances[i].id, node)) {
            char id[IDS_ID_MAX + 1];
            memcpy(id, s->instances[i].id, sizeof id);
            cluster_state_del_instance(s, id);
        }
    }
    for (size_t i = s->n_edges; i-- > 0;) {
        const struct cluster_edge *x = &s->edges[i];
        if (strcmp(x->from, node) == 0 || strcmp(x->to, node) == 0) {
            char from[IDS_ID_MAX + 1], to[IDS_ID_MAX + 1];
            memcpy(from, x->from, sizeof from);
            memcpy(to, x->to, sizeof to);
            cluster_state_del_edge(s, from, to);
        }
    }
    for (size_t i = s->n_downloads; i-- > 0;) {
        const struct cluster_download *d = &s->downloads[i];
        if (strcmp(d->node_id, node) == 0) {
            char model[IDS_MODEL_MAX + 1];
            memcpy(model, d->model_id, sizeof model);
            cluster_state_del_download(s, node, model);
        }
    }
    cluster_state_del_node(s, node);
    return 0;
}

static int instance_created(struct cluster_state *s, const struct event *e, char *err,
                            size_t errlen)
{
    struct cluster_instance in;
    if (cluster_instance_copy(&in, &e->instance_created))
        return oom("InstanceCreated", err, errlen);
    if (cluster_state_put_instance(s, &in)) {
        cluster_instance_clear(&in);
        return oom("InstanceCreated", err, errlen);
    }
    return 0;
}

static int draft_model_updated(struct cluster_state *s, const struct event *e)
{
    struct cluster_instance *in = instance_mut(s, e->instance_draft_model_updated.instance_id);
    if (in) {
        memcpy(in->draft_model, e->instance_draft_model_updated.draft_model,
               sizeof in->draft_model);
        in->num_draft_tokens = e->instance_draft_model_updated.num_draft_tokens;
    }
    return 0;
}

static int runner_status_updated(struct cluster_state *s, const struct event *e, char *err,
                                 size_t errlen)
{
    const struct cluster_runner *src = &e->runner_status_updated;
    if (src->status == CLUSTER_RUNNER_SHUTDOWN) {
        cluster_state_del_runner(s, src->id);
        return 0;
    }
    struct cluster_runner r;
    if (cluster_runner_copy(&r, src))
        return oom("RunnerStatusUpdated", err, errlen);
    if (r.status != CLUSTER_RUNNER_FAILED) { /* an error describes a failure only */
        free(r.error);
        r.error = NULL;
    }
    if (cluster_state_put_runner(s, &r)) {
        cluster_runner_clear(&r);
        return oom("RunnerStatusUpdated", err, errlen);
    }
    return 0;
}

static int download_progress(struct cluster_state *s, const struct event *e, char *err,
                             size_t errlen)
{
    struct cluster_download d;
    if (cluster_download_copy(&d, &e->node_download_progress))
        return oom("NodeDownloadProgress", err, errlen);
    if (cluster_state_put_download(s, &d)) {
        cluster_download_clear(&d);
        return oom("NodeDownloadProgress", err, errlen);
    }
    return 0;
}

static int task_created(struct cluster_state *s, const struct event *e, char *err, size_t errlen)
{
    struct cluster_task t;
    memset(&t, 0, sizeof t);
    memcpy(t.id, e->task_created.task_id, sizeof t.id);
    t.kind = e->task_created.kind;
    memcpy(t.instance_id, e->task_created.instance_id, sizeof t.instance_id);
    memcpy(t.node_id, e->task_created.node_id, sizeof t.node_id);
    t.status = CLUSTER_TASK_PENDING;
    t.bytes = e->task_created.bytes;
    if (cluster_state_put_task(s, &t)) {
        cluster_task_clear(&t);
        return oom("TaskCreated", err, errlen);
    }
    return 0;
}

static int task_status_updated(struct cluster_state *s, const struct event *e, char *err,
                               size_t errlen)
{
    struct cluster_task *t = task_mut(s, e->task_status_updated.task_id);
    if (!t)
        return 0;
    char *error = NULL;
    if (e->task_status_updated.status == CLUSTER_TASK_FAILED && e->task_status_updated.error) {
        error = strdup(e->task_status_updated.error);
        if (!error)
            return oom("TaskStatusUpdated", err, errlen);
    }
    free(t->error);
    t->error = error;
    t->status = e->task_status_updated.status;
    return 0;
}

static int snapshot(struct cluster_state *s, const struct event *e, char *err, size_t errlen)
{
    if (!e->state_snapshot.state)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "StateSnapshot: no state");
    struct cluster_state *c = cluster_state_copy(e->state_snapshot.state);
    if (!c)
        return oom("StateSnapshot", err, errlen);
    cluster_state_move(s, c);
    return 0;
}

static int apply_body(struct cluster_state *s, const struct event *e, char *err, size_t errlen)
{
    switch (e->kind) {
    case EVENT_NODE_GATHERED_INFO:
        return node_gathered_info(s, e, err, errlen);
    case EVENT_NODE_TIMED_OUT:
        return node_timed_out(s, e, err, errlen);
    case EVENT_TOPOLOGY_EDGE_CREATED: {
        struct cluster_edge x = e->topology_edge_created;
        return cluster_state_put_edge(s, &x) ? oom("TopologyEdgeCreated", err, errlen) : 0;
    }
    case EVENT_TOPOLOGY_EDGE_DELETED:
        cluster_state_del_edge(s, e->topology_edge_deleted.from, e->topology_edge_deleted.to);
        return 0;
    case EVENT_INSTANCE_CREATED:
        return instance_created(s, e, err, errlen);
    case EVENT_INSTANCE_DELETED:
        cluster_state_del_instance(s, e->instance_deleted.instance_id);
        return 0;
    case EVENT_INSTANCE_DRAFT_MODEL_UPDATED:
        return draft_model_updated(s, e);
    case EVENT_RUNNER_STATUS_UPDATED:
        return runner_status_updated(s, e, err, errlen);
    case EVENT_RUNNER_DELETED:
        cluster_state_del_runner(s, e->runner_deleted.runner_id);
        return 0;
    case EVENT_NODE_DOWNLOAD_PROGRESS:
        return download_progress(s, e, err, errlen);
    case EVENT_TASK_CREATED:
        return task_created(s, e, err, errlen);
    case EVENT_TASK_STATUS_UPDATED:
        return task_status_updated(s, e, err, errlen);
    case EVENT_TASK_ACKNOWLEDGED: {
        struct cluster_task *t = task_mut(s, e->task_acknowledged.task_id);
        if (t)
            t->acknowledged = true;
        return 0;
    }
    case EVENT_TASK_DELETED:
        cluster_state_del_task(s, e->task_deleted.task_id);
        return 0;
    case EVENT_MASTER_ELECTED:
        memcpy(s->master_node_id, e->master_elected.node_id, sizeof s->master_node_id);
        s->master_term = e->term;
        return 0;
    case EVENT_STATE_SNAPSHOT:
        return snapshot(s, e, err, errlen);
    case EVENT_INSTANCE_EPOCH_ADVANCED: {
        struct cluster_instance *in = instance_mut(s, e->instance_epoch_advanced.instance_id);
        if (in && e->instance_epoch_advanced.epoch > in->epoch)
            in->epoch = e->instance_epoch_advanced.epoch;
        return 0;
    }
    default:
        return cairn_fail(err, errlen, CAIRN_EINVAL, "event: unknown kind %d", (int)e->kind);
    }
}

int cluster_apply(struct cluster_state *s, const struct event *e, char *err, size_t errlen)
{
    const char *name = event_kind_name((int)e->kind);
    if (!name)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "event: unknown kind %d", (int)e->kind);
    long long term = e->term, index = e->index;
    long long at_term = s->last_term, at_index = s->last_index;
    if (term < 1 || index < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "%s (%lld, %lld): term must be >= 1 and index >= 0", name, term, index);
    if (term < at_term)
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "%s (%lld, %lld): stale term, state is at (%lld, %lld)", name, term,
                          index, at_term, at_index);
    if (e->kind == EVENT_STATE_SNAPSHOT) {
        if (term == at_term && index <= at_index)
            return cairn_fail(err, errlen, CAIRN_ESTATE,
                              "%s (%lld, %lld): not after the state's position (%lld, %lld)",
                              name, term, index, at_term, at_index);
    } else if (term > at_term) {
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "%s (%lld, %lld): term %lld must start with a StateSnapshot (state is "
                          "at (%lld, %lld))",
                          name, term, index, term, at_term, at_index);
    } else if (index != at_index + 1) {
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "%s (%lld, %lld): expected index %lld in term %lld (%s)", name, term,
                          index, at_index + 1, at_term,
                          index > at_index ? "gap" : "already applied");
    }
    int rc = apply_body(s, e, err, errlen);
    if (rc)
        return rc;
    s->last_term = e->term;
    s->last_index = e->index;
    return 0;
}
