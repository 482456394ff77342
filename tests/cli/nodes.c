/* A cluster of real `cairn node` processes for tests (nodes.h). */
#define _GNU_SOURCE /* memmem */
#include "nodes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

char nodes_dir[256];
struct proc nodes[MAX_NODES];

bool nodes_setup(const char *name)
{
    snprintf(nodes_dir, sizeof nodes_dir, "/tmp/cairn-test-%s-%d", name, (int)getpid());
    mkdir(nodes_dir, 0700);
    char models[300];
    snprintf(models, sizeof models, "%s/models", nodes_dir);
    mkdir(models, 0700);
    int rc = run_cmd("%s mkmodel --shape tiny --vocab %s -o %s/m1.gguf >%s/mkmodel.log 2>&1", CAIRN_BINARY,
                     test_data_path("vocab/ggml-vocab-llama-spm.gguf"), models, nodes_dir);
    CHECK(rc == 0, "mkmodel failed (%d), see %s/mkmodel.log", rc, nodes_dir);
    return rc == 0;
}

void nodes_teardown(void)
{
    stop_all();
    if (getenv("CAIRN_TEST_KEEP"))
        printf("kept %s\n", nodes_dir);
    else
        run_cmd("rm -rf '%s'", nodes_dir);
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A TCP port free right now on 127.0.0.1. */
int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

int connect_to(int port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

bool send_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

int http_read_reply(int fd, char *out, size_t cap, char *head, size_t hcap)
{
    out[0] = 0;
    if (head)
        head[0] = 0;
    static char buf[1 << 20];
    size_t len = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof buf - 1)
            break;
    }
    buf[len] = 0;
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        return -1;
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(out, cap, "%s", b ? b + 4 : "");
    if (head)
        snprintf(head, hcap, "%.*s", b ? (int)(b - buf) + 2 : 0, buf);
    return status;
}

/* One HTTP/1.1 request (Connection: close) with the extra header lines in headers (each
 * ending in \r\n, or NULL); the body of the answer into out and, when head is not NULL,
 * its status line and headers into head. Returns the status, or -1 when no answer came
 * within 10 s. */
int http_ex(int port, const char *method, const char *path, const char *headers,
                   const char *body, char *out, size_t cap, char *head, size_t hcap)
{
    out[0] = 0;
    if (head)
        head[0] = 0;
    int fd = connect_to(port, 10000);
    if (fd < 0)
        return -1;
    char req[8192];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, headers ? headers : "", body ? strlen(body) : 0,
                     body ? body : "");
    if (n < 0 || (size_t)n >= sizeof req || !send_all(fd, req, (size_t)n)) {
        close(fd);
        return -1;
    }
    int status = http_read_reply(fd, out, cap, head, hcap);
    close(fd);
    return status;
}

int http(int port, const char *method, const char *path, const char *body, char *out,
                size_t cap)
{
    return http_ex(port, method, path, NULL, body, out, cap, NULL, 0);
}

/* The value of header name in head (from http_ex) into val; false when it is absent. */
bool header_of(const char *head, const char *name, char *val, size_t cap)
{
    size_t n = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        const char *l = line + 2;
        if (strncasecmp(l, name, n) == 0 && l[n] == ':') {
            l += n + 1;
            while (*l == ' ')
                l++;
            const char *end = strstr(l, "\r\n");
            snprintf(val, cap, "%.*s", end ? (int)(end - l) : (int)strlen(l), l);
            return true;
        }
    }
    val[0] = 0;
    return false;
}

json_t *get_json(int port, const char *path)
{
    static char out[1 << 20];
    if (http(port, "GET", path, NULL, out, sizeof out) != 200)
        return NULL;
    return json_loads(out, 0, NULL);
}

pid_t spawn(const char *log, char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = fopen(log, "w");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Starts node i; peer is the index of a node to connect to, or -1; extra: more
 * arguments (NULL-terminated, at most 16), or NULL. */
void start_node(int i, int peer, const char *secret, const char *memory,
                       const char *const *extra)
{
    struct proc *p = &nodes[i];
    char api[16], cl[16], data[512], models[512], peer_arg[64];
    p->api = free_port();
    p->cluster = free_port();
    snprintf(api, sizeof api, "%d", p->api);
    snprintf(cl, sizeof cl, "%d", p->cluster);
    snprintf(data, sizeof data, "%s/data%d", nodes_dir, i);
    snprintf(models, sizeof models, "%s/models", nodes_dir);
    snprintf(p->log, sizeof p->log, "%s/node%d.log", nodes_dir, i);
    char *argv[48];
    int k = 0;
    argv[k++] = (char *)CAIRN_BINARY;
    argv[k++] = "node";
    argv[k++] = "--api-port";
    argv[k++] = api;
    argv[k++] = "--cluster-port";
    argv[k++] = cl;
    argv[k++] = "--bind";
    argv[k++] = "127.0.0.1";
    argv[k++] = "--data-dir";
    argv[k++] = data;
    argv[k++] = "--models-dir";
    argv[k++] = models;
    argv[k++] = "--discovery";
    argv[k++] = "off";
    argv[k++] = "--node-timeout";
    argv[k++] = "120";
    argv[k++] = "--memory-limit";
    argv[k++] = (char *)memory;
    argv[k++] = "-v";
    argv[k++] = "--bandwidth-mib"; /* a short probe: the default reads 1-8 GiB */
    argv[k++] = "64";
    if (secret) {
        argv[k++] = "--cluster-secret";
        argv[k++] = (char *)secret;
    }
    if (peer >= 0) {
        snprintf(peer_arg, sizeof peer_arg, "127.0.0.1:%d", nodes[peer].cluster);
        argv[k++] = "--peer";
        argv[k++] = peer_arg;
    }
    for (int e = 0; extra && extra[e] && e < 16; e++)
        argv[k++] = (char *)extra[e];
    argv[k] = NULL;
    p->pid = spawn(p->log, argv);
    p->id[0] = 0;
}

/* Waits for node i's API and reads its id (bound: 20 s). */
bool read_id(int i)
{
    double t0 = now_s();
    while (now_s() - t0 < 20) {
        json_t *j = get_json(nodes[i].api, "/node_id");
        const char *id = json_string_value(json_object_get(j, "node_id"));
        if (id)
            snprintf(nodes[i].id, sizeof nodes[i].id, "%s", id);
        json_decref(j);
        if (id)
            return true;
        sleep_ms(100);
    }
    return false;
}

void print_log_tail(int i)
{
    print_tail(nodes[i].log, 25, NULL, "node %d log (%s)", i, nodes[i].id);
}

void print_tail(const char *path, int lines, const char *drop, const char *fmt, ...)
{
    char title[256], cmd[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(title, sizeof title, fmt, ap);
    va_end(ap);
    if (drop)
        snprintf(cmd, sizeof cmd, "grep -v '%s' '%s' | tail -n %d 1>&2", drop, path, lines);
    else
        snprintf(cmd, sizeof cmd, "tail -n %d '%s' 1>&2", lines, path);
    fprintf(stderr, "---- %s ----\n", title);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

/* Waits up to limit_s for pid to exit; its exit status, or -1 (then it is killed). */
int wait_exit(pid_t pid, double limit_s)
{
    double t0 = now_s();
    int st;
    while (now_s() - t0 < limit_s) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        if (r < 0)
            return -1;
        sleep_ms(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

void stop_all(void)
{
    for (int i = 0; i < MAX_NODES; i++) {
        if (nodes[i].pid > 0) {
            kill(nodes[i].pid, SIGKILL);
            waitpid(nodes[i].pid, NULL, 0);
            nodes[i].pid = 0;
        }
    }
}

/* The /state text of each live node among idx[0..n); true when all are equal, hold
 * want_nodes nodes and name the same master (its id into master when not NULL). */
bool states_agree(const int *idx, int n, size_t want_nodes, char *master, size_t mcap)
{
    static char first[1 << 20], other[1 << 20];
    if (http(nodes[idx[0]].api, "GET", "/state", NULL, first, sizeof first) != 200)
        return false;
    for (int k = 1; k < n; k++)
        if (http(nodes[idx[k]].api, "GET", "/state", NULL, other, sizeof other) != 200 ||
            strcmp(first, other))
            return false;
    json_t *j = json_loads(first, 0, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(j, "master"), "node_id"));
    bool ok = m && json_object_size(json_object_get(j, "nodes")) == want_nodes;
    if (ok && master)
        snprintf(master, mcap, "%s", m);
    json_decref(j);
    return ok;
}

double wait_agree(const int *idx, int n, size_t want_nodes, char *master, size_t mcap,
                         double limit_s)
{
    double t0 = now_s();
    while (now_s() - t0 < limit_s) {
        if (states_agree(idx, n, want_nodes, master, mcap))
            return now_s() - t0;
        sleep_ms(100);
    }
    return -1;
}

int index_of_id(const char *id)
{
    for (int i = 0; i < MAX_NODES; i++)
        if (nodes[i].pid > 0 && !strcmp(nodes[i].id, id))
            return i;
    return -1;
}

/* Waits until GET path answers want on every node in idx (bound limit_s). */
bool wait_status(const int *idx, int n, const char *path, int want, double limit_s)
{
    static char out[1 << 16];
    double t0 = now_s();
    while (now_s() - t0 < limit_s) {
        bool all = true;
        for (int k = 0; k < n && all; k++)
            all = http(nodes[idx[k]].api, "GET", path, NULL, out, sizeof out) == want;
        if (all)
            return true;
        sleep_ms(100);
    }
    return false;
}

int64_t rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    int64_t kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", (long long *)&kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* Reads an SSE stream from fd into buf until it holds want (true), the peer closes it or
 * limit_s passes (false). */
bool sse_collect(int fd, const char *want, double limit_s, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    double t0 = now_s();
    while (now_s() - t0 < limit_s && len < cap - 1) {
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r == 0)
            return false;
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return false;
        }
        len += (size_t)r;
        buf[len] = 0;
        if (strstr(buf, want))
            return true;
    }
    return false;
}

bool sse_wait(int fd, const char *want, double limit_s)
{
    static char buf[1 << 18];
    return sse_collect(fd, want, limit_s, buf, sizeof buf);
}

int run_cmd(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int run_argv(const char *const *argv, bool verbose)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (!verbose) {
            int nul = open("/dev/null", O_WRONLY);
            if (nul >= 0) {
                dup2(nul, 1);
                dup2(nul, 2);
            }
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The runner of instance iid's first shard in node i's /state: its id, status and
 * restart count; false when the instance or its runner is not there. */
bool runner_of(int i, const char *iid, char *rid, size_t rcap, char *status, size_t scap,
                      int *restarts)
{
    json_t *s = get_json(nodes[i].api, "/state");
    json_t *in = json_object_get(json_object_get(s, "instances"), iid);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(in, "shards"), 0),
                                                       "runner_id"));
    json_t *r = id ? json_object_get(json_object_get(s, "runners"), id) : NULL;
    const char *st = json_string_value(json_object_get(r, "status"));
    json_t *rc = json_object_get(r, "restart_count");
    bool ok = st && json_is_integer(rc);
    if (ok) {
        snprintf(rid, rcap, "%s", id);
        snprintf(status, scap, "%s", st);
        *restarts = (int)json_integer_value(rc);
    }
    json_decref(s);
    return ok;
}

bool ready_status(const char *status)
{
    return !strcmp(status, "Ready") || !strcmp(status, "Running");
}

/* A greedy completion of 4 tokens of "hi" by model m1, asked of node i's API; the status
 * (200 only when the answer holds a text and 4 completion tokens), the body into out. */
int complete(int i, char *out, size_t cap)
{
    const char *body = "{\"model\":\"m1\",\"prompt\":\"hi\",\"max_tokens\":4,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    int st = http(nodes[i].api, "POST", "/v1/completions", body, out, cap);
    if (st != 200)
        return st;
    json_t *j = json_loads(out, 0, NULL);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_int_t tokens = json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    bool whole = json_is_string(json_object_get(choice, "text")) && tokens == 4;
    json_decref(j);
    return whole ? 200 : 0;
}

/* Reads the first line of a file into buf; false when it cannot. */
bool read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    bool ok = f && fgets(buf, (int)cap, f);
    if (f)
        fclose(f);
    if (ok)
        buf[strcspn(buf, "\r\n")] = 0;
    return ok;
}

/* Stops node i with SIGTERM (bound 30 s). */
void stop_node(int i)
{
    if (nodes[i].pid <= 0)
        return;
    kill(nodes[i].pid, SIGTERM);
    CHECK(wait_exit(nodes[i].pid, 30) == 0, "node %d exits 0 on SIGTERM", i);
    nodes[i].pid = 0;
}

/* A child process of node whose command line holds "runner", or 0. Children are listed
 * by the thread that made them (the worker's), so every thread's list is read. */
pid_t runner_child(pid_t node)
{
    char path[128], buf[4096];
    snprintf(path, sizeof path, "cat /proc/%d/task/*/children 2>/dev/null", (int)node);
    FILE *f = popen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        pclose(f);
    buf[n] = 0;
    for (char *tok = strtok(buf, " \n"); tok; tok = strtok(NULL, " \n")) {
        char cmd[1024];
        snprintf(path, sizeof path, "/proc/%s/cmdline", tok);
        FILE *c = fopen(path, "r");
        size_t k = c ? fread(cmd, 1, sizeof cmd - 1, c) : 0;
        if (c)
            fclose(c);
        for (size_t i = 0; i < k; i++)
            cmd[i] = cmd[i] ? cmd[i] : ' ';
        cmd[k] = 0;
        if (strstr(cmd, "runner"))
            return (pid_t)atoi(tok);
    }
    return 0;
}

/* The first key of the object field (e.g. "tasks") of node i's /state into id; false
 * when it is empty or absent. */
static bool first_key(int i, const char *field, char *id, size_t cap)
{
    json_t *s = get_json(nodes[i].api, "/state");
    const char *key;
    json_t *v;
    bool found = false;
    json_object_foreach(json_object_get(s, field), key, v) {
        snprintf(id, cap, "%s", key);
        found = true;
        break;
    }
    json_decref(s);
    return found;
}

/* The id of a task in node i's /state into id; false when there is none. */
bool some_task(int i, char *id, size_t cap)
{
    return first_key(i, "tasks", id, cap);
}

/* The id of the first instance in node i's state into id; false when it has none. */
bool some_instance(int i, char *id, size_t cap)
{
    return first_key(i, "instances", id, cap);
}

int hold_stream(int i, pid_t runner, char *task, size_t cap, bool *have_task)
{
    kill(runner, SIGSTOP);
    const char *body = "{\"model\":\"m1\",\"prompt\":\"hi\",\"max_tokens\":8,\"temperature\":0,"
                       "\"ignore_eos\":true,\"stream\":true}";
    char req[1024];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    int fd = connect_to(nodes[i].api, 5000);
    CHECK(fd >= 0 && send_all(fd, req, strlen(req)), "the streamed request is sent");
    *have_task = false;
    for (double t0 = now_s(); now_s() - t0 < 20 && !*have_task; sleep_ms(50))
        *have_task = some_task(i, task, cap);
    CHECK(*have_task, "the request's task is in node %d's state", i);
    return fd;
}

void release_stream(pid_t runner, int fd, char *out, size_t cap)
{
    if (runner > 0)
        kill(runner, SIGCONT);
    if (fd < 0)
        return;
    bool whole = sse_collect(fd, "[DONE]", 60, out, cap);
    close(fd);
    CHECK(whole, "the streamed request ends with [DONE]: %.300s", out);
    CHECK(!strstr(out, "EVIL"), "no forged text reached the client: %.300s", out);
}

/* Whether the file at path holds the bytes of s. */
bool file_has(const char *path, const char *s)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    size_t n = strlen(s), cap = 1 << 20, len = 0;
    char *buf = malloc(cap + n);
    bool found = false;
    size_t got;
    while (buf && !found && (got = fread(buf + len, 1, cap, f)) > 0) {
        len += got;
        found = memmem(buf, len, s, n) != NULL;
        size_t keep = len < n ? len : n - 1; /* a match may straddle two reads */
        memmove(buf, buf + len - keep, keep);
        len = keep;
    }
    free(buf);
    fclose(f);
    return found;
}
