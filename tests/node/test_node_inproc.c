/* Nodes inside this process over loopback: the persistent node id; two nodes that join
 * with a peer address agree on a master and on the state; commands go through the
 * master from either node; a subscriber sees the events; the master's stop elects the
 * other; a restarted node keeps its id, replays its log and follows (sticky); the
 * edges between linked nodes carry a measured rtt and throughput; an idle cluster whose
 * nodes keep reporting adds next to no events while a runner's change still makes its
 * own; a peer sending malformed payloads is cut while the node serves the others; a
 * node that was timed out comes back in the same term and replays the events it missed
 * from the master's log (asked since its last position), not a snapshot.
 * Every wait is bounded. */
#include "net/link.h"
#include "node/node.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "testutil.h"

static char err[1024];
static char root[256];

static double now_s(void) { return clock_sec(); }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_id(void)
{
    char dir[700], id[IDS_ID_MAX + 1], again[IDS_ID_MAX + 1], path[800];
    snprintf(dir, sizeof dir, "%s/id/deeper", root);
    int rc = node_load_id(dir, id, err, sizeof err);
    CHECK(rc == 0 && strlen(id) == 32, "made an id in a new dir: %d %s '%s'", rc, err, id);
    rc = node_load_id(dir, again, err, sizeof err);
    CHECK(rc == 0 && !strcmp(id, again), "the same id again: '%s' '%s'", id, again);
    snprintf(path, sizeof path, "%s/node_id", dir);
    FILE *f = fopen(path, "w");
    fputs("not an id!\n", f);
    fclose(f);
    rc = node_load_id(dir, again, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "node_id"), "garbage in the file: %d %s", rc, err);
    f = fopen(path, "w");
    fputs("my-node.1\n", f);
    fclose(f);
    rc = node_load_id(dir, again, err, sizeof err);
    CHECK(rc == 0 && !strcmp(again, "my-node.1"), "a chosen id is kept: '%s'", again);
    char under[900];
    snprintf(under, sizeof under, "%s/sub", path); /* under a file */
    rc = node_load_id(under, again, err, sizeof err);
    CHECK(rc == CAIRN_EIO, "a dir that cannot be made: %d %s", rc, err);
}

/* Makes and starts a node with data in root/name; cfg (may be NULL) gives the other
 * fields (its data dir, peers, bind address, force flag and limits are set here). */
static struct node *make_node_cfg(const char *name, const char *peer, bool force, int timeout_ms,
                                  const struct node_config *more)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    const char *peers[1] = {peer};
    struct node_config cfg;
    if (more)
        cfg = *more;
    else
        memset(&cfg, 0, sizeof cfg);
    cfg.data_dir = dir;
    cfg.bind_addr = "127.0.0.1";
    cfg.peers = peers;
    cfg.n_peers = peer ? 1 : 0;
    cfg.force_master = force;
    cfg.memory_limit = (int64_t)1 << 30;
    cfg.node_timeout_ms = timeout_ms;
    struct node *n = NULL;
    int rc = node_create(&n, &cfg, err, sizeof err);
    CHECK(rc == 0, "create %s: %s", name, err);
    if (rc)
        return NULL;
    rc = node_start(n, err, sizeof err);
    CHECK(rc == 0, "start %s: %s", name, err);
    return n;
}

static struct node *make_node_t(const char *name, const char *peer, bool force, int timeout_ms)
{
    return make_node_cfg(name, peer, force, timeout_ms, NULL);
}

static struct node *make_node(const char *name, const char *peer, bool force)
{
    return make_node_t(name, peer, force, 60000);
}

struct text {
    char *s;
};

static void to_text(void *ctx, const struct cluster_state *s)
{
    struct text *t = ctx;
    free(t->s);
    t->s = cluster_state_to_json(s);
}

static size_t count_nodes(struct node *n)
{
    struct text t = {0};
    node_read_state(n, to_text, &t);
    size_t k = 0;
    for (const char *p = t.s; p && (p = strstr(p, "\"cluster_port\"")); p++)
        k++;
    free(t.s);
    return k;
}

/* Waits until a and b (b may be NULL) name one master and hold equal states with
 * `nodes` nodes; returns seconds taken, or -1 after limit seconds. */
static double wait_agree(struct node *a, struct node *b, size_t nodes, const char *master,
                         double limit)
{
    double t0 = now_s();
    while (now_s() - t0 < limit) {
        struct node_status sa, sb;
        node_get_status(a, &sa);
        if (b)
            node_get_status(b, &sb);
        else
            sb = sa;
        struct text ta = {0}, tb = {0};
        node_read_state(a, to_text, &ta);
        if (b)
            node_read_state(b, to_text, &tb);
        bool same = ta.s && (!b || (tb.s && !strcmp(ta.s, tb.s)));
        free(ta.s);
        free(tb.s);
        if (sa.master[0] && !strcmp(sa.master, sb.master) && (!master || !strcmp(sa.master, master)) &&
            same && count_nodes(a) == nodes)
            return now_s() - t0;
        sleep_ms(50);
    }
    return -1;
}

static atomic_int seen_events;

static void on_event(void *ctx, const char *json, size_t len, int64_t term, int64_t index)
{
    (void)ctx;
    (void)term;
    (void)index;
    if (len && json[0] == '{')
        atomic_fetch_add(&seen_events, 1);
}

static void test_pair(void)
{
    struct node *a = make_node("a", NULL, false);
    if (!a)
        return;
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(a));
    struct node *b = make_node("b", peer, false);
    if (!b) {
        node_release(a);
        return;
    }
    uint64_t token = 0;
    CHECK(node_subscribe(b, on_event, NULL, &token) == 0, "subscribe");
    double t = wait_agree(a, b, 2, NULL, 30);
    CHECK(t >= 0, "two nodes agree on the master and the state (within 30 s)");
    printf("two in-process nodes agreed after %.2f s\n", t);
    struct node_status sa, sb;
    node_get_status(a, &sa);
    node_get_status(b, &sb);
    CHECK(sa.n_peers == 1 && sb.n_peers == 1, "peers up: %zu %zu", sa.n_peers, sb.n_peers);
    CHECK(sa.is_master != sb.is_master, "exactly one is master (%d %d)", sa.is_master, sb.is_master);
    CHECK(atomic_load(&seen_events) > 0, "the subscriber saw events");
    struct node *master = sa.is_master ? a : b, *follower = sa.is_master ? b : a;

    /* Commands from the follower go through the master. */
    struct command c;
    struct command_result res;
    command_init(&c, COMMAND_DELETE_INSTANCE);
    snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "ghost");
    int rc = node_command(follower, &c, 10000, &res);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(res.message, "ghost"), "delete unknown from the follower: %d %s",
          rc, res.message);
    command_clear(&c);
    json_t *body = json_pack("{s:s, s:[{s:s, s:i, s:i}]}", "model_id", "m1", "shards", "node_id",
                             node_id(master), "layer_begin", 0, "layer_end", 4);
    CHECK(command_from_request(COMMAND_CREATE_INSTANCE, body, NULL, &c, err, sizeof err) == 0, "%s", err);
    rc = node_command(master, &c, 10000, &res);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(res.message, "m1"), "no models folder: %d %s", rc, res.message);
    command_clear(&c);
    json_decref(body);

    /* The master stops: the follower takes over, keeping the state. */
    node_unsubscribe(b, token);
    char master_id[IDS_ID_MAX + 1];
    snprintf(master_id, sizeof master_id, "%s", node_id(master));
    double t0 = now_s();
    node_release(master);
    t = wait_agree(follower, NULL, 2, node_id(follower), 30);
    CHECK(t >= 0, "the follower became master within 30 s");
    printf("master stopped: new master after %.2f s\n", now_s() - t0);
    struct node_status sf;
    node_get_status(follower, &sf);
    CHECK(sf.is_master && sf.term >= 2, "new term %lld", (long long)sf.term);

    /* The old master comes back with its id and follows the new one. */
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(follower));
    struct node *back = make_node(master == a ? "a" : "b", peer, false);
    if (back) {
        CHECK(!strcmp(node_id(back), master_id), "same id after restart: %s %s", node_id(back),
              master_id);
        t = wait_agree(follower, back, 2, node_id(follower), 30);
        CHECK(t >= 0, "the restarted node follows the working master (sticky)");
        node_release(back);
    }
    node_release(follower);
}

struct catch_up {
    const char *id;
    atomic_int timed_out, snapshots;
};

static void on_catch_up(void *ctx, const char *json, size_t len, int64_t term, int64_t index)
{
    struct catch_up *c = ctx;
    (void)term;
    (void)index;
    json_t *j = json_loadb(json, len, 0, NULL);
    const char *kind = json_string_value(json_object_get(j, "kind"));
    const char *node = json_string_value(json_object_get(j, "node_id"));
    if (kind && !strcmp(kind, "NodeTimedOut") && node && !strcmp(node, c->id))
        atomic_fetch_add(&c->timed_out, 1);
    if (kind && !strcmp(kind, "StateSnapshot"))
        atomic_fetch_add(&c->snapshots, 1);
    json_decref(j);
}

/* A node unheard for the timeout leaves the state; when it comes back it catches up
 * from the master's log. */
static void test_timeout(void)
{
    struct node *m = make_node_t("tm", NULL, true, 2000);
    if (!m)
        return;
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(m));
    struct node *f = make_node_t("tf", peer, false, 2000);
    double t = f ? wait_agree(m, f, 2, node_id(m), 30) : -1;
    CHECK(t >= 0, "the force-master leads the pair");
    char fid[IDS_ID_MAX + 1] = "";
    if (f)
        snprintf(fid, sizeof fid, "%s", node_id(f));
    node_release(f);
    double t0 = now_s();
    t = wait_agree(m, NULL, 1, node_id(m), 30);
    CHECK(t >= 0, "the departed node is timed out (bound 30 s)");
    printf("node timed out %.2f s after it left (timeout 2 s)\n", now_s() - t0);

    /* It comes back with its log, in the same term: it asks for the log since its last
     * position and replays what it missed one event at a time (its own NodeTimedOut
     * among them), not a snapshot. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tf", root);
    const char *peers[1] = {peer};
    struct node_config cfg = {.data_dir = dir, .bind_addr = "127.0.0.1", .peers = peers, .n_peers = 1,
                              .memory_limit = (int64_t)1 << 30, .node_timeout_ms = 2000};
    struct catch_up cu = {.id = fid};
    struct node *back = NULL;
    uint64_t token = 0;
    int rc = node_create(&back, &cfg, err, sizeof err);
    CHECK(rc == 0, "create tf again: %s", err);
    if (!rc) {
        CHECK(!strcmp(node_id(back), fid), "tf keeps its id: %s %s", node_id(back), fid);
        CHECK(node_subscribe(back, on_catch_up, &cu, &token) == 0, "subscribe before the start");
        rc = node_start(back, err, sizeof err);
        CHECK(rc == 0, "start tf again: %s", err);
        t = rc ? -1 : wait_agree(m, back, 2, node_id(m), 30);
        CHECK(t >= 0, "the node that came back follows the same master with the same state (bound 30 s)");
        CHECK(atomic_load(&cu.timed_out) == 1, "it replayed its own NodeTimedOut (%d times)",
              atomic_load(&cu.timed_out));
        CHECK(atomic_load(&cu.snapshots) == 0, "no snapshot was needed (%d)", atomic_load(&cu.snapshots));
        struct node_status st;
        node_get_status(back, &st);
        CHECK(st.term == 1, "still term 1 (%lld)", (long long)st.term);
        node_unsubscribe(back, token);
        node_release(back);
    }
    node_release(m);
}

/* ---- topology ---- */

struct edges {
    const char *a, *b;
    int64_t rtt[2], tput[2]; /* a->b, b->a; -1 when missing */
};

static void read_edges(void *ctx, const struct cluster_state *s)
{
    struct edges *e = ctx;
    const struct cluster_edge *x = cluster_state_find_edge(s, e->a, e->b);
    const struct cluster_edge *y = cluster_state_find_edge(s, e->b, e->a);
    e->rtt[0] = x ? x->rtt_us : -1;
    e->tput[0] = x ? x->throughput : -1;
    e->rtt[1] = y ? y->rtt_us : -1;
    e->tput[1] = y ? y->throughput : -1;
}

/* Waits until n's state holds both edges between a and b with an rtt and a throughput. */
static bool wait_measured(struct node *n, struct edges *e, double limit)
{
    double t0 = now_s();
    for (;;) {
        node_read_state(n, read_edges, e);
        if (e->rtt[0] > 0 && e->rtt[1] > 0 && e->tput[0] > 0 && e->tput[1] > 0)
            return true;
        if (now_s() - t0 >= limit)
            return false;
        sleep_ms(100);
    }
}

/* Two linked nodes measure each other: the edges in the state (the follower's copy)
 * carry an rtt from pings and a throughput from probes. */
static void test_topology(void)
{
    struct node_config more = {.probe_interval_ms = 500};
    struct node *a = make_node_cfg("pa", NULL, true, 60000, &more);
    if (!a)
        return;
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(a));
    struct node *b = make_node_cfg("pb", peer, false, 60000, &more);
    CHECK(b && wait_agree(a, b, 2, node_id(a), 30) >= 0, "the pair agrees");
    struct edges e = {.a = node_id(a), .b = b ? node_id(b) : "?"};
    double t0 = now_s();
    bool ok = b && wait_measured(b, &e, 30);
    CHECK(ok, "edges measured within 30 s: a->b rtt %lld us, %lld B/s; b->a rtt %lld us, %lld B/s",
          (long long)e.rtt[0], (long long)e.tput[0], (long long)e.rtt[1], (long long)e.tput[1]);
    printf("edges measured after %.2f s: a->b rtt %lld us %.1f MB/s, b->a rtt %lld us %.1f MB/s\n",
           now_s() - t0, (long long)e.rtt[0], e.tput[0] / 1e6, (long long)e.rtt[1], e.tput[1] / 1e6);
    node_release(b);
    node_release(a);
}

/* ---- report coalescing ---- */

struct runner_hook {
    const char *node_id;
    atomic_int status;
};

static json_t *hook_runners(void *ctx)
{
    struct runner_hook *h = ctx;
    return json_pack("[{s:s, s:s, s:s, s:s, s:n, s:i}]", "runner_id", "r-coal", "instance_id", "i-coal",
                     "node_id", h->node_id, "status", cluster_runner_status_name(atomic_load(&h->status)),
                     "error", "restart_count", 0);
}

struct kinds {
    const char *b;
    atomic_int total, info, info_b, edges, runner;
};

static void count_kinds(void *ctx, const char *json, size_t len, int64_t term, int64_t index)
{
    struct kinds *k = ctx;
    (void)term;
    (void)index;
    json_t *j = json_loadb(json, len, 0, NULL);
    const char *kind = json_string_value(json_object_get(j, "kind"));
    const char *id = json_string_value(json_object_get(j, "node_id"));
    atomic_fetch_add(&k->total, 1);
    if (kind && !strcmp(kind, "NodeGatheredInfo")) {
        atomic_fetch_add(&k->info, 1);
        if (id && !strcmp(id, k->b))
            atomic_fetch_add(&k->info_b, 1);
    } else if (kind && !strcmp(kind, "TopologyEdgeCreated")) {
        atomic_fetch_add(&k->edges, 1);
    } else if (kind && !strcmp(kind, "RunnerStatusUpdated")) {
        atomic_fetch_add(&k->runner, 1);
    }
    json_decref(j);
}

struct runner_seen {
    int status; /* -1 when missing */
};

static void read_runner(void *ctx, const struct cluster_state *s)
{
    struct runner_seen *r = ctx;
    const struct cluster_runner *x = cluster_state_find_runner(s, "r-coal");
    r->status = x ? (int)x->status : -1;
}

/* Reports the nodes (and the test) ask for every 100 ms for `ms`. */
static void chatter(struct node **all, size_t n, int ms)
{
    for (int t = 0; t < ms; t += 100) {
        for (size_t i = 0; i < n; i++)
            node_report_now(all[i]);
        sleep_ms(100);
    }
}

/* Three idle nodes whose supervisors keep asking for reports: the master adds next to
 * no events (the info it holds is not repeated); a runner's status change still makes
 * its RunnerStatusUpdated, and the info does not ride along with it. */
static void test_coalesce(void)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/cb", root);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/node_id", dir);
    FILE *fp = fopen(path, "w");
    CHECK(fp != NULL, "write %s", path);
    if (!fp)
        return;
    fputs("coal-b\n", fp);
    fclose(fp);
    struct runner_hook hook = {.node_id = "coal-b"};
    atomic_store(&hook.status, CLUSTER_RUNNER_LOADING);
    struct node_config more = {.runners = hook_runners, .runners_ctx = &hook};
    struct node *m = make_node_t("cm", NULL, true, 60000);
    if (!m)
        return;
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(m));
    struct node *b = make_node_cfg("cb", peer, false, 60000, &more);
    struct node *c = make_node_t("cc", peer, false, 60000);
    if (!b || !c) {
        node_release(b);
        node_release(c);
        node_release(m);
        return;
    }
    CHECK(wait_agree(m, b, 3, node_id(m), 30) >= 0 && wait_agree(m, c, 3, node_id(m), 30) >= 0,
          "three nodes agree");
    struct node *all[] = {m, b, c};
    /* Links measured both ways (first probes NODE_PROBE_FIRST_MS after each link). */
    for (size_t i = 0; i < 3; i++) {
        struct edges e = {.a = node_id(all[i]), .b = node_id(all[(i + 1) % 3])};
        CHECK(wait_measured(m, &e, 30), "edges %s <-> %s measured", e.a, e.b);
    }
    struct runner_seen rs;
    double t0 = now_s();
    do {
        sleep_ms(100);
        node_read_state(m, read_runner, &rs);
    } while (rs.status != CLUSTER_RUNNER_LOADING && now_s() - t0 < 10);
    CHECK(rs.status == CLUSTER_RUNNER_LOADING, "b's runner is in the state (%d)", rs.status);
    sleep_ms(1500); /* reports already under way */

    struct kinds k = {.b = "coal-b"};
    uint64_t token = 0;
    CHECK(node_subscribe(m, count_kinds, &k, &token) == 0, "subscribe");
    chatter(all, 3, 4000);
    int total = atomic_load(&k.total), edges = atomic_load(&k.edges);
    printf("idle for 4 s with reports asked every 100 ms: %d events (%d NodeGatheredInfo, %d TopologyEdgeCreated)\n",
           total, atomic_load(&k.info), edges);
    CHECK(total - edges <= 3 && atomic_load(&k.info) <= 3, "an idle cluster makes %d events besides %d of edges "
          "(%d NodeGatheredInfo)", total - edges, edges, atomic_load(&k.info));
    CHECK(edges <= 12, "%d edge events in 4 s: rtt noise is not coalesced", edges);

    const int steps[] = {CLUSTER_RUNNER_WARMING_UP, CLUSTER_RUNNER_READY, CLUSTER_RUNNER_RUNNING,
                         CLUSTER_RUNNER_READY};
    int before = atomic_load(&k.runner), info_b = atomic_load(&k.info_b);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        atomic_store(&hook.status, steps[i]);
        t0 = now_s();
        do {
            chatter(all, 3, 100);
            node_read_state(m, read_runner, &rs);
        } while (rs.status != steps[i] && now_s() - t0 < 10);
        CHECK(rs.status == steps[i], "step %zu: the master's state shows status %d (%d)", i, steps[i], rs.status);
    }
    int runner = atomic_load(&k.runner) - before;
    info_b = atomic_load(&k.info_b) - info_b;
    printf("4 runner changes: %d RunnerStatusUpdated, %d NodeGatheredInfo of that node\n", runner, info_b);
    CHECK(runner >= 4, "each runner change makes its event: %d", runner);
    CHECK(info_b <= 1, "the runner's reports repeat the node's info: %d NodeGatheredInfo", info_b);
    node_unsubscribe(m, token);
    node_release(c);
    node_release(b);
    node_release(m);
}

/* ---- a peer sending garbage ---- */

/* Waits up to limit seconds for the intruder's link to report node `peer` down (want
 * false) or up (want true); true when it did. */
static bool intruder_wait(struct link *l, const char *peer, bool want, double limit)
{
    double t0 = now_s();
    struct link_msg msg;
    while (now_s() - t0 < limit) {
        if (want && link_peer_up(l, peer))
            return true;
        if (link_poll(l, 50, &msg) == 1 && !want && msg.event == LINK_EV_PEER_DOWN && !strcmp(msg.peer, peer))
            return true;
    }
    return want && link_peer_up(l, peer);
}

/* A peer with the right secret that sends malformed payloads of every type: the node
 * logs them and strikes its connection, which is cut after LINK_MAX_STRIKES (it comes
 * back, ZeroMQ reconnects, and is cut again at the next batch); meanwhile the node
 * keeps serving a real follower. */
static void test_garbage(void)
{
    struct node *m = make_node_t("gm", NULL, true, 60000);
    if (!m)
        return;
    char ep[64], peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", node_cluster_port(m));
    struct node *f = make_node_t("gf", peer, false, 60000);
    CHECK(f && wait_agree(m, f, 2, node_id(m), 30) >= 0, "a master and its follower agree");
    /* Bound where the nodes cannot reach it (they connect to the address it comes from,
     * 127.0.0.1): its one connection is the one it opens. */
    struct link *l = NULL;
    struct link_config lc = {.node_id = "intruder", .bind_addr = "127.0.0.2"};
    int rc = link_create(&l, &lc, err, sizeof err);
    CHECK(rc == 0, "intruder link: %s", err);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", node_cluster_port(m));
    if (!rc)
        rc = link_connect(l, ep, err, sizeof err);
    bool up = !rc && intruder_wait(l, node_id(m), true, 10);
    CHECK(up, "the intruder is linked");
    const char *payloads[] = {
        "", "{", "[]", "null", "{\"type\":\"status\"}", "{\"kind\":\"StateSnapshot\"}",
        "{\"kind\":\"InstanceDeleted\",\"term\":1,\"index\":99,\"instance_id\":\"x\"}",
        "{\"term\":\"a\",\"index\":1,\"full\":false}",
        "{\"kind\":\"DeleteInstance\",\"command_id\":\"c\"}",
        "{\"node_id\":\"intruder\",\"info\":{\"memory_total_bytes\":1}}",
        "{\"type\":\"peers\",\"peers\":[{\"id\":\"x\",\"endpoint\":\"nope\"},7]}",
        "{\"type\":\"pong\",\"t\":\"x\"}",
        "{\"type\":\"head\",\"term\":-1,\"index\":null}",
        "{\"command_id\":\"c\",\"code\":0}",
        "\xff\xfe\x00garbage",
    };
    const size_t n_payloads = sizeof payloads / sizeof payloads[0];
    /* A snapshot from a node that is not the master is not even read. */
    int types[] = {LINK_T_SNAPSHOT, LINK_T_COMMAND, LINK_T_EVENT, LINK_T_EVENT_REQUEST, LINK_T_ELECTION,
                   LINK_T_REPORT, NODE_T_COMMAND_RESULT, NODE_T_CONTROL, NODE_T_PROBE, 40};
    int cuts = 0;
    for (size_t t = 0; up && t < sizeof types / sizeof types[0]; t++) {
        int sent = 0;
        for (size_t p = 0; p < n_payloads; p++) {
            const char *pl = types[t] == NODE_T_PROBE ? "short" : payloads[p];
            sent += link_send(l, node_id(m), types[t], pl, strlen(pl)) == 1;
        }
        /* The node cuts at the LINK_MAX_STRIKES-th; a send after the cut may already fail. */
        CHECK(sent >= LINK_MAX_STRIKES, "type %d: %d malformed messages sent", types[t], sent);
        if (types[t] == LINK_T_SNAPSHOT) {
            intruder_wait(l, node_id(m), false, 0.5);
            CHECK(link_peer_up(l, node_id(m)), "unread snapshots cut nobody");
            continue;
        }
        bool down = intruder_wait(l, node_id(m), false, 10);
        CHECK(down, "type %d: the intruder was not cut after %d malformed payloads", types[t], sent);
        cuts += down;
        up = intruder_wait(l, node_id(m), true, 15);
        CHECK(up, "type %d: the intruder did not link again after its cut", types[t]);
    }
    printf("the intruder was cut %d times\n", cuts);
    struct command c;
    struct command_result res;
    command_init(&c, COMMAND_DELETE_INSTANCE);
    snprintf(c.delete_instance.instance_id, sizeof c.delete_instance.instance_id, "x");
    rc = f ? node_command(f, &c, 10000, &res) : -1;
    CHECK(rc == CAIRN_ENOTFOUND, "the follower's command still reaches the master: %d %s", rc, res.message);
    command_clear(&c);
    CHECK(f && wait_agree(m, f, 2, node_id(m), 30) >= 0, "master and follower still agree");
    struct node_status st;
    node_get_status(m, &st);
    CHECK(st.is_master && st.term == 1, "still master of term 1 (%s, %lld)", st.role, (long long)st.term);
    link_release(l);
    node_release(f);
    node_release(m);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_WARN);
    snprintf(root, sizeof root, "/tmp/cairn-test-node-inproc-%d", (int)getpid());
    mkdir(root, 0700);
    RUN(test_id);
    RUN(test_pair);
    RUN(test_timeout);
    RUN(test_topology);
    RUN(test_coalesce);
    RUN(test_garbage);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_main_end();
}
