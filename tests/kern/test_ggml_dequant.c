/* Our dequantization of Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 equals ggml's bit for bit.
 * The vectors in tests/kern/data/ggml_dequant.bin were written once by
 * bench/ggml_dequant.c from llama.cpp's libggml (blocks ggml quantized from gaussian
 * rows, and random bytes with finite scales: every quant and scale bit pattern, every
 * MXFP4 exponent class), so this test needs no llama.cpp. bench/ggml_dequant.sh writes
 * such a file for whole GGUF models and runs this test on it (CAIRN_GGML_VECTORS=FILE). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kern/kern.h"
#include "testutil.h"

static int read_all(FILE *f, void *p, size_t n)
{
    return fread(p, 1, n, f) == n;
}

static void test_vectors(void)
{
    const char *path = getenv("CAIRN_GGML_VECTORS");
    char def[4096];
    snprintf(def, sizeof def, "%s/tests/kern/data/ggml_dequant.bin", CAIRN_SOURCE_DIR);
    if (!path || !*path)
        path = def;
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f)
        return;
    char magic[4];
    uint32_t version = 0;
    CHECK(read_all(f, magic, 4) && !memcmp(magic, "CGDQ", 4) && read_all(f, &version, 4) &&
              version == 1, "%s: not a vector file", path);
    int records = 0, seen[DT_COUNT] = {0};
    int64_t values = 0;
    for (;;) {
        uint32_t hdr[3];
        if (!read_all(f, hdr, sizeof hdr))
            break;
        int type = (int)hdr[0];
        int64_t n = hdr[1];
        char name[256] = "";
        int64_t rb = dtype_row_bytes(type, n);
        CHECK(hdr[2] < sizeof name && rb > 0 && n <= (1 << 28), "record %d: type %d, %lld values",
              records, type, (long long)n);
        if (hdr[2] >= sizeof name || rb <= 0 || n > (1 << 28))
            break;
        uint8_t *blocks = malloc((size_t)rb);
        float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
        int ok = read_all(f, name, hdr[2]) && read_all(f, blocks, (size_t)rb) &&
                 read_all(f, want, (size_t)n * sizeof *want);
        CHECK(ok, "record %d truncated", records);
        if (ok) {
            CHECK_EQ_INT(kern_dequantize_row(type, blocks, got, n), 0);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; i++) {
                uint32_t a, b;
                memcpy(&a, &got[i], 4);
                memcpy(&b, &want[i], 4);
                bool both_nan = got[i] != got[i] && want[i] != want[i];
                if (a != b && !both_nan && bad++ == 0)
                    first = i;
            }
            CHECK(bad == 0, "%s '%s': %lld of %lld values differ from ggml's, first [%lld] = %a, ggml %a",
                  dtype_name(type), name, (long long)bad, (long long)n, (long long)first,
                  first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
            seen[type]++;
            values += n;
        }
        free(blocks);
        free(want);
        free(got);
        records++;
        if (!ok)
            break;
    }
    fclose(f);
    printf("%s: %d records, %lld values compared\n", path, records, (long long)values);
    if (path == def) {
        const int types[] = {DT_Q2_K, DT_Q3_K, DT_IQ4_NL, DT_IQ4_XS, DT_MXFP4};
        for (int i = 0; i < 5; i++)
            CHECK(seen[types[i]] >= 2, "%s: %d records in %s", dtype_name(types[i]), seen[types[i]], path);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_vectors);
    return test_main_end();
}
