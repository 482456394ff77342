/* Clocks and seeded numbers shared by the C benchmarks in bench/ (never by cairn itself). */
#ifndef CAIRN_BENCH_UTIL_H
#define CAIRN_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

static inline double bench_clock_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double bench_wall_s(void) { return bench_clock_s(CLOCK_MONOTONIC); }

/* The calling thread's CPU time: a rate over it is the rate while the thread ran, which a
 * neighbour's load on a shared machine changes less than the wall-clock rate. */
static inline double bench_thread_cpu_s(void) { return bench_clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* The whole process's CPU time (all its threads). */
static inline double bench_process_cpu_s(void) { return bench_clock_s(CLOCK_PROCESS_CPUTIME_ID); }

/* xorshift: seeded values in [-1, 1) */
static inline float bench_rnd_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* 64-bit LCG: seeded values in [-1, 1) */
static inline float bench_rnd_lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(int32_t)(*s >> 32) / 2147483648.0f;
}

#endif
