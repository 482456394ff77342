#define _GNU_SOURCE /* memmem */
/* The harmony splitter (harmony.h). */
#include "tok/harmony.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tok/toolcall.h"

static const char MSG[] = "<|message|>", CHANNEL[] = "<|channel|>", START[] = "<|start|>";
/* Markers that end a body: <|start|> too, for a model that leaves out <|end|>. */
static const char *const BODY_END[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
#define N_BODY_END (sizeof BODY_END / sizeof BODY_END[0])
/* What a header may start with (after <|start|>, a role word may come first). */
static const char *const HEAD_START[] = {"<|start|>", "<|channel|>", " to=", "<|constrain|>", "<|message|>"};
#define N_HEAD_START (sizeof HEAD_START / sizeof HEAD_START[0])

enum state {
    H_HEAD, /* in a header, held in head */
    H_BODY, /* in a body, routed; a possible marker prefix held in held */
    H_TEXT, /* not harmony: everything is content */
};

enum route { R_REASONING, R_CONTENT, R_CALL };

struct harmony {
    enum state state;
    enum route route;
    struct strbuf head, held, args;
    char name[256];  /* of the call in progress */
    json_t *calls;   /* found so far */
    uint64_t seed, counter;
};

bool harmony_detect(const char *src, size_t len)
{
    return src && memmem(src, len, CHANNEL, sizeof CHANNEL - 1) && memmem(src, len, MSG, sizeof MSG - 1);
}

int harmony_create(struct harmony **out, uint64_t id_seed, char *err, size_t errlen)
{
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->calls = json_array())) {
        free(*out);
        *out = NULL;
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    (*out)->seed = id_seed;
    return 0;
}

void harmony_release(struct harmony *h)
{
    if (!h)
        return;
    strbuf_free(&h->head);
    strbuf_free(&h->held);
    strbuf_free(&h->args);
    json_decref(h->calls);
    free(h);
}

/* Whether s (n bytes) may still become the start of a header: it is a prefix of one of
 * HEAD_START, or begins with one of them, or begins with <|start|> and a role. */
static bool head_plausible(const char *s, size_t n)
{
    for (size_t i = 0; i < N_HEAD_START; i++) {
        size_t m = strlen(HEAD_START[i]);
        if (!memcmp(s, HEAD_START[i], n < m ? n : m))
            return true;
    }
    return false;
}

/* A byte of a channel or recipient name. */
static bool name_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == ':';
}

/* The name after key in the header (its name bytes, up to anything else) into dst. */
static void head_value(const char *h, size_t n, const char *key, char *dst, size_t cap)
{
    dst[0] = 0;
    const char *k = memmem(h, n, key, strlen(key));
    if (!k)
        return;
    const char *v = k + strlen(key), *end = h + n;
    size_t len = 0;
    while (v + len < end && name_byte(v[len]) && len + 1 < cap)
        len++;
    memcpy(dst, v, len);
    dst[len] = 0;
}

/* Reads the header in head (without <|message|>) and starts its body. */
static void start_body(struct harmony *h)
{
    char channel[64], to[256];
    head_value(h->head.p, h->head.len, CHANNEL, channel, sizeof channel);
    head_value(h->head.p, h->head.len, " to=", to, sizeof to);
    strbuf_clear(&h->head);
    strbuf_clear(&h->args);
    h->state = H_BODY;
    if (to[0]) {
        h->route = R_CALL;
        const char *name = !strncmp(to, "functions.", 10) ? to + 10 : to;
        snprintf(h->name, sizeof h->name, "%s", name);
    } else {
        h->route = !strcmp(channel, "analysis") ? R_REASONING : R_CONTENT;
    }
}

/* Appends a body's bytes where its route sends them. */
static int route_put(struct harmony *h, const char *s, size_t n, struct strbuf *reasoning, struct strbuf *content)
{
    struct strbuf *dst = h->route == R_REASONING ? reasoning : h->route == R_CONTENT ? content : &h->args;
    return strbuf_put(dst, s, n);
}

/* Ends the body in progress: a call becomes an entry of calls (arguments that are not
 * UTF-8 cannot be JSON text: they are given up as content). */
static int end_body(struct harmony *h, struct strbuf *content)
{
    if (h->route == R_CALL) {
        const char *a = h->args.p ? h->args.p : "";
        size_t n = h->args.len;
        while (n && (a[0] == ' ' || a[0] == '\n' || a[0] == '\t' || a[0] == '\r'))
            a++, n--;
        while (n && (a[n - 1] == ' ' || a[n - 1] == '\n' || a[n - 1] == '\t' || a[n - 1] == '\r'))
            n--;
        char id[TOOLCALL_ID_MAX];
        toolcall_new_id(h->seed, &h->counter, false, h->calls, id);
        json_t *args = json_stringn(a, n);
        if (!args) {
            int rc = strbuf_put(content, h->args.p, h->args.len);
            if (rc)
                return rc;
        } else {
            json_t *c = json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name",
                                  h->name, "arguments", args);
            if (!c || json_array_append_new(h->calls, c))
                return CAIRN_ENOMEM;
        }
    }
    strbuf_clear(&h->args);
    h->state = H_HEAD;
    return 0;
}

/* Length of the longest suffix of s (n bytes) that is a proper prefix of a body marker. */
static size_t marker_prefix_tail(const char *s, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < N_BODY_END; i++) {
        size_t m = strlen(BODY_END[i]);
        for (size_t k = m - 1 < n ? m - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, BODY_END[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Feeds bytes in the body state; returns how many were used (the rest start a header). */
static int body_feed(struct harmony *h, const char *text, size_t len, size_t *used, struct strbuf *reasoning,
                     struct strbuf *content)
{
    /* held (a marker prefix) and text are scanned together */
    int rc = strbuf_put(&h->held, text, len);
    if (rc)
        return rc;
    const char *s = h->held.p;
    size_t n = h->held.len, at = n, which = N_BODY_END;
    for (size_t i = 0; i < N_BODY_END; i++) {
        const char *m = memmem(s, n, BODY_END[i], strlen(BODY_END[i]));
        if (m && (size_t)(m - s) < at) {
            at = (size_t)(m - s);
            which = i;
        }
    }
    if (which == N_BODY_END) {
        size_t keep = marker_prefix_tail(s, n);
        if ((rc = route_put(h, s, n - keep, reasoning, content)))
            return rc;
        memmove(h->held.p, s + n - keep, keep);
        h->held.len = keep;
        *used = len;
        return 0;
    }
    if ((rc = route_put(h, s, at, reasoning, content)) || (rc = end_body(h, content)))
        return rc;
    /* <|start|> begins the next header; what follows a marker goes back to the caller.
     * held was shorter than any marker, so those bytes all come from the end of text. */
    if (!strcmp(BODY_END[which], START) && (rc = strbuf_put(&h->head, START, sizeof START - 1)))
        return rc;
    size_t rest = n - at - strlen(BODY_END[which]);
    *used = len - rest;
    strbuf_clear(&h->held);
    return 0;
}

int harmony_feed(struct harmony *h, const char *text, size_t len, struct strbuf *reasoning, struct strbuf *content)
{
    while (len > 0) {
        int rc;
        size_t used = len;
        if (h->state == H_TEXT) {
            rc = strbuf_put(content, text, len);
        } else if (h->state == H_BODY) {
            rc = body_feed(h, text, len, &used, reasoning, content);
        } else {
            /* A header: up to <|message|>, which must start within HARMONY_MAX_HEAD bytes;
             * checked as it grows, and decided alike however the text was cut (whether
             * it may be a header depends only on its first bytes). */
            size_t before = h->head.len;
            if ((rc = strbuf_put(&h->head, text, len)))
                return rc;
            const char *m = memmem(h->head.p, h->head.len, MSG, sizeof MSG - 1);
            size_t at = m ? (size_t)(m - h->head.p) : 0;
            if (!head_plausible(h->head.p, h->head.len) || (m && at > HARMONY_MAX_HEAD) ||
                (!m && h->head.len > HARMONY_MAX_HEAD + sizeof MSG - 2)) {
                h->state = H_TEXT;
                rc = strbuf_put(content, h->head.p, h->head.len);
                strbuf_clear(&h->head);
            } else if (m) {
                used = at + sizeof MSG - 1 - before;
                h->head.len = at;
                start_body(h);
            }
        }
        if (rc)
            return rc;
        text += used;
        len -= used;
    }
    return 0;
}

int harmony_finish(struct harmony *h, struct strbuf *reasoning, struct strbuf *content, json_t **calls)
{
    *calls = NULL;
    int rc = 0;
    if (h->state == H_BODY) {
        /* the stream stopped at <|return|> or <|call|>, which end the generation */
        rc = route_put(h, h->held.p, h->held.len, reasoning, content);
        if (!rc)
            rc = end_body(h, content);
    } else if (h->state == H_HEAD) {
        rc = strbuf_put(content, h->head.p, h->head.len);
    }
    json_t *fresh = rc ? NULL : json_array();
    if (!fresh)
        return CAIRN_ENOMEM;
    *calls = h->calls;
    h->calls = fresh;
    strbuf_clear(&h->head);
    strbuf_clear(&h->held);
    strbuf_clear(&h->args);
    h->state = H_HEAD;
    return 0;
}
