/* Writer -> reader round trips: every value type, tensors of several types given by
 * pointer or fill callback, the ggml layout (offsets, padding), copy_kv of a real
 * vocabulary, getter conversions and writer refusals. */
#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static int str_eq(struct gguf_str s, const void *p, uint64_t len)
{
    return s.len == len && (!len || !memcmp(s.ptr, p, len));
}

struct tspec {
    const char *name;
    int type, n_dims;
    int64_t ne[4];
    int use_fill;
    uint8_t *bytes;
    uint64_t size;
};

struct fill_ctx {
    const struct tspec *t;
    int calls;
};

static int fill_tensor(void *ctx, void *buf, uint64_t size)
{
    struct fill_ctx *c = ctx;
    c->calls++;
    if (size != c->t->size)
        return CAIRN_EINVAL;
    memcpy(buf, c->t->bytes, size);
    return 0;
}

static int fill_fails(void *ctx, void *buf, uint64_t size)
{
    (void)ctx;
    memset(buf, 0, size);
    return CAIRN_EIO;
}

/* Numeric arrays of each type; element i of each is derived from i. */
static const enum gguf_vtype num_types[] = {GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16, GGUF_UINT32, GGUF_INT32,
                                            GGUF_FLOAT32, GGUF_BOOL, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64};
static const int num_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
#define N_NUM (sizeof num_types / sizeof num_types[0])
#define ARR_N 37

static void fill_num(enum gguf_vtype t, void *out, int i)
{
    switch (t) {
    case GGUF_UINT8: *(uint8_t *)out = (uint8_t)(200 + i); break;
    case GGUF_INT8: *(int8_t *)out = (int8_t)(-100 + i); break;
    case GGUF_UINT16: *(uint16_t *)out = (uint16_t)(60000 + i); break;
    case GGUF_INT16: *(int16_t *)out = (int16_t)(-30000 + i); break;
    case GGUF_UINT32: *(uint32_t *)out = 4000000000u + (uint32_t)i; break;
    case GGUF_INT32: *(int32_t *)out = -2000000000 + i; break;
    case GGUF_FLOAT32: *(float *)out = 0.25f * (float)i - 3.0f; break;
    case GGUF_BOOL: *(uint8_t *)out = (uint8_t)(i % 3 == 0); break;
    case GGUF_UINT64: *(uint64_t *)out = 0xfffffffffffff000ull + (uint64_t)i; break;
    case GGUF_INT64: *(int64_t *)out = -(int64_t)1e15 + i; break;
    case GGUF_FLOAT64: *(double *)out = 1e-300 * (i + 1); break;
    default: break;
    }
}

static void write_and_read(uint32_t alignment)
{
    char err[512] = "";
    uint64_t rng = 1234 + alignment;
    struct gguf_writer *w;
    CHECK_EQ_INT(gguf_writer_create(&w), 0);
    if (alignment != GGUF_DEFAULT_ALIGNMENT)
        CHECK_EQ_INT(gguf_writer_set_u32(w, "general.alignment", alignment), 0);

    /* Scalars of every type, a string holding any bytes, and a replaced key. */
    CHECK_EQ_INT(gguf_writer_set_str(w, "general.architecture", "llama", 5), 0);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "s.u32", 7), 0);
    CHECK_EQ_INT(gguf_writer_set_i32(w, "s.i32", -123456), 0);
    CHECK_EQ_INT(gguf_writer_set_u64(w, "s.u64", 0xffffffffffffffffull), 0);
    CHECK_EQ_INT(gguf_writer_set_f32(w, "s.f32", 1e-6f), 0);
    CHECK_EQ_INT(gguf_writer_set_bool(w, "s.bool", 5), 0);
    uint8_t u8 = 250;
    int8_t i8 = -7;
    uint16_t u16 = 65535;
    int16_t i16 = -32768;
    int64_t i64 = INT64_MIN;
    double f64 = -2.5e200;
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.u8", GGUF_UINT8, &u8), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.i8", GGUF_INT8, &i8), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.u16", GGUF_UINT16, &u16), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.i16", GGUF_INT16, &i16), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.i64", GGUF_INT64, &i64), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.f64", GGUF_FLOAT64, &f64), 0);
    CHECK_EQ_INT(gguf_writer_set_scalar(w, "s.str", GGUF_STRING, "x"), CAIRN_EINVAL);
    static const char odd[] = {'a', 0, (char)0xff, (char)0xc3, '\n'};
    CHECK_EQ_INT(gguf_writer_set_str(w, "s.bytes", odd, sizeof odd), 0);
    CHECK_EQ_INT(gguf_writer_set_str(w, "s.empty", "", 0), 0);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "s.replaced", 1), 0);
    CHECK_EQ_INT(gguf_writer_set_str(w, "s.replaced", "now a string", 12), 0);

    /* Arrays of every numeric type, of strings, and empty ones. */
    for (size_t k = 0; k < N_NUM; k++) {
        uint8_t buf[ARR_N * 8];
        for (int i = 0; i < ARR_N; i++)
            fill_num(num_types[k], buf + i * num_size[k], i);
        char key[32];
        snprintf(key, sizeof key, "a.%d", (int)num_types[k]);
        CHECK_EQ_INT(gguf_writer_set_arr(w, key, num_types[k], buf, ARR_N), 0);
    }
    CHECK_EQ_INT(gguf_writer_set_arr(w, "a.empty", GGUF_INT32, NULL, 0), 0);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "a.bad", GGUF_STRING, "x", 1), CAIRN_EINVAL);
    enum { NS = 300 };
    char *strs[NS];
    uint64_t lens[NS];
    for (int i = 0; i < NS; i++) {
        lens[i] = (uint64_t)(i % 17);
        strs[i] = malloc(lens[i] + 1);
        for (uint64_t j = 0; j < lens[i]; j++)
            strs[i][j] = (char)(test_rand_u64(&rng) & 0xff);
    }
    CHECK_EQ_INT(gguf_writer_set_arr_str(w, "a.str", (const char *const *)strs, lens, NS), 0);
    CHECK_EQ_INT(gguf_writer_set_arr_str(w, "a.str_empty", NULL, NULL, 0), 0);

    /* Tensors: several types, ne[0] multiples of the block size, some filled at write time. */
    struct tspec ts[] = {
        {"token_embd.weight", DT_F32, 2, {64, 3, 1, 1}, 0, 0, 0},
        {"blk.0.attn_norm.weight", DT_F32, 1, {7, 1, 1, 1}, 1, 0, 0},
        {"blk.0.attn_q.weight", DT_F16, 2, {32, 5, 1, 1}, 0, 0, 0},
        {"blk.0.ffn_up.weight", DT_Q4_0, 3, {64, 2, 3, 1}, 1, 0, 0},
        {"blk.0.ffn_down.weight", DT_Q4_K, 2, {512, 3, 1, 1}, 0, 0, 0},
        {"blk.0.ffn_gate.weight", DT_Q8_0, 4, {32, 2, 1, 2}, 1, 0, 0},
        {"blk.0.attn_k.weight", DT_Q6_K, 2, {256, 1, 1, 1}, 0, 0, 0},
        {"output.weight", DT_BF16, 2, {16, 4, 1, 1}, 1, 0, 0},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    struct fill_ctx fc[NT];
    for (int i = 0; i < NT; i++) {
        struct tspec *t = &ts[i];
        t->size = (uint64_t)dtype_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        t->bytes = malloc(t->size);
        for (uint64_t j = 0; j < t->size; j++)
            t->bytes[j] = (uint8_t)test_rand_u64(&rng);
        fc[i] = (struct fill_ctx){t, 0};
        int rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->use_fill ? NULL : t->bytes,
                                        t->use_fill ? fill_tensor : NULL, &fc[i]);
        CHECK(rc == 0, "add_tensor %s rc=%d", t->name, rc);
    }

    const char *path = tmp_path(alignment == 32 ? "rt32.gguf" : "rtx.gguf");
    int rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == 0, "write rc=%d: %s", rc, err);
    for (int i = 0; i < NT; i++)
        CHECK_EQ_INT(fc[i].calls, ts[i].use_fill ? 1 : 0);
    char tmpname[600];
    snprintf(tmpname, sizeof tmpname, "%s.tmp", path);
    CHECK(access(tmpname, F_OK) != 0, "%s left behind", tmpname);

    struct gguf_file *f;
    rc = gguf_open(&f, path, err, sizeof err);
    CHECK(rc == 0, "open rc=%d: %s", rc, err);
    if (rc)
        goto out;
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_alignment(f), alignment);
    CHECK_EQ_INT(gguf_data_offset(f) % alignment, 0);

    /* Keys in the order first set; the replaced key kept its place with its new value. */
    CHECK(str_eq(gguf_kv_key(f, alignment == 32 ? 0 : 1), "general.architecture", 20), "first key");
    int64_t ri = gguf_find_key(f, "s.replaced");
    CHECK(ri == gguf_find_key(f, "s.empty") + 1, "replaced key moved to %lld", (long long)ri);
    CHECK_EQ_INT(gguf_kv_type(f, ri), GGUF_STRING);
    CHECK(gguf_kv_type(f, -1) == (enum gguf_vtype)-1, "type of kv -1");
    CHECK(gguf_kv_key(f, gguf_n_kv(f)).ptr == NULL, "key past the end");

    uint32_t vu32 = 0;
    int64_t vi64 = 0;
    float vf = 0;
    int vb = 0;
    struct gguf_str vs = {0};
    CHECK(gguf_get_u32(f, "s.u32", &vu32) == 0 && vu32 == 7, "s.u32 = %u", vu32);
    CHECK(gguf_get_i64(f, "s.i32", &vi64) == 0 && vi64 == -123456, "s.i32 = %lld", (long long)vi64);
    CHECK(gguf_get_u32(f, "s.i32", &vu32) == CAIRN_EFORMAT, "negative i32 read as u32");
    CHECK(gguf_get_i64(f, "s.u64", &vi64) == CAIRN_EFORMAT, "u64 max read as i64");
    CHECK(gguf_get_u32(f, "s.u64", &vu32) == CAIRN_EFORMAT, "u64 max read as u32");
    CHECK(gguf_get_f32(f, "s.f32", &vf) == 0 && vf == 1e-6f, "s.f32 = %g", vf);
    CHECK(gguf_get_f32(f, "s.u32", &vf) == 0 && vf == 7.0f, "u32 as f32 = %g", vf);
    CHECK(gguf_get_u32(f, "s.f32", &vu32) == CAIRN_EFORMAT, "f32 read as u32");
    CHECK(gguf_get_bool(f, "s.bool", &vb) == 0 && vb == 1, "s.bool = %d", vb);
    CHECK(gguf_get_bool(f, "s.u32", &vb) == CAIRN_EFORMAT, "u32 read as bool");
    CHECK(gguf_get_u32(f, "s.u8", &vu32) == 0 && vu32 == 250, "s.u8 = %u", vu32);
    CHECK(gguf_get_i64(f, "s.i8", &vi64) == 0 && vi64 == -7, "s.i8 = %lld", (long long)vi64);
    CHECK(gguf_get_u32(f, "s.u16", &vu32) == 0 && vu32 == 65535, "s.u16 = %u", vu32);
    CHECK(gguf_get_i64(f, "s.i16", &vi64) == 0 && vi64 == -32768, "s.i16 = %lld", (long long)vi64);
    CHECK(gguf_get_i64(f, "s.i64", &vi64) == 0 && vi64 == INT64_MIN, "s.i64 = %lld", (long long)vi64);
    CHECK(gguf_get_f32(f, "s.f64", &vf) == 0 && isinf(vf) && vf < 0, "s.f64 as f32 = %g", vf);
    CHECK(gguf_get_f32(f, "s.i16", &vf) == 0 && vf == -32768.0f, "s.i16 as f32 = %g", vf);
    CHECK(gguf_get_str(f, "s.bytes", &vs) == 0 && str_eq(vs, odd, sizeof odd), "s.bytes len %llu",
          (unsigned long long)vs.len);
    CHECK(gguf_get_str(f, "s.empty", &vs) == 0 && vs.len == 0, "s.empty len %llu", (unsigned long long)vs.len);
    CHECK(gguf_get_str(f, "s.replaced", &vs) == 0 && str_eq(vs, "now a string", 12), "s.replaced");
    CHECK(gguf_get_str(f, "s.u32", &vs) == CAIRN_EFORMAT, "u32 read as string");
    CHECK(gguf_get_u32(f, "missing", &vu32) == CAIRN_ENOTFOUND, "missing key");
    CHECK(gguf_get_str(f, "missing", &vs) == CAIRN_ENOTFOUND, "missing key");
    /* Raw access of a scalar gives the little-endian value bytes. */
    const void *raw;
    uint64_t rawlen;
    CHECK(gguf_kv_raw(f, gguf_find_key(f, "s.u16"), &raw, &rawlen) == 0 && rawlen == 2 && !memcmp(raw, &u16, 2),
          "raw u16 len %llu", (unsigned long long)rawlen);
    CHECK_EQ_INT(gguf_kv_raw(f, gguf_n_kv(f), &raw, &rawlen), CAIRN_EINVAL);

    for (size_t k = 0; k < N_NUM; k++) {
        char key[32];
        snprintf(key, sizeof key, "a.%d", (int)num_types[k]);
        struct gguf_array a = {0};
        CHECK(gguf_get_arr(f, key, &a) == 0 && a.type == num_types[k] && a.n == ARR_N, "%s type %d n %llu", key,
              a.type, (unsigned long long)a.n);
        if (a.n != ARR_N)
            continue;
        int bad = 0;
        for (int i = 0; i < ARR_N; i++) {
            uint8_t want[8];
            fill_num(num_types[k], want, i);
            bad += memcmp((const uint8_t *)a.data + i * num_size[k], want, num_size[k]) != 0;
            double wf = 0;
            int64_t wi = 0;
            switch (num_types[k]) {
            case GGUF_UINT8: case GGUF_BOOL: wi = *(uint8_t *)want; break;
            case GGUF_INT8: wi = *(int8_t *)want; break;
            case GGUF_UINT16: { uint16_t v; memcpy(&v, want, 2); wi = v; break; }
            case GGUF_INT16: { int16_t v; memcpy(&v, want, 2); wi = v; break; }
            case GGUF_UINT32: { uint32_t v; memcpy(&v, want, 4); wi = v; break; }
            case GGUF_INT32: { int32_t v; memcpy(&v, want, 4); wi = v; break; }
            case GGUF_INT64: memcpy(&wi, want, 8); break;
            case GGUF_UINT64: { uint64_t v; memcpy(&v, want, 8); wf = (double)v; break; }
            case GGUF_FLOAT32: { float v; memcpy(&v, want, 4); wf = v; break; }
            case GGUF_FLOAT64: memcpy(&wf, want, 8); break;
            default: break;
            }
            if (num_types[k] != GGUF_UINT64 && num_types[k] != GGUF_FLOAT32 && num_types[k] != GGUF_FLOAT64)
                wf = (double)wi;
            if (num_types[k] != GGUF_FLOAT32 && num_types[k] != GGUF_FLOAT64)
                bad += gguf_arr_int(&a, (uint64_t)i) != wi; /* u64 above INT64_MAX reads as 0 */
            bad += gguf_arr_float(&a, (uint64_t)i) != wf;
        }
        CHECK(bad == 0, "%s: %d element mismatches", key, bad);
    }
    struct gguf_array a8 = {0};
    gguf_get_arr(f, "a.1", &a8);
    CHECK(gguf_arr_int(&a8, 0) == -100 && gguf_arr_int(&a8, 5) == -95, "i8 elements %lld %lld",
          (long long)gguf_arr_int(&a8, 0), (long long)gguf_arr_int(&a8, 5));
    struct gguf_array ae = {0};
    CHECK(gguf_get_arr(f, "a.empty", &ae) == 0 && ae.n == 0 && ae.type == GGUF_INT32, "a.empty");
    CHECK(gguf_get_arr(f, "s.u32", &ae) == CAIRN_EFORMAT, "scalar read as array");
    struct gguf_array as = {0};
    CHECK(gguf_get_arr(f, "a.str", &as) == 0 && as.type == GGUF_STRING && as.n == NS, "a.str n %llu",
          (unsigned long long)as.n);
    int sbad = 0;
    for (int i = 0; i < NS && as.n == NS; i++)
        sbad += !str_eq(gguf_arr_str(f, &as, (uint64_t)i), strs[i], lens[i]);
    CHECK(sbad == 0, "%d strings differ", sbad);
    CHECK(gguf_arr_str(f, &as, NS).ptr == NULL, "string past the end");
    CHECK(gguf_arr_str(f, &a8, 0).ptr == NULL, "string of a numeric array");
    CHECK(gguf_get_arr(f, "a.str_empty", &as) == 0 && as.n == 0 && as.type == GGUF_STRING, "a.str_empty");

    /* Tensors: shape, type, bytes; ggml layout: offsets consecutive with padding. */
    CHECK_EQ_INT(gguf_n_tensors(f), NT);
    uint64_t off = 0;
    for (int i = 0; i < NT && gguf_n_tensors(f) == NT; i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        const struct tspec *s = &ts[i];
        CHECK(!strcmp(t->name, s->name), "tensor %d name %s", i, t->name);
        CHECK(gguf_find_tensor(f, s->name) == t, "find %s", s->name);
        CHECK(t->type == s->type && t->n_dims == s->n_dims, "%s type %d dims %d", s->name, t->type, t->n_dims);
        for (int d = 0; d < 4; d++)
            CHECK(t->ne[d] == s->ne[d], "%s ne[%d] = %lld, want %lld", s->name, d, (long long)t->ne[d],
                  (long long)s->ne[d]);
        CHECK(t->size == s->size, "%s size %llu want %llu", s->name, (unsigned long long)t->size,
              (unsigned long long)s->size);
        CHECK(t->offset == off, "%s offset %llu want %llu", s->name, (unsigned long long)t->offset,
              (unsigned long long)off);
        CHECK(t->data == (const char *)gguf_base(f) + gguf_data_offset(f) + t->offset, "%s data pointer", s->name);
        CHECK(!memcmp(t->data, s->bytes, s->size), "%s bytes differ", s->name);
        CHECK_EQ_INT(gguf_tensor_nelems(t), s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]);
        off += (s->size + alignment - 1) / alignment * alignment;
    }
    CHECK(gguf_file_size(f) == gguf_data_offset(f) + off, "file size %llu, data %llu + %llu",
          (unsigned long long)gguf_file_size(f), (unsigned long long)gguf_data_offset(f), (unsigned long long)off);
    /* Padding bytes are zero. */
    const uint8_t *base = gguf_base(f);
    int nonzero = 0;
    for (int i = 0; i < NT; i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        uint64_t end = gguf_data_offset(f) + t->offset + t->size;
        uint64_t next = i + 1 < NT ? gguf_data_offset(f) + gguf_tensor(f, i + 1)->offset : gguf_file_size(f);
        for (uint64_t j = end; j < next; j++)
            nonzero += base[j] != 0;
    }
    CHECK(nonzero == 0, "%d nonzero padding bytes", nonzero);
    CHECK(gguf_find_tensor(f, "nope") == NULL, "unknown tensor found");
    CHECK(gguf_tensor(f, NT) == NULL && gguf_tensor(f, -1) == NULL, "tensor index out of range");

    /* Every truncation of the written file is refused (its last tensor, 128 bytes, ends
     * at the end of the file: no trailing padding to cut harmlessly). */
    int trunc_ok = 0;
    for (uint64_t n = 0; n < gguf_file_size(f); n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, base, n);
        struct gguf_file *g = NULL;
        err[0] = 0;
        if (gguf_open_memory(&g, copy, n, err, sizeof err) == 0 || !err[0] || g)
            trunc_ok++;
        gguf_close(g);
        free(copy);
    }
    CHECK(trunc_ok == 0, "%d truncations of %llu bytes accepted", trunc_ok, (unsigned long long)gguf_file_size(f));

    /* Copying every kv and tensor into a new file reproduces the same bytes. */
    struct gguf_writer *w2;
    gguf_writer_create(&w2);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        CHECK_EQ_INT(gguf_writer_copy_kv(w2, f, i), 0);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        CHECK_EQ_INT(gguf_writer_add_tensor(w2, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL), 0);
    }
    const char *path2 = tmp_path("copy.gguf");
    rc = gguf_writer_write(w2, path2, err, sizeof err);
    CHECK(rc == 0, "copy write: %s", err);
    gguf_writer_release(w2);
    FILE *fp = fopen(path2, "rb");
    int same = 0;
    if (fp) {
        uint8_t *b2 = malloc(gguf_file_size(f) + 1);
        size_t n2 = fread(b2, 1, gguf_file_size(f) + 1, fp);
        same = n2 == gguf_file_size(f) && !memcmp(b2, base, n2);
        free(b2);
        fclose(fp);
    }
    CHECK(same, "copied file differs from the original");
    unlink(path2);
    gguf_close(f);
out:
    unlink(path);
    for (int i = 0; i < NT; i++)
        free(ts[i].bytes);
    for (int i = 0; i < NS; i++)
        free(strs[i]);
    gguf_writer_release(w);
}

static void copy_vocab(void)
{
    char err[512] = "";
    struct gguf_file *src, *f;
    int rc = gguf_open(&src, test_data_path("vocab/ggml-vocab-qwen2.gguf"), err, sizeof err);
    CHECK(rc == 0, "open qwen2: %s", err);
    if (rc)
        return;
    struct gguf_writer *w;
    gguf_writer_create(&w);
    for (int64_t i = 0; i < gguf_n_kv(src); i++)
        CHECK_EQ_INT(gguf_writer_copy_kv(w, src, i), 0);
    const char *path = tmp_path("vocab.gguf");
    rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == 0, "write: %s", err);
    gguf_writer_release(w);
    rc = gguf_open(&f, path, err, sizeof err);
    CHECK(rc == 0, "reopen: %s", err);
    if (!rc) {
        CHECK_EQ_INT(gguf_n_kv(f), gguf_n_kv(src));
        int diff = 0;
        for (int64_t i = 0; i < gguf_n_kv(src) && i < gguf_n_kv(f); i++) {
            const void *r1, *r2;
            uint64_t l1, l2;
            gguf_kv_raw(src, i, &r1, &l1);
            gguf_kv_raw(f, i, &r2, &l2);
            struct gguf_str k1 = gguf_kv_key(src, i);
            diff += !str_eq(gguf_kv_key(f, i), k1.ptr, k1.len) || gguf_kv_type(f, i) != gguf_kv_type(src, i) ||
                    l1 != l2 || memcmp(r1, r2, l1);
        }
        CHECK(diff == 0, "%d kvs differ after copy", diff);
        /* The header bytes are the same as llama.cpp's (it wrote this file). */
        uint64_t n = gguf_file_size(src);
        CHECK(gguf_file_size(f) >= n && !memcmp(gguf_base(f), gguf_base(src), n), "bytes differ from the original");
        gguf_close(f);
    }
    unlink(path);
    gguf_close(src);
}

static void writer_refusals(void)
{
    char err[512] = "";
    struct gguf_writer *w;
    gguf_writer_create(&w);
    int64_t ne[4] = {32, 2, 1, 1};
    static const uint8_t buf[4096];
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_Q4_0, 2, (int64_t[]){33, 2}, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", 4, 2, ne, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 0, ne, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 5, ne, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 2, ne, NULL, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 2, ne, buf, fill_fails, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "", DT_F32, 2, ne, buf, NULL, NULL), CAIRN_EINVAL);
    char longname[300];
    memset(longname, 'n', sizeof longname - 1);
    longname[299] = 0;
    CHECK_EQ_INT(gguf_writer_add_tensor(w, longname, DT_F32, 2, ne, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 2, (int64_t[]){-1, 2}, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 3, (int64_t[]){1ll << 40, 1ll << 20, 1ll << 20}, buf, NULL,
                                        NULL),
                 CAIRN_ERANGE);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 2, ne, buf, NULL, NULL), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", DT_F32, 2, ne, buf, NULL, NULL), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "", 1), CAIRN_EINVAL);
    CHECK_EQ_INT(gguf_writer_set_str(w, "k", NULL, 3), CAIRN_EINVAL);

    /* A failing fill callback fails the write and leaves no file. */
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "u", DT_F32, 2, ne, NULL, fill_fails, NULL), 0);
    const char *path = tmp_path("fail.gguf");
    int rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "'u'") && strstr(err, "fill"), "fill failure rc=%d: %s", rc, err);
    CHECK(access(path, F_OK) != 0, "file written despite failure");
    char tmpname[600];
    snprintf(tmpname, sizeof tmpname, "%s.tmp", path);
    CHECK(access(tmpname, F_OK) != 0, "tmp file left behind");
    gguf_writer_release(w);

    /* A bad alignment is refused at write time. */
    gguf_writer_create(&w);
    gguf_writer_set_u32(w, "general.alignment", 48);
    rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "power of two"), "alignment 48 rc=%d: %s", rc, err);
    gguf_writer_set_str(w, "general.alignment", "32", 2);
    rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "u32"), "string alignment rc=%d: %s", rc, err);
    /* An unwritable path names the path and the reason. */
    gguf_writer_set_u32(w, "general.alignment", 64);
    rc = gguf_writer_write(w, "/nonexistent/dir/x.gguf", err, sizeof err);
    CHECK(rc == CAIRN_EIO && strstr(err, "/nonexistent/dir/x.gguf.tmp") && strstr(err, "No such file"),
          "bad dir rc=%d: %s", rc, err);
    gguf_writer_release(w);
    gguf_writer_release(NULL);

    /* An empty file (no kvs, no tensors) round-trips. */
    gguf_writer_create(&w);
    rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == 0, "empty write: %s", err);
    gguf_writer_release(w);
    struct gguf_file *f;
    rc = gguf_open(&f, path, err, sizeof err);
    CHECK(rc == 0 && gguf_n_kv(f) == 0 && gguf_n_tensors(f) == 0, "empty reopen: %s", err);
    gguf_close(f);
    unlink(path);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cairn_gguf_rt_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    write_and_read(32);
    write_and_read(64);
    write_and_read(1);
    copy_vocab();
    writer_refusals();
    rmdir(tmpdir);
    return test_main_end();
}
