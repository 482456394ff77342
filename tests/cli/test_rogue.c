/* A rogue process beside a sealed cluster (issue 16): real `cairn node` processes on
 * 127.0.0.1 sealed by one secret, and a rogue that speaks cairn's link protocol (the
 * link library itself) with a wrong secret, and then with none. While a streamed request
 * is in flight on a node (its runner held with SIGSTOP so the request stays open), the
 * rogue tries to join, to ask for the event log and a snapshot (read state), to send a
 * command (place an instance), to send forged output lines for the running task with
 * huge and negative sequence numbers, and to offer a crafted model file (a model of its
 * own in a report, served from an HTTP listener of its own). None succeeds: the rogue
 * never sees a peer come up, nothing it sent reaches a node (no such instance, no such
 * model, nobody ever connects to its file listener), the request ends with the runner's
 * own text, the cluster keeps its two nodes, and the node logs why it refused the
 * connections. The model file route refuses forged tokens too, and logs why. */
#include "nodes.h"
#include "testutil.h"

#include "base/err.h"
#include "net/link.h"
#include "node/node.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SECRET "sealed-rogue-test"

/* A listener on 127.0.0.1 where the rogue would serve its crafted file: anyone who
 * connects is counted. */
static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int accepted(int lfd)
{
    int n = 0;
    for (int fd; (fd = accept(lfd, NULL, NULL)) >= 0; n++)
        close(fd);
    return n;
}

/* One rogue with secret (NULL: none) against node p, whose task is in flight: every
 * attempt, then the checks that it got nowhere. */
static void rogue_attempts(const char *secret, const struct proc *p, const char *task, int file_port)
{
    const char *what = secret ? "a wrong secret" : "no secret";
    char err[256], ep[64];
    struct link *rogue = NULL;
    struct link_config lc = {.node_id = "rogue-peer-0002", .bind_addr = "127.0.0.1", .secret = secret};
    CHECK(link_create(&rogue, &lc, err, sizeof err) == 0, "rogue link with %s: %s", what, err);
    if (!rogue)
        return;
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p->cluster);
    CHECK(link_connect(rogue, ep, err, sizeof err) == 0, "the rogue dials node %s: %s", p->id, err);
    bool up = false;
    int refused = 0, tries = 0;
    char line[1024];
    for (double t0 = now_s(); now_s() - t0 < 6;) {
        struct link_msg msg;
        if (link_poll(rogue, 100, &msg) == 1 && msg.event == LINK_EV_PEER_UP)
            up = true;
        /* join, read, command, forged outputs, a model of its own: to the node and to
         * everyone it could reach */
        const char *peers[] = {p->id, NULL};
        for (int k = 0; k < 2; k++) {
            struct {
                int type;
                const char *body;
            } m[] = {
                {LINK_T_EVENT_REQUEST, "{\"term\":0,\"index\":0}"},
                {LINK_T_COMMAND, "{\"kind\":\"PlaceInstance\",\"command_id\":\"rogue-cmd\",\"model_id\":\"m1\","
                                 "\"instance_id\":\"rogue-instance\"}"},
                {LINK_T_REPORT, line},
                {NODE_T_TASK_OUTPUT, line},
            };
            snprintf(line, sizeof line,
                     "{\"node_id\":\"rogue-peer-0002\",\"models\":[{\"id\":\"rogue-model\",\"size\":4096,"
                     "\"url\":\"http://127.0.0.1:%d\"}]}", file_port);
            m[2].body = strdup(line);
            snprintf(line, sizeof line,
                     "{\"type\":\"output\",\"task_id\":\"%s\",\"seq\":%s,\"content\":\"EVIL\",\"reasoning\":\"\"}", task,
                     tries % 2 ? "-2147483649" : "9223372036854775807");
            for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
                int rc = link_send(rogue, peers[k], m[i].type, m[i].body, strlen(m[i].body));
                tries++;
                refused += peers[k] ? rc == CAIRN_ENOTFOUND : rc == 0;
            }
            free((char *)m[2].body);
        }
    }
    CHECK(!up, "with %s the rogue never links to node %s", what, p->id);
    CHECK(refused == tries && tries > 0, "with %s none of the rogue's %d messages had a peer to go to (%d)", what,
          tries, refused);
    struct link_stats ls;
    link_get_stats(rogue, &ls);
    printf("rogue with %s: %llu handshakes failed\n", what, (unsigned long long)ls.handshake_failed);
    link_release(rogue);
}

static void test_rogue(void)
{
    static char out[1 << 18];
    char task[128];
    start_node(0, -1, SECRET, "2G", NULL);
    start_node(1, 0, SECRET, "2G", NULL);
    CHECK(read_id(0) && read_id(1), "both nodes answer /node_id");
    int both[2] = {0, 1};
    CHECK(wait_agree(both, 2, 2, NULL, 0, 30) >= 0, "the two sealed nodes form one cluster");
    int st = 0;
    for (double t0 = now_s(); now_s() - t0 < 60 && st != 200; sleep_ms(200))
        st = complete(0, out, sizeof out);
    CHECK(st == 200, "node 0 places m1 and answers (%d: %.200s)", st, out);

    /* A request in flight: its runner held while the rogue tries. */
    pid_t runner = 0;
    for (int i = 0; i < 2 && !runner; i++)
        runner = runner_child(nodes[i].pid);
    CHECK(runner > 0, "a node runs m1's runner");
    int fd = -1;
    bool have_task = false;
    if (runner > 0)
        fd = hold_stream(0, runner, task, sizeof task, &have_task);
    int file_port = 0, lfd = listen_any(&file_port);
    CHECK(lfd >= 0, "the rogue's file listener");
    if (have_task)
        for (int n = 0; n < 2; n++)
            rogue_attempts(n ? NULL : "not-" SECRET, &nodes[n], task, file_port);
    release_stream(runner, fd, out, sizeof out);

    /* Nothing the rogue sent took effect. */
    for (int i = 0; i < 2; i++) {
        st = http(nodes[i].api, "GET", "/state", NULL, out, sizeof out);
        CHECK(st == 200 && !strstr(out, "rogue"), "node %d's state knows nothing of the rogue", i);
        json_t *s = json_loads(out, 0, NULL);
        CHECK(json_object_size(json_object_get(s, "nodes")) == 2, "node %d still sees two nodes", i);
        json_decref(s);
        st = http(nodes[i].api, "GET", "/v1/models", NULL, out, sizeof out);
        CHECK(st == 200 && strstr(out, "\"m1\"") && !strstr(out, "rogue-model"), "node %d lists no rogue model: %.200s",
              i, out);
    }
    CHECK(accepted(lfd) == 0, "nobody fetched the rogue's crafted file");
    close(lfd);
    CHECK(complete(1, out, sizeof out) == 200, "the cluster still answers through node 1");

    /* The model file route: a forged token is refused and logged. */
    char head[2048];
    st = http_ex(nodes[1].api, "GET", "/files/models/m1",
                 "X-Cairn-Node: rogue-peer-0002\r\nX-Cairn-Auth: 1700000000:00112233\r\n", NULL, out, sizeof out, head,
                 sizeof head);
    CHECK(st == 401, "a forged file token: %d %.200s", st, out);
    st = http_ex(nodes[1].api, "GET", "/files/models/m1", NULL, NULL, out, sizeof out, head, sizeof head);
    CHECK(st == 401, "no file token: %d %.200s", st, out);

    /* Why, in the logs: the links refused the handshakes, the file route the token. */
    for (int i = 0; i < 2; i++) {
        int rc = run_cmd("grep -Eq 'refused a connection from|incoming handshake .* failed' '%s'", nodes[i].log);
        CHECK(rc == 0, "node %d logged why it refused the rogue's connections", i);
        if (rc)
            print_log_tail(i);
    }
    CHECK(run_cmd("grep -q 'files: /files/models/m1 from rogue-peer-0002 .* refused' '%s'", nodes[1].log) == 0,
          "node 1 logged why it refused the forged file token");
    for (int i = 0; i < 2; i++)
        stop_node(i);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    unsetenv("CAIRN_CLUSTER_SECRET");
    if (!nodes_setup("rogue"))
        return test_main_end();
    RUN(test_rogue);
    nodes_teardown();
    return test_main_end();
}
