/* Paged KV cache (as vLLM's): storage is cut into blocks of `block_tokens` positions;
 * each sequence has a block table; blocks are shared between sequences by reference
 * count and copied on write, so forking a prefix copies nothing. One kv_cache serves one
 * model slice: it holds only that slice's layers.
 *
 * Memory layout per layer and per K/V: [n_blocks][block_tokens][kv_dim] elements of
 * `type` (F16 by default, or F32), so the rows of one block are contiguous. A "slot" is
 * block * block_tokens + offset and indexes a row. */
#ifndef CAIRN_ENGINE_KV_H
#define CAIRN_ENGINE_KV_H

#include <stddef.h>
#include <stdint.h>

struct kv_config {
    int n_layers;          /* layers of this slice */
    int64_t kv_dim;        /* n_kv_heads * head_dim */
    int block_tokens;      /* positions per block, e.g. 16 */
    int64_t n_blocks;      /* blocks in the pool */
    int max_seqs;          /* sequence ids are [0, max_seqs) */
    int type;              /* DT_F16 or DT_F32 */
};

struct kv_cache;

/* Bytes a cache of this config allocates (for memory checks before creating it). */
uint64_t kv_bytes_for(const struct kv_config *cfg);

int kv_create(struct kv_cache **out, const struct kv_config *cfg, char *err, size_t errlen);
void kv_release(struct kv_cache *kv); /* accepts NULL */
const struct kv_config *kv_config(const struct kv_cache *kv);

/* Prepares seq to have positions [pos, pos+n) written: drops every position >= pos
 * first (rollback of rejected speculative tokens, or re-decode), then makes sure blocks
 * exist up to pos+n, copying a shared block before it is written (copy on write).
 * Requires pos <= kv_seq_len(seq). On CAIRN_EFULL (not enough free blocks) the sequence
 * is left as it was before the call. After success kv_seq_len(seq) == pos + n. */
int kv_prepare(struct kv_cache *kv, int seq, int64_t pos, int64_t n);

/* Number of positions stored for seq. */
int64_t kv_seq_len(const struct kv_cache *kv, int seq);

/* Slot of (seq, pos) for pos < kv_seq_len(seq). */
int64_t kv_slot(const struct kv_cache *kv, int seq, int64_t pos);

/* Block table of seq: *n blocks; valid until the next call that changes seq. */
const int32_t *kv_seq_blocks(const struct kv_cache *kv, int seq, int64_t *n);

/* Row of K / V for a layer and slot (kv_dim elements of the cache's type). Rows of the
 * same block are contiguous. */
void *kv_k(struct kv_cache *kv, int layer, int64_t slot);
void *kv_v(struct kv_cache *kv, int layer, int64_t slot);

/* Drops positions >= pos of seq (pos <= len); blocks no longer referenced are freed. */
void kv_truncate(struct kv_cache *kv, int seq, int64_t pos);
void kv_seq_clear(struct kv_cache *kv, int seq);

/* dst (must be empty) shares all of src's blocks: no copy until one of them writes. */
int kv_fork(struct kv_cache *kv, int src, int dst);

int64_t kv_free_blocks(const struct kv_cache *kv);
/* Reference count of a block (for tests). */
int kv_block_refs(const struct kv_cache *kv, int32_t block);

#endif
