/* Whether a draft model may serve a target in speculative decoding: the two must share
 * a vocabulary (issue 6): the same tokenizer model, the same piece for every id both
 * have, the same special tokens (BOS, EOS, EOT, padding), and token counts that differ by
 * at most VOCAB_MAX_EXTRA (real pairs such as Qwen2.5-0.5B and 7B differ by padding rows
 * at the end). Read from the GGUF metadata alone. */
#ifndef CAIRN_GGUF_VOCAB_H
#define CAIRN_GGUF_VOCAB_H

#include <stddef.h>

#define VOCAB_MAX_EXTRA 128

struct gguf_file;

/* 0 when draft may serve target; CAIRN_EINVAL with the first difference in err (naming
 * the id or key) when not; CAIRN_EFORMAT when a file has no vocabulary. */
int vocab_compatible(const struct gguf_file *target, const struct gguf_file *draft, char *err, size_t errlen);

/* As vocab_compatible over two files by path (opened and closed here); CAIRN_EIO and
 * the like when one cannot be opened. */
int vocab_compatible_files(const char *target_path, const char *draft_path, char *err, size_t errlen);

#endif
