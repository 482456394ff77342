/* cairn bench's decode step breakdown (bench_step.c): where a step's time goes beyond
 * reading its weights, from the engine's profile of the decode runs. */
#ifndef CAIRN_CLI_BENCH_STEP_H
#define CAIRN_CLI_BENCH_STEP_H

#include "engine/engine.h"

#include <stdint.h>

/* The engine's profile sums at one moment, or the difference of two. */
struct bench_step_prof {
    struct engine_phase_stats ph[N_ENGINE_PHASES];
    unsigned long long forwards;
    long long ns_forward;
};
void bench_step_snap(const struct engine *e, struct bench_step_prof *s);
/* d = b - a */
void bench_step_diff(struct bench_step_prof *d, const struct bench_step_prof *a, const struct bench_step_prof *b);

/* Each of the engine's threads' time on a CPU and waiting for one (runnable, while a
 * neighbour ran: this shared machine's preemption), from /proc's schedstat. */
#define BENCH_SCHED_MAX 64
struct bench_sched {
    int n;
    long long run_ns[BENCH_SCHED_MAX], wait_ns[BENCH_SCHED_MAX];
};
void bench_sched_read(const struct engine *e, struct bench_sched *s);
/* sum += b - a (threads unread in either count -1 in sum). */
void bench_sched_add(struct bench_sched *sum, const struct bench_sched *a, const struct bench_sched *b);

/* Prints, per token of the n_tokens steps profiled in p, each phase of the forward: the
 * calling thread's wall time, the jobs handed to the threads, the work the calling
 * thread did alone, each thread's time in the jobs and waiting at their barriers, and
 * the products' bytes and read rate; t_steps: the seconds of the steps as the bench
 * timed them (the forwards and what lies between them); sched: the threads' CPU and
 * preempted time over the steps, or NULL. */
void bench_print_step(const char *title, const struct bench_step_prof *p, int n_threads, double t_steps,
                      int64_t n_tokens, const struct bench_sched *sched);

#endif
