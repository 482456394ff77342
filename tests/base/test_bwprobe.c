/* The bandwidth probe: the DRAM block's size against the last-level cache and free
 * memory, what fits the cache, and that a probe reads every style the count of times it
 * was asked (every read checked by its sum). Counts and sizes only, no times. */
#include "base/bwprobe.h"
#include "base/pool.h"
#include "testutil.h"

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

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_dram_block);
    RUN(test_fits_llc);
    RUN(test_llc_reported);
    RUN(test_probe_reads, 1);
    RUN(test_probe_reads, 2);
    RUN(test_probe_reads, 3);
    return test_main_end();
}
