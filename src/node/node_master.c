/* The node as master (node_int.h): the events it makes, the event requests it serves,
 * timeouts of nodes, the start of its terms and its head announcements; and the commands
 * of this node's API, run here when master or sent to the master. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "node/node_int.h"

/* ---- events the master makes ---- */

/* Master: numbers, applies, logs and broadcasts each event. */
void node_emit(struct node *n, struct master_events *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        struct event *e = &evs->ev[i];
        e->term = n->state->last_term;
        e->index = n->state->last_index + 1;
        char *json = event_to_json(e);
        if (!json) {
            log_error("node %s: cannot encode %s", n->id, event_kind_name((int)e->kind));
            continue;
        }
        if (node_take_event(n, e, json) == 0)
            link_send(n->link, NULL, LINK_T_EVENT, json, strlen(json));
        free(json);
    }
    if (n->since_snapshot >= NODE_COMPACT_EVERY) {
        struct event e;
        event_init(&e, EVENT_STATE_SNAPSHOT, n->state->last_term, n->state->last_index + 1);
        char *json = node_snapshot_json(n, e.term, e.index);
        struct cluster_state *copy = cluster_state_copy(n->state);
        e.state_snapshot.state = copy;
        if (json && copy && node_take_event(n, &e, json) == 0)
            link_send(n->link, NULL, LINK_T_EVENT, json, strlen(json));
        free(json);
        event_clear(&e);
    }
    /* Pendings waiting for these positions settle in node_run_pendings (this may run with
     * pend_mu held). */
}

static void emit_one(struct node *n, struct event *e)
{
    struct master_events evs = {.ev = e, .n = 1, .cap = 1};
    node_emit(n, &evs);
}

/* ---- master duties ---- */

static void send_snapshot(struct node *n, const char *to)
{
    char *text = cluster_state_to_json(n->state);
    if (text)
        link_send(n->link, to, LINK_T_SNAPSHOT, text, strlen(text));
    free(text);
}

struct serve {
    struct node *n;
    const char *to;
    int64_t sent;
};

static int serve_one(void *ctx, const struct eventlog_event *ev)
{
    struct serve *s = ctx;
    if (link_send(s->n->link, s->to, LINK_T_EVENT, ev->json, ev->len) < 0)
        return 1;
    s->sent++;
    return 0;
}

void node_serve_request(struct node *n, const char *from, const json_t *j)
{
    static const char *const keys[] = {"term", "index", "full", NULL};
    char err[256];
    int64_t term, index;
    bool full;
    if (json_get_keys(j, "request", keys, err, sizeof err) ||
        json_get_int(j, "request", "term", 0, IDS_COUNTER_MAX, &term, err, sizeof err) ||
        json_get_int(j, "request", "index", 0, IDS_COUNTER_MAX, &index, err, sizeof err) ||
        json_get_bool(j, "request", "full", &full, err, sizeof err)) {
        node_strike(n, from, "bad event request", err);
        return;
    }
    if (full || !n->log || node_pos_reached(n->state, term, index) == false) {
        /* asked for everything, or it holds a position we never reached */
        send_snapshot(n, from);
        return;
    }
    struct serve s = {.n = n, .to = from};
    int reset = 0;
    int rc = eventlog_read_since(n->log, term, index, serve_one, &s, NODE_REQUEST_BATCH, &reset,
                                 err, sizeof err);
    if (rc) {
        log_debug("node %s: log since (%lld, %lld) for %s: %s; sending a snapshot", n->id,
                  (long long)term, (long long)index, from, err);
        send_snapshot(n, from);
    }
}

struct heard *node_heard_find(struct node *n, const char *id, bool create, int64_t now)
{
    for (size_t i = 0; i < n->n_heard; i++)
        if (!strcmp(n->heard[i].id, id))
            return &n->heard[i];
    if (!create)
        return NULL;
    if (array_reserve(&n->heard, &n->cap_heard, n->n_heard + 1, sizeof *n->heard, 16))
        return NULL;
    struct heard *h = &n->heard[n->n_heard++];
    snprintf(h->id, sizeof h->id, "%s", id);
    h->ms = now;
    return h;
}

static void heard_drop(struct node *n, const char *id)
{
    for (size_t i = 0; i < n->n_heard; i++) {
        if (!strcmp(n->heard[i].id, id)) {
            n->heard[i] = n->heard[--n->n_heard];
            return;
        }
    }
}

/* What a PlaceInstance needs to place an instance again. */
struct replacement {
    char model_id[IDS_MODEL_MAX + 1], draft_model[IDS_MODEL_MAX + 1];
    enum cluster_sharding sharding;
    int num_draft_tokens;
    struct cluster_kv kv; /* its types; the context is chosen again for the nodes left */
};

/* The instances with a shard on node_id (at most max); *n_out of them. */
static struct replacement *instances_on(const struct cluster_state *s, const char *node_id, size_t *n_out)
{
    struct replacement *r = calloc(s->n_instances ? s->n_instances : 1, sizeof *r);
    *n_out = 0;
    for (size_t i = 0; r && i < s->n_instances; i++) {
        const struct cluster_instance *in = &s->instances[i];
        bool on = false;
        for (size_t k = 0; k < in->n_shards && !on; k++)
            on = !strcmp(in->shards[k].node_id, node_id);
        if (!on)
            continue;
        struct replacement *x = &r[(*n_out)++];
        memcpy(x->model_id, in->model_id, sizeof x->model_id);
        memcpy(x->draft_model, in->draft_model, sizeof x->draft_model);
        x->sharding = in->sharding;
        x->num_draft_tokens = in->num_draft_tokens;
        x->kv = in->kv;
        x->kv.ctx_len = 0;
    }
    return r;
}

/* Places again the instances a timed-out node took down, on the nodes left, where they
 * fit (issue 7: the cluster keeps serving when a machine drops out). */
static void place_again(struct node *n, const struct replacement *r, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        struct command c;
        struct command_result res;
        command_init(&c, COMMAND_PLACE_INSTANCE);
        memcpy(c.place_instance.model_id, r[i].model_id, sizeof c.place_instance.model_id);
        memcpy(c.place_instance.draft_model, r[i].draft_model, sizeof c.place_instance.draft_model);
        c.place_instance.sharding = r[i].sharding;
        c.place_instance.min_nodes = 1;
        c.place_instance.num_draft_tokens = r[i].num_draft_tokens;
        c.place_instance.kv = r[i].kv;
        struct master_events evs = {0};
        if (master_command(n->state, &n->env, &c, &evs, &res) == 0) {
            node_emit(n, &evs);
            log_info("node %s: model %s placed again as instance %s", n->id, r[i].model_id, res.instance_id);
        } else {
            log_warn("node %s: model %s cannot be placed again: %s", n->id, r[i].model_id, res.message);
        }
        master_events_clear(&evs);
        command_clear(&c);
    }
}

/* Times out the nodes of the state that said they leave or were unheard for
 * node_timeout_ms, and places their instances again. */
static void check_timeouts(struct node *n, int64_t now)
{
    for (size_t i = 0; i < n->state->n_nodes; i++) {
        const char *id = n->state->nodes[i].id;
        if (!strcmp(id, n->id))
            continue;
        struct heard *h = node_heard_find(n, id, true, now);
        if (!h)
            continue;
        bool left = node_left_index(n, id) >= 0;
        if (!left && link_peer_up(n->link, id)) {
            h->ms = now;
            continue;
        }
        if (!left && now - h->ms < n->node_timeout_ms)
            continue;
        if (left)
            log_info("node %s: node %s left the cluster", n->id, id);
        else
            log_info("node %s: node %s unheard for %lld ms: timed out", n->id, id, (long long)(now - h->ms));
        node_note_left(n, id, false);
        struct event e;
        event_init(&e, EVENT_NODE_TIMED_OUT, 0, 0);
        snprintf(e.node_timed_out.node_id, sizeof e.node_timed_out.node_id, "%s", id);
        heard_drop(n, id);
        size_t n_lost = 0;
        struct replacement *lost = instances_on(n->state, id, &n_lost);
        emit_one(n, &e);
        if (lost)
            place_again(n, lost, n_lost);
        free(lost);
        i = (size_t)-1; /* the table changed: start over */
    }
}

void node_master_tick(struct node *n, int64_t now)
{
    if (now >= n->next_timeout_ms) {
        n->next_timeout_ms = now + 1000;
        check_timeouts(n, now);
    }
    if (now >= n->next_head_ms) {
        n->next_head_ms = now + NODE_HEAD_INTERVAL_MS;
        node_send_json(n, NULL, NODE_T_CONTROL,
                       json_pack("{s:s, s:I, s:I}", "type", "head", "term", (json_int_t)n->state->last_term,
                                 "index", (json_int_t)n->state->last_index));
    }
}

/* Becomes master of term: a snapshot of our own state, then MasterElected. */
void node_start_term(struct node *n, int64_t term, int64_t now)
{
    if (term <= n->state->last_term) {
        log_error("node %s: cannot start term %lld behind the state's %lld", n->id,
                  (long long)term, (long long)n->state->last_term);
        return;
    }
    struct event e;
    event_init(&e, EVENT_STATE_SNAPSHOT, term, 0);
    e.state_snapshot.state = cluster_state_copy(n->state);
    char *json = e.state_snapshot.state ? event_to_json(&e) : NULL;
    if (!json || node_take_event(n, &e, json)) {
        log_error("node %s: cannot start term %lld", n->id, (long long)term);
        free(json);
        event_clear(&e);
        return;
    }
    link_send(n->link, NULL, LINK_T_EVENT, json, strlen(json));
    free(json);
    event_clear(&e);
    event_init(&e, EVENT_MASTER_ELECTED, 0, 0);
    snprintf(e.master_elected.node_id, sizeof e.master_elected.node_id, "%s", n->id);
    emit_one(n, &e);
    n->master_term = term;
    n->n_heard = 0;
    for (size_t i = 0; i < n->state->n_nodes; i++)
        node_heard_find(n, n->state->nodes[i].id, true, now);
    n->report_due = true;
    n->last_report_ms = 0;
    log_info("node %s: master of term %lld at (%lld, %lld)", n->id, (long long)term,
             (long long)n->state->last_term, (long long)n->state->last_index);
}

/* Task commands come with every request: their lines would drown the log. */
static enum log_level command_log_level(const struct command *c)
{
    return c->kind == COMMAND_TEXT_GENERATION || c->kind == COMMAND_CANCEL_TASK || c->kind == COMMAND_FINISH_TASK
               ? LOG_DEBUG
               : LOG_INFO;
}

/* A command from another node (we are master, or we answer that we are not). */
void node_run_remote_command(struct node *n, const char *from, const char *data, size_t len)
{
    struct command c;
    struct command_result res;
    memset(&res, 0, sizeof res);
    char err[512];
    int rc = command_from_json(data, len, &c, err, sizeof err);
    if (rc == CAIRN_ENOMEM) {
        log_warn("node %s: command from %s: %s", n->id, from, err);
        return;
    }
    if (rc) {
        json_t *j = json_loadb(data, len, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "command_id"));
        if (id && ids_valid_id(id)) {
            snprintf(res.command_id, sizeof res.command_id, "%s", id);
            res.code = CAIRN_EFORMAT;
            snprintf(res.message, sizeof res.message, "%s", err);
            node_send_json(n, from, NODE_T_COMMAND_RESULT, command_result_to_jsonv(&res));
        }
        json_decref(j);
        node_strike(n, from, "bad command", err);
        return;
    }
    if (c.kind == COMMAND_TEXT_GENERATION && strcmp(c.text_generation.node_id, from)) {
        /* A node asks for its own requests only: the outputs go to node_id. */
        snprintf(res.command_id, sizeof res.command_id, "%s", c.id);
        res.code = CAIRN_EINVAL;
        snprintf(res.message, sizeof res.message, "a TextGeneration from node %s names node %s as its requester", from,
                 c.text_generation.node_id);
        node_strike(n, from, "bad command", "a TextGeneration naming another node as its requester");
    } else if (!node_is_master(n)) {
        snprintf(res.command_id, sizeof res.command_id, "%s", c.id);
        res.code = CAIRN_EIO;
        snprintf(res.message, sizeof res.message, "node %s is not the master", n->id);
    } else {
        struct master_events evs = {0};
        if (master_command(n->state, &n->env, &c, &evs, &res) == 0)
            node_emit(n, &evs);
        master_events_clear(&evs);
        res.term = n->state->last_term;
        res.index = n->state->last_index;
        log_msg(command_log_level(&c), "node %s: %s from %s: %s", n->id, command_kind_name((int)c.kind), from,
                 res.code ? res.message : "done");
    }
    node_send_json(n, from, NODE_T_COMMAND_RESULT, command_result_to_jsonv(&res));
    command_clear(&c);
}

void node_run_report(struct node *n, const char *from, const json_t *report)
{
    char err[512];
    struct master_events evs = {0};
    int rc = master_report_events(n->state, from, report, wall_ms(), &evs, err, sizeof err);
    if (rc == CAIRN_EFORMAT && strcmp(from, n->id))
        node_strike(n, from, "bad report", err);
    else if (rc)
        log_warn("node %s: report from %s: %s", n->id, from, err);
    else
        node_emit(n, &evs);
    master_events_clear(&evs);
}

/* ---- commands from this node's API ---- */

/* Marks done the pendings waiting for a position the state has reached (pend_mu held). */
static bool settle_pendings(struct node *n)
{
    bool any = false;
    for (struct pending *p = n->pend; p; p = p->next) {
        if (p->st == P_WAIT_STATE && node_pos_reached(n->state, p->res.term, p->res.index)) {
            p->st = P_DONE;
            any = true;
        }
    }
    return any;
}

void node_wake_pendings(struct node *n)
{
    pthread_mutex_lock(&n->pend_mu);
    if (settle_pendings(n))
        pthread_cond_broadcast(&n->pend_cv);
    pthread_mutex_unlock(&n->pend_mu);
}

void node_on_result(struct node *n, const char *from, const char *data, size_t len)
{
    struct command_result r;
    char err[256];
    json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    int rc = j ? command_result_from_jsonv(j, &r, err, sizeof err) : CAIRN_EFORMAT;
    if (!j)
        snprintf(err, sizeof err, "not JSON");
    json_decref(j);
    if (rc) {
        node_strike(n, from, "malformed command result", err);
        return;
    }
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next) {
        if (p->st != P_SENT || strcmp(p->cmd->id, r.command_id) || strcmp(p->sent_to, from))
            continue;
        p->res = r;
        p->st = r.code ? P_DONE : P_WAIT_STATE;
        settle_pendings(n);
        pthread_cond_broadcast(&n->pend_cv);
        break;
    }
    pthread_mutex_unlock(&n->pend_mu);
}

static void fail_pending(struct pending *p, int code, const char *fmt, const char *arg)
{
    p->res.code = code;
    snprintf(p->res.command_id, sizeof p->res.command_id, "%s", p->cmd->id);
    snprintf(p->res.message, sizeof p->res.message, fmt, arg);
    p->st = P_DONE;
}

void node_run_pendings(struct node *n, int64_t now)
{
    bool any = false;
    const char *m = node_current_master(n);
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next) {
        if (p->st == P_QUEUED) {
            if (node_is_master(n)) {
                struct master_events evs = {0};
                if (master_command(n->state, &n->env, p->cmd, &evs, &p->res) == 0)
                    node_emit(n, &evs);
                master_events_clear(&evs);
                p->res.term = n->state->last_term;
                p->res.index = n->state->last_index;
                log_msg(command_log_level(p->cmd), "node %s: %s: %s", n->id,
                       command_kind_name((int)p->cmd->kind), p->res.code ? p->res.message : "done");
                p->st = P_DONE;
                any = true;
            } else if (m[0]) {
                char *text = command_to_json(p->cmd);
                if (text && link_send(n->link, m, LINK_T_COMMAND, text, strlen(text)) == 1) {
                    p->st = P_SENT;
                    snprintf(p->sent_to, sizeof p->sent_to, "%s", m);
                }
                free(text);
            } else if (now - p->queued_ms >= NODE_NO_MASTER_WAIT_MS) {
                fail_pending(p, CAIRN_EIO, "no master is known%s",
                             election_role(n->el) == ELECTION_CANDIDATE ? " (an election is on)" : "");
                any = true;
            }
        } else if (p->st == P_SENT && strcmp(p->sent_to, m)) {
            fail_pending(p, CAIRN_EIO, "master %s went away before it answered", p->sent_to);
            any = true;
        }
    }
    any |= settle_pendings(n);
    if (any)
        pthread_cond_broadcast(&n->pend_cv);
    pthread_mutex_unlock(&n->pend_mu);
}

int node_command(struct node *n, struct command *c, int timeout_ms, struct command_result *res)
{
    struct pending p;
    memset(&p, 0, sizeof p);
    memset(res, 0, sizeof *res);
    p.cmd = c;
    p.st = P_QUEUED;
    p.queued_ms = mono_ms();
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    int64_t ns = deadline.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    deadline.tv_sec += ns / 1000000000;
    deadline.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(&n->pend_mu);
    snprintf(c->id, sizeof c->id, "%.40s.%llu", n->id, (unsigned long long)++n->next_cmd);
    if (n->stopped) {
        pthread_mutex_unlock(&n->pend_mu);
        res->code = CAIRN_EIO;
        snprintf(res->message, sizeof res->message, "node is stopping");
        return res->code;
    }
    p.next = n->pend;
    n->pend = &p;
    node_wake(n);
    while (p.st != P_DONE) {
        if (pthread_cond_timedwait(&n->pend_cv, &n->pend_mu, &deadline) == ETIMEDOUT)
            break;
    }
    for (struct pending **pp = &n->pend; *pp; pp = &(*pp)->next) {
        if (*pp == &p) {
            *pp = p.next;
            break;
        }
    }
    pthread_mutex_unlock(&n->pend_mu);
    if (p.st != P_DONE)
        fail_pending(&p, CAIRN_EIO,
                     p.st == P_WAIT_STATE ? "%s: done, but this node did not see it in time"
                                          : "%s: no answer from the master in time",
                     command_kind_name((int)c->kind));
    *res = p.res;
    snprintf(res->command_id, sizeof res->command_id, "%s", c->id);
    return res->code;
}

void node_fail_pendings(struct node *n)
{
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next)
        if (p->st != P_DONE)
            fail_pending(p, CAIRN_EIO, "%s", "node is stopping");
    pthread_cond_broadcast(&n->pend_cv);
    pthread_mutex_unlock(&n->pend_mu);
}
