/* Architectures as data, and the hyper-parameters of a GGUF model read from its
 * metadata alone: what the node's catalog and placement need to know of a model without
 * loading its weights (model.h loads them). */
#ifndef CAIRN_MODEL_ARCH_H
#define CAIRN_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;

enum rope_order {
    ROPE_NORMAL = 0, /* rotate pairs (2i, 2i+1): llama */
    ROPE_NEOX = 2,   /* rotate pairs (i, i + rot_dim/2): qwen2, qwen3 */
};

/* Mixture of experts: never (dense), when the file says so ({arch}.expert_count > 0:
 * llama files written from Mixtral), or always (qwen3moe). */
enum arch_moe { MOE_NEVER = 0, MOE_OPTIONAL, MOE_REQUIRED };

/* What distinguishes one architecture from another, as data. */
struct arch_desc {
    const char *name;       /* general.architecture */
    enum rope_order rope;
    bool qkv_bias;          /* attn_{q,k,v}.bias present (qwen2) */
    bool qk_norm;           /* per-head RMS norm of q and k before RoPE (qwen3) */
    enum arch_moe moe;      /* whether the feed-forward is a mixture of experts */
    bool gemma;             /* gemma3: embeddings times sqrt(n_embd), norms after attention and
                               FFN (post_attention_norm, post_ffw_norm), GELU-tanh gated FFN,
                               sliding-window layers */
    bool fused;             /* phi3: attn_qkv (q, k, v rows in turn) and ffn_up of 2*n_ff rows
                               (gate rows, then up rows) */
    bool oss;               /* gpt-oss: attention sinks, biases of q/k/v/o, the FFN norm named
                               post_attention_norm, a router with a bias whose top-k logits are
                               softmaxed, experts with biases and clamped SwiGLU, every other layer
                               sliding (both with the file's RoPE scaling) */
};

/* Hyper-parameters, all read from the file's metadata. */
struct model_hparams {
    char arch[32];
    int n_layers;
    int n_embd;             /* hidden size */
    int n_ff;               /* feed-forward size */
    int n_head;
    int n_head_kv;
    int head_dim;           /* key/value length per head */
    int n_rot;              /* dimensions rotated by RoPE (<= head_dim) */
    int n_vocab;
    int64_t n_ctx_train;
    float norm_eps;
    float rope_base;
    float rope_linear_scale; /* positions are divided by it (1: none) */
    /* YaRN (rope.scaling.type "yarn"; factor 0: not used): angles interpolated by 1/factor
     * in the dimensions that turn slowly over orig_ctx positions, kept in those that turn
     * fast, a ramp between (betas fast 32, slow 1 by default), cos and sin times
     * attn_factor * (1 + 0.1 ln factor), as llama.cpp does. */
    float rope_yarn_factor, rope_yarn_attn_factor, rope_yarn_beta_fast, rope_yarn_beta_slow;
    int64_t rope_yarn_orig_ctx;
    enum rope_order rope;
    bool qkv_bias;
    bool qk_norm;
    bool tied_output;        /* no output.weight: the head is token_embd */
    /* Mixture of experts (n_expert 0: a dense feed-forward of n_ff). Each layer routes a
     * token to n_expert_used of n_expert experts, each a SwiGLU feed-forward of n_ff_exp;
     * with expert_norm the selected experts' router probabilities are divided by their
     * sum ({arch}.expert_weights_norm, true unless the file says false, as llama.cpp
     * always does for qwen3moe and llama). gpt-oss (oss) instead picks the top k of the
     * router's logits (plus its bias) and softmaxes those k, as llama.cpp's
     * SOFTMAX_WEIGHT gating does, with no renormalisation. */
    int n_expert;
    int n_expert_used;
    int n_ff_exp;
    bool expert_norm;
    bool gemma, fused, oss;  /* arch_desc's */
    /* Sliding-window layers (gemma3, gpt-oss; 0: none): a sliding layer's token at position p
     * attends to positions (p - swa_window, p] only; gemma3's with RoPE base rope_base_swa and
     * no scaling, gpt-oss's with the same RoPE as its other layers.
     * Layer il slides when il % swa_pattern < swa_pattern - 1 (every swa_pattern-th layer
     * is global), as llama.cpp reads "<arch>.attention.sliding_window[_pattern]". */
    int64_t swa_window;
    int swa_pattern;
    float rope_base_swa;
    float attn_scale;        /* queries are multiplied by it before the dot products */
    float logit_softcap;     /* > 0: logits = tanh(logits / cap) * cap */
    /* <arch>.pooling_type, llama.cpp's numbering: 0 none (a generative model), 1 mean,
     * 2 cls (first token), 3 last (last token: Qwen3-Embedding), 4 rank (a reranker's
     * classifier head, not supported for embeddings). */
    int pooling;
};

enum model_pooling { MODEL_POOLING_NONE = 0, MODEL_POOLING_MEAN, MODEL_POOLING_CLS, MODEL_POOLING_LAST,
                     MODEL_POOLING_RANK };

/* Static "none", "mean", "cls", "last", "rank"; NULL out of range. */
const char *model_pooling_name(int pooling);

/* Whether layer il (of the whole model) is a sliding-window layer. */
bool model_layer_swa(const struct model_hparams *hp, int il);

/* Architecture description by name, or NULL when unsupported. */
const struct arch_desc *model_find_arch(const char *name);

/* Reads hyper-parameters from an open file's metadata (validated). */
int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, char *err, size_t errlen);

#endif
