/* A cluster of real `cairn node` processes for tests: each on 127.0.0.1 with its own
 * ports (free at start), data dir under nodes_dir, --discovery off and joined by --peer;
 * HTTP to their APIs, their /state, their runners, bounded waits. Shared by the tests of
 * this folder (test_node.c, test_rogue.c). nodes_dir holds the models (m1, a tiny llama
 * made by nodes_setup) and every node's data and log; nodes_teardown removes it.
 *
 * The helpers that do not touch nodes[] (clock, sockets, the HTTP reply reader, child
 * processes, files, logs) serve the tests that start their nodes their own way too
 * (test_download_nodes.c, and the network-namespace tests test_discovery_nodes.c and
 * test_pipeline_netns.c, which keep their nodes in arrays of their own). */
#ifndef CAIRN_TESTS_CLI_NODES_H
#define CAIRN_TESTS_CLI_NODES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_NODES 6

struct proc {
    pid_t pid;
    int api, cluster;
    char id[80];
    char log[512];
};

extern char nodes_dir[256];
extern struct proc nodes[MAX_NODES];

/* Makes nodes_dir (/tmp/cairn-test-NAME-PID) and the model m1 in its models/; false (and
 * a failed check) when mkmodel failed. */
bool nodes_setup(const char *name);
/* Kills every node still running and removes nodes_dir (kept with CAIRN_TEST_KEEP). */
void nodes_teardown(void);

double now_s(void);
void sleep_ms(int ms);
/* A TCP port free right now on 127.0.0.1. */
int free_port(void);
int connect_to(int port, int timeout_ms);
bool send_all(int fd, const void *buf, size_t n);
/* Reads the HTTP answer on fd (connected, a Connection: close request sent) until the
 * peer closes it, a receive times out or 1 MiB came; its body into out and, when head is
 * not NULL, its status line and headers into head. Returns the status, or -1 when no
 * status line came. fd stays the caller's to close. */
int http_read_reply(int fd, char *out, size_t cap, char *head, size_t hcap);
/* One HTTP/1.1 request (Connection: close) with the extra header lines in headers (each
 * ending in \r\n, or NULL); the body of the answer into out and, when head is not NULL,
 * its status line and headers into head. Returns the status, or -1 when no answer came
 * within 10 s. */
int http_ex(int port, const char *method, const char *path, const char *headers,
    const char *body, char *out, size_t cap, char *head, size_t hcap);
int http(int port, const char *method, const char *path, const char *body, char *out,
    size_t cap);
/* The value of header name in head (from http_ex) into val; false when it is absent. */
bool header_of(const char *head, const char *name, char *val, size_t cap);
json_t *get_json(int port, const char *path);
pid_t spawn(const char *log, char *const argv[]);
/* Starts node i; peer is the index of a node to connect to, or -1; extra: more
 * arguments (NULL-terminated, at most 16), or NULL. */
void start_node(int i, int peer, const char *secret, const char *memory,
    const char *const *extra);
/* Waits for node i's API and reads its id (bound: 20 s). */
bool read_id(int i);
/* Prints the last lines of node i's log to stderr, under a title line. */
void print_log_tail(int i);
/* Prints "---- TITLE ----" (fmt) and the last lines of the file at path to stderr,
 * leaving out the lines that hold drop (when not NULL); "(no log)" when tail fails. */
void print_tail(const char *path, int lines, const char *drop, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Waits up to limit_s for pid to exit; its exit status, or -1 (then it is killed). */
int wait_exit(pid_t pid, double limit_s);
void stop_all(void);
/* The /state text of each live node among idx[0..n); true when all are equal, hold
 * want_nodes nodes and name the same master (its id into master when not NULL). */
bool states_agree(const int *idx, int n, size_t want_nodes, char *master, size_t mcap);
double wait_agree(const int *idx, int n, size_t want_nodes, char *master, size_t mcap,
    double limit_s);
int index_of_id(const char *id);
/* Waits until GET path answers want on every node in idx (bound limit_s). */
bool wait_status(const int *idx, int n, const char *path, int want, double limit_s);
int64_t rss_kib(pid_t pid);
/* Reads an SSE stream from fd into buf until it holds want (true), the peer closes it or
 * limit_s passes (false). */
bool sse_collect(int fd, const char *want, double limit_s, char *buf, size_t cap);
bool sse_wait(int fd, const char *want, double limit_s);
int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs argv (searched in PATH) and waits for it, its output shown only when verbose;
 * its exit status, or -1. */
int run_argv(const char *const *argv, bool verbose);
/* The runner of instance iid's first shard in node i's /state: its id, status and
 * restart count; false when the instance or its runner is not there. */
bool runner_of(int i, const char *iid, char *rid, size_t rcap, char *status, size_t scap,
    int *restarts);
bool ready_status(const char *status);
/* A greedy completion of 4 tokens of "hi" by model m1, asked of node i's API; the status
 * (200 only when the answer holds a text and 4 completion tokens), the body into out. */
int complete(int i, char *out, size_t cap);
/* Reads the first line of a file into buf; false when it cannot. */
bool read_line(const char *path, char *buf, size_t cap);
/* Stops node i with SIGTERM (bound 30 s). */
void stop_node(int i);
/* A child process of node whose command line holds "runner", or 0. Children are listed
 * by the thread that made them (the worker's), so every thread's list is read. */
pid_t runner_child(pid_t node);
/* The id of a task in node i's /state into id; false when there is none. */
bool some_task(int i, char *id, size_t cap);
/* The id of the first instance in node i's state into id; false when it has none. */
bool some_instance(int i, char *id, size_t cap);
/* A request held in flight: stops runner (SIGSTOP), sends node i a streamed greedy
 * completion of 8 tokens of "hi" by m1 and waits (bound 20 s) for its task in node i's
 * state (its id into task; *have_task says whether it came). The socket, or -1. */
int hold_stream(int i, pid_t runner, char *task, size_t cap, bool *have_task);
/* Resumes runner (when > 0) and, when fd >= 0, reads the stream of hold_stream to its
 * end (bound 60 s; into out), closes fd and checks that it ends with [DONE] and holds no
 * "EVIL" (the text tests forge meanwhile). */
void release_stream(pid_t runner, int fd, char *out, size_t cap);
/* Whether the file at path holds the bytes of s. */
bool file_has(const char *path, const char *s);

#endif
