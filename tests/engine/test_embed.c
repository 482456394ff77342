/* Embeddings (engine/embed.h) on a qwen3-embed-tiny file written by synth_write (qwen2
 * vocabulary, last-token pooling declared in its metadata):
 *   - pooling and normalisation against a float64 reference (mean, cls, last);
 *   - embed_run's vector of a sequence equals the reference computed from that
 *     sequence's own hidden rows (engine_forward with batch.hidden, alone);
 *   - the same bits alone, in a batch of 32, and cut into chunks by a small max_batch;
 *   - unit length; different texts differ; the counts of forwards packing makes;
 *   - bad inputs (empty, too long, token outside the vocabulary, pooling none) refused. */
#include "base/err.h"
#include "engine/embed.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "model/arch.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX 256

struct fixture {
    char dir[64], path[128];
    struct model *m;
    int dim, n_vocab;
};

static int fixture_open(struct fixture *fx)
{
    char err[512];
    memset(fx, 0, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/cairn-test-embed-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    snprintf(fx->path, sizeof fx->path, "%s/embed.gguf", fx->dir);
    struct synth_spec spec;
    synth_shape("qwen3-embed-tiny", &spec);
    snprintf(spec.type, sizeof spec.type, "f32");
    spec.seed = 11;
    if (synth_write(&spec, test_data_path("vocab/ggml-vocab-qwen2.gguf"), fx->path, err, sizeof err) ||
        model_load(&fx->m, fx->path, NULL, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    fx->dim = fx->m->hp.n_embd;
    fx->n_vocab = fx->m->hp.n_vocab;
    return 0;
}

static void fixture_close(struct fixture *fx)
{
    model_release(fx->m);
    unlink(fx->path);
    rmdir(fx->dir);
}

/* The float64 reference: pool in double, normalise in double, one rounding at the end. */
static void ref_embed(int pooling, const float *rows, int64_t n, int dim, double *out)
{
    for (int d = 0; d < dim; d++) {
        double v = 0;
        if (pooling == MODEL_POOLING_CLS)
            v = rows[d];
        else if (pooling == MODEL_POOLING_LAST)
            v = rows[(size_t)(n - 1) * (size_t)dim + (size_t)d];
        else {
            for (int64_t i = 0; i < n; i++)
                v += rows[(size_t)i * (size_t)dim + (size_t)d];
            v /= (double)n;
        }
        out[d] = v;
    }
    double ss = 0;
    for (int d = 0; d < dim; d++)
        ss += out[d] * out[d];
    for (int d = 0; d < dim; d++)
        out[d] = ss > 0 ? out[d] / sqrt(ss) : 0;
}

static double max_diff(const float *a, const double *b, int dim)
{
    double m = 0;
    for (int d = 0; d < dim; d++)
        if (fabs((double)a[d] - b[d]) > m)
            m = fabs((double)a[d] - b[d]);
    return m;
}

static void test_pool_reference(void)
{
    uint64_t st = 5;
    const int dim = 384;
    for (int pooling = MODEL_POOLING_MEAN; pooling <= MODEL_POOLING_LAST; pooling++)
        for (int64_t n = 1; n <= 40; n += 13) {
            float *rows = malloc((size_t)n * dim * sizeof *rows), out[384];
            double ref[384];
            for (int64_t i = 0; i < n * dim; i++)
                rows[i] = test_rand_float(&st) * (i % 7 == 0 ? 100.0f : 1.0f);
            embed_pool(pooling, rows, n, dim, out);
            embed_normalize(out, dim);
            ref_embed(pooling, rows, n, dim, ref);
            double md = max_diff(out, ref, dim), len = 0;
            for (int d = 0; d < dim; d++)
                len += (double)out[d] * out[d];
            CHECK(md < 2e-7, "%s pooling of %lld rows: max |cairn - float64| = %g", model_pooling_name(pooling),
                  (long long)n, md);
            CHECK(fabs(len - 1) < 1e-6, "%s: squared length %.9f", model_pooling_name(pooling), len);
            free(rows);
        }
    float zero[8] = {0};
    embed_normalize(zero, 8);
    CHECK(zero[0] == 0 && zero[7] == 0, "a zero vector stays zero");
}

/* A deterministic text of n tokens (ids past the byte tokens), the last one the EOS the
 * tokenizer appends. */
static void make_text(int32_t *ids, int64_t n, uint64_t seed, int n_vocab, int32_t eos)
{
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(300 + test_rand_u64(&seed) % 20000u % (uint64_t)(n_vocab - 300));
    ids[n - 1] = eos;
}

static int run(struct fixture *fx, int max_batch, int pooling, const struct embed_input *in, int n, float *out,
               struct embed_stats *st, char *err, size_t errlen)
{
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 2, .max_batch = max_batch, .max_ctx = CTX};
    struct kv_config kc = embed_kv_config(fx->m, CTX, max_batch);
    int rc = engine_create(&e, fx->m, &ec, err, errlen);
    if (!rc)
        rc = kv_create(&kv, &kc, err, errlen);
    if (!rc)
        rc = embed_run(e, kv, pooling, in, n, out, st, err, errlen);
    kv_release(kv);
    engine_release(e);
    return rc;
}

/* The vector of one sequence from its own hidden rows, by the float64 reference. */
static void hidden_reference(struct fixture *fx, int pooling, const int32_t *ids, int64_t n, double *ref)
{
    char err[256];
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 1, .max_batch = (int)n, .max_ctx = CTX};
    struct kv_config kc = engine_kv_config(fx->m, CTX, 1, 16);
    float *rows = malloc((size_t)n * fx->dim * sizeof *rows);
    int32_t *seq = calloc((size_t)n, sizeof *seq);
    int64_t *pos = malloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = i;
    struct batch b = {.n = (int)n, .token = ids, .seq = seq, .pos = pos, .hidden = true};
    int rc = engine_create(&e, fx->m, &ec, err, sizeof err);
    if (!rc)
        rc = kv_create(&kv, &kc, err, sizeof err);
    if (!rc)
        rc = engine_forward(e, kv, &b, rows, err, sizeof err);
    CHECK(rc == 0, "hidden forward: %s", err);
    if (!rc)
        ref_embed(pooling, rows, n, fx->dim, ref);
    kv_release(kv);
    engine_release(e);
    free(rows);
    free(seq);
    free(pos);
}

static void test_batch_invariance(struct fixture *fx)
{
    enum { N = 32 };
    static int32_t ids[N][40];
    struct embed_input in[N];
    int32_t eos = 151643; /* <|endoftext|> of the qwen2 vocabulary */
    for (int i = 0; i < N; i++) {
        in[i] = (struct embed_input){ids[i], 3 + (i * 7) % 37};
        make_text(ids[i], in[i].n, 100 + (uint64_t)i, fx->n_vocab, eos);
    }
    for (int pooling = MODEL_POOLING_MEAN; pooling <= MODEL_POOLING_LAST; pooling++) {
        char err[512];
        float *all = malloc((size_t)N * fx->dim * sizeof *all), *chunked = malloc((size_t)N * fx->dim * sizeof *chunked);
        float *one = malloc((size_t)fx->dim * sizeof *one);
        double *ref = malloc((size_t)fx->dim * sizeof *ref);
        struct embed_stats st;
        int rc = run(fx, 512, pooling, in, N, all, &st, err, sizeof err);
        CHECK(rc == 0, "embed_run of %d texts: %s", N, err);
        int64_t total = 0;
        for (int i = 0; i < N; i++)
            total += in[i].n;
        /* 32 texts of 3..39 tokens fit one forward of 512 tokens... unless over 512 */
        CHECK_EQ_INT(st.tokens, total);
        CHECK_EQ_INT(st.forwards, (total + 511) / 512);
        rc = run(fx, 16, pooling, in, N, chunked, &st, err, sizeof err);
        CHECK(rc == 0, "embed_run chunked: %s", err);
        CHECK_EQ_INT(st.forwards, (total + 15) / 16);
        CHECK(!memcmp(all, chunked, (size_t)N * fx->dim * sizeof *all),
              "%s: batches of 512 and of 16 tokens give different bits", model_pooling_name(pooling));
        for (int i = 0; i < N; i += 5) {
            rc = run(fx, 512, pooling, &in[i], 1, one, NULL, err, sizeof err);
            CHECK(rc == 0, "alone: %s", err);
            CHECK(!memcmp(one, all + (size_t)i * fx->dim, (size_t)fx->dim * sizeof *one),
                  "%s: text %d alone differs from the same text in a batch of %d", model_pooling_name(pooling), i, N);
            hidden_reference(fx, pooling, ids[i], in[i].n, ref);
            double md = max_diff(one, ref, fx->dim);
            CHECK(md < 1e-6, "%s: text %d against the float64 pooling of its hidden rows: max diff %g",
                  model_pooling_name(pooling), i, md);
            double len = 0, dot = 0;
            for (int d = 0; d < fx->dim; d++) {
                len += (double)one[d] * one[d];
                dot += (double)one[d] * all[(size_t)((i + 1) % N) * fx->dim + d];
            }
            CHECK(fabs(len - 1) < 1e-5, "text %d: squared length %.8f", i, len);
            CHECK(dot < 0.9999, "texts %d and %d: cosine %.6f (different texts should differ)", i, (i + 1) % N, dot);
        }
        free(all);
        free(chunked);
        free(one);
        free(ref);
    }
}

static void test_refusals(struct fixture *fx)
{
    char err[512] = "";
    int32_t ids[8] = {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000};
    float *out = malloc((size_t)2 * fx->dim * sizeof *out);
    struct embed_input in[2] = {{ids, 8}, {ids, 0}};
    CHECK(run(fx, 64, MODEL_POOLING_LAST, in, 2, out, NULL, err, sizeof err) == CAIRN_EINVAL && strstr(err, "input 1"),
          "an empty input: %s", err);
    in[1].n = 8;
    ids[3] = fx->n_vocab;
    CHECK(run(fx, 64, MODEL_POOLING_LAST, in, 2, out, NULL, err, sizeof err) == CAIRN_EINVAL &&
              strstr(err, "vocabulary"),
          "a token outside the vocabulary: %s", err);
    ids[3] = 4000;
    CHECK(run(fx, 64, MODEL_POOLING_NONE, in, 2, out, NULL, err, sizeof err) == CAIRN_EINVAL && strstr(err, "none"),
          "pooling none: %s", err);
    int32_t *big = calloc(CTX + 1, sizeof *big);
    struct embed_input long_in = {big, CTX + 1};
    CHECK(run(fx, 64, MODEL_POOLING_LAST, &long_in, 1, out, NULL, err, sizeof err) == CAIRN_EINVAL &&
              strstr(err, "context"),
          "an input longer than the context: %s", err);
    free(big);
    free(out);
}

static void test_metadata(struct fixture *fx)
{
    CHECK_EQ_INT(fx->m->hp.pooling, MODEL_POOLING_LAST);
    CHECK(!strcmp(model_pooling_name(MODEL_POOLING_MEAN), "mean") && !model_pooling_name(5), "pooling names");
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    struct fixture fx;
    RUN(test_pool_reference);
    if (!test_listing()) {
        if (fixture_open(&fx))
            return 1;
    }
    RUN(test_metadata, &fx);
    RUN(test_batch_invariance, &fx);
    RUN(test_refusals, &fx);
    if (!test_listing())
        fixture_close(&fx);
    return test_main_end();
}
