/* The byte ranges of a model slice (model.h, model_slice_extents): what a pipeline rank
 * reads of a file, so that a node can fetch only those bytes. The rule mirrors
 * model_load's: a layer's tensors are named "blk.<i>.", the first slice reads the
 * embeddings, the last the final norm and the head (the embeddings when tied), and every
 * slice reads the other tensors (rope_freqs.weight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"

/* The layer of a "blk.<i>." name, or -1 for a tensor of no layer. */
static long layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    char *end;
    long i = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && i >= 0 ? i : -1;
}

static bool slice_reads(const char *name, long layer, int begin, int end, bool first, bool last, bool tied)
{
    if (layer >= 0)
        return layer >= begin && layer < end;
    if (!strcmp(name, "token_embd.weight"))
        return first || (last && tied);
    if (!strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight"))
        return last;
    return true;
}

static int by_place(const void *a, const void *b)
{
    const struct model_extent *x = a, *y = b;
    if (x->part != y->part)
        return x->part < y->part ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int model_slice_extents(const struct gguf_file *f, int layer_begin, int layer_end, struct model_extent **out,
                        size_t *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    struct model_hparams hp;
    int rc = model_read_hparams(f, &hp, err, errlen);
    if (rc)
        return rc;
    if (layer_end < 0)
        layer_end = hp.n_layers;
    if (layer_begin < 0 || layer_begin >= layer_end || layer_end > hp.n_layers)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "layer range [%d, %d) outside the model's %d layers",
                          layer_begin, layer_end, hp.n_layers);
    bool first = layer_begin == 0, last = layer_end == hp.n_layers;
    int64_t n_t = gguf_n_tensors(f);
    struct model_extent *v = calloc(n_t > 0 ? (size_t)n_t : 1, sizeof *v);
    if (!v)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    size_t n = 0;
    for (int64_t i = 0; i < n_t; i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        if (!slice_reads(t->name, layer_of(t->name), layer_begin, layer_end, first, last, hp.tied_output) ||
            !t->size)
            continue;
        v[n++] = (struct model_extent){.part = t->part, .offset = gguf_tensor_file_offset(f, t), .len = t->size};
    }
    qsort(v, n, sizeof *v, by_place);
    size_t m = 0; /* touching or overlapping ranges of one part become one */
    for (size_t i = 0; i < n; i++) {
        if (m && v[m - 1].part == v[i].part && v[i].offset <= v[m - 1].offset + v[m - 1].len) {
            uint64_t e = v[i].offset + v[i].len;
            if (e > v[m - 1].offset + v[m - 1].len)
                v[m - 1].len = e - v[m - 1].offset;
        } else {
            v[m++] = v[i];
        }
    }
    *out = v;
    *n_out = m;
    return 0;
}
