/* Special tokens, BOS/EOS/EOG, rendering rules, buffer contracts and the streaming
 * detokenizer, on the real vocabularies of testdata/vocab. */
#include "testutil.h"

#include "base/err.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

static struct tok *load(const char *name)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "vocab/ggml-vocab-%s.gguf", name);
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    int rc = gguf_open(&f, test_data_path(path), err, sizeof err);
    CHECK(rc == 0, "%s: %s", name, err);
    if (rc)
        return NULL;
    rc = tok_load(&t, f, err, sizeof err);
    CHECK(rc == 0, "%s: %s", name, err);
    gguf_close(f);
    return t;
}

static int64_t enc(const struct tok *t, const char *s, int add, int special, int32_t *out, int64_t max)
{
    int64_t n = -1;
    int rc = tok_encode(t, s, strlen(s), add, special, out, max, &n);
    CHECK(rc == 0, "encode '%s': rc %d", s, rc);
    return rc ? -1 : n;
}

static int contains(const int32_t *ids, int64_t n, int32_t id)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

static void check_detok(const struct tok *t, const int32_t *ids, int64_t n, int special, const char *want)
{
    char buf[4096];
    size_t len;
    int rc = tok_detok(t, ids, n, special, buf, sizeof buf, &len);
    CHECK(rc == 0 && len == strlen(want) && !memcmp(buf, want, len), "detok(special=%d) = '%.*s' (rc %d), want '%s'",
          special, (int)len, buf, rc, want);
}

static void test_qwen2(void)
{
    struct tok *t = load("qwen2");
    if (!t)
        return;
    int32_t ids[256];
    const char *chat = "<|im_start|>user\nHi<|im_end|>\n";
    int64_t n = enc(t, chat, 0, 1, ids, 256);
    CHECK(n >= 4 && ids[0] == 151644 && contains(ids, n, 151645), "parse_special: first id %d", n > 0 ? ids[0] : -1);
    int64_t m = enc(t, chat, 0, 0, ids, 256);
    int any = 0;
    for (int64_t i = 0; i < m; i++)
        any |= ids[i] >= 151643;
    CHECK(m > n && !any, "without parse_special control tokens must not appear (%lld ids)", (long long)m);
    /* user-defined tokens match whole even without parse_special */
    n = enc(t, "a[PAD151646]b", 0, 0, ids, 256);
    CHECK(contains(ids, n, 151646), "user-defined token not matched");
    /* overlapping and adjacent specials: longest first */
    n = enc(t, "<|im_end|><|im_end|>x<|im_end", 0, 1, ids, 256);
    CHECK(n >= 3 && ids[0] == 151645 && ids[1] == 151645 && !contains(ids + 2, n - 2, 151645),
          "adjacent specials: %lld ids", (long long)n);

    CHECK_EQ_INT(tok_find_token(t, "<|im_end|>"), 151645);
    CHECK_EQ_INT(tok_find_token(t, "<|no_such_token|>"), -1);
    CHECK(tok_is_eog(t, 151643) && tok_is_eog(t, 151645) && !tok_is_eog(t, 151644) && !tok_is_eog(t, 0),
          "qwen2 EOG set");
    CHECK_EQ_INT(tok_eos(t), 151643);
    CHECK(!tok_add_bos(t), "qwen2 adds no BOS");
    n = enc(t, "Hi", 1, 0, ids, 256);
    CHECK(n == 1 && ids[0] != tok_bos(t), "qwen2 add_special adds nothing (%lld ids)", (long long)n);
    CHECK((tok_attr(t, 151644) & TOK_ATTR_CONTROL) && (tok_attr(t, 151646) & TOK_ATTR_USER_DEFINED),
          "attributes");

    /* rendering: control tokens only when asked, user-defined always */
    int32_t seq[3] = {151644, 151646, 151645};
    check_detok(t, seq, 3, 0, "[PAD151646]");
    check_detok(t, seq, 3, 1, "<|im_start|>[PAD151646]<|im_end|>");

    /* buffer contracts */
    int32_t small[2];
    int64_t need = -1;
    int rc = tok_encode(t, "Hello world, this is a test", 27, 0, 0, small, 2, &need);
    CHECK(rc == CAIRN_EFULL && need > 2, "EFULL: rc %d need %lld", rc, (long long)need);
    int32_t all[64];
    n = enc(t, "Hello world, this is a test", 0, 0, all, 64);
    CHECK(n == need && small[0] == all[0] && small[1] == all[1], "EFULL prefix");
    rc = tok_encode(t, "", 0, 0, 0, NULL, 0, &need);
    CHECK(rc == 0 && need == 0, "empty text: rc %d n %lld", rc, (long long)need);
    char tiny[3];
    size_t len;
    rc = tok_detok(t, all, n, 0, tiny, sizeof tiny, &len);
    CHECK(rc == CAIRN_EFULL && len == 27, "detok EFULL: rc %d len %zu", rc, len);
    rc = tok_detok(t, (int32_t[]){-1}, 1, 0, tiny, sizeof tiny, &len);
    CHECK(rc == CAIRN_ERANGE, "bad id: rc %d", rc);
    rc = tok_token_text(t, 151644, 1, tiny, sizeof tiny, &len);
    CHECK(rc == CAIRN_EFULL && len == 12, "token_text EFULL: rc %d len %zu", rc, len);
    tok_release(t);
}

static void test_llama_bpe(void)
{
    struct tok *t = load("llama-bpe");
    if (!t)
        return;
    int32_t ids[64];
    int64_t n = enc(t, "<|eot_id|>", 0, 1, ids, 64);
    CHECK(n == 1 && ids[0] == 128009, "<|eot_id|> parsed: %lld ids, first %d", (long long)n, ids[0]);
    n = enc(t, "<|eot_id|>", 0, 0, ids, 64);
    CHECK(n > 1 && !contains(ids, n, 128009), "<|eot_id|> as text: %lld ids", (long long)n);
    CHECK(tok_add_bos(t) && tok_bos(t) == 128000, "llama3 adds BOS %d", tok_bos(t));
    n = enc(t, "Hi", 1, 0, ids, 64);
    CHECK(n == 2 && ids[0] == 128000, "BOS first (%lld ids)", (long long)n);
    CHECK(tok_is_eog(t, 128001) && tok_is_eog(t, 128009) && !tok_is_eog(t, 128000), "llama3 EOG set");
    CHECK_EQ_INT(tok_eot(t), 128009);
    tok_release(t);
}

static void test_spm(void)
{
    struct tok *t = load("llama-spm");
    if (!t)
        return;
    int32_t ids[64], ref[64];
    int64_t n = enc(t, "Hello", 1, 0, ids, 64);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 15043, "BOS + ▁Hello: %lld ids", (long long)n);
    /* leading space after a special token, as at the start */
    n = enc(t, "<s>Hello", 0, 1, ids, 64);
    int64_t r = enc(t, "Hello", 0, 0, ref, 64);
    CHECK(n == r + 1 && ids[0] == 1 && !memcmp(ids + 1, ref, (size_t)r * sizeof *ids), "<s>Hello: %lld ids", (long long)n);
    /* without parse_special the text never becomes a control token */
    n = enc(t, "<s></s><unk>", 0, 0, ids, 64);
    CHECK(!contains(ids, n, 0) && !contains(ids, n, 1) && !contains(ids, n, 2), "control from text");
    n = enc(t, "<unk>", 0, 1, ids, 64);
    CHECK(n == 1 && ids[0] == 0, "<unk> parsed as UNKNOWN");
    /* byte fallback and its rendering */
    n = enc(t, "\xf0\x9f\xa6\x99", 0, 0, ids, 64);
    check_detok(t, ids, n, 0, "\xf0\x9f\xa6\x99");
    /* leading-space rule: the first rendered token loses one space */
    int32_t seq[2] = {1, 15043};
    check_detok(t, seq, 2, 0, "Hello");
    check_detok(t, seq, 2, 1, "<s> Hello");
    check_detok(t, seq + 1, 1, 0, "Hello");
    CHECK(tok_is_eog(t, 2) && !tok_is_eog(t, 1), "SPM EOG");
    size_t len;
    const char *p = tok_piece(t, 15043, &len);
    CHECK(p && len == 8 && !memcmp(p, "\xe2\x96\x81Hello", 8), "raw piece");
    CHECK(tok_piece(t, 32000, &len) == NULL, "piece out of range");
    tok_release(t);
}

/* ---- streaming ---- */

/* Reference: text with each maximal invalid UTF-8 subpart replaced by U+FFFD; with
 * final == 0 an unfinished character at the end is left out instead. */
static size_t ref_sanitize(const unsigned char *s, size_t n, int final, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = s[i], need, lo = 0x80, hi = 0xbf;
        if (c < 0x80) {
            out[o++] = (char)c;
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            need = 2;
        else if (c >= 0xe0 && c <= 0xef)
            need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        else if (c >= 0xf0 && c <= 0xf4)
            need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        else
            need = 0;
        size_t k = 1;
        while (need && k < need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xbf))
            k++;
        if (need && k == need) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else if (need && i + k == n && !final) {
            break; /* may still be finished by later bytes */
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += k;
        }
    }
    return o;
}

static void stream_check(const struct tok *t, const int32_t *ids, int64_t n, int special, const char *what)
{
    size_t cap = 3 * (tok_max_token_text(t) + 4);
    char *chunk = malloc(cap), *got = malloc(64 * 1024), *whole = malloc(64 * 1024), *ref = malloc(200 * 1024);
    struct tok_stream st;
    tok_stream_init(&st, t, special);
    size_t gl = 0, len;
    int ok = 1;
    for (int64_t k = 0; k < n && ok; k++) {
        int rc = tok_stream_feed(&st, ids[k], chunk, cap, &len);
        ok &= rc == 0;
        memcpy(got + gl, chunk, len);
        gl += len;
        size_t wl;
        rc = tok_detok(t, ids, k + 1, special, whole, 64 * 1024, &wl);
        size_t rl = ref_sanitize((unsigned char *)whole, wl, 0, ref);
        ok &= rc == 0 && rl == gl && !memcmp(ref, got, gl);
        CHECK(ok, "%s: after %lld tokens the stream gave %zu bytes, decode-and-diff %zu", what, (long long)k + 1, gl, rl);
    }
    int rc = tok_stream_flush(&st, chunk, cap, &len);
    memcpy(got + gl, chunk, len);
    gl += len;
    size_t wl;
    rc |= tok_detok(t, ids, n, special, whole, 64 * 1024, &wl);
    size_t rl = ref_sanitize((unsigned char *)whole, wl, 1, ref);
    CHECK(ok && rc == 0 && rl == gl && !memcmp(ref, got, gl), "%s: flushed stream differs (%zu vs %zu bytes)", what, gl, rl);
    free(chunk);
    free(got);
    free(whole);
    free(ref);
}

static void test_stream(const char *name, uint64_t seed)
{
    struct tok *t = load(name);
    if (!t)
        return;
    int32_t ids[512];
    /* a real text: the stream reproduces it exactly */
    const char *text = " Hello, y'all! 🦙 мир 世界 ☕️ café\n\tend";
    int64_t n = enc(t, text, 0, 0, ids, 512);
    stream_check(t, ids, n, 0, name);
    char buf[256];
    size_t len;
    tok_detok(t, ids, n, 0, buf, sizeof buf, &len);
    CHECK(len == strlen(text) && !memcmp(buf, text, len), "%s: text round trip", name);
    /* random ids: invalid and split characters everywhere */
    uint64_t rs = seed;
    for (int round = 0; round < 40; round++) {
        int64_t m = 1 + (int64_t)(test_rand_u64(&rs) % 64);
        for (int64_t i = 0; i < m; i++)
            ids[i] = (int32_t)(test_rand_u64(&rs) % (uint64_t)tok_n_vocab(t));
        stream_check(t, ids, m, (int)(round & 1), name);
    }
    /* EFULL leaves the stream unchanged */
    struct tok_stream st;
    tok_stream_init(&st, t, 0);
    int32_t id = (int32_t)enc(t, "x", 0, 0, ids, 4) == 1 ? ids[0] : 0;
    size_t need;
    int rc = tok_stream_feed(&st, id, buf, 0, &need);
    CHECK(rc == CAIRN_EFULL && need == 1 && st.npend == 0 && !st.started, "%s: stream EFULL rc %d need %zu", name, rc, need);
    tok_release(t);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_qwen2);
    RUN(test_llama_bpe);
    RUN(test_spm);
    RUN(test_stream, "llama-spm", 1);
    RUN(test_stream, "gpt-2", 2);
    RUN(test_stream, "qwen2", 3);
    return test_main_end();
}
