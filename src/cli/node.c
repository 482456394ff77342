/* cairn node: the control plane of this machine (node/node.h) and its HTTP API
 * (api/routes_cluster.h), until SIGINT or SIGTERM. */
#include "api/http.h"
#include "api/anthropic.h"
#include "api/gen_node.h"
#include "api/embeddings.h"
#include "api/ollama.h"
#include "api/openai.h"
#include "api/responses.h"
#include "api/routes_cluster.h"
#include "api/routes_files.h"
#include "api/routes_web.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "base/args.h"
#include "base/bwprobe.h"
#include "base/cpu.h"
#include "base/mem.h"
#include "base/pool.h"
#include "api/hosts.h"
#include "cli/cli.h"
#include "cli/credentials.h"
#include "net/jointoken.h"
#include "net/keys.h"
#include "node/bwcache.h"
#include "node/node.h"
#include "node/supervisor.h"
#include "node/worker.h"

#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PEERS 64
#define MAX_CORS 16
#define MAX_ALLOWED_HOSTS 16

/* Prints the command's options to stderr. */
static void usage(void)
{
    fprintf(stderr,
            "usage: cairn node [--api-port N] [--api-host ADDR] [--cluster-port N] [--bind ADDR]\n"
            "                  [--namespace NS] [--cluster-secret-file PATH] [--peer HOST:PORT]...\n"
            "                  [--discovery off|auto|IFACE] [--no-api] [--no-worker] [--force-master]\n"
            "                  [--models-dir DIR] [--data-dir DIR] [--memory-limit BYTES|NNG]\n"
            "                  [--node-timeout SECONDS] [--api-key-file PATH] [--api-insecure]\n"
            "                  [--api-max-per-client N] [--cors ORIGIN]...\n"
            "                  [--allowed-host NAME]... [-v|-q]\n"
            "                  [--parallel N] [-t|--threads N] [--ctx-size N] [--log-file PATH|-]\n"
            "                  [--bandwidth-mib N]\n"
            "Joins (or starts) a cluster and serves its API until SIGINT/SIGTERM.\n"
            "  --api-port      HTTP API port (52415; 0 = any free port)\n"
            "  --api-host      address the API listens on (127.0.0.1). Any other address\n"
            "                  needs an API key: --api-key-file, CAIRN_API_KEY, or one made at\n"
            "                  first start in DATA_DIR/api_key (--api-insecure: none)\n"
            "  --api-max-per-client  open API connections from one address (64; all of\n"
            "                  loopback is one address, so raise it behind a local proxy)\n"
            "  --cluster-port  node-to-node port (52416; 0 = any free port)\n"
            "  --bind          address the cluster port listens on (every interface)\n"
            "  --cluster-secret-file  the cluster secret (first line), which encrypts and\n"
            "                  authenticates every link; or CAIRN_CLUSTER_SECRET. Without one\n"
            "                  the cluster is open: any machine on the network can join it,\n"
            "                  unless DATA_DIR/cluster_secret holds one (`cairn seal`, `cairn join`)\n"
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
            "  --ctx-size      positions per sequence of the models placed through this node's\n"
            "                  API (default: the model's trained context where memory allows,\n"
            "                  else the largest that fits, at least min(trained, 4096))\n"
            "  -ctk, -ctv      the KV cache's K and V types for those placements: f16 (default),\n"
            "                  f32, q8_0 or q4_0 (q8_0 holds about half the memory of f16)\n"
            "  --bandwidth-mib the block (MiB) the node reads once to measure its memory\n"
            "                  bandwidth for placement's estimates (default: DRAM, as `cairn\n"
            "                  bench`: 4x the last-level cache, 1-8 GiB); kept in\n"
            "                  DATA_DIR/" BWCACHE_FILE " for the next start on this machine\n"
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

int cli_data_path(char *out, size_t n, const char *sub)
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

/* The command line, and the buffers that the paths and the secret it settles on may
 * point into (they live as long as the node). */
struct node_opts {
    const char *peers[MAX_PEERS], *cors[MAX_CORS + 1], *hosts[MAX_ALLOWED_HOSTS + 1]; /* cors, hosts: NULL-ended */
    size_t n_peers, n_cors, n_hosts;
    const char *ns, *secret, *discovery, *models_dir, *data_dir, *api_key, *api_host, *bind, *log_file;
    int64_t api_port, cluster_port, node_timeout, memory_limit;
    int64_t parallel, threads, ctx_size; /* of each runner; 0: the supervisor's default */
    int cache_type_k, cache_type_v;      /* of placements through this node (DT_F16) */
    int64_t api_per_client;              /* open API connections per client address; 0: the server's default */
    int64_t bw_mib;                      /* --bandwidth-mib; 0: bw_dram_block's */
    bool no_api, no_worker, force_master;
    enum log_level level;
    const char *secret_file, *api_key_file;
    bool secret_on_argv, api_insecure;
    const struct jointoken *join; /* cairn join: the token's secret, namespace and peers */
    char secret_buf[1024], key_buf[300], log_buf[4096], data_buf[4096], models_buf[4096];
    char cluster_key[KEYS_HEX]; /* the secret through Argon2id: what the node is given */
};

/* The node and what serves it, each released by shut_down. */
struct node_app {
    struct node *node;
    struct http_server *srv;        /* NULL with --no-api */
    struct routes_cluster *routes;
    struct routes_files *files;
    struct gen_node *gen;
    struct responses *responses; /* the Responses API's store */
    struct gen g;                   /* the front-ends keep a pointer: it lives as long as the server */
    struct worker *worker;          /* NULL with --no-worker */
    pthread_t bw_thread;            /* measures the memory bandwidth once (worker nodes) */
    bool bw_started;
    int bw_threads;                 /* the runners' threads */
    int64_t bw_mib;                 /* the block it reads */
    atomic_bool bw_stop;            /* set at shut-down: the probe gives up */
    char bw_cache[4200];            /* DATA_DIR/bandwidth.json (bwcache.h); "" when the path is too long */
    char err[1024];
};

/* Appends v to a repeatable option's list of at most max; -1 (message printed) when it
 * is full. */
static int push(const char **list, size_t *n, size_t max, const char *v, const char *name)
{
    if (*n == max) {
        fprintf(stderr, "cairn node: at most %zu %s\n", max, name);
        return -1;
    }
    list[(*n)++] = v;
    return 0;
}

/* Reads the options into o; CLI_GO_ON, or the exit code. */
static int parse_opts(struct node_opts *o, int argc, char **argv)
{
    struct args a = {argc, argv, 1, "node", false};
    const char *v;
    *o = (struct node_opts){.secret = getenv("CAIRN_CLUSTER_SECRET"), .discovery = "auto",
                            .models_dir = getenv("CAIRN_MODELS_DIR"), .api_host = "127.0.0.1",
                            .api_port = 52415, .cluster_port = 52416, .node_timeout = 30, .level = LOG_INFO,
                            .cache_type_k = DT_F16, .cache_type_v = DT_F16};
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--api-port", &v)) o->api_port = args_int(&a, "--api-port", v, 0, 65535);
        else if (args_opt(&a, "--api-host", &v)) o->api_host = v;
        else if (args_opt(&a, "--cluster-port", &v)) o->cluster_port = args_int(&a, "--cluster-port", v, 0, 65535);
        else if (args_opt(&a, "--bind", &v)) o->bind = v;
        else if (args_opt(&a, "--namespace", &v)) o->ns = v;
        else if (args_opt(&a, "--cluster-secret", &v)) o->secret = v, o->secret_on_argv = true;
        else if (args_opt(&a, "--cluster-secret-file", &v)) o->secret_file = v;
        else if (args_opt(&a, "--api-key-file", &v)) o->api_key_file = v;
        else if (args_opt(&a, "--api-insecure", NULL)) o->api_insecure = true;
        else if (args_opt(&a, "--api-max-per-client", &v))
            o->api_per_client = args_int(&a, "--api-max-per-client", v, 1, 256);
        else if (args_opt(&a, "--peer", &v)) {
            if (push(o->peers, &o->n_peers, MAX_PEERS, v, "--peer"))
                return 2;
        }
        else if (args_opt(&a, "--discovery", &v)) o->discovery = v;
        else if (args_opt(&a, "--no-api", NULL)) o->no_api = true;
        else if (args_opt(&a, "--no-worker", NULL)) o->no_worker = true;
        else if (args_opt(&a, "--force-master", NULL)) o->force_master = true;
        else if (args_opt(&a, "--models-dir", &v)) o->models_dir = v;
        else if (args_opt(&a, "--data-dir", &v)) o->data_dir = v;
        else if (args_opt(&a, "--memory-limit", &v)) {
            o->memory_limit = parse_bytes(v);
            if (o->memory_limit < 0) {
                fprintf(stderr, "cairn node: bad value for --memory-limit: '%s' (bytes, or a number "
                                "with K, M, G or T)\n", v);
                return 2;
            }
        }
        else if (args_opt(&a, "--node-timeout", &v)) o->node_timeout = args_int(&a, "--node-timeout", v, 1, 86400);
        else if (args_opt(&a, "--api-key", &v)) o->api_key = v;
        else if (args_opt(&a, "--log-file", &v)) o->log_file = v;
        else if (args_opt(&a, "--parallel", &v)) o->parallel = args_int(&a, "--parallel", v, 1, 256);
        else if (args_opt(&a, "-t|--threads", &v)) o->threads = args_int(&a, "--threads", v, 1, 512);
        else if (args_opt(&a, "--bandwidth-mib", &v)) o->bw_mib = args_int(&a, "--bandwidth-mib", v, 1, 1 << 20);
        else if (args_opt(&a, "--ctx-size", &v)) o->ctx_size = args_int(&a, "--ctx-size", v, 16, 1 << 24);
        else if (args_opt(&a, "-ctk|--cache-type-k", &v)) o->cache_type_k = cli_kv_type(&a, "-ctk", v);
        else if (args_opt(&a, "-ctv|--cache-type-v", &v)) o->cache_type_v = cli_kv_type(&a, "-ctv", v);
        else if (args_opt(&a, "--cors", &v)) {
            if (push(o->cors, &o->n_cors, MAX_CORS, v, "--cors"))
                return 2;
        }
        else if (args_opt(&a, "--allowed-host", &v)) {
            if (push(o->hosts, &o->n_hosts, MAX_ALLOWED_HOSTS, v, "--allowed-host"))
                return 2;
        }
        else if (args_opt(&a, "-v|--verbose", NULL)) o->level = LOG_DEBUG;
        else if (args_opt(&a, "-q|--quiet", NULL)) o->level = LOG_WARN;
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn node: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    o->cors[o->n_cors] = NULL;
    o->hosts[o->n_hosts] = NULL;
    return CLI_GO_ON;
}

/* Settles the cluster secret: a join token's (then kept in the data dir), else
 * --cluster-secret-file, else CAIRN_CLUSTER_SECRET, else --cluster-secret (warned: `ps`
 * shows it), else the one kept in DATA_DIR/cluster_secret (`cairn seal`, `cairn join`),
 * kept in o; takes CAIRN_CLUSTER_SECRET out of the environment. 0, or 2 (message
 * printed). */
static int take_secret(struct node_opts *o)
{
    char err[512];
    const char *env = getenv("CAIRN_CLUSTER_SECRET");
    bool given = o->secret_file || o->secret_on_argv || (o->secret && o->secret == env);
    if (o->join && given) {
        fprintf(stderr, "cairn join: the secret comes from the token; drop --cluster-secret-file, "
                        "--cluster-secret and CAIRN_CLUSTER_SECRET\n");
        return 2;
    }
    if (o->join) {
        if (cred_store_secret(o->data_dir, o->join->secret, err, sizeof err)) {
            fprintf(stderr, "cairn join: %s\n", err);
            return 2;
        }
        snprintf(o->secret_buf, sizeof o->secret_buf, "%s", o->join->secret);
        o->secret = o->secret_buf;
        fprintf(stderr, "cairn join: the cluster secret is kept in %s/" CRED_SECRET_FILE
                        "; from now on `cairn` on this machine joins this cluster\n", o->data_dir);
    } else if (o->secret_file) {
        if (cred_read_file(o->secret_file, "cluster secret", o->secret_buf, sizeof o->secret_buf, err, sizeof err)) {
            fprintf(stderr, "cairn node: %s\n", err);
            return 2;
        }
        o->secret = o->secret_buf;
    } else if (o->secret && o->secret == env) {
        if (strlen(o->secret) >= sizeof o->secret_buf) {
            fprintf(stderr, "cairn node: CAIRN_CLUSTER_SECRET is longer than %zu bytes\n",
                    sizeof o->secret_buf - 1);
            return 2;
        }
        snprintf(o->secret_buf, sizeof o->secret_buf, "%s", o->secret);
        o->secret = o->secret_buf;
    } else if (o->secret_on_argv) {
        fprintf(stderr, "cairn node: warning: --cluster-secret is visible to every user of this machine (ps); "
                        "use --cluster-secret-file or CAIRN_CLUSTER_SECRET\n");
    } else {
        bool made;
        int rc = cred_cluster_secret(o->data_dir, false, o->secret_buf, sizeof o->secret_buf, &made, err, sizeof err);
        if (rc && rc != CAIRN_ENOTFOUND) {
            fprintf(stderr, "cairn node: %s\n", err);
            return 2;
        }
        if (!rc)
            o->secret = o->secret_buf;
    }
    /* The runners are children of this process: they must not inherit the secret (a
     * runner has no use for it; the data plane's key is derived and sent to it). */
    unsetenv("CAIRN_CLUSTER_SECRET");
    if (o->secret && o->secret[0]) {
        if (keys_cluster_key(o->secret, o->ns, o->cluster_key, err, sizeof err)) {
            fprintf(stderr, "cairn node: %s\n", err);
            return 2;
        }
        sodium_memzero(o->secret_buf, sizeof o->secret_buf);
        if (o->secret_on_argv) /* out of /proc/PID/cmdline from now on */
            sodium_memzero((char *)o->secret, strlen(o->secret));
        o->secret = o->cluster_key;
    }
    return 0;
}

/* Settles the API key: --api-key-file, CAIRN_API_KEY, --api-key; none is needed on a
 * loopback address or with --api-insecure, else the one kept in the data dir (made at
 * first start and shown once). 0, or 2 (message printed). */
static int take_api_key(struct node_opts *o)
{
    char err[512];
    const char *env = getenv("CAIRN_API_KEY");
    int rc = 0;
    if (o->api_key_file) {
        rc = cred_read_file(o->api_key_file, "API key", o->key_buf, sizeof o->key_buf, err, sizeof err);
        o->api_key = o->key_buf;
    } else if (!o->api_key && env) {
        if (snprintf(o->key_buf, sizeof o->key_buf, "%s", env) >= (int)sizeof o->key_buf)
            rc = cairn_fail(err, sizeof err, CAIRN_ERANGE, "CAIRN_API_KEY is longer than %zu bytes",
                            sizeof o->key_buf - 1);
        o->api_key = o->key_buf;
    }
    unsetenv("CAIRN_API_KEY");
    if (!rc && !o->api_key && !o->no_api && !o->api_insecure && !http_addr_is_loopback(o->api_host)) {
        /* A sealed cluster's nodes share a key derived from the cluster key (peers fetch
         * models from each other's APIs with it); an open cluster's node makes its own. */
        bool created = false;
        if (o->secret && o->secret[0])
            keys_api_key(o->secret, o->key_buf);
        else
            rc = cred_api_key(o->data_dir, o->key_buf, sizeof o->key_buf, &created, err, sizeof err);
        if (!rc) {
            o->api_key = o->key_buf;
            fprintf(stderr,
                    "cairn node: the API on %s answers requests with this key only "
                    "(Authorization: Bearer KEY, or x-api-key: KEY)%s:\n  %s\n  (%s; --api-insecure serves "
                    "without one)\n",
                    o->api_host, created ? ", made now" : "", o->api_key,
                    o->secret && o->secret[0] ? "the same on every node of this cluster, derived from its secret"
                                              : "kept in DATA_DIR/api_key; peers fetch models with their own key, "
                                                "so give every node the same --api-key-file, or seal the cluster");
        }
    }
    if (rc) {
        fprintf(stderr, "cairn node: %s\n", err);
        return 2;
    }
    return 0;
}

/* The log file, data dir and models dir that were not given; 0, or 2 (message printed)
 * when no data dir can be named. */
static int default_paths(struct node_opts *o)
{
    /* Logs: --log-file, else the cache dir (a node with its own --data-dir logs there, so
     * nodes sharing a machine do not share a file); "-" keeps them on stderr only. */
    if (!o->log_file && !o->data_dir && cache_dir(o->log_buf, sizeof o->log_buf - 16) == 0) {
        strcat(o->log_buf, "/node.log");
        o->log_file = o->log_buf;
    } else if (!o->log_file && o->data_dir &&
               snprintf(o->log_buf, sizeof o->log_buf, "%s/node.log", o->data_dir) < (int)sizeof o->log_buf) {
        o->log_file = o->log_buf;
    }
    if (!o->data_dir) {
        if (cli_data_path(o->data_buf, sizeof o->data_buf, NULL)) {
            fprintf(stderr, "cairn node: no --data-dir, and neither XDG_DATA_HOME nor HOME is set\n");
            return 2;
        }
        o->data_dir = o->data_buf;
    }
    if (!o->models_dir || !o->models_dir[0]) {
        o->models_dir = cli_data_path(o->models_buf, sizeof o->models_buf, "models") ? NULL : o->models_buf;
    }
    return 0;
}

/* Blocks SIGINT and SIGTERM (taken by sigwait later; set gets them) and ignores SIGPIPE. */
static void block_stop_signals(sigset_t *set)
{
    /* Before any thread starts (ZeroMQ's, the HTTP server's, the node's), so every
     * thread inherits the mask. */
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

#define RUNNER_WRAPPER_WORDS 8

/* CAIRN_RUNNER_WRAPPER, when set, is a command (words split at spaces) that runners are
 * started under, with this binary's path after it: e.g. "qemu-aarch64 -cpu max" for an
 * ARM64 node run by qemu-user on an x86-64 machine, which cannot start an ARM64 binary
 * by itself without binfmt_misc (scripts/test-arm64.sh), or "valgrind". Fills argv
 * (RUNNER_WRAPPER_WORDS + 3 entries); 0, or 1 with a message printed. */
static int runner_wrapped(const char **argv)
{
    static char words[512], self[4096];
    const char *w = getenv("CAIRN_RUNNER_WRAPPER");
    if (!w || !*w)
        return 0;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || strlen(w) >= sizeof words) {
        fprintf(stderr, "cairn node: CAIRN_RUNNER_WRAPPER: %s\n",
                n <= 0 ? "cannot read this binary's path" : "too long");
        return 1;
    }
    self[n] = 0;
    snprintf(words, sizeof words, "%s", w);
    int k = 0;
    for (char *save = NULL, *t = strtok_r(words, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (k == RUNNER_WRAPPER_WORDS) {
            fprintf(stderr, "cairn node: CAIRN_RUNNER_WRAPPER: more than %d words\n", RUNNER_WRAPPER_WORDS);
            return 1;
        }
        argv[k++] = t;
    }
    argv[k++] = self;
    argv[k++] = "runner";
    argv[k] = NULL;
    return 0;
}

/* Makes the worker that runs this node's runners, and names it in nc; 0, or 1 (message
 * printed). */
/* The memory the start-up probe may size its block from (bw_dram_block takes a quarter):
 * MemAvailable, or less where a cgroup (a container) or --memory-limit allows less. */
static int64_t probe_room(const struct node_opts *o)
{
    int64_t room = mem_available(), cg = mem_cgroup_free();
    if (cg >= 0 && (room < 0 || cg < room))
        room = cg;
    if (o->memory_limit > 0 && (room < 0 || o->memory_limit < room))
        room = o->memory_limit;
    return room;
}

static int create_worker(struct node_app *app, const struct node_opts *o, struct node_config *nc)
{
    /* Runners are this same binary: `cairn runner`, one per placed shard of this node. */
    static const char *runner_argv[RUNNER_WRAPPER_WORDS + 3] = {"/proc/self/exe", "runner", NULL};
    if (runner_wrapped(runner_argv))
        return 1;
    struct supervisor_config sc;
    supervisor_config_defaults(&sc);
    sc.argv = runner_argv;
    sc.runner_slots = (int)o->parallel;
    sc.runner_threads = (int)o->threads;
    app->bw_threads = o->threads > 0 ? (int)o->threads : RUNNER_DEFAULT_THREADS;
    app->bw_mib = o->bw_mib > 0 ? o->bw_mib : (int64_t)(bw_dram_block(bw_llc_bytes(), (long long)probe_room(o)) >> 20);
    if (snprintf(app->bw_cache, sizeof app->bw_cache, "%s/" BWCACHE_FILE, o->data_dir) >= (int)sizeof app->bw_cache)
        app->bw_cache[0] = 0;
    sc.runner_ctx = o->ctx_size;
    if (worker_create(&app->worker, &sc, app->err, sizeof app->err)) {
        fprintf(stderr, "cairn node: worker: %s\n", app->err);
        return 1;
    }
    nc->runners = worker_runners_json;
    nc->runners_ctx = app->worker;
    return 0;
}

/* Binds the API's port, and puts it in nc; 0, or 1 (message printed). */
static int bind_api(struct node_app *app, const struct node_opts *o, struct node_config *nc)
{
    /* Bound before the node exists, so that its beacons and reports carry the real
     * API port (also with --api-port 0); the routes come once the node is made. */
    struct http_config hc = {
        .bind_addr = o->api_host,
        .port = (uint16_t)o->api_port,
        .api_key = o->api_key,
        .cors_origins = o->n_cors ? o->cors : NULL,
        .allowed_hosts = o->hosts,
        .max_per_client = (unsigned)o->api_per_client,
        .access_log = o->level >= LOG_INFO, /* one line per request, off with -q */
    };
    if (http_server_create(&app->srv, &hc, app->err, sizeof app->err)) {
        fprintf(stderr, "cairn node: API: %s\n", app->err);
        return 1;
    }
    nc->api_port = http_server_port(app->srv);
    return 0;
}

/* Makes the worker (unless --no-worker), binds the API (unless --no-api) and makes the
 * node; 0, or 1 (message printed, what was made released). */
static int create(struct node_app *app, const struct node_opts *o)
{
    struct node_config nc = {
        .data_dir = o->data_dir,
        .models_dir = o->models_dir,
        .ns = o->ns,
        .secret = o->secret,
        .bind_addr = o->bind,
        .cluster_port = (int)o->cluster_port,
        .peers = o->peers,
        .n_peers = o->n_peers,
        .force_master = o->force_master,
        .worker = !o->no_worker,
        .memory_limit = o->memory_limit,
        .node_timeout_ms = (int)(o->node_timeout * 1000),
        .discovery = o->discovery,
        .api_key = o->api_key, /* models are fetched from peers' APIs with the same key */
        .place_kv = {.ctx_len = o->ctx_size},
    };
    if (o->cache_type_k != DT_F16)
        snprintf(nc.place_kv.type_k, sizeof nc.place_kv.type_k, "%s", dtype_kv_name(o->cache_type_k));
    if (o->cache_type_v != DT_F16)
        snprintf(nc.place_kv.type_v, sizeof nc.place_kv.type_v, "%s", dtype_kv_name(o->cache_type_v));
    if (!o->no_worker && create_worker(app, o, &nc))
        return 1;
    if (!o->no_api && bind_api(app, o, &nc)) {
        worker_release(app->worker);
        app->worker = NULL;
        return 1;
    }
    if (node_create(&app->node, &nc, app->err, sizeof app->err)) {
        fprintf(stderr, "cairn node: %s\n", app->err);
        http_server_release(app->srv);
        worker_release(app->worker);
        app->srv = NULL;
        app->worker = NULL;
        return 1;
    }
    return 0;
}

/* Puts the cluster's, the files', the generation's and the front-ends' (OpenAI, Ollama,
 * Anthropic) routes on the API, if there is one; 0, or nonzero (message printed). */
static int add_routes(struct node_app *app, const struct node_opts *o)
{
    if (!app->srv)
        return 0;
    char *err = app->err;
    size_t errlen = sizeof app->err;
    int rc = routes_cluster_create(&app->routes, app->srv, app->node, 0, err, errlen);
    struct routes_files_config fc = {.node_id = node_id(app->node), .secret = o->secret, .card = node_card,
                                     .card_ctx = app->node};
    if (!rc)
        rc = routes_files_create(&app->files, app->srv, &fc, err, errlen);
    if (!rc)
        rc = gen_node_create(&app->gen, app->node, err, errlen);
    if (app->gen)
        app->g = gen_node_gen(app->gen);
    if (!rc)
        rc = gen_node_routes(app->gen, app->srv, err, errlen);
    if (!rc)
        rc = openai_register(app->srv, &app->g, err, errlen);
    if (!rc && (rc = responses_create(&app->responses, &app->g)))
        snprintf(err, errlen, "out of memory");
    if (!rc)
        rc = responses_register(app->responses, app->srv, err, errlen);
    if (!rc)
        rc = ollama_register(app->srv, &app->g, err, errlen);
    if (!rc)
        rc = embeddings_register(app->srv, &app->g, err, errlen);
    if (!rc)
        rc = anthropic_register(app->srv, &app->g, err, errlen);
    if (!rc)
        rc = routes_web_register(app->srv, err, errlen);
    if (rc) {
        fprintf(stderr, "cairn node: API: %s\n", err);
        return rc;
    }
    node_set_api_port(app->node, http_server_port(app->srv));
    return 0;
}

/* Slices of each style in the node's probe (bwprobe.h; cairn bench's machine line takes 16). */
#define NODE_BW_ROUNDS 16

/* Measures how fast the runners' threads read DRAM, for placement's speed estimates
 * (ctl/estimate.h), as `cairn bench` does (a block bw_dram_block sizes, every style), and
 * hands it to the node, which reports it with its info. A reading kept in the data
 * folder from an earlier start on the same CPU with the same threads and block is taken
 * instead (bwcache.h). It runs beside the node's start; shut-down stops it. */
static void *measure_bandwidth(void *arg)
{
    struct node_app *app = arg;
    struct bwcache_entry e = {0};
    snprintf(e.key.cpu, sizeof e.key.cpu, "%s", cpu_features()->model);
    e.key.threads = app->bw_threads;
    e.key.block_mib = app->bw_mib;
    char err[512];
    int64_t now = (int64_t)time(NULL);
    struct bwcache_entry kept;
    int krc = app->bw_cache[0] ? bwcache_read(app->bw_cache, &e.key, now, &kept, err, sizeof err) : CAIRN_ENOTFOUND;
    if (krc != 0 && krc != CAIRN_ENOTFOUND && krc != CAIRN_ESTATE)
        log_warn("cairn node: %s; measuring again", err);
    if (krc == 0) {
        node_set_memory_bandwidth(app->node, (int64_t)kept.bytes_per_s);
        log_info("cairn node %s: memory read bandwidth %.1f GB/s (%d threads, %s, %lld MiB block; kept in %s)",
                 node_id(app->node), kept.bytes_per_s / 1e9, app->bw_threads, kept.style,
                 (long long)app->bw_mib, app->bw_cache);
        return NULL;
    }
    struct pool *p = NULL;
    struct bw_reading r;
    /* A runner loading or serving beside the probe lowers its reading: such a reading
     * serves this run but is not kept for later starts. */
    bool alone = worker_count(app->worker) == 0;
    if (pool_create(&p, app->bw_threads) == 0 &&
        bw_probe_until(p, (size_t)app->bw_mib << 20, NODE_BW_ROUNDS * N_BW_STYLES, &app->bw_stop, &r) == 0 &&
        r.best > 0) {
        node_set_memory_bandwidth(app->node, (int64_t)r.best);
        log_info("cairn node %s: memory read bandwidth %.1f GB/s (%d threads, %s, %lld MiB block; measured)",
                 node_id(app->node), r.best / 1e9, app->bw_threads, bw_style_name(r.best_style),
                 (long long)app->bw_mib);
        e.bytes_per_s = r.best;
        snprintf(e.style, sizeof e.style, "%s", bw_style_name(r.best_style));
        e.taken_at = now;
        alone = alone && worker_count(app->worker) == 0;
        if (app->bw_cache[0] && alone && bwcache_write(app->bw_cache, &e, err, sizeof err))
            log_warn("cairn node: %s", err);
        else if (!alone)
            log_info("cairn node: runners ran beside the probe; its reading is not kept for the next start");
    } else if (!atomic_load(&app->bw_stop)) {
        log_warn("cairn node: the memory bandwidth probe of %lld MiB failed", (long long)app->bw_mib);
    }
    pool_release(p);
    return NULL;
}

/* Starts the node, then the worker and the API; 0, or nonzero (message printed). */
static int start(struct node_app *app)
{
    int rc = node_start(app->node, app->err, sizeof app->err);
    if (!rc && app->worker)
        rc = worker_start(app->worker, app->node, app->err, sizeof app->err);
    if (!rc && app->worker)
        app->bw_started = pthread_create(&app->bw_thread, NULL, measure_bandwidth, app) == 0;
    if (!rc && app->srv)
        rc = http_server_start(app->srv, app->err, sizeof app->err);
    if (rc)
        fprintf(stderr, "cairn node: %s\n", app->err);
    return rc;
}

/* Stops and releases all app holds; sig (the signal that stopped the node, 0 on a failed
 * start) has the node tell its peers it leaves. */
static void shut_down(struct node_app *app, int sig)
{
    http_server_stop(app->srv);
    gen_node_release(app->gen); /* requests still in flight end with an error */
    routes_cluster_release(app->routes);
    routes_files_release(app->files);
    if (app->bw_started) {
        atomic_store(&app->bw_stop, true);
        pthread_join(app->bw_thread, NULL);
    }
    if (app->worker)
        worker_stop(app->worker); /* runners end before the node that reports them */
    if (sig)
        node_leave(app->node); /* the others take it out of the cluster now, not after the timeout */
    node_stop(app->node);
    http_server_release(app->srv);
    responses_release(app->responses); /* no request holds it once the server is gone */
    node_release(app->node);
    worker_release(app->worker);
    log_close_file();
}

/* Notes where the API listens in DATA_DIR/api_address ("HOST:PORT"), where cairn run,
 * status, ps and stop look first; a node on every address is reached on loopback. */
static void note_api_address(const struct node_opts *o, int port)
{
    char path[4200], tmp[4300];
    const char *host = o->api_host;
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "[::]"))
        host = "127.0.0.1";
    if (snprintf(path, sizeof path, "%s/" CLI_API_ADDRESS_FILE, o->data_dir) >= (int)sizeof path)
        return;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    bool v6 = strchr(host, ':') && host[0] != '[';
    bool ok = fprintf(f, v6 ? "[%s]:%d\n" : "%s:%d\n", host, port) > 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path))
        unlink(tmp);
}

static void forget_api_address(const struct node_opts *o)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" CLI_API_ADDRESS_FILE, o->data_dir) < (int)sizeof path)
        unlink(path);
}

/* A join token's namespace and addresses in o (the secret is take_secret's); 0, or 2
 * (message printed). */
static int take_join(struct node_opts *o, const struct jointoken *join)
{
    o->join = join;
    if (!join)
        return 0;
    if (o->ns && strcmp(o->ns, join->ns)) {
        fprintf(stderr, "cairn join: the token is for namespace '%s', not --namespace '%s'\n", join->ns, o->ns);
        return 2;
    }
    o->ns = join->ns;
    for (int i = 0; i < join->n_peers; i++)
        if (push(o->peers, &o->n_peers, MAX_PEERS, join->peers[i], "--peer"))
            return 2;
    return 0;
}

int cli_node_join(int argc, char **argv, const struct jointoken *join)
{
    struct node_opts o;
    int rc = parse_opts(&o, argc, argv);
    if (rc != CLI_GO_ON)
        return rc;
    if (take_join(&o, join) || default_paths(&o) || take_secret(&o))
        return 2;
    log_set_level(o.level);
    if (take_api_key(&o))
        return 2;
    sigset_t stop_set;
    block_stop_signals(&stop_set);

    struct node_app app = {0};
    if (create(&app, &o))
        return 1;
    /* after node_create, which made the data dir */
    if (o.log_file && strcmp(o.log_file, "-") && log_open_file(o.log_file))
        fprintf(stderr, "cairn node: cannot log to %s: %s (stderr only)\n", o.log_file, strerror(errno));
    int sig = 0; /* the signal that stopped us; 0 on a failed start */
    rc = add_routes(&app, &o);
    if (!rc)
        rc = start(&app);
    if (!rc) {
        log_info("cairn node %s: api %s:%d, cluster port %d, discovery %s, worker %s%s", node_id(app.node),
                 app.srv ? o.api_host : "(none)", app.srv ? (int)http_server_port(app.srv) : 0,
                 node_cluster_port(app.node), o.discovery, app.worker ? "on" : "off",
                 o.force_master ? ", force master" : "");
        if (!o.secret || !o.secret[0])
            log_warn("cairn node %s: this cluster is open: any machine on the network can join it, read its "
                     "state and requests, and run models on it (`cairn seal` makes a secret and the command "
                     "that joins other machines; or give one with --cluster-secret-file or CAIRN_CLUSTER_SECRET)",
                     node_id(app.node));
        if (app.srv)
            note_api_address(&o, (int)http_server_port(app.srv));
        while (sigwait(&stop_set, &sig) != 0)
            ;
        if (app.srv)
            forget_api_address(&o);
        log_info("cairn node %s: %s, stopping", node_id(app.node), sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    shut_down(&app, sig);
    return rc ? 1 : 0;
}

int cli_node(int argc, char **argv)
{
    return cli_node_join(argc, argv, NULL);
}
