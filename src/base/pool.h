/* A fixed set of worker threads that run one parallel job at a time. The caller of
 * pool_run takes part as thread 0, so a pool of 1 thread spawns nothing. Workers spin
 * briefly between jobs (a decode step issues hundreds of short jobs) and then sleep. */
#ifndef CAIRN_BASE_POOL_H
#define CAIRN_BASE_POOL_H

#include <stdbool.h>

struct pool;

typedef void (*pool_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads (>= 1) threads in all, counting the caller. */
int pool_create(struct pool **out, int n_threads);

/* Stops and joins the workers; accepts NULL. */
void pool_release(struct pool *p);

int pool_threads(const struct pool *p);

/* Jobs run by pool_run since the pool was created: what a caller counts to keep its
 * number of hand-offs per step from growing (each costs a barrier). */
unsigned long long pool_dispatches(const struct pool *p);

/* Runs fn(ctx, ith, nth) for ith in [0, nth) concurrently and returns when all have
 * returned. Not reentrant: one job at a time per pool, from one calling thread. */
void pool_run(struct pool *p, pool_fn fn, void *ctx);

/* Splits [0, n) into nth contiguous parts aligned to `align`; part ith is [*lo, *hi). */
void pool_split(long n, long align, int ith, int nth, long *lo, long *hi);

/* Claims the next run [*lo, *hi) of units [0, total) shared through *next (0 at first)
 * by guided self-scheduling: each claim takes a share of what is left, at least
 * min_claim units (>= 1), so the first claims are long runs and a thread slowed by a
 * neighbour takes less. False when every unit is claimed. */
bool pool_claim(_Atomic long *next, long total, long min_claim, int nth, long *lo, long *hi);

#endif
