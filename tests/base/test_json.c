/* base/json: required members (json_get_*) and optional ones (json_opt_*), each
 * refusal compared word for word with what callers and clients are shown. */
#include "base/err.h"
#include "base/json.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    CHECK(j != NULL, "cannot parse %s: %s", text, je.text);
    return j;
}

static const char *color(int i)
{
    static const char *const names[] = {"red", "green", "blue"};
    return i >= 0 && i < 3 ? names[i] : "?";
}

#define CHECK_ERR(rc, err, want) \
    CHECK((rc) == CAIRN_EFORMAT && !strcmp((err), (want)), "rc %d, \"%s\", want \"%s\"", (rc), (err), (want))

static void test_required(void)
{
    json_t *j = parse("{\"n\": 7, \"r\": 1.5, \"s\": \"ab\", \"b\": true, \"c\": \"green\", \"t\": null,"
                      " \"ctl\": \"a\\u0001\", \"o\": {}}");
    if (!j)
        return;
    char err[256] = "", name[8];
    int64_t n = 0;
    bool b = false;
    int c = -1;
    char *text = (char *)"untouched";
    json_t *o = NULL;

    CHECK(json_get_int(j, "x", "n", 0, 10, &n, err, sizeof err) == 0 && n == 7, "n = %lld: %s", (long long)n, err);
    CHECK_ERR(json_get_int(j, "x", "n", 8, 10, &n, err, sizeof err), err, "x.n: 7 is outside [8, 10]");
    CHECK_ERR(json_get_int(j, "x", "r", 0, 10, &n, err, sizeof err), err, "x.r: must be an integer");
    CHECK_ERR(json_get_int(j, "x", "gone", 0, 10, &n, err, sizeof err), err, "x.gone: missing");
    CHECK(json_get_bool(j, "x", "b", &b, err, sizeof err) == 0 && b, "b: %s", err);
    CHECK_ERR(json_get_bool(j, "x", "n", &b, err, sizeof err), err, "x.n: must be a boolean");
    CHECK(json_get_enum(j, "x", "c", color, 3, &c, err, sizeof err) == 0 && c == 1, "c = %d: %s", c, err);
    CHECK_ERR(json_get_enum(j, "x", "s", color, 3, &c, err, sizeof err), err,
              "x.s: \"ab\" is not one of red, green, blue");
    CHECK(json_get_name(j, "x", "s", 7, name, err, sizeof err) == 0 && !strcmp(name, "ab"), "name %s: %s", name, err);
    CHECK_ERR(json_get_name(j, "x", "s", 1, name, err, sizeof err), err, "x.s: 2 bytes, more than 1");
    CHECK_ERR(json_get_name(j, "x", "ctl", 7, name, err, sizeof err), err, "x.ctl: control byte 0x01 at offset 1");
    CHECK_ERR(json_get_name(j, "x", "n", 7, name, err, sizeof err), err, "x.n: must be a string");
    CHECK(json_get_text(j, "x", "t", 16, &text, err, sizeof err) == 0 && text == NULL, "null text: %s", err);
    CHECK(json_get_text(j, "x", "s", 16, &text, err, sizeof err) == 0 && text && !strcmp(text, "ab"), "text: %s", err);
    free(text);
    CHECK_ERR(json_get_text(j, "x", "n", 16, &text, err, sizeof err), err, "x.n: must be a string or null");
    CHECK(json_get_member(j, "x", "o", JSON_OBJECT, &o, err, sizeof err) == 0 && json_is_object(o), "o: %s", err);
    CHECK_ERR(json_get_member(j, "x", "s", JSON_ARRAY, &o, err, sizeof err), err, "x.s: must be an array");
    static const char *const keys[] = {"n", "r", "s", "b", "c", "t", "ctl", NULL};
    CHECK_ERR(json_get_keys(j, "x", keys, err, sizeof err), err, "x: unknown field \"o\"");
    CHECK_ERR(json_get_keys(o = json_array(), "x", keys, err, sizeof err), err, "x: must be an object");
    json_decref(o);
    json_decref(j);
}

static void test_optional(void)
{
    json_t *j = parse("{\"n\": 100.0, \"f\": 0.5, \"s\": \"hi\", \"b\": false, \"z\": null, \"x\": 1.5}");
    if (!j)
        return;
    struct json_err e = {{0}, {0}};
    int64_t n = -1;
    double d = -1;
    bool b = true, given = true;
    const char *s = NULL;

    CHECK(json_opt_int(j, NULL, "n", 0, 1000, &n, &given, &e) == 0 && n == 100 && given, "n = %lld", (long long)n);
    CHECK(json_opt_int(j, NULL, "z", 0, 1000, &n, &given, &e) == 0 && n == 100 && !given, "null z given or set");
    CHECK(json_opt_int(j, NULL, "gone", 0, 1000, &n, &given, &e) == 0 && !given, "missing member given");
    CHECK_ERR(json_opt_int(j, NULL, "x", 0, 10, &n, &given, &e), e.message, "x: expected an integer in [0, 10]");
    CHECK(!strcmp(e.path, "x"), "path %s", e.path);
    CHECK_ERR(json_opt_int(j, "options", "n", 0, 10, &n, NULL, &e), e.message,
              "options.n: expected an integer in [0, 10]");
    CHECK(!strcmp(e.path, "options.n"), "path %s", e.path);
    CHECK(json_opt_number(j, "", "f", 0, 1, true, &d, &given, &e) == 0 && d == 0.5, "f = %g", d);
    CHECK_ERR(json_opt_number(j, "", "f", 0.5, 1, true, &d, &given, &e), e.message, "f: expected a number in (0.5, 1]");
    CHECK_ERR(json_opt_number(j, "", "s", 0, 2, false, &d, &given, &e), e.message, "s: expected a number in [0, 2]");
    CHECK(json_opt_bool(j, NULL, "b", &b, &given, &e) == 0 && !b && given, "b");
    CHECK_ERR(json_opt_bool(j, NULL, "s", &b, &given, &e), e.message, "s: expected true or false");
    CHECK(json_opt_string(j, NULL, "s", &s, &e) == 0 && s && !strcmp(s, "hi"), "s");
    CHECK(json_opt_string(j, NULL, "z", &s, &e) == 0 && s == NULL, "null string not NULL");
    CHECK_ERR(json_opt_string(j, NULL, "b", &s, &e), e.message, "b: expected a string");
    CHECK_ERR(json_fail(&e, NULL, "about no field"), e.message, "about no field");
    CHECK(e.path[0] == 0, "path %s", e.path);
    json_decref(j);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_required);
    RUN(test_optional);
    return test_main_end();
}
