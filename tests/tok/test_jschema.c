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

static void test_refusals(void)
{
    struct {
        const char *schema, *word;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"maximum\":5}}}", "'maximum' at properties.n"},
        {"{\"oneOf\":[{\"type\":\"integer\"}]}", "'oneOf'"},
        {"{\"not\":{}}", "'not'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "'format'"},
        {"{\"$ref\":\"http://x/y\"}", "$ref"},
        {"{\"$ref\":\"#/$defs/missing\"}", "resolves to nothing"},
        {"{\"type\":\"array\",\"items\":[{}]}", "'items'"},
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum'"},
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

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_instances);
    RUN(test_refusals);
    return test_main_end();
}
