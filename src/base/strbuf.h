/* A growable byte string: the text buffer that streaming filters (stop strings, reasoning
 * and tool-call splitters) and the API front-ends write into. */
#ifndef CAIRN_BASE_STRBUF_H
#define CAIRN_BASE_STRBUF_H

#include <stddef.h>

/* A growable byte string owned by whoever declared it: p holds len bytes followed by a
 * NUL (p is NULL while nothing was ever put). Start from {0}; reuse after
 * strbuf_clear; free with strbuf_free. */
struct strbuf {
    char *p;
    size_t len, cap;
};

/* Makes room for n more bytes (and the NUL) so that the next puts of up to n bytes in
 * total cannot fail. 0, CAIRN_ENOMEM or CAIRN_ERANGE (size overflow); b unchanged on
 * failure. */
int strbuf_reserve(struct strbuf *b, size_t n);
/* Appends n bytes of s (s may be NULL when n is 0). Errors as strbuf_reserve. */
int strbuf_put(struct strbuf *b, const char *s, size_t n);
/* Empties b, keeping its memory. */
void strbuf_clear(struct strbuf *b);
/* Frees b's memory and empties it; b may then be reused. */
void strbuf_free(struct strbuf *b);

#endif
