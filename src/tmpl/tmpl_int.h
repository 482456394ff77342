/* Private to the template interpreter (tmpl_*.c): values, syntax tree, render context.
 * Every value and node lives in an arena: the parse arena of a template or the arena
 * of one render, released in one place. */
#ifndef CAIRN_TMPL_TMPL_INT_H
#define CAIRN_TMPL_TMPL_INT_H

#include "tmpl/tmpl.h"

#include <locale.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- arena ---- */

struct tarena_chunk;
struct tarena {
    struct tarena_chunk *head;
    size_t total;  /* bytes taken from malloc */
    size_t limit;  /* 0: none */
    bool over;     /* an allocation was refused for the limit */
};

/* Zeroed memory, aligned for any type; NULL when malloc fails or the limit is hit. */
void *tmpl_alloc(struct tarena *a, size_t n);
void tmpl_arena_free(struct tarena *a);

/* memcpy that accepts NULL pointers when n is 0 (empty lists have no storage). */
static inline void tmpl_copy(void *dst, const void *src, size_t n)
{
    if (n)
        __builtin_memcpy(dst, src, n);
}

/* ---- values ---- */

enum tv_type {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_TUPLE, TV_DICT,
    TV_ITER, TV_NS, TV_MACRO, TV_FUNC, TV_LOOP,
    TV_MISSING /* internal: an argument not given */
};

/* Kinds of undefined, for the message an operation on it raises. */
enum tv_undef {
    TU_NAME,   /* 'x' is undefined */
    TU_ATTR,   /* 'dict object' has no attribute 'x' */
    TU_ELEM,   /* list object has no element 5 (u.i) */
    TU_HINT,   /* the text itself */
    TU_UNSAFE, /* access to attribute 'x' of 'list' object is unsafe. (SecurityError) */
};

enum titer_kind { TI_GEN, TI_REVERSE, TI_ITEMS, TI_KEYS, TI_VALUES };

#define TVF_MARKUP 1 /* TV_STR: markupsafe.Markup (from |safe, |escape) */
#define TVF_GROUP 2  /* TV_TUPLE: groupby's (grouper, list) with those attribute names */

struct tlist;
struct tdict;
struct titer;
struct tmacro;
struct tfunc;
struct tloop;

struct tv {
    uint8_t t;   /* enum tv_type */
    uint8_t f;   /* TV_STR: TVF_*; TV_UNDEF: enum tv_undef */
    uint8_t ot;  /* TV_UNDEF: type of the object the failed access was made on */
    union {
        bool b;
        int64_t i;
        double d;
        struct { const char *p; size_t n; } s; /* TV_STR; TV_UNDEF: name or hint */
        struct tlist *l;   /* TV_LIST, TV_TUPLE */
        struct tdict *m;   /* TV_DICT, TV_NS (attributes) */
        struct titer *it;
        struct tmacro *mac;
        struct tfunc *fn;
        struct tloop *lp;
    } u;
};

struct tlist { size_t n, cap; struct tv *v; };
/* Keys in insertion order; dicts of more than TMPL_INDEX_MIN keys also get a hash index
 * of their string keys (idx: slot -> position + 1, 0 empty; idxcap a power of two). */
struct tdict { size_t n, cap; struct tv *k, *v; uint32_t *idx; size_t idxcap; };
#define TMPL_INDEX_MIN 16
struct titer { uint8_t kind; size_t pos; struct tlist *l; };
struct tfunc { int id; struct tv self; };  /* builtin function, or method bound to self */
struct tnode;
struct tframe;
struct tmacro { const struct tnode *def; struct tframe *closure; const char *name; size_t namelen; };
struct tloop { struct tlist *items; int64_t i0; struct tv last_changed; bool changed_set; };

/* ---- syntax tree ---- */

enum tnode_kind {
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT,
    N_NEG, N_POS, N_BIN, N_CONCAT, N_COMPARE, N_OPERAND, N_AND, N_OR, N_COND, N_LIST,
    N_TUPLE, N_DICT, N_PAIR, N_KW, N_NSREF, N_PARAM,
    /* statements */
    N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_SCOPE, N_WITH,
};

enum tbinop { B_ADD, B_SUB, B_MUL, B_DIV, B_FLOORDIV, B_MOD, B_POW };
enum tcmpop { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

#define NF_USES_CALLER 1
#define NF_USES_VARARGS 2
#define NF_USES_KWARGS 4
#define NF_UNKNOWN 8 /* filter/test unknown to jinja2: an error when evaluated */
#define NF_ELIF 16   /* N_IF from an {% elif %} */

/* Names a frame starts with as undefined: jinja2 resolves names per frame at compile
 * time, and a name first assigned in a frame (not read before, not known outside)
 * starts there as undefined rather than falling back to an outer value or a template
 * variable. */
struct tscope {
    const uint32_t *undef, *undef_else; /* N_FOR: body and else frames */
    uint32_t nundef, nundef_else;
};

struct nvec { struct tnode **v; uint32_t n; };

/* Children by kind:
 *  N_CONST k | N_NAME id=symbol | N_GETATTR a.s (id: method id or -1) | N_GETITEM a[b]
 *  N_SLICE a:b:c (NULL parts) | N_CALL a(v..., w=kw...) | N_FILTER a|s(v, w) id=filter
 *  N_TEST a is s(v, w) id=test | N_NOT/N_NEG/N_POS a | N_BIN a op b | N_CONCAT v
 *  N_COMPARE a then v=N_OPERAND(op, a) | N_AND/N_OR a b | N_COND b if a else c
 *  N_LIST/N_TUPLE v | N_DICT v=N_PAIR(a: b) | N_KW s=a | N_NSREF id.s | N_PARAM id=a
 *  N_DATA s | N_OUTPUT a | N_IF a: v else w | N_FOR a in b if c: v else w
 *  N_SET a = b | N_SETBLOCK a = v|b | N_MACRO id(w params): v | N_CALLBLOCK a(w params): v
 *  N_FILTERBLOCK a: v | N_SCOPE v | N_WITH w=N_SET...: v */
struct tnode {
    uint8_t kind, op;
    uint16_t flags;
    uint32_t line;
    int32_t id;
    struct tnode *a, *b, *c;
    struct nvec v, w;
    struct tv k;
    const char *s;
    size_t sn;
    const struct tscope *scope; /* frames: N_FOR, N_MACRO, N_CALLBLOCK, N_SETBLOCK, ... */
};

/* Symbols interned at parse; the first ones are the names the interpreter knows. */
enum {
    SYM_LOOP, SYM_VARARGS, SYM_KWARGS, SYM_CALLER, SYM_RANGE, SYM_DICT, SYM_NAMESPACE,
    SYM_RAISE_EXCEPTION, SYM_STRFTIME_NOW, SYM_CYCLER, SYM_JOINER, SYM_LIPSUM, SYM_BUILTIN_COUNT
};

struct tsym { const char *p; size_t n; };

struct tmpl {
    struct tarena ar;
    struct nvec body;
    struct tscope root;
    struct tsym *syms;
    uint32_t nsyms, capsyms;
    uint32_t *hash;     /* open addressing: symbol index + 1, 0 empty */
    uint32_t hashcap;
    locale_t loc;       /* C.UTF-8 for case mapping of non-ASCII letters; 0 if absent */
    pcre2_code *nonprint; /* [\p{C}\p{Z}]: characters repr() escapes */
};

/* Symbol id of a name, or -1 when the template never names it. */
int tmpl_sym_find(const struct tmpl *t, const char *p, size_t n);

/* After parsing (tmpl_check.c): bounds the tree depth and size, refuses what jinja2's
 * compiler refuses, and sets the scope of each frame node. Returns 0 or a CAIRN_E*
 * error with err filled. */
int tmpl_check(struct tmpl *t, char *err, size_t errlen);

/* ---- lexer (tmpl_lex.c) ---- */

enum ttok_type {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME,
    TK_STRING, TK_INT, TK_FLOAT, TK_OP
};

enum ttok_op {
    O_ADD, O_SUB, O_DIV, O_FLOORDIV, O_MUL, O_MOD, O_POW, O_TILDE, O_LBRACKET, O_RBRACKET,
    O_LPAREN, O_RPAREN, O_LBRACE, O_RBRACE, O_EQ, O_NE, O_GT, O_GTEQ, O_LT, O_LTEQ,
    O_ASSIGN, O_DOT, O_COLON, O_PIPE, O_COMMA, O_SEMICOLON
};

struct ttok {
    uint8_t type, op;
    uint32_t line;
    const char *p;  /* TK_NAME, TK_DATA: text; TK_STRING: decoded value (arena) */
    size_t n;
    int64_t i;
    double d;
};

/* Splits src into tokens (allocated in t->ar). Returns 0 or a CAIRN_E* error. */
int tmpl_lex(struct tmpl *t, const char *src, size_t len, struct ttok **toks, size_t *ntoks,
             char *err, size_t errlen);

/* ---- string builder (malloc'd, copied to an arena when done) ---- */

struct tsb {
    char *p;
    size_t n, cap, limit;
    struct tarena *acct;  /* the render's memory budget this buffer counts against */
    bool fail;            /* malloc failed or a limit passed */
};

struct tctx;
/* An empty builder limited to the render's string size, counted in its memory budget. */
void tmpl_sb_init(struct tsb *b, struct tctx *c);
void tmpl_sb_free(struct tsb *b);
void tmpl_sb_put(struct tsb *b, const char *s, size_t n);
void tmpl_sb_putc(struct tsb *b, char c);
void tmpl_sb_puts(struct tsb *b, const char *s);
void tmpl_sb_printf(struct tsb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- UTF-8 and Python character classes ---- */

/* Decodes the code point at p (valid UTF-8 assumed, n >= 1); returns its byte length. */
size_t tmpl_utf8_dec(const char *p, size_t n, uint32_t *cp);
size_t tmpl_utf8_enc(uint32_t cp, char *out);
bool tmpl_utf8_valid(const char *p, size_t n);
size_t tmpl_cp_count(const char *p, size_t n);
/* Byte offset of code point index i (clamped to the string). */
size_t tmpl_cp_off(const char *p, size_t n, int64_t i);
bool tmpl_py_space(uint32_t cp);   /* str.isspace() */

/* ---- render context ---- */

struct tkw { const char *name; size_t n; struct tv v; };

struct tbind { uint32_t sym; struct tv v; };
struct tframe {
    struct tframe *parent;
    struct tbind *b;
    uint32_t n, cap;
    uint32_t *idx;     /* over TMPL_INDEX_MIN bindings: symbol hash -> position + 1 */
    uint32_t idxcap;
};

struct tgvar { const json_t *j; struct tv v; uint8_t state; /* 0 absent 1 json 2 converted */ };

struct tctx {
    const struct tmpl *t;
    struct tarena ar;
    struct tsb *out;
    uint64_t steps, max_steps;
    uint64_t next_clock;       /* steps at which to look at the clock next */
    int64_t t0_ns, max_ns;     /* the render's start and wall-clock budget */
    int depth, macro_depth, max_depth;
    size_t max_str;
    struct tframe *root;
    struct tgvar *g;           /* per symbol */
    pcre2_match_data *md;
    struct tv filter_input;    /* input of a {% filter %} or {% set x | f %} chain */
    char *err;
    size_t errlen;
    bool err_set;
};

/* Nesting of evaluations and statements; keeps the C stack bounded (a few MiB at most). */
#define TMPL_MAX_NESTING 3000

#define TMPL_CTL_BREAK 1
#define TMPL_CTL_CONTINUE 2

/* Sets the error message (first one wins) with "line N: " when at is not NULL. */
int tmpl_err(struct tctx *c, const struct tnode *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int tmpl_oom(struct tctx *c, const struct tnode *at);
/* The error an operation on an undefined value raises. */
int tmpl_undef_err(struct tctx *c, const struct tnode *at, const struct tv *u);
int tmpl_step(struct tctx *c, const struct tnode *at);
/* A step of a builtin, weighted by what it may touch: one more step for every
 * TMPL_UNITS_PER_STEP bytes of the strings, or entries of the lists and dicts, among in
 * (may be NULL) and args, so that a loop of cheap-looking calls on megabytes runs out of
 * steps rather than only of time. */
#define TMPL_UNITS_PER_STEP 64
int tmpl_charge(struct tctx *c, const struct tnode *at, const struct tv *in, const struct tv *args, size_t nargs);

/* value constructors and containers (tmpl_val.c) */
static inline struct tv tv_none(void) { struct tv v = {.t = TV_NONE}; return v; }
static inline struct tv tv_bool(bool b) { struct tv v = {.t = TV_BOOL}; v.u.b = b; return v; }
static inline struct tv tv_int(int64_t i) { struct tv v = {.t = TV_INT}; v.u.i = i; return v; }
static inline struct tv tv_float(double d) { struct tv v = {.t = TV_FLOAT}; v.u.d = d; return v; }
static inline struct tv tv_str(const char *p, size_t n)
{
    struct tv v = {.t = TV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline struct tv tv_missing(void) { struct tv v = {.t = TV_MISSING}; return v; }
static inline struct tv tv_undef_hint(const char *hint)
{
    struct tv v = {.t = TV_UNDEF, .f = TU_HINT};
    v.u.s.p = hint;
    v.u.s.n = hint ? __builtin_strlen(hint) : 0;
    return v;
}
/* An undefined value from a failed lookup of name (kind: TU_NAME, TU_ATTR, TU_UNSAFE) on
 * an object of type ot. */
static inline struct tv tv_undef_attr(int ot, const char *name, size_t n, int kind)
{
    struct tv u = {.t = TV_UNDEF, .f = (uint8_t)kind, .ot = (uint8_t)ot};
    u.u.s.p = name;
    u.u.s.n = n;
    return u;
}
static inline bool tv_is_num(const struct tv *v) { return v->t == TV_BOOL || v->t == TV_INT || v->t == TV_FLOAT; }
static inline bool tv_is_intlike(const struct tv *v) { return v->t == TV_BOOL || v->t == TV_INT; }
static inline int64_t tv_as_int(const struct tv *v) { return v->t == TV_BOOL ? (int64_t)v->u.b : v->u.i; }
static inline double tv_as_float(const struct tv *v)
{
    return v->t == TV_FLOAT ? v->u.d : (double)tv_as_int(v);
}

struct tlist *tmpl_list_new(struct tctx *c, size_t cap);
int tmpl_list_push(struct tctx *c, struct tlist *l, struct tv v);
struct tdict *tmpl_dict_new(struct tctx *c, size_t cap);
int tmpl_dict_set(struct tctx *c, struct tdict *d, struct tv k, struct tv v);
/* Index of key k (Python equality), or -1. */
long tmpl_dict_find(const struct tdict *d, const struct tv *k);
long tmpl_dict_find_str(const struct tdict *d, const char *p, size_t n);
/* Builds the hash index of a dict filled directly (not through tmpl_dict_set); a dict
 * without one still works, by scanning. */
void tmpl_dict_index(struct tctx *c, struct tdict *d);
/* Copies bytes into the render arena as a string value (flags 0). */
int tmpl_str_new(struct tctx *c, const char *p, size_t n, struct tv *out);
int tmpl_sb_to_str(struct tctx *c, struct tsb *b, struct tv *out);

bool tmpl_truthy(const struct tv *v);
bool tmpl_equal(const struct tv *a, const struct tv *b);
/* Python's a < b as -1/0/1 ordering; TypeError when the types do not order. */
int tmpl_compare(struct tctx *c, const struct tnode *at, const struct tv *a, const struct tv *b, int *res);
bool tmpl_hashable(const struct tv *v);
const char *tmpl_type_name(const struct tv *v);
const char *tmpl_type_name_of(int t);

/* str(v) and repr(v) appended to b. */
int tmpl_to_str(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v);
int tmpl_repr(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v);
/* str(v) as a value (strings are returned as they are). */
int tmpl_str_of(struct tctx *c, const struct tnode *at, const struct tv *v, struct tv *out);
void tmpl_float_repr(double d, char out[32]);

/* JSON in and out. */
int tmpl_from_json(struct tctx *c, const json_t *j, struct tv *out, int depth);
struct tjson_opts {
    bool ensure_ascii, sort_keys;
    const char *indent;  /* NULL: compact */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
};
int tmpl_to_json(struct tctx *c, const struct tnode *at, struct tsb *b, const struct tv *v,
                 const struct tjson_opts *o, int level);

/* operations on values (tmpl_ops.c) */
/* obj.name as the sandbox does it (falling back to obj[name]); undefined when missing. */
int tmpl_getattr(struct tctx *c, const struct tnode *at, const struct tv *obj, const char *name,
                 size_t n, struct tv *out);
/* obj[key] as the sandbox does it (falling back to obj.key); undefined when missing. */
int tmpl_getitem(struct tctx *c, const struct tnode *at, const struct tv *obj, const struct tv *key,
                 struct tv *out);
/* The items a for-loop over v visits (generators are consumed); not to be changed. */
int tmpl_iterate(struct tctx *c, const struct tnode *at, const struct tv *v, struct tlist **out);
/* Python's `needle in hay`. */
int tmpl_contains(struct tctx *c, const struct tnode *at, const struct tv *hay, const struct tv *needle,
                  bool *res);
/* len(v); TypeError for values without one. */
int tmpl_len(struct tctx *c, const struct tnode *at, const struct tv *v, int64_t *out);
/* a op b (enum tbinop) with Python's semantics. */
int tmpl_binop(struct tctx *c, const struct tnode *at, int op, const struct tv *a, const struct tv *b,
               struct tv *out);
/* obj[start:stop:step] for the N_GETITEM at (b: the N_SLICE); parts: start, stop and
 * step, TV_NONE when not given. */
int tmpl_slice(struct tctx *c, const struct tnode *at, const struct tv *obj, const struct tv *parts,
               struct tv *out);
/* Whether jinja2's optimizer would evaluate n at compile time (literals and operators on them). */
bool tmpl_const_expr(const struct tnode *n);

/* evaluator services (tmpl_eval.c) */
/* Calls a macro or builtin function value fn. */
int tmpl_call(struct tctx *c, const struct tnode *at, const struct tv *fn, const struct tv *args,
              size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out);

/* library: tests (tmpl_lib.c), filters (tmpl_filter.c), functions and methods
 * (tmpl_func.c), str (tmpl_str.c, tmpl_fmt.c) */
enum { TMPL_ID_UNKNOWN = -1, TMPL_ID_UNSUPPORTED = -2 };
/* Filter id of a name, or TMPL_ID_UNKNOWN / TMPL_ID_UNSUPPORTED. */
int tmpl_filter_id(const char *name, size_t n);
/* Test id of a name, or TMPL_ID_UNKNOWN. */
int tmpl_test_id(const char *name, size_t n);
/* Method id of an attribute name on a value of type t (TV_STR, TV_DICT, ...), or -1;
 * *unsafe is set when the ImmutableSandboxedEnvironment forbids it. */
int tmpl_method_id(int t, const char *name, size_t n, bool *unsafe);
/* in | filter(args, kw) for a filter id. */
int tmpl_apply_filter(struct tctx *c, const struct tnode *at, int id, const struct tv *in,
                      const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw,
                      struct tv *out);
/* in is test(args, kw) for a test id, in *res. */
int tmpl_apply_test(struct tctx *c, const struct tnode *at, int id, const struct tv *in,
                    const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw,
                    bool *res);
/* Calls a builtin function or a method bound to fn->self. */
int tmpl_call_builtin(struct tctx *c, const struct tnode *at, const struct tfunc *fn,
                      const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw,
                      struct tv *out);
/* Builtin function id for a global name symbol, or -1. */
int tmpl_global_func(int sym);
/* Upper/lower-cases a string (Python str.upper/lower). */
int tmpl_str_case(struct tctx *c, const struct tv *s, bool upper, struct tv *out);
/* markupsafe.escape(): Markup values unchanged, others str()'d and escaped. */
int tmpl_html_escape(struct tctx *c, const struct tv *in, struct tv *out);
/* printf-style formatting, str % args. */
int tmpl_percent_format(struct tctx *c, const struct tnode *at, const struct tv *fmt,
                        const struct tv *args, struct tv *out);

#endif
