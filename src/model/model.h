/* A model slice: the weights of layers [layer_begin, layer_end) of a GGUF model, ready
 * for the engine. The first slice (layer_begin == 0) also holds the token embeddings;
 * the last (layer_end == n_layers) the final norm and the output head. Architectures
 * are described as data (model/arch.h): which tensors a layer has and which options apply,
 * so that the forward pass has one code path for all of them.
 *
 * A tensor-parallel rank loads only its rows of every matrix (struct model_tp).
 *
 * Weights stay in the mmapped file where the kernels read them in place; when the
 * kernel path repacks a matrix, the file pages of the source are dropped after the
 * copy, so resident memory stays about one copy of the weights. */
#ifndef CAIRN_MODEL_MODEL_H
#define CAIRN_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern/kern.h"
#include "model/arch.h"

struct gguf_file;

/* phi3's fused attn_qkv and ffn_up tensors are loaded as the same five matrices: wq, wk and
 * wv from consecutive rows of attn_qkv, w_gate and w_up from the two halves of ffn_up. */
struct model_layer {
    struct kern_mat *wq;     /* (n_head*head_dim, n_embd) */
    struct kern_mat *wk;     /* (n_head_kv*head_dim, n_embd) */
    struct kern_mat *wv;     /* (n_head_kv*head_dim, n_embd) */
    struct kern_mat *wo;     /* (n_embd, n_head*head_dim) */
    struct kern_mat *w_gate; /* (n_ff, n_embd) */
    struct kern_mat *w_up;   /* (n_ff, n_embd) */
    struct kern_mat *w_down; /* (n_embd, n_ff) */
    float *attn_norm;        /* (n_embd) */
    float *ffn_norm;         /* (n_embd) */
    float *bq, *bk, *bv;     /* biases or NULL */
    float *q_norm, *k_norm;  /* (head_dim) or NULL */
    /* Mixture of experts (hp.n_expert > 0; then w_gate, w_up and w_down are NULL). Each
     * expert is one slice of the file's 3-D tensors ffn_{gate,up,down}_exps. */
    struct kern_mat *router;     /* (n_expert, n_embd): ffn_gate_inp */
    struct kern_mat **exp_gate;  /* n_expert of (n_ff_exp, n_embd), or NULL (exp_gate_up) */
    struct kern_mat **exp_up;    /* n_expert of (n_ff_exp, n_embd), or NULL (exp_gate_up) */
    /* Gate and up of each expert as one matrix of (2 n_ff_exp, n_embd) where the kernels
     * keep a repacked copy and both have one type: exp_gu_rows rows of gate, then those
     * rows of up, in turns (the last turn what is left of each), so a product over some
     * of an expert's columns of h reads one run of memory instead of two (each run a
     * thread starts costs its streams' cold start). Else NULL. */
    struct kern_mat **exp_gate_up;
    int exp_gu_rows;
    void *exp_block;         /* the experts' repacked weights, in one block on huge pages, or NULL */
    struct kern_mat **exp_down;  /* n_expert of (n_embd, n_ff_exp) */
    float *attn_post_norm, *ffn_post_norm; /* (n_embd) gemma3, else NULL */
    /* gpt-oss (else NULL); its ffn_norm is the file's post_attention_norm. */
    float *bo;               /* (n_embd) attn_output.bias */
    float *sinks;            /* (n_head) attn_sinks: a logit per head that joins each softmax */
    float *router_b;         /* (n_expert) ffn_gate_inp.bias */
    float *exp_gate_b;       /* (n_expert, n_ff_exp) ffn_gate_exps.bias */
    float *exp_up_b;         /* (n_expert, n_ff_exp) ffn_up_exps.bias */
    float *exp_down_b;       /* (n_expert, n_embd) ffn_down_exps.bias */
};

/* Tensor parallelism (issue 22; the engine's side is engine.h's struct engine_tp): every
 * matrix is split by output rows, rank r of W computing rows [part[r], part[r+1]) of each:
 * q_part of wq, kv_part of wk and wv (both whole KV heads with their query heads),
 * embd_part of wo and w_down, ff_part of w_gate and w_up, vocab_part of the head. Each part
 * starts on the row alignment of the matrices it splits (kern_row_align), so that a rank's
 * rows prepared on their own are the rows of the whole matrix, and their products the
 * same bits. */
#define MODEL_TP_MAX 8
enum model_tp_kind { MODEL_TP_Q, MODEL_TP_KV, MODEL_TP_EMBD, MODEL_TP_FF, MODEL_TP_VOCAB, MODEL_TP_KINDS };
struct model_tp {
    int rank, world; /* world 1: not split (every part the whole range) */
    int64_t q_part[MODEL_TP_MAX + 1], kv_part[MODEL_TP_MAX + 1], embd_part[MODEL_TP_MAX + 1],
        ff_part[MODEL_TP_MAX + 1], vocab_part[MODEL_TP_MAX + 1];
};

/* The least common multiple of two row alignments (positive): an alignment every matrix of
 * a kind accepts (tensor parts, the engine's and the experts' claim units). */
static inline int64_t row_align_lcm(int64_t a, int64_t b)
{
    int64_t x = a, y = b;
    while (y) {
        int64_t t = x % y;
        x = y;
        y = t;
    }
    return a / x * b;
}

/* Whether a model of these hyper-parameters can be split over `world` ranks (1..
 * MODEL_TP_MAX; the KV heads divide among them; no mixture of experts): 0, or
 * CAIRN_EINVAL saying why not. */
int model_tp_check_hparams(const struct model_hparams *hp, int world, char *err, size_t errlen);
/* The parts of rank `rank` of `world` (model_tp_check_hparams' rules), each kind's parts
 * on multiples of align[kind]: 0, or CAIRN_EINVAL saying why not. */
int model_tp_split(const struct model_hparams *hp, int rank, int world, const int64_t align[MODEL_TP_KINDS],
                   struct model_tp *out, char *err, size_t errlen);

struct model {
    struct gguf_file *file;  /* owned */
    struct model_hparams hp;
    int layer_begin, layer_end;
    bool first, last;        /* holds the embeddings / the norm and head */
    int tok_embd_type;       /* embeddings: rows of n_embd in the file (first slice) */
    const void *tok_embd;
    size_t tok_embd_row_bytes;
    int tok_embd_fd;         /* the file, read with pread for embedding rows (-1: use the mapping) */
    uint64_t tok_embd_offset; /* file offset of token_embd's data */
    float *output_norm;      /* (n_embd), last slice */
    struct kern_mat *output; /* (n_vocab, n_embd), last slice */
    float *rope_freq_factors; /* (n_rot/2) from rope_freqs.weight (Llama 3) or NULL */
    struct model_layer *layers; /* layer_end - layer_begin entries */
    /* world > 1 (model_load_opts.tp_world): every matrix (of the layers and the head)
     * holds only this rank's rows, tp's parts of it, from its row 0; the file pages of the
     * other rows are never read. Norms, biases and the embedding lookup stay whole. */
    struct model_tp tp;
    uint64_t weight_bytes;   /* bytes the matrices of this slice read per token: of a mixture
                                of experts, n_expert_used of n_expert experts' */
    uint64_t all_weight_bytes; /* bytes of all its matrices (what it holds in memory) */
    uint64_t file_bytes;
    void *weight_block;      /* the dense matrices' weights, in the order a step reads them (or NULL) */
};

struct model_load_opts {
    int layer_begin;         /* 0 */
    int layer_end;           /* -1: all */
    enum kern_path path;     /* KERN_PATH_AUTO */
    int threads;             /* repacking the matrices: 0, one thread per online CPU (at most 16) */
    int tp_rank, tp_world;   /* tp_world > 1: only rank tp_rank's rows of every matrix
                                (struct model_tp), the whole model's layers */
};

/* Opens `path` and loads a slice. Unsupported architectures and tensor types, missing
 * tensors and wrong shapes are refused with their names. */
int model_load(struct model **out, const char *path, const struct model_load_opts *opts,
               char *err, size_t errlen);

/* A byte range of a model's file (of part `part` of a split model, 0 for the first). */
struct model_extent {
    int part;
    uint64_t offset, len;
};

/* The byte ranges of f's tensors that model_load reads for layers [layer_begin,
 * layer_end) (layer_end -1: to the last), sorted by part and offset, touching ranges
 * joined: into *out (malloc'd, *n_out entries; the caller frees it). The file's header
 * is not among them. CAIRN_EINVAL for a range outside the model, model_read_hparams'
 * errors, CAIRN_ENOMEM. */
int model_slice_extents(const struct gguf_file *f, int layer_begin, int layer_end, struct model_extent **out,
                        size_t *n_out, char *err, size_t errlen);

/* Releases everything, the file mapping included; accepts NULL. */
void model_release(struct model *m);

/* Bytes of expert e's gate and up (fused or not); of its biases (gpt-oss's gate, up and
 * down biases as floats; 0 without); and of all of it with its down: what a token that
 * chooses it reads. */
uint64_t model_expert_gate_up_bytes(const struct model_layer *L, int e);
uint64_t model_expert_bias_bytes(const struct model_layer *L, int e);
uint64_t model_expert_bytes(const struct model_layer *L, int e);

/* Writes the embedding of token into out[n_embd] (first slice). The row is read with
 * pread into row_buf (tok_embd_row_bytes bytes, the caller's) rather than through the
 * mapping: touching mapped rows brings whole ranges of a large embedding back into
 * resident memory over a long generation. */
int model_embed(const struct model *m, int32_t token, void *row_buf, float *out);

#endif
