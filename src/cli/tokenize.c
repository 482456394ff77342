/* cairn tokenize: the tokens of a text under a model's tokenizer, and a benchmark. */
#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cairn tokenize -m MODEL.gguf [options] [TEXT]\n"
            "  -m, --model FILE  GGUF file whose tokenizer to use\n"
            "  --file F          tokenize the contents of F (default: TEXT, else stdin)\n"
            "  --ids             print only the ids, space-separated, on one line\n"
            "  --special         parse control tokens such as <|im_start|> in the text\n"
            "  --no-bos          never add BOS/EOS (by default as the model's metadata says)\n"
            "  --bench           report MB/s tokenizing 1 MiB of mixed text on one thread\n"
            "prints one line per token: id<TAB>'piece'\n");
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
        if (array_reserve(&buf, &cap, n + 1, 1, 0)) {
            free(buf);
            return NULL;
        }
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Deterministic mixed text: prose, code, numbers, several scripts, emoji, whitespace. */
static char *bench_text(size_t size, int spaces)
{
    static const char *const parts[] = {
        "The quick brown fox jumps over the lazy dog. ", "It's been a while; we'll see what they've done. ",
        "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }\n", "    return x->next;\n",
        "3.14159 2718281828 1,000,000 0x7fff ", "Привет, как дела? ", "你好，世界！我们在这里工作。",
        "こんにちは世界 ", "안녕하세요 ", "مرحبا بالعالم ", "🦙🚀😀 👍🏽 ", "\n\n", "\t  ",
        "<div class=\"row\">&nbsp;</div>", "Ça va très bien, merci! ", "naïve façade coöperate ",
    };
    char *buf = malloc(size + 64);
    if (!buf)
        return NULL;
    uint64_t s = 12345;
    size_t n = 0;
    while (n < size) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const char *p = parts[(s >> 33) % (sizeof parts / sizeof parts[0])];
        for (; *p && n < size + 60; p++)
            if (spaces || (*p != ' ' && *p != '\n' && *p != '\t'))
                buf[n++] = *p;
    }
    /* cut at a character boundary */
    while (n > size || (n > 0 && ((unsigned char)buf[n] & 0xc0) == 0x80))
        n--;
    buf[n] = 0;
    return buf;
}

static int bench(const struct tok *t, int spaces)
{
    size_t size = 1 << 20;
    char *text = bench_text(size, spaces);
    int64_t cap = (int64_t)size + 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!text || !ids) {
        free(text);
        free(ids);
        fprintf(stderr, "cairn tokenize: out of memory\n");
        return 1;
    }
    size = strlen(text);
    double best = 1e30, total = 0;
    int runs = 0, rc = 0;
    while (runs < 3 || (total < 2.0 && runs < 20)) {
        double t0 = clock_sec();
        rc = tok_encode(t, text, size, 0, 0, ids, cap, &n);
        double dt = clock_sec() - t0;
        if (rc)
            break;
        total += dt;
        runs++;
        if (dt < best)
            best = dt;
    }
    if (rc) {
        fprintf(stderr, "cairn tokenize: encode failed: %s\n", cairn_strerror(rc));
    } else {
        printf("bench %s: %.2f MiB %s -> %lld tokens (%.2f bytes/token), best %.1f ms = %.1f MB/s, mean %.1f MB/s over %d runs, 1 thread\n",
               tok_pre(t), (double)size / (1 << 20), spaces ? "mixed text" : "mixed text without whitespace",
               (long long)n, (double)size / (double)(n ? n : 1), best * 1e3, (double)size / best / 1e6,
               (double)size * runs / total / 1e6, runs);
    }
    free(text);
    free(ids);
    return rc ? 1 : 0;
}

int cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *text = NULL;
    int only_ids = 0, special = 0, add_special = 1, do_bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(a, "--file") && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            only_ids = 1;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "--no-bos")) {
            add_special = 0;
        } else if (!strcmp(a, "--bench")) {
            do_bench = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1] && !text) {
            fprintf(stderr, "cairn tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "cairn tokenize: more than one TEXT argument\n");
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "cairn tokenize: no model given (-m MODEL.gguf)\n");
        usage(stderr);
        return 2;
    }
    if (text && file) {
        fprintf(stderr, "cairn tokenize: give TEXT or --file, not both\n");
        return 2;
    }

    char err[512];
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    if (gguf_open(&f, model, err, sizeof err)) {
        fprintf(stderr, "cairn tokenize: cannot open model '%s': %s\n", model, err);
        return 1;
    }
    int rc = tok_load(&t, f, err, sizeof err);
    gguf_close(f);
    if (rc) {
        fprintf(stderr, "cairn tokenize: model '%s' has no usable tokenizer: %s\n", model, err);
        return 1;
    }
    if (do_bench) {
        rc = bench(t, 1);
        if (!rc)
            rc = bench(t, 0);
        tok_release(t);
        return rc;
    }

    char *owned = NULL;
    size_t len = 0;
    if (text) {
        len = strlen(text);
    } else {
        FILE *in = file ? fopen(file, "rb") : stdin;
        if (!in) {
            fprintf(stderr, "cairn tokenize: cannot open '%s'\n", file);
            tok_release(t);
            return 1;
        }
        owned = read_all(in, &len);
        if (file)
            fclose(in);
        if (!owned) {
            fprintf(stderr, "cairn tokenize: cannot read '%s'\n", file ? file : "stdin");
            tok_release(t);
            return 1;
        }
        text = owned;
    }

    int64_t n = 0, cap = (int64_t)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    size_t pcap = tok_max_token_text(t) + 1;
    char *piece = malloc(pcap);
    rc = ids && piece ? tok_encode(t, text, len, add_special, special, ids, cap, &n) : CAIRN_ENOMEM;
    if (rc == CAIRN_EFULL) { /* invalid bytes can grow (U+FFFD): retry at the size needed */
        free(ids);
        cap = n;
        ids = malloc((size_t)cap * sizeof *ids);
        rc = ids ? tok_encode(t, text, len, add_special, special, ids, cap, &n) : CAIRN_ENOMEM;
    }
    if (rc) {
        fprintf(stderr, "cairn tokenize: %s\n", cairn_strerror(rc));
    } else if (only_ids) {
        for (int64_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else {
        for (int64_t i = 0; i < n; i++) {
            size_t pl = 0;
            tok_token_text(t, ids[i], 1, piece, pcap, &pl);
            printf("%d\t'%.*s'\n", ids[i], (int)pl, piece);
        }
    }
    free(ids);
    free(piece);
    free(owned);
    tok_release(t);
    return rc ? 1 : 0;
}
