/* The node's memory bandwidth reading, kept in its data folder (bandwidth.json) so that
 * a node that starts again on the same machine reports it at once instead of reading a
 * DRAM-sized block again. A reading counts only for the machine and settings it was
 * taken with: the same CPU model, runner threads and block, and not older than
 * BWCACHE_MAX_AGE_S. The file is the node's own, but read as hostile all the same. */
#ifndef CAIRN_NODE_BWCACHE_H
#define CAIRN_NODE_BWCACHE_H

#include <stddef.h>
#include <stdint.h>

#define BWCACHE_FILE "bandwidth.json"
#define BWCACHE_MAX_AGE_S (7 * 24 * 3600)
#define BWCACHE_CPU_MAX 63 /* bytes of the CPU model kept (cpu_features.model) */

/* What a reading was taken with. */
struct bwcache_key {
    char cpu[BWCACHE_CPU_MAX + 1]; /* the CPU model as cpu_features reports it */
    int threads;                   /* the pool's threads */
    int64_t block_mib;             /* the block read */
};

struct bwcache_entry {
    struct bwcache_key key;
    double bytes_per_s; /* the best read of any style */
    char style[32];     /* its name (bw_style_name) */
    int64_t taken_at;   /* Unix seconds */
};

/* Reads the entry at path into *out; 0 when it parses and matches key at time now
 * (taken within BWCACHE_MAX_AGE_S before it, not after), else CAIRN_ENOTFOUND (no file),
 * CAIRN_EFORMAT (a file that does not parse or holds an impossible figure) or
 * CAIRN_ESTATE (another CPU, other settings, or too old); err says why. */
int bwcache_read(const char *path, const struct bwcache_key *key, int64_t now, struct bwcache_entry *out,
                 char *err, size_t errlen);

/* Writes e to path through a temporary file and a rename; 0, or CAIRN_EIO with err. */
int bwcache_write(const char *path, const struct bwcache_entry *e, char *err, size_t errlen);

#endif
