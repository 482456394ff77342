/* Stop strings and the reasoning splitter: hand cases, every split point of the input,
 * random inputs against a plain reference, bounds and bad arguments. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"
#include "tok/reasoning.h"
#include "tok/stopstr.h"
#include "tmpl/tmpl.h"

/* ---- stop strings ---- */

/* Output and match of one run: the text fed in the pieces cut at cuts[0..ncuts)
 * (ascending positions), then flushed. */
struct run {
    char *out;
    size_t len;
    int matched;
    int flush_rc;
};

static struct run stop_run(struct stopstr *s, const char *text, size_t len, const size_t *cuts, size_t ncuts)
{
    struct strbuf out = {0};
    size_t at = 0;
    int last = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        int rc = stopstr_feed(s, text + at, end - at, &out);
        CHECK(rc == 0 || rc == 1, "feed returned %d", rc);
        CHECK(!(last == 1 && rc != 1), "feed forgot the match (%d after 1)", rc);
        if (rc == 1)
            last = 1;
        at = end;
        CHECK(stopstr_held(s) < STOPSTR_MAX_LEN, "held %zu", stopstr_held(s));
    }
    struct run r;
    r.matched = stopstr_matched(s);
    r.flush_rc = stopstr_flush(s, &out);
    CHECK_EQ_INT(r.flush_rc, r.matched >= 0);
    CHECK_EQ_INT(stopstr_held(s), 0);
    r.out = out.p ? out.p : strdup("");
    r.len = out.len;
    stopstr_reset(s);
    return r;
}

/* What the filter must do, by brute force: the first end position where some stop
 * string ends, the longest one there. */
static void stop_ref(const char *const *stops, size_t n, const char *text, size_t len, size_t *out_len, int *matched)
{
    for (size_t e = 1; e <= len; e++) {
        int best = -1;
        size_t bl = 0;
        for (size_t k = 0; k < n; k++) {
            size_t l = strlen(stops[k]);
            if (l <= e && memcmp(text + e - l, stops[k], l) == 0 && l > bl) {
                best = (int)k;
                bl = l;
            }
        }
        if (best >= 0) {
            *out_len = e - bl;
            *matched = best;
            return;
        }
    }
    *out_len = len;
    *matched = -1;
}

/* One case: the expected output and match, checked for the whole text, every single
 * split point, every pair of split points (short texts) and byte by byte. */
static void stop_case(const char *const *stops, size_t n, const char *text, const char *want, int want_match)
{
    char err[256] = "";
    struct stopstr *s;
    int rc = stopstr_create(&s, stops, n, err, sizeof err);
    CHECK(rc == 0, "create: %s", err);
    if (rc)
        return;
    size_t len = strlen(text);
    size_t ref_len;
    int ref_match;
    stop_ref(stops, n, text, len, &ref_len, &ref_match);
    CHECK(ref_len == strlen(want) && memcmp(text, want, ref_len) == 0 && ref_match == want_match,
          "reference disagrees with the case for \"%s\"", text);

    struct run whole = stop_run(s, text, len, NULL, 0);
    CHECK(whole.len == strlen(want) && memcmp(whole.out, want, whole.len) == 0,
          "text \"%s\": output \"%s\", want \"%s\"", text, whole.out, want);
    CHECK(whole.matched == want_match, "text \"%s\": matched %d, want %d", text, whole.matched, want_match);
    for (size_t c = 0; c <= len; c++) {
        struct run r = stop_run(s, text, len, &c, 1);
        CHECK(r.len == whole.len && memcmp(r.out, whole.out, r.len) == 0 && r.matched == whole.matched,
              "text \"%s\" split at %zu: \"%s\" (%d), whole \"%s\" (%d)", text, c, r.out, r.matched, whole.out,
              whole.matched);
        free(r.out);
    }
    if (len <= 64) {
        for (size_t a = 0; a <= len; a++) {
            for (size_t b = a; b <= len; b++) {
                size_t cuts[2] = {a, b};
                struct run r = stop_run(s, text, len, cuts, 2);
                CHECK(r.len == whole.len && memcmp(r.out, whole.out, r.len) == 0 && r.matched == whole.matched,
                      "text \"%s\" split at %zu, %zu: \"%s\"", text, a, b, r.out);
                free(r.out);
            }
        }
    }
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (size_t c = 0; c < len; c++)
        cuts[c] = c + 1;
    struct run r = stop_run(s, text, len, cuts, len ? len - 1 : 0);
    CHECK(r.len == whole.len && memcmp(r.out, whole.out, r.len) == 0 && r.matched == whole.matched,
          "text \"%s\" byte by byte: \"%s\"", text, r.out);
    free(r.out);
    free(cuts);
    free(whole.out);
    stopstr_release(s);
}

static void test_stop_cases(void)
{
    const char *one[] = {"STOP"};
    stop_case(one, 1, "hello STOP world", "hello ", 0);
    stop_case(one, 1, "STOP at the start", "", 0);
    stop_case(one, 1, "at the end STOP", "at the end ", 0);
    stop_case(one, 1, "no stop here", "no stop here", -1);
    stop_case(one, 1, "ends in a partial STO", "ends in a partial STO", -1);
    stop_case(one, 1, "SSTSTOSTOP!", "SSTSTO", 0);
    stop_case(one, 1, "", "", -1);

    const char *overlap[] = {"ab", "b"};
    stop_case(overlap, 2, "xxab yy", "xx", 0);      /* both end at the b: the longer one */
    stop_case(overlap, 2, "xxb", "xx", 1);
    stop_case(overlap, 2, "aab", "a", 0);

    const char *prefix[] = {"abc", "ab"};
    stop_case(prefix, 2, "zabcd", "z", 1);          /* "ab" is complete first */
    const char *inner[] = {"abcd", "bc"};
    stop_case(inner, 2, "xabcd", "xa", 1);          /* first to end wins, as in streaming */
    stop_case(inner, 2, "xabd", "xabd", -1);

    const char *rep[] = {"aab"};
    stop_case(rep, 1, "aaaab", "aa", 0);            /* the KMP fall back over a repeat */
    const char *rep2[] = {"abab", "abac"};
    stop_case(rep2, 2, "abaabac", "aba", 1);

    const char *uni[] = {"世界", "\xf0\x9f\x99\x82"};
    stop_case(uni, 2, "你好世界! more", "你好", 0);
    stop_case(uni, 2, "smile \xf0\x9f\x99\x82 now", "smile ", 1);
    stop_case(uni, 2, "世世 no match 界", "世世 no match 界", -1);

    const char *nl[] = {"\n\n", "</s>"};
    stop_case(nl, 2, "line one\nline two\n\nnext", "line one\nline two", 0);
    stop_case(nl, 2, "a</b</s", "a</b</s", -1);

    stop_case(NULL, 0, "no stops at all", "no stops at all", -1);
}

/* Valid UTF-8 check for the output pieces (strict enough for the texts below). */
static bool utf8_ok(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = p[i] < 0x80 ? 0 : (p[i] & 0xe0) == 0xc0 ? 1 : (p[i] & 0xf0) == 0xe0 ? 2 : (p[i] & 0xf8) == 0xf0 ? 3 : 9;
        if (k == 9 || i + k >= n + (k ? 0 : 1))
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
        }
        i += k + 1;
    }
    return true;
}

/* Fed whole characters, every output piece is whole characters too. */
static void test_stop_utf8_pieces(void)
{
    const char *stops[] = {"日本語です", "über", "ü!"};
    const char *text = "Grüße aus 日本 und über日本語 ü ü日本語で日本語です";
    struct stopstr *s;
    char err[128];
    CHECK(stopstr_create(&s, stops, 3, err, sizeof err) == 0, "%s", err);
    struct strbuf piece = {0}, all = {0};
    size_t n = strlen(text);
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        while (i + k < n && ((unsigned char)text[i + k] & 0xc0) == 0x80)
            k++;
        strbuf_clear(&piece);
        int rc = stopstr_feed(s, text + i, k, &piece);
        CHECK(rc >= 0, "feed %d", rc);
        CHECK(utf8_ok((const unsigned char *)piece.p, piece.len), "piece at %zu splits a character", i);
        strbuf_put(&all, piece.p, piece.len);
        i += k;
    }
    CHECK_EQ_INT(stopstr_matched(s), 1);
    const char *want = "Grüße aus 日本 und ";
    CHECK(all.len == strlen(want) && memcmp(all.p, want, all.len) == 0, "got \"%s\"", all.p);
    strbuf_free(&piece);
    strbuf_free(&all);
    stopstr_release(s);
}

/* Random texts over a small alphabet, random stops, random pieces: the filter agrees
 * with the brute-force reference. */
static void test_stop_random(void)
{
    uint64_t rng = 0x5eed;
    char err[128];
    for (int iter = 0; iter < 3000; iter++) {
        char sbuf[4][8];
        const char *stops[4];
        size_t n = test_rand_u64(&rng) % 4 + 1;
        for (size_t k = 0; k < n; k++) {
            size_t l = test_rand_u64(&rng) % 5 + 1;
            for (size_t i = 0; i < l; i++)
                sbuf[k][i] = (char)('a' + test_rand_u64(&rng) % 3);
            sbuf[k][l] = '\0';
            stops[k] = sbuf[k];
        }
        char text[64];
        size_t len = test_rand_u64(&rng) % 60;
        for (size_t i = 0; i < len; i++)
            text[i] = (char)('a' + test_rand_u64(&rng) % 3);
        size_t cuts[8], ncuts = test_rand_u64(&rng) % 8;
        for (size_t k = 0; k < ncuts; k++)
            cuts[k] = len ? test_rand_u64(&rng) % (len + 1) : 0;
        for (size_t a = 0; a < ncuts; a++) {  /* sort the cuts */
            for (size_t b = a + 1; b < ncuts; b++) {
                if (cuts[b] < cuts[a]) {
                    size_t t = cuts[a];
                    cuts[a] = cuts[b];
                    cuts[b] = t;
                }
            }
        }
        struct stopstr *s;
        CHECK(stopstr_create(&s, stops, n, err, sizeof err) == 0, "%s", err);
        size_t ref_len;
        int ref_match;
        stop_ref(stops, n, text, len, &ref_len, &ref_match);
        struct run r = stop_run(s, text, len, cuts, ncuts);
        CHECK(r.len == ref_len && memcmp(r.out, text, ref_len) == 0 && r.matched == ref_match,
              "iteration %d: %zu bytes, match %d; reference %zu bytes, match %d", iter, r.len, r.matched, ref_len,
              ref_match);
        free(r.out);
        stopstr_release(s);
    }
}

/* Held text never passes the longest stop minus one, and a long output with a near
 * miss at every position runs in linear time. */
static void test_stop_bounds(void)
{
    static char longstop[STOPSTR_MAX_LEN + 1];
    memset(longstop, 'a', STOPSTR_MAX_LEN - 1);
    longstop[STOPSTR_MAX_LEN - 1] = 'b';
    const char *stops[] = {longstop, "xyz"};
    struct stopstr *s;
    char err[128];
    CHECK(stopstr_create(&s, stops, 2, err, sizeof err) == 0, "%s", err);
    size_t n = 4 << 20;
    char *text = malloc(n);
    memset(text, 'a', n);
    struct strbuf out = {0};
    size_t fed = 0;
    for (size_t at = 0; at < n; at += 4093) {
        size_t k = n - at < 4093 ? n - at : 4093;
        CHECK_EQ_INT(stopstr_feed(s, text + at, k, &out), 0);
        fed += k;
        CHECK(out.len + stopstr_held(s) == fed, "out %zu + held %zu != fed %zu", out.len, stopstr_held(s), fed);
    }
    CHECK_EQ_INT(stopstr_held(s), STOPSTR_MAX_LEN - 1);
    CHECK_EQ_INT(stopstr_feed(s, "b tail", 6, &out), 1);
    CHECK_EQ_INT(out.len, n - (STOPSTR_MAX_LEN - 1));
    CHECK_EQ_INT(stopstr_matched(s), 0);
    CHECK_EQ_INT(stopstr_feed(s, "more", 4, &out), 1);  /* after a match nothing more comes out */
    CHECK_EQ_INT(out.len, n - (STOPSTR_MAX_LEN - 1));
    CHECK_EQ_INT(stopstr_flush(s, &out), 1);
    CHECK_EQ_INT(stopstr_matched(s), 0);
    stopstr_reset(s);
    CHECK_EQ_INT(stopstr_matched(s), -1);
    strbuf_clear(&out);
    CHECK_EQ_INT(stopstr_feed(s, "wxy", 3, &out), 0);
    CHECK(out.len == 1 && out.p[0] == 'w', "after reset: \"%s\"", out.p);
    CHECK_EQ_INT(stopstr_held(s), 2);
    free(text);
    strbuf_free(&out);
    stopstr_release(s);
}

static void test_stop_errors(void)
{
    char err[256];
    struct stopstr *s = (struct stopstr *)&err;
    const char *empty[] = {"ok", ""};
    err[0] = '\0';
    CHECK_EQ_INT(stopstr_create(&s, empty, 2, err, sizeof err), CAIRN_EINVAL);
    CHECK(s == NULL && strstr(err, "stop string 1 is empty"), "message: %s", err);
    const char *many[STOPSTR_MAX + 1];
    for (size_t k = 0; k <= STOPSTR_MAX; k++)
        many[k] = "x";
    CHECK_EQ_INT(stopstr_create(&s, many, STOPSTR_MAX + 1, err, sizeof err), CAIRN_EINVAL);
    CHECK(strstr(err, "at most") != NULL, "message: %s", err);
    CHECK_EQ_INT(stopstr_create(&s, many, STOPSTR_MAX, err, sizeof err), 0);
    stopstr_release(s);
    static char toolong[STOPSTR_MAX_LEN + 2];
    memset(toolong, 'q', STOPSTR_MAX_LEN + 1);
    const char *tl[] = {toolong};
    CHECK_EQ_INT(stopstr_create(&s, tl, 1, err, sizeof err), CAIRN_EINVAL);
    CHECK(strstr(err, "1025 bytes") != NULL, "message: %s", err);
    toolong[STOPSTR_MAX_LEN] = '\0';
    CHECK_EQ_INT(stopstr_create(&s, tl, 1, err, sizeof err), 0);
    stopstr_release(s);
    const char *bad[] = {"a\xff", "\xc3", "\xed\xa0\x80", "\xc0\xaf"};
    for (size_t k = 0; k < 4; k++) {
        CHECK_EQ_INT(stopstr_create(&s, bad + k, 1, err, sizeof err), CAIRN_EINVAL);
        CHECK(strstr(err, "UTF-8") != NULL, "message: %s", err);
    }
    const char *null[] = {NULL};
    CHECK_EQ_INT(stopstr_create(&s, null, 1, err, sizeof err), CAIRN_EINVAL);
    stopstr_release(NULL);
}

static void test_strbuf(void)
{
    struct strbuf b = {0};
    CHECK_EQ_INT(strbuf_put(&b, NULL, 0), 0);
    CHECK(b.p && b.p[0] == '\0' && b.len == 0, "empty put");
    for (int i = 0; i < 1000; i++)
        CHECK_EQ_INT(strbuf_put(&b, "0123456789", 10), 0);
    CHECK_EQ_INT(b.len, 10000);
    CHECK(b.p[10000] == '\0' && b.p[9999] == '9', "contents");
    CHECK_EQ_INT(strbuf_reserve(&b, SIZE_MAX), CAIRN_ERANGE);
    CHECK_EQ_INT(b.len, 10000);
    strbuf_clear(&b);
    CHECK(b.len == 0 && b.p[0] == '\0', "clear");
    strbuf_free(&b);
    CHECK(b.p == NULL && b.cap == 0, "free");
    strbuf_free(&b);
}

/* ---- reasoning ---- */

struct split {
    char *reasoning, *content;
};

static struct split reason_run(struct reasoning *r, const char *text, size_t len, const size_t *cuts, size_t ncuts)
{
    struct strbuf rb = {0}, cb = {0};
    size_t at = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        CHECK_EQ_INT(reasoning_feed(r, text + at, end - at, &rb, &cb), 0);
        at = end;
    }
    CHECK_EQ_INT(reasoning_flush(r, &rb, &cb), 0);
    struct split s = {rb.p ? rb.p : strdup(""), cb.p ? cb.p : strdup("")};
    return s;
}

static void reason_case(const struct reasoning_opts *o, const char *text, const char *want_r, const char *want_c)
{
    struct reasoning *r;
    char err[128];
    int rc = reasoning_create(&r, o, err, sizeof err);
    CHECK(rc == 0, "create: %s", err);
    if (rc)
        return;
    size_t len = strlen(text);
    struct split w = reason_run(r, text, len, NULL, 0);
    CHECK(strcmp(w.reasoning, want_r) == 0 && strcmp(w.content, want_c) == 0,
          "text \"%s\": reasoning \"%s\" content \"%s\", want \"%s\" \"%s\"", text, w.reasoning, w.content, want_r,
          want_c);
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b++) {
            size_t cuts[2] = {a, b};
            struct split s = reason_run(r, text, len, cuts, 2);
            CHECK(strcmp(s.reasoning, want_r) == 0 && strcmp(s.content, want_c) == 0,
                  "text \"%s\" split at %zu, %zu: reasoning \"%s\" content \"%s\"", text, a, b, s.reasoning,
                  s.content);
            free(s.reasoning);
            free(s.content);
        }
    }
    free(w.reasoning);
    free(w.content);
    reasoning_release(r);
}

static void test_reasoning_cases(void)
{
    reason_case(NULL, "<think>Let me see.</think>\n\nThe answer is 4.", "Let me see.", "The answer is 4.");
    reason_case(NULL, "\n <think>x</think>y", "x", "y");
    reason_case(NULL, "No thinking here. <think> is just text", "", "No thinking here. <think> is just text");
    reason_case(NULL, "<think>only reasoning, cut off </thi", "only reasoning, cut off </thi", "");
    reason_case(NULL, "<think>", "", "");
    reason_case(NULL, "<thinking>about it", "", "<thinking>about it");
    reason_case(NULL, "  <thin", "", "  <thin");
    reason_case(NULL, "   ", "", "   ");
    reason_case(NULL, "<think>a</thin>b<</think>c", "a</thin>b<", "c");
    reason_case(NULL, "<think>a</think>b</think> <think>", "a", "b</think> <think>");
    reason_case(NULL, "<think>a</think> \n\t ", "a", "");
    reason_case(NULL, "<think>\nstep 1\n</think>\nok\n", "\nstep 1\n", "ok\n");
    reason_case(NULL, "<<think>x", "", "<<think>x");

    struct reasoning_opts in = {NULL, NULL, true};
    reason_case(&in, "still thinking</think>  Hello", "still thinking", "Hello");
    reason_case(&in, "never closed <think>", "never closed <think>", "");
    reason_case(&in, "</think>x", "", "x");
    reason_case(&in, "", "", "");

    struct reasoning_opts mistral = {"[THINK]", "[/THINK]", false};
    reason_case(&mistral, "[THINK]hmm [/THIN [/THINK]\nDone", "hmm [/THIN ", "Done");
    reason_case(&mistral, "<think>x</think>", "", "<think>x</think>");

    /* Whitespace before the open tag is held only up to REASONING_MAX_LEAD bytes. */
    char text[REASONING_MAX_LEAD + 32];
    memset(text, ' ', REASONING_MAX_LEAD);
    strcpy(text + REASONING_MAX_LEAD, "<think>x</think>y");
    reason_case(NULL, text, "x", "y");
    memmove(text + 1, text, strlen(text) + 1);
    reason_case(NULL, text, "", text);
}

/* Random texts built from tag pieces: any split gives the whole-text result, and
 * reasoning + content + dropped bytes account for the input. */
static void test_reasoning_random(void)
{
    static const char *const parts[] = {"<think>", "</think>", "<", "</", "</thi", "<thi", "a", " ", "\n", "é", "k>"};
    uint64_t rng = 42;
    struct reasoning *r;
    char err[128];
    for (int iter = 0; iter < 2000; iter++) {
        struct reasoning_opts o = {NULL, NULL, test_rand_u64(&rng) % 2 == 0};
        CHECK(reasoning_create(&r, &o, err, sizeof err) == 0, "%s", err);
        char text[256] = "";
        size_t np = test_rand_u64(&rng) % 12;
        for (size_t k = 0; k < np; k++)
            strcat(text, parts[test_rand_u64(&rng) % (sizeof parts / sizeof parts[0])]);
        size_t len = strlen(text);
        struct split w = reason_run(r, text, len, NULL, 0);
        CHECK(strlen(w.reasoning) + strlen(w.content) <= len, "more out than in");
        size_t cuts[6], nc = test_rand_u64(&rng) % 6;
        size_t at = 0;
        for (size_t k = 0; k < nc; k++) {
            at += len - at ? test_rand_u64(&rng) % (len - at + 1) : 0;
            cuts[k] = at;
        }
        struct split s = reason_run(r, text, len, cuts, nc);
        CHECK(strcmp(s.reasoning, w.reasoning) == 0 && strcmp(s.content, w.content) == 0,
              "iteration %d \"%s\": split gives \"%s\" / \"%s\", whole \"%s\" / \"%s\"", iter, text, s.reasoning,
              s.content, w.reasoning, w.content);
        free(s.reasoning);
        free(s.content);
        free(w.reasoning);
        free(w.content);
        reasoning_release(r);
    }
}

static void test_reasoning_state(void)
{
    struct reasoning *r;
    char err[128];
    CHECK_EQ_INT(reasoning_create(&r, NULL, err, sizeof err), 0);
    struct strbuf rb = {0}, cb = {0};
    CHECK(!reasoning_active(r), "active before the tag");
    CHECK_EQ_INT(reasoning_feed(r, "<think>abc</th", 14, &rb, &cb), 0);
    CHECK(reasoning_active(r), "inactive inside");
    CHECK(rb.len == 3 && memcmp(rb.p, "abc", 3) == 0 && cb.len == 0, "streamed \"%s\"", rb.p);
    CHECK_EQ_INT(reasoning_feed(r, "ink>", 4, &rb, &cb), 0);
    CHECK(!reasoning_active(r), "active after the close tag");
    CHECK_EQ_INT(reasoning_feed(r, "\n\nHi", 4, &rb, &cb), 0);
    CHECK(cb.len == 2 && memcmp(cb.p, "Hi", 2) == 0, "content \"%s\"", cb.p);
    CHECK_EQ_INT(reasoning_flush(r, &rb, &cb), 0);
    /* After a flush the splitter starts over. */
    CHECK_EQ_INT(reasoning_feed(r, "<think>again", 12, &rb, &cb), 0);
    CHECK(rb.len == 8 && memcmp(rb.p, "abcagain", 8) == 0, "restart \"%s\"", rb.p);
    strbuf_free(&rb);
    strbuf_free(&cb);
    reasoning_release(r);

    struct reasoning_opts bad[] = {{"", NULL, false}, {NULL, " </x>", false}, {"<a>", NULL, false}};
    CHECK_EQ_INT(reasoning_create(&r, &bad[0], err, sizeof err), CAIRN_EINVAL);
    CHECK(r == NULL && strstr(err, "empty"), "message: %s", err);
    CHECK_EQ_INT(reasoning_create(&r, &bad[1], err, sizeof err), CAIRN_EINVAL);
    CHECK(strstr(err, "whitespace") != NULL, "message: %s", err);
    char longtag[REASONING_MAX_TAG + 2];
    memset(longtag, 't', sizeof longtag - 1);
    longtag[sizeof longtag - 1] = '\0';
    bad[2].close = longtag;
    CHECK_EQ_INT(reasoning_create(&r, &bad[2], err, sizeof err), CAIRN_EINVAL);
    CHECK(strstr(err, "at most") != NULL, "message: %s", err);
    reasoning_release(NULL);
}

static char *read_template(const char *name, size_t *len)
{
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", name);
    FILE *f = fopen(test_data_path(rel), "rb");
    CHECK(f != NULL, "cannot open %s", rel);
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    *len = fread(p, 1, (size_t)n, f);
    p[*len] = '\0';
    fclose(f);
    return p;
}

static void test_reasoning_detect(void)
{
    static const struct {
        const char *file;
        bool uses, opens;
        const char *open;
    } cases[] = {
        {"Qwen-Qwen3-0.6B.jinja", true, false, "<think>"},           /* the model opens it */
        {"Qwen-QwQ-32B.jinja", true, true, "<think>"},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", true, true, "<think>"},
        {"llama-cpp-deepseek-r1.jinja", true, true, "<think>"},
        {"deepseek-ai-DeepSeek-V3.1.jinja", true, true, "<think>"},
        {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", true, false, "[THINK]"},
        {"ByteDance-Seed-OSS.jinja", true, false, "<seed:think>"},
        {"google-gemma-2-2b-it.jinja", false, false, "<think>"},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", false, false, "<think>"},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", false, false, "<think>"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len;
        char *src = read_template(cases[k].file, &len);
        if (!src)
            continue;
        struct reasoning_info info;
        reasoning_detect(src, len, &info);
        CHECK(info.uses_tags == cases[k].uses && info.opens_in_prompt == cases[k].opens &&
                  strcmp(info.open, cases[k].open) == 0,
              "%s: uses %d opens %d open %s", cases[k].file, info.uses_tags, info.opens_in_prompt, info.open);
        free(src);
    }
    struct reasoning_info info;
    reasoning_detect("", 0, &info);
    CHECK(!info.uses_tags && strcmp(info.close, "</think>") == 0, "empty template");

    const char *open1 = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *after = "<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n";
    CHECK(reasoning_prompt_open(open1, strlen(open1), NULL, NULL), "open prompt");
    CHECK(!reasoning_prompt_open(closed, strlen(closed), NULL, NULL), "closed prompt");
    CHECK(!reasoning_prompt_open(after, strlen(after), NULL, NULL), "tag in the user's text");
    CHECK(!reasoning_prompt_open("", 0, NULL, NULL), "empty prompt");
    CHECK(reasoning_prompt_open("[INST]x[/INST][THINK]", 21, "[THINK]", "[/THINK]"), "custom tags");
}

/* The rendered prompt says for sure whether the generation prompt opened the tag,
 * also where the source heuristic cannot see it (tags held in variables). */
static void test_reasoning_rendered(void)
{
    static const struct {
        const char *file;
        const char *vars;
        bool open;
    } cases[] = {
        {"Qwen-QwQ-32B.jinja", "{\"enable_thinking\": true}", true},
        {"Qwen-QwQ-32B.jinja", "{\"enable_thinking\": false}", false},
        {"Qwen-Qwen3-0.6B.jinja", "{}", false},
        {"Qwen-Qwen3-0.6B.jinja", "{\"enable_thinking\": false}", false},
        {"deepseek-ai-DeepSeek-V4.jinja", "{\"thinking\": true}", true},
        {"deepseek-ai-DeepSeek-V4.jinja", "{\"thinking\": false}", false},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "{\"enable_thinking\": true}", true},
        {"google-gemma-2-2b-it.jinja", "{}", false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len;
        char *src = read_template(cases[k].file, &len);
        if (!src)
            continue;
        struct tmpl *t;
        char err[256];
        int rc = tmpl_parse(&t, src, len, err, sizeof err);
        CHECK(rc == 0, "%s: %s", cases[k].file, err);
        json_t *vars = json_loads(cases[k].vars, 0, NULL);
        json_object_set_new(vars, "add_generation_prompt", json_true());
        json_object_set_new(vars, "bos_token", json_string("<s>"));
        json_object_set_new(vars, "eos_token", json_string("</s>"));
        json_object_set_new(vars, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", "Hi"));
        char *out = NULL;
        size_t n = 0;
        if (!rc) {
            rc = tmpl_render(t, vars, &out, &n, err, sizeof err);
            CHECK(rc == 0, "%s: %s", cases[k].file, err);
        }
        struct reasoning_info info;
        reasoning_detect(src, len, &info);
        if (!rc)
            CHECK(reasoning_prompt_open(out, n, info.open, info.close) == cases[k].open, "%s %s: prompt ends \"%s\"",
                  cases[k].file, cases[k].vars, n > 40 ? out + n - 40 : out);
        free(out);
        json_decref(vars);
        tmpl_free(t);
        free(src);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_strbuf);
    RUN(test_stop_cases);
    RUN(test_stop_utf8_pieces);
    RUN(test_stop_random);
    RUN(test_stop_bounds);
    RUN(test_stop_errors);
    RUN(test_reasoning_cases);
    RUN(test_reasoning_random);
    RUN(test_reasoning_state);
    RUN(test_reasoning_detect);
    RUN(test_reasoning_rendered);
    return test_main_end();
}
