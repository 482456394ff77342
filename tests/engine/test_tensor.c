/* Tensor parallelism in the engine (engine.h, engine_tp): W ranks in threads of this
 * process, each with its own engine and its own cache of its KV heads, linked by an
 * in-memory gather, give logits of the same bits as one engine, on batches that mix
 * sequences, prefill chunks and decode tokens; W that does not divide the KV heads is
 * refused; each rank reads its part of every matrix and makes 4 exchanges per layer. The
 * same with each rank's model loaded with its rows only (model_load_opts.tp_world). */
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The in-memory exchange: each rank posts its buffer, waits for all, copies the others'
 * parts, and waits again so that no rank reuses its buffer while another still reads it. */
struct mem_tp {
    int world;
    pthread_barrier_t bar;
    float *buf[ENGINE_TP_MAX];
    uint64_t calls;
};

struct mem_rank {
    struct mem_tp *x;
    int rank;
};

static int mem_gather(void *ctx, float *buf, int rows, size_t ld, const int64_t *part, int to_root, char *err,
                      size_t errlen)
{
    (void)err, (void)errlen;
    struct mem_rank *r = ctx;
    struct mem_tp *x = r->x;
    x->buf[r->rank] = buf;
    pthread_barrier_wait(&x->bar);
    if (!to_root || r->rank == 0)
        for (int q = 0; q < x->world; q++) {
            if (q == r->rank)
                continue;
            for (int b = 0; b < rows; b++)
                memcpy(buf + (size_t)b * ld + part[q], x->buf[q] + (size_t)b * ld + part[q],
                       (size_t)(part[q + 1] - part[q]) * sizeof(float));
        }
    if (r->rank == 0)
        x->calls++;
    pthread_barrier_wait(&x->bar);
    return 0;
}

struct rank_run {
    struct engine *e;
    struct kv_cache *kv;
    const struct batch *b;
    float *out;
    int rc;
    char err[256];
};

static void *rank_forward(void *arg)
{
    struct rank_run *r = arg;
    r->rc = engine_forward(r->e, r->kv, r->b, r->out, r->err, sizeof r->err);
    return NULL;
}

/* Three steps over three sequences: two prompts in one batch; their first decode tokens
 * beside a third prompt; then one decode token each (logits of every token). */
#define N_STEPS 3
static const int step_n[N_STEPS] = {12, 5, 3};
static const int32_t step_seq[N_STEPS][12] = {
    {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, {0, 1, 2, 2, 2}, {2, 1, 0}};
static const int64_t step_pos[N_STEPS][12] = {
    {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4}, {7, 5, 0, 1, 2}, {3, 6, 8}};

static void make_batch(int s, int V, int32_t *tok, struct batch *b)
{
    for (int i = 0; i < step_n[s]; i++)
        tok[i] = (int32_t)((s * 131 + i * 37 + step_seq[s][i] * 11 + 5) % V);
    *b = (struct batch){.n = step_n[s], .token = tok, .seq = step_seq[s], .pos = step_pos[s]};
}

/* Logits of every token of every step on one engine ((12 + 5 + 3) x V). */
static float *run_one(const struct model *m, int threads)
{
    char err[256];
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    int V = m->hp.n_vocab;
    float *out = malloc((size_t)20 * (size_t)V * sizeof(float));
    struct engine_config ec = {.n_threads = threads, .max_batch = 16, .max_ctx = 64};
    struct kv_config kc = engine_kv_config(m, 64, 3, 16);
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "engine/kv: %s", err);
        goto fail;
    }
    size_t off = 0;
    for (int s = 0; s < N_STEPS; s++) {
        int32_t tok[12];
        struct batch b;
        make_batch(s, V, tok, &b);
        if (engine_forward(e, kv, &b, out + off, err, sizeof err)) {
            CHECK(0, "engine_forward: %s", err);
            goto fail;
        }
        off += (size_t)step_n[s] * (size_t)V;
    }
    kv_release(kv);
    engine_release(e);
    return out;
fail:
    kv_release(kv);
    engine_release(e);
    free(out);
    return NULL;
}

/* The same on W ranks, rank r over ms[r] (the same whole model, or each rank's rows only);
 * returns rank 0's logits. */
static float *run_tp(struct model *const *ms, int W, int threads, struct engine_tp_stats *st0, uint64_t *gathers,
                     uint64_t *weight_bytes)
{
    char err[256];
    const struct model *m = ms[0];
    int V = m->hp.n_vocab;
    struct mem_tp x = {.world = W};
    struct mem_rank mr[ENGINE_TP_MAX];
    struct rank_run rr[ENGINE_TP_MAX];
    memset(rr, 0, sizeof rr);
    pthread_barrier_init(&x.bar, NULL, (unsigned)W);
    float *out0 = malloc((size_t)20 * (size_t)V * sizeof(float));
    bool ok = true;
    for (int r = 0; r < W && ok; r++) {
        mr[r] = (struct mem_rank){&x, r};
        struct engine_config ec = {.n_threads = threads, .max_batch = 16, .max_ctx = 64,
                                   .tp = {.rank = r, .world = W, .gather = mem_gather, .ctx = &mr[r]}};
        struct kv_config kc = engine_kv_config_tp(ms[r], W, 64, 3, 16);
        rr[r].out = malloc((size_t)16 * (size_t)V * sizeof(float));
        if (engine_create(&rr[r].e, ms[r], &ec, err, sizeof err) || kv_create(&rr[r].kv, &kc, err, sizeof err)) {
            CHECK(0, "rank %d engine/kv: %s", r, err);
            ok = false;
        }
    }
    size_t off = 0;
    for (int s = 0; s < N_STEPS && ok; s++) {
        int32_t tok[12];
        struct batch b;
        make_batch(s, V, tok, &b);
        pthread_t th[ENGINE_TP_MAX];
        for (int r = 0; r < W; r++) {
            rr[r].b = &b;
            pthread_create(&th[r], NULL, rank_forward, &rr[r]);
        }
        for (int r = 0; r < W; r++) {
            pthread_join(th[r], NULL);
            if (rr[r].rc) {
                CHECK(0, "rank %d engine_forward: %s", r, rr[r].err);
                ok = false;
            }
        }
        memcpy(out0 + off, rr[0].out, (size_t)step_n[s] * (size_t)V * sizeof(float));
        off += (size_t)step_n[s] * (size_t)V;
    }
    if (ok)
        *st0 = engine_get_tp_stats(rr[0].e);
    *weight_bytes = 0;
    for (int r = 0; r < W && ok; r++)
        *weight_bytes += engine_get_tp_stats(rr[r].e).weight_bytes;
    *gathers = x.calls;
    for (int r = 0; r < W; r++) {
        kv_release(rr[r].kv);
        engine_release(rr[r].e);
        free(rr[r].out);
    }
    pthread_barrier_destroy(&x.bar);
    if (!ok) {
        free(out0);
        return NULL;
    }
    return out0;
}

static int first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            return (int)i;
    return -1;
}

/* Each rank loaded with only its rows of every matrix (model_load_opts.tp_world): the
 * same logits as one engine's; each holds its share of the matrices (they add up to the
 * whole model's, exactly) and the vectors whole; an engine of another rank is refused. */
static void check_rows_only(const char *path, const struct model *whole, int W, const float *ref, uint64_t mat_bytes)
{
    char err[256];
    struct model *rm[ENGINE_TP_MAX] = {0};
    bool ok = true;
    for (int r = 0; r < W && ok; r++) {
        struct model_load_opts o = {.layer_begin = 0, .layer_end = -1, .threads = 1, .tp_rank = r, .tp_world = W};
        if (model_load(&rm[r], path, &o, err, sizeof err)) {
            CHECK(0, "rank %d of %d: %s", r, W, err);
            ok = false;
        }
    }
    if (ok) {
        uint64_t vec_bytes = whole->all_weight_bytes - mat_bytes, held = 0;
        for (int r = 0; r < W; r++) {
            held += rm[r]->all_weight_bytes;
            CHECK(rm[r]->all_weight_bytes <= mat_bytes / (uint64_t)W + mat_bytes / 16 + vec_bytes,
                  "W %d: rank %d holds %llu bytes of %llu", W, r, (unsigned long long)rm[r]->all_weight_bytes,
                  (unsigned long long)whole->all_weight_bytes);
        }
        CHECK(held == mat_bytes + (uint64_t)W * vec_bytes, "W %d: ranks hold %llu bytes, want %llu", W,
              (unsigned long long)held, (unsigned long long)(mat_bytes + (uint64_t)W * vec_bytes));
        /* rank 1's rows under rank 0's engine: refused, with why */
        struct engine *e = NULL;
        struct engine_config ec = {.n_threads = 1, .max_batch = 1, .max_ctx = 8,
                                   .tp = {.rank = 0, .world = W, .gather = mem_gather, .ctx = NULL}};
        CHECK(engine_create(&e, rm[1], &ec, err, sizeof err) == CAIRN_EINVAL && strstr(err, "rows of"),
              "W %d: rank 1's rows taken by rank 0 (%s)", W, err);
        engine_release(e);
        ec.tp.world = 0;
        CHECK(engine_create(&e, rm[0], &ec, err, sizeof err) == CAIRN_EINVAL, "W %d: rank 0's rows on one node", W);
        engine_release(e);
        struct engine_tp_stats st = {0};
        uint64_t gathers = 0, sum = 0;
        float *tp = run_tp(rm, W, 1, &st, &gathers, &sum);
        if (tp) {
            size_t n = (size_t)20 * (size_t)whole->hp.n_vocab;
            int d = first_diff(ref, tp, n);
            CHECK(d < 0, "W %d, rows only: logits differ from one engine's at %d", W, d);
            CHECK(sum + 64 >= mat_bytes && sum <= mat_bytes + 64, "W %d, rows only: ranks read %llu bytes of %llu", W,
                  (unsigned long long)sum, (unsigned long long)mat_bytes);
            printf("  rows only: same bits; rank 0 holds %llu of the whole model's %llu weight bytes\n",
                   (unsigned long long)rm[0]->all_weight_bytes, (unsigned long long)whole->all_weight_bytes);
        }
        free(tp);
    }
    for (int r = 0; r < W; r++)
        model_release(rm[r]);
    /* a rank's rows of a slice of the layers, a rank out of the world: refused with why */
    struct model *bad = NULL;
    struct model_load_opts o = {.layer_begin = 0, .layer_end = 1, .threads = 1, .tp_rank = 0, .tp_world = W};
    CHECK(model_load(&bad, path, &o, err, sizeof err) == CAIRN_EINVAL && strstr(err, "every layer"),
          "W %d: a slice loaded as a rank (%s)", W, err);
    model_release(bad);
    bad = NULL;
    o = (struct model_load_opts){.layer_begin = 0, .layer_end = -1, .threads = 1, .tp_rank = W, .tp_world = W};
    CHECK(model_load(&bad, path, &o, err, sizeof err) == CAIRN_EINVAL && strstr(err, "rank"), "W %d: rank %d loaded",
          W, W);
    model_release(bad);
}

static void check_model(const char *arch, const char *type, int n_head, int n_head_kv)
{
    struct synth_spec s = {.n_layers = 2, .n_embd = 512, .n_ff = 1024, .n_head = n_head, .n_head_kv = n_head_kv,
                           .head_dim = 64, .n_ctx = 512, .rope_base = 10000, .norm_eps = 1e-5f, .seed = 21,
                           .vocab_size = 768};
    snprintf(s.arch, sizeof s.arch, "%s", arch);
    snprintf(s.type, sizeof s.type, "%s", type);
    char path[128], err[256];
    snprintf(path, sizeof path, "test_tensor_%s_%s_%d.gguf", arch, type, (int)getpid());
    struct model *m = NULL;
    struct model_load_opts o = {.layer_begin = 0, .layer_end = -1, .threads = 1};
    if (synth_write(&s, NULL, path, err, sizeof err) || model_load(&m, path, &o, err, sizeof err)) {
        CHECK(0, "%s %s: %s", arch, type, err);
        unlink(path);
        return;
    }
    float *ref = run_one(m, 2);
    /* one engine reads every matrix of the layers and the head */
    uint64_t all = 0;
    {
        struct engine *e1 = NULL;
        struct engine_config ec = {.n_threads = 1, .max_batch = 1, .max_ctx = 8};
        if (engine_create(&e1, m, &ec, err, sizeof err) == 0)
            all = engine_get_tp_stats(e1).weight_bytes;
        engine_release(e1);
    }
    size_t n = (size_t)20 * (size_t)m->hp.n_vocab;
    for (int W = 2; W <= ENGINE_TP_MAX && ref; W *= 2) {
        if (n_head_kv % W) {
            CHECK(engine_tp_check(m, W, err, sizeof err) == CAIRN_EINVAL && strstr(err, "KV-head"),
                  "%s: W %d of %d KV heads not refused (%s)", arch, W, n_head_kv, err);
            continue;
        }
        CHECK(engine_tp_check(m, W, err, sizeof err) == 0, "%s %s W %d: %s", arch, type, W, err);
        struct engine_tp_stats st = {0};
        uint64_t gathers = 0, sum = 0;
        struct model *same[ENGINE_TP_MAX];
        for (int r = 0; r < W; r++)
            same[r] = m;
        float *tp = run_tp(same, W, W == 2 ? 2 : 1, &st, &gathers, &sum);
        if (tp) {
            int d = first_diff(ref, tp, n);
            CHECK(d < 0, "%s %s W %d: logits differ from one engine's at %d: %.9g vs %.9g", arch, type, W, d,
                  d < 0 ? 0.0 : (double)ref[d], d < 0 ? 0.0 : (double)tp[d]);
            /* 4 exchanges per layer and one of the logits, per forward. */
            CHECK_EQ_INT(st.forwards, N_STEPS);
            CHECK_EQ_INT(st.gathers, N_STEPS * (4 * s.n_layers + 1));
            CHECK_EQ_INT(gathers, st.gathers);
            /* the ranks read the model's weights once between them, each about 1/W */
            CHECK(sum + 64 >= all && sum <= all + 64, "%s W %d: ranks read %llu bytes, one engine %llu", arch, W,
                  (unsigned long long)sum, (unsigned long long)all);
            CHECK(st.weight_bytes <= all / (uint64_t)W + all / 16, "%s W %d: rank 0 reads %llu of %llu bytes", arch,
                  W, (unsigned long long)st.weight_bytes, (unsigned long long)all);
            printf("%s %s W=%d: same bits over %zu logits; %llu exchanges, rank 0's parts %llu bytes; rank 0 reads "
                   "%llu of %llu weight bytes per token\n", arch, type, W, n, (unsigned long long)st.gathers,
                   (unsigned long long)st.part_bytes, (unsigned long long)st.weight_bytes, (unsigned long long)all);
        }
        free(tp);
        if (ref)
            check_rows_only(path, m, W, ref, all);
    }
    free(ref);
    model_release(m);
    unlink(path);
}

static void test_llama_types(void)
{
    static const char *types[] = {"q4_0", "q8_0", "f16", "q4_k_m"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_model("llama", types[i], 16, 8);
}

/* qwen2's biases on q, k, v and qwen3's per-head norms of q and k, taken per rank's heads. */
static void test_qwen(void)
{
    check_model("qwen2", "q8_0", 8, 4);
    check_model("qwen3", "q4_0", 16, 8);
}

/* phi3's fused attn_qkv and ffn_up: a rank's rows of each of the five matrices in them. */
static void test_phi3(void)
{
    check_model("phi3", "q8_0", 8, 8);
}

/* W that does not divide the KV heads, W over the limit, a mixture of experts: refused with why. */
static void test_refused(void)
{
    struct model_hparams hp = {.n_head = 12, .n_head_kv = 6, .head_dim = 64};
    char err[256] = "";
    CHECK(engine_tp_check_hparams(&hp, 4, err, sizeof err) == CAIRN_EINVAL && strstr(err, "6 KV heads"), "%s", err);
    CHECK(engine_tp_check_hparams(&hp, 3, err, sizeof err) == 0, "%s", err);
    CHECK(engine_tp_check_hparams(&hp, 16, err, sizeof err) == CAIRN_EINVAL, "W 16 accepted");
    hp.n_expert = 8;
    CHECK(engine_tp_check_hparams(&hp, 2, err, sizeof err) == CAIRN_EINVAL && strstr(err, "experts"), "%s", err);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_llama_types);
    RUN(test_qwen);
    RUN(test_phi3);
    RUN(test_refused);
    return test_main_end();
}
