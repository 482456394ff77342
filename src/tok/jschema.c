#include "tok/jschema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"

/* Shared rules every grammar ends with. */
static const char *COMMON =
    "sp ::= \" \"?\n"
    "jchar ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    /* A length-bounded string's character: no code point above U+FFFF, which JSON Schema
     * (and ajv, pydantic) count as one character but JavaScript (zod's .max) as two, so
     * both counts agree. */
    "jbchar ::= [^\"\\\\\\x7F\\x00-\\x1F\\U00010000-\\U0010FFFF] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "jint ::= \"-\"? jnat\n"
    "jnat ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "jfrac ::= (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "jnumber ::= jint jfrac\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" sp (jstring \":\" sp jvalue (\",\" sp jstring \":\" sp jvalue)*)? \"}\"\n"
    "jarray ::= \"[\" sp (jvalue (\",\" sp jvalue)*)? \"]\"\n"
    "jdigit2 ::= [0-9]{2}\n"
    /* A calendar date: each month its own days, and February 29 only in a leap year (a
     * multiple of 4 whose last two digits are not 00, or a multiple of 400). */
    "jdate ::= [0-9]{4} \"-\" jmonthday | jleapyear \"-02-29\"\n"
    "jmonthday ::= (\"0\" [13578] | \"1\" [02]) \"-\" (jday28 | \"29\" | \"3\" [01]) | "
    "(\"0\" [469] | \"11\") \"-\" (jday28 | \"29\" | \"30\") | \"02-\" jday28\n"
    "jday28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
    "jleapyear ::= [0-9]{2} ([02468] [48] | [2468] \"0\" | [13579] [26]) | ([02468] [048] | [13579] [26]) \"00\"\n"
    "jtime ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
    "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "jhex ::= [0-9a-f]\n"
    "juuid ::= jhex{8} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{12}\n";

const char *jschema_any_object_gbnf(void)
{
    static char text[4096];
    if (!text[0])
        snprintf(text, sizeof text, "root ::= jobject\n%s", COMMON);
    return text;
}

struct gen {
    const json_t *root;
    const char *pre; /* rule names start with it */
    struct strbuf out;     /* the rule being written */
    struct strbuf pending; /* rules finished */
    int n_rules, nodes;
    /* $refs resolved so far: their pointers and rule numbers. */
    const json_t *refs[256];
    int ref_rule[256];
    int n_refs;
    char *err;
    size_t errlen;
    int rc;
};

static int gfail(struct gen *g, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int gfail(struct gen *g, int code, const char *path, const char *fmt, ...)
{
    if (g->rc)
        return g->rc;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->rc = cairn_fail(g->err, g->errlen, code, "%s at %s", msg, path[0] ? path : "the schema's root");
    return g->rc;
}

static void put(struct gen *g, const char *s)
{
    if (!g->rc && strbuf_put(&g->out, s, strlen(s)))
        g->rc = cairn_fail(g->err, g->errlen, CAIRN_ENOMEM, "out of memory");
}

static void putf(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct gen *g, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put(g, buf);
}

/* A GBNF literal of the bytes of s. */
static void put_literal(struct gen *g, const char *s, size_t n)
{
    put(g, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            putf(g, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            putf(g, "\\x%02X", c);
        else {
            char b[2] = {(char)c, 0};
            put(g, b);
        }
    }
    put(g, "\"");
}

/* A literal of v as compact JSON. */
static void put_json_literal(struct gen *g, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) {
        if (!g->rc)
            g->rc = cairn_fail(g->err, g->errlen, CAIRN_ENOMEM, "out of memory");
        return;
    }
    put_literal(g, s, strlen(s));
    free(s);
}

static int node(struct gen *g, const json_t *s, const char *path, int depth);

/* Adds a finished rule's text. */
static void pend(struct gen *g, const char *s, size_t n)
{
    if (!g->rc && strbuf_put(&g->pending, s, n))
        g->rc = cairn_fail(g->err, g->errlen, CAIRN_ENOMEM, "out of memory");
}

static const char *ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict", NULL};

static bool known(const char *k, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    for (int i = 0; ANNOTATIONS[i]; i++)
        if (strcmp(k, ANNOTATIONS[i]) == 0)
            return true;
    return false;
}

static void sub_path(char *dst, size_t cap, const char *path, const char *a, const char *b)
{
    snprintf(dst, cap, "%s%s%s%s%s", path, path[0] ? "." : "", a, b ? "." : "", b ? b : "");
}

static int64_t get_count(struct gen *g, const json_t *s, const char *key, const char *path, int64_t dflt)
{
    const json_t *v = json_object_get(s, key);
    if (!v)
        return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        gfail(g, CAIRN_EFORMAT, path, "'%s' must be a non-negative integer", key);
        return dflt;
    }
    return json_integer_value(v);
}

/* The string rule body for s (minLength, maxLength, format). */
static void string_body(struct gen *g, const json_t *s, const char *path)
{
    const json_t *f = json_object_get(s, "format");
    if (f) {
        const char *fs = json_string_value(f);
        if (!fs)
            return (void)gfail(g, CAIRN_EFORMAT, path, "'format' must be a string");
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return (void)gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'minLength' with 'format'");
        if (strcmp(fs, "date") == 0)
            put(g, "\"\\\"\" jdate \"\\\"\"");
        else if (strcmp(fs, "time") == 0)
            put(g, "\"\\\"\" jtime \"\\\"\"");
        else if (strcmp(fs, "date-time") == 0)
            put(g, "\"\\\"\" jdate \"T\" jtime \"\\\"\"");
        else if (strcmp(fs, "uuid") == 0)
            put(g, "\"\\\"\" juuid \"\\\"\"");
        else
            gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'format' (\"%.40s\")", fs);
        return;
    }
    int64_t lo = get_count(g, s, "minLength", path, 0), hi = get_count(g, s, "maxLength", path, -1);
    if (hi >= 0 && hi < lo)
        return (void)gfail(g, CAIRN_EFORMAT, path, "maxLength below minLength");
    if (lo > 1000)
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'minLength' over 1000");
    bool has_max = hi >= 0;
    if (hi > 1000 || hi < 0) /* a longer bound is met by at most 1000 characters too */
        hi = 1000;
    if (lo == 0 && !has_max)
        put(g, "jstring");
    else
        putf(g, "\"\\\"\" jbchar{%lld,%lld} \"\\\"\"", (long long)lo, (long long)hi);
}

/* Largest magnitude of an integer bound: doubles hold it exactly, and it has 15 digits,
 * within jnat's 16. */
#define INT_BOUND 999999999999999LL

/* Digit strings x of n digits with a <= x <= b (a, b of n digits, a <= b). */
static void digits_range(struct gen *g, const char *a, const char *b, size_t n)
{
    if (n == 0)
        return;
    if (a[0] == b[0]) {
        putf(g, "\"%c\" ", a[0]);
        digits_range(g, a + 1, b + 1, n - 1);
        return;
    }
    char zeros[20], nines[20];
    memset(zeros, '0', n - 1);
    memset(nines, '9', n - 1);
    bool a_low = memcmp(a + 1, zeros, n - 1) == 0, b_high = memcmp(b + 1, nines, n - 1) == 0;
    char lo = a_low ? a[0] : (char)(a[0] + 1), hi = b_high ? b[0] : (char)(b[0] - 1);
    bool first = true;
    put(g, "(");
    if (!a_low) { /* a's first digit, then at least the rest of a */
        putf(g, "\"%c\" ", a[0]);
        digits_range(g, a + 1, nines, n - 1);
        first = false;
    }
    if (lo <= hi) { /* first digits strictly between: any rest */
        putf(g, "%s[%c-%c]", first ? "" : " | ", lo, hi);
        if (n > 1)
            putf(g, " [0-9]{%zu}", n - 1);
        first = false;
    }
    if (!b_high) { /* b's first digit, then at most the rest of b */
        putf(g, "%s\"%c\" ", first ? "" : " | ", b[0]);
        digits_range(g, zeros, b + 1, n - 1);
    }
    put(g, ")");
}

/* Decimal integers in [lo, hi], 0 <= lo <= hi <= INT_BOUND, as alternatives by length. */
static void nonneg_range(struct gen *g, int64_t lo, int64_t hi)
{
    int64_t p = 1;
    bool first = true;
    put(g, "(");
    for (int len = 1; len <= 15 && (len == 1 || p <= hi); len++, p *= 10) {
        int64_t a = lo > (len == 1 ? 0 : p) ? lo : (len == 1 ? 0 : p), b = hi < p * 10 - 1 ? hi : p * 10 - 1;
        if (a > b)
            continue;
        char as[24], bs[24]; /* room for any long long, so no build type warns of truncation */
        snprintf(as, sizeof as, "%0*lld", len, (long long)a);
        snprintf(bs, sizeof bs, "%0*lld", len, (long long)b);
        put(g, first ? "" : " | ");
        digits_range(g, as, bs, (size_t)len);
        first = false;
    }
    put(g, ")");
}

/* An integer bound of s (minimum, maximum, exclusive...) into *v, rounded inwards;
 * false when absent. */
static bool int_bound(struct gen *g, const json_t *s, const char *key, bool lower, const char *path, int64_t *v)
{
    const json_t *b = json_object_get(s, key);
    if (!b)
        return false;
    double d = json_number_value(b);
    if (!json_is_number(b) || !(d >= -(double)INT_BOUND && d <= (double)INT_BOUND)) {
        gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword '%s' (a number within +-%lld)", key,
              (long long)INT_BOUND);
        return false;
    }
    bool exclusive = strncmp(key, "exclusive", 9) == 0;
    double r = lower ? ceil(d) : floor(d);
    if (exclusive && r == d)
        r += lower ? 1 : -1;
    *v = (int64_t)r;
    return true;
}

/* The integer rule body for s with minimum / maximum (exclusive or not). */
static void integer_body(struct gen *g, const json_t *s, const char *path)
{
    int64_t lo = -INT_BOUND, hi = INT_BOUND, v;
    bool bounded = false;
    if (int_bound(g, s, "minimum", true, path, &v))
        lo = v > lo ? v : lo, bounded = true;
    if (int_bound(g, s, "exclusiveMinimum", true, path, &v))
        lo = v > lo ? v : lo, bounded = true;
    if (int_bound(g, s, "maximum", false, path, &v))
        hi = v < hi ? v : hi, bounded = true;
    if (int_bound(g, s, "exclusiveMaximum", false, path, &v))
        hi = v < hi ? v : hi, bounded = true;
    if (g->rc)
        return;
    if (!bounded) {
        put(g, "jint");
        return;
    }
    if (lo > hi)
        return (void)gfail(g, CAIRN_EFORMAT, path, "no integer is within minimum and maximum");
    if (lo == 0 && hi == INT_BOUND) {
        put(g, "jnat");
        return;
    }
    bool first = true;
    if (lo < 0) { /* -x for x in [max(1, -hi), -lo] */
        put(g, "\"-\" ");
        nonneg_range(g, hi < 0 ? -hi : 1, -lo);
        first = false;
    }
    if (hi >= 0) {
        put(g, first ? "" : " | ");
        nonneg_range(g, lo > 0 ? lo : 0, hi);
    }
}

/* The number rule body for s: integer (any bounds) or number; for a number, minimum 0
 * drops the sign and exclusiveMinimum 0 makes it positive. */
static void number_body(struct gen *g, const json_t *s, const char *path, bool integer)
{
    if (integer) {
        integer_body(g, s, path);
        return;
    }
    const json_t *mn = json_object_get(s, "minimum"), *ex = json_object_get(s, "exclusiveMinimum");
    if (mn && (!json_is_number(mn) || json_number_value(mn) != 0))
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path,
                           "unsupported JSON Schema keyword 'minimum' on a number (only 0 is; integers take any)");
    if (ex && (!json_is_number(ex) || json_number_value(ex) != 0))
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path,
                           "unsupported JSON Schema keyword 'exclusiveMinimum' on a number (only 0 is; integers take any)");
    if (json_object_get(s, "maximum") || json_object_get(s, "exclusiveMaximum"))
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path,
                           "unsupported JSON Schema keyword '%s' on a number (integers take it)",
                           json_object_get(s, "maximum") ? "maximum" : "exclusiveMaximum");
    if (ex)
        put(g, "([1-9] [0-9]{0,15} (\".\" [0-9]{1,16})? | \"0.\" [0-9]{0,15} [1-9])");
    else
        put(g, mn ? "jnat jfrac" : "jnumber");
}

/* The object rule body. */
static void object_body(struct gen *g, const json_t *s, const char *path, int depth)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return (void)gfail(g, CAIRN_EFORMAT, path, "'properties' must be an object");
    if (req && !json_is_array(req))
        return (void)gfail(g, CAIRN_EFORMAT, path, "'required' must be an array");
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return (void)gfail(g, CAIRN_EFORMAT, path, "'additionalProperties' must be a schema");
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0) {
        if (addl && json_is_object(addl)) {
            char p[512];
            sub_path(p, sizeof p, path, "additionalProperties", NULL);
            int r = node(g, addl, p, depth + 1);
            putf(g, "\"{\" sp (jstring \":\" sp %sr%d (\",\" sp jstring \":\" sp %sr%d)*)? \"}\"", g->pre, r, g->pre, r);
        } else if (addl && json_is_false(addl)) {
            put(g, "\"{\" sp \"}\"");
        } else {
            put(g, "jobject");
        }
        return;
    }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const char *k = json_string_value(json_array_get(req, i));
        if (!k || !json_object_get(props, k))
            return (void)gfail(g, CAIRN_EUNSUPPORTED, path,
                               "'required' names a property not in 'properties' (%.40s)", k ? k : "not a string");
    }
    /* Each property's rule: "key" ":" sp value. */
    int *kv = malloc(n * sizeof *kv);
    bool *is_req = calloc(n, sizeof *is_req);
    if (!kv || !is_req) {
        free(kv), free(is_req);
        if (!g->rc)
            g->rc = cairn_fail(g->err, g->errlen, CAIRN_ENOMEM, "out of memory");
        return;
    }
    const char *key;
    const json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)props, key, val)
    {
        char p[512];
        sub_path(p, sizeof p, path, "properties", key);
        int r = node(g, val, p, depth + 1);
        for (size_t j = 0; req && j < json_array_size(req); j++)
            is_req[i] |= strcmp(json_string_value(json_array_get(req, j)), key) == 0;
        kv[i] = g->n_rules++;
        struct strbuf keep = g->out;
        g->out = (struct strbuf){0};
        putf(g, "%sr%d ::= ", g->pre, kv[i]);
        json_t *ks = json_string(key);
        if (ks)
            put_json_literal(g, ks);
        json_decref(ks);
        putf(g, " \":\" sp %sr%d\n", g->pre, r);
        struct strbuf rule = g->out;
        g->out = keep;
        if (rule.p)
            pend(g, rule.p, rule.len);
        strbuf_free(&rule);
        i++;
    }
    int n_req = 0;
    for (i = 0; i < n; i++)
        n_req += is_req[i];
    put(g, "\"{\" sp ");
    if (n_req > 0) {
        bool first = true;
        for (i = 0; i < n; i++)
            if (is_req[i]) {
                putf(g, first ? "%sr%d " : "\",\" sp %sr%d ", g->pre, kv[i]);
                first = false;
            }
        for (i = 0; i < n; i++)
            if (!is_req[i])
                putf(g, "(\",\" sp %sr%d)? ", g->pre, kv[i]);
    } else {
        /* The first property present starts the list; each later one is optional. */
        put(g, "(");
        for (i = 0; i < n; i++) {
            putf(g, "%s%sr%d", i ? " | " : "", g->pre, kv[i]);
            for (size_t j = i + 1; j < n; j++)
                putf(g, " (\",\" sp %sr%d)?", g->pre, kv[j]);
        }
        put(g, ")? ");
    }
    put(g, "\"}\"");
    free(kv), free(is_req);
}

static void array_body(struct gen *g, const json_t *s, const char *path, int depth)
{
    const json_t *items = json_object_get(s, "items");
    int64_t lo = get_count(g, s, "minItems", path, 0), hi = get_count(g, s, "maxItems", path, -1);
    if (hi >= 0 && hi < lo)
        return (void)gfail(g, CAIRN_EFORMAT, path, "maxItems below minItems");
    if (lo > 100 || hi > 1000)
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'minItems'/'maxItems' over 100/1000");
    char p[512];
    sub_path(p, sizeof p, path, "items", NULL);
    int r = -1;
    if (items && !json_is_object(items) && !json_is_true(items))
        return (void)gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'items' (not one schema)");
    if (items)
        r = node(g, items, p, depth + 1);
    char item[96];
    if (r >= 0)
        snprintf(item, sizeof item, "%sr%d", g->pre, r);
    else
        snprintf(item, sizeof item, "jvalue");
    if (hi == 0)
        return (void)put(g, "\"[\" sp \"]\"");
    if (lo == 0) {
        putf(g, "\"[\" sp (%s (\",\" sp %s)", item, item);
        if (hi < 0)
            put(g, "*");
        else
            putf(g, "{0,%lld}", (long long)(hi - 1));
        put(g, ")? \"]\"");
    } else {
        putf(g, "\"[\" sp %s (\",\" sp %s)", item, item);
        if (hi < 0)
            putf(g, "{%lld,}", (long long)(lo - 1));
        else
            putf(g, "{%lld,%lld}", (long long)(lo - 1), (long long)(hi - 1));
        put(g, " \"]\"");
    }
}

/* The body for one type name. */
static void type_body(struct gen *g, const json_t *s, const char *t, const char *path, int depth)
{
    if (strcmp(t, "string") == 0)
        string_body(g, s, path);
    else if (strcmp(t, "integer") == 0)
        number_body(g, s, path, true);
    else if (strcmp(t, "number") == 0)
        number_body(g, s, path, false);
    else if (strcmp(t, "boolean") == 0)
        put(g, "(\"true\" | \"false\")");
    else if (strcmp(t, "null") == 0)
        put(g, "\"null\"");
    else if (strcmp(t, "object") == 0)
        object_body(g, s, path, depth);
    else if (strcmp(t, "array") == 0)
        array_body(g, s, path, depth);
    else
        gfail(g, CAIRN_EFORMAT, path, "unknown type '%.40s'", t);
}

/* Resolves a local $ref. */
static const json_t *resolve(struct gen *g, const char *ref, const char *path)
{
    const char *pre[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pre[i]);
        if (strncmp(ref, pre[i], n) == 0) {
            const json_t *defs = json_object_get(g->root, i == 0 ? "$defs" : "definitions");
            const json_t *d = defs ? json_object_get(defs, ref + n) : NULL;
            if (!d)
                gfail(g, CAIRN_EFORMAT, path, "$ref %.60s resolves to nothing", ref);
            return d;
        }
    }
    if (strcmp(ref, "#") == 0)
        return g->root;
    gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema $ref '%.60s' (only #, #/$defs/NAME, #/definitions/NAME)", ref);
    return NULL;
}

/* Writes the rule for schema s and returns its number. */
static int node(struct gen *g, const json_t *s, const char *path, int depth)
{
    if (g->rc)
        return 0;
    if (depth > JSCHEMA_MAX_DEPTH)
        return gfail(g, CAIRN_EUNSUPPORTED, path, "schema nested deeper than %d", JSCHEMA_MAX_DEPTH), 0;
    if (++g->nodes > JSCHEMA_MAX_NODES)
        return gfail(g, CAIRN_EUNSUPPORTED, path, "schema larger than %d nodes", JSCHEMA_MAX_NODES), 0;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        int r = g->n_rules++;
        struct strbuf keep = g->out;
        g->out = (struct strbuf){0};
        putf(g, "%sr%d ::= jvalue\n", g->pre, r);
        pend(g, g->out.p ? g->out.p : "", g->out.len);
        strbuf_free(&g->out);
        g->out = keep;
        return r;
    }
    if (!json_is_object(s))
        return gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported schema (not an object or true)"), 0;
    static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                        "items", "minItems", "maxItems", "anyOf", "allOf", "$ref", "minLength",
                                        "maxLength", "format", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
                                        "nullable", "oneOf", "discriminator", NULL};
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (!known(k, KNOWN))
            return gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword '%.40s'", k), 0;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return gfail(g, CAIRN_EFORMAT, path, "'$ref' must be a string"), 0;
        const json_t *d = resolve(g, json_string_value(ref), path);
        if (!d)
            return 0;
        for (int i = 0; i < g->n_refs; i++)
            if (g->refs[i] == d)
                return g->ref_rule[i];
        if (g->n_refs == 256)
            return gfail(g, CAIRN_EUNSUPPORTED, path, "more than 256 $refs"), 0;
        int r = g->n_rules++;
        g->refs[g->n_refs] = d;
        g->ref_rule[g->n_refs++] = r;
        /* Defined through an alias rule so that recursion finds the number first. */
        int t = node(g, d, json_string_value(ref), depth + 1);
        struct strbuf keep = g->out;
        g->out = (struct strbuf){0};
        putf(g, "%sr%d ::= %sr%d\n", g->pre, r, g->pre, t);
        pend(g, g->out.p ? g->out.p : "", g->out.len);
        strbuf_free(&g->out);
        g->out = keep;
        return r;
    }
    int r = g->n_rules++;
    struct strbuf keep = g->out;
    g->out = (struct strbuf){0};
    putf(g, "%sr%d ::= ", g->pre, r);
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"),
                 *any = json_object_get(s, "anyOf"), *all = json_object_get(s, "allOf"),
                 *one = json_object_get(s, "oneOf"),
                 *type = json_object_get(s, "type"), *nullable = json_object_get(s, "nullable");
    bool nul = json_is_true(nullable);
    if (nul)
        put(g, "\"null\" | ");
    if (cn) {
        put_json_literal(g, cn);
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0)
            gfail(g, CAIRN_EFORMAT, path, "'enum' must be a non-empty array");
        for (size_t i = 0; i < json_array_size(en); i++) {
            if (i)
                put(g, " | ");
            put_json_literal(g, json_array_get(en, i));
        }
    } else if (any || one) {
        /* oneOf is generated as anyOf: the branches clients send (tagged unions) do not
         * overlap, so an answer matches one of them. */
        const char *kw = any ? "anyOf" : "oneOf";
        if (any && one)
            gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'oneOf' beside 'anyOf'");
        if (!any)
            any = one;
        if (!json_is_array(any) || json_array_size(any) == 0)
            gfail(g, CAIRN_EFORMAT, path, "'%s' must be a non-empty array", kw);
        for (size_t i = 0; i < json_array_size(any) && !g->rc; i++) {
            char p[512], idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            sub_path(p, sizeof p, path, kw, idx);
            struct strbuf mine = g->out;
            g->out = (struct strbuf){0};
            int a = node(g, json_array_get(any, i), p, depth + 1);
            strbuf_free(&g->out);
            g->out = mine;
            putf(g, "%s%sr%d", i ? " | " : "", g->pre, a);
        }
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            gfail(g, CAIRN_EUNSUPPORTED, path, "unsupported JSON Schema keyword 'allOf' (more than one schema)");
        else {
            char p[512];
            sub_path(p, sizeof p, path, "allOf", "0");
            struct strbuf mine = g->out;
            g->out = (struct strbuf){0};
            int a = node(g, json_array_get(all, 0), p, depth + 1);
            strbuf_free(&g->out);
            g->out = mine;
            putf(g, "%sr%d", g->pre, a);
        }
    } else if (json_is_string(type)) {
        struct strbuf mine = g->out;
        g->out = (struct strbuf){0};
        type_body(g, s, json_string_value(type), path, depth);
        struct strbuf body = g->out;
        g->out = mine;
        if (body.p)
            put(g, body.p);
        strbuf_free(&body);
    } else if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type) && !g->rc; i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) {
                gfail(g, CAIRN_EFORMAT, path, "'type' entries must be strings");
                break;
            }
            struct strbuf mine = g->out;
            g->out = (struct strbuf){0};
            type_body(g, s, t, path, depth);
            struct strbuf body = g->out;
            g->out = mine;
            putf(g, "%s(", i ? " | " : "");
            if (body.p)
                put(g, body.p);
            put(g, ")");
            strbuf_free(&body);
        }
    } else if (type) {
        gfail(g, CAIRN_EFORMAT, path, "'type' must be a string or an array");
    } else if (json_object_get(s, "properties")) {
        struct strbuf mine = g->out;
        g->out = (struct strbuf){0};
        object_body(g, s, path, depth);
        struct strbuf body = g->out;
        g->out = mine;
        if (body.p)
            put(g, body.p);
        strbuf_free(&body);
    } else {
        put(g, "jvalue");
    }
    put(g, "\n");
    pend(g, g->out.p ? g->out.p : "", g->out.len);
    strbuf_free(&g->out);
    g->out = keep;
    return r;
}

/* Rules for schema (the top one named `top`), and with common the shared rules. */
static int generate(const json_t *schema, const char *top, const char *pre, bool common, char **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    struct gen g = {.root = schema, .pre = pre, .err = err, .errlen = errlen};
    int r = node(&g, schema, "", 0);
    if (!g.rc) {
        putf(&g, "%s ::= %sr%d\n", top, pre, r);
        if (common)
            put(&g, COMMON);
        if (g.pending.p)
            put(&g, g.pending.p);
    }
    strbuf_free(&g.pending);
    if (g.rc) {
        strbuf_free(&g.out);
        return g.rc;
    }
    *out = g.out.p;
    return 0;
}

int jschema_to_gbnf(const json_t *schema, char **out, char *err, size_t errlen)
{
    return generate(schema, "root", "", true, out, err, errlen);
}

int jschema_rules(const json_t *schema, const char *name, char **out, char *err, size_t errlen)
{
    char pre[80];
    snprintf(pre, sizeof pre, "%.60s-", name);
    return generate(schema, name, pre, false, out, err, errlen);
}

const char *jschema_common_gbnf(void) { return COMMON; }
