#include "base/err.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "model/synth.h"

#include <stdio.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn mkmodel (--shape NAME | --arch A --n-embd N --n-layers N --n-head N [--n-head-kv N]\n"
            "                      --n-ff N [--head-dim N]) [--type T] [--vocab VOCAB.gguf | --vocab-size N]\n"
            "                      [--seed N] [--ctx N] -o OUT.gguf\n"
            "  shapes: %s\n"
            "  types:  f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q4_k_s q5_k_m (default q8_0)\n",
            synth_shape_names());
}

int cli_mkmodel(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "mkmodel", false};
    struct synth_spec s;
    memset(&s, 0, sizeof s);
    snprintf(s.type, sizeof s.type, "q8_0");
    s.seed = 1;
    const char *shape = NULL, *arch = NULL, *vocab = NULL, *out = NULL, *v;
    int64_t n_embd = 0, n_layers = 0, n_head = 0, n_head_kv = 0, n_ff = 0, head_dim = 0, ctx = 0, vocab_size = 0;
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
    s.vocab_size = (int)vocab_size;
    if (!vocab && !vocab_size) {
        fprintf(stderr, "cairn mkmodel: --vocab VOCAB.gguf (a real vocabulary) or --vocab-size N is required\n");
        return 2;
    }
    char err[512];
    int rc = synth_write(&s, vocab, out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn mkmodel: %s\n", err);
        return 1;
    }
    return 0;
}
