/* Randomized properties on the real vocabularies: valid Unicode round trips
 * (detok(encode(x)) == x), random bytes never crash and decode as the reference cleans
 * them, long inputs without spaces take linear-ish time, and one tokenizer serves
 * several threads at once with the same results. */
#include "testutil.h"
#include "tok_ref.h"

#include "base/clock.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#include <pthread.h>
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

/* A random code point from a mix of scripts, emoji, marks, whitespace and the whole
 * valid range; no whitespace when spaces == 0. */
static uint32_t rand_cp(uint64_t *rs, int spaces)
{
    static const uint32_t ranges[][2] = {
        {'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'!', '/'}, {0xc0, 0x17f}, {0x391, 0x3c9},
        {0x410, 0x44f}, {0x5d0, 0x5ea}, {0x627, 0x64a}, {0x900, 0x97f}, {0xe01, 0xe5b},
        {0x1100, 0x11ff}, {0x3040, 0x30ff}, {0x4e00, 0x9fff}, {0xac00, 0xd7a3}, {0xff01, 0xff5e},
        {0x1f300, 0x1f6ff}, {0x1f900, 0x1f9ff}, {0x300, 0x36f}, {0xfe00, 0xfe0f}, {0x200d, 0x200d},
        {0x1f3fb, 0x1f3ff}, {0xe000, 0xf8ff}, {0x10000, 0x10ffff},
    };
    static const uint32_t ws[] = {' ', ' ', ' ', '\n', '\t', '\r', 0xa0, 0x3000, 0x2009, 0x85};
    uint64_t r = test_rand_u64(rs);
    if (spaces && r % 5 == 0)
        return ws[(r >> 8) % (sizeof ws / sizeof ws[0])];
    const uint32_t *g = ranges[(r >> 16) % (sizeof ranges / sizeof ranges[0])];
    uint32_t cp = g[0] + (uint32_t)((r >> 32) % (g[1] - g[0] + 1));
    if (cp >= 0xd800 && cp <= 0xdfff)
        cp = 'x';
    if (!spaces && (cp == 0x85 || cp == 0xa0 || cp == 0x3000 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
                    cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f))
        cp = 'y';
    return cp;
}

static size_t rand_text(uint64_t *rs, char *out, size_t ncp, int spaces)
{
    size_t o = 0;
    for (size_t i = 0; i < ncp; i++) {
        /* runs of whitespace now and then */
        if (spaces && test_rand_u64(rs) % 40 == 0) {
            size_t run = 2 + test_rand_u64(rs) % 12;
            for (size_t k = 0; k < run; k++)
                out[o++] = " \n\t"[test_rand_u64(rs) % 3];
        }
        o += (size_t)put_utf8(rand_cp(rs, spaces), out + o);
    }
    return o;
}

static int round_trip(const struct tok *t, const char *s, size_t len, const char *what)
{
    int64_t cap = (int64_t)len + 8, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char *back = malloc(len + 16);
    size_t bl = 0;
    int rc = tok_encode(t, s, len, 0, 0, ids, cap, &n);
    if (rc == 0)
        rc = tok_detok(t, ids, n, 0, back, len + 16, &bl);
    int ok = rc == 0 && bl == len && !memcmp(back, s, len);
    if (!ok) {
        size_t d = 0;
        while (d < len && d < bl && back[d] == s[d])
            d++;
        CHECK(ok, "%s: round trip of %zu bytes: rc %d, got %zu bytes, first difference at %zu", what, len, rc, bl, d);
    } else {
        CHECK(ok, "unreachable");
    }
    free(ids);
    free(back);
    return ok;
}

static void test_round_trips(const char *name, uint64_t seed)
{
    struct tok *t = load(name);
    if (!t)
        return;
    uint64_t rs = seed;
    char *buf = malloc(1 << 20);
    int ok = 0, n = 0;
    for (int i = 0; i < 150; i++) {
        size_t len = rand_text(&rs, buf, 1 + test_rand_u64(&rs) % 300, 1);
        ok += round_trip(t, buf, len, name);
        n++;
    }
    /* 100 KB without whitespace: one long pre-token */
    size_t len = 0;
    while (len < 100 * 1000)
        len += (size_t)put_utf8(rand_cp(&rs, 0), buf + len);
    ok += round_trip(t, buf, len, name);
    n++;
    printf("%s: %d/%d random Unicode strings round trip\n", name, ok, n);

    /* random bytes: never a crash; SentencePiece keeps every byte, byte-level BPE
     * decodes to the input cleaned as the reference cleans it */
    int bytes_ok = 0;
    char *want = malloc(4096);
    for (int i = 0; i < 300; i++) {
        size_t l = test_rand_u64(&rs) % 600;
        for (size_t k = 0; k < l; k++) {
            uint64_t r = test_rand_u64(&rs);
            buf[k] = r % 3 ? (char)(r >> 8) : " a\xc3\xe6\x88\xf0\x9f\x80\xed\xa0\xe2\x96\x81"[(r >> 8) % 13];
        }
        int64_t cap = (int64_t)l * 3 + 8, m = 0;
        int32_t *ids = malloc((size_t)cap * sizeof *ids);
        int rc = tok_encode(t, buf, l, i & 1, i & 2, ids, cap, &m);
        char back[8192];
        size_t bl = 0;
        if (rc == 0)
            rc = tok_detok(t, ids, m, 0, back, sizeof back, &bl);
        size_t wl = tok_kind(t) == TOK_KIND_SPM ? spm_expect(buf, l, want) : ref_clean((unsigned char *)buf, l, want);
        const char *w = want;
        int good = rc == 0 && bl == wl && !memcmp(back, w, wl);
        if (i & 2) /* with parse_special a random <...> could be a control token */
            good = rc == 0;
        bytes_ok += good;
        CHECK(good, "%s: random bytes %d (%zu bytes): rc %d, decoded %zu bytes, want %zu", name, i, l, rc, bl, wl);
        free(ids);
    }
    printf("%s: %d/300 random byte strings encode and decode as the reference cleans them\n", name, bytes_ok);
    free(want);
    free(buf);
    tok_release(t);
}

static double time_encode(const struct tok *t, const char *s, size_t len, int64_t *n, int64_t *work)
{
    int64_t cap = (int64_t)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    double t0 = clock_sec();
    int rc = tok_encode_counted(t, s, len, 0, 0, ids, cap, n, work);
    double dt = clock_sec() - t0;
    CHECK(rc == 0, "encode %zu bytes: rc %d", len, rc);
    free(ids);
    return dt;
}

/* 1 MiB pre-tokens with no space: letters, one repeated letter, digits, CJK. The merge
 * work (heap steps, counted) for 1 MiB must stay within a small multiple of 4x the work
 * for 256 KiB: n log n, not quadratic. Times are printed, never asserted (a busy machine
 * under ASan once took 23x for 4x the input). */
static void test_long(const char *name)
{
    struct tok *t = load(name);
    if (!t)
        return;
    size_t big = 1 << 20;
    char *buf = malloc(big + 8);
    uint64_t rs = 99;
    for (int kind = 0; kind < 4; kind++) {
        size_t len = 0;
        while (len + 4 <= big) {
            uint32_t cp = kind == 0 ? 'a' + (uint32_t)(test_rand_u64(&rs) % 26)
                          : kind == 1 ? 'a'
                          : kind == 2 ? '0' + (uint32_t)(test_rand_u64(&rs) % 10)
                                      : 0x4e00 + (uint32_t)(test_rand_u64(&rs) % 0x5000);
            len += (size_t)put_utf8(cp, buf + len);
        }
        int64_t n1, n4, w1 = 0, w4 = 0;
        double t1 = time_encode(t, buf, len / 4, &n1, &w1);
        double t4 = time_encode(t, buf, len, &n4, &w4);
        printf("%s: no-space input %d: 256 KiB %.3f s (%lld tokens, %lld steps), 1 MiB %.3f s (%lld tokens, "
               "%lld steps)\n", name, kind, t1, (long long)n1, (long long)w1, t4, (long long)n4, (long long)w4);
        CHECK(w4 <= 6 * w1 + 1000, "%s: kind %d: 1 MiB took %lld merge steps, 256 KiB %lld: not n log n", name, kind,
              (long long)w4, (long long)w1);
        CHECK(w4 < 64 * (int64_t)len, "%s: kind %d: %lld steps for %zu bytes", name, kind, (long long)w4, len);
        if (kind == 0)
            round_trip(t, buf, len, name);
    }
    free(buf);
    tok_release(t);
}

struct job {
    const struct tok *t;
    const char *text;
    size_t len;
    const int32_t *want;
    int64_t nwant;
    int ok;
};

static void *worker(void *arg)
{
    struct job *j = arg;
    int32_t *ids = malloc((size_t)(j->nwant + 8) * sizeof *ids);
    j->ok = 1;
    for (int r = 0; r < 20; r++) {
        int64_t n;
        int rc = tok_encode(j->t, j->text, j->len, 1, 1, ids, j->nwant + 8, &n);
        j->ok &= rc == 0 && n == j->nwant && !memcmp(ids, j->want, (size_t)n * sizeof *ids);
    }
    free(ids);
    return NULL;
}

static void test_threads(const char *name)
{
    struct tok *t = load(name);
    if (!t)
        return;
    enum { NT = 4 };
    struct job jobs[NT];
    pthread_t th[NT];
    uint64_t rs = 5;
    char *texts[NT];
    int32_t *want[NT];
    for (int i = 0; i < NT; i++) {
        texts[i] = malloc(64 * 1024);
        size_t len = rand_text(&rs, texts[i], 4000, 1);
        strcpy(texts[i] + len, "<|im_start|>x<|im_end|>");
        len += 23;
        want[i] = malloc((len + 8) * sizeof(int32_t));
        int64_t n;
        int rc = tok_encode(t, texts[i], len, 1, 1, want[i], (int64_t)len + 8, &n);
        CHECK(rc == 0, "encode");
        jobs[i] = (struct job){t, texts[i], len, want[i], n, 0};
    }
    for (int i = 0; i < NT; i++)
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok, "%s: thread %d got different tokens", name, i);
        free(texts[i]);
        free(want[i]);
    }
    tok_release(t);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_round_trips, "llama-bpe", 11);
    RUN(test_round_trips, "qwen2", 12);
    RUN(test_round_trips, "gpt-2", 13);
    RUN(test_round_trips, "llama-spm", 14);
    RUN(test_long, "llama-bpe");
    RUN(test_long, "qwen2");
    RUN(test_long, "gpt-2");
    RUN(test_long, "llama-spm");
    RUN(test_threads, "qwen2");
    RUN(test_threads, "llama-spm");
    return test_main_end();
}
