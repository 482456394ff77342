/* cairn runner: one model instance's shard on this node, started by the node's
 * supervisor (cluster/supervisor.h) and speaking cluster/runner_proto.h on fd 3. It
 * reports Idle -> Connecting -> Loading -> WarmingUp -> Ready, runs TextGeneration tasks
 * one at a time (Running, then Ready again) streaming token ids back, and exits when the
 * node asks (ShuttingDown -> Shutdown), when the node is gone (EOF on fd 4 or on the
 * socket), or after reporting Failed. */
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cluster/runner_proto.h"
#include "cluster/state.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "model/model.h"
#include "tok/tok.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QUEUE_CAP 64
#define WARMUP_TOKENS 4

struct runner {
    struct runner_config cfg;
    int sock;
    struct runner_lines in;
    int64_t last_sent; /* ns */
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct sampler *smp;
    struct tok *tk;
    int64_t ctx;
    int max_batch;
    float *out;        /* max(n_vocab, WARMUP_TOKENS * n_embd) floats */
    int32_t *history;  /* ctx entries */
    int32_t *seqs;     /* max_batch zeros */
    int64_t *pos;      /* max_batch */
    uint8_t *want;     /* max_batch */
    struct runner_task queue[QUEUE_CAP];
    size_t q_head, q_len;
    const char *current;   /* id of the task running, or NULL */
    bool cancel_current, shutdown;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn runner --config JSON|-   (as cairn node starts it; '-' reads the JSON from stdin)\n"
            "       cairn runner -m MODEL.gguf [--layers B:E] [--ctx N] [--slots N] [-t THREADS]\n"
            "                    [--heartbeat-ms N] [--instance ID] [--runner ID] [--sock-fd N] [--node-fd N]\n"
            "Speaks JSON lines on the socket at --sock-fd (3) and exits when --node-fd (4; -1: none)\n"
            "reaches end of file. See src/cluster/runner_proto.h for the messages.\n");
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

static void send_msg(struct runner *r, const struct runner_msg *m)
{
    int rc = runner_msg_send(r->sock, m);
    if (rc == CAIRN_EIO)
        node_gone();
    if (rc)
        fprintf(stderr, "cairn runner: cannot encode a '%s' message\n", runner_msg_type_name(m->type));
    r->last_sent = clock_ns();
}

static void send_status(struct runner *r, enum cluster_runner_status st, const char *error)
{
    struct runner_msg m = {.type = RUNNER_MSG_STATUS, .status = st, .error = (char *)error};
    send_msg(r, &m);
}

static void send_done(struct runner *r, const char *task_id, enum runner_finish finish, int64_t n, const char *error)
{
    struct runner_msg m = {.type = RUNNER_MSG_DONE, .finish = finish, .n_generated = n, .error = (char *)error};
    snprintf(m.task_id, sizeof m.task_id, "%s", task_id);
    send_msg(r, &m);
}

static void heartbeat_if_due(struct runner *r)
{
    if (clock_ns() - r->last_sent >= (int64_t)r->cfg.heartbeat_ms * 1000000) {
        struct runner_msg m = {.type = RUNNER_MSG_HEARTBEAT};
        send_msg(r, &m);
    }
}

static void handle(struct runner *r, struct runner_msg *m)
{
    switch (m->type) {
    case RUNNER_MSG_TASK:
        if (r->q_len == QUEUE_CAP) {
            send_done(r, m->task.task_id, RUNNER_FINISH_ERROR, 0, "the runner's task queue is full");
            break;
        }
        r->queue[(r->q_head + r->q_len++) % QUEUE_CAP] = m->task;
        memset(&m->task, 0, sizeof m->task); /* moved into the queue */
        break;
    case RUNNER_MSG_CANCEL:
        if (r->current && !strcmp(r->current, m->task_id)) {
            r->cancel_current = true;
            break;
        }
        for (size_t i = 0; i < r->q_len; i++) {
            struct runner_task *t = &r->queue[(r->q_head + i) % QUEUE_CAP];
            if (strcmp(t->task_id, m->task_id))
                continue;
            send_done(r, t->task_id, RUNNER_FINISH_CANCELLED, 0, NULL);
            runner_task_clear(t);
            for (size_t k = i; k + 1 < r->q_len; k++)
                r->queue[(r->q_head + k) % QUEUE_CAP] = r->queue[(r->q_head + k + 1) % QUEUE_CAP];
            memset(&r->queue[(r->q_head + r->q_len - 1) % QUEUE_CAP], 0, sizeof(struct runner_task));
            r->q_len--;
            break;
        }
        break;
    case RUNNER_MSG_SHUTDOWN:
        r->shutdown = true;
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

static int forward(struct runner *r, const int32_t *tokens, const float *embd, int n, int64_t pos0, char *err,
                   size_t errlen)
{
    for (int k = 0; k < n; k++) {
        r->pos[k] = pos0 + k;
        r->want[k] = k == n - 1;
    }
    struct batch b = {.n = n, .token = tokens, .embd = embd, .seq = r->seqs, .pos = r->pos, .logits = r->want};
    return engine_forward(r->e, r->kv, &b, r->out, err, errlen);
}

static int warm_up(struct runner *r, char *err, size_t errlen)
{
    int32_t toks[WARMUP_TOKENS];
    int n = WARMUP_TOKENS < r->m->hp.n_vocab ? WARMUP_TOKENS : r->m->hp.n_vocab;
    if (n > r->ctx)
        n = (int)r->ctx;
    for (int i = 0; i < n; i++)
        toks[i] = i;
    float *embd = NULL;
    if (!r->m->first) {
        embd = calloc((size_t)n * (size_t)r->m->hp.n_embd, sizeof *embd);
        if (!embd)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    int rc = forward(r, r->m->first ? toks : NULL, embd, n, 0, err, errlen);
    free(embd);
    kv_seq_clear(r->kv, 0);
    return rc;
}

static void run_task(struct runner *r, struct runner_task *t)
{
    char err[512];
    int64_t generated = 0;
    enum runner_finish finish = RUNNER_FINISH_LENGTH;
    r->current = t->task_id;
    r->cancel_current = false;
    send_status(r, CLUSTER_RUNNER_RUNNING, NULL);
    const struct model *m = r->m;
    if (!m->first || !m->last) {
        snprintf(err, sizeof err, "this runner holds layers [%d, %d) of %d; generation across runners needs the "
                 "pipeline data plane, which is not built yet", m->layer_begin, m->layer_end, m->hp.n_layers);
        goto fail;
    }
    if (t->n_tokens + t->max_tokens > r->ctx) {
        snprintf(err, sizeof err, "prompt of %lld tokens + %lld to generate does not fit the context of %lld",
                 (long long)t->n_tokens, (long long)t->max_tokens, (long long)r->ctx);
        goto fail;
    }
    for (int64_t i = 0; i < t->n_tokens; i++)
        if (t->tokens[i] >= m->hp.n_vocab) {
            snprintf(err, sizeof err, "token %d is outside the vocabulary of %d", t->tokens[i], m->hp.n_vocab);
            goto fail;
        }
    struct sample_params sp = sample_defaults();
    sp.temperature = t->sampling.temperature;
    sp.top_k = t->sampling.top_k;
    sp.top_p = t->sampling.top_p;
    sp.min_p = t->sampling.min_p;
    sp.repeat_penalty = t->sampling.repeat_penalty;
    sp.presence_penalty = t->sampling.presence_penalty;
    sp.frequency_penalty = t->sampling.frequency_penalty;
    sp.penalty_last_n = t->sampling.penalty_last_n;
    sp.seed = t->sampling.seed;

    kv_seq_clear(r->kv, 0);
    memcpy(r->history, t->tokens, (size_t)t->n_tokens * sizeof *r->history);
    int64_t n_hist = t->n_tokens;
    for (int64_t i = 0; i < t->n_tokens; i += r->max_batch) {
        int n = (int)(t->n_tokens - i < r->max_batch ? t->n_tokens - i : r->max_batch);
        if (forward(r, t->tokens + i, NULL, n, i, err, sizeof err))
            goto fail;
        heartbeat_if_due(r);
        pump(r, 0);
        if (r->cancel_current || r->shutdown) {
            finish = RUNNER_FINISH_CANCELLED;
            goto done;
        }
    }
    for (;;) {
        int32_t tok = sample_token(r->smp, &sp, r->out, r->history, n_hist, n_hist, NULL);
        if (tok < 0) {
            snprintf(err, sizeof err, "invalid sampling parameters (%s)", cairn_strerror(tok));
            goto fail;
        }
        r->history[n_hist++] = tok;
        if (!t->ignore_eos && r->tk && tok_is_eog(r->tk, tok)) {
            finish = RUNNER_FINISH_STOP;
            break;
        }
        struct runner_msg msg = {.type = RUNNER_MSG_TOKEN, .token = tok, .index = generated};
        memcpy(msg.task_id, t->task_id, sizeof msg.task_id);
        send_msg(r, &msg);
        if (++generated == t->max_tokens)
            break;
        pump(r, 0);
        if (r->cancel_current || r->shutdown) {
            finish = RUNNER_FINISH_CANCELLED;
            break;
        }
        if (forward(r, &tok, NULL, 1, n_hist - 1, err, sizeof err))
            goto fail;
    }
done:
    send_done(r, t->task_id, finish, generated, NULL);
    goto out;
fail:
    fprintf(stderr, "cairn runner: task %s: %s\n", t->task_id, err);
    send_done(r, t->task_id, RUNNER_FINISH_ERROR, generated, err);
out:
    kv_seq_clear(r->kv, 0);
    r->current = NULL;
    if (!r->shutdown)
        send_status(r, CLUSTER_RUNNER_READY, NULL);
}

/* Loads the slice and sizes every buffer; err says why not. */
static int load(struct runner *r, char *err, size_t errlen)
{
    struct model_load_opts lo = {.layer_begin = r->cfg.layer_begin, .layer_end = r->cfg.layer_end};
    int rc = model_load(&r->m, r->cfg.model_path, &lo, err, errlen);
    if (rc)
        return rc;
    const struct model *m = r->m;
    r->ctx = r->cfg.ctx ? r->cfg.ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    r->max_batch = r->ctx < 512 ? (int)r->ctx : 512;
    struct engine_config ec = {.n_threads = r->cfg.threads, .max_batch = r->max_batch, .max_ctx = r->ctx};
    struct kv_config kc = engine_kv_config(m, r->ctx, r->cfg.slots, 16);
    int64_t avail = mem_available();
    if (avail > 0 && kv_bytes_for(&kc) > (uint64_t)avail)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "a KV cache for %lld positions x %d slots needs %.1f MiB, "
                          "%.1f MiB available", (long long)r->ctx, r->cfg.slots,
                          (double)kv_bytes_for(&kc) / (1 << 20), (double)avail / (1 << 20));
    if ((rc = engine_create(&r->e, m, &ec, err, errlen)) || (rc = kv_create(&r->kv, &kc, err, errlen)))
        return rc;
    if (m->last && sample_create(&r->smp, m->hp.n_vocab))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    if (m->first && m->last && tok_load(&r->tk, m->file, err, errlen)) {
        fprintf(stderr, "cairn runner: no tokenizer (%s): end-of-generation tokens are not known\n", err);
        r->tk = NULL;
    }
    size_t out_n = (size_t)m->hp.n_vocab;
    if ((size_t)WARMUP_TOKENS * (size_t)m->hp.n_embd > out_n)
        out_n = (size_t)WARMUP_TOKENS * (size_t)m->hp.n_embd;
    r->out = malloc(out_n * sizeof *r->out);
    r->history = malloc((size_t)r->ctx * sizeof *r->history);
    r->seqs = calloc((size_t)r->max_batch, sizeof *r->seqs);
    r->pos = malloc((size_t)r->max_batch * sizeof *r->pos);
    r->want = calloc((size_t)r->max_batch, 1);
    if (!r->out || !r->history || !r->seqs || !r->pos || !r->want)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    return 0;
}

static void release(struct runner *r)
{
    for (size_t i = 0; i < QUEUE_CAP; i++)
        runner_task_clear(&r->queue[i]);
    runner_lines_free(&r->in);
    free(r->out);
    free(r->history);
    free(r->seqs);
    free(r->pos);
    free(r->want);
    tok_release(r->tk);
    sample_release(r->smp);
    kv_release(r->kv);
    engine_release(r->e);
    model_release(r->m);
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
        if (len == cap) {
            char *p = cap < ((size_t)1 << 20) ? realloc(buf, cap * 2) : NULL;
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
    }
    if (buf)
        buf[len < cap ? len : cap - 1] = 0;
    return buf;
}

int cli_runner(int argc, char **argv)
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
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 64 * 1024);
        int e = pthread_create(&th, &at, watch_node, (void *)(intptr_t)node_fd);
        pthread_attr_destroy(&at);
        if (e) {
            fprintf(stderr, "cairn runner: cannot watch the node: %s\n", strerror(e));
            return 1;
        }
    }

    send_status(&r, CLUSTER_RUNNER_IDLE, NULL);
    send_status(&r, CLUSTER_RUNNER_CONNECTING, NULL); /* one runner per instance: no peers to reach yet */
    send_status(&r, CLUSTER_RUNNER_LOADING, NULL);
    int rc = load(&r, err, sizeof err);
    if (!rc) {
        send_status(&r, CLUSTER_RUNNER_WARMING_UP, NULL);
        rc = warm_up(&r, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "cairn runner: %s: %s\n", r.cfg.model_path, err);
        char why[RUNNER_PATH_MAX + 1100];
        snprintf(why, sizeof why, "%s: %s", r.cfg.model_path, err);
        send_status(&r, CLUSTER_RUNNER_FAILED, why);
        release(&r);
        return 1;
    }
    send_status(&r, CLUSTER_RUNNER_READY, NULL);
    while (!r.shutdown) {
        if (r.q_len) {
            struct runner_task *t = &r.queue[r.q_head];
            run_task(&r, t);
            runner_task_clear(t);
            r.q_head = (r.q_head + 1) % QUEUE_CAP;
            r.q_len--;
            continue;
        }
        int64_t left_ms = r.cfg.heartbeat_ms - (clock_ns() - r.last_sent) / 1000000;
        pump(&r, left_ms > 0 ? (int)left_ms : 0);
        heartbeat_if_due(&r);
    }
    send_status(&r, CLUSTER_RUNNER_SHUTTING_DOWN, NULL);
    for (; r.q_len; r.q_len--, r.q_head = (r.q_head + 1) % QUEUE_CAP)
        send_done(&r, r.queue[r.q_head].task_id, RUNNER_FINISH_CANCELLED, 0, "the runner is shutting down");
    release(&r);
    send_status(&r, CLUSTER_RUNNER_SHUTDOWN, NULL);
    return 0;
}
