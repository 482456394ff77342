/* libFuzzer harness of the GGUF reader (gguf/gguf.c) on arbitrary bytes, in an
 * exact-size copy so ASan sees any read past the end. A refused file must say why; an
 * accepted one must have every key, array element and tensor readable within the
 * input, and survive a round trip through the writer: every key/value copied and every
 * tensor re-added, written, and read back with gguf_open gives the same keys, types,
 * value bytes, shapes and tensor bytes. Its metadata read as a model's hyper-parameters
 * (model/arch.c: every architecture, gemma3's windows, phi3's refusals) is refused with a
 * reason or within the ranges the engine relies on. Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "fuzz_gguf: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                    \
        }                                                               \
    } while (0)

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(path, sizeof path, "%s/fuzz_gguf.%d.gguf", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm",
             (int)getpid());
    return 0;
}

static void in_input(const void *p, uint64_t n, const uint8_t *base, size_t size)
{
    CHECK((const uint8_t *)p >= base && n <= size && (size_t)((const uint8_t *)p - base) <= size - n);
}

/* Reads everything the getters offer, checking that it lies in the input. */
static void walk(const struct gguf_file *f, const uint8_t *base, size_t size)
{
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_str k = gguf_kv_key(f, i);
        const void *raw;
        uint64_t len;
        CHECK(k.len > 0 && gguf_kv_raw(f, i, &raw, &len) == 0);
        in_input(k.ptr, k.len, base, size);
        in_input(raw, len, base, size);
        char key[256];
        if (k.len >= sizeof key || memchr(k.ptr, 0, k.len))
            continue;
        memcpy(key, k.ptr, k.len);
        key[k.len] = 0;
        CHECK(gguf_find_key(f, key) == i);
        struct gguf_array a;
        struct gguf_str s;
        uint32_t u32;
        int64_t i64;
        float f32;
        int b;
        (void)gguf_get_u32(f, key, &u32), (void)gguf_get_i64(f, key, &i64);
        (void)gguf_get_f32(f, key, &f32), (void)gguf_get_bool(f, key, &b);
        if (gguf_get_str(f, key, &s) == 0)
            in_input(s.ptr, s.len, base, size);
        if (gguf_get_arr(f, key, &a) == 0 && a.type != GGUF_ARRAY)
            for (uint64_t e = 0; e < a.n; e++) {
                if (a.type == GGUF_STRING) {
                    s = gguf_arr_str(f, &a, e);
                    in_input(s.ptr, s.len, base, size);
                } else {
                    (void)gguf_arr_int(&a, e);
                    (void)gguf_arr_float(&a, e);
                }
            }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        CHECK(gguf_find_tensor(f, t->name) == t);
        in_input(t->data, t->size, base, size);
        (void)gguf_tensor_nelems(t);
    }
}

static void round_trip(const struct gguf_file *f)
{
    struct gguf_writer *w;
    char err[512] = "";
    CHECK(gguf_writer_create(&w) == 0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        CHECK(gguf_writer_copy_kv(w, f, i) == 0);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        static const char one; /* add_tensor wants a data pointer even for 0 bytes */
        CHECK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->size ? t->data : &one, NULL,
                                     NULL) == 0);
    }
    int rc = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_release(w);
    if (rc) { /* nothing but the disk can refuse a file the reader accepted */
        fprintf(stderr, "fuzz_gguf: write %s: %s\n", path, err);
        CHECK(rc == CAIRN_EIO);
        return;
    }
    struct gguf_file *g;
    rc = gguf_open(&g, path, err, sizeof err);
    if (rc)
        fprintf(stderr, "fuzz_gguf: the written file is refused: %s\n", err);
    CHECK(rc == 0);
    CHECK(gguf_n_kv(g) == gguf_n_kv(f) && gguf_n_tensors(g) == gguf_n_tensors(f));
    CHECK(gguf_alignment(g) == gguf_alignment(f));
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_str a = gguf_kv_key(f, i), b = gguf_kv_key(g, i);
        const void *ra, *rb;
        uint64_t la, lb;
        CHECK(a.len == b.len && !memcmp(a.ptr, b.ptr, a.len) && gguf_kv_type(f, i) == gguf_kv_type(g, i));
        CHECK(gguf_kv_raw(f, i, &ra, &la) == 0 && gguf_kv_raw(g, i, &rb, &lb) == 0);
        CHECK(la == lb && !memcmp(ra, rb, la));
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *a = gguf_tensor(f, i), *b = gguf_tensor(g, i);
        CHECK(!strcmp(a->name, b->name) && a->n_dims == b->n_dims && a->type == b->type && a->size == b->size);
        CHECK(!memcmp(a->ne, b->ne, sizeof a->ne) && !memcmp(a->data, b->data, a->size));
    }
    gguf_close(g);
    unlink(path);
}

/* gguf_header_end on prefixes of an accepted file: the whole file gives its data
 * offset; a prefix that holds the header gives the same; a shorter one is refused. */
static void header_prefixes(const struct gguf_file *f, const uint8_t *data, size_t size)
{
    uint64_t end = 0, want = gguf_data_offset(f);
    char err[512];
    CHECK(gguf_header_end(data, size, size, &end, err, sizeof err) == 0 && end == want);
    size_t cuts[] = {0, 1, size / 3, size / 2, size - (size > 0)};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        int rc = gguf_header_end(data, cuts[i], size, &end, err, sizeof err);
        CHECK(rc ? rc == CAIRN_EFORMAT && err[0] : end == want);
    }
}

static void check_hparams(const struct gguf_file *f)
{
    struct model_hparams hp;
    char err[512] = "";
    int rc = model_read_hparams(f, &hp, err, sizeof err);
    if (rc) {
        CHECK(rc < 0 && err[0]);
        return;
    }
    CHECK(hp.n_layers >= 1 && hp.n_embd >= 1 && hp.n_head >= 1 && hp.n_head_kv >= 1 && hp.n_head % hp.n_head_kv == 0);
    CHECK(hp.head_dim >= 2 && hp.head_dim % 2 == 0 && hp.n_rot >= 2 && hp.n_rot <= hp.head_dim && hp.n_vocab >= 1);
    CHECK(hp.attn_scale > 0 && hp.swa_window >= 0 && hp.logit_softcap >= 0);
    if (hp.swa_window > 0)
        CHECK(hp.swa_pattern >= 1 && hp.rope_base_swa > 0);
    for (int il = 0; il < hp.n_layers; il++)
        (void)model_layer_swa(&hp, il);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct gguf_file *f;
    char err[512] = "";
    int rc = gguf_open_memory(&f, copy, size, err, sizeof err);
    if (rc) {
        CHECK(f == NULL && rc < 0 && err[0]); /* refused, and says why */
    } else {
        CHECK(gguf_file_size(f) == size && gguf_base(f) == copy);
        walk(f, copy, size);
        check_hparams(f);
        round_trip(f);
        header_prefixes(f, copy, size);
        gguf_close(f);
    }
    /* a prefix of any input, said to be of a larger file: refused with a reason, or an end
     * past the header's fixed fields (a file without tensors may put its data section's
     * aligned start past its end, so nothing bounds it from above) */
    uint64_t end = 0;
    size_t half = size / 2;
    err[0] = 0;
    rc = gguf_header_end(copy, half, (uint64_t)size + 4096, &end, err, sizeof err);
    CHECK(rc ? err[0] != 0 : end >= 24);
    free(copy);
    return 0;
}
