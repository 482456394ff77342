/* End to end with the cairn binary: real `cairn node` processes on 127.0.0.1 with
 * --discovery off and --peer, speaking HTTP to their APIs. Three nodes join (one takes
 * the cluster secret from CAIRN_CLUSTER_SECRET, two from --cluster-secret) and show the
 * same /state; a model made with `cairn mkmodel` is placed, seen everywhere and
 * deleted; an explicit instance's runner survives the master's kill -9 while another
 * node takes over (same runner, Ready, no restart, still answers a completion); a node
 * with a wrong cluster secret never appears; garbage on the API and cluster ports leaves
 * the nodes serving; SIGTERM exits 0. A node with --api-key and --cors refuses every
 * route without the key and answers CORS only for its origin. A rogue peer of an open
 * cluster that forges a task's output lines is refused, and the request ends with the
 * runner's own text; a foreign Host header is refused on every route (DNS rebinding). Every wait is bounded; the
 * measured times are printed as "figure:" lines (bench/cluster.sh collects them; they
 * are not assertions). Children die with
 * this process (PR_SET_PDEATHSIG), and the temp dir is removed at the end. */
#define _GNU_SOURCE /* memmem */
#include "nodes.h"
#include "testutil.h"

#include "net/keys.h"
#include "net/link.h"
#include "node/node.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SECRET "e2e-secret"



























#define KEY "k-3f9a"
#define AUTH "Authorization: Bearer " KEY "\r\n"
#define ORIGIN "http://example.test"



/* An API on an address other machines reach wants a key: made at first start (shown,
 * kept in the data dir with mode 0600, the same after a restart), or none with
 * --api-insecure. The node listens on 0.0.0.0 for a few seconds; every request goes to
 * 127.0.0.1. */
static void test_api_exposed(void)
{
    static char out[1 << 16];
    char key[256] = "", key2[256] = "", path[600], auth[400];
    const char *extra[] = {"--api-host", "0.0.0.0", NULL};
    for (int round = 0; round < 2; round++) {
        start_node(4, -1, NULL, "1G", extra);
        struct proc *p = &nodes[4];
        int st = -1;
        for (double t0 = now_s(); now_s() - t0 < 20 && st != 401; sleep_ms(100))
            st = http(p->api, "GET", "/node_id", NULL, out, sizeof out);
        CHECK(st == 401, "round %d: without a key the exposed API answers 401: %d %.200s", round, st, out);
        snprintf(path, sizeof path, "%s/data4/api_key", nodes_dir);
        struct stat sb;
        CHECK(read_line(path, round ? key2 : key, sizeof key) && stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600,
              "round %d: the key is kept in %s, mode 0600", round, path);
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", round ? key2 : key);
        st = http_ex(p->api, "GET", "/node_id", auth, NULL, out, sizeof out, NULL, 0);
        CHECK(st == 200, "round %d: with the kept key: %d %.200s", round, st, out);
        char cmd[800];
        snprintf(cmd, sizeof cmd, "grep -q 'made now' '%s'", p->log);
        CHECK(run_cmd("%s", cmd) == (round ? 1 : 0), "round %d: the log says the key was %s", round,
              round ? "kept" : "made now");
        snprintf(cmd, sizeof cmd, "grep -q 'this cluster is open' '%s'", p->log);
        CHECK(run_cmd("%s", cmd) == 0, "a node without a secret warns that its cluster is open");
        stop_node(4);
    }
    CHECK(key[0] && !strcmp(key, key2) && strlen(key) >= 32, "the same key after a restart (%zu hex digits)",
          strlen(key));
    /* A sealed cluster's nodes share one key, derived from the secret. */
    char ck[KEYS_HEX], derived[KEYS_HEX], err[256];
    CHECK(keys_cluster_key(SECRET, "", ck, err, sizeof err) == 0, "cluster key: %s", err);
    keys_api_key(ck, derived);
    start_node(4, -1, SECRET, "1G", extra);
    int st = -1;
    for (double t0 = now_s(); now_s() - t0 < 20 && st != 401; sleep_ms(100))
        st = http(nodes[4].api, "GET", "/node_id", NULL, out, sizeof out);
    CHECK(st == 401, "a sealed node's exposed API wants a key: %d", st);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", derived);
    st = http_ex(nodes[4].api, "GET", "/node_id", auth, NULL, out, sizeof out, NULL, 0);
    CHECK(st == 200 && strcmp(derived, key), "the key derived from the cluster secret answers: %d %.200s", st, out);
    stop_node(4);
    const char *insecure[] = {"--api-host", "0.0.0.0", "--api-insecure", NULL};
    start_node(4, -1, NULL, "1G", insecure);
    st = -1;
    for (double t0 = now_s(); now_s() - t0 < 20 && st != 200; sleep_ms(100))
        st = http(nodes[4].api, "GET", "/node_id", NULL, out, sizeof out);
    CHECK(st == 200, "--api-insecure serves without a key: %d %.200s", st, out);
    stop_node(4);
}

/* A non-blocking socket connecting to 127.0.0.1:port from source address src, or -1. */
static int connect_nb(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, src, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&from, sizeof from) ||
        (connect(fd, (struct sockaddr *)&to, sizeof to) && errno != EINPROGRESS)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* One request from source address src (blocking, bound 30 s: generous, as the node may
 * be answering hundreds of hostile connections on a loaded machine); the status, 0 if none. */
static int request_from(const char *src, int port, const char *req, size_t len, char *out, size_t cap)
{
    out[0] = 0;
    int fd = connect_nb(src, port);
    if (fd < 0)
        return 0;
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    struct pollfd pw = {.fd = fd, .events = POLLOUT};
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t got = 0;
    if (poll(&pw, 1, 30000) == 1 && send_all(fd, req, len)) {
        ssize_t n;
        while (got + 1 < cap && (n = recv(fd, out + got, cap - 1 - got, 0)) > 0)
            got += (size_t)n;
    }
    out[got] = 0;
    close(fd);
    int st = 0;
    sscanf(out, "HTTP/1.%*d %d", &st);
    return st;
}

/* Exhaustion: 300 slow-loris connections and 300 idle /events subscribers from one
 * client leave another client's request answered; a 16 MiB body of 5.6 million empty
 * objects is refused with 413 before it is parsed, and the node's RSS barely moves. */
static void test_exhaustion(void)
{
    static char out[1 << 16];
    start_node(4, -1, NULL, "1G", NULL);
    struct proc *p = &nodes[4];
    CHECK(read_id(4), "node 4 answers");
    enum { N = 300 };
    static int slow[N], sse[N];
    const char *partial = "GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    const char *sub = "GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n";
    for (int i = 0; i < N; i++) {
        slow[i] = connect_nb("127.0.0.1", p->api);
        sse[i] = connect_nb("127.0.0.1", p->api);
    }
    sleep_ms(500);
    int sent = 0;
    for (int i = 0; i < N; i++) { /* what has connected by now gets its bytes */
        sent += slow[i] >= 0 && send(slow[i], partial, strlen(partial), MSG_NOSIGNAL) > 0;
        sent += sse[i] >= 0 && send(sse[i], sub, strlen(sub), MSG_NOSIGNAL) > 0;
    }
    printf("info: %d of %d hostile connections sent their bytes\n", sent, 2 * N);
    int64_t rss0 = rss_kib(p->pid);
    const char *get = "GET /node_id HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    double t0 = now_s();
    int st = request_from("127.0.0.2", p->api, get, strlen(get), out, sizeof out);
    double took = now_s() - t0;
    CHECK(st == 200 && took < 10, "another client's request is answered beside them: %d in %.2f s", st, took);
    printf("figure: a request beside 300 slow-loris and 300 idle SSE connections answered in %.3f s\n", took);
    size_t n = (16u << 20) / 3, len = 3 * n + 1;
    char *req = malloc(len + 512);
    int h = snprintf(req, 512, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                     "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
    char *b = req + h;
    b[0] = '[';
    for (size_t i = 0; i < n; i++)
        memcpy(b + 1 + 3 * i, "{},", 3);
    b[len - 1] = ']';
    st = request_from("127.0.0.2", p->api, req, (size_t)h + len, out, sizeof out);
    free(req);
    int64_t rss1 = rss_kib(p->pid);
    CHECK(st == 413 && strstr(out, "values"), "a 16 MiB body of empty objects: %d %.200s", st, strstr(out, "\r\n\r\n"));
#if defined(__SANITIZE_ADDRESS__)
    int64_t rss_bound = 256 * 1024; /* ASan's quarantine keeps freed buffers (the body's) resident */
#else
    int64_t rss_bound = 64 * 1024;
#endif
    CHECK(rss0 > 0 && rss1 - rss0 < rss_bound, "the node's RSS grew by %lld KiB (< %lld KiB)", (long long)(rss1 - rss0),
          (long long)rss_bound);
    printf("figure: RSS %lld -> %lld KiB across the 16 MiB body\n", (long long)rss0, (long long)rss1);
    for (int i = 0; i < N; i++) {
        if (slow[i] >= 0)
            close(slow[i]);
        if (sse[i] >= 0)
            close(sse[i]);
    }
    /* the server sees the 600 closes in its own time; until then 127.0.0.1 is at its limit */
    int again = 0;
    for (double t1 = now_s(); now_s() - t1 < 20 && again != 200; sleep_ms(200))
        again = http(p->api, "GET", "/node_id", NULL, out, sizeof out);
    CHECK(again == 200, "node 4 still answers its usual client once the hostile connections are closed: %d", again);
    stop_node(4);
}

/* One node with --api-key and --cors: every route wants the key (Bearer or x-api-key),
 * a listed Origin is echoed in Access-Control-Allow-Origin (on refusals too, so a page
 * can read them), another gets no allow header, and a preflight needs no key. */
static void test_api_key_cors(void)
{
    static char out[1 << 16];
    char head[8192], v[256];
    const char *extra[] = {"--api-key", KEY, "--cors", ORIGIN, NULL};
    start_node(4, -1, SECRET, "1G", extra);
    struct proc *p = &nodes[4];
    int st = -1;
    for (double t0 = now_s(); now_s() - t0 < 20 && st != 200; sleep_ms(100))
        st = http_ex(p->api, "GET", "/node_id", AUTH, NULL, out, sizeof out, NULL, 0);
    CHECK(st == 200 && strstr(out, "node_id"), "the keyed node answers /node_id with the key: %d %s",
          st, out);
    if (st != 200) {
        print_log_tail(4);
        goto done;
    }

    const char *paths[] = {"/state", "/v1/models", "/events", "/node_id", "/models"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        st = http_ex(p->api, "GET", paths[i], NULL, NULL, out, sizeof out, head, sizeof head);
        CHECK(st == 401 && strstr(out, "API key") && header_of(head, "WWW-Authenticate", v, sizeof v) &&
                  !strcmp(v, "Bearer"),
              "GET %s without the key: %d %s (WWW-Authenticate '%s')", paths[i], st, out, v);
        st = http_ex(p->api, "GET", paths[i], "Authorization: Bearer not-" KEY "\r\n", NULL, out,
                     sizeof out, NULL, 0);
        CHECK(st == 401, "GET %s with a wrong key: %d %s", paths[i], st, out);
        st = http_ex(p->api, "GET", paths[i], AUTH, NULL, out, sizeof out, NULL, 0);
        CHECK(st == 200, "GET %s with the key: %d %.300s", paths[i], st, out);
    }
    size_t n_nodes = 0;
    for (double t0 = now_s(); now_s() - t0 < 20 && n_nodes != 1; sleep_ms(100)) {
        st = http_ex(p->api, "GET", "/state", AUTH, NULL, out, sizeof out, NULL, 0);
        json_t *j = json_loads(out, 0, NULL);
        n_nodes = st == 200 ? json_object_size(json_object_get(j, "nodes")) : 0;
        json_decref(j);
    }
    CHECK(n_nodes == 1, "/state with the key shows the node within 20 s: %.300s", out);
    st = http_ex(p->api, "GET", "/state", "x-api-key: " KEY "\r\n", NULL, out, sizeof out, NULL, 0);
    CHECK(st == 200, "GET /state with x-api-key: %d %.300s", st, out);
    st = http_ex(p->api, "POST", "/place_instance", NULL, "{\"model_id\":\"m1\"}", out, sizeof out, NULL, 0);
    CHECK(st == 401, "POST /place_instance without the key: %d %s", st, out);

    /* The SSE stream of /events wants the key too. */
    st = http_ex(p->api, "GET", "/events", "Accept: text/event-stream\r\n", NULL, out, sizeof out, NULL, 0);
    CHECK(st == 401, "SSE /events without the key: %d %s", st, out);
    int fd = connect_to(p->api, 2000);
    const char *sse = "GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n" AUTH "\r\n";
    CHECK(fd >= 0 && send_all(fd, sse, strlen(sse)) && sse_wait(fd, "200", 10),
          "SSE /events with the key starts with 200");
    if (fd >= 0)
        close(fd);

    /* CORS on plain requests: a listed origin is echoed, another is not. */
    st = http_ex(p->api, "GET", "/state", AUTH "Origin: " ORIGIN "\r\n", NULL, out, sizeof out, head,
                 sizeof head);
    CHECK(st == 200 && header_of(head, "Access-Control-Allow-Origin", v, sizeof v) && !strcmp(v, ORIGIN),
          "GET /state from %s: %d, Access-Control-Allow-Origin '%s'", ORIGIN, st, v);
    CHECK(header_of(head, "Vary", v, sizeof v) && strstr(v, "Origin"), "and Vary: Origin ('%s')", v);
    st = http_ex(p->api, "GET", "/state", "Origin: " ORIGIN "\r\n", NULL, out, sizeof out, head, sizeof head);
    CHECK(st == 401 && header_of(head, "Access-Control-Allow-Origin", v, sizeof v) && !strcmp(v, ORIGIN),
          "a refusal from %s carries the allow header too: %d '%s'", ORIGIN, st, v);
    st = http_ex(p->api, "GET", "/v1/models", AUTH "Origin: http://other.test\r\n", NULL, out, sizeof out,
                 head, sizeof head);
    CHECK(st == 200 && !header_of(head, "Access-Control-Allow-Origin", v, sizeof v),
          "GET /v1/models from an unlisted origin: %d, no allow header (got '%s')", st, v);
    st = http_ex(p->api, "GET", "/v1/models", AUTH, NULL, out, sizeof out, head, sizeof head);
    CHECK(st == 200 && !header_of(head, "Access-Control-Allow-Origin", v, sizeof v),
          "no Origin, no allow header: %d '%s'", st, v);

    /* Preflight: no key needed; the listed origin gets the methods and headers. */
    const char *pre = "Origin: " ORIGIN "\r\nAccess-Control-Request-Method: POST\r\n"
                      "Access-Control-Request-Headers: authorization, content-type\r\n";
    st = http_ex(p->api, "OPTIONS", "/v1/completions", pre, NULL, out, sizeof out, head, sizeof head);
    bool allow = header_of(head, "Access-Control-Allow-Origin", v, sizeof v) && !strcmp(v, ORIGIN);
    CHECK(st == 204 && allow, "preflight from %s: %d, allow origin '%s'", ORIGIN, st, v);
    CHECK(header_of(head, "Access-Control-Allow-Methods", v, sizeof v) && strstr(v, "POST"),
          "the preflight allows POST ('%s')", v);
    bool hdrs = header_of(head, "Access-Control-Allow-Headers", v, sizeof v);
    for (char *c = v; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    CHECK(hdrs && strstr(v, "authorization"), "the preflight allows the Authorization header ('%s')", v);
    pre = "Origin: http://other.test\r\nAccess-Control-Request-Method: GET\r\n";
    st = http_ex(p->api, "OPTIONS", "/state", pre, NULL, out, sizeof out, head, sizeof head);
    CHECK(st == 403 && !header_of(head, "Access-Control-Allow-Origin", v, sizeof v),
          "preflight from an unlisted origin: %d, allow header '%s'", st, v);

    kill(p->pid, SIGTERM);
    int code = wait_exit(p->pid, 15);
    p->pid = 0;
    CHECK(code == 0, "the keyed node exits 0 on SIGTERM (got %d)", code);
done:
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}



/* The status of one request to node p's API with Host: host, the header lines in
 * headers (default: a JSON content type) and body (or NULL). */
static int status_with_host(const struct proc *p, const char *method, const char *path, const char *host,
                            const char *headers, const char *body)
{
    int fd = connect_to(p->api, 5000);
    if (fd < 0)
        return -1;
    char req[1024], buf[256];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, host, headers ? headers : "Content-Type: application/json\r\n",
                     body ? strlen(body) : 0, body ? body : "");
    int status = -1;
    if (n > 0 && (size_t)n < sizeof req && send_all(fd, req, (size_t)n)) {
        ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
        buf[r > 0 ? r : 0] = 0;
        if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
            status = -1;
    }
    close(fd);
    return status;
}

/* DNS rebinding: a page whose name points at the node reaches it with that name in
 * Host; the node answers only IP literals, localhost, its machine's name and its
 * --allowed-host names (node 5 allows cairn.test). */
static void check_hosts(const struct proc *p)
{
    const char *place = "{\"model_id\":\"m1\",\"min_nodes\":1}";
    const char *chat = "{\"model\":\"m1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}";
    CHECK(status_with_host(p, "POST", "/place_instance", "evil.example", NULL, place) == 403,
          "place_instance with a foreign Host is refused");
    CHECK(status_with_host(p, "POST", "/v1/chat/completions", "evil.example:80", NULL, chat) == 403,
          "a chat with a foreign Host is refused");
    CHECK(status_with_host(p, "GET", "/events", "evil.example", NULL, NULL) == 403,
          "/events with a foreign Host is refused");
    CHECK(status_with_host(p, "GET", "/node_id", "cairn.test:52415", NULL, NULL) == 200,
          "an --allowed-host name is answered");
    CHECK(status_with_host(p, "GET", "/node_id", "localhost:52415", NULL, NULL) == 200, "localhost is answered");
    /* A page on another site posting text/plain (no preflight needed) to the real address. */
    const char *page = "Origin: http://evil.example\r\nContent-Type: text/plain\r\n";
    CHECK(status_with_host(p, "POST", "/place_instance", "127.0.0.1", page, place) == 415,
          "a page's text/plain place_instance is refused");
    CHECK(status_with_host(p, "POST", "/v1/chat/completions", "localhost", page, chat) == 415,
          "a page's text/plain chat is refused");
}


/* A peer of an open cluster (no secret) that forges a task's output: a rogue process
 * speaking the link protocol joins node 5, and while node 5's runner is stopped with a
 * request in flight, sends output lines for that task, with the seq of a real sequence,
 * 2147483648, -1, a string and none, each with the text EVIL, and a "done". The node
 * refuses every line (only the node that runs the task speaks for it), says so in its
 * log, and the request ends with the runner's own text once it runs again. */
/* The rogue asks node 5 (its master) for a TextGeneration: naming another node as the
 * requester is refused at once; naming itself is taken, but it never sends the body, so
 * the first rank's worker fails the task with a reason within seconds. */
static void rogue_text_generation(struct link *rogue, const struct proc *p)
{
    char iid[128] = "", cmd[512];
    CHECK(some_instance(5, iid, sizeof iid), "node 5 has an instance");
    const char *requesters[] = {p->id, "rogue-peer-0001"};
    int code[2] = {1, 1};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "{\"kind\":\"TextGeneration\",\"command_id\":\"rogue-cmd-%d\",\"task_id\":\"rogue-task-%d\","
                 "\"instance_id\":\"%s\",\"node_id\":\"%s\",\"bytes\":10}",
                 k, k, iid, requesters[k]);
        CHECK(link_send(rogue, p->id, LINK_T_COMMAND, cmd, strlen(cmd)) == 1, "rogue command %d sent", k);
        struct link_msg msg;
        for (double t0 = now_s(); now_s() - t0 < 30 && code[k] == 1;) {
            if (link_poll(rogue, 100, &msg) != 1 || msg.event != LINK_EV_MESSAGE || msg.type != NODE_T_COMMAND_RESULT)
                continue;
            json_t *j = json_loadb(msg.data, msg.len, 0, NULL);
            if (j && strstr(json_string_value(json_object_get(j, "command_id")) ?: "", k ? "-1" : "-0"))
                code[k] = (int)json_integer_value(json_object_get(j, "code"));
            json_decref(j);
        }
    }
    CHECK(code[0] < 0, "a TextGeneration naming node 5 as requester is refused (code %d)", code[0]);
    CHECK(code[1] == 0, "a TextGeneration naming the rogue itself is taken (code %d)", code[1]);
    /* A finished task leaves the state at once: its end is read from the log. */
    bool failed = false;
    static char out[1 << 20];
    for (double t0 = now_s(); code[1] == 0 && now_s() - t0 < 40 && !failed; sleep_ms(200)) {
        struct link_msg msg;
        link_poll(rogue, 0, &msg); /* keep the rogue's link serviced while it waits */
        failed = http(p->api, "GET", "/events", NULL, out, sizeof out) == 200 &&
                 strstr(out, "the request of task rogue-task-1 never arrived");
    }
    CHECK(failed, "the task whose body never came fails with a reason within 40 s");
    CHECK(!strstr(out, "rogue-task-0"), "the refused command made no task");
}


/* A request's text never enters the replicated state: not in any node's /state or
 * /events, nor in any file of its data folder (the event log among them). */
static void check_marker_nowhere(const int *idx, int n, const char *marker)
{
    char out[1 << 16], path[600];
    for (int k = 0; k < n; k++) {
        int i = idx[k];
        static char big[4 << 20];
        CHECK(http(nodes[i].api, "GET", "/state", NULL, big, sizeof big) == 200 && !strstr(big, marker),
              "node %d's /state lacks the prompt", i);
        CHECK(http(nodes[i].api, "GET", "/events", NULL, big, sizeof big) == 200 && strstr(big, "TaskCreated") &&
                  !strstr(big, marker),
              "node %d's /events has the task but not its prompt", i);
        snprintf(path, sizeof path, "%s/data%d", nodes_dir, i);
        DIR *d = opendir(path);
        int files = 0;
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(out, sizeof out, "%s/%s", path, e->d_name);
            files++;
            CHECK(!file_has(out, marker), "%s lacks the prompt", out);
        }
        if (d)
            closedir(d);
        CHECK(files >= 2, "node %d's data folder holds its files (%d)", i, files);
    }
}

static void test_forged_output(void)
{
    static char out[1 << 18];
    char err[256], task[128];
    const char *extra[] = {"--allowed-host", "cairn.test", NULL};
    start_node(5, -1, NULL, "2G", extra);
    struct proc *p = &nodes[5];
    CHECK(read_id(5), "the open node answers /node_id");
    int sst = http(p->api, "GET", "/state", NULL, out, sizeof out);
    CHECK(sst == 200 && strstr(out, "\"open\":true"), "/state of a node without a secret says it is open");
    check_hosts(p);
    int st = 0;
    for (double t0 = now_s(); now_s() - t0 < 60 && st != 200; sleep_ms(200))
        st = complete(5, out, sizeof out);
    CHECK(st == 200, "node 5 places m1 and answers (%d: %.200s)", st, out);

    struct link *rogue = NULL;
    struct link_config lc = {.node_id = "rogue-peer-0001", .bind_addr = "127.0.0.1"};
    CHECK(link_create(&rogue, &lc, err, sizeof err) == 0, "rogue link: %s", err);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p->cluster);
    CHECK(rogue && link_connect(rogue, ep, err, sizeof err) == 0, "rogue connects: %s", err);
    bool joined = false;
    struct link_msg msg;
    for (double t0 = now_s(); rogue && now_s() - t0 < 20 && !joined;)
        joined = link_poll(rogue, 100, &msg) == 1 && msg.event == LINK_EV_PEER_UP && !strcmp(msg.peer, p->id);
    CHECK(joined, "the rogue is linked to node 5 (an open cluster lets it)");

    pid_t runner = runner_child(p->pid);
    CHECK(runner > 0, "node 5 has a runner");
    int fd = -1;
    bool have_task = false;
    if (joined && runner > 0)
        fd = hold_stream(5, runner, task, sizeof task, &have_task);
    if (have_task) {
        const char *seqs[] = {"0", "2147483648", "-1", "\"0\"", NULL};
        for (int k = 0; k < 5; k++) {
            char line[512];
            if (seqs[k])
                snprintf(line, sizeof line,
                         "{\"type\":\"output\",\"task_id\":\"%s\",\"seq\":%s,\"content\":\"EVIL\",\"reasoning\":\"\"}",
                         task, seqs[k]);
            else
                snprintf(line, sizeof line, "{\"type\":\"output\",\"task_id\":\"%s\",\"content\":\"EVIL\"}", task);
            CHECK(link_send(rogue, p->id, NODE_T_TASK_OUTPUT, line, strlen(line)) == 1, "forged line %d sent", k);
            snprintf(line, sizeof line, "{\"type\":\"start\",\"task_id\":\"%s\",\"prompt_tokens\":1,\"cached_tokens\":0}",
                     task);
            link_send(rogue, p->id, NODE_T_TASK_OUTPUT, line, strlen(line));
        }
        char done[256];
        snprintf(done, sizeof done,
                 "{\"type\":\"done\",\"task_id\":\"%s\",\"finish\":\"error\",\"n_generated\":0,\"error\":\"EVIL\"}", task);
        link_send(rogue, p->id, NODE_T_TASK_OUTPUT, done, strlen(done));
        for (double t0 = now_s(); now_s() - t0 < 1;) /* let them arrive while the runner sleeps */
            link_poll(rogue, 100, &msg);
    }
    release_stream(runner, fd, out, sizeof out);
    if (joined)
        rogue_text_generation(rogue, p);
    link_release(rogue);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "grep -c 'output line from node rogue-peer-0001, which does not run it' '%s' >/dev/null",
             p->log);
    CHECK(!have_task || run_cmd("%s", cmd) == 0, "node 5 logged why it refused the rogue's well-formed lines");
    snprintf(cmd, sizeof cmd, "grep -c 'task line from node rogue-peer-0001 was refused: output.seq' '%s' >/dev/null",
             p->log);
    CHECK(!have_task || run_cmd("%s", cmd) == 0, "node 5 logged why it refused the rogue's malformed lines");
    snprintf(cmd, sizeof cmd, "grep -q 'request of task rogue-task-1 never arrived from node rogue-peer-0001' '%s'",
             p->log);
    CHECK(!joined || run_cmd("%s", cmd) == 0, "node 5 logged why it failed the rogue's task");
    CHECK(complete(5, out, sizeof out) == 200, "node 5 still answers after the rogue's lines");
    kill(p->pid, SIGTERM);
    CHECK(wait_exit(p->pid, 30) == 0, "node 5 exits 0 on SIGTERM");
    p->pid = 0;
}

/* Waits (20 s at most) until node i's log holds s. */
static bool wait_log(int i, const char *s)
{
    bool found = false;
    for (double t0 = now_s(); now_s() - t0 < 20 && !(found = file_has(nodes[i].log, s)); sleep_ms(100))
        ;
    return found;
}

/* The reading of DATA_DIR/bandwidth.json: its block and bytes/s (0 when unreadable). */
static double kept_bandwidth(int i, int64_t *block_mib)
{
    char path[600];
    snprintf(path, sizeof path, "%s/data%d/bandwidth.json", nodes_dir, i);
    json_t *j = json_load_file(path, 0, NULL);
    double bps = j ? json_real_value(json_object_get(j, "bytes_per_s")) : 0;
    *block_mib = j ? json_integer_value(json_object_get(j, "block_mib")) : 0;
    json_decref(j);
    return bps;
}

/* A node measures its memory bandwidth once and keeps it in its data folder: started
 * again, it takes the kept reading; with another block it measures again. (/state
 * cannot tell: a node started again replays its earlier info from its event log.) */
static void test_bandwidth_kept(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/data5/bandwidth.json", nodes_dir);
    /* a data folder of its own: node 5's earlier log would start a runner beside the probe,
     * and a reading taken beside a runner is not kept */
    run_cmd("rm -rf '%s/data5'", nodes_dir);
    start_node(5, -1, NULL, "2G", NULL);
    CHECK(wait_log(5, "64 MiB block; measured)"), "node 5 measured its bandwidth over the 64 MiB block");
    int64_t mib = 0;
    double kept = 0;
    for (double t0 = now_s(); now_s() - t0 < 10 && (kept = kept_bandwidth(5, &mib)) == 0; sleep_ms(100))
        ; /* the file is written just after the figure is logged */
    CHECK(kept > 0 && mib == 64, "bandwidth.json holds the reading (%.0f bytes/s over %lld MiB)", kept,
          (long long)mib);
    stop_node(5);
    start_node(5, -1, NULL, "2G", NULL);
    CHECK(wait_log(5, "; kept in "), "started again, node 5 took the kept reading");
    CHECK(!file_has(nodes[5].log, "measured)"), "and did not measure again");
    stop_node(5);
    const char *other[] = {"--bandwidth-mib", "32", NULL};
    start_node(5, -1, NULL, "2G", other);
    CHECK(wait_log(5, "32 MiB block; measured)"), "with a 32 MiB block node 5 measured again");
    for (double t0 = now_s(); now_s() - t0 < 10 && (kept_bandwidth(5, &mib) == 0 || mib != 32); sleep_ms(100))
        ;
    CHECK(mib == 32, "and kept that reading (block %lld MiB)", (long long)mib);
    stop_node(5);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    static char out[1 << 20];
    char body[2048], path[512], master[80];
    unsetenv("CAIRN_CLUSTER_SECRET"); /* each node is given its secret, or none */
    if (!nodes_setup("node"))
        return test_main_end();

    RUN(test_api_key_cors);
    RUN(test_api_exposed);
    RUN(test_exhaustion);
    RUN(test_forged_output);
    RUN(test_bandwidth_kept);

    /* Three nodes join through node 0. */
    double t0 = now_s();
    /* Node 2 takes the secret from the environment; all three have it there, so that the
     * runner of whichever holds an instance shows it was not passed on. */
    setenv("CAIRN_CLUSTER_SECRET", SECRET, 1);
    start_node(0, -1, SECRET, "2G", NULL);
    char secret_file[600];
    snprintf(secret_file, sizeof secret_file, "%s/secret", nodes_dir);
    FILE *sf = fopen(secret_file, "w");
    CHECK(sf && fprintf(sf, "%s\n", SECRET) > 0, "secret file written");
    if (sf)
        fclose(sf);
    chmod(secret_file, 0600);
    const char *from_file[] = {"--cluster-secret-file", secret_file, NULL};
    start_node(1, 0, NULL, "3G", from_file); /* the same secret, from a file */
    start_node(2, 0, NULL, "4G", NULL);
    unsetenv("CAIRN_CLUSTER_SECRET");
    bool up = read_id(0) && read_id(1) && read_id(2);
    CHECK(up, "the three APIs answer /node_id");
    int all3[3] = {0, 1, 2};
    double joined = up ? wait_agree(all3, 3, 3, master, sizeof master, 30) : -1;
    CHECK(joined >= 0, "three nodes show the same /state with 3 nodes (bound 30 s)");
    double t_join = now_s() - t0;
    printf("figure: three nodes see each other %.2f s after start\n", t_join);
    if (joined < 0) {
        for (int i = 0; i < 3; i++)
            print_log_tail(i);
        goto out;
    }
    int m = index_of_id(master);
    CHECK(m >= 0, "the master %s is one of ours", master);
    printf("master: node %d (%s)\n", m, master);
    int64_t idle_rss = 0;
    for (int i = 0; i < 3; i++) {
        int64_t r = rss_kib(nodes[i].pid);
        idle_rss = r > idle_rss ? r : idle_rss;
    }
    CHECK(idle_rss > 0, "the RSS of the nodes is readable");
    printf("figure: idle node RSS %lld KiB (largest of the three, just joined)\n", (long long)idle_rss);

    /* A node with another secret: refused, never in anyone's state. */
    start_node(3, 0, "not-the-secret", "1G", NULL);
    CHECK(read_id(3), "the wrong-secret node serves its own API");

    /* Garbage on an API port and on a cluster port. */
    int fd = connect_to(nodes[1].api, 2000);
    if (fd >= 0) {
        send_all(fd, "\x16\x03\x01\x02\x00garbage\r\n\r\n\x00\xff\xfe", 17);
        recv(fd, out, 100, 0);
        close(fd);
    }
    fd = connect_to(nodes[1].api, 2000);
    if (fd >= 0) {
        const char *bad = "GET /state HTTP/1.1\r\nContent-Length: -5\r\n\r\n";
        send_all(fd, bad, strlen(bad));
        recv(fd, out, 100, 0);
        close(fd);
    }
    for (int i = 0; i < 3; i++) {
        fd = connect_to(nodes[2].cluster, 2000);
        if (fd >= 0) {
            char junk[512];
            for (size_t k = 0; k < sizeof junk; k++)
                junk[k] = (char)(k * 131 + i);
            if (i == 1) /* a ZMTP greeting start, then nonsense */
                memcpy(junk, "\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03\x00NULL", 16);
            send_all(fd, junk, sizeof junk);
            close(fd);
        }
    }
    CHECK(http(nodes[1].api, "GET", "/node_id", NULL, out, sizeof out) == 200,
          "node 1 serves after garbage on its API port");

    /* Models and previews. */
    json_t *models = get_json(nodes[1].api, "/models");
    json_t *card = json_array_get(json_object_get(models, "models"), 0);
    int n_layers = (int)json_integer_value(json_object_get(card, "n_layers"));
    CHECK(card && !strcmp(json_string_value(json_object_get(card, "id")) ?: "", "m1") && n_layers > 0,
          "GET /models lists m1 with its layers (%d)", n_layers);
    json_decref(models);
    json_t *pv = get_json(nodes[2].api, "/instance/previews?model_id=m1");
    CHECK(pv && json_array_size(json_object_get(pv, "candidates")) >= 3 &&
              json_integer_value(json_object_get(pv, "best")) >= 0,
          "previews list a candidate per node and a best one");
    json_decref(pv);
    CHECK(http(nodes[2].api, "GET", "/instance/previews?model_id=nope", NULL, out, sizeof out) == 404,
          "previews of an unknown model: 404 (%s)", out);
    CHECK(http(nodes[2].api, "GET", "/instance/previews", NULL, out, sizeof out) == 400 &&
              strstr(out, "model_id"),
          "previews without model_id: 400 (%s)", out);

    /* An SSE stream on node 2 sees what the cluster does. */
    int sse = connect_to(nodes[2].api, 1000);
    const char *sse_req = "GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n";
    /* The stream's headers come once it is subscribed, so nothing placed after is missed. */
    CHECK(sse >= 0 && send_all(sse, sse_req, strlen(sse_req)) && sse_wait(sse, "\r\n\r\n", 10),
          "the SSE stream on node 2 starts");

    /* Place from a node, see it everywhere, delete it from another. */
    int st = http(nodes[1].api, "POST", "/place_instance", "{\"model_id\":\"m1\"}", out, sizeof out);
    json_t *placed = json_loads(out, 0, NULL);
    const char *iid = json_string_value(json_object_get(placed, "instance_id"));
    CHECK(st == 200 && iid, "place_instance: %d %s", st, out);
    char inst[80] = "";
    snprintf(inst, sizeof inst, "%s", iid ? iid : "");
    json_decref(placed);
    snprintf(path, sizeof path, "/instance/%s", inst);
    CHECK(inst[0] && wait_status(all3, 3, path, 200, 15), "the instance is visible on all three nodes");
    CHECK(sse >= 0 && sse_wait(sse, "InstanceCreated", 10), "the SSE stream shows InstanceCreated");
    if (sse >= 0)
        close(sse);

    st = http(nodes[0].api, "PUT", "/instance/ghost/draft_model", "{\"draft_model\":\"m1\"}", out, sizeof out);
    CHECK(st == 404, "draft of an unknown instance: %d %s", st, out);
    snprintf(path, sizeof path, "/instance/%s/draft_model", inst);
    st = http(nodes[0].api, "PUT", path, "{\"draft_model\":\"m1\",\"num_draft_tokens\":3}", out, sizeof out);
    CHECK(st == 200 && strstr(out, "\"num_draft_tokens\":3"), "draft set: %d %s", st, out);
    st = http(nodes[0].api, "PUT", path, "{\"draft_model\":\"nope\"}", out, sizeof out);
    CHECK(st == 404, "unknown draft model: %d %s", st, out);

    st = http(nodes[2].api, "POST", "/place_instance", "{\"model_id\":\"nope\"}", out, sizeof out);
    CHECK(st == 404 && strstr(out, "nope"), "unknown model: %d %s", st, out);
    st = http(nodes[2].api, "POST", "/place_instance", "{\"model_id\":\"m1\",\"min_nodes\":\"x\"}", out, sizeof out);
    CHECK(st == 400 && strstr(out, "min_nodes"), "bad field named: %d %s", st, out);
    st = http(nodes[2].api, "POST", "/place_instance", "{\"model_id\":\"m1\",\"min_nodes\":9}", out, sizeof out);
    CHECK(st == 409 && strstr(out, "min_nodes"), "more nodes than the cluster has: %d %s", st, out);
    st = http(nodes[2].api, "POST", "/place_instance", "not json", out, sizeof out);
    CHECK(st == 400, "a body that is not JSON: %d %s", st, out);
    st = http(nodes[2].api, "DELETE", "/instance/ghost", NULL, out, sizeof out);
    CHECK(st == 404, "delete unknown: %d %s", st, out);
    st = http(nodes[2].api, "GET", "/instance/ghost", NULL, out, sizeof out);
    CHECK(st == 404, "get unknown: %d %s", st, out);
    snprintf(path, sizeof path, "/state/nodes/%s/info/cluster_port", nodes[1].id);
    st = http(nodes[0].api, "GET", path, NULL, out, sizeof out);
    CHECK(st == 200 && atoi(out) == nodes[1].cluster, "state by path: %d %s", st, out);
    st = http(nodes[0].api, "GET", "/state/nope/x", NULL, out, sizeof out);
    CHECK(st == 404, "a state path that does not exist: %d %s", st, out);
    json_t *evs = get_json(nodes[1].api, "/events");
    CHECK(evs && json_array_size(json_object_get(evs, "events")) >= 2, "GET /events lists the log");
    json_decref(evs);

    snprintf(path, sizeof path, "/instance/%s", inst);
    st = http(nodes[2].api, "DELETE", path, NULL, out, sizeof out);
    CHECK(st == 200, "delete: %d %s", st, out);
    CHECK(wait_status(all3, 3, path, 404, 15), "the instance is gone from all three nodes");

    /* An explicit instance on a node that is not the master. */
    int holder = (m + 1) % 3;
    snprintf(body, sizeof body,
             "{\"instance\":{\"instance_id\":\"keep-me\",\"model_id\":\"m1\",\"shards\":"
             "[{\"node_id\":\"%s\",\"layer_begin\":0,\"layer_end\":%d}]}}",
             nodes[holder].id, n_layers);
    st = http(nodes[holder].api, "POST", "/instance", body, out, sizeof out);
    CHECK(st == 200 && strstr(out, "keep-me"), "explicit instance: %d %s", st, out);
    st = http(nodes[holder].api, "POST", "/instance", body, out, sizeof out);
    CHECK(st == 409, "the same id again: %d %s", st, out);
    CHECK(wait_status(all3, 3, "/instance/keep-me", 200, 15), "explicit instance seen everywhere");

    /* The wrong-secret node stayed out. */
    CHECK(wait_agree(all3, 3, 3, NULL, 0, 10) >= 0, "still three nodes, all agreeing");
    st = http(nodes[0].api, "GET", "/state", NULL, out, sizeof out);
    CHECK(st == 200 && !strstr(out, nodes[3].id), "the wrong-secret node %s is not in the state",
          nodes[3].id);
    st = http(nodes[3].api, "GET", "/state", NULL, out, sizeof out);
    CHECK(st == 200 && !strstr(out, nodes[0].id), "nor are the others in its state");
    st = http(nodes[1].api, "GET", "/state", NULL, out, sizeof out);
    CHECK(st == 200 && strstr(out, "\"open\":false"), "/state of a sealed node says it is not open");

    int64_t rss = rss_kib(nodes[holder].pid);
    printf("figure: node RSS with one instance %lld KiB (its runner is another process)\n",
           (long long)rss);

    /* The instance's runner is up and answers through the third node before the kill. */
    int other = 3 - m - holder;
    char rid[80] = "", rstatus[32] = "";
    int restarts = -1;
    bool ready = false;
    for (double t1 = now_s(); now_s() - t1 < 120 && !ready; sleep_ms(200))
        ready = runner_of(holder, "keep-me", rid, sizeof rid, rstatus, sizeof rstatus, &restarts) &&
                ready_status(rstatus);
    CHECK(ready, "keep-me's runner is Ready within 120 s (runner '%s', status '%s')", rid, rstatus);
    st = complete(other, out, sizeof out);
    CHECK(st == 200, "keep-me answers a completion asked of node %d: %d %.300s", other, st, out);
    char marker[64], req[256];
    snprintf(marker, sizeof marker, "MARKER-%d-qz", (int)getpid());
    snprintf(req, sizeof req, "{\"model\":\"m1\",\"prompt\":\"%s\",\"max_tokens\":2,\"temperature\":0}", marker);
    st = http(nodes[other].api, "POST", "/v1/completions", req, out, sizeof out);
    CHECK(st == 200, "a prompt with a marker is answered through node %d: %d %.200s", other, st, out);
    check_marker_nowhere(all3, 3, marker);
    CHECK(runner_of(holder, "keep-me", rid, sizeof rid, rstatus, sizeof rstatus, &restarts),
          "keep-me's runner before the kill");
    printf("keep-me: runner %s on node %d, %s, %d restarts\n", rid, holder, rstatus, restarts);
    pid_t rpid = runner_child(nodes[holder].pid);
    char envp[128];
    snprintf(envp, sizeof envp, "/proc/%d/environ", (int)rpid);
    CHECK(rpid > 0 && run_cmd("tr '\\0' '\\n' < %s | grep -q '^CAIRN_CLUSTER_SECRET='", envp) == 1,
          "the runner (pid %d) does not inherit CAIRN_CLUSTER_SECRET", (int)rpid);

    /* kill -9 the master: another node takes over, the instance stays. */
    int survivors[2] = {holder, other};
    double tk = now_s();
    kill(nodes[m].pid, SIGKILL);
    waitpid(nodes[m].pid, NULL, 0);
    nodes[m].pid = 0;
    char master2[80] = "";
    double failover = -1;
    while (now_s() - tk < 30) {
        if (states_agree(survivors, 2, 3, master2, sizeof master2) && strcmp(master2, master)) {
            failover = now_s() - tk;
            break;
        }
        sleep_ms(50);
    }
    CHECK(failover >= 0, "a new master within 30 s of kill -9 (was %s, now '%s')", master, master2);
    printf("figure: master loss -> new master %.2f s\n", failover);
    if (failover < 0)
        for (int k = 0; k < 2; k++)
            print_log_tail(survivors[k]);
    CHECK(wait_status(survivors, 2, "/instance/keep-me", 200, 10),
          "the instance on a surviving node is still listed");

    /* The same runner, never restarted, answers again (through the non-holder survivor,
     * so the request goes through the new master). */
    double answered = -1;
    for (st = -1; now_s() - tk < 60 && st != 200; sleep_ms(200))
        if ((st = complete(other, out, sizeof out)) == 200)
            answered = now_s() - tk;
    CHECK(answered >= 0, "keep-me answers within 60 s of the kill: %d %.300s", st, out);
    printf("figure: master loss -> completion answered %.2f s\n", answered);
    for (int k = 0; k < 2; k++) {
        char rid2[80] = "", rstatus2[32] = "";
        int restarts2 = -1;
        bool found = runner_of(survivors[k], "keep-me", rid2, sizeof rid2, rstatus2, sizeof rstatus2,
                               &restarts2);
        CHECK(found && !strcmp(rid2, rid) && ready_status(rstatus2) && restarts2 == restarts,
              "node %d after the failover: runner '%s' %s with %d restarts (was '%s' %s with %d)",
              survivors[k], rid2, rstatus2, restarts2, rid, rstatus, restarts);
    }
    st = http(nodes[survivors[0]].api, "POST", "/place_instance", "{\"model_id\":\"m1\"}", out, sizeof out);
    CHECK(st == 200, "the new master places: %d %s", st, out);

    /* SIGTERM: clean exits. */
    for (int i = 0; i < MAX_NODES; i++) {
        if (nodes[i].pid <= 0)
            continue;
        kill(nodes[i].pid, SIGTERM);
        int code = wait_exit(nodes[i].pid, 15);
        nodes[i].pid = 0;
        CHECK(code == 0, "node %d exits 0 on SIGTERM (got %d)", i, code);
        if (code != 0)
            print_log_tail(i);
    }

    /* `cairn` alone (discovery on) runs only inside network namespaces:
     * tests/cli/test_discovery_nodes.c. */

out:
    nodes_teardown();
    return test_main_end();
}
