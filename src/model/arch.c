#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "gguf/gguf.h"

static const struct arch_desc archs[] = {
    {.name = "llama", .rope = ROPE_NORMAL, .moe = MOE_OPTIONAL},
    {.name = "qwen2", .rope = ROPE_NEOX, .qkv_bias = true},
    {.name = "qwen3", .rope = ROPE_NEOX, .qk_norm = true},
    {.name = "qwen3moe", .rope = ROPE_NEOX, .qk_norm = true, .moe = MOE_REQUIRED},
    {.name = "gemma3", .rope = ROPE_NEOX, .qk_norm = true, .gemma = true},
    {.name = "phi3", .rope = ROPE_NEOX, .fused = true},
    {.name = "gpt-oss", .rope = ROPE_NEOX, .moe = MOE_REQUIRED, .oss = true},
};

bool model_layer_swa(const struct model_hparams *hp, int il)
{
    return hp->swa_window > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

const struct arch_desc *model_find_arch(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].name, name))
            return &archs[i];
    return NULL;
}

/* Reads "<arch>.<key>" as an integer; absent keys take def (def < 0: required). */
static int arch_int(const struct gguf_file *f, const char *arch, const char *key, int64_t def,
                    int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int rc = gguf_get_i64(f, full, out);
    if (rc == CAIRN_ENOTFOUND) {
        if (def < 0)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s is missing", full);
        *out = def;
        return 0;
    }
    if (rc)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s is not an integer", full);
    if (*out < lo || *out > hi)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s = %lld outside [%lld, %lld]",
                          full, (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

static int arch_float(const struct gguf_file *f, const char *arch, const char *key, float def,
                      float *out, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int rc = gguf_get_f32(f, full, out);
    if (rc == CAIRN_ENOTFOUND) {
        *out = def;
        return 0;
    }
    if (rc || !isfinite(*out) || *out <= 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s is not a positive number", full);
    return 0;
}

/* The experts' counts and sizes. llama.cpp's limits: at most 1024 experts, at least one
 * used when there are experts, never more used than there are. */
static int read_moe(const struct gguf_file *f, const struct arch_desc *a, struct model_hparams *hp, char *err,
                    size_t errlen)
{
    int64_t n_expert, n_used, n_ff_exp;
    int rc;
    if (a->moe == MOE_NEVER)
        return 0;
    if ((rc = arch_int(f, hp->arch, "expert_count", a->moe == MOE_REQUIRED ? -1 : 0, 0, 1024, &n_expert, err,
                       errlen)))
        return rc;
    if (n_expert == 0 && a->moe == MOE_OPTIONAL)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", hp->arch);
    if (n_expert < 2)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s = %lld: a mixture needs at least 2 experts",
                          key, (long long)n_expert);
    if ((rc = arch_int(f, hp->arch, "expert_used_count", -1, 1, n_expert, &n_used, err, errlen)))
        return rc;
    /* llama.cpp: qwen3moe's experts are expert_feed_forward_length wide (n_ff / used
     * without it; gpt-oss needs the key); llama's are feed_forward_length wide. */
    int64_t def = a->oss ? -1 : a->moe == MOE_REQUIRED ? hp->n_ff / n_used : hp->n_ff;
    if (a->moe == MOE_REQUIRED) {
        if ((rc = arch_int(f, hp->arch, "expert_feed_forward_length", def, 1, 1 << 20, &n_ff_exp, err, errlen)))
            return rc;
    } else {
        n_ff_exp = def;
    }
    if (n_ff_exp < 1)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "expert feed-forward length %lld is not positive",
                          (long long)n_ff_exp);
    int norm = 1;
    snprintf(key, sizeof key, "%s.expert_weights_norm", hp->arch);
    rc = gguf_get_bool(f, key, &norm);
    if (rc && rc != CAIRN_ENOTFOUND)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s is not a boolean", key);
    snprintf(key, sizeof key, "%s.expert_gating_func", hp->arch);
    int64_t gating;
    /* gpt-oss: llama.cpp's graph fixes its gating (softmax of the top k) and no renormalisation */
    if (a->oss)
        norm = 0;
    else if (gguf_get_i64(f, key, &gating) == 0 && gating != 1) /* 1: softmax, llama.cpp's numbering */
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s = %lld: only softmax gating (1) is supported",
                          key, (long long)gating);
    snprintf(key, sizeof key, "%s.expert_shared_count", hp->arch);
    int64_t shared;
    if (gguf_get_i64(f, key, &shared) == 0 && shared != 0)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s = %lld: shared experts are not supported",
                          key, (long long)shared);
    hp->n_expert = (int)n_expert;
    hp->n_expert_used = (int)n_used;
    hp->n_ff_exp = (int)n_ff_exp;
    hp->expert_norm = norm != 0;
    return 0;
}

/* gemma3's sliding window, its local RoPE base and the final logit softcap (llama.cpp's
 * reading: no window key or 0, no sliding layers; the pattern defaults to 6). */
static int read_gemma(const struct gguf_file *f, struct model_hparams *hp, char *err, size_t errlen)
{
    hp->gemma = true;
    int64_t v;
    int rc;
    if ((rc = arch_int(f, hp->arch, "attention.sliding_window", 0, 0, (int64_t)1 << 30, &hp->swa_window, err, errlen)))
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch);
    struct gguf_array arr;
    if (gguf_get_arr(f, key, &arr) == 0)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s: a per-layer pattern is not supported", key);
    if ((rc = arch_int(f, hp->arch, "attention.sliding_window_pattern", 6, 1, 4096, &v, err, errlen)))
        return rc;
    hp->swa_pattern = (int)v;
    if ((rc = arch_float(f, hp->arch, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa, err, errlen)))
        return rc;
    /* gemma_pytorch: the 27B model (62 layers) scales queries by n_embd / n_head instead */
    if (hp->n_layers == 62)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    snprintf(key, sizeof key, "%s.final_logit_softcapping", hp->arch);
    if (gguf_get_f32(f, key, &hp->logit_softcap) == CAIRN_ENOTFOUND)
        hp->logit_softcap = 0.0f;
    else if (!isfinite(hp->logit_softcap) || hp->logit_softcap < 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key %s is not a number >= 0", key);
    return 0;
}

/* gpt-oss: the sliding window (required, as llama.cpp reads it), every other layer sliding
 * unless sliding_window_pattern says otherwise, the same RoPE on every layer. Attention
 * scales by 1/sqrt(n_rot) in llama.cpp's graph and its tensors are n_head*n_rot wide:
 * files whose rope dimension differs from the head size are refused. */
static int read_oss(const struct gguf_file *f, struct model_hparams *hp, char *err, size_t errlen)
{
    hp->oss = true;
    int64_t v;
    int rc;
    if ((rc = arch_int(f, hp->arch, "attention.sliding_window", -1, 1, (int64_t)1 << 30, &hp->swa_window, err,
                       errlen)))
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch);
    struct gguf_array arr;
    if (gguf_get_arr(f, key, &arr) == 0)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s: a per-layer pattern is not supported", key);
    if ((rc = arch_int(f, hp->arch, "attention.sliding_window_pattern", 2, 1, 4096, &v, err, errlen)))
        return rc;
    hp->swa_pattern = (int)v;
    float base_swa;
    if ((rc = arch_float(f, hp->arch, "rope.freq_base_swa", hp->rope_base, &base_swa, err, errlen)))
        return rc;
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", hp->arch);
    if (base_swa != hp->rope_base)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s = %g: a RoPE base of its own for the "
                          "sliding layers of gpt-oss is not supported", key, (double)base_swa);
    hp->rope_base_swa = base_swa;
    if (hp->n_rot != hp->head_dim)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "gpt-oss with rope dimension %d other than the head size %d "
                          "is not supported", hp->n_rot, hp->head_dim);
    return 0;
}

/* phi3: the 128k variants scale RoPE per dimension by rope_factors_long/short, which cairn
 * does not apply: such files are refused rather than run wrong. llama.cpp ignores phi3's
 * sliding window (its converter writes one for models trained without it), and so does cairn. */
static int read_phi3(const struct gguf_file *f, struct model_hparams *hp, char *err, size_t errlen)
{
    hp->fused = true;
    if (gguf_find_tensor(f, "rope_factors_long.weight") || gguf_find_tensor(f, "rope_factors_short.weight"))
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                          "tensor rope_factors_long.weight: phi3's long-context RoPE (longrope/su) is not supported; "
                          "use the 4k variant");
    char key[128];
    struct gguf_str s;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    if (gguf_get_str(f, key, &s) == 0 && ((s.len == 2 && !memcmp(s.ptr, "su", 2)) ||
                                          (s.len == 8 && !memcmp(s.ptr, "longrope", 8))))
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "metadata key %s = %.*s is not supported", key,
                          (int)s.len, s.ptr);
    return 0;
}

const char *model_pooling_name(int pooling)
{
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    return pooling >= 0 && pooling <= MODEL_POOLING_RANK ? names[pooling] : NULL;
}

int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    struct gguf_str s;
    if (gguf_get_str(f, "general.architecture", &s))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "metadata key general.architecture is missing");
    if (s.len >= sizeof hp->arch)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "architecture name too long");
    memcpy(hp->arch, s.ptr, s.len);
    hp->arch[s.len] = 0;
    const struct arch_desc *a = model_find_arch(hp->arch);
    if (!a)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                          "architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma3, phi3, gpt-oss)", hp->arch);
    int64_t v;
    int rc;
#define GET_INT(field, key, def, lo, hi)                                             \
    if ((rc = arch_int(f, hp->arch, key, def, lo, hi, &v, err, errlen)) != 0)       \
        return rc;                                                                   \
    hp->field = (int)v;
    GET_INT(n_layers, "block_count", -1, 1, 4096);
    GET_INT(n_embd, "embedding_length", -1, 1, 1 << 17);
    GET_INT(n_ff, "feed_forward_length", -1, 1, 1 << 20);
    GET_INT(n_head, "attention.head_count", -1, 1, 4096);
    GET_INT(n_head_kv, "attention.head_count_kv", hp->n_head, 1, hp->n_head);
    GET_INT(head_dim, "attention.key_length", hp->n_embd / hp->n_head, 2, 4096);
    GET_INT(n_rot, "rope.dimension_count", hp->head_dim, 2, hp->head_dim);
#undef GET_INT
    if ((rc = arch_int(f, hp->arch, "context_length", 4096, 1, (int64_t)1 << 30, &hp->n_ctx_train, err, errlen)))
        return rc;
    int64_t vhead;
    if ((rc = arch_int(f, hp->arch, "attention.value_length", hp->head_dim, 1, 4096, &vhead, err, errlen)))
        return rc;
    if (vhead != hp->head_dim)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "value length %lld differs from key length %d",
                          (long long)vhead, hp->head_dim);
    if (hp->n_head % hp->n_head_kv)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "head_count %d is not a multiple of head_count_kv %d",
                          hp->n_head, hp->n_head_kv);
    if (hp->n_rot % 2 || hp->head_dim % 2)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "rope dimension %d / head dim %d must be even",
                          hp->n_rot, hp->head_dim);
    if ((rc = arch_float(f, hp->arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps, err, errlen)) ||
        (rc = arch_float(f, hp->arch, "rope.freq_base", 10000.0f, &hp->rope_base, err, errlen)))
        return rc;
    hp->rope_linear_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    if (gguf_get_str(f, key, &s) == 0) {
        if (s.len == 6 && !memcmp(s.ptr, "linear", 6)) {
            if ((rc = arch_float(f, hp->arch, "rope.scaling.factor", 1.0f, &hp->rope_linear_scale, err, errlen)))
                return rc;
        } else if (s.len == 4 && !memcmp(s.ptr, "yarn", 4)) {
            if ((rc = arch_float(f, hp->arch, "rope.scaling.factor", 1.0f, &hp->rope_yarn_factor, err, errlen)) ||
                (rc = arch_float(f, hp->arch, "rope.scaling.attn_factor", 1.0f, &hp->rope_yarn_attn_factor, err, errlen)) ||
                (rc = arch_float(f, hp->arch, "rope.scaling.yarn_beta_fast", 32.0f, &hp->rope_yarn_beta_fast, err, errlen)) ||
                (rc = arch_float(f, hp->arch, "rope.scaling.yarn_beta_slow", 1.0f, &hp->rope_yarn_beta_slow, err, errlen)) ||
                (rc = arch_int(f, hp->arch, "rope.scaling.original_context_length", hp->n_ctx_train, 1, (int64_t)1 << 30,
                               &hp->rope_yarn_orig_ctx, err, errlen)))
                return rc;
            if (hp->rope_yarn_factor <= 1.0f)
                hp->rope_yarn_factor = 0.0f; /* no scaling */
        } else if (!(s.len == 4 && !memcmp(s.ptr, "none", 4)) && !a->fused) { /* phi3's: read_phi3 */
            /* Llama 3 sets its scaling through rope_freqs.weight. */
            log_warn("rope scaling '%.*s' is not applied; positions beyond the trained context degrade",
                     (int)s.len, s.ptr);
        }
    }
    if ((rc = read_moe(f, a, hp, err, errlen)))
        return rc;
    hp->rope = a->rope;
    hp->qk_norm = a->qk_norm;
    hp->qkv_bias = a->qkv_bias;

    int64_t n_vocab = -1;
    struct gguf_array arr;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", &arr) == 0)
        n_vocab = (int64_t)arr.n;
    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (emb && emb->n_dims == 2) {
        if (n_vocab >= 0 && n_vocab != emb->ne[1])
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "token_embd.weight has %lld rows but the vocabulary %lld tokens",
                              (long long)emb->ne[1], (long long)n_vocab);
        n_vocab = emb->ne[1];
    }
    if (n_vocab < 1 || n_vocab > (1 << 24))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "vocabulary size unknown or out of range");
    hp->n_vocab = (int)n_vocab;
    hp->tied_output = gguf_find_tensor(f, "output.weight") == NULL;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    int64_t pooling;
    if ((rc = arch_int(f, hp->arch, "pooling_type", MODEL_POOLING_NONE, MODEL_POOLING_NONE, MODEL_POOLING_RANK,
                       &pooling, err, errlen)))
        return rc;
    hp->pooling = (int)pooling;
    if (a->gemma)
        return read_gemma(f, hp, err, errlen);
    if (a->fused)
        return read_phi3(f, hp, err, errlen);
    if (a->oss)
        return read_oss(f, hp, err, errlen);
    return 0;
}
