/* cairn status, cairn ps and cairn stop: the cluster as a node's public API shows it.
 *   cairn status [--host H] [--watch [S]] [--json]  nodes (memory, load), links (RTT), the
 *                                                   master, instances (ranks, state), downloads
 *   cairn ps [--host H] [--watch [S]]               instances: slots, queue, KV use, tokens/s
 *   cairn stop INSTANCE [--host H]                  deletes an instance (an id, its first
 *                                                   characters, or a model's id)
 * --watch redraws every S seconds (2) until Ctrl-C. */
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/args.h"
#include "base/clock.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "cli/progress.h"

#define WATCH_MAX_S 3600
#define SAMPLE_MS 1000 /* ps without --watch: tokens/s over this long */

static atomic_bool stop_watch;
static void on_sigint(int sig)
{
    (void)sig;
    atomic_store(&stop_watch, true);
}

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "-";
}

static long long num(const json_t *o, const char *key) { return (long long)json_integer_value(json_object_get(o, key)); }

/* Tasks and runners of node id in state: its load. */
static void load_of(const json_t *state, const char *id, int *runners, int *tasks)
{
    const char *k;
    json_t *v;
    *runners = *tasks = 0;
    json_object_foreach(json_object_get(state, "runners"), k, v) {
        *runners += !strcmp(str(v, "node_id"), id);
    }
    json_object_foreach(json_object_get(state, "tasks"), k, v) {
        *tasks += !strcmp(str(v, "node_id"), id) && strcmp(str(v, "status"), "Complete") &&
                  strcmp(str(v, "status"), "Failed");
    }
}

static void show_nodes(const json_t *state, FILE *f)
{
    const json_t *master = json_object_get(state, "master");
    const char *mid = str(master, "node_id");
    fprintf(f, "NODES%s\n", json_is_true(json_object_get(state, "open")) ? " (open cluster: any machine may join)"
                                                                          : " (sealed cluster)");
    fprintf(f, "  %-10s %-16s %-23s %5s %9s %7s %5s\n", "ID", "HOST", "MEMORY FREE / TOTAL", "CORES", "READ GB/s",
            "RUNNERS", "TASKS");
    const char *id;
    json_t *n;
    json_object_foreach(json_object_get(state, "nodes"), id, n) {
        const json_t *info = json_object_get(n, "info");
        char avail[32], total[32], mem[80];
        progress_human((double)num(info, "memory_available_bytes"), avail, sizeof avail);
        progress_human((double)num(info, "memory_total_bytes"), total, sizeof total);
        snprintf(mem, sizeof mem, "%s / %s", avail, total);
        int runners, tasks;
        load_of(state, id, &runners, &tasks);
        char bw[16] = "-"; /* memory read bandwidth, once the node measured it */
        if (num(info, "memory_bandwidth_bytes_per_s") > 0)
            snprintf(bw, sizeof bw, "%.1f", (double)num(info, "memory_bandwidth_bytes_per_s") / 1e9);
        fprintf(f, "  %-10.8s %-16.16s %-23s %5lld %9s %7d %5d%s\n", id, str(info, "hostname"), mem,
                num(info, "cpu_cores"), bw, runners, tasks, !strcmp(id, mid) ? "  master" : "");
    }
}

static void show_links(const json_t *state, FILE *f)
{
    const json_t *edges = json_object_get(state, "edges");
    fprintf(f, "LINKS\n");
    if (!json_array_size(edges))
        fprintf(f, "  (none)\n");
    size_t i;
    json_t *e;
    json_array_foreach(edges, i, e) {
        fprintf(f, "  %.8s -> %.8s  rtt %.2f ms", str(e, "from"), str(e, "to"), (double)num(e, "rtt_us") / 1000.0);
        long long tp = num(e, "throughput_bytes_per_s");
        if (tp > 0) {
            char t[32];
            progress_human((double)tp, t, sizeof t);
            fprintf(f, "  %s/s", t);
        }
        fprintf(f, "\n");
    }
}

/* The state of instance in: its runners' statuses, one word when they agree. */
static void instance_state(const json_t *state, const json_t *in, char *out, size_t cap)
{
    const json_t *runners = json_object_get(state, "runners");
    size_t i;
    json_t *sh;
    out[0] = 0;
    json_array_foreach(json_object_get(in, "shards"), i, sh) {
        const json_t *r = json_object_get(runners, str(sh, "runner_id"));
        const char *st = r ? str(r, "status") : "Pending";
        if (!out[0])
            snprintf(out, cap, "%s", st);
        else if (strcmp(out, st))
            snprintf(out + strlen(out), cap - strlen(out), "/%s", st);
    }
}

static void show_instances(const json_t *state, FILE *f)
{
    fprintf(f, "INSTANCES\n");
    const char *id;
    json_t *in;
    if (!json_object_size(json_object_get(state, "instances")))
        fprintf(f, "  (none)\n");
    json_object_foreach(json_object_get(state, "instances"), id, in) {
        char st[64];
        instance_state(state, in, st, sizeof st);
        const char *draft = json_string_value(json_object_get(in, "draft_model"));
        const char *tk = json_string_value(json_object_get(in, "cache_type_k"));
        const char *tv = json_string_value(json_object_get(in, "cache_type_v"));
        char ctx[64] = "";
        if (num(in, "ctx_len") > 0)
            snprintf(ctx, sizeof ctx, "  ctx %lld", num(in, "ctx_len"));
        fprintf(f, "  %.8s  %s  %s  epoch %lld  %s%s%s%s%s%s%s%s\n", id, str(in, "model_id"), str(in, "sharding"),
                num(in, "epoch"), st, ctx, tk || tv ? "  kv " : "", tk || tv ? (tk ? tk : "f16") : "",
                tk || tv ? "/" : "", tk || tv ? (tv ? tv : "f16") : "", draft ? "  draft " : "", draft ? draft : "");
        size_t i;
        json_t *sh;
        json_array_foreach(json_object_get(in, "shards"), i, sh) {
            const json_t *r = json_object_get(json_object_get(state, "runners"), str(sh, "runner_id"));
            long long b = num(sh, "layer_begin"), e = num(sh, "layer_end");
            fprintf(f, "    rank %lld/%lld  node %.8s  layers %lld-%lld (%lld)  %s\n", num(sh, "rank"),
                    num(sh, "world_size"), str(sh, "node_id"), b, e > b ? e - 1 : b, e - b,
                    r ? str(r, "status") : "Pending");
        }
    }
}

static void show_downloads(const json_t *state, FILE *f)
{
    const json_t *d = json_object_get(state, "downloads");
    size_t i;
    json_t *e;
    bool any = false;
    json_array_foreach(d, i, e) {
        if (!strcmp(str(e, "status"), "Completed")) /* in progress, or failed */
            continue;
        if (!any)
            fprintf(f, "DOWNLOADS\n");
        any = true;
        char done[32], total[32], rate[32];
        progress_human((double)num(e, "bytes_done"), done, sizeof done);
        progress_human((double)num(e, "bytes_total"), total, sizeof total);
        progress_human((double)num(e, "bytes_per_s"), rate, sizeof rate);
        fprintf(f, "  %.8s  %s  %s  %s / %s  %s/s", str(e, "node_id"), str(e, "model_id"), str(e, "status"), done,
                total, rate);
        if (json_is_integer(json_object_get(e, "eta_s")))
            fprintf(f, "  eta %llds", num(e, "eta_s"));
        fprintf(f, "\n");
    }
}

/* One value of a Prometheus text ("name{labels} value" or "name value"); 0 when absent. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    return 0;
}

/* Options shared by status and ps. */
struct view_opts {
    const char *host, *target;
    int watch_s; /* 0: once */
    bool json;
};

static int parse_view(struct view_opts *o, int argc, char **argv, const char *cmd, bool want_target)
{
    struct args a = {argc, argv, 1, cmd, false};
    const char *v;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--host", &v)) o->host = v;
        else if (!want_target && args_opt(&a, "--json", NULL)) o->json = true;
        else if (!want_target && !strcmp(argv[a.i], "--watch")) {
            o->watch_s = 2;
            if (a.i + 1 < argc && argv[a.i + 1][0] >= '0' && argv[a.i + 1][0] <= '9')
                o->watch_s = (int)args_int(&a, "--watch", argv[++a.i], 1, WATCH_MAX_S);
        } else if (args_opt(&a, "-h|--help", NULL)) {
            fprintf(stderr, "usage: cairn %s%s [--host HOST:PORT]%s\n", cmd, want_target ? " INSTANCE" : "",
                    want_target ? "" : " [--watch [SECONDS]] [--json]");
            return 0;
        } else if (want_target && !o->target && argv[a.i][0] != '-') o->target = argv[a.i];
        else {
            fprintf(stderr, "cairn %s: unexpected '%s'\n", cmd, argv[a.i]);
            return 2;
        }
    }
    if (a.bad || (want_target && !o->target)) {
        fprintf(stderr, "usage: cairn %s%s [--host HOST:PORT]\n", cmd, want_target ? " INSTANCE" : "");
        return 2;
    }
    return CLI_GO_ON;
}

/* The node's /state; NULL with the reason printed. */
static json_t *get_state(const struct client *api, const char *cmd)
{
    char err[1024];
    json_t *s = NULL;
    int status = client_json(api, "GET", "/state", NULL, &s, err, sizeof err);
    if (status != 200 || !json_is_object(s)) {
        fprintf(stderr, "cairn %s: %s\n", cmd, status == 200 ? "the node's state is not JSON" : err);
        json_decref(s);
        return NULL;
    }
    return s;
}

/* Runs show every o->watch_s seconds (once without --watch), clearing a terminal
 * between; the exit code. */
static int view_loop(const struct view_opts *o, const char *cmd, int (*show)(const struct client *, void *, FILE *),
                     void *ctx)
{
    char err[512];
    struct client api;
    if (client_init(&api, o->host, err, sizeof err)) {
        fprintf(stderr, "cairn %s: %s\n", cmd, err);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    bool tty = isatty(STDOUT_FILENO);
    for (int round = 0; !atomic_load(&stop_watch); round++) {
        if (o->watch_s && tty)
            fputs("\033[H\033[2J", stdout); /* home, clear */
        int rc = show(&api, ctx, stdout);
        fflush(stdout);
        if (!o->watch_s || rc)
            return rc;
        int64_t until = clock_ns() + (int64_t)o->watch_s * 1000000000;
        while (!atomic_load(&stop_watch) && clock_ns() < until)
            clock_sleep_ms(100);
        if (!tty)
            fputs("\n", stdout);
    }
    return 0;
}

static int show_status(const struct client *api, void *ctx, FILE *f)
{
    const struct view_opts *o = ctx;
    json_t *s = get_state(api, "status");
    if (!s)
        return 1;
    if (o->json) {
        json_dumpf(s, f, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputs("\n", f);
    } else {
        const json_t *master = json_object_get(s, "master");
        fprintf(f, "cluster of %zu node%s, master %.8s (term %lld), via %s\n",
                json_object_size(json_object_get(s, "nodes")), json_object_size(json_object_get(s, "nodes")) == 1 ? "" : "s",
                str(master, "node_id"), num(master, "term"), api->base);
        show_nodes(s, f);
        show_links(s, f);
        show_instances(s, f);
        show_downloads(s, f);
    }
    json_decref(s);
    return 0;
}

int cli_status(int argc, char **argv)
{
    struct view_opts o = {0};
    int rc = parse_view(&o, argc, argv, "status", false);
    return rc != CLI_GO_ON ? rc : view_loop(&o, "status", show_status, &o);
}

/* ps: the node's metrics of the round before, whose counters give the rates. */
struct ps_view {
    char *prev;
    int64_t prev_ns;
};

/* The node's metrics text; NULL with the reason printed. */
static char *get_metrics(const struct client *api)
{
    char err[1024], *text = NULL;
    if (client_text(api, "/metrics", &text, err, sizeof err) != 200) {
        fprintf(stderr, "cairn ps: %s\n", err);
        free(text);
        return NULL;
    }
    return text;
}

/* A counter's rate per second between the round before and now. */
static double rate_of(const struct ps_view *v, const char *now, double secs, const char *series)
{
    double d = metric(now, series) - metric(v->prev, series);
    return secs > 0 && d > 0 ? d / secs : 0;
}

static int show_ps(const struct client *api, void *ctx, FILE *f)
{
    struct ps_view *v = ctx;
    if (!v->prev) { /* a first round: a sample now and one a moment later give the rates */
        v->prev = get_metrics(api);
        v->prev_ns = clock_ns();
        if (!v->prev)
            return 1;
        clock_sleep_ms(SAMPLE_MS);
    }
    json_t *s = get_state(api, "ps");
    char *m = s ? get_metrics(api) : NULL;
    if (!m) {
        json_decref(s);
        return 1;
    }
    int64_t now = clock_ns();
    double secs = (double)(now - v->prev_ns) / 1e9;
    fprintf(f, "%-10s %-40s %-6s %-10s %6s %6s %7s %9s\n", "INSTANCE", "MODEL", "NODES", "STATE", "BUSY", "QUEUE",
            "KV USE", "TOKENS/S");
    const char *id;
    json_t *in;
    json_object_foreach(json_object_get(s, "instances"), id, in) {
        char st[64], series[160];
        instance_state(s, in, st, sizeof st);
        snprintf(series, sizeof series, "cairn_runner_busy_slots{instance=\"%s\"}", id);
        double busy = metric(m, series);
        snprintf(series, sizeof series, "cairn_runner_slots{instance=\"%s\"}", id);
        double slots = metric(m, series);
        snprintf(series, sizeof series, "cairn_runner_queue_length{instance=\"%s\"}", id);
        double queue = metric(m, series);
        snprintf(series, sizeof series, "cairn_kv_cache_blocks_used{instance=\"%s\"}", id);
        double used = metric(m, series);
        snprintf(series, sizeof series, "cairn_kv_cache_blocks_total{instance=\"%s\"}", id);
        double total = metric(m, series);
        snprintf(series, sizeof series, "cairn_instance_completion_tokens_total{instance=\"%s\"}", id);
        double rate = rate_of(v, m, secs, series);
        char busy_s[32];
        snprintf(busy_s, sizeof busy_s, "%.0f/%.0f", busy, slots);
        fprintf(f, "%-10.8s %-40.40s %-6zu %-10.10s %6s %6.0f %6.0f%% %9.1f\n", id, str(in, "model_id"),
                json_array_size(json_object_get(in, "shards")), st, busy_s, queue, total > 0 ? 100 * used / total : 0,
                rate);
    }
    fprintf(f, "tokens/s of this node's requests: %.1f; %.0f running, %.0f queued (via %s)\n",
            rate_of(v, m, secs, "cairn_completion_tokens_total"), metric(m, "cairn_requests_running"),
            metric(m, "cairn_requests_queued"), api->base);
    free(v->prev);
    v->prev = m, v->prev_ns = now;
    json_decref(s);
    return 0;
}

int cli_ps(int argc, char **argv)
{
    struct view_opts o = {0};
    int rc = parse_view(&o, argc, argv, "ps", false);
    struct ps_view v = {0};
    if (rc == CLI_GO_ON)
        rc = view_loop(&o, "ps", show_ps, &v);
    free(v.prev);
    return rc;
}

int cli_stop(int argc, char **argv)
{
    struct view_opts o = {0};
    int rc = parse_view(&o, argc, argv, "stop", true);
    if (rc != CLI_GO_ON)
        return rc;
    char err[1024];
    struct client api;
    if (client_init(&api, o.host, err, sizeof err)) {
        fprintf(stderr, "cairn stop: %s\n", err);
        return 2;
    }
    json_t *s = get_state(&api, "stop");
    if (!s)
        return 1;
    /* an instance's id, the start of one (as status and ps show them), or a model's id */
    const char *id, *found = NULL;
    json_t *in;
    int matches = 0;
    size_t n = strlen(o.target);
    json_object_foreach(json_object_get(s, "instances"), id, in) {
        if (!strncmp(id, o.target, n) || !strcmp(str(in, "model_id"), o.target)) {
            found = id;
            matches++;
        }
    }
    if (matches != 1) {
        fprintf(stderr, "cairn stop: %s instance is '%s' (cairn ps lists them)\n", matches ? "more than one" : "no",
                o.target);
        json_decref(s);
        return 1;
    }
    char path[128];
    snprintf(path, sizeof path, "/instance/%.64s", found);
    int status = client_json(&api, "DELETE", path, NULL, NULL, err, sizeof err);
    if (status == 200)
        printf("stopped %s\n", found);
    else
        fprintf(stderr, "cairn stop: %s\n", err);
    json_decref(s);
    return status == 200 ? 0 : 1;
}
