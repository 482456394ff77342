/* A TextGeneration task's parameters: what an API front-end (OpenAI, Ollama, Anthropic)
 * asks for, in one common form. The API node builds them, they travel in the
 * TaskCreated event's "params" and in the task message to the runner, and the runner
 * renders the chat template, tokenizes, generates and post-processes the text (stop
 * strings, reasoning, tool calls) by them.
 *
 * JSON (every member optional but model and one of messages/prompt):
 *   {"model": id, "messages": [message] | "prompt": text or [token id] (1 to
 *    TEXTGEN_MAX_PROMPT_IDS ids, each 0..INT32_MAX; the runner checks them against its
 *    vocabulary), "tools": [tool] | null,
 *    "template_kwargs": object | null, "add_generation_prompt": bool (true),
 *    "max_tokens": n (0: until the context is full), "stop": [text] (at most
 *    TEXTGEN_MAX_STOP, each 1..TEXTGEN_MAX_STOP_BYTES bytes), "n": 1..TEXTGEN_MAX_N,
 *    "logprobs": bool, "top_logprobs": 0..TEXTGEN_MAX_TOP_LOGPROBS,
 *    "sampling": {runner_sampling members}, "logit_bias": {"<token id>": bias},
 *    "ignore_eos": bool, "reasoning": bool (true: think-tag text goes apart),
 *    "num_draft_tokens": -1 (the instance's)..TEXTGEN_MAX_DRAFT, "prompt_lookup": bool
 *    (speculative drafts copied from the context instead of a draft model),
 *    "grammar": GBNF text (tok/grammar.h, start rule "root") the output must follow, at
 *    most TEXTGEN_MAX_GRAMMAR bytes; the API front-ends write it from response_format,
 *    format or grammar, "force_tool": "" (a call of one of the tools must be the
 *    output: tool_choice "required") or a tool's name (a call of that one), the runner
 *    writing the grammar in the template's tool-call format,
 *    "embed": [text or [token id]] (an embedding task instead of generation: 1 to
 *    TEXTGEN_MAX_EMBED_INPUTS inputs, texts of at most TEXTGEN_MAX_EMBED_TEXT bytes, id
 *    lists as prompt's, at most TEXTGEN_MAX_PROMPT_IDS ids in all; then neither messages
 *    nor prompt), "truncate": bool (an input longer than the context is cut to it instead
 *    of refused), "dimensions": 0 (all) or 1..TEXTGEN_MAX_EMBED_DIM (the vector's first
 *    values, normalised again, as Matryoshka-trained models such as Qwen3-Embedding allow),
 *    "prompts": [text or [token id]] (a batch of 2..TEXTGEN_MAX_N raw prompts, each
 *    generating n sequences, n_batch * n <= TEXTGEN_MAX_N; then neither messages nor
 *    prompt)}
 * Messages are in OpenAI's shape: {"role": "system"|"user"|"assistant"|"tool",
 * "content": text|null, "tool_calls": [{"id", "type": "function", "function":
 * {"name", "arguments": JSON text or object}}], "tool_call_id", "name"}; content parts
 * are flattened to text by the front-end. Tools: [{"type": "function", "function":
 * {"name", "description", "parameters"}}]. */
#ifndef CAIRN_PROTO_TEXTGEN_H
#define CAIRN_PROTO_TEXTGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/ids.h"
#include "proto/runner_proto.h"

#define TEXTGEN_MAX_STOP 16
#define TEXTGEN_MAX_STOP_BYTES 1024
#define TEXTGEN_MAX_N 16
#define TEXTGEN_MAX_TOP_LOGPROBS 20
#define TEXTGEN_MAX_BIAS 1024
#define TEXTGEN_MAX_MESSAGES 4096
#define TEXTGEN_MAX_DRAFT 16
#define TEXTGEN_MAX_GRAMMAR ((size_t)1 << 20)
#define TEXTGEN_MAX_PROMPT_IDS ((int64_t)1 << 20)
#define TEXTGEN_MAX_EMBED_INPUTS 2048
#define TEXTGEN_MAX_EMBED_TEXT ((size_t)1 << 24)
#define TEXTGEN_MAX_EMBED_DIM (1 << 17)

/* One input of an embedding task or one prompt of a batch: text, or token ids. */
struct textgen_input {
    char *text;     /* malloc'd, or NULL */
    int32_t *ids;   /* malloc'd n_ids ids, or NULL */
    int64_t n_ids;
};

struct textgen_bias {
    int32_t token;
    float bias; /* finite; -100 or less bans the token */
};

struct textgen_params {
    char model[IDS_MODEL_MAX + 1];
    json_t *messages;        /* owned array, or NULL with prompt */
    char *prompt;            /* malloc'd raw prompt (no template), or NULL with messages */
    int32_t *prompt_ids;     /* malloc'd: the raw prompt as token ids (n_prompt_ids), or NULL */
    int64_t n_prompt_ids;
    json_t *tools;           /* owned array or NULL */
    json_t *template_kwargs; /* owned object or NULL */
    bool add_generation_prompt;
    int64_t max_tokens;      /* 0: until end of generation or a full context */
    char *stop[TEXTGEN_MAX_STOP]; /* malloc'd */
    int n_stop;
    int n;                   /* sequences (choices) */
    bool logprobs;
    int top_logprobs;
    struct runner_sampling sampling;
    struct textgen_bias *bias; /* malloc'd, n_bias entries */
    int n_bias;
    bool ignore_eos;
    bool reasoning;
    int num_draft_tokens; /* -1: the instance's; 0: no speculation for this request */
    bool prompt_lookup;
    char *grammar;        /* malloc'd GBNF text, or NULL: unconstrained */
    char *force_tool;     /* malloc'd: "" any tool, or a tool's name; NULL: not forced */
    struct textgen_input *embed; /* malloc'd n_embed inputs: an embedding task; NULL: generation */
    int n_embed;
    bool truncate;
    int dimensions;       /* 0: all */
    /* A batch of raw prompts (OpenAI's prompt as a list; then neither messages nor
     * prompt): n_batch (2..TEXTGEN_MAX_N) prompts, each with n sequences, sequence j of
     * prompt i numbered i * n + j; n_batch * n <= TEXTGEN_MAX_N. */
    struct textgen_input *batch;
    int n_batch;
    /* The id the API gave the request (chatcmpl-..., cmpl-...), by which a cancel route
     * finds it; the node's own: not written to JSON, never sent to a runner. */
    char request_id[64];
};

/* Zeroes p and sets the defaults: add_generation_prompt, n 1, reasoning,
 * runner_sampling_defaults(), num_draft_tokens -1. */
void textgen_params_init(struct textgen_params *p);

/* Frees what p owns and zeroes it; accepts a zeroed one. */
void textgen_params_clear(struct textgen_params *p);

/* A prompt of token ids (a JSON array of 1..TEXTGEN_MAX_PROMPT_IDS integers in
 * 0..INT32_MAX) into *ids (malloc'd, owned by the caller) and *n. CAIRN_EFORMAT naming
 * "prompt" or the entry ("prompt[3]: ..."), CAIRN_ENOMEM. */
int textgen_prompt_ids(const json_t *a, int32_t **ids, int64_t *n, char *err, size_t errlen);

/* The inputs of an embedding task as OpenAI's `input` (and Ollama's) gives them: a text, a
 * list of texts, a list of token ids, or a list of lists of token ids, into p->embed and
 * p->n_embed (replacing none: p->embed must be NULL). CAIRN_EFORMAT naming `name` or the
 * entry ("input[3]: ..."), CAIRN_ENOMEM. */
int textgen_embed_inputs(const json_t *input, const char *name, struct textgen_params *p, char *err, size_t errlen);

/* As textgen_embed_inputs with at most max inputs (empty texts allowed with allow_empty)
 * into *out (malloc'd *n entries; freed with textgen_inputs_free, also after a failure). */
int textgen_inputs(const json_t *input, const char *name, int max, bool allow_empty, struct textgen_input **out,
                   int *n, char *err, size_t errlen);
void textgen_inputs_free(struct textgen_input *in, int n); /* accepts NULL */

/* Sequences of the request: n, times n_batch for a batch of prompts. */
int textgen_seqs(const struct textgen_params *p);

/* New JSON object of p; NULL when out of memory. */
json_t *textgen_params_to_json(const struct textgen_params *p);

/* Checks every member of j and fills *out (textgen_params_init first; cleared again on
 * failure). CAIRN_EFORMAT naming the member ("stop[2]: ..."), CAIRN_ENOMEM. */
int textgen_params_from_json(const json_t *j, struct textgen_params *out, char *err,
                             size_t errlen);

#endif
