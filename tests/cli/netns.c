/* Network namespaces of a test's own (netns.h). */
#define _GNU_SOURCE /* setns, pipe2 */
#include "netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "nodes.h"
#include "testutil.h"

const char *netns_open(struct netns *ns)
{
    ns->home_fd = -1;
    if (geteuid() != 0)
        return "needs root to create network namespaces";
    if (run_argv((const char *[]){"ip", "-V", NULL}, false) != 0)
        return "no usable `ip` (iproute2)";
    ssize_t hl = readlink("/proc/self/ns/net", ns->home, sizeof ns->home - 1);
    ns->home_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (hl <= 0 || ns->home_fd < 0)
        return "cannot read /proc/self/ns/net";
    ns->home[hl] = 0;
    return NULL;
}

bool netns_add(struct netns *ns)
{
    for (int i = 0; i < ns->n; i++) {
        if (run_argv((const char *[]){"ip", "netns", "add", ns->names[i], NULL}, true) != 0) {
            printf("skipped: `ip netns add %s` failed (no network namespaces here)\n", ns->names[i]);
            for (int k = i; k < ns->n; k++)
                ns->names[k][0] = 0; /* not ours to delete */
            return false;
        }
    }
    return true;
}

void netns_delete(const struct netns *ns)
{
    for (int i = 0; i < ns->n; i++)
        if (ns->names[i][0])
            run_argv((const char *[]){"ip", "netns", "del", ns->names[i], NULL}, false);
}

pid_t netns_janitor(const struct netns *ns, const char *dir, int *wfd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[1]);
        setsid();
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        char c;
        ssize_t r;
        while ((r = read(p[0], &c, 1)) != 0)
            if (r < 0 && errno != EINTR)
                break;
        netns_delete(ns);
        if (!getenv("CAIRN_TEST_KEEP"))
            run_argv((const char *[]){"rm", "-rf", dir, NULL}, false);
        _exit(0);
    }
    close(p[0]);
    *wfd = p[1];
    return pid;
}

/* A TCP socket made inside namespace i; we are back in ours on return. */
static int socket_in(struct netns *ns, int i)
{
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", ns->names[i]);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0)
        return -1;
    int fd = -1;
    if (setns(nsfd, CLONE_NEWNET) == 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (setns(ns->home_fd, CLONE_NEWNET) != 0) {
            fprintf(stderr, "cannot return to our network namespace: %s\n", strerror(errno));
            ns->lost_home = true;
            if (fd >= 0)
                close(fd);
            fd = -1;
        }
    }
    close(nsfd);
    return fd;
}

int netns_connect(struct netns *ns, int i, const char *addr, int port, int timeout_s)
{
    int fd = socket_in(ns, i);
    if (fd < 0)
        return -1;
    struct timeval tv = {timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

pid_t netns_spawn(const struct netns *ns, int i, const char *log, const char *const *argv,
                  const char *const *env)
{
    char nspath[128];
    snprintf(nspath, sizeof nspath, "/run/netns/%s", ns->names[i]);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    if (getppid() != parent)
        _exit(1);
    FILE *f = fopen(log, "w");
    if (f) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
    }
    for (int k = 0; env && env[k]; k++) {
        const char *eq = strchr(env[k], '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - env[k]) : (int)strlen(env[k]), env[k]);
        if (eq ? setenv(name, eq + 1, 1) : unsetenv(name))
            _exit(124);
    }
    int nsfd = open(nspath, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "test: cannot enter %s: %s\n", nspath, strerror(errno));
        _exit(126);
    }
    char now[64];
    ssize_t n = readlink("/proc/self/ns/net", now, sizeof now - 1);
    if (n <= 0 || ((now[n] = 0), !strcmp(now, ns->home))) {
        fprintf(stderr, "test: still in the initial network namespace, not starting a node\n");
        _exit(125);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

void netns_close(struct netns *ns, pid_t janitor, int wfd, const char *dir)
{
    netns_delete(ns);
    close(wfd);
    if (wait_exit(janitor, 30) != 0)
        fprintf(stderr, "the janitor did not end cleanly\n");
    for (int i = 0; i < ns->n; i++) {
        char path[192];
        snprintf(path, sizeof path, "/run/netns/%s", ns->names[i]);
        CHECK(!ns->names[i][0] || access(path, F_OK) != 0, "namespace %s still there after the test", ns->names[i]);
    }
    CHECK(!ns->lost_home, "the test came back to its own network namespace every time");
    close(ns->home_fd);
    if (getenv("CAIRN_TEST_KEEP"))
        printf("kept %s\n", dir);
    else
        run_argv((const char *[]){"rm", "-rf", dir, NULL}, false);
}
