/* Weight matrices prepared for products, and the run-time choice of kernel path. */
#include "kern/kern.h"

#include <stdlib.h>

#include "base/cpu.h"
#include "base/err.h"

struct kern_mat {
    int type;
    int64_t rows, cols;
    enum kern_path path;
    const void *data;   /* GGUF row layout (borrowed) */
    size_t bytes;       /* weight bytes one full product reads */
};

const char *kern_path_name(enum kern_path p)
{
    switch (p) {
    case KERN_PATH_AUTO: return "auto";
    case KERN_PATH_REF: return "ref";
    case KERN_PATH_AVX2: return "avx2";
    case KERN_PATH_AVX512: return "avx512";
    case KERN_PATH_AMX: return "amx";
    }
    return "unknown";
}

enum kern_path kern_best_path(void)
{
    return KERN_PATH_REF;
}

int kern_mat_create(struct kern_mat **out, int type, const void *data, int64_t rows,
                    int64_t cols, enum kern_path path, char *err, size_t errlen)
{
    *out = NULL;
    const struct dtype_info *ti = dtype_info(type);
    if (!ti || !ti->supported)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "kern_mat: type %s not supported",
                          dtype_name(type));
    int64_t rb = dtype_row_bytes(type, cols);
    if (rows <= 0 || cols <= 0 || rb < 0 || rows > INT64_MAX / rb)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "kern_mat: bad shape %lld x %lld of %s",
                          (long long)rows, (long long)cols, dtype_name(type));
    if (path == KERN_PATH_AUTO)
        path = kern_best_path();
    if (path != KERN_PATH_REF)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "kern_mat: path %s not available",
                          kern_path_name(path));
    struct kern_mat *m = calloc(1, sizeof *m);
    if (!m)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "kern_mat: out of memory");
    m->type = type;
    m->rows = rows;
    m->cols = cols;
    m->path = path;
    m->data = data;
    m->bytes = (size_t)(rows * rb);
    *out = m;
    return 0;
}

void kern_mat_release(struct kern_mat *m)
{
    free(m);
}

int kern_mat_type(const struct kern_mat *m) { return m->type; }
int64_t kern_mat_rows(const struct kern_mat *m) { return m->rows; }
int64_t kern_mat_cols(const struct kern_mat *m) { return m->cols; }
enum kern_path kern_mat_path(const struct kern_mat *m) { return m->path; }
size_t kern_mat_bytes(const struct kern_mat *m) { return m->bytes; }
int kern_mat_row_align(const struct kern_mat *m) { (void)m; return 1; }

void kern_matmul(const struct kern_mat *m, const void *xq, size_t ldx, int B, float *y,
                 size_t ldy, int64_t r0, int64_t r1)
{
    if (B <= 0 || r0 >= r1)
        return;
    kern_matmul_ref(m->type, m->data, m->cols, xq, ldx, B, y, ldy, r0, r1);
}
