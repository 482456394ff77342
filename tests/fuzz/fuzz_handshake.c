/* libFuzzer harness of the small parsers a peer reaches before any session: LAN discovery
 * beacons (net/discovery.c, from any host of the LAN), the data plane's HELLO
 * (runner/dataplane_wire.c) and, on the download route of the API, the Range header, the
 * X-Cairn-Nonce value and the auth token (node/download.c). The first byte picks the
 * parser, the rest is its input. A refusal says why; what parses encodes back to the same
 * bytes (beacons, HELLOs); a beacon under the cluster key has its MAC made good first, so
 * the checks after the MAC are reached too; a Range lies inside the file. Built and run
 * by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "base/err.h"
#include "net/discovery.h"
#include "node/download.h"
#include "runner/dataplane_int.h"

static uint8_t key[DISCOVERY_KEY_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (discovery_beacon_key("fuzz secret", key))
        abort();
    return 0;
}

/* keyed: with the cluster key, the last 32 bytes replaced by a good MAC when flagged. */
static void beacon(const uint8_t *p, size_t n, bool keyed)
{
    uint8_t buf[DISCOVERY_BEACON_MAX + 64], again[DISCOVERY_BEACON_MAX];
    if (n > sizeof buf)
        return;
    memcpy(buf, p, n);
    if (keyed && n >= DISCOVERY_HDR_SIZE + DISCOVERY_MAC_BYTES && (buf[5] & 1))
        crypto_auth(buf + n - DISCOVERY_MAC_BYTES, buf, n - DISCOVERY_MAC_BYTES, key);
    struct discovery_beacon b;
    char err[256] = "";
    size_t len = 0;
    if (discovery_beacon_decode(buf, n, keyed ? key : NULL, &b, err, sizeof err)) {
        if (!err[0])
            abort();
    } else if (discovery_beacon_encode(&b, keyed ? key : NULL, again, &len) || len != n || memcmp(again, buf, n)) {
        abort();
    }
}

static void hello(const uint8_t *p, size_t n)
{
    struct dp_hello h;
    bool version_only;
    char why[256] = "";
    uint8_t again[DP_HANDSHAKE_MAX + 16];
    if (n > DP_HANDSHAKE_MAX)
        return;
    if (dp_hello_parse(p, n, &h, &version_only, why, sizeof why)) {
        if (!why[0])
            abort();
    } else if (!version_only && (dp_hello_pack(&h, again) != n || memcmp(again, p, n))) {
        abort();
    }
}

/* The first 8 bytes are the file's size, the rest the header. */
static void range(const uint8_t *p, size_t n)
{
    if (n < 8)
        return;
    uint64_t size;
    memcpy(&size, p, 8);
    char *text = malloc(n - 8 + 1);
    if (!text)
        return;
    memcpy(text, p + 8, n - 8);
    text[n - 8] = 0;
    bool partial;
    uint64_t first, len;
    char err[256] = "";
    int rc = download_range_parse(text, size, &partial, &first, &len, err, sizeof err);
    if (rc && (rc != CAIRN_ERANGE || !err[0]))
        abort();
    if (!rc && partial && (len == 0 || first >= size || len > size - first))
        abort();
    if (!rc && !partial && (first != 0 || len != size))
        abort();
    free(text);
}

/* The text as an X-Cairn-Nonce value and as an auth token. */
static void token(const uint8_t *p, size_t n)
{
    char *text = malloc(n + 1);
    if (!text)
        return;
    memcpy(text, p, n);
    text[n] = 0;
    uint8_t nonce[DOWNLOAD_NONCE_BYTES];
    int rc = download_nonce_parse(text, nonce);
    if (rc && rc != CAIRN_EINVAL)
        abort();
    char err[256] = "";
    rc = download_auth_check("fuzz secret", "node-a", "/v1/files/x", text, 1700000000, err, sizeof err);
    if (rc && !err[0])
        abort();
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 5) {
    case 0:
        beacon(p, n, false);
        break;
    case 1:
        beacon(p, n, true);
        break;
    case 2:
        hello(p, n);
        break;
    case 3:
        range(p, n);
        break;
    default:
        token(p, n);
        break;
    }
    return 0;
}
