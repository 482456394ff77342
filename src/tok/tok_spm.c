/* SentencePiece-style BPE ("llama" tokenizer model): spaces become U+2581, the text is
 * cut into UTF-8 characters, and the adjacent pair whose concatenation is the
 * highest-scoring piece is merged first (ties: leftmost), until no pair is a piece.
 * A symbol that is no piece falls back to its bytes' <0xNN> tokens.
 *
 * As in sentencepiece (and unlike a plain vocabulary lookup), merges only form NORMAL,
 * USER_DEFINED and UNUSED pieces, so raw text never turns into a control or byte token;
 * a merged UNUSED piece is split back into the two pieces that formed it.
 *
 * Text that is not UTF-8 keeps its bytes (byte tokens); only a literal U+2581 in the
 * input cannot come back as itself, as in sentencepiece.
 *
 * Speed: the text is cut between two characters that are never adjacent inside a
 * mergeable piece (typically before each U+2581 that follows a non-space). No merge
 * can cross such a cut, and within each part the merges happen in the same relative
 * order as over the whole text, so merging the parts one by one gives the same tokens
 * with a small, cache-resident queue. */
#include "tok/tok_impl.h"

#include "base/err.h"

#include <stdlib.h>
#include <string.h>

struct ssym {
    int32_t start, n;      /* bytes of the working buffer; n == 0 once merged away */
    int32_t prev, next;
};

struct sbigram {
    float score;
    int32_t left, right;
    int32_t size;
};

struct srev {              /* merged UNUSED piece: where it was made, and its left part */
    int32_t start, n, left_n;
};

/* Bytes of the character at p: a well-formed UTF-8 sequence, else one byte. (llama.cpp
 * takes the lead byte's length even when the continuation bytes are missing, which can
 * swallow part of an escaped space after a stray lead byte; on valid UTF-8 the two agree.) */
static inline size_t char_len(const unsigned char *p, size_t n)
{
    int r = tok_utf8_next(p, n);
    return r > 0 ? (size_t)r : 1;
}

/* A character of the working text packed in 32 bits. */
static inline uint32_t char_key(const unsigned char *p, size_t n)
{
    uint32_t k = 0;
    memcpy(&k, p, n < 4 ? n : 4);
    return k;
}

static inline uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 29);
}

static int pair_known(const struct tok *t, uint64_t key)
{
    uint64_t i = pair_hash(key) & t->spm_pair_mask;
    for (;;) {
        uint64_t k = t->spm_pairs[i];
        if (k == key || k == UINT64_MAX)
            return k == key || key == UINT64_MAX;
        i = (i + 1) & t->spm_pair_mask;
    }
}

int tok_spm_load(struct tok *t)
{
    uint64_t total = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        total += t->st.off[id + 1] - t->st.off[id];
    uint64_t slots = 64;
    while (slots < total * 2)
        slots <<= 1;
    t->spm_pairs = malloc(slots * sizeof *t->spm_pairs);
    if (!t->spm_pairs)
        return CAIRN_ENOMEM;
    memset(t->spm_pairs, 0xff, slots * sizeof *t->spm_pairs);
    t->spm_pair_mask = slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & (TOK_ATTR_NORMAL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNUSED)))
            continue;
        size_t len;
        const unsigned char *p = (const unsigned char *)tok_strtab_get(&t->st, id, &len);
        size_t a = 0, al = len ? char_len(p, len) : 0;
        while (a + al < len) {
            size_t b = a + al, bl = char_len(p + b, len - b);
            uint64_t key = (uint64_t)char_key(p + a, al) << 32 | char_key(p + b, bl);
            uint64_t i = pair_hash(key) & t->spm_pair_mask;
            while (t->spm_pairs[i] != UINT64_MAX && t->spm_pairs[i] != key)
                i = (i + 1) & t->spm_pair_mask;
            t->spm_pairs[i] = key;
            a = b;
            al = bl;
        }
    }
    return 0;
}

static inline int big_less(const struct sbigram *a, const struct sbigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int32_t piece_id(const struct tok *t, const char *p, size_t n)
{
    int32_t id = tok_strtab_find(&t->st, p, n);
    if (id < 0 || id >= t->n_vocab)
        return -1;
    if (!(t->attr[id] & (TOK_ATTR_NORMAL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNUSED)))
        return -1;
    return id;
}

TOK_DEFINE_HEAP(heap, struct sbigram, big_less)

static int try_bigram(const struct tok *t, struct tok_scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    const struct ssym *sym = s->sym;
    int32_t start = sym[l].start, n = sym[l].n + sym[r].n;
    int32_t id = piece_id(t, s->buf + start, (size_t)n);
    if (id < 0)
        return 0;
    if (t->attr[id] & TOK_ATTR_UNUSED) {
        if (TOK_RESERVE(s->rev, s->rev_cap, s->rev_n + 1, sizeof(struct srev)))
            return CAIRN_ENOMEM;
        ((struct srev *)s->rev)[s->rev_n++] = (struct srev){start, n, sym[l].n};
    }
    return heap_push(s, (struct sbigram){t->score[id], l, r, n});
}

static int emit_bytes(const struct tok *t, struct tok_scratch *s, const char *p, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(unsigned char)p[i]];
        if (id < 0)
            id = t->unk;
        if (id >= 0 && tok_ids_push(&s->out, id))
            return CAIRN_ENOMEM;
    }
    return 0;
}

/* The latest record of a merged UNUSED piece with this text (sentencepiece keeps a map
 * from text to its last split). */
static const struct srev *find_rev(const struct tok_scratch *s, const char *p, int32_t n)
{
    const struct srev *rv = s->rev;
    for (int64_t i = s->rev_n; i-- > 0;)
        if (rv[i].n == n && !memcmp(s->buf + rv[i].start, p, (size_t)n))
            return &rv[i];
    return NULL;
}

static int resegment(const struct tok *t, struct tok_scratch *s, int32_t start, int32_t n)
{
    const char *p = s->buf + start;
    int32_t id = piece_id(t, p, (size_t)n);
    if (id >= 0 && !(t->attr[id] & TOK_ATTR_UNUSED))
        return tok_ids_push(&s->out, id);
    const struct srev *rv = id >= 0 ? find_rev(s, p, n) : NULL;
    if (!rv)
        return id >= 0 ? tok_ids_push(&s->out, id) : emit_bytes(t, s, p, n);
    int32_t ln = rv->left_n;
    int rc = resegment(t, s, start, ln);
    return rc ? rc : resegment(t, s, start + ln, n - ln);
}

/* Merges symbols [first, end) on their own and emits their tokens. */
static int merge_part(const struct tok *t, struct tok_scratch *s, int32_t first, int32_t end)
{
    struct ssym *sym = s->sym;
    sym[first].prev = -1;
    sym[end - 1].next = -1;
    s->heap_n = 0;
    for (int32_t i = first + 1; i < end; i++)
        if (try_bigram(t, s, i - 1, i))
            return CAIRN_ENOMEM;
    while (s->heap_n > 0) {
        struct sbigram b = heap_pop(s);
        sym = s->sym;
        struct ssym *L = &sym[b.left], *R = &sym[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size)
            continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0)
            sym[R->next].prev = b.left;
        if (try_bigram(t, s, L->prev, b.left) || try_bigram(t, s, b.left, L->next))
            return CAIRN_ENOMEM;
    }
    sym = s->sym;
    for (int32_t i = first; i >= 0; i = sym[i].next) {
        int rc = resegment(t, s, sym[i].start, sym[i].n);
        if (rc)
            return rc;
        sym = s->sym;
    }
    return 0;
}

int tok_spm_encode(const struct tok *t, struct tok_scratch *s, const char *text, size_t len,
                   int prefix_space)
{
    /* escape: optional leading space, then every ' ' as U+2581 */
    if (TOK_RESERVE(s->buf, s->buf_cap, (int64_t)len * 3 + 4, 1))
        return CAIRN_ENOMEM;
    size_t n = 0;
    if (prefix_space) {
        memcpy(s->buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            s->buf[n++] = text[i];
        }
    }
    if (n == 0)
        return 0;

    /* one symbol per UTF-8 character, one per byte where the text is not UTF-8 */
    if (TOK_RESERVE(s->sym, s->sym_cap, (int64_t)n, sizeof(struct ssym)))
        return CAIRN_ENOMEM;
    struct ssym *sym = s->sym;
    int32_t nsym = 0;
    for (size_t off = 0; off < n;) {
        size_t l = char_len((const unsigned char *)s->buf + off, n - off);
        sym[nsym] = (struct ssym){(int32_t)off, (int32_t)l, nsym - 1, nsym + 1};
        nsym++;
        off += l;
    }
    s->rev_n = 0;
    const unsigned char *u = (const unsigned char *)s->buf;
    int32_t first = 0;
    for (int32_t i = 1; i <= nsym; i++) {
        if (i < nsym) {
            uint64_t key = (uint64_t)char_key(u + sym[i - 1].start, (size_t)sym[i - 1].n) << 32 |
                           char_key(u + sym[i].start, (size_t)sym[i].n);
            if (pair_known(t, key))
                continue;
        }
        int rc = merge_part(t, s, first, i);
        if (rc)
            return rc;
        sym = s->sym;
        first = i;
    }
    return 0;
}
