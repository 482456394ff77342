#include "base/err.h"
#include "base/args.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/synth.h"
#include "tok/tok.h"

#include <stdlib.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn mkmodel (--shape NAME | --arch A --n-embd N --n-layers N --n-head N [--n-head-kv N]\n"
            "                      --n-ff N [--head-dim N]) [--type T] [--vocab VOCAB.gguf | --vocab-size N]\n"
            "                      [--seed N] [--ctx N] [--script FILE | --script-ids ID,ID,...]\n"
            "                      [--chat-template FILE.jinja] [--scale-from K --scale F] [--split N]\n"
            "                      [--n-expert N --n-expert-used K [--n-ff-exp N]] [--sliding-window W]\n"
            "                      [--yarn F | --llama3-rope] [--add-tokens T1,T2,...] [--pooling P] -o OUT.gguf\n"
            "       cairn mkmodel --draft-of TARGET.gguf --layers K -o OUT.gguf\n"
            "  --scale-from K --scale F: multiply the attention output and FFN down weights of layers\n"
            "            K and up by F (> 0), so that those layers change the model's predictions\n"
            "            less: a draft of its first K layers (--draft-of ... --layers K) then agrees\n"
            "            with it more often the smaller F is (F 1: as without the option). On the\n"
            "            small shape with --scale-from 3, F 0.5 to 0.1 gave greedy acceptance rates of\n"
            "            about 0.6 to 0.9 (it varies with the text); cairn bench --draft measures it\n"
            "  --yarn F: RoPE scaled by YaRN with factor F (> 1) over an original context of --ctx / F\n"
            "  --llama3-rope: rope_freqs.weight with Llama 3.1's scaling (factor 32 over 8192 positions)\n"
            "  --add-tokens: control tokens appended to the vocabulary (e.g. the harmony format's\n"
            "            <|start|>,<|end|>,<|message|>,<|channel|>,<|constrain|>,<|return|>,<|call|>\n"
            "            for a gpt-oss-shaped model on another vocabulary; the gpt-oss shapes add\n"
            "            those by themselves, --add-tokens replaces them)\n"
            "  --n-expert N --n-expert-used K: a mixture of N experts, K per token (qwen3moe, whose\n"
            "            experts are --n-ff-exp wide, or llama, whose experts are --n-ff wide); 0: dense\n"
            "  --sliding-window W: gemma3's attention.sliding_window (its layers slide but every\n"
            "            6th; 0: none), a phi3 file's (which llama.cpp and cairn ignore)\n"
            "  --pooling P: an embedding model: <arch>.pooling_type mean, cls, last (and the tokenizer\n"
            "            appends EOS), or none (a generative model; the qwen3-embed shapes have last)\n"
            "  --split N: write the model as N files in gguf-split's layout, OUT-00001-of-0000N.gguf ...\n"
            "  --script: a model whose greedy continuation of the script's first token is the rest of\n"
            "            the script (text tokenized with the vocabulary, control tokens parsed); each\n"
            "            token of the script must always be followed by the same token\n"
            "  shapes: %s\n"
            "  types:  f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q4_k_s q5_k_m\n"
            "          q2_k q3_k iq4_nl iq4_xs mxfp4 (default q8_0); gpt-oss with mxfp4 as llama.cpp's\n"
            "          MXFP4_MOE: experts MXFP4, other matrices Q8_0\n",
            synth_shape_names());
}

/* Reads the script (token ids, or text tokenized with the vocabulary) and writes the model. */
static int write_script(struct args *a, const struct synth_spec *s, const char *vocab, const char *file,
                        const char *ids, const char *out, char *err, size_t errlen)
{
    int n_vocab = s->vocab_size;
    struct gguf_file *vf = NULL;
    struct tok *tk = NULL;
    int32_t *seq = NULL, *next = NULL;
    char *text = NULL;
    int64_t n = 0;
    int rc;
    if (vocab) {
        if ((rc = gguf_open(&vf, vocab, err, errlen)) || (rc = tok_load(&tk, vf, err, errlen)))
            goto out;
        n_vocab = tok_n_vocab(tk) + synth_extra_tokens_added(s, vf); /* --add-tokens come after the file's */
    }
    if (ids) {
        seq = malloc(strlen(ids) * sizeof *seq + sizeof *seq);
        n = seq ? args_int_list(a, "--script-ids", ids, seq, (int64_t)strlen(ids) + 1) : -1;
        if (n < 0) {
            rc = CAIRN_EINVAL;
            cairn_fail(err, errlen, rc, "bad --script-ids");
            goto out;
        }
    } else {
        if (!tk) {
            rc = cairn_fail(err, errlen, CAIRN_EINVAL, "--script FILE needs --vocab to tokenize it");
            goto out;
        }
        FILE *f = fopen(file, "rb");
        if (!f) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot open %s", file);
            goto out;
        }
        size_t cap = 1 << 20, len = 0;
        text = malloc(cap);
        if (text)
            len = fread(text, 1, cap, f);
        fclose(f);
        seq = malloc(cap * sizeof *seq);
        if (!text || !seq) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            goto out;
        }
        if ((rc = tok_encode(tk, text, len, 0, 1, seq, (int64_t)cap, &n))) {
            cairn_fail(err, errlen, rc, "cannot tokenize %s", file);
            goto out;
        }
    }
    next = malloc((size_t)n_vocab * sizeof *next);
    if (!next) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = synth_script_next(seq, n, next, n_vocab, err, errlen)))
        goto out;
    rc = synth_write_script(s, vocab, next, n_vocab, out, err, errlen);
out:
    free(text);
    free(seq);
    free(next);
    tok_release(tk);
    gguf_close(vf);
    return rc;
}

/* --split N: the file at out becomes N parts in gguf-split's layout, named from out's
 * stem ("m.gguf": "m-00001-of-0000N.gguf" ...), and out is removed. */
static int split_file(const char *out, int n, char *err, size_t errlen)
{
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, out, err, errlen);
    char stem[4096];
    size_t len = strlen(out);
    snprintf(stem, sizeof stem, "%.*s", len > 5 && !strcmp(out + len - 5, ".gguf") ? (int)len - 5 : (int)len, out);
    if (!rc)
        rc = gguf_write_split(f, n, stem, err, errlen);
    gguf_close(f);
    if (!rc)
        unlink(out);
    return rc;
}

int cli_mkmodel(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "mkmodel", false};
    struct synth_spec s;
    memset(&s, 0, sizeof s);
    snprintf(s.type, sizeof s.type, "q8_0");
    s.seed = 1;
    const char *shape = NULL, *arch = NULL, *vocab = NULL, *out = NULL, *v;
    const char *draft_of = NULL, *script_file = NULL, *script_ids = NULL, *template_file = NULL;
    int64_t draft_layers = 0, scale_from = -1, split = 0, swa = -1;
    double out_scale = 0, yarn = 0;
    bool llama3_rope = false;
    const char *add_tokens = NULL, *pooling = NULL;
    int64_t n_embd = 0, n_layers = 0, n_head = 0, n_head_kv = 0, n_ff = 0, head_dim = 0, ctx = 0, vocab_size = 0;
    int64_t n_expert = -1, n_expert_used = 0, n_ff_exp = 0;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--shape", &v)) shape = v;
        else if (args_opt(&a, "--arch", &v)) arch = v;
        else if (args_opt(&a, "--type", &v)) snprintf(s.type, sizeof s.type, "%s", v);
        else if (args_opt(&a, "--vocab", &v)) vocab = v;
        else if (args_opt(&a, "--vocab-size", &v)) vocab_size = args_int(&a, "--vocab-size", v, 2, 1 << 24);
        else if (args_opt(&a, "-o|--output", &v)) out = v;
        else if (args_opt(&a, "--seed", &v)) s.seed = (uint64_t)args_int(&a, "--seed", v, 0, INT64_MAX);
        else if (args_opt(&a, "--ctx", &v)) ctx = args_int(&a, "--ctx", v, 1, 1 << 30);
        else if (args_opt(&a, "--n-embd", &v)) n_embd = args_int(&a, "--n-embd", v, 2, 1 << 16);
        else if (args_opt(&a, "--n-layers", &v)) n_layers = args_int(&a, "--n-layers", v, 1, 1024);
        else if (args_opt(&a, "--n-head", &v)) n_head = args_int(&a, "--n-head", v, 1, 1024);
        else if (args_opt(&a, "--n-head-kv", &v)) n_head_kv = args_int(&a, "--n-head-kv", v, 1, 1024);
        else if (args_opt(&a, "--n-ff", &v)) n_ff = args_int(&a, "--n-ff", v, 1, 1 << 18);
        else if (args_opt(&a, "--head-dim", &v)) head_dim = args_int(&a, "--head-dim", v, 2, 1024);
        else if (args_opt(&a, "--n-expert", &v)) n_expert = args_int(&a, "--n-expert", v, 0, 1024);
        else if (args_opt(&a, "--n-expert-used", &v)) n_expert_used = args_int(&a, "--n-expert-used", v, 1, 1024);
        else if (args_opt(&a, "--n-ff-exp", &v)) n_ff_exp = args_int(&a, "--n-ff-exp", v, 1, 1 << 18);
        else if (args_opt(&a, "--draft-of", &v)) draft_of = v;
        else if (args_opt(&a, "--layers", &v)) draft_layers = args_int(&a, "--layers", v, 1, 1024);
        else if (args_opt(&a, "--script", &v)) script_file = v;
        else if (args_opt(&a, "--script-ids", &v)) script_ids = v;
        else if (args_opt(&a, "--chat-template", &v)) template_file = v;
        else if (args_opt(&a, "--scale-from", &v)) scale_from = args_int(&a, "--scale-from", v, 0, 1024);
        else if (args_opt(&a, "--scale", &v)) out_scale = args_float(&a, "--scale", v, 1e-6, 1e6);
        else if (args_opt(&a, "--split", &v)) split = args_int(&a, "--split", v, 2, 999);
        else if (args_opt(&a, "--yarn", &v)) yarn = args_float(&a, "--yarn", v, 1.0001, 1024);
        else if (args_opt(&a, "--llama3-rope", NULL)) llama3_rope = true;
        else if (args_opt(&a, "--add-tokens", &v)) add_tokens = v;
        else if (args_opt(&a, "--pooling", &v)) pooling = v;
        else if (args_opt(&a, "--sliding-window", &v)) swa = args_int(&a, "--sliding-window", v, 0, 1 << 30);
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn mkmodel: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!out) {
        fprintf(stderr, "cairn mkmodel: -o OUT.gguf is required\n");
        return 2;
    }
    if ((scale_from >= 0) != (out_scale > 0)) {
        fprintf(stderr, "cairn mkmodel: --scale-from K and --scale F go together\n");
        return 2;
    }
    if (scale_from >= 0 && draft_of) {
        fprintf(stderr, "cairn mkmodel: --scale applies when writing a model, not a draft of one\n");
        return 2;
    }
    char err[512];
    if (draft_of) {
        if (!draft_layers) {
            fprintf(stderr, "cairn mkmodel: --draft-of needs --layers K\n");
            return 2;
        }
        if (synth_write_draft(draft_of, (int)draft_layers, out, err, sizeof err)) {
            fprintf(stderr, "cairn mkmodel: %s\n", err);
            return 1;
        }
        return 0;
    }
    if (shape) {
        if (synth_shape(shape, &s)) {
            fprintf(stderr, "cairn mkmodel: unknown shape '%s' (shapes: %s)\n", shape, synth_shape_names());
            return 2;
        }
        if (arch && strcmp(arch, s.arch)) {
            fprintf(stderr, "cairn mkmodel: shape %s is of architecture %s, not %s\n", shape, s.arch, arch);
            return 2;
        }
    } else {
        if (!arch || !n_embd || !n_layers || !n_head || !n_ff) {
            fprintf(stderr, "cairn mkmodel: give --shape, or --arch with --n-embd, --n-layers, --n-head and --n-ff\n");
            return 2;
        }
        snprintf(s.arch, sizeof s.arch, "%s", arch);
        s.rope_base = 10000;
        s.norm_eps = 1e-5f;
        s.tied = 1;
        s.n_ctx = 4096;
    }
    if (n_embd) s.n_embd = (int)n_embd;
    if (n_layers) s.n_layers = (int)n_layers;
    if (n_head) s.n_head = (int)n_head;
    if (n_ff) s.n_ff = (int)n_ff;
    if (n_head_kv || !shape) s.n_head_kv = (int)(n_head_kv ? n_head_kv : s.n_head);
    if (head_dim)
        s.head_dim = (int)head_dim;
    else if (!shape || n_embd || n_head)
        s.head_dim = s.n_embd / s.n_head; /* a shape's own head_dim stands unless resized */
    if (ctx) s.n_ctx = ctx;
    if (yarn) s.yarn_factor = (float)yarn;
    if (llama3_rope) s.llama3_rope = 1;
    if (n_expert >= 0) s.n_expert = (int)n_expert;
    if (n_expert_used) s.n_expert_used = (int)n_expert_used;
    if (n_ff_exp) s.n_ff_exp = (int)n_ff_exp;
    if (s.n_expert > 0 && !strcmp(s.arch, "llama"))
        s.n_ff_exp = s.n_ff; /* llama's experts are feed_forward_length wide */
    if (swa >= 0) s.swa_window = swa;
    if (pooling) {
        int p = -1;
        for (int i = MODEL_POOLING_NONE; i < MODEL_POOLING_RANK; i++)
            if (!strcmp(pooling, model_pooling_name(i)))
                p = i;
        if (p < 0) {
            fprintf(stderr, "cairn mkmodel: --pooling %s: give none, mean, cls or last\n", pooling);
            return 2;
        }
        s.pooling = p;
        s.add_eos = p != MODEL_POOLING_NONE;
    }
    s.vocab_size = (int)vocab_size;
    s.scale_from = (int)(scale_from >= 0 ? scale_from : 0);
    s.out_scale = (float)out_scale;
    if (!vocab && !vocab_size) {
        fprintf(stderr, "cairn mkmodel: --vocab VOCAB.gguf (a real vocabulary) or --vocab-size N is required\n");
        return 2;
    }
    char *tmpl = NULL;
    if (template_file) {
        size_t len = 0;
        if (!(tmpl = args_read_file(template_file, &len))) {
            fprintf(stderr, "cairn mkmodel: cannot read the chat template %s\n", template_file);
            return 1;
        }
        s.chat_template = tmpl;
    }
    char *extra_buf = add_tokens ? strdup(add_tokens) : NULL;
    const char *extra[64];
    if (add_tokens) /* they replace a shape's own (gpt-oss's harmony tokens) */
        s.n_extra_tokens = 0;
    for (char *save = NULL, *t = extra_buf ? strtok_r(extra_buf, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
        if (s.n_extra_tokens == 64) {
            fprintf(stderr, "cairn mkmodel: --add-tokens: at most 64 tokens\n");
            free(extra_buf);
            free(tmpl);
            return 2;
        }
        extra[s.n_extra_tokens++] = t;
    }
    if (add_tokens)
        s.extra_tokens = extra;
    int rc;
    if (script_file || script_ids)
        rc = write_script(&a, &s, vocab, script_file, script_ids, out, err, sizeof err);
    else
        rc = synth_write(&s, vocab, out, err, sizeof err);
    free(tmpl);
    free(extra_buf);
    if (a.bad)
        return 2;
    if (!rc && split)
        rc = split_file(out, (int)split, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn mkmodel: %s\n", err);
        return 1;
    }
    return 0;
}
