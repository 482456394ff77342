/* libFuzzer harness of constrained decoding's parsers and matcher (tok/grammar.c,
 * tok/jschema.c). Input: a mode byte, then text.
 *   mode even: GBNF text. Parsing stops within its limits; a grammar that compiles is
 *     run over a small vocabulary (every byte, and pieces cut from the input): at each
 *     step the mask must equal brute force (each token fed byte by byte to a copy of
 *     the matcher), every allowed token is accepted, and with a budget the walk ends in
 *     a complete output unless a state on the way hit the automaton's limits (a token
 *     whose advance exceeds them is refused, so the shortest ending may be cut off).
 *   mode odd: a JSON Schema. Converting it either fails with a message or gives GBNF
 *     that compiles (a schema cairn accepts never makes a grammar it refuses).
 * Built and run by run.sh. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tok/grammar.h"
#include "tok/jschema.h"

enum { EXTRA = 64, MAXTOK = 6 };

static void run_vocab(const struct grammar *g, const uint8_t *data, size_t size)
{
    /* 256 single bytes, EXTRA pieces of the input, one end-of-generation token. */
    int32_t n = 256 + EXTRA + 1;
    char pieces[256 + EXTRA][MAXTOK];
    const char *bytes[256 + EXTRA + 1];
    size_t lens[256 + EXTRA + 1];
    uint8_t eog[256 + EXTRA + 1] = {0};
    for (int i = 0; i < 256; i++) {
        pieces[i][0] = (char)i;
        bytes[i] = pieces[i];
        lens[i] = 1;
    }
    for (int i = 0; i < EXTRA; i++) {
        size_t at = size ? (size_t)i * 7 % size : 0, l = 2 + (size_t)i % (MAXTOK - 1);
        if (at + l > size)
            l = size > at ? size - at : 0;
        memcpy(pieces[256 + i], data + at, l);
        bytes[256 + i] = pieces[256 + i];
        lens[256 + i] = l;
    }
    bytes[n - 1] = NULL;
    lens[n - 1] = 0;
    eog[n - 1] = 1;
    struct grammar_ctx *c = NULL;
    struct grammar_match *m = NULL;
    if (grammar_ctx_create(&c, g, n, bytes, lens, eog) || grammar_match_create(&m, c)) {
        grammar_ctx_release(c);
        return;
    }
    /* With every byte a token, a budget of at least the shortest completion always
     * ends complete. */
    int64_t budget = grammar_match_min_left(m) < 40 ? 48 : -1;
    bool must_end = budget >= 0;
    for (int step = 0; step < 48 && !grammar_match_done(m); step++) {
        const uint32_t *mask;
        int64_t left = budget < 0 ? -1 : budget - step;
        if (grammar_match_mask(m, left, &mask)) {
            must_end = false; /* the automaton's limits: an error, not a wrong answer */
            break;
        }
        int32_t pick = -1, seen = 0, want = data[(size_t)step % size] % 8, n_ok = 0;
        uint8_t ok[256 + EXTRA + 1], grammar_ok[256 + EXTRA + 1];
        for (int32_t t = 0; t < n; t++) {
            struct grammar_match *k = NULL;
            if (grammar_match_clone(&k, m))
                abort();
            int arc = grammar_match_accept(k, t);
            if (arc == CAIRN_EFORMAT)
                must_end = false; /* past the limits: the guarantee holds within them */
            grammar_ok[t] = arc == 0;
            ok[t] = arc == 0 && (budget < 0 || grammar_match_min_left(k) <= left - 1);
            n_ok += ok[t];
            grammar_match_release(k);
        }
        for (int32_t t = 0; t < n; t++) {
            bool bit = mask[t >> 5] >> (t & 31) & 1;
            /* Where no token keeps the ending within the budget, the mask falls back to
             * tokens the grammar allows (the output may be cut, never refused). */
            if (n_ok ? bit != ok[t] : bit && !grammar_ok[t])
                abort(); /* the mask differs from brute force */
            if (bit && (pick < 0 || seen == want))
                pick = t;
            seen += bit;
        }
        if (pick < 0) {
            if (must_end)
                abort(); /* the budget left nothing to finish with */
            break;
        }
        if (grammar_match_accept(m, pick))
            abort();
        if (pick == n - 1)
            break;
    }
    if (must_end && !grammar_match_accepting(m))
        abort();
    grammar_match_release(m);
    grammar_ctx_release(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char err[256];
    if (mode % 2 == 0) {
        struct grammar *g = NULL;
        if (grammar_parse(&g, text, len, "root", err, sizeof err) == 0) {
            (void)grammar_matches(g, text, len);
            run_vocab(g, data, size);
            grammar_release(g);
        }
        return 0;
    }
    json_t *s = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    if (!s)
        return 0;
    char *gbnf = NULL;
    if (jschema_to_gbnf(s, &gbnf, err, sizeof err) == 0) {
        struct grammar *g = NULL;
        if (grammar_parse(&g, gbnf, strlen(gbnf), "root", err, sizeof err) != 0)
            abort(); /* an accepted schema must compile */
        grammar_release(g);
        free(gbnf);
    }
    json_decref(s);
    return 0;
}
