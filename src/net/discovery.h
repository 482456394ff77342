/* LAN discovery: UDP broadcast beacons that announce a node (id, API and cluster
 * ports, namespace tag) and report the nodes heard from.
 *
 * Plain IPv4 broadcast sockets, not CZMQ's zbeacon: zbeacon takes its interface from
 * the process-wide zsys_interface() setting, beacons on the first interface only when
 * none is set, always receives on every interface, and asserts on unexpected input.
 * Here each instance has its own mode:
 *   "off"        no socket at all; nothing is sent or received;
 *   "auto"/NULL  one beacon per interval on every IPv4 interface that is up, can
 *                broadcast and is not loopback (the list is read again each round);
 *   an interface name: beacons on that interface only, and beacons that arrive on
 *                another interface are ignored.
 * One UDP socket (SO_REUSEADDR + SO_REUSEPORT, so several nodes of one machine share
 * the port) is bound to the port on every address; a beacon goes to each interface's
 * directed broadcast address, at most one per interface per interval, whatever the
 * caller does.
 *
 * Beacon (big-endian): magic "CRNB", version (1), flags (1: bit 0 = MAC present),
 * API port (2), cluster port (2), epoch (8: sender's start, ms of wall clock),
 * sequence (8: round number since start), node id length (1), namespace length (1),
 * node id, namespace, then the MAC (32) when flagged. A datagram is accepted only
 * when its size is exactly what its lengths say and every field is valid.
 *
 * With a cluster secret the MAC is crypto_auth (HMAC-SHA512-256) of everything before
 * it, under a key derived from the secret (discovery_beacon_key). A node with a secret
 * accepts only beacons with a good MAC; a node without one ignores beacons that carry
 * a MAC (it could not join that cluster anyway). A beacon must be newer than the last
 * one of its node (epoch, then sequence), so a captured beacon replayed from another
 * address cannot move a peer; a node forgotten after DISCOVERY_FORGET_MS of silence
 * starts afresh. Beacons of another namespace, our own (echoed back), and malformed
 * datagrams are ignored and counted (discovery_get_stats); nothing a datagram holds
 * can make the module fail.
 *
 * Not thread-safe: one thread uses a discovery at a time. IPv4 only. */
#ifndef CAIRN_NET_DISCOVERY_H
#define CAIRN_NET_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DISCOVERY_PORT_DEFAULT 52417
#define DISCOVERY_INTERVAL_MS_DEFAULT 1000
#define DISCOVERY_INTERVAL_MS_MIN 100
#define DISCOVERY_INTERVAL_MS_MAX 60000
#define DISCOVERY_ID_MAX 64      /* node id: ids_valid_id, 1..63 bytes */
#define DISCOVERY_NS_MAX 64      /* namespace: 0..63 printable ASCII bytes */
#define DISCOVERY_ADDR_MAX 64    /* sender address as text */
#define DISCOVERY_IFNAME_MAX 16  /* interface name, as IFNAMSIZ */
#define DISCOVERY_VERSION 1
#define DISCOVERY_HDR_SIZE 28
#define DISCOVERY_MAC_BYTES 32
#define DISCOVERY_KEY_BYTES 32
#define DISCOVERY_BEACON_MAX (DISCOVERY_HDR_SIZE + 63 + 63 + DISCOVERY_MAC_BYTES)
#define DISCOVERY_MAX_PEERS 256  /* peers remembered; the longest silent one goes first */
#define DISCOVERY_FORGET_MS 60000 /* a peer silent this long is forgotten */
#define DISCOVERY_STICKY_MS 5000 /* a peer's address changes only after this long without
                                    a newer beacon from the address we hold (or at once
                                    when the peer restarted) */
#define DISCOVERY_DRAIN_MAX 1024 /* datagrams one discovery_poll reads at most */

struct discovery_config {
    const char *node_id;  /* required, copied */
    const char *ns;       /* namespace tag; NULL = "" */
    const char *secret;   /* cluster secret; NULL or "" = beacons without MAC */
    const char *mode;     /* "off", "auto" (or NULL), or an interface name */
    int api_port;         /* 0..65535 (0: this node serves no API) */
    int cluster_port;     /* 1..65535 */
    int udp_port;         /* beacon port; 0 = DISCOVERY_PORT_DEFAULT */
    int interval_ms;      /* between beacons; 0 = DISCOVERY_INTERVAL_MS_DEFAULT, else
                             DISCOVERY_INTERVAL_MS_MIN..DISCOVERY_INTERVAL_MS_MAX */
};

enum discovery_change {
    DISCOVERY_NEW = 1,     /* first beacon of this node (or first since forgotten) */
    DISCOVERY_CHANGED,     /* its address or ports changed */
    DISCOVERY_REFRESHED,   /* heard again, same as before (at most once per interval) */
};

/* What discovery_poll reports. */
struct discovery_peer {
    enum discovery_change change;
    char node_id[DISCOVERY_ID_MAX];
    char addr[DISCOVERY_ADDR_MAX]; /* IPv4 address the beacon came from, e.g. "10.0.0.2" */
    int api_port, cluster_port;
};

struct discovery_stats {
    uint64_t sent;            /* beacons sent (one per interface per round) */
    uint64_t send_failed;     /* sends the kernel refused */
    uint64_t received;        /* datagrams read */
    uint64_t accepted;        /* valid, new beacons of peers */
    uint64_t malformed;       /* garbage: size, magic, version, flags or a field wrong */
    uint64_t unauthenticated; /* MAC missing, wrong, or present while we have no secret */
    uint64_t other_ns;        /* valid beacons of another namespace */
    uint64_t other_iface;     /* arrived on an interface other than ours (IFACE mode) */
    uint64_t own;             /* our own beacons, echoed back */
    uint64_t stale;           /* not newer than the last of that node (duplicates, replays) */
    uint64_t forgotten;       /* peers dropped for silence or to make room */
};

/* A beacon's fields as decoded or to encode. */
struct discovery_beacon {
    char node_id[DISCOVERY_ID_MAX];
    char ns[DISCOVERY_NS_MAX];
    int api_port, cluster_port;
    uint64_t epoch, seq;
};

struct discovery;

/* Validates cfg and, unless the mode is "off", opens and binds the UDP socket; nothing
 * is sent before the first discovery_poll. *out is owned by the caller
 * (discovery_release). CAIRN_EINVAL for a bad config, CAIRN_ENOTFOUND for an interface
 * that does not exist, CAIRN_EIO when the socket cannot be set up (err says why). */
int discovery_create(struct discovery **out, const struct discovery_config *cfg, char *err,
                     size_t errlen);

/* Closes the socket and frees d (wiping the key). NULL ok. */
void discovery_release(struct discovery *d);

/* Sends a beacon round when one is due and waits up to timeout_ms (>= 0) for a beacon
 * worth reporting. Returns 1 with *out filled, 0 when the time ran out, a signal
 * interrupted the wait or DISCOVERY_DRAIN_MAX datagrams were read without a report,
 * CAIRN_EINVAL for bad arguments, CAIRN_EIO when the socket fails. Call it at least
 * once per interval to keep beaconing. In "off" mode it only waits. */
int discovery_poll(struct discovery *d, int timeout_ms, struct discovery_peer *out);

/* The UDP socket, readable when beacons wait (for a caller's own poll loop), or -1 in
 * "off" mode. Owned by d. */
int discovery_fd(const struct discovery *d);

/* Milliseconds until the next beacon round is due (0: due now; -1 in "off" mode): a
 * caller polling discovery_fd in its own loop sleeps no longer than this. */
int64_t discovery_due_ms(const struct discovery *d);

/* Counters since creation. */
void discovery_get_stats(const struct discovery *d, struct discovery_stats *out);

/* The beacon MAC key for a secret (keyed BLAKE2b with a context of its own, so it
 * differs from every other key derived from the secret). CAIRN_EINVAL for a NULL or
 * empty secret, CAIRN_EIO when libsodium cannot start. */
int discovery_beacon_key(const char *secret, uint8_t key[DISCOVERY_KEY_BYTES]);

/* Writes b as a beacon into out, with a MAC when key is not NULL; *len gets its size.
 * CAIRN_EINVAL when a field is invalid (id, namespace, ports). */
int discovery_beacon_encode(const struct discovery_beacon *b, const uint8_t *key,
                            uint8_t out[DISCOVERY_BEACON_MAX], size_t *len);

/* Parses and checks a datagram of n bytes. With key, the beacon must carry a good MAC;
 * without, it must carry none. CAIRN_EFORMAT when malformed, CAIRN_EUNSUPPORTED for
 * another version, CAIRN_EINVAL when authentication fails; err says why. Reads no
 * byte past buf + n. The namespace is left to the caller. */
int discovery_beacon_decode(const void *buf, size_t n, const uint8_t *key,
                            struct discovery_beacon *out, char *err, size_t errlen);

#endif
