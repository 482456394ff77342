/* libFuzzer harness of the control plane's JSON decoders on arbitrary text: events
 * (ctl/event.c), commands and their results (ctl/command.c), state snapshots
 * (ctl/state.c) and TextGeneration params (proto/textgen.c). Every decoder sees every
 * input. A refusal must name what it refused (a non-empty message); an accepted input
 * must encode, and its encoding decode again to the same encoding (decode -> encode ->
 * decode -> encode is stable). A decoded event also passes event_validate, copies to the
 * same JSON, and is applied (at the next position) to a small state, which must then
 * still encode and decode to itself. Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "ctl/command.h"
#include "ctl/event.h"
#include "ctl/state.h"
#include "proto/textgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "fuzz_event: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                    \
        }                                                               \
    } while (0)

static char err[1024];

/* A refusal names its cause; ENOMEM is the only other way to fail. */
static bool accepted(int rc)
{
    if (rc)
        CHECK((rc == CAIRN_EFORMAT || rc == CAIRN_ENOMEM) && err[0]);
    err[0] = 0;
    return rc == 0;
}

static char *state_text(const char *text, size_t len)
{
    struct cluster_state *s;
    if (!accepted(cluster_state_from_json(text, len, &s, err, sizeof err)))
        return NULL;
    char *out = cluster_state_to_json(s);
    CHECK(out);
    cluster_state_release(s);
    return out;
}

/* Applies e at the state's next position to a state holding one node (whatever the
 * outcome, the state stays one that encodes and decodes to itself). */
static void apply(struct event *e)
{
    static const char base[] = "{\"last_applied\":{\"term\":1,\"index\":1},\"master\":{\"node_id\":\"n1\",\"term\":1},"
                               "\"nodes\":{},\"edges\":[],\"instances\":{},\"runners\":{},\"tasks\":{},\"downloads\":[]}";
    struct cluster_state *s;
    CHECK(cluster_state_from_json(base, strlen(base), &s, err, sizeof err) == 0);
    e->term = e->kind == EVENT_STATE_SNAPSHOT ? 2 : 1;
    e->index = 2;
    (void)cluster_apply(s, e, err, sizeof err);
    char *a = cluster_state_to_json(s), *b;
    CHECK(a && (b = state_text(a, strlen(a))) && !strcmp(a, b));
    free(a);
    free(b);
    cluster_state_release(s);
}

static char *event_text(const char *text, size_t len)
{
    struct event e, c;
    if (!accepted(event_from_json(text, len, &e, err, sizeof err)))
        return NULL;
    char *out = event_to_json(&e);
    CHECK(out);
    CHECK(event_validate(&e, err, sizeof err) == 0);
    CHECK(event_copy(&c, &e) == 0);
    char *copied = event_to_json(&c);
    CHECK(copied && !strcmp(copied, out));
    free(copied);
    event_clear(&c);
    apply(&e);
    event_clear(&e);
    return out;
}

static char *command_text(const char *text, size_t len)
{
    struct command c;
    if (!accepted(command_from_json(text, len, &c, err, sizeof err)))
        return NULL;
    char *out = command_to_json(&c);
    CHECK(out);
    command_clear(&c);
    return out;
}

static char *result_text(const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    struct command_result r;
    if (!j || !accepted(command_result_from_jsonv(j, &r, err, sizeof err))) {
        json_decref(j);
        return NULL;
    }
    json_decref(j);
    json_t *o = command_result_to_jsonv(&r);
    char *out = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(out);
    json_decref(o);
    return out;
}

static char *params_text(const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    struct textgen_params p;
    if (!j || !accepted(textgen_params_from_json(j, &p, err, sizeof err))) {
        json_decref(j);
        return NULL;
    }
    json_decref(j);
    json_t *o = textgen_params_to_json(&p);
    char *out = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(out);
    json_decref(o);
    textgen_params_clear(&p);
    return out;
}

/* decode -> encode -> decode -> encode gives the first encoding again. */
#define STABLE(fn)                                                  \
    do {                                                            \
        char *once = fn((const char *)data, size);                  \
        if (once) {                                                 \
            char *twice = fn(once, strlen(once));                   \
            if (!twice || strcmp(once, twice))                      \
                fprintf(stderr, "%s\n%s\n%s\n", #fn, once, twice ? twice : err); \
            CHECK(twice && !strcmp(once, twice));                   \
            free(twice);                                            \
        }                                                           \
        free(once);                                                 \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    STABLE(event_text);
    STABLE(command_text);
    STABLE(result_text);
    STABLE(state_text);
    STABLE(params_text);
    return 0;
}
