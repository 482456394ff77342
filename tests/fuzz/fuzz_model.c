/* libFuzzer harness of a model's metadata as the loader reads it (model/arch.c:
 * model_read_hparams, the mixture-of-experts counts and gpt-oss's window included) and of a pipeline rank's
 * byte ranges (model/extents.c), on arbitrary bytes in an exact-size copy. A refused
 * file must say why; accepted hyper-parameters must be within the loader's bounds
 * (expert_used_count <= expert_count <= 1024, heads dividing, ...), and the ranges of
 * every layer split must lie in the file, sorted and apart. Built and run by
 * tests/fuzz/run.sh. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "fuzz_model: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                     \
        }                                                                \
    } while (0)

static void check_hparams(const struct model_hparams *hp)
{
    CHECK(hp->n_layers >= 1 && hp->n_embd >= 1 && hp->n_ff >= 1 && hp->n_head >= 1);
    CHECK(hp->n_head_kv >= 1 && hp->n_head % hp->n_head_kv == 0);
    CHECK(hp->head_dim >= 2 && hp->n_rot >= 2 && hp->n_rot <= hp->head_dim && hp->n_rot % 2 == 0);
    CHECK(hp->n_vocab >= 1);
    if (hp->n_expert) {
        CHECK(hp->n_expert >= 2 && hp->n_expert <= 1024);
        CHECK(hp->n_expert_used >= 1 && hp->n_expert_used <= hp->n_expert);
        CHECK(hp->n_ff_exp >= 1);
    } else {
        CHECK(hp->n_expert_used == 0 && strcmp(hp->arch, "qwen3moe") && strcmp(hp->arch, "gpt-oss"));
    }
    /* gpt-oss: experts, a window, every layer rotated alike, no renormalised routing */
    if (hp->oss)
        CHECK(hp->n_expert >= 2 && hp->swa_window >= 1 && hp->swa_pattern >= 1 && hp->n_rot == hp->head_dim &&
              hp->rope_base_swa == hp->rope_base && !hp->expert_norm && !strcmp(hp->arch, "gpt-oss"));
}

static void check_extents(const struct gguf_file *f, int begin, int end, size_t size)
{
    struct model_extent *e = NULL;
    size_t n = 0;
    char err[512] = "";
    int rc = model_slice_extents(f, begin, end, &e, &n, err, sizeof err);
    if (rc) {
        CHECK(e == NULL && err[0]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        CHECK(e[i].part == 0 && e[i].offset <= size && e[i].len <= size - e[i].offset);
        CHECK(i == 0 || e[i].offset > e[i - 1].offset + e[i - 1].len);
    }
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct gguf_file *f;
    char err[512] = "";
    if (gguf_open_memory(&f, copy, size, err, sizeof err) == 0) {
        struct model_hparams hp;
        err[0] = 0;
        if (model_read_hparams(f, &hp, err, sizeof err))
            CHECK(err[0]);
        else {
            check_hparams(&hp);
            int mid = hp.n_layers / 2;
            check_extents(f, 0, -1, size);
            if (mid > 0) {
                check_extents(f, 0, mid, size);
                check_extents(f, mid, hp.n_layers, size);
            }
        }
        gguf_close(f);
    }
    free(copy);
    return 0;
}
