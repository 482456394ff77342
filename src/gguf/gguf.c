/* GGUF reader: one sequential pass validates every field against the file size, records
 * where each value lives, and builds hash indexes of keys and tensor names plus an
 * offset index of every string of top-level string arrays (so gguf_arr_str is O(1)).
 * Memory grows with what has been parsed, never with a count read from the file. */
#include "gguf/gguf.h"

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_MAX_LEN 65535u
#define TENSOR_NAME_MAX 255u
#define ARRAY_MAX_DEPTH 8
/* Smallest possible encodings: a kv is key length (8) + a 1-byte key + type (4) + a
 * 1-byte value; a tensor info is name length (8) + 1-byte name + n_dims (4) + one dim
 * (8) + type (4) + offset (8). */
#define KV_MIN_BYTES 14u
#define TENSOR_MIN_BYTES 33u

struct kv {
    struct gguf_str key;
    uint64_t key_off;    /* file offset of the key's length field */
    enum gguf_vtype type;
    uint64_t val_off;    /* file offset of the value (after the type field) */
    uint64_t val_len;    /* bytes of the encoded value */
    enum gguf_vtype atype; /* arrays: element type */
    uint64_t n;          /* arrays: element count; strings: byte length */
    uint64_t data_off;   /* arrays: first element; strings: first byte */
    uint64_t str0;       /* string arrays: first index into stroff */
};

struct gguf_file {
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    uint32_t version, alignment;
    uint64_t data_offset;
    int64_t n_kv;
    size_t cap_kv;
    struct kv *kvs;
    int64_t n_tensors;
    size_t cap_tensors, cap_tensor_off;
    struct gguf_tensor *tensors;
    uint64_t *tensor_off; /* file offset of each tensor info */
    uint64_t n_stroff;
    size_t cap_stroff;
    uint64_t *stroff;     /* file offsets of the length fields of array strings */
    uint64_t kv_hcap, t_hcap; /* powers of two; slots hold index + 1, 0 is empty */
    int64_t *kv_hash, *t_hash;
    char *path;               /* gguf_open's; NULL for memory */
    struct gguf_file **parts; /* a split model's other parts, whose tensors are in tensors[] */
    int n_parts;
    uint64_t whole_size;      /* gguf_header_end: the file's size, of which base holds a prefix */
};

static const uint8_t vsize[GGUF_FLOAT64 + 1] = {
    [GGUF_UINT8] = 1, [GGUF_INT8] = 1, [GGUF_UINT16] = 2, [GGUF_INT16] = 2,
    [GGUF_UINT32] = 4, [GGUF_INT32] = 4, [GGUF_FLOAT32] = 4, [GGUF_BOOL] = 1,
    [GGUF_UINT64] = 8, [GGUF_INT64] = 8, [GGUF_FLOAT64] = 8,
};

static const char *const vname[GGUF_FLOAT64 + 1] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* ---- parsing cursor ---- */

struct rd {
    const uint8_t *p;
    uint64_t size, pos;
    char *err;
    size_t errlen;
    char ctx[160]; /* what is being parsed: "header", "kv 5 'general.name'" */
};

typedef unsigned long long ull;

static int fail_at(struct rd *r, uint64_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail_at(struct rd *r, uint64_t off, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cairn_fail(r->err, r->errlen, CAIRN_EFORMAT, "%s: %s at offset %llu", r->ctx, msg, (ull)off);
}

static uint64_t left(const struct rd *r)
{
    return r->size - r->pos;
}

/* A printable excerpt of a name that may hold any bytes. */
static void quote(char *dst, size_t cap, const char *s, uint64_t len)
{
    size_t o = 0;
    for (uint64_t i = 0; i < len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 64) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        dst[o++] = c >= 0x20 && c < 0x7f && c != '\'' ? (char)c : '?';
    }
    dst[o] = 0;
}

static int take(struct rd *r, void *out, uint64_t n, const char *what)
{
    if (left(r) < n)
        return fail_at(r, r->pos, "%s past end of file (%llu bytes)", what, (ull)r->size);
    memcpy(out, r->p + r->pos, n);
    r->pos += n;
    return 0;
}

static void str_name(char *name, size_t cap, const char *label, int64_t idx)
{
    if (idx >= 0)
        snprintf(name, cap, "%s %lld", label, (long long)idx);
    else
        snprintf(name, cap, "%s", label);
}

/* A string: u64 length then bytes. `label`/`idx` name it in messages ("string 12"). */
static int take_str(struct rd *r, struct gguf_str *s, uint64_t maxlen, const char *label, int64_t idx)
{
    char name[48];
    uint64_t at = r->pos, len;
    if (left(r) < 8) {
        str_name(name, sizeof name, label, idx);
        return fail_at(r, at, "%s length past end of file (%llu bytes)", name, (ull)r->size);
    }
    memcpy(&len, r->p + r->pos, 8);
    r->pos += 8;
    if (len > maxlen) {
        str_name(name, sizeof name, label, idx);
        return fail_at(r, at, "%s length %llu exceeds the limit %llu", name, (ull)len, (ull)maxlen);
    }
    if (len > left(r)) {
        str_name(name, sizeof name, label, idx);
        return fail_at(r, at, "%s length %llu past end of file (%llu bytes)", name, (ull)len, (ull)r->size);
    }
    if (s) {
        s->ptr = (const char *)r->p + r->pos;
        s->len = len;
    }
    r->pos += len;
    return 0;
}

/* An array value: element type, count, elements. Strings of a top-level array are
 * indexed into f->stroff when `index` is set. */
static int take_array(struct rd *r, struct gguf_file *f, int depth, bool index, enum gguf_vtype *type,
                      uint64_t *n_out)
{
    uint64_t at = r->pos, n = 0;
    uint32_t et = 0;
    int rc;
    if ((rc = take(r, &et, 4, "array element type")))
        return rc;
    if (et > GGUF_FLOAT64)
        return fail_at(r, at, "array element type %u unknown", et);
    uint64_t at_n = r->pos;
    if ((rc = take(r, &n, 8, "array count")))
        return rc;
    *type = et;
    *n_out = n;
    if (et == GGUF_ARRAY) {
        if (depth >= ARRAY_MAX_DEPTH)
            return fail_at(r, at, "array nesting deeper than %d", ARRAY_MAX_DEPTH);
        if (n > left(r) / 12)
            return fail_at(r, at_n, "array count %llu of arrays needs at least %llu bytes but %llu remain", (ull)n,
                           n > UINT64_MAX / 12 ? UINT64_MAX : (ull)n * 12, (ull)left(r));
        for (uint64_t i = 0; i < n; i++) {
            enum gguf_vtype t2;
            uint64_t n2;
            if ((rc = take_array(r, f, depth + 1, false, &t2, &n2)))
                return rc;
        }
    } else if (et == GGUF_STRING) {
        if (n > left(r) / 8)
            return fail_at(r, at_n, "array count %llu of strings needs at least %llu bytes but %llu remain", (ull)n,
                           n > UINT64_MAX / 8 ? UINT64_MAX : (ull)n * 8, (ull)left(r));
        if (index) {
            if (array_reserve(&f->stroff, &f->cap_stroff, f->n_stroff + n, sizeof *f->stroff, 16))
                return cairn_fail(r->err, r->errlen, CAIRN_ENOMEM, "%s: out of memory indexing %llu strings",
                                  r->ctx, (ull)n);
        }
        for (uint64_t i = 0; i < n; i++) {
            if (index)
                f->stroff[f->n_stroff + i] = r->pos;
            if ((rc = take_str(r, NULL, UINT64_MAX, "string", (int64_t)i)))
                return rc;
        }
        if (index)
            f->n_stroff += n;
    } else {
        uint64_t sz = vsize[et];
        if (n > left(r) / sz)
            return fail_at(r, at_n, "array count %llu of %s (%llu bytes each) past end of file (%llu bytes)", (ull)n,
                           vname[et], (ull)sz, (ull)r->size);
        r->pos += n * sz;
    }
    return 0;
}

static uint64_t hash_bytes(const void *p, uint64_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t table_cap(int64_t n)
{
    uint64_t c = 16;
    while (c < (uint64_t)n * 2)
        c *= 2;
    return c;
}

static int64_t kv_lookup(const struct gguf_file *f, const char *key, uint64_t len)
{
    if (!f->kv_hcap)
        return -1;
    uint64_t m = f->kv_hcap - 1;
    for (uint64_t h = hash_bytes(key, len) & m;; h = (h + 1) & m) {
        int64_t s = f->kv_hash[h];
        if (!s)
            return -1;
        const struct kv *kv = &f->kvs[s - 1];
        if (kv->key.len == len && !memcmp(kv->key.ptr, key, len))
            return s - 1;
    }
}

static int64_t tensor_lookup(const struct gguf_file *f, const char *name, size_t len)
{
    if (!f->t_hcap || len > TENSOR_NAME_MAX)
        return -1;
    uint64_t m = f->t_hcap - 1;
    for (uint64_t h = hash_bytes(name, len) & m;; h = (h + 1) & m) {
        int64_t s = f->t_hash[h];
        if (!s)
            return -1;
        if (!strcmp(f->tensors[s - 1].name, name))
            return s - 1;
    }
}

static int parse_kvs(struct rd *r, struct gguf_file *f, uint64_t n_kv)
{
    int rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (array_reserve(&f->kvs, &f->cap_kv, i + 1, sizeof *f->kvs, 16))
            return cairn_fail(r->err, r->errlen, CAIRN_ENOMEM, "out of memory reading kv %llu", (ull)i);
        struct kv *kv = &f->kvs[i];
        memset(kv, 0, sizeof *kv);
        snprintf(r->ctx, sizeof r->ctx, "kv %llu", (ull)i);
        kv->key_off = r->pos;
        if ((rc = take_str(r, &kv->key, KEY_MAX_LEN, "key", -1)))
            return rc;
        if (!kv->key.len)
            return fail_at(r, kv->key_off, "key is empty");
        char q[80];
        quote(q, sizeof q, kv->key.ptr, kv->key.len);
        snprintf(r->ctx, sizeof r->ctx, "kv %llu '%s'", (ull)i, q);
        uint64_t at = r->pos;
        uint32_t t = 0;
        if ((rc = take(r, &t, 4, "value type")))
            return rc;
        if (t > GGUF_FLOAT64)
            return fail_at(r, at, "value type %u unknown", t);
        kv->type = t;
        kv->val_off = r->pos;
        if (t == GGUF_STRING) {
            struct gguf_str s;
            if ((rc = take_str(r, &s, UINT64_MAX, "string", -1)))
                return rc;
            kv->n = s.len;
            kv->data_off = kv->val_off + 8;
        } else if (t == GGUF_ARRAY) {
            kv->str0 = f->n_stroff;
            if ((rc = take_array(r, f, 1, true, &kv->atype, &kv->n)))
                return rc;
            kv->data_off = kv->val_off + 12;
        } else {
            char what[32];
            snprintf(what, sizeof what, "%s value", vname[t]);
            uint8_t buf[8];
            if ((rc = take(r, buf, vsize[t], what)))
                return rc;
            kv->data_off = kv->val_off;
        }
        kv->val_len = r->pos - kv->val_off;
        f->n_kv = (int64_t)i + 1;
    }
    /* Index the keys; a key seen twice is refused. */
    f->kv_hcap = table_cap(f->n_kv);
    f->kv_hash = calloc(f->kv_hcap, sizeof *f->kv_hash);
    if (!f->kv_hash)
        return cairn_fail(r->err, r->errlen, CAIRN_ENOMEM, "out of memory indexing %lld keys", (long long)f->n_kv);
    uint64_t m = f->kv_hcap - 1;
    for (int64_t i = 0; i < f->n_kv; i++) {
        const struct kv *kv = &f->kvs[i];
        int64_t prev = kv_lookup(f, kv->key.ptr, kv->key.len);
        if (prev >= 0) {
            char q[80];
            quote(q, sizeof q, kv->key.ptr, kv->key.len);
            snprintf(r->ctx, sizeof r->ctx, "kv %lld '%s'", (long long)i, q);
            return fail_at(r, kv->key_off, "duplicate key (first set by kv %lld)", (long long)prev);
        }
        uint64_t h = hash_bytes(kv->key.ptr, kv->key.len) & m;
        while (f->kv_hash[h])
            h = (h + 1) & m;
        f->kv_hash[h] = i + 1;
    }
    return 0;
}

static int parse_tensor(struct rd *r, struct gguf_file *f, uint64_t i)
{
    struct gguf_tensor *t = &f->tensors[i];
    memset(t, 0, sizeof *t);
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu", (ull)i);
    f->tensor_off[i] = r->pos;
    struct gguf_str name;
    int rc;
    if ((rc = take_str(r, &name, TENSOR_NAME_MAX, "name", -1)))
        return rc;
    if (!name.len)
        return fail_at(r, f->tensor_off[i], "name is empty");
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = 0;
    if (strlen(t->name) != name.len)
        return fail_at(r, f->tensor_off[i], "name contains a NUL byte");
    char q[80];
    quote(q, sizeof q, name.ptr, name.len);
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu '%s'", (ull)i, q);

    uint64_t at = r->pos;
    uint32_t nd = 0;
    if ((rc = take(r, &nd, 4, "n_dims")))
        return rc;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return fail_at(r, at, "n_dims %u not in 1..%d", nd, GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v = 0;
        at = r->pos;
        char what[16];
        snprintf(what, sizeof what, "dim %u", d);
        if ((rc = take(r, &v, 8, what)))
            return rc;
        if (v > INT64_MAX)
            return fail_at(r, at, "dim %u = %lld is negative", d, (long long)(int64_t)v);
        t->ne[d] = (int64_t)v;
        /* Zero dims count as 1 here so that no product of some dims (rows = ne1*ne2*ne3)
         * overflows in the callers either. */
        if (v && nel > INT64_MAX / (int64_t)v)
            return fail_at(r, at, "dim %u = %llu makes the element count overflow int64", d, (ull)v);
        if (v)
            nel *= (int64_t)v;
    }
    at = r->pos;
    uint32_t type = 0;
    if ((rc = take(r, &type, 4, "type")))
        return rc;
    const struct dtype_info *ti = dtype_info((int)type);
    if (type > INT32_MAX || !ti)
        return fail_at(r, at, "type %u unknown", type);
    t->type = (int)type;
    if (t->ne[0] % ti->block_elems)
        return fail_at(r, at, "ne[0] = %lld is not a multiple of the %s block size %d", (long long)t->ne[0], ti->name,
                       ti->block_elems);
    /* Bytes: row bytes times rows, with an overflow check. */
    uint64_t blocks = (uint64_t)(t->ne[0] / ti->block_elems);
    if (blocks > UINT64_MAX / (uint64_t)ti->block_bytes)
        return fail_at(r, at, "size in bytes overflows 64 bits");
    uint64_t size = blocks * (uint64_t)ti->block_bytes;
    for (int d = 1; d < t->n_dims; d++) {
        uint64_t v = (uint64_t)t->ne[d];
        if (v && size > UINT64_MAX / v)
            return fail_at(r, at, "size in bytes overflows 64 bits");
        size *= v;
    }
    t->size = size;
    at = r->pos;
    if ((rc = take(r, &t->offset, 8, "data offset")))
        return rc;
    if (t->offset % f->alignment)
        return fail_at(r, at, "data offset %llu not aligned to %u", (ull)t->offset, f->alignment);
    return 0;
}

static int parse(struct gguf_file *f, char *err, size_t errlen)
{
    struct rd r = {.p = f->base, .size = f->size, .err = err, .errlen = errlen};
    snprintf(r.ctx, sizeof r.ctx, "header");
    int rc;
    char magic[4];
    if ((rc = take(&r, magic, 4, "magic")))
        return rc;
    if (memcmp(magic, "GGUF", 4)) {
        char q[16];
        quote(q, sizeof q, magic, 4);
        return fail_at(&r, 0, "bad magic '%s' (expected 'GGUF')", q);
    }
    if ((rc = take(&r, &f->version, 4, "version")))
        return rc;
    if (f->version != 2 && f->version != 3)
        return fail_at(&r, 4, "version %u not supported (need 2 or 3%s)", f->version,
                       (f->version & 0xffff) == 0 ? "; a big-endian file?" : "");
    uint64_t n_t = 0, n_kv = 0;
    if ((rc = take(&r, &n_t, 8, "tensor count")) || (rc = take(&r, &n_kv, 8, "kv count")))
        return rc;
    if (n_kv > left(&r) / KV_MIN_BYTES)
        return fail_at(&r, 16, "kv count %llu needs at least %llu bytes but %llu remain", (ull)n_kv,
                       n_kv > UINT64_MAX / KV_MIN_BYTES ? UINT64_MAX : (ull)n_kv * KV_MIN_BYTES, (ull)left(&r));
    if (n_t > (left(&r) - n_kv * KV_MIN_BYTES) / TENSOR_MIN_BYTES)
        return fail_at(&r, 8, "tensor count %llu needs at least %llu bytes but %llu remain after the kvs",
                       (ull)n_t, n_t > UINT64_MAX / TENSOR_MIN_BYTES ? UINT64_MAX : (ull)n_t * TENSOR_MIN_BYTES,
                       (ull)(left(&r) - n_kv * KV_MIN_BYTES));
    if ((rc = parse_kvs(&r, f, n_kv)))
        return rc;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = kv_lookup(f, "general.alignment", 17);
    if (ai >= 0) {
        const struct kv *kv = &f->kvs[ai];
        snprintf(r.ctx, sizeof r.ctx, "kv %lld 'general.alignment'", (long long)ai);
        if (kv->type != GGUF_UINT32)
            return fail_at(&r, kv->val_off, "alignment has type %s, expected u32", vname[kv->type]);
        uint32_t a;
        memcpy(&a, f->base + kv->data_off, 4);
        if (a == 0 || (a & (a - 1)))
            return fail_at(&r, kv->val_off, "alignment %u is not a power of two", a);
        f->alignment = a;
    }

    /* Tensor infos; arrays grow as infos are parsed. */
    for (uint64_t i = 0; i < n_t; i++) {
        if (array_reserve(&f->tensors, &f->cap_tensors, i + 1, sizeof *f->tensors, 16) ||
            array_reserve(&f->tensor_off, &f->cap_tensor_off, i + 1, sizeof *f->tensor_off, 16))
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory reading tensor %llu", (ull)i);
        if ((rc = parse_tensor(&r, f, i)))
            return rc;
        f->n_tensors = (int64_t)i + 1;
    }

    uint64_t pad = (f->alignment - r.pos % f->alignment) % f->alignment;
    f->data_offset = r.pos + pad; /* cannot overflow: r.pos <= size < 2^64 - 2^32 in practice */
    if (f->data_offset < r.pos)
        return fail_at(&r, r.pos, "data section offset overflows");

    f->t_hcap = table_cap(f->n_tensors);
    f->t_hash = calloc(f->t_hcap, sizeof *f->t_hash);
    if (!f->t_hash)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory indexing %lld tensors", (long long)f->n_tensors);
    uint64_t m = f->t_hcap - 1;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        char q[80];
        quote(q, sizeof q, t->name, strlen(t->name));
        snprintf(r.ctx, sizeof r.ctx, "tensor %lld '%s'", (long long)i, q);
        uint64_t start = f->data_offset + t->offset, bound = f->whole_size ? f->whole_size : f->size;
        if (start < t->offset || start > bound || t->size > bound - start)
            return fail_at(&r, f->tensor_off[i],
                           "data [%llu, %llu) of the data section (at %llu) past end of file (%llu bytes)",
                           (ull)t->offset, (ull)(t->offset + t->size), (ull)f->data_offset, (ull)bound);
        t->data = f->whole_size ? NULL : f->base + start; /* a prefix holds no data */
        size_t len = strlen(t->name);
        int64_t prev = tensor_lookup(f, t->name, len);
        if (prev >= 0)
            return fail_at(&r, f->tensor_off[i], "duplicate tensor name (first is tensor %lld)", (long long)prev);
        uint64_t h = hash_bytes(t->name, len) & m;
        while (f->t_hash[h])
            h = (h + 1) & m;
        f->t_hash[h] = i + 1;
    }
    return 0;
}

/* Parses size bytes at data (whole_size: of a file that long, 0: those bytes are the
 * file) into a new *out. */
static int parse_memory(struct gguf_file **out, const void *data, size_t size, uint64_t whole_size, char *err,
                        size_t errlen)
{
    *out = NULL;
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    static const uint8_t empty[1];
    f->base = data ? data : empty;
    f->size = size;
    f->whole_size = whole_size;
    int rc = parse(f, err, errlen);
    if (rc)
        gguf_close(f);
    else
        *out = f;
    return rc;
}

int gguf_open_memory(struct gguf_file **out, const void *data, size_t size, char *err, size_t errlen)
{
    *out = NULL;
    if (!data && size)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "gguf_open_memory: NULL data with size %zu", size);
    return parse_memory(out, data, size, 0, err, errlen);
}

int gguf_header_end(const void *data, size_t size, uint64_t file_size, uint64_t *end, char *err, size_t errlen)
{
    *end = 0;
    if ((!data && size) || size > file_size || !file_size)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "gguf_header_end: %zu bytes of a %llu-byte file", size,
                          (ull)file_size);
    struct gguf_file *f = NULL;
    int rc = parse_memory(&f, data, size, file_size, err, errlen);
    if (!rc)
        *end = f->data_offset;
    gguf_close(f);
    return rc;
}

/* Opens one file (one part of a split model). */
static int open_one(struct gguf_file **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_fail(err, errlen, errno == ENOENT ? CAIRN_ENOTFOUND : CAIRN_EIO, "open %s: %s", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return cairn_fail(err, errlen, CAIRN_EIO, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: %lld bytes do not fit the address space", path,
                          (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cairn_fail(err, errlen, CAIRN_EIO, "mmap %s (%zu bytes): %s", path, size, strerror(e));
        }
    }
    close(fd);
    char msg[512];
    struct gguf_file *f;
    int rc = gguf_open_memory(&f, map, size, msg, sizeof msg);
    if (rc) {
        if (map)
            munmap(map, size);
        return cairn_fail(err, errlen, rc, "%s: %s", path, msg);
    }
    f->mapped = map != NULL;
    f->path = strdup(path);
    if (!f->path) {
        gguf_close(f);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    *out = f;
    return 0;
}

/* ---- split models (gguf-split) ----
 * A model split by gguf-split is parts NAME-00001-of-0000N.gguf .. NAME-0000N-of-0000N.gguf,
 * each a GGUF file: the first holds the key/values, every part "split.no" (0-based, u16),
 * "split.count" and some of the tensors; the first also "split.tensors.count". Opening the
 * first part opens the others by name and lists their tensors after its own, each
 * pointing into its part's mapping; the key/values are the first part's. */

#define SPLIT_MAX_PARTS 1000

/* Part k's path from the first part's (its name ends "-00001-of-0000N.gguf"). */
static bool part_path(const char *first, uint32_t k, uint32_t n, char *out, size_t cap)
{
    size_t len = strlen(first);
    char tail[32];
    snprintf(tail, sizeof tail, "-%05u-of-%05u.gguf", 1u, n);
    if (len < strlen(tail) || strcmp(first + len - strlen(tail), tail))
        return false;
    int w = snprintf(out, cap, "%.*s-%05u-of-%05u.gguf", (int)(len - strlen(tail)), first, k, n);
    return w > 0 && (size_t)w < cap;
}

/* Rebuilds the name index over every tensor; the index of a second tensor of a name
 * already seen, -1 when all are distinct, -2 when out of memory. */
static int64_t reindex(struct gguf_file *f)
{
    free(f->t_hash);
    f->t_hcap = table_cap(f->n_tensors);
    f->t_hash = calloc(f->t_hcap, sizeof *f->t_hash);
    if (!f->t_hash)
        return -2;
    uint64_t m = f->t_hcap - 1;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        size_t len = strlen(f->tensors[i].name);
        if (tensor_lookup(f, f->tensors[i].name, len) >= 0)
            return i;
        uint64_t h = hash_bytes(f->tensors[i].name, len) & m;
        while (f->t_hash[h])
            h = (h + 1) & m;
        f->t_hash[h] = i + 1;
    }
    return -1;
}

/* Adds the tensors of part p (number k, 0-based) after f's. */
static int take_part(struct gguf_file *f, struct gguf_file *p, int k)
{
    if (array_reserve(&f->tensors, &f->cap_tensors, (size_t)(f->n_tensors + p->n_tensors), sizeof *f->tensors, 16))
        return CAIRN_ENOMEM;
    for (int64_t i = 0; i < p->n_tensors; i++) {
        f->tensors[f->n_tensors] = p->tensors[i];
        f->tensors[f->n_tensors++].part = k;
    }
    f->parts[f->n_parts++] = p;
    return 0;
}

/* The split keys of a part: its number and the count; false when it has none. */
static bool split_keys(const struct gguf_file *f, uint32_t *no, uint32_t *count)
{
    return gguf_get_u32(f, "split.count", count) == 0 && gguf_get_u32(f, "split.no", no) == 0;
}

/* Opens the other parts of f when f is the first part of a split model. */
static int join_parts(struct gguf_file *f, char *err, size_t errlen)
{
    uint32_t no = 0, count = 1;
    if (!split_keys(f, &no, &count) || count <= 1)
        return 0;
    if (no != 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s is part %u of %u of a split model: open its first part",
                          f->path, no + 1, count);
    int64_t want = 0;
    if (count > SPLIT_MAX_PARTS || gguf_get_i64(f, "split.tensors.count", &want) || want < 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: a split model needs split.count <= %d and "
                          "split.tensors.count", f->path, SPLIT_MAX_PARTS);
    char path[4096];
    if (!part_path(f->path, 1, count, path, sizeof path))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the first of %u parts must be named NAME-00001-of-%05u.gguf",
                          f->path, count, count);
    f->parts = calloc(count - 1, sizeof *f->parts);
    if (!f->parts)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    for (uint32_t k = 1; k < count; k++) {
        part_path(f->path, k + 1, count, path, sizeof path);
        struct gguf_file *p = NULL;
        int rc = open_one(&p, path, err, errlen);
        if (rc)
            return rc == CAIRN_ENOTFOUND ? cairn_fail(err, errlen, rc, "part %u of %u of the split model is missing: "
                                                      "%s", k + 1, count, path) : rc;
        uint32_t pno = 0, pcount = 0;
        if (!split_keys(p, &pno, &pcount) || pno != k || pcount != count) {
            gguf_close(p);
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: split.no %u and split.count %u, expected %u of %u", path,
                              pno + 1, pcount, k + 1, count);
        }
        if (take_part(f, p, (int)k)) {
            gguf_close(p);
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        }
    }
    if (f->n_tensors != want)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the %u parts hold %lld tensors, split.tensors.count says %lld",
                          f->path, count, (long long)f->n_tensors, (long long)want);
    int64_t dup = reindex(f);
    if (dup == -2)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (dup >= 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tensor '%s' is in two parts (the second in part %d)",
                          f->tensors[dup].name, f->tensors[dup].part + 1);
    return 0;
}

int gguf_open(struct gguf_file **out, const char *path, char *err, size_t errlen)
{
    int rc = open_one(out, path, err, errlen);
    if (!rc && (rc = join_parts(*out, err, errlen))) {
        gguf_close(*out);
        *out = NULL;
    }
    return rc;
}

const char *gguf_tensor_file(const struct gguf_file *f, const struct gguf_tensor *t)
{
    return t->part > 0 && t->part <= f->n_parts ? f->parts[t->part - 1]->path : f->path;
}

uint64_t gguf_tensor_file_offset(const struct gguf_file *f, const struct gguf_tensor *t)
{
    const struct gguf_file *p = t->part > 0 && t->part <= f->n_parts ? f->parts[t->part - 1] : f;
    return (uint64_t)((const uint8_t *)t->data - p->base);
}

int gguf_n_parts(const struct gguf_file *f) { return 1 + f->n_parts; }

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    if (f->mapped)
        munmap((void *)f->base, f->size);
    for (int i = 0; i < f->n_parts; i++)
        gguf_close(f->parts[i]);
    free(f->parts);
    free(f->path);
    free(f->kvs);
    free(f->tensors);
    free(f->tensor_off);
    free(f->stroff);
    free(f->kv_hash);
    free(f->t_hash);
    free(f);
}

uint32_t gguf_version(const struct gguf_file *f)
{
    return f->version;
}

uint64_t gguf_file_size(const struct gguf_file *f)
{
    uint64_t n = f->size;
    for (int i = 0; i < f->n_parts; i++)
        n += f->parts[i]->size;
    return n;
}

uint32_t gguf_alignment(const struct gguf_file *f)
{
    return f->alignment;
}

uint64_t gguf_data_offset(const struct gguf_file *f)
{
    return f->data_offset;
}

const void *gguf_base(const struct gguf_file *f)
{
    return f->base;
}

int64_t gguf_n_kv(const struct gguf_file *f)
{
    return f->n_kv;
}

struct gguf_str gguf_kv_key(const struct gguf_file *f, int64_t i)
{
    if (i < 0 || i >= f->n_kv)
        return (struct gguf_str){0};
    return f->kvs[i].key;
}

enum gguf_vtype gguf_kv_type(const struct gguf_file *f, int64_t i)
{
    if (i < 0 || i >= f->n_kv)
        return (enum gguf_vtype)-1;
    return f->kvs[i].type;
}

int gguf_kv_raw(const struct gguf_file *f, int64_t i, const void **data, uint64_t *len)
{
    if (i < 0 || i >= f->n_kv)
        return CAIRN_EINVAL;
    *data = f->base + f->kvs[i].val_off;
    *len = f->kvs[i].val_len;
    return 0;
}

int64_t gguf_find_key(const struct gguf_file *f, const char *key)
{
    return kv_lookup(f, key, strlen(key));
}

/* ---- value conversion ---- */

static bool elem_int(enum gguf_vtype t, const uint8_t *p, __int128 *out)
{
    switch (t) {
    case GGUF_UINT8: *out = *p; return true;
    case GGUF_INT8: *out = (int8_t)*p; return true;
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); *out = v; return true; }
    case GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    default: return false;
    }
}

static bool elem_float(enum gguf_vtype t, const uint8_t *p, double *out)
{
    __int128 i;
    if (t == GGUF_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return true;
    }
    if (t == GGUF_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    if (elem_int(t, p, &i)) {
        *out = (double)i;
        return true;
    }
    return false;
}

static const struct kv *find(const struct gguf_file *f, const char *key)
{
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kvs[i];
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    const struct kv *kv = find(f, key);
    __int128 v;
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (!elem_int(kv->type, f->base + kv->data_off, &v) || v < 0 || v > UINT32_MAX)
        return CAIRN_EFORMAT;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct kv *kv = find(f, key);
    __int128 v;
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (!elem_int(kv->type, f->base + kv->data_off, &v) || v < INT64_MIN || v > INT64_MAX)
        return CAIRN_EFORMAT;
    *out = (int64_t)v;
    return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
    const struct kv *kv = find(f, key);
    double v;
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (!elem_float(kv->type, f->base + kv->data_off, &v))
        return CAIRN_EFORMAT;
    *out = (float)v;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, int *out)
{
    const struct kv *kv = find(f, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type != GGUF_BOOL)
        return CAIRN_EFORMAT;
    *out = f->base[kv->data_off] != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
    const struct kv *kv = find(f, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type != GGUF_STRING)
        return CAIRN_EFORMAT;
    out->ptr = (const char *)f->base + kv->data_off;
    out->len = kv->n;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, struct gguf_array *out)
{
    int64_t i = gguf_find_key(f, key);
    if (i < 0)
        return CAIRN_ENOTFOUND;
    const struct kv *kv = &f->kvs[i];
    if (kv->type != GGUF_ARRAY)
        return CAIRN_EFORMAT;
    out->type = kv->atype;
    out->n = kv->n;
    out->data = f->base + kv->data_off;
    out->kv = i;
    return 0;
}

struct gguf_str gguf_arr_str(const struct gguf_file *f, const struct gguf_array *a, uint64_t i)
{
    if (a->kv < 0 || a->kv >= f->n_kv)
        return (struct gguf_str){0};
    const struct kv *kv = &f->kvs[a->kv];
    if (kv->type != GGUF_ARRAY || kv->atype != GGUF_STRING || i >= kv->n)
        return (struct gguf_str){0};
    uint64_t off = f->stroff[kv->str0 + i], len;
    memcpy(&len, f->base + off, 8);
    return (struct gguf_str){(const char *)f->base + off + 8, len};
}

int64_t gguf_arr_int(const struct gguf_array *a, uint64_t i)
{
    if (a->type > GGUF_FLOAT64 || !vsize[a->type] || i >= a->n)
        return 0;
    const uint8_t *p = (const uint8_t *)a->data + i * vsize[a->type];
    __int128 v;
    if (a->type == GGUF_BOOL)
        return *p != 0;
    if (!elem_int(a->type, p, &v) || v > INT64_MAX)
        return 0;
    return (int64_t)v;
}

double gguf_arr_float(const struct gguf_array *a, uint64_t i)
{
    if (a->type > GGUF_FLOAT64 || !vsize[a->type] || i >= a->n)
        return 0;
    const uint8_t *p = (const uint8_t *)a->data + i * vsize[a->type];
    double v;
    if (a->type == GGUF_BOOL)
        return *p != 0;
    return elem_float(a->type, p, &v) ? v : 0;
}

int64_t gguf_n_tensors(const struct gguf_file *f)
{
    return f->n_tensors;
}

const struct gguf_tensor *gguf_tensor(const struct gguf_file *f, int64_t i)
{
    return i < 0 || i >= f->n_tensors ? NULL : &f->tensors[i];
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    int64_t i = tensor_lookup(f, name, strlen(name));
    return i < 0 ? NULL : &f->tensors[i];
}

int64_t gguf_tensor_nelems(const struct gguf_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++)
        n *= t->ne[d];
    return n;
}
