/* Synthetic models: GGUF files of a real architecture's shape with seeded random
 * weights at a realistic scale and a real vocabulary copied from a vocab GGUF, so that
 * tests and benchmarks do exactly the work a real model does, with no download. */
#ifndef CAIRN_MODEL_SYNTH_H
#define CAIRN_MODEL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

struct synth_spec {
    char arch[16];        /* llama, qwen2, qwen3, qwen3moe, gemma3, phi3 */
    int n_layers, n_embd, n_ff, n_head, n_head_kv, head_dim;
    int64_t n_ctx;
    float rope_base, norm_eps;
    int tied;             /* output head shares token_embd */
    int llama3_rope;      /* write rope_freqs.weight with Llama 3.1 scaling */
    float yarn_factor;    /* > 1: rope.scaling.type yarn with this factor over n_ctx / factor */
    float linear_factor;  /* > 1: rope.scaling.type linear with this factor (gemma3-4b) */
    int64_t swa_window;   /* > 0: attention.sliding_window (gemma3: 5 of 6 layers slide; phi3:
                             written as its files do, which llama.cpp and cairn ignore) */
    char type[16];        /* "q4_k_m", "q8_0", "f16", ... */
    uint64_t seed;
    int vocab_size;       /* used only without a vocab file: a byte-level stand-in */
    const char *chat_template; /* tokenizer.chat_template to write (replacing the vocab
                                  file's), or NULL */
    /* With out_scale > 0, the attention output and FFN down weights of layers >= scale_from
     * are scaled by out_scale: those layers then change the residual stream less, so a
     * draft of the first scale_from layers (synth_write_draft) agrees with the model more
     * often the smaller out_scale is. 0: off. */
    int scale_from;
    float out_scale;
    /* Control tokens appended to the vocabulary file's (e.g. the harmony format's
     * <|channel|> ... for a gpt-oss-shaped model on the qwen2 vocabulary), or none. */
    const char *const *extra_tokens;
    int n_extra_tokens;
    /* Mixture of experts (n_expert 0: dense): each layer's feed-forward is n_expert SwiGLU
     * experts of n_ff_exp (qwen3moe; llama's experts are n_ff wide), n_expert_used per
     * token, behind an F32 router (ffn_gate_inp), as llama.cpp's converter writes them. */
    int n_expert, n_expert_used, n_ff_exp;
    /* An embedding model: <arch>.pooling_type (model_hparams.pooling's numbering; 0: none,
     * a generative model), and tokenizer.ggml.add_eos_token set true (Qwen3-Embedding's
     * tokenizer appends <|endoftext|>, the token its last-token pooling reads). */
    int pooling;
    int add_eos;
};

/* Fills spec with a named shape: tiny, small, llama-1b, llama-8b, qwen-0.5b, qwen3-0.6b,
 * qwen3-embed-0.6b and qwen3-embed-tiny (embedding models: last-token pooling), qwen3moe-tiny, qwen3-30b-a3b, mixtral-tiny, gemma3-tiny, gemma3-1b, gemma3-4b, phi3-tiny,
 * phi3-mini (the gemma3 and phi3 shapes with their chat template).
 * Returns CAIRN_ENOTFOUND for other names. The type is left as it is. */
int synth_shape(const char *name, struct synth_spec *spec);

/* Comma-separated names of the shapes, for help texts. */
const char *synth_shape_names(void);

/* Tensor type chosen for a tensor of the spec's mix ("q4_k_m" gives Q6_K to the head,
 * and to attn_v/ffn_down of some layers, Q4_K elsewhere); a K-quant whose rows are not
 * a multiple of 256 falls back to Q5_0/Q5_1/Q8_0 as llama.cpp's quantizer does.
 * Returns -1 for an unknown type name. */
int synth_tensor_type(const struct synth_spec *spec, const char *tensor, int layer, int64_t row_len);

/* Control tokens of the spec appended to vocabulary v: n_extra_tokens, or 0 when v already
 * holds every one of them (o200k_harmony has the harmony tokens of the gpt-oss shapes). */
struct gguf_file;
int synth_extra_tokens_added(const struct synth_spec *spec, const struct gguf_file *v);

/* Writes the model to path. vocab_path: a GGUF whose tokenizer.* metadata (vocabulary,
 * merges, chat template...) is copied; NULL writes a minimal byte-level vocabulary. */
int synth_write(const struct synth_spec *spec, const char *vocab_path, const char *path,
                char *err, size_t errlen);

/* Writes a draft model of a target: the target's metadata, embeddings, final norm, head
 * and first n_layers layers, bit for bit, with block_count set to n_layers. */
int synth_write_draft(const char *target_path, int n_layers, const char *path, char *err, size_t errlen);

/* Writes a "script" model: its greedy continuation after token t is next[t], for every
 * t with next[t] >= 0 (the residual stream carries the current token's embedding
 * unchanged through the layers, and the head is built from those embeddings). The
 * tokens of a script whose successors must be unique per token are given by the
 * caller (synth_script_next turns a sequence into next[]). */
int synth_write_script(const struct synth_spec *spec, const char *vocab_path, const int32_t *next,
                       int n_next, const char *path, char *err, size_t errlen);

/* Fills next[n_vocab] (-1 where unset) from a token sequence; fails with a message when a
 * token is followed by different tokens at two places, or an id is out of range. */
int synth_script_next(const int32_t *seq, int64_t n, int32_t *next, int n_vocab, char *err, size_t errlen);

#endif
