/* Chat prompts: a model's own chat template (tokenizer.chat_template in its GGUF)
 * rendered over OpenAI-style messages, then tokenized. A model without a template, or
 * with one the interpreter cannot parse, falls back to a plain format (with a warning
 * logged once) rather than failing requests. */
#ifndef CAIRN_TMPL_CHAT_H
#define CAIRN_TMPL_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tok;
struct chat;

/* Prepares chat formatting for a model (file and tokenizer are borrowed). Never fails
 * for a bad template (that selects the fallback); only CAIRN_ENOMEM. */
int chat_create(struct chat **out, const struct gguf_file *f, const struct tok *t, char *err, size_t errlen);
void chat_release(struct chat *c); /* accepts NULL */

/* True when the model's own template is in use (false: the plain fallback). */
bool chat_has_template(const struct chat *c);

/* Renders the prompt. vars: an object with messages (required), tools, and any other
 * template variables (enable_thinking, ...); add_generation_prompt, bos_token and
 * eos_token are filled in unless given. *out is malloc'd (caller frees). A template that
 * raises (e.g. roles must alternate) gives CAIRN_EINVAL with its message. */
int chat_render(const struct chat *c, const json_t *vars, bool add_generation_prompt, char **out,
                size_t *out_len, char *err, size_t errlen);

/* Tokenizes a rendered prompt: control tokens are parsed, and BOS is added when the model
 * wants it and the text does not already begin with it. *ids is malloc'd. */
int chat_tokenize(const struct chat *c, const char *text, size_t len, int32_t **ids, int64_t *n,
                  char *err, size_t errlen);

#endif
