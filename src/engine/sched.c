/* The continuous-batching scheduler: admission, the prefix cache, preemption, batch
 * building, sampling and reporting. Speculative decoding (drafts, their verification and
 * rollback) is in spec.c; the state both share is in sched_int.h. */
#include "engine/sched_int.h"

#include "base/clock.h"
#include "base/err.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_MAX_SLOTS 256
#define SCHED_MAX_CACHE_SEQS 4096

/* Pacing of prompt chunks beside decoding sequences (sched_config.chunk_tokens): a step
 * with prompt tokens aims at SCHED_PACE_STEPS times a decode step; its chunk is never
 * cut below SCHED_PACE_MIN tokens, and is SCHED_PACE_FIRST before anything is timed.
 * During a burst (more sequences waiting for their prompt than decoding) the share grows
 * by waiting / decoding, up to chunk_tokens: filling the batch then wins over even gaps.
 * Sequences that have generated fewer than SCHED_PACE_YOUNG tokens do not count as
 * decoding here: a stream that has just begun waits a few long steps (as its time to
 * first token would have been) so that prompts arriving together fill the batch in as
 * few steps as the chunk allows, and their streams end together instead of in a tail. */
#define SCHED_PACE_STEPS 3.0
#define SCHED_PACE_YOUNG 4
#define SCHED_PACE_MIN 8
#define SCHED_PACE_FIRST 32
#define SCHED_PACE_EMA 0.25 /* weight of the newest step in the running means */

/* A waiting unit of work: a request not started (seq < 0: all its sequences, prefilled
 * together), or one preempted sequence. */
struct queue_item {
    struct request *req;
    int seq;
};

/* A finished sequence's KV, kept under KV sequence id slots + its index. */
struct cache_entry {
    int32_t *tokens; /* owned; NULL: entry unused */
    int64_t n;       /* positions in the KV cache (tokens[0..n)) */
    uint64_t last_used;
};

/* ---- queue ---- */

static struct queue_item *queue_at(struct sched *s, int i) { return &s->queue[(s->q_head + i) % s->q_cap]; }

static void queue_push_back(struct sched *s, struct queue_item it)
{
    assert(s->q_count < s->q_cap);
    *queue_at(s, s->q_count++) = it;
}

static void queue_push_front(struct sched *s, struct queue_item it)
{
    assert(s->q_count < s->q_cap);
    s->q_head = (s->q_head + s->q_cap - 1) % s->q_cap;
    s->q_count++;
    *queue_at(s, 0) = it;
}

static void queue_remove_at(struct sched *s, int i)
{
    for (int k = i; k + 1 < s->q_count; k++)
        *queue_at(s, k) = *queue_at(s, k + 1);
    s->q_count--;
}

/* Drops every queue item of r (a request is in the queue as one item, or as items of
 * its preempted sequences). */
static void queue_drop_request(struct sched *s, const struct request *r)
{
    for (int i = 0; i < s->q_count;)
        if (queue_at(s, i)->req == r)
            queue_remove_at(s, i);
        else
            i++;
}

/* ---- requests ---- */

static struct request *find_request(const struct sched *s, uint64_t id)
{
    for (struct request *r = s->live; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void request_free(struct request *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_seqs; i++) {
        free(r->seqs[i].hist);
        grammar_match_release(r->seqs[i].gm);
        grammar_match_release(r->seqs[i].dgm);
    }
    free(r->bias);
    free(r);
}

static void request_unlink(struct sched *s, struct request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        s->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* ---- prefix cache ---- */

static int cache_kv_id(const struct sched *s, int entry) { return s->cfg.slots + entry; }

static void cache_evict(struct sched *s, int i)
{
    struct cache_entry *c = &s->cache[i];
    kv_seq_clear(s->kv, cache_kv_id(s, i));
    free(c->tokens);
    c->tokens = NULL;
    c->n = 0;
    s->n_cached--;
}

/* Evicts the least recently used entry other than `except`; false when there is none. */
static bool cache_evict_lru(struct sched *s, int except)
{
    int lru = -1;
    for (int i = 0; i < s->cfg.cache_seqs; i++)
        if (i != except && s->cache[i].tokens && (lru < 0 || s->cache[i].last_used < s->cache[lru].last_used))
            lru = i;
    if (lru < 0)
        return false;
    cache_evict(s, lru);
    return true;
}

static int64_t common_prefix(const int32_t *a, const int32_t *b, int64_t n)
{
    int64_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The entry sharing the longest prefix with tokens[0..limit), or -1; *reuse gets its length. */
static int cache_lookup(const struct sched *s, const int32_t *tokens, int64_t limit, int64_t *reuse)
{
    int best = -1;
    *reuse = 0;
    for (int i = 0; i < s->cfg.cache_seqs; i++) {
        const struct cache_entry *c = &s->cache[i];
        if (!c->tokens)
            continue;
        int64_t m = common_prefix(c->tokens, tokens, sched_min64(c->n, limit));
        if (m < kv_seq_min_resume(s->kv, cache_kv_id(s, i)))
            continue; /* its sliding-window layers no longer hold what a resume there needs */
        if (m > *reuse) {
            *reuse = m;
            best = i;
        }
    }
    return best;
}

/* Moves a finished sequence's KV (in slot) into the cache, taking its history as the
 * entry's tokens. An entry whose tokens the new one extends is replaced; if an entry
 * already extends the new one, the new one is dropped. */
static void cache_keep(struct sched *s, struct seq *q, int slot)
{
    int64_t n = q->n_kv;
    if (s->cfg.cache_seqs == 0 || n == 0)
        return;
    for (int i = 0; i < s->cfg.cache_seqs; i++) {
        struct cache_entry *c = &s->cache[i];
        if (!c->tokens || common_prefix(c->tokens, q->hist, sched_min64(c->n, n)) < sched_min64(c->n, n))
            continue;
        if (c->n >= n) {
            c->last_used = ++s->tick;
            return;
        }
        cache_evict(s, i);
    }
    int free_entry = -1;
    for (int i = 0; i < s->cfg.cache_seqs && free_entry < 0; i++)
        if (!s->cache[i].tokens)
            free_entry = i;
    if (free_entry < 0) {
        cache_evict_lru(s, -1);
        for (int i = 0; i < s->cfg.cache_seqs && free_entry < 0; i++)
            if (!s->cache[i].tokens)
                free_entry = i;
    }
    if (kv_fork(s->kv, slot, cache_kv_id(s, free_entry)) != 0)
        return; /* cannot happen: the entry's id is empty */
    struct cache_entry *c = &s->cache[free_entry];
    c->tokens = q->hist;
    c->n = n;
    c->last_used = ++s->tick;
    q->hist = NULL;
    s->n_cached++;
}

/* ---- slots ---- */

static int free_slots(const struct sched *s) { return s->cfg.slots - s->n_running; }

static void slot_take(struct sched *s, struct seq *q)
{
    int slot = 0;
    while (s->slot_seq[slot])
        slot++;
    s->slot_seq[slot] = q;
    s->order[s->n_running++] = slot;
    q->slot = slot;
    q->state = SEQ_RUNNING;
    q->n_kv = 0;
    q->d_kv = 0;
    q->mode = SPEC_NONE;
    q->plan_k = q->k_eff = 0;
    q->catch_up = 0;
    q->pick = false;
    q->flight = NULL;
}

static int order_index(const struct sched *s, int slot)
{
    for (int k = 0; k < s->n_running; k++)
        if (s->order[k] == slot)
            return k;
    return -1;
}

/* Takes q out of its slot; its KV goes to the prefix cache when keep is set, else is dropped. */
static void slot_release(struct sched *s, struct seq *q, bool keep)
{
    int slot = q->slot, k = order_index(s, slot);
    assert(k >= 0);
    memmove(s->order + k, s->order + k + 1, (size_t)(s->n_running - k - 1) * sizeof *s->order);
    s->n_running--;
    s->slot_seq[slot] = NULL;
    if (keep) {
        kv_truncate(s->kv, slot, q->n_kv); /* rejected draft positions, if any */
        cache_keep(s, q, slot);
    }
    kv_seq_clear(s->kv, slot);
    if (s->dkv)
        kv_seq_clear(s->dkv, slot);
    q->slot = -1;
    q->n_kv = 0;
    q->d_kv = 0;
}

/* ---- finishing ---- */

static void finish_seq(struct sched *s, struct seq *q, enum sched_finish why, const char *error)
{
    struct request *r = q->req;
    bool keep = why == SCHED_FINISH_STOP || why == SCHED_FINISH_LENGTH || why == SCHED_FINISH_STOPPED;
    if (q->flight) { /* its batch's results, when they come, are not read for it */
        q->flight->fed[q->fed_idx].seq = NULL;
        q->flight = NULL;
        keep = false;
    }
    if (q->state == SEQ_RUNNING)
        slot_release(s, q, keep);
    q->state = SEQ_DONE;
    struct sched_usage usage = {.prompt_tokens = r->n_prompt, .cached_tokens = q->cached,
                                .generated_tokens = q->generated, .draft_tokens = q->drafted,
                                .accepted_draft_tokens = q->accepted};
    uint64_t id = r->id;
    int index = q->index;
    bool last = --r->live == 0;
    if (last)
        request_unlink(s, r); /* its id may be reused from the done callback */
    if (s->cb.done)
        s->cb.done(s->cb.ctx, id, index, why, &usage, why == SCHED_FINISH_ERROR ? (error ? error : "error") : NULL);
    if (last)
        request_free(r);
}

/* Finishes every sequence of r still live; r is freed. */
static void finish_request(struct sched *s, struct request *r, enum sched_finish why, const char *error)
{
    queue_drop_request(s, r);
    int left = r->live;
    for (int i = 0; left > 0; i++)
        if (r->seqs[i].state != SEQ_DONE) {
            left--;
            finish_seq(s, &r->seqs[i], why, error);
        }
}

/* A sequence that cannot fit the whole KV cache: with tokens generated, its context is
 * as full as the cache allows (LENGTH); without, it cannot run at all (ERROR). */
static void finish_unfit(struct sched *s, struct request *r, int seq, int64_t n_tokens)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%lld tokens need %lld KV blocks; the cache holds %lld", (long long)n_tokens,
             (long long)sched_blocks_for(n_tokens, s->block_tokens), (long long)s->n_blocks);
    if (seq < 0)
        finish_request(s, r, SCHED_FINISH_ERROR, msg);
    else
        finish_seq(s, &r->seqs[seq], r->seqs[seq].generated > 0 ? SCHED_FINISH_LENGTH : SCHED_FINISH_ERROR, msg);
}

/* ---- preemption ---- */

/* Index in order[] of the first sequence of the newest unit not in flight (-1: none):
 * a running sequence, or, while a request's prompt is prefilled for all its sequences,
 * that whole group (they were admitted together and are contiguous). */
static int newest_unit(const struct sched *s)
{
    for (int k = s->n_running - 1; k >= 0; k--) {
        const struct request *r = s->slot_seq[s->order[k]]->req;
        bool busy = s->slot_seq[s->order[k]]->flight != NULL;
        if (r->fork_pending)
            while (k > 0 && s->slot_seq[s->order[k - 1]]->req == r)
                busy |= s->slot_seq[s->order[--k]]->flight != NULL;
        if (!busy)
            return k;
    }
    return -1;
}

/* Puts the unit starting at order[first] back at the front of the queue; its KV is
 * dropped and recomputed when it is admitted again. */
static void preempt_unit(struct sched *s, int first)
{
    struct seq *q = s->slot_seq[s->order[first]];
    struct request *r = q->req;
    if (r->fork_pending) {
        for (int i = 0; i < r->n_seqs; i++) {
            slot_release(s, &r->seqs[i], false);
            r->seqs[i].state = SEQ_QUEUED;
        }
        r->fork_pending = false;
        queue_push_front(s, (struct queue_item){r, -1});
    } else {
        slot_release(s, q, false);
        q->state = SEQ_QUEUED;
        queue_push_front(s, (struct queue_item){r, q->index});
    }
    s->stats.preemptions++;
}

/* Positions q can grow by with the blocks free now (a shared last block costs a copy). */
static int64_t positions_free(const struct sched *s, const struct seq *q)
{
    int bt = s->block_tokens;
    int64_t free_blocks = kv_free_blocks(s->kv), fit = 0;
    if (q->n_kv % bt) {
        int64_t n;
        const int32_t *table = kv_seq_blocks(s->kv, q->slot, &n);
        int64_t copy = kv_block_refs(s->kv, table[n - 1]) > 1;
        if (free_blocks < copy)
            return 0;
        free_blocks -= copy;
        fit = bt - q->n_kv % bt;
    }
    return fit + free_blocks * bt;
}

/* Makes KV room for the next n positions of q (order[k]), or fewer when partial is set
 * (a prompt chunk). Evicts cached prefixes first, then preempts the newest running
 * units not in flight. Returns the positions prepared, 0 when q itself was preempted
 * or finished (being the newest not in flight); sequences after k in order[] may have
 * been preempted. */
static int64_t make_room(struct sched *s, int k, struct seq *q, int64_t n, bool partial)
{
    for (;;) {
        if (kv_prepare(s->kv, q->slot, q->n_kv, n) == 0)
            return n;
        if (cache_evict_lru(s, -1))
            continue;
        int64_t fit = partial ? sched_min64(positions_free(s, q), n) : 0;
        if (fit > 0 && kv_prepare(s->kv, q->slot, q->n_kv, fit) == 0)
            return fit;
        int first = newest_unit(s);
        if (first > k) {
            preempt_unit(s, first);
            continue;
        }
        if (first == 0 && s->n_flight == 0) /* q runs alone and still does not fit */
            finish_unfit(s, q->req, q->req->fork_pending ? -1 : q->index, q->n_kv + n);
        else
            preempt_unit(s, first);
        return 0;
    }
}

/* ---- admission ---- */

/* Starts a queue item: takes its slots, and forks the longest cached prefix of its
 * tokens (at most all but the last, whose logits it needs). */
static void admit_item(struct sched *s, struct queue_item it, int entry, int64_t reuse)
{
    struct request *r = it.req;
    int first = it.seq < 0 ? 0 : it.seq, count = it.seq < 0 ? r->n_seqs : 1;
    for (int i = first; i < first + count; i++)
        slot_take(s, &r->seqs[i]);
    struct seq *lead = &r->seqs[first];
    if (entry >= 0 && kv_fork(s->kv, cache_kv_id(s, entry), lead->slot) == 0) {
        kv_truncate(s->kv, lead->slot, reuse);
        lead->n_kv = reuse;
        s->cache[entry].last_used = ++s->tick;
        s->stats.cached_tokens += reuse;
    } else {
        reuse = 0;
    }
    bool first_admission = !lead->admitted;
    for (int i = first; i < first + count; i++) {
        if (!r->seqs[i].admitted)
            r->seqs[i].cached = reuse;
        r->seqs[i].admitted = true;
    }
    r->fork_pending = count > 1;
    if (first_admission && it.seq < 0 && s->cb.admitted) {
        struct sched_usage u = {.prompt_tokens = r->n_prompt, .cached_tokens = reuse};
        s->cb.admitted(s->cb.ctx, r->id, &u);
    }
}

/* Admits queue items in order while slots and KV blocks allow; an item that waits
 * blocks those behind it (first come, first served). Returns whether anything changed. */
static bool admit(struct sched *s)
{
    bool changed = false;
    while (s->q_count > 0) {
        struct queue_item it = *queue_at(s, 0);
        struct seq *lead = &it.req->seqs[it.seq < 0 ? 0 : it.seq];
        int need_slots = it.seq < 0 ? it.req->n_seqs : 1;
        if (sched_blocks_for(lead->n_hist, s->block_tokens) > s->n_blocks) {
            queue_remove_at(s, 0);
            finish_unfit(s, it.req, it.seq, lead->n_hist);
            changed = true;
            continue;
        }
        if (free_slots(s) < need_slots)
            break;
        int64_t reuse;
        int entry = cache_lookup(s, lead->hist, lead->n_hist - 1, &reuse);
        /* Room for its tokens and the first generated one, plus a block per forked
         * sequence; a partly reused last block is copied. */
        int64_t need = sched_blocks_for(lead->n_hist + 1, s->block_tokens) - reuse / s->block_tokens + need_slots - 1;
        while (kv_free_blocks(s->kv) < need && cache_evict_lru(s, entry))
            ;
        if (kv_free_blocks(s->kv) < need && s->n_running > 0)
            break;
        queue_remove_at(s, 0);
        admit_item(s, it, entry, reuse);
        changed = true;
    }
    return changed;
}

/* ---- one step ---- */

/* Sequences of fork_pending requests other than 0 wait for sequence 0's prompt. */
static bool waits_for_fork(const struct seq *q) { return q->req->fork_pending && q->index > 0; }

/* Sequences picked for this step after order[k] that decode (feed one token, or drafts)
 * and have generated at least min_generated tokens, or with decoding false, that still
 * prefill their prompt. */
static int picked_after(const struct sched *s, int k, bool decoding, int64_t min_generated)
{
    int n = 0;
    for (int i = k + 1; i < s->n_running; i++) {
        const struct seq *q = s->slot_seq[s->order[i]];
        n += q->pick && sched_feeds_one(q) == decoding && q->generated >= min_generated;
    }
    return n;
}

static int single_feeds_after(const struct sched *s, int k) { return picked_after(s, k, true, 0); }

/* Tokens the decoding sequences after order[k] put into the batch (drafts included). */
static int tokens_after(const struct sched *s, int k)
{
    int n = 0;
    for (int i = k + 1; i < s->n_running; i++) {
        const struct seq *q = s->slot_seq[s->order[i]];
        if (q->pick && sched_feeds_one(q))
            n += 1 + q->plan_k;
    }
    return n;
}

static void batch_add(struct sched *s, struct seq *q, int n, int drafts)
{
    bool logits = drafts > 0 || q->n_kv + n == q->n_hist;
    int at = s->ln->n_tokens;
    for (int i = 0; i < n; i++) {
        int t = s->ln->n_tokens++;
        /* A model's drafts are written once drafted (spec_run_drafts); until then the last token. */
        s->ln->b_token[t] = q->hist[q->n_kv + (q->mode == SPEC_MODEL ? 0 : i)];
        s->ln->b_seq[t] = q->slot;
        s->ln->b_pos[t] = q->n_kv + i;
        s->ln->b_logits[t] = drafts > 0 || (logits && i == n - 1);
    }
    s->ln->fed[s->ln->n_fed++] = (struct fed){q, n, drafts, at, logits};
    /* Tokens fed other than a decode step's are prompt (or recomputation) work. */
    bool decode = n == 1 + drafts && q->n_kv >= q->req->n_prompt;
    if (!decode) {
        s->stats.prompt_tokens_computed += n;
        s->ln->step_prompt += n;
    } else {
        s->ln->step_decoding++;
    }
}

/* Takes target KV room for q's last token and plan_k drafts, if that leaves blocks for
 * the sequences after it (one per decode, and a chunk's worth for prompts), evicting
 * cached prefixes as a decode would: drafting never preempts a sequence. */
static bool room_for_drafts(struct sched *s, int k, struct seq *q)
{
    int bt = s->block_tokens;
    int64_t n = 1 + q->plan_k;
    int64_t need = sched_blocks_for(q->n_kv + n, bt) - sched_blocks_for(q->n_kv, bt);
    if (q->n_kv % bt) {
        int64_t nb;
        const int32_t *table = kv_seq_blocks(s->kv, q->slot, &nb);
        need += kv_block_refs(s->kv, table[nb - 1]) > 1;
    }
    int64_t prompt = 0;
    for (int i = k + 1; i < s->n_running; i++) {
        const struct seq *o = s->slot_seq[s->order[i]];
        if (o->pick && !sched_feeds_one(o))
            prompt += o->n_hist - o->n_kv;
    }
    prompt = sched_min64(prompt, s->chunk_tokens);
    int64_t reserve = single_feeds_after(s, k) + sched_blocks_for(prompt, bt) + (prompt > 0);
    while (kv_free_blocks(s->kv) < need + reserve)
        if (!cache_evict_lru(s, -1))
            return false;
    return kv_prepare(s->kv, q->slot, q->n_kv, n) == 0;
}

/* Prompt tokens this step may take: chunk_tokens, or while sequences decode and the
 * chunk is paced, as many as keep the step near SCHED_PACE_STEPS decode steps. When
 * more sequences wait for their prompt than decode (a burst of requests arriving
 * together), the share grows by their ratio: a pause of the few decoding streams then
 * brings more streams into every later step than it holds up, and the batch fills in a
 * few steps instead of a staircase in which the first streams finish long before the
 * last (and the tail runs small batches). Young sequences (SCHED_PACE_YOUNG) are not
 * paced for: with only young ones decoding the whole chunk is open. */
static int64_t prompt_budget(const struct sched *s)
{
    int decoding = picked_after(s, -1, true, SCHED_PACE_YOUNG);
    if (!s->paced || decoding == 0)
        return s->chunk_tokens;
    int64_t n = SCHED_PACE_FIRST;
    if (s->pace_decode_ns > 0 && s->pace_prompt_ns > 0)
        n = (int64_t)((SCHED_PACE_STEPS - 1) * s->pace_decode_ns / s->pace_prompt_ns);
    int waiting = picked_after(s, -1, false, 0);
    if (waiting > decoding)
        n = n * waiting / decoding;
    return n < SCHED_PACE_MIN ? SCHED_PACE_MIN : n > s->chunk_tokens ? s->chunk_tokens : n;
}

static double ema(double mean, double x) { return mean > 0 ? mean + SCHED_PACE_EMA * (x - mean) : x; }

/* Times a step for pacing: a decode-only step updates the decode mean; a step with
 * prompt tokens the per-token mean, from what it took beyond its decodes' share. */
static void pace_update(struct sched *s, int64_t ns)
{
    if (!s->paced)
        return;
    if (s->ln->step_prompt == 0) {
        s->pace_decode_ns = ema(s->pace_decode_ns, (double)ns);
        return;
    }
    double beyond = (double)ns - (s->ln->step_decoding ? s->pace_decode_ns : 0);
    if (beyond > 0)
        s->pace_prompt_ns = ema(s->pace_prompt_ns, beyond / s->ln->step_prompt);
}

/* Fills the batch, oldest sequence first: one token of every sequence that decodes (with
 * its drafts), prompt chunks within the chunk budget and the room decodes after it still
 * need. */
static void build_batch(struct sched *s)
{
    s->ln->n_fed = s->ln->n_tokens = 0;
    s->ln->step_prompt = s->ln->step_decoding = 0;
    int64_t budget = prompt_budget(s);
    for (int k = 0; k < s->n_running; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        if (!q->pick)
            continue;
        int64_t n = 1;
        bool partial = !sched_feeds_one(q);
        if (partial) {
            n = sched_min64(sched_min64(q->n_hist - q->n_kv, budget), s->max_batch - s->ln->n_tokens - tokens_after(s, k));
            if (n <= 0)
                continue;
        } else if (q->plan_k > 0) {
            if (room_for_drafts(s, k, q)) {
                batch_add(s, q, 1 + q->plan_k, q->plan_k);
                continue;
            }
            spec_drop_plan(q);
        }
        n = make_room(s, k, q, n, partial);
        if (n == 0)
            continue; /* q is gone from order[]; so is everything after it */
        if (partial)
            budget -= n;
        batch_add(s, q, (int)n, 0);
    }
}

/* ---- sampling and reporting ---- */

struct sample_params sched_seq_params(const struct seq *q)
{
    struct sample_params p = q->req->sample;
    p.seed += (uint64_t)q->index;
    return p;
}

/* Log-softmax of the raw logits in double, and the n_top most probable tokens. */
static void fill_logprobs(const float *row, int n_vocab, int32_t tok, int n_top, struct sched_token *t)
{
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n_vocab; i++)
        max = row[i] > max ? row[i] : max;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)row[i] - max);
    double lse = max + log(sum);
    t->logprob = (float)((double)row[tok] - lse);
    int n = 0;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        /* Strictly greater: among equal logits the lower id, seen first, stays ahead. */
        if (n == n_top && !(row[i] > row[t->top_token[n - 1]]))
            continue;
        int p = n < n_top ? n++ : n - 1;
        while (p > 0 && row[i] > row[t->top_token[p - 1]]) {
            t->top_token[p] = t->top_token[p - 1];
            p--;
        }
        t->top_token[p] = i;
    }
    t->n_top = n;
    for (int i = 0; i < n; i++)
        t->top_logprob[i] = (float)((double)row[t->top_token[i]] - lse);
}

void sched_finish_sampling_error(struct sched *s, struct seq *q, int rc)
{
    char msg[96];
    snprintf(msg, sizeof msg, "sampling failed: %s", cairn_strerror(rc));
    finish_seq(s, q, SCHED_FINISH_ERROR, msg);
}

int32_t sched_sample_row(struct sampler *smp, int n_vocab, const struct sched_ask *a, const float *row,
                         struct sched_token *out)
{
    memset(out, 0, sizeof *out);
    float prob = 1.0f;
    int32_t tok = sample_token(smp, &a->p, row, a->window, a->n_window, a->pos, &prob);
    out->token = tok;
    if (tok < 0)
        return tok;
    out->prob = prob;
    if (a->n_top >= 0)
        fill_logprobs(row, n_vocab, tok, a->n_top, out);
    return tok;
}

bool sched_report_token(struct sched *s, struct seq *q, int32_t tok, float prob, const float *row,
                        const struct sched_token *ans)
{
    struct request *r = q->req;
    if (!r->ignore_eos && s->cfg.tok && tok_is_eog(s->cfg.tok, tok)) {
        finish_seq(s, q, SCHED_FINISH_STOP, NULL);
        return false;
    }
    if (q->gm && grammar_match_accept(q->gm, tok) != 0) {
        finish_seq(s, q, SCHED_FINISH_ERROR, "constrained decoding: a token the grammar does not allow");
        return false;
    }
    q->hist[q->n_hist++] = tok;
    struct sched_token t = {.token = tok, .prob = prob};
    if (r->logprobs && ans) {
        t.logprob = ans->logprob;
        t.n_top = ans->n_top;
        memcpy(t.top_token, ans->top_token, (size_t)ans->n_top * sizeof t.top_token[0]);
        memcpy(t.top_logprob, ans->top_logprob, (size_t)ans->n_top * sizeof t.top_logprob[0]);
    } else if (r->logprobs) {
        fill_logprobs(row, s->n_vocab, tok, r->top_logprobs, &t);
    }
    int64_t index = q->generated++;
    s->stats.generated_tokens++;
    int stop = s->cb.token ? s->cb.token(s->cb.ctx, r->id, q->index, index, &t) : 0;
    if (stop) {
        finish_seq(s, q, SCHED_FINISH_STOPPED, NULL);
        return false;
    }
    if (q->gm && grammar_match_done(q->gm)) {
        finish_seq(s, q, SCHED_FINISH_STOP, NULL);
        return false;
    }
    if (q->generated >= r->max_tokens || q->n_hist >= s->cfg.ctx) {
        finish_seq(s, q, SCHED_FINISH_LENGTH, NULL);
        return false;
    }
    return true;
}

int sched_grammar_allow(struct sched *s, struct seq *q, struct sample_params *p)
{
    return q->gm ? sched_grammar_allow_at(s, q, q->gm, 0, p) : 0;
}

int sched_grammar_allow_at(struct sched *s, struct seq *q, struct grammar_match *m, int64_t j,
                           struct sample_params *p)
{
    int64_t left = sched_min64(q->req->max_tokens - q->generated, s->cfg.ctx - q->n_hist) - j;
    const uint32_t *mask;
    int rc = grammar_match_mask(m, left, &mask);
    if (rc)
        return rc;
    p->allow = mask;
    return 0;
}

/* Samples q's next token from row (or takes the forward's answer ans) and reports it;
 * may finish q. */
static void sample_and_report(struct sched *s, struct seq *q, const float *row, const struct sched_token *ans)
{
    struct sample_params p = sched_seq_params(q);
    float prob = 1.0f;
    int rc = ans ? 0 : sched_grammar_allow(s, q, &p);
    if (rc) {
        sched_finish_sampling_error(s, q, rc);
        return;
    }
    int32_t tok = ans ? ans->token : sample_token(s->smp, &p, row, q->hist, q->n_hist, q->n_hist, &prob);
    if (ans)
        prob = ans->prob;
    if (tok < 0)
        sched_finish_sampling_error(s, q, tok);
    else
        sched_report_token(s, q, tok, prob, row, ans);
}

const struct sched_token *sched_answer_at(const struct sched *s, const struct sched_token *ans, int j)
{
    const struct lane *l = s->ln;
    int64_t w = ans + j - l->answers;
    return w < l->n_asks && l->asks[w].need == SCHED_NEED_SAMPLE ? ans + j : NULL;
}

/* Sequence 0 has read the prompt: the others share its KV and sample from its logits. */
static void fork_and_report(struct sched *s, struct seq *lead, const float *row)
{
    struct request *r = lead->req;
    r->fork_pending = false;
    int n = r->n_seqs;
    for (int i = 1; i < n; i++) {
        struct seq *q = &r->seqs[i];
        if (kv_fork(s->kv, lead->slot, q->slot) == 0)
            q->n_kv = lead->n_kv;
    }
    /* r is freed when its last sequence finishes, which ends the loop. */
    for (int i = 0; i < n; i++)
        sample_and_report(s, &r->seqs[i], row, NULL);
}

static void fail_all(struct sched *s, const char *msg)
{
    while (s->live)
        finish_request(s, s->live, SCHED_FINISH_ERROR, msg);
}

/* Marks the sequences the next batch may hold (q->pick): every running one that can
 * run, or with several lanes the oldest not in flight, up to an even share of them.
 * Returns how many. */
static int pick_sequences(struct sched *s)
{
    int active = 0, picked = 0;
    for (int k = 0; k < s->n_running; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        q->pick = false;
        active += !waits_for_fork(q);
    }
    int share = (active + s->n_lanes - 1) / s->n_lanes;
    for (int k = 0; k < s->n_running && picked < share; k++) {
        struct seq *q = s->slot_seq[s->order[k]];
        if (!waits_for_fork(q) && !q->flight) {
            q->pick = true;
            picked++;
        }
    }
    return picked;
}

/* Builds the next batch in s->ln; false when nothing went into it. */
static bool build_step(struct sched *s)
{
    s->ln->t0 = clock_ns();
    s->ln->n_fed = 0;
    if (pick_sequences(s) == 0)
        return false;
    spec_plan(s);
    build_batch(s);
    if (s->ln->n_fed == 0)
        return false; /* everything was preempted or finished while making room */
    spec_run_drafts(s);
    return true;
}

static struct batch lane_batch(const struct lane *l)
{
    return (struct batch){.n = l->n_tokens, .token = l->b_token, .seq = l->b_seq, .pos = l->b_pos,
                          .logits = l->b_logits};
}

/* q's ask for sampling the token at pos (its history before pos is hist[0..pos)):
 * the window is what sample_token's penalties read (sample.h, step 2). */
static struct sched_ask ask_sample(const struct sched *s, const struct seq *q, int64_t pos)
{
    const struct request *r = q->req;
    struct sched_ask a = {.need = SCHED_NEED_SAMPLE, .n_top = r->logprobs ? r->top_logprobs : -1, .pos = pos,
                          .p = sched_seq_params(q)};
    const struct sample_params *p = &a.p;
    bool penalize = p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
    int64_t w = !penalize || p->penalty_last_n == 0                    ? 0
                : p->penalty_last_n < 0 || p->penalty_last_n > pos ? pos
                                                                   : p->penalty_last_n;
    a.window = q->hist + pos - w;
    a.n_window = w;
    if (q->gm) /* the mask is here: the row comes back and is sampled here */
        return (struct sched_ask){.need = SCHED_NEED_LOGITS};
    /* A window and bias list as large as the row: the row itself is no dearer. */
    if (w + 2 * (int64_t)p->n_bias >= s->n_vocab)
        return (struct sched_ask){.need = SCHED_NEED_LOGITS};
    return a;
}

/* sched_config.asks: an ask per wanted row of s->ln's batch, passed to the forward. A
 * sampled request's draft rows need p for rejection sampling (LOGITS) but its last row
 * only a token; a greedy one's rows are all argmaxes; rows after the drafts drafted
 * (a draft that stopped early) are not read; a forked prompt samples once per sequence
 * from its row. */
static int send_asks(struct sched *s, char *err, size_t errlen)
{
    struct lane *l = s->ln;
    int n = 0;
    for (int i = 0; i < l->n_fed; i++) {
        const struct fed *f = &l->fed[i];
        const struct seq *q = f->seq;
        if (!f->logits)
            continue;
        if (f->drafts > 0) {
            bool greedy = q->req->sample.temperature <= 0;
            for (int j = 0; j <= f->drafts; j++)
                l->asks[n++] = j > q->k_eff                ? (struct sched_ask){.need = SCHED_NEED_SKIP}
                               : greedy || j == q->k_eff ? ask_sample(s, q, q->n_hist + j)
                                                         : (struct sched_ask){.need = SCHED_NEED_LOGITS};
        } else if (q->req->fork_pending) {
            l->asks[n++] = (struct sched_ask){.need = SCHED_NEED_LOGITS};
        } else {
            l->asks[n++] = ask_sample(s, q, q->n_hist);
        }
    }
    l->n_asks = n;
    return s->cfg.asks(s->cfg.forward_ctx, l->asks, n, l->answers, err, errlen);
}

/* Reads the logits of s->ln's batch: each sequence that was in it samples (or verifies
 * its drafts, or forks) and reports. */
static void read_results(struct sched *s)
{
    struct lane *l = s->ln;
    s->stats.steps++;
    s->stats.last_batch = l->n_tokens;
    s->stats.last_decoding = l->step_decoding;
    s->stats.last_prompt = l->step_prompt;
    for (int i = 0; i < l->n_fed; i++)
        if (l->fed[i].seq)
            l->fed[i].seq->flight = NULL;
    const float *row = l->logits;
    int w = 0; /* wanted rows before this sequence's */
    for (int i = 0; i < l->n_fed; i++) {
        struct fed *f = &l->fed[i];
        const float *rows = row;
        const struct sched_token *ans = l->n_asks ? l->answers + w : NULL;
        if (f->logits) {
            row += (size_t)(1 + f->drafts) * s->n_vocab;
            w += 1 + f->drafts;
        }
        if (!f->seq)
            continue; /* finished while in flight */
        f->seq->n_kv += f->n;
        if (!f->logits)
            continue;
        if (f->drafts > 0)
            spec_verify_and_report(s, f->seq, rows, ans);
        else if (f->seq->req->fork_pending)
            fork_and_report(s, f->seq, rows);
        else
            sample_and_report(s, f->seq, rows, ans ? sched_answer_at(s, ans, 0) : NULL);
    }
    pace_update(s, clock_ns() - l->t0);
}

/* Sends s->ln's asks, then runs its forward (lanes 1) or submits it (lanes > 1). On
 * failure every live request finishes with the message. */
static int start_forward(struct sched *s, char *err, size_t errlen)
{
    struct batch b = lane_batch(s->ln);
    char msg[512];
    s->ln->n_asks = 0;
    int rc = s->cfg.asks ? send_asks(s, msg, sizeof msg) : 0;
    if (!rc && s->n_lanes > 1)
        rc = s->cfg.submit(s->cfg.forward_ctx, s->kv, &b, msg, sizeof msg);
    else if (!rc) {
        int64_t t0 = clock_ns();
        rc = s->cfg.forward ? s->cfg.forward(s->cfg.forward_ctx, s->kv, &b, s->ln->logits, msg, sizeof msg)
                            : engine_forward(s->e, s->kv, &b, s->ln->logits, msg, sizeof msg);
        s->stats.last_forward_ns = clock_ns() - t0;
    }
    if (rc) {
        fail_all(s, msg);
        return cairn_fail(err, errlen, rc, "%s", msg);
    }
    return 0;
}

/* lanes > 1: submits a batch into a lane not in flight. 1 when one went, 0 when no
 * sequence could run, negative when the submit failed (everything finished). */
static int submit_lane(struct sched *s, char *err, size_t errlen)
{
    int free_lane = 0;
    while (s->lane[free_lane].in_flight)
        free_lane++;
    s->ln = &s->lane[free_lane];
    if (!build_step(s))
        return 0;
    int rc = start_forward(s, err, errlen);
    if (rc)
        return rc;
    for (int i = 0; i < s->ln->n_fed; i++) {
        s->ln->fed[i].seq->flight = s->ln;
        s->ln->fed[i].seq->fed_idx = i;
    }
    s->ln->in_flight = true;
    s->flight[s->n_flight++] = free_lane;
    return 1;
}

/* lanes > 1: collects the oldest batch in flight and reads its results. */
static int collect_lane(struct sched *s, char *err, size_t errlen)
{
    s->ln = &s->lane[s->flight[0]];
    memmove(s->flight, s->flight + 1, (size_t)(--s->n_flight) * sizeof *s->flight);
    char msg[512];
    int64_t t0 = clock_ns();
    int rc = s->cfg.collect(s->cfg.forward_ctx, s->ln->logits, msg, sizeof msg);
    s->stats.last_forward_ns = clock_ns() - t0;
    s->ln->in_flight = false;
    if (rc) {
        fail_all(s, msg); /* its sequences too: they are still marked in flight */
        return cairn_fail(err, errlen, rc, "%s", msg);
    }
    read_results(s);
    return 1;
}

int sched_step(struct sched *s, char *err, size_t errlen)
{
    bool worked = admit(s);
    if (s->n_lanes > 1) {
        if (s->n_flight < s->n_lanes && s->n_running > 0) {
            int rc = submit_lane(s, err, errlen);
            if (rc)
                return rc;
            worked = true; /* picking may have preempted or finished sequences */
        }
        return s->n_flight > 0 ? collect_lane(s, err, errlen) : worked;
    }
    if (s->n_running == 0)
        return worked;
    s->ln = &s->lane[0];
    if (!build_step(s))
        return 1;
    int rc = start_forward(s, err, errlen);
    if (rc)
        return rc;
    read_results(s);
    return 1;
}

/* ---- requests in ---- */

static int check_sampling(const struct sched *s, const struct sample_params *p, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (isnan(p->temperature))
        bad = "temperature is NaN";
    else if (!(p->top_p > 0 && p->top_p <= 1))
        bad = "top_p outside (0, 1]";
    else if (!(p->min_p >= 0 && p->min_p <= 1))
        bad = "min_p outside [0, 1]";
    else if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0))
        bad = "repeat_penalty must be finite and > 0";
    else if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        bad = "presence and frequency penalties must be finite";
    else if (p->penalty_last_n < -1)
        bad = "penalty_last_n below -1";
    else if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        bad = "logit bias count without entries";
    if (bad)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "sampling: %s", bad);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias[i].token < 0 || p->bias[i].token >= s->n_vocab)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "sampling: logit bias token %d outside the vocabulary of %d",
                              p->bias[i].token, s->n_vocab);
        if (isnan(p->bias[i].bias))
            return cairn_fail(err, errlen, CAIRN_EINVAL, "sampling: logit bias of token %d is NaN", p->bias[i].token);
    }
    return 0;
}

static int check_request(const struct sched *s, const struct sched_request *r, char *err, size_t errlen)
{
    if (!r || !r->prompt || r->n_prompt < 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the prompt is empty");
    if (r->n_prompt >= s->cfg.ctx)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "prompt of %lld tokens does not fit the context of %lld",
                          (long long)r->n_prompt, (long long)s->cfg.ctx);
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->n_vocab)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "prompt token %lld: id %d outside the vocabulary of %d",
                              (long long)i, r->prompt[i], s->n_vocab);
    if (r->max_tokens < 1)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "max_tokens %lld (at least 1)", (long long)r->max_tokens);
    if (r->n_seqs < 1 || r->n_seqs > SCHED_MAX_SEQS_PER_REQUEST || r->n_seqs > s->cfg.slots)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "n_seqs %d outside 1..%d", r->n_seqs,
                          s->cfg.slots < SCHED_MAX_SEQS_PER_REQUEST ? s->cfg.slots : SCHED_MAX_SEQS_PER_REQUEST);
    if (r->top_logprobs < 0 || r->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "top_logprobs %d outside 0..%d", r->top_logprobs,
                          SCHED_MAX_TOP_LOGPROBS);
    if (r->num_draft_tokens < -1 || r->num_draft_tokens > SCHED_MAX_DRAFT)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "num_draft_tokens %d outside -1..%d", r->num_draft_tokens,
                          SCHED_MAX_DRAFT);
    if (r->lookup_ngram < 0 || r->lookup_ngram > SCHED_MAX_LOOKUP_NGRAM)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "lookup_ngram %d outside 0..%d", r->lookup_ngram,
                          SCHED_MAX_LOOKUP_NGRAM);
    return check_sampling(s, &r->sample, err, errlen);
}

static struct request *request_new(const struct sched *s, const struct sched_request *rq)
{
    struct request *r = calloc(1, sizeof *r + (size_t)rq->n_seqs * sizeof r->seqs[0]);
    if (!r)
        return NULL;
    r->id = rq->id;
    r->n_prompt = rq->n_prompt;
    r->max_tokens = rq->max_tokens;
    r->n_seqs = r->live = rq->n_seqs;
    r->ignore_eos = rq->ignore_eos;
    r->logprobs = rq->logprobs;
    r->top_logprobs = rq->logprobs ? rq->top_logprobs : 0;
    r->num_draft = rq->num_draft_tokens;
    r->lookup_ngram = rq->lookup_ngram;
    r->sample = rq->sample;
    if (rq->sample.n_bias > 0) {
        r->bias = malloc((size_t)rq->sample.n_bias * sizeof *r->bias);
        if (!r->bias)
            goto fail;
        memcpy(r->bias, rq->sample.bias, (size_t)rq->sample.n_bias * sizeof *r->bias);
    }
    r->sample.bias = r->bias;
    r->sample.allow = NULL; /* set per step from the sequence's grammar */
    /* History for the prompt and what may be generated, within the context. */
    int64_t cap = rq->max_tokens > s->cfg.ctx - rq->n_prompt ? s->cfg.ctx : rq->n_prompt + rq->max_tokens;
    for (int i = 0; i < r->n_seqs; i++) {
        struct seq *q = &r->seqs[i];
        q->req = r;
        q->index = i;
        q->state = SEQ_QUEUED;
        q->slot = -1;
        q->acc = SPEC_ACC_PRIOR;
        q->cap = cap;
        q->hist = malloc((size_t)cap * sizeof *q->hist);
        if (!q->hist)
            goto fail;
        memcpy(q->hist, rq->prompt, (size_t)rq->n_prompt * sizeof *q->hist);
        q->n_hist = rq->n_prompt;
        if (rq->grammar && grammar_match_create(&q->gm, rq->grammar))
            goto fail;
    }
    return r;
fail:
    request_free(r);
    return NULL;
}

int sched_submit(struct sched *s, const struct sched_request *rq, char *err, size_t errlen)
{
    int rc = check_request(s, rq, err, errlen);
    if (rc)
        return rc;
    if (find_request(s, rq->id))
        return cairn_fail(err, errlen, CAIRN_ESTATE, "request %llu is already live", (unsigned long long)rq->id);
    if (s->q_count >= s->cfg.queue_max)
        return cairn_fail(err, errlen, CAIRN_EFULL, "the queue is full (%d requests waiting)", s->q_count);
    if (rq->grammar) {
        struct grammar_match *m = NULL;
        int grc = grammar_match_create(&m, rq->grammar);
        grammar_match_release(m);
        if (grc == CAIRN_EFORMAT)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "grammar: its start exceeds the matcher's limits "
                              "(too deep or too ambiguous)");
    }
    struct request *r = request_new(s, rq);
    if (!r)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for a request of %d sequences", rq->n_seqs);
    r->next = s->live;
    if (s->live)
        s->live->prev = r;
    s->live = r;
    queue_push_back(s, (struct queue_item){r, -1});
    return 0;
}

void sched_cancel(struct sched *s, uint64_t id)
{
    struct request *r = find_request(s, id);
    if (r)
        finish_request(s, r, SCHED_FINISH_CANCELLED, NULL);
}

/* ---- lifetime ---- */

int sched_kv_seqs(const struct sched_config *cfg) { return cfg ? cfg->slots + cfg->cache_seqs : 0; }

static int check_config(const struct engine *e, const struct kv_cache *kv, const struct sched_config *c, char *err,
                        size_t errlen)
{
    const struct model *m = engine_model(e);
    bool remote = c->forward || (c->lanes > 1 && c->submit); /* the rest of the model is elsewhere */
    if (!m->first || (!m->last && !remote))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the scheduler needs %s (layers [%d, %d) of %d)",
                          remote ? "the first slice" : "a whole model", m->layer_begin, m->layer_end,
                          m->hp.n_layers);
    if (c->slots < 1 || c->slots > SCHED_MAX_SLOTS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "slots %d outside 1..%d", c->slots, SCHED_MAX_SLOTS);
    if (c->slots > engine_max_batch(e))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "slots %d exceed the engine's max_batch %d", c->slots,
                          engine_max_batch(e));
    if (c->ctx < 2)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "ctx %lld (at least 2)", (long long)c->ctx);
    if (c->chunk_tokens < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "chunk_tokens %d is negative", c->chunk_tokens);
    if (c->queue_max < 0 || c->queue_max > (1 << 20))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "queue_max %d outside 0..%d", c->queue_max, 1 << 20);
    if (c->cache_seqs < 0 || c->cache_seqs > SCHED_MAX_CACHE_SEQS)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "cache_seqs %d outside 0..%d", c->cache_seqs,
                          SCHED_MAX_CACHE_SEQS);
    const struct kv_config *kc = kv_config(kv);
    if (kc->max_seqs < sched_kv_seqs(c))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the KV cache has %d sequence ids; slots + cache_seqs need %d",
                          kc->max_seqs, sched_kv_seqs(c));
    if (kv_free_blocks(kv) != kc->n_blocks)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the KV cache is not empty");
    if (c->lanes < 0 || c->lanes > SCHED_MAX_LANES)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "lanes %d outside 0..%d", c->lanes, SCHED_MAX_LANES);
    if (c->lanes > 1 && (!c->submit || !c->collect))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "lanes %d need submit and collect", c->lanes);
    if (c->asks && !remote)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "asks need a forward (or submit and collect) to answer them");
    return 0;
}

static bool lane_alloc(struct lane *l, size_t slots, size_t max_batch, size_t n_vocab)
{
    l->b_token = calloc(max_batch, sizeof *l->b_token);
    l->b_seq = calloc(max_batch, sizeof *l->b_seq);
    l->b_pos = calloc(max_batch, sizeof *l->b_pos);
    l->b_logits = calloc(max_batch, sizeof *l->b_logits);
    l->fed = calloc(slots, sizeof *l->fed);
    l->logits = malloc(slots * n_vocab * sizeof *l->logits);
    l->asks = calloc(slots, sizeof *l->asks);
    l->answers = calloc(slots, sizeof *l->answers);
    l->logit_rows = (int64_t)slots;
    return l->b_token && l->b_seq && l->b_pos && l->b_logits && l->fed && l->logits && l->asks && l->answers;
}

static void lane_free(struct lane *l)
{
    free(l->b_token);
    free(l->b_seq);
    free(l->b_pos);
    free(l->b_logits);
    free(l->fed);
    free(l->logits);
    free(l->asks);
    free(l->answers);
    free(l->q_ids);
    free(l->q_probs);
}

int sched_create(struct sched **out, struct engine *e, struct kv_cache *kv, const struct sched_config *cfg,
                 const struct sched_callbacks *cb, char *err, size_t errlen)
{
    *out = NULL;
    if (!e || !kv || !cfg)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "the scheduler needs an engine, a KV cache and a config");
    int rc = check_config(e, kv, cfg, err, errlen);
    if (rc)
        return rc;
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    s->e = e;
    s->kv = kv;
    s->cfg = *cfg;
    if (s->cfg.queue_max == 0)
        s->cfg.queue_max = 4 * cfg->slots;
    if (cb)
        s->cb = *cb;
    s->n_vocab = engine_model(e)->hp.n_vocab;
    s->max_batch = engine_max_batch(e);
    s->chunk_tokens = cfg->chunk_tokens ? cfg->chunk_tokens : s->max_batch - cfg->slots;
    s->paced = cfg->chunk_tokens == 0;
    if (s->chunk_tokens < 1)
        s->chunk_tokens = 1;
    s->block_tokens = kv_config(kv)->block_tokens;
    s->n_blocks = kv_config(kv)->n_blocks;
    /* Preempted units go back to the queue beside the waiting requests: at most one per slot. */
    s->q_cap = s->cfg.queue_max + cfg->slots;
    size_t slots = (size_t)cfg->slots, mb = (size_t)s->max_batch;
    s->slot_seq = calloc(slots, sizeof *s->slot_seq);
    s->order = calloc(slots, sizeof *s->order);
    s->queue = calloc((size_t)s->q_cap, sizeof *s->queue);
    s->cache = calloc((size_t)cfg->cache_seqs + 1, sizeof *s->cache);
    s->n_lanes = cfg->lanes > 1 ? cfg->lanes : 1;
    s->lane = calloc((size_t)s->n_lanes, sizeof *s->lane);
    bool lanes_ok = s->lane != NULL;
    for (int i = 0; lanes_ok && i < s->n_lanes; i++)
        lanes_ok = lane_alloc(&s->lane[i], slots, mb, (size_t)s->n_vocab);
    s->ln = s->lane;
    s->opt = sched_spec_defaults();
    size_t nv = (size_t)s->n_vocab;
    s->p_ids = malloc(nv * sizeof *s->p_ids);
    s->p_probs = malloc(nv * sizeof *s->p_probs);
    s->r_w = malloc(nv * sizeof *s->r_w);
    s->q_dense = calloc(nv, sizeof *s->q_dense);
    if (!s->slot_seq || !s->order || !s->queue || !s->cache || !lanes_ok || !s->p_ids || !s->p_probs || !s->r_w || !s->q_dense ||
        sample_create(&s->smp, s->n_vocab)) {
        sched_release(s);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory for a scheduler of %d slots", cfg->slots);
    }
    *out = s;
    return 0;
}

void sched_release(struct sched *s)
{
    if (!s)
        return;
    while (s->live) /* also what a done callback submits meanwhile */
        finish_request(s, s->live, SCHED_FINISH_CANCELLED, NULL);
    for (int i = 0; s->cache && i < s->cfg.cache_seqs; i++)
        if (s->cache[i].tokens)
            cache_evict(s, i);
    sample_release(s->smp);
    free(s->slot_seq);
    free(s->order);
    free(s->queue);
    free(s->cache);
    for (int i = 0; s->lane && i < s->n_lanes; i++)
        lane_free(&s->lane[i]);
    free(s->lane);
    free(s->d_token);
    free(s->d_seq);
    free(s->d_pos);
    free(s->d_logits);
    free(s->d_out);
    free(s->p_ids);
    free(s->p_probs);
    free(s->r_w);
    free(s->q_dense);
    free(s);
}

/* ---- queries ---- */

bool sched_idle(const struct sched *s) { return s->n_running == 0 && s->q_count == 0 && s->n_flight == 0; }

void sched_get_stats(const struct sched *s, struct sched_stats *out)
{
    *out = s->stats;
    out->running = s->n_running;
    out->queued = s->q_count;
    out->cached = s->n_cached;
    out->kv_blocks_total = s->n_blocks;
    out->kv_blocks_used = s->n_blocks - kv_free_blocks(s->kv);
}

const char *sched_finish_name(int why)
{
    static const char *const names[SCHED_FINISH_COUNT] = {"stop", "length", "stopped", "cancelled", "error"};
    return why >= 0 && why < SCHED_FINISH_COUNT ? names[why] : NULL;
}
