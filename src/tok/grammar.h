/* Constrained decoding: grammars in llama.cpp's GBNF, compiled to rules over bytes, and
 * the per-sequence matcher that says, at every step, which tokens can continue a valid
 * output.
 *
 * GBNF: `name ::= alternatives` rules (names [A-Za-z0-9_-]), the start rule named by the
 * caller (usually "root"); terms are "literals" (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH
 * \UHHHHHHHH), [character classes] with ranges and ^ negation, . (any character), rule
 * names, ( groups ), and the postfixes * + ? {m} {m,} {m,n}; | separates alternatives;
 * # starts a comment; a rule ends at a newline outside parentheses (a newline after |
 * continues it). Characters are Unicode code points; classes are compiled to alternatives
 * of UTF-8 byte sequences, so the matcher works on bytes and a token may end inside a
 * character.
 *
 * Matching (the engine is a set of stacks of rule positions, as in llama.cpp): each
 * stack's top is a byte-set element the next byte must match; a byte advances every
 * stack whose top matches, expanding rule references until each new top is a byte set
 * (or the stack is empty: the output may end there). Left recursion is refused when the
 * grammar is compiled; stacks deeper than GRAMMAR_MAX_DEPTH, more than
 * GRAMMAR_MAX_STACKS of them, or more than GRAMMAR_MAX_EXPAND expansion steps for one
 * byte are an error of the match (never a crash, never unbounded work). A stack already
 * expanded in one byte's advance is not expanded again, so ambiguous empty alternatives
 * (paths to the same stacks that multiply) cost only the distinct stacks.
 *
 * Token masks: a grammar_ctx binds a grammar to a vocabulary (a trie of every token's
 * bytes) and caches, per matcher state (the set of stacks), the bitmask of tokens that
 * can follow, so a state seen again (inside a string, every step is the same state)
 * costs a lookup. Tokens that render no bytes are never allowed, except end-of-generation
 * tokens where the output may end.
 *
 * Completion within a budget: each state knows the fewest bytes that complete the
 * output from it (m). Given the tokens left (budget), the mask keeps only tokens after
 * which m <= budget - 1, so a vocabulary that has every single byte as a token always
 * ends with a complete output when m of the start state fits the budget, as long as no
 * state on the way exceeds the limits above (a byte whose advance would is refused like
 * one the grammar does not allow, which can cut off the shortest ending). (The cache
 * stores with each mask the largest m any of its tokens leads to; only when that does
 * not fit is the budget walk, uncached, done.)
 *
 * Threading: a grammar is immutable; a grammar_ctx and its matchers belong to one thread. */
#ifndef CAIRN_TOK_GRAMMAR_H
#define CAIRN_TOK_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;

#define GRAMMAR_MAX_TEXT ((size_t)1 << 20) /* bytes of GBNF text */
#define GRAMMAR_MAX_ELEMS ((size_t)1 << 20) /* compiled elements */
#define GRAMMAR_MAX_NEST 64                 /* parentheses nested in one rule */
#define GRAMMAR_MAX_REPEAT 1000             /* m and n of {m,n} */
#define GRAMMAR_MAX_DEPTH 512               /* positions on one stack */
#define GRAMMAR_MAX_STACKS 512              /* stacks in one state */
#define GRAMMAR_MAX_EXPAND 20000            /* expansion steps of one byte's advance */

struct grammar;
struct grammar_ctx;
struct grammar_match;

/* Parses and compiles GBNF text (len bytes) with start rule `root`. CAIRN_EFORMAT with a
 * message (what, and the line) for a syntax error, an undefined rule, left recursion,
 * limits exceeded; CAIRN_ENOMEM. */
int grammar_parse(struct grammar **out, const char *text, size_t len, const char *root, char *err,
                  size_t errlen);
void grammar_release(struct grammar *g); /* accepts NULL */

/* Whether the whole of s[0, len) is a complete output of g (a test and validation aid). */
bool grammar_matches(const struct grammar *g, const char *s, size_t len);

struct grammar_vocab;

/* A vocabulary of n tokens as masks need it (a trie of the tokens' bytes), built once and
 * shared by the ctxs of any number of grammars: bytes[i] of lens[i] (NULL or 0: renders
 * nothing), eog[i] nonzero for end-of-generation tokens (NULL: none). Copies what it
 * needs. CAIRN_EINVAL, CAIRN_ERANGE, CAIRN_ENOMEM. */
int grammar_vocab_create(struct grammar_vocab **out, int32_t n, const char *const *bytes, const size_t *lens,
                         const uint8_t *eog);
/* As grammar_vocab_create with t's tokens (tok_token_text without special rendering). */
int grammar_vocab_from_tok(struct grammar_vocab **out, const struct tok *t);
void grammar_vocab_release(struct grammar_vocab *v); /* accepts NULL */

/* Binds g to v (both borrowed, must outlive the ctx). CAIRN_EINVAL, CAIRN_ENOMEM. */
int grammar_ctx_create_shared(struct grammar_ctx **out, const struct grammar *g, const struct grammar_vocab *v);

/* Binds g (borrowed, must outlive the ctx) to a vocabulary of its own, of n tokens: bytes[i] of
 * lens[i] (NULL or 0: renders nothing), eog[i] nonzero for end-of-generation tokens (NULL:
 * none). Copies what it needs. CAIRN_EINVAL, CAIRN_ENOMEM. */
int grammar_ctx_create(struct grammar_ctx **out, const struct grammar *g, int32_t n, const char *const *bytes,
                       const size_t *lens, const uint8_t *eog);
/* As grammar_ctx_create with t's tokens (grammar_vocab_from_tok). */
int grammar_ctx_from_tok(struct grammar_ctx **out, const struct grammar *g, const struct tok *t);
void grammar_ctx_release(struct grammar_ctx *c); /* accepts NULL */
int32_t grammar_ctx_n_vocab(const struct grammar_ctx *c);
/* Masks computed, and those served from the cache (tests, benchmarks). */
void grammar_ctx_stats(const struct grammar_ctx *c, int64_t *walks, int64_t *hits);

/* A matcher at the start of the output. CAIRN_ENOMEM, CAIRN_EFORMAT when the start
 * state is too large (limits above). */
int grammar_match_create(struct grammar_match **out, struct grammar_ctx *c);
void grammar_match_release(struct grammar_match *m); /* accepts NULL */
/* A copy of m in its current state (speculation, forks). */
int grammar_match_clone(struct grammar_match **out, const struct grammar_match *m);
/* Puts dst in src's state (both of one ctx; dst's memory is reused). CAIRN_ENOMEM. */
int grammar_match_copy(struct grammar_match *dst, const struct grammar_match *src);

/* The tokens that may come next: bit i of (*mask)[i / 32] set when token i is allowed.
 * budget: tokens that may still be generated, this one included (< 0: no limit). The mask
 * stays valid until the next call on m or its ctx. CAIRN_ENOMEM, CAIRN_EFORMAT when a
 * state exceeds the limits. An empty mask (no bit) means the vocabulary cannot continue. */
int grammar_match_mask(struct grammar_match *m, int64_t budget, const uint32_t **mask);

/* Moves m past token id. CAIRN_EINVAL (m unchanged) when the grammar does not allow it,
 * CAIRN_ERANGE for an id outside the vocabulary, CAIRN_EFORMAT past the limits. An
 * end-of-generation token is allowed where the output may end, and ends it. */
int grammar_match_accept(struct grammar_match *m, int32_t id);
/* Moves m past len bytes; as grammar_match_accept. */
int grammar_match_accept_bytes(struct grammar_match *m, const char *s, size_t len);

/* The output may end here. */
bool grammar_match_accepting(const struct grammar_match *m);
/* The output is complete: nothing may follow. */
bool grammar_match_done(const struct grammar_match *m);
/* Fewest bytes that complete the output from here (0 when it may end). */
int64_t grammar_match_min_left(const struct grammar_match *m);

#endif
