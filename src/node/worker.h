/* The node's worker: a thread that keeps this node's runner processes in line with the
 * cluster state. After each event the node applies (and every WORKER_REPLAN_MS) it
 * copies the state, asks plan_compute what to do and starts or stops runners through
 * its supervisor; the supervisor's status events become the runners this node reports
 * (worker_runners_json is the node's `runners` hook), so the master emits
 * RunnerStatusUpdated / RunnerDeleted. A runner the supervisor gave up on, or whose
 * model file is unknown here, is reported Failed until its instance leaves this node;
 * a stopped runner is dropped once its process is gone. When the supervisor gives up
 * on a runner (max_failures in a row) the worker sends DeleteInstance for its instance.
 * Each runner is reported with the epoch of its instance it was started for; when the
 * instance moves to a new epoch (a rank failed) the plan stops it and starts it again,
 * its tasks in flight end with an error, and a pipelined runner is told where its next
 * rank listens only when both are of the instance's epoch. A runner id keeps its restart
 * count and its failures in a row across epochs: its next process waits for the
 * supervisor's backoff of those failures, and at max_failures in a row (none reset by
 * stable_ms Ready) the worker sends DeleteInstance, as when the supervisor gives up.
 *
 * Use: worker_create, then node_create with .runners = worker_runners_json and
 * .runners_ctx = the worker, node_start, worker_start(w, node). To end: worker_stop
 * (stops every runner gracefully, bounded), node_release, worker_release. */
#ifndef CAIRN_NODE_WORKER_H
#define CAIRN_NODE_WORKER_H

#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

#include "node/node.h"
#include "node/supervisor.h"

#define WORKER_REPLAN_MS 1000    /* plan at least this often */
#define WORKER_POLL_MS 50        /* a failed plan is tried again after this; stop's poll */
#define WORKER_STOP_WAIT_MS 8000 /* worker_stop waits this long for runners to end */
#define WORKER_COMMAND_MS 5000   /* wait for the master's answer to a DeleteInstance */

struct worker;

/* Creates a worker whose supervisor runs sup (argv required: the runner command, e.g.
 * {"/proc/self/exe", "runner", NULL}). Caller-owned. CAIRN_EINVAL for a bad config. */
int worker_create(struct worker **out, const struct supervisor_config *sup, char *err, size_t errlen);

/* Starts the worker thread for node n (which must outlive worker_stop). CAIRN_ESTATE
 * when already started, CAIRN_EIO when no thread can be made. */
int worker_start(struct worker *w, struct node *n, char *err, size_t errlen);

/* Stops the thread: asks every runner to shut down, waits up to WORKER_STOP_WAIT_MS,
 * then kills what is left. Idempotent. */
void worker_stop(struct worker *w);

/* Stops and frees; accepts NULL. */
void worker_release(struct worker *w);

/* node_runners_fn: a new JSON array of the runners this node holds (ctx: the worker);
 * NULL before worker_start or when out of memory. Any thread. A runner that failed
 * since the last call is listed as Failed (with that failure's error) even if it has
 * restarted since: each failure reaches the master once, whatever the report rate. */
json_t *worker_runners_json(void *ctx);

/* Process id of a runner, 0 when it has none or is unknown. Any thread. */
pid_t worker_runner_pid(struct worker *w, const char *runner_id);

/* Runners held now (any status). Any thread. */
size_t worker_count(struct worker *w);

#endif
