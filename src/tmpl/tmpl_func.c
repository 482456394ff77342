/* jinja2's global functions (range, dict, namespace, joiner, ...) and the dict, list and
 * loop methods a sandboxed template may call (the ImmutableSandboxedEnvironment refuses
 * list.append, dict.update and the like, as there). */
#define _GNU_SOURCE
#include "tmpl/tmpl_lib.h"

#include "base/err.h"

#include <string.h>
#include <time.h>

static const struct { uint8_t type; bool unsafe; int id; const char *name; } methods[] = {
    {TV_DICT, true, MD_CLEAR, "clear"}, {TV_DICT, false, MD_COPY, "copy"},
    {TV_DICT, false, MD_FROMKEYS, "fromkeys"}, {TV_DICT, false, MD_GET, "get"},
    {TV_DICT, false, MD_ITEMS, "items"}, {TV_DICT, false, MD_KEYS, "keys"}, {TV_DICT, true, MD_POP, "pop"},
    {TV_DICT, true, MD_POPITEM, "popitem"}, {TV_DICT, true, MD_SETDEFAULT, "setdefault"},
    {TV_DICT, true, MD_UPDATE, "update"}, {TV_DICT, false, MD_VALUES, "values"},
    {TV_LIST, true, ML_APPEND, "append"}, {TV_LIST, true, ML_CLEAR, "clear"}, {TV_LIST, false, ML_COPY, "copy"},
    {TV_LIST, false, ML_COUNT, "count"}, {TV_LIST, true, ML_EXTEND, "extend"}, {TV_LIST, false, ML_INDEX, "index"},
    {TV_LIST, true, ML_INSERT, "insert"}, {TV_LIST, true, ML_POP, "pop"}, {TV_LIST, true, ML_REMOVE, "remove"},
    {TV_LIST, true, ML_REVERSE, "reverse"}, {TV_LIST, true, ML_SORT, "sort"},
    {TV_TUPLE, false, ML_COUNT, "count"}, {TV_TUPLE, false, ML_INDEX, "index"},
    {TV_LOOP, false, MLOOP_CYCLE, "cycle"}, {TV_LOOP, false, MLOOP_CHANGED, "changed"},
};

int tmpl_method_id(int t, const char *name, size_t n, bool *unsafe)
{
    *unsafe = false;
    if (t == TV_STR)
        return tmpl_str_method_id(name, n);
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].type == t && tmpl_name_eq(methods[i].name, name, n)) {
            *unsafe = methods[i].unsafe;
            return methods[i].id;
        }
    return -1;
}

static const char *method_name(int id)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].id == id)
            return methods[i].name;
    return "method";
}

int tmpl_global_func(int sym)
{
    switch (sym) {
    case SYM_RANGE: return G_RANGE;
    case SYM_DICT: return G_DICT;
    case SYM_NAMESPACE: return G_NAMESPACE;
    case SYM_RAISE_EXCEPTION: return G_RAISE;
    case SYM_STRFTIME_NOW: return G_STRFTIME;
    case SYM_CYCLER: return G_CYCLER;
    case SYM_JOINER: return G_JOINER;
    case SYM_LIPSUM: return G_LIPSUM;
    default: return -1;
    }
}

static int dict_from_args(struct tctx *c, const struct tnode *at, const char *fname, const struct tv *args,
                          size_t nargs, const struct tkw *kw, size_t nkw, struct tdict **out)
{
    struct tdict *d = tmpl_dict_new(c, 0);
    int rc;
    if (!d)
        return tmpl_oom(c, at);
    if (nargs > 1)
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s expected at most 1 argument, got %zu", fname, nargs);
    if (nargs) {
        const struct tv *src = &args[0];
        if (src->t == TV_DICT) {
            for (size_t i = 0; i < src->u.m->n; i++)
                if (tmpl_dict_set(c, d, src->u.m->k[i], src->u.m->v[i]))
                    return tmpl_oom(c, at);
        } else {
            struct tlist *items;
            if ((rc = tmpl_iterate(c, at, src, &items)))
                return rc;
            for (size_t i = 0; i < items->n; i++) {
                struct tlist *kv;
                if ((rc = tmpl_iterate(c, at, &items->v[i], &kv)))
                    return rc;
                if (kv->n != 2)
                    return tmpl_err(c, at, CAIRN_EFORMAT,
                                    "dictionary update sequence element #%zu has length %zu; 2 is required", i, kv->n);
                if (!tmpl_hashable(&kv->v[0]))
                    return tmpl_err(c, at, CAIRN_EFORMAT, "unhashable type: '%s'", tmpl_type_name(&kv->v[0]));
                if (tmpl_dict_set(c, d, kv->v[0], kv->v[1]))
                    return tmpl_oom(c, at);
            }
        }
    }
    for (size_t k = 0; k < nkw; k++)
        if (tmpl_dict_set(c, d, tv_str(kw[k].name, kw[k].n), kw[k].v))
            return tmpl_oom(c, at);
    *out = d;
    return 0;
}

static int call_global(struct tctx *c, const struct tnode *at, const struct tfunc *fn, const struct tv *args,
                       size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    int rc;
    switch (fn->id) {
    case G_RANGE: {
        if (nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3)
            return tmpl_err(c, at, CAIRN_EFORMAT, "range expected 1 to 3 arguments, got %zu", nargs);
        int64_t v[3];
        for (size_t i = 0; i < nargs; i++) {
            if (!tv_is_intlike(&args[i])) {
                if (args[i].t == TV_UNDEF)
                    return tmpl_undef_err(c, at, &args[i]);
                return tmpl_err(c, at, CAIRN_EFORMAT, "'%s' object cannot be interpreted as an integer",
                                tmpl_type_name(&args[i]));
            }
            v[i] = tv_as_int(&args[i]);
        }
        int64_t start = nargs == 1 ? 0 : v[0], stop = nargs == 1 ? v[0] : v[1], step = nargs == 3 ? v[2] : 1;
        if (step == 0)
            return tmpl_err(c, at, CAIRN_EFORMAT, "range() arg 3 must not be zero");
        /* len(range) in 128-bit arithmetic, then the sandbox's MAX_RANGE */
        __int128 len = 0;
        if (step > 0 && start < stop)
            len = ((__int128)stop - start - 1) / step + 1;
        else if (step < 0 && start > stop)
            len = ((__int128)start - stop - 1) / (-(__int128)step) + 1;
        if (len > 100000)
            return tmpl_err(c, at, CAIRN_EFORMAT,
                            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        struct tlist *l;
        if ((rc = tmpl_lib_list(c, at, (size_t)len, &l)))
            return rc;
        for (int64_t i = 0; i < (int64_t)len; i++)
            l->v[i] = tv_int(start + i * step);
        l->n = (size_t)len;
        *out = tv_list(l, TV_LIST);
        return 0;
    }
    case G_DICT:
    case G_NAMESPACE: {
        struct tdict *d = NULL;
        if ((rc = dict_from_args(c, at, fn->id == G_DICT ? "dict" : "namespace", args, nargs, kw, nkw, &d)))
            return rc;
        out->t = fn->id == G_DICT ? TV_DICT : TV_NS;
        out->f = 0;
        out->u.m = d;
        return 0;
    }
    case G_RAISE: {
        struct tv msg = nargs ? args[0] : tv_str("", 0), s;
        if (nargs != 1 || nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "raise_exception() takes exactly one argument");
        if ((rc = tmpl_str_of(c, at, &msg, &s)))
            return rc;
        return tmpl_err(c, NULL, CAIRN_EINVAL, "%.*s", (int)(s.u.s.n > 480 ? 480 : s.u.s.n), s.u.s.p);
    }
    case G_STRFTIME: {
        if (nargs != 1 || nkw || args[0].t != TV_STR)
            return tmpl_err(c, at, CAIRN_EFORMAT, "strftime_now() takes one string argument");
        struct tm tm = {0};
        tm.tm_year = 2026 - 1900;
        tm.tm_mon = 0;
        tm.tm_mday = 2;
        tm.tm_wday = 5;
        tm.tm_yday = 1;
        tm.tm_isdst = -1;
        struct tv f;
        if ((rc = tmpl_str_new(c, args[0].u.s.p, args[0].u.s.n, &f)))
            return rc;
        if (memchr(f.u.s.p, 0, f.u.s.n))
            return tmpl_err(c, at, CAIRN_EFORMAT, "embedded null character");
        size_t cap = 64 + f.u.s.n * 16;
        if (cap > 65536)
            return tmpl_err(c, at, CAIRN_EFULL, "strftime format too long");
        char *buf = tmpl_alloc(&c->ar, cap);
        if (!buf)
            return tmpl_oom(c, at);
        size_t k = c->t->loc ? strftime_l(buf, cap, f.u.s.p, &tm, c->t->loc) : strftime(buf, cap, f.u.s.p, &tm);
        *out = tv_str(buf, k);
        return 0;
    }
    case G_JOINER: {
        struct tv sep = nargs ? args[0] : tv_str(", ", 2);
        for (size_t k = 0; k < nkw; k++)
            if (tmpl_name_eq("sep", kw[k].name, kw[k].n))
                sep = kw[k].v;
        struct tlist *state;
        if ((rc = tmpl_lib_list(c, at, 2, &state)))
            return rc;
        state->v[0] = sep;
        state->v[1] = tv_bool(false);
        state->n = 2;
        struct tfunc *f = tmpl_alloc(&c->ar, sizeof *f);
        if (!f)
            return tmpl_oom(c, at);
        f->id = G_JOINER_CALL;
        f->self = tv_list(state, TV_LIST);
        out->t = TV_FUNC;
        out->f = 0;
        out->u.fn = f;
        return 0;
    }
    case G_JOINER_CALL: {
        struct tlist *state = fn->self.u.l;
        if (!state->v[1].u.b) {
            state->v[1] = tv_bool(true);
            *out = tv_str("", 0);
        } else {
            *out = state->v[0];
        }
        return 0;
    }
    case G_CYCLER:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "cycler() is not supported");
    default:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "lipsum() is not supported");
    }
}

static int view(struct tctx *c, const struct tnode *at, const struct tdict *d, int kind, struct tv *out)
{
    struct tlist *l;
    int rc;
    if ((rc = tmpl_lib_list(c, at, d->n, &l)))
        return rc;
    for (size_t i = 0; i < d->n; i++) {
        if (kind == TI_ITEMS) {
            if ((rc = tmpl_lib_pair(c, at, d->k[i], d->v[i], &l->v[i])))
                return rc;
        } else {
            l->v[i] = kind == TI_KEYS ? d->k[i] : d->v[i];
        }
    }
    l->n = d->n;
    return tmpl_lib_iter(c, at, l, kind, out);
}

int tmpl_call_builtin(struct tctx *c, const struct tnode *at, const struct tfunc *fn, const struct tv *args,
                      size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out)
{
    int id = fn->id, rc;
    const struct tv *self = &fn->self;
    struct tv a[3];
    if ((rc = tmpl_charge(c, at, id < MS_FIRST ? NULL : self, args, nargs)))
        return rc;
    if (id < MS_FIRST)
        return call_global(c, at, fn, args, nargs, kw, nkw, out);
    if (id < MS_LAST)
        return tmpl_str_method(c, at, id, self, args, nargs, kw, nkw, out);
    const char *name = method_name(id);
    switch (id) {
    case MD_GET: {
        static const char *const names[] = {"key", "default"};
        if (nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "get() takes no keyword arguments");
        if ((rc = tmpl_bind(c, at, "get", names, 2, args, nargs, NULL, 0, a)))
            return rc;
        if (!tv_given(&a[0]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "get expected at least 1 argument, got 0");
        if (!tmpl_hashable(&a[0]))
            return tmpl_err(c, at, CAIRN_EFORMAT, "unhashable type: '%s'", tmpl_type_name(&a[0]));
        long i = tmpl_dict_find(self->u.m, &a[0]);
        *out = i >= 0 ? self->u.m->v[i] : tv_given(&a[1]) ? a[1] : tv_none();
        return 0;
    }
    case MD_ITEMS:
    case MD_KEYS:
    case MD_VALUES:
        if (nargs || nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "%s() takes no arguments", name);
        return view(c, at, self->u.m, id == MD_ITEMS ? TI_ITEMS : id == MD_KEYS ? TI_KEYS : TI_VALUES, out);
    case MD_COPY: {
        struct tdict *d = tmpl_dict_new(c, self->u.m->n);
        if (!d)
            return tmpl_oom(c, at);
        tmpl_copy(d->k, self->u.m->k, self->u.m->n * sizeof *d->k);
        tmpl_copy(d->v, self->u.m->v, self->u.m->n * sizeof *d->v);
        d->n = self->u.m->n;
        tmpl_dict_index(c, d);
        out->t = TV_DICT;
        out->f = 0;
        out->u.m = d;
        return 0;
    }
    case ML_COPY: {
        struct tlist *l;
        if ((rc = tmpl_lib_list(c, at, self->u.l->n, &l)))
            return rc;
        tmpl_copy(l->v, self->u.l->v, self->u.l->n * sizeof *l->v);
        l->n = self->u.l->n;
        *out = tv_list(l, TV_LIST);
        return 0;
    }
    case ML_COUNT: {
        if (nargs != 1 || nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "count() takes exactly one argument");
        int64_t k = 0;
        for (size_t i = 0; i < self->u.l->n; i++)
            k += tmpl_equal(&self->u.l->v[i], &args[0]);
        *out = tv_int(k);
        return 0;
    }
    case ML_INDEX: {
        if (nargs < 1 || nargs > 3 || nkw)
            return tmpl_err(c, at, CAIRN_EFORMAT, "index() takes 1 to 3 arguments");
        int64_t n = (int64_t)self->u.l->n, st = 0, en = n;
        if (nargs > 1 && tv_is_intlike(&args[1]) && (st = tv_as_int(&args[1])) < 0 && (st += n) < 0)
            st = 0;
        if (nargs > 2 && tv_is_intlike(&args[2]) && (en = tv_as_int(&args[2])) < 0 && (en += n) < 0)
            en = 0;
        for (int64_t i = st; i < en && i < n; i++)
            if (tmpl_equal(&self->u.l->v[i], &args[0])) {
                *out = tv_int(i);
                return 0;
            }
        return tmpl_err(c, at, CAIRN_EFORMAT, "%s.index(x): x not in %s", tmpl_type_name(self), tmpl_type_name(self));
    }
    case MLOOP_CYCLE:
        if (!nargs)
            return tmpl_err(c, at, CAIRN_EFORMAT, "no items for cycling given");
        *out = args[self->u.lp->i0 % (int64_t)nargs];
        return 0;
    case MLOOP_CHANGED: {
        struct tloop *lp = self->u.lp;
        struct tlist *l;
        if ((rc = tmpl_lib_list(c, at, nargs, &l)))
            return rc;
        tmpl_copy(l->v, args, nargs * sizeof *args);
        l->n = nargs;
        struct tv now = tv_list(l, TV_TUPLE);
        bool changed = !lp->changed_set || !tmpl_equal(&lp->last_changed, &now);
        if (changed) {
            lp->last_changed = now;
            lp->changed_set = true;
        }
        *out = tv_bool(changed);
        return 0;
    }
    default:
        return tmpl_err(c, at, CAIRN_EUNSUPPORTED, "%s.%s() is not supported", tmpl_type_name(self), name);
    }
}
