/* Model references (node/hubref.h): every form people type parses to the same repo and
 * tag, with the canonical text as the model's id; malformed references are refused
 * naming the part; tags are matched as whole words of file names, case-insensitively
 * (Q4_K is not Q4_K_M), split models are chosen as all their parts in order (and refused
 * when one is missing), projectors never, the default tag and the only-model rule, and
 * an unknown tag lists the repo's tags. Listings are shaped like real repos'. */
#include <string.h>

#include "base/err.h"
#include "node/hubref.h"
#include "testutil.h"

static void test_parse(void)
{
    const char *same[] = {"hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
                          "bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m",
                          "huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_k_M",
                          "https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
                          "hf://bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"};
    char err[512], text[HUBREF_TEXT_MAX];
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        struct hub_ref r;
        int rc = hubref_parse(same[i], &r, err, sizeof err);
        hubref_text(&r, NULL, text);
        CHECK(rc == 0 && !strcmp(r.owner, "bartowski") && !strcmp(r.repo, "Llama-3.2-1B-Instruct-GGUF") &&
                  !strcmp(r.tag, "Q4_K_M") && !r.path[0] &&
                  !strcmp(text, "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
              "'%s': %d %s -> %s", same[i], rc, err, text);
        CHECK(hubref_looks_like(same[i]), "'%s' looks like a reference", same[i]);
    }
    struct hub_ref r;
    CHECK(hubref_parse("Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", &r, err,
                       sizeof err) == 0 &&
              !strcmp(r.path, "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf") && !r.tag[0],
          "a file: %s", err);
    hubref_text(&r, NULL, text);
    CHECK(!strcmp(text, "hf.co/Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf"), "%s",
          text);
    CHECK(hubref_parse("unsloth/gpt-oss-20b-GGUF", &r, err, sizeof err) == 0 && !r.tag[0] && !r.path[0], "no tag");
    hubref_text(&r, "F16", text);
    CHECK(!strcmp(text, "hf.co/unsloth/gpt-oss-20b-GGUF:F16"), "the chosen tag in the text: %s", text);

    const struct {
        const char *text, *want;
    } bad[] = {
        {"", "not a model reference"},
        {"llama3", "not a model reference"},
        {"/repo:Q4", "not a model reference"},
        {"owner/:Q4", "repo name"},
        {"owner/repo:", "tag"},
        {"owner/repo:Q4 K", "tag"},
        {"own er/repo", "not a model reference"},
        {"owner/repo/README.md", "ending in .gguf"},
        {"owner/repo/../x.gguf", "no . or .."},
        {"owner/repo/a//x.gguf", "ending in .gguf"},
        {".hidden/repo", "not a model reference"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = hubref_parse(bad[i].text, &r, err, sizeof err);
        CHECK(rc == CAIRN_EINVAL && strstr(err, bad[i].want), "'%s': %d %s", bad[i].text, rc, err);
    }
    CHECK(!hubref_looks_like("m1") && !hubref_looks_like("llama3:8b") && !hubref_looks_like("qwen2.5-7b-instruct"),
          "local model names are not references");
}

#define F(p) {p, 1000, NULL}
static const struct hub_file bartowski[] = {
    F(".gitattributes"), F("README.md"),
    F("Llama-3.2-1B-Instruct-IQ3_M.gguf"), F("Llama-3.2-1B-Instruct-Q4_K.gguf"),
    F("Llama-3.2-1B-Instruct-Q4_K_S.gguf"), F("Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
    F("Llama-3.2-1B-Instruct-Q8_0.gguf"), F("Llama-3.2-1B-Instruct-f16.gguf"),
    F("old/Llama-3.2-1B-Instruct-Q4_K_M.gguf"), F("mmproj-Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
};
static const struct hub_file qwen[] = {
    F("qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"), F("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf"),
    F("qwen2.5-7b-instruct-q8_0-00001-of-00003.gguf"), F("qwen2.5-7b-instruct-q8_0-00003-of-00003.gguf"),
    F("qwen2.5-7b-instruct-fp16-00001-of-00004.gguf"), F("LICENSE"),
};
static const struct hub_file single[] = {F("README.md"), F("model.gguf"), F("mmproj-f16.gguf")};

static int choose(const char *ref, const struct hub_file *files, size_t n, size_t *pick, size_t *np, char *tag, char *err)
{
    struct hub_ref r;
    int rc = hubref_parse(ref, &r, err, 512);
    return rc ? rc : hubref_choose(&r, files, n, pick, np, tag, err, 512);
}

static void test_choose(void)
{
    size_t pick[HUBREF_MAX_PARTS], np;
    char tag[HUBREF_TAG_MAX + 1], err[512];
    size_t nb = sizeof bartowski / sizeof bartowski[0], nq = sizeof qwen / sizeof qwen[0];
    const struct {
        const char *ref;
        int idx;
        const char *tag;
    } one[] = {
        {"bartowski/L:Q4_K_M", 5, "Q4_K_M"}, /* top level, not old/, not the projector */
        {"bartowski/L:q4_k", 3, "Q4_K"},     /* a word: not Q4_K_S or Q4_K_M */
        {"bartowski/L:iq3_m", 2, "IQ3_M"},
        {"bartowski/L:F16", 7, "F16"},
        {"bartowski/L", 5, "Q4_K_M"}, /* the default */
        {"bartowski/L/old/Llama-3.2-1B-Instruct-Q4_K_M.gguf", 8, ""},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        int rc = choose(one[i].ref, bartowski, nb, pick, &np, tag, err);
        CHECK(rc == 0 && np == 1 && pick[0] == (size_t)one[i].idx && !strcmp(tag, one[i].tag), "%s: %d %s -> %zu %s",
              one[i].ref, rc, err, np ? pick[0] : 99, tag);
    }
    int rc = choose("bartowski/L:Q5_K_M", bartowski, nb, pick, &np, tag, err);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(err, "Q5_K_M") && strstr(err, "IQ3_M, Q4_K, Q4_K_S, Q4_K_M, Q8_0, F16"),
          "an unknown tag lists the repo's: %d %s", rc, err);
    rc = choose("Qwen/Q:Q4_K_M", qwen, nq, pick, &np, tag, err);
    CHECK(rc == 0 && np == 2 && pick[0] == 1 && pick[1] == 0, "a split model, its parts in order: %d %s", rc, err);
    rc = choose("Qwen/Q", qwen, nq, pick, &np, tag, err);
    CHECK(rc == 0 && np == 2 && !strcmp(tag, "Q4_K_M"), "the default of a split repo: %d %s", rc, err);
    rc = choose("Qwen/Q:Q8_0", qwen, nq, pick, &np, tag, err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "part 2"), "a missing part: %d %s", rc, err);
    rc = choose("Qwen/Q/qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf", qwen, nq, pick, &np, tag, err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "first part"), "a later part named: %d %s", rc, err);
    rc = choose("Qwen/Q:fp16", qwen, nq, pick, &np, tag, err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "4 parts"), "a split of 4 with 1 listed: %d %s", rc, err);
    rc = choose("a/b", single, 3, pick, &np, tag, err);
    CHECK(rc == 0 && np == 1 && pick[0] == 1 && !strcmp(tag, "GGUF"), "the only model, no tag: %d %s %s", rc, err, tag);
    rc = choose("a/b:Q4_0", single, 3, pick, &np, tag, err);
    CHECK(rc == CAIRN_ENOTFOUND, "a tag the only model lacks: %d %s", rc, err);
    rc = choose("a/b", single, 1, pick, &np, tag, err);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(err, "no GGUF"), "no model at all: %d %s", rc, err);
    rc = choose("a/b/missing.gguf", single, 3, pick, &np, tag, err);
    CHECK(rc == CAIRN_ENOTFOUND && strstr(err, "no file"), "a missing file: %d %s", rc, err);
}

static void test_file_tag(void)
{
    const struct {
        const char *path, *tag;
    } cases[] = {
        {"Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"},
        {"sub/Meta-Llama-3.1-8B-Instruct.IQ4_XS.gguf", "IQ4_XS"},
        {"qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"},
        {"gpt-oss-20b-UD-Q4_K_XL.gguf", "Q4_K_XL"},
        {"model-bf16.gguf", "BF16"},
        {"gpt-oss-20b-MXFP4.gguf", "MXFP4"},
        {"Qwen2.5-7B.gguf", NULL},
        {"model.gguf", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[HUBREF_TAG_MAX + 1] = "";
        bool ok = hubref_file_tag(cases[i].path, tag);
        CHECK(cases[i].tag ? ok && !strcmp(tag, cases[i].tag) : !ok, "%s: %d '%s'", cases[i].path, ok, tag);
    }
    int part, count;
    CHECK(hubref_split_part("a/x-00002-of-00003.gguf", &part, &count) && part == 2 && count == 3, "part 2 of 3");
    CHECK(!hubref_split_part("x-00004-of-00003.gguf", &part, &count) && !hubref_split_part("x-0001-of-0003.gguf", &part,
                                                                                              &count),
          "malformed parts");
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_parse);
    RUN(test_choose);
    RUN(test_file_tag);
    return test_main_end();
}
