/* libFuzzer harness of the data plane's frame decoding (runner/dataplane_wire.c) on
 * arbitrary payloads: the first byte picks the frame type (activations, result,
 * control, goodbye, heartbeat, credit), the rest is the payload, 8-aligned as the
 * receiver holds it. A frame is decoded or refused with a reason; what decoding
 * allocated is freed. Built and run by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "runner/dataplane_int.h"

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
    return 0;
}
