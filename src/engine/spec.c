/* Speculative decoding in the scheduler: which sequences draft each step and how many
 * tokens (adaptive k), drafts from a draft model or from prompt lookup (n-grams of the
 * sequence's own history), their verification against the target's logits (greedy, or
 * rejection sampling with a residual draw), and the rollback of rejected positions in
 * the target's and the draft's KV caches. The scheduler's state is in sched_int.h. */
#include "engine/sched_int.h"

#include "base/array.h"
#include "base/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A sequence whose draft cache lags by more than this many tokens catches up in chunks
 * (without drafting) instead of feeding them all in its first draft forward. */
#define SCHED_DRAFT_LAG 16
/* Adaptive k (from SPEC_ACC_PRIOR): how fast the acceptance rate drifts back to the
 * prior while a sequence does not draft, and the weight of each new observation. */
#define ACC_DECAY 0.05
#define ACC_WEIGHT (1.0 / 16)
/* The draft's, the acceptance test's and the residual's draws use the request's seed
 * with these mixed in, apart from each other and from sample_token's. */
#define SEED_DRAFT 0x5bd1e9955bd1e995ull
#define SEED_ACCEPT 0x2545f4914f6cdd1dull
#define SEED_RESIDUAL 0xd6e8feb86659fd93ull

/* ---- planning ---- */

/* q's source of drafts and the k its request asks for. */
static enum spec_mode seq_mode(const struct sched *s, const struct seq *q, int *k)
{
    const struct request *r = q->req;
    if (r->num_draft == 0)
        return SPEC_NONE;
    if (r->lookup_ngram > 0) {
        *k = r->num_draft < 0 ? s->opt.lookup_tokens : r->num_draft;
        return SPEC_LOOKUP;
    }
    if (!s->draft)
        return SPEC_NONE;
    *k = r->num_draft < 0 ? s->draft_k : r->num_draft;
    return SPEC_MODEL;
}

/* Blocks the draft cache takes for q to grow by n positions (its blocks are never shared). */
static int64_t draft_blocks(const struct sched *s, const struct seq *q, int64_t n)
{
    return sched_blocks_for(q->d_kv + n, s->d_block_tokens) - sched_blocks_for(q->d_kv, s->d_block_tokens);
}

/* The k up to kmax that gives the most expected tokens per cost at q's acceptance rate a:
 * (1 + a + ... + a^k) / (1 + k (cost + verify_cost)); 0 when none beats not drafting,
 * and then a drifts back towards the prior so that drafting is tried again later. */
static int choose_k(const struct sched *s, struct seq *q, int kmax, double cost)
{
    if (!s->opt.adaptive)
        return kmax;
    double a = q->acc, power = 1, expect = 1, best_v = 1;
    int best = 0;
    for (int k = 1; k <= kmax; k++) {
        power *= a;
        expect += power;
        double v = expect / (1 + k * (cost + s->opt.verify_cost));
        if (v > best_v * (1 + 1e-9)) {
            best_v = v;
            best = k;
        }
    }
    if (best == 0)
        q->acc += (SPEC_ACC_PRIOR - q->acc) * ACC_DECAY;
    return best;
}

/* Prompt lookup: the latest earlier occurrence of the longest n-gram (max_n down to 1
 * tokens) that ends q's history; the k tokens after it are copied to hist[n_hist..).
 * The copy may run into the tokens it writes, so a repeating pattern goes on. Returns
 * the tokens drafted (0 when nothing matches). */
static int lookup_draft(struct seq *q, int max_n, int k)
{
    int32_t *h = q->hist;
    int64_t n = q->n_hist;
    for (int g = max_n; g >= 1; g--) {
        if (g >= n)
            continue;
        const int32_t *tail = h + n - g;
        for (int64_t i = n - g - 1; i >= 0; i--) {
            if (h[i] != tail[0] || memcmp(h + i, tail, (size_t)g * sizeof *h))
                continue;
            for (int j = 0; j < k; j++)
                h[n + j] = h[i + g + j];
            return k;
        }
    }
    return 0;
}

static bool logits_reserve(struct sched *s, int64_t rows)
{
    if (rows <= s->ln->logit_rows)
        return true;
    struct sched_ask *a = realloc(s->ln->asks, (size_t)rows * sizeof *a);
    if (a)
        s->ln->asks = a;
    struct sched_token *t = a ? realloc(s->ln->answers, (size_t)rows * sizeof *t) : NULL;
    if (t)
        s->ln->answers = t;
    float *p = t ? realloc(s->ln->logits, (size_t)rows * (size_t)s->n_vocab * sizeof *p) : NULL;
    if (!p)
        return false;
    s->ln->logits = p;
    s->ln->logit_rows = rows;
    return true;
}

void spec_drop_plan(struct seq *q)
{
    if (q->mode == SPEC_MODEL)
        q->catch_up = q->n_hist - q->d_kv;
    q->mode = SPEC_NONE;
    q->plan_k = q->k_eff = 0;
}

/* Decides, before the batch is built, which decoding sequences draft this step and how
 * many tokens (prompt lookup drafts them here), and which sequences feed their context to
 * the draft to catch up. Draft tokens take the target batch's room left after one token
 * per decoding sequence and a prompt chunk; the draft's batch and cache room is shared
 * out oldest first. */
void spec_plan(struct sched *s)
{
    s->ln->a_used = 0;
    int n_dec = 0;
    int64_t prompt = 0;
    for (int k = 0; k < s->n_running; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        if (q->flight)
            continue; /* its plan is that of its batch in flight */
        q->mode = SPEC_NONE;
        q->plan_k = q->k_eff = 0;
        q->catch_up = 0;
        if (!q->pick)
            continue;
        if (sched_feeds_one(q))
            n_dec++;
        else
            prompt += q->n_hist - q->n_kv;
    }
    if (s->opt.max_decoding > 0 && n_dec > s->opt.max_decoding)
        return;
    int64_t room = s->max_batch - n_dec - sched_min64(prompt, s->chunk_tokens), drafts = 0;
    int64_t d_room = s->draft ? s->d_max_batch : 0, d_free = s->draft ? kv_free_blocks(s->dkv) : 0;
    double model_cost = s->opt.draft_cost >= 0 ? s->opt.draft_cost : s->draft_cost;
    for (int i = 0; i < s->n_running && room > 0; i++) {
        struct seq *q = s->slot_seq[s->order[i]];
        int kreq = 0;
        /* A request's prompt that is read for several sequences is sampled once per
         * sequence from its last row (fork_and_report): never with drafts, even when
         * that last token is all the cache did not hold. */
        enum spec_mode mode = !q->pick || !sched_feeds_one(q) || q->req->fork_pending ? SPEC_NONE : seq_mode(s, q, &kreq);
        if (mode == SPEC_NONE)
            continue;
        /* Drafts never pass what the sequence may still generate: at most left tokens
         * come out of a step, the last of them the target's own. */
        int64_t left = sched_min64(q->req->max_tokens - q->generated, s->cfg.ctx - q->n_hist);
        int kmax = (int)sched_min64(sched_min64(kreq, left - 1), room);
        if (kmax <= 0)
            continue;
        int k;
        if (mode == SPEC_MODEL) {
            int64_t pending = q->n_hist - q->d_kv;
            if (pending < 1 || pending > SCHED_DRAFT_LAG)
                continue; /* a lagging draft catches up first (below) */
            if (!(k = choose_k(s, q, kmax, model_cost)))
                continue;
            int64_t blocks = draft_blocks(s, q, pending + k - 1);
            if (pending > d_room || blocks > d_free)
                continue;
            d_room -= pending;
            d_free -= blocks;
        } else {
            if (!(k = choose_k(s, q, kmax, 0)) || !(k = lookup_draft(q, q->req->lookup_ngram, k)))
                continue;
            q->k_eff = k;
            for (int j = 0; j < k; j++) {
                q->q_n[j] = 0;
                q->q_x[j] = 1;
            }
        }
        q->mode = mode;
        q->plan_k = k;
        room -= k;
        drafts += k;
    }
    for (int i = 0; s->draft && i < s->n_running; i++) {
        struct seq *q = s->slot_seq[s->order[i]];
        int kreq;
        if (q->mode != SPEC_NONE || !q->pick || seq_mode(s, q, &kreq) != SPEC_MODEL)
            continue;
        int64_t lag = q->n_hist - q->d_kv;
        if (sched_feeds_one(q) && lag <= SCHED_DRAFT_LAG)
            continue; /* fed with its next drafts */
        int64_t c = sched_min64(sched_min64(lag, s->chunk_tokens), d_room);
        int bt = s->d_block_tokens;
        c = sched_min64(c, (sched_blocks_for(q->d_kv, bt) + d_free) * bt - q->d_kv);
        if (c <= 0)
            continue;
        q->catch_up = c;
        d_room -= c;
        d_free -= draft_blocks(s, q, c);
    }
    if (drafts > 0 && !logits_reserve(s, s->n_running + drafts))
        for (int i = 0; i < s->n_running; i++) {
            struct seq *q = s->slot_seq[s->order[i]];
            if (q->pick && q->plan_k > 0)
                spec_drop_plan(q);
        }
}

/* ---- drafting ---- */

static bool arena_reserve(struct sched *s, int64_t n)
{
    /* Two arrays of one capacity: each grows from a copy of it to the same size. */
    size_t need = (size_t)(s->ln->a_used + n), cap = (size_t)s->ln->a_cap, cap2 = cap;
    if (array_reserve(&s->ln->q_ids, &cap, need, sizeof *s->ln->q_ids, 4096) ||
        array_reserve(&s->ln->q_probs, &cap2, need, sizeof *s->ln->q_probs, 4096))
        return false;
    s->ln->a_cap = (int64_t)cap; /* at most PTRDIFF_MAX */
    return true;
}

/* Draws q's draft token j from the draft's logits row with the request's parameters
 * (penalties see the drafts before j), keeping the distribution for verification.
 * False when it cannot (q then drafts no further this step). */
static bool draft_sample(struct sched *s, struct seq *q, const float *row, int j)
{
    struct sample_params p = sched_seq_params(q);
    p.seed ^= SEED_DRAFT;
    int64_t pos = q->n_hist + j;
    int32_t tok;
    /* Constrained: drafts follow the grammar from where the drafts before them lead. */
    if (q->gm) {
        if (j == 0 && (q->dgm ? grammar_match_copy(q->dgm, q->gm) : grammar_match_clone(&q->dgm, q->gm)))
            return false;
        if (grammar_match_done(q->dgm) || sched_grammar_allow_at(s, q, q->dgm, j, &p))
            return false;
    }
    if (p.temperature <= 0) {
        tok = sample_token(s->smp, &p, row, q->hist, pos, pos, NULL);
        q->q_n[j] = 0;
        q->q_x[j] = 1;
    } else {
        if (!arena_reserve(s, s->n_vocab))
            return false;
        int32_t *ids = s->ln->q_ids + s->ln->a_used;
        float *probs = s->ln->q_probs + s->ln->a_used;
        int n = sample_dist(s->smp, &p, row, q->hist, pos, ids, probs);
        if (n < 1)
            return false;
        double total = 0;
        for (int i = 0; i < n; i++)
            total += probs[i];
        int32_t i = sample_pick(probs, n, sample_uniform(p.seed, pos));
        tok = ids[i];
        q->q_off[j] = s->ln->a_used;
        q->q_n[j] = n;
        q->q_tot[j] = total;
        q->q_x[j] = probs[i] / total;
        s->ln->a_used += n;
    }
    if (tok < 0 || (q->gm && grammar_match_accept(q->dgm, tok)))
        return false;
    q->hist[pos] = tok;
    q->k_eff = j + 1;
    return true;
}

static void draft_add(struct sched *s, int *n, int32_t tok, int seq, int64_t pos, bool logits)
{
    s->d_token[*n] = tok;
    s->d_seq[*n] = seq;
    s->d_pos[*n] = pos;
    s->d_logits[*n] = logits;
    (*n)++;
}

static bool draft_forward(struct sched *s, int n)
{
    struct batch b = {.n = n, .token = s->d_token, .seq = s->d_seq, .pos = s->d_pos, .logits = s->d_logits};
    char msg[256];
    s->stats.draft_forwards++;
    if (engine_forward(s->draft, s->dkv, &b, s->d_out, msg, sizeof msg) == 0)
        return true;
    s->stats.draft_failures++;
    return false;
}

/* Drafted by the model: fed to the target with its drafts this step. */
static bool model_drafter(const struct fed *f) { return f->drafts > 0 && f->seq->mode == SPEC_MODEL; }

/* Runs the draft model: a first forward with each drafting sequence's context not yet in
 * the draft's cache (its logits giving draft 0) and the catch-up chunks, then one
 * forward per further draft position over the sequences still drafting. Writes the
 * drafts into the target's batch; a sequence whose drafting stopped early (a failed
 * forward, a failed draw) keeps its remaining batch positions with the placeholder token,
 * and their logits are ignored. */
void spec_run_drafts(struct sched *s)
{
    if (!s->draft)
        return;
    int n = 0, rows = 0, kmax = 0;
    for (int i = 0; i < s->ln->n_fed; i++) {
        const struct fed *f = &s->ln->fed[i];
        if (!model_drafter(f))
            continue;
        struct seq *q = f->seq;
        for (int64_t p = q->d_kv; p < q->n_hist; p++)
            draft_add(s, &n, q->hist[p], q->slot, p, p == q->n_hist - 1);
        q->d_row = rows++;
        kmax = q->plan_k > kmax ? q->plan_k : kmax;
    }
    int64_t caught = 0;
    for (int k = 0; k < s->n_running; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        if (!q->pick)
            continue;
        for (int64_t p = q->d_kv; p < q->d_kv + q->catch_up; p++)
            draft_add(s, &n, q->hist[p], q->slot, p, false);
        caught += q->catch_up;
    }
    bool ok = n == 0 || draft_forward(s, n);
    if (ok && n > 0) {
        s->stats.draft_prefill_tokens += caught;
        for (int k = 0; k < s->n_running; k++) {
            struct seq *q = s->slot_seq[s->order[k]];
            q->d_kv += q->pick ? q->catch_up : 0;
        }
        for (int i = 0; i < s->ln->n_fed; i++)
            if (model_drafter(&s->ln->fed[i])) {
                struct seq *q = s->ln->fed[i].seq;
                q->d_kv = q->n_hist;
                draft_sample(s, q, s->d_out + (size_t)q->d_row * s->n_vocab, 0);
            }
    }
    for (int j = 1; ok && j < kmax; j++) {
        n = 0;
        for (int i = 0; i < s->ln->n_fed; i++) {
            struct seq *q = s->ln->fed[i].seq;
            if (model_drafter(&s->ln->fed[i]) && q->k_eff == j && j < q->plan_k)
                draft_add(s, &n, q->hist[q->n_hist + j - 1], q->slot, q->n_hist + j - 1, true);
        }
        if (n == 0 || !(ok = draft_forward(s, n)))
            break;
        rows = 0;
        for (int i = 0; i < s->ln->n_fed; i++) {
            struct seq *q = s->ln->fed[i].seq;
            if (model_drafter(&s->ln->fed[i]) && q->k_eff == j && j < q->plan_k) {
                q->d_kv = q->n_hist + j;
                draft_sample(s, q, s->d_out + (size_t)rows++ * s->n_vocab, j);
            }
        }
    }
    /* The draft cache holds exactly hist[0..d_kv) of each sequence (a failed forward may
     * have reserved more). */
    for (int k = 0; k < s->n_running; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        if (q->pick)
            kv_truncate(s->dkv, q->slot, q->d_kv);
    }
    for (int i = 0; i < s->ln->n_fed; i++) {
        const struct fed *f = &s->ln->fed[i];
        if (!model_drafter(f))
            continue;
        struct seq *q = f->seq;
        for (int j = 0; j < q->k_eff; j++)
            s->ln->b_token[f->at + 1 + j] = q->hist[q->n_hist + j];
    }
}

/* ---- verification ---- */

/* Verifies draft j of q (at hist[n_hist]) against the target's row for that position.
 * Greedy: kept when it is the target's argmax, which is the token either way. Sampled:
 * kept with probability min(1, p(x) / q(x)); else the token is drawn from
 * norm(max(0, p - q)). Returns the token (negative: a sampling error), *kept and the
 * token's probability under p. */
static int32_t verify_draft(struct sched *s, struct seq *q, const float *row, int j, bool *kept, float *prob)
{
    struct sample_params p = sched_seq_params(q);
    int64_t pos = q->n_hist;
    int32_t x = q->hist[pos];
    /* Constrained: the target's distribution under the grammar where the kept drafts
     * (already reported) have led; a rejected draft never reached the matcher. */
    int rc = sched_grammar_allow(s, q, &p);
    if (rc)
        return rc;
    if (p.temperature <= 0) {
        int32_t t = sample_token(s->smp, &p, row, q->hist, pos, pos, prob);
        *kept = t == x;
        return t;
    }
    int n = sample_dist(s->smp, &p, row, q->hist, pos, s->p_ids, s->p_probs);
    if (n < 1)
        return n < 0 ? n : CAIRN_ERANGE;
    double total = 0, px = 0;
    for (int i = 0; i < n; i++)
        total += s->p_probs[i];
    for (int i = 0; i < n; i++)
        if (s->p_ids[i] == x)
            px = s->p_probs[i] / total;
    if (sample_uniform(p.seed ^ SEED_ACCEPT, pos) * q->q_x[j] < px) {
        *kept = true;
        *prob = (float)px;
        return x;
    }
    *kept = false;
    /* The residual over p's tokens (only they can have p > q), with q spread densely. */
    if (q->q_n[j] == 0) {
        s->q_dense[x] = 1;
    } else {
        for (int i = 0; i < q->q_n[j]; i++)
            s->q_dense[s->ln->q_ids[q->q_off[j] + i]] = (float)(s->ln->q_probs[q->q_off[j] + i] / q->q_tot[j]);
    }
    double w_sum = 0;
    for (int i = 0; i < n; i++) {
        double w = s->p_probs[i] / total - s->q_dense[s->p_ids[i]];
        s->r_w[i] = w > 0 ? (float)w : 0.0f;
        w_sum += s->r_w[i];
    }
    if (q->q_n[j] == 0) {
        s->q_dense[x] = 0;
    } else {
        for (int i = 0; i < q->q_n[j]; i++)
            s->q_dense[s->ln->q_ids[q->q_off[j] + i]] = 0;
    }
    double u = sample_uniform(p.seed ^ SEED_RESIDUAL, pos);
    /* No residual mass is p == q up to rounding, where x would have been kept. */
    int32_t i = sample_pick(w_sum > 0 ? s->r_w : s->p_probs, n, u);
    *prob = (float)(s->p_probs[i] / total);
    return s->p_ids[i];
}

/* q fed its last token and k drafts: reports the drafts the target keeps, then the
 * target's own next token (the one replacing the first rejected draft, or one more after
 * all k), one by one; rolls back the rejected positions in both caches. May finish q. */
void spec_verify_and_report(struct sched *s, struct seq *q, const float *rows, const struct sched_token *ans)
{
    int k = q->k_eff;
    int64_t h = q->n_hist;
    bool model = q->mode == SPEC_MODEL;
    int accepted = 0;
    q->drafted += k;
    s->stats.draft_tokens += k;
    for (int j = 0; j <= k; j++) {
        const float *row = rows + (size_t)j * s->n_vocab;
        const struct sched_token *a = ans ? sched_answer_at(s, ans, j) : NULL;
        bool kept = false;
        float prob = 1.0f;
        int32_t tok;
        if (a) { /* a greedy verification or the last row, sampled by the forward */
            tok = a->token;
            prob = a->prob;
            kept = j < k && tok == q->hist[q->n_hist];
        } else if (j < k) {
            tok = verify_draft(s, q, row, j, &kept, &prob);
        } else {
            struct sample_params p = sched_seq_params(q);
            tok = sched_grammar_allow(s, q, &p);
            if (tok == 0)
                tok = sample_token(s->smp, &p, row, q->hist, q->n_hist, q->n_hist, &prob);
        }
        if (tok < 0) {
            q->n_kv = q->n_hist;
            sched_finish_sampling_error(s, q, tok);
            return;
        }
        if (j < k) {
            q->acc += ((kept ? 1.0 : 0.0) - q->acc) * ACC_WEIGHT;
            if (kept) {
                accepted++;
                q->accepted++;
                s->stats.accepted_draft_tokens++;
            } else {
                s->stats.draft_rejections++;
            }
        }
        q->n_kv = q->n_hist; /* the KV holds every token before this one */
        if (!sched_report_token(s, q, tok, prob, row, a))
            return;
        if (j < k && !kept)
            break;
    }
    kv_truncate(s->kv, q->slot, q->n_kv);
    if (model && s->dkv) {
        q->d_kv = sched_min64(q->d_kv, h + accepted);
        kv_truncate(s->dkv, q->slot, q->d_kv);
    }
}

/* ---- speculation settings ---- */

struct sched_spec_options sched_spec_defaults(void)
{
    return (struct sched_spec_options){
        .adaptive = false, .max_decoding = 16, .lookup_tokens = 4, .draft_cost = -1.0f, .verify_cost = 0.05f};
}

int sched_set_spec_options(struct sched *s, const struct sched_spec_options *o, char *err, size_t errlen)
{
    if (!o)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no options");
    if (o->max_decoding < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_decoding %d is negative", o->max_decoding);
    if (o->lookup_tokens < 1 || o->lookup_tokens > SCHED_MAX_DRAFT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "lookup_tokens %d outside 1..%d", o->lookup_tokens,
                          SCHED_MAX_DRAFT);
    if (!isfinite(o->draft_cost))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "draft_cost is not finite");
    if (!(isfinite(o->verify_cost) && o->verify_cost >= 0))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "verify_cost must be finite and >= 0");
    s->opt = *o;
    return 0;
}

/* Forgets the draft: its cache sequences are cleared and nothing lags behind it. */
static void drop_draft(struct sched *s)
{
    for (int i = 0; s->dkv && i < s->cfg.slots; i++)
        kv_seq_clear(s->dkv, i);
    for (int k = 0; k < s->n_running; k++)
        s->slot_seq[s->order[k]]->d_kv = 0;
    free(s->d_token);
    free(s->d_seq);
    free(s->d_pos);
    free(s->d_logits);
    free(s->d_out);
    s->d_token = s->d_seq = NULL;
    s->d_pos = NULL;
    s->d_logits = NULL;
    s->d_out = NULL;
    s->draft = NULL;
    s->dkv = NULL;
}

int sched_set_draft(struct sched *s, struct engine *draft, struct kv_cache *draft_kv, int num_draft_tokens,
                    char *err, size_t errlen)
{
    if (!draft) {
        drop_draft(s);
        return 0;
    }
    const struct model *dm = engine_model(draft), *tm = engine_model(s->e);
    if (!draft_kv)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft needs a KV cache");
    if (num_draft_tokens < 1 || num_draft_tokens > SCHED_MAX_DRAFT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "num_draft_tokens %d outside 1..%d", num_draft_tokens,
                          SCHED_MAX_DRAFT);
    if (!dm->first || !dm->last)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft must be a whole model (layers [%d, %d) of %d)",
                          dm->layer_begin, dm->layer_end, dm->hp.n_layers);
    if (dm->hp.n_vocab != tm->hp.n_vocab)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft's vocabulary of %d differs from the target's %d",
                          dm->hp.n_vocab, tm->hp.n_vocab);
    if (engine_max_batch(draft) < s->cfg.slots)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft engine's max_batch %d is below slots %d",
                          engine_max_batch(draft), s->cfg.slots);
    const struct kv_config *kc = kv_config(draft_kv);
    struct kv_config want = engine_kv_config(dm, 1, 1, kc->block_tokens);
    if (kc->n_layers != want.n_layers || kc->kv_dim != want.kv_dim)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft KV cache does not match the draft model's shape");
    if (kc->max_seqs < s->cfg.slots)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft KV cache has %d sequence ids; slots need %d",
                          kc->max_seqs, s->cfg.slots);
    if (draft_kv != s->dkv && kv_free_blocks(draft_kv) != kc->n_blocks)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the draft KV cache is not empty");
    size_t mb = (size_t)engine_max_batch(draft);
    int32_t *tok = malloc(mb * sizeof *tok), *seq = malloc(mb * sizeof *seq);
    int64_t *pos = malloc(mb * sizeof *pos);
    uint8_t *want_logits = malloc(mb);
    float *out = malloc((size_t)s->cfg.slots * (size_t)s->n_vocab * sizeof *out);
    if (!tok || !seq || !pos || !want_logits || !out) {
        free(tok);
        free(seq);
        free(pos);
        free(want_logits);
        free(out);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for the draft's buffers");
    }
    drop_draft(s);
    s->draft = draft;
    s->dkv = draft_kv;
    s->draft_k = num_draft_tokens;
    s->d_max_batch = (int)mb;
    s->d_block_tokens = kc->block_tokens;
    s->draft_cost = tm->weight_bytes ? (double)dm->weight_bytes / (double)tm->weight_bytes : 0;
    s->d_token = tok;
    s->d_seq = seq;
    s->d_pos = pos;
    s->d_logits = want_logits;
    s->d_out = out;
    return 0;
}
