/* Paged KV cache (as vLLM's): storage is cut into blocks of `block_tokens` positions;
 * each sequence has a block table; blocks are shared between sequences by reference
 * count and copied on write, so forking a prefix copies nothing. One kv_cache serves one
 * model slice: it holds only that slice's layers.
 *
 * Memory per layer and per K/V: n_blocks blocks of block_tokens rows of kv_dim elements
 * of the K or V type (F16 by default, F32, Q8_0 or Q4_0: then kv_dim / 32 blocks of
 * GGUF's format per row); a block's bytes are contiguous. A "slot" is
 * block * block_tokens + offset and names a row; how a block's bytes are laid out
 * inside it is the attention's business (attn.h). */
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
    int type_k, type_v;    /* DT_F16, DT_F32, DT_Q8_0 or DT_Q4_0 each */
};

struct kv_cache;

/* Bytes a cache of this config allocates for K and V (for memory checks before creating
 * it): n_layers * n_blocks * block_tokens * (K's + V's bytes of kv_dim elements); 0 when the config is
 * invalid or the size overflows. Bookkeeping adds 8 bytes per block, and block tables of
 * 4 bytes per block per sequence in use (reserved for max_seqs * n_blocks, committed as
 * sequences grow). Storage is mmapped and committed lazily, as rows are first written. */
uint64_t kv_bytes_for(const struct kv_config *cfg);

/* Creates an empty cache; the caller owns it (kv_release). Fails with CAIRN_EINVAL on a
 * non-positive size, a type other than F16/F32/Q8_0/Q4_0 or a kv_dim a quantized type's
 * blocks do not divide, CAIRN_ERANGE when sizes overflow or
 * n_blocks > INT32_MAX, CAIRN_ENOMEM when a mapping fails; err says which. Rows are 64-byte
 * aligned when row bytes are a multiple of 64 (each layer's K and V start page aligned).
 * Not thread-safe: calls that change sequences must not run concurrently with any call;
 * kv_k/kv_v/kv_slot/kv_seq_blocks may run concurrently with each other. */
int kv_create(struct kv_cache **out, const struct kv_config *cfg, char *err, size_t errlen);
void kv_release(struct kv_cache *kv); /* accepts NULL */
/* The config the cache was created with. */
const struct kv_config *kv_config(const struct kv_cache *kv);

/* Prepares seq to have positions [pos, pos+n) written: drops every position >= pos
 * first (rollback of rejected speculative tokens, or re-decode), then makes sure blocks
 * exist up to pos+n, copying a shared block before it is written (copy on write).
 * Requires pos <= kv_seq_len(seq). On CAIRN_EFULL (not enough free blocks) the sequence
 * is left as it was before the call. After success kv_seq_len(seq) == pos + n.
 * Rows [pos, pos+n) hold stale data until written. n == 0 is a truncation.
 * CAIRN_EINVAL for a seq out of range, pos < 0, pos > len or n < 0. Never allocates. */
int kv_prepare(struct kv_cache *kv, int seq, int64_t pos, int64_t n);

/* Number of positions stored for seq (CAIRN_EINVAL for a seq out of range). */
int64_t kv_seq_len(const struct kv_cache *kv, int seq);

/* Slot of (seq, pos) for pos < kv_seq_len(seq); -1 when out of range. */
int64_t kv_slot(const struct kv_cache *kv, int seq, int64_t pos);

/* Block table of seq: *n blocks; valid until the next call that changes seq. NULL and
 * *n = 0 for a seq out of range. */
const int32_t *kv_seq_blocks(const struct kv_cache *kv, int seq, int64_t *n);

/* Row of K / V for a layer and slot: slot * (bytes of kv_dim elements of the type) from
 * the layer's start. Rows of the same block are contiguous. NULL for a layer or slot
 * out of range. */
void *kv_k(struct kv_cache *kv, int layer, int64_t slot);
void *kv_v(struct kv_cache *kv, int layer, int64_t slot);

/* Drops positions >= pos of seq (pos <= len); blocks no longer referenced are freed.
 * No-op for pos >= len, pos < 0 or a seq out of range. */
void kv_truncate(struct kv_cache *kv, int seq, int64_t pos);
/* Drops all positions of seq (kv_truncate(kv, seq, 0)). */
void kv_seq_clear(struct kv_cache *kv, int seq);

/* dst (must be empty) shares all of src's blocks: no copy until one of them writes.
 * CAIRN_EINVAL for ids out of range or src == dst, CAIRN_ESTATE when dst is not empty. */
int kv_fork(struct kv_cache *kv, int src, int dst);

/* One change to a sequence, as an observer sees it (to mirror a cache elsewhere). */
enum kv_op_kind { KV_OP_PREPARE = 1, KV_OP_TRUNCATE, KV_OP_FORK };
struct kv_op {
    enum kv_op_kind kind;
    int seq, seq2; /* FORK: seq = src, seq2 = dst */
    int64_t pos, n; /* PREPARE: pos, n; TRUNCATE: pos (0 for kv_seq_clear) */
};

/* Sets the one observer of the cache's sequence operations, called synchronously after
 * each successful kv_prepare (seq, pos, n), kv_truncate / kv_seq_clear (seq, pos) that
 * changed something, and successful kv_fork (seq = src, seq2 = dst); NULL fn removes
 * it. Replaying the ops in order on an empty cache of the same config reproduces every
 * block table exactly. fn must not call back into the cache. */
void kv_set_observer(struct kv_cache *kv, void (*fn)(void *arg, const struct kv_op *op), void *arg);

/* Sliding-window layers (gemma3, gpt-oss). kv_set_window marks a layer whose queries see only
 * the last `window` positions (0: all). Then, as a sequence grows, each block it alone holds
 * that lies wholly KV_WINDOW_SLACK positions or more behind the window of the first position
 * a kv_prepare call prepares (not its last: a long prompt chunk's first rows need what lies
 * before it)
 * (of the largest window of the cache) has its rows of the window layers released to the
 * system (madvise; the whole pages inside the block's rows: blocks of less than a page
 * release nothing), so those layers' resident memory stays about window + slack positions
 * per sequence however long it grows. The block stays in the table (the other layers keep
 * it). A sequence can then only resume at positions >= kv_seq_min_resume: a rollback of
 * speculative tokens (fewer than the slack) always can. kv_fork copies the bound. */
#define KV_WINDOW_SLACK 128
int kv_set_window(struct kv_cache *kv, int layer, int64_t window); /* CAIRN_EINVAL: layer or window out of range */
int64_t kv_window(const struct kv_cache *kv, int layer);          /* 0: none or out of range */
/* The lowest position at which seq can be prepared (kv_prepare's pos) and still see every
 * position its window layers need: 0 when nothing was released. */
int64_t kv_seq_min_resume(const struct kv_cache *kv, int seq);
/* Blocks whose window-layer rows were released (for tests and stats). */
int64_t kv_released_blocks(const struct kv_cache *kv);

/* Blocks held by no sequence. */
int64_t kv_free_blocks(const struct kv_cache *kv);
/* Reference count of a block (for tests); CAIRN_EINVAL for a block out of range. */
int kv_block_refs(const struct kv_cache *kv, int32_t block);

#endif
