/* Operations on values as jinja2's sandbox does them: attribute and item access,
 * slices, arithmetic and comparison operators, iteration, membership and len(). */
#define _GNU_SOURCE
#include "tmpl/tmpl_int.h"

#include "base/err.h"

#include <math.h>
#include <string.h>

static struct tv undef_elem(int ot, int64_t i)
{
    struct tv u = {.t = TV_UNDEF, .f = TU_ELEM, .ot = (uint8_t)ot};
    u.u.i = i;
    return u;
}

/* ---- attribute and item access ---- */

static int bound_method(struct tctx *c, const struct tv *self, int id, struct tv *out)
{
    struct tfunc *fn = tmpl_alloc(&c->ar, sizeof *fn);
    if (!fn)
        return tmpl_oom(c, NULL);
    fn->id = id;
    fn->self = *self;
    out->t = TV_FUNC;
    out->f = 0;
    out->u.fn = fn;
    return 0;
}

static bool is_dunder(const char *name, size_t n)
{
    return n > 4 && name[0] == '_' && name[1] == '_' && name[n - 1] == '_' && name[n - 2] == '_';
}

static int loop_attr(struct tctx *c, const struct tv *obj, const char *name, size_t n, struct tv *out)
{
    const struct tloop *lp = obj->u.lp;
    int64_t len = (int64_t)lp->items->n, i0 = lp->i0;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(name, s, n))
    if (IS("index")) *out = tv_int(i0 + 1);
    else if (IS("index0")) *out = tv_int(i0);
    else if (IS("revindex")) *out = tv_int(len - i0);
    else if (IS("revindex0")) *out = tv_int(len - i0 - 1);
    else if (IS("first")) *out = tv_bool(i0 == 0);
    else if (IS("last")) *out = tv_bool(i0 == len - 1);
    else if (IS("length")) *out = tv_int(len);
    else if (IS("depth")) *out = tv_int(1);
    else if (IS("depth0")) *out = tv_int(0);
    else if (IS("previtem"))
        *out = i0 > 0 ? lp->items->v[i0 - 1] : tv_undef_hint("there is no previous item");
    else if (IS("nextitem"))
        *out = i0 + 1 < len ? lp->items->v[i0 + 1] : tv_undef_hint("there is no next item");
    else {
        bool unsafe;
        int id = tmpl_method_id(TV_LOOP, name, n, &unsafe);
        if (id >= 0)
            return bound_method(c, obj, id, out);
        *out = tv_undef_attr(TV_LOOP, name, n, is_dunder(name, n) ? TU_UNSAFE : TU_ATTR);
    }
#undef IS
    return 0;
}

/* getattr(obj, name) as the sandbox does it, without the obj[name] fallback; *found
 * tells whether the attribute exists. */
static int real_attr(struct tctx *c, const struct tv *obj, const char *name, size_t n, struct tv *out, bool *found)
{
    *found = true;
    if (obj->t == TV_LOOP)
        return loop_attr(c, obj, name, n, out);
    if (obj->t == TV_NS) {
        long i = tmpl_dict_find_str(obj->u.m, name, n);
        if (i >= 0) {
            if (name[0] == '_')
                *out = tv_undef_attr(TV_NS, name, n, TU_UNSAFE);
            else
                *out = obj->u.m->v[i];
            return 0;
        }
        *found = false;
        return 0;
    }
    if (obj->t == TV_TUPLE && (obj->f & TVF_GROUP)) {
        if (n == 7 && !memcmp(name, "grouper", 7)) {
            *out = obj->u.l->v[0];
            return 0;
        }
        if (n == 4 && !memcmp(name, "list", 4)) {
            *out = obj->u.l->v[1];
            return 0;
        }
    }
    bool unsafe = false;
    int id = tmpl_method_id(obj->t, name, n, &unsafe);
    if (id >= 0) {
        if (unsafe) {
            *out = tv_undef_attr(obj->t, name, n, TU_UNSAFE);
            return 0;
        }
        return bound_method(c, obj, id, out);
    }
    if (is_dunder(name, n)) {
        *out = tv_undef_attr(obj->t, name, n, TU_UNSAFE);
        return 0;
    }
    *found = false;
    return 0;
}

int tmpl_getattr(struct tctx *c, const struct tnode *at, const struct tv *obj, const char *name, size_t n,
                 struct tv *out)
{
    if (obj->t == TV_UNDEF)
        return tmpl_undef_err(c, at, obj);
    bool found;
    int rc = real_attr(c, obj, name, n, out, &found);
    if (rc || found)
        return rc;
    if (obj->t == TV_DICT) {
        long i = tmpl_dict_find_str(obj->u.m, name, n);
        if (i >= 0) {
            *out = obj->u.m->v[i];
            return 0;
        }
    }
    *out = tv_undef_attr(obj->t, name, n, TU_ATTR);
    return 0;
}

/* Code point i of s (i in range) as a string value pointing into s. */
static struct tv str_at(const struct tv *s, int64_t i)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, off = 0;
    for (int64_t k = 0; k < i; k++) {
        off++;
        while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
            off++;
    }
    size_t end = off + 1;
    while (end < n && ((unsigned char)p[end] & 0xC0) == 0x80)
        end++;
    struct tv r = tv_str(p + off, end - off);
    r.f = s->f;
    return r;
}

static bool str_ascii(const struct tv *s)
{
    for (size_t i = 0; i < s->u.s.n; i++)
        if ((unsigned char)s->u.s.p[i] >= 0x80)
            return false;
    return true;
}

int tmpl_getitem(struct tctx *c, const struct tnode *at, const struct tv *obj, const struct tv *key, struct tv *out)
{
    if (obj->t == TV_UNDEF)
        return tmpl_undef_err(c, at, obj);
    switch (obj->t) {
    case TV_DICT:
        if (tmpl_hashable(key)) {
            long i = tmpl_dict_find(obj->u.m, key);
            if (i >= 0) {
                *out = obj->u.m->v[i];
                return 0;
            }
        }
        break;
    case TV_LIST:
    case TV_TUPLE:
    case TV_STR:
        if (tv_is_intlike(key)) {
            int64_t i = tv_as_int(key);
            int64_t len = obj->t == TV_STR ? (int64_t)(str_ascii(obj) ? obj->u.s.n : tmpl_cp_count(obj->u.s.p, obj->u.s.n))
                                           : (int64_t)obj->u.l->n;
            if (i < 0)
                i += len;
            if (i < 0 || i >= len) {
                *out = undef_elem(obj->t, tv_as_int(key));
                return 0;
            }
            if (obj->t == TV_STR)
                *out = str_ascii(obj) ? (struct tv){.t = TV_STR, .f = obj->f, .u.s = {obj->u.s.p + i, 1}} : str_at(obj, i);
            else
                *out = obj->u.l->v[i];
            return 0;
        }
        break;
    default:
        break;
    }
    if (key->t == TV_STR) {
        bool found;
        int rc = real_attr(c, obj, key->u.s.p, key->u.s.n, out, &found);
        if (rc || found)
            return rc;
        *out = tv_undef_attr(obj->t, key->u.s.p, key->u.s.n, TU_ATTR);
        return 0;
    }
    if (tv_is_intlike(key))
        *out = undef_elem(obj->t, tv_as_int(key));
    else
        *out = tv_undef_hint("no such element");
    return 0;
}

/* Python's PySlice_AdjustIndices: first index, step and count of obj[start:stop:step]. */
static void slice_indices(int64_t len, const struct tv *a, const struct tv *b, int64_t step, int64_t *start,
                          int64_t *count)
{
    int64_t st, sp;
    bool has_a = a && a->t != TV_NONE, has_b = b && b->t != TV_NONE;
    if (step > 0) {
        st = has_a ? tv_as_int(a) : 0;
        sp = has_b ? tv_as_int(b) : len;
    } else {
        st = has_a ? tv_as_int(a) : len - 1;
        sp = has_b ? tv_as_int(b) : -1 - len;
    }
    if (has_a || step > 0) {
        if (st < 0) {
            st += len;
            if (st < 0)
                st = step < 0 ? -1 : 0;
        } else if (st >= len) {
            st = step < 0 ? len - 1 : len;
        }
    }
    if (sp < 0) {
        sp += len;
        if (sp < 0)
            sp = step < 0 ? -1 : 0;
    } else if (sp >= len) {
        sp = step < 0 ? len - 1 : len;
    }
    if (step < 0)
        *count = sp < st ? (st - sp - 1) / (-step) + 1 : 0;
    else
        *count = st < sp ? (sp - st - 1) / step + 1 : 0;
    *start = st;
}

/* Whether jinja2's optimizer would evaluate n at compile time (literals and operators on them). */
bool tmpl_const_expr(const struct tnode *n)
{
    if (!n)
        return true;
    switch (n->kind) {
    case N_CONST:
        return true;
    case N_NEG:
    case N_POS:
    case N_NOT:
    case N_BIN:
    case N_AND:
    case N_OR:
    case N_SLICE:
        return tmpl_const_expr(n->a) && tmpl_const_expr(n->b) && tmpl_const_expr(n->c);
    case N_FILTER:
        /* filters that take the context are never folded */
        if (n->sn == 3 ? !memcmp(n->s, "map", 3)
            : n->sn == 6 ? !memcmp(n->s, "select", 6) || !memcmp(n->s, "reject", 6)
            : n->sn == 10 && (!memcmp(n->s, "selectattr", 10) || !memcmp(n->s, "rejectattr", 10)))
            return false;
        /* fall through */
    case N_TEST:
        if (!n->a)
            return false;
        /* fall through */
    case N_COND:
    case N_COMPARE:
    case N_OPERAND:
    case N_KW:
    case N_PAIR:
    case N_GETATTR:
    case N_GETITEM:
        if (!tmpl_const_expr(n->a) || !tmpl_const_expr(n->b) || !tmpl_const_expr(n->c))
            return false;
        /* fall through */
    case N_LIST:
    case N_TUPLE:
    case N_DICT:
    case N_CONCAT:
        for (uint32_t i = 0; i < n->v.n; i++)
            if (!tmpl_const_expr(n->v.v[i]))
                return false;
        for (uint32_t i = 0; i < n->w.n; i++)
            if (!tmpl_const_expr(n->w.v[i]))
                return false;
        return true;
    default:
        return false;
    }
}

int tmpl_slice(struct tctx *c, const struct tnode *at, const struct tv *obj, const struct tv *parts, struct tv *out)
{
    /* slices bypass the sandbox's getitem: errors are raised, not made undefined */
    if (obj->t == TV_UNDEF)
        return tmpl_undef_err(c, at, obj);
    if (obj->t != TV_LIST && obj->t != TV_TUPLE && obj->t != TV_STR) {
        /* jinja2 folds constant expressions at compile time through the sandbox's
         * getitem, which makes `3[1:]` undefined; at run time the same slice raises */
        if (obj->t != TV_DICT && tmpl_const_expr(at->a) && tmpl_const_expr(at->b)) {
            *out = tv_undef_hint("object is not subscriptable");
            return 0;
        }
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object is not subscriptable", tmpl_type_name(obj));
    }
    for (int i = 0; i < 3; i++)
        if (parts[i].t != TV_NONE && !tv_is_intlike(&parts[i])) {
            if (parts[i].t == TV_UNDEF)
                return tmpl_undef_err(c, at, &parts[i]);
            return tmpl_err(c, at, CAIRN_EFORMAT, "slice indices must be integers or None or have an __index__ method");
        }
    int64_t step = parts[2].t == TV_NONE ? 1 : tv_as_int(&parts[2]);
    if (step == 0)
        return tmpl_err(c, at, CAIRN_EFORMAT, "slice step cannot be zero");
    if (step == INT64_MIN)
        step = -INT64_MAX;
    int64_t start, count;
    if (obj->t == TV_LIST || obj->t == TV_TUPLE) {
        const struct tlist *l = obj->u.l;
        slice_indices((int64_t)l->n, &parts[0], &parts[1], step, &start, &count);
        struct tlist *r = tmpl_list_new(c, (size_t)count);
        if (!r && count)
            return tmpl_oom(c, at);
        if (!r && !(r = tmpl_list_new(c, 0)))
            return tmpl_oom(c, at);
        for (int64_t k = 0; k < count; k++)
            r->v[k] = l->v[start + k * step];
        r->n = (size_t)count;
        out->t = obj->t;
        out->f = 0;
        out->u.l = r;
        return 0;
    }
    if (obj->t == TV_STR) {
        const char *p = obj->u.s.p;
        size_t n = obj->u.s.n;
        if (str_ascii(obj)) {
            slice_indices((int64_t)n, &parts[0], &parts[1], step, &start, &count);
            if (step == 1) {
                *out = tv_str(p + start, (size_t)count);
            } else {
                char *s = tmpl_alloc(&c->ar, (size_t)count + 1);
                if (!s)
                    return tmpl_oom(c, at);
                for (int64_t k = 0; k < count; k++)
                    s[k] = p[start + k * step];
                *out = tv_str(s, (size_t)count);
            }
            out->f = obj->f;
            return 0;
        }
        /* code point offsets */
        size_t ncp = tmpl_cp_count(p, n);
        size_t *off = tmpl_alloc(&c->ar, (ncp + 1) * sizeof *off);
        if (!off)
            return tmpl_oom(c, at);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (((unsigned char)p[i] & 0xC0) != 0x80)
                off[k++] = i;
        off[ncp] = n;
        slice_indices((int64_t)ncp, &parts[0], &parts[1], step, &start, &count);
        if (step == 1) {
            *out = count ? tv_str(p + off[start], off[start + count] - off[start]) : tv_str("", 0);
        } else {
            struct tsb b;
            tmpl_sb_init(&b, c);
            for (int64_t j = 0; j < count; j++) {
                int64_t ci = start + j * step;
                tmpl_sb_put(&b, p + off[ci], off[ci + 1] - off[ci]);
            }
            int rc = tmpl_sb_to_str(c, &b, out);
            if (rc)
                return rc;
        }
        out->f = obj->f;
        return 0;
    }
    return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object is not subscriptable", tmpl_type_name(obj));
}

/* ---- operators ---- */

static int type_err2(struct tctx *c, const struct tnode *at, const char *op, const struct tv *a, const struct tv *b)
{
    if (a->t == TV_UNDEF)
        return tmpl_undef_err(c, at, a);
    if (b->t == TV_UNDEF)
        return tmpl_undef_err(c, at, b);
    return tmpl_err(c, at, CAIRN_EFORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                    tmpl_type_name(a), tmpl_type_name(b));
}

static int concat_str(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, struct tv *out)
{
    size_t n = a->u.s.n + b->u.s.n;
    if (n > c->max_str)
        return tmpl_err(c, at, CAIRN_EFULL, "string over the output limit (%zu bytes)", c->max_str);
    char *s = tmpl_alloc(&c->ar, n + 1);
    if (!s)
        return tmpl_oom(c, at);
    tmpl_copy(s, a->u.s.p, a->u.s.n);
    tmpl_copy(s + a->u.s.n, b->u.s.p, b->u.s.n);
    *out = tv_str(s, n);
    return 0;
}

static int repeat(struct tctx *c, const struct tnode *at, const struct tv *seq, int64_t times, struct tv *out)
{
    if (times < 0)
        times = 0;
    if (seq->t == TV_STR) {
        if (seq->u.s.n && (uint64_t)times > c->max_str / seq->u.s.n)
            return tmpl_err(c, at, CAIRN_EFULL, "string over the output limit (%zu bytes)", c->max_str);
        size_t n = seq->u.s.n * (size_t)times;
        char *s = tmpl_alloc(&c->ar, n + 1);
        if (!s)
            return tmpl_oom(c, at);
        for (int64_t i = 0; seq->u.s.n && i < times; i++) /* '' * 10**18 is '' at once */
            tmpl_copy(s + (size_t)i * seq->u.s.n, seq->u.s.p, seq->u.s.n);
        *out = tv_str(s, n);
        out->f = seq->f;
        return 0;
    }
    const struct tlist *l = seq->u.l;
    if (l->n && (uint64_t)times > c->max_str / l->n)
        return tmpl_err(c, at, CAIRN_EFULL, "list too long");
    size_t n = l->n * (size_t)times;
    struct tlist *r = tmpl_list_new(c, n);
    if (!r)
        return tmpl_oom(c, at);
    for (int64_t i = 0; l->n && i < times; i++) /* an empty list has no storage (r->v NULL) */
        tmpl_copy(r->v + (size_t)i * l->n, l->v, l->n * sizeof *l->v);
    r->n = n;
    out->t = seq->t;
    out->f = 0;
    out->u.l = r;
    return 0;
}

static double py_fmod(double x, double y)
{
    double m = fmod(x, y);
    if (m != 0) {
        if ((y < 0) != (m < 0))
            m += y;
    } else {
        m = copysign(0.0, y);
    }
    return m;
}

static double py_floordiv(double x, double y)
{
    double m = fmod(x, y);
    double div = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0)))
        div -= 1.0;
    double fl;
    if (div != 0) {
        fl = floor(div);
        if (div - fl > 0.5)
            fl += 1.0;
    } else {
        fl = copysign(0.0, x / y);
    }
    return fl;
}

int tmpl_binop(struct tctx *c, const struct tnode *at, int op, const struct tv *a, const struct tv *b, struct tv *out)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (!tv_is_num(a) || !tv_is_num(b)) {
        int rc = tmpl_charge(c, at, a, b, 1);
        if (rc)
            return rc;
    }
    if (tv_is_num(a) && tv_is_num(b)) {
        bool fl = a->t == TV_FLOAT || b->t == TV_FLOAT;
        int64_t x = tv_as_int(a), y = tv_as_int(b), r;
        double fx = tv_as_float(a), fy = tv_as_float(b);
        switch (op) {
        case B_ADD:
            if (fl)
                *out = tv_float(fx + fy);
            else if (__builtin_add_overflow(x, y, &r))
                goto overflow;
            else
                *out = tv_int(r);
            return 0;
        case B_SUB:
            if (fl)
                *out = tv_float(fx - fy);
            else if (__builtin_sub_overflow(x, y, &r))
                goto overflow;
            else
                *out = tv_int(r);
            return 0;
        case B_MUL:
            if (fl)
                *out = tv_float(fx * fy);
            else if (__builtin_mul_overflow(x, y, &r))
                goto overflow;
            else
                *out = tv_int(r);
            return 0;
        case B_DIV:
            if (fy == 0)
                return tmpl_err(c, at, CAIRN_EFORMAT, "division by zero");
            *out = tv_float(fx / fy);
            return 0;
        case B_FLOORDIV:
        case B_MOD:
            if (fl ? fy == 0 : y == 0)
                return tmpl_err(c, at, CAIRN_EFORMAT, op == B_MOD ? "modulo by zero" : "division by zero");
            if (fl) {
                *out = tv_float(op == B_MOD ? py_fmod(fx, fy) : py_floordiv(fx, fy));
            } else {
                if (x == INT64_MIN && y == -1)
                    goto overflow;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q -= 1;
                    m += y;
                }
                *out = tv_int(op == B_MOD ? m : q);
            }
            return 0;
        case B_POW:
            if (!fl && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc))
                            goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base))
                        goto overflow;
                }
                *out = tv_int(acc);
                return 0;
            }
            if (fx == 0 && fy < 0)
                return tmpl_err(c, at, CAIRN_EFORMAT, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy))
                return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "complex numbers are not supported");
            *out = tv_float(pow(fx, fy));
            if (isinf(out->u.d) && isfinite(fx) && isfinite(fy))
                return tmpl_err(c, at, CAIRN_EFORMAT, "(34, 'Numerical result out of range')");
            return 0;
        }
    }
    switch (op) {
    case B_ADD:
        if (a->t == TV_STR && b->t == TV_STR) {
            bool ma = a->f & TVF_MARKUP, mb = b->f & TVF_MARKUP;
            if (ma != mb) {  /* Markup + str escapes the str */
                struct tv ea, eb;
                int rc;
                if ((rc = tmpl_html_escape(c, a, &ea)) || (rc = tmpl_html_escape(c, b, &eb)))
                    return rc;
                if ((rc = concat_str(c, at, &ea, &eb, out)))
                    return rc;
                out->f = TVF_MARKUP;
                return 0;
            }
            int rc = concat_str(c, at, a, b, out);
            if (!rc)
                out->f = a->f & TVF_MARKUP;
            return rc;
        }
        if ((a->t == TV_LIST || a->t == TV_TUPLE) && a->t == b->t) {
            struct tlist *r = tmpl_list_new(c, a->u.l->n + b->u.l->n);
            if (!r)
                return tmpl_oom(c, at);
            tmpl_copy(r->v, a->u.l->v, a->u.l->n * sizeof *r->v);
            if (b->u.l->n) /* r->v is NULL when both are empty */
                tmpl_copy(r->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof *r->v);
            r->n = a->u.l->n + b->u.l->n;
            out->t = a->t;
            out->f = 0;
            out->u.l = r;
            return 0;
        }
        if (a->t == TV_STR && b->t != TV_UNDEF)
            return tmpl_err(c, at, CAIRN_EFORMAT, "can only concatenate str (not \"%s\") to str", tmpl_type_name(b));
        if (a->t == TV_LIST && b->t != TV_UNDEF)
            return tmpl_err(c, at, CAIRN_EFORMAT, "can only concatenate list (not \"%s\") to list", tmpl_type_name(b));
        break;
    case B_MUL:
        if ((a->t == TV_STR || a->t == TV_LIST || a->t == TV_TUPLE) && tv_is_intlike(b))
            return repeat(c, at, a, tv_as_int(b), out);
        if ((b->t == TV_STR || b->t == TV_LIST || b->t == TV_TUPLE) && tv_is_intlike(a))
            return repeat(c, at, b, tv_as_int(a), out);
        break;
    case B_MOD:
        if (a->t == TV_STR)
            return tmpl_percent_format(c, at, a, b, out);
        break;
    default:
        break;
    }
    return type_err2(c, at, op >= 0 && op <= B_POW ? names[op] : "?", a, b);
overflow:
    return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "integer overflow: results beyond 64 bits are not supported");
}

/* ---- iteration, membership, length ---- */

int tmpl_iterate(struct tctx *c, const struct tnode *at, const struct tv *v, struct tlist **out)
{
    switch (v->t) {
    case TV_LIST:
    case TV_TUPLE:
        *out = v->u.l;  /* lists never change once built (the sandbox forbids it) */
        return 0;
    case TV_DICT: {
        struct tlist *l = tmpl_list_new(c, v->u.m->n);
        if (!l)
            return tmpl_oom(c, at);
        if (v->u.m->n)
            tmpl_copy(l->v, v->u.m->k, v->u.m->n * sizeof *l->v);
        l->n = v->u.m->n;
        *out = l;
        return 0;
    }
    case TV_STR: {
        size_t ncp = tmpl_cp_count(v->u.s.p, v->u.s.n);
        struct tlist *l = tmpl_list_new(c, ncp);
        if (!l)
            return tmpl_oom(c, at);
        size_t i = 0, k = 0;
        while (i < v->u.s.n) {
            size_t e = i + 1;
            while (e < v->u.s.n && ((unsigned char)v->u.s.p[e] & 0xC0) == 0x80)
                e++;
            l->v[k++] = tv_str(v->u.s.p + i, e - i);  /* iterating a Markup gives plain str */
            i = e;
        }
        l->n = k;
        *out = l;
        return 0;
    }
    case TV_ITER: {
        struct titer *it = v->u.it;
        size_t pos = it->kind == TI_GEN || it->kind == TI_REVERSE ? it->pos : 0;
        size_t n = it->l->n - pos;
        struct tlist *l = tmpl_list_new(c, n);
        if (!l)
            return tmpl_oom(c, at);
        if (n)
            tmpl_copy(l->v, it->l->v + pos, n * sizeof *l->v);
        l->n = n;
        if (it->kind == TI_GEN || it->kind == TI_REVERSE)
            it->pos = it->l->n;
        *out = l;
        return 0;
    }
    case TV_UNDEF:
        if (!(*out = tmpl_list_new(c, 0)))
            return tmpl_oom(c, at);
        return 0;
    case TV_LOOP:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "iterating over a loop object is not supported");
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object is not iterable", tmpl_type_name(v));
    }
}

int tmpl_contains(struct tctx *c, const struct tnode *at, const struct tv *hay, const struct tv *needle, bool *res)
{
    *res = false;
    int charged = tmpl_charge(c, at, hay, needle, 1);
    if (charged)
        return charged;
    switch (hay->t) {
    case TV_STR:
        if (needle->t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "'in <string>' requires string as left operand, not %s",
                            tmpl_type_name(needle));
        if (!needle->u.s.n)
            *res = true;
        else if (needle->u.s.n <= hay->u.s.n)
            *res = memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
        return 0;
    case TV_LIST:
    case TV_TUPLE:
        for (size_t i = 0; i < hay->u.l->n && !*res; i++)
            *res = tmpl_equal(&hay->u.l->v[i], needle);
        return 0;
    case TV_DICT:
        if (!tmpl_hashable(needle))
            return tmpl_err(c, at, CAIRN_EFORMAT, "unhashable type: '%s'", tmpl_type_name(needle));
        *res = tmpl_dict_find(hay->u.m, needle) >= 0;
        return 0;
    case TV_ITER: {
        struct titer *it = hay->u.it;
        if (it->kind == TI_GEN || it->kind == TI_REVERSE) {
            while (it->pos < it->l->n && !*res)
                *res = tmpl_equal(&it->l->v[it->pos++], needle);
        } else {
            for (size_t i = 0; i < it->l->n && !*res; i++)
                *res = tmpl_equal(&it->l->v[i], needle);
        }
        return 0;
    }
    case TV_UNDEF:
        return 0;
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "argument of type '%s' is not iterable", tmpl_type_name(hay));
    }
}

int tmpl_len(struct tctx *c, const struct tnode *at, const struct tv *v, int64_t *out)
{
    switch (v->t) {
    case TV_STR: *out = (int64_t)tmpl_cp_count(v->u.s.p, v->u.s.n); return 0;
    case TV_LIST:
    case TV_TUPLE: *out = (int64_t)v->u.l->n; return 0;
    case TV_DICT: *out = (int64_t)v->u.m->n; return 0;
    case TV_UNDEF: *out = 0; return 0;
    case TV_LOOP: *out = (int64_t)v->u.lp->items->n; return 0;
    case TV_ITER:
        if (v->u.it->kind != TI_GEN && v->u.it->kind != TI_REVERSE) {
            *out = (int64_t)v->u.it->l->n;
            return 0;
        }
        /* fall through */
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "object of type '%s' has no len()", tmpl_type_name(v));
    }
}
