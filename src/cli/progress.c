/* A download's progress on stderr (progress.h). */
#include "cli/progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"

void progress_human(double bytes, char *out, size_t cap)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4)
        bytes /= 1024, u++;
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

void progress_show(void *ctx, const struct hub_progress *p)
{
    struct progress_bar *b = ctx;
    int64_t now = clock_ns();
    if (!strcmp(p->status, "listing")) {
        fprintf(stderr, "pulling manifest\n");
        return;
    }
    if (!b->started && !strcmp(p->status, "downloading")) {
        b->started = true;
        b->t0 = now;
        b->done0 = p->done;
    }
    double secs = (double)(now - b->t0) / 1e9;
    double rate = secs > 0.2 ? (double)(p->done - b->done0) / secs : 0;
    double pct = p->total ? 100.0 * (double)p->done / (double)p->total : 100;
    char done[32], total[32], speed[32], eta[32] = "-";
    progress_human((double)p->done, done, sizeof done);
    progress_human((double)p->total, total, sizeof total);
    progress_human(rate, speed, sizeof speed);
    if (rate > 0 && p->total > p->done) {
        int64_t s = (int64_t)((double)(p->total - p->done) / rate);
        snprintf(eta, sizeof eta, "%" PRId64 ":%02" PRId64, s / 60, s % 60);
    }
    bool end = !strcmp(p->status, "success") || !strcmp(p->status, "verifying");
    if (b->tty) {
        int width = 30, fill = (int)(pct / 100 * width);
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r%s part %d/%d [%s] %5.1f%% %s / %s  %s/s  ETA %s   ", p->status, p->part, p->parts, bar, pct,
                done, total, speed, eta);
        if (!strcmp(p->status, "success")) {
            fprintf(stderr, "\n");
            b->started = false;
        }
    } else if (end || now - b->last >= (int64_t)PROGRESS_LINE_EVERY_S * 1000000000) {
        b->last = now;
        fprintf(stderr, "%s %s part %d/%d: %.1f%% (%s of %s, %s/s)\n", p->status, p->file[0] ? p->file : p->id,
                p->part, p->parts, pct, done, total, speed);
    }
}

void progress_end(struct progress_bar *b)
{
    if (b->tty && b->started)
        fprintf(stderr, "\n");
    b->started = false;
}
