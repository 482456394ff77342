/* cairn bench: prefill and decode speed, like llama-bench, plus the decode roofline
 * (bytes read per token against memory bandwidth measured in the same run) and the
 * cost of one forward over B = 1..16 tokens relative to B = 1. With --draft (or
 * --lookup): speculative decoding through the scheduler, its acceptance rate, costs,
 * and measured against predicted speed-up. */
#include "base/clock.h"
#include "base/cpu.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/args.h"
#include "cli/bench_pipe.h"
#include "cli/bench_step.h"
#include "base/bwprobe.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sched.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH_CHUNK 512     /* tokens per forward that fill -d's context */
#define BATCH_CURVE_STEPS 8 /* forwards timed per repetition of the batch curve */
#define DECODE_GROUP 16     /* decode steps between two readings of the DRAM block */
#define PROBE_BURST (2 * N_BW_STYLES)    /* slices of a reading between decode groups, at least */
#define PROBE_BURST_MAX (8 * N_BW_STYLES) /* ... and at most */
#define PROBE_SHARED 2                    /* slices every thread shared that end a reading early */
#define PROBE_MACHINE (16 * N_BW_STYLES) /* slices of the machine's figure */

/* qsort order of doubles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of n values (sorts them). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The plain bench of one model: what it holds, each released by bench_release. */
struct bench {
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct kv_config kc;
    int n_seqs;              /* sequences of the cache: the batch curve's largest B, or 1 */
    size_t nb;               /* positions of one batch: the prompt, or the batch curve's largest B */
    float *logits;           /* nb x n_vocab */
    int32_t *tokens, *seqs;  /* nb each */
    int64_t *pos;
    uint8_t *want;
    struct pool *bwp;        /* threads of the bandwidth reads: the engine's (borrowed) */
    struct bw_block *bwb;    /* the DRAM block, read in slices between decode groups */
    long long bursts, burst_slices; /* readings between decode groups, and their slices */
    double bw_machine;       /* the machine line's DRAM reading (bytes/s) */
    size_t llc;              /* the last-level cache as reported (bw_llc_bytes), 0: unknown */
    int64_t dram_mib;        /* the DRAM block (dram_probe_mib) */
    double *t;               /* -r: the times of one measurement's runs */
    char err[512];
};

/* One forward of the first n positions of the batch buffers. */
static int run(struct bench *bn, int n)
{
    struct batch b = {.n = n, .token = bn->tokens, .seq = bn->seqs, .pos = bn->pos, .logits = bn->want};
    return engine_forward(bn->e, bn->kv, &b, bn->logits, bn->err, sizeof bn->err);
}

/* ---- speculative decoding ---- */

struct spec_bench {
    struct model *tm, *dm;
    struct engine *te, *de;
    int32_t *prompt;
    int64_t n_prompt, n_gen, ctx;
    int k, lookup;
    char err[512];
};

/* One engine with a cache holding a context of n_ctx tokens of sequence 0, for timing
 * forwards of a few more tokens (dropped after each run, so every run sees the same
 * context). */
struct probe {
    struct engine *e;
    struct kv_cache *kv;
    int64_t n_ctx;
    int32_t *seq;
    int64_t *pos;
    uint8_t *want;
    float *out;
};

/* Releases what p holds (not its engine). */
static void probe_release(struct probe *p)
{
    kv_release(p->kv);
    free(p->seq);
    free(p->pos);
    free(p->want);
    free(p->out);
}

/* Makes p's cache and runs the prompt into it, for forwards of up to max_n tokens after it. */
static int probe_open(struct probe *p, struct spec_bench *sb, struct engine *e, const struct model *m, int max_n)
{
    memset(p, 0, sizeof *p);
    p->e = e;
    p->n_ctx = sb->n_prompt;
    struct kv_config kc = engine_kv_config(m, sb->ctx, 1, 16);
    int64_t total = p->n_ctx > max_n ? p->n_ctx : max_n;
    p->seq = calloc((size_t)total, sizeof *p->seq);
    p->pos = malloc((size_t)total * sizeof *p->pos);
    p->want = calloc((size_t)total, 1);
    p->out = malloc((size_t)max_n * (size_t)m->hp.n_vocab * sizeof *p->out);
    if (!p->seq || !p->pos || !p->want || !p->out || kv_create(&p->kv, &kc, sb->err, sizeof sb->err))
        return -1;
    for (int64_t i = 0; i < p->n_ctx; i++)
        p->pos[i] = i;
    p->want[p->n_ctx - 1] = 1;
    struct batch b = {.n = (int)p->n_ctx, .token = sb->prompt, .seq = p->seq, .pos = p->pos, .logits = p->want};
    return engine_forward(e, p->kv, &b, p->out, sb->err, sizeof sb->err);
}

/* Seconds of one forward of n tokens (all with logits) after the context; < 0 on error. */
static double probe_time(struct probe *p, struct spec_bench *sb, int n)
{
    for (int i = 0; i < n; i++) {
        p->pos[i] = p->n_ctx + i;
        p->want[i] = 1;
    }
    struct batch b = {.n = n, .token = sb->prompt, .seq = p->seq, .pos = p->pos, .logits = p->want};
    double t0 = clock_sec();
    if (engine_forward(p->e, p->kv, &b, p->out, sb->err, sizeof sb->err))
        return -1;
    double t = clock_sec() - t0;
    kv_truncate(p->kv, 0, p->n_ctx);
    return t;
}

/* Median times of a target decode step, a verification of k+1 tokens and a draft step
 * (0 without a draft model), measured in turn so that a noisy machine slows all alike. */
static int measure_costs(struct spec_bench *sb, int reps, double *t_t, double *t_v, double *t_d)
{
    struct probe pt, pd;
    double *t = malloc(3 * (size_t)reps * sizeof *t);
    int rc = t ? 0 : -1;
    memset(&pd, 0, sizeof pd);
    if (rc || probe_open(&pt, sb, sb->te, sb->tm, sb->k + 1) || (sb->de && probe_open(&pd, sb, sb->de, sb->dm, 1)))
        rc = -1;
    for (int r = 0; r < reps && !rc; r++) {
        t[r] = probe_time(&pt, sb, 1);
        t[reps + r] = probe_time(&pt, sb, sb->k + 1);
        t[2 * reps + r] = sb->de ? probe_time(&pd, sb, 1) : 0;
        if (t[r] < 0 || t[reps + r] < 0 || t[2 * reps + r] < 0)
            rc = -1;
    }
    if (!rc) {
        *t_t = median(t, reps);
        *t_v = median(t + reps, reps);
        *t_d = median(t + 2 * reps, reps);
    }
    probe_release(&pt);
    probe_release(&pd);
    free(t);
    return rc;
}

/* An engine's forwards and their time (engine_profile_totals) at a token's report. */
struct fwd_mark {
    unsigned long long n;
    long long ns;
};

struct gen_run {
    int32_t *tok;
    int64_t n;
    double t_first, t_last; /* when the first and last tokens came */
    const struct engine *te, *de; /* profiled (the draft NULL without one) */
    struct fwd_mark t_first_fw, t_last_fw, d_first_fw, d_last_fw; /* at the first and last tokens */
};

static struct fwd_mark fwd_mark(const struct engine *e)
{
    struct fwd_mark m = {0, 0};
    if (e)
        engine_profile_totals(e, &m.n, &m.ns);
    return m;
}

/* The scheduler's token callback: records the token and when it came. */
static int gen_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *t)
{
    (void)id;
    (void)seq;
    struct gen_run *g = ctx;
    g->t_last = clock_sec();
    g->t_last_fw = fwd_mark(g->te);
    g->d_last_fw = fwd_mark(g->de);
    if (index == 0) {
        g->t_first = g->t_last;
        g->t_first_fw = g->t_last_fw;
        g->d_first_fw = g->d_last_fw;
    }
    g->tok[g->n++] = t->token;
    return 0;
}

/* Generates n_gen greedy tokens after the prompt through the scheduler, with the draft
 * (or prompt lookup) when spec is set. Returns decode tokens per second (after the first
 * token) or -1; *st gets the scheduler's counts. */
static double generate(struct spec_bench *sb, bool spec, struct gen_run *g, struct sched_stats *st)
{
    struct sched_config cfg = {.slots = 1, .ctx = sb->ctx, .chunk_tokens = (int)sb->n_prompt};
    struct kv_config kc = engine_kv_config(sb->tm, sb->ctx, sched_kv_seqs(&cfg), 16);
    struct kv_cache *kv = NULL, *dkv = NULL;
    struct sched *s = NULL;
    struct sched_callbacks cb = {.token = gen_token, .ctx = g};
    double tps = -1;
    g->n = 0;
    if (kv_create(&kv, &kc, sb->err, sizeof sb->err) || sched_create(&s, sb->te, kv, &cfg, &cb, sb->err, sizeof sb->err))
        goto out;
    if (spec && sb->de) {
        struct kv_config dc = engine_kv_config(sb->dm, sb->ctx, 1, 16);
        if (kv_create(&dkv, &dc, sb->err, sizeof sb->err) ||
            sched_set_draft(s, sb->de, dkv, sb->k, sb->err, sizeof sb->err))
            goto out;
    }
    struct sample_params sp = sample_defaults();
    sp.temperature = 0;
    struct sched_request r = {.id = 1, .prompt = sb->prompt, .n_prompt = sb->n_prompt, .max_tokens = sb->n_gen,
                              .n_seqs = 1, .sample = sp, .ignore_eos = true,
                              .num_draft_tokens = spec ? sb->k : 0, .lookup_ngram = spec ? sb->lookup : 0};
    g->te = sb->te;
    g->de = spec ? sb->de : NULL;
    if (engine_profile(sb->te, true) || (g->de && engine_profile(sb->de, true)) ||
        sched_submit(s, &r, sb->err, sizeof sb->err))
        goto out;
    while (!sched_idle(s))
        if (sched_step(s, sb->err, sizeof sb->err) < 0)
            goto out;
    sched_get_stats(s, st);
    if (g->n > 1 && g->t_last > g->t_first)
        tps = (double)(g->n - 1) / (g->t_last - g->t_first);
out:
    if (sb->de)
        engine_profile(sb->de, false);
    engine_profile(sb->te, false);
    sched_release(s);
    kv_release(dkv);
    kv_release(kv);
    return tps;
}

/* Where g's decode went (from its first token to its last): the target's forwards and
 * the draft's against the probes' times t_fw and t_draft, and the rest (sampling,
 * verification, the scheduler's bookkeeping), per target forward. */
static void print_decode_split(const char *what, const struct gen_run *g, double t_fw, double t_draft)
{
    double wall = g->t_last - g->t_first;
    unsigned long long nt = g->t_last_fw.n - g->t_first_fw.n, nd = g->d_last_fw.n - g->d_first_fw.n;
    double tt = (double)(g->t_last_fw.ns - g->t_first_fw.ns) * 1e-9, td = (double)(g->d_last_fw.ns - g->d_first_fw.ns) * 1e-9;
    if (nt == 0 || wall <= 0)
        return;
    printf("  %s decode %.1f ms: %llu target forwards %.2f ms each (probe %.2f)", what, wall * 1e3, nt,
           tt / (double)nt * 1e3, t_fw * 1e3);
    if (nd)
        printf(", %llu draft forwards %.2f ms each (probe %.2f)", nd, td / (double)nd * 1e3, t_draft * 1e3);
    printf(", outside the forwards %.3f ms a step (%.1f%%)\n", (wall - tt - td) / (double)nt * 1e3,
           100 * (wall - tt - td) / wall);
}

/* The command line. */
struct bench_opts {
    const char *model_path, *draft_path;
    int64_t n_prompt, n_gen, threads, reps;
    int64_t depth;                         /* -d: positions of context before pp and tg */
    int type_k, type_v;                    /* -ctk, -ctv: KV cache types */
    int64_t max_b;                         /* the batch curve's largest B */
    int64_t batch_depth;                   /* --batch-depth: context of each of its sequences */
    int64_t bw_mib;                        /* the bandwidth block; 0: dram_probe_mib's, and cache_probe_mib's */
    int64_t draft_k, lookup;               /* --draft-tokens; --lookup's n-gram (0: none) */
    int64_t ranks, streams, delay_us;      /* --ranks (0: none) */
    bool sealed;                           /* --sealed */
};

/* Speculative decoding with the draft model or prompt lookup against plain decoding: costs,
 * acceptance, measured and predicted speed-up; 0, or 1 (message printed, or tokens that
 * differ from the plain run's). */
static int bench_draft(const struct bench_opts *o)
{
    const char *target = o->model_path, *draft = o->draft_path;
    int k = (int)o->draft_k, lookup = (int)o->lookup, threads = (int)o->threads, reps = (int)o->reps;
    int64_t n_prompt = o->n_prompt, n_gen = o->n_gen;
    struct spec_bench sb = {.k = k, .lookup = lookup, .n_prompt = n_prompt, .n_gen = n_gen};
    struct gen_run plain = {0}, spec = {0};
    int ret = 1;
    sb.ctx = n_prompt + n_gen + k + 16;
    int max_batch = (int)(n_prompt > k + 1 ? n_prompt : k + 1);
    struct engine_config ec = {.n_threads = threads, .max_batch = max_batch, .max_ctx = sb.ctx};
    struct engine_config dc = ec; /* the draft runs on the target's threads, as in the runner */
    if (model_load(&sb.tm, target, NULL, sb.err, sizeof sb.err) || engine_create(&sb.te, sb.tm, &ec, sb.err, sizeof sb.err) ||
        (draft && (model_load(&sb.dm, draft, NULL, sb.err, sizeof sb.err) ||
                   (dc.pool = engine_pool(sb.te), engine_create(&sb.de, sb.dm, &dc, sb.err, sizeof sb.err))))) {
        fprintf(stderr, "cairn bench: %s\n", sb.err);
        goto out;
    }
    sb.prompt = malloc((size_t)max_batch * sizeof *sb.prompt);
    plain.tok = malloc((size_t)n_gen * sizeof *plain.tok);
    spec.tok = malloc((size_t)n_gen * sizeof *spec.tok);
    if (!sb.prompt || !plain.tok || !spec.tok) {
        fprintf(stderr, "cairn bench: out of memory\n");
        goto out;
    }
    uint64_t x = 12345;
    for (int i = 0; i < max_batch; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        sb.prompt[i] = (int32_t)(3 + (x >> 33) % (uint64_t)(sb.tm->hp.n_vocab - 3));
    }
    printf("target: %s (%d layers, %.1f MiB of weights)\n", target, sb.tm->hp.n_layers,
           (double)sb.tm->weight_bytes / (1 << 20));
    if (draft)
        printf("draft:  %s (%d layers, %.1f MiB of weights), k = %d\n", draft, sb.dm->hp.n_layers,
               (double)sb.dm->weight_bytes / (1 << 20), k);
    else
        printf("draft:  prompt lookup (n-grams of %d..1 tokens), k = %d\n", lookup, k);
    printf("prompt: %lld random tokens; %lld greedy tokens generated; %d threads\n", (long long)n_prompt,
           (long long)n_gen, threads);

    /* Costs relative to one target decode step, after the prompt's context. */
    double t_t, t_v, t_d;
    if (measure_costs(&sb, 16 * reps, &t_t, &t_v, &t_d) || t_t <= 0) {
        fprintf(stderr, "cairn bench: %s\n", sb.err);
        goto out;
    }
    double c = t_d / t_t, v = t_v / t_t;
    printf("target decode step %.2f ms; draft step %.2f ms (c = %.3f); verifying %d tokens %.2f ms (v = %.3f)\n",
           t_t * 1e3, t_d * 1e3, c, k + 1, t_v * 1e3, v);
    if (sb.dm) { /* what c would be if each step cost its bytes read (weight_bytes: the head, not the embedding) */
        double share = (double)sb.dm->weight_bytes / (double)sb.tm->weight_bytes;
        printf("bytes a step reads: draft %.1f MiB, target %.1f MiB: the draft's share %.3f; c / share = %.2f\n",
               (double)sb.dm->weight_bytes / (1 << 20), (double)sb.tm->weight_bytes / (1 << 20), share, c / share);
    }

    double *tp = malloc((size_t)reps * sizeof *tp), *ts = malloc((size_t)reps * sizeof *ts);
    struct sched_stats st = {0}, st_plain = {0};
    bool same = true;
    for (int r = 0; r < reps && tp && ts; r++) {
        tp[r] = generate(&sb, false, &plain, &st_plain);
        ts[r] = generate(&sb, true, &spec, &st);
        if (tp[r] <= 0 || ts[r] <= 0) {
            fprintf(stderr, "cairn bench: generation failed: %s\n", sb.err);
            free(tp);
            free(ts);
            goto out;
        }
        same = same && plain.n == spec.n && !memcmp(plain.tok, spec.tok, (size_t)plain.n * sizeof *plain.tok);
    }
    if (!tp || !ts) {
        free(tp);
        free(ts);
        goto out;
    }
    double tps_plain = median(tp, reps), tps_spec = median(ts, reps);
    free(tp);
    free(ts);
    int64_t acc = st.accepted_draft_tokens, rej = st.draft_rejections;
    double alpha = acc + rej > 0 ? (double)acc / (double)(acc + rej) : 0;
    double expect = alpha < 1 ? (1 - pow(alpha, k + 1)) / (1 - alpha) : k + 1;
    double predicted = expect / (k * c + v), measured = tps_spec / tps_plain;
    printf("plain decode: %.2f tok/s (%lld steps); speculative: %.2f tok/s (%lld steps, %lld draft forwards)\n",
           tps_plain, (long long)st_plain.steps, tps_spec, (long long)st.steps, (long long)st.draft_forwards);
    print_decode_split("plain", &plain, t_t, 0);
    print_decode_split("speculative", &spec, t_v, t_d);
    printf("drafted %lld, accepted %lld, rejections %lld: alpha = accepted / (accepted + rejections) = %.3f\n",
           (long long)st.draft_tokens, (long long)acc, (long long)rej, alpha);
    printf("speed-up: measured %.2fx; predicted %.2fx = ((1 - alpha^(k+1)) / (1 - alpha)) / (k c + v) = %.2f / %.3f\n",
           measured, predicted, expect, k * c + v);
    printf("efficiency (measured / predicted): %.2f\n", measured / predicted);
    printf("greedy tokens identical to the plain run: %s\n", same ? "yes" : "NO");
    ret = same ? 0 : 1;
out:
    free(sb.prompt);
    free(plain.tok);
    free(spec.tok);
    engine_release(sb.de);
    engine_release(sb.te);
    model_release(sb.dm);
    model_release(sb.tm);
    return ret;
}

/* Prints the command's options to stderr. */
static void usage(void)
{
    fprintf(stderr,
            "usage: cairn bench -m MODEL.gguf [-p 512] [-n 128] [-d 0] [-t 2] [-r 3] [--batch-curve 16]\n"
            "  -d DEPTH: pp and tg measured after DEPTH positions of context (filled in forwards of\n"
            "  %d tokens, as llama-bench's -d); tg's roofline counts the K and V bytes each step reads\n"
            "  --batch-depth D: each sequence of the batch curve decodes after D positions of its own\n"
            "  context (as served sequences do after their prompts; default 0)\n"
            "  -ctk, -ctv TYPE: the KV cache's K and V types, f16 (default), f32, q8_0 or q4_0\n"
            "  --bandwidth-mib N: the block the bandwidth probe reads (default: for DRAM, 4x the\n"
            "  reported last-level cache, 1-8 GiB and at most a quarter of the free memory; beside\n"
            "  each tg run also as many bytes as a decode step reads when they fit that cache, so\n"
            "  that a model small enough to sit in it is held to the cache's rate)\n"
            "       cairn bench -m TARGET.gguf (--draft DRAFT.gguf | --lookup N) [--draft-tokens K]\n"
            "                   [-p 512] [-n 128] [-t 2] [-r 3]\n"
            "  --draft, --lookup: speculative decoding of -n greedy tokens after -p random prompt\n"
            "  tokens, drafting K tokens (default 4) per step with the draft model or by prompt lookup\n"
            "  of n-grams of N..1 tokens. Prints alpha (accepted / (accepted + rejections)), the\n"
            "  draft's cost per token c and the cost v of verifying K+1 tokens, both relative to one\n"
            "  target decode step, the measured speed-up against decoding without drafts, and\n"
            "  efficiency = measured / predicted, predicted = ((1-alpha^(K+1))/(1-alpha)) / (K c + v).\n"
            "       cairn bench -m MODEL.gguf --ranks W [-t 1] [--streams 8] [--delay-us 0] [--sealed] [-p 128] [-n 128]\n"
            "  --ranks: the model split by layers over W ranks of -t threads in this process, linked\n"
            "  in a ring over loopback TCP by the data plane (each frame held --delay-us, as over a\n"
            "  slower link), with one micro-batch in flight and with W, against one slice of W x -t\n"
            "  threads: greedy decode tokens/s of 1 and --streams streams, rank 0's time per step in\n"
            "  its own layers and waiting, the wire per step and per hop, each stage's idle time.\n"
            "  --sealed: the links encrypted and authenticated, as in a cluster with a secret.\n",
            DEPTH_CHUNK);
}

/* Reads the options into o; CLI_GO_ON, or the exit code. */
static int parse_opts(struct bench_opts *o, int argc, char **argv)
{
    struct args a = {argc, argv, 1, "bench", false};
    const char *v;
    *o = (struct bench_opts){.n_prompt = 512, .n_gen = 128, .threads = 2, .reps = 3, .max_b = 16, .bw_mib = 0,
                             .type_k = DT_F16, .type_v = DT_F16,
                             .draft_k = 4, .streams = 8};
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "-m|--model", &v)) o->model_path = v;
        else if (args_opt(&a, "-p|--n-prompt", &v)) o->n_prompt = args_int(&a, "-p", v, 0, 1 << 16);
        else if (args_opt(&a, "-n|--n-gen", &v)) o->n_gen = args_int(&a, "-n", v, 0, 1 << 16);
        else if (args_opt(&a, "-d|--depth", &v)) o->depth = args_int(&a, "-d", v, 0, 1 << 20);
        else if (args_opt(&a, "-ctk|--cache-type-k", &v)) o->type_k = cli_kv_type(&a, "-ctk", v);
        else if (args_opt(&a, "-ctv|--cache-type-v", &v)) o->type_v = cli_kv_type(&a, "-ctv", v);
        else if (args_opt(&a, "-t|--threads", &v)) o->threads = args_int(&a, "-t", v, 1, 512);
        else if (args_opt(&a, "-r|--repetitions", &v)) o->reps = args_int(&a, "-r", v, 1, 100);
        else if (args_opt(&a, "--batch-curve", &v)) o->max_b = args_int(&a, "--batch-curve", v, 0, 64);
        else if (args_opt(&a, "--batch-depth", &v)) o->batch_depth = args_int(&a, "--batch-depth", v, 0, 1 << 16);
        else if (args_opt(&a, "--bandwidth-mib", &v)) o->bw_mib = args_int(&a, "--bandwidth-mib", v, 1, 1 << 20);
        else if (args_opt(&a, "--draft", &v)) o->draft_path = v;
        else if (args_opt(&a, "--draft-tokens", &v)) o->draft_k = args_int(&a, "--draft-tokens", v, 1, SCHED_MAX_DRAFT);
        else if (args_opt(&a, "--lookup", &v)) o->lookup = args_int(&a, "--lookup", v, 1, SCHED_MAX_LOOKUP_NGRAM);
        else if (args_opt(&a, "--ranks", &v)) o->ranks = args_int(&a, "--ranks", v, 2, 8);
        else if (args_opt(&a, "--streams", &v)) o->streams = args_int(&a, "--streams", v, 1, 256);
        else if (args_opt(&a, "--delay-us", &v)) o->delay_us = args_int(&a, "--delay-us", v, 0, 1000000);
        else if (args_opt(&a, "--sealed", NULL)) o->sealed = true;
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn bench: unknown option '%s'\n", argv[a.i]);
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!o->model_path) {
        fprintf(stderr, "cairn bench: -m MODEL is required\n");
        return 2;
    }
    return CLI_GO_ON;
}

/* The pipelined model of --ranks against one slice (bench_pipe.c). */
static int bench_ranks(const struct bench_opts *o)
{
    struct bench_pipe_opts po = {.model_path = o->model_path, .ranks = (int)o->ranks, .threads = (int)o->threads,
                                 .streams = (int)o->streams, .n_prompt = o->n_prompt, .n_gen = o->n_gen,
                                 .delay_us = (int)o->delay_us, .sealed = o->sealed};
    if (po.n_prompt < 1 || po.n_gen < 2) {
        fprintf(stderr, "cairn bench: --ranks needs -p >= 1 and -n >= 2\n");
        return 2;
    }
    return bench_pipeline(&po);
}

/* Loads the model (its time in *t_load) and makes the engine, the cache for the prompt
 * and generation or the batch curve, and the batch buffers; 0, or -1 (message printed). */
static int bench_open(struct bench *bn, const struct bench_opts *o, double *t_load)
{
    /* room for the prompt and generation, or for the batch curve's positions */
    int64_t steps = o->reps * BATCH_CURVE_STEPS;
    int64_t ctx = o->depth + o->n_prompt + o->n_gen > steps ? o->depth + o->n_prompt + o->n_gen : steps;
    if (o->max_b > 0 && o->batch_depth + steps > ctx)
        ctx = o->batch_depth + steps;
    ctx += 16;
    int max_batch = (int)(o->n_prompt > o->max_b ? o->n_prompt : o->max_b);
    if ((o->depth > 0 || (o->max_b > 0 && o->batch_depth > 0)) && max_batch < DEPTH_CHUNK)
        max_batch = DEPTH_CHUNK;
    if (max_batch < 1)
        max_batch = 1;
    struct model_load_opts lo = {.layer_end = -1, .threads = (int)o->threads};
    *t_load = clock_sec();
    if (model_load(&bn->m, o->model_path, &lo, bn->err, sizeof bn->err)) {
        fprintf(stderr, "cairn bench: %s: %s\n", o->model_path, bn->err);
        return -1;
    }
    *t_load = clock_sec() - *t_load;
    bn->n_seqs = o->max_b > 1 ? (int)o->max_b : 1;
    struct engine_config ec = {.n_threads = (int)o->threads, .max_batch = max_batch, .max_ctx = ctx};
    bn->kc = engine_kv_config(bn->m, ctx, bn->n_seqs, 16);
    bn->kc.type_k = o->type_k;
    bn->kc.type_v = o->type_v;
    if (engine_create(&bn->e, bn->m, &ec, bn->err, sizeof bn->err) ||
        kv_create(&bn->kv, &bn->kc, bn->err, sizeof bn->err)) {
        fprintf(stderr, "cairn bench: %s\n", bn->err);
        return -1;
    }
    size_t nb = bn->nb = (size_t)max_batch;
    bn->logits = malloc(nb * (size_t)bn->m->hp.n_vocab * sizeof(float));
    bn->tokens = malloc(nb * sizeof *bn->tokens);
    bn->seqs = calloc(nb, sizeof *bn->seqs);
    bn->pos = malloc(nb * sizeof *bn->pos);
    bn->want = calloc(nb, 1);
    if (!bn->logits || !bn->tokens || !bn->seqs || !bn->pos || !bn->want) {
        fprintf(stderr, "cairn bench: out of memory\n");
        return -1;
    }
    for (size_t i = 0; i < nb; i++)
        bn->tokens[i] = (int32_t)((i * 7919 + 13) % (size_t)bn->m->hp.n_vocab);
    return 0;
}

/* Bytes of all the experts' matrices and biases of the slice (0 for a dense model). */
static uint64_t expert_bytes_all(const struct model *m)
{
    uint64_t n = 0;
    for (int l = 0; m->hp.n_expert > 0 && l < m->layer_end - m->layer_begin; l++)
        for (int e = 0; e < m->hp.n_expert; e++)
            n += model_expert_bytes(&m->layers[l], e);
    return n;
}

/* Prints the model, the CPU and kernels, and the load time. */
static void print_header(const struct bench *bn, const struct bench_opts *o, double t_load)
{
    const struct model_hparams *hp = &bn->m->hp;
    char feats[256];
    cpu_features_string(cpu_features(), feats, sizeof feats);
    printf("model: %s (%s, %d layers, n_embd %d, vocab %d, %.1f MiB file)\n", o->model_path, hp->arch, hp->n_layers,
           hp->n_embd, hp->n_vocab, (double)bn->m->file_bytes / (1 << 20));
    printf("cpu: %s; kernels: %s; threads: %lld\n", feats, kern_path_name(kern_mat_path(bn->m->output)),
           (long long)o->threads);
    printf("load (map, check, repack on %lld threads): %.0f ms\n", (long long)o->threads, t_load * 1e3);
    if (hp->n_expert > 0)
        printf("mixture of experts: %d of %d experts per token, each %d wide; weights %.1f MiB, of which a token "
               "reads %.1f MiB (active)\n", hp->n_expert_used, hp->n_expert, hp->n_ff_exp,
               (double)bn->m->all_weight_bytes / (1 << 20), (double)bn->m->weight_bytes / (1 << 20));
}

/* Fills sequence 0 with -d positions of context, in forwards of up to DEPTH_CHUNK tokens,
 * and prints how long that took; 0, or -1 (message printed). */
/* Fills sequence seq's cache with n positions, in forwards of DEPTH_CHUNK tokens; 0, or
 * -1 (message printed). */
static int fill_seq(struct bench *bn, int seq, int64_t n)
{
    kv_seq_clear(bn->kv, seq);
    for (int64_t at = 0; at < n;) {
        int64_t c = n - at < DEPTH_CHUNK ? n - at : DEPTH_CHUNK;
        for (int64_t i = 0; i < c; i++) {
            bn->seqs[i] = seq;
            bn->pos[i] = at + i;
            bn->want[i] = i == c - 1;
        }
        int rc = run(bn, (int)c);
        for (int64_t i = 0; i < c; i++)
            bn->seqs[i] = 0;
        if (rc) {
            fprintf(stderr, "cairn bench: %s\n", bn->err);
            return -1;
        }
        at += c;
    }
    return 0;
}

static int bench_fill_depth(struct bench *bn, const struct bench_opts *o)
{
    kv_seq_clear(bn->kv, 0);
    double t0 = clock_sec();
    for (int64_t at = 0; at < o->depth;) {
        int64_t c = o->depth - at < DEPTH_CHUNK ? o->depth - at : DEPTH_CHUNK;
        for (int64_t i = 0; i < c; i++) {
            bn->pos[i] = at + i;
            bn->want[i] = i == c - 1;
        }
        if (run(bn, (int)c)) {
            fprintf(stderr, "cairn bench: %s\n", bn->err);
            return -1;
        }
        at += c;
    }
    double t = clock_sec() - t0;
    printf("depth %lld: filled in %.3f s (chunks of %d, %.2f tok/s)\n", (long long)o->depth, t, DEPTH_CHUNK,
           (double)o->depth / t);
    return 0;
}

/* " @ d16384" after a figure measured at a depth, else "". */
static const char *at_depth(const struct bench_opts *o)
{
    static char buf[32];
    if (o->depth <= 0)
        return "";
    snprintf(buf, sizeof buf, " @ d%lld", (long long)o->depth);
    return buf;
}

/* Prompt processing: -p tokens in one forward, median of -r runs into pp tok/s; 0, or -1
 * (message printed). */
static int bench_prompt(struct bench *bn, const struct bench_opts *o)
{
    int64_t n_prompt = o->n_prompt;
    for (int r = 0; r < o->reps; r++) {
        kv_truncate(bn->kv, 0, o->depth);
        for (int64_t i = 0; i < n_prompt; i++) {
            bn->pos[i] = o->depth + i;
            bn->want[i] = i == n_prompt - 1;
        }
        double t0 = clock_sec();
        if (run(bn, (int)n_prompt)) {
            fprintf(stderr, "cairn bench: %s\n", bn->err);
            return -1;
        }
        bn->t[r] = clock_sec() - t0;
    }
    double med = median(bn->t, (int)o->reps);
    printf("pp%lld%s: %.2f tok/s (median of %lld, %.3f s; %.3f ms per token)\n", (long long)n_prompt, at_depth(o),
           (double)n_prompt / med, (long long)o->reps, med, med * 1e3 / (double)n_prompt);
    return 0;
}

/* The block of the machine's DRAM figure: well past the last-level cache the system
 * reports (bw_dram_block: 4x it, 1-8 GiB, at most a quarter of the free memory), unless
 * --bandwidth-mib says otherwise. Some VMs report their host's whole L3 (508 MiB on a
 * Zen 5 one): a block of one or two times that was read partly from cache. */
static int64_t dram_probe_mib(const struct bench_opts *o)
{
    if (o->bw_mib > 0)
        return o->bw_mib;
    return (int64_t)(bw_dram_block(bw_llc_bytes(), (long long)mem_available()) >> 20);
}

/* The cache-sized block beside the decode runs: as many bytes as a step reads when they
 * fit the last-level cache, so that the roofline of a model small enough to stay in it
 * is that cache's rate; 0 when the step does not fit (or --bandwidth-mib is given). */
static int64_t cache_probe_mib(const struct bench *bn, const struct bench_opts *o, double bytes_per_tok)
{
    if (o->bw_mib > 0 || !bw_fits_llc(bytes_per_tok, bn->llc))
        return 0;
    int64_t mib = (int64_t)ceil(bytes_per_tok / (1 << 20));
    return mib < 1 ? 1 : mib;
}

/* Reads a block of mib MiB in every style on the bandwidth threads: its best bytes/s,
 * or -1 (message printed). */
static double probe_best(struct bench *bn, int64_t mib, int reps)
{
    struct bw_reading bwr;
    if (bw_probe(bn->bwp, (size_t)mib << 20, reps, &bwr)) {
        fprintf(stderr, "cairn bench: the bandwidth probe failed (out of memory, or a read missed words)\n");
        return -1;
    }
    return bwr.best;
}

/* Where a mixture's decode step goes (the first run): each phase of the experts' layers
 * per token, the products' read rates, and the rest of the forward with the bytes it reads. */
static void print_moe_phases(const struct moe_stats *a, const struct moe_stats *b, double t_run, int64_t n_gen,
                             double bytes_per_tok)
{
    double n = (double)n_gen, ms = 1e-6 / n;
    double t_route = (double)(b->ns_route - a->ns_route) * ms, t_gather = (double)(b->ns_gather - a->ns_gather) * ms;
    double t_gu = (double)(b->ns_gate_up - a->ns_gate_up) * ms, t_down = (double)(b->ns_down - a->ns_down) * ms;
    double down = (double)(b->down_bytes - a->down_bytes) / n, all = (double)(b->expert_bytes - a->expert_bytes) / n;
    double t_moe = t_route + t_gather + t_gu + t_down, t_tok = t_run * 1e3 / n;
    double rest_bytes = bytes_per_tok - all;
    printf("  experts' layers (first run, per token): %.2f of %.2f ms (%.0f%%): route %.2f, gather %.2f, "
           "gate+up+act %.2f (%.2f GB/s), down+combine %.2f (%.2f GB/s); the rest %.2f ms for %.1f MiB (%.2f GB/s)\n",
           t_moe, t_tok, 100.0 * t_moe / t_tok, t_route, t_gather, t_gu, (all - down) / (t_gu * 1e6), t_down,
           down / (t_down * 1e6), t_tok - t_moe, rest_bytes / (1 << 20), rest_bytes / ((t_tok - t_moe) * 1e6));
}

/* Where a decode step goes: one more run of the -n steps after the timed ones, with the
 * pool and engine profiling on (a few clock readings a job, about 0.5 us by
 * bench_pool_rate) and each thread's schedstat read between steps, so the timed runs
 * above stay as they were. Prints the breakdown of the whole run and of its fastest step
 * (on a shared machine, the step least disturbed), and the median of the steps whose
 * threads waited for a CPU at most 1% of the step (the step of a quiet machine as far as
 * the CPUs go; a neighbour's memory traffic still counts), both against bw: the highest
 * DRAM reading beside the timed runs or of the machine line, the rate the threads read
 * when they all hold a CPU (or the cache-sized roofline). 0, or -1 (message printed). */
static int bench_decode_profiled(struct bench *bn, const struct bench_opts *o, double bytes_per_tok, double bw)
{
    int64_t n_gen = o->n_gen;
    if (n_gen <= 0 || engine_profile(bn->e, true) != 0)
        return 0; /* nothing to profile, or no memory for it: the timed figures stand alone */
    double *t_quiet = malloc((size_t)n_gen * sizeof *t_quiet);
    if (!t_quiet) {
        engine_profile(bn->e, false);
        return 0;
    }
    int rc = 0;
    struct bench_sched sch = {.n = BENCH_SCHED_MAX}, sa, sb, s_prev, s_cur;
    struct bench_step_prof pa, pb, pd, p_best;
    double t_best = 1e30, t_run = 0;
    int64_t n_quiet = 0;
    kv_truncate(bn->kv, 0, o->depth);
    bench_sched_read(bn->e, &sa);
    bench_step_snap(bn->e, &pa);
    struct bench_step_prof p0 = pa;
    s_prev = sa;
    for (int64_t i = 0; i < n_gen && !rc; i++) {
        bn->pos[0] = o->depth + i;
        double ts = clock_sec();
        rc = run(bn, 1);
        ts = clock_sec() - ts;
        t_run += ts;
        bench_step_snap(bn->e, &pb);
        if (ts < t_best) {
            t_best = ts;
            bench_step_diff(&p_best, &pa, &pb);
        }
        pa = pb;
        bench_sched_read(bn->e, &s_cur);
        long long waited = 0;
        bool known = true;
        for (int k = 0; k < s_cur.n && k < s_prev.n; k++) {
            known &= s_cur.wait_ns[k] >= 0 && s_prev.wait_ns[k] >= 0;
            waited += s_cur.wait_ns[k] - s_prev.wait_ns[k];
        }
        if (known && (double)waited <= 0.01 * ts * 1e9)
            t_quiet[n_quiet++] = ts;
        s_prev = s_cur;
    }
    if (rc)
        fprintf(stderr, "cairn bench: %s\n", bn->err);
    if (!rc) {
        bench_sched_read(bn->e, &sb);
        bench_sched_add(&sch, &sa, &sb);
        bench_step_diff(&pd, &p0, &pa);
        printf("  a profiled run of the same %lld steps after the timed ones:\n", (long long)n_gen);
        bench_print_step("step breakdown", &pd, o->threads, t_run, n_gen, &sch);
        printf("  fastest step: %.3f ms, %.2f tok/s, %.1f%% of the roofline\n", t_best * 1e3, 1.0 / t_best,
               100.0 * bytes_per_tok / t_best / bw);
        bench_print_step("fastest step's breakdown", &p_best, o->threads, t_best, 1, NULL);
        if (n_quiet > 0) {
            double tq = median(t_quiet, (int)n_quiet);
            printf("  steps whose threads waited for a CPU at most 1%% of the step: %lld of %lld, median "
                   "%.3f ms, %.2f tok/s, %.1f%% of the roofline\n",
                   (long long)n_quiet, (long long)n_gen, tq * 1e3, 1.0 / tq, 100.0 * bytes_per_tok / tq / bw);
        } else {
            printf("  steps whose threads waited for a CPU at most 1%% of the step: none of %lld\n", (long long)n_gen);
        }
    }
    engine_profile(bn->e, false);
    free(t_quiet);
    return rc;
}

/* One reading of the DRAM block between decode groups: its best slice (bytes/s), or -1
 * (message printed). It reads PROBE_BURST slices, and more, up to PROBE_BURST_MAX, until
 * PROBE_SHARED of them were shared by every thread: with a neighbour's load a thread
 * may not get a CPU for a dozen slices, and a slice it did not share is no ceiling. */
static double probe_burst(struct bench *bn)
{
    struct bw_reading r = {0};
    int rc = bw_block_read(bn->bwb, bn->bwp, PROBE_BURST, NULL, &r);
    while (!rc && r.shared < PROBE_SHARED && r.reads < PROBE_BURST_MAX)
        rc = bw_block_read(bn->bwb, bn->bwp, N_BW_STYLES, NULL, &r);
    if (rc || r.best <= 0) {
        fprintf(stderr, "cairn bench: the bandwidth probe failed (a read missed words)\n");
        return -1;
    }
    bn->burst_slices += r.reads;
    bn->bursts++;
    return r.best;
}

/* One timed run of the -n decode steps in groups of `group` steps, the DRAM block read
 * before the first group and after each, outside the groups' times: group g took
 * t_group[g] between the readings bw[g] and bw[g + 1]. The number of groups, or -1
 * (message printed). */
static int decode_run_probed(struct bench *bn, const struct bench_opts *o, int64_t group, double *t_group, double *bw)
{
    int n_groups = 0;
    if ((bw[0] = probe_burst(bn)) < 0)
        return -1;
    for (int64_t i = 0; i < o->n_gen; n_groups++) {
        int64_t end = i + group < o->n_gen ? i + group : o->n_gen;
        double t0 = clock_sec();
        for (; i < end; i++) {
            bn->pos[0] = o->depth + i;
            if (run(bn, 1)) {
                fprintf(stderr, "cairn bench: %s\n", bn->err);
                return -1;
            }
        }
        t_group[n_groups] = clock_sec() - t0;
        if ((bw[n_groups + 1] = probe_burst(bn)) < 0)
            return -1;
    }
    return n_groups;
}

/* A run's groups against the readings beside them (bytes/s and shares): the lowest and
 * highest reading, decode rate and decode's share of the higher reading beside its group. */
struct group_span {
    double probe_lo, probe_hi, decode_lo, decode_hi, share_lo, share_hi;
    int n_groups;
};

static struct group_span group_span(const double *t_group, const double *bw, int n_groups, int64_t group,
                                    int64_t n_gen, double bytes_per_tok)
{
    struct group_span s = {bw[0], bw[0], 1e30, 0, 1e30, 0, n_groups};
    for (int g = 0; g < n_groups; g++) {
        int64_t steps = n_gen - g * group < group ? n_gen - g * group : group;
        double rate = (double)steps * bytes_per_tok / t_group[g];
        double share = rate / (bw[g] > bw[g + 1] ? bw[g] : bw[g + 1]);
        s.probe_lo = fmin(s.probe_lo, bw[g + 1]);
        s.probe_hi = fmax(s.probe_hi, bw[g + 1]);
        s.decode_lo = fmin(s.decode_lo, rate);
        s.decode_hi = fmax(s.decode_hi, rate);
        s.share_lo = fmin(s.share_lo, share);
        s.share_hi = fmax(s.share_hi, share);
    }
    return s;
}

/* Token generation: -n decode steps of one token, median of -r runs into tg tok/s, and
 * the share of the roofline that bytes read per token and bandwidth allow; 0, or -1
 * (message printed, or out of memory). */
static int bench_decode(struct bench *bn, const struct bench_opts *o)
{
    int64_t n_gen = o->n_gen;
    int reps = (int)o->reps;
    /* Bytes one decode step reads: every weight of the slice once, one embedding row, and
     * the K and V of every position before it (on average over the run). */
    double kv_pos_bytes = (double)kv_bytes_for(&bn->kc) / ((double)bn->kc.n_blocks * bn->kc.block_tokens);
    double bytes_per_tok = (double)bn->m->weight_bytes + (double)bn->m->tok_embd_row_bytes +
                           kv_pos_bytes * ((double)o->depth + (double)(n_gen + 1) / 2.0);
    /* Of a mixture of experts, the experts' bytes are those the engine counted as read
     * (run 0 replaces the estimate's by them). Both count an expert's matrices and biases
     * (model_expert_bytes), so at one token a step, n_expert_used experts a layer, the
     * count equals the estimate and the group chosen below from the estimate stays the
     * one the corrected bytes would choose; moe_fixed held every expert's biases when the
     * count had only matrices (gpt-oss-20b: 23 MB a token too many, 1% of its roofline). */
    struct moe_stats s0 = engine_moe_stats(bn->e);
    double moe_fixed = (double)bn->m->all_weight_bytes - (double)expert_bytes_all(bn->m);
    /* The host's bandwidth moves within seconds on a shared machine, so the DRAM block is
     * read between groups of DECODE_GROUP steps and each group is held against the higher
     * reading beside it (bw_interleaved_roofline); a step that fits the last-level cache
     * runs in one group (a reading would evict it) and is held against a block of the
     * step's size read after the run, which is then the roofline. The figure is the
     * median of the runs' ratios. */
    int64_t group = cache_probe_mib(bn, o, bytes_per_tok) > 0 ? n_gen : DECODE_GROUP;
    int max_groups = (int)((n_gen + group - 1) / group);
    double *bw_run = malloc((size_t)reps * sizeof *bw_run), *ratio = malloc((size_t)reps * sizeof *ratio);
    double *bw_dram = malloc((size_t)reps * sizeof *bw_dram);
    double *t_group = malloc((size_t)max_groups * sizeof *t_group);
    double *bw_side = malloc((size_t)(max_groups + 1) * sizeof *bw_side);
    struct group_span *spans = malloc((size_t)reps * sizeof *spans);
    int rc = bw_run && ratio && bw_dram && t_group && bw_side && spans ? 0 : -1;
    if (!rc) {
        memset(bn->want, 0, bn->nb);
        bn->want[0] = 1;
    }
    for (int r = 0; r < reps && !rc; r++) {
        kv_truncate(bn->kv, 0, o->depth);
        int n_groups = decode_run_probed(bn, o, group, t_group, bw_side);
        if (n_groups < 0) {
            rc = -1;
            break;
        }
        bn->t[r] = 0;
        for (int g = 0; g < n_groups; g++)
            bn->t[r] += t_group[g];
        if (r == 0 && bn->m->hp.n_expert > 0) {
            struct moe_stats s1 = engine_moe_stats(bn->e);
            bytes_per_tok += moe_fixed + (double)(s1.expert_bytes - s0.expert_bytes) / (double)n_gen -
                             (double)bn->m->weight_bytes;
            print_moe_phases(&s0, &s1, bn->t[r], n_gen, bytes_per_tok);
        }
        int64_t cache_mib = cache_probe_mib(bn, o, bytes_per_tok);
        bw_dram[r] = bw_interleaved_roofline(t_group, bw_side, n_groups);
        bw_run[r] = cache_mib > 0 ? probe_best(bn, cache_mib, 3 * N_BW_STYLES) : bw_dram[r];
        if (bw_dram[r] <= 0 || bw_run[r] <= 0) {
            rc = -1;
            break;
        }
        ratio[r] = ((double)n_gen / bn->t[r]) * bytes_per_tok / bw_run[r];
        spans[r] = group_span(t_group, bw_side, n_groups, group, n_gen, bytes_per_tok);
    }
    if (!rc) {
        double tps = (double)n_gen / median(bn->t, reps), bw_med = median(bw_run, reps);
        double dram_med = median(bw_dram, reps);
        int64_t cache_mib = cache_probe_mib(bn, o, bytes_per_tok);
        printf("tg%lld%s: %.2f tok/s (median of %lld); reads %.1f MiB/token, %.2f GB/s; bandwidth beside the runs "
               "(medians): %s %.2f GB/s (%lld MiB block)",
               (long long)n_gen, at_depth(o), tps, (long long)reps, bytes_per_tok / (1 << 20),
               tps * bytes_per_tok / 1e9, o->bw_mib > 0 ? "--bandwidth-mib" : "DRAM", dram_med / 1e9,
               (long long)bn->dram_mib);
        if (cache_mib > 0)
            printf(", cache-sized %.2f GB/s (%lld MiB block: the step fits the %.0f MiB last-level cache)",
                   bw_med / 1e9, (long long)cache_mib, (double)bn->llc / (1 << 20));
        printf("; roofline %.2f tok/s (%s); %.1f%% of roofline (median of the runs' ratios)\n", bw_med / bytes_per_tok,
               cache_mib > 0 ? "cache-sized" : o->bw_mib > 0 ? "--bandwidth-mib" : "DRAM", 100.0 * median(ratio, reps));
        for (int r = 0; r < reps; r++) {
            const struct group_span *s = &spans[r];
            printf("  run %d, %d groups of %lld steps: DRAM probe between them %.2f-%.2f GB/s (%.1f slices of %.0f "
                   "MiB a reading), decode %.2f-%.2f GB/s, %.1f-%.1f%% of the higher reading beside each group\n",
                   r + 1, s->n_groups, (long long)group, s->probe_lo / 1e9, s->probe_hi / 1e9,
                   (double)bn->burst_slices / (double)bn->bursts,
                   (double)bw_slice_bytes(bn->bwb, (int)o->threads) / (1 << 20), s->decode_lo / 1e9,
                   s->decode_hi / 1e9, 100.0 * s->share_lo, 100.0 * s->share_hi);
        }
        /* Decode faster than the probe means the probe missed the machine's ceiling (or the
         * weights partly sit in cache): the percentage is then no upper bound. */
        if (tps * bytes_per_tok > bw_med * 1.02)
            printf("  note: decode read faster than the bandwidth probe; the roofline here is a floor, not a "
                   "ceiling%s\n",
                   cache_mib == 0 && bn->llc > 0 && bytes_per_tok < (double)bn->llc * BW_DRAM_LLC_TIMES
                       ? " (the step is within a few times the reported last-level cache, which may hold part of it)"
                       : "");
        /* A busy neighbour may hold one of the threads' CPUs through all the readings
         * beside a group, while the fastest step is one in which every thread ran: single
         * steps are held against the highest reading of the runs and the machine line. */
        double bw_top = bn->bw_machine;
        for (int r = 0; r < reps; r++)
            bw_top = fmax(bw_top, spans[r].probe_hi);
        rc = bench_decode_profiled(bn, o, bytes_per_tok, cache_mib > 0 ? bw_med : bw_top);
    }
    free(spans);
    free(bw_side);
    free(t_group);
    free(bw_dram);
    free(bw_run);
    free(ratio);
    return rc ? -1 : 0;
}

/* The batch curve: B sequences each decode one token per forward, B = 1..--batch-curve,
 * cost relative to B = 1; 0, or -1 (message printed). */
static int bench_batch_curve(struct bench *bn, const struct bench_opts *o)
{
    const int steps = BATCH_CURVE_STEPS;
    const int64_t d = o->batch_depth;
    double base = 0;
    for (int s = 0; s < bn->n_seqs && d > 0; s++)
        if (fill_seq(bn, s, d))
            return -1;
    printf("batch cost (one forward over B tokens of B sequences%s, relative to B = 1):\n",
           d > 0 ? ", each after its own context of --batch-depth positions" : "");
    for (int B = 1; B <= o->max_b; B++) {
        for (int s = 0; s < bn->n_seqs; s++)
            kv_truncate(bn->kv, s, d);
        struct moe_stats s0 = engine_moe_stats(bn->e);
        for (int r = 0; r < o->reps; r++) {
            double t0 = clock_sec();
            for (int k = 0; k < steps; k++) {
                for (int i = 0; i < B; i++) {
                    bn->seqs[i] = i;
                    bn->pos[i] = d + (int64_t)r * steps + k;
                    bn->want[i] = 1;
                }
                if (run(bn, B)) {
                    fprintf(stderr, "cairn bench: %s\n", bn->err);
                    return -1;
                }
            }
            bn->t[r] = (clock_sec() - t0) / steps;
        }
        struct moe_stats s1 = engine_moe_stats(bn->e);
        double med = median(bn->t, (int)o->reps);
        if (B == 1)
            base = med;
        printf("  B=%2d%s: %7.2f ms  x%.2f  (%.1f tok/s)", B, d > 0 ? " @ batch depth" : "", med * 1e3, med / base,
               B / med);
        if (s1.steps > s0.steps) /* experts read per forward: each chosen expert once for all its tokens */
            printf("  experts: %.1f runs, %.1f MiB per forward (%.1f MiB per token)",
                   (double)(s1.expert_runs - s0.expert_runs) / (double)(steps * o->reps),
                   (double)(s1.expert_bytes - s0.expert_bytes) / (double)(steps * o->reps) / (1 << 20),
                   (double)(s1.expert_bytes - s0.expert_bytes) / (double)(steps * o->reps * B) / (1 << 20));
        if (s1.steps > s0.steps) { /* where the forward goes: the experts' phases, then the rest */
            double ms = 1e-6 / (double)(steps * o->reps), mean = 0; /* the phases' mean, so the runs' mean */
            for (int r = 0; r < o->reps; r++)
                mean += bn->t[r] / (double)o->reps;
            double t_route = (double)(s1.ns_route - s0.ns_route) * ms, t_gather = (double)(s1.ns_gather - s0.ns_gather) * ms;
            double t_gu = (double)(s1.ns_gate_up - s0.ns_gate_up) * ms, t_down = (double)(s1.ns_down - s0.ns_down) * ms;
            printf("; ms per forward: route %.2f, gather %.2f, gate+up+act %.2f, down+combine %.2f, the rest %.2f",
                   t_route, t_gather, t_gu, t_down, mean * 1e3 - (t_route + t_gather + t_gu + t_down));
        }
        printf("\n");
    }
    memset(bn->seqs, 0, bn->nb * sizeof *bn->seqs);
    return 0;
}

/* Memory read bandwidth, then prompt processing, token generation and the batch curve as
 * asked; 0, or -1 (message printed where there is one). */
static int bench_speeds(struct bench *bn, const struct bench_opts *o)
{
    /* Bandwidth read by the engine's own threads (a second pool's would wake from sleep
     * beside the engine's spinning ones and share their CPUs), measured in this run. */
    bn->bwp = engine_pool(bn->e);
    /* The machine's figure: DRAM, a block well past the last-level cache, the best of
     * 16 slices in each style; the block is kept for the readings beside the decode runs. */
    bn->llc = bw_llc_bytes();
    bn->dram_mib = dram_probe_mib(o);
    struct bw_reading bwr = {0};
    int64_t mib = bn->dram_mib;
    if (bw_block_create(&bn->bwb, (size_t)mib << 20, NULL) ||
        bw_block_read(bn->bwb, bn->bwp, PROBE_MACHINE, NULL, &bwr)) {
        fprintf(stderr, "cairn bench: the bandwidth probe failed (out of memory, or a read missed words)\n");
        return -1;
    }
    printf("memory read bandwidth (%s: %lld MiB block, last-level cache %.0f MiB as reported, %lld threads): "
           "%.2f GB/s, best of:",
           o->bw_mib > 0 ? "--bandwidth-mib" : "DRAM", (long long)mib, (double)bn->llc / (1 << 20),
           (long long)o->threads, bwr.best / 1e9);
    for (int st = 0; st < N_BW_STYLES; st++)
        printf("%s %s %.2f", st ? "," : "", bw_style_name(st), bwr.by_style[st] / 1e9);
    bn->bw_machine = bwr.best;
    printf(" (the best of %d slices of %.0f MiB)", bwr.reads,
           (double)bw_slice_bytes(bn->bwb, (int)o->threads) / (1 << 20));
    printf("\n");
    bn->t = malloc((size_t)o->reps * sizeof *bn->t);
    if (!bn->t)
        return -1;
    if (o->depth > 0 && bench_fill_depth(bn, o))
        return -1;
    if (o->n_prompt > 0 && bench_prompt(bn, o))
        return -1;
    if (o->n_gen > 0 && bench_decode(bn, o))
        return -1;
    if (o->max_b > 0 && bench_batch_curve(bn, o))
        return -1;
    return 0;
}

/* Releases what bn holds. */
static void bench_release(struct bench *bn)
{
    free(bn->t);
    bw_block_release(bn->bwb);
    free(bn->logits);
    free(bn->tokens);
    free(bn->seqs);
    free(bn->pos);
    free(bn->want);
    kv_release(bn->kv);
    engine_release(bn->e);
    model_release(bn->m);
}

/* The plain bench of one model: load, bandwidth, pp, tg against the roofline, the batch
 * curve and resident memory; 0, or 1. */
static int bench_model(const struct bench_opts *o)
{
    struct bench bn = {0};
    double t_load;
    int ret = 1;
    if (bench_open(&bn, o, &t_load)) {
        bench_release(&bn);
        return 1;
    }
    print_header(&bn, o, t_load);
    if (!bench_speeds(&bn, o)) {
        free(bn.t);
        bn.t = NULL;
        bw_block_release(bn.bwb);
        bn.bwb = NULL;
        /* Resident memory against what the model and cache need (the bandwidth block is freed). */
        double mib = 1 << 20;
        printf("resident memory: %.1f MiB now (model file %.1f MiB, weights %.1f MiB, KV %.1f MiB)\n",
               (double)mem_rss() / mib, (double)bn.m->file_bytes / mib, (double)bn.m->all_weight_bytes / mib,
               (double)kv_bytes_for(&bn.kc) / mib);
        ret = 0;
    }
    bench_release(&bn);
    return ret;
}

int cli_bench(int argc, char **argv)
{
    struct bench_opts o;
    int ret = parse_opts(&o, argc, argv);
    if (ret != CLI_GO_ON)
        return ret;
    if (o.ranks)
        return bench_ranks(&o);
    if (o.draft_path && o.lookup) {
        fprintf(stderr, "cairn bench: --draft and --lookup are two modes; give one\n");
        return 2;
    }
    if (o.draft_path || o.lookup) {
        if (o.n_prompt < 1 || o.n_gen < 2) {
            fprintf(stderr, "cairn bench: speculative decoding needs -p >= 1 and -n >= 2\n");
            return 2;
        }
        return bench_draft(&o);
    }
    return bench_model(&o);
}
