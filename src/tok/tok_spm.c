/* SentencePiece-style BPE ("llama" tokenizer model): spaces become U+2581, the text is
 * cut into UTF-8 characters, and the adjacent pair whose concatenation is the
 * highest-scoring piece is merged first (ties: leftmost), until no pair is a piece.
 * A symbol that is no piece falls back to its bytes' <0xNN> tokens.
 *
 * As in sentencepiece (and unlike a plain vocabulary lookup), merges only form NORMAL,
 * USER_DEFINED and UNUSED pieces, so raw text never turns into a control or byte token;
 * a merged UNUSED piece is split back into the two pieces that formed it. */
#include "tok/tok_impl.h"

#include "base/err.h"

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

static int heap_push(struct tok_scratch *s, struct sbigram b)
{
    if (TOK_RESERVE(s->heap, s->heap_cap, s->heap_n + 1, sizeof(struct sbigram)))
        return CAIRN_ENOMEM;
    struct sbigram *h = s->heap;
    int64_t i = s->heap_n++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!big_less(&b, &h[up]))
            break;
        h[i] = h[up];
        i = up;
    }
    h[i] = b;
    return 0;
}

static struct sbigram heap_pop(struct tok_scratch *s)
{
    struct sbigram *h = s->heap, top = h[0], last = h[--s->heap_n];
    int64_t i = 0, n = s->heap_n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && big_less(&h[c + 1], &h[c]))
            c++;
        if (!big_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0)
        h[i] = last;
    return top;
}

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

    /* one symbol per UTF-8 character (lead byte's length, clipped at the end) */
    if (TOK_RESERVE(s->sym, s->sym_cap, (int64_t)n, sizeof(struct ssym)))
        return CAIRN_ENOMEM;
    struct ssym *sym = s->sym;
    int32_t nsym = 0;
    for (size_t off = 0; off < n;) {
        size_t l = tok_utf8_len((unsigned char)s->buf[off]);
        if (l > n - off)
            l = n - off;
        sym[nsym] = (struct ssym){(int32_t)off, (int32_t)l, nsym - 1, -1};
        if (nsym > 0)
            sym[nsym - 1].next = nsym;
        nsym++;
        off += l;
    }
    s->heap_n = 0;
    s->rev_n = 0;
    for (int32_t i = 1; i < nsym; i++)
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
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        int rc = resegment(t, s, sym[i].start, sym[i].n);
        if (rc)
            return rc;
        sym = s->sym;
    }
    return 0;
}
