/* Bad files: a small valid file is built byte by byte (recording where each field
 * lies), then every truncation, a table of corrupted fields and seeded random byte
 * flips are fed to the reader. Each input sits in its own exact-size allocation so
 * ASan sees any read past its end. */
#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

struct buf {
    uint8_t b[4096];
    size_t n;
};

static size_t put(struct buf *b, const void *p, size_t n)
{
    size_t at = b->n;
    memcpy(b->b + b->n, p, n);
    b->n += n;
    return at;
}

static size_t put_u32(struct buf *b, uint32_t v)
{
    return put(b, &v, 4);
}

static size_t put_u64(struct buf *b, uint64_t v)
{
    return put(b, &v, 8);
}

static size_t put_strn(struct buf *b, const char *s, size_t n)
{
    size_t at = put_u64(b, n);
    put(b, s, n);
    return at;
}

static size_t put_str(struct buf *b, const char *s)
{
    return put_strn(b, s, strlen(s));
}

static void pad(struct buf *b, size_t align)
{
    while (b->n % align)
        b->b[b->n++] = 0;
}

/* Offsets of the fields that the corruption table patches. */
struct layout {
    size_t kv_align_val, kv_one_key, kv_two_key, kv_str_type, kv_str_len, kv_arr_count, kv_arr_str2_len;
    size_t t0, t0_ndims, t0_dim0, t0_dim1, t0_type, t1, t1_name, t1_dim0, t1_type, t1_offset;
    size_t nested_count;
    size_t data;
};

/* Valid file: 6 kvs (alignment, two same-length keys, a string, a string array, a
 * nested array), tensors "t.a" F32 [8,2] and "t.b" Q4_0 [32,1]; the last tensor ends
 * exactly at the end of the file so that every truncation cuts something needed. */
static void build(struct buf *b, struct layout *L)
{
    memset(b, 0, sizeof *b);
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, 2); /* tensors */
    put_u64(b, 6); /* kvs */

    put_str(b, "general.alignment");
    put_u32(b, GGUF_UINT32);
    L->kv_align_val = put_u32(b, 32);

    L->kv_one_key = put_str(b, "k.one");
    put_u32(b, GGUF_INT32);
    put_u32(b, (uint32_t)-5);

    L->kv_two_key = put_str(b, "k.two");
    put_u32(b, GGUF_FLOAT32);
    float fv = 0.5f;
    put(b, &fv, 4);

    put_str(b, "s.name");
    L->kv_str_type = put_u32(b, GGUF_STRING);
    L->kv_str_len = put_strn(b, "h\xff\x00llo", 6);

    put_str(b, "a.strs");
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    L->kv_arr_count = put_u64(b, 3);
    put_str(b, "one");
    L->kv_arr_str2_len = put_str(b, "two");
    put_str(b, "");

    /* [[1, 2], []] as an array of i16 arrays. */
    put_str(b, "a.nested");
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_ARRAY);
    L->nested_count = put_u64(b, 2);
    put_u32(b, GGUF_INT16);
    put_u64(b, 2);
    put_u32(b, 0x00020001);
    put_u32(b, GGUF_INT16);
    put_u64(b, 0);

    L->t0 = put_str(b, "t.a");
    L->t0_ndims = put_u32(b, 2);
    L->t0_dim0 = put_u64(b, 8);
    L->t0_dim1 = put_u64(b, 2);
    L->t0_type = put_u32(b, DT_F32);
    put_u64(b, 0);

    L->t1 = L->t1_name = put_str(b, "t.b");
    put_u32(b, 2);
    L->t1_dim0 = put_u64(b, 32);
    put_u64(b, 1);
    L->t1_type = put_u32(b, DT_Q4_0);
    L->t1_offset = put_u64(b, 64);

    pad(b, 32);
    L->data = b->n;
    for (int i = 0; i < 64; i++) /* t.a: 64 bytes */
        b->b[b->n++] = (uint8_t)i;
    for (int i = 0; i < 18; i++) /* t.b: one Q4_0 block */
        b->b[b->n++] = (uint8_t)(0xa0 + i);
}

/* Opens a private exact-size copy; returns rc and fills err. */
static int open_copy(const uint8_t *p, size_t n, struct gguf_file **f, char *err, size_t errlen)
{
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    err[0] = 0;
    int rc = gguf_open_memory(f, copy, n, err, errlen);
    if (rc == 0) {
        /* Touch everything the reader hands out. */
        volatile unsigned sink = 0;
        for (int64_t i = 0; i < gguf_n_kv(*f); i++) {
            struct gguf_str k = gguf_kv_key(*f, i);
            for (uint64_t j = 0; j < k.len; j++)
                sink += (uint8_t)k.ptr[j];
            char key[300];
            snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
            struct gguf_array a;
            struct gguf_str s;
            int64_t iv;
            float fv;
            if (gguf_get_arr(*f, key, &a) == 0)
                for (uint64_t j = 0; j < a.n; j++) {
                    struct gguf_str e = gguf_arr_str(*f, &a, j);
                    for (uint64_t c = 0; c < e.len; c++)
                        sink += (uint8_t)e.ptr[c];
                    sink += (unsigned)gguf_arr_int(&a, j) + (unsigned)gguf_arr_float(&a, j);
                }
            if (gguf_get_str(*f, key, &s) == 0)
                for (uint64_t j = 0; j < s.len; j++)
                    sink += (uint8_t)s.ptr[j];
            if (gguf_get_i64(*f, key, &iv) == 0)
                sink += (unsigned)iv;
            if (gguf_get_f32(*f, key, &fv) == 0)
                sink += (unsigned)fv;
        }
        for (int64_t i = 0; i < gguf_n_tensors(*f); i++) {
            const struct gguf_tensor *t = gguf_tensor(*f, i);
            for (uint64_t j = 0; j < t->size; j++)
                sink += ((const uint8_t *)t->data)[j];
            sink += gguf_find_tensor(*f, t->name) == t;
        }
        (void)sink;
        gguf_close(*f);
    } else if (*f) {
        rc = 12345; /* out must be NULL on failure */
    }
    free(copy);
    return rc;
}

struct corruption {
    const char *what;
    size_t *at;           /* field to patch (points into the layout) */
    int width;            /* 4 or 8 bytes */
    uint64_t value;
    int64_t delta;        /* added to the value read at `at` instead, when value is 0 */
    const char *word;     /* the message must contain this */
    size_t *report_at;    /* the message must name this offset (NULL: the patched one) */
};

int main(void)
{
    struct buf b;
    struct layout L;
    build(&b, &L);
    char err[512];
    struct gguf_file *f = NULL;

    /* The base file is valid and reads back. */
    int rc = gguf_open_memory(&f, b.b, b.n, err, sizeof err);
    CHECK(rc == 0, "base file refused: %s", err);
    if (rc)
        return test_main_end();
    CHECK_EQ_INT(gguf_n_kv(f), 6);
    CHECK_EQ_INT(gguf_n_tensors(f), 2);
    struct gguf_array nested;
    CHECK(gguf_get_arr(f, "a.nested", &nested) == 0 && nested.type == GGUF_ARRAY && nested.n == 2,
          "nested array type %d n %llu", nested.type, (unsigned long long)nested.n);
    struct gguf_str s;
    CHECK(gguf_get_str(f, "s.name", &s) == 0 && s.len == 6 && !memcmp(s.ptr, "h\xff\x00llo", 6), "s.name");
    const struct gguf_tensor *tb = gguf_find_tensor(f, "t.b");
    CHECK(tb && tb->size == 18 && tb->offset == 64 && ((const uint8_t *)tb->data)[0] == 0xa0, "t.b");
    gguf_close(f);

    /* Every truncation is refused with a message, and leaves out NULL. */
    int trunc_bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        rc = open_copy(b.b, n, &f, err, sizeof err);
        if (rc == 0 || rc == 12345 || !err[0]) {
            trunc_bad++;
            fprintf(stderr, "truncation to %zu bytes: rc=%d err='%s'\n", n, rc, err);
        }
    }
    CHECK(trunc_bad == 0, "%d of %zu truncations not refused", trunc_bad, b.n);
    rc = gguf_open_memory(&f, NULL, 0, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "magic"), "empty input rc=%d: %s", rc, err);

    /* Corrupted fields: each refused with the field named and its offset. */
    static size_t any = SIZE_MAX, magic_at = 0, version_at = 4, ntensor_at = 8, nkv_at = 16;
    const struct corruption table[] = {
        {"bad magic", &magic_at, 4, 0x46554746, 0, "magic", NULL},
        {"version 1", &version_at, 4, 1, 0, "version 1", NULL},
        {"version 99", &version_at, 4, 99, 0, "version 99", NULL},
        {"big-endian version", &version_at, 4, 0x03000000, 0, "big-endian", NULL},
        {"huge tensor count", &ntensor_at, 8, 1ull << 40, 0, "tensor count", NULL},
        {"max tensor count", &ntensor_at, 8, UINT64_MAX, 0, "tensor count", NULL},
        {"tensor count too large by one", &ntensor_at, 8, 3, 0, "tensor 2", &any},
        {"huge kv count", &nkv_at, 8, 1ull << 50, 0, "kv count", NULL},
        {"max kv count", &nkv_at, 8, UINT64_MAX, 0, "kv count", NULL},
        {"key length past end", &L.kv_one_key, 8, 60000, 0, "key length 60000 past end", NULL},
        {"key length over limit", &L.kv_one_key, 8, 1ull << 62, 0, "key length", NULL},
        {"empty key", &L.kv_one_key, 8, 0, -5, "key is empty", NULL},
        {"string length past end", &L.kv_str_len, 8, 99999999, 0, "string length 99999999 past end", NULL},
        {"string length max", &L.kv_str_len, 8, UINT64_MAX, 0, "string length", NULL},
        {"unknown value type", &L.kv_str_type, 4, 13, 0, "value type 13 unknown", NULL},
        {"huge value type", &L.kv_str_type, 4, 0xffffffff, 0, "value type", NULL},
        {"array of huge count", &L.kv_arr_count, 8, 1ull << 60, 0, "array count", NULL},
        {"array string past end", &L.kv_arr_str2_len, 8, 5000, 0, "string 1 length 5000 past end", NULL},
        {"nested array huge count", &L.nested_count, 8, 1ull << 59, 0, "array count", NULL},
        {"n_dims 0", &L.t0_ndims, 4, 0, -2, "n_dims 0", NULL},
        {"n_dims 5", &L.t0_ndims, 4, 5, 0, "n_dims 5", NULL},
        {"negative dim", &L.t0_dim1, 8, (uint64_t)-5, 0, "dim 1 = -5", NULL},
        {"overflowing dims", &L.t0_dim0, 8, 1ull << 62, 0, "overflow", &L.t0_dim1},
        {"ne[0] not a multiple of the block", &L.t1_dim0, 8, 33, 0, "block", &L.t1_type},
        {"unknown tensor type", &L.t1_type, 4, 99, 0, "type 99 unknown", NULL},
        {"tensor type in a hole", &L.t1_type, 4, 4, 0, "type 4 unknown", NULL},
        {"misaligned offset", &L.t1_offset, 8, 0, 4, "not aligned", NULL},
        {"data past end", &L.t1_offset, 8, 1u << 20, 0, "past end", &L.t1},
        {"data offset near 2^64", &L.t1_offset, 8, UINT64_MAX - 31, 0, "past end", &L.t1},
        {"tensor size past end", &L.t1_dim0, 8, 64, 0, "past end", &L.t1},
        {"duplicate tensor name", &L.t1_name, 8, 0, 0, "duplicate tensor", &L.t1},
        {"duplicate key", &L.kv_two_key, 8, 0, 0, "duplicate key", &L.kv_two_key},
        {"alignment not a power of two", &L.kv_align_val, 4, 48, 0, "power of two", NULL},
        {"alignment zero", &L.kv_align_val, 4, 0, -32, "power of two", NULL},
    };
    for (size_t c = 0; c < sizeof table / sizeof table[0]; c++) {
        const struct corruption *k = &table[c];
        struct buf m = b;
        size_t at = *k->at;
        if (!strcmp(k->what, "duplicate tensor name")) {
            memcpy(m.b + L.t1_name + 8, "t.a", 3);
        } else if (!strcmp(k->what, "duplicate key")) {
            memcpy(m.b + L.kv_two_key + 8, "k.one", 5);
        } else if (k->width == 4) {
            uint32_t v;
            memcpy(&v, m.b + at, 4);
            v = k->delta ? v + (uint32_t)k->delta : (uint32_t)k->value;
            memcpy(m.b + at, &v, 4);
        } else {
            uint64_t v;
            memcpy(&v, m.b + at, 8);
            v = k->delta ? v + (uint64_t)k->delta : k->value;
            memcpy(m.b + at, &v, 8);
        }
        rc = open_copy(m.b, m.n, &f, err, sizeof err);
        char want_off[64];
        snprintf(want_off, sizeof want_off, "at offset %zu", k->report_at ? *k->report_at : at);
        if (k->report_at == &any)
            want_off[0] = 0;
        CHECK(rc == CAIRN_EFORMAT && strstr(err, k->word) && strstr(err, want_off),
              "%s: rc=%d, message '%s' should contain '%s' and '%s'", k->what, rc, err, k->word, want_off);
        if (c < 3 || !strcmp(k->what, "string length past end"))
            printf("%s -> %s\n", k->what, err);
    }

    /* Nested arrays are accepted up to a depth limit. */
    {
        struct buf d = {.n = 0};
        put(&d, "GGUF", 4);
        put_u32(&d, 3);
        put_u64(&d, 0);
        put_u64(&d, 1);
        put_str(&d, "deep");
        put_u32(&d, GGUF_ARRAY);
        for (int i = 0; i < 40; i++) {
            put_u32(&d, GGUF_ARRAY);
            put_u64(&d, 1);
        }
        put_u32(&d, GGUF_UINT8);
        put_u64(&d, 0);
        rc = open_copy(d.b, d.n, &f, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, "nesting"), "40-deep array rc=%d: %s", rc, err);
    }

    /* Random byte flips never crash; what opens is fully readable (open_copy reads it). */
    uint64_t rng = 42;
    int opened = 0, flips = 4000;
    for (int it = 0; it < flips; it++) {
        struct buf m = b;
        int nflip = 1 + (int)(test_rand_u64(&rng) % 4);
        for (int j = 0; j < nflip; j++) {
            /* Mostly the header (where parsing happens), sometimes any byte. */
            size_t span = test_rand_u64(&rng) % 4 ? L.data : m.n;
            size_t pos = (size_t)(test_rand_u64(&rng) % span);
            uint64_t r = test_rand_u64(&rng);
            m.b[pos] = r & 1 ? (uint8_t)(r >> 8) : m.b[pos] ^ (uint8_t)(1u << ((r >> 8) & 7));
        }
        size_t n = test_rand_u64(&rng) % 8 ? m.n : (size_t)(test_rand_u64(&rng) % m.n);
        rc = open_copy(m.b, n, &f, err, sizeof err);
        CHECK(rc == 0 || (rc < 0 && rc != 12345 && err[0]), "flip %d: rc=%d err='%s'", it, rc, err);
        opened += rc == 0;
    }
    printf("%d of %d flipped files still opened\n", opened, flips);

    /* A real vocabulary: random truncations are refused, header flips never crash. */
    FILE *fp = fopen(test_data_path("vocab/ggml-vocab-llama-spm.gguf"), "rb");
    CHECK(fp != NULL, "cannot read the llama-spm vocab");
    if (fp) {
        static uint8_t vb[1 << 20];
        size_t vn = fread(vb, 1, sizeof vb, fp);
        fclose(fp);
        rc = open_copy(vb, vn, &f, err, sizeof err);
        CHECK(rc == 0, "vocab refused: %s", err);
        int bad = 0;
        for (int it = 0; it < 150; it++) {
            size_t n = (size_t)(test_rand_u64(&rng) % vn);
            rc = open_copy(vb, n, &f, err, sizeof err);
            bad += rc == 0 || !err[0];
        }
        CHECK(bad == 0, "%d vocab truncations accepted", bad);
        opened = 0;
        for (int it = 0; it < 150; it++) {
            size_t pos = (size_t)(test_rand_u64(&rng) % 4096);
            uint8_t old = vb[pos];
            vb[pos] ^= (uint8_t)(1u << (test_rand_u64(&rng) & 7));
            rc = open_copy(vb, vn, &f, err, sizeof err);
            CHECK(rc == 0 || (rc < 0 && err[0]), "vocab flip at %zu: rc=%d", pos, rc);
            opened += rc == 0;
            vb[pos] = old;
        }
        printf("%d of 150 flipped vocab files still opened\n", opened);
    }
    return test_main_end();
}
