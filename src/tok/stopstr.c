#include "tok/stopstr.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

struct stop {
    char *s;
    size_t len;
    uint16_t *fail;  /* fail[i]: longest proper prefix of s[0..i] that is also its suffix */
    size_t state;    /* bytes of s matched by the end of the text so far */
};

struct stopstr {
    size_t n;
    struct stop stop[STOPSTR_MAX];
    /* The held-back tail is always stop[hk].s[0..hlen): the stop string with the
     * longest partial match ends the text with exactly its own prefix. */
    size_t hk, hlen;
    int matched;
};

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

void stopstr_release(struct stopstr *s)
{
    if (!s)
        return;
    for (size_t k = 0; k < s->n; k++) {
        free(s->stop[k].s);
        free(s->stop[k].fail);
    }
    free(s);
}

int stopstr_create(struct stopstr **out, const char *const *stops, size_t n, char *err, size_t errlen)
{
    *out = NULL;
    if (n > STOPSTR_MAX)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%zu stop strings, at most %d allowed", n, STOPSTR_MAX);
    for (size_t k = 0; k < n; k++) {
        if (!stops[k])
            return cairn_fail(err, errlen, CAIRN_EINVAL, "stop string %zu is missing", k);
        size_t len = strlen(stops[k]);
        if (len == 0)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "stop string %zu is empty", k);
        if (len > STOPSTR_MAX_LEN)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "stop string %zu is %zu bytes long, at most %d allowed",
                              k, len, STOPSTR_MAX_LEN);
        if (!utf8_valid((const unsigned char *)stops[k], len))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "stop string %zu is not valid UTF-8", k);
    }
    struct stopstr *s = calloc(1, sizeof *s);
    if (!s)
        goto nomem;
    s->matched = -1;
    for (size_t k = 0; k < n; k++) {
        struct stop *st = &s->stop[k];
        st->len = strlen(stops[k]);
        st->s = malloc(st->len + 1);
        st->fail = malloc(st->len * sizeof *st->fail);
        s->n = k + 1;
        if (!st->s || !st->fail)
            goto nomem;
        memcpy(st->s, stops[k], st->len + 1);
        st->fail[0] = 0;
        size_t j = 0;
        for (size_t i = 1; i < st->len; i++) {
            while (j > 0 && st->s[i] != st->s[j])
                j = st->fail[j - 1];
            if (st->s[i] == st->s[j])
                j++;
            st->fail[i] = (uint16_t)j;
        }
    }
    *out = s;
    return 0;
nomem:
    stopstr_release(s);
    return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for stop strings");
}

/* Appends bytes [0, x) of held + text, where held is the old held-back tail. */
static void emit(const struct stopstr *s, const char *text, size_t x, struct strbuf *out)
{
    size_t h = x < s->hlen ? x : s->hlen;
    if (h)
        strbuf_put(out, s->stop[s->hk].s, h);
    if (x > h)
        strbuf_put(out, text, x - h);
}

int stopstr_feed(struct stopstr *s, const char *text, size_t len, struct strbuf *out)
{
    if (s->matched >= 0)
        return 1;
    if (len == 0)
        return 0;
    /* Reserving first means nothing below can fail: the filter never advances over
     * text it could not pass on. */
    if (len > SIZE_MAX - s->hlen || strbuf_reserve(out, s->hlen + len))
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        int best = -1;
        for (size_t k = 0; k < s->n; k++) {
            struct stop *st = &s->stop[k];
            size_t j = st->state;
            while (j > 0 && st->s[j] != c)
                j = st->fail[j - 1];
            if (st->s[j] == c)
                j++;
            st->state = j;
            if (j == st->len && (best < 0 || st->len > s->stop[best].len))
                best = (int)k;
        }
        if (best >= 0) {
            emit(s, text, s->hlen + i + 1 - s->stop[best].len, out);
            s->matched = best;
            s->hlen = 0;
            return 1;
        }
    }
    size_t m = 0, mk = 0;
    for (size_t k = 0; k < s->n; k++) {
        if (s->stop[k].state > m) {
            m = s->stop[k].state;
            mk = k;
        }
    }
    emit(s, text, s->hlen + len - m, out);
    s->hk = mk;
    s->hlen = m;
    return 0;
}

int stopstr_flush(struct stopstr *s, struct strbuf *out)
{
    int matched = s->matched >= 0;
    if (!matched && s->hlen) {
        if (strbuf_put(out, s->stop[s->hk].s, s->hlen))
            return CAIRN_ENOMEM;
    }
    for (size_t k = 0; k < s->n; k++)
        s->stop[k].state = 0;
    s->hk = s->hlen = 0;
    return matched;
}

void stopstr_reset(struct stopstr *s)
{
    for (size_t k = 0; k < s->n; k++)
        s->stop[k].state = 0;
    s->hk = s->hlen = 0;
    s->matched = -1;
}

int stopstr_matched(const struct stopstr *s)
{
    return s->matched;
}

size_t stopstr_held(const struct stopstr *s)
{
    return s->hlen;
}
