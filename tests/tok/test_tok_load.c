/* Tokenizers built from small synthetic GGUF files: each pre-tokenizer name picks its
 * split (seen through digit merges), user-defined and control tokens, end-of-turn
 * detection, merge products that are no token, SentencePiece UNUSED pieces, and the
 * refusal of malformed or unsupported metadata with a message naming it. */
#include "testutil.h"

#include "base/err.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

struct vocab {
    char *str[600];
    uint64_t len[600];
    int32_t type[600];
    float score[600];
    int n;
    const char *merges[32];
    int nm;
};

static int add(struct vocab *v, const char *s, size_t len, int32_t type, float score)
{
    v->str[v->n] = malloc(len + 1);
    memcpy(v->str[v->n], s, len);
    v->len[v->n] = len;
    v->type[v->n] = type;
    v->score[v->n] = score;
    return v->n++;
}

static void free_vocab(struct vocab *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->str[i]);
}

/* GPT-2's byte -> character mapping, written out independently for the test. */
static int byte_char(int b, char *out)
{
    int cp = b, n = 0;
    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        for (int k = 0; k < b; k++)
            n += !((k >= 0x21 && k <= 0x7e) || (k >= 0xa1 && k <= 0xac) || (k >= 0xae && k <= 0xff));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

enum { NO_MODEL = 1, NO_MERGES = 2, INT_TOKENS = 4, SHORT_SCORES = 8, STR_TYPES = 16 };

static const char *write_vocab(const struct vocab *v, const char *model, const char *pre, int flags,
                               const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    struct gguf_writer *w = NULL;
    CHECK_EQ_INT(gguf_writer_create(&w), 0);
    if (!(flags & NO_MODEL))
        gguf_writer_set_str(w, "tokenizer.ggml.model", model, strlen(model));
    if (pre)
        gguf_writer_set_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
    if (flags & INT_TOKENS)
        gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_INT32, v->type, (uint64_t)v->n);
    else
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->str, v->len, (uint64_t)v->n);
    if (flags & STR_TYPES)
        gguf_writer_set_arr_str(w, "tokenizer.ggml.token_type", (const char *const *)v->str, v->len, (uint64_t)v->n);
    else
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, v->type, (uint64_t)v->n);
    if (!strcmp(model, "llama"))
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, v->score,
                            (uint64_t)(flags & SHORT_SCORES ? v->n / 2 : v->n));
    if (!(flags & NO_MERGES) && v->nm) {
        uint64_t lens[32];
        for (int i = 0; i < v->nm; i++)
            lens[i] = strlen(v->merges[i]);
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, lens, (uint64_t)v->nm);
    }
    uint32_t big = 999999;
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", big); /* out of range: ignored */
    char err[256];
    int rc = gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == 0, "write %s: %s", path, err);
    gguf_writer_release(w);
    return path;
}

static int load(const char *path, struct tok **t, char *err, size_t errlen)
{
    struct gguf_file *f = NULL;
    *t = NULL;
    int rc = gguf_open(&f, path, err, errlen);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (rc)
        return rc;
    rc = tok_load(t, f, err, errlen);
    gguf_close(f);
    return rc;
}

static int64_t enc(const struct tok *t, const char *s, int special, int32_t *ids)
{
    int64_t n = -1;
    int rc = tok_encode(t, s, strlen(s), 0, special, ids, 64, &n);
    CHECK(rc == 0, "encode '%s': rc %d", s, rc);
    return n;
}

static void build_bpe(struct vocab *v, int *id12, int *id123, int *id1234, int *idxyz, int *think,
                      int *imend, int *eot)
{
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        char c[2];
        int l = byte_char(b, c);
        add(v, c, (size_t)l, 1, 0);
    }
    *id12 = add(v, "12", 2, 1, 0);
    *id123 = add(v, "123", 3, 1, 0);
    *id1234 = add(v, "1234", 4, 1, 0);
    *idxyz = add(v, "xyz", 3, 1, 0);
    *think = add(v, "<think>", 7, 4, 0);
    *imend = add(v, "<|im_end|>", 10, 1, 0);   /* NORMAL in the file: must become CONTROL + EOG */
    *eot = add(v, "<|endoftext|>", 13, 3, 0);
    static const char *const m[] = {"1 2", "12 3", "123 4", "x y", "xy z", "nospace", "q", " "};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        v->merges[v->nm++] = m[i];
}

static void test_pre_tokenizers(void)
{
    struct vocab v;
    int id12, id123, id1234, idxyz, think, imend, eot;
    build_bpe(&v, &id12, &id123, &id1234, &idxyz, &think, &imend, &eot);
    static const struct {
        const char *pre;
        int split; /* "1234" -> 0: whole, 1: "123"+"4", 2: single digits */
    } cases[] = {
        {"default", 1}, {"llama3", 1}, {"llama-bpe", 1}, {"qwen2", 2}, {"gpt-2", 0}, {"phi-2", 0},
        {"mpt", 0}, {"deepseek-llm", 0}, {"deepseek-coder", 2}, {"falcon", 1}, {"starcoder", 2},
        {"refact", 2}, {"command-r", 2}, {"smollm", 2}, {NULL, 1}, /* no pre: default */
    };
    char err[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct tok *t;
        const char *path = write_vocab(&v, "gpt2", cases[k].pre, 0, "bpe");
        int rc = load(path, &t, err, sizeof err);
        CHECK(rc == 0, "pre %s: %s", cases[k].pre, err);
        if (rc)
            continue;
        int32_t ids[64];
        int64_t n = enc(t, "1234", 0, ids);
        int ok = cases[k].split == 0   ? n == 1 && ids[0] == id1234
                 : cases[k].split == 1 ? n == 2 && ids[0] == id123 && ids[1] == '4'
                                       : n == 4;
        CHECK(ok, "pre %s: '1234' -> %lld tokens (first %d), want split %d", cases[k].pre ? cases[k].pre : "(none)",
              (long long)n, n > 0 ? ids[0] : -1, cases[k].split);
        CHECK(!strcmp(tok_pre(t), cases[k].pre ? cases[k].pre : "default"), "tok_pre %s", tok_pre(t));

        if (k == 0) {
            /* merge products that are no token fall back to single-byte tokens */
            n = enc(t, "xyz", 0, ids);
            CHECK(n == 1 && ids[0] == idxyz, "xyz -> %lld tokens", (long long)n);
            n = enc(t, "xy", 0, ids);
            CHECK(n == 2 && ids[0] == 'x' && ids[1] == 'y', "xy -> %lld tokens", (long long)n);
            /* specials */
            n = enc(t, "a<think>b", 0, ids);
            CHECK(n == 3 && ids[1] == think, "user-defined <think> without parse_special: %lld ids", (long long)n);
            n = enc(t, "<|im_end|>", 0, ids);
            CHECK(n > 1, "<|im_end|> as text: %lld ids", (long long)n);
            n = enc(t, "<|im_end|><|endoftext|>", 1, ids);
            CHECK(n == 2 && ids[0] == imend && ids[1] == eot, "control tokens with parse_special");
            CHECK(tok_is_eog(t, imend) && tok_is_eog(t, eot) && !tok_is_eog(t, think), "EOG from the token texts");
            CHECK((tok_attr(t, imend) & TOK_ATTR_CONTROL) != 0, "end-of-turn token made CONTROL");
            CHECK_EQ_INT(tok_find_token(t, "<think>"), think);
            char buf[64];
            size_t len;
            int32_t seq[3] = {think, imend, id12};
            tok_detok(t, seq, 3, 0, buf, sizeof buf, &len);
            CHECK(len == 9 && !memcmp(buf, "<think>12", 9), "render: '%.*s'", (int)len, buf);
        }
        tok_release(t);
    }
    free_vocab(&v);
}

static void test_spm_synthetic(void)
{
    struct vocab v;
    memset(&v, 0, sizeof v);
    add(&v, "<unk>", 5, 2, 0);
    add(&v, "<s>", 3, 3, 0);
    add(&v, "</s>", 4, 3, 0);
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        add(&v, hex, 6, 6, 0);
    }
    int sp = add(&v, "\xe2\x96\x81", 3, 1, -5);
    int a = add(&v, "a", 1, 1, -3);
    int b = add(&v, "b", 1, 1, -3);
    int spa = add(&v, "\xe2\x96\x81" "a", 4, 1, -1);
    add(&v, "ab", 2, 1, -2);
    int spab = add(&v, "\xe2\x96\x81" "ab", 5, 5, 0); /* UNUSED: merged, then split back */
    int think = add(&v, "<think>", 7, 4, 0);
    char err[256];
    struct tok *t;
    int rc = load(write_vocab(&v, "llama", NULL, 0, "spm"), &t, err, sizeof err);
    CHECK(rc == 0, "spm: %s", err);
    if (rc) {
        free_vocab(&v);
        return;
    }
    int32_t ids[64];
    int64_t n = enc(t, "ab", 0, ids);
    CHECK(n == 2 && ids[0] == spa && ids[1] == b, "UNUSED ▁ab re-segmented: %lld ids, first %d (▁ab is %d)",
          (long long)n, n > 0 ? ids[0] : -1, spab);
    n = enc(t, "a<think>b", 0, ids);
    CHECK(n == 4 && ids[0] == spa && ids[1] == think && ids[2] == sp && ids[3] == b,
          "user-defined token and the space after it: %lld ids", (long long)n);
    n = enc(t, "<s>", 0, ids);
    CHECK(n > 1 && ids[0] != 1, "<s> as text stays text");
    n = enc(t, "z", 0, ids);
    CHECK(n == 2 && ids[0] == sp && ids[1] == 3 + 'z', "byte fallback: %lld ids", (long long)n);
    CHECK(tok_add_bos(t) && tok_bos(t) == 1 && tok_eos(t) == 2 && tok_is_eog(t, 2), "SPM defaults");
    (void)a;
    tok_release(t);
    free_vocab(&v);
}

static void expect_refusal(const struct vocab *v, const char *model, const char *pre, int flags, int want_rc,
                           const char *want_msg)
{
    char err[256] = "";
    struct tok *t;
    int rc = load(write_vocab(v, model, pre, flags, "bad"), &t, err, sizeof err);
    CHECK(rc == want_rc && !t && strstr(err, want_msg), "model %s pre %s flags %d: rc %d, '%s' (want %d, '%s')",
          model, pre ? pre : "-", flags, rc, err, want_rc, want_msg);
    tok_release(t);
}

static void test_refusals(void)
{
    struct vocab v;
    int id12, id123, id1234, idxyz, think, imend, eot;
    build_bpe(&v, &id12, &id123, &id1234, &idxyz, &think, &imend, &eot);
    expect_refusal(&v, "gpt2", "qwen2", NO_MODEL, CAIRN_EFORMAT, "tokenizer.ggml.model");
    expect_refusal(&v, "bert", NULL, 0, CAIRN_EUNSUPPORTED, "'bert'");
    expect_refusal(&v, "gpt2", "no-such-pre", 0, CAIRN_EUNSUPPORTED, "'no-such-pre'");
    expect_refusal(&v, "gpt2", "qwen2", NO_MERGES, CAIRN_EFORMAT, "merges");
    expect_refusal(&v, "gpt2", "qwen2", INT_TOKENS, CAIRN_EFORMAT, "tokenizer.ggml.tokens");
    expect_refusal(&v, "gpt2", "qwen2", STR_TYPES, CAIRN_EFORMAT, "token_type");
    expect_refusal(&v, "llama", NULL, SHORT_SCORES, CAIRN_EFORMAT, "scores");
    free_vocab(&v);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    log_set_level(LOG_ERROR); /* the files carry a bad padding id on purpose */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cairn_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_pre_tokenizers);
    RUN(test_spm_synthetic);
    RUN(test_refusals);
    static const char *const names[] = {"bpe.gguf", "spm.gguf", "bad.gguf"};
    for (size_t i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
    rmdir(tmpdir);
    return test_main_end();
}
