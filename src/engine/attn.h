/* Causal attention over the paged KV cache, tiled with an online softmax (the
 * flash-attention scheme): no score matrix of the whole sequence, K and V read once per
 * tile of query rows, and the work split over KV heads x query tiles (prefill) or KV heads
 * x KV tiles (batches of at most ATTN_SPLIT_MAX tokens whose KV heads are fewer than twice
 * the threads), so one long sequence uses every thread.
 *
 * The numerical contract (every path, every thread count, every batch): a query row at
 * position p attends to positions [0, p], cut into tiles of ATTN_TILE positions counted
 * from position 0 ([0, T), [T, 2T), ...). Each tile's partial is computed on its own:
 *   q' = q * scale element-wise (attn_set_scale's, by default 1 / sqrtf(head_dim));
 *   s_j = vec.h attn_qk(q', k_j); with Q8_0 K, of vec.h vec_q8_query(q') (q' rounded to
 *     8-bit codes per 32 dims, integer dot products with K's codes, as llama.cpp's Q8_0 x
 *     Q8_0: the query's rounding is a function of q alone, so the contract below holds);
 *   m_t, p_j = exp(s_j - m_t), l_t = vec.h softmax_tile over the tile's positions <= p;
 *   o_t = vec.h attn_pv of p over the tile's V rows, from zero.
 * The partials are merged in tile order: the state starts as tile 0's; then
 *   m = max(m, m_t), a = exp(m_old - m), b = exp(m_t - m) (vec.h exp_sub),
 *   l = l*a + l_t*b, o = o*a + o_t*b (two multiplies, then an add),
 * and the output is o * (1 / l). With a sliding window of W positions the row sees only
 * positions (p - W, p]: the same tiles from 0, each cut to the positions the row sees
 * (the first tile the row sees starts the state; tiles wholly before the window are not
 * read at all), softmax_tile and attn_pv run over the row's positions of the tile from its
 * first. A row's result is thus a function of its own q and its
 * sequence's K and V only: not of how the prompt was chunked, what else is in the batch,
 * which rows share a tile product, or which thread computed which tile.
 *
 * Cache layout (kv.h's blocks, read and written only here), per block and KV head, a
 * piece of block_tokens positions: K transposed, [head_dim][block_tokens] elements, so
 * the keys of one dimension are contiguous (a tile product loads them as one vector);
 * Q8_0 K as int8 codes [head_dim/4][block_tokens][4] (a key's 4 dims together: one 32-bit
 * lane of a byte dot product) then half scales [head_dim/32][block_tokens],
 * Q4_0 K as bytes [head_dim/2][block_tokens] (vec.h's nibble order) then the scales; V
 * [block_tokens][head_dim] elements or [block_tokens][head_dim/32] GGUF blocks. So one
 * head's K and V of a block are contiguous too (decode streams them). */
#ifndef CAIRN_ENGINE_ATTN_H
#define CAIRN_ENGINE_ATTN_H

#include <stdint.h>

#include "base/pool.h"
#include "engine/kv.h"
#include "engine/vec.h"

#define ATTN_TILE 256      /* KV positions per tile */
#define ATTN_SPLIT_MAX 4   /* batches of at most this many tokens split each row's tiles over threads */

struct attn_shape {
    int n_head, n_head_kv, head_dim;
};

struct attn;

/* Scratch for n_threads threads, batches of up to max_batch tokens and positions below
 * max_ctx; 0, or CAIRN_ENOMEM. The caller owns *out (attn_release). */
int attn_create(struct attn **out, const struct attn_shape *sh, int n_threads, int max_batch, int64_t max_ctx);
void attn_release(struct attn *a); /* accepts NULL */
/* Sets the factor of the queries (> 0; by default 1 / sqrtf(head_dim)). */
void attn_set_scale(struct attn *a, float scale);

/* Writes one token's K and V (kv_dim floats each, heads of head_dim in turn) at slot of a
 * layer, in the cache's types and layout: F16 rounded to nearest even (with vec's
 * conversion: every variant writes the same bytes), F32, or Q8_0 and Q4_0 blocks of 32
 * values made as llama.cpp's reference quantizers make them (a position's K and V never
 * depend on other positions). */
void attn_kv_write(struct kv_cache *kv, const struct vec_ops *vec, int layer, int64_t slot, int head_dim,
                   const float *k, const float *v);

/* attn_kv_write of KV heads [h0, h1) only (k and v still the token's whole vectors): the
 * same bytes as attn_kv_write writes for those heads. */
void attn_kv_write_heads(struct kv_cache *kv, const struct vec_ops *vec, int layer, int64_t slot, int head_dim,
                         int h0, int h1, const float *k, const float *v);

/* Where attn_kv_write(kv, layer, slot, ...) writes: within bytes[0] from at[0] (K) and
 * bytes[1] from at[1] (V), the pieces of every KV head of slot's block. What a caller may
 * ask the memory for before the write (a decode finds the block's lines cold); reads and
 * writes nothing. */
void attn_kv_write_span(struct kv_cache *kv, int layer, int64_t slot, int head_dim, const char *at[2],
                        size_t bytes[2]);

/* Reads back one token's K and V at slot as floats (quantized types: code times scale). */
void attn_kv_read(struct kv_cache *kv, int layer, int64_t slot, int head_dim, float *k, float *v);

/* out (n x n_head*head_dim) = attention of each token's q (n x n_head*head_dim) over
 * positions [0, pos[i]] of sequence seq[i], whose K and V must already be in the cache.
 * Tokens of one sequence that follow each other in the batch must have consecutive
 * positions (engine.h's batch rule). Runs on pool with vec's kernels. */
void attn_forward(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                  int n, const int32_t *seq, const int64_t *pos, const float *q, float *out);

/* attn_forward with a sliding window (window > 0): token i attends to positions
 * (pos[i] - window, pos[i]] only, and no K or V row before them is read (a cache may have
 * dropped them). window <= 0: attn_forward. */
void attn_forward_window(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                         int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window);

/* attn_forward_window with attention sinks (gpt-oss; NULL: none): sinks[h] is a logit of query
 * head h that joins its softmax's denominator and adds no value (llama.cpp's soft_max with
 * sinks; the logit is not scaled). After the tiles are merged into (o, m, l), the row ends as
 *   m' = max(m, s), a = exp(m - m'), b = exp(s - m') (vec.h exp_sub), l' = l*a + b,
 *   out = (o * a) * (1 / l'),
 * which is a merge with a partial of o_t = 0, m_t = s, l_t = 1. */
void attn_forward_sinks(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                        int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window,
                        const float *sinks);

/* The caller's work on token b's query heads of KV head h (h * n_head/n_head_kv and on)
 * and its K and V of head h, before attention reads them: e.g. RoPE and the K and V
 * written to the cache (attn_kv_write_heads). */
typedef void (*attn_prep_fn)(void *ctx, int b, int h);

/* attn_forward_sinks with the queries, K and V made ready by prep(prep_ctx, b, h), called
 * once for each token b and KV head h of the batch before any of attention reads that
 * token's head h, on whichever thread of pool (NULL: none). A decode's are done by the
 * threads that then attend over the heads, not by the caller alone ahead of them. prep of
 * different (b, h) may run at once: each must write only token b's head h. */
void attn_forward_prep(struct attn *a, struct pool *pool, const struct vec_ops *vec, struct kv_cache *kv, int layer,
                       int n, const int32_t *seq, const int64_t *pos, const float *q, float *out, int64_t window,
                       const float *sinks, attn_prep_fn prep, void *prep_ctx);

#endif
