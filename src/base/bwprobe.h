/* The memory read bandwidth that decode's roofline is measured against (bwprobe.c).
 *
 * Decode reads each weight once per step, so its ceiling is the rate at which the
 * engine's threads can stream memory. One access pattern does not find that rate on
 * every machine: on some cores one sequential stream per thread leaves the memory
 * system idle between misses, while a matrix-vector kernel keeps several rows (several
 * streams) in flight. The probe reads the same block in several patterns and takes the
 * best, so the roofline is never below what a kernel can reach. */
#ifndef CAIRN_BASE_BWPROBE_H
#define CAIRN_BASE_BWPROBE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

struct pool;

enum bw_style {
    BW_PLAIN,      /* one stream per thread, widest loads */
    BW_PF_L1,      /* the same, software prefetch into L1 2 KiB ahead */
    BW_PF_L2,      /* the same, software prefetch into L2 8 KiB ahead */
    BW_STREAMS4,   /* four streams per thread, read in turn 256 bytes at a time */
    BW_STREAMS8,   /* eight streams per thread */
    BW_STREAMS8_PF,/* eight streams, each prefetched into L2 4 KiB ahead */
    N_BW_STYLES
};

struct bw_reading {
    double best;                    /* bytes/s of the best slice of any style */
    double by_style[N_BW_STYLES];   /* the best slice of each style (0 where not run) */
    int best_style;
    int reads;                      /* slices read (each checked to have summed every word once) */
    int shared;                     /* slices every thread read a quarter of an even share of or more */
};

/* The probe reads a block in short slices (BW_SLICE_MIB_PER_THREAD a thread, well under a
 * millisecond at DRAM's rate), each from where the last ended, the styles in turn; the
 * threads claim each slice's words as the engine's products claim rows, and a slice's
 * rate is its bytes over the time from the first thread's start to the last one's end,
 * or the sum of the threads' rates over their own CPU times where that is higher
 * (bw_slice_rate). On a shared machine a long read whose threads
 * each own half waits for a preempted thread: it read half the rate two threads reach
 * (29.5 against 65 GB/s on a Zen 4 VM beside a busy neighbour). The best of many short
 * slices is the rate the threads reach while they all hold a CPU. */
#define BW_SLICE_MIB_PER_THREAD 8

/* A slice's rate in bytes/s: its bytes over its wall-clock span, or cpu_rates (the sum of
 * the threads' rates over their own CPU times: the rate they reach together while they
 * all hold a CPU, which a neighbour's load hides from the wall clock) where higher. Where
 * the `threads` outnumber the `cpus` the process may run on, they took turns and each
 * read at a CPU's whole rate: the sum then counts at most cpus times the highest thread
 * rate max_rate (two threads pinned to one CPU of a Zen 4 VM summed to 52-62 GB/s, four
 * to 80, where one thread reads 31-37). Where fewer threads ran at once than there are
 * CPUs, the sum still errs high, as a ceiling may. */
double bw_slice_rate(double bytes, double span_s, double cpu_rates, double max_rate, int threads, int cpus);

/* A block kept for reads (bw_block_read) between other work, such as decode steps. */
struct bw_block;

/* Allocates a block of `bytes` (huge pages advised; whole KiB) and writes every word, so
 * its pages are present; 0, or -1 (out of memory, or *stop seen while writing: stop may
 * be NULL). Release with bw_block_release. */
int bw_block_create(struct bw_block **out, size_t bytes, const atomic_bool *stop);

/* Frees b (NULL is fine). */
void bw_block_release(struct bw_block *b);

/* Reads `slices` slices of b with the threads of p, walking on from where the last read
 * ended (back to the start at the end), one style a slice in turn; adds each slice's
 * rate to *out (best, by_style, reads, shared: *out is not cleared). 0, or -1 (a slice whose sum
 * shows it did not read every word once, or *stop seen between slices). */
int bw_block_read(struct bw_block *b, struct pool *p, int slices, const atomic_bool *stop, struct bw_reading *out);

/* The bytes of one slice of b with `threads` threads: BW_SLICE_MIB_PER_THREAD MiB a
 * thread, or the whole block where it holds less than two of those. */
size_t bw_slice_bytes(const struct bw_block *b, int threads);

/* Reads a block of `bytes` (much larger than the last-level cache, so the walk finds
 * none of it cached) in `reps` slices, the styles in turn; 0, or -1 (out of memory, or
 * a read whose sum shows it did not read every word once). */
int bw_probe(struct pool *p, size_t bytes, int reps, struct bw_reading *out);

/* bw_probe that gives up (-1, *out holding the reads done) as soon as it sees *stop set:
 * between slices, and every 64 MiB while it writes the block. */
int bw_probe_until(struct pool *p, size_t bytes, int reps, const atomic_bool *stop, struct bw_reading *out);

/* The roofline of work timed in groups between probe readings: group g took t[g] seconds
 * between the readings bw[g] and bw[g + 1] (bytes/s; n_groups + 1 of them), and its
 * ceiling is the higher of the two, the one that held on either side of it. Returns the
 * ceilings' mean weighted by the groups' times (bytes/s), 0 when no time was timed. */
double bw_interleaved_roofline(const double *t, const double *bw, int n_groups);

/* The name of a style, as printed. */
const char *bw_style_name(int style);

/* The last-level data cache in bytes as the system reports it (bw_llc_pick of the C
 * library's sysconf and cpu0's caches in sysfs); 0 when neither says. A VM may report its
 * host's whole cache through the C library (320 MiB on a Zen 4 one, whose kernel lists
 * cpu0's 32 MiB); the probe's DRAM block is sized from the report all the same, so where
 * it errs it errs large. */
size_t bw_llc_bytes(void);

/* The last-level cache from the reports (bytes, 0 where not reported): the smaller L3
 * where the C library and the kernel both give one, else the C library's L3, else the
 * larger of its L2 and the kernel's largest cache. */
size_t bw_llc_pick(size_t libc_l3, size_t libc_l2, size_t sys_l3, size_t sys_max);

#define BW_DRAM_LLC_TIMES 4   /* the DRAM block against the last-level cache */
#define BW_DRAM_MIN_MIB 1024  /* ... at least (and where the cache is unknown) */
#define BW_DRAM_MAX_MIB 8192  /* ... at most */
#define BW_MEM_SHARE 4        /* ... and at most this share (1/4) of the free memory */
#define BW_BLOCK_MIN_MIB 64   /* the floor under a short free memory */

/* The block that reads DRAM rather than a cache: BW_DRAM_LLC_TIMES x llc (bytes; 0 when
 * unknown), at least BW_DRAM_MIN_MIB and at most BW_DRAM_MAX_MIB, capped by 1/BW_MEM_SHARE
 * of avail (free memory in bytes; < 0 when unknown) but not below BW_BLOCK_MIN_MIB; whole
 * MiB. */
size_t bw_dram_block(size_t llc, long long avail);

/* Whether a block of `bytes` (a model's step) fits a last-level cache of llc (0: no
 * cache known, so nothing fits). */
int bw_fits_llc(double bytes, size_t llc);

#endif
