/* End to end: real `cairn node` processes find each other by UDP beacons alone
 * (--discovery IFACE, no --peer), inside network namespaces this test makes.
 *
 *   cairn-dn-PID-br   a bridge, and the bridge end of every veth pair
 *   cairn-dn-PID-0..2 one node each (default cluster namespace), 10.213.7.1-3/24
 *   cairn-dn-PID-3    a node with --namespace other, 10.213.7.4/24, same bridge
 *
 * Each node's GET /state (asked inside its network namespace) must list the three
 * nodes and one master, the same on all three, within 60 s; the time that took is
 * printed, not asserted. The fourth node reaches node 0 over the bridge (its API
 * answers from there) yet never joins, nor does it hear of anyone. SIGTERM exits 0.
 *
 * Then plain `cairn`, with no arguments at all (HOME and XDG dirs in the test's dir), in
 * namespaces 0 and 1: alone it is its own master, serves 127.0.0.1:52415 and runs a
 * completion in a runner of its own (discovery, API and worker all on); the second finds
 * it by beacons and follows it; both exit 0 on SIGTERM and no runner outlives them.
 *
 * SAFETY: nothing here beacons on the machine's real interfaces. The veth ends are
 * created straight inside the test's namespaces; each node is started by a child that
 * enters its namespace with setns and checks it is no longer in ours before exec, and
 * it beacons on an interface name that exists only there. The test's own sockets are
 * opened inside a namespace and used from here. Namespaces are deleted at the end,
 * also on failure, and by a janitor process when the test dies any other way; nodes
 * die with the test (PR_SET_PDEATHSIG). Without root, `ip`, or a kernel that lets us
 * make the namespaces, the test prints "skipped" and passes. */
#include "testutil.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netns.h"
#include "nodes.h"

#define N_NODES 4    /* three that must join, and one of another cluster namespace */
#define N_JOIN 3
#define N_NETNS (N_NODES + 1) /* one per node, and the bridge's */
#define BR N_NODES            /* index of the bridge namespace in netns.names */
#define API_PORT 52415        /* the same in every namespace: they do not share ports */
#define CLUSTER_PORT 52416
#define SUBNET "10.213.7."
#define OTHER_NS "other"
#define JOIN_LIMIT_S 60
#define SETTLE_S 5 /* beacons keep flowing this long after the join, to show the outsider stays out */

struct peer {
    pid_t pid;
    char id[80];
    char addr[32];
    char ifname[16];
    char log[512];
};

static char dir[256];
static struct netns netns = {.n = N_NETNS, .home_fd = -1};
static bool outsider_in;  /* a joining node's state named the node of another namespace */
static struct peer peers[N_NODES];

/* A request (body NULL: GET, else POST of JSON) to addr:port, connecting from inside
 * namespace ns (HTTP/1.1, Connection: close). The status (the body into out), or -1
 * when no answer came within timeout_s. */
static int http_in(int ns, const char *addr, int port, const char *path, const char *body, int timeout_s,
                   char *out, size_t cap)
{
    out[0] = 0;
    char req[2048];
    int n = body ? snprintf(req, sizeof req,
                            "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: "
                            "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                            path, addr, strlen(body), body)
                 : snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                            path, addr);
    if (n < 0 || n >= (int)sizeof req)
        return -1;
    int fd = netns_connect(&netns, ns, addr, port, timeout_s);
    if (fd < 0)
        return -1;
    int status = send_all(fd, req, (size_t)n) ? http_read_reply(fd, out, cap, NULL, 0) : -1;
    close(fd);
    return status;
}

static int http_get_in(int ns, const char *addr, int port, const char *path, char *out, size_t cap)
{
    return http_in(ns, addr, port, path, NULL, 5, out, cap);
}

/* GET /state of node i, parsed; NULL when it does not answer 200 with JSON. */
static json_t *state_of(int i)
{
    static char out[1 << 20];
    if (http_get_in(i, peers[i].addr, API_PORT, "/state", out, sizeof out) != 200)
        return NULL;
    return json_loads(out, 0, NULL);
}

/* Starts argv as p's process inside namespace ns, its output into p->log; home, when
 * not NULL, becomes its HOME, with XDG_DATA_HOME and XDG_CACHE_HOME under it and no
 * CAIRN_* setting (a node then keeps everything in home). */
static void spawn_in(struct peer *p, int ns, const char *const *argv, const char *home)
{
    char h[600], data[600], cache[600];
    if (home) {
        snprintf(h, sizeof h, "HOME=%s", home);
        snprintf(data, sizeof data, "XDG_DATA_HOME=%s/data", home);
        snprintf(cache, sizeof cache, "XDG_CACHE_HOME=%s/cache", home);
    }
    const char *const env[] = {h, data, cache, "CAIRN_CLUSTER_SECRET", "CAIRN_MODELS_DIR", NULL};
    p->id[0] = 0;
    p->pid = netns_spawn(&netns, ns, p->log, argv, home ? env : NULL);
}

/* Starts node i in namespace i, beaconing on its veth end; cluster_ns is
 * its --namespace, or NULL. */
static void start_peer(int i, const char *cluster_ns)
{
    struct peer *p = &peers[i];
    char api[16], cl[16], data[512], models[512];
    snprintf(api, sizeof api, "%d", API_PORT);
    snprintf(cl, sizeof cl, "%d", CLUSTER_PORT);
    snprintf(data, sizeof data, "%s/data%d", dir, i);
    snprintf(models, sizeof models, "%s/models", dir);
    snprintf(p->log, sizeof p->log, "%s/node%d.log", dir, i);
    const char *argv[32];
    int k = 0;
    argv[k++] = CAIRN_BINARY;
    argv[k++] = "node";
    argv[k++] = "--discovery";
    argv[k++] = p->ifname;
    argv[k++] = "--api-host";
    argv[k++] = p->addr;
    argv[k++] = "--api-insecure"; /* a namespace of the test's own: no one else can reach it */
    argv[k++] = "--api-port";
    argv[k++] = api;
    argv[k++] = "--cluster-port";
    argv[k++] = cl;
    argv[k++] = "--data-dir";
    argv[k++] = data;
    argv[k++] = "--models-dir";
    argv[k++] = models;
    argv[k++] = "--memory-limit";
    argv[k++] = "1G";
    argv[k++] = "--log-file";
    argv[k++] = "-";
    argv[k++] = "-v";
    if (cluster_ns) {
        argv[k++] = "--namespace";
        argv[k++] = cluster_ns;
    }
    argv[k] = NULL;
    spawn_in(p, i, argv, NULL);
}

/* The end of node i's log, without the API's access lines (the test's polling). */
static void print_peer_log(int i)
{
    print_tail(peers[i].log, 30, " info: http ", "node %d log (%s)", i, peers[i].id);
}

/* What node i's /state holds: its nodes and master. */
static void print_state(int i)
{
    json_t *j = state_of(i);
    json_t *ns = json_object_get(j, "nodes");
    const char *m = json_string_value(json_object_get(json_object_get(j, "master"), "node_id"));
    fprintf(stderr, "node %d (%s): %s, master %s, nodes:", i, peers[i].id, j ? "state" : "no state",
            m ? m : "(none)");
    const char *key;
    json_t *v;
    json_object_foreach(ns, key, v)
        fprintf(stderr, " %s", key);
    fputc('\n', stderr);
    json_decref(j);
}

static bool log_has(int i, const char *text) { return file_has(peers[i].log, text); }

static void kill_nodes(void)
{
    for (int i = 0; i < N_NODES; i++)
        if (peers[i].pid > 0) {
            kill(peers[i].pid, SIGKILL);
            waitpid(peers[i].pid, NULL, 0);
            peers[i].pid = 0;
        }
}

/* Reads every node's /node_id (bound: 30 s for all); false when one never answers. */
static bool read_ids(void)
{
    static char out[4096];
    double t0 = now_s();
    int have = 0;
    while (have < N_NODES && now_s() - t0 < 30 && !netns.lost_home) {
        for (int i = 0; i < N_NODES; i++) {
            if (peers[i].id[0] || http_get_in(i, peers[i].addr, API_PORT, "/node_id", out, sizeof out) != 200)
                continue;
            json_t *j = json_loads(out, 0, NULL);
            const char *id = json_string_value(json_object_get(j, "node_id"));
            if (id && id[0]) {
                snprintf(peers[i].id, sizeof peers[i].id, "%s", id);
                have++;
            }
            json_decref(j);
        }
        if (have < N_NODES)
            sleep_ms(200);
    }
    return have == N_NODES;
}

/* true when node i's /state lists exactly the joining nodes and a master among them
 * (its id into master); sets outsider_in when it names the outsider. */
static bool sees_all(int i, char *master, size_t mcap)
{
    json_t *j = state_of(i);
    json_t *ns = json_object_get(j, "nodes");
    const char *m = json_string_value(json_object_get(json_object_get(j, "master"), "node_id"));
    if (json_object_get(ns, peers[N_JOIN].id) || (m && !strcmp(m, peers[N_JOIN].id)))
        outsider_in = true;
    bool ok = json_is_object(ns) && json_object_size(ns) == N_JOIN && m;
    for (int k = 0; ok && k < N_JOIN; k++)
        ok = json_object_get(ns, peers[k].id) != NULL;
    bool master_ours = false;
    for (int k = 0; ok && k < N_JOIN; k++)
        master_ours |= !strcmp(m, peers[k].id);
    ok = ok && master_ours;
    if (ok)
        snprintf(master, mcap, "%s", m);
    json_decref(j);
    return ok;
}

/* Waits until the three joining nodes each see all three and name the same master;
 * seconds it took, or -1 after limit_s. */
static double wait_joined(double limit_s, char *master, size_t mcap)
{
    double t0 = now_s();
    while (now_s() - t0 < limit_s && !netns.lost_home && !outsider_in) {
        char m[N_JOIN][80];
        bool ok = true;
        for (int i = 0; i < N_JOIN && ok; i++)
            ok = sees_all(i, m[i], sizeof m[i]) && !strcmp(m[i], m[0]);
        if (ok) {
            snprintf(master, mcap, "%s", m[0]);
            return now_s() - t0;
        }
        sleep_ms(250);
    }
    return -1;
}

/* ---- Plain `cairn`: no arguments at all, everything on ---- */

#define N_PLAIN 2 /* plain[k] runs in namespace k, after the four nodes above are gone */
#define PLAIN_MODEL "tiny"
static struct peer plain[N_PLAIN];

/* Reads plain node k's /node_id (its API on 127.0.0.1 inside its namespace); bound 30 s. */
static bool plain_id(int k)
{
    static char out[4096];
    plain[k].id[0] = 0;
    for (double t0 = now_s(); !plain[k].id[0] && now_s() - t0 < 30 && !netns.lost_home;) {
        if (http_get_in(k, "127.0.0.1", API_PORT, "/node_id", out, sizeof out) == 200) {
            json_t *j = json_loads(out, 0, NULL);
            const char *id = json_string_value(json_object_get(j, "node_id"));
            if (id && id[0])
                snprintf(plain[k].id, sizeof plain[k].id, "%s", id);
            json_decref(j);
        }
        if (!plain[k].id[0])
            sleep_ms(200);
    }
    return plain[k].id[0] != 0;
}

static json_t *plain_state(int k)
{
    static char out[1 << 20];
    if (http_get_in(k, "127.0.0.1", API_PORT, "/state", out, sizeof out) != 200)
        return NULL;
    return json_loads(out, 0, NULL);
}

/* true when plain node k's /state lists exactly plain nodes 0..n-1 and names master. */
static bool plain_sees(int k, int n, const char *master)
{
    json_t *j = plain_state(k);
    json_t *ns = json_object_get(j, "nodes");
    const char *m = json_string_value(json_object_get(json_object_get(j, "master"), "node_id"));
    bool ok = json_is_object(ns) && json_object_size(ns) == (size_t)n && m && !strcmp(m, master);
    for (int i = 0; ok && i < n; i++)
        ok = json_object_get(ns, plain[i].id) != NULL;
    json_decref(j);
    return ok;
}

/* The runner processes among pid's children (from /proc/PID/task/TID/children); count. */
static int runners_of(pid_t pid, pid_t *out, int max)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < max;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        int c;
        while (f && n < max && fscanf(f, "%d", &c) == 1) {
            char cl[300], cmd[256] = "";
            snprintf(cl, sizeof cl, "/proc/%d/cmdline", c);
            FILE *g = fopen(cl, "r");
            size_t len = g ? fread(cmd, 1, sizeof cmd - 1, g) : 0;
            if (g)
                fclose(g);
            /* argv[1] is the sub-command: "cairn\0runner\0..." */
            if (len > strlen(cmd) + 1 && !strncmp(cmd + strlen(cmd) + 1, "runner", 6))
                out[n++] = (pid_t)c;
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* true while pid is a live process (not gone, not a zombie: those have no cmdline). */
static bool alive(pid_t pid)
{
    char path[64], c;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "r");
    bool live = f && fread(&c, 1, 1, f) == 1;
    if (f)
        fclose(f);
    return live;
}

static void print_plain_log(int k)
{
    print_tail(plain[k].log, 30, " info: http ", "plain node %d log (%s)", k, plain[k].id);
}

/* `cairn` with no arguments, its HOME and XDG dirs in the test's dir: alone it is its
 * own master with the worker on (a completion runs in a runner of its own) and the
 * API on 127.0.0.1:52415; a second plain node on the same bridge finds it by beacons,
 * and the first stays master. SIGTERM: both exit 0 and no runner outlives them. */
static void test_plain(void)
{
    static char out[1 << 16];
    char home[N_PLAIN][512], models[600], path[700], cmd[2400];
    const char *const argv[] = {CAIRN_BINARY, NULL};
    pid_t runners[16];
    int n_runners = 0;
    for (int k = 0; k < N_PLAIN; k++) {
        snprintf(home[k], sizeof home[k], "%s/plain%d", dir, k);
        snprintf(plain[k].log, sizeof plain[k].log, "%s/plain%d.log", dir, k);
    }
    /* the default models dir of the first: $XDG_DATA_HOME/cairn/models */
    snprintf(models, sizeof models, "%s/data/cairn/models", home[0]);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && '%s' mkmodel --shape tiny --vocab '%s' -o '%s/" PLAIN_MODEL
             ".gguf' >'%s/plain-mkmodel.log' 2>&1", models, CAIRN_BINARY,
             test_data_path("vocab/ggml-vocab-llama-spm.gguf"), models, dir);
    int rc = system(cmd);
    CHECK(rc == 0, "mkmodel failed (%d), see %s/plain-mkmodel.log", rc, dir);
    if (rc)
        return;

    spawn_in(&plain[0], 0, argv, home[0]);
    bool up = plain_id(0);
    CHECK(up, "plain `cairn` answers /node_id on 127.0.0.1:%d inside its namespace (bound 30 s)", API_PORT);
    if (!up)
        goto fail;
    const char *a = plain[0].id;
    bool alone = false;
    for (double t0 = now_s(); !alone && now_s() - t0 < 30; sleep_ms(200))
        alone = plain_sees(0, 1, a);
    CHECK(alone, "plain `cairn` alone lists itself as the only node and as master (bound 30 s)");
    json_t *s = plain_state(0);
    json_t *info = json_object_get(json_object_get(json_object_get(s, "nodes"), a), "info");
    json_int_t avail = json_integer_value(json_object_get(info, "memory_available_bytes"));
    CHECK(avail > 0, "plain `cairn` offers memory to models (worker on; a --no-worker node offers 0): %lld",
          (long long)avail);
    json_decref(s);
    CHECK(file_has(plain[0].log, "discovery auto, worker on"), "plain `cairn` logs discovery auto, worker on");
    snprintf(path, sizeof path, "%s/cache/cairn/node.log", home[0]);
    CHECK(file_has(path, "discovery auto"), "plain `cairn` logs to $XDG_CACHE_HOME/cairn/node.log");

    /* Worker: a completion, placed on demand, runs in a runner of this node. */
    rc = http_in(0, "127.0.0.1", API_PORT, "/v1/completions",
                 "{\"model\":\"" PLAIN_MODEL "\",\"prompt\":\"Hello\",\"max_tokens\":4,\"temperature\":0}", 180, out,
                 sizeof out);
    CHECK(rc == 200 && strstr(out, "\"choices\""), "a completion on plain `cairn`: %d %.300s", rc, out);
    s = plain_state(0);
    json_t *rs = json_object_get(s, "runners");
    const char *key;
    json_t *r;
    int mine = 0;
    json_object_foreach(rs, key, r)
        mine += !strcmp(json_string_value(json_object_get(r, "node_id")) ?: "", a);
    json_decref(s);
    CHECK(mine == 1, "plain `cairn`'s state holds one runner of its own (%d)", mine);
    n_runners = runners_of(plain[0].pid, runners, 16);
    CHECK(n_runners == 1, "plain `cairn` has one runner process (%d)", n_runners);

    /* A second plain node on the bridge: found by beacons alone; the first stays master. */
    double t0 = now_s();
    spawn_in(&plain[1], 1, argv, home[1]);
    up = plain_id(1);
    CHECK(up, "the second plain `cairn` answers /node_id (bound 30 s)");
    if (!up)
        goto fail;
    bool joined = false;
    while (!joined && now_s() - t0 < JOIN_LIMIT_S && !netns.lost_home) {
        joined = plain_sees(0, 2, a) && plain_sees(1, 2, a);
        if (!joined)
            sleep_ms(250);
    }
    CHECK(joined, "two plain nodes each list both, the first as master (bound %d s)", JOIN_LIMIT_S);
    if (!joined)
        goto fail;
    printf("figure: two plain `cairn` nodes see each other %.2f s after the second started\n", now_s() - t0);
    /* The link came from whichever heard the other first; each hears the other's beacons
     * within a few intervals. */
    for (int k = 0; k < N_PLAIN; k++) {
        bool found = false;
        for (double t1 = now_s(); !found && now_s() - t1 < 15; sleep_ms(100))
            found = file_has(plain[k].log, "discovery: found node");
        CHECK(found, "plain node %d heard the other's beacons (bound 15 s)", k);
    }

    for (int k = 0; k < N_PLAIN; k++) {
        kill(plain[k].pid, SIGTERM);
        int code = wait_exit(plain[k].pid, 30);
        plain[k].pid = 0;
        CHECK(code == 0, "plain node %d exits 0 on SIGTERM (got %d)", k, code);
        if (code != 0)
            print_plain_log(k);
    }
    bool left = true;
    for (double t1 = now_s(); left && now_s() - t1 < 10; sleep_ms(50)) {
        left = false;
        for (int i = 0; i < n_runners; i++)
            left |= alive(runners[i]);
    }
    CHECK(!left, "no runner of plain `cairn` outlives it");
    return;

fail:
    for (int k = 0; k < N_PLAIN; k++)
        print_plain_log(k);
}

static void kill_plain(void)
{
    for (int k = 0; k < N_PLAIN; k++)
        if (plain[k].pid > 0) {
            kill(plain[k].pid, SIGKILL);
            waitpid(plain[k].pid, NULL, 0);
            plain[k].pid = 0;
        }
}

/* The namespaces, the bridge and one veth pair per node; false (and a message saying
 * which command failed) when the kernel or the container refuses. */
static bool make_network(void)
{
    const char *br = netns.names[BR];
    char brdev[16];
    snprintf(brdev, sizeof brdev, "cdb%d", (int)getpid());
    if (!netns_add(&netns))
        return false;
    const char *bridge[][12] = {
        {"ip", "-n", br, "link", "set", "lo", "up", NULL},
        {"ip", "-n", br, "link", "add", brdev, "type", "bridge", NULL},
        {"ip", "-n", br, "link", "set", brdev, "up", NULL},
    };
    for (size_t c = 0; c < sizeof bridge / sizeof bridge[0]; c++)
        if (run_argv(bridge[c], true) != 0) {
            printf("skipped: `ip -n %s link ...` (the bridge) failed: the kernel refuses\n", br);
            return false;
        }
    for (int i = 0; i < N_NODES; i++) {
        const char *ns = netns.names[i];
        char peer[16], cidr[40];
        snprintf(peer, sizeof peer, "cdp%d%c", (int)getpid() % 1000000, 'a' + i);
        snprintf(cidr, sizeof cidr, "%s/24", peers[i].addr);
        /* Both ends are made inside their namespaces, never in ours. */
        const char *cmds[][16] = {
            {"ip", "link", "add", peers[i].ifname, "netns", ns, "type", "veth", "peer", "name", peer,
             "netns", br, NULL},
            {"ip", "-n", br, "link", "set", peer, "master", brdev, NULL},
            {"ip", "-n", br, "link", "set", peer, "up", NULL},
            {"ip", "-n", ns, "addr", "add", cidr, "brd", "+", "dev", peers[i].ifname, NULL},
            {"ip", "-n", ns, "link", "set", "lo", "up", NULL},
            {"ip", "-n", ns, "link", "set", peers[i].ifname, "up", NULL},
        };
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++)
            if (run_argv(cmds[c], true) != 0) {
                printf("skipped: `%s %s %s %s %s` failed: the kernel refuses the test network\n", cmds[c][0],
                       cmds[c][1], cmds[c][2], cmds[c][3], cmds[c][4]);
                return false;
            }
    }
    return true;
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    const char *why = netns_open(&netns);
    if (why)
        return test_skip("%s", why);
    int pid = (int)getpid();
    for (int i = 0; i < N_NETNS; i++) {
        if (i == BR)
            snprintf(netns.names[i], sizeof netns.names[i], "cairn-dn-%d-br", pid);
        else
            snprintf(netns.names[i], sizeof netns.names[i], "cairn-dn-%d-%d", pid, i);
    }
    for (int i = 0; i < N_NODES; i++) {
        snprintf(peers[i].addr, sizeof peers[i].addr, SUBNET "%d", i + 1);
        /* names that exist only inside the test namespaces (at most 15 bytes) */
        snprintf(peers[i].ifname, sizeof peers[i].ifname, "cdn%d%c", pid % 1000000, 'a' + i);
    }
    snprintf(dir, sizeof dir, "/tmp/cairn-test-dn-%d", pid);
    mkdir(dir, 0700);
    char path[512];
    snprintf(path, sizeof path, "%s/models", dir);
    mkdir(path, 0700);

    int wfd = -1;
    pid_t janitor = netns_janitor(&netns, dir, &wfd);
    if (janitor < 0) {
        return test_skip("cannot fork the janitor that deletes the namespaces");
    }
    bool net = make_network();
    char master[80] = "";
    static char out[1 << 16];
    if (!net)
        goto out;

    double t0 = now_s();
    for (int i = 0; i < N_NODES; i++)
        start_peer(i, i < N_JOIN ? NULL : OTHER_NS);
    bool up = read_ids();
    CHECK(up, "every node's API answers /node_id inside its namespace (bound 30 s)");
    if (!up)
        goto fail;
    double joined = wait_joined(JOIN_LIMIT_S, master, sizeof master);
    CHECK(!outsider_in, "no joining node names the outsider %s (--namespace " OTHER_NS ")", peers[N_JOIN].id);
    CHECK(joined >= 0, "the three nodes each list all three and the same master (bound %d s)", JOIN_LIMIT_S);
    if (joined < 0)
        goto fail;
    printf("figure: three nodes see each other %.2f s after start (beacons alone)\n", now_s() - t0);
    printf("master: %s\n", master);
    for (int i = 0; i < N_JOIN; i++)
        CHECK(log_has(i, "discovery: found node"), "node %d found its peers by discovery (see its log)", i);

    /* The outsider shares the bridge (node 0's API answers it over it), yet stays out. */
    int st = http_get_in(N_JOIN, peers[0].addr, API_PORT, "/node_id", out, sizeof out);
    CHECK(st == 200 && strstr(out, peers[0].id), "node 0's API answers from the outsider's namespace: %d %s",
          st, out);
    sleep_ms(SETTLE_S * 1000);
    CHECK(wait_joined(10, master, sizeof master) >= 0 && !outsider_in,
          "still exactly the three nodes after %d s more, the outsider not among them", SETTLE_S);
    for (int i = 0; i < N_JOIN; i++) {
        json_t *j = state_of(i);
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        CHECK(text && !strstr(text, peers[N_JOIN].id), "node %d's state never names the outsider %s", i,
              peers[N_JOIN].id);
        free(text);
        json_decref(j);
    }
    json_t *j3 = state_of(N_JOIN);
    json_t *ns3 = json_object_get(j3, "nodes");
    CHECK(json_object_size(ns3) == 1 && json_object_get(ns3, peers[N_JOIN].id),
          "the outsider's state holds only itself (%zu nodes)", json_object_size(ns3));
    json_decref(j3);
    CHECK(!log_has(N_JOIN, "discovery: found node"), "the outsider found nobody by discovery");

    /* SIGTERM: clean exits. */
    for (int i = 0; i < N_NODES; i++) {
        kill(peers[i].pid, SIGTERM);
        int code = wait_exit(peers[i].pid, 15);
        peers[i].pid = 0;
        CHECK(code == 0, "node %d exits 0 on SIGTERM (got %d)", i, code);
        if (code != 0)
            print_peer_log(i);
    }
    RUN(test_plain);
    goto out;

fail:
    for (int i = 0; i < N_NODES; i++)
        print_state(i);
    for (int i = 0; i < N_NODES; i++)
        print_peer_log(i);
out:
    kill_nodes();
    kill_plain();
    netns_close(&netns, janitor, wfd, dir);
    if (!net && !test_failed)
        return TEST_SKIPPED; /* make_network said why */
    return test_main_end();
}
