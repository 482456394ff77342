/* Hub models the cluster places before any node has them (node.h, node_hub_*): the
 * header read from the hub gives the card that placement needs, and each rank then
 * fetches only the byte ranges of its layers (node/hub.h, hub_sparse_*).
 *
 * Work runs on threads of its own, one per job, so neither the node thread (the master's
 * card lookup) nor the worker waits on the network: a lookup that misses starts a
 * header read and answers "not yet"; the worker's fetch is a job whose progress is one
 * of the node's downloads (with the rank's "layers"), so /state shows it and its end
 * wakes the worker through the report. A failed job is tried again after
 * NODE_HUB_RETRY_MS; node_release cancels the jobs and waits for their threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/thread.h"
#include "base/log.h"
#include "node/catalog.h"
#include "node/download.h"
#include "node/hub.h"
#include "node/hubref.h"
#include "node/node_int.h"

#define NODE_HUB_RETRY_MS 30000
#define NODE_HUB_MAX_JOBS 64

enum job_kind { JOB_HEADER, JOB_FILL, JOB_PULL };
enum job_state { JOB_RUNNING, JOB_DONE, JOB_FAILED };

struct hub_job {
    enum job_kind kind;
    char id[IDS_MODEL_MAX + 1];  /* what the job is known by: a model id, or a reference's canonical text */
    char text[HUBREF_TEXT_MAX];  /* the reference as typed, which the hub resolves (no tag: the default, else
                                    the only model) */
    int layer_begin, layer_end;
    enum job_state state;
    char error[512];
    int rc;                      /* of an ended job */
    char got[IDS_MODEL_MAX + 1]; /* a header's model id, as the hub's listing resolved it */
    int64_t ended_ms;
    atomic_bool cancel;
    struct node *node;
};

struct node_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct hub_job *jobs[NODE_HUB_MAX_JOBS];
    size_t n;
    int threads; /* running */
    bool stopping;
    struct catalog *sparse; /* of models_dir/.sparse: cards read from headers */
};

/* The hub models already in the models folder, as whole downloads of this node, so the
 * cluster's state says which nodes hold them (peers then fetch from them, not the hub). */
static void note_pulled(struct node *n)
{
    char why[256], canon[HUBREF_TEXT_MAX];
    pthread_mutex_lock(&n->cat_mu);
    if (catalog_scan(n->catalog, why, sizeof why))
        log_warn("node %s: models folder: %s", n->id, why);
    n->cat_scanned_ms = mono_ms();
    for (size_t i = 0; i < catalog_count(n->catalog); i++) {
        const struct catalog_card *c = catalog_at(n->catalog, i);
        if (c->error || !hubref_canonical(c->id, canon) || strcmp(canon, c->id))
            continue;
        struct cluster_download d = {.status = CLUSTER_DOWNLOAD_COMPLETED, .bytes_done = (int64_t)c->model_bytes,
                                     .bytes_total = (int64_t)c->model_bytes};
        snprintf(d.node_id, sizeof d.node_id, "%s", n->id);
        snprintf(d.model_id, sizeof d.model_id, "%s", c->id);
        download_mgr_note(n->downloads, &d);
    }
    pthread_mutex_unlock(&n->cat_mu);
}

int node_hub_create(struct node *n, char *err, size_t errlen)
{
    struct node_hub *h = calloc(1, sizeof *h);
    if (!h)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    char dir[4096];
    int rc = 0;
    if (n->models_dir) {
        rc = hub_sparse_dir(n->models_dir, dir, sizeof dir) ? cairn_fail(err, errlen, CAIRN_ERANGE, "models folder path too long")
                                                             : catalog_create(&h->sparse, dir, err, errlen);
    }
    n->hub = h;
    if (!rc && n->catalog && n->downloads)
        note_pulled(n);
    return rc;
}

void node_hub_release(struct node *n)
{
    struct node_hub *h = n->hub;
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    for (size_t i = 0; i < h->n; i++)
        atomic_store(&h->jobs[i]->cancel, true);
    while (h->threads > 0)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (size_t i = 0; i < h->n; i++)
        free(h->jobs[i]);
    catalog_release(h->sparse);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    n->hub = NULL;
}

/* ---- jobs ---- */

static struct hub_job *job_find(struct node_hub *h, enum job_kind kind, const char *id, int a, int b)
{
    for (size_t i = 0; i < h->n; i++) {
        struct hub_job *j = h->jobs[i];
        if (j->kind == kind && !strcmp(j->id, id) && (kind == JOB_HEADER || (j->layer_begin == a && j->layer_end == b)))
            return j;
    }
    return NULL;
}

/* The job as one of the node's downloads; whole: the model is here whole now (no layers). */
static void note(struct hub_job *j, enum cluster_download_status st, uint64_t done, uint64_t total, const char *error,
                 bool whole)
{
    struct cluster_download d = {.status = st, .bytes_done = (int64_t)done, .bytes_total = (int64_t)total,
                                 .error = (char *)error, .layer_begin = whole ? 0 : j->layer_begin,
                                 .layer_end = whole ? 0 : j->layer_end};
    snprintf(d.node_id, sizeof d.node_id, "%s", j->node->id);
    snprintf(d.model_id, sizeof d.model_id, "%s", j->id);
    download_mgr_note(j->node->downloads, &d);
}

static void on_fill_progress(void *ctx, const struct hub_progress *p)
{
    struct hub_job *j = ctx;
    if (strcmp(p->status, "success") && p->total)
        note(j, CLUSTER_DOWNLOAD_ONGOING, p->done, p->total, NULL, false);
}

/* A whole pull (JOB_PULL): the job's id is the reference's canonical text; the download
 * is noted under the model id the listing resolves, once it does. */
static int run_pull(struct hub_job *j, const struct hub_config *cfg, char *err, size_t errlen)
{
    struct hub_pulled got;
    int rc = hub_pull(cfg, j->text, on_fill_progress, j, &got, err, errlen);
    if (rc)
        note(j, CLUSTER_DOWNLOAD_FAILED, 0, 0, err, true);
    else
        note(j, CLUSTER_DOWNLOAD_COMPLETED, got.bytes, got.bytes, NULL, true);
    return rc;
}

static void *job_main(void *arg)
{
    struct hub_job *j = arg;
    struct node *n = j->node;
    struct hub_config cfg = {.models_dir = n->models_dir, .cancel = &j->cancel};
    char err[512], id[HUBREF_TEXT_MAX];
    int rc;
    if (j->kind == JOB_HEADER) {
        rc = hub_sparse_header(&cfg, j->text, id, err, sizeof err);
        if (!rc && strlen(id) > IDS_MODEL_MAX)
            rc = cairn_fail(err, sizeof err, CAIRN_ERANGE, "%.300s: longer than a model id", id);
        if (!rc)
            snprintf(j->got, sizeof j->got, "%.*s", IDS_MODEL_MAX, id);
    } else if (j->kind == JOB_PULL) {
        rc = run_pull(j, &cfg, err, sizeof err);
    } else {
        struct hub_sparse_result res;
        rc = hub_sparse_fill(&cfg, j->id, j->layer_begin, j->layer_end, on_fill_progress, j, &res, err, sizeof err);
        if (rc == CAIRN_ENOTFOUND) { /* placed by a master that had the model's card: the header first */
            rc = hub_sparse_header(&cfg, j->id, id, err, sizeof err);
            if (!rc)
                rc = hub_sparse_fill(&cfg, j->id, j->layer_begin, j->layer_end, on_fill_progress, j, &res, err,
                                     sizeof err);
        }
        if (rc)
            note(j, CLUSTER_DOWNLOAD_FAILED, 0, 0, err, false);
        else
            note(j, CLUSTER_DOWNLOAD_COMPLETED, res.needed, res.needed, NULL, res.promoted);
    }
    if (rc)
        log_warn("node %s: %s of %s: %s", n->id,
                 j->kind == JOB_HEADER ? "reading the header" : j->kind == JOB_PULL ? "pulling" : "fetching layers",
                 j->id, err);
    struct node_hub *h = n->hub;
    pthread_mutex_lock(&h->mu);
    j->state = rc ? JOB_FAILED : JOB_DONE;
    j->rc = rc;
    snprintf(j->error, sizeof j->error, "%s", rc ? err : "");
    j->ended_ms = mono_ms();
    h->threads--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* A slot for a new job: a free one, else the oldest ended one's; NULL when every slot
 * runs (or out of memory). */
static struct hub_job *job_slot(struct node_hub *h)
{
    if (h->n < NODE_HUB_MAX_JOBS) {
        struct hub_job *j = calloc(1, sizeof *j);
        if (j)
            h->jobs[h->n++] = j;
        return j;
    }
    struct hub_job *old = NULL;
    for (size_t i = 0; i < h->n; i++)
        if (h->jobs[i]->state != JOB_RUNNING && (!old || h->jobs[i]->ended_ms < old->ended_ms))
            old = h->jobs[i];
    return old;
}

/* Starts a job unless the same one runs: 0 while it runs, else the error of one that
 * failed less than NODE_HUB_RETRY_MS ago (unless a person asked for it now), with the
 * reason in why. Callers ask only while what the job makes is missing, so an ended job
 * is started again. */
static int job_ensure(struct node *n, enum job_kind kind, const char *id, const char *text, int a, int b, bool asked,
                      char *why, size_t whylen)
{
    struct node_hub *h = n->hub;
    if (!h || !n->models_dir)
        return cairn_fail(why, whylen, CAIRN_ENOTFOUND, "this node has no models folder");
    pthread_mutex_lock(&h->mu);
    struct hub_job *j = job_find(h, kind, id, a, b);
    int rc = 0;
    if (j && j->state == JOB_RUNNING)
        rc = 0;
    else if (j && j->state == JOB_FAILED && !asked && mono_ms() - j->ended_ms < NODE_HUB_RETRY_MS)
        rc = cairn_fail(why, whylen, j->rc ? j->rc : CAIRN_EIO, "%s", j->error);
    else if (h->stopping)
        rc = cairn_fail(why, whylen, CAIRN_ESTATE, "the node is stopping");
    else if (!j && !(j = job_slot(h)))
        rc = cairn_fail(why, whylen, CAIRN_EFULL, "%d hub jobs run already", NODE_HUB_MAX_JOBS);
    else {
        *j = (struct hub_job){.kind = kind, .layer_begin = a, .layer_end = b, .state = JOB_RUNNING, .node = n};
        snprintf(j->id, sizeof j->id, "%s", id);
        snprintf(j->text, sizeof j->text, "%s", text);
        if (thread_start_detached(job_main, j, 0)) {
            j->state = JOB_FAILED;
            j->rc = CAIRN_EIO;
            j->ended_ms = mono_ms();
            snprintf(j->error, sizeof j->error, "cannot start a thread");
            rc = cairn_fail(why, whylen, CAIRN_EIO, "cannot start a thread");
        } else {
            h->threads++;
            if (kind == JOB_FILL)
                note(j, CLUSTER_DOWNLOAD_ONGOING, 0, 0, NULL, false);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* ---- what the rest of the node calls ---- */

/* The card of id read from its header in .sparse; CAIRN_ENOTFOUND when none is there. */
static int sparse_card(struct node *n, const char *id, struct catalog_card *out, char *err, size_t errlen)
{
    struct node_hub *h = n->hub;
    memset(out, 0, sizeof *out);
    if (!h || !h->sparse)
        return CAIRN_ENOTFOUND;
    pthread_mutex_lock(&n->cat_mu);
    const struct catalog_card *c = catalog_find(h->sparse, id);
    if (!c) {
        char why[256];
        if (catalog_scan(h->sparse, why, sizeof why))
            log_warn("node %s: %s", n->id, why);
        c = catalog_find(h->sparse, id);
    }
    int rc = 0;
    if (!c)
        rc = CAIRN_ENOTFOUND;
    else if (c->error)
        rc = cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "model %s cannot be used: %s", id, c->error);
    else if (catalog_card_copy(out, c))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_unlock(&n->cat_mu);
    return rc;
}

int node_card_placeable(void *ctx, const char *model_id, struct catalog_card *out, char *err, size_t errlen)
{
    struct node *n = ctx;
    int rc = node_card(n, model_id, out, err, errlen);
    char canon[HUBREF_TEXT_MAX];
    if (rc != CAIRN_ENOTFOUND || !hubref_canonical(model_id, canon) || strcmp(canon, model_id))
        return rc;
    catalog_card_clear(out);
    char why[512];
    rc = sparse_card(n, model_id, out, why, sizeof why);
    if (rc != CAIRN_ENOTFOUND)
        return rc ? cairn_fail(err, errlen, rc, "%s", why) : 0;
    rc = job_ensure(n, JOB_HEADER, model_id, model_id, 0, 0, false, why, sizeof why);
    if (rc)
        return cairn_fail(err, errlen, rc == CAIRN_ENOMEM ? rc : CAIRN_ENOTFOUND, "model %s: from the hub: %s", model_id,
                          why);
    return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s: its header is being read from the hub; ask again",
                      model_id);
}

int node_hub_header(struct node *n, const char *ref, int timeout_ms, char *id, char *err, size_t errlen)
{
    char canon[HUBREF_TEXT_MAX];
    id[0] = 0;
    if (!hubref_canonical(ref, canon) || strlen(canon) > IDS_MODEL_MAX)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%.300s: not a hub model reference", ref);
    int rc = job_ensure(n, JOB_HEADER, canon, ref, 0, 0, true, err, errlen);
    if (rc)
        return rc;
    struct node_hub *h = n->hub;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    pthread_mutex_lock(&h->mu);
    struct hub_job *j = job_find(h, JOB_HEADER, canon, 0, 0);
    while (j && j->state == JOB_RUNNING && pthread_cond_timedwait(&h->cv, &h->mu, &until) == 0)
        j = job_find(h, JOB_HEADER, canon, 0, 0);
    if (!j)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "the header read of %s was dropped", canon);
    else if (j->state == JOB_RUNNING)
        rc = cairn_fail(err, errlen, CAIRN_EIO, "the header of %s is still being read from the hub; ask again", canon);
    else if (j->state == JOB_FAILED)
        rc = cairn_fail(err, errlen, j->rc, "%s", j->error);
    else
        snprintf(id, HUBREF_TEXT_MAX, "%s", j->got);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int node_hub_fill(struct node *n, const char *id, int layer_begin, int layer_end, char *why, size_t whylen)
{
    return job_ensure(n, JOB_FILL, id, id, layer_begin, layer_end, false, why, whylen);
}

bool node_hub_covers(struct node *n, const char *id, int layer_begin, int layer_end, char *path, size_t pathlen)
{
    return n->models_dir && hub_sparse_covers(n->models_dir, id, layer_begin, layer_end, path, pathlen);
}

int node_hub_pull(struct node *n, const char *ref, char *why, size_t whylen)
{
    char canon[HUBREF_TEXT_MAX];
    if (!hubref_canonical(ref, canon) || strlen(canon) > IDS_MODEL_MAX)
        return cairn_fail(why, whylen, CAIRN_EINVAL, "%.300s: not a hub model reference", ref);
    return job_ensure(n, JOB_PULL, canon, ref, 0, 0, true, why, whylen);
}

int node_hub_cancel(struct node *n, const char *id)
{
    struct node_hub *h = n->hub;
    int found = 0;
    if (!h)
        return CAIRN_ENOTFOUND;
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->jobs[i]->id, id) && h->jobs[i]->state == JOB_RUNNING) {
            atomic_store(&h->jobs[i]->cancel, true);
            found++;
        }
    pthread_mutex_unlock(&h->mu);
    return found ? 0 : CAIRN_ENOTFOUND;
}
