/* The node (node.h): life, the node thread's loop and its dispatch of link messages, the
 * public accessors, subscribers, and task outputs and bodies. node_int.h says where the
 * rest lives. */
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/err.h"
#include "base/files.h"
#include "base/log.h"
#include "node/node_int.h"

#define HEARTBEAT_MS_DEFAULT 1000
#define LINK_SILENCE_MS_DEFAULT 3000
#define SYNC_DELAY_MS 300 /* after following a new master, before asking it for events */

/* A task output line waiting for the node thread to send it to another node. */
struct out_msg {
    struct out_msg *next;
    char dest[IDS_ID_MAX + 1];
    int type; /* NODE_T_TASK_OUTPUT or NODE_T_TASK_BODY */
    size_t len;
    char line[];
};

void node_wake(struct node *n)
{
    uint64_t one = 1;
    if (n->wake_fd >= 0) {
        ssize_t w = write(n->wake_fd, &one, sizeof one);
        (void)w; /* a full counter is awake anyway */
    }
}

static void drain_wake(struct node *n)
{
    uint64_t v;
    if (n->wake_fd >= 0) {
        ssize_t r = read(n->wake_fd, &v, sizeof v);
        (void)r;
    }
}

/* Sends the queued task outputs and bodies (node thread). A message to a node that is not
 * up is dropped: the requester's and the first rank's own deadlines fail its task. */
static void send_outputs(struct node *n)
{
    pthread_mutex_lock(&n->out_mu);
    struct out_msg *q = n->outq;
    n->outq = NULL;
    n->outq_tail = &n->outq;
    n->outq_bytes = 0;
    pthread_mutex_unlock(&n->out_mu);
    char last_dest[IDS_ID_MAX + 1] = "";
    int64_t now = q ? mono_ms() : 0;
    while (q) {
        struct out_msg *next = q->next;
        if (strcmp(last_dest, q->dest)) { /* the link to dest is busy: probes wait */
            struct perf *pf = node_perf_find(n, q->dest, false);
            if (pf)
                pf->last_output_ms = now;
            snprintf(last_dest, sizeof last_dest, "%s", q->dest);
        }
        int rc = link_send(n->link, q->dest, q->type, q->line, q->len);
        if (rc < 0)
            log_warn("node %s: task %s to %s lost (%s)", n->id, q->type == NODE_T_TASK_BODY ? "body" : "output",
                     q->dest, cairn_strerror(rc));
        free(q);
        q = next;
    }
}

void node_set_task_sink(struct node *n, node_task_output_fn fn, void *ctx)
{
    pthread_mutex_lock(&n->out_mu);
    n->sink = fn;
    n->sink_ctx = ctx;
    pthread_mutex_unlock(&n->out_mu);
}

void node_set_task_body_sink(struct node *n, node_task_output_fn fn, void *ctx)
{
    pthread_mutex_lock(&n->body_mu);
    n->body_sink = fn;
    n->body_sink_ctx = ctx;
    pthread_mutex_unlock(&n->body_mu);
}

static void deliver(struct node *n, int type, const char *from, const char *line, size_t len)
{
    if (type == NODE_T_TASK_BODY) {
        pthread_mutex_lock(&n->body_mu);
        if (n->body_sink)
            n->body_sink(n->body_sink_ctx, from, line, len);
        pthread_mutex_unlock(&n->body_mu);
        return;
    }
    pthread_mutex_lock(&n->out_mu);
    node_task_output_fn fn = n->sink;
    void *ctx = n->sink_ctx;
    pthread_mutex_unlock(&n->out_mu);
    if (fn)
        fn(ctx, from, line, len);
}

static int send_task_msg(struct node *n, int type, const char *dest, const char *line, size_t len)
{
    if (!strcmp(dest, n->id)) {
        deliver(n, type, n->id, line, len);
        return 0;
    }
    struct out_msg *m = malloc(sizeof *m + len);
    if (!m)
        return CAIRN_ENOMEM;
    m->next = NULL;
    snprintf(m->dest, sizeof m->dest, "%s", dest);
    m->type = type;
    m->len = len;
    memcpy(m->line, line, len);
    pthread_mutex_lock(&n->out_mu);
    if (n->outq_bytes + len > NODE_MAX_OUTPUT_QUEUE) {
        pthread_mutex_unlock(&n->out_mu);
        free(m);
        return CAIRN_EFULL;
    }
    *n->outq_tail = m;
    n->outq_tail = &m->next;
    n->outq_bytes += len;
    pthread_mutex_unlock(&n->out_mu);
    node_wake(n);
    return 0;
}

int node_send_task_output(struct node *n, const char *dest, const char *line, size_t len)
{
    return send_task_msg(n, NODE_T_TASK_OUTPUT, dest, line, len);
}

int node_send_task_body(struct node *n, const char *dest, const char *body, size_t len)
{
    return send_task_msg(n, NODE_T_TASK_BODY, dest, body, len);
}

/* ---- node id ---- */

static int read_id_file(const char *path, char *id, char *err, size_t errlen)
{
    char buf[IDS_ID_MAX + 4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? CAIRN_ENOTFOUND
                               : cairn_fail(err, errlen, CAIRN_EIO, "open %s: %s", path, strerror(errno));
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "read %s: %s", path, strerror(errno));
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = 0;
    if (!ids_valid_id(buf) || !link_valid_id(buf))
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "%s does not hold a node id (1..63 bytes of A-Z a-z 0-9 . _ : -)", path);
    memcpy(id, buf, (size_t)n + 1);
    return 0;
}

int node_load_id(const char *data_dir, char *id, char *err, size_t errlen)
{
    char path[4096], tmp[4200];
    int rc = files_make_dirs(data_dir, 0700, err, errlen);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/node_id", data_dir);
    rc = read_id_file(path, id, err, errlen);
    if (rc != CAIRN_ENOTFOUND)
        return rc;
    char fresh[IDS_ID_MAX + 1];
    if ((rc = ids_random(fresh, err, errlen)))
        return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "create %s: %s", tmp, strerror(errno));
    size_t len = strlen(fresh);
    fresh[len] = '\n';
    bool ok = write(fd, fresh, len + 1) == (ssize_t)(len + 1) && fsync(fd) == 0;
    fresh[len] = 0;
    close(fd);
    /* link() never replaces: of two nodes racing on one dir, both read the winner's id. */
    if (!ok || (link(tmp, path) != 0 && errno != EEXIST)) {
        int e = errno;
        unlink(tmp);
        return cairn_fail(err, errlen, CAIRN_EIO, "write %s: %s", path, strerror(e));
    }
    unlink(tmp);
    /* The id's name in the folder must survive a power cut too: sync the folder. */
    if (files_sync(data_dir, O_RDONLY | O_DIRECTORY))
        return cairn_fail(err, errlen, CAIRN_EIO, "sync %s: %s", data_dir, strerror(errno));
    return read_id_file(path, id, err, errlen);
}

/* ---- subscribers ---- */

int node_subscribe(struct node *n, node_event_fn fn, void *ctx, uint64_t *token)
{
    pthread_mutex_lock(&n->sub_mu);
    if (n->n_subs >= NODE_MAX_SUBSCRIBERS) {
        pthread_mutex_unlock(&n->sub_mu);
        return CAIRN_EFULL;
    }
    struct sub *s = &n->subs[n->n_subs++];
    s->token = ++n->next_token;
    s->fn = fn;
    s->ctx = ctx;
    *token = s->token;
    pthread_mutex_unlock(&n->sub_mu);
    return 0;
}

void node_unsubscribe(struct node *n, uint64_t token)
{
    pthread_mutex_lock(&n->sub_mu);
    for (size_t i = 0; i < n->n_subs; i++) {
        if (n->subs[i].token == token) {
            n->subs[i] = n->subs[--n->n_subs];
            break;
        }
    }
    pthread_mutex_unlock(&n->sub_mu);
}

void node_notify(struct node *n, const char *json, int64_t term, int64_t index)
{
    pthread_mutex_lock(&n->sub_mu);
    for (size_t i = 0; i < n->n_subs; i++)
        n->subs[i].fn(n->subs[i].ctx, json, strlen(json), term, index);
    pthread_mutex_unlock(&n->sub_mu);
}

/* ---- state access ---- */

void node_report_now(struct node *n)
{
    atomic_store(&n->report_asked, true);
    node_wake(n);
}

static void copy_into(void *ctx, const struct cluster_state *s)
{
    *(struct cluster_state **)ctx = cluster_state_copy(s);
}

struct cluster_state *node_state_copy(struct node *n)
{
    struct cluster_state *s = NULL;
    node_read_state(n, copy_into, &s);
    return s;
}

void node_read_state(struct node *n, void (*fn)(void *ctx, const struct cluster_state *s),
                     void *ctx)
{
    pthread_mutex_lock(&n->mu);
    fn(ctx, n->state);
    pthread_mutex_unlock(&n->mu);
}

void node_get_status(struct node *n, struct node_status *st)
{
    pthread_mutex_lock(&n->mu);
    *st = n->status;
    pthread_mutex_unlock(&n->mu);
    st->api_port = atomic_load(&n->api_port);
}

const char *node_id(const struct node *n) { return n->id; }
int node_cluster_port(const struct node *n) { return link_port(n->link); }
void node_set_api_port(struct node *n, int port) { atomic_store(&n->api_port, port); }

/* Refreshes what node_get_status returns (node thread). */
static void update_status(struct node *n)
{
    struct link_peer peers[1];
    struct node_status st;
    memset(&st, 0, sizeof st);
    snprintf(st.node_id, sizeof st.node_id, "%s", n->id);
    enum election_role role = election_role(n->el);
    st.role = election_role_name(role);
    st.is_master = role == ELECTION_MASTER;
    st.term = election_term(n->el);
    if (role == ELECTION_MASTER || (role == ELECTION_FOLLOWER && election_confirmed(n->el)))
        snprintf(st.master, sizeof st.master, "%s", election_master(n->el));
    st.cluster_port = link_port(n->link);
    st.n_peers = link_peers(n->link, peers, 0);
    int64_t now = mono_ms();
    struct link_peer *all = NULL;
    size_t k = 0;
    if (now - n->peer_addrs_ms >= 250 && (all = malloc(NODE_MAX_PEERS * sizeof *all))) {
        n->peer_addrs_ms = now;
        k = link_peers(n->link, all, NODE_MAX_PEERS);
        k = k < NODE_MAX_PEERS ? k : NODE_MAX_PEERS;
    }
    pthread_mutex_lock(&n->mu);
    if (all) {
        n->n_peer_addrs = 0;
        for (size_t i = 0; i < k; i++) {
            if (!ids_valid_id(all[i].id) || !all[i].addr[0])
                continue;
            struct peer_addr *p = &n->peer_addrs[n->n_peer_addrs++];
            snprintf(p->id, sizeof p->id, "%s", all[i].id);
            snprintf(p->addr, sizeof p->addr, "%s", all[i].addr);
        }
    }
    st.last_term = n->state->last_term;
    st.last_index = n->state->last_index;
    n->status = st;
    pthread_mutex_unlock(&n->mu);
    free(all);
}

bool node_peer_addr(struct node *n, const char *peer_id, char *out, size_t len)
{
    bool found = false;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < n->n_peer_addrs && !found; i++)
        if ((found = !strcmp(n->peer_addrs[i].id, peer_id)))
            snprintf(out, len, "%s", n->peer_addrs[i].addr);
    pthread_mutex_unlock(&n->mu);
    return found;
}

const char *node_dataplane_secret(const struct node *n) { return n->dp_secret; }

const char *node_bind_addr(const struct node *n) { return n->bind_addr ? n->bind_addr : ""; }
const struct cluster_kv *node_place_kv(const struct node *n) { return &n->place_kv; }

/* ---- sending ---- */

void node_send_json(struct node *n, const char *to, int type, json_t *j)
{
    if (!j)
        return;
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (text)
        link_send(n->link, to, type, text, strlen(text));
    free(text);
}

/* A well-framed message from peer whose payload is malformed ("what: why"): a strike
 * against its connection (link.h: cut after LINK_MAX_STRIKES). */
void node_strike(struct node *n, const char *peer, const char *what, const char *why)
{
    char line[600];
    snprintf(line, sizeof line, "%s%s%s", what, why ? ": " : "", why ? why : "");
    link_strike(n->link, peer, line);
}

static void election_send(void *ctx, const char *to, const char *json, size_t len)
{
    struct node *n = ctx;
    link_send(n->link, to, LINK_T_ELECTION, json, len);
}

/* The master to talk to: "" when none is known and reachable; ourselves when master. */
const char *node_current_master(struct node *n)
{
    enum election_role role = election_role(n->el);
    if (role == ELECTION_MASTER)
        return n->id;
    if (role == ELECTION_FOLLOWER && election_confirmed(n->el) &&
        link_peer_up(n->link, election_master(n->el)))
        return election_master(n->el);
    return "";
}

bool node_is_master(struct node *n) { return election_role(n->el) == ELECTION_MASTER; }

/* ---- election outcomes ---- */

static void after_election(struct node *n, int64_t now)
{
    enum election_role role = election_role(n->el);
    int64_t term = election_term(n->el);
    const char *m = election_master(n->el);
    bool confirmed = election_confirmed(n->el);
    if (role == ELECTION_MASTER && n->master_term != term)
        node_start_term(n, term, now);
    if (role != ELECTION_MASTER)
        n->master_term = 0;
    bool changed = strcmp(n->followed, m) || n->followed_term != term;
    if (role == ELECTION_FOLLOWER && confirmed && (changed || !n->followed_confirmed)) {
        /* A new master: tell it what we are, and catch up with it unless the start of its
         * term (which a new master sends to all) brings us there first. */
        n->sync_at = now + SYNC_DELAY_MS;
        n->report_due = true;
        n->last_report_ms = 0;
    }
    if (role != ELECTION_FOLLOWER || !confirmed)
        n->sync_at = 0;
    snprintf(n->followed, sizeof n->followed, "%s", m);
    n->followed_term = term;
    n->followed_confirmed = confirmed;
}

/* ---- the loop ---- */

static void on_message(struct node *n, const struct link_msg *msg, int64_t now)
{
    char err[256];
    switch (msg->event) {
    case LINK_EV_PEER_UP:
        node_note_left(n, msg->peer, false); /* back (a new process, or it never went) */
        election_peer_up(n->el, msg->peer, now);
        node_gossip(n, NULL, now);
        node_probe_plan(n, msg->peer, now);
        if (node_is_master(n)) {
            struct heard *h = node_heard_find(n, msg->peer, true, now);
            if (h)
                h->ms = now;
        }
        return;
    case LINK_EV_PEER_DOWN:
        election_peer_down(n->el, msg->peer, now);
        node_probe_stop(n, msg->peer);
        return;
    case LINK_EV_MESSAGE:
        break;
    default:
        return;
    }
    const char *data = msg->data ? msg->data : "";
    switch (msg->type) {
    case LINK_T_ELECTION: {
        json_t *j = json_loadb(data, msg->len, JSON_REJECT_DUPLICATES, NULL);
        int rc = j ? election_receive(n->el, msg->peer, j, now, err, sizeof err) : CAIRN_EFORMAT;
        if (rc == CAIRN_EFORMAT || rc == CAIRN_ENOTFOUND)
            node_strike(n, msg->peer, "bad election message", j ? err : "not JSON");
        else if (rc)
            log_warn("node %s: election message from %s: %s", n->id, msg->peer, err);
        json_decref(j);
        break;
    }
    case LINK_T_EVENT:
        node_on_event(n, msg->peer, data, msg->len, now);
        break;
    case LINK_T_SNAPSHOT:
        node_on_snapshot(n, msg->peer, data, msg->len);
        break;
    case LINK_T_EVENT_REQUEST:
        if (node_is_master(n)) {
            json_t *j = json_loadb(data, msg->len, JSON_REJECT_DUPLICATES, NULL);
            if (j)
                node_serve_request(n, msg->peer, j);
            else
                node_strike(n, msg->peer, "event request", "not JSON");
            json_decref(j);
        }
        break;
    case LINK_T_COMMAND:
        node_run_remote_command(n, msg->peer, data, msg->len);
        break;
    case LINK_T_REPORT:
        if (node_is_master(n)) {
            json_t *j = json_loadb(data, msg->len, JSON_REJECT_DUPLICATES, NULL);
            if (j)
                node_run_report(n, msg->peer, j);
            else
                node_strike(n, msg->peer, "report", "not JSON");
            json_decref(j);
            struct heard *h = node_heard_find(n, msg->peer, true, now);
            if (h)
                h->ms = now;
        }
        break;
    case NODE_T_COMMAND_RESULT:
        node_on_result(n, msg->peer, data, msg->len);
        break;
    case NODE_T_CONTROL:
        node_on_control(n, msg->peer, data, msg->len, now);
        break;
    case NODE_T_TASK_OUTPUT:
    case NODE_T_TASK_BODY:
        deliver(n, msg->type, msg->peer, data, msg->len);
        break;
    case NODE_T_PROBE:
        node_on_probe(n, msg->peer, msg->data, msg->len);
        break;
    default:
        snprintf(err, sizeof err, "%d", msg->type);
        node_strike(n, msg->peer, "message of unknown type", err);
    }
}

static void periodic(struct node *n, int64_t now)
{
    election_tick(n->el, now);
    after_election(n, now);
    node_check_sync(n, now);
    node_discover(n, now);
    if (now >= n->next_gossip_ms) {
        n->next_gossip_ms = now + NODE_GOSSIP_INTERVAL_MS;
        node_gossip(n, NULL, now);
    }
    if (node_is_master(n))
        node_master_tick(n, now);
    node_send_probes(n, now);
    node_maybe_report(n, now);
    drain_wake(n);
    node_run_pendings(n, now);
    send_outputs(n);
    update_status(n);
}

static void due_at(int64_t *due, int64_t t)
{
    if (t < *due)
        *due = t;
}

/* Milliseconds the node thread may sleep: until the earliest deadline of periodic() and
 * of the election, at most NODE_POLL_MS. Everything else that gives the thread work
 * wakes it: link messages and peer notices, discovery's socket, and the eventfd that
 * commands, task outputs, report requests and node_leave write to. A deadline that has
 * passed is acted on by the pass that computes it, so this is 0 only while work waits. */
static int64_t next_wait_ms(struct node *n, int64_t now)
{
    int64_t due = now + NODE_POLL_MS;
    due_at(&due, now + election_due_ms(n->el, now));
    due_at(&due, n->next_gossip_ms);
    due_at(&due, n->next_info_ms);
    if (n->sync_at)
        due_at(&due, n->sync_at);
    if (node_is_master(n)) {
        due_at(&due, n->next_timeout_ms);
        due_at(&due, n->next_head_ms);
    }
    if (n->report_due && !n->leaving)
        due_at(&due, n->last_report_ms + NODE_REPORT_MIN_MS);
    for (size_t i = 0; i < n->n_perfs; i++) {
        const struct perf *p = &n->perfs[i];
        if (p->probing)
            due_at(&due, p->probe_sent_ns / 1000000 + NODE_PROBE_TIMEOUT_MS);
        else if (p->next_probe_ms)
            due_at(&due, p->next_probe_ms);
    }
    if (n->leaving && !atomic_load(&n->leave_done))
        due_at(&due, n->leave_deadline_ms);
    int64_t beacon = discovery_due_ms(n->disc);
    if (beacon >= 0)
        due_at(&due, now + beacon);
    /* Commands queued for a master that is not known yet or could not be sent to: they
     * are retried (and time out after NODE_NO_MASTER_WAIT_MS) on a short beat. */
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next)
        if (p->st == P_QUEUED)
            due_at(&due, now + NODE_RETRY_MS);
    pthread_mutex_unlock(&n->pend_mu);
    return due > now ? due - now : 0;
}

static void *node_main(void *arg)
{
    struct node *n = arg;
    struct link_msg msg;
    while (!atomic_load(&n->stop)) {
        int64_t now = mono_ms();
        int64_t wait = next_wait_ms(n, now);
        int rc = link_poll(n->link, (int)wait, &msg);
        for (int i = 0; rc == 1 && i < 256; i++) {
            now = mono_ms();
            on_message(n, &msg, now);
            after_election(n, now);
            if (atomic_load(&n->stop))
                break;
            rc = link_poll(n->link, 0, &msg);
        }
        if (rc < 0) {
            log_error("node %s: link poll failed (%d)", n->id, rc);
            struct timespec ts = {0, NODE_RETRY_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        periodic(n, mono_ms());
        if (atomic_load(&n->leave_asked) && !atomic_load(&n->leave_done)) {
            int64_t now = mono_ms();
            if (!n->leaving)
                node_start_leave(n, now);
            if (n->n_leave_wait == 0 || now >= n->leave_deadline_ms) {
                if (n->n_leave_wait)
                    log_warn("node %s: %d peers did not acknowledge our leave", n->id, n->n_leave_wait);
                atomic_store(&n->leave_done, true);
            }
        }
    }
    return NULL;
}

/* A download's status changed: the next report carries it (NODE_REPORT_MIN_MS apart). */
static void downloads_changed(void *ctx) { node_report_now(ctx); }

/* ---- life ---- */

int node_create(struct node **out, const struct node_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !cfg->data_dir || !cfg->data_dir[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "node: a data dir is required");
    if (cfg->memory_limit < 0 || cfg->node_timeout_ms < 0 || cfg->api_port < 0 ||
        cfg->api_port > 65535 || cfg->probe_interval_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "node: bad memory limit, timeout, port or probe interval");
    struct node *n = calloc(1, sizeof *n);
    if (!n)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->cat_mu, NULL);
    pthread_mutex_init(&n->sub_mu, NULL);
    pthread_mutex_init(&n->pend_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->pend_cv, &ca);
    pthread_condattr_destroy(&ca);
    n->force_master = cfg->force_master;
    n->worker = cfg->worker;
    n->runners = cfg->runners;
    n->runners_ctx = cfg->runners_ctx;
    n->memory_limit = cfg->memory_limit;
    n->node_timeout_ms = cfg->node_timeout_ms ? cfg->node_timeout_ms : NODE_TIMEOUT_MS_DEFAULT;
    n->probe_interval_ms = cfg->probe_interval_ms ? cfg->probe_interval_ms : NODE_PROBE_INTERVAL_MS;
    n->probe_buf = calloc(1, NODE_PROBE_BYTES);
    atomic_store(&n->api_port, cfg->api_port);
    n->since_ms = wall_ms();
    n->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&n->out_mu, NULL);
    pthread_mutex_init(&n->body_mu, NULL);
    n->outq_tail = &n->outq;
    n->env.card = node_card_placeable;
    n->env.draft_check = node_draft_check;
    n->env.card_ctx = n;
    int rc;
    n->data_dir = strdup(cfg->data_dir);
    n->models_dir = cfg->models_dir ? strdup(cfg->models_dir) : NULL;
    size_t plen = strlen(cfg->data_dir) + sizeof "/events.db";
    n->log_path = malloc(plen);
    n->state = cluster_state_create();
    n->peer_addrs = calloc(NODE_MAX_PEERS, sizeof *n->peer_addrs);
    n->bind_addr = cfg->bind_addr ? strdup(cfg->bind_addr) : NULL;
    n->place_kv = cfg->place_kv;
    if (cfg->secret && cfg->secret[0] && sodium_init() >= 0) {
        /* runners get a key derived from the cluster secret, never the secret itself */
        static const char label[] = "cairn data plane v1";
        unsigned char mac[crypto_auth_hmacsha256_BYTES];
        crypto_auth_hmacsha256_state hs;
        crypto_auth_hmacsha256_init(&hs, (const unsigned char *)cfg->secret, strlen(cfg->secret));
        crypto_auth_hmacsha256_update(&hs, (const unsigned char *)label, sizeof label - 1);
        crypto_auth_hmacsha256_final(&hs, mac);
        sodium_bin2hex(n->dp_secret, sizeof n->dp_secret, mac, sizeof mac);
    }
    if (!n->data_dir || !n->peer_addrs || !n->probe_buf || (cfg->bind_addr && !n->bind_addr) || (cfg->models_dir && !n->models_dir) ||
        !n->log_path || !n->state) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(n->log_path, plen, "%s/events.db", cfg->data_dir);
    if ((rc = node_load_id(cfg->data_dir, n->id, err, errlen)))
        goto fail;
    if (n->models_dir && (rc = catalog_create(&n->catalog, n->models_dir, err, errlen)))
        goto fail;
    struct download_config dlc = {.models_dir = n->models_dir, .node_id = n->id, .secret = cfg->secret,
                                  .api_key = cfg->api_key};
    if (n->models_dir && (rc = download_mgr_create(&n->downloads, &dlc, downloads_changed, n, err, errlen)))
        goto fail;
    if ((rc = node_hub_create(n, err, errlen)))
        goto fail;
    if ((rc = node_log_open(n, err, errlen)))
        goto fail;
    struct link_config lc = {
        .node_id = n->id,
        .ns = cfg->ns,
        .secret = cfg->secret,
        .bind_addr = cfg->bind_addr,
        .port = cfg->cluster_port,
        .heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : HEARTBEAT_MS_DEFAULT,
        .timeout_ms = cfg->link_timeout_ms ? cfg->link_timeout_ms : LINK_SILENCE_MS_DEFAULT,
    };
    if ((rc = link_create(&n->link, &lc, err, errlen)))
        goto fail;
    link_set_wake_fd(n->link, 0, n->wake_fd);
    for (size_t i = 0; i < cfg->n_peers; i++) {
        char ep[LINK_ADDR_MAX];
        const char *p = cfg->peers[i];
        if (!p || snprintf(ep, sizeof ep, "%s%s", strncmp(p, "tcp://", 6) ? "tcp://" : "", p) >=
                      (int)sizeof ep) {
            rc = cairn_fail(err, errlen, CAIRN_EINVAL, "peer: too long");
            goto fail;
        }
        if ((rc = link_connect(n->link, ep, err, errlen)))
            goto fail;
    }
    struct election_config ec = {
        .node_id = n->id,
        .force_master = cfg->force_master,
        .since_ms = n->since_ms,
        .term = n->state->last_term,
        .send = election_send,
        .send_ctx = n,
    };
    if ((rc = election_create(&n->el, &ec, mono_ms(), err, errlen)))
        goto fail;
    if (cfg->discovery && strcmp(cfg->discovery, "off")) {
        struct discovery_config dc = {
            .node_id = n->id,
            .ns = cfg->ns,
            .secret = cfg->secret,
            .mode = cfg->discovery,
            .api_port = cfg->api_port,
            .cluster_port = link_port(n->link),
        };
        if ((rc = discovery_create(&n->disc, &dc, err, errlen)))
            goto fail;
        link_set_wake_fd(n->link, 1, discovery_fd(n->disc)); /* beacons wake the loop */
    }
    update_status(n);
    log_info("node %s: cluster port %d, data in %s, models in %s", n->id, link_port(n->link),
             n->data_dir, n->models_dir ? n->models_dir : "(none)");
    *out = n;
    return 0;
fail:
    node_release(n);
    return rc;
}

int node_start(struct node *n, char *err, size_t errlen)
{
    if (n->running)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "node already started");
    int e = pthread_create(&n->thread, NULL, node_main, n);
    if (e)
        return cairn_fail(err, errlen, CAIRN_EIO, "node thread: %s", strerror(e));
    n->running = true;
    return 0;
}

void node_leave(struct node *n)
{
    if (!n || !n->running)
        return;
    atomic_store(&n->leave_asked, true);
    node_wake(n);
    /* the node thread gives up after NODE_LEAVE_WAIT_MS; this bound only guards it */
    for (int i = 0; i < (NODE_LEAVE_WAIT_MS + 2000) / 10 && !atomic_load(&n->leave_done); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void node_stop(struct node *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->pend_mu);
    n->stopped = true;
    pthread_mutex_unlock(&n->pend_mu);
    if (n->running) {
        atomic_store(&n->stop, true);
        pthread_join(n->thread, NULL);
        n->running = false;
    }
    node_fail_pendings(n);
    discovery_release(n->disc);
    n->disc = NULL;
    link_release(n->link);
    n->link = NULL;
    eventlog_close(n->log);
    n->log = NULL;
}

void node_release(struct node *n)
{
    if (!n)
        return;
    node_stop(n);
    node_hub_release(n); /* before the downloads: its jobs note into them */
    download_mgr_release(n->downloads); /* cancels a fetch in progress; its partial file stays */
    /* Callers wait on pend_cv only inside node_command, which they finish before. */
    election_release(n->el);
    catalog_release(n->catalog);
    cluster_state_release(n->state);
    json_decref(n->reported_edges);
    free(n->heard);
    free(n->perfs);
    free(n->probe_buf);
    free(n->data_dir);
    free(n->models_dir);
    free(n->log_path);
    free(n->peer_addrs);
    free(n->bind_addr);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->cat_mu);
    pthread_mutex_destroy(&n->sub_mu);
    pthread_mutex_destroy(&n->pend_mu);
    pthread_cond_destroy(&n->pend_cv);
    for (struct out_msg *q = n->outq, *next; q; q = next) {
        next = q->next;
        free(q);
    }
    pthread_mutex_destroy(&n->out_mu);
    pthread_mutex_destroy(&n->body_mu);
    if (n->wake_fd >= 0)
        close(n->wake_fd);
    free(n);
}
