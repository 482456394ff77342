/* Private to src/node/node*.c: the node's struct and the helpers its files share. The
 * node is cut by concern (node.h describes it as a whole):
 *   node.c         life, the node thread's loop and dispatch of link messages, the public
 *                  accessors, subscribers, task outputs and bodies, sending helpers;
 *   node_log.c     this node's copy of the state: the event log, applying events, the
 *                  follower's catching up with its master;
 *   node_master.c  the master's duties (events made, event requests served, timeouts,
 *                  new terms, head announcements) and the commands of this node's API;
 *   node_report.c  node info and reports to the master, edges, throughput probes;
 *   node_gossip.c  control messages: peers and pings, connecting to peers, leave;
 *   node_models.c  the catalog as the node serves it (cards, models, drafts).
 *   node_hub.c     hub models placed before they are here: headers, each rank's layers.
 * Everything here runs on the node thread unless its comment names a lock. */
#ifndef CAIRN_NODE_NODE_INT_H
#define CAIRN_NODE_NODE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "base/clock.h"
#include "ctl/election.h"
#include "net/discovery.h"
#include "net/link.h"
#include "node/eventlog.h"
#include "node/node.h"
#include "node/nodeinfo.h"

enum pending_state { P_QUEUED, P_SENT, P_WAIT_STATE, P_DONE };

/* A command an API thread waits on; the node thread moves it along. */
struct pending {
    struct pending *next;
    struct command *cmd; /* the waiting caller's */
    enum pending_state st;
    char sent_to[IDS_ID_MAX + 1];
    int64_t queued_ms;
    struct command_result res;
};

struct sub {
    uint64_t token;
    node_event_fn fn;
    void *ctx;
};

struct heard {
    char id[IDS_ID_MAX + 1];
    int64_t ms;
};

/* What this node measured of its link to one peer: the round trip of pings, the
 * throughput of probes (one in flight at a time), when it last sent the peer outputs. */
struct perf {
    char id[IDS_ID_MAX + 1];
    int64_t rtt_us;         /* smoothed; 0 = not measured */
    int64_t tput;           /* bytes per second, smoothed; 0 = not measured */
    bool probing;           /* a probe waits for its ack */
    uint64_t probe_seq;     /* of the probe in flight (or the last one) */
    int64_t probe_sent_ns;  /* clock_ns when it left */
    int64_t next_probe_ms;  /* 0 = none planned (peer not up) */
    int64_t probe_every_ms; /* probe_interval_ms, doubled while the figure holds steady */
    int64_t told_ms;        /* first told of it while not linked (should_connect); 0 = not */
    int64_t last_output_ms; /* task outputs sent to it: the link is busy */
};

/* A peer's address as its cluster link sees it: where we connected, or where it came from. */
struct peer_addr {
    char id[IDS_ID_MAX + 1];
    char addr[LINK_ADDR_MAX];
};

struct node {
    struct cluster_kv place_kv; /* node_config's */
    char id[IDS_ID_MAX + 1];
    char *data_dir, *models_dir, *log_path;
    bool force_master, worker;
    node_runners_fn runners;
    void *runners_ctx;
    atomic_bool report_asked;
    _Atomic int64_t mem_bandwidth; /* node_set_memory_bandwidth; 0 until measured */
    atomic_bool info_asked;        /* gather the info on the next pass (the bandwidth came) */
    int64_t memory_limit;
    int node_timeout_ms;
    atomic_int api_port;
    int64_t since_ms; /* wall clock at start: seniority */

    struct link *link;
    struct election *el;
    struct eventlog *log;
    struct discovery *disc;

    pthread_mutex_t cat_mu;
    struct catalog *catalog;
    struct download_mgr *downloads; /* NULL without a models dir */
    struct node_hub *hub;           /* hub models placed before they are here (node_hub.c) */
    int64_t cat_scanned_ms;
    struct master_env env;

    pthread_mutex_t mu; /* state, status and peer addresses */
    struct cluster_state *state;
    struct node_status status;
    struct peer_addr *peer_addrs; /* the links' peers as the node thread last saw them */
    size_t n_peer_addrs;
    int64_t peer_addrs_ms;
    char dp_secret[65];           /* data-plane secret (hex), "" without a cluster secret */
    char *bind_addr;              /* the cluster's bind address, NULL = every interface */

    pthread_t thread;
    bool running;
    atomic_bool stop;
    atomic_bool leave_asked; /* node_leave: say leave to the peers */
    atomic_bool leave_done;  /* every live peer acknowledged it, or the wait ran out */

    pthread_mutex_t pend_mu;
    pthread_cond_t pend_cv;
    struct pending *pend;
    uint64_t next_cmd;
    bool stopped; /* under pend_mu: no more commands */

    int wake_fd; /* eventfd: other threads wake the node thread (commands, outputs) */
    pthread_mutex_t out_mu; /* task outputs for other nodes, sent by the node thread */
    struct out_msg *outq, **outq_tail;
    size_t outq_bytes;
    node_task_output_fn sink;
    void *sink_ctx;
    pthread_mutex_t body_mu; /* held while the body sink runs: unsetting it waits for the call */
    node_task_output_fn body_sink;
    void *body_sink_ctx;

    pthread_mutex_t sub_mu;
    struct sub subs[NODE_MAX_SUBSCRIBERS];
    size_t n_subs;
    uint64_t next_token;

    /* node thread only */
    int64_t master_term;  /* the term we started as master; 0 when not master */
    char followed[IDS_ID_MAX + 1];
    int64_t followed_term;
    bool followed_confirmed;
    struct heard *heard;
    size_t n_heard, cap_heard;
    /* Peers that said they leave (node_leave): the master times them out at once instead
     * of after node_timeout_ms. Kept across terms, so the next master knows who left when
     * the leaver was the master; dropped when the peer comes back. */
    char left[NODE_LEFT_MAX][IDS_ID_MAX + 1];
    int n_left;
    /* Our own leave: the peers still to acknowledge it, until leave_deadline_ms. */
    bool leaving;
    char leave_wait[NODE_LEFT_MAX][IDS_ID_MAX + 1];
    int n_leave_wait;
    int64_t leave_deadline_ms;
    int64_t next_timeout_ms, next_head_ms, next_gossip_ms, next_info_ms;
    int64_t since_snapshot;
    int64_t last_request_ms;
    int64_t sync_at;      /* when to check we caught up with a new master; 0 = no check */
    struct node_info info;      /* last gathered */
    struct node_info reported;  /* last reported */
    bool has_info, has_reported, report_due;
    int64_t last_report_ms;
    json_t *reported_edges;
    struct perf *perfs;
    size_t n_perfs, cap_perfs;
    int probe_interval_ms;
    uint64_t next_probe_seq;
    uint8_t *probe_buf; /* NODE_PROBE_BYTES: a probe's payload (its sequence number, zeros) */
};

static inline int64_t mono_ms(void) { return clock_ns() / 1000000; }

static inline int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- node.c ---- */

/* Wakes the node thread (its eventfd). Any thread. */
void node_wake(struct node *n);

/* Calls every subscriber with an applied event's JSON text (sub_mu held meanwhile). */
void node_notify(struct node *n, const char *json, int64_t term, int64_t index);

/* Sends j (consumed; NULL does nothing) as compact JSON to peer to (NULL: every peer). */
void node_send_json(struct node *n, const char *to, int type, json_t *j);

/* A well-framed message from peer with a malformed payload ("what: why", why may be
 * NULL): a strike against its connection (link_strike). */
void node_strike(struct node *n, const char *peer, const char *what, const char *why);

/* The master to talk to: "" when none is known and reachable; our id when master. */
const char *node_current_master(struct node *n);

/* Whether this node is the master now. */
bool node_is_master(struct node *n);

/* ---- node_log.c ---- */

/* JSON text of a StateSnapshot event of the current state at (term, index) (malloc'd;
 * NULL when out of memory). */
char *node_snapshot_json(struct node *n, int64_t term, int64_t index);

/* Opens the event log at log_path (a file that is not a log is moved aside) and
 * replays it into the state. 0 or the eventlog's error (err says which). */
int node_log_open(struct node *n, char *err, size_t errlen);

/* Whether state s has reached the position (term, index). */
bool node_pos_reached(const struct cluster_state *s, int64_t term, int64_t index);

/* Applies e (its JSON text json) to the state under mu, logs it and tells the
 * subscribers; 0 or cluster_apply's error (nothing logged then). */
int node_take_event(struct node *n, const struct event *e, const char *json);

/* Asks the master we follow for the events past our position (full: a snapshot of its
 * whole state), at most once per REQUEST_RETRY_MS unless full. */
void node_request_events(struct node *n, bool full, int64_t now);

/* An event from peer from: applied when from is the confirmed master we follow. */
void node_on_event(struct node *n, const char *from, const char *data, size_t len, int64_t now);

/* A snapshot from peer from: taken, when from is our master, in place of our state. */
void node_on_snapshot(struct node *n, const char *from, const char *data, size_t len);

/* Catches up with a newly followed master once sync_at has come (after_election sets it). */
void node_check_sync(struct node *n, int64_t now);

/* ---- node_master.c ---- */

/* Marks done the commands waiting for a position the state has reached, and wakes their
 * callers (takes pend_mu). */
void node_wake_pendings(struct node *n);

/* Master: numbers, applies, logs and broadcasts each event of evs, then a StateSnapshot
 * every NODE_COMPACT_EVERY events. */
void node_emit(struct node *n, struct master_events *evs);

/* Answers a follower's EVENT_REQUEST j with the events it lacks or a snapshot. */
void node_serve_request(struct node *n, const char *from, const json_t *j);

/* The master's record of when node id was last heard (created when create); NULL when
 * absent, or out of memory. */
struct heard *node_heard_find(struct node *n, const char *id, bool create, int64_t now);

/* Master duties that are due at now: timing out nodes, announcing our position. */
void node_master_tick(struct node *n, int64_t now);

/* Becomes master of term: a StateSnapshot of our state, then MasterElected. */
void node_start_term(struct node *n, int64_t term, int64_t now);

/* A command from peer from: run when we are master, answered in every case. */
void node_run_remote_command(struct node *n, const char *from, const char *data, size_t len);

/* Master: the events of node from's report. */
void node_run_report(struct node *n, const char *from, const json_t *report);

/* A command result from the master: settles the command of this node waiting for it. */
void node_on_result(struct node *n, const char *from, const char *data, size_t len);

/* Moves the commands of this node's API along: run here when master, sent to the master,
 * or failed when none came in time or the one they went to went away. */
void node_run_pendings(struct node *n, int64_t now);

/* Fails every command still waiting (node_stop), with "node is stopping". */
void node_fail_pendings(struct node *n);

/* ---- node_report.c ---- */

/* The figures of our link to peer id (made when create and id is valid, up to
 * LINK_MAX_ROUTES); NULL when absent or out of memory. */
struct perf *node_perf_find(struct node *n, const char *id, bool create);

/* Gathers node info when due and reports to the master when something moved (at most
 * once per NODE_REPORT_MIN_MS; nothing while leaving). */
void node_maybe_report(struct node *n, int64_t now);

/* A peer's link came up: its first probe goes NODE_PROBE_FIRST_MS later. */
void node_probe_plan(struct node *n, const char *peer, int64_t now);

/* A peer's link went down: no probes to it until it comes back. */
void node_probe_stop(struct node *n, const char *peer);

/* Sends the probes that are due. */
void node_send_probes(struct node *n, int64_t now);

/* A peer's probe: acked at once (a strike when malformed). */
void node_on_probe(struct node *n, const char *from, const uint8_t *data, size_t len);

/* The ack of our probe seq of bytes: a throughput sample of that peer's link. */
void node_on_probe_ack(struct node *n, const char *from, int64_t seq, int64_t bytes);

/* ---- node_gossip.c ---- */

/* Tells peer to (NULL: every peer) the endpoints of our peers, and pings it. */
void node_gossip(struct node *n, const char *to, int64_t now);

/* A control message ("peers", "ping", "pong", "head", "probe_ack", "leave", "leave_ack")
 * from peer from; anything else is a strike. */
void node_on_control(struct node *n, const char *from, const char *data, size_t len, int64_t now);

/* Connects to the nodes discovery heard of (nothing with discovery off). */
void node_discover(struct node *n, int64_t now);

/* Index of id among the peers that said they leave, -1 when not there. */
int node_left_index(const struct node *n, const char *id);

/* Notes that peer id leaves (left) or came back (!left). */
void node_note_left(struct node *n, const char *id, bool left);

/* Our leave starts: "leave" to every live peer, whose acks node_main waits for. */
void node_start_leave(struct node *n, int64_t now);

/* ---- node_models.c ---- */

/* node_hub.c: its jobs and the catalog of headers (models_dir/.sparse). */
int node_hub_create(struct node *n, char *err, size_t errlen);
void node_hub_release(struct node *n); /* cancels the jobs and waits for their threads */

/* master_draft_fn over this node's catalog (ctx: the node): both files are here and
 * their vocabularies agree. */
int node_draft_check(void *ctx, const char *model_id, const char *draft_id, char *err, size_t errlen);

#endif
