/* bandwidth.json: a node's last memory bandwidth reading (bwcache.h). */
#include "node/bwcache.h"

#include "base/err.h"
#include "base/files.h"
#include "base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

/* No memory reads faster than this (bytes/s): a larger figure is a broken file. */
#define BWCACHE_MAX_BPS 1e14

int bwcache_read(const char *path, const struct bwcache_key *key, int64_t now, struct bwcache_entry *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        FILE *f = fopen(path, "r");
        if (!f)
            return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s: none yet", path);
        fclose(f);
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: %s", path, je.text);
    }
    int64_t threads = 0, mib = 0, at = 0;
    json_t *bps = NULL;
    int rc = json_is_object(j) ? 0 : cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not an object", path);
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
    if (!rc && !(json_real_value(bps) > 0 && json_real_value(bps) < BWCACHE_MAX_BPS))
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
