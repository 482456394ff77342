/* Tokenizer object: loading from GGUF metadata, special tokens, encode dispatch,
 * detokenization and the streaming detokenizer. The rules follow llama.cpp's
 * llama-vocab.cpp (the reference the test vectors come from). */
#include "tok/tok_impl.h"

#include "base/err.h"
#include "base/log.h"
#include "gguf/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ---- */

static int get_id(const struct gguf_file *f, const char *key, int32_t n_vocab, int32_t *id)
{
    uint32_t v;
    if (gguf_get_u32(f, key, &v))
        return 0;
    if (v >= (uint32_t)n_vocab) {
        log_warn("tokenizer: %s = %u is past the vocabulary (%d), ignored", key, v, n_vocab);
        return 0;
    }
    *id = (int32_t)v;
    return 1;
}

static int32_t find_text(const struct tok *t, const char *s)
{
    int32_t id = tok_strtab_find(&t->st, s, strlen(s));
    return id < t->n_vocab ? id : -1;
}

/* First token of the list present in the vocabulary, or -1. */
static int32_t find_first(const struct tok *t, const char *const *list)
{
    for (int i = 0; list[i]; i++) {
        int32_t id = find_text(t, list[i]);
        if (id >= 0)
            return id;
    }
    return -1;
}

#define FW_BAR "\xef\xbd\x9c"   /* U+FF5C, DeepSeek's fullwidth bar */
#define SPM_SP "\xe2\x96\x81"   /* U+2581 */

static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">",
    "<end_of_utterance>", NULL,
};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">", "[e~[", NULL,
};
/* gpt-oss: always rendered */
static const char *const always_user_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

static void mark_eog(struct tok *t, int32_t id)
{
    if (id >= 0 && id < t->n_vocab)
        t->eog[id] = 1;
}

/* llama.cpp derives end-of-generation tokens from their text and makes such tokens
 * CONTROL (so they are never produced from plain text and not rendered by default). */
static void derive_eog(struct tok *t, const struct gguf_file *f)
{
    int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
    get_id(f, "tokenizer.ggml.fim_pad_token_id", t->n_vocab, &fim_pad);
    get_id(f, "tokenizer.ggml.fim_rep_token_id", t->n_vocab, &fim_rep);
    get_id(f, "tokenizer.ggml.fim_sep_token_id", t->n_vocab, &fim_sep);
    struct { int32_t *id; const char *const *list; } auto_ids[] = {
        {&t->eot, eot_texts}, {&t->eom, eom_texts}, {&fim_pad, fim_pad_texts},
        {&fim_rep, fim_rep_texts}, {&fim_sep, fim_sep_texts},
    };
    for (size_t k = 0; k < sizeof auto_ids / sizeof auto_ids[0]; k++) {
        if (*auto_ids[k].id >= 0)
            continue;
        int32_t id = find_first(t, auto_ids[k].list);
        *auto_ids[k].id = id;
        if (id >= 0)
            t->attr[id] |= TOK_ATTR_CONTROL;
    }
    mark_eog(t, fim_pad);
    mark_eog(t, fim_rep);
    mark_eog(t, fim_sep);
    for (int i = 0; eog_texts[i]; i++) {
        int32_t id = find_text(t, eog_texts[i]);
        if (id >= 0) {
            t->eog[id] = 1;
            t->attr[id] |= TOK_ATTR_CONTROL;
        }
    }
    for (int i = 0; always_user_texts[i]; i++) {
        int32_t id = find_text(t, always_user_texts[i]);
        if (id >= 0)
            t->attr[id] = TOK_ATTR_USER_DEFINED;
    }
    mark_eog(t, t->eos);
    mark_eog(t, t->eot);
    mark_eog(t, t->eom);

    /* o200k_harmony / solar-open: <|end|> ends a message, not the generation */
    int32_t ret = find_text(t, "<|return|>"), call = find_text(t, "<|call|>");
    int32_t calls = find_text(t, "<|calls|>"), flush = find_text(t, "<|flush|>");
    int32_t end = find_text(t, "<|end|>");
    int has_call = (call >= 0 && t->eog[call]) || (calls >= 0 && t->eog[calls]);
    if (end >= 0 && t->eog[end] && has_call &&
        ((ret >= 0 && t->eog[ret]) || (flush >= 0 && t->eog[flush]))) {
        t->eog[end] = 0;
        t->attr[end] = TOK_ATTR_USER_DEFINED;
    }
    /* gemma4: </s> is not an end of generation when <|tool_response> is */
    int32_t tr = find_text(t, "<|tool_response>"), s = find_text(t, "</s>");
    if (tr >= 0 && s >= 0 && t->eog[tr] && t->eog[s]) {
        t->eog[s] = 0;
        t->attr[s] = TOK_ATTR_NORMAL;
    }
}

/* Rendered bytes of every token, as llama.cpp's token_to_piece with special = true. */
static int build_texts(struct tok *t)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += (size_t)(t->st.off[i + 1] - t->st.off[i]);
    t->text = malloc(total + 1);
    t->text_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->text_off);
    if (!t->text || !t->text_off)
        return CAIRN_ENOMEM;
    size_t o = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->text_off[i] = o;
        size_t len;
        const char *p = tok_strtab_get(&t->st, i, &len);
        unsigned a = t->attr[i];
        if (a & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED)) {
            memcpy(t->text + o, p, len);
            o += len;
        } else if (a & TOK_ATTR_NORMAL) {
            if (t->kind == TOK_KIND_BPE) {
                o += tok_bpe_decode_text(t, p, len, t->text + o);
            } else {
                for (size_t k = 0; k < len; k++) {
                    if (k + 3 <= len && !memcmp(p + k, SPM_SP, 3)) {
                        t->text[o++] = ' ';
                        k += 2;
                    } else {
                        t->text[o++] = p[k];
                    }
                }
            }
        } else if (a & TOK_ATTR_BYTE) {
            unsigned v;
            char tail;
            if (len == 6 && sscanf(p, "<0x%2x%c", &v, &tail) == 2 && tail == '>')
                t->text[o++] = (char)v;
        }
        size_t l = o - t->text_off[i];
        if (l > t->max_text)
            t->max_text = l;
    }
    t->text_off[t->n_vocab] = o;
    return 0;
}

struct spec_key {
    uint64_t len;
    int32_t id;
};

static int cmp_special(const void *a, const void *b)
{
    const struct spec_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t trie_child(const struct tok *t, int32_t node, unsigned char c)
{
    uint64_t key = (uint64_t)node << 8 | c;
    uint64_t i = (key * 0x9e3779b97f4a7c15ull >> 17) & t->trie_mask;
    for (;;) {
        if (t->trie_key[i] == key)
            return t->trie_child[i];
        if (t->trie_key[i] == UINT64_MAX)
            return -1;
        i = (i + 1) & t->trie_mask;
    }
}

/* Special tokens (CONTROL, USER_DEFINED, UNKNOWN) in matching priority and a byte trie
 * over their texts. */
static int build_specials(struct tok *t)
{
    int32_t n = 0;
    uint64_t bytes = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) {
            n++;
            bytes += t->st.off[i + 1] - t->st.off[i];
        }
    t->n_special = n;
    if (!n)
        return 0;
    t->special = malloc((size_t)n * sizeof *t->special);
    t->trie_tok = malloc(((size_t)bytes + 1) * sizeof *t->trie_tok);
    uint64_t slots = 64;
    while (slots < bytes * 2)
        slots <<= 1;
    t->trie_key = malloc(slots * sizeof *t->trie_key);
    t->trie_child = malloc(slots * sizeof *t->trie_child);
    if (!t->special || !t->trie_tok || !t->trie_key || !t->trie_child)
        return CAIRN_ENOMEM;
    memset(t->trie_key, 0xff, slots * sizeof *t->trie_key);
    t->trie_mask = slots - 1;
    struct spec_key *keys = malloc((size_t)n * sizeof *keys);
    if (!keys)
        return CAIRN_ENOMEM;
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN))
            keys[n++] = (struct spec_key){t->st.off[i + 1] - t->st.off[i], i};
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    for (int32_t k = 0; k < n; k++)
        t->special[k] = keys[k].id;
    free(keys);

    t->trie_nodes = 1;
    t->trie_tok[0] = -1;
    for (int32_t k = 0; k < n; k++) {
        int32_t id = t->special[k];
        size_t len;
        const unsigned char *p = (const unsigned char *)tok_strtab_get(&t->st, id, &len);
        if (!(t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
            t->has_user = 1;
        int32_t node = 0;
        for (size_t j = 0; j < len; j++) {
            int32_t c = trie_child(t, node, p[j]);
            if (c < 0) {
                c = t->trie_nodes++;
                t->trie_tok[c] = -1;
                uint64_t key = (uint64_t)node << 8 | p[j];
                uint64_t i = (key * 0x9e3779b97f4a7c15ull >> 17) & t->trie_mask;
                while (t->trie_key[i] != UINT64_MAX)
                    i = (i + 1) & t->trie_mask;
                t->trie_key[i] = key;
                t->trie_child[i] = c;
            }
            node = c;
        }
        if (len)
            t->special_first[p[0]] = 1;
        if (node > 0 && t->trie_tok[node] < 0)
            t->trie_tok[node] = id;
    }
    return 0;
}

/* The vocabulary arrays of the GGUF metadata, checked for type and length. */
struct vocab_meta {
    enum tok_kind kind;
    struct gguf_array toks, scores, types;
    int have_scores, have_types;
};

static int read_vocab_meta(const struct gguf_file *f, struct vocab_meta *m, char *err, size_t errlen)
{
    struct gguf_str model;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.model: missing or not a string");
    if (model.len == 5 && !memcmp(model.ptr, "llama", 5))
        m->kind = TOK_KIND_SPM;
    else if (model.len == 4 && !memcmp(model.ptr, "gpt2", 4))
        m->kind = TOK_KIND_BPE;
    else
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                          "tokenizer.ggml.model '%.*s' is not supported (llama, gpt2)",
                          (int)(model.len > 64 ? 64 : model.len), model.ptr);

    if (gguf_get_arr(f, "tokenizer.ggml.tokens", &m->toks) || m->toks.type != GGUF_STRING)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.tokens: missing or not an array of strings");
    if (m->toks.n == 0 || m->toks.n > (uint64_t)INT32_MAX / 2)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.tokens: %llu tokens",
                          (unsigned long long)m->toks.n);
    m->have_scores = !gguf_get_arr(f, "tokenizer.ggml.scores", &m->scores);
    if (m->have_scores && (m->scores.type != GGUF_FLOAT32 && m->scores.type != GGUF_INT32))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.scores: not an array of float32/int32");
    if (m->have_scores && m->scores.n < m->toks.n)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.scores: %llu scores for %llu tokens",
                          (unsigned long long)m->scores.n, (unsigned long long)m->toks.n);
    m->have_types = !gguf_get_arr(f, "tokenizer.ggml.token_type", &m->types);
    if (m->have_types && (m->types.type > GGUF_INT64 || m->types.type == GGUF_FLOAT32 ||
                          m->types.type == GGUF_BOOL || m->types.type == GGUF_STRING || m->types.type == GGUF_ARRAY))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.token_type: not an integer array");
    if (m->have_types && m->types.n < m->toks.n)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.token_type: %llu types for %llu tokens",
                          (unsigned long long)m->types.n, (unsigned long long)m->toks.n);
    return 0;
}

/* Texts, scores and attributes of every token. Returns 0 or a CAIRN_E* error, err filled. */
static int read_vocab(struct tok *t, const struct gguf_file *f, const struct vocab_meta *m, char *err,
                      size_t errlen)
{
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = t->byte_sym[b] = -1;
    if (tok_strtab_init(&t->st, t->n_vocab + 64))
        goto oom;
    t->attr = malloc((size_t)t->n_vocab);
    t->eog = calloc((size_t)t->n_vocab, 1);
    t->score = malloc((size_t)t->n_vocab * sizeof *t->score);
    if (!t->attr || !t->eog || !t->score)
        goto oom;

    for (int32_t i = 0; i < t->n_vocab; i++) {
        struct gguf_str s = gguf_arr_str(f, &m->toks, (uint64_t)i);
        char empty[32];
        if (s.len == 0) { /* as llama.cpp: an empty token gets a placeholder text */
            int l = snprintf(empty, sizeof empty, "[EMPTY_%d]", i);
            s.ptr = empty;
            s.len = (uint64_t)l;
        }
        if (s.len > (1u << 20))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.tokens[%d]: %llu bytes", i,
                              (unsigned long long)s.len);
        if (tok_strtab_add(&t->st, s.ptr, s.len) < 0)
            goto oom;
        t->score[i] = !m->have_scores ? 0.0f
                      : m->scores.type == GGUF_FLOAT32 ? (float)gguf_arr_float(&m->scores, (uint64_t)i)
                                                      : (float)gguf_arr_int(&m->scores, (uint64_t)i);
        int64_t ty = m->have_types ? gguf_arr_int(&m->types, (uint64_t)i) : 1;
        static const uint8_t type_attr[7] = {0, TOK_ATTR_NORMAL, TOK_ATTR_UNKNOWN, TOK_ATTR_CONTROL,
                                             TOK_ATTR_USER_DEFINED, TOK_ATTR_UNUSED, TOK_ATTR_BYTE};
        t->attr[i] = ty >= 0 && ty < 7 ? type_attr[ty] : 0;
    }
    return 0;
oom:
    return cairn_fail(err, errlen, CAIRN_ENOMEM, "tokenizer: out of memory for %d tokens", t->n_vocab);
}

/* Special token ids as llama.cpp defaults them, before the BPE merges are loaded. */
static void default_ids(struct tok *t)
{
    t->eot = t->eom = t->pad = -1;
    if (t->kind == TOK_KIND_SPM) {
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = 1;
        t->add_space_prefix = 1;
    } else {
        t->bos = t->eos = 11;
        t->unk = -1;
    }
}

/* Special token ids and flags from the metadata, over the defaults. */
static void read_ids(struct tok *t, const struct gguf_file *f)
{
    if (t->bos >= t->n_vocab)
        t->bos = -1;
    if (t->eos >= t->n_vocab)
        t->eos = -1;
    if (t->unk >= t->n_vocab)
        t->unk = -1;
    get_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos);
    get_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos);
    get_id(f, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot);
    get_id(f, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom);
    get_id(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk);
    get_id(f, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad);
    int v;
    if (!gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &v))
        t->add_bos = v;
    if (!gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &v))
        t->add_eos = v;
    if (!gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &v))
        t->add_space_prefix = v;
    if (t->add_bos && t->bos < 0) {
        log_warn("tokenizer: add_bos_token is set but there is no BOS token; not adding one");
        t->add_bos = 0;
    }
    if (t->add_eos && t->eos < 0) {
        log_warn("tokenizer: add_eos_token is set but there is no EOS token; not adding one");
        t->add_eos = 0;
    }
}

/* SPM: the token of each byte, <0xXX> or else the byte itself. */
static void find_byte_tokens(struct tok *t)
{
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = find_text(t, hex);
        if (id < 0) {
            char c = (char)b;
            id = tok_strtab_find(&t->st, &c, 1);
        }
        t->byte_tok[b] = id;
    }
}

int tok_load(struct tok **out, const struct gguf_file *f, char *err, size_t errlen)
{
    *out = NULL;
    struct vocab_meta m = {0};
    int rc;
    if ((rc = read_vocab_meta(f, &m, err, errlen)))
        return rc;

    struct gguf_str pre = {0};
    struct tok *t = calloc(1, sizeof *t);
    if (!t)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "tokenizer: out of memory");
    t->kind = m.kind;
    t->n_vocab = (int32_t)m.toks.n;
    if (!gguf_get_str(f, "tokenizer.ggml.pre", &pre) && pre.len > 0) {
        if (pre.len >= sizeof t->pre) {
            rc = cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "tokenizer.ggml.pre '%.40s...' is not a pre-tokenizer cairn knows", pre.ptr);
            goto fail;
        }
        memcpy(t->pre, pre.ptr, pre.len);
    } else {
        strcpy(t->pre, "default");
    }
    if ((rc = read_vocab(t, f, &m, err, errlen)))
        goto fail;

    /* defaults as llama.cpp, then metadata */
    default_ids(t);
    if (t->kind == TOK_KIND_BPE && (rc = tok_bpe_load(t, f, err, errlen)))
        goto fail;
    read_ids(t, f);
    if (t->kind == TOK_KIND_SPM)
        find_byte_tokens(t);
    derive_eog(t, f);
    if (t->kind == TOK_KIND_SPM && (rc = tok_spm_load(t))) /* after the final attributes */
        goto oom;
    if ((rc = build_texts(t)) || (rc = build_specials(t)))
        goto oom;
    *out = t;
    return 0;
oom:
    rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "tokenizer: out of memory for %d tokens", t->n_vocab);
fail:
    tok_release(t);
    return rc;
}

void tok_release(struct tok *t)
{
    if (!t)
        return;
    if (t->kind == TOK_KIND_BPE)
        tok_bpe_free(t);
    tok_strtab_free(&t->st);
    free(t->attr);
    free(t->eog);
    free(t->score);
    free(t->text);
    free(t->text_off);
    free(t->special);
    free(t->trie_tok);
    free(t->trie_key);
    free(t->trie_child);
    free(t->spm_pairs);
    free(t);
}

/* ---- getters ---- */

int32_t tok_n_vocab(const struct tok *t) { return t->n_vocab; }
enum tok_kind tok_kind(const struct tok *t) { return t->kind; }
const char *tok_pre(const struct tok *t) { return t->pre; }
int32_t tok_bos(const struct tok *t) { return t->bos; }
int32_t tok_eos(const struct tok *t) { return t->eos; }
int32_t tok_eot(const struct tok *t) { return t->eot; }
int tok_add_bos(const struct tok *t) { return t->add_bos; }
int tok_add_eos(const struct tok *t) { return t->add_eos; }
size_t tok_max_token_text(const struct tok *t) { return t->max_text; }

int tok_is_eog(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

unsigned tok_attr(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->attr[id] : 0;
}

int32_t tok_find_token(const struct tok *t, const char *text)
{
    return text ? find_text(t, text) : -1;
}

const char *tok_piece(const struct tok *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    return tok_strtab_get(&t->st, id, len);
}

/* ---- encoding ---- */

struct occ {
    int64_t pos;
    int32_t prio, id;
};

static int cmp_occ_prio(const void *a, const void *b)
{
    const struct occ *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_occ_pos(const void *a, const void *b)
{
    const struct occ *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* llama.cpp's tokenizer_st_partition takes special tokens one at a time, longest first,
 * and splits every remaining text fragment at each of that token's leftmost
 * non-overlapping occurrences. Equivalently: among all occurrences of all enabled
 * special tokens, taken in (priority, position) order, an occurrence is kept when none
 * of its bytes is covered by one kept before. Returns the kept ones by position. */
static int find_specials(const struct tok *t, const char *text, size_t len, int parse_special,
                         struct occ **outp, int64_t *n_out)
{
    *outp = NULL;
    *n_out = 0;
    if (!t->n_special || !len || (!parse_special && !t->has_user))
        return 0;
    struct occ *occ = NULL;
    int64_t n = 0, cap = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        if (!t->special_first[s[i]])
            continue;
        int32_t node = 0;
        for (size_t j = i; j < len; j++) {
            node = trie_child(t, node, s[j]);
            if (node < 0)
                break;
            int32_t id = t->trie_tok[node];
            if (id < 0 || (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))))
                continue;
            if (TOK_RESERVE(occ, cap, n + 1, sizeof *occ)) {
                free(occ);
                return CAIRN_ENOMEM;
            }
            occ[n++] = (struct occ){(int64_t)i, -1, id};
        }
    }
    if (!n)
        return 0;
    /* priority = index in t->special, found by binary search */
    for (int64_t k = 0; k < n; k++) {
        size_t lk = (size_t)(t->st.off[occ[k].id + 1] - t->st.off[occ[k].id] - 1);
        int32_t lo = 0, hi = t->n_special; /* special[] sorted by (len desc, id asc) */
        while (lo < hi) {
            int32_t mid = (lo + hi) / 2, m = t->special[mid];
            size_t lm = (size_t)(t->st.off[m + 1] - t->st.off[m] - 1);
            if (lm > lk || (lm == lk && m < occ[k].id))
                lo = mid + 1;
            else
                hi = mid;
        }
        occ[k].prio = lo;
    }
    qsort(occ, (size_t)n, sizeof *occ, cmp_occ_prio);
    uint8_t *claimed = calloc(len, 1);
    if (!claimed) {
        free(occ);
        return CAIRN_ENOMEM;
    }
    int64_t kept = 0;
    for (int64_t k = 0; k < n; k++) {
        size_t l = (size_t)(t->st.off[occ[k].id + 1] - t->st.off[occ[k].id] - 1);
        size_t p = (size_t)occ[k].pos, j;
        for (j = 0; j < l && !claimed[p + j]; j++)
            ;
        if (j < l)
            continue;
        memset(claimed + p, 1, l);
        occ[kept++] = occ[k];
    }
    free(claimed);
    qsort(occ, (size_t)kept, sizeof *occ, cmp_occ_pos);
    *outp = occ;
    *n_out = kept;
    return 0;
}

static int encode_fragment(const struct tok *t, struct tok_scratch *s, const char *p, size_t n,
                           int prev_special)
{
    if (t->kind == TOK_KIND_SPM)
        return tok_spm_encode(t, s, p, n, t->add_space_prefix && prev_special);
    return tok_bpe_encode(t, s, p, n);
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_special,
               int parse_special, int32_t *out, int64_t max, int64_t *n_out)
{
    return tok_encode_counted(t, text, len, add_special, parse_special, out, max, n_out, NULL);
}

int tok_encode_counted(const struct tok *t, const char *text, size_t len, int add_special, int parse_special,
                       int32_t *out, int64_t max, int64_t *n_out, int64_t *work)
{
    if (!t || (!text && len) || max < 0 || (!out && max > 0) || !n_out)
        return CAIRN_EINVAL;
    *n_out = 0;
    if (len > ((size_t)1 << 28))
        return CAIRN_ERANGE; /* symbol indices are 32-bit and escaping can triple the text */
    struct tok_scratch s = {0};
    struct occ *occ = NULL;
    int64_t nocc = 0;
    int rc = 0;
    if (add_special && t->add_bos && (rc = tok_ids_push(&s.out, t->bos)))
        goto done;
    if ((rc = find_specials(t, text, len, parse_special, &occ, &nocc)))
        goto done;
    size_t cur = 0;
    int prev_special = 1; /* SentencePiece: a space goes before the first fragment too */
    for (int64_t k = 0; k <= nocc; k++) {
        size_t end = k < nocc ? (size_t)occ[k].pos : len;
        if (end > cur) {
            if ((rc = encode_fragment(t, &s, text + cur, end - cur, prev_special)))
                goto done;
            prev_special = 0;
        }
        if (k == nocc)
            break;
        if ((rc = tok_ids_push(&s.out, occ[k].id)))
            goto done;
        prev_special = 1;
        cur = end + (size_t)(t->st.off[occ[k].id + 1] - t->st.off[occ[k].id] - 1);
    }
    if (add_special && t->add_eos && (rc = tok_ids_push(&s.out, t->eos)))
        goto done;
    *n_out = s.out.n;
    if (s.out.n > 0 && max > 0)
        memcpy(out, s.out.v, (size_t)(s.out.n < max ? s.out.n : max) * sizeof *out);
    if (s.out.n > max)
        rc = CAIRN_EFULL;
done:
    if (work)
        *work = s.work;
    free(occ);
    tok_scratch_free(&s);
    return rc;
}

/* ---- decoding ---- */

static const char *render(const struct tok *t, int32_t id, int render_special, size_t *len)
{
    if (!render_special && (t->attr[id] & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))) {
        *len = 0;
        return "";
    }
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id]);
    return t->text + t->text_off[id];
}

int tok_token_text(const struct tok *t, int32_t id, int render_special, char *out, size_t cap,
                   size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return CAIRN_ERANGE;
    size_t l;
    const char *p = render(t, id, render_special, &l);
    *len = l;
    if (l > cap)
        return CAIRN_EFULL;
    if (l)
        memcpy(out, p, l);
    return 0;
}

int tok_detok(const struct tok *t, const int32_t *ids, int64_t n, int render_special, char *out,
              size_t cap, size_t *len)
{
    *len = 0;
    size_t total = 0;
    int strip = t->add_space_prefix;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return CAIRN_ERANGE;
        size_t l;
        const char *p = render(t, ids[i], render_special, &l);
        if (!l)
            continue;
        if (strip) {
            strip = 0;
            if (p[0] == ' ') {
                p++;
                l--;
            }
        }
        if (total + l <= cap && l)
            memcpy(out + total, p, l);
        total += l;
    }
    *len = total;
    return total > cap ? CAIRN_EFULL : 0;
}

/* ---- streaming ---- */

void tok_stream_init(struct tok_stream *s, const struct tok *t, int render_special)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->render_special = render_special;
}

/* Runs held bytes + p through the UTF-8 decoder: writes complete characters (U+FFFD for
 * invalid subparts) to out when out is not NULL, returns the output size, and reports
 * how many trailing bytes form an unfinished character (kept unless flushing). */
static size_t stream_run(const unsigned char *pend, unsigned npend, const unsigned char *p,
                         size_t n, int flush, char *out, unsigned char *keep, unsigned *nkeep)
{
    unsigned char head[8];
    size_t nh = npend + (n < 4 ? n : 4), total = npend + n, i = 0, o = 0;
    memcpy(head, pend, npend);
    if (nh > npend) /* head: the held bytes and enough of p to finish a character */
        memcpy(head + npend, p, nh - npend);
    *nkeep = 0;
    while (i < total) {
        const unsigned char *c = i < npend ? head + i : p + (i - npend);
        size_t avail = i < npend ? nh - i : total - i;
        int r = tok_utf8_next(c, avail);
        if (r > 0) {
            if (out)
                memcpy(out + o, c, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
        } else if (r == 0) { /* unfinished character at the very end */
            if (!flush) {
                *nkeep = (unsigned)(total - i);
                for (unsigned k = 0; k < *nkeep; k++)
                    keep[k] = i + k < npend ? pend[i + k] : p[i + k - npend];
                break;
            }
            if (out)
                memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            break;
        } else {
            if (out)
                memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += (size_t)-r;
        }
    }
    return o;
}

int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *len)
{
    const struct tok *t = s->tok;
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return CAIRN_ERANGE;
    size_t l;
    const char *p = render(t, id, s->render_special, &l);
    if (!l)
        return 0;
    if (!s->started && t->add_space_prefix && p[0] == ' ') {
        p++;
        l--;
    }
    unsigned char keep[4];
    unsigned nkeep;
    size_t need = stream_run(s->pend, s->npend, (const unsigned char *)p, l, 0, NULL, keep, &nkeep);
    *len = need;
    if (need > cap)
        return CAIRN_EFULL;
    stream_run(s->pend, s->npend, (const unsigned char *)p, l, 0, out, keep, &nkeep);
    memcpy(s->pend, keep, nkeep);
    s->npend = nkeep;
    s->started = 1;
    return 0;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *len)
{
    unsigned char keep[4];
    unsigned nkeep;
    *len = 0;
    size_t need = stream_run(s->pend, s->npend, NULL, 0, 1, NULL, keep, &nkeep);
    *len = need;
    if (need > cap)
        return CAIRN_EFULL;
    stream_run(s->pend, s->npend, NULL, 0, 1, out, keep, &nkeep);
    s->npend = 0;
    return 0;
}
