#include "tok/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tok/tok.h"

/* ---- compiled form ----
 * Every rule is a run of elements: its alternatives, each ended by E_ALT except the
 * last, ended by E_END. A position is an index into elems. */
enum { E_END, E_ALT, E_REF, E_SET };

struct el {
    uint32_t type;
    uint32_t v; /* E_REF: rule; E_SET: byte set */
};

#define INF_LEN ((int64_t)1 << 40)

struct grammar {
    struct el *elems;
    uint32_t n_elems;
    uint32_t *sets; /* [n_sets][8]: 256-bit byte sets */
    uint32_t n_sets;
    uint32_t n_rules;
    uint32_t *alt_off;  /* [n_rules + 1] into alts */
    uint32_t *alts;     /* start position of each alternative */
    int64_t *rest;      /* [n_elems]: fewest bytes from this position to the end of its alternative */
    uint32_t root;
    uint32_t *rule_start; /* [n_rules + 1]: where each rule's elements start */
    uint32_t *chain_k;  /* [n_rules]: k of a bounded repetition's rule R_k (x{m,n}), else 0 */
};

static bool set_has(const uint32_t *set, unsigned b) { return set[b >> 5] >> (b & 31) & 1; }

/* ---- parser ---- */

struct prule {
    char *name;
    struct el *els;
    size_t n, cap;
    bool defined;
    uint32_t chain_k; /* R_k of a bounded repetition (repeat), else 0 */
};

struct parser {
    const char *s, *end;
    int line;
    struct prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *sets;
    uint32_t n_sets, cap_sets;
    size_t total;
    int nest;
    char *err;
    size_t errlen;
    int rc;
};

static int perr(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *p, const char *fmt, ...)
{
    if (p->rc)
        return p->rc;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->rc = cairn_fail(p->err, p->errlen, CAIRN_EFORMAT, "grammar line %d: %s", p->line, msg);
    return p->rc;
}

static int oom(struct parser *p)
{
    if (!p->rc)
        p->rc = cairn_fail(p->err, p->errlen, CAIRN_ENOMEM, "grammar: out of memory");
    return p->rc;
}

static int64_t rule_find(struct parser *p, const char *name, size_t len, bool create)
{
    for (uint32_t i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == len && memcmp(p->rules[i].name, name, len) == 0)
            return i;
    if (!create)
        return -1;
    if (p->n_rules == p->cap_rules) {
        uint32_t cap = p->cap_rules ? p->cap_rules * 2 : 16;
        struct prule *r = realloc(p->rules, cap * sizeof *r);
        if (!r)
            return oom(p);
        p->rules = r;
        p->cap_rules = cap;
    }
    if (p->n_rules >= (1u << 20))
        return perr(p, "too many rules");
    char *copy = malloc(len + 1);
    if (!copy)
        return oom(p);
    memcpy(copy, name, len);
    copy[len] = 0;
    p->rules[p->n_rules] = (struct prule){.name = copy};
    return p->n_rules++;
}

/* A synthetic rule (groups, repetitions, classes): name ~N. */
static int64_t rule_new(struct parser *p)
{
    char name[32];
    int n = snprintf(name, sizeof name, "~%u", p->n_rules);
    int64_t r = rule_find(p, name, (size_t)n, true);
    if (r >= 0)
        p->rules[r].defined = true;
    return r;
}

static int emit(struct parser *p, uint32_t rule, uint32_t type, uint32_t v)
{
    if (p->rc)
        return p->rc;
    if (++p->total > GRAMMAR_MAX_ELEMS)
        return perr(p, "grammar too large (more than %zu elements)", GRAMMAR_MAX_ELEMS);
    struct prule *r = &p->rules[rule];
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        struct el *e = realloc(r->els, cap * sizeof *e);
        if (!e)
            return oom(p);
        r->els = e;
        r->cap = cap;
    }
    r->els[r->n++] = (struct el){type, v};
    return 0;
}

static int64_t set_intern(struct parser *p, const uint32_t set[8])
{
    for (uint32_t i = 0; i < p->n_sets; i++)
        if (memcmp(p->sets + 8 * (size_t)i, set, 32) == 0)
            return i;
    if (p->n_sets == p->cap_sets) {
        uint32_t cap = p->cap_sets ? p->cap_sets * 2 : 16;
        uint32_t *s = realloc(p->sets, (size_t)cap * 32);
        if (!s)
            return oom(p);
        p->sets = s;
        p->cap_sets = cap;
    }
    memcpy(p->sets + 8 * (size_t)p->n_sets, set, 32);
    return p->n_sets++;
}

static int emit_range(struct parser *p, uint32_t rule, unsigned lo, unsigned hi)
{
    uint32_t set[8] = {0};
    for (unsigned b = lo; b <= hi; b++)
        set[b >> 5] |= 1u << (b & 31);
    int64_t id = set_intern(p, set);
    return id < 0 ? (int)id : emit(p, rule, E_SET, (uint32_t)id);
}

static int utf8_encode(uint32_t c, unsigned char *b)
{
    if (c < 0x80) {
        b[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        b[0] = (unsigned char)(0xC0 | c >> 6);
        b[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        b[0] = (unsigned char)(0xE0 | c >> 12);
        b[1] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
        b[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | c >> 18);
    b[1] = (unsigned char)(0x80 | (c >> 12 & 0x3F));
    b[2] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
    b[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

/* Appends to rule an alternative for each UTF-8 byte-range sequence of [lo, hi] (lo and
 * hi of one encoded length, no surrogates), split so that each is a product of byte
 * ranges (the utf8-ranges construction). first: no E_ALT before the first one. */
static int utf8_alts(struct parser *p, uint32_t rule, uint32_t lo, uint32_t hi, bool *first)
{
    static const uint32_t maxc[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= maxc[i] && hi > maxc[i]) {
            int rc = utf8_alts(p, rule, lo, maxc[i], first);
            return rc ? rc : utf8_alts(p, rule, maxc[i] + 1, hi, first);
        }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                int rc = utf8_alts(p, rule, lo, lo | m, first);
                return rc ? rc : utf8_alts(p, rule, (lo | m) + 1, hi, first);
            }
            if ((hi & m) != m) {
                int rc = utf8_alts(p, rule, lo, (hi & ~m) - 1, first);
                return rc ? rc : utf8_alts(p, rule, hi & ~m, hi, first);
            }
        }
    }
    unsigned char a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    if (!*first && emit(p, rule, E_ALT, 0))
        return p->rc;
    *first = false;
    for (int i = 0; i < n; i++)
        if (emit_range(p, rule, a[i], b[i]))
            return p->rc;
    return 0;
}

struct range {
    uint32_t lo, hi;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Compiles a class of code point ranges (negated or not) into rule: one byte set for its
 * ASCII part when that is all, else a synthetic rule of UTF-8 alternatives. */
static int emit_class(struct parser *p, uint32_t rule, struct range *r, size_t n, bool negate)
{
    if (n)
        qsort(r, n, sizeof *r, cmp_range);
    /* Merge, then complement within [0, 0x10FFFF]; drop surrogates. */
    struct range *m = malloc((2 * n + 4) * sizeof *m);
    if (!m)
        return oom(p);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && r[i].lo <= m[k - 1].hi + 1) {
            if (r[i].hi > m[k - 1].hi)
                m[k - 1].hi = r[i].hi;
        } else {
            m[k++] = r[i];
        }
    }
    if (negate) {
        struct range *c = malloc((k + 2) * sizeof *c);
        if (!c) {
            free(m);
            return oom(p);
        }
        size_t j = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < k; i++) {
            if (m[i].lo > next)
                c[j++] = (struct range){next, m[i].lo - 1};
            next = m[i].hi + 1;
        }
        if (next <= 0x10FFFF)
            c[j++] = (struct range){next, 0x10FFFF};
        memcpy(m, c, j * sizeof *c);
        free(c);
        k = j;
    }
    size_t j = 0;
    struct range *o = malloc((k * 2 + 1) * sizeof *o);
    if (!o) {
        free(m);
        return oom(p);
    }
    for (size_t i = 0; i < k; i++) {
        struct range x = m[i];
        if (x.lo <= 0xD7FF || x.hi >= 0xE000) {
            if (x.lo < 0xD800 && x.hi >= 0xD800) {
                o[j++] = (struct range){x.lo, 0xD7FF};
                if (x.hi >= 0xE000)
                    o[j++] = (struct range){0xE000, x.hi};
            } else if (x.lo >= 0xD800 && x.lo <= 0xDFFF) {
                if (x.hi >= 0xE000)
                    o[j++] = (struct range){0xE000, x.hi};
            } else {
                o[j++] = x;
            }
        }
    }
    free(m);
    if (j == 0) {
        free(o);
        return perr(p, "empty character class");
    }
    uint32_t ascii[8] = {0};
    bool has_ascii = false, multi = false;
    for (size_t i = 0; i < j; i++) {
        for (uint32_t c = o[i].lo; c <= o[i].hi && c < 0x80; c++) {
            ascii[c >> 5] |= 1u << (c & 31);
            has_ascii = true;
        }
        multi |= o[i].hi >= 0x80;
    }
    int rc = 0;
    if (!multi) {
        int64_t id = set_intern(p, ascii);
        rc = id < 0 ? (int)id : emit(p, rule, E_SET, (uint32_t)id);
    } else {
        int64_t sub = rule_new(p);
        bool first = true;
        if (sub < 0) {
            rc = (int)sub;
        } else {
            if (has_ascii) {
                int64_t id = set_intern(p, ascii);
                rc = id < 0 ? (int)id : emit(p, (uint32_t)sub, E_SET, (uint32_t)id);
                first = false;
            }
            for (size_t i = 0; i < j && !rc; i++) {
                uint32_t lo = o[i].lo < 0x80 ? 0x80 : o[i].lo;
                if (o[i].hi >= 0x80)
                    rc = utf8_alts(p, (uint32_t)sub, lo, o[i].hi, &first);
            }
            if (!rc)
                rc = emit(p, rule, E_REF, (uint32_t)sub);
        }
    }
    free(o);
    return rc ? rc : p->rc;
}

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips spaces and comments; newlines only when nested. */
static void skip_space(struct parser *p, bool newlines)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n')
                p->s++;
        } else if (c == '\n' && newlines) {
            p->line++;
            p->s++;
        } else {
            break;
        }
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class: an escape or a UTF-8 character. */
static int parse_char(struct parser *p, uint32_t *out)
{
    if (p->s >= p->end)
        return perr(p, "unexpected end of text");
    unsigned char c = (unsigned char)*p->s;
    if (c == '\\') {
        if (++p->s >= p->end)
            return perr(p, "unexpected end of text after \\");
        char e = *p->s++;
        int digits = 0;
        switch (e) {
        case 'n': *out = '\n'; return 0;
        case 'r': *out = '\r'; return 0;
        case 't': *out = '\t'; return 0;
        case '\\': case '"': case '[': case ']': case '\'': case '-': case '^': case '/':
            *out = (unsigned char)e;
            return 0;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return perr(p, "unknown escape \\%c", e);
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = p->s < p->end ? hexval(*p->s) : -1;
            if (h < 0)
                return perr(p, "bad \\%c escape", e);
            v = v << 4 | (uint32_t)h;
            p->s++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return perr(p, "escape out of Unicode range");
        *out = v;
        return 0;
    }
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || p->end - p->s < n)
        return perr(p, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; i++) {
        unsigned char d = (unsigned char)p->s[i];
        if ((d & 0xC0) != 0x80)
            return perr(p, "invalid UTF-8");
        v = v << 6 | (d & 0x3F);
    }
    static const uint32_t minv[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < minv[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, "invalid UTF-8");
    if (c == '\n')
        p->line++;
    p->s += n;
    *out = v;
    return 0;
}

static int parse_alternates(struct parser *p, uint32_t rule, bool nested);

/* Copies the elements of rule from `from` on into a new vector (removed from rule). */
static struct el *cut_tail(struct parser *p, uint32_t rule, size_t from, size_t *n)
{
    struct prule *r = &p->rules[rule];
    *n = r->n - from;
    struct el *x = malloc((*n ? *n : 1) * sizeof *x);
    if (!x) {
        oom(p);
        return NULL;
    }
    if (*n)
        memcpy(x, r->els + from, *n * sizeof *x);
    r->n = from;
    p->total -= *n;
    return x;
}

static int emit_all(struct parser *p, uint32_t rule, const struct el *x, size_t n)
{
    for (size_t i = 0; i < n && !p->rc; i++)
        emit(p, rule, x[i].type, x[i].v);
    return p->rc;
}

/* x{min,max} (max < 0: no bound) in place of x at the end of rule. */
static int repeat(struct parser *p, uint32_t rule, size_t from, int min, int max)
{
    size_t n;
    struct el *x = cut_tail(p, rule, from, &n);
    if (!x)
        return p->rc;
    for (int i = 0; i < min && !p->rc; i++)
        emit_all(p, rule, x, n);
    if (max < 0) {
        /* R ::= x R | ε */
        int64_t r = rule_new(p);
        if (r >= 0 && !emit_all(p, (uint32_t)r, x, n) && !emit(p, (uint32_t)r, E_REF, (uint32_t)r))
            if (!emit(p, (uint32_t)r, E_ALT, 0))
                emit(p, rule, E_REF, (uint32_t)r);
    } else if (max > min) {
        /* R1 ::= x | ε ; Rk ::= x R(k-1) | ε */
        int64_t prev = -1;
        for (int k = 0; k < max - min && !p->rc; k++) {
            int64_t r = rule_new(p);
            if (r < 0)
                break;
            p->rules[r].chain_k = (uint32_t)k + 1; /* ids of one chain follow each other */
            emit_all(p, (uint32_t)r, x, n);
            if (prev >= 0)
                emit(p, (uint32_t)r, E_REF, (uint32_t)prev);
            emit(p, (uint32_t)r, E_ALT, 0);
            prev = r;
        }
        if (prev >= 0)
            emit(p, rule, E_REF, (uint32_t)prev);
    }
    free(x);
    return p->rc;
}

static int parse_int(struct parser *p, int *out)
{
    int v = 0, d = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        v = v * 10 + (*p->s++ - '0');
        if (v > GRAMMAR_MAX_REPEAT)
            return perr(p, "repetition count over %d", GRAMMAR_MAX_REPEAT);
        d++;
    }
    if (!d)
        return perr(p, "expected a number");
    *out = v;
    return 0;
}

static int parse_sequence(struct parser *p, uint32_t rule, bool nested)
{
    size_t last = (size_t)-1; /* start of the last term in rule's elements */
    while (p->s < p->end && !p->rc) {
        char c = *p->s;
        size_t start = p->rules[rule].n;
        if (c == '"') {
            p->s++;
            while (p->s < p->end && *p->s != '"' && !p->rc) {
                uint32_t cp;
                if (parse_char(p, &cp))
                    break;
                unsigned char b[4];
                int n = utf8_encode(cp, b);
                for (int i = 0; i < n; i++)
                    emit_range(p, rule, b[i], b[i]);
            }
            if (p->rc)
                return p->rc;
            if (p->s >= p->end)
                return perr(p, "unterminated literal");
            p->s++;
            last = start;
        } else if (c == '[') {
            p->s++;
            bool negate = p->s < p->end && *p->s == '^';
            if (negate)
                p->s++;
            struct range *r = NULL;
            size_t n = 0, cap = 0;
            while (p->s < p->end && *p->s != ']' && !p->rc) {
                uint32_t lo, hi;
                if (parse_char(p, &lo))
                    break;
                hi = lo;
                if (p->end - p->s >= 2 && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    if (parse_char(p, &hi))
                        break;
                    if (hi < lo) {
                        perr(p, "character range out of order");
                        break;
                    }
                }
                if (n == cap) {
                    cap = cap ? cap * 2 : 8;
                    struct range *nr = realloc(r, cap * sizeof *nr);
                    if (!nr) {
                        oom(p);
                        break;
                    }
                    r = nr;
                }
                r[n++] = (struct range){lo, hi};
            }
            if (!p->rc && p->s >= p->end)
                perr(p, "unterminated character class");
            if (!p->rc) {
                p->s++;
                emit_class(p, rule, r, n, negate);
            }
            free(r);
            if (p->rc)
                return p->rc;
            last = start;
        } else if (c == '.') {
            p->s++;
            struct range none = {0, 0};
            if (emit_class(p, rule, &none, 0, true))
                return p->rc;
            last = start;
        } else if (is_word(c)) {
            const char *name = p->s;
            while (p->s < p->end && is_word(*p->s))
                p->s++;
            int64_t r = rule_find(p, name, (size_t)(p->s - name), true);
            if (r < 0 || emit(p, rule, E_REF, (uint32_t)r))
                return p->rc;
            last = start;
        } else if (c == '(') {
            p->s++;
            if (++p->nest > GRAMMAR_MAX_NEST)
                return perr(p, "parentheses nested deeper than %d", GRAMMAR_MAX_NEST);
            int64_t sub = rule_new(p);
            if (sub < 0)
                return p->rc;
            skip_space(p, true);
            if (parse_alternates(p, (uint32_t)sub, true))
                return p->rc;
            if (p->s >= p->end || *p->s != ')')
                return perr(p, "expected )");
            p->s++;
            p->nest--;
            if (emit(p, rule, E_REF, (uint32_t)sub))
                return p->rc;
            last = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == (size_t)-1)
                return perr(p, "'%c' with nothing before it", c);
            p->s++;
            int min = 0, max = -1;
            if (c == '+')
                min = 1;
            else if (c == '?')
                max = 1;
            else if (c == '{') {
                skip_space(p, nested);
                if (parse_int(p, &min))
                    return p->rc;
                skip_space(p, nested);
                max = min;
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, nested);
                    max = -1;
                    if (p->s < p->end && *p->s != '}' && parse_int(p, &max))
                        return p->rc;
                    skip_space(p, nested);
                }
                if (p->s >= p->end || *p->s != '}')
                    return perr(p, "expected }");
                p->s++;
                if (max >= 0 && max < min)
                    return perr(p, "repetition {%d,%d} out of order", min, max);
            }
            if (repeat(p, rule, last, min, max))
                return p->rc;
            last = (size_t)-1;
        } else {
            break;
        }
        skip_space(p, nested);
    }
    return p->rc;
}

static int parse_alternates(struct parser *p, uint32_t rule, bool nested)
{
    if (parse_sequence(p, rule, nested))
        return p->rc;
    while (p->s < p->end && *p->s == '|') {
        p->s++;
        if (emit(p, rule, E_ALT, 0))
            return p->rc;
        skip_space(p, true);
        if (parse_sequence(p, rule, nested))
            return p->rc;
    }
    return p->rc;
}

static int parse_all(struct parser *p)
{
    skip_space(p, true);
    while (p->s < p->end && !p->rc) {
        const char *name = p->s;
        while (p->s < p->end && is_word(*p->s))
            p->s++;
        if (p->s == name)
            return perr(p, "expected a rule name");
        size_t nlen = (size_t)(p->s - name);
        skip_space(p, false);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0)
            return perr(p, "expected ::= after %.*s", (int)(nlen > 64 ? 64 : nlen), name);
        p->s += 3;
        int64_t r = rule_find(p, name, nlen, true);
        if (r < 0)
            return p->rc;
        if (p->rules[r].defined)
            return perr(p, "rule %.*s defined twice", (int)(nlen > 64 ? 64 : nlen), name);
        p->rules[r].defined = true;
        skip_space(p, true);
        p->nest = 0;
        if (parse_alternates(p, (uint32_t)r, false))
            return p->rc;
        if (p->s < p->end && *p->s != '\n')
            return perr(p, "unexpected '%c'", *p->s);
        skip_space(p, true);
    }
    return p->rc;
}

/* ---- analysis: lengths, left recursion ---- */

static int64_t el_min(const int64_t *rmin, struct el e)
{
    return e.type == E_SET ? 1 : e.type == E_REF ? rmin[e.v] : 0;
}

static int analyse(struct grammar *g, struct parser *p)
{
    int64_t *rmin = malloc(g->n_rules * sizeof *rmin);
    uint8_t *color = calloc(g->n_rules, 1);
    uint32_t *stk = malloc(2 * (size_t)g->n_rules * sizeof *stk);
    if (!rmin || !color || !stk) {
        free(rmin), free(color), free(stk);
        return oom(p);
    }
    for (uint32_t r = 0; r < g->n_rules; r++)
        rmin[r] = INF_LEN;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++)
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
                int64_t sum = 0;
                for (uint32_t i = g->alts[a]; g->elems[i].type > E_ALT; i++) {
                    sum += el_min(rmin, g->elems[i]);
                    sum = sum > INF_LEN ? INF_LEN : sum;
                }
                if (sum < rmin[r]) {
                    rmin[r] = sum;
                    changed = true;
                }
            }
    }
    int rc = 0;
    for (uint32_t r = 0; r < g->n_rules && !rc; r++)
        if (rmin[r] >= INF_LEN && p->rules[r].name[0] != '~')
            rc = cairn_fail(p->err, p->errlen, CAIRN_EFORMAT, "grammar: rule %s never ends", p->rules[r].name);
        else if (rmin[r] >= INF_LEN)
            rc = cairn_fail(p->err, p->errlen, CAIRN_EFORMAT, "grammar: a repetition never ends");
    for (uint32_t i = 0; i < g->n_elems; i++)
        g->rest[i] = 0;
    for (uint32_t r = 0; r < g->n_rules && !rc; r++)
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            uint32_t e = g->alts[a];
            while (g->elems[e].type > E_ALT)
                e++;
            int64_t acc = 0;
            for (uint32_t i = e; i-- > g->alts[a];) {
                acc += el_min(rmin, g->elems[i]);
                g->rest[i] = acc;
            }
        }
    /* Left recursion: a rule reaching itself through references each preceded only by
     * nullable references. Edges r -> s for such references, then an iterative DFS
     * (color 1 on the path, 2 done). */
    uint32_t *e_off = malloc(((size_t)g->n_rules + 1) * sizeof *e_off);
    uint32_t *e_to = malloc(((size_t)g->n_elems + 1) * sizeof *e_to);
    if (!rc && (!e_off || !e_to))
        rc = oom(p);
    uint32_t ne = 0;
    for (uint32_t r = 0; r < g->n_rules && !rc; r++) {
        e_off[r] = ne;
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
            for (uint32_t i = g->alts[a]; g->elems[i].type == E_REF; i++) {
                e_to[ne++] = g->elems[i].v;
                if (rmin[g->elems[i].v] != 0)
                    break;
            }
    }
    if (!rc)
        e_off[g->n_rules] = ne;
    for (uint32_t s = 0; s < g->n_rules && !rc; s++) {
        if (color[s])
            continue;
        size_t sp = 0;
        stk[sp++] = s, stk[sp++] = e_off[s];
        color[s] = 1;
        while (sp && !rc) {
            uint32_t r = stk[sp - 2], k = stk[sp - 1];
            if (k >= e_off[r + 1]) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            stk[sp - 1] = k + 1;
            uint32_t nx = e_to[k];
            if (color[nx] == 1) {
                const char *nm = p->rules[nx].name;
                rc = cairn_fail(p->err, p->errlen, CAIRN_EFORMAT, "grammar: left recursion in rule %s",
                                nm[0] == '~' ? "(a group or repetition)" : nm);
            } else if (!color[nx]) {
                color[nx] = 1;
                stk[sp++] = nx, stk[sp++] = e_off[nx];
            }
        }
    }
    free(e_off), free(e_to);
    free(rmin), free(color), free(stk);
    return rc;
}

static void parser_free(struct parser *p)
{
    for (uint32_t i = 0; i < p->n_rules; i++) {
        free(p->rules[i].name);
        free(p->rules[i].els);
    }
    free(p->rules);
    free(p->sets);
}

void grammar_release(struct grammar *g)
{
    if (!g)
        return;
    free(g->elems);
    free(g->sets);
    free(g->alt_off);
    free(g->alts);
    free(g->rest);
    free(g->rule_start);
    free(g->chain_k);
    free(g);
}

int grammar_parse(struct grammar **out, const char *text, size_t len, const char *root, char *err,
                  size_t errlen)
{
    *out = NULL;
    if (!text || !root)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "grammar: no text");
    if (len > GRAMMAR_MAX_TEXT)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "grammar: over %zu bytes", GRAMMAR_MAX_TEXT);
    struct parser p = {.s = text, .end = text + len, .line = 1, .err = err, .errlen = errlen};
    struct grammar *g = NULL;
    int rc = parse_all(&p);
    if (rc)
        goto done;
    int64_t root_id = rule_find(&p, root, strlen(root), false);
    if (root_id < 0 || !p.rules[root_id].defined) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "grammar: no rule %s", root);
        goto done;
    }
    for (uint32_t i = 0; i < p.n_rules; i++)
        if (!p.rules[i].defined) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "grammar: rule %s is used but not defined", p.rules[i].name);
            goto done;
        }
    g = calloc(1, sizeof *g);
    if (!g) {
        rc = oom(&p);
        goto done;
    }
    g->n_rules = p.n_rules;
    g->root = (uint32_t)root_id;
    size_t total = 0, n_alts = 0;
    for (uint32_t i = 0; i < p.n_rules; i++) {
        total += p.rules[i].n + 1;
        n_alts += 1;
        for (size_t j = 0; j < p.rules[i].n; j++)
            n_alts += p.rules[i].els[j].type == E_ALT;
    }
    g->elems = malloc(total * sizeof *g->elems);
    g->rest = malloc(total * sizeof *g->rest);
    g->alt_off = malloc((p.n_rules + 1) * sizeof *g->alt_off);
    g->alts = malloc(n_alts * sizeof *g->alts);
    g->sets = malloc((p.n_sets ? p.n_sets : 1) * (size_t)32);
    g->rule_start = malloc((p.n_rules + 1) * sizeof *g->rule_start);
    g->chain_k = malloc(p.n_rules * sizeof *g->chain_k);
    if (!g->elems || !g->rest || !g->alt_off || !g->alts || !g->sets || !g->rule_start || !g->chain_k) {
        rc = oom(&p);
        goto done;
    }
    if (p.n_sets)
        memcpy(g->sets, p.sets, (size_t)p.n_sets * 32);
    g->n_sets = p.n_sets;
    uint32_t at = 0, na = 0;
    for (uint32_t i = 0; i < p.n_rules; i++) {
        g->rule_start[i] = at;
        g->chain_k[i] = p.rules[i].chain_k;
        g->alt_off[i] = na;
        g->alts[na++] = at;
        for (size_t j = 0; j < p.rules[i].n; j++) {
            g->elems[at++] = p.rules[i].els[j];
            if (p.rules[i].els[j].type == E_ALT)
                g->alts[na++] = at;
        }
        g->elems[at++] = (struct el){E_END, 0};
    }
    g->alt_off[p.n_rules] = na;
    g->rule_start[p.n_rules] = at;
    g->n_elems = at;
    rc = analyse(g, &p);
done:
    parser_free(&p);
    if (rc) {
        grammar_release(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ---- stack sets ----
 * A state is a flat array: for each stack, its length then its positions (bottom first;
 * the top, last, is an E_SET element). An empty stack means the output may end. */

struct sset {
    uint32_t *d;
    size_t n, cap;
    int count;
};

struct work {
    const struct grammar *g;
    uint32_t *scratch;
    size_t sn, scap;
    int depth;
    int64_t steps; /* expansions in this advance (GRAMMAR_MAX_EXPAND) */
    bool over; /* a limit was hit */
    /* The intermediate stacks one advance has already expanded (flat: length, then
     * positions), found through an open-addressed table of offsets + 1 stamped with the
     * advance's generation, so a reset costs nothing. */
    uint32_t *vis;
    size_t vn, vcap;
    struct vslot *vtab;
    size_t vtcap, vcount;
    uint32_t gen;
    /* The stacks of the set being filled (sset_begin .. sset_add), by the same kind of
     * table: offsets + 1 into that set, stamped with agen. At most GRAMMAR_MAX_STACKS
     * entries, so ATAB_SLOTS never fills past half. */
    struct vslot *atab;
    uint32_t agen;
};

enum { ATAB_SLOTS = 2 * GRAMMAR_MAX_STACKS };

struct vslot {
    uint32_t gen;
    uint32_t off; /* offset + 1 into vis */
};

static bool grow(uint32_t **d, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    uint32_t *n = realloc(*d, c * sizeof *n);
    if (!n)
        return false;
    *d = n;
    *cap = c;
    return true;
}

static uint64_t hash_stack(const uint32_t *d, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= d[i];
        h *= 1099511628211ull;
    }
    return h ^ h >> 29;
}

/* Empties s to be filled by sset_add through w (one set at a time per work). */
static void sset_begin(struct work *w, struct sset *s)
{
    s->n = 0;
    s->count = 0;
    if (++w->agen == 0) { /* wrapped: stale stamps could look current */
        for (size_t i = 0; w->atab && i < ATAB_SLOTS; i++)
            w->atab[i].gen = 0;
        w->agen = 1;
    }
}

/* Adds stk[0, len) to s unless s has it; a hash table keeps this linear in the set's
 * size where a scan of s was quadratic (512 stacks of a wide alternative). */
static int sset_add(struct work *w, struct sset *s, const uint32_t *stk, uint32_t len)
{
    if (!w->atab && !(w->atab = calloc(ATAB_SLOTS, sizeof *w->atab)))
        return CAIRN_ENOMEM;
    size_t h = (size_t)hash_stack(stk, len) & (ATAB_SLOTS - 1);
    for (; w->atab[h].gen == w->agen; h = (h + 1) & (ATAB_SLOTS - 1)) {
        const uint32_t *e = s->d + w->atab[h].off - 1;
        if (e[0] == len && memcmp(e + 1, stk, len * sizeof *stk) == 0)
            return 0;
    }
    if (s->count >= GRAMMAR_MAX_STACKS) {
        w->over = true;
        return 0;
    }
    if (s->n + 1 + len >= UINT32_MAX || !grow(&s->d, &s->cap, s->n + 1 + len))
        return CAIRN_ENOMEM;
    s->d[s->n] = len;
    memcpy(s->d + s->n + 1, stk, len * sizeof *stk);
    w->atab[h] = (struct vslot){w->agen, (uint32_t)s->n + 1};
    s->n += 1 + len;
    s->count++;
    return 0;
}

/* Starts a new advance: nothing expanded yet. */
static void visited_reset(struct work *w)
{
    w->vn = 0;
    w->vcount = 0;
    if (++w->gen == 0) { /* wrapped: stale stamps could look current */
        for (size_t i = 0; i < w->vtcap; i++)
            w->vtab[i].gen = 0;
        w->gen = 1;
    }
}

/* 1 when stk[0, len) was already expanded in this advance, else records it and gives 0;
 * CAIRN_ENOMEM. */
static int visited(struct work *w, const uint32_t *stk, uint32_t len)
{
    if (2 * (w->vcount + 1) > w->vtcap) {
        size_t cap = w->vtcap ? 2 * w->vtcap : 256;
        struct vslot *t = calloc(cap, sizeof *t);
        if (!t)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < w->vtcap; i++) /* rehash the current generation's entries */
            if (w->vtab[i].gen == w->gen) {
                const uint32_t *e = w->vis + w->vtab[i].off - 1;
                size_t h = (size_t)hash_stack(e + 1, e[0]) & (cap - 1);
                while (t[h].gen == w->gen)
                    h = (h + 1) & (cap - 1);
                t[h] = w->vtab[i];
            }
        free(w->vtab);
        w->vtab = t;
        w->vtcap = cap;
    }
    size_t h = (size_t)hash_stack(stk, len) & (w->vtcap - 1);
    for (; w->vtab[h].gen == w->gen; h = (h + 1) & (w->vtcap - 1)) {
        const uint32_t *e = w->vis + w->vtab[h].off - 1;
        if (e[0] == len && memcmp(e + 1, stk, len * sizeof *stk) == 0)
            return 1;
    }
    if (w->vn + 1 + len >= UINT32_MAX || !grow(&w->vis, &w->vcap, w->vn + 1 + len))
        return CAIRN_ENOMEM;
    w->vis[w->vn] = len;
    memcpy(w->vis + w->vn + 1, stk, len * sizeof *stk);
    w->vtab[h] = (struct vslot){w->gen, (uint32_t)w->vn + 1};
    w->vn += 1 + len;
    w->vcount++;
    return 0;
}

/* Expands the stack at scratch[base .. base+len) until its top is a byte set, adding
 * every result to out. What a stack expands to depends only on the stack, so one seen
 * before in this advance is skipped: ambiguous empty alternatives (e ::= "" | "", a
 * sequence of such e) reach the same stacks by exponentially many paths, and only the
 * distinct stacks cost work. */
static int expand(struct work *w, size_t base, uint32_t len, struct sset *out)
{
    const struct grammar *g = w->g;
    for (;;) {
        /* The work of one step is bounded still (deep distinct stacks): past it the
         * continuation counts as impossible. */
        if (++w->steps > GRAMMAR_MAX_EXPAND) {
            w->over = true;
            return 0;
        }
        if (len == 0)
            return sset_add(w, out, w->scratch + base, 0);
        uint32_t pos = w->scratch[base + len - 1];
        struct el e = g->elems[pos];
        if (e.type != E_SET) {
            int seen = visited(w, w->scratch + base, len);
            if (seen < 0)
                return seen;
            if (seen)
                return 0;
        }
        if (e.type == E_END || e.type == E_ALT) {
            len--;
            continue;
        }
        if (e.type == E_SET)
            return sset_add(w, out, w->scratch + base, len);
        /* E_REF: the continuation replaces the top (or is dropped at an alternative's
         * end: a tail call keeps the stack flat), then each alternative goes on top. */
        uint32_t keep = len;
        uint32_t cont = pos + 1;
        if (g->elems[cont].type == E_END || g->elems[cont].type == E_ALT)
            keep = len - 1;
        else
            w->scratch[base + len - 1] = cont;
        if (keep + 1 > GRAMMAR_MAX_DEPTH || w->depth >= 2 * GRAMMAR_MAX_DEPTH) {
            w->over = true;
            return 0;
        }
        w->depth++;
        for (uint32_t a = g->alt_off[e.v]; a < g->alt_off[e.v + 1]; a++) {
            size_t nb = w->sn;
            if (!grow(&w->scratch, &w->scap, nb + keep + 1))
                return CAIRN_ENOMEM;
            memcpy(w->scratch + nb, w->scratch + base, keep * sizeof *w->scratch);
            w->scratch[nb + keep] = g->alts[a];
            w->sn = nb + keep + 1;
            int rc = expand(w, nb, keep + 1, out);
            w->sn = nb;
            if (rc)
                return rc;
        }
        w->depth--;
        return 0;
    }
}

/* out = the stacks of in advanced past byte b. */
static int advance(struct work *w, const struct sset *in, unsigned b, struct sset *out)
{
    sset_begin(w, out);
    visited_reset(w);
    for (size_t i = 0; i < in->n;) {
        uint32_t l = in->d[i];
        const uint32_t *stk = in->d + i + 1;
        i += 1 + l;
        if (l == 0 || !set_has(w->g->sets + 8 * (size_t)w->g->elems[stk[l - 1]].v, b))
            continue;
        size_t base = w->sn;
        if (!grow(&w->scratch, &w->scap, base + l))
            return CAIRN_ENOMEM;
        memcpy(w->scratch + base, stk, l * sizeof *stk);
        w->scratch[base + l - 1]++;
        w->sn = base + l;
        w->depth = 0;
        w->steps = 0;
        int rc = expand(w, base, l, out);
        w->sn = base;
        if (rc)
            return rc;
    }
    return 0;
}

static int start_set(struct work *w, struct sset *out)
{
    sset_begin(w, out);
    visited_reset(w);
    const struct grammar *g = w->g;
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        if (!grow(&w->scratch, &w->scap, 1))
            return CAIRN_ENOMEM;
        w->scratch[0] = g->alts[a];
        w->sn = 1;
        w->depth = 0;
        w->steps = 0;
        int rc = expand(w, 0, 1, out);
        w->sn = 0;
        if (rc)
            return rc;
    }
    return 0;
}

static bool sset_accepting(const struct sset *s)
{
    for (size_t i = 0; i < s->n; i += 1 + s->d[i])
        if (s->d[i] == 0)
            return true;
    return false;
}

static bool sset_done(const struct sset *s)
{
    for (size_t i = 0; i < s->n; i += 1 + s->d[i])
        if (s->d[i] != 0)
            return false;
    return true;
}

static int64_t sset_min_left(const struct grammar *g, const struct sset *s)
{
    int64_t best = INF_LEN;
    for (size_t i = 0; i < s->n; i += 1 + s->d[i]) {
        int64_t sum = 0;
        for (uint32_t j = 0; j < s->d[i]; j++)
            sum += g->rest[s->d[i + 1 + j]];
        best = sum < best ? sum : best;
    }
    return best;
}

bool grammar_matches(const struct grammar *g, const char *s, size_t len)
{
    struct work w = {.g = g};
    struct sset a = {0}, b = {0};
    bool ok = start_set(&w, &a) == 0 && !w.over;
    for (size_t i = 0; i < len && ok; i++) {
        ok = advance(&w, &a, (unsigned char)s[i], &b) == 0 && !w.over && b.count > 0;
        struct sset t = a;
        a = b;
        b = t;
    }
    ok = ok && sset_accepting(&a);
    free(a.d), free(b.d), free(w.scratch), free(w.vis), free(w.vtab), free(w.atab);
    return ok;
}

/* ---- vocabulary trie and the lazy automaton ---- */

struct tnode {
    int32_t child, sibling; /* first child, next sibling; -1: none */
    int32_t token;          /* first token ending here; -1: none (more in tok_next) */
    uint8_t byte;
};

/* A state of the automaton: a stack set, interned, with its transitions filled in as
 * walks need them. */
struct dstate {
    uint32_t *set;
    size_t n;
    int count;
    uint64_t hash;
    int32_t *trans;   /* [256]: -2 unknown, -1 dead */
    uint32_t tops[8]; /* bytes some stack's top accepts */
    int64_t m;        /* sset_min_left */
    bool accepting, done;
    uint32_t *mask;   /* cached token mask, or NULL */
    int64_t mask_mmax;
    /* The allowed tokens after which the fewest bytes left differ from m, with that
     * number: a budget mask is the cached one less those over the limit, or, where the
     * limit is below m, just those within it. moved_full: too many to keep (a budget
     * then walks the trie). */
    struct mtok *moved;
    int32_t n_moved;
    bool moved_full;
};

struct mtok {
    int32_t tok;
    int32_t m;
};

#define MAX_MOVED 8192

#define DFA_MAX_STATES 8192
#define MAX_MASKS 512

/* A vocabulary as masks need it: a trie of every token's bytes. Shared by any number of
 * ctxs (read only once built). */
struct grammar_vocab {
    int32_t n_vocab;
    size_t words;
    struct tnode *nodes;
    int32_t n_nodes;
    int32_t *tok_next;
    uint8_t *eog;
    char *text;        /* every token's bytes, token i at text_off[i] .. text_off[i+1] */
    size_t *text_off;
    int32_t *eog_list;
    int32_t n_eog;
    size_t max_len;    /* bytes of the longest token */
};

struct grammar_ctx {
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct grammar_vocab *own; /* v when the ctx made it */
    struct dstate *st;
    int32_t n_st;
    int32_t *htab; /* open addressing over st, size hcap */
    int32_t hcap;
    int n_masks;
    struct work w;
    struct sset tmp;
    uint32_t *out_mask; /* the budget walk's result */
    int64_t walks, hits;
    /* Masks are looked up by a state's key: its positions with those deep in a bounded
     * repetition's chain moved to the chain's rule R_K, K = longest token + 2 (clamp,
     * NULL when the grammar has no such chain). No token can tell R_k from R_K for
     * k >= K, so the mask is the same, and a string of up to N characters costs one
     * walk instead of one per character. */
    uint32_t *clamp;
    struct sset key;
};

struct grammar_match {
    struct grammar_ctx *c;
    struct sset cur, nxt;
};

static uint64_t hash_set(const uint32_t *d, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= d[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void dfa_clear(struct grammar_ctx *c)
{
    for (int32_t i = 0; i < c->n_st; i++) {
        free(c->st[i].set);
        free(c->st[i].trans);
        free(c->st[i].mask);
        free(c->st[i].moved);
    }
    c->n_st = 0;
    c->n_masks = 0;
    for (int32_t i = 0; i < c->hcap; i++)
        c->htab[i] = -1;
}

/* The state id of set s (interned on first sight); -1 for an empty set, CAIRN_ENOMEM. */
static int32_t intern(struct grammar_ctx *c, const struct sset *s)
{
    if (s->count == 0)
        return -1;
    uint64_t h = hash_set(s->d, s->n);
    int32_t slot = (int32_t)(h & (uint64_t)(c->hcap - 1));
    while (c->htab[slot] >= 0) {
        struct dstate *d = &c->st[c->htab[slot]];
        if (d->hash == h && d->n == s->n && memcmp(d->set, s->d, s->n * sizeof *s->d) == 0)
            return c->htab[slot];
        slot = (slot + 1) & (c->hcap - 1);
    }
    if (c->n_st >= DFA_MAX_STATES)
        return CAIRN_EFULL;
    struct dstate *d = &c->st[c->n_st];
    memset(d, 0, sizeof *d);
    d->set = malloc((s->n ? s->n : 1) * sizeof *d->set);
    d->trans = malloc(256 * sizeof *d->trans);
    if (!d->set || !d->trans) {
        free(d->set), free(d->trans);
        return CAIRN_ENOMEM;
    }
    memcpy(d->set, s->d, s->n * sizeof *s->d);
    d->n = s->n;
    d->count = s->count;
    d->hash = h;
    for (int i = 0; i < 256; i++)
        d->trans[i] = -2;
    for (size_t i = 0; i < s->n; i += 1 + s->d[i])
        if (s->d[i]) {
            const uint32_t *set = c->g->sets + 8 * (size_t)c->g->elems[s->d[i + s->d[i]]].v;
            for (int k = 0; k < 8; k++)
                d->tops[k] |= set[k];
        }
    d->m = sset_min_left(c->g, s);
    d->accepting = sset_accepting(s);
    d->done = sset_done(s);
    c->htab[slot] = c->n_st;
    return c->n_st++;
}

/* The state after byte b from state id; -1 dead; negative codes below -1 are errors. */
static int32_t step(struct grammar_ctx *c, int32_t id, unsigned b)
{
    struct dstate *d = &c->st[id];
    if (d->trans[b] != -2)
        return d->trans[b];
    if (!set_has(d->tops, b)) {
        d->trans[b] = -1;
        return -1;
    }
    struct sset in = {.d = d->set, .n = d->n, .count = d->count};
    c->w.over = false;
    int rc = advance(&c->w, &in, b, &c->tmp);
    if (rc)
        return rc;
    int32_t nid = c->w.over ? -1 : intern(c, &c->tmp);
    if (nid == CAIRN_EFULL)
        return nid;
    if (nid < -1)
        return nid;
    c->st[id].trans[b] = nid; /* st may not move: it is allocated once */
    return nid;
}

void grammar_vocab_release(struct grammar_vocab *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->tok_next);
    free(v->eog);
    free(v->text);
    free(v->text_off);
    free(v->eog_list);
    free(v);
}

static void ctx_free(struct grammar_ctx *c)
{
    if (!c)
        return;
    if (c->st)
        dfa_clear(c);
    free(c->st);
    free(c->htab);
    grammar_vocab_release(c->own);
    free(c->w.scratch);
    free(c->w.vis);
    free(c->w.vtab);
    free(c->w.atab);
    free(c->tmp.d);
    free(c->out_mask);
    free(c->clamp);
    free(c->key.d);
    free(c);
}

void grammar_ctx_release(struct grammar_ctx *c) { ctx_free(c); }

int32_t grammar_ctx_n_vocab(const struct grammar_ctx *c) { return c->v->n_vocab; }

void grammar_ctx_stats(const struct grammar_ctx *c, int64_t *walks, int64_t *hits)
{
    *walks = c->walks;
    *hits = c->hits;
}

static int32_t trie_child(struct grammar_vocab *v, int32_t node, uint8_t b)
{
    int32_t prev = -1;
    for (int32_t k = v->nodes[node].child; k >= 0; k = v->nodes[k].sibling) {
        if (v->nodes[k].byte == b)
            return k;
        prev = k;
    }
    int32_t k = v->n_nodes++;
    v->nodes[k] = (struct tnode){.child = -1, .sibling = -1, .token = -1, .byte = b};
    if (prev < 0)
        v->nodes[node].child = k;
    else
        v->nodes[prev].sibling = k;
    return k;
}

/* Lays the trie out in depth-first order (a node's first child right after it, its
 * subtree contiguous), so that a walk reads memory mostly forwards. */
static int preorder(struct grammar_vocab *v)
{
    int32_t n = v->n_nodes;
    struct tnode *o = malloc((size_t)n * sizeof *o);
    int32_t *stack = malloc((size_t)n * sizeof *stack), *map = malloc((size_t)n * sizeof *map);
    if (!o || !stack || !map) {
        free(o), free(stack), free(map);
        return CAIRN_ENOMEM;
    }
    /* Numbering: pop a node, number it, push its children in reverse so that the first
     * child comes out next. */
    int32_t sp = 0, next = 0;
    stack[sp++] = 0;
    while (sp) {
        int32_t k = stack[--sp];
        map[k] = next++;
        int32_t first = sp;
        for (int32_t c = v->nodes[k].child; c >= 0; c = v->nodes[c].sibling)
            stack[sp++] = c;
        for (int32_t a = first, b = sp - 1; a < b; a++, b--) {
            int32_t t = stack[a];
            stack[a] = stack[b];
            stack[b] = t;
        }
    }
    for (int32_t k = 0; k < n; k++) {
        struct tnode x = v->nodes[k];
        o[map[k]] = (struct tnode){.child = x.child >= 0 ? map[x.child] : -1,
                                   .sibling = x.sibling >= 0 ? map[x.sibling] : -1, .token = x.token, .byte = x.byte};
    }
    free(v->nodes);
    v->nodes = o;
    free(stack), free(map);
    return 0;
}

int grammar_vocab_create(struct grammar_vocab **out, int32_t n, const char *const *bytes, const size_t *lens,
                         const uint8_t *eog)
{
    *out = NULL;
    if (n <= 0 || !bytes || !lens)
        return CAIRN_EINVAL;
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    v->n_vocab = n;
    v->words = ((size_t)n + 31) / 32;
    size_t total = 1;
    for (int32_t i = 0; i < n; i++)
        total += bytes[i] ? lens[i] : 0;
    if (total > INT32_MAX) {
        grammar_vocab_release(v);
        return CAIRN_ERANGE;
    }
    v->nodes = malloc(total * sizeof *v->nodes);
    v->tok_next = malloc((size_t)n * sizeof *v->tok_next);
    v->eog = calloc((size_t)n, 1);
    v->eog_list = malloc((size_t)n * sizeof *v->eog_list);
    v->text = malloc(total);
    v->text_off = malloc(((size_t)n + 1) * sizeof *v->text_off);
    if (!v->text || !v->text_off || !v->nodes || !v->tok_next || !v->eog || !v->eog_list) {
        grammar_vocab_release(v);
        return CAIRN_ENOMEM;
    }
    v->nodes[0] = (struct tnode){.child = -1, .sibling = -1, .token = -1};
    v->n_nodes = 1;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        v->text_off[i] = at;
        if (bytes[i] && lens[i] && !(eog && eog[i])) {
            memcpy(v->text + at, bytes[i], lens[i]);
            at += lens[i];
        }
        v->text_off[i + 1] = at;
    }
    for (int32_t i = 0; i < n; i++) {
        v->tok_next[i] = -1;
        if (eog && eog[i]) {
            v->eog[i] = 1;
            v->eog_list[v->n_eog++] = i;
            continue;
        }
        if (!bytes[i] || !lens[i])
            continue;
        v->max_len = lens[i] > v->max_len ? lens[i] : v->max_len;
        int32_t node = 0;
        for (size_t j = 0; j < lens[i]; j++)
            node = trie_child(v, node, (uint8_t)bytes[i][j]);
        v->tok_next[i] = v->nodes[node].token;
        v->nodes[node].token = i;
    }
    int rc = preorder(v);
    if (rc) {
        grammar_vocab_release(v);
        return rc;
    }
    *out = v;
    return 0;
}

int grammar_ctx_create_shared(struct grammar_ctx **out, const struct grammar *g, const struct grammar_vocab *v)
{
    *out = NULL;
    if (!g || !v)
        return CAIRN_EINVAL;
    struct grammar_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    c->g = g;
    c->v = v;
    c->st = malloc(DFA_MAX_STATES * sizeof *c->st);
    c->hcap = 4 * DFA_MAX_STATES;
    c->htab = malloc((size_t)c->hcap * sizeof *c->htab);
    c->out_mask = malloc(v->words * sizeof *c->out_mask);
    c->w.g = g;
    if (!c->st || !c->htab || !c->out_mask) {
        ctx_free(c);
        return CAIRN_ENOMEM;
    }
    for (int32_t i = 0; i < c->hcap; i++)
        c->htab[i] = -1;
    /* The clamp: R_k (k > K) of a chain to R_K, position for position (every R_k, k >= 2,
     * of a chain has the same elements but the reference to R_(k-1)). */
    uint64_t K = (uint64_t)v->max_len + 2;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        if (g->chain_k[r] <= K || g->chain_k[r] < 2)
            continue;
        uint32_t t = r - (g->chain_k[r] - (uint32_t)K), len = g->rule_start[r + 1] - g->rule_start[r];
        if (g->chain_k[t] != K || g->rule_start[t + 1] - g->rule_start[t] != len)
            continue;
        if (!c->clamp) {
            c->clamp = malloc(g->n_elems * sizeof *c->clamp);
            if (!c->clamp) {
                ctx_free(c);
                return CAIRN_ENOMEM;
            }
            for (uint32_t i = 0; i < g->n_elems; i++)
                c->clamp[i] = i;
        }
        for (uint32_t i = 0; i < len; i++)
            c->clamp[g->rule_start[r] + i] = g->rule_start[t] + i;
    }
    *out = c;
    return 0;
}

/* A ctx owning v, which was just made with result rc (v freed on any failure). */
static int adopt(struct grammar_ctx **out, const struct grammar *g, struct grammar_vocab *v, int rc)
{
    if (!rc)
        rc = grammar_ctx_create_shared(out, g, v);
    if (rc) {
        grammar_vocab_release(v);
        return rc;
    }
    (*out)->own = v;
    return 0;
}

int grammar_ctx_create(struct grammar_ctx **out, const struct grammar *g, int32_t n, const char *const *bytes,
                       const size_t *lens, const uint8_t *eog)
{
    *out = NULL;
    struct grammar_vocab *v = NULL;
    int rc = grammar_vocab_create(&v, n, bytes, lens, eog);
    return adopt(out, g, v, rc);
}

int grammar_vocab_from_tok(struct grammar_vocab **out, const struct tok *t)
{
    *out = NULL;
    int32_t n = tok_n_vocab(t);
    size_t cap = tok_max_token_text(t) + 8;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *eog = calloc((size_t)n, 1);
    char *buf = malloc(cap);
    int rc = bytes && lens && eog && buf ? 0 : CAIRN_ENOMEM;
    for (int32_t i = 0; i < n && !rc; i++) {
        size_t len = 0;
        eog[i] = tok_is_eog(t, i) != 0;
        if (tok_token_text(t, i, 0, buf, cap, &len) || len == 0)
            continue;
        bytes[i] = malloc(len);
        if (!bytes[i]) {
            rc = CAIRN_ENOMEM;
            break;
        }
        memcpy(bytes[i], buf, len);
        lens[i] = len;
    }
    if (!rc)
        rc = grammar_vocab_create(out, n, (const char *const *)bytes, lens, eog);
    for (int32_t i = 0; bytes && i < n; i++)
        free(bytes[i]);
    free(bytes), free(lens), free(eog), free(buf);
    return rc;
}

int grammar_ctx_from_tok(struct grammar_ctx **out, const struct grammar *g, const struct tok *t)
{
    *out = NULL;
    struct grammar_vocab *v = NULL;
    int rc = grammar_vocab_from_tok(&v, t);
    return adopt(out, g, v, rc);
}

/* ---- matcher ---- */

static void set_bit(uint32_t *m, int32_t i) { m[i >> 5] |= 1u << (i & 31); }

struct walk {
    struct grammar_ctx *c;
    uint32_t *mask;
    int64_t limit; /* < 0: none */
    int64_t mmax;
    int rc;
    struct dstate *rec; /* records its moved tokens (a cached mask's walk), or NULL */
};

/* Depth-first over the trie from node in state id: every token whose bytes keep a live
 * state (within the limit) is set. */
static void walk(struct walk *wk, int32_t node, int32_t id)
{
    struct grammar_ctx *c = wk->c;
    for (int32_t k = c->v->nodes[node].child; k >= 0 && !wk->rc; k = c->v->nodes[k].sibling) {
        uint8_t b = c->v->nodes[k].byte;
        if (!set_has(c->st[id].tops, b))
            continue;
        int32_t nid = step(c, id, b);
        if (nid < -1) {
            wk->rc = nid;
            return;
        }
        if (nid < 0)
            continue;
        int64_t m = c->st[nid].m;
        if (c->v->nodes[k].token >= 0 && (wk->limit < 0 || m <= wk->limit)) {
            struct dstate *r = wk->rec;
            for (int32_t t = c->v->nodes[k].token; t >= 0; t = c->v->tok_next[t]) {
                set_bit(wk->mask, t);
                if (r && m != r->m && !r->moved_full) {
                    if (r->n_moved == MAX_MOVED)
                        r->moved_full = true;
                    else
                        r->moved[r->n_moved++] = (struct mtok){t, (int32_t)(m < INT32_MAX ? m : INT32_MAX)};
                }
            }
            wk->mmax = m > wk->mmax ? m : wk->mmax;
        }
        if (c->v->nodes[k].child >= 0)
            walk(wk, k, nid);
    }
}

static int compute(struct grammar_ctx *c, int32_t id, int64_t limit, uint32_t *mask, int64_t *mmax)
{
    memset(mask, 0, c->v->words * sizeof *mask);
    struct walk wk = {.c = c, .mask = mask, .limit = limit, .mmax = 0};
    if (limit < 0) { /* the cached mask: record the moved tokens */
        struct dstate *d = &c->st[id];
        d->n_moved = 0;
        d->moved_full = false;
        if (!d->moved && !(d->moved = malloc(MAX_MOVED * sizeof *d->moved)))
            d->moved_full = true;
        wk.rec = d;
    }
    walk(&wk, 0, id);
    if (c->st[id].accepting)
        for (int32_t i = 0; i < c->v->n_eog; i++)
            set_bit(mask, c->v->eog_list[i]);
    *mmax = wk.mmax;
    c->walks++;
    return wk.rc;
}

int grammar_match_create(struct grammar_match **out, struct grammar_ctx *c)
{
    *out = NULL;
    struct grammar_match *m = calloc(1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    m->c = c;
    c->w.over = false;
    int rc = start_set(&c->w, &m->cur);
    if (!rc && c->w.over)
        rc = CAIRN_EFORMAT;
    if (rc) {
        grammar_match_release(m);
        return rc;
    }
    *out = m;
    return 0;
}

void grammar_match_release(struct grammar_match *m)
{
    if (!m)
        return;
    free(m->cur.d);
    free(m->nxt.d);
    free(m);
}

int grammar_match_clone(struct grammar_match **out, const struct grammar_match *m)
{
    *out = NULL;
    struct grammar_match *k = calloc(1, sizeof *k);
    if (!k)
        return CAIRN_ENOMEM;
    k->c = m->c;
    k->cur = m->cur;
    k->cur.d = malloc((m->cur.n ? m->cur.n : 1) * sizeof *k->cur.d);
    k->cur.cap = m->cur.n ? m->cur.n : 1;
    if (!k->cur.d) {
        free(k);
        return CAIRN_ENOMEM;
    }
    memcpy(k->cur.d, m->cur.d, m->cur.n * sizeof *m->cur.d);
    *out = k;
    return 0;
}

int grammar_match_copy(struct grammar_match *dst, const struct grammar_match *src)
{
    if (!grow(&dst->cur.d, &dst->cur.cap, src->cur.n ? src->cur.n : 1))
        return CAIRN_ENOMEM;
    memcpy(dst->cur.d, src->cur.d, src->cur.n * sizeof *src->cur.d);
    dst->cur.n = src->cur.n;
    dst->cur.count = src->cur.count;
    dst->c = src->c;
    return 0;
}

static bool mask_empty(const uint32_t *m, size_t words);
static int budget_mask(struct grammar_ctx *c, struct dstate *d, int64_t limit);

int grammar_match_mask(struct grammar_match *m, int64_t budget, const uint32_t **mask)
{
    struct grammar_ctx *c = m->c;
    if (c->n_st >= DFA_MAX_STATES - 1024 || c->n_masks >= MAX_MASKS)
        dfa_clear(c);
    const struct sset *key = &m->cur;
    if (c->clamp) {
        sset_begin(&c->w, &c->key);
        c->w.over = false;
        for (size_t i = 0; i < m->cur.n; i += 1 + m->cur.d[i]) {
            uint32_t l = m->cur.d[i];
            if (!grow(&c->w.scratch, &c->w.scap, l ? l : 1))
                return CAIRN_ENOMEM;
            for (uint32_t j = 0; j < l; j++)
                c->w.scratch[j] = c->clamp[m->cur.d[i + 1 + j]];
            int rc = sset_add(&c->w, &c->key, c->w.scratch, l);
            if (rc)
                return rc;
        }
        key = &c->key;
    }
    int32_t id = intern(c, key);
    if (id == -1) {
        memset(c->out_mask, 0, c->v->words * sizeof *c->out_mask);
        *mask = c->out_mask;
        return 0;
    }
    if (id < 0)
        return id;
    struct dstate *d = &c->st[id];
    if (!d->mask) {
        d->mask = malloc(c->v->words * sizeof *d->mask);
        if (!d->mask)
            return CAIRN_ENOMEM;
        int rc = compute(c, id, -1, d->mask, &d->mask_mmax);
        if (rc == CAIRN_EFULL) {
            /* The automaton filled up during the walk: start it afresh once. */
            uint32_t *keep = d->mask;
            d->mask = NULL;
            dfa_clear(c);
            id = intern(c, key);
            if (id < 0) {
                free(keep);
                return id == -1 ? CAIRN_EFORMAT : id;
            }
            d = &c->st[id];
            d->mask = keep;
            rc = compute(c, id, -1, d->mask, &d->mask_mmax);
        }
        if (rc) {
            free(c->st[id].mask);
            c->st[id].mask = NULL;
            return rc == CAIRN_EFULL ? CAIRN_EFORMAT : rc;
        }
        c->n_masks++;
    } else {
        c->hits++;
    }
    d = &c->st[id];
    if (budget < 0 || d->mask_mmax <= budget - 1) {
        *mask = d->mask;
        return 0;
    }
    int64_t limit = budget - 1 < 0 ? 0 : budget - 1;
    int rc = budget_mask(c, d, limit);
    if (rc)
        return rc;
    if (mask_empty(c->out_mask, c->v->words)) {
        /* Fewest bytes is an upper bound on the tokens an ending needs: with a real
         * vocabulary's longer tokens the ending may still fit although no token brings
         * the bytes within the budget. Then the tokens that bring the end nearer, or
         * failing those every allowed one: the output may be cut, never refused. */
        rc = budget_mask(c, d, d->m > 0 ? d->m - 1 : 0);
        if (rc)
            return rc;
        if (mask_empty(c->out_mask, c->v->words))
            memcpy(c->out_mask, d->mask, c->v->words * sizeof *c->out_mask);
    }
    *mask = c->out_mask;
    return 0;
}

static bool mask_empty(const uint32_t *m, size_t words)
{
    for (size_t i = 0; i < words; i++)
        if (m[i])
            return false;
    return true;
}

/* c->out_mask = the cached mask of d less the tokens after which more than limit bytes
 * are left. */
static int budget_mask(struct grammar_ctx *c, struct dstate *d, int64_t limit)
{
    int32_t id = (int32_t)(d - c->st);
    if (!d->moved_full && d->moved) {
        uint32_t *o = c->out_mask;
        if (limit >= d->m) {
            memcpy(o, d->mask, c->v->words * sizeof *o);
            for (int32_t i = 0; i < d->n_moved; i++)
                if (d->moved[i].m > limit)
                    o[d->moved[i].tok >> 5] &= ~(1u << (d->moved[i].tok & 31));
        } else { /* only tokens that bring the end nearer (never an end token: m > 0) */
            memset(o, 0, c->v->words * sizeof *o);
            for (int32_t i = 0; i < d->n_moved; i++)
                if (d->moved[i].m <= limit)
                    set_bit(o, d->moved[i].tok);
        }
        return 0;
    }
    int64_t mm;
    int rc = compute(c, id, limit, c->out_mask, &mm);
    return rc == CAIRN_EFULL ? CAIRN_EFORMAT : rc;
}

int grammar_match_accept_bytes(struct grammar_match *m, const char *s, size_t len)
{
    struct grammar_ctx *c = m->c;
    for (size_t i = 0; i < len; i++) {
        c->w.over = false;
        int rc = advance(&c->w, &m->cur, (unsigned char)s[i], &m->nxt);
        if (rc)
            return rc;
        if (c->w.over)
            return CAIRN_EFORMAT;
        if (m->nxt.count == 0)
            return CAIRN_EINVAL;
        struct sset t = m->cur;
        m->cur = m->nxt;
        m->nxt = t;
    }
    return 0;
}

int grammar_match_accept(struct grammar_match *m, int32_t id)
{
    struct grammar_ctx *c = m->c;
    if (id < 0 || id >= c->v->n_vocab)
        return CAIRN_ERANGE;
    if (c->v->eog[id]) {
        if (!sset_accepting(&m->cur))
            return CAIRN_EINVAL;
        m->cur.n = 1;
        m->cur.d[0] = 0;
        m->cur.count = 1;
        return 0;
    }
    size_t len = c->v->text_off[id + 1] - c->v->text_off[id];
    if (len == 0)
        return CAIRN_EINVAL; /* renders nothing: never part of a constrained output */
    return grammar_match_accept_bytes(m, c->v->text + c->v->text_off[id], len);
}

bool grammar_match_accepting(const struct grammar_match *m) { return sset_accepting(&m->cur); }

bool grammar_match_done(const struct grammar_match *m) { return sset_done(&m->cur); }

int64_t grammar_match_min_left(const struct grammar_match *m) { return sset_min_left(m->c->g, &m->cur); }
