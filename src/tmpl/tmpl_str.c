/* Python's str for templates: the methods chat templates call, case mapping (ASCII
 * exactly, other letters through the C.UTF-8 locale's simple mappings) and markupsafe's
 * escape. Indices count code points. str.format and `%` are in tmpl_fmt.c. */
#define _GNU_SOURCE
#include "tmpl/tmpl_lib.h"

#include "base/err.h"

#include <string.h>
#include <wctype.h>

/* ---- characters ---- */

static uint32_t cp_upper(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    return c->t->loc ? (uint32_t)towupper_l((wint_t)cp, c->t->loc) : cp;
}

static uint32_t cp_lower(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    return c->t->loc ? (uint32_t)towlower_l((wint_t)cp, c->t->loc) : cp;
}

/* Title-case letters (Lt: 'ǅ'), neither upper nor lower case for Python. */
static bool cp_istitle(uint32_t cp)
{
    return cp == 0x1C5 || cp == 0x1C8 || cp == 0x1CB || cp == 0x1F2 || (cp >= 0x1F88 && cp <= 0x1F8F) ||
           (cp >= 0x1F98 && cp <= 0x1F9F) || (cp >= 0x1FA8 && cp <= 0x1FAF) || cp == 0x1FBC || cp == 0x1FCC ||
           cp == 0x1FFC;
}

static bool cp_isupper(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'A' && cp <= 'Z';
    return c->t->loc && !cp_istitle(cp) && iswupper_l((wint_t)cp, c->t->loc);
}

static bool cp_islower(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'a' && cp <= 'z';
    return c->t->loc && !cp_istitle(cp) && iswlower_l((wint_t)cp, c->t->loc);
}

static bool cp_isalpha(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return (cp | 32) >= 'a' && (cp | 32) <= 'z';
    return c->t->loc && iswalpha_l((wint_t)cp, c->t->loc);
}

static bool cp_isdigit(const struct tctx *c, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return c->t->loc && iswdigit_l((wint_t)cp, c->t->loc);
}

static bool cp_iscased(const struct tctx *c, uint32_t cp) { return cp_isupper(c, cp) || cp_islower(c, cp) || cp_istitle(cp); }

size_t tmpl_linebreak(const char *p, size_t n)
{
    unsigned char ch = (unsigned char)p[0];
    if (ch == '\r')
        return n > 1 && p[1] == '\n' ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || ch == 0x1C || ch == 0x1D || ch == 0x1E)
        return 1;
    if (ch >= 0x80) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p, n, &cp);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029)
            return k;
    }
    return 0;
}

static struct tv strv(const char *p, size_t n, uint8_t f)
{
    struct tv v = tv_str(p, n);
    v.f = f;
    return v;
}

/* ---- case mapping ---- */

enum { CASE_LOWER, CASE_UPPER, CASE_SWAP, CASE_TITLE, CASE_CAPITALIZE };

static void put_cp(struct tsb *b, uint32_t cp)
{
    char u[4];
    tmpl_sb_put(b, u, tmpl_utf8_enc(cp, u));
}

static void put_seq(struct tsb *b, const uint32_t *seq)
{
    for (int i = 0; i < 3 && seq[i]; i++)
        put_cp(b, seq[i]);
}

static void put_upper(const struct tctx *c, struct tsb *b, uint32_t cp)
{
    const struct tmpl_case_row *r = cp >= 0xDF ? tmpl_case_special(cp) : NULL;
    if (r && r->up[0])
        put_seq(b, r->up);
    else
        put_cp(b, cp_upper(c, cp));
}

static void put_title(const struct tctx *c, struct tsb *b, uint32_t cp)
{
    const struct tmpl_case_row *r = cp >= 0xDF ? tmpl_case_special(cp) : NULL;
    if (r && r->title[0])
        put_seq(b, r->title);
    else
        put_upper(c, b, cp);
}

/* Apostrophes, periods, combining marks and the like, which Final_Sigma looks through. */
static bool case_ignorable(uint32_t cp)
{
    return cp == 0x27 || cp == 0x2E || cp == 0x3A || cp == 0x5E || cp == 0x60 || cp == 0xA8 || cp == 0xAD ||
           cp == 0xAF || cp == 0xB4 || cp == 0xB7 || cp == 0xB8 || cp == 0x2018 || cp == 0x2019 ||
           (cp >= 0x2B0 && cp <= 0x36F);
}

/* Greek capital sigma lowers to final sigma at the end of a word (Python's Final_Sigma). */
static bool final_sigma(const struct tctx *c, const char *p, size_t n, size_t at, size_t len)
{
    size_t j = at;
    uint32_t cp = 0;
    bool found = false;
    while (j > 0) {
        size_t st = j - 1;
        while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        tmpl_utf8_dec(p + st, j - st, &cp);
        j = st;
        if (!case_ignorable(cp)) {
            found = true;
            break;
        }
    }
    if (!found || !cp_iscased(c, cp))
        return false;
    for (j = at + len; j < n;) {
        j += tmpl_utf8_dec(p + j, n - j, &cp);
        if (!case_ignorable(cp))
            return !cp_iscased(c, cp);
    }
    return true;
}

static void put_lower(const struct tctx *c, struct tsb *b, const char *p, size_t n, size_t at, size_t len, uint32_t cp)
{
    if (cp == 0x130) {
        put_cp(b, 'i');
        put_cp(b, 0x307);
    } else if (cp == 0x3A3) {
        put_cp(b, final_sigma(c, p, n, at, len) ? 0x3C2 : 0x3C3);
    } else {
        put_cp(b, cp_lower(c, cp));
    }
}

static int map_case(struct tctx *c, const struct tv *s, int mode, struct tv *out)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    struct tsb b;
    tmpl_sb_init(&b, c);
    bool prev_cased = false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
        switch (mode) {
        case CASE_LOWER:
            put_lower(c, &b, p, n, i, k, cp);
            break;
        case CASE_UPPER:
            put_upper(c, &b, cp);
            break;
        case CASE_SWAP:
            if (cp_isupper(c, cp))
                put_lower(c, &b, p, n, i, k, cp);
            else if (cp_islower(c, cp))
                put_upper(c, &b, cp);
            else
                put_cp(&b, cp);
            break;
        case CASE_TITLE:
            if (prev_cased)
                put_lower(c, &b, p, n, i, k, cp);
            else
                put_title(c, &b, cp);
            prev_cased = cp_iscased(c, cp);
            break;
        default:
            if (i == 0)
                put_title(c, &b, cp);
            else
                put_lower(c, &b, p, n, i, k, cp);
            break;
        }
        i += k;
    }
    int rc = tmpl_sb_to_str(c, &b, out);
    if (!rc)
        out->f = s->f;
    return rc;
}

int tmpl_str_case(struct tctx *c, const struct tv *s, bool upper, struct tv *out)
{
    return map_case(c, s, upper ? CASE_UPPER : CASE_LOWER, out);
}

int tmpl_str_capitalize(struct tctx *c, const struct tv *s, struct tv *out)
{
    return map_case(c, s, CASE_CAPITALIZE, out);
}

static bool title_sep(uint32_t cp)
{
    return tmpl_py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
}

int tmpl_str_title_filter(struct tctx *c, const struct tv *s, struct tv *out)
{
    /* item[0].upper() + item[1:].lower() for the words between separators; the rest of
     * a word is lower-cased on its own (Final_Sigma does not see the first letter) */
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
        if (title_sep(cp)) {
            put_cp(&b, cp);
            i += k;
            continue;
        }
        size_t e = i + k;
        while (e < n) {
            uint32_t x;
            size_t kk = tmpl_utf8_dec(p + e, n - e, &x);
            if (title_sep(x))
                break;
            e += kk;
        }
        put_upper(c, &b, cp);
        const char *rest = p + i + k;
        size_t rn = e - i - k;
        for (size_t j = 0; j < rn;) {
            uint32_t x;
            size_t kk = tmpl_utf8_dec(rest + j, rn - j, &x);
            put_lower(c, &b, rest, rn, j, kk, x);
            j += kk;
        }
        i = e;
    }
    return tmpl_sb_to_str(c, &b, out);
}

bool tmpl_str_islower(const struct tctx *c, const struct tv *s)
{
    bool cased = false;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += tmpl_utf8_dec(s->u.s.p + i, s->u.s.n - i, &cp);
        if (cp_isupper(c, cp) || cp_istitle(cp))
            return false;
        cased |= cp_islower(c, cp);
    }
    return cased;
}

bool tmpl_str_isupper(const struct tctx *c, const struct tv *s)
{
    bool cased = false;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += tmpl_utf8_dec(s->u.s.p + i, s->u.s.n - i, &cp);
        if (cp_islower(c, cp) || cp_istitle(cp))
            return false;
        cased |= cp_isupper(c, cp);
    }
    return cased;
}

int tmpl_html_escape(struct tctx *c, const struct tv *in, struct tv *out)
{
    if (in->t == TV_STR && (in->f & TVF_MARKUP)) {
        *out = *in;
        return 0;
    }
    struct tv s;
    int rc = tmpl_str_of(c, NULL, in, &s);
    if (rc)
        return rc;
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (size_t i = 0; i < s.u.s.n; i++) {
        switch (s.u.s.p[i]) {
        case '&': tmpl_sb_puts(&b, "&amp;"); break;
        case '<': tmpl_sb_puts(&b, "&lt;"); break;
        case '>': tmpl_sb_puts(&b, "&gt;"); break;
        case '\'': tmpl_sb_puts(&b, "&#39;"); break;
        case '"': tmpl_sb_puts(&b, "&#34;"); break;
        default: tmpl_sb_putc(&b, s.u.s.p[i]);
        }
    }
    if ((rc = tmpl_sb_to_str(c, &b, out)))
        return rc;
    out->f = TVF_MARKUP;
    return 0;
}

/* ---- strip, split, find ---- */

static bool in_chars(const struct tv *chars, uint32_t cp)
{
    if (!chars)
        return tmpl_py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;) {
        uint32_t x;
        i += tmpl_utf8_dec(chars->u.s.p + i, chars->u.s.n - i, &x);
        if (x == cp)
            return true;
    }
    return false;
}

int tmpl_str_strip(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *chars, int which,
                   struct tv *out)
{
    if (chars && (chars->t == TV_NONE || chars->t == TV_MISSING))
        chars = NULL;
    if (chars && chars->t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "strip arg must be None or str");
    const char *p = s->u.s.p;
    size_t st = 0, end = s->u.s.n;
    if (which & 1)
        while (st < end) {
            uint32_t cp;
            size_t k = tmpl_utf8_dec(p + st, end - st, &cp);
            if (!in_chars(chars, cp))
                break;
            st += k;
        }
    if (which & 2)
        while (end > st) {
            size_t b = end - 1;
            while (b > st && ((unsigned char)p[b] & 0xC0) == 0x80)
                b--;
            uint32_t cp;
            tmpl_utf8_dec(p + b, end - b, &cp);
            if (!in_chars(chars, cp))
                break;
            end = b;
        }
    *out = strv(p + st, end - st, s->f);
    return 0;
}

static int push_str(struct tctx *c, const struct tnode *at, struct tlist *l, const char *p, size_t n, uint8_t f)
{
    if (tmpl_list_push(c, l, strv(p, n, f)))
        return tmpl_oom(c, at);
    return 0;
}

static int mk_list(struct tctx *c, const struct tnode *at, struct tlist **l)
{
    if (!(*l = tmpl_list_new(c, 0)))
        return tmpl_oom(c, at);
    return 0;
}

static int split(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *sep, int64_t maxsplit,
                 bool right, struct tv *out)
{
    struct tlist *l;
    int rc;
    if ((rc = mk_list(c, at, &l)))
        return rc;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep) {
        /* runs of whitespace; leading/trailing ignored */
        if (!right) {
            size_t i = 0;
            for (;;) {
                while (i < n) {
                    uint32_t cp;
                    size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
                    if (!tmpl_py_space(cp))
                        break;
                    i += k;
                }
                if (i >= n)
                    break;
                if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
                    size_t e = n;  /* the rest, trailing whitespace kept */
                    if ((rc = push_str(c, at, l, p + i, e - i, s->f)))
                        return rc;
                    break;
                }
                size_t st = i;
                while (i < n) {
                    uint32_t cp;
                    size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
                    if (tmpl_py_space(cp))
                        break;
                    i += k;
                }
                if ((rc = push_str(c, at, l, p + st, i - st, s->f)))
                    return rc;
            }
        } else {
            size_t e = n;
            struct tlist *rev;
            if ((rc = mk_list(c, at, &rev)))
                return rc;
            for (;;) {
                while (e > 0) {
                    size_t b = e - 1;
                    while (b > 0 && ((unsigned char)p[b] & 0xC0) == 0x80)
                        b--;
                    uint32_t cp;
                    tmpl_utf8_dec(p + b, e - b, &cp);
                    if (!tmpl_py_space(cp))
                        break;
                    e = b;
                }
                if (e == 0)
                    break;
                if (maxsplit >= 0 && (int64_t)rev->n == maxsplit) {
                    if ((rc = push_str(c, at, rev, p, e, s->f)))
                        return rc;
                    break;
                }
                size_t st = e;
                while (st > 0) {
                    size_t b = st - 1;
                    while (b > 0 && ((unsigned char)p[b] & 0xC0) == 0x80)
                        b--;
                    uint32_t cp;
                    tmpl_utf8_dec(p + b, st - b, &cp);
                    if (tmpl_py_space(cp))
                        break;
                    st = b;
                }
                if ((rc = push_str(c, at, rev, p + st, e - st, s->f)))
                    return rc;
                e = st;
            }
            for (size_t i = rev->n; i > 0; i--)
                if (tmpl_list_push(c, l, rev->v[i - 1]))
                    return tmpl_oom(c, at);
        }
    } else {
        const char *q = sep->u.s.p;
        size_t m = sep->u.s.n;
        if (!m)
            return tmpl_err(c, at, CAIRN_EFORMAT, "empty separator");
        if (!right) {
            size_t i = 0;
            for (;;) {
                const char *hit = maxsplit >= 0 && (int64_t)l->n >= maxsplit ? NULL
                                  : n - i >= m ? memmem(p + i, n - i, q, m) : NULL;
                if (!hit) {
                    if ((rc = push_str(c, at, l, p + i, n - i, s->f)))
                        return rc;
                    break;
                }
                if ((rc = push_str(c, at, l, p + i, (size_t)(hit - (p + i)), s->f)))
                    return rc;
                i = (size_t)(hit - p) + m;
            }
        } else {
            struct tlist *rev;
            if ((rc = mk_list(c, at, &rev)))
                return rc;
            size_t e = n;
            for (;;) {
                size_t hit = (size_t)-1;
                if (!(maxsplit >= 0 && (int64_t)rev->n >= maxsplit) && e >= m)
                    for (size_t j = e - m + 1; j > 0; j--)
                        if (!memcmp(p + j - 1, q, m)) {
                            hit = j - 1;
                            break;
                        }
                if (hit == (size_t)-1) {
                    if ((rc = push_str(c, at, rev, p, e, s->f)))
                        return rc;
                    break;
                }
                if ((rc = push_str(c, at, rev, p + hit + m, e - hit - m, s->f)))
                    return rc;
                e = hit;
            }
            for (size_t i = rev->n; i > 0; i--)
                if (tmpl_list_push(c, l, rev->v[i - 1]))
                    return tmpl_oom(c, at);
        }
    }
    out->t = TV_LIST;
    out->f = 0;
    out->u.l = l;
    return 0;
}

/* start/end arguments (code point indices, None allowed) as a byte range of s. */
static int sub_range(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *start,
                     const struct tv *end, size_t *b0, size_t *b1, bool *empty)
{
    int64_t len = (int64_t)tmpl_cp_count(s->u.s.p, s->u.s.n);
    int64_t st = 0, en = len;
    *empty = false;
    if (start && start->t != TV_MISSING && start->t != TV_NONE) {
        if (!tv_is_intlike(start))
            return tmpl_err(c, at, CAIRN_EFORMAT, "slice indices must be integers or None");
        st = tv_as_int(start);
        if (st < 0 && (st += len) < 0)
            st = 0;
    }
    if (end && end->t != TV_MISSING && end->t != TV_NONE) {
        if (!tv_is_intlike(end))
            return tmpl_err(c, at, CAIRN_EFORMAT, "slice indices must be integers or None");
        en = tv_as_int(end);
        if (en < 0 && (en += len) < 0)
            en = 0;
    }
    if (en > len)
        en = len;
    if (st > len) {
        *empty = true;
        st = len;
    }
    if (en < st)
        en = st;
    *b0 = tmpl_cp_off(s->u.s.p, s->u.s.n, st);
    *b1 = tmpl_cp_off(s->u.s.p, s->u.s.n, en);
    return 0;
}

static int affix(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *arg,
                 const struct tv *start, const struct tv *end, bool suffix, bool *res)
{
    size_t b0, b1;
    bool empty;
    int rc = sub_range(c, at, s, start, end, &b0, &b1, &empty);
    if (rc)
        return rc;
    *res = false;
    const struct tv *cands = arg;
    size_t ncand = 1;
    if (arg->t == TV_TUPLE) {
        cands = arg->u.l->v;
        ncand = arg->u.l->n;
    } else if (arg->t != TV_STR) {
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s first arg must be str or a tuple of str, not %s",
                        suffix ? "endswith" : "startswith", tmpl_type_name(arg));
    }
    if (empty)
        return 0;
    for (size_t i = 0; i < ncand; i++) {
        const struct tv *x = &cands[i];
        if (x->t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "tuple for %s must only contain str, not %s",
                            suffix ? "endswith" : "startswith", tmpl_type_name(x));
        size_t m = x->u.s.n;
        if (m > b1 - b0)
            continue;
        if (!memcmp(s->u.s.p + (suffix ? b1 - m : b0), x->u.s.p, m)) {
            *res = true;
            return 0;
        }
    }
    return 0;
}

/* find/rfind/index/rindex/count */
static int find(struct tctx *c, const struct tnode *at, int id, const struct tv *s, const struct tv *sub,
                const struct tv *start, const struct tv *end, struct tv *out)
{
    if (sub->t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "must be str, not %s", tmpl_type_name(sub));
    size_t b0, b1;
    bool empty;
    int rc = sub_range(c, at, s, start, end, &b0, &b1, &empty);
    if (rc)
        return rc;
    const char *p = s->u.s.p;
    size_t m = sub->u.s.n;
    if (id == MS_COUNT) {
        int64_t k = 0;
        if (empty) {
            *out = tv_int(0);
            return 0;
        }
        if (!m) {
            *out = tv_int((int64_t)tmpl_cp_count(p + b0, b1 - b0) + 1);
            return 0;
        }
        for (size_t i = b0; i + m <= b1;) {
            const char *h = memmem(p + i, b1 - i, sub->u.s.p, m);
            if (!h)
                break;
            k++;
            i = (size_t)(h - p) + m;
        }
        *out = tv_int(k);
        return 0;
    }
    bool rev = id == MS_RFIND || id == MS_RINDEX;
    long pos = -1;
    if (!empty && m <= b1 - b0) {
        if (!rev) {
            const char *h = m ? memmem(p + b0, b1 - b0, sub->u.s.p, m) : p + b0;
            if (h)
                pos = (long)(h - p);
        } else {
            for (size_t j = b1 - m + 1; j > b0; j--)
                if (!memcmp(p + j - 1, sub->u.s.p, m)) {
                    pos = (long)(j - 1);
                    break;
                }
        }
    }
    if (pos < 0) {
        if (id == MS_INDEX || id == MS_RINDEX)
            return tmpl_err(c, at, CAIRN_EFORMAT, "substring not found");
        *out = tv_int(-1);
        return 0;
    }
    *out = tv_int((int64_t)tmpl_cp_count(p, (size_t)pos));
    return 0;
}

int tmpl_str_replace(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *old,
                     const struct tv *new_, int64_t count, struct tv *out)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, m = old->u.s.n;
    struct tsb b;
    tmpl_sb_init(&b, c);
    int64_t done = 0;
    if (!m) {
        /* insert between every code point */
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) {
                tmpl_sb_put(&b, new_->u.s.p, new_->u.s.n);
                done++;
            }
            if (i >= n)
                break;
            size_t e = i + 1;
            while (e < n && ((unsigned char)p[e] & 0xC0) == 0x80)
                e++;
            tmpl_sb_put(&b, p + i, e - i);
            i = e;
        }
    } else {
        size_t i = 0;
        while (i < n) {
            const char *h = (count < 0 || done < count) && n - i >= m ? memmem(p + i, n - i, old->u.s.p, m) : NULL;
            if (!h) {
                tmpl_sb_put(&b, p + i, n - i);
                break;
            }
            tmpl_sb_put(&b, p + i, (size_t)(h - (p + i)));
            tmpl_sb_put(&b, new_->u.s.p, new_->u.s.n);
            done++;
            i = (size_t)(h - p) + m;
        }
    }
    if (b.fail) {
        tmpl_sb_free(&b);
        return tmpl_err(c, at, CAIRN_EFULL, "string over the output limit (%zu bytes)", c->max_str);
    }
    return tmpl_sb_to_str(c, &b, out);
}

int tmpl_str_pad(struct tctx *c, const struct tnode *at, const struct tv *s, int64_t width, uint32_t fill,
                 char align, struct tv *out)
{
    int64_t len = (int64_t)tmpl_cp_count(s->u.s.p, s->u.s.n);
    if (width <= len) {
        *out = *s;
        return 0;
    }
    if (width > (int64_t)c->max_str)
        return tmpl_err(c, at, CAIRN_EFULL, "string over the output limit (%zu bytes)", c->max_str);
    int64_t marg = width - len, left;
    if (align == '<')
        left = 0;
    else if (align == '>')
        left = marg;
    else if (align == 'c')
        left = marg / 2;
    else
        left = marg / 2 + (marg & width & 1);
    char u[4];
    size_t k = tmpl_utf8_enc(fill, u);
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (int64_t i = 0; i < left; i++)
        tmpl_sb_put(&b, u, k);
    tmpl_sb_put(&b, s->u.s.p, s->u.s.n);
    for (int64_t i = left; i < marg; i++)
        tmpl_sb_put(&b, u, k);
    int rc = tmpl_sb_to_str(c, &b, out);
    if (!rc)
        out->f = s->f;
    return rc;
}

static int partition(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *sep, bool right,
                     struct tv *out)
{
    if (sep->t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "must be str, not %s", tmpl_type_name(sep));
    if (!sep->u.s.n)
        return tmpl_err(c, at, CAIRN_EFORMAT, "empty separator");
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, m = sep->u.s.n;
    long pos = -1;
    if (m <= n) {
        if (!right) {
            const char *h = memmem(p, n, sep->u.s.p, m);
            if (h)
                pos = (long)(h - p);
        } else {
            for (size_t j = n - m + 1; j > 0; j--)
                if (!memcmp(p + j - 1, sep->u.s.p, m)) {
                    pos = (long)(j - 1);
                    break;
                }
        }
    }
    struct tlist *l = tmpl_list_new(c, 3);
    if (!l)
        return tmpl_oom(c, at);
    l->n = 3;
    if (pos < 0) {
        l->v[right ? 2 : 0] = *s;
        l->v[1] = strv("", 0, s->f);
        l->v[right ? 0 : 2] = strv("", 0, s->f);
    } else {
        l->v[0] = strv(p, (size_t)pos, s->f);
        l->v[1] = strv(p + pos, m, s->f);
        l->v[2] = strv(p + pos + m, n - (size_t)pos - m, s->f);
    }
    out->t = TV_TUPLE;
    out->f = 0;
    out->u.l = l;
    return 0;
}

/* ---- str methods ---- */

static int join(struct tctx *c, const struct tnode *at, const struct tv *sep, const struct tv *it, struct tv *out)
{
    struct tlist *items;
    int rc = tmpl_iterate(c, at, it, &items);
    if (rc)
        return rc;
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (size_t i = 0; i < items->n; i++) {
        if (items->v[i].t != TV_STR) {
            tmpl_sb_free(&b);
            return tmpl_err(c, at, CAIRN_EFORMAT, "sequence item %zu: expected str instance, %s found", i,
                            tmpl_type_name(&items->v[i]));
        }
        if (i)
            tmpl_sb_put(&b, sep->u.s.p, sep->u.s.n);
        tmpl_sb_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
    }
    return tmpl_sb_to_str(c, &b, out);
}

static int splitlines(struct tctx *c, const struct tnode *at, const struct tv *s, bool keepends, struct tv *out)
{
    struct tlist *l;
    int rc;
    if ((rc = mk_list(c, at, &l)))
        return rc;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, st = 0, i = 0;
    while (i < n) {
        size_t k = tmpl_linebreak(p + i, n - i);
        if (!k) {
            i++;
            continue;
        }
        if ((rc = push_str(c, at, l, p + st, (keepends ? i + k : i) - st, s->f)))
            return rc;
        i += k;
        st = i;
    }
    if (st < n && (rc = push_str(c, at, l, p + st, n - st, s->f)))
        return rc;
    out->t = TV_LIST;
    out->f = 0;
    out->u.l = l;
    return 0;
}

static int predicate(struct tctx *c, int id, const struct tv *s, struct tv *out)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    bool r = n > 0;
    if (id == MS_ISLOWER) {
        *out = tv_bool(tmpl_str_islower(c, s));
        return 0;
    }
    if (id == MS_ISUPPER) {
        *out = tv_bool(tmpl_str_isupper(c, s));
        return 0;
    }
    if (id == MS_ISASCII) {
        r = true;
        for (size_t i = 0; i < n; i++)
            r &= (unsigned char)p[i] < 0x80;
        *out = tv_bool(r);
        return 0;
    }
    if (id == MS_ISTITLE) {
        bool prev_cased = false, any = false;
        r = true;
        for (size_t i = 0; i < n && r;) {
            uint32_t cp;
            i += tmpl_utf8_dec(p + i, n - i, &cp);
            if (cp_isupper(c, cp) || cp_istitle(cp)) {
                r = !prev_cased;
                prev_cased = any = true;
            } else if (cp_islower(c, cp)) {
                r = prev_cased;
                prev_cased = any = true;
            } else {
                prev_cased = false;
            }
        }
        *out = tv_bool(r && any);
        return 0;
    }
    for (size_t i = 0; i < n && r;) {
        uint32_t cp;
        i += tmpl_utf8_dec(p + i, n - i, &cp);
        switch (id) {
        case MS_ISALNUM: r = cp_isalpha(c, cp) || cp_isdigit(c, cp); break;
        case MS_ISALPHA: r = cp_isalpha(c, cp); break;
        case MS_ISDECIMAL:
        case MS_ISDIGIT:
        case MS_ISNUMERIC: r = cp_isdigit(c, cp); break;
        case MS_ISSPACE: r = tmpl_py_space(cp); break;
        default: r = false;
        }
    }
    *out = tv_bool(r);
    return 0;
}

static int need_str(struct tctx *c, const struct tnode *at, const struct tv *v, const char *what)
{
    if (v->t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s must be str, not %s", what, tmpl_type_name(v));
    return 0;
}

/* str.split and rsplit: a = {sep, maxsplit}. */
static int split_method(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *a, bool right,
                        struct tv *out)
{
    int rc;
    const struct tv *sep = a[0].t == TV_MISSING || a[0].t == TV_NONE ? NULL : &a[0];
    if (sep && (rc = need_str(c, at, sep, "sep")))
        return rc;
    int64_t maxsplit = -1;
    if (a[1].t != TV_MISSING) {
        if (!tv_is_intlike(&a[1]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "maxsplit must be an integer");
        maxsplit = tv_as_int(&a[1]);
    }
    return split(c, at, s, sep, maxsplit, right, out);
}

/* str.replace: a = {old, new, count}. */
static int replace_method(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *a,
                          struct tv *out)
{
    int rc;
    if (a[0].t == TV_MISSING || a[1].t == TV_MISSING)
        return tmpl_err(c, at, CAIRN_EFORMAT, "replace expected at least 2 arguments");
    if ((rc = need_str(c, at, &a[0], "replace() argument 1")) || (rc = need_str(c, at, &a[1], "replace() argument 2")))
        return rc;
    int64_t count = -1;
    if (a[2].t != TV_MISSING) {
        if (!tv_is_intlike(&a[2]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "replace() count must be an integer");
        count = tv_as_int(&a[2]);
    }
    rc = tmpl_str_replace(c, at, s, &a[0], &a[1], count, out);
    if (!rc)
        out->f = s->f;
    return rc;
}

/* str.center, ljust, rjust: a = {width, fillchar}. */
static int justify(struct tctx *c, const struct tnode *at, const char *name, const struct tv *s,
                   const struct tv *a, char align, struct tv *out)
{
    if (!tv_is_intlike(&a[0]))
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s() width must be an integer", name);
    uint32_t fill = ' ';
    if (a[1].t != TV_MISSING) {
        if (a[1].t != TV_STR || tmpl_cp_count(a[1].u.s.p, a[1].u.s.n) != 1)
            return tmpl_err(c, at, CAIRN_EFORMAT, "The fill character must be exactly one character long");
        tmpl_utf8_dec(a[1].u.s.p, a[1].u.s.n, &fill);
    }
    return tmpl_str_pad(c, at, s, tv_as_int(&a[0]), fill, align, out);
}

static int zfill(struct tctx *c, const struct tnode *at, const struct tv *s, int64_t width, struct tv *out)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    char sign[2] = {0};
    if (n && (p[0] == '+' || p[0] == '-')) {
        sign[0] = p[0];
        p++;
        n--;
    }
    if (width > (int64_t)c->max_str)
        return tmpl_err(c, at, CAIRN_EFULL, "string over the output limit");
    size_t body = tmpl_cp_count(p, n) + (sign[0] ? 1 : 0);
    struct tsb b;
    tmpl_sb_init(&b, c);
    tmpl_sb_puts(&b, sign);
    for (int64_t i = (int64_t)body; i < width; i++)
        tmpl_sb_putc(&b, '0');
    tmpl_sb_put(&b, p, n);
    return tmpl_sb_to_str(c, &b, out);
}

/* str.removeprefix (suffix false) and str.removesuffix. */
static void remove_affix(const struct tv *s, const struct tv *affix, bool suffix, struct tv *out)
{
    *out = *s;
    if (affix->u.s.n > s->u.s.n)
        return;
    if (!suffix && !memcmp(s->u.s.p, affix->u.s.p, affix->u.s.n)) {
        out->u.s.p += affix->u.s.n;
        out->u.s.n -= affix->u.s.n;
    } else if (suffix && affix->u.s.n && !memcmp(s->u.s.p + s->u.s.n - affix->u.s.n, affix->u.s.p, affix->u.s.n)) {
        out->u.s.n -= affix->u.s.n;
    }
}

static const char *const str_method_names[MS_LAST - MS_FIRST] = {
    "capitalize", "casefold", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
    "isascii", "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "join", "ljust",
    "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper",
    "zfill", "encode", "expandtabs", "format_map", "isidentifier", "isprintable", "maketrans", "translate",
};

int tmpl_str_method_id(const char *name, size_t n)
{
    for (int i = 0; i < MS_LAST - MS_FIRST; i++)
        if (strlen(str_method_names[i]) == n && !memcmp(str_method_names[i], name, n))
            return MS_FIRST + i;
    return -1;
}

int tmpl_str_method(struct tctx *c, const struct tnode *at, int id, const struct tv *self, const struct tv *args,
                    size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    const char *name = str_method_names[id - MS_FIRST];
    struct tv a[4];
    int rc;
    if (id == MS_FORMAT) {
        rc = tmpl_str_format(c, at, self, args, nargs, kw, nkw, out);
        if (!rc)
            out->f = self->f;
        return rc;
    }
#define BIND(...)                                                                                   \
    do {                                                                                            \
        static const char *const names_[] = {__VA_ARGS__};                                          \
        if ((rc = tmpl_bind(c, at, name, names_, sizeof names_ / sizeof names_[0], args, nargs, kw, nkw, a))) \
            return rc;                                                                              \
    } while (0)
#define NOARGS()                                                                                    \
    do {                                                                                            \
        if (nargs || nkw)                                                                           \
            return tmpl_err(c, at, CAIRN_EFORMAT, "str.%s() takes no arguments", name);             \
    } while (0)
    switch (id) {
    case MS_LOWER:
    case MS_CASEFOLD:
        NOARGS();
        return map_case(c, self, CASE_LOWER, out);
    case MS_UPPER:
        NOARGS();
        return map_case(c, self, CASE_UPPER, out);
    case MS_SWAPCASE:
        NOARGS();
        return map_case(c, self, CASE_SWAP, out);
    case MS_TITLE:
        NOARGS();
        return map_case(c, self, CASE_TITLE, out);
    case MS_CAPITALIZE:
        NOARGS();
        return map_case(c, self, CASE_CAPITALIZE, out);
    case MS_STRIP:
    case MS_LSTRIP:
    case MS_RSTRIP:
        BIND("chars");
        return tmpl_str_strip(c, at, self, &a[0], id == MS_STRIP ? 3 : id == MS_LSTRIP ? 1 : 2, out);
    case MS_SPLIT:
    case MS_RSPLIT:
        BIND("sep", "maxsplit");
        return split_method(c, at, self, a, id == MS_RSPLIT, out);
    case MS_STARTSWITH:
    case MS_ENDSWITH: {
        BIND("prefix", "start", "end");
        if (a[0].t == TV_MISSING)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() takes at least 1 argument (0 given)", name);
        bool r;
        if ((rc = affix(c, at, self, &a[0], &a[1], &a[2], id == MS_ENDSWITH, &r)))
            return rc;
        *out = tv_bool(r);
        return 0;
    }
    case MS_REPLACE:
        BIND("old", "new", "count");
        return replace_method(c, at, self, a, out);
    case MS_FIND:
    case MS_RFIND:
    case MS_INDEX:
    case MS_RINDEX:
    case MS_COUNT:
        BIND("sub", "start", "end");
        if (a[0].t == TV_MISSING)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() takes at least 1 argument (0 given)", name);
        return find(c, at, id, self, &a[0], &a[1], &a[2], out);
    case MS_JOIN:
        BIND("iterable");
        if (a[0].t == TV_MISSING)
            return tmpl_err(c, at, CAIRN_EFORMAT, "join() takes exactly one argument (0 given)");
        rc = join(c, at, self, &a[0], out);
        if (!rc)
            out->f = self->f;
        return rc;
    case MS_CENTER:
    case MS_LJUST:
    case MS_RJUST:
        BIND("width", "fillchar");
        return justify(c, at, name, self, a, id == MS_CENTER ? '^' : id == MS_LJUST ? '<' : '>', out);
    case MS_ZFILL:
        BIND("width");
        if (!tv_is_intlike(&a[0]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "zfill() width must be an integer");
        return zfill(c, at, self, tv_as_int(&a[0]), out);
    case MS_PARTITION:
    case MS_RPARTITION:
        BIND("sep");
        return partition(c, at, self, &a[0], id == MS_RPARTITION, out);
    case MS_REMOVEPREFIX:
    case MS_REMOVESUFFIX:
        BIND("affix");
        if ((rc = need_str(c, at, &a[0], name)))
            return rc;
        remove_affix(self, &a[0], id == MS_REMOVESUFFIX, out);
        return 0;
    case MS_SPLITLINES:
        BIND("keepends");
        return splitlines(c, at, self, a[0].t != TV_MISSING && tmpl_truthy(&a[0]), out);
    case MS_ISALNUM:
    case MS_ISALPHA:
    case MS_ISASCII:
    case MS_ISDECIMAL:
    case MS_ISDIGIT:
    case MS_ISLOWER:
    case MS_ISNUMERIC:
    case MS_ISSPACE:
    case MS_ISTITLE:
    case MS_ISUPPER:
        NOARGS();
        return predicate(c, id, self, out);
    default:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "str.%s() is not supported", name);
    }
#undef BIND
#undef NOARGS
}
