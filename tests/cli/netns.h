/* Network namespaces of a test's own, for the tests that run `cairn node` processes
 * inside them (test_discovery_nodes.c, test_pipeline_netns.c). The test names them in a
 * struct netns, makes them (netns_add) and the links between them, starts each node with
 * netns_spawn (a child that enters its namespace and checks it left ours before exec),
 * speaks to the nodes through sockets made inside a namespace (netns_connect), and
 * deletes them in netns_close; a janitor process deletes them when the test dies any
 * other way. Nothing here touches the machine's own interfaces. */
#ifndef CAIRN_TESTS_CLI_NETNS_H
#define CAIRN_TESTS_CLI_NETNS_H

#include <stdbool.h>
#include <sys/types.h>

#define NETNS_MAX 8

struct netns {
    int n;                     /* how many names the test set */
    char names[NETNS_MAX][64]; /* "" for one that is not ours to delete */
    char home[64];             /* readlink of /proc/self/ns/net, e.g. "net:[4026531840]" */
    int home_fd;               /* our own network namespace, to come back to */
    bool lost_home;            /* setns back to it failed: stop at once */
};

/* Opens our own namespace into ns (the names are the test's to set). NULL when this test
 * can make namespaces here, else why not, for test_skip: not root, no `ip`, or no
 * /proc/self/ns/net. */
const char *netns_open(struct netns *ns);
/* `ip netns add` of every name; false when one fails (it and the later ones are then
 * blanked, not ours to delete), after printing "skipped: ..." with which. */
bool netns_add(struct netns *ns);
/* `ip netns del` of every name that is not blank. */
void netns_delete(const struct netns *ns);
/* A process that deletes the namespaces and dir (kept with CAIRN_TEST_KEEP) once the
 * test is gone, however it ends: it reads a pipe whose only writer is the test (*wfd)
 * until the end of file. Its pid, or -1. */
pid_t netns_janitor(const struct netns *ns, const char *dir, int *wfd);
/* A TCP socket made inside namespace i (we are back in ours on return), with send and
 * receive timeouts of timeout_s, connected to addr:port. -1 on failure (ns->lost_home
 * set when we could not come back). */
int netns_connect(struct netns *ns, int i, const char *addr, int port, int timeout_s);
/* Starts argv in namespace i, its output into log, killed when the test dies; env: what
 * to change in its environment, each "NAME=VALUE" (set) or "NAME" (unset), NULL-ended,
 * or NULL. The child exits 126 when it cannot enter the namespace, 125 when it is still
 * in ours, 124 when env fails. The pid, or -1. */
pid_t netns_spawn(const struct netns *ns, int i, const char *log, const char *const *argv,
    const char *const *env);
/* The end: deletes the namespaces, closes wfd and waits for the janitor (bound 30 s),
 * checks that no namespace is left and that every setns came back home, closes home_fd,
 * and removes dir unless CAIRN_TEST_KEEP. */
void netns_close(struct netns *ns, pid_t janitor, int wfd, const char *dir);

#endif
