/* Tool calls in generated text, in the formats chat templates teach their models:
 *   TOOLCALL_HERMES   Hermes / Qwen:  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *                     (any number, anywhere in the text)
 *   TOOLCALL_LLAMA3   Llama 3.1 / 3.2: the whole output is {"name": ..., "parameters": {...}}
 *                     ("arguments" also taken), optionally after <|python_tag|>; several
 *                     objects may follow each other, separated by ';' or whitespace
 *   TOOLCALL_MISTRAL  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral Nemo)
 *                     or [TOOL_CALLS]name[ARGS]{...} (newer templates; an optional
 *                     [CALL_ID]id before [ARGS] is skipped), either repeated
 * The markers <|python_tag|> and [TOOL_CALLS] are control tokens in their vocabularies:
 * the text must be detokenized with special tokens rendered for them to be seen.
 *
 * Calls come out in OpenAI's shape:
 *   [{"id": ..., "type": "function", "function": {"name": ..., "arguments": "<JSON text>"}}]
 * where arguments given as an object are serialized compactly and arguments given as a
 * string are kept as they are. Ids are unique within one stream and derived from the
 * caller's seed: "call_" and 16 letters or digits, or for Mistral 9 letters or digits
 * (its templates refuse any other id when the calls come back in the history).
 *
 * The streaming splitter passes content on as it comes and holds back from the first
 * point where a call may start: a possible marker prefix, a whole marker and what
 * follows it, or for Llama 3 an output whose first non-space byte is '{' or '<'. At the
 * end, toolcall_finish parses what was held: valid calls go to the array, anything
 * that is not a valid call (malformed JSON, a missing name, a marker that was just
 * text) comes out as content byte for byte, so no text is ever lost. Held text is
 * bounded (max_held); past it the held text is given up as content and the rest of the
 * stream passes through. Pure computation, no I/O. */
#ifndef CAIRN_TOK_TOOLCALL_H
#define CAIRN_TOK_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/stopstr.h" /* struct strbuf */

enum toolcall_format {
    TOOLCALL_NONE = 0,
    TOOLCALL_HERMES,
    TOOLCALL_LLAMA3,
    TOOLCALL_MISTRAL,
};

#define TOOLCALL_DEFAULT_MAX_HELD ((size_t)4 << 20)

/* The format a chat template's source teaches, or TOOLCALL_NONE (no tool support, or a
 * format not handled here, e.g. XML arguments <function=...> or <arg_key>). Rules:
 * "[TOOL_CALLS]" -> Mistral; "<tool_call>" with a JSON "name" key and no XML argument
 * markup -> Hermes; "<|start_header_id|>" with a JSON "parameters" key -> Llama 3. */
enum toolcall_format toolcall_detect(const char *template_src, size_t len);

/* "none", "hermes", "llama3", "mistral" (never NULL). */
const char *toolcall_format_name(enum toolcall_format f);

struct toolcall;

/* Creates a splitter for format f (TOOLCALL_NONE: all text is content). id_seed makes
 * the call ids differ between streams (e.g. a random number per request). max_held:
 * bytes held back at most (0: TOOLCALL_DEFAULT_MAX_HELD). CAIRN_EINVAL for an unknown
 * format, CAIRN_ENOMEM. *out NULL on failure, else owned by the caller. */
int toolcall_create(struct toolcall **out, enum toolcall_format f, uint64_t id_seed, size_t max_held,
                    char *err, size_t errlen);

/* Frees a splitter; accepts NULL. */
void toolcall_release(struct toolcall *t);

/* Feeds len bytes; appends the content that is safe to emit now. 0, or CAIRN_ENOMEM
 * with content and the splitter unchanged. */
int toolcall_feed(struct toolcall *t, const char *text, size_t len, struct strbuf *content);

/* Ends the stream: parses what was held back, appends the text that is not part of a
 * valid call to content, and sets *calls to a new array (empty when there were none)
 * owned by the caller. Ids continue across streams of the same splitter, which then
 * starts over. CAIRN_ENOMEM (with *calls NULL; content may have grown; the splitter
 * may only be released). */
int toolcall_finish(struct toolcall *t, struct strbuf *content, json_t **calls);

#define TOOLCALL_ID_MAX 32 /* bytes of a call id, with the NUL */

/* A call id not yet used in calls (an array of calls, may be NULL): "call_" and 16
 * letters or digits, or with mistral 9 and no prefix, from seed and *counter (advanced). */
void toolcall_new_id(uint64_t seed, uint64_t *counter, bool mistral, const json_t *calls,
                     char out[TOOLCALL_ID_MAX]);

/* Whole text at once: toolcall_create, one feed, toolcall_finish. */
int toolcall_parse(enum toolcall_format f, uint64_t id_seed, const char *text, size_t len,
                   struct strbuf *content, json_t **calls, char *err, size_t errlen);

#endif
