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

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "net/discovery.h"
#include "ctl/election.h"
#include "node/eventlog.h"
#include "net/link.h"
#include "node/nodeinfo.h"
#include "gguf/vocab.h"

#define HEARTBEAT_MS_DEFAULT 1000
#define LINK_SILENCE_MS_DEFAULT 3000
#define REQUEST_RETRY_MS 500
#define CATALOG_RESCAN_MS 1000
#define SYNC_DELAY_MS 300 /* after following a new master, before asking it for events */

enum pending_state { P_QUEUED, P_SENT, P_WAIT_STATE, P_DONE };

/* A command an API thread waits on; the node thread moves it along. */
struct pending {
    struct pending *next;
    struct command *cmd; /* the waiting caller's */
    enum pending_state st;
    char sent_to[IDS_ID_MAX + 1];
    int64_t queued_ms;
    struct command_result res;
};

struct sub {
    uint64_t token;
    node_event_fn fn;
    void *ctx;
};

struct heard {
    char id[IDS_ID_MAX + 1];
    int64_t ms;
};

/* What this node measured of its link to one peer: the round trip of pings, the
 * throughput of probes (one in flight at a time), when it last sent the peer outputs. */
struct perf {
    char id[IDS_ID_MAX + 1];
    int64_t rtt_us;         /* smoothed; 0 = not measured */
    int64_t tput;           /* bytes per second, smoothed; 0 = not measured */
    bool probing;           /* a probe waits for its ack */
    uint64_t probe_seq;     /* of the probe in flight (or the last one) */
    int64_t probe_sent_ns;  /* clock_ns when it left */
    int64_t next_probe_ms;  /* 0 = none planned (peer not up) */
    int64_t probe_every_ms; /* probe_interval_ms, doubled while the figure holds steady */
    int64_t told_ms;        /* first told of it while not linked (should_connect); 0 = not */
    int64_t last_output_ms; /* task outputs sent to it: the link is busy */
};

/* A peer's address as its cluster link sees it: where we connected, or where it came from. */
struct peer_addr {
    char id[IDS_ID_MAX + 1];
    char addr[LINK_ADDR_MAX];
};

struct node {
    char id[IDS_ID_MAX + 1];
    char *data_dir, *models_dir, *log_path;
    bool force_master, worker;
    node_runners_fn runners;
    void *runners_ctx;
    atomic_bool report_asked;
    int64_t memory_limit;
    int node_timeout_ms;
    atomic_int api_port;
    int64_t since_ms; /* wall clock at start: seniority */

    struct link *link;
    struct election *el;
    struct eventlog *log;
    struct discovery *disc;

    pthread_mutex_t cat_mu;
    struct catalog *catalog;
    struct download_mgr *downloads; /* NULL without a models dir */
    int64_t cat_scanned_ms;
    struct master_env env;

    pthread_mutex_t mu; /* state, status and peer addresses */
    struct cluster_state *state;
    struct node_status status;
    struct peer_addr *peer_addrs; /* the links' peers as the node thread last saw them */
    size_t n_peer_addrs;
    int64_t peer_addrs_ms;
    char dp_secret[65];           /* data-plane secret (hex), "" without a cluster secret */
    char *bind_addr;              /* the cluster's bind address, NULL = every interface */

    pthread_t thread;
    bool running;
    atomic_bool stop;
    atomic_bool leave_asked; /* node_leave: say leave to the peers */
    atomic_bool leave_done;  /* every live peer acknowledged it, or the wait ran out */

    pthread_mutex_t pend_mu;
    pthread_cond_t pend_cv;
    struct pending *pend;
    uint64_t next_cmd;
    bool stopped; /* under pend_mu: no more commands */

    int wake_fd; /* eventfd: other threads wake the node thread (commands, outputs) */
    pthread_mutex_t out_mu; /* task outputs for other nodes, sent by the node thread */
    struct out_msg *outq, **outq_tail;
    size_t outq_bytes;
    node_task_output_fn sink;
    void *sink_ctx;
    pthread_mutex_t body_mu; /* held while the body sink runs: unsetting it waits for the call */
    node_task_output_fn body_sink;
    void *body_sink_ctx;

    pthread_mutex_t sub_mu;
    struct sub subs[NODE_MAX_SUBSCRIBERS];
    size_t n_subs;
    uint64_t next_token;

    /* node thread only */
    int64_t master_term;  /* the term we started as master; 0 when not master */
    char followed[IDS_ID_MAX + 1];
    int64_t followed_term;
    bool followed_confirmed;
    struct heard *heard;
    size_t n_heard, cap_heard;
    /* Peers that said they leave (node_leave): the master times them out at once instead
     * of after node_timeout_ms. Kept across terms, so the next master knows who left when
     * the leaver was the master; dropped when the peer comes back. */
    char left[NODE_LEFT_MAX][IDS_ID_MAX + 1];
    int n_left;
    /* Our own leave: the peers still to acknowledge it, until leave_deadline_ms. */
    bool leaving;
    char leave_wait[NODE_LEFT_MAX][IDS_ID_MAX + 1];
    int n_leave_wait;
    int64_t leave_deadline_ms;
    int64_t next_timeout_ms, next_head_ms, next_gossip_ms, next_info_ms;
    int64_t since_snapshot;
    int64_t last_request_ms;
    int64_t sync_at;      /* when to check we caught up with a new master; 0 = no check */
    struct node_info info;      /* last gathered */
    struct node_info reported;  /* last reported */
    bool has_info, has_reported, report_due;
    int64_t last_report_ms;
    json_t *reported_edges;
    struct perf *perfs;
    size_t n_perfs, cap_perfs;
    int probe_interval_ms;
    uint64_t next_probe_seq;
    uint8_t *probe_buf; /* NODE_PROBE_BYTES: a probe's payload (its sequence number, zeros) */
};

static int64_t mono_ms(void) { return clock_ns() / 1000000; }

/* A task output line waiting for the node thread to send it to another node. */
struct out_msg {
    struct out_msg *next;
    char dest[IDS_ID_MAX + 1];
    int type; /* NODE_T_TASK_OUTPUT or NODE_T_TASK_BODY */
    size_t len;
    char line[];
};

static void wake_node(struct node *n)
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

static struct perf *perf_find(struct node *n, const char *id, bool create);

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
            struct perf *pf = perf_find(n, q->dest, false);
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
    wake_node(n);
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

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- node id ---- */

/* mkdir -p; 0 or CAIRN_EIO. */
static int make_dirs(const char *path, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return cairn_fail(err, errlen, CAIRN_EIO, "path too long: %.64s...", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return cairn_fail(err, errlen, CAIRN_EIO, "mkdir %s: %s", buf, strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    return 0;
}

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
    int rc = make_dirs(data_dir, err, errlen);
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
    return read_id_file(path, id, err, errlen);
}

/* ---- catalog ---- */

int node_card(void *ctx, const char *model_id, struct catalog_card *out, char *err,
              size_t errlen)
{
    struct node *n = ctx;
    memset(out, 0, sizeof *out);
    if (!n->catalog)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s not found (no models folder)",
                          model_id);
    pthread_mutex_lock(&n->cat_mu);
    int64_t now = mono_ms();
    const struct catalog_card *c = catalog_find(n->catalog, model_id);
    if (!c || now - n->cat_scanned_ms >= CATALOG_RESCAN_MS) {
        char why[256];
        if (catalog_scan(n->catalog, why, sizeof why))
            log_warn("node %s: models folder: %s", n->id, why);
        n->cat_scanned_ms = now;
        c = catalog_find(n->catalog, model_id);
    }
    int rc = 0;
    if (!c)
        rc = cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s not found in %s", model_id,
                        catalog_dir(n->catalog));
    else if (c->error)
        rc = cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "model %s cannot be used: %s", model_id,
                        c->error);
    else if (catalog_card_copy(out, c))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_unlock(&n->cat_mu);
    return rc;
}

const struct master_env *node_master_env(const struct node *n) { return &n->env; }

struct download_mgr *node_downloads(struct node *n) { return n->downloads; }

/* A download's status changed: the next report carries it (NODE_REPORT_MIN_MS apart). */
static void downloads_changed(void *ctx) { node_report_now(ctx); }

struct models_ctx {
    json_t *arr;
    bool oom;
};

static void add_model_nodes(void *ctx, const struct cluster_state *s)
{
    struct models_ctx *m = ctx;
    for (size_t i = 0; i < json_array_size(m->arr); i++) {
        json_t *card = json_array_get(m->arr, i);
        json_t *nodes = json_object_get(card, "nodes");
        const char *id = json_string_value(json_object_get(card, "id"));
        for (size_t k = 0; id && k < s->n_downloads; k++) {
            const struct cluster_download *d = &s->downloads[k];
            if (d->status == CLUSTER_DOWNLOAD_COMPLETED && !strcmp(d->model_id, id) &&
                json_array_append_new(nodes, json_string(d->node_id)))
                m->oom = true;
        }
    }
}

json_t *node_models_json(struct node *n)
{
    json_t *arr = json_array();
    if (!arr || !n->catalog)
        return arr;
    pthread_mutex_lock(&n->cat_mu);
    char why[256];
    if (catalog_scan(n->catalog, why, sizeof why))
        log_warn("node %s: models folder: %s", n->id, why);
    n->cat_scanned_ms = mono_ms();
    bool oom = false;
    for (size_t i = 0; i < catalog_count(n->catalog) && !oom; i++) {
        const struct catalog_card *c = catalog_at(n->catalog, i);
        json_t *j = catalog_card_to_json(c);
        json_t *nodes = json_array();
        oom = !j || !nodes || json_array_append_new(nodes, json_string(n->id)) ||
              json_object_set_new(j, "nodes", nodes) || json_array_append_new(arr, j);
        if (oom && !j)
            json_decref(nodes);
    }
    pthread_mutex_unlock(&n->cat_mu);
    struct models_ctx m = {.arr = arr, .oom = oom};
    if (!oom)
        node_read_state(n, add_model_nodes, &m);
    if (m.oom) {
        json_decref(arr);
        return NULL;
    }
    return arr;
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

static void notify(struct node *n, const char *json, int64_t term, int64_t index)
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
    wake_node(n);
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
const char *node_log_path(const struct node *n) { return n->log_path; }

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

/* ---- the log ---- */

/* JSON text of a snapshot event of the current state at its position (malloc'd). */
static char *snapshot_json(struct node *n, int64_t term, int64_t index)
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
    char *text = snapshot_json(n, n->state->last_term, n->state->last_index);
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
static int log_open(struct node *n, char *err, size_t errlen)
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

static bool pos_reached(const struct cluster_state *s, int64_t term, int64_t index)
{
    return s->last_term > term || (s->last_term == term && s->last_index >= index);
}

/* Marks done the pendings waiting for a position the state has reached (pend_mu held). */
static bool settle_pendings(struct node *n)
{
    bool any = false;
    for (struct pending *p = n->pend; p; p = p->next) {
        if (p->st == P_WAIT_STATE && pos_reached(n->state, p->res.term, p->res.index)) {
            p->st = P_DONE;
            any = true;
        }
    }
    return any;
}

static void wake_pendings(struct node *n)
{
    pthread_mutex_lock(&n->pend_mu);
    if (settle_pendings(n))
        pthread_cond_broadcast(&n->pend_cv);
    pthread_mutex_unlock(&n->pend_mu);
}

/* Applies e (JSON text json) to the state, logs it and tells the subscribers. */
static int take_event(struct node *n, const struct event *e, const char *json)
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
    notify(n, json, e->term, e->index);
    return 0;
}

/* Master: numbers, applies, logs and broadcasts each event. */
static void emit(struct node *n, struct master_events *evs)
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
        if (take_event(n, e, json) == 0)
            link_send(n->link, NULL, LINK_T_EVENT, json, strlen(json));
        free(json);
    }
    if (n->since_snapshot >= NODE_COMPACT_EVERY) {
        struct event e;
        event_init(&e, EVENT_STATE_SNAPSHOT, n->state->last_term, n->state->last_index + 1);
        char *json = snapshot_json(n, e.term, e.index);
        struct cluster_state *copy = cluster_state_copy(n->state);
        e.state_snapshot.state = copy;
        if (json && copy && take_event(n, &e, json) == 0)
            link_send(n->link, NULL, LINK_T_EVENT, json, strlen(json));
        free(json);
        event_clear(&e);
    }
    /* Pendings waiting for these positions settle in run_pendings (this may run with
     * pend_mu held). */
}

static void emit_one(struct node *n, struct event *e)
{
    struct master_events evs = {.ev = e, .n = 1, .cap = 1};
    emit(n, &evs);
}

/* ---- sending ---- */

static void send_json(struct node *n, const char *to, int type, json_t *j)
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
static void strike(struct node *n, const char *peer, const char *what, const char *why)
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
static const char *current_master(struct node *n)
{
    enum election_role role = election_role(n->el);
    if (role == ELECTION_MASTER)
        return n->id;
    if (role == ELECTION_FOLLOWER && election_confirmed(n->el) &&
        link_peer_up(n->link, election_master(n->el)))
        return election_master(n->el);
    return "";
}

static bool is_master(struct node *n) { return election_role(n->el) == ELECTION_MASTER; }

static void request_events(struct node *n, bool full, int64_t now)
{
    const char *m = current_master(n);
    if (!m[0] || !strcmp(m, n->id))
        return;
    if (!full && now - n->last_request_ms < REQUEST_RETRY_MS)
        return;
    n->last_request_ms = now;
    send_json(n, m, LINK_T_EVENT_REQUEST,
              json_pack("{s:I, s:I, s:b}", "term", (json_int_t)n->state->last_term, "index",
                        (json_int_t)n->state->last_index, "full", full));
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

static void serve_request(struct node *n, const char *from, const json_t *j)
{
    static const char *const keys[] = {"term", "index", "full", NULL};
    char err[256];
    int64_t term, index;
    bool full;
    if (ids_json_keys(j, "request", keys, err, sizeof err) ||
        ids_json_int(j, "request", "term", 0, IDS_COUNTER_MAX, &term, err, sizeof err) ||
        ids_json_int(j, "request", "index", 0, IDS_COUNTER_MAX, &index, err, sizeof err) ||
        ids_json_bool(j, "request", "full", &full, err, sizeof err)) {
        strike(n, from, "bad event request", err);
        return;
    }
    if (full || !n->log || pos_reached(n->state, term, index) == false) {
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

static struct heard *heard_find(struct node *n, const char *id, bool create, int64_t now)
{
    for (size_t i = 0; i < n->n_heard; i++)
        if (!strcmp(n->heard[i].id, id))
            return &n->heard[i];
    if (!create)
        return NULL;
    if (n->n_heard == n->cap_heard) {
        size_t cap = n->cap_heard ? 2 * n->cap_heard : 16;
        struct heard *h = realloc(n->heard, cap * sizeof *h);
        if (!h)
            return NULL;
        n->heard = h;
        n->cap_heard = cap;
    }
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
        struct master_events evs = {0};
        if (master_command(n->state, &n->env, &c, &evs, &res) == 0) {
            emit(n, &evs);
            log_info("node %s: model %s placed again as instance %s", n->id, r[i].model_id, res.instance_id);
        } else {
            log_warn("node %s: model %s cannot be placed again: %s", n->id, r[i].model_id, res.message);
        }
        master_events_clear(&evs);
        command_clear(&c);
    }
}

static int left_index(const struct node *n, const char *id)
{
    for (int i = 0; i < n->n_left; i++)
        if (!strcmp(n->left[i], id))
            return i;
    return -1;
}

/* A peer said it leaves (left) or came back (!left). The oldest entry makes room. */
static void note_left(struct node *n, const char *id, bool left)
{
    int i = left_index(n, id);
    if (!left) {
        if (i >= 0)
            memmove(n->left[i], n->left[i + 1], (size_t)(--n->n_left - i) * sizeof n->left[0]);
        return;
    }
    if (i >= 0)
        return;
    if (n->n_left == NODE_LEFT_MAX)
        memmove(n->left[0], n->left[1], (size_t)(--n->n_left) * sizeof n->left[0]);
    snprintf(n->left[n->n_left++], sizeof n->left[0], "%s", id);
}

/* Times out the nodes of the state that said they leave or were unheard for
 * node_timeout_ms, and places their instances again. */
static void check_timeouts(struct node *n, int64_t now)
{
    for (size_t i = 0; i < n->state->n_nodes; i++) {
        const char *id = n->state->nodes[i].id;
        if (!strcmp(id, n->id))
            continue;
        struct heard *h = heard_find(n, id, true, now);
        if (!h)
            continue;
        bool left = left_index(n, id) >= 0;
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
        note_left(n, id, false);
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

/* Becomes master of term: a snapshot of our own state, then MasterElected. */
static void start_term(struct node *n, int64_t term, int64_t now)
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
    if (!json || take_event(n, &e, json)) {
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
        heard_find(n, n->state->nodes[i].id, true, now);
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
static void run_remote_command(struct node *n, const char *from, const char *data, size_t len)
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
            send_json(n, from, NODE_T_COMMAND_RESULT, command_result_to_jsonv(&res));
        }
        json_decref(j);
        strike(n, from, "bad command", err);
        return;
    }
    if (c.kind == COMMAND_TEXT_GENERATION && strcmp(c.text_generation.node_id, from)) {
        /* A node asks for its own requests only: the outputs go to node_id. */
        snprintf(res.command_id, sizeof res.command_id, "%s", c.id);
        res.code = CAIRN_EINVAL;
        snprintf(res.message, sizeof res.message, "a TextGeneration from node %s names node %s as its requester", from,
                 c.text_generation.node_id);
        strike(n, from, "bad command", "a TextGeneration naming another node as its requester");
    } else if (!is_master(n)) {
        snprintf(res.command_id, sizeof res.command_id, "%s", c.id);
        res.code = CAIRN_EIO;
        snprintf(res.message, sizeof res.message, "node %s is not the master", n->id);
    } else {
        struct master_events evs = {0};
        if (master_command(n->state, &n->env, &c, &evs, &res) == 0)
            emit(n, &evs);
        master_events_clear(&evs);
        res.term = n->state->last_term;
        res.index = n->state->last_index;
        log_msg(command_log_level(&c), "node %s: %s from %s: %s", n->id, command_kind_name((int)c.kind), from,
                 res.code ? res.message : "done");
    }
    send_json(n, from, NODE_T_COMMAND_RESULT, command_result_to_jsonv(&res));
    command_clear(&c);
}

static void run_report(struct node *n, const char *from, const json_t *report)
{
    char err[512];
    struct master_events evs = {0};
    int rc = master_report_events(n->state, from, report, wall_ms(), &evs, err, sizeof err);
    if (rc == CAIRN_EFORMAT && strcmp(from, n->id))
        strike(n, from, "bad report", err);
    else if (rc)
        log_warn("node %s: report from %s: %s", n->id, from, err);
    else
        emit(n, &evs);
    master_events_clear(&evs);
}

/* ---- reports of this node ---- */

static struct perf *perf_find(struct node *n, const char *id, bool create)
{
    for (size_t i = 0; i < n->n_perfs; i++)
        if (!strcmp(n->perfs[i].id, id))
            return &n->perfs[i];
    if (!create || n->n_perfs >= LINK_MAX_ROUTES || !ids_valid_id(id))
        return NULL;
    if (n->n_perfs == n->cap_perfs) {
        size_t cap = n->cap_perfs ? 2 * n->cap_perfs : 16;
        struct perf *p = realloc(n->perfs, cap * sizeof *p);
        if (!p)
            return NULL;
        n->perfs = p;
        n->cap_perfs = cap;
    }
    struct perf *p = &n->perfs[n->n_perfs++];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    return p;
}

/* Links to the peers up now, as a report's "edges". */
static json_t *current_edges(struct node *n)
{
    struct link_peer peers[NODE_MAX_PEERS];
    size_t k = link_peers(n->link, peers, NODE_MAX_PEERS);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < k; i++) {
        if (!ids_valid_id(peers[i].id))
            continue;
        const struct perf *p = perf_find(n, peers[i].id, false);
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "to", peers[i].id, "rtt_us",
                                             (json_int_t)(p ? p->rtt_us : 0), "throughput_bytes_per_s",
                                             (json_int_t)(p ? p->tput : 0)));
    }
    return arr;
}

/* True when b and a are further apart than MASTER_EDGE_THROUGHPUT_SLACK_PCT of the larger
 * (from or to 0 is always a change). */
static bool tput_moved(int64_t a, int64_t b)
{
    int64_t hi = a > b ? a : b, d = a > b ? a - b : b - a;
    return d > 0 && (a == 0 || b == 0 || d > hi / 100 * MASTER_EDGE_THROUGHPUT_SLACK_PCT);
}

/* True when the edges differ in their set of peers, by more than the rtt slack or by
 * more than the throughput slack. */
static bool edges_changed(const json_t *a, const json_t *b)
{
    if (!a || !b || json_array_size(a) != json_array_size(b))
        return true;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i);
        const char *to = json_string_value(json_object_get(x, "to"));
        bool found = false;
        for (size_t k = 0; k < json_array_size(b) && !found; k++) {
            const json_t *y = json_array_get(b, k);
            if (to && !strcmp(to, json_string_value(json_object_get(y, "to")) ?: "")) {
                found = true;
                json_int_t p = json_integer_value(json_object_get(x, "rtt_us"));
                json_int_t q = json_integer_value(json_object_get(y, "rtt_us"));
                json_int_t slack = p / 2 > MASTER_EDGE_RTT_SLACK_US ? p / 2 : MASTER_EDGE_RTT_SLACK_US;
                if (p - q > slack || q - p > slack)
                    return true;
                if (tput_moved(json_integer_value(json_object_get(x, "throughput_bytes_per_s")),
                               json_integer_value(json_object_get(y, "throughput_bytes_per_s"))))
                    return true;
            }
        }
        if (!found)
            return true;
    }
    return false;
}

static json_t *info_json(struct node *n, const struct node_info *ni)
{
    json_t *j = nodeinfo_to_json(ni);
    if (j && (json_object_set_new(j, "api_port", json_integer(atomic_load(&n->api_port))) ||
              json_object_set_new(j, "cluster_port", json_integer(link_port(n->link))))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static void gather_info(struct node *n, int64_t now)
{
    char err[256];
    struct node_info ni;
    n->next_info_ms = now + NODE_INFO_INTERVAL_MS;
    if (nodeinfo_gather(&ni, n->models_dir, err, sizeof err)) {
        log_warn("node %s: node info: %s", n->id, err);
        return;
    }
    if (n->memory_limit > 0 && (ni.mem_available > n->memory_limit || ni.mem_available <= 0))
        ni.mem_available = n->memory_limit;
    if (!n->worker)
        ni.mem_available = 0; /* runs no runners: placement never picks it */
    n->info = ni;
    n->has_info = true;
    if (!n->has_reported || nodeinfo_changed(&n->reported, &n->info))
        n->report_due = true;
}

static void maybe_report(struct node *n, int64_t now)
{
    if (n->leaving) /* a report would put us back in the state */
        return;
    bool info_due = now >= n->next_info_ms;
    if (info_due)
        gather_info(n, now);
    if (atomic_exchange(&n->report_asked, false))
        n->report_due = true;
    const char *master = current_master(n);
    /* A master that does not list us (timed out, or it started from an older state). */
    if (master[0] && !strcmp(n->state->master_node_id, master) && !cluster_state_find_node(n->state, n->id))
        n->report_due = true;
    /* The links' figures are compared with the last report's on the info timer, not on
     * every pass of the loop (a pass follows every message: with many peers, building
     * the edges each time was most of an idle node's work). */
    if (!info_due && !n->report_due)
        return;
    json_t *edges = current_edges(n);
    if (edges && edges_changed(edges, n->reported_edges))
        n->report_due = true;
    if (!n->report_due || !n->has_info || !master[0] || now - n->last_report_ms < NODE_REPORT_MIN_MS ||
        !edges) {
        json_decref(edges);
        return;
    }
    /* The info last reported until it moves past nodeinfo_changed's thresholds: the
     * master makes no event for info it already holds. */
    bool fresh = !n->has_reported || nodeinfo_changed(&n->reported, &n->info);
    json_t *report = json_object();
    json_t *info = info_json(n, fresh ? &n->info : &n->reported);
    if (!report || !info || json_object_set_new(report, "node_id", json_string(n->id)) ||
        json_object_set_new(report, "info", info) ||
        json_object_set_new(report, "runners",
                            n->runners ? (n->runners(n->runners_ctx) ?: json_null()) : json_null()) ||
        json_object_set_new(report, "downloads",
                            n->downloads ? (download_mgr_json(n->downloads) ?: json_null()) : json_null()) ||
        json_object_set(report, "edges", edges)) {
        json_decref(report);
        json_decref(edges);
        return;
    }
    if (!strcmp(master, n->id)) {
        run_report(n, n->id, report);
        json_decref(report);
    } else {
        send_json(n, master, LINK_T_REPORT, report);
    }
    if (fresh)
        n->reported = n->info;
    n->has_reported = true;
    json_decref(n->reported_edges);
    n->reported_edges = edges;
    n->report_due = false;
    n->last_report_ms = now;
}

/* ---- throughput probes ---- */

/* A peer's link came up: its first probe goes soon (once pings gave a round trip). */
static void probe_plan(struct node *n, const char *peer, int64_t now)
{
    struct perf *p = perf_find(n, peer, true);
    if (!p)
        return;
    p->probing = false;
    p->told_ms = 0;
    p->probe_every_ms = n->probe_interval_ms;
    p->next_probe_ms = now + (n->probe_interval_ms < NODE_PROBE_FIRST_MS ? n->probe_interval_ms
                                                                         : NODE_PROBE_FIRST_MS);
}

static void probe_stop(struct node *n, const char *peer)
{
    struct perf *p = perf_find(n, peer, false);
    if (p) {
        p->probing = false;
        p->next_probe_ms = 0;
    }
}

/* Sends the probes that are due: at most one in flight per peer, and none over a link
 * that carried task outputs within NODE_PROBE_BUSY_MS (it waits, not the outputs). */
static void send_probes(struct node *n, int64_t now)
{
    for (size_t i = 0; i < n->n_perfs; i++) {
        struct perf *p = &n->perfs[i];
        if (p->probing && now - p->probe_sent_ns / 1000000 >= NODE_PROBE_TIMEOUT_MS)
            p->probing = false; /* the probe or its ack was lost */
        if (p->probing || !p->next_probe_ms || now < p->next_probe_ms)
            continue;
        if (!link_peer_up(n->link, p->id)) {
            p->next_probe_ms = 0;
            continue;
        }
        if (p->last_output_ms && now - p->last_output_ms < NODE_PROBE_BUSY_MS) {
            p->next_probe_ms = now + NODE_PROBE_BUSY_MS;
            continue;
        }
        uint64_t seq = ++n->next_probe_seq;
        for (int k = 0; k < 8; k++)
            n->probe_buf[k] = (uint8_t)(seq >> (56 - 8 * k));
        p->next_probe_ms = now + (p->probe_every_ms ? p->probe_every_ms : n->probe_interval_ms);
        int64_t t = clock_ns();
        if (link_send(n->link, p->id, NODE_T_PROBE, n->probe_buf, NODE_PROBE_BYTES) == 1) {
            p->probing = true;
            p->probe_seq = seq;
            p->probe_sent_ns = t;
        }
    }
}

/* A peer's probe: answered at once with its sequence number and size. */
static void on_probe(struct node *n, const char *from, const uint8_t *data, size_t len)
{
    if (len < 8) {
        strike(n, from, "probe of fewer than 8 bytes", NULL);
        return;
    }
    uint64_t seq = 0;
    for (int k = 0; k < 8; k++)
        seq = seq << 8 | data[k];
    if (seq > (uint64_t)IDS_COUNTER_MAX) {
        strike(n, from, "probe number out of range", NULL);
        return;
    }
    send_json(n, from, NODE_T_CONTROL,
              json_pack("{s:s, s:I, s:I}", "type", "probe_ack", "seq", (json_int_t)seq, "bytes",
                        (json_int_t)len));
}

/* The ack of our probe: the probe's bytes took the time to the ack less a round trip
 * (the ack's way back and the peer's reply time, as pings measure them). */
static void on_probe_ack(struct node *n, const char *from, int64_t seq, int64_t bytes)
{
    struct perf *p = perf_find(n, from, false);
    if (!p || !p->probing || (uint64_t)seq != p->probe_seq || bytes != (int64_t)NODE_PROBE_BYTES)
        return; /* the ack of a probe given up on */
    p->probing = false;
    int64_t elapsed_us = (clock_ns() - p->probe_sent_ns) / 1000;
    int64_t xfer_us = elapsed_us - p->rtt_us;
    /* The round trip is a smoothed figure of small messages: where it takes up most of
     * this probe's time (a fast link, or noise), it is not trusted with the rest. */
    if (xfer_us < elapsed_us / 4)
        xfer_us = elapsed_us / 4;
    if (xfer_us < 1)
        xfer_us = 1;
    int64_t bps = bytes * 1000000 / xfer_us;
    if (bps > IDS_BYTES_MAX)
        bps = IDS_BYTES_MAX;
    if (bps < 1)
        bps = 1;
    int64_t before = p->tput;
    p->tput = p->tput ? (3 * p->tput + bps) / 4 : bps;
    /* Every pair of nodes probes both ways: at a steady figure the next probe waits twice
     * as long (up to NODE_PROBE_BACKOFF times the interval), so an idle cluster of many
     * nodes neither streams probes nor makes an event of each one's noise; a figure that
     * moves brings the interval back. */
    int64_t most = (int64_t)n->probe_interval_ms * NODE_PROBE_BACKOFF;
    if (before && !tput_moved(before, p->tput))
        p->probe_every_ms = 2 * p->probe_every_ms < most ? 2 * p->probe_every_ms : most;
    else
        p->probe_every_ms = n->probe_interval_ms;
    if (p->next_probe_ms)
        p->next_probe_ms = p->probe_sent_ns / 1000000 + p->probe_every_ms;
}

/* ---- control messages: peers, pings, head ---- */

/* The endpoint to reach a peer at, "tcp://host:port". */
static bool peer_endpoint(const struct link_peer *p, char *out, size_t n)
{
    if (!strncmp(p->addr, "tcp://", 6))
        return snprintf(out, n, "%s", p->addr) < (int)n;
    if (p->port <= 0 || !p->addr[0])
        return false;
    bool v6 = strchr(p->addr, ':') != NULL;
    return snprintf(out, n, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", p->addr, p->port) < (int)n;
}

static void gossip(struct node *n, const char *to, int64_t now)
{
    struct link_peer peers[NODE_MAX_PEERS];
    size_t k = link_peers(n->link, peers, NODE_MAX_PEERS);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < k; i++) {
        char ep[LINK_ADDR_MAX + 16];
        if (peer_endpoint(&peers[i], ep, sizeof ep))
            json_array_append_new(arr, json_pack("{s:s, s:s}", "id", peers[i].id, "endpoint", ep));
    }
    if (arr)
        send_json(n, to, NODE_T_CONTROL, json_pack("{s:s, s:o}", "type", "peers", "peers", arr));
    send_json(n, to, NODE_T_CONTROL,
              json_pack("{s:s, s:I}", "type", "ping", "t", (json_int_t)(clock_ns() / 1000)));
    (void)now;
}

/* Whether to connect to a peer we were told of (by gossip or discovery) and are not
 * linked to. Both nodes of a pair hear of each other at about the same time, and if both
 * connected, every pair would keep two connections, each with heartbeats both ways: the
 * node with the smaller id connects, the other waits NODE_CONNECT_DEFER_MS for it before
 * connecting itself (so a peer that cannot reach us is still linked). */
static bool should_connect(struct node *n, const char *peer, int64_t now)
{
    if (strcmp(n->id, peer) < 0)
        return true;
    struct perf *p = perf_find(n, peer, true);
    if (!p)
        return true;
    if (!p->told_ms) {
        p->told_ms = now;
        return false;
    }
    return now - p->told_ms >= NODE_CONNECT_DEFER_MS;
}

static void on_peers(struct node *n, const char *from, const json_t *j, int64_t now)
{
    const json_t *arr = json_object_get(j, "peers");
    if (!json_is_array(arr)) {
        strike(n, from, "peers message without a peers array", NULL);
        return;
    }
    size_t k = json_array_size(arr);
    if (k > NODE_MAX_PEERS)
        k = NODE_MAX_PEERS;
    for (size_t i = 0; i < k; i++) {
        const json_t *p = json_array_get(arr, i);
        const char *id = json_string_value(json_object_get(p, "id"));
        const char *ep = json_string_value(json_object_get(p, "endpoint"));
        if (!id || !ep) {
            strike(n, from, "peers message with an entry that is not {id, endpoint}", NULL);
            return;
        }
        /* an id the link takes but the cluster does not: the peer's fault, not from's */
        if (!ids_valid_id(id) || !strcmp(id, n->id) || link_peer_up(n->link, id) || !should_connect(n, id, now))
            continue;
        char err[256];
        if (link_connect(n->link, ep, err, sizeof err))
            log_debug("node %s: peer %s told by %s at %s: %s", n->id, id, from, ep, err);
        else
            log_debug("node %s: connecting to %s at %s (told by %s)", n->id, id, ep, from);
    }
}

/* A peer's "leave": it is stopping (node_leave). Noted, so that whoever is master now or
 * later times it out at once, and acknowledged, so that it knows we read it before it
 * closes its links. */
static void on_leave(struct node *n, const char *from, int64_t now)
{
    log_info("node %s: node %s says it leaves", n->id, from);
    note_left(n, from, true);
    n->next_timeout_ms = now; /* the master's next check is on this pass */
    send_json(n, from, NODE_T_CONTROL, json_pack("{s:s}", "type", "leave_ack"));
}

static void on_leave_ack(struct node *n, const char *from)
{
    for (int i = 0; i < n->n_leave_wait; i++)
        if (!strcmp(n->leave_wait[i], from)) {
            memmove(n->leave_wait[i], n->leave_wait[i + 1], (size_t)(--n->n_leave_wait - i) * sizeof n->leave_wait[0]);
            return;
        }
}

/* Our leave starts: "leave" to every live peer; node_main waits for their acks. */
static void start_leave(struct node *n, int64_t now)
{
    struct link_peer peers[NODE_LEFT_MAX];
    size_t k = link_peers(n->link, peers, NODE_LEFT_MAX);
    n->leaving = true;
    n->leave_deadline_ms = now + NODE_LEAVE_WAIT_MS;
    n->n_leave_wait = 0;
    for (size_t i = 0; i < k && i < NODE_LEFT_MAX; i++) {
        if (!ids_valid_id(peers[i].id) || !link_peer_up(n->link, peers[i].id))
            continue;
        snprintf(n->leave_wait[n->n_leave_wait++], sizeof n->leave_wait[0], "%.*s", IDS_ID_MAX, peers[i].id);
        send_json(n, peers[i].id, NODE_T_CONTROL, json_pack("{s:s}", "type", "leave"));
    }
    log_info("node %s: leaving the cluster (%d peers to tell)", n->id, n->n_leave_wait);
}

/* Control messages: {"type": "peers"|"ping"|"pong"|"head"|"probe_ack"|"leave"|"leave_ack",
 * ...}. A message that is not one of them, or lacks their fields, is a strike against its
 * sender. */
static void on_control(struct node *n, const char *from, const char *data, size_t len,
                       int64_t now)
{
    json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *bad = NULL;
    if (!type) {
        bad = "control message without a type";
    } else if (!strcmp(type, "peers")) {
        on_peers(n, from, j, now);
    } else if (!strcmp(type, "ping")) {
        json_t *t = json_object_get(j, "t");
        if (json_is_integer(t))
            send_json(n, from, NODE_T_CONTROL,
                      json_pack("{s:s, s:I}", "type", "pong", "t", json_integer_value(t)));
        else
            bad = "ping without an integer t";
    } else if (!strcmp(type, "pong")) {
        json_t *t = json_object_get(j, "t");
        int64_t us = clock_ns() / 1000 - (json_is_integer(t) ? json_integer_value(t) : 0);
        struct perf *p = json_is_integer(t) && us >= 0 && us < 60000000 ? perf_find(n, from, true) : NULL;
        if (p)
            p->rtt_us = p->rtt_us ? (3 * p->rtt_us + us) / 4 : us;
        if (!json_is_integer(t))
            bad = "pong without an integer t";
    } else if (!strcmp(type, "head")) {
        json_t *t = json_object_get(j, "term"), *i = json_object_get(j, "index");
        if (!json_is_integer(t) || !json_is_integer(i))
            bad = "head without an integer term and index";
        else if (!strcmp(current_master(n), from) &&
                 !pos_reached(n->state, json_integer_value(t), json_integer_value(i)))
            request_events(n, false, now);
    } else if (!strcmp(type, "leave")) {
        on_leave(n, from, now);
    } else if (!strcmp(type, "leave_ack")) {
        on_leave_ack(n, from);
    } else if (!strcmp(type, "probe_ack")) {
        json_t *q = json_object_get(j, "seq"), *b = json_object_get(j, "bytes");
        if (json_is_integer(q) && json_is_integer(b))
            on_probe_ack(n, from, json_integer_value(q), json_integer_value(b));
        else
            bad = "probe_ack without an integer seq and bytes";
    } else {
        bad = "control message of an unknown type";
    }
    if (bad)
        strike(n, from, bad, NULL);
    json_decref(j);
}

/* ---- followers ---- */

static void on_event(struct node *n, const char *from, const char *data, size_t len,
                     int64_t now)
{
    struct event e;
    char err[512];
    int rc = event_from_json(data, len, &e, err, sizeof err);
    if (rc) {
        if (rc == CAIRN_EFORMAT)
            strike(n, from, "malformed event", err);
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
        rc = json ? take_event(n, &e, json) : CAIRN_ENOMEM;
        free(json);
        if (rc == CAIRN_ESTATE || rc == CAIRN_EINVAL)
            request_events(n, false, now);
        else if (rc == 0)
            wake_pendings(n);
    }
    event_clear(&e);
}

static void on_snapshot(struct node *n, const char *from, const char *data, size_t len)
{
    struct cluster_state *s = NULL;
    char err[512];
    if (strcmp(current_master(n), from))
        return;
    int rc = cluster_state_from_json(data, len, &s, err, sizeof err);
    if (rc) {
        if (rc == CAIRN_EFORMAT)
            strike(n, from, "malformed snapshot", err);
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
    char *json = snapshot_json(n, n->state->last_term, n->state->last_index);
    if (json)
        notify(n, json, n->state->last_term, n->state->last_index);
    free(json);
    wake_pendings(n);
}

/* ---- commands from this node's API ---- */

static void on_result(struct node *n, const char *from, const char *data, size_t len)
{
    struct command_result r;
    char err[256];
    json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
    int rc = j ? command_result_from_jsonv(j, &r, err, sizeof err) : CAIRN_EFORMAT;
    if (!j)
        snprintf(err, sizeof err, "not JSON");
    json_decref(j);
    if (rc) {
        strike(n, from, "malformed command result", err);
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

static void run_pendings(struct node *n, int64_t now)
{
    bool any = false;
    const char *m = current_master(n);
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next) {
        if (p->st == P_QUEUED) {
            if (is_master(n)) {
                struct master_events evs = {0};
                if (master_command(n->state, &n->env, p->cmd, &evs, &p->res) == 0)
                    emit(n, &evs);
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
    wake_node(n);
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

/* ---- election outcomes ---- */

static void after_election(struct node *n, int64_t now)
{
    enum election_role role = election_role(n->el);
    int64_t term = election_term(n->el);
    const char *m = election_master(n->el);
    bool confirmed = election_confirmed(n->el);
    if (role == ELECTION_MASTER && n->master_term != term)
        start_term(n, term, now);
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

/* Catches up with the master we follow when our state has not reached its term: all of
 * it when our state knows another master in that term (events under the same numbers
 * may differ) or a newer term. */
static void check_sync(struct node *n, int64_t now)
{
    if (!n->sync_at || now < n->sync_at)
        return;
    n->sync_at = 0;
    const char *m = election_master(n->el);
    int64_t term = election_term(n->el);
    const struct cluster_state *s = n->state;
    bool full = s->last_term > term || (s->last_term == term && strcmp(s->master_node_id, m));
    if (full || !pos_reached(s, term, 1))
        request_events(n, full, now);
}

/* ---- the loop ---- */

static void on_message(struct node *n, const struct link_msg *msg, int64_t now)
{
    char err[256];
    switch (msg->event) {
    case LINK_EV_PEER_UP:
        note_left(n, msg->peer, false); /* back (a new process, or it never went) */
        election_peer_up(n->el, msg->peer, now);
        gossip(n, NULL, now);
        probe_plan(n, msg->peer, now);
        if (is_master(n)) {
            struct heard *h = heard_find(n, msg->peer, true, now);
            if (h)
                h->ms = now;
        }
        return;
    case LINK_EV_PEER_DOWN:
        election_peer_down(n->el, msg->peer, now);
        probe_stop(n, msg->peer);
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
            strike(n, msg->peer, "bad election message", j ? err : "not JSON");
        else if (rc)
            log_warn("node %s: election message from %s: %s", n->id, msg->peer, err);
        json_decref(j);
        break;
    }
    case LINK_T_EVENT:
        on_event(n, msg->peer, data, msg->len, now);
        break;
    case LINK_T_SNAPSHOT:
        on_snapshot(n, msg->peer, data, msg->len);
        break;
    case LINK_T_EVENT_REQUEST:
        if (is_master(n)) {
            json_t *j = json_loadb(data, msg->len, JSON_REJECT_DUPLICATES, NULL);
            if (j)
                serve_request(n, msg->peer, j);
            else
                strike(n, msg->peer, "event request", "not JSON");
            json_decref(j);
        }
        break;
    case LINK_T_COMMAND:
        run_remote_command(n, msg->peer, data, msg->len);
        break;
    case LINK_T_REPORT:
        if (is_master(n)) {
            json_t *j = json_loadb(data, msg->len, JSON_REJECT_DUPLICATES, NULL);
            if (j)
                run_report(n, msg->peer, j);
            else
                strike(n, msg->peer, "report", "not JSON");
            json_decref(j);
            struct heard *h = heard_find(n, msg->peer, true, now);
            if (h)
                h->ms = now;
        }
        break;
    case NODE_T_COMMAND_RESULT:
        on_result(n, msg->peer, data, msg->len);
        break;
    case NODE_T_CONTROL:
        on_control(n, msg->peer, data, msg->len, now);
        break;
    case NODE_T_TASK_OUTPUT:
    case NODE_T_TASK_BODY:
        deliver(n, msg->type, msg->peer, data, msg->len);
        break;
    case NODE_T_PROBE:
        on_probe(n, msg->peer, msg->data, msg->len);
        break;
    default:
        snprintf(err, sizeof err, "%d", msg->type);
        strike(n, msg->peer, "message of unknown type", err);
    }
}

/* Discovery hook: with discovery off (node_config's NULL, `cairn node --discovery off`)
 * there is no discovery object and this does nothing; otherwise every node it hears of
 * is connected to. */
static void discovery_hook(struct node *n, int64_t now)
{
    if (!n->disc)
        return;
    struct discovery_peer p;
    for (int i = 0; i < 16 && discovery_poll(n->disc, 0, &p) == 1; i++) {
        if (p.change == DISCOVERY_REFRESHED && link_peer_up(n->link, p.node_id))
            continue;
        char ep[LINK_ADDR_MAX], err[256];
        snprintf(ep, sizeof ep, "tcp://%s:%d", p.addr, p.cluster_port);
        if (!link_peer_up(n->link, p.node_id) && should_connect(n, p.node_id, now) &&
            link_connect(n->link, ep, err, sizeof err))
            log_debug("node %s: discovered %s at %s: %s", n->id, p.node_id, ep, err);
    }
}

static void periodic(struct node *n, int64_t now)
{
    election_tick(n->el, now);
    after_election(n, now);
    check_sync(n, now);
    discovery_hook(n, now);
    if (now >= n->next_gossip_ms) {
        n->next_gossip_ms = now + NODE_GOSSIP_INTERVAL_MS;
        gossip(n, NULL, now);
    }
    if (is_master(n)) {
        if (now >= n->next_timeout_ms) {
            n->next_timeout_ms = now + 1000;
            check_timeouts(n, now);
        }
        if (now >= n->next_head_ms) {
            n->next_head_ms = now + NODE_HEAD_INTERVAL_MS;
            send_json(n, NULL, NODE_T_CONTROL,
                      json_pack("{s:s, s:I, s:I}", "type", "head", "term",
                                (json_int_t)n->state->last_term, "index",
                                (json_int_t)n->state->last_index));
        }
    }
    send_probes(n, now);
    maybe_report(n, now);
    drain_wake(n);
    run_pendings(n, now);
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
    if (is_master(n)) {
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
                start_leave(n, now);
            if (n->n_leave_wait == 0 || now >= n->leave_deadline_ms) {
                if (n->n_leave_wait)
                    log_warn("node %s: %d peers did not acknowledge our leave", n->id, n->n_leave_wait);
                atomic_store(&n->leave_done, true);
            }
        }
    }
    return NULL;
}

/* master_draft_fn over this node's catalog: both files are here. */
static int node_draft_check(void *ctx, const char *model_id, const char *draft_id, char *err, size_t errlen)
{
    struct catalog_card a, b;
    int rc = node_card(ctx, model_id, &a, err, errlen);
    if (!rc)
        rc = node_card(ctx, draft_id, &b, err, errlen);
    else
        memset(&b, 0, sizeof b);
    if (!rc)
        rc = a.path && b.path ? vocab_compatible_files(a.path, b.path, err, errlen) : 0;
    catalog_card_clear(&a);
    catalog_card_clear(&b);
    return rc;
}

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
    n->env.card = node_card;
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
    if ((rc = log_open(n, err, errlen)))
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
    wake_node(n);
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
    pthread_mutex_lock(&n->pend_mu);
    for (struct pending *p = n->pend; p; p = p->next)
        if (p->st != P_DONE)
            fail_pending(p, CAIRN_EIO, "%s", "node is stopping");
    pthread_cond_broadcast(&n->pend_cv);
    pthread_mutex_unlock(&n->pend_mu);
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
