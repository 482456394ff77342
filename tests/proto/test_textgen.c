/* TextGeneration params: JSON round trip and refusal of bad members, naming them. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "proto/textgen.h"
#include "testutil.h"

static int parse(const char *text, struct textgen_params *p, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        return -1000;
    int rc = textgen_params_from_json(j, p, err, errlen);
    json_decref(j);
    return rc;
}

static void test_round_trip(void)
{
    struct textgen_params p;
    char err[256];
    int rc = parse("{\"model\":\"m1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":7,"
                   "\"stop\":[\"a\",\"bc\"],\"n\":2,\"logprobs\":true,\"top_logprobs\":3,"
                   "\"sampling\":{\"temperature\":0.5,\"seed\":9},\"logit_bias\":{\"12\":-100,\"5\":2.5},"
                   "\"template_kwargs\":{\"enable_thinking\":false},\"reasoning\":false}",
                   &p, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    CHECK(!strcmp(p.model, "m1") && p.max_tokens == 7 && p.n_stop == 2 && !strcmp(p.stop[1], "bc"), "fields");
    CHECK(p.n == 2 && p.logprobs && p.top_logprobs == 3 && !p.reasoning && p.add_generation_prompt, "flags");
    CHECK(p.sampling.temperature == 0.5f && p.sampling.seed == 9 && p.sampling.top_k == 40, "sampling");
    CHECK(p.n_bias == 2, "bias entries %d", p.n_bias);
    json_t *j = textgen_params_to_json(&p);
    struct textgen_params q;
    CHECK(j && textgen_params_from_json(j, &q, err, sizeof err) == 0, "re-read: %s", err);
    json_t *k = textgen_params_to_json(&q);
    CHECK(json_equal(j, k), "round trip differs");
    json_decref(j);
    json_decref(k);
    textgen_params_clear(&q);
    textgen_params_clear(&p);
}

static void test_refusals(void)
{
    static const struct {
        const char *json, *field;
    } cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model"},
        {"{\"model\":\"m\"}", "exactly one"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"messages\":[]}", "exactly one"},
        {"{\"model\":\"m\",\"messages\":[]}", "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "messages[0].role"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages[0].content"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"n\":17}", "n:"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"max_tokens\":-1}", "max_tokens"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"stop\":[\"\"]}", "stop[0]"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", "logit_bias"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"sampling\":{\"top_p\":0}}", "sampling.top_p"},
        {"{\"model\":\"m\",\"prompt\":\"a\",\"top_logprobs\":21}", "top_logprobs"},
        {"{\"model\":\"m\",\"prompt\":[]}", "prompt:"},
        {"{\"model\":\"m\",\"prompt\":[1,-1]}", "prompt[1]"},
        {"{\"model\":\"m\",\"prompt\":[1,2147483648]}", "prompt[1]"},
        {"{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt[1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct textgen_params p;
        char err[256] = "";
        int rc = parse(cases[i].json, &p, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, cases[i].field), "case %zu: rc %d, '%s' lacks '%s'", i, rc, err,
              cases[i].field);
        CHECK(p.messages == NULL && p.prompt == NULL && p.prompt_ids == NULL && p.n_stop == 0,
              "case %zu: not cleared", i);
    }
}

/* A prompt of token ids goes over JSON and back as the same ids. */
static void test_prompt_ids(void)
{
    struct textgen_params p, q;
    char err[256] = "";
    CHECK(parse("{\"model\":\"m\",\"prompt\":[0,7,2147483647]}", &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.n_prompt_ids == 3 && p.prompt_ids && p.prompt_ids[1] == 7 && p.prompt_ids[2] == INT32_MAX && !p.prompt,
          "ids");
    json_t *j = textgen_params_to_json(&p);
    textgen_params_init(&q);
    CHECK(j && textgen_params_from_json(j, &q, err, sizeof err) == 0, "%s", err);
    CHECK(q.n_prompt_ids == 3 && q.prompt_ids && !memcmp(p.prompt_ids, q.prompt_ids, 3 * sizeof *q.prompt_ids),
          "round trip");
    json_decref(j);
    textgen_params_clear(&q);
    textgen_params_clear(&p);
}

/* Embedding inputs and prompt batches: each shape of input, the limits, refusals naming
 * the entry. */
static void test_embed_and_batch(void)
{
    struct textgen_params p;
    char err[256] = "";
    int rc = parse("{\"model\":\"e\",\"embed\":[\"a\",[1,2,3]],\"truncate\":true,\"dimensions\":8}", &p, err,
                   sizeof err);
    CHECK(rc == 0 && p.n_embed == 2 && !strcmp(p.embed[0].text, "a") && p.embed[1].n_ids == 3 &&
              p.embed[1].ids[2] == 3 && p.truncate && p.dimensions == 8 && !p.messages && !p.prompt,
          "embed: %s", err);
    textgen_params_clear(&p);
    rc = parse("{\"model\":\"e\",\"prompts\":[\"a\",[7]],\"n\":3}", &p, err, sizeof err);
    CHECK(rc == 0 && p.n_batch == 2 && textgen_seqs(&p) == 6, "prompts: %s", err);
    textgen_params_clear(&p);
    const char *bad[][2] = {
        {"{\"model\":\"e\",\"embed\":[]}", "embed: expected 1..2048"},
        {"{\"model\":\"e\",\"embed\":[\"\"]}", "embed[0]: empty"},
        {"{\"model\":\"e\",\"embed\":[[1,-1]]}", "embed[0][1]"},
        {"{\"model\":\"e\",\"embed\":[[1],{}]}", "embed[1]"},
        {"{\"model\":\"e\",\"embed\":[\"a\"],\"dimensions\":-1}", "dimensions"},
        {"{\"model\":\"e\",\"embed\":[\"a\"],\"prompt\":\"b\"}", "exactly one"},
        {"{\"model\":\"e\",\"prompts\":[\"a\"]}", "prompts"},
        {"{\"model\":\"e\",\"prompts\":[1,2]}", "prompts"},
        {"{\"model\":\"e\",\"prompts\":[\"a\",\"b\"],\"n\":9}", "prompts: 2 prompts of n 9"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        rc = parse(bad[i][0], &p, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, bad[i][1]), "%s: rc %d, %s", bad[i][0], rc, err);
        textgen_params_clear(&p);
    }
    /* 2049 inputs: one too many */
    json_t *in = json_array();
    for (int i = 0; i <= TEXTGEN_MAX_EMBED_INPUTS; i++)
        json_array_append_new(in, json_string("x"));
    textgen_params_init(&p);
    rc = textgen_embed_inputs(in, "input", &p, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "got 2049"), "2049 inputs: %s", err);
    textgen_params_clear(&p);
    json_decref(in);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_round_trip);
    RUN(test_refusals);
    RUN(test_prompt_ids);
    RUN(test_embed_and_batch);
    return test_main_end();
}
