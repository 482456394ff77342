/* The continuous-batching scheduler on a real synthetic model (tiny llama shape, the
 * llama SentencePiece vocabulary): a request's tokens are the same alone, in a batch of
 * eight, chunked, preempted, reusing a cached prefix or forked from a shared prompt, and
 * equal a plain prefill-then-argmax loop; stop, cancel, queue limits, bad requests,
 * requests that cannot fit, engine failure, logprobs; the same over micro-batches in
 * flight (lanes). */
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "model/model.h"
#include "model/synth.h"
#include "async_fwd.h"
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
#define MAX_SEQ 4
#define MAX_GEN 64
#define N_REQ 8

struct fixture {
    char dir[64], path[96];
    struct model *m;
    struct engine *e;
    struct tok *tok;
    int n_vocab;
};

/* ---- what the callbacks saw ---- */

struct rec {
    int n; /* tokens reported */
    int32_t tok[MAX_GEN];
    float prob[MAX_GEN];
    struct sched_token first; /* the whole report of token 0 (logprobs) */
    int64_t step_of[MAX_GEN]; /* collector.steps when reported */
    int n_done;
    enum sched_finish why;
    struct sched_usage usage;
    char error[256];
};

struct collector {
    struct rec rec[MAX_IDS][MAX_SEQ];
    int stop_at[MAX_IDS]; /* the token callback returns 1 at this many tokens (0: never) */
    int64_t steps;
    int misuse; /* callbacks out of order, after done, or for unknown ids */
    int admitted[MAX_IDS];        /* admitted callbacks per request (must be 1 before tokens) */
    int64_t admitted_cached[MAX_IDS];
    /* When request then_after is done, its done callback submits `then` to `s`. */
    struct sched *s;
    uint64_t then_after;
    const struct sched_request *then;
    int then_rc;
};

static int on_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    struct collector *c = ctx;
    if (id >= MAX_IDS || seq < 0 || seq >= MAX_SEQ) {
        c->misuse++;
        return 1;
    }
    struct rec *r = &c->rec[id][seq];
    if (r->n_done || index != r->n || r->n >= MAX_GEN || c->admitted[id] != 1) {
        c->misuse++;
        return 1;
    }
    if (index == 0)
        r->first = *t;
    r->tok[r->n] = t->token;
    r->prob[r->n] = t->prob;
    r->step_of[r->n] = c->steps;
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
    if ((why == SCHED_FINISH_ERROR) != (error != NULL) || u->generated_tokens != r->n)
        c->misuse++;
    if (c->admitted[id] && u->cached_tokens != c->admitted_cached[id])
        c->misuse++; /* the admission told another reuse than the usage */
    snprintf(r->error, sizeof r->error, "%s", error ? error : "");
    if (c->then && id == c->then_after) {
        c->then_rc = sched_submit(c->s, c->then, NULL, 0);
        c->then = NULL;
    }
}

static void on_admitted(void *ctx, uint64_t id, const struct sched_usage *u)
{
    struct collector *c = ctx;
    if (id >= MAX_IDS) {
        c->misuse++;
        return;
    }
    c->admitted[id]++;
    c->admitted_cached[id] = u->cached_tokens;
    if (c->admitted[id] != 1 || c->rec[id][0].n)
        c->misuse++;
}

static struct collector *collector_new(void) { return calloc(1, sizeof(struct collector)); }

/* ---- setup ---- */

static int fixture_open(struct fixture *fx)
{
    char err[512];
    memset(fx, 0, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/cairn-test-sched-XXXXXX");
    if (!mkdtemp(fx->dir)) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(fx->path, sizeof fx->path, "%s/tiny.gguf", fx->dir);
    struct synth_spec spec;
    synth_shape("tiny", &spec);
    snprintf(spec.type, sizeof spec.type, "q8_0");
    spec.seed = 7;
    if (synth_write(&spec, test_data_path("vocab/ggml-vocab-llama-spm.gguf"), fx->path, err, sizeof err) ||
        model_load(&fx->m, fx->path, NULL, err, sizeof err) || tok_load(&fx->tok, fx->m->file, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    struct engine_config ec = {.n_threads = 2, .max_batch = MAX_BATCH, .max_ctx = CTX};
    if (engine_create(&fx->e, fx->m, &ec, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    fx->n_vocab = fx->m->hp.n_vocab;
    return 0;
}

static void fixture_close(struct fixture *fx)
{
    engine_release(fx->e);
    tok_release(fx->tok);
    model_release(fx->m);
    unlink(fx->path);
    rmdir(fx->dir);
}

/* A scheduler with its own KV cache of n_blocks blocks (0: room for every slot and cache
 * entry at full context). */
struct rig {
    struct sched *s;
    struct kv_cache *kv;
};

static int rig_open(struct rig *g, const struct fixture *fx, struct engine *e, struct sched_config cfg,
                    int64_t n_blocks, struct collector *c)
{
    char err[512];
    memset(g, 0, sizeof *g);
    if (!cfg.ctx)
        cfg.ctx = CTX;
    if (!cfg.tok)
        cfg.tok = fx->tok;
    struct kv_config kc = engine_kv_config(fx->m, cfg.ctx, sched_kv_seqs(&cfg), BT);
    if (n_blocks)
        kc.n_blocks = n_blocks;
    struct sched_callbacks cb = {.token = on_token, .done = on_done, .admitted = on_admitted, .ctx = c};
    if (kv_create(&g->kv, &kc, err, sizeof err) || sched_create(&g->s, e ? e : fx->e, g->kv, &cfg, &cb, err, sizeof err)) {
        CHECK(0, "rig: %s", err);
        kv_release(g->kv);
        g->kv = NULL;
        return -1;
    }
    return 0;
}

static void rig_close(struct rig *g)
{
    sched_release(g->s);
    kv_release(g->kv);
}

/* Steps until idle; false (and a failed check) if it does not get there. */
static bool run_idle(struct rig *g, struct collector *c)
{
    char err[512];
    for (int i = 0; i < 5000 && !sched_idle(g->s); i++) {
        c->steps++;
        int rc = sched_step(g->s, err, sizeof err);
        if (rc < 0) {
            CHECK(0, "sched_step: %s", err);
            return false;
        }
    }
    CHECK(sched_idle(g->s), "scheduler not idle after 5000 steps");
    return sched_idle(g->s);
}

static void step(struct rig *g, struct collector *c)
{
    char err[512];
    c->steps++;
    int rc = sched_step(g->s, err, sizeof err);
    CHECK(rc >= 0, "sched_step: %s", err);
}

/* ---- requests ---- */

struct spec {
    int32_t prompt[CTX];
    int n_prompt, max_tokens, n_seqs;
    struct sample_params sp;
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

static struct sample_params sampled(uint64_t seed)
{
    struct sample_params p = sample_defaults();
    p.temperature = 0.8f;
    p.seed = seed;
    return p;
}

static struct sched_request request_of(const struct spec *q, uint64_t id)
{
    return (struct sched_request){.id = id, .prompt = q->prompt, .n_prompt = q->n_prompt,
                                  .max_tokens = q->max_tokens, .n_seqs = q->n_seqs ? q->n_seqs : 1, .sample = q->sp};
}

static int submit(struct rig *g, const struct spec *q, uint64_t id)
{
    char err[512];
    struct sched_request r = request_of(q, id);
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

/* Each request alone on a fresh scheduler with room for everything: the reference runs. */
static void run_alone(const struct fixture *fx, const struct spec *reqs, int n, struct collector *out)
{
    for (int i = 0; i < n; i++) {
        struct rig g;
        struct sched_config cfg = {.slots = MAX_SEQ};
        if (rig_open(&g, fx, NULL, cfg, 0, out))
            return;
        submit(&g, &reqs[i], (uint64_t)i);
        run_idle(&g, out);
        rig_close(&g);
    }
}

static void make_eight(const struct fixture *fx, struct spec *reqs, bool sample)
{
    static const int lens[N_REQ] = {5, 12, 31, 7, 20, 3, 45, 16};
    static const int gens[N_REQ] = {20, 8, 16, 12, 24, 10, 6, 18};
    for (int i = 0; i < N_REQ; i++) {
        memset(&reqs[i], 0, sizeof reqs[i]);
        random_prompt(&reqs[i], lens[i], fx->n_vocab, 1000 + (uint64_t)i);
        reqs[i].max_tokens = gens[i];
        reqs[i].sp = sample ? sampled(500 + (uint64_t)i) : greedy();
    }
}

/* The plain loop: the whole prompt in one forward, then argmax one token at a time. */
static int reference_greedy(const struct fixture *fx, const struct spec *q, int32_t *out)
{
    char err[512];
    struct kv_config kc = engine_kv_config(fx->m, CTX, 1, BT);
    struct kv_cache *kv = NULL;
    float *logits = malloc((size_t)fx->n_vocab * sizeof *logits);
    int32_t seq0[MAX_BATCH] = {0};
    int64_t pos[MAX_BATCH];
    uint8_t want[MAX_BATCH] = {0};
    int n = 0;
    if (!logits || kv_create(&kv, &kc, err, sizeof err))
        goto out;
    for (int i = 0; i < q->n_prompt; i++)
        pos[i] = i;
    want[q->n_prompt - 1] = 1;
    struct batch b = {.n = q->n_prompt, .token = q->prompt, .seq = seq0, .pos = pos, .logits = want};
    if (engine_forward(fx->e, kv, &b, logits, err, sizeof err))
        goto out;
    for (int64_t p = q->n_prompt; n < q->max_tokens; p++) {
        int32_t best = 0;
        for (int32_t t = 1; t < fx->n_vocab; t++)
            if (logits[t] > logits[best])
                best = t;
        if (tok_is_eog(fx->tok, best))
            break;
        out[n++] = best;
        if (n == q->max_tokens || p + 1 >= CTX)
            break;
        int64_t pp = p;
        uint8_t one = 1;
        struct batch d = {.n = 1, .token = &best, .seq = seq0, .pos = &pp, .logits = &one};
        if (engine_forward(fx->e, kv, &d, logits, err, sizeof err)) {
            n = -1;
            goto out;
        }
    }
out:
    if (n < 0 || !kv)
        fprintf(stderr, "reference: %s\n", err);
    kv_release(kv);
    free(logits);
    return n;
}

/* ---- 1, 2: alone == in a batch of eight (== the plain loop) ---- */

static void test_batch_equals_alone(const struct fixture *fx, bool sample)
{
    const char *what = sample ? "sampled, batch of 8" : "greedy, batch of 8";
    struct spec reqs[N_REQ];
    make_eight(fx, reqs, sample);
    struct collector *alone = collector_new(), *batch = collector_new();
    run_alone(fx, reqs, N_REQ, alone);

    struct rig g;
    struct sched_config cfg = {.slots = N_REQ};
    if (rig_open(&g, fx, NULL, cfg, 0, batch) == 0) {
        for (int i = 0; i < N_REQ; i++)
            submit(&g, &reqs[i], (uint64_t)i);
        run_idle(&g, batch);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        int64_t prompt_total = 0;
        for (int i = 0; i < N_REQ; i++)
            prompt_total += reqs[i].n_prompt;
        CHECK_EQ_INT(st.prompt_tokens_computed, prompt_total);
        CHECK_EQ_INT(st.preemptions, 0);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        CHECK(st.steps < 40, "%s: %lld steps for requests of at most 24 tokens", what, (long long)st.steps);
        rig_close(&g);
    }
    int64_t generated = 0;
    for (int i = 0; i < N_REQ; i++) {
        check_same(what, i, &batch->rec[i][0], &alone->rec[i][0]);
        CHECK(alone->rec[i][0].n > 0, "%s: request %d generated nothing", what, i);
        generated += alone->rec[i][0].n;
    }
    CHECK(generated > N_REQ * 4, "%s: only %lld tokens generated", what, (long long)generated);
    if (!sample) {
        for (int i = 0; i < N_REQ; i++) {
            int32_t ref[MAX_GEN];
            int n = reference_greedy(fx, &reqs[i], ref);
            const struct rec *r = &alone->rec[i][0];
            bool same = n == r->n && memcmp(ref, r->tok, (size_t)n * sizeof ref[0]) == 0;
            CHECK(same, "greedy: request %d differs from the plain loop (%d vs %d tokens)", i, r->n, n);
            for (int k = 0; k < r->n; k++)
                CHECK(r->prob[k] == 1.0f, "greedy token has probability %g", r->prob[k]);
        }
    } else {
        bool below_one = false;
        for (int i = 0; i < N_REQ; i++)
            for (int k = 0; k < alone->rec[i][0].n; k++)
                below_one |= alone->rec[i][0].prob[k] < 1.0f;
        CHECK(below_one, "sampling at temperature 0.8 never drew with probability < 1");
    }
    CHECK_EQ_INT(alone->misuse + batch->misuse, 0);
    free(alone);
    free(batch);
}

/* ---- 3: preemption ---- */

static void test_preemption(const struct fixture *fx)
{
    for (int sample = 0; sample < 2; sample++) {
        struct spec reqs[N_REQ];
        make_eight(fx, reqs, sample);
        struct collector *alone = collector_new(), *small = collector_new();
        run_alone(fx, reqs, N_REQ, alone);
        /* The longest request alone needs 4 blocks of 16 (51 positions); all eight at full
         * length need 20. */
        struct rig g;
        struct sched_config cfg = {.slots = N_REQ};
        if (rig_open(&g, fx, NULL, cfg, 6, small) == 0) {
            for (int i = 0; i < N_REQ; i++)
                submit(&g, &reqs[i], (uint64_t)i);
            int64_t peak = 0;
            char err[512];
            for (int i = 0; i < 5000 && !sched_idle(g.s); i++) {
                small->steps++;
                CHECK(sched_step(g.s, err, sizeof err) >= 0, "sched_step: %s", err);
                struct sched_stats st;
                sched_get_stats(g.s, &st);
                peak = st.kv_blocks_used > peak ? st.kv_blocks_used : peak;
            }
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            CHECK(sched_idle(g.s), "preemption: not idle");
            CHECK(st.preemptions > 0, "no preemption with 6 blocks for 8 requests");
            CHECK(peak <= 6 && st.kv_blocks_total == 6, "blocks used %lld of %lld", (long long)peak,
                  (long long)st.kv_blocks_total);
            CHECK_EQ_INT(st.kv_blocks_used, 0);
            printf("preemption (%s): %lld preemptions, %lld steps\n", sample ? "sampled" : "greedy",
                   (long long)st.preemptions, (long long)st.steps);
            rig_close(&g);
        }
        for (int i = 0; i < N_REQ; i++)
            check_same(sample ? "preempted, sampled" : "preempted, greedy", i, &small->rec[i][0], &alone->rec[i][0]);
        CHECK_EQ_INT(small->misuse, 0);
        free(alone);
        free(small);
    }
}

/* ---- 4: prefix reuse ---- */

static void test_prefix_reuse(const struct fixture *fx)
{
    struct spec a = {0}, reqs[4];
    random_prompt(&a, 20, fx->n_vocab, 77);
    a.max_tokens = 10;
    a.sp = greedy();
    struct collector *first = collector_new();
    run_alone(fx, &a, 1, first);
    const struct rec *ra = &first->rec[0][0];
    CHECK(ra->n == 10 && ra->why == SCHED_FINISH_LENGTH, "request A: %d tokens, %s", ra->n,
          sched_finish_name(ra->why));

    /* B extends A's prompt and output; C shares their first 25 tokens then diverges
     * (inside a block: the partly shared block is copied); D is A's prompt again; E is
     * B's prompt, sampled. A's KV holds all but its last generated token. */
    int n_ab = 20 + ra->n;
    int32_t base[CTX], tail[7];
    memcpy(base, a.prompt, 20 * sizeof base[0]);
    memcpy(base + 20, ra->tok, (size_t)ra->n * sizeof base[0]);
    uint64_t seed = 91;
    for (int i = 0; i < 7; i++)
        tail[i] = (int32_t)(3 + test_rand_u64(&seed) % (uint64_t)(fx->n_vocab - 3));
    const int lens[4] = {n_ab + 7, 31, 20, n_ab + 7};
    const int from_base[4] = {n_ab, 25, 20, n_ab};
    int64_t want_cached[4] = {n_ab - 1, 25, 19, n_ab + 7 - 1};
    for (int i = 0; i < 4; i++) {
        memset(&reqs[i], 0, sizeof reqs[i]);
        memcpy(reqs[i].prompt, base, (size_t)from_base[i] * sizeof base[0]);
        memcpy(reqs[i].prompt + from_base[i], tail, (size_t)(lens[i] - from_base[i]) * sizeof tail[0]);
        reqs[i].n_prompt = lens[i];
        reqs[i].max_tokens = 8;
        reqs[i].sp = i == 3 ? sampled(4242) : greedy();
    }

    struct collector *nocache = collector_new(), *cached = collector_new();
    run_alone(fx, reqs, 4, nocache);
    struct rig g;
    struct sched_config cfg = {.slots = 2, .cache_seqs = 2};
    if (rig_open(&g, fx, NULL, cfg, 0, cached) == 0) {
        submit(&g, &a, 10);
        run_idle(&g, cached);
        check_same("prefix: A again", 10, &cached->rec[10][0], ra);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.cached == 1 && st.kv_blocks_used == 2, "after A: %d cached, %lld blocks", st.cached,
              (long long)st.kv_blocks_used);
        int64_t computed_before = st.prompt_tokens_computed;
        for (int i = 0; i < 4; i++) {
            submit(&g, &reqs[i], (uint64_t)i);
            run_idle(&g, cached);
            const struct rec *r = &cached->rec[i][0];
            CHECK(r->usage.cached_tokens == want_cached[i], "prefix: request %d reused %lld tokens, expected %lld", i,
                  (long long)r->usage.cached_tokens, (long long)want_cached[i]);
            CHECK_EQ_INT(r->usage.prompt_tokens, reqs[i].n_prompt);
            check_same("prefix reuse", i, r, &nocache->rec[i][0]);
            sched_get_stats(g.s, &st);
            CHECK(st.prompt_tokens_computed - computed_before == reqs[i].n_prompt - want_cached[i],
                  "prefix: request %d computed %lld prompt tokens", i,
                  (long long)(st.prompt_tokens_computed - computed_before));
            computed_before = st.prompt_tokens_computed;
            CHECK(st.cached >= 1 && st.cached <= 2, "%d cache entries", st.cached);
        }
        sched_get_stats(g.s, &st);
        CHECK_EQ_INT(st.cached_tokens, want_cached[0] + want_cached[1] + want_cached[2] + want_cached[3]);
        rig_close(&g);
    }
    CHECK_EQ_INT(cached->misuse + nocache->misuse, 0);
    free(first);
    free(nocache);
    free(cached);
}

/* ---- 5: n_seqs ---- */

/* A request of 3 sampled sequences (seeds 100..102), the same as 3 requests of one, and
 * two other sampled requests to run beside it. */
static void make_forked(const struct fixture *fx, struct spec *three, struct spec one[3], struct spec others[2])
{
    memset(three, 0, sizeof *three);
    random_prompt(three, 18, fx->n_vocab, 5);
    three->max_tokens = 12;
    three->sp = sampled(100);
    three->n_seqs = 3;
    for (int i = 0; i < 3; i++) {
        one[i] = *three;
        one[i].n_seqs = 1;
        one[i].sp.seed = 100 + (uint64_t)i;
    }
    for (int i = 0; i < 2; i++) {
        memset(&others[i], 0, sizeof others[i]);
        random_prompt(&others[i], 14, fx->n_vocab, 60 + (uint64_t)i);
        others[i].max_tokens = 24;
        others[i].sp = sampled(61 + (uint64_t)i);
    }
}

static void test_n_seqs(const struct fixture *fx)
{
    struct spec one[3], three, others[2];
    make_forked(fx, &three, one, others);
    struct collector *alone = collector_new(), *c = collector_new();
    run_alone(fx, one, 3, alone);
    struct rig g;
    struct sched_config cfg = {.slots = 4};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        submit(&g, &three, 5);
        step(&g, c);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.running == 3 && st.last_batch == 18, "n_seqs: first step ran %lld tokens, %d running",
              (long long)st.last_batch, st.running);
        for (int i = 0; i < 3; i++)
            CHECK(c->rec[5][i].n == 1, "n_seqs: sequence %d has %d tokens after the prompt step", i, c->rec[5][i].n);
        run_idle(&g, c);
        sched_get_stats(g.s, &st);
        CHECK_EQ_INT(st.prompt_tokens_computed, 18);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        rig_close(&g);
    }
    for (int i = 0; i < 3; i++) {
        check_same("n_seqs 3 vs 1 with seed + i", i, &c->rec[5][i], &alone->rec[i][0]);
        CHECK_EQ_INT(c->rec[5][i].usage.prompt_tokens, 18);
    }
    CHECK(memcmp(c->rec[5][0].tok, c->rec[5][1].tok, 12 * sizeof(int32_t)) != 0,
          "sequences 0 and 1 sampled the same tokens with different seeds");

    /* The same between two other requests in a cache of 5 blocks: preempted sequences
     * (forked ones recompute their own prompt) still give the same tokens. */
    struct collector *small = collector_new(), *alone_others = collector_new();
    run_alone(fx, others, 2, alone_others);
    if (rig_open(&g, fx, NULL, cfg, 5, small) == 0) {
        submit(&g, &others[0], 0);
        submit(&g, &three, 5);
        submit(&g, &others[1], 1);
        run_idle(&g, small);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.preemptions > 0, "n_seqs: no preemption in 5 blocks");
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        rig_close(&g);
    }
    for (int i = 0; i < 3; i++)
        check_same("n_seqs 3 in a small cache", i, &small->rec[5][i], &alone->rec[i][0]);
    for (int i = 0; i < 2; i++)
        check_same("beside n_seqs 3 in a small cache", i, &small->rec[i][0], &alone_others->rec[i][0]);

    /* Prompt chunks of 4 and 4 blocks: the older request's prompt goes first, then its
     * decoding takes the blocks the three sequences' shared prompt still needs, so that
     * group goes back to the queue whole, before its fork, and runs after. */
    struct spec older = others[0];
    random_prompt(&older, 30, fx->n_vocab, 62);
    struct sched_config chunked = {.slots = 4, .chunk_tokens = 4};
    memset(alone_others, 0, sizeof *alone_others);
    run_alone(fx, &older, 1, alone_others);
    memset(small, 0, sizeof *small);
    if (rig_open(&g, fx, NULL, chunked, 4, small) == 0) {
        submit(&g, &older, 0);
        submit(&g, &three, 5);
        run_idle(&g, small);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.preemptions > 0, "n_seqs: no preemption of the prefilling group");
        CHECK(st.prompt_tokens_computed > 30 + 18, "n_seqs: %lld prompt tokens computed; the group's again: > 48",
              (long long)st.prompt_tokens_computed);
        rig_close(&g);
    }
    check_same("older beside a preempted group", 0, &small->rec[0][0], &alone_others->rec[0][0]);
    for (int i = 0; i < 3; i++) {
        check_same("n_seqs 3 preempted before its fork", i, &small->rec[5][i], &alone->rec[i][0]);
        CHECK_EQ_INT(small->rec[5][i].usage.cached_tokens, 0);
    }
    CHECK_EQ_INT(small->misuse + alone_others->misuse, 0);
    free(small);
    free(alone_others);
    CHECK_EQ_INT(alone->misuse + c->misuse, 0);
    free(alone);
    free(c);
}

/* ---- 6: stop, cancel, queue, bad requests ---- */

static void test_stop_cancel_limits(const struct fixture *fx)
{
    char err[512];
    struct spec q[4];
    for (int i = 0; i < 4; i++) {
        memset(&q[i], 0, sizeof q[i]);
        random_prompt(&q[i], 6 + i, fx->n_vocab, 300 + (uint64_t)i);
        q[i].max_tokens = i < 2 ? 20 : 4;
        q[i].sp = greedy();
    }
    struct collector *c = collector_new(), *alone = collector_new();
    run_alone(fx, q, 4, alone);
    struct rig g;
    struct sched_config cfg = {.slots = 2, .queue_max = 2};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        c->stop_at[1] = 3;
        submit(&g, &q[0], 1); /* A: stops itself after 3 tokens */
        submit(&g, &q[1], 2); /* B: cancelled while running */
        struct sched_request r = request_of(&q[2], 3);
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EFULL, "third request past queue_max 2 accepted");
        step(&g, c); /* A and B admitted, prompts read, token 0 */
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(st.running == 2 && st.queued == 0, "running %d queued %d", st.running, st.queued);
        submit(&g, &q[2], 3); /* C: waits for a slot */
        submit(&g, &q[3], 4); /* D: cancelled while queued */
        step(&g, c);
        step(&g, c); /* A's third token: the callback stops it */
        sched_get_stats(g.s, &st);
        CHECK(c->rec[1][0].n_done == 1 && c->rec[1][0].why == SCHED_FINISH_STOPPED && c->rec[1][0].n == 3,
              "A: done %d, %s, %d tokens", c->rec[1][0].n_done, sched_finish_name(c->rec[1][0].why), c->rec[1][0].n);
        CHECK(st.running == 1 && st.queued == 2, "after the stop: running %d queued %d", st.running, st.queued);
        step(&g, c); /* C takes A's slot at once */
        sched_get_stats(g.s, &st);
        CHECK(st.running == 2 && st.queued == 1 && c->rec[3][0].n == 1, "after the next step: running %d queued %d, C has %d",
              st.running, st.queued, c->rec[3][0].n);

        r = request_of(&q[2], 3);
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_ESTATE, "a live id accepted twice");
        sched_cancel(g.s, 4);
        CHECK(c->rec[4][0].n_done == 1 && c->rec[4][0].why == SCHED_FINISH_CANCELLED && c->rec[4][0].n == 0,
              "queued D: done %d, %s", c->rec[4][0].n_done, sched_finish_name(c->rec[4][0].why));
        int b_tokens = c->rec[2][0].n;
        sched_cancel(g.s, 2);
        CHECK(c->rec[2][0].n_done == 1 && c->rec[2][0].why == SCHED_FINISH_CANCELLED &&
              c->rec[2][0].usage.generated_tokens == b_tokens, "running B: done %d, %s",
              c->rec[2][0].n_done, sched_finish_name(c->rec[2][0].why));
        sched_get_stats(g.s, &st);
        CHECK(st.running == 1 && st.queued == 0, "after the cancels: running %d queued %d", st.running, st.queued);
        sched_cancel(g.s, 99); /* unknown: nothing */
        run_idle(&g, c);
        check_same("C after A stopped", 3, &c->rec[3][0], &alone->rec[2][0]);
        for (int i = 0; i < 3; i++)
            CHECK(c->rec[1][0].tok[i] == alone->rec[0][0].tok[i], "A's token %d differs", i);
        sched_get_stats(g.s, &st);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        CHECK_EQ_INT(st.running + st.queued, 0);

        /* refused requests */
        struct spec bad = q[0];
        r = request_of(&bad, 7);
        bad.prompt[2] = fx->n_vocab;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "vocabulary"), "token id %d: %s",
              fx->n_vocab, err);
        bad.prompt[2] = -1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL, "token id -1 accepted");
        bad = q[0];
        r = request_of(&bad, 7);
        r.n_prompt = CTX;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_ERANGE, "prompt of ctx tokens accepted");
        r.n_prompt = 0;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL, "empty prompt accepted");
        r = request_of(&bad, 7);
        r.n_seqs = 3;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "n_seqs"), "n_seqs 3 of 2 slots: %s", err);
        r = request_of(&bad, 7);
        r.max_tokens = 0;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL, "max_tokens 0 accepted");
        r = request_of(&bad, 7);
        r.sample.top_p = 0;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "top_p"), "top_p 0: %s", err);
        struct logit_bias lb = {fx->n_vocab + 5, 1.0f};
        r = request_of(&bad, 7);
        r.sample.bias = &lb;
        r.sample.n_bias = 1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL && strstr(err, "bias"), "bias token: %s", err);
        r = request_of(&bad, 7);
        r.logprobs = true;
        r.top_logprobs = SCHED_MAX_TOP_LOGPROBS + 1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == CAIRN_EINVAL, "top_logprobs 21 accepted");
        CHECK(sched_idle(g.s), "a refused request was queued");
        rig_close(&g);
    }
    CHECK_EQ_INT(c->misuse + alone->misuse, 0);
    free(c);
    free(alone);
}

/* ---- 7: chunked prefill ---- */

static void test_chunked_prefill(const struct fixture *fx)
{
    struct spec q[2];
    memset(q, 0, sizeof q);
    random_prompt(&q[0], 4, fx->n_vocab, 21);
    q[0].max_tokens = 30;
    q[0].sp = sampled(3);
    random_prompt(&q[1], 40, fx->n_vocab, 22);
    q[1].max_tokens = 6;
    q[1].sp = greedy();
    struct collector *c = collector_new(), *alone = collector_new();
    run_alone(fx, q, 2, alone);
    struct rig g;
    struct sched_config cfg = {.slots = 2, .chunk_tokens = 8};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        submit(&g, &q[0], 0);
        step(&g, c);
        CHECK(c->rec[0][0].n == 1, "A has %d tokens after its prompt step", c->rec[0][0].n);
        submit(&g, &q[1], 1);
        for (int k = 1; k <= 5; k++) {
            int a_before = c->rec[0][0].n;
            step(&g, c);
            struct sched_stats st;
            sched_get_stats(g.s, &st);
            CHECK(c->rec[0][0].n == a_before + 1, "step %d: A went from %d to %d tokens", k, a_before, c->rec[0][0].n);
            CHECK(st.last_batch == 9, "step %d: batch of %lld tokens, expected 1 decode + 8 prompt", k,
                  (long long)st.last_batch);
            CHECK(c->rec[1][0].n == (k == 5), "step %d: B has %d tokens", k, c->rec[1][0].n);
        }
        run_idle(&g, c);
        rig_close(&g);
    }
    check_same("chunked: decoding A", 0, &c->rec[0][0], &alone->rec[0][0]);
    check_same("chunked: prefilled B", 1, &c->rec[1][0], &alone->rec[1][0]);
    CHECK_EQ_INT(c->misuse + alone->misuse, 0);
    free(c);
    free(alone);
}

/* ---- 8: logprobs ---- */

/* log-softmax in double of the logits after the prompt (and `extra` generated tokens). */
static int reference_logprobs(const struct fixture *fx, const struct spec *q, double *lp)
{
    char err[512];
    struct kv_config kc = engine_kv_config(fx->m, CTX, 1, BT);
    struct kv_cache *kv = NULL;
    float *logits = malloc((size_t)fx->n_vocab * sizeof *logits);
    int32_t seq0[MAX_BATCH] = {0};
    int64_t pos[MAX_BATCH];
    int rc = -1;
    for (int i = 0; i < q->n_prompt; i++)
        pos[i] = i;
    uint8_t want[MAX_BATCH] = {0};
    want[q->n_prompt - 1] = 1;
    struct batch b = {.n = q->n_prompt, .token = q->prompt, .seq = seq0, .pos = pos, .logits = want};
    if (logits && kv_create(&kv, &kc, err, sizeof err) == 0 && engine_forward(fx->e, kv, &b, logits, err, sizeof err) == 0) {
        double max = -INFINITY, sum = 0;
        for (int i = 0; i < fx->n_vocab; i++)
            max = fmax(max, logits[i]);
        for (int i = 0; i < fx->n_vocab; i++)
            sum += exp((double)logits[i] - max);
        for (int i = 0; i < fx->n_vocab; i++)
            lp[i] = (double)logits[i] - max - log(sum);
        rc = 0;
    } else {
        fprintf(stderr, "reference_logprobs: %s\n", err);
    }
    kv_release(kv);
    free(logits);
    return rc;
}

/* Paced prompt chunks (chunk_tokens left to the scheduler: MAX_BATCH - slots = 60 here).
 * Prompts arriving beside a young stream (fewer than 4 tokens generated, sched.c's
 * SCHED_PACE_YOUNG) take the whole chunk, so a burst fills the batch in as few steps as
 * the chunk allows; once a stream has its 4 tokens, a step beside it is paced: nothing
 * decode-only was timed (every step here carries prompt tokens), so it takes the first
 * pace, 32 prompt tokens. Then two more arrive (a burst: three prompts wait beside one
 * old stream), and the share grows by waiting / decoding, 32 x 3 cut to the chunk. Counts
 * of tokens only, and every request's tokens equal its run alone. */
static void test_paced_burst(const struct fixture *fx)
{
    enum { N = 5, YOUNG = 4, PACE_FIRST = 32, CHUNK = MAX_BATCH - 4 };
    struct spec q[N];
    memset(q, 0, sizeof q);
    const int n_prompt[N] = {4, 100, 150, 60, 60};
    for (int i = 0; i < N; i++) {
        random_prompt(&q[i], n_prompt[i], fx->n_vocab, 950 + (uint64_t)i);
        q[i].max_tokens = i == 0 ? 40 : 3;
        q[i].sp = greedy();
    }
    struct collector *c = collector_new(), *alone = collector_new();
    run_alone(fx, q, N, alone);
    struct rig g;
    struct sched_config cfg = {.slots = 4};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        struct sched_stats st;
        submit(&g, &q[0], 0);
        step(&g, c); /* A's prompt alone: nothing decodes, the whole chunk is open to it */
        CHECK(c->rec[0][0].n == 1, "A has %d tokens after its prompt step", c->rec[0][0].n);
        submit(&g, &q[1], 1);
        submit(&g, &q[2], 2);
        /* B (100) and C (150) beside A while A is young: whole chunks, 60 + 40 | 20 + 60 */
        const int want_prompt[3] = {CHUNK, CHUNK, CHUNK}, want_decoding[3] = {1, 1, 2};
        for (int k = 0; k < 3; k++) {
            step(&g, c);
            sched_get_stats(g.s, &st);
            CHECK(st.last_decoding == want_decoding[k] && st.last_prompt == want_prompt[k],
                  "young step %d: %d decoding, %d prompt tokens (want %d, %d)", k, st.last_decoding,
                  st.last_prompt, want_decoding[k], want_prompt[k]);
        }
        CHECK(c->rec[0][0].n == YOUNG, "A has %d tokens, want %d", c->rec[0][0].n, YOUNG);
        step(&g, c); /* A has its 4 tokens: C's last 70 are paced beside it, 32 of them */
        sched_get_stats(g.s, &st);
        int left = n_prompt[2] - (3 * CHUNK - n_prompt[1]);
        int want = left < PACE_FIRST ? left : PACE_FIRST;
        CHECK(st.last_decoding == 2 && st.last_prompt == want, "settled: %d decoding, %d prompt tokens (want 2, %d)",
              st.last_decoding, st.last_prompt, want);
        /* B has its 3 tokens and is gone; D and E arrive: C, D and E wait beside A alone.
         * Every step still carries prompt tokens, so the pace is still the first one. */
        CHECK(c->rec[1][0].n == 3 && c->rec[2][0].n == 0, "before the burst B has %d tokens, C %d (want 3, 0)",
              c->rec[1][0].n, c->rec[2][0].n);
        submit(&g, &q[3], 3);
        submit(&g, &q[4], 4);
        step(&g, c);
        sched_get_stats(g.s, &st);
        want = PACE_FIRST * 3 < CHUNK ? PACE_FIRST * 3 : CHUNK;
        CHECK(st.last_decoding == 1 && st.last_prompt == want, "burst: %d decoding, %d prompt tokens (want 1, %d)",
              st.last_decoding, st.last_prompt, want);
        run_idle(&g, c);
        rig_close(&g);
    }
    for (int i = 0; i < N; i++)
        check_same("paced burst", i, &c->rec[i][0], &alone->rec[i][0]);
    CHECK_EQ_INT(c->misuse + alone->misuse, 0);
    free(alone);
    free(c);
}

static void test_logprobs(const struct fixture *fx)
{
    struct spec q = {0};
    random_prompt(&q, 11, fx->n_vocab, 808);
    q.max_tokens = 3;
    q.sp = greedy();
    double *lp = malloc((size_t)fx->n_vocab * sizeof *lp);
    struct collector *c = collector_new();
    if (!lp || reference_logprobs(fx, &q, lp)) {
        CHECK(0, "logprobs: no reference");
        free(lp);
        free(c);
        return;
    }
    int32_t argmax = 0;
    for (int i = 1; i < fx->n_vocab; i++)
        if (lp[i] > lp[argmax])
            argmax = i;
    /* The bias makes the 3rd most likely token win; its reported logprob stays the raw one. */
    struct rig g;
    struct sched_config cfg = {.slots = 2};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        struct sched_request r = request_of(&q, 1);
        r.logprobs = true;
        r.top_logprobs = 5;
        char err[512];
        CHECK(sched_submit(g.s, &r, err, sizeof err) == 0, "submit: %s", err);
        run_idle(&g, c);
        const struct sched_token *t = &c->rec[1][0].first;
        CHECK(t->token == argmax, "greedy token %d, argmax %d", t->token, argmax);
        CHECK(fabs(t->logprob - lp[argmax]) < 1e-5, "logprob %.9g vs float64 %.9g", t->logprob, lp[argmax]);
        CHECK(t->n_top == 5 && t->top_token[0] == argmax, "n_top %d, top %d", t->n_top, t->top_token[0]);
        for (int i = 0; i < t->n_top; i++) {
            CHECK(fabs(t->top_logprob[i] - lp[t->top_token[i]]) < 1e-5, "top %d: %.9g vs %.9g", i, t->top_logprob[i],
                  lp[t->top_token[i]]);
            if (i > 0)
                CHECK(t->top_logprob[i] <= t->top_logprob[i - 1], "top alternatives not sorted at %d", i);
        }
        /* nothing outside the top 5 is more likely than the 5th */
        int above = 0;
        for (int i = 0; i < fx->n_vocab; i++)
            above += lp[i] > lp[t->top_token[t->n_top - 1]];
        CHECK(above == t->n_top - 1, "%d tokens above the 5th alternative", above);

        int32_t third = t->top_token[2];
        struct logit_bias lb = {third, 100.0f};
        r.id = 2;
        r.sample.bias = &lb;
        r.sample.n_bias = 1;
        r.top_logprobs = 0;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == 0, "submit: %s", err);
        run_idle(&g, c);
        t = &c->rec[2][0].first;
        CHECK(t->token == third && fabs(t->logprob - lp[third]) < 1e-5 && t->n_top == 0,
              "biased: token %d (want %d), logprob %.9g vs raw %.9g, n_top %d", t->token, third, t->logprob, lp[third],
              t->n_top);
        rig_close(&g);
    }
    CHECK_EQ_INT(c->misuse, 0);
    free(lp);
    free(c);
}

/* ---- ends: eog, context, cache too small, engine failure ---- */

static void test_ends(const struct fixture *fx)
{
    char err[512];
    struct collector *c = collector_new();
    struct spec q = {0};
    random_prompt(&q, 20, fx->n_vocab, 4040);
    q.max_tokens = 40;
    q.sp = greedy();
    int32_t eos = tok_eos(fx->tok);
    CHECK(eos >= 0 && tok_is_eog(fx->tok, eos), "the vocabulary has no eos");

    struct rig g;
    struct sched_config cfg = {.slots = 2};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        /* an end-of-generation token ends the sequence unreported, unless ignore_eos */
        struct logit_bias lb = {eos, 100.0f};
        struct sched_request r = request_of(&q, 1);
        r.sample.bias = &lb;
        r.sample.n_bias = 1;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == 0, "submit: %s", err);
        r.id = 2;
        r.ignore_eos = true;
        r.max_tokens = 3;
        CHECK(sched_submit(g.s, &r, err, sizeof err) == 0, "submit: %s", err);
        run_idle(&g, c);
        CHECK(c->rec[1][0].why == SCHED_FINISH_STOP && c->rec[1][0].n == 0, "eos: %s after %d tokens",
              sched_finish_name(c->rec[1][0].why), c->rec[1][0].n);
        CHECK(c->rec[2][0].why == SCHED_FINISH_LENGTH && c->rec[2][0].n == 3 && c->rec[2][0].tok[2] == eos,
              "ignore_eos: %s after %d tokens", sched_finish_name(c->rec[2][0].why), c->rec[2][0].n);
        rig_close(&g);
    }

    /* the context ends generation: 20 + 4 = ctx 24 */
    struct collector *full = collector_new();
    run_alone(fx, &q, 1, full);
    CHECK(full->rec[0][0].n >= 13, "only %d tokens without limits", full->rec[0][0].n);
    cfg = (struct sched_config){.slots = 2, .ctx = 24};
    if (rig_open(&g, fx, NULL, cfg, 0, c) == 0) {
        submit(&g, &q, 3);
        run_idle(&g, c);
        const struct rec *r = &c->rec[3][0];
        CHECK(r->why == SCHED_FINISH_LENGTH && r->n == 4 && memcmp(r->tok, full->rec[0][0].tok, 4 * sizeof(int32_t)) == 0,
              "ctx 24: %s after %d tokens", sched_finish_name(r->why), r->n);
        rig_close(&g);
    }

    /* a cache of 2 blocks (32 positions): a 40-token prompt can never run (ERROR, and the
     * next request still runs); a 20-token prompt generates until 32 positions are full */
    cfg = (struct sched_config){.slots = 2};
    if (rig_open(&g, fx, NULL, cfg, 2, c) == 0) {
        struct spec big = {0};
        random_prompt(&big, 40, fx->n_vocab, 55);
        big.max_tokens = 4;
        big.sp = greedy();
        submit(&g, &big, 4);
        submit(&g, &q, 5);
        run_idle(&g, c);
        CHECK(c->rec[4][0].why == SCHED_FINISH_ERROR && strstr(c->rec[4][0].error, "blocks"), "unfit: %s (%s)",
              sched_finish_name(c->rec[4][0].why), c->rec[4][0].error);
        const struct rec *r = &c->rec[5][0];
        CHECK(r->why == SCHED_FINISH_LENGTH && r->n == 13 && memcmp(r->tok, full->rec[0][0].tok, 13 * sizeof(int32_t)) == 0,
              "cache full: %s after %d tokens", sched_finish_name(r->why), r->n);
        rig_close(&g);
    }

    /* an engine failure (its max_ctx below the scheduler's ctx) ends every live request */
    struct engine *short_e = NULL;
    struct engine_config ec = {.n_threads = 1, .max_batch = MAX_BATCH, .max_ctx = 16};
    CHECK(engine_create(&short_e, fx->m, &ec, err, sizeof err) == 0, "engine: %s", err);
    cfg = (struct sched_config){.slots = 1};
    if (short_e && rig_open(&g, fx, short_e, cfg, 0, c) == 0) {
        submit(&g, &q, 6);
        submit(&g, &q, 7);
        int rc = sched_step(g.s, err, sizeof err);
        CHECK(rc == CAIRN_EINVAL && strstr(err, "position"), "engine failure: %d (%s)", rc, err);
        CHECK(c->rec[6][0].why == SCHED_FINISH_ERROR && c->rec[7][0].why == SCHED_FINISH_ERROR &&
              c->rec[6][0].n_done == 1 && c->rec[7][0].n_done == 1 && strstr(c->rec[7][0].error, "position"),
              "after an engine failure: %s, %s", sched_finish_name(c->rec[6][0].why), sched_finish_name(c->rec[7][0].why));
        CHECK(sched_idle(g.s), "not idle after an engine failure");
        rig_close(&g);
    }
    engine_release(short_e);

    /* a done callback may submit: here the same id again */
    if (rig_open(&g, fx, NULL, (struct sched_config){.slots = 1}, 0, c) == 0) {
        struct spec shortq = q;
        shortq.max_tokens = 2;
        struct sched_request again = request_of(&shortq, 12);
        c->s = g.s;
        c->then_after = 12;
        c->then = &again;
        c->then_rc = -1;
        submit(&g, &shortq, 12);
        step(&g, c);
        step(&g, c);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK(c->then_rc == 0 && st.queued == 1 && c->rec[12][0].n_done == 1,
              "submit from a done callback: %d, %d queued", c->then_rc, st.queued);
        memset(&c->rec[12][0], 0, sizeof c->rec[12][0]);
        c->admitted[12] = 0; /* the same id, a new request */
        run_idle(&g, c);
        CHECK(c->rec[12][0].n == 2 && c->rec[12][0].n_done == 1, "resubmitted request: %d tokens", c->rec[12][0].n);
        rig_close(&g);
    }

    /* release cancels what is live */
    if (rig_open(&g, fx, NULL, (struct sched_config){.slots = 1}, 0, c) == 0) {
        submit(&g, &q, 8);
        submit(&g, &q, 9);
        step(&g, c);
        rig_close(&g);
        CHECK(c->rec[8][0].why == SCHED_FINISH_CANCELLED && c->rec[9][0].why == SCHED_FINISH_CANCELLED &&
              c->rec[8][0].n_done == 1 && c->rec[9][0].n_done == 1 && c->rec[8][0].n == 1,
              "release: %s, %s", sched_finish_name(c->rec[8][0].why), sched_finish_name(c->rec[9][0].why));
    }
    CHECK_EQ_INT(c->misuse + full->misuse, 0);
    free(c);
    free(full);
}

static void test_config(const struct fixture *fx)
{
    char err[512];
    struct kv_cache *kv = NULL;
    struct kv_config kc = engine_kv_config(fx->m, CTX, 3, BT);
    if (kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "kv: %s", err);
        return;
    }
    struct sched *s = NULL;
    struct sched_config bad[] = {
        {.slots = 0, .ctx = CTX},
        {.slots = MAX_BATCH + 1, .ctx = CTX},
        {.slots = 2, .ctx = 1},
        {.slots = 2, .ctx = CTX, .chunk_tokens = -1},
        {.slots = 2, .ctx = CTX, .cache_seqs = 2}, /* 4 sequence ids needed, the cache has 3 */
    };
    const char *names[] = {"slots", "max_batch", "ctx", "chunk_tokens", "sequence ids"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        int rc = sched_create(&s, fx->e, kv, &bad[i], NULL, err, sizeof err);
        CHECK(rc == CAIRN_EINVAL && !s && strstr(err, names[i]), "config %zu: %d (%s)", i, rc, err);
    }
    struct sched_config ok = {.slots = 2, .ctx = CTX, .cache_seqs = 1};
    CHECK(sched_create(&s, fx->e, kv, &ok, NULL, err, sizeof err) == 0, "config: %s", err);
    sched_release(s);
    sched_release(NULL);
    CHECK(sched_kv_seqs(&ok) == 3, "sched_kv_seqs %d", sched_kv_seqs(&ok));
    CHECK(strcmp(sched_finish_name(SCHED_FINISH_CANCELLED), "cancelled") == 0 && !sched_finish_name(SCHED_FINISH_COUNT) &&
          !sched_finish_name(-1), "finish names");
    CHECK(engine_max_batch(fx->e) == MAX_BATCH, "engine_max_batch %d", engine_max_batch(fx->e));
    kv_release(kv);
}

/* ---- 11: micro-batches in flight (lanes) ---- */

static int rig_open_lanes(struct rig *g, const struct fixture *fx, struct sched_config cfg, int lanes,
                          struct async_fwd *a, bool deferred, int64_t n_blocks, struct collector *c)
{
    async_fwd_init(a, fx->e, deferred);
    cfg.lanes = lanes;
    cfg.submit = async_submit;
    cfg.collect = async_collect;
    cfg.forward_ctx = a;
    int rc = rig_open(g, fx, NULL, cfg, n_blocks, c);
    a->kv = g->kv;
    return rc;
}

static void test_lanes(const struct fixture *fx)
{
    char err[512];
    /* Eight requests, greedy and sampled, over 2 and 3 lanes, immediate and deferred, in a
     * roomy cache and in one of 6 blocks (preemptions): each equals its run alone. */
    for (int sample = 0; sample < 2; sample++) {
        struct spec reqs[N_REQ];
        make_eight(fx, reqs, sample);
        struct collector *alone = collector_new();
        run_alone(fx, reqs, N_REQ, alone);
        for (int lanes = 2; lanes <= 3; lanes++)
            for (int deferred = 0; deferred < 3; deferred++) /* 2: deferred, answering asks */
                for (int small = 0; small < 2; small++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s, %d lanes, %s%s", sample ? "sampled" : "greedy", lanes,
                             deferred == 2 ? "asks" : deferred ? "deferred" : "immediate", small ? ", 6 blocks" : "");
                    struct collector *c = collector_new();
                    struct async_fwd a;
                    struct rig g;
                    struct sched_config cfg = {.slots = N_REQ};
                    if (deferred == 2)
                        cfg.asks = async_asks;
                    if (rig_open_lanes(&g, fx, cfg, lanes, &a, deferred, small ? 6 : 0, c) == 0) {
                        for (int i = 0; i < N_REQ; i++)
                            submit(&g, &reqs[i], (uint64_t)i);
                        run_idle(&g, c);
                        struct sched_stats st;
                        sched_get_stats(g.s, &st);
                        CHECK(a.max_in_flight == lanes, "%s: at most %d batches in flight", what, a.max_in_flight);
                        CHECK(a.max_seqs <= (N_REQ + lanes - 1) / lanes, "%s: a batch held %d sequences", what,
                              a.max_seqs);
                        CHECK(a.submits == a.collects && a.submits == st.steps, "%s: %d submits, %d collects, "
                              "%lld steps", what, a.submits, a.collects, (long long)st.steps);
                        CHECK(!small || st.preemptions > 0, "%s: no preemption", what);
                        CHECK(deferred < 2 || (a.asks_calls == a.submits && a.sampled == st.generated_tokens),
                              "%s: %d asks for %d submits, %d rows sampled for %lld tokens", what, a.asks_calls,
                              a.submits, a.sampled, (long long)st.generated_tokens);
                        CHECK_EQ_INT(st.kv_blocks_used, 0);
                        CHECK_EQ_INT(a.misuse, 0);
                        rig_close(&g);
                    }
                    async_fwd_free(&a);
                    for (int i = 0; i < N_REQ; i++)
                        check_same(what, i, &c->rec[i][0], &alone->rec[i][0]);
                    CHECK_EQ_INT(c->misuse, 0);
                    free(c);
                }
        free(alone);
    }

    /* n_seqs 3 beside two others over 2 lanes: the fork waits for its prompt's batch. */
    struct spec three, one[3], others[2];
    make_forked(fx, &three, one, others);
    struct collector *alone = collector_new(), *alone_others = collector_new(), *c = collector_new();
    run_alone(fx, one, 3, alone);
    run_alone(fx, others, 2, alone_others);
    struct async_fwd a;
    struct rig g;
    struct sched_config cfg = {.slots = 5};
    if (rig_open_lanes(&g, fx, cfg, 2, &a, true, 0, c) == 0) {
        submit(&g, &others[0], 0);
        submit(&g, &three, 5);
        submit(&g, &others[1], 1);
        run_idle(&g, c);
        CHECK_EQ_INT(a.misuse, 0);
        rig_close(&g);
    }
    async_fwd_free(&a);
    for (int i = 0; i < 3; i++)
        check_same("n_seqs 3 over 2 lanes", i, &c->rec[5][i], &alone->rec[i][0]);
    for (int i = 0; i < 2; i++)
        check_same("beside n_seqs 3 over 2 lanes", i, &c->rec[i][0], &alone_others->rec[i][0]);

    /* Cancel while in flight: the cancelled request is done at once, its batch's results
     * are dropped when collected, the others go on unchanged and every block comes back. */
    memset(c, 0, sizeof *c);
    if (rig_open_lanes(&g, fx, cfg, 2, &a, false, 0, c) == 0) {
        submit(&g, &others[0], 0);
        submit(&g, &others[1], 1);
        for (int i = 0; i < 6; i++)
            step(&g, c);
        CHECK(a.count > 0, "cancel: nothing in flight after 6 steps");
        sched_cancel(g.s, 1);
        CHECK(c->rec[1][0].n_done == 1 && c->rec[1][0].why == SCHED_FINISH_CANCELLED, "cancel in flight: %d done",
              c->rec[1][0].n_done);
        int n_cancelled = c->rec[1][0].n;
        run_idle(&g, c);
        CHECK_EQ_INT(c->rec[1][0].n, n_cancelled);
        CHECK_EQ_INT(c->rec[1][0].n_done, 1);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        CHECK_EQ_INT(a.misuse, 0);
        rig_close(&g);
    }
    async_fwd_free(&a);
    check_same("beside a request cancelled in flight", 0, &c->rec[0][0], &alone_others->rec[0][0]);
    for (int k = 0; k < c->rec[1][0].n; k++)
        CHECK(c->rec[1][0].tok[k] == alone_others->rec[1][0].tok[k], "cancelled request: token %d differs", k);

    /* A failed collect finishes everything live as ERROR; the batch still in flight is
     * collected later and ignored; the scheduler then serves new requests as before. */
    memset(c, 0, sizeof *c);
    if (rig_open_lanes(&g, fx, cfg, 2, &a, false, 0, c) == 0) {
        a.fail_collect = 3;
        submit(&g, &others[0], 0);
        submit(&g, &others[1], 1);
        int failures = 0;
        for (int i = 0; i < 50 && !sched_idle(g.s); i++) {
            c->steps++;
            failures += sched_step(g.s, err, sizeof err) < 0;
        }
        CHECK(failures == 1 && strstr(err, "injected failure"), "failed collect: %d failures (%s)", failures, err);
        for (int i = 0; i < 2; i++)
            CHECK(c->rec[i][0].n_done == 1 && c->rec[i][0].why == SCHED_FINISH_ERROR &&
                  strstr(c->rec[i][0].error, "injected"), "failed collect: request %d finished %s", i,
                  sched_finish_name(c->rec[i][0].why));
        CHECK(sched_idle(g.s) && a.count == 0, "failed collect: still %d in flight", a.count);
        struct sched_stats st;
        sched_get_stats(g.s, &st);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        submit(&g, &others[0], 2);
        run_idle(&g, c);
        CHECK_EQ_INT(a.misuse, 0);
        rig_close(&g);
    }
    async_fwd_free(&a);
    check_same("after a failed collect", 2, &c->rec[2][0], &alone_others->rec[0][0]);
    CHECK_EQ_INT(alone->misuse + alone_others->misuse + c->misuse, 0);
    free(alone);
    free(alone_others);
    free(c);

    /* Config: lanes out of range, or without both halves. */
    struct kv_cache *kv = NULL;
    struct kv_config kc = engine_kv_config(fx->m, CTX, 2, BT);
    if (kv_create(&kv, &kc, err, sizeof err) == 0) {
        struct sched *s = NULL;
        struct sched_config bad1 = {.slots = 2, .ctx = CTX, .lanes = SCHED_MAX_LANES + 1,
                                    .submit = async_submit, .collect = async_collect};
        struct sched_config bad2 = {.slots = 2, .ctx = CTX, .lanes = 2, .submit = async_submit};
        CHECK(sched_create(&s, fx->e, kv, &bad1, NULL, err, sizeof err) == CAIRN_EINVAL && strstr(err, "lanes"),
              "lanes %d accepted", SCHED_MAX_LANES + 1);
        CHECK(sched_create(&s, fx->e, kv, &bad2, NULL, err, sizeof err) == CAIRN_EINVAL && strstr(err, "collect"),
              "lanes without collect accepted");
        kv_release(kv);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    struct fixture fx;
    if (fixture_open(&fx)) {
        CHECK(0, "cannot build the test model");
        return test_main_end();
    }
    RUN(test_config, &fx);
    RUN(test_batch_equals_alone, &fx, false);
    RUN(test_batch_equals_alone, &fx, true);
    RUN(test_preemption, &fx);
    RUN(test_prefix_reuse, &fx);
    RUN(test_n_seqs, &fx);
    RUN(test_stop_cancel_limits, &fx);
    RUN(test_chunked_prefill, &fx);
    RUN(test_paced_burst, &fx);
    RUN(test_logprobs, &fx);
    RUN(test_ends, &fx);
    RUN(test_lanes, &fx);
    fixture_close(&fx);
    return test_main_end();
}
