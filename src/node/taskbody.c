#include "node/taskbody.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/err.h"
#include "base/json.h"
#include "ctl/state.h"
#include "proto/ids.h"

struct body {
    char task_id[IDS_ID_MAX + 1];
    char from[IDS_ID_MAX + 1];
    json_t *params;
    size_t bytes;
    int64_t arrived_ms;
};

struct taskbody_store {
    pthread_mutex_t mu;
    struct body *v;
    size_t n, cap;
    size_t bytes; /* sum of v[i].bytes */
};

struct taskbody_store *taskbody_create(void)
{
    struct taskbody_store *s = calloc(1, sizeof *s);
    if (s)
        pthread_mutex_init(&s->mu, NULL);
    return s;
}

void taskbody_release(struct taskbody_store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        json_decref(s->v[i].params);
    free(s->v);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int taskbody_encode(const char *task_id, const json_t *params, char **out, size_t *len, int64_t *params_bytes,
                    char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    size_t n = json_dumpb(params, NULL, 0, JSON_COMPACT);
    if (n == 0 || n > CLUSTER_MAX_PARAMS)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "the request is %zu bytes of JSON, more than %zu", n,
                          CLUSTER_MAX_PARAMS);
    json_t *msg = json_pack("{s:s, s:O}", "task_id", task_id, "params", params);
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!text)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    *out = text;
    *len = strlen(text);
    *params_bytes = (int64_t)n;
    return 0;
}

static void drop_at(struct taskbody_store *s, size_t i)
{
    s->bytes -= s->v[i].bytes;
    json_decref(s->v[i].params);
    s->v[i] = s->v[--s->n];
}

static void expire(struct taskbody_store *s, int64_t now_ms)
{
    for (size_t i = s->n; i-- > 0;)
        if (now_ms - s->v[i].arrived_ms > TASKBODY_TTL_MS)
            drop_at(s, i);
}

/* The body of task_id from node `from`, or with from NULL from any node. Bodies are told
 * apart by sender too, so a peer that sends a body under another node's task id first
 * cannot keep the real one out. */
static struct body *find(struct taskbody_store *s, const char *task_id, const char *from)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].task_id, task_id) && (!from || !strcmp(s->v[i].from, from)))
            return &s->v[i];
    return NULL;
}

/* Reads {"task_id", "params"} into b (params a new reference). */
static int decode(const char *msg, size_t len, struct body *b, char *err, size_t errlen)
{
    static const char *const keys[] = {"task_id", "params", NULL};
    json_error_t je;
    json_t *j = json_loadb(msg, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "task body: not JSON (%s)", je.text);
    json_t *params = NULL;
    int rc = json_get_keys(j, "task body", keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, "task body", "task_id", b->task_id, err, errlen);
    if (!rc)
        rc = json_get_member(j, "task body", "params", JSON_OBJECT, &params, err, errlen);
    if (!rc) {
        b->bytes = json_dumpb(params, NULL, 0, JSON_COMPACT);
        if (b->bytes == 0 || b->bytes > CLUSTER_MAX_PARAMS)
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "task body: params of %zu bytes, more than %zu", b->bytes,
                            CLUSTER_MAX_PARAMS);
    }
    if (!rc)
        b->params = json_incref(params);
    json_decref(j);
    return rc;
}

int taskbody_put(struct taskbody_store *s, const char *from, const char *msg, size_t len, int64_t now_ms,
                 char *err, size_t errlen)
{
    struct body b = {.arrived_ms = now_ms};
    if (len > CLUSTER_MAX_PARAMS + 2 * IDS_ID_MAX + 64)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "task body: %zu bytes, more than a body can be", len);
    int rc = decode(msg, len, &b, err, errlen);
    if (rc)
        return rc;
    snprintf(b.from, sizeof b.from, "%s", from);
    pthread_mutex_lock(&s->mu);
    expire(s, now_ms);
    if (find(s, b.task_id, from))
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "task body: task %s already has one from %s", b.task_id, from);
    else if (s->n >= TASKBODY_MAX || s->bytes + b.bytes > TASKBODY_MAX_BYTES)
        rc = cairn_fail(err, errlen, CAIRN_EFULL, "task body: %zu bodies (%zu bytes) wait already", s->n, s->bytes);
    if (!rc && array_reserve(&s->v, &s->cap, s->n + 1, sizeof *s->v, 16))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (!rc) {
        s->v[s->n++] = b;
        s->bytes += b.bytes;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        json_decref(b.params);
    return rc;
}

int taskbody_take(struct taskbody_store *s, const char *task_id, const char *requester, json_t **params,
                  char *err, size_t errlen)
{
    *params = NULL;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    struct body *b = find(s, task_id, requester);
    struct body *other = b ? NULL : find(s, task_id, NULL);
    if (other) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "a body of task %s came from node %s, not from its requester %s",
                        task_id, other->from, requester);
        drop_at(s, (size_t)(other - s->v));
    } else if (!b) {
        rc = CAIRN_ENOTFOUND;
    } else {
        *params = json_incref(b->params);
        drop_at(s, (size_t)(b - s->v));
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

size_t taskbody_count(struct taskbody_store *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}
