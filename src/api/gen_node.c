/* The node's generation backend (gen_node.h). */
#include "api/gen_node.h"

#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "ctl/command.h"
#include "proto/ids.h"
#include "gguf/gguf.h"
#include "api/apiutil.h"
#include "api/gen_pull.h"
#include "node/hubref.h"
#include "node/taskbody.h"
#include "proto/taskmsg.h"

/* ---- figures for /metrics ---- */

#define HIST_BUCKETS 14
static const double hist_bounds[HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                                  0.25, 0.5, 1, 2.5, 5, 10, 30};

struct hist {
    uint64_t counts[HIST_BUCKETS + 1]; /* the last one: above every bound */
    uint64_t n;
    double sum;
};

static void hist_add(struct hist *h, double seconds)
{
    int b = 0;
    while (b < HIST_BUCKETS && seconds > hist_bounds[b])
        b++;
    h->counts[b]++;
    h->n++;
    h->sum += seconds;
}

struct figures {
    uint64_t requests, ok, failed, cancelled, refused;
    uint64_t prompt_tokens, completion_tokens, cached_tokens, draft_tokens, accepted_draft_tokens;
    struct hist ttft, itl, duration;
};

/* ---- requests ---- */

struct req {
    uint64_t handle;
    char task_id[IDS_ID_MAX + 1], instance_id[IDS_ID_MAX + 1];
    gen_event_fn fn;
    void *ctx;
    int n_seqs, seqs_done;
    int n_embed;               /* an embedding task's inputs; 0 for generation */
    char request_id[64];       /* the API's id of it, for op_stop */
    bool user_stop;            /* op_stop ended it: "cancelled" reads as "stop" */
    bool started, any_token;
    struct gen_usage total;
    int64_t submitted_ns, last_token_ns[TEXTGEN_MAX_N];
    int64_t missing_since_ms; /* task not in the state since; 0 = seen */
    char runs_on[IDS_ID_MAX + 1]; /* node of the instance's first rank: only its lines count */
    int64_t unlinked_since_ms;    /* no link to runs_on since; 0 = linked (or this node) */
};

/* The latest figures a runner sent with its start and seq_done lines. */
struct runner_figures {
    char instance_id[IDS_ID_MAX + 1];
    struct task_stats s; /* pipeline members 0 unless rank 0 of a pipeline */
    /* what this node's requests that ended on the instance generated and drafted */
    int64_t completion_tokens, draft_tokens, accepted_draft_tokens;
};

#define MAX_FIGURES 64

struct gen_node {
    struct node *node;
    struct runner_figures runners[MAX_FIGURES];
    int n_runners;
    pthread_mutex_t mu; /* requests, figures; held while delivering events */
    pthread_mutex_t place_mu; /* one on-demand placement at a time */
    struct req **live;
    size_t n_live, cap_live;
    uint64_t next_handle;
    struct figures fig;
    /* task ids to cancel, sent by the thread */
    char (*cancels)[IDS_ID_MAX + 1];
    size_t n_cancels, cap_cancels;
    pthread_cond_t cv;
    pthread_t thread;
    bool stop;
};

static int64_t mono_ms(void) { return clock_ns() / 1000000; }

static struct req *find_task(struct gen_node *g, const char *task_id, size_t *at)
{
    for (size_t i = 0; i < g->n_live; i++)
        if (!strcmp(g->live[i]->task_id, task_id)) {
            if (at)
                *at = i;
            return g->live[i];
        }
    return NULL;
}

static void remove_at(struct gen_node *g, size_t i)
{
    free(g->live[i]);
    g->live[i] = g->live[--g->n_live];
}

/* Delivers the final ERROR of r (under mu) and drops it. */
static void fail_req(struct gen_node *g, size_t at, int status, const char *message)
{
    struct req *r = g->live[at];
    struct gen_event ev = {.kind = GEN_EVENT_ERROR, .status = status, .message = message};
    r->fn(r->ctx, &ev);
    g->fig.failed++;
    remove_at(g, at);
}

/* ---- output lines from the runners ---- */

static void on_start(struct gen_node *g, size_t at, const struct task_msg *m)
{
    struct req *r = g->live[at];
    if (m->error) {
        fail_req(g, at, m->status, m->error);
        return;
    }
    r->started = true;
    r->total.prompt_tokens = m->prompt_tokens;
    r->total.cached_tokens = m->cached_tokens; /* known at admission */
    g->fig.prompt_tokens += (uint64_t)r->total.prompt_tokens;
    struct gen_event ev = {.kind = GEN_EVENT_START, .usage = r->total};
    r->fn(r->ctx, &ev);
}

/* Whether the line's seq (already within RUNNER_MAX_SEQS) is one of r's sequences: it
 * indexes the request's arrays, so a line for another is refused. */
static bool seq_ok(const struct req *r, const struct task_msg *m)
{
    if (m->seq < r->n_seqs)
        return true;
    log_warn("gen: task %s: a %s line for sequence %d of %d was refused", r->task_id, runner_msg_type_name(m->type),
             m->seq, r->n_seqs);
    return false;
}

static void on_output(struct gen_node *g, struct req *r, const struct task_msg *m)
{
    if (!seq_ok(r, m))
        return;
    int seq = m->seq;
    int64_t now = clock_ns();
    if (!r->any_token)
        hist_add(&g->fig.ttft, (double)(now - r->submitted_ns) / 1e9);
    else if (r->last_token_ns[seq])
        hist_add(&g->fig.itl, (double)(now - r->last_token_ns[seq]) / 1e9);
    r->any_token = true;
    r->last_token_ns[seq] = now;
    struct gen_event ev = {.kind = GEN_EVENT_DELTA, .seq = seq, .content = m->content, .reasoning = m->reasoning,
                           .logprobs = m->logprobs};
    r->fn(r->ctx, &ev);
}

static void on_seq_done(struct req *r, const struct task_msg *m)
{
    if (!seq_ok(r, m))
        return;
    struct gen_usage u = {.completion_tokens = m->completion_tokens, .draft_tokens = m->draft_tokens,
                          .accepted_draft_tokens = m->accepted_draft_tokens, .prompt_ms = m->prompt_ms,
                          .predicted_ms = m->predicted_ms};
    r->total.prompt_ms = u.prompt_ms > r->total.prompt_ms ? u.prompt_ms : r->total.prompt_ms;
    r->total.predicted_ms = u.predicted_ms > r->total.predicted_ms ? u.predicted_ms : r->total.predicted_ms;
    r->total.completion_tokens += u.completion_tokens;
    r->total.draft_tokens += u.draft_tokens;
    r->total.accepted_draft_tokens += u.accepted_draft_tokens;
    bool stopped = r->user_stop && m->seq_finish == TASK_SEQ_CANCELLED;
    struct gen_event ev = {.kind = GEN_EVENT_SEQ_DONE, .seq = m->seq,
                           .finish = stopped ? "stop" : task_seq_finish_name(m->seq_finish),
                           .stop_sequence = m->stop_sequence, .tool_calls = m->tool_calls, .usage = u};
    r->fn(r->ctx, &ev);
    r->seqs_done++;
}

/* The figures of an instance, made when new (the last slot is reused when all are taken;
 * under mu). */
static struct runner_figures *figures_of(struct gen_node *g, const char *instance_id)
{
    for (int i = 0; i < g->n_runners; i++)
        if (!strcmp(g->runners[i].instance_id, instance_id))
            return &g->runners[i];
    struct runner_figures *f = &g->runners[g->n_runners < MAX_FIGURES ? g->n_runners++ : MAX_FIGURES - 1];
    memset(f, 0, sizeof *f);
    snprintf(f->instance_id, sizeof f->instance_id, "%s", instance_id);
    return f;
}

static void on_done(struct gen_node *g, size_t at, const struct task_msg *m)
{
    struct req *r = g->live[at];
    bool stopped = r->user_stop && m->finish == RUNNER_FINISH_CANCELLED;
    const char *finish = stopped ? "stop" : runner_finish_name(m->finish);
    const char *error = m->error;
    if (m->finish == RUNNER_FINISH_ERROR) {
        fail_req(g, at, r->started ? 500 : 503, error ? error : "the runner failed");
        return;
    }
    if (!r->started) { /* cancelled or stopped before it began */
        fail_req(g, at, 503, error ? error : "the request ended before it started");
        return;
    }
    /* Sequences the runner did not finish one by one (cancelled as a whole). */
    for (int s = r->seqs_done; s < r->n_seqs; s++) {
        struct gen_event ev = {.kind = GEN_EVENT_SEQ_DONE, .seq = s, .finish = finish};
        r->fn(r->ctx, &ev);
    }
    g->fig.completion_tokens += (uint64_t)r->total.completion_tokens;
    g->fig.cached_tokens += (uint64_t)r->total.cached_tokens;
    g->fig.draft_tokens += (uint64_t)r->total.draft_tokens;
    g->fig.accepted_draft_tokens += (uint64_t)r->total.accepted_draft_tokens;
    struct runner_figures *rf = figures_of(g, r->instance_id);
    rf->completion_tokens += r->total.completion_tokens;
    rf->draft_tokens += r->total.draft_tokens;
    rf->accepted_draft_tokens += r->total.accepted_draft_tokens;
    hist_add(&g->fig.duration, (double)(clock_ns() - r->submitted_ns) / 1e9);
    if (m->finish == RUNNER_FINISH_CANCELLED && !stopped)
        g->fig.cancelled++;
    else
        g->fig.ok++;
    struct gen_event ev = {.kind = GEN_EVENT_END, .usage = r->total};
    r->fn(r->ctx, &ev);
    remove_at(g, at);
}

static void on_embedding(struct req *r, const struct task_msg *m)
{
    if (m->index >= r->n_embed) {
        log_warn("gen: task %s: an embedding line for input %d of %d was refused", r->task_id, m->index, r->n_embed);
        return;
    }
    float *v = malloc((size_t)m->dim * sizeof *v);
    char err[128];
    if (!v || task_embedding_decode(m, v, err, sizeof err)) {
        log_warn("gen: task %s: an embedding line was refused: %s", r->task_id, v ? err : "out of memory");
        free(v);
        return;
    }
    struct gen_event ev = {.kind = GEN_EVENT_EMBEDDING, .index = m->index, .dim = m->dim, .embedding = v,
                           .embedding_b64 = m->embedding, .usage = {.prompt_tokens = m->prompt_tokens}};
    r->fn(r->ctx, &ev);
    free(v);
}

/* Keeps the stats member of a runner line by instance (under mu). */
static void keep_stats(struct gen_node *g, const char *instance_id, const struct task_msg *m)
{
    if (m->has_stats)
        figures_of(g, instance_id)->s = m->stats;
}

static void on_line(void *ctx, const char *from, const char *line, size_t len)
{
    struct gen_node *g = ctx;
    struct task_msg m;
    char err[256];
    if (task_msg_decode(line, len, &m, err, sizeof err)) {
        log_warn("gen: a task line from node %.64s was refused: %s", from, err);
        return;
    }
    pthread_mutex_lock(&g->mu);
    size_t at;
    struct req *r = find_task(g, m.task_id, &at);
    if (r && strcmp(from, r->runs_on)) {
        /* Only the node that runs the task's first rank speaks for it: another peer
         * could otherwise write into someone else's answer. */
        log_warn("gen: task %s: an output line from node %.64s, which does not run it (%s does), was refused",
                 m.task_id, from, r->runs_on);
    } else if (r) {
        keep_stats(g, r->instance_id, &m);
        if (m.type == RUNNER_MSG_START)
            on_start(g, at, &m);
        else if (m.type == RUNNER_MSG_OUTPUT && r->started)
            on_output(g, r, &m);
        else if (m.type == RUNNER_MSG_SEQ_DONE && r->started)
            on_seq_done(r, &m);
        else if (m.type == RUNNER_MSG_EMBEDDING && r->started)
            on_embedding(r, &m);
        else if (m.type == RUNNER_MSG_DONE)
            on_done(g, at, &m);
    }
    pthread_mutex_unlock(&g->mu);
    task_msg_clear(&m);
}

/* ---- instances ---- */

/* Model ids as clients write them: Ollama's clients add ":latest". */
static bool model_matches(const char *instance_model, const char *asked)
{
    if (!strcmp(instance_model, asked))
        return true;
    size_t n = strlen(instance_model);
    return !strncmp(instance_model, asked, n) && !strcmp(asked + n, ":latest");
}

struct pick {
    struct gen_node *g;
    const char *model;
    char instance_id[IDS_ID_MAX + 1]; /* ready one, "" none */
    char runs_on[IDS_ID_MAX + 1];     /* the node of its first rank */
    char model_id[IDS_MODEL_MAX + 1]; /* the id as the cluster writes it */
    bool any;                         /* an instance of the model exists (maybe loading) */
    char failure[512];                /* a Failed runner's reason */
};

static bool runner_ready(const struct cluster_state *s, const char *runner_id)
{
    const struct cluster_runner *r = cluster_state_find_runner(s, runner_id);
    return r && (r->status == CLUSTER_RUNNER_READY || r->status == CLUSTER_RUNNER_RUNNING);
}

static bool instance_ready(const struct cluster_state *s, const struct cluster_instance *in)
{
    for (size_t k = 0; k < in->n_shards; k++)
        if (!runner_ready(s, in->shards[k].runner_id))
            return false;
    return in->n_shards > 0;
}

/* Under the node's lock: the ready instance of the model with the fewest of our
 * requests (g->mu is held by the caller around node_read_state). */
static void pick_instance(void *ctx, const struct cluster_state *s)
{
    struct pick *p = ctx;
    size_t best_load = SIZE_MAX;
    for (size_t i = 0; i < s->n_instances; i++) {
        const struct cluster_instance *in = &s->instances[i];
        if (!model_matches(in->model_id, p->model))
            continue;
        p->any = true;
        snprintf(p->model_id, sizeof p->model_id, "%s", in->model_id);
        for (size_t k = 0; k < in->n_shards; k++) {
            const struct cluster_runner *r = cluster_state_find_runner(s, in->shards[k].runner_id);
            if (r && r->status == CLUSTER_RUNNER_FAILED && r->error)
                snprintf(p->failure, sizeof p->failure, "%s", r->error);
        }
        if (!instance_ready(s, in))
            continue;
        size_t load = 0;
        for (size_t k = 0; k < p->g->n_live; k++)
            load += !strcmp(p->g->live[k]->instance_id, in->id);
        if (load < best_load) {
            best_load = load;
            snprintf(p->instance_id, sizeof p->instance_id, "%s", in->id);
            snprintf(p->runs_on, sizeof p->runs_on, "%s", in->shards[0].node_id);
        }
    }
}

static void find_ready(struct gen_node *g, struct pick *p)
{
    p->instance_id[0] = p->failure[0] = p->runs_on[0] = 0;
    p->any = false;
    pthread_mutex_lock(&g->mu);
    node_read_state(g->node, pick_instance, p);
    pthread_mutex_unlock(&g->mu);
}

/* The catalog id of a model the cluster has (":latest" allowed), "" when none. */
static void catalog_id(struct gen_node *g, const char *asked, char *id, size_t idlen)
{
    id[0] = 0;
    json_t *models = node_models_json(g->node);
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m) {
        const char *mid = json_string_value(json_object_get(m, "id"));
        json_t *nodes = json_object_get(m, "nodes");
        if (mid && model_matches(mid, asked) && json_array_size(nodes) > 0) {
            snprintf(id, idlen, "%s", mid);
            break;
        }
    }
    json_decref(models);
}

/* A ready instance of p->model into p->instance_id, placing one when the cluster has the
 * model but no instance. 0, or the HTTP status with the reason in err. */
static int ready_instance(struct gen_node *g, struct pick *p, char *err, size_t errlen)
{
    find_ready(g, p);
    if (p->instance_id[0])
        return 0;
    /* One placement at a time: requests that arrive together for a model not placed yet
     * must not each place an instance. */
    pthread_mutex_lock(&g->place_mu);
    if (!p->any)
        find_ready(g, p);
    if (!p->any) {
        char id[IDS_MODEL_MAX + 1];
        catalog_id(g, p->model, id, sizeof id);
        if (!id[0]) {
            pthread_mutex_unlock(&g->place_mu);
            apiutil_missing_model(p->model, err, errlen);
            return 404;
        }
        struct command c;
        struct command_result res;
        command_init(&c, COMMAND_PLACE_INSTANCE);
        snprintf(c.place_instance.model_id, sizeof c.place_instance.model_id, "%s", id);
        c.place_instance.sharding = CLUSTER_SHARDING_PIPELINE;
        c.place_instance.min_nodes = 1;
        c.place_instance.num_draft_tokens = COMMAND_DEFAULT_DRAFT_TOKENS;
        c.place_instance.kv = *node_place_kv(g->node);
        int rc = node_command(g->node, &c, GEN_NODE_COMMAND_MS, &res);
        command_clear(&c);
        if (rc) {
            pthread_mutex_unlock(&g->place_mu);
            snprintf(err, errlen, "model '%s' cannot be placed: %s", p->model, res.message);
            return rc == CAIRN_EFULL ? 503 : cairn_http_status(rc) == 500 ? 503 : cairn_http_status(rc);
        }
        log_info("gen: placed model %s on demand (instance %s)", id, res.instance_id);
    }
    pthread_mutex_unlock(&g->place_mu);
    int64_t deadline = mono_ms() + GEN_NODE_READY_WAIT_MS;
    while (mono_ms() < deadline) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        find_ready(g, p);
        if (p->instance_id[0])
            return 0;
        if (!p->any) {
            snprintf(err, errlen, "the instance of model '%s' went away while loading%s%s", p->model,
                     p->failure[0] ? ": " : "", p->failure);
            return 503;
        }
    }
    snprintf(err, errlen, "no instance of model '%s' became ready in time%s%s", p->model, p->failure[0] ? ": " : "",
             p->failure);
    return 503;
}

/* ---- ops ---- */

static int op_submit(void *self, struct textgen_params *p, gen_event_fn fn, void *ctx, uint64_t *handle, char *err,
                     size_t errlen)
{
    struct gen_node *g = self;
    char canon[HUBREF_TEXT_MAX];
    if (hubref_canonical(p->model, canon) && strlen(canon) < sizeof p->model) /* as typed: owner/repo:q4_k_m */
        memcpy(p->model, canon, strlen(canon) + 1);
    struct pick pk = {.g = g, .model = p->model};
    int status = 0;
    struct command c;
    command_init(&c, COMMAND_TEXT_GENERATION);
    char *body = NULL;
    size_t body_len = 0;
    struct req *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        status = 500;
        goto out;
    }
    if ((status = ready_instance(g, &pk, err, errlen)))
        goto out;
    char why[256];
    if (ids_random(r->task_id, why, sizeof why)) {
        snprintf(err, errlen, "%s", why);
        status = 500;
        goto out;
    }
    snprintf(p->model, sizeof p->model, "%s", pk.model_id);
    snprintf(r->instance_id, sizeof r->instance_id, "%s", pk.instance_id);
    snprintf(r->runs_on, sizeof r->runs_on, "%s", pk.runs_on);
    r->fn = fn;
    r->ctx = ctx;
    r->n_seqs = p->embed ? 0 : textgen_seqs(p);
    r->n_embed = p->n_embed;
    snprintf(r->request_id, sizeof r->request_id, "%s", p->request_id);
    r->submitted_ns = clock_ns();
    json_t *params = textgen_params_to_json(p);
    if (!params) {
        snprintf(err, errlen, "out of memory");
        status = 500;
        goto out;
    }
    /* The body goes straight to the node of the first rank, never through the master's
     * log (node/taskbody.h); the command carries its size only. */
    int brc = taskbody_encode(r->task_id, params, &body, &body_len, &c.text_generation.bytes, err, errlen);
    json_decref(params);
    if (brc) {
        status = brc == CAIRN_ERANGE ? 413 : 500;
        goto out;
    }
    snprintf(c.text_generation.task_id, sizeof c.text_generation.task_id, "%s", r->task_id);
    snprintf(c.text_generation.instance_id, sizeof c.text_generation.instance_id, "%s", r->instance_id);
    snprintf(c.text_generation.node_id, sizeof c.text_generation.node_id, "%s", node_id(g->node));

    /* Registered before the command: the runner's first line may come before its result. */
    pthread_mutex_lock(&g->mu);
    g->fig.requests++;
    if (g->n_live >= GEN_NODE_MAX_LIVE || (g->n_live == g->cap_live && !(g->cap_live < SIZE_MAX / 2))) {
        g->fig.refused++;
        pthread_mutex_unlock(&g->mu);
        snprintf(err, errlen, "this node has %d requests in flight", GEN_NODE_MAX_LIVE);
        status = 503;
        goto out;
    }
    if (array_reserve(&g->live, &g->cap_live, g->n_live + 1, sizeof *g->live, 16)) {
        pthread_mutex_unlock(&g->mu);
        snprintf(err, errlen, "out of memory");
        status = 500;
        goto out;
    }
    r->handle = ++g->next_handle;
    *handle = r->handle;
    g->live[g->n_live++] = r;
    if (g->n_live == 1)
        pthread_cond_signal(&g->cv); /* the watcher sleeps while nothing is live */
    pthread_mutex_unlock(&g->mu);

    struct command_result res;
    int rc = node_send_task_body(g->node, r->runs_on, body, body_len);
    if (rc)
        snprintf(res.message, sizeof res.message, "the request cannot be sent to node %s: %s", r->runs_on,
                 cairn_strerror(rc));
    else
        rc = node_command(g->node, &c, GEN_NODE_COMMAND_MS, &res);
    if (rc) {
        pthread_mutex_lock(&g->mu);
        size_t at;
        bool still = find_task(g, r->task_id, &at) != NULL;
        if (still) {
            g->fig.refused++;
            remove_at(g, at);
        }
        pthread_mutex_unlock(&g->mu);
        if (!still) /* it already ended (an ERROR was delivered): report success */
            goto ok;
        snprintf(err, errlen, "%s", res.message);
        status = rc == CAIRN_EIO ? 503 : cairn_http_status(rc);
        r = NULL;
        goto out;
    }
ok:
    r = NULL;
out:
    free(r);
    free(body);
    command_clear(&c);
    textgen_params_clear(p);
    return status;
}

static void op_cancel(void *self, uint64_t handle)
{
    struct gen_node *g = self;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->n_live; i++) {
        if (g->live[i]->handle != handle)
            continue;
        if (!array_reserve(&g->cancels, &g->cap_cancels, g->n_cancels + 1, sizeof *g->cancels, 16))
            memcpy(g->cancels[g->n_cancels++], g->live[i]->task_id, sizeof g->cancels[0]);
        g->fig.cancelled++;
        remove_at(g, i);
        pthread_cond_signal(&g->cv);
        break;
    }
    pthread_mutex_unlock(&g->mu);
}

static void send_cancel(struct gen_node *g, const char *task_id);

static int op_stop(void *self, const char *request_id, char *err, size_t errlen)
{
    struct gen_node *g = self;
    char task_id[IDS_ID_MAX + 1] = "";
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; request_id[0] && i < g->n_live; i++)
        if (!strcmp(g->live[i]->request_id, request_id)) {
            g->live[i]->user_stop = true;
            memcpy(task_id, g->live[i]->task_id, sizeof task_id);
            break;
        }
    pthread_mutex_unlock(&g->mu);
    if (!task_id[0]) {
        snprintf(err, errlen, "no request '%.64s' is running on this node", request_id);
        return 404;
    }
    send_cancel(g, task_id); /* the runner ends it; its lines end the request */
    return 0;
}

struct models_ctx {
    json_t *models;
};

static void mark_ready(void *ctx, const struct cluster_state *s)
{
    struct models_ctx *m = ctx;
    size_t i;
    json_t *card;
    json_array_foreach(m->models, i, card) {
        const char *id = json_string_value(json_object_get(card, "id"));
        bool ready = false;
        for (size_t k = 0; id && k < s->n_instances && !ready; k++)
            ready = !strcmp(s->instances[k].model_id, id) && instance_ready(s, &s->instances[k]);
        json_object_set_new(card, "ready", json_boolean(ready));
    }
}

/* The chat template of a model whose file this node has, as JSON text or null. */
static json_t *chat_template_of(struct gen_node *g, const char *model_id)
{
    struct catalog_card card;
    char err[256];
    json_t *out = NULL;
    struct gguf_file *f = NULL;
    struct gguf_str t = {0};
    if (node_card(g->node, model_id, &card, err, sizeof err) == 0 && card.path && card.chat_template &&
        gguf_open(&f, card.path, err, sizeof err) == 0 && gguf_get_str(f, "tokenizer.chat_template", &t) == 0)
        out = json_stringn(t.ptr, (size_t)t.len);
    gguf_close(f);
    catalog_card_clear(&card);
    return out ? out : json_null();
}

static json_t *op_models(void *self)
{
    struct gen_node *g = self;
    struct models_ctx m = {.models = node_models_json(g->node)};
    if (m.models)
        node_read_state(g->node, mark_ready, &m);
    size_t i;
    json_t *card;
    json_array_foreach(m.models, i, card) {
        const char *id = json_string_value(json_object_get(card, "id"));
        json_object_set_new(card, "chat_template", id ? chat_template_of(g, id) : json_null());
    }
    return m.models;
}

static int op_pull(void *self, const char *ref, const atomic_bool *cancel, hub_progress_fn fn, gen_pull_done_fn done,
                   void *ctx, char *err, size_t errlen)
{
    struct gen_node *g = self;
    return gen_pull_start(g->node, ref, cancel, fn, done, ctx, err, errlen);
}

static int op_remove(void *self, const char *model, char *err, size_t errlen)
{
    struct gen_node *g = self;
    return gen_pull_remove(g->node, model, err, errlen);
}

static const struct gen_ops node_ops = {.submit = op_submit, .cancel = op_cancel, .stop = op_stop, .models = op_models,
                                        .pull = op_pull, .remove = op_remove};

struct gen gen_node_gen(struct gen_node *g) { return (struct gen){.ops = &node_ops, .self = g}; }

/* ---- the watch thread: cancels, lost tasks ---- */

struct watch {
    struct gen_node *g;
    int64_t now;
};

/* Under the node's lock and g->mu: ends requests whose task failed or vanished. */
static void check_tasks(void *ctx, const struct cluster_state *s)
{
    struct watch *w = ctx;
    struct gen_node *g = w->g;
    for (size_t i = 0; i < g->n_live;) {
        struct req *r = g->live[i];
        const struct cluster_task *t = cluster_state_find_task(s, r->task_id);
        char why[600];
        if (t && t->status == CLUSTER_TASK_FAILED) {
            snprintf(why, sizeof why, "the task failed: %s", t->error ? t->error : "no reason given");
            fail_req(g, i, 503, why);
            continue;
        }
        if (t && !cluster_state_find_instance(s, t->instance_id)) {
            fail_req(g, i, 503, "the instance serving this request was deleted");
            continue;
        }
        const struct cluster_instance *in = t ? cluster_state_find_instance(s, t->instance_id) : NULL;
        if (in && in->n_shards)
            snprintf(r->runs_on, sizeof r->runs_on, "%s", in->shards[0].node_id);
        if (t) {
            r->missing_since_ms = 0;
        } else if (!r->missing_since_ms) {
            r->missing_since_ms = w->now;
        } else if (w->now - r->missing_since_ms > GEN_NODE_LOST_MS) {
            fail_req(g, i, 503, "the task was lost (its runner or node went away)");
            continue;
        }
        i++;
    }
}

/* Under g->mu (not the node's lock): ends requests whose task runs on a node this node
 * has lost its link to. */
static void check_links(struct gen_node *g, int64_t now)
{
    char addr[256];
    for (size_t i = 0; i < g->n_live;) {
        struct req *r = g->live[i];
        if (!r->runs_on[0] || !strcmp(r->runs_on, node_id(g->node)) ||
            node_peer_addr(g->node, r->runs_on, addr, sizeof addr)) {
            r->unlinked_since_ms = 0;
        } else if (!r->unlinked_since_ms) {
            r->unlinked_since_ms = now;
        } else if (now - r->unlinked_since_ms > GEN_NODE_UNLINKED_MS) {
            char why[300];
            snprintf(why, sizeof why, "lost the link to node %s, which runs this request", r->runs_on);
            fail_req(g, i, 503, why);
            continue;
        }
        i++;
    }
}

static void send_cancel(struct gen_node *g, const char *task_id)
{
    struct command c;
    struct command_result res;
    command_init(&c, COMMAND_CANCEL_TASK);
    snprintf(c.cancel_task.task_id, sizeof c.cancel_task.task_id, "%s", task_id);
    int rc = node_command(g->node, &c, GEN_NODE_COMMAND_MS, &res);
    if (rc && rc != CAIRN_ENOTFOUND)
        log_warn("gen: cancelling task %s: %s", task_id, res.message);
    command_clear(&c);
}

static void *watch_main(void *arg)
{
    struct gen_node *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        while (g->n_cancels && !g->stop) {
            char id[IDS_ID_MAX + 1];
            memcpy(id, g->cancels[--g->n_cancels], sizeof id);
            pthread_mutex_unlock(&g->mu);
            send_cancel(g, id);
            pthread_mutex_lock(&g->mu);
        }
        struct watch w = {.g = g, .now = mono_ms()};
        node_read_state(g->node, check_tasks, &w);
        check_links(g, w.now);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)GEN_NODE_CHECK_MS * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        if (!g->stop && !g->n_cancels && !g->n_live)
            pthread_cond_wait(&g->cv, &g->mu); /* nothing to watch until a request comes */
        else if (!g->stop && !g->n_cancels)
            pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int gen_node_create(struct gen_node **out, struct node *node, char *err, size_t errlen)
{
    *out = NULL;
    struct gen_node *g = calloc(1, sizeof *g);
    if (!g)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    g->node = node;
    pthread_mutex_init(&g->mu, NULL);
    pthread_mutex_init(&g->place_mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, watch_main, g)) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->place_mu);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return cairn_fail(err, errlen, CAIRN_EIO, "gen: cannot start a thread");
    }
    node_set_task_sink(node, on_line, g);
    *out = g;
    return 0;
}

void gen_node_release(struct gen_node *g)
{
    if (!g)
        return;
    node_set_task_sink(g->node, NULL, NULL);
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_lock(&g->mu);
    while (g->n_live)
        fail_req(g, g->n_live - 1, 503, "the node is stopping");
    pthread_mutex_unlock(&g->mu);
    free(g->live);
    free(g->cancels);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->place_mu);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* ---- /health and /metrics ---- */

static void any_ready(void *ctx, const struct cluster_state *s)
{
    bool *ready = ctx;
    for (size_t i = 0; i < s->n_instances && !*ready; i++)
        *ready = instance_ready(s, &s->instances[i]);
}

static void h_health(struct http_request *req, void *ctx)
{
    struct gen_node *g = ctx;
    bool ready = false;
    node_read_state(g->node, any_ready, &ready);
    if (!ready) {
        http_reply_header(req, "Retry-After", "1");
        http_reply_json(req, 503, json_pack("{s:s, s:s}", "status", "loading", "message", "no instance is ready"));
        return;
    }
    http_reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

struct text {
    char *buf;
    size_t len, cap;
    bool oom;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
    for (int round = 0; round < 2 && !t->oom; round++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        if (array_reserve(&t->buf, &t->cap, t->len + (size_t)n + 1, 1, 4096)) {
            t->oom = true;
            return;
        }
    }
}

static void add_hist(struct text *t, const char *name, const char *help, const struct hist *h)
{
    add(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < HIST_BUCKETS; b++) {
        cum += h->counts[b];
        add(t, "%s_bucket{le=\"%g\"} %llu\n", name, hist_bounds[b], (unsigned long long)cum);
    }
    add(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name, h->sum,
        name, (unsigned long long)h->n);
}

static void add_counter(struct text *t, const char *name, const char *help, uint64_t v)
{
    add(t, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void add_gauge(struct text *t, const char *name, const char *help, uint64_t v)
{
    add(t, "# HELP %s %s\n# TYPE %s gauge\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void h_metrics(struct http_request *req, void *ctx)
{
    struct gen_node *g = ctx;
    struct text t = {0};
    pthread_mutex_lock(&g->mu);
    struct figures f = g->fig;
    size_t queued = 0, running = 0;
    for (size_t i = 0; i < g->n_live; i++) {
        queued += !g->live[i]->started;
        running += g->live[i]->started;
    }
    struct runner_figures rf[MAX_FIGURES];
    int n_rf = g->n_runners;
    memcpy(rf, g->runners, (size_t)n_rf * sizeof rf[0]);
    pthread_mutex_unlock(&g->mu);
    add(&t, "# HELP cairn_requests_total Generation requests by outcome.\n# TYPE cairn_requests_total counter\n");
    add(&t, "cairn_requests_total{outcome=\"ok\"} %llu\n", (unsigned long long)f.ok);
    add(&t, "cairn_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)f.failed);
    add(&t, "cairn_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)f.cancelled);
    add(&t, "cairn_requests_total{outcome=\"refused\"} %llu\n", (unsigned long long)f.refused);
    add_counter(&t, "cairn_prompt_tokens_total", "Prompt tokens of requests that started.", f.prompt_tokens);
    add_counter(&t, "cairn_cached_prompt_tokens_total", "Prompt tokens reused from the prefix cache.",
                f.cached_tokens);
    add_counter(&t, "cairn_completion_tokens_total", "Tokens generated.", f.completion_tokens);
    add_counter(&t, "cairn_draft_tokens_total", "Speculative draft tokens proposed.", f.draft_tokens);
    add_counter(&t, "cairn_accepted_draft_tokens_total", "Speculative draft tokens accepted.",
                f.accepted_draft_tokens);
    add_gauge(&t, "cairn_requests_queued", "Requests of this node waiting for their runner to start them.", queued);
    add_gauge(&t, "cairn_requests_running", "Requests of this node generating.", running);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } per_instance[] = {
        {"cairn_runner_busy_slots", "gauge", "Sequences decoding in the instance's runner (at its last report).",
         offsetof(struct runner_figures, s.running)},
        {"cairn_runner_slots", "gauge", "Slots of the instance's runner.", offsetof(struct runner_figures, s.slots)},
        {"cairn_runner_queue_length", "gauge", "Requests waiting in the instance's runner.",
         offsetof(struct runner_figures, s.queued)},
        {"cairn_kv_cache_blocks_used", "gauge", "KV cache blocks in use.", offsetof(struct runner_figures, s.kv_blocks_used)},
        {"cairn_kv_cache_blocks_total", "gauge", "KV cache blocks in all.", offsetof(struct runner_figures, s.kv_blocks_total)},
        {"cairn_runner_preemptions_total", "counter", "Sequences preempted for KV room.",
         offsetof(struct runner_figures, s.preemptions)},
        {"cairn_instance_completion_tokens_total", "counter", "Tokens generated for this node's requests to the instance.",
         offsetof(struct runner_figures, completion_tokens)},
        {"cairn_instance_draft_tokens_total", "counter", "Draft tokens proposed for this node's requests to the instance.",
         offsetof(struct runner_figures, draft_tokens)},
        {"cairn_instance_accepted_draft_tokens_total", "counter",
         "Draft tokens accepted for this node's requests to the instance.",
         offsetof(struct runner_figures, accepted_draft_tokens)},
        {"cairn_pipeline_steps_total", "counter", "Steps rank 0 sent around the pipeline (0: one node).",
         offsetof(struct runner_figures, s.pipeline_steps)},
        {"cairn_pipeline_rank0_compute_microseconds_total", "counter", "Rank 0's time in its own layers.",
         offsetof(struct runner_figures, s.pipeline_compute_us)},
        {"cairn_pipeline_wait_microseconds_total", "counter",
         "Rank 0's time from sending a step's activations to its logits coming back (the other ranks and the wire).",
         offsetof(struct runner_figures, s.pipeline_wait_us)},
        {"cairn_pipeline_bytes_total", "counter", "Bytes on rank 0's data-plane links.",
         offsetof(struct runner_figures, s.pipeline_bytes)},
        {"cairn_pipeline_result_bytes_total", "counter", "Bytes of the results that came back from the last rank.",
         offsetof(struct runner_figures, s.pipeline_result_bytes)},
        {"cairn_pipeline_rows_sampled_total", "counter", "Tokens the last rank sampled (a few bytes each).",
         offsetof(struct runner_figures, s.pipeline_rows_sampled)},
        {"cairn_pipeline_rows_logits_total", "counter",
         "Tokens whose whole logits row came back (sampled drafts, forked prompts).",
         offsetof(struct runner_figures, s.pipeline_rows_logits)},
        {"cairn_pipeline_sealed_bytes_total", "counter",
         "Bytes rank 0 sent encrypted on its data-plane links (all of them in a cluster with a secret).",
         offsetof(struct runner_figures, s.pipeline_sealed_bytes)},
    };
    for (size_t k = 0; k < sizeof per_instance / sizeof per_instance[0]; k++) {
        add(&t, "# HELP %s %s\n# TYPE %s %s\n", per_instance[k].name, per_instance[k].help, per_instance[k].name,
            per_instance[k].type);
        for (int i = 0; i < n_rf; i++)
            add(&t, "%s{instance=\"%s\"} %lld\n", per_instance[k].name, rf[i].instance_id,
                (long long)*(const int64_t *)((const char *)&rf[i] + per_instance[k].off));
    }
    add_hist(&t, "cairn_time_to_first_token_seconds", "From request to its first text.", &f.ttft);
    add_hist(&t, "cairn_inter_token_latency_seconds", "Between text deltas of one sequence.", &f.itl);
    add_hist(&t, "cairn_request_duration_seconds", "From request to its end.", &f.duration);
    if (t.oom)
        http_reply_error(req, 500, "server_error", "out of memory");
    else
        http_reply_bytes(req, 200, "text/plain; version=0.0.4; charset=utf-8", t.buf, t.len);
    free(t.buf);
}

int gen_node_routes(struct gen_node *g, struct http_server *srv, char *err, size_t errlen)
{
    int rc = http_route(srv, "GET", "/health", h_health, g);
    if (!rc)
        rc = http_route(srv, "GET", "/metrics", h_metrics, g);
    if (rc)
        return cairn_fail(err, errlen, rc, "gen: cannot add the /health and /metrics routes");
    return 0;
}
