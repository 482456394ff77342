/* Draft/target vocabulary compatibility on synthetic models with real vocabularies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "gguf/vocab.h"
#include "model/synth.h"
#include "testutil.h"

static char dir[] = "/tmp/cairn-test-vocab-XXXXXX";

static const char *path_of(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void make(const char *name, const char *vocab, uint64_t seed)
{
    struct synth_spec s;
    memset(&s, 0, sizeof s);
    synth_shape("tiny", &s);
    snprintf(s.type, sizeof s.type, "q8_0");
    s.n_layers = 2;
    s.seed = seed;
    char err[256];
    CHECK(synth_write(&s, vocab ? test_data_path(vocab) : NULL, path_of(name), err, sizeof err) == 0, "%s: %s",
          name, err);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    make("target.gguf", "vocab/ggml-vocab-qwen2.gguf", 1);
    make("other-seed.gguf", "vocab/ggml-vocab-qwen2.gguf", 2);
    make("llama.gguf", "vocab/ggml-vocab-llama-bpe.gguf", 1);
    make("spm.gguf", "vocab/ggml-vocab-llama-spm.gguf", 1);
    char err[256] = "";
    CHECK(vocab_compatible_files(path_of("target.gguf"), path_of("other-seed.gguf"), err, sizeof err) == 0,
          "same vocabulary refused: %s", err);
    CHECK(vocab_compatible_files(path_of("target.gguf"), path_of("target.gguf"), err, sizeof err) == 0,
          "a model refused as its own draft: %s", err);
    int rc = vocab_compatible_files(path_of("target.gguf"), path_of("llama.gguf"), err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && (strstr(err, "differ") != NULL), "qwen2 vs llama-bpe: %d %s", rc, err);
    rc = vocab_compatible_files(path_of("llama.gguf"), path_of("spm.gguf"), err, sizeof err);
    CHECK(rc == CAIRN_EINVAL && strstr(err, "tokenizers differ"), "bpe vs spm: %d %s", rc, err);
    rc = vocab_compatible_files(path_of("target.gguf"), path_of("missing.gguf"), err, sizeof err);
    CHECK(rc != 0, "a missing draft file accepted");
    const char *names[] = {"target.gguf", "other-seed.gguf", "llama.gguf", "spm.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unlink(path_of(names[i]));
    rmdir(dir);
    return test_main_end();
}
