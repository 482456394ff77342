/* The data plane's wire format (dataplane.h): frame headers, CRC32C, the payload of
 * every frame type, encoded from and decoded into the caller's structs with every
 * field checked, and the HELLO and AUTH payloads of the handshake. No sockets. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "base/dtype.h"
#include "base/err.h"
#include "kern/kern.h"
#include "runner/dataplane_int.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the data plane reads little-endian arrays of frames in place"
#endif

_Static_assert(crypto_auth_hmacsha256_BYTES == DP_PROOF_BYTES, "proof is one HMAC-SHA256");
_Static_assert(offsetof(struct dp_ctl, pos) == 16, "dp_ctl layout");

#define HELLO_FIXED 56             /* HELLO bytes before the id strings */
#define HB_PAYLOAD 24
#define CREDIT_PAYLOAD 8
#define ACT_FIXED 24
#define RES_FIXED 32
#define CTL_FIXED 16

static const char AUTH_LABEL[] = "cairn dataplane auth v1";

/* ---- little-endian fields ---- */

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* ---- CRC32C, four bits at a time (headers are 16 bytes; payload CRCs are optional) ---- */

static const uint32_t CRC32C_NIBBLE[16] = {
    0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1, 0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
    0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9, 0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
};

uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ CRC32C_NIBBLE[crc & 15];
        crc = (crc >> 4) ^ CRC32C_NIBBLE[crc & 15];
    }
    return ~crc;
}

/* ---- headers ---- */

void dp_hdr_pack(uint8_t out[DP_HDR_SIZE], const struct dp_hdr *h)
{
    put_u32(out, DP_MAGIC);
    out[4] = h->version;
    out[5] = h->type;
    put_u16(out + 6, h->flags);
    put_u32(out + 8, h->len);
    put_u32(out + 12, h->payload_crc);
    put_u32(out + 16, dp_crc32c(0, out, 16));
}

static bool known_type(int t)
{
    return (t >= DP_T_HELLO && t <= DP_T_CREDIT) || (t >= DP_T_ACTIVATIONS && t <= DP_T_CONTROL);
}

bool dp_type_is_data(int t) { return t >= DP_T_ACTIVATIONS && t <= DP_T_CONTROL; }

bool dp_type_is_handshake(int t) { return t >= DP_T_HELLO && t <= DP_T_REJECT; }

const char *dp_type_name(int t)
{
    switch (t) {
    case DP_T_HELLO: return "HELLO";
    case DP_T_AUTH: return "AUTH";
    case DP_T_OK: return "OK";
    case DP_T_REJECT: return "REJECT";
    case DP_T_HEARTBEAT: return "HEARTBEAT";
    case DP_T_GOODBYE: return "GOODBYE";
    case DP_T_CREDIT: return "CREDIT";
    case DP_T_ACTIVATIONS: return "ACTIVATIONS";
    case DP_T_RESULT: return "RESULT";
    case DP_T_CONTROL: return "CONTROL";
    default: return "unknown";
    }
}

int dp_hdr_parse(const uint8_t in[DP_HDR_SIZE], struct dp_hdr *h, size_t max_payload, char *err,
                 size_t errlen)
{
    uint32_t magic = get_u32(in);
    if (magic != DP_MAGIC)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad frame magic 0x%08" PRIx32, magic);
    uint32_t crc = dp_crc32c(0, in, 16);
    if (crc != get_u32(in + 16))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad frame header checksum");
    h->version = in[4];
    h->type = in[5];
    h->flags = get_u16(in + 6);
    h->len = get_u32(in + 8);
    h->payload_crc = get_u32(in + 12);
    if (h->version != DP_WIRE_VERSION)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unsupported frame version %u (ours is %d)",
                          h->version, DP_WIRE_VERSION);
    if (!known_type(h->type))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown frame type %u", h->type);
    if (h->flags & ~DP_F_KNOWN)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown frame flags 0x%04x", h->flags);
    if (!(h->flags & DP_F_PAYLOAD_CRC) && h->payload_crc)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "payload checksum set without its flag");
    bool sealed = h->flags & DP_F_SEALED;
    if (sealed && (h->flags & DP_F_PAYLOAD_CRC))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a sealed frame with a payload checksum");
    if (sealed && dp_type_is_handshake(h->type))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a sealed %s frame", dp_type_name(h->type));
    if (sealed && h->len < DP_SEAL_TAG)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a sealed frame of %" PRIu32 " bytes, shorter than its tag",
                          h->len);
    size_t limit = dp_type_is_handshake(h->type) ? DP_HANDSHAKE_MAX : max_payload;
    if (h->type == DP_T_HEARTBEAT)
        limit = HB_PAYLOAD;
    else if (h->type == DP_T_CREDIT)
        limit = CREDIT_PAYLOAD;
    if (sealed)
        limit += DP_SEAL_TAG;
    if (h->len > limit)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s payload of %" PRIu32 " bytes over the limit of %zu",
                          dp_type_name(h->type), h->len, limit);
    return 0;
}

/* ---- wire encodings ---- */

static bool wire_dtype_ok(int dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_Q8_0; }

int64_t dp_wire_bytes(int dtype, int64_t n)
{
    if (!wire_dtype_ok(dtype) || n < 0 || n > ((int64_t)1 << 40))
        return -1;
    return dtype_row_bytes(dtype, n);
}

int dp_encoding_error(int dtype, const float *x, int64_t n, struct dp_enc_error *out)
{
    memset(out, 0, sizeof *out);
    int64_t wb = dp_wire_bytes(dtype, n);
    if (wb < 0 || (n > 0 && !x))
        return CAIRN_EINVAL;
    void *wire = malloc((size_t)wb + 1);
    float *y = malloc((size_t)n * sizeof(float) + 1);
    if (!wire || !y) {
        free(wire);
        free(y);
        return CAIRN_ENOMEM;
    }
    int rc = kern_quantize_row(dtype, x, wire, n);
    if (!rc)
        rc = kern_dequantize_row(dtype, wire, y, n);
    if (!rc) {
        double se = 0, sx = 0;
        for (int64_t b = 0; b < n; b += 32) {
            int64_t e = b + 32 < n ? b + 32 : n;
            double bmax = 0, berr = 0;
            for (int64_t i = b; i < e; i++) {
                double xi = x[i], d = fabs((double)y[i] - xi);
                se += d * d;
                sx += xi * xi;
                if (d > out->max_abs)
                    out->max_abs = d;
                if (xi != 0 && d / fabs(xi) > out->max_rel)
                    out->max_rel = d / fabs(xi);
                if (fabs(xi) > bmax)
                    bmax = fabs(xi);
                if (d > berr)
                    berr = d;
            }
            double br = bmax > 0 ? berr / bmax : (berr > 0 ? INFINITY : 0);
            if (br > out->max_rel_block)
                out->max_rel_block = br;
        }
        out->rms_rel = sx > 0 ? sqrt(se / sx) : (se > 0 ? INFINITY : 0);
    }
    free(wire);
    free(y);
    return rc ? CAIRN_EINVAL : 0;
}

/* ---- HELLO and AUTH ---- */

bool dp_valid_id(const char *s, size_t len)
{
    if (len < 1 || len > DP_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return false;
    return true;
}

size_t dp_hello_pack(const struct dp_hello *h, uint8_t *out)
{
    size_t li = strlen(h->instance), lm = strlen(h->model);
    put_u16(out, h->version);
    put_u16(out + 2, 0);
    put_u32(out + 4, (uint32_t)h->rank);
    put_u64(out + 8, h->epoch);
    memcpy(out + 16, h->nonce, DP_NONCE_BYTES);
    put_u64(out + 48, h->window);
    size_t o = HELLO_FIXED;
    put_u16(out + o, (uint16_t)li);
    memcpy(out + o + 2, h->instance, li);
    o += 2 + li;
    put_u16(out + o, (uint16_t)lm);
    memcpy(out + o + 2, h->model, lm);
    return o + 2 + lm;
}

int dp_hello_parse(const uint8_t *p, size_t len, struct dp_hello *h, bool *version_only, char *why,
                   size_t whylen)
{
    memset(h, 0, sizeof *h);
    *version_only = false;
    if (len < 8)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO (%zu bytes)", len);
    h->version = get_u16(p);
    h->rank = (int32_t)get_u32(p + 4);
    if (h->version != DP_PROTO_VERSION) {
        *version_only = true;
        return 0;
    }
    if (len < HELLO_FIXED + 2 || get_u16(p + 2) != 0)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO");
    h->epoch = get_u64(p + 8);
    memcpy(h->nonce, p + 16, DP_NONCE_BYTES);
    h->window = get_u64(p + 48);
    if (h->window < DP_MIN_WINDOW || h->window > DP_MAX_WINDOW)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: window of %" PRIu64 " bytes", h->window);
    size_t o = HELLO_FIXED;
    size_t li = get_u16(p + o);
    if (li > DP_ID_MAX || o + 2 + li + 2 > len || !dp_valid_id((const char *)p + o + 2, li))
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: bad instance id");
    memcpy(h->instance, p + o + 2, li);
    o += 2 + li;
    size_t lm = get_u16(p + o);
    if (lm > DP_ID_MAX || o + 2 + lm != len || !dp_valid_id((const char *)p + o + 2, lm))
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: bad model identity");
    memcpy(h->model, p + o + 2, lm);
    if (h->rank < 0)
        return cairn_fail(why, whylen, CAIRN_EFORMAT, "malformed HELLO: rank %d", h->rank);
    return 0;
}

/* HMAC-SHA256(secret, label || prover's role || connector's HELLO || acceptor's HELLO):
 * both nonces are in it, and the role keeps a proof from being reflected back. */
void dp_hellos_mac(const char *secret, const char *label, uint8_t role, const struct dp_hellos *hs,
                   uint8_t out[DP_PROOF_BYTES])
{
    crypto_auth_hmacsha256_state st;
    uint8_t l[2];
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)secret, strlen(secret));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label) + 1); /* with its NUL */
    crypto_auth_hmacsha256_update(&st, &role, 1);
    put_u16(l, (uint16_t)hs->len_c);
    crypto_auth_hmacsha256_update(&st, l, 2);
    crypto_auth_hmacsha256_update(&st, hs->c, hs->len_c);
    put_u16(l, (uint16_t)hs->len_a);
    crypto_auth_hmacsha256_update(&st, l, 2);
    crypto_auth_hmacsha256_update(&st, hs->a, hs->len_a);
    crypto_auth_hmacsha256_final(&st, out);
}

static void auth_proof(const char *secret, bool prover_is_connector, const struct dp_hellos *hs,
                       uint8_t out[DP_PROOF_BYTES])
{
    dp_hellos_mac(secret, AUTH_LABEL, prover_is_connector ? 'C' : 'A', hs, out);
}

bool dp_hello_matches(const struct dp_hello *me, const struct dp_hello *peer, int want_rank, char *why,
                      size_t whylen)
{
    if (peer->version != me->version) {
        snprintf(why, whylen, "protocol version mismatch: rank %d speaks %u, rank %d speaks %u", me->rank,
                 me->version, peer->rank, peer->version);
        return false;
    }
    if (strcmp(me->instance, peer->instance)) {
        snprintf(why, whylen, "instance mismatch: rank %d is in '%s', rank %d in '%s'", me->rank,
                 me->instance, peer->rank, peer->instance);
        return false;
    }
    if (me->epoch != peer->epoch) {
        snprintf(why, whylen, "epoch mismatch: rank %d is at epoch %" PRIu64 ", rank %d at %" PRIu64,
                 me->rank, me->epoch, peer->rank, peer->epoch);
        return false;
    }
    if (strcmp(me->model, peer->model)) {
        snprintf(why, whylen, "model mismatch: rank %d has '%s', rank %d has '%s'", me->rank, me->model,
                 peer->rank, peer->model);
        return false;
    }
    if (peer->rank == me->rank) {
        snprintf(why, whylen, "rank mismatch: both sides are rank %d", me->rank);
        return false;
    }
    if (want_rank >= 0 && peer->rank != want_rank) {
        snprintf(why, whylen, "rank mismatch: rank %d expected rank %d, the peer is rank %d", me->rank,
                 want_rank, peer->rank);
        return false;
    }
    if (!memcmp(me->nonce, peer->nonce, DP_NONCE_BYTES)) {
        snprintf(why, whylen, "the peer repeated our nonce");
        return false;
    }
    return true;
}

size_t dp_auth_pack(const char *secret, bool connector, const struct dp_hellos *hs,
                    uint8_t out[1 + DP_PROOF_BYTES])
{
    memset(out, 0, 1 + DP_PROOF_BYTES);
    if (!secret)
        return 1;
    out[0] = DP_PROOF_BYTES;
    auth_proof(secret, connector, hs, out + 1);
    return 1 + DP_PROOF_BYTES;
}

bool dp_auth_wellformed(const uint8_t *p, size_t len)
{
    return len >= 1 && (p[0] == 0 || p[0] == DP_PROOF_BYTES) && len == 1u + p[0];
}

bool dp_auth_verify(const char *secret, bool connector, const struct dp_hellos *hs, const uint8_t *p,
                    int rank, int peer_rank, char *why, size_t whylen)
{
    if (secret && p[0] == 0) {
        snprintf(why, whylen, "cluster secret mismatch: rank %d has a secret, rank %d has none", rank, peer_rank);
        return false;
    }
    if (!secret && p[0] != 0) {
        snprintf(why, whylen, "cluster secret mismatch: rank %d has no secret, rank %d has one", rank, peer_rank);
        return false;
    }
    if (secret) {
        uint8_t expect[DP_PROOF_BYTES];
        auth_proof(secret, !connector, hs, expect);
        if (crypto_verify_32(expect, p + 1)) {
            snprintf(why, whylen,
                     "cluster secret mismatch: the proof of rank %d does not match the secret of rank %d",
                     peer_rank, rank);
            return false;
        }
    }
    return true;
}

/* ---- asks and sampled results ---- */

static bool ask_ok(const struct dp_ask *a)
{
    if (a->need == DP_ROW_LOGITS || a->need == DP_ROW_SKIP) {
        struct dp_ask z = {.need = a->need};
        return !memcmp(a, &z, sizeof z);
    }
    return a->need == DP_ROW_SAMPLE && a->n_top >= -1 && a->n_top <= DP_MAX_TOP && a->pos >= 0 &&
           !isnan(a->temperature) && a->top_p > 0 && a->top_p <= 1 && a->min_p >= 0 && a->min_p <= 1 &&
           isfinite(a->repeat_penalty) && a->repeat_penalty > 0 && isfinite(a->presence_penalty) &&
           isfinite(a->frequency_penalty) && a->penalty_last_n >= -1 && a->n_bias <= DP_MAX_BIAS &&
           a->n_hist <= DP_MAX_HIST;
}

/* Checks n asks and sums their bias entries and window tokens; the index of the first
 * bad ask, or -1. */
static int64_t asks_check(const struct dp_ask *asks, int64_t n, uint64_t *n_bias, uint64_t *n_hist)
{
    *n_bias = *n_hist = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!ask_ok(&asks[i]))
            return i;
        *n_bias += asks[i].n_bias;
        *n_hist += asks[i].n_hist;
    }
    return -1;
}

/* Where a SAMPLED result's arrays lie after the need bytes (offsets from the start of
 * the token array): sizes in bytes. */
static uint64_t sampled_bytes(uint64_t n_sampled, uint64_t n_tops, uint64_t n_logits, uint64_t n_vocab)
{
    return 16 * n_sampled + 8 * n_tops + 4 * n_logits * n_vocab;
}

/* ---- decoding received frames (I/O thread) ---- */

static int decode_act(const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl)
{
    if (len < ACT_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %zu bytes", len);
    struct dp_activations *a = &d->view.act;
    a->step = get_u64(p);
    uint32_t n = get_u32(p + 8), ne = get_u32(p + 12), dt = get_u32(p + 16), na = get_u32(p + 20);
    if (n < 1 || n > DP_MAX_TOKENS || ne < 1 || ne > DP_MAX_EMBD)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %" PRIu32 " tokens x %" PRIu32, n, ne);
    if (!wire_dtype_ok((int)dt))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS in unsupported type %" PRIu32, dt);
    if (na > n)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS of %" PRIu32 " tokens with %" PRIu32 " asks", n, na);
    int64_t row = dp_wire_bytes((int)dt, ne);
    if (row < 0)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS rows of %" PRIu32 " not blocks of %s", ne,
                          dtype_name((int)dt));
    size_t off = align8(ACT_FIXED + 13 * (size_t)n);
    uint64_t vals_end = (uint64_t)off + (uint64_t)n * (uint64_t)row;
    uint64_t asks_off = na ? (vals_end + 7) & ~(uint64_t)7 : vals_end;
    uint64_t base = asks_off + 64u * (uint64_t)na;
    if ((uint64_t)len < base || (!na && (uint64_t)len != vals_end))
        return cairn_fail(why, wl, CAIRN_EFORMAT,
                          "ACTIVATIONS of %" PRIu32 " x %" PRIu32 " %s with %" PRIu32 " asks need %" PRIu64
                          " bytes, got %zu", n, ne, dtype_name((int)dt), na, base, len);
    a->n = (int)n;
    a->n_embd = (int)ne;
    a->wire_dtype = (int)dt;
    a->pos = (const int64_t *)(p + ACT_FIXED);
    a->seq = (const int32_t *)(p + ACT_FIXED + 8 * (size_t)n);
    a->want = p + ACT_FIXED + 12 * (size_t)n;
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (a->pos[i] < 0 || a->seq[i] < 0 || a->want[i] > 1)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS token %" PRIu32 ": seq %d pos %" PRId64
                              " want %u", i, a->seq[i], a->pos[i], a->want[i]);
        n_want += a->want[i];
    }
    for (size_t i = ACT_FIXED + 13 * (size_t)n; i < off; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS padding not zero");
    a->n_asks = (int)na;
    a->asks = NULL;
    a->bias = NULL;
    a->hist = NULL;
    if (na) {
        if (na != n_want)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS with %" PRIu32 " asks for %" PRIu32
                              " wanted tokens", na, n_want);
        for (uint64_t i = vals_end; i < asks_off; i++)
            if (p[i])
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS padding not zero");
        a->asks = (const struct dp_ask *)(p + asks_off);
        uint64_t nb, nh;
        int64_t bad = asks_check(a->asks, na, &nb, &nh);
        if (bad >= 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS ask %" PRId64 " out of range (need %" PRIu32
                              ", n_top %d, pos %" PRId64 ", %" PRIu32 " bias entries, %" PRIu32 " window tokens)",
                              bad, a->asks[bad].need, a->asks[bad].n_top, a->asks[bad].pos, a->asks[bad].n_bias,
                              a->asks[bad].n_hist);
        if ((uint64_t)len != base + 8 * nb + 4 * nh)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS asks with %" PRIu64 " bias entries and %" PRIu64
                              " window tokens need %" PRIu64 " bytes, got %zu", nb, nh, base + 8 * nb + 4 * nh, len);
        a->bias = (const struct dp_bias *)(p + base);
        a->hist = (const int32_t *)(p + base + 8 * nb);
        for (uint64_t i = 0; i < nb; i++)
            if (a->bias[i].token < 0 || isnan(a->bias[i].bias))
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS bias entry %" PRIu64 ": token %d", i,
                                  a->bias[i].token);
        for (uint64_t i = 0; i < nh; i++)
            if (a->hist[i] < 0)
                return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS window token %" PRIu64 ": %d", i, a->hist[i]);
    }
    int64_t count = (int64_t)n * ne;
    if (dt == DT_F32) {
        a->x = (const float *)(p + off);
        return 0;
    }
    d->x = malloc((size_t)count * sizeof(float));
    if (!d->x)
        return cairn_fail(why, wl, CAIRN_ENOMEM, "out of memory decoding %" PRId64 " activations", count);
    if (kern_dequantize_row((int)dt, p + off, d->x, count))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "ACTIVATIONS: cannot decode %s", dtype_name((int)dt));
    d->x_bytes = (size_t)count * sizeof(float);
    a->x = d->x;
    return 0;
}

static int copy_text(struct dp_decoded *d, const uint8_t *s, size_t len, const char **out, char *why, size_t wl)
{
    if (!len) {
        *out = "";
        return 0;
    }
    d->text = malloc(len + 1);
    if (!d->text)
        return cairn_fail(why, wl, CAIRN_ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) /* text for logs: no control characters */
        d->text[i] = s[i] < 0x20 || s[i] == 0x7f ? '?' : (char)s[i];
    d->text[len] = 0;
    *out = d->text;
    return 0;
}

/* The rest of a SAMPLED RESULT, its header checked (entries from off). */
static int decode_sampled(const uint8_t *p, size_t len, struct dp_decoded *d, uint32_t n, uint32_t nv, int32_t status,
                          size_t off, char *why, size_t wl)
{
    struct dp_result *r = &d->view.res;
    uint64_t need_off = (uint64_t)off + 12u * (uint64_t)n, arr = (need_off + n + 7) & ~(uint64_t)7;
    if ((uint64_t)len < arr)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu32 " entries in %zu bytes", n, len);
    r->pos = (const int64_t *)(p + off);
    r->seq = (const int32_t *)(p + off + 8 * (size_t)n);
    r->need = p + need_off;
    uint64_t ns = 0, nl = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (r->pos[i] < 0 || r->seq[i] < 0 || r->need[i] < DP_ROW_LOGITS || r->need[i] > DP_ROW_SKIP)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT entry %" PRIu32 ": seq %d pos %" PRId64
                              " need %u", i, r->seq[i], r->pos[i], r->need[i]);
        ns += r->need[i] == DP_ROW_SAMPLE;
        nl += r->need[i] == DP_ROW_LOGITS;
    }
    for (uint64_t i = need_off + n; i < arr; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT padding not zero");
    if ((uint64_t)len < arr + 16 * ns)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu64 " tokens in %zu bytes", ns, len);
    const uint8_t *q = p + arr;
    r->token = (const int32_t *)q;
    r->prob = (const float *)(q + 4 * ns);
    r->logprob = (const float *)(q + 8 * ns);
    r->n_top = (const int32_t *)(q + 12 * ns);
    uint64_t nt = 0;
    for (uint64_t i = 0; i < ns; i++) {
        if (r->token[i] <= DP_TOKEN_ERR_MIN || r->n_top[i] < 0 || r->n_top[i] > DP_MAX_TOP ||
            (r->token[i] < 0 && r->n_top[i] != 0))
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT token %" PRIu64 ": %d with %d top", i,
                              r->token[i], r->n_top[i]);
        nt += (uint64_t)r->n_top[i];
    }
    uint64_t want = arr + sampled_bytes(ns, nt, nl, nv);
    if ((uint64_t)len != want)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT of %" PRIu64 " tokens, %" PRIu64 " top and %" PRIu64
                          " logits rows of %" PRIu32 " needs %" PRIu64 " bytes, got %zu", ns, nt, nl, nv, want, len);
    r->top_token = (const int32_t *)(q + 16 * ns);
    r->top_logprob = (const float *)(q + 16 * ns + 4 * nt);
    r->logits = (const float *)(q + 16 * ns + 8 * nt);
    for (uint64_t i = 0; i < nt; i++)
        if (r->top_token[i] < 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "SAMPLED RESULT top token %" PRIu64 ": %d", i, r->top_token[i]);
    r->n = (int)n;
    r->kind = DP_RESULT_SAMPLED;
    r->n_vocab = (int)nv;
    r->status = status;
    r->n_sampled = (int)ns;
    r->n_logits = (int)nl;
    r->n_tops = (int)nt;
    return copy_text(d, p + RES_FIXED, get_u16(p + 24), &r->message, why, wl);
}

static int decode_result(const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl)
{
    if (len < RES_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %zu bytes", len);
    struct dp_result *r = &d->view.res;
    r->step = get_u64(p);
    uint32_t n = get_u32(p + 8), kind = get_u32(p + 12), nv = get_u32(p + 16);
    int32_t status = (int32_t)get_u32(p + 20);
    size_t ml = get_u16(p + 24);
    if (n > DP_MAX_TOKENS)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %" PRIu32 " entries", n);
    if (kind == DP_RESULT_TOKENS ? nv != 0
                                 : (kind != DP_RESULT_LOGITS && kind != DP_RESULT_SAMPLED) || nv < 1 || nv > DP_MAX_VOCAB)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT kind %" PRIu32 " with n_vocab %" PRIu32, kind, nv);
    if (status > 0 || ml > DP_REASON_MAX || get_u16(p + 26) || get_u32(p + 28))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "malformed RESULT header");
    size_t off = align8(RES_FIXED + ml);
    if (kind == DP_RESULT_SAMPLED)
        return decode_sampled(p, len, d, n, nv, status, off, why, wl);
    uint64_t need = (uint64_t)off + 12u * (uint64_t)n +
                    (kind == DP_RESULT_TOKENS ? 8u * (uint64_t)n : 4u * (uint64_t)n * nv);
    if ((uint64_t)len != need)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT of %" PRIu32 " entries needs %" PRIu64
                          " bytes, got %zu", n, need, len);
    for (size_t i = RES_FIXED + ml; i < off; i++)
        if (p[i])
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT padding not zero");
    r->n = (int)n;
    r->kind = (enum dp_result_kind)kind;
    r->n_vocab = (int)nv;
    r->status = status;
    r->pos = (const int64_t *)(p + off);
    r->seq = (const int32_t *)(p + off + 8 * (size_t)n);
    for (uint32_t i = 0; i < n; i++)
        if (r->pos[i] < 0 || r->seq[i] < 0)
            return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT entry %" PRIu32 ": seq %d pos %" PRId64, i,
                              r->seq[i], r->pos[i]);
    const uint8_t *q = p + off + 12 * (size_t)n;
    if (kind == DP_RESULT_TOKENS) {
        r->token = (const int32_t *)q;
        r->logprob = (const float *)(q + 4 * (size_t)n);
        for (uint32_t i = 0; i < n; i++)
            if (r->token[i] < 0)
                return cairn_fail(why, wl, CAIRN_EFORMAT, "RESULT entry %" PRIu32 ": token %d", i, r->token[i]);
    } else {
        r->logits = (const float *)q;
    }
    return copy_text(d, p + RES_FIXED, ml, &r->message, why, wl);
}

static bool ctl_ok(const struct dp_ctl *o)
{
    if (o->reserved || o->seq < 0)
        return false;
    switch (o->op) {
    case DP_CTL_CLEAR:
    case DP_CTL_CANCEL: return o->seq2 == 0 && o->pos == 0;
    case DP_CTL_TRUNCATE: return o->seq2 == 0 && o->pos >= 0;
    case DP_CTL_FORK: return o->seq2 >= 0 && o->seq2 != o->seq && o->pos == 0;
    case DP_CTL_CLEAR_ALL: return o->seq == 0 && o->seq2 == 0 && o->pos == 0;
    case DP_CTL_PREPARE: return o->seq2 >= 0 && o->pos >= 0;
    default: return false;
    }
}

static int decode_control(const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl)
{
    if (len < CTL_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL of %zu bytes", len);
    uint32_t n = get_u32(p + 8);
    if (n > DP_MAX_CTL_OPS || get_u32(p + 12) || len != CTL_FIXED + (size_t)n * sizeof(struct dp_ctl))
        return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL of %" PRIu32 " ops in %zu bytes", n, len);
    struct dp_control *c = &d->view.ctl;
    c->step = get_u64(p);
    c->n = (int)n;
    c->ops = (const struct dp_ctl *)(p + CTL_FIXED);
    for (uint32_t i = 0; i < n; i++)
        if (!ctl_ok(&c->ops[i]))
            return cairn_fail(why, wl, CAIRN_EFORMAT, "CONTROL op %" PRIu32 ": op %" PRIu32 " seq %d seq2 %d pos %"
                              PRId64, i, c->ops[i].op, c->ops[i].seq, c->ops[i].seq2, c->ops[i].pos);
    return 0;
}

static int decode_goodbye(const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl)
{
    if (len < DP_BYE_FIXED)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "GOODBYE of %zu bytes", len);
    size_t rl = get_u16(p + 4);
    if (rl > DP_REASON_MAX || get_u16(p + 6) || len != DP_BYE_FIXED + rl)
        return cairn_fail(why, wl, CAIRN_EFORMAT, "malformed GOODBYE");
    d->view.bye.code = (int32_t)get_u32(p);
    return copy_text(d, p + DP_BYE_FIXED, rl, &d->view.bye.reason, why, wl);
}

int dp_decode(int type, const uint8_t *p, size_t len, struct dp_decoded *d, char *why, size_t wl)
{
    d->view.type = (enum dp_type)type;
    switch (type) {
    case DP_T_ACTIVATIONS: return decode_act(p, len, d, why, wl);
    case DP_T_RESULT: return decode_result(p, len, d, why, wl);
    case DP_T_CONTROL: return decode_control(p, len, d, why, wl);
    case DP_T_GOODBYE: return decode_goodbye(p, len, d, why, wl);
    default: return cairn_fail(why, wl, CAIRN_EFORMAT, "unexpected %s after the handshake", dp_type_name(type));
    }
}

/* ---- frames the connection builds or consumes itself ---- */

size_t dp_pack_heartbeat(uint8_t *buf, uint64_t now, uint64_t peer_clock, uint64_t age)
{
    uint8_t *p = buf + DP_HDR_SIZE;
    put_u64(p, now);
    put_u64(p + 8, peer_clock);
    put_u64(p + 16, age);
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_HEARTBEAT, .len = HB_PAYLOAD};
    dp_hdr_pack(buf, &h);
    return DP_HDR_SIZE + HB_PAYLOAD;
}

bool dp_parse_heartbeat(const uint8_t *p, size_t len, uint64_t *sent, uint64_t *echo, uint64_t *age)
{
    if (len != HB_PAYLOAD)
        return false;
    *sent = get_u64(p);
    *echo = get_u64(p + 8);
    *age = get_u64(p + 16);
    return true;
}

size_t dp_pack_credit(uint8_t *buf, uint64_t consumed)
{
    put_u64(buf + DP_HDR_SIZE, consumed);
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_CREDIT, .len = CREDIT_PAYLOAD};
    dp_hdr_pack(buf, &h);
    return DP_HDR_SIZE + CREDIT_PAYLOAD;
}

bool dp_parse_credit(const uint8_t *p, size_t len, uint64_t *consumed)
{
    *consumed = len == CREDIT_PAYLOAD ? get_u64(p) : 0;
    return len == CREDIT_PAYLOAD;
}

size_t dp_pack_goodbye(uint8_t *buf, int code, const char *reason)
{
    size_t rl = strnlen(reason, DP_REASON_MAX);
    uint8_t *p = buf + DP_HDR_SIZE;
    put_u32(p, (uint32_t)code);
    put_u16(p + 4, (uint16_t)rl);
    put_u16(p + 6, 0);
    memcpy(p + DP_BYE_FIXED, reason, rl);
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_GOODBYE, .len = (uint32_t)(DP_BYE_FIXED + rl)};
    dp_hdr_pack(buf, &h);
    return DP_HDR_SIZE + DP_BYE_FIXED + rl;
}

/* ---- encoding frames to send ---- */

int dp_act_layout(const struct dp_activations *a, struct dp_act_enc *e, char *err, size_t errlen)
{
    int dt = a->wire_dtype ? a->wire_dtype : DT_F32;
    if (a->n < 1 || a->n > DP_MAX_TOKENS || a->n_embd < 1 || a->n_embd > DP_MAX_EMBD)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations of %d x %d", a->n, a->n_embd);
    if (!a->seq || !a->pos || !a->x)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations without seq, pos or values");
    int64_t row = dp_wire_bytes(dt, a->n_embd);
    if (row < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "activations cannot travel as %s (rows of %d)",
                          dtype_name(dt), a->n_embd);
    int n_want = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->seq[i] < 0 || a->pos[i] < 0 || (a->want && a->want[i] > 1))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %d: seq %d pos %" PRId64, i, a->seq[i], a->pos[i]);
        n_want += !a->want || a->want[i];
    }
    size_t off = align8(ACT_FIXED + 13 * (size_t)a->n);
    size_t len = off + (size_t)a->n * (size_t)row;
    *e = (struct dp_act_enc){.a = a, .dt = dt, .len = len, .off = off, .vals_end = len, .asks_off = len};
    if (!a->n_asks)
        return 0;
    if (a->n_asks != n_want || !a->asks)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%d asks for %d wanted tokens", a->n_asks, n_want);
    int64_t bad = asks_check(a->asks, a->n_asks, &e->n_bias, &e->n_hist);
    if (bad >= 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "ask %" PRId64 " out of range", bad);
    if ((e->n_bias && !a->bias) || (e->n_hist && !a->hist))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "asks without their bias entries or windows");
    for (uint64_t i = 0; i < e->n_bias; i++)
        if (a->bias[i].token < 0 || isnan(a->bias[i].bias))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "bias entry %" PRIu64 ": token %d", i, a->bias[i].token);
    for (uint64_t i = 0; i < e->n_hist; i++)
        if (a->hist[i] < 0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "window token %" PRIu64 ": %d", i, a->hist[i]);
    e->asks_off = align8(len);
    e->len = e->asks_off + 64 * (size_t)a->n_asks + 8 * e->n_bias + 4 * e->n_hist;
    return 0;
}

void dp_encode_act(uint8_t *p, const void *arg)
{
    const struct dp_act_enc *e = arg;
    const struct dp_activations *a = e->a;
    size_t n = (size_t)a->n;
    put_u64(p, a->step);
    put_u32(p + 8, (uint32_t)a->n);
    put_u32(p + 12, (uint32_t)a->n_embd);
    put_u32(p + 16, (uint32_t)e->dt);
    put_u32(p + 20, 0);
    memcpy(p + ACT_FIXED, a->pos, 8 * n);
    memcpy(p + ACT_FIXED + 8 * n, a->seq, 4 * n);
    if (a->want)
        memcpy(p + ACT_FIXED + 12 * n, a->want, n);
    else
        memset(p + ACT_FIXED + 12 * n, 1, n);
    memset(p + ACT_FIXED + 13 * n, 0, e->off - (ACT_FIXED + 13 * n));
    kern_quantize_row(e->dt, a->x, p + e->off, (int64_t)a->n * a->n_embd);
    put_u32(p + 20, (uint32_t)a->n_asks);
    if (a->n_asks) {
        memset(p + e->vals_end, 0, e->asks_off - e->vals_end);
        uint8_t *q = p + e->asks_off;
        memcpy(q, a->asks, 64 * (size_t)a->n_asks);
        q += 64 * (size_t)a->n_asks;
        if (e->n_bias)
            memcpy(q, a->bias, 8 * e->n_bias);
        if (e->n_hist)
            memcpy(q + 8 * e->n_bias, a->hist, 4 * e->n_hist);
    }
}

/* The payload length of r, with its SAMPLED counts; CAIRN_EINVAL when malformed. */
static int result_len(const struct dp_result *r, uint64_t *len, uint64_t *ns, uint64_t *nt, uint64_t *nl,
                      char *err, size_t errlen)
{
    if (r->n < 0 || r->n > DP_MAX_TOKENS || r->status > 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result of %d entries, status %d", r->n, r->status);
    if (r->kind != DP_RESULT_TOKENS && r->kind != DP_RESULT_LOGITS && r->kind != DP_RESULT_SAMPLED)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result kind %d", (int)r->kind);
    if (r->kind != DP_RESULT_TOKENS && (r->n_vocab < 1 || r->n_vocab > DP_MAX_VOCAB))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result n_vocab %d", r->n_vocab);
    if (r->n && (!r->seq || !r->pos || (r->kind == DP_RESULT_TOKENS ? !r->token || !r->logprob
                                        : r->kind == DP_RESULT_LOGITS ? !r->logits : !r->need)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its arrays");
    for (int i = 0; i < r->n; i++)
        if (r->seq[i] < 0 || r->pos[i] < 0 || (r->kind == DP_RESULT_TOKENS && r->token[i] < 0) ||
            (r->kind == DP_RESULT_SAMPLED && (r->need[i] < DP_ROW_LOGITS || r->need[i] > DP_ROW_SKIP)))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "result entry %d: seq %d pos %" PRId64, i, r->seq[i],
                              r->pos[i]);
    size_t ml = r->message ? strnlen(r->message, DP_REASON_MAX) : 0;
    uint64_t base = (uint64_t)align8(RES_FIXED + ml) + 12u * (uint64_t)r->n;
    *ns = *nt = *nl = 0;
    if (r->kind == DP_RESULT_TOKENS) {
        *len = base + 8u * (uint64_t)r->n;
        return 0;
    }
    if (r->kind == DP_RESULT_LOGITS) {
        *len = base + 4u * (uint64_t)r->n * (uint64_t)r->n_vocab;
        return 0;
    }
    for (int i = 0; i < r->n; i++) {
        *ns += r->need[i] == DP_ROW_SAMPLE;
        *nl += r->need[i] == DP_ROW_LOGITS;
    }
    if ((*ns && (!r->token || !r->prob || !r->logprob || !r->n_top)) || (*nl && !r->logits))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its arrays");
    for (uint64_t i = 0; i < *ns; i++) {
        if (r->token[i] <= DP_TOKEN_ERR_MIN || r->n_top[i] < 0 || r->n_top[i] > DP_MAX_TOP ||
            (r->token[i] < 0 && r->n_top[i]))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "sampled token %" PRIu64 ": %d with %d top", i, r->token[i],
                              r->n_top[i]);
        *nt += (uint64_t)r->n_top[i];
    }
    if (*nt && (!r->top_token || !r->top_logprob))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "result without its top log-probabilities");
    for (uint64_t i = 0; i < *nt; i++)
        if (r->top_token[i] < 0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "top token %" PRIu64 ": %d", i, r->top_token[i]);
    *len = align8(base + (uint64_t)r->n) + sampled_bytes(*ns, *nt, *nl, (uint64_t)r->n_vocab);
    return 0;
}

uint64_t dp_result_wire_bytes(const struct dp_result *r)
{
    uint64_t len, ns, nt, nl;
    return r && result_len(r, &len, &ns, &nt, &nl, NULL, 0) == 0 ? DP_HDR_SIZE + len : 0;
}

int dp_result_layout(const struct dp_result *r, struct dp_res_enc *e, char *err, size_t errlen)
{
    uint64_t len, ns, nt, nl;
    int rc = result_len(r, &len, &ns, &nt, &nl, err, errlen);
    if (rc)
        return rc;
    size_t ml = r->message ? strnlen(r->message, DP_REASON_MAX) : 0;
    *e = (struct dp_res_enc){.r = r, .len = (size_t)len, .ml = ml, .off = align8(RES_FIXED + ml), .ns = ns, .nt = nt,
                             .nl = nl};
    return 0;
}

void dp_encode_result(uint8_t *p, const void *arg)
{
    const struct dp_res_enc *e = arg;
    const struct dp_result *r = e->r;
    size_t n = (size_t)r->n;
    put_u64(p, r->step);
    put_u32(p + 8, (uint32_t)r->n);
    put_u32(p + 12, (uint32_t)r->kind);
    put_u32(p + 16, r->kind != DP_RESULT_TOKENS ? (uint32_t)r->n_vocab : 0);
    put_u32(p + 20, (uint32_t)r->status);
    put_u16(p + 24, (uint16_t)e->ml);
    put_u16(p + 26, 0);
    put_u32(p + 28, 0);
    if (e->ml)
        memcpy(p + RES_FIXED, r->message, e->ml);
    memset(p + RES_FIXED + e->ml, 0, e->off - (RES_FIXED + e->ml));
    uint8_t *q = p + e->off;
    if (n) {
        memcpy(q, r->pos, 8 * n);
        memcpy(q + 8 * n, r->seq, 4 * n);
        q += 12 * n;
        if (r->kind == DP_RESULT_TOKENS) {
            memcpy(q, r->token, 4 * n);
            memcpy(q + 4 * n, r->logprob, 4 * n);
        } else if (r->kind == DP_RESULT_LOGITS) {
            memcpy(q, r->logits, 4 * n * (size_t)r->n_vocab);
        } else {
            memcpy(q, r->need, n);
            size_t end = e->off + 13 * n, pad = align8(end) - end;
            memset(q + n, 0, pad);
            q += n + pad;
            size_t ns = (size_t)e->ns, nt = (size_t)e->nt;
            if (ns) {
                memcpy(q, r->token, 4 * ns);
                memcpy(q + 4 * ns, r->prob, 4 * ns);
                memcpy(q + 8 * ns, r->logprob, 4 * ns);
                memcpy(q + 12 * ns, r->n_top, 4 * ns);
            }
            q += 16 * ns;
            if (nt) {
                memcpy(q, r->top_token, 4 * nt);
                memcpy(q + 4 * nt, r->top_logprob, 4 * nt);
            }
            q += 8 * nt;
            if (e->nl)
                memcpy(q, r->logits, 4 * (size_t)e->nl * (size_t)r->n_vocab);
        }
    }
}


int dp_control_layout(const struct dp_control *ctl, size_t *len, char *err, size_t errlen)
{
    if (ctl->n < 0 || ctl->n > DP_MAX_CTL_OPS || (ctl->n && !ctl->ops))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "control of %d ops", ctl->n);
    for (int i = 0; i < ctl->n; i++)
        if (!ctl_ok(&ctl->ops[i]))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "control op %d: op %" PRIu32 " seq %d seq2 %d pos %" PRId64,
                              i, ctl->ops[i].op, ctl->ops[i].seq, ctl->ops[i].seq2, ctl->ops[i].pos);
    *len = CTL_FIXED + (size_t)ctl->n * sizeof(struct dp_ctl);
    return 0;
}

void dp_encode_control(uint8_t *p, const void *arg)
{
    const struct dp_control *ctl = arg;
    put_u64(p, ctl->step);
    put_u32(p + 8, (uint32_t)ctl->n);
    put_u32(p + 12, 0);
    if (ctl->n)
        memcpy(p + CTL_FIXED, ctl->ops, (size_t)ctl->n * sizeof(struct dp_ctl));
}
