/* GGUF v3 files: a validating reader over an mmapped file (or a caller's buffer) and a
 * writer. Format: magic "GGUF", u32 version, u64 tensor count, u64 kv count, then the
 * key/values, the tensor infos, padding to general.alignment (default 32), tensor data.
 *
 * The reader checks every field against the file size with 64-bit overflow checks
 * before anything points into the mapping; a bad file is refused with a message that
 * names the field and its byte offset, e.g.
 *   "tensor 3 'blk.0.attn_q.weight': data [4096, 8192) past end of file (6000 bytes) at offset 812".
 * Strings returned point into the mapping (not NUL-terminated; use the length) and live
 * until gguf_close. */
#ifndef CAIRN_GGUF_GGUF_H
#define CAIRN_GGUF_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4,
    GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9,
    GGUF_UINT64 = 10, GGUF_INT64 = 11, GGUF_FLOAT64 = 12,
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_str {
    const char *ptr; /* into the mapping; not NUL-terminated */
    uint64_t len;
};

/* A typed array value. Numeric elements are contiguous at `data` (possibly unaligned:
 * read with memcpy or the gguf_arr_* helpers). String arrays are read with gguf_arr_str
 * (O(1): an index of every string is built at open). Arrays of arrays (type GGUF_ARRAY,
 * nesting at most 8 deep) are validated, and `data` points at the first inner array's
 * encoding, but the helpers do not read them. */
struct gguf_array {
    enum gguf_vtype type;
    uint64_t n;
    const void *data;
    int64_t kv; /* index of the key/value holding it */
};

struct gguf_tensor {
    char name[256];              /* NUL-terminated copy (names longer than 255 are refused) */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];   /* ne[0] is the row length (fastest-varying); unused dims are 1;
                                    the product of the nonzero dims fits int64 */
    int type;                    /* enum dtype */
    uint64_t offset;             /* from the start of the data section */
    uint64_t size;               /* bytes */
    const void *data;            /* into the mapping */
    int part;                    /* a split model's part (0-based) whose mapping holds data */
};

struct gguf_file;

/* Opens and validates a file (read-only mmap). The first part of a model split by
 * gguf-split ("NAME-00001-of-0000N.gguf") opens its other parts too (by name, beside it)
 * and lists every part's tensors; any other part is refused. *out is NULL on failure. */
int gguf_open(struct gguf_file **out, const char *path, char *err, size_t errlen);

/* Same over a caller's buffer, which must outlive the file object (used by tests to
 * feed truncations and corruptions). */
int gguf_open_memory(struct gguf_file **out, const void *data, size_t size, char *err, size_t errlen);

/* Where the data section of a file_size-byte GGUF file starts (its header's end, padded
 * to the alignment), read from the file's first size bytes (data), into *end: for a
 * reader that holds a prefix (a model fetched by byte ranges). The header must lie whole
 * in the prefix and its tensors within file_size; a prefix too short fails as a
 * truncated file does (CAIRN_EFORMAT), so a caller that has fewer than file_size bytes
 * reads more and asks again. */
int gguf_header_end(const void *data, size_t size, uint64_t file_size, uint64_t *end, char *err, size_t errlen);

/* Unmaps and frees; accepts NULL. */
void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
/* Bytes of the model's files (every part of a split model). */
uint64_t gguf_file_size(const struct gguf_file *f);
uint32_t gguf_alignment(const struct gguf_file *f);
/* Offset of the data section from the start of the file (the end of the tensor infos
 * rounded up to the alignment; may exceed the file size when there are no tensors). */
uint64_t gguf_data_offset(const struct gguf_file *f);
/* Start of the whole file in memory. */
const void *gguf_base(const struct gguf_file *f);

/* Key/values by index [0, gguf_n_kv); out of range gives an empty key and type
 * (enum gguf_vtype)-1. */
int64_t gguf_n_kv(const struct gguf_file *f);
struct gguf_str gguf_kv_key(const struct gguf_file *f, int64_t i);
enum gguf_vtype gguf_kv_type(const struct gguf_file *f, int64_t i);
/* Index of a key, or -1. */
int64_t gguf_find_key(const struct gguf_file *f, const char *key);
/* The encoded value of key/value i as it lies in the file (after its type field), for
 * copying or hashing: 0, or CAIRN_EINVAL for an index out of range. */
int gguf_kv_raw(const struct gguf_file *f, int64_t i, const void **data, uint64_t *len);

/* Typed getters by key. Return 0, CAIRN_ENOTFOUND when the key is absent, or
 * CAIRN_EFORMAT when its type does not convert (integers convert when the value fits;
 * floats accept FLOAT32/FLOAT64 and integers). */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
int gguf_get_arr(const struct gguf_file *f, const char *key, struct gguf_array *out);

/* Element i of an array (i < n; the caller checks). Numeric getters convert like the
 * scalar ones and return 0 for a type that does not convert. */
struct gguf_str gguf_arr_str(const struct gguf_file *f, const struct gguf_array *a, uint64_t i);
int64_t gguf_arr_int(const struct gguf_array *a, uint64_t i);
double gguf_arr_float(const struct gguf_array *a, uint64_t i);

/* Tensors by index [0, gguf_n_tensors) or by name (NULL when absent). */
int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor(const struct gguf_file *f, int64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* The file holding a tensor's data (a split model's part) and the data's offset in it,
 * for readers that pread rather than map; NULL path for gguf_open_memory. */
const char *gguf_tensor_file(const struct gguf_file *f, const struct gguf_tensor *t);
uint64_t gguf_tensor_file_offset(const struct gguf_file *f, const struct gguf_tensor *t);
/* Files of the model: 1, or a split model's parts. */
int gguf_n_parts(const struct gguf_file *f);
/* Elements of a tensor (product of ne). */
int64_t gguf_tensor_nelems(const struct gguf_tensor *t);

/* ---- writer ---- */

struct gguf_writer;

/* Produces a tensor's bytes at write time into buf (exactly `size` bytes); returns 0 or
 * a negative error. Lets writers of multi-GiB files generate one tensor at a time. */
typedef int (*gguf_fill_fn)(void *ctx, void *buf, uint64_t size);

int gguf_writer_create(struct gguf_writer **out);
void gguf_writer_release(struct gguf_writer *w); /* accepts NULL */

/* Key/values are written in the order first set; setting a key again replaces it. */
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s, size_t len);
/* A scalar of any numeric or bool type, its bytes read from v (u8 ... f64). CAIRN_EINVAL
 * for STRING, ARRAY or an unknown type. */
int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *v);
/* Numeric array of n elements of `type` copied from data. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                        const void *data, uint64_t n);
/* Array of n strings (lens[i] bytes each), copied. */
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n);
/* Copies key/value i of another open file, whatever its type. */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src, int64_t i);

/* Adds a tensor. Either data (size bytes, not copied: must stay valid until
 * gguf_writer_write returns) or fill (called at write time) is given. ne[0] must be a
 * multiple of the type's block size. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data, gguf_fill_fn fill, void *fill_ctx);

/* Writes the file (to path.tmp, then renamed). Alignment from general.alignment if set. */
int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t errlen);

/* Writes the model of src as n_parts files in gguf-split's layout (gguf_open reads it):
 * "<stem>-0000k-of-0000n.gguf", the key/values in the first, "split.no", "split.count"
 * and "split.tensors.count" in each, the tensors in order, about as many in each part. */
int gguf_write_split(const struct gguf_file *src, int n_parts, const char *stem, char *err, size_t errlen);

#endif
