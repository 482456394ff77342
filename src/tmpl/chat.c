#include "tmpl/chat.h"

#include "base/array.h"
#include "base/err.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "tmpl/tmpl.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

struct chat {
    const struct tok *tok;
    struct tmpl *tmpl; /* NULL: plain fallback */
    char *bos, *eos;   /* texts of the BOS/EOS tokens ("" when none) */
};

static char *piece_text(const struct tok *t, int32_t id)
{
    size_t len = 0;
    const char *p = id >= 0 ? tok_piece(t, id, &len) : NULL;
    char *s = malloc(len + 1);
    if (s) {
        if (p)
            memcpy(s, p, len);
        s[len] = 0;
    }
    return s;
}

int chat_create(struct chat **out, const struct gguf_file *f, const struct tok *t, char *err, size_t errlen)
{
    *out = NULL;
    struct chat *c = calloc(1, sizeof *c);
    if (!c)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    c->tok = t;
    c->bos = piece_text(t, tok_bos(t));
    c->eos = piece_text(t, tok_eos(t));
    if (!c->bos || !c->eos) {
        chat_release(c);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    struct gguf_str src;
    if (gguf_get_str(f, "tokenizer.chat_template", &src) == 0) {
        char terr[256];
        if (tmpl_parse(&c->tmpl, src.ptr, src.len, terr, sizeof terr)) {
            log_warn("chat template not usable (%s); chats use a plain format", terr);
            c->tmpl = NULL;
        }
    }
    *out = c;
    return 0;
}

void chat_release(struct chat *c)
{
    if (!c)
        return;
    tmpl_free(c->tmpl);
    free(c->bos);
    free(c->eos);
    free(c);
}

bool chat_has_template(const struct chat *c) { return c->tmpl != NULL; }

/* Appends to a growing buffer; returns false on allocation failure. */
static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (array_reserve(buf, cap, *len + n + 1, 1, 256))
        return false;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* "role: text\n" per message, then "assistant: " when a reply is wanted. */
static int render_plain(const json_t *messages, bool add_gen, char **out, size_t *out_len, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool ok = append(&buf, &len, &cap, "", 0);
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        ok = ok && append(&buf, &len, &cap, role ? role : "user", strlen(role ? role : "user")) &&
             append(&buf, &len, &cap, ": ", 2);
        if (json_is_string(content)) {
            ok = ok && append(&buf, &len, &cap, json_string_value(content), json_string_length(content));
        } else if (json_is_array(content)) {
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *text = json_object_get(part, "text");
                if (json_is_string(text))
                    ok = ok && append(&buf, &len, &cap, json_string_value(text), json_string_length(text));
            }
        }
        ok = ok && append(&buf, &len, &cap, "\n", 1);
    }
    if (add_gen)
        ok = ok && append(&buf, &len, &cap, "assistant: ", 11);
    if (!ok) {
        free(buf);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    *out = buf;
    *out_len = len;
    return 0;
}

int chat_render(const struct chat *c, const json_t *vars, bool add_generation_prompt, char **out, size_t *out_len,
                char *err, size_t errlen)
{
    *out = NULL;
    json_t *messages = json_object_get(vars, "messages");
    if (!json_is_array(messages))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "messages must be an array");
    if (!c->tmpl)
        return render_plain(messages, add_generation_prompt, out, out_len, err, errlen);
    json_t *v = json_deep_copy(vars);
    if (!v)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (!json_object_get(v, "add_generation_prompt"))
        json_object_set_new(v, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (!json_object_get(v, "bos_token"))
        json_object_set_new(v, "bos_token", json_string(c->bos));
    if (!json_object_get(v, "eos_token"))
        json_object_set_new(v, "eos_token", json_string(c->eos));
    int rc = tmpl_render(c->tmpl, v, out, out_len, err, errlen);
    json_decref(v);
    return rc;
}

int chat_tokenize(const struct chat *c, const char *text, size_t len, int32_t **ids, int64_t *n, char *err,
                  size_t errlen)
{
    size_t bos_len = strlen(c->bos);
    bool has_bos = bos_len && len >= bos_len && !memcmp(text, c->bos, bos_len);
    int add = tok_add_bos(c->tok) && !has_bos;
    int64_t cap = (int64_t)len + 8, need = 0;
    *ids = malloc((size_t)cap * sizeof **ids);
    if (!*ids)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    /* tok_encode's add_special adds BOS (and EOS when the model says so); EOS is not
     * wanted at the end of a prompt, so BOS is put in by hand. */
    int64_t off = 0;
    if (add) {
        (*ids)[0] = tok_bos(c->tok);
        off = 1;
    }
    int rc = tok_encode(c->tok, text, len, 0, 1, *ids + off, cap - off, &need);
    if (rc == CAIRN_EFULL) { /* invalid bytes can take several tokens each */
        int32_t *more = realloc(*ids, (size_t)(need + off) * sizeof **ids);
        rc = more ? tok_encode(c->tok, text, len, 0, 1, more + off, need, &need) : CAIRN_ENOMEM;
        if (more)
            *ids = more;
    }
    if (rc) {
        free(*ids);
        *ids = NULL;
        return cairn_fail(err, errlen, rc, "cannot tokenize the prompt");
    }
    *n = need + off;
    return 0;
}
