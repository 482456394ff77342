/* Reasoning text of thinking models (Qwen3, QwQ, DeepSeek-R1, ...), which think between
 * an open and a close tag (`<think>` ... `</think>` by default) before they answer.
 *
 * The streaming splitter is fed generated text piece by piece and sends each byte to
 * the reasoning or the content output; the tags themselves are never output, and a tag
 * split across pieces is recognized (the splitter holds back a possible tag prefix,
 * and only that). Rules:
 *   - The open tag counts only at the start of the output, after optional whitespace
 *     (held back, at most REASONING_MAX_LEAD bytes); anywhere else it is content.
 *     With start_in_reasoning (the prompt already opened the tag) the output starts
 *     inside the reasoning.
 *   - Inside the reasoning, the first close tag ends it; whitespace right after the
 *     close tag is dropped, and everything after that is content (tags included).
 *   - Without a close tag everything after the open tag is reasoning.
 * Pure computation, no I/O; memory is the splitter itself. */
#ifndef CAIRN_TOK_REASONING_H
#define CAIRN_TOK_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "tok/stopstr.h" /* struct strbuf */

#define REASONING_MAX_TAG 64   /* bytes of a tag */
#define REASONING_MAX_LEAD 64  /* whitespace held back while waiting for the open tag */

struct reasoning_opts {
    const char *open;         /* NULL: "<think>" */
    const char *close;        /* NULL: "</think>" */
    bool start_in_reasoning;  /* the prompt ended inside an open tag */
};

struct reasoning;

/* Creates a splitter (opts NULL: defaults; tags are copied). CAIRN_EINVAL with a message
 * for a tag that is empty, longer than REASONING_MAX_TAG or starts with whitespace;
 * CAIRN_ENOMEM. *out is NULL on failure, else owned by the caller. */
int reasoning_create(struct reasoning **out, const struct reasoning_opts *opts, char *err, size_t errlen);

/* Frees a splitter; accepts NULL. */
void reasoning_release(struct reasoning *r);

/* Feeds len bytes and appends what is decided to the reasoning and content buffers
 * (either may get nothing). 0, or CAIRN_ENOMEM with both buffers and the splitter
 * unchanged (the call may be repeated). */
int reasoning_feed(struct reasoning *r, const char *text, size_t len, struct strbuf *reasoning,
                   struct strbuf *content);

/* Ends the stream: appends what was held back (a partial close tag to the reasoning,
 * leading whitespace or a partial open tag to the content) and starts over as if just
 * created. 0 or CAIRN_ENOMEM (splitter unchanged). */
int reasoning_flush(struct reasoning *r, struct strbuf *reasoning, struct strbuf *content);

/* True while the splitter is inside the reasoning (fed text goes there). */
bool reasoning_active(const struct reasoning *r);

/* What a chat template's source says about reasoning tags. */
struct reasoning_info {
    bool uses_tags;        /* the template mentions the tag pair below */
    bool opens_in_prompt;  /* its generation prompt may end inside an open tag */
    const char *open;      /* static strings: the pair found, or the default pair */
    const char *close;
};

/* Looks for known tag pairs (<think>, <seed:think>, <mm:think>, [THINK]) in a template
 * source. opens_in_prompt is a heuristic: after the template's last use of
 * add_generation_prompt, an open tag not directly followed by its close tag. The
 * rendered prompt (reasoning_prompt_open) tells for sure. Never fails. */
void reasoning_detect(const char *template_src, size_t len, struct reasoning_info *out);

/* True when a rendered prompt ends inside an open reasoning block: its last open tag
 * comes after its last close tag and only whitespace follows it. Use the result as
 * start_in_reasoning. open/close NULL: the defaults. */
bool reasoning_prompt_open(const char *prompt, size_t len, const char *open, const char *close);

#endif
