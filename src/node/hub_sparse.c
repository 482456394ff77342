/* Models fetched by byte ranges (hub.h, "sparse models"): a pipeline rank reads only its
 * layers, so a node fetches the header and those layers' tensors, not the whole file.
 *
 * On disk, in models_dir/.sparse: each file of the model under its local name, of the
 * file's whole size with holes where nothing was fetched; beside it "<local>.have", the
 * byte ranges that are there ({"size", "ranges": [[begin, end], ...]}, sorted, apart),
 * written only after the bytes it names are synced; and the sidecar of the model, as a
 * pull writes it (reference, commit, each file's path, size and SHA-256), so a catalog
 * of the folder names the model by its reference and reads its card from the header.
 *
 * What is not checked: a range's bytes come over the hub's connection (TLS on the real
 * hub) with no hash of their own; the LFS SHA-256 covers the whole file, so it is checked
 * when every byte of a file is there, and the model then moves into the models folder as
 * a pulled model (or is deleted, with the reason, if a hash differs). */
#include "node/hub.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/files.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "node/catalog.h"
#include "node/download.h"
#include "node/hub_int.h"
#include "node/ranges.h"


/* ---- paths ---- */

int hub_sparse_dir(const char *models_dir, char *out, size_t cap)
{
    int w = snprintf(out, cap, "%s/" HUB_SPARSE_DIR, models_dir);
    return w > 0 && (size_t)w < cap ? 0 : CAIRN_ERANGE;
}

/* The sparse file and its record of part k (0-based) of a sidecar's files. */
static bool part_paths(const char *dir, json_t *side, size_t k, char *file, char *have, size_t cap, uint64_t *size,
                       const char **sha256, const char **repo_path)
{
    json_t *e = json_array_get(json_object_get(side, "files"), k);
    const char *local = json_string_value(json_object_get(e, "local"));
    json_int_t sz = json_integer_value(json_object_get(e, "size"));
    if (!local || !local[0] || local[0] == '.' || strchr(local, '/') || sz <= 0 || (uint64_t)sz > IDS_BYTES_MAX ||
        !hub_in_dir(dir, local, file, cap) || snprintf(have, cap, "%s" RANGES_SUFFIX, file) >= (int)cap)
        return false;
    *size = (uint64_t)sz;
    if (sha256)
        *sha256 = json_string_value(json_object_get(e, "sha256"));
    if (repo_path)
        *repo_path = json_string_value(json_object_get(e, "path"));
    return true;
}

/* ---- the header ---- */

#define HEADER_FIRST_READ ((uint64_t)1 << 20)

struct count {
    uint64_t bytes;
};

static void count_bytes(void *ctx, uint64_t n) { ((struct count *)ctx)->bytes += n; }

/* Fetches the header of one file into fd (a file of the whole size): the first MiB, then
 * four times more until the header parses, at most HUB_HEADER_MAX. *end: where its data
 * starts; *got: the bytes fetched (all of them are kept). */
static int fetch_header(const struct hub *h, const char *url, const char *what, int fd, uint64_t size, uint64_t *end,
                        uint64_t *got, char *err, size_t errlen)
{
    uint64_t have = 0, want = size < HEADER_FIRST_READ ? size : HEADER_FIRST_READ;
    for (;;) {
        struct count c = {0};
        int rc = hub_fetch_range(h, url, fd, have, want - have, count_bytes, &c, err, errlen);
        if (rc)
            return rc;
        have = want;
        uint8_t *buf = malloc(have);
        if (!buf)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        char why[512];
        rc = pread(fd, buf, have, 0) == (ssize_t)have ? gguf_header_end(buf, have, size, end, why, sizeof why)
                                                     : CAIRN_EIO;
        free(buf);
        if (!rc) {
            *got = have;
            return 0;
        }
        uint64_t cap = size < HUB_HEADER_MAX ? size : HUB_HEADER_MAX;
        if (rc == CAIRN_EIO)
            return cairn_fail(err, errlen, CAIRN_EIO, "%s: cannot read back its first bytes", what);
        if (have >= cap)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: no GGUF header in its first %" PRIu64 " bytes: %s",
                              what, have, why);
        want = have * 4 < cap ? have * 4 : cap;
    }
}

int hub_sparse_header(const struct hub_config *cfg, const char *text, char *id, char *err, size_t errlen)
{
    id[0] = 0;
    struct hub h;
    struct hub_ref ref;
    int rc = hub_begin(cfg, text, &h, &ref, err, errlen);
    if (rc)
        return rc;
    if (h.offline)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "HF_HUB_OFFLINE is set: %s cannot be read from the hub", text);
    char dir[4096];
    if (hub_sparse_dir(cfg->models_dir, dir, sizeof dir))
        return cairn_fail(err, errlen, CAIRN_ERANGE, "the models folder's path is too long");
    if ((rc = files_make_dirs(dir, 0755, err, errlen)))
        return rc;
    hub_curl_init();
    struct listing l = {0};
    size_t pick[HUBREF_MAX_PARTS], n_pick = 0;
    rc = hub_resolve(&h, &ref, &l, pick, &n_pick, id, err, errlen);
    json_t *side = rc ? NULL : hub_sidecar_load(dir, id);
    const char *commit = json_string_value(json_object_get(side, "commit"));
    bool here = commit && !strcmp(commit, l.commit) && json_array_size(json_object_get(side, "files")) == n_pick;
    for (size_t k = 0; here && k < n_pick; k++) {
        char file[4200], have[4200];
        uint64_t size;
        struct stat st;
        here = part_paths(dir, side, k, file, have, sizeof file, &size, NULL, NULL) && !stat(file, &st) &&
               (uint64_t)st.st_size == size;
    }
    json_decref(side);
    uint64_t fetched = 0;
    for (size_t k = 0; !rc && !here && k < n_pick; k++) {
        const struct hub_file *f = &l.f[pick[k]];
        char local[HUBREF_TEXT_MAX], tmp[4200], final[4200], have_path[4200], url[4096];
        hubref_local_name(id, (int)k + 1, (int)n_pick, local);
        snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", h.endpoint, ref.owner, ref.repo, l.commit, f->path);
        if (!f->sha256 || !f->size || f->size > IDS_BYTES_MAX) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub lists no SHA-256 or a size of %" PRIu64, f->path,
                            f->size);
            break;
        }
        int w = snprintf(tmp, sizeof tmp, "%s/.%s.new", dir, local);
        if (w < 0 || (size_t)w >= sizeof tmp || !hub_in_dir(dir, local, final, sizeof final) ||
            snprintf(have_path, sizeof have_path, "%s" RANGES_SUFFIX, final) >= (int)sizeof have_path) {
            rc = cairn_fail(err, errlen, CAIRN_ERANGE, "the models folder's path is too long");
            break;
        }
        int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot create %s: %s", tmp, strerror(errno));
            break;
        }
        uint64_t end = 0, got = 0;
        if (ftruncate(fd, (off_t)f->size))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot size %s: %s", tmp, strerror(errno));
        if (!rc)
            rc = fetch_header(&h, url, f->path, fd, f->size, &end, &got, err, errlen);
        if (!rc && fsync(fd))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot sync %s: %s", tmp, strerror(errno));
        close(fd);
        struct ranges hv = {.size = f->size};
        if (!rc && !ranges_add(&hv, 0, got))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        if (!rc)
            rc = ranges_store(have_path, &hv, true, err, errlen);
        ranges_free(&hv);
        if (!rc && rename(tmp, final))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot rename %s: %s", tmp, strerror(errno));
        if (rc)
            unlink(tmp);
        fetched += got;
    }
    if (!rc && !here)
        rc = hub_sidecar_write(&h, dir, id, &ref, &l, pick, n_pick, err, errlen);
    hub_listing_free(&l);
    if (!rc && !here)
        log_info("hub: %s: header read (%" PRIu64 " bytes of %zu file%s)", id, fetched, n_pick, n_pick > 1 ? "s" : "");
    return rc;
}

/* ---- layers ---- */

/* The ranges layers [begin, end) of the sparse model read, per part. */
static int slice_extents(const char *first_file, int begin, int end, struct model_extent **ext, size_t *n,
                         char *err, size_t errlen)
{
    struct gguf_file *g = NULL;
    int rc = gguf_open(&g, first_file, err, errlen);
    if (!rc)
        rc = model_slice_extents(g, begin, end, ext, n, err, errlen);
    gguf_close(g);
    return rc;
}

struct sparse_model {
    char dir[4096];
    json_t *side;
    size_t parts;
    char file[HUBREF_MAX_PARTS][4200], have_path[HUBREF_MAX_PARTS][4200];
    uint64_t size[HUBREF_MAX_PARTS];
    const char *sha256[HUBREF_MAX_PARTS], *repo_path[HUBREF_MAX_PARTS];
    struct ranges have[HUBREF_MAX_PARTS];
};

static void sparse_close(struct sparse_model *m)
{
    for (size_t k = 0; k < m->parts; k++)
        ranges_free(&m->have[k]);
    json_decref(m->side);
    free(m);
}

/* Opens the sparse model id of models_dir: NULL (err set) when there is none. */
static struct sparse_model *sparse_open(const char *models_dir, const char *id, char *err, size_t errlen)
{
    struct sparse_model *m = calloc(1, sizeof *m);
    if (!m) {
        cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        return NULL;
    }
    bool ok = !hub_sparse_dir(models_dir, m->dir, sizeof m->dir) && (m->side = hub_sidecar_load(m->dir, id));
    m->parts = ok ? json_array_size(json_object_get(m->side, "files")) : 0;
    ok = ok && m->parts >= 1 && m->parts <= HUBREF_MAX_PARTS;
    for (size_t k = 0; ok && k < m->parts; k++) {
        ok = part_paths(m->dir, m->side, k, m->file[k], m->have_path[k], sizeof m->file[k], &m->size[k], &m->sha256[k],
                        &m->repo_path[k]);
        if (ok)
            ranges_load(m->have_path[k], m->size[k], &m->have[k]);
    }
    if (!ok) {
        cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no header of %s in %s: place or preview it first", id, m->dir);
        if (!m->side)
            m->parts = 0;
        sparse_close(m);
        return NULL;
    }
    return m;
}

static bool part_whole(const struct sparse_model *m, size_t k)
{
    return m->have[k].n == 1 && m->have[k].r[0][0] == 0 && m->have[k].r[0][1] == m->size[k];
}

bool hub_sparse_covers(const char *models_dir, const char *id, int layer_begin, int layer_end, char *path,
                       size_t pathlen)
{
    char err[512];
    struct sparse_model *m = sparse_open(models_dir, id, err, sizeof err);
    if (!m)
        return false;
    struct model_extent *ext = NULL;
    size_t n = 0;
    bool ok = !slice_extents(m->file[0], layer_begin, layer_end, &ext, &n, err, sizeof err);
    for (size_t i = 0; ok && i < n; i++)
        ok = ext[i].part >= 0 && (size_t)ext[i].part < m->parts &&
             !ranges_missing(&m->have[ext[i].part], ext[i].offset, ext[i].offset + ext[i].len);
    if (ok && (size_t)snprintf(path, pathlen, "%s", m->file[0]) >= pathlen)
        ok = false;
    free(ext);
    sparse_close(m);
    return ok;
}

/* Every part whole: checks each against its SHA-256 and moves the model into models_dir
 * as a pulled model; a hash that differs deletes the sparse model. */
static int promote(const char *models_dir, const char *id, struct sparse_model *m, char *err, size_t errlen)
{
    for (size_t k = 0; k < m->parts; k++) {
        char hex[CATALOG_SHA256_HEX];
        int rc = catalog_file_sha256(m->file[k], hex, NULL, NULL, err, errlen);
        if (rc)
            return rc;
        if (!m->sha256[k] || strcmp(hex, m->sha256[k])) {
            char ignored[256];
            hub_sparse_remove(models_dir, id, ignored, sizeof ignored);
            return cairn_fail(err, errlen, CAIRN_EFORMAT,
                              "%s: the SHA-256 of the fetched ranges is %s, not the hub's %s: the partial model was deleted",
                              m->repo_path[k] ? m->repo_path[k] : m->file[k], hex, m->sha256[k] ? m->sha256[k] : "?");
        }
    }
    int rc = hub_sidecar_store(models_dir, id, json_incref(m->side), err, errlen);
    for (size_t k = m->parts; !rc && k-- > 0;) { /* the first part last: the catalog lists a whole model */
        const char *base = strrchr(m->file[k], '/') + 1;
        char final[4200];
        if (!hub_in_dir(models_dir, base, final, sizeof final) || rename(m->file[k], final))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot move %s into %s: %s", m->file[k], models_dir,
                            strerror(errno));
        unlink(m->have_path[k]);
    }
    if (!rc) {
        char name[HUBREF_TEXT_MAX + 16], side[4200];
        hubref_sidecar_name(id, name);
        if (hub_in_dir(m->dir, name, side, sizeof side))
            unlink(side);
        files_sync(models_dir, O_RDONLY | O_DIRECTORY);
        log_info("hub: %s: every byte fetched and verified: moved into %s", id, models_dir);
    }
    return rc;
}

struct fill_progress {
    hub_progress_fn fn;
    void *ctx;
    struct hub_progress p;
    int64_t reported_ms;
    uint64_t fetched;
};

static void fill_bytes(void *ctx, uint64_t n)
{
    struct fill_progress *f = ctx;
    f->fetched += n;
    f->p.done += n;
    int64_t now = clock_ns() / 1000000;
    if (f->fn && now - f->reported_ms >= HUB_PROGRESS_MS) {
        f->reported_ms = now;
        f->fn(f->ctx, &f->p);
    }
}

int hub_sparse_fill(const struct hub_config *cfg, const char *id, int layer_begin, int layer_end, hub_progress_fn fn,
                    void *ctx, struct hub_sparse_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    struct hub h;
    struct hub_ref ref;
    int rc = hub_begin(cfg, id, &h, &ref, err, errlen);
    if (rc)
        return rc;
    struct sparse_model *m = sparse_open(cfg->models_dir, id, err, errlen);
    if (!m)
        return CAIRN_ENOTFOUND;
    const char *commit = json_string_value(json_object_get(m->side, "commit"));
    struct model_extent *ext = NULL;
    size_t n = 0;
    rc = commit && hub_is_hex(commit, strlen(commit)) ? 0
                                                      : cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: no commit", id);
    if (!rc)
        rc = slice_extents(m->file[0], layer_begin, layer_end, &ext, &n, err, errlen);
    struct fill_progress fp = {.fn = fn, .ctx = ctx};
    fp.p = (struct hub_progress){.status = "downloading", .id = id, .file = "", .sha256 = "", .parts = (int)m->parts};
    uint64_t need = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (ext[i].part < 0 || (size_t)ext[i].part >= m->parts) {
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: a tensor in part %d of %zu", id, ext[i].part + 1, m->parts);
            break;
        }
        uint64_t miss = ranges_missing(&m->have[ext[i].part], ext[i].offset, ext[i].offset + ext[i].len);
        fp.p.total += ext[i].len;
        fp.p.done += ext[i].len - miss;
        need += miss;
    }
    if (!rc && need)
        rc = download_disk_check(cfg->models_dir, need, err, errlen);
    if (!rc && need && !h.offline)
        hub_curl_init();
    else if (!rc && need)
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "HF_HUB_OFFLINE is set and %s lacks %" PRIu64 " bytes of layers %d..%d",
                        id, need, layer_begin, layer_end);
    if (fn && !rc)
        fn(ctx, &fp.p);
    for (size_t i = 0; !rc && i < n; i++) {
        size_t k = (size_t)ext[i].part;
        struct ranges *hv = &m->have[k];
        uint64_t a = ext[i].offset, b = ext[i].offset + ext[i].len;
        if (!ranges_missing(hv, a, b))
            continue;
        char url[4096];
        snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", h.endpoint, ref.owner, ref.repo, commit,
                 m->repo_path[k] ? m->repo_path[k] : "");
        int fd = open(m->file[k], O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot open %s: %s", m->file[k], strerror(errno));
            break;
        }
        fp.p.part = (int)k + 1;
        fp.p.file = m->repo_path[k] ? m->repo_path[k] : "";
        /* The holes of [a, b), one request each (the bytes already there are not asked for again). */
        uint64_t hole, hole_end;
        for (uint64_t at = a; !rc && ranges_next_hole(hv, at, b, &hole, &hole_end); at = hole_end) {
            rc = hub_fetch_range(&h, url, fd, hole, hole_end - hole, fill_bytes, &fp, err, errlen);
            if (!rc && fdatasync(fd))
                rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot sync %s: %s", m->file[k], strerror(errno));
            if (!rc && !ranges_add(hv, hole, hole_end))
                rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            if (!rc)
                rc = ranges_store(m->have_path[k], hv, true, err, errlen);
        }
        close(fd);
    }
    free(ext);
    out->fetched = fp.fetched;
    out->needed = fp.p.total;
    bool whole = !rc;
    for (size_t k = 0; whole && k < m->parts; k++)
        whole = part_whole(m, k);
    if (whole) {
        rc = promote(cfg->models_dir, id, m, err, errlen);
        out->promoted = !rc;
    }
    if (!rc) {
        snprintf(out->path, sizeof out->path, "%s", m->file[0]);
        log_info("hub: %s: layers %d..%d here (%" PRIu64 " bytes fetched, %" PRIu64 " read by them)", id, layer_begin,
                 layer_end, out->fetched, out->needed);
        if (fn) {
            fp.p.status = "success";
            fn(ctx, &fp.p);
        }
    }
    sparse_close(m);
    return rc;
}

int hub_sparse_remove(const char *models_dir, const char *id, char *err, size_t errlen)
{
    struct sparse_model *m = sparse_open(models_dir, id, err, errlen);
    if (!m)
        return CAIRN_ENOTFOUND;
    int rc = 0;
    for (size_t k = 0; k < m->parts; k++) {
        if (unlink(m->file[k]) && errno != ENOENT)
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot delete %s: %s", m->file[k], strerror(errno));
        unlink(m->have_path[k]);
    }
    char name[HUBREF_TEXT_MAX + 16], side[4200];
    hubref_sidecar_name(id, name);
    if (!rc && hub_in_dir(m->dir, name, side, sizeof side))
        unlink(side);
    sparse_close(m);
    return rc;
}
