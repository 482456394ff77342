/* The control plane of one machine: a link to the other nodes, the cluster state, an
 * event log, the election, the master's duties when elected, and what this node
 * reports about itself. One node thread runs it all (a poll loop over the link with a
 * bounded timeout); HTTP handlers on other threads read the state under a lock and
 * hand commands to the node thread.
 *
 * Data dir: `node_id` (made once, kept across restarts) and `events.db`, this node's
 * event log. The master appends every event it makes; a follower appends the events
 * it applies (its copy starts again from a snapshot when it has a gap). At start the
 * log is replayed, so a node that restarts (or a new master) carries on from its state.
 *
 * Events: the master numbers each event (term, index), appends, applies and broadcasts
 * it. A follower applies the events of the master it follows in order; at a gap (or when
 * the master's periodic head shows it behind) it sends EVENT_REQUEST with its position
 * and the master answers from its log, or with a SNAPSHOT of its whole state when the
 * log no longer holds that position. A new master starts its term with a StateSnapshot
 * of its own state and a MasterElected; every node then sends it a full report (node
 * info, runners, links), so instances on surviving nodes keep running.
 *
 * Membership: a peer unheard for node_timeout_ms is timed out by the master
 * (NodeTimedOut). Nodes tell each other the endpoints of their peers, so nodes joined
 * through one --peer end up linked to all. Node info is gathered every
 * NODE_INFO_INTERVAL_MS and reported when nodeinfo_changed says so (or when the master
 * lacks it), at most once per NODE_REPORT_MIN_MS.
 *
 * Topology: each node reports an edge to every peer it is linked to, with the round
 * trip of pings (every NODE_GOSSIP_INTERVAL_MS) and the throughput of probes: a probe of
 * NODE_PROBE_BYTES goes to each peer NODE_PROBE_FIRST_MS after its link comes up and
 * then every probe_interval_ms (twice as seldom after each sample within the throughput
 * slack, up to NODE_PROBE_BACKOFF times), one in flight per peer, postponed while task outputs
 * flow to that peer; the peer acks it at once, and bytes / (ack time - rtt) is a sample
 * (both figures smoothed). A report goes out when an edge's rtt moves past
 * MASTER_EDGE_RTT_SLACK_US or 50%, or its throughput past
 * MASTER_EDGE_THROUGHPUT_SLACK_PCT (the master makes no event for smaller moves either).
 *
 * Reports always carry the node's info, but the info last reported until
 * nodeinfo_changed says it moved; the master makes NodeGatheredInfo only for info that
 * differs from its state's, so repeated reports (runners, downloads, edges) add no event
 * for it. A node's liveness is its link (the master's check_timeouts), not last_seen_ms.
 *
 * Peers that send well-framed messages with malformed payloads (not JSON, missing or
 * wrong fields, unknown types) are logged and struck (link_strike): after
 * LINK_MAX_STRIKES their connection is cut, and the node keeps serving the others.
 *
 * Wire types besides link.h's: NODE_T_COMMAND_RESULT (master -> requester, a
 * command_result), NODE_T_CONTROL ({"type": "peers"|"ping"|"pong"|"head"|"probe_ack",
 * ...}), NODE_T_TASK_OUTPUT, NODE_T_TASK_BODY and NODE_T_PROBE (8 bytes of sequence number, big-endian,
 * then zeros; answered by {"type": "probe_ack", "seq", "bytes"}). */
#ifndef CAIRN_NODE_NODE_H
#define CAIRN_NODE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "node/catalog.h"
#include "ctl/command.h"
#include "node/download.h"
#include "ctl/master.h"
#include "ctl/state.h"

#define NODE_T_COMMAND_RESULT 22
#define NODE_T_CONTROL 23
#define NODE_T_TASK_OUTPUT 24 /* a runner's output line, relayed to the requester */
#define NODE_T_PROBE 25       /* throughput probe: seq (u64 big-endian) and filler */
#define NODE_T_TASK_BODY 26   /* a request body, from the requester to the first rank's node */

#define NODE_TIMEOUT_MS_DEFAULT 30000   /* --node-timeout (a node that leaves goes at once) */
#define NODE_LEFT_MAX 64                /* peers remembered as having left; peers told we leave */
#define NODE_LEAVE_WAIT_MS 2000         /* node_leave waits this long for the peers' acks */
#define NODE_INFO_INTERVAL_MS 2000      /* node info gathered this often */
#define NODE_REPORT_MIN_MS 1000         /* at most one report per this */
#define NODE_GOSSIP_INTERVAL_MS 10000   /* peers and pings sent this often (and when a link comes up) */
#define NODE_CONNECT_DEFER_MS 5000     /* a peer with a smaller id gets this long to connect to us */
#define NODE_HEAD_INTERVAL_MS 1000      /* the master announces its position this often */
#define NODE_POLL_MS 1000               /* longest sleep of the node thread (a safety net) */
#define NODE_RETRY_MS 50                /* commands waiting for a master are retried this often */
#define NODE_NO_MASTER_WAIT_MS 3000     /* a command waits this long for a master */
#define NODE_COMPACT_EVERY 1000         /* events between the master's snapshots */
#define NODE_REQUEST_BATCH 1000         /* events sent per EVENT_REQUEST */
#define NODE_MAX_PEERS 256              /* endpoints given or taken per gossip message */
#define NODE_MAX_SUBSCRIBERS 256
#define NODE_MAX_OUTPUT_QUEUE ((size_t)64 << 20) /* bytes of task outputs waiting to be sent */
#define NODE_PROBE_INTERVAL_MS 30000    /* throughput probes to each peer this often... */
#define NODE_PROBE_BACKOFF 16           /* ...to this many times as seldom while steady */
#define NODE_PROBE_FIRST_MS 1000        /* the first one this long after the link comes up */
#define NODE_PROBE_BYTES ((size_t)256 << 10)
#define NODE_PROBE_TIMEOUT_MS 10000     /* a probe unacked this long is given up */
#define NODE_PROBE_BUSY_MS 1000         /* a link that carried task outputs this recently waits */

/* Hook of the runner supervisor: a new JSON array of this node's runners (each a runner
 * of state.h's JSON), or NULL when it cannot say (the report then leaves them as
 * they are). Called on the node thread. */
typedef json_t *(*node_runners_fn)(void *ctx);

struct node_config {
    const char *data_dir;        /* required: node_id and events.db (created when missing) */
    const char *models_dir;      /* the catalog's folder; NULL: no models */
    const char *ns;              /* namespace; NULL = "" */
    const char *secret;          /* cluster secret; NULL or "" = none */
    const char *bind_addr;       /* cluster address to bind; NULL = every interface */
    int cluster_port;            /* 0 = ephemeral */
    int api_port;                /* reported to the cluster; 0 = no API */
    const char *const *peers;    /* "host:port" or "tcp://host:port" to connect to */
    size_t n_peers;
    bool force_master;
    bool worker;                 /* runs runners; without, it offers no memory to placement */
    int64_t memory_limit;        /* bytes this node may offer; 0 = no limit */
    int node_timeout_ms;         /* 0 = NODE_TIMEOUT_MS_DEFAULT */
    int heartbeat_ms, link_timeout_ms; /* link timers; 0 = 1000 and 3000 */
    const char *discovery;       /* "off" (NULL), "auto" or an interface name */
    node_runners_fn runners;     /* NULL: runners are not reported */
    void *runners_ctx;
    const char *api_key;         /* the peers' API key, sent when fetching models (download.h) */
    int probe_interval_ms;       /* throughput probes; 0 = NODE_PROBE_INTERVAL_MS */
    struct cluster_kv place_kv;  /* what placements asked through this node's API get where
                                    they say nothing (--ctx-size, -ctk, -ctv) */
};

/* What a node says about itself (GET /state carries the rest). */
struct node_status {
    char node_id[IDS_ID_MAX + 1];
    char master[IDS_ID_MAX + 1]; /* "" while none is known */
    const char *role;            /* election_role_name */
    bool is_master;
    int64_t term;
    int64_t last_term, last_index; /* the state's position */
    int cluster_port, api_port;
    size_t n_peers;              /* peers up */
};

struct node;

/* Creates a node: reads or makes the node id, opens and replays the log, binds the
 * cluster port, connects to the peers. Nothing runs until node_start. *out owned by
 * the caller (node_release). CAIRN_EINVAL for a bad config, CAIRN_EIO when the data
 * dir, the log or the port cannot be used (err says which). */
int node_create(struct node **out, const struct node_config *cfg, char *err, size_t errlen);

/* Starts the node thread. */
int node_start(struct node *n, char *err, size_t errlen);

/* Leaves the cluster before stopping: tells every live peer "leave" and waits until each
 * acknowledged it (at most NODE_LEAVE_WAIT_MS), and reports nothing more. The peers
 * remember it; the master (this one, or the next if we were it) takes this node out of
 * the state at once, placing its instances again, instead of after node_timeout_ms. It
 * comes back when it connects again. Without it (a crash, or node_stop alone) the
 * others wait for the timeout. */
void node_leave(struct node *n);

/* Stops the node thread (commands in flight fail), says bye to the peers, closes the
 * log. Idempotent; node_release calls it. */
void node_stop(struct node *n);

/* Stops and frees the node; accepts NULL. */
void node_release(struct node *n);

/* This node's id (valid for the node's life). */
const char *node_id(const struct node *n);

/* The bound cluster port. */
int node_cluster_port(const struct node *n);

/* Sets the API port reported in node info (before node_start: the HTTP server may be
 * bound after the node is made). */
void node_set_api_port(struct node *n, int port);

/* The memory read bandwidth this node's runners see (bytes/s), reported with its info
 * from the next gather on (placement estimates speed from it). Any thread. */
void node_set_memory_bandwidth(struct node *n, int64_t bytes_per_s);

/* Asks for a report to the master soon (runner status changed). Any thread. */
void node_report_now(struct node *n);

/* Fills *st. Any thread. */
void node_get_status(struct node *n, struct node_status *st);

/* Runs fn with the state under the node's lock (fn must not block or call the node).
 * Any thread. */
void node_read_state(struct node *n, void (*fn)(void *ctx, const struct cluster_state *s),
                     void *ctx);

/* A copy of the node's state (cluster_state_release it); NULL when out of memory. Any
 * thread but the node's. */
struct cluster_state *node_state_copy(struct node *n);

/* Hands c to the master (the node thread sends it, or runs it when this node is the
 * master) and waits up to timeout_ms for its result, then until this node's state has
 * applied the events it produced, so a read that follows sees them. c->id is set here.
 * Returns res->code: CAIRN_EIO (message in res) when no master answered in time, the
 * master went away or the node is stopping; else the master's answer. Any thread but
 * the node's. */
int node_command(struct node *n, struct command *c, int timeout_ms, struct command_result *res);

/* The card lookup the master uses (master_card_fn over the node's catalog, rescanned
 * when older than a second): ctx is the node. Any thread. */
int node_card(void *ctx, const char *model_id, struct catalog_card *out, char *err,
              size_t errlen);

/* The card lookup of placement (the master's and previews'): node_card's, else, for a
 * hub model's id (its canonical reference), the card read from its header (fetched
 * into models_dir/.sparse, see node_hub_header); when there is none yet, a read of the
 * header starts in the background and the answer is CAIRN_ENOTFOUND saying so, so a
 * caller asks again. Never waits on the network. Any thread. */
int node_card_placeable(void *ctx, const char *model_id, struct catalog_card *out, char *err, size_t errlen);

/* Reads the header of hub model ref into models_dir/.sparse (hub_sparse_header, as one
 * of the node's jobs: a read of the same reference already running is waited for) and
 * waits up to timeout_ms for it: not on the node thread. id gets the model's id as the
 * hub's listing resolved the reference (HUBREF_TEXT_MAX bytes). The hub's errors (a
 * failed read is not tried again for NODE_HUB_RETRY_MS), or CAIRN_EIO when the wait
 * ran out. */
int node_hub_header(struct node *n, const char *ref, int timeout_ms, char *id, char *err, size_t errlen);

/* The worker's question for a shard of hub model id whose layers [layer_begin,
 * layer_end) are not here: 0 while a fetch of their byte ranges runs (started now when
 * none does; its progress is one of the node's downloads, with "layers"), else the
 * reason one failed lately, in why. */
int node_hub_fill(struct node *n, const char *id, int layer_begin, int layer_end, char *why, size_t whylen);

/* Whether the sparse copy of id holds every byte those layers read: true with the path
 * to load it from. */
bool node_hub_covers(struct node *n, const char *id, int layer_begin, int layer_end, char *path, size_t pathlen);

/* Starts a pull of hub model ref (hub_pull) into this node's models folder, as one of
 * its downloads, unless one runs: 0, or the reason one failed lately (tried again after
 * a while), in why. */
int node_hub_pull(struct node *n, const char *ref, char *why, size_t whylen);

/* Cancels this node's running hub jobs of id (pulls, headers, layers; their partial
 * files stay for a later resume); CAIRN_ENOTFOUND when none runs. */
int node_hub_cancel(struct node *n, const char *id);

/* The master environment of this node (card lookup as node_card_placeable). */
const struct master_env *node_master_env(const struct node *n);

/* The models folder (the catalog's), or NULL when the node has none. */
const char *node_models_dir(struct node *n);

/* New JSON array of the catalog's cards (catalog_card_to_json), each with "nodes": the
 * ids of nodes known to have the file (this one, and nodes with a completed download
 * of it). NULL when out of memory. Any thread. */
json_t *node_models_json(struct node *n);

/* The node's model downloads (download.h: files fetched from peers into models_dir,
 * reported to the master as the report's "downloads"), or NULL without a models dir.
 * Valid until node_release. Any thread. */
struct download_mgr *node_downloads(struct node *n);

/* Calls fn with the JSON text of each event of this node's log after (term, index), at
 * most max of them, oldest first (*reset: 1 when the log restarted from a snapshot and
 * the first is one). Reads with a handle of its own, so any thread may call it while the
 * node writes. Errors as eventlog_read_since (CAIRN_ERANGE for a position it lacks). */
typedef int (*node_log_fn)(void *ctx, const char *json, size_t len);
int node_read_events(struct node *n, int64_t term, int64_t index, size_t max, node_log_fn fn, void *ctx,
                     int *reset, char *err, size_t errlen);

/* The address this node's cluster link reaches peer_id at (the endpoint it connected
 * to, or the IP the peer came from), refreshed every 250 ms: false when no link is up. */
bool node_peer_addr(struct node *n, const char *peer_id, char *out, size_t len);

/* The key the data planes of this node's runners prove (hex HMAC-SHA256 of a label under
 * the cluster secret), "" without a secret. */
const char *node_dataplane_secret(const struct node *n);

/* The address the cluster port is bound to ("" = every interface); the data planes of
 * this node's runners listen there too. */
const char *node_bind_addr(const struct node *n);

/* The KV cache placements asked through this node's API get where they say nothing. */
const struct cluster_kv *node_place_kv(const struct node *n);

/* Called by the node thread for every event it applies, with the event's JSON text;
 * must not block or call the node. */
typedef void (*node_event_fn)(void *ctx, const char *json, size_t len, int64_t term,
                              int64_t index);

/* Adds a subscriber; *token names it for node_unsubscribe. CAIRN_EFULL past
 * NODE_MAX_SUBSCRIBERS. Any thread. */
int node_subscribe(struct node *n, node_event_fn fn, void *ctx, uint64_t *token);

/* Removes a subscriber; once it returns fn is not running and will not run. */
void node_unsubscribe(struct node *n, uint64_t token);

/* Task outputs (runner_proto.h's start/output/seq_done/done lines) travel directly
 * from the node whose runner made them to the node whose API holds the request, not
 * through the event log. The sink receives the lines for this node with the id of the
 * node they came from (this node's own for its runners' lines; the sink accepts a line
 * only from the node that runs its task): on the node thread for lines from peers, on
 * the sender's thread for lines of this node's own runners. It must not block or call
 * the node. NULL: lines are dropped. Any thread. */
typedef void (*node_task_output_fn)(void *ctx, const char *from, const char *line, size_t len);
void node_set_task_sink(struct node *n, node_task_output_fn fn, void *ctx);

/* Sends one output line to node dest (this node: straight to the sink). CAIRN_EFULL when
 * NODE_MAX_OUTPUT_QUEUE bytes are waiting, CAIRN_ENOMEM. Any thread. */
int node_send_task_output(struct node *n, const char *dest, const char *line, size_t len);

/* Request bodies (node/taskbody.h's messages) travel the same way the other way: from the
 * node whose API holds a request to the node of its instance's first rank, whose worker
 * hands them to the runner. The body sink gets them as the task sink gets outputs. */
void node_set_task_body_sink(struct node *n, node_task_output_fn fn, void *ctx);
int node_send_task_body(struct node *n, const char *dest, const char *body, size_t len);

/* Reads or makes the persistent node id of data_dir into id (IDS_ID_MAX + 1 bytes):
 * the file `node_id` holds it; a missing file is made once (random id, written
 * atomically). CAIRN_EIO when the dir or file cannot be used, CAIRN_EFORMAT when the
 * file holds something else. */
int node_load_id(const char *data_dir, char *id, char *err, size_t errlen);

#endif
