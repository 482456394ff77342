/* This node's copy of the cluster state (node_int.h): its event log (replayed at start,
 * started again from a snapshot after a gap), applying events, and a follower's catching
 * up with its master. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "node/node_int.h"

#define REQUEST_RETRY_MS 500

/* ---- the log ---- */

/* JSON text of a snapshot event of the current state at its position (malloc'd). */
char *node_snapshot_json(struct node *n, int64_t term, int64_t index)
{
    struct event e;
    event_init(&e, EVENT_STATE_SNAPSHOT, term, index);
    e.state_snapshot.state = n->state; /* borrowed */
    char *text = event_to_json(&e);
    e.state_snapshot.state = NULL;
    return text;
}

/* Starts this node's log copy again from a snapshot of its state: after a gap, a
 * conflicting term, or a file that cannot be used. */
static void log_reset(struct node *n, const char *why)
{
    char err[512], path[4200];
    log_info("node %s: event log starts again from a snapshot (%s)", n->id, why);
    eventlog_close(n->log);
    n->log = NULL;
    unlink(n->log_path);
    snprintf(path, sizeof path, "%s-wal", n->log_path);
    unlink(path);
    snprintf(path, sizeof path, "%s-shm", n->log_path);
    unlink(path);
    if (eventlog_open(&n->log, n->log_path, err, sizeof err)) {
        log_error("node %s: event log: %s", n->id, err);
        return;
    }
    n->since_snapshot = 0;
    if (n->state->last_term < 1)
        return;
    char *text = node_snapshot_json(n, n->state->last_term, n->state->last_index);
    if (!text || eventlog_append(n->log, n->state->last_term, n->state->last_index,
                                 EVENTLOG_SNAPSHOT_KIND, text, strlen(text), err, sizeof err))
        log_error("node %s: event log snapshot: %s", n->id, text ? err : "out of memory");
    free(text);
}

static void log_append(struct node *n, const struct event *e, const char *json)
{
    char err[512];
    if (!n->log) {
        log_reset(n, "no log open");
        return;
    }
    int rc = eventlog_append(n->log, e->term, e->index, event_kind_name((int)e->kind), json,
                             strlen(json), err, sizeof err);
    if (rc == CAIRN_ESTATE) {
        log_reset(n, err);
        return;
    }
    if (rc) {
        log_error("node %s: event log append: %s", n->id, err);
        return;
    }
    if (e->kind == EVENT_STATE_SNAPSHOT) {
        n->since_snapshot = 0;
        int64_t removed = 0;
        if (eventlog_compact(n->log, &removed, err, sizeof err))
            log_warn("node %s: event log compaction: %s", n->id, err);
        else if (removed)
            log_debug("node %s: event log compacted (%lld events)", n->id, (long long)removed);
    } else {
        n->since_snapshot++;
    }
}

struct replay {
    struct cluster_state *s;
    int64_t n;
    bool broken;
    char err[512];
};

static int replay_one(void *ctx, const struct eventlog_event *ev)
{
    struct replay *r = ctx;
    struct event e;
    int rc = event_from_json(ev->json ? ev->json : "", ev->len, &e, r->err, sizeof r->err);
    if (!rc)
        rc = cluster_apply(r->s, &e, r->err, sizeof r->err);
    event_clear(&e);
    if (rc) {
        r->broken = true;
        return 1;
    }
    r->n++;
    return 0;
}

/* Opens the log (a file that is not a log is moved aside) and replays it. */
int node_log_open(struct node *n, char *err, size_t errlen)
{
    int rc = eventlog_open(&n->log, n->log_path, err, errlen);
    if (rc == CAIRN_EFORMAT || rc == CAIRN_EUNSUPPORTED) {
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.bad-%lld", n->log_path, (long long)wall_ms());
        log_warn("node %s: %s: moved to %s", n->id, err, aside);
        if (rename(n->log_path, aside) != 0)
            return cairn_fail(err, errlen, CAIRN_EIO, "rename %s: %s", n->log_path, strerror(errno));
        rc = eventlog_open(&n->log, n->log_path, err, errlen);
    }
    if (rc)
        return rc;
    struct replay r = {.s = n->state};
    int reset = 0;
    rc = eventlog_read_since(n->log, 0, 0, replay_one, &r, 0, &reset, err, errlen);
    if (rc || r.broken) {
        log_warn("node %s: event log replay stopped after %lld events: %s", n->id,
                 (long long)r.n, rc ? err : r.err);
        log_reset(n, "replay stopped");
    } else if (r.n) {
        log_info("node %s: replayed %lld events, at (%lld, %lld)", n->id, (long long)r.n,
                 (long long)n->state->last_term, (long long)n->state->last_index);
    }
    return 0;
}

/* ---- applying events ---- */

bool node_pos_reached(const struct cluster_state *s, int64_t term, int64_t index)
{
    return s->last_term > term || (s->last_term == term && s->last_index >= index);
}

/* Applies e (JSON text json) to the state, logs it and tells the subscribers. */
int node_take_event(struct node *n, const struct event *e, const char *json)
{
    char err[512];
    pthread_mutex_lock(&n->mu);
    int rc = cluster_apply(n->state, e, err, sizeof err);
    pthread_mutex_unlock(&n->mu);
    if (rc) {
        log_debug("node %s: %s (%lld, %lld) not applied: %s", n->id, event_kind_name((int)e->kind),
                  (long long)e->term, (long long)e->index, err);
        return rc;
    }
    log_append(n, e, json);
    node_notify(n, json, e->term, e->index);
    return 0;
}

void node_request_events(struct node *n, bool full, int64_t now)
{
    const char *m = node_current_master(n);
    if (!m[0] || !strcmp(m, n->id))
        return;
    if (!full && now - n->last_request_ms < REQUEST_RETRY_MS)
        return;
    n->last_request_ms = now;
    node_send_json(n, m, LINK_T_EVENT_REQUEST,
              json_pack("{s:I, s:I, s:b}", "term", (json_int_t)n->state->last_term, "index",
                        (json_int_t)n->state->last_index, "full", full));
}

/* ---- followers ---- */

void node_on_event(struct node *n, const char *from, const char *data, size_t len,
                     int64_t now)
{
    struct event e;
    char err[512];
    int rc = event_from_json(data, len, &e, err, sizeof err);
    if (rc) {
        if (rc == CAIRN_EFORMAT)
            node_strike(n, from, "malformed event", err);
        else
            log_warn("node %s: event from %s: %s", n->id, from, err);
        return;
    }
    election_claim(n->el, from, e.term, now);
    if (election_role(n->el) != ELECTION_FOLLOWER || !election_confirmed(n->el) ||
        strcmp(election_master(n->el), from)) {
        event_clear(&e);
        return;
    }
    const struct cluster_state *s = n->state;
    bool stale = e.term < s->last_term || (e.term == s->last_term && e.index <= s->last_index);
    if (!stale) {
        /* Encoded again from the checked event: the log and subscribers get canonical text. */
        char *json = event_to_json(&e);
        rc = json ? node_take_event(n, &e, json) : CAIRN_ENOMEM;
        free(json);
        if (rc == CAIRN_ESTATE || rc == CAIRN_EINVAL)
            node_request_events(n, false, now);
        else if (rc == 0)
            node_wake_pendings(n);
    }
    event_clear(&e);
}

void node_on_snapshot(struct node *n, const char *from, const char *data, size_t len)
{
    struct cluster_state *s = NULL;
    char err[512];
    if (strcmp(node_current_master(n), from))
        return;
    int rc = cluster_state_from_json(data, len, &s, err, sizeof err);
    if (rc) {
        if (rc == CAIRN_EFORMAT)
            node_strike(n, from, "malformed snapshot", err);
        else
            log_warn("node %s: snapshot from %s: %s", n->id, from, err);
        return;
    }
    /* An older answer that crossed newer events on another connection. */
    if (s->last_term == n->state->last_term && s->last_index < n->state->last_index &&
        !strcmp(s->master_node_id, n->state->master_node_id)) {
        cluster_state_release(s);
        return;
    }
    pthread_mutex_lock(&n->mu);
    cluster_state_move(n->state, s);
    pthread_mutex_unlock(&n->mu);
    log_info("node %s: took a snapshot from %s at (%lld, %lld)", n->id, from,
             (long long)n->state->last_term, (long long)n->state->last_index);
    log_reset(n, "snapshot from the master");
    char *json = node_snapshot_json(n, n->state->last_term, n->state->last_index);
    if (json)
        node_notify(n, json, n->state->last_term, n->state->last_index);
    free(json);
    node_wake_pendings(n);
}

/* Catches up with the master we follow when our state has not reached its term: all of
 * it when our state knows another master in that term (events under the same numbers
 * may differ) or a newer term. */
void node_check_sync(struct node *n, int64_t now)
{
    if (!n->sync_at || now < n->sync_at)
        return;
    n->sync_at = 0;
    const char *m = election_master(n->el);
    int64_t term = election_term(n->el);
    const struct cluster_state *s = n->state;
    bool full = s->last_term > term || (s->last_term == term && strcmp(s->master_node_id, m));
    if (full || !node_pos_reached(s, term, 1))
        node_request_events(n, full, now);
}

/* ---- readers on other threads ---- */

struct read_events {
    node_log_fn fn;
    void *ctx;
};

static int read_one(void *ctx, const struct eventlog_event *ev)
{
    struct read_events *r = ctx;
    return r->fn(r->ctx, ev->json ? ev->json : "", ev->len);
}

int node_read_events(struct node *n, int64_t term, int64_t index, size_t max, node_log_fn fn, void *ctx,
                     int *reset, char *err, size_t errlen)
{
    struct eventlog *log = NULL;
    int rc = eventlog_open(&log, n->log_path, err, errlen);
    struct read_events r = {fn, ctx};
    if (!rc)
        rc = eventlog_read_since(log, term, index, read_one, &r, max, reset, err, errlen);
    eventlog_close(log);
    return rc;
}
