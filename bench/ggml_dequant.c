/* ggml's own dequantization of blocks, written as test vectors for cairn's
 * (tests/kern/test_ggml_dequant.c reads them). Built by bench/ggml_dequant.sh against
 * llama.cpp's libggml only; nothing of llama.cpp is linked into cairn.
 *
 *   ggml_dequant vectors OUT.bin          blocks quantized by ggml from gaussian rows,
 *                                         and random bytes with finite scales, per type
 *   ggml_dequant file MODEL.gguf OUT.bin  every tensor of the new types in a GGUF file
 *
 * OUT.bin: "CGDQ", u32 version 1, then records: u32 type, u32 n_elems, u32 name length,
 * name, the blocks' bytes, n_elems floats (ggml's dequantization). Little-endian. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

static const enum ggml_type types[] = {GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_NL,
                                       GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
#define NTYPES (sizeof types / sizeof types[0])

static int wanted(enum ggml_type t)
{
    for (size_t i = 0; i < NTYPES; i++)
        if (types[i] == t)
            return 1;
    return 0;
}

static void put_u32(FILE *f, uint32_t v)
{
    fwrite(&v, 4, 1, f);
}

static void record(FILE *f, enum ggml_type t, const char *name, const void *blocks, int64_t n)
{
    const struct ggml_type_traits *tr = ggml_get_type_traits(t);
    size_t bytes = (size_t)(n / tr->blck_size) * tr->type_size;
    float *y = malloc((size_t)n * sizeof *y);
    tr->to_float(blocks, y, n);
    put_u32(f, (uint32_t)t);
    put_u32(f, (uint32_t)n);
    put_u32(f, (uint32_t)strlen(name));
    fwrite(name, 1, strlen(name), f);
    fwrite(blocks, 1, bytes, f);
    fwrite(y, sizeof *y, (size_t)n, f);
    free(y);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float gauss(void)
{
    double u = ((double)(next() >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(next() >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* A half float: finite, of any magnitude (subnormal to 65504) and sign. */
static uint16_t finite_half(void)
{
    uint16_t h;
    do
        h = (uint16_t)next();
    while ((h & 0x7c00) == 0x7c00);
    return h;
}

static int vectors(const char *out)
{
    FILE *f = fopen(out, "wb");
    if (!f)
        return 1;
    fwrite("CGDQ", 1, 4, f);
    put_u32(f, 1);
    enum { N = 1024 };
    static float x[N];
    static uint8_t q[N * 2];
    for (size_t ti = 0; ti < NTYPES; ti++) {
        enum ggml_type t = types[ti];
        const struct ggml_type_traits *tr = ggml_get_type_traits(t);
        /* gaussian rows with an outlier, quantized by ggml (no importance matrix) */
        for (int i = 0; i < N; i++)
            x[i] = 0.02f * gauss();
        x[77] = 0.9f;
        ggml_quantize_init(t);
        ggml_quantize_chunk(t, x, q, 0, 1, N, NULL);
        record(f, t, "ggml-quantized", q, N);
        /* random bytes: every quant and scale bit pattern, with finite half scales */
        int nb = N / (int)tr->blck_size;
        for (size_t i = 0; i < (size_t)nb * tr->type_size; i++)
            q[i] = (uint8_t)next();
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = q + (size_t)b * tr->type_size;
            uint16_t h0 = finite_half(), h1 = finite_half();
            switch (t) {
            case GGML_TYPE_Q2_K: memcpy(blk + 80, &h0, 2); memcpy(blk + 82, &h1, 2); break;
            case GGML_TYPE_Q3_K: memcpy(blk + 108, &h0, 2); break;
            case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: memcpy(blk, &h0, 2); break;
            default: blk[0] = (uint8_t)(b * 37 + (b < 4 ? 0 : 200)); break; /* e: 0, 37, ..., 255 */
            }
        }
        record(f, t, "random-bytes", q, N);
    }
    return fclose(f) != 0;
}

static int file(const char *path, const char *out)
{
    struct gguf_init_params p = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(path, p);
    FILE *in = fopen(path, "rb"), *f = fopen(out, "wb");
    if (!g || !in || !f)
        return 1;
    fwrite("CGDQ", 1, 4, f);
    put_u32(f, 1);
    size_t base = gguf_get_data_offset(g);
    int n_out = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        enum ggml_type t = gguf_get_tensor_type(g, i);
        if (!wanted(t))
            continue;
        const struct ggml_type_traits *tr = ggml_get_type_traits(t);
        size_t size = gguf_get_tensor_size(g, i);
        int64_t n = (int64_t)(size / tr->type_size) * tr->blck_size;
        void *buf = malloc(size);
        if (fseek(in, (long)(base + gguf_get_tensor_offset(g, i)), SEEK_SET) || fread(buf, 1, size, in) != size)
            return 1;
        record(f, t, gguf_get_tensor_name(g, i), buf, n);
        free(buf);
        n_out++;
    }
    fprintf(stderr, "%s: %d tensors of the new types\n", path, n_out);
    fclose(in);
    gguf_free(g);
    return fclose(f) != 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "vectors"))
        return vectors(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "file"))
        return file(argv[2], argv[3]);
    fprintf(stderr, "usage: ggml_dequant vectors OUT.bin | ggml_dequant file MODEL.gguf OUT.bin\n");
    return 2;
}
