/* JSON Schema to a GBNF grammar (tok/grammar.h), for the schemas that structured-output
 * clients send (OpenAI response_format json_schema, Ollama format, the Vercel AI SDK's
 * and LangChain's zod/pydantic output).
 *
 * Covered: type (one or a list; "null" in the list makes it nullable; OpenAPI's
 * nullable: true too), properties / required / additionalProperties (false, true or a
 * schema; required properties come first, then the optional ones, each at most once, in
 * the order given; with no properties, a schema for additionalProperties makes a map of
 * string keys), enum and const (any JSON values), items / minItems / maxItems, nested
 * objects and arrays, anyOf, oneOf (generated as anyOf: the unions clients send are
 * tagged, so their branches do not overlap; OpenAPI's discriminator is an annotation),
 * allOf of one schema, $ref to #/$defs/NAME or #/definitions/NAME (recursive ones
 * included), minLength (at most 1000) / maxLength (over 1000 met by at most 1000
 * characters; a bounded string takes no character above U+FFFF, which JavaScript counts
 * as two), string formats date, time, date-time, uuid, integer vs number, integer
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum (any bounds within +-10^15,
 * as digit ranges), minimum / exclusiveMinimum 0 on numbers (no minus sign), and the
 * annotations (title, description, default, examples, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly). {} and true accept any JSON value. Anything else is
 * refused with CAIRN_EUNSUPPORTED and a message naming the keyword and where it is
 * ("unsupported JSON Schema keyword 'pattern' at properties.name"): not, if/then/else,
 * pattern, patternProperties, multipleOf, other bounds on numbers, uniqueItems,
 * prefixItems, minProperties, other formats, remote $refs.
 *
 * The output is compact JSON with at most one space after ':' and ','; strings have at
 * most maxLength characters (without one, any number: the budget of max_tokens ends
 * them), numbers a bounded number of digits. */
#ifndef CAIRN_TOK_JSCHEMA_H
#define CAIRN_TOK_JSCHEMA_H

#include <stddef.h>

#include <jansson.h>

#define JSCHEMA_MAX_DEPTH 32     /* schemas nested in one another */
#define JSCHEMA_MAX_NODES 4096   /* schemas visited in all */

/* GBNF text (start rule "root", malloc'd into *out, NUL-terminated) for schema (an object
 * or true). CAIRN_EUNSUPPORTED naming the keyword, CAIRN_EFORMAT for a malformed schema
 * (a keyword of the wrong type, a $ref that resolves to nothing), CAIRN_ENOMEM. */
int jschema_to_gbnf(const json_t *schema, char **out, char *err, size_t errlen);

/* As jschema_to_gbnf, but the rules only: the schema's top rule is named `name` (at most
 * 60 of [A-Za-z0-9-]), the others start with `name-`, and the shared rules
 * (jschema_common_gbnf: sp, jstring, jvalue, ...) are left out, so that several
 * schemas go into one grammar. */
int jschema_rules(const json_t *schema, const char *name, char **out, char *err, size_t errlen);

/* The shared rules every schema's rules use, once per grammar. */
const char *jschema_common_gbnf(void);

/* GBNF for any JSON object (OpenAI's json_object, Ollama's format "json"). */
const char *jschema_any_object_gbnf(void);

#endif
