#include "engine/sample.h"

#include "base/err.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A candidate token: its logit after bias and penalties, and e = exp((logit - max) / T),
 * its probability up to the normalizer. Candidates are ranked by logit descending, then
 * id ascending; every step keeps a prefix of that ranking. */
struct cand {
    double e;
    float logit;
    int32_t id;
};

/* With more candidates than this (no top-k, or a large one), top-p and the draw work on
 * a histogram of the weights over NBUCKET buckets of logit, and rank only the
 * candidates of the one bucket where the cumulative weight crosses the target. */
enum { NBUCKET = 1024, BUCKET_MIN_CANDS = 4096 };

struct sampler {
    int n_vocab;
    double x_cut;       /* tokens with (logit - max) / T < -x_cut count as probability 0 */
    float *work;        /* [n_vocab] logits after bias and penalties */
    int32_t *counts;    /* [n_vocab] occurrences in the penalty window; all 0 between calls */
    struct cand *cand;  /* [n_vocab] candidates */
    struct cand *gath;  /* [n_vocab] the candidates of one bucket */
    uint16_t *bucket;   /* [n_vocab] bucket of each candidate */
    double bsum[NBUCKET]; /* weight of each bucket */
};

struct sample_params sample_defaults(void)
{
    return (struct sample_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
        .bias = NULL,
        .n_bias = 0,
    };
}

int sample_create(struct sampler **out, int n_vocab)
{
    if (!out || n_vocab <= 0)
        return CAIRN_EINVAL;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->n_vocab = n_vocab;
    /* n_vocab * e^-x_cut < 2e-9: the mass ignored is far below the resolution of a float
     * top_p (6e-8 below 1), so a nucleus never needs a token beyond the cut. */
    s->x_cut = log((double)n_vocab) + 20.0;
    s->work = malloc((size_t)n_vocab * sizeof *s->work);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->gath = malloc((size_t)n_vocab * sizeof *s->gath);
    s->bucket = malloc((size_t)n_vocab * sizeof *s->bucket);
    if (!s->work || !s->counts || !s->cand || !s->gath || !s->bucket) {
        sample_release(s);
        return CAIRN_ENOMEM;
    }
    *out = s;
    return 0;
}

void sample_release(struct sampler *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->counts);
    free(s->cand);
    free(s->gath);
    free(s->bucket);
    free(s);
}

double sample_uniform(uint64_t seed, int64_t pos)
{
    uint64_t z = seed + ((uint64_t)pos + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static int better(const struct cand *a, const struct cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* Finds the first candidate j in ranking order whose cumulative e (over ranks 0..j)
 * reaches target, in expected O(n): a quickselect that sums the weights of each side.
 * On return c[0..j] hold exactly the j+1 best candidates (in no particular order) and
 * *cum their total weight. When rounding leaves the total below target, j is the last
 * candidate. n > 0. */
static int64_t wselect(struct cand *c, int64_t n, double target, double *cum)
{
    int64_t lo = 0, hi = n;
    double acc = 0; /* weight of the candidates ranked before lo */
    while (hi - lo > 16) {
        int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
        /* Median of three as pivot, moved to last. */
        if (better(&c[mid], &c[lo]))
            swap(&c[mid], &c[lo]);
        if (better(&c[last], &c[lo]))
            swap(&c[last], &c[lo]);
        if (better(&c[mid], &c[last]))
            swap(&c[mid], &c[last]);
        int64_t store = lo;
        double sum = 0;
        for (int64_t i = lo; i < last; i++)
            if (better(&c[i], &c[last])) {
                swap(&c[i], &c[store]);
                sum += c[store++].e;
            }
        swap(&c[store], &c[last]);
        if (store > lo && acc + sum >= target) {
            hi = store;
        } else if (acc + sum + c[store].e >= target || store + 1 == hi) {
            *cum = acc + sum + c[store].e;
            return store;
        } else {
            acc += sum + c[store].e;
            lo = store + 1;
        }
    }
    for (int64_t i = lo + 1; i < hi; i++) /* insertion sort of the rest, best first */
        for (int64_t j = i; j > lo && better(&c[j], &c[j - 1]); j--)
            swap(&c[j], &c[j - 1]);
    int64_t i = lo;
    for (acc += c[i].e; acc < target && i + 1 < hi;)
        acc += c[++i].e;
    *cum = acc;
    return i;
}

/* First non-empty bucket of bsum[0..nb) where the cumulative weight reaches target, and
 * in *acc the weight of the buckets before it; the last non-empty one when rounding
 * leaves the total below target; -1 when all are empty. */
static int find_bucket(const double *bsum, int nb, double target, double *acc)
{
    double sum = 0, before_last = 0;
    int last = -1;
    for (int b = 0; b < nb; b++) {
        if (bsum[b] == 0)
            continue;
        if (sum + bsum[b] >= target) {
            *acc = sum;
            return b;
        }
        before_last = sum;
        sum += bsum[b];
        last = b;
    }
    *acc = before_last;
    return last;
}

/* Copies the candidates of bucket b to g; returns how many. */
static int64_t gather(const struct cand *c, const uint16_t *bucket, int64_t m, int b,
                      struct cand *g)
{
    int64_t n = 0;
    for (int64_t i = 0; i < m; i++)
        if (bucket[i] == b)
            g[n++] = c[i];
    return n;
}

/* Keeps the k best allowed tokens of work in c[0..k) as a heap whose root
 * is the worst kept. Tokens come in id order, so one that only ties the root ranks
 * below it and is skipped: the common case costs one comparison. */
static int top_k(const float *work, int n_vocab, int k, struct cand *c)
{
    int size = 0;
    for (int i = 0; i < n_vocab; i++) {
        float v = work[i];
        if (!(v > -INFINITY)) /* banned or NaN */
            continue;
        struct cand x = {0, v, i};
        int at;
        if (size < k) {
            at = size++;
            while (at > 0 && better(&c[(at - 1) / 2], &x)) {
                c[at] = c[(at - 1) / 2];
                at = (at - 1) / 2;
            }
        } else {
            if (!(v > c[0].logit))
                continue;
            at = 0;
            for (;;) {
                int l = 2 * at + 1, r = l + 1, w = at;
                const struct cand *wc = &x;
                if (l < k && better(wc, &c[l]))
                    w = l, wc = &c[l];
                if (r < k && better(wc, &c[r]))
                    w = r;
                if (w == at)
                    break;
                c[at] = c[w];
                at = w;
            }
        }
        c[at] = x;
    }
    return size; /* < k when fewer tokens are allowed */
}

/* Largest value, NaN ignored: eight chains, so that it runs at load speed. */
static float max_of(const float *v, int n)
{
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = v[i + j] > m[j] ? v[i + j] : m[j];
    for (; i < n; i++)
        m[0] = v[i] > m[0] ? v[i] : m[0];
    for (int j = 1; j < 8; j++)
        m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* Smallest value that is not -inf (banned) or NaN; +inf when there is none. */
static float min_allowed(const float *v, int n)
{
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = v[i + j] < m[j] && v[i + j] > -INFINITY ? v[i + j] : m[j];
    for (; i < n; i++)
        m[0] = v[i] < m[0] && v[i] > -INFINITY ? v[i] : m[0];
    for (int j = 1; j < 8; j++)
        m[0] = m[j] < m[0] ? m[j] : m[0];
    return m[0];
}

static int validate(const struct sampler *s, const struct sample_params *p, const float *logits,
                    const int32_t *history, int64_t n_history, int64_t pos, int64_t *window)
{
    if (!s || !p || !logits || n_history < 0 || pos < 0)
        return CAIRN_EINVAL;
    if (isnan(p->temperature) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repeat_penalty > 0) ||
        isinf(p->repeat_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->penalty_last_n < -1)
        return CAIRN_EINVAL;
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return CAIRN_EINVAL;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].token < 0 || p->bias[i].token >= s->n_vocab || isnan(p->bias[i].bias))
            return CAIRN_EINVAL;
    int penalize = p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
    int64_t w = !penalize || p->penalty_last_n == 0 ? 0
                : p->penalty_last_n < 0 || p->penalty_last_n > n_history ? n_history
                                                                         : p->penalty_last_n;
    if (w > 0 && !history)
        return CAIRN_EINVAL;
    for (int64_t i = n_history - w; i < n_history; i++)
        if (history[i] < 0 || history[i] >= s->n_vocab)
            return CAIRN_EINVAL;
    *window = w;
    return 0;
}

static void penalize(struct sampler *s, const struct sample_params *p, const int32_t *win, int64_t w)
{
    for (int64_t i = 0; i < w; i++)
        s->counts[win[i]]++;
    float r = p->repeat_penalty;
    for (int64_t i = 0; i < w; i++) {
        int32_t t = win[i];
        int32_t c = s->counts[t];
        if (c == 0) /* this token was already penalized */
            continue;
        float l = s->work[t];
        if (r != 1)
            l = l > 0 ? l / r : l * r;
        l -= p->frequency_penalty * (float)c + p->presence_penalty;
        s->work[t] = l;
        s->counts[t] = 0;
    }
}

/* Steps 1-2: *out gets the logits after bias and penalties (the caller's logits when
 * neither applies), +inf clamped to FLT_MAX, and *max_out their largest. Returns 0,
 * the error of validate, or CAIRN_ERANGE when every token is banned. */
static int prepare(struct sampler *s, const struct sample_params *p, const float *logits,
                   const int32_t *history, int64_t n_history, int64_t pos, const float **out,
                   float *max_out)
{
    int64_t w;
    int rc = validate(s, p, logits, history, n_history, pos, &w);
    if (rc)
        return rc;
    int n = s->n_vocab;
    const float *src = logits; /* logits after steps 1-2 */
    if (p->n_bias > 0 || w > 0 || p->allow) {
        memcpy(s->work, logits, (size_t)n * sizeof *s->work);
        if (p->allow)
            for (int i = 0; i < n; i += 32) {
                uint32_t m = p->allow[i >> 5];
                if (m == 0xffffffffu)
                    continue;
                int end = i + 32 < n ? i + 32 : n;
                if (m == 0) {
                    for (int j = i; j < end; j++)
                        s->work[j] = -INFINITY;
                    continue;
                }
                for (; m != 0xffffffffu; m |= m + 1) /* each 0 bit, lowest first */
                    if (i + __builtin_ctz(~m) < end)
                        s->work[i + __builtin_ctz(~m)] = -INFINITY;
                    else
                        break;
            }
        for (int i = 0; i < p->n_bias; i++)
            s->work[p->bias[i].token] += p->bias[i].bias;
        if (w > 0)
            penalize(s, p, history + (n_history - w), w);
        src = s->work;
    }
    /* NaN logits are skipped by every comparison below (they count as banned); +inf
     * ones become FLT_MAX so that differences stay finite. */
    float max = max_of(src, n);
    if (max == INFINITY) {
        if (src != s->work)
            memcpy(s->work, src, (size_t)n * sizeof *s->work);
        for (int i = 0; i < n; i++)
            s->work[i] = s->work[i] > FLT_MAX ? FLT_MAX : s->work[i];
        src = s->work;
        max = FLT_MAX;
    }
    if (max == -INFINITY)
        return CAIRN_ERANGE; /* every token is banned */
    *out = src;
    *max_out = max;
    return 0;
}

/* Greedy: the first index of max in src[0..n) (max is there: it came from max_of). Blocks
 * without it are skipped by a compare the compiler vectorizes; greedy decoding pays this
 * for every sequence of every step, on one thread while the pool's others wait. */
static int32_t arg_max(const float *src, int n, float max)
{
    enum { BLOCK = 64 };
    int32_t arg = 0;
    for (; arg + BLOCK <= n; arg += BLOCK) {
        int hit = 0;
        for (int j = 0; j < BLOCK; j++)
            hit |= src[arg + j] == max;
        if (hit)
            break;
    }
    while (src[arg] != max)
        arg++;
    return arg;
}

int32_t sample_token(struct sampler *s, const struct sample_params *p, const float *logits,
                     const int32_t *history, int64_t n_history, int64_t pos, float *prob)
{
    const float *src;
    float max;
    int rc = prepare(s, p, logits, history, n_history, pos, &src, &max);
    if (rc)
        return rc;
    int n = s->n_vocab;
    if (p->temperature <= 0) {
        if (prob)
            *prob = 1.0f;
        return arg_max(src, n, max);
    }

    /* Candidates: the top k, or every token. exp() is evaluated only where it can
     * matter: above the cut, and above the min-p bar unless top-p needs the full sum. */
    struct cand *c = s->cand;
    int use_k = p->top_k > 0 && p->top_k < n;
    int64_t m_in = use_k ? top_k(src, n, p->top_k, c) : n, m = 0;
    double t = p->temperature, lmax = max, min_p = p->min_p;
    double x_keep = -s->x_cut;
    if (min_p > 0 && log(min_p) - 1e-9 > x_keep)
        x_keep = log(min_p) - 1e-9; /* the exact test is on e below */
    double x_exp = p->top_p < 1 ? -s->x_cut : x_keep;
    /* Buckets are uniform in x over [x_lo, 0], where x_lo bounds every kept candidate's x
     * from below; x is monotone in the logit, so bucket order is ranking order. */
    int bucketed = m_in > BUCKET_MIN_CANDS;
    double bscale = 0;
    if (bucketed) {
        double x_lo = ((double)min_allowed(src, n) - lmax) / t;
        x_lo = x_lo > x_keep ? x_lo : x_keep;
        if (x_lo < 0)
            bscale = (NBUCKET - 0.5) / -x_lo;
        if (!(bscale < 1e300)) /* x_lo denormal: one bucket for all */
            bscale = 0;
        memset(s->bsum, 0, sizeof s->bsum);
    }
    double z = 0, kept = 0;
    for (int64_t i = 0; i < m_in; i++) {
        float l = use_k ? c[i].logit : src[i];
        double x = ((double)l - lmax) / t;
        if (!(x >= x_exp)) /* also drops banned tokens, NaN, and NaN from an infinite T */
            continue;
        double e = exp(x);
        z += e;
        if (x >= x_keep && e >= min_p) {
            if (bucketed) {
                int b = (int)(-x * bscale);
                b = b < NBUCKET - 1 ? b : NBUCKET - 1;
                s->bucket[m] = (uint16_t)b;
                s->bsum[b] += e;
            }
            c[m++] = (struct cand){e, l, use_k ? c[i].id : (int32_t)i};
            kept += e;
        }
    }
    /* The top token (e = 1 >= min_p) is always a candidate, so m > 0. Top-p and min-p
     * each keep a prefix of the ranking, so applying top-p to the min-p survivors with
     * the full sum z gives the shorter of the two prefixes. */
    double top_p_target = p->top_p < 1 && kept >= p->top_p * z ? p->top_p * z : -1;
    double u = sample_uniform(p->seed, pos), cum;
    const struct cand *chosen;
    if (!bucketed) {
        if (top_p_target >= 0)
            m = wselect(c, m, top_p_target, &kept) + 1;
        chosen = &c[wselect(c, m, u * kept, &cum)];
    } else {
        /* Top-p: the kept prefix is the buckets before bp and the best jp+1 of bp. */
        struct cand *g = s->gath;
        int bp = NBUCKET;
        double acc_p = kept;
        int64_t gn = 0, jp = 0;
        if (top_p_target >= 0) {
            bp = find_bucket(s->bsum, NBUCKET, top_p_target, &acc_p);
            gn = gather(c, s->bucket, m, bp, g);
            jp = wselect(g, gn, top_p_target - acc_p, &cum);
            kept = acc_p + cum;
        }
        /* The draw: in a bucket before bp, or else in the kept part of bp. */
        double target = u * kept, acc;
        int bd = top_p_target < 0 || target < acc_p ? find_bucket(s->bsum, bp, target, &acc) : -1;
        if (bd >= 0) {
            gn = gather(c, s->bucket, m, bd, g);
            chosen = &g[wselect(g, gn, target - acc, &cum)];
        } else {
            chosen = &g[wselect(g, jp + 1, target - acc_p, &cum)];
        }
    }
    if (prob)
        *prob = (float)(chosen->e / kept);
    return chosen->id;
}

int sample_dist(struct sampler *s, const struct sample_params *p, const float *logits,
                const int32_t *history, int64_t n_history, int32_t *ids, float *probs)
{
    const float *src;
    float max;
    int rc = prepare(s, p, logits, history, n_history, 0, &src, &max);
    if (rc)
        return rc;
    int n = s->n_vocab;
    if (p->temperature <= 0) {
        ids[0] = arg_max(src, n, max);
        probs[0] = 1.0f;
        return 1;
    }
    /* The candidates and bars of sample_token, without its histogram (which only finds
     * the same prefix faster). */
    struct cand *c = s->cand;
    int use_k = p->top_k > 0 && p->top_k < n;
    int64_t m_in = use_k ? top_k(src, n, p->top_k, c) : n, m = 0;
    double t = p->temperature, lmax = max, min_p = p->min_p;
    double x_keep = -s->x_cut;
    if (min_p > 0 && log(min_p) - 1e-9 > x_keep)
        x_keep = log(min_p) - 1e-9;
    double x_exp = p->top_p < 1 ? -s->x_cut : x_keep;
    double z = 0, kept = 0;
    for (int64_t i = 0; i < m_in; i++) {
        float l = use_k ? c[i].logit : src[i];
        double x = ((double)l - lmax) / t;
        if (!(x >= x_exp))
            continue;
        double e = exp(x);
        z += e;
        if (x >= x_keep && e >= min_p) {
            c[m++] = (struct cand){e, l, use_k ? c[i].id : (int32_t)i};
            kept += e;
        }
    }
    if (p->top_p < 1 && kept >= p->top_p * z)
        m = wselect(c, m, p->top_p * z, &kept) + 1;
    for (int64_t i = 0; i < m; i++) {
        ids[i] = c[i].id;
        probs[i] = (float)(c[i].e / kept);
    }
    return (int)m;
}

int32_t sample_pick(const float *probs, int n, double u)
{
    if (n <= 0)
        return CAIRN_EINVAL;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += probs[i];
    double target = u * total, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += probs[i];
        if (cum > target)
            return i;
    }
    return n - 1;
}
