/* Runner supervisor and protocol. Most cases run small /bin/sh scripts that speak the
 * runner protocol (fake runners); the last group runs the real `cairn runner` on a
 * synthetic model when the cairn binary is built (skipped with a message otherwise):
 * status order, the same tokens as `cairn generate`, SIGKILL -> Failed and restarted,
 * giving up, a hung runner killed, the node pipe and the node's death ending the runner,
 * no descriptor of the node leaking into a runner. */
#define _GNU_SOURCE
#include "node/supervisor.h"

#include "base/clock.h"
#include "base/err.h"
#include "model/synth.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- events recorded ---- */

struct ev {
    enum supervisor_event_kind kind;
    char runner_id[IDS_ID_MAX + 1], task_id[IDS_ID_MAX + 1];
    enum cluster_runner_status status;
    int restart_count;
    pid_t pid;
    int32_t token;
    int64_t index, n_generated;
    enum runner_finish finish;
    char *error;
    int64_t t_ns;
};

struct rec {
    struct ev *ev;
    size_t n, cap;
};

static void on_event(void *ctx, const struct supervisor_event *e)
{
    struct rec *r = ctx;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->ev = realloc(r->ev, r->cap * sizeof *r->ev);
    }
    struct ev *x = &r->ev[r->n++];
    memset(x, 0, sizeof *x);
    x->kind = e->kind;
    snprintf(x->runner_id, sizeof x->runner_id, "%s", e->runner_id);
    snprintf(x->task_id, sizeof x->task_id, "%s", e->task_id ? e->task_id : "");
    x->status = e->status;
    x->restart_count = e->restart_count;
    x->pid = e->pid;
    x->token = e->token;
    x->index = e->index;
    x->n_generated = e->n_generated;
    x->finish = e->finish;
    x->error = e->error ? strdup(e->error) : NULL;
    x->t_ns = clock_ns();
}

static void rec_clear(struct rec *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->ev[i].error);
    free(r->ev);
    memset(r, 0, sizeof *r);
}

/* Index of the first event from `from` on with this kind (and status, for STATUS; -1:
 * any) and restart_count (-1: any), or -1. */
static long find_ev(const struct rec *r, size_t from, enum supervisor_event_kind kind, int status, int restarts)
{
    for (size_t i = from; i < r->n; i++)
        if (r->ev[i].kind == kind && (kind != SUPERVISOR_STATUS || status < 0 || (int)r->ev[i].status == status) &&
            (restarts < 0 || r->ev[i].restart_count == restarts))
            return (long)i;
    return -1;
}

static long count_ev(const struct rec *r, enum supervisor_event_kind kind, int status)
{
    long n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->ev[i].kind == kind && (kind != SUPERVISOR_STATUS || status < 0 || (int)r->ev[i].status == status);
    return n;
}

/* Polls until an event like that appears (index returned) or timeout_ms pass (-1). */
static long wait_ev(struct supervisor *s, struct rec *r, size_t from, enum supervisor_event_kind kind, int status,
                    int restarts, int timeout_ms)
{
    int64_t end = clock_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        long i = find_ev(r, from, kind, status, restarts);
        if (i >= 0 || clock_ns() > end)
            return i;
        supervisor_poll(s, 50);
    }
}

static void dump(const struct rec *r)
{
    for (size_t i = 0; i < r->n; i++) {
        const struct ev *e = &r->ev[i];
        fprintf(stderr, "  [%zu] kind %d %s status %s restarts %d pid %d task %s token %d finish %d error %s\n", i,
                e->kind, e->runner_id, cluster_runner_status_name(e->status), e->restart_count, (int)e->pid,
                e->task_id, e->token, e->finish, e->error ? e->error : "-");
    }
}

/* ---- fake runners ---- */

#define SH_STATUS "s() { printf '{\"type\":\"status\",\"status\":\"%s\",\"error\":null}\\n' \"$1\" >&3; }\n"

/* Reaches Ready, answers tasks with tokens 7, 8, 9 and shuts down when asked. */
static const char *fake_ok = SH_STATUS
    "echo \"fake runner $$ starting\" >&2\n"
    "s Idle; s Connecting; s Loading; s WarmingUp; s Ready\n"
    "exec 0<&3\n"
    "while read -r line; do\n"
    "  case \"$line\" in\n"
    "  *'\"type\":\"task\"'*)\n"
    "    id=$(printf '%s' \"$line\" | sed 's/.*\"task_id\":\"\\([^\"]*\\)\".*/\\1/')\n"
    "    case \"$id\" in crash*) s Running; kill -9 $$;; esac\n"
    "    s Running\n"
    "    for i in 0 1 2; do printf '{\"type\":\"token\",\"task_id\":\"%s\",\"token\":%d,\"index\":%d}\\n' \"$id\" $((i+7)) $i >&3; done\n"
    "    printf '{\"type\":\"done\",\"task_id\":\"%s\",\"finish\":\"length\",\"n_generated\":3,\"error\":null}\\n' \"$id\" >&3\n"
    "    s Ready;;\n"
    "  *'\"type\":\"shutdown\"'*) s ShuttingDown; s Shutdown; exit 0;;\n"
    "  esac\n"
    "done\n";

/* Fails while loading, with a message on stderr. */
static const char *fake_crash = SH_STATUS
    "echo \"loading went wrong: boom\" >&2\n"
    "s Idle; s Loading; exit 3\n";

/* Reports Failed itself, then exits. */
static const char *fake_failed =
    "printf '{\"type\":\"status\",\"status\":\"Failed\",\"error\":\"model file is bad\"}\\n' >&3\n"
    "echo 'details on stderr' >&2; exit 1\n";

/* Becomes Ready, then never speaks again and ignores everything. */
static const char *fake_hang_ready = SH_STATUS "s Idle; s Loading; s Ready; exec sleep 1000\n";
static const char *fake_hang_loading = SH_STATUS "s Idle; s Loading; exec sleep 1000\n";
static const char *fake_garbage = SH_STATUS "s Idle; echo 'this is not json' >&3; exec sleep 1000\n";

static struct supervisor_config fake_config(const char *script, const char **argv)
{
    argv[0] = "/bin/sh";
    argv[1] = "-c";
    argv[2] = script;
    argv[3] = "fake-runner";
    argv[4] = NULL;
    struct supervisor_config c;
    supervisor_config_defaults(&c);
    c.argv = argv;
    c.heartbeat_ms = 100;
    c.heartbeat_timeout_ms = 60000;
    c.start_timeout_ms = 60000;
    c.stop_timeout_ms = 2000;
    c.backoff_ms = 50;
    c.backoff_max_ms = 1000;
    return c;
}

static struct runner_config runner_cfg(const char *id, const char *model)
{
    struct runner_config c;
    runner_config_defaults(&c);
    snprintf(c.instance_id, sizeof c.instance_id, "inst-1");
    snprintf(c.runner_id, sizeof c.runner_id, "%s", id);
    snprintf(c.model_path, sizeof c.model_path, "%s", model);
    c.ctx = 256;
    c.threads = 2;
    return c;
}

static struct supervisor *make(const struct supervisor_config *c, struct rec *r)
{
    struct supervisor *s = NULL;
    char err[256];
    int rc = supervisor_create(&s, c, on_event, r, err, sizeof err);
    CHECK(rc == 0, "supervisor_create: %s", err);
    return s;
}

static int start(struct supervisor *s, const char *id, const char *model)
{
    struct runner_config rc = runner_cfg(id, model);
    char err[256];
    int e = supervisor_start(s, &rc, err, sizeof err);
    CHECK(e == 0, "supervisor_start %s: %s", id, err);
    return e;
}

static void finish(struct supervisor *s, struct rec *r)
{
    supervisor_release(s);
    rec_clear(r);
}

static void check_order(const struct rec *r, const enum cluster_runner_status *want, size_t n, const char *what)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n && k < n; i++)
        if (r->ev[i].kind == SUPERVISOR_STATUS) {
            CHECK(r->ev[i].status == want[k], "%s: status %zu is %s, expected %s", what, k,
                  cluster_runner_status_name(r->ev[i].status), cluster_runner_status_name(want[k]));
            k++;
        }
    CHECK(k == n, "%s: %zu of %zu statuses seen", what, k, n);
    if (test_failed)
        dump(r);
}

/* ---- descriptors ---- */

static int open_bait(void)
{
    /* Deliberately without close-on-exec: the supervisor must keep it from the runner. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) {
        perror("bait socket");
        return -1;
    }
    return fd;
}

static void link_of(pid_t pid, const char *fd, char *out, size_t n)
{
    char p[400];
    snprintf(p, sizeof p, "/proc/%d/fd/%s", (int)pid, fd);
    ssize_t len = readlink(p, out, n - 1);
    out[len > 0 ? len : 0] = 0;
}

/* Every descriptor of pid is one of 0..4, a copy of one of them, or the model file the
 * runner opened itself (model_load reads embedding rows through it); none is bait. */
static void check_fds(pid_t pid, int bait, const char *what)
{
    char bait_link[256], std[5][256];
    char num[16];
    snprintf(num, sizeof num, "%d", bait);
    link_of(getpid(), num, bait_link, sizeof bait_link);
    for (int i = 0; i < 5; i++) {
        snprintf(num, sizeof num, "%d", i);
        link_of(pid, num, std[i], sizeof std[i]);
        CHECK(std[i][0], "%s: fd %d of the runner is not open", what, i);
    }
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    CHECK(d != NULL, "%s: cannot list %s", what, p);
    if (!d)
        return;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        char l[256];
        link_of(pid, e->d_name, l, sizeof l);
        bool known = false;
        for (int i = 0; i < 5; i++)
            known |= !strcmp(l, std[i]);
        size_t ll = strlen(l);
        known |= ll > 5 && !strcmp(l + ll - 5, ".gguf");
        CHECK(known, "%s: the runner holds fd %s -> %s", what, e->d_name, l);
        CHECK(strcmp(l, bait_link), "%s: the node's listening socket leaked as fd %s (%s)", what, e->d_name, l);
    }
    closedir(d);
    printf("  %s: %d descriptors, %s on 3, %s on 4\n", what, n, std[3], std[4]);
}

/* ---- fake runner cases ---- */

static void test_fake_lifecycle(void)
{
    const char *argv[5];
    struct supervisor_config c = fake_config(fake_ok, argv);
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    int bait = open_bait();
    if (!s || start(s, "r1", "/nonexistent.gguf"))
        return;
    char err[256];
    struct runner_config dup = runner_cfg("r1", "/x");
    CHECK(supervisor_start(s, &dup, err, sizeof err) == CAIRN_ESTATE, "second runner with the same id");
    long ready = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 5000);
    CHECK(ready >= 0, "fake runner not Ready");
    enum cluster_runner_status want[] = {CLUSTER_RUNNER_IDLE, CLUSTER_RUNNER_CONNECTING, CLUSTER_RUNNER_LOADING,
                                         CLUSTER_RUNNER_WARMING_UP, CLUSTER_RUNNER_READY};
    check_order(&r, want, 5, "fake start");
    pid_t pid = supervisor_pid(s, "r1");
    CHECK(pid > 0 && ready >= 0 && r.ev[ready].pid == pid, "pid %d, event pid %d", (int)pid,
          ready >= 0 ? (int)r.ev[ready].pid : -1);
    if (pid > 0 && bait >= 0)
        check_fds(pid, bait, "fake runner");

    /* A task: tokens and done come back through the supervisor. */
    int32_t prompt[] = {1, 2, 3};
    struct runner_task t = {.tokens = prompt, .n_tokens = 3, .max_tokens = 3, .sampling = runner_sampling_defaults()};
    snprintf(t.task_id, sizeof t.task_id, "task-1");
    CHECK(supervisor_submit(s, "r1", &t, err, sizeof err) == 0, "submit: %s", err);
    CHECK(supervisor_submit(s, "r1", &t, err, sizeof err) == CAIRN_ESTATE, "same task id twice in flight");
    CHECK(supervisor_submit(s, "nope", &t, err, sizeof err) == CAIRN_ENOTFOUND, "unknown runner");
    struct runner_task bad = t;
    bad.n_tokens = 0;
    snprintf(bad.task_id, sizeof bad.task_id, "task-2");
    CHECK(supervisor_submit(s, "r1", &bad, err, sizeof err) == CAIRN_EINVAL, "task without tokens");
    snprintf(bad.task_id, sizeof bad.task_id, "bad id!");
    bad.n_tokens = 3;
    CHECK(supervisor_submit(s, "r1", &bad, err, sizeof err) == CAIRN_EINVAL, "task with a bad id");
    long done = wait_ev(s, &r, 0, SUPERVISOR_DONE, -1, -1, 5000);
    CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_LENGTH && r.ev[done].n_generated == 3 &&
              !strcmp(r.ev[done].task_id, "task-1"),
          "task not done");
    int32_t toks[3] = {0};
    int nt = 0;
    for (size_t i = 0; i < r.n; i++)
        if (r.ev[i].kind == SUPERVISOR_TOKEN && nt < 3 && !strcmp(r.ev[i].task_id, "task-1") && r.ev[i].index == nt)
            toks[nt++] = r.ev[i].token;
    CHECK(nt == 3 && toks[0] == 7 && toks[1] == 8 && toks[2] == 9, "tokens %d %d %d (%d)", toks[0], toks[1], toks[2],
          nt);
    CHECK(wait_ev(s, &r, (size_t)done, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 5000) >= 0, "not Ready again");
    CHECK(supervisor_cancel(s, "r1", "task-1") == CAIRN_ENOTFOUND, "cancel of a finished task");

    /* Stop: ShuttingDown from the runner, Shutdown once it is reaped, the id is free. */
    size_t mark = r.n;
    CHECK(supervisor_stop(s, "r1") == 0, "stop");
    CHECK(supervisor_submit(s, "r1", &t, err, sizeof err) == CAIRN_ESTATE, "submit while stopping");
    long sd = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTDOWN, -1, 5000);
    CHECK(sd >= 0 && find_ev(&r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTTING_DOWN, -1) >= 0 &&
              find_ev(&r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTTING_DOWN, -1) < sd,
          "no ShuttingDown then Shutdown");
    CHECK(supervisor_count(s) == 0 && supervisor_pid(s, "r1") == 0, "runner still supervised");
    CHECK(pid > 0 && kill(pid, 0) < 0 && errno == ESRCH, "process %d still exists after Shutdown", (int)pid);
    CHECK(count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED) == 0, "a Failed was reported");
    CHECK(supervisor_stop(s, "r1") == CAIRN_ENOTFOUND, "stop of a removed runner");
    if (test_failed)
        dump(&r);
    if (bait >= 0)
        close(bait);
    finish(s, &r);
}

struct starter {
    struct supervisor *s;
    int64_t t_start;
    int rc;
};

static void *start_later(void *arg)
{
    struct starter *st = arg;
    usleep(100000);
    struct runner_config rc = runner_cfg("late", "/m.gguf");
    st->t_start = clock_ns();
    st->rc = supervisor_start(st->s, &rc, NULL, 0);
    return NULL;
}

/* A runner started from another thread while supervisor_poll waits wakes the poll. */
static void test_fake_thread_wake(void)
{
    const char *argv[5];
    struct supervisor_config c = fake_config(fake_ok, argv);
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s)
        return;
    struct starter st = {.s = s, .rc = -1};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, start_later, &st) == 0, "thread");
    int64_t end = clock_ns() + 10000000000ll;
    while (find_ev(&r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0) < 0 && clock_ns() < end)
        supervisor_poll(s, 3000);
    pthread_join(th, NULL);
    long ready = find_ev(&r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0);
    CHECK(st.rc == 0 && ready >= 0, "late runner not Ready");
    if (ready >= 0) {
        double ms = (double)(r.ev[ready].t_ns - st.t_start) / 1e6;
        CHECK(ms < 1500, "Ready seen %.0f ms after the start from another thread (poll not woken)", ms);
    }
    supervisor_stop(s, "late");
    CHECK(wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTDOWN, -1, 5000) >= 0, "late runner not stopped");
    finish(s, &r);
}

static void test_fake_sigkill_restart(void)
{
    const char *argv[5];
    struct supervisor_config c = fake_config(fake_ok, argv);
    c.backoff_ms = 200;
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    CHECK(wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 5000) >= 0, "not Ready");
    pid_t pid = supervisor_pid(s, "r1");
    /* A task in flight when the runner dies finishes with an error. */
    int32_t prompt[] = {5};
    struct runner_task t = {.tokens = prompt, .n_tokens = 1, .max_tokens = 2, .sampling = runner_sampling_defaults()};
    snprintf(t.task_id, sizeof t.task_id, "held");
    char err[256];
    size_t mark = r.n;
    kill(pid, SIGSTOP); /* the task waits in the socket until the kill below */
    CHECK(supervisor_submit(s, "r1", &t, err, sizeof err) == 0, "submit: %s", err);
    kill(pid, SIGKILL);
    int64_t t_kill = clock_ns();
    long failed = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, 0, 5000);
    CHECK(failed >= 0, "SIGKILL not reported as Failed");
    if (failed >= 0) {
        const char *e = r.ev[failed].error ? r.ev[failed].error : "";
        CHECK(strstr(e, "killed by signal 9 (SIGKILL)") != NULL, "reason: %s", e);
        char want[64];
        snprintf(want, sizeof want, "fake runner %d starting", (int)pid);
        CHECK(strstr(e, want) != NULL, "stderr tail missing from: %s", e);
    }
    long done = find_ev(&r, mark, SUPERVISOR_DONE, -1, -1);
    CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_ERROR && !strcmp(r.ev[done].task_id, "held") &&
              r.ev[done].error,
          "task in flight not finished with an error");
    long idle = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_IDLE, 1, 5000);
    long ready = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 1, 5000);
    CHECK(idle >= 0 && ready > idle, "not restarted (restart_count 1)");
    if (idle >= 0) {
        double waited = (double)(r.ev[idle].t_ns - t_kill) / 1e6;
        CHECK(waited >= 190, "restarted %.0f ms after the kill, backoff is 200 ms", waited);
        CHECK(r.ev[idle].pid > 0 && r.ev[idle].pid != pid, "new pid %d, old %d", (int)r.ev[idle].pid, (int)pid);
    }
    enum cluster_runner_status st;
    int restarts = -1;
    CHECK(supervisor_status(s, "r1", &st, &restarts) == 0 && st == CLUSTER_RUNNER_READY && restarts == 1,
          "status %s restarts %d", cluster_runner_status_name(st), restarts);

    /* A runner that dies while running a task. */
    mark = r.n;
    snprintf(t.task_id, sizeof t.task_id, "crash-1");
    CHECK(supervisor_submit(s, "r1", &t, err, sizeof err) == 0, "submit: %s", err);
    done = wait_ev(s, &r, mark, SUPERVISOR_DONE, -1, -1, 5000);
    CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_ERROR && !strcmp(r.ev[done].task_id, "crash-1"),
          "crashed task not finished with an error");
    CHECK(wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 2, 5000) >= 0, "not restarted again");
    if (test_failed)
        dump(&r);
    finish(s, &r);
}

static void test_fake_give_up(void)
{
    const char *argv[5];
    struct supervisor_config c = fake_config(fake_crash, argv);
    c.backoff_ms = 40;
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    long gave = wait_ev(s, &r, 0, SUPERVISOR_GAVE_UP, -1, -1, 10000);
    CHECK(gave >= 0, "never gave up");
    CHECK_EQ_INT(count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED), 5);
    CHECK_EQ_INT(count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_IDLE), 5);
    CHECK(supervisor_count(s) == 0, "given-up runner still supervised");
    /* Delays double: 40, 80, 160, 320 ms between a failure and the next start. */
    long prev = -1;
    int k = 0;
    for (size_t i = 0; i < r.n; i++) {
        if (r.ev[i].kind != SUPERVISOR_STATUS)
            continue;
        if (r.ev[i].status == CLUSTER_RUNNER_FAILED) {
            const char *e = r.ev[i].error ? r.ev[i].error : "";
            CHECK(strstr(e, "exited with code 3") && strstr(e, "loading went wrong: boom"), "reason: %s", e);
            CHECK(r.ev[i].restart_count == k, "Failed %d has restart_count %d", k, r.ev[i].restart_count);
            prev = (long)i;
            k++;
        } else if (r.ev[i].status == CLUSTER_RUNNER_IDLE && prev >= 0) {
            double gap = (double)(r.ev[i].t_ns - r.ev[prev].t_ns) / 1e6, want = 40.0 * (1 << (k - 1));
            CHECK(gap >= want - 10, "restart %d after %.0f ms, backoff %.0f ms", k, gap, want);
            printf("  restart %d after %.0f ms (backoff %.0f)\n", k, gap, want);
            prev = -1;
        }
    }
    CHECK(gave >= 0 && r.ev[gave].error && strstr(r.ev[gave].error, "boom"), "gave up without the reason");
    if (test_failed)
        dump(&r);
    finish(s, &r);

    /* A runner's own Failed report leads the reason, then how it ended and its stderr. */
    c = fake_config(fake_failed, argv);
    c.max_failures = 1;
    s = make(&c, &r);
    if (!s || start(s, "r2", "/m.gguf"))
        return;
    gave = wait_ev(s, &r, 0, SUPERVISOR_GAVE_UP, -1, -1, 5000);
    long failed = find_ev(&r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1);
    CHECK(gave > failed && failed >= 0 && count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED) == 1,
          "one Failed then gave up");
    if (failed >= 0) {
        const char *e = r.ev[failed].error ? r.ev[failed].error : "";
        CHECK(!strncmp(e, "model file is bad; exited with code 1", 37) && strstr(e, "details on stderr"), "reason: %s",
              e);
    }
    finish(s, &r);
}

static void test_fake_hung(void)
{
    const char *argv[5];
    struct supervisor_config c = fake_config(fake_hang_ready, argv);
    c.heartbeat_timeout_ms = 300;
    c.max_failures = 1;
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    long ready = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 5000);
    pid_t pid = supervisor_pid(s, "r1");
    long failed = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1, 5000);
    CHECK(ready >= 0 && failed > ready, "hung runner not failed");
    if (failed > ready && ready >= 0) {
        const char *e = r.ev[failed].error ? r.ev[failed].error : "";
        CHECK(strstr(e, "no message for 300 ms while Ready: killed") && strstr(e, "SIGKILL"), "reason: %s", e);
        double after = (double)(r.ev[failed].t_ns - r.ev[ready].t_ns) / 1e6;
        CHECK(after >= 290 && after < 3000, "killed %.0f ms after its last message", after);
        printf("  hung runner killed %.0f ms after Ready\n", after);
    }
    CHECK(pid > 0 && kill(pid, 0) < 0, "hung runner %d still exists", (int)pid);
    CHECK(wait_ev(s, &r, 0, SUPERVISOR_GAVE_UP, -1, -1, 1000) >= 0, "max_failures 1: no GAVE_UP");
    finish(s, &r);

    /* Before Ready the start timeout applies. */
    c = fake_config(fake_hang_loading, argv);
    c.start_timeout_ms = 300;
    c.max_failures = 1;
    s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    failed = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1, 5000);
    CHECK(failed >= 0 && r.ev[failed].error && strstr(r.ev[failed].error, "no message for 300 ms while Loading"),
          "loading hang: %s", failed >= 0 && r.ev[failed].error ? r.ev[failed].error : "(none)");
    finish(s, &r);

    /* A runner that ignores shutdown is killed after stop_timeout and reported Shutdown. */
    c = fake_config(fake_hang_ready, argv);
    c.stop_timeout_ms = 200;
    s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    CHECK(wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 5000) >= 0, "not Ready");
    pid = supervisor_pid(s, "r1");
    int64_t t0 = clock_ns();
    supervisor_stop(s, "r1");
    long sd = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTDOWN, -1, 5000);
    double took = (double)(clock_ns() - t0) / 1e6;
    CHECK(sd >= 0 && took >= 190 && count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED) == 0,
          "stubborn runner: Shutdown after %.0f ms", took);
    CHECK(pid > 0 && kill(pid, 0) < 0, "stubborn runner %d still exists", (int)pid);
    finish(s, &r);

    /* Garbage on the socket: killed, reason says so. */
    c = fake_config(fake_garbage, argv);
    c.max_failures = 1;
    s = make(&c, &r);
    if (!s || start(s, "r1", "/m.gguf"))
        return;
    failed = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1, 5000);
    CHECK(failed >= 0 && r.ev[failed].error && strstr(r.ev[failed].error, "malformed message from the runner"),
          "garbage: %s", failed >= 0 && r.ev[failed].error ? r.ev[failed].error : "(none)");
    finish(s, &r);

    /* A program that cannot be started. */
    argv[0] = "/nonexistent/cairn";
    argv[1] = NULL;
    s = make(&c, &r);
    struct runner_config rc = runner_cfg("r1", "/m.gguf");
    char err[256];
    CHECK(s && supervisor_start(s, &rc, err, sizeof err) == CAIRN_EIO && strstr(err, "/nonexistent/cairn"),
          "start of a missing program: %s", err);
    CHECK(s && supervisor_count(s) == 0, "failed start kept");
    finish(s, &r);
}

static void test_proto(void)
{
    char err[256];
    struct runner_msg m;
    const char *lines[] = {
        "{\"type\":\"status\",\"status\":\"Loading\",\"error\":null}",
        "{\"type\":\"status\",\"status\":\"Failed\",\"error\":\"x\"}",
        "{\"type\":\"heartbeat\"}",
        "{\"type\":\"token\",\"task_id\":\"t1\",\"token\":5,\"index\":0}",
        "{\"type\":\"done\",\"task_id\":\"t1\",\"finish\":\"cancelled\",\"n_generated\":0,\"error\":null}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[1,2],\"max_tokens\":4,\"future\":1}",
        "{\"type\":\"cancel\",\"task_id\":\"t1\"}",
        "{\"type\":\"shutdown\"}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        int rc = runner_msg_decode(lines[i], strlen(lines[i]), &m, err, sizeof err);
        CHECK(rc == 0, "decode %s: %s", lines[i], err);
        size_t len;
        char *again = rc ? NULL : runner_msg_encode(&m, &len);
        struct runner_msg m2;
        CHECK(again && runner_msg_decode(again, len, &m2, err, sizeof err) == 0 && m2.type == m.type &&
                  m2.task.n_tokens == m.task.n_tokens && m2.status == m.status,
              "round trip of %s: %s", lines[i], again ? again : "(null)");
        if (again)
            runner_msg_clear(&m2);
        free(again);
        runner_msg_clear(&m);
    }
    CHECK(runner_msg_decode(lines[5], strlen(lines[5]), &m, err, sizeof err) == 0 &&
              m.task.sampling.temperature == 0.8f && m.task.sampling.top_k == 40 && !m.task.ignore_eos,
          "task defaults");
    runner_msg_clear(&m);
    const char *bad[] = {
        "{\"type\":\"status\",\"status\":\"Sleeping\"}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[],\"max_tokens\":4}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[-1],\"max_tokens\":4}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[1],\"max_tokens\":0}",
        "{\"type\":\"task\",\"task_id\":\"t 1\",\"tokens\":[1],\"max_tokens\":1}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[1],\"max_tokens\":1,\"sampling\":{\"top_p\":0}}",
        "{\"type\":\"task\",\"task_id\":\"t1\",\"tokens\":[1],\"max_tokens\":1,\"kind\":\"Embedding\"}",
        "{\"type\":\"token\",\"task_id\":\"t1\",\"token\":5}",
        "{\"type\":\"done\",\"task_id\":\"t1\",\"finish\":\"later\",\"n_generated\":0}",
        "{\"type\":\"reboot\"}",
        "[1]",
        "{\"type\":\"heartbeat\"",
        "{\"type\":\"heartbeat\",\"type\":\"shutdown\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = runner_msg_decode(bad[i], strlen(bad[i]), &m, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT, "accepted %s", bad[i]);
        runner_msg_clear(&m);
    }
    /* Error text is made valid UTF-8 and cut. */
    char raw[IDS_TEXT_MAX + 100];
    memset(raw, 'a', sizeof raw - 1);
    raw[sizeof raw - 1] = 0;
    raw[3] = (char)0xff;
    struct runner_msg st = {.type = RUNNER_MSG_STATUS, .status = CLUSTER_RUNNER_FAILED, .error = raw};
    size_t len;
    char *line = runner_msg_encode(&st, &len);
    CHECK(line && runner_msg_decode(line, len, &m, err, sizeof err) == 0 && m.error &&
              strlen(m.error) == IDS_TEXT_MAX && m.error[3] == '?',
          "long error: %s", err);
    runner_msg_clear(&m);
    free(line);
    /* Config JSON round trip and checks. */
    struct runner_config c = runner_cfg("r-9", "/models/a b.gguf"), c2;
    c.layer_begin = 2;
    c.layer_end = 5;
    json_t *j = runner_config_to_json(&c);
    CHECK(j && runner_config_from_json(j, &c2, err, sizeof err) == 0 && !strcmp(c2.model_path, c.model_path) &&
              c2.layer_begin == 2 && c2.layer_end == 5 && c2.ctx == 256 && !strcmp(c2.runner_id, "r-9"),
          "config round trip: %s", err);
    json_decref(j);
    /* A pipelined runner's rank, world size, epoch and model identity. */
    c.rank = 2;
    c.world_size = 3;
    c.epoch = 7;
    snprintf(c.model_identity, sizeof c.model_identity, "qwen:7b");
    snprintf(c.data_bind, sizeof c.data_bind, "10.0.0.2");
    j = runner_config_to_json(&c);
    CHECK(j && runner_config_from_json(j, &c2, err, sizeof err) == 0 && c2.rank == 2 && c2.world_size == 3 &&
              c2.epoch == 7 && !strcmp(c2.model_identity, "qwen:7b") && !strcmp(c2.data_bind, "10.0.0.2"),
          "pipelined config round trip: %s", err);
    json_decref(j);
    const char *badpipe[] = {
        "{\"instance_id\":\"i\",\"runner_id\":\"r\",\"model_path\":\"/m\",\"rank\":3,\"world_size\":3}",
        "{\"instance_id\":\"i\",\"runner_id\":\"r\",\"model_path\":\"/m\",\"world_size\":0}",
        "{\"instance_id\":\"i\",\"runner_id\":\"r\",\"model_path\":\"/m\",\"epoch\":-1}",
        "{\"instance_id\":\"i\",\"runner_id\":\"r\",\"model_path\":\"/m\",\"model_identity\":\"a b\"}",
    };
    for (size_t i = 0; i < sizeof badpipe / sizeof badpipe[0]; i++)
        CHECK(runner_config_parse(badpipe[i], strlen(badpipe[i]), &c2, err, sizeof err) == CAIRN_EFORMAT,
              "accepted %s", badpipe[i]);
    /* peers, and a status with its data port */
    const char *peers = "{\"type\":\"peers\",\"epoch\":4,\"secret\":\"abc\",\"next_rank\":1,\"next_port\":4100,"
                        "\"hosts\":[\"127.0.0.1\",\"::1\"]}";
    CHECK(runner_msg_decode(peers, strlen(peers), &m, err, sizeof err) == 0 && m.type == RUNNER_MSG_PEERS &&
              m.peers.epoch == 4 && !strcmp(m.peers.secret, "abc") && m.peers.next_rank == 1 &&
              m.peers.next_port == 4100 && m.peers.n_hosts == 2 && !strcmp(m.peers.hosts[1], "::1"),
          "peers: %s", err);
    line = runner_msg_encode(&m, &len);
    struct runner_msg m3;
    CHECK(line && runner_msg_decode(line, len, &m3, err, sizeof err) == 0 && !memcmp(&m3.peers, &m.peers, sizeof m.peers),
          "peers round trip: %s", line ? line : "(null)");
    free(line);
    runner_msg_clear(&m3);
    runner_msg_clear(&m);
    const char *badpeers[] = {
        "{\"type\":\"peers\",\"epoch\":4,\"next_rank\":1,\"next_port\":0,\"hosts\":[\"h\"]}",
        "{\"type\":\"peers\",\"epoch\":4,\"next_rank\":1,\"next_port\":9,\"hosts\":[]}",
        "{\"type\":\"peers\",\"epoch\":4,\"next_rank\":1,\"next_port\":9,\"hosts\":[3]}",
        "{\"type\":\"peers\",\"epoch\":4,\"next_rank\":1,\"next_port\":9}",
        "{\"type\":\"status\",\"status\":\"Connecting\",\"data_port\":70000}",
    };
    for (size_t i = 0; i < sizeof badpeers / sizeof badpeers[0]; i++) {
        CHECK(runner_msg_decode(badpeers[i], strlen(badpeers[i]), &m, err, sizeof err) == CAIRN_EFORMAT,
              "accepted %s", badpeers[i]);
        runner_msg_clear(&m);
    }
    const char *withport = "{\"type\":\"status\",\"status\":\"Connecting\",\"data_port\":4100}";
    CHECK(runner_msg_decode(withport, strlen(withport), &m, err, sizeof err) == 0 && m.data_port == 4100,
          "status with a data port: %s", err);
    runner_msg_clear(&m);
    const char *badcfg = "{\"instance_id\":\"i\",\"runner_id\":\"r\",\"model_path\":\"/m\",\"layer_begin\":3,"
                         "\"layer_end\":3}";
    CHECK(runner_config_parse(badcfg, strlen(badcfg), &c2, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "layer_end"),
          "empty layer range: %s", err);
    /* Lines split over reads, and a line beyond the limit. */
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    struct runner_lines lb = {0};
    const char *part = "{\"type\":\"heart";
    CHECK(write(sv[1], part, strlen(part)) > 0, "write");
    const char *l;
    size_t ll;
    CHECK(runner_lines_fill(&lb, sv[0]) == RUNNER_LINES_DATA && runner_lines_next(&lb, &l, &ll) == 0, "partial line");
    CHECK(write(sv[1], "beat\"}\n{\"ty", 12) == 12, "write");
    CHECK(runner_lines_fill(&lb, sv[0]) == RUNNER_LINES_DATA && runner_lines_next(&lb, &l, &ll) == 1 &&
              ll == strlen("{\"type\":\"heartbeat\"}") && !memcmp(l, "{\"type\":\"heartbeat\"}", ll) &&
              runner_lines_next(&lb, &l, &ll) == 0,
          "joined line");
    close(sv[1]);
    CHECK(runner_lines_fill(&lb, sv[0]) == RUNNER_LINES_EOF, "EOF");
    close(sv[0]);
    runner_lines_free(&lb);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    char *big = malloc(1 << 20);
    memset(big, 'x', 1 << 20);
    int verdict = 0;
    for (int round = 0; round < 4000 && !verdict; round++) {
        ssize_t w = write(sv[1], big, 1 << 20);
        (void)w;
        int f;
        while ((f = runner_lines_fill(&lb, sv[0])) == RUNNER_LINES_DATA && !verdict)
            verdict = runner_lines_next(&lb, &l, &ll);
        if (f < 0)
            verdict = f;
    }
    CHECK(verdict == CAIRN_EFORMAT, "endless line: %d", verdict);
    free(big);
    runner_lines_free(&lb);
    close(sv[0]);
    close(sv[1]);
}

/* ---- the real cairn runner ---- */

static char model_path[256], script_path[256];
#define SCRIPT_VOCAB 512
#define SCRIPT_NEXT(t) (((t) * 37 + 11) % SCRIPT_VOCAB)

static bool have_binary(void)
{
    if (access(CAIRN_BINARY, X_OK)) {
        printf("real runner tests skipped: %s is not built (build the cairn target)\n", CAIRN_BINARY);
        return false;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s runner --help >/dev/null 2>&1", CAIRN_BINARY);
    if (system(cmd) != 0) {
        printf("real runner tests skipped: %s has no runner command (rebuild the cairn target)\n", CAIRN_BINARY);
        return false;
    }
    return true;
}

/* Token ids that `cairn generate` prints for the prompt, or -1. */
static int generate_ref(const char *model, const char *extra, int32_t *out, int max)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s generate -m %s --tokens 1,2,3,4,5 -n %d -t 2 %s 2>/dev/null", CAIRN_BINARY,
             model, max, extra);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    int n = 0;
    while (n < max && fscanf(p, "%d", &out[n]) == 1)
        n++;
    pclose(p);
    return n;
}

static int tokens_of(const struct rec *r, const char *task, int32_t *out, int max)
{
    int n = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->ev[i].kind == SUPERVISOR_TOKEN && !strcmp(r->ev[i].task_id, task) && n < max) {
            CHECK(r->ev[i].index == n, "token index %lld, expected %d", (long long)r->ev[i].index, n);
            out[n++] = r->ev[i].token;
        }
    return n;
}

static struct supervisor_config real_config(const char **argv)
{
    argv[0] = CAIRN_BINARY;
    argv[1] = "runner";
    argv[2] = NULL;
    struct supervisor_config c;
    supervisor_config_defaults(&c);
    c.argv = argv;
    c.heartbeat_ms = 100;
    c.heartbeat_timeout_ms = 20000;
    c.start_timeout_ms = 60000;
    c.backoff_ms = 100;
    return c;
}

static void test_real_generate(void)
{
    const char *argv[3];
    struct supervisor_config c = real_config(argv);
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    int bait = open_bait();
    if (!s || start(s, "real-1", model_path))
        return;
    long ready = wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 30000);
    CHECK(ready >= 0, "real runner not Ready");
    enum cluster_runner_status want[] = {CLUSTER_RUNNER_IDLE, CLUSTER_RUNNER_CONNECTING, CLUSTER_RUNNER_LOADING,
                                         CLUSTER_RUNNER_WARMING_UP, CLUSTER_RUNNER_READY};
    check_order(&r, want, 5, "real start");
    pid_t pid = supervisor_pid(s, "real-1");
    if (pid > 0 && bait >= 0)
        check_fds(pid, bait, "real runner");

    struct {
        const char *id, *flags;
        float temp;
        uint64_t seed;
    } cases[] = {{"greedy", "--temp 0", 0, 0}, {"sampled", "--temp 0.9 --seed 5", 0.9f, 5}};
    for (size_t k = 0; k < 2; k++) {
        int32_t ref[24], got[24];
        int n_ref = generate_ref(model_path, cases[k].flags, ref, 24);
        CHECK(n_ref == 24, "cairn generate %s gave %d tokens", cases[k].flags, n_ref);
        int32_t prompt[] = {1, 2, 3, 4, 5};
        struct runner_task t = {.tokens = prompt, .n_tokens = 5, .max_tokens = 24, .ignore_eos = true,
                                .sampling = runner_sampling_defaults()};
        t.sampling.temperature = cases[k].temp;
        t.sampling.seed = cases[k].seed;
        snprintf(t.task_id, sizeof t.task_id, "%s", cases[k].id);
        size_t mark = r.n;
        char err[256];
        CHECK(supervisor_submit(s, "real-1", &t, err, sizeof err) == 0, "submit: %s", err);
        long done = wait_ev(s, &r, mark, SUPERVISOR_DONE, -1, -1, 30000);
        CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_LENGTH && r.ev[done].n_generated == 24,
              "%s task not done with length", cases[k].id);
        int n = tokens_of(&r, cases[k].id, got, 24);
        bool same = n == n_ref;
        for (int i = 0; same && i < n; i++)
            same = got[i] == ref[i];
        CHECK(same, "%s: runner and cairn generate differ (%d vs %d tokens; first %d vs %d)", cases[k].id, n, n_ref,
              n ? got[0] : -1, n_ref > 0 ? ref[0] : -1);
        printf("  %s: %d tokens as cairn generate:", cases[k].id, n);
        for (int i = 0; i < n && i < 12; i++)
            printf(" %d", got[i]);
        printf(" ...\n");
        CHECK(find_ev(&r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_RUNNING, -1) >= 0 &&
                  wait_ev(s, &r, (size_t)(done >= 0 ? done : 0), SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, -1, 5000) >= 0,
              "Running then Ready not reported");
    }

    /* A task that asks for more than the context holds ends at the context's end
     * (length); cancel of a long task. */
    int32_t prompt[] = {1, 2};
    struct runner_task t = {.tokens = prompt, .n_tokens = 2, .max_tokens = 1000, .ignore_eos = true,
                            .sampling = runner_sampling_defaults()};
    snprintf(t.task_id, sizeof t.task_id, "too-long");
    size_t mark = r.n;
    char err[256];
    CHECK(supervisor_submit(s, "real-1", &t, err, sizeof err) == 0, "submit");
    long done = wait_ev(s, &r, mark, SUPERVISOR_DONE, -1, -1, 60000);
    CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_LENGTH && r.ev[done].n_generated == 254,
          "too long: finish %d, %lld tokens, %s", done >= 0 ? (int)r.ev[done].finish : -1,
          done >= 0 ? (long long)r.ev[done].n_generated : -1LL,
          done >= 0 && r.ev[done].error ? r.ev[done].error : "(none)");
    t.max_tokens = 250;
    t.ignore_eos = true;
    snprintf(t.task_id, sizeof t.task_id, "cancel-me");
    mark = r.n;
    CHECK(supervisor_submit(s, "real-1", &t, err, sizeof err) == 0, "submit");
    CHECK(wait_ev(s, &r, mark, SUPERVISOR_TOKEN, -1, -1, 10000) >= 0, "no token");
    CHECK(supervisor_cancel(s, "real-1", "cancel-me") == 0, "cancel");
    done = wait_ev(s, &r, mark, SUPERVISOR_DONE, -1, -1, 10000);
    CHECK(done >= 0 && (r.ev[done].finish == RUNNER_FINISH_CANCELLED || r.ev[done].n_generated == 250),
          "cancel: finish %d", done >= 0 ? (int)r.ev[done].finish : -1);

    /* SIGKILL: Failed with the reason, restarted, Ready again. */
    mark = r.n;
    kill(pid, SIGKILL);
    long failed = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1, 10000);
    CHECK(failed >= 0 && r.ev[failed].error && strstr(r.ev[failed].error, "SIGKILL"), "real SIGKILL: %s",
          failed >= 0 && r.ev[failed].error ? r.ev[failed].error : "(none)");
    CHECK(wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 1, 30000) >= 0, "real runner not restarted");

    /* Graceful stop. */
    mark = r.n;
    supervisor_stop(s, "real-1");
    long sd = wait_ev(s, &r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTDOWN, -1, 10000);
    long sdg = find_ev(&r, mark, SUPERVISOR_STATUS, CLUSTER_RUNNER_SHUTTING_DOWN, -1);
    CHECK(sd >= 0 && sdg >= 0 && sdg < sd && supervisor_count(s) == 0, "real stop");
    if (test_failed)
        dump(&r);
    if (bait >= 0)
        close(bait);
    finish(s, &r);
}

/* A script model: its greedy continuation is known token by token, so the runner's
 * prompt handling and positions are checked against the script and cairn generate. */
static void test_real_script(void)
{
    const char *argv[3];
    struct supervisor_config c = real_config(argv);
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s || start(s, "script-1", script_path))
        return;
    CHECK(wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 30000) >= 0, "script runner not Ready");
    int32_t prompt[] = {1, 2, 3, 4, 5}, want[32], ref[32], got[32];
    int32_t cur = 5;
    for (int i = 0; i < 32; i++)
        want[i] = cur = SCRIPT_NEXT(cur);
    struct runner_task t = {.tokens = prompt, .n_tokens = 5, .max_tokens = 32, .ignore_eos = true,
                            .sampling = runner_sampling_defaults()};
    t.sampling.temperature = 0;
    snprintf(t.task_id, sizeof t.task_id, "script");
    char err[256];
    CHECK(supervisor_submit(s, "script-1", &t, err, sizeof err) == 0, "submit: %s", err);
    long done = wait_ev(s, &r, 0, SUPERVISOR_DONE, -1, -1, 30000);
    CHECK(done >= 0 && r.ev[done].finish == RUNNER_FINISH_LENGTH, "script task not done");
    int n = tokens_of(&r, "script", got, 32);
    int n_ref = generate_ref(script_path, "--temp 0", ref, 32);
    bool same_script = n == 32, same_ref = n == n_ref;
    for (int i = 0; i < n; i++) {
        same_script = same_script && got[i] == want[i];
        same_ref = same_ref && i < n_ref && got[i] == ref[i];
    }
    CHECK(same_script, "runner left the script (%d tokens, first %d, expected %d)", n, n ? got[0] : -1, want[0]);
    CHECK(same_ref, "runner and cairn generate differ on the script model (%d vs %d tokens)", n, n_ref);
    printf("  script: %d tokens as the script and cairn generate: %d %d %d ...\n", n, got[0], got[1], got[2]);
    finish(s, &r);
}

static void test_real_bad_model(void)
{
    const char *argv[3];
    struct supervisor_config c = real_config(argv);
    c.max_failures = 2;
    c.backoff_ms = 20;
    struct rec r = {0};
    struct supervisor *s = make(&c, &r);
    if (!s || start(s, "real-bad", "/nonexistent/model.gguf"))
        return;
    long gave = wait_ev(s, &r, 0, SUPERVISOR_GAVE_UP, -1, -1, 20000);
    long failed = find_ev(&r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED, -1);
    CHECK(gave >= 0 && count_ev(&r, SUPERVISOR_STATUS, CLUSTER_RUNNER_FAILED) == 2, "bad model: gave up after 2");
    CHECK(failed >= 0 && r.ev[failed].error && strstr(r.ev[failed].error, "/nonexistent/model.gguf") &&
              strstr(r.ev[failed].error, "exited with code 1"),
          "bad model reason: %s", failed >= 0 && r.ev[failed].error ? r.ev[failed].error : "(none)");
    CHECK(find_ev(&r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, -1) < 0, "bad model Ready");
    finish(s, &r);
}

/* waitpid with a deadline; returns the status or -1. */
static int wait_exit(pid_t pid, int timeout_ms, double *took_ms)
{
    int64_t t0 = clock_ns(), end = t0 + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            *took_ms = (double)(clock_ns() - t0) / 1e6;
            return st;
        }
        if (w < 0 || clock_ns() > end)
            return -1;
        usleep(5000);
    }
}

/* A child process plays the node; it is killed with SIGKILL, and the runner must end. */
static void test_real_node_killed(void)
{
    int pp[2];
    CHECK(pipe(pp) == 0, "pipe");
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* the orphaned runner becomes our child */
    pid_t node = fork();
    if (node == 0) {
        close(pp[0]);
        const char *argv[3];
        struct supervisor_config c = real_config(argv);
        struct rec r = {0};
        struct supervisor *s = NULL;
        if (supervisor_create(&s, &c, on_event, &r, NULL, 0))
            _exit(1);
        struct runner_config rc = runner_cfg("orphan", model_path);
        if (supervisor_start(s, &rc, NULL, 0))
            _exit(1);
        if (wait_ev(s, &r, 0, SUPERVISOR_STATUS, CLUSTER_RUNNER_READY, 0, 30000) < 0)
            _exit(1);
        pid_t rp = supervisor_pid(s, "orphan");
        if (write(pp[1], &rp, sizeof rp) != sizeof rp)
            _exit(1);
        for (;;)
            supervisor_poll(s, 1000);
    }
    close(pp[1]);
    pid_t runner = 0;
    struct pollfd p = {.fd = pp[0], .events = POLLIN};
    bool got = poll(&p, 1, 30000) == 1 && read(pp[0], &runner, sizeof runner) == sizeof runner && runner > 0;
    close(pp[0]);
    CHECK(got, "the node child did not report its runner");
    kill(node, SIGKILL);
    int st;
    waitpid(node, &st, 0);
    if (!got)
        return;
    double took = 0;
    int rs = wait_exit(runner, 10000, &took);
    CHECK(rs != -1, "runner %d outlived its node by 10 s", (int)runner);
    if (rs == -1)
        kill(runner, SIGKILL), waitpid(runner, &st, 0);
    else
        printf("  runner ended %.1f ms after its node was killed (status %#x)\n", took, rs);
    prctl(PR_SET_CHILD_SUBREAPER, 0);
}

/* The runner started by hand: closing only the node pipe (the socket stays open) ends it. */
static void test_real_node_pipe(void)
{
    int sv[2], np[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 && pipe2(np, O_CLOEXEC) == 0, "channels");
    int child_sock = fcntl(sv[1], F_DUPFD_CLOEXEC, 20), child_pipe = fcntl(np[0], F_DUPFD_CLOEXEC, 20);
    close(sv[1]);
    close(np[0]);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child_sock, RUNNER_FD_SOCK);
    posix_spawn_file_actions_adddup2(&fa, child_pipe, RUNNER_FD_NODE);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "{\"instance_id\":\"i\",\"runner_id\":\"hand\",\"model_path\":\"%s\",\"ctx\":64}",
             model_path);
    char *argv[] = {CAIRN_BINARY, "runner", "--config", cfg, NULL};
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(child_sock);
    close(child_pipe);
    CHECK(e == 0, "spawn: %s", strerror(e));
    if (e)
        return;
    struct runner_lines lb = {0};
    bool ready = false;
    int64_t end = clock_ns() + 30000000000ll;
    while (!ready && clock_ns() < end) {
        struct pollfd p = {.fd = sv[0], .events = POLLIN};
        if (poll(&p, 1, 1000) <= 0)
            continue;
        if (runner_lines_fill(&lb, sv[0]) != RUNNER_LINES_DATA)
            break;
        const char *l;
        size_t n;
        while (runner_lines_next(&lb, &l, &n) == 1)
            ready |= memmem(l, n, "\"Ready\"", 7) != NULL;
    }
    runner_lines_free(&lb);
    CHECK(ready, "hand-started runner not Ready");
    close(np[1]);
    double took = 0;
    int st = wait_exit(pid, 10000, &took);
    CHECK(st != -1 && WIFEXITED(st), "runner did not exit when its node pipe closed (status %#x)", st);
    if (st == -1)
        kill(pid, SIGKILL), waitpid(pid, &st, 0);
    else
        printf("  runner exited %.1f ms after its node pipe closed\n", took);
    close(sv[0]);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    RUN(test_proto);
    RUN(test_fake_lifecycle);
    RUN(test_fake_thread_wake);
    RUN(test_fake_sigkill_restart);
    RUN(test_fake_give_up);
    RUN(test_fake_hung);
    if (have_binary()) {
        snprintf(model_path, sizeof model_path, "/tmp/cairn-supervisor-%d.gguf", (int)getpid());
        struct synth_spec sp;
        memset(&sp, 0, sizeof sp);
        synth_shape("tiny", &sp);
        sp.n_layers = 2;
        sp.vocab_size = 512;
        sp.seed = 11;
        snprintf(sp.type, sizeof sp.type, "q8_0");
        char err[256];
        int rc = synth_write(&sp, NULL, model_path, err, sizeof err);
        CHECK(rc == 0, "synth_write: %s", err);
        snprintf(script_path, sizeof script_path, "/tmp/cairn-supervisor-script-%d.gguf", (int)getpid());
        int32_t next[SCRIPT_VOCAB];
        for (int i = 0; i < SCRIPT_VOCAB; i++)
            next[i] = SCRIPT_NEXT(i);
        sp.vocab_size = SCRIPT_VOCAB;
        int src = synth_write_script(&sp, NULL, next, SCRIPT_VOCAB, script_path, err, sizeof err);
        CHECK(src == 0, "synth_write_script: %s", err);
        if (!src)
            RUN(test_real_script);
        unlink(script_path);
        if (!rc) {
            RUN(test_real_generate);
            RUN(test_real_bad_model);
            RUN(test_real_node_killed);
            RUN(test_real_node_pipe);
        }
        unlink(model_path);
    }
    return test_main_end();
}
