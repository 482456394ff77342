/* Tiled attention (attn.h) at long context: against a float64 reference on random
 * sequences up to 32k positions, and bit for bit the same result for a query row however
 * its prompt was chunked, whatever else is in the batch, with 1-3 threads, and on every
 * SIMD variant. Shapes are tiny (2 query heads, 1 or 2 KV heads) to keep it to seconds;
 * under sanitizers the sequences are shorter. */
#define _GNU_SOURCE /* held_pool.h */
#include "base/dtype.h"
#include "base/pool.h"
#include "engine/attn.h"
#include "engine/kv.h"
#include "engine/vec.h"
#include "kern/kern.h"
#include "held_pool.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(CAIRN_EMULATED) /* slow builds: smaller sizes */
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

struct fix {
    struct attn_shape sh;
    int64_t kv_dim, q_dim;
    struct kv_cache *kv;
    struct attn *a;
    int max_batch;
    float *k, *v; /* (n_seqs x n_pos x kv_dim) what was written, as the cache rounds it */
    int n_seqs;
    int64_t n_pos;
    int type_k;
};

static int fix_open(struct fix *f, struct attn_shape sh, int bt, int type_k, int type_v, int n_seqs, int64_t n_pos,
                    int max_batch, int threads)
{
    memset(f, 0, sizeof *f);
    f->sh = sh;
    f->kv_dim = (int64_t)sh.n_head_kv * sh.head_dim;
    f->q_dim = (int64_t)sh.n_head * sh.head_dim;
    f->n_seqs = n_seqs;
    f->n_pos = n_pos;
    f->max_batch = max_batch;
    f->type_k = type_k;
    char err[256];
    struct kv_config kc = {.n_layers = 1, .kv_dim = f->kv_dim, .block_tokens = bt,
                           .n_blocks = n_seqs * ((n_pos + bt - 1) / bt), .max_seqs = n_seqs, .type_k = type_k, .type_v = type_v};
    if (kv_create(&f->kv, &kc, err, sizeof err) || attn_create(&f->a, &sh, threads, max_batch, n_pos)) {
        fprintf(stderr, "kv/attn: %s\n", err);
        return -1;
    }
    f->k = malloc((size_t)(n_seqs * n_pos * f->kv_dim) * sizeof(float));
    f->v = malloc((size_t)(n_seqs * n_pos * f->kv_dim) * sizeof(float));
    return f->k && f->v ? 0 : -1;
}

static void fix_close(struct fix *f)
{
    attn_release(f->a);
    kv_release(f->kv);
    free(f->k);
    free(f->v);
}

/* Fills every position of every sequence with random K and V (amplitude amp), and
 * plants, for position `spike` of each sequence, a key along q_dir (so one far position
 * dominates the softmax of rows that look for it). */
static void fill(struct fix *f, uint64_t seed, float amp, const float *q_dir, int64_t spike)
{
    float *k = malloc((size_t)f->kv_dim * sizeof *k), *v = malloc((size_t)f->kv_dim * sizeof *v);
    for (int s = 0; s < f->n_seqs; s++) {
        if (kv_prepare(f->kv, s, 0, f->n_pos))
            abort();
        for (int64_t p = 0; p < f->n_pos; p++) {
            for (int64_t i = 0; i < f->kv_dim; i++) {
                k[i] = test_rand_float(&seed) * amp;
                v[i] = test_rand_float(&seed);
                if (q_dir && p == spike)
                    k[i] = q_dir[i % f->sh.head_dim] * 8.0f;
            }
            attn_kv_write(f->kv, vec_ops_best(), 0, kv_slot(f->kv, s, p), f->sh.head_dim, k, v);
            /* the reference sees what the cache holds */
            size_t o = ((size_t)s * (size_t)f->n_pos + (size_t)p) * (size_t)f->kv_dim;
            attn_kv_read(f->kv, 0, kv_slot(f->kv, s, p), f->sh.head_dim, f->k + o, f->v + o);
        }
    }
    free(k);
    free(v);
}

/* Overwrites positions [from, to) of seq with NaN: a read of them shows in the result. */
static void poison_range(struct fix *f, int seq, int64_t from, int64_t to)
{
    float *nan = malloc((size_t)f->kv_dim * sizeof *nan);
    for (int64_t i = 0; i < f->kv_dim; i++)
        nan[i] = NAN;
    for (int64_t p = from; p < to; p++)
        attn_kv_write(f->kv, vec_ops_best(), 0, kv_slot(f->kv, seq, p), f->sh.head_dim, nan, nan);
    free(nan);
}

/* Poisons positions [from, n_pos) of seq: a read past a row's position shows. */
static void poison(struct fix *f, int seq, int64_t from) { poison_range(f, seq, from, f->n_pos); }

/* The first position a row at pos sees with a sliding window (0: none). */
static int64_t window_start(int64_t pos, int64_t window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }

/* Restores positions [from, to) of seq from the copy. */
static void restore(struct fix *f, int seq, int64_t from, int64_t to)
{
    for (int64_t p = from; p < to; p++) {
        size_t o = ((size_t)seq * (size_t)f->n_pos + (size_t)p) * (size_t)f->kv_dim;
        attn_kv_write(f->kv, vec_ops_best(), 0, kv_slot(f->kv, seq, p), f->sh.head_dim, f->k + o, f->v + o);
    }
}

/* Attention sinks of the calls and references below (gpt-oss; NULL: none), one per head. */
static const float *g_sinks;

/* Attention of one row in float64 from the rounded K and V, over positions
 * (pos - window, pos] (window 0: [0, pos]); with g_sinks, head h's sink joins the softmax's
 * maximum and denominator. With Q8_0 K the query is rounded too, as the contract rounds it
 * (vec.h vec_q8_query of q * (1 / sqrtf(hd)) in float): the reference sees what the
 * engine multiplies, as it sees the cache's K, and the tolerance stays that of the float
 * sums. */
static void ref_row(const struct fix *f, int seq, int64_t pos, const float *q, double *out, int64_t window)
{
    int64_t p0 = window_start(pos, window);
    int hd = f->sh.head_dim, group = f->sh.n_head / f->sh.n_head_kv;
    double *s = malloc((size_t)(pos + 1) * sizeof *s);
    double scale = 1.0 / sqrt((double)hd);
    float *qf = malloc((size_t)hd * sizeof *qf);
    double *qq = malloc((size_t)hd * sizeof *qq); /* the rounded query, scaled */
    char *row = malloc(VEC_Q8_ROW_BYTES((size_t)hd));
    for (int h = 0; h < f->sh.n_head; h++) {
        int64_t ko = (int64_t)(h / group) * hd;
        double mx = -INFINITY, sum = 0.0, qs = scale;
        for (int i = 0; i < hd; i++)
            qq[i] = q[h * hd + i];
        if (f->type_k == DT_Q8_0) {
            float sc = 1.0f / sqrtf((float)hd);
            for (int i = 0; i < hd; i++)
                qf[i] = q[h * hd + i] * sc;
            vec_q8_query(qf, hd, row);
            for (int i = 0; i < hd; i++) {
                float d;
                memcpy(&d, row + hd + 4 * (i / 32), sizeof d);
                qq[i] = (double)(int8_t)row[i] * d;
            }
            qs = 1.0;
        }
        for (int64_t p = p0; p <= pos; p++) {
            const float *k = f->k + ((size_t)seq * (size_t)f->n_pos + (size_t)p) * (size_t)f->kv_dim + ko;
            double d = 0.0;
            for (int i = 0; i < hd; i++)
                d += qq[i] * k[i];
            s[p] = d * qs;
            mx = s[p] > mx ? s[p] : mx;
        }
        if (g_sinks) {
            mx = g_sinks[h] > mx ? g_sinks[h] : mx;
            sum += exp(g_sinks[h] - mx);
        }
        for (int i = 0; i < hd; i++)
            out[h * hd + i] = 0.0;
        for (int64_t p = p0; p <= pos; p++) {
            double w = exp(s[p] - mx);
            sum += w;
            const float *v = f->v + ((size_t)seq * (size_t)f->n_pos + (size_t)p) * (size_t)f->kv_dim + ko;
            for (int i = 0; i < hd; i++)
                out[h * hd + i] += w * v[i];
        }
        for (int i = 0; i < hd; i++)
            out[h * hd + i] /= sum;
    }
    free(s);
    free(qf);
    free(qq);
    free(row);
}

/* Random sequences of up to 32k positions (4k sanitized; the other shapes 8k), caches of F16, F32, Q8_0 and
 * Q4_0 (K and V of different types too), GQA and not: rows at chosen positions against
 * float64 over what the cache holds, max error relative to the largest output 2e-5
 * (float accumulation over 32k terms), with a spike key found from 32k away. */
static void reference(int64_t window)
{
    struct attn_shape shapes[] = {{2, 1, 64}, {4, 2, 32}, {2, 2, 96}};
    const int tk[] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0, DT_Q8_0}, tv[] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0, DT_F16};
    uint64_t seed = 7;
    for (int si = 0; si < 3; si++)
        for (int type = 0; type < (window ? 2 : 5); type++) {
            struct fix f;
            struct pool *pool = NULL;
            int bt = si == 2 ? 12 : 16; /* blocks that do not divide a tile, too */
            int64_t n_pos = (si == 0 ? 32768 : 8192) / (SANITIZED ? 8 : 1);
            if (fix_open(&f, shapes[si], bt, tk[type], tv[type], 1, n_pos, 8, 2) || pool_create(&pool, 2)) {
                CHECK(0, "setup");
                return;
            }
            float *q = malloc((size_t)f.q_dim * 8 * sizeof *q), *out = malloc((size_t)f.q_dim * 8 * sizeof *out);
            double *ref = malloc((size_t)f.q_dim * sizeof *ref);
            for (int64_t i = 0; i < f.q_dim * 8; i++)
                q[i] = test_rand_float(&seed) * 3.0f;
            fill(&f, seed + 1, 1.0f, q, 17);
            int64_t pos[8] = {0, 17, 255, 256, 1000, n_pos / 2 + 3, n_pos - 2, n_pos - 1};
            int32_t seq[8] = {0};
            /* the batch is not one run: positions jump, each token's own run */
            for (int b = 0; b < 8; b++) {
                /* positions before the window are poisoned: a read of one shows as NaN */
                int64_t w0 = window_start(pos[b], window);
                poison_range(&f, 0, 0, w0);
                attn_forward_sinks(f.a, pool, vec_ops_best(), f.kv, 0, 1, seq, pos + b, q + b * f.q_dim,
                                   out + b * f.q_dim, window, g_sinks);
                restore(&f, 0, 0, w0);
                ref_row(&f, 0, pos[b], q + b * f.q_dim, ref, window);
                double mx = 0.0, err = 0.0;
                for (int64_t i = 0; i < f.q_dim; i++) {
                    mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
                    double e = fabs(out[b * f.q_dim + i] - ref[i]);
                    err = e > err || e != e ? e : err;
                }
                CHECK(err <= 2e-5 * mx, "shape %d K %s V %s pos %lld window %lld: max error %.3g of %.3g", si,
                      dtype_name(tk[type]), dtype_name(tv[type]), (long long)pos[b], (long long)window, err, mx);
            }
            free(q);
            free(out);
            free(ref);
            pool_release(pool);
            fix_close(&f);
        }
}

static void test_reference(void)
{
    reference(0);
    /* sliding windows (gemma3's 512, and one that is no multiple of a block or tile) */
    reference(512);
    reference(1000);
}

/* Runs rows [from, to) of seq (q rows of the whole prompt) in one call. */
static int64_t g_window; /* the sliding window of the calls below (0: none) */

static void run_rows(struct fix *f, struct pool *pool, const struct vec_ops *vec, int seq, int64_t from, int64_t to,
                     const float *q, float *out, int32_t *seqs, int64_t *pos)
{
    for (int64_t p = from; p < to; p++) {
        seqs[p - from] = seq;
        pos[p - from] = p;
    }
    attn_forward_sinks(f->a, pool, vec, f->kv, 0, (int)(to - from), seqs, pos, q + from * f->q_dim,
                       out + from * f->q_dim, g_window, g_sinks);
}


/* A prompt of 16k positions (2k sanitized; 4k with Q8_0 K and Q4_0 V) in one call, then in chunks of random sizes
 * (1 to 700, and runs of 1-4 tokens that take the split path), with the positions not
 * yet "written" poisoned, with 1, 2 and 3 threads (3 also with the workers held off, so
 * that the caller alone does the claimed items), and with another sequence's rows in the
 * same calls: every row the same bits. */
static void chunked(int64_t n, int type_k, int type_v)
{
    struct attn_shape sh = {2, 1, 32};
    struct fix f;
    struct pool *pools[4] = {NULL, NULL, NULL, NULL};
    struct held held = {0};
    if (fix_open(&f, sh, 16, type_k, type_v, 2, n, (int)n, 3) || pool_create(&pools[0], 1) || pool_create(&pools[1], 2) ||
        pool_create(&pools[2], 3) || held_open(&held, 3) || pool_profile(held.pool, true)) {
        CHECK(0, "setup");
        return;
    }
    uint64_t seed = 11;
    size_t nq = (size_t)n * (size_t)f.q_dim;
    float *q = malloc(nq * sizeof *q), *q2 = malloc(nq * sizeof *q2);
    float *one = malloc(nq * sizeof *one), *chunked = malloc(nq * sizeof *chunked);
    float *other = malloc(nq * sizeof *other), *mixed_q = malloc(2 * 700 * (size_t)f.q_dim * sizeof *mixed_q);
    float *mixed_out = malloc(2 * 700 * (size_t)f.q_dim * sizeof *mixed_out);
    int32_t *seqs = malloc((size_t)n * sizeof *seqs);
    int64_t *pos = malloc((size_t)n * sizeof *pos);
    for (size_t i = 0; i < nq; i++) {
        q[i] = test_rand_float(&seed) * 4.0f;
        q2[i] = test_rand_float(&seed) * 4.0f;
    }
    fill(&f, 12, 1.0f, NULL, 0);
    run_rows(&f, pools[1], vec_ops_best(), 0, 0, n, q, one, seqs, pos);
    /* sequence 1's rows, one shot, for the mixed batches */
    run_rows(&f, pools[1], vec_ops_best(), 1, 0, n, q2, other, seqs, pos);

    int64_t at = 0;
    int bad = 0, bad_other = 0, calls = 0;
    int64_t poisoned = 0; /* positions [0, poisoned) of sequence 0 poisoned behind the window */
    poison(&f, 0, 0);
    while (at < n) {
        int64_t c = (int64_t)(test_rand_u64(&seed) % 3 == 0 ? 1 + test_rand_u64(&seed) % 4 : 1 + test_rand_u64(&seed) % 700);
        c = c > n - at ? n - at : c;
        restore(&f, 0, at, at + c);
        pools[3] = held.pool;
        struct pool *pool = pools[calls % 4];
        if (pool == held.pool)
            held_enter(&held, true);
        if (calls % 5 == 3) {
            /* interleave the chunk with as many rows of sequence 1 at other positions */
            int m = 0;
            for (int64_t i = 0; i < c; i++) {
                int64_t p2 = (at * 7 + 13) % (n - c) + i;
                seqs[m] = 1, pos[m] = p2;
                memcpy(mixed_q + (size_t)m++ * (size_t)f.q_dim, q2 + p2 * f.q_dim, (size_t)f.q_dim * sizeof *q);
                seqs[m] = 0, pos[m] = at + i;
                memcpy(mixed_q + (size_t)m++ * (size_t)f.q_dim, q + (at + i) * f.q_dim, (size_t)f.q_dim * sizeof *q);
            }
            attn_forward_sinks(f.a, pool, vec_ops_best(), f.kv, 0, m, seqs, pos, mixed_q, mixed_out, g_window, g_sinks);
            for (int i = 0; i < m; i++) {
                const float *want = seqs[i] ? other + pos[i] * f.q_dim : one + pos[i] * f.q_dim;
                if (memcmp(mixed_out + (size_t)i * (size_t)f.q_dim, want, (size_t)f.q_dim * sizeof *want)) {
                    bad_other += seqs[i];
                    bad += !seqs[i];
                }
            }
        } else {
            run_rows(&f, pool, vec_ops_best(), 0, at, at + c, q, chunked, seqs, pos);
            for (int64_t p = at; p < at + c; p++)
                bad += memcmp(chunked + p * f.q_dim, one + p * f.q_dim, (size_t)f.q_dim * sizeof *one) != 0;
        }
        if (pool == held.pool)
            held_enter(&held, false);
        at += c;
        calls++;
        /* with a window, what no later row sees is poisoned too */
        poison_range(&f, 0, poisoned, window_start(at, g_window));
        poisoned = window_start(at, g_window) > poisoned ? window_start(at, g_window) : poisoned;
    }
    /* decode steps of 1-4 rows at random places of the whole prompt on the held pool: the
     * split attention by tiles (no window) and its merge done by the caller alone */
    for (int s = 0; s < 24 && g_window == 0; s++) {
        int64_t c = 1 + (int64_t)(test_rand_u64(&seed) % 4), p0 = (int64_t)(test_rand_u64(&seed) % (uint64_t)(n - c + 1));
        held_enter(&held, true);
        run_rows(&f, held.pool, vec_ops_best(), 0, p0, p0 + c, q, chunked, seqs, pos);
        held_enter(&held, false);
        for (int64_t p = p0; p < p0 + c; p++)
            bad += memcmp(chunked + p * f.q_dim, one + p * f.q_dim, (size_t)f.q_dim * sizeof *one) != 0;
    }
    CHECK(bad == 0 && bad_other == 0, "K %s V %s window %lld: %d rows of %lld differ from one-shot prefill (%d of the other sequence) over %d calls",
          dtype_name(type_k), dtype_name(type_v), (long long)g_window, bad, (long long)n, bad_other, calls);
    free(q);
    free(q2);
    free(one);
    free(chunked);
    free(other);
    free(mixed_q);
    free(mixed_out);
    free(seqs);
    free(pos);
    struct pool_tag_stats st = pool_tag_stats(held.pool, 0);
    printf("K %s V %s window %lld, held workers: %.1f%% of the busy time in %llu jobs\n", dtype_name(type_k),
           dtype_name(type_v), (long long)g_window,
           100.0 * (double)st.ns_busy_workers / (double)(st.ns_busy_workers + st.ns_busy_caller + 1), st.jobs);
    for (int i = 0; i < 3; i++)
        pool_release(pools[i]);
    pool_release(held.pool);
    fix_close(&f);
}

static void test_chunked(void)
{
    chunked(SANITIZED ? 2048 : 16384, DT_F16, DT_F16);
    chunked(SANITIZED ? 1024 : 4096, DT_Q8_0, DT_Q4_0);
    /* sliding windows of 300 and 24 positions (no multiple of a block of 16 or a tile),
     * the positions behind every later row's window poisoned */
    g_window = 300;
    chunked(SANITIZED ? 1024 : 4096, DT_F16, DT_F16);
    g_window = 24;
    chunked(SANITIZED ? 1024 : 2048, DT_Q8_0, DT_Q4_0);
    g_window = 0;
}

/* The reference, AVX2 and AVX-512 (with and without VNNI) variants give the same bits for whole attention
 * calls (prefill and split decode), K and V of every type, blocks of 4 and 16 positions. */
static void variants(void)
{
    const char *names[] = {"avx2", "avx512", "neon", "avx512-novnni"};
    int64_t n = SANITIZED ? 300 : 700;
    const int types[] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0};
    for (int type = 0; type < 4; type++)
        for (int bti = 0; bti < 2; bti++) {
            struct attn_shape sh = {4, 2, type >= 2 ? (bti ? 32 : 64) : (bti ? 40 : 64)};
            struct fix f;
            struct pool *pool = NULL;
            if (fix_open(&f, sh, bti ? 4 : 16, types[type], type >= 2 ? types[5 - type] : types[1 - type], 1, n, (int)n, 2) || pool_create(&pool, 2)) {
                CHECK(0, "setup");
                return;
            }
            uint64_t seed = 21 + (uint64_t)type;
            size_t nq = (size_t)n * (size_t)f.q_dim;
            float *q = malloc(nq * sizeof *q), *want = malloc(nq * sizeof *want), *got = malloc(nq * sizeof *got);
            int32_t *seqs = malloc((size_t)n * sizeof *seqs);
            int64_t *pos = malloc((size_t)n * sizeof *pos);
            for (size_t i = 0; i < nq; i++)
                q[i] = test_rand_float(&seed) * 4.0f;
            fill(&f, seed, 1.0f, NULL, 0);
            run_rows(&f, pool, vec_ops_ref(), 0, 0, n - 3, q, want, seqs, pos);
            run_rows(&f, pool, vec_ops_ref(), 0, n - 3, n, q, want, seqs, pos); /* split */
            for (int vi = 0; vi < 4; vi++) {
                const struct vec_ops *ops = vec_ops_variant(names[vi]);
                if (!ops)
                    continue;
                run_rows(&f, pool, ops, 0, 0, n - 3, q, got, seqs, pos);
                run_rows(&f, pool, ops, 0, n - 3, n, q, got, seqs, pos);
                CHECK(memcmp(want, got, nq * sizeof *got) == 0, "%s K %s bt %d window %lld: differs from the reference",
                      names[vi], dtype_name(types[type]), bti ? 4 : 16, (long long)g_window);
            }
            free(q);
            free(want);
            free(got);
            free(seqs);
            free(pos);
            pool_release(pool);
            fix_close(&f);
        }
}

/* gpt-oss's sinks: below, near and far above the scores (a sink of 40 takes nearly all of a
 * head's softmax, one of -40 nothing) */
static const float sinks[4] = {0.7f, -40.0f, 40.0f, 3.0f};

static void test_variants(void)
{
    variants();
    g_window = 100; /* rows whose window starts inside a tile, and tiles skipped */
    variants();
    g_sinks = sinks; /* with sinks, prefill and split decode */
    variants();
    g_window = 0;
    variants();
    g_sinks = NULL;
}

/* Sinks against float64, with and without a window; and the same bits whether the rows
 * come in one prefill, in chunks or as split decodes. */
static void test_sinks(void)
{
    g_sinks = sinks;
    reference(0);
    reference(300);
    g_window = 24;
    chunked(SANITIZED ? 1024 : 2048, DT_F16, DT_F16);
    g_window = 0;
    chunked(SANITIZED ? 1024 : 2048, DT_F32, DT_F32);
    g_sinks = NULL;
}

/* Bytes [0, n) of a and b that differ lie within [lo, lo + len). */
static bool changes_within(const char *a, const char *b, size_t n, size_t lo, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && (i < lo || i >= lo + len))
            return false;
    return true;
}

/* attn_kv_write_span holds every byte attn_kv_write changes, for each cache type, at the
 * first, a middle and the last position of blocks. */
static void test_write_span(void)
{
    static const int types[] = {DT_F16, DT_F32, DT_Q8_0, DT_Q4_0};
    struct attn_shape sh = {.n_head = 6, .n_head_kv = 3, .head_dim = 64};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        struct fix f;
        CHECK(fix_open(&f, sh, 16, types[t], types[t], 1, 48, 1, 1) == 0, "fixture");
        fill(&f, 11 + t, 1.0f, NULL, -1);
        size_t sz[2];
        const char *base[2] = {kv_k(f.kv, 0, 0), kv_v(f.kv, 0, 0)};
        sz[0] = (size_t)((const char *)kv_k(f.kv, 0, 47) - base[0]) + (size_t)((const char *)kv_k(f.kv, 0, 1) - base[0]);
        sz[1] = (size_t)((const char *)kv_v(f.kv, 0, 47) - base[1]) + (size_t)((const char *)kv_v(f.kv, 0, 1) - base[1]);
        char *before[2] = {malloc(sz[0]), malloc(sz[1])};
        float *k = malloc((size_t)f.kv_dim * sizeof *k), *v = malloc((size_t)f.kv_dim * sizeof *v);
        uint64_t seed = 5;
        int bad = 0;
        for (int64_t p = 0; p < 48; p += 7) {
            int64_t slot = kv_slot(f.kv, 0, p);
            memcpy(before[0], base[0], sz[0]);
            memcpy(before[1], base[1], sz[1]);
            for (int64_t i = 0; i < f.kv_dim; i++) {
                k[i] = test_rand_float(&seed) * 4.0f;
                v[i] = test_rand_float(&seed) * 4.0f;
            }
            attn_kv_write(f.kv, vec_ops_best(), 0, slot, sh.head_dim, k, v);
            const char *at[2];
            size_t bytes[2];
            attn_kv_write_span(f.kv, 0, slot, sh.head_dim, at, bytes);
            for (int i = 0; i < 2; i++)
                bad += !changes_within(before[i], base[i], sz[i], (size_t)(at[i] - base[i]), bytes[i]);
        }
        CHECK(bad == 0, "%s: %d writes changed bytes outside their span", dtype_name(types[t]), bad);
        free(before[0]);
        free(before[1]);
        free(k);
        free(v);
        fix_close(&f);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_write_span);
    RUN(test_variants);
    RUN(test_reference);
    RUN(test_chunked);
    RUN(test_sinks);
    return test_main_end();
}
