/* libFuzzer harness of the data plane's frame decoding (runner/dataplane_wire.c) on
 * arbitrary payloads: the first byte picks the frame type (activations, result,
 * control, goodbye, heartbeat, credit), the rest is the payload, 8-aligned as the
 * receiver holds it. A frame is decoded or refused with a reason; what decoding
 * allocated is freed. The same bytes as a sealed frame (header, then payload and tag)
 * never open under a key that did not seal them, and as a payload they seal and open
 * back to themselves. Built and run by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "runner/dataplane_int.h"

static void seal_checks(const uint8_t *data, size_t size)
{
    struct dp_seal_dir tx = {.key = {1, 2, 3}}, rx = tx;
    if (size >= DP_HDR_SIZE) { /* forged: whatever the bytes, they do not open */
        uint8_t *q = malloc(size - DP_HDR_SIZE + 1);
        if (!q)
            return;
        memcpy(q, data + DP_HDR_SIZE, size - DP_HDR_SIZE);
        if (dp_open_frame(&rx, data, q, size - DP_HDR_SIZE) >= 0 || rx.n != 0)
            abort();
        free(q);
        dp_seal_release(&rx);
    }
    uint8_t *f = malloc(DP_HDR_SIZE + size + DP_SEAL_TAG);
    if (!f)
        return;
    struct dp_hdr h = {.version = DP_WIRE_VERSION, .type = DP_T_CONTROL, .len = (uint32_t)size};
    dp_hdr_pack(f, &h);
    memcpy(f + DP_HDR_SIZE, data, size);
    size_t whole = dp_seal_frame(&tx, f, size);
    struct dp_hdr back;
    char why[128];
    if (whole != DP_HDR_SIZE + size + DP_SEAL_TAG || dp_hdr_parse(f, &back, 1u << 20, why, sizeof why) ||
        !(back.flags & DP_F_SEALED) || back.len != size + DP_SEAL_TAG)
        abort();
    if (dp_open_frame(&rx, f, f + DP_HDR_SIZE, size + DP_SEAL_TAG) != (long)size || memcmp(f + DP_HDR_SIZE, data, size))
        abort();
    if (dp_open_frame(&rx, f, f + DP_HDR_SIZE, size + DP_SEAL_TAG) >= 0) /* a replay: the count moved on */
        abort();
    free(f);
    dp_seal_release(&tx);
    dp_seal_release(&rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int types[] = {DP_T_ACTIVATIONS, DP_T_RESULT, DP_T_CONTROL, DP_T_GOODBYE, DP_T_HEARTBEAT,
                                DP_T_CREDIT};
    if (size < 1 || size > (1u << 20))
        return 0;
    int type = types[data[0] % 6];
    size_t len = size - 1;
    uint8_t *p = aligned_alloc(8, (len + 7) / 8 * 8 + 8);
    if (!p)
        return 0;
    memcpy(p, data + 1, len);
    char why[256] = "";
    if (type == DP_T_HEARTBEAT) {
        uint64_t a, b, c;
        dp_parse_heartbeat(p, len, &a, &b, &c);
    } else if (type == DP_T_CREDIT) {
        uint64_t c;
        dp_parse_credit(p, len, &c);
    } else if (len % 8 == 0) {
        struct dp_decoded d;
        memset(&d, 0, sizeof d);
        int rc = dp_decode(type, p, len, &d, why, sizeof why);
        if (rc && !why[0] && rc != CAIRN_ENOMEM)
            abort(); /* a refusal always says why */
        free(d.x);
        free(d.text);
    }
    free(p);
    seal_checks(data, size);
    return 0;
}
