/* Model references as people type them, and choosing a repo's files for one (issue 17):
 *
 *     hf.co/OWNER/REPO:TAG      huggingface.co/..., https://huggingface.co/..., hf://...
 *     OWNER/REPO:TAG            the same repo; TAG a quantization (Q4_K_M, q8_0, IQ4_XS)
 *     OWNER/REPO                the default quantization (HUBREF_DEFAULT_TAG), else the
 *                               repo's only GGUF model
 *     OWNER/REPO/PATH.gguf      one file (or the first part of a split model)
 *
 * A reference's canonical text, the model's id in the cluster, is "hf.co/OWNER/REPO:TAG"
 * with the tag in upper case, or "hf.co/OWNER/REPO/PATH". Tags match file names case-
 * insensitively as a whole word of the name: "Q4_K" does not match "...-Q4_K_M.gguf".
 * A model split by gguf-split ("NAME-00001-of-00003.gguf") is chosen as all its parts,
 * which must all be in the listing. Projector files (mmproj) are never chosen.
 * Everything here is pure: the listing comes from hub.c. */
#ifndef CAIRN_NODE_HUBREF_H
#define CAIRN_NODE_HUBREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HUBREF_NAME_MAX 96   /* owner and repo names */
#define HUBREF_TAG_MAX 64
#define HUBREF_PATH_MAX 256
#define HUBREF_TEXT_MAX 512  /* canonical text, with its NUL (a model id holds at most 255 bytes of it) */
#define HUBREF_DEFAULT_TAG "Q4_K_M"
#define HUBREF_MAX_PARTS 64  /* files of one split model */

struct hub_ref {
    char owner[HUBREF_NAME_MAX + 1], repo[HUBREF_NAME_MAX + 1];
    char tag[HUBREF_TAG_MAX + 1];   /* upper case; "" when the reference names none (or a path) */
    char path[HUBREF_PATH_MAX + 1]; /* "" unless the reference names one file */
};

/* Parses text into *r. CAIRN_EINVAL with what is wrong (the part named). */
int hubref_parse(const char *text, struct hub_ref *r, char *err, size_t errlen);

/* True when text has the shape of a hub reference (so a model name can be told from one
 * without a lookup): the hf.co prefixes, or OWNER/REPO with a tag or a .gguf path. */
bool hubref_looks_like(const char *text);

/* The canonical text of r (HUBREF_TEXT_MAX bytes); tag is the chosen tag when r names
 * none (NULL: r's own). */
void hubref_text(const struct hub_ref *r, const char *tag, char *out);

/* The model id a reference typed as text names (HUBREF_TEXT_MAX bytes): its canonical
 * text, with HUBREF_DEFAULT_TAG when it names no tag. False (out "") when text does not
 * look like a reference (hubref_looks_like): a local model's name stays as it is. */
bool hubref_canonical(const char *text, char *out);

/* One file of a repo's listing. */
struct hub_file {
    const char *path;   /* in the repo */
    uint64_t size;
    const char *sha256; /* 64 lowercase hex digits of the LFS object; NULL when not LFS */
};

/* Chooses the files of r among n listed: r's path (and its other parts when it is the
 * first part of a split model), else the GGUF whose name holds r's tag as a word (its
 * parts in order when split), else, with no tag, HUBREF_DEFAULT_TAG's or the repo's only
 * model. Writes the indexes into pick (in part order) and their count into *n_pick, and
 * the tag that named them into tag (HUBREF_TAG_MAX + 1 bytes; upper case; "" for a path).
 * CAIRN_ENOTFOUND with the tags the repo has in err, CAIRN_EFORMAT for an incomplete
 * split model or a file that is not a GGUF. */
int hubref_choose(const struct hub_ref *r, const struct hub_file *files, size_t n, size_t pick[HUBREF_MAX_PARTS],
                  size_t *n_pick, char *tag, char *err, size_t errlen);

/* The quantization tag of a GGUF file name (its last '-' or '.' separated word before
 * ".gguf" and any split suffix that looks like one: Q4_K_M, IQ4_XS, F16, BF16...), upper
 * case, into tag (HUBREF_TAG_MAX + 1 bytes); false when it has none. */
bool hubref_file_tag(const char *path, char *tag);

/* The local file name of part `part` of `parts` of the model whose canonical text is id
 * (HUBREF_TEXT_MAX bytes): id with '/' as '~', its ".gguf" and split suffix dropped, then
 * "-0000k-of-0000n" when parts > 1, then ".gguf". A pulled model's files, and a peer's
 * copy of them, have these names; the sidecar "<stem>.pull.json" names the model. */
void hubref_local_name(const char *id, int part, int parts, char *out);
/* The sidecar's file name for id (HUBREF_TEXT_MAX + 16 bytes). */
void hubref_sidecar_name(const char *id, char *out);

/* A split part's number and count ("-00002-of-00003.gguf": 2 and 3); false when path is
 * not a part. */
bool hubref_split_part(const char *path, int *part, int *count);

#endif
