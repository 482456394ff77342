/* Draft/target vocabulary compatibility (vocab.h). */
#include "gguf/vocab.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "gguf/gguf.h"

static const char *const special_keys[] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.padding_token_id",
};

static bool same_str(struct gguf_str a, struct gguf_str b) { return a.len == b.len && !memcmp(a.ptr, b.ptr, a.len); }

int vocab_compatible(const struct gguf_file *target, const struct gguf_file *draft, char *err, size_t errlen)
{
    struct gguf_str ma = {0}, mb = {0};
    if (gguf_get_str(target, "tokenizer.ggml.model", &ma) || gguf_get_str(draft, "tokenizer.ggml.model", &mb))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a model without tokenizer.ggml.model has no vocabulary");
    if (!same_str(ma, mb))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "tokenizers differ: %.*s and %.*s", (int)ma.len, ma.ptr,
                          (int)mb.len, mb.ptr);
    struct gguf_array ta, da;
    if (gguf_get_arr(target, "tokenizer.ggml.tokens", &ta) || gguf_get_arr(draft, "tokenizer.ggml.tokens", &da) ||
        ta.type != GGUF_STRING || da.type != GGUF_STRING)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "a model without tokenizer.ggml.tokens has no vocabulary");
    uint64_t diff = ta.n > da.n ? ta.n - da.n : da.n - ta.n;
    if (diff > VOCAB_MAX_EXTRA)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "vocabularies of %llu and %llu tokens differ by more than %d",
                          (unsigned long long)ta.n, (unsigned long long)da.n, VOCAB_MAX_EXTRA);
    uint64_t n = ta.n < da.n ? ta.n : da.n;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str a = gguf_arr_str(target, &ta, i), b = gguf_arr_str(draft, &da, i);
        if (!same_str(a, b))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "token %llu differs: '%.*s' and '%.*s'",
                              (unsigned long long)i, (int)(a.len < 40 ? a.len : 40), a.ptr,
                              (int)(b.len < 40 ? b.len : 40), b.ptr);
    }
    for (size_t k = 0; k < sizeof special_keys / sizeof special_keys[0]; k++) {
        uint32_t a = UINT32_MAX, b = UINT32_MAX;
        int ra = gguf_get_u32(target, special_keys[k], &a), rb = gguf_get_u32(draft, special_keys[k], &b);
        if ((ra == 0) != (rb == 0) || a != b)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "%s differs", special_keys[k]);
    }
    return 0;
}

int vocab_compatible_files(const char *target_path, const char *draft_path, char *err, size_t errlen)
{
    struct gguf_file *t = NULL, *d = NULL;
    int rc = gguf_open(&t, target_path, err, errlen);
    if (!rc)
        rc = gguf_open(&d, draft_path, err, errlen);
    if (!rc)
        rc = vocab_compatible(t, d, err, errlen);
    gguf_close(d);
    gguf_close(t);
    return rc;
}
