/* The real vocabulary files open fast and read back as llama.cpp wrote them. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "testutil.h"

#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int str_is(struct gguf_str s, const char *want)
{
    return s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

struct vocab_case {
    const char *file;
    const char *model; /* tokenizer.ggml.model */
    uint64_t n_tokens;
    const char *token0; /* first token, or NULL to skip */
    int has_merges;
};

static void check_vocab(const struct vocab_case *c)
{
    char err[512] = "";
    struct gguf_file *f;
    /* Best of three opens, so a busy machine does not fail the timing. */
    double ms = 1e9;
    int rc = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_ms();
        rc = gguf_open(&f, test_data_path(c->file), err, sizeof err);
        double t = now_ms() - t0;
        ms = t < ms ? t : ms;
        if (rc || rep == 2)
            break;
        gguf_close(f);
    }
    CHECK(rc == 0, "%s: open failed rc=%d: %s", c->file, rc, err);
    if (rc)
        return;
    printf("%s: opened in %.1f ms, %lld kvs\n", c->file, ms, (long long)gguf_n_kv(f));
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_tensors(f), 0);
    CHECK_EQ_INT(gguf_alignment(f), 32);

    struct gguf_str model = {0};
    CHECK_EQ_INT(gguf_get_str(f, "tokenizer.ggml.model", &model), 0);
    CHECK(str_is(model, c->model), "%s: tokenizer.ggml.model = '%.*s', expected '%s'", c->file, (int)model.len,
          model.ptr, c->model);

    struct gguf_array toks = {0};
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", &toks), 0);
    CHECK_EQ_INT(toks.type, GGUF_STRING);
    CHECK(toks.n == c->n_tokens, "%s: %llu tokens, expected %llu", c->file, (unsigned long long)toks.n,
          (unsigned long long)c->n_tokens);
    if (c->token0) {
        struct gguf_str s = gguf_arr_str(f, &toks, 0);
        CHECK(str_is(s, c->token0), "%s: token 0 = '%.*s', expected '%s'", c->file, (int)s.len, s.ptr, c->token0);
    }
    /* Every string lies inside the file and the last one ends at or before the next key. */
    const char *base = gguf_base(f);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < toks.n; i++) {
        struct gguf_str s = gguf_arr_str(f, &toks, i);
        if (!s.ptr || s.ptr < base || (uint64_t)(s.ptr - base) + s.len > gguf_file_size(f))
            bad++;
    }
    CHECK(bad == 0, "%s: %llu token strings outside the file", c->file, (unsigned long long)bad);

    struct gguf_array scores = {0};
    if (gguf_get_arr(f, "tokenizer.ggml.scores", &scores) == 0) {
        CHECK_EQ_INT(scores.type, GGUF_FLOAT32);
        CHECK(scores.n == toks.n, "%s: %llu scores", c->file, (unsigned long long)scores.n);
    }
    struct gguf_array types = {0};
    if (gguf_get_arr(f, "tokenizer.ggml.token_type", &types) == 0) {
        CHECK_EQ_INT(types.type, GGUF_INT32);
        CHECK(types.n == toks.n, "%s: %llu token types", c->file, (unsigned long long)types.n);
        int64_t tt = gguf_arr_int(&types, 0);
        CHECK(tt >= 1 && tt <= 6, "%s: token type of 0 is %lld", c->file, (long long)tt);
    }
    struct gguf_array merges = {0};
    rc = gguf_get_arr(f, "tokenizer.ggml.merges", &merges);
    CHECK(c->has_merges ? rc == 0 && merges.n > 1000 : rc == CAIRN_ENOTFOUND, "%s: merges rc=%d n=%llu",
          c->file, rc, (unsigned long long)merges.n);
    if (c->has_merges && rc == 0) {
        struct gguf_str m = gguf_arr_str(f, &merges, 0);
        CHECK(memchr(m.ptr, ' ', m.len) != NULL, "%s: merge 0 '%.*s' has no space", c->file, (int)m.len, m.ptr);
    }

    uint32_t bos;
    rc = gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos);
    CHECK(rc == 0 || rc == CAIRN_ENOTFOUND, "%s: bos rc=%d", c->file, rc);
    CHECK(rc != 0 || bos < toks.n, "%s: bos %u", c->file, bos);

    /* Key index: every key finds itself. */
    int64_t miss = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_str k = gguf_kv_key(f, i);
        char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)k.len, k.ptr);
        miss += gguf_find_key(f, buf) != i;
    }
    CHECK(miss == 0, "%s: %lld keys not found at their index", c->file, (long long)miss);
    CHECK_EQ_INT(gguf_find_key(f, "no.such.key"), -1);
    CHECK(gguf_get_u32(f, "tokenizer.ggml.model", &bos) == CAIRN_EFORMAT, "string read as u32");
    CHECK(gguf_find_tensor(f, "token_embd.weight") == NULL, "tensor found in a vocab file");
    gguf_close(f);
}

int main(void)
{
    static const struct vocab_case cases[] = {
        {"vocab/ggml-vocab-qwen2.gguf", "gpt2", 151936, "!", 1},
        {"vocab/ggml-vocab-llama-spm.gguf", "llama", 32000, "<unk>", 0},
        {"vocab/ggml-vocab-llama-bpe.gguf", "gpt2", 128256, "!", 1},
        {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", 50257, "!", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_vocab(&cases[i]);

    /* A missing file names the path and the system's reason. */
    char err[512] = "";
    struct gguf_file *f = (struct gguf_file *)1;
    int rc = gguf_open(&f, "/nonexistent/dir/model.gguf", err, sizeof err);
    CHECK(rc == CAIRN_ENOTFOUND, "missing file rc=%d", rc);
    CHECK(f == NULL, "out not cleared");
    CHECK(strstr(err, "/nonexistent/dir/model.gguf") && strstr(err, "No such file"), "message: %s", err);
    rc = gguf_open(&f, test_data_path("vocab"), err, sizeof err);
    CHECK(rc != 0 && strstr(err, "vocab"), "directory opened: rc=%d %s", rc, err);
    gguf_close(NULL);
    return test_main_end();
}
