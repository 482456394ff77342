#include "model/synth.h"

#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "kern/kern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Gemma 3's chat template (google/gemma-3-*-it), text parts only. */
static const char gemma3_template[] =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n";

/* Phi-3's chat template (microsoft/Phi-3-mini-4k-instruct). */
static const char phi3_template[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif "
    "message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

/* A harmony chat template in the form of gpt-oss's (openai/gpt-oss-*), text parts only: a
 * system message with the channels, system messages as the developer's instructions,
 * assistant messages on the final channel, the generation prompt <|start|>assistant. */
static const char harmony_template[] =
    "{{- '<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>' -}}\n"
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] == 'system' or message['role'] == 'developer' -%}\n"
    "        {{- '<|start|>developer<|message|># Instructions\n\n' + message['content'] + '<|end|>' -}}\n"
    "    {%- elif message['role'] == 'assistant' -%}\n"
    "        {{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' -}}\n"
    "    {%- else -%}\n"
    "        {{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|start|>assistant' -}}\n"
    "{%- endif -%}\n";

/* The harmony format's control tokens, appended to the qwen2 vocabulary by the gpt-oss
 * shapes (gpt-oss's own o200k_harmony vocabulary is not in the test data). */
static const char *const harmony_tokens[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                              "<|constrain|>", "<|return|>", "<|call|>"};

static const struct {
    const char *name;
    struct synth_spec spec;
} shapes[] = {
    /* ≈ stories15M */
    {"tiny", {.arch = "llama", .n_layers = 6, .n_embd = 288, .n_ff = 768, .n_head = 6, .n_head_kv = 6,
              .n_ctx = 2048, .rope_base = 10000, .norm_eps = 1e-5f, .tied = 1}},
    /* ≈ stories110M */
    {"small", {.arch = "llama", .n_layers = 12, .n_embd = 768, .n_ff = 2048, .n_head = 12, .n_head_kv = 12,
               .n_ctx = 2048, .rope_base = 10000, .norm_eps = 1e-5f, .tied = 1}},
    /* ≈ Llama-3.2-1B */
    {"llama-1b", {.arch = "llama", .n_layers = 16, .n_embd = 2048, .n_ff = 8192, .n_head = 32, .n_head_kv = 8,
                  .n_ctx = 131072, .rope_base = 500000, .norm_eps = 1e-5f, .tied = 1, .llama3_rope = 1}},
    /* ≈ Llama-3.1-8B */
    {"llama-8b", {.arch = "llama", .n_layers = 32, .n_embd = 4096, .n_ff = 14336, .n_head = 32, .n_head_kv = 8,
                  .n_ctx = 131072, .rope_base = 500000, .norm_eps = 1e-5f, .tied = 0, .llama3_rope = 1}},
    /* ≈ Qwen2.5-0.5B */
    {"qwen-0.5b", {.arch = "qwen2", .n_layers = 24, .n_embd = 896, .n_ff = 4864, .n_head = 14, .n_head_kv = 2,
                   .n_ctx = 32768, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1}},
    /* ≈ Qwen3-0.6B */
    {"qwen3-0.6b", {.arch = "qwen3", .n_layers = 28, .n_embd = 1024, .n_ff = 3072, .n_head = 16, .n_head_kv = 8,
                    .head_dim = 128, .n_ctx = 40960, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1}},
    /* ≈ Qwen3-Embedding-0.6B: Qwen3-0.6B's body, last-token pooling, EOS appended */
    {"qwen3-embed-0.6b", {.arch = "qwen3", .n_layers = 28, .n_embd = 1024, .n_ff = 3072, .n_head = 16,
                          .n_head_kv = 8, .head_dim = 128, .n_ctx = 32768, .rope_base = 1000000, .norm_eps = 1e-6f,
                          .tied = 1, .pooling = 3, .add_eos = 1}},
    /* Qwen3-Embedding's structure at a test size */
    {"qwen3-embed-tiny", {.arch = "qwen3", .n_layers = 4, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2,
                          .head_dim = 64, .n_ctx = 4096, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                          .pooling = 3, .add_eos = 1}},
    /* Qwen3-30B-A3B's structure at a test size: 8 experts, 2 per token */
    {"qwen3moe-tiny", {.arch = "qwen3moe", .n_layers = 4, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2,
                       .head_dim = 64, .n_ctx = 4096, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 0,
                       .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256}},
    /* ≈ Qwen3-30B-A3B: 128 experts of 768, 8 per token */
    {"qwen3-30b-a3b", {.arch = "qwen3moe", .n_layers = 48, .n_embd = 2048, .n_ff = 6144, .n_head = 32, .n_head_kv = 4,
                       .head_dim = 128, .n_ctx = 40960, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 0,
                       .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768}},
    /* Mixtral's structure (llama with experts of n_ff) at a test size */
    {"mixtral-tiny", {.arch = "llama", .n_layers = 4, .n_embd = 256, .n_ff = 512, .n_head = 8, .n_head_kv = 4,
                      .n_ctx = 4096, .rope_base = 1000000, .norm_eps = 1e-5f, .tied = 0,
                      .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 512}},
    /* gemma3's structure at a test size: 8 layers (layer 5 global, the others sliding), a
     * window of 24 positions (not a multiple of a KV block) */
    {"gemma3-tiny", {.arch = "gemma3", .n_layers = 8, .n_embd = 256, .n_ff = 768, .n_head = 4, .n_head_kv = 1,
                     .head_dim = 64, .n_ctx = 8192, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                     .swa_window = 24, .chat_template = gemma3_template}},
    /* ≈ gemma-3-1b */
    {"gemma3-1b", {.arch = "gemma3", .n_layers = 26, .n_embd = 1152, .n_ff = 6912, .n_head = 4, .n_head_kv = 1,
                   .head_dim = 256, .n_ctx = 32768, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                   .swa_window = 512, .chat_template = gemma3_template}},
    /* ≈ gemma-3-4b (text) */
    {"gemma3-4b", {.arch = "gemma3", .n_layers = 34, .n_embd = 2560, .n_ff = 10240, .n_head = 8, .n_head_kv = 4,
                   .head_dim = 256, .n_ctx = 131072, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                   .linear_factor = 8.0f, .swa_window = 1024, .chat_template = gemma3_template}},
    /* phi3's structure (fused qkv and gate/up) at a test size */
    {"phi3-tiny", {.arch = "phi3", .n_layers = 4, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 4,
                   .n_ctx = 4096, .rope_base = 10000, .norm_eps = 1e-5f, .tied = 0, .swa_window = 2047,
                   .chat_template = phi3_template}},
    /* gpt-oss's structure at a test size: 4 layers (0 and 2 sliding over 24 positions), 8
     * experts, 4 per token, YaRN factor 32 over 128 positions */
    {"gpt-oss-tiny", {.arch = "gpt-oss", .n_layers = 4, .n_embd = 256, .n_ff = 256, .n_head = 4, .n_head_kv = 2,
                      .head_dim = 64, .n_ctx = 4096, .rope_base = 150000, .norm_eps = 1e-5f, .tied = 0,
                      .yarn_factor = 32.0f, .swa_window = 24, .n_expert = 8, .n_expert_used = 4, .n_ff_exp = 256,
                      .chat_template = harmony_template, .extra_tokens = harmony_tokens, .n_extra_tokens = 7}},
    /* ≈ gpt-oss-20b (openai/gpt-oss-20b's config; the qwen2 vocabulary, not o200k_harmony's
     * 201088 tokens) */
    {"gpt-oss-20b", {.arch = "gpt-oss", .n_layers = 24, .n_embd = 2880, .n_ff = 2880, .n_head = 64, .n_head_kv = 8,
                     .head_dim = 64, .n_ctx = 131072, .rope_base = 150000, .norm_eps = 1e-5f, .tied = 0,
                     .yarn_factor = 32.0f, .swa_window = 128, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880,
                     .chat_template = harmony_template, .extra_tokens = harmony_tokens, .n_extra_tokens = 7}},
    /* ≈ Phi-3-mini-4k-instruct */
    {"phi3-mini", {.arch = "phi3", .n_layers = 32, .n_embd = 3072, .n_ff = 8192, .n_head = 32, .n_head_kv = 32,
                   .n_ctx = 4096, .rope_base = 10000, .norm_eps = 1e-5f, .tied = 0, .swa_window = 2047,
                   .chat_template = phi3_template}},
};

int synth_shape(const char *name, struct synth_spec *spec)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, name)) {
            char type[sizeof spec->type];
            memcpy(type, spec->type, sizeof type);
            uint64_t seed = spec->seed;
            *spec = shapes[i].spec;
            memcpy(spec->type, type, sizeof type);
            spec->seed = seed;
            if (!spec->head_dim)
                spec->head_dim = spec->n_embd / spec->n_head;
            return 0;
        }
    return CAIRN_ENOTFOUND;
}

const char *synth_shape_names(void)
{
    return "tiny, small, llama-1b, llama-8b, qwen-0.5b, qwen3-0.6b, qwen3-embed-0.6b, qwen3-embed-tiny, "
           "qwen3moe-tiny, qwen3-30b-a3b, mixtral-tiny, gemma3-tiny, gemma3-1b, gemma3-4b, phi3-tiny, phi3-mini, "
           "gpt-oss-tiny, gpt-oss-20b";
}

/* llama.cpp gives more bits to some layers' attn_v and ffn_down in *_M mixes. */
static int more_bits(int layer, int n_layers)
{
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

static int k_fallback(int type, int64_t row_len)
{
    if (row_len % 256 == 0)
        return type;
    switch (type) {
    case DT_Q4_K: return DT_Q5_0;
    case DT_Q5_K: return DT_Q5_1;
    case DT_Q6_K: return DT_Q8_0;
    case DT_Q2_K: case DT_Q3_K: return DT_Q4_0;
    case DT_IQ4_XS: return DT_IQ4_NL;
    default: return type;
    }
}

int synth_tensor_type(const struct synth_spec *spec, const char *tensor, int layer, int64_t row_len)
{
    bool is_head = !strcmp(tensor, "output.weight") || (spec->tied && !strcmp(tensor, "token_embd.weight"));
    bool more = strstr(tensor, "attn_v.weight") || strstr(tensor, "ffn_down.weight") ||
                strstr(tensor, "ffn_down_exps.weight");
    int type;
    if (!strcmp(spec->arch, "gpt-oss") && !strcmp(spec->type, "mxfp4")) /* llama.cpp's MXFP4_MOE mix */
        return strstr(tensor, "_exps.weight") ? DT_MXFP4 : DT_Q8_0;
    if (!strcmp(spec->type, "q4_k_m") || !strcmp(spec->type, "q5_k_m")) {
        int base = spec->type[1] == '4' ? DT_Q4_K : DT_Q5_K;
        type = is_head || (more && layer >= 0 && more_bits(layer, spec->n_layers)) ? DT_Q6_K : base;
    } else if (!strcmp(spec->type, "q4_k_s")) {
        type = is_head ? DT_Q6_K : DT_Q4_K;
    } else {
        type = dtype_from_name(spec->type);
        const struct dtype_info *ti = dtype_info(type);
        if (type < 0 || !ti || !ti->supported)
            return -1;
    }
    return k_fallback(type, row_len);
}

/* llama.cpp's general.file_type numbering, for tools that show it. */
static int file_type(const char *type)
{
    static const struct { const char *name; int ftype; } map[] = {
        {"f32", 0}, {"f16", 1}, {"q4_0", 2}, {"q4_1", 3}, {"q8_0", 7}, {"q5_0", 8}, {"q5_1", 9},
        {"q4_k_s", 14}, {"q4_k_m", 15}, {"q5_k_m", 17}, {"q6_k", 18}, {"bf16", 32},
        {"q2_k", 10}, {"q3_k", 12}, {"iq4_nl", 25}, {"iq4_xs", 30}, {"mxfp4", 38},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, type))
            return map[i].ftype;
    return -1;
}

/* ---- random weights ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *s)
{
    uint64_t h = seed ^ 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return mix64(h);
}

/* Approximately normal (sum of four uniforms, unit variance), cheap enough for 8e9 draws. */
static float rand_normal(uint64_t *state)
{
    uint64_t r = mix64(*state += 0x9e3779b97f4a7c15ull);
    float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (s / 65536.0f - 2.0f) * 1.7320508f;
}

enum fill_kind { FILL_NORMAL, FILL_NORM_WEIGHT, FILL_ROPE_FREQS, FILL_ZERO, FILL_ONES, FILL_SCRIPT_HEAD };

struct script {
    const int32_t *next;  /* next[t] or -1 */
    int n_next;
    int embd_type;        /* type of token_embd, to rebuild its rows as the engine reads them */
    /* Predecessors of each token u: pred[pred_start[u] .. pred_start[u + 1]) are the t with
     * next[t] == u, in increasing order (so a head row is built without scanning next[]). */
    int32_t *pred_start, *pred;
};

struct tensor_fill {
    char name[96];
    int type;
    int64_t rows, cols;
    enum fill_kind kind;
    float scale;
    const struct synth_spec *spec;
    const struct script *script;
};

static void llama3_freq_factors(const struct synth_spec *s, float *out, int64_t n)
{
    const double factor = 32.0, low = 1.0, high = 4.0, orig = 8192.0;
    for (int64_t i = 0; i < n; i++) {
        double freq = pow(s->rope_base, -2.0 * (double)i / (double)s->head_dim);
        double wavelen = 2.0 * M_PI / freq;
        double f;
        if (wavelen < orig / high)
            f = 1.0;
        else if (wavelen > orig / low)
            f = factor;
        else {
            double smooth = (orig / wavelen - low) / (high - low);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        out[i] = (float)f;
    }
}

/* Row r of a random tensor; each row has its own stream so rows can be rebuilt alone. */
static void random_row(const struct tensor_fill *t, const char *name, int64_t r, float *row)
{
    uint64_t state = hash_name(t->spec->seed, name) ^ mix64((uint64_t)r + 1);
    for (int64_t c = 0; c < t->cols; c++) {
        float v = rand_normal(&state) * t->scale;
        row[c] = t->kind == FILL_NORM_WEIGHT ? 1.0f + v : v;
    }
}

/* Head row u of a script model: the sum over tokens t with next[t] == u of t's final
 * normed hidden state (its embedding, RMS-normed), scaled so the logit of next[t] is
 * about 20 and others about 20/sqrt(n_embd) each. */
static int script_head_row(const struct tensor_fill *t, int64_t u, float *row, float *tmp, void *qbuf)
{
    memset(row, 0, (size_t)t->cols * sizeof *row);
    const struct script *sc = t->script;
    struct tensor_fill emb = *t;
    emb.kind = FILL_NORMAL;
    emb.scale = 0.02f;
    for (int32_t k = sc->pred_start[u]; k < sc->pred_start[u + 1]; k++) {
        int tok = sc->pred[k];
        random_row(&emb, "token_embd.weight", tok, tmp);
        int rc = kern_quantize_row(sc->embd_type, tmp, qbuf, t->cols);
        if (rc)
            return rc;
        kern_dequantize_row(sc->embd_type, qbuf, tmp, t->cols);
        double ss = 0;
        for (int64_t c = 0; c < t->cols; c++)
            ss += (double)tmp[c] * tmp[c];
        float inv_rms = (float)(1.0 / sqrt(ss / (double)t->cols + t->spec->norm_eps));
        for (int64_t c = 0; c < t->cols; c++)
            row[c] += tmp[c] * inv_rms * (20.0f / (float)t->cols);
    }
    return 0;
}

static int fill_tensor(void *ctx, void *buf, uint64_t size)
{
    struct tensor_fill *t = ctx;
    int64_t row_bytes = dtype_row_bytes(t->type, t->cols);
    if (row_bytes < 0 || (uint64_t)(row_bytes * t->rows) != size)
        return CAIRN_EINVAL;
    float *row = malloc((size_t)t->cols * sizeof(float) * 2);
    void *qbuf = malloc((size_t)t->cols * 4 + 64);
    int rc = row && qbuf ? 0 : CAIRN_ENOMEM;
    for (int64_t r = 0; r < t->rows && !rc; r++) {
        switch (t->kind) {
        case FILL_ROPE_FREQS: llama3_freq_factors(t->spec, row, t->cols); break;
        case FILL_ZERO: memset(row, 0, (size_t)t->cols * sizeof *row); break;
        case FILL_ONES: for (int64_t c = 0; c < t->cols; c++) row[c] = 1.0f; break;
        case FILL_SCRIPT_HEAD: rc = script_head_row(t, r, row, row + t->cols, qbuf); break;
        default: random_row(t, t->name, r, row); break;
        }
        if (!rc)
            rc = kern_quantize_row(t->type, row, (char *)buf + r * row_bytes, t->cols);
    }
    free(row);
    free(qbuf);
    return rc;
}

struct writer_ctx {
    struct gguf_writer *w;
    struct tensor_fill *fills;
    int n_fills, cap;
    const struct synth_spec *spec;
    struct script *script;
    char *err;
    size_t errlen;
};

static int add(struct writer_ctx *c, const char *name, int layer, int64_t rows, int64_t cols,
               enum fill_kind kind, float scale)
{
    if (c->n_fills == c->cap)
        return CAIRN_EINVAL;
    struct tensor_fill *t = &c->fills[c->n_fills++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->kind = kind;
    t->scale = scale;
    t->spec = c->spec;
    t->script = c->script;
    /* vectors, biases (gpt-oss's experts': a row per expert) and routers stay F32 */
    t->type = rows == 1 || strstr(name, ".bias") || strstr(name, "ffn_gate_inp.weight")
                  ? DT_F32
                  : synth_tensor_type(c->spec, name, layer, cols);
    if (c->script && !strcmp(name, "token_embd.weight"))
        c->script->embd_type = t->type;
    if (c->script && (strstr(name, "attn_output.weight") || strstr(name, "ffn_down.weight")))
        t->kind = FILL_ZERO; /* the residual stream keeps the current token's embedding */
    if (c->script && !strcmp(name, "output_norm.weight"))
        t->kind = FILL_ONES;
    if (c->script && !strcmp(name, "output.weight"))
        t->kind = FILL_SCRIPT_HEAD;
    if (t->type < 0)
        return cairn_fail(c->err, c->errlen, CAIRN_EINVAL, "unknown or unsupported type '%s'", c->spec->type);
    int64_t ne[2] = {cols, rows};
    int rc = gguf_writer_add_tensor(c->w, t->name, t->type, rows == 1 ? 1 : 2, ne, NULL, fill_tensor, t);
    if (rc)
        return cairn_fail(c->err, c->errlen, rc, "cannot add tensor %s (%s, row of %lld)", name,
                          dtype_name(t->type), (long long)cols);
    return 0;
}

/* A phi3 layer: attn_qkv holds q, k and v's rows, ffn_up the gate's rows then the up's. */
static int add_fused_layer(struct writer_ctx *c, int il, float w, float w_out)
{
    const struct synth_spec *s = c->spec;
    int64_t q_dim = (int64_t)s->n_head * s->head_dim, kv_dim = (int64_t)s->n_head_kv * s->head_dim;
    char t[96];
    int rc;
#define T(suffix) (snprintf(t, sizeof t, "blk.%d.%s", il, suffix), t)
    if ((rc = add(c, T("attn_norm.weight"), il, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f)) ||
        (rc = add(c, T("attn_qkv.weight"), il, q_dim + 2 * kv_dim, s->n_embd, FILL_NORMAL, w)) ||
        (rc = add(c, T("attn_output.weight"), il, s->n_embd, q_dim, FILL_NORMAL, w_out)) ||
        (rc = add(c, T("ffn_norm.weight"), il, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f)) ||
        (rc = add(c, T("ffn_up.weight"), il, 2 * (int64_t)s->n_ff, s->n_embd, FILL_NORMAL, w)) ||
        (rc = add(c, T("ffn_down.weight"), il, s->n_embd, s->n_ff, FILL_NORMAL, w_out)))
        return rc;
#undef T
    return 0;
}


/* A 3-D expert tensor: n_exp matrices of rows x cols, GGUF shape [cols, rows, n_exp]. */
static int add_exps(struct writer_ctx *c, const char *name, int layer, int64_t rows, int64_t cols, int n_exp,
                    float scale)
{
    if (c->n_fills == c->cap)
        return CAIRN_EINVAL;
    struct tensor_fill *t = &c->fills[c->n_fills++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows * n_exp; /* filled row by row over all experts */
    t->cols = cols;
    t->kind = c->script ? FILL_ZERO : FILL_NORMAL;
    t->scale = scale;
    t->spec = c->spec;
    t->script = c->script;
    t->type = synth_tensor_type(c->spec, name, layer, cols);
    if (t->type < 0)
        return cairn_fail(c->err, c->errlen, CAIRN_EINVAL, "unknown or unsupported type '%s'", c->spec->type);
    int64_t ne[3] = {cols, rows, n_exp};
    int rc = gguf_writer_add_tensor(c->w, t->name, t->type, 3, ne, NULL, fill_tensor, t);
    if (rc)
        return cairn_fail(c->err, c->errlen, rc, "cannot add tensor %s (%s, row of %lld)", name,
                          dtype_name(t->type), (long long)cols);
    return 0;
}

/* A layer's mixture of experts: the router (F32, as llama.cpp's quantizer leaves it) and
 * the experts. */
static int add_moe(struct writer_ctx *c, int il, float w_out)
{
    const struct synth_spec *s = c->spec;
    const float w = 0.02f;
    char t[96];
    int rc;
#define T(suffix) (snprintf(t, sizeof t, "blk.%d.%s", il, suffix), t)
    if ((rc = add(c, T("ffn_gate_inp.weight"), il, s->n_expert, s->n_embd, FILL_NORMAL, 0.02f)) ||
        (rc = add_exps(c, T("ffn_gate_exps.weight"), il, s->n_ff_exp, s->n_embd, s->n_expert, 0.02f)) ||
        (rc = add_exps(c, T("ffn_up_exps.weight"), il, s->n_ff_exp, s->n_embd, s->n_expert, 0.02f)) ||
        (rc = add_exps(c, T("ffn_down_exps.weight"), il, s->n_embd, s->n_ff_exp, s->n_expert, w_out)))
        return rc;
    /* gpt-oss's biases: the experts' gate and up biases wide enough (sd 3) that the clamps of
     * its SwiGLU at 7 act on a few percent of the values, as they do in the real model */
    if (!strcmp(s->arch, "gpt-oss") &&
        ((rc = add(c, T("ffn_gate_inp.bias"), il, 1, s->n_expert, FILL_NORMAL, 0.5f)) ||
         (rc = add(c, T("ffn_gate_exps.bias"), il, s->n_expert, s->n_ff_exp, c->script ? FILL_ZERO : FILL_NORMAL, 3.0f)) ||
         (rc = add(c, T("ffn_up_exps.bias"), il, s->n_expert, s->n_ff_exp, c->script ? FILL_ZERO : FILL_NORMAL, 3.0f)) ||
         (rc = add(c, T("ffn_down_exps.bias"), il, s->n_expert, s->n_embd, c->script ? FILL_ZERO : FILL_NORMAL, w))))
        return rc;
#undef T
    return 0;
}

/* The vocabulary's tokens, types and scores with extra control tokens appended. */
static int extend_vocab(struct gguf_writer *w, const struct gguf_file *v, const struct synth_spec *s, char *err,
                        size_t errlen)
{
    struct gguf_array toks, types, scores;
    bool has_types = gguf_get_arr(v, "tokenizer.ggml.token_type", &types) == 0;
    bool has_scores = gguf_get_arr(v, "tokenizer.ggml.scores", &scores) == 0;
    if (gguf_get_arr(v, "tokenizer.ggml.tokens", &toks) || (has_types && types.n != toks.n) ||
        (has_scores && scores.n != toks.n))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "the vocabulary's tokens, types and scores do not agree");
    uint64_t n = toks.n + (uint64_t)s->n_extra_tokens;
    const char **strs = malloc(n * sizeof *strs);
    uint64_t *lens = malloc(n * sizeof *lens);
    int32_t *tt = malloc(n * sizeof *tt);
    float *sc = malloc(n * sizeof *sc);
    int rc = strs && lens && tt && sc ? 0 : cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    for (uint64_t i = 0; !rc && i < n; i++) {
        bool extra = i >= toks.n;
        struct gguf_str t = extra ? (struct gguf_str){0} : gguf_arr_str(v, &toks, i);
        strs[i] = extra ? s->extra_tokens[i - toks.n] : t.ptr;
        lens[i] = extra ? strlen(strs[i]) : t.len;
        tt[i] = extra ? 3 /* CONTROL */ : has_types ? (int32_t)gguf_arr_int(&types, i) : 1;
        sc[i] = extra ? 0.0f : has_scores ? (float)gguf_arr_float(&scores, i) : 0.0f;
    }
    if (!rc && ((rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, n)) ||
                (rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, tt, n)) ||
                (has_scores && (rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, sc, n)))))
        cairn_fail(err, errlen, rc, "cannot write the extended vocabulary");
    free(strs);
    free(lens);
    free(tt);
    free(sc);
    return rc;
}

/* Whether the vocabulary already holds every extra token (o200k_harmony has the harmony
 * format's own): then none is appended. */
static bool vocab_has_extra(const struct gguf_file *v, const struct synth_spec *s)
{
    struct gguf_array toks;
    if (gguf_get_arr(v, "tokenizer.ggml.tokens", &toks))
        return false;
    int found = 0;
    for (uint64_t i = 0; i < toks.n; i++) {
        struct gguf_str t = gguf_arr_str(v, &toks, i);
        for (int k = 0; k < s->n_extra_tokens; k++)
            found += t.len == strlen(s->extra_tokens[k]) && !memcmp(t.ptr, s->extra_tokens[k], t.len);
    }
    return found >= s->n_extra_tokens;
}

int synth_extra_tokens_added(const struct synth_spec *s, const struct gguf_file *v)
{
    return s->n_extra_tokens > 0 && !vocab_has_extra(v, s) ? s->n_extra_tokens : 0;
}

static int copy_vocab(struct gguf_writer *w, const char *vocab_path, const struct synth_spec *spec, int *n_vocab,
                      char *err, size_t errlen)
{
    static const char *const replaced[] = {"tokenizer.chat_template", "tokenizer.ggml.tokens",
                                           "tokenizer.ggml.token_type", "tokenizer.ggml.scores"};
    struct gguf_file *v;
    int rc = gguf_open(&v, vocab_path, err, errlen);
    if (rc)
        return rc;
    struct synth_spec own = *spec;
    own.n_extra_tokens = synth_extra_tokens_added(spec, v);
    const struct synth_spec *s = &own;
    for (int64_t i = 0; i < gguf_n_kv(v) && !rc; i++) {
        struct gguf_str key = gguf_kv_key(v, i);
        bool skip = false;
        for (size_t k = 0; k < 4 && !skip; k++)
            skip = (k ? s->n_extra_tokens > 0 : s->chat_template != NULL) && key.len == strlen(replaced[k]) &&
                   !memcmp(key.ptr, replaced[k], key.len);
        if (key.len > 10 && !memcmp(key.ptr, "tokenizer.", 10) && !skip)
            rc = gguf_writer_copy_kv(w, v, i);
    }
    struct gguf_array toks;
    if (!rc && gguf_get_arr(v, "tokenizer.ggml.tokens", &toks) == 0)
        *n_vocab = (int)toks.n + s->n_extra_tokens;
    else if (!rc)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s has no tokenizer.ggml.tokens", vocab_path);
    if (!rc && s->n_extra_tokens > 0)
        rc = extend_vocab(w, v, s, err, errlen);
    gguf_close(v);
    return rc;
}

static int write_model(const struct synth_spec *s, const char *vocab_path, struct script *script, const char *path,
                       char *err, size_t errlen)
{
    if (s->n_layers < 1 || s->n_embd < 1 || s->n_ff < 1 || s->n_head < 1 || s->n_head_kv < 1 ||
        s->n_head % s->n_head_kv || s->head_dim < 2 || s->head_dim % 2)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "inconsistent model dimensions");
    if (synth_tensor_type(s, "blk.0.attn_q.weight", 0, s->n_embd) < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "unknown or unsupported type '%s'", s->type);
    struct writer_ctx c = {.spec = s, .script = script, .err = err, .errlen = errlen};
    int rc = gguf_writer_create(&c.w);
    if (rc)
        return cairn_fail(err, errlen, rc, "out of memory");
    c.cap = 24 * s->n_layers + 8;
    c.fills = calloc((size_t)c.cap, sizeof *c.fills);
    if (!c.fills) {
        gguf_writer_release(c.w);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    const char *a = s->arch;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    gguf_writer_set_str(c.w, "general.architecture", a, strlen(a));
    char name[96];
    /* llama.cpp gives a model named "phi3" the special tokens of Phi-3's own vocabulary,
     * which the test vocabularies lack: the name spells it otherwise */
    snprintf(name, sizeof name, "cairn synthetic %s %s", strcmp(a, "phi3") ? a : "phi 3", s->type);
    gguf_writer_set_str(c.w, "general.name", name, strlen(name));
    if (file_type(s->type) >= 0)
        gguf_writer_set_u32(c.w, "general.file_type", (uint32_t)file_type(s->type));
    gguf_writer_set_u32(c.w, KEY("context_length"), (uint32_t)s->n_ctx);
    gguf_writer_set_u32(c.w, KEY("embedding_length"), (uint32_t)s->n_embd);
    gguf_writer_set_u32(c.w, KEY("block_count"), (uint32_t)s->n_layers);
    gguf_writer_set_u32(c.w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    gguf_writer_set_u32(c.w, KEY("attention.head_count"), (uint32_t)s->n_head);
    gguf_writer_set_u32(c.w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    gguf_writer_set_u32(c.w, KEY("attention.key_length"), (uint32_t)s->head_dim);
    gguf_writer_set_u32(c.w, KEY("attention.value_length"), (uint32_t)s->head_dim);
    gguf_writer_set_u32(c.w, KEY("rope.dimension_count"), (uint32_t)s->head_dim);
    gguf_writer_set_f32(c.w, KEY("rope.freq_base"), s->rope_base);
    gguf_writer_set_f32(c.w, KEY("attention.layer_norm_rms_epsilon"), s->norm_eps);
    if (s->yarn_factor > 1.0f) {
        gguf_writer_set_str(c.w, KEY("rope.scaling.type"), "yarn", 4);
        gguf_writer_set_f32(c.w, KEY("rope.scaling.factor"), s->yarn_factor);
        gguf_writer_set_u32(c.w, KEY("rope.scaling.original_context_length"), (uint32_t)(s->n_ctx / s->yarn_factor));
    }
    if (s->n_expert > 0) {
        bool qwen = !strcmp(a, "qwen3moe") || !strcmp(a, "gpt-oss");
        if ((!qwen && strcmp(a, "llama")) || s->n_expert < 2 || s->n_expert > 1024 || s->n_expert_used < 1 ||
            s->n_expert_used > s->n_expert || (qwen ? s->n_ff_exp < 1 : s->n_ff_exp != s->n_ff)) {
            rc = cairn_fail(err, errlen, CAIRN_EINVAL,
                            "a mixture of experts needs arch qwen3moe, gpt-oss or llama (experts of n_ff), 2..1024 experts "
                            "and 1..n_expert used");
            goto out;
        }
        gguf_writer_set_u32(c.w, KEY("expert_count"), (uint32_t)s->n_expert);
        gguf_writer_set_u32(c.w, KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        if (qwen)
            gguf_writer_set_u32(c.w, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
    } else if (!strcmp(a, "qwen3moe") || !strcmp(a, "gpt-oss")) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "%s needs experts", a);
        goto out;
    }
    if (s->linear_factor > 1.0f) {
        gguf_writer_set_str(c.w, KEY("rope.scaling.type"), "linear", 6);
        gguf_writer_set_f32(c.w, KEY("rope.scaling.factor"), s->linear_factor);
    }
    if (s->swa_window > 0)
        gguf_writer_set_u32(c.w, KEY("attention.sliding_window"), (uint32_t)s->swa_window);
    bool oss = !strcmp(a, "gpt-oss");
    if (oss && s->swa_window <= 0) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "gpt-oss needs a sliding window (--sliding-window W)");
        goto out;
    }
#undef KEY
    int n_vocab = s->vocab_size;
    if (vocab_path) {
        if ((rc = copy_vocab(c.w, vocab_path, s, &n_vocab, err, errlen)))
            goto out;
    } else if (n_vocab < 2) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "a vocabulary file or a vocabulary size is needed");
        goto out;
    }
    if (s->pooling < 0 || s->pooling > 4) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "pooling type %d outside 0..4", s->pooling);
        goto out;
    }
    if (s->pooling > 0) {
        char pkey[64];
        snprintf(pkey, sizeof pkey, "%s.pooling_type", a);
        if ((rc = gguf_writer_set_u32(c.w, pkey, (uint32_t)s->pooling)))
            goto out;
    }
    if (s->add_eos && (rc = gguf_writer_set_bool(c.w, "tokenizer.ggml.add_eos_token", 1)))
        goto out;
    if (s->chat_template &&
        (rc = gguf_writer_set_str(c.w, "tokenizer.chat_template", s->chat_template, strlen(s->chat_template)))) {
        cairn_fail(err, errlen, rc, "cannot write the chat template");
        goto out;
    }
    if (script && script->n_next != n_vocab) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "script table has %d entries, vocabulary %d", script->n_next, n_vocab);
        goto out;
    }

    int64_t q_dim = (int64_t)s->n_head * s->head_dim, kv_dim = (int64_t)s->n_head_kv * s->head_dim;
    const float w = 0.02f; /* the usual initializer scale of these models */
    if ((rc = add(&c, "token_embd.weight", -1, n_vocab, s->n_embd, FILL_NORMAL, w)) ||
        (rc = add(&c, "output_norm.weight", -1, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f)))
        goto out;
    if (!s->tied && (rc = add(&c, "output.weight", -1, n_vocab, s->n_embd, FILL_NORMAL, w)))
        goto out;
    if (s->llama3_rope && (rc = add(&c, "rope_freqs.weight", -1, 1, s->head_dim / 2, FILL_ROPE_FREQS, 0)))
        goto out;
    bool bias = !strcmp(a, "qwen2") || !strcmp(a, "gpt-oss"), qk_norm = !strcmp(a, "qwen3") || !strcmp(a, "qwen3moe");
    if (s->out_scale < 0 || !isfinite(s->out_scale) || s->scale_from < 0) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "output scale %g from layer %d: the scale must be finite and >= 0",
                        (double)s->out_scale, s->scale_from);
        goto out;
    }
    bool gemma = !strcmp(a, "gemma3"), fused = !strcmp(a, "phi3");
    for (int il = 0; il < s->n_layers && !rc && fused; il++)
        rc = add_fused_layer(&c, il, w, s->out_scale > 0 && il >= s->scale_from ? w * s->out_scale : w);
    for (int il = 0; il < s->n_layers && !rc && !fused; il++) {
        char t[96];
        float w_out = s->out_scale > 0 && il >= s->scale_from ? w * s->out_scale : w;
#define T(suffix) (snprintf(t, sizeof t, "blk.%d.%s", il, suffix), t)
        if (gemma && ((rc = add(&c, T("post_attention_norm.weight"), il, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f)) ||
                      (rc = add(&c, T("post_ffw_norm.weight"), il, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f))))
            break;
        /* gpt-oss's FFN norm is named post_attention_norm */
        if ((rc = add(&c, T("attn_norm.weight"), il, 1, s->n_embd, FILL_NORM_WEIGHT, 0.05f)) ||
            (rc = add(&c, T("attn_q.weight"), il, q_dim, s->n_embd, FILL_NORMAL, w)) ||
            (rc = add(&c, T("attn_k.weight"), il, kv_dim, s->n_embd, FILL_NORMAL, w)) ||
            (rc = add(&c, T("attn_v.weight"), il, kv_dim, s->n_embd, FILL_NORMAL, w)) ||
            (rc = add(&c, T("attn_output.weight"), il, s->n_embd, q_dim, FILL_NORMAL, w_out)) ||
            (rc = add(&c, T(oss ? "post_attention_norm.weight" : "ffn_norm.weight"), il, 1, s->n_embd,
                      FILL_NORM_WEIGHT, 0.05f)))
            break;
        /* sinks of sd 1 (a head's sink then takes a visible share of its softmax) */
        if (oss && ((rc = add(&c, T("attn_output.bias"), il, 1, s->n_embd, script ? FILL_ZERO : FILL_NORMAL, w)) ||
                    (rc = add(&c, T("attn_sinks.weight"), il, 1, s->n_head, FILL_NORMAL, 1.0f))))
            break;
        if (s->n_expert > 0 ? (rc = add_moe(&c, il, w_out)) != 0
                            : ((rc = add(&c, T("ffn_gate.weight"), il, s->n_ff, s->n_embd, FILL_NORMAL, w)) ||
                               (rc = add(&c, T("ffn_up.weight"), il, s->n_ff, s->n_embd, FILL_NORMAL, w)) ||
                               (rc = add(&c, T("ffn_down.weight"), il, s->n_embd, s->n_ff, FILL_NORMAL, w_out))))
            break;
        if (bias && ((rc = add(&c, T("attn_q.bias"), il, 1, q_dim, FILL_NORMAL, w)) ||
                     (rc = add(&c, T("attn_k.bias"), il, 1, kv_dim, FILL_NORMAL, w)) ||
                     (rc = add(&c, T("attn_v.bias"), il, 1, kv_dim, FILL_NORMAL, w))))
            break;
        if ((qk_norm || gemma) && ((rc = add(&c, T("attn_q_norm.weight"), il, 1, s->head_dim, FILL_NORM_WEIGHT, 0.05f)) ||
                        (rc = add(&c, T("attn_k_norm.weight"), il, 1, s->head_dim, FILL_NORM_WEIGHT, 0.05f))))
            break;
#undef T
    }
    if (!rc)
        rc = gguf_writer_write(c.w, path, err, errlen);
out:
    gguf_writer_release(c.w);
    free(c.fills);
    return rc;
}

int synth_write(const struct synth_spec *s, const char *vocab_path, const char *path, char *err, size_t errlen)
{
    return write_model(s, vocab_path, NULL, path, err, errlen);
}

int synth_write_script(const struct synth_spec *spec, const char *vocab_path, const int32_t *next, int n_next,
                       const char *path, char *err, size_t errlen)
{
    struct synth_spec s = *spec;
    s.tied = 0; /* the head is built apart from the embeddings */
    struct script sc = {.next = next, .n_next = n_next};
    sc.pred_start = calloc((size_t)n_next + 1, sizeof *sc.pred_start);
    sc.pred = malloc(((size_t)n_next + 1) * sizeof *sc.pred);
    if (!sc.pred_start || !sc.pred) {
        free(sc.pred_start);
        free(sc.pred);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    /* counting sort of the tokens by their successor */
    for (int t = 0; t < n_next; t++)
        if (next[t] >= 0 && next[t] < n_next)
            sc.pred_start[next[t] + 1]++;
    for (int u = 0; u < n_next; u++)
        sc.pred_start[u + 1] += sc.pred_start[u];
    int32_t *fill = malloc(((size_t)n_next + 1) * sizeof *fill);
    if (!fill) {
        free(sc.pred_start);
        free(sc.pred);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    memcpy(fill, sc.pred_start, ((size_t)n_next + 1) * sizeof *fill);
    for (int t = 0; t < n_next; t++)
        if (next[t] >= 0 && next[t] < n_next)
            sc.pred[fill[next[t]]++] = t;
    free(fill);
    int rc = write_model(&s, vocab_path, &sc, path, err, errlen);
    free(sc.pred_start);
    free(sc.pred);
    return rc;
}

int synth_script_next(const int32_t *seq, int64_t n, int32_t *next, int n_vocab, char *err, size_t errlen)
{
    for (int i = 0; i < n_vocab; i++)
        next[i] = -1;
    for (int64_t i = 0; i < n; i++)
        if (seq[i] < 0 || seq[i] >= n_vocab)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "script token %lld: id %d outside the vocabulary of %d",
                              (long long)i, seq[i], n_vocab);
    for (int64_t i = 0; i + 1 < n; i++) {
        int32_t t = seq[i], u = seq[i + 1];
        if (next[t] >= 0 && next[t] != u)
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "script token %lld (id %d) is followed by %d here and by %d earlier: a script model "
                              "continues from the current token only, so each token needs one successor",
                              (long long)i, t, u, next[t]);
        next[t] = u;
    }
    return 0;
}

int synth_write_draft(const char *target_path, int n_layers, const char *path, char *err, size_t errlen)
{
    struct gguf_file *f;
    int rc = gguf_open(&f, target_path, err, errlen);
    if (rc)
        return rc;
    struct gguf_writer *w = NULL;
    struct gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch)) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s has no general.architecture", target_path);
        goto out;
    }
    char key[96];
    snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
    int64_t target_layers;
    if (gguf_get_i64(f, key, &target_layers) || n_layers < 1 || n_layers > target_layers) {
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "draft layers %d outside the target's 1..%lld", n_layers,
                        (long long)target_layers);
        goto out;
    }
    if ((rc = gguf_writer_create(&w)))
        goto out;
    for (int64_t i = 0; i < gguf_n_kv(f) && !rc; i++)
        rc = gguf_writer_copy_kv(w, f, i);
    if (!rc)
        rc = gguf_writer_set_u32(w, key, (uint32_t)n_layers);
    for (int64_t i = 0; i < gguf_n_tensors(f) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        int layer;
        if (sscanf(t->name, "blk.%d.", &layer) == 1 && layer >= n_layers)
            continue;
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL);
    }
    if (rc)
        cairn_fail(err, errlen, rc, "cannot build the draft's tensors");
    else
        rc = gguf_writer_write(w, path, err, errlen);
out:
    gguf_writer_release(w);
    gguf_close(f);
    return rc;
}
