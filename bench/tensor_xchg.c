/* What one tensor-parallel exchange costs on the data plane (runner/dataplane.h, as
 * runner/tensor.c uses it): two processes, each pinned to its own core, linked in a ring
 * of two real TCP connections over 127.0.0.1 with the handshake and a cluster secret
 * (every frame sealed), exchange parts in the pattern of one llama-1b layer (4, 4, 16
 * and 4 KiB of F32 per rank: attention, output, FFN, down) as a two-rank all-gather:
 * each sends its part to next, then takes the other's from prev. Rank 0 reports the
 * microseconds per exchange (the round's wall time over the exchanges, no compute in
 * between), and both ranks' seconds of CPU, for spin 0 (block at once) and the given
 * spin budget.
 *
 *   cmake --build build --target bench_tensor_xchg
 *   ./build/bench_tensor_xchg [exchanges (4000)] [spin_us (200)] [cores (0,1)]
 *
 * XCHG_OPEN=1 in the environment links them without a secret (frames in clear), to see
 * what sealing costs. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "runner/dataplane.h"
#include "base/dtype.h"

#define SECRET "bench-tensor-xchg"

struct acceptor {
    struct dp_listener *l;
    struct dp_config cfg;
    struct dp_conn *c;
    int rc;
    char err[256];
};

static void *accept_main(void *arg)
{
    struct acceptor *a = arg;
    a->rc = dp_accept(a->l, &a->cfg, 10000, &a->c, a->err, sizeof a->err);
    return NULL;
}

static struct dp_config config(int rank, int peer)
{
    return (struct dp_config){.instance_id = "xchg-bench", .epoch = 1, .model_id = "bench",
                              .secret = getenv("XCHG_OPEN") ? NULL : SECRET,
                              .rank = rank, .peer_rank = peer, .close_linger_ms = 200};
}

static void pin(int core)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core, &s);
    if (sched_setaffinity(0, sizeof s, &s))
        perror("sched_setaffinity");
}

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
           ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec) / 1e6;
}

/* One rank's rounds: n exchanges at each spin budget; rank 0 prints. */
static int run_rank(int rank, struct dp_listener *mine, int other_port, int n, int spin_us, int core)
{
    pin(core);
    char err[512];
    struct acceptor a = {.l = mine, .cfg = config(rank, 1 - rank)};
    pthread_t th;
    pthread_create(&th, NULL, accept_main, &a);
    struct dp_conn *next = NULL;
    struct dp_config cc = config(rank, 1 - rank);
    if (dp_connect(&next, "127.0.0.1", other_port, &cc, 10000, err, sizeof err)) {
        fprintf(stderr, "rank %d: connect: %s\n", rank, err);
        return 1;
    }
    pthread_join(th, NULL);
    if (a.rc != 1) {
        fprintf(stderr, "rank %d: accept: %s\n", rank, a.err);
        return 1;
    }
    struct dp_conn *prev = a.c;
    static const int floats[4] = {1024, 1024, 4096, 1024};
    float *part = calloc(4096, sizeof *part);
    int32_t zseq[1] = {0};
    int64_t zpos[1] = {0};
    uint8_t zwant[1] = {0};
    int budgets[2] = {0, spin_us};
    uint64_t step = 0;
    for (int b = 0; b < 2; b++) {
        for (int pass = 0; pass < 2; pass++) { /* a warm-up pass, then the measured one */
            int64_t t0 = clock_ns();
            double c0 = cpu_s();
            for (int i = 0; i < n; i++) {
                int w = floats[i % 4];
                struct dp_activations x = {.step = ++step, .n = 1, .n_embd = w, .wire_dtype = DT_F32, .seq = zseq,
                                           .pos = zpos, .want = zwant, .x = part};
                if (dp_send_activations(next, &x, 10000, err, sizeof err)) {
                    fprintf(stderr, "rank %d: send: %s\n", rank, err);
                    return 1;
                }
                dp_inflight_done(next, x.step);
                struct dp_frame f;
                int got = dp_recv_spin(prev, &f, budgets[b], 10000, err, sizeof err);
                if (got != 1 || f.type != DP_T_ACTIVATIONS || f.act.step != step || f.act.n_embd != w) {
                    fprintf(stderr, "rank %d: recv: %d %s\n", rank, got, got < 0 ? err : "");
                    return 1;
                }
            }
            int64_t t1 = clock_ns();
            double c1 = cpu_s();
            if (pass == 1 && rank == 0)
                printf("spin %4d us: %7.1f us per exchange (%d exchanges of 4/4/16/4 KiB each way, %s), "
                       "rank 0 CPU %.2f s of %.2f s\n",
                       budgets[b], (double)(t1 - t0) / 1e3 / n, n, getenv("XCHG_OPEN") ? "in clear" : "sealed",
                       c1 - c0, (double)(t1 - t0) / 1e9);
        }
    }
    struct dp_stats st;
    dp_get_stats(next, &st);
    if (rank == 0)
        printf("rank 0 -> 1: %" PRIu64 " frames, %" PRIu64 " bytes, %" PRIu64 " sealed\n", st.frames_sent,
               st.bytes_sent, st.sealed_bytes_sent);
    dp_close(next, "done");
    dp_close(prev, "done");
    free(part);
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4000;
    int spin_us = argc > 2 ? atoi(argv[2]) : 200;
    const char *cores = argc > 3 ? argv[3] : "0,1";
    int core_a = atoi(cores), core_b = strchr(cores, ',') ? atoi(strchr(cores, ',') + 1) : core_a;
    if (n < 4)
        n = 4;
    log_set_level(LOG_WARN);
    char err[256];
    struct dp_listener *l0, *l1;
    if (dp_listen(&l0, "127.0.0.1", 0, err, sizeof err) || dp_listen(&l1, "127.0.0.1", 0, err, sizeof err)) {
        fprintf(stderr, "listen: %s\n", err);
        return 1;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        _exit(run_rank(1, l1, dp_listener_port(l0), n, spin_us, core_b));
    int rc = run_rank(0, l0, dp_listener_port(l1), n, spin_us, core_a);
    int st = 0;
    waitpid(child, &st, 0);
    return rc || !WIFEXITED(st) || WEXITSTATUS(st);
}
