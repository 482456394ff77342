#define _GNU_SOURCE
#include "node/supervisor.h"

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MS ((int64_t)1000000)

enum phase {
    PH_RUNNING, /* a process exists (possibly exited, not yet reaped) */
    PH_BACKOFF, /* waiting to be restarted at restart_at */
    PH_GONE,    /* reported and removed at the end of this poll */
};

struct sup_runner {
    struct runner_config cfg;
    enum phase phase;
    pid_t pid;
    int pidfd, sock, node_wr, errfd; /* -1 when closed */
    bool sock_eof, err_eof;
    struct runner_lines in;
    char *out;                   /* bytes to send to the runner */
    size_t out_len, out_cap;
    char tail[SUPERVISOR_TAIL];  /* ring of the last stderr bytes */
    size_t tail_len, tail_pos;
    enum cluster_runner_status status;
    int data_port;               /* the process's data-plane port, 0 = none */
    int failures;                /* consecutive */
    int restarts;
    int64_t last_heard, ready_since, restart_at, kill_at; /* ns, 0: none */
    const char *kill_at_why;     /* why kill_at was set (static text) */
    bool want_stop, killed;
    char *runner_error;          /* its own Failed report */
    char *kill_reason;           /* why the supervisor killed it */
    char (*tasks)[IDS_ID_MAX + 1]; /* in flight, n_tasks of SUPERVISOR_MAX_TASKS */
    size_t n_tasks;
};

struct qevent {
    struct supervisor_event ev;
    char runner_id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1], task_id[IDS_ID_MAX + 1];
    char *error;
    char *line; /* OUTPUT */
};

struct supervisor {
    struct supervisor_config cfg;
    char *argv[SUPERVISOR_MAX_ARGS + 1];
    int n_argv;
    supervisor_event_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    int wake[2];
    struct sup_runner **runners;
    size_t n, cap;
    struct qevent *q;
    size_t nq, capq;
};

void supervisor_config_defaults(struct supervisor_config *c)
{
    *c = (struct supervisor_config){.heartbeat_ms = 1000, .heartbeat_timeout_ms = 30000,
                                    .start_timeout_ms = 600000, .stop_timeout_ms = 10000, .backoff_ms = 1000,
                                    .backoff_max_ms = 30000, .max_failures = 5, .stable_ms = 60000};
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void wake(struct supervisor *s)
{
    char b = 1;
    ssize_t w = write(s->wake[1], &b, 1);
    (void)w; /* a full pipe already wakes the poller */
}

void supervisor_wake(struct supervisor *s) { wake(s); }

/* ---- events ---- */

static struct qevent *push(struct supervisor *s, enum supervisor_event_kind kind, const struct sup_runner *r)
{
    if (array_reserve(&s->q, &s->capq, s->nq + 1, sizeof *s->q, 16)) {
        log_error("supervisor: out of memory, an event of runner %s is lost", r->cfg.runner_id);
        return NULL;
    }
    struct qevent *e = &s->q[s->nq++];
    memset(e, 0, sizeof *e);
    e->ev.kind = kind;
    memcpy(e->runner_id, r->cfg.runner_id, sizeof e->runner_id);
    memcpy(e->instance_id, r->cfg.instance_id, sizeof e->instance_id);
    e->ev.restart_count = r->restarts;
    e->ev.pid = r->pid;
    e->ev.data_port = r->data_port;
    return e;
}

static void push_status(struct supervisor *s, const struct sup_runner *r, enum cluster_runner_status st,
                        const char *error)
{
    struct qevent *e = push(s, SUPERVISOR_STATUS, r);
    if (e) {
        e->ev.status = st;
        e->error = error ? strdup(error) : NULL;
    }
}

static void push_done(struct supervisor *s, const struct sup_runner *r, const char *task_id, enum runner_finish finish,
                      int64_t n_generated, const char *error)
{
    struct qevent *e = push(s, SUPERVISOR_DONE, r);
    if (e) {
        snprintf(e->task_id, sizeof e->task_id, "%s", task_id);
        e->ev.finish = finish;
        e->ev.n_generated = n_generated;
        e->error = error ? strdup(error) : NULL;
    }
}

/* ---- runners ---- */

static void free_runner(struct sup_runner *r)
{
    if (!r)
        return;
    close_fd(&r->pidfd);
    close_fd(&r->sock);
    close_fd(&r->node_wr);
    close_fd(&r->errfd);
    runner_lines_free(&r->in);
    free(r->out);
    free(r->runner_error);
    free(r->kill_reason);
    free(r->tasks);
    free(r);
}

static struct sup_runner *find(struct supervisor *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->runners[i]->phase != PH_GONE && !strcmp(s->runners[i]->cfg.runner_id, id))
            return s->runners[i];
    return NULL;
}

static void kill_runner(struct sup_runner *r, const char *reason)
{
    if (reason && !r->kill_reason)
        r->kill_reason = strdup(reason);
    if (r->killed || r->pid <= 0)
        return;
    kill(-r->pid, SIGKILL); /* its process group */
    kill(r->pid, SIGKILL);
    r->killed = true;
}

static void set_kill_at(struct sup_runner *r, int64_t at, const char *why)
{
    if (!r->kill_at || at < r->kill_at) {
        r->kill_at = at;
        r->kill_at_why = why;
    }
}

/* Moves fd to a number >= 10 (close-on-exec) so the child's dup2 to 3 and 4 never
 * overwrites a source it still needs. */
static int high_fd(int fd)
{
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    close(fd);
    return h;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int spawn(struct supervisor *s, struct sup_runner *r, char *err, size_t errlen)
{
    int sv[2] = {-1, -1}, node[2] = {-1, -1}, ep[2] = {-1, -1};
    int rc = CAIRN_EIO;
    char *json_text = NULL;
    bool fa_init = false, attr_init = false;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) || pipe2(node, O_CLOEXEC) || pipe2(ep, O_CLOEXEC)) {
        cairn_fail(err, errlen, rc, "cannot create the runner's channels: %s", strerror(errno));
        goto out;
    }
    sv[1] = high_fd(sv[1]);
    node[0] = high_fd(node[0]);
    ep[1] = high_fd(ep[1]);
    if (sv[1] < 0 || node[0] < 0 || ep[1] < 0 || set_nonblock(sv[0]) || set_nonblock(ep[0])) {
        cairn_fail(err, errlen, rc, "cannot set up the runner's descriptors: %s", strerror(errno));
        goto out;
    }
    json_t *cj = runner_config_to_json(&r->cfg);
    json_text = cj ? json_dumps(cj, JSON_COMPACT) : NULL;
    json_decref(cj);
    if (!json_text) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    char *argv[SUPERVISOR_MAX_ARGS + 3];
    int n = 0;
    for (int i = 0; i < s->n_argv; i++)
        argv[n++] = s->argv[i];
    argv[n++] = "--config";
    argv[n++] = json_text;
    argv[n] = NULL;

    int e = posix_spawn_file_actions_init(&fa);
    fa_init = e == 0;
    if (!e)
        e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!e)
        e = posix_spawn_file_actions_adddup2(&fa, ep[1], 1);
    if (!e)
        e = posix_spawn_file_actions_adddup2(&fa, ep[1], 2);
    if (!e)
        e = posix_spawn_file_actions_adddup2(&fa, sv[1], RUNNER_FD_SOCK);
    if (!e)
        e = posix_spawn_file_actions_adddup2(&fa, node[0], RUNNER_FD_NODE);
    if (!e)
        e = posix_spawn_file_actions_addclosefrom_np(&fa, RUNNER_FD_NODE + 1);
    if (!e)
        e = posix_spawnattr_init(&attr);
    attr_init = e == 0 && fa_init;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (!e)
        e = posix_spawnattr_setsigmask(&attr, &none);
    if (!e)
        e = posix_spawnattr_setsigdefault(&attr, &all);
    if (!e)
        e = posix_spawnattr_setpgroup(&attr, 0);
    if (!e)
        e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    if (e) {
        cairn_fail(err, errlen, rc, "cannot prepare posix_spawn: %s", strerror(e));
        goto out;
    }
    pid_t pid;
    e = posix_spawn(&pid, argv[0], &fa, &attr, argv, environ);
    if (e) {
        cairn_fail(err, errlen, rc, "cannot start %s: %s", argv[0], strerror(e));
        goto out;
    }
    r->pid = pid;
    r->data_port = 0; /* the new process listens anew */
#ifdef SYS_pidfd_open
    r->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#else
    r->pidfd = -1;
#endif
    r->sock = sv[0];
    r->node_wr = node[1];
    r->errfd = ep[0];
    sv[0] = node[1] = ep[0] = -1;
    r->phase = PH_RUNNING;
    r->sock_eof = r->err_eof = false;
    r->killed = false;
    r->status = CLUSTER_RUNNER_IDLE;
    r->last_heard = clock_ns();
    r->ready_since = r->restart_at = r->kill_at = 0;
    r->kill_at_why = NULL;
    r->out_len = 0;
    r->tail_len = r->tail_pos = 0;
    runner_lines_free(&r->in);
    free(r->runner_error);
    free(r->kill_reason);
    r->runner_error = r->kill_reason = NULL;
    log_debug("supervisor: runner %s started as pid %d", r->cfg.runner_id, (int)pid);
    rc = 0;
out:
    if (fa_init)
        posix_spawn_file_actions_destroy(&fa);
    if (attr_init)
        posix_spawnattr_destroy(&attr);
    free(json_text);
    close_fd(&sv[0]);
    close_fd(&sv[1]);
    close_fd(&node[0]);
    close_fd(&node[1]);
    close_fd(&ep[0]);
    close_fd(&ep[1]);
    return rc;
}

static int queue_out(struct sup_runner *r, const struct runner_msg *m)
{
    size_t len;
    char *line = runner_msg_encode(m, &len);
    if (!line)
        return CAIRN_ENOMEM;
    if (array_reserve(&r->out, &r->out_cap, r->out_len + len, 1, 4096)) {
        free(line);
        return CAIRN_ENOMEM;
    }
    memcpy(r->out + r->out_len, line, len);
    r->out_len += len;
    free(line);
    return 0;
}

static void flush_out(struct sup_runner *r)
{
    while (r->out_len && r->sock >= 0 && !r->sock_eof) {
        ssize_t w = send(r->sock, r->out, r->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w <= 0) {
            r->out_len = 0; /* the runner is gone; its exit is handled when it is reaped */
            return;
        }
        memmove(r->out, r->out + w, r->out_len - (size_t)w);
        r->out_len -= (size_t)w;
    }
}

/* Queues m for r's process and writes what the socket takes now; the poll thread is
 * woken for the rest. Under s->mu. */
static int send_now(struct supervisor *s, struct sup_runner *r, const struct runner_msg *m)
{
    int rc = queue_out(r, m);
    flush_out(r);
    if (r->out_len)
        wake(s);
    return rc;
}

static void drop_task(struct sup_runner *r, const char *task_id)
{
    for (size_t i = 0; i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i], task_id)) {
            memmove(r->tasks[i], r->tasks[i + 1], (r->n_tasks - i - 1) * sizeof r->tasks[0]);
            r->n_tasks--;
            return;
        }
}

static bool has_task(const struct sup_runner *r, const char *task_id)
{
    for (size_t i = 0; i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i], task_id))
            return true;
    return false;
}

static void handle_line(struct supervisor *s, struct sup_runner *r, const char *line, size_t len, int64_t now)
{
    struct runner_msg m;
    char err[256];
    if (runner_msg_decode(line, len, &m, err, sizeof err)) {
        char why[400];
        snprintf(why, sizeof why, "malformed message from the runner (%s): killed", err);
        kill_runner(r, why);
        return;
    }
    r->last_heard = now;
    struct qevent *e;
    switch (m.type) {
    case RUNNER_MSG_STATUS:
        if (m.status == CLUSTER_RUNNER_FAILED) {
            if (!r->runner_error)
                r->runner_error = m.error ? strdup(m.error) : strdup("the runner reported Failed");
            set_kill_at(r, now + s->cfg.stop_timeout_ms * MS, "did not exit after reporting Failed: killed");
            break;
        }
        r->status = (enum cluster_runner_status)m.status;
        if (m.data_port > 0)
            r->data_port = m.data_port;
        if (m.status == CLUSTER_RUNNER_SHUTDOWN)
            break; /* reported once the process is reaped */
        if ((m.status == CLUSTER_RUNNER_READY || m.status == CLUSTER_RUNNER_RUNNING) && !r->ready_since)
            r->ready_since = now;
        push_status(s, r, r->status, NULL);
        break;
    case RUNNER_MSG_HEARTBEAT:
        break;
    case RUNNER_MSG_TOKEN:
        if ((e = push(s, SUPERVISOR_TOKEN, r))) {
            memcpy(e->task_id, m.task_id, sizeof e->task_id);
            e->ev.token = m.token;
            e->ev.index = m.index;
        }
        break;
    case RUNNER_MSG_START:
    case RUNNER_MSG_OUTPUT:
    case RUNNER_MSG_SEQ_DONE:
    case RUNNER_MSG_EMBEDDING:
        if (has_task(r, m.task_id) && (e = push(s, SUPERVISOR_OUTPUT, r))) {
            size_t len;
            memcpy(e->task_id, m.task_id, sizeof e->task_id);
            e->line = runner_msg_encode(&m, &len);
            if (e->line)
                e->line[len - 1] = 0; /* without its '\n' */
        }
        break;
    case RUNNER_MSG_DONE:
        drop_task(r, m.task_id);
        push_done(s, r, m.task_id, m.finish, m.n_generated, m.error);
        break;
    default: {
        char why[128];
        snprintf(why, sizeof why, "the runner sent a '%s' message: killed", runner_msg_type_name(m.type));
        kill_runner(r, why);
    }
    }
    runner_msg_clear(&m);
}

static void read_sock(struct supervisor *s, struct sup_runner *r, int64_t now)
{
    for (int round = 0; round < 64 && r->sock >= 0 && !r->sock_eof; round++) {
        int rc = runner_lines_fill(&r->in, r->sock);
        if (rc == RUNNER_LINES_AGAIN)
            return;
        if (rc == RUNNER_LINES_DATA) {
            const char *line;
            size_t len;
            int got;
            while ((got = runner_lines_next(&r->in, &line, &len)) == 1)
                handle_line(s, r, line, len, now);
            if (got < 0) {
                kill_runner(r, "a message line from the runner is too long: killed");
                r->sock_eof = true;
            }
            continue;
        }
        r->sock_eof = true; /* EOF or error: the process should be ending */
        set_kill_at(r, now + s->cfg.stop_timeout_ms * MS, "closed its socket but did not exit: killed");
    }
}

static void read_err(struct sup_runner *r)
{
    char buf[4096];
    for (int round = 0; round < 64 && r->errfd >= 0 && !r->err_eof; round++) {
        ssize_t got = read(r->errfd, buf, sizeof buf);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (got <= 0) {
            r->err_eof = true;
            return;
        }
        for (ssize_t i = 0; i < got; i++) {
            r->tail[r->tail_pos] = buf[i];
            r->tail_pos = (r->tail_pos + 1) % SUPERVISOR_TAIL;
        }
        r->tail_len = r->tail_len + (size_t)got > SUPERVISOR_TAIL ? SUPERVISOR_TAIL : r->tail_len + (size_t)got;
    }
}

/* The stderr tail in order, cleaned for JSON; malloc'd. */
static char *tail_text(const struct sup_runner *r)
{
    char lin[SUPERVISOR_TAIL];
    size_t start = (r->tail_pos + SUPERVISOR_TAIL - r->tail_len) % SUPERVISOR_TAIL;
    for (size_t i = 0; i < r->tail_len; i++)
        lin[i] = r->tail[(start + i) % SUPERVISOR_TAIL];
    size_t skip = 0;
    if (r->tail_len == SUPERVISOR_TAIL) /* start at a line when the ring wrapped */
        while (skip < r->tail_len && lin[skip++] != '\n')
            ;
    if (skip == r->tail_len)
        skip = 0;
    return runner_text_clean(lin + skip, r->tail_len - skip, SUPERVISOR_TAIL);
}

static char *failure_reason(const struct sup_runner *r, int wstatus, bool have_status)
{
    char how[128];
    if (!have_status)
        snprintf(how, sizeof how, "ended (its exit status was taken by another waiter)");
    else if (WIFEXITED(wstatus))
        snprintf(how, sizeof how, "exited with code %d", WEXITSTATUS(wstatus));
    else if (WIFSIGNALED(wstatus))
        snprintf(how, sizeof how, "killed by signal %d (SIG%s)", WTERMSIG(wstatus),
                 sigabbrev_np(WTERMSIG(wstatus)) ? sigabbrev_np(WTERMSIG(wstatus)) : "?");
    else
        snprintf(how, sizeof how, "ended with status %#x", wstatus);
    char *tail = tail_text(r);
    size_t cap = IDS_TEXT_MAX + 1;
    char *text = malloc(cap);
    if (!text) {
        free(tail);
        return NULL;
    }
    snprintf(text, cap, "%.2048s%s%.1024s%s%s%s%s", r->runner_error ? r->runner_error : "",
             r->runner_error ? "; " : "", r->kill_reason ? r->kill_reason : "", r->kill_reason ? "; " : "", how,
             tail && tail[0] ? "\nstderr:\n" : "", tail ? tail : "");
    free(tail);
    char *clean = runner_text_clean(text, strlen(text), IDS_TEXT_MAX);
    free(text);
    return clean;
}

static void close_process(struct sup_runner *r)
{
    close_fd(&r->pidfd);
    close_fd(&r->sock);
    close_fd(&r->node_wr);
    close_fd(&r->errfd);
    r->pid = 0;
}

/* Counts a failure: Failed reported, tasks in flight finished with the error, then a
 * restart planned or, after max_failures in a row, GAVE_UP. */
static void fail_runner(struct supervisor *s, struct sup_runner *r, const char *reason, int64_t now)
{
    const char *why = reason ? reason : "runner failed";
    for (size_t i = 0; i < r->n_tasks; i++)
        push_done(s, r, r->tasks[i], RUNNER_FINISH_ERROR, 0, why);
    r->n_tasks = 0;
    r->failures++;
    r->status = CLUSTER_RUNNER_FAILED;
    push_status(s, r, CLUSTER_RUNNER_FAILED, why);
    if (r->failures >= s->cfg.max_failures) {
        struct qevent *e = push(s, SUPERVISOR_GAVE_UP, r);
        if (e)
            e->error = strdup(why);
        log_warn("supervisor: runner %s of instance %s failed %d times in a row; giving up", r->cfg.runner_id,
                 r->cfg.instance_id, r->failures);
        r->phase = PH_GONE;
        return;
    }
    int64_t delay = s->cfg.backoff_ms;
    for (int i = 1; i < r->failures && delay < s->cfg.backoff_max_ms; i++)
        delay *= 2;
    if (delay > s->cfg.backoff_max_ms)
        delay = s->cfg.backoff_max_ms;
    r->phase = PH_BACKOFF;
    r->restart_at = now + delay * MS;
    log_info("supervisor: runner %s failed (%d in a row), restarting in %lld ms", r->cfg.runner_id, r->failures,
             (long long)delay);
}

/* The process ended: everything it wrote is read, then its end is reported. */
static void finish_process(struct supervisor *s, struct sup_runner *r, int wstatus, bool have_status, int64_t now)
{
    set_nonblock(r->sock);
    read_sock(s, r, now);
    read_err(r);
    close_process(r);
    if (r->want_stop) {
        for (size_t i = 0; i < r->n_tasks; i++)
            push_done(s, r, r->tasks[i], RUNNER_FINISH_CANCELLED, 0, "the runner was stopped");
        r->n_tasks = 0;
        r->status = CLUSTER_RUNNER_SHUTDOWN;
        push_status(s, r, CLUSTER_RUNNER_SHUTDOWN, NULL);
        r->phase = PH_GONE;
        return;
    }
    char *reason = failure_reason(r, wstatus, have_status);
    fail_runner(s, r, reason, now);
    free(reason);
}

static void try_reap(struct supervisor *s, struct sup_runner *r, int64_t now)
{
    if (r->phase != PH_RUNNING || r->pid <= 0)
        return;
    int st = 0;
    pid_t w = waitpid(r->pid, &st, WNOHANG);
    if (w == r->pid)
        finish_process(s, r, st, true, now);
    else if (w < 0 && errno == ECHILD)
        finish_process(s, r, 0, false, now);
}

static void timers(struct supervisor *s, struct sup_runner *r, int64_t now)
{
    if (r->phase == PH_BACKOFF) {
        if (r->want_stop) {
            r->status = CLUSTER_RUNNER_SHUTDOWN;
            push_status(s, r, CLUSTER_RUNNER_SHUTDOWN, NULL);
            r->phase = PH_GONE;
        } else if (now >= r->restart_at) {
            char err[300];
            r->restarts++;
            if (spawn(s, r, err, sizeof err)) {
                log_warn("supervisor: runner %s: %s", r->cfg.runner_id, err);
                fail_runner(s, r, err, now);
            }
        }
        return;
    }
    if (r->phase != PH_RUNNING || r->killed)
        return;
    if (r->kill_at && now >= r->kill_at) {
        kill_runner(r, r->kill_at_why);
        return;
    }
    bool serving = r->status == CLUSTER_RUNNER_READY || r->status == CLUSTER_RUNNER_RUNNING;
    int limit = serving ? s->cfg.heartbeat_timeout_ms : s->cfg.start_timeout_ms;
    if (!r->kill_at && now - r->last_heard > limit * MS) {
        char why[160];
        snprintf(why, sizeof why, "no message for %d ms while %s: killed", limit, cluster_runner_status_name(r->status));
        kill_runner(r, why);
        return;
    }
    if (r->ready_since && r->failures && now - r->ready_since >= s->cfg.stable_ms * MS)
        r->failures = 0;
}

/* Milliseconds until the earliest timer of r (INT64_MAX: none). */
static int64_t next_timer(const struct supervisor *s, const struct sup_runner *r, int64_t now)
{
    int64_t at = INT64_MAX;
    if (r->phase == PH_BACKOFF)
        at = r->want_stop ? now : r->restart_at;
    if (r->phase == PH_RUNNING && !r->killed) {
        if (r->kill_at)
            at = r->kill_at;
        else {
            bool serving = r->status == CLUSTER_RUNNER_READY || r->status == CLUSTER_RUNNER_RUNNING;
            at = r->last_heard + (serving ? s->cfg.heartbeat_timeout_ms : s->cfg.start_timeout_ms) * MS + MS;
        }
        if (r->ready_since && r->failures && r->ready_since + s->cfg.stable_ms * MS < at)
            at = r->ready_since + s->cfg.stable_ms * MS;
    }
    if (r->phase == PH_RUNNING && (r->pidfd < 0 || r->killed) && now + 20 * MS < at)
        at = now + 20 * MS; /* no pidfd (or a kill in flight): look with waitpid */
    if (at == INT64_MAX)
        return at;
    return at <= now ? 0 : (at - now + MS - 1) / MS;
}

/* ---- public ---- */

int supervisor_create(struct supervisor **out, const struct supervisor_config *cfg, supervisor_event_fn fn, void *ctx,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !fn || !cfg->argv || !cfg->argv[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "supervisor: no runner command or event function");
    if (cfg->heartbeat_ms < 10 || cfg->heartbeat_ms > 600000 || cfg->heartbeat_timeout_ms <= cfg->heartbeat_ms ||
        cfg->start_timeout_ms < 1 || cfg->stop_timeout_ms < 1 || cfg->backoff_ms < 0 ||
        cfg->backoff_max_ms < cfg->backoff_ms || cfg->max_failures < 1 || cfg->stable_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "supervisor: timings out of range (heartbeat 10..600000 ms and below its timeout, "
                          "backoff <= its maximum, max_failures >= 1)");
    struct supervisor *s = calloc(1, sizeof *s);
    if (!s)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->fn = fn;
    s->ctx = ctx;
    s->wake[0] = s->wake[1] = -1;
    for (int i = 0; cfg->argv[i]; i++) {
        if (i == SUPERVISOR_MAX_ARGS || !(s->argv[i] = strdup(cfg->argv[i]))) {
            int rc = i == SUPERVISOR_MAX_ARGS ? CAIRN_EINVAL : CAIRN_ENOMEM;
            supervisor_release(s);
            return cairn_fail(err, errlen, rc, "supervisor: runner command has more than %d arguments or no memory",
                              SUPERVISOR_MAX_ARGS);
        }
        s->n_argv++;
    }
    s->cfg.argv = NULL;
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK)) {
        s->wake[0] = s->wake[1] = -1;
        supervisor_release(s);
        return cairn_fail(err, errlen, CAIRN_EIO, "supervisor: pipe: %s", strerror(errno));
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void supervisor_release(struct supervisor *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        struct sup_runner *r = s->runners[i];
        if (r->pid > 0) {
            close_fd(&r->node_wr);
            kill_runner(r, NULL);
            while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        free_runner(r);
    }
    free(s->runners);
    for (size_t i = 0; i < s->nq; i++) {
        free(s->q[i].error);
        free(s->q[i].line);
    }
    free(s->q);
    for (int i = 0; i < s->n_argv; i++)
        free(s->argv[i]);
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
        pthread_mutex_destroy(&s->mu);
    }
    free(s);
}

int supervisor_start(struct supervisor *s, const struct runner_config *cfg, char *err, size_t errlen)
{
    if (!ids_valid_id(cfg->runner_id) || !ids_valid_id(cfg->instance_id))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "invalid runner or instance id");
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    struct sup_runner *r = NULL;
    if (find(s, cfg->runner_id)) {
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "runner %s is already supervised", cfg->runner_id);
        goto out;
    }
    if (array_reserve(&s->runners, &s->cap, s->n + 1, sizeof *s->runners, 8)) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    r = calloc(1, sizeof *r);
    if (r)
        r->tasks = malloc(SUPERVISOR_MAX_TASKS * sizeof *r->tasks);
    if (!r || !r->tasks) {
        free(r);
        r = NULL;
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    r->cfg = *cfg;
    r->cfg.heartbeat_ms = s->cfg.heartbeat_ms;
    if (s->cfg.runner_slots)
        r->cfg.slots = s->cfg.runner_slots;
    if (s->cfg.runner_threads)
        r->cfg.threads = s->cfg.runner_threads;
    if (s->cfg.runner_ctx && !r->cfg.ctx) /* the instance's context, placed for, comes first */
        r->cfg.ctx = s->cfg.runner_ctx;
    r->pidfd = r->sock = r->node_wr = r->errfd = -1;
    if ((rc = spawn(s, r, err, errlen))) {
        free_runner(r);
        r = NULL;
        goto out;
    }
    s->runners[s->n++] = r;
    wake(s);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int supervisor_stop(struct supervisor *s, const char *runner_id)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    int rc = r ? 0 : CAIRN_ENOTFOUND;
    if (r && !r->want_stop) {
        r->want_stop = true;
        if (r->phase == PH_RUNNING) {
            struct runner_msg m = {.type = RUNNER_MSG_SHUTDOWN};
            if (queue_out(r, &m))
                kill_runner(r, NULL); /* no memory to ask politely */
            flush_out(r);
            set_kill_at(r, clock_ns() + s->cfg.stop_timeout_ms * MS, "did not stop in time: killed");
        }
        wake(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int supervisor_set_draft(struct supervisor *s, const char *runner_id, const char *path, int num_draft_tokens)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    int rc = r ? 0 : CAIRN_ENOTFOUND;
    if (r) {
        /* kept in the config, so a restarted runner starts with it */
        snprintf(r->cfg.draft_model_path, sizeof r->cfg.draft_model_path, "%s", path ? path : "");
        r->cfg.num_draft_tokens = num_draft_tokens;
        if (r->phase == PH_RUNNING && !r->want_stop) {
            struct runner_msg m = {.type = RUNNER_MSG_DRAFT};
            m.body = json_pack("{s:s?, s:i}", "model_path", path && path[0] ? path : NULL, "num_draft_tokens",
                               num_draft_tokens);
            rc = m.body ? send_now(s, r, &m) : CAIRN_ENOMEM;
            json_decref(m.body);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int supervisor_set_peers(struct supervisor *s, const char *runner_id, const struct runner_peers *p)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    int rc = !r ? CAIRN_ENOTFOUND : r->phase != PH_RUNNING || r->want_stop ? CAIRN_ESTATE : 0;
    if (!rc) {
        struct runner_msg m = {.type = RUNNER_MSG_PEERS, .peers = *p};
        rc = send_now(s, r, &m);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static bool task_valid(const struct runner_task *t)
{
    if (t->params)
        return ids_valid_id(t->task_id) && json_is_object(t->params);
    if (!ids_valid_id(t->task_id) || !t->tokens || t->n_tokens < 1 || t->n_tokens > RUNNER_MAX_PROMPT ||
        t->max_tokens < 1 || t->max_tokens > RUNNER_MAX_GENERATE)
        return false;
    for (int64_t i = 0; i < t->n_tokens; i++)
        if (t->tokens[i] < 0)
            return false;
    return true;
}

int supervisor_submit(struct supervisor *s, const char *runner_id, const struct runner_task *t, char *err,
                      size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    int rc = 0;
    if (!r)
        rc = cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no runner %s", runner_id);
    else if (r->phase != PH_RUNNING || r->want_stop || r->killed || r->runner_error || r->sock_eof)
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "runner %s is %s", runner_id,
                        r->want_stop ? "stopping" : r->phase == PH_BACKOFF ? "restarting" : "failing");
    else if (has_task(r, t->task_id))
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "task %s is already running on %s", t->task_id, runner_id);
    else if (r->n_tasks == SUPERVISOR_MAX_TASKS)
        rc = cairn_fail(err, errlen, CAIRN_EFULL, "runner %s has %d tasks in flight", runner_id, SUPERVISOR_MAX_TASKS);
    if (!rc && !task_valid(t))
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "invalid task (id, 1..%lld prompt tokens, 1..%lld to generate)",
                        (long long)RUNNER_MAX_PROMPT, (long long)RUNNER_MAX_GENERATE);
    if (!rc) {
        struct runner_msg m = {.type = RUNNER_MSG_TASK, .task = *t};
        rc = queue_out(r, &m);
        if (rc)
            cairn_fail(err, errlen, rc, "out of memory");
        if (!rc) {
            memcpy(r->tasks[r->n_tasks++], t->task_id, sizeof r->tasks[0]);
            flush_out(r);
            if (r->out_len)
                wake(s);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int supervisor_cancel(struct supervisor *s, const char *runner_id, const char *task_id)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    int rc = r && r->phase == PH_RUNNING && has_task(r, task_id) ? 0 : CAIRN_ENOTFOUND;
    if (!rc) {
        struct runner_msg m = {.type = RUNNER_MSG_CANCEL};
        snprintf(m.task_id, sizeof m.task_id, "%s", task_id);
        rc = send_now(s, r, &m);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

size_t supervisor_count(struct supervisor *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->runners[i]->phase != PH_GONE;
    pthread_mutex_unlock(&s->mu);
    return n;
}

pid_t supervisor_pid(struct supervisor *s, const char *runner_id)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    pid_t pid = r && r->phase == PH_RUNNING ? r->pid : 0;
    pthread_mutex_unlock(&s->mu);
    return pid;
}

int supervisor_status(struct supervisor *s, const char *runner_id, enum cluster_runner_status *status,
                      int *restart_count)
{
    pthread_mutex_lock(&s->mu);
    struct sup_runner *r = find(s, runner_id);
    if (r) {
        if (status)
            *status = r->status;
        if (restart_count)
            *restart_count = r->restarts;
    }
    pthread_mutex_unlock(&s->mu);
    return r ? 0 : CAIRN_ENOTFOUND;
}

enum { SLOT_SOCK, SLOT_ERR, SLOT_PIDFD, SLOTS };

int supervisor_poll(struct supervisor *s, int timeout_ms)
{
    pthread_mutex_lock(&s->mu);
    int64_t now = clock_ns();
    size_t nfds = 1 + SLOTS * s->n;
    struct pollfd *pf = calloc(nfds, sizeof *pf);
    struct sup_runner **owner = calloc(s->n + 1, sizeof *owner);
    size_t n_owned = s->n;
    int64_t wait = timeout_ms < 0 ? INT64_MAX : timeout_ms;
    if (!pf || !owner) {
        free(pf);
        free(owner);
        pthread_mutex_unlock(&s->mu);
        return CAIRN_ENOMEM;
    }
    pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    for (size_t i = 0; i < s->n; i++) {
        struct sup_runner *r = s->runners[i];
        owner[i] = r;
        struct pollfd *p = &pf[1 + SLOTS * i];
        for (int k = 0; k < SLOTS; k++)
            p[k].fd = -1;
        if (r->phase == PH_RUNNING) {
            if (r->sock >= 0 && !r->sock_eof)
                p[SLOT_SOCK] = (struct pollfd){.fd = r->sock, .events = POLLIN | (r->out_len ? POLLOUT : 0)};
            if (r->errfd >= 0 && !r->err_eof)
                p[SLOT_ERR] = (struct pollfd){.fd = r->errfd, .events = POLLIN};
            if (r->pidfd >= 0)
                p[SLOT_PIDFD] = (struct pollfd){.fd = r->pidfd, .events = POLLIN};
        }
        int64_t t = next_timer(s, r, now);
        if (t < wait)
            wait = t;
    }
    pthread_mutex_unlock(&s->mu);

    int got = poll(pf, nfds, wait > INT32_MAX ? -1 : (int)wait);
    int poll_errno = errno;

    pthread_mutex_lock(&s->mu);
    now = clock_ns();
    if (got > 0 && (pf[0].revents & POLLIN)) {
        char buf[64];
        while (read(s->wake[0], buf, sizeof buf) > 0)
            ;
    }
    for (size_t i = 0; got > 0 && i < n_owned; i++) {
        struct sup_runner *r = owner[i];
        struct pollfd *p = &pf[1 + SLOTS * i];
        if (r->phase != PH_RUNNING)
            continue;
        if (p[SLOT_ERR].revents && r->errfd == p[SLOT_ERR].fd)
            read_err(r);
        if (p[SLOT_SOCK].revents && r->sock == p[SLOT_SOCK].fd) {
            if (p[SLOT_SOCK].revents & POLLOUT)
                flush_out(r);
            if (p[SLOT_SOCK].revents & (POLLIN | POLLHUP | POLLERR))
                read_sock(s, r, now);
        }
        if (p[SLOT_PIDFD].revents && r->pidfd == p[SLOT_PIDFD].fd)
            try_reap(s, r, now);
    }
    for (size_t i = 0; i < s->n; i++) {
        struct sup_runner *r = s->runners[i];
        if (r->phase == PH_RUNNING && (r->pidfd < 0 || r->killed || r->sock_eof))
            try_reap(s, r, now);
        timers(s, r, now);
        if (r->phase == PH_RUNNING)
            flush_out(r);
    }
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->runners[i]->phase == PH_GONE)
            free_runner(s->runners[i]);
        else
            s->runners[kept++] = s->runners[i];
    }
    s->n = kept;
    struct qevent *q = s->q;
    size_t nq = s->nq;
    s->q = NULL;
    s->nq = s->capq = 0;
    pthread_mutex_unlock(&s->mu);
    free(pf);
    free(owner);

    for (size_t i = 0; i < nq; i++) {
        struct qevent *e = &q[i];
        e->ev.runner_id = e->runner_id;
        e->ev.instance_id = e->instance_id;
        e->ev.task_id = e->task_id[0] ? e->task_id : NULL;
        e->ev.error = e->error;
        e->ev.line = e->line;
        s->fn(s->ctx, &e->ev);
        free(e->error);
        free(e->line);
    }
    free(q);
    if (got < 0 && poll_errno != EINTR)
        return CAIRN_EIO;
    return (int)nq;
}
