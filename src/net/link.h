/* Node-to-node messaging over ZeroMQ: the transport under commands (to the master),
 * indexed events (from the master to all), requests for missed events, election
 * messages and heartbeats (both ways).
 *
 * Each link binds one ROUTER socket on the node's cluster port and, for every peer it
 * is told about (link_connect), one DEALER socket to that peer's ROUTER. Either
 * direction of one connection carries messages, so two nodes need only one of them to
 * connect. A connection starts with HELLO (node id in the header, namespace and port in
 * a JSON payload) answered by WELCOME or REJECT; peers of another namespace, and a peer
 * with our own node id, are rejected there and logged. Each side then sends a heartbeat
 * every heartbeat_ms when it has sent nothing else, and declares the peer down after
 * timeout_ms of silence (ZeroMQ's own ZMTP heartbeats close dead TCP connections too).
 *
 * Wire message: exactly two frames, a LINK_HDR_SIZE header and a payload (possibly
 * empty). Header, big-endian: magic "cl" (2 bytes), version (1), type (1), payload
 * length (u32), sender node id (64 bytes, NUL-padded). A message with another frame
 * count, a short or long header, a bad magic, version, type, sender or length is
 * dropped and its sender logged; after LINK_MAX_STRIKES such messages the connection is
 * cut (ours closed; theirs shut down and its routing id ignored). The application
 * counts well-framed messages with bad payloads against the same limit (link_strike).
 * A frame over max_msg
 * makes ZeroMQ close the connection (ZMQ_MAXMSGSIZE). The link keeps serving everyone
 * else.
 *
 * With a cluster secret, every socket uses CURVE with one keypair derived from the
 * secret (link_curve_keypair; all nodes share it), and a ZAP handler of the link's own
 * (a thread on inproc://zeromq.zap.01 in the link's own ZeroMQ context) admits only
 * that public key, in ZAP domain "cairn", with ZMQ_ZAP_ENFORCE_DOMAIN set: a node with
 * another secret, or none, never completes a handshake. Each link has its own context,
 * so links of different clusters can live in one process (tests do) and CZMQ's global
 * context (discovery) is untouched. link_create calls zsys_handler_set(NULL) so CZMQ,
 * where the process uses it, never takes over SIGINT/SIGTERM.
 *
 * A link is used by one thread at a time. */
#ifndef CAIRN_NET_LINK_H
#define CAIRN_NET_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LINK_ID_MAX 64         /* node id: 1..63 bytes of printable ASCII, no space */
#define LINK_NS_MAX 64         /* namespace: 0..63 bytes */
#define LINK_ADDR_MAX 256      /* endpoint text, "tcp://host:port" */
#define LINK_HDR_SIZE 72
#define LINK_VERSION 1
#define LINK_MAX_MSG_DEFAULT ((size_t)64 << 20)
#define LINK_MAX_MSG_LIMIT ((size_t)1 << 30)
#define LINK_HEARTBEAT_MS_DEFAULT 1000
#define LINK_TIMEOUT_MS_DEFAULT 4000
#define LINK_MAX_STRIKES 5     /* malformed messages before a connection is cut */
#define LINK_MAX_ROUTES 1024   /* connections (either direction) one link keeps */
#define LINK_ZAP_DOMAIN "cairn"
#define LINK_KEY_BYTES 32      /* CURVE public/secret key */
#define LINK_NONCE_BYTES 32
#define LINK_MAC_BYTES 32

/* Message types. Those below LINK_T_APP_FIRST belong to the link and are never
 * delivered; the application may send any type in [LINK_T_APP_FIRST, LINK_T_APP_LAST],
 * and the named ones are the cluster's conventions. Other values are malformed. */
enum link_type {
    LINK_T_HELLO = 1,      /* connector -> bound side: {"namespace", "port"} */
    LINK_T_WELCOME = 2,    /* answer to HELLO: {"namespace", "port"} */
    LINK_T_REJECT = 3,     /* answer to HELLO: {"reason"}; the connector gives up */
    LINK_T_HEARTBEAT = 4,
    LINK_T_BYE = 5,        /* sender is closing: peer down now */
    LINK_T_WHO = 6,        /* "I do not know you (any more)": the connector says HELLO again */
    LINK_T_APP_FIRST = 16,
    LINK_T_COMMAND = 16,       /* node -> master: a command (JSON) */
    LINK_T_EVENT = 17,         /* master -> all: an indexed event (JSON) */
    LINK_T_EVENT_REQUEST = 18, /* node -> master: send the log since (term, index) */
    LINK_T_SNAPSHOT = 19,      /* master -> node: a state snapshot */
    LINK_T_ELECTION = 20,      /* between candidates */
    LINK_T_REPORT = 21,        /* worker -> master: what this node runs */
    LINK_T_APP_LAST = 63
};

struct link_config {
    const char *node_id;   /* required, copied */
    const char *ns;        /* namespace tag; NULL = "" */
    const char *secret;    /* cluster secret; NULL or "" = no encryption */
    const char *bind_addr; /* address to bind; NULL = every interface, IPv4 and IPv6 */
    int port;              /* cluster port; 0 = ephemeral (see link_port) */
    int heartbeat_ms;      /* 0 = LINK_HEARTBEAT_MS_DEFAULT */
    int timeout_ms;        /* peer down after this much silence; 0 = LINK_TIMEOUT_MS_DEFAULT */
    size_t max_msg;        /* largest payload; 0 = LINK_MAX_MSG_DEFAULT */
};

enum link_event {
    LINK_EV_MESSAGE = 1, /* a message from peer */
    LINK_EV_PEER_UP,     /* peer finished a handshake; it had no live connection before */
    LINK_EV_PEER_DOWN,   /* the last live connection to peer ended (bye, silence, cut) */
};

/* What link_poll returns. data points into the link and stays valid until the next
 * link_poll or link_release on it. */
struct link_msg {
    enum link_event event;
    char peer[LINK_ID_MAX];
    int type;         /* LINK_EV_MESSAGE: its type */
    const void *data; /* LINK_EV_MESSAGE: payload (not NUL-terminated) */
    size_t len;
};

struct link_peer {
    char id[LINK_ID_MAX];
    char addr[LINK_ADDR_MAX]; /* endpoint we connected to, or the IP it came from */
    int port;                 /* the cluster port it announced */
    bool outgoing, incoming;  /* a live connection we opened / it opened */
    int64_t silent_ms;        /* since we last heard from it */
};

struct link_stats {
    uint64_t sent, received;  /* application messages */
    uint64_t malformed;       /* messages dropped as malformed */
    uint64_t cut;             /* connections cut after LINK_MAX_STRIKES */
    uint64_t refused;         /* handshakes refused (namespace, own id), by us or by them */
    uint64_t auth_denied;     /* CURVE keys the ZAP handler refused */
    uint64_t handshake_failed;/* ZMTP/CURVE handshakes that failed (secret mismatch...) */
};

struct link;

/* Creates a link: validates cfg, derives keys, binds the ROUTER. *out is owned by the
 * caller (link_release). Fails with CAIRN_EINVAL on a bad config, CAIRN_EIO when the
 * port cannot be bound (err says why). */
int link_create(struct link **out, const struct link_config *cfg, char *err, size_t errlen);

/* Says BYE to every peer, closes every socket, stops the ZAP thread, frees l. NULL ok. */
void link_release(struct link *l);

/* The bound TCP port (the ephemeral one when cfg.port was 0). */
int link_port(const struct link *l);

/* Opens a connection to a peer's ROUTER ("tcp://host:port"); the peer comes up in
 * link_poll once the handshake is done, and ZeroMQ reconnects by itself. Connecting
 * twice to one endpoint is a no-op. CAIRN_EINVAL for a bad endpoint, CAIRN_EFULL past
 * LINK_MAX_ROUTES. */
int link_connect(struct link *l, const char *endpoint, char *err, size_t errlen);

/* Closes the connection opened by link_connect(endpoint); CAIRN_ENOTFOUND if none. */
int link_disconnect(struct link *l, const char *endpoint);

/* Queues a message to peer (a node id), or to every peer that is up when peer is NULL,
 * without blocking. Returns how many peers it was queued for (1 for one peer),
 * CAIRN_EINVAL for a type outside the application range or payload NULL with len > 0,
 * CAIRN_ERANGE for len > max_msg, CAIRN_ENOTFOUND when peer is not up, CAIRN_EFULL
 * when its queue is full. */
int link_send(struct link *l, const char *peer, int type, const void *payload, size_t len);

/* Runs the link (handshakes, heartbeats, timeouts) and waits up to timeout_ms (-1:
 * forever) for the next message or peer up/down notice. Returns 1 with *out filled, 0
 * when the time ran out or a signal interrupted the wait, negative on failure. */
int link_poll(struct link *l, int timeout_ms, struct link_msg *out);

/* Makes link_poll return 0 as soon as fd is readable (the caller drains it): a way for
 * other threads to wake the thread that polls, or for it to wait on a socket of its own
 * (discovery's) in the same sleep. Up to LINK_WAKE_FDS fds; slot is 0..LINK_WAKE_FDS-1,
 * fd -1 clears it. */
#define LINK_WAKE_FDS 2
void link_set_wake_fd(struct link *l, int slot, int fd);

/* Peers that are up, each once; fills at most max entries, returns how many are up. */
size_t link_peers(const struct link *l, struct link_peer *out, size_t max);

/* True when peer (a node id) is up. */
bool link_peer_up(const struct link *l, const char *peer);

/* The application found the payload of a message from peer malformed: logs why and
 * counts a strike against the connection the message came on (the one of the message
 * link_poll returned last when it is peer's; else peer's connection heard from last),
 * as for a malformed frame. At LINK_MAX_STRIKES that connection is cut, and with it
 * every other connection of peer (its handshake proved its id): peer goes down (it may
 * connect again). Call it once per message. No-op for a peer not up. */
void link_strike(struct link *l, const char *peer, const char *why);

/* Counters since creation. */
void link_get_stats(const struct link *l, struct link_stats *out);

/* Header as it travels (see the top of this file). */
struct link_hdr {
    uint8_t version, type;
    uint32_t len;
    char sender[LINK_ID_MAX];
};

/* Writes h into out; the sender must be a valid node id (it is truncated otherwise). */
void link_hdr_encode(const struct link_hdr *h, uint8_t out[LINK_HDR_SIZE]);

/* Parses a header frame of n bytes, checking its size, magic, version, type and
 * sender; CAIRN_EFORMAT with the reason in err otherwise. Does not check len. */
int link_hdr_decode(const void *buf, size_t n, struct link_hdr *out, char *err, size_t errlen);

/* True when s is a valid node id for the link (1..63 printable ASCII bytes, no space). */
bool link_valid_id(const char *s);

/* The cluster's CURVE keypair: BLAKE2b of the secret (keyed with a fixed context string)
 * seeds crypto_box_seed_keypair, so every node with the secret derives the same pair.
 * CAIRN_EINVAL for a NULL or empty secret. */
int link_curve_keypair(const char *secret, uint8_t pk[LINK_KEY_BYTES], uint8_t sk[LINK_KEY_BYTES]);

/* Fills nonce with random bytes for a challenge. */
void link_auth_nonce(uint8_t nonce[LINK_NONCE_BYTES]);

/* Proof of the secret for connections outside ZeroMQ: HMAC-SHA512-256 (crypto_auth) of
 * the peer's nonce under a key derived from the secret (distinct from the CURVE seed).
 * CAIRN_EINVAL for a NULL or empty secret. */
int link_auth_challenge(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES],
                        uint8_t mac_out[LINK_MAC_BYTES]);

/* 0 when mac proves the secret for nonce (constant-time compare), CAIRN_EINVAL when it
 * does not or the secret is NULL or empty. */
int link_auth_verify(const char *secret, const uint8_t nonce[LINK_NONCE_BYTES],
                     const uint8_t mac[LINK_MAC_BYTES]);

#endif
