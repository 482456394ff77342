/* Helpers shared by the tokenizers: interned strings, id arrays, scratch, UTF-8. */
#include "tok/tok_impl.h"

#include "base/array.h"
#include "base/err.h"

#include <stdlib.h>
#include <string.h>

uint64_t tok_hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

int tok_strtab_init(struct tok_strtab *st, int32_t cap_hint)
{
    memset(st, 0, sizeof *st);
    if (cap_hint < 16)
        cap_hint = 16;
    uint64_t slots = 64;
    while (slots < (uint64_t)cap_hint * 2)
        slots <<= 1;
    st->cap = cap_hint;
    st->off = malloc(((size_t)cap_hint + 1) * sizeof *st->off);
    st->slot = malloc(slots * sizeof *st->slot);
    st->blob_cap = (size_t)cap_hint * 8 + 64;
    st->blob = malloc(st->blob_cap);
    if (!st->off || !st->slot || !st->blob) {
        tok_strtab_free(st);
        return CAIRN_ENOMEM;
    }
    memset(st->slot, 0xff, slots * sizeof *st->slot);
    st->mask = slots - 1;
    st->off[0] = 0;
    return 0;
}

void tok_strtab_free(struct tok_strtab *st)
{
    free(st->blob);
    free(st->off);
    free(st->slot);
    memset(st, 0, sizeof *st);
}

int32_t tok_strtab_find(const struct tok_strtab *st, const char *s, size_t len)
{
    uint64_t i = tok_hash(s, len) & st->mask;
    for (;;) {
        int32_t id = st->slot[i];
        if (id < 0)
            return -1;
        size_t l;
        const char *p = tok_strtab_get(st, id, &l);
        if (l == len && !memcmp(p, s, len))
            return id;
        i = (i + 1) & st->mask;
    }
}

static int strtab_rehash(struct tok_strtab *st, uint64_t slots)
{
    int32_t *ns = malloc(slots * sizeof *ns);
    if (!ns)
        return CAIRN_ENOMEM;
    memset(ns, 0xff, slots * sizeof *ns);
    for (int32_t id = 0; id < st->n; id++) {
        size_t l;
        const char *p = tok_strtab_get(st, id, &l);
        uint64_t i = tok_hash(p, l) & (slots - 1);
        while (ns[i] >= 0)
            i = (i + 1) & (slots - 1);
        ns[i] = id;
    }
    free(st->slot);
    st->slot = ns;
    st->mask = slots - 1;
    return 0;
}

int32_t tok_strtab_add(struct tok_strtab *st, const char *s, size_t len)
{
    if (st->n == INT32_MAX - 1)
        return CAIRN_ERANGE;
    if (st->n == st->cap) {
        int64_t nc = (int64_t)st->cap * 2;
        if (nc > INT32_MAX - 1)
            nc = INT32_MAX - 1;
        uint64_t *no = realloc(st->off, ((size_t)nc + 1) * sizeof *no);
        if (!no)
            return CAIRN_ENOMEM;
        st->off = no;
        st->cap = (int32_t)nc;
    }
    if ((uint64_t)(st->n + 1) * 2 > st->mask + 1) {
        int rc = strtab_rehash(st, (st->mask + 1) * 2);
        if (rc)
            return rc;
    }
    if (array_reserve(&st->blob, &st->blob_cap, st->blob_len + len + 1, 1, 64))
        return CAIRN_ENOMEM;
    memcpy(st->blob + st->blob_len, s, len);
    st->blob[st->blob_len + len] = 0;
    st->blob_len += len + 1;
    int32_t id = st->n++;
    st->off[st->n] = st->blob_len;
    uint64_t i = tok_hash(s, len) & st->mask;
    while (st->slot[i] >= 0)
        i = (i + 1) & st->mask;
    st->slot[i] = id;
    return id;
}

int tok_ids_push(struct tok_ids *a, int32_t id)
{
    if (TOK_RESERVE(a->v, a->cap, a->n + 1, sizeof *a->v))
        return CAIRN_ENOMEM;
    a->v[a->n++] = id;
    return 0;
}

int tok_reserve(void *where, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = (size_t)*cap;
    if (array_reserve(where, &nc, (size_t)need, elem, 64))
        return CAIRN_ENOMEM;
    *cap = (int64_t)nc; /* at most PTRDIFF_MAX */
    return 0;
}

void tok_scratch_free(struct tok_scratch *s)
{
    free(s->out.v);
    free(s->buf);
    free(s->buf2);
    free(s->seg);
    free(s->seg2);
    free(s->sym);
    free(s->heap);
    free(s->rev);
    if (s->md)
        pcre2_match_data_free(s->md);
    if (s->mctx)
        pcre2_match_context_free(s->mctx);
    if (s->jstack)
        pcre2_jit_stack_free(s->jstack);
    memset(s, 0, sizeof *s);
}

int tok_utf8_next(const unsigned char *s, size_t n)
{
    unsigned c = s[0], need, lo = 0x80, hi = 0xbf;
    if (c < 0x80)
        return 1;
    if (c < 0xc2)
        return -1;
    if (c < 0xe0) {
        need = 2;
    } else if (c < 0xf0) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c < 0xf5) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return -1;
    }
    for (unsigned i = 1; i < need; i++) {
        if (i >= n)
            return 0;
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf))
            return -(int)i;
    }
    return (int)need;
}

int tok_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        int r = tok_utf8_next(s + i, n - i);
        if (r <= 0)
            return 0;
        i += (size_t)r;
    }
    return 1;
}

int tok_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}
