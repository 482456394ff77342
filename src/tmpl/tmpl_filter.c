/* jinja2's builtin filters. */
#define _GNU_SOURCE
#include "tmpl/tmpl_lib.h"

#include "base/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT,
    F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP,
    F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR,
    F_SLICE, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER, F_WORDCOUNT,
    F_GROUPBY,
};

static const struct { const char *name; int id; } filter_names[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", F_BATCH}, {"capitalize", F_CAPITALIZE}, {"center", F_CENTER},
    {"count", F_LENGTH}, {"d", F_DEFAULT}, {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE},
    {"escape", F_ESCAPE}, {"first", F_FIRST}, {"float", F_FLOAT}, {"forceescape", F_FORCEESCAPE},
    {"format", F_FORMAT}, {"groupby", F_GROUPBY}, {"indent", F_INDENT}, {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN},
    {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP},
    {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE},
    {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"slice", F_SLICE}, {"sort", F_SORT}, {"string", F_STRING}, {"sum", F_SUM},
    {"title", F_TITLE}, {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"truncate", F_TRUNCATE}, {"unique", F_UNIQUE},
    {"upper", F_UPPER}, {"wordcount", F_WORDCOUNT},
};

/* jinja2 has these; this interpreter refuses templates that use them */
static const char *const filters_unsupported[] = {
    "filesizeformat", "pprint", "random", "striptags", "urlencode", "urlize", "wordwrap", "xmlattr",
};

int tmpl_filter_id(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (tmpl_name_eq(filter_names[i].name, name, n))
            return filter_names[i].id;
    for (size_t i = 0; i < sizeof filters_unsupported / sizeof filters_unsupported[0]; i++)
        if (tmpl_name_eq(filters_unsupported[i], name, n))
            return TMPL_ID_UNSUPPORTED;
    return TMPL_ID_UNKNOWN;
}

/* ---- helpers ---- */

static int lower_if_str(struct tctx *c, struct tv *v)
{
    if (v->t != TV_STR)
        return 0;
    return tmpl_str_case(c, v, false, v);
}

/* make_attrgetter: "a.b.0" looks up item a, then b, then index 0 (environment.getitem). */
static int attr_path(struct tctx *c, const struct tnode *at, const struct tv *item, const struct tv *attr,
                     const struct tv *dflt, bool ignore_case, struct tv *out)
{
    *out = *item;
    int rc;
    if (attr && tv_given(attr) && attr->t != TV_NONE) {
        if (attr->t == TV_STR) {
            const char *p = attr->u.s.p;
            size_t n = attr->u.s.n, st = 0;
            for (size_t i = 0; i <= n; i++) {
                if (i < n && p[i] != '.')
                    continue;
                struct tv key = tv_str(p + st, i - st), r;
                bool digits = i > st;
                int64_t iv = 0;
                for (size_t k = st; k < i && digits; k++) {
                    digits = p[k] >= '0' && p[k] <= '9';
                    iv = iv * 10 + (p[k] - '0');
                    if (iv > 1000000000000LL)
                        digits = false;
                }
                if (digits)
                    key = tv_int(iv);
                if ((rc = tmpl_getitem(c, at, out, &key, &r)))
                    return rc;
                *out = r;
                if (dflt && tv_given(dflt) && dflt->t != TV_NONE && out->t == TV_UNDEF)
                    *out = *dflt;
                st = i + 1;
            }
        } else {
            struct tv r;
            if ((rc = tmpl_getitem(c, at, out, attr, &r)))
                return rc;
            *out = r;
            if (dflt && tv_given(dflt) && dflt->t != TV_NONE && out->t == TV_UNDEF)
                *out = *dflt;
        }
    }
    if (ignore_case)
        return lower_if_str(c, out);
    return 0;
}

/* Stable merge sort of idx[0..n) by keys (Python's sorted with key=, reverse=). */
static int merge_sort(struct tctx *c, const struct tnode *at, const struct tv *keys, size_t *idx, size_t *tmp,
                      size_t n, bool reverse)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    int rc;
    if ((rc = merge_sort(c, at, keys, idx, tmp, h, reverse)) ||
        (rc = merge_sort(c, at, keys, idx + h, tmp, n - h, reverse)))
        return rc;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r;
        /* take from the right only when it is strictly before the left */
        if (reverse)
            rc = tmpl_compare(c, at, &keys[idx[i]], &keys[idx[j]], &r);
        else
            rc = tmpl_compare(c, at, &keys[idx[j]], &keys[idx[i]], &r);
        if (rc)
            return rc;
        if (r < 0)
            tmp[k++] = idx[j++];
        else
            tmp[k++] = idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    tmpl_copy(idx, tmp, n * sizeof *idx);
    return 0;
}

static int sorted(struct tctx *c, const struct tnode *at, const struct tlist *items, const struct tv *keys,
                  bool reverse, struct tlist **out)
{
    size_t n = items->n;
    size_t *idx = tmpl_alloc(&c->ar, (n + 1) * sizeof *idx), *tmp = tmpl_alloc(&c->ar, (n + 1) * sizeof *tmp);
    int rc;
    if (!idx || !tmp)
        return tmpl_oom(c, at);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    if ((rc = merge_sort(c, at, keys, idx, tmp, n, reverse)))
        return rc;
    if ((rc = tmpl_lib_list(c, at, n, out)))
        return rc;
    for (size_t i = 0; i < n; i++)
        (*out)->v[i] = items->v[idx[i]];
    (*out)->n = n;
    return 0;
}

static bool parse_py_float(const char *s, size_t n, double *out)
{
    size_t st = 0, en = n;
    while (st < en) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(s + st, en - st, &cp);
        if (!tmpl_py_space(cp))
            break;
        st += k;
    }
    while (en > st && ((unsigned char)s[en - 1] < 0x80) && tmpl_py_space((unsigned char)s[en - 1]))
        en--;
    if (st >= en || en - st > 400)
        return false;
    char buf[420];
    size_t o = 0, i = st;
    bool neg = s[i] == '-'; /* not buf[0]: unset when there is no sign */
    if (s[i] == '+' || s[i] == '-')
        buf[o++] = s[i++];
    size_t rest = en - i;
    const char *r = s + i;
    if ((rest == 3 && !strncasecmp(r, "inf", 3)) || (rest == 8 && !strncasecmp(r, "infinity", 8))) {
        *out = neg ? -INFINITY : INFINITY;
        return true;
    }
    if (rest == 3 && !strncasecmp(r, "nan", 3)) {
        *out = NAN;
        return true;
    }
    bool digits = false, dot = false, exp = false;
    char prev = 0;
    for (; i < en; i++) {
        char ch = s[i];
        if (ch >= '0' && ch <= '9') {
            digits = true;
            buf[o++] = ch;
        } else if (ch == '_') {
            if (!(prev >= '0' && prev <= '9') || i + 1 >= en || s[i + 1] < '0' || s[i + 1] > '9')
                return false;
        } else if (ch == '.' && !dot && !exp) {
            dot = true;
            buf[o++] = ch;
        } else if ((ch == 'e' || ch == 'E') && digits && !exp) {
            exp = true;
            buf[o++] = ch;
            if (i + 1 < en && (s[i + 1] == '+' || s[i + 1] == '-'))
                buf[o++] = s[++i];
            if (i + 1 >= en)
                return false;
            digits = false;
        } else {
            return false;
        }
        prev = ch;
    }
    if (!digits)
        return false;
    buf[o] = 0;
    *out = strtod(buf, NULL);
    return true;
}

/* int(s, base) for strings; 1 ok, 0 not a valid literal, -1 beyond 64 bits. */
static int parse_py_int(const char *s, size_t n, int base, int64_t *out)
{
    size_t st = 0, en = n;
    while (st < en) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(s + st, en - st, &cp);
        if (!tmpl_py_space(cp))
            break;
        st += k;
    }
    while (en > st && ((unsigned char)s[en - 1] < 0x80) && tmpl_py_space((unsigned char)s[en - 1]))
        en--;
    size_t i = st;
    bool neg = false;
    if (i < en && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (i + 1 < en && s[i] == '0') {
        char p = (char)(s[i + 1] | 0x20);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            i += 2;
            if (i < en && s[i] == '_')
                i++;
        }
    }
    if (base == 0) {
        base = 10;
        if (i + 1 < en && s[i] == '0') {  /* "010" is not valid with base 0 */
            for (size_t k = i; k < en; k++)
                if (s[k] != '0' && s[k] != '_')
                    return 0;
        }
    }
    if (i >= en)
        return 0;
    uint64_t v = 0;
    bool ovf = false;
    for (; i < en; i++) {
        char ch = s[i];
        if (ch == '_') {
            if (i + 1 >= en || s[i + 1] == '_' || i == st)
                return 0;
            continue;
        }
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z' ? (ch | 0x20) - 'a' + 10 : 99;
        if (d >= base)
            return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            ovf = true;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (ovf || v > (uint64_t)INT64_MAX + (neg ? 1 : 0))
        return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int float_to_int(struct tctx *c, const struct tnode *at, double d, const struct tv *dflt, struct tv *out)
{
    if (isnan(d)) {
        *out = *dflt;
        return 0;
    }
    if (isinf(d))
        return tmpl_err(c, at, CAIRN_EFORMAT, "cannot convert float infinity to integer");
    if (fabs(d) >= 9.2e18)
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "integer beyond 64 bits");
    *out = tv_int((int64_t)d);
    return 0;
}

static int round_float(double x, int64_t nd, double *out)
{
    if (isnan(x) || isinf(x) || x == 0) {
        *out = x;
        return 0;
    }
    if (nd > 300) {
        *out = x;
        return 0;
    }
    if (nd >= 0) {
        char buf[700];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        *out = strtod(buf, NULL);
        return 0;
    }
    if (nd < -308) {
        *out = copysign(0.0, x);
        return 0;
    }
    double p = pow(10.0, (double)-nd), y = x / p, z = nearbyint(y);
    if (fabs(y - trunc(y)) == 0.5)
        z = 2.0 * nearbyint(y / 2.0);
    *out = z * p;
    return 0;
}

/* ---- select/reject/map ---- */

static int select_reject(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *args,
                         size_t nargs, const struct tkw *kw, size_t nkw, bool attr, bool reject, struct tv *out)
{
    struct tlist *res, *items;
    int rc;
    if ((rc = tmpl_lib_list(c, at, 0, &res)))
        return rc;
    if (!tmpl_truthy(in))
        return tmpl_lib_iter(c, at, res, TI_GEN, out);
    size_t off = 0;
    const struct tv *attrname = NULL;
    if (attr) {
        if (nargs < 1)
            return tmpl_err(c, at, CAIRN_EFORMAT, "Missing parameter for attribute name");
        attrname = &args[0];
        off = 1;
    }
    int test = -2;
    if (nargs > off) {
        if (args[off].t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "test name must be a string");
        test = tmpl_test_id(args[off].u.s.p, args[off].u.s.n);
        if (test < 0)
            return tmpl_err(c, at, CAIRN_EFORMAT, "No test named '%.*s'.", (int)args[off].u.s.n, args[off].u.s.p);
        off++;
    } else if (nkw) {
        return tmpl_err(c, at, CAIRN_EFORMAT, "keyword arguments given without a test name");
    }
    if ((rc = tmpl_iterate(c, at, in, &items)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv v = items->v[i];
        bool r;
        if (attr && (rc = attr_path(c, at, &items->v[i], attrname, NULL, false, &v)))
            return rc;
        if (test >= 0) {
            if ((rc = tmpl_apply_test(c, at, test, &v, args + off, nargs - off, kw, nkw, &r)))
                return rc;
        } else {
            r = tmpl_truthy(&v);
        }
        if (r != reject && (rc = tmpl_lib_push(c, at, res, items->v[i])))
            return rc;
    }
    return tmpl_lib_iter(c, at, res, TI_GEN, out);
}

static int map_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *args,
                      size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    struct tlist *res, *items;
    int rc;
    if ((rc = tmpl_lib_list(c, at, 0, &res)))
        return rc;
    if (!tmpl_truthy(in))
        return tmpl_lib_iter(c, at, res, TI_GEN, out);
    const struct tv *attr = NULL, *dflt = NULL;
    int filter = -1;
    if (!nargs) {
        for (size_t k = 0; k < nkw; k++) {
            if (tmpl_name_eq("attribute", kw[k].name, kw[k].n))
                attr = &kw[k].v;
            else if (tmpl_name_eq("default", kw[k].name, kw[k].n))
                dflt = &kw[k].v;
            else
                return tmpl_err(c, at, CAIRN_EFORMAT, "Unexpected keyword argument '%.*s'", (int)kw[k].n, kw[k].name);
        }
        if (!attr)
            return tmpl_err(c, at, CAIRN_EFORMAT, "map requires a filter argument");
    } else {
        if (args[0].t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "map filter name must be a string");
        filter = tmpl_filter_id(args[0].u.s.p, args[0].u.s.n);
        if (filter == TMPL_ID_UNSUPPORTED)
            return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "filter '%.*s' is not supported", (int)args[0].u.s.n, args[0].u.s.p);
        if (filter < 0)
            return tmpl_err(c, at, CAIRN_EFORMAT, "No filter named '%.*s'.", (int)args[0].u.s.n, args[0].u.s.p);
    }
    if ((rc = tmpl_iterate(c, at, in, &items)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv v;
        if (filter >= 0)
            rc = tmpl_apply_filter(c, at, filter, &items->v[i], args + 1, nargs - 1, kw, nkw, &v);
        else
            rc = attr_path(c, at, &items->v[i], attr, dflt, false, &v);
        if (rc || (rc = tmpl_lib_push(c, at, res, v)))
            return rc;
    }
    return tmpl_lib_iter(c, at, res, TI_GEN, out);
}

static int tojson_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                         struct tv *out)
{
    /* render_ref's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    struct tjson_opts o = {0};
    o.ensure_ascii = tv_given(&a[0]) && tmpl_truthy(&a[0]);
    o.sort_keys = tv_given(&a[3]) && tmpl_truthy(&a[3]);
    const struct tv *ind = &a[1];
    char *spaces = NULL;
    if (tv_given(ind) && ind->t != TV_NONE) {
        if (ind->t == TV_STR) {
            o.indent = ind->u.s.p;
            o.indent_n = ind->u.s.n;
        } else if (tv_is_intlike(ind)) {
            int64_t k = tv_as_int(ind);
            if (k < 0)
                k = 0;
            if (k > 1000)
                return tmpl_err(c, at, CAIRN_EFULL, "tojson indent too large");
            if (!(spaces = tmpl_alloc(&c->ar, (size_t)k + 1)))
                return tmpl_oom(c, at);
            memset(spaces, ' ', (size_t)k);
            o.indent = spaces;
            o.indent_n = (size_t)k;
        } else {
            return tmpl_err(c, at, CAIRN_EFORMAT, "can't multiply sequence by non-int of type '%s'", tmpl_type_name(ind));
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.item_sep_n = strlen(o.item_sep);
    o.key_sep = ": ";
    o.key_sep_n = 2;
    const struct tv *sep = &a[2];
    if (tv_given(sep) && sep->t != TV_NONE) {
        if ((sep->t != TV_LIST && sep->t != TV_TUPLE) || sep->u.l->n != 2 || sep->u.l->v[0].t != TV_STR ||
            sep->u.l->v[1].t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "tojson separators must be a pair of strings");
        o.item_sep = sep->u.l->v[0].u.s.p;
        o.item_sep_n = sep->u.l->v[0].u.s.n;
        o.key_sep = sep->u.l->v[1].u.s.p;
        o.key_sep_n = sep->u.l->v[1].u.s.n;
    }
    struct tsb b;
    tmpl_sb_init(&b, c);
    int rc = tmpl_to_json(c, at, &b, in, &o, 0);
    if (rc) {
        tmpl_sb_free(&b);
        return rc;
    }
    return tmpl_sb_to_str(c, &b, out);
}

static int indent_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                         struct tv *out)
{
    if (in->t != TV_STR) {
        if (in->t == TV_UNDEF)
            return tmpl_undef_err(c, at, in);
        return tmpl_err(c, at, CAIRN_EFORMAT, "unsupported operand type(s) for +=: '%s' and 'str'", tmpl_type_name(in));
    }
    struct tv ind = tv_str("    ", 4);
    if (tv_given(&a[0])) {
        if (a[0].t == TV_STR)
            ind = a[0];
        else if (tv_is_intlike(&a[0])) {
            int64_t k = tv_as_int(&a[0]);
            if (k < 0)
                k = 0;
            if (k > 10000)
                return tmpl_err(c, at, CAIRN_EFULL, "indent width too large");
            char *sp = tmpl_alloc(&c->ar, (size_t)k + 1);
            if (!sp)
                return tmpl_oom(c, at);
            memset(sp, ' ', (size_t)k);
            ind = tv_str(sp, (size_t)k);
        } else {
            return tmpl_err(c, at, CAIRN_EFORMAT, "indent width must be an integer or a string");
        }
    }
    bool first = tv_given(&a[1]) && tmpl_truthy(&a[1]);
    bool blank = tv_given(&a[2]) && tmpl_truthy(&a[2]);
    /* s + "\n", split into lines (splitlines), join */
    const char *p = in->u.s.p;
    size_t n = in->u.s.n;
    struct tsb b;
    tmpl_sb_init(&b, c);
    if (first)
        tmpl_sb_put(&b, ind.u.s.p, ind.u.s.n);
    /* the lines of s + "\n": one more than the line breaks in s, the last maybe empty */
    size_t st = 0, i = 0, line = 0;
    for (;;) {
        size_t k = 0;
        while (i < n && !(k = tmpl_linebreak(p + i, n - i)))
            i++;
        size_t len = i - st;
        if (line > 0) {
            tmpl_sb_putc(&b, '\n');
            if (blank || len)
                tmpl_sb_put(&b, ind.u.s.p, ind.u.s.n);
        }
        tmpl_sb_put(&b, p + st, len);
        line++;
        if (i >= n)
            break;
        i += k;
        st = i;
    }
    return tmpl_sb_to_str(c, &b, out);
}

static int truncate_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                           struct tv *out)
{
    int64_t length = tv_given(&a[0]) ? tv_as_int(&a[0]) : 255;
    bool killwords = tv_given(&a[1]) && tmpl_truthy(&a[1]);
    struct tv end = tv_given(&a[2]) ? a[2] : tv_str("...", 3);
    int64_t leeway = tv_given(&a[3]) && a[3].t != TV_NONE ? tv_as_int(&a[3]) : 5;
    if ((tv_given(&a[0]) && !tv_is_intlike(&a[0])) || end.t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "bad truncate arguments");
    int64_t endlen = (int64_t)tmpl_cp_count(end.u.s.p, end.u.s.n);
    if (length < endlen || leeway < 0)
        return tmpl_err(c, at, CAIRN_EFORMAT, "expected length >= %lld, got %lld", (long long)endlen, (long long)length);
    int64_t len;
    int rc = tmpl_len(c, at, in, &len);
    if (rc)
        return rc;
    if (len <= length + leeway) {
        *out = *in;
        return 0;
    }
    if (in->t != TV_STR)  /* a long list: s[:n] + end or .rsplit fail in jinja2 too */
        return tmpl_err(c, at, CAIRN_EFORMAT, "cannot truncate a %s", tmpl_type_name(in));
    size_t cut = 0;
    for (int64_t k = 0; k < length - endlen && cut < in->u.s.n; k++) {
        cut++;
        while (cut < in->u.s.n && ((unsigned char)in->u.s.p[cut] & 0xC0) == 0x80)
            cut++;
    }
    if (!killwords) {
        for (size_t j = cut; j > 0; j--)
            if (in->u.s.p[j - 1] == ' ') {
                cut = j - 1;
                break;
            }
    }
    struct tsb b;
    tmpl_sb_init(&b, c);
    tmpl_sb_put(&b, in->u.s.p, cut);
    tmpl_sb_put(&b, end.u.s.p, end.u.s.n);
    return tmpl_sb_to_str(c, &b, out);
}

static int to_int(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a, struct tv *out)
{
    struct tv dflt = tv_given(&a[0]) ? a[0] : tv_int(0);
    int64_t base = 10;
    if (tv_given(&a[1])) {
        if (!tv_is_intlike(&a[1]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "int() base must be an integer");
        base = tv_as_int(&a[1]);
    }
    switch (in->t) {
    case TV_UNDEF:
        return tmpl_undef_err(c, at, in);
    case TV_BOOL:
    case TV_INT:
        *out = tv_int(tv_as_int(in));
        return 0;
    case TV_FLOAT:
        return float_to_int(c, at, in->u.d, &dflt, out);
    case TV_STR: {
        int64_t v;
        if (base != 0 && (base < 2 || base > 36))
            return tmpl_err(c, at, CAIRN_EFORMAT, "int() base must be >= 2 and <= 36, or 0");
        int r = parse_py_int(in->u.s.p, in->u.s.n, (int)base, &v);
        if (r > 0) {
            *out = tv_int(v);
            return 0;
        }
        if (r < 0)
            return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "integer beyond 64 bits");
        double d;
        if (parse_py_float(in->u.s.p, in->u.s.n, &d))
            return float_to_int(c, at, d, &dflt, out);
        *out = dflt;
        return 0;
    }
    default:
        *out = dflt;
        return 0;
    }
}

static int to_float(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a, struct tv *out)
{
    struct tv dflt = tv_given(&a[0]) ? a[0] : tv_float(0.0);
    double d;
    switch (in->t) {
    case TV_UNDEF:
        return tmpl_undef_err(c, at, in);
    case TV_BOOL:
    case TV_INT:
    case TV_FLOAT:
        *out = tv_float(tv_as_float(in));
        return 0;
    case TV_STR:
        *out = parse_py_float(in->u.s.p, in->u.s.n, &d) ? tv_float(d) : dflt;
        return 0;
    default:
        *out = dflt;
        return 0;
    }
}

static int first_last(struct tctx *c, const struct tnode *at, const struct tv *in, bool last, struct tv *out)
{
    if (in->t == TV_ITER && (in->u.it->kind == TI_GEN || in->u.it->kind == TI_REVERSE)) {
        struct titer *it = in->u.it;
        if (last)
            return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object is not reversible", tmpl_type_name(in));
        if (it->pos < it->l->n)
            *out = it->l->v[it->pos++];
        else
            *out = tv_undef_hint("No first item, sequence was empty.");
        return 0;
    }
    if (in->t == TV_STR && in->u.s.n) {
        size_t st = 0, en = in->u.s.n;
        if (last) {
            st = en - 1;
            while (st > 0 && ((unsigned char)in->u.s.p[st] & 0xC0) == 0x80)
                st--;
        } else {
            en = 1;
            while (en < in->u.s.n && ((unsigned char)in->u.s.p[en] & 0xC0) == 0x80)
                en++;
        }
        *out = tv_str(in->u.s.p + st, en - st);
        return 0;
    }
    struct tlist *items;
    int rc = tmpl_iterate(c, at, in, &items);
    if (rc)
        return rc;
    if (!items->n)
        *out = tv_undef_hint(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    else
        *out = items->v[last ? items->n - 1 : 0];
    return 0;
}

static int unique_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                         struct tv *out)
{
    bool cs = tv_given(&a[0]) && tmpl_truthy(&a[0]);
    struct tlist *items, *res;
    struct tdict *seen = tmpl_dict_new(c, 0);  /* hashed for string keys */
    int rc;
    if (!seen)
        return tmpl_oom(c, at);
    if ((rc = tmpl_iterate(c, at, in, &items)) || (rc = tmpl_lib_list(c, at, 0, &res)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv key;
        if ((rc = tmpl_step(c, at)) || (rc = attr_path(c, at, &items->v[i], &a[1], NULL, !cs, &key)))
            return rc;
        if (!tmpl_hashable(&key))
            return tmpl_err(c, at, CAIRN_EFORMAT, "unhashable type: '%s'", tmpl_type_name(&key));
        if (tmpl_dict_find(seen, &key) >= 0)
            continue;
        if (tmpl_dict_set(c, seen, key, tv_none()))
            return tmpl_oom(c, at);
        if ((rc = tmpl_lib_push(c, at, res, items->v[i])))
            return rc;
    }
    return tmpl_lib_iter(c, at, res, TI_GEN, out);
}

static int minmax(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a, bool max,
                  struct tv *out)
{
    bool cs = tv_given(&a[0]) && tmpl_truthy(&a[0]);
    struct tlist *items;
    int rc = tmpl_iterate(c, at, in, &items);
    if (rc)
        return rc;
    if (!items->n) {
        *out = tv_undef_hint("No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    struct tv bk;
    if ((rc = attr_path(c, at, &items->v[0], &a[1], NULL, !cs, &bk)))
        return rc;
    for (size_t i = 1; i < items->n; i++) {
        struct tv k;
        int r;
        if ((rc = attr_path(c, at, &items->v[i], &a[1], NULL, !cs, &k)))
            return rc;
        if ((rc = max ? tmpl_compare(c, at, &bk, &k, &r) : tmpl_compare(c, at, &k, &bk, &r)))
            return rc;
        if (r < 0) {
            best = i;
            bk = k;
        }
    }
    *out = items->v[best];
    return 0;
}

static int sort_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                       struct tv *out)
{
    bool reverse = tv_given(&a[0]) && tmpl_truthy(&a[0]);
    bool cs = tv_given(&a[1]) && tmpl_truthy(&a[1]);
    struct tlist *items, *res;
    int rc = tmpl_iterate(c, at, in, &items);
    if (rc)
        return rc;
    struct tv *keys = tmpl_alloc(&c->ar, (items->n + 1) * sizeof *keys);
    if (!keys)
        return tmpl_oom(c, at);
    const struct tv *attr = &a[2];
    for (size_t i = 0; i < items->n; i++) {
        if (tv_given(attr) && attr->t == TV_STR && memchr(attr->u.s.p, ',', attr->u.s.n)) {
            /* "a,b": the key is the list of both */
            struct tlist *kl;
            if ((rc = tmpl_lib_list(c, at, 0, &kl)))
                return rc;
            const char *p = attr->u.s.p;
            size_t n = attr->u.s.n, st = 0;
            for (size_t j = 0; j <= n; j++) {
                if (j < n && p[j] != ',')
                    continue;
                struct tv part = tv_str(p + st, j - st), k;
                if ((rc = attr_path(c, at, &items->v[i], &part, NULL, !cs, &k)) || (rc = tmpl_lib_push(c, at, kl, k)))
                    return rc;
                st = j + 1;
            }
            keys[i] = tv_list(kl, TV_LIST);
        } else if (tv_given(attr) && attr->t != TV_NONE) {
            struct tv k;
            if ((rc = attr_path(c, at, &items->v[i], attr, NULL, !cs, &k)))
                return rc;
            struct tlist *kl;
            if ((rc = tmpl_lib_list(c, at, 1, &kl)))
                return rc;
            kl->v[0] = k;
            kl->n = 1;
            keys[i] = tv_list(kl, TV_LIST);
        } else {
            keys[i] = items->v[i];
            if (!cs && (rc = lower_if_str(c, &keys[i])))
                return rc;
        }
    }
    if ((rc = sorted(c, at, items, keys, reverse, &res)))
        return rc;
    *out = tv_list(res, TV_LIST);
    return 0;
}

/* groupby: sorted by the attribute, then runs of equal keys as (grouper, list) tuples. */
static int groupby_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                          struct tv *out)
{
    if (!tv_given(&a[0]))
        return tmpl_err(c, at, CAIRN_EFORMAT, "groupby() missing required argument: 'attribute'");
    const struct tv *dflt = &a[1];
    bool cs = tv_given(&a[2]) && tmpl_truthy(&a[2]);
    struct tlist *items, *sorted_items, *res;
    int rc = tmpl_iterate(c, at, in, &items);
    if (rc)
        return rc;
    struct tv *keys = tmpl_alloc(&c->ar, (items->n + 1) * sizeof *keys);
    if (!keys)
        return tmpl_oom(c, at);
    for (size_t i = 0; i < items->n; i++)
        if ((rc = attr_path(c, at, &items->v[i], &a[0], dflt, !cs, &keys[i])))
            return rc;
    if ((rc = sorted(c, at, items, keys, false, &sorted_items)) || (rc = tmpl_lib_list(c, at, 0, &res)))
        return rc;
    for (size_t i = 0; i < sorted_items->n;) {
        struct tv key, k2;
        if ((rc = attr_path(c, at, &sorted_items->v[i], &a[0], dflt, !cs, &key)))
            return rc;
        struct tlist *grp;
        if ((rc = tmpl_lib_list(c, at, 0, &grp)))
            return rc;
        size_t j = i;
        for (; j < sorted_items->n; j++) {
            if ((rc = attr_path(c, at, &sorted_items->v[j], &a[0], dflt, !cs, &k2)))
                return rc;
            if (!tmpl_equal(&key, &k2))
                break;
            if ((rc = tmpl_lib_push(c, at, grp, sorted_items->v[j])))
                return rc;
        }
        struct tv grouper = key, t;
        if (!cs && (rc = attr_path(c, at, &grp->v[0], &a[0], dflt, false, &grouper)))
            return rc;
        if ((rc = tmpl_lib_pair(c, at, grouper, tv_list(grp, TV_LIST), &t)))
            return rc;
        t.f = TVF_GROUP;
        if ((rc = tmpl_lib_push(c, at, res, t)))
            return rc;
        i = j;
    }
    *out = tv_list(res, TV_LIST);
    return 0;
}

static int dictsort_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                           struct tv *out)
{
    bool cs = tv_given(&a[0]) && tmpl_truthy(&a[0]);
    int pos = 0;
    if (tv_given(&a[1])) {
        if (a[1].t == TV_STR && tmpl_name_eq("value", a[1].u.s.p, a[1].u.s.n))
            pos = 1;
        else if (!(a[1].t == TV_STR && tmpl_name_eq("key", a[1].u.s.p, a[1].u.s.n)))
            return tmpl_err(c, at, CAIRN_EFORMAT, "You can only sort by either \"key\" or \"value\"");
    }
    bool reverse = tv_given(&a[2]) && tmpl_truthy(&a[2]);
    if (in->t == TV_UNDEF)
        return tmpl_undef_err(c, at, in);
    if (in->t != TV_DICT)
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object has no attribute 'items'", tmpl_type_name(in));
    const struct tdict *d = in->u.m;
    struct tlist *items, *res;
    int rc;
    if ((rc = tmpl_lib_list(c, at, d->n, &items)))
        return rc;
    struct tv *keys = tmpl_alloc(&c->ar, (d->n + 1) * sizeof *keys);
    if (!keys)
        return tmpl_oom(c, at);
    for (size_t i = 0; i < d->n; i++) {
        if ((rc = tmpl_lib_pair(c, at, d->k[i], d->v[i], &items->v[i])))
            return rc;
        keys[i] = pos ? d->v[i] : d->k[i];
        if (!cs && (rc = lower_if_str(c, &keys[i])))
            return rc;
    }
    items->n = d->n;
    if ((rc = sorted(c, at, items, keys, reverse, &res)))
        return rc;
    *out = tv_list(res, TV_LIST);
    return 0;
}

static int round_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                        struct tv *out)
{
    int64_t prec = 0;
    if (tv_given(&a[0])) {
        if (!tv_is_intlike(&a[0]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "round() precision must be an integer");
        prec = tv_as_int(&a[0]);
    }
    int method = 0;
    if (tv_given(&a[1])) {
        if (a[1].t == TV_STR && tmpl_name_eq("ceil", a[1].u.s.p, a[1].u.s.n))
            method = 1;
        else if (a[1].t == TV_STR && tmpl_name_eq("floor", a[1].u.s.p, a[1].u.s.n))
            method = 2;
        else if (!(a[1].t == TV_STR && tmpl_name_eq("common", a[1].u.s.p, a[1].u.s.n)))
            return tmpl_err(c, at, CAIRN_EFORMAT, "method must be common, ceil or floor");
    }
    if (!tv_is_num(in)) {
        if (in->t == TV_UNDEF)
            return tmpl_undef_err(c, at, in);
        return tmpl_err(c, at, CAIRN_EFORMAT, "type %s doesn't define __round__ method", tmpl_type_name(in));
    }
    if (method) {
        if (prec < -300 || prec > 300)
            return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "round precision out of range");
        double p = pow(10.0, (double)prec);
        double x = tv_as_float(in) * p;
        double r = method == 1 ? ceil(x) : floor(x);
        *out = tv_float(r / p);
        return 0;
    }
    if (tv_is_intlike(in)) {
        int64_t v = tv_as_int(in);
        if (prec >= 0 || prec < -18) {
            *out = tv_int(prec < -18 ? 0 : v);
            return 0;
        }
        int64_t p = 1;
        for (int64_t k = 0; k < -prec; k++)
            p *= 10;
        int64_t q = v / p, r = v % p;
        if (r < 0) {
            q -= 1;
            r += p;
        }
        if (r * 2 > p || (r * 2 == p && (q & 1)))
            q += 1;
        *out = tv_int(q * p);
        return 0;
    }
    double r;
    round_float(in->u.d, prec, &r);
    *out = tv_float(r);
    return 0;
}

static int slice_batch(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a, bool batch,
                       struct tv *out)
{
    if (!tv_is_intlike(&a[0]))
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s count must be an integer", batch ? "batch" : "slice");
    int64_t k = tv_as_int(&a[0]);
    bool fill = tv_given(&a[1]) && a[1].t != TV_NONE;
    struct tlist *items, *res;
    int rc;
    if ((rc = tmpl_iterate(c, at, in, &items)) || (rc = tmpl_lib_list(c, at, 0, &res)))
        return rc;
    if (k <= 0)
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s count must be positive", batch ? "batch" : "slice");
    int64_t n = (int64_t)items->n;
    if (batch) {
        for (int64_t i = 0; i < n; i += k) {
            struct tlist *chunk;
            int64_t m = n - i < k ? n - i : k;
            if ((rc = tmpl_lib_list(c, at, (size_t)k, &chunk)))
                return rc;
            tmpl_copy(chunk->v, items->v + i, (size_t)m * sizeof *chunk->v);
            chunk->n = (size_t)m;
            while (fill && (int64_t)chunk->n < k)
                chunk->v[chunk->n++] = a[1];
            if ((rc = tmpl_lib_push(c, at, res, tv_list(chunk, TV_LIST))))
                return rc;
        }
    } else {
        if (k > 100000)
            return tmpl_err(c, at, CAIRN_EFULL, "too many slices");
        int64_t per = n / k, extra = n % k, offset = 0;
        for (int64_t s = 0; s < k; s++) {
            int64_t start = offset + s * per;
            if (s < extra)
                offset++;
            int64_t end = offset + (s + 1) * per;
            struct tlist *chunk;
            if ((rc = tmpl_lib_list(c, at, (size_t)(end - start) + 1, &chunk)))
                return rc;
            if (end > start) /* an empty list has no storage (items->v NULL) */
                tmpl_copy(chunk->v, items->v + start, (size_t)(end - start) * sizeof *chunk->v);
            chunk->n = (size_t)(end - start);
            if (fill && s >= extra)
                chunk->v[chunk->n++] = a[1];
            if ((rc = tmpl_lib_push(c, at, res, tv_list(chunk, TV_LIST))))
                return rc;
        }
    }
    return tmpl_lib_iter(c, at, res, TI_GEN, out);
}

static int abs_filter(struct tctx *c, const struct tnode *at, const struct tv *in, struct tv *out)
{
    if (in->t == TV_FLOAT)
        *out = tv_float(fabs(in->u.d));
    else if (tv_is_intlike(in)) {
        int64_t v = tv_as_int(in);
        if (v == INT64_MIN)
            return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "integer overflow");
        *out = tv_int(v < 0 ? -v : v);
    } else if (in->t == TV_UNDEF) {
        return tmpl_undef_err(c, at, in);
    } else {
        return tmpl_err(c, at, CAIRN_EFORMAT, "bad operand type for abs(): '%s'", tmpl_type_name(in));
    }
    return 0;
}

static int attr_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *name,
                       struct tv *out)
{
    if (name->t != TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "attribute name must be a string");
    if (in->t == TV_DICT) {
        bool unsafe;
        if (tmpl_method_id(TV_DICT, name->u.s.p, name->u.s.n, &unsafe) < 0) {
            *out = tv_undef_hint("no such attribute");
            return 0;
        }
    }
    return tmpl_getattr(c, at, in, name->u.s.p, name->u.s.n, out);
}

static int center_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *width,
                         struct tv *out)
{
    int64_t w = 80;
    if (tv_given(width)) {
        if (!tv_is_intlike(width))
            return tmpl_err(c, at, CAIRN_EFORMAT, "center() width must be an integer");
        w = tv_as_int(width);
    }
    struct tv s;
    int rc = tmpl_str_of(c, at, in, &s);
    return rc ? rc : tmpl_str_pad(c, at, &s, w, ' ', '^', out);
}

/* format: str % args, args from the positional or the keyword arguments. */
static int format_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *args,
                         size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    struct tv s;
    int rc;
    if (nargs && nkw)
        return tmpl_err(c, at, CAIRN_EFORMAT, "can't handle positional and keyword arguments at the same time");
    if ((rc = tmpl_str_of(c, at, in, &s)))
        return rc;
    struct tv fa;
    if (nkw) {
        struct tdict *d = tmpl_dict_new(c, nkw);
        if (!d)
            return tmpl_oom(c, at);
        for (size_t k = 0; k < nkw; k++)
            if (tmpl_dict_set(c, d, tv_str(kw[k].name, kw[k].n), kw[k].v))
                return tmpl_oom(c, at);
        fa.t = TV_DICT;
        fa.u.m = d;
    } else {
        struct tlist *l;
        if ((rc = tmpl_lib_list(c, at, nargs, &l)))
            return rc;
        tmpl_copy(l->v, args, nargs * sizeof *args);
        l->n = nargs;
        fa = tv_list(l, TV_TUPLE);
    }
    return tmpl_percent_format(c, at, &s, &fa, out);
}

static int items_filter(struct tctx *c, const struct tnode *at, const struct tv *in, struct tv *out)
{
    struct tlist *l;
    int rc;
    if ((rc = tmpl_lib_list(c, at, 0, &l)))
        return rc;
    if (in->t == TV_UNDEF)
        return tmpl_lib_iter(c, at, l, TI_GEN, out);
    if (in->t != TV_DICT)
        return tmpl_err(c, at, CAIRN_EFORMAT, "Can only get item pairs from a mapping.");
    for (size_t i = 0; i < in->u.m->n; i++) {
        struct tv p;
        if ((rc = tmpl_lib_pair(c, at, in->u.m->k[i], in->u.m->v[i], &p)) || (rc = tmpl_lib_push(c, at, l, p)))
            return rc;
    }
    return tmpl_lib_iter(c, at, l, TI_GEN, out);
}

/* join: a = {d, attribute}. */
static int join_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                       struct tv *out)
{
    int rc;
    struct tv sep = tv_str("", 0);
    if (tv_given(&a[0]) && (rc = tmpl_str_of(c, at, &a[0], &sep)))
        return rc;
    struct tlist *items;
    if ((rc = tmpl_iterate(c, at, in, &items)))
        return rc;
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (size_t i = 0; i < items->n; i++) {
        struct tv v = items->v[i];
        if (tv_given(&a[1]) && a[1].t != TV_NONE && (rc = attr_path(c, at, &items->v[i], &a[1], NULL, false, &v)))
            goto fail;
        if (i)
            tmpl_sb_put(&b, sep.u.s.p, sep.u.s.n);
        if ((rc = tmpl_to_str(c, at, &b, &v)))
            goto fail;
    }
    return tmpl_sb_to_str(c, &b, out);
fail:
    tmpl_sb_free(&b);
    return rc;
}

/* replace: a = {old, new, count}. */
static int replace_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                          struct tv *out)
{
    int rc;
    if (!tv_given(&a[0]) || !tv_given(&a[1]))
        return tmpl_err(c, at, CAIRN_EFORMAT, "replace() missing required arguments");
    struct tv s, old, nw;
    if ((rc = tmpl_str_of(c, at, in, &s)) || (rc = tmpl_str_of(c, at, &a[0], &old)) ||
        (rc = tmpl_str_of(c, at, &a[1], &nw)))
        return rc;
    int64_t count = -1;
    if (tv_given(&a[2]) && a[2].t != TV_NONE) {
        if (!tv_is_intlike(&a[2]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "replace() count must be an integer");
        count = tv_as_int(&a[2]);
    }
    return tmpl_str_replace(c, at, &s, &old, &nw, count, out);
}

static int reverse_filter(struct tctx *c, const struct tnode *at, const struct tv *in, struct tv *out)
{
    int rc;
    if (in->t == TV_STR) {
        struct tlist *chars;
        if ((rc = tmpl_iterate(c, at, in, &chars)))
            return rc;
        struct tsb b;
        tmpl_sb_init(&b, c);
        for (size_t i = chars->n; i > 0; i--)
            tmpl_sb_put(&b, chars->v[i - 1].u.s.p, chars->v[i - 1].u.s.n);
        rc = tmpl_sb_to_str(c, &b, out);
        if (!rc)
            out->f = in->f;
        return rc;
    }
    struct tlist *items, *rev;
    bool gen = in->t == TV_ITER && (in->u.it->kind == TI_GEN || in->u.it->kind == TI_REVERSE);
    if (in->t == TV_NONE || tv_is_num(in) || in->t == TV_NS || in->t == TV_MACRO || in->t == TV_FUNC)
        return tmpl_err(c, at, CAIRN_EFORMAT, "argument must be iterable");
    if ((rc = tmpl_iterate(c, at, in, &items)) || (rc = tmpl_lib_list(c, at, items->n, &rev)))
        return rc;
    for (size_t i = 0; i < items->n; i++)
        rev->v[i] = items->v[items->n - 1 - i];
    rev->n = items->n;
    if (gen) {
        *out = tv_list(rev, TV_LIST);
        return 0;
    }
    return tmpl_lib_iter(c, at, rev, TI_REVERSE, out);
}

/* sum: a = {attribute, start}. */
static int sum_filter(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *a,
                      struct tv *out)
{
    int rc;
    struct tv acc = tv_given(&a[1]) ? a[1] : tv_int(0);
    if (acc.t == TV_STR)
        return tmpl_err(c, at, CAIRN_EFORMAT, "sum() can't sum strings [use ''.join(seq) instead]");
    struct tlist *items;
    if ((rc = tmpl_iterate(c, at, in, &items)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv v, r;
        if ((rc = attr_path(c, at, &items->v[i], &a[0], NULL, false, &v)) ||
            (rc = tmpl_binop(c, at, B_ADD, &acc, &v, &r)))
            return rc;
        acc = r;
    }
    *out = acc;
    return 0;
}

static int wordcount_filter(struct tctx *c, const struct tnode *at, const struct tv *in, struct tv *out)
{
    struct tv s;
    int rc;
    if ((rc = tmpl_str_of(c, at, in, &s)))
        return rc;
    int64_t words = 0;
    bool inword = false;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        i += tmpl_utf8_dec(s.u.s.p + i, s.u.s.n - i, &cp);
        bool w = cp == '_' || (cp < 0x80 ? ((cp | 32) >= 'a' && (cp | 32) <= 'z') || (cp >= '0' && cp <= '9')
                                          : c->t->loc && iswalnum_l((wint_t)cp, c->t->loc));
        if (w && !inword)
            words++;
        inword = w;
    }
    *out = tv_int(words);
    return 0;
}

/* Each filter's parameters as jinja2 names them, and its name in messages; none: it takes
 * no arguments. map, select, reject, selectattr, rejectattr and format bind their own. */
static const struct { int id; const char *name; const char *params[5]; } filter_params[] = {
    {F_ABS, "abs", {NULL}}, {F_ATTR, "attr", {"name"}}, {F_BATCH, "batch", {"linecount", "fill_with"}},
    {F_SLICE, "slice", {"slices", "fill_with"}}, {F_CAPITALIZE, "capitalize", {NULL}},
    {F_CENTER, "center", {"width"}}, {F_DEFAULT, "default", {"default_value", "boolean"}},
    {F_DICTSORT, "dictsort", {"case_sensitive", "by", "reverse"}}, {F_ESCAPE, "escape", {NULL}},
    {F_FORCEESCAPE, "forceescape", {NULL}}, {F_FIRST, "first", {NULL}}, {F_LAST, "last", {NULL}},
    {F_FLOAT, "float", {"default"}}, {F_INT, "int", {"default", "base"}},
    {F_GROUPBY, "groupby", {"attribute", "default", "case_sensitive"}},
    {F_INDENT, "indent", {"width", "first", "blank"}}, {F_ITEMS, "items", {NULL}},
    {F_JOIN, "join", {"d", "attribute"}}, {F_LENGTH, "length", {NULL}}, {F_LIST, "list", {NULL}},
    {F_LOWER, "lower", {NULL}}, {F_UPPER, "upper", {NULL}}, {F_MAX, "max", {"case_sensitive", "attribute"}},
    {F_MIN, "min", {"case_sensitive", "attribute"}}, {F_REPLACE, "replace", {"old", "new", "count"}},
    {F_REVERSE, "reverse", {NULL}}, {F_ROUND, "round", {"precision", "method"}}, {F_SAFE, "safe", {NULL}},
    {F_SORT, "sort", {"reverse", "case_sensitive", "attribute"}}, {F_STRING, "string", {NULL}},
    {F_SUM, "sum", {"attribute", "start"}}, {F_TITLE, "title", {NULL}},
    {F_TOJSON, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}}, {F_TRIM, "trim", {"chars"}},
    {F_TRUNCATE, "truncate", {"length", "killwords", "end", "leeway"}},
    {F_UNIQUE, "unique", {"case_sensitive", "attribute"}}, {F_WORDCOUNT, "wordcount", {NULL}},
};

/* Binds the arguments of filter id to its parameters in a[]. */
static int bind_filter(struct tctx *c, const struct tnode *at, int id, const struct tv *args, size_t nargs,
                       const struct tkw *kw, size_t nkw, struct tv *a)
{
    for (size_t i = 0; i < sizeof filter_params / sizeof filter_params[0]; i++) {
        if (filter_params[i].id != id)
            continue;
        const char *const *names = filter_params[i].params;
        size_t np = 0;
        while (np < 5 && names[np])
            np++;
        if (!np && (nargs || nkw))
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() takes no arguments", filter_params[i].name);
        return np ? tmpl_bind(c, at, filter_params[i].name, names, np, args, nargs, kw, nkw, a) : 0;
    }
    return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "filter not supported");
}

int tmpl_apply_filter(struct tctx *c, const struct tnode *at, int id, const struct tv *in, const struct tv *args,
                      size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    int charged = tmpl_charge(c, at, in, args, nargs);
    if (charged)
        return charged;
    switch (id) {
    case F_FORMAT:
        return format_filter(c, at, in, args, nargs, kw, nkw, out);
    case F_MAP:
        return map_filter(c, at, in, args, nargs, kw, nkw, out);
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
        return select_reject(c, at, in, args, nargs, kw, nkw, id == F_SELECTATTR || id == F_REJECTATTR,
                             id == F_REJECT || id == F_REJECTATTR, out);
    default:
        break;
    }
    struct tv a[5], s;
    int64_t n;
    int rc = bind_filter(c, at, id, args, nargs, kw, nkw, a);
    if (rc)
        return rc;
    switch (id) {
    case F_ABS: return abs_filter(c, at, in, out);
    case F_ATTR: return attr_filter(c, at, in, &a[0], out);
    case F_BATCH: return slice_batch(c, at, in, a, true, out);
    case F_SLICE: return slice_batch(c, at, in, a, false, out);
    case F_CAPITALIZE:
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        return tmpl_str_capitalize(c, &s, out);
    case F_CENTER: return center_filter(c, at, in, &a[0], out);
    case F_DEFAULT:
        if (in->t == TV_UNDEF || (tv_given(&a[1]) && tmpl_truthy(&a[1]) && !tmpl_truthy(in)))
            *out = tv_given(&a[0]) ? a[0] : tv_str("", 0);
        else
            *out = *in;
        return 0;
    case F_DICTSORT: return dictsort_filter(c, at, in, a, out);
    case F_ESCAPE: return tmpl_html_escape(c, in, out);
    case F_FORCEESCAPE:
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        s.f = 0;
        return tmpl_html_escape(c, &s, out);
    case F_FIRST:
    case F_LAST: return first_last(c, at, in, id == F_LAST, out);
    case F_FLOAT: return to_float(c, at, in, a, out);
    case F_INT: return to_int(c, at, in, a, out);
    case F_GROUPBY: return groupby_filter(c, at, in, a, out);
    case F_INDENT: return indent_filter(c, at, in, a, out);
    case F_ITEMS: return items_filter(c, at, in, out);
    case F_JOIN: return join_filter(c, at, in, a, out);
    case F_LENGTH:
        if ((rc = tmpl_len(c, at, in, &n)))
            return rc;
        *out = tv_int(n);
        return 0;
    case F_LIST: {
        struct tlist *l;
        if ((rc = tmpl_iterate(c, at, in, &l)))
            return rc;
        *out = tv_list(l, TV_LIST);
        return 0;
    }
    case F_LOWER:
    case F_UPPER:
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        return tmpl_str_case(c, &s, id == F_UPPER, out);
    case F_MAX:
    case F_MIN: return minmax(c, at, in, a, id == F_MAX, out);
    case F_REPLACE: return replace_filter(c, at, in, a, out);
    case F_REVERSE: return reverse_filter(c, at, in, out);
    case F_ROUND: return round_filter(c, at, in, a, out);
    case F_SAFE:
        if ((rc = tmpl_str_of(c, at, in, out)))
            return rc;
        out->f |= TVF_MARKUP;
        return 0;
    case F_SORT: return sort_filter(c, at, in, a, out);
    case F_STRING: return tmpl_str_of(c, at, in, out);
    case F_SUM: return sum_filter(c, at, in, a, out);
    case F_TITLE:
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        return tmpl_str_title_filter(c, &s, out);
    case F_TOJSON: return tojson_filter(c, at, in, a, out);
    case F_TRIM:
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        return tmpl_str_strip(c, at, &s, &a[0], 3, out);
    case F_TRUNCATE: return truncate_filter(c, at, in, a, out);
    case F_UNIQUE: return unique_filter(c, at, in, a, out);
    case F_WORDCOUNT: return wordcount_filter(c, at, in, out);
    default: return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "filter not supported");
    }
}
