/* Elections of whole clusters on a fake network and a fake clock: nodes that start
 * together agree on one master; a node that joins later follows it (sticky), even when
 * it ranks higher; a lost master is replaced within a few seconds; --force-master takes
 * over; two halves of a split cluster converge when they meet; garbage is refused;
 * and an election and a failover work when nodes are ticked only when election_due_ms
 * says so (or a message comes), with few ticks while settled. */
#include "ctl/election.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "testutil.h"

#define MAX_NODES 6
#define MAX_QUEUE 4096
#define STEP_MS 10

struct msg {
    int from, to;
    char *json;
};

struct sim;

struct simnode {
    struct sim *sim;
    int idx;
    struct election *e;
    bool alive;
};

struct sim {
    struct simnode nodes[MAX_NODES];
    int n;
    bool link[MAX_NODES][MAX_NODES]; /* link[i][j]: i and j are connected (both up) */
    struct msg queue[MAX_QUEUE];
    int n_queue;
    int64_t now;
    /* Tick a node only when election_due_ms says something is due or a message came,
     * as the node thread does (it sleeps until then); ticks counts those calls. */
    bool due_driven;
    bool got[MAX_NODES];
    int64_t ticks[MAX_NODES];
};

static char err[512];

static const char *name(int i)
{
    static const char *const names[] = {"n0", "n1", "n2", "n3", "n4", "n5"};
    return names[i];
}

static int index_of(const char *id)
{
    for (int i = 0; i < MAX_NODES; i++)
        if (!strcmp(name(i), id))
            return i;
    return -1;
}

static void enqueue(struct sim *s, int from, int to, const char *json, size_t len)
{
    if (s->n_queue == MAX_QUEUE)
        return;
    char *copy = malloc(len + 1);
    memcpy(copy, json, len);
    copy[len] = 0;
    s->queue[s->n_queue++] = (struct msg){from, to, copy};
}

static void sim_send(void *ctx, const char *to, const char *json, size_t len)
{
    struct simnode *sn = ctx;
    struct sim *s = sn->sim;
    if (to) {
        int k = index_of(to);
        if (k >= 0 && s->link[sn->idx][k])
            enqueue(s, sn->idx, k, json, len);
        return;
    }
    for (int k = 0; k < s->n; k++)
        if (k != sn->idx && s->link[sn->idx][k])
            enqueue(s, sn->idx, k, json, len);
}

static void start_node(struct sim *s, int i, int64_t since, bool force, int64_t term)
{
    struct simnode *sn = &s->nodes[i];
    sn->sim = s;
    sn->idx = i;
    sn->alive = true;
    struct election_config cfg = {
        .node_id = name(i),
        .force_master = force,
        .since_ms = since,
        .term = term,
        .send = sim_send,
        .send_ctx = sn,
    };
    int rc = election_create(&sn->e, &cfg, s->now, err, sizeof err);
    CHECK(rc == 0, "create %s: %s", name(i), err);
    if (i >= s->n)
        s->n = i + 1;
}

static void sim_connect(struct sim *s, int a, int b)
{
    if (s->link[a][b] || !s->nodes[a].alive || !s->nodes[b].alive)
        return;
    s->link[a][b] = s->link[b][a] = true;
    election_peer_up(s->nodes[a].e, name(b), s->now);
    election_peer_up(s->nodes[b].e, name(a), s->now);
}

static void disconnect(struct sim *s, int a, int b)
{
    if (!s->link[a][b])
        return;
    s->link[a][b] = s->link[b][a] = false;
    if (s->nodes[a].alive)
        election_peer_down(s->nodes[a].e, name(b), s->now);
    if (s->nodes[b].alive)
        election_peer_down(s->nodes[b].e, name(a), s->now);
}

static void kill_node(struct sim *s, int i)
{
    for (int k = 0; k < s->n; k++)
        disconnect(s, i, k);
    s->nodes[i].alive = false;
}

static void connect_all(struct sim *s)
{
    for (int a = 0; a < s->n; a++)
        for (int b = a + 1; b < s->n; b++)
            sim_connect(s, a, b);
}

/* Delivers what is queued (messages sent meanwhile go out on the next step). */
static void deliver(struct sim *s)
{
    int n = s->n_queue;
    struct msg batch[MAX_QUEUE];
    memcpy(batch, s->queue, (size_t)n * sizeof *batch);
    s->n_queue = 0;
    for (int i = 0; i < n; i++) {
        struct msg *m = &batch[i];
        if (s->nodes[m->to].alive && s->link[m->from][m->to]) {
            json_t *j = json_loads(m->json, 0, NULL);
            s->got[m->to] = true;
            int rc = election_receive(s->nodes[m->to].e, name(m->from), j, s->now, err, sizeof err);
            CHECK(rc == 0, "%s -> %s refused %s: %s", name(m->from), name(m->to), m->json, err);
            json_decref(j);
        }
        free(m->json);
    }
}

static void step(struct sim *s)
{
    s->now += STEP_MS;
    memset(s->got, 0, sizeof s->got);
    deliver(s);
    for (int i = 0; i < s->n; i++) {
        if (!s->nodes[i].alive)
            continue;
        if (s->due_driven && !s->got[i] && election_due_ms(s->nodes[i].e, s->now) > 0)
            continue;
        s->ticks[i]++;
        election_tick(s->nodes[i].e, s->now);
    }
}

/* The master every live node agrees on and has confirmed, or -1. */
static int agreed_master(struct sim *s)
{
    int m = -1;
    for (int i = 0; i < s->n; i++) {
        if (!s->nodes[i].alive)
            continue;
        struct election *e = s->nodes[i].e;
        enum election_role r = election_role(e);
        if (r != ELECTION_MASTER && (r != ELECTION_FOLLOWER || !election_confirmed(e)))
            return -1;
        int k = index_of(election_master(e));
        if (k < 0 || (m >= 0 && k != m))
            return -1;
        m = k;
    }
    for (int i = 0; i < s->n; i++) /* one term for all */
        if (s->nodes[i].alive && election_term(s->nodes[i].e) != election_term(s->nodes[m].e))
            return -1;
    return m;
}

/* Runs until the live nodes agree (and stay so for a second); returns the master and
 * the time it took in *ms, or -1 after limit_ms. */
static int settle(struct sim *s, int64_t limit_ms, int64_t *ms)
{
    int64_t start = s->now, agreed_at = -1;
    int m = -1;
    while (s->now - start < limit_ms) {
        step(s);
        int a = agreed_master(s);
        if (a < 0 || a != m) {
            m = a;
            agreed_at = a < 0 ? -1 : s->now;
        }
        if (m >= 0 && s->now - agreed_at >= 1000) {
            if (ms)
                *ms = agreed_at - start;
            return m;
        }
    }
    return -1;
}

static void sim_free(struct sim *s)
{
    for (int i = 0; i < s->n_queue; i++)
        free(s->queue[i].json);
    for (int i = 0; i < s->n; i++)
        election_release(s->nodes[i].e);
    memset(s, 0, sizeof *s);
}

static int masters(struct sim *s)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += s->nodes[i].alive && election_role(s->nodes[i].e) == ELECTION_MASTER;
    return n;
}

static struct sim sim;

static void test_start_together(void)
{
    struct sim *s = &sim;
    start_node(s, 0, 1000, false, 0);
    start_node(s, 1, 900, false, 0); /* up the longest */
    start_node(s, 2, 1100, false, 0);
    connect_all(s);
    int64_t ms = 0;
    int m = settle(s, 10000, &ms);
    CHECK(m == 1, "the most senior node leads: got %d after %lld ms", m, (long long)ms);
    CHECK(masters(s) == 1, "one master (%d)", masters(s));
    CHECK(m < 0 || election_term(s->nodes[m].e) == 1, "term 1 (%lld)",
          (long long)(m < 0 ? -1 : election_term(s->nodes[m].e)));
    CHECK(ms <= ELECTION_SETTLE_MS + 2 * ELECTION_CAMPAIGN_MS, "agreed within %lld ms", (long long)ms);

    /* A node that joins, more senior than everyone, follows the working master. */
    start_node(s, 3, 10, false, 0);
    sim_connect(s, 3, 0);
    sim_connect(s, 3, 1);
    sim_connect(s, 3, 2);
    int again = settle(s, 10000, &ms);
    CHECK(again == 1 && election_term(s->nodes[3].e) == 1,
          "sticky: still %d (got %d), term %lld", m, again, (long long)election_term(s->nodes[3].e));

    /* The master dies: the others elect the most senior of them, in a few seconds. */
    kill_node(s, 1);
    int next = settle(s, 10000, &ms);
    CHECK(next == 3, "new master n3 (the most senior left): got %d", next);
    CHECK(ms <= 2 * ELECTION_CAMPAIGN_MS + 500, "new master within %lld ms", (long long)ms);
    CHECK(next < 0 || election_term(s->nodes[next].e) == 2, "term 2");

    /* A --force-master node joins and takes over. */
    start_node(s, 4, 5000, true, 0);
    for (int i = 0; i < 4; i++)
        sim_connect(s, 4, i);
    int forced = settle(s, 15000, &ms);
    CHECK(forced == 4, "force-master leads: got %d", forced);
    CHECK(forced < 0 || election_term(s->nodes[forced].e) >= 3, "in a newer term (%lld)",
          (long long)(forced < 0 ? -1 : election_term(s->nodes[forced].e)));

    /* A follower that only loses its link to the master campaigns; the master, still
     * reachable by the others, wins again as the incumbent. */
    disconnect(s, 4, 0);
    int inc = settle(s, 15000, &ms);
    CHECK(inc == -1 || inc == 4, "incumbent or no agreement while n0 cannot reach it: %d", inc);
    sim_connect(s, 4, 0);
    inc = settle(s, 15000, &ms);
    CHECK(inc == 4, "healed: the force-master leads again (%d)", inc);
    sim_free(s);
}

/* The node thread sleeps for election_due_ms: elections must work when a node is ticked
 * only then (or when a message comes), and a settled cluster must have little to do. A
 * follower's confirm deadline, long passed, once counted as due for ever, so every
 * follower's thread polled without sleeping (issue 14). */
static void test_due_driven(void)
{
    struct sim *s = &sim;
    s->due_driven = true;
    start_node(s, 0, 1000, false, 0);
    start_node(s, 1, 900, false, 0);
    start_node(s, 2, 1100, false, 0);
    connect_all(s);
    int64_t ms = 0;
    int m = settle(s, 10000, &ms);
    CHECK(m == 1, "due-driven: the most senior node leads: got %d after %lld ms", m, (long long)ms);
    CHECK(ms <= ELECTION_SETTLE_MS + 2 * ELECTION_CAMPAIGN_MS, "due-driven: agreed within %lld ms",
          (long long)ms);

    /* Settled, over 10 s past the confirm deadline: each node is due only for its
     * statuses (one a second) and ticks for the statuses it hears (two peers). */
    for (int i = 0; i < 300; i++)
        step(s);
    int64_t before[MAX_NODES];
    memcpy(before, s->ticks, sizeof before);
    for (int i = 0; i < 1000; i++) /* 10 s */
        step(s);
    for (int i = 0; i < 3; i++) {
        int64_t t = s->ticks[i] - before[i];
        CHECK(t <= 3 * 10000 / ELECTION_STATUS_MS + 3, "%s ticked %lld times in 10 quiet s", name(i), (long long)t);
        int64_t due = election_due_ms(s->nodes[i].e, s->now);
        CHECK(due > 0 && due <= ELECTION_STATUS_MS, "%s: next due in %lld ms", name(i), (long long)due);
    }
    CHECK(agreed_master(s) == 1, "still agreed on n1");

    /* The master dies: the followers' deadlines bring a new one without other ticks. */
    kill_node(s, 1);
    m = settle(s, 10000, &ms);
    CHECK(m == 0, "due-driven: n0 (the most senior left) leads: got %d", m);
    CHECK(ms <= ELECTION_CONFIRM_MS + 2 * ELECTION_CAMPAIGN_MS + 500, "due-driven: new master within %lld ms",
          (long long)ms);
    sim_free(s);
}

static void test_split(void)
{
    struct sim *s = &sim;
    for (int i = 0; i < 4; i++)
        start_node(s, i, 1000 + i, false, 0);
    sim_connect(s, 0, 1);
    sim_connect(s, 2, 3);
    int64_t ms;
    /* Each half elects its own master (agreement across halves is impossible). */
    for (int i = 0; i < 400; i++)
        step(s);
    CHECK(masters(s) == 2, "two halves, two masters (%d)", masters(s));
    CHECK(election_role(s->nodes[0].e) == ELECTION_MASTER &&
              election_role(s->nodes[2].e) == ELECTION_MASTER,
          "n0 and n2 lead their halves");
    /* The halves meet: one master, in a term above both. */
    connect_all(s);
    int m = settle(s, 15000, &ms);
    CHECK(m == 0, "one master after the split heals: %d", m);
    CHECK(m < 0 || election_term(s->nodes[m].e) >= 2, "a new term (%lld)",
          (long long)(m < 0 ? -1 : election_term(s->nodes[m].e)));
    sim_free(s);

    /* A restarted node knows a term from its log and campaigns above it. */
    start_node(s, 0, 1000, false, 7);
    int alone = settle(s, 10000, &ms);
    CHECK(alone == 0 && election_term(s->nodes[0].e) == 8, "alone: master of term 8 (%lld)",
          (long long)election_term(s->nodes[0].e));
    sim_free(s);
}

static void test_garbage(void)
{
    struct sim *s = &sim;
    start_node(s, 0, 1, false, 0);
    struct election *e = s->nodes[0].e;
    const char *bad[] = {
        "{}",
        "{\"type\":\"status\"}",
        "{\"type\":\"status\",\"term\":-1,\"master\":null,\"force\":false,\"since_ms\":0}",
        "{\"type\":\"status\",\"term\":1,\"master\":\"a b\",\"force\":false,\"since_ms\":0}",
        "{\"type\":\"status\",\"term\":1,\"master\":null,\"force\":1,\"since_ms\":0}",
        "{\"type\":\"ballot\",\"term\":0,\"force\":false,\"incumbent\":false,\"since_ms\":0}",
        "{\"type\":\"ballot\",\"term\":1,\"force\":false,\"incumbent\":false,\"since_ms\":0,\"x\":1}",
        "{\"type\":7}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        int rc = election_receive(e, "n1", j, 0, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT, "%s: rc %d (%s)", bad[i], rc, err);
        json_decref(j);
    }
    json_t *j = json_loads("{\"type\":\"peers\"}", 0, NULL);
    CHECK(election_receive(e, "n1", j, 0, err, sizeof err) == CAIRN_ENOTFOUND,
          "other types are not the election's");
    json_decref(j);
    CHECK(election_role(e) == ELECTION_STARTING && election_term(e) == 0, "garbage changed nothing");
    struct election *x = NULL;
    struct election_config cfg = {.node_id = "bad id", .send = sim_send};
    CHECK(election_create(&x, &cfg, 0, err, sizeof err) == CAIRN_EINVAL && !x, "bad id refused");
    sim_free(s);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_WARN);
    RUN(test_start_together);
    RUN(test_due_driven);
    RUN(test_split);
    RUN(test_garbage);
    return test_main_end();
}
