#include "base/pool.h"
#include "base/err.h"
#include "base/mem.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job {
    long n;
    int *hits;
    _Atomic int calls;
};

static void mark(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    long lo, hi;
    pool_split(j->n, 16, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++)
        j->hits[i]++;
    atomic_fetch_add(&j->calls, 1);
}

/* Units of [0, n) claimed 7 at a time, each counted once; the threads that ran fn. */
struct claims_job {
    long n;
    _Atomic long next;
    _Atomic int *hits;
    _Atomic int ran;
};

static void claim_mark(void *ctx, int ith, int nth)
{
    struct claims_job *j = ctx;
    long lo, hi;
    (void)ith;
    while (pool_claim(&j->next, j->n, 7, nth, &lo, &hi))
        for (long i = lo; i < hi; i++)
            atomic_fetch_add(&j->hits[i], 1);
    atomic_fetch_add(&j->ran, 1);
}

/* pool_run_claims between plain jobs, after pauses that let the workers fall asleep:
 * every unit done once whichever workers joined, the plain jobs still run on every
 * thread, and a worker that skipped a job (its caller done first) takes the next. */
static void test_claims(int threads, bool prof)
{
    struct pool *p;
    CHECK_EQ_INT(pool_create(&p, threads), 0);
    CHECK_EQ_INT(pool_profile(p, prof), 0);
    static _Atomic int hits[500];
    int marks[1000];
    memset(marks, 0, sizeof marks);
    struct job plain = {.n = 1000, .hits = marks};
    static const long pause_ns[] = {0, 2000, 200000, 5000000};
    int joined = 0;
    for (int rep = 0; rep < 120; rep++) {
        for (int i = 0; i < 500; i++)
            atomic_init(&hits[i], 0);
        struct claims_job j = {.n = rep % 5 == 0 ? 3 : 500, .hits = hits};
        atomic_init(&j.next, 0);
        atomic_init(&j.ran, 0);
        nanosleep(&(struct timespec){0, pause_ns[(rep * 7 + rep / 4) % 4]}, NULL);
        pool_run_claims(p, claim_mark, &j);
        int bad = 0;
        for (long i = 0; i < j.n; i++)
            bad += atomic_load(&hits[i]) != 1;
        CHECK(bad == 0, "%d of %ld units not done exactly once (%d threads, rep %d)", bad, j.n, threads, rep);
        int ran = atomic_load(&j.ran);
        CHECK(ran >= 1 && ran <= threads, "fn ran on %d of %d threads", ran, threads);
        joined += ran - 1;
        if (rep % 3 == 0)
            pool_run(p, mark, &plain);
    }
    /* back to back, no pauses: a worker still leaving one job as the next begins */
    for (int rep = 0; rep < 3000; rep++) {
        struct claims_job j = {.n = 3, .hits = hits};
        atomic_init(&j.next, 0);
        atomic_init(&j.ran, 0);
        for (int i = 0; i < 3; i++)
            atomic_init(&hits[i], 0);
        pool_run_claims(p, claim_mark, &j);
        CHECK(atomic_load(&hits[0]) == 1 && atomic_load(&hits[2]) == 1, "back to back rep %d: units hit %d, %d", rep,
              atomic_load(&hits[0]), atomic_load(&hits[2]));
        if (rep % 2)
            pool_run(p, mark, &plain);
    }
    CHECK_EQ_INT(atomic_load(&plain.calls), 1540 * threads);
    CHECK(marks[0] == 1540 && marks[999] == 1540, "plain jobs hit %d and %d times", marks[0], marks[999]);
    if (prof) {
        struct pool_tag_stats t = pool_tag_stats(p, 0);
        CHECK(t.jobs == 4660 && t.ns_busy_workers >= 0 && t.ns_busy_workers + t.ns_wake_workers <= (threads - 1) * t.ns_wall,
              "profiled: %llu jobs, workers busy %lld, waking %lld of %lld ns", t.jobs, t.ns_busy_workers,
              t.ns_wake_workers, t.ns_wall);
    }
    printf("pool_run_claims, %d threads%s: workers joined %d of %d jobs' chances\n", threads, prof ? " (profiled)" : "",
           joined, 120 * (threads - 1));
    pool_release(p);
}

int main(void)
{
    /* pool_split covers [0,n) exactly once, with aligned boundaries. */
    for (long n = 0; n < 300; n += 7)
        for (int nth = 1; nth <= 5; nth++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                pool_split(n, 16, i, nth, &lo, &hi);
                CHECK(lo == prev, "n=%ld nth=%d part %d starts at %ld, expected %ld", n, nth, i, lo, prev);
                CHECK(lo % 16 == 0 || lo == n, "unaligned start %ld", lo);
                prev = hi;
            }
            CHECK(prev == n, "n=%ld nth=%d parts end at %ld", n, nth, prev);
        }

    for (int threads = 1; threads <= 4; threads++) {
        struct pool *p;
        CHECK_EQ_INT(pool_create(&p, threads), 0);
        int hits[1000];
        memset(hits, 0, sizeof hits);
        struct job j = {.n = 1000, .hits = hits};
        for (int rep = 0; rep < 500; rep++)
            pool_run(p, mark, &j);
        int bad = 0;
        for (int i = 0; i < 1000; i++)
            bad += hits[i] != 500;
        CHECK(bad == 0, "%d elements not hit exactly 500 times with %d threads", bad, threads);
        CHECK_EQ_INT(atomic_load(&j.calls), 500 * threads);
        pool_release(p);
    }
    /* Dispatches find the workers spinning, yielding or asleep (after pauses from none to
     * 5 ms): every one runs on every thread; a lost wake-up hangs here (ctest's timeout). */
    for (int threads = 2; threads <= 3; threads++) {
        struct pool *p;
        CHECK_EQ_INT(pool_create(&p, threads), 0);
        int hits[1000];
        memset(hits, 0, sizeof hits);
        struct job j = {.n = 1000, .hits = hits};
        static const long pause_ns[] = {0, 2000, 200000, 5000000};
        for (int rep = 0; rep < 200; rep++) {
            nanosleep(&(struct timespec){0, pause_ns[(rep * 7 + rep / 4) % 4]}, NULL);
            pool_run(p, mark, &j);
        }
        CHECK_EQ_INT(atomic_load(&j.calls), 200 * threads);
        CHECK(hits[0] == 200 && hits[999] == 200, "first and last elements hit %d and %d times", hits[0], hits[999]);
        pool_release(p);
    }
    /* Profiling counts each job under the tag set before it, with times that add up:
     * a thread's time in fn is within the job's wall time. */
    for (int threads = 1; threads <= 3; threads++) {
        struct pool *p;
        CHECK_EQ_INT(pool_create(&p, threads), 0);
        int hits[1000];
        memset(hits, 0, sizeof hits);
        struct job j = {.n = 1000, .hits = hits};
        pool_run(p, mark, &j); /* not profiled */
        CHECK_EQ_INT(pool_profile(p, true), 0);
        for (int rep = 0; rep < 30; rep++) {
            pool_set_tag(p, rep % 3 == 0 ? 2 : 5);
            pool_run(p, mark, &j);
        }
        struct pool_tag_stats t2 = pool_tag_stats(p, 2), t5 = pool_tag_stats(p, 5), t0 = pool_tag_stats(p, 0);
        CHECK(t2.jobs == 10 && t5.jobs == 20 && t0.jobs == 0, "jobs by tag: %llu %llu %llu", t2.jobs, t5.jobs, t0.jobs);
        CHECK(t5.ns_busy_caller >= 0 && t5.ns_busy_caller <= t5.ns_wall, "caller busy %lld of %lld ns",
              t5.ns_busy_caller, t5.ns_wall);
        CHECK(t5.ns_busy_workers >= 0 && t5.ns_busy_workers + t5.ns_wake_workers <= (threads - 1) * t5.ns_wall,
              "workers busy %lld, waking %lld of %lld ns", t5.ns_busy_workers, t5.ns_wake_workers, t5.ns_wall);
        CHECK(threads > 1 || (t5.ns_busy_workers == 0 && t5.ns_late == 0), "1 thread: workers' times");
        CHECK(pool_thread_tid(p, threads - 1) != 0, "thread %d's id", threads - 1);
        CHECK_EQ_INT(pool_profile(p, false), 0);
        pool_run(p, mark, &j);
        CHECK(pool_tag_stats(p, 5).jobs == 0, "stats after profiling off");
        CHECK_EQ_INT(atomic_load(&j.calls), 32 * threads);
        pool_release(p);
    }
    for (int threads = 1; threads <= 3; threads++) {
        test_claims(threads, false);
        test_claims(threads, true);
    }
    CHECK(pool_create(&(struct pool *){0}, 0) == CAIRN_EINVAL, "0 threads accepted");
    pool_release(NULL);
    /* Blocks for streamed weights: 64-byte aligned, huge-page aligned from 2 MiB up,
     * and wholly writable. */
    size_t sizes[] = {1, 100, 4096, (size_t)2 << 20, ((size_t)5 << 20) + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *b = mem_alloc_stream(sizes[i]);
        CHECK(b != NULL, "mem_alloc_stream(%zu) failed", sizes[i]);
        uintptr_t align = sizes[i] >= ((size_t)2 << 20) ? (uintptr_t)2 << 20 : 64;
        CHECK((uintptr_t)b % align == 0, "block of %zu bytes at %p not aligned to %lu", sizes[i], (void *)b,
              (unsigned long)align);
        memset(b, 0xa5, sizes[i]);
        CHECK(b[sizes[i] - 1] == 0xa5, "last byte of %zu not written", sizes[i]);
        free(b);
    }

    return test_main_end();
}
