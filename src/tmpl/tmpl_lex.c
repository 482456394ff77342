/* Template lexer: jinja2's lexer rules with trim_blocks and lstrip_blocks on.
 * Newlines are normalized to \n and one trailing newline is dropped first, as jinja2
 * does; `{%-`/`-%}` strip all whitespace on that side, `{%+` keeps the indentation
 * lstrip_blocks would remove, `+%}` keeps the newline trim_blocks would remove. */
#include "tmpl/tmpl_int.h"

#include "base/err.h"

#include <stdlib.h>
#include <string.h>

struct lexer {
    struct tmpl *t;
    const char *s;
    size_t n, pos;
    uint32_t line;
    struct ttok *toks;
    size_t ntok, cap;
    bool line_starting;
    char balance[256];
    int nbal;
    char *err;
    size_t errlen;
};

static int lex_fail(struct lexer *L, int code, const char *fmt, const char *arg)
{
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    return cairn_fail(L->err, L->errlen, code, "line %u: %s", L->line, msg);
}

static struct ttok *push(struct lexer *L, int type)
{
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct ttok *nt = tmpl_alloc(&L->t->ar, cap * sizeof *nt);
        if (!nt)
            return NULL;
        if (L->ntok)
            memcpy(nt, L->toks, L->ntok * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    struct ttok *tk = &L->toks[L->ntok++];
    memset(tk, 0, sizeof *tk);
    tk->type = (uint8_t)type;
    tk->line = L->line;
    return tk;
}

static uint32_t count_nl(const char *p, size_t n)
{
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* Length of the Python whitespace run at p. */
static size_t space_run(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tmpl_utf8_dec(p + i, n - i, &cp);
        if (!tmpl_py_space(cp))
            break;
        i += k;
    }
    return i;
}

/* Length of text without trailing Python whitespace (str.rstrip()). */
static size_t rstrip_len(const char *p, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        uint32_t cp;
        tmpl_utf8_dec(p + st, end - st, &cp);
        if (!tmpl_py_space(cp))
            break;
        end = st;
    }
    return end;
}

/* Data before a tag: '-' strips all trailing whitespace; otherwise lstrip_blocks drops
 * the indentation of a block or comment tag that starts its line. */
static size_t strip_data(const struct lexer *L, const char *text, size_t n, char sign, bool is_var)
{
    if (sign == '-')
        return rstrip_len(text, n);
    if (sign == '+' || is_var)
        return n;
    size_t l_pos = 0;
    for (size_t i = n; i > 0; i--)
        if (text[i - 1] == '\n') {
            l_pos = i;
            break;
        }
    if (l_pos > 0 || L->line_starting) {
        if (n > l_pos && space_run(text + l_pos, n - l_pos) == n - l_pos)
            return l_pos;
    }
    return n;
}

static int emit_data(struct lexer *L, const char *p, size_t n)
{
    if (!n)
        return 0;
    struct ttok *tk = push(L, TK_DATA);
    if (!tk)
        return CAIRN_ENOMEM;
    tk->p = p;
    tk->n = n;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80; }
static bool is_name_char(unsigned char c) { return is_name_start(c) || is_digit((char)c); }

/* (\d+_)*\d+ at p: end offset, or 0 when there is no digit. */
static size_t m_digits(const char *s, size_t n, size_t p)
{
    if (p >= n || !is_digit(s[p]))
        return 0;
    for (;;) {
        while (p < n && is_digit(s[p]))
            p++;
        if (p + 1 < n && s[p] == '_' && is_digit(s[p + 1]))
            p++;
        else
            return p;
    }
}

/* jinja2's float_re at pos: end offset or 0. */
static size_t m_float(const char *s, size_t n, size_t pos)
{
    if (pos > 0 && s[pos - 1] == '.')
        return 0;
    size_t p1 = m_digits(s, n, pos);
    if (!p1)
        return 0;
    size_t q = p1;
    if (q < n && s[q] == '.') {
        size_t f = m_digits(s, n, q + 1);
        if (f) {
            if (f < n && (s[f] == 'e' || s[f] == 'E')) {
                size_t e = f + 1;
                if (e < n && (s[e] == '+' || s[e] == '-'))
                    e++;
                size_t ee = m_digits(s, n, e);
                if (ee)
                    return ee;
            }
            return f;
        }
        return 0;
    }
    if (q < n && (s[q] == 'e' || s[q] == 'E')) {
        size_t e = q + 1;
        if (e < n && (s[e] == '+' || s[e] == '-'))
            e++;
        size_t ee = m_digits(s, n, e);
        if (ee)
            return ee;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* jinja2's integer_re at pos; end offset (0: none) and the value. */
static size_t m_int(const char *s, size_t n, size_t pos, int64_t *val, bool *overflow)
{
    *overflow = false;
    uint64_t v = 0;
    if (s[pos] == '0' && pos + 1 < n) {
        char b = (char)(s[pos + 1] | 0x20);
        int base = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 0;
        if (base) {
            size_t p = pos + 2, ndig = 0;
            for (;;) {
                size_t q = p;
                if (q < n && s[q] == '_')
                    q++;
                int d = q < n ? hexval(s[q]) : -1;
                if (d < 0 || d >= base)
                    break;
                if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
                    *overflow = true;
                v = v * (uint64_t)base + (uint64_t)d;
                p = q + 1;
                ndig++;
            }
            if (ndig) {
                if (v > INT64_MAX)
                    *overflow = true;
                *val = (int64_t)v;
                return p;
            }
        }
    }
    if (pos >= n || !is_digit(s[pos]))
        return 0;
    size_t p = pos;
    if (s[pos] == '0') {
        p++;
        for (;;) {
            size_t q = p;
            if (q < n && s[q] == '_')
                q++;
            if (q < n && s[q] == '0')
                p = q + 1;
            else
                break;
        }
        *val = 0;
        return p;
    }
    for (;;) {
        int d = s[p] - '0';
        if (v > (UINT64_MAX - (uint64_t)d) / 10)
            *overflow = true;
        v = v * 10 + (uint64_t)d;
        p++;
        size_t q = p;
        if (q < n && s[q] == '_')
            q++;
        if (q < n && is_digit(s[q]))
            p = q;
        else
            break;
    }
    if (v > INT64_MAX)
        *overflow = true;
    *val = (int64_t)v;
    return p;
}

/* Decodes a string literal's body the way jinja2 does (Python's unicode-escape after
 * backslash-escaping non-ASCII characters). */
static int decode_string(struct lexer *L, const char *p, size_t n, struct ttok *tk)
{
    char *out = tmpl_alloc(&L->t->ar, n * 3 + 1); /* \xe9 style output of "\é" is the longest */
    if (!out)
        return CAIRN_ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] != '\\') {
            out[o++] = p[i++];
            continue;
        }
        if (i + 1 >= n) {  /* cannot happen: the regex needs a char after '\' */
            out[o++] = '\\';
            i++;
            continue;
        }
        char e = p[i + 1];
        i += 2;
        uint32_t cp;
        int nhex = 0;
        switch (e) {
        case '\n': break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'v': out[o++] = '\v'; break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N':
            return lex_fail(L, CAIRN_EUNSUPPORTED, "%s", "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && p[i] >= '0' && p[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(p[i++] - '0');
                o += tmpl_utf8_enc(cp, out + o);
            } else if ((unsigned char)e >= 0x80) {
                /* "\é": the backslash escapes the backslash of "\xe9" */
                uint32_t c2;
                size_t k = tmpl_utf8_dec(p + i - 1, n - (i - 1), &c2);
                i += k - 1;
                o += (size_t)sprintf(out + o, c2 < 0x100 ? "\\x%02x" : c2 < 0x10000 ? "\\u%04x" : "\\U%08x", c2);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
            break;
        }
        if (nhex) {
            cp = 0;
            for (int k = 0; k < nhex; k++) {
                int d = i < n ? hexval(p[i]) : -1;
                if (d < 0)
                    return lex_fail(L, CAIRN_EFORMAT, "truncated \\%s escape in string literal",
                                    nhex == 2 ? "xXX" : nhex == 4 ? "uXXXX" : "UXXXXXXXX");
                cp = cp * 16 + (uint32_t)d;
                i++;
            }
            if (cp > 0x10FFFF)
                return lex_fail(L, CAIRN_EFORMAT, "%s", "illegal Unicode character in string literal");
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return lex_fail(L, CAIRN_EUNSUPPORTED, "%s", "surrogate escapes are not supported");
            o += tmpl_utf8_enc(cp, out + o);
        }
    }
    out[o] = 0;
    tk->p = out;
    tk->n = o;
    return 0;
}

static const struct { const char *s; uint8_t op; } ops2[] = {
    {"**", O_POW}, {"//", O_FLOORDIV}, {"==", O_EQ}, {"!=", O_NE}, {">=", O_GTEQ}, {"<=", O_LTEQ},
};

static int op1(char c)
{
    switch (c) {
    case '+': return O_ADD;
    case '-': return O_SUB;
    case '/': return O_DIV;
    case '*': return O_MUL;
    case '%': return O_MOD;
    case '~': return O_TILDE;
    case '[': return O_LBRACKET;
    case ']': return O_RBRACKET;
    case '(': return O_LPAREN;
    case ')': return O_RPAREN;
    case '{': return O_LBRACE;
    case '}': return O_RBRACE;
    case '>': return O_GT;
    case '<': return O_LT;
    case '=': return O_ASSIGN;
    case '.': return O_DOT;
    case ':': return O_COLON;
    case '|': return O_PIPE;
    case ',': return O_COMMA;
    case ';': return O_SEMICOLON;
    default: return -1;
    }
}

/* Tokens inside {{ }} or {% %} up to and including the end tag. */
static int lex_tag(struct lexer *L, bool block)
{
    const char *s = L->s;
    size_t n = L->n;
    L->nbal = 0;
    for (;;) {
        size_t pos = L->pos;
        if (pos >= n) {
            L->line_starting = false;
            return 0;  /* the parser reports the missing end */
        }
        if (L->nbal == 0) {
            size_t end = 0;
            bool ws_after = false, nl_after = false;
            if (block) {
                if (s[pos] == '+' && pos + 2 < n && s[pos + 1] == '%' && s[pos + 2] == '}')
                    end = pos + 3;
                else if (s[pos] == '-' && pos + 2 < n && s[pos + 1] == '%' && s[pos + 2] == '}')
                    end = pos + 3, ws_after = true;
                else if (s[pos] == '%' && pos + 1 < n && s[pos + 1] == '}')
                    end = pos + 2, nl_after = true;
            } else {
                if (s[pos] == '-' && pos + 2 < n && s[pos + 1] == '}' && s[pos + 2] == '}')
                    end = pos + 3, ws_after = true;
                else if (s[pos] == '}' && pos + 1 < n && s[pos + 1] == '}')
                    end = pos + 2;
            }
            if (end) {
                if (!push(L, block ? TK_BLOCK_END : TK_VAR_END))
                    return CAIRN_ENOMEM;
                if (ws_after)
                    end += space_run(s + end, n - end);
                else if (nl_after && end < n && s[end] == '\n')
                    end++;
                L->line += count_nl(s + pos, end - pos);
                L->line_starting = s[end - 1] == '\n';
                L->pos = end;
                return 0;
            }
        }
        size_t k = space_run(s + pos, n - pos);
        if (k) {
            L->line += count_nl(s + pos, k);
            L->pos += k;
            continue;
        }
        size_t e = m_float(s, n, pos);
        if (e) {
            char tmp[128];
            size_t o = 0;
            for (size_t i = pos; i < e && o < sizeof tmp - 1; i++)
                if (s[i] != '_')
                    tmp[o++] = s[i];
            tmp[o] = 0;
            struct ttok *tk = push(L, TK_FLOAT);
            if (!tk)
                return CAIRN_ENOMEM;
            tk->d = strtod(tmp, NULL);
            L->pos = e;
            continue;
        }
        int64_t iv;
        bool ovf;
        e = m_int(s, n, pos, &iv, &ovf);
        if (e) {
            if (ovf)
                return lex_fail(L, CAIRN_EUNSUPPORTED, "%s", "integer literal beyond 64 bits");
            struct ttok *tk = push(L, TK_INT);
            if (!tk)
                return CAIRN_ENOMEM;
            tk->i = iv;
            L->pos = e;
            continue;
        }
        if (is_name_start((unsigned char)s[pos])) {
            e = pos + 1;
            while (e < n && is_name_char((unsigned char)s[e]))
                e++;
            struct ttok *tk = push(L, TK_NAME);
            if (!tk)
                return CAIRN_ENOMEM;
            tk->p = s + pos;
            tk->n = e - pos;
            L->pos = e;
            continue;
        }
        if (s[pos] == '\'' || s[pos] == '"') {
            char q = s[pos];
            size_t i = pos + 1;
            while (i < n && s[i] != q) {
                if (s[i] == '\\' && i + 1 < n)
                    i++;
                i++;
            }
            if (i < n) {
                struct ttok *tk = push(L, TK_STRING);
                if (!tk)
                    return CAIRN_ENOMEM;
                int rc = decode_string(L, s + pos + 1, i - pos - 1, tk);
                if (rc)
                    return rc;
                L->line += count_nl(s + pos, i + 1 - pos);
                L->pos = i + 1;
                continue;
            }
        }
        int op = -1;
        size_t oplen = 1;
        if (pos + 1 < n)
            for (size_t j = 0; j < sizeof ops2 / sizeof ops2[0]; j++)
                if (s[pos] == ops2[j].s[0] && s[pos + 1] == ops2[j].s[1]) {
                    op = ops2[j].op;
                    oplen = 2;
                    break;
                }
        if (op < 0)
            op = op1(s[pos]);
        if (op < 0) {
            char c[8] = {0};
            uint32_t cp;
            size_t cl = tmpl_utf8_dec(s + pos, n - pos, &cp);
            memcpy(c, s + pos, cl < 4 ? cl : 4);
            return lex_fail(L, CAIRN_EFORMAT, "unexpected char '%s'", c);
        }
        if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
            if (L->nbal >= (int)sizeof L->balance)
                return lex_fail(L, CAIRN_EFULL, "%s", "brackets nested too deeply");
            L->balance[L->nbal++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
        } else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
            char c[2] = {s[pos], 0};
            if (!L->nbal)
                return lex_fail(L, CAIRN_EFORMAT, "unexpected '%s'", c);
            if (L->balance[--L->nbal] != s[pos])
                return lex_fail(L, CAIRN_EFORMAT, "unexpected '%s'", c);
        }
        struct ttok *tk = push(L, TK_OP);
        if (!tk)
            return CAIRN_ENOMEM;
        tk->op = (uint8_t)op;
        L->pos = pos + oplen;
    }
}

/* `{%[-+]?\s*raw\s*(-%}\s*|%})` at q: end offset of the tag, or 0. */
static size_t match_raw_begin(const char *s, size_t n, size_t q)
{
    size_t p = q + 2;
    if (p < n && (s[p] == '-' || s[p] == '+'))
        p++;
    p += space_run(s + p, n - p);
    if (p + 3 > n || memcmp(s + p, "raw", 3))
        return 0;
    p += 3;
    p += space_run(s + p, n - p);
    if (p + 3 <= n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}')
        return p + 3 + space_run(s + p + 3, n - p - 3);
    if (p + 2 <= n && s[p] == '%' && s[p + 1] == '}')
        return p + 2;
    return 0;
}

/* `{%([-+]?)\s*endraw\s*(+%}|-%}\s*|%}\n?)` at q: end offset (0: none) and the sign. */
static size_t match_raw_end(const char *s, size_t n, size_t q, char *sign)
{
    size_t p = q + 2;
    *sign = 0;
    if (p < n && (s[p] == '-' || s[p] == '+'))
        *sign = s[p++];
    p += space_run(s + p, n - p);
    if (p + 6 > n || memcmp(s + p, "endraw", 6))
        return 0;
    p += 6;
    p += space_run(s + p, n - p);
    if (p + 3 <= n && s[p] == '+' && s[p + 1] == '%' && s[p + 2] == '}')
        return p + 3;
    if (p + 3 <= n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}')
        return p + 3 + space_run(s + p + 3, n - p - 3);
    if (p + 2 <= n && s[p] == '%' && s[p + 1] == '}')
        return p + 2 + (p + 2 < n && s[p + 2] == '\n');
    return 0;
}

int tmpl_lex(struct tmpl *t, const char *src, size_t len, struct ttok **toks, size_t *ntoks,
             char *err, size_t errlen)
{
    struct lexer L = {.t = t, .line = 1, .line_starting = true, .err = err, .errlen = errlen};
    /* normalize newlines; drop one trailing newline */
    char *s = tmpl_alloc(&t->ar, len + 1);
    if (!s)
        return CAIRN_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    L.s = s;
    L.n = n;
    int rc;
    while (L.pos < n) {
        size_t q = L.pos;
        int kind = -1; /* 0 comment 1 block 2 var 3 raw */
        size_t raw_end = 0;
        for (; q + 1 < n; q++) {
            if (s[q] != '{')
                continue;
            char c = s[q + 1];
            if (c == '%') {
                raw_end = match_raw_begin(s, n, q);
                kind = raw_end ? 3 : 1;
                break;
            }
            if (c == '#') {
                kind = 0;
                break;
            }
            if (c == '{') {
                kind = 2;
                break;
            }
        }
        if (kind < 0) {
            if ((rc = emit_data(&L, s + L.pos, n - L.pos)))
                return rc;
            break;
        }
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t tl = strip_data(&L, s + L.pos, q - L.pos, sign, kind == 2);
        if ((rc = emit_data(&L, s + L.pos, tl)))
            return rc;
        L.line += count_nl(s + L.pos, q - L.pos);
        size_t after = q + 2 + (sign ? 1 : 0);
        if (kind == 0) {
            size_t k = after, end = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}')
                    break;
            if (k + 1 >= n)
                return lex_fail(&L, CAIRN_EFORMAT, "%s", "Missing end of comment tag");
            if (k > after && s[k - 1] == '-')
                end = k + 2 + space_run(s + k + 2, n - k - 2);
            else if (k > after && s[k - 1] == '+')
                end = k + 2;
            else
                end = k + 2 + (k + 2 < n && s[k + 2] == '\n');
            L.line += count_nl(s + q, end - q);
            L.line_starting = s[end - 1] == '\n';
            L.pos = end;
        } else if (kind == 3) {
            L.line += count_nl(s + q, raw_end - q);
            L.line_starting = s[raw_end - 1] == '\n';
            size_t k = raw_end, end = 0;
            char esign = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '{' && s[k + 1] == '%' && (end = match_raw_end(s, n, k, &esign)))
                    break;
            if (!end)
                return lex_fail(&L, CAIRN_EFORMAT, "%s", "Missing end of raw directive");
            size_t rl = strip_data(&L, s + raw_end, k - raw_end, esign, false);
            if ((rc = emit_data(&L, s + raw_end, rl)))
                return rc;
            L.line += count_nl(s + raw_end, end - raw_end);
            L.line_starting = s[end - 1] == '\n';
            L.pos = end;
        } else {
            if (!push(&L, kind == 1 ? TK_BLOCK_BEGIN : TK_VAR_BEGIN))
                return CAIRN_ENOMEM;
            L.pos = after;
            L.line_starting = false;
            if ((rc = lex_tag(&L, kind == 1)))
                return rc;
        }
    }
    if (!push(&L, TK_EOF))
        return CAIRN_ENOMEM;
    *toks = L.toks;
    *ntoks = L.ntok;
    return 0;
}
