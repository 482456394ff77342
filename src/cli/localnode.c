/* A node for one cairn run session (localnode.h). */
#include "cli/localnode.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"

/* The port of a loopback base URL ("http://127.0.0.1:PORT"), or NULL. */
static const char *loopback_port(const char *base)
{
    static const char *const hosts[] = {"http://127.0.0.1:", "http://localhost:", "http://[::1]:"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++)
        if (!strncmp(base, hosts[i], strlen(hosts[i])))
            return base + strlen(hosts[i]);
    return NULL;
}

/* The child's side: its own session, no terminal, then cairn node. */
static void exec_node(const char *port, const struct localnode_config *cfg)
{
    setsid();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    const char *argv[20];
    int k = 0;
    argv[k++] = "cairn";
    argv[k++] = "node";
    argv[k++] = "--api-host";
    argv[k++] = "127.0.0.1";
    argv[k++] = "--api-port";
    argv[k++] = port;
    argv[k++] = "-q";
    if (cfg->models_dir)
        argv[k++] = "--models-dir", argv[k++] = cfg->models_dir;
    if (cfg->discovery)
        argv[k++] = "--discovery", argv[k++] = cfg->discovery;
    if (cfg->cluster_port)
        argv[k++] = "--cluster-port", argv[k++] = cfg->cluster_port;
    if (cfg->data_dir)
        argv[k++] = "--data-dir", argv[k++] = cfg->data_dir;
    argv[k] = NULL;
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
}

int localnode_start(struct localnode *n, const struct client *api, const struct localnode_config *cfg,
                    const atomic_bool *cancel, char *err, size_t errlen)
{
    n->pid = 0;
    const char *port = loopback_port(api->base);
    if (!port)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no node answers at %s (a node is started only on loopback)",
                          api->base);
    pid_t pid = fork();
    if (pid < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "fork: cannot start a node");
    if (pid == 0)
        exec_node(port, cfg);
    n->pid = pid;
    int64_t t0 = clock_ns();
    while (clock_ns() - t0 < (int64_t)LOCALNODE_START_S * 1000000000) {
        if (cancel && atomic_load(cancel))
            break;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            n->pid = 0;
            return cairn_fail(err, errlen, CAIRN_EIO,
                              "the node started for this session exited (status %d); its log is in "
                              "$XDG_CACHE_HOME/cairn/node.log (or DATA_DIR/node.log)",
                              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        }
        if (client_alive(api))
            return 0;
        clock_sleep_ms(100);
    }
    localnode_stop(n);
    if (cancel && atomic_load(cancel))
        return cairn_fail(err, errlen, CAIRN_EIO, "interrupted");
    return cairn_fail(err, errlen, CAIRN_EIO, "the node did not answer within %d s", LOCALNODE_START_S);
}

void localnode_stop(struct localnode *n)
{
    if (n->pid <= 0)
        return;
    kill(n->pid, SIGTERM);
    int64_t t0 = clock_ns();
    while (clock_ns() - t0 < (int64_t)LOCALNODE_STOP_S * 1000000000) {
        if (waitpid(n->pid, NULL, WNOHANG) == n->pid) {
            n->pid = 0;
            return;
        }
        clock_sleep_ms(50);
    }
    kill(n->pid, SIGKILL);
    waitpid(n->pid, NULL, 0);
    n->pid = 0;
}
