/* Runner supervisor, inside the node process: starts one `cairn runner` process per
 * (instance, node) with posix_spawn, reads its status lines, forwards tasks to it and
 * streams its tokens back, kills one that stops answering, reaps children without
 * blocking (a pidfd per child, polled with the sockets), keeps the last 4 KiB of each
 * runner's stderr for the reason of a failure, restarts a crashed runner with
 * exponential backoff and gives up after max_failures consecutive failures.
 * The protocol and the spawn contract are in runner_proto.h.
 *
 * Descriptors: the runner gets exactly fds 0 (/dev/null), 1 and 2 (the stderr pipe),
 * 3 (socket) and 4 (node pipe); every other descriptor of the node is closed in the
 * child before exec (posix_spawn_file_actions_addclosefrom_np), whatever its
 * close-on-exec flag, so no listening socket leaks into a runner. Descriptors the
 * supervisor keeps are close-on-exec. Each runner leads its own process group (a
 * terminal's Ctrl-C reaches the node, which stops its runners), and a kill goes to the
 * whole group.
 *
 * Events (status changes, tokens, finished tasks, giving up) are delivered by calling
 * the event function from inside supervisor_poll, with no internal lock held: the
 * function may call any supervisor function. A runner's own Failed report is not
 * passed on as it comes: the supervisor waits for the process to end and reports one
 * Failed whose error joins the runner's reason, how it ended and its stderr tail.
 * Shutdown is reported once the process is reaped.
 *
 * Threads: supervisor_poll is called by one thread at a time (the node's worker loop);
 * the other functions may be called from any thread, and wake a poll in progress. */
#ifndef CAIRN_NODE_SUPERVISOR_H
#define CAIRN_NODE_SUPERVISOR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/runner_proto.h"
#include "ctl/state.h"

#define SUPERVISOR_MAX_ARGS 16   /* leading arguments of the runner command */
#define SUPERVISOR_TAIL 4096     /* bytes of stderr kept per runner */
#define SUPERVISOR_MAX_TASKS 256 /* tasks in flight per runner */

struct supervisor_config {
    /* Program and leading arguments (NULL-terminated, copied), e.g.
     * {"/proc/self/exe", "runner", NULL}; "--config" and the config JSON are appended. */
    const char *const *argv;
    int heartbeat_ms;         /* passed to runners as config.heartbeat_ms (1000) */
    int heartbeat_timeout_ms; /* a Ready or Running runner silent this long is killed (30000) */
    int start_timeout_ms;     /* silent this long before Ready: killed (600000; loading is one call) */
    int stop_timeout_ms;      /* a runner asked to stop, or that reported Failed, is killed
                                 when still alive after this long (10000) */
    int backoff_ms;           /* first restart delay, doubled per consecutive failure (1000) */
    int backoff_max_ms;       /* (30000) */
    int max_failures;         /* consecutive failures before giving up (5) */
    int stable_ms;            /* Ready for this long resets the failure count (60000) */
    /* Given to every runner instead of the plan's values when not 0 (cairn node
     * --parallel, --threads, --ctx-size). */
    int runner_slots, runner_threads;
    int64_t runner_ctx;
};

enum supervisor_event_kind {
    SUPERVISOR_STATUS,  /* a runner's status changed (also Failed and Shutdown, see above) */
    SUPERVISOR_TOKEN,   /* a generated token of a task */
    SUPERVISOR_DONE,    /* a task finished (also with error when its runner failed) */
    SUPERVISOR_GAVE_UP, /* the runner failed max_failures times in a row and is removed */
    SUPERVISOR_OUTPUT,  /* a start, output or seq_done message of a task in flight */
};

/* Strings are valid only during the call. */
struct supervisor_event {
    enum supervisor_event_kind kind;
    const char *runner_id, *instance_id;
    enum cluster_runner_status status; /* STATUS */
    const char *error;                 /* STATUS Failed, DONE with an error, GAVE_UP; else NULL */
    int restart_count;                 /* STATUS, GAVE_UP: restarts of this runner so far */
    pid_t pid;                         /* STATUS: the process reporting (0 after it ended) */
    int data_port;                     /* STATUS: its data-plane port (pipelined), 0 = none */
    const char *task_id;               /* TOKEN, DONE */
    int32_t token;                     /* TOKEN */
    int64_t index;                     /* TOKEN: position in the generated text, from 0 */
    enum runner_finish finish;         /* DONE */
    int64_t n_generated;               /* DONE */
    const char *line;                  /* OUTPUT: the message as one JSON line (no '\n'); NULL
                                          when it could not be encoded */
};

typedef void (*supervisor_event_fn)(void *ctx, const struct supervisor_event *ev);

struct supervisor;

/* Fills the defaults given above (argv NULL: the caller must set it). */
void supervisor_config_defaults(struct supervisor_config *c);

/* Creates a supervisor (caller-owned). fn (not NULL) receives every event with ctx.
 * CAIRN_EINVAL for a config without argv or with a value out of range. */
int supervisor_create(struct supervisor **out, const struct supervisor_config *cfg, supervisor_event_fn fn,
                      void *ctx, char *err, size_t errlen);

/* Kills every runner (SIGKILL to its group), reaps it and frees everything; no events.
 * Accepts NULL. For a graceful end, supervisor_stop each runner and poll until
 * supervisor_count() is 0 (or a deadline) first. */
void supervisor_release(struct supervisor *s);

/* Starts a runner for cfg (copied; cfg->runner_id names it from now on, cfg->heartbeat_ms
 * is replaced by the supervisor's). CAIRN_ESTATE when that runner id is already
 * supervised, CAIRN_EIO when the process cannot be started (err says why), CAIRN_ENOMEM. */
int supervisor_start(struct supervisor *s, const struct runner_config *cfg, char *err, size_t errlen);

/* Asks a runner to shut down (killed after stop_timeout_ms); a runner waiting to be
 * restarted is dropped. Shutdown is reported when it is gone, then the id is free again.
 * CAIRN_ENOTFOUND for an unknown id. */
int supervisor_stop(struct supervisor *s, const char *runner_id);

/* Sends a task to a runner, which runs its tasks one at a time in order. The runner must
 * be started (any status from Idle on; tasks sent before Ready wait in the socket) and
 * not stopping. CAIRN_ENOTFOUND for an unknown id, CAIRN_ESTATE when it is restarting or
 * stopping or the task id is already in flight on it, CAIRN_EFULL beyond
 * SUPERVISOR_MAX_TASKS, CAIRN_EINVAL for an invalid task, CAIRN_ENOMEM. */
int supervisor_submit(struct supervisor *s, const char *runner_id, const struct runner_task *t, char *err,
                      size_t errlen);

/* Sets the draft model of a runner (path NULL or "": none): sent to it now when it runs,
 * and given to it when it restarts. CAIRN_ENOTFOUND for an unknown id, CAIRN_ENOMEM. */
int supervisor_set_draft(struct supervisor *s, const char *runner_id, const char *path, int num_draft_tokens);

/* Tells a running pipelined runner where its next rank listens (a "peers" message; a
 * restarted runner needs it again). CAIRN_ENOTFOUND for an unknown id, CAIRN_ESTATE
 * when its process is not running, CAIRN_ENOMEM. */
int supervisor_set_peers(struct supervisor *s, const char *runner_id, const struct runner_peers *p);

/* Asks a runner to cancel a task (finished with RUNNER_FINISH_CANCELLED). CAIRN_ENOTFOUND
 * when the runner or the task in flight is unknown. */
int supervisor_cancel(struct supervisor *s, const char *runner_id, const char *task_id);

/* Waits up to timeout_ms (0: no wait, -1: until something happens) for runner I/O or a
 * timer, handles it and delivers the events. Returns the number of events delivered, or
 * CAIRN_EIO when poll() itself fails. */
int supervisor_poll(struct supervisor *s, int timeout_ms);

/* Makes a supervisor_poll in progress (or the next one) return at once. Any thread. */
void supervisor_wake(struct supervisor *s);

/* Runners supervised (running, restarting or stopping). */
size_t supervisor_count(struct supervisor *s);

/* Process id of a runner, 0 when it has none now (restarting) or the id is unknown. */
pid_t supervisor_pid(struct supervisor *s, const char *runner_id);

/* Last status of a runner and its restarts so far; CAIRN_ENOTFOUND for an unknown id. */
int supervisor_status(struct supervisor *s, const char *runner_id, enum cluster_runner_status *status,
                      int *restart_count);

#endif
