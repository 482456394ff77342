/* Chat-template interpreter against jinja2 as Hugging Face sets it up:
 *  - unit cases (tmpl_cases/unit.json, outputs rendered by render_ref.py's environment);
 *  - conformance: every template of ../shared/testdata/templates over the conversations of
 *    tmpl_cases/conversations.json, rendered at test time by python3 through
 *    render_ref.render() (one python process for all pairs) and by cairn, byte for byte;
 *    where the reference raises, cairn must fail too;
 *  - error codes, limits, malformed and mutated templates (no crash, no hang);
 *  - CAIRN_BENCH=1: time to render a 50-message conversation with Qwen2.5's template. */
#define _GNU_SOURCE
#include "testutil.h"

#include "base/clock.h"
#include "base/err.h"
#include "tmpl/tmpl.h"

#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CASES CAIRN_SOURCE_DIR "/tests/tmpl/tmpl_cases"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

/* Parses and renders; returns the first error code (parse or render). */
static int render(const char *src, size_t len, const json_t *vars, const struct tmpl_limits *lim, char **out,
                  size_t *out_len, char *err, size_t errlen)
{
    struct tmpl *t;
    *out = NULL;
    int rc = tmpl_parse(&t, src, len, err, errlen);
    if (rc)
        return rc;
    rc = tmpl_render_limits(t, vars, lim, out, out_len, err, errlen);
    tmpl_free(t);
    return rc;
}

static int render_s(const char *src, const char *vars_json, char **out, char *err, size_t errlen)
{
    json_t *v = vars_json ? json_loads(vars_json, 0, NULL) : NULL;
    size_t n;
    int rc = render(src, strlen(src), v, NULL, out, &n, err, errlen);
    json_decref(v);
    return rc;
}

static void show_diff(const char *what, const char *want, size_t wn, const char *got, size_t gn)
{
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu\n    want: \"", what, i);
    for (size_t k = from; k < wn && k < i + 60; k++)
        fprintf(stderr, want[k] == '\n' ? "\\n" : "%c", want[k]);
    fprintf(stderr, "\"\n    got:  \"");
    for (size_t k = from; k < gn && k < i + 60; k++)
        fprintf(stderr, got[k] == '\n' ? "\\n" : "%c", got[k]);
    fprintf(stderr, "\"\n");
}

static void test_unit_cases(void)
{
    json_error_t je;
    json_t *doc = json_load_file(CASES "/unit.json", 0, &je);
    CHECK(doc != NULL, "unit.json: %s", je.text);
    if (!doc)
        return;
    json_t *vars = json_object_get(doc, "vars"), *cases = json_object_get(doc, "cases");
    size_t i, ok = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        const char *src = json_string_value(json_object_get(cs, "t"));
        json_t *want = json_object_get(cs, "out");
        char *out, err[512];
        size_t n = 0;
        int rc = render(src, strlen(src), vars, NULL, &out, &n, err, sizeof err);
        bool pass;
        if (json_is_null(want)) {
            pass = rc != 0;
            CHECK(pass, "unit case %zu should fail like jinja2 (%s) but rendered: %s\n  template: %s", i,
                  json_string_value(json_object_get(cs, "error")), out ? out : "", src);
        } else {
            pass = !rc && n == json_string_length(want) && !memcmp(out, json_string_value(want), n);
            CHECK(pass, "unit case %zu: %s\n  template: %s", i, rc ? err : "output differs", src);
            if (!pass && !rc)
                show_diff("unit", json_string_value(want), json_string_length(want), out, n);
        }
        ok += pass;
        free(out);
    }
    printf("unit cases: %zu/%zu match jinja2\n", ok, json_array_size(cases));
    json_decref(doc);
}

static void test_api(void)
{
    char *out, err[512];
    int rc;

    rc = render_s("{{ raise_exception('Roles must alternate') }}", NULL, &out, err, sizeof err);
    CHECK_EQ_INT(rc, CAIRN_EINVAL);
    CHECK(!strcmp(err, "Roles must alternate"), "raise_exception message: '%s'", err);
    CHECK(out == NULL, "no output on error");

    rc = render_s("a\nb\n{% if x %}\n{{ 1 + }}\n{% endif %}", NULL, &out, err, sizeof err);
    CHECK_EQ_INT(rc, CAIRN_EFORMAT);
    CHECK(strstr(err, "line 4") != NULL, "syntax error names its line: '%s'", err);

    static const char *const unsupported[] = {
        "{% extends 'base.html' %}", "{% include 'x' %}", "{% import 'x' as y %}", "{% block b %}{% endblock %}",
        "{% for x in y recursive %}{% endfor %}", "{{ x|xmlattr }}", "{{ x|wordwrap }}", "{{ '\\N{DASH}' }}",
        "{{ f(*args) }}", "{{ 99999999999999999999 }}",
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        struct tmpl *t = NULL;
        rc = tmpl_parse(&t, unsupported[i], strlen(unsupported[i]), err, sizeof err);
        CHECK(rc == CAIRN_EUNSUPPORTED && t == NULL && strstr(err, "line 1"), "'%s' -> %d (%s)", unsupported[i], rc, err);
        tmpl_free(t);
    }

    rc = render_s("{{ 'x'|from_json }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "from_json"), "unknown filter: %d %s", rc, err);
    rc = render_s("{% if true %}{{ 'x'|from_json }}{% endif %}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "from_json"), "unknown filter reached at run time: %d %s", rc, err);
    rc = render_s("{{ m.content.y }}", "{\"m\": {}}", &out, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "has no attribute 'content'") && strstr(err, "line 1"),
          "runtime error: %d %s", rc, err);
    rc = render_s("{% set q = [] %}{{ q.append(1) }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "unsafe"), "sandbox: %d %s", rc, err);

    /* output contract: NUL-terminated, length given; NULL vars; vars must be an object */
    struct tmpl *t;
    size_t n;
    CHECK_EQ_INT(tmpl_parse(&t, "{{ 'a' ~ x }}b", 14, err, sizeof err), 0);
    CHECK_EQ_INT(tmpl_render(t, NULL, &out, &n, err, sizeof err), 0);
    CHECK(out && n == 2 && !strcmp(out, "ab"), "render with no vars: '%s' %zu", out ? out : "(null)", n);
    free(out);
    json_t *arr = json_array();
    CHECK_EQ_INT(tmpl_render(t, arr, &out, &n, err, sizeof err), CAIRN_EINVAL);
    json_decref(arr);
    json_t *bad = json_object();
    json_object_set_new(bad, "x", json_stringn_nocheck("\xff\xfe", 2));
    CHECK(tmpl_render(t, bad, &out, &n, err, sizeof err) != 0, "invalid UTF-8 in a variable is refused");
    json_decref(bad);
    tmpl_free(t);
    tmpl_free(NULL);
    CHECK_EQ_INT(tmpl_parse(&t, "ok \xc3\x28", 5, err, sizeof err), CAIRN_EFORMAT);

    /* the variables JSON is only read: rendering twice gives the same text */
    json_t *v = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "hi");
    const char *src = "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}";
    char *o1, *o2;
    CHECK_EQ_INT(render(src, strlen(src), v, NULL, &o1, &n, err, sizeof err), 0);
    CHECK_EQ_INT(render(src, strlen(src), v, NULL, &o2, &n, err, sizeof err), 0);
    CHECK(o1 && o2 && !strcmp(o1, "user:hi") && !strcmp(o1, o2), "repeat render: %s / %s", o1, o2);
    free(o1);
    free(o2);
    json_decref(v);
}

struct thread_job {
    const struct tmpl *t;
    const json_t *vars;
    const char *want;
    int bad;
};

static void *render_thread(void *arg)
{
    struct thread_job *j = arg;
    for (int i = 0; i < 200; i++) {
        char *out, err[256];
        size_t n;
        if (tmpl_render(j->t, j->vars, &out, &n, err, sizeof err) || strcmp(out, j->want))
            j->bad++;
        free(out);
    }
    return NULL;
}

static void test_threads(void)
{
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.content|upper }}{% endfor %}{{ ns.n }}";
    json_t *v = json_pack("{s:[{s:s},{s:s}]}", "messages", "content", "a", "content", "b");
    struct tmpl *t;
    char err[256];
    CHECK_EQ_INT(tmpl_parse(&t, src, strlen(src), err, sizeof err), 0);
    struct thread_job jobs[2] = {{t, v, "AB2", 0}, {t, v, "AB2", 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, render_thread, &jobs[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK(jobs[0].bad == 0 && jobs[1].bad == 0, "concurrent renders of one template: %d %d bad", jobs[0].bad,
          jobs[1].bad);
    tmpl_free(t);
    json_decref(v);
}

static void test_limits(void)
{
    char *out, err[512];
    size_t n;
    int64_t t0 = clock_ns();
    int rc = render_s("{{ range(10**9)|length }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "MAX_RANGE"), "range(10**9): %d %s", rc, err);

    const char *loops = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
    rc = render_s(loops, NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFULL, "10^10 iterations stop at a limit: %d %s", rc, err);

    rc = render_s("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "nested"), "infinite recursion: %d %s", rc, err);
    rc = render_s("{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}x{% endmacro %}{{ r(100) }}", NULL, &out,
                  err, sizeof err);
    CHECK(rc == 0 && out && strlen(out) == 101, "recursion 100 deep is fine: %d %s", rc, err);
    free(out);

    rc = render_s("{{ 'x' * 1000000000 }}", NULL, &out, err, sizeof err);
    CHECK_EQ_INT(rc, CAIRN_EFULL);
    rc = render_s("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                  NULL, &out, err, sizeof err);
    CHECK_EQ_INT(rc, CAIRN_EFULL);
    rc = render_s("{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 10 }}{% endfor %}", NULL, &out, err,
                  sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "output"), "26 MB of output over the 16 MiB limit: %d %s", rc, err);

    /* nested captures each holding big output count against the memory limit */
    rc = render_s("{% set big = 'x' * 10000000 %}{% macro r(n) %}{{ big }}{% if n > 0 %}{{ r(n - 1) }}{% endif %}"
                  "{% endmacro %}{{ r(150) }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "memory"), "nested 10 MB captures: %d %s", rc, err);

    struct tmpl_limits lim = {.max_output = 200, .max_steps = 1000, .max_memory = 1 << 20, .max_depth = 5};
    const char *src = "{% for i in range(50) %}{{ i }},{% endfor %}";
    rc = render(src, strlen(src), NULL, &lim, &out, &n, err, sizeof err);
    CHECK(rc == 0 && n == 140, "small limits, small output: %d %zu", rc, n);
    free(out);
    src = "{% for i in range(100) %}{{ i }},{% endfor %}";
    rc = render(src, strlen(src), NULL, &lim, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "output"), "output limit: %d %s", rc, err);
    src = "{% for i in range(2000) %}{% endfor %}";
    rc = render(src, strlen(src), NULL, &lim, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "steps"), "step limit: %d %s", rc, err);
    src = "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}";
    rc = render(src, strlen(src), NULL, &lim, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "5 levels"), "depth limit: %d %s", rc, err);
    lim.max_output = 1 << 20;
    lim.max_steps = 1 << 24;
    src = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}";
    rc = render(src, strlen(src), NULL, &lim, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "memory"), "memory limit: %d %s", rc, err);
    /* wall-clock budget: nine million loop turns with the step limit out of the way */
    struct tmpl_limits timed = {.max_steps = (uint64_t)1 << 40, .max_ms = 20};
    src = "{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}";
    rc = render(src, strlen(src), NULL, &timed, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && strstr(err, "longer than 20 ms"), "time limit: %d %s", rc, err);
    /* builtins weighted by what they touch: 2000 searches of a 1 MB string cost 2000 x 1 MB
     * / 64 steps, over 20 M, while 2000 searches of a short one stay far under; the clock
     * is out of the way, so it is the count of work that stops the first */
    struct tmpl_limits counted = {.max_steps = TMPL_DEFAULT_MAX_STEPS, .max_ms = (uint64_t)1 << 40};
    const char *searches[] = {
        "{% set s = 'x' * 1000000 %}{% for i in range(2000) %}{% if 'zz' in s %}{% endif %}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(2000) %}{{ s.count('zz') }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(2000) %}{{ s | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(2000) %}{% if s is string %}{% endif %}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof searches / sizeof searches[0]; i++) {
        rc = render(searches[i], strlen(searches[i]), NULL, &counted, &out, &n, err, sizeof err);
        CHECK(rc == CAIRN_EFULL && strstr(err, "steps"), "searches of 1 MB, %zu: %d %s", i, rc, err);
        if (!rc)
            free(out);
        char small[256];
        snprintf(small, sizeof small, "%s", searches[i]);
        memcpy(strstr(small, "1000000"), "1000   ", 7);
        rc = render(small, strlen(small), NULL, &counted, &out, &n, err, sizeof err);
        CHECK(rc == 0, "searches of 1 KB, %zu: %d %s", i, rc, err);
        if (!rc)
            free(out);
    }

    /* deep nesting in the source is refused at parse, not by overflowing the C stack */
    size_t deep = 100000;
    char *s = malloc(deep * 20 + 16);
    memcpy(s, "{{ ", 3);
    for (size_t i = 0; i < deep; i++)
        s[3 + i] = '(';
    s[3 + deep] = '1';
    for (size_t i = 0; i < deep; i++)
        s[4 + deep + i] = ')';
    memcpy(s + 4 + 2 * deep, " }}", 4);
    rc = render(s, strlen(s), NULL, NULL, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL, "100000 nested parentheses: %d %s", rc, err);
    size_t k = 0;
    for (size_t i = 0; i < 5000; i++)
        k += (size_t)sprintf(s + k, "{%% if true %%}");
    rc = render(s, k, NULL, NULL, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL || rc == CAIRN_EFORMAT, "5000 nested ifs: %d %s", rc, err);
    k = 0;
    for (size_t i = 0; i < 30000; i++)
        k += (size_t)sprintf(s + k, "not ");
    char *s2 = malloc(k + 16);
    sprintf(s2, "{{ %.*s1 }}", (int)k, s);
    rc = render(s2, strlen(s2), NULL, NULL, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL, "30000 nested nots: %d %s", rc, err);
    free(s2);
    /* long chains make deep trees without deep parser recursion */
    static const char *const links[] = {".a", "+1", "|string", " and x", " or x", "[0]", "(1)", " if x else 1"};
    for (size_t l = 0; l < sizeof links / sizeof links[0]; l++) {
        k = (size_t)sprintf(s, "{{ x");
        for (size_t i = 0; i < 30000; i++)
            k += (size_t)sprintf(s + k, "%s", links[l]);
        k += (size_t)sprintf(s + k, " }}");
        rc = render(s, k, NULL, NULL, &out, &n, err, sizeof err);
        CHECK(rc == CAIRN_EFULL, "30000 x '%s': %d %s", links[l], rc, err);
    }
    free(s);
    /* big inputs and many names stay linear: a 100000-key dict, 3000 variables */
    json_t *big = json_object(), *bv = json_object();
    for (int i = 0; i < 100000; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", i);
        json_object_set_new(big, key, json_integer(i));
    }
    json_object_set_new(bv, "big", big);
    size_t bcap = 3000 * 40 + 512, blen = 0;
    char *bsrc = malloc(bcap);
    blen += (size_t)sprintf(bsrc, "{%% set ns = namespace(s=0) %%}{%% for k in big %%}{%% set ns.s = ns.s + big[k] %%}"
                                  "{%% endfor %%}{{ ns.s }}");
    for (int i = 0; i < 3000; i++)
        blen += (size_t)sprintf(bsrc + blen, "{%% set v%d = %d %%}", i, i);
    blen += (size_t)sprintf(bsrc + blen, "{%% for i in range(20000) %%}{{ v2999 if i == 0 }}{%% endfor %%}");
    int64_t tb = clock_ns();
    rc = render(bsrc, blen, bv, NULL, &out, &n, err, sizeof err);
    double bs = (clock_ns() - tb) * 1e-9;
    CHECK(rc == 0 && out && !strcmp(out, "49999500002999") && bs < 10, "big dict and many names: %d %s %.2f s", rc,
          out ? out : err, bs);
    free(out);
    free(bsrc);
    json_decref(bv);

    /* values nested 20000 deep: compared, hashed and printed without overflowing the stack */
    rc = render_s("{% set ns = namespace(l=[]) %}{% for i in range(20000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                  "{{ [ns.l] == [[ns.l]] }}{{ ns.l|length }}", NULL, &out, err, sizeof err);
    CHECK(rc == 0 && out && !strcmp(out, "False1"), "deep list compare: %d %s", rc, out ? out : err);
    free(out);
    rc = render_s("{% set ns = namespace(l=()) %}{% for i in range(20000) %}{% set ns.l = (ns.l,) %}{% endfor %}"
                  "{{ {ns.l: 1} }}", NULL, &out, err, sizeof err);
    CHECK(rc != 0, "deep tuple as a key fails cleanly: %d", rc);
    rc = render_s("{% set ns = namespace(l=[]) %}{% for i in range(20000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                  "{{ ns.l }}", NULL, &out, err, sizeof err);
    CHECK(rc == CAIRN_EFULL, "deep list print: %d %s", rc, err);

    /* many names times many blocks: refused, not quadratic */
    size_t cap = 40000 * 40, len = 0;
    char *adv = malloc(cap);
    for (int i = 0; i < 20000; i++)
        len += (size_t)sprintf(adv + len, "{%% set v%d = 1 %%}", i);
    for (int i = 0; i < 20000; i++)
        len += (size_t)sprintf(adv + len, "{%% if x %%}{%% set w%d = 1 %%}{%% endif %%}", i);
    int64_t t1 = clock_ns();
    rc = render(adv, len, NULL, NULL, &out, &n, err, sizeof err);
    CHECK(rc == CAIRN_EFULL && (clock_ns() - t1) < 5000000000LL, "40000 names x 20000 ifs: %d %s", rc, err);
    free(adv);
    printf("limits: %.2f s\n", (clock_ns() - t0) * 1e-9);
}

/* cairn template: prints exactly what tmpl_render gives; exit codes 0/1/2. */
static void test_cli(void)
{
    if (access(CAIRN_BINARY, X_OK)) {
        printf("cli: %s not built, skipped\n", CAIRN_BINARY);
        return;
    }
    char mpath[] = "/tmp/cairn_tmpl_msgXXXXXX", opath[] = "/tmp/cairn_tmpl_outXXXXXX";
    int fd = mkstemp(mpath), od = mkstemp(opath);
    const char *msgs = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"h\u00e9\"}]";
    CHECK(fd >= 0 && od >= 0 && write(fd, msgs, strlen(msgs)) == (ssize_t)strlen(msgs), "temp files");
    close(fd);
    close(od);
    const char *tpath = CAIRN_SHARED_DIR "/testdata/templates/meta-llama-Llama-3.1-8B-Instruct.jinja";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s template --template %s --messages %s --add-generation-prompt --var 'date_string=\"02 Jan 2026\"' > %s",
             CAIRN_BINARY, tpath, mpath, opath);
    int rc = system(cmd);
    size_t n = 0, tl;
    char *got = read_all(opath, &n), *src = read_all(tpath, &tl);
    json_t *vars = json_pack("{s:o,s:b,s:s,s:s,s:s}", "messages", json_loads(msgs, 0, NULL), "add_generation_prompt", 1,
                             "date_string", "02 Jan 2026", "bos_token", "<s>", "eos_token", "</s>");
    char *want = NULL, err[512];
    size_t wn = 0;
    int wrc = src ? render(src, tl, vars, NULL, &want, &wn, err, sizeof err) : -1;
    CHECK(rc == 0 && wrc == 0 && got && n == wn && !memcmp(got, want, n), "cairn template output (rc %d, %zu vs %zu bytes)", rc, n, wn);
    free(got);
    free(want);
    free(src);
    json_decref(vars);

    snprintf(cmd, sizeof cmd, "%s template -m %s/testdata/vocab/ggml-vocab-qwen2.gguf --messages %s > %s", CAIRN_BINARY,
             CAIRN_SHARED_DIR, mpath, opath);
    rc = system(cmd);
    got = read_all(opath, &n);
    CHECK(rc == 0 && got && strstr(got, "<|im_start|>user\nh\xc3\xa9<|im_end|>"), "cairn template -m qwen2: rc %d '%s'", rc,
          got ? got : "");
    free(got);
    snprintf(cmd, sizeof cmd, "%s template --template %s/testdata/templates/google-gemma-2-2b-it.jinja --messages %s 2>/dev/null",
             CAIRN_BINARY, CAIRN_SHARED_DIR, mpath);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "a template that raises exits 1 (%d)", rc);
    snprintf(cmd, sizeof cmd, "%s template --messages %s 2>/dev/null", CAIRN_BINARY, mpath);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "missing --template is bad usage (%d)", rc);
    /* add_generation_prompt is false without the flag, not undefined: a template that takes
     * undefined for true adds no generation prompt then */
    char gpath[] = "/tmp/cairn_tmpl_genXXXXXX";
    int gd = mkstemp(gpath);
    const char *gen = "{% if add_generation_prompt is not defined or add_generation_prompt %}GEN{% endif %}.";
    CHECK(gd >= 0 && write(gd, gen, strlen(gen)) == (ssize_t)strlen(gen), "template file");
    close(gd);
    for (int flag = 0; flag <= 1; flag++) {
        snprintf(cmd, sizeof cmd, "%s template --template %s --messages %s %s > %s", CAIRN_BINARY, gpath, mpath,
                 flag ? "--add-generation-prompt" : "", opath);
        rc = system(cmd);
        got = read_all(opath, &n);
        CHECK(rc == 0 && got && !strcmp(got, flag ? "GEN." : "."), "add_generation_prompt %s: '%s'",
              flag ? "given" : "absent", got ? got : "");
        free(got);
    }
    unlink(gpath);
    unlink(mpath);
    unlink(opath);
}

static uint64_t rng_state = 0x5eed;

/* Mutated real templates (cut, spliced, bytes flipped) must give a result or an error. */
static void test_fuzz(const char *const *paths, size_t npaths, const json_t *vars)
{
    size_t parsed = 0, rendered = 0, total = 0;
    struct tmpl_limits lim = {.max_output = 1 << 20, .max_steps = 200000, .max_memory = 64 << 20};
    static const char *const snippets[] = {
        "{%", "%}", "{{", "}}", "{#", "#}", "{% endfor %}", "{% endif %}", "{% if x %}", "(", ")", "[", "]",
        "|", "|tojson", ".items()", "loop.", "{% macro m() %}", "{{ m() }}", "-", "'", "\"", "\\", "~", "**",
        "{% for x in messages %}", "{% set ns.x = 1 %}", "{% raw %}", "{% endraw %}", "{%- ", " -%}",
    };
    for (size_t p = 0; p < npaths; p++) {
        size_t len;
        char *src = read_all(paths[p], &len);
        if (!src)
            continue;
        for (int iter = 0; iter < 12; iter++) {
            char *m = malloc(len + 64);
            memcpy(m, src, len);
            size_t ml = len;
            int kind = (int)(test_rand_u64(&rng_state) % 3);
            size_t pos = ml ? test_rand_u64(&rng_state) % ml : 0;
            if (kind == 0) {
                ml = pos;  /* truncation */
            } else if (kind == 1) {
                const char *sn = snippets[test_rand_u64(&rng_state) % (sizeof snippets / sizeof snippets[0])];
                size_t sl = strlen(sn);
                memmove(m + pos + sl, m + pos, ml - pos);
                memcpy(m + pos, sn, sl);
                ml += sl;
            } else {
                for (int k = 0; k < 4 && ml; k++)
                    m[test_rand_u64(&rng_state) % ml] = "{}%#()[]|.'\"-~ x\n"[test_rand_u64(&rng_state) % 17];
            }
            struct tmpl *t;
            char err[256], *out;
            size_t n;
            total++;
            if (!tmpl_parse(&t, m, ml, err, sizeof err)) {
                parsed++;
                if (!tmpl_render_limits(t, vars, &lim, &out, &n, err, sizeof err)) {
                    rendered++;
                    CHECK(strlen(out) <= n, "output length");
                    free(out);
                }
                tmpl_free(t);
            }
            free(m);
        }
        free(src);
    }
    /* token soup: random sequences of template fragments */
    static const char *const frags[] = {
        "{{ ", " }}", "{% ", " %}", "{%- ", " -%}", "{# c #}", "if ", "elif ", "else", "endif", "for ", " in ",
        "endfor", "set ", "endset", "macro m(a, b=1)", "endmacro", "call m(1)", "endcall", "filter upper",
        "endfilter", "x", "messages", "m", "loop.index", "loop", "ns.v", "namespace(v=1)", "ns", " = ", "(", ")",
        "[", "]", "{", "}", ",", ":", ".", "|", "|length", "|tojson", "|join(',')", "|map(attribute='role')",
        "|selectattr('role', 'equalto', 'user')", "|list", "|first", "|default('d')", " is defined", " is none",
        " not ", " and ", " or ", " ~ ", " + ", " * ", " // ", " % ", " ** ", " == ", " < ", "1", "-2", "2.5",
        "'s'", "\"t\"", "none", "true", "[1, 2]", "{'a': 1}", "range(3)", "m(1)", "caller()", "raise_exception('r')",
        ".items()", ".get('a')", ".split()", "[::-1]", "[1:]", "text ", "\n", "  ", "break", "continue", "raw",
        "endraw", "with a = 1", "endwith", "generation", "endgeneration", "print 1",
    };
    size_t soup = 0, soup_ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char buf[2048];
        size_t k = 0;
        int nf = 1 + (int)(test_rand_u64(&rng_state) % 40);
        for (int f = 0; f < nf; f++) {
            const char *fr = frags[test_rand_u64(&rng_state) % (sizeof frags / sizeof frags[0])];
            size_t fl = strlen(fr);
            if (k + fl >= sizeof buf)
                break;
            memcpy(buf + k, fr, fl);
            k += fl;
        }
        struct tmpl *t;
        char err[256], *out;
        size_t n;
        soup++;
        if (!tmpl_parse(&t, buf, k, err, sizeof err)) {
            if (!tmpl_render_limits(t, vars, &lim, &out, &n, err, sizeof err)) {
                soup_ok++;
                free(out);
            }
            tmpl_free(t);
        }
    }
    printf("fuzz: %zu mutated templates, %zu parsed, %zu rendered; %zu random fragment soups, %zu rendered; "
           "none crashed\n", total, parsed, rendered, soup, soup_ok);
    CHECK(total > 0, "fuzz ran");
}

/* One python3 process renders every template x conversation with render_ref.render(). */
static const char *const py_driver =
    "import json, sys\n"
    "sys.path.insert(0, sys.argv[2])\n"
    "import render_ref\n"
    "# render() builds the same environment on every call; compile each template once\n"
    "env_cls = render_ref.ImmutableSandboxedEnvironment\n"
    "compiled, from_string = {}, env_cls.from_string\n"
    "def cached(self, source, *a, **k):\n"
    "    if source not in compiled:\n"
    "        compiled[source] = from_string(self, source, *a, **k)\n"
    "    return compiled[source]\n"
    "env_cls.from_string = cached\n"
    "jobs = json.load(open(sys.argv[1], encoding='utf-8'))\n"
    "res = []\n"
    "for tp in jobs['templates']:\n"
    "    src = open(tp, encoding='utf-8').read()\n"
    "    row = []\n"
    "    for v in jobs['convs']:\n"
    "        try:\n"
    "            row.append({'out': render_ref.render(src, v)})\n"
    "        except Exception as e:\n"
    "            row.append({'err': '%s: %s' % (type(e).__name__, e)})\n"
    "    res.append(row)\n"
    "json.dump(res, sys.stdout, ensure_ascii=True)\n";

static json_t *run_reference(const json_t *jobs)
{
    char jpath[] = "/tmp/cairn_tmpl_jobsXXXXXX", ppath[] = "/tmp/cairn_tmpl_drvXXXXXX";
    int fd = mkstemp(jpath), pd = mkstemp(ppath);
    if (fd < 0 || pd < 0)
        return NULL;
    char *dump = json_dumps(jobs, JSON_COMPACT);
    bool ok = dump && write(fd, dump, strlen(dump)) == (ssize_t)strlen(dump) &&
              write(pd, py_driver, strlen(py_driver)) == (ssize_t)strlen(py_driver);
    free(dump);
    close(fd);
    close(pd);
    json_t *res = NULL;
    if (ok) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "python3 %s %s %s/tools", ppath, jpath, CAIRN_SHARED_DIR);
        FILE *p = popen(cmd, "r");
        if (p) {
            json_error_t je;
            res = json_loadf(p, 0, &je);
            if (!res)
                fprintf(stderr, "reference output: %s\n", je.text);
            if (pclose(p) != 0) {
                json_decref(res);
                res = NULL;
            }
        }
    }
    unlink(jpath);
    unlink(ppath);
    return res;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The shared testdata's templates, and those cairn mkmodel writes (tmpl_cases/templates). */
static size_t list_templates(char ***out)
{
    const char *dirs[] = {CAIRN_SHARED_DIR "/testdata/templates", CASES "/templates"};
    size_t n = 0, cap = 64;
    char **paths = malloc(cap * sizeof *paths);
    for (int di = 0; di < 2; di++) {
        const char *dir = dirs[di];
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 7 || strcmp(e->d_name + l - 6, ".jinja"))
                continue;
            if (n == cap)
                paths = realloc(paths, (cap *= 2) * sizeof *paths);
            paths[n] = malloc(strlen(dir) + l + 2);
            sprintf(paths[n++], "%s/%s", dir, e->d_name);
        }
        if (d)
            closedir(d);
    }
    qsort(paths, n, sizeof *paths, cmp_str);
    *out = paths;
    return n;
}

static void test_conformance(char **paths, size_t npaths, json_t *convs)
{
    CHECK(npaths > 0, "no templates found");
    json_t *jobs = json_object(), *tp = json_array(), *cv = json_array();
    for (size_t i = 0; i < npaths; i++)
        json_array_append_new(tp, json_string(paths[i]));
    size_t ci;
    json_t *c;
    json_array_foreach(convs, ci, c)
        json_array_append(cv, json_object_get(c, "vars"));
    json_object_set_new(jobs, "templates", tp);
    json_object_set_new(jobs, "convs", cv);
    int64_t t0 = clock_ns();
    json_t *ref = run_reference(jobs);
    json_decref(jobs);
    CHECK(ref && json_array_size(ref) == npaths,
          "could not run the reference (python3 with jinja2 is needed: apt-get install python3-jinja2)");
    if (!ref)
        return;
    printf("reference rendered %zu x %zu in %.1f s\n", npaths, json_array_size(convs), (clock_ns() - t0) * 1e-9);
    size_t pairs = 0, match = 0, rendered = 0, raised = 0, tmpl_pass = 0;
    for (size_t i = 0; i < npaths; i++) {
        size_t len;
        char *src = read_all(paths[i], &len);
        const char *name = strrchr(paths[i], '/') + 1;
        struct tmpl *t = NULL;
        char perr[512];
        int prc = src ? tmpl_parse(&t, src, len, perr, sizeof perr) : CAIRN_EIO;
        json_t *row = json_array_get(ref, i);
        size_t fails = 0;
        json_array_foreach(convs, ci, c) {
            json_t *r = json_array_get(row, ci), *want = json_object_get(r, "out");
            json_t *vars = json_deep_copy(json_object_get(c, "vars"));
            if (!json_object_get(vars, "bos_token"))
                json_object_set_new(vars, "bos_token", json_string("<s>"));
            if (!json_object_get(vars, "eos_token"))
                json_object_set_new(vars, "eos_token", json_string("</s>"));
            char *out = NULL, err[512];
            size_t n = 0;
            int rc = prc ? prc : tmpl_render(t, vars, &out, &n, err, sizeof err);
            if (prc)
                snprintf(err, sizeof err, "%s", perr);
            const char *cname = json_string_value(json_object_get(c, "name"));
            bool ok;
            pairs++;
            if (!want) {
                ok = rc != 0;
                raised += ok;
                if (!ok)
                    fprintf(stderr, "  %s / %s: the reference raised (%s) but cairn rendered\n", name, cname,
                            json_string_value(json_object_get(r, "err")));
            } else {
                ok = !rc && n == json_string_length(want) && !memcmp(out, json_string_value(want), n);
                rendered += ok;
                if (!ok && rc)
                    fprintf(stderr, "  %s / %s: cairn failed (%s: %s)\n", name, cname, cairn_strerror(rc), err);
                else if (!ok)
                    show_diff(cname, json_string_value(want), json_string_length(want), out, n);
            }
            CHECK(ok, "%s / %s", name, cname);
            fails += !ok;
            match += ok;
            free(out);
            json_decref(vars);
        }
        printf("%-55s %s (%zu/%zu)\n", name, fails ? "FAIL" : "pass", json_array_size(convs) - fails,
               json_array_size(convs));
        tmpl_pass += !fails;
        tmpl_free(t);
        free(src);
    }
    printf("conformance: %zu/%zu templates pass; %zu/%zu template x conversation pairs match "
           "(%zu rendered identically, %zu raise in both)\n",
           tmpl_pass, npaths, match, pairs, rendered, raised);
    json_decref(ref);
}

static void bench(char **paths, size_t npaths)
{
    const char *qwen = NULL;
    for (size_t i = 0; i < npaths; i++)
        if (strstr(paths[i], "Qwen-Qwen2.5-7B-Instruct"))
            qwen = paths[i];
    if (!qwen)
        return;
    size_t len;
    char *src = read_all(qwen, &len);
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", "You are a helpful assistant."));
    for (int i = 0; i < 49; i++) {
        char text[200];
        snprintf(text, sizeof text, "Message %d: a typical sentence of a chat turn, with some words in it.", i);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", text));
    }
    json_t *vars = json_pack("{s:o,s:b,s:s,s:s}", "messages", msgs, "add_generation_prompt", 1, "bos_token", "",
                             "eos_token", "<|im_end|>");
    struct tmpl *t;
    char err[256], *out;
    size_t n;
    int64_t t0 = clock_ns();
    int reps = 200;
    for (int i = 0; i < reps; i++) {
        if (tmpl_parse(&t, src, len, err, sizeof err))
            break;
        tmpl_free(t);
    }
    double parse_us = (clock_ns() - t0) * 1e-3 / reps;
    CHECK_EQ_INT(tmpl_parse(&t, src, len, err, sizeof err), 0);
    t0 = clock_ns();
    for (int i = 0; i < reps; i++) {
        if (tmpl_render(t, vars, &out, &n, err, sizeof err))
            break;
        free(out);
    }
    double render_us = (clock_ns() - t0) * 1e-3 / reps;
    printf("bench: Qwen2.5 template, 50 messages: render %.1f us (target < 1000 us), parse %.1f us\n", render_us,
           parse_us);
    tmpl_free(t);
    json_decref(vars);
    free(src);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_unit_cases);
    RUN(test_api);
    RUN(test_threads);
    RUN(test_limits);
    RUN(test_cli);
    char **paths;
    size_t npaths = list_templates(&paths);
    json_error_t je;
    json_t *convs = json_load_file(CASES "/conversations.json", 0, &je);
    CHECK(convs != NULL, "conversations.json: %s", je.text);
    if (convs) {
        RUN(test_conformance, paths, npaths, convs);
        json_t *fuzz_vars = NULL;
        size_t i;
        json_t *c;
        json_array_foreach(convs, i, c)
            if (!strcmp(json_string_value(json_object_get(c, "name")), "tools_parallel+gen"))
                fuzz_vars = json_object_get(c, "vars");
        CHECK(fuzz_vars != NULL, "conversation tools_parallel+gen");
        RUN(test_fuzz, (const char *const *)paths, npaths, fuzz_vars);
    }
    const char *b = getenv("CAIRN_BENCH");
    if (b && *b == '1')
        bench(paths, npaths);
    for (size_t i = 0; i < npaths; i++)
        free(paths[i]);
    free(paths);
    json_decref(convs);
    return test_main_end();
}
