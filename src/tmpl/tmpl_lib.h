/* Private to the template library (tmpl_lib.c, tmpl_filter.c, tmpl_func.c, tmpl_str.c,
 * tmpl_fmt.c): ids of builtin functions and methods, the helpers filters and methods
 * share, and the string helpers the filters share with str's methods. */
#ifndef CAIRN_TMPL_TMPL_LIB_H
#define CAIRN_TMPL_TMPL_LIB_H

#include "tmpl/tmpl_int.h"

enum tfunc_id {
    /* global functions */
    G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME, G_CYCLER, G_JOINER, G_LIPSUM, G_JOINER_CALL,
    /* str methods */
    MS_FIRST = 100,
    MS_CAPITALIZE = MS_FIRST, MS_CASEFOLD, MS_CENTER, MS_COUNT, MS_ENDSWITH, MS_FIND, MS_FORMAT, MS_INDEX,
    MS_ISALNUM, MS_ISALPHA, MS_ISASCII, MS_ISDECIMAL, MS_ISDIGIT, MS_ISLOWER, MS_ISNUMERIC, MS_ISSPACE,
    MS_ISTITLE, MS_ISUPPER, MS_JOIN, MS_LJUST, MS_LOWER, MS_LSTRIP, MS_PARTITION, MS_REMOVEPREFIX,
    MS_REMOVESUFFIX, MS_REPLACE, MS_RFIND, MS_RINDEX, MS_RJUST, MS_RPARTITION, MS_RSPLIT, MS_RSTRIP,
    MS_SPLIT, MS_SPLITLINES, MS_STARTSWITH, MS_STRIP, MS_SWAPCASE, MS_TITLE, MS_UPPER, MS_ZFILL,
    MS_ENCODE, MS_EXPANDTABS, MS_FORMAT_MAP, MS_ISIDENTIFIER, MS_ISPRINTABLE, MS_MAKETRANS, MS_TRANSLATE,
    MS_LAST,
    /* dict methods */
    MD_CLEAR = 200, MD_COPY, MD_FROMKEYS, MD_GET, MD_ITEMS, MD_KEYS, MD_POP, MD_POPITEM, MD_SETDEFAULT,
    MD_UPDATE, MD_VALUES,
    /* list and tuple methods */
    ML_APPEND = 300, ML_CLEAR, ML_COPY, ML_COUNT, ML_EXTEND, ML_INDEX, ML_INSERT, ML_POP, ML_REMOVE,
    ML_REVERSE, ML_SORT,
    /* loop methods */
    MLOOP_CYCLE = 400, MLOOP_CHANGED,
};

/* Whether an argument was given (tmpl_bind leaves the others TV_MISSING). */
static inline bool tv_given(const struct tv *v) { return v->t != TV_MISSING; }
/* A list as a TV_LIST or TV_TUPLE value (t). */
static inline struct tv tv_list(struct tlist *l, int t)
{
    struct tv v = {.t = (uint8_t)t};
    v.u.l = l;
    return v;
}
/* Whether the NUL-terminated name a is the n bytes at b. */
static inline bool tmpl_name_eq(const char *a, const char *b, size_t n)
{
    return __builtin_strlen(a) == n && !__builtin_memcmp(a, b, n);
}

/* A new list of capacity cap in *l; an error in c when out of memory (tmpl_lib.c). */
int tmpl_lib_list(struct tctx *c, const struct tnode *at, size_t cap, struct tlist **l);
/* Appends v to l; an error in c when out of memory or l is too long. */
int tmpl_lib_push(struct tctx *c, const struct tnode *at, struct tlist *l, struct tv v);
/* The 2-tuple (a, b). */
int tmpl_lib_pair(struct tctx *c, const struct tnode *at, struct tv a, struct tv b, struct tv *out);
/* An iterator of kind (enum titer_kind) over l. */
int tmpl_lib_iter(struct tctx *c, const struct tnode *at, struct tlist *l, int kind, struct tv *out);

/* Python's case mappings that are not one code point to one (tmpl_case.c). */
struct tmpl_case_row {
    uint32_t cp;
    uint32_t up[3];     /* full upper case when several code points, else {0} */
    uint32_t title[3];  /* title case when it differs from upper case, else {0} */
};
const struct tmpl_case_row *tmpl_case_special(uint32_t cp);

/* Binds call arguments to named parameters by Python's rules; slots of parameters not
 * given are TV_MISSING. `fname` names the callee in messages. */
int tmpl_bind(struct tctx *c, const struct tnode *at, const char *fname, const char *const *names, size_t np,
              const struct tv *args, size_t nargs, const struct tkw *kw, size_t nkw, struct tv *slots);

/* Method id of a str attribute name, or -1. */
int tmpl_str_method_id(const char *name, size_t n);
int tmpl_str_method(struct tctx *c, const struct tnode *at, int id, const struct tv *self, const struct tv *args,
                    size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out);
/* str.format(*args, **kw) on fmt (tmpl_fmt.c). */
int tmpl_str_format(struct tctx *c, const struct tnode *at, const struct tv *fmt, const struct tv *args,
                    size_t nargs, const struct tkw *kw, size_t nkw, struct tv *out);
/* str.strip/lstrip/rstrip (which: 1 left, 2 right, 3 both); chars NULL or None: whitespace. */
int tmpl_str_strip(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *chars, int which,
                   struct tv *out);
int tmpl_str_capitalize(struct tctx *c, const struct tv *s, struct tv *out);
/* jinja2's title filter (words start after -, whitespace, (, {, [, <). */
int tmpl_str_title_filter(struct tctx *c, const struct tv *s, struct tv *out);
/* Pads to width code points: align '<', '>', '^' (str.center's split: an odd fill's extra
 * goes left when width is odd) or 'c' (format()'s '^': the extra always goes right). */
int tmpl_str_pad(struct tctx *c, const struct tnode *at, const struct tv *s, int64_t width, uint32_t fill,
                 char align, struct tv *out);
int tmpl_str_replace(struct tctx *c, const struct tnode *at, const struct tv *s, const struct tv *old,
                     const struct tv *new_, int64_t count, struct tv *out);
bool tmpl_str_islower(const struct tctx *c, const struct tv *s);
bool tmpl_str_isupper(const struct tctx *c, const struct tv *s);
/* Python's str.splitlines() boundaries: length of the line break at p, or 0. */
size_t tmpl_linebreak(const char *p, size_t n);

#endif
