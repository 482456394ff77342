/* cairn embed: the embeddings of texts under an embedding model (engine/embed.h), as
 * JSON, and their throughput. */
#include "base/args.h"
#include "base/clock.h"
#include "base/err.h"
#include "cli/cli.h"
#include "engine/embed.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "model/arch.h"
#include "model/model.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TEXTS 4096

static void usage(FILE *f)
{
    fprintf(f, "usage: cairn embed -m MODEL.gguf [options] (TEXT... | --file F)\n"
               "  --file F          one text per line of F\n"
               "  -t, --threads N   threads (default 2)\n"
               "  --ctx N           longest text in tokens (default 512)\n"
               "  --batch N         tokens per forward (default 512)\n"
               "  --repeat N        embed the texts N times, report the best throughput (stderr)\n"
               "  --no-vectors      print no vectors, only the throughput\n"
               "prints {\"pooling\", \"dim\", \"tokens\", \"embeddings\": [[...], ...]}; texts are tokenized\n"
               "as llama.cpp's server does (BOS/EOS as the model says, control tokens parsed)\n");
}

static int read_lines(const char *path, char **texts, int *n, char **buf)
{
    size_t len;
    if (!(*buf = args_read_file(path, &len)))
        return -1;
    char *p = *buf;
    while (*p && *n < MAX_TEXTS) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = 0;
        if (*p)
            texts[(*n)++] = p;
        if (!nl)
            break;
        p = nl + 1;
    }
    return 0;
}

int cli_embed(int argc, char **argv)
{
    struct args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "embed"};
    const char *model = NULL, *file = NULL, *v;
    int64_t threads = 2, ctx = 512, batch = 512, repeat = 1;
    bool vectors = true;
    static char *texts[MAX_TEXTS];
    int n_texts = 0;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "-m|--model", &v)) model = v;
        else if (args_opt(&a, "--file", &v)) file = v;
        else if (args_opt(&a, "-t|--threads", &v)) threads = args_int(&a, "--threads", v, 1, 256);
        else if (args_opt(&a, "--ctx", &v)) ctx = args_int(&a, "--ctx", v, 1, 1 << 20);
        else if (args_opt(&a, "--batch", &v)) batch = args_int(&a, "--batch", v, 1, 1 << 16);
        else if (args_opt(&a, "--repeat", &v)) repeat = args_int(&a, "--repeat", v, 1, 1000);
        else if (args_opt(&a, "--no-vectors", NULL)) vectors = false;
        else if (args_opt(&a, "-h|--help", NULL)) { usage(stdout); return 0; }
        else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            fprintf(stderr, "cairn embed: unknown option '%s'\n", argv[a.i]);
            usage(stderr);
            return 2;
        } else if (n_texts < MAX_TEXTS) {
            texts[n_texts++] = argv[a.i];
        }
    }
    if (a.bad)
        return 2;
    char *filebuf = NULL;
    if (file && read_lines(file, texts, &n_texts, &filebuf)) {
        fprintf(stderr, "cairn embed: cannot read %s\n", file);
        return 1;
    }
    if (!model || n_texts == 0) {
        fprintf(stderr, "cairn embed: give -m MODEL.gguf and at least one text\n");
        free(filebuf);
        return 2;
    }
    char err[512];
    struct model *m = NULL;
    struct tok *tk = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct embed_input *in = calloc((size_t)n_texts, sizeof *in);
    int32_t *ids = malloc((size_t)n_texts * (size_t)ctx * sizeof *ids);
    float *out = NULL;
    int rc = 1;
    struct model_load_opts lo = {.layer_begin = 0, .layer_end = -1, .threads = (int)threads};
    if (!in || !ids) {
        fprintf(stderr, "cairn embed: out of memory\n");
        goto done;
    }
    if (model_load(&m, model, &lo, err, sizeof err) || tok_load(&tk, m->file, err, sizeof err)) {
        fprintf(stderr, "cairn embed: %s: %s\n", model, err);
        goto done;
    }
    if (m->hp.pooling == MODEL_POOLING_NONE || m->hp.pooling == MODEL_POOLING_RANK) {
        fprintf(stderr, "cairn embed: %s declares pooling '%s': it is not an embedding model\n", model,
                model_pooling_name(m->hp.pooling));
        goto done;
    }
    int64_t total = 0;
    for (int i = 0; i < n_texts; i++) {
        int32_t *dst = ids + (size_t)i * (size_t)ctx;
        int64_t n = 0;
        int trc = tok_encode(tk, texts[i], strlen(texts[i]), 1, 1, dst, ctx, &n);
        if (trc) {
            fprintf(stderr, "cairn embed: text %d: %s (%lld tokens, --ctx %lld)\n", i, cairn_strerror(trc),
                    (long long)n, (long long)ctx);
            goto done;
        }
        in[i] = (struct embed_input){dst, n};
        total += n;
    }
    struct engine_config ec = {.n_threads = (int)threads, .max_batch = (int)batch, .max_ctx = ctx};
    struct kv_config kc = embed_kv_config(m, ctx, (int)batch);
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err)) {
        fprintf(stderr, "cairn embed: %s\n", err);
        goto done;
    }
    int dim = m->hp.n_embd;
    if (!(out = malloc((size_t)n_texts * (size_t)dim * sizeof *out))) {
        fprintf(stderr, "cairn embed: out of memory\n");
        goto done;
    }
    double best = 1e30;
    struct embed_stats st = {0};
    for (int64_t r = 0; r < repeat; r++) {
        double t0 = clock_sec();
        if (embed_run(e, kv, m->hp.pooling, in, n_texts, out, &st, err, sizeof err)) {
            fprintf(stderr, "cairn embed: %s\n", err);
            goto done;
        }
        double dt = clock_sec() - t0;
        if (dt < best)
            best = dt;
    }
    fprintf(stderr, "cairn embed: %d texts, %lld tokens, %lld forwards: best of %lld %.1f ms = %.1f tokens/s (%lld threads)\n",
            n_texts, (long long)total, (long long)st.forwards, (long long)repeat, best * 1e3, (double)total / best,
            (long long)threads);
    if (vectors) {
        printf("{\"pooling\": \"%s\", \"dim\": %d, \"tokens\": %lld, \"embeddings\": [", model_pooling_name(m->hp.pooling),
               dim, (long long)total);
        for (int i = 0; i < n_texts; i++) {
            printf(i ? ",\n[" : "\n[");
            for (int d = 0; d < dim; d++)
                printf(d ? ",%.9g" : "%.9g", (double)out[(size_t)i * (size_t)dim + (size_t)d]);
            printf("]");
        }
        printf("]}\n");
    }
    rc = 0;
done:
    kv_release(kv);
    engine_release(e);
    tok_release(tk);
    model_release(m);
    free(in);
    free(ids);
    free(out);
    free(filebuf);
    return rc;
}
