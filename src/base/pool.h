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

/* Profiling (off unless asked): where the time of each job goes, summed per tag. The
 * caller sets the tag its next jobs count under (0 .. POOL_MAX_TAGS - 1); every job
 * then adds its wall time (from the hand-off to the last thread's return), each thread's
 * time in fn, and the workers' wake-up time (from the hand-off to their fn's start).
 * A thread's wait at the barrier is the wall time less its time in fn. */
#define POOL_MAX_TAGS 16
struct pool_tag_stats {
    unsigned long long jobs;
    long long ns_wall;        /* hand-off to the last return, on the caller's clock */
    long long ns_busy_caller; /* thread 0's time in fn */
    long long ns_busy_workers; /* the other threads' time in fn, summed */
    long long ns_wake_workers; /* hand-off to each worker's fn start, summed */
    long long ns_late;         /* per job, the latest thread's return less the earliest's */
};
/* Turns profiling on (stats zeroed) or off. Not while a job runs; 0, or CAIRN_ENOMEM. */
int pool_profile(struct pool *p, bool on);
/* The tag the following jobs count under (ignored when profiling is off). */
void pool_set_tag(struct pool *p, int tag);
/* The sums of a tag so far (zeros when profiling is off). */
struct pool_tag_stats pool_tag_stats(const struct pool *p, int tag);

/* The kernel's id of thread ith (0: the caller's, as the pool saw it when created; -1
 * where unknown), to read its scheduling statistics. */
int pool_thread_tid(const struct pool *p, int ith);

/* Runs fn(ctx, ith, nth) for ith in [0, nth) concurrently and returns when all have
 * returned. Not reentrant: one job at a time per pool, from one calling thread. */
void pool_run(struct pool *p, pool_fn fn, void *ctx);

/* As pool_run, for a job whose fn, run by the calling thread alone, does all of the work
 * (units claimed, none split by ith): a worker that has not started fn by the time the
 * caller's fn returns skips the job, so the caller never waits for a worker that another
 * process holds off its CPU; it waits only for the workers that started. fn runs as
 * thread 0 on the caller and as ith on any subset of the workers, nth as in pool_run. */
void pool_run_claims(struct pool *p, pool_fn fn, void *ctx);

/* Splits [0, n) into nth contiguous parts aligned to `align`; part ith is [*lo, *hi). */
void pool_split(long n, long align, int ith, int nth, long *lo, long *hi);

/* Claims the next run [*lo, *hi) of units [0, total) shared through *next (0 at first)
 * by guided self-scheduling: each claim takes a share of what is left, at least
 * min_claim units (>= 1), so the first claims are long runs and a thread slowed by a
 * neighbour takes less. False when every unit is claimed. */
bool pool_claim(_Atomic long *next, long total, long min_claim, int nth, long *lo, long *hi);

#endif
