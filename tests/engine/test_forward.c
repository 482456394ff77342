/* The forward pass of each architecture against a float64 reference, and its bitwise
 * invariances: alone vs in batches, prompt in one chunk vs many, 1 vs 2 vs 3 threads
 * (3 also with the workers held off: held_pool.h),
 * two chained slices vs the whole model, KV rollback and fork. */
#define _GNU_SOURCE /* held_pool.h */
#include "base/dtype.h"
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "held_pool.h"
#include "ref_forward.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define N_TOK 12
#define MAX_SEQS 4

struct runner {
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    int n_vocab;
};

/* KV storage type of the runners: F32 where a test compares with float64 to 1e-4. */
static int kv_type = DT_F16;
/* Borrowed by the runners' engines where set (engine_config.pool), else each makes its own. */
static struct pool *g_pool;

static int runner_open(struct runner *r, const char *path, int threads, int layer_begin, int layer_end)
{
    char err[512];
    memset(r, 0, sizeof *r);
    struct model_load_opts o = {.layer_begin = layer_begin, .layer_end = layer_end, .path = KERN_PATH_AUTO};
    if (model_load(&r->m, path, &o, err, sizeof err)) {
        fprintf(stderr, "model_load %s: %s\n", path, err);
        return -1;
    }
    struct engine_config ec = {.n_threads = threads, .max_batch = 64, .max_ctx = 256, .pool = g_pool};
    struct kv_config kc = engine_kv_config(r->m, 256, MAX_SEQS, 4); /* small blocks: tables span several */
    kc.type_k = kc.type_v = kv_type;
    if (engine_create(&r->e, r->m, &ec, err, sizeof err) || kv_create(&r->kv, &kc, err, sizeof err)) {
        fprintf(stderr, "engine/kv: %s\n", err);
        return -1;
    }
    r->n_vocab = r->m->hp.n_vocab;
    return 0;
}

static void runner_close(struct runner *r)
{
    kv_release(r->kv);
    engine_release(r->e);
    model_release(r->m);
}

/* Feeds tokens [from, to) of seq in chunks of `chunk` (at most FEED_MAX), storing every
 * position's logits. */
enum { FEED_MAX = 512 };
static int feed(struct runner *r, int seq, const int32_t *toks, int from, int to, int chunk, float *logits)
{
    int32_t seqs[FEED_MAX];
    int64_t pos[FEED_MAX];
    char err[512];
    if (chunk < 1 || chunk > FEED_MAX)
        return -1;
    for (int i = from; i < to; i += chunk) {
        int n = to - i < chunk ? to - i : chunk;
        for (int k = 0; k < n; k++) {
            seqs[k] = seq;
            pos[k] = i + k;
        }
        struct batch b = {.n = n, .token = toks + i, .seq = seqs, .pos = pos};
        if (engine_forward(r->e, r->kv, &b, logits + (size_t)i * r->n_vocab, err, sizeof err)) {
            fprintf(stderr, "engine_forward: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static void make_tokens(int32_t *t, int n, int n_vocab, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(test_rand_u64(&seed) % (uint64_t)n_vocab);
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* Largest |a-b| relative to the RMS of the reference, over all logits. */
static double rel_err(const float *a, const double *ref, size_t n)
{
    double ss = 0, maxd = 0;
    for (size_t i = 0; i < n; i++) {
        ss += ref[i] * ref[i];
        double d = fabs((double)a[i] - ref[i]);
        maxd = d > maxd ? d : maxd;
    }
    return maxd / sqrt(ss / (double)n);
}

static void check_model(const char *label, const struct synth_spec *spec, double tol)
{
    char path[256];
    snprintf(path, sizeof path, "test_forward_%s_%d.gguf", label, (int)getpid());
    char err[512];
    if (synth_write(spec, NULL, path, err, sizeof err)) {
        CHECK(0, "%s: synth_write: %s", label, err);
        return;
    }
    struct runner r;
    if (runner_open(&r, path, 2, 0, -1)) {
        CHECK(0, "%s: cannot open model", label);
        unlink(path);
        return;
    }
    int V = r.n_vocab;
    size_t all = (size_t)N_TOK * V;
    int32_t toks[N_TOK], toks2[N_TOK];
    make_tokens(toks, N_TOK, V, 11);
    make_tokens(toks2, N_TOK, V, 22);
    float *whole = malloc(all * sizeof(float)), *other = malloc(all * sizeof(float));

    /* 1. against the float64 reference */
    CHECK(feed(&r, 0, toks, 0, N_TOK, N_TOK, whole) == 0, "%s: forward failed", label);
    int rv;
    double *ref = ref_forward(path, toks, N_TOK, &rv);
    CHECK(ref && rv == V, "%s: reference failed", label);
    if (ref) {
        double e = rel_err(whole, ref, all);
        CHECK(e < tol, "%s: max |logit - float64 reference| = %.4g of the logits' RMS (tolerance %.3g)", label, e, tol);
        printf("%s: max error vs float64 reference: %.3g of RMS\n", label, e);
        free(ref);
    }

    /* 2. prompt in chunks of 1 and 5 vs one batch */
    int chunks[] = {1, 5};
    for (int c = 0; c < 2; c++) {
        kv_seq_clear(r.kv, 0);
        feed(&r, 0, toks, 0, N_TOK, chunks[c], other);
        CHECK(same_bits(whole, other, all), "%s: logits differ when the prompt is fed in chunks of %d", label, chunks[c]);
    }

    /* 3. in a batch with another sequence, interleaved token by token */
    kv_seq_clear(r.kv, 0);
    kv_seq_clear(r.kv, 1);
    {
        int32_t bt[2 * N_TOK], bs[2 * N_TOK];
        int64_t bp[2 * N_TOK];
        for (int i = 0; i < N_TOK; i++) {
            bt[2 * i] = toks2[i], bs[2 * i] = 1, bp[2 * i] = i;
            bt[2 * i + 1] = toks[i], bs[2 * i + 1] = 0, bp[2 * i + 1] = i;
        }
        float *mixed = malloc(2 * all * sizeof(float));
        struct batch b = {.n = 2 * N_TOK, .token = bt, .seq = bs, .pos = bp};
        CHECK(engine_forward(r.e, r.kv, &b, mixed, err, sizeof err) == 0, "%s: mixed batch: %s", label, err);
        bool same = true;
        for (int i = 0; i < N_TOK; i++)
            same &= same_bits(whole + (size_t)i * V, mixed + (size_t)(2 * i + 1) * V, (size_t)V);
        CHECK(same, "%s: logits differ when batched with another sequence", label);
        free(mixed);
    }

    /* 3b. decode-sized batches (attention's cold path) of two sequences, each in two runs
     * of the batch: {0: i, 1: i, 0: i+1, 1: i+1}; a run's RoPE and K and V writes must come
     * before the other run of its sequence attends over them */
    kv_seq_clear(r.kv, 0);
    kv_seq_clear(r.kv, 1);
    {
        bool same = true;
        float *four = malloc(4 * (size_t)V * sizeof(float));
        for (int i = 0; four && i + 1 < N_TOK; i += 2) {
            int32_t bt[4] = {toks[i], toks2[i], toks[i + 1], toks2[i + 1]}, bs[4] = {0, 1, 0, 1};
            int64_t bp[4] = {i, i, i + 1, i + 1};
            struct batch b = {.n = 4, .token = bt, .seq = bs, .pos = bp};
            CHECK(engine_forward(r.e, r.kv, &b, four, err, sizeof err) == 0, "%s: batch of 4: %s", label, err);
            same &= same_bits(whole + (size_t)i * V, four, (size_t)V) &&
                    same_bits(whole + (size_t)(i + 1) * V, four + 2 * (size_t)V, (size_t)V);
        }
        CHECK(four && same, "%s: logits differ in decode batches of two sequences in two runs each", label);
        free(four);
    }

    /* 4. KV rollback: decode a wrong tail, roll back, redo: as if never decoded */
    kv_seq_clear(r.kv, 0);
    feed(&r, 0, toks, 0, 6, 6, other);
    feed(&r, 0, toks2, 6, 10, 2, other); /* a tail that is then rejected */
    feed(&r, 0, toks, 6, N_TOK, 3, other);
    CHECK(same_bits(whole + (size_t)6 * V, other + (size_t)6 * V, (size_t)(N_TOK - 6) * V),
          "%s: logits after rollback differ from never having decoded the tail", label);

    /* 5. fork: seq 2 shares seq 0's first 8 positions, then both continue */
    kv_seq_clear(r.kv, 0);
    feed(&r, 0, toks, 0, 8, 8, other);
    CHECK(kv_fork(r.kv, 0, 2) == 0, "%s: fork failed", label);
    feed(&r, 2, toks, 8, N_TOK, 4, other);
    CHECK(same_bits(whole + (size_t)8 * V, other + (size_t)8 * V, (size_t)(N_TOK - 8) * V),
          "%s: forked sequence's logits differ", label);
    feed(&r, 0, toks2, 8, N_TOK, 4, other); /* the original goes elsewhere; the fork is unaffected */
    kv_seq_clear(r.kv, 3);
    CHECK(kv_fork(r.kv, 2, 3) == 0, "%s: second fork failed", label);
    feed(&r, 3, toks, 11, N_TOK, 1, other);
    CHECK(same_bits(whole + (size_t)11 * V, other + (size_t)11 * V, (size_t)V),
          "%s: fork of a fork differs after the source diverged", label);
    runner_close(&r);

    /* 6. thread counts */
    for (int t = 1; t <= 3; t += 2) {
        if (runner_open(&r, path, t, 0, -1))
            break;
        feed(&r, 0, toks, 0, N_TOK, 4, other);
        CHECK(same_bits(whole, other, all), "%s: logits differ with %d threads", label, t);
        runner_close(&r);
    }
    /* and with 3 threads whose workers are held off: the claimed jobs done by the caller alone */
    struct held held = {0};
    if (held_open(&held, 3) == 0) {
        g_pool = held.pool;
        if (runner_open(&r, path, 3, 0, -1) == 0) {
            for (int chunk = 4; chunk >= 1; chunk -= 3) { /* batches of 4, then decode steps */
                held_enter(&held, true);
                feed(&r, chunk == 4 ? 0 : 1, toks, 0, N_TOK, chunk, other);
                held_enter(&held, false);
                CHECK(same_bits(whole, other, all), "%s: logits differ with 3 threads held off, chunks of %d",
                      label, chunk);
            }
            runner_close(&r);
        }
        g_pool = NULL;
    }
    pool_release(held.pool);

    /* 7. two slices chained equal the whole model */
    int split = spec->n_layers / 2;
    struct runner a, b;
    if (runner_open(&a, path, 2, 0, split) == 0 && runner_open(&b, path, 1, split, spec->n_layers) == 0) {
        float *act = malloc((size_t)N_TOK * spec->n_embd * sizeof(float));
        int32_t seqs[N_TOK] = {0};
        int64_t pos[N_TOK];
        for (int i = 0; i < N_TOK; i++)
            pos[i] = i;
        struct batch b1 = {.n = N_TOK, .token = toks, .seq = seqs, .pos = pos};
        CHECK(engine_forward(a.e, a.kv, &b1, act, err, sizeof err) == 0, "%s: first slice: %s", label, err);
        struct batch b2 = {.n = N_TOK, .embd = act, .seq = seqs, .pos = pos};
        CHECK(engine_forward(b.e, b.kv, &b2, other, err, sizeof err) == 0, "%s: second slice: %s", label, err);
        CHECK(same_bits(whole, other, all), "%s: slices [0,%d) + [%d,%d) differ from the whole", label, split, split,
              spec->n_layers);
        free(act);
        runner_close(&a);
        runner_close(&b);
    } else {
        CHECK(0, "%s: cannot open slices", label);
    }

    /* 8. malformed batches are refused with a message */
    if (runner_open(&r, path, 1, 0, -1) == 0) {
        int32_t bad_tok = V;
        int32_t s0 = 0;
        int64_t p0 = 0, p5 = 5;
        struct batch bb = {.n = 1, .token = &bad_tok, .seq = &s0, .pos = &p0};
        err[0] = 0;
        CHECK(engine_forward(r.e, r.kv, &bb, other, err, sizeof err) == CAIRN_EINVAL && strstr(err, "vocabulary"),
              "%s: out-of-vocabulary token accepted (%s)", label, err);
        bb.token = toks;
        bb.pos = &p5;
        CHECK(engine_forward(r.e, r.kv, &bb, other, err, sizeof err) == CAIRN_EINVAL && strstr(err, "position"),
              "%s: position past the sequence end accepted (%s)", label, err);
        runner_close(&r);
    }
    free(whole);
    free(other);
    unlink(path);
}

/* Loaded on one thread and on several, a model computes the same logits, bit for bit. */
static void check_threads_same(const char *path)
{
    char err[512];
    float *logits[2] = {NULL, NULL};
    uint64_t bytes[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        struct model *m = NULL;
        struct engine *e = NULL;
        struct kv_cache *kv = NULL;
        struct model_load_opts o = {.layer_end = -1, .threads = i ? 3 : 1};
        struct engine_config ec = {.n_threads = 1, .max_batch = 4, .max_ctx = 16};
        if (model_load(&m, path, &o, err, sizeof err) || engine_create(&e, m, &ec, err, sizeof err)) {
            CHECK(0, "load on %d threads: %s", o.threads, err);
        } else {
            struct kv_config kc = engine_kv_config(m, 16, 1, 16);
            int32_t tok[4] = {1, 17, 200, 5}, seq[4] = {0};
            int64_t pos[4] = {0, 1, 2, 3};
            uint8_t want[4] = {1, 1, 1, 1};
            struct batch b = {.n = 4, .token = tok, .seq = seq, .pos = pos, .logits = want};
            logits[i] = malloc(4 * (size_t)m->hp.n_vocab * sizeof(float));
            bytes[i] = m->weight_bytes;
            if (!logits[i] || kv_create(&kv, &kc, err, sizeof err) || engine_forward(e, kv, &b, logits[i], err, sizeof err))
                CHECK(0, "forward after a load on %d threads: %s", o.threads, err);
        }
        if (i == 1 && logits[0] && logits[1] && m)
            CHECK(bytes[0] == bytes[1] && !memcmp(logits[0], logits[1], 4 * (size_t)m->hp.n_vocab * sizeof(float)),
                  "1 and 3 loading threads: %llu and %llu weight bytes, logits %s", (unsigned long long)bytes[0],
                  (unsigned long long)bytes[1], memcmp(logits[0], logits[1], 4 * sizeof(float)) ? "differ" : "equal");
        kv_release(kv);
        engine_release(e);
        model_release(m);
    }
    free(logits[0]);
    free(logits[1]);
}

/* A mixture of experts: 8 sequences decoded in one batch give the bits each gives alone
 * (the prompts alone and together also run moe.c's two schedules of down),
 * and the batch runs each chosen expert once for all the tokens that chose it: a decode
 * step of one token runs exactly n_expert_used experts per layer (only their weights are
 * read), one of 8 tokens at most n_expert per layer, fewer than its 8 x n_expert_used
 * choices. */
static void check_moe_batch(const char *label, const struct synth_spec *spec)
{
    enum { NS = 8, PL = 6 };
    char path[256], err[512];
    snprintf(path, sizeof path, "test_forward_moeb_%s_%d.gguf", label, (int)getpid());
    if (synth_write(spec, NULL, path, err, sizeof err)) {
        CHECK(0, "%s: synth_write: %s", label, err);
        return;
    }
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 2, .max_batch = NS * PL, .max_ctx = 64};
    if (model_load(&m, path, NULL, err, sizeof err) || engine_create(&e, m, &ec, err, sizeof err)) {
        CHECK(0, "%s: %s", label, err);
        goto out;
    }
    struct kv_config kc = engine_kv_config(m, 64, NS, 16);
    if (kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "%s: %s", label, err);
        goto out;
    }
    int V = m->hp.n_vocab, L = m->hp.n_layers, K = m->hp.n_expert_used;
    int32_t toks[NS][PL + 1];
    for (int i = 0; i < NS; i++)
        make_tokens(toks[i], PL + 1, V, 100 + (uint64_t)i);
    float *alone = malloc((size_t)NS * 2 * V * sizeof(float)), *logits = malloc((size_t)NS * PL * V * sizeof(float));
    int32_t seq[NS * PL];
    int64_t pos[NS * PL];
    uint64_t expert_bytes = 0; /* one expert of each layer (the mix gives some layers more bits) */
    for (int l = 0; l < L; l++)
        expert_bytes += model_expert_bytes(&m->layers[l], 0);
    for (int i = 0; i < NS; i++) { /* alone: the prompt in one batch, then one decode step */
        for (int k = 0; k < PL; k++)
            seq[k] = i, pos[k] = k;
        struct batch b = {.n = PL, .token = toks[i], .seq = seq, .pos = pos};
        CHECK(engine_forward(e, kv, &b, logits, err, sizeof err) == 0, "%s: %s", label, err);
        memcpy(alone + (size_t)(2 * i) * V, logits + (size_t)(PL - 1) * V, (size_t)V * sizeof(float));
        struct moe_stats s0 = engine_moe_stats(e);
        pos[0] = PL;
        b = (struct batch){.n = 1, .token = &toks[i][PL], .seq = seq, .pos = pos};
        CHECK(engine_forward(e, kv, &b, alone + (size_t)(2 * i + 1) * V, err, sizeof err) == 0, "%s: %s", label, err);
        struct moe_stats s1 = engine_moe_stats(e);
        CHECK(s1.expert_runs - s0.expert_runs == (uint64_t)(L * K) &&
                  s1.expert_bytes - s0.expert_bytes == (uint64_t)K * expert_bytes,
              "%s: a decode step ran %llu experts (%llu bytes), expected %d (%llu)", label,
              (unsigned long long)(s1.expert_runs - s0.expert_runs), (unsigned long long)(s1.expert_bytes - s0.expert_bytes),
              L * K, (unsigned long long)((uint64_t)K * expert_bytes));
        CHECK(s1.down_by_expert - s0.down_by_expert == (uint64_t)L, "%s: a decode step's down did not run by experts",
              label);
        kv_seq_clear(kv, i);
    }
    /* together: the prompts interleaved in one batch, then one decode step of all 8 */
    int32_t bt[NS * PL];
    for (int k = 0; k < PL; k++)
        for (int i = 0; i < NS; i++)
            bt[k * NS + i] = toks[i][k], seq[k * NS + i] = i, pos[k * NS + i] = k;
    struct batch b = {.n = NS * PL, .token = bt, .seq = seq, .pos = pos};
    struct moe_stats p0 = engine_moe_stats(e);
    CHECK(engine_forward(e, kv, &b, logits, err, sizeof err) == 0, "%s: %s", label, err);
    struct moe_stats p1 = engine_moe_stats(e);
    /* the prompts alone ran down by experts, together by columns: the two schedules */
    CHECK(p1.down_by_expert == p0.down_by_expert, "%s: a batch of %d prompts ran down by experts", label, NS * PL);
    bool same = true;
    for (int i = 0; i < NS; i++)
        same &= same_bits(alone + (size_t)(2 * i) * V, logits + (size_t)((PL - 1) * NS + i) * V, (size_t)V);
    CHECK(same, "%s: prompt logits differ in a batch of 8 sequences", label);
    for (int i = 0; i < NS; i++)
        bt[i] = toks[i][PL], seq[i] = i, pos[i] = PL;
    struct moe_stats s0 = engine_moe_stats(e);
    b = (struct batch){.n = NS, .token = bt, .seq = seq, .pos = pos};
    CHECK(engine_forward(e, kv, &b, logits, err, sizeof err) == 0, "%s: %s", label, err);
    struct moe_stats s1 = engine_moe_stats(e);
    same = true;
    for (int i = 0; i < NS; i++)
        same &= same_bits(alone + (size_t)(2 * i + 1) * V, logits + (size_t)i * V, (size_t)V);
    CHECK(same, "%s: decode logits differ in a batch of 8 sequences", label);
    uint64_t runs = s1.expert_runs - s0.expert_runs, choices = s1.token_choices - s0.token_choices;
    CHECK(choices == (uint64_t)(NS * K * L) && runs <= (uint64_t)(L * m->hp.n_expert) && runs < choices,
          "%s: a batch of %d ran %llu experts for %llu choices (%d layers, %d experts)", label, NS,
          (unsigned long long)runs, (unsigned long long)choices, L, m->hp.n_expert);
    printf("%s: batch of %d: %llu expert runs for %llu choices; %llu of %llu steps shared activation groups\n", label,
           NS, (unsigned long long)runs, (unsigned long long)choices, (unsigned long long)s1.act_shared,
           (unsigned long long)s1.steps);
    /* qwen3moe-q4_k_m's experts (n_embd 256: 288 bytes of gate and up a column) have units
     * of gate and up smaller than h's Q8_K blocks, so each step runs the shared groups */
    CHECK(!strstr(label, "qwen3moe-q4_k_m") || s1.act_shared == s1.steps,
          "%s: %llu of %llu steps shared activation groups", label, (unsigned long long)s1.act_shared,
          (unsigned long long)s1.steps);
    free(alone);
    free(logits);
out:
    kv_release(kv);
    engine_release(e);
    model_release(m);
    unlink(path);
}

/* Rows of a layer's K whose pages are resident (mincore), for rows of row_bytes. */
static int64_t resident_rows(struct kv_cache *kv, int layer, size_t row_bytes)
{
    const struct kv_config *kc = kv_config(kv);
    size_t len = (size_t)kc->n_blocks * (size_t)kc->block_tokens * row_bytes, page = 4096;
    unsigned char *vec = calloc(len / page + 1, 1);
    int64_t n = 0;
    if (vec && mincore(kv_k(kv, layer, 0), len, vec) == 0)
        for (size_t i = 0; i < (len + page - 1) / page; i++)
            n += vec[i] & 1;
    free(vec);
    return n * (int64_t)(page / row_bytes);
}

/* gemma3 over 600 positions with a window of 5: prefill in one call, in chunks of 37 and
 * token by token give the same bits while the cache releases the window layers' rows of
 * the blocks left behind (blocks of 16 F32 rows of 64: one page each); a rollback within
 * the slack gives the same bits again, one behind the released rows is refused. */
static void check_window_release(void)
{
    enum { N = 600 };
    struct synth_spec s = {.arch = "gemma3", .n_layers = 6, .n_embd = 64, .n_ff = 160, .n_head = 2, .n_head_kv = 1,
                           .head_dim = 64, .n_ctx = 1024, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                           .swa_window = 5, .type = "f32", .seed = 9, .vocab_size = 300};
    char path[128], err[512];
    snprintf(path, sizeof path, "test_forward_window_%d.gguf", (int)getpid());
    CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 2, .max_batch = 64, .max_ctx = 1024};
    struct kv_config kc = {0};
    if (model_load(&m, path, NULL, err, sizeof err) || engine_create(&e, m, &ec, err, sizeof err) ||
        (kc = engine_kv_config(m, 1024, 3, 16), kc.type_k = kc.type_v = DT_F32, kv_create(&kv, &kc, err, sizeof err))) {
        CHECK(0, "setup: %s", err);
        goto out;
    }
    struct runner r = {.m = m, .e = e, .kv = kv, .n_vocab = m->hp.n_vocab};
    int V = r.n_vocab;
    int32_t toks[N];
    make_tokens(toks, N, V, 77);
    float *one = malloc((size_t)N * V * sizeof(float)), *other = malloc((size_t)N * V * sizeof(float));
    float *whole = malloc((size_t)64 * V * sizeof(float));
    /* one shot: batches of 64 */
    CHECK(feed(&r, 0, toks, 0, N, 64, one) == 0, "prefill failed");
    int64_t released = kv_released_blocks(kv);
    /* 600 positions are 38 blocks; all but those within 5 + 128 positions of the last batch's
     * first position (576) are released: 27 */
    CHECK(released == 27 && kv_seq_min_resume(kv, 0) > 400, "released %lld blocks, resume from %lld",
          (long long)released, (long long)kv_seq_min_resume(kv, 0));
    CHECK(feed(&r, 1, toks, 0, N, 37, other) == 0 && same_bits(one, other, (size_t)N * V),
          "chunks of 37 differ from batches of 64 with released window rows");
    CHECK(feed(&r, 2, toks, 0, N, 1, other) == 0 && same_bits(one, other, (size_t)N * V),
          "token by token differs from batches of 64 with released window rows");
    /* What stays resident of a window layer (what placement counts, proto/runner_proto.h):
     * each sequence at most its window, the slack, a block and a batch of rows */
    if (sysconf(_SC_PAGESIZE) == 4096) {
        int64_t rows = resident_rows(kv, 0, 256), bound = 3 * (5 + KV_WINDOW_SLACK + 16 + 64);
        CHECK(rows > 0 && rows <= bound && rows < 3 * N, "a window layer holds %lld rows resident (bound %lld)",
              (long long)rows, (long long)bound);
        CHECK(resident_rows(kv, 5, 256) >= 3 * N, "the global layer holds every row: %lld",
              (long long)resident_rows(kv, 5, 256));
    }
    /* a rollback of 16 positions (a rejected draft) */
    kv_truncate(kv, 0, N - 16);
    CHECK(feed(&r, 0, toks, N - 16, N, 16, other) == 0 && same_bits(one + (size_t)(N - 16) * V, other + (size_t)(N - 16) * V, (size_t)16 * V),
          "logits after a rollback of 16 differ");
    /* behind the released rows: refused with the reason */
    kv_truncate(kv, 1, 100);
    int32_t seq = 1;
    int64_t pos = 100;
    struct batch b = {.n = 1, .token = toks + 100, .seq = &seq, .pos = &pos};
    err[0] = 0;
    CHECK(engine_forward(e, kv, &b, whole, err, sizeof err) == CAIRN_ERANGE && strstr(err, "sliding-window"),
          "a resume behind released rows was not refused (%s)", err);
    /* room reserved for a long prompt chunk before its forward (as the scheduler does) releases
     * nothing its first rows need: the forward from the chunk's start runs */
    kv_seq_clear(kv, 2);
    CHECK(kv_prepare(kv, 2, 0, 400) == 0, "prepare of 400 positions");
    pos = 0;
    seq = 2;
    b = (struct batch){.n = 1, .token = toks, .seq = &seq, .pos = &pos};
    err[0] = 0;
    CHECK(engine_forward(e, kv, &b, whole, err, sizeof err) == 0, "a forward at the start of reserved room was refused (%s)",
          err);
    /* forks carry the bound; a cleared sequence starts afresh */
    kv_seq_clear(kv, 1);
    CHECK(kv_seq_min_resume(kv, 1) == 0, "cleared sequence keeps a bound");
    CHECK(kv_fork(kv, 0, 1) == 0 && kv_seq_min_resume(kv, 1) == kv_seq_min_resume(kv, 0), "fork lost the bound");
    kv_seq_clear(kv, 0);
    kv_seq_clear(kv, 1);
    kv_seq_clear(kv, 2);
    CHECK(kv_released_blocks(kv) == 0 || kv_free_blocks(kv) == kc.n_blocks, "blocks held after clearing");
    CHECK(feed(&r, 0, toks, 0, N, 64, other) == 0 && same_bits(one, other, (size_t)N * V),
          "reused blocks (released before) give different logits");
    free(one);
    free(other);
    free(whole);
out:
    kv_release(kv);
    engine_release(e);
    model_release(m);
    unlink(path);
}

/* A file with some of the q/k/v biases only (attn_q.bias alone): each bias is applied on its
 * own, and the forward equals the float64 reference, which adds the biases present. */
static void check_partial_bias(const struct synth_spec *spec)
{
    char path[128], biased[128], err[512];
    snprintf(path, sizeof path, "test_forward_pbias_src_%d.gguf", (int)getpid());
    snprintf(biased, sizeof biased, "test_forward_pbias_%d.gguf", (int)getpid());
    CHECK(synth_write(spec, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    int64_t q_dim = (int64_t)spec->n_head * spec->head_dim;
    float *bias = malloc((size_t)q_dim * sizeof *bias);
    for (int64_t i = 0; i < q_dim; i++)
        bias[i] = 0.5f * (float)((i * 7) % 5) - 1.0f;
    int rc = gguf_open(&f, path, err, sizeof err);
    if (!rc)
        rc = gguf_writer_create(&w);
    for (int64_t i = 0; !rc && i < gguf_n_kv(f); i++)
        rc = gguf_writer_copy_kv(w, f, i);
    for (int64_t i = 0; !rc && i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL);
    }
    int64_t ne[4] = {q_dim, 1, 1, 1};
    if (!rc)
        rc = gguf_writer_add_tensor(w, "blk.1.attn_q.bias", DT_F32, 1, ne, bias, NULL, NULL);
    if (!rc)
        rc = gguf_writer_write(w, biased, err, sizeof err);
    CHECK(rc == 0, "writing the file with attn_q.bias alone: %s", err);
    gguf_writer_release(w);
    gguf_close(f);
    struct runner r;
    if (!rc && runner_open(&r, biased, 2, 0, -1) == 0) {
        int32_t toks[N_TOK];
        make_tokens(toks, N_TOK, r.n_vocab, 3);
        size_t all = (size_t)N_TOK * r.n_vocab;
        float *got = malloc(all * sizeof *got);
        int rv;
        CHECK(r.m->layers[1].bq && !r.m->layers[1].bk && !r.m->layers[1].bv, "the q bias alone is loaded");
        CHECK(feed(&r, 0, toks, 0, N_TOK, N_TOK, got) == 0, "forward with attn_q.bias alone");
        double *ref = ref_forward(biased, toks, N_TOK, &rv);
        CHECK(ref && rel_err(got, ref, all) < 1e-4, "attn_q.bias alone: max error %.3g of RMS",
              ref ? rel_err(got, ref, all) : -1.0);
        free(ref);
        free(got);
        runner_close(&r);
    } else {
        CHECK(0, "cannot open the file with attn_q.bias alone");
    }
    free(bias);
    unlink(path);
    unlink(biased);
}

/* Jobs handed to the threads per forward of a dense model with L layers (engine_dispatches):
 * a decode step of one token runs its per-row steps (norms, quantizing, RoPE, residual
 * adds) on the calling thread and hands off only the products (q/k/v together, the
 * attention output, gate/up together with SiLU and the down product's quantizing, down)
 * and attention: 5 per layer and the output head. A batch of 4 tokens hands off its
 * per-row steps too, fused: the first norm, then per layer q/k/v, attention (RoPE and the
 * K and V writes inside its job, per KV head), quantizing, output, add-norm-quantize, gate/up-SiLU-quantize, down, add-norm-quantize;
 * then the final norm, its quantizing and the head. Counted so that the number cannot
 * grow back. */
static void check_dispatches(const struct synth_spec *spec)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "test_forward_dispatch_%d.gguf", (int)getpid());
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct model_load_opts o = {.layer_end = -1};
    struct engine_config ec = {.n_threads = 2, .max_batch = 4, .max_ctx = 64};
    if (synth_write(spec, NULL, path, err, sizeof err) || model_load(&m, path, &o, err, sizeof err) ||
        engine_create(&e, m, &ec, err, sizeof err)) {
        CHECK(0, "dispatch model: %s", err);
        goto out;
    }
    struct kv_config kc = engine_kv_config(m, 64, 1, 16);
    int32_t tok[5] = {1, 17, 200, 5, 9}, seq[4] = {0};
    int64_t pos[5] = {0, 1, 2, 3, 4};
    float *logits = malloc(4 * (size_t)m->hp.n_vocab * sizeof(float));
    unsigned long long L = (unsigned long long)spec->n_layers, d0 = engine_dispatches(e);
    struct batch prompt = {.n = 4, .token = tok, .seq = seq, .pos = pos};
    if (!logits || kv_create(&kv, &kc, err, sizeof err) || engine_forward(e, kv, &prompt, logits, err, sizeof err)) {
        CHECK(0, "dispatch prompt: %s", err);
        free(logits);
        goto out;
    }
    unsigned long long d1 = engine_dispatches(e);
    CHECK(d1 - d0 == 8 * L + 4, "a batch of 4 on %llu layers: %llu dispatches, want %llu", L, d1 - d0, 8 * L + 4);
    struct batch step = {.n = 1, .token = tok + 4, .seq = seq, .pos = pos + 4};
    if (engine_forward(e, kv, &step, logits, err, sizeof err))
        CHECK(0, "dispatch step: %s", err);
    unsigned long long d2 = engine_dispatches(e);
    CHECK(d2 - d1 == 5 * L + 1, "a decode step on %llu layers: %llu dispatches, want %llu", L, d2 - d1, 5 * L + 1);
    free(logits);
out:
    kv_release(kv);
    engine_release(e);
    model_release(m);
    unlink(path);
}

/* A prompt longer than a query tile and than the gate and up products' parts of rows
 * (engine.c GATE_UP_PART_ROWS), in one forward against forwards of 32 tokens: the same
 * bits (the causal cut of the diagonal tiles' Q.K, the parts' products and activations). */
#define LONG_TOK 300
#define LONG_CHUNK 32

static int feed_long(struct runner *r, const int32_t *toks, int chunk, float *logits)
{
    kv_seq_clear(r->kv, 0);
    return feed(r, 0, toks, 0, LONG_TOK, chunk, logits);
}

static void check_long_prompt(const struct synth_spec *spec)
{
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "test_forward_long_%d.gguf", (int)getpid());
    if (synth_write(spec, NULL, path, err, sizeof err)) {
        CHECK(0, "long: synth_write: %s", err);
        return;
    }
    struct runner r = {0};
    struct model_load_opts o = {.layer_end = -1, .path = KERN_PATH_AUTO};
    struct engine_config ec = {.n_threads = 2, .max_batch = LONG_TOK, .max_ctx = 512};
    int rc = model_load(&r.m, path, &o, err, sizeof err);
    if (!rc) {
        struct kv_config kc = engine_kv_config(r.m, 512, 1, 16);
        rc = engine_create(&r.e, r.m, &ec, err, sizeof err) || kv_create(&r.kv, &kc, err, sizeof err);
    }
    CHECK(!rc, "long: open: %s", err);
    if (!rc) {
        r.n_vocab = r.m->hp.n_vocab;
        size_t all = (size_t)LONG_TOK * (size_t)r.n_vocab;
        int32_t toks[LONG_TOK];
        make_tokens(toks, LONG_TOK, r.n_vocab, 33);
        float *whole = malloc(all * sizeof(float)), *chunks = malloc(all * sizeof(float));
        CHECK(whole && chunks && feed_long(&r, toks, LONG_TOK, whole) == 0 &&
                  feed_long(&r, toks, LONG_CHUNK, chunks) == 0 && same_bits(whole, chunks, all),
              "long: %d tokens at once differ from chunks of %d", LONG_TOK, LONG_CHUNK);
        free(whole);
        free(chunks);
    }
    kv_release(r.kv);
    engine_release(r.e);
    model_release(r.m);
    unlink(path);
}

int main(void)
{
    struct synth_spec base = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 160, .n_head = 4, .n_head_kv = 2,
                              .head_dim = 16, .n_ctx = 512, .rope_base = 10000, .norm_eps = 1e-5f,
                              .type = "f32", .seed = 5, .vocab_size = 300};
    /* Float weights: only float32 rounding separates the engine from float64. */
    kv_type = DT_F32;
    struct synth_spec s = base;
    check_model("llama-f32", &s, 1e-4);
    s = base;
    s.tied = 1, s.llama3_rope = 1, s.rope_base = 500000;
    snprintf(s.type, sizeof s.type, "f16");
    check_model("llama3-f16-tied", &s, 1e-4);
    s = base;
    snprintf(s.arch, sizeof s.arch, "qwen2");
    s.yarn_factor = 4.0f, s.rope_base = 1000.0f; /* YaRN (as Qwen2.5's long-context files) */
    check_model("qwen2-f32-yarn", &s, 1e-4);
    s = base;
    snprintf(s.arch, sizeof s.arch, "qwen3");
    s.head_dim = 32; /* q width 128 differs from n_embd 64, as in Qwen3 */
    snprintf(s.type, sizeof s.type, "bf16");
    check_model("qwen3-bf16", &s, 1e-4);
    /* The default F16 cache rounds K and V to 11 bits. */
    kv_type = DT_F16;
    check_model("qwen3-bf16-kv16", &s, 5e-3);
    /* Quantized caches (llama.cpp's -ctk/-ctv q8_0, q4_0): K and V rounded to 8 and 4
     * bits in blocks of 32; every invariance still holds bit for bit. */
    kv_type = DT_Q8_0;
    check_model("qwen3-bf16-kvq8_0", &s, 0.05);
    kv_type = DT_Q4_0;
    check_model("qwen3-bf16-kvq4_0", &s, 0.6);
    /* gemma3: a window of 5 positions on layers 0-4 (layer 5 global) crosses the blocks of 4
     * positions and the chunks of 1 and 5; phi3's fused matrices */
    kv_type = DT_F32;
    s = base;
    snprintf(s.arch, sizeof s.arch, "gemma3");
    s.n_layers = 6, s.n_head_kv = 1, s.tied = 1, s.swa_window = 5, s.rope_base = 1000000;
    check_model("gemma3-f32-swa5", &s, 1e-4);
    s.linear_factor = 8.0f, s.swa_window = 7; /* gemma3-4b's scaling of the global layers */
    snprintf(s.type, sizeof s.type, "f16");
    check_model("gemma3-f16-swa7-linear", &s, 1e-4);
    s = base;
    snprintf(s.arch, sizeof s.arch, "phi3");
    s.n_head_kv = 4, s.swa_window = 3; /* a window phi3's files declare and llama.cpp ignores */
    check_model("phi3-f32", &s, 1e-4);
    check_window_release();
    check_partial_bias(&base);
    kv_type = DT_F16;
    /* 8-bit activations against quantized weights: the reference uses the same weights
     * but exact activations, so the tolerance is that of 8-bit activation rounding. */
    s = base;
    snprintf(s.arch, sizeof s.arch, "qwen2");
    s.n_head_kv = 1;
    snprintf(s.type, sizeof s.type, "q8_0");
    check_model("qwen2-q8_0", &s, 0.05);
    s = base;
    snprintf(s.type, sizeof s.type, "q4_0");
    check_model("llama-q4_0", &s, 0.05);
    s = base;
    s.n_embd = 256, s.n_ff = 512, s.n_head = 4, s.head_dim = 64, s.n_layers = 3;
    snprintf(s.type, sizeof s.type, "q4_k_m"); /* Q4_K and Q6_K */
    check_model("llama-q4_k_m", &s, 0.1); /* 8-bit activations in blocks of 256 */
    s = base;
    s.n_embd = 128, s.n_ff = 256, s.head_dim = 32;
    snprintf(s.type, sizeof s.type, "q8_0");
    check_long_prompt(&s);
    /* Mixtures of experts: qwen3moe (experts of n_ff_exp, q/k norms) and llama's (Mixtral:
     * experts of n_ff). */
    struct synth_spec moe = base;
    snprintf(moe.arch, sizeof moe.arch, "qwen3moe");
    moe.n_expert = 8, moe.n_expert_used = 2, moe.n_ff_exp = 48;
    kv_type = DT_F32;
    check_model("qwen3moe-f32", &moe, 1e-4);
    moe.n_ff_exp = 40; /* not a whole number of the fused gate and up's turns of rows */
    check_model("qwen3moe-f32-ff40", &moe, 1e-4);
    check_moe_batch("qwen3moe-f32-ff40", &moe);
    moe.n_ff_exp = 48;
    struct synth_spec mix = base;
    mix.n_expert = 4, mix.n_expert_used = 2, mix.n_ff_exp = mix.n_ff;
    snprintf(mix.type, sizeof mix.type, "f16");
    check_model("mixtral-f16", &mix, 1e-4);
    kv_type = DT_F16;
    struct synth_spec moeq = moe;
    moeq.n_embd = 256, moeq.n_ff_exp = 256, moeq.head_dim = 64;
    snprintf(moeq.type, sizeof moeq.type, "q4_k_m");
    check_model("qwen3moe-q4_k_m", &moeq, 0.1);
    check_moe_batch("qwen3moe-q4_k_m", &moeq);
    check_moe_batch("mixtral-f16", &mix);
    /* gpt-oss: sinks, biases, the router's softmax over its top k, the clamped SwiGLU (its
     * synthetic expert biases make the clamps act), layers 0 and 2 sliding over 5 positions,
     * YaRN on all; F32, F16, and MXFP4 experts beside Q8_0 matrices (llama.cpp's MXFP4_MOE) */
    struct synth_spec oss = base;
    snprintf(oss.arch, sizeof oss.arch, "gpt-oss");
    oss.n_layers = 4, oss.n_expert = 8, oss.n_expert_used = 4, oss.n_ff_exp = 64, oss.swa_window = 5;
    oss.yarn_factor = 32.0f, oss.rope_base = 150000;
    kv_type = DT_F32;
    check_model("gpt-oss-f32", &oss, 1e-4);
    snprintf(oss.type, sizeof oss.type, "f16");
    check_model("gpt-oss-f16", &oss, 1e-4);
    check_moe_batch("gpt-oss-f16", &oss);
    kv_type = DT_F16;
    snprintf(oss.type, sizeof oss.type, "mxfp4");
    check_model("gpt-oss-mxfp4", &oss, 0.1);
    char path[128], err[512];
    snprintf(path, sizeof path, "test_forward_threads_%d.gguf", (int)getpid());
    s.n_layers = 5;
    CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);
    check_threads_same(path);
    unlink(path);
    s = base;
    snprintf(s.type, sizeof s.type, "q8_0");
    check_dispatches(&s);
    return test_main_end();
}
