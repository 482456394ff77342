/* Checks of a parsed template: the bound on its tree depth, what jinja2's compiler
 * refuses at compile time (unknown filters and tests outside `if` and conditional
 * expressions, loop controls outside loops), and jinja2's symbol tracking for the names
 * each frame starts with as undefined. */
#include "tmpl/tmpl_int.h"

#include "base/array.h"
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As the parser: the first error wins. */
struct checker {
    struct tmpl *t;
    int rc;
    char *err;
    size_t errlen;
};

static void *cfail(struct checker *K, uint32_t line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void *cfail(struct checker *K, uint32_t line, int code, const char *fmt, ...)
{
    if (!K->rc) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        K->rc = cairn_fail(K->err, K->errlen, code, "line %u: %s", line, msg);
    }
    return NULL;
}

static void *coom(struct checker *K)
{
    if (!K->rc)
        K->rc = cairn_fail(K->err, K->errlen, CAIRN_ENOMEM, "out of memory parsing the template");
    return NULL;
}

/* ---- tree depth: long chains (x.a.a.a..., 1+1+1...) build deep trees without deep
 * parser recursion; the recursive walks below and the evaluator need a bound ---- */

#define MAX_TREE_DEPTH 1000

static bool check_depth(struct checker *K, const struct nvec *body)
{
    struct item { const struct tnode *n; uint32_t d; } *st = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    for (uint32_t i = 0; i < body->n && ok; i++) {
        if (array_reserve(&st, &cap, n + 1, sizeof *st, 256)) {
            coom(K);
            ok = false;
            break;
        }
        st[n++] = (struct item){body->v[i], 1};
        while (n && ok) {
            struct item it = st[--n];
            if (it.d > MAX_TREE_DEPTH) {
                cfail(K, it.n->line, CAIRN_EFULL, "expression nested more than %d levels", MAX_TREE_DEPTH);
                ok = false;
                break;
            }
            const struct tnode *kids[3] = {it.n->a, it.n->b, it.n->c};
            size_t need = 3 + it.n->v.n + it.n->w.n;
            if (array_reserve(&st, &cap, n + need, sizeof *st, 256)) {
                coom(K);
                ok = false;
                break;
            }
            for (int k = 0; k < 3; k++)
                if (kids[k])
                    st[n++] = (struct item){kids[k], it.d + 1};
            for (uint32_t k = 0; k < it.n->v.n; k++)
                st[n++] = (struct item){it.n->v.v[k], it.d + 1};
            for (uint32_t k = 0; k < it.n->w.n; k++)
                st[n++] = (struct item){it.n->w.v[k], it.d + 1};
        }
    }
    free(st);
    return ok;
}

/* ---- checks jinja2's compiler makes ---- */

static bool check_node(struct checker *K, const struct tnode *n, bool soft, int loops);

static bool check_vec(struct checker *K, const struct nvec *v, bool soft, int loops)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (!check_node(K, v->v[i], soft, loops))
            return false;
    return true;
}

static bool check_node(struct checker *K, const struct tnode *n, bool soft, int loops)
{
    if (!n)
        return true;
    switch (n->kind) {
    case N_FILTER:
    case N_TEST:
        if ((n->flags & NF_UNKNOWN) && !soft) {
            cfail(K, n->line, CAIRN_EFORMAT, "No %s named '%.*s'.", n->kind == N_FILTER ? "filter" : "test",
                  (int)n->sn, n->s);
            return false;
        }
        break;
    case N_COND:
        soft = true;
        break;
    case N_IF:
        return check_node(K, n->a, true, loops) && check_vec(K, &n->v, true, loops) &&
               check_vec(K, &n->w, true, loops);
    case N_FOR:
        return check_node(K, n->a, soft, loops) && check_node(K, n->b, soft, loops) &&
               check_node(K, n->c, false, loops) && check_vec(K, &n->v, false, loops + 1) &&
               check_vec(K, &n->w, false, loops);
    case N_MACRO:
    case N_CALLBLOCK:
        for (uint32_t i = 0; i < n->w.n; i++)
            if (!check_node(K, n->w.v[i]->a, false, 0))
                return false;
        return check_node(K, n->a, soft, loops) && check_vec(K, &n->v, false, 0);
    case N_FILTERBLOCK:
        return check_node(K, n->a, false, loops) && check_vec(K, &n->v, false, loops);
    case N_SETBLOCK:
        return check_node(K, n->b, false, loops) && check_vec(K, &n->v, false, loops);
    case N_WITH:
        return check_vec(K, &n->w, soft, loops) && check_vec(K, &n->v, false, loops);
    case N_SCOPE:
        return check_vec(K, &n->v, n->flags ? soft : false, loops);
    case N_BREAK:
    case N_CONTINUE:
        if (!loops) {
            cfail(K, n->line, CAIRN_EFORMAT, "'%s' outside loop", n->kind == N_BREAK ? "break" : "continue");
            return false;
        }
        return true;
    default:
        break;
    }
    return check_node(K, n->a, soft, loops) && check_node(K, n->b, soft, loops) &&
           check_node(K, n->c, soft, loops) && check_vec(K, &n->v, soft, loops) &&
           check_vec(K, &n->w, soft, loops);
}

/* ---- jinja2's symbol tracking (idtracking.py), for the names each frame starts with
 * as undefined ---- */

enum { R_NONE, R_RESOLVE, R_ALIAS, R_UNDEF, R_PARAM };

struct symtab {
    const struct symtab *parent;
    uint8_t *ref;     /* per symbol: R_* */
    uint8_t *stored;
};

/* Tables are malloc'd and freed as soon as their frame (or if-branch) is done; the work
 * is about (names x (ifs + frames)), which is bounded before the analysis starts. */
static struct symtab *st_new(struct checker *K, const struct symtab *parent)
{
    uint32_t n = K->t->nsyms ? K->t->nsyms : 1;
    struct symtab *s = malloc(sizeof *s);
    uint8_t *mem = calloc(2, n);
    if (!s || !mem) {
        free(s);
        free(mem);
        return coom(K);
    }
    s->parent = parent;
    s->ref = mem;
    s->stored = mem + n;
    return s;
}

static void st_free(struct symtab *s)
{
    if (s) {
        free(s->ref);
        free(s);
    }
}

static struct symtab *st_copy(struct checker *K, const struct symtab *o)
{
    struct symtab *s = st_new(K, o->parent);
    if (s)
        memcpy(s->ref, o->ref, 2 * (size_t)(K->t->nsyms ? K->t->nsyms : 1));
    return s;
}

static bool st_find(const struct symtab *s, int sym)
{
    for (; s; s = s->parent)
        if (s->ref[sym])
            return true;
    return false;
}

static void st_load(struct symtab *s, int sym)
{
    if (!st_find(s, sym))
        s->ref[sym] = R_RESOLVE;
}

static void st_store(struct symtab *s, int sym)
{
    s->stored[sym] = 1;
    if (!s->ref[sym])
        s->ref[sym] = st_find(s->parent, sym) ? R_ALIAS : R_UNDEF;
}

static void st_param(struct symtab *s, int sym)
{
    s->stored[sym] = 1;
    s->ref[sym] = R_PARAM;
}

static void an_expr(struct symtab *s, const struct tnode *n)
{
    if (!n)
        return;
    if (n->kind == N_NAME) {
        st_load(s, n->id);
        return;
    }
    an_expr(s, n->a);
    an_expr(s, n->b);
    an_expr(s, n->c);
    for (uint32_t i = 0; i < n->v.n; i++)
        an_expr(s, n->v.v[i]);
    for (uint32_t i = 0; i < n->w.n; i++)
        an_expr(s, n->w.v[i]);
}

static void an_target(struct symtab *s, const struct tnode *n, bool param)
{
    if (n->kind == N_NAME) {
        if (param)
            st_param(s, n->id);
        else
            st_store(s, n->id);
    } else if (n->kind == N_NSREF) {
        st_load(s, n->id);
    } else {
        for (uint32_t i = 0; i < n->v.n; i++)
            an_target(s, n->v.v[i], param);
    }
}

struct frames { const struct tnode **v; uint32_t n, cap; };

static bool frames_push(struct checker *K, struct frames *f, const struct tnode *n)
{
    if (f->n == f->cap) {
        uint32_t cap = f->cap ? f->cap * 2 : 8;
        const struct tnode **v = tmpl_alloc(&K->t->ar, cap * sizeof *v);
        if (!v) {
            coom(K);
            return false;
        }
        if (f->n)
            memcpy(v, f->v, f->n * sizeof *v);
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = n;
    return true;
}

static bool an_stmts(struct checker *K, struct symtab *s, const struct nvec *body, struct frames *kids);

/* visit_If: the body, the elifs together and the else are three branches; a name
 * assigned in only some of them keeps the outer (or template) value in the others. */
static bool an_if(struct checker *K, struct symtab *s, const struct tnode *n, bool flat, struct frames *kids)
{
    an_expr(s, n->a);
    struct symtab *br[3] = {0};
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++)
        ok = (br[i] = st_copy(K, s)) != NULL;
    ok = ok && an_stmts(K, br[0], &n->v, kids);
    const struct nvec *els = &n->w;
    while (ok && flat && els->n == 1 && els->v[0]->kind == N_IF && (els->v[0]->flags & NF_ELIF)) {
        ok = an_if(K, br[1], els->v[0], false, kids);
        els = &els->v[0]->w;
    }
    ok = ok && (!flat || an_stmts(K, br[2], els, kids));
    if (!ok) {
        for (int i = 0; i < 3; i++)
            st_free(br[i]);
        return false;
    }
    uint32_t ns = K->t->nsyms;
    for (uint32_t k = 0; k < ns; k++) {
        int count = 0;
        for (int i = 0; i < 3; i++)
            count += br[i]->stored[k] && !s->stored[k];
        for (int i = 0; i < 3; i++) {
            if (br[i]->ref[k])
                s->ref[k] = br[i]->ref[k];
            if (br[i]->stored[k])
                s->stored[k] = 1;
        }
        if (count > 0 && count < 3)
            s->ref[k] = st_find(s->parent, (int)k) ? R_ALIAS : R_RESOLVE;
    }
    for (int i = 0; i < 3; i++)
        st_free(br[i]);
    return true;
}

static bool an_stmts(struct checker *K, struct symtab *s, const struct nvec *body, struct frames *kids)
{
    for (uint32_t i = 0; i < body->n; i++) {
        const struct tnode *n = body->v[i];
        switch (n->kind) {
        case N_OUTPUT:
            an_expr(s, n->a);
            break;
        case N_IF:
            if (!an_if(K, s, n, true, kids))
                return false;
            break;
        case N_FOR:
            an_expr(s, n->b);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_SET:
            an_expr(s, n->b);
            an_target(s, n->a, false);
            break;
        case N_SETBLOCK:
            an_target(s, n->a, false);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_MACRO:
            st_store(s, n->id);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_CALLBLOCK:
            an_expr(s, n->a);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_FILTERBLOCK:
            an_expr(s, n->a);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_WITH:
            for (uint32_t k = 0; k < n->w.n; k++)
                an_expr(s, n->w.v[k]->b);
            if (!frames_push(K, kids, n))
                return false;
            break;
        case N_SCOPE:
            if (n->flags) {
                if (!an_stmts(K, s, &n->v, kids))
                    return false;
            } else if (!frames_push(K, kids, n)) {
                return false;
            }
            break;
        default:
            break;
        }
    }
    return true;
}

static bool undef_list(struct checker *K, const struct symtab *s, const uint32_t **out, uint32_t *nout)
{
    uint32_t n = 0, ns = K->t->nsyms;
    for (uint32_t k = 0; k < ns; k++)
        n += s->ref[k] == R_UNDEF;
    *nout = n;
    *out = NULL;
    if (!n)
        return true;
    uint32_t *v = tmpl_alloc(&K->t->ar, n * sizeof *v);
    if (!v) {
        coom(K);
        return false;
    }
    n = 0;
    for (uint32_t k = 0; k < ns; k++)
        if (s->ref[k] == R_UNDEF)
            v[n++] = k;
    *out = v;
    return true;
}

static bool an_frames(struct checker *K, const struct symtab *parent, const struct frames *kids);

/* Analyzes one frame's statements, then the frames nested in it. */
static bool an_frame(struct checker *K, struct symtab *s, const struct nvec *body, const uint32_t **undef,
                     uint32_t *nundef)
{
    struct frames kids = {0};
    return an_stmts(K, s, body, &kids) && undef_list(K, s, undef, nundef) && an_frames(K, s, &kids);
}

static bool an_frames(struct checker *K, const struct symtab *parent, const struct frames *kids)
{
    for (uint32_t i = 0; i < kids->n; i++) {
        struct tnode *n = (struct tnode *)kids->v[i];
        struct tscope *sc = tmpl_alloc(&K->t->ar, sizeof *sc);
        if (!sc) {
            coom(K);
            return false;
        }
        struct symtab *s = st_new(K, parent);
        if (!s)
            return false;
        n->scope = sc;
        bool ok = true;
        switch (n->kind) {
        case N_FOR: {
            an_target(s, n->a, true);
            st_param(s, SYM_LOOP);
            ok = an_frame(K, s, &n->v, &sc->undef, &sc->nundef);
            struct symtab *e = ok ? st_new(K, parent) : NULL;
            ok = e && an_frame(K, e, &n->w, &sc->undef_else, &sc->nundef_else);
            st_free(e);
            break;
        }
        case N_MACRO:
        case N_CALLBLOCK:
            for (uint32_t k = 0; k < n->w.n; k++)
                st_param(s, n->w.v[k]->id);
            if (n->flags & NF_USES_CALLER)
                st_param(s, SYM_CALLER);
            if (n->flags & NF_USES_VARARGS)
                st_param(s, SYM_VARARGS);
            if (n->flags & NF_USES_KWARGS)
                st_param(s, SYM_KWARGS);
            for (uint32_t k = 0; k < n->w.n; k++)
                an_expr(s, n->w.v[k]->a);
            ok = an_frame(K, s, &n->v, &sc->undef, &sc->nundef);
            break;
        case N_WITH:
            for (uint32_t k = 0; k < n->w.n; k++)
                an_target(s, n->w.v[k]->a, true);
            ok = an_frame(K, s, &n->v, &sc->undef, &sc->nundef);
            break;
        default: /* set block, filter block, generation scope */
            ok = an_frame(K, s, &n->v, &sc->undef, &sc->nundef);
            break;
        }
        st_free(s);
        if (!ok)
            return false;
    }
    return true;
}

/* Statements that make the analysis copy or create a table: ifs and frames. */
static uint64_t count_tables(const struct nvec *v)
{
    uint64_t k = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        const struct tnode *n = v->v[i];
        if (n->kind == N_IF || n->kind == N_FOR || n->kind == N_MACRO || n->kind == N_CALLBLOCK ||
            n->kind == N_SETBLOCK || n->kind == N_FILTERBLOCK || n->kind == N_WITH || n->kind == N_SCOPE)
            k += 1 + count_tables(&n->v) + count_tables(&n->w);
    }
    return k;
}

int tmpl_check(struct tmpl *t, char *err, size_t errlen)
{
    struct checker K = {.t = t, .err = err, .errlen = errlen};
    struct symtab *root = NULL;
    bool ok = check_depth(&K, &t->body) && check_vec(&K, &t->body, false, 0);
    if (ok && (uint64_t)t->nsyms * count_tables(&t->body) > 200000000) {
        cfail(&K, 1, CAIRN_EFULL, "template too complex (%u names in %llu blocks)", t->nsyms,
              (unsigned long long)count_tables(&t->body));
        ok = false;
    }
    ok = ok && (root = st_new(&K, NULL)) && an_frame(&K, root, &t->body, &t->root.undef, &t->root.nundef);
    st_free(root);
    return ok ? 0 : K.rc ? K.rc : CAIRN_EFORMAT;
}
