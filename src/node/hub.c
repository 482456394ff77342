/* Pulling models from the hub (hub.h): the sidecar, a pull, removing a model. */
#include "node/hub.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/files.h"
#include "base/log.h"
#include "base/version.h"
#include "node/catalog.h"
#include "node/download.h"
#include "node/hub_int.h"
#include "node/ranges.h"
#include "node/sha256.h"
#include "proto/ids.h"

/* ---- the sidecar ---- */

/* models_dir/name into out (cap bytes); false when it does not fit. */
bool hub_in_dir(const char *dir, const char *name, char *out, size_t cap)
{
    int w = snprintf(out, cap, "%s/%s", dir, name);
    return w > 0 && (size_t)w < cap;
}

/* Reads models_dir's sidecar of id; NULL when there is none or it is not one. */
json_t *hub_sidecar_load(const char *models_dir, const char *id)
{
    char name[HUBREF_TEXT_MAX + 16], path[4096];
    hubref_sidecar_name(id, name);
    if (!hub_in_dir(models_dir, name, path, sizeof path))
        return NULL;
    json_t *j = json_load_file(path, 0, NULL);
    const char *ref = json_string_value(json_object_get(j, "ref"));
    if (!ref || strcmp(ref, id) || !json_is_array(json_object_get(j, "files"))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* Whether every file a sidecar lists is in place with its size (and, with commit, the
 * sidecar is of that commit); fills out's paths and sizes. */
static bool sidecar_complete(const char *models_dir, json_t *side, const char *commit, struct hub_pulled *out)
{
    const char *c = json_string_value(json_object_get(side, "commit"));
    json_t *files = json_object_get(side, "files"), *e;
    size_t i, n = json_array_size(files);
    if (!c || (commit && strcmp(c, commit)) || !n || n > HUBREF_MAX_PARTS)
        return false;
    uint64_t bytes = 0;
    json_array_foreach(files, i, e) {
        char path[4096];
        const char *local = json_string_value(json_object_get(e, "local"));
        json_int_t size = json_integer_value(json_object_get(e, "size"));
        struct stat st;
        if (!local || strchr(local, '/') || !hub_in_dir(models_dir, local, path, sizeof path) || stat(path, &st) ||
            (json_int_t)st.st_size != size)
            return false;
        if (i == 0)
            snprintf(out->path, sizeof out->path, "%s", path);
        bytes += (uint64_t)size;
    }
    snprintf(out->commit, sizeof out->commit, "%s", c);
    out->bytes = bytes;
    out->parts = (int)n;
    return true;
}

/* Stores j (taken) as id's sidecar in models_dir, through a temporary file and a rename. */
int hub_sidecar_store(const char *models_dir, const char *id, json_t *j, char *err, size_t errlen)
{
    char name[HUBREF_TEXT_MAX + 16], path[4096], tmp[4200];
    hubref_sidecar_name(id, name);
    int rc = 0;
    if (!j || !hub_in_dir(models_dir, name, path, sizeof path))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "cannot write the sidecar of %s", id);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!rc && (json_dump_file(j, tmp, JSON_INDENT(1)) || files_sync(tmp, O_RDONLY) || rename(tmp, path)))
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot write %s: %s", path, strerror(errno));
    json_decref(j);
    return rc;
}

/* Writes the sidecar of a pull. */
int hub_sidecar_write(const struct hub *h, const char *dir, const char *id, const struct hub_ref *ref,
                      const struct listing *l, const size_t *pick, size_t n_pick, char *err, size_t errlen)
{
    json_t *files = json_array();
    for (size_t k = 0; k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        char local[HUBREF_TEXT_MAX];
        hubref_local_name(id, (int)k + 1, (int)n_pick, local);
        json_array_append_new(files, json_pack("{s:s, s:s, s:s, s:I}", "path", f->path, "local", local, "sha256",
                                               f->sha256, "size", (json_int_t)f->size));
    }
    char repo[2 * HUBREF_NAME_MAX + 2];
    snprintf(repo, sizeof repo, "%s/%s", ref->owner, ref->repo);
    return hub_sidecar_store(dir, id,
                         json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "ref", id, "repo", repo, "revision", h->revision,
                                   "commit", l->commit, "endpoint", h->endpoint, "files", files),
                         err, errlen);
}

int hub_sidecar_put(const char *models_dir, const char *id, const char *sha256, uint64_t size, char *err,
                    size_t errlen)
{
    char local[HUBREF_TEXT_MAX];
    hubref_local_name(id, 1, 1, local);
    return hub_sidecar_store(models_dir, id,
                         json_pack("{s:s, s:s, s:s, s:[{s:s, s:s, s:s, s:I}]}", "ref", id, "commit", "", "source",
                                   "peer", "files", "path", local, "local", local, "sha256", sha256, "size",
                                   (json_int_t)size),
                         err, errlen);
}

bool hub_sidecar_id(const char *gguf_path, char *id)
{
    const char *slash = strrchr(gguf_path, '/');
    const char *base = slash ? slash + 1 : gguf_path;
    char dir[4096], stem[HUBREF_TEXT_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - gguf_path) : 1, slash ? gguf_path : ".");
    snprintf(stem, sizeof stem, "%s", base);
    int part, count;
    size_t n = strlen(stem);
    if (hubref_split_part(stem, &part, &count))
        stem[n - 20] = 0;
    else if (n > 5 && !strcasecmp(stem + n - 5, ".gguf"))
        stem[n - 5] = 0;
    char path[sizeof dir + sizeof stem + sizeof HUB_SIDECAR];
    snprintf(path, sizeof path, "%s/%s" HUB_SIDECAR, dir, stem);
    json_t *j = json_load_file(path, 0, NULL);
    const char *ref = json_string_value(json_object_get(j, "ref"));
    const char *first = json_string_value(json_object_get(json_array_get(json_object_get(j, "files"), 0), "local"));
    bool ok = ref && ids_valid_model(ref) && first && !strcmp(first, base);
    if (ok)
        snprintf(id, HUBREF_TEXT_MAX, "%s", ref);
    json_decref(j);
    return ok;
}

/* ---- a pull ---- */

/* The pull when the hub is not to be asked: the model must be here already. */
static int pull_offline(const struct hub *h, const struct hub_ref *ref, struct hub_pulled *out, char *err,
                        size_t errlen)
{
    hubref_text(ref, ref->path[0] || ref->tag[0] ? NULL : HUBREF_DEFAULT_TAG, out->id);
    json_t *side = hub_sidecar_load(h->cfg->models_dir, out->id);
    bool here = side && sidecar_complete(h->cfg->models_dir, side, NULL, out);
    json_decref(side);
    if (!here)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "HF_HUB_OFFLINE is set and %s is not in %s", out->id,
                          h->cfg->models_dir);
    out->already = true;
    return 0;
}

/* Fetches the chosen files, then writes the sidecar and moves the files into place. */
static int fetch_all(const struct hub *h, const struct hub_ref *ref, const struct listing *l, const size_t *pick,
                     size_t n_pick, hub_progress_fn fn, void *ctx, struct hub_pulled *out, char *err, size_t errlen)
{
    uint64_t total = 0, need = 0;
    char partial[HUBREF_MAX_PARTS][4200], final[HUBREF_MAX_PARTS][4200];
    for (size_t k = 0; k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        if (!f->sha256)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub gives no SHA-256 of it (not an LFS file)",
                              f->path);
        char local[HUBREF_TEXT_MAX], dot[HUBREF_TEXT_MAX + 16];
        hubref_local_name(out->id, (int)k + 1, (int)n_pick, local);
        snprintf(dot, sizeof dot, ".%s.partial", local);
        if (!hub_in_dir(h->cfg->models_dir, local, final[k], sizeof final[k]) ||
            !hub_in_dir(h->cfg->models_dir, dot, partial[k], sizeof partial[k]))
            return cairn_fail(err, errlen, CAIRN_ERANGE, "the models folder's path is too long");
        struct stat st;
        uint64_t have = stat(partial[k], &st) ? 0 : (uint64_t)st.st_size;
        char have_path[4300];
        if (snprintf(have_path, sizeof have_path, "%s" RANGES_SUFFIX, partial[k]) >= (int)sizeof have_path)
            return cairn_fail(err, errlen, CAIRN_ERANGE, "the models folder's path is too long");
        if (have && !access(have_path, F_OK)) { /* a parallel fetch's file has holes: its record counts */
            struct ranges r;
            ranges_load(have_path, f->size, &r);
            have = f->size - ranges_missing(&r, 0, f->size);
            ranges_free(&r);
        }
        if (f->size > (uint64_t)IDS_BYTES_MAX - total) /* a hostile listing must not wrap the disk check */
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: the hub lists %" PRIu64 " bytes, more than a model may have",
                              f->path, f->size);
        total += f->size;
        need += f->size > have ? f->size - have : 0;
    }
    int rc = download_disk_check(h->cfg->models_dir, need, err, errlen);
    struct file_fetch ff = {.h = h, .fd = -1, .fn = fn, .ctx = ctx};
    ff.p = (struct hub_progress){.status = "downloading", .id = out->id, .parts = (int)n_pick, .total = total};
    for (size_t k = 0; !rc && k < n_pick; k++) {
        const struct hub_file *f = &l->f[pick[k]];
        char url[4096];
        snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", h->endpoint, ref->owner, ref->repo, l->commit, f->path);
        ff.src = f;
        ff.p.status = "downloading";
        ff.p.file = f->path;
        ff.p.sha256 = f->sha256;
        ff.p.part = (int)k + 1;
        ff.p.file_total = f->size;
        log_info("hub: %s: %s (%" PRIu64 " bytes), part %zu of %zu", out->id, f->path, f->size, k + 1, n_pick);
        rc = hub_fetch_file(&ff, url, partial[k], err, errlen);
        ff.done_before += f->size;
    }
    out->fetched = ff.fetched;
    if (!rc)
        rc = hub_sidecar_write(h, h->cfg->models_dir, out->id, ref, l, pick, n_pick, err, errlen);
    for (size_t k = n_pick; !rc && k-- > 0;) /* the first part last: the catalog lists a whole model */
        if (rename(partial[k], final[k]))
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot rename %s: %s", partial[k], strerror(errno));
    if (rc)
        return rc;
    files_sync(h->cfg->models_dir, O_RDONLY | O_DIRECTORY);
    snprintf(out->path, sizeof out->path, "%.4000s", final[0]);
    snprintf(out->commit, sizeof out->commit, "%s", l->commit);
    out->bytes = total;
    out->parts = (int)n_pick;
    ff.p.status = "success";
    ff.p.file_done = ff.src->size;
    ff.p.done = total;
    if (fn)
        fn(ctx, &ff.p);
    return 0;
}

int hub_begin(const struct hub_config *cfg, const char *text, struct hub *h, struct hub_ref *ref, char *err,
              size_t errlen)
{
    hub_settle(h, cfg);
    int rc = hubref_parse(text, ref, err, errlen);
    if (!rc && (!cfg->models_dir || !cfg->models_dir[0]))
        rc = cairn_fail(err, errlen, CAIRN_EINVAL, "no models folder");
    return rc;
}

int hub_resolve(const struct hub *h, const struct hub_ref *ref, struct listing *l, size_t pick[HUBREF_MAX_PARTS],
                size_t *n_pick, char *id, char *err, size_t errlen)
{
    char tag[HUBREF_TAG_MAX + 1];
    int rc = hub_list_repo(h, ref, l, err, errlen);
    if (!rc)
        rc = hubref_choose(ref, l->f, l->n, pick, n_pick, tag, err, errlen);
    if (!rc) {
        hubref_text(ref, tag[0] ? tag : NULL, id);
        if (!ids_valid_model(id))
            rc = cairn_fail(err, errlen, CAIRN_EINVAL, "%.300s: longer than a model id (%d bytes)", id, IDS_MODEL_MAX);
    }
    return rc;
}

int hub_pull(const struct hub_config *cfg, const char *text, hub_progress_fn fn, void *ctx, struct hub_pulled *out,
             char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    struct hub h;
    struct hub_ref ref;
    int rc = hub_begin(cfg, text, &h, &ref, err, errlen);
    if (rc)
        return rc;
    if ((rc = files_make_dirs(cfg->models_dir, 0755, err, errlen)))
        return rc;
    if (h.offline)
        return pull_offline(&h, &ref, out, err, errlen);
    hub_curl_init();
    if (fn)
        fn(ctx, &(struct hub_progress){.status = "listing", .id = "", .file = "", .sha256 = ""});
    struct listing l = {0};
    size_t pick[HUBREF_MAX_PARTS], n_pick = 0;
    rc = hub_resolve(&h, &ref, &l, pick, &n_pick, out->id, err, errlen);
    json_t *side = rc ? NULL : hub_sidecar_load(cfg->models_dir, out->id);
    if (side && sidecar_complete(cfg->models_dir, side, l.commit, out)) {
        out->already = true;
        if (fn)
            fn(ctx, &(struct hub_progress){.status = "success", .id = out->id, .file = "", .sha256 = "",
                                           .done = out->bytes, .total = out->bytes});
    } else if (!rc) {
        rc = fetch_all(&h, &ref, &l, pick, n_pick, fn, ctx, out, err, errlen);
    }
    json_decref(side);
    hub_listing_free(&l);
    if (!rc)
        log_info("hub: %s: %s (commit %.12s, %" PRIu64 " bytes in %d file%s)", out->id,
                 out->already ? "already here" : "pulled", out->commit, out->bytes, out->parts, out->parts > 1 ? "s" : "");
    return rc;
}

/* ---- removing ---- */

static int remove_whole(const char *models_dir, const char *id, char *err, size_t errlen);

/* Unlinks path unless it is already gone; false (err set) when it cannot. */
static bool unlink_file(const char *path, char *err, size_t errlen)
{
    if (!unlink(path) || errno == ENOENT)
        return true;
    cairn_fail(err, errlen, CAIRN_EIO, "cannot delete %s: %s", path, strerror(errno));
    return false;
}

int hub_remove(const char *models_dir, const char *id, char *err, size_t errlen)
{
    int sparse = hub_sparse_remove(models_dir, id, err, errlen); /* the layers a rank fetched */
    if (sparse && sparse != CAIRN_ENOTFOUND)
        return sparse;
    int rc = remove_whole(models_dir, id, err, errlen);
    return rc == CAIRN_ENOTFOUND && !sparse ? 0 : rc;
}

/* hub_remove of a model in the models folder itself. */
static int remove_whole(const char *models_dir, const char *id, char *err, size_t errlen)
{
    json_t *side = hub_sidecar_load(models_dir, id);
    char path[4200];
    if (side) {
        bool ok = true;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(side, "files"), i, e) { /* the first part first: out of the catalog at once */
            const char *local = json_string_value(json_object_get(e, "local"));
            char dot[HUBREF_TEXT_MAX + 16];
            if (!local || strchr(local, '/') || local[0] == '.')
                continue;
            snprintf(dot, sizeof dot, ".%s.partial", local);
            if (hub_in_dir(models_dir, local, path, sizeof path))
                ok = ok && unlink_file(path, err, errlen);
            if (hub_in_dir(models_dir, dot, path, sizeof path))
                ok = ok && unlink_file(path, err, errlen);
            snprintf(dot, sizeof dot, ".%s.partial" RANGES_SUFFIX, local);
            if (hub_in_dir(models_dir, dot, path, sizeof path))
                ok = ok && unlink_file(path, err, errlen);
        }
        json_decref(side);
        char name[HUBREF_TEXT_MAX + 16];
        hubref_sidecar_name(id, name);
        if (ok && hub_in_dir(models_dir, name, path, sizeof path))
            ok = unlink_file(path, err, errlen);
        return ok ? 0 : CAIRN_EIO;
    }
    struct catalog *c = NULL;
    int rc = catalog_create(&c, models_dir, err, errlen);
    if (!rc)
        rc = catalog_scan(c, err, errlen);
    const struct catalog_card *k = rc ? NULL : catalog_find(c, id);
    if (!rc && !k)
        rc = cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no model %s in %s", id, models_dir);
    if (!rc && !unlink_file(k->path, err, errlen))
        rc = CAIRN_EIO;
    catalog_release(c);
    return rc;
}
