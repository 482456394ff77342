/* Events: past-tense facts, numbered (term, index) by the master and applied in order by
 * every node (cluster_apply). They arrive from the network and from disk, so decoding
 * checks every field and names the one it refuses.
 *
 * JSON: one flat object {"kind", "term", "index", <fields of the kind>}; every field is
 * required (nullable ones as null) and unknown fields are refused. term is
 * 1..IDS_COUNTER_MAX, index 0..IDS_COUNTER_MAX. Fields by kind:
 *   NodeGatheredInfo          node_id, when_ms, info (node info, see state.h)
 *   NodeTimedOut              node_id
 *   TopologyEdgeCreated       from, to, rtt_us, throughput_bytes_per_s
 *   TopologyEdgeDeleted       from, to
 *   InstanceCreated           instance (instance, see state.h)
 *   InstanceDeleted           instance_id
 *   InstanceDraftModelUpdated instance_id, draft_model (model id|null), num_draft_tokens
 *   RunnerStatusUpdated       runner_id, instance_id, node_id, status, error, restart_count
 *   RunnerDeleted             runner_id
 *   NodeDownloadProgress      node_id, model_id, bytes_done, bytes_total, status, error
 *   TaskCreated               task_id, task_kind, instance_id, node_id, bytes (of the request body)
 *   TaskStatusUpdated         task_id, status, error (text|null, only with Failed)
 *   TaskAcknowledged          task_id
 *   TaskDeleted               task_id
 *   MasterElected             node_id (the election term is the event's term)
 *   InstanceEpochAdvanced     instance_id, epoch (1..IDS_COUNTER_MAX)
 *   StateSnapshot             state (whole state, see state.h) */
#ifndef CAIRN_CTL_EVENT_H
#define CAIRN_CTL_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/state.h"

enum event_kind {
    EVENT_NODE_GATHERED_INFO,
    EVENT_NODE_TIMED_OUT,
    EVENT_TOPOLOGY_EDGE_CREATED,
    EVENT_TOPOLOGY_EDGE_DELETED,
    EVENT_INSTANCE_CREATED,
    EVENT_INSTANCE_DELETED,
    EVENT_INSTANCE_DRAFT_MODEL_UPDATED,
    EVENT_RUNNER_STATUS_UPDATED,
    EVENT_RUNNER_DELETED,
    EVENT_NODE_DOWNLOAD_PROGRESS,
    EVENT_TASK_CREATED,
    EVENT_TASK_STATUS_UPDATED,
    EVENT_TASK_ACKNOWLEDGED,
    EVENT_TASK_DELETED,
    EVENT_MASTER_ELECTED,
    EVENT_INSTANCE_EPOCH_ADVANCED,
    EVENT_STATE_SNAPSHOT,
    EVENT_KIND_COUNT
};

/* One event. The member of the union named after the kind holds its fields; heap parts
 * (node info interfaces, instance shards, error texts, task params, the snapshot) are
 * owned by the event and freed by event_clear. */
struct event {
    enum event_kind kind;
    int64_t term, index;
    union {
        struct {
            char node_id[IDS_ID_MAX + 1];
            int64_t when_ms; /* Unix ms, stamped by the master */
            struct cluster_node_info info;
        } node_gathered_info;
        struct {
            char node_id[IDS_ID_MAX + 1];
        } node_timed_out;
        struct cluster_edge topology_edge_created;
        struct {
            char from[IDS_ID_MAX + 1], to[IDS_ID_MAX + 1];
        } topology_edge_deleted;
        struct cluster_instance instance_created;
        struct {
            char instance_id[IDS_ID_MAX + 1];
        } instance_deleted;
        struct {
            char instance_id[IDS_ID_MAX + 1];
            char draft_model[IDS_MODEL_MAX + 1]; /* "" = none */
            int num_draft_tokens;
        } instance_draft_model_updated;
        struct cluster_runner runner_status_updated;
        struct {
            char runner_id[IDS_ID_MAX + 1];
        } runner_deleted;
        struct cluster_download node_download_progress;
        struct {
            char task_id[IDS_ID_MAX + 1];
            enum cluster_task_kind kind;
            char instance_id[IDS_ID_MAX + 1], node_id[IDS_ID_MAX + 1];
            int64_t bytes; /* of the request body (never in the log: DESIGN.md) */
        } task_created;
        struct {
            char task_id[IDS_ID_MAX + 1];
            enum cluster_task_status status;
            char *error; /* malloc'd or NULL; only with Failed */
        } task_status_updated;
        struct {
            char task_id[IDS_ID_MAX + 1];
        } task_acknowledged;
        struct {
            char task_id[IDS_ID_MAX + 1];
        } task_deleted;
        struct {
            char node_id[IDS_ID_MAX + 1];
        } master_elected;
        struct {
            struct cluster_state *state; /* owned */
        } state_snapshot;
        struct {
            char instance_id[IDS_ID_MAX + 1];
            int64_t epoch;
        } instance_epoch_advanced;
    };
};

/* Static JSON name of a kind ("NodeGatheredInfo" ...), NULL when out of range. */
const char *event_kind_name(int kind);

/* Zeroes *e and sets its kind and position. */
void event_init(struct event *e, enum event_kind kind, int64_t term, int64_t index);

/* Frees what e owns and zeroes it; accepts a zeroed event. */
void event_clear(struct event *e);

/* Makes dst (overwritten, not freed) an independent deep copy of src; CAIRN_ENOMEM
 * leaves dst zeroed. */
int event_copy(struct event *dst, const struct event *src);

/* New JSON object of e; NULL when out of memory or when a string is not UTF-8. */
json_t *event_to_jsonv(const struct event *e);

/* e as compact JSON text with sorted keys, malloc'd (free()); NULL as event_to_jsonv. */
char *event_to_json(const struct event *e);

/* Checks every field of j and fills *out (caller clears it with event_clear). Returns
 * CAIRN_EFORMAT naming the field ("InstanceCreated.instance.shards[1].rank: ...") or
 * CAIRN_ENOMEM; *out is zeroed on failure. */
int event_from_jsonv(const json_t *j, struct event *out, char *err, size_t errlen);

/* As event_from_jsonv, from len bytes of JSON text (duplicate keys refused). */
int event_from_json(const char *text, size_t len, struct event *out, char *err, size_t errlen);

/* Checks an event built in C by the rules event_from_json applies (through its JSON), so
 * the master refuses what other nodes would refuse. 0 or CAIRN_EFORMAT/CAIRN_ENOMEM. */
int event_validate(const struct event *e, char *err, size_t errlen);

/* Applies e to s: pure and deterministic (no clock, no randomness; times come inside
 * events). Position rules, checked first: term >= 1 and index >= 0; an event of an
 * older term than s's is refused; within s's term the index must be s's + 1; a newer
 * term must start with a StateSnapshot (any index). A StateSnapshot is also taken
 * within s's term at any later index (catching up behind a compacted log). Refusals
 * return CAIRN_ESTATE (CAIRN_EINVAL for an impossible position, CAIRN_ENOMEM when out
 * of memory) with s unchanged; on success s's position becomes (e->term, e->index).
 * Effects, by kind:
 *   NodeGatheredInfo   adds or replaces the node; last_seen_ms = when_ms
 *   NodeTimedOut       removes the node, its edges (both ways), its downloads, the
 *                      instances with a shard on it, the runners on it and those of the
 *                      removed instances; Pending/Running tasks of those instances
 *                      become Failed ("node <id> timed out")
 *   TopologyEdge*      adds/replaces or removes the edge from -> to
 *   InstanceCreated    adds or replaces the instance
 *   InstanceDeleted    removes it; its runners and tasks stay (workers report their
 *                      runners ShuttingDown/Shutdown; the master settles the tasks)
 *   InstanceDraftModelUpdated  sets draft_model and num_draft_tokens (unknown: no-op)
 *   RunnerStatusUpdated  Shutdown removes the runner; otherwise adds or replaces it
 *                      (workers report their own runners, which rebuilds a new master's
 *                      state)
 *   RunnerDeleted      removes the runner
 *   NodeDownloadProgress  adds or replaces the (node_id, model_id) download
 *   TaskCreated        adds or replaces the task: Pending, not acknowledged, no error
 *   TaskStatusUpdated  sets status and error (unknown task: no-op)
 *   TaskAcknowledged   sets acknowledged (unknown task: no-op)
 *   TaskDeleted        removes the task
 *   MasterElected      master_node_id = node_id, master_term = the event's term
 *   InstanceEpochAdvanced  sets the instance's epoch when the event's is higher (unknown
 *                      instance or an epoch not above its own: no-op), so epochs only grow
 *   StateSnapshot      replaces everything with a copy of the snapshot's state
 * Removing what is absent is a no-op. e must be valid (from event_from_json, or
 * checked with event_validate before the master logs it). */
int cluster_apply(struct cluster_state *s, const struct event *e, char *err, size_t errlen);

#endif
