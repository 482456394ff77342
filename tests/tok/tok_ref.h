/* What a tokenizer's round trip should give back, computed simply: shared by the
 * tokenizer tests (tests/tok) and the tokenizer's fuzz harness (tests/fuzz/fuzz_tok.c). */
#ifndef CAIRN_TESTS_TOK_REF_H
#define CAIRN_TESTS_TOK_REF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline int put_utf8(uint32_t cp, char *o)
{
    unsigned char *u = (unsigned char *)o;
    if (cp < 0x80)
        return u[0] = (unsigned char)cp, 1;
    if (cp < 0x800)
        return u[0] = (unsigned char)(0xc0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000)
        return u[0] = (unsigned char)(0xe0 | cp >> 12), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
               u[2] = (unsigned char)(0x80 | (cp & 0x3f)), 3;
    return u[0] = (unsigned char)(0xf0 | cp >> 18), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
           u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (unsigned char)(0x80 | (cp & 0x3f)), 4;
}

/* llama.cpp's input cleaning for byte-level BPE: a byte that does not start a sequence
 * of a lead byte and its continuation bytes (and a code point U+10FFFF or less that is
 * no surrogate) becomes U+FFFD; overlong forms decode to their code point. */
static inline size_t ref_clean(const unsigned char *s, size_t n, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t need = c < 0x80 ? 1 : c < 0xc0 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf8 ? 4 : 0;
        uint32_t cp = need == 1 ? c : need == 2 ? (c & 0x1f) : need == 3 ? (c & 0x0f) : (c & 0x07);
        int ok = need > 0 && i + need <= n;
        for (size_t k = 1; ok && k < need; k++) {
            ok = (s[i + k] & 0xc0) == 0x80;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (ok && (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)))
            ok = 0;
        o += (size_t)put_utf8(ok ? cp : 0xfffd, out + o);
        i += ok ? need : 1;
    }
    return o;
}

/* SentencePiece keeps every byte, except that U+2581 in the input reads as a space. */
static inline size_t spm_expect(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
            out[o++] = ' ';
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    return o;
}

#endif
