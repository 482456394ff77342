/* For tests: a pool whose workers are held off, so that pool_run_claims's jobs are done by
 * the caller alone, as when a neighbour's process holds the workers off their CPUs. Define
 * _GNU_SOURCE before any include (sched_setaffinity, SCHED_IDLE). */
#ifndef CAIRN_TESTS_HELD_POOL_H
#define CAIRN_TESTS_HELD_POOL_H

#include "base/pool.h"

#include <stdbool.h>
#ifdef __linux__
#include <sched.h>
#endif

/* A pool of n threads whose workers are held off: pinned to one CPU at SCHED_IDLE, with the
 * caller pinned there too for each call (held_enter), so they seldom start a job before the
 * caller's part is done and pool_run_claims's jobs are done by the caller alone, as when a
 * neighbour's process holds the workers off its CPUs. Where that cannot be set up (not
 * Linux), a plain pool: the checks stay valid, only the caller-alone case is not forced. */
struct held {
    struct pool *pool;
#ifdef __linux__
    cpu_set_t all; /* the caller's CPUs outside the calls */
    int cpu;
    bool pinned; /* the workers are pinned (else held_enter does nothing) */
#endif
};

static inline int held_open(struct held *h, int n)
{
    if (pool_create(&h->pool, n))
        return -1;
#ifdef __linux__
    h->pinned = false;
    if (sched_getaffinity(0, sizeof h->all, &h->all))
        return 0;
    for (h->cpu = 0; h->cpu < CPU_SETSIZE && !CPU_ISSET(h->cpu, &h->all); h->cpu++)
        ;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(h->cpu, &one);
    struct sched_param sp = {0};
    for (int i = 1; i < n; i++) {
        int tid;
        while ((tid = pool_thread_tid(h->pool, i)) <= 0) /* the worker has not started yet */
            sched_yield();
        sched_setaffinity(tid, sizeof one, &one);
        sched_setscheduler(tid, SCHED_IDLE, &sp);
    }
    h->pinned = true;
#endif
    return 0;
}

/* The caller onto the workers' CPU (on) or back (off). */
static inline void held_enter(struct held *h, bool on)
{
#ifdef __linux__
    if (!h->pinned)
        return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(h->cpu, &one);
    sched_setaffinity(0, sizeof one, on ? &one : &h->all);
#else
    (void)h, (void)on;
#endif
}

#endif
