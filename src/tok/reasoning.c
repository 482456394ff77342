#include "tok/reasoning.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

enum rstate {
    R_LEAD,     /* start of the output: whitespace, then maybe the open tag */
    R_REASON,   /* inside the reasoning, watching for the close tag */
    R_SKIPWS,   /* right after the close tag: whitespace is dropped */
    R_CONTENT,  /* everything else is content */
};

struct reasoning {
    char open[REASONING_MAX_TAG + 1], close[REASONING_MAX_TAG + 1];
    size_t olen, clen;
    uint8_t cfail[REASONING_MAX_TAG];  /* KMP failure function of close */
    bool start_in;
    enum rstate state;
    /* R_LEAD: bytes of open matched after the whitespace; R_REASON: bytes of close
     * matched by the end of the text so far, which are exactly what is held back. */
    size_t j;
    size_t nlead;                      /* R_LEAD: whitespace held back */
    char lead[REASONING_MAX_LEAD];
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

static int set_tag(char *dst, size_t *dlen, const char *src, const char *which, char *err, size_t errlen)
{
    size_t n = strlen(src);
    if (n == 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "reasoning %s tag is empty", which);
    if (n > REASONING_MAX_TAG)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "reasoning %s tag is %zu bytes long, at most %d allowed",
                          which, n, REASONING_MAX_TAG);
    if (is_ws(src[0]))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "reasoning %s tag starts with whitespace", which);
    memcpy(dst, src, n + 1);
    *dlen = n;
    return 0;
}

static void start(struct reasoning *r)
{
    r->state = r->start_in ? R_REASON : R_LEAD;
    r->j = 0;
    r->nlead = 0;
}

int reasoning_create(struct reasoning **out, const struct reasoning_opts *opts, char *err, size_t errlen)
{
    *out = NULL;
    struct reasoning *r = calloc(1, sizeof *r);
    if (!r)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for the reasoning splitter");
    const char *open = opts && opts->open ? opts->open : "<think>";
    const char *close = opts && opts->close ? opts->close : "</think>";
    int rc = set_tag(r->open, &r->olen, open, "open", err, errlen);
    if (!rc)
        rc = set_tag(r->close, &r->clen, close, "close", err, errlen);
    if (rc) {
        free(r);
        return rc;
    }
    size_t j = 0;
    r->cfail[0] = 0;
    for (size_t i = 1; i < r->clen; i++) {
        while (j > 0 && r->close[i] != r->close[j])
            j = r->cfail[j - 1];
        if (r->close[i] == r->close[j])
            j++;
        r->cfail[i] = (uint8_t)j;
    }
    r->start_in = opts && opts->start_in_reasoning;
    start(r);
    *out = r;
    return 0;
}

void reasoning_release(struct reasoning *r)
{
    free(r);
}

bool reasoning_active(const struct reasoning *r)
{
    return r->state == R_REASON;
}

/* Gives up waiting for the open tag: what was held back becomes content. */
static void lead_to_content(struct reasoning *r, struct strbuf *content)
{
    strbuf_put(content, r->lead, r->nlead);
    strbuf_put(content, r->open, r->j);
    r->nlead = 0;
    r->j = 0;
    r->state = R_CONTENT;
}

/* Consumes bytes while at the start of the output; returns how many. A byte that ends
 * the lead without completing the open tag is left for the caller, as content. */
static size_t lead(struct reasoning *r, const char *text, size_t len, struct strbuf *content)
{
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (r->j > 0 || c == r->open[0]) {
            if (c != r->open[r->j]) {
                lead_to_content(r, content);
                return i;
            }
            if (++r->j == r->olen) {
                r->nlead = 0;
                r->j = 0;
                r->state = R_REASON;
                return i + 1;
            }
        } else if (is_ws(c) && r->nlead < REASONING_MAX_LEAD) {
            r->lead[r->nlead++] = c;
        } else {
            lead_to_content(r, content);
            return i;
        }
    }
    return len;
}

/* Appends bytes [x0, x1) of close[0..hlen) followed by t. */
static void emit(struct strbuf *b, const char *held, size_t hlen, const char *t, size_t x0, size_t x1)
{
    if (x0 < hlen) {
        size_t e = x1 < hlen ? x1 : hlen;
        strbuf_put(b, held + x0, e - x0);
        x0 = e;
    }
    if (x1 > x0)
        strbuf_put(b, t + (x0 - hlen), x1 - x0);
}

int reasoning_feed(struct reasoning *r, const char *text, size_t len, struct strbuf *reasoning,
                   struct strbuf *content)
{
    if (len == 0)
        return 0;
    /* Room for every byte that could come out, so nothing below fails half-way. */
    if (len > SIZE_MAX - 2 * REASONING_MAX_TAG - REASONING_MAX_LEAD ||
        strbuf_reserve(reasoning, len + r->clen) ||
        strbuf_reserve(content, len + r->olen + REASONING_MAX_LEAD))
        return CAIRN_ENOMEM;
    size_t i0 = r->state == R_LEAD ? lead(r, text, len, content) : 0;
    const char *t = text + i0;
    size_t n = len - i0;
    /* Positions below count in held + t, where held is the partial close tag left from
     * the previous feed; p is the first byte not yet output or dropped. */
    size_t hlen = r->state == R_REASON ? r->j : 0;
    size_t p = 0;
    for (size_t i = 0; i < n && r->state != R_CONTENT; i++) {
        char c = t[i];
        size_t q = hlen + i;
        if (r->state == R_REASON) {
            size_t j = r->j;
            while (j > 0 && r->close[j] != c)
                j = r->cfail[j - 1];
            if (r->close[j] == c)
                j++;
            r->j = j;
            if (j == r->clen) {
                emit(reasoning, r->close, hlen, t, p, q + 1 - r->clen);
                p = q + 1;
                r->j = 0;
                r->state = R_SKIPWS;
            }
        } else if (is_ws(c)) {  /* R_SKIPWS */
            p = q + 1;
        } else {
            r->state = R_CONTENT;
        }
    }
    if (r->state == R_REASON)
        emit(reasoning, r->close, hlen, t, p, hlen + n - r->j);
    else if (r->state == R_CONTENT)
        emit(content, r->close, hlen, t, p, hlen + n);
    return 0;
}

int reasoning_flush(struct reasoning *r, struct strbuf *reasoning, struct strbuf *content)
{
    if (r->state == R_LEAD) {
        if (strbuf_reserve(content, r->nlead + r->j))
            return CAIRN_ENOMEM;
        lead_to_content(r, content);
    } else if (r->state == R_REASON) {
        if (strbuf_put(reasoning, r->close, r->j))
            return CAIRN_ENOMEM;
    }
    start(r);
    return 0;
}

static const char *find(const char *h, size_t hn, const char *needle, size_t nn)
{
    if (nn == 0 || nn > hn)
        return NULL;
    for (size_t i = 0; i + nn <= hn; i++) {
        if (h[i] == needle[0] && memcmp(h + i, needle, nn) == 0)
            return h + i;
    }
    return NULL;
}

static const char *rfind(const char *h, size_t hn, const char *needle, size_t nn)
{
    if (nn == 0 || nn > hn)
        return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;) {
        if (h[i] == needle[0] && memcmp(h + i, needle, nn) == 0)
            return h + i;
    }
    return NULL;
}

void reasoning_detect(const char *src, size_t len, struct reasoning_info *out)
{
    static const char *const pairs[][2] = {
        {"<think>", "</think>"},
        {"<seed:think>", "</seed:think>"},
        {"<mm:think>", "</mm:think>"},
        {"[THINK]", "[/THINK]"},
    };
    out->uses_tags = false;
    out->opens_in_prompt = false;
    out->open = pairs[0][0];
    out->close = pairs[0][1];
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        if (find(src, len, pairs[k][0], strlen(pairs[k][0]))) {
            out->uses_tags = true;
            out->open = pairs[k][0];
            out->close = pairs[k][1];
            break;
        }
    }
    if (!out->uses_tags)
        return;
    static const char agp[] = "add_generation_prompt";
    const char *tail = rfind(src, len, agp, sizeof agp - 1);
    if (!tail)
        return;
    size_t olen = strlen(out->open), clen = strlen(out->close);
    const char *end = src + len;
    for (const char *o = find(tail, (size_t)(end - tail), out->open, olen); o;
         o = find(o + olen, (size_t)(end - o - olen), out->open, olen)) {
        /* Skip whitespace, written out or as escapes inside a string literal. */
        const char *q = o + olen;
        while (q < end) {
            if (is_ws(*q))
                q++;
            else if (*q == '\\' && q + 1 < end && (q[1] == 'n' || q[1] == 't' || q[1] == 'r'))
                q += 2;
            else
                break;
        }
        if ((size_t)(end - q) < clen || memcmp(q, out->close, clen) != 0) {
            out->opens_in_prompt = true;
            return;
        }
    }
}

bool reasoning_prompt_open(const char *prompt, size_t len, const char *open, const char *close)
{
    if (!open)
        open = "<think>";
    if (!close)
        close = "</think>";
    size_t olen = strlen(open), clen = strlen(close);
    const char *o = rfind(prompt, len, open, olen);
    if (!o)
        return false;
    const char *c = rfind(prompt, len, close, clen);
    if (c && o < c + clen)
        return false;
    for (const char *q = o + olen; q < prompt + len; q++) {
        if (!is_ws(*q))
            return false;
    }
    return true;
}
