/* bandwidth.json: a node's last memory bandwidth reading (bwcache.h). */
#include "node/bwcache.h"

#include "base/err.h"
#include "base/files.h"
#include "base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* No memory reads faster than 100 TB/s or slower than 100 MB/s: a figure outside is a
 * broken file (and 0 would mean "not measured" to placement while keeping the probe from
 * running again). */
#define BWCACHE_MAX_BPS 1e14
#define BWCACHE_MIN_BPS 1e8

/* A reading's file is a few hundred bytes: a larger one is not ours. */
#define BWCACHE_MAX_BYTES 4096

/* Reads the file whole into buf (at most cap bytes) without ever blocking on it: a FIFO,
 * a device or a huge file in its place is refused, not read (the node's shut-down waits
 * for this thread). */
static int read_small_file(const char *path, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s: none yet", path)
                               : cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > (off_t)cap)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not a regular file of at most %zu bytes", path, cap);
    ssize_t n = rc ? 0 : read(fd, buf, cap);
    if (!rc && n < 0)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "%s: %s", path, strerror(errno));
    close(fd);
    *len = n > 0 ? (size_t)n : 0;
    return rc;
}

int bwcache_read(const char *path, const struct bwcache_key *key, int64_t now, struct bwcache_entry *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char text[BWCACHE_MAX_BYTES];
    size_t len = 0;
    int rc = read_small_file(path, text, sizeof text, &len, err, errlen);
    if (rc)
        return rc;
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: %s", path, je.text);
    int64_t threads = 0, mib = 0, at = 0;
    json_t *bps = NULL;
    rc = json_is_object(j) ? 0 : cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not an object", path);
    if (!rc)
        rc = json_get_name(j, path, "cpu", BWCACHE_CPU_MAX, out->key.cpu, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "threads", 1, 4096, &threads, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "block_mib", 1, (int64_t)1 << 30, &mib, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "taken_at", 0, INT64_MAX, &at, err, errlen);
    if (!rc)
        rc = json_get_name(j, path, "style", sizeof out->style - 1, out->style, err, errlen);
    if (!rc)
        rc = json_get_member(j, path, "bytes_per_s", JSON_REAL, &bps, err, errlen);
    if (!rc && !(json_real_value(bps) >= BWCACHE_MIN_BPS && json_real_value(bps) < BWCACHE_MAX_BPS))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.bytes_per_s: %g is no bandwidth", path, json_real_value(bps));
    if (!rc) {
        out->key.threads = (int)threads;
        out->key.block_mib = mib;
        out->taken_at = at;
        out->bytes_per_s = json_real_value(bps);
    }
    json_decref(j);
    if (rc)
        return rc;
    if (strcmp(out->key.cpu, key->cpu) || out->key.threads != key->threads || out->key.block_mib != key->block_mib)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "%s: taken on '%s' with %d threads over %lld MiB", path,
                          out->key.cpu, out->key.threads, (long long)out->key.block_mib);
    if (at > now || now - at > BWCACHE_MAX_AGE_S)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "%s: taken %lld s ago", path, (long long)(now - at));
    return 0;
}

int bwcache_write(const char *path, const struct bwcache_entry *e, char *err, size_t errlen)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: path too long", path);
    json_t *j = json_pack("{s:s, s:i, s:I, s:f, s:s, s:I}", "cpu", e->key.cpu, "threads", e->key.threads, "block_mib",
                          (json_int_t)e->key.block_mib, "bytes_per_s", e->bytes_per_s, "style", e->style, "taken_at",
                          (json_int_t)e->taken_at);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EIO, "%s: cannot encode the reading", path);
    int rc = 0;
    if (json_dump_file(j, tmp, JSON_INDENT(1)) || files_sync(tmp, O_RDONLY) || rename(tmp, path)) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
    }
    json_decref(j);
    return rc;
}
