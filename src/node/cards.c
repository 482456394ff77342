/* The built-in catalog (cards.h): popular instruct models of the architectures cairn
 * runs, as GGUF repos on the hub. Shapes are the models' own (their config.json);
 * sizes are estimates from the parameter count and each quantization's bits per weight
 * as llama.cpp's quantizer mixes them (the exact bytes come from the hub's listing at
 * pull time, and /instance/previews reads them from the file's header). */
#define _GNU_SOURCE /* strcasestr */
#include "node/cards.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Bits per weight of a quantization mix, file-wide (embeddings and head included), as
 * llama.cpp's quantize reports them for 7-8B models. */
static const struct {
    const char *tag;
    double bpw;
} mixes[] = {
    {"Q4_K_M", 4.89}, {"Q5_K_M", 5.70}, {"Q6_K", 6.56}, {"Q8_0", 8.50}, {"F16", 16.0},
};

static const struct card cards[] = {
    {"Llama 3.2 1B Instruct", "bartowski/Llama-3.2-1B-Instruct-GGUF", "llama", 1.24, 16, 2048, 131072, "llama3.2", false},
    {"Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF", "llama", 3.21, 28, 3072, 131072, "llama3.2", false},
    {"Llama 3.1 8B Instruct", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "llama", 8.03, 32, 4096, 131072, "llama3.1", false},
    {"Llama 3.3 70B Instruct", "bartowski/Llama-3.3-70B-Instruct-GGUF", "llama", 70.6, 80, 8192, 131072, "llama3.3", false},
    {"Qwen2.5 0.5B Instruct", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2", 0.49, 24, 896, 32768, "apache-2.0", false},
    {"Qwen2.5 1.5B Instruct", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "qwen2", 1.54, 28, 1536, 32768, "apache-2.0", false},
    {"Qwen2.5 3B Instruct", "Qwen/Qwen2.5-3B-Instruct-GGUF", "qwen2", 3.09, 36, 2048, 32768, "qwen-research", false},
    {"Qwen2.5 7B Instruct", "bartowski/Qwen2.5-7B-Instruct-GGUF", "qwen2", 7.62, 28, 3584, 32768, "apache-2.0", false},
    {"Qwen2.5 14B Instruct", "bartowski/Qwen2.5-14B-Instruct-GGUF", "qwen2", 14.8, 48, 5120, 32768, "apache-2.0", false},
    {"Qwen2.5 32B Instruct", "bartowski/Qwen2.5-32B-Instruct-GGUF", "qwen2", 32.8, 64, 5120, 32768, "apache-2.0", false},
    {"Qwen2.5 72B Instruct", "bartowski/Qwen2.5-72B-Instruct-GGUF", "qwen2", 72.7, 80, 8192, 32768, "qwen", false},
    {"Qwen2.5 Coder 7B Instruct", "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "qwen2", 7.62, 28, 3584, 32768, "apache-2.0", false},
    {"Qwen2.5 Coder 32B Instruct", "bartowski/Qwen2.5-Coder-32B-Instruct-GGUF", "qwen2", 32.8, 64, 5120, 32768, "apache-2.0", false},
    {"Qwen3 0.6B", "Qwen/Qwen3-0.6B-GGUF", "qwen3", 0.60, 28, 1024, 40960, "apache-2.0", false},
    {"Qwen3 1.7B", "Qwen/Qwen3-1.7B-GGUF", "qwen3", 1.72, 28, 2048, 40960, "apache-2.0", false},
    {"Qwen3 4B", "Qwen/Qwen3-4B-GGUF", "qwen3", 4.02, 36, 2560, 40960, "apache-2.0", false},
    {"Qwen3 8B", "Qwen/Qwen3-8B-GGUF", "qwen3", 8.19, 36, 4096, 40960, "apache-2.0", false},
    {"Qwen3 14B", "Qwen/Qwen3-14B-GGUF", "qwen3", 14.8, 40, 5120, 40960, "apache-2.0", false},
    {"Qwen3 32B", "Qwen/Qwen3-32B-GGUF", "qwen3", 32.8, 64, 5120, 40960, "apache-2.0", false},
};

size_t cards_count(void) { return sizeof cards / sizeof cards[0]; }

const struct card *cards_at(size_t i) { return i < cards_count() ? &cards[i] : NULL; }

/* Whether every word of q (split at spaces) is in the card's name, repo or architecture,
 * ignoring case. */
static bool matches(const struct card *c, const char *q)
{
    char word[64];
    for (const char *p = q; *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (!n)
            break;
        snprintf(word, sizeof word, "%.*s", (int)(n < sizeof word ? n : sizeof word - 1), p);
        p += n;
        if (!strcasestr(c->name, word) && !strcasestr(c->repo, word) && strcasecmp(c->arch, word))
            return false;
    }
    return true;
}

json_t *card_to_json(const struct card *c)
{
    json_t *quants = json_array();
    for (size_t i = 0; quants && i < sizeof mixes / sizeof mixes[0]; i++) {
        char ref[160];
        snprintf(ref, sizeof ref, "hf.co/%s:%s", c->repo, mixes[i].tag);
        json_array_append_new(quants, json_pack("{s:s, s:s, s:I}", "tag", mixes[i].tag, "ref", ref, "approx_bytes",
                                                (json_int_t)(c->params_b * 1e9 * mixes[i].bpw / 8.0)));
    }
    return json_pack("{s:s, s:s, s:s, s:f, s:i, s:i, s:I, s:s, s:b, s:o}", "name", c->name, "repo", c->repo, "arch",
                     c->arch, "params_b", c->params_b, "n_layers", c->n_layers, "hidden_size", c->n_embd,
                     "context_length", (json_int_t)c->n_ctx, "license", c->license, "gated", c->gated, "quants",
                     quants);
}

json_t *cards_search(const char *q, size_t limit)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < cards_count() && json_array_size(out) < limit; i++)
        if (!q || !q[0] || matches(&cards[i], q))
            json_array_append_new(out, card_to_json(&cards[i]));
    return out;
}
