/* Request bodies on their way to a runner (DESIGN.md, "Control plane"): the prompt,
 * messages and tools of a task never enter the replicated state or the event log. The
 * node whose API holds a request sends {"task_id", "params": textgen.h's object} straight
 * to the node of the instance's first rank (node_send_task_body), then asks the master for
 * the task (TextGeneration, with the body's size only). Both travel separately, so either
 * may come first; this store holds bodies until the worker, seeing the task Pending,
 * takes its body, and only when it came from the node that the task names as its
 * requester (a peer cannot put words in another node's request).
 *
 * Bounded: at most TASKBODY_MAX bodies and TASKBODY_MAX_BYTES of JSON; a body nobody
 * takes within TASKBODY_TTL_MS is dropped. Thread-safe. */
#ifndef CAIRN_NODE_TASKBODY_H
#define CAIRN_NODE_TASKBODY_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define TASKBODY_MAX 1024
#define TASKBODY_MAX_BYTES ((size_t)256 << 20)
#define TASKBODY_TTL_MS 60000
#define TASKBODY_WAIT_MS 10000 /* a Pending task whose body is not here this long fails */

struct taskbody_store;

struct taskbody_store *taskbody_create(void);
void taskbody_release(struct taskbody_store *s);

/* The message a requester sends: compact JSON {"task_id", "params"}, malloc'd into *out
 * (*len bytes, no NUL counted); *params_bytes gets the size of params alone (what the
 * TextGeneration command carries). CAIRN_ERANGE when params is over CLUSTER_MAX_PARAMS
 * bytes, CAIRN_ENOMEM. */
int taskbody_encode(const char *task_id, const json_t *params, char **out, size_t *len, int64_t *params_bytes,
                    char *err, size_t errlen);

/* Files a body that node `from` sent at now_ms. CAIRN_EFORMAT for anything but a valid
 * message (not JSON, other members, a bad task id, params not an object or too big),
 * CAIRN_ESTATE when a body of that task is already held, CAIRN_EFULL past the bounds;
 * err says which. Expired bodies are dropped first. */
int taskbody_put(struct taskbody_store *s, const char *from, const char *msg, size_t len, int64_t now_ms,
                 char *err, size_t errlen);

/* Takes the body that node requester sent for task_id into *params (a new reference, the
 * caller's): 0. CAIRN_ENOTFOUND when none is held; CAIRN_EINVAL when there is none from
 * requester but one from another node (that one is dropped, and err names its sender). */
int taskbody_take(struct taskbody_store *s, const char *task_id, const char *requester, json_t **params,
                  char *err, size_t errlen);

/* Bodies held now (for tests and figures). */
size_t taskbody_count(struct taskbody_store *s);

#endif
