/* The cluster's shared state: nodes, links between them, model instances, runners,
 * tasks, downloads, the elected master and the position (term, index) of the last
 * event applied. Every node holds one, changed only by cluster_apply (apply.c) or
 * replaced by a snapshot, so nodes that applied the same events hold equal states and
 * serialize them to byte-identical JSON.
 *
 * The struct is public so that place, plan and the API can read it; treat it as
 * read-only outside apply.c. Each table is an array sorted by its key (edges by
 * (from, to), downloads by (node_id, model_id), the others by id), so iteration order
 * is the same on every node. Strings of ids are fixed arrays; "" stands for none.
 *
 * JSON (keys sorted, compact; maps are keyed by the element's own id):
 *   {"last_applied": {"term", "index"}, "master": {"node_id": id|null, "term"},
 *    "nodes": {id: node}, "edges": [edge], "instances": {id: instance},
 *    "runners": {id: runner}, "tasks": {id: task}, "downloads": [download]}
 * with the element objects written by the *_to_json functions below. */
#ifndef CAIRN_CTL_STATE_H
#define CAIRN_CTL_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/ids.h"
#include "proto/status.h"

#define CLUSTER_MAX_IFACES 64       /* network interfaces per node */
#define CLUSTER_MAX_ADDRS 64        /* addresses per interface */
#define CLUSTER_MAX_LAYERS 65536
#define CLUSTER_MAX_PARAMS ((size_t)1 << 20) /* bytes of a task's params as compact JSON */

enum cluster_sharding {
    CLUSTER_SHARDING_PIPELINE,
    CLUSTER_SHARDING_TENSOR,
    CLUSTER_SHARDING_COUNT
};

enum cluster_task_kind { CLUSTER_TASK_TEXT_GENERATION, CLUSTER_TASK_KIND_COUNT };

enum cluster_task_status {
    CLUSTER_TASK_PENDING,
    CLUSTER_TASK_RUNNING,
    CLUSTER_TASK_COMPLETE,
    CLUSTER_TASK_FAILED,
    CLUSTER_TASK_CANCELLED,
    CLUSTER_TASK_STATUS_COUNT
};

enum cluster_download_status {
    CLUSTER_DOWNLOAD_PENDING,
    CLUSTER_DOWNLOAD_ONGOING,
    CLUSTER_DOWNLOAD_COMPLETED,
    CLUSTER_DOWNLOAD_FAILED,
    CLUSTER_DOWNLOAD_STATUS_COUNT
};

/* JSON {"name", "loopback", "addresses": [string]}. */
struct cluster_iface {
    char name[IDS_IFNAME_MAX + 1];
    bool loopback;
    char (*addrs)[IDS_ADDR_MAX + 1]; /* n_addrs entries, malloc'd */
    size_t n_addrs;
};

/* JSON {"memory_total_bytes", "memory_available_bytes", "disk_free_bytes",
 * "disk_total_bytes", "cpu_model", "cpu_cores", "isa", "os", "hostname",
 * "interfaces": [iface], "api_port", "cluster_port", "memory_bandwidth_bytes_per_s" (left
 * out when not measured)}: the object of nodeinfo_to_json
 * (nodeinfo.h) plus the two ports. */
struct cluster_node_info {
    int64_t memory_total, memory_available; /* bytes, 0..IDS_BYTES_MAX */
    int64_t disk_free, disk_total;          /* bytes on the models dir's file system */
    char cpu_model[IDS_NAME_MAX + 1];
    int cpu_cores;                          /* 0..65536 */
    int64_t memory_bandwidth;               /* bytes/s its threads read memory at; 0 = not measured */
    char isa[IDS_NAME_MAX + 1];             /* e.g. "avx2 f16c fma" */
    char os[IDS_NAME_MAX + 1];
    char hostname[IDS_NAME_MAX + 1];
    struct cluster_iface *ifaces;           /* n_ifaces entries, malloc'd */
    size_t n_ifaces;
    int api_port, cluster_port;             /* 0..65535; 0 = not serving */
};

/* JSON {"node_id", "last_seen_ms", "info": node_info}. */
struct cluster_node {
    char id[IDS_ID_MAX + 1];
    int64_t last_seen_ms; /* Unix ms from the latest NodeGatheredInfo */
    struct cluster_node_info info;
};

/* JSON {"from", "to", "rtt_us", "throughput_bytes_per_s"}; directed, from != to. */
struct cluster_edge {
    char from[IDS_ID_MAX + 1], to[IDS_ID_MAX + 1];
    int64_t rtt_us;     /* 0..UINT32_MAX */
    int64_t throughput; /* bytes per second, 0..IDS_BYTES_MAX */
};

/* JSON {"node_id", "runner_id", "rank", "world_size", "layer_begin", "layer_end"}. */
struct cluster_shard {
    char node_id[IDS_ID_MAX + 1], runner_id[IDS_ID_MAX + 1];
    int rank, world_size;       /* 0 <= rank < world_size == the instance's n_shards */
    int layer_begin, layer_end; /* [begin, end), 0 <= begin < end <= CLUSTER_MAX_LAYERS */
};

#define CLUSTER_MAX_CTX ((int64_t)1 << 24) /* positions per sequence */
#define CLUSTER_KV_TYPE_MAX 7            /* bytes of a KV cache type's name ("q8_0") */

/* The KV cache an instance asks of its runners: positions per sequence and the element
 * types of K and V. JSON members of the instance (and of PlaceInstance), each left out
 * when it has its default: "ctx_len" (1..CLUSTER_MAX_CTX; 0 = not said: the runner's
 * default), "cache_type_k", "cache_type_v" ("f32"|"q8_0"|"q4_0"; "" = f16). */
struct cluster_kv {
    int64_t ctx_len;
    char type_k[CLUSTER_KV_TYPE_MAX + 1], type_v[CLUSTER_KV_TYPE_MAX + 1];
};

/* JSON {"instance_id", "model_id", "sharding": "pipeline"|"tensor", "shards": [shard]
 * (rank order), "draft_model": model id|null, "num_draft_tokens", "epoch"} and the
 * members of cluster_kv. Ranks are 0..n-1 and node ids and runner ids are distinct
 * within an instance. */
struct cluster_instance {
    char id[IDS_ID_MAX + 1];
    char model_id[IDS_MODEL_MAX + 1];
    enum cluster_sharding sharding;
    struct cluster_shard *shards; /* n_shards entries in rank order, malloc'd */
    size_t n_shards;              /* 1..CLUSTER_MAX_SHARDS */
    char draft_model[IDS_MODEL_MAX + 1]; /* "" = none */
    int num_draft_tokens;         /* 0..CLUSTER_MAX_DRAFT_TOKENS */
    int64_t epoch;                /* set by the master; raised (InstanceEpochAdvanced) when a
                                     rank fails, so every rank restarts and links anew */
    struct cluster_kv kv;
};

/* JSON {"runner_id", "instance_id", "node_id", "status", "error": text|null,
 * "restart_count", "data_port", "epoch"}; error only with status Failed; data_port (left
 * out when 0) is where a pipelined runner's data plane listens on its node; epoch (left
 * out when 0) is the instance's epoch its process was started with: one below the
 * instance's is a runner of an older ring, being replaced. */
struct cluster_runner {
    char id[IDS_ID_MAX + 1];
    char instance_id[IDS_ID_MAX + 1], node_id[IDS_ID_MAX + 1];
    enum cluster_runner_status status;
    char *error;       /* malloc'd, NULL unless Failed (may be NULL then too) */
    int restart_count; /* 0..1000000 */
    int data_port;     /* 0..65535, 0 = none */
    int64_t epoch;     /* 0..IDS_COUNTER_MAX, 0 = not said */
};

/* JSON {"task_id", "kind", "instance_id", "node_id", "status", "acknowledged",
 * "error": text|null, "bytes"}. node_id is the node whose API holds the request; the
 * request itself (prompt, messages, tools) is never in the state or the log: that node
 * sends it straight to the node of the instance's first rank (node/taskbody.h), and bytes
 * says how big it is. */
struct cluster_task {
    char id[IDS_ID_MAX + 1];
    enum cluster_task_kind kind;
    char instance_id[IDS_ID_MAX + 1], node_id[IDS_ID_MAX + 1];
    enum cluster_task_status status;
    bool acknowledged;
    char *error;    /* malloc'd, NULL unless Failed (may be NULL then too) */
    int64_t bytes;  /* of the request body, 1..CLUSTER_MAX_PARAMS */
};

/* JSON {"node_id", "model_id", "bytes_done", "bytes_total", "bytes_per_s", "eta_s",
 * "status", "error"}; bytes_done <= bytes_total; error only with status Failed. eta_s is
 * derived (the bytes left at the rate, while Ongoing with a rate; else null) and ignored
 * when read; bytes_per_s is optional when read (0: not known). */
struct cluster_download {
    char node_id[IDS_ID_MAX + 1];
    char model_id[IDS_MODEL_MAX + 1];
    int64_t bytes_done, bytes_total; /* 0..IDS_BYTES_MAX */
    int64_t bytes_per_s;             /* lately, while Ongoing; 0: not known */
    enum cluster_download_status status;
    char *error; /* malloc'd, NULL unless Failed (may be NULL then too) */
    int layer_begin, layer_end; /* a pipeline rank's share only ("layers": [begin, end)): the
                                   bytes are those its layers read; 0, 0 (no "layers"): the
                                   whole model */
};

struct cluster_state {
    int64_t last_term, last_index;      /* last event applied; (0, 0) before any */
    char master_node_id[IDS_ID_MAX + 1]; /* "" before any MasterElected */
    int64_t master_term;                /* term of that election */
    struct cluster_node *nodes;
    size_t n_nodes, cap_nodes;
    struct cluster_edge *edges;
    size_t n_edges, cap_edges;
    struct cluster_instance *instances;
    size_t n_instances, cap_instances;
    struct cluster_runner *runners;
    size_t n_runners, cap_runners;
    struct cluster_task *tasks;
    size_t n_tasks, cap_tasks;
    struct cluster_download *downloads;
    size_t n_downloads, cap_downloads;
};

/* Static JSON names of the enums ("pipeline", "Idle", "TextGeneration", "Pending",
 * "Ongoing"...); NULL for a value out of range. */
const char *cluster_sharding_name(int v);
const char *cluster_task_kind_name(int v);
const char *cluster_task_status_name(int v);
const char *cluster_download_status_name(int v);

/* New empty state at position (0, 0), owned by the caller; NULL when out of memory. */
struct cluster_state *cluster_state_create(void);

/* Frees s and everything it owns; accepts NULL. */
void cluster_state_release(struct cluster_state *s);

/* Deep copy owned by the caller; NULL when out of memory. */
struct cluster_state *cluster_state_copy(const struct cluster_state *s);

/* Lookups by key; NULL when absent. Pointers stay valid until the state changes. */
const struct cluster_node *cluster_state_find_node(const struct cluster_state *s, const char *id);
const struct cluster_edge *cluster_state_find_edge(const struct cluster_state *s,
                                                   const char *from, const char *to);
const struct cluster_instance *cluster_state_find_instance(const struct cluster_state *s,
                                                           const char *id);
const struct cluster_runner *cluster_state_find_runner(const struct cluster_state *s,
                                                       const char *id);
const struct cluster_task *cluster_state_find_task(const struct cluster_state *s, const char *id);
const struct cluster_download *cluster_state_find_download(const struct cluster_state *s,
                                                           const char *node_id,
                                                           const char *model_id);

/* New JSON object of s (see the top of this file); NULL when out of memory. */
json_t *cluster_state_to_jsonv(const struct cluster_state *s);

/* s as compact JSON text with sorted keys, malloc'd (free()); NULL when out of memory.
 * Equal states give byte-identical text. */
char *cluster_state_to_json(const struct cluster_state *s);

/* Checks every field of j and builds a new state into *out (caller-owned). CAIRN_EFORMAT
 * with the offending field named ("state.instances.i1.shards[2].rank: ...") for bad
 * input, CAIRN_ENOMEM; *out is NULL on failure. */
int cluster_state_from_jsonv(const json_t *j, struct cluster_state **out, char *err,
                             size_t errlen);

/* As cluster_state_from_jsonv, from len bytes of JSON text (duplicate keys refused). */
int cluster_state_from_json(const char *text, size_t len, struct cluster_state **out,
                            char *err, size_t errlen);

/* Element helpers, shared with event.c and apply.c. The *_clear functions free what an
 * element owns and zero it (they accept a zeroed element); *_copy make dst an
 * independent deep copy of src (dst is overwritten, not freed; on failure dst is left
 * zeroed and CAIRN_ENOMEM returned); *_to_json return a new object or NULL when out of
 * memory; *_from_json check every field, naming it under path, and fill a zeroed *out
 * (cleared again on failure). */
void cluster_node_info_clear(struct cluster_node_info *info);
int cluster_node_info_copy(struct cluster_node_info *dst, const struct cluster_node_info *src);
json_t *cluster_node_info_to_json(const struct cluster_node_info *info);
int cluster_node_info_from_json(const json_t *j, const char *path, struct cluster_node_info *out,
                                char *err, size_t errlen);

json_t *cluster_edge_to_json(const struct cluster_edge *e);
int cluster_edge_from_json(const json_t *j, const char *path, struct cluster_edge *out,
                           char *err, size_t errlen);

void cluster_instance_clear(struct cluster_instance *in);
int cluster_instance_copy(struct cluster_instance *dst, const struct cluster_instance *src);
json_t *cluster_instance_to_json(const struct cluster_instance *in);
/* The members of kv into object o (those with defaults left out); false when out of
 * memory. Reads them from j (each optional; path names j in errors) into *out, which
 * is zeroed first; a type is normalised ("F16" gives "", "Q8_0" gives "q8_0"). */
bool cluster_kv_put(json_t *o, const struct cluster_kv *kv);
int cluster_kv_from_json(const json_t *j, const char *path, struct cluster_kv *out, char *err,
                         size_t errlen);
int cluster_instance_from_json(const json_t *j, const char *path, struct cluster_instance *out,
                               char *err, size_t errlen);

void cluster_runner_clear(struct cluster_runner *r);
int cluster_runner_copy(struct cluster_runner *dst, const struct cluster_runner *src);
json_t *cluster_runner_to_json(const struct cluster_runner *r);
int cluster_runner_from_json(const json_t *j, const char *path, struct cluster_runner *out,
                             char *err, size_t errlen);

void cluster_task_clear(struct cluster_task *t);
int cluster_task_copy(struct cluster_task *dst, const struct cluster_task *src);

void cluster_download_clear(struct cluster_download *d);
int cluster_download_copy(struct cluster_download *dst, const struct cluster_download *src);
json_t *cluster_download_to_json(const struct cluster_download *d);
int cluster_download_from_json(const json_t *j, const char *path, struct cluster_download *out,
                               char *err, size_t errlen);

/* Table updates for apply.c and the decoders. put moves *elem into the table (replacing
 * and clearing an element with the same key) and zeroes *elem; CAIRN_ENOMEM leaves both
 * unchanged. del frees the element with that key, if any. */
int cluster_state_put_node(struct cluster_state *s, struct cluster_node *elem);
void cluster_state_del_node(struct cluster_state *s, const char *id);
int cluster_state_put_edge(struct cluster_state *s, struct cluster_edge *elem);
void cluster_state_del_edge(struct cluster_state *s, const char *from, const char *to);
int cluster_state_put_instance(struct cluster_state *s, struct cluster_instance *elem);
void cluster_state_del_instance(struct cluster_state *s, const char *id);
int cluster_state_put_runner(struct cluster_state *s, struct cluster_runner *elem);
void cluster_state_del_runner(struct cluster_state *s, const char *id);
int cluster_state_put_task(struct cluster_state *s, struct cluster_task *elem);
void cluster_state_del_task(struct cluster_state *s, const char *id);
int cluster_state_put_download(struct cluster_state *s, struct cluster_download *elem);
void cluster_state_del_download(struct cluster_state *s, const char *node_id,
                                const char *model_id);

/* Moves everything src holds into dst (dst's previous content is freed) and frees the
 * src struct itself. Never fails. */
void cluster_state_move(struct cluster_state *dst, struct cluster_state *src);

#endif
