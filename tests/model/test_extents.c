/* The byte ranges of a model slice (model_slice_extents): for the split of a model into
 * two pipeline ranks, every tensor's bytes are in the ranges of the ranks that read it
 * and in no other (its layers; the embeddings on the first rank, and on the last when the
 * head is tied; the norm and head on the last; rope_freqs on every rank), the ranges are
 * sorted and apart (a mixture of experts' 3-D tensors included), and the whole model's ranges are every tensor's bytes. And
 * gguf_header_end on prefixes of the file: its data offset once the header is in the
 * prefix, a refusal before. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes of [off, off + len) of part 0 that the extents hold. */
static uint64_t covered(const struct model_extent *e, size_t n, uint64_t off, uint64_t len)
{
    uint64_t in = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = e[i].offset > off ? e[i].offset : off;
        uint64_t b = e[i].offset + e[i].len < off + len ? e[i].offset + e[i].len : off + len;
        if (e[i].part == 0 && a < b)
            in += b - a;
    }
    return in;
}

static void check_sorted(const struct model_extent *e, size_t n, const char *what)
{
    for (size_t i = 1; i < n; i++)
        CHECK(e[i].part > e[i - 1].part ||
                  (e[i].part == e[i - 1].part && e[i].offset > e[i - 1].offset + e[i - 1].len),
              "%s: ranges %zu and %zu touch or are out of order", what, i - 1, i);
}

static void check_split(const char *path, bool tied)
{
    char err[512];
    struct gguf_file *f = NULL;
    CHECK(gguf_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    if (!f)
        return;
    int n_layers = 0;
    struct model_hparams hp;
    CHECK(model_read_hparams(f, &hp, err, sizeof err) == 0, "hparams: %s", err);
    n_layers = hp.n_layers;
    CHECK(hp.tied_output == tied, "tied %d", hp.tied_output);
    int k = n_layers / 2;
    struct model_extent *lo = NULL, *hi = NULL, *all = NULL;
    size_t n_lo = 0, n_hi = 0, n_all = 0;
    CHECK(model_slice_extents(f, 0, k, &lo, &n_lo, err, sizeof err) == 0, "first half: %s", err);
    CHECK(model_slice_extents(f, k, n_layers, &hi, &n_hi, err, sizeof err) == 0, "second half: %s", err);
    CHECK(model_slice_extents(f, 0, -1, &all, &n_all, err, sizeof err) == 0, "whole: %s", err);
    check_sorted(lo, n_lo, "first");
    check_sorted(hi, n_hi, "second");
    check_sorted(all, n_all, "whole");
    uint64_t sum_all = 0, sum_tensors = 0;
    for (size_t i = 0; i < n_all; i++)
        sum_all += all[i].len;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        uint64_t off = gguf_tensor_file_offset(f, t);
        sum_tensors += t->size;
        int layer = -1;
        sscanf(t->name, "blk.%d.", &layer);
        bool in_lo, in_hi;
        if (layer >= 0)
            in_lo = layer < k, in_hi = layer >= k;
        else if (!strcmp(t->name, "token_embd.weight"))
            in_lo = true, in_hi = tied;
        else if (!strcmp(t->name, "output.weight") || !strcmp(t->name, "output_norm.weight"))
            in_lo = false, in_hi = true;
        else
            in_lo = in_hi = true;
        CHECK(covered(lo, n_lo, off, t->size) == (in_lo ? t->size : 0), "%s: first rank %s", t->name,
              in_lo ? "lacks it" : "reads it");
        CHECK(covered(hi, n_hi, off, t->size) == (in_hi ? t->size : 0), "%s: last rank %s", t->name,
              in_hi ? "lacks it" : "reads it");
        CHECK(covered(all, n_all, off, t->size) == t->size, "%s: not in the whole model's ranges", t->name);
    }
    CHECK(sum_all == sum_tensors, "whole: %llu bytes of ranges, %llu of tensors", (unsigned long long)sum_all,
          (unsigned long long)sum_tensors);
    free(lo);
    CHECK(model_slice_extents(f, k, k, &lo, &n_lo, err, sizeof err) == CAIRN_EINVAL && !lo, "an empty range accepted");
    CHECK(model_slice_extents(f, 0, n_layers + 1, &lo, &n_lo, err, sizeof err) == CAIRN_EINVAL && !lo,
          "a range past the last layer accepted");
    free(all);
    free(hi);
    gguf_close(f);
}

static void check_header_end(const char *path)
{
    char err[512];
    struct gguf_file *f = NULL;
    CHECK(gguf_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    if (!f)
        return;
    uint64_t size = gguf_file_size(f), want = gguf_data_offset(f), end = 0;
    const uint8_t *base = gguf_base(f);
    CHECK(gguf_header_end(base, want, size, &end, err, sizeof err) == 0 && end == want,
          "a prefix of the header's length: %s (end %llu, want %llu)", err, (unsigned long long)end,
          (unsigned long long)want);
    CHECK(gguf_header_end(base, size, size, &end, err, sizeof err) == 0 && end == want, "the whole file");
    size_t refused = 0, tried = 0;
    for (uint64_t cut = 0; cut + 64 < want; cut += want / 97 + 1, tried++)
        refused += gguf_header_end(base, cut, size, &end, err, sizeof err) == CAIRN_EFORMAT;
    CHECK(refused == tried, "%zu of %zu prefixes shorter than the header accepted", tried - refused, tried);
    CHECK(gguf_header_end(base, want, want, &end, err, sizeof err) == CAIRN_EFORMAT,
          "tensors past a file that ends at its header accepted");
    gguf_close(f);
}

int main(void)
{
    char dir[] = "/tmp/cairn_extents_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    for (int tied = 0; tied <= 1; tied++) {
        struct synth_spec s;
        synth_shape("tiny", &s);
        snprintf(s.type, sizeof s.type, "q8_0");
        s.tied = tied;
        s.llama3_rope = 1; /* rope_freqs.weight: read by every rank */
        s.vocab_size = 512;
        char path[128], err[256];
        snprintf(path, sizeof path, "%s/m%d.gguf", dir, tied);
        CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);
        check_split(path, tied);
        check_header_end(path);
        unlink(path);
    }
    /* A mixture of experts: each rank's ranges hold its layers' routers and 3-D expert
     * tensors whole. */
    struct synth_spec s;
    synth_shape("qwen3moe-tiny", &s);
    snprintf(s.type, sizeof s.type, "q4_k_m");
    s.vocab_size = 512;
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/moe.gguf", dir);
    CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write qwen3moe-tiny: %s", err);
    check_split(path, false);
    unlink(path);
    rmdir(dir);
    return test_main_end();
}
