/* JSON Schema to GBNF: each schema's grammar parses, matches instances that validate and
 * refuses ones that do not; unsupported keywords are refused naming the keyword. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/err.h"
#include "testutil.h"
#include "tok/grammar.h"
#include "tok/jschema.h"

static struct grammar *compile(const char *schema_text)
{
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    CHECK(s != NULL, "schema parses: %s", je.text);
    if (!s)
        return NULL;
    char *gbnf = NULL, err[256] = "";
    int rc = jschema_to_gbnf(s, &gbnf, err, sizeof err);
    json_decref(s);
    CHECK(rc == 0, "%s: %s", schema_text, err);
    if (rc)
        return NULL;
    struct grammar *g = NULL;
    rc = grammar_parse(&g, gbnf, strlen(gbnf), "root", err, sizeof err);
    CHECK(rc == 0, "%s: grammar: %s\n%s", schema_text, err, gbnf);
    free(gbnf);
    return g;
}

static void test_instances(void)
{
    struct {
        const char *schema, *yes[5], *no[5];
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
         "\"required\":[\"a\"],\"additionalProperties\":false}",
         {"{\"a\":1}", "{\"a\": -5,\"b\":\"x\"}", "{ \"a\":0, \"b\": \"\"}"},
         {"{}", "{\"b\":\"x\"}", "{\"a\":1.5}", "{\"a\":01}", "{\"a\":1,\"c\":2}"}},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"},\"y\":{\"type\":\"null\"}}}",
         {"{}", "{\"x\":true}", "{\"y\":null}", "{\"x\":false,\"y\":null}"},
         {"{,}", "{\"y\":null,\"x\":true,}", "{\"x\":1}"}},
        {"{\"enum\":[\"red\",1,null,{\"k\":[1]}]}", {"\"red\"", "1", "null", "{\"k\":[1]}"}, {"\"blue\"", "2"}},
        {"{\"const\":\"fixed\"}", {"\"fixed\""}, {"\"other\""}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":3}",
         {"[1]", "[1, 2.5,-3e2]"}, {"[]", "[1,2,3,4]", "[\"a\"]"}},
        {"{\"type\":[\"string\",\"null\"],\"maxLength\":3}", {"\"abc\"", "null", "\"\""}, {"\"abcd\"", "1"}},
        /* A bounded string takes no character above U+FFFF (one for JSON Schema, two for
         * JavaScript's length); an unbounded one does. */
        {"{\"type\":\"string\",\"maxLength\":3}", {"\"\xc3\xa9t\xe6\x9c\x9f\"", "\"\\ud835\""},
         {"\"\xf0\x9d\x96\x97\"", "\"ab\xf0\x9f\x98\x80\""}},
        {"{\"type\":\"string\"}", {"\"\xf0\x9d\x96\x97\"", "\"ab\xf0\x9f\x98\x80\""}, {"1"}},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"z\":{\"type\":\"string\","
         "\"format\":\"date\"}},\"required\":[\"z\"]}]}",
         {"7", "{\"z\":\"2024-02-29\"}"}, {"{\"z\":\"2024-13-01\"}", "\"7\""}},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0},"
         "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"]}},"
         "\"$ref\":\"#/$defs/node\"}",
         {"{\"v\":1,\"kids\":[]}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]}]}"}, {"{\"v\":-1,\"kids\":[]}"}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{}", "{\"q\":1,\"r\":2}"},
         {"{\"q\":\"1\"}"}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123\""}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", {"1", "0.5", "12.25"}, {"0", "-1", "0.0"}},
        {"true", {"1", "{\"a\":[null]}", "\"s\""}, {"tru"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = compile(cases[i].schema);
        if (!g)
            continue;
        for (int j = 0; j < 5 && cases[i].yes[j]; j++)
            CHECK(grammar_matches(g, cases[i].yes[j], strlen(cases[i].yes[j])), "%zu: %s should match", i,
                  cases[i].yes[j]);
        for (int j = 0; j < 5 && cases[i].no[j]; j++)
            CHECK(!grammar_matches(g, cases[i].no[j], strlen(cases[i].no[j])), "%zu: %s should not match", i,
                  cases[i].no[j]);
        grammar_release(g);
    }
    struct grammar *g = NULL;
    const char *any = jschema_any_object_gbnf();
    char err[256];
    CHECK(grammar_parse(&g, any, strlen(any), "root", err, sizeof err) == 0, "any object: %s", err);
    CHECK(g && grammar_matches(g, "{\"a\":[1,{}]}", 12), "any object matches");
    CHECK(g && !grammar_matches(g, "[1]", 3), "any object refuses an array");
    grammar_release(g);
}

/* format "date" against the calendar: every day string of years whose leap rules differ
 * (4, 100, 400), from month 00 to 13 and day 00 to 32, matches exactly when it is a date. */
static void test_dates(void)
{
    struct grammar *g = compile("{\"type\":\"string\",\"format\":\"date\"}");
    if (!g)
        return;
    static const int years[] = {0, 4, 100, 1018, 1600, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9996, 9999};
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int matched = 0;
    for (size_t i = 0; i < sizeof years / sizeof years[0]; i++) {
        int y = years[i];
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                bool valid = m >= 1 && m <= 12 && d >= 1 && d <= mdays[m - 1] + (m == 2 && leap);
                char s[32];
                snprintf(s, sizeof s, "\"%04d-%02d-%02d\"", y, m, d);
                bool got = grammar_matches(g, s, strlen(s));
                CHECK(got == valid, "%s: grammar says %d, the calendar %d", s, got, valid);
                matched += got;
            }
    }
    CHECK(matched == 6 * 365 + 8 * 366, "%d dates matched", matched);
    grammar_release(g);
}

static void test_refusals(void)
{
    struct {
        const char *schema, *word;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"maximum\":5}}}", "'maximum' on a number (integers take it) at properties.n"},
        {"{\"not\":{\"type\":\"integer\"}}", "'not'"},
        {"{\"oneOf\":[{\"type\":\"integer\"}],\"anyOf\":[{\"type\":\"null\"}]}", "'oneOf'"},
        {"{\"not\":{}}", "'not'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "'format'"},
        {"{\"$ref\":\"http://x/y\"}", "$ref"},
        {"{\"$ref\":\"#/$defs/missing\"}", "resolves to nothing"},
        {"{\"type\":\"array\",\"items\":[{}]}", "'items'"},
        {"{\"type\":\"number\",\"minimum\":3}", "'minimum'"},
        {"{\"type\":\"number\",\"maximum\":3}", "'maximum'"},
        {"{\"type\":\"string\",\"minLength\":1001}", "'minLength'"},
        {"{\"type\":\"integer\",\"minimum\":1e16}", "'minimum'"},
        {"7", "not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *s = json_loads(cases[i].schema, JSON_DECODE_ANY, NULL);
        char *gbnf = NULL, err[256] = "";
        int rc = jschema_to_gbnf(s, &gbnf, err, sizeof err);
        CHECK(rc != 0 && !gbnf && strstr(err, cases[i].word), "%s: rc %d, err '%s' should name %s", cases[i].schema,
              rc, err, cases[i].word);
        free(gbnf);
        json_decref(s);
    }
    /* Deep nesting is refused, never a crash. */
    char deep[8192] = "";
    for (int i = 0; i < 200; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 200; i++)
        strcat(deep, "}");
    json_t *s = json_loads(deep, 0, NULL);
    char *gbnf = NULL, err[256] = "";
    CHECK(s && jschema_to_gbnf(s, &gbnf, err, sizeof err) == CAIRN_EUNSUPPORTED && strstr(err, "deeper"), "deep: %s",
          err);
    free(gbnf);
    json_decref(s);
}

/* Integer bounds against arithmetic: every integer of a window around the range, and
 * spellings JSON does not allow (leading zeros, -0, +). */
static void test_integer_ranges(void)
{
    static const long long ranges[][2] = {
        {1, 10}, {0, 0}, {-5, 5}, {-273, 1250}, {7, 7}, {10, 99}, {100, 1000}, {-1000, -100}, {19, 2001},
        {0, 999999}, {123, 123456}, {-99999, -1}, {-1, 0}, {5, 1000000}, {-1000000, 3},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        long long lo = ranges[i][0], hi = ranges[i][1];
        char schema[160];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        struct grammar *g = compile(schema);
        if (!g)
            continue;
        long long span = hi - lo < 3000 ? hi - lo : 3000;
        for (long long x = lo - 1100; x <= lo + span + 1100; x++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            bool want = x >= lo && x <= hi, got = grammar_matches(g, t, strlen(t));
            if (got != want && bad++ < 5)
                CHECK(got == want, "%s: %s matches %d", schema, t, got);
        }
        for (long long x = hi - 1100; x <= hi + 1100; x++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            bool want = x >= lo && x <= hi, got = grammar_matches(g, t, strlen(t));
            if (got != want && bad++ < 5)
                CHECK(got == want, "%s: %s matches %d", schema, t, got);
        }
        CHECK(!grammar_matches(g, "-0", 2) && !grammar_matches(g, "+1", 2) && !grammar_matches(g, "007", 3),
              "%s: odd spellings", schema);
        grammar_release(g);
    }
    CHECK(bad == 0, "%d integers misjudged", bad);
    /* exclusive bounds, one-sided bounds, fractional bounds rounded inwards */
    struct grammar *g = compile("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":4.5}");
    CHECK(g && grammar_matches(g, "-2", 2) && grammar_matches(g, "4", 1) && !grammar_matches(g, "-3", 2) &&
              !grammar_matches(g, "5", 1),
          "exclusive");
    grammar_release(g);
    g = compile("{\"type\":\"integer\",\"minimum\":42}");
    CHECK(g && grammar_matches(g, "42", 2) && grammar_matches(g, "123456789012345", 15) && !grammar_matches(g, "41", 2),
          "minimum only");
    grammar_release(g);
    g = compile("{\"type\":\"integer\",\"maximum\":-7}");
    CHECK(g && grammar_matches(g, "-7", 2) && grammar_matches(g, "-123456789", 10) && !grammar_matches(g, "-6", 2) &&
              !grammar_matches(g, "0", 1),
          "maximum only");
    grammar_release(g);
    /* maxLength over 1000 is met by at most 1000 characters; minLength over 1000 is refused */
    g = compile("{\"type\":\"string\",\"maxLength\":50000}");
    char long_s[1004];
    memset(long_s, 'a', sizeof long_s);
    long_s[0] = '"';
    long_s[1001] = '"';
    CHECK(g && grammar_matches(g, long_s, 1002) && grammar_matches(g, "\"\"", 2) &&
              !grammar_matches(g, "\"\xf0\x9f\x98\x80\"", 6),
          "maxLength 50000");
    grammar_release(g);
    g = compile("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}");
    CHECK(g && grammar_matches(g, "12", 2) && grammar_matches(g, "\"ab\"", 4) && !grammar_matches(g, "true", 4),
          "oneOf");
    grammar_release(g);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_instances);
    RUN(test_dates);
    RUN(test_refusals);
    RUN(test_integer_ranges);
    return test_main_end();
}
