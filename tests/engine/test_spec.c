/* Speculative decoding in the continuous-batching scheduler, on synthetic models: greedy
 * tokens with a draft (its first layers, another seed, another quantization, the target
 * itself) equal those without, alone and in a batch of eight mixing drafting and plain
 * sequences, preempted, stopped by a callback, with the draft set, switched and dropped
 * mid-generation; a draft equal to the target has every token accepted; sampled tokens
 * follow the target's exact distribution (chi-square over many seeds, with a draft model
 * and with prompt lookup); rolled-back KV serves a later prefix reuse; prompt lookup on a
 * repeating script; adaptive k and the batch-size cut-off; sample_dist against
 * sample_token; bad settings refused. */
#include "base/clock.h"
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "model/model.h"
#include "model/synth.h"
#include "async_fwd.h"
#include "tok/grammar.h"
#include "tok/tok.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BATCH 64
#define CTX 160
#define BT 16
#define MAX_IDS 32
#define MAX_SEQ 128
#define MAX_GEN 48
#define N_REQ 8
#define K 4

/* ---- models ---- */

enum { M_TARGET, M_LAYERS, M_SEED, M_QUANT, M_SCRIPT, M_SMALL, M_SMALL_DRAFT, N_MODELS };
static const char *const model_names[N_MODELS] = {"target", "draft of 2 layers", "other seed", "q4_0 copy", "script",
                                                  "small", "small draft"};

struct fixture {
    char dir[64], path[N_MODELS][96];
    struct model *m[N_MODELS];
    struct engine *e[N_MODELS];
    struct tok *tok;
    int32_t script[24]; /* the script model's repeating text */
    int n_script;
};

static int write_models(struct fixture *fx, char *err, size_t errlen)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    struct synth_spec t;
    memset(&t, 0, sizeof t);
    synth_shape("tiny", &t);
    snprintf(t.type, sizeof t.type, "q8_0");
    t.seed = 7;
    t.scale_from = 2;
    t.out_scale = 0.3f; /* the draft of its first 2 layers agrees often, not always */
    struct synth_spec other = t;
    other.seed = 99;
    other.n_layers = 2;
    other.scale_from = 0;
    other.out_scale = 0;
    struct synth_spec quant = t;
    snprintf(quant.type, sizeof quant.type, "q4_0");
    int rc;
    if ((rc = synth_write(&t, vocab, fx->path[M_TARGET], err, errlen)) ||
        (rc = synth_write_draft(fx->path[M_TARGET], 2, fx->path[M_LAYERS], err, errlen)) ||
        (rc = synth_write(&other, vocab, fx->path[M_SEED], err, errlen)) ||
        (rc = synth_write(&quant, vocab, fx->path[M_QUANT], err, errlen)))
        return rc;
    /* A script repeating a 6-token pattern: its greedy continuation repeats it forever. */
    int32_t *next = malloc(32000 * sizeof *next);
    if (!next)
        return CAIRN_ENOMEM;
    const int32_t pattern[6] = {450, 1701, 3014, 9200, 777, 2048};
    fx->n_script = 24;
    for (int i = 0; i < fx->n_script; i++)
        fx->script[i] = pattern[i % 6];
    struct synth_spec sc = t;
    sc.scale_from = 0;
    sc.out_scale = 0;
    sc.n_layers = 2;
    if (!(rc = synth_script_next(fx->script, fx->n_script, next, 32000, err, errlen)))
        rc = synth_write_script(&sc, vocab, next, 32000, fx->path[M_SCRIPT], err, errlen);
    free(next);
    if (rc)
        return rc;
    /* A small vocabulary for the sampling statistics. */
    struct synth_spec sm = {.arch = "llama", .n_layers = 4, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 4,
                            .head_dim = 16, .n_ctx = 256, .rope_base = 10000, .norm_eps = 1e-5f, .tied = 1,
                            .type = "f32", .seed = 11, .vocab_size = 32, .scale_from = 2, .out_scale = 1.5f};
    if ((rc = synth_write(&sm, NULL, fx->path[M_SMALL], err, errlen)) ||
        (rc = synth_write_draft(fx->path[M_SMALL], 2, fx->path[M_SMALL_DRAFT], err, errlen)))
        return rc;
    return 0;
}

static int fixture_open(struct fixture *fx)
{
    char err[512];
    memset(fx, 0, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/cairn-test-spec-XXXXXX");
    if (!mkdtemp(fx->dir)) {
        perror("mkdtemp");
        return -1;
    }
    for (int i = 0; i < N_MODELS; i++)
        snprintf(fx->path[i], sizeof fx->path[i], "%s/m%d.gguf", fx->dir, i);
    if (write_models(fx, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    for (int i = 0; i < N_MODELS; i++) {
        bool small = i == M_SMALL || i == M_SMALL_DRAFT;
        struct engine_config ec = {.n_threads = 1, .max_batch = small ? 512 : MAX_BATCH, .max_ctx = CTX};
        /* The target and its 2-layer draft run on 2 threads of one pool, as in a runner
         * (engine_config.pool): every test with that draft checks the target's tokens. */
        if (i == M_TARGET || i == M_LAYERS)
            ec.n_threads = 2;
        if (i == M_LAYERS)
            ec.pool = engine_pool(fx->e[M_TARGET]);
        if (model_load(&fx->m[i], fx->path[i], NULL, err, sizeof err) ||
            engine_create(&fx->e[i], fx->m[i], &ec, err, sizeof err)) {
            fprintf(stderr, "fixture: %s: %s\n", model_names[i], err);
            return -1;
        }
    }
    if (engine_pool(fx->e[M_LAYERS]) != engine_pool(fx->e[M_TARGET])) {
        fprintf(stderr, "fixture: the draft of 2 layers does not run on the target's pool\n");
        return -1;
    }
    if (tok_load(&fx->tok, fx->m[M_TARGET]->file, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    return 0;
}

static void fixture_close(struct fixture *fx)
{
    for (int i = N_MODELS - 1; i >= 0; i--) { /* the draft of 2 layers before the target whose pool it uses */
        engine_release(fx->e[i]);
        model_release(fx->m[i]);
        unlink(fx->path[i]);
    }
    tok_release(fx->tok);
    rmdir(fx->dir);
}

/* ---- what the callbacks saw ---- */

struct rec {
    int n;
    int32_t tok[MAX_GEN];
    float prob[MAX_GEN], logprob[MAX_GEN];
    int n_done;
    enum sched_finish why;
    struct sched_usage usage;
};

struct collector {
    struct rec rec[MAX_IDS][MAX_SEQ];
    int stop_at[MAX_IDS]; /* the token callback returns 1 at this many tokens (0: never) */
    int misuse;
};

static int on_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    struct collector *c = ctx;
    if (id >= MAX_IDS || seq < 0 || seq >= MAX_SEQ) {
        c->misuse++;
        return 1;
    }
    struct rec *r = &c->rec[id][seq];
    if (r->n_done || index != r->n || r->n >= MAX_GEN) {
        c->misuse++;
        return 1;
    }
    r->tok[r->n] = t->token;
    r->prob[r->n] = t->prob;
    r->logprob[r->n] = t->logprob;
    r->n++;
    return c->stop_at[id] && r->n >= c->stop_at[id];
}

static void on_done(void *ctx, uint64_t id, int seq, enum sched_finish why, const struct sched_usage *u,
                    const char *error)
{
    struct collector *c = ctx;
    if (id >= MAX_IDS || seq < 0 || seq >= MAX_SEQ) {
        c->misuse++;
        return;
    }
    struct rec *r = &c->rec[id][seq];
    r->n_done++;
    r->why = why;
    r->usage = *u;
    if (error)
        fprintf(stderr, "request %llu/%d: %s\n", (unsigned long long)id, seq, error);
    if (why == SCHED_FINISH_ERROR || u->generated_tokens != r->n || u->accepted_draft_tokens > u->draft_tokens)
        c->misuse++;
}

static struct collector *collector_new(void) { return calloc(1, sizeof(struct collector)); }

/* ---- a scheduler with its caches ---- */

struct rig {
    struct sched *s;
    struct kv_cache *kv;
    struct kv_cache *dkv[4]; /* draft caches set so far (released at the end) */
    int n_dkv;
    int slots;
    int64_t ctx;
};

static int rig_open(struct rig *g, const struct fixture *fx, int target, struct sched_config cfg, int64_t n_blocks,
                    struct collector *c)
{
    char err[512];
    memset(g, 0, sizeof *g);
    if (!cfg.ctx)
        cfg.ctx = CTX;
    if (!cfg.tok && target != M_SMALL)
        cfg.tok = fx->tok;
    struct kv_config kc = engine_kv_config(fx->m[target], cfg.ctx, sched_kv_seqs(&cfg), BT);
    if (n_blocks)
        kc.n_blocks = n_blocks;
    struct sched_callbacks cb = {.token = on_token, .done = on_done, .ctx = c};
    g->slots = cfg.slots;
    g->ctx = cfg.ctx;
    if (kv_create(&g->kv, &kc, err, sizeof err) ||
        sched_create(&g->s, fx->e[target], g->kv, &cfg, &cb, err, sizeof err)) {
        CHECK(0, "rig: %s", err);
        kv_release(g->kv);
        g->kv = NULL;
        return -1;
    }
    return 0;
}

/* Sets model `draft` (-1: drops the draft) with a cache of its own. */
static void rig_draft(struct rig *g, const struct fixture *fx, int draft, int k)
{
    char err[512];
    if (draft < 0) {
        CHECK(sched_set_draft(g->s, NULL, NULL, 0, err, sizeof err) == 0, "drop draft: %s", err);
        return;
    }
    if (g->n_dkv == 4) {
        CHECK(0, "rig: too many drafts");
        return;
    }
    struct kv_config kc = engine_kv_config(fx->m[draft], g->ctx, g->slots, BT);
    struct kv_cache *kv;
    if (kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "draft kv: %s", err);
        return;
    }
    g->dkv[g->n_dkv++] = kv;
    CHECK(sched_set_draft(g->s, fx->e[draft], kv, k, err, sizeof err) == 0, "set draft %s: %s", model_names[draft], err);
}

static void rig_close(struct rig *g)
{
    sched_release(g->s);
    kv_release(g->kv);
    for (int i = 0; i < g->n_dkv; i++) {
        CHECK(kv_free_blocks(g->dkv[i]) == kv_config(g->dkv[i])->n_blocks, "a draft cache still holds blocks");
        kv_release(g->dkv[i]);
    }
}

static bool run_idle(struct rig *g)
{
    char err[512];
    for (int i = 0; i < 5000 && !sched_idle(g->s); i++)
        if (sched_step(g->s, err, sizeof err) < 0) {
            CHECK(0, "sched_step: %s", err);
            return false;
        }
    CHECK(sched_idle(g->s), "scheduler not idle after 5000 steps");
    return sched_idle(g->s);
}

static void step(struct rig *g)
{
    char err[512];
    CHECK(sched_step(g->s, err, sizeof err) >= 0, "sched_step: %s", err);
}

/* ---- requests ---- */

struct spec {
    int32_t prompt[CTX];
    int n_prompt, max_tokens, n_seqs, num_draft, lookup;
    bool logprobs;
    struct sample_params sp;
    struct grammar_ctx *grammar;
};

static void random_prompt(struct spec *q, int n, int n_vocab, uint64_t seed)
{
    q->n_prompt = n;
    for (int i = 0; i < n; i++)
        q->prompt[i] = (int32_t)(3 + test_rand_u64(&seed) % (uint64_t)(n_vocab - 3)); /* no unk/bos/eos */
}

static struct sample_params greedy(void)
{
    struct sample_params p = sample_defaults();
    p.temperature = 0;
    return p;
}

static int submit(struct rig *g, const struct spec *q, uint64_t id)
{
    char err[512];
    struct sched_request r = {.id = id, .prompt = q->prompt, .n_prompt = q->n_prompt, .max_tokens = q->max_tokens,
                              .n_seqs = q->n_seqs ? q->n_seqs : 1, .sample = q->sp, .logprobs = q->logprobs,
                              .num_draft_tokens = q->num_draft, .lookup_ngram = q->lookup,
                              .grammar = q->grammar};
    int rc = sched_submit(g->s, &r, err, sizeof err);
    CHECK(rc == 0, "submit %llu: %s", (unsigned long long)id, err);
    return rc;
}

static bool same_rec(const struct rec *a, const struct rec *b)
{
    return a->n == b->n && memcmp(a->tok, b->tok, (size_t)a->n * sizeof a->tok[0]) == 0 && a->why == b->why &&
           a->n_done == 1 && b->n_done == 1;
}

static void print_rec(const char *label, const struct rec *r)
{
    fprintf(stderr, "  %s (%s, %d):", label, sched_finish_name(r->why), r->n);
    for (int i = 0; i < r->n; i++)
        fprintf(stderr, " %d", r->tok[i]);
    fputc('\n', stderr);
}

static void check_same(const char *what, int id, const struct rec *got, const struct rec *want)
{
    bool same = same_rec(got, want);
    CHECK(same, "%s: request %d differs", what, id);
    if (!same) {
        print_rec("got", got);
        print_rec("want", want);
    }
}

/* Eight greedy requests of various lengths; drafting per request: the default, off, 2
 * tokens, the default... (so that a batch mixes drafting and plain sequences). */
static void make_eight(const struct fixture *fx, struct spec *reqs)
{
    static const int lens[N_REQ] = {5, 12, 31, 7, 20, 3, 45, 16};
    static const int gens[N_REQ] = {24, 10, 16, 12, 30, 9, 6, 20};
    static const int drafts[N_REQ] = {-1, 0, 2, -1, 7, -1, 0, 1};
    for (int i = 0; i < N_REQ; i++) {
        memset(&reqs[i], 0, sizeof reqs[i]);
        random_prompt(&reqs[i], lens[i], fx->m[M_TARGET]->hp.n_vocab, 1000 + (uint64_t)i);
        reqs[i].max_tokens = gens[i];
        reqs[i].sp = greedy();
        reqs[i].num_draft = drafts[i];
    }
    reqs[3].logprobs = true;
}

/* All of reqs in one scheduler (slots for all), with model `draft` (-1: none). */
static void run_batch(const struct fixture *fx, int target, int draft, const struct spec *reqs, int n,
                      struct collector *out, struct sched_stats *st)
{
    struct rig g;
    struct sched_config cfg = {.slots = n};
    if (rig_open(&g, fx, target, cfg, 0, out))
        return;
    if (draft >= 0)
        rig_draft(&g, fx, draft, K);
    for (int i = 0; i < n; i++)
        submit(&g, &reqs[i], (uint64_t)i);
    run_idle(&g);
    if (st)
        sched_get_stats(g.s, st);
    rig_close(&g);
}

/* The eight requests of make_eight without a draft (num_draft_tokens then does nothing):
 * the reference of the greedy tests, computed once. */
static struct collector *eight_ref;

/* ---- 1: sample_dist is what sample_token draws from ---- */

static void test_sample_dist(void)
{
    enum { NV = 5000, DRAWS = 4000 };
    struct sampler *smp;
    CHECK(sample_create(&smp, NV) == 0, "sample_create");
    float *logits = malloc(NV * sizeof *logits), *probs = malloc(NV * sizeof *probs);
    int32_t *ids = malloc(NV * sizeof *ids), *where = malloc(NV * sizeof *where);
    int *count = calloc(NV, sizeof *count);
    int32_t hist[16];
    uint64_t seed = 42;
    for (int i = 0; i < 16; i++)
        hist[i] = (int32_t)(test_rand_u64(&seed) % 40);
    struct logit_bias lb[2] = {{3, 2.0f}, {17, -1.5f}};
    for (int cfg = 0; cfg < 6; cfg++) {
        struct sample_params p = sample_defaults();
        p.seed = 77 + (uint64_t)cfg;
        switch (cfg) {
        case 0: break; /* defaults: top-k 40, top-p 0.95, min-p 0.05 */
        case 1: p.top_k = 0; p.min_p = 0; p.top_p = 0.9f; p.temperature = 1.3f; break; /* histogram path */
        case 2: p.top_k = 8; p.top_p = 1; p.min_p = 0; p.repeat_penalty = 1.4f; p.penalty_last_n = -1;
                p.bias = lb; p.n_bias = 2; break;
        case 3: p.top_k = 0; p.top_p = 1; p.min_p = 0.02f; p.temperature = 0.7f; p.frequency_penalty = 0.5f; break;
        case 4: p.top_k = 3; p.top_p = 1; p.min_p = 0; break;
        case 5: p.temperature = 0; p.bias = lb; p.n_bias = 1; break;
        }
        for (int i = 0; i < NV; i++)
            logits[i] = 3.0f * test_rand_float(&seed) + (i < 40 ? 4.0f * test_rand_float(&seed) + 2.0f : 0.0f);
        int n = sample_dist(smp, &p, logits, hist, 16, ids, probs);
        CHECK(n >= 1 && n <= NV, "config %d: %d tokens kept", cfg, n);
        if (n < 1)
            continue;
        double total = 0;
        for (int i = 0; i < NV; i++)
            where[i] = -1;
        for (int i = 0; i < n; i++) {
            total += probs[i];
            CHECK(where[ids[i]] < 0 && probs[i] > 0, "config %d: token %d twice or with probability %g", cfg, ids[i],
                  probs[i]);
            where[ids[i]] = i;
        }
        CHECK(fabs(total - 1) < 1e-5, "config %d: probabilities sum to %.9f", cfg, total);
        memset(count, 0, NV * sizeof *count);
        int outside = 0, prob_off = 0;
        for (int d = 0; d < DRAWS; d++) {
            float pr;
            int32_t t = sample_token(smp, &p, logits, hist, 16, d, &pr);
            if (t < 0 || where[t] < 0) {
                outside++;
                continue;
            }
            count[where[t]]++;
            prob_off += fabsf(pr - probs[where[t]]) > 1e-6f * (1 + probs[where[t]]);
        }
        CHECK(outside == 0 && prob_off == 0, "config %d: %d draws outside sample_dist's tokens, %d with another "
              "probability", cfg, outside, prob_off);
        /* Chi-square of the draws against the distribution (cells of expected >= 5). */
        double chi = 0, rest_e = 0, rest_o = 0;
        int cells = 0;
        for (int i = 0; i < n; i++) {
            double e = probs[i] * DRAWS;
            if (e >= 5) {
                chi += (count[i] - e) * (count[i] - e) / e;
                cells++;
            } else {
                rest_e += e;
                rest_o += count[i];
            }
        }
        if (rest_e >= 5) {
            chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
            cells++;
        }
        double df = cells > 1 ? cells - 1 : 1, z = 3.09; /* significance 0.001 */
        double crit = df * pow(1 - 2 / (9 * df) + z * sqrt(2 / (9 * df)), 3);
        CHECK(cells <= 1 || chi < crit, "config %d: chi-square %.1f over %d cells, critical %.1f", cfg, chi, cells, crit);
        if (cfg == 5)
            CHECK(n == 1 && probs[0] == 1.0f, "greedy: %d tokens", n);
    }
    /* sample_pick */
    float w[3] = {0.2f, 0.3f, 0.5f};
    CHECK(sample_pick(w, 3, 0.0) == 0 && sample_pick(w, 3, 0.25) == 1 && sample_pick(w, 3, 0.51) == 2 &&
          sample_pick(w, 3, 0.999999) == 2, "sample_pick walks cumulative weights");
    CHECK(sample_pick(w, 0, 0.5) == CAIRN_EINVAL, "sample_pick of nothing");
    struct sample_params bad = sample_defaults();
    bad.top_p = 0;
    CHECK(sample_dist(smp, &bad, logits, hist, 16, ids, probs) == CAIRN_EINVAL, "sample_dist with top_p 0");
    free(logits);
    free(probs);
    free(ids);
    free(where);
    free(count);
    sample_release(smp);
}

/* ---- 2: greedy with drafts == without ---- */

static void test_greedy_pairs(const struct fixture *fx)
{
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    struct collector *ref = eight_ref;
    int64_t generated = 0;
    for (int i = 0; i < N_REQ; i++)
        generated += ref->rec[i][0].n;
    CHECK(generated > 80, "only %lld tokens generated", (long long)generated);
    const int drafts[] = {M_LAYERS, M_SEED, M_QUANT, M_TARGET};
    for (size_t d = 0; d < sizeof drafts / sizeof drafts[0]; d++) {
        const char *name = model_names[drafts[d]];
        struct collector *c = collector_new();
        struct sched_stats st;
        run_batch(fx, M_TARGET, drafts[d], reqs, N_REQ, c, &st);
        int64_t drafted = 0, accepted = 0;
        for (int i = 0; i < N_REQ; i++) {
            const struct rec *r = &c->rec[i][0];
            check_same(name, i, r, &ref->rec[i][0]);
            drafted += r->usage.draft_tokens;
            accepted += r->usage.accepted_draft_tokens;
            if (reqs[i].num_draft == 0)
                CHECK(r->usage.draft_tokens == 0, "%s: request %d drafted with num_draft_tokens 0", name, i);
            else
                CHECK(r->usage.draft_tokens > 0, "%s: request %d never drafted", name, i);
            for (int t = 0; t < r->n && i == 3; t++)
                CHECK(r->logprob[t] == ref->rec[i][0].logprob[t] && r->prob[t] == 1.0f,
                      "%s: token %d: logprob %.9g vs %.9g", name, t, r->logprob[t], ref->rec[i][0].logprob[t]);
        }
        CHECK((st.draft_rejections > 0) == (accepted < drafted) && st.draft_rejections <= drafted - accepted,
              "%s: %lld rejections, %lld of %lld accepted", name, (long long)st.draft_rejections, (long long)accepted,
              (long long)drafted);
        CHECK(st.draft_tokens == drafted && st.accepted_draft_tokens == accepted,
              "%s: totals %lld/%lld, per sequence %lld/%lld", name, (long long)st.draft_tokens,
              (long long)st.accepted_draft_tokens, (long long)drafted, (long long)accepted);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        CHECK(st.draft_failures == 0, "%s: %lld draft failures", name, (long long)st.draft_failures);
        if (drafts[d] == M_TARGET)
            CHECK(accepted == drafted, "draft = target: %lld of %lld accepted", (long long)accepted, (long long)drafted);
        else
            CHECK(accepted < drafted, "%s: all %lld drafts accepted", name, (long long)drafted);
        if (drafts[d] == M_LAYERS || drafts[d] == M_QUANT)
            CHECK(accepted * 4 > drafted, "%s: only %lld of %lld accepted", name, (long long)accepted,
                  (long long)drafted);
        if (drafts[d] == M_TARGET)
            CHECK(st.steps <= 16, "draft = target: %lld steps", (long long)st.steps);
        printf("greedy, %-17s: %3lld of %3lld drafts accepted, %lld steps, %lld draft forwards\n", name,
               (long long)accepted, (long long)drafted, (long long)st.steps, (long long)st.draft_forwards);
        CHECK_EQ_INT(c->misuse, 0);
        free(c);
    }

    /* Alone (each request on its own scheduler) with the draft of 2 layers. */
    struct collector *alone = collector_new();
    for (int i = 0; i < N_REQ; i += 2) {
        struct rig g;
        if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = 1}, 0, alone))
            break;
        rig_draft(&g, fx, M_LAYERS, K);
        submit(&g, &reqs[i], (uint64_t)i);
        run_idle(&g);
        rig_close(&g);
        check_same("alone with a draft", i, &alone->rec[i][0], &ref->rec[i][0]);
    }
    CHECK_EQ_INT(alone->misuse + ref->misuse, 0);
    free(alone);

    /* A callback stopping mid-way through a step's accepted tokens, the draft = target
     * (every step reports K + 1 tokens): the sequence ends there, the rest dropped. */
    struct collector *stop = collector_new();
    struct rig g;
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = 2, .cache_seqs = 1}, 0, stop) == 0) {
        rig_draft(&g, fx, M_TARGET, K);
        stop->stop_at[0] = 3;
        submit(&g, &reqs[0], 0);
        run_idle(&g);
        const struct rec *r = &stop->rec[0][0];
        CHECK(r->n == 3 && r->why == SCHED_FINISH_STOPPED && memcmp(r->tok, ref->rec[0][0].tok, 3 * sizeof(int32_t)) == 0,
              "stopped at 3: %d tokens, %s", r->n, sched_finish_name(r->why));
        /* the cached prefix (prompt + 3 tokens, the rejected tail dropped) serves request 4 */
        struct spec again = reqs[0];
        memcpy(again.prompt + again.n_prompt, r->tok, 3 * sizeof(int32_t));
        again.n_prompt += 3;
        again.max_tokens = reqs[0].max_tokens - 3;
        submit(&g, &again, 4);
        run_idle(&g);
        const struct rec *a = &stop->rec[4][0];
        CHECK(a->usage.cached_tokens == again.n_prompt - 1, "reused %lld of %d", (long long)a->usage.cached_tokens,
              again.n_prompt);
        CHECK(a->n == ref->rec[0][0].n - 3 &&
                  memcmp(a->tok, ref->rec[0][0].tok + 3, (size_t)(a->n > 0 ? a->n : 0) * sizeof(int32_t)) == 0,
              "after reuse: %d tokens, expected %d", a->n, ref->rec[0][0].n - 3);
        rig_close(&g);
    }
    CHECK_EQ_INT(stop->misuse, 0);
    free(stop);

    /* The context ends generation inside a step's drafts: 20 + 4 = ctx 24, and a request
     * of one token (nothing to draft). */
    struct collector *full = collector_new(), *limited = collector_new();
    struct spec q = {0};
    random_prompt(&q, 20, fx->m[M_TARGET]->hp.n_vocab, 4040);
    q.max_tokens = 8;
    q.sp = greedy();
    q.num_draft = -1;
    run_batch(fx, M_TARGET, -1, &q, 1, full, NULL);
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = 2, .ctx = 24}, 0, limited) == 0) {
        rig_draft(&g, fx, M_TARGET, K);
        submit(&g, &q, 0);
        struct spec one = q;
        one.max_tokens = 1;
        submit(&g, &one, 1);
        run_idle(&g);
        const struct rec *r = &limited->rec[0][0];
        CHECK(r->why == SCHED_FINISH_LENGTH && r->n == 4 && memcmp(r->tok, full->rec[0][0].tok, 4 * sizeof(int32_t)) == 0,
              "ctx 24 with drafts: %s after %d tokens", sched_finish_name(r->why), r->n);
        r = &limited->rec[1][0];
        CHECK(r->n == 1 && r->tok[0] == full->rec[0][0].tok[0] && r->usage.draft_tokens == 0,
              "max_tokens 1: %d tokens, %lld drafted", r->n, (long long)r->usage.draft_tokens);
        rig_close(&g);
    }
    CHECK_EQ_INT(full->misuse + limited->misuse, 0);
    free(full);
    free(limited);
}

/* ---- 3: preemption with drafts ---- */

static void test_preemption(const struct fixture *fx)
{
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    for (int i = 0; i < N_REQ; i++)
        reqs[i].num_draft = -1;
    struct collector *ref = eight_ref, *c = collector_new();
    struct rig g;
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = N_REQ}, 7, c) == 0) {
        rig_draft(&g, fx, M_LAYERS, K);
        for (int i = 0; i < N_REQ; i++)
            submit(&g, &reqs[i], (uint64_t)i);
        run_idle(&g);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.preemptions > 0, "no preemption in 7 blocks");
        CHECK(st.draft_tokens > 0 && st.accepted_draft_tokens > 0, "drafted %lld, accepted %lld",
              (long long)st.draft_tokens, (long long)st.accepted_draft_tokens);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        printf("preemption with drafts: %lld preemptions, %lld of %lld accepted\n", (long long)st.preemptions,
               (long long)st.accepted_draft_tokens, (long long)st.draft_tokens);
        rig_close(&g);
    }
    for (int i = 0; i < N_REQ; i++)
        check_same("preempted with drafts", i, &c->rec[i][0], &ref->rec[i][0]);
    CHECK_EQ_INT(c->misuse, 0);
    free(c);
}

/* ---- 4: set, switch and drop the draft mid-generation ---- */

static void test_switch(const struct fixture *fx)
{
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    for (int i = 0; i < N_REQ; i++)
        reqs[i].num_draft = i == 1 ? 0 : -1;
    struct collector *ref = eight_ref, *c = collector_new();
    struct rig g;
    /* chunk_tokens 8: the draft catches up over several steps. */
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = N_REQ, .chunk_tokens = 8}, 0, c) == 0) {
        for (int i = 0; i < N_REQ; i++)
            submit(&g, &reqs[i], (uint64_t)i);
        const int plan[] = {M_LAYERS, M_QUANT, -1, M_TARGET, M_SEED};
        for (int phase = 0; phase < 5 && !sched_idle(g.s); phase++) {
            for (int k = 0; k < 3; k++)
                step(&g);
            rig_draft(&g, fx, plan[phase], 3);
        }
        run_idle(&g);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.draft_tokens > 0 && st.draft_prefill_tokens > 0, "drafted %lld, caught up %lld",
              (long long)st.draft_tokens, (long long)st.draft_prefill_tokens);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        rig_close(&g);
    }
    for (int i = 0; i < N_REQ; i++)
        check_same("draft switched mid-generation", i, &c->rec[i][0], &ref->rec[i][0]);
    CHECK_EQ_INT(c->misuse, 0);
    free(c);
}

/* ---- 5: rolled-back KV reused as a cached prefix ---- */

static void test_rollback_reuse(const struct fixture *fx)
{
    struct spec a = {0};
    random_prompt(&a, 20, fx->m[M_TARGET]->hp.n_vocab, 5150);
    a.max_tokens = 16;
    a.sp = greedy();
    a.num_draft = -1;
    struct collector *ref = collector_new(), *ref_b = collector_new(), *c = collector_new();
    run_batch(fx, M_TARGET, -1, &a, 1, ref, NULL);
    const struct rec *ra = &ref->rec[0][0];
    /* B continues A's prompt and output with a tail. */
    struct spec b = a;
    memcpy(b.prompt + 20, ra->tok, (size_t)ra->n * sizeof(int32_t));
    uint64_t seed = 3;
    for (int i = 0; i < 5; i++)
        b.prompt[20 + ra->n + i] = (int32_t)(3 + test_rand_u64(&seed) % 1000);
    b.n_prompt = 20 + ra->n + 5;
    b.max_tokens = 12;
    run_batch(fx, M_TARGET, -1, &b, 1, ref_b, NULL);
    struct rig g;
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = 1, .cache_seqs = 2}, 0, c) == 0) {
        rig_draft(&g, fx, M_SEED, K); /* many rejections */
        submit(&g, &a, 0);
        run_idle(&g);
        check_same("A with many rejections", 0, &c->rec[0][0], &ref->rec[0][0]);
        CHECK(c->rec[0][0].usage.draft_tokens > c->rec[0][0].usage.accepted_draft_tokens, "A had no rejection");
        submit(&g, &b, 1);
        run_idle(&g);
        CHECK(c->rec[1][0].usage.cached_tokens == 20 + ra->n - 1, "B reused %lld tokens, expected %d",
              (long long)c->rec[1][0].usage.cached_tokens, 20 + ra->n - 1);
        check_same("B on A's rolled-back KV", 1, &c->rec[1][0], &ref_b->rec[0][0]);
        rig_close(&g);
    }
    CHECK_EQ_INT(c->misuse + ref->misuse + ref_b->misuse, 0);
    free(ref);
    free(ref_b);
    free(c);
}

/* ---- 6: prompt lookup ---- */

static void test_lookup(const struct fixture *fx)
{
    struct spec q[3];
    for (int i = 0; i < 3; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].sp = greedy();
        q[i].max_tokens = 30;
    }
    /* On the script: the prompt's pattern repeats, and so does the continuation. */
    q[0].n_prompt = 14;
    memcpy(q[0].prompt, fx->script, 14 * sizeof(int32_t));
    q[0].lookup = 3;
    q[0].num_draft = -1;
    q[1] = q[0];
    q[1].num_draft = 5;
    q[1].lookup = 1;
    /* A prompt with no repetition: nothing matches at first. */
    random_prompt(&q[2], 9, fx->m[M_SCRIPT]->hp.n_vocab, 66);
    q[2].lookup = 2;
    q[2].num_draft = 3;
    q[2].max_tokens = 12;
    struct spec plain[3];
    memcpy(plain, q, sizeof plain);
    for (int i = 0; i < 3; i++)
        plain[i].lookup = plain[i].num_draft = 0;
    struct collector *ref = collector_new(), *c = collector_new();
    run_batch(fx, M_SCRIPT, -1, plain, 3, ref, NULL);
    struct sched_stats st;
    run_batch(fx, M_SCRIPT, M_LAYERS, q, 3, c, &st); /* a draft set, unused by lookup requests */
    for (int i = 0; i < 3; i++)
        check_same("prompt lookup", i, &c->rec[i][0], &ref->rec[i][0]);
    for (int i = 0; i < 30; i++)
        CHECK(ref->rec[0][0].tok[i] == fx->script[(14 + i) % 6], "the script continues its pattern at %d", i);
    const struct sched_usage *u = &c->rec[0][0].usage;
    CHECK(u->draft_tokens > 20 && u->accepted_draft_tokens == u->draft_tokens,
          "lookup on a repeating script: %lld of %lld accepted", (long long)u->accepted_draft_tokens,
          (long long)u->draft_tokens);
    CHECK(c->rec[1][0].usage.accepted_draft_tokens > 20, "lookup of 1-grams, 5 tokens: %lld accepted",
          (long long)c->rec[1][0].usage.accepted_draft_tokens);
    CHECK(st.draft_forwards == 0, "lookup ran the draft model %lld times", (long long)st.draft_forwards);
    CHECK(st.steps <= 12, "lookup: %lld steps for 30 tokens", (long long)st.steps);
    printf("prompt lookup: %lld of %lld accepted, %lld steps for 30 tokens\n", (long long)u->accepted_draft_tokens,
           (long long)u->draft_tokens, (long long)st.steps);
    CHECK_EQ_INT(c->misuse + ref->misuse, 0);
    free(ref);
    free(c);
}

/* ---- 7: adaptive k, and no drafting in large batches ---- */

static void test_adaptive(const struct fixture *fx)
{
    char err[512];
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    for (int i = 0; i < N_REQ; i++)
        reqs[i].num_draft = 6;
    struct collector *ref = eight_ref;
    int64_t drafted[2][2] = {{0}}; /* [draft: seed, layers][fixed, adaptive] */
    for (int d = 0; d < 2; d++)
        for (int adaptive = 0; adaptive < 2; adaptive++) {
            struct collector *c = collector_new();
            struct rig g;
            if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = N_REQ}, 0, c))
                break;
            struct sched_spec_options o = sched_spec_defaults();
            o.adaptive = adaptive;
            o.draft_cost = 0.2f;
            CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == 0, "options: %s", err);
            rig_draft(&g, fx, d ? M_LAYERS : M_SEED, K);
            for (int i = 0; i < N_REQ; i++)
                submit(&g, &reqs[i], (uint64_t)i);
            run_idle(&g);
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            drafted[d][adaptive] = st.draft_tokens;
            printf("%s, %s k: %lld of %lld accepted in %lld steps\n", d ? "draft of 2 layers" : "other seed",
                   adaptive ? "adaptive" : "fixed", (long long)st.accepted_draft_tokens, (long long)st.draft_tokens,
                   (long long)st.steps);
            rig_close(&g);
            for (int i = 0; i < N_REQ; i++)
                check_same(adaptive ? "adaptive k" : "fixed k 6", i, &c->rec[i][0], &ref->rec[i][0]);
            CHECK_EQ_INT(c->misuse, 0);
            free(c);
        }
    CHECK(drafted[0][1] * 2 < drafted[0][0], "adaptive k with a poor draft: %lld drafts, fixed %lld",
          (long long)drafted[0][1], (long long)drafted[0][0]);
    CHECK(drafted[1][1] > 0, "adaptive k with a good draft drafted nothing");

    /* More than max_decoding sequences decoding: no drafts until few are left. */
    struct collector *c = collector_new();
    struct rig g;
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = N_REQ}, 0, c) == 0) {
        struct sched_spec_options o = sched_spec_defaults();
        o.max_decoding = 2;
        CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == 0, "options: %s", err);
        rig_draft(&g, fx, M_LAYERS, K);
        for (int i = 0; i < N_REQ; i++)
            submit(&g, &reqs[i], (uint64_t)i);
        for (int k = 0; k < 4; k++)
            step(&g);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.draft_tokens == 0, "8 decoding, max 2: %lld drafts", (long long)st.draft_tokens);
        run_idle(&g);
        sched_get_stats(g.s, &st);
        CHECK(st.draft_tokens > 0, "no drafts once two sequences are left");
        rig_close(&g);
    }
    for (int i = 0; i < N_REQ; i++)
        check_same("max_decoding 2", i, &c->rec[i][0], &ref->rec[i][0]);
    CHECK_EQ_INT(c->misuse, 0);
    free(c);
}

/* ---- 8: sampled tokens follow the target's distribution ---- */

#define SAMPLE_LEN 4 /* tokens whose joint distribution is tested: the first, then K_S + 1 */
#define K_S 2
#define TOP_K 3

/* Every sequence of SAMPLE_LEN tokens the target can sample, with its exact probability,
 * and how often it came out. */
struct joint {
    int n;
    int32_t seq[256][SAMPLE_LEN];
    double p[256];
    int count[256];
};

/* Enumerates the continuations of prompt + prefix[0..depth) with their probabilities. */
static int enumerate(const struct fixture *fx, struct sampler *smp, struct kv_cache *kv, const struct sample_params *sp,
                     const int32_t *prompt, int n_prompt, int32_t *prefix, int depth, double p, struct joint *j)
{
    if (depth == SAMPLE_LEN) {
        if (j->n == 256)
            return -1;
        memcpy(j->seq[j->n], prefix, sizeof j->seq[0]);
        j->p[j->n++] = p;
        return 0;
    }
    int32_t toks[CTX];
    int64_t pos[CTX];
    int32_t seq0[CTX] = {0};
    uint8_t want[CTX] = {0};
    int n = n_prompt + depth;
    memcpy(toks, prompt, (size_t)n_prompt * sizeof *toks);
    memcpy(toks + n_prompt, prefix, (size_t)depth * sizeof *toks);
    for (int i = 0; i < n; i++)
        pos[i] = i;
    want[n - 1] = 1;
    int n_vocab = fx->m[M_SMALL]->hp.n_vocab;
    float logits[64];
    int32_t ids[64];
    float probs[64];
    char err[256];
    kv_seq_clear(kv, 0);
    struct batch b = {.n = n, .token = toks, .seq = seq0, .pos = pos, .logits = want};
    if (n_vocab > 64 || engine_forward(fx->e[M_SMALL], kv, &b, logits, err, sizeof err))
        return -1;
    struct sample_params q = *sp;
    q.seed = 0;
    int m = sample_dist(smp, &q, logits, toks, n, ids, probs);
    if (m < 1)
        return -1;
    double total = 0;
    for (int i = 0; i < m; i++)
        total += probs[i];
    for (int i = 0; i < m; i++) {
        prefix[depth] = ids[i];
        if (enumerate(fx, smp, kv, sp, prompt, n_prompt, prefix, depth + 1, p * probs[i] / total, j))
            return -1;
    }
    return 0;
}

static void chi_square(const char *what, const struct joint *j, int n_samples)
{
    double chi = 0, rest_e = 0, rest_o = 0;
    int cells = 0;
    for (int i = 0; i < j->n; i++) {
        double e = j->p[i] * n_samples;
        if (e >= 5) {
            chi += (j->count[i] - e) * (j->count[i] - e) / e;
            cells++;
        } else {
            rest_e += e;
            rest_o += j->count[i];
        }
    }
    if (rest_e > 0) {
        chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        cells++;
    }
    double df = cells - 1, z = 3.09; /* significance 0.001 */
    double crit = df * pow(1 - 2 / (9 * df) + z * sqrt(2 / (9 * df)), 3);
    printf("%s: chi-square %.1f over %d cells (%d sequences), critical %.1f\n", what, chi, cells, j->n, crit);
    CHECK(cells >= 4 && chi < crit, "%s: chi-square %.1f over %d cells, critical %.1f at 0.001", what, chi, cells, crit);
}

static void test_sampling_exact(const struct fixture *fx)
{
    enum { REQS = 32, SEQS = 128 };
    struct sampler *smp = NULL;
    struct kv_cache *kv = NULL;
    char err[512];
    struct kv_config kc = engine_kv_config(fx->m[M_SMALL], CTX, 1, BT);
    int n_vocab = fx->m[M_SMALL]->hp.n_vocab;
    struct joint *j = malloc(sizeof *j);
    struct collector *c = collector_new();
    if (!j || !c || sample_create(&smp, n_vocab) || kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "sampling: setup");
        goto out;
    }
    /* Two parameter sets: plain top-k; and a repetition penalty over everything (so the
     * drafts before a position change its distribution) with top-p and min-p. */
    for (int ps = 0; ps < 2; ps++) {
        struct spec q = {0};
        const int32_t prompt[8] = {5, 9, 20, 5, 9, 20, 5, 9};
        memcpy(q.prompt, prompt, sizeof prompt);
        q.n_prompt = 8;
        q.max_tokens = SAMPLE_LEN;
        q.n_seqs = SEQS;
        q.sp = sample_defaults();
        q.sp.temperature = 1.0f;
        q.sp.top_k = TOP_K;
        q.sp.top_p = 1.0f;
        q.sp.min_p = 0;
        if (ps == 1) {
            q.sp.temperature = 1.5f;
            q.sp.repeat_penalty = 1.6f;
            q.sp.penalty_last_n = -1;
            q.sp.top_p = 0.9f;
            q.sp.min_p = 0.1f;
        }
        memset(j, 0, sizeof *j);
        int32_t prefix[SAMPLE_LEN];
        if (enumerate(fx, smp, kv, &q.sp, q.prompt, q.n_prompt, prefix, 0, 1.0, j)) {
            CHECK(0, "sampling: cannot enumerate the target's distribution");
            goto out;
        }
        /* mode 0: draft model (its first 2 layers); 1: prompt lookup; 2: draft = target */
        for (int mode = 0; mode < 3; mode++) {
            for (int i = 0; i < j->n; i++)
                j->count[i] = 0;
            struct rig g;
            struct sched_config cfg = {.slots = SEQS};
            if (rig_open(&g, fx, M_SMALL, cfg, 0, c))
                goto out;
            struct sched_spec_options o = sched_spec_defaults();
            o.max_decoding = 0; /* all 128 sequences draft */
            CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == 0, "options: %s", err);
            q.num_draft = K_S;
            q.lookup = mode == 1 ? 2 : 0;
            if (mode != 1)
                rig_draft(&g, fx, mode == 0 ? M_SMALL_DRAFT : M_SMALL, K_S);
            int n_samples = 0, misfits = 0;
            for (int r = 0; r < REQS; r++) {
                q.sp.seed = 1000003ull * (uint64_t)(r + 1) + (uint64_t)ps * 77;
                memset(c, 0, sizeof *c);
                submit(&g, &q, 0);
                run_idle(&g);
                for (int s = 0; s < SEQS; s++) {
                    const struct rec *rc = &c->rec[0][s];
                    int cell = -1;
                    for (int i = 0; i < j->n && cell < 0 && rc->n == SAMPLE_LEN; i++)
                        if (!memcmp(j->seq[i], rc->tok, sizeof j->seq[i]))
                            cell = i;
                    if (cell < 0) {
                        misfits++;
                        continue;
                    }
                    j->count[cell]++;
                    n_samples++;
                }
                CHECK_EQ_INT(c->misuse, 0);
            }
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            rig_close(&g);
            char what[96];
            snprintf(what, sizeof what, "sampled (%s), %s", ps ? "penalties, top-p, min-p" : "top-k 3",
                     mode == 0 ? "draft of 2 layers" : mode == 1 ? "prompt lookup" : "draft = target");
            CHECK(misfits == 0, "%s: %d sequences outside the target's support", what, misfits);
            chi_square(what, j, n_samples);
            printf("  %lld of %lld drafts accepted\n", (long long)st.accepted_draft_tokens, (long long)st.draft_tokens);
            CHECK(st.draft_tokens > REQS * SEQS / 2, "%s: %lld drafts", what, (long long)st.draft_tokens);
            if (mode == 2)
                CHECK(st.accepted_draft_tokens == st.draft_tokens, "%s: %lld of %lld accepted", what,
                      (long long)st.accepted_draft_tokens, (long long)st.draft_tokens);
            else
                CHECK(st.accepted_draft_tokens > 0 && st.accepted_draft_tokens < st.draft_tokens,
                      "%s: %lld of %lld accepted", what, (long long)st.accepted_draft_tokens, (long long)st.draft_tokens);
        }
    }
    /* Deterministic: the same seeds give the same tokens again, alone or beside others. */
    {
        struct spec q = {0};
        random_prompt(&q, 6, n_vocab, 8);
        q.max_tokens = 20;
        q.sp = sample_defaults();
        q.sp.seed = 31;
        q.num_draft = 3;
        struct collector *c2 = collector_new();
        struct rig g;
        for (int pass = 0; pass < 2 && c2; pass++) {
            if (rig_open(&g, fx, M_SMALL, (struct sched_config){.slots = 4}, 0, pass ? c2 : c))
                break;
            rig_draft(&g, fx, M_SMALL_DRAFT, 3);
            memset(pass ? c2 : c, 0, sizeof *c);
            submit(&g, &q, 1);
            if (pass) {
                struct spec other = q;
                other.sp.seed = 5;
                submit(&g, &other, 2);
            }
            run_idle(&g);
            rig_close(&g);
        }
        if (c2)
            check_same("sampled with a draft, again beside another request", 1, &c2->rec[1][0], &c->rec[1][0]);
        free(c2);
    }
out:
    sample_release(smp);
    kv_release(kv);
    free(j);
    free(c);
}

/* ---- 9: refused settings ---- */

static void test_refused(const struct fixture *fx)
{
    char err[512];
    struct collector *c = collector_new();
    struct rig g;
    if (rig_open(&g, fx, M_TARGET, (struct sched_config){.slots = 4}, 0, c)) {
        free(c);
        return;
    }
    struct kv_config kc = engine_kv_config(fx->m[M_LAYERS], CTX, 4, BT);
    struct kv_config few = engine_kv_config(fx->m[M_LAYERS], CTX, 2, BT);
    struct kv_config small_kc = engine_kv_config(fx->m[M_SMALL_DRAFT], CTX, 4, BT);
    struct kv_cache *kv = NULL, *kv_few = NULL, *kv_small = NULL;
    if (kv_create(&kv, &kc, err, sizeof err) || kv_create(&kv_few, &few, err, sizeof err) ||
        kv_create(&kv_small, &small_kc, err, sizeof err)) {
        CHECK(0, "kv: %s", err);
    } else {
        struct {
            struct engine *e;
            struct kv_cache *kv;
            int k;
            const char *why;
        } bad[] = {
            {fx->e[M_LAYERS], NULL, 4, "KV cache"},
            {fx->e[M_LAYERS], kv, 0, "num_draft_tokens"},
            {fx->e[M_LAYERS], kv, SCHED_MAX_DRAFT + 1, "num_draft_tokens"},
            {fx->e[M_SMALL_DRAFT], kv_small, 4, "vocabulary"},
            {fx->e[M_LAYERS], kv_few, 4, "sequence ids"},
            {fx->e[M_LAYERS], kv_small, 4, "shape"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            err[0] = 0;
            int rc = sched_set_draft(g.s, bad[i].e, bad[i].kv, bad[i].k, err, sizeof err);
            CHECK(rc == CAIRN_EINVAL && strstr(err, bad[i].why), "bad draft %zu: %d (%s)", i, rc, err);
        }
        /* a cache in use elsewhere */
        CHECK(kv_prepare(kv, 3, 0, 5) == 0, "kv_prepare");
        CHECK(sched_set_draft(g.s, fx->e[M_LAYERS], kv, 4, err, sizeof err) == CAIRN_EINVAL && strstr(err, "empty"),
              "a non-empty draft cache: %s", err);
        kv_seq_clear(kv, 3);
        CHECK(sched_set_draft(g.s, fx->e[M_LAYERS], kv, 4, err, sizeof err) == 0, "good draft: %s", err);
        CHECK(sched_set_draft(g.s, fx->e[M_LAYERS], kv, 2, err, sizeof err) == 0, "the same cache again: %s", err);

        struct spec q = {0};
        random_prompt(&q, 5, fx->m[M_TARGET]->hp.n_vocab, 1);
        q.max_tokens = 4;
        q.sp = greedy();
        struct sched_request r = {.id = 1, .prompt = q.prompt, .n_prompt = 5, .max_tokens = 4, .n_seqs = 1,
                                  .sample = q.sp};
        const int nd[] = {-2, SCHED_MAX_DRAFT + 1};
        for (int i = 0; i < 2; i++) {
            r.num_draft_tokens = nd[i];
            CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "num_draft_tokens"),
                  "num_draft_tokens %d: %s", nd[i], err);
        }
        r.num_draft_tokens = -1;
        r.lookup_ngram = SCHED_MAX_LOOKUP_NGRAM + 1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "lookup_ngram"), "lookup_ngram: %s",
              err);
        r.lookup_ngram = -1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL, "lookup_ngram -1 accepted");
        CHECK(sched_idle(g.s), "a refused request was queued");

        struct sched_spec_options o = sched_spec_defaults();
        o.lookup_tokens = 0;
        CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == CAIRN_EINVAL && strstr(err, "lookup_tokens"),
              "lookup_tokens 0: %s", err);
        o = sched_spec_defaults();
        o.verify_cost = -1;
        CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == CAIRN_EINVAL, "verify_cost -1 accepted");
        o = sched_spec_defaults();
        o.max_decoding = -3;
        CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == CAIRN_EINVAL, "max_decoding -3 accepted");
        o.max_decoding = 0;
        o.draft_cost = NAN;
        CHECK(sched_set_spec_options(g.s, &o, err, sizeof err) == CAIRN_EINVAL, "draft_cost NaN accepted");

        /* the draft dropped while a request that asked for it runs */
        q.num_draft = -1;
        submit(&g, &q, 2);
        step(&g);
        CHECK(sched_set_draft(g.s, NULL, NULL, 0, err, sizeof err) == 0, "drop: %s", err);
        run_idle(&g);
        CHECK(c->rec[2][0].n == 4 && c->rec[2][0].why == SCHED_FINISH_LENGTH, "after the drop: %d tokens",
              c->rec[2][0].n);
        CHECK(kv_free_blocks(kv) == kc.n_blocks, "the dropped draft's cache holds blocks");
    }
    rig_close(&g);
    kv_release(kv);
    kv_release(kv_few);
    kv_release(kv_small);
    CHECK_EQ_INT(c->misuse, 0);
    free(c);
}

/* Runs one test and says how long it took (the tests share a slow machine). */
/* ---- 8: drafting over micro-batches in flight ---- */

/* The eight greedy requests over 2 lanes of a deferred two-half forward (each batch runs
 * only when collected, after the next was built): with the 2-layer draft from the start,
 * and with drafts switched and dropped while batches are in flight; the tokens are those
 * without a draft, and both caches end empty. */
static void test_lanes(const struct fixture *fx)
{
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    for (int phased = 0; phased < 2; phased++) {
        const char *what = phased ? "2 lanes, drafts switched in flight, asks" : "2 lanes, 2-layer draft";
        struct collector *c = collector_new();
        struct async_fwd a;
        async_fwd_init(&a, fx->e[M_TARGET], true);
        struct sched_config cfg = {.slots = N_REQ, .chunk_tokens = 8, .lanes = 2, .submit = async_submit,
                                   .collect = async_collect, .forward_ctx = &a};
        if (phased) /* greedy drafts verified by tokens sampled "remotely" */
            cfg.asks = async_asks;
        struct rig g;
        if (rig_open(&g, fx, M_TARGET, cfg, 0, c) == 0) {
            a.kv = g.kv;
            if (!phased)
                rig_draft(&g, fx, M_LAYERS, K);
            for (int i = 0; i < N_REQ; i++)
                submit(&g, &reqs[i], (uint64_t)i);
            const int plan[] = {M_LAYERS, M_QUANT, -1, M_TARGET};
            for (int phase = 0; phased && phase < 4 && !sched_idle(g.s); phase++) {
                for (int k = 0; k < 5; k++)
                    step(&g);
                CHECK(a.count > 0, "%s: nothing in flight when switching", what);
                rig_draft(&g, fx, plan[phase], 3);
            }
            run_idle(&g);
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            CHECK(st.draft_tokens > 0 && st.accepted_draft_tokens > 0, "%s: drafted %lld, accepted %lld", what,
                  (long long)st.draft_tokens, (long long)st.accepted_draft_tokens);
            CHECK(a.max_in_flight == 2 && a.max_seqs <= N_REQ / 2, "%s: %d in flight, %d sequences in a batch",
                  what, a.max_in_flight, a.max_seqs);
            CHECK_EQ_INT(st.kv_blocks_used, 0);
            CHECK_EQ_INT(a.misuse, 0);
            CHECK(!phased || (a.sampled > 0 && a.asks_calls == a.submits), "%s: %d rows sampled, %d asks", what,
                  a.sampled, a.asks_calls);
            rig_close(&g);
        }
        async_fwd_free(&a);
        for (int i = 0; i < N_REQ; i++)
            check_same(what, i, &c->rec[i][0], &eight_ref->rec[i][0]);
        CHECK_EQ_INT(c->misuse, 0);
        free(c);
    }

    /* Sampled requests with drafts: short prompts read in one step and a draft with room
     * for all, so every sequence drafts k tokens from its first decode on with 1 lane or
     * 2; each lane verifies against the draft distributions its own batch drew, and the
     * tokens are the same. */
    struct spec sreqs[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        memset(&sreqs[i], 0, sizeof sreqs[i]);
        random_prompt(&sreqs[i], 3 + i % 5, fx->m[M_TARGET]->hp.n_vocab, 2000 + (uint64_t)i);
        sreqs[i].max_tokens = 20;
        sreqs[i].sp = sample_defaults();
        sreqs[i].sp.temperature = 0.9f;
        sreqs[i].sp.seed = 300 + (uint64_t)i;
        sreqs[i].num_draft = -1;
    }
    /* Run 2 answers asks: drafts' rows come back as logits for rejection sampling, the
     * row after them as a token. */
    struct collector *by[3] = {collector_new(), collector_new(), collector_new()};
    for (int run = 0; run < 3; run++) {
        int lanes = run ? 2 : 1;
        struct async_fwd a;
        async_fwd_init(&a, fx->e[M_TARGET], true);
        struct sched_config cfg = {.slots = N_REQ, .chunk_tokens = MAX_BATCH - N_REQ, .lanes = lanes,
                                   .submit = async_submit, .collect = async_collect, .forward_ctx = &a};
        if (run == 2)
            cfg.asks = async_asks;
        if (lanes == 1) {
            cfg.submit = NULL;
            cfg.collect = NULL;
            cfg.forward_ctx = NULL;
        }
        struct rig g;
        if (rig_open(&g, fx, M_TARGET, cfg, 0, by[run]) == 0) {
            a.kv = g.kv;
            rig_draft(&g, fx, M_LAYERS, K);
            for (int i = 0; i < N_REQ; i++)
                submit(&g, &sreqs[i], (uint64_t)i);
            run_idle(&g);
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            CHECK(st.draft_rejections > 0 && st.accepted_draft_tokens > 0, "sampled, %d lanes: %lld accepted, "
                  "%lld rejections", lanes, (long long)st.accepted_draft_tokens, (long long)st.draft_rejections);
            CHECK(lanes == 1 || a.max_in_flight == 2, "sampled, 2 lanes: %d in flight", a.max_in_flight);
            CHECK(run < 2 || a.sampled > 0, "sampled, 2 lanes, asks: nothing sampled by the forward");
            CHECK_EQ_INT(a.misuse, 0);
            rig_close(&g);
        }
        async_fwd_free(&a);
    }
    for (int i = 0; i < N_REQ; i++) {
        check_same("sampled with drafts, 2 lanes vs 1", i, &by[1]->rec[i][0], &by[0]->rec[i][0]);
        check_same("sampled with drafts, 2 lanes answering asks vs 1", i, &by[2]->rec[i][0], &by[0]->rec[i][0]);
        CHECK(by[0]->rec[i][0].usage.draft_tokens == by[1]->rec[i][0].usage.draft_tokens,
              "sampled: request %d drafted %lld with 1 lane, %lld with 2", i,
              (long long)by[0]->rec[i][0].usage.draft_tokens, (long long)by[1]->rec[i][0].usage.draft_tokens);
    }
    CHECK_EQ_INT(by[0]->misuse + by[1]->misuse + by[2]->misuse, 0);
    free(by[0]);
    free(by[1]);
    free(by[2]);
}

/* Constrained decoding under batching and speculation: eight requests under one
 * grammar give, greedy, the same tokens alone, batched, with a draft model and with
 * prompt lookup (drafts are drawn and verified under the grammar; rejected ones never
 * reach the matcher); sampled ones, drafted or not, give text the grammar matches, and
 * every output is complete within max_tokens. */
static void test_grammar_spec(const struct fixture *fx)
{
    static const char *G = "root ::= \"{\\\"k\\\": \" num \", \\\"s\\\": \\\"\" [^\"\\\\]* \"\\\"}\"\n"
                           "num ::= \"-\"? [0-9]+\n";
    char err[256];
    struct grammar *g = NULL;
    struct grammar_ctx *c = NULL;
    CHECK(grammar_parse(&g, G, strlen(G), "root", err, sizeof err) == 0, "grammar: %s", err);
    if (!g || grammar_ctx_from_tok(&c, g, fx->tok)) {
        CHECK(0, "grammar ctx");
        grammar_release(g);
        return;
    }
    struct spec reqs[N_REQ];
    make_eight(fx, reqs);
    for (int i = 0; i < N_REQ; i++) {
        reqs[i].grammar = c;
        reqs[i].max_tokens = 16 + 4 * i;
        reqs[i].num_draft = -1;
    }
    struct collector *alone = collector_new(), *batch = collector_new(), *drafted = collector_new(),
                     *lookup = collector_new();
    for (int i = 0; i < N_REQ; i++) {
        struct collector *one = collector_new();
        run_batch(fx, M_TARGET, -1, &reqs[i], 1, one, NULL);
        alone->rec[i][0] = one->rec[0][0];
        alone->misuse += one->misuse;
        free(one);
    }
    run_batch(fx, M_TARGET, -1, reqs, N_REQ, batch, NULL);
    struct sched_stats st = {0};
    run_batch(fx, M_TARGET, M_LAYERS, reqs, N_REQ, drafted, &st);
    CHECK(st.draft_tokens > 0 && st.accepted_draft_tokens > 0, "constrained drafts: %lld drafted, %lld kept",
          (long long)st.draft_tokens, (long long)st.accepted_draft_tokens);
    struct spec lk[N_REQ];
    memcpy(lk, reqs, sizeof lk);
    for (int i = 0; i < N_REQ; i++)
        lk[i].lookup = 3;
    run_batch(fx, M_TARGET, -1, lk, N_REQ, lookup, NULL);
    CHECK(alone->misuse + batch->misuse + drafted->misuse + lookup->misuse == 0, "callbacks misused");
    for (int i = 0; i < N_REQ; i++) {
        check_same("grammar: batched", i, &batch->rec[i][0], &alone->rec[i][0]);
        check_same("grammar: draft model", i, &drafted->rec[i][0], &alone->rec[i][0]);
        check_same("grammar: prompt lookup", i, &lookup->rec[i][0], &alone->rec[i][0]);
    }
    /* Sampled, with and without the draft: whatever comes must match, complete. */
    for (int d = 0; d < 2; d++) {
        struct spec sr[N_REQ];
        memcpy(sr, reqs, sizeof sr);
        for (int i = 0; i < N_REQ; i++) {
            sr[i].sp = sample_defaults();
            sr[i].sp.temperature = 1.0f;
            sr[i].sp.top_k = 0;
            sr[i].sp.seed = 77 + (uint64_t)i;
        }
        sr[2].n_seqs = 3; /* forked from one prompt: each sequence its own matcher */
        struct collector *out = collector_new();
        run_batch(fx, M_TARGET, d ? M_LAYERS : -1, sr, N_REQ, out, NULL);
        CHECK_EQ_INT(out->misuse, 0);
        for (int k = 0; k < N_REQ + 2; k++) {
            int i = k < N_REQ ? k : 2, seq = k < N_REQ ? 0 : k - N_REQ + 1;
            const struct rec *r = &out->rec[i][seq];
            char text[4096];
            size_t len = 0;
            for (int t = 0; t < r->n; t++) {
                size_t l = 0;
                if (tok_token_text(fx->tok, r->tok[t], 0, text + len, sizeof text - len - 1, &l) == 0)
                    len += l;
            }
            CHECK(r->n_done == 1 && r->why == SCHED_FINISH_STOP && grammar_matches(g, text, len),
                  "sampled%s %d/%d: %s, '%.*s' does not match", d ? " with a draft" : "", i, seq,
                  sched_finish_name(r->why), (int)len, text);
        }
        free(out);
    }
    for (int i = 0; i < N_REQ; i++)
        CHECK(alone->rec[i][0].why == SCHED_FINISH_STOP, "greedy %d ends complete: %s", i,
              sched_finish_name(alone->rec[i][0].why));
    free(alone);
    free(batch);
    free(drafted);
    free(lookup);
    grammar_ctx_release(c);
    grammar_release(g);
}

static void timed(const char *name, void (*fn)(const struct fixture *), const struct fixture *fx)
{
    double t0 = clock_sec();
    fn(fx);
    printf("  [%s: %.1f s]\n", name, clock_sec() - t0);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_sample_dist);
    struct fixture fx;
    if (fixture_open(&fx)) {
        CHECK(0, "cannot build the test models");
        return test_main_end();
    }
    struct spec reqs[N_REQ];
    make_eight(&fx, reqs);
    eight_ref = collector_new();
    run_batch(&fx, M_TARGET, -1, reqs, N_REQ, eight_ref, NULL);
    CHECK_EQ_INT(eight_ref->misuse, 0);
    timed("refused", test_refused, &fx);
    timed("greedy pairs", test_greedy_pairs, &fx);
    timed("preemption", test_preemption, &fx);
    timed("switch", test_switch, &fx);
    timed("rollback and reuse", test_rollback_reuse, &fx);
    timed("prompt lookup", test_lookup, &fx);
    timed("adaptive", test_adaptive, &fx);
    timed("sampling", test_sampling_exact, &fx);
    timed("lanes", test_lanes, &fx);
    timed("grammar", test_grammar_spec, &fx);
    free(eight_ref);
    fixture_close(&fx);
    return test_main_end();
}
