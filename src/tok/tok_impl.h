/* Private to src/tok/tok*.c: the tokenizer object and helpers shared by its files. */
#ifndef CAIRN_TOK_TOK_IMPL_H
#define CAIRN_TOK_TOK_IMPL_H

#include "tok/tok.h"

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define TOK_MAX_REGEX 8

/* Interned byte strings: ids [0, n) with an open-addressing hash index. Vocabulary
 * tokens are the first n_vocab entries; byte-level BPE adds the merge products that are
 * not tokens after them (so merges work on ids only). */
struct tok_strtab {
    char *blob;         /* every string, each followed by a NUL */
    size_t blob_len, blob_cap;
    uint64_t *off;      /* [n + 1] offsets into blob (string i ends at off[i+1] - 1) */
    int32_t n, cap;
    int32_t *slot;      /* hash index: id or -1 */
    uint64_t mask;      /* slot count - 1 */
};

int tok_strtab_init(struct tok_strtab *st, int32_t cap_hint);
void tok_strtab_free(struct tok_strtab *st);
/* Id of the string, or -1. */
int32_t tok_strtab_find(const struct tok_strtab *st, const char *s, size_t len);
/* Adds the string (no duplicate check: call find first); returns its id or a negative error. */
int32_t tok_strtab_add(struct tok_strtab *st, const char *s, size_t len);
static inline const char *tok_strtab_get(const struct tok_strtab *st, int32_t id, size_t *len)
{
    *len = (size_t)(st->off[id + 1] - st->off[id] - 1);
    return st->blob + st->off[id];
}

uint64_t tok_hash(const void *p, size_t n);

/* A growable array of token ids (per call, never shared). */
struct tok_ids {
    int32_t *v;
    int64_t n, cap;
};
int tok_ids_push(struct tok_ids *a, int32_t id);

/* Byte-level BPE merge table: (left id, right id) -> (rank, merged id). */
struct tok_merges {
    uint64_t *key;      /* left << 32 | right, UINT64_MAX when empty */
    int32_t *rank;
    int32_t *res;
    uint64_t mask;
    int64_t n;
};

struct tok {
    enum tok_kind kind;
    char pre[48];
    int32_t n_vocab;
    struct tok_strtab st;       /* vocabulary (+ BPE merge products) */
    uint8_t *attr;              /* [n_vocab] TOK_ATTR_* */
    uint8_t *eog;               /* [n_vocab] 1 when the token ends generation */
    float *score;               /* [n_vocab] SentencePiece scores (0 when absent) */
    char *text;                 /* rendered bytes of every token, concatenated */
    uint64_t *text_off;         /* [n_vocab + 1] */
    size_t max_text;

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix;

    /* SentencePiece: token of each byte (<0xNN>, else the 1-byte token, else -1).
     * BPE: token whose text is the single raw byte (llama.cpp's last-resort fallback). */
    int32_t byte_tok[256];

    /* SentencePiece: adjacent character pairs found inside mergeable pieces; text is
     * cut where a pair is absent, since no merge can ever span such a boundary */
    uint64_t *spm_pairs;        /* UINT64_MAX when empty */
    uint64_t spm_pair_mask;

    /* byte-level BPE */
    int ignore_merges;          /* a pre-token that is a whole token skips the merges */
    int32_t byte_sym[256];      /* string id of each byte's mapped character */
    char byte_enc[256][3];      /* UTF-8 of each byte's mapped character */
    uint8_t byte_enc_len[256];
    int16_t byte_dec[324];      /* mapped character (code point < 324) -> byte, or -1 */
    struct tok_merges merges;
    pcre2_code *re[TOK_MAX_REGEX];
    int n_re;
    int jit;                    /* every regex is JIT-compiled */

    /* special tokens (CONTROL | USER_DEFINED | UNKNOWN) by matching priority: longer
     * first, then lower id. A byte trie over their texts finds every occurrence. */
    int32_t *special;           /* ids in priority order */
    int32_t n_special;
    int has_user;               /* some special token is matched without parse_special */
    uint8_t special_first[256]; /* bytes that start a special token */
    int32_t *trie_tok;          /* [nodes] token ending at the node, or -1 */
    int32_t trie_nodes;
    uint64_t *trie_key;         /* edge hash: node << 8 | byte, UINT64_MAX empty */
    int32_t *trie_child;
    uint64_t trie_mask;
};

/* Per-call scratch for encoding. */
struct tok_scratch {
    struct tok_ids out;
    char *buf;                  /* text being worked on */
    int64_t buf_cap;
    char *buf2;
    int64_t buf2_cap;
    int64_t *seg, *seg2;        /* pre-token [start, end) pairs */
    int64_t seg_cap, seg2_cap;
    void *sym;                  /* symbols of the word being merged */
    int64_t sym_cap;
    void *heap;
    int64_t heap_n, heap_cap;
    int64_t work;               /* heap steps taken: the merges' cost, for tests to count */
    void *rev;                  /* SentencePiece re-segmentation records */
    int64_t rev_n, rev_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
};

/* array_reserve (base/array.h) for the int64_t capacities of tok: grows the array whose
 * pointer is at where (*cap elements of elem bytes) to at least need elements, doubling
 * from 64; 0 or CAIRN_ENOMEM (the array is kept). Use through TOK_RESERVE. */
int tok_reserve(void *where, int64_t *cap, int64_t need, size_t elem);
#define TOK_RESERVE(ptr, cap, need, elem) \
    ((int64_t)(need) <= (cap) ? 0 : tok_reserve(&(ptr), &(cap), (int64_t)(need), (elem)))
void tok_scratch_free(struct tok_scratch *s);

/* UTF-8 */
/* Length of the sequence a lead byte announces (llama.cpp's unicode_len_utf8). */
static inline size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}
/* Strict decoder step: >0 length of a valid character at s; 0 when s[0..n) is a valid
 * but incomplete start; -k when the first k bytes are a maximal invalid subpart. */
int tok_utf8_next(const unsigned char *s, size_t n);
/* Whether s is entirely valid UTF-8. */
int tok_utf8_valid(const char *s, size_t n);
/* Writes the UTF-8 of cp (<= 0x10FFFF) to out (4 bytes room); returns its length. */
int tok_utf8_put(uint32_t cp, char *out);

/* BPE (tok_bpe.c) */
int tok_bpe_load(struct tok *t, const struct gguf_file *f, char *err, size_t errlen);
void tok_bpe_free(struct tok *t);
int tok_bpe_encode(const struct tok *t, struct tok_scratch *s, const char *text, size_t len);
/* Renders a byte-level BPE token text back to bytes (appends to out, room 2*len). */
size_t tok_bpe_decode_text(const struct tok *t, const char *s, size_t len, char *out);

/* SentencePiece (tok_spm.c) */
int tok_spm_load(struct tok *t);
int tok_spm_encode(const struct tok *t, struct tok_scratch *s, const char *text, size_t len,
                   int prefix_space);

/* A binary min-heap over s->heap (scratch, grown with TOK_RESERVE) of TYPE ordered by
 * LESS(const TYPE *, const TYPE *): defines NAME_push (0 or CAIRN_ENOMEM) and NAME_pop
 * (the least element; the heap must not be empty). One definition serves the merge
 * queues of both tokenizers without an indirect call per comparison. */
#define TOK_DEFINE_HEAP(NAME, TYPE, LESS)                                        \
    static int NAME##_push(struct tok_scratch *s, TYPE p)                        \
    {                                                                            \
        if (TOK_RESERVE(s->heap, s->heap_cap, s->heap_n + 1, sizeof(TYPE)))      \
            return CAIRN_ENOMEM;                                                 \
        TYPE *h = s->heap;                                                       \
        int64_t i = s->heap_n++;                                                 \
        s->work++;                                                               \
        while (i > 0) {                                                          \
            int64_t up = (i - 1) / 2;                                            \
            s->work++;                                                           \
            if (!LESS(&p, &h[up]))                                               \
                break;                                                           \
            h[i] = h[up];                                                        \
            i = up;                                                              \
        }                                                                        \
        h[i] = p;                                                                \
        return 0;                                                                \
    }                                                                            \
    static TYPE NAME##_pop(struct tok_scratch *s)                                \
    {                                                                            \
        TYPE *h = s->heap, top = h[0], last = h[--s->heap_n];                    \
        int64_t i = 0, n = s->heap_n;                                            \
        s->work++;                                                               \
        for (;;) {                                                               \
            int64_t c = 2 * i + 1;                                               \
            s->work++;                                                           \
            if (c >= n)                                                          \
                break;                                                           \
            if (c + 1 < n && LESS(&h[c + 1], &h[c]))                             \
                c++;                                                             \
            if (!LESS(&h[c], &last))                                             \
                break;                                                           \
            h[i] = h[c];                                                         \
            i = c;                                                               \
        }                                                                        \
        if (n > 0)                                                               \
            h[i] = last;                                                         \
        return top;                                                              \
    }

#endif
