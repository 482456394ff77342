/* Reference vectors: every string of testdata/vocab/X.gguf.inp tokenizes (without BOS)
 * to exactly the ids on the matching line of X.gguf.out, and detokenizes back to itself
 * where the tokenizer is lossless. */
#include "testutil.h"

#include "base/err.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

static void print_ids(const char *what, const int32_t *ids, int64_t n)
{
    fprintf(stderr, "  %s:", what);
    for (int64_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Strings of .inp are separated by "\n__ggml_vocab_test__\n" (the file ends with one). */
static void check_vocab(const char *name, int lossless_expected)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "vocab/ggml-vocab-%s.gguf", name);
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, test_data_path(path), err, sizeof err);
    CHECK(rc == 0, "%s: gguf_open: %s", name, err);
    if (rc)
        return;
    struct tok *t = NULL;
    rc = tok_load(&t, f, err, sizeof err);
    CHECK(rc == 0, "%s: tok_load: %s", name, err);
    gguf_close(f); /* the tokenizer copies what it needs */
    if (rc)
        return;

    size_t inl, outl;
    snprintf(path, sizeof path, "vocab/ggml-vocab-%s.gguf.inp", name);
    char *inp = read_file(test_data_path(path), &inl);
    snprintf(path, sizeof path, "vocab/ggml-vocab-%s.gguf.out", name);
    char *outp = read_file(test_data_path(path), &outl);
    CHECK(inp && outp, "%s: cannot read test vectors", name);
    if (!inp || !outp) {
        free(inp);
        free(outp);
        tok_release(t);
        return;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = outp;
    int total = 0, match = 0, rt_total = 0, rt_match = 0;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e)
            break;
        size_t len = (size_t)(e - p);
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = 0;
        int32_t want[1024];
        int64_t nwant = 0;
        for (char *q = line, *end; nwant < 1024; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q)
                break;
            want[nwant++] = (int32_t)v;
        }
        int32_t got[1024];
        int64_t ngot = 0;
        rc = tok_encode(t, p, len, 0, 0, got, 1024, &ngot);
        total++;
        int ok = rc == 0 && ngot == nwant && !memcmp(got, want, (size_t)nwant * sizeof *got);
        match += ok;
        CHECK(ok, "%s: string %d '%.*s' (rc %d)", name, total - 1, (int)len, p, rc);
        if (!ok) {
            print_ids("want", want, nwant);
            print_ids("got ", got, ngot);
        }
        /* round trip */
        char back[8192];
        size_t blen;
        rc = tok_detok(t, got, ngot, 0, back, sizeof back, &blen);
        rt_total++;
        int rt = rc == 0 && blen == len && !memcmp(back, p, len);
        rt_match += rt;
        if (lossless_expected)
            CHECK(rt, "%s: detok(tok(string %d)) = '%.*s', want '%.*s'", name, total - 1,
                  (int)blen, back, (int)len, p);
        p = e + strlen(sep);
        line = nl + 1;
    }
    printf("%s: %d/%d strings match the reference ids; %d/%d round trip\n", name, match, total,
           rt_match, rt_total);
    CHECK(total == 46, "%s: %d strings read", name, total);
    free(inp);
    free(outp);
    tok_release(t);
}

int main(void)
{
    check_vocab("llama-spm", 1);
    check_vocab("llama-bpe", 1);
    check_vocab("qwen2", 1);
    check_vocab("gpt-2", 1);
    return test_main_end();
}
