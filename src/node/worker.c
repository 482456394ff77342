/* The node's worker thread (worker.h). */
#include "node/worker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "ctl/command.h"
#include "node/catalog.h"
#include "node/download.h"
#include "node/hubref.h"
#include "node/taskbody.h"
#include "proto/taskmsg.h"
#include "ctl/plan.h"

struct wrunner {
    char id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1];
    enum cluster_runner_status status;
    char *error; /* Failed only */
    int restart_count;
    pid_t pid;
    bool supervised;
    bool want_delete; /* gave up: its instance is to be deleted (once) */
    char draft_path[RUNNER_PATH_MAX]; /* the draft it was given ("" none) */
    int draft_k;
    int data_port;         /* where its data plane listens (pipelined), 0 = not yet */
    int64_t epoch;         /* of its instance when it was started (its config's) */
    int64_t stopped_for;   /* stopped because its instance moved to this epoch (0: no) */
    pid_t peers_pid;       /* the process last told where its next rank is, and the */
    int peers_port;        /* port it was told: a new process or port is told again */
    /* Across the processes of this runner id, also those of earlier epochs: */
    int restart_base;      /* restarts before this supervised entry */
    int failures;          /* Failed in a row, reset after stable_ms Ready */
    int64_t failed_ms, ready_ms; /* last Failed; Ready (or Running) since; 0: none */
    bool delete_asked;     /* its instance's deletion was asked once */
    /* A Failed not yet carried by a report: reports are at most one per
     * NODE_REPORT_MIN_MS, the first restart comes after backoff_ms (as long), so the
     * next report may already see the new process; it reports this Failed first. */
    bool failed_unreported;
    int failed_restart_count;
    char *failed_error;
};

/* A runner stopped for a new epoch of its instance hands its restarts and failures in a
 * row to its next process (started no sooner than the backoff of those failures), so a
 * rank that keeps failing is given up on (its instance deleted) as the supervisor would,
 * however many epochs that takes. */
struct wcarry {
    char id[IDS_ID_MAX + 1];
    int restarts, failures;
    int64_t not_before_ms;
};

/* A task handed to one of this node's runners, until its runner says done. */
struct wtask {
    char id[IDS_ID_MAX + 1], runner_id[IDS_ID_MAX + 1];
    char requester[IDS_ID_MAX + 1]; /* node whose API holds the request */
    bool cancel_sent;
};

/* A Pending task of a first rank here, waiting for its body (node/taskbody.h) or for its
 * runner to be ready. */
struct wwait {
    char id[IDS_ID_MAX + 1];
    int64_t since_ms; /* when this worker first saw it Pending */
    json_t *params;   /* its body once taken, NULL before */
    bool failed;      /* given up: a FinishTask Failed is on its way */
    bool seen;        /* still Pending in the state of this pass */
};

/* A FinishTask to send to the master (after the supervisor's poll, off its callback). */
struct wfinish {
    char task_id[IDS_ID_MAX + 1];
    enum cluster_task_status status;
    char error[COMMAND_MESSAGE_MAX];
};

struct worker {
    struct supervisor_config sup_cfg;
    struct supervisor *sup;
    struct node *node;
    char node_id[IDS_ID_MAX + 1];
    pthread_t thread;
    bool started, joined;
    atomic_bool stop, dirty;
    uint64_t sub_token;
    pthread_mutex_t mu; /* guards the table below */
    struct wrunner *r;
    size_t n, cap;
    /* worker thread only */
    struct wtask *tasks;
    size_t n_tasks, cap_tasks;
    struct wfinish *finish;
    size_t n_finish, cap_finish;
    struct wwait *waits;
    size_t n_waits, cap_waits;
    struct taskbody_store *bodies; /* filled on the node thread */
    struct wcarry *carry; /* under mu */
    size_t n_carry, cap_carry;
    int64_t replan_at_ms; /* worker thread: plan again then (a start waits), 0: none */
};

#define RESTARTS_MAX 1000000 /* a runner's restart_count in the state (state.h) */

static int64_t now_ms(void) { return clock_ns() / 1000000; }

/* The supervisor's restart delay after `failures` in a row. */
static int64_t backoff_ms(const struct worker *w, int failures)
{
    int64_t d = w->sup_cfg.backoff_ms;
    for (int i = 1; i < failures && d < w->sup_cfg.backoff_max_ms; i++)
        d *= 2;
    return failures < 1 ? 0 : d < w->sup_cfg.backoff_max_ms ? d : w->sup_cfg.backoff_max_ms;
}

static struct wcarry *carry_find(struct worker *w, const char *id)
{
    for (size_t i = 0; i < w->n_carry; i++)
        if (!strcmp(w->carry[i].id, id))
            return &w->carry[i];
    return NULL;
}

static void carry_drop(struct worker *w, struct wcarry *c)
{
    size_t i = (size_t)(c - w->carry);
    memmove(&w->carry[i], &w->carry[i + 1], (w->n_carry - i - 1) * sizeof *w->carry);
    w->n_carry--;
}

/* Keeps what x hands to its next process (under mu); out of memory: it starts afresh. */
static void carry_keep(struct worker *w, const struct wrunner *x)
{
    struct wcarry *c = carry_find(w, x->id);
    if (!c) {
        if (array_reserve(&w->carry, &w->cap_carry, w->n_carry + 1, sizeof *w->carry, 8))
            return;
        c = &w->carry[w->n_carry++];
    }
    snprintf(c->id, sizeof c->id, "%s", x->id);
    c->restarts = x->restart_count < RESTARTS_MAX ? x->restart_count + 1 : RESTARTS_MAX;
    c->failures = x->failures;
    c->not_before_ms = x->failures ? x->failed_ms + backoff_ms(w, x->failures) : 0;
}

/* Restarts of x's runner id so far, within the state's bound. */
static int restarts(const struct wrunner *x, const struct supervisor_event *ev)
{
    int64_t n = (int64_t)x->restart_base + ev->restart_count;
    return n < RESTARTS_MAX ? (int)n : RESTARTS_MAX;
}

static struct wrunner *find(struct worker *w, const char *id)
{
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->r[i].id, id))
            return &w->r[i];
    return NULL;
}

static void drop(struct worker *w, struct wrunner *x)
{
    if (x->stopped_for)
        carry_keep(w, x);
    free(x->error);
    free(x->failed_error);
    size_t i = (size_t)(x - w->r);
    memmove(&w->r[i], &w->r[i + 1], (w->n - i - 1) * sizeof *w->r);
    w->n--;
}

static void set_error(struct wrunner *x, const char *error)
{
    free(x->error);
    x->error = NULL;
    if (x->status == CLUSTER_RUNNER_FAILED && error)
        x->error = runner_text_clean(error, strlen(error), 2048);
}

/* Adds a runner (under mu); NULL when out of memory. */
static struct wrunner *add(struct worker *w, const char *id, const char *instance_id)
{
    if (array_reserve(&w->r, &w->cap, w->n + 1, sizeof *w->r, 8))
        return NULL;
    struct wrunner *x = &w->r[w->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", id);
    snprintf(x->instance_id, sizeof x->instance_id, "%s", instance_id);
    return x;
}

/* ---- tasks ---- */

static struct wtask *task_find(struct worker *w, const char *id)
{
    for (size_t i = 0; i < w->n_tasks; i++)
        if (!strcmp(w->tasks[i].id, id))
            return &w->tasks[i];
    return NULL;
}

static struct wtask *task_add(struct worker *w, const char *id, const char *runner_id, const char *requester)
{
    if (array_reserve(&w->tasks, &w->cap_tasks, w->n_tasks + 1, sizeof *w->tasks, 16))
        return NULL;
    struct wtask *t = &w->tasks[w->n_tasks++];
    memset(t, 0, sizeof *t);
    snprintf(t->id, sizeof t->id, "%s", id);
    snprintf(t->runner_id, sizeof t->runner_id, "%s", runner_id);
    snprintf(t->requester, sizeof t->requester, "%s", requester);
    return t;
}

static void finish_later(struct worker *w, const char *task_id, enum cluster_task_status status, const char *error)
{
    if (array_reserve(&w->finish, &w->cap_finish, w->n_finish + 1, sizeof *w->finish, 16)) {
        log_error("worker: out of memory; task %s stays in the state", task_id);
        return;
    }
    struct wfinish *f = &w->finish[w->n_finish++];
    snprintf(f->task_id, sizeof f->task_id, "%s", task_id);
    f->status = status;
    snprintf(f->error, sizeof f->error, "%s", error ? error : "");
}

static void relay(struct worker *w, const char *requester, const char *line, size_t len)
{
    int rc = node_send_task_output(w->node, requester, line, len);
    if (rc)
        log_warn("worker: output for node %s lost (%s)", requester, cairn_strerror(rc));
}

/* The runner said done (or the supervisor did for a runner that died): the requester
 * gets a done line, the master a FinishTask. */
static void task_done(struct worker *w, const struct supervisor_event *ev)
{
    struct wtask *t = task_find(w, ev->task_id);
    if (!t)
        return;
    /* A task its client did not cancel, ended because its runner stopped for a new epoch
     * of the instance (a rank failed), failed: the client gets an error, not a cancel. */
    enum runner_finish finish = ev->finish;
    const char *error = ev->error;
    char why[160];
    if (finish == RUNNER_FINISH_CANCELLED && !t->cancel_sent) {
        pthread_mutex_lock(&w->mu);
        struct wrunner *x = find(w, ev->runner_id);
        int64_t epoch = x ? x->stopped_for : 0;
        pthread_mutex_unlock(&w->mu);
        if (epoch) {
            snprintf(why, sizeof why, "a rank of instance %s failed: it moved to epoch %lld", ev->instance_id,
                     (long long)epoch);
            finish = RUNNER_FINISH_ERROR;
            error = why;
        }
    }
    struct task_msg done = {.type = RUNNER_MSG_DONE, .finish = finish, .n_generated = ev->n_generated,
                            .error = error};
    memcpy(done.task_id, t->id, sizeof done.task_id);
    json_t *j = task_msg_to_json(&done);
    char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (line)
        relay(w, t->requester, line, strlen(line));
    free(line);
    json_decref(j);
    enum cluster_task_status st = finish == RUNNER_FINISH_ERROR       ? CLUSTER_TASK_FAILED
                                  : finish == RUNNER_FINISH_CANCELLED ? CLUSTER_TASK_CANCELLED
                                                                      : CLUSTER_TASK_COMPLETE;
    finish_later(w, t->id, st, error);
    size_t i = (size_t)(t - w->tasks);
    memmove(&w->tasks[i], &w->tasks[i + 1], (w->n_tasks - i - 1) * sizeof *w->tasks);
    w->n_tasks--;
}

static void on_sup_event(void *ctx, const struct supervisor_event *ev)
{
    struct worker *w = ctx;
    if (ev->kind == SUPERVISOR_OUTPUT) {
        struct wtask *t = ev->line ? task_find(w, ev->task_id) : NULL;
        if (t)
            relay(w, t->requester, ev->line, strlen(ev->line));
        return;
    }
    if (ev->kind == SUPERVISOR_DONE) {
        task_done(w, ev);
        return;
    }
    if (ev->kind != SUPERVISOR_STATUS && ev->kind != SUPERVISOR_GAVE_UP)
        return;
    pthread_mutex_lock(&w->mu);
    struct wrunner *x = find(w, ev->runner_id);
    if (x) {
        if (ev->kind == SUPERVISOR_GAVE_UP) {
            x->status = CLUSTER_RUNNER_FAILED;
            x->supervised = false;
            x->pid = 0;
            x->restart_count = restarts(x, ev);
            set_error(x, ev->error ? ev->error : "gave up");
            if (!x->delete_asked) /* (the count of failures may have asked already) */
                x->want_delete = x->delete_asked = true;
        } else if (ev->status == CLUSTER_RUNNER_SHUTDOWN) {
            drop(w, x); /* gone: the next report leaves it out (RunnerDeleted) */
        } else {
            bool serving = ev->status == CLUSTER_RUNNER_READY || ev->status == CLUSTER_RUNNER_RUNNING;
            if (!serving)
                x->ready_ms = 0;
            else if (!x->ready_ms)
                x->ready_ms = now_ms();
            if (ev->status == CLUSTER_RUNNER_FAILED) {
                x->failures++;
                x->failed_ms = now_ms();
                /* Failures carried over epochs: give up as the supervisor would. */
                if (x->failures >= w->sup_cfg.max_failures && !x->delete_asked) {
                    x->want_delete = x->delete_asked = true;
                    log_warn("worker: runner %s failed %d times in a row; deleting instance %s", x->id,
                             x->failures, x->instance_id);
                }
            }
            x->status = ev->status;
            x->restart_count = restarts(x, ev);
            x->pid = ev->pid;
            x->data_port = ev->data_port;
            set_error(x, ev->error);
            if (ev->status == CLUSTER_RUNNER_FAILED) {
                free(x->failed_error);
                x->failed_error = x->error ? strdup(x->error) : NULL;
                x->failed_restart_count = x->restart_count;
                x->failed_unreported = true;
            }
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (ev->kind == SUPERVISOR_GAVE_UP)
        log_warn("worker: runner %s gave up: %s", ev->runner_id, ev->error ? ev->error : "");
    node_report_now(w->node);
    atomic_store(&w->dirty, true);
}

static void on_node_event(void *ctx, const char *json, size_t len, int64_t term, int64_t index)
{
    (void)json;
    (void)len;
    (void)term;
    (void)index;
    struct worker *w = ctx;
    atomic_store(&w->dirty, true);
    supervisor_wake(w->sup); /* a new task should not wait for the poll's timeout */
}

/* A hub model's canonical id (what its shards' layers may be fetched for). */
static bool is_hub_id(const char *model_id)
{
    char canon[HUBREF_TEXT_MAX];
    return hubref_canonical(model_id, canon) && !strcmp(canon, model_id);
}

/* plan_model_fn: the model's file in the catalog, else, for a hub model, its sparse copy
 * when that holds every byte the shard's layers read. */
static int model_path(void *ctx, const char *model_id, int layer_begin, int layer_end, char *path, size_t pathlen,
                      char *err, size_t errlen)
{
    struct catalog_card card;
    int rc = node_card(ctx, model_id, &card, err, errlen);
    if (rc == CAIRN_ENOTFOUND && is_hub_id(model_id) && node_hub_covers(ctx, model_id, layer_begin, layer_end, path, pathlen)) {
        catalog_card_clear(&card);
        return 0;
    }
    if (!rc) {
        if (!card.path || strlen(card.path) >= pathlen)
            rc = cairn_fail(err, errlen, CAIRN_ERANGE, "model path too long");
        else
            snprintf(path, pathlen, "%s", card.path);
    }
    catalog_card_clear(&card);
    return rc;
}

/* ---- request bodies (node/taskbody.h) ---- */

/* Body sink of the node (node thread): files the body and wakes the worker. */
static void on_task_body(void *ctx, const char *from, const char *msg, size_t len)
{
    struct worker *w = ctx;
    char err[512];
    int rc = taskbody_put(w->bodies, from, msg, len, now_ms(), err, sizeof err);
    if (rc) {
        log_warn("worker: task body from node %s refused: %s", from, err);
        return;
    }
    atomic_store(&w->dirty, true);
    supervisor_wake(w->sup);
}

static struct wwait *wait_find(struct worker *w, const char *id)
{
    for (size_t i = 0; i < w->n_waits; i++)
        if (!strcmp(w->waits[i].id, id))
            return &w->waits[i];
    return NULL;
}

/* The wait of task id, begun now when new; NULL when out of memory. */
static struct wwait *wait_get(struct worker *w, const char *id)
{
    struct wwait *wt = wait_find(w, id);
    if (wt)
        return wt;
    if (array_reserve(&w->waits, &w->cap_waits, w->n_waits + 1, sizeof *w->waits, 16))
        return NULL;
    wt = &w->waits[w->n_waits++];
    memset(wt, 0, sizeof *wt);
    snprintf(wt->id, sizeof wt->id, "%s", id);
    wt->since_ms = now_ms();
    return wt;
}

static void wait_drop(struct worker *w, struct wwait *wt)
{
    json_decref(wt->params);
    *wt = w->waits[--w->n_waits];
}

/* Takes the body of Pending task t, sent by its requester; true when wt has it. A body
 * that does not come within TASKBODY_WAIT_MS fails the task. */
static bool take_body(struct worker *w, struct wwait *wt, const struct cluster_task *t)
{
    char err[512];
    int rc = taskbody_take(w->bodies, t->id, t->node_id, &wt->params, err, sizeof err);
    if (rc == CAIRN_EINVAL)
        log_warn("worker: %s", err);
    if (!rc)
        return true;
    int64_t waited = now_ms() - wt->since_ms;
    if (waited < TASKBODY_WAIT_MS) {
        int64_t at = wt->since_ms + TASKBODY_WAIT_MS;
        if (!w->replan_at_ms || at < w->replan_at_ms)
            w->replan_at_ms = at;
        return false;
    }
    char why[COMMAND_MESSAGE_MAX];
    snprintf(why, sizeof why, "the request of task %s never arrived from node %s (waited %lld ms)", t->id, t->node_id,
             (long long)waited);
    log_warn("worker: %s", why);
    wt->failed = true;
    finish_later(w, t->id, CLUSTER_TASK_FAILED, why);
    return false;
}

/* Ends the waits of tasks no longer Pending here (seen cleared before each pass). */
static void waits_sweep(struct worker *w)
{
    for (size_t i = w->n_waits; i-- > 0;)
        if (!w->waits[i].seen)
            wait_drop(w, &w->waits[i]);
    for (size_t i = 0; i < w->n_waits; i++)
        w->waits[i].seen = false;
}

/* Hands Pending tasks of instances whose first rank runs here to that runner once it is
 * Ready, and cancels those the master marked Cancelled. */
static void dispatch_tasks(struct worker *w, const struct cluster_state *st)
{
    for (size_t i = 0; i < st->n_tasks; i++) {
        const struct cluster_task *t = &st->tasks[i];
        const struct cluster_instance *in = cluster_state_find_instance(st, t->instance_id);
        if (!in || !in->n_shards || strcmp(in->shards[0].node_id, w->node_id))
            continue;
        const char *rid = in->shards[0].runner_id;
        struct wtask *held = task_find(w, t->id);
        if (t->status == CLUSTER_TASK_CANCELLED) {
            if (held && !held->cancel_sent) {
                held->cancel_sent = true;
                supervisor_cancel(w->sup, held->runner_id, held->id);
            } else if (!held) {
                bool queued = false;
                for (size_t k = 0; k < w->n_finish && !queued; k++)
                    queued = !strcmp(w->finish[k].task_id, t->id);
                if (!queued)
                    finish_later(w, t->id, CLUSTER_TASK_CANCELLED, NULL);
            }
            continue;
        }
        if (t->status != CLUSTER_TASK_PENDING || held)
            continue;
        struct wwait *wt = wait_get(w, t->id);
        if (!wt)
            continue;
        wt->seen = true;
        if (wt->failed)
            continue;
        if (!wt->params && !take_body(w, wt, t))
            continue;
        pthread_mutex_lock(&w->mu);
        struct wrunner *x = find(w, rid);
        bool ready = x && x->supervised && x->epoch == in->epoch &&
                     (x->status == CLUSTER_RUNNER_READY || x->status == CLUSTER_RUNNER_RUNNING);
        pthread_mutex_unlock(&w->mu);
        if (!ready)
            continue;
        struct runner_task rt = {0};
        snprintf(rt.task_id, sizeof rt.task_id, "%s", t->id);
        rt.params = wt->params; /* borrowed for the call */
        char err[512];
        int rc = supervisor_submit(w->sup, rid, &rt, err, sizeof err);
        if (rc) {
            log_warn("worker: task %s to runner %s: %s", t->id, rid, err);
            continue;
        }
        wait_drop(w, wt);
        if (!task_add(w, t->id, rid, t->node_id)) {
            supervisor_cancel(w->sup, rid, t->id);
            log_error("worker: out of memory; task %s cancelled", t->id);
        }
    }
    waits_sweep(w);
}

/* Gives the first-rank runners of instances whose draft model changed the new one
 * (InstanceDraftModelUpdated), loaded while requests keep running. */
static void update_drafts(struct worker *w, const struct cluster_state *st)
{
    for (size_t i = 0; i < st->n_instances; i++) {
        const struct cluster_instance *in = &st->instances[i];
        if (!in->n_shards || strcmp(in->shards[0].node_id, w->node_id))
            continue;
        char path[RUNNER_PATH_MAX] = "", why[512];
        if (in->draft_model[0] && model_path(w->node, in->draft_model, 0, -1, path, sizeof path, why, sizeof why)) {
            log_warn("worker: instance %s runs without its draft: %s", in->id, why);
            path[0] = 0;
        }
        pthread_mutex_lock(&w->mu);
        struct wrunner *x = find(w, in->shards[0].runner_id);
        bool changed = x && x->supervised && (strcmp(x->draft_path, path) || x->draft_k != in->num_draft_tokens);
        if (changed) {
            snprintf(x->draft_path, sizeof x->draft_path, "%s", path);
            x->draft_k = in->num_draft_tokens;
        }
        pthread_mutex_unlock(&w->mu);
        if (changed) {
            log_info("worker: runner %s: draft %s, %d tokens", in->shards[0].runner_id, path[0] ? path : "(none)",
                     in->num_draft_tokens);
            supervisor_set_draft(w->sup, in->shards[0].runner_id, path, in->num_draft_tokens);
        }
    }
}

/* The host of a link endpoint ("tcp://host:port", "[v6]:port" or a bare address). */
static void endpoint_host(const char *ep, char *out, size_t len)
{
    if (!strncmp(ep, "tcp://", 6))
        ep += 6;
    const char *end = ep + strlen(ep);
    if (*ep == '[') {
        const char *close = strchr(ep, ']');
        end = close ? close : end;
        ep++;
    } else {
        const char *colon = strchr(ep, ':');
        if (colon && !strchr(colon + 1, ':')) /* host:port, not a bare IPv6 address */
            end = colon;
    }
    snprintf(out, len, "%.*s", (int)(end - ep), ep);
}

static void add_host(struct runner_peers *p, const char *host)
{
    if (!host[0] || strlen(host) > IDS_ADDR_MAX || strchr(host, '%') || !strncasecmp(host, "fe80:", 5) ||
        p->n_hosts == RUNNER_MAX_PEER_HOSTS)
        return; /* link-local IPv6 needs a scope this node cannot name */
    for (int i = 0; i < p->n_hosts; i++)
        if (!strcmp(p->hosts[i], host))
            return;
    snprintf(p->hosts[p->n_hosts++], sizeof p->hosts[0], "%s", host);
}

/* Addresses to reach node_id's data plane at, best first: loopback for this node; else
 * where this node's cluster link reaches it, then its other addresses (IPv4 first). */
static void peer_hosts(struct worker *w, const struct cluster_state *st, const char *node_id,
                       struct runner_peers *p)
{
    if (!strcmp(node_id, w->node_id)) {
        add_host(p, "127.0.0.1");
        return;
    }
    char ep[256], host[IDS_ADDR_MAX + 1];
    if (node_peer_addr(w->node, node_id, ep, sizeof ep)) {
        endpoint_host(ep, host, sizeof host);
        add_host(p, host);
    }
    const struct cluster_node *nd = cluster_state_find_node(st, node_id);
    for (int v6 = 0; nd && v6 < 2; v6++)
        for (size_t i = 0; i < nd->info.n_ifaces; i++)
            for (size_t k = 0; !nd->info.ifaces[i].loopback && k < nd->info.ifaces[i].n_addrs; k++) {
                snprintf(host, sizeof host, "%s", nd->info.ifaces[i].addrs[k]);
                char *slash = strchr(host, '/'); /* a prefix length */
                if (slash)
                    *slash = 0;
                if ((strchr(host, ':') != NULL) == v6 && strncmp(host, "127.", 4) && strcmp(host, "::1"))
                    add_host(p, host);
            }
}

/* Tells each pipelined runner here that listens and waits where its next rank listens,
 * once that runner has reported its port (a restarted process or a new port: again).
 * Only runners of the instance's epoch are told, only of a next rank that reports that
 * epoch, and with the epoch they were started for: the handshake then refuses any rank
 * of another epoch, so an older ring's rank can never join the new one. */
static void update_peers(struct worker *w, const struct cluster_state *st)
{
    for (size_t i = 0; i < st->n_instances; i++) {
        const struct cluster_instance *in = &st->instances[i];
        if (in->n_shards < 2)
            continue;
        for (size_t k = 0; k < in->n_shards; k++) {
            const struct cluster_shard *sh = &in->shards[k];
            if (strcmp(sh->node_id, w->node_id))
                continue;
            const struct cluster_shard *next = &in->shards[(k + 1) % in->n_shards];
            const struct cluster_runner *nr = cluster_state_find_runner(st, next->runner_id);
            if (!nr || nr->data_port <= 0 || nr->status == CLUSTER_RUNNER_FAILED || nr->epoch != in->epoch)
                continue;
            pthread_mutex_lock(&w->mu);
            struct wrunner *x = find(w, sh->runner_id);
            bool due = x && x->supervised && x->pid > 0 && x->status == CLUSTER_RUNNER_CONNECTING &&
                       x->epoch == in->epoch && x->data_port > 0 &&
                       (x->peers_pid != x->pid || x->peers_port != nr->data_port);
            pid_t pid = x ? x->pid : 0;
            int64_t epoch = x ? x->epoch : 0;
            pthread_mutex_unlock(&w->mu);
            if (!due)
                continue;
            struct runner_peers p = {.epoch = epoch, .next_rank = next->rank, .next_port = nr->data_port};
            snprintf(p.secret, sizeof p.secret, "%s", node_dataplane_secret(w->node));
            peer_hosts(w, st, next->node_id, &p);
            if (!p.n_hosts) {
                log_warn("worker: runner %s: no address known for node %s (rank %d)", sh->runner_id,
                         next->node_id, next->rank);
                continue;
            }
            int rc = supervisor_set_peers(w->sup, sh->runner_id, &p);
            log_info("worker: runner %s (rank %d): next rank %d at %s:%d (%d addresses)%s", sh->runner_id,
                     sh->rank, next->rank, p.hosts[0], p.next_port, p.n_hosts, rc ? ": not sent" : "");
            if (rc)
                continue;
            pthread_mutex_lock(&w->mu);
            if ((x = find(w, sh->runner_id)) && x->pid == pid) {
                x->peers_pid = pid;
                x->peers_port = nr->data_port;
            }
            pthread_mutex_unlock(&w->mu);
        }
    }
}

/* Sends the FinishTask commands queued by task_done. */
static void send_finishes(struct worker *w)
{
    for (size_t i = 0; i < w->n_finish; i++) {
        struct command c;
        struct command_result res;
        command_init(&c, COMMAND_FINISH_TASK);
        snprintf(c.finish_task.task_id, sizeof c.finish_task.task_id, "%s", w->finish[i].task_id);
        c.finish_task.status = w->finish[i].status;
        memcpy(c.finish_task.error, w->finish[i].error, sizeof c.finish_task.error);
        int rc = node_command(w->node, &c, WORKER_COMMAND_MS, &res);
        if (rc && rc != CAIRN_ENOTFOUND)
            log_warn("worker: finishing task %s: %s", w->finish[i].task_id, res.message);
        command_clear(&c);
    }
    w->n_finish = 0;
}

/* ---- planning ---- */

/* Whether another node reports a whole copy of model_id (a Completed download). */
static bool whole_copy_elsewhere(const struct cluster_state *st, const char *self, const char *model_id)
{
    for (size_t i = 0; i < st->n_downloads; i++) {
        const struct cluster_download *d = &st->downloads[i];
        if (d->status == CLUSTER_DOWNLOAD_COMPLETED && !d->layer_end && strcmp(d->node_id, self) &&
            !strcmp(d->model_id, model_id))
            return true;
    }
    return false;
}

/* A shard whose model file is not here is fetched from a peer (download.h) instead of
 * failing: true while its download runs (no runner yet; a plan after it starts one),
 * false with why set when the file cannot be had that way. */
static bool fetching(struct worker *w, const struct cluster_state *st, const struct plan_action *a, char *why,
                     size_t whylen)
{
    struct download_mgr *dl = node_downloads(w->node);
    const struct cluster_instance *in = cluster_state_find_instance(st, a->instance_id);
    why[0] = 0;
    if (!dl || !in)
        return false;
    struct catalog_card card;
    char ignored[256];
    int rc = node_card(w->node, in->model_id, &card, ignored, sizeof ignored);
    catalog_card_clear(&card);
    if (rc != CAIRN_ENOTFOUND)
        return false; /* here but unusable: the plan's reason stands */
    char msg[PLAN_REASON_MAX];
    /* A hub model no node holds whole: this shard's layers come from the hub. */
    if (is_hub_id(in->model_id) && !whole_copy_elsewhere(st, w->node_id, in->model_id)) {
        if (!node_hub_fill(w->node, in->model_id, a->cfg.layer_begin, a->cfg.layer_end, msg, sizeof msg))
            return true;
        snprintf(why, whylen, "layers %d..%d of %s cannot be fetched from the hub: %s", a->cfg.layer_begin,
                 a->cfg.layer_end, in->model_id, msg);
        return false;
    }
    if (!download_mgr_ensure(dl, st, in->model_id, msg, sizeof msg))
        return true;
    snprintf(why, whylen, "model %s is not here and cannot be fetched: %s", in->model_id, msg);
    return false;
}

/* What one plan works from, taken under one acquisition of mu: a copy of the node's
 * state and the runners held as plan_compute takes them. Only this thread changes the
 * table while it plans (the supervisor delivers its events from its poll, on this
 * thread), so the copy holds for the whole pass; what the actions change, they write
 * under mu. */
struct wsnap {
    struct cluster_state *st;
    struct plan_runner *held; /* NULL when out of memory */
    bool *supervised;         /* of held[i]: it has a process under the supervisor */
    size_t n_held;
};

/* Takes the snapshot. Under the same acquisition, the failures in a row of runners Ready
 * for stable_ms are forgotten, and what was carried for a runner no longer placed here
 * is dropped. False when the state cannot be copied (nothing else done then). */
static bool snap_take(struct worker *w, struct wsnap *s)
{
    memset(s, 0, sizeof *s);
    s->st = node_state_copy(w->node);
    if (!s->st)
        return false;
    const struct cluster_state *st = s->st;
    pthread_mutex_lock(&w->mu);
    int64_t now = now_ms();
    for (size_t i = 0; i < w->n; i++)
        if (w->r[i].ready_ms && now - w->r[i].ready_ms >= w->sup_cfg.stable_ms)
            w->r[i].failures = 0;
    for (size_t i = w->n_carry; i-- > 0;) {
        bool placed = false;
        for (size_t k = 0; k < st->n_instances && !placed; k++)
            for (size_t m = 0; m < st->instances[k].n_shards && !placed; m++)
                placed = !strcmp(st->instances[k].shards[m].runner_id, w->carry[i].id) &&
                         !strcmp(st->instances[k].shards[m].node_id, w->node_id);
        if (!placed)
            carry_drop(w, &w->carry[i]);
    }
    s->held = calloc(w->n ? w->n : 1, sizeof *s->held);
    s->supervised = calloc(w->n ? w->n : 1, sizeof *s->supervised);
    s->n_held = w->n;
    for (size_t i = 0; s->held && s->supervised && i < w->n; i++) {
        snprintf(s->held[i].runner_id, sizeof s->held[i].runner_id, "%s", w->r[i].id);
        snprintf(s->held[i].instance_id, sizeof s->held[i].instance_id, "%s", w->r[i].instance_id);
        s->held[i].status = w->r[i].status;
        s->held[i].epoch = w->r[i].epoch;
        s->supervised[i] = w->r[i].supervised;
    }
    pthread_mutex_unlock(&w->mu);
    if (!s->supervised) {
        free(s->held);
        s->held = NULL;
    }
    return true;
}

static void snap_clear(struct wsnap *s)
{
    cluster_state_release(s->st);
    free(s->held);
    free(s->supervised);
    memset(s, 0, sizeof *s);
}

/* PLAN_START: a runner stopped for a new epoch of its instance first waits for its
 * failures' backoff (the next plan comes then); else it joins the table with the
 * restarts and failures it carried, and its process is started. */
static void start_runner(struct worker *w, const struct plan_action *a)
{
    pthread_mutex_lock(&w->mu);
    struct wcarry *c = carry_find(w, a->runner_id);
    struct wcarry carried = {0};
    if (c)
        carried = *c;
    bool wait = c && now_ms() < c->not_before_ms;
    if (c && !wait)
        carry_drop(w, c);
    struct wrunner *x = wait ? NULL : add(w, a->runner_id, a->instance_id);
    if (x) {
        x->epoch = a->cfg.epoch;
        x->restart_base = x->restart_count = carried.restarts;
        x->failures = carried.failures;
    }
    pthread_mutex_unlock(&w->mu);
    if (wait) {
        if (!w->replan_at_ms || carried.not_before_ms < w->replan_at_ms)
            w->replan_at_ms = carried.not_before_ms;
        return;
    }
    log_info("worker: starting runner %s of instance %s (%s, layers %d..%d, epoch %lld)", a->runner_id,
             a->instance_id, a->cfg.model_path, a->cfg.layer_begin, a->cfg.layer_end, (long long)a->cfg.epoch);
    if (!x)
        return;
    /* Started outside the lock: the supervisor may deliver events meanwhile only from
     * poll, which runs on this thread. */
    char err[1024];
    struct runner_config cfg = a->cfg;
    snprintf(cfg.data_bind, sizeof cfg.data_bind, "%s", node_bind_addr(w->node));
    int rc = supervisor_start(w->sup, &cfg, err, sizeof err);
    pthread_mutex_lock(&w->mu);
    x = find(w, a->runner_id);
    if (x) {
        if (rc) {
            x->status = CLUSTER_RUNNER_FAILED;
            set_error(x, err);
            log_warn("worker: runner %s: %s", a->runner_id, err);
        } else {
            x->supervised = true;
            x->status = CLUSTER_RUNNER_IDLE;
            x->pid = supervisor_pid(w->sup, a->runner_id);
            snprintf(x->draft_path, sizeof x->draft_path, "%s", a->cfg.draft_model_path);
            x->draft_k = a->cfg.num_draft_tokens;
        }
    }
    pthread_mutex_unlock(&w->mu);
}

/* PLAN_FAIL: the runner joins the table as Failed with the reason, unless its model file
 * is being fetched from a peer (a plan after the download starts it). */
static void fail_runner(struct worker *w, const struct wsnap *s, const struct plan_action *a)
{
    char why[1024];
    if (fetching(w, s->st, a, why, sizeof why))
        return;
    const char *reason = why[0] ? why : a->reason;
    log_warn("worker: runner %s cannot start: %s", a->runner_id, reason);
    pthread_mutex_lock(&w->mu);
    struct wrunner *x = add(w, a->runner_id, a->instance_id);
    if (x) {
        x->status = CLUSTER_RUNNER_FAILED;
        x->epoch = a->cfg.epoch;
        set_error(x, reason);
    }
    pthread_mutex_unlock(&w->mu);
}

/* PLAN_STOP: the supervisor stops the runner's process (ShuttingDown until it is gone);
 * one without a process leaves the table at once. A runner still placed here was stopped
 * because its instance moved to a new epoch: what it carries goes to its next process. */
static void stop_runner(struct worker *w, const struct wsnap *s, const struct plan_action *a)
{
    const struct cluster_instance *in = cluster_state_find_instance(s->st, a->instance_id);
    bool placed = false;
    for (size_t k = 0; in && k < in->n_shards; k++)
        placed = placed || (!strcmp(in->shards[k].runner_id, a->runner_id) &&
                            !strcmp(in->shards[k].node_id, w->node_id));
    bool sup = false;
    int64_t was = 0;
    for (size_t i = 0; i < s->n_held; i++) {
        if (!strcmp(s->held[i].runner_id, a->runner_id)) {
            sup = s->supervised[i];
            was = s->held[i].epoch;
            break;
        }
    }
    if (placed)
        log_info("worker: stopping runner %s of instance %s: epoch %lld, the instance moved to %lld", a->runner_id,
                 a->instance_id, (long long)was, (long long)in->epoch);
    else
        log_info("worker: stopping runner %s of instance %s", a->runner_id, a->instance_id);
    int rc = sup ? supervisor_stop(w->sup, a->runner_id) : CAIRN_ENOTFOUND;
    pthread_mutex_lock(&w->mu);
    struct wrunner *x = find(w, a->runner_id);
    if (x && placed)
        x->stopped_for = in->epoch;
    if (x && rc)
        drop(w, x);
    else if (x) {
        x->status = CLUSTER_RUNNER_SHUTTING_DOWN;
        set_error(x, NULL);
    }
    pthread_mutex_unlock(&w->mu);
}

/* One pass of the worker: from a snapshot, hands out tasks, drafts and next ranks, and
 * carries out the plan's actions; a plan that cannot be made is tried again soon. */
static void replan(struct worker *w)
{
    struct wsnap s;
    if (!snap_take(w, &s))
        return;
    struct plan_action *acts = NULL;
    size_t n_acts = 0;
    if (!s.held || plan_compute(s.st, w->node_id, s.held, s.n_held, model_path, w->node, &acts, &n_acts)) {
        snap_clear(&s);
        w->replan_at_ms = now_ms() + WORKER_POLL_MS; /* try again soon */
        return;
    }
    dispatch_tasks(w, s.st);
    update_drafts(w, s.st);
    update_peers(w, s.st);
    for (size_t i = 0; i < n_acts; i++) {
        if (acts[i].kind == PLAN_START)
            start_runner(w, &acts[i]);
        else if (acts[i].kind == PLAN_FAIL)
            fail_runner(w, &s, &acts[i]);
        else
            stop_runner(w, &s, &acts[i]);
    }
    snap_clear(&s);
    if (n_acts)
        node_report_now(w->node);
    free(acts);
}

/* Deletes the instances of runners the supervisor gave up on (issue 4: after 5
 * failures the instance is deleted); the master's InstanceDeleted then stops the rest. */
static void delete_given_up(struct worker *w)
{
    char id[IDS_ID_MAX + 1] = "";
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n && !id[0]; i++)
        if (w->r[i].want_delete) {
            w->r[i].want_delete = false;
            snprintf(id, sizeof id, "%s", w->r[i].instance_id);
        }
    pthread_mutex_unlock(&w->mu);
    if (!id[0])
        return;
    struct command c;
    struct command_result res;
    command_init(&c, COMMAND_DELETE_INSTANCE);
    snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "%s", id);
    int rc = node_command(w->node, &c, WORKER_COMMAND_MS, &res);
    if (rc && rc != CAIRN_ENOTFOUND)
        log_warn("worker: deleting instance %s: %s", id, res.message);
    command_clear(&c);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    int64_t next = 0;
    while (!atomic_load(&w->stop)) {
        int64_t now = now_ms();
        bool due = w->replan_at_ms && now >= w->replan_at_ms;
        if (atomic_exchange(&w->dirty, false) || now >= next || due) {
            next = now + WORKER_REPLAN_MS;
            w->replan_at_ms = 0;
            replan(w);
        }
        /* Sleep until the next plan is due; node events and task starts wake the
         * supervisor's poll, and runners' sockets and timers end it on their own. */
        int64_t until = next;
        if (w->replan_at_ms && w->replan_at_ms < until)
            until = w->replan_at_ms;
        now = now_ms();
        int64_t wait = atomic_load(&w->dirty) ? 0 : until > now ? until - now : 0;
        if (supervisor_poll(w->sup, (int)wait) < 0) {
            struct timespec ts = {0, WORKER_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        delete_given_up(w);
        send_finishes(w);
    }
    /* Graceful end: ask each runner to stop, wait a bounded time. */
    pthread_mutex_lock(&w->mu);
    size_t n = w->n;
    char (*ids)[IDS_ID_MAX + 1] = calloc(n ? n : 1, sizeof *ids);
    for (size_t i = 0; ids && i < n; i++)
        snprintf(ids[i], sizeof ids[i], "%s", w->r[i].supervised ? w->r[i].id : "");
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; ids && i < n; i++)
        if (ids[i][0])
            supervisor_stop(w->sup, ids[i]);
    free(ids);
    int64_t deadline = now_ms() + WORKER_STOP_WAIT_MS;
    while (supervisor_count(w->sup) > 0 && now_ms() < deadline)
        supervisor_poll(w->sup, WORKER_POLL_MS);
    return NULL;
}

int worker_create(struct worker **out, const struct supervisor_config *sup, char *err, size_t errlen)
{
    *out = NULL;
    if (!sup || !sup->argv || !sup->argv[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "worker: the runner command is required");
    struct worker *w = calloc(1, sizeof *w);
    if (!w)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_init(&w->mu, NULL);
    w->sup_cfg = *sup;
    w->bodies = taskbody_create();
    int rc = w->bodies ? supervisor_create(&w->sup, &w->sup_cfg, on_sup_event, w, err, errlen)
                       : cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (rc) {
        taskbody_release(w->bodies);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int worker_start(struct worker *w, struct node *n, char *err, size_t errlen)
{
    if (w->started)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "worker: already started");
    w->node = n;
    snprintf(w->node_id, sizeof w->node_id, "%s", node_id(n));
    int rc = node_subscribe(n, on_node_event, w, &w->sub_token);
    if (rc)
        return cairn_fail(err, errlen, rc, "worker: cannot subscribe to the node's events");
    atomic_store(&w->dirty, true);
    node_set_task_body_sink(n, on_task_body, w);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
        node_set_task_body_sink(n, NULL, NULL);
        node_unsubscribe(n, w->sub_token);
        return cairn_fail(err, errlen, CAIRN_EIO, "worker: cannot start a thread");
    }
    w->started = true;
    return 0;
}

void worker_stop(struct worker *w)
{
    if (!w || !w->started || w->joined)
        return;
    node_set_task_body_sink(w->node, NULL, NULL); /* waits for a call in progress */
    atomic_store(&w->stop, true);
    supervisor_wake(w->sup); /* the thread may sleep up to WORKER_REPLAN_MS */
    pthread_join(w->thread, NULL);
    node_unsubscribe(w->node, w->sub_token);
    w->joined = true;
    supervisor_release(w->sup); /* kills what is left */
    w->sup = NULL;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n; i++)
        free(w->r[i].error);
    w->n = 0;
    pthread_mutex_unlock(&w->mu);
}

void worker_release(struct worker *w)
{
    if (!w)
        return;
    worker_stop(w);
    supervisor_release(w->sup);
    for (size_t i = 0; i < w->n; i++) {
        free(w->r[i].error);
        free(w->r[i].failed_error);
    }
    free(w->r);
    free(w->tasks);
    free(w->finish);
    while (w->n_waits)
        wait_drop(w, &w->waits[0]);
    free(w->waits);
    taskbody_release(w->bodies);
    free(w->carry);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

json_t *worker_runners_json(void *ctx)
{
    struct worker *w = ctx;
    if (!w->started)
        return NULL;
    json_t *arr = json_array();
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; arr && i < w->n; i++) {
        struct wrunner *x = &w->r[i];
        struct cluster_runner r = {0};
        snprintf(r.id, sizeof r.id, "%s", x->id);
        snprintf(r.instance_id, sizeof r.instance_id, "%s", x->instance_id);
        snprintf(r.node_id, sizeof r.node_id, "%s", w->node_id);
        r.status = x->status;
        r.error = x->status == CLUSTER_RUNNER_FAILED ? x->error : NULL;
        r.restart_count = x->restart_count;
        r.data_port = x->data_port;
        r.epoch = x->epoch;
        if (x->failed_unreported && x->status != CLUSTER_RUNNER_FAILED) {
            r.status = CLUSTER_RUNNER_FAILED;
            r.error = x->failed_error;
            r.restart_count = x->failed_restart_count;
            r.data_port = 0;
            node_report_now(w->node); /* its present status in the report after this one */
        }
        x->failed_unreported = false;
        json_t *j = cluster_runner_to_json(&r);
        if (!j || json_array_append_new(arr, j)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return arr;
}

pid_t worker_runner_pid(struct worker *w, const char *runner_id)
{
    pthread_mutex_lock(&w->mu);
    struct wrunner *x = find(w, runner_id);
    pid_t pid = x ? x->pid : 0;
    pthread_mutex_unlock(&w->mu);
    return pid;
}

size_t worker_count(struct worker *w)
{
    pthread_mutex_lock(&w->mu);
    size_t n = w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}
