/* A pipelined runner's data-plane connections (runner_link.h). */
#include "runner/runner_link.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"

#define CONNECT_TRY_MS 2000 /* each host gets this long (refused connections retried) per round */
#define TICK_MS 100

int runner_link_listen(struct runner_link *l, const char *bind_addr, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    return dp_listen(&l->listener, bind_addr && bind_addr[0] ? bind_addr : NULL, 0, err, errlen);
}

int runner_link_port(const struct runner_link *l) { return l->listener ? dp_listener_port(l->listener) : 0; }

static void link_config(struct dp_config *dc, const struct runner_config *cfg, const struct runner_peers *p,
                        int peer_rank, bool to_next)
{
    memset(dc, 0, sizeof *dc);
    dc->instance_id = cfg->instance_id;
    dc->epoch = (uint64_t)p->epoch;
    dc->model_id = cfg->model_identity[0] ? cfg->model_identity : "unnamed";
    dc->secret = p->secret;
    dc->rank = cfg->rank;
    dc->peer_rank = peer_rank;
    /* Rank 0 counts the steps it has in flight around the ring: one per stage at most, so
     * the ring cannot jam (the other ranks release theirs as they pass a step on). */
    dc->max_inflight = to_next && cfg->rank == 0 ? cfg->world_size : 0;
    /* Benchmarks emulate a slower link with CAIRN_DP_DELAY_US (one-way, microseconds),
     * inherited from the node, where tc netem is not available. */
    const char *delay = getenv("CAIRN_DP_DELAY_US");
    long us = delay ? strtol(delay, NULL, 10) : 0;
    dc->emulate_delay_us = us > 0 && us <= 1000000 ? (int)us : 0;
}

struct connector {
    const struct runner_config *cfg;
    struct runner_peers p; /* a copy: the caller's may change while we connect (a new "peers") */
    int64_t deadline_ns;
    atomic_bool give_up, done;
    struct dp_conn *conn;
    int rc;
    char err[512];
};

static void *connect_main(void *arg)
{
    struct connector *c = arg;
    struct dp_config dc;
    link_config(&dc, c->cfg, &c->p, c->p.next_rank, true);
    c->rc = CAIRN_EIO;
    snprintf(c->err, sizeof c->err, "no address to try");
    while (!c->conn && !atomic_load(&c->give_up) && clock_ns() < c->deadline_ns) {
        for (int i = 0; i < c->p.n_hosts && !c->conn && !atomic_load(&c->give_up); i++) {
            int64_t left_ms = (c->deadline_ns - clock_ns()) / 1000000;
            if (left_ms <= 0)
                break;
            char why[400];
            int rc = dp_connect(&c->conn, c->p.hosts[i], c->p.next_port, &dc,
                                left_ms < CONNECT_TRY_MS ? (int)left_ms : CONNECT_TRY_MS, why, sizeof why);
            if (rc) {
                c->conn = NULL;
                snprintf(c->err, sizeof c->err, "%s:%d: %s", c->p.hosts[i], c->p.next_port, why);
            }
        }
    }
    c->rc = c->conn ? 0 : CAIRN_EIO;
    atomic_store(&c->done, true);
    return NULL;
}

int runner_link_connect(struct runner_link *l, const struct runner_config *cfg, const struct runner_peers *p,
                        int timeout_ms, int (*tick)(void *ctx), void *ctx, char *err, size_t errlen)
{
    int W = cfg->world_size, prev_rank = (cfg->rank - 1 + W) % W;
    struct connector c = {.cfg = cfg, .p = *p, .deadline_ns = clock_ns() + (int64_t)timeout_ms * 1000000};
    pthread_t th;
    if (pthread_create(&th, NULL, connect_main, &c))
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot start a thread");
    struct dp_config dc;
    link_config(&dc, cfg, p, prev_rank, false);
    char why[512] = "";
    bool stop = false;
    while (!stop && (!l->prev || !atomic_load(&c.done)) && clock_ns() < c.deadline_ns) {
        if (!l->prev) {
            int rc = dp_accept(l->listener, &dc, TICK_MS, &l->prev, why, sizeof why);
            if (rc < 0) /* a stray or stale peer: keep listening for the right one */
                fprintf(stderr, "cairn runner: refused a data-plane connection: %s\n", why);
            if (rc != 1)
                l->prev = NULL;
        } else {
            struct timespec ts = {0, TICK_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        stop = tick && tick(ctx);
    }
    atomic_store(&c.give_up, true);
    pthread_join(th, NULL);
    l->next = c.conn;
    if (l->next && l->prev)
        return 0;
    int rc;
    if (stop)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "asked to stop while connecting");
    else if (!l->next)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot reach rank %d: %s", p->next_rank, c.err);
    else
        rc = cairn_fail(err, errlen, CAIRN_EIO, "rank %d did not connect within %d ms%s%s", prev_rank, timeout_ms,
                        why[0] ? "; last refused: " : "", why);
    runner_link_close(l, "connecting failed");
    return rc;
}

void runner_link_close(struct runner_link *l, const char *reason)
{
    dp_close(l->next, reason);
    dp_close(l->prev, reason);
    dp_listener_close(l->listener);
    memset(l, 0, sizeof *l);
}
