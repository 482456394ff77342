/* Memory of the machine and of this process, from /proc (Linux). */
#ifndef CAIRN_BASE_MEM_H
#define CAIRN_BASE_MEM_H

#include <stdint.h>

/* MemAvailable of /proc/meminfo in bytes, or -1 when unknown. */
int64_t mem_available(void);
/* MemTotal in bytes, or -1. */
int64_t mem_total(void);
/* Resident set of this process now (VmRSS) and at its peak (VmHWM), in bytes, or -1. */
int64_t mem_rss(void);
int64_t mem_peak_rss(void);

#endif
