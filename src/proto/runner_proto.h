/* What a node and its runner processes say to each other (DESIGN.md, "Runners").
 *
 * A runner (`cairn runner`, one process per (instance, node)) is started by the node's
 * supervisor with its config as JSON in argv (`--config JSON`) and two descriptors:
 *   fd 3 (RUNNER_FD_SOCK): one end of an AF_UNIX stream socketpair; messages both ways,
 *        one JSON object per line ('\n'-terminated, at most RUNNER_MAX_LINE bytes);
 *   fd 4 (RUNNER_FD_NODE): the read end of a pipe whose write end only the node holds;
 *        it never carries data, and EOF / POLLHUP on it means the node is gone, so the
 *        runner exits at once.
 * stdin is /dev/null; stdout and stderr go to a pipe whose tail the supervisor keeps.
 *
 * Runner -> node:
 *   {"type":"status","status":"Idle"|"Connecting"|"Loading"|"WarmingUp"|"Ready"|
 *    "Running"|"ShuttingDown"|"Shutdown"|"Failed","error":text|null,"data_port"?}
 *    (data_port: a pipelined runner's data-plane port, in every status once it listens)
 *   {"type":"heartbeat"}                  at least every heartbeat_ms when not busy
 *   {"type":"token","task_id","token","index"}   one generated token (index from 0)
 *   {"type":"done","task_id","finish":"stop"|"length"|"cancelled"|"error",
 *    "n_generated","error":text|null}     the task is over (last message of a task)
 *   Tasks with params (text in, text out) also get, before done:
 *   {"type":"start","task_id","prompt_tokens","cached_tokens"}
 *   {"type":"output","task_id","seq","content","reasoning","logprobs":[...]?}
 *   {"type":"seq_done","task_id","seq","finish":"stop"|"length"|"tool_calls"|"cancelled"|
 *    "error","stop_sequence":text|null,"tool_calls":[...]|null,"completion_tokens",
 *    "draft_tokens","accepted_draft_tokens"}
 *   (their members are those of gen.h's events; the node relays them as they are to
 *   the node whose API holds the request)
 * Node -> runner:
 *   {"type":"task","task_id","kind":"TextGeneration","tokens":[id...],"max_tokens",
 *    "ignore_eos":bool,"sampling":{"temperature","top_k","top_p","min_p",
 *    "repeat_penalty","presence_penalty","frequency_penalty","penalty_last_n","seed"}}
 *    (sampling members may be left out: the defaults of runner_sampling_defaults)
 *   {"type":"task","task_id","kind":"TextGeneration","params":{textgen.h's params}}
 *    a request in text: the runner renders the chat template, tokenizes, generates n
 *    sequences and post-processes their text (stop strings, reasoning, tool calls)
 *   {"type":"cancel","task_id"}           finish a queued or running task as cancelled
 *   {"type":"shutdown"}                   cancel everything, report ShuttingDown, Shutdown, exit 0
 *   {"type":"draft","model_path":path|null,"num_draft_tokens"}   load (or drop) the draft
 *    model of speculative decoding; requests in flight keep running
 *   {"type":"peers","epoch","secret":text|null,"next_rank","next_port","hosts":[addr...]}
 *    a pipelined runner's next rank (struct runner_peers); it connects there, accepts
 *    its previous rank, and only then reports Ready
 * Unknown members are ignored (newer peers may add some); unknown types are refused.
 *
 * State machine: Idle -> Connecting -> Loading -> WarmingUp -> Ready, then Running while
 * a task runs and Ready again (a pipelined runner: Idle -> Loading -> WarmingUp ->
 * Connecting, listening, until its data-plane links are up -> Ready), ShuttingDown -> Shutdown on request; Failed with a reason
 * from any state (the runner exits after reporting it). */
#ifndef CAIRN_PROTO_RUNNER_PROTO_H
#define CAIRN_PROTO_RUNNER_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/ids.h"
#include "proto/status.h"

#define RUNNER_FD_SOCK 3
#define RUNNER_FD_NODE 4
#define RUNNER_MAX_LINE ((size_t)16 << 20)  /* bytes of one message line */
#define RUNNER_MAX_PROMPT ((int64_t)1 << 20) /* prompt tokens of a task */
#define RUNNER_MAX_GENERATE ((int64_t)1 << 24)
#define RUNNER_PATH_MAX 4096
#define RUNNER_IDENTITY_MAX 128 /* instance and model identity on the data plane (DP_ID_MAX) */
#define RUNNER_MAX_SEQS 256 /* sequences of one task */
#define RUNNER_DEFAULT_SLOTS 8 /* sequences decoded at once (cairn node --parallel) */
#define RUNNER_DEFAULT_THREADS 2 /* compute threads (cairn node -t) */
#define RUNNER_KV_POOL_EXTRA 4096 /* positions of a runner's KV pool beside one full context */

/* Positions a runner's KV pool holds for sequences of up to ctx positions, shared by
 * its slots (sequences past it are preempted; the master counts the same): two full
 * contexts up to RUNNER_KV_POOL_EXTRA, then one and RUNNER_KV_POOL_EXTRA more, so a
 * long context costs about its own size. */
static inline int64_t runner_kv_pool_positions(int64_t ctx)
{
    return ctx + (ctx < RUNNER_KV_POOL_EXTRA ? ctx : RUNNER_KV_POOL_EXTRA);
}

#define RUNNER_KV_BLOCK_TOKENS 16 /* positions per block of a runner's paged KV cache */
/* Positions beyond its window that a sequence keeps in a sliding-window layer: the
 * cache's slack behind the window (KV_WINDOW_SLACK, 128), a partly passed block and the
 * largest prefill chunk a runner prepares at once (512), rounded up. */
#define RUNNER_KV_WINDOW_MARGIN 1024

/* Positions of a pool of `pool` that one sliding-window layer (gemma3, gpt-oss) keeps
 * resident: the cache releases the rows a sequence's window has passed (engine/kv.h), so
 * each of a runner's at most 2 * slots sequences (its slots and as many cached prefixes)
 * holds window + RUNNER_KV_WINDOW_MARGIN positions; never more than the pool. The master
 * counts RUNNER_DEFAULT_SLOTS slots, the runner its own. pool when window <= 0. */
static inline int64_t runner_kv_window_positions(int64_t pool, int64_t window, int64_t slots)
{
    if (window <= 0 || slots <= 0 || pool <= 0)
        return pool;
    int64_t per_seq = window + RUNNER_KV_WINDOW_MARGIN;
    if (window > INT64_MAX / 4 || per_seq > pool / (2 * slots))
        return pool;
    return 2 * slots * per_seq;
}

/* Whether the cache can release a sliding-window layer's passed rows: it gives back only
 * whole pages inside a block's rows, so a block of K rows and one of V rows must each be a
 * whole number of pages; else the layer holds the whole pool. */
static inline bool runner_kv_window_releasable(int64_t k_row_bytes, int64_t v_row_bytes, int64_t page)
{
    return page > 0 && k_row_bytes > 0 && v_row_bytes > 0 && (RUNNER_KV_BLOCK_TOKENS * k_row_bytes) % page == 0 &&
           (RUNNER_KV_BLOCK_TOKENS * v_row_bytes) % page == 0;
}

/* A runner's config. JSON {"instance_id", "runner_id", "model_path", "layer_begin",
 * "layer_end", "ctx", "slots", "threads", "heartbeat_ms", "draft_model_path",
 * "num_draft_tokens", "rank", "world_size", "tensor", "epoch", "model_identity", "data_bind",
 * "cache_type_k", "cache_type_v" ("f16", "f32", "q8_0", "q4_0")}; all but the ids
 * and the model path may be left out (defaults below). It travels on the command line,
 * so it holds nothing secret: the cluster secret comes in the "peers" message. */
struct runner_config {
    char instance_id[IDS_ID_MAX + 1], runner_id[IDS_ID_MAX + 1];
    char model_path[RUNNER_PATH_MAX];
    int layer_begin;  /* 0 */
    int layer_end;    /* -1: to the last layer */
    int64_t ctx;      /* positions per sequence; 0: the model's, at most 4096 */
    int cache_type_k, cache_type_v; /* the KV cache's types (base/dtype.h kv types; DT_F16) */
    int slots;        /* sequences decoded at once, 1..256 (RUNNER_DEFAULT_SLOTS) */
    int threads;      /* 1..512 (RUNNER_DEFAULT_THREADS) */
    int heartbeat_ms; /* 10..600000 (1000) */
    char draft_model_path[RUNNER_PATH_MAX]; /* speculative decoding's draft, "" = none */
    int num_draft_tokens; /* 0..CLUSTER_MAX_DRAFT_TOKENS (4) */
    /* A pipelined instance (world_size > 1): this runner's rank, the instance's epoch
     * and the model's identity, which the data plane's handshake compares. */
    int rank;         /* 0..world_size-1 (0) */
    int world_size;   /* 1..CLUSTER_MAX_SHARDS (1) */
    bool tensor;      /* the ranks split every layer (tensor parallelism), not the layers (false) */
    int64_t epoch;    /* >= 0 (0) */
    char model_identity[RUNNER_IDENTITY_MAX + 1]; /* "" = "unnamed" */
    char data_bind[IDS_ADDR_MAX + 1];   /* address the data plane listens on ("" = every IPv4 one):
                                           the node's cluster bind address */
};

/* Where a pipelined runner's next rank listens, and what the data plane's handshake
 * needs: node -> runner "peers" message {"epoch", "secret": text|null, "next_rank",
 * "next_port", "hosts": [address, ...]} (hosts in the order to try). */
#define RUNNER_MAX_PEER_HOSTS 16
struct runner_peers {
    int64_t epoch;
    char secret[256]; /* "" = none */
    int next_rank, next_port;
    char hosts[RUNNER_MAX_PEER_HOSTS][IDS_ADDR_MAX + 1];
    int n_hosts;
};

/* Sampling of a TextGeneration task, as engine/sample.h takes it. */
struct runner_sampling {
    float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int top_k, penalty_last_n;
    uint64_t seed; /* 0..2^53-1 in JSON */
};

struct runner_task {
    char task_id[IDS_ID_MAX + 1];
    json_t *params;     /* owned textgen params object; then tokens is NULL, n_tokens 0 */
    int32_t *tokens;    /* n_tokens prompt ids, malloc'd (owned by the task) */
    int64_t n_tokens;   /* 1..RUNNER_MAX_PROMPT */
    int64_t max_tokens; /* 1..RUNNER_MAX_GENERATE */
    bool ignore_eos;    /* keep going past end-of-generation tokens */
    struct runner_sampling sampling;
};

enum runner_msg_type {
    RUNNER_MSG_STATUS,
    RUNNER_MSG_HEARTBEAT,
    RUNNER_MSG_TOKEN,
    RUNNER_MSG_DONE,
    RUNNER_MSG_TASK,
    RUNNER_MSG_CANCEL,
    RUNNER_MSG_SHUTDOWN,
    RUNNER_MSG_START,
    RUNNER_MSG_OUTPUT,
    RUNNER_MSG_SEQ_DONE,
    RUNNER_MSG_DRAFT,
    RUNNER_MSG_PEERS,
    RUNNER_MSG_EMBEDDING,
    RUNNER_MSG_TYPE_COUNT
};

enum runner_finish {
    RUNNER_FINISH_STOP,      /* end-of-generation token (not sent as a token) */
    RUNNER_FINISH_LENGTH,    /* max_tokens reached */
    RUNNER_FINISH_CANCELLED,
    RUNNER_FINISH_ERROR,
    RUNNER_FINISH_COUNT
};

struct runner_msg {
    enum runner_msg_type type;
    int status;                  /* STATUS: enum cluster_runner_status */
    int data_port;               /* STATUS: the data plane's listening port, 0 = none */
    struct runner_peers peers;   /* PEERS */
    char *error;                 /* STATUS (Failed), DONE: malloc'd text or NULL */
    char task_id[IDS_ID_MAX + 1]; /* TOKEN, DONE, CANCEL */
    int32_t token;               /* TOKEN */
    int64_t index;               /* TOKEN */
    enum runner_finish finish;   /* DONE */
    int64_t n_generated;         /* DONE */
    struct runner_task task;     /* TASK */
    json_t *body;                /* START, OUTPUT, SEQ_DONE, EMBEDDING: the members besides type and
                                    task_id (owned object); DRAFT: {"model_path",
                                    "num_draft_tokens"} */
};

/* Static names: "status", "heartbeat", ... / "stop", "length", ...; NULL out of range. */
const char *runner_msg_type_name(int v);
const char *runner_finish_name(int v);

/* Config defaults (ids and path empty). */
void runner_config_defaults(struct runner_config *c);
/* New JSON object of a config, NULL when out of memory. */
json_t *runner_config_to_json(const struct runner_config *c);
/* Checks every member of j and fills *out (defaults for those left out). CAIRN_EFORMAT
 * naming the member ("config.slots: ...") for bad input. */
int runner_config_from_json(const json_t *j, struct runner_config *out, char *err, size_t errlen);
/* As runner_config_from_json from len bytes of JSON text. */
int runner_config_parse(const char *text, size_t len, struct runner_config *out, char *err, size_t errlen);

/* Sampling defaults: those of sample_defaults() in engine/sample.h (temperature 0.8,
 * top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64, seed 0). */
struct runner_sampling runner_sampling_defaults(void);

/* New JSON object of s ({"temperature", "top_k", ...}); NULL when out of memory. */
json_t *runner_sampling_to_json(const struct runner_sampling *s);
/* Reads sampling members from object j (NULL: all defaults; members left out take the
 * defaults); CAIRN_EFORMAT naming the member under path. */
int runner_sampling_from_json(const json_t *j, const char *path, struct runner_sampling *s, char *err,
                              size_t errlen);

/* Copy of s[0, len) fit for a JSON string: valid UTF-8 without NUL bytes (each byte of a
 * broken sequence, and NUL, becomes '?'), cut at a character boundary to at most max
 * bytes; malloc'd (free()), NULL when out of memory. */
char *runner_text_clean(const char *s, size_t len, size_t max);

/* Frees what a task owns and zeroes it; accepts a zeroed task. */
void runner_task_clear(struct runner_task *t);
/* Deep copy into dst (overwritten, not freed); CAIRN_ENOMEM leaves dst zeroed. */
int runner_task_copy(struct runner_task *dst, const struct runner_task *src);

/* Frees what a message owns and zeroes it; accepts a zeroed message. */
void runner_msg_clear(struct runner_msg *m);

/* The message as one compact JSON line ending in '\n', malloc'd (free()), its length in
 * *len; NULL when out of memory or when m holds an invalid value (status or finish out of
 * range, an invalid task id, a task without tokens). */
char *runner_msg_encode(const struct runner_msg *m, size_t *len);

/* Parses one line of the protocol (a trailing '\n' allowed, duplicate keys refused);
 * NULL with "<what>: not JSON (...)" in err when it is not JSON. */
json_t *runner_line_parse(const char *line, size_t len, const char *what, char *err, size_t errlen);

/* Decodes one line (without or with its '\n') into *out (zeroed first; release with
 * runner_msg_clear, also on failure). CAIRN_EFORMAT naming the member for bad input,
 * CAIRN_ENOMEM. */
int runner_msg_decode(const char *line, size_t len, struct runner_msg *out, char *err, size_t errlen);

/* Sends m on a blocking socket or pipe, all of it (retrying on EINTR, no SIGPIPE).
 * CAIRN_EIO when the peer is gone, CAIRN_ENOMEM. */
int runner_msg_send(int fd, const struct runner_msg *m);

/* Writes buf[0..len) (encoded lines) as runner_msg_send writes one: 0, or CAIRN_EIO when
 * the peer is gone. */
int runner_send_bytes(int fd, const char *buf, size_t len);

/* Splits a byte stream into lines. Zero-initialize, release with runner_lines_free. */
struct runner_lines {
    char *buf;
    size_t start, len, cap; /* pending bytes are buf[start, start + len) */
    size_t scanned;         /* bytes of the pending ones known to hold no '\n' */
};

enum { RUNNER_LINES_EOF = 0, RUNNER_LINES_DATA = 1, RUNNER_LINES_AGAIN = 2 };

/* One read() from fd into the buffer: RUNNER_LINES_DATA, RUNNER_LINES_EOF, or
 * RUNNER_LINES_AGAIN (non-blocking fd without data, or EINTR); CAIRN_EIO on a read error,
 * CAIRN_ENOMEM. Lines returned before are invalid afterwards. */
int runner_lines_fill(struct runner_lines *r, int fd);

/* Next complete line (without '\n', not NUL-terminated) into *line and *len: 1, or 0 when
 * none is complete; CAIRN_EFORMAT when the pending line is longer than RUNNER_MAX_LINE
 * (the stream cannot be trusted any more). *line stays valid until the next fill. */
int runner_lines_next(struct runner_lines *r, const char **line, size_t *len);

void runner_lines_free(struct runner_lines *r);

#endif
