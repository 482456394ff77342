/* The bandwidth probe: the DRAM block's size against the last-level cache and free
 * memory, what fits the cache, that a probe reads every style the count of times it
 * was asked (every slice checked by its sum), how a kept block walks on from read to
 * read, and the roofline of groups timed between readings. Counts, sizes and arithmetic
 * only, no times. */
#include "base/bwprobe.h"
#include "base/pool.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stddef.h>

#define MIB ((size_t)1 << 20)

static void test_dram_block(void)
{
    /* 4x the cache, past the floor: the 508 MiB a Zen 5 VM reports gives 2032 MiB. */
    CHECK_EQ_INT(bw_dram_block(508 * MIB, 22LL << 30), 2032 * MIB);
    CHECK_EQ_INT(bw_dram_block(508 * MIB, -1), 2032 * MIB);
    /* A small or unknown cache: the 1 GiB floor. */
    CHECK_EQ_INT(bw_dram_block(32 * MIB, 22LL << 30), (size_t)BW_DRAM_MIN_MIB * MIB);
    CHECK_EQ_INT(bw_dram_block(0, 22LL << 30), (size_t)BW_DRAM_MIN_MIB * MIB);
    /* A huge cache: the ceiling. */
    CHECK_EQ_INT(bw_dram_block(4096 * MIB, 1LL << 40), (size_t)BW_DRAM_MAX_MIB * MIB);
    CHECK_EQ_INT(bw_dram_block((size_t)1 << 40, 1LL << 40), (size_t)BW_DRAM_MAX_MIB * MIB);
    /* Short of memory: a quarter of what is free, in whole MiB, never under the floor. */
    CHECK_EQ_INT(bw_dram_block(508 * MIB, 4LL << 30), 1024 * MIB);
    CHECK_EQ_INT(bw_dram_block(508 * MIB, (2LL << 30) + 3), 512 * MIB);
    CHECK_EQ_INT(bw_dram_block(508 * MIB, 100LL << 20), (size_t)BW_BLOCK_MIN_MIB * MIB);
    CHECK_EQ_INT(bw_dram_block(508 * MIB, 0), (size_t)BW_BLOCK_MIN_MIB * MIB);
    /* Always whole MiB. */
    CHECK_EQ_INT(bw_dram_block(300 * MIB + 12345, -1) % MIB, 0);
}

static void test_fits_llc(void)
{
    CHECK(bw_fits_llc(120.0 * (double)MIB, 508 * MIB), "a 120 MiB step fits 508 MiB");
    CHECK(bw_fits_llc(508.0 * (double)MIB, 508 * MIB), "the cache's own size fits");
    CHECK(!bw_fits_llc(664.0 * (double)MIB, 508 * MIB), "a 664 MiB step does not fit 508 MiB");
    CHECK(!bw_fits_llc(1.0, 0), "nothing fits an unknown cache");
}

static void test_llc_reported(void)
{
    /* Whatever the machine says, the figure is a size (or 0), not garbage. */
    size_t llc = bw_llc_bytes();
    CHECK(llc == 0 || (llc >= 4096 && llc <= ((size_t)1 << 40)), "llc %zu", llc);
}

/* Every style is read as many times as asked, each read summed right. */
static void test_probe_reads(int threads)
{
    struct pool *p = NULL;
    CHECK(pool_create(&p, threads) == 0, "pool of %d", threads);
    if (!p)
        return;
    struct bw_reading r;
    int rc = bw_probe(p, 4 * MIB + 4096, 2 * N_BW_STYLES, &r);
    CHECK(rc == 0, "probe of %d threads: %d", threads, rc);
    CHECK_EQ_INT(r.reads, 2 * N_BW_STYLES);
    for (int s = 0; s < N_BW_STYLES; s++)
        CHECK(r.by_style[s] > 0, "style %s read with %d threads", bw_style_name(s), threads);
    CHECK(r.best >= r.by_style[r.best_style] && r.best > 0, "best is a style's best");
    /* Fewer reads than styles: only the first styles are read. */
    rc = bw_probe(p, 2 * MIB, 2, &r);
    CHECK(rc == 0 && r.reads == 2 && r.by_style[0] > 0 && r.by_style[1] > 0 && r.by_style[2] == 0,
          "two reads: rc %d, %d reads", rc, r.reads);
    pool_release(p);
}

/* A kept block: slices of BW_SLICE_MIB_PER_THREAD a thread, the whole block under two of those; reads walk
 * on across calls (the styles too) and start over at the block's end, each slice summed
 * right. */
static void test_block_walk(int threads)
{
    struct pool *p = NULL;
    struct bw_block *b = NULL;
    CHECK(pool_create(&p, threads) == 0, "pool of %d", threads);
    CHECK(bw_block_create(&b, 40 * MIB + 100, NULL) == 0, "a 40 MiB block");
    if (!p || !b) {
        bw_block_release(b);
        pool_release(p);
        return;
    }
    size_t slice = (size_t)threads * BW_SLICE_MIB_PER_THREAD * MIB;
    /* a block under two slices is read whole: else the walk rereads its first slice only */
    CHECK_EQ_INT(bw_slice_bytes(b, threads), 2 * slice <= 40 * MIB ? slice : 40 * MIB);
    CHECK_EQ_INT(bw_slice_bytes(b, 64), 40 * MIB); /* never more than the block (whole KiB of it) */
    struct bw_reading r = {0};
    CHECK(bw_block_read(b, p, 4, NULL, &r) == 0 && r.reads == 4, "four slices: %d reads", r.reads);
    /* One thread shares every slice with itself; more share at most every slice. */
    CHECK(threads == 1 ? r.shared == 4 : r.shared >= 0 && r.shared <= 4, "%d threads shared %d slices", threads,
          r.shared);
    for (int s = 0; s < N_BW_STYLES; s++)
        CHECK((r.by_style[s] > 0) == (s < 4), "after four slices, style %s read: %g", bw_style_name(s), r.by_style[s]);
    /* The next read goes on with the fifth style, and past the end of the block. */
    struct bw_reading r2 = {0};
    CHECK(bw_block_read(b, p, 2 + 8, NULL, &r2) == 0 && r2.reads == 10, "ten more slices: %d reads", r2.reads);
    CHECK(r2.by_style[4] > 0 && r2.by_style[5] > 0, "the walk's styles go on");
    /* A reading adds to what *out holds. */
    CHECK(bw_block_read(b, p, 1, NULL, &r2) == 0 && r2.reads == 11, "adds: %d reads", r2.reads);
    atomic_bool stop = true;
    CHECK(bw_block_read(b, p, 3, &stop, &r2) == -1 && r2.reads == 11, "a set stop reads nothing: %d", r2.reads);
    bw_block_release(b);
    bw_block_release(NULL);
    CHECK(bw_probe_until(p, 8 * MIB, 4, &stop, &r) == -1, "the probe gives up on a set stop");
    pool_release(p);
}

/* Each group is held against the higher reading on either side of it, weighted by its time. */
static void test_interleaved_roofline(void)
{
    const double t1[] = {1, 3}, bw1[] = {10, 20, 5};
    CHECK(bw_interleaved_roofline(t1, bw1, 2) == 20, "both groups beside the 20: %g",
          bw_interleaved_roofline(t1, bw1, 2));
    const double t2[] = {1, 1}, bw2[] = {10, 5, 30};
    CHECK(bw_interleaved_roofline(t2, bw2, 2) == 20, "10 and 30, equal times: %g", bw_interleaved_roofline(t2, bw2, 2));
    const double t3[] = {3, 1}, bw3[] = {8, 4, 16};
    CHECK(bw_interleaved_roofline(t3, bw3, 2) == 10, "8 for 3 s, 16 for 1 s: %g", bw_interleaved_roofline(t3, bw3, 2));
    const double t0[] = {0}, bw0[] = {7, 9};
    CHECK(bw_interleaved_roofline(t0, bw0, 1) == 0, "no time timed");
    CHECK(bw_interleaved_roofline(t0, bw0, 0) == 0, "no groups");
}

/* The threads' CPU-time rates count at most as many threads as there are CPUs: threads
 * that took turns on fewer CPUs each read at one CPU's whole rate. */
static void test_slice_rate(void)
{
    const double mib16 = 16.0 * MIB, one = 8.0 * MIB / 1e-3; /* a thread's rate alone */
    /* four threads on one CPU, each at one CPU's rate: that rate, not four times it */
    CHECK(bw_slice_rate(mib16, 4e-3, 4 * one, one, 4, 1) == one, "four threads on one CPU: %g",
          bw_slice_rate(mib16, 4e-3, 4 * one, one, 4, 1));
    /* two threads on two CPUs: the sum stands (a neighbour's load may hide it from the wall) */
    CHECK(bw_slice_rate(mib16, 2e-3, 2 * one, one, 2, 2) == 2 * one, "two threads, two CPUs");
    /* the wall clock's rate where higher; no span, no rate */
    CHECK(bw_slice_rate(mib16, 0.5e-3, 2 * one, one, 4, 1) == mib16 / 0.5e-3, "the wall clock's");
    CHECK(bw_slice_rate(mib16, 0, 0, 0, 2, 2) == 0, "no span");
    /* CPUs unknown: the sum as it is */
    CHECK(bw_slice_rate(mib16, 4e-3, 4 * one, one, 4, 0) == 4 * one, "CPUs unknown");
}

/* The last-level cache from the C library's and the kernel's reports: L3 against L3 only. */
static void test_llc_pick(void)
{
    CHECK_EQ_INT(bw_llc_pick(320 * MIB, 1 * MIB, 32 * MIB, 32 * MIB), 32 * MIB); /* a Zen 4 VM */
    CHECK_EQ_INT(bw_llc_pick(16 * MIB, 1 * MIB, 32 * MIB, 32 * MIB), 16 * MIB);
    /* the C library knows no L3, the kernel does: not the C library's L2 */
    CHECK_EQ_INT(bw_llc_pick(0, 2 * MIB, 32 * MIB, 32 * MIB), 32 * MIB);
    /* the kernel lists no L3: its L2 is no bound on the C library's L3 */
    CHECK_EQ_INT(bw_llc_pick(32 * MIB, 1 * MIB, 0, 1 * MIB), 32 * MIB);
    CHECK_EQ_INT(bw_llc_pick(0, 1 * MIB, 0, 2 * MIB), 2 * MIB);
    CHECK_EQ_INT(bw_llc_pick(0, 0, 0, 0), 0);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_dram_block);
    RUN(test_fits_llc);
    RUN(test_llc_reported);
    RUN(test_probe_reads, 1);
    RUN(test_probe_reads, 2);
    RUN(test_probe_reads, 3);
    RUN(test_block_walk, 1);
    RUN(test_block_walk, 3);
    RUN(test_interleaved_roofline);
    RUN(test_slice_rate);
    RUN(test_llc_pick);
    return test_main_end();
}
