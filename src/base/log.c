#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* The one piece of process-wide state in base: set by main before threads start. */
static _Atomic int current_level = LOG_WARN;
static FILE *log_file; /* set before threads start, closed after they end */

void log_set_level(enum log_level level) { current_level = level; }
enum log_level log_get_level(void) { return (enum log_level)current_level; }

int log_open_file(const char *path)
{
    FILE *f = fopen(path, "ae");
    if (!f)
        return -1;
    setvbuf(f, NULL, _IOLBF, 0);
    log_close_file();
    log_file = f;
    return 0;
}

void log_close_file(void)
{
    if (log_file)
        fclose(log_file);
    log_file = NULL;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)level > current_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, names[level], line);
    if (log_file)
        fprintf(log_file, "%04d-%02d-%02d %02d:%02d:%02d.%03ld %s: %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level], line);
}
