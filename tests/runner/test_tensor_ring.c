/* Tensor parallelism over the data plane (runner/tensor.h): W ranks in threads of this
 * process, each with its own engine (the whole model, its part of every layer) and cache
 * (its KV heads), linked in a ring of real TCP connections with the data plane's
 * handshake, secret and flow control. Rank 0 drives steps with tensor_forward: batches of
 * several sequences, prefill and decode, with KV operations between them (a truncation
 * and a fork, mirrored by CONTROL frames), and its logits must be the same bits as one
 * engine's; the exchanges per step are counted. A rank whose links close makes rank 0's
 * next step fail with CAIRN_EIO naming the link, within seconds. */
#include "base/clock.h"
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sched.h"
#include "model/model.h"
#include "model/synth.h"
#include "runner/dataplane.h"
#include "runner/tensor.h"
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BATCH 16
#define CTX 64
#define SEQS 4

struct rank {
    int rank;
    struct engine *e;
    struct kv_cache *kv;
    struct tensor *t;
    struct dp_listener *l;
    struct dp_conn *next, *prev;
    pthread_t th;
    bool running;
    atomic_int stop, die;
    int exit_rc;
};

struct ring {
    int W;
    struct rank r[ENGINE_TP_MAX];
};

static struct dp_config link_config(int rank, int peer)
{
    return (struct dp_config){.instance_id = "tensor-test", .epoch = 1, .model_id = "synth",
                              .secret = "tensor test secret", .rank = rank, .peer_rank = peer,
                              .close_linger_ms = 200};
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

/* A rank > 0's runner: serves until told to stop; killed, it closes its links. */
static void *serve_main(void *arg)
{
    struct rank *k = arg;
    char err[512];
    while (!atomic_load(&k->stop)) {
        if (atomic_load(&k->die)) {
            dp_close(k->next, "killed");
            dp_close(k->prev, "killed");
            k->next = k->prev = NULL;
            return NULL;
        }
        int rc = tensor_serve(k->t, 50, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "rank %d stops serving: %s\n", k->rank, err);
            k->exit_rc = rc;
            break;
        }
    }
    return NULL;
}

static void ring_close(struct ring *g)
{
    for (int r = 1; r < g->W; r++) {
        atomic_store(&g->r[r].stop, 1);
        if (g->r[r].running)
            pthread_join(g->r[r].th, NULL);
    }
    for (int r = 0; r < g->W; r++) {
        struct rank *k = &g->r[r];
        tensor_release(k->t);
        dp_close(k->next, NULL);
        dp_close(k->prev, NULL);
        kv_release(k->kv);
        engine_release(k->e);
        dp_listener_close(k->l);
    }
    memset(g, 0, sizeof *g);
}

static int ring_open(struct ring *g, const struct model *m, int W)
{
    char err[512];
    memset(g, 0, sizeof *g);
    g->W = W;
    for (int r = 0; r < W; r++) {
        struct rank *k = &g->r[r];
        k->rank = r;
        if (tensor_create(&k->t, r, W, 5000, err, sizeof err))
            goto fail;
        struct engine_config ec = {.n_threads = 1, .max_batch = MAX_BATCH, .max_ctx = CTX, .tp = tensor_engine_tp(k->t)};
        struct kv_config kc = engine_kv_config_tp(m, W, CTX, SEQS, 16);
        if (engine_create(&k->e, m, &ec, err, sizeof err) || kv_create(&k->kv, &kc, err, sizeof err) ||
            dp_listen(&k->l, "127.0.0.1", 0, err, sizeof err))
            goto fail;
    }
    struct acceptor acc[ENGINE_TP_MAX];
    pthread_t ath[ENGINE_TP_MAX];
    for (int r = 0; r < W; r++) {
        acc[r] = (struct acceptor){.l = g->r[r].l, .cfg = link_config(r, (r - 1 + W) % W)};
        pthread_create(&ath[r], NULL, accept_main, &acc[r]);
    }
    int crc = 0;
    for (int r = 0; r < W && !crc; r++) {
        struct dp_config cc = link_config(r, (r + 1) % W);
        crc = dp_connect(&g->r[r].next, "127.0.0.1", dp_listener_port(g->r[(r + 1) % W].l), &cc, 5000, err,
                         sizeof err);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(ath[r], NULL);
        g->r[r].prev = acc[r].c;
        if (acc[r].rc != 1 && !crc) {
            snprintf(err, sizeof err, "accept on rank %d: %s", r, acc[r].err);
            crc = -1;
        }
    }
    if (crc)
        goto fail;
    for (int r = 0; r < W; r++)
        if (tensor_start(g->r[r].t, g->r[r].e, g->r[r].kv, g->r[r].next, g->r[r].prev, err, sizeof err))
            goto fail;
    for (int r = 1; r < W; r++) {
        pthread_create(&g->r[r].th, NULL, serve_main, &g->r[r]);
        g->r[r].running = true;
    }
    return 0;
fail:
    CHECK(0, "ring of %d: %s", W, err);
    ring_close(g);
    return -1;
}

/* The steps: two prompts in one batch; a truncation of sequence 0 back to 5 and a fork of
 * sequence 1 into 3 (KV operations the other ranks must mirror); then a batch of decode
 * tokens of all four with a third prompt's chunk, logits wanted for some of them only. */
#define N_STEPS 3
static const int step_n[N_STEPS] = {12, 6, 4};
static const int32_t step_seq[N_STEPS][12] = {
    {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, {0, 1, 2, 2, 2, 3}, {2, 3, 1, 0}};
static const int64_t step_pos[N_STEPS][12] = {
    {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4}, {5, 5, 0, 1, 2, 5}, {3, 6, 6, 6}};
static const uint8_t step_want[N_STEPS][12] = {
    {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1}, {1, 1, 0, 1, 1, 1}, {1, 1, 1, 1}};

static int n_wanted(int s)
{
    int n = 0;
    for (int i = 0; i < step_n[s]; i++)
        n += step_want[s][i];
    return n;
}

/* Runs the steps with forward (one engine, or rank 0 of a ring); logits of every wanted
 * token, in order. */
static float *run_steps(struct engine *e, struct kv_cache *kv, void *tp, int V)
{
    char err[512];
    size_t total = 0;
    for (int s = 0; s < N_STEPS; s++)
        total += (size_t)n_wanted(s);
    float *out = malloc(total * (size_t)V * sizeof(float));
    size_t off = 0;
    for (int s = 0; s < N_STEPS; s++) {
        if (s == 1) {
            kv_truncate(kv, 0, 5);
            if (kv_fork(kv, 1, 3)) {
                CHECK(0, "kv_fork");
                free(out);
                return NULL;
            }
            kv_truncate(kv, 3, 5);
        }
        int32_t tok[12];
        for (int i = 0; i < step_n[s]; i++)
            tok[i] = (int32_t)((s * 131 + i * 37 + step_seq[s][i] * 11 + 5) % V);
        struct batch b = {.n = step_n[s], .token = tok, .seq = step_seq[s], .pos = step_pos[s], .logits = step_want[s]};
        int rc = tp ? tensor_forward(tp, kv, &b, out + off, err, sizeof err)
                    : engine_forward(e, kv, &b, out + off, err, sizeof err);
        if (rc) {
            CHECK(0, "step %d: %s", s, err);
            free(out);
            return NULL;
        }
        off += (size_t)n_wanted(s) * (size_t)V;
    }
    return out;
}

static struct model *load_shape(const char *arch, int n_embd, int n_ff, int n_head, int n_head_kv, int head_dim)
{
    struct synth_spec s = {.n_layers = 2, .n_embd = n_embd, .n_ff = n_ff, .n_head = n_head, .n_head_kv = n_head_kv,
                           .head_dim = head_dim, .n_ctx = 512, .rope_base = 10000, .norm_eps = 1e-5f, .seed = 5,
                           .vocab_size = 600};
    snprintf(s.arch, sizeof s.arch, "%s", arch);
    snprintf(s.type, sizeof s.type, "q8_0");
    char path[128], err[256];
    snprintf(path, sizeof path, "test_tensor_dp_%d.gguf", (int)getpid());
    struct model *m = NULL;
    struct model_load_opts o = {.layer_begin = 0, .layer_end = -1, .threads = 1};
    if (synth_write(&s, NULL, path, err, sizeof err) || model_load(&m, path, &o, err, sizeof err))
        CHECK(0, "model: %s", err);
    unlink(path);
    return m;
}

static struct model *load_model(const char *arch, int n_head, int n_head_kv)
{
    return load_shape(arch, 512, 1024, n_head, n_head_kv, 64);
}

static void check_equal(struct model *m, int w_min, int w_max)
{
    int V = m->hp.n_vocab;
    char err[256];
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 2, .max_batch = MAX_BATCH, .max_ctx = CTX};
    struct kv_config kc = engine_kv_config(m, CTX, SEQS, 16);
    float *want = NULL;
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err))
        CHECK(0, "%s", err);
    else
        want = run_steps(e, kv, NULL, V);
    kv_release(kv);
    engine_release(e);
    size_t n = 0;
    for (int s = 0; s < N_STEPS; s++)
        n += (size_t)n_wanted(s) * (size_t)V;
    for (int W = w_min; W <= w_max && want; W *= 2) {
        struct ring g;
        if (ring_open(&g, m, W))
            continue;
        float *got = run_steps(g.r[0].e, g.r[0].kv, g.r[0].t, V);
        if (got) {
            size_t d = 0;
            while (d < n && !memcmp(&got[d], &want[d], sizeof(float)))
                d++;
            CHECK(d == n, "W %d: logits differ from one engine's at %zu: %.9g vs %.9g", W, d,
                  d < n ? (double)got[d] : 0.0, d < n ? (double)want[d] : 0.0);
            struct tensor_stats st;
            tensor_get_stats(g.r[0].t, &st);
            CHECK_EQ_INT(st.steps, N_STEPS);
            CHECK_EQ_INT(st.exchanges, N_STEPS * (4 * m->hp.n_layers + 1));
            CHECK(st.ctl_ops > 0, "W %d: no KV ops went to the other ranks", W);
            /* the ranks waited for parts by spinning within steps, and for the next step
             * only just after one (10 ms): ranks > 0 idle in tensor_serve past that, and look
             * no more */
            uint64_t looks[ENGINE_TP_MAX], looks_total = 0, idle_looks = 0;
            usleep(100 * 1000);
            for (int r = 0; r < W; r++) {
                struct dp_stats ds;
                dp_get_stats(g.r[r].prev, &ds);
                looks[r] = ds.spin_looks;
                looks_total += ds.spin_looks;
            }
            usleep(300 * 1000);
            for (int r = 0; r < W; r++) {
                struct dp_stats ds;
                dp_get_stats(g.r[r].prev, &ds);
                idle_looks += ds.spin_looks - looks[r];
            }
            CHECK(looks_total > 0, "W %d: the ranks waited for parts by spinning", W);
            CHECK(idle_looks == 0, "W %d: idle ranks looked %llu times for a frame without blocking", W,
                  (unsigned long long)idle_looks);
            printf("W=%d: same bits over %zu logits; %llu exchanges, %llu frames and %llu bytes sent by rank 0, "
                   "%llu KV ops mirrored\n", W, n, (unsigned long long)st.exchanges,
                   (unsigned long long)st.frames_sent, (unsigned long long)st.bytes_sent,
                   (unsigned long long)st.ctl_ops);
        }
        free(got);
        ring_close(&g);
    }
    free(want);
}

static void test_equal(void)
{
    struct model *m = load_model("qwen2", 8, 8);
    if (m)
        check_equal(m, 2, 8);
    model_release(m);
}

/* Rows split at the kernels' row alignment (16 on AVX-512) leave some ranks no part of
 * a narrow vector (n_embd 96 over 8 ranks: parts of 16, 0, 16, ...): those exchanges
 * carry nothing from them, on every rank alike. */
static void test_uneven(void)
{
    struct model *m = load_shape("qwen3", 96, 160, 8, 8, 16);
    if (m)
        check_equal(m, 8, 8);
    model_release(m);
}

/* A rank that dies: rank 0's next step fails with the link named, within seconds, and
 * every later one too. */
static void test_kill(void)
{
    struct model *m = load_model("llama", 8, 4);
    if (!m)
        return;
    struct ring g;
    if (ring_open(&g, m, 2)) {
        model_release(m);
        return;
    }
    float *out = malloc((size_t)MAX_BATCH * (size_t)m->hp.n_vocab * sizeof(float));
    int32_t tok[2] = {3, 4}, seq[2] = {0, 0};
    int64_t pos[2] = {0, 1};
    struct batch b = {.n = 2, .token = tok, .seq = seq, .pos = pos};
    char err[512] = "";
    CHECK(tensor_forward(g.r[0].t, g.r[0].kv, &b, out, err, sizeof err) == 0, "%s", err);
    atomic_store(&g.r[1].die, 1);
    usleep(200 * 1000);
    int64_t t0 = clock_ns();
    pos[0] = 2, pos[1] = 3;
    int rc = tensor_forward(g.r[0].t, g.r[0].kv, &b, out, err, sizeof err);
    double s = (double)(clock_ns() - t0) / 1e9;
    CHECK(rc == CAIRN_EIO && strstr(err, "rank 1"), "after the kill: rc %d, %s", rc, err);
    CHECK(s < 5.0, "the error took %.1f s", s);
    char why[512];
    CHECK(!tensor_alive(g.r[0].t, why, sizeof why), "still alive after the kill");
    CHECK(tensor_forward(g.r[0].t, g.r[0].kv, &b, out, err, sizeof err) == CAIRN_EIO, "a later step did not fail");
    printf("kill: %.3f s, %s\n", s, err);
    free(out);
    ring_close(&g);
    model_release(m);
}

/* ---- with the scheduler: continuous batching, prefix reuse, sampling on rank 0 ---- */

#define N_REQ 8
#define GEN 12

struct collector {
    int32_t tok[N_REQ][GEN];
    float lp[N_REQ][GEN];
    int n[N_REQ], done[N_REQ];
};

static int on_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    (void)seq;
    struct collector *c = ctx;
    if (id < N_REQ && index < GEN) {
        c->tok[id][index] = t->token;
        c->lp[id][index] = t->logprob;
        c->n[id] = (int)index + 1;
    }
    return 0;
}

static void on_done(void *ctx, uint64_t id, int seq, enum sched_finish why, const struct sched_usage *u, const char *error)
{
    (void)seq, (void)u;
    struct collector *c = ctx;
    if (id < N_REQ)
        c->done[id] = why == SCHED_FINISH_ERROR ? -1 : 1;
    if (error)
        fprintf(stderr, "request %llu: %s\n", (unsigned long long)id, error);
}

/* Request 0 alone, again (its prompt now cached), then 1..7 at once; greedy, logprobs. */
static void run_requests(struct engine *e, struct kv_cache *kv, struct tensor *t, struct collector *c, int V)
{
    char err[512];
    struct sched_config cfg = {.slots = SEQS / 2, .ctx = CTX, .cache_seqs = SEQS / 2, .chunk_tokens = 8};
    if (t) {
        cfg.forward = tensor_forward;
        cfg.forward_ctx = t;
    }
    struct sched_callbacks cb = {.token = on_token, .done = on_done, .ctx = c};
    struct sched *s = NULL;
    if (sched_create(&s, e, kv, &cfg, &cb, err, sizeof err)) {
        CHECK(0, "sched: %s", err);
        return;
    }
    int32_t prompt[N_REQ][9];
    for (int i = 0; i < N_REQ; i++)
        for (int k = 0; k < 9; k++)
            prompt[i][k] = (int32_t)((i * 53 + k * 29 + 7) % V);
    int groups[4] = {0, 0, 1, N_REQ};
    for (int g = 0; g < 3; g++) {
        for (int i = groups[g]; i < groups[g + 1] || (g < 2 && i == 0); i++) {
            struct sched_request r = {.id = (uint64_t)i, .prompt = prompt[i], .n_prompt = 5 + i % 4, .max_tokens = GEN,
                                      .n_seqs = 1, .sample = sample_defaults(), .ignore_eos = true, .logprobs = true};
            r.sample.temperature = 0;
            CHECK(sched_submit(s, &r, err, sizeof err) == 0, "submit: %s", err);
            if (g < 2)
                break;
        }
        for (int k = 0; k < 2000 && !sched_idle(s); k++)
            if (sched_step(s, err, sizeof err) < 0)
                CHECK(0, "step: %s", err);
        CHECK(sched_idle(s), "not idle");
    }
    sched_release(s);
}

static void test_sched(void)
{
    struct model *m = load_model("qwen2", 8, 8);
    if (!m)
        return;
    int V = m->hp.n_vocab;
    char err[256];
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct engine_config ec = {.n_threads = 1, .max_batch = MAX_BATCH, .max_ctx = CTX};
    struct sched_config sc = {.slots = SEQS / 2, .cache_seqs = SEQS / 2};
    struct kv_config kc = engine_kv_config(m, CTX, sched_kv_seqs(&sc), 16);
    static struct collector want, got;
    memset(&want, 0, sizeof want);
    memset(&got, 0, sizeof got);
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err))
        CHECK(0, "%s", err);
    else
        run_requests(e, kv, NULL, &want, V);
    kv_release(kv);
    engine_release(e);
    struct ring g;
    if (ring_open(&g, m, 2) == 0) {
        run_requests(g.r[0].e, g.r[0].kv, g.r[0].t, &got, V);
        for (int i = 0; i < N_REQ; i++) {
            CHECK(want.done[i] == 1 && got.done[i] == 1 && want.n[i] == GEN && got.n[i] == GEN,
                  "request %d: done %d/%d, %d/%d tokens", i, want.done[i], got.done[i], want.n[i], got.n[i]);
            CHECK(!memcmp(want.tok[i], got.tok[i], sizeof want.tok[i]) && !memcmp(want.lp[i], got.lp[i], sizeof want.lp[i]),
                  "request %d: tokens or logprobs differ from one engine's", i);
        }
        struct tensor_stats st;
        tensor_get_stats(g.r[0].t, &st);
        printf("sched: %llu steps, %llu KV ops mirrored\n", (unsigned long long)st.steps, (unsigned long long)st.ctl_ops);
        ring_close(&g);
    }
    model_release(m);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_equal);
    RUN(test_uneven);
    RUN(test_sched);
    RUN(test_kill);
    return test_main_end();
}
