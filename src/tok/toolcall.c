#include "tok/toolcall.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

#define MAX_MARKER 32
#define MIN_HELD 64

static const char HERMES_OPEN[] = "<tool_call>";
static const char HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]";
static const char PYTHON_TAG[] = "<|python_tag|>";

enum tstate {
    T_SCAN,  /* content; watching for the marker anywhere (Hermes, Mistral) */
    T_LEAD,  /* start of a Llama 3 output: whitespace, then '{' or <|python_tag|>? */
    T_HOLD,  /* a call may have started: everything is held until the end */
    T_PASS,  /* content only, to the end of the stream */
};

struct toolcall {
    enum toolcall_format fmt;
    uint64_t seed, counter;
    size_t max_held;
    enum tstate state;
    const char *marker;  /* T_SCAN's marker, or T_LEAD's <|python_tag|> */
    size_t mlen;
    uint8_t mfail[MAX_MARKER];
    /* T_SCAN: bytes of the marker matched by the end of the text so far (exactly what
     * is held back); T_LEAD: bytes of <|python_tag|> matched at the end of held. */
    size_t j;
    struct strbuf held;  /* T_LEAD, T_HOLD: the held-back text */
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
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

static bool has(const char *src, size_t len, const char *s)
{
    return find(src, len, s, strlen(s)) != NULL;
}

enum toolcall_format toolcall_detect(const char *src, size_t len)
{
    if (has(src, len, MISTRAL_MARK))
        return TOOLCALL_MISTRAL;
    /* "name" written as a JSON key, plainly or inside a double-quoted Jinja string. */
    bool json_name = has(src, len, "\"name\": ") || has(src, len, "\\\"name\\\": ");
    bool json_params = has(src, len, "\"parameters\": ") || has(src, len, "\\\"parameters\\\": ");
    bool xml_args = has(src, len, "<function=") || has(src, len, "<arg_key>") || has(src, len, "<invoke ");
    if (has(src, len, HERMES_OPEN) && !has(src, len, "<tool_calls>") && json_name && !xml_args)
        return TOOLCALL_HERMES;
    if (has(src, len, "<|start_header_id|>") && json_params && !xml_args)
        return TOOLCALL_LLAMA3;
    return TOOLCALL_NONE;
}

const char *toolcall_format_name(enum toolcall_format f)
{
    switch (f) {
    case TOOLCALL_NONE: return "none";
    case TOOLCALL_HERMES: return "hermes";
    case TOOLCALL_LLAMA3: return "llama3";
    case TOOLCALL_MISTRAL: return "mistral";
    }
    return "unknown";
}

static void set_marker(struct toolcall *t, const char *m)
{
    t->marker = m;
    t->mlen = strlen(m);
    size_t j = 0;
    t->mfail[0] = 0;
    for (size_t i = 1; i < t->mlen; i++) {
        while (j > 0 && m[i] != m[j])
            j = t->mfail[j - 1];
        if (m[i] == m[j])
            j++;
        t->mfail[i] = (uint8_t)j;
    }
}

static void start(struct toolcall *t)
{
    t->j = 0;
    strbuf_clear(&t->held);
    switch (t->fmt) {
    case TOOLCALL_HERMES:
    case TOOLCALL_MISTRAL: t->state = T_SCAN; break;
    case TOOLCALL_LLAMA3: t->state = T_LEAD; break;
    default: t->state = T_PASS; break;
    }
}

int toolcall_create(struct toolcall **out, enum toolcall_format f, uint64_t id_seed, size_t max_held,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (f != TOOLCALL_NONE && f != TOOLCALL_HERMES && f != TOOLCALL_LLAMA3 && f != TOOLCALL_MISTRAL)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "unknown tool call format %d", (int)f);
    struct toolcall *t = calloc(1, sizeof *t);
    if (!t)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for the tool call splitter");
    t->fmt = f;
    t->seed = id_seed;
    t->max_held = max_held ? max_held : TOOLCALL_DEFAULT_MAX_HELD;
    if (t->max_held < MIN_HELD)
        t->max_held = MIN_HELD;
    set_marker(t, f == TOOLCALL_HERMES ? HERMES_OPEN : f == TOOLCALL_MISTRAL ? MISTRAL_MARK : PYTHON_TAG);
    start(t);
    *out = t;
    return 0;
}

void toolcall_release(struct toolcall *t)
{
    if (!t)
        return;
    strbuf_free(&t->held);
    free(t);
}

/* Gives up holding: the held text becomes content and the stream passes through. */
static void give_up(struct toolcall *t, struct strbuf *content)
{
    strbuf_put(content, t->held.p, t->held.len);
    strbuf_clear(&t->held);
    t->j = 0;
    t->state = T_PASS;
}

/* T_SCAN from text[i]: content passes on until the marker is complete (then T_HOLD
 * with the marker held); returns the index after the bytes consumed. Positions count
 * in marker[0..hlen) + text[i..len), the partial marker held from before first. */
static size_t scan(struct toolcall *t, const char *text, size_t i, size_t len, struct strbuf *content)
{
    size_t hlen = t->j;
    const char *s = text + i;
    size_t n = len - i;
    for (size_t k = 0; k < n; k++) {
        size_t j = t->j;
        while (j > 0 && t->marker[j] != s[k])
            j = t->mfail[j - 1];
        if (t->marker[j] == s[k])
            j++;
        t->j = j;
        if (j == t->mlen) {
            size_t x = hlen + k + 1 - t->mlen;  /* content ends where the marker starts */
            size_t h = x < hlen ? x : hlen;
            strbuf_put(content, t->marker, h);
            strbuf_put(content, s, x - h);
            strbuf_put(&t->held, t->marker, t->mlen);
            t->j = 0;
            t->state = T_HOLD;
            return i + k + 1;
        }
    }
    size_t x = hlen + n - t->j;
    size_t h = x < hlen ? x : hlen;
    strbuf_put(content, t->marker, h);
    strbuf_put(content, s, x - h);
    return len;
}

/* T_LEAD from text[i]; returns the index after the bytes consumed. */
static size_t lead(struct toolcall *t, const char *text, size_t i, size_t len, struct strbuf *content)
{
    for (; i < len; i++) {
        char c = text[i];
        if (t->held.len >= t->max_held) {
            give_up(t, content);
            return i;
        }
        if (t->j > 0) {
            if (c != t->marker[t->j]) {
                give_up(t, content);
                return i;
            }
            strbuf_put(&t->held, &c, 1);
            if (++t->j == t->mlen) {
                t->j = 0;
                t->state = T_HOLD;
                return i + 1;
            }
        } else if (is_ws(c)) {
            strbuf_put(&t->held, &c, 1);
        } else if (c == '{') {
            strbuf_put(&t->held, &c, 1);
            t->state = T_HOLD;
            return i + 1;
        } else if (c == t->marker[0]) {
            strbuf_put(&t->held, &c, 1);
            t->j = 1;
        } else {
            give_up(t, content);
            return i;
        }
    }
    return len;
}

int toolcall_feed(struct toolcall *t, const char *text, size_t len, struct strbuf *content)
{
    if (len == 0)
        return 0;
    /* Reserve every byte that could move, so nothing below fails half-way: content may
     * get the held text and all of this piece, held at most up to max_held. */
    if (len > SIZE_MAX - t->max_held - MAX_MARKER || strbuf_reserve(content, t->held.len + MAX_MARKER + len))
        return CAIRN_ENOMEM;
    size_t room = t->max_held > t->held.len ? t->max_held - t->held.len : 0;
    size_t grow = len + MAX_MARKER < room ? len + MAX_MARKER : room;
    if (t->state != T_PASS && strbuf_reserve(&t->held, grow))
        return CAIRN_ENOMEM;
    size_t i = 0;
    while (i < len) {
        switch (t->state) {
        case T_SCAN:
            i = scan(t, text, i, len, content);
            break;
        case T_LEAD:
            i = lead(t, text, i, len, content);
            break;
        case T_HOLD:
            if (len - i > t->max_held - t->held.len) {
                give_up(t, content);
                break;
            }
            strbuf_put(&t->held, text + i, len - i);
            i = len;
            break;
        case T_PASS:
            strbuf_put(content, text + i, len - i);
            i = len;
            break;
        }
    }
    return 0;
}

/* {"name": ..., "arguments": "<JSON text>"} from a call object the model wrote, or NULL
 * when it is not one (no name, arguments neither object nor string). */
static json_t *make_fn(const json_t *obj)
{
    if (!json_is_object(obj))
        return NULL;
    const json_t *name = json_object_get(obj, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return NULL;
    const json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    json_t *text = NULL;
    if (!args || json_is_null(args)) {
        text = json_string("{}");
    } else if (json_is_object(args)) {
        char *s = json_dumps(args, JSON_COMPACT);
        if (s)
            text = json_string(s);
        free(s);
    } else if (json_is_string(args)) {
        text = json_copy((json_t *)args);
    }
    if (!text)
        return NULL;
    return json_pack("{s:O, s:o}", "name", name, "arguments", text);
}

/* Parses one JSON object or array at the start of p (n bytes); *used gets the bytes it
 * took. NULL when there is none. */
static json_t *load_prefix(const char *p, size_t n, size_t *used)
{
    json_error_t e;
    json_t *j = json_loadb(p, n, JSON_DISABLE_EOF_CHECK, &e);
    if (j)
        *used = (size_t)e.position;
    return j;
}

static size_t skip_ws(const char *h, size_t i, size_t n)
{
    while (i < n && is_ws(h[i]))
        i++;
    return i;
}

/* What one parse of held text found: function objects in order, and the content
 * between calls that is not just whitespace. */
struct found {
    json_t *fns;
    struct strbuf text;
};

static void piece(struct found *f, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!is_ws(p[i])) {
            strbuf_put(&f->text, p, n);
            return;
        }
    }
}

/* Appends the calls of one JSON value (a call object, or a non-empty array of them) to
 * fns; all or nothing. */
static bool add_fns(const json_t *v, json_t *fns)
{
    json_t *tmp = json_array();
    bool ok = tmp != NULL;
    if (json_is_array(v)) {
        ok = ok && json_array_size(v) > 0;
        for (size_t k = 0; ok && k < json_array_size(v); k++) {
            json_t *fn = make_fn(json_array_get(v, k));
            ok = fn && json_array_append_new(tmp, fn) == 0;
        }
    } else if (ok) {
        json_t *fn = make_fn(v);
        ok = fn && json_array_append_new(tmp, fn) == 0;
    }
    ok = ok && json_array_extend(fns, tmp) == 0;
    json_decref(tmp);
    return ok;
}

static void parse_hermes(const char *h, size_t n, struct found *f)
{
    const size_t olen = sizeof HERMES_OPEN - 1, clen = sizeof HERMES_CLOSE - 1;
    size_t pos = 0;
    size_t cpos = 0;  /* where the next close tag starts (n: there is none) once cknown */
    bool cknown = false;
    while (pos < n) {
        const char *m = find(h + pos, n - pos, HERMES_OPEN, olen);
        if (!m) {
            piece(f, h + pos, n - pos);
            break;
        }
        size_t mi = (size_t)(m - h), b = mi + olen;
        piece(f, h + pos, mi - pos);
        /* The call ends at its close tag, or where the next call starts when the close
         * tag is missing, or at the end of the text. The close tag found is kept for
         * the next calls, so text with many open tags is not searched over and over. */
        if (!cknown || (cpos < b && cpos != n)) {
            const char *e = find(h + b, n - b, HERMES_CLOSE, clen);
            cpos = e ? (size_t)(e - h) : n;
            cknown = true;
        }
        const char *o = find(h + b, (cpos < n ? cpos : n) - b, HERMES_OPEN, olen);
        size_t end = n, after = n;
        if (o)
            end = after = (size_t)(o - h);
        else if (cpos < n)
            end = cpos, after = cpos + clen;
        size_t s = skip_ws(h, b, end), t = end;
        while (t > s && is_ws(h[t - 1]))
            t--;
        json_error_t err;
        json_t *obj = t > s ? json_loadb(h + s, t - s, 0, &err) : NULL;
        if (!add_fns(obj, f->fns))
            strbuf_put(&f->text, h + mi, after - mi);
        json_decref(obj);
        pos = after;
    }
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == ':';
}

/* One [TOOL_CALLS] segment starting at q (after the marker and whitespace), ending at
 * most at lim; returns the end of the calls, or 0 when they are not valid. */
static size_t mistral_segment(const char *h, size_t q, size_t lim, json_t *fns)
{
    static const char call_id[] = "[CALL_ID]", args[] = "[ARGS]";
    size_t used = 0;
    if (q < lim && h[q] == '[') {
        json_t *arr = load_prefix(h + q, lim - q, &used);
        bool ok = json_is_array(arr) && json_array_size(arr) > 0;
        ok = ok && add_fns(arr, fns);
        json_decref(arr);
        return ok ? q + used : 0;
    }
    size_t s = q;
    while (q < lim && name_char(h[q]))
        q++;
    if (q == s || q - s > 256)
        return 0;
    json_t *name = json_stringn(h + s, q - s);
    if (lim - q >= sizeof call_id - 1 && memcmp(h + q, call_id, sizeof call_id - 1) == 0) {
        q += sizeof call_id - 1;
        while (q < lim && name_char(h[q]))
            q++;
    }
    if (lim - q < sizeof args - 1 || memcmp(h + q, args, sizeof args - 1) != 0) {
        json_decref(name);
        return 0;
    }
    q = skip_ws(h, q + sizeof args - 1, lim);
    json_t *a = q < lim && h[q] == '{' ? load_prefix(h + q, lim - q, &used) : NULL;
    json_t *obj = a && name ? json_pack("{s:O, s:O}", "name", name, "arguments", a) : NULL;
    json_t *fn = make_fn(obj);
    json_decref(obj);
    json_decref(a);
    json_decref(name);
    if (!fn || json_array_append_new(fns, fn))
        return 0;
    return q + used;
}

static void parse_mistral(const char *h, size_t n, struct found *f)
{
    const size_t mlen = sizeof MISTRAL_MARK - 1;
    size_t pos = 0;
    while (pos < n) {
        const char *m = find(h + pos, n - pos, MISTRAL_MARK, mlen);
        if (!m) {
            piece(f, h + pos, n - pos);
            break;
        }
        size_t mi = (size_t)(m - h);
        piece(f, h + pos, mi - pos);
        const char *next = find(h + mi + mlen, n - mi - mlen, MISTRAL_MARK, mlen);
        size_t lim = next ? (size_t)(next - h) : n;
        size_t after = mistral_segment(h, skip_ws(h, mi + mlen, lim), lim, f->fns);
        if (!after) {
            strbuf_put(&f->text, h + mi, lim - mi);
            after = lim;
        }
        pos = after;
    }
}

/* All or nothing: the whole held text must be calls. */
static void parse_llama3(const char *h, size_t n, struct found *f)
{
    const size_t plen = sizeof PYTHON_TAG - 1;
    size_t q = skip_ws(h, 0, n);
    if (n - q >= plen && memcmp(h + q, PYTHON_TAG, plen) == 0)
        q = skip_ws(h, q + plen, n);
    bool ok = q < n;
    while (ok && q < n) {
        size_t used = 0;
        json_t *obj = h[q] == '{' ? load_prefix(h + q, n - q, &used) : NULL;
        json_t *fn = make_fn(obj);
        json_decref(obj);
        ok = fn && json_array_append_new(f->fns, fn) == 0;
        q = skip_ws(h, q + used, n);
        if (q < n && h[q] == ';')
            q = skip_ws(h, q + 1, n);
    }
    if (!ok)
        json_array_clear(f->fns);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void toolcall_new_id(uint64_t seed, uint64_t *counter, bool mistral, const json_t *calls,
                     char out[TOOLCALL_ID_MAX])
{
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    const char *prefix = mistral ? "" : "call_";
    size_t plen = strlen(prefix), nch = mistral ? 9 : 16;
    for (;;) {
        uint64_t x = mix(seed ^ mix((*counter)++));
        memcpy(out, prefix, plen);
        for (size_t i = 0; i < nch; i++) {
            x = mix(x + i);
            out[plen + i] = digits[x % 62];
        }
        out[plen + nch] = '\0';
        bool dup = false;
        for (size_t k = 0; k < json_array_size(calls) && !dup; k++) {
            const char *id = json_string_value(json_object_get(json_array_get(calls, k), "id"));
            dup = id && strcmp(id, out) == 0;
        }
        if (!dup)
            return;
    }
}

int toolcall_finish(struct toolcall *t, struct strbuf *content, json_t **calls)
{
    *calls = NULL;
    json_t *arr = json_array();
    struct found f = {json_array(), {0}};
    int rc = CAIRN_ENOMEM;
    if (!arr || !f.fns)
        goto out;
    switch (t->state) {
    case T_SCAN:
        if (strbuf_put(content, t->marker, t->j))
            goto out;
        break;
    case T_LEAD:
        if (strbuf_put(content, t->held.p, t->held.len))
            goto out;
        break;
    case T_HOLD:
        if (t->fmt == TOOLCALL_HERMES)
            parse_hermes(t->held.p, t->held.len, &f);
        else if (t->fmt == TOOLCALL_MISTRAL)
            parse_mistral(t->held.p, t->held.len, &f);
        else
            parse_llama3(t->held.p, t->held.len, &f);
        if (json_array_size(f.fns) == 0) {
            if (strbuf_put(content, t->held.p, t->held.len))
                goto out;
            break;
        }
        if (strbuf_put(content, f.text.p, f.text.len))
            goto out;
        for (size_t k = 0; k < json_array_size(f.fns); k++) {
            char id[TOOLCALL_ID_MAX];
            toolcall_new_id(t->seed, &t->counter, t->fmt == TOOLCALL_MISTRAL, arr, id);
            json_t *call = json_pack("{s:s, s:s, s:O}", "id", id, "type", "function", "function",
                                     json_array_get(f.fns, k));
            if (!call || json_array_append_new(arr, call))
                goto out;
        }
        break;
    case T_PASS:
        break;
    }
    start(t);
    *calls = arr;
    arr = NULL;
    rc = 0;
out:
    json_decref(arr);
    json_decref(f.fns);
    strbuf_free(&f.text);
    return rc;
}

int toolcall_parse(enum toolcall_format f, uint64_t id_seed, const char *text, size_t len,
                   struct strbuf *content, json_t **calls, char *err, size_t errlen)
{
    *calls = NULL;
    struct toolcall *t;
    size_t cap = len > TOOLCALL_DEFAULT_MAX_HELD ? len : TOOLCALL_DEFAULT_MAX_HELD;
    int rc = toolcall_create(&t, f, id_seed, cap, err, errlen);
    if (rc)
        return rc;
    rc = toolcall_feed(t, text, len, content);
    if (!rc)
        rc = toolcall_finish(t, content, calls);
    toolcall_release(t);
    if (rc)
        return cairn_fail(err, errlen, rc, "out of memory parsing tool calls");
    return 0;
}
