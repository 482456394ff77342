/* One sequence's text pipeline (runner_text.h). */
#include "runner/runner_text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

struct text_seq {
    const struct tok *tok;
    struct tok_stream detok;
    struct stopstr *stop;
    struct reasoning *reasoning; /* NULL: off */
    struct toolcall *tools;      /* NULL: off */
    struct harmony *harmony;     /* NULL: off (then reasoning and tools may be on) */
    bool logprobs, stopped;
    char *piece;                 /* one token's text */
    size_t piece_cap;
    /* stage outputs: after stop strings, then reasoning/content, then content after tools */
    struct strbuf after_stop, reasoning_out, after_reasoning, content_out;
    json_t *pending_logprobs;
};

int text_seq_create(struct text_seq **out, const struct text_seq_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    struct text_seq *s = calloc(1, sizeof *s);
    if (!s)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    s->tok = o->tok;
    bool markers = o->tools == TOOLCALL_LLAMA3 || o->tools == TOOLCALL_MISTRAL || o->harmony; /* control tokens */
    tok_stream_init(&s->detok, o->tok, markers);
    s->logprobs = o->logprobs;
    s->piece_cap = 3 * (tok_max_token_text(o->tok) + 4);
    s->piece = malloc(s->piece_cap);
    int rc = s->piece ? 0 : cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (!rc)
        rc = stopstr_create(&s->stop, o->stops, o->n_stops, err, errlen);
    if (!rc && o->harmony)
        rc = harmony_create(&s->harmony, o->id_seed, err, errlen);
    if (!rc && o->reasoning && !o->harmony)
        rc = reasoning_create(&s->reasoning, &o->reasoning_opts, err, errlen);
    if (!rc && o->tools != TOOLCALL_NONE && !o->harmony)
        rc = toolcall_create(&s->tools, o->tools, o->id_seed, 0, err, errlen);
    if (rc) {
        text_seq_release(s);
        return rc;
    }
    *out = s;
    return 0;
}

void text_seq_release(struct text_seq *s)
{
    if (!s)
        return;
    stopstr_release(s->stop);
    reasoning_release(s->reasoning);
    toolcall_release(s->tools);
    harmony_release(s->harmony);
    free(s->piece);
    strbuf_free(&s->after_stop);
    strbuf_free(&s->reasoning_out);
    strbuf_free(&s->after_reasoning);
    strbuf_free(&s->content_out);
    json_decref(s->pending_logprobs);
    free(s);
}

/* Moves what the stop filter let through down the other stages. */
static int pass_on(struct text_seq *s)
{
    int rc = 0;
    struct strbuf *content = &s->after_stop;
    if (s->harmony) {
        rc = harmony_feed(s->harmony, content->p, content->len, &s->reasoning_out, &s->content_out);
        strbuf_clear(content);
        return rc;
    }
    if (s->reasoning) {
        rc = reasoning_feed(s->reasoning, s->after_stop.p, s->after_stop.len, &s->reasoning_out,
                            &s->after_reasoning);
        strbuf_clear(&s->after_stop);
        content = &s->after_reasoning;
    }
    if (!rc && s->tools)
        rc = toolcall_feed(s->tools, content->p, content->len, &s->content_out);
    else if (!rc)
        rc = strbuf_put(&s->content_out, content->p, content->len);
    strbuf_clear(content);
    return rc;
}

/* {"token", "logprob", "bytes"} of one token. */
static json_t *logprob_entry(const struct tok *tok, int32_t id, float logprob)
{
    char text[512];
    size_t len = 0;
    if (tok_token_text(tok, id, 1, text, sizeof text, &len))
        len = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)text[i]));
    /* The token's own bytes may end inside a character: JSON text must be valid. */
    json_t *str = json_stringn(text, len);
    if (!str)
        str = json_string("");
    return json_pack("{s:o, s:f, s:o}", "token", str, "logprob", isfinite(logprob) ? logprob : -9999.0, "bytes",
                     bytes ? bytes : json_array());
}

static int add_logprobs(struct text_seq *s, const struct sched_token *t)
{
    if (!s->pending_logprobs && !(s->pending_logprobs = json_array()))
        return CAIRN_ENOMEM;
    json_t *e = logprob_entry(s->tok, t->token, t->logprob);
    json_t *top = json_array();
    for (int k = 0; e && top && k < t->n_top; k++)
        json_array_append_new(top, logprob_entry(s->tok, t->top_token[k], t->top_logprob[k]));
    if (!e || !top || json_object_set_new(e, "top_logprobs", top) || json_array_append_new(s->pending_logprobs, e))
        return CAIRN_ENOMEM;
    return 0;
}

int text_seq_token(struct text_seq *s, const struct sched_token *t)
{
    if (s->stopped)
        return 1;
    size_t len = 0;
    int rc = tok_stream_feed(&s->detok, t->token, s->piece, s->piece_cap, &len);
    if (rc == CAIRN_ERANGE)
        len = 0; /* a token the tokenizer does not know (vocabulary larger than the model's) */
    else if (rc)
        return rc;
    if (s->logprobs && (rc = add_logprobs(s, t)))
        return rc;
    int matched = stopstr_feed(s->stop, s->piece, len, &s->after_stop);
    if (matched < 0)
        return matched;
    if ((rc = pass_on(s)))
        return rc;
    s->stopped = matched == 1;
    return s->stopped;
}

int text_seq_finish(struct text_seq *s, json_t **tool_calls)
{
    *tool_calls = NULL;
    size_t len = 0;
    int rc = 0;
    if (!s->stopped && (rc = tok_stream_flush(&s->detok, s->piece, s->piece_cap, &len)) == 0)
        rc = stopstr_feed(s->stop, s->piece, len, &s->after_stop) < 0 ? CAIRN_ENOMEM : 0;
    if (!rc)
        rc = stopstr_flush(s->stop, &s->after_stop) < 0 ? CAIRN_ENOMEM : 0;
    if (!rc)
        rc = pass_on(s);
    if (!rc && s->harmony) {
        json_t *calls = NULL;
        rc = harmony_finish(s->harmony, &s->reasoning_out, &s->content_out, &calls);
        if (!rc && json_array_size(calls) > 0)
            *tool_calls = calls;
        else
            json_decref(calls);
        return rc;
    }
    if (!rc && s->reasoning) {
        rc = reasoning_flush(s->reasoning, &s->reasoning_out, &s->after_reasoning);
        if (!rc)
            rc = s->tools ? toolcall_feed(s->tools, s->after_reasoning.p, s->after_reasoning.len, &s->content_out)
                          : strbuf_put(&s->content_out, s->after_reasoning.p, s->after_reasoning.len);
        strbuf_clear(&s->after_reasoning);
    }
    if (!rc && s->tools) {
        json_t *calls = NULL;
        rc = toolcall_finish(s->tools, &s->content_out, &calls);
        if (!rc && json_array_size(calls) > 0)
            *tool_calls = calls;
        else
            json_decref(calls);
    }
    return rc;
}

bool text_seq_take(struct text_seq *s, const char **content, const char **reasoning, json_t **logprobs)
{
    static const char empty[] = "";
    *logprobs = s->pending_logprobs;
    s->pending_logprobs = NULL;
    bool any = s->content_out.len || s->reasoning_out.len || *logprobs;
    /* Buffers keep their bytes until the next feed clears them: the caller reads first. */
    *content = s->content_out.len ? s->content_out.p : empty;
    *reasoning = s->reasoning_out.len ? s->reasoning_out.p : empty;
    s->content_out.len = 0;
    s->reasoning_out.len = 0;
    return any;
}

int text_seq_stop_matched(const struct text_seq *s) { return stopstr_matched(s->stop); }
