/* Private to the data plane (dataplane.h), shared by its three files and included by
 * no other: dataplane_wire.c (frame layouts: headers, CRC32C, encoding and checking
 * every frame type, HELLO and AUTH payloads), dataplane_open.c (sockets, the
 * handshake, dp_listen / dp_accept / dp_connect) and dataplane.c (a connection: its
 * I/O thread, queues, flow control, dp_send_* / dp_recv / dp_close). */
#ifndef CAIRN_RUNNER_DATAPLANE_INT_H
#define CAIRN_RUNNER_DATAPLANE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runner/dataplane.h"

#define DP_BYE_FIXED 8 /* GOODBYE bytes before the reason */
/* The largest frame the I/O thread builds itself (HEARTBEAT, CREDIT, GOODBYE). */
#define DP_IBUF_SIZE (DP_HDR_SIZE + DP_BYE_FIXED + DP_REASON_MAX)

/* ---- frame types ---- */

/* True for ACTIVATIONS, RESULT and CONTROL: the frames that count against the
 * receiver's flow-control window. */
bool dp_type_is_data(int type);
/* True for HELLO, AUTH, OK and REJECT. */
bool dp_type_is_handshake(int type);
/* The type's name for messages ("ACTIVATIONS"); "unknown" for other values. */
const char *dp_type_name(int type);

/* ---- frames the connection builds or consumes itself ---- */

/* Writes a whole HEARTBEAT (header and payload) into buf, of DP_IBUF_SIZE bytes: our
 * clock, the peer's clock from its last heartbeat (0: none) and how long ago that came.
 * Returns the frame's size. */
size_t dp_pack_heartbeat(uint8_t *buf, uint64_t now, uint64_t peer_clock, uint64_t age);
/* Reads a HEARTBEAT payload of len bytes (the peer's clock, the echo of ours and its
 * age); false when it has the wrong size. */
bool dp_parse_heartbeat(const uint8_t *p, size_t len, uint64_t *sent, uint64_t *echo, uint64_t *age);
/* Writes a whole CREDIT for consumed bytes into buf (DP_IBUF_SIZE bytes); returns its size. */
size_t dp_pack_credit(uint8_t *buf, uint64_t consumed);
/* Reads a CREDIT payload of len bytes; false (and *consumed 0) when it has the wrong size. */
bool dp_parse_credit(const uint8_t *p, size_t len, uint64_t *consumed);
/* Writes a whole GOODBYE into buf (DP_IBUF_SIZE bytes), the reason cut at
 * DP_REASON_MAX bytes; returns its size. */
size_t dp_pack_goodbye(uint8_t *buf, int code, const char *reason);

/* ---- frames the caller sends and receives ---- */

/* A received payload, decoded: view points into the payload, which must stay in place
 * as long as view is used, and into x and text, which the holder frees. */
struct dp_decoded {
    struct dp_frame view;
    float *x;       /* ACTIVATIONS that travelled in another type than F32, decoded */
    size_t x_bytes; /* allocated for x */
    char *text;     /* RESULT message, GOODBYE reason: NUL-terminated, no control bytes */
};

/* Decodes a payload of len bytes (8-aligned) of type ACTIVATIONS, RESULT, CONTROL or
 * GOODBYE into d (zeroed by the caller), checking every field (dataplane.h). Returns 0,
 * CAIRN_EFORMAT with the reason in why (any other type included), or CAIRN_ENOMEM. */
int dp_decode(int type, const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl);

/* An ACTIVATIONS payload's layout, from dp_act_layout, for dp_encode_act. */
struct dp_act_enc {
    const struct dp_activations *a;
    int dt;                    /* wire dtype */
    size_t len;                /* payload bytes */
    size_t off;                /* values: after pos, seq, want and padding */
    size_t vals_end, asks_off; /* asks: after the values, 8-aligned */
    uint64_t n_bias, n_hist;
};

/* Checks a as dp_send_activations promises (not against max_payload) and lays it out
 * in e, which keeps pointing at a. CAIRN_EINVAL with the reason in err. */
int dp_act_layout(const struct dp_activations *a, struct dp_act_enc *e, char *err, size_t errlen);
/* Writes the payload of e (a struct dp_act_enc *) into p, of e->len bytes. */
void dp_encode_act(uint8_t *p, const void *e);

/* A RESULT payload's layout, from dp_result_layout, for dp_encode_result. */
struct dp_res_enc {
    const struct dp_result *r;
    size_t len;          /* payload bytes */
    size_t ml, off;      /* message bytes; where the entries start */
    uint64_t ns, nt, nl; /* SAMPLED: tokens, top entries, logits rows */
};

/* Checks r as dp_send_result promises (not against max_payload) and lays it out in e,
 * which keeps pointing at r. CAIRN_EINVAL with the reason in err. */
int dp_result_layout(const struct dp_result *r, struct dp_res_enc *e, char *err, size_t errlen);
/* Writes the payload of e (a struct dp_res_enc *) into p, of e->len bytes. */
void dp_encode_result(uint8_t *p, const void *e);

/* Checks ctl as dp_send_control promises and sets *len to its payload size.
 * CAIRN_EINVAL with the reason in err. */
int dp_control_layout(const struct dp_control *ctl, size_t *len, char *err, size_t errlen);
/* Writes the payload of ctl (a struct dp_control *) into p. */
void dp_encode_control(uint8_t *p, const void *ctl);

/* ---- handshake payloads ---- */

/* A HELLO's fields. */
struct dp_hello {
    uint16_t version;
    int32_t rank;
    uint64_t epoch;
    uint8_t nonce[DP_NONCE_BYTES];
    uint64_t window; /* bytes of data frames the sender of the HELLO will buffer */
    char instance[DP_ID_MAX + 1];
    char model[DP_ID_MAX + 1];
};

/* Both HELLO payloads as sent, which the AUTH proofs cover. */
struct dp_hellos {
    const uint8_t *c, *a; /* the connector's, the acceptor's */
    size_t len_c, len_a;
};

/* True when s (len bytes) is an instance id or model identity: 1..DP_ID_MAX printable
 * ASCII bytes. */
bool dp_valid_id(const char *s, size_t len);
/* Writes h's payload into out (DP_HANDSHAKE_MAX bytes); returns its size. */
size_t dp_hello_pack(const struct dp_hello *h, uint8_t *out);
/* Reads a HELLO payload: the version and rank (stable across versions), and the rest
 * only when the version is ours (else *version_only). CAIRN_EFORMAT with the reason. */
int dp_hello_parse(const uint8_t *p, size_t len, struct dp_hello *h, bool *version_only, char *why,
                   size_t whylen);
/* Checks the peer's HELLO against ours (want_rank -1: any); false with the mismatch,
 * naming both sides' values, in why. */
bool dp_hello_matches(const struct dp_hello *me, const struct dp_hello *peer, int want_rank, char *why,
                      size_t whylen);
/* Writes our AUTH payload into out: the proof of secret (NULL: none, an empty proof)
 * over both HELLOs in the role of connector or acceptor. Returns its size. */
size_t dp_auth_pack(const char *secret, bool connector, const struct dp_hellos *hs,
                    uint8_t out[1 + DP_PROOF_BYTES]);
/* True when an AUTH payload of len bytes is well formed (a proof of 0 or 32 bytes). */
bool dp_auth_wellformed(const uint8_t *p, size_t len);
/* Checks the peer's well-formed AUTH payload p against our secret (NULL: none); the
 * peer is the connector when we are not. False with the mismatch in why. */
bool dp_auth_verify(const char *secret, bool connector, const struct dp_hellos *hs, const uint8_t *p,
                    int rank, int peer_rank, char *why, size_t whylen);

/* The keyed MAC (HMAC-SHA256 with secret) over label (with its NUL), a role byte and
 * both HELLO payloads: the AUTH proofs and the sealing keys. */
void dp_hellos_mac(const char *secret, const char *label, uint8_t role, const struct dp_hellos *hs,
                   uint8_t out[DP_PROOF_BYTES]);

/* ---- sealing (dataplane_seal.c) ---- */

/* One direction of a sealed connection: its key and how many frames it has sealed or
 * opened (the nonce of the next one). */
struct dp_seal_dir {
    uint8_t key[32];
    uint64_t n;
    void *evp; /* OpenSSL's cipher context for key, made at first use (NULL: none yet) */
};

/* Both directions' keys of a connection whose handshake proved secret: distinct per
 * direction and per connection (both HELLOs carry fresh nonces), so counting frames from
 * 0 never repeats a nonce under a key. */
void dp_seal_keys(const char *secret, const struct dp_hellos *hs, bool connector, struct dp_seal_dir *tx,
                  struct dp_seal_dir *rx);
/* Frees what sealing or opening made for d (its key stays). Accepts one never used. */
void dp_seal_release(struct dp_seal_dir *d);
/* Seals a whole frame in place: frame holds a header and plain_len payload bytes, with
 * DP_SEAL_TAG bytes of room after them. The header is rewritten (DP_F_SEALED, no
 * checksum, the length with the tag) and authenticated; the payload is encrypted.
 * Returns the frame's new size. */
size_t dp_seal_frame(struct dp_seal_dir *tx, uint8_t *frame, size_t plain_len);
/* Opens a sealed payload of len bytes (tag included) in place, hdr being the frame's
 * header as received. Returns the plain length, or -1 when the frame is not the next
 * one sealed by the peer with its key (forged, altered, replayed, reordered). */
long dp_open_frame(struct dp_seal_dir *rx, const uint8_t hdr[DP_HDR_SIZE], uint8_t *payload, size_t len);

/* ---- between dataplane_open.c and dataplane.c ---- */

/* Starts a connection on fd, whose handshake is done: takes fd on success only (the
 * caller closes it otherwise), copies what it needs of cfg, starts the I/O thread.
 * seal: the send and receive keys when the handshake proved a secret, else NULL.
 * peer_addr names the peer in logs. Returns 0, CAIRN_ENOMEM or CAIRN_EIO. */
int dp_conn_start(struct dp_conn **out, int fd, const struct dp_config *cfg, bool connector, int peer_rank,
                  uint64_t peer_window, const struct dp_seal_dir seal[2], const char *peer_addr, char *err,
                  size_t errlen);

#endif
