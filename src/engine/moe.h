/* The feed-forward of a mixture-of-experts layer (qwen3moe, llama files from Mixtral, gpt-oss):
 * a router picks n_expert_used of n_expert SwiGLU experts per token, and the token's
 * output is their outputs weighted by the router's probabilities.
 *
 * Per token (the order of float operations, fixed whatever else is in the batch):
 *   logits = router product (kern.h's order);
 *   p[e] = exp(logits[e] - max) / sum, the sum in float over e = 0, 1, ... in order;
 *   top-k: the k largest p, largest first, equal p in ascending expert order;
 *   w[j] = p[sel j]; with expert_norm: w[j] = w[j] / max(sum_j w[j] (j in order), 6.1035e-5);
 *   o_j = down_e(silu(gate_e(x)) * up_e(x)) for e = sel j (kern.h's products);
 *   m = o_0 * w[0]; then m = m + o_j * w[j] for j = 1 .. k-1 (top-k order);
 *   the residual stream y = y + m.
 * (Each value is one such sequence whichever unit of work or thread computes it: the
 * forward splits h and y by columns, and a column's steps stay as written.)
 * gpt-oss (hp.oss) differs, as llama.cpp's graph for it:
 *   logits = router product + router bias (added in float);
 *   top-k of the logits as above; w = their softmax (moe.c route_oss's order), no renormalisation;
 *   g = gate_e(x), u = up_e(x); h = swiglu_oai(g, u, bg_e, bu_e) (vec.h's steps, its exp VEC_EXP);
 *   o_j = down_e(h) + bd_e; m and y as above.
 *
 * A batch groups its tokens by expert: each expert chosen by any token of the batch runs
 * once, as one product over all the tokens that chose it, so its weights are read once per
 * step; experts no token chose are not read at all. A step is two dispatches to the pool
 * (three when the router's input is quantized): the router's product split by its rows,
 * the experts' inputs quantized, the choices grouped by the calling thread, then gate,
 * up and the activation with h's quantization split by columns of h (moe.c step_run);
 * then down and the combination, split by
 * columns of y (a small batch: down split by runs of each expert's rows, and the
 * combination on the calling thread; moe.c down_job). Where the loader fused an expert's
 * gate and up into one matrix (model.h's exp_gate_up), a unit's gate and up rows are one
 * product over one run of memory; each output is the same dot product either way. */
#ifndef CAIRN_ENGINE_MOE_H
#define CAIRN_ENGINE_MOE_H

#include <stdint.h>

#include "base/pool.h"
#include "engine/vec.h"
#include "model/model.h"

struct moe;

/* Work done, for tests and the bench (counts since creation). */
struct moe_stats {
    uint64_t steps;          /* moe_forward calls (one per layer per forward) */
    uint64_t token_choices;  /* tokens x n_expert_used */
    uint64_t expert_runs;    /* experts run (each once per step that any token chose it) */
    uint64_t expert_bytes;   /* bytes of expert weights read (matrices and biases: model_expert_bytes) */
    uint64_t down_bytes;     /* of which the down products' */
    uint64_t down_by_expert; /* steps whose down ran by experts (a small batch; moe.c) */
    uint64_t act_shared;     /* steps whose activation groups spanned several units of gate and up (moe.c) */
    /* Wall time of each phase, in ns (for the bench; never asserted): the router (its
     * input quantized, its product, the top-k, grouping), the experts' inputs gathered,
     * the gate and up products with the activation, the down products with the
     * combination. In a decode step down runs in gate and up's dispatch (moe.c): gate+up
     * ends when the last chosen expert's activation is done, and down's first products
     * ran before that, so down's account holds only its tail and the combination. */
    uint64_t ns_route, ns_gather, ns_gate_up, ns_down;
};

/* Scratch for batches of up to max_batch tokens of the model's shape (n_expert > 0);
 * everything the forward needs is allocated here. */
int moe_create(struct moe **out, const struct model_hparams *hp, int max_batch);
void moe_release(struct moe *mo); /* accepts NULL */

/* y[b] = y[b] + the layer's mixture of experts of x[b] (B rows of n_embd, normed; y the
 * residual stream), B <= max_batch. Runs its products on pool. */
void moe_forward(struct moe *mo, struct pool *pool, const struct vec_ops *vec, const struct model_layer *L,
                 const float *x, int B, float *y);

struct moe_stats moe_get_stats(const struct moe *mo);

#endif
