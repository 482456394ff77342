/* Who is master: a bully-style election over the link's peers, as a state machine
 * driven by the node (peer up/down, messages, claims seen in events, a clock), so tests
 * run whole clusters of it on a fake network and a fake clock.
 *
 * Ballots rank by (force, incumbent, seniority, node id): a --force-master node first,
 * then the master of the previous term, then the node up the longest (the earliest
 * wall-clock start, a fixed number every node compares alike), then the greatest id.
 *
 * - Starting: a node listens for settle_ms. A master's own status (or events) makes it
 *   a follower at once: joining never deposes a working master (sticky leadership).
 *   Hearing nobody, it campaigns.
 * - Campaign for term T+1 (T the highest term seen): the node sends its ballot to every
 *   peer; a node that receives a ballot for a higher term joins with its own. After
 *   campaign_ms each decides: the best ballot among its own and those of peers still
 *   up. The winner becomes master of that term; the others follow it, and give it up
 *   when it does not claim the term within confirm_ms.
 * - A follower whose master goes down (link PEER_DOWN or silence) campaigns at once. A
 *   --force-master node following a master without the flag campaigns (it wins).
 * - Claims: a master's status, or an event it sends, claims its term. A claim for a
 *   newer term, or for the current one while undecided, is followed at once. Two
 *   masters of one term (split views): the lower-ranked steps down, the higher moves
 *   to the next term, so the two never number events alike.
 *
 * Messages (LINK_T_ELECTION, JSON): {"type": "status", "term", "master": id|null,
 * "force", "since_ms"} every status_ms and to each peer that comes up;
 * {"type": "ballot", "term", "force", "incumbent", "since_ms"} while campaigning.
 * Not thread-safe: the node thread drives it. */
#ifndef CAIRN_CTL_ELECTION_H
#define CAIRN_CTL_ELECTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/ids.h"

#define ELECTION_SETTLE_MS 1500
#define ELECTION_CAMPAIGN_MS 1000
#define ELECTION_STATUS_MS 1000
#define ELECTION_CONFIRM_MS 3000
#define ELECTION_MAX_PEERS 1024

enum election_role {
    ELECTION_STARTING,  /* listening for a master */
    ELECTION_CANDIDATE, /* campaigning for term */
    ELECTION_FOLLOWER,  /* master names the master of term */
    ELECTION_MASTER     /* this node is master of term */
};

/* Sends a message (JSON text) to peer `to`, or to every peer up when to is NULL. */
typedef void (*election_send_fn)(void *ctx, const char *to, const char *json, size_t len);

struct election_config {
    const char *node_id;   /* required, copied */
    bool force_master;
    int64_t since_ms;      /* wall-clock ms when this node started (its seniority) */
    int64_t term;          /* highest term known at start (from the log), >= 0 */
    int settle_ms, campaign_ms, status_ms, confirm_ms; /* 0 = the defaults above */
    election_send_fn send; /* required */
    void *send_ctx;
};

struct election;

/* Creates an election starting at now_ms (a monotonic clock in ms); *out owned by the
 * caller (election_release). CAIRN_EINVAL on a bad config, CAIRN_ENOMEM. */
int election_create(struct election **out, const struct election_config *cfg, int64_t now_ms,
                    char *err, size_t errlen);

/* Frees e; accepts NULL. */
void election_release(struct election *e);

/* The link says peer came up / went down. Up sends it our status. */
void election_peer_up(struct election *e, const char *peer, int64_t now_ms);
void election_peer_down(struct election *e, const char *peer, int64_t now_ms);

/* A LINK_T_ELECTION message from peer, parsed (types other than status and ballot are
 * not the election's: CAIRN_ENOTFOUND). CAIRN_EFORMAT naming the field when malformed. */
int election_receive(struct election *e, const char *from, const json_t *msg, int64_t now_ms,
                     char *err, size_t errlen);

/* peer sent an event of term (only a master sends events): a claim to that term. */
void election_claim(struct election *e, const char *peer, int64_t term, int64_t now_ms);

/* Runs the timers: settle, campaign deadline, confirmation, status broadcasts. */
void election_tick(struct election *e, int64_t now_ms);

/* Milliseconds until election_tick has something to do (0 when due). */
int64_t election_due_ms(const struct election *e, int64_t now_ms);

enum election_role election_role(const struct election *e);
/* The current term (0 before any). */
int64_t election_term(const struct election *e);
/* The master of the current term ("" when none); valid until the next call on e. */
const char *election_master(const struct election *e);
/* True when the master has claimed the term (always for ourselves). */
bool election_confirmed(const struct election *e);

/* Static name of a role ("starting", "candidate", "follower", "master"). */
const char *election_role_name(enum election_role r);

#endif
