/* Template evaluator: walks the tree with jinja2's runtime semantics in the immutable
 * sandbox. Scopes: the template's top level is one frame; each for-loop iteration,
 * macro call, {% with %} and {% generation %} body gets a frame whose parent is where
 * it was written, so `set` inside a loop does not leak out (hence namespace()).
 * Operations on values (attributes, items, operators, iteration) are in tmpl_ops.c. */
#define _GNU_SOURCE
#include "tmpl/tmpl_int.h"

#include "base/clock.h"
#include "base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---- */

int tmpl_err(struct tctx *c, const struct tnode *at, int code, const char *fmt, ...)
{
    if (c->err_set || !c->err || !c->errlen)
        return code;
    c->err_set = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        snprintf(c->err, c->errlen, "line %u: %s", at->line, msg);
    else
        snprintf(c->err, c->errlen, "%s", msg);
    return code;
}

int tmpl_oom(struct tctx *c, const struct tnode *at)
{
    if (c->ar.over)
        return tmpl_err(c, at, CAIRN_EFULL, "template used more than %zu bytes of memory", c->ar.limit);
    return tmpl_err(c, at, CAIRN_ENOMEM, "out of memory");
}

static const char *obj_repr_name(int t)
{
    switch (t) {
    case TV_DICT: return "dict object";
    case TV_LIST: return "list object";
    case TV_TUPLE: return "tuple object";
    case TV_STR: return "str object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_BOOL: return "bool object";
    case TV_NS: return "jinja2.utils.Namespace object";
    case TV_LOOP: return "jinja2.runtime.LoopContext object";
    case TV_MACRO: return "jinja2.runtime.Macro object";
    case TV_ITER: return "generator object";
    default: return "object";
    }
}

int tmpl_undef_err(struct tctx *c, const struct tnode *at, const struct tv *u)
{
    int n = (int)(u->u.s.n > 200 ? 200 : u->u.s.n);
    switch (u->f) {
    case TU_NAME:
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%.*s' is undefined", n, u->u.s.p);
    case TU_ATTR:
        if (u->ot == TV_NONE)
            return tmpl_err(c, at, CAIRN_EFORMAT, "'None' has no attribute '%.*s'", n, u->u.s.p);
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' has no attribute '%.*s'", obj_repr_name(u->ot), n, u->u.s.p);
    case TU_ELEM:
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s has no element %lld", obj_repr_name(u->ot), (long long)u->u.i);
    case TU_UNSAFE:
        return tmpl_err(c, at, CAIRN_EFORMAT, "access to attribute '%.*s' of '%s' object is unsafe.", n,
                        u->u.s.p, tmpl_type_name_of(u->ot));
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "%.*s", n, u->u.s.p ? u->u.s.p : "undefined value");
    }
}

int tmpl_step(struct tctx *c, const struct tnode *at)
{
    if (++c->steps > c->max_steps)
        return tmpl_err(c, at, CAIRN_EFULL, "template ran more than %llu steps", (unsigned long long)c->max_steps);
    if (c->steps >= c->next_clock) {
        c->next_clock = c->steps + TMPL_CLOCK_EVERY;
        if (clock_ns() - c->t0_ns > c->max_ns)
            return tmpl_err(c, at, CAIRN_EFULL, "template ran longer than %lld ms", (long long)(c->max_ns / 1000000));
    }
    return 0;
}

/* What a builtin may touch of v: a string's bytes, a list's or a dict's entries. */
static uint64_t weight(const struct tv *v)
{
    switch (v->t) {
    case TV_STR: return v->u.s.n;
    case TV_LIST:
    case TV_TUPLE: return v->u.l->n;
    case TV_DICT: return v->u.m->n;
    default: return 0;
    }
}

int tmpl_charge(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *args, size_t nargs)
{
    uint64_t w = in ? weight(in) : 0;
    for (size_t i = 0; i < nargs; i++)
        w += weight(&args[i]);
    c->steps += w / TMPL_UNITS_PER_STEP;
    return tmpl_step(c, at);
}

/* ---- frames ---- */

static struct tframe *frame_new(struct tctx *c, struct tframe *parent)
{
    struct tframe *f = tmpl_alloc(&c->ar, sizeof *f);
    if (f)
        f->parent = parent;
    return f;
}

static uint32_t sym_slot(uint32_t sym, uint32_t mask) { return (sym * 2654435761u) & mask; }

/* Position of sym's binding in f, or -1. */
static long frame_find(const struct tframe *f, uint32_t sym)
{
    if (f->idx) {
        uint32_t mask = f->idxcap - 1;
        for (uint32_t h = sym_slot(sym, mask);; h = (h + 1) & mask) {
            uint32_t e = f->idx[h];
            if (!e)
                return -1;
            if (f->b[e - 1].sym == sym)
                return (long)(e - 1);
        }
    }
    for (uint32_t i = 0; i < f->n; i++)
        if (f->b[i].sym == sym)
            return (long)i;
    return -1;
}

static void frame_index(struct tctx *c, struct tframe *f)
{
    uint32_t cap = 64;
    while (cap < f->cap * 2)
        cap *= 2;
    uint32_t *idx = tmpl_alloc(&c->ar, cap * sizeof *idx);
    f->idx = idx;  /* NULL: lookups scan */
    f->idxcap = idx ? cap : 0;
    for (uint32_t i = 0; idx && i < f->n; i++) {
        uint32_t h = sym_slot(f->b[i].sym, cap - 1);
        while (idx[h])
            h = (h + 1) & (cap - 1);
        idx[h] = i + 1;
    }
}

/* Clears a frame for reuse (one per loop iteration). */
static void frame_clear(struct tframe *f)
{
    if (f->idx)
        memset(f->idx, 0, f->idxcap * sizeof *f->idx);
    f->n = 0;
}

static int frame_set(struct tctx *c, struct tframe *f, uint32_t sym, struct tv v)
{
    long i = frame_find(f, sym);
    if (i >= 0) {
        f->b[i].v = v;
        return 0;
    }
    if (f->n == f->cap) {
        uint32_t cap = f->cap ? f->cap * 2 : 8;
        struct tbind *b = tmpl_alloc(&c->ar, cap * sizeof *b);
        if (!b)
            return tmpl_oom(c, NULL);
        if (f->n)
            tmpl_copy(b, f->b, f->n * sizeof *b);
        f->b = b;
        f->cap = cap;
        if (cap > TMPL_INDEX_MIN) {
            f->b[f->n].sym = sym;
            f->b[f->n].v = v;
            f->n++;
            frame_index(c, f);
            return 0;
        }
    }
    f->b[f->n].sym = sym;
    f->b[f->n].v = v;
    if (f->idx) {
        uint32_t h = sym_slot(sym, f->idxcap - 1);
        while (f->idx[h])
            h = (h + 1) & (f->idxcap - 1);
        f->idx[h] = f->n + 1;
    }
    f->n++;
    return 0;
}

/* Binds the names a frame starts with as undefined (see struct tscope). */
static int frame_undef(struct tctx *c, struct tframe *f, const uint32_t *syms, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = syms[i];
        int rc = frame_set(c, f, s, tv_undef_attr(0, c->t->syms[s].p, c->t->syms[s].n, TU_NAME));
        if (rc)
            return rc;
    }
    return 0;
}

static int scope_undef(struct tctx *c, struct tframe *f, const struct tnode *n)
{
    return n->scope ? frame_undef(c, f, n->scope->undef, n->scope->nundef) : 0;
}

static int lookup(struct tctx *c, struct tframe *f, uint32_t sym, struct tv *out)
{
    for (; f; f = f->parent) {
        long i = frame_find(f, sym);
        if (i >= 0) {
            *out = f->b[i].v;
            return 0;
        }
    }
    struct tgvar *g = &c->g[sym];
    if (g->state == 1) {
        int rc = tmpl_from_json(c, g->j, &g->v, 0);
        if (rc)
            return rc == CAIRN_ENOMEM ? tmpl_oom(c, NULL) : rc;
        g->state = 2;
    }
    if (g->state == 2) {
        *out = g->v;
        return 0;
    }
    int fid = tmpl_global_func((int)sym);
    if (fid >= 0) {
        struct tfunc *fn = tmpl_alloc(&c->ar, sizeof *fn);
        if (!fn)
            return tmpl_oom(c, NULL);
        fn->id = fid;
        out->t = TV_FUNC;
        out->f = 0;
        out->u.fn = fn;
        return 0;
    }
    *out = tv_undef_attr(0, c->t->syms[sym].p, c->t->syms[sym].n, TU_NAME);
    return 0;
}

/* ---- evaluation ---- */

static int eval(struct tctx *c, struct tframe *f, const struct tnode *n, struct tv *out);
static int exec_body(struct tctx *c, struct tframe *f, const struct nvec *body);

static int call_macro(struct tctx *c, const struct tnode *at, const struct tmacro *m, const struct tv *args,
                      size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    const struct tnode *def = m->def;
    const struct nvec *params = &def->w;
    struct tframe *mf = frame_new(c, m->closure);
    if (!mf)
        return tmpl_oom(c, at);
    int rc;
    if ((rc = scope_undef(c, mf, def)))
        return rc;
    size_t np = params->n;
    bool *used = nkw ? tmpl_alloc(&c->ar, nkw) : NULL;
    if (nkw && !used)
        return tmpl_oom(c, at);
    uint8_t *given = np ? tmpl_alloc(&c->ar, np) : NULL;
    if (np && !given)
        return tmpl_oom(c, at);
    /* every parameter is a local from the start (missing ones read as undefined) */
    for (size_t i = 0; i < np; i++) {
        const struct tnode *p = params->v[i];
        struct tv v = tv_undef_attr(0, p->s, p->sn, TU_NAME);
        if (i < nargs) {
            v = args[i];
            given[i] = 1;
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (!used[k] && kw[k].n == p->sn && !memcmp(kw[k].name, p->s, p->sn)) {
                    v = kw[k].v;
                    used[k] = true;
                    given[i] = 1;
                    break;
                }
        }
        if ((rc = frame_set(c, mf, (uint32_t)p->id, v)))
            return rc;
    }
    if (def->flags & NF_USES_CALLER) {
        struct tv cv = tv_undef_hint("No caller defined");
        for (size_t k = 0; k < nkw; k++)
            if (!used[k] && kw[k].n == 6 && !memcmp(kw[k].name, "caller", 6)) {
                cv = kw[k].v;
                used[k] = true;
            }
        if ((rc = frame_set(c, mf, SYM_CALLER, cv)))
            return rc;
    }
    if (def->flags & NF_USES_KWARGS) {
        struct tdict *d = tmpl_dict_new(c, 0);
        if (!d)
            return tmpl_oom(c, at);
        for (size_t k = 0; k < nkw; k++)
            if (!used[k]) {
                used[k] = true;
                if ((rc = tmpl_dict_set(c, d, tv_str(kw[k].name, kw[k].n), kw[k].v)))
                    return tmpl_oom(c, at);
            }
        struct tv dv = {.t = TV_DICT};
        dv.u.m = d;
        if ((rc = frame_set(c, mf, SYM_KWARGS, dv)))
            return rc;
    } else {
        for (size_t k = 0; k < nkw; k++)
            if (!used[k]) {
                if (kw[k].n == 6 && !memcmp(kw[k].name, "caller", 6))
                    return tmpl_err(c, at, CAIRN_EFORMAT,
                                    "macro '%.*s' was invoked with two values for the special caller argument",
                                    (int)m->namelen, m->name);
                return tmpl_err(c, at, CAIRN_EFORMAT, "macro '%.*s' takes no keyword argument '%.*s'",
                                (int)m->namelen, m->name, (int)kw[k].n, kw[k].name);
            }
    }
    if (def->flags & NF_USES_VARARGS) {
        size_t extra = nargs > np ? nargs - np : 0;
        struct tlist *l = tmpl_list_new(c, extra);
        if (!l)
            return tmpl_oom(c, at);
        for (size_t i = 0; i < extra; i++)
            l->v[i] = args[np + i];
        l->n = extra;
        struct tv lv = {.t = TV_TUPLE};
        lv.u.l = l;
        if ((rc = frame_set(c, mf, SYM_VARARGS, lv)))
            return rc;
    } else if (nargs > np) {
        return tmpl_err(c, at, CAIRN_EFORMAT, "macro '%.*s' takes not more than %zu argument(s)",
                        (int)m->namelen, m->name, np);
    }
    for (size_t i = 0; i < np; i++) {
        if (given[i])
            continue;
        const struct tnode *p = params->v[i];
        struct tv v;
        if (p->a) {
            if ((rc = eval(c, mf, p->a, &v)))
                return rc;
        } else {
            struct tsb hb;
            tmpl_sb_init(&hb, c);
            tmpl_sb_printf(&hb, "parameter '%.*s' was not provided", (int)(p->sn > 100 ? 100 : p->sn), p->s);
            if ((rc = tmpl_sb_to_str(c, &hb, &v)))
                return rc;
            v = tv_undef_hint(v.u.s.p);
        }
        if ((rc = frame_set(c, mf, (uint32_t)p->id, v)))
            return rc;
    }
    if (c->macro_depth >= c->max_depth)
        return tmpl_err(c, at, CAIRN_EFULL, "macro calls nested more than %d levels (runaway recursion?)", c->max_depth);
    struct tsb buf, *saved = c->out;
    tmpl_sb_init(&buf, c);
    c->out = &buf;
    c->macro_depth++;
    rc = exec_body(c, mf, &def->v);
    c->macro_depth--;
    c->out = saved;
    if (rc) {
        tmpl_sb_free(&buf);
        return rc < 0 ? rc : tmpl_err(c, at, CAIRN_EFORMAT, "loop control outside a loop");
    }
    return tmpl_sb_to_str(c, &buf, out);
}

int tmpl_call(struct tctx *c, const struct tnode *at, const struct tv *fn, const struct tv *args, size_t nargs,
              const struct tkw *kw, size_t nkw, struct tv *out)
{
    switch (fn->t) {
    case TV_MACRO:
        return call_macro(c, at, fn->u.mac, args, nargs, kw, nkw, out);
    case TV_FUNC:
        return tmpl_call_builtin(c, at, fn->u.fn, args, nargs, kw, nkw, out);
    case TV_UNDEF:
        return tmpl_undef_err(c, at, fn);
    case TV_LOOP:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "recursive loops are not supported");
    default:
        return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object is not callable", tmpl_type_name(fn));
    }
}

#define MAX_ARGS 16

struct argv {
    struct tv pos[MAX_ARGS];
    struct tkw kw[MAX_ARGS];
    size_t npos, nkw;
};

static int eval_args(struct tctx *c, struct tframe *f, const struct tnode *n, struct argv *a)
{
    if (n->v.n > MAX_ARGS || n->w.n + 1 > MAX_ARGS)
        return tmpl_err(c, n, CAIRN_EUNSUPPORTED, "more than %d arguments in a call", MAX_ARGS);
    int rc;
    a->npos = n->v.n;
    a->nkw = n->w.n;
    for (uint32_t i = 0; i < n->v.n; i++)
        if ((rc = eval(c, f, n->v.v[i], &a->pos[i])))
            return rc;
    for (uint32_t i = 0; i < n->w.n; i++) {
        a->kw[i].name = n->w.v[i]->s;
        a->kw[i].n = n->w.v[i]->sn;
        if ((rc = eval(c, f, n->w.v[i]->a, &a->kw[i].v)))
            return rc;
    }
    return 0;
}

static int eval_compare(struct tctx *c, struct tframe *f, const struct tnode *n, struct tv *out)
{
    struct tv left, right;
    int rc;
    if ((rc = eval(c, f, n->a, &left)))
        return rc;
    for (uint32_t i = 0; i < n->v.n; i++) {
        const struct tnode *o = n->v.v[i];
        if ((rc = eval(c, f, o->a, &right)))
            return rc;
        bool r;
        int ord;
        switch (o->op) {
        case C_EQ: r = tmpl_equal(&left, &right); break;
        case C_NE: r = !tmpl_equal(&left, &right); break;
        case C_IN:
        case C_NOTIN:
            if ((rc = tmpl_contains(c, o, &right, &left, &r)))
                return rc;
            if (o->op == C_NOTIN)
                r = !r;
            break;
        default:
            if ((rc = tmpl_compare(c, o, &left, &right, &ord)))
                return rc;
            if (tv_is_num(&left) && tv_is_num(&right) && (isnan(tv_as_float(&left)) || isnan(tv_as_float(&right))))
                r = false;
            else
                r = o->op == C_LT ? ord < 0 : o->op == C_LE ? ord <= 0 : o->op == C_GT ? ord > 0 : ord >= 0;
            break;
        }
        if (!r) {
            *out = tv_bool(false);
            return 0;
        }
        left = right;
    }
    *out = tv_bool(true);
    return 0;
}

/* Calls, filters and tests: kept out of eval_inner so its stack frame stays small. */
static __attribute__((noinline)) int eval_call(struct tctx *c, struct tframe *f, const struct tnode *n, struct tv *out)
{
    struct argv av;
    struct tv a;
    int rc;
    if (n->a) {
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
    } else {
        a = c->filter_input;
    }
    if ((rc = eval_args(c, f, n, &av)))
        return rc;
    if (n->kind == N_CALL)
        return tmpl_call(c, n, &a, av.pos, av.npos, av.kw, av.nkw, out);
    if (n->flags & NF_UNKNOWN)
        return tmpl_err(c, n, CAIRN_EFORMAT, "No %s named '%.*s' found.", n->kind == N_FILTER ? "filter" : "test",
                        (int)n->sn, n->s);
    if (n->kind == N_FILTER)
        return tmpl_apply_filter(c, n, n->id, &a, av.pos, av.npos, av.kw, av.nkw, out);
    bool r;
    if ((rc = tmpl_apply_test(c, n, n->id, &a, av.pos, av.npos, av.kw, av.nkw, &r)))
        return rc;
    *out = tv_bool(r);
    return 0;
}

static int eval_inner(struct tctx *c, struct tframe *f, const struct tnode *n, struct tv *out)
{
    int rc;
    struct tv a, b;
    switch (n->kind) {
    case N_CONST:
        *out = n->k;
        return 0;
    case N_NAME:
        return lookup(c, f, (uint32_t)n->id, out);
    case N_GETATTR:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        return tmpl_getattr(c, n, &a, n->s, n->sn, out);
    case N_GETITEM:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        if (n->b->kind == N_SLICE) {
            struct tv parts[3] = {tv_none(), tv_none(), tv_none()};
            const struct tnode *ps[3] = {n->b->a, n->b->b, n->b->c};
            for (int i = 0; i < 3; i++)
                if (ps[i] && (rc = eval(c, f, ps[i], &parts[i])))
                    return rc;
            if (a.t == TV_UNDEF)
                return tmpl_undef_err(c, n, &a);
            return tmpl_slice(c, n, &a, parts, out);
        }
        if ((rc = eval(c, f, n->b, &b)))
            return rc;
        return tmpl_getitem(c, n, &a, &b, out);
    case N_CALL:
    case N_FILTER:
    case N_TEST:
        return eval_call(c, f, n, out);
    case N_NOT:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        *out = tv_bool(!tmpl_truthy(&a));
        return 0;
    case N_NEG:
    case N_POS:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        if (a.t == TV_FLOAT) {
            *out = tv_float(n->kind == N_NEG ? -a.u.d : a.u.d);
            return 0;
        }
        if (tv_is_intlike(&a)) {
            int64_t x = tv_as_int(&a);
            if (n->kind == N_NEG && x == INT64_MIN)
                return tmpl_err(c, n, CAIRN_EUNSUPPORTED, "integer overflow");
            *out = tv_int(n->kind == N_NEG ? -x : x);
            return 0;
        }
        if (a.t == TV_UNDEF)
            return tmpl_undef_err(c, n, &a);
        return tmpl_err(c, n, CAIRN_EFORMAT, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+',
                        tmpl_type_name(&a));
    case N_BIN:
        if ((rc = eval(c, f, n->a, &a)) || (rc = eval(c, f, n->b, &b)))
            return rc;
        if (n->op == B_POW && tv_is_num(&a) && tv_as_float(&a) < 0 && !(a.t == TV_INT && a.u.i == INT64_MIN) &&
            tmpl_const_expr(n->a) && !tmpl_const_expr(n->b)) {
            /* jinja2 folds a constant base to a literal like "-2" and emits "-2 ** x",
             * which Python reads as -(2 ** x) */
            struct tv pos = a.t == TV_FLOAT ? tv_float(-a.u.d) : tv_int(-tv_as_int(&a)), r;
            if ((rc = tmpl_binop(c, n, B_POW, &pos, &b, &r)))
                return rc;
            *out = r.t == TV_FLOAT ? tv_float(-r.u.d) : tv_int(-r.u.i);
            return 0;
        }
        return tmpl_binop(c, n, n->op, &a, &b, out);
    case N_CONCAT: {
        struct tsb sb;
        tmpl_sb_init(&sb, c);
        for (uint32_t i = 0; i < n->v.n; i++) {
            if ((rc = eval(c, f, n->v.v[i], &a)) || (rc = tmpl_to_str(c, n, &sb, &a))) {
                tmpl_sb_free(&sb);
                return rc;
            }
        }
        return tmpl_sb_to_str(c, &sb, out);
    }
    case N_COMPARE:
        return eval_compare(c, f, n, out);
    case N_AND:
    case N_OR:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        if (tmpl_truthy(&a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        return eval(c, f, n->b, out);
    case N_COND:
        if ((rc = eval(c, f, n->a, &a)))
            return rc;
        if (tmpl_truthy(&a))
            return eval(c, f, n->b, out);
        if (n->c)
            return eval(c, f, n->c, out);
        *out = tv_undef_hint("the inline if-expression evaluated to false and no else section was defined.");
        return 0;
    case N_LIST:
    case N_TUPLE: {
        struct tlist *l = tmpl_list_new(c, n->v.n);
        if (!l)
            return tmpl_oom(c, n);
        for (uint32_t i = 0; i < n->v.n; i++)
            if ((rc = eval(c, f, n->v.v[i], &l->v[i])))
                return rc;
        l->n = n->v.n;
        out->t = n->kind == N_LIST ? TV_LIST : TV_TUPLE;
        out->f = 0;
        out->u.l = l;
        return 0;
    }
    case N_DICT: {
        struct tdict *d = tmpl_dict_new(c, n->v.n);
        if (!d)
            return tmpl_oom(c, n);
        for (uint32_t i = 0; i < n->v.n; i++) {
            if ((rc = eval(c, f, n->v.v[i]->a, &a)) || (rc = eval(c, f, n->v.v[i]->b, &b)))
                return rc;
            if (!tmpl_hashable(&a))
                return tmpl_err(c, n, CAIRN_EFORMAT, "unhashable type: '%s'", tmpl_type_name(&a));
            if ((rc = tmpl_dict_set(c, d, a, b)))
                return tmpl_oom(c, n);
        }
        out->t = TV_DICT;
        out->f = 0;
        out->u.m = d;
        return 0;
    }
    default:
        return tmpl_err(c, n, CAIRN_EFORMAT, "internal error: not an expression");
    }
}

static int eval(struct tctx *c, struct tframe *f, const struct tnode *n, struct tv *out)
{
    int src = tmpl_step(c, n);
    if (src)
        return src;
    if (++c->depth > TMPL_MAX_NESTING) {
        c->depth--;
        return tmpl_err(c, n, CAIRN_EFULL, "evaluation nested more than %d levels", TMPL_MAX_NESTING);
    }
    int rc = eval_inner(c, f, n, out);
    c->depth--;
    return rc;
}

/* ---- statements ---- */

static int out_fail(struct tctx *c, const struct tnode *at)
{
    if (c->ar.over)
        return tmpl_oom(c, at);
    return tmpl_err(c, at, CAIRN_EFULL, "output over the limit (%zu bytes)", c->max_str);
}

static int out_put(struct tctx *c, const struct tnode *at, const char *p, size_t n)
{
    tmpl_sb_put(c->out, p, n);
    return c->out->fail ? out_fail(c, at) : 0;
}

static int assign(struct tctx *c, struct tframe *f, const struct tnode *target, const struct tv *v)
{
    int rc;
    if (target->kind == N_NAME)
        return frame_set(c, f, (uint32_t)target->id, *v);
    if (target->kind == N_NSREF) {
        struct tv ns;
        if ((rc = lookup(c, f, (uint32_t)target->id, &ns)))
            return rc;
        if (ns.t != TV_NS)
            return tmpl_err(c, target, CAIRN_EFORMAT, "cannot assign attribute on non-namespace object");
        if (tmpl_dict_set(c, ns.u.m, tv_str(target->s, target->sn), *v))
            return tmpl_oom(c, target);
        return 0;
    }
    /* tuple unpacking */
    struct tlist *items;
    if (v->t == TV_UNDEF)
        return tmpl_undef_err(c, target, v);
    if ((rc = tmpl_iterate(c, target, v, &items)))
        return rc;
    if (items->n != target->v.n) {
        if (items->n > target->v.n)
            return tmpl_err(c, target, CAIRN_EFORMAT, "too many values to unpack (expected %u)", target->v.n);
        return tmpl_err(c, target, CAIRN_EFORMAT, "not enough values to unpack (expected %u, got %zu)",
                        target->v.n, items->n);
    }
    for (uint32_t i = 0; i < target->v.n; i++)
        if ((rc = assign(c, f, target->v.v[i], &items->v[i])))
            return rc;
    return 0;
}

/* Runs body with its output captured into a string value. */
static int capture(struct tctx *c, struct tframe *f, const struct nvec *body, struct tv *out)
{
    struct tsb buf, *saved = c->out;
    tmpl_sb_init(&buf, c);
    c->out = &buf;
    int rc = exec_body(c, f, body);
    c->out = saved;
    if (rc) {
        tmpl_sb_free(&buf);
        return rc;
    }
    return tmpl_sb_to_str(c, &buf, out);
}

static int apply_chain(struct tctx *c, struct tframe *f, const struct tnode *chain, const struct tv *in, struct tv *out)
{
    struct tv saved = c->filter_input;
    c->filter_input = *in;
    int rc = eval(c, f, chain, out);
    c->filter_input = saved;
    return rc;
}

static int exec_for(struct tctx *c, struct tframe *f, const struct tnode *n)
{
    struct tv it;
    struct tlist *items;
    int rc;
    if ((rc = eval(c, f, n->b, &it)) || (rc = tmpl_iterate(c, n->b, &it, &items)))
        return rc;
    if (n->c) {
        /* `for x in y if cond`: filter first, so loop.length counts what is visited */
        struct tframe *tf = frame_new(c, f);
        struct tlist *kept = tmpl_list_new(c, items->n);
        if (!tf || !kept)
            return tmpl_oom(c, n);
        for (size_t i = 0; i < items->n; i++) {
            struct tv cond;
            frame_clear(tf);
            if ((rc = assign(c, tf, n->a, &items->v[i])) || (rc = eval(c, tf, n->c, &cond)))
                return rc;
            if (tmpl_truthy(&cond))
                kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    if (!items->n) {
        if (!n->w.n)
            return 0;
        struct tframe *ef = frame_new(c, f);
        if (!ef)
            return tmpl_oom(c, n);
        if (n->scope && (rc = frame_undef(c, ef, n->scope->undef_else, n->scope->nundef_else)))
            return rc;
        return exec_body(c, ef, &n->w);
    }
    struct tframe *lf = frame_new(c, f);
    struct tloop *lp = tmpl_alloc(&c->ar, sizeof *lp);
    if (!lf || !lp)
        return tmpl_oom(c, n);
    lp->items = items;
    struct tv loopv = {.t = TV_LOOP};
    loopv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        if ((rc = tmpl_step(c, n)))
            return rc;
        lp->i0 = (int64_t)i;
        frame_clear(lf);
        if ((rc = frame_set(c, lf, SYM_LOOP, loopv)) || (rc = assign(c, lf, n->a, &items->v[i])) ||
            (rc = scope_undef(c, lf, n)))
            return rc;
        rc = exec_body(c, lf, &n->v);
        if (rc == TMPL_CTL_BREAK)
            break;
        if (rc == TMPL_CTL_CONTINUE)
            continue;
        if (rc)
            return rc;
    }
    return 0;
}

static __attribute__((noinline)) int exec_callblock(struct tctx *c, struct tframe *f, const struct tnode *n)
{
    int rc;
    struct tv v;
    struct tmacro *m = tmpl_alloc(&c->ar, sizeof *m);
    if (!m)
        return tmpl_oom(c, n);
    m->def = n;
    m->closure = f;
    m->name = "caller";
    m->namelen = 6;
    const struct tnode *call = n->a;
    struct argv av;
    struct tv fn;
    if ((rc = eval(c, f, call->a, &fn)) || (rc = eval_args(c, f, call, &av)))
        return rc;
    av.kw[av.nkw].name = "caller";
    av.kw[av.nkw].n = 6;
    av.kw[av.nkw].v.t = TV_MACRO;
    av.kw[av.nkw].v.f = 0;
    av.kw[av.nkw].v.u.mac = m;
    av.nkw++;
    if ((rc = tmpl_call(c, call, &fn, av.pos, av.npos, av.kw, av.nkw, &v)))
        return rc;
    if ((rc = tmpl_to_str(c, n, c->out, &v)))
        return rc;
    return c->out->fail ? out_fail(c, n) : 0;
}

static int exec_stmt_inner(struct tctx *c, struct tframe *f, const struct tnode *n)
{
    int rc;
    struct tv v;
    switch (n->kind) {
    case N_DATA:
        return out_put(c, n, n->s, n->sn);
    case N_OUTPUT:
        if ((rc = eval(c, f, n->a, &v)))
            return rc;
        if (v.t == TV_STR)
            return out_put(c, n, v.u.s.p, v.u.s.n);
        if ((rc = tmpl_to_str(c, n, c->out, &v)))
            return rc;
        if (c->out->fail)
            return out_fail(c, n);
        return 0;
    case N_IF:
        if ((rc = eval(c, f, n->a, &v)))
            return rc;
        return exec_body(c, f, tmpl_truthy(&v) ? &n->v : &n->w);
    case N_FOR:
        return exec_for(c, f, n);
    case N_SET:
        if ((rc = eval(c, f, n->b, &v)))
            return rc;
        return assign(c, f, n->a, &v);
    case N_SETBLOCK: {
        struct tframe *bf = frame_new(c, f);
        if (!bf)
            return tmpl_oom(c, n);
        if ((rc = scope_undef(c, bf, n)) || (rc = capture(c, bf, &n->v, &v)))
            return rc;
        if (n->b) {
            struct tv r;
            if ((rc = apply_chain(c, bf, n->b, &v, &r)))
                return rc;
            v = r;
        }
        return assign(c, f, n->a, &v);
    }
    case N_MACRO: {
        struct tmacro *m = tmpl_alloc(&c->ar, sizeof *m);
        if (!m)
            return tmpl_oom(c, n);
        m->def = n;
        m->closure = f;
        m->name = n->s;
        m->namelen = n->sn;
        v.t = TV_MACRO;
        v.f = 0;
        v.u.mac = m;
        return frame_set(c, f, (uint32_t)n->id, v);
    }
    case N_CALLBLOCK:
        return exec_callblock(c, f, n);
    case N_FILTERBLOCK: {
        struct tframe *bf = frame_new(c, f);
        struct tv r;
        if (!bf)
            return tmpl_oom(c, n);
        if ((rc = scope_undef(c, bf, n)) || (rc = capture(c, bf, &n->v, &v)) ||
            (rc = apply_chain(c, bf, n->a, &v, &r)))
            return rc;
        if ((rc = tmpl_to_str(c, n, c->out, &r)))
            return rc;
        return c->out->fail ? out_fail(c, n) : 0;
    }
    case N_BREAK:
        return TMPL_CTL_BREAK;
    case N_CONTINUE:
        return TMPL_CTL_CONTINUE;
    case N_SCOPE: {
        if (n->flags)
            return exec_body(c, f, &n->v);
        struct tframe *sf = frame_new(c, f);
        if (!sf)
            return tmpl_oom(c, n);
        if ((rc = scope_undef(c, sf, n)))
            return rc;
        return exec_body(c, sf, &n->v);
    }
    case N_WITH: {
        struct tframe *wf = frame_new(c, f);
        if (!wf)
            return tmpl_oom(c, n);
        if ((rc = scope_undef(c, wf, n)))
            return rc;
        for (uint32_t i = 0; i < n->w.n; i++) {
            if ((rc = eval(c, f, n->w.v[i]->b, &v)) || (rc = assign(c, wf, n->w.v[i]->a, &v)))
                return rc;
        }
        return exec_body(c, wf, &n->v);
    }
    default:
        return tmpl_err(c, n, CAIRN_EFORMAT, "internal error: not a statement");
    }
}

static int exec_stmt(struct tctx *c, struct tframe *f, const struct tnode *n)
{
    int rc;
    if ((rc = tmpl_step(c, n)))
        return rc;
    if (++c->depth > TMPL_MAX_NESTING) {
        c->depth--;
        return tmpl_err(c, n, CAIRN_EFULL, "statements nested more than %d levels", TMPL_MAX_NESTING);
    }
    rc = exec_stmt_inner(c, f, n);
    c->depth--;
    return rc;
}

static int exec_body(struct tctx *c, struct tframe *f, const struct nvec *body)
{
    for (uint32_t i = 0; i < body->n; i++) {
        int rc = exec_stmt(c, f, body->v[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- entry points ---- */

int tmpl_render(const struct tmpl *t, const json_t *vars, char **out, size_t *out_len, char *err, size_t errlen)
{
    return tmpl_render_limits(t, vars, NULL, out, out_len, err, errlen);
}

int tmpl_render_limits(const struct tmpl *t, const json_t *vars, const struct tmpl_limits *lim, char **out,
                       size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (err && errlen)
        err[0] = 0;
    if (!t)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no template");
    if (vars && !json_is_object(vars))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "template variables must be a JSON object");
    struct tctx c = {.t = t, .err = err, .errlen = errlen};
    c.max_str = lim && lim->max_output ? lim->max_output : TMPL_DEFAULT_MAX_OUTPUT;
    c.ar.limit = lim && lim->max_memory ? lim->max_memory : TMPL_DEFAULT_MAX_MEMORY;
    c.max_steps = lim && lim->max_steps ? lim->max_steps : TMPL_DEFAULT_MAX_STEPS;
    c.max_depth = lim && lim->max_depth ? lim->max_depth : TMPL_DEFAULT_MAX_DEPTH;
    uint64_t max_ms = lim && lim->max_ms ? lim->max_ms : TMPL_DEFAULT_MAX_MS;
    c.max_ns = max_ms > (uint64_t)INT64_MAX / 1000000 ? INT64_MAX : (int64_t)max_ms * 1000000;
    c.t0_ns = clock_ns();
    int rc = CAIRN_ENOMEM;
    struct tsb outb;
    tmpl_sb_init(&outb, &c);
    c.out = &outb;
    c.g = calloc(t->nsyms ? t->nsyms : 1, sizeof *c.g);
    c.md = pcre2_match_data_create(1, NULL);
    c.root = frame_new(&c, NULL);
    if (!c.g || !c.md || !c.root) {
        tmpl_oom(&c, NULL);
        goto done;
    }
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) {
            int sym = tmpl_sym_find(t, k, strlen(k));
            if (sym >= 0) {
                c.g[sym].j = v;
                c.g[sym].state = 1;
            }
        }
    }
    rc = frame_undef(&c, c.root, t->root.undef, t->root.nundef);
    if (!rc)
        rc = exec_body(&c, c.root, &t->body);
    if (rc > 0)
        rc = tmpl_err(&c, NULL, CAIRN_EFORMAT, "loop control outside a loop");
    if (!rc && outb.fail)
        rc = out_fail(&c, NULL);
done:
    if (rc && !c.err_set)
        cairn_fail(err, errlen, rc, "%s", cairn_strerror(rc));
    tmpl_arena_free(&c.ar);
    pcre2_match_data_free(c.md);
    free(c.g);
    if (rc) {
        tmpl_sb_free(&outb);
        return rc;
    }
    if (!outb.p) {
        outb.p = malloc(1);
        if (!outb.p)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        outb.p[0] = 0;
    }
    *out = outb.p;
    if (out_len)
        *out_len = outb.n;
    return 0;
}
