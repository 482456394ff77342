/* What a node tells the cluster about its machine: memory, CPU, OS, free disk in the
 * models folder, network interfaces. A plain value type (no pointers), gathered at start
 * and again periodically; nodeinfo_changed() says when a new gather is worth an event. */
#ifndef CAIRN_NODE_NODEINFO_H
#define CAIRN_NODE_NODEINFO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NODEINFO_MAX_IFACES 16
#define NODEINFO_MAX_ADDRS 8  /* per interface */
#define NODEINFO_IP_MAX 48    /* textual IPv6 without scope is at most 45 characters */
#define NODEINFO_NAME_MAX 32  /* interface names (IFNAMSIZ is 16) */
#define NODEINFO_STR_MAX 128  /* cpu model, flags, OS strings, hostname */

#define NODEINFO_BYTES_MAX ((int64_t)1 << 52) /* bound on byte counts read from a peer */

/* Memory reports closer than max(64 MiB, 2% of total) to the last one are not a change;
 * free disk closer than max(512 MiB, 2% of the disk) neither. */
#define NODEINFO_MEM_MIN_DELTA ((int64_t)64 << 20)
#define NODEINFO_DISK_MIN_DELTA ((int64_t)512 << 20)
#define NODEINFO_REL_DELTA_PCT 2

struct nodeinfo_iface {
    char name[NODEINFO_NAME_MAX];
    bool loopback;
    int n_addrs;
    char addrs[NODEINFO_MAX_ADDRS][NODEINFO_IP_MAX]; /* numeric IPv4 or IPv6, no scope */
};

struct node_info {
    int64_t mem_total, mem_available; /* bytes, 0 when unknown */
    char cpu_model[NODEINFO_STR_MAX];
    int cores;                        /* online logical CPUs */
    int64_t mem_bandwidth;            /* bytes/s the node's threads read memory at (bwprobe.h), 0
                                         until measured; not gathered: the node sets it */
    char isa[NODEINFO_STR_MAX];       /* space-separated ISA features (base/cpu.h) */
    char os[NODEINFO_STR_MAX];        /* uname sysname, release and machine: "Linux 6.1.0 x86_64" */
    char hostname[NODEINFO_STR_MAX];
    int64_t disk_free, disk_total;    /* bytes on the models folder's file system, 0 unknown */
    int n_ifaces;
    struct nodeinfo_iface ifaces[NODEINFO_MAX_IFACES]; /* up interfaces with addresses */
};

/* Fills out with this machine's figures. models_dir may be NULL (disk stays 0) or not
 * exist yet (its nearest existing parent is measured). Fields that cannot be read stay
 * 0 or empty; fails only on bad arguments. */
int nodeinfo_gather(struct node_info *out, const char *models_dir, char *err, size_t errlen);

/* JSON object for the info (new reference, caller owns; NULL only when out of memory):
 * {"memory_total_bytes", "memory_available_bytes", "disk_free_bytes", "disk_total_bytes",
 *  "cpu_model", "cpu_cores", "isa", "os", "hostname",
 *  "interfaces": [{"name", "loopback", "addresses": ["127.0.0.1", "::1"]}],
 *  "memory_bandwidth_bytes_per_s" (only once measured)}. */
json_t *nodeinfo_to_json(const struct node_info *ni);

/* Parses and checks a JSON object from nodeinfo_to_json (possibly from a peer): every
 * field present with the right type and range (bytes 0..NODEINFO_BYTES_MAX), strings fit
 * and hold no control bytes, addresses are numeric IPs; unknown keys are ignored.
 * On failure out is zeroed and err says which field. */
int nodeinfo_from_json(const json_t *j, struct node_info *out, char *err, size_t errlen);

/* True when b differs from a enough to report: memory or disk moved by more than the
 * thresholds above, the bandwidth was measured, or CPU, ISA, OS, hostname or the set of
 * interfaces/addresses changed. */
bool nodeinfo_changed(const struct node_info *a, const struct node_info *b);

#endif
