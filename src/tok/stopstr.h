/* Stop strings (OpenAI `stop`, Anthropic `stop_sequences`) over streamed text.
 *
 * The filter is fed the generated text piece by piece (pieces may split a stop string
 * anywhere). It passes on what can no longer be part of a stop string and holds back
 * the longest tail that could still begin one: at most (longest stop - 1) bytes, as
 * the prefix of a stop string (no copy of the text is kept). A stop matches at the
 * first byte where any stop string is complete; when several end there, the longest
 * (earliest starting) one is reported. Only the text before the match is output; the
 * stop string and everything after it are discarded. Each byte costs amortized O(1)
 * per stop string (Knuth-Morris-Pratt), so long outputs are never rescanned.
 *
 * Stop strings must be valid UTF-8; a match in valid UTF-8 text then always starts at
 * a character boundary, so output pieces never split a character that the input
 * pieces did not split. Pure computation: no I/O, memory bounded by the stop strings. */
#ifndef CAIRN_TOK_STOPSTR_H
#define CAIRN_TOK_STOPSTR_H

#include <stddef.h>

#include "base/strbuf.h"

#define STOPSTR_MAX 16          /* stop strings per filter */
#define STOPSTR_MAX_LEN 1024    /* bytes per stop string */

struct stopstr;

/* Creates a filter for n NUL-terminated stop strings (n may be 0: then text passes
 * through unchanged); the strings are copied. CAIRN_EINVAL with a message naming the
 * string for more than STOPSTR_MAX strings, an empty string, one longer than
 * STOPSTR_MAX_LEN bytes or one that is not valid UTF-8; CAIRN_ENOMEM. *out is NULL on
 * failure, else owned by the caller (stopstr_release). */
int stopstr_create(struct stopstr **out, const char *const *stops, size_t n, char *err, size_t errlen);

/* Frees a filter; accepts NULL. */
void stopstr_release(struct stopstr *s);

/* Feeds len bytes of text and appends to out the text that is now safe to emit.
 * Returns 1 when a stop string has matched (in this call or before: after a match
 * every feed appends nothing and returns 1), 0 when none has, CAIRN_ENOMEM when out
 * could not grow (then out and the filter are unchanged and the call may be repeated). */
int stopstr_feed(struct stopstr *s, const char *text, size_t len, struct strbuf *out);

/* Ends the stream: appends the held-back text (nothing after a match) and holds
 * nothing more. Returns 1 when a stop string had matched, 0 when not, CAIRN_ENOMEM
 * (filter unchanged). A feed after a flush matches afresh (a stop string cannot span
 * the flush); after a match it still appends nothing. */
int stopstr_flush(struct stopstr *s, struct strbuf *out);

/* Starts over as if just created (no match, nothing held). */
void stopstr_reset(struct stopstr *s);

/* Index (into the creation list) of the stop string that matched, or -1. */
int stopstr_matched(const struct stopstr *s);

/* Bytes currently held back (at most the longest stop string's length - 1). */
size_t stopstr_held(const struct stopstr *s);

#endif
