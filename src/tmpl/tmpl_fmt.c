/* Python's string formatting: str.format() with its format spec mini-language, and
 * printf-style str % args. */
#define _GNU_SOURCE
#include "tmpl/tmpl_lib.h"

#include "base/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest precision a spec may ask for. format_float's buffers hold a float formatted
 * at it whole (Python has no limit; a template that asks for more is refused, not cut). */
#define FMT_PREC_MAX 10000

static int check_width_prec(struct tctx *c, const struct tnode *at, int64_t width, int64_t prec)
{
    if (width > (int64_t)c->max_str || prec > FMT_PREC_MAX)
        return tmpl_err(c, at, CAIRN_EFULL, "format width or precision too large");
    return 0;
}

/* ---- str.format ---- */

struct fspec {
    uint32_t fill;
    bool fill_given; /* fill came with an align ("*>"); else the '0' flag makes it '0' */
    char align;  /* 0 when not given */
    char sign;
    bool alt, zero;
    char grouping;
    int64_t width, prec;  /* -1 when not given */
    char type;
};

static int parse_spec(struct tctx *c, const struct tnode *at, const char *p, size_t n, struct fspec *f)
{
    memset(f, 0, sizeof *f);
    f->fill = ' ';
    f->width = f->prec = -1;
    size_t i = 0;
    if (n) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p, n, &cp);
        if (k < n && strchr("<>=^", p[k])) {
            f->fill = cp;
            f->fill_given = true;
            f->align = p[k];
            i = k + 1;
        } else if (strchr("<>=^", p[0])) {
            f->align = p[0];
            i = 1;
        }
    }
    if (i < n && (p[i] == '+' || p[i] == '-' || p[i] == ' '))
        f->sign = p[i++];
    if (i < n && p[i] == '#') {
        f->alt = true;
        i++;
    }
    if (i < n && p[i] == '0') {
        f->zero = true;
        i++;
    }
    if (i < n && p[i] >= '0' && p[i] <= '9') {
        f->width = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && f->width < 100000000)
            f->width = f->width * 10 + (p[i++] - '0');
    }
    if (i < n && (p[i] == ',' || p[i] == '_'))
        f->grouping = p[i++];
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || p[i] < '0' || p[i] > '9')
            return tmpl_err(c, at, CAIRN_EFORMAT, "Format specifier missing precision");
        f->prec = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && f->prec < 100000000)
            f->prec = f->prec * 10 + (p[i++] - '0');
    }
    if (i < n)
        f->type = p[i++];
    if (i < n)
        return tmpl_err(c, at, CAIRN_EFORMAT, "Invalid format specifier '%.*s'", (int)n, p);
    /* as Python: ',' groups decimal forms only, '_' also b, o, x and X (by 4 digits) */
    if (f->grouping && f->type && !strchr(f->grouping == '_' ? "deEfFgG%boxX" : "deEfFgG%", f->type))
        return tmpl_err(c, at, CAIRN_EFORMAT, "Cannot specify '%c' with '%c'.", f->grouping, f->type);
    return check_width_prec(c, at, f->width, f->prec);
}

/* The fill and alignment a spec means, as Python: the '0' flag fills with '0' unless a fill
 * was given, and aligns numbers by '=' (after the sign) unless an alignment was given. */
static void fill_align(const struct fspec *f, char dflt, uint32_t *fill, char *align)
{
    *fill = f->zero && !f->fill_given ? '0' : f->fill;
    *align = f->align ? f->align : f->zero && dflt == '>' ? '=' : dflt;
}

/* Zero padding of at least pad characters put in front of a grouped integer part of
 * int_len characters (the first of digits) with a separator every `every` digits: the
 * fewest zeros whose grouped length makes it whole, never starting with a separator
 * ('{:08,}'.format(100) is '0,000,100', one over the width, as CPython). */
static void put_grouped_zeros(struct tsb *b, const char *digits, size_t int_len, char sep, int every, int64_t pad)
{
    int64_t d = 0; /* real digits of the integer part */
    for (size_t i = 0; i < int_len; i++)
        d += digits[i] != sep;
    int64_t want = (int64_t)int_len + pad, t = d;
    while (t + (t - 1) / every < want)
        t++;
    for (int64_t i = t - 1; i >= d; i--) {
        tmpl_sb_putc(b, '0');
        if (i % every == 0)
            tmpl_sb_putc(b, sep);
    }
}

/* Lays out sign + prefix + digits with fill/align/width (align '=' pads after the sign).
 * every > 0: digits start with a grouped integer part of int_len characters, and zero
 * padding after the sign is grouped with it. */
static int layout_number(struct tctx *c, const char *sign, const char *prefix, const char *digits, size_t nd,
                         const struct fspec *f, int every, size_t int_len, struct tv *out)
{
    uint32_t fill;
    char align;
    fill_align(f, '>', &fill, &align);
    size_t body = strlen(sign) + strlen(prefix) + nd;
    int64_t pad = f->width > (int64_t)body ? f->width - (int64_t)body : 0;
    char u[4];
    size_t k = tmpl_utf8_enc(fill, u);
    struct tsb b;
    tmpl_sb_init(&b, c);
    int64_t left = align == '<' ? 0 : align == '^' ? pad / 2 : align == '=' ? 0 : pad;
    int64_t right = align == '<' ? pad : align == '^' ? pad - pad / 2 : 0;
    for (int64_t i = 0; i < left; i++)
        tmpl_sb_put(&b, u, k);
    tmpl_sb_puts(&b, sign);
    tmpl_sb_puts(&b, prefix);
    if (align == '=' && fill == '0' && every > 0 && pad > 0)
        put_grouped_zeros(&b, digits, int_len, f->grouping, every, pad);
    else if (align == '=')
        for (int64_t i = 0; i < pad; i++)
            tmpl_sb_put(&b, u, k);
    tmpl_sb_put(&b, digits, nd);
    for (int64_t i = 0; i < right; i++)
        tmpl_sb_put(&b, u, k);
    return tmpl_sb_to_str(c, &b, out);
}

static void group_digits(const char *in, size_t n, char sep, int every, char *out, size_t *on)
{
    /* in: integer digits only */
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        out[o++] = in[i];
        size_t rest = n - i - 1;
        if (sep && rest && rest % (size_t)every == 0)
            out[o++] = sep;
    }
    *on = o;
}

/* |v| without negating v (INT64_MIN has no positive int64_t). */
static uint64_t magnitude(int64_t v) { return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v; }

/* An integer of magnitude mag, negative when neg. */
static int format_mag(struct tctx *c, const struct tnode *at, uint64_t mag, bool neg, const struct fspec *f,
                      struct tv *out)
{
    char type = f->type ? f->type : 'd';
    if (type == 'n')
        type = 'd';
    if (type == 'c') {
        if (neg || mag > 0x10FFFF)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%%c arg not in range(0x110000)");
        char u[5];
        size_t k = tmpl_utf8_enc((uint32_t)mag, u);
        return layout_number(c, "", "", u, k, f, 0, 0, out);
    }
    int base = type == 'b' ? 2 : type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
    if (!strchr("dboxX", type))
        return tmpl_err(c, at, CAIRN_EFORMAT, "Unknown format code '%c' for object of type 'int'", type);
    char tmp[80], digits[120];
    int nt = 0;
    do {
        int d = (int)(mag % (uint64_t)base);
        tmp[nt++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
        mag /= (uint64_t)base;
    } while (mag);
    char fwd[80];
    for (int i = 0; i < nt; i++)
        fwd[i] = tmp[nt - 1 - i];
    size_t nd;
    group_digits(fwd, (size_t)nt, f->grouping, base == 10 ? 3 : 4, digits, &nd);
    const char *sign = neg ? "-" : f->sign == '+' ? "+" : f->sign == ' ' ? " " : "";
    const char *prefix = !f->alt ? "" : type == 'b' ? "0b" : type == 'o' ? "0o" : type == 'x' ? "0x" : type == 'X' ? "0X" : "";
    return layout_number(c, sign, prefix, digits, nd, f, f->grouping ? (base == 10 ? 3 : 4) : 0, nd, out);
}

static int format_int(struct tctx *c, const struct tnode *at, int64_t v, const struct fspec *f, struct tv *out)
{
    return format_mag(c, at, magnitude(v), v < 0, f, out);
}

/* Strips the zeros that end a fraction, and the point when nothing is left after it. */
static void strip_fraction_zeros(char *m)
{
    if (!strchr(m, '.'))
        return;
    char *z = m + strlen(m) - 1;
    while (*z == '0')
        *z-- = 0;
    if (*z == '.')
        *z = 0;
}

/* repr(a), with '#': a point before the exponent where the mantissa has none ('1.e+20'). */
static void float_repr_spec(double a, bool alt, char *buf)
{
    char r[32];
    tmpl_float_repr(a, r);
    char *e = strchr(r, 'e');
    if (alt && e && !memchr(r, '.', (size_t)(e - r)))
        sprintf(buf, "%.*s.%s", (int)(e - r), r, e);
    else
        strcpy(buf, r);
}

/* No type but a precision p: like 'g', but a fixed-point result keeps a digit after the
 * point, and exponent notation starts one digit earlier (CPython's add_dot_0); with '#',
 * as '#g', the zeros that end the digits stay. buf holds FMT_PREC_MAX + 400 bytes. */
static void float_general_spec(double a, int64_t prec, bool alt, char *buf, size_t bn)
{
    int p = (int)(prec ? prec : 1);
    if (isinf(a) || isnan(a)) {
        strcpy(buf, isinf(a) ? "inf" : "nan");
        return;
    }
    char e[FMT_PREC_MAX + 32];
    snprintf(e, sizeof e, "%.*e", p - 1, a);
    int decpt = a == 0 ? 1 : atoi(strchr(e, 'e') + 1) + 1; /* digits before the point */
    if (decpt <= -4 || decpt > p - 1) {
        if (alt) {
            snprintf(buf, bn, "%#.*e", p - 1, a);
            return;
        }
        char *x = strchr(e, 'e');
        *x = 0;
        strip_fraction_zeros(e);
        snprintf(buf, bn, "%se%c%02d", e, decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        return;
    }
    /* decpt <= p - 1: at least one digit after the point */
    snprintf(buf, bn, "%.*f", p - decpt, a);
    if (!alt) {
        strip_fraction_zeros(buf);
        if (!strchr(buf, '.'))
            strcat(buf, ".0");
    }
}

/* '#g' of a finite a at precision p (> 0), as C says it and Python does: glibc's "%#g"
 * drops the zeros when rounding carries into a new exponent (999999.5 gives "1.e+06", not
 * "1.00000e+06"), so the exponent comes from "%e" and the form from it. */
static void float_alt_g(double a, int p, bool upper, char *buf, size_t bn)
{
    char e[FMT_PREC_MAX + 32];
    snprintf(e, sizeof e, "%.*e", p - 1, a);
    int x = a == 0 ? 0 : atoi(strchr(e, 'e') + 1);
    if (x < p && x >= -4)
        snprintf(buf, bn, "%#.*f", p - 1 - x, a);
    else
        snprintf(buf, bn, upper ? "%#.*E" : "%#.*e", p - 1, a);
}

static int format_float(struct tctx *c, const struct tnode *at, double d, const struct fspec *f, struct tv *out)
{
    char type = f->type;
    /* Every form fits whole: a finite double has at most 309 integer digits ('f' of
     * 1.8e308, and of '%' below inf), type 0 and 'g' print fixed only below 1e309 and an
     * exponent adds at most 6 characters, all beside at most FMT_PREC_MAX fraction digits. */
    char buf[FMT_PREC_MAX + 400];
    double a = fabs(d);
    bool neg = signbit(d) && !isnan(d);
    if (type == 0 && f->prec < 0) {
        float_repr_spec(a, f->alt, buf);
    } else if (type == 0) {
        float_general_spec(a, f->prec, f->alt, buf, sizeof buf);
    } else if (strchr("eEfFgG%n", type)) {
        char t = type == '%' ? 'f' : type == 'n' ? 'g' : type;
        int p = (int)(f->prec < 0 ? 6 : f->prec);
        char fmt[16];
        snprintf(fmt, sizeof fmt, "%%%s.*%c", f->alt ? "#" : "", t);
        if (f->alt && (t == 'g' || t == 'G') && isfinite(a))
            float_alt_g(a, p ? p : 1, t == 'G', buf, sizeof buf - 2);
        else
            snprintf(buf, sizeof buf - 2, fmt, p, type == '%' ? a * 100 : a);
        if (type == '%')
            strcat(buf, "%");
    } else {
        return tmpl_err(c, at, CAIRN_EFORMAT, "Unknown format code '%c' for object of type 'float'", type);
    }
    /* grouping applies to the integer part */
    char digits[sizeof buf + 128];  /* grouping adds a separator per 3 of <= 309 integer digits */
    size_t nd = 0, int_len = 0;
    bool grouped = f->grouping && !isinf(a) && !isnan(a);
    if (grouped) {
        size_t ip = strspn(buf, "0123456789");
        group_digits(buf, ip, f->grouping, 3, digits, &nd);
        int_len = nd;
        size_t rest = strlen(buf + ip);
        memcpy(digits + nd, buf + ip, rest);
        nd += rest;
    } else {
        nd = strlen(buf);
        memcpy(digits, buf, nd);
    }
    const char *sign = neg ? "-" : f->sign == '+' ? "+" : f->sign == ' ' ? " " : "";
    return layout_number(c, sign, "", digits, nd, f, grouped ? 3 : 0, int_len, out);
}

/* format(value, spec) */
static int format_value(struct tctx *c, const struct tnode *at, const struct tv *v, const char *spec, size_t sn,
                        struct tv *out)
{
    if (!sn)
        return tmpl_str_of(c, at, v, out);
    struct fspec f;
    int rc = parse_spec(c, at, spec, sn, &f);
    if (rc)
        return rc;
    if (v->t == TV_STR) {
        if (f.type && f.type != 's')
            return tmpl_err(c, at, CAIRN_EFORMAT, "Unknown format code '%c' for object of type 'str'", f.type);
        if (f.sign || f.align == '=' || f.alt)
            return tmpl_err(c, at, CAIRN_EFORMAT, "invalid format specifier for a string");
        if (f.grouping)
            return tmpl_err(c, at, CAIRN_EFORMAT, "Cannot specify '%c' with 's'.", f.grouping);
        struct tv s = *v;
        if (f.prec >= 0)
            s.u.s.n = tmpl_cp_off(s.u.s.p, s.u.s.n, f.prec);
        uint32_t fill;
        char align;
        fill_align(&f, '<', &fill, &align);
        return tmpl_str_pad(c, at, &s, f.width, fill, align == '^' ? 'c' : align, out);
    }
    if (tv_is_intlike(v)) {
        if (f.type && strchr("eEfFgG%", f.type))
            return format_float(c, at, (double)tv_as_int(v), &f, out);
        return format_int(c, at, tv_as_int(v), &f, out);
    }
    if (v->t == TV_FLOAT)
        return format_float(c, at, v->u.d, &f, out);
    return tmpl_err(c, at, CAIRN_EFORMAT, "unsupported format string passed to %s.__format__", tmpl_type_name(v));
}

static int format_field_value(struct tctx *c, const struct tnode *at, const char *name, size_t n,
                              const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw,
                              size_t *autoidx, int *mode, struct tv *out)
{
    size_t i = 0;
    while (i < n && name[i] != '.' && name[i] != '[')
        i++;
    int rc;
    if (i == 0 || (name[0] >= '0' && name[0] <= '9')) {
        size_t idx;
        if (i == 0) {
            if (*mode == 2)
                return tmpl_err(c, at, CAIRN_EFORMAT, "cannot switch from manual field specification to automatic field numbering");
            *mode = 1;
            idx = (*autoidx)++;
        } else {
            if (*mode == 1)
                return tmpl_err(c, at, CAIRN_EFORMAT, "cannot switch from automatic field numbering to manual field specification");
            *mode = 2;
            idx = 0;
            for (size_t k = 0; k < i; k++) {
                if (name[k] < '0' || name[k] > '9' || idx > 100000)
                    return tmpl_err(c, at, CAIRN_EFORMAT, "bad field name in format string");
                idx = idx * 10 + (size_t)(name[k] - '0');
            }
        }
        if (idx >= nargs)
            return tmpl_err(c, at, CAIRN_EFORMAT, "Replacement index %zu out of range for positional args tuple", idx);
        *out = args[idx];
    } else {
        size_t k;
        for (k = 0; k < nkw; k++)
            if (kw[k].n == i && !memcmp(kw[k].name, name, i))
                break;
        if (k == nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "format key '%.*s' not given", (int)i, name);
        *out = kw[k].v;
    }
    while (i < n) {
        if (name[i] == '.') {
            size_t st = ++i;
            while (i < n && name[i] != '.' && name[i] != '[')
                i++;
            struct tv r;
            if ((rc = tmpl_getattr(c, at, out, name + st, i - st, &r)))
                return rc;
            *out = r;
        } else {
            size_t st = ++i;
            while (i < n && name[i] != ']')
                i++;
            if (i >= n)
                return tmpl_err(c, at, CAIRN_EFORMAT, "Missing ']' in format string");
            struct tv key = tv_str(name + st, i - st), r;
            bool digits = i > st;
            int64_t iv = 0;
            for (size_t k = st; k < i && digits; k++) {
                digits = name[k] >= '0' && name[k] <= '9';
                iv = iv * 10 + (name[k] - '0');
                if (iv > 1000000000)
                    digits = false;
            }
            if (digits)
                key = tv_int(iv);
            i++;
            if ((rc = tmpl_getitem(c, at, out, &key, &r)))
                return rc;
            *out = r;
        }
    }
    return 0;
}

int tmpl_str_format(struct tctx *c, const struct tnode *at, const struct tv *fmt, const struct tv *args,
                    size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n, autoidx = 0;
    int mode = 0, rc;
    struct tsb b;
    tmpl_sb_init(&b, c);
    for (size_t i = 0; i < n;) {
        char ch = p[i];
        if (ch == '}') {
            if (i + 1 < n && p[i + 1] == '}') {
                tmpl_sb_putc(&b, '}');
                i += 2;
                continue;
            }
            rc = tmpl_err(c, at, CAIRN_EFORMAT, "Single '}' encountered in format string");
            goto fail;
        }
        if (ch != '{') {
            tmpl_sb_putc(&b, ch);
            i++;
            continue;
        }
        if (i + 1 < n && p[i + 1] == '{') {
            tmpl_sb_putc(&b, '{');
            i += 2;
            continue;
        }
        size_t st = ++i;
        int depth = 1;
        size_t bracket = 0;
        while (i < n) {
            if (p[i] == '[')
                bracket++;
            else if (p[i] == ']' && bracket)
                bracket--;
            else if (!bracket && p[i] == '{')
                depth++;
            else if (!bracket && p[i] == '}' && --depth == 0)
                break;
            i++;
        }
        if (i >= n) {
            rc = tmpl_err(c, at, CAIRN_EFORMAT, "expected '}' before end of string");
            goto fail;
        }
        const char *field = p + st;
        size_t fl = i - st;
        i++;
        size_t name_end = 0;
        bracket = 0;
        while (name_end < fl && (bracket || (field[name_end] != '!' && field[name_end] != ':'))) {
            if (field[name_end] == '[')
                bracket++;
            else if (field[name_end] == ']' && bracket)
                bracket--;
            name_end++;
        }
        char conv = 0;
        const char *spec = "";
        size_t sn = 0;
        size_t j = name_end;
        if (j < fl && field[j] == '!') {
            if (j + 1 >= fl) {
                rc = tmpl_err(c, at, CAIRN_EFORMAT, "end of string while looking for conversion specifier");
                goto fail;
            }
            conv = field[j + 1];
            j += 2;
            if (j < fl && field[j] != ':') {
                rc = tmpl_err(c, at, CAIRN_EFORMAT, "expected ':' after conversion specifier");
                goto fail;
            }
        }
        if (j < fl && field[j] == ':') {
            spec = field + j + 1;
            sn = fl - j - 1;
        }
        if (memchr(spec, '{', sn)) {
            rc = tmpl_err(c, at, CAIRN_EUNSUPPORTED, "nested replacement fields in format specs are not supported");
            goto fail;
        }
        struct tv v, s;
        if ((rc = format_field_value(c, at, field, name_end, args, nargs, kw, nkw, &autoidx, &mode, &v)))
            goto fail;
        if (conv == 'r' || conv == 'a') {
            struct tsb rb;
            tmpl_sb_init(&rb, c);
            if ((rc = tmpl_repr(c, at, &rb, &v)) || (rc = tmpl_sb_to_str(c, &rb, &v))) {
                tmpl_sb_free(&rb);
                goto fail;
            }
        } else if (conv == 's') {
            if ((rc = tmpl_str_of(c, at, &v, &s)))
                goto fail;
            v = s;
        } else if (conv) {
            rc = tmpl_err(c, at, CAIRN_EFORMAT, "Unknown conversion specifier %c", conv);
            goto fail;
        }
        if ((rc = format_value(c, at, &v, spec, sn, &s)))
            goto fail;
        tmpl_sb_put(&b, s.u.s.p, s.u.s.n);
    }
    return tmpl_sb_to_str(c, &b, out);
fail:
    tmpl_sb_free(&b);
    return rc;
}

/* ---- printf-style % ---- */

/* The right operand of str % args. */
struct pargs {
    const struct tv *args;
    const struct tv *pos;  /* positional arguments: a tuple's items, or args itself */
    size_t npos, next;
    bool mapping;          /* args is a dict: %(key)s takes from it */
    bool used_key;
};

/* One conversion: flags, width and precision (-1 when not given), conversion character. */
struct pconv {
    char flags[8];
    int64_t width, prec;
    char conv;
};

/* "(key)" at p[*pi]: the value of key in the mapping. */
static int percent_key(struct tctx *c, const struct tnode *at, const char *p, size_t n, size_t *pi,
                       struct pargs *pa, struct tv *val)
{
    if (!pa->mapping)
        return tmpl_err(c, at, CAIRN_EFORMAT, "format requires a mapping");
    size_t i = *pi, st = ++i;
    int depth = 1;
    while (i < n && depth) {
        if (p[i] == '(')
            depth++;
        else if (p[i] == ')')
            depth--;
        i++;
    }
    if (depth)
        return tmpl_err(c, at, CAIRN_EFORMAT, "incomplete format key");
    long k = tmpl_dict_find_str(pa->args->u.m, p + st, i - 1 - st);
    if (k < 0)
        return tmpl_err(c, at, CAIRN_EFORMAT, "KeyError: '%.*s'", (int)(i - 1 - st), p + st);
    *val = pa->args->u.m->v[k];
    pa->used_key = true;
    *pi = i;
    return 0;
}

/* A width or precision given as '*': the next positional argument. */
static int percent_star(struct tctx *c, const struct tnode *at, struct pargs *pa, int64_t *out)
{
    if (pa->next >= pa->npos || !tv_is_intlike(&pa->pos[pa->next]))
        return tmpl_err(c, at, CAIRN_EFORMAT, "* wants int");
    *out = tv_as_int(&pa->pos[pa->next++]);
    return 0;
}

/* Flags, width, precision, length modifier and conversion character at p[*pi]. */
static int percent_spec(struct tctx *c, const struct tnode *at, const char *p, size_t n, size_t *pi,
                        struct pargs *pa, struct pconv *pc)
{
    size_t i = *pi;
    int nf = 0, rc;
    memset(pc->flags, 0, sizeof pc->flags);
    while (i < n && strchr("-+ #0", p[i]) && nf < 6)
        pc->flags[nf++] = p[i++];
    pc->width = pc->prec = -1;
    if (i < n && p[i] == '*') {
        if ((rc = percent_star(c, at, pa, &pc->width)))
            return rc;
        if (pc->width < 0) { /* as Python: a negative width from '*' left-justifies */
            pc->width = pc->width < -100000000 ? 100000000 : -pc->width;
            if (!strchr(pc->flags, '-') && nf < (int)sizeof pc->flags - 1)
                pc->flags[nf++] = '-';
        }
        i++;
    } else {
        while (i < n && p[i] >= '0' && p[i] <= '9' && pc->width < 100000000)
            pc->width = (pc->width < 0 ? 0 : pc->width * 10) + (p[i++] - '0');
    }
    if (i < n && p[i] == '.') {
        i++;
        pc->prec = 0;
        if (i < n && p[i] == '*') {
            if ((rc = percent_star(c, at, pa, &pc->prec)))
                return rc;
            if (pc->prec < 0) /* as Python: a negative precision from '*' is 0 */
                pc->prec = 0;
            i++;
        } else {
            while (i < n && p[i] >= '0' && p[i] <= '9' && pc->prec < 100000000)
                pc->prec = pc->prec * 10 + (p[i++] - '0');
        }
    }
    while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L'))
        i++;
    if (i >= n)
        return tmpl_err(c, at, CAIRN_EFORMAT, "incomplete format");
    pc->conv = p[i++];
    *pi = i;
    return 0;
}

/* %s, %r, %a */
static int percent_str(struct tctx *c, const struct tnode *at, const struct pconv *pc, bool left,
                       const struct tv *val, struct tv *s)
{
    struct tsb rb;
    tmpl_sb_init(&rb, c);
    int rc = pc->conv == 's' ? tmpl_to_str(c, at, &rb, val) : tmpl_repr(c, at, &rb, val);
    if (rc || (rc = tmpl_sb_to_str(c, &rb, s))) {
        tmpl_sb_free(&rb);
        return rc;
    }
    if (pc->prec >= 0)
        s->u.s.n = tmpl_cp_off(s->u.s.p, s->u.s.n, pc->prec);
    return tmpl_str_pad(c, at, s, pc->width, ' ', left ? '<' : '>', s);
}

/* %d, %i, %u, %x, %X, %o */
static int percent_int(struct tctx *c, const struct tnode *at, char conv, const struct tv *val, struct fspec *f,
                       struct tv *s)
{
    int64_t iv;
    int rc;
    if (tv_is_intlike(val))
        iv = tv_as_int(val);
    else if (val->t == TV_FLOAT && conv != 'x' && conv != 'X' && conv != 'o' && fabs(val->u.d) < 9e18)
        iv = (int64_t)val->u.d;
    else
        return tmpl_err(c, at, CAIRN_EFORMAT, "%%%c format: a real number is required, not %s", conv,
                        tmpl_type_name(val));
    f->type = conv == 'i' || conv == 'u' ? 'd' : conv;
    if (f->prec < 0)
        return format_int(c, at, iv, f, s);
    /* precision is a minimum digit count */
    struct fspec g = *f;
    g.width = f->prec;
    g.zero = true;
    g.align = 0;
    g.sign = 0;
    g.alt = false;
    if ((rc = format_mag(c, at, magnitude(iv), false, &g, s)))
        return rc;
    char sign[2] = {iv < 0 ? '-' : f->sign, 0};
    const char *prefix = !f->alt ? "" : conv == 'o' ? "0o" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : "";
    f->prec = -1;
    return layout_number(c, sign, prefix, s->u.s.p, s->u.s.n, f, 0, 0, s);
}

/* The text of one conversion of val. */
static int percent_convert(struct tctx *c, const struct tnode *at, const struct pconv *pc, const struct tv *val,
                           struct tv *s)
{
    bool left = strchr(pc->flags, '-') != NULL;
    struct fspec f;
    memset(&f, 0, sizeof f);
    f.fill = ' ';
    f.width = pc->width;
    f.prec = pc->prec;
    f.align = left ? '<' : 0;
    f.zero = strchr(pc->flags, '0') && !left;
    f.alt = strchr(pc->flags, '#') != NULL;
    f.sign = strchr(pc->flags, '+') ? '+' : strchr(pc->flags, ' ') ? ' ' : 0;
    switch (pc->conv) {
    case 's':
    case 'r':
    case 'a':
        return percent_str(c, at, pc, left, val, s);
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o':
        return percent_int(c, at, pc->conv, val, &f, s);
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
        if (!tv_is_num(val))
            return tmpl_err(c, at, CAIRN_EFORMAT, "must be real number, not %s", tmpl_type_name(val));
        f.type = pc->conv;
        return format_float(c, at, tv_as_float(val), &f, s);
    case 'c':
        if (val->t == TV_STR && tmpl_cp_count(val->u.s.p, val->u.s.n) == 1) {
            *s = *val;
            return tmpl_str_pad(c, at, s, pc->width, ' ', left ? '<' : '>', s);
        }
        if (tv_is_intlike(val)) {
            f.type = 'c';
            return format_int(c, at, tv_as_int(val), &f, s);
        }
        return tmpl_err(c, at, CAIRN_EFORMAT, "%%c requires int or char");
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "unsupported format character '%c'", pc->conv);
    }
}

int tmpl_percent_format(struct tctx *c, const struct tnode *at, const struct tv *fmt, const struct tv *args,
                        struct tv *out)
{
    struct pargs pa = {.args = args, .pos = args, .npos = 1, .mapping = args->t == TV_DICT};
    /* Python takes any non-tuple with __getitem__ (dict, list, Undefined) as a mapping:
     * leaving it unused is then no error */
    bool mapping_like = pa.mapping || args->t == TV_LIST || args->t == TV_UNDEF;
    if (args->t == TV_TUPLE) {
        pa.pos = args->u.l->v;
        pa.npos = args->u.l->n;
    }
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n;
    struct tsb b;
    tmpl_sb_init(&b, c);
    int rc;
    for (size_t i = 0; i < n;) {
        if (p[i] != '%') {
            tmpl_sb_putc(&b, p[i++]);
            continue;
        }
        i++;
        const struct tv *val = NULL;
        struct tv keyed, s;
        struct pconv pc = {0}; /* percent_spec fills it on success; {0} keeps -O3 sure of it */
        if (i < n && p[i] == '(') {
            if ((rc = percent_key(c, at, p, n, &i, &pa, &keyed)))
                goto fail;
            val = &keyed;
        }
        if ((rc = percent_spec(c, at, p, n, &i, &pa, &pc)))
            goto fail;
        if (pc.conv == '%') {
            tmpl_sb_putc(&b, '%');
            continue;
        }
        if ((rc = check_width_prec(c, at, pc.width, pc.prec)))
            goto fail;
        if (!val) {
            if (pa.next >= pa.npos) {
                rc = tmpl_err(c, at, CAIRN_EFORMAT, "not enough arguments for format string");
                goto fail;
            }
            val = &pa.pos[pa.next++];
        }
        if ((rc = percent_convert(c, at, &pc, val, &s)))
            goto fail;
        tmpl_sb_put(&b, s.u.s.p, s.u.s.n);
    }
    if (!mapping_like && pa.next < pa.npos && !pa.used_key) {
        rc = tmpl_err(c, at, CAIRN_EFORMAT, "not all arguments converted during string formatting");
        goto fail;
    }
    rc = tmpl_sb_to_str(c, &b, out);
    if (!rc)
        out->f = fmt->f;
    return rc;
fail:
    tmpl_sb_free(&b);
    return rc;
}
