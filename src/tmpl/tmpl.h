/* Chat templates: an interpreter for the Jinja that real chat templates use (the
 * `tokenizer.chat_template` string of a GGUF). It renders byte for byte what Hugging
 * Face's tooling renders, i.e. jinja2's ImmutableSandboxedEnvironment with trim_blocks,
 * lstrip_blocks, loop controls, the {% generation %} block, `tojson` without key sorting
 * or ASCII escaping, `raise_exception(msg)` and `strftime_now(fmt)` at a fixed date
 * (2026-01-02), as ../shared/tools/render_ref.py pins it.
 *
 * Values follow Python: ints, floats, strings (code points), lists, tuples, dicts in
 * insertion order, None, jinja2's default Undefined (prints empty, is falsy, fails on
 * any other use); `{{ x }}` prints str(x) the way Python does ([1, 'a'], {'a': None}).
 * Templates and inputs are untrusted: output size, memory, evaluation steps and
 * recursion depth are bounded, and so is a render's wall-clock time, so no template or
 * input can crash or hang a render. */
#ifndef CAIRN_TMPL_TMPL_H
#define CAIRN_TMPL_TMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct tmpl;

/* Bounds of one render; zero fields take the defaults below. */
struct tmpl_limits {
    size_t max_output;   /* bytes of rendered text, also of any one string value */
    size_t max_memory;   /* bytes of working memory of one render */
    uint64_t max_steps;  /* expression and statement evaluations; a builtin, filter, test or
                            operator on strings, lists or dicts counts one more for every 64
                            bytes or entries it is given (TMPL_UNITS_PER_STEP) */
    int max_depth;       /* nested macro calls (jinja2 itself stops near 190) */
    uint64_t max_ms;     /* wall-clock time of one render: steps are not all equal (a
                            builtin may touch megabytes), so time is bounded too */
};

#define TMPL_DEFAULT_MAX_OUTPUT ((size_t)16 << 20)
#define TMPL_DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define TMPL_DEFAULT_MAX_STEPS 20000000ull
#define TMPL_DEFAULT_MAX_DEPTH 200
#define TMPL_DEFAULT_MAX_MS 5000ull
#define TMPL_CLOCK_EVERY 1024 /* steps between two looks at the clock */

/* Parses a template (UTF-8, len bytes, no NUL needed). On success *out owns the parsed
 * form (free with tmpl_free); it is immutable and may be rendered from many threads.
 * Errors: CAIRN_EFORMAT for a syntax error or an unknown filter/test where jinja2 also
 * refuses the template; CAIRN_EUNSUPPORTED for a construct jinja2 has but this
 * interpreter does not (extends, include, import, block, recursive loops, some
 * filters); the message names the construct and its line. *out is NULL on failure. */
int tmpl_parse(struct tmpl **out, const char *src, size_t len, char *err, size_t errlen);

/* Frees a parsed template; accepts NULL. */
void tmpl_free(struct tmpl *t);

/* Renders with the template variables of `vars` (a JSON object: messages, tools,
 * add_generation_prompt, bos_token, eos_token, enable_thinking, ...; not modified).
 * On success *out is a malloc'd NUL-terminated string of *out_len bytes the caller
 * frees. Errors: CAIRN_EINVAL when the template called raise_exception (err holds the
 * template's message: a client error); CAIRN_EFORMAT for a runtime error (undefined
 * attribute, type error, sandbox violation, ...: usually input the template does not
 * accept); CAIRN_EUNSUPPORTED for an unsupported construct reached at run time;
 * CAIRN_EFULL when a limit was hit; CAIRN_ENOMEM. *out is NULL on failure. */
int tmpl_render(const struct tmpl *t, const json_t *vars, char **out, size_t *out_len,
                char *err, size_t errlen);

/* Same with explicit limits (NULL: defaults). */
int tmpl_render_limits(const struct tmpl *t, const json_t *vars, const struct tmpl_limits *lim,
                       char **out, size_t *out_len, char *err, size_t errlen);

#endif
