/* GGUF writer: key/values are kept encoded (type field + value bytes as they go in the
 * file); tensors keep their shape and a data pointer or fill callback until write time.
 * Layout is the one ggml writes: header, kvs, tensor infos, zero padding to the
 * alignment, then each tensor's data padded with zeros to the alignment. */
#include "gguf/gguf.h"

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY_MAX_LEN 65535u

struct wkv {
    char *key;
    size_t keylen;
    uint8_t *val; /* u32 type then the encoded value */
    size_t len;
};

struct wtensor {
    char name[256];
    int type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t size;
    const void *data;
    gguf_fill_fn fill;
    void *fill_ctx;
};

struct gguf_writer {
    struct wkv *kvs;
    size_t n_kv, cap_kv;
    struct wtensor *ts;
    size_t n_t, cap_t;
};

static const uint8_t vsize[GGUF_FLOAT64 + 1] = {
    [GGUF_UINT8] = 1, [GGUF_INT8] = 1, [GGUF_UINT16] = 2, [GGUF_INT16] = 2,
    [GGUF_UINT32] = 4, [GGUF_INT32] = 4, [GGUF_FLOAT32] = 4, [GGUF_BOOL] = 1,
    [GGUF_UINT64] = 8, [GGUF_INT64] = 8, [GGUF_FLOAT64] = 8,
};

int gguf_writer_create(struct gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : CAIRN_ENOMEM;
}

void gguf_writer_release(struct gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    free(w->kvs);
    free(w->ts);
    free(w);
}

static struct wkv *find_kv(struct gguf_writer *w, const char *key, size_t len)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->kvs[i].keylen == len && !memcmp(w->kvs[i].key, key, len))
            return &w->kvs[i];
    return NULL;
}

/* Stores an encoded value (taking ownership of val) under key, replacing an old one. */
static int put_n(struct gguf_writer *w, const char *key, size_t klen, uint8_t *val, size_t len)
{
    if (!klen || klen > KEY_MAX_LEN) {
        free(val);
        return CAIRN_EINVAL;
    }
    struct wkv *kv = find_kv(w, key, klen);
    if (kv) {
        free(kv->val);
        kv->val = val;
        kv->len = len;
        return 0;
    }
    char *k = malloc(klen + 1);
    if (!k || array_reserve(&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof *w->kvs, 16)) {
        free(k);
        free(val);
        return CAIRN_ENOMEM;
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    w->kvs[w->n_kv++] = (struct wkv){k, klen, val, len};
    return 0;
}

static int put(struct gguf_writer *w, const char *key, uint8_t *val, size_t len)
{
    return put_n(w, key, key ? strlen(key) : 0, val, len);
}

/* Allocates type field + n value bytes; returns the value part. */
static uint8_t *alloc_val(uint32_t type, size_t n, uint8_t **whole)
{
    if (n > SIZE_MAX - 4)
        return NULL;
    uint8_t *v = malloc(4 + n);
    if (!v)
        return NULL;
    memcpy(v, &type, 4);
    *whole = v;
    return v + 4;
}

static int put_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *v)
{
    uint8_t *whole, *p = alloc_val(type, vsize[type], &whole);
    if (!p)
        return CAIRN_ENOMEM;
    memcpy(p, v, vsize[type]);
    return put(w, key, whole, 4 + vsize[type]);
}

int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *v)
{
    if ((unsigned)type > GGUF_FLOAT64 || !vsize[type] || !v)
        return CAIRN_EINVAL;
    if (type == GGUF_BOOL) {
        uint8_t b = *(const uint8_t *)v != 0;
        return put_scalar(w, key, type, &b);
    }
    return put_scalar(w, key, type, v);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return put_scalar(w, key, GGUF_UINT32, &v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return put_scalar(w, key, GGUF_INT32, &v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return put_scalar(w, key, GGUF_UINT64, &v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    return put_scalar(w, key, GGUF_FLOAT32, &v);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return put_scalar(w, key, GGUF_BOOL, &b);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s, size_t len)
{
    if (!s && len)
        return CAIRN_EINVAL;
    if (len > SIZE_MAX - 8)
        return CAIRN_ENOMEM;
    uint8_t *whole, *p = alloc_val(GGUF_STRING, 8 + len, &whole);
    if (!p)
        return CAIRN_ENOMEM;
    uint64_t l = len;
    memcpy(p, &l, 8);
    if (len)
        memcpy(p + 8, s, len);
    return put(w, key, whole, 4 + 8 + len);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *data,
                        uint64_t n)
{
    if ((unsigned)type > GGUF_FLOAT64 || !vsize[type] || (!data && n))
        return CAIRN_EINVAL;
    if (n > (SIZE_MAX - 16) / vsize[type])
        return CAIRN_ENOMEM;
    size_t bytes = (size_t)n * vsize[type];
    uint8_t *whole, *p = alloc_val(GGUF_ARRAY, 12 + bytes, &whole);
    if (!p)
        return CAIRN_ENOMEM;
    uint32_t t = type;
    memcpy(p, &t, 4);
    memcpy(p + 4, &n, 8);
    if (bytes)
        memcpy(p + 12, data, bytes);
    return put(w, key, whole, 4 + 12 + bytes);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n)
{
    if (n && (!strs || !lens))
        return CAIRN_EINVAL;
    size_t bytes = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i] && lens[i])
            return CAIRN_EINVAL;
        if (lens[i] > SIZE_MAX - 16 - bytes)
            return CAIRN_ENOMEM;
        bytes += 8 + (size_t)lens[i];
    }
    uint8_t *whole, *p = alloc_val(GGUF_ARRAY, bytes, &whole);
    if (!p)
        return CAIRN_ENOMEM;
    uint32_t t = GGUF_STRING;
    memcpy(p, &t, 4);
    memcpy(p + 4, &n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(p + o, &lens[i], 8);
        if (lens[i])
            memcpy(p + o + 8, strs[i], (size_t)lens[i]);
        o += 8 + (size_t)lens[i];
    }
    return put(w, key, whole, 4 + bytes);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src, int64_t i)
{
    const void *raw;
    uint64_t len;
    if (gguf_kv_raw(src, i, &raw, &len))
        return CAIRN_EINVAL;
    struct gguf_str k = gguf_kv_key(src, i);
    if (len > SIZE_MAX - 4)
        return CAIRN_ENOMEM;
    uint8_t *whole, *p = alloc_val(gguf_kv_type(src, i), (size_t)len, &whole);
    if (!p)
        return CAIRN_ENOMEM;
    memcpy(p, raw, (size_t)len);
    return put_n(w, k.ptr, (size_t)k.len, whole, 4 + (size_t)len);
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                           const void *data, gguf_fill_fn fill, void *fill_ctx)
{
    size_t nlen = name ? strlen(name) : 0;
    const struct dtype_info *ti = dtype_info(type);
    if (!nlen || nlen > 255 || !ti || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne || (!data) == (!fill))
        return CAIRN_EINVAL;
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill, .fill_ctx = fill_ctx};
    memcpy(t.name, name, nlen + 1);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = d < n_dims ? ne[d] : 1;
    if (t.ne[0] < 0 || t.ne[0] % ti->block_elems)
        return CAIRN_EINVAL;
    uint64_t blocks = (uint64_t)(t.ne[0] / ti->block_elems);
    if (blocks > UINT64_MAX / (uint64_t)ti->block_bytes)
        return CAIRN_ERANGE;
    uint64_t size = blocks * (uint64_t)ti->block_bytes;
    int64_t nel = t.ne[0];
    for (int d = 1; d < n_dims; d++) {
        int64_t v = t.ne[d];
        if (v < 0)
            return CAIRN_EINVAL;
        if ((v && size > UINT64_MAX / (uint64_t)v) || (v && nel > INT64_MAX / v))
            return CAIRN_ERANGE;
        size *= (uint64_t)v;
        nel *= v;
    }
    t.size = size;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->ts[i].name, name))
            return CAIRN_EINVAL;
    if (array_reserve(&w->ts, &w->cap_t, w->n_t + 1, sizeof *w->ts, 16))
        return CAIRN_ENOMEM;
    w->ts[w->n_t++] = t;
    return 0;
}

/* ---- output ---- */

struct out {
    FILE *fp;
    uint64_t pos;
    int err; /* errno of the first failed write */
};

static void emit(struct out *o, const void *p, size_t n)
{
    if (o->err || !n)
        return;
    if (fwrite(p, 1, n, o->fp) != n)
        o->err = errno ? errno : EIO;
    o->pos += n;
}

static void emit_u32(struct out *o, uint32_t v)
{
    emit(o, &v, 4);
}

static void emit_u64(struct out *o, uint64_t v)
{
    emit(o, &v, 8);
}

static void emit_pad(struct out *o, uint32_t align)
{
    static const uint8_t zeros[256];
    uint64_t pad = (align - o->pos % align) % align;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        emit(o, zeros, n);
        pad -= n;
    }
}

static uint64_t padded(uint64_t n, uint32_t align)
{
    return n + (align - n % align) % align;
}

static int write_body(struct gguf_writer *w, struct out *o, uint32_t align, const char *tmp, char *err,
                      size_t errlen)
{
    emit(o, "GGUF", 4);
    emit_u32(o, 3);
    emit_u64(o, w->n_t);
    emit_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        emit_u64(o, w->kvs[i].keylen);
        emit(o, w->kvs[i].key, w->kvs[i].keylen);
        emit(o, w->kvs[i].val, w->kvs[i].len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->ts[i];
        size_t nlen = strlen(t->name);
        emit_u64(o, nlen);
        emit(o, t->name, nlen);
        emit_u32(o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            emit_u64(o, (uint64_t)t->ne[d]);
        emit_u32(o, (uint32_t)t->type);
        emit_u64(o, off);
        if (padded(t->size, align) < t->size || off + padded(t->size, align) < off)
            return cairn_fail(err, errlen, CAIRN_ERANGE, "%s: tensor '%s': data offsets overflow 64 bits", tmp,
                              t->name);
        off += padded(t->size, align);
    }
    emit_pad(o, align);
    for (size_t i = 0; i < w->n_t && !o->err; i++) {
        const struct wtensor *t = &w->ts[i];
        if (t->data) {
            emit(o, t->data, (size_t)t->size);
        } else if (t->size) {
            if (t->size > SIZE_MAX)
                return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: tensor '%s': %llu bytes", tmp, t->name,
                                  (unsigned long long)t->size);
            void *buf = malloc((size_t)t->size);
            if (!buf)
                return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: tensor '%s': no memory for %llu bytes", tmp,
                                  t->name, (unsigned long long)t->size);
            int rc = t->fill(t->fill_ctx, buf, t->size);
            if (rc) {
                free(buf);
                return cairn_fail(err, errlen, rc < 0 ? rc : CAIRN_EIO, "%s: tensor '%s': fill failed: %s", tmp,
                                  t->name, cairn_strerror(rc));
            }
            emit(o, buf, (size_t)t->size);
            free(buf);
        }
        emit_pad(o, align);
    }
    if (o->err)
        return cairn_fail(err, errlen, CAIRN_EIO, "write %s: %s", tmp, strerror(o->err));
    return 0;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t errlen)
{
    uint32_t align = GGUF_DEFAULT_ALIGNMENT;
    struct wkv *a = find_kv(w, "general.alignment", 17);
    if (a) {
        uint32_t type;
        memcpy(&type, a->val, 4);
        if (type != GGUF_UINT32 || a->len != 8)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "%s: general.alignment must be a u32", path);
        memcpy(&align, a->val + 4, 4);
        if (!align || (align & (align - 1)))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "%s: general.alignment %u is not a power of two", path,
                              align);
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    struct out o = {.fp = fopen(tmp, "wb")};
    if (!o.fp) {
        int rc = cairn_fail(err, errlen, CAIRN_EIO, "open %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    setvbuf(o.fp, NULL, _IOFBF, 1 << 20);
    int rc = write_body(w, &o, align, tmp, err, errlen);
    if (!rc && (fflush(o.fp) || fsync(fileno(o.fp))))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "write %s: %s", tmp, strerror(errno));
    if (fclose(o.fp) && !rc)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "close %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* ---- split models ---- */

/* One part: split.* of part k of n, and for the first the other key/values too. */
static int split_part(const struct gguf_file *src, int k, int n, int64_t first, int64_t end, const char *path,
                      char *err, size_t errlen)
{
    struct gguf_writer *w = NULL;
    int rc = gguf_writer_create(&w);
    for (int64_t i = 0; !rc && i < gguf_n_kv(src); i++) {
        struct gguf_str key = gguf_kv_key(src, i);
        bool split_key = key.len > 6 && !memcmp(key.ptr, "split.", 6);
        bool align = key.len == 17 && !memcmp(key.ptr, "general.alignment", 17);
        if (!split_key && (k == 0 || align))
            rc = gguf_writer_copy_kv(w, src, i);
    }
    uint16_t no = (uint16_t)k, count = (uint16_t)n;
    if (!rc)
        rc = gguf_writer_set_scalar(w, "split.no", GGUF_UINT16, &no);
    if (!rc)
        rc = gguf_writer_set_scalar(w, "split.count", GGUF_UINT16, &count);
    if (!rc)
        rc = gguf_writer_set_i32(w, "split.tensors.count", (int32_t)gguf_n_tensors(src));
    for (int64_t i = first; !rc && i < end; i++) {
        const struct gguf_tensor *t = gguf_tensor(src, i);
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL);
    }
    if (rc)
        cairn_fail(err, errlen, rc, "part %d of %d: cannot build it", k + 1, n);
    else
        rc = gguf_writer_write(w, path, err, errlen);
    gguf_writer_release(w);
    return rc;
}

int gguf_write_split(const struct gguf_file *src, int n_parts, const char *stem, char *err, size_t errlen)
{
    int64_t nt = gguf_n_tensors(src);
    if (n_parts < 2 || n_parts > 99999 || n_parts > nt)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%d parts of a model of %lld tensors (2 up to one per tensor)",
                          n_parts, (long long)nt);
    for (int k = 0; k < n_parts; k++) {
        char path[4096];
        int w = snprintf(path, sizeof path, "%s-%05d-of-%05d.gguf", stem, k + 1, n_parts);
        if (w < 0 || (size_t)w >= sizeof path)
            return cairn_fail(err, errlen, CAIRN_ERANGE, "the path of a part is too long");
        int rc = split_part(src, k, n_parts, nt * k / n_parts, nt * (k + 1) / n_parts, path, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}
