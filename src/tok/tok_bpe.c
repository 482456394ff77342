/* Byte-level BPE ("gpt2" tokenizer model): the pre-tokenizer split chosen by
 * tokenizer.ggml.pre (PCRE2, UTF + Unicode properties, JIT), the GPT-2 byte-to-unicode
 * mapping, and merges by rank with a priority queue over token ids.
 *
 * The regexes are the ones llama.cpp's llama-vocab.cpp lists for each pre-tokenizer.
 * Several regexes run in sequence: each splits every piece left by the previous one
 * into its matches and the gaps between them (both kept), as llama.cpp's
 * unicode_regex_split does. Non-ASCII characters of the deepseek classes are written as
 * \x{...} escapes, which is the same pattern for PCRE2. */
#include "tok/tok_impl.h"

#include "base/err.h"
#include "gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

/* ---- pre-tokenizers ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    RE_GPT2,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
    NULL,
};
static const char *const re_llama3[] = {
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_qwen2[] = {
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_qwen35[] = {
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
/* o200k (gpt-oss, GPT-4o): the tokenizer's own regex (tiktoken's o200k pattern), with its
 * case classes and combining marks. llama.cpp, whose regex engine lacks \p{Lu} and \p{Ll},
 * writes the case classes as lookaheads without \p{M}, so it splits a combining mark
 * before an apostrophe differently; this split is tiktoken's, the one the model was
 * trained on. */
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACT
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACT
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_gpt2[] = {
    RE_GPT2,
    NULL,
};
static const char *const re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}+",
    NULL,
};
static const char *const re_deepseek_coder[] = {
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}",
    NULL,
};
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    RE_GPT2,
    "[0-9][0-9][0-9]",
    NULL,
};
static const char *const re_starcoder[] = {
    "\\p{N}",
    RE_GPT2,
    NULL,
};

struct pre_def {
    const char *name;
    const char *const *re;
    int ignore_merges;
    int add_bos;        /* default of add_bos before metadata: 1, or 0 */
    int no_bos;         /* the model has no BOS by default */
};

/* tokenizer.ggml.pre values and what llama.cpp does with each */
static const struct pre_def pre_defs[] = {
    {"default", re_default, 0, 0, 0},
    {"llama3", re_llama3, 1, 1, 0},
    {"llama-v3", re_llama3, 1, 1, 0},
    {"llama-bpe", re_llama3, 1, 1, 0},
    {"falcon3", re_llama3, 1, 1, 0},
    {"falcon-h1", re_llama3, 1, 1, 0},
    {"pixtral", re_llama3, 1, 1, 0},
    {"midm-2.0", re_llama3, 1, 1, 0},
    {"lfm2", re_llama3, 1, 1, 0},
    {"dbrx", re_llama3, 0, 0, 0},
    {"smaug-bpe", re_llama3, 0, 0, 0},
    {"glm4", re_llama3, 0, 0, 1},
    {"chatglm-bpe", re_llama3, 0, 0, 1},
    {"deepseek-llm", re_deepseek_llm, 0, 0, 0},
    {"deepseek-coder", re_deepseek_coder, 0, 0, 0},
    {"deepseek-v3", re_deepseek3, 0, 0, 0},
    {"falcon", re_falcon, 0, 0, 0},
    {"mpt", re_gpt2, 0, 0, 0},
    {"gpt-2", re_gpt2, 0, 0, 0},
    {"phi-2", re_gpt2, 0, 0, 0},
    {"olmo", re_gpt2, 0, 0, 0},
    {"jais", re_gpt2, 0, 0, 0},
    {"trillion", re_gpt2, 0, 0, 0},
    {"granite-docling", re_gpt2, 0, 0, 0},
    {"exaone4", re_gpt2, 0, 0, 0},
    {"jina-es", re_gpt2, 0, 0, 0},
    {"jina-de", re_gpt2, 0, 0, 0},
    {"jina-v2-es", re_gpt2, 0, 0, 0},
    {"jina-v2-de", re_gpt2, 0, 0, 0},
    {"gigachat", re_gpt2, 0, 0, 0},
    {"a.x-4.0", re_gpt2, 0, 0, 0},
    {"mellum", re_gpt2, 0, 0, 0},
    {"starcoder", re_starcoder, 0, 0, 0},
    {"refact", re_starcoder, 0, 0, 0},
    {"command-r", re_starcoder, 0, 0, 0},
    {"smollm", re_starcoder, 0, 0, 0},
    {"codeshell", re_starcoder, 0, 0, 0},
    {"exaone", re_starcoder, 0, 0, 0},
    {"minerva-7b", re_starcoder, 0, 0, 0},
    {"qwen2", re_qwen2, 0, 0, 0},
    {"deepseek-r1-qwen", re_qwen2, 0, 0, 0},
    {"kormo", re_qwen2, 0, 0, 0},
    {"megrez", re_qwen2, 0, 0, 0},
    {"stablelm2", re_qwen2, 0, 0, 0},
    {"hunyuan", re_qwen2, 0, 0, 0},
    {"solar-open", re_qwen2, 0, 0, 0},
    {"qwen35", re_qwen35, 0, 0, 0},
    {"gpt-4o", re_gpt4o, 0, 0, 0},
};

/* ---- merge table ---- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int merges_init(struct tok_merges *m, int64_t n)
{
    uint64_t slots = 64;
    while (slots < (uint64_t)n * 2)
        slots <<= 1;
    m->key = malloc(slots * sizeof *m->key);
    m->rank = malloc(slots * sizeof *m->rank);
    m->res = malloc(slots * sizeof *m->res);
    if (!m->key || !m->rank || !m->res)
        return CAIRN_ENOMEM;
    memset(m->key, 0xff, slots * sizeof *m->key);
    m->mask = slots - 1;
    m->n = 0;
    return 0;
}

/* Keeps the first rank of a pair listed twice, as llama.cpp's map emplace does. */
static void merges_put(struct tok_merges *m, int32_t l, int32_t r, int32_t rank, int32_t res)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint64_t i = mix64(key) & m->mask;
    while (m->key[i] != UINT64_MAX) {
        if (m->key[i] == key)
            return;
        i = (i + 1) & m->mask;
    }
    m->key[i] = key;
    m->rank[i] = rank;
    m->res[i] = res;
    m->n++;
}

static inline int merges_get(const struct tok_merges *m, int32_t l, int32_t r, int32_t *rank,
                             int32_t *res)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint64_t i = mix64(key) & m->mask;
    for (;;) {
        uint64_t k = m->key[i];
        if (k == key) {
            *rank = m->rank[i];
            *res = m->res[i];
            return 1;
        }
        if (k == UINT64_MAX)
            return 0;
        i = (i + 1) & m->mask;
    }
}

static int32_t intern(struct tok_strtab *st, const char *s, size_t len)
{
    int32_t id = tok_strtab_find(st, s, len);
    return id >= 0 ? id : tok_strtab_add(st, s, len);
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to
 * U+0100 + their rank among the others. */
static void byte_map_init(struct tok *t)
{
    int n = 0;
    for (int i = 0; i < 324; i++)
        t->byte_dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp;
        if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
            cp = (uint32_t)b;
        else
            cp = 256u + (uint32_t)n++;
        t->byte_enc_len[b] = (uint8_t)tok_utf8_put(cp, t->byte_enc[b]);
        t->byte_dec[cp] = (int16_t)b;
    }
}

int tok_bpe_load(struct tok *t, const struct gguf_file *f, char *err, size_t errlen)
{
    const struct pre_def *pd = NULL;
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        if (!strcmp(pre_defs[i].name, t->pre))
            pd = &pre_defs[i];
    if (!pd)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                          "tokenizer.ggml.pre '%s' is not a pre-tokenizer cairn knows", t->pre);
    t->ignore_merges = pd->ignore_merges;
    t->add_bos = pd->add_bos;
    if (pd->no_bos)
        t->bos = -1;

    byte_map_init(t);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = tok_strtab_find(&t->st, &c, 1);
        t->byte_tok[b] = id >= 0 && id < t->n_vocab ? id : -1;
        id = intern(&t->st, t->byte_enc[b], t->byte_enc_len[b]);
        if (id < 0)
            return cairn_fail(err, errlen, id, "tokenizer: out of memory");
        t->byte_sym[b] = id;
    }

    struct gguf_array a;
    int rc = gguf_get_arr(f, "tokenizer.ggml.merges", &a);
    if (rc == CAIRN_ENOTFOUND)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.merges: missing (a gpt2 tokenizer needs its merges)");
    if (rc || a.type != GGUF_STRING)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.merges: not an array of strings");
    if (a.n > INT32_MAX / 4)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tokenizer.ggml.merges: %llu merges is too many",
                          (unsigned long long)a.n);
    if ((rc = merges_init(&t->merges, (int64_t)a.n)))
        return cairn_fail(err, errlen, rc, "tokenizer: out of memory for %llu merges",
                          (unsigned long long)a.n);
    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t i = 0; i < a.n; i++) {
        struct gguf_str m = gguf_arr_str(f, &a, i);
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp)
            continue; /* llama.cpp records an empty pair that never matches */
        size_t ll = (size_t)(sp - m.ptr), rl = m.len - ll - 1;
        if (ll + rl > cat_cap) {
            free(cat);
            cat_cap = (ll + rl) * 2 + 64;
            if (!(cat = malloc(cat_cap)))
                return cairn_fail(err, errlen, CAIRN_ENOMEM, "tokenizer: out of memory");
        }
        memcpy(cat, m.ptr, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t l = intern(&t->st, m.ptr, ll);
        int32_t r = l >= 0 ? intern(&t->st, sp + 1, rl) : l;
        int32_t res = r >= 0 ? intern(&t->st, cat, ll + rl) : r;
        if (res < 0) {
            free(cat);
            return cairn_fail(err, errlen, res, "tokenizer: out of memory");
        }
        merges_put(&t->merges, l, r, (int32_t)i, res);
    }
    free(cat);

    t->jit = 1;
    for (int i = 0; pd->re[i]; i++) {
        int ecode;
        PCRE2_SIZE eoff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pd->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ecode,
                                       &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                              "pre-tokenizer '%s' regex %d: %s at offset %zu", t->pre, i,
                              (const char *)msg, (size_t)eoff);
        }
        t->re[t->n_re++] = re;
        if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0)
            t->jit = 0;
    }
    return 0;
}

void tok_bpe_free(struct tok *t)
{
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    t->n_re = 0;
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.res);
    memset(&t->merges, 0, sizeof t->merges);
}

size_t tok_bpe_decode_text(const struct tok *t, const char *str, size_t len, char *out)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t o = 0, i = 0;
    while (i < len) {
        int r = tok_utf8_next(s + i, len - i);
        if (r <= 0) {
            out[o++] = (char)s[i++];
            continue;
        }
        uint32_t cp = s[i];
        if (r == 2)
            cp = (uint32_t)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
        if (r <= 2 && cp < 324 && t->byte_dec[cp] >= 0) {
            out[o++] = (char)t->byte_dec[cp];
        } else {
            memcpy(out + o, s + i, (size_t)r);
            o += (size_t)r;
        }
        i += (size_t)r;
    }
    return o;
}

/* ---- encoding ---- */

/* Copies text with every byte that does not start a well-formed sequence replaced by
 * U+FFFD, decoding as llama.cpp's unicode_cpt_from_utf8 does (a lead byte and the right
 * number of continuation bytes; overlong forms are re-encoded canonically); surrogates
 * and code points past U+10FFFF, which the reference cannot encode, are invalid too. */
static size_t sanitize(const unsigned char *s, size_t n, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            out[o++] = (char)c;
            i++;
            continue;
        }
        size_t need = (c & 0x40) == 0 ? 0 : (c & 0x20) == 0 ? 2 : (c & 0x10) == 0 ? 3 : (c & 0x08) == 0 ? 4 : 0;
        uint32_t cp = 0;
        int ok = need && i + need <= n;
        if (ok) {
            cp = need == 2 ? (c & 0x1f) : need == 3 ? (c & 0x0f) : (c & 0x07);
            for (size_t k = 1; k < need; k++) {
                if ((s[i + k] & 0xc0) != 0x80) {
                    ok = 0;
                    break;
                }
                cp = cp << 6 | (s[i + k] & 0x3f);
            }
        }
        if (ok && (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)))
            ok = 0;
        if (!ok) {
            o += (size_t)tok_utf8_put(0xfffd, out + o);
            i++;
        } else {
            o += (size_t)tok_utf8_put(cp, out + o);
            i += need;
        }
    }
    return o;
}

static int ensure_match(const struct tok *t, struct tok_scratch *s)
{
    if (s->md)
        return 0;
    s->md = pcre2_match_data_create(1, NULL);
    if (!s->md)
        return CAIRN_ENOMEM;
    if (t->jit) {
        s->mctx = pcre2_match_context_create(NULL);
        s->jstack = pcre2_jit_stack_create(32 * 1024, 2 * 1024 * 1024, NULL);
        if (!s->mctx || !s->jstack)
            return CAIRN_ENOMEM;
        pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
    }
    return 0;
}

static int seg_push(int64_t **seg, int64_t *cap, int64_t *n, int64_t a, int64_t b)
{
    if (TOK_RESERVE(*seg, *cap, (*n + 1) * 2, sizeof **seg))
        return CAIRN_ENOMEM;
    (*seg)[*n * 2] = a;
    (*seg)[*n * 2 + 1] = b;
    (*n)++;
    return 0;
}

/* Splits every segment of s->seg by regex re into matches and gaps, into s->seg2. */
static int split_once(const struct tok *t, struct tok_scratch *s, const pcre2_code *re,
                      const char *u, int64_t nseg, int64_t *nout)
{
    int64_t n = 0;
    for (int64_t k = 0; k < nseg; k++) {
        int64_t a = s->seg[k * 2], b = s->seg[k * 2 + 1];
        PCRE2_SPTR subj = (PCRE2_SPTR)(u + a);
        PCRE2_SIZE slen = (PCRE2_SIZE)(b - a), off = 0, gap = 0;
        while (off < slen) {
            int rc = pcre2_match(re, subj, slen, off, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && t->jit) /* JIT limits: interpret */
                rc = pcre2_match(re, subj, slen, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, NULL);
            if (rc < 0)
                break; /* no match, or a match limit: the rest stays one gap */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            PCRE2_SIZE ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: step over one character */
                if (ms >= slen)
                    break;
                off = ms + tok_utf8_len(subj[ms]);
                continue;
            }
            if (ms > gap && seg_push(&s->seg2, &s->seg2_cap, &n, a + (int64_t)gap, a + (int64_t)ms))
                return CAIRN_ENOMEM;
            if (seg_push(&s->seg2, &s->seg2_cap, &n, a + (int64_t)ms, a + (int64_t)me))
                return CAIRN_ENOMEM;
            gap = off = me;
        }
        if (gap < slen && seg_push(&s->seg2, &s->seg2_cap, &n, a + (int64_t)gap, b))
            return CAIRN_ENOMEM;
    }
    *nout = n;
    return 0;
}

struct bsym {
    int32_t id, prev, next;
};

struct bpair {
    int32_t rank, left, right, lid, rid, res;
};

static inline int pair_less(const struct bpair *a, const struct bpair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

TOK_DEFINE_HEAP(heap, struct bpair, pair_less)

static int try_pair(const struct tok *t, struct tok_scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    const struct bsym *sym = s->sym;
    int32_t rank, res;
    if (!merges_get(&t->merges, sym[l].id, sym[r].id, &rank, &res))
        return 0;
    return heap_push(s, (struct bpair){rank, l, r, sym[l].id, sym[r].id, res});
}

/* Emits a final symbol: a token, or for a merge product that is no token, the tokens of
 * its single bytes where they exist (llama.cpp's fallback). */
static int emit_sym(const struct tok *t, struct tok_scratch *s, int32_t id)
{
    if (id < t->n_vocab)
        return tok_ids_push(&s->out, id);
    size_t len;
    const unsigned char *p = (const unsigned char *)tok_strtab_get(&t->st, id, &len);
    for (size_t i = 0; i < len; i++)
        if (t->byte_tok[p[i]] >= 0 && tok_ids_push(&s->out, t->byte_tok[p[i]]))
            return CAIRN_ENOMEM;
    return 0;
}

static int bpe_word(const struct tok *t, struct tok_scratch *s, const unsigned char *w, int64_t n)
{
    if (n == 1)
        return emit_sym(t, s, t->byte_sym[w[0]]);
    if (t->ignore_merges) {
        if (TOK_RESERVE(s->buf2, s->buf2_cap, n * 2, 1))
            return CAIRN_ENOMEM;
        size_t el = 0;
        for (int64_t i = 0; i < n; i++) {
            memcpy(s->buf2 + el, t->byte_enc[w[i]], t->byte_enc_len[w[i]]);
            el += t->byte_enc_len[w[i]];
        }
        int32_t id = tok_strtab_find(&t->st, s->buf2, el);
        if (id >= 0 && id < t->n_vocab)
            return tok_ids_push(&s->out, id);
    }
    if (TOK_RESERVE(s->sym, s->sym_cap, n, sizeof(struct bsym)))
        return CAIRN_ENOMEM;
    struct bsym *sym = s->sym;
    for (int64_t i = 0; i < n; i++) {
        sym[i].id = t->byte_sym[w[i]];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap_n = 0;
    for (int64_t i = 1; i < n; i++)
        if (try_pair(t, s, (int32_t)i - 1, (int32_t)i))
            return CAIRN_ENOMEM;
    while (s->heap_n > 0) {
        struct bpair p = heap_pop(s);
        sym = s->sym;
        struct bsym *L = &sym[p.left], *R = &sym[p.right];
        if (L->id != p.lid || R->id != p.rid || L->next != p.right)
            continue; /* stale: one side changed since the pair was queued */
        L->id = p.res;
        R->id = -1;
        L->next = R->next;
        if (R->next >= 0)
            sym[R->next].prev = p.left;
        if (try_pair(t, s, L->prev, p.left) || try_pair(t, s, p.left, L->next))
            return CAIRN_ENOMEM;
    }
    sym = s->sym;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if (emit_sym(t, s, sym[i].id))
            return CAIRN_ENOMEM;
    return 0;
}

int tok_bpe_encode(const struct tok *t, struct tok_scratch *s, const char *text, size_t len)
{
    const char *u = text;
    size_t ulen = len;
    if (!tok_utf8_valid(text, len)) {
        if (TOK_RESERVE(s->buf, s->buf_cap, (int64_t)len * 3 + 4, 1))
            return CAIRN_ENOMEM;
        ulen = sanitize((const unsigned char *)text, len, s->buf);
        u = s->buf;
    }
    int rc = ensure_match(t, s);
    if (rc)
        return rc;
    int64_t nseg = 0;
    if (seg_push(&s->seg, &s->seg_cap, &nseg, 0, (int64_t)ulen))
        return CAIRN_ENOMEM;
    for (int i = 0; i < t->n_re; i++) {
        int64_t n2;
        if ((rc = split_once(t, s, t->re[i], u, nseg, &n2)))
            return rc;
        int64_t *tp = s->seg, tc = s->seg_cap;
        s->seg = s->seg2;
        s->seg_cap = s->seg2_cap;
        s->seg2 = tp;
        s->seg2_cap = tc;
        nseg = n2;
    }
    for (int64_t k = 0; k < nseg; k++) {
        int64_t a = s->seg[k * 2], b = s->seg[k * 2 + 1];
        if (b > a && (rc = bpe_word(t, s, (const unsigned char *)u + a, b - a)))
            return rc;
    }
    return 0;
}
