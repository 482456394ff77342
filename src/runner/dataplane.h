/* Data plane between the runners of one pipelined instance: one TCP connection per
 * neighbouring pair of ranks, a handshake, then binary frames carrying activations,
 * results and KV bookkeeping (DESIGN.md, "Networking"; issue 7).
 *
 * Topology. Rank r listens (dp_listen, address and port from the placement) and rank
 * r-1 connects to it (dp_connect); for a ring, the last rank connects to rank 0 the
 * same way. A connection is full duplex and symmetric once open: either side may send
 * any frame type, so results can travel back along the chain or straight from the
 * last rank to rank 0 over the ring's closing link.
 *
 * Handshake (both sides send, then check; dp_connect and dp_accept run it before they
 * return). Each side sends HELLO {protocol version, rank, epoch, nonce, receive window,
 * instance id, model identity}; each checks the peer's against its own config:
 * protocol version, instance id, epoch, model identity, a rank other than its own,
 * and the rank it expects (peer_rank >= 0). Then each sends AUTH, its proof of the
 * cluster secret: HMAC-SHA256 keyed with the secret over a label, the prover's role
 * (connector or acceptor) and both HELLO payloads (so both nonces); without a secret
 * the proof is empty, which only a secret-less peer accepts. Then OK. With a secret,
 * every frame after the OK is sealed (dataplane_seal.c): its payload encrypted with
 * ChaCha20-Poly1305 under a key per direction derived from the secret and both HELLOs,
 * its header the associated data, the nonce the count of frames sent that way before it;
 * such frames carry DP_F_SEALED, no payload CRC, and a length that counts the tag. A
 * frame that does not open, or an unsealed one, ends the connection. A side that
 * finds a mismatch sends REJECT with the reason and closes; both callers get an error
 * that names the field and both sides' values by rank ("epoch mismatch: rank 1 is at
 * epoch 8, rank 0 at 7"), prefixed "refused by the peer: " on the side that only
 * heard it.
 *
 * Frames: a DP_HDR_SIZE header, little-endian:
 *     0 u32 magic DP_MAGIC ("CDPF" in memory order)   8 u32 payload length
 *     4 u8  header version DP_WIRE_VERSION            12 u32 CRC32C of the payload (flag DP_F_PAYLOAD_CRC) or 0
 *     5 u8  type (enum dp_type)                       16 u32 CRC32C of bytes 0..15
 *     6 u16 flags (DP_F_*; other bits must be 0)
 * then the payload. Payload layouts (offsets in bytes from the payload's start, all
 * little-endian; "pad8" = zero bytes up to the next multiple of 8):
 *   ACTIVATIONS: 0 u64 step, 8 u32 n tokens, 12 u32 n_embd, 16 u32 dtype (DT_F32,
 *     DT_F16, DT_BF16 or DT_Q8_0), 20 u32 n_asks (0, or the number of wanted tokens),
 *     24 i64 pos[n], i32 seq[n], u8 want[n] (0 or 1), pad8, values: n rows of n_embd in
 *     dtype (Q8_0: ggml's 34-byte blocks, n_embd a multiple of 32), pad8, then n_asks x
 *     struct dp_ask (64 bytes each), the SAMPLE asks' bias entries (struct dp_bias, 8
 *     bytes each, ask after ask) and their penalty windows (i32 tokens, ask after ask).
 *   RESULT: 0 u64 step, 8 u32 n entries, 12 u32 kind (DP_RESULT_*), 16 u32 n_vocab
 *     (LOGITS, SAMPLED; 0 for TOKENS), 20 i32 status (0, or a negative CAIRN_E* code of
 *     the rank that failed), 24 u16 message length, 26 u16 0, 28 u32 0, 32 message
 *     bytes, pad8, i64 pos[n], i32 seq[n], then TOKENS: i32 token[n], f32 logprob[n];
 *     LOGITS: f32 logits[n x n_vocab]; SAMPLED: u8 need[n] (enum dp_row_need), pad8, and
 *     with S entries SAMPLE, L entries LOGITS and T the sum of n_top: i32 token[S], f32
 *     prob[S], f32 logprob[S], i32 n_top[S], i32 top_token[T], f32 top_logprob[T], f32
 *     logits[L x n_vocab].
 *   CONTROL: 0 u64 step, 8 u32 n ops, 12 u32 0, 16 n x struct dp_ctl (24 bytes each).
 *   HEARTBEAT: 0 u64 sender's clock (ns), 8 u64 the last clock value received from the
 *     peer (0 before one), 16 u64 ns since it was received. Consumed by the connection.
 *   GOODBYE: 0 i32 code, 4 u16 reason length, 6 u16 0, 8 reason bytes.
 *   CREDIT: 0 u64 total bytes (headers included) of data frames (ACTIVATIONS, RESULT,
 *     CONTROL) the sender's reader has taken so far. Consumed by the connection.
 *   HELLO: 0 u16 protocol version, 2 u16 0, 4 i32 rank, 8 u64 epoch, 16 nonce[32],
 *     48 u64 receive window (bytes), 56 u16 instance id length, id, u16 model identity
 *     length, identity. Version and rank keep their offsets in every version.
 *   AUTH: 0 u8 proof length (0 or 32), proof.   OK: empty.   REJECT: reason bytes.
 * Every field is checked on receipt; a frame that fails any check (magic, version,
 * header CRC, unknown type or flag, length over max_payload, sizes that do not add up
 * to the payload length, a field out of range, a payload CRC mismatch) closes the
 * connection with a logged error and the reason in dp_error; nothing larger than
 * max_payload is ever allocated for a frame.
 *
 * Threads. Each open connection has one I/O thread that owns the non-blocking socket
 * and runs a poll loop over it and a wake-up pipe: it writes queued frames, reads and
 * decodes incoming ones into the receive queue, sends a HEARTBEAT every heartbeat_ms
 * and declares the peer dead after dead_ms without a byte from it. Reading and writing
 * never wait for each other, and the thread never waits for the caller, so compute
 * cannot starve heartbeats and a slow peer cannot block compute: the caller only
 * copies a frame into (or out of) a bounded queue under a short lock. One thread per
 * connection (a runner has at most two) rather than one shared poll thread keeps each
 * connection's failure and flow control independent. Two shortcuts for a tensor rank's
 * exchanges, where each wake-up of a sleeping thread costs more than the frame: a data
 * frame that finds nothing queued or being written before it is sealed and written by
 * the caller's dp_send_* itself (non-blocking; the I/O thread writes what the socket did
 * not take), and dp_recv_spin reads the socket in the caller's thread for a bounded time
 * while the I/O thread leaves the input alone. One writer and one reader at a time: each
 * holds its own lock, so the nonces follow the order on the wire.
 *
 * Flow control. Each side announces a receive window W (recv_queue_bytes) in its HELLO
 * and grants credit as its reader takes frames (CREDIT, once a quarter of W has been
 * taken). A data frame of s bytes leaves the send queue only while the bytes sent and
 * not yet credited, U, satisfy U + s <= W or U < W/4 (so frames larger than W still
 * pass); a peer that sends beyond that is cut off. The I/O thread therefore always
 * reads its socket: the kernel buffers never fill behind a slow reader (which would
 * let TCP_USER_TIMEOUT kill a healthy link), heartbeats are always heard, and the
 * receive queue holds at most max(W, W/4 + max_payload) bytes of frames (decoded
 * F16/BF16/Q8_0 activations take up to 4x their wire size). The send queue holds at
 * most send_queue_bytes (a frame is admitted when it fits, or when the queue is
 * empty, so frames up to max_payload always pass). At most max_inflight ACTIVATIONS
 * frames may be outstanding: a slot is taken by dp_send_activations and released when
 * a RESULT with the same step arrives on this connection (chain topology) or by
 * dp_inflight_done (ring topology, where results come back on another connection).
 * With max_inflight = the number of stages, no rank of the ring ever waits on a full
 * peer for long, so the ring cannot deadlock.
 *
 * Dead peers: a socket error or EOF (a process that exits or is killed) ends the
 * connection at once; a lost link or a hung process is caught by heartbeat silence
 * (dead_ms, 3 s), and the kernel ends it too by TCP_USER_TIMEOUT (user_timeout_ms of
 * unacknowledged data) and keepalive (1 s idle, 1 s interval, 3 probes).
 *
 * Ownership: dp_connect and dp_accept return a connection the caller releases with
 * dp_close. Strings of struct dp_config are copied. Frames from dp_recv point into the
 * connection and stay valid until the next dp_recv or dp_close on it. dp_send_* may be
 * called from any thread; dp_recv from one thread at a time; dp_close when no other
 * call on the connection is running. */
#ifndef CAIRN_RUNNER_DATAPLANE_H
#define CAIRN_RUNNER_DATAPLANE_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DP_MAGIC 0x46504443u          /* bytes "CDPF" */
#define DP_WIRE_VERSION 1             /* frame header layout */
#define DP_PROTO_VERSION 1            /* handshake and payload layouts */
#define DP_HDR_SIZE 20
#define DP_ID_MAX 128                 /* instance id and model identity: 1..128 printable ASCII bytes */
#define DP_NONCE_BYTES 32
#define DP_PROOF_BYTES 32
#define DP_REASON_MAX 512             /* REJECT, GOODBYE and RESULT messages (longer ones are cut) */
#define DP_HANDSHAKE_MAX 1024         /* largest handshake payload */
#define DP_MAX_TOKENS (1 << 20)       /* tokens per ACTIVATIONS / entries per RESULT */
#define DP_MAX_EMBD (1 << 20)
#define DP_MAX_VOCAB (1 << 24)
#define DP_MAX_CTL_OPS (1 << 16)
#define DP_MAX_TOP 20                 /* top log-probabilities per sampled row */
#define DP_MAX_BIAS (1 << 24)         /* logit bias entries per ask (as many as a vocabulary) */
#define DP_MAX_HIST (1 << 24)         /* penalty window tokens per ask */
#define DP_TOKEN_ERR_MIN (-1000)      /* a sampled token below 0 is a CAIRN_E* code above this */
#define DP_MAX_PAYLOAD_DEFAULT ((size_t)128 << 20)
#define DP_MAX_PAYLOAD_LIMIT ((size_t)1 << 31)
#define DP_QUEUE_BYTES_DEFAULT ((size_t)32 << 20)
#define DP_MIN_WINDOW ((size_t)64 << 10)    /* smallest receive queue (flow-control window) */
#define DP_MAX_WINDOW ((size_t)1 << 34)
#define DP_HEARTBEAT_MS_DEFAULT 500
#define DP_DEAD_MS_DEFAULT 3000
#define DP_USER_TIMEOUT_MS_DEFAULT 5000
#define DP_HANDSHAKE_MS_DEFAULT 5000
#define DP_CLOSE_LINGER_MS_DEFAULT 1000

enum dp_type {
    DP_T_HELLO = 1,
    DP_T_AUTH = 2,
    DP_T_OK = 3,
    DP_T_REJECT = 4,
    DP_T_HEARTBEAT = 5,
    DP_T_GOODBYE = 6,
    DP_T_CREDIT = 7,
    DP_T_ACTIVATIONS = 16,
    DP_T_RESULT = 17,
    DP_T_CONTROL = 18,
};

#define DP_F_PAYLOAD_CRC 0x0001u
#define DP_F_SEALED 0x0002u   /* payload encrypted, DP_SEAL_TAG bytes of tag after it (in len) */
#define DP_F_KNOWN (DP_F_PAYLOAD_CRC | DP_F_SEALED)
#define DP_SEAL_TAG 16        /* Poly1305 */

/* A frame header as dp_hdr_pack writes it and dp_hdr_parse reads it. */
struct dp_hdr {
    uint8_t version;
    uint8_t type;
    uint16_t flags;
    uint32_t len;         /* payload bytes */
    uint32_t payload_crc; /* with DP_F_PAYLOAD_CRC */
};

/* Writes a header (magic, the fields, header CRC) into out. */
void dp_hdr_pack(uint8_t out[DP_HDR_SIZE], const struct dp_hdr *h);
/* Reads and checks a header: magic, header CRC, version, type, flags, and a length up
 * to max_payload (handshake types: DP_HANDSHAKE_MAX). Returns 0 or CAIRN_EFORMAT with
 * the reason. Allocates nothing. */
int dp_hdr_parse(const uint8_t in[DP_HDR_SIZE], struct dp_hdr *h, size_t max_payload, char *err,
                 size_t errlen);
/* CRC32C (Castagnoli) of buf, continuing from crc (0 to start). */
uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len);

/* ---- frames as the caller sees them ---- */

/* What the last rank returns for one wanted token. */
enum dp_row_need {
    DP_ROW_LOGITS = 1, /* its row of logits */
    DP_ROW_SAMPLE = 2, /* a token sampled there with the ask's parameters */
    DP_ROW_SKIP = 3,   /* nothing (rank 0 will not read it) */
};

/* One wanted token's ask, in its wire layout: for SAMPLE the sampler's parameters
 * (engine/sample.h, seed already the sequence's), the position drawn and how many top
 * log-probabilities to return (-1: none, not even the token's); n_bias entries of logit
 * bias and the n_hist tokens of the penalty window follow in the frame. LOGITS and
 * SKIP asks have every other field 0. Checked on send and receipt: need, n_top in
 * -1..DP_MAX_TOP, pos >= 0, temperature not NaN, top_p in (0, 1], min_p in [0, 1],
 * repeat_penalty finite and > 0, presence and frequency penalties finite,
 * penalty_last_n >= -1, n_bias <= DP_MAX_BIAS, n_hist <= DP_MAX_HIST, bias tokens and
 * window tokens >= 0, biases not NaN. */
struct dp_ask {
    uint32_t need;      /* enum dp_row_need */
    int32_t n_top;
    int64_t pos;
    uint64_t seed;
    float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int32_t top_k, penalty_last_n;
    uint32_t n_bias, n_hist;
};
static_assert(sizeof(struct dp_ask) == 64, "dp_ask is its wire layout");

struct dp_bias {
    int32_t token;
    float bias;
};
static_assert(sizeof(struct dp_bias) == 8, "dp_bias is its wire layout");

/* A micro-batch's activations. On send, x is n x n_embd F32 and wire_dtype says how
 * they travel (DT_F32, DT_F16, DT_BF16, DT_Q8_0; 0 is DT_F32); want may be NULL (all
 * tokens). On receive, x is always F32 (decoded), wire_dtype is how they travelled and
 * want is never NULL. With asks (n_asks = the number of wanted tokens), the last rank
 * answers each wanted token as its ask says (a SAMPLED RESULT); without, with logits
 * rows. */
struct dp_activations {
    uint64_t step;
    int n;
    int n_embd;
    int wire_dtype;
    const int32_t *seq;  /* n, >= 0 */
    const int64_t *pos;  /* n, >= 0 */
    const uint8_t *want; /* n, 0 or 1: logits wanted for this token */
    const float *x;      /* n x n_embd */
    int n_asks;                 /* 0 or the wanted tokens */
    const struct dp_ask *asks;  /* n_asks */
    const struct dp_bias *bias; /* the SAMPLE asks' bias entries, ask after ask */
    const int32_t *hist;        /* the SAMPLE asks' windows, ask after ask */
};

enum dp_result_kind { DP_RESULT_TOKENS = 1, DP_RESULT_LOGITS = 2, DP_RESULT_SAMPLED = 3 };

/* What the last rank sends back for a step: one entry per token whose logits were
 * wanted: the sampled token and its log-probability (TOKENS), a row of logits
 * (LOGITS), or what each token's ask asked for (SAMPLED). A status < 0 says the step
 * failed on some rank (message says why; n may be 0). */
struct dp_result {
    uint64_t step;
    int n;
    enum dp_result_kind kind;
    int n_vocab;            /* LOGITS, SAMPLED */
    int status;
    const char *message;    /* NUL-terminated, "" when none */
    const int32_t *seq;     /* n */
    const int64_t *pos;     /* n */
    const int32_t *token;   /* TOKENS: n, >= 0; SAMPLED: n_sampled, >= 0 or a sampler's
                               error code (DP_TOKEN_ERR_MIN < token < 0, n_top 0) */
    const float *logprob;   /* TOKENS: n; SAMPLED: n_sampled */
    const float *logits;    /* LOGITS: n x n_vocab; SAMPLED: n_logits x n_vocab */
    /* SAMPLED. On send the counts are derived from need; on receipt they are set. */
    const uint8_t *need;        /* n, enum dp_row_need */
    int n_sampled, n_logits, n_tops;
    const float *prob;          /* n_sampled */
    const int32_t *n_top;       /* n_sampled, 0..DP_MAX_TOP */
    const int32_t *top_token;   /* n_tops (the sum of n_top), >= 0 */
    const float *top_logprob;   /* n_tops */
};

/* Bytes a RESULT takes on the wire, header included (its counts as dp_send_result
 * derives them); 0 when it is malformed. */
uint64_t dp_result_wire_bytes(const struct dp_result *r);

/* KV bookkeeping every rank applies to its own cache, in order with the activations. */
enum dp_ctl_op {
    DP_CTL_CLEAR = 1,     /* drop all positions of seq */
    DP_CTL_TRUNCATE = 2,  /* drop positions >= pos of seq */
    DP_CTL_CANCEL = 3,    /* seq was cancelled: discard its pending work, then clear it */
    DP_CTL_FORK = 4,      /* seq2 (empty) shares seq's positions (kv_fork) */
    DP_CTL_CLEAR_ALL = 5, /* drop every sequence */
    DP_CTL_PREPARE = 6,   /* seq gets room for positions [pos, pos + seq2) (kv_prepare), so a
                             mirrored cache takes the same blocks in the same order */
};

struct dp_ctl {
    uint32_t op;        /* enum dp_ctl_op */
    int32_t seq;        /* >= 0 (CLEAR_ALL: 0) */
    int32_t seq2;       /* FORK: destination, >= 0; PREPARE: positions, >= 0; otherwise 0 */
    uint32_t reserved;  /* 0 */
    int64_t pos;        /* TRUNCATE, PREPARE: >= 0; otherwise 0 */
};
static_assert(sizeof(struct dp_ctl) == 24, "dp_ctl is its wire layout");

struct dp_control {
    uint64_t step;
    int n;
    const struct dp_ctl *ops;
};

struct dp_goodbye {
    int code;
    const char *reason; /* NUL-terminated */
};

/* A frame from dp_recv; only the member of its type is set. */
struct dp_frame {
    enum dp_type type; /* ACTIVATIONS, RESULT, CONTROL or GOODBYE */
    union {
        struct dp_activations act;
        struct dp_result res;
        struct dp_control ctl;
        struct dp_goodbye bye;
    };
};

/* ---- connections ---- */

struct dp_config {
    const char *instance_id; /* required, copied */
    uint64_t epoch;
    const char *model_id;    /* model identity (file SHA-256 hex, or any identity string), required */
    const char *secret;      /* cluster secret; NULL or "" = none */
    int rank;                /* ours, >= 0 */
    int peer_rank;           /* the rank the peer must have; -1 = any */
    int max_inflight;        /* ACTIVATIONS frames without a result; 0 = no count limit */
    size_t max_payload;      /* largest frame payload accepted or sent; 0 = default */
    size_t send_queue_bytes; /* 0 = default */
    size_t recv_queue_bytes; /* our flow-control window; 0 = default, else >= DP_MIN_WINDOW */
    int heartbeat_ms;        /* 0 = default (500) */
    int dead_ms;             /* peer dead after this much silence; 0 = default (3000) */
    int user_timeout_ms;     /* TCP_USER_TIMEOUT; 0 = default (5000) */
    int handshake_ms;        /* handshake deadline; 0 = default (5000) */
    int close_linger_ms;     /* dp_close waits this long to flush; 0 = default (1000) */
    bool payload_crc;        /* send a CRC32C of each payload (checked whenever present) */
    /* Benchmarks: each data frame leaves no sooner than this long after it was queued, as
     * over a link with this one-way delay (where tc netem is not at hand); 0 = none. */
    int emulate_delay_us;    /* 0..1000000 */
    uint16_t proto_version;  /* 0 = DP_PROTO_VERSION (tests announce others) */
    /* Called by the I/O thread, without any lock held, after a frame was queued for
     * dp_recv or the connection ended; must be quick and must not call dp_close. A
     * caller waiting on several connections uses it to wake one condition variable. */
    void (*notify)(void *arg);
    void *notify_arg;
};

struct dp_stats {
    uint64_t frames_sent, frames_received;   /* every type, heartbeats included */
    uint64_t bytes_sent, bytes_received;     /* on the wire, headers included */
    uint64_t sealed_bytes_sent;              /* of bytes_sent, in sealed frames (a cluster secret) */
    uint64_t activations_sent, activations_received;
    uint64_t results_sent, results_received;
    uint64_t controls_sent, controls_received;
    uint64_t heartbeats_sent, heartbeats_received;
    int64_t send_wait_us;   /* callers waited in dp_send_* for queue room or an in-flight slot */
    int64_t recv_wait_us;   /* callers waited in dp_recv for a frame */
    uint64_t spin_looks;    /* times dp_recv_spin looked for a frame without blocking */
    int64_t queue_us;       /* data frames, summed: from queued to last byte handed to the kernel */
    int64_t credit_wait_us; /* time a queued frame waited for the peer's window (its reader is behind) */
    uint64_t steps_done;    /* ACTIVATIONS whose slot was released by a RESULT or dp_inflight_done */
    int64_t step_rtt_us;    /* summed over steps_done: dp_send_activations to release */
    int64_t step_rtt_max_us;
    int64_t hb_rtt_us;      /* last heartbeat round trip (wire and both I/O threads); -1 before one */
    int64_t hb_rtt_min_us;  /* -1 before one */
    int inflight;
    size_t send_queued, recv_queued; /* bytes now */
};

struct dp_listener;
struct dp_conn;

/* Listens on bind_addr (numeric IPv4/IPv6 or a host name; NULL = every IPv4 address)
 * and port (0 = ephemeral, see dp_listener_port). Caller releases with
 * dp_listener_close. */
int dp_listen(struct dp_listener **out, const char *bind_addr, int port, char *err, size_t errlen);
int dp_listener_port(const struct dp_listener *l);
void dp_listener_close(struct dp_listener *l); /* accepts NULL */

/* Waits up to timeout_ms (-1: no limit) for one connection and runs the handshake with
 * it. Returns 1 with *out set, 0 when none came in time, or a negative code when the
 * handshake failed (CAIRN_EIO: refused or broken, err says why); the listener stays
 * usable either way. */
int dp_accept(struct dp_listener *l, const struct dp_config *cfg, int timeout_ms, struct dp_conn **out,
              char *err, size_t errlen);

/* Connects to host:port and runs the handshake, retrying a refused or unreachable
 * connection every 100 ms until timeout_ms has passed (the next rank may not listen
 * yet; timeout_ms <= 0: one attempt); the handshake then has handshake_ms. Returns 0 with *out set, CAIRN_EINVAL for a bad config, or CAIRN_EIO (err
 * says why: timed out, refused by the handshake with the reason, ...). */
int dp_connect(struct dp_conn **out, const char *host, int port, const struct dp_config *cfg,
               int timeout_ms, char *err, size_t errlen);

/* Queue a frame. The data is copied (and encoded) before they return. timeout_ms: 0 =
 * never wait, > 0 = wait up to that for room (and, for activations, an in-flight slot),
 * -1 = wait until there is room or the connection ends. Returns 0, CAIRN_EFULL when no
 * room came in time, CAIRN_EIO when the connection has ended (err: why), CAIRN_EINVAL
 * for a malformed frame or one over max_payload, CAIRN_ENOMEM. */
int dp_send_activations(struct dp_conn *c, const struct dp_activations *a, int timeout_ms, char *err,
                        size_t errlen);
int dp_send_result(struct dp_conn *c, const struct dp_result *r, int timeout_ms, char *err,
                   size_t errlen);
int dp_send_control(struct dp_conn *c, const struct dp_control *ctl, int timeout_ms, char *err,
                    size_t errlen);

/* Releases the in-flight slot of the ACTIVATIONS frame with this step (ring topology,
 * where its RESULT arrives on another connection). Returns 0 or CAIRN_ENOTFOUND. */
int dp_inflight_done(struct dp_conn *c, uint64_t step);

/* Waits up to timeout_ms (0: poll, -1: no limit) for the next frame. Returns 1 with *f
 * filled (valid until the next dp_recv or dp_close), 0 on timeout, or CAIRN_EIO once
 * the connection has ended and every frame received before the end was returned (err
 * says why: peer closed, silent, bad frame, ...). A GOODBYE is returned as a frame; the
 * call after it returns CAIRN_EIO. */
int dp_recv(struct dp_conn *c, struct dp_frame *f, int timeout_ms, char *err, size_t errlen);

/* dp_recv for a caller in the middle of a step that expects the frame soon (a tensor
 * rank's exchange): for up to spin_us it reads the socket itself without blocking
 * (yielding the core between looks), so that neither an arriving frame nor the answer
 * wakes a sleeping thread; then it blocks as dp_recv does for the rest of timeout_ms.
 * spin_us <= 0 is dp_recv. An idle caller (waiting for work) must use dp_recv. */
int dp_recv_spin(struct dp_conn *c, struct dp_frame *f, int spin_us, int timeout_ms, char *err, size_t errlen);

/* True while the connection is open and the peer has been heard from within dead_ms. */
bool dp_peer_alive(const struct dp_conn *c);
/* Why the connection ended ("" while open); the pointer stays valid until dp_close. */
const char *dp_error(const struct dp_conn *c);
/* The peer's rank, and its address as "ip:port". */
int dp_peer_rank(const struct dp_conn *c);
const char *dp_peer_addr(const struct dp_conn *c);
void dp_get_stats(const struct dp_conn *c, struct dp_stats *out);

/* Sends what is queued and a GOODBYE carrying reason (NULL: "closed"), waits up to
 * close_linger_ms for them to leave, closes the socket, joins the I/O thread and frees
 * the connection. Accepts NULL. */
void dp_close(struct dp_conn *c, const char *reason);

/* ---- wire encodings of activations ---- */

struct dp_enc_error {
    double max_abs;       /* max |decoded - x| */
    double max_rel;       /* max |decoded - x| / |x| over x != 0 */
    double max_rel_block; /* max over blocks of 32 of (max |decoded - x| / max |x|) */
    double rms_rel;       /* sqrt(sum (decoded - x)^2 / sum x^2) */
};

/* Bytes n floats take on the wire in dtype (DT_F32, DT_F16, DT_BF16, DT_Q8_0 with n a
 * multiple of 32), or -1. */
int64_t dp_wire_bytes(int dtype, int64_t n);
/* Encodes n floats to dtype and back and measures the error in float64 (for the
 * accuracy report). Returns 0, CAIRN_EINVAL (dtype, n) or CAIRN_ENOMEM. */
int dp_encoding_error(int dtype, const float *x, int64_t n, struct dp_enc_error *out);

#endif
