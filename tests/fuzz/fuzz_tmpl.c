/* libFuzzer harness of the chat-template interpreter (tmpl/) on arbitrary template text,
 * rendered with a fixed small conversation (system, user, an assistant tool call, its
 * result, user) and one tool, under small limits. A refused template or a failed render
 * must leave no output and say why (but for raise_exception(""), whose message is the
 * template's); a render is deterministic (twice the same result) and its output is
 * NUL-terminated and within max_output. Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "tmpl/tmpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "fuzz_tmpl: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                    \
        }                                                               \
    } while (0)

static json_t *vars;
/* No wall-clock budget here (a year): the two renders must agree, and a time limit
 * could stop one and not the other; the step limit bounds them instead. */
static const struct tmpl_limits lim = {
    .max_output = 1 << 16, .max_memory = 64 << 20, .max_steps = 200000, .max_depth = 50,
    .max_ms = 365ull * 86400 * 1000};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    vars = json_loads(
        "{\"messages\": ["
        " {\"role\": \"system\", \"content\": \"You are terse.\"},"
        " {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\","
        "   \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", \"content\": \"18 C\"},"
        " {\"role\": \"user\", \"content\": \"Thanks <b>\\u00e9t\\u00e9</b>\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
        "   \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
        "   \"required\": [\"city\"]}}}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
        " \"enable_thinking\": false}",
        0, NULL);
    CHECK(vars);
    return 0;
}

static int render(const struct tmpl *t, char **out, size_t *len, char *err, size_t errlen)
{
    err[0] = 0;
    int rc = tmpl_render_limits(t, vars, &lim, out, len, err, errlen);
    if (rc) /* raise_exception's message (CAIRN_EINVAL) is the template's, maybe "" */
        CHECK(rc < 0 && *out == NULL && (err[0] || rc == CAIRN_EINVAL));
    else
        CHECK(*out && *len <= lim.max_output && (*out)[*len] == 0);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    struct tmpl *t;
    char err[512] = "", err2[512];
    int rc = tmpl_parse(&t, (const char *)data, size, err, sizeof err);
    if (rc) {
        CHECK(rc < 0 && t == NULL && err[0]);
        return 0;
    }
    char *a, *b;
    size_t na = 0, nb = 0;
    int ra = render(t, &a, &na, err, sizeof err), rb = render(t, &b, &nb, err2, sizeof err2);
    CHECK(ra == rb);
    if (ra == 0)
        CHECK(na == nb && !memcmp(a, b, na));
    else
        CHECK(!strcmp(err, err2));
    free(a);
    free(b);
    tmpl_free(t);
    return 0;
}
