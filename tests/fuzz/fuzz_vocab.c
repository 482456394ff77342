/* libFuzzer harness of the tokenizer's loader (tok/tok.c, tok_spm.c, tok_bpe.c) on a
 * model file's vocabulary: the input is a whole GGUF (tokens, scores, token types,
 * merges, pre-tokenizer, special ids, flags), as a downloaded model brings it. A
 * vocabulary is loaded or refused with a reason; a loaded one then encodes a few fixed
 * texts and the text of its own first pieces into ids below n_vocab that detokenize
 * (whole, and streamed token by token), and each of its first tokens renders with
 * CAIRN_EFULL and the size needed when the buffer is short. fuzz_tok covers the
 * encoders on arbitrary text with real vocabularies. Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "fuzz_vocab: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                     \
        }                                                                \
    } while (0)

enum { MAX_IDS = 4096, TOKENS_CHECKED = 512 };

static const char *texts[] = {
    "Hello world", " a  b\n\n\t c", "\xff\xfe\xc3 bad", "<|im_start|>user\nhi<|im_end|>", "<s></s><unk>",
    "1234567 89", "h\xc3\xa9llo \xf0\x9f\x99\x82 \xe4\xb8\xad\xe6\x96\x87", "",
};

/* Encodes text both ways (special tokens parsed or not) and decodes what came out. */
static void encode_decode(const struct tok *t, const char *text, size_t len)
{
    static int32_t ids[MAX_IDS];
    int32_t n_vocab = tok_n_vocab(t);
    for (int special = 0; special < 2; special++) {
        int64_t n = 0;
        int rc = tok_encode(t, text, len, special, special, ids, MAX_IDS, &n);
        if (rc == CAIRN_EFULL || rc == CAIRN_ENOMEM)
            continue;
        CHECK(rc == 0 && n >= 0 && n <= MAX_IDS);
        for (int64_t i = 0; i < n; i++)
            CHECK(ids[i] >= 0 && ids[i] < n_vocab);
        size_t need = 0;
        char one[1];
        rc = tok_detok(t, ids, n, special, one, 0, &need);
        CHECK(rc == 0 || rc == CAIRN_EFULL);
        char *out = malloc(need + 1);
        CHECK(out);
        size_t got = 0;
        CHECK(tok_detok(t, ids, n, special, out, need + 1, &got) == 0 && got == need);
        free(out);
        struct tok_stream s;
        tok_stream_init(&s, t, special);
        size_t cap = 3 * (tok_max_token_text(t) + 4);
        char *buf = malloc(cap);
        CHECK(buf);
        for (int64_t i = 0; i < n; i++)
            CHECK(tok_stream_feed(&s, ids[i], buf, cap, &got) == 0 && got <= cap);
        CHECK(tok_stream_flush(&s, buf, cap, &got) == 0);
        free(buf);
    }
}

/* Renders each of the first tokens, with a short buffer first; appends their text to all. */
static size_t render_tokens(const struct tok *t, char *all, size_t cap)
{
    size_t used = 0, max = tok_max_token_text(t);
    char small[4];
    char *buf = malloc(max + 1);
    CHECK(buf);
    int32_t n = tok_n_vocab(t) < TOKENS_CHECKED ? tok_n_vocab(t) : TOKENS_CHECKED;
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0, plen = 0;
        int rc = tok_token_text(t, id, 1, small, sizeof small, &len);
        CHECK(rc == 0 || (rc == CAIRN_EFULL && len > sizeof small));
        CHECK(len <= max);
        CHECK(tok_token_text(t, id, 1, buf, max + 1, &len) == 0);
        CHECK(tok_piece(t, id, &plen) != NULL);
        if (used + len <= cap) {
            memcpy(all + used, buf, len);
            used += len;
        }
    }
    size_t len;
    CHECK(tok_token_text(t, -1, 1, buf, max + 1, &len) == CAIRN_ERANGE);
    CHECK(tok_token_text(t, tok_n_vocab(t), 1, buf, max + 1, &len) == CAIRN_ERANGE);
    free(buf);
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    char err[256] = "";
    if (gguf_open_memory(&f, data, size, err, sizeof err))
        return 0;
    err[0] = 0;
    int rc = tok_load(&t, f, err, sizeof err);
    if (rc) {
        CHECK(t == NULL && err[0]); /* a refusal says why */
    } else {
        CHECK(tok_n_vocab(t) >= 1);
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
            encode_decode(t, texts[i], strlen(texts[i]));
        static char all[1 << 14];
        encode_decode(t, all, render_tokens(t, all, sizeof all));
        tok_release(t);
    }
    gguf_close(f);
    return 0;
}
