/* Grammars: GBNF parsing and its refusals, whole-string matching, and token masks
 * checked against brute force (each token's bytes fed one by one) over a real
 * vocabulary, with and without a budget. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gguf/gguf.h"
#include "testutil.h"
#include "tok/grammar.h"
#include "tok/tok.h"

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws ::= [ \\t\\n]{0,2}\n";

static struct grammar *parse(const char *text)
{
    struct grammar *g = NULL;
    char err[256] = "";
    int rc = grammar_parse(&g, text, strlen(text), "root", err, sizeof err);
    CHECK(rc == 0, "parse %s: %s", text, err);
    return g;
}

static void test_refusals(void)
{
    static const char *bad[] = {
        "root ::= foo\n",                 /* undefined */
        "root ::= root \"a\" | \"b\"\n",   /* left recursion */
        "root ::= a\na ::= b? root\nb ::= \"x\"\n", /* left recursion through a nullable */
        "root ::= \"a\n",                 /* unterminated */
        "root ::= [a-\n",
        "root ::= \"a\"{5,2}\n",
        "root ::= \"a\"{99999}\n",
        "root ::= (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((\"a\")))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))\n",
        "root ::= \"a\" \"\\q\"\n",
        "root ::= x\nx ::= \"a\" x\n",   /* never ends */
        "root ::= \"a\"\nroot ::= \"b\"\n", /* twice */
        "root ::= [z-a]\n",
        "root ::= *\n",
        "nope\n",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct grammar *g = NULL;
        char err[256] = "";
        int rc = grammar_parse(&g, bad[i], strlen(bad[i]), "root", err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && g == NULL && err[0], "refused %zu: rc %d err '%s'", i, rc, err);
    }
}

static void test_matches(void)
{
    struct {
        const char *g, *yes[6], *no[6];
    } cases[] = {
        {"root ::= \"a\" [b-d]* \"e\"\n", {"ae", "abe", "adbce"}, {"", "a", "abf", "aee"}},
        {"root ::= x{2,3}\nx ::= \"ab\" | \"c\"\n", {"abc", "cc", "ababab"}, {"c", "abababab", "a"}},
        {"root ::= [^a]\n", {"b", "\xc3\xa9", "\xf0\x9f\x98\x80", "\xe2\x82\xac"}, {"a", "\xc3", "\xed\xa0\x80", "bb"}},
        {"root ::= \"\\u00e9\" . \"x\"\n", {"\xc3\xa9zx", "\xc3\xa9\xc3\xa9x"}, {"ex", "\xc3\xa9x"}},
        {"root ::= (\"a\" |\n  \"b\")+ # comment\n", {"a", "abba"}, {"", "c"}},
        {"root ::= \"x\"?\n", {"", "x"}, {"xx"}},
        /* As llama.cpp's guide writes them: comments and newlines inside parentheses, an
         * empty first alternative, classes with escapes, dashed names, {m,n}. */
        {"# moves\nroot ::= (\n    # first\n    \"1. \" move \" \" move \"\\n\"\n\n"
         "    ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n)\n"
         "move ::= (pawn | nonpawn | castle) [+#]?\npawn ::= [a-h] [1-8]\n"
         "nonpawn ::= [NBKQR] [a-h] [1-8]\ncastle ::= \"O-O\" \"-O\"?\n",
         {"1. e4 e5\n2. Nf3 Nc6\n", "1. O-O-O+ a1\n10. Qa1# b2\n"}, {"1. e4 e5\n", "1. e4 e5\n2. Nf9 a1\n"}},
        {"char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
         "item ::= \"{\" space item-name-kv \",\" space item-age-kv \"}\" space\n"
         "item-age ::= ([0-9] | ([1-8] [0-9] | [9] [0-9]) | \"1\" ([0-4] [0-9] | [5] \"0\")) space\n"
         "item-age-kv ::= \"\\\"age\\\"\" space \":\" space item-age\n"
         "item-name ::= \"\\\"\" char{1,100} \"\\\"\" space\n"
         "item-name-kv ::= \"\\\"name\\\"\" space \":\" space item-name\n"
         "root ::= \"[\" space item (\",\" space item){1,99} \"]\" space\n"
         "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
         {"[{\"name\": \"Al\", \"age\": 34},{\"name\":\"B\\n\",\"age\":150}]"},
         {"[{\"name\": \"Al\", \"age\": 151},{\"name\":\"B\",\"age\":1}]", "[{\"name\":\"\",\"age\":1}]"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = parse(cases[i].g);
        if (!g)
            continue;
        for (int j = 0; j < 6 && cases[i].yes[j]; j++)
            CHECK(grammar_matches(g, cases[i].yes[j], strlen(cases[i].yes[j])), "%zu: '%s' should match", i,
                  cases[i].yes[j]);
        for (int j = 0; j < 6 && cases[i].no[j]; j++)
            CHECK(!grammar_matches(g, cases[i].no[j], strlen(cases[i].no[j])), "%zu: '%s' should not match", i,
                  cases[i].no[j]);
        grammar_release(g);
    }
    struct grammar *g = parse(JSON_GBNF);
    if (g) {
        const char *yes[] = {"{}", "{\"a\": [1, -2.5e3, \"x\\n\", true, null, {}]}", "{\"\xc3\xa9\":\"\\u00e9\"}"};
        const char *no[] = {"{", "[]", "{\"a\" 1}", "{\"a\":01}", "{\"a\":\"\x01\"}", "{\"a\":tru}"};
        for (size_t j = 0; j < 3; j++)
            CHECK(grammar_matches(g, yes[j], strlen(yes[j])), "json: '%s' should match", yes[j]);
        for (size_t j = 0; j < 6; j++)
            CHECK(!grammar_matches(g, no[j], strlen(no[j])), "json: '%s' should not match", no[j]);
        grammar_release(g);
    }
}

static struct tok *load_vocab(void)
{
    char err[256];
    struct gguf_file *f = NULL;
    if (gguf_open(&f, test_data_path("vocab/ggml-vocab-llama-bpe.gguf"), err, sizeof err))
        return NULL;
    struct tok *t = NULL;
    tok_load(&t, f, err, sizeof err);
    gguf_close(f);
    return t;
}

/* Walks `steps` random allowed tokens; at each step the mask must equal brute force.
 * With budget > 0, every step passes the tokens left, and the output must be complete
 * within it. */
static void check_masks(struct tok *t, const char *text, int steps, int64_t budget, uint64_t seed)
{
    struct grammar *g = parse(text);
    if (!g)
        return;
    struct grammar_ctx *c = NULL;
    int rc = grammar_ctx_from_tok(&c, g, t);
    CHECK(rc == 0, "ctx: %d", rc);
    struct grammar_match *m = NULL;
    if (!rc)
        rc = grammar_match_create(&m, c);
    CHECK(rc == 0, "match: %d", rc);
    int32_t n = tok_n_vocab(t);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    char *out = malloc(1 << 16);
    size_t out_len = 0;
    int bad = 0;
    int64_t used = 0;
    for (int s = 0; s < steps && !rc && !grammar_match_done(m) && (budget <= 0 || used < budget); s++) {
        const uint32_t *mask;
        int64_t left = budget > 0 ? budget - used : -1;
        rc = grammar_match_mask(m, left, &mask);
        CHECK(rc == 0, "mask: %d", rc);
        if (rc)
            break;
        int na = 0;
        for (int32_t i = 0; i < n; i++) {
            bool bit = mask[i >> 5] >> (i & 31) & 1;
            struct grammar_match *k = NULL;
            grammar_match_clone(&k, m);
            bool ok = grammar_match_accept(k, i) == 0;
            if (ok && budget > 0)
                ok = grammar_match_min_left(k) <= left - 1;
            grammar_match_release(k);
            if (bit != ok && bad++ < 5)
                CHECK(bit == ok, "step %d token %d: mask %d, brute force %d", s, i, bit, ok);
            if (bit)
                allowed[na++] = i;
        }
        CHECK(na > 0, "step %d: nothing allowed", s);
        if (na == 0)
            break;
        int32_t pick = allowed[test_rand_u64(&seed) % (uint64_t)na];
        rc = grammar_match_accept(m, pick);
        CHECK(rc == 0, "accept %d: %d", pick, rc);
        size_t l = 0;
        if (tok_token_text(t, pick, 0, out + out_len, (1 << 16) - out_len - 1, &l) == 0)
            out_len += l;
        used++;
        if (tok_is_eog(t, pick))
            break;
    }
    if (budget > 0) {
        CHECK(grammar_match_accepting(m), "budget %lld: output not complete: %.*s", (long long)budget, (int)out_len,
              out);
        CHECK(grammar_matches(g, out, out_len), "budget %lld: not matching: %.*s", (long long)budget, (int)out_len,
              out);
    }
    CHECK(bad == 0, "%d mask bits differ from brute force", bad);
    int64_t walks, hits;
    grammar_ctx_stats(c, &walks, &hits);
    CHECK(walks > 0, "walks %lld", (long long)walks);
    free(allowed);
    free(out);
    grammar_match_release(m);
    grammar_ctx_release(c);
    grammar_release(g);
}

static void test_masks_brute_force(struct tok *t)
{
    check_masks(t, JSON_GBNF, 12, -1, 1);
    check_masks(t, JSON_GBNF, 12, -1, 2);
    check_masks(t, "root ::= \"ab\" [0-9]+ (\" \" | \"xyz\")* \"!\"\n", 8, -1, 3);
    check_masks(t, "root ::= [^\"]* \"\\\"\"\n", 6, -1, 4);
    /* Bounded repetitions longer than any token: masks are looked up by the state with
     * its chain position clamped; they must still equal brute force, near the bound too. */
    check_masks(t, "root ::= \"\\\"\" [a-z \\u00e9]{0,400} \"\\\"\" [0-9]{3,500} \"!\"\n", 10, -1, 5);
    check_masks(t, "root ::= ([a-z]{1,3} \",\"){2,300} \".\"\n", 10, -1, 6);
    check_masks(t, "root ::= [a-c]{0,140} \"x\"\n", 40, 60, 7);
}

static void test_budget(struct tok *t)
{
    for (uint64_t seed = 10; seed < 14; seed++)
        check_masks(t, JSON_GBNF, 1000, 12 + (int64_t)seed, seed);
    /* Tight budgets: the cached mask less the tokens over the limit, and below the
     * state's own shortest ending only the tokens that bring it nearer. */
    check_masks(t, JSON_GBNF, 1000, 3, 20);
    check_masks(t, JSON_GBNF, 1000, 6, 21);
    check_masks(t, "root ::= \"{\\\"k\\\": \\\"\" [a-z ]* \"\\\", \\\"n\\\": [\" [0-9]+ \"]}\"\n", 1000, 21, 22);
}

/* A budget below what any token can meet (the fewest bytes overestimate the tokens a
 * real vocabulary needs) still allows the tokens that bring the end nearer, so sampling
 * goes on and the output may be cut, never refused: 3 tokens for a 40-byte literal. */
static void test_budget_unreachable(struct tok *t)
{
    struct grammar *g = parse("root ::= \"{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": {}}\"\n");
    struct grammar_ctx *c = NULL;
    struct grammar_match *m = NULL;
    CHECK(g && grammar_ctx_from_tok(&c, g, t) == 0 && grammar_match_create(&m, c) == 0, "setup");
    if (!m)
        goto out;
    CHECK(grammar_match_min_left(m) > 3, "min_left %lld", (long long)grammar_match_min_left(m));
    const uint32_t *mask;
    int32_t n = tok_n_vocab(t), allowed = 0, bad = 0;
    CHECK(grammar_match_mask(m, 3, &mask) == 0, "mask");
    int64_t before = grammar_match_min_left(m);
    for (int32_t i = 0; i < n; i++)
        if (mask[i >> 5] >> (i & 31) & 1) {
            struct grammar_match *k = NULL;
            grammar_match_clone(&k, m);
            allowed++;
            bad += !(grammar_match_accept(k, i) == 0 && grammar_match_min_left(k) < before);
            grammar_match_release(k);
        }
    CHECK(allowed > 0 && bad == 0, "%d allowed, %d of them not nearer the end", allowed, bad);
out:
    grammar_match_release(m);
    grammar_ctx_release(c);
    grammar_release(g);
}

/* Stacks beyond the limits are an error of the match, not a crash: a deeply nested
 * grammar fed deeply nested input. */
static void test_limits(struct tok *t)
{
    struct grammar *g = parse("root ::= \"[\" root? \"]\"\n");
    if (!g)
        return;
    struct grammar_ctx *c = NULL;
    struct grammar_match *m = NULL;
    CHECK(grammar_ctx_from_tok(&c, g, t) == 0 && grammar_match_create(&m, c) == 0, "setup");
    int rc = 0, i;
    for (i = 0; i < 4 * GRAMMAR_MAX_DEPTH && rc == 0; i++)
        rc = grammar_match_accept_bytes(m, "[", 1);
    CHECK(rc == CAIRN_EFORMAT, "deep nesting: rc %d after %d", rc, i);
    const uint32_t *mask;
    CHECK(grammar_match_mask(m, -1, &mask) == 0, "mask at the limit");
    grammar_match_release(m);
    grammar_ctx_release(c);
    grammar_release(g);
    /* Empty alternatives doubling the paths at every reference: 2^40 paths to the start
     * state and to every state after a "y". Each distinct stack is expanded once per
     * byte, so the grammar works, and within a budget it ends complete (the fuzzer found
     * a state whose shortest ending was cut by the expansion limit). */
    char text[512] = "root ::= ";
    for (int i = 0; i < 40; i++)
        strcat(text, "e ");
    strcat(text, "\"x\"\ne ::= \"\" | \"\" | \"y\"\n");
    g = parse(text);
    c = NULL;
    m = NULL;
    CHECK(g && grammar_ctx_from_tok(&c, g, t) == 0, "ambiguous: ctx");
    CHECK(c && grammar_match_create(&m, c) == 0, "ambiguous: the start state is made");
    CHECK(g && grammar_matches(g, "x", 1) && grammar_matches(g, "yyyx", 4), "ambiguous: x and yyyx match");
    CHECK(g && !grammar_matches(g, "xy", 2), "ambiguous: xy does not");
    for (int i = 0; m && i < 3; i++)
        CHECK(grammar_match_accept_bytes(m, "y", 1) == 0, "ambiguous: y %d", i);
    CHECK(m && grammar_match_min_left(m) == 1, "ambiguous: one byte left after yyy");
    const uint32_t *am = NULL;
    CHECK(m && grammar_match_mask(m, 1, &am) == 0, "ambiguous: budget mask");
    int32_t allowed = 0, not_x = 0;
    for (int32_t i = 0; am && i < tok_n_vocab(t); i++)
        if (am[i >> 5] >> (i & 31) & 1) {
            char xt[8];
            size_t xl = 0;
            allowed++;
            bool yx = tok_token_text(t, i, 0, xt, sizeof xt, &xl) == 0 && xl >= 1 && xt[xl - 1] == 'x';
            for (size_t k = 0; yx && k + 1 < xl; k++)
                yx = xt[k] == 'y';
            not_x += !yx;
        }
    CHECK(allowed >= 1 && not_x == 0, "ambiguous: a budget of 1 allows only y*x tokens (%d allowed, %d others)", allowed,
          not_x);
    grammar_match_release(m);
    grammar_ctx_release(c);
    grammar_release(g);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_refusals);
    RUN(test_matches);
    struct tok *t = test_listing() ? NULL : load_vocab();
    if (!test_listing() && !t)
        return test_skip("no vocabulary");
    RUN(test_masks_brute_force, t);
    RUN(test_budget, t);
    RUN(test_budget_unreachable, t);
    RUN(test_limits, t);
    tok_release(t);
    return test_main_end();
}
