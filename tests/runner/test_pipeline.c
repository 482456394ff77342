/* Pipeline-parallel inference in one process: ranks as threads, joined in a ring by the
 * data plane over 127.0.0.1, each with its own slice of a synthetic model (llama "tiny"
 * and a small qwen2) and its own KV cache; rank 0 runs the scheduler with
 * pipeline_forward as its target forward. Asserted: the tokens of a 2-rank and a 3-rank
 * pipeline equal those of a single-slice scheduler on the same file, for one request
 * alone, 8 concurrent requests and a second round reusing their prompts (prefix cache),
 * greedy and sampled with a fixed seed, with and without a draft model on rank 0, and
 * with a KV cache small enough to preempt; after every step every rank's cache equals
 * rank 0's block for block; an engine error on rank 1 fails the step with its message
 * and the pipeline goes on; a rank that stops answering fails the step after timeout_ms
 * and the late result is dropped; a rank whose links close makes the next step fail
 * with CAIRN_EIO within a bounded time, every request ends with an error and the
 * pipeline stays down; bad configs are refused. F16 and Q8_0 on the wire run and
 * report how many tokens match. With asks (sched_config.asks, the default here) the last
 * rank samples: tokens, probabilities and log-probabilities (top 0..20) are bit for bit
 * the single-slice scheduler's, with penalties, logit bias and 2-3 sequences per
 * request, greedy and sampled, with drafts; rows sampled remotely cost rank 0 a few
 * bytes (checked against n_vocab * 4); rank 0 sampling everything still works. Requests
 * under a grammar (every other one) give the single slice's tokens too, greedy and
 * sampled, with micro-batches and with a draft: their rows come back as logits and rank 0
 * samples them under the mask. */
#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "runner/dataplane.h"
#include "runner/pipeline.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"
#include "tok/grammar.h"
#include "tok/tok.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BATCH 64
#define CTX 128
#define BT 16
#define SLOTS 8
#define CACHE_SEQS 8
#define MAX_W 3
#define MAX_GEN 24
#define MAX_IDS 64  /* request id + N_SUITE * sequence index */
#define N_SUITE 17 /* requests of a suite: 1 alone, 8 concurrent, 8 reusing their prompts */
#define K_DRAFT 3

/* ---- models ---- */

enum { M_LLAMA, M_DRAFT, M_QWEN, N_MODELS };
static const char *const model_names[N_MODELS] = {"llama tiny", "llama draft", "qwen2"};

struct fixture {
    char dir[64], path[N_MODELS][96];
    struct model *m[N_MODELS];   /* whole models */
    struct engine *e[N_MODELS];
};

static int write_models(struct fixture *fx, char *err, size_t errlen)
{
    struct synth_spec t;
    memset(&t, 0, sizeof t);
    synth_shape("tiny", &t);
    snprintf(t.type, sizeof t.type, "q8_0");
    t.seed = 7;
    t.scale_from = 2;
    t.out_scale = 0.3f; /* the draft of its first 2 layers agrees often, not always */
    struct synth_spec q = {.arch = "qwen2", .n_layers = 4, .n_embd = 128, .n_ff = 256, .n_head = 4, .n_head_kv = 2,
                           .head_dim = 32, .n_ctx = 256, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                           .type = "q8_0", .seed = 5, .vocab_size = 400};
    int rc;
    if ((rc = synth_write(&t, test_data_path("vocab/ggml-vocab-llama-spm.gguf"), fx->path[M_LLAMA], err, errlen)) ||
        (rc = synth_write_draft(fx->path[M_LLAMA], 2, fx->path[M_DRAFT], err, errlen)) ||
        (rc = synth_write(&q, NULL, fx->path[M_QWEN], err, errlen)))
        return rc;
    return 0;
}

static int fixture_open(struct fixture *fx)
{
    char err[512];
    memset(fx, 0, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/cairn-test-pipeline-XXXXXX");
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
        struct engine_config ec = {.n_threads = 1, .max_batch = MAX_BATCH, .max_ctx = CTX};
        if (model_load(&fx->m[i], fx->path[i], NULL, err, sizeof err) ||
            engine_create(&fx->e[i], fx->m[i], &ec, err, sizeof err)) {
            fprintf(stderr, "fixture: %s: %s\n", model_names[i], err);
            return -1;
        }
    }
    return 0;
}

static void fixture_close(struct fixture *fx)
{
    for (int i = 0; i < N_MODELS; i++) {
        engine_release(fx->e[i]);
        model_release(fx->m[i]);
        unlink(fx->path[i]);
    }
    rmdir(fx->dir);
}

/* ---- a ring of ranks ---- */

struct rank {
    int rank;
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct dp_listener *l;
    struct dp_conn *next, *prev;
    struct pipeline *p;
    pthread_t th;
    bool running;
    atomic_int stop, hang, die;
    int exit_rc;              /* what ended its serve loop (0: told to stop) */
    _Atomic int64_t t_exit;   /* clock_ns when it closed its links */
    char exit_err[512];
};

struct ring {
    int W;
    struct rank r[MAX_W];
    int compared, mismatches; /* mirror checks after each step */
    int lanes;
    int in_flight, max_in_flight; /* steps submitted and not collected (lanes) */
    bool asks;                    /* the last rank samples what it can (sched_config.asks) */
};

struct ring_opts {
    int W;
    int ends[MAX_W];     /* layer_end of each rank's slice */
    int wire_dtype;
    int timeout_ms;
    int64_t n_blocks;    /* 0: engine_kv_config's */
    int r1_max_batch;    /* rank 1's engine (0: MAX_BATCH) */
    int lanes;           /* the scheduler's micro-batches in flight (0, 1: one step at a time) */
    bool rank0_samples;  /* no asks: every wanted row comes back as logits */
};

static struct dp_config link_config(int rank, int peer, int W)
{
    return (struct dp_config){.instance_id = "pipeline-test", .epoch = 1, .model_id = "synth",
                              .secret = "pipeline test secret", .rank = rank, .peer_rank = peer,
                              .max_inflight = rank == 0 && peer == 1 ? W : 0, .close_linger_ms = 200};
}

struct acceptor {
    struct dp_listener *l;
    struct dp_config cfg;
    struct dp_conn *c;
    int rc;
    char err[256];
};

static void *accept_main(void *arg)
{
    struct acceptor *a = arg;
    a->rc = dp_accept(a->l, &a->cfg, 5000, &a->c, a->err, sizeof a->err);
    return NULL;
}

/* A rank's process: serves until told to stop; a rank whose pipeline ends, or that is
 * killed, exits, which closes both its links (as a runner process would). */
static void *serve_main(void *arg)
{
    struct rank *k = arg;
    char err[512];
    while (!atomic_load(&k->stop)) {
        if (atomic_load(&k->die)) {
            snprintf(k->exit_err, sizeof k->exit_err, "killed");
            break;
        }
        if (atomic_load(&k->hang)) {
            usleep(5000);
            continue;
        }
        int rc = pipeline_serve(k->p, 50, err, sizeof err);
        if (rc < 0) {
            k->exit_rc = rc;
            snprintf(k->exit_err, sizeof k->exit_err, "%s", err);
            break;
        }
    }
    if (!atomic_load(&k->stop)) {
        atomic_store(&k->t_exit, clock_ns());
        pipeline_release(k->p);
        k->p = NULL;
        dp_close(k->next, k->exit_err); /* the reason travels on: rank 0 names the first rank that failed */
        dp_close(k->prev, k->exit_err);
        k->next = k->prev = NULL;
    }
    return NULL;
}

static void ring_stop(struct ring *g)
{
    for (int r = 1; r < g->W; r++) {
        atomic_store(&g->r[r].stop, 1);
        if (g->r[r].running)
            pthread_join(g->r[r].th, NULL);
        g->r[r].running = false;
    }
}

static void ring_close(struct ring *g)
{
    ring_stop(g);
    for (int r = 0; r < g->W; r++) {
        struct rank *k = &g->r[r];
        pipeline_release(k->p);
        dp_close(k->next, NULL);
        dp_close(k->prev, NULL);
        kv_release(k->kv);
        engine_release(k->e);
        model_release(k->m);
        dp_listener_close(k->l);
    }
    memset(g, 0, sizeof *g);
}

static int ring_open(struct ring *g, const char *path, const struct ring_opts *o)
{
    char err[512];
    memset(g, 0, sizeof *g);
    g->W = o->W;
    struct sched_config sc = {.slots = SLOTS, .cache_seqs = CACHE_SEQS};
    for (int r = 0; r < o->W; r++) {
        struct rank *k = &g->r[r];
        k->rank = r;
        struct model_load_opts mo = {.layer_begin = r ? o->ends[r - 1] : 0, .layer_end = o->ends[r]};
        struct engine_config ec = {.n_threads = 1, .max_batch = r == 1 && o->r1_max_batch ? o->r1_max_batch : MAX_BATCH,
                                   .max_ctx = CTX};
        if (model_load(&k->m, path, &mo, err, sizeof err) || engine_create(&k->e, k->m, &ec, err, sizeof err))
            goto fail;
        struct kv_config kc = engine_kv_config(k->m, CTX, sched_kv_seqs(&sc), BT);
        if (o->n_blocks)
            kc.n_blocks = o->n_blocks;
        if (kv_create(&k->kv, &kc, err, sizeof err) || dp_listen(&k->l, "127.0.0.1", 0, err, sizeof err))
            goto fail;
    }
    struct acceptor acc[MAX_W];
    pthread_t ath[MAX_W];
    for (int r = 0; r < o->W; r++) {
        acc[r] = (struct acceptor){.l = g->r[r].l, .cfg = link_config(r, (r - 1 + o->W) % o->W, o->W)};
        pthread_create(&ath[r], NULL, accept_main, &acc[r]);
    }
    int crc = 0;
    for (int r = 0; r < o->W && !crc; r++) {
        struct dp_config cc = link_config(r, (r + 1) % o->W, o->W);
        crc = dp_connect(&g->r[r].next, "127.0.0.1", dp_listener_port(g->r[(r + 1) % o->W].l), &cc, 5000, err,
                         sizeof err);
    }
    for (int r = 0; r < o->W; r++) {
        pthread_join(ath[r], NULL);
        g->r[r].prev = acc[r].c;
        if (acc[r].rc != 1 && !crc) {
            snprintf(err, sizeof err, "accept on rank %d: %s", r, acc[r].err);
            crc = -1;
        }
    }
    if (crc)
        goto fail;
    for (int r = 0; r < o->W; r++) {
        struct rank *k = &g->r[r];
        struct pipeline_config pc = {.rank = r, .world_size = o->W, .e = k->e, .kv = k->kv, .next = k->next,
                                     .prev = k->prev, .wire_dtype = o->wire_dtype, .timeout_ms = o->timeout_ms};
        if (pipeline_create(&k->p, &pc, err, sizeof err))
            goto fail;
    }
    for (int r = 1; r < o->W; r++) {
        pthread_create(&g->r[r].th, NULL, serve_main, &g->r[r]);
        g->r[r].running = true;
    }
    return 0;
fail:
    CHECK(0, "ring of %d: %s", o->W, err);
    ring_close(g);
    return -1;
}

/* Every sequence's length and block table, every block's refs and the free count of a
 * and b are equal. */
static bool same_cache(const struct kv_cache *a, const struct kv_cache *b, char *why, size_t wl)
{
    const struct kv_config *c = kv_config(a);
    for (int s = 0; s < c->max_seqs; s++) {
        int64_t na, nb;
        const int32_t *ta = kv_seq_blocks(a, s, &na), *tb = kv_seq_blocks(b, s, &nb);
        if (kv_seq_len(a, s) != kv_seq_len(b, s) || na != nb || memcmp(ta, tb, (size_t)na * sizeof *ta)) {
            snprintf(why, wl, "sequence %d: length %lld/%lld, %lld/%lld blocks", s, (long long)kv_seq_len(a, s),
                     (long long)kv_seq_len(b, s), (long long)na, (long long)nb);
            return false;
        }
    }
    for (int32_t blk = 0; blk < c->n_blocks; blk++)
        if (kv_block_refs(a, blk) != kv_block_refs(b, blk)) {
            snprintf(why, wl, "block %d: refs %d/%d", blk, kv_block_refs(a, blk), kv_block_refs(b, blk));
            return false;
        }
    if (kv_free_blocks(a) != kv_free_blocks(b)) {
        snprintf(why, wl, "free blocks %lld/%lld", (long long)kv_free_blocks(a), (long long)kv_free_blocks(b));
        return false;
    }
    return true;
}

/* Each rank's cache against rank 0's, once every step sent has gone through every rank
 * (which all wait for the next frame then). */
static void compare_caches(struct ring *g)
{
    for (int r = 1; r < g->W; r++) {
        char why[160];
        g->compared++;
        if (!same_cache(g->r[0].kv, g->r[r].kv, why, sizeof why)) {
            if (g->mismatches++ == 0)
                fprintf(stderr, "rank %d's cache differs from rank 0's: %s\n", r, why);
        }
    }
}

/* The scheduler's target forward: pipeline_forward, then the caches compared. */
static int ring_forward(void *ctx, struct kv_cache *kv, const struct batch *b, float *logits, char *err,
                        size_t errlen)
{
    struct ring *g = ctx;
    int rc = pipeline_forward(g->r[0].p, kv, b, logits, err, errlen);
    if (!rc)
        compare_caches(g);
    return rc;
}

/* With lanes: the two halves, the caches compared whenever nothing is in flight. */
static int ring_submit(void *ctx, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen)
{
    struct ring *g = ctx;
    int rc = pipeline_submit(g->r[0].p, kv, b, err, errlen);
    if (!rc && ++g->in_flight > g->max_in_flight)
        g->max_in_flight = g->in_flight;
    return rc;
}

static int ring_collect(void *ctx, float *logits, char *err, size_t errlen)
{
    struct ring *g = ctx;
    int rc = pipeline_collect(g->r[0].p, logits, err, errlen);
    if (--g->in_flight == 0 && !rc && pipeline_queued_ops(g->r[0].p) == 0)
        compare_caches(g);
    return rc;
}

static int ring_asks(void *ctx, const struct sched_ask *ask, int n, struct sched_token *answer, char *err,
                     size_t errlen)
{
    struct ring *g = ctx;
    return pipeline_asks(g->r[0].p, ask, n, answer, err, errlen);
}

/* ---- requests and what the callbacks saw ---- */

struct req {
    int32_t prompt[64];
    int n_prompt, max_tokens, num_draft;
    struct sample_params sp;
    int n_seqs;              /* 0: 1 */
    bool logprobs;
    int top_logprobs;
    struct logit_bias bias[4];
    struct grammar_ctx *grammar; /* constrained decoding, or NULL */
};

/* What one sequence (request id + N_SUITE * its index) was told. */
struct rec {
    int n, n_done;
    int32_t tok[MAX_GEN];
    uint64_t digest;         /* of every field of every token reported (logprobs included) */
    enum sched_finish why;
    char error[512];
};

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

struct collector {
    struct rec rec[MAX_IDS];
    atomic_int *kill_at_flag; /* set to 1 once kill_at tokens were generated in all */
    int kill_at, total;
};

static int on_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    struct collector *c = ctx;
    id += (uint64_t)seq * N_SUITE;
    if (id >= MAX_IDS || index != c->rec[id].n || c->rec[id].n >= MAX_GEN)
        return 1;
    c->rec[id].tok[c->rec[id].n++] = t->token;
    uint64_t h = c->rec[id].digest ? c->rec[id].digest : 0xcbf29ce484222325ull;
    h = mix(h, &t->token, sizeof t->token);
    h = mix(h, &t->prob, sizeof t->prob);
    h = mix(h, &t->logprob, sizeof t->logprob);
    h = mix(h, &t->n_top, sizeof t->n_top);
    h = mix(h, t->top_token, (size_t)t->n_top * sizeof t->top_token[0]);
    c->rec[id].digest = mix(h, t->top_logprob, (size_t)t->n_top * sizeof t->top_logprob[0]);
    if (c->kill_at_flag && ++c->total == c->kill_at)
        atomic_store(c->kill_at_flag, 1);
    return 0;
}

static void on_done(void *ctx, uint64_t id, int seq, enum sched_finish why, const struct sched_usage *u,
                    const char *error)
{
    struct collector *c = ctx;
    (void)u;
    id += (uint64_t)seq * N_SUITE;
    if (id >= MAX_IDS)
        return;
    c->rec[id].n_done++;
    c->rec[id].why = why;
    snprintf(c->rec[id].error, sizeof c->rec[id].error, "%s", error ? error : "");
}

static void random_prompt(struct req *q, int n, int n_vocab, uint64_t seed)
{
    q->n_prompt = n;
    for (int i = 0; i < n; i++)
        q->prompt[i] = (int32_t)(3 + test_rand_u64(&seed) % (uint64_t)(n_vocab - 3));
}

/* The suite's requests: 0 alone, 1..8 concurrently with prompts of 4..40 tokens, 9..16
 * the prompts of 1..8 again (odd: the same, even: 3 tokens longer). */
static void make_suite(struct req *q, int n_vocab, bool sampled, int num_draft)
{
    memset(q, 0, N_SUITE * sizeof *q);
    for (int i = 0; i < N_SUITE; i++) {
        if (i <= 8) {
            random_prompt(&q[i], i == 0 ? 9 : 4 + (i * 13) % 37, n_vocab, 1000 + (uint64_t)i);
        } else {
            q[i] = q[i - 8];
            if (i % 2 == 0) {
                uint64_t seed = 77 + (uint64_t)i;
                for (int j = 0; j < 3; j++)
                    q[i].prompt[q[i].n_prompt++] = (int32_t)(3 + test_rand_u64(&seed) % (uint64_t)(n_vocab - 3));
            }
        }
        q[i].max_tokens = 12 + (i * 5) % 13;
        q[i].num_draft = num_draft;
        q[i].sp = sample_defaults();
        if (sampled) {
            q[i].sp.temperature = 0.9f;
            q[i].sp.seed = 4242 + (uint64_t)i;
        } else {
            q[i].sp.temperature = 0;
        }
    }
}

/* make_suite's requests with what the last rank must sample alike: log-probabilities
 * (0..20 alternatives), repetition, presence and frequency penalties over windows of
 * 16, all and 3 tokens, logit bias, and 2 or 3 sequences per request. */
static void make_rich_suite(struct req *q, int n_vocab, bool sampled, int num_draft)
{
    make_suite(q, n_vocab, sampled, num_draft);
    for (int i = 0; i < N_SUITE; i++) {
        struct sample_params *p = &q[i].sp;
        switch (i % 4) {
        case 1:
            q[i].logprobs = true;
            q[i].top_logprobs = i % 6;
            p->repeat_penalty = 1.3f;
            p->penalty_last_n = 16;
            break;
        case 2:
            q[i].logprobs = true;
            q[i].top_logprobs = SCHED_MAX_TOP_LOGPROBS;
            p->presence_penalty = 0.5f;
            p->frequency_penalty = 0.3f;
            p->penalty_last_n = -1;
            break;
        case 3:
            q[i].bias[0] = (struct logit_bias){.token = q[i].prompt[0], .bias = 4.0f};
            q[i].bias[1] = (struct logit_bias){.token = 7, .bias = -100.0f};
            p->n_bias = 2;
            q[i].n_seqs = 2;
            p->repeat_penalty = 0.9f;
            p->penalty_last_n = 3;
            break;
        default:
            q[i].n_seqs = i == 0 ? 1 : 3;
            q[i].logprobs = true;
            q[i].top_logprobs = 2;
        }
    }
}

static void submit(struct sched *s, const struct req *q, uint64_t id)
{
    char err[512];
    struct sched_request r = {.id = id, .prompt = q->prompt, .n_prompt = q->n_prompt, .max_tokens = q->max_tokens,
                              .n_seqs = q->n_seqs ? q->n_seqs : 1, .sample = q->sp, .num_draft_tokens = q->num_draft,
                              .logprobs = q->logprobs, .top_logprobs = q->top_logprobs,
                              .grammar = q->grammar};
    r.sample.bias = r.sample.n_bias ? q->bias : NULL;
    CHECK(sched_submit(s, &r, err, sizeof err) == 0, "submit %llu: %s", (unsigned long long)id, err);
}

/* Steps until idle; returns the first failure (0: none) with its message in err. */
static int run_idle(struct sched *s, char *err, size_t errlen)
{
    int first = 0;
    char e[512];
    for (int i = 0; i < 5000 && !sched_idle(s); i++) {
        int rc = sched_step(s, e, sizeof e);
        if (rc < 0 && !first) {
            first = rc;
            snprintf(err, errlen, "%s", e);
        }
    }
    CHECK(sched_idle(s), "scheduler not idle after 5000 steps");
    return first;
}

/* Runs the suite: request 0 alone, then 1..8 at once, then 9..16 at once. */
static void run_suite(struct sched *s, const struct req *q)
{
    char err[512];
    int groups[4] = {0, 1, 9, N_SUITE};
    for (int g = 0; g < 3; g++) {
        for (int i = groups[g]; i < groups[g + 1]; i++)
            submit(s, &q[i], (uint64_t)i);
        int rc = run_idle(s, err, sizeof err);
        CHECK(rc == 0, "suite group %d: %s", g, err);
    }
}

struct setup {
    int model;
    bool draft;      /* a draft model on rank 0 (and on the reference) */
    int64_t n_blocks;
};

/* A scheduler over (a) the whole model or (b) rank 0 of ring g. */
static struct sched *sched_open(const struct fixture *fx, const struct setup *su, struct ring *g,
                                struct kv_cache **kv_out, struct kv_cache **dkv_out, struct collector *c)
{
    char err[512];
    /* A fixed chunk: the scheduler paces a chunk it chooses by timing, and a sampled
     * request's tokens with a draft depend on the schedule. */
    struct sched_config cfg = {.slots = SLOTS, .ctx = CTX, .cache_seqs = CACHE_SEQS, .chunk_tokens = MAX_BATCH - SLOTS};
    struct engine *e = fx->e[su->model];
    struct kv_cache *kv = NULL;
    if (g) {
        cfg.forward_ctx = g;
        if (g->lanes > 1) {
            cfg.lanes = g->lanes;
            cfg.submit = ring_submit;
            cfg.collect = ring_collect;
        } else {
            cfg.forward = ring_forward;
        }
        if (g->asks)
            cfg.asks = ring_asks;
        e = g->r[0].e;
        kv = g->r[0].kv;
    } else {
        struct kv_config kc = engine_kv_config(fx->m[su->model], CTX, sched_kv_seqs(&cfg), BT);
        if (su->n_blocks)
            kc.n_blocks = su->n_blocks;
        if (kv_create(&kv, &kc, err, sizeof err)) {
            CHECK(0, "kv: %s", err);
            return NULL;
        }
    }
    *kv_out = g ? NULL : kv;
    *dkv_out = NULL;
    struct sched_callbacks cb = {.token = on_token, .done = on_done, .ctx = c};
    struct sched *s = NULL;
    if (sched_create(&s, e, kv, &cfg, &cb, err, sizeof err)) {
        CHECK(0, "sched: %s", err);
        return NULL;
    }
    if (su->draft) {
        struct kv_config dc = engine_kv_config(fx->m[M_DRAFT], CTX, SLOTS, BT);
        if (kv_create(dkv_out, &dc, err, sizeof err) ||
            sched_set_draft(s, fx->e[M_DRAFT], *dkv_out, K_DRAFT, err, sizeof err))
            CHECK(0, "draft: %s", err);
    }
    return s;
}

static void sched_close(struct sched *s, struct kv_cache *kv, struct kv_cache *dkv)
{
    sched_release(s);
    kv_release(kv);
    kv_release(dkv);
}

/* Sequences 0..n-1 of the suite (and the further sequences of its requests, where
 * any): the same tokens, with the same probabilities and log-probabilities. */
static int compare(const char *label, const struct collector *want, const struct collector *got, int n)
{
    int bad = 0;
    for (int i = 0; i < MAX_IDS; i++) {
        const struct rec *a = &want->rec[i], *b = &got->rec[i];
        if (i >= n && a->n_done == 0 && b->n_done == 0)
            continue;
        bool same = a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof a->tok[0]) && a->why == b->why &&
                    a->n_done == 1 && b->n_done == 1 && a->why != SCHED_FINISH_ERROR && a->digest == b->digest;
        if (!same && bad++ < 3) {
            fprintf(stderr, "%s: request %d differs (%s %d tokens, done %d / %s %d tokens, done %d %s)\n", label, i,
                    sched_finish_name(a->why), a->n, a->n_done, sched_finish_name(b->why), b->n, b->n_done, b->error);
            for (int j = 0; j < a->n || j < b->n; j++)
                fprintf(stderr, "  %d: %d %d\n", j, j < a->n ? a->tok[j] : -1, j < b->n ? b->tok[j] : -1);
        }
    }
    return bad;
}

/* ---- equality of tokens ---- */

/* The reference: a single-slice scheduler on the whole model. */
static struct collector *reference(const struct fixture *fx, const struct setup *su, const struct req *q,
                                   struct sched_stats *st)
{
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, su, NULL, &kv, &dkv, c) : NULL;
    if (!s)
        return c;
    run_suite(s, q);
    sched_get_stats(s, st);
    sched_close(s, kv, dkv);
    return c;
}

static void check_pipeline(const struct fixture *fx, const struct setup *su, const struct req *q,
                           const struct collector *ref, const struct ring_opts *o, const char *label)
{
    int n_vocab = fx->m[su->model]->hp.n_vocab;
    const char *only = getenv("CAIRN_TEST_ONLY"); /* a label's part: run just those */
    if (only && !strstr(label, only))
        return;
    struct ring g;
    int64_t t0 = clock_ns();
    struct ring_opts ro = *o;
    ro.n_blocks = su->n_blocks;
    if (ring_open(&g, fx->path[su->model], &ro))
        return;
    g.lanes = o->lanes;
    g.asks = !o->rank0_samples;
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, su, &g, &kv, &dkv, c) : NULL;
    if (s) {
        run_suite(s, q);
        struct sched_stats st;
        sched_get_stats(s, &st);
        int bad = compare(label, ref, c, N_SUITE);
        CHECK(bad == 0, "%s: %d of %d requests differ from the single-slice scheduler", label, bad, N_SUITE);
        CHECK(g.mismatches == 0 && g.compared > 0, "%s: caches differed from rank 0's after %d of %d steps", label,
              g.mismatches, g.compared);
        CHECK(o->lanes < 2 || g.max_in_flight == o->lanes, "%s: at most %d steps in flight", label, g.max_in_flight);
        CHECK(st.cached_tokens > 0, "%s: the second round reused no prefix", label);
        if (su->draft)
            CHECK(st.draft_tokens > 0 && st.accepted_draft_tokens > 0, "%s: drafted %lld, accepted %lld", label,
                  (long long)st.draft_tokens, (long long)st.accepted_draft_tokens);
        if (su->n_blocks)
            CHECK(st.preemptions > 0, "%s: a cache of %lld blocks preempted nothing", label, (long long)su->n_blocks);
        struct pipeline_stats ps;
        pipeline_get_stats(g.r[0].p, &ps);
        CHECK(ps.steps == (uint64_t)st.steps && ps.failures == 0, "%s: pipeline steps %llu (%llu failed), sched %lld",
              label, (unsigned long long)ps.steps, (unsigned long long)ps.failures, (long long)st.steps);
        char why[256];
        CHECK(pipeline_alive(g.r[0].p, why, sizeof why), "%s: not alive: %s", label, why);
        /* What came back: rows sampled on the last rank cost a few bytes, not a row of
         * n_vocab floats; the last rank counted the same rows. */
        struct pipeline_stats pl;
        pipeline_get_stats(g.r[g.W - 1].p, &pl);
        uint64_t rows = ps.rows_sampled + ps.rows_logits + ps.rows_skipped, row_bytes = 4 * (uint64_t)n_vocab;
        CHECK(pl.rows_sampled == ps.rows_sampled && pl.rows_logits == ps.rows_logits &&
                  pl.rows_skipped == ps.rows_skipped,
              "%s: the last rank sampled %llu rows, rank 0 got %llu", label, (unsigned long long)pl.rows_sampled,
              (unsigned long long)ps.rows_sampled);
        if (g.asks) {
            CHECK(ps.rows_sampled > 0, "%s: %llu rows sampled remotely, %llu as logits", label,
                  (unsigned long long)ps.rows_sampled, (unsigned long long)ps.rows_logits);
            /* Logits rows as they were, everything else under 256 bytes a row (20 top
             * log-probabilities take 176), and the whole of what rank 0 received under
             * a tenth of what every row as logits would have cost. */
            CHECK(ps.result_bytes < ps.rows_logits * (row_bytes + 64) + (rows - ps.rows_logits) * 256 +
                                        (uint64_t)st.steps * 128,
                  "%s: %llu result bytes for %llu rows (%llu of logits)", label, (unsigned long long)ps.result_bytes,
                  (unsigned long long)rows, (unsigned long long)ps.rows_logits);
            if (ps.rows_logits == 0)
                CHECK(ps.bytes_received * 10 < rows * row_bytes, "%s: rank 0 received %llu bytes for %llu rows of "
                      "%llu bytes", label, (unsigned long long)ps.bytes_received, (unsigned long long)rows,
                      (unsigned long long)row_bytes);
        } else {
            CHECK(ps.rows_sampled == 0 && ps.rows_logits == rows && ps.result_bytes >= rows * row_bytes,
                  "%s: rank 0 samples, yet %llu rows came sampled", label, (unsigned long long)ps.rows_sampled);
        }
        printf("%s: %lld steps, %lld cached tokens, %lld preemptions, drafts %lld/%lld; rank 0 compute %.0f ms, "
               "send %.0f ms, wait %.0f ms (max %.1f), %llu KV ops, %.1f MB sent, %.3f MB received; rows %llu sampled "
               "on rank %d, %llu logits, %llu skipped: %.1f result bytes a row (a logits row: %llu); %.2f s\n", label,
               (long long)st.steps, (long long)st.cached_tokens, (long long)st.preemptions,
               (long long)st.accepted_draft_tokens, (long long)st.draft_tokens, ps.compute_us / 1e3, ps.send_us / 1e3,
               ps.wait_us / 1e3, ps.wait_max_us / 1e3, (unsigned long long)ps.ctl_ops, ps.bytes_sent / 1e6,
               ps.bytes_received / 1e6, (unsigned long long)ps.rows_sampled, g.W - 1,
               (unsigned long long)ps.rows_logits, (unsigned long long)ps.rows_skipped,
               rows ? (double)ps.result_bytes / (double)rows : 0.0, (unsigned long long)row_bytes,
               (double)(clock_ns() - t0) / 1e9);
        sched_close(s, kv, dkv);
    }
    free(c);
    ring_close(&g);
}

static void test_equal(const struct fixture *fx)
{
    static struct req q[N_SUITE];
    struct sched_stats st;
    const struct ring_opts llama2 = {.W = 2, .ends = {1, 6}}, llama3 = {.W = 3, .ends = {2, 3, 6}};
    const struct ring_opts qwen2 = {.W = 2, .ends = {3, 4}}, qwen3 = {.W = 3, .ends = {1, 2, 4}};
    const struct ring_opts llama2_lanes = {.W = 2, .ends = {1, 6}, .lanes = 2};
    const struct ring_opts llama3_lanes = {.W = 3, .ends = {2, 3, 6}, .lanes = 3};
    const struct ring_opts qwen2_lanes = {.W = 2, .ends = {3, 4}, .lanes = 2};
    int n_vocab = fx->m[M_LLAMA]->hp.n_vocab;

    /* llama, greedy: 2 and 3 ranks, a draft on rank 0, a cache small enough to preempt. */
    struct setup su = {.model = M_LLAMA};
    make_suite(q, n_vocab, false, 0);
    struct collector *ref = reference(fx, &su, q, &st);
    if (ref) {
        check_pipeline(fx, &su, q, ref, &llama2, "llama greedy, 2 ranks");
        check_pipeline(fx, &su, q, ref, &llama3, "llama greedy, 3 ranks");
        check_pipeline(fx, &su, q, ref, &llama2_lanes, "llama greedy, 2 ranks, 2 micro-batches");
        check_pipeline(fx, &su, q, ref, &llama3_lanes, "llama greedy, 3 ranks, 3 micro-batches");
        struct setup tight = {.model = M_LLAMA, .n_blocks = 14};
        check_pipeline(fx, &tight, q, ref, &llama2, "llama greedy, 2 ranks, 14 KV blocks");
        check_pipeline(fx, &tight, q, ref, &llama2_lanes, "llama greedy, 2 ranks, 2 micro-batches, 14 KV blocks");
        /* Greedy tokens with a draft are those without. */
        static struct req qd[N_SUITE];
        make_suite(qd, n_vocab, false, -1);
        struct setup sd = {.model = M_LLAMA, .draft = true};
        check_pipeline(fx, &sd, qd, ref, &llama3, "llama greedy, draft on rank 0, 3 ranks");
        check_pipeline(fx, &sd, qd, ref, &llama3_lanes, "llama greedy, draft on rank 0, 3 ranks, 3 micro-batches");
    }
    free(ref);

    /* llama, sampled with fixed seeds: without a draft, and with one on both sides (the
     * drafting schedule is then the same). */
    make_suite(q, n_vocab, true, 0);
    ref = reference(fx, &su, q, &st);
    if (ref) {
        check_pipeline(fx, &su, q, ref, &llama2, "llama sampled, 2 ranks");
        check_pipeline(fx, &su, q, ref, &llama2_lanes, "llama sampled, 2 ranks, 2 micro-batches");
    }
    free(ref);
    struct setup sd = {.model = M_LLAMA, .draft = true};
    make_suite(q, n_vocab, true, -1);
    ref = reference(fx, &sd, q, &st);
    if (ref) {
        CHECK(st.draft_tokens > 0, "the sampled reference drafted nothing");
        check_pipeline(fx, &sd, q, ref, &llama2, "llama sampled, draft on rank 0, 2 ranks");
    }
    free(ref);

    /* What the last rank samples for rank 0: log-probabilities, penalties, logit bias,
     * several sequences per request; greedy and sampled, with and without drafts (a
     * sampled request's draft rows come back as logits for rejection sampling). */
    const struct ring_opts llama2_rank0 = {.W = 2, .ends = {1, 6}, .rank0_samples = true};
    make_rich_suite(q, n_vocab, false, 0);
    ref = reference(fx, &su, q, &st);
    if (ref) {
        check_pipeline(fx, &su, q, ref, &llama2, "llama greedy rich, 2 ranks");
        check_pipeline(fx, &su, q, ref, &llama2_rank0, "llama greedy rich, 2 ranks, rank 0 samples");
        check_pipeline(fx, &su, q, ref, &llama3_lanes, "llama greedy rich, 3 ranks, 3 micro-batches");
        const struct ring_opts l3r0 = {.W = 3, .ends = {2, 3, 6}, .lanes = 3, .rank0_samples = true};
        check_pipeline(fx, &su, q, ref, &l3r0, "llama greedy rich, 3 ranks, 3 micro-batches, rank 0 samples");
        static struct req qd[N_SUITE];
        make_rich_suite(qd, n_vocab, false, -1);
        check_pipeline(fx, &sd, qd, ref, &llama2_lanes, "llama greedy rich, draft on rank 0, 2 ranks, 2 micro-batches");
        const struct ring_opts l2r0 = {.W = 2, .ends = {1, 6}, .lanes = 2, .rank0_samples = true};
        check_pipeline(fx, &sd, qd, ref, &l2r0, "llama greedy rich, draft on rank 0, 2 ranks, 2 micro-batches, rank 0 samples");
        check_pipeline(fx, &sd, qd, ref, &llama2, "llama greedy rich, draft on rank 0, 2 ranks");
    }
    free(ref);
    make_rich_suite(q, n_vocab, true, 0);
    ref = reference(fx, &su, q, &st);
    if (ref) {
        check_pipeline(fx, &su, q, ref, &llama2_lanes, "llama sampled rich, 2 ranks, 2 micro-batches");
        check_pipeline(fx, &su, q, ref, &llama3, "llama sampled rich, 3 ranks");
    }
    free(ref);
    make_rich_suite(q, n_vocab, true, -1);
    ref = reference(fx, &sd, q, &st);
    if (ref)
        check_pipeline(fx, &sd, q, ref, &llama2, "llama sampled rich, draft on rank 0, 2 ranks");
    free(ref);

    /* Constrained decoding: every other request under a grammar; its rows come back as
     * logits and rank 0 samples them under the mask; the tokens are the single slice's,
     * greedy and sampled, with and without a draft. */
    struct tok *tk = NULL;
    struct grammar *gr = NULL;
    struct grammar_ctx *gc = NULL;
    char gerr[256];
    static const char *G = "root ::= \"[\" [0-9]+ (\", \" [a-z]+)* \"]\"\n";
    CHECK(tok_load(&tk, fx->m[M_LLAMA]->file, gerr, sizeof gerr) == 0 &&
              grammar_parse(&gr, G, strlen(G), "root", gerr, sizeof gerr) == 0 && grammar_ctx_from_tok(&gc, gr, tk) == 0,
          "grammar: %s", gerr);
    for (int sampled = 0; gc && sampled < 2; sampled++) {
        make_suite(q, n_vocab, sampled, 0);
        for (int i = 0; i < N_SUITE; i += 2)
            q[i].grammar = gc;
        ref = reference(fx, &su, q, &st);
        if (ref) {
            check_pipeline(fx, &su, q, ref, &llama2, sampled ? "llama sampled constrained, 2 ranks"
                                                             : "llama greedy constrained, 2 ranks");
            check_pipeline(fx, &su, q, ref, &llama3_lanes, sampled ? "llama sampled constrained, 3 ranks, 3 micro-batches"
                                                                   : "llama greedy constrained, 3 ranks, 3 micro-batches");
        }
        free(ref);
    }
    if (gc) {
        static struct req qd[N_SUITE];
        make_suite(qd, n_vocab, false, -1);
        for (int i = 0; i < N_SUITE; i += 2)
            qd[i].grammar = gc;
        ref = reference(fx, &sd, qd, &st);
        if (ref)
            check_pipeline(fx, &sd, qd, ref, &llama2, "llama greedy constrained, draft on rank 0, 2 ranks");
        free(ref);
    }
    grammar_ctx_release(gc);
    grammar_release(gr);
    tok_release(tk);

    /* qwen2 (grouped-query attention, QKV biases), greedy. */
    struct setup sq = {.model = M_QWEN};
    make_suite(q, fx->m[M_QWEN]->hp.n_vocab, false, 0);
    ref = reference(fx, &sq, q, &st);
    if (ref) {
        check_pipeline(fx, &sq, q, ref, &qwen2, "qwen2 greedy, 2 ranks");
        check_pipeline(fx, &sq, q, ref, &qwen3, "qwen2 greedy, 3 ranks");
        check_pipeline(fx, &sq, q, ref, &qwen2_lanes, "qwen2 greedy, 2 ranks, 2 micro-batches");
    }
    free(ref);
}

/* ---- compressed activations on the wire: run and report ---- */

static void test_wire(const struct fixture *fx)
{
    static struct req q[N_SUITE];
    struct sched_stats st;
    struct setup su = {.model = M_LLAMA};
    make_suite(q, fx->m[M_LLAMA]->hp.n_vocab, false, 0);
    struct collector *ref = reference(fx, &su, q, &st);
    const int dts[2] = {DT_F16, DT_Q8_0};
    for (int d = 0; ref && d < 2; d++) {
        struct ring g;
        struct ring_opts o = {.W = 2, .ends = {3, 6}, .wire_dtype = dts[d]};
        if (ring_open(&g, fx->path[M_LLAMA], &o))
            continue;
        struct collector *c = calloc(1, sizeof *c);
        struct kv_cache *kv, *dkv;
        struct sched *s = c ? sched_open(fx, &su, &g, &kv, &dkv, c) : NULL;
        if (s) {
            run_suite(s, q);
            int same = 0, total = 0, done = 0;
            for (int i = 0; i < N_SUITE; i++) {
                done += c->rec[i].n_done == 1 && c->rec[i].why == SCHED_FINISH_LENGTH;
                for (int j = 0; j < ref->rec[i].n; j++) {
                    total++;
                    if (j < c->rec[i].n && c->rec[i].tok[j] == ref->rec[i].tok[j])
                        same++;
                    else
                        break; /* after the first difference the texts diverge */
                }
            }
            CHECK(done == N_SUITE && g.mismatches == 0, "%s wire: %d of %d requests completed, %d cache mismatches",
                  dtype_name(dts[d]), done, N_SUITE, g.mismatches);
            struct pipeline_stats ps;
            pipeline_get_stats(g.r[0].p, &ps);
            printf("%s on the wire: %d of %d tokens as with F32 until the first difference, %.2f MB sent by rank 0\n",
                   dtype_name(dts[d]), same, total, ps.bytes_sent / 1e6);
            sched_close(s, kv, dkv);
        }
        free(c);
        ring_close(&g);
    }
    free(ref);
}

/* ---- failures ---- */

/* One greedy request alone on the reference scheduler. */
static void reference_one(const struct fixture *fx, const struct req *q, struct rec *out)
{
    struct setup su = {.model = M_LLAMA};
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, &su, NULL, &kv, &dkv, c) : NULL;
    char err[512];
    if (s) {
        submit(s, q, 0);
        CHECK(run_idle(s, err, sizeof err) == 0, "reference: %s", err);
        *out = c->rec[0];
        sched_close(s, kv, dkv);
    }
    free(c);
}

static bool same_tokens(const struct rec *a, const struct rec *b)
{
    return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof a->tok[0]) && b->n_done == 1 &&
           b->why == SCHED_FINISH_LENGTH;
}

/* Rank 1's engine takes at most 8 tokens: a longer prompt fails on rank 1, the request
 * ends with rank 1's message, and the pipeline serves the next request. */
static void test_engine_error(const struct fixture *fx)
{
    struct req big, small;
    memset(&big, 0, sizeof big);
    memset(&small, 0, sizeof small);
    int n_vocab = fx->m[M_LLAMA]->hp.n_vocab;
    random_prompt(&big, 30, n_vocab, 5);
    random_prompt(&small, 6, n_vocab, 6);
    big.max_tokens = small.max_tokens = 10;
    big.sp = small.sp = sample_defaults();
    big.sp.temperature = small.sp.temperature = 0;
    struct rec want;
    memset(&want, 0, sizeof want);
    reference_one(fx, &small, &want);

    struct ring g;
    struct ring_opts o = {.W = 3, .ends = {1, 3, 6}, .r1_max_batch = 8};
    if (ring_open(&g, fx->path[M_LLAMA], &o))
        return;
    struct setup su = {.model = M_LLAMA};
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, &su, &g, &kv, &dkv, c) : NULL;
    char err[512] = "";
    if (s) {
        submit(s, &big, 1);
        int rc = run_idle(s, err, sizeof err);
        CHECK(rc == CAIRN_EIO && strstr(err, "rank 1") && strstr(err, "batch of 30"), "rank 1's error: %d %s", rc,
              err);
        CHECK(c->rec[1].n_done == 1 && c->rec[1].why == SCHED_FINISH_ERROR && strstr(c->rec[1].error, "rank 1"),
              "request after rank 1's error: %s, %s", sched_finish_name(c->rec[1].why), c->rec[1].error);
        char why[256];
        CHECK(pipeline_alive(g.r[0].p, why, sizeof why), "not alive after a remote engine error: %s", why);
        submit(s, &small, 2);
        rc = run_idle(s, err, sizeof err);
        CHECK(rc == 0 && same_tokens(&want, &c->rec[2]), "the request after the error: %d %s (%d tokens)", rc, err,
              c->rec[2].n);
        CHECK(g.mismatches == 0 && g.compared > 0, "caches differ after a remote engine error (%d of %d)",
              g.mismatches, g.compared);
        struct pipeline_stats ps;
        pipeline_get_stats(g.r[0].p, &ps);
        CHECK(ps.failures == 1, "rank 0 counted %llu failed steps", (unsigned long long)ps.failures);
        sched_close(s, kv, dkv);
    }
    free(c);
    ring_close(&g);
}

/* The last rank stops answering (links up, heartbeats flowing): the step fails after
 * timeout_ms; once it answers again, its late result is dropped and the next request
 * gets the right tokens. */
static void test_timeout(const struct fixture *fx)
{
    struct req q;
    memset(&q, 0, sizeof q);
    random_prompt(&q, 7, fx->m[M_LLAMA]->hp.n_vocab, 8);
    q.max_tokens = 10;
    q.sp = sample_defaults();
    q.sp.temperature = 0;
    struct rec want;
    memset(&want, 0, sizeof want);
    reference_one(fx, &q, &want);

    struct ring g;
    struct ring_opts o = {.W = 3, .ends = {1, 3, 6}, .timeout_ms = 600};
    if (ring_open(&g, fx->path[M_LLAMA], &o))
        return;
    struct setup su = {.model = M_LLAMA};
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, &su, &g, &kv, &dkv, c) : NULL;
    char err[512] = "";
    if (s) {
        atomic_store(&g.r[2].hang, 1);
        submit(s, &q, 1);
        int64_t t0 = clock_ns();
        int rc = run_idle(s, err, sizeof err);
        double took = (double)(clock_ns() - t0) / 1e9;
        CHECK(rc == CAIRN_EIO && strstr(err, "within 600 ms") && took >= 0.55 && took < 3,
              "hung rank: %d after %.2f s: %s", rc, took, err);
        printf("hung rank 2 of 3: the step failed after %.3f s: %s\n", took, err);
        CHECK(c->rec[1].n_done == 1 && c->rec[1].why == SCHED_FINISH_ERROR, "the request on a hung rank: %s",
              sched_finish_name(c->rec[1].why));
        char why[256];
        CHECK(pipeline_alive(g.r[0].p, why, sizeof why), "a timeout broke the pipeline: %s", why);
        atomic_store(&g.r[2].hang, 0);
        submit(s, &q, 2);
        rc = run_idle(s, err, sizeof err);
        CHECK(rc == 0 && same_tokens(&want, &c->rec[2]), "after the hang: %d %s (%d tokens)", rc, err, c->rec[2].n);
        CHECK(g.mismatches == 0, "caches differ after a timeout");
        sched_close(s, kv, dkv);
    }
    free(c);
    ring_close(&g);
}

/* Rank `victim` closes its links mid-generation (a killed runner): the next step fails
 * with CAIRN_EIO within a bounded time, every request ends with an error, the pipeline
 * stays down, and the ranks after the victim see their link end. */
static void test_kill(const struct fixture *fx, int W, int victim)
{
    struct ring g;
    struct ring_opts o = W == 2 ? (struct ring_opts){.W = 2, .ends = {2, 6}}
                                : (struct ring_opts){.W = 3, .ends = {2, 4, 6}};
    if (ring_open(&g, fx->path[M_LLAMA], &o))
        return;
    struct setup su = {.model = M_LLAMA};
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, &su, &g, &kv, &dkv, c) : NULL;
    char err[512] = "";
    if (s) {
        static struct req q[N_SUITE];
        make_suite(q, fx->m[M_LLAMA]->hp.n_vocab, false, 0);
        c->kill_at_flag = &g.r[victim].die;
        c->kill_at = 12;
        for (int i = 1; i <= 4; i++)
            submit(s, &q[i], (uint64_t)i);
        int rc = 0;
        for (int i = 0; i < 1000 && !sched_idle(s) && !rc; i++) {
            rc = sched_step(s, err, sizeof err);
            rc = rc < 0 ? rc : 0;
        }
        int64_t t_exit = atomic_load(&g.r[victim].t_exit);
        double took = t_exit ? (double)(clock_ns() - t_exit) / 1e9 : -1;
        char victim_s[16];
        snprintf(victim_s, sizeof victim_s, "rank %d", victim);
        CHECK(rc == CAIRN_EIO && strstr(err, victim_s) && took >= 0 && took < 5,
              "killed %s of %d: step returned %d after %.2f s: %s", victim_s, W, rc, took, err);
        printf("killed rank %d of %d: the step failed %.3f s after its links closed: %s\n", victim, W, took, err);
        CHECK(sched_idle(s), "requests still live after the failure");
        for (int i = 1; i <= 4; i++)
            CHECK(c->rec[i].n_done == 1 && c->rec[i].why == SCHED_FINISH_ERROR && c->rec[i].error[0],
                  "request %d after the kill: %s (%d done) %s", i, sched_finish_name(c->rec[i].why), c->rec[i].n_done,
                  c->rec[i].error);
        char why[512];
        CHECK(!pipeline_alive(g.r[0].p, why, sizeof why) && strstr(why, victim_s), "alive after the kill? %s", why);
        /* It stays down: the next request fails at once. */
        submit(s, &q[5], 5);
        int64_t t0 = clock_ns();
        rc = run_idle(s, err, sizeof err);
        CHECK(rc == CAIRN_EIO && (double)(clock_ns() - t0) / 1e9 < 1 && c->rec[5].why == SCHED_FINISH_ERROR,
              "after the kill: %d %s", rc, err);
        /* The ranks after the victim hear of it from their own links: give them time to
         * (rank 0 may have failed first). */
        for (int r = victim + 1; r < W; r++)
            for (int i = 0; i < 300 && !atomic_load(&g.r[r].t_exit); i++)
                usleep(10000);
        ring_stop(&g);
        for (int r = victim + 1; r < W; r++)
            CHECK(g.r[r].exit_rc == CAIRN_EIO && (strstr(g.r[r].exit_err, "ended") || strstr(g.r[r].exit_err, "closed")) &&
                      strstr(g.r[r].exit_err, "rank 1"),
                  "rank %d after rank %d died: %d %s", r, victim, g.r[r].exit_rc, g.r[r].exit_err);
        sched_close(s, kv, dkv);
    }
    free(c);
    ring_close(&g);
}

/* Rank 1's cache is changed behind rank 0's back: an op rank 0 mirrors next cannot be
 * made there, that step and every later one fail naming the broken mirror, and rank 1
 * reports itself not alive. */
static void test_mirror_broken(const struct fixture *fx)
{
    struct ring g;
    struct ring_opts o = {.W = 2, .ends = {3, 6}};
    if (ring_open(&g, fx->path[M_LLAMA], &o))
        return;
    struct setup su = {.model = M_LLAMA};
    struct collector *c = calloc(1, sizeof *c);
    struct kv_cache *kv, *dkv;
    struct sched *s = c ? sched_open(fx, &su, &g, &kv, &dkv, c) : NULL;
    char err[512] = "";
    if (s) {
        static struct req q[N_SUITE];
        make_suite(q, fx->m[M_LLAMA]->hp.n_vocab, false, 0);
        submit(s, &q[1], 1);
        CHECK(run_idle(s, err, sizeof err) == 0, "first request: %s", err);
        /* Rank 1 idles between steps; its slot 0 now holds positions rank 0's does not
         * (rank 0's last ops, a fork of slot 0 into the prefix cache and its clear, are
         * still to be sent). */
        CHECK(kv_prepare(g.r[1].kv, 0, 0, 5) == 0, "prepare on rank 1");
        submit(s, &q[1], 2); /* reuses the cached prompt: a fork into slot 0 */
        int rc = run_idle(s, err, sizeof err);
        CHECK(rc == CAIRN_EIO && strstr(err, "rank 1: KV mirror broken"), "a step on a broken mirror: %d %s", rc, err);
        CHECK(c->rec[2].why == SCHED_FINISH_ERROR, "request on a broken mirror: %s", sched_finish_name(c->rec[2].why));
        char why[512];
        CHECK(!pipeline_alive(g.r[1].p, why, sizeof why) && strstr(why, "mirror"), "rank 1 alive? %s", why);
        submit(s, &q[3], 3);
        rc = run_idle(s, err, sizeof err);
        CHECK(rc == CAIRN_EIO && strstr(err, "KV mirror broken"), "the next request: %d %s", rc, err);
        sched_close(s, kv, dkv);
    }
    free(c);
    ring_close(&g);
}

/* ---- config checks ---- */

static void test_config(const struct fixture *fx)
{
    struct ring g;
    struct ring_opts o = {.W = 3, .ends = {1, 3, 6}};
    if (ring_open(&g, fx->path[M_LLAMA], &o))
        return;
    char err[512];
    struct pipeline *p = NULL;
    struct rank *k1 = &g.r[1];
    struct pipeline_config pc = {.rank = 1, .world_size = 3, .e = k1->e, .kv = k1->kv, .next = k1->prev,
                                 .prev = k1->next};
    ring_stop(&g); /* rank 1's own pipeline no longer serves; its links stay open */
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL && strstr(err, "next = rank 2"),
          "links swapped: %s", err);
    pc.next = k1->next;
    pc.prev = k1->next;
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL && strstr(err, "same connection"),
          "one link as both: %s", err);
    pc.prev = k1->prev;
    pc.rank = 2; /* holds layers [1, 3), not the last ones */
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL && strstr(err, "layers [1, 3)"),
          "a middle slice as the last rank: %s", err);
    pc.rank = 1;
    pc.world_size = 1;
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL, "world_size 1: %s", err);
    pc.world_size = 3;
    pc.wire_dtype = DT_Q4_0;
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL && strstr(err, "wire"), "Q4_0 wire: %s", err);
    pc.wire_dtype = 0;
    pc.kv = g.r[0].kv; /* rank 0's cache has a layer for [0, 1) only */
    CHECK(pipeline_create(&p, &pc, err, sizeof err) == CAIRN_EINVAL && strstr(err, "KV cache"), "wrong cache: %s",
          err);
    CHECK(p == NULL, "a refused config returned a pipeline");
    /* The data plane checks the mirror's PREPARE op like the others. */
    struct dp_ctl bad = {.op = DP_CTL_PREPARE, .seq = 1, .seq2 = -1};
    struct dp_control ctl = {.step = 1, .n = 1, .ops = &bad};
    CHECK(dp_send_control(g.r[0].next, &ctl, 0, err, sizeof err) == CAIRN_EINVAL, "PREPARE of -1 positions");
    bad.seq2 = 3;
    bad.pos = -1;
    CHECK(dp_send_control(g.r[0].next, &ctl, 0, err, sizeof err) == CAIRN_EINVAL, "PREPARE at -1");
    /* Each role's call on the other role's pipeline is refused. */
    CHECK(pipeline_serve(g.r[0].p, 0, err, sizeof err) == CAIRN_ESTATE, "serve on rank 0");
    int32_t tok = 5, seq = 0;
    int64_t pos = 0;
    struct batch b = {.n = 1, .token = &tok, .seq = &seq, .pos = &pos};
    float out[1];
    CHECK(pipeline_forward(g.r[1].p, g.r[1].kv, &b, out, err, sizeof err) == CAIRN_ESTATE, "forward on rank 1");
    struct pipeline_stats ps;
    pipeline_get_stats(g.r[1].p, &ps);
    CHECK(ps.steps == 0 && ps.tokens == 0, "rank 1 served %llu steps", (unsigned long long)ps.steps);
    ring_close(&g);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    struct fixture fx;
    if (fixture_open(&fx)) {
        CHECK(0, "fixture");
        return test_main_end();
    }
    int64_t t0 = clock_ns();
    RUN(test_config, &fx);
    RUN(test_equal, &fx);
    RUN(test_wire, &fx);
    RUN(test_engine_error, &fx);
    RUN(test_timeout, &fx);
    RUN(test_mirror_broken, &fx);
    RUN(test_kill, &fx, 2, 1);
    RUN(test_kill, &fx, 3, 1);
    printf("total %.1f s\n", (double)(clock_ns() - t0) / 1e9);
    fixture_close(&fx);
    return test_main_end();
}
