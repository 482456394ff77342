/* libFuzzer harness of the tokenizers (tok/) on arbitrary bytes, with two real
 * vocabularies: Llama 3's byte-level BPE and Llama 2's SentencePiece. For each:
 *  - encoding with too small a buffer gives CAIRN_EFULL, the count needed and the same
 *    first ids as encoding with enough room;
 *  - decoding gives the input back as the tokenizer promises (tok_test_random's
 *    properties): byte-level BPE the input with invalid UTF-8 cleaned as llama.cpp cleans
 *    it, SentencePiece every byte (U+2581 read as a space);
 *  - the streaming detokenizer emits the same text when that text is valid UTF-8;
 *  - encoding with special tokens parsed and BOS/EOS added succeeds, and decodes.
 * The vocabularies are read from ../shared/testdata/vocab (run from the repository root,
 * or set CAIRN_SHARED_DIR). CAIRN_FUZZ_O200K names a third, gpt-oss's o200k_harmony
 * (tests/e2e/o200k.mjs writes it; run.sh does when node can): its tiktoken pre-tokenizer
 * meets the same byte-level properties. Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "tok/tok.h"
#include "tok/tok_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "fuzz_tok: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                    \
        }                                                               \
    } while (0)

static struct tok *toks[3];
static int n_toks;

static struct tok *load_path(const char *path)
{
    char err[256];
    struct gguf_file *f;
    struct tok *t = NULL;
    if (gguf_open(&f, path, err, sizeof err) || tok_load(&t, f, err, sizeof err)) {
        fprintf(stderr, "fuzz_tok: %s\n", err);
        exit(2);
    }
    gguf_close(f);
    return t;
}

static struct tok *load(const char *name)
{
    const char *dir = getenv("CAIRN_SHARED_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/testdata/vocab/ggml-vocab-%s.gguf", dir ? dir : "../shared", name);
    return load_path(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    toks[n_toks++] = load("llama-bpe");
    toks[n_toks++] = load("llama-spm");
    const char *o200k = getenv("CAIRN_FUZZ_O200K");
    if (o200k && o200k[0])
        toks[n_toks++] = load_path(o200k);
    return 0;
}

/* Encodes, first into a buffer that is likely too small; returns the ids (malloc'd). */
static int32_t *encode(const struct tok *t, const char *s, size_t n, int special, int64_t *n_ids)
{
    int64_t small = (int64_t)(n / 4), m = 0, m2 = 0;
    int32_t *ids = malloc((size_t)(small + 1) * sizeof *ids);
    int rc = tok_encode(t, s, n, special, special, ids, small, &m);
    CHECK(rc == 0 || rc == CAIRN_EFULL);
    CHECK(rc == 0 ? m <= small : m > small);
    if (rc == CAIRN_EFULL) {
        int32_t *all = malloc((size_t)m * sizeof *all);
        CHECK(tok_encode(t, s, n, special, special, all, m, &m2) == 0 && m2 == m);
        CHECK(!memcmp(all, ids, (size_t)small * sizeof *ids));
        free(ids);
        ids = all;
    }
    *n_ids = m;
    return ids;
}

/* Detokenizes, first with no room, then one byte short; returns the text (malloc'd). */
static char *decode(const struct tok *t, const int32_t *ids, int64_t n, int special, size_t *len)
{
    size_t need = 0, got = 0;
    int rc = tok_detok(t, ids, n, special, NULL, 0, &need);
    CHECK(need ? rc == CAIRN_EFULL : rc == 0);
    char *out = malloc(need + 1);
    if (need)
        CHECK(tok_detok(t, ids, n, special, out, need - 1, &got) == CAIRN_EFULL && got == need);
    CHECK(tok_detok(t, ids, n, special, out, need, &got) == 0 && got == need);
    *len = got;
    return out;
}

/* The streaming detokenizer's text for ids (render_special 0), at most max bytes. */
static char *stream(const struct tok *t, const int32_t *ids, int64_t n, size_t max, size_t *len)
{
    size_t cap = 3 * (tok_max_token_text(t) + 4), o = 0, k;
    char *out = malloc(max), *chunk = malloc(cap);
    struct tok_stream st;
    tok_stream_init(&st, t, 0);
    for (int64_t i = 0; i <= n; i++, o += k) {
        if (i < n)
            CHECK(tok_stream_feed(&st, ids[i], chunk, cap, &k) == 0);
        else
            CHECK(tok_stream_flush(&st, chunk, cap, &k) == 0);
        CHECK(k <= max - o);
        memcpy(out + o, chunk, k);
    }
    free(chunk);
    *len = o;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    const char *s = (const char *)data;
    char *want = malloc(3 * size + 1);
    for (int v = 0; v < n_toks; v++) {
        const struct tok *t = toks[v];
        int64_t n;
        size_t len, wl, sl;
        int32_t *ids = encode(t, s, size, 0, &n);
        for (int64_t i = 0; i < n; i++)
            CHECK(ids[i] >= 0 && ids[i] < tok_n_vocab(t));
        char *back = decode(t, ids, n, 0, &len);
        wl = tok_kind(t) == TOK_KIND_SPM ? spm_expect(s, size, want) : ref_clean(data, size, want);
        if (len != wl || memcmp(back, want, wl))
            fprintf(stderr, "fuzz_tok: %s: %zu bytes decode to %zu, expected %zu\n", tok_pre(t), size, len, wl);
        CHECK(len == wl && !memcmp(back, want, wl));
        char *streamed = stream(t, ids, n, 3 * len + 8, &sl), *clean = malloc(3 * len + 1);
        if (ref_clean((const unsigned char *)back, len, clean) == len && !memcmp(clean, back, len))
            CHECK(sl == len && !memcmp(streamed, back, len)); /* valid UTF-8 streams unchanged */
        free(clean);
        free(streamed);
        free(back);
        free(ids);

        ids = encode(t, s, size, 1, &n);
        free(decode(t, ids, n, 1, &len));
        free(ids);
    }
    free(want);
    return 0;
}
