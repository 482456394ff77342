/* Memory of the machine and of this process, from /proc (Linux). */
#ifndef CAIRN_BASE_MEM_H
#define CAIRN_BASE_MEM_H

#include <stddef.h>
#include <stdint.h>

/* MemAvailable of /proc/meminfo in bytes, or -1 when unknown. */
int64_t mem_available(void);
/* What the cgroup v2 this process runs in (a container, a systemd unit) still lets it
 * use, in bytes: memory.max less memory.current; -1 when it sets no limit or there is no
 * such file. MemAvailable shows the host's memory inside a container; this does not. */
int64_t mem_cgroup_free(void);
/* MemTotal in bytes, or -1. */
int64_t mem_total(void);
/* Resident set of this process now (VmRSS) and at its peak (VmHWM), in bytes, or -1. */
int64_t mem_rss(void);
int64_t mem_peak_rss(void);

/* Memory for a large block that is streamed end to end (weights, the bandwidth probe):
 * aligned to the cache line (64 bytes, or the CPU's when larger), and from 2 MiB up aligned
 * to 2 MiB and advised to use huge pages,
 * so a stream crosses a TLB entry per 2 MiB instead of per 4 KiB. Release with free. */
void *mem_alloc_stream(size_t size);

#endif
