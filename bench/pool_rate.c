/* The cost of one hand-off to the engine's threads in isolation (issue 23): pool_run of a
 * job that does nothing, on N threads, many times over; prints the nanoseconds per job
 * (the caller's wall time, hand-off to the last thread's return), the best round of
 * many so that a neighbour's load on a shared machine weighs less, and the profile's
 * wake-up time of the workers (hand-off to their start).
 *   usage: bench_pool_rate [-t THREADS] [ROUNDS]   (default 2 threads, 200 rounds)
 * Pin it beside the load average: it is a timing. */
#include "base/clock.h"
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOBS_PER_ROUND 2000

static void nothing(void *ctx, int ith, int nth)
{
    (void)ctx, (void)ith, (void)nth;
}

int main(int argc, char **argv)
{
    int threads = 2, a = 1;
    if (a + 1 < argc && !strcmp(argv[a], "-t")) {
        threads = atoi(argv[a + 1]);
        a += 2;
    }
    int rounds = a < argc ? atoi(argv[a]) : 200;
    struct pool *p;
    if (threads < 1 || rounds < 1 || pool_create(&p, threads)) {
        fprintf(stderr, "usage: bench_pool_rate [-t THREADS] [ROUNDS]\n");
        return 2;
    }
    double best = 1e30, best_prof = 1e30, best_wake = 0;
    for (int r = 0; r < rounds; r++) {
        bool prof = r % 2; /* alternate rounds profiled: the profile's own cost shows */
        if (pool_profile(p, prof) != 0) {
            fprintf(stderr, "bench_pool_rate: out of memory for the profile\n");
            pool_release(p);
            return 1;
        }
        int64_t t0 = clock_ns();
        for (int i = 0; i < JOBS_PER_ROUND; i++)
            pool_run(p, nothing, NULL);
        double ns = (double)(clock_ns() - t0) / JOBS_PER_ROUND;
        if (!prof && ns < best)
            best = ns;
        if (prof && ns < best_prof) {
            struct pool_tag_stats s = pool_tag_stats(p, 0);
            best_prof = ns;
            best_wake = threads > 1 && s.jobs > 0 ? (double)s.ns_wake_workers / (double)(threads - 1) / (double)s.jobs : 0;
        }
    }
    printf("%d threads, best of %d rounds of %d empty jobs: %.0f ns a job; profiled %.0f ns a job, workers "
           "woken %.0f ns after the hand-off\n",
           threads, (rounds + 1) / 2, JOBS_PER_ROUND, best, best_prof, best_wake);
    pool_release(p);
    return 0;
}
