/* Template values: arena, string builder, UTF-8, containers, Python's str()/repr(),
 * equality and ordering, and JSON in (jansson) and out (Python's json.dumps). */
#include "tmpl/tmpl_int.h"

#include "base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct tarena_chunk {
    struct tarena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

void *tmpl_alloc(struct tarena *a, size_t n)
{
    if (n > ((size_t)1 << 40))
        return NULL;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!n)
        n = sizeof(max_align_t);
    struct tarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        bool big = n > 8192;
        size_t cap = big ? n : !h ? 16384 : h->cap < ((size_t)1 << 20) ? h->cap * 2 : h->cap;
        if (a->limit && (cap > a->limit || a->total > a->limit - cap)) {
            a->over = true;
            return NULL;
        }
        struct tarena_chunk *c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        a->total += cap;
        if (big && h) {
            /* a one-off block: keep filling the current chunk afterwards */
            c->next = h->next;
            h->next = c;
            c->used = n;
            memset(c->data, 0, n);
            return c->data;
        }
        c->next = h;
        a->head = h = c;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void tmpl_arena_free(struct tarena *a)
{
    struct tarena_chunk *c = a->head;
    while (c) {
        struct tarena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- string builder ---- */

void tmpl_sb_init(struct tsb *b, struct tctx *c)
{
    memset(b, 0, sizeof *b);
    b->limit = c->max_str;
    b->acct = &c->ar;
}

void tmpl_sb_free(struct tsb *b)
{
    free(b->p);
    if (b->acct)
        b->acct->total -= b->cap;
    b->p = NULL;
    b->n = b->cap = 0;
}

static bool sb_grow(struct tsb *b, size_t add)
{
    if (b->fail)
        return false;
    if (add > b->limit || b->n > b->limit - add) {
        b->fail = true;
        return false;
    }
    if (b->n + add + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + add + 1)
        cap *= 2;
    struct tarena *a = b->acct;
    if (a && a->limit && (cap - b->cap > a->limit || a->total > a->limit - (cap - b->cap))) {
        a->over = true;
        b->fail = true;
        return false;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->fail = true;
        return false;
    }
    if (a)
        a->total += cap - b->cap;
    b->p = p;
    b->cap = cap;
    return true;
}

void tmpl_sb_put(struct tsb *b, const char *s, size_t n)
{
    if (!n || !sb_grow(b, n))
        return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tmpl_sb_putc(struct tsb *b, char c)
{
    if (!sb_grow(b, 1))
        return;
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

void tmpl_sb_puts(struct tsb *b, const char *s) { tmpl_sb_put(b, s, strlen(s)); }

void tmpl_sb_printf(struct tsb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k < sizeof tmp) {
        tmpl_sb_put(b, tmp, (size_t)k);
        return;
    }
    if (!sb_grow(b, (size_t)k))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* ---- UTF-8 ---- */

size_t tmpl_utf8_dec(const char *p, size_t n, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)p;
    if (s[0] < 0x80 || n < 2) {
        *cp = s[0];
        return 1;
    }
    if (s[0] < 0xE0) {
        *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] < 0xF0 || n < 4) {
        if (n < 3) {
            *cp = s[0];
            return 1;
        }
        *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

size_t tmpl_utf8_enc(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tmpl_utf8_valid(const char *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF)
            k = 2, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 3, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 4, cp = c & 0x07, min = 0x10000;
        else
            return false;
        if (n - i < k)
            return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

size_t tmpl_cp_count(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t tmpl_cp_off(const char *p, size_t n, int64_t i)
{
    size_t off = 0;
    for (int64_t k = 0; k < i && off < n; k++) {
        off++;
        while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
            off++;
    }
    return off;
}

bool tmpl_py_space(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- containers ---- */

struct tlist *tmpl_list_new(struct tctx *c, size_t cap)
{
    struct tlist *l = tmpl_alloc(&c->ar, sizeof *l);
    if (!l)
        return NULL;
    if (cap) {
        if (cap > ((size_t)1 << 36) || !(l->v = tmpl_alloc(&c->ar, cap * sizeof *l->v)))
            return NULL;
        l->cap = cap;
    }
    return l;
}

int tmpl_list_push(struct tctx *c, struct tlist *l, struct tv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct tv *nv = tmpl_alloc(&c->ar, cap * sizeof *nv);
        if (!nv)
            return CAIRN_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

struct tdict *tmpl_dict_new(struct tctx *c, size_t cap)
{
    struct tdict *d = tmpl_alloc(&c->ar, sizeof *d);
    if (!d)
        return NULL;
    if (cap) {
        if (cap > ((size_t)1 << 36))
            return NULL;
        d->k = tmpl_alloc(&c->ar, cap * sizeof *d->k);
        d->v = tmpl_alloc(&c->ar, cap * sizeof *d->v);
        if (!d->k || !d->v)
            return NULL;
        d->cap = cap;
    }
    return d;
}

static uint32_t hash_bytes(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static void index_insert(struct tdict *d, size_t pos)
{
    size_t mask = d->idxcap - 1;
    for (size_t h = hash_bytes(d->k[pos].u.s.p, d->k[pos].u.s.n) & mask;; h = (h + 1) & mask)
        if (!d->idx[h]) {
            d->idx[h] = (uint32_t)pos + 1;
            return;
        }
}

void tmpl_dict_index(struct tctx *c, struct tdict *d)
{
    d->idx = NULL;
    d->idxcap = 0;
    if (d->n <= TMPL_INDEX_MIN || d->n >= UINT32_MAX / 4)
        return;
    size_t cap = 64;
    while (cap < d->n * 2)
        cap *= 2;
    uint32_t *idx = tmpl_alloc(&c->ar, cap * sizeof *idx);
    if (!idx)
        return;  /* lookups scan instead */
    d->idx = idx;
    d->idxcap = cap;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR)
            index_insert(d, i);
}

long tmpl_dict_find_str(const struct tdict *d, const char *p, size_t n)
{
    if (d->idx) {
        size_t mask = d->idxcap - 1;
        for (size_t h = hash_bytes(p, n) & mask;; h = (h + 1) & mask) {
            uint32_t e = d->idx[h];
            if (!e)
                return -1;
            const struct tv *k = &d->k[e - 1];
            if (k->u.s.n == n && !memcmp(k->u.s.p, p, n))
                return (long)(e - 1);
        }
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, p, n))
            return (long)i;
    return -1;
}

long tmpl_dict_find(const struct tdict *d, const struct tv *k)
{
    if (k->t == TV_STR)
        return tmpl_dict_find_str(d, k->u.s.p, k->u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (tmpl_equal(&d->k[i], k))
            return (long)i;
    return -1;
}

int tmpl_dict_set(struct tctx *c, struct tdict *d, struct tv k, struct tv v)
{
    long i = tmpl_dict_find(d, &k);
    if (i >= 0) {
        d->v[i] = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct tv *nk = tmpl_alloc(&c->ar, cap * sizeof *nk);
        struct tv *nv = tmpl_alloc(&c->ar, cap * sizeof *nv);
        if (!nk || !nv)
            return CAIRN_ENOMEM;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->idx && (d->n + 1) * 2 <= d->idxcap) {
        if (k.t == TV_STR)
            index_insert(d, d->n - 1);
    } else if (d->n > TMPL_INDEX_MIN) {
        tmpl_dict_index(c, d);
    }
    return 0;
}

int tmpl_str_new(struct tctx *c, const char *p, size_t n, struct tv *out)
{
    if (n > c->max_str)
        return tmpl_err(c, NULL, CAIRN_EFULL, "string of %zu bytes is over the output limit", n);
    char *s = tmpl_alloc(&c->ar, n + 1);
    if (!s)
        return tmpl_oom(c, NULL);
    if (n)
        memcpy(s, p, n);
    *out = tv_str(s, n);
    return 0;
}

int tmpl_sb_to_str(struct tctx *c, struct tsb *b, struct tv *out)
{
    if (b->fail) {
        tmpl_sb_free(b);
        if (c->ar.over)
            return tmpl_oom(c, NULL);
        return tmpl_err(c, NULL, CAIRN_EFULL, "string over the output limit (%zu bytes)", c->max_str);
    }
    int rc = tmpl_str_new(c, b->p ? b->p : "", b->n, out);
    tmpl_sb_free(b);
    return rc;
}

/* ---- truth, equality, order ---- */

bool tmpl_truthy(const struct tv *v)
{
    switch (v->t) {
    case TV_UNDEF:
    case TV_NONE:
    case TV_MISSING:
        return false;
    case TV_BOOL: return v->u.b;
    case TV_INT: return v->u.i != 0;
    case TV_FLOAT: return v->u.d != 0.0;
    case TV_STR: return v->u.s.n != 0;
    case TV_LIST:
    case TV_TUPLE: return v->u.l->n != 0;
    case TV_DICT: return v->u.m->n != 0;
    case TV_ITER:
        if (v->u.it->kind == TI_GEN || v->u.it->kind == TI_REVERSE)
            return true;
        return v->u.it->l->n != 0;
    default: return true;
    }
}

/* Nesting beyond this compares unequal (Python raises RecursionError near there). */
#define MAX_VALUE_DEPTH 500

static bool equal_depth(const struct tv *a, const struct tv *b, int depth);

bool tmpl_equal(const struct tv *a, const struct tv *b) { return equal_depth(a, b, 0); }

static bool equal_depth(const struct tv *a, const struct tv *b, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return false;
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t == TV_FLOAT || b->t == TV_FLOAT)
            return tv_as_float(a) == tv_as_float(b);
        return tv_as_int(a) == tv_as_int(b);
    }
    if (a->t != b->t) {
        return false;
    }
    switch (a->t) {
    case TV_UNDEF:
    case TV_NONE:
        return true;
    case TV_STR:
        return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case TV_LIST:
    case TV_TUPLE:
        if (a->u.l == b->u.l)
            return true;
        if (a->u.l->n != b->u.l->n)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal_depth(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return false;
        return true;
    case TV_DICT:
        if (a->u.m == b->u.m)
            return true;
        if (a->u.m->n != b->u.m->n)
            return false;
        for (size_t i = 0; i < a->u.m->n; i++) {
            long j = tmpl_dict_find(b->u.m, &a->u.m->k[i]);
            if (j < 0 || !equal_depth(&a->u.m->v[i], &b->u.m->v[j], depth + 1))
                return false;
        }
        return true;
    case TV_ITER:
        if (a->u.it->kind != b->u.it->kind)
            return false;
        if (a->u.it->kind == TI_KEYS || a->u.it->kind == TI_ITEMS) {
            /* set-like views compare as sets */
            if (a->u.it->l->n != b->u.it->l->n)
                return false;
            for (size_t i = 0; i < a->u.it->l->n; i++) {
                bool found = false;
                for (size_t j = 0; j < b->u.it->l->n && !found; j++)
                    found = equal_depth(&a->u.it->l->v[i], &b->u.it->l->v[j], depth + 1);
                if (!found)
                    return false;
            }
            return true;
        }
        return a->u.it == b->u.it;
    case TV_NS: return a->u.m == b->u.m;
    case TV_MACRO: return a->u.mac == b->u.mac;
    case TV_FUNC:
        return a->u.fn->id == b->u.fn->id && equal_depth(&a->u.fn->self, &b->u.fn->self, depth + 1);
    case TV_LOOP: return a->u.lp == b->u.lp;
    default: return false;
    }
}

static bool hashable_depth(const struct tv *v, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return false;
    switch (v->t) {
    case TV_LIST:
    case TV_DICT:
        return false;
    case TV_ITER:
        return v->u.it->kind == TI_GEN || v->u.it->kind == TI_REVERSE;
    case TV_TUPLE:
        for (size_t i = 0; i < v->u.l->n; i++)
            if (!hashable_depth(&v->u.l->v[i], depth + 1))
                return false;
        return true;
    default:
        return true;
    }
}

bool tmpl_hashable(const struct tv *v) { return hashable_depth(v, 0); }

const char *tmpl_type_name_of(int t)
{
    switch (t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return "list";
    case TV_TUPLE: return "tuple";
    case TV_DICT: return "dict";
    case TV_ITER: return "generator";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return "builtin_function_or_method";
    case TV_LOOP: return "LoopContext";
    default: return "object";
    }
}

const char *tmpl_type_name(const struct tv *v)
{
    if (v->t == TV_STR && (v->f & TVF_MARKUP))
        return "Markup";
    if (v->t == TV_ITER) {
        switch (v->u.it->kind) {
        case TI_REVERSE: return "list_reverseiterator";
        case TI_ITEMS: return "dict_items";
        case TI_KEYS: return "dict_keys";
        case TI_VALUES: return "dict_values";
        default: return "generator";
        }
    }
    return tmpl_type_name_of(v->t);
}

static int order_err(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b)
{
    if (a->t == TV_UNDEF)
        return tmpl_undef_err(c, at, a);
    if (b->t == TV_UNDEF)
        return tmpl_undef_err(c, at, b);
    return tmpl_err(c, at, CAIRN_EFORMAT, "'<' not supported between instances of '%s' and '%s'",
                    tmpl_type_name(a), tmpl_type_name(b));
}

static int compare_depth(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, int *res,
                         int depth);

int tmpl_compare(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, int *res)
{
    return compare_depth(c, at, a, b, res, 0);
}

static int compare_depth(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, int *res,
                         int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return tmpl_err(c, at, CAIRN_EFULL, "values nested too deeply to compare");
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t == TV_FLOAT || b->t == TV_FLOAT) {
            double x = tv_as_float(a), y = tv_as_float(b);
            *res = x < y ? -1 : x > y ? 1 : 0;  /* NaN compares as equal: never less */
        } else {
            int64_t x = tv_as_int(a), y = tv_as_int(b);
            *res = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a->t == TV_STR && b->t == TV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = n ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
        if (!r)
            r = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
        *res = r < 0 ? -1 : r > 0;
        return 0;
    }
    if ((a->t == TV_LIST || a->t == TV_TUPLE) && a->t == b->t) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tmpl_equal(&a->u.l->v[i], &b->u.l->v[i]))
                continue;
            return compare_depth(c, at, &a->u.l->v[i], &b->u.l->v[i], res, depth + 1);
        }
        *res = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
        return 0;
    }
    return order_err(c, at, a, b);
}

/* ---- str() and repr() ---- */

void tmpl_float_repr(double d, char out[32])
{
    if (isnan(d)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(d)) {
        strcpy(out, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        strcpy(out, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* shortest digits that round-trip, then Python's layout */
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    char digits[24];
    int nd = 0;
    const char *p = buf;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1; /* digits d1d2... with the point after decpt digits */
    char *o = out;
    if (neg)
        *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = digits[i];
        } else {
            for (int i = 0; i < decpt; i++)
                *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++)
                    *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static bool printable(struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 0x20 && cp < 0x7F;
    char u[4];
    size_t k = tmpl_utf8_enc(cp, u);
    int rc = pcre2_match(c->t->nonprint, (PCRE2_SPTR)u, k, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, c->md, NULL);
    return rc < 0;
}

static void repr_str(struct tctx *c, struct tsb *b, const char *p, size_t n)
{
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    tmpl_sb_putc(b, q);
    size_t i = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)p[i];
        if (ch < 0x80) {
            if (ch == (unsigned char)q || ch == '\\') {
                tmpl_sb_putc(b, '\\');
                tmpl_sb_putc(b, (char)ch);
            } else if (ch == '\n') {
                tmpl_sb_puts(b, "\\n");
            } else if (ch == '\r') {
                tmpl_sb_puts(b, "\\r");
            } else if (ch == '\t') {
                tmpl_sb_puts(b, "\\t");
            } else if (ch < 0x20 || ch == 0x7F) {
                tmpl_sb_printf(b, "\\x%02x", ch);
            } else {
                tmpl_sb_putc(b, (char)ch);
            }
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
        if (printable(c, cp))
            tmpl_sb_put(b, p + i, k);
        else if (cp < 0x100)
            tmpl_sb_printf(b, "\\x%02x", cp);
        else if (cp < 0x10000)
            tmpl_sb_printf(b, "\\u%04x", cp);
        else
            tmpl_sb_printf(b, "\\U%08x", cp);
        i += k;
    }
    tmpl_sb_putc(b, q);
}

static int repr_depth(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v, int depth);

static int str_depth(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v, int depth)
{
    char num[32];
    switch (v->t) {
    case TV_UNDEF:
    case TV_MISSING:
        return 0;
    case TV_STR:
        tmpl_sb_put(b, v->u.s.p, v->u.s.n);
        return 0;
    case TV_NONE:
        tmpl_sb_puts(b, "None");
        return 0;
    case TV_BOOL:
        tmpl_sb_puts(b, v->u.b ? "True" : "False");
        return 0;
    case TV_INT:
        tmpl_sb_printf(b, "%lld", (long long)v->u.i);
        return 0;
    case TV_FLOAT:
        tmpl_float_repr(v->u.d, num);
        tmpl_sb_puts(b, num);
        return 0;
    default:
        return repr_depth(c, at, b, v, depth);
    }
}

static int repr_depth(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v, int depth)
{
    if (depth > 200)
        return tmpl_err(c, at, CAIRN_EFULL, "value nested too deeply to print");
    int rc;
    switch (v->t) {
    case TV_UNDEF:
        tmpl_sb_puts(b, "Undefined");
        return 0;
    case TV_STR:
        if (v->f & TVF_MARKUP) {
            tmpl_sb_puts(b, "Markup(");
            repr_str(c, b, v->u.s.p, v->u.s.n);
            tmpl_sb_putc(b, ')');
        } else {
            repr_str(c, b, v->u.s.p, v->u.s.n);
        }
        return 0;
    case TV_LIST:
    case TV_TUPLE: {
        bool tup = v->t == TV_TUPLE;
        tmpl_sb_putc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                tmpl_sb_puts(b, ", ");
            if ((rc = repr_depth(c, at, b, &v->u.l->v[i], depth + 1)))
                return rc;
        }
        if (tup && v->u.l->n == 1)
            tmpl_sb_putc(b, ',');
        tmpl_sb_putc(b, tup ? ')' : ']');
        return 0;
    }
    case TV_DICT:
    case TV_NS:
        if (v->t == TV_NS)
            tmpl_sb_puts(b, "<Namespace ");
        tmpl_sb_putc(b, '{');
        for (size_t i = 0; i < v->u.m->n; i++) {
            if (i)
                tmpl_sb_puts(b, ", ");
            if ((rc = repr_depth(c, at, b, &v->u.m->k[i], depth + 1)))
                return rc;
            tmpl_sb_puts(b, ": ");
            if ((rc = repr_depth(c, at, b, &v->u.m->v[i], depth + 1)))
                return rc;
        }
        tmpl_sb_putc(b, '}');
        if (v->t == TV_NS)
            tmpl_sb_putc(b, '>');
        return 0;
    case TV_ITER: {
        const struct titer *it = v->u.it;
        if (it->kind == TI_GEN || it->kind == TI_REVERSE) {
            tmpl_sb_printf(b, "<%s object>", tmpl_type_name(v));
            return 0;
        }
        tmpl_sb_printf(b, "%s([", tmpl_type_name(v));
        for (size_t i = 0; i < it->l->n; i++) {
            if (i)
                tmpl_sb_puts(b, ", ");
            if ((rc = repr_depth(c, at, b, &it->l->v[i], depth + 1)))
                return rc;
        }
        tmpl_sb_puts(b, "])");
        return 0;
    }
    case TV_MACRO:
        tmpl_sb_printf(b, "<Macro '%.*s'>", (int)v->u.mac->namelen, v->u.mac->name);
        return 0;
    case TV_FUNC:
        tmpl_sb_puts(b, "<built-in function>");
        return 0;
    case TV_LOOP:
        tmpl_sb_printf(b, "<LoopContext %lld/%zu>", (long long)v->u.lp->i0 + 1, v->u.lp->items->n);
        return 0;
    default:
        return str_depth(c, at, b, v, depth);
    }
}

int tmpl_to_str(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v)
{
    return str_depth(c, at, b, v, 0);
}

int tmpl_repr(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v)
{
    return repr_depth(c, at, b, v, 0);
}

int tmpl_str_of(struct tctx *c, const struct tnode *at, const struct tv *v, struct tv *out)
{
    if (v->t == TV_STR) {
        *out = *v;
        return 0;
    }
    if (v->t == TV_UNDEF || v->t == TV_MISSING) {
        *out = tv_str("", 0);
        return 0;
    }
    struct tsb b;
    tmpl_sb_init(&b, c);
    int rc = tmpl_to_str(c, at, &b, v);
    if (rc) {
        tmpl_sb_free(&b);
        return rc;
    }
    return tmpl_sb_to_str(c, &b, out);
}

/* ---- JSON ---- */

int tmpl_from_json(struct tctx *c, const json_t *j, struct tv *out, int depth)
{
    if (depth > 1000)
        return tmpl_err(c, NULL, CAIRN_EFULL, "input nested too deeply");
    int rc;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct tdict *d = tmpl_dict_new(c, json_object_size(j));
        if (!d)
            return tmpl_oom(c, NULL);
        const char *k;
        json_t *v;
        size_t i = 0;
        json_object_foreach((json_t *)j, k, v) {
            size_t kn = strlen(k);
            if (!tmpl_utf8_valid(k, kn))
                return tmpl_err(c, NULL, CAIRN_EINVAL, "input key is not valid UTF-8");
            d->k[i] = tv_str(k, kn);
            if ((rc = tmpl_from_json(c, v, &d->v[i], depth + 1)))
                return rc;
            i++;
        }
        d->n = i;
        tmpl_dict_index(c, d);
        out->t = TV_DICT;
        out->f = 0;
        out->u.m = d;
        return 0;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct tlist *l = tmpl_list_new(c, n);
        if (!l)
            return tmpl_oom(c, NULL);
        for (size_t i = 0; i < n; i++)
            if ((rc = tmpl_from_json(c, json_array_get(j, i), &l->v[i], depth + 1)))
                return rc;
        l->n = n;
        out->t = TV_LIST;
        out->f = 0;
        out->u.l = l;
        return 0;
    }
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (!tmpl_utf8_valid(s, n))
            return tmpl_err(c, NULL, CAIRN_EINVAL, "input string is not valid UTF-8");
        *out = tv_str(s, n);
        return 0;
    }
    case JSON_INTEGER: *out = tv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return 0;
    case JSON_TRUE: *out = tv_bool(true); return 0;
    case JSON_FALSE: *out = tv_bool(false); return 0;
    default: *out = tv_none(); return 0;
    }
}

static void json_str(struct tsb *b, const char *p, size_t n, bool ascii)
{
    tmpl_sb_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)p[i];
        if (ch < 0x80) {
            switch (ch) {
            case '"': tmpl_sb_puts(b, "\\\""); break;
            case '\\': tmpl_sb_puts(b, "\\\\"); break;
            case '\n': tmpl_sb_puts(b, "\\n"); break;
            case '\r': tmpl_sb_puts(b, "\\r"); break;
            case '\t': tmpl_sb_puts(b, "\\t"); break;
            case '\b': tmpl_sb_puts(b, "\\b"); break;
            case '\f': tmpl_sb_puts(b, "\\f"); break;
            default:
                if (ch < 0x20)
                    tmpl_sb_printf(b, "\\u%04x", ch);
                else
                    tmpl_sb_putc(b, (char)ch);
            }
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
        if (!ascii) {
            tmpl_sb_put(b, p + i, k);
        } else if (cp < 0x10000) {
            tmpl_sb_printf(b, "\\u%04x", cp);
        } else {
            uint32_t v = cp - 0x10000;
            tmpl_sb_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        }
        i += k;
    }
    tmpl_sb_putc(b, '"');
}

static void json_float(struct tsb *b, double d)
{
    if (isnan(d))
        tmpl_sb_puts(b, "NaN");
    else if (isinf(d))
        tmpl_sb_puts(b, d < 0 ? "-Infinity" : "Infinity");
    else {
        char num[32];
        tmpl_float_repr(d, num);
        tmpl_sb_puts(b, num);
    }
}

static void json_newline(struct tsb *b, const struct tjson_opts *o, int level)
{
    tmpl_sb_putc(b, '\n');
    for (int i = 0; i < level; i++)
        tmpl_sb_put(b, o->indent, o->indent_n);
}

static int json_key(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *k,
                    const struct tjson_opts *o)
{
    char num[32];
    switch (k->t) {
    case TV_STR: json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii); return 0;
    case TV_INT: tmpl_sb_printf(b, "\"%lld\"", (long long)k->u.i); return 0;
    case TV_BOOL: tmpl_sb_puts(b, k->u.b ? "\"true\"" : "\"false\""); return 0;
    case TV_NONE: tmpl_sb_puts(b, "\"null\""); return 0;
    case TV_FLOAT:
        if (isnan(k->u.d))
            strcpy(num, "NaN");
        else if (isinf(k->u.d))
            strcpy(num, k->u.d < 0 ? "-Infinity" : "Infinity");
        else
            tmpl_float_repr(k->u.d, num);
        tmpl_sb_printf(b, "\"%s\"", num);
        return 0;
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "keys must be str, int, float, bool or None, not %s",
                        tmpl_type_name(k));
    }
}

static int cmp_keys(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, int *res)
{
    return tmpl_compare(c, at, a, b, res);
}

int tmpl_to_json(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v,
                 const struct tjson_opts *o, int level)
{
    if (level > 500)
        return tmpl_err(c, at, CAIRN_EFULL, "value nested too deeply for tojson");
    if (b->fail)
        return tmpl_err(c, at, CAIRN_EFULL, "tojson output over the limit");
    int rc;
    switch (v->t) {
    case TV_NONE: tmpl_sb_puts(b, "null"); return 0;
    case TV_BOOL: tmpl_sb_puts(b, v->u.b ? "true" : "false"); return 0;
    case TV_INT: tmpl_sb_printf(b, "%lld", (long long)v->u.i); return 0;
    case TV_FLOAT: json_float(b, v->u.d); return 0;
    case TV_STR: json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii); return 0;
    case TV_LIST:
    case TV_TUPLE: {
        const struct tlist *l = v->u.l;
        if (!l->n) {
            tmpl_sb_puts(b, "[]");
            return 0;
        }
        tmpl_sb_putc(b, '[');
        if (o->indent)
            json_newline(b, o, level + 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                tmpl_sb_put(b, o->item_sep, o->item_sep_n);
                if (o->indent)
                    json_newline(b, o, level + 1);
            }
            if ((rc = tmpl_to_json(c, at, b, &l->v[i], o, level + 1)))
                return rc;
        }
        if (o->indent)
            json_newline(b, o, level);
        tmpl_sb_putc(b, ']');
        return 0;
    }
    case TV_DICT: {
        const struct tdict *d = v->u.m;
        if (!d->n) {
            tmpl_sb_puts(b, "{}");
            return 0;
        }
        size_t *order = tmpl_alloc(&c->ar, d->n * sizeof *order);
        if (!order)
            return tmpl_oom(c, at);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys) {  /* insertion sort: stable, errors on unordered key types */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int r;
                    if ((rc = cmp_keys(c, at, &d->k[x], &d->k[order[j - 1]], &r)))
                        return rc;
                    if (r >= 0)
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        tmpl_sb_putc(b, '{');
        if (o->indent)
            json_newline(b, o, level + 1);
        for (size_t i = 0; i < d->n; i++) {
            size_t x = order[i];
            if (i) {
                tmpl_sb_put(b, o->item_sep, o->item_sep_n);
                if (o->indent)
                    json_newline(b, o, level + 1);
            }
            if ((rc = json_key(c, at, b, &d->k[x], o)))
                return rc;
            tmpl_sb_put(b, o->key_sep, o->key_sep_n);
            if ((rc = tmpl_to_json(c, at, b, &d->v[x], o, level + 1)))
                return rc;
        }
        if (o->indent)
            json_newline(b, o, level);
        tmpl_sb_putc(b, '}');
        return 0;
    }
    case TV_UNDEF:
        return tmpl_err(c, at, CAIRN_EFORMAT, "Object of type Undefined is not JSON serializable");
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "Object of type %s is not JSON serializable", tmpl_type_name(v));
    }
}
