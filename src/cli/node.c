/* cairn node: the control plane of this machine (node/node.h) and its HTTP API
 * (api/routes_cluster.h), until SIGINT or SIGTERM. */
#include "api/http.h"
#include "api/anthropic.h"
#include "api/gen_node.h"
#include "api/ollama.h"
#include "api/openai.h"
#include "api/routes_cluster.h"
#include "api/routes_files.h"
#include "base/err.h"
#include "base/log.h"
#include "base/args.h"
#include "cli/cli.h"
#include "node/node.h"
#include "node/supervisor.h"
#include "node/worker.h"

#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PEERS 64
#define MAX_CORS 16
#define MAX_ALLOWED_HOSTS 16

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn node [--api-port N] [--api-host ADDR] [--cluster-port N] [--bind ADDR]\n"
            "                  [--namespace NS] [--cluster-secret S] [--peer HOST:PORT]...\n"
            "                  [--discovery off|auto|IFACE] [--no-api] [--no-worker] [--force-master]\n"
            "                  [--models-dir DIR] [--data-dir DIR] [--memory-limit BYTES|NNG]\n"
            "                  [--node-timeout SECONDS] [--api-key KEY] [--cors ORIGIN]...\n"
            "                  [--allowed-host NAME]... [-v|-q]\n"
            "                  [--parallel N] [-t|--threads N] [--ctx-size N] [--log-file PATH|-]\n"
            "Joins (or starts) a cluster and serves its API until SIGINT/SIGTERM.\n"
            "  --api-port      HTTP API port (52415; 0 = any free port)\n"
            "  --api-host      address the API listens on (127.0.0.1)\n"
            "  --cluster-port  node-to-node port (52416; 0 = any free port)\n"
            "  --bind          address the cluster port listens on (every interface)\n"
            "  --cluster-secret  encrypts and authenticates every link (or CAIRN_CLUSTER_SECRET)\n"
            "  --peer          a node to connect to, where discovery does not reach (repeatable)\n"
            "  --discovery     LAN beacons: auto (every interface that can broadcast; the\n"
            "                  default), off (only --peer), or one interface\n"
            "  --memory-limit  memory this node offers to models (e.g. 8G, 512M, or bytes)\n"
            "  --allowed-host  a name the API answers to besides IP addresses, localhost and\n"
            "                  this machine's name (repeatable; '*': any). Other Host headers\n"
            "                  get 403, so a web page cannot reach the API by DNS rebinding\n"
            "  --node-timeout  a node unheard this long leaves the cluster (30); one stopped\n"
            "                  with SIGINT/SIGTERM tells its peers and leaves at once\n"
            "  --parallel      sequences each runner decodes at once (8); more requests queue\n"
            "  -t, --threads   compute threads of each runner (2)\n"
            "  --ctx-size      positions per sequence (the model's, at most 4096)\n"
            "  --log-file      also log to PATH (default: $XDG_CACHE_HOME/cairn/node.log, or\n"
            "                  DATA_DIR/node.log with --data-dir; '-': stderr only)\n"
            "  data: $XDG_DATA_HOME/cairn (node id, event log); models: $CAIRN_MODELS_DIR or\n"
            "  $XDG_DATA_HOME/cairn/models\n");
}

/* "8G", "512M", "1.5G", "1024" (bytes; K/M/G/T are powers of 1024, an optional B or
 * iB after them); -1 when malformed. */
static int64_t parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -1;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && toupper((unsigned char)*end) == 'I')
        end++;
    if (toupper((unsigned char)*end) == 'B')
        end++;
    if (*end)
        return -1;
    double bytes = v * mult;
    if (bytes > (double)((int64_t)1 << 52))
        return -1;
    return (int64_t)bytes;
}

/* $XDG_CACHE_HOME/cairn, or ~/.cache/cairn, made when missing. */
static int cache_dir(char *out, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/')
        w = snprintf(out, n, "%s/cairn", xdg);
    else if (home && home[0])
        w = snprintf(out, n, "%s/.cache/cairn", home);
    else
        return -1;
    if (w < 0 || (size_t)w >= n)
        return -1;
    for (char *p = out + 1; *p; p++) { /* mkdir -p */
        if (*p != '/')
            continue;
        *p = 0;
        mkdir(out, 0755);
        *p = '/';
    }
    return mkdir(out, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* $XDG_DATA_HOME/cairn[/sub], or ~/.local/share/cairn[/sub]. */
static int data_path(char *out, size_t n, const char *sub)
{
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/')
        w = snprintf(out, n, "%s/cairn%s%s", xdg, sub ? "/" : "", sub ? sub : "");
    else if (home && home[0])
        w = snprintf(out, n, "%s/.local/share/cairn%s%s", home, sub ? "/" : "", sub ? sub : "");
    else
        return -1;
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

int cli_node(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "node", false};
    const char *peers[MAX_PEERS], *cors[MAX_CORS + 1], *hosts[MAX_ALLOWED_HOSTS + 1], *v;
    size_t n_peers = 0, n_cors = 0, n_hosts = 0;
    const char *ns = NULL, *secret = getenv("CAIRN_CLUSTER_SECRET"), *discovery = "auto";
    const char *models_dir = getenv("CAIRN_MODELS_DIR"), *data_dir = NULL, *api_key = NULL;
    const char *api_host = "127.0.0.1", *bind = NULL, *log_file = NULL;
    int64_t api_port = 52415, cluster_port = 52416, node_timeout = 30, memory_limit = 0;
    int64_t parallel = 0, threads = 0, ctx_size = 0;
    int sig = 0; /* the signal that stopped us; 0 on a failed start */
    bool no_api = false, no_worker = false, force_master = false;
    enum log_level level = LOG_INFO;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--api-port", &v)) api_port = args_int(&a, "--api-port", v, 0, 65535);
        else if (args_opt(&a, "--api-host", &v)) api_host = v;
        else if (args_opt(&a, "--cluster-port", &v)) cluster_port = args_int(&a, "--cluster-port", v, 0, 65535);
        else if (args_opt(&a, "--bind", &v)) bind = v;
        else if (args_opt(&a, "--namespace", &v)) ns = v;
        else if (args_opt(&a, "--cluster-secret", &v)) secret = v;
        else if (args_opt(&a, "--peer", &v)) {
            if (n_peers == MAX_PEERS) {
                fprintf(stderr, "cairn node: at most %d --peer\n", MAX_PEERS);
                return 2;
            }
            peers[n_peers++] = v;
        }
        else if (args_opt(&a, "--discovery", &v)) discovery = v;
        else if (args_opt(&a, "--no-api", NULL)) no_api = true;
        else if (args_opt(&a, "--no-worker", NULL)) no_worker = true;
        else if (args_opt(&a, "--force-master", NULL)) force_master = true;
        else if (args_opt(&a, "--models-dir", &v)) models_dir = v;
        else if (args_opt(&a, "--data-dir", &v)) data_dir = v;
        else if (args_opt(&a, "--memory-limit", &v)) {
            memory_limit = parse_bytes(v);
            if (memory_limit < 0) {
                fprintf(stderr, "cairn node: bad value for --memory-limit: '%s' (bytes, or a number "
                                "with K, M, G or T)\n", v);
                return 2;
            }
        }
        else if (args_opt(&a, "--node-timeout", &v)) node_timeout = args_int(&a, "--node-timeout", v, 1, 86400);
        else if (args_opt(&a, "--api-key", &v)) api_key = v;
        else if (args_opt(&a, "--log-file", &v)) log_file = v;
        else if (args_opt(&a, "--parallel", &v)) parallel = args_int(&a, "--parallel", v, 1, 256);
        else if (args_opt(&a, "-t|--threads", &v)) threads = args_int(&a, "--threads", v, 1, 512);
        else if (args_opt(&a, "--ctx-size", &v)) ctx_size = args_int(&a, "--ctx-size", v, 16, 1 << 24);
        else if (args_opt(&a, "--cors", &v)) {
            if (n_cors == MAX_CORS) {
                fprintf(stderr, "cairn node: at most %d --cors\n", MAX_CORS);
                return 2;
            }
            cors[n_cors++] = v;
        }
        else if (args_opt(&a, "--allowed-host", &v)) {
            if (n_hosts == MAX_ALLOWED_HOSTS) {
                fprintf(stderr, "cairn node: at most %d --allowed-host\n", MAX_ALLOWED_HOSTS);
                return 2;
            }
            hosts[n_hosts++] = v;
        }
        else if (args_opt(&a, "-v|--verbose", NULL)) level = LOG_DEBUG;
        else if (args_opt(&a, "-q|--quiet", NULL)) level = LOG_WARN;
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn node: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    cors[n_cors] = NULL;
    hosts[n_hosts] = NULL;
    /* The runners are children of this process: they must not inherit the secret (a
     * runner has no use for it; the data plane's key is derived and sent to it). */
    static char secret_copy[1024];
    if (secret && secret == getenv("CAIRN_CLUSTER_SECRET")) {
        if (strlen(secret) >= sizeof secret_copy) {
            fprintf(stderr, "cairn node: CAIRN_CLUSTER_SECRET is longer than %zu bytes\n", sizeof secret_copy - 1);
            return 2;
        }
        snprintf(secret_copy, sizeof secret_copy, "%s", secret);
        secret = secret_copy;
    }
    unsetenv("CAIRN_CLUSTER_SECRET");
    log_set_level(level);

    /* Logs: --log-file, else the cache dir (a node with its own --data-dir logs there, so
     * nodes sharing a machine do not share a file); "-" keeps them on stderr only. */
    char log_buf[4096];
    if (!log_file && !data_dir && cache_dir(log_buf, sizeof log_buf - 16) == 0) {
        strcat(log_buf, "/node.log");
        log_file = log_buf;
    } else if (!log_file && data_dir && snprintf(log_buf, sizeof log_buf, "%s/node.log", data_dir) < (int)sizeof log_buf) {
        log_file = log_buf;
    }
    char data_buf[4096], models_buf[4096];
    if (!data_dir) {
        if (data_path(data_buf, sizeof data_buf, NULL)) {
            fprintf(stderr, "cairn node: no --data-dir, and neither XDG_DATA_HOME nor HOME is set\n");
            return 2;
        }
        data_dir = data_buf;
    }
    if (!models_dir || !models_dir[0]) {
        models_dir = data_path(models_buf, sizeof models_buf, "models") ? NULL : models_buf;
    }

    /* Signals are taken by sigwait below: block them before any thread starts (ZeroMQ's,
     * the HTTP server's, the node's), so every thread inherits the mask. */
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[1024];
    struct node_config nc = {
        .data_dir = data_dir,
        .models_dir = models_dir,
        .ns = ns,
        .secret = secret,
        .bind_addr = bind,
        .cluster_port = (int)cluster_port,
        .peers = peers,
        .n_peers = n_peers,
        .force_master = force_master,
        .worker = !no_worker,
        .memory_limit = memory_limit,
        .node_timeout_ms = (int)(node_timeout * 1000),
        .discovery = discovery,
        .api_key = api_key, /* models are fetched from peers' APIs with the same key */
    };
    struct node *node = NULL;
    struct http_server *srv = NULL;
    struct routes_cluster *routes = NULL;
    struct routes_files *files = NULL;
    struct gen_node *gen = NULL;
    struct gen g = {0}; /* the front-ends keep a pointer: it lives as long as the server */
    struct worker *worker = NULL;
    int rc = 0;
    if (!no_worker) {
        /* Runners are this same binary: `cairn runner`, one per placed shard of this node. */
        static const char *const runner_argv[] = {"/proc/self/exe", "runner", NULL};
        struct supervisor_config sc;
        supervisor_config_defaults(&sc);
        sc.argv = runner_argv;
        sc.runner_slots = (int)parallel;
        sc.runner_threads = (int)threads;
        sc.runner_ctx = ctx_size;
        rc = worker_create(&worker, &sc, err, sizeof err);
        if (rc) {
            fprintf(stderr, "cairn node: worker: %s\n", err);
            return 1;
        }
        nc.runners = worker_runners_json;
        nc.runners_ctx = worker;
    }
    if (!no_api) {
        /* Bound before the node exists, so that its beacons and reports carry the real
         * API port (also with --api-port 0); the routes come once the node is made. */
        struct http_config hc = {
            .bind_addr = api_host,
            .port = (uint16_t)api_port,
            .api_key = api_key,
            .cors_origins = n_cors ? cors : NULL,
            .allowed_hosts = hosts,
            .access_log = level >= LOG_INFO, /* one line per request, off with -q */
        };
        if (http_server_create(&srv, &hc, err, sizeof err)) {
            fprintf(stderr, "cairn node: API: %s\n", err);
            worker_release(worker);
            return 1;
        }
        nc.api_port = http_server_port(srv);
    }
    rc = node_create(&node, &nc, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn node: %s\n", err);
        http_server_release(srv);
        worker_release(worker);
        return 1;
    }
    /* after node_create, which made the data dir */
    if (log_file && strcmp(log_file, "-") && log_open_file(log_file))
        fprintf(stderr, "cairn node: cannot log to %s: %s (stderr only)\n", log_file, strerror(errno));
    if (srv) {
        rc = routes_cluster_create(&routes, srv, node, 0, err, sizeof err);
        struct routes_files_config fc = {.node_id = node_id(node), .secret = secret, .card = node_card, .card_ctx = node};
        if (!rc)
            rc = routes_files_create(&files, srv, &fc, err, sizeof err);
        if (!rc)
            rc = gen_node_create(&gen, node, err, sizeof err);
        if (gen)
            g = gen_node_gen(gen);
        if (!rc)
            rc = gen_node_routes(gen, srv, err, sizeof err);
        if (!rc)
            rc = openai_register(srv, &g, err, sizeof err);
        if (!rc)
            rc = ollama_register(srv, &g, err, sizeof err);
        if (!rc)
            rc = anthropic_register(srv, &g, err, sizeof err);
        if (rc) {
            fprintf(stderr, "cairn node: API: %s\n", err);
            goto out;
        }
        node_set_api_port(node, http_server_port(srv));
    }
    rc = node_start(node, err, sizeof err);
    if (!rc && worker)
        rc = worker_start(worker, node, err, sizeof err);
    if (!rc && srv)
        rc = http_server_start(srv, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn node: %s\n", err);
        goto out;
    }
    log_info("cairn node %s: api %s:%d, cluster port %d, discovery %s, worker %s%s", node_id(node),
             srv ? api_host : "(none)", srv ? (int)http_server_port(srv) : 0, node_cluster_port(node),
             discovery, worker ? "on" : "off", force_master ? ", force master" : "");

    while (sigwait(&stop_set, &sig) != 0)
        ;
    log_info("cairn node %s: %s, stopping", node_id(node), sig == SIGINT ? "SIGINT" : "SIGTERM");
out:
    http_server_stop(srv);
    gen_node_release(gen); /* requests still in flight end with an error */
    routes_cluster_release(routes);
    routes_files_release(files);
    if (worker)
        worker_stop(worker); /* runners end before the node that reports them */
    if (sig)
        node_leave(node); /* the others take it out of the cluster now, not after the timeout */
    node_stop(node);
    http_server_release(srv);
    node_release(node);
    worker_release(worker);
    log_close_file();
    return rc ? 1 : 0;
}
