/* Tokenizers read from a GGUF file's tokenizer.ggml.* metadata, matching the models'
 * own tooling (llama.cpp / Hugging Face) token for token:
 *   - "llama": SentencePiece-style BPE over scores, byte fallback <0xNN>, a leading space
 *     before the text and after every special token (tokenizer.ggml.add_space_prefix).
 *   - "gpt2":  byte-level BPE over merge ranks (priority queue, O(n log n) per pre-token)
 *     after a pre-tokenizer split chosen by tokenizer.ggml.pre and run with PCRE2.
 * Special tokens: USER_DEFINED tokens are always matched whole before any splitting;
 * CONTROL and UNKNOWN tokens only when the caller asks (parse_special).
 *
 * A struct tok is immutable after tok_load: encode, decode and streams may run on it
 * from any number of threads at once (every call allocates its own scratch). It copies
 * what it needs from the GGUF file, which may be closed after tok_load. */
#ifndef CAIRN_TOK_TOK_H
#define CAIRN_TOK_TOK_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tok;

enum tok_kind { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* Token attributes (bits), after the metadata's token_type and llama.cpp's fix-ups
 * (end-of-turn looking tokens become CONTROL). */
#define TOK_ATTR_UNKNOWN 0x01u
#define TOK_ATTR_UNUSED 0x02u
#define TOK_ATTR_NORMAL 0x04u
#define TOK_ATTR_CONTROL 0x08u
#define TOK_ATTR_USER_DEFINED 0x10u
#define TOK_ATTR_BYTE 0x20u

/* Builds a tokenizer from f's metadata. *out is NULL on failure; CAIRN_EFORMAT for
 * missing or malformed keys, CAIRN_EUNSUPPORTED for an unknown tokenizer.ggml.model or
 * tokenizer.ggml.pre (the message names it), CAIRN_ENOMEM. */
int tok_load(struct tok **out, const struct gguf_file *f, char *err, size_t errlen);

/* Frees a tokenizer; accepts NULL. */
void tok_release(struct tok *t);

/* Number of tokens in the vocabulary; valid ids are [0, tok_n_vocab). */
int32_t tok_n_vocab(const struct tok *t);
/* TOK_KIND_SPM or TOK_KIND_BPE. */
enum tok_kind tok_kind(const struct tok *t);
/* The pre-tokenizer name in use (tokenizer.ggml.pre, "default" when absent). */
const char *tok_pre(const struct tok *t);

/* Special ids, or -1 when the model has none. */
int32_t tok_bos(const struct tok *t);
int32_t tok_eos(const struct tok *t);
int32_t tok_eot(const struct tok *t);
/* Whether encoding with add_special prepends BOS / appends EOS (model metadata). */
int tok_add_bos(const struct tok *t);
int tok_add_eos(const struct tok *t);
/* Whether id ends generation: EOS, EOT, EOM and the end-of-turn tokens llama.cpp derives
 * from the vocabulary (<|im_end|>, <|eot_id|>, <|endoftext|>, <end_of_turn>, ...). */
int tok_is_eog(const struct tok *t, int32_t id);
/* TOK_ATTR_* bits of id (0 when out of range). */
unsigned tok_attr(const struct tok *t, int32_t id);

/* Id of the token whose vocabulary text is exactly the NUL-terminated text, or -1. */
int32_t tok_find_token(const struct tok *t, const char *text);

/* Raw vocabulary text of id (e.g. "Ġhello", "▁Hello", "<0x0A>"), owned by t and valid
 * until tok_release; *len gets its length. NULL when id is out of range. */
const char *tok_piece(const struct tok *t, int32_t id, size_t *len);

/* Longest text one token renders to, in bytes (sizes streaming buffers). */
size_t tok_max_token_text(const struct tok *t);

/* Tokenizes len bytes of text (any bytes: invalid UTF-8 becomes U+FFFD for byte-level BPE
 * as the reference does, byte tokens for SentencePiece). add_special: prepend BOS and
 * append EOS when the model's add_bos / add_eos flags say so. parse_special: also match
 * CONTROL/UNKNOWN token texts (e.g. "<|im_start|>") as single tokens. Writes up to max ids
 * to out and their count to *n_out; when max is too small returns CAIRN_EFULL with
 * *n_out = the count needed (out then holds the first max ids). CAIRN_ERANGE for text over
 * 256 MiB, CAIRN_ENOMEM. */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_special,
               int parse_special, int32_t *out, int64_t max, int64_t *n_out);

/* As tok_encode, and *work (not NULL) gets the steps its merge queues took: a count of
 * the work done, which tests compare across input sizes instead of timings. */
int tok_encode_counted(const struct tok *t, const char *text, size_t len, int add_special, int parse_special,
                       int32_t *out, int64_t max, int64_t *n_out, int64_t *work);

/* The bytes one token renders to (SentencePiece ▁ as space, byte tokens as their byte,
 * byte-level BPE mapped back to bytes), without the leading-space rule. CONTROL and
 * UNKNOWN tokens render as nothing unless render_special. *len gets the length; returns
 * CAIRN_EFULL (with *len the size needed) when cap is too small, CAIRN_ERANGE for a bad id. */
int tok_token_text(const struct tok *t, int32_t id, int render_special, char *out,
                   size_t cap, size_t *len);

/* Detokenizes n ids: the concatenation of tok_token_text, where for SentencePiece models
 * (add_space_prefix) the first token that renders any text loses one leading space.
 * The bytes may end inside a UTF-8 character; no clean-up of spaces is applied, so
 * tok_detok(tok_encode(x)) == x for lossless inputs. CAIRN_EFULL (with *len the size
 * needed), CAIRN_ERANGE for a bad id. */
int tok_detok(const struct tok *t, const int32_t *ids, int64_t n, int render_special,
              char *out, size_t cap, size_t *len);

/* Streaming detokenizer: fed tokens one at a time, it emits text as soon as it is final
 * and valid UTF-8. The concatenation of everything emitted (feeds, then flush) equals
 * tok_detok of all the ids with invalid UTF-8 replaced by U+FFFD (one per maximal
 * invalid subpart), and after each feed the emitted text is the longest prefix of that
 * for the ids so far which no later token can change. A plain value: init it, copy it
 * freely; it points at t, which must outlive it. */
struct tok_stream {
    const struct tok *tok;
    int render_special;
    int started;           /* a token has rendered text (the leading-space rule is spent) */
    unsigned npend;        /* bytes of an unfinished UTF-8 character held back */
    unsigned char pend[4];
};

void tok_stream_init(struct tok_stream *s, const struct tok *t, int render_special);
/* Feeds id and writes the text that became final to out (*len bytes, possibly 0).
 * A cap of 3 * (tok_max_token_text(t) + 4) always suffices; with less, CAIRN_EFULL gives
 * the size needed in *len and leaves the stream unchanged. CAIRN_ERANGE for a bad id. */
int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *len);
/* Ends the stream: a held-back unfinished character comes out as U+FFFD (cap >= 3
 * suffices). The stream is then empty and may be fed again as a continuation. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *len);

#endif
