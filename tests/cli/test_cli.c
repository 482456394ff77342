/* End to end through the cairn binary as a user runs it: mkmodel, generate, bench, and
 * the errors a user gets for bad input. */
#include "testutil.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

/* Runs a shell command; captures stdout+stderr (up to cap) and returns the exit code. */
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[4200];
    snprintf(full, sizeof full, "( %s ) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/cairn-test-cli-%d", (int)getpid());
    char out[65536], out2[65536];
    run(out, sizeof out, "mkdir -p %s", dir);
    const char *bin = CAIRN_BINARY;
    const char *spm = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    char spm_path[512];
    snprintf(spm_path, sizeof spm_path, "%s", spm);
    const char *qwen = test_data_path("vocab/ggml-vocab-qwen2.gguf");
    char qwen_path[512];
    snprintf(qwen_path, sizeof qwen_path, "%s", qwen);

    /* A tiny llama with a real SentencePiece vocabulary, in a K-quant mix. */
    int rc = run(out, sizeof out, "%s mkmodel --shape tiny --type q4_k_m --vocab %s -o %s/tiny.gguf", bin, spm_path, dir);
    CHECK(rc == 0, "mkmodel tiny failed (%d): %s", rc, out);

    /* Greedy generation is deterministic, and sampling with a seed is too. */
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf --tokens 1,450,4996 -n 16 --temp 0 2>/dev/null", bin, dir);
    CHECK(rc == 0, "generate failed (%d): %s", rc, out);
    int n_ids = 0;
    for (char *p = strtok(strdup(out), " \n"); p; p = strtok(NULL, " \n"))
        n_ids++;
    CHECK(n_ids == 16, "expected 16 ids, got %d: %s", n_ids, out);
    rc = run(out2, sizeof out2, "%s generate -m %s/tiny.gguf --tokens 1,450,4996 -n 16 --temp 0 -t 1 2>/dev/null", bin, dir);
    CHECK(rc == 0 && !strcmp(out, out2), "greedy output differs between runs/threads:\n%s\n%s", out, out2);
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf --tokens 1,450 -n 12 --seed 7 --temp 0.8 --top-p 0.9 2>/dev/null", bin, dir);
    run(out2, sizeof out2, "%s generate -m %s/tiny.gguf --tokens 1,450 -n 12 --seed 7 --temp 0.8 --top-p 0.9 -b 1 2>/dev/null", bin, dir);
    CHECK(rc == 0 && !strcmp(out, out2), "seeded sampling differs between runs:\n%s\n%s", out, out2);

    /* Text in, text out through the tokenizer. */
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf -p 'Hello world' -n 8 --seed 1", bin, dir);
    CHECK(rc == 0 && strstr(out, "prompt: 3 tokens"), "text prompt failed (%d): %s", rc, out);

    /* A script model says what it was built to say. */
    rc = run(out, sizeof out, "%s tokenize -m %s --ids --no-bos 'Hello world, how are you?'", bin, spm_path);
    CHECK(rc == 0, "tokenize failed: %s", out);
    char ids[1024];
    size_t idlen = strcspn(out, "\n");
    idlen = idlen < sizeof ids - 1 ? idlen : sizeof ids - 1;
    memcpy(ids, out, idlen);
    ids[idlen] = 0;
    for (char *p = ids; *p; p++)
        if (*p == ' ')
            *p = ',';
    rc = run(out, sizeof out, "%s mkmodel --shape tiny --type q8_0 --vocab %s --script-ids %s,2 -o %s/script.gguf",
             bin, spm_path, ids, dir);
    CHECK(rc == 0, "mkmodel --script-ids failed: %s", out);
    rc = run(out, sizeof out, "%s generate -m %s/script.gguf -p 'Hello' -n 20 --temp 0 2>/dev/null", bin, dir);
    CHECK(rc == 0 && !strcmp(out, " world, how are you?\n"), "script model said '%s'", out);
    rc = run(out, sizeof out, "%s mkmodel --shape tiny --vocab %s --script-ids 5,6,5,7 -o %s/bad.gguf", bin, spm_path, dir);
    CHECK(rc == 1 && strstr(out, "followed by"), "conflicting script accepted (%d): %s", rc, out);

    /* A draft shares the target's first layers, embeddings and head. */
    rc = run(out, sizeof out, "%s mkmodel --draft-of %s/tiny.gguf --layers 2 -o %s/draft.gguf", bin, dir, dir);
    CHECK(rc == 0, "draft failed: %s", out);
    rc = run(out, sizeof out, "%s generate -m %s/draft.gguf --tokens 1,450 -n 4 --temp 0 2>/dev/null", bin, dir);
    CHECK(rc == 0 && strlen(out) > 4, "draft does not generate: %s", out);

    /* qwen2 with a byte-level BPE vocabulary and its chat template. */
    rc = run(out, sizeof out, "%s mkmodel --arch qwen2 --n-embd 64 --n-layers 2 --n-head 4 --n-head-kv 2 --n-ff 128 --type q8_0 --vocab %s -o %s/qwen.gguf",
             bin, qwen_path, dir);
    CHECK(rc == 0, "mkmodel qwen2 failed: %s", out);
    rc = run(out, sizeof out, "%s generate -m %s/qwen.gguf --chat 'Hi' -n 4 --seed 2", bin, dir);
    CHECK(rc == 0 && strstr(out, "generated:"), "chat generation failed (%d): %s", rc, out);

    /* cairn template: without --add-generation-prompt the variable is false, not undefined
     * (a template that defaults an undefined one to true would add a prompt). */
    rc = run(out, sizeof out, "printf '%%s' '{%% if add_generation_prompt is not defined or add_generation_prompt %%}GEN{%% else %%}NO{%% endif %%}' > %s/agp.jinja && "
             "echo '[{\"role\":\"user\",\"content\":\"hi\"}]' > %s/conv.json && %s template --template %s/agp.jinja --messages %s/conv.json",
             dir, dir, bin, dir, dir);
    CHECK(rc == 0 && !strncmp(out, "NO", 2), "template without --add-generation-prompt (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s template --template %s/agp.jinja --messages %s/conv.json --add-generation-prompt", bin, dir, dir);
    CHECK(rc == 0 && !strncmp(out, "GEN", 3), "template with --add-generation-prompt (%d): %s", rc, out);

    /* cairn embed: unit vectors from an embedding model; a generative one is refused. */
    rc = run(out, sizeof out, "%s mkmodel --shape qwen3-embed-tiny --type q8_0 --vocab %s -o %s/embed.gguf && "
             "%s embed -m %s/embed.gguf 'Hello world' 'Goodbye' 2>/dev/null", bin, qwen_path, dir, bin, dir);
    CHECK(rc == 0 && strstr(out, "\"pooling\": \"last\"") && strstr(out, "\"dim\": 256"), "cairn embed (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s embed -m %s/tiny.gguf 'Hello'", bin, dir);
    CHECK(rc == 1 && strstr(out, "not an embedding model"), "cairn embed of a generative model (%d): %s", rc, out);

    /* Bench reports the roofline. */
    rc = run(out, sizeof out, "%s bench -m %s/tiny.gguf -p 16 -n 8 -r 1 --batch-curve 2 --bandwidth-mib 64 -t 1", bin, dir);
    CHECK(rc == 0 && strstr(out, "roofline") && strstr(out, "pp16") && strstr(out, "B= 2") &&
              strstr(out, "8 streams+prefetch") && strstr(out, "GB/s; bandwidth beside"),
          "bench (%d): %s", rc, out);
    /* ... and where a decode step goes (a profiled run after the timed ones): its phases,
     * their jobs and barrier waits. */
    CHECK(strstr(out, "a profiled run of the same 8 steps") &&
              strstr(out, "step breakdown (per token, 8 tokens, 1 threads)") && strstr(out, "\n  qkv ") &&
              strstr(out, "\n  head ") && strstr(out, "fastest step's breakdown") && strstr(out, "threads' time:"),
          "bench's step breakdown: %s", out);
    /* The batch curve after a context of its own in every sequence. */
    rc = run(out, sizeof out, "%s bench -m %s/tiny.gguf -p 0 -n 0 -r 1 --batch-curve 3 --batch-depth 40 "
             "--bandwidth-mib 64 -t 1", bin, dir);
    CHECK(rc == 0 && strstr(out, "B= 3 @ batch depth") && strstr(out, "each after its own context"),
          "bench --batch-depth (%d): %s", rc, out);
    /* Speculation's bench prints the draft's share of the bytes a step reads beside c, and
     * where each decode's time went (forwards against the probes, and the rest). */
    rc = run(out, sizeof out, "%s bench -m %s/tiny.gguf --draft %s/draft.gguf --draft-tokens 2 -p 8 -n 8 -r 1 -t 1",
             bin, dir, dir);
    CHECK(rc == 0 && strstr(out, "the draft's share") && strstr(out, "c / share") &&
              strstr(out, "plain decode") && strstr(out, "outside the forwards") &&
              strstr(strstr(out, "speculative decode") ? strstr(out, "speculative decode") : "", "draft forwards"),
          "bench --draft (%d): %s", rc, out);
    /* The pipelined bench: a ring of 2 ranks on loopback, one and two micro-batches. */
    rc = run(out, sizeof out, "%s bench -m %s/tiny.gguf --ranks 2 -t 1 -p 4 -n 6 --streams 3", bin, dir);
    CHECK(rc == 0 && strstr(out, "| one slice, 2 threads |") && strstr(out, "1 micro-batch |") &&
              strstr(out, "2 micro-batches |") && strstr(out, "rank 1 "), "bench --ranks (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s bench -m %s/tiny.gguf --ranks 1", bin, dir);
    CHECK(rc == 2 && strstr(out, "--ranks"), "bench --ranks 1 (%d): %s", rc, out);

    /* Errors a user can cause: clear messages and exit codes, never a crash. */
    rc = run(out, sizeof out, "%s generate -m %s/missing.gguf --tokens 1", bin, dir);
    CHECK(rc == 1 && strstr(out, "missing.gguf") && strstr(out, "No such file"), "missing model (%d): %s", rc, out);
    rc = run(out, sizeof out, "head -c 5000 %s/tiny.gguf > %s/cut.gguf && %s generate -m %s/cut.gguf --tokens 1", dir, dir, bin, dir);
    CHECK(rc == 1 && strstr(out, "offset"), "truncated model (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf --tokens 1,2 -n 5000 -c 256", bin, dir);
    CHECK(rc == 2 && strstr(out, "does not fit the context"), "context overflow (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf --tokens 1,99999999", bin, dir);
    CHECK(rc == 2 && strstr(out, "outside the vocabulary"), "bad token (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s generate -m %s/tiny.gguf --tokens 1 --temp abc", bin, dir);
    CHECK(rc == 2 && strstr(out, "--temp"), "bad number (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s mkmodel --shape nope --vocab %s -o %s/x.gguf", bin, spm_path, dir);
    CHECK(rc == 2 && strstr(out, "unknown shape"), "unknown shape (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s mkmodel --shape tiny --type iq2_xxs --vocab %s -o %s/x.gguf", bin, spm_path, dir);
    CHECK(rc == 1 && strstr(out, "iq2_xxs"), "unsupported type (%d): %s", rc, out);
    rc = run(out, sizeof out, "%s nonsense", bin);
    CHECK(rc == 2 && strstr(out, "unknown command"), "unknown command (%d): %s", rc, out);

    run(out, sizeof out, "rm -rf %s", dir);
    return test_main_end();
}
