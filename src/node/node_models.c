/* The catalog as the node serves it (node.h): cards for the master, the models API's
 * list, drafts checked against their models. */
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "gguf/vocab.h"
#include "node/node_int.h"

#define CATALOG_RESCAN_MS 1000

/* ---- catalog ---- */

int node_card(void *ctx, const char *model_id, struct catalog_card *out, char *err,
              size_t errlen)
{
    struct node *n = ctx;
    memset(out, 0, sizeof *out);
    if (!n->catalog)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s not found (no models folder)",
                          model_id);
    pthread_mutex_lock(&n->cat_mu);
    int64_t now = mono_ms();
    const struct catalog_card *c = catalog_find(n->catalog, model_id);
    if (!c || now - n->cat_scanned_ms >= CATALOG_RESCAN_MS) {
        char why[256];
        if (catalog_scan(n->catalog, why, sizeof why))
            log_warn("node %s: models folder: %s", n->id, why);
        n->cat_scanned_ms = now;
        c = catalog_find(n->catalog, model_id);
    }
    int rc = 0;
    if (!c)
        rc = cairn_fail(err, errlen, CAIRN_ENOTFOUND, "model %s not found in %s", model_id,
                        catalog_dir(n->catalog));
    else if (c->error)
        rc = cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "model %s cannot be used: %s", model_id,
                        c->error);
    else if (catalog_card_copy(out, c))
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    pthread_mutex_unlock(&n->cat_mu);
    return rc;
}

const char *node_models_dir(struct node *n) { return n->catalog ? catalog_dir(n->catalog) : NULL; }

const struct master_env *node_master_env(const struct node *n) { return &n->env; }

struct download_mgr *node_downloads(struct node *n) { return n->downloads; }

struct models_ctx {
    json_t *arr;
    bool oom;
};

static void add_model_nodes(void *ctx, const struct cluster_state *s)
{
    struct models_ctx *m = ctx;
    for (size_t i = 0; i < json_array_size(m->arr); i++) {
        json_t *card = json_array_get(m->arr, i);
        json_t *nodes = json_object_get(card, "nodes");
        const char *id = json_string_value(json_object_get(card, "id"));
        for (size_t k = 0; id && k < s->n_downloads; k++) {
            const struct cluster_download *d = &s->downloads[k];
            if (d->status == CLUSTER_DOWNLOAD_COMPLETED && !strcmp(d->model_id, id) &&
                json_array_append_new(nodes, json_string(d->node_id)))
                m->oom = true;
        }
    }
}

json_t *node_models_json(struct node *n)
{
    json_t *arr = json_array();
    if (!arr || !n->catalog)
        return arr;
    pthread_mutex_lock(&n->cat_mu);
    char why[256];
    if (catalog_scan(n->catalog, why, sizeof why))
        log_warn("node %s: models folder: %s", n->id, why);
    n->cat_scanned_ms = mono_ms();
    bool oom = false;
    for (size_t i = 0; i < catalog_count(n->catalog) && !oom; i++) {
        const struct catalog_card *c = catalog_at(n->catalog, i);
        json_t *j = catalog_card_to_json(c);
        json_t *nodes = json_array();
        oom = !j || !nodes || json_array_append_new(nodes, json_string(n->id)) ||
              json_object_set_new(j, "nodes", nodes) || json_array_append_new(arr, j);
        if (oom && !j)
            json_decref(nodes);
    }
    pthread_mutex_unlock(&n->cat_mu);
    struct models_ctx m = {.arr = arr, .oom = oom};
    if (!oom)
        node_read_state(n, add_model_nodes, &m);
    if (m.oom) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

/* master_draft_fn over this node's catalog: both files are here. */
int node_draft_check(void *ctx, const char *model_id, const char *draft_id, char *err, size_t errlen)
{
    struct catalog_card a, b;
    int rc = node_card_placeable(ctx, model_id, &a, err, errlen);
    if (!rc)
        rc = node_card(ctx, draft_id, &b, err, errlen);
    else
        memset(&b, 0, sizeof b);
    if (!rc)
        rc = a.path && b.path ? vocab_compatible_files(a.path, b.path, err, errlen) : 0;
    catalog_card_clear(&a);
    catalog_card_clear(&b);
    return rc;
}
