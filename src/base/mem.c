#include "base/mem.h"

#include "base/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Value in kB of the line starting with `key` in a /proc file, as bytes. */
static int64_t proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    int64_t v = -1;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen)) {
            long long kb;
            if (sscanf(line + klen, " %lld", &kb) == 1)
                v = (int64_t)kb * 1024;
            break;
        }
    fclose(f);
    return v;
}

int64_t mem_available(void) { return proc_kb("/proc/meminfo", "MemAvailable:"); }
/* The first number in a one-line file (cgroup v2's memory.max, memory.current); -1 when
 * the file is missing or says "max". */
static int64_t file_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1 || v < 0)
        v = -1;
    fclose(f);
    return v;
}

int64_t mem_cgroup_free(void)
{
    int64_t max = file_number("/sys/fs/cgroup/memory.max"), cur = file_number("/sys/fs/cgroup/memory.current");
    if (max < 0)
        return -1;
    return cur >= 0 && cur < max ? max - cur : 0;
}

int64_t mem_total(void) { return proc_kb("/proc/meminfo", "MemTotal:"); }
int64_t mem_rss(void) { return proc_kb("/proc/self/status", "VmRSS:"); }
int64_t mem_peak_rss(void) { return proc_kb("/proc/self/status", "VmHWM:"); }

#define HUGE_PAGE ((size_t)2 << 20)

void *mem_alloc_stream(size_t size)
{
    /* whole cache lines of this CPU (64 bytes, or 128 on some ARM64 cores) */
    size_t line = (size_t)cpu_features()->cache_line;
    line = line < 64 ? 64 : line;
    size = (size + line - 1) / line * line;
    if (size < HUGE_PAGE)
        return aligned_alloc(line, size ? size : line);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, size) != 0)
        return NULL;
    /* Only advice: where huge pages are off or short, the block keeps small pages. */
    (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}
