/* What constrained decoding adds to one decode step of one sequence: the grammar's mask
 * (a cache lookup once a state was seen, else a walk of the vocabulary's trie) and
 * sampling under it, against sampling alone, over the steps of outputs of a JSON Schema
 * drawn at random from random logits (the tokens a random-weight model would pick).
 *
 *   cmake --build build --target bench_grammar_mask
 *   build/bench_grammar_mask VOCAB.gguf [SCHEMA.json] [STEPS] [TEMPERATURE]
 *
 * Prints per step: mask time (all, and cache hits alone), sampling with and without the
 * mask, walks and hits; compare the sum with a decode step of the model (cairn bench). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/sample.h"
#include "gguf/gguf.h"
#include "tok/grammar.h"
#include "tok/jschema.h"
#include "tok/tok.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *DEFAULT_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4},\"kind\":{\"enum\":[\"a\",\"b\"]},"
    "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\",\"kind\",\"ok\"],"
    "\"additionalProperties\":false}";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s VOCAB.gguf [SCHEMA.json] [STEPS] [TEMPERATURE]\n", argv[0]);
        return 2;
    }
    char err[512];
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    if (gguf_open(&f, argv[1], err, sizeof err) || tok_load(&t, f, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    gguf_close(f);
    json_error_t je;
    json_t *schema = argc > 2 && strcmp(argv[2], "-") ? json_load_file(argv[2], 0, &je) : json_loads(DEFAULT_SCHEMA, 0, &je);
    int steps = argc > 3 ? atoi(argv[3]) : 2000;
    float temp = argc > 4 ? (float)atof(argv[4]) : 1.0f;
    char *gbnf = NULL;
    struct grammar *g = NULL;
    struct grammar_ctx *c = NULL;
    if (!schema || jschema_to_gbnf(schema, &gbnf, err, sizeof err) ||
        grammar_parse(&g, gbnf, strlen(gbnf), "root", err, sizeof err)) {
        fprintf(stderr, "schema: %s\n", schema ? err : je.text);
        return 1;
    }
    double t0 = now_us();
    if (grammar_ctx_from_tok(&c, g, t)) {
        fprintf(stderr, "ctx failed\n");
        return 1;
    }
    double t_ctx = now_us() - t0;
    int32_t n = tok_n_vocab(t);
    float *logits = malloc((size_t)n * sizeof *logits);
    struct sampler *smp = NULL;
    sample_create(&smp, n);
    struct sample_params p = sample_defaults();
    p.temperature = temp;
    p.top_k = 0; /* the full vocabulary, the dearest case */
    uint64_t x = 88172645463325252ull;
    double mask_us = 0, hit_us = 0, with_us = 0, without_us = 0;
    int hits = 0, outputs = 0;
    struct grammar_match *m = NULL;
    int64_t walks0, hits0;
    for (int s = 0; s < steps; s++) {
        if (!m) {
            grammar_match_create(&m, c);
            outputs++;
        }
        for (int32_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            logits[i] = (float)(x >> 40) / (float)(1 << 24) * 8.0f;
        }
        grammar_ctx_stats(c, &walks0, &hits0);
        double a = now_us();
        const uint32_t *mask;
        if (grammar_match_mask(m, 100000, &mask)) {
            fprintf(stderr, "mask failed\n");
            return 1;
        }
        double b = now_us();
        int64_t walks1, hits1;
        grammar_ctx_stats(c, &walks1, &hits1);
        mask_us += b - a;
        if (hits1 > hits0) {
            hit_us += b - a;
            hits++;
        }
        p.allow = mask;
        a = now_us();
        int32_t tok = sample_token(smp, &p, logits, NULL, 0, s, NULL);
        b = now_us();
        with_us += b - a;
        p.allow = NULL;
        a = now_us();
        (void)sample_token(smp, &p, logits, NULL, 0, s, NULL);
        without_us += now_us() - a;
        if (tok < 0 || grammar_match_accept(m, tok)) {
            fprintf(stderr, "token %d refused\n", tok);
            return 1;
        }
        if (grammar_match_done(m) || tok_is_eog(t, tok)) {
            grammar_match_release(m);
            m = NULL;
        }
    }
    int64_t walks, chits;
    grammar_ctx_stats(c, &walks, &chits);
    printf("vocab %d tokens, ctx built in %.1f ms, %d steps over %d outputs, temperature %.1f\n", n, t_ctx / 1e3,
           steps, outputs, temp);
    printf("mask: %.1f us/step (cache hits %d of %d steps: %.1f us each; %lld walks)\n", mask_us / steps, hits, steps,
           hits ? hit_us / hits : 0, (long long)walks);
    printf("sampling: %.1f us/step with the mask, %.1f without\n", with_us / steps, without_us / steps);
    printf("added per step: %.1f us\n", (mask_us + with_us - without_us) / steps);
    grammar_match_release(m);
    grammar_ctx_release(c);
    grammar_release(g);
    sample_release(smp);
    free(logits);
    free(gbnf);
    json_decref(schema);
    tok_release(t);
    return 0;
}
