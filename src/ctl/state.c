#include "ctl/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/json.h"

/* ---- enum names ---- */

static const char *name_at(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : NULL;
}

const char *cluster_sharding_name(int v)
{
    static const char *const names[] = {"pipeline", "tensor"};
    return name_at(names, CLUSTER_SHARDING_COUNT, v);
}

const char *cluster_task_kind_name(int v)
{
    static const char *const names[] = {"TextGeneration"};
    return name_at(names, CLUSTER_TASK_KIND_COUNT, v);
}

const char *cluster_task_status_name(int v)
{
    static const char *const names[] = {"Pending", "Running", "Complete", "Failed", "Cancelled"};
    return name_at(names, CLUSTER_TASK_STATUS_COUNT, v);
}

const char *cluster_download_status_name(int v)
{
    static const char *const names[] = {"Pending", "Ongoing", "Completed", "Failed"};
    return name_at(names, CLUSTER_DOWNLOAD_STATUS_COUNT, v);
}

/* ---- sorted tables ----
 * Every table is an array kept sorted by a key of one or two strings, so lookups are
 * binary searches and iteration order does not depend on the order of events. */

struct key {
    const char *a, *b; /* b is NULL for tables keyed by one id */
};

struct table_ops {
    size_t elem;
    struct key (*key)(const void *elem);
    void (*clear)(void *elem);
};

static int key_cmp(struct key x, struct key y)
{
    int c = strcmp(x.a, y.a);
    if (c || !x.b)
        return c;
    return strcmp(x.b, y.b);
}

/* Index of the first element whose key is >= k; *found says whether it equals k. */
static size_t lower_bound(const void *items, size_t n, const struct table_ops *ops,
                          struct key k, bool *found)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key_cmp(ops->key((const char *)items + mid * ops->elem), k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < n && key_cmp(ops->key((const char *)items + lo * ops->elem), k) == 0;
    return lo;
}

static void *table_find(const void *items, size_t n, const struct table_ops *ops, struct key k)
{
    bool found;
    size_t i = lower_bound(items, n, ops, k, &found);
    return found ? (char *)items + i * ops->elem : NULL;
}

static int table_put(void **items, size_t *n, size_t *cap, const struct table_ops *ops,
                     void *elem)
{
    bool found;
    size_t i = lower_bound(*items, *n, ops, ops->key(elem), &found);
    if (!found && array_reserve(items, cap, *n + 1, ops->elem, 8))
        return CAIRN_ENOMEM;
    char *at = (char *)*items + i * ops->elem;
    if (found) {
        ops->clear(at);
    } else {
        memmove(at + ops->elem, at, (*n - i) * ops->elem);
        (*n)++;
    }
    memcpy(at, elem, ops->elem);
    memset(elem, 0, ops->elem);
    return 0;
}

static void table_del(void *items, size_t *n, const struct table_ops *ops, struct key k)
{
    bool found;
    size_t i = lower_bound(items, *n, ops, k, &found);
    if (!found)
        return;
    char *at = (char *)items + i * ops->elem;
    ops->clear(at);
    memmove(at, at + ops->elem, (*n - i - 1) * ops->elem);
    (*n)--;
}

static void table_free(void *items, size_t n, const struct table_ops *ops)
{
    for (size_t i = 0; i < n; i++)
        ops->clear((char *)items + i * ops->elem);
    free(items);
}

static struct key node_key(const void *e)
{
    return (struct key){((const struct cluster_node *)e)->id, NULL};
}
static struct key edge_key(const void *e)
{
    const struct cluster_edge *x = e;
    return (struct key){x->from, x->to};
}
static struct key instance_key(const void *e)
{
    return (struct key){((const struct cluster_instance *)e)->id, NULL};
}
static struct key runner_key(const void *e)
{
    return (struct key){((const struct cluster_runner *)e)->id, NULL};
}
static struct key task_key(const void *e)
{
    return (struct key){((const struct cluster_task *)e)->id, NULL};
}
static struct key download_key(const void *e)
{
    const struct cluster_download *x = e;
    return (struct key){x->node_id, x->model_id};
}

static void node_clear(void *e)
{
    cluster_node_info_clear(&((struct cluster_node *)e)->info);
    memset(e, 0, sizeof(struct cluster_node));
}
static void edge_clear(void *e) { memset(e, 0, sizeof(struct cluster_edge)); }
static void instance_clear(void *e) { cluster_instance_clear(e); }
static void runner_clear(void *e) { cluster_runner_clear(e); }
static void task_clear(void *e) { cluster_task_clear(e); }
static void download_clear(void *e) { cluster_download_clear(e); }

static const struct table_ops node_ops = {sizeof(struct cluster_node), node_key, node_clear};
static const struct table_ops edge_ops = {sizeof(struct cluster_edge), edge_key, edge_clear};
static const struct table_ops instance_ops = {sizeof(struct cluster_instance), instance_key,
                                              instance_clear};
static const struct table_ops runner_ops = {sizeof(struct cluster_runner), runner_key,
                                            runner_clear};
static const struct table_ops task_ops = {sizeof(struct cluster_task), task_key, task_clear};
static const struct table_ops download_ops = {sizeof(struct cluster_download), download_key,
                                              download_clear};

/* put for one table; going through a void * local keeps each array's own type. */
#define TABLE_PUT(T, name, ops)                                                       \
    int cluster_state_put_##T(struct cluster_state *s, struct cluster_##T *elem)        \
    {                                                                                   \
        void *items = s->name;                                                          \
        int rc = table_put(&items, &s->n_##name, &s->cap_##name, &ops, elem);           \
        s->name = items;                                                                \
        return rc;                                                                      \
    }

TABLE_PUT(node, nodes, node_ops)
TABLE_PUT(edge, edges, edge_ops)
TABLE_PUT(instance, instances, instance_ops)
TABLE_PUT(runner, runners, runner_ops)
TABLE_PUT(task, tasks, task_ops)
TABLE_PUT(download, downloads, download_ops)

void cluster_state_del_node(struct cluster_state *s, const char *id)
{
    table_del(s->nodes, &s->n_nodes, &node_ops, (struct key){id, NULL});
}

void cluster_state_del_edge(struct cluster_state *s, const char *from, const char *to)
{
    table_del(s->edges, &s->n_edges, &edge_ops, (struct key){from, to});
}

void cluster_state_del_instance(struct cluster_state *s, const char *id)
{
    table_del(s->instances, &s->n_instances, &instance_ops, (struct key){id, NULL});
}

void cluster_state_del_runner(struct cluster_state *s, const char *id)
{
    table_del(s->runners, &s->n_runners, &runner_ops, (struct key){id, NULL});
}

void cluster_state_del_task(struct cluster_state *s, const char *id)
{
    table_del(s->tasks, &s->n_tasks, &task_ops, (struct key){id, NULL});
}

void cluster_state_del_download(struct cluster_state *s, const char *node_id, const char *model_id)
{
    table_del(s->downloads, &s->n_downloads, &download_ops, (struct key){node_id, model_id});
}

const struct cluster_node *cluster_state_find_node(const struct cluster_state *s, const char *id)
{
    return table_find(s->nodes, s->n_nodes, &node_ops, (struct key){id, NULL});
}

const struct cluster_edge *cluster_state_find_edge(const struct cluster_state *s,
                                                   const char *from, const char *to)
{
    return table_find(s->edges, s->n_edges, &edge_ops, (struct key){from, to});
}

const struct cluster_instance *cluster_state_find_instance(const struct cluster_state *s,
                                                           const char *id)
{
    return table_find(s->instances, s->n_instances, &instance_ops, (struct key){id, NULL});
}

const struct cluster_runner *cluster_state_find_runner(const struct cluster_state *s,
                                                       const char *id)
{
    return table_find(s->runners, s->n_runners, &runner_ops, (struct key){id, NULL});
}

const struct cluster_task *cluster_state_find_task(const struct cluster_state *s, const char *id)
{
    return table_find(s->tasks, s->n_tasks, &task_ops, (struct key){id, NULL});
}

const struct cluster_download *cluster_state_find_download(const struct cluster_state *s,
                                                           const char *node_id,
                                                           const char *model_id)
{
    return table_find(s->downloads, s->n_downloads, &download_ops,
                      (struct key){node_id, model_id});
}

/* ---- element lifecycle ---- */

void cluster_node_info_clear(struct cluster_node_info *info)
{
    for (size_t i = 0; i < info->n_ifaces; i++)
        free(info->ifaces[i].addrs);
    free(info->ifaces);
    memset(info, 0, sizeof *info);
}

int cluster_node_info_copy(struct cluster_node_info *dst, const struct cluster_node_info *src)
{
    *dst = *src;
    dst->ifaces = NULL;
    dst->n_ifaces = 0;
    if (src->n_ifaces) {
        dst->ifaces = calloc(src->n_ifaces, sizeof *dst->ifaces);
        if (!dst->ifaces)
            goto err;
    }
    for (size_t i = 0; i < src->n_ifaces; i++) {
        const struct cluster_iface *f = &src->ifaces[i];
        struct cluster_iface *g = &dst->ifaces[dst->n_ifaces];
        memcpy(g->name, f->name, sizeof g->name);
        g->loopback = f->loopback;
        if (f->n_addrs) {
            g->addrs = malloc(f->n_addrs * sizeof *g->addrs);
            if (!g->addrs)
                goto err;
            memcpy(g->addrs, f->addrs, f->n_addrs * sizeof *g->addrs);
        }
        g->n_addrs = f->n_addrs;
        dst->n_ifaces++;
    }
    return 0;
err:
    cluster_node_info_clear(dst);
    return CAIRN_ENOMEM;
}

void cluster_instance_clear(struct cluster_instance *in)
{
    free(in->shards);
    memset(in, 0, sizeof *in);
}

int cluster_instance_copy(struct cluster_instance *dst, const struct cluster_instance *src)
{
    *dst = *src;
    dst->shards = NULL;
    if (src->n_shards) {
        dst->shards = malloc(src->n_shards * sizeof *dst->shards);
        if (!dst->shards) {
            memset(dst, 0, sizeof *dst);
            return CAIRN_ENOMEM;
        }
        memcpy(dst->shards, src->shards, src->n_shards * sizeof *dst->shards);
    }
    return 0;
}

/* strdup that maps NULL to NULL; *ok becomes false when out of memory. */
static char *dup_opt(const char *s, bool *ok)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *ok = false;
    return d;
}

void cluster_runner_clear(struct cluster_runner *r)
{
    free(r->error);
    memset(r, 0, sizeof *r);
}

int cluster_runner_copy(struct cluster_runner *dst, const struct cluster_runner *src)
{
    bool ok = true;
    *dst = *src;
    dst->error = dup_opt(src->error, &ok);
    if (!ok)
        memset(dst, 0, sizeof *dst);
    return ok ? 0 : CAIRN_ENOMEM;
}

void cluster_task_clear(struct cluster_task *t)
{
    free(t->error);
    memset(t, 0, sizeof *t);
}

int cluster_task_copy(struct cluster_task *dst, const struct cluster_task *src)
{
    bool ok = true;
    *dst = *src;
    dst->error = dup_opt(src->error, &ok);
    if (!ok) {
        cluster_task_clear(dst);
        return CAIRN_ENOMEM;
    }
    return 0;
}

void cluster_download_clear(struct cluster_download *d)
{
    free(d->error);
    memset(d, 0, sizeof *d);
}

int cluster_download_copy(struct cluster_download *dst, const struct cluster_download *src)
{
    bool ok = true;
    *dst = *src;
    dst->error = dup_opt(src->error, &ok);
    if (!ok)
        memset(dst, 0, sizeof *dst);
    return ok ? 0 : CAIRN_ENOMEM;
}

/* ---- state lifecycle ---- */

struct cluster_state *cluster_state_create(void)
{
    return calloc(1, sizeof(struct cluster_state));
}

static void state_free_tables(struct cluster_state *s)
{
    table_free(s->nodes, s->n_nodes, &node_ops);
    table_free(s->edges, s->n_edges, &edge_ops);
    table_free(s->instances, s->n_instances, &instance_ops);
    table_free(s->runners, s->n_runners, &runner_ops);
    table_free(s->tasks, s->n_tasks, &task_ops);
    table_free(s->downloads, s->n_downloads, &download_ops);
}

void cluster_state_release(struct cluster_state *s)
{
    if (!s)
        return;
    state_free_tables(s);
    free(s);
}

void cluster_state_move(struct cluster_state *dst, struct cluster_state *src)
{
    state_free_tables(dst);
    *dst = *src;
    free(src);
}

/* Copies n elements with copy() into a new array of exactly n; NULL when out of memory
 * (elements copied so far are cleared). An empty table copies to NULL with *ok kept. */
static void *copy_table(const void *items, size_t n, const struct table_ops *ops,
                        int (*copy)(void *dst, const void *src), bool *ok)
{
    if (!n || !*ok)
        return NULL;
    char *out = malloc(n * ops->elem);
    if (!out) {
        *ok = false;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (copy(out + i * ops->elem, (const char *)items + i * ops->elem)) {
            table_free(out, i, ops);
            *ok = false;
            return NULL;
        }
    }
    return out;
}

static int node_copy(void *d, const void *s)
{
    const struct cluster_node *src = s;
    struct cluster_node *dst = d;
    memcpy(dst->id, src->id, sizeof dst->id);
    dst->last_seen_ms = src->last_seen_ms;
    return cluster_node_info_copy(&dst->info, &src->info);
}
static int edge_copy(void *d, const void *s)
{
    memcpy(d, s, sizeof(struct cluster_edge));
    return 0;
}
static int instance_copy(void *d, const void *s) { return cluster_instance_copy(d, s); }
static int runner_copy(void *d, const void *s) { return cluster_runner_copy(d, s); }
static int task_copy(void *d, const void *s) { return cluster_task_copy(d, s); }
static int download_copy(void *d, const void *s) { return cluster_download_copy(d, s); }

struct cluster_state *cluster_state_copy(const struct cluster_state *s)
{
    struct cluster_state *c = cluster_state_create();
    if (!c)
        return NULL;
    bool ok = true;
    c->last_term = s->last_term;
    c->last_index = s->last_index;
    memcpy(c->master_node_id, s->master_node_id, sizeof c->master_node_id);
    c->master_term = s->master_term;
    c->nodes = copy_table(s->nodes, s->n_nodes, &node_ops, node_copy, &ok);
    c->n_nodes = c->cap_nodes = ok ? s->n_nodes : 0;
    c->edges = copy_table(s->edges, s->n_edges, &edge_ops, edge_copy, &ok);
    c->n_edges = c->cap_edges = ok ? s->n_edges : 0;
    c->instances = copy_table(s->instances, s->n_instances, &instance_ops, instance_copy, &ok);
    c->n_instances = c->cap_instances = ok ? s->n_instances : 0;
    c->runners = copy_table(s->runners, s->n_runners, &runner_ops, runner_copy, &ok);
    c->n_runners = c->cap_runners = ok ? s->n_runners : 0;
    c->tasks = copy_table(s->tasks, s->n_tasks, &task_ops, task_copy, &ok);
    c->n_tasks = c->cap_tasks = ok ? s->n_tasks : 0;
    c->downloads = copy_table(s->downloads, s->n_downloads, &download_ops, download_copy, &ok);
    c->n_downloads = c->cap_downloads = ok ? s->n_downloads : 0;
    if (!ok) {
        cluster_state_release(c);
        return NULL;
    }
    return c;
}

/* ---- JSON out ---- */

/* Sets o[key] = v (stealing v); false when v is NULL or the set fails. */
static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

static json_t *text_or_null(const char *s) { return ids_json_string_or_null(s, false); }

json_t *cluster_node_info_to_json(const struct cluster_node_info *info)
{
    json_t *o = json_object(), *ifaces = json_array();
    bool ok = o && ifaces;
    for (size_t i = 0; ok && i < info->n_ifaces; i++) {
        const struct cluster_iface *f = &info->ifaces[i];
        json_t *fo = json_object(); /* appended first so that ifaces owns it */
        ok = json_array_append_new(ifaces, fo) == 0;
        json_t *addrs = ok ? json_array() : NULL;
        ok = ok && put(fo, "addresses", addrs) && put(fo, "name", json_string(f->name)) &&
             put(fo, "loopback", json_boolean(f->loopback));
        for (size_t k = 0; ok && k < f->n_addrs; k++)
            ok = json_array_append_new(addrs, json_string(f->addrs[k])) == 0;
    }
    ok = ok && put(o, "memory_total_bytes", json_integer(info->memory_total)) &&
         put(o, "memory_available_bytes", json_integer(info->memory_available)) &&
         put(o, "disk_free_bytes", json_integer(info->disk_free)) &&
         put(o, "disk_total_bytes", json_integer(info->disk_total)) &&
         put(o, "hostname", json_string(info->hostname)) &&
         put(o, "cpu_model", json_string(info->cpu_model)) &&
         put(o, "cpu_cores", json_integer(info->cpu_cores)) &&
         (!info->memory_bandwidth || put(o, "memory_bandwidth_bytes_per_s", json_integer(info->memory_bandwidth))) &&
         put(o, "isa", json_string(info->isa)) && put(o, "os", json_string(info->os)) &&
         put(o, "api_port", json_integer(info->api_port)) &&
         put(o, "cluster_port", json_integer(info->cluster_port));
    if (ok) {
        ok = put(o, "interfaces", ifaces);
        ifaces = NULL;
    }
    json_decref(ifaces);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *node_to_json(const struct cluster_node *n)
{
    json_t *o = json_object();
    bool ok = o && put(o, "node_id", json_string(n->id)) &&
              put(o, "last_seen_ms", json_integer(n->last_seen_ms)) &&
              put(o, "info", cluster_node_info_to_json(&n->info));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cluster_edge_to_json(const struct cluster_edge *e)
{
    json_t *o = json_object();
    bool ok = o && put(o, "from", json_string(e->from)) && put(o, "to", json_string(e->to)) &&
              put(o, "rtt_us", json_integer(e->rtt_us)) &&
              put(o, "throughput_bytes_per_s", json_integer(e->throughput));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cluster_instance_to_json(const struct cluster_instance *in)
{
    json_t *o = json_object(), *shards = json_array();
    bool ok = o && shards;
    for (size_t i = 0; ok && i < in->n_shards; i++) {
        const struct cluster_shard *sh = &in->shards[i];
        json_t *so = json_object();
        ok = so && json_array_append_new(shards, so) == 0 &&
             put(so, "node_id", json_string(sh->node_id)) &&
             put(so, "runner_id", json_string(sh->runner_id)) &&
             put(so, "rank", json_integer(sh->rank)) &&
             put(so, "world_size", json_integer(sh->world_size)) &&
             put(so, "layer_begin", json_integer(sh->layer_begin)) &&
             put(so, "layer_end", json_integer(sh->layer_end));
    }
    ok = ok && put(o, "instance_id", json_string(in->id)) &&
         put(o, "model_id", json_string(in->model_id)) &&
         put(o, "sharding", json_string(cluster_sharding_name(in->sharding))) &&
         put(o, "draft_model", ids_json_string_or_null(in->draft_model, true)) &&
         put(o, "num_draft_tokens", json_integer(in->num_draft_tokens)) &&
         put(o, "epoch", json_integer(in->epoch)) && cluster_kv_put(o, &in->kv);
    if (ok) {
        ok = put(o, "shards", shards);
        shards = NULL;
    }
    json_decref(shards);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cluster_runner_to_json(const struct cluster_runner *r)
{
    json_t *o = json_object();
    bool ok = o && put(o, "runner_id", json_string(r->id)) &&
              put(o, "instance_id", json_string(r->instance_id)) &&
              put(o, "node_id", json_string(r->node_id)) &&
              put(o, "status", json_string(cluster_runner_status_name(r->status))) &&
              put(o, "error", text_or_null(r->error)) &&
              put(o, "restart_count", json_integer(r->restart_count)) &&
              (r->data_port <= 0 || put(o, "data_port", json_integer(r->data_port))) &&
              (r->epoch <= 0 || put(o, "epoch", json_integer(r->epoch)));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *task_to_json(const struct cluster_task *t)
{
    json_t *o = json_object();
    bool ok = o && put(o, "task_id", json_string(t->id)) &&
              put(o, "kind", json_string(cluster_task_kind_name(t->kind))) &&
              put(o, "instance_id", json_string(t->instance_id)) &&
              put(o, "node_id", json_string(t->node_id)) &&
              put(o, "status", json_string(cluster_task_status_name(t->status))) &&
              put(o, "acknowledged", json_boolean(t->acknowledged)) &&
              put(o, "error", text_or_null(t->error)) &&
              put(o, "bytes", json_integer(t->bytes));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Seconds left at the download's rate; -1 when not Ongoing or no rate is known. */
static int64_t download_eta(const struct cluster_download *d)
{
    if (d->status != CLUSTER_DOWNLOAD_ONGOING || d->bytes_per_s <= 0)
        return -1;
    return (d->bytes_total - d->bytes_done + d->bytes_per_s - 1) / d->bytes_per_s;
}

json_t *cluster_download_to_json(const struct cluster_download *d)
{
    json_t *o = json_object();
    bool ok = o && put(o, "node_id", json_string(d->node_id)) &&
              put(o, "model_id", json_string(d->model_id)) &&
              put(o, "bytes_done", json_integer(d->bytes_done)) &&
              put(o, "bytes_total", json_integer(d->bytes_total)) &&
              put(o, "bytes_per_s", json_integer(d->bytes_per_s)) &&
              put(o, "eta_s", download_eta(d) < 0 ? json_null() : json_integer(download_eta(d))) &&
              put(o, "status", json_string(cluster_download_status_name(d->status))) &&
              put(o, "error", text_or_null(d->error));
    if (ok && d->layer_end > 0)
        ok = put(o, "layers", json_pack("[i, i]", d->layer_begin, d->layer_end));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cluster_state_to_jsonv(const struct cluster_state *s)
{
    json_t *o = json_object(), *last = json_object(), *master = json_object();
    json_t *nodes = json_object(), *edges = json_array(), *instances = json_object();
    json_t *runners = json_object(), *tasks = json_object(), *downloads = json_array();
    bool ok = o && last && master && nodes && edges && instances && runners && tasks &&
              downloads;
    ok = ok && put(last, "term", json_integer(s->last_term)) &&
         put(last, "index", json_integer(s->last_index)) &&
         put(master, "node_id", ids_json_string_or_null(s->master_node_id, true)) &&
         put(master, "term", json_integer(s->master_term));
    for (size_t i = 0; ok && i < s->n_nodes; i++)
        ok = put(nodes, s->nodes[i].id, node_to_json(&s->nodes[i]));
    for (size_t i = 0; ok && i < s->n_edges; i++)
        ok = json_array_append_new(edges, cluster_edge_to_json(&s->edges[i])) == 0;
    for (size_t i = 0; ok && i < s->n_instances; i++)
        ok = put(instances, s->instances[i].id, cluster_instance_to_json(&s->instances[i]));
    for (size_t i = 0; ok && i < s->n_runners; i++)
        ok = put(runners, s->runners[i].id, cluster_runner_to_json(&s->runners[i]));
    for (size_t i = 0; ok && i < s->n_tasks; i++)
        ok = put(tasks, s->tasks[i].id, task_to_json(&s->tasks[i]));
    for (size_t i = 0; ok && i < s->n_downloads; i++)
        ok = json_array_append_new(downloads, cluster_download_to_json(&s->downloads[i])) == 0;
    /* json_object_set_new steals even on failure, so after the first attempt each
     * member belongs to o. */
    if (ok)
        ok = put(o, "last_applied", last) & put(o, "master", master) & put(o, "nodes", nodes) &
             put(o, "edges", edges) & put(o, "instances", instances) &
             put(o, "runners", runners) & put(o, "tasks", tasks) &
             put(o, "downloads", downloads);
    else {
        json_decref(last);
        json_decref(master);
        json_decref(nodes);
        json_decref(edges);
        json_decref(instances);
        json_decref(runners);
        json_decref(tasks);
        json_decref(downloads);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *cluster_state_to_json(const struct cluster_state *s)
{
    json_t *j = cluster_state_to_jsonv(s);
    if (!j)
        return NULL;
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return text;
}

/* ---- JSON in ---- */

static int get_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi,
                   int *dst, char *err, size_t errlen)
{
    int64_t v;
    int rc = json_get_int(j, path, key, lo, hi, &v, err, errlen);
    if (rc == 0)
        *dst = (int)v;
    return rc;
}

/* Error text is allowed only with a Failed status; path names the element. */
static int error_only_when_failed(const char *error, bool failed, const char *path, char *err,
                                  size_t errlen)
{
    if (error && !failed)
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "%s.error: must be null unless status is Failed", path);
    return 0;
}

static int iface_from_json(const json_t *j, const char *path, struct cluster_iface *out,
                           char *err, size_t errlen)
{
    static const char *const keys[] = {"name", "loopback", "addresses", NULL};
    json_t *addrs;
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = json_get_name(j, path, "name", IDS_IFNAME_MAX, out->name, err, errlen);
    if (!rc)
        rc = json_get_bool(j, path, "loopback", &out->loopback, err, errlen);
    if (!rc)
        rc = json_get_member(j, path, "addresses", JSON_ARRAY, &addrs, err, errlen);
    if (rc)
        return rc;
    size_t n = json_array_size(addrs);
    if (n > CLUSTER_MAX_ADDRS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.addresses: %zu entries, more than %d",
                          path, n, CLUSTER_MAX_ADDRS);
    if (n) {
        out->addrs = calloc(n, sizeof *out->addrs);
        if (!out->addrs)
            return cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", path);
    }
    out->n_addrs = n;
    for (size_t i = 0; i < n; i++) {
        char p[JSON_PATH_MAX + 32];
        json_path(p, sizeof p, "%s.addresses[%zu]", path, i);
        rc = json_get_name_value(json_array_get(addrs, i), p, IDS_ADDR_MAX, out->addrs[i], err,
                                 errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int cluster_node_info_from_json(const json_t *j, const char *path, struct cluster_node_info *out,
                                char *err, size_t errlen)
{
    static const char *const keys[] = {"memory_total_bytes", "memory_available_bytes",
                                       "disk_free_bytes", "disk_total_bytes", "cpu_model",
                                       "cpu_cores", "isa", "os", "hostname", "interfaces",
                                       "api_port", "cluster_port", "memory_bandwidth_bytes_per_s", NULL};
    json_t *ifaces;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "memory_total_bytes", 0, IDS_BYTES_MAX, &out->memory_total,
                          err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "memory_available_bytes", 0, IDS_BYTES_MAX,
                          &out->memory_available, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "disk_free_bytes", 0, IDS_BYTES_MAX, &out->disk_free, err,
                          errlen);
    if (!rc)
        rc = json_get_int(j, path, "disk_total_bytes", 0, IDS_BYTES_MAX, &out->disk_total, err,
                          errlen);
    if (!rc)
        rc = json_get_name(j, path, "cpu_model", IDS_NAME_MAX, out->cpu_model, err, errlen);
    if (!rc)
        rc = get_int(j, path, "cpu_cores", 0, 65536, &out->cpu_cores, err, errlen);
    if (!rc && json_object_get(j, "memory_bandwidth_bytes_per_s")) /* optional: 0 when not measured */
        rc = json_get_int(j, path, "memory_bandwidth_bytes_per_s", 0, IDS_BYTES_MAX, &out->memory_bandwidth, err,
                          errlen);
    if (!rc)
        rc = json_get_name(j, path, "isa", IDS_NAME_MAX, out->isa, err, errlen);
    if (!rc)
        rc = json_get_name(j, path, "os", IDS_NAME_MAX, out->os, err, errlen);
    if (!rc)
        rc = json_get_name(j, path, "hostname", IDS_NAME_MAX, out->hostname, err, errlen);
    if (!rc)
        rc = get_int(j, path, "api_port", 0, 65535, &out->api_port, err, errlen);
    if (!rc)
        rc = get_int(j, path, "cluster_port", 0, 65535, &out->cluster_port, err, errlen);
    if (!rc)
        rc = json_get_member(j, path, "interfaces", JSON_ARRAY, &ifaces, err, errlen);
    if (rc)
        goto fail;
    size_t n = json_array_size(ifaces);
    if (n > CLUSTER_MAX_IFACES) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.interfaces: %zu entries, more than %d",
                        path, n, CLUSTER_MAX_IFACES);
        goto fail;
    }
    if (n) {
        out->ifaces = calloc(n, sizeof *out->ifaces);
        if (!out->ifaces) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    for (size_t i = 0; i < n; i++) {
        char p[JSON_PATH_MAX + 32];
        json_path(p, sizeof p, "%s.interfaces[%zu]", path, i);
        out->n_ifaces++; /* counted first so a half-read entry is freed too */
        rc = iface_from_json(json_array_get(ifaces, i), p, &out->ifaces[i], err, errlen);
        if (rc)
            goto fail;
    }
    return 0;
fail:
    cluster_node_info_clear(out);
    return rc;
}

static int node_from_json(const json_t *j, const char *path, struct cluster_node *out,
                          char *err, size_t errlen)
{
    static const char *const keys[] = {"node_id", "last_seen_ms", "info", NULL};
    json_t *info;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "node_id", out->id, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "last_seen_ms", 0, IDS_COUNTER_MAX, &out->last_seen_ms, err,
                          errlen);
    if (!rc)
        rc = json_get_member(j, path, "info", JSON_OBJECT, &info, err, errlen);
    if (!rc) {
        char p[JSON_PATH_MAX + 8];
        json_path(p, sizeof p, "%s.info", path);
        rc = cluster_node_info_from_json(info, p, &out->info, err, errlen);
    }
    return rc;
}

int cluster_edge_from_json(const json_t *j, const char *path, struct cluster_edge *out,
                           char *err, size_t errlen)
{
    static const char *const keys[] = {"from", "to", "rtt_us", "throughput_bytes_per_s", NULL};
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "from", out->from, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "to", out->to, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "rtt_us", 0, UINT32_MAX, &out->rtt_us, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "throughput_bytes_per_s", 0, IDS_BYTES_MAX, &out->throughput,
                          err, errlen);
    if (!rc && strcmp(out->from, out->to) == 0)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.to: equals from (\"%s\")", path, out->to);
    return rc;
}

static int shard_from_json(const json_t *j, const char *path, struct cluster_shard *out,
                           char *err, size_t errlen)
{
    static const char *const keys[] = {"node_id", "runner_id", "rank", "world_size",
                                       "layer_begin", "layer_end", NULL};
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "node_id", out->node_id, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "runner_id", out->runner_id, err, errlen);
    if (!rc)
        rc = get_int(j, path, "rank", 0, CLUSTER_MAX_SHARDS - 1, &out->rank, err, errlen);
    if (!rc)
        rc = get_int(j, path, "world_size", 1, CLUSTER_MAX_SHARDS, &out->world_size, err, errlen);
    if (!rc)
        rc = get_int(j, path, "layer_begin", 0, CLUSTER_MAX_LAYERS - 1, &out->layer_begin, err,
                     errlen);
    if (!rc)
        rc = get_int(j, path, "layer_end", 1, CLUSTER_MAX_LAYERS, &out->layer_end, err, errlen);
    if (!rc && out->layer_end <= out->layer_begin)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.layer_end: %d is not above layer_begin %d",
                        path, out->layer_end, out->layer_begin);
    return rc;
}

/* Checks how the shards fit together: rank i at position i, one world size, distinct
 * nodes and runners, pipeline layers contiguous from 0, tensor layers all equal. */
static int shards_check(const struct cluster_instance *in, const char *path, char *err,
                        size_t errlen)
{
    for (size_t i = 0; i < in->n_shards; i++) {
        const struct cluster_shard *sh = &in->shards[i];
        if ((size_t)sh->rank != i)
            return cairn_fail(err, errlen, CAIRN_EFORMAT,
                              "%s.shards[%zu].rank: %d, expected %zu (shards in rank order)",
                              path, i, sh->rank, i);
        if ((size_t)sh->world_size != in->n_shards)
            return cairn_fail(err, errlen, CAIRN_EFORMAT,
                              "%s.shards[%zu].world_size: %d, but there are %zu shards", path, i,
                              sh->world_size, in->n_shards);
        for (size_t k = 0; k < i; k++) {
            if (strcmp(in->shards[k].node_id, sh->node_id) == 0)
                return cairn_fail(err, errlen, CAIRN_EFORMAT,
                                  "%s.shards[%zu].node_id: \"%s\" already holds shard %zu", path,
                                  i, sh->node_id, k);
            if (strcmp(in->shards[k].runner_id, sh->runner_id) == 0)
                return cairn_fail(err, errlen, CAIRN_EFORMAT,
                                  "%s.shards[%zu].runner_id: \"%s\" already runs shard %zu", path,
                                  i, sh->runner_id, k);
        }
        if (in->sharding == CLUSTER_SHARDING_PIPELINE) {
            int expect = i ? in->shards[i - 1].layer_end : 0;
            if (sh->layer_begin != expect)
                return cairn_fail(err, errlen, CAIRN_EFORMAT,
                                  "%s.shards[%zu].layer_begin: %d, expected %d (pipeline layers "
                                  "are contiguous from 0)",
                                  path, i, sh->layer_begin, expect);
        } else if (sh->layer_begin != 0 || sh->layer_end != in->shards[0].layer_end) {
            return cairn_fail(err, errlen, CAIRN_EFORMAT,
                              "%s.shards[%zu]: layers [%d, %d), expected [0, %d) (tensor shards "
                              "hold every layer)",
                              path, i, sh->layer_begin, sh->layer_end, in->shards[0].layer_end);
        }
    }
    return 0;
}

bool cluster_kv_put(json_t *o, const struct cluster_kv *kv)
{
    return (kv->ctx_len <= 0 || put(o, "ctx_len", json_integer(kv->ctx_len))) &&
           (!kv->type_k[0] || put(o, "cache_type_k", json_string(kv->type_k))) &&
           (!kv->type_v[0] || put(o, "cache_type_v", json_string(kv->type_v)));
}

/* Optional KV cache type j[key] into dst (CLUSTER_KV_TYPE_MAX + 1 bytes), "" for f16. */
static int kv_type_from_json(const json_t *j, const char *path, const char *key, char *dst, char *err,
                             size_t errlen)
{
    const json_t *v = json_object_get(j, key);
    dst[0] = 0;
    if (!v || json_is_null(v))
        return 0;
    int t = json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
                ? dtype_kv_from_name(json_string_value(v))
                : -1;
    if (t < 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s%s%s: expected \"f16\", \"f32\", \"q8_0\" or \"q4_0\"",
                          path && path[0] ? path : "", path && path[0] ? "." : "", key);
    if (t != DT_F16)
        snprintf(dst, CLUSTER_KV_TYPE_MAX + 1, "%s", dtype_kv_name(t));
    return 0;
}

int cluster_kv_from_json(const json_t *j, const char *path, struct cluster_kv *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (json_object_get(j, "ctx_len") && !json_is_null(json_object_get(j, "ctx_len")))
        rc = json_get_int(j, path, "ctx_len", 1, CLUSTER_MAX_CTX, &out->ctx_len, err, errlen);
    if (!rc)
        rc = kv_type_from_json(j, path, "cache_type_k", out->type_k, err, errlen);
    if (!rc)
        rc = kv_type_from_json(j, path, "cache_type_v", out->type_v, err, errlen);
    return rc;
}

int cluster_instance_from_json(const json_t *j, const char *path, struct cluster_instance *out,
                               char *err, size_t errlen)
{
    static const char *const keys[] = {"instance_id", "model_id", "sharding", "shards", "draft_model",
                                       "num_draft_tokens", "epoch", "ctx_len", "cache_type_k",
                                       "cache_type_v", NULL};
    json_t *shards;
    int sharding = 0;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "instance_id", out->id, err, errlen);
    if (!rc)
        rc = ids_json_model(j, path, "model_id", false, out->model_id, err, errlen);
    if (!rc)
        rc = json_get_enum(j, path, "sharding", cluster_sharding_name, CLUSTER_SHARDING_COUNT,
                           &sharding, err, errlen);
    out->sharding = (enum cluster_sharding)sharding;
    if (!rc)
        rc = ids_json_model(j, path, "draft_model", true, out->draft_model, err, errlen);
    if (!rc)
        rc = get_int(j, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS,
                     &out->num_draft_tokens, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "epoch", 0, IDS_COUNTER_MAX, &out->epoch, err, errlen);
    if (!rc)
        rc = cluster_kv_from_json(j, path, &out->kv, err, errlen);
    if (!rc)
        rc = json_get_member(j, path, "shards", JSON_ARRAY, &shards, err, errlen);
    if (rc)
        goto fail;
    size_t n = json_array_size(shards);
    if (n < 1 || n > CLUSTER_MAX_SHARDS) {
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.shards: %zu entries, expected 1..%d",
                        path, n, CLUSTER_MAX_SHARDS);
        goto fail;
    }
    out->shards = calloc(n, sizeof *out->shards);
    if (!out->shards) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    out->n_shards = n;
    for (size_t i = 0; i < n; i++) {
        char p[JSON_PATH_MAX + 32];
        json_path(p, sizeof p, "%s.shards[%zu]", path, i);
        rc = shard_from_json(json_array_get(shards, i), p, &out->shards[i], err, errlen);
        if (rc)
            goto fail;
    }
    rc = shards_check(out, path, err, errlen);
    if (rc)
        goto fail;
    return 0;
fail:
    cluster_instance_clear(out);
    return rc;
}

int cluster_runner_from_json(const json_t *j, const char *path, struct cluster_runner *out,
                             char *err, size_t errlen)
{
    static const char *const keys[] = {"runner_id", "instance_id", "node_id", "status", "error",
                                       "restart_count", "data_port", "epoch", NULL};
    int status = 0;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "runner_id", out->id, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "instance_id", out->instance_id, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "node_id", out->node_id, err, errlen);
    if (!rc)
        rc = json_get_enum(j, path, "status", cluster_runner_status_name,
                           CLUSTER_RUNNER_STATUS_COUNT, &status, err, errlen);
    out->status = (enum cluster_runner_status)status;
    if (!rc)
        rc = get_int(j, path, "restart_count", 0, 1000000, &out->restart_count, err, errlen);
    if (!rc && json_object_get(j, "data_port"))
        rc = get_int(j, path, "data_port", 0, 65535, &out->data_port, err, errlen);
    if (!rc && json_object_get(j, "epoch"))
        rc = json_get_int(j, path, "epoch", 0, IDS_COUNTER_MAX, &out->epoch, err, errlen);
    if (!rc)
        rc = json_get_text(j, path, "error", IDS_TEXT_MAX, &out->error, err, errlen);
    if (!rc)
        rc = error_only_when_failed(out->error, out->status == CLUSTER_RUNNER_FAILED, path, err,
                                    errlen);
    if (rc)
        cluster_runner_clear(out);
    return rc;
}

static int task_from_json(const json_t *j, const char *path, struct cluster_task *out,
                          char *err, size_t errlen)
{
    static const char *const keys[] = {"task_id", "kind", "instance_id", "node_id", "status",
                                       "acknowledged", "error", "bytes", NULL};
    int kind = 0, status = 0;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "task_id", out->id, err, errlen);
    if (!rc)
        rc = json_get_enum(j, path, "kind", cluster_task_kind_name, CLUSTER_TASK_KIND_COUNT, &kind,
                           err, errlen);
    out->kind = (enum cluster_task_kind)kind;
    if (!rc)
        rc = ids_json_id(j, path, "instance_id", out->instance_id, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "node_id", out->node_id, err, errlen);
    if (!rc)
        rc = json_get_enum(j, path, "status", cluster_task_status_name, CLUSTER_TASK_STATUS_COUNT,
                           &status, err, errlen);
    out->status = (enum cluster_task_status)status;
    if (!rc)
        rc = json_get_bool(j, path, "acknowledged", &out->acknowledged, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "bytes", 1, (int64_t)CLUSTER_MAX_PARAMS, &out->bytes, err, errlen);
    if (!rc)
        rc = json_get_text(j, path, "error", IDS_TEXT_MAX, &out->error, err, errlen);
    if (!rc)
        rc = error_only_when_failed(out->error, out->status == CLUSTER_TASK_FAILED, path, err,
                                    errlen);
    if (rc)
        cluster_task_clear(out);
    return rc;
}

int cluster_download_from_json(const json_t *j, const char *path, struct cluster_download *out,
                               char *err, size_t errlen)
{
    static const char *const keys[] = {"node_id", "model_id", "bytes_done", "bytes_total",
                                       "bytes_per_s", "eta_s", "status", "error", "layers", NULL};
    int status = 0;
    memset(out, 0, sizeof *out);
    int rc = json_get_keys(j, path, keys, err, errlen);
    if (!rc)
        rc = ids_json_id(j, path, "node_id", out->node_id, err, errlen);
    if (!rc)
        rc = ids_json_model(j, path, "model_id", false, out->model_id, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "bytes_done", 0, IDS_BYTES_MAX, &out->bytes_done, err, errlen);
    if (!rc)
        rc = json_get_int(j, path, "bytes_total", 0, IDS_BYTES_MAX, &out->bytes_total, err,
                          errlen);
    if (!rc && out->bytes_done > out->bytes_total)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT,
                        "%s.bytes_done: %lld is above bytes_total %lld", path,
                        (long long)out->bytes_done, (long long)out->bytes_total);
    /* optional (older nodes send neither); eta_s is derived, so only its type is checked */
    const json_t *rate = json_object_get(j, "bytes_per_s"), *eta = json_object_get(j, "eta_s");
    if (!rc && rate && !json_is_null(rate))
        rc = json_get_int(j, path, "bytes_per_s", 0, IDS_BYTES_MAX, &out->bytes_per_s, err, errlen);
    if (!rc)
        rc = json_get_enum(j, path, "status", cluster_download_status_name,
                           CLUSTER_DOWNLOAD_STATUS_COUNT, &status, err, errlen);
    out->status = (enum cluster_download_status)status;
    if (!rc && eta && (json_is_null(eta) ? download_eta(out) >= 0
                                         : !json_is_integer(eta) || json_integer_value(eta) != download_eta(out)))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.eta_s: not what the bytes left and the rate give", path);
    if (!rc)
        rc = json_get_text(j, path, "error", IDS_TEXT_MAX, &out->error, err, errlen);
    if (!rc)
        rc = error_only_when_failed(out->error, out->status == CLUSTER_DOWNLOAD_FAILED, path, err,
                                    errlen);
    const json_t *layers = json_object_get(j, "layers");
    if (!rc && layers && !json_is_null(layers)) {
        json_int_t a = json_integer_value(json_array_get(layers, 0)), b = json_integer_value(json_array_get(layers, 1));
        if (json_array_size(layers) != 2 || !json_is_integer(json_array_get(layers, 0)) ||
            !json_is_integer(json_array_get(layers, 1)) || a < 0 || a >= b || b > CLUSTER_MAX_LAYERS)
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.layers: must be [begin, end) with 0 <= begin < end <= %d",
                            path, CLUSTER_MAX_LAYERS);
        else
            out->layer_begin = (int)a, out->layer_end = (int)b;
    }
    if (rc)
        cluster_download_clear(out);
    return rc;
}

/* Reads the map j[key] (objects keyed by the element's id): decodes each into a zeroed
 * element, checks that its id equals its key, and puts it into the state. */
static int read_map(struct cluster_state *s, const json_t *j, const char *key,
                    const struct table_ops *ops,
                    int (*decode)(const json_t *, const char *, void *, char *, size_t),
                    int (*insert)(struct cluster_state *, void *), const char *id_field,
                    char *err, size_t errlen)
{
    json_t *map, *v;
    const char *k;
    int rc = json_get_member(j, "state", key, JSON_OBJECT, &map, err, errlen);
    if (rc)
        return rc;
    void *elem = calloc(1, ops->elem);
    if (!elem)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "state.%s: out of memory", key);
    json_object_foreach(map, k, v) {
        char p[JSON_PATH_MAX];
        json_path(p, sizeof p, "state.%s.%.*s", key, IDS_ID_MAX + 1, k);
        rc = decode(v, p, elem, err, errlen);
        if (rc)
            break;
        if (strcmp(ops->key(elem).a, k) != 0)
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: \"%s\" differs from its key", p,
                            id_field, ops->key(elem).a);
        else if (insert(s, elem))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", p);
        ops->clear(elem); /* a no-op after a successful insert */
        if (rc)
            break;
    }
    free(elem);
    return rc;
}

static int node_decode(const json_t *j, const char *p, void *o, char *err, size_t errlen)
{
    return node_from_json(j, p, o, err, errlen);
}
static int instance_decode(const json_t *j, const char *p, void *o, char *err, size_t errlen)
{
    return cluster_instance_from_json(j, p, o, err, errlen);
}
static int runner_decode(const json_t *j, const char *p, void *o, char *err, size_t errlen)
{
    return cluster_runner_from_json(j, p, o, err, errlen);
}
static int task_decode(const json_t *j, const char *p, void *o, char *err, size_t errlen)
{
    return task_from_json(j, p, o, err, errlen);
}
static int node_insert(struct cluster_state *s, void *e) { return cluster_state_put_node(s, e); }
static int instance_insert(struct cluster_state *s, void *e)
{
    return cluster_state_put_instance(s, e);
}
static int runner_insert(struct cluster_state *s, void *e)
{
    return cluster_state_put_runner(s, e);
}
static int task_insert(struct cluster_state *s, void *e) { return cluster_state_put_task(s, e); }

static int read_edges(struct cluster_state *s, const json_t *j, char *err, size_t errlen)
{
    json_t *arr;
    int rc = json_get_member(j, "state", "edges", JSON_ARRAY, &arr, err, errlen);
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
        char p[64];
        struct cluster_edge e;
        json_path(p, sizeof p, "state.edges[%zu]", i);
        rc = cluster_edge_from_json(json_array_get(arr, i), p, &e, err, errlen);
        if (!rc && cluster_state_find_edge(s, e.from, e.to))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: a second edge %s -> %s", p, e.from,
                            e.to);
        if (!rc && cluster_state_put_edge(s, &e))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", p);
    }
    return rc;
}

static int read_downloads(struct cluster_state *s, const json_t *j, char *err, size_t errlen)
{
    json_t *arr;
    int rc = json_get_member(j, "state", "downloads", JSON_ARRAY, &arr, err, errlen);
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
        char p[64];
        struct cluster_download d;
        json_path(p, sizeof p, "state.downloads[%zu]", i);
        rc = cluster_download_from_json(json_array_get(arr, i), p, &d, err, errlen);
        if (rc)
            break;
        if (cluster_state_find_download(s, d.node_id, d.model_id))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: a second download of %s on %s", p,
                            d.model_id, d.node_id);
        else if (cluster_state_put_download(s, &d))
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "%s: out of memory", p);
        cluster_download_clear(&d); /* no-op after a successful put */
    }
    return rc;
}

int cluster_state_from_jsonv(const json_t *j, struct cluster_state **out, char *err,
                             size_t errlen)
{
    static const char *const keys[] = {"last_applied", "master", "nodes", "edges", "instances",
                                       "runners", "tasks", "downloads", NULL};
    json_t *last, *master;
    *out = NULL;
    struct cluster_state *s = cluster_state_create();
    if (!s)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "state: out of memory");
    int rc = json_get_keys(j, "state", keys, err, errlen);
    if (!rc)
        rc = json_get_member(j, "state", "last_applied", JSON_OBJECT, &last, err, errlen);
    if (!rc)
        rc = json_get_keys(last, "state.last_applied", (const char *const[]){"term", "index", NULL},
                           err, errlen);
    if (!rc)
        rc = json_get_int(last, "state.last_applied", "term", 0, IDS_COUNTER_MAX, &s->last_term,
                          err, errlen);
    if (!rc)
        rc = json_get_int(last, "state.last_applied", "index", 0, IDS_COUNTER_MAX, &s->last_index,
                          err, errlen);
    if (!rc)
        rc = json_get_member(j, "state", "master", JSON_OBJECT, &master, err, errlen);
    if (!rc)
        rc = json_get_keys(master, "state.master", (const char *const[]){"node_id", "term", NULL},
                           err, errlen);
    if (!rc)
        rc = ids_json_id_or_null(master, "state.master", "node_id", s->master_node_id, err,
                                 errlen);
    if (!rc)
        rc = json_get_int(master, "state.master", "term", 0, IDS_COUNTER_MAX, &s->master_term, err,
                          errlen);
    if (!rc)
        rc = read_map(s, j, "nodes", &node_ops, node_decode, node_insert, "node_id", err,
                      errlen);
    if (!rc)
        rc = read_edges(s, j, err, errlen);
    if (!rc)
        rc = read_map(s, j, "instances", &instance_ops, instance_decode, instance_insert,
                      "instance_id", err, errlen);
    if (!rc)
        rc = read_map(s, j, "runners", &runner_ops, runner_decode, runner_insert,
                      "runner_id", err, errlen);
    if (!rc)
        rc = read_map(s, j, "tasks", &task_ops, task_decode, task_insert, "task_id", err,
                      errlen);
    if (!rc)
        rc = read_downloads(s, j, err, errlen);
    if (rc) {
        cluster_state_release(s);
        return rc;
    }
    *out = s;
    return 0;
}

int cluster_state_from_json(const char *text, size_t len, struct cluster_state **out,
                            char *err, size_t errlen)
{
    json_error_t je;
    *out = NULL;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "state: JSON line %d column %d: %s",
                          je.line, je.column, je.text);
    int rc = cluster_state_from_jsonv(j, out, err, errlen);
    json_decref(j);
    return rc;
}
