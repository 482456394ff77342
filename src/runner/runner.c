/* cairn runner: one model instance's shard on this node, started by the node's
 * supervisor (node/supervisor.h) and speaking proto/runner_proto.h on fd 3. It
 * reports Idle -> Connecting -> Loading -> WarmingUp -> Ready, runs TextGeneration tasks
 * through the continuous-batching scheduler (engine/sched.h; Running while any runs,
 * Ready when idle): token tasks stream token ids back, text tasks (params) are rendered
 * with the model's chat template and stream text (runner_text.h). It exits when the node
 * asks (ShuttingDown -> Shutdown), when the node is gone (EOF on fd 4 or on the socket),
 * or after reporting Failed.
 *
 * A pipelined instance's runner (world_size > 1) holds one layer range: it listens for
 * the data plane at start (its port in every status), loads and warms up, then reports
 * Connecting until the node says where its next rank is ("peers"), connects both ways
 * (runner_link.h) and reports Ready. Rank 0 runs the scheduler as above, its forward
 * pass going through every rank (runner/pipeline.h); the other ranks only serve the
 * stage. A link that ends fails the runner (its requests end with the error). */
#include "base/array.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/thread.h"
#include "base/mem.h"
#include "base/args.h"
#include "runner/runner.h"
#include "runner/runner_link.h"
#include "runner/runner_text.h"
#include "runner/pipeline.h"
#include "runner/tensor.h"
#include "proto/runner_proto.h"
#include "proto/taskmsg.h"
#include "proto/textgen.h"
#include "gguf/vocab.h"
#include "proto/status.h"
#include "engine/embed.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"
#include "tmpl/chat.h"
#include "tok/grammar.h"
#include "tok/jschema.h"
#include "tok/reasoning.h"
#include "tok/tok.h"
#include "tok/toolcall.h"

_Static_assert(DP_ID_MAX == RUNNER_IDENTITY_MAX, "the data plane carries the identity the node gives");
#define RUNNER_MAX_BATCH 512 /* tokens of one forward: a prefill chunk at most */
_Static_assert(KV_WINDOW_SLACK + RUNNER_KV_BLOCK_TOKENS + RUNNER_MAX_BATCH <= RUNNER_KV_WINDOW_MARGIN,
               "a sliding-window layer's margin covers the cache's slack, a block and a prefill chunk");

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WARMUP_TOKENS 4
#define CONNECT_MS 60000 /* a pipelined runner's data-plane links must be up this soon after "peers" */
#define MAX_TASKS 1024 /* tasks held at once (queued in the scheduler or running) */
/* Tokens of one embedding forward: a turn of the loop stays short enough for heartbeats
 * (the node gives up on a runner silent for 30 s) on a busy machine with a large model. */
#define EMBED_STEP_TOKENS 128

/* A task being generated. */
struct rtask {
    char id[IDS_ID_MAX + 1];
    uint64_t sched_id;         /* of its first scheduler request; a batch of prompts has
                                  n_reqs of them, sched_id + i for prompt i */
    int n_reqs, per_req;       /* requests, and sequences of each (task seq = i * per_req + seq) */
    int64_t prompt_total;      /* a batch's prompt tokens, all prompts */
    bool started;              /* start was sent */
    bool text;                 /* params task: text out; else token ids out */
    int n_seqs, n_done;
    int64_t generated;
    enum runner_finish finish; /* of the whole task, from its sequences */
    char *error;
    struct text_seq *seqs[TEXTGEN_MAX_N];
    char *stops[TEXTGEN_MAX_STOP]; /* for stop_sequence in seq_done */
    int n_stops;
    int64_t admitted_ns, first_token_ns[TEXTGEN_MAX_N]; /* for seq_done's prompt_ms, predicted_ms */
    struct grammar *grammar;     /* constrained decoding: the task's own grammar and masks, or NULL */
    struct grammar_ctx *gctx;
    struct gcache *gent;         /* or the runner's cached ones it uses */
};

/* Compiled grammars kept for the requests that follow (a client sends the same schema
 * again and again): the automaton and the masks it learned stay warm. */
#define GCACHE_N 8
struct gcache {
    char *text;               /* GBNF, NULL: free entry */
    struct grammar *g;
    struct grammar_ctx *c;
    int users;                /* tasks using it now */
    uint64_t used;            /* tick of the last use */
};

struct runner {
    struct runner_config cfg;
    FILE *step_log;      /* CAIRN_STEP_LOG's file (see step_log_line), or NULL */
    bool step_log_tried;
    int sock;
    struct runner_lines in;
    int64_t last_sent; /* ns */
    /* While a step runs, the node's messages (each token's text, for every sequence) wait
     * here and go in one write at its end: one wake-up of the node a step, not one a
     * token. held_len bytes of held_cap; owned. */
    char *held;
    size_t held_len, held_cap;
    bool hold;
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct sched *sched;
    struct model *draft_m; /* speculative decoding's draft, or NULL */
    struct engine *draft_e;
    struct kv_cache *draft_kv;
    char draft_path[RUNNER_PATH_MAX];
    struct tok *tk;
    struct chat *chat;
    struct reasoning_info think;  /* of the chat template */
    enum toolcall_format tools;   /* of the chat template */
    bool harmony;                 /* the chat template is gpt-oss's harmony format */
    int64_t ctx;
    int max_batch;
    float *out;        /* WARMUP_TOKENS * max(n_vocab, n_embd) floats */
    int32_t *seqs;     /* max_batch zeros */
    int64_t *pos;      /* max_batch */
    struct rtask *tasks[MAX_TASKS];
    int n_tasks;
    uint64_t next_sched_id;
    bool busy, shutdown;
    /* pipelined (cfg.world_size > 1) */
    struct runner_link link;
    struct pipeline *pipe;
    struct tensor *tp;     /* a tensor-parallel instance's rank (cfg.tensor), else NULL */
    struct runner_peers peers;
    bool have_peers;
    struct gcache gcache[GCACHE_N];
    uint64_t gtick;
    struct grammar_vocab *gvocab; /* the vocabulary's trie, built at the first grammar */
    struct kv_cache *embed_kv;    /* embedding tasks' cache (engine/embed.h), made at the first */
    struct ejob *ejobs;           /* embedding tasks, first in first out: the first runs */
};

/* An embedding task: its inputs as token ids, run one forward per turn of the loop. */
struct ejob {
    char id[IDS_ID_MAX + 1];
    int n, keep;               /* inputs; values kept of each vector (dimensions) */
    int32_t *ids;              /* the inputs' tokens, (ctx + 1) apart */
    struct embed_input *in;
    float *out;                /* n x n_embd */
    struct embed_job *job;
    struct ejob *next;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn runner --config JSON|-   (as cairn node starts it; '-' reads the JSON from stdin)\n"
            "       cairn runner -m MODEL.gguf [--layers B:E] [--ctx N] [-ctk T] [-ctv T] [--slots N] [-t THREADS]\n"
            "                    [--heartbeat-ms N] [--instance ID] [--runner ID] [--sock-fd N] [--node-fd N]\n"
            "Speaks JSON lines on the socket at --sock-fd (3) and exits when --node-fd (4; -1: none)\n"
            "reaches end of file. See src/proto/runner_proto.h for the messages.\n");
}

/* A KV cache type given as opt, or -1 (message printed). */
static int kv_type_arg(const char *opt, const char *v)
{
    int t = dtype_kv_from_name(v);
    if (t < 0)
        fprintf(stderr, "cairn runner: %s: '%s' is not one of f16, f32, q8_0, q4_0\n", opt, v);
    return t;
}

/* The node is gone: nothing is left to report to, so leave at once. */
static void node_gone(void)
{
    static const char msg[] = "cairn runner: the node is gone; exiting\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(0);
}

static void *watch_node(void *arg)
{
    int fd = (int)(intptr_t)arg;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (p.revents & (POLLHUP | POLLERR | POLLNVAL)))
            node_gone();
        char b[64];
        ssize_t got = read(fd, b, sizeof b);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
            node_gone();
    }
    return NULL;
}

/* Writes the held messages to the node (node_gone when it cannot take them). */
static void flush_held(struct runner *r)
{
    if (r->held_len && runner_send_bytes(r->sock, r->held, r->held_len))
        node_gone();
    r->held_len = 0;
}

/* Sends m to the node, or while r->hold appends it to the held messages; held ones go
 * first, so the node reads them in order. A message that cannot be held (no memory) goes
 * at once, after the held ones. */
static void send_msg(struct runner *r, const struct runner_msg *m)
{
    size_t len;
    char *line = runner_msg_encode(m, &len);
    if (!line) {
        fprintf(stderr, "cairn runner: cannot encode a '%s' message\n", runner_msg_type_name(m->type));
    } else if (r->hold && !array_reserve(&r->held, &r->held_cap, r->held_len + len, 1, 4096)) {
        memcpy(r->held + r->held_len, line, len);
        r->held_len += len;
    } else {
        flush_held(r);
        if (runner_send_bytes(r->sock, line, len))
            node_gone();
    }
    free(line);
    r->last_sent = clock_ns();
}

static void send_status(struct runner *r, enum cluster_runner_status st, const char *error)
{
    struct runner_msg m = {.type = RUNNER_MSG_STATUS, .status = st, .error = (char *)error,
                           .data_port = runner_link_port(&r->link)};
    send_msg(r, &m);
}

static void send_done(struct runner *r, const char *task_id, enum runner_finish finish, int64_t n, const char *error)
{
    struct runner_msg m = {.type = RUNNER_MSG_DONE, .finish = finish, .n_generated = n, .error = (char *)error};
    snprintf(m.task_id, sizeof m.task_id, "%s", task_id);
    send_msg(r, &m);
}

/* The scheduler's figures, carried by start and seq_done messages to the node whose API
 * holds the request (its /metrics). */
static void get_task_stats(struct runner *r, struct task_stats *s)
{
    struct sched_stats st;
    sched_get_stats(r->sched, &st);
    *s = (struct task_stats){.running = st.running, .queued = st.queued, .slots = r->cfg.slots,
                             .kv_blocks_used = st.kv_blocks_used, .kv_blocks_total = st.kv_blocks_total,
                             .preemptions = st.preemptions};
    if (r->pipe) { /* rank 0 of a pipeline: how its steps went around the ring */
        struct pipeline_stats ps;
        pipeline_get_stats(r->pipe, &ps);
        s->pipeline = true;
        s->pipeline_steps = (int64_t)ps.steps;
        s->pipeline_compute_us = ps.compute_us;
        s->pipeline_wait_us = ps.wait_us;
        s->pipeline_bytes = (int64_t)(ps.bytes_sent + ps.bytes_received);
        s->pipeline_sealed_bytes = (int64_t)ps.sealed_bytes_sent;
        /* What came back per wanted row: a token sampled on the last rank, or logits. */
        s->pipeline_result_bytes = (int64_t)ps.result_bytes;
        s->pipeline_rows_sampled = (int64_t)ps.rows_sampled;
        s->pipeline_rows_logits = (int64_t)ps.rows_logits;
    }
    if (r->tp) { /* rank 0 of a tensor-parallel instance: its own part, and the exchanges */
        struct tensor_stats ts;
        tensor_get_stats(r->tp, &ts);
        s->pipeline = true;
        s->pipeline_steps = (int64_t)ts.steps;
        s->pipeline_compute_us = ts.compute_us - ts.xchg_us;
        s->pipeline_wait_us = ts.xchg_us;
        s->pipeline_bytes = (int64_t)(ts.bytes_sent + ts.bytes_received);
    }
}

/* Sends a start, output or seq_done message (proto/taskmsg.h); start and seq_done get the
 * scheduler's figures. */
static void send_task_msg(struct runner *r, struct task_msg *tm)
{
    if (tm->type != RUNNER_MSG_OUTPUT && r->sched && !tm->error) {
        get_task_stats(r, &tm->stats);
        tm->has_stats = true;
    }
    json_t *body = task_msg_to_json(tm);
    if (!body) {
        fprintf(stderr, "cairn runner: a '%s' message of task %s cannot be encoded; it is lost\n",
                runner_msg_type_name(tm->type), tm->task_id);
        return;
    }
    json_object_del(body, "type"); /* runner_msg adds them again */
    json_object_del(body, "task_id");
    struct runner_msg m = {.type = tm->type, .body = body};
    memcpy(m.task_id, tm->task_id, sizeof m.task_id);
    send_msg(r, &m);
    json_decref(body);
}

static struct task_msg task_msg_of(enum runner_msg_type type, const char *task_id)
{
    struct task_msg m = {.type = type};
    snprintf(m.task_id, sizeof m.task_id, "%s", task_id);
    return m;
}

/* A text task refused before it started: start with the error and its HTTP status, then
 * done. */
static void refuse_text(struct runner *r, const char *task_id, int status, const char *error)
{
    struct task_msg m = task_msg_of(RUNNER_MSG_START, task_id);
    m.error = error;
    m.status = status;
    send_task_msg(r, &m);
    send_done(r, task_id, RUNNER_FINISH_ERROR, 0, error);
}

static void heartbeat_if_due(struct runner *r)
{
    if (clock_ns() - r->last_sent >= (int64_t)r->cfg.heartbeat_ms * 1000000) {
        struct runner_msg m = {.type = RUNNER_MSG_HEARTBEAT};
        send_msg(r, &m);
    }
}

/* ---- tasks ---- */

/* The task of scheduler request id, and in *seq0 the task's number of that request's
 * first sequence. */
static struct rtask *task_by_sched(struct runner *r, uint64_t id, int *at, int *seq0)
{
    for (int i = 0; i < r->n_tasks; i++) {
        struct rtask *t = r->tasks[i];
        if (id >= t->sched_id && id - t->sched_id < (uint64_t)t->n_reqs) {
            if (at)
                *at = i;
            *seq0 = (int)(id - t->sched_id) * t->per_req;
            return t;
        }
    }
    return NULL;
}

static struct rtask *task_by_id(struct runner *r, const char *id)
{
    for (int i = 0; i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i]->id, id))
            return r->tasks[i];
    return NULL;
}

static void task_free(struct rtask *t)
{
    if (!t)
        return;
    for (int i = 0; i < TEXTGEN_MAX_N; i++)
        text_seq_release(t->seqs[i]);
    for (int i = 0; i < t->n_stops; i++)
        free(t->stops[i]);
    free(t->error);
    grammar_ctx_release(t->gctx);
    grammar_release(t->grammar);
    if (t->gent)
        t->gent->users--;
    free(t);
}

static void task_drop(struct runner *r, int at)
{
    task_free(r->tasks[at]);
    r->tasks[at] = r->tasks[--r->n_tasks];
}

/* Sends what a sequence's text made ready. */
static void flush_text(struct runner *r, struct rtask *t, int seq)
{
    const char *content, *reasoning;
    json_t *logprobs;
    if (!text_seq_take(t->seqs[seq], &content, &reasoning, &logprobs))
        return;
    struct task_msg m = task_msg_of(RUNNER_MSG_OUTPUT, t->id);
    m.seq = seq;
    m.content = content;
    m.reasoning = reasoning;
    m.logprobs = logprobs;
    send_task_msg(r, &m);
    json_decref(logprobs);
}

static int on_token(void *ctx, uint64_t id, int seq, int64_t index, const struct sched_token *tok)
{
    struct runner *r = ctx;
    int seq0 = 0;
    struct rtask *t = task_by_sched(r, id, NULL, &seq0);
    if (!t)
        return 1;
    seq += seq0;
    t->generated++;
    if (seq >= 0 && seq < TEXTGEN_MAX_N && !t->first_token_ns[seq])
        t->first_token_ns[seq] = clock_ns();
    if (!t->text) {
        struct runner_msg m = {.type = RUNNER_MSG_TOKEN, .token = tok->token, .index = index};
        snprintf(m.task_id, sizeof m.task_id, "%s", t->id);
        send_msg(r, &m);
        return 0;
    }
    int rc = text_seq_token(t->seqs[seq], tok);
    flush_text(r, t, seq);
    if (rc < 0) {
        fprintf(stderr, "cairn runner: task %s: out of memory in its text\n", t->id);
        return 1;
    }
    return rc;
}

/* A text task got its slots: start, with the prompt tokens its prefix reuse saved. */
static void on_admitted(void *ctx, uint64_t id, const struct sched_usage *u)
{
    struct runner *r = ctx;
    int seq0;
    struct rtask *t = task_by_sched(r, id, NULL, &seq0);
    if (t && !t->admitted_ns)
        t->admitted_ns = clock_ns();
    if (t && t->text && !t->started) { /* a batch: when its first prompt gets its slots */
        struct task_msg m = task_msg_of(RUNNER_MSG_START, t->id);
        m.prompt_tokens = t->n_reqs > 1 ? t->prompt_total : u->prompt_tokens;
        m.cached_tokens = u->cached_tokens;
        send_task_msg(r, &m);
        t->started = true;
    }
}

static enum task_seq_finish seq_finish_of(enum sched_finish why, bool tool_calls)
{
    switch (why) {
    case SCHED_FINISH_STOP:
    case SCHED_FINISH_STOPPED:
        return tool_calls ? TASK_SEQ_TOOL_CALLS : TASK_SEQ_STOP;
    case SCHED_FINISH_LENGTH:
        return tool_calls ? TASK_SEQ_TOOL_CALLS : TASK_SEQ_LENGTH;
    case SCHED_FINISH_CANCELLED:
        return TASK_SEQ_CANCELLED;
    default:
        return TASK_SEQ_ERROR;
    }
}

/* The task's finish from its sequences': an error wins, then cancelled, then length. */
static void merge_finish(struct rtask *t, enum sched_finish why, const char *error)
{
    enum runner_finish f = why == SCHED_FINISH_ERROR       ? RUNNER_FINISH_ERROR
                           : why == SCHED_FINISH_CANCELLED ? RUNNER_FINISH_CANCELLED
                           : why == SCHED_FINISH_LENGTH    ? RUNNER_FINISH_LENGTH
                                                           : RUNNER_FINISH_STOP;
    static const int rank[RUNNER_FINISH_COUNT] = {[RUNNER_FINISH_STOP] = 0, [RUNNER_FINISH_LENGTH] = 1,
                                                  [RUNNER_FINISH_CANCELLED] = 2, [RUNNER_FINISH_ERROR] = 3};
    if (t->n_done == 0 || rank[f] > rank[t->finish])
        t->finish = f;
    if (error && !t->error)
        t->error = strdup(error);
}

static void on_done(void *ctx, uint64_t id, int seq, enum sched_finish why, const struct sched_usage *u,
                    const char *error)
{
    struct runner *r = ctx;
    int at, seq0;
    struct rtask *t = task_by_sched(r, id, &at, &seq0);
    if (!t)
        return;
    seq += seq0;
    merge_finish(t, why, error);
    if (t->text) {
        json_t *calls = NULL;
        if (text_seq_finish(t->seqs[seq], &calls))
            fprintf(stderr, "cairn runner: task %s: out of memory finishing its text\n", t->id);
        flush_text(r, t, seq);
        int matched = text_seq_stop_matched(t->seqs[seq]);
        struct task_msg m = task_msg_of(RUNNER_MSG_SEQ_DONE, t->id);
        m.seq = seq;
        m.seq_finish = seq_finish_of(why, calls != NULL);
        m.stop_sequence = matched >= 0 && matched < t->n_stops ? t->stops[matched] : NULL;
        m.tool_calls = calls;
        m.completion_tokens = u->generated_tokens;
        m.prompt_tokens = u->prompt_tokens;
        m.cached_tokens = u->cached_tokens;
        m.draft_tokens = u->draft_tokens;
        m.accepted_draft_tokens = u->accepted_draft_tokens;
        int64_t first = seq < TEXTGEN_MAX_N ? t->first_token_ns[seq] : 0;
        if (first && t->admitted_ns) {
            int64_t now = clock_ns();
            m.prompt_ms = first > t->admitted_ns ? (double)(first - t->admitted_ns) / 1e6 : 0;
            m.predicted_ms = now > first ? (double)(now - first) / 1e6 : 0;
        }
        send_task_msg(r, &m);
        json_decref(calls);
    }
    if (++t->n_done < t->n_seqs)
        return;
    send_done(r, t->id, t->finish, t->generated, t->finish == RUNNER_FINISH_ERROR ? t->error : NULL);
    task_drop(r, at);
}

static struct sample_params sampling_of(const struct runner_sampling *s)
{
    struct sample_params sp = sample_defaults();
    sp.temperature = s->temperature;
    sp.top_k = s->top_k;
    sp.top_p = s->top_p;
    sp.min_p = s->min_p;
    sp.repeat_penalty = s->repeat_penalty;
    sp.presence_penalty = s->presence_penalty;
    sp.frequency_penalty = s->frequency_penalty;
    sp.penalty_last_n = s->penalty_last_n;
    sp.seed = s->seed;
    return sp;
}

/* Adds t to the table and its k requests (each of rq[0].n_seqs sequences) to the
 * scheduler; on failure t is freed (the requests already queued cancelled) and err says
 * why. Returns 0 or the CAIRN_E* code. */
static int start_task(struct runner *r, struct rtask *t, struct sched_request *rq, int k, char *err, size_t errlen)
{
    if (r->n_tasks == MAX_TASKS) {
        task_free(t);
        return cairn_fail(err, errlen, CAIRN_EFULL, "the runner holds %d tasks", MAX_TASKS);
    }
    t->sched_id = r->next_sched_id + 1;
    t->n_reqs = k;
    t->per_req = rq[0].n_seqs;
    r->next_sched_id += (uint64_t)k;
    r->tasks[r->n_tasks++] = t;
    for (int j = 0; j < k; j++) {
        rq[j].id = t->sched_id + (uint64_t)j;
        int rc = sched_submit(r->sched, &rq[j], err, errlen);
        if (rc) { /* out of the table first: the cancelled requests' callbacks find no task */
            r->n_tasks--;
            for (int i = 0; i < j; i++)
                sched_cancel(r->sched, t->sched_id + (uint64_t)i);
            task_free(t);
            return rc;
        }
    }
    return 0;
}

static bool pipeline_refused(struct runner *r, char *err, size_t errlen)
{
    const struct model *m = r->m;
    if (r->sched)
        return false;
    snprintf(err, errlen, "this runner holds layers [%d, %d) of %d and is not its pipeline's first rank: "
             "tasks go to rank 0", m->layer_begin, m->layer_end, m->hp.n_layers);
    return true;
}

static void token_task(struct runner *r, struct runner_task *tt)
{
    char err[512];
    if (pipeline_refused(r, err, sizeof err)) {
        send_done(r, tt->task_id, RUNNER_FINISH_ERROR, 0, err);
        return;
    }
    struct rtask *t = calloc(1, sizeof *t);
    if (!t) {
        send_done(r, tt->task_id, RUNNER_FINISH_ERROR, 0, "out of memory");
        return;
    }
    snprintf(t->id, sizeof t->id, "%s", tt->task_id);
    t->n_seqs = 1;
    struct sched_request rq = {.prompt = tt->tokens, .n_prompt = tt->n_tokens, .max_tokens = tt->max_tokens,
                               .n_seqs = 1, .sample = sampling_of(&tt->sampling), .ignore_eos = tt->ignore_eos};
    if (start_task(r, t, &rq, 1, err, sizeof err)) {
        fprintf(stderr, "cairn runner: task %s: %s\n", tt->task_id, err);
        send_done(r, tt->task_id, RUNNER_FINISH_ERROR, 0, err);
    }
}

/* Messages as the template sees them: tool call arguments given as JSON text become
 * objects (templates write them with tojson); reasoning_content is also "thinking"; for
 * harmony, a null content is left out. */
static json_t *template_messages(const json_t *messages, bool harmony)
{
    json_t *msgs = json_deep_copy(messages);
    size_t i, k;
    json_t *m, *call;
    json_array_foreach(msgs, i, m) {
        /* gpt-oss's template reads an assistant turn's reasoning as "thinking", and looks
         * for markers in any "content" it has, which a tool call's null content fails */
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc) && !json_object_get(m, "thinking"))
            json_object_set(m, "thinking", rc);
        if (harmony && json_is_null(json_object_get(m, "content")))
            json_object_del(m, "content");
        json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
            json_t *fn = json_object_get(call, "function");
            const char *args = json_string_value(json_object_get(fn, "arguments"));
            json_t *obj = args ? json_loads(args, 0, NULL) : NULL;
            if (obj)
                json_object_set_new(fn, "arguments", obj);
        }
    }
    return msgs;
}

/* The prompt of p as token ids (*ids malloc'd) and, for chat, the rendered text's state
 * of reasoning (*opens_think). Returns 0 or an HTTP status with err. */
static int prompt_of(struct runner *r, const struct textgen_params *p, int32_t **ids, int64_t *n, bool *opens_think,
                     char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    *opens_think = false;
    if (p->messages) {
        json_t *vars = p->template_kwargs ? json_deep_copy(p->template_kwargs) : json_object();
        json_t *msgs = template_messages(p->messages, r->harmony);
        if (!vars || !msgs || json_object_set_new(vars, "messages", msgs) ||
            (p->tools && json_object_set(vars, "tools", p->tools))) {
            json_decref(vars);
            snprintf(err, errlen, "out of memory");
            return 500;
        }
        int rc = chat_render(r->chat, vars, p->add_generation_prompt, &text, &len, err, errlen);
        json_decref(vars);
        if (rc)
            return cairn_http_status(rc);
        *opens_think = reasoning_prompt_open(text, len, r->think.open, r->think.close);
    }
    if (p->prompt_ids) { /* token ids as given: each must be in this model's vocabulary */
        for (int64_t i = 0; i < p->n_prompt_ids; i++)
            if (p->prompt_ids[i] >= r->m->hp.n_vocab) {
                snprintf(err, errlen, "prompt[%lld]: token id %d is outside the vocabulary of %d tokens",
                         (long long)i, (int)p->prompt_ids[i], (int)r->m->hp.n_vocab);
                return 400;
            }
        if (!(*ids = malloc((size_t)p->n_prompt_ids * sizeof **ids))) {
            snprintf(err, errlen, "out of memory");
            return 500;
        }
        memcpy(*ids, p->prompt_ids, (size_t)p->n_prompt_ids * sizeof **ids);
        *n = p->n_prompt_ids;
    } else {
        const char *src = text ? text : p->prompt;
        int rc = chat_tokenize(r->chat, src, text ? len : strlen(p->prompt), ids, n, err, errlen);
        free(text);
        if (rc)
            return cairn_http_status(rc);
    }
    if (*n < 1) {
        snprintf(err, errlen, "the prompt is empty");
        return 400;
    }
    if (*n >= r->ctx) {
        snprintf(err, errlen, "the prompt has %lld tokens; the context holds %lld", (long long)*n, (long long)r->ctx);
        return 413;
    }
    return 0;
}

static void gcache_clear(struct gcache *e)
{
    grammar_ctx_release(e->c);
    grammar_release(e->g);
    free(e->text);
    memset(e, 0, sizeof *e);
}

/* t's grammar for GBNF text: a cached one (t->gent), or one of its own when every entry
 * is in use. 0 or the error of grammar_parse / grammar_ctx_from_tok. */
static int grammar_for(struct runner *r, struct rtask *t, const char *text, char *err, size_t errlen)
{
    struct gcache *free_e = NULL;
    for (int i = 0; i < GCACHE_N; i++) {
        struct gcache *e = &r->gcache[i];
        if (e->text && strcmp(e->text, text) == 0) {
            e->users++;
            e->used = ++r->gtick;
            t->gent = e;
            return 0;
        }
        if (e->users == 0 && (!free_e || !e->text || (free_e->text && e->used < free_e->used)))
            free_e = e;
    }
    struct grammar *g = NULL;
    struct grammar_ctx *c = NULL;
    int rc = grammar_parse(&g, text, strlen(text), "root", err, errlen);
    if (!rc && !r->gvocab)
        rc = grammar_vocab_from_tok(&r->gvocab, r->tk);
    if (!rc)
        rc = grammar_ctx_create_shared(&c, g, r->gvocab);
    if (rc) {
        grammar_release(g);
        return rc;
    }
    char *copy = free_e ? strdup(text) : NULL;
    if (!copy) {
        t->grammar = g;
        t->gctx = c;
        return 0;
    }
    gcache_clear(free_e);
    *free_e = (struct gcache){.text = copy, .g = g, .c = c, .users = 1, .used = ++r->gtick};
    t->gent = free_e;
    return 0;
}

/* A GBNF literal of s into b. */
static bool gbnf_literal(struct strbuf *b, const char *s)
{
    bool ok = strbuf_put(b, "\"", 1) == 0;
    for (; *s && ok; s++) {
        char esc[8];
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            snprintf(esc, sizeof esc, "\\x%02X", c);
        else
            esc[0] = (char)c, esc[1] = 0;
        ok = strbuf_put(b, esc, strlen(esc)) == 0;
    }
    return ok && strbuf_put(b, "\"", 1) == 0;
}

/* tool_choice "required" or a named function: a grammar whose outputs are exactly one
 * call, in the template's format, of one of the tools (or of the one named), its
 * arguments following the tool's parameter schema. *out malloc'd. An HTTP status and err
 * when the template has no format cairn constrains or a schema is refused. */
static int tool_grammar(const struct runner *r, const struct textgen_params *p, char **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *pre, *key;
    if (r->tools == TOOLCALL_HERMES) {
        pre = "<tool_call>\n{\"name\": ";
        key = ", \"arguments\": ";
    } else if (r->tools == TOOLCALL_LLAMA3) {
        pre = "{\"name\": ";
        key = ", \"parameters\": ";
    } else {
        snprintf(err, errlen, "tool_choice: this model's chat template has no tool-call format cairn can force (%s)",
                 toolcall_format_name(r->tools));
        return 400;
    }
    const char *post = r->tools == TOOLCALL_HERMES ? "}\n</tool_call>" : "}";
    struct strbuf root = {0}, rules = {0};
    bool ok = strbuf_put(&root, "root ::= ", 9) == 0;
    int n = 0, status = 0;
    size_t i;
    json_t *tool;
    json_array_foreach(p->tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (p->force_tool[0] && strcmp(name, p->force_tool) != 0))
            continue;
        const json_t *params = json_object_get(fn, "parameters");
        json_t *any = json_pack("{s:s}", "type", "object");
        char rule[32], *text = NULL, msg[512];
        snprintf(rule, sizeof rule, "tool%d", n);
        json_t *name_json = json_string(name);
        char *name_text = name_json ? json_dumps(name_json, JSON_ENCODE_ANY) : NULL;
        json_decref(name_json);
        int rc = jschema_rules(json_is_object(params) ? params : any, rule, &text, msg, sizeof msg);
        json_decref(any);
        if (rc) {
            snprintf(err, errlen, "tools[%zu].function.parameters: %s", i, msg);
            status = cairn_http_status(rc == CAIRN_EUNSUPPORTED ? CAIRN_EFORMAT : rc);
            free(name_text);
            break;
        }
        ok = ok && (n == 0 || strbuf_put(&root, " | ", 3) == 0);
        char ref[40];
        snprintf(ref, sizeof ref, "call%d", n);
        ok = ok && strbuf_put(&root, ref, strlen(ref)) == 0;
        ok = ok && strbuf_put(&rules, ref, strlen(ref)) == 0 && strbuf_put(&rules, " ::= ", 5) == 0 &&
             gbnf_literal(&rules, pre) && strbuf_put(&rules, " ", 1) == 0 && name_text &&
             gbnf_literal(&rules, name_text) && strbuf_put(&rules, " ", 1) == 0 && gbnf_literal(&rules, key) &&
             strbuf_put(&rules, " ", 1) == 0 && strbuf_put(&rules, rule, strlen(rule)) == 0 &&
             strbuf_put(&rules, " ", 1) == 0 && gbnf_literal(&rules, post) && strbuf_put(&rules, "\n", 1) == 0 &&
             strbuf_put(&rules, text, strlen(text)) == 0;
        free(text);
        free(name_text);
        n++;
    }
    if (!status && n == 0) {
        snprintf(err, errlen, "tool_choice: no tool to call");
        status = 400;
    }
    const char *common = jschema_common_gbnf();
    ok = ok && strbuf_put(&root, "\n", 1) == 0 && strbuf_put(&root, rules.p ? rules.p : "", rules.len) == 0 &&
         strbuf_put(&root, common, strlen(common)) == 0;
    strbuf_free(&rules);
    if (!status && !ok) {
        snprintf(err, errlen, "out of memory");
        status = 500;
    }
    if (status) {
        strbuf_free(&root);
        return status;
    }
    *out = root.p;
    return 0;
}

static bool embeds(const struct model *m)
{
    return m->hp.pooling == MODEL_POOLING_MEAN || m->hp.pooling == MODEL_POOLING_CLS ||
           m->hp.pooling == MODEL_POOLING_LAST;
}

/* An input as token ids in ids (cap r->ctx + 1), cut to the context with truncate (the
 * EOS the tokenizer appends kept last). Returns 0 or an HTTP status with err. */
static int embed_tokens(struct runner *r, const struct textgen_params *p, int i, int32_t *ids, int64_t *n, char *err,
                        size_t errlen)
{
    const struct textgen_input *x = &p->embed[i];
    int64_t cap = r->ctx + 1, need = x->n_ids;
    if (x->text) {
        int rc = tok_encode(r->tk, x->text, strlen(x->text), 1, 1, ids, cap, &need);
        if (rc && rc != CAIRN_EFULL) {
            snprintf(err, errlen, "input[%d]: %s", i, cairn_strerror(rc));
            return cairn_http_status(rc);
        }
    } else {
        memcpy(ids, x->ids, (size_t)(need < cap ? need : cap) * sizeof *ids);
    }
    if (need < 1) {
        snprintf(err, errlen, "input[%d]: no tokens", i);
        return 400;
    }
    if (need > r->ctx) {
        if (!p->truncate) {
            snprintf(err, errlen, "input[%d]: %lld tokens, more than the context of %lld (truncate cuts it)", i,
                     (long long)need, (long long)r->ctx);
            return 400;
        }
        if (x->text && tok_add_eos(r->tk))
            ids[r->ctx - 1] = tok_eos(r->tk);
        need = r->ctx;
    }
    *n = need;
    return 0;
}

static void ejob_free(struct ejob *j)
{
    if (!j)
        return;
    embed_job_release(j->job);
    free(j->ids);
    free(j->in);
    free(j->out);
    free(j);
}

/* An embedding task: checked and tokenized now, then queued (start is sent); the loop
 * runs it one forward at a time (ejob_step). */
static void embed_task(struct runner *r, const char *task_id, const struct textgen_params *p)
{
    char err[512];
    int status = 0, dim = r->m->hp.n_embd;
    struct ejob *j = NULL;
    if (r->pipe) {
        snprintf(err, sizeof err, "embeddings of a model split over several runners are not supported");
        status = 501;
        goto refuse;
    }
    if (!embeds(r->m)) {
        snprintf(err, sizeof err, "model '%s' declares no pooling (%s.pooling_type is %s): it is not an embedding "
                 "model", p->model, r->m->hp.arch, model_pooling_name(r->m->hp.pooling));
        status = 400;
        goto refuse;
    }
    if (p->dimensions > dim) {
        snprintf(err, sizeof err, "dimensions: %d, more than the model's %d", p->dimensions, dim);
        status = 400;
        goto refuse;
    }
    if (!r->embed_kv) {
        struct kv_config kc = embed_kv_config(r->m, r->ctx, r->max_batch);
        if (kv_create(&r->embed_kv, &kc, err, sizeof err)) {
            status = 500;
            goto refuse;
        }
    }
    size_t cap = (size_t)r->ctx + 1;
    if ((j = calloc(1, sizeof *j))) {
        j->ids = malloc((size_t)p->n_embed * cap * sizeof *j->ids);
        j->in = calloc((size_t)p->n_embed, sizeof *j->in);
        j->out = malloc((size_t)p->n_embed * (size_t)dim * sizeof *j->out);
    }
    if (!j || !j->ids || !j->in || !j->out) {
        snprintf(err, sizeof err, "out of memory for %d inputs", p->n_embed);
        status = 500;
        goto refuse;
    }
    snprintf(j->id, sizeof j->id, "%s", task_id);
    j->n = p->n_embed;
    j->keep = p->dimensions ? p->dimensions : dim;
    int64_t total = 0;
    for (int i = 0; i < p->n_embed; i++) {
        j->in[i].ids = j->ids + (size_t)i * cap;
        if ((status = embed_tokens(r, p, i, j->ids + (size_t)i * cap, &j->in[i].n, err, sizeof err)))
            goto refuse;
        total += j->in[i].n;
    }
    int rc = embed_job_create(&j->job, r->e, r->embed_kv, r->m->hp.pooling, j->in, j->n, j->out, EMBED_STEP_TOKENS,
                              err, sizeof err);
    if (rc) {
        status = cairn_http_status(rc);
        goto refuse;
    }
    struct task_msg m = task_msg_of(RUNNER_MSG_START, task_id);
    m.prompt_tokens = total;
    send_task_msg(r, &m);
    struct ejob **tail = &r->ejobs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = j;
    return;
refuse:
    ejob_free(j);
    fprintf(stderr, "cairn runner: embedding task %s refused: %s\n", task_id, err);
    refuse_text(r, task_id, status, err);
}

/* One forward of the first embedding task; when it is done, its vectors and done. */
static void ejob_step(struct runner *r)
{
    struct ejob *j = r->ejobs;
    char err[512];
    int rc = embed_job_step(j->job, err, sizeof err);
    if (rc > 0)
        return;
    r->ejobs = j->next;
    if (rc < 0) {
        fprintf(stderr, "cairn runner: embedding task %s failed: %s\n", j->id, err);
        send_done(r, j->id, RUNNER_FINISH_ERROR, 0, err);
        ejob_free(j);
        return;
    }
    int dim = r->m->hp.n_embd;
    for (int i = 0; i < j->n; i++) {
        float *v = j->out + (size_t)i * (size_t)dim;
        if (j->keep < dim)
            embed_normalize(v, j->keep); /* the first values of a Matryoshka vector, at unit length again */
        struct task_msg m = task_msg_of(RUNNER_MSG_EMBEDDING, j->id);
        m.index = i;
        m.prompt_tokens = j->in[i].n;
        char *b64 = task_embedding_encode(v, j->keep);
        m.embedding = b64;
        if (b64)
            send_task_msg(r, &m);
        free(b64);
    }
    send_done(r, j->id, RUNNER_FINISH_STOP, 0, NULL);
    ejob_free(j);
}

static struct ejob *ejob_by_id(struct runner *r, const char *id)
{
    for (struct ejob *j = r->ejobs; j; j = j->next)
        if (!strcmp(j->id, id))
            return j;
    return NULL;
}

/* Ends a queued or running embedding task as cancelled; false when there is none of id. */
static bool ejob_cancel(struct runner *r, const char *id)
{
    for (struct ejob **p = &r->ejobs; *p; p = &(*p)->next)
        if (!strcmp((*p)->id, id)) {
            struct ejob *j = *p;
            *p = j->next;
            send_done(r, j->id, RUNNER_FINISH_CANCELLED, 0, NULL);
            ejob_free(j);
            return true;
        }
    return false;
}

static void text_task(struct runner *r, struct runner_task *tt)
{
    char err[1024];
    struct textgen_params p;
    int32_t *ids = NULL;
    int64_t n = 0;
    bool opens_think = false;
    int status = 0, k = 0;
    struct rtask *t = NULL;
    int32_t *bids[TEXTGEN_MAX_N] = {0};
    int64_t bn[TEXTGEN_MAX_N] = {0}, total = 0;
    if (pipeline_refused(r, err, sizeof err)) {
        status = 501;
        goto refuse_noparams;
    }
    if (!r->chat) {
        snprintf(err, sizeof err, "this model has no tokenizer: only token tasks can run");
        status = 501;
        goto refuse_noparams;
    }
    if (textgen_params_from_json(tt->params, &p, err, sizeof err)) {
        status = 400;
        goto refuse_noparams;
    }
    if (p.embed) {
        embed_task(r, tt->task_id, &p);
        textgen_params_clear(&p);
        return;
    }
    if (embeds(r->m)) {
        snprintf(err, sizeof err, "model '%s' is an embedding model (pooling %s): ask /v1/embeddings or /api/embed, "
                 "not for generated text", p.model, model_pooling_name(r->m->hp.pooling));
        status = 400;
        goto refuse;
    }
    /* a batch of prompts: each tokenized as a prompt of its own */
    k = p.batch ? p.n_batch : 1;
    for (int j = 0; j < k && p.batch; j++) {
        struct textgen_params q = p;
        q.batch = NULL;
        q.prompt = p.batch[j].text;
        q.prompt_ids = p.batch[j].ids;
        q.n_prompt_ids = p.batch[j].n_ids;
        char why[512];
        if ((status = prompt_of(r, &q, &bids[j], &bn[j], &opens_think, why, sizeof why))) {
            snprintf(err, sizeof err, "prompt[%d]: %s", j, why);
            goto refuse;
        }
        total += bn[j];
    }
    if (!p.batch && (status = prompt_of(r, &p, &ids, &n, &opens_think, err, sizeof err)))
        goto refuse;
    if (!p.batch) {
        bids[0] = ids;
        bn[0] = n;
        ids = NULL;
    }
    if (!(t = calloc(1, sizeof *t))) {
        snprintf(err, sizeof err, "out of memory");
        status = 500;
        goto refuse;
    }
    snprintf(t->id, sizeof t->id, "%s", tt->task_id);
    t->text = true;
    t->n_seqs = textgen_seqs(&p);
    t->prompt_total = total;
    for (int i = 0; i < p.n_stop; i++)
        if ((t->stops[t->n_stops] = strdup(p.stop[i])))
            t->n_stops++;
    if (p.force_tool && !p.grammar && (status = tool_grammar(r, &p, &p.grammar, err, sizeof err)))
        goto refuse;
    if (p.grammar) {
        int grc = grammar_for(r, t, p.grammar, err, sizeof err);
        if (grc) {
            if (grc == CAIRN_ENOMEM)
                snprintf(err, sizeof err, "out of memory for the grammar");
            status = cairn_http_status(grc);
            goto refuse;
        }
    }
    /* A constrained output is the content as it is: no think tags are taken out of it. */
    struct text_seq_opts to = {.tok = r->tk, .stops = (const char *const *)p.stop, .n_stops = (size_t)p.n_stop,
                               .reasoning = p.reasoning && r->think.uses_tags && !p.grammar,
                               .reasoning_opts = {.open = r->think.open, .close = r->think.close,
                                                  .start_in_reasoning = opens_think},
                               .tools = json_array_size(p.tools) ? r->tools : TOOLCALL_NONE,
                               .harmony = r->harmony && p.messages && !p.grammar,
                               .id_seed = p.sampling.seed ^ (uint64_t)clock_ns(), .logprobs = p.logprobs};
    for (int i = 0; i < t->n_seqs; i++) {
        to.id_seed += 0x9e3779b97f4a7c15ull; /* each choice its own tool call ids */
        if (text_seq_create(&t->seqs[i], &to, err, sizeof err)) {
            status = 400;
            goto refuse;
        }
    }
    struct logit_bias bias[TEXTGEN_MAX_BIAS];
    for (int i = 0; i < p.n_bias; i++)
        bias[i] = (struct logit_bias){.token = p.bias[i].token, .bias = p.bias[i].bias};
    struct sched_request rqs[TEXTGEN_MAX_N];
    for (int j = 0; j < k; j++) {
        struct sched_request rq = {.prompt = bids[j], .n_prompt = bn[j], .n_seqs = p.n,
                                   .sample = sampling_of(&p.sampling), .ignore_eos = p.ignore_eos,
                                   .logprobs = p.logprobs, .top_logprobs = p.logprobs ? p.top_logprobs : 0};
        rq.sample.bias = bias;
        rq.sample.n_bias = p.n_bias;
        rq.num_draft_tokens = p.num_draft_tokens;
        rq.lookup_ngram = p.prompt_lookup ? 3 : 0; /* n-grams of 3 down to 1, as llama.cpp's lookup */
        rq.grammar = t->gent ? t->gent->c : t->gctx;
        rq.max_tokens = p.max_tokens > 0 && p.max_tokens < r->ctx - bn[j] ? p.max_tokens : r->ctx - bn[j];
        rqs[j] = rq;
    }
    int rc = start_task(r, t, rqs, k, err, sizeof err);
    t = NULL; /* owned by the table, or freed */
    for (int j = 0; j < k; j++) /* sched_submit copied them */
        free(bids[j]);
    k = 0;
    if (rc) {
        status = cairn_http_status(rc);
        goto refuse;
    }
    /* start follows when the scheduler admits it (on_admitted) */
    free(ids);
    textgen_params_clear(&p);
    return;
refuse:
    for (int j = 0; j < k; j++)
        free(bids[j]);
    textgen_params_clear(&p);
refuse_noparams:
    free(ids);
    task_free(t);
    fprintf(stderr, "cairn runner: task %s refused: %s\n", tt->task_id, err);
    refuse_text(r, tt->task_id, status, err);
}

static void release_draft(struct model *m, struct engine *e, struct kv_cache *kv)
{
    kv_release(kv);
    engine_release(e);
    model_release(m);
}

/* Loads the draft at path (NULL or "": drops the draft) and hands it to the scheduler;
 * requests keep running through the switch. On failure the previous draft stays. */
static int set_draft(struct runner *r, const char *path, int k, char *err, size_t errlen)
{
    if (!r->sched)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "this runner does not generate (a pipeline stage)");
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    int rc = 0;
    if (k > SCHED_MAX_DRAFT)
        k = SCHED_MAX_DRAFT;
    if (path && path[0] && k > 0) {
        struct model_load_opts lo = {.layer_begin = 0, .layer_end = -1};
        struct engine_config ec = {.n_threads = r->cfg.threads, .max_batch = r->max_batch, .max_ctx = r->ctx};
        /* One node: the draft runs on the target's threads, in turn with it (a pipeline's
         * or tensor rank 0's target forwards may overlap the draft's: a pool of its own). */
        if (r->e && !r->pipe && !r->tp)
            ec.pool = engine_pool(r->e);
        if ((rc = model_load(&m, path, &lo, err, errlen)) || (rc = vocab_compatible(r->m->file, m->file, err, errlen)) ||
            (rc = engine_create(&e, m, &ec, err, errlen)))
            goto fail;
        struct kv_config kc = engine_kv_config(m, runner_kv_pool_positions(r->ctx), 1, RUNNER_KV_BLOCK_TOKENS);
        kc.max_seqs = r->cfg.slots;
        if ((rc = kv_create(&kv, &kc, err, errlen)))
            goto fail;
    }
    if ((rc = sched_set_draft(r->sched, e, kv, e ? k : 0, err, errlen)))
        goto fail;
    release_draft(r->draft_m, r->draft_e, r->draft_kv);
    r->draft_m = m;
    r->draft_e = e;
    r->draft_kv = kv;
    snprintf(r->draft_path, sizeof r->draft_path, "%s", e ? path : "");
    fprintf(stderr, "cairn runner: draft %s (%d tokens)\n", e ? path : "dropped", k);
    return 0;
fail:
    release_draft(m, e, kv);
    return rc;
}

static void draft_message(struct runner *r, const json_t *body)
{
    const char *path = json_string_value(json_object_get(body, "model_path"));
    json_t *kj = json_object_get(body, "num_draft_tokens");
    int k = json_is_integer(kj) ? (int)json_integer_value(kj) : r->cfg.num_draft_tokens;
    char err[1024];
    if (set_draft(r, path, k, err, sizeof err))
        fprintf(stderr, "cairn runner: draft %s refused: %s\n", path ? path : "(none)", err);
}

static void cancel_task(struct runner *r, const char *task_id)
{
    if (ejob_cancel(r, task_id))
        return;
    struct rtask *t = task_by_id(r, task_id);
    if (t)
        for (int i = t->n_reqs - 1; i >= 0 && task_by_id(r, task_id) == t; i--)
            sched_cancel(r->sched, t->sched_id + (uint64_t)i); /* its done callbacks end it */
}

/* With CAIRN_STEP_LOG=FILE in the environment, the runner appends a line to FILE for
 * every step of its scheduler ("step START_NS END_NS DECODING PROMPT FORWARD_NS": the
 * monotonic clock around sched_step, the sequences that decoded in it, the prompt tokens
 * it carried and its forward's share of it) and every task that arrives ("task NS"): how
 * the steps of a run filled, read by `node bench/serve_load.mjs steps FILE`. One line per
 * write (line buffered). */
static void step_log_line(struct runner *r, const char *fmt, ...)
{
    if (!r->step_log_tried) {
        r->step_log_tried = true;
        const char *path = getenv("CAIRN_STEP_LOG");
        if (path && path[0] && (r->step_log = fopen(path, "a")))
            setvbuf(r->step_log, NULL, _IOLBF, 0);
    }
    if (!r->step_log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->step_log, fmt, ap);
    va_end(ap);
}

/* One scheduler step, the messages it makes sent together at its end. */
static int held_step(struct runner *r, char *err, size_t errlen)
{
    r->hold = true;
    int rc = sched_step(r->sched, err, errlen);
    r->hold = false;
    flush_held(r);
    return rc;
}

/* One scheduler step, logged when CAIRN_STEP_LOG asks (step_log_line). */
static int sched_step_logged(struct runner *r, char *err, size_t errlen)
{
    struct sched_stats a, b;
    if (r->step_log_tried && !r->step_log)
        return held_step(r, err, errlen);
    sched_get_stats(r->sched, &a);
    int64_t t0 = clock_ns();
    int rc = held_step(r, err, errlen);
    int64_t t1 = clock_ns();
    sched_get_stats(r->sched, &b);
    if (b.steps > a.steps)
        step_log_line(r, "step %lld %lld %d %d %lld\n", (long long)t0, (long long)t1, b.last_decoding,
                      b.last_prompt, (long long)b.last_forward_ns);
    return rc;
}

static void handle(struct runner *r, struct runner_msg *m)
{
    switch (m->type) {
    case RUNNER_MSG_TASK:
        step_log_line(r, "task %lld\n", (long long)clock_ns());
        if (task_by_id(r, m->task.task_id) || ejob_by_id(r, m->task.task_id)) {
            send_done(r, m->task.task_id, RUNNER_FINISH_ERROR, 0, "a task with this id is running");
            break;
        }
        if (m->task.params)
            text_task(r, &m->task);
        else
            token_task(r, &m->task);
        break;
    case RUNNER_MSG_CANCEL:
        cancel_task(r, m->task_id);
        break;
    case RUNNER_MSG_DRAFT:
        draft_message(r, m->body);
        break;
    case RUNNER_MSG_SHUTDOWN:
        r->shutdown = true;
        break;
    case RUNNER_MSG_PEERS:
        if (r->cfg.world_size < 2 || r->link.next) {
            fprintf(stderr, "cairn runner: ignored a 'peers' message (%s)\n",
                    r->link.next ? "connected already" : "not pipelined");
            break;
        }
        r->peers = m->peers;
        r->have_peers = true;
        break;
    default:
        fprintf(stderr, "cairn runner: ignored a '%s' message from the node\n", runner_msg_type_name(m->type));
    }
}

/* Reads and handles what the node sent, waiting up to timeout_ms for something. */
static void pump(struct runner *r, int timeout_ms)
{
    struct pollfd p = {.fd = r->sock, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    if (n <= 0)
        return;
    int rc = runner_lines_fill(&r->in, r->sock);
    if (rc == RUNNER_LINES_AGAIN)
        return;
    if (rc == RUNNER_LINES_EOF || rc == CAIRN_EIO)
        node_gone();
    if (rc < 0) {
        fprintf(stderr, "cairn runner: reading from the node: %s\n", cairn_strerror(rc));
        node_gone();
    }
    const char *line;
    size_t len;
    int got;
    while ((got = runner_lines_next(&r->in, &line, &len)) == 1) {
        struct runner_msg m;
        char err[256];
        if (runner_msg_decode(line, len, &m, err, sizeof err))
            fprintf(stderr, "cairn runner: bad message from the node: %s\n", err);
        else
            handle(r, &m);
        runner_msg_clear(&m);
    }
    if (got < 0) {
        fprintf(stderr, "cairn runner: a message line from the node is too long\n");
        node_gone();
    }
}

static int warm_up(struct runner *r, char *err, size_t errlen)
{
    int32_t toks[WARMUP_TOKENS];
    int64_t pos[WARMUP_TOKENS];
    int n = WARMUP_TOKENS < r->m->hp.n_vocab ? WARMUP_TOKENS : r->m->hp.n_vocab;
    if (n > r->ctx)
        n = (int)r->ctx;
    for (int i = 0; i < n; i++) {
        toks[i] = i;
        pos[i] = i;
    }
    float *embd = NULL;
    if (!r->m->first) {
        embd = calloc((size_t)n * (size_t)r->m->hp.n_embd, sizeof *embd);
        if (!embd)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    struct batch b = {.n = n, .token = r->m->first ? toks : NULL, .embd = embd, .seq = r->seqs, .pos = pos};
    int rc = engine_forward(r->e, r->kv, &b, r->out, err, errlen);
    free(embd);
    kv_seq_clear(r->kv, 0);
    return rc;
}

/* Rank 0's target forward in two halves: a micro-batch into the pipeline, and the
 * oldest one's logits back from the last rank. */
static int pipe_submit(void *ctx, struct kv_cache *kv, const struct batch *b, char *err, size_t errlen)
{
    struct runner *r = ctx;
    if (!r->pipe)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "the pipeline is not connected");
    return pipeline_submit(r->pipe, kv, b, err, errlen);
}

/* The same in one call, when one micro-batch is in flight at a time. */
static int pipe_forward(void *ctx, struct kv_cache *kv, const struct batch *b, float *logits, char *err,
                        size_t errlen)
{
    struct runner *r = ctx;
    if (!r->pipe)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "the pipeline is not connected");
    return pipeline_forward(r->pipe, kv, b, logits, err, errlen);
}

static int pipe_collect(void *ctx, float *logits, char *err, size_t errlen)
{
    struct runner *r = ctx;
    if (!r->pipe)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "the pipeline is not connected");
    return pipeline_collect(r->pipe, logits, err, errlen);
}

/* What rank 0 needs back for each wanted row: the last rank samples what only needs a
 * token, so a token instead of a row of logits crosses the network. */
static int pipe_asks(void *ctx, const struct sched_ask *ask, int n, struct sched_token *answer, char *err,
                     size_t errlen)
{
    struct runner *r = ctx;
    if (!r->pipe)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "the pipeline is not connected");
    return pipeline_asks(r->pipe, ask, n, answer, err, errlen);
}

/* Bytes the KV cache holds at most. kv_bytes_for counts every layer's whole pool, but a
 * sliding-window layer keeps only its window of each sequence resident (the cache releases
 * the rest), as the master counts (runner_kv_window_positions). */
static uint64_t kv_resident_bytes(const struct model *m, const struct kv_config *kc, int slots)
{
    uint64_t all = kv_bytes_for(kc);
    if (!all || m->hp.swa_window <= 0)
        return all;
    int64_t kr = dtype_row_bytes(kc->type_k, kc->kv_dim), vr = dtype_row_bytes(kc->type_v, kc->kv_dim);
    if (!runner_kv_window_releasable(kr, vr, (int64_t)sysconf(_SC_PAGESIZE)))
        return all;
    int64_t pool = kc->n_blocks * kc->block_tokens; /* kv_bytes_for checked that this fits */
    int64_t keep = runner_kv_window_positions(pool, m->hp.swa_window, slots);
    for (int il = 0; il < kc->n_layers; il++)
        if (model_layer_swa(&m->hp, m->layer_begin + il))
            all -= (uint64_t)(kr + vr) * (uint64_t)(pool - keep);
    return all;
}

/* Loads the slice and sizes every buffer; err says why not. */
static int load(struct runner *r, char *err, size_t errlen)
{
    struct model_load_opts lo = {.layer_begin = r->cfg.layer_begin, .layer_end = r->cfg.layer_end};
    bool tensor = r->cfg.tensor && r->cfg.world_size > 1;
    if (tensor) { /* a rank loads only its rows of every matrix */
        lo.tp_rank = r->cfg.rank;
        lo.tp_world = r->cfg.world_size;
    }
    int rc = model_load(&r->m, r->cfg.model_path, &lo, err, errlen);
    if (rc)
        return rc;
    const struct model *m = r->m;
    /* what a reader of the log (and the tensor e2e test) compares across placements */
    if (tensor)
        fprintf(stderr, "cairn runner: tensor rank %d of %d holds %llu bytes of weights (its rows of every matrix)\n",
                r->cfg.rank, r->cfg.world_size, (unsigned long long)m->all_weight_bytes);
    else
        fprintf(stderr, "cairn runner: layers %d..%d hold %llu bytes of weights\n", m->layer_begin, m->layer_end,
                (unsigned long long)m->all_weight_bytes);
    r->ctx = r->cfg.ctx ? r->cfg.ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    r->max_batch = r->ctx < RUNNER_MAX_BATCH ? (int)r->ctx : RUNNER_MAX_BATCH;
    struct engine_config ec = {.n_threads = r->cfg.threads, .max_batch = r->max_batch, .max_ctx = r->ctx};
    struct sched_config sc = {.slots = r->cfg.slots, .ctx = r->ctx, .cache_seqs = r->cfg.slots};
    if (tensor) { /* every rank computes its part of each layer */
        if ((rc = tensor_create(&r->tp, r->cfg.rank, r->cfg.world_size, 0, err, errlen)))
            return rc;
        ec.tp = tensor_engine_tp(r->tp);
    }
    /* The KV pool (runner_kv_pool_positions) is shared by the slots; sequences past it
     * are preempted (the master counts the same). */
    int64_t pool = runner_kv_pool_positions(r->ctx);
    struct kv_config kc = engine_kv_config_tp(m, tensor ? r->cfg.world_size : 1, pool, 1, RUNNER_KV_BLOCK_TOKENS);
    kc.max_seqs = sched_kv_seqs(&sc);
    kc.type_k = r->cfg.cache_type_k;
    kc.type_v = r->cfg.cache_type_v;
    int64_t avail = mem_available();
    uint64_t kv_need = kv_resident_bytes(m, &kc, r->cfg.slots);
    if (avail > 0 && kv_need > (uint64_t)avail)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "a KV cache for %lld positions needs %.1f MiB, %.1f MiB available",
                          (long long)pool, (double)kv_need / (1 << 20), (double)avail / (1 << 20));
    if ((rc = engine_create(&r->e, m, &ec, err, errlen)) || (rc = kv_create(&r->kv, &kc, err, errlen)))
        return rc;
    if (m->first && (!tensor || r->cfg.rank == 0)) { /* the whole model, or rank 0: it schedules and samples */
        if (tensor) {
            sc.forward = tensor_forward;
            sc.forward_ctx = r->tp;
        } else if (r->cfg.world_size > 1) {
            /* One micro-batch per stage: with enough sequences every rank computes at once.
             * CAIRN_MICRO_BATCHES (1..SCHED_MAX_LANES) overrides it, for benchmarks. */
            sc.lanes = r->cfg.world_size < SCHED_MAX_LANES ? r->cfg.world_size : SCHED_MAX_LANES;
            const char *mb = getenv("CAIRN_MICRO_BATCHES");
            if (mb && atoi(mb) >= 1 && atoi(mb) <= SCHED_MAX_LANES)
                sc.lanes = atoi(mb);
            sc.forward = pipe_forward;
            sc.submit = pipe_submit;
            sc.collect = pipe_collect;
            sc.asks = pipe_asks;
            sc.forward_ctx = r;
        }
        if (tok_load(&r->tk, m->file, err, errlen)) {
            /* token tasks still work; text tasks are refused */
            fprintf(stderr, "cairn runner: no tokenizer (%s): text tasks will be refused\n", err);
            r->tk = NULL;
        }
        if (r->tk && (rc = chat_create(&r->chat, m->file, r->tk, err, errlen)))
            return rc;
        struct gguf_str tmpl = {0};
        if (gguf_get_str(m->file, "tokenizer.chat_template", &tmpl) == 0 && tmpl.ptr) {
            reasoning_detect(tmpl.ptr, (size_t)tmpl.len, &r->think);
            r->tools = toolcall_detect(tmpl.ptr, (size_t)tmpl.len);
            r->harmony = harmony_detect(tmpl.ptr, (size_t)tmpl.len);
        } else {
            reasoning_detect("", 0, &r->think);
        }
        sc.tok = r->tk;
        struct sched_callbacks cb = {.token = on_token, .done = on_done, .admitted = on_admitted, .ctx = r};
        if ((rc = sched_create(&r->sched, r->e, r->kv, &sc, &cb, err, errlen)))
            return rc;
    }
    size_t out_n = (size_t)m->hp.n_vocab > (size_t)m->hp.n_embd ? (size_t)m->hp.n_vocab : (size_t)m->hp.n_embd;
    r->out = malloc(WARMUP_TOKENS * out_n * sizeof *r->out);
    r->seqs = calloc((size_t)r->max_batch, sizeof *r->seqs);
    if (!r->out || !r->seqs)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    return 0;
}

static void release(struct runner *r)
{
    pipeline_release(r->pipe); /* before the scheduler and the cache it observes */
    r->pipe = NULL;
    tensor_release(r->tp);
    r->tp = NULL;
    sched_release(r->sched); /* cancels what is left: done callbacks while the socket is open */
    r->sched = NULL;
    release_draft(r->draft_m, r->draft_e, r->draft_kv);
    while (r->n_tasks)
        task_drop(r, r->n_tasks - 1);
    for (int i = 0; i < GCACHE_N; i++)
        gcache_clear(&r->gcache[i]);
    grammar_vocab_release(r->gvocab);
    while (r->ejobs) {
        struct ejob *j = r->ejobs;
        r->ejobs = j->next;
        send_done(r, j->id, RUNNER_FINISH_CANCELLED, 0, "the runner is stopping");
        ejob_free(j);
    }
    kv_release(r->embed_kv);
    runner_link_close(&r->link, "the runner is stopping");
    runner_lines_free(&r->in);
    free(r->out);
    free(r->held);
    free(r->seqs);
    chat_release(r->chat);
    tok_release(r->tk);
    kv_release(r->kv);
    engine_release(r->e);
    model_release(r->m);
    if (r->step_log)
        fclose(r->step_log);
    r->step_log = NULL;
}

/* A tensor rank's account of its steps since the last one (tensor_steps_line), appended
 * to the file CAIRN_TENSOR_LOG names, when set: for benchmarks (bench/tensor.sh), after
 * each run of steps. */
static void tensor_log_steps(struct runner *r)
{
    const char *path = getenv("CAIRN_TENSOR_LOG");
    char line[512];
    if (!path || !path[0] || !tensor_steps_line(r->tp, line, sizeof line))
        return;
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    fprintf(f, "%s\n", line);
    fclose(f);
}

/* Runs until asked to shut down (0), or until a pipeline link ends (CAIRN_EIO, why
 * says which and how; rank 0's requests have ended with the error by then). */
static int serve(struct runner *r, char *why, size_t whylen)
{
    char err[512];
    while (!r->shutdown) {
        if (r->tp && !r->sched) { /* a tensor rank > 0: computes with rank 0's steps */
            pump(r, 0);
            int rc = tensor_serve(r->tp, 50, why, whylen);
            if (rc < 0)
                return rc;
            if (rc == 0) /* idle for 50 ms: a run of steps ended */
                tensor_log_steps(r);
            heartbeat_if_due(r);
            continue;
        }
        if (r->pipe && !r->sched) { /* a later stage: only the data plane's frames */
            pump(r, 0);
            int rc = pipeline_serve(r->pipe, 50, why, whylen);
            if (rc < 0)
                return rc;
            heartbeat_if_due(r);
            continue;
        }
        if (r->pipe && !pipeline_alive(r->pipe, why, whylen))
            return CAIRN_EIO;
        if (r->tp && !tensor_alive(r->tp, why, whylen))
            return CAIRN_EIO;
        bool idle = (!r->sched || sched_idle(r->sched)) && !r->ejobs;
        if (idle == r->busy) { /* Running while anything runs, Ready when idle */
            r->busy = !idle;
            send_status(r, r->busy ? CLUSTER_RUNNER_RUNNING : CLUSTER_RUNNER_READY, NULL);
            if (idle && r->tp)
                tensor_log_steps(r);
        }
        if (idle) {
            int64_t left_ms = r->cfg.heartbeat_ms - (clock_ns() - r->last_sent) / 1000000;
            if ((r->pipe || r->tp) && left_ms > 100)
                left_ms = 100; /* notice a dead link while idle */
            pump(r, left_ms > 0 ? (int)left_ms : 0);
        } else {
            pump(r, 0);
            if (!r->shutdown && r->ejobs)
                ejob_step(r); /* one forward of it, then a generation step: both go on */
            if (!r->shutdown && !sched_idle(r->sched) && sched_step_logged(r, err, sizeof err) < 0) {
                fprintf(stderr, "cairn runner: a step failed: %s\n", err);
                if (r->pipe || (r->tp && !tensor_alive(r->tp, NULL, 0))) {
                    snprintf(why, whylen, "%s", err);
                    return CAIRN_EIO;
                }
            }
        }
        heartbeat_if_due(r);
    }
    return 0;
}

/* While connecting: heartbeats and the node's messages; nonzero to give up. */
static int connect_tick(void *ctx)
{
    struct runner *r = ctx;
    pump(r, 0);
    heartbeat_if_due(r);
    return r->shutdown;
}

/* A pipelined runner after warm-up: waits for "peers", then links both ways. */
static int connect_pipeline(struct runner *r, char *err, size_t errlen)
{
    send_status(r, CLUSTER_RUNNER_CONNECTING, NULL);
    while (!r->have_peers && !r->shutdown) {
        pump(r, 100);
        heartbeat_if_due(r);
    }
    if (r->shutdown)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "asked to stop");
    int rc = runner_link_connect(&r->link, &r->cfg, &r->peers, CONNECT_MS, connect_tick, r, err, errlen);
    if (rc)
        return rc;
    if (r->tp) {
        if ((rc = tensor_start(r->tp, r->e, r->kv, r->link.next, r->link.prev, err, errlen)))
            return rc;
        fprintf(stderr, "cairn runner: tensor rank %d of %d linked: next rank %d at %s, previous rank %d from %s\n",
                r->cfg.rank, r->cfg.world_size, dp_peer_rank(r->link.next), dp_peer_addr(r->link.next),
                dp_peer_rank(r->link.prev), dp_peer_addr(r->link.prev));
        return 0;
    }
    struct pipeline_config pc = {.rank = r->cfg.rank, .world_size = r->cfg.world_size, .e = r->e, .kv = r->kv,
                                 .next = r->link.next, .prev = r->link.prev};
    if ((rc = pipeline_create(&r->pipe, &pc, err, errlen)))
        return rc;
    fprintf(stderr, "cairn runner: rank %d of %d linked: next rank %d at %s, previous rank %d from %s\n",
            r->cfg.rank, r->cfg.world_size, dp_peer_rank(r->link.next), dp_peer_addr(r->link.next),
            dp_peer_rank(r->link.prev), dp_peer_addr(r->link.prev));
    return 0;
}

static char *read_stdin(void)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0)
            break;
        if (len == cap && (cap >= ((size_t)1 << 20) || array_reserve(&buf, &cap, len + 1, 1, 0))) {
            free(buf);
            return NULL;
        }
    }
    if (buf)
        buf[len < cap ? len : cap - 1] = 0;
    return buf;
}

int runner_main(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "runner", false};
    struct runner r = {0};
    runner_config_defaults(&r.cfg);
    snprintf(r.cfg.instance_id, sizeof r.cfg.instance_id, "local");
    snprintf(r.cfg.runner_id, sizeof r.cfg.runner_id, "local");
    const char *v, *layers = NULL;
    int64_t sock_fd = RUNNER_FD_SOCK, node_fd = RUNNER_FD_NODE;
    char err[1024];
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--config", &v)) {
            char *text = !strcmp(v, "-") ? read_stdin() : NULL;
            const char *json = !strcmp(v, "-") ? text : v;
            if (!json || runner_config_parse(json, strlen(json), &r.cfg, err, sizeof err)) {
                fprintf(stderr, "cairn runner: --config: %s\n", json ? err : "cannot read stdin");
                free(text);
                return 2;
            }
            free(text);
        } else if (args_opt(&a, "-m|--model", &v)) {
            snprintf(r.cfg.model_path, sizeof r.cfg.model_path, "%s", v);
        } else if (args_opt(&a, "--layers", &v)) {
            layers = v;
        } else if (args_opt(&a, "--ctx", &v)) {
            r.cfg.ctx = args_int(&a, "--ctx", v, 1, 1 << 24);
        } else if (args_opt(&a, "-ctk|--cache-type-k", &v)) {
            if ((r.cfg.cache_type_k = kv_type_arg("-ctk", v)) < 0)
                return 2;
        } else if (args_opt(&a, "-ctv|--cache-type-v", &v)) {
            if ((r.cfg.cache_type_v = kv_type_arg("-ctv", v)) < 0)
                return 2;
        } else if (args_opt(&a, "--slots", &v)) {
            r.cfg.slots = (int)args_int(&a, "--slots", v, 1, 256);
        } else if (args_opt(&a, "-t|--threads", &v)) {
            r.cfg.threads = (int)args_int(&a, "--threads", v, 1, 512);
        } else if (args_opt(&a, "--heartbeat-ms", &v)) {
            r.cfg.heartbeat_ms = (int)args_int(&a, "--heartbeat-ms", v, 10, 600000);
        } else if (args_opt(&a, "--instance", &v)) {
            snprintf(r.cfg.instance_id, sizeof r.cfg.instance_id, "%s", v);
        } else if (args_opt(&a, "--runner", &v)) {
            snprintf(r.cfg.runner_id, sizeof r.cfg.runner_id, "%s", v);
        } else if (args_opt(&a, "--sock-fd", &v)) {
            sock_fd = args_int(&a, "--sock-fd", v, 0, 1 << 20);
        } else if (args_opt(&a, "--node-fd", &v)) {
            node_fd = args_int(&a, "--node-fd", v, -1, 1 << 20);
        } else if (args_opt(&a, "-h|--help", NULL)) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "cairn runner: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (layers) {
        int b, e, used = 0;
        if (sscanf(layers, "%d:%d%n", &b, &e, &used) != 2 || layers[used] || b < 0 || e <= b) {
            fprintf(stderr, "cairn runner: --layers wants BEGIN:END with 0 <= BEGIN < END\n");
            return 2;
        }
        r.cfg.layer_begin = b;
        r.cfg.layer_end = e;
    }
    if (!r.cfg.model_path[0] || !ids_valid_id(r.cfg.instance_id) || !ids_valid_id(r.cfg.runner_id)) {
        fprintf(stderr, "cairn runner: a model path (--config or -m) and valid ids are required\n");
        usage();
        return 2;
    }
    r.sock = (int)sock_fd;
    if (fcntl(r.sock, F_GETFD) < 0) {
        fprintf(stderr, "cairn runner: no socket on fd %d (cairn node starts runners)\n", r.sock);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (node_fd >= 0) {
        if (fcntl((int)node_fd, F_GETFD) < 0) {
            fprintf(stderr, "cairn runner: no node pipe on fd %d\n", (int)node_fd);
            return 2;
        }
        int e = thread_start_detached(watch_node, (void *)(intptr_t)node_fd, 256 * 1024);
        if (e) {
            fprintf(stderr, "cairn runner: cannot watch the node: %s\n", strerror(e));
            return 1;
        }
    }

    bool piped = r.cfg.world_size > 1;
    int rc = piped ? runner_link_listen(&r.link, r.cfg.data_bind, err, sizeof err) : 0;
    send_status(&r, CLUSTER_RUNNER_IDLE, NULL);
    if (!piped)
        send_status(&r, CLUSTER_RUNNER_CONNECTING, NULL); /* one runner per instance: no peers to reach */
    if (!rc) {
        send_status(&r, CLUSTER_RUNNER_LOADING, NULL);
        rc = load(&r, err, sizeof err);
    }
    if (!rc) {
        send_status(&r, CLUSTER_RUNNER_WARMING_UP, NULL);
        /* A tensor rank's forward needs the others: its first step warms it. */
        rc = r.tp ? 0 : warm_up(&r, err, sizeof err);
    }
    if (!rc && piped)
        rc = connect_pipeline(&r, err, sizeof err);
    if (rc && r.shutdown) { /* asked to stop before it was ready */
        send_status(&r, CLUSTER_RUNNER_SHUTTING_DOWN, NULL);
        release(&r);
        send_status(&r, CLUSTER_RUNNER_SHUTDOWN, NULL);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "cairn runner: %s: %s\n", r.cfg.model_path, err);
        char why[RUNNER_PATH_MAX + 1100];
        snprintf(why, sizeof why, "%s: %s", r.cfg.model_path, err);
        send_status(&r, CLUSTER_RUNNER_FAILED, why);
        release(&r);
        return 1;
    }
    if (r.cfg.draft_model_path[0] && r.cfg.num_draft_tokens > 0 &&
        set_draft(&r, r.cfg.draft_model_path, r.cfg.num_draft_tokens, err, sizeof err))
        fprintf(stderr, "cairn runner: serving without the draft %s: %s\n", r.cfg.draft_model_path, err);
    send_status(&r, CLUSTER_RUNNER_READY, NULL);
    if ((rc = serve(&r, err, sizeof err))) {
        fprintf(stderr, "cairn runner: the pipeline broke: %s\n", err);
        char why[1100];
        snprintf(why, sizeof why, "pipeline rank %d of %d: %s", r.cfg.rank, r.cfg.world_size, err);
        send_status(&r, CLUSTER_RUNNER_FAILED, why);
        pipeline_release(r.pipe);
        r.pipe = NULL;
        tensor_release(r.tp);
        r.tp = NULL;
        runner_link_close(&r.link, why); /* the other ranks learn why */
        release(&r);
        return 1;
    }
    send_status(&r, CLUSTER_RUNNER_SHUTTING_DOWN, NULL);
    release(&r);
    send_status(&r, CLUSTER_RUNNER_SHUTDOWN, NULL);
    return 0;
}
