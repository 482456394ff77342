/* End to end: one model pipelined across two `cairn node` processes that live in two
 * network namespaces joined by a veth pair, and what happens when that link is cut.
 *
 *   cairn-pn-PID-a   node A, 10.213.0.1/24 on its veth end, the API the test speaks to
 *   cairn-pn-PID-b   node B, 10.213.0.2/24, --peer A
 *
 * 1. Both nodes list each other in A's /state.
 * 2. A single-node instance of a tiny llama (cairn mkmodel) answers 3 greedy prompts.
 * 3. A pipelined instance ("sharding":"pipeline", min_nodes 2) has one rank on each
 *    node, a runner process in each namespace, and gives the same 3 texts.
 * 4. A stream runs on A; once tokens flow, B's veth end goes down. The stream must end
 *    within a bound, with an error event or cut short, never "length" nor [DONE]; A
 *    still answers; B leaves A's cluster (--node-timeout 5).
 * 5. The link comes back: B rejoins, and a completion on A of the model works again.
 * 6. SIGTERM: both nodes exit 0 within a bound and no runner process outlives them.
 * The times cut -> stream end and link up -> first good completion are printed.
 *
 * SAFETY: all traffic stays inside the two namespaces. Each node is started by a child
 * that enters its namespace with setns and checks it left ours before exec; the test's
 * own sockets are made inside a namespace. The namespaces are deleted at the end, also
 * on failure, and by a janitor process when the test dies any other way; nodes die with
 * the test (PR_SET_PDEATHSIG) and runners orphaned by a node come to this process (a
 * child subreaper) to be checked and killed. Without root, `ip`, or a kernel that lets
 * us make the namespaces, the test prints "skipped" and passes. */
#include "testutil.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "netns.h"
#include "nodes.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 4 /* everything, runners included, is several times slower under ASan */
#else
#define SLOW 1
#endif

#define MODEL "tiny"
#define N_PROMPTS 3
#define MAX_TOKENS 24
#define NODE_TIMEOUT_S 5
#define MAX_RUNNERS 64

struct peer {
    pid_t pid;
    char id[80];
    char addr[16];
    char ifname[16];
    char log[512];
    int api;
    int cluster;
};

static const char *const prompts[N_PROMPTS] = {"Hello", "Tell me about cats.", "What is 2+2?"};

static char dir[256];
static struct netns netns = {.n = 2, .home_fd = -1};
static struct peer peers[2];
static pid_t janitor;
static pid_t runners_seen[MAX_RUNNERS]; /* every runner process a node had while we looked */
static int n_runners_seen;

/* Connects, from inside node i's namespace, to node i's API and sends one request
 * (Connection: close). The socket (non-blocking once connected), or -1. */
static int send_request(int i, const char *method, const char *path, const char *body)
{
    int fd = netns_connect(&netns, i, peers[i].addr, peers[i].api, 5 * SLOW);
    if (fd < 0)
        return -1;
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, peers[i].addr, blen);
    bool ok = send_all(fd, head, (size_t)n) && send_all(fd, body, blen);
    if (!ok || fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A growing byte buffer, always NUL-terminated. */
struct buf {
    char *p;
    size_t len, cap;
};

static bool buf_add(struct buf *b, const char *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

/* Reads what is there on fd into b: 1 more came, 0 nothing yet, -1 the end (EOF or a
 * socket error). Waits at most wait_ms for something. */
static int read_some(int fd, struct buf *b, int wait_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, wait_ms);
    if (pr <= 0)
        return pr < 0 && errno != EINTR ? -1 : 0;
    char tmp[16384];
    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
    if (r > 0)
        return buf_add(b, tmp, (size_t)r) ? 1 : -1;
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    return -1;
}

/* Where the header block of the raw reply in b ends (past its blank line), or NULL. */
static const char *body_of(const struct buf *b)
{
    const char *e = b->p ? strstr(b->p, "\r\n\r\n") : NULL;
    return e ? e + 4 : NULL;
}

/* true when the header block of the raw reply in b says Transfer-Encoding: chunked. */
static bool is_chunked(const struct buf *b)
{
    const char *body = body_of(b);
    /* each header follows a line break; the first one ends the status line */
    for (const char *br = body ? strstr(b->p, "\r\n") : NULL; br && br < body; br = strstr(br + 2, "\r\n")) {
        const char *h = br + 2;
        if (!strncasecmp(h, "Transfer-Encoding:", 18)) {
            h += 18;
            while (*h == ' ')
                h++;
            return !strncasecmp(h, "chunked", 7);
        }
    }
    return false;
}

/* The body of the raw reply in b, de-chunked when it came chunked, into out (malloc'd,
 * NUL-terminated). *complete: the reply's own framing says it ended (the last chunk),
 * or it is not chunked. */
static char *decode_body(const struct buf *b, bool *complete)
{
    const char *p = body_of(b);
    *complete = false;
    if (!p)
        return strdup("");
    if (!is_chunked(b)) {
        *complete = true;
        return strdup(p);
    }
    const char *end = b->p + b->len;
    struct buf out = {0};
    buf_add(&out, "", 0);
    while (p < end) {
        char *q;
        unsigned long n = strtoul(p, &q, 16);
        const char *data = strstr(q, "\r\n");
        if (q == p || !data)
            break;
        data += 2;
        if (n == 0) {
            *complete = true;
            break;
        }
        if ((size_t)(end - data) < n + 2) { /* a chunk cut short, or without its line break */
            buf_add(&out, data, (size_t)(end - data) < n ? (size_t)(end - data) : n);
            break;
        }
        buf_add(&out, data, n);
        p = data + n + 2;
    }
    return out.p;
}

/* One request to node i's API; the status (body into *out, malloc'd, the caller frees
 * it), or -1 when no whole reply came within limit_s. */
static int http_in(int i, const char *method, const char *path, const char *body, double limit_s, char **out)
{
    *out = NULL;
    int fd = send_request(i, method, path, body);
    if (fd < 0)
        return -1;
    struct buf b = {0};
    double t0 = now_s();
    int r = 0;
    while (now_s() - t0 < limit_s && (r = read_some(fd, &b, 200)) >= 0)
        ;
    close(fd);
    int status = -1;
    bool complete = false;
    if (r < 0 && b.p && sscanf(b.p, "HTTP/1.%*d %d", &status) == 1) {
        *out = decode_body(&b, &complete);
        if (!complete)
            status = -1;
    }
    free(b.p);
    return status;
}

/* GET path of node i as JSON; NULL when it does not answer 200 with JSON within 10 s. */
static json_t *get_json_in(int i, const char *path)
{
    char *out;
    json_t *j = NULL;
    if (http_in(i, "GET", path, NULL, 10 * SLOW, &out) == 200)
        j = json_loads(out, 0, NULL);
    free(out);
    return j;
}

static const char *str_of(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Starts node i in its namespace; with_peer: told of node A with --peer. */
static void start_peer(int i, bool with_peer)
{
    struct peer *p = &peers[i];
    char data[512], models[512], peer_arg[64], timeout[16];
    snprintf(data, sizeof data, "%s/data-%c", dir, 'a' + i);
    snprintf(models, sizeof models, "%s/models", dir);
    snprintf(p->log, sizeof p->log, "%s/node-%c.log", dir, 'a' + i);
    snprintf(timeout, sizeof timeout, "%d", NODE_TIMEOUT_S);
    const char *argv[40];
    int k = 0;
    argv[k++] = CAIRN_BINARY;
    argv[k++] = "node";
    argv[k++] = "--api-host";
    argv[k++] = p->addr;
    argv[k++] = "--api-insecure"; /* a namespace of the test's own: no one else can reach it */
    argv[k++] = "--api-port";
    argv[k++] = "0";
    argv[k++] = "--bind";
    argv[k++] = p->addr;
    argv[k++] = "--cluster-port";
    argv[k++] = "0";
    argv[k++] = "--discovery";
    argv[k++] = "off";
    argv[k++] = "--models-dir";
    argv[k++] = models;
    argv[k++] = "--data-dir";
    argv[k++] = data;
    argv[k++] = "-t";
    argv[k++] = "1";
    argv[k++] = "--parallel";
    argv[k++] = "4";
    argv[k++] = "--node-timeout";
    argv[k++] = timeout;
    argv[k++] = "--log-file";
    argv[k++] = "-";
    argv[k++] = "-v";
    if (with_peer) {
        snprintf(peer_arg, sizeof peer_arg, "%s:%d", peers[0].addr, peers[0].cluster);
        argv[k++] = "--peer";
        argv[k++] = peer_arg;
    }
    argv[k] = NULL;
    const char *const env[] = {"CAIRN_CLUSTER_SECRET", "CAIRN_MODELS_DIR", NULL};
    p->pid = netns_spawn(&netns, i, p->log, argv, env);
}

/* Waits (bound limit_s) until node i's log says where its API and cluster port are,
 * then for its /node_id; false when it does not come, or the node exits. */
static bool node_up(int i, double limit_s)
{
    struct peer *p = &peers[i];
    char want[64], line[4096];
    snprintf(want, sizeof want, ": api %s:", p->addr);
    double t0 = now_s();
    while (!p->api && now_s() - t0 < limit_s) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return false;
        }
        FILE *f = fopen(p->log, "r");
        while (f && fgets(line, sizeof line, f)) {
            const char *s = strstr(line, want);
            if (s && sscanf(s + strlen(want), "%d, cluster port %d", &p->api, &p->cluster) != 2)
                p->api = 0;
        }
        if (f)
            fclose(f);
        if (!p->api)
            sleep_ms(50);
    }
    while (p->api && !p->id[0] && now_s() - t0 < limit_s) {
        json_t *j = get_json_in(i, "/node_id");
        snprintf(p->id, sizeof p->id, "%s", str_of(j, "node_id"));
        json_decref(j);
        if (!p->id[0])
            sleep_ms(100);
    }
    return p->id[0] != 0;
}

/* true when node i's log holds text. */
static bool log_has(int i, const char *text)
{
    return file_has(peers[i].log, text);
}

static void print_peer_log(int i)
{
    print_tail(peers[i].log, 40, " info: http ", "node %c log (%s)", 'a' + i, peers[i].id);
}

static void print_state(void)
{
    json_t *s = get_json_in(0, "/state");
    char *text = s ? json_dumps(s, JSON_COMPACT) : NULL;
    fprintf(stderr, "---- A's /state ----\n%.6000s\n", text ? text : "(no answer)");
    free(text);
    json_decref(s);
}

/* true when node i (our child) has not exited. */
static bool alive(int i)
{
    return peers[i].pid > 0 && waitpid(peers[i].pid, NULL, WNOHANG) == 0;
}

/* ---- processes ---- */

/* The children of pid (all its threads'), up to max, into out; how many. */
static int children_of(pid_t pid, pid_t *out, int max)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char cpath[320];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        FILE *f = fopen(cpath, "r");
        int c;
        while (f && n < max && fscanf(f, "%d", &c) == 1)
            out[n++] = c;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* true when pid is a live (not zombie) `cairn runner` process. */
static bool is_runner(pid_t pid)
{
    char path[64], cmd[512], stat[256];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f)
        fclose(f);
    cmd[n] = 0;
    size_t first = strlen(cmd); /* argv[0]; argv[1] follows its NUL */
    if (first + 1 >= n || strcmp(cmd + first + 1, "runner") != 0)
        return false;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f)
        fclose(f);
    stat[n] = 0;
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z';
}

/* The runner processes of node i now (into out, up to max); each is remembered. */
static int runners_of(int i, pid_t *out, int max)
{
    pid_t kids[MAX_RUNNERS];
    int n = peers[i].pid > 0 ? children_of(peers[i].pid, kids, MAX_RUNNERS) : 0, k = 0;
    for (int c = 0; c < n; c++) {
        if (!is_runner(kids[c]))
            continue;
        if (k < max)
            out[k++] = kids[c];
        bool known = false;
        for (int s = 0; s < n_runners_seen; s++)
            known |= runners_seen[s] == kids[c];
        if (!known && n_runners_seen < MAX_RUNNERS)
            runners_seen[n_runners_seen++] = kids[c];
    }
    return k;
}

/* true when pid's network namespace is node i's. */
static bool in_ns_of(pid_t pid, int i)
{
    char a[64], b[64], pa[64], pb[64];
    snprintf(pa, sizeof pa, "/proc/%d/ns/net", (int)pid);
    snprintf(pb, sizeof pb, "/proc/%d/ns/net", (int)peers[i].pid);
    ssize_t na = readlink(pa, a, sizeof a - 1), nb = readlink(pb, b, sizeof b - 1);
    if (na <= 0 || nb <= 0)
        return false;
    a[na] = b[nb] = 0;
    return !strcmp(a, b) && strcmp(a, netns.home) != 0;
}

/* Runners still alive that were ever seen, or that are now orphans of ours (we are a
 * child subreaper); our zombies are reaped on the way. How many, their pids into out. */
static int leftover_runners(pid_t *out, int max)
{
    pid_t kids[MAX_RUNNERS];
    int n = children_of(getpid(), kids, MAX_RUNNERS), k = 0;
    for (int c = 0; c < n; c++) {
        if (kids[c] == janitor)
            continue;
        bool ours = false;
        for (int i = 0; i < 2; i++)
            ours |= kids[c] == peers[i].pid;
        if (!ours)
            waitpid(kids[c], NULL, WNOHANG); /* an orphan that already died */
        if (!ours && is_runner(kids[c]) && k < max)
            out[k++] = kids[c];
    }
    for (int s = 0; s < n_runners_seen; s++) {
        bool listed = false;
        for (int c = 0; c < k; c++)
            listed |= out[c] == runners_seen[s];
        if (!listed && is_runner(runners_seen[s]) && k < max)
            out[k++] = runners_seen[s];
    }
    return k;
}

static void kill_everything(void)
{
    for (int i = 0; i < 2; i++)
        if (peers[i].pid > 0) {
            kill(peers[i].pid, SIGKILL);
            waitpid(peers[i].pid, NULL, 0);
            peers[i].pid = 0;
        }
    pid_t left[MAX_RUNNERS];
    sleep_ms(200);
    int n = leftover_runners(left, MAX_RUNNERS);
    for (int k = 0; k < n; k++) {
        kill(left[k], SIGKILL);
        waitpid(left[k], NULL, 0); /* only reaps our own (orphans); others' return at once */
    }
}

/* ---- the cluster's API ---- */

/* true when A's /state lists exactly both nodes (want 2) or only A (want 1). */
static bool a_lists(int want)
{
    json_t *s = get_json_in(0, "/state");
    json_t *ns = json_object_get(s, "nodes");
    bool ok = json_is_object(ns) && json_object_size(ns) == (size_t)want && json_object_get(ns, peers[0].id) &&
              (want == 1 || json_object_get(ns, peers[1].id));
    json_decref(s);
    return ok;
}

/* Seconds until A's /state lists want nodes (see a_lists), or -1 after limit_s. */
static double wait_nodes(int want, double limit_s)
{
    for (double t0 = now_s(); now_s() - t0 < limit_s && !netns.lost_home; sleep_ms(200))
        if (a_lists(want))
            return now_s() - t0;
    return -1;
}

/* POST /place_instance body on A; the instance id into iid, status returned. */
static int place(const char *body, char *iid, size_t cap)
{
    char *out;
    int st = http_in(0, "POST", "/place_instance", body, 30 * SLOW, &out);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    snprintf(iid, cap, "%s", str_of(j, "instance_id"));
    if (st != 200 || !iid[0])
        fprintf(stderr, "place_instance %s: %d %s\n", body, st, out ? out : "");
    json_decref(j);
    free(out);
    return st;
}

/* true when state s holds instance iid with every shard's runner Ready or Running. */
static bool instance_ready(json_t *s, const char *iid)
{
    json_t *shards = json_object_get(json_object_get(json_object_get(s, "instances"), iid), "shards");
    bool ok = json_array_size(shards) > 0;
    for (size_t k = 0; ok && k < json_array_size(shards); k++) {
        const char *rid = str_of(json_array_get(shards, k), "runner_id");
        const char *st = str_of(json_object_get(json_object_get(s, "runners"), rid), "status");
        ok = !strcmp(st, "Ready") || !strcmp(st, "Running");
    }
    return ok;
}

/* Waits until iid is ready; its shards (a new reference) or NULL after limit_s. */
static json_t *wait_ready(const char *iid, double limit_s)
{
    for (double t0 = now_s(); now_s() - t0 < limit_s && !netns.lost_home; sleep_ms(200)) {
        json_t *s = get_json_in(0, "/state");
        json_t *shards = NULL;
        if (instance_ready(s, iid))
            shards = json_incref(json_object_get(json_object_get(json_object_get(s, "instances"), iid), "shards"));
        json_decref(s);
        if (shards)
            return shards;
    }
    return NULL;
}

/* DELETE /instance/iid on A, then waits until neither it nor a runner of it is in A's
 * state; true when both happened within limit_s. */
static bool remove_instance(const char *iid, double limit_s)
{
    char path[160], *out;
    snprintf(path, sizeof path, "/instance/%s", iid);
    int st = http_in(0, "DELETE", path, NULL, 30 * SLOW, &out);
    CHECK(st == 200, "DELETE %s: %d %s", path, st, out ? out : "");
    free(out);
    for (double t0 = now_s(); st == 200 && now_s() - t0 < limit_s; sleep_ms(200)) {
        json_t *s = get_json_in(0, "/state");
        bool gone = s && !json_object_get(json_object_get(s, "instances"), iid);
        const char *rid;
        json_t *r;
        json_object_foreach(json_object_get(s, "runners"), rid, r) gone &= strcmp(str_of(r, "instance_id"), iid) != 0;
        json_decref(s);
        if (gone)
            return true;
    }
    return false;
}

/* A greedy completion of prompt on A (max_tokens MAX_TOKENS); the status, the text
 * into text and the completion tokens into *tokens (-1 unknown). */
static int complete_on_a(const char *prompt, char *text, size_t cap, int *tokens, double limit_s)
{
    json_t *req = json_pack("{s:s, s:s, s:i, s:i, s:b}", "model", MODEL, "prompt", prompt, "max_tokens", MAX_TOKENS,
                            "temperature", 0, "ignore_eos", 1);
    char *body = json_dumps(req, JSON_COMPACT), *out;
    json_decref(req);
    int st = http_in(0, "POST", "/v1/completions", body, limit_s, &out);
    free(body);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    snprintf(text, cap, "%s", str_of(json_array_get(json_object_get(j, "choices"), 0), "text"));
    json_t *ct = json_object_get(json_object_get(j, "usage"), "completion_tokens");
    *tokens = json_is_integer(ct) ? (int)json_integer_value(ct) : -1;
    if (st != 200)
        snprintf(text, cap, "%.300s", out ? out : "(no reply)");
    json_decref(j);
    free(out);
    return st;
}

/* Asks A for the greedy completion of prompts[0] until one comes back whole (200 and
 * MAX_TOKENS tokens; its text into text); seconds from t0 to then, or -1 after limit_s
 * (the last answer into text, its status into *st). */
static double first_good_completion(double t0, double limit_s, char *text, size_t cap, int *st)
{
    int tokens = -1;
    for (; now_s() - t0 < limit_s && !netns.lost_home; sleep_ms(500)) {
        *st = complete_on_a(prompts[0], text, cap, &tokens, 30 * SLOW);
        if (*st == 200 && tokens == MAX_TOKENS)
            return now_s() - t0;
    }
    return -1;
}

/* The instances of MODEL in node i's state: how many, and how many have a shard on a
 * node other than i (into *elsewhere); ready ones into *ready. */
static size_t model_instances(int i, size_t *elsewhere, size_t *ready)
{
    json_t *s = get_json_in(i, "/state");
    size_t n = 0;
    *elsewhere = *ready = 0;
    const char *id;
    json_t *in;
    json_object_foreach(json_object_get(s, "instances"), id, in) {
        if (strcmp(str_of(in, "model_id"), MODEL) != 0)
            continue;
        n++;
        *ready += instance_ready(s, id);
        json_t *shards = json_object_get(in, "shards");
        bool away = false;
        for (size_t k = 0; k < json_array_size(shards); k++)
            away |= strcmp(str_of(json_array_get(shards, k), "node_id"), peers[i].id) != 0;
        *elsewhere += away;
    }
    json_decref(s);
    return n;
}

/* The master node_id in node i's state, into out ("" when it does not answer). */
static void master_of(int i, char *out, size_t cap)
{
    json_t *s = get_json_in(i, "/state");
    snprintf(out, cap, "%s", str_of(json_object_get(s, "master"), "node_id"));
    json_decref(s);
}

/* Prints the wall clock (the node logs' clock) with what. */
static void print_clock(const char *what)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    printf("info: %s at %02d:%02d:%02d.%03ld (the logs' clock)\n", what, tm.tm_hour, tm.tm_min, tm.tm_sec,
           ts.tv_nsec / 1000000);
}

/* What a streamed completion came to. */
struct stream_end {
    int status;        /* the reply's, -1 when none */
    int chunks;        /* data events with a choice's text, before the end */
    int chunks_at_cut; /* of those, how many had come when the link went down */
    bool cut;          /* the link was taken down */
    bool ended;        /* the connection closed, or the reply's framing ended, in time */
    bool done;         /* a data: [DONE] came */
    bool error;        /* a data event carried an "error" object */
    char error_text[300];
    char finish[32];   /* the last finish_reason that came, "" when none */
    double t_cut;      /* when the link went down (now_s) */
    double cut_to_end; /* seconds */
};

/* Takes down B's veth end (inside B's namespace); true when `ip` says so. */
static bool link_set(bool up)
{
    const char *argv[] = {"ip", "-n", netns.names[1], "link", "set", peers[1].ifname, up ? "up" : "down", NULL};
    return run_argv(argv, true) == 0;
}

/* Counts the SSE data events of a text completion so far in raw (chunk framing in
 * between does not split an event). */
static int count_text_events(const struct buf *b)
{
    int n = 0;
    for (const char *p = b->p; p && (p = strstr(p, "data: {")); p += 7)
        n += strncmp(p, "data: {\"error\"", 14) != 0;
    return n;
}

/* Reads the SSE events in body into r. */
static void parse_events(const char *body, struct stream_end *r)
{
    r->chunks = 0;
    for (const char *p = body; (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 6 && !strncmp(p, "[DONE]", 6)) {
            r->done = true;
        } else {
            json_t *j = json_loadb(p, n, 0, NULL);
            json_t *err = json_object_get(j, "error");
            json_t *c = json_array_get(json_object_get(j, "choices"), 0);
            if (err) {
                r->error = true;
                snprintf(r->error_text, sizeof r->error_text, "%s", str_of(err, "message"));
            } else if (c) {
                r->chunks++;
                if (json_is_string(json_object_get(c, "finish_reason")))
                    snprintf(r->finish, sizeof r->finish, "%s", str_of(c, "finish_reason"));
            }
            json_decref(j);
        }
        p += n;
    }
}

/* Streams a long greedy completion from A; once 3 text events came, takes the link
 * down, then reads until the stream ends (bound limit_s after the cut). */
static void stream_and_cut(double limit_s, struct stream_end *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    const char *body = "{\"model\":\"" MODEL "\",\"prompt\":\"Tell me a long story.\",\"max_tokens\":100000,"
                       "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";
    int fd = send_request(0, "POST", "/v1/completions", body);
    if (fd < 0)
        return;
    struct buf b = {0};
    double t0 = now_s(), t_cut = 0;
    int rd = 0;
    bool framed_end = false;
    while (!framed_end && (rd = read_some(fd, &b, 100)) >= 0) {
        if (!r->cut && count_text_events(&b) >= 3) {
            r->chunks_at_cut = count_text_events(&b);
            r->cut = link_set(false);
            t_cut = now_s();
            print_clock("link cut");
            if (!r->cut)
                break;
        }
        if (!r->cut && now_s() - t0 > limit_s)
            break; /* tokens never came */
        if (r->cut && now_s() - t_cut > limit_s)
            break;
        /* a chunked reply ends with its last chunk; the server then closes */
        framed_end = is_chunked(&b) && b.len >= 5 && !memcmp(b.p + b.len - 5, "0\r\n\r\n", 5);
    }
    double t_end = now_s();
    close(fd);
    r->ended = r->cut && (rd < 0 || framed_end) && t_end - t_cut <= limit_s;
    r->t_cut = t_cut;
    r->cut_to_end = r->cut ? t_end - t_cut : -1;
    if (b.p && sscanf(b.p, "HTTP/1.%*d %d", &r->status) == 1) {
        bool complete;
        char *text = decode_body(&b, &complete);
        parse_events(text, r);
        free(text);
    }
    free(b.p);
}

/* ---- the network ---- */

/* The namespaces and the veth pair; false (saying which command failed) when the kernel
 * or the container refuses. */
static bool make_network(void)
{
    if (!netns_add(&netns))
        return false;
    char cidr[2][32];
    for (int i = 0; i < 2; i++)
        snprintf(cidr[i], sizeof cidr[i], "%s/24", peers[i].addr);
    /* Both ends are made straight inside their namespaces, never in ours. */
    const char *cmds[][16] = {
        {"ip", "link", "add", peers[0].ifname, "netns", netns.names[0], "type", "veth", "peer", "name", peers[1].ifname,
         "netns", netns.names[1], NULL},
        {"ip", "-n", netns.names[0], "addr", "add", cidr[0], "dev", peers[0].ifname, NULL},
        {"ip", "-n", netns.names[1], "addr", "add", cidr[1], "dev", peers[1].ifname, NULL},
        {"ip", "-n", netns.names[0], "link", "set", "lo", "up", NULL},
        {"ip", "-n", netns.names[1], "link", "set", "lo", "up", NULL},
        {"ip", "-n", netns.names[0], "link", "set", peers[0].ifname, "up", NULL},
        {"ip", "-n", netns.names[1], "link", "set", peers[1].ifname, "up", NULL},
    };
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++)
        if (run_argv(cmds[c], true) != 0) {
            printf("skipped: `%s %s %s %s %s` failed: the kernel refuses the test network\n", cmds[c][0], cmds[c][1],
                   cmds[c][2], cmds[c][3], cmds[c][4]);
            return false;
        }
    return true;
}

/* ---- the scenario ---- */

static bool scenario(void)
{
    char models[512], model[600], vocab[512], cmd[2048], iid[80], text[4096];
    snprintf(models, sizeof models, "%s/models", dir);
    mkdir(models, 0700);
    snprintf(model, sizeof model, "%s/" MODEL ".gguf", models);
    snprintf(vocab, sizeof vocab, "%s", test_data_path("vocab/ggml-vocab-llama-bpe.gguf"));
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --shape tiny --vocab '%s' -o '%s' >'%s/mkmodel.log' 2>&1", CAIRN_BINARY,
             vocab, model, dir);
    int rc = system(cmd);
    CHECK(rc == 0, "mkmodel failed (%d), see %s/mkmodel.log", rc, dir);
    if (rc)
        return false;

    /* 1. Two nodes, B told of A, each in its namespace. */
    start_peer(0, false);
    bool up = node_up(0, 30 * SLOW);
    CHECK(up, "node A reports its API and answers /node_id inside its namespace (bound %d s)", 30 * SLOW);
    if (!up)
        return false;
    start_peer(1, true);
    up = node_up(1, 30 * SLOW);
    CHECK(up, "node B reports its API and answers /node_id inside its namespace (bound %d s)", 30 * SLOW);
    if (!up)
        return false;
    double joined = wait_nodes(2, 30 * SLOW);
    CHECK(joined >= 0, "A's /state lists both nodes (bound %d s)", 30 * SLOW);
    if (joined < 0)
        return false;
    printf("info: B joined A over the veth %.2f s after B answered\n", joined);

    /* 2. A single-node instance: the reference texts. */
    char want[N_PROMPTS][1024];
    int tokens;
    int st = place("{\"model_id\":\"" MODEL "\",\"min_nodes\":1}", iid, sizeof iid);
    CHECK(st == 200, "a single-node instance is placed (%d)", st);
    if (st != 200)
        return false;
    json_t *shards = wait_ready(iid, 60 * SLOW);
    CHECK(json_array_size(shards) == 1, "the single-node instance %s is ready with one shard (bound %d s)", iid,
          60 * SLOW);
    json_decref(shards);
    if (!shards)
        return false;
    for (int p = 0; p < N_PROMPTS; p++) {
        st = complete_on_a(prompts[p], want[p], sizeof want[p], &tokens, 60 * SLOW);
        CHECK(st == 200 && tokens == MAX_TOKENS, "single node, prompt %d: %d, %d tokens: %s", p, st, tokens, want[p]);
        if (st != 200)
            return false;
    }
    CHECK(strcmp(want[0], want[1]) || strcmp(want[1], want[2]), "different prompts give different texts");
    bool gone = remove_instance(iid, 30 * SLOW);
    CHECK(gone, "the single-node instance and its runner leave A's state (bound %d s)", 30 * SLOW);
    if (!gone)
        return false;

    /* 3. The pipelined instance: one rank per node, one runner process per namespace. */
    st = place("{\"model_id\":\"" MODEL "\",\"sharding\":\"pipeline\",\"min_nodes\":2}", iid, sizeof iid);
    CHECK(st == 200, "a pipelined instance is placed (%d)", st);
    if (st != 200)
        return false;
    shards = wait_ready(iid, 60 * SLOW);
    CHECK(shards, "the pipelined instance %s is ready (bound %d s)", iid, 60 * SLOW);
    if (!shards)
        return false;
    size_t n_shards = json_array_size(shards);
    const char *n0 = str_of(json_array_get(shards, 0), "node_id"), *n1 = str_of(json_array_get(shards, 1), "node_id");
    bool split = n_shards == 2 && strcmp(n0, n1) != 0 &&
                 (!strcmp(n0, peers[0].id) || !strcmp(n0, peers[1].id)) &&
                 (!strcmp(n1, peers[0].id) || !strcmp(n1, peers[1].id));
    CHECK(split, "2 shards on the two nodes: %zu shards, on %s and %s", n_shards, n0, n1);
    json_int_t lb1 = json_integer_value(json_object_get(json_array_get(shards, 1), "layer_begin")),
               le0 = json_integer_value(json_object_get(json_array_get(shards, 0), "layer_end"));
    CHECK(lb1 == le0 && lb1 > 0, "contiguous layer ranges: rank 0 ends at %lld, rank 1 begins at %lld",
          (long long)le0, (long long)lb1);
    int r0 = !strcmp(n0, peers[0].id) ? 0 : 1;
    printf("info: rank 0 (the scheduler) on node %s\n", r0 == 0 ? "A, the API's" : "B, over the link");
    /* the ring goes over the veth: each rank is told of the other at the far address */
    char ring[2][64];
    snprintf(ring[0], sizeof ring[0], "(rank 0): next rank 1 at %s:", peers[!r0].addr);
    snprintf(ring[1], sizeof ring[1], "(rank 1): next rank 0 at %s:", peers[r0].addr);
    CHECK(log_has(r0, ring[0]) && log_has(!r0, ring[1]), "the node logs say \"%s\" and \"%s\"", ring[0], ring[1]);
    json_decref(shards);
    for (int i = 0; i < 2; i++) {
        pid_t r[8];
        int n = runners_of(i, r, 8);
        CHECK(n == 1 && in_ns_of(r[0], i), "node %c has one runner process, in its namespace (%d)", 'a' + i, n);
    }
    for (int p = 0; p < N_PROMPTS; p++) {
        st = complete_on_a(prompts[p], text, sizeof text, &tokens, 60 * SLOW);
        CHECK(st == 200 && tokens == MAX_TOKENS && !strcmp(text, want[p]),
              "pipelined, prompt %d: %d, %d tokens:\n  got  %s\n  want %s", p, st, tokens, text, want[p]);
    }
    if (test_failed)
        return false;

    /* 4. Cut the link while a stream runs. */
    struct stream_end se;
    stream_and_cut(60 * SLOW, &se);
    printf("info: stream: status %d, %d text events (%d before the cut), error event %s (%s), [DONE] %s, "
           "finish_reason '%s'\n",
           se.status, se.chunks, se.chunks_at_cut, se.error ? "yes" : "no", se.error_text, se.done ? "yes" : "no",
           se.finish);
    CHECK(se.status == 200 && se.cut, "the stream started (%d) and the link was cut after %d events", se.status,
          se.chunks_at_cut);
    if (!se.cut)
        return false;
    printf("figure: link cut -> stream end %.2f s\n", se.cut_to_end);
    CHECK(se.ended, "the stream ends within %d s of the cut (%.2f s)", 60 * SLOW, se.cut_to_end);
    CHECK(strcmp(se.finish, "length") != 0 && !se.done, "the stream does not finish normally: finish '%s', [DONE] %s",
          se.finish, se.done ? "yes" : "no");
    CHECK(se.error, "the stream ends with an error event (got none; %d events)", se.chunks);
    CHECK(alive(0), "node A is still running after the cut");
    char *out;
    int hs = http_in(0, "GET", "/health", NULL, 10 * SLOW, &out);
    free(out);
    json_t *s = get_json_in(0, "/state");
    CHECK((hs == 200 || hs == 503) && s, "node A answers GET /health (%d) and GET /state (%s) after the cut", hs,
          s ? "200" : "no answer");
    json_decref(s);
    double left = wait_nodes(1, (NODE_TIMEOUT_S + 25) * SLOW);
    CHECK(left >= 0, "B leaves A's cluster while the link is down (bound %d s)", (NODE_TIMEOUT_S + 25) * SLOW);
    if (left >= 0)
        printf("info: link cut -> B out of A's cluster %.2f s\n", now_s() - se.t_cut);

    /* While cut: A places the model again on itself and serves it. */
    double good = -1;
    st = -1;
    if (left >= 0) {
        good = first_good_completion(se.t_cut, 60 * SLOW + (now_s() - se.t_cut), text, sizeof text, &st);
        if (good >= 0)
            printf("figure: link cut -> first good completion on A alone %.2f s\n", good);
        CHECK(good >= 0, "while cut, a completion on A works again (bound %d s after B left; last %d: %s)",
              60 * SLOW, st, text);
        CHECK(good < 0 || !strcmp(text, want[0]), "while cut, the same greedy text:\n  got  %s\n  want %s", text,
              want[0]);
        size_t away, ready, n = model_instances(0, &away, &ready);
        CHECK(n >= 1 && away == 0, "while cut, A's instances of the model lie on A alone (%zu, %zu elsewhere)", n,
              away);
        s = get_json_in(0, "/state");
        CHECK(!json_object_get(json_object_get(s, "instances"), iid), "the pipelined instance %s left A's state",
              iid);
        json_decref(s);
    }
    /* B, alone on its side of the cut, has a view of its own: shown, not asserted */
    CHECK(alive(1), "node B is still running after the cut");
    s = get_json_in(1, "/state");
    char mb_cut[80];
    snprintf(mb_cut, sizeof mb_cut, "%s", str_of(json_object_get(s, "master"), "node_id"));
    json_decref(s);
    size_t b_away, b_ready, b_n = model_instances(1, &b_away, &b_ready);
    printf("info: while cut, B's master is %s; B's state holds %zu instance(s) of the model (%zu ready)\n",
           !strcmp(mb_cut, peers[1].id) ? "B itself" : !strcmp(mb_cut, peers[0].id) ? "A" : "(none)", b_n, b_ready);

    /* 5. The link comes back: B rejoins, the model answers again. */
    bool relinked = link_set(true);
    CHECK(relinked, "ip link set %s up", peers[1].ifname);
    double t_up = now_s();
    print_clock("link up");
    double back = wait_nodes(2, 60 * SLOW);
    CHECK(back >= 0, "B rejoins A's cluster once the link is up (bound %d s)", 60 * SLOW);
    if (back >= 0)
        printf("info: B rejoined %.2f s after the link came up\n", back);
    good = first_good_completion(t_up, 90 * SLOW, text, sizeof text, &st);
    if (good >= 0)
        printf("figure: link up -> first good completion %.2f s\n", good);
    CHECK(good >= 0, "a completion on A works again after the link is back (bound %d s; last %d: %s)", 90 * SLOW, st,
          text);
    CHECK(good < 0 || !strcmp(text, want[0]), "and gives the same greedy text:\n  got  %s\n  want %s", text,
          want[0]);
    /* one cluster again: both name the same master */
    char ma[80] = "", mb[80] = "";
    for (double t = now_s(); now_s() - t < 30 * SLOW; sleep_ms(200)) {
        master_of(0, ma, sizeof ma);
        master_of(1, mb, sizeof mb);
        if (ma[0] && !strcmp(ma, mb))
            break;
    }
    CHECK(ma[0] && !strcmp(ma, mb), "A and B name the same master after the rejoin (%s, %s)", ma, mb);
    size_t away, ready, n = model_instances(0, &away, &ready);
    printf("info: after the rejoin, A's state holds %zu instance(s) of the model (%zu ready, %zu with a shard on B); "
           "master %s\n",
           n, ready, away, !strcmp(ma, peers[0].id) ? "A" : !strcmp(ma, peers[1].id) ? "B" : "?");
    return true;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *why = netns_open(&netns);
    if (why)
        return test_skip("%s", why);
    int pid = (int)getpid();
    for (int i = 0; i < 2; i++) {
        snprintf(netns.names[i], sizeof netns.names[i], "cairn-pn-%d-%c", pid, 'a' + i);
        snprintf(peers[i].addr, sizeof peers[i].addr, "10.213.0.%d", i + 1);
        /* names that exist only inside the test's namespaces (at most 15 bytes) */
        snprintf(peers[i].ifname, sizeof peers[i].ifname, "cpn%d%c", pid % 1000000, 'a' + i);
    }
    snprintf(dir, sizeof dir, "/tmp/cairn-test-pn-%d", pid);
    mkdir(dir, 0700);
    /* runners a node leaves behind are reparented to us, to be found and killed */
    prctl(PR_SET_CHILD_SUBREAPER, 1);

    int wfd = -1;
    janitor = netns_janitor(&netns, dir, &wfd);
    if (janitor < 0) {
        return test_skip("cannot fork the janitor that deletes the namespaces");
    }
    double t0 = now_s();
    bool net = make_network();
    if (net) {
        bool done = scenario();
        if (!done || test_failed) {
            print_state();
            for (int i = 0; i < 2; i++)
                print_peer_log(i);
        }
        /* 6. SIGTERM: both exit 0, and no runner outlives them. */
        for (int i = 0; i < 2; i++)
            runners_of(i, (pid_t[MAX_RUNNERS]){0}, MAX_RUNNERS);
        for (int i = 1; i >= 0; i--) {
            if (peers[i].pid <= 0)
                continue;
            kill(peers[i].pid, SIGTERM);
            int code = wait_exit(peers[i].pid, 30 * SLOW);
            peers[i].pid = 0;
            CHECK(code == 0, "node %c exits 0 on SIGTERM within %d s (got %d)", 'a' + i, 30 * SLOW, code);
            if (code != 0)
                print_peer_log(i);
        }
        pid_t left[MAX_RUNNERS];
        int n_left = 0;
        for (double t = now_s(); now_s() - t < 5 * SLOW; sleep_ms(100))
            if ((n_left = leftover_runners(left, MAX_RUNNERS)) == 0)
                break;
        CHECK(n_left == 0, "no runner process outlives its node (%d left, first pid %d; %d seen in all)", n_left,
              n_left ? (int)left[0] : 0, n_runners_seen);
        printf("info: whole test %.1f s\n", now_s() - t0);
    }
    kill_everything();
    netns_close(&netns, janitor, wfd, dir);
    if (!net && !test_failed)
        return TEST_SKIPPED; /* make_network said why */
    return test_main_end();
}
