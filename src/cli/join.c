/* cairn seal and cairn join: a sealed cluster from one pasted line (README, "Security").
 *
 * `cairn seal` on the first machine makes a strong cluster secret in its data dir (or
 * keeps the one there) and prints `cairn join TOKEN`: the token holds the secret, the
 * namespace and the addresses of this machine's cluster port. `cairn join TOKEN` on
 * another machine keeps the secret in its own data dir and starts the node, dialling
 * those addresses as well as listening for beacons. From then on plain `cairn` on either
 * machine finds the secret in its data dir: the cluster stays sealed across restarts. */
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "base/args.h"
#include "base/err.h"
#include "cli/cli.h"
#include "cli/credentials.h"
#include "net/jointoken.h"

#define DEFAULT_CLUSTER_PORT 52416

static void seal_usage(void)
{
    fprintf(stderr,
            "usage: cairn seal [--data-dir DIR] [--namespace NS] [--cluster-port N] [--address HOST:PORT]...\n"
            "Makes this machine's cluster secret (kept in DATA_DIR/" CRED_SECRET_FILE ", mode 0600; an existing\n"
            "one is kept) and prints the command that joins other machines to its cluster:\n"
            "  cairn join TOKEN\n"
            "The token holds the secret: whoever has it can join. It also lists where this\n"
            "machine's cluster port is reached (--address, repeatable; by default each IPv4\n"
            "address of its interfaces, with --cluster-port, 52416), for networks where\n"
            "discovery does not reach. Start the node here with plain `cairn`: it uses the\n"
            "secret from the data dir.\n");
}

/* The IPv4 addresses of this machine's interfaces that are up and not loopback, with
 * port, into t (at most JOINTOKEN_MAX_PEERS). Reads the interface list; sends nothing. */
static void local_addresses(struct jointoken *t, int port)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs))
        return;
    for (struct ifaddrs *i = ifs; i && t->n_peers < JOINTOKEN_MAX_PEERS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
        snprintf(t->peers[t->n_peers++], JOINTOKEN_ADDR_MAX + 1, "%s:%d", ip, port);
    }
    freeifaddrs(ifs);
}

int cli_seal(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "seal", false};
    const char *v, *data_dir = NULL, *ns = "";
    int64_t port = DEFAULT_CLUSTER_PORT;
    struct jointoken t = {0};
    char err[512], dir_buf[4096];
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--data-dir", &v)) data_dir = v;
        else if (args_opt(&a, "--namespace", &v)) ns = v;
        else if (args_opt(&a, "--cluster-port", &v)) port = args_int(&a, "--cluster-port", v, 1, 65535);
        else if (args_opt(&a, "--address", &v)) {
            if (t.n_peers == JOINTOKEN_MAX_PEERS || strlen(v) > JOINTOKEN_ADDR_MAX) {
                fprintf(stderr, "cairn seal: at most %d addresses of %d bytes\n", JOINTOKEN_MAX_PEERS,
                        JOINTOKEN_ADDR_MAX);
                return 2;
            }
            snprintf(t.peers[t.n_peers++], sizeof t.peers[0], "%s", v);
        } else if (args_opt(&a, "-h|--help", NULL)) {
            seal_usage();
            return 0;
        } else {
            fprintf(stderr, "cairn seal: unknown option '%s'\n", argv[a.i]);
            seal_usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!data_dir) {
        if (cli_data_path(dir_buf, sizeof dir_buf, NULL)) {
            fprintf(stderr, "cairn seal: no --data-dir, and neither XDG_DATA_HOME nor HOME is set\n");
            return 2;
        }
        data_dir = dir_buf;
    }
    if (strlen(ns) > JOINTOKEN_NS_MAX) {
        fprintf(stderr, "cairn seal: a namespace of at most %d bytes\n", JOINTOKEN_NS_MAX);
        return 2;
    }
    snprintf(t.ns, sizeof t.ns, "%s", ns);
    if (!t.n_peers)
        local_addresses(&t, (int)port);
    bool made = false;
    char token[JOINTOKEN_TEXT_MAX];
    int rc = cred_cluster_secret(data_dir, true, t.secret, sizeof t.secret, &made, err, sizeof err);
    if (!rc)
        rc = jointoken_encode(&t, token, err, sizeof err);
    sodium_memzero(&t, sizeof t);
    if (rc) {
        fprintf(stderr, "cairn seal: %s\n", err);
        return 1;
    }
    printf("%s %s/" CRED_SECRET_FILE ". On each other machine, run:\n  cairn join %s\n"
           "(whoever has this line can join; `cairn` here now starts sealed)\n",
           made ? "The cluster secret was made in" : "The cluster secret is kept in", data_dir, token);
    sodium_memzero(token, sizeof token);
    return 0;
}

int cli_join(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: cairn join TOKEN [cairn node options]\n"
                        "Joins the sealed cluster whose `cairn seal` printed TOKEN: keeps its secret in this\n"
                        "machine's data dir (DATA_DIR/" CRED_SECRET_FILE ") and runs the node, dialling the\n"
                        "addresses in the token. Later, plain `cairn` joins the same cluster.\n");
        return argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) ? 0 : 2;
    }
    static struct jointoken t; /* the node keeps pointing at its addresses */
    char err[256];
    int rc = jointoken_decode(argv[1], &t, err, sizeof err);
    sodium_memzero(argv[1], strlen(argv[1])); /* the token is the secret: out of /proc/PID/cmdline */
    if (rc) {
        fprintf(stderr, "cairn join: %s\n", err);
        return 2;
    }
    /* The node's options are what follows the token; argv[0] stands for the command. */
    argv[1] = argv[0];
    rc = cli_node_join(argc - 1, argv + 1, &t);
    sodium_memzero(t.secret, sizeof t.secret);
    return rc;
}
