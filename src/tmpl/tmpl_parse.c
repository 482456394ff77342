/* Template parser: jinja2's grammar (parser.py) into a tree of struct tnode, then the
 * checks of tmpl_check.c. */
#include "tmpl/tmpl_int.h"

#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_NEST 200

struct parser {
    struct tmpl *t;
    struct ttok *tk;
    size_t i, n;
    int nest;
    int rc;
    char *err;
    size_t errlen;
};

static void *pfail(struct parser *P, uint32_t line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void *pfail(struct parser *P, uint32_t line, int code, const char *fmt, ...)
{
    if (!P->rc) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        P->rc = cairn_fail(P->err, P->errlen, code, "line %u: %s", line, msg);
    }
    return NULL;
}

static void *poom(struct parser *P)
{
    if (!P->rc)
        P->rc = cairn_fail(P->err, P->errlen, CAIRN_ENOMEM, "out of memory parsing the template");
    return NULL;
}

/* ---- symbols ---- */

static uint32_t hash_name(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

int tmpl_sym_find(const struct tmpl *t, const char *p, size_t n)
{
    if (!t->hashcap)
        return -1;
    uint32_t mask = t->hashcap - 1;
    for (uint32_t h = hash_name(p, n) & mask;; h = (h + 1) & mask) {
        uint32_t e = t->hash[h];
        if (!e)
            return -1;
        const struct tsym *s = &t->syms[e - 1];
        if (s->n == n && !memcmp(s->p, p, n))
            return (int)(e - 1);
    }
}

static int sym_intern(struct tmpl *t, const char *p, size_t n)
{
    int id = tmpl_sym_find(t, p, n);
    if (id >= 0)
        return id;
    if (t->nsyms >= (1u << 24))
        return -1;
    if ((t->nsyms + 1) * 2 > t->hashcap) {
        uint32_t cap = t->hashcap ? t->hashcap * 2 : 64;
        uint32_t *h = tmpl_alloc(&t->ar, cap * sizeof *h);
        if (!h)
            return -1;
        for (uint32_t i = 0; i < t->nsyms; i++) {
            uint32_t k = hash_name(t->syms[i].p, t->syms[i].n) & (cap - 1);
            while (h[k])
                k = (k + 1) & (cap - 1);
            h[k] = i + 1;
        }
        t->hash = h;
        t->hashcap = cap;
    }
    if (t->nsyms == t->capsyms) {
        uint32_t cap = t->capsyms ? t->capsyms * 2 : 64;
        struct tsym *s = tmpl_alloc(&t->ar, cap * sizeof *s);
        if (!s)
            return -1;
        if (t->nsyms)
            memcpy(s, t->syms, t->nsyms * sizeof *s);
        t->syms = s;
        t->capsyms = cap;
    }
    char *copy = tmpl_alloc(&t->ar, n + 1);
    if (!copy)
        return -1;
    memcpy(copy, p, n);
    t->syms[t->nsyms] = (struct tsym){copy, n};
    uint32_t k = hash_name(p, n) & (t->hashcap - 1);
    while (t->hash[k])
        k = (k + 1) & (t->hashcap - 1);
    t->hash[k] = t->nsyms + 1;
    return (int)t->nsyms++;
}

/* ---- helpers ---- */

static struct ttok *cur(struct parser *P) { return &P->tk[P->i]; }
static struct ttok *look(struct parser *P) { return &P->tk[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static void next(struct parser *P)
{
    if (P->i + 1 < P->n)
        P->i++;
}

static bool is_name(const struct ttok *tk, const char *name)
{
    return tk->type == TK_NAME && tk->n == strlen(name) && !memcmp(tk->p, name, tk->n);
}
static bool is_op(const struct ttok *tk, int op) { return tk->type == TK_OP && tk->op == op; }

static const char *describe(const struct ttok *tk, char *buf, size_t len)
{
    static const char *const opnames[] = {
        "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}", "==", "!=",
        ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
    switch (tk->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data / text";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: snprintf(buf, len, "%.*s", (int)(tk->n > 60 ? 60 : tk->n), tk->p); return buf;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_OP: return opnames[tk->op];
    }
    return "?";
}

static bool expect_op(struct parser *P, int op, const char *what)
{
    if (is_op(cur(P), op)) {
        next(P);
        return true;
    }
    char b[80];
    pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected '%s', got '%s'", what, describe(cur(P), b, sizeof b));
    return false;
}

static bool expect_type(struct parser *P, int type, const char *what)
{
    if (cur(P)->type == type) {
        next(P);
        return true;
    }
    char b[80];
    if (cur(P)->type == TK_EOF)
        pfail(P, cur(P)->line, CAIRN_EFORMAT, "unexpected end of template, expected '%s'", what);
    else
        pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected '%s', got '%s'", what, describe(cur(P), b, sizeof b));
    return false;
}

static struct tnode *mk(struct parser *P, int kind, uint32_t line)
{
    struct tnode *n = tmpl_alloc(&P->t->ar, sizeof *n);
    if (!n)
        return poom(P);
    n->kind = (uint8_t)kind;
    n->line = line;
    n->id = -1;
    return n;
}

/* Growable node list in the parse arena. */
struct vb { struct tnode **v; uint32_t n, cap; };

static bool vb_push(struct parser *P, struct vb *b, struct tnode *x)
{
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 4;
        struct tnode **v = tmpl_alloc(&P->t->ar, cap * sizeof *v);
        if (!v) {
            poom(P);
            return false;
        }
        if (b->n)
            memcpy(v, b->v, b->n * sizeof *v);
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = x;
    return true;
}

static struct nvec vb_vec(struct vb *b) { return (struct nvec){b->v, b->n}; }

static bool enter(struct parser *P)
{
    if (++P->nest > MAX_NEST) {
        pfail(P, cur(P)->line, CAIRN_EFULL, "template nested too deeply (more than %d levels)", MAX_NEST);
        return false;
    }
    return true;
}
#define LEAVE(P, x) (P->nest--, (x))

/* ---- expressions ---- */

static struct tnode *p_expression(struct parser *P, bool condexpr);
static struct tnode *p_tuple(struct parser *P, bool simplified, bool condexpr, const char *extra_end,
                             bool explicit_paren);
static struct tnode *p_postfix(struct parser *P, struct tnode *node);
static struct tnode *p_filter(struct parser *P, struct tnode *node, bool start_inline);

static struct tnode *p_primary(struct parser *P)
{
    struct ttok *tk = cur(P);
    struct tnode *n;
    if (!enter(P))
        return NULL;
    switch (tk->type) {
    case TK_NAME:
        if (is_name(tk, "true") || is_name(tk, "True") || is_name(tk, "false") || is_name(tk, "False")) {
            if (!(n = mk(P, N_CONST, tk->line)))
                return NULL;
            n->k = tv_bool(tk->p[0] == 't' || tk->p[0] == 'T');
        } else if (is_name(tk, "none") || is_name(tk, "None")) {
            if (!(n = mk(P, N_CONST, tk->line)))
                return NULL;
            n->k = tv_none();
        } else {
            if (!(n = mk(P, N_NAME, tk->line)))
                return NULL;
            n->id = sym_intern(P->t, tk->p, tk->n);
            if (n->id < 0)
                return poom(P);
            n->s = P->t->syms[n->id].p;
            n->sn = tk->n;
        }
        next(P);
        return LEAVE(P, n);
    case TK_STRING: {
        if (!(n = mk(P, N_CONST, tk->line)))
            return NULL;
        size_t total = 0, j = P->i;
        while (P->tk[j].type == TK_STRING)
            total += P->tk[j++].n;
        if (j == P->i + 1) {
            n->k = tv_str(tk->p, tk->n);
            next(P);
        } else {
            char *s = tmpl_alloc(&P->t->ar, total + 1);
            if (!s)
                return poom(P);
            size_t o = 0;
            while (cur(P)->type == TK_STRING) {
                memcpy(s + o, cur(P)->p, cur(P)->n);
                o += cur(P)->n;
                next(P);
            }
            n->k = tv_str(s, o);
        }
        return LEAVE(P, n);
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(n = mk(P, N_CONST, tk->line)))
            return NULL;
        n->k = tk->type == TK_INT ? tv_int(tk->i) : tv_float(tk->d);
        next(P);
        return LEAVE(P, n);
    case TK_OP:
        if (tk->op == O_LPAREN) {
            next(P);
            n = p_tuple(P, false, true, NULL, true);
            if (!n || !expect_op(P, O_RPAREN, ")"))
                return NULL;
            return LEAVE(P, n);
        }
        if (tk->op == O_LBRACKET || tk->op == O_LBRACE) {
            bool dict = tk->op == O_LBRACE;
            int close = dict ? O_RBRACE : O_RBRACKET;
            if (!(n = mk(P, dict ? N_DICT : N_LIST, tk->line)))
                return NULL;
            next(P);
            struct vb items = {0};
            while (!is_op(cur(P), close)) {
                if (items.n && !expect_op(P, O_COMMA, ","))
                    return NULL;
                if (is_op(cur(P), close))
                    break;
                struct tnode *x = p_expression(P, true);
                if (!x)
                    return NULL;
                if (dict) {
                    struct tnode *pair = mk(P, N_PAIR, x->line);
                    if (!pair || !expect_op(P, O_COLON, ":"))
                        return NULL;
                    pair->a = x;
                    if (!(pair->b = p_expression(P, true)))
                        return NULL;
                    x = pair;
                }
                if (!vb_push(P, &items, x))
                    return NULL;
            }
            next(P);
            n->v = vb_vec(&items);
            return LEAVE(P, n);
        }
        break;
    default:
        break;
    }
    char b[80];
    if (tk->type == TK_EOF)
        return pfail(P, tk->line, CAIRN_EFORMAT, "unexpected end of template");
    return pfail(P, tk->line, CAIRN_EFORMAT, "unexpected '%s'", describe(tk, b, sizeof b));
}

/* (args, kw=...) after the current '('. */
static bool p_call_args(struct parser *P, struct nvec *args, struct nvec *kws)
{
    uint32_t line = cur(P)->line;
    if (!expect_op(P, O_LPAREN, "("))
        return false;
    struct vb a = {0}, k = {0};
    bool need_comma = false;
    while (!is_op(cur(P), O_RPAREN)) {
        if (need_comma) {
            if (!expect_op(P, O_COMMA, ","))
                return false;
            if (is_op(cur(P), O_RPAREN))
                break;
        }
        if (is_op(cur(P), O_MUL) || is_op(cur(P), O_POW)) {
            pfail(P, line, CAIRN_EUNSUPPORTED, "*args and **kwargs in calls are not supported");
            return false;
        }
        if (cur(P)->type == TK_NAME && is_op(look(P), O_ASSIGN)) {
            struct tnode *kw = mk(P, N_KW, cur(P)->line);
            if (!kw)
                return false;
            kw->s = cur(P)->p;
            kw->sn = cur(P)->n;
            next(P);
            next(P);
            if (!(kw->a = p_expression(P, true)) || !vb_push(P, &k, kw))
                return false;
        } else {
            if (k.n) {
                pfail(P, line, CAIRN_EFORMAT, "invalid syntax for function call expression");
                return false;
            }
            struct tnode *x = p_expression(P, true);
            if (!x || !vb_push(P, &a, x))
                return false;
        }
        need_comma = true;
    }
    next(P);
    *args = vb_vec(&a);
    *kws = vb_vec(&k);
    return true;
}

static struct tnode *p_call(struct parser *P, struct tnode *callee)
{
    struct tnode *n = mk(P, N_CALL, cur(P)->line);
    if (!n || !p_call_args(P, &n->v, &n->w))
        return NULL;
    n->a = callee;
    return n;
}

static struct tnode *p_subscribed(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct tnode *parts[3] = {0};
    if (is_op(cur(P), O_COLON)) {
        next(P);
    } else {
        struct tnode *x = p_expression(P, true);
        if (!x)
            return NULL;
        if (!is_op(cur(P), O_COLON))
            return x;
        next(P);
        parts[0] = x;
    }
    if (!is_op(cur(P), O_COLON) && !is_op(cur(P), O_RBRACKET) && !is_op(cur(P), O_COMMA)) {
        if (!(parts[1] = p_expression(P, true)))
            return NULL;
    }
    if (is_op(cur(P), O_COLON)) {
        next(P);
        if (!is_op(cur(P), O_RBRACKET) && !is_op(cur(P), O_COMMA))
            if (!(parts[2] = p_expression(P, true)))
                return NULL;
    }
    struct tnode *n = mk(P, N_SLICE, line);
    if (!n)
        return NULL;
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    return n;
}

static struct tnode *p_subscript(struct parser *P, struct tnode *node)
{
    struct ttok *tk = cur(P);
    uint32_t line = tk->line;
    next(P);
    if (tk->op == O_DOT) {
        struct ttok *at = cur(P);
        next(P);
        if (at->type == TK_NAME) {
            struct tnode *n = mk(P, N_GETATTR, line);
            if (!n)
                return NULL;
            n->a = node;
            n->s = at->p;
            n->sn = at->n;
            return n;
        }
        if (at->type != TK_INT)
            return pfail(P, at->line, CAIRN_EFORMAT, "expected name or number");
        struct tnode *k = mk(P, N_CONST, at->line), *n = mk(P, N_GETITEM, line);
        if (!k || !n)
            return NULL;
        k->k = tv_int(at->i);
        n->a = node;
        n->b = k;
        return n;
    }
    /* '[' */
    struct vb args = {0};
    while (!is_op(cur(P), O_RBRACKET)) {
        if (args.n && !expect_op(P, O_COMMA, ","))
            return NULL;
        struct tnode *x = p_subscribed(P);
        if (!x || !vb_push(P, &args, x))
            return NULL;
    }
    if (!expect_op(P, O_RBRACKET, "]"))
        return NULL;
    struct tnode *n = mk(P, N_GETITEM, line);
    if (!n)
        return NULL;
    n->a = node;
    if (args.n == 1) {
        n->b = args.v[0];
    } else {
        struct tnode *tup = mk(P, N_TUPLE, line);
        if (!tup)
            return NULL;
        tup->v = vb_vec(&args);
        n->b = tup;
    }
    return n;
}

static struct tnode *p_postfix(struct parser *P, struct tnode *node)
{
    while (node) {
        if (is_op(cur(P), O_DOT) || is_op(cur(P), O_LBRACKET))
            node = p_subscript(P, node);
        else if (is_op(cur(P), O_LPAREN))
            node = p_call(P, node);
        else
            break;
    }
    return node;
}

static bool dotted_name(struct parser *P, const char **s, size_t *sn)
{
    struct ttok *tk = cur(P);
    if (tk->type != TK_NAME) {
        char b[80];
        pfail(P, tk->line, CAIRN_EFORMAT, "expected name, got '%s'", describe(tk, b, sizeof b));
        return false;
    }
    const char *start = tk->p;
    size_t n = tk->n;
    next(P);
    while (is_op(cur(P), O_DOT) && look(P)->type == TK_NAME) {
        next(P);
        n = (size_t)(cur(P)->p + cur(P)->n - start);
        next(P);
    }
    *s = start;
    *sn = n;
    return true;
}

static struct tnode *p_filter(struct parser *P, struct tnode *node, bool start_inline)
{
    while (is_op(cur(P), O_PIPE) || start_inline) {
        if (!start_inline)
            next(P);
        start_inline = false;
        struct tnode *n = mk(P, N_FILTER, cur(P)->line);
        if (!n || !dotted_name(P, &n->s, &n->sn))
            return NULL;
        int id = tmpl_filter_id(n->s, n->sn);
        if (id == TMPL_ID_UNSUPPORTED)
            return pfail(P, n->line, CAIRN_EUNSUPPORTED, "filter '%.*s' is not supported", (int)n->sn, n->s);
        if (id == TMPL_ID_UNKNOWN)
            n->flags |= NF_UNKNOWN;
        n->id = id;
        if (is_op(cur(P), O_LPAREN) && !p_call_args(P, &n->v, &n->w))
            return NULL;
        n->a = node;
        node = n;
    }
    return node;
}

static struct tnode *p_test(struct parser *P, struct tnode *node)
{
    uint32_t line = cur(P)->line;
    next(P); /* is */
    bool negated = false;
    if (is_name(cur(P), "not")) {
        next(P);
        negated = true;
    }
    struct tnode *n = mk(P, N_TEST, line);
    if (!n || !dotted_name(P, &n->s, &n->sn))
        return NULL;
    int id = tmpl_test_id(n->s, n->sn);
    if (id == TMPL_ID_UNSUPPORTED)
        return pfail(P, line, CAIRN_EUNSUPPORTED, "test '%.*s' is not supported", (int)n->sn, n->s);
    if (id == TMPL_ID_UNKNOWN)
        n->flags |= NF_UNKNOWN;
    n->id = id;
    n->a = node;
    struct ttok *tk = cur(P);
    if (is_op(tk, O_LPAREN)) {
        if (!p_call_args(P, &n->v, &n->w))
            return NULL;
    } else if ((tk->type == TK_NAME || tk->type == TK_STRING || tk->type == TK_INT ||
                tk->type == TK_FLOAT || is_op(tk, O_LBRACKET) || is_op(tk, O_LBRACE)) &&
               !is_name(tk, "else") && !is_name(tk, "or") && !is_name(tk, "and")) {
        if (is_name(tk, "is"))
            return pfail(P, tk->line, CAIRN_EFORMAT, "You cannot chain multiple tests with is");
        struct tnode *arg = p_postfix(P, p_primary(P));
        if (!arg)
            return NULL;
        struct vb a = {0};
        if (!vb_push(P, &a, arg))
            return NULL;
        n->v = vb_vec(&a);
    }
    if (negated) {
        struct tnode *nn = mk(P, N_NOT, line);
        if (!nn)
            return NULL;
        nn->a = n;
        return nn;
    }
    return n;
}

static struct tnode *p_filter_expr(struct parser *P, struct tnode *node)
{
    while (node) {
        if (is_op(cur(P), O_PIPE))
            node = p_filter(P, node, false);
        else if (is_name(cur(P), "is"))
            node = p_test(P, node);
        else if (is_op(cur(P), O_LPAREN))
            node = p_call(P, node);
        else
            break;
    }
    return node;
}

static struct tnode *p_unary(struct parser *P, bool with_filter)
{
    struct ttok *tk = cur(P);
    struct tnode *node;
    if (!enter(P))
        return NULL;
    if (is_op(tk, O_SUB) || is_op(tk, O_ADD)) {
        node = mk(P, is_op(tk, O_SUB) ? N_NEG : N_POS, tk->line);
        next(P);
        if (!node || !(node->a = p_unary(P, false)))
            return NULL;
    } else {
        node = p_primary(P);
    }
    node = p_postfix(P, node);
    if (with_filter)
        node = p_filter_expr(P, node);
    return LEAVE(P, node);
}

static struct tnode *mk_bin(struct parser *P, int op, uint32_t line, struct tnode *a, struct tnode *b)
{
    if (!a || !b)
        return NULL;
    struct tnode *n = mk(P, N_BIN, line);
    if (!n)
        return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static struct tnode *p_pow(struct parser *P)
{
    struct tnode *left = p_unary(P, true);
    while (left && is_op(cur(P), O_POW)) {
        uint32_t line = cur(P)->line;
        next(P);
        left = mk_bin(P, B_POW, line, left, p_unary(P, true));
    }
    return left;
}

static struct tnode *p_math2(struct parser *P)
{
    struct tnode *left = p_pow(P);
    while (left) {
        struct ttok *tk = cur(P);
        int op = is_op(tk, O_MUL) ? B_MUL : is_op(tk, O_DIV) ? B_DIV
               : is_op(tk, O_FLOORDIV) ? B_FLOORDIV : is_op(tk, O_MOD) ? B_MOD : -1;
        if (op < 0)
            break;
        next(P);
        left = mk_bin(P, op, tk->line, left, p_pow(P));
    }
    return left;
}

static struct tnode *p_concat(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct tnode *first = p_math2(P);
    if (!first || !is_op(cur(P), O_TILDE))
        return first;
    struct vb args = {0};
    if (!vb_push(P, &args, first))
        return NULL;
    while (is_op(cur(P), O_TILDE)) {
        next(P);
        struct tnode *x = p_math2(P);
        if (!x || !vb_push(P, &args, x))
            return NULL;
    }
    struct tnode *n = mk(P, N_CONCAT, line);
    if (!n)
        return NULL;
    n->v = vb_vec(&args);
    return n;
}

static struct tnode *p_math1(struct parser *P)
{
    struct tnode *left = p_concat(P);
    while (left && (is_op(cur(P), O_ADD) || is_op(cur(P), O_SUB))) {
        int op = is_op(cur(P), O_ADD) ? B_ADD : B_SUB;
        uint32_t line = cur(P)->line;
        next(P);
        left = mk_bin(P, op, line, left, p_concat(P));
    }
    return left;
}

static struct tnode *p_compare(struct parser *P)
{
    uint32_t line = cur(P)->line;
    struct tnode *expr = p_math1(P);
    if (!expr)
        return NULL;
    struct vb ops = {0};
    for (;;) {
        struct ttok *tk = cur(P);
        int op = -1;
        if (tk->type == TK_OP) {
            switch (tk->op) {
            case O_EQ: op = C_EQ; break;
            case O_NE: op = C_NE; break;
            case O_LT: op = C_LT; break;
            case O_LTEQ: op = C_LE; break;
            case O_GT: op = C_GT; break;
            case O_GTEQ: op = C_GE; break;
            default: break;
            }
            if (op >= 0)
                next(P);
        } else if (is_name(tk, "in")) {
            op = C_IN;
            next(P);
        } else if (is_name(tk, "not") && is_name(look(P), "in")) {
            op = C_NOTIN;
            next(P);
            next(P);
        }
        if (op < 0)
            break;
        struct tnode *o = mk(P, N_OPERAND, tk->line);
        if (!o || !(o->a = p_math1(P)) || !vb_push(P, &ops, o))
            return NULL;
        o->op = (uint8_t)op;
    }
    if (!ops.n)
        return expr;
    struct tnode *n = mk(P, N_COMPARE, line);
    if (!n)
        return NULL;
    n->a = expr;
    n->v = vb_vec(&ops);
    return n;
}

static struct tnode *p_not(struct parser *P)
{
    if (is_name(cur(P), "not")) {
        struct tnode *n = mk(P, N_NOT, cur(P)->line);
        next(P);
        if (!n || !enter(P) || !(n->a = p_not(P)))
            return NULL;
        return LEAVE(P, n);
    }
    return p_compare(P);
}

static struct tnode *p_and(struct parser *P)
{
    struct tnode *left = p_not(P);
    while (left && is_name(cur(P), "and")) {
        struct tnode *n = mk(P, N_AND, cur(P)->line);
        next(P);
        if (!n || !(n->b = p_not(P)))
            return NULL;
        n->a = left;
        left = n;
    }
    return left;
}

static struct tnode *p_or(struct parser *P)
{
    struct tnode *left = p_and(P);
    while (left && is_name(cur(P), "or")) {
        struct tnode *n = mk(P, N_OR, cur(P)->line);
        next(P);
        if (!n || !(n->b = p_and(P)))
            return NULL;
        n->a = left;
        left = n;
    }
    return left;
}

static struct tnode *p_condexpr(struct parser *P)
{
    struct tnode *e1 = p_or(P);
    while (e1 && is_name(cur(P), "if")) {
        struct tnode *n = mk(P, N_COND, cur(P)->line);
        next(P);
        if (!n || !(n->a = p_or(P)))
            return NULL;
        n->b = e1;
        if (is_name(cur(P), "else")) {
            next(P);
            if (!enter(P) || !(n->c = p_condexpr(P)))
                return NULL;
            P->nest--;
        }
        e1 = n;
    }
    return e1;
}

static struct tnode *p_expression(struct parser *P, bool condexpr)
{
    if (!enter(P))
        return NULL;
    struct tnode *n = condexpr ? p_condexpr(P) : p_or(P);
    return LEAVE(P, n);
}

static bool tuple_end(struct parser *P, const char *extra_end)
{
    struct ttok *tk = cur(P);
    if (tk->type == TK_VAR_END || tk->type == TK_BLOCK_END || is_op(tk, O_RPAREN))
        return true;
    return extra_end && is_name(tk, extra_end);
}

static struct tnode *p_tuple(struct parser *P, bool simplified, bool condexpr, const char *extra_end,
                             bool explicit_paren)
{
    uint32_t line = cur(P)->line;
    struct vb args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect_op(P, O_COMMA, ","))
            return NULL;
        if (tuple_end(P, extra_end))
            break;
        struct tnode *x = simplified ? p_primary(P) : p_expression(P, condexpr);
        if (!x || !vb_push(P, &args, x))
            return NULL;
        if (is_op(cur(P), O_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_paren) {
            char b[80];
            return pfail(P, cur(P)->line, CAIRN_EFORMAT, "Expected an expression, got '%s'",
                         describe(cur(P), b, sizeof b));
        }
    }
    struct tnode *n = mk(P, N_TUPLE, line);
    if (!n)
        return NULL;
    n->v = vb_vec(&args);
    return n;
}

/* ---- statements ---- */

static bool p_subparse(struct parser *P, const char *const *end_tokens, struct nvec *out);

static bool can_assign(const struct tnode *n)
{
    if (n->kind == N_NAME)
        return true;
    if (n->kind == N_TUPLE) {
        for (uint32_t i = 0; i < n->v.n; i++)
            if (!can_assign(n->v.v[i]))
                return false;
        return true;
    }
    return false;
}

static bool uses_name(const struct tnode *n, int sym);

static struct tnode *p_assign_target(struct parser *P, bool with_namespace, const char *extra_end)
{
    struct ttok *tk = cur(P);
    if (with_namespace && tk->type == TK_NAME && is_op(look(P), O_DOT)) {
        struct tnode *n = mk(P, N_NSREF, tk->line);
        if (!n)
            return NULL;
        n->id = sym_intern(P->t, tk->p, tk->n);
        if (n->id < 0)
            return poom(P);
        next(P);
        next(P);
        if (cur(P)->type != TK_NAME)
            return pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected name after '.'");
        n->s = cur(P)->p;
        n->sn = cur(P)->n;
        next(P);
        return n;
    }
    struct tnode *n = p_tuple(P, true, true, extra_end, false);
    if (!n)
        return NULL;
    if (!can_assign(n))
        return pfail(P, n->line, CAIRN_EFORMAT, "can't assign to this expression");
    if (extra_end && uses_name(n, SYM_LOOP))
        return pfail(P, n->line, CAIRN_EFORMAT, "Can't assign to special loop variable in for-loop target");
    return n;
}

static bool p_statements(struct parser *P, const char *const *end_tokens, bool drop_needle, struct nvec *out)
{
    if (is_op(cur(P), O_COLON))
        next(P);
    if (!expect_type(P, TK_BLOCK_END, "%}"))
        return false;
    if (!p_subparse(P, end_tokens, out))
        return false;
    if (cur(P)->type == TK_EOF) {
        char want[160] = "";
        for (const char *const *e = end_tokens; *e; e++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", e == end_tokens ? "" : " or ", *e);
        pfail(P, cur(P)->line, CAIRN_EFORMAT, "Unexpected end of template. Jinja was looking for the following tags: %s.", want);
        return false;
    }
    if (drop_needle)
        next(P);
    return true;
}

static struct tnode *p_param_list(struct parser *P, struct tnode *n)
{
    struct vb params = {0};
    bool defaults = false;
    if (!expect_op(P, O_LPAREN, "("))
        return NULL;
    while (!is_op(cur(P), O_RPAREN)) {
        if (params.n && !expect_op(P, O_COMMA, ","))
            return NULL;
        if (cur(P)->type != TK_NAME)
            return pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected parameter name");
        struct tnode *pn = mk(P, N_PARAM, cur(P)->line);
        if (!pn)
            return NULL;
        pn->id = sym_intern(P->t, cur(P)->p, cur(P)->n);
        if (pn->id < 0)
            return poom(P);
        pn->s = P->t->syms[pn->id].p;
        pn->sn = cur(P)->n;
        next(P);
        if (is_op(cur(P), O_ASSIGN)) {
            next(P);
            if (!(pn->a = p_expression(P, true)))
                return NULL;
            defaults = true;
        } else if (defaults) {
            return pfail(P, pn->line, CAIRN_EFORMAT, "non-default argument follows default argument");
        }
        if (!vb_push(P, &params, pn))
            return NULL;
    }
    next(P);
    n->w = vb_vec(&params);
    return n;
}

static bool uses_name_vec(const struct nvec *v, int sym)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (uses_name(v->v[i], sym))
            return true;
    return false;
}

static bool uses_name(const struct tnode *n, int sym)
{
    if (!n)
        return false;
    if (n->kind == N_NAME)
        return n->id == sym;
    return uses_name(n->a, sym) || uses_name(n->b, sym) || uses_name(n->c, sym) ||
           uses_name_vec(&n->v, sym) || uses_name_vec(&n->w, sym);
}

static void macro_flags(struct tnode *n)
{
    if (uses_name_vec(&n->v, SYM_CALLER))
        n->flags |= NF_USES_CALLER;
    if (uses_name_vec(&n->v, SYM_VARARGS))
        n->flags |= NF_USES_VARARGS;
    if (uses_name_vec(&n->v, SYM_KWARGS))
        n->flags |= NF_USES_KWARGS;
    for (uint32_t i = 0; i < n->w.n; i++) {
        if (n->w.v[i]->id == SYM_VARARGS)
            n->flags &= (uint16_t)~NF_USES_VARARGS;
        if (n->w.v[i]->id == SYM_KWARGS)
            n->flags &= (uint16_t)~NF_USES_KWARGS;
        if (n->w.v[i]->id == SYM_CALLER)
            n->flags &= (uint16_t)~NF_USES_CALLER;
    }
}

/* One parser per tag: each starts at the tag name, line its line. */

static struct tnode *p_if(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_IF, line);
    if (!n)
        return NULL;
    next(P);
    struct tnode *node = n;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    for (;;) {
        if (!(node->a = p_tuple(P, false, false, NULL, false)))
            return NULL;
        if (!p_statements(P, ends, false, &node->v))
            return NULL;
        struct ttok *t2 = cur(P);
        next(P);
        if (is_name(t2, "elif")) {
            struct tnode *e = mk(P, N_IF, cur(P)->line);
            struct vb w = {0};
            if (!e || !vb_push(P, &w, e))
                return NULL;
            e->flags |= NF_ELIF;
            node->w = vb_vec(&w);
            node = e;
            continue;
        }
        if (is_name(t2, "else") && !p_statements(P, endif, true, &node->w))
            return NULL;
        break;
    }
    return n;
}

static struct tnode *p_for(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_FOR, line);
    if (!n)
        return NULL;
    next(P);
    if (!(n->a = p_assign_target(P, false, "in")))
        return NULL;
    if (!is_name(cur(P), "in"))
        return pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected 'in' in for loop");
    next(P);
    if (!(n->b = p_tuple(P, false, false, "recursive", false)))
        return NULL;
    if (is_name(cur(P), "if")) {
        next(P);
        if (!(n->c = p_expression(P, true)))
            return NULL;
    }
    if (is_name(cur(P), "recursive"))
        return pfail(P, line, CAIRN_EUNSUPPORTED, "recursive for loops are not supported");
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    if (!p_statements(P, ends, false, &n->v))
        return NULL;
    bool has_else = is_name(cur(P), "else");
    next(P);
    if (has_else && !p_statements(P, endfor, true, &n->w))
        return NULL;
    return n;
}

static struct tnode *p_set(struct parser *P, uint32_t line)
{
    struct tnode *n;
    next(P);
    struct tnode *target = p_assign_target(P, true, NULL);
    if (!target)
        return NULL;
    if (is_op(cur(P), O_ASSIGN)) {
        next(P);
        if (!(n = mk(P, N_SET, line)) || !(n->b = p_tuple(P, false, true, NULL, false)))
            return NULL;
        n->a = target;
        return n;
    }
    if (!(n = mk(P, N_SETBLOCK, line)))
        return NULL;
    n->a = target;
    if (is_op(cur(P), O_PIPE) && !(n->b = p_filter(P, NULL, false)))
        return NULL;
    static const char *const ends[] = {"endset", NULL};
    if (!p_statements(P, ends, true, &n->v))
        return NULL;
    return n;
}

static struct tnode *p_macro(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_MACRO, line);
    if (!n)
        return NULL;
    next(P);
    if (cur(P)->type != TK_NAME)
        return pfail(P, cur(P)->line, CAIRN_EFORMAT, "expected macro name");
    n->id = sym_intern(P->t, cur(P)->p, cur(P)->n);
    if (n->id < 0)
        return poom(P);
    n->s = P->t->syms[n->id].p;
    n->sn = cur(P)->n;
    next(P);
    static const char *const ends[] = {"endmacro", NULL};
    if (!p_param_list(P, n) || !p_statements(P, ends, true, &n->v))
        return NULL;
    macro_flags(n);
    return n;
}

static struct tnode *p_callblock(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_CALLBLOCK, line);
    if (!n)
        return NULL;
    next(P);
    if (is_op(cur(P), O_LPAREN) && !p_param_list(P, n))
        return NULL;
    if (!(n->a = p_expression(P, true)))
        return NULL;
    if (n->a->kind != N_CALL)
        return pfail(P, line, CAIRN_EFORMAT, "expected call");
    static const char *const ends[] = {"endcall", NULL};
    if (!p_statements(P, ends, true, &n->v))
        return NULL;
    macro_flags(n);
    return n;
}

static struct tnode *p_filterblock(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_FILTERBLOCK, line);
    if (!n)
        return NULL;
    next(P);
    if (!(n->a = p_filter(P, NULL, true)))
        return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    if (!p_statements(P, ends, true, &n->v))
        return NULL;
    return n;
}

static struct tnode *p_with(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_WITH, line);
    if (!n)
        return NULL;
    next(P);
    struct vb assigns = {0};
    while (cur(P)->type != TK_BLOCK_END) {
        if (assigns.n && !expect_op(P, O_COMMA, ","))
            return NULL;
        struct tnode *s = mk(P, N_SET, cur(P)->line);
        if (!s || !(s->a = p_assign_target(P, false, NULL)))
            return NULL;
        if (!expect_op(P, O_ASSIGN, "=") || !(s->b = p_expression(P, true)) || !vb_push(P, &assigns, s))
            return NULL;
    }
    n->w = vb_vec(&assigns);
    static const char *const ends[] = {"endwith", NULL};
    if (!p_statements(P, ends, true, &n->v))
        return NULL;
    return n;
}

static struct tnode *p_generation(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, N_SCOPE, line);
    if (!n)
        return NULL;
    next(P);
    static const char *const ends[] = {"endgeneration", NULL};
    if (!p_statements(P, ends, true, &n->v))
        return NULL;
    return n;
}

static struct tnode *p_loop_control(struct parser *P, uint32_t line)
{
    struct tnode *n = mk(P, is_name(cur(P), "break") ? N_BREAK : N_CONTINUE, line);
    if (!n)
        return NULL;
    next(P);
    return n;
}

/* {% print a, b %}: one output per expression */
static struct tnode *p_print(struct parser *P, uint32_t line)
{
    next(P);
    struct vb outs = {0};
    while (cur(P)->type != TK_BLOCK_END) {
        if (outs.n && !expect_op(P, O_COMMA, ","))
            return NULL;
        struct tnode *o = mk(P, N_OUTPUT, cur(P)->line);
        if (!o || !(o->a = p_expression(P, true)) || !vb_push(P, &outs, o))
            return NULL;
    }
    struct tnode *n = mk(P, N_SCOPE, line);
    if (!n)
        return NULL;
    n->flags = 1; /* not a new scope: printed in place */
    n->v = vb_vec(&outs);
    return n;
}

static const struct {
    const char *name;
    struct tnode *(*parse)(struct parser *P, uint32_t line);
} tags[] = {
    {"if", p_if}, {"for", p_for}, {"set", p_set}, {"macro", p_macro}, {"call", p_callblock},
    {"filter", p_filterblock}, {"with", p_with}, {"generation", p_generation}, {"break", p_loop_control},
    {"continue", p_loop_control}, {"print", p_print},
};

/* jinja2 has these; this interpreter refuses templates that use them */
static const char *const tags_unsupported[] = {"extends", "include", "import", "from", "block", "autoescape"};

static struct tnode *p_statement(struct parser *P)
{
    struct ttok *tk = cur(P);
    uint32_t line = tk->line;
    if (tk->type != TK_NAME)
        return pfail(P, line, CAIRN_EFORMAT, "tag name expected");
    if (!enter(P))
        return NULL;
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++)
        if (is_name(tk, tags[i].name)) {
            struct tnode *n = tags[i].parse(P, line);
            return n ? LEAVE(P, n) : NULL;
        }
    for (size_t i = 0; i < sizeof tags_unsupported / sizeof tags_unsupported[0]; i++)
        if (is_name(tk, tags_unsupported[i]))
            return pfail(P, line, CAIRN_EUNSUPPORTED, "tag '%.*s' is not supported", (int)tk->n, tk->p);
    return pfail(P, line, CAIRN_EFORMAT, "Encountered unknown tag '%.*s'.", (int)(tk->n > 60 ? 60 : tk->n), tk->p);
}

static bool p_subparse(struct parser *P, const char *const *end_tokens, struct nvec *out)
{
    struct vb body = {0};
    for (;;) {
        struct ttok *tk = cur(P);
        if (tk->type == TK_EOF)
            break;
        if (tk->type == TK_DATA) {
            struct tnode *d = mk(P, N_DATA, tk->line);
            if (!d || !vb_push(P, &body, d))
                return false;
            d->s = tk->p;
            d->sn = tk->n;
            next(P);
        } else if (tk->type == TK_VAR_BEGIN) {
            next(P);
            struct tnode *o = mk(P, N_OUTPUT, tk->line);
            if (!o || !(o->a = p_tuple(P, false, true, NULL, false)) || !vb_push(P, &body, o))
                return false;
            if (!expect_type(P, TK_VAR_END, "}}"))
                return false;
        } else if (tk->type == TK_BLOCK_BEGIN) {
            next(P);
            if (end_tokens)
                for (const char *const *e = end_tokens; *e; e++)
                    if (is_name(cur(P), *e)) {
                        *out = vb_vec(&body);
                        return true;
                    }
            struct tnode *s = p_statement(P);
            if (!s || !vb_push(P, &body, s))
                return false;
            if (!expect_type(P, TK_BLOCK_END, "%}"))
                return false;
        } else {
            char b[80];
            pfail(P, tk->line, CAIRN_EFORMAT, "unexpected '%s'", describe(tk, b, sizeof b));
            return false;
        }
    }
    *out = vb_vec(&body);
    return true;
}

/* ---- entry points ---- */

static const char *const builtin_names[SYM_BUILTIN_COUNT] = {
    "loop", "varargs", "kwargs", "caller", "range", "dict", "namespace", "raise_exception",
    "strftime_now", "cycler", "joiner", "lipsum",
};

void tmpl_free(struct tmpl *t)
{
    if (!t)
        return;
    if (t->loc)
        freelocale(t->loc);
    pcre2_code_free(t->nonprint);
    struct tarena ar = t->ar;
    tmpl_arena_free(&ar);
}

int tmpl_parse(struct tmpl **out, const char *src, size_t len, char *err, size_t errlen)
{
    *out = NULL;
    if (!src && len)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no template text");
    if (!tmpl_utf8_valid(src, len))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "template is not valid UTF-8");
    struct tarena ar = {0};
    struct tmpl *t = tmpl_alloc(&ar, sizeof *t);
    if (!t)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    t->ar = ar;
    int rc = CAIRN_ENOMEM;
    for (int i = 0; i < SYM_BUILTIN_COUNT; i++)
        if (sym_intern(t, builtin_names[i], strlen(builtin_names[i])) != i)
            goto err;
    t->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    int ec;
    PCRE2_SIZE eo;
    t->nonprint = pcre2_compile((PCRE2_SPTR) "[\\p{C}\\p{Z}]", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    if (!t->nonprint)
        goto err;
    struct ttok *toks;
    size_t ntoks;
    if ((rc = tmpl_lex(t, src, len, &toks, &ntoks, err, errlen)))
        goto err_quiet;
    struct parser P = {.t = t, .tk = toks, .n = ntoks, .err = err, .errlen = errlen};
    if (!p_subparse(&P, NULL, &t->body)) {
        rc = P.rc ? P.rc : CAIRN_EFORMAT;
        goto err_quiet;
    }
    if ((rc = tmpl_check(t, err, errlen)))
        goto err_quiet;
    *out = t;
    return 0;
err:
    cairn_fail(err, errlen, rc, "out of memory");
err_quiet:
    tmpl_free(t);
    return rc;
}
