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
    double best;                    /* bytes/s of the best read of any style */
    double by_style[N_BW_STYLES];   /* the best read of each style (0 where not run) */
    int best_style;
    int reads;                      /* reads done (each checked to have summed every word once) */
};

/* Reads a block of `bytes` (at least a few hundred MiB, so no cache holds it) with the
 * threads of p `reps` times, the styles taken in turn; 0, or -1 (out of memory, or a
 * read whose sum shows it did not read every word once). */
int bw_probe(struct pool *p, size_t bytes, int reps, struct bw_reading *out);

/* bw_probe that gives up (-1, *out holding the reads done) as soon as it sees *stop set:
 * between reads, and every 64 MiB while it touches the block. */
int bw_probe_until(struct pool *p, size_t bytes, int reps, const atomic_bool *stop, struct bw_reading *out);

/* The name of a style, as printed. */
const char *bw_style_name(int style);

/* The last-level data cache in bytes as the system reports it (the C library's sysconf,
 * else the largest cache of cpu0 in sysfs), 0 when it does not say. A VM may report its
 * host's whole cache (508 MiB on one of these), more than its own cores hold: the
 * probe's DRAM block is sized from the report all the same, so it errs large. */
size_t bw_llc_bytes(void);

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
