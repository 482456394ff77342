/* cairn bench --ranks W: a model split by layers over W ranks in this one process, linked
 * in a ring over loopback TCP by the real data plane (runner/dataplane.h, optionally
 * with an emulated link delay), with rank 0's scheduler driving it as a runner does,
 * against the same requests on one slice holding every layer with all the threads.
 * Greedy decoding of S streams (sampled on the last rank, as runners do): aggregate
 * tokens/s, and where the time of a step goes
 * (rank 0's own layers, waiting for the ring, the wire per hop, each stage's idle time).
 * Node start-up, HTTP and placement stay out of the figures (bench/pipeline.sh covers
 * the whole path). */
#include "base/clock.h"
#include "base/err.h"
#include "runner/dataplane.h"
#include "runner/pipeline.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sched.h"
#include "model/model.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_pipe.h"

#define BP_MAX_RANKS 8
#define BP_BLOCK_TOKENS 16

struct bp_rank {
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct dp_listener *l;
    struct dp_conn *next, *prev;
    struct pipeline *p;
    pthread_t th;
    bool serving;
    atomic_int stop;
    char err[256];
};

struct bp_ring {
    int W;
    struct bp_rank r[BP_MAX_RANKS];
};

struct bp_accept {
    struct dp_listener *l;
    struct dp_config cfg;
    struct dp_conn *c;
    int rc;
    char err[256];
};

/* sealed: the links prove and encrypt with a key, as a sealed cluster's runners do. */
static struct dp_config bp_link(int rank, int peer, int W, int delay_us, bool sealed)
{
    return (struct dp_config){.instance_id = "bench", .epoch = 1, .model_id = "bench", .rank = rank,
                              .peer_rank = peer, .max_inflight = rank == 0 ? W : 0, .close_linger_ms = 100,
                              .emulate_delay_us = delay_us, .secret = sealed ? "cairn bench key" : NULL};
}

static void *bp_accept_main(void *arg)
{
    struct bp_accept *a = arg;
    a->rc = dp_accept(a->l, &a->cfg, 10000, &a->c, a->err, sizeof a->err);
    return NULL;
}

static void *bp_serve_main(void *arg)
{
    struct bp_rank *k = arg;
    while (!atomic_load(&k->stop))
        if (pipeline_serve(k->p, 50, k->err, sizeof k->err) < 0)
            break;
    return NULL;
}

static void bp_ring_close(struct bp_ring *g)
{
    for (int r = 1; r < g->W; r++) {
        atomic_store(&g->r[r].stop, 1);
        if (g->r[r].serving)
            pthread_join(g->r[r].th, NULL);
    }
    for (int r = 0; r < g->W; r++) {
        struct bp_rank *k = &g->r[r];
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

/* Weight bytes read per token by a slice (one thread: just for sizing). */
static int slice_bytes(const char *path, int begin, int end, uint64_t *bytes, struct model_hparams *hp, char *err,
                       size_t errlen)
{
    struct model *m = NULL;
    struct model_load_opts mo = {.layer_begin = begin, .layer_end = end, .threads = 1};
    if (model_load(&m, path, &mo, err, errlen))
        return -1;
    *bytes = m->weight_bytes;
    if (hp)
        *hp = m->hp;
    model_release(m);
    return 0;
}

/* Layer ranges of W ranks with equal work per token: the last rank's head counts as the
 * layers its bytes are worth, so that rank gets fewer layers (balanced = false: equal
 * layer counts). ends[r] is rank r's layer_end. */
static int split_layers(const char *path, int W, bool balanced, int *ends, char *err, size_t errlen)
{
    struct model_hparams hp;
    uint64_t first = 0, last = 0;
    if (slice_bytes(path, 0, 1, &first, &hp, err, errlen))
        return -1;
    int n = hp.n_layers;
    if (n < W)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%d ranks need at least %d layers; the model has %d", W, W, n);
    if (balanced && n > 1 && slice_bytes(path, n - 1, n, &last, NULL, err, errlen))
        return -1;
    double layer = (double)first, head = balanced && n > 1 && last > first ? (double)(last - first) : 0;
    double share = (n * layer + head) / W;
    for (int r = 0; r < W; r++) {
        int end = r == W - 1 ? n : (int)((r + 1) * share / layer + 0.5);
        int lo = (r ? ends[r - 1] : 0) + 1, hi = n - (W - 1 - r);
        ends[r] = end < lo ? lo : end > hi ? hi : end;
    }
    return 0;
}

/* W ranks over the layer ranges ends[], each with its own engine of `threads` threads. */
static int bp_ring_open(struct bp_ring *g, const char *path, int W, const int *ends, int threads, int slots,
                        int64_t ctx, int delay_us, bool sealed, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    g->W = W;
    struct sched_config sc = {.slots = slots};
    for (int r = 0; r < W; r++) {
        struct bp_rank *k = &g->r[r];
        struct model_load_opts mo = {.layer_begin = r ? ends[r - 1] : 0, .layer_end = ends[r]};
        struct engine_config ec = {.n_threads = threads, .max_batch = 512, .max_ctx = ctx};
        struct kv_config kc;
        if (model_load(&k->m, path, &mo, err, errlen) || engine_create(&k->e, k->m, &ec, err, errlen))
            goto fail;
        kc = engine_kv_config(k->m, ctx, sched_kv_seqs(&sc), BP_BLOCK_TOKENS);
        if (kv_create(&k->kv, &kc, err, errlen) || dp_listen(&k->l, "127.0.0.1", 0, err, errlen))
            goto fail;
    }
    struct bp_accept acc[BP_MAX_RANKS];
    pthread_t ath[BP_MAX_RANKS];
    for (int r = 0; r < W; r++) {
        acc[r] = (struct bp_accept){.l = g->r[r].l, .cfg = bp_link(r, (r - 1 + W) % W, W, delay_us, sealed)};
        if (pthread_create(&ath[r], NULL, bp_accept_main, &acc[r])) {
            for (int i = 0; i < r; i++)
                pthread_join(ath[i], NULL); /* they give up after their timeout */
            cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot start a thread");
            goto fail;
        }
    }
    int crc = 0;
    for (int r = 0; r < W && !crc; r++) {
        struct dp_config cc = bp_link(r, (r + 1) % W, W, delay_us, sealed);
        crc = dp_connect(&g->r[r].next, "127.0.0.1", dp_listener_port(g->r[(r + 1) % W].l), &cc, 10000, err, errlen);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(ath[r], NULL);
        g->r[r].prev = acc[r].c;
        if (acc[r].rc != 1 && !crc)
            crc = cairn_fail(err, errlen, CAIRN_EIO, "rank %d accepting: %s", r, acc[r].err);
    }
    if (crc)
        goto fail;
    for (int r = 0; r < W; r++) {
        struct bp_rank *k = &g->r[r];
        struct pipeline_config pc = {.rank = r, .world_size = W, .e = k->e, .kv = k->kv, .next = k->next, .prev = k->prev};
        if (pipeline_create(&k->p, &pc, err, errlen))
            goto fail;
    }
    for (int r = 1; r < W; r++) {
        if (pthread_create(&g->r[r].th, NULL, bp_serve_main, &g->r[r])) {
            cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot start a thread");
            goto fail;
        }
        g->r[r].serving = true;
    }
    return 0;
fail:
    bp_ring_close(g);
    return -1;
}

/* ---- one run: S greedy streams through a scheduler ---- */

struct bp_run {
    int streams;
    int64_t n_gen;
    int started;          /* streams that have their first token */
    int64_t t_all;        /* clock_ns when the last stream got its first token */
    int64_t tokens_after; /* tokens generated from t_all on */
    int done;
};

static int bp_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    (void)id, (void)seq, (void)t;
    struct bp_run *r = ctx;
    if (index == 0 && ++r->started == r->streams)
        r->t_all = clock_ns();
    else if (r->started == r->streams)
        r->tokens_after++;
    return 0;
}

static void bp_done(void *ctx, uint64_t id, int seq, enum sched_finish why, const struct sched_usage *u,
                    const char *error)
{
    (void)id, (void)seq, (void)u;
    struct bp_run *r = ctx;
    r->done++;
    if (why == SCHED_FINISH_ERROR)
        fprintf(stderr, "cairn bench: a stream failed: %s\n", error);
}

/* Decode tokens/s of `streams` greedy streams of n_gen tokens after n_prompt random
 * prompt tokens each, on engine e (a whole model, or rank 0 of ring g with `lanes`
 * micro-batches). Negative on failure. */
static double bp_decode(struct engine *e, struct kv_cache *kv, struct bp_ring *g, int lanes, int streams,
                        int64_t n_prompt, int64_t n_gen, int64_t ctx, char *err, size_t errlen)
{
    struct bp_run run = {.streams = streams, .n_gen = n_gen};
    struct sched_config sc = {.slots = streams, .ctx = ctx, .chunk_tokens = 256};
    if (g && lanes > 1) { /* as a runner's rank 0 */
        sc.lanes = lanes;
        sc.submit = pipeline_submit;
        sc.collect = pipeline_collect;
        sc.forward_ctx = g->r[0].p;
    } else if (g) {
        sc.forward = pipeline_forward;
        sc.forward_ctx = g->r[0].p;
    }
    if (g)
        sc.asks = pipeline_asks; /* the last rank samples, as in a runner */
    struct sched_callbacks cb = {.token = bp_token, .done = bp_done, .ctx = &run};
    struct sched *s = NULL;
    if (sched_create(&s, e, kv, &sc, &cb, err, errlen))
        return -1;
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    int n_vocab = engine_model(e)->hp.n_vocab;
    int rc = prompt ? 0 : CAIRN_ENOMEM;
    for (int i = 0; i < streams && !rc; i++) {
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (int64_t k = 0; k < n_prompt; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompt[k] = (int32_t)(3 + x % (uint64_t)(n_vocab - 3));
        }
        struct sched_request rq = {.id = (uint64_t)i, .prompt = prompt, .n_prompt = n_prompt, .max_tokens = n_gen,
                                   .n_seqs = 1, .sample = sample_defaults(), .ignore_eos = true};
        rq.sample.temperature = 0;
        rc = sched_submit(s, &rq, err, errlen);
    }
    free(prompt);
    for (int64_t i = 0; !rc && !sched_idle(s) && i < (int64_t)streams * (n_prompt + n_gen) * 4 + 1000; i++)
        if (sched_step(s, err, errlen) < 0)
            rc = CAIRN_EIO;
    int64_t t_end = clock_ns();
    sched_release(s);
    if (rc || run.tokens_after == 0)
        return rc ? -1 : 0;
    return (double)run.tokens_after / ((double)(t_end - run.t_all) / 1e9);
}

static void rank_stats(struct bp_ring *g, struct pipeline_stats *st)
{
    for (int r = 0; r < g->W; r++)
        pipeline_get_stats(g->r[r].p, &st[r]);
}

int bench_pipeline(const struct bench_pipe_opts *o)
{
    char err[512] = "";
    int W = o->ranks, streams[2] = {1, o->streams};
    int64_t ctx = o->n_prompt + o->n_gen + 32;
    printf("model: %s, %d ranks of %d thread%s (equal layer counts) vs one slice of %d threads; link delay %d us "
           "each way, %s; prompt %lld, %lld greedy tokens per stream\n", o->model_path, W, o->threads,
           o->threads > 1 ? "s" : "", W * o->threads, o->delay_us, o->sealed ? "sealed" : "in clear",
           (long long)o->n_prompt, (long long)o->n_gen);
    /* The whole model on one slice. */
    double whole[2] = {0, 0};
    {
        struct model *m = NULL;
        struct engine *e = NULL;
        struct kv_cache *kv = NULL;
        struct engine_config ec = {.n_threads = W * o->threads, .max_batch = 512, .max_ctx = ctx};
        struct sched_config sc = {.slots = o->streams};
        int rc = model_load(&m, o->model_path, NULL, err, sizeof err) || engine_create(&e, m, &ec, err, sizeof err);
        if (!rc) {
            struct kv_config kc = engine_kv_config(m, ctx, sched_kv_seqs(&sc), BP_BLOCK_TOKENS);
            rc = kv_create(&kv, &kc, err, sizeof err);
        }
        for (int i = 0; i < 2 && !rc; i++)
            rc = (whole[i] = bp_decode(e, kv, NULL, 1, streams[i], o->n_prompt, o->n_gen, ctx, err, sizeof err)) < 0;
        kv_release(kv);
        engine_release(e);
        model_release(m);
        if (rc) {
            fprintf(stderr, "cairn bench: one slice: %s\n", err);
            return 1;
        }
    }
    printf("| setup | 1 stream tok/s | %d streams tok/s | vs one slice | rank 0 per step: own layers / waiting "
           "(ms) | ring per step beyond compute, per hop (us) | stage idle | \n|---|---:|---:|---:|---:|---:|---|\n",
           o->streams);
    printf("| one slice, %d threads | %.1f | %.1f | 1.00 | - | - | - |\n", W * o->threads, whole[0], whole[1]);
    /* One micro-batch and W, over equal layer counts; W over layers balanced for work. */
    int lanes_list[3] = {1, W, W};
    for (int li = 0; li < 3; li++) {
        int lanes = lanes_list[li], ends[BP_MAX_RANKS];
        bool balanced = li == 2;
        struct bp_ring g;
        if (split_layers(o->model_path, W, balanced, ends, err, sizeof err) ||
            bp_ring_open(&g, o->model_path, W, ends, o->threads, o->streams, ctx, o->delay_us, o->sealed, err,
                         sizeof err)) {
            fprintf(stderr, "cairn bench: ring of %d: %s\n", W, err);
            return 1;
        }
        double tps[2];
        struct pipeline_stats before[BP_MAX_RANKS], after[BP_MAX_RANKS];
        int64_t t0 = 0, t1 = 0;
        int rc = 0;
        for (int i = 0; i < 2 && !rc; i++) {
            if (i == 1) {
                rank_stats(&g, before);
                t0 = clock_ns();
            }
            rc = (tps[i] = bp_decode(g.r[0].e, g.r[0].kv, &g, lanes, streams[i], o->n_prompt, o->n_gen, ctx, err,
                                     sizeof err)) < 0;
        }
        t1 = clock_ns();
        if (rc) {
            fprintf(stderr, "cairn bench: ring of %d, %d micro-batches: %s\n", W, lanes, err);
            bp_ring_close(&g);
            return 1;
        }
        rank_stats(&g, after);
        double steps = (double)(after[0].steps - before[0].steps);
        double own = (double)(after[0].compute_us - before[0].compute_us) / steps;
        double wait = (double)(after[0].wait_us - before[0].wait_us) / steps;
        double send = (double)(after[0].send_us - before[0].send_us) / steps;
        double others = 0; /* compute of the other ranks per step */
        char idle[160] = "";
        size_t at = 0;
        for (int r = 1; r < W; r++) {
            others += (double)(after[r].compute_us - before[r].compute_us) / steps;
            double idle_frac = (double)(after[r].wait_us - before[r].wait_us) / ((double)(t1 - t0) / 1e3);
            at += (size_t)snprintf(idle + at, sizeof idle - at, "%srank %d %.0f%%", r > 1 ? ", " : "", r,
                                   100 * idle_frac);
        }
        double idle0 = (double)(after[0].wait_us - before[0].wait_us) / ((double)(t1 - t0) / 1e3);
        snprintf(idle + at, sizeof idle - at, ", rank 0 waits %.0f%%", 100 * idle0);
        /* With one batch in flight, the time from sending to the result beyond the other
         * ranks' compute is the wire: W hops per step. With more, the wait is what rank 0
         * could not fill. */
        char wire[64] = "-";
        if (lanes == 1)
            snprintf(wire, sizeof wire, "%.0f, %.0f", send + wait - others, (send + wait - others) / W);
        char layers[64];
        size_t lat = 0;
        for (int r = 0; r < W; r++)
            lat += (size_t)snprintf(layers + lat, sizeof layers - lat, "%s%d", r ? "+" : "", ends[r] - (r ? ends[r - 1] : 0));
        printf("| %d ranks x %d thread%s (layers %s%s), %d micro-batch%s | %.1f | %.1f | %.2f | %.2f / %.2f | %s | %s |\n",
               W, o->threads, o->threads > 1 ? "s" : "", layers, balanced ? ", head counted" : "", lanes,
               lanes > 1 ? "es" : "", tps[0], tps[1], tps[1] / whole[1], own / 1e3, wait / 1e3, wire, idle);
        bp_ring_close(&g);
    }
    return 0;
}
