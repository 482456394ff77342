/* Monotonic clock helpers. */
#ifndef CAIRN_BASE_CLOCK_H
#define CAIRN_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double clock_sec(void) { return (double)clock_ns() * 1e-9; }

/* Sleeps ms milliseconds (less when a signal comes). */
static inline void clock_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

#endif
