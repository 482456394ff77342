/* libFuzzer harness of a node's kept bandwidth reading (node/bwcache.c), a file in the
 * data folder that anything with access to it may have written: arbitrary bytes are
 * taken or refused with a reason; a taken reading is for the asked key, within its age,
 * and a bandwidth a machine can have. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/bwcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/cairn-fuzz-bwcache-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    /* the key of the seed in the corpus */
    struct bwcache_key key = {.cpu = "Test CPU 9000", .threads = 2, .block_mib = 2032};
    struct bwcache_entry got;
    char err[512] = "";
    int rc = bwcache_read(path, &key, 1000000, &got, err, sizeof err);
    if (rc) {
        if (!err[0])
            abort();
        return 0;
    }
    if (strcmp(got.key.cpu, key.cpu) || got.key.threads != key.threads || got.key.block_mib != key.block_mib ||
        got.taken_at > 1000000 || !(got.bytes_per_s >= 1e8 && got.bytes_per_s < 1e14) ||
        !memchr(got.style, 0, sizeof got.style))
        abort();
    return 0;
}
