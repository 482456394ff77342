#include "cli/bench_step.h"

#include "base/pool.h"

#include <stdbool.h>
#include <stdio.h>

void bench_sched_read(const struct engine *e, struct bench_sched *s)
{
    struct pool *p = engine_pool(e);
    s->n = pool_threads(p) < BENCH_SCHED_MAX ? pool_threads(p) : BENCH_SCHED_MAX;
    for (int i = 0; i < s->n; i++) {
        s->run_ns[i] = s->wait_ns[i] = -1;
        int tid = pool_thread_tid(p, i);
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
        FILE *f = tid > 0 ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        if (fscanf(f, "%lld %lld", &s->run_ns[i], &s->wait_ns[i]) != 2)
            s->run_ns[i] = s->wait_ns[i] = -1;
        fclose(f);
    }
}

void bench_sched_add(struct bench_sched *sum, const struct bench_sched *a, const struct bench_sched *b)
{
    sum->n = a->n < b->n ? a->n : b->n;
    for (int i = 0; i < sum->n; i++) {
        bool bad = a->run_ns[i] < 0 || b->run_ns[i] < 0 || sum->run_ns[i] < 0;
        sum->run_ns[i] = bad ? -1 : sum->run_ns[i] + b->run_ns[i] - a->run_ns[i];
        sum->wait_ns[i] = bad ? -1 : sum->wait_ns[i] + b->wait_ns[i] - a->wait_ns[i];
    }
}

void bench_step_snap(const struct engine *e, struct bench_step_prof *s)
{
    for (int ph = 0; ph < N_ENGINE_PHASES; ph++)
        s->ph[ph] = engine_phase_stats(e, ph);
    engine_profile_totals(e, &s->forwards, &s->ns_forward);
}

void bench_step_diff(struct bench_step_prof *d, const struct bench_step_prof *a, const struct bench_step_prof *b)
{
    for (int ph = 0; ph < N_ENGINE_PHASES; ph++) {
        const struct engine_phase_stats *x = &a->ph[ph], *y = &b->ph[ph];
        d->ph[ph] = (struct engine_phase_stats){
            .ns = y->ns - x->ns,
            .jobs = {.jobs = y->jobs.jobs - x->jobs.jobs,
                     .ns_wall = y->jobs.ns_wall - x->jobs.ns_wall,
                     .ns_busy_caller = y->jobs.ns_busy_caller - x->jobs.ns_busy_caller,
                     .ns_busy_workers = y->jobs.ns_busy_workers - x->jobs.ns_busy_workers,
                     .ns_wake_workers = y->jobs.ns_wake_workers - x->jobs.ns_wake_workers,
                     .ns_late = y->jobs.ns_late - x->jobs.ns_late},
            .weight_bytes = y->weight_bytes - x->weight_bytes,
        };
    }
    d->forwards = b->forwards - a->forwards;
    d->ns_forward = b->ns_forward - a->ns_forward;
}

void bench_print_step(const char *title, const struct bench_step_prof *p, int nth, double t_steps, int64_t n_tokens,
                      const struct bench_sched *sched)
{
    if (p->forwards == 0 || n_tokens <= 0)
        return;
    int nw = nth > 1 ? nth - 1 : 1;
    double per = 1e-6 / (double)n_tokens; /* ns summed over the steps -> ms a token */
    double t_step = t_steps * 1e3 / (double)n_tokens, t_fwd = (double)p->ns_forward * per;
    printf("  %s (per token, %lld tokens, %d threads): step %.3f ms, of which forward %.3f ms and %.3f between "
           "forwards\n",
           title, (long long)n_tokens, nth, t_step, t_fwd, t_step - t_fwd);
    printf("  %-12s %8s %6s %8s %8s %8s %8s %8s %8s %8s %7s %8s\n", "phase", "ms", "jobs", "alone", "t0 busy",
           "tN busy", "t0 wait", "tN wait", "wake us", "late us", "MiB", "GB/s");
    double sum_ms = 0, sum_jobs = 0, sum_alone = 0, sum_b0 = 0, sum_bw = 0, sum_w0 = 0, sum_ww = 0, sum_mib = 0;
    double prod_wall = 0, wake_ns = 0, late_ns = 0, n_jobs = 0;
    for (int ph = 0; ph < N_ENGINE_PHASES; ph++) {
        const struct engine_phase_stats *s = &p->ph[ph];
        double ms = (double)s->ns * per, wall = (double)s->jobs.ns_wall * per;
        double jobs = (double)s->jobs.jobs / (double)n_tokens;
        double b0 = (double)s->jobs.ns_busy_caller * per, bw = (double)s->jobs.ns_busy_workers * per / nw;
        double w0 = wall - b0, ww = nth > 1 ? wall - bw : 0;
        double mib = s->weight_bytes / (double)n_tokens / (1 << 20);
        double nj = (double)s->jobs.jobs;
        double wake = nj > 0 && nth > 1 ? (double)s->jobs.ns_wake_workers / nw / nj / 1e3 : 0;
        double late = nj > 0 ? (double)s->jobs.ns_late / nj / 1e3 : 0;
        if (ms == 0 && jobs == 0)
            continue;
        printf("  %-12s %8.3f %6.1f %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %8.2f %7.1f", engine_phase_name(ph), ms, jobs,
               ms - wall, b0, bw, w0, ww, wake, late, mib);
        if (mib > 0 && wall > 0)
            printf(" %8.2f\n", mib * (1 << 20) / (wall * 1e6));
        else
            printf(" %8s\n", "-");
        sum_ms += ms, sum_jobs += jobs, sum_alone += ms - wall, sum_b0 += b0, sum_bw += bw, sum_w0 += w0;
        sum_ww += ww, sum_mib += mib;
        if (mib > 0)
            prod_wall += wall;
        wake_ns += (double)s->jobs.ns_wake_workers / nw;
        late_ns += (double)s->jobs.ns_late;
        n_jobs += nj;
    }
    double prod_rate = prod_wall > 0 ? sum_mib * (1 << 20) / (prod_wall * 1e6) : 0.0;
    printf("  %-12s %8.3f %6.1f %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %8.2f %7.1f %8.2f\n", "all", sum_ms, sum_jobs,
           sum_alone, sum_b0, sum_bw, sum_w0, sum_ww, n_jobs > 0 ? wake_ns / n_jobs / 1e3 : 0.0,
           n_jobs > 0 ? late_ns / n_jobs / 1e3 : 0.0, sum_mib, prod_rate);
    /* the share of every thread's step time: in jobs' work, waiting at their barriers,
     * the calling thread alone (the others idle beside it), between forwards */
    double thr = t_step * nth;
    double busy = sum_b0 + sum_bw * nw, wait = sum_w0 + sum_ww * nw;
    printf("  threads' time: %.1f%% in jobs, %.1f%% waiting at their barriers, %.1f%% the calling thread alone "
           "(%.1f%% others idle beside it), %.1f%% between forwards; products read %.2f GB/s over their jobs' "
           "wall time\n",
           100 * busy / thr, 100 * wait / thr, 100 * sum_alone / thr, 100 * sum_alone * nw / thr,
           100 * (t_step - t_fwd) * nth / thr, prod_rate);
    bool any = false;
    for (int i = 0; sched && i < sched->n && i < nth; i++) {
        if (sched->run_ns[i] < 0)
            continue;
        printf("%s thread %d: on a CPU %.3f ms, runnable but preempted %.3f ms", any ? "," : "  per token:", i,
               (double)sched->run_ns[i] * per, (double)sched->wait_ns[i] * per);
        any = true;
    }
    if (any)
        printf(" (schedstat)\n");
}
