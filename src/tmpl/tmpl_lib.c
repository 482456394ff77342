/* The template library's shared parts: argument binding, the helpers filters and
 * methods build their results with, and jinja2's builtin tests. The filters are in
 * tmpl_filter.c; global functions and methods in tmpl_func.c. */
#include "tmpl/tmpl_lib.h"

#include "base/err.h"

int tmpl_bind(struct tctx *c, const struct tnode *at, const char *fname, const char *const *names, size_t np,
              const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw, struct tv *slots)
{
    for (size_t i = 0; i < np; i++)
        slots[i] = tv_missing();
    if (nargs > np)
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s() takes at most %zu argument(s) (%zu given)", fname, np, nargs);
    for (size_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (tmpl_name_eq(names[i], kw[k].name, kw[k].n))
                break;
        if (i == np)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() got an unexpected keyword argument '%.*s'", fname,
                            (int)kw[k].n, kw[k].name);
        if (slots[i].t != TV_MISSING)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() got multiple values for argument '%s'", fname, names[i]);
        slots[i] = kw[k].v;
    }
    return 0;
}

/* ---- helpers ---- */

int tmpl_lib_iter(struct tctx *c, const struct tnode *at, struct tlist *l, int kind, struct tv *out)
{
    struct titer *it = tmpl_alloc(&c->ar, sizeof *it);
    if (!it)
        return tmpl_oom(c, at);
    it->kind = (uint8_t)kind;
    it->l = l;
    out->t = TV_ITER;
    out->f = 0;
    out->u.it = it;
    return 0;
}

int tmpl_lib_list(struct tctx *c, const struct tnode *at, size_t cap, struct tlist **l)
{
    if (!(*l = tmpl_list_new(c, cap)))
        return tmpl_oom(c, at);
    return 0;
}

int tmpl_lib_push(struct tctx *c, const struct tnode *at, struct tlist *l, struct tv v)
{
    int rc = tmpl_list_push(c, l, v);
    return rc ? (rc == CAIRN_EFULL ? tmpl_err(c, at, rc, "list too long") : tmpl_oom(c, at)) : 0;
}

int tmpl_lib_pair(struct tctx *c, const struct tnode *at, struct tv a, struct tv b, struct tv *out)
{
    struct tlist *l;
    int rc = tmpl_lib_list(c, at, 2, &l);
    if (rc)
        return rc;
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    *out = tv_list(l, TV_TUPLE);
    return 0;
}

/* ---- tests ---- */

enum {
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE, T_BOOLEAN, T_FALSE,
    T_TRUE, T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER, T_SEQUENCE, T_ITERABLE,
    T_CALLABLE, T_SAMEAS, T_ESCAPED, T_IN, T_EQ, T_NE, T_GT, T_GE, T_LT, T_LE,
};

static const struct { const char *name; int id; } test_names[] = {
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED}, {"filter", T_FILTER}, {"test", T_TEST}, {"none", T_NONE},
    {"boolean", T_BOOLEAN}, {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER}, {"float", T_FLOAT},
    {"lower", T_LOWER}, {"upper", T_UPPER}, {"string", T_STRING}, {"mapping", T_MAPPING}, {"number", T_NUMBER},
    {"sequence", T_SEQUENCE}, {"iterable", T_ITERABLE}, {"callable", T_CALLABLE}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"in", T_IN}, {"==", T_EQ}, {"eq", T_EQ}, {"equalto", T_EQ}, {"!=", T_NE},
    {"ne", T_NE}, {">", T_GT}, {"gt", T_GT}, {"greaterthan", T_GT}, {">=", T_GE}, {"ge", T_GE}, {"<", T_LT},
    {"lt", T_LT}, {"lessthan", T_LT}, {"<=", T_LE}, {"le", T_LE},
};

int tmpl_test_id(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
        if (tmpl_name_eq(test_names[i].name, name, n))
            return test_names[i].id;
    return TMPL_ID_UNKNOWN;
}

/* every filter jinja2 has, supported here or not: the `filter` test's answer */
static const char *const filters_all_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "join", "last",
    "length", "list", "lower", "items", "map", "min", "max", "pprint", "random", "reject", "rejectattr",
    "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags",
    "sum", "title", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap",
    "xmlattr", "tojson",
};

static bool sameas(const struct tv *a, const struct tv *b)
{
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case TV_NONE:
    case TV_UNDEF: return a->t == TV_NONE;
    case TV_BOOL: return a->u.b == b->u.b;
    case TV_INT: return a->u.i == b->u.i && a->u.i >= -5 && a->u.i <= 256;
    case TV_STR: return a->u.s.p == b->u.s.p && a->u.s.n == b->u.s.n;
    case TV_FLOAT: return false;
    default: return tmpl_equal(a, b) && a->u.l == b->u.l;
    }
}

int tmpl_apply_test(struct tctx *c, const struct tnode *at, int id, const struct tv *in, const struct tv *args,
                    size_t nargs, const struct tkw *kw, size_t nkw, bool *res)
{
    int rc;
    struct tv a[1], r;
    if ((rc = tmpl_charge(c, at, in, args, nargs)))
        return rc;
    if (id <= T_EVEN || id == T_DIVISIBLEBY || id >= T_SAMEAS) {
        static const char *const one[] = {"other"};
        size_t need = id == T_ODD || id == T_EVEN || id == T_ESCAPED ? 0 : 1;
        if ((rc = tmpl_bind(c, at, "test", one, need, args, nargs, kw, nkw, a)))
            return rc;
        if (need && !tv_given(&a[0]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "test takes exactly one argument");
    } else if (nargs || nkw) {
        return tmpl_err(c, at, CAIRN_EFORMAT, "test takes no arguments");
    }
    switch (id) {
    case T_ODD:
    case T_EVEN: {
        struct tv two = tv_int(2);
        if ((rc = tmpl_binop(c, at, B_MOD, in, &two, &r)))
            return rc;
        struct tv want = tv_int(id == T_ODD ? 1 : 0);
        *res = tmpl_equal(&r, &want);
        return 0;
    }
    case T_DIVISIBLEBY: {
        if ((rc = tmpl_binop(c, at, B_MOD, in, &a[0], &r)))
            return rc;
        struct tv zero = tv_int(0);
        *res = tmpl_equal(&r, &zero);
        return 0;
    }
    case T_DEFINED: *res = in->t != TV_UNDEF; return 0;
    case T_UNDEFINED: *res = in->t == TV_UNDEF; return 0;
    case T_FILTER:
    case T_TEST:
        *res = false;
        if (in->t == TV_STR) {
            if (id == T_TEST) {
                *res = tmpl_test_id(in->u.s.p, in->u.s.n) >= 0;
            } else {
                for (size_t i = 0; i < sizeof filters_all_names / sizeof filters_all_names[0] && !*res; i++)
                    *res = tmpl_name_eq(filters_all_names[i], in->u.s.p, in->u.s.n);
            }
        }
        return 0;
    case T_NONE: *res = in->t == TV_NONE; return 0;
    case T_BOOLEAN: *res = in->t == TV_BOOL; return 0;
    case T_FALSE: *res = in->t == TV_BOOL && !in->u.b; return 0;
    case T_TRUE: *res = in->t == TV_BOOL && in->u.b; return 0;
    case T_INTEGER: *res = in->t == TV_INT; return 0;
    case T_FLOAT: *res = in->t == TV_FLOAT; return 0;
    case T_LOWER:
    case T_UPPER: {
        struct tv s;
        if ((rc = tmpl_str_of(c, at, in, &s)))
            return rc;
        *res = id == T_LOWER ? tmpl_str_islower(c, &s) : tmpl_str_isupper(c, &s);
        return 0;
    }
    case T_STRING: *res = in->t == TV_STR; return 0;
    case T_MAPPING: *res = in->t == TV_DICT; return 0;
    case T_NUMBER: *res = tv_is_num(in); return 0;
    case T_SEQUENCE:
        *res = in->t == TV_STR || in->t == TV_LIST || in->t == TV_TUPLE || in->t == TV_DICT || in->t == TV_UNDEF;
        return 0;
    case T_ITERABLE:
        *res = in->t == TV_STR || in->t == TV_LIST || in->t == TV_TUPLE || in->t == TV_DICT || in->t == TV_UNDEF ||
               in->t == TV_ITER || in->t == TV_LOOP;
        return 0;
    case T_CALLABLE:
        *res = in->t == TV_MACRO || in->t == TV_FUNC || in->t == TV_UNDEF || in->t == TV_LOOP;
        return 0;
    case T_SAMEAS: *res = sameas(in, &a[0]); return 0;
    case T_ESCAPED: *res = in->t == TV_STR && (in->f & TVF_MARKUP); return 0;
    case T_IN: return tmpl_contains(c, at, &a[0], in, res);
    case T_EQ: *res = tmpl_equal(in, &a[0]); return 0;
    case T_NE: *res = !tmpl_equal(in, &a[0]); return 0;
    default: {
        int ord;
        if ((rc = tmpl_compare(c, at, in, &a[0], &ord)))
            return rc;
        *res = id == T_GT ? ord > 0 : id == T_GE ? ord >= 0 : id == T_LT ? ord < 0 : ord <= 0;
        return 0;
    }
    }
}
