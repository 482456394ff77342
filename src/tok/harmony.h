/* The harmony format of gpt-oss, as its chat template teaches it. The assistant's output
 * is one or more messages, each a header and a body:
 *   [<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE | TYPE]<|message|>BODY<|end|>
 * where the generation prompt already said "<|start|>assistant" for the first one, and
 * the output ends with <|return|> (an answer) or <|call|> (a tool call): both end the
 * generation, so the text may also just stop there. Bodies go by channel and recipient:
 *   analysis                          -> reasoning (reasoning_content)
 *   final, commentary, any other      -> content
 *   a recipient (to=functions.NAME)   -> a tool call of NAME ("functions." dropped) whose
 *                                        arguments are the body
 * The markers are control tokens of o200k_harmony: the text must be detokenized with
 * special tokens rendered. Output that does not start like a header (a model that just
 * writes) is content as it is, and so is a header that runs past HARMONY_MAX_HEAD bytes.
 *
 * The streaming splitter is fed text piece by piece and sends body bytes on as they come,
 * holding back only a possible marker prefix; headers are held until <|message|>. Calls
 * come out at the end in OpenAI's shape (toolcall.h), the arguments text as the model
 * wrote it. Pure computation, no I/O. */
#ifndef CAIRN_TOK_HARMONY_H
#define CAIRN_TOK_HARMONY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/stopstr.h" /* struct strbuf */

#define HARMONY_MAX_HEAD 512 /* bytes of one message's header */

struct harmony;

/* True when a chat template's source teaches harmony (<|channel|> and <|message|>). */
bool harmony_detect(const char *template_src, size_t len);

/* Creates a splitter; id_seed makes call ids differ between streams. CAIRN_ENOMEM. */
int harmony_create(struct harmony **out, uint64_t id_seed, char *err, size_t errlen);

/* Frees a splitter; accepts NULL. */
void harmony_release(struct harmony *h);

/* Feeds len bytes; appends what is decided to reasoning and content. 0 or CAIRN_ENOMEM. */
int harmony_feed(struct harmony *h, const char *text, size_t len, struct strbuf *reasoning, struct strbuf *content);

/* Ends the stream: what was held goes where it belongs (an unfinished header to content),
 * a tool call in progress is complete, and *calls gets a new array of the calls (empty
 * when none). The splitter then starts over. 0 or CAIRN_ENOMEM (*calls NULL). */
int harmony_finish(struct harmony *h, struct strbuf *reasoning, struct strbuf *content, json_t **calls);

#endif
