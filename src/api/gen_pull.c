/* Pulling and deleting models on a node (gen_pull.h). */
#include "api/gen_pull.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/thread.h"
#include "base/log.h"
#include "node/download.h"
#include "node/hubref.h"

struct pull_job {
    char ref[HUBREF_TEXT_MAX];
    char models_dir[4096];
    struct node *node;
    const atomic_bool *cancel;
    hub_progress_fn fn;
    gen_pull_done_fn done;
    void *ctx;
    char id[IDS_MODEL_MAX + 1]; /* once the listing named it */
};

/* The pull as one of the node's downloads (in /state, /events and the reports). */
static void note(struct pull_job *j, enum cluster_download_status status, int64_t done, int64_t total,
                 const char *error)
{
    if (!j->id[0])
        return;
    struct cluster_download d = {.status = status, .bytes_done = done, .bytes_total = total, .error = (char *)error};
    snprintf(d.node_id, sizeof d.node_id, "%s", node_id(j->node));
    snprintf(d.model_id, sizeof d.model_id, "%s", j->id);
    download_mgr_note(node_downloads(j->node), &d);
}

static void on_progress(void *ctx, const struct hub_progress *p)
{
    struct pull_job *j = ctx;
    if (p->id[0] && !j->id[0] && strlen(p->id) <= IDS_MODEL_MAX)
        snprintf(j->id, sizeof j->id, "%s", p->id);
    note(j, !strcmp(p->status, "success") ? CLUSTER_DOWNLOAD_COMPLETED : CLUSTER_DOWNLOAD_ONGOING, (int64_t)p->done,
         (int64_t)p->total, NULL);
    j->fn(j->ctx, p);
}

/* The HTTP status of a failed pull: the hub's failures are a gateway's (502), a full
 * disk is 507, a gated repo 403. */
static int pull_status(int rc)
{
    switch (rc) {
    case CAIRN_EIO:
    case CAIRN_EFORMAT: return 502;
    case CAIRN_EFULL: return 507;
    case CAIRN_EPERM: return 403;
    case CAIRN_ESTATE: return 409;
    default: return cairn_http_status(rc);
    }
}

static void *pull_main(void *arg)
{
    struct pull_job *j = arg;
    struct hub_config cfg = {.models_dir = j->models_dir, .cancel = j->cancel};
    struct hub_pulled got;
    char err[1024];
    int rc = hub_pull(&cfg, j->ref, on_progress, j, &got, err, sizeof err);
    if (rc) {
        log_warn("pull %s: %s", j->ref, err);
        note(j, CLUSTER_DOWNLOAD_FAILED, 0, 0, err);
    }
    j->done(j->ctx, rc ? pull_status(rc) : 0, rc ? "" : got.id, rc ? err : "");
    free(j);
    return NULL;
}

int gen_pull_start(struct node *n, const char *ref, const atomic_bool *cancel, hub_progress_fn fn,
                   gen_pull_done_fn done, void *ctx, char *err, size_t errlen)
{
    const char *dir = node_models_dir(n);
    if (!dir) {
        snprintf(err, errlen, "this node has no models folder");
        return 409;
    }
    struct hub_ref r;
    if (hubref_parse(ref, &r, err, errlen))
        return 400;
    struct pull_job *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    *j = (struct pull_job){.node = n, .cancel = cancel, .fn = fn, .done = done, .ctx = ctx};
    snprintf(j->ref, sizeof j->ref, "%s", ref);
    snprintf(j->models_dir, sizeof j->models_dir, "%s", dir);
    int e = thread_start_detached(pull_main, j, 0);
    if (e) {
        free(j);
        snprintf(err, errlen, "cannot start a thread: %s", strerror(e));
        return 500;
    }
    return 0;
}

int gen_pull_remove(struct node *n, const char *model, char *err, size_t errlen)
{
    const char *dir = node_models_dir(n);
    char id[HUBREF_TEXT_MAX];
    if (!dir) {
        snprintf(err, errlen, "this node has no models folder");
        return 404;
    }
    if (!hubref_canonical(model, id))
        snprintf(id, sizeof id, "%s", model);
    int rc = hub_remove(dir, id, err, errlen);
    return rc ? cairn_http_status(rc) : 0;
}
