#include "api/routes_cluster.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/routes_download.h"
#include "api/sse.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"
#include "node/cards.h"
#include "node/catalog.h"
#include "node/hub.h"
#include "node/hubref.h"

/* An SSE client of /events: subscribed to the node until its stream closes. */
struct ev_stream {
    struct ev_stream *next;
    struct http_stream *s;
    uint64_t token;
};

#define ROUTES_HUB_HEADER_MS 60000 /* a hub model's header: read (or waited for) this long */

struct routes_cluster {
    struct node *node;
    int timeout_ms;
    pthread_mutex_t mu; /* streams */
    struct ev_stream *streams;
    size_t n_streams;
};

int routes_cluster_status(int code)
{
    switch (code) {
    case 0:
        return 200;
    case CAIRN_ENOTFOUND:
        return 404;
    case CAIRN_EFORMAT:
    case CAIRN_EINVAL:
    case CAIRN_ERANGE:
    case CAIRN_EUNSUPPORTED:
        return 400;
    case CAIRN_ESTATE:
    case CAIRN_EFULL:
        return 409;
    case CAIRN_EIO:
        return 503;
    default:
        return 500;
    }
}

static const char *error_type(int code)
{
    switch (code) {
    case CAIRN_ENOTFOUND:
        return "not_found";
    case CAIRN_EFULL:
        return "no_placement";
    case CAIRN_ESTATE:
        return "conflict";
    case CAIRN_EIO:
        return "no_master";
    case CAIRN_EUNSUPPORTED:
        return "unsupported";
    case CAIRN_ENOMEM:
        return "server_error";
    default:
        return "invalid_request";
    }
}

static void reply_code(struct http_request *req, int code, const char *message)
{
    if (code == CAIRN_EIO)
        http_reply_header(req, "Retry-After", "2");
    http_reply_error(req, routes_cluster_status(code), error_type(code), "%s", message);
}

static void reply_oom(struct http_request *req)
{
    http_reply_error(req, 500, "server_error", "out of memory");
}

/* ---- state ---- */

struct state_text {
    char *text;
};

static void state_to_text(void *ctx, const struct cluster_state *s)
{
    ((struct state_text *)ctx)->text = cluster_state_to_json(s);
}

static void h_node_id(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    http_reply_json(req, 200, json_pack("{s:s}", "node_id", node_id(r->node)));
}

static void h_state(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    struct state_text t = {0};
    node_read_state(r->node, state_to_text, &t);
    if (!t.text) {
        reply_oom(req);
        return;
    }
    /* Besides the replicated state, whether this node's cluster is open (no secret: any
     * machine on the network may join it); spliced in front of the state's members. */
    bool open = !node_dataplane_secret(r->node)[0];
    size_t n = strlen(t.text);
    char *text = n >= 2 && t.text[0] == '{' ? malloc(n + 16) : NULL;
    if (!text) {
        free(t.text);
        reply_oom(req);
        return;
    }
    int k = snprintf(text, n + 16, "{\"open\":%s%s%s", open ? "true" : "false", t.text[1] == '}' ? "" : ",", t.text + 1);
    http_reply_bytes(req, 200, "application/json", text, (size_t)k);
    free(text);
    free(t.text);
}

static void h_state_path(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    const char *path = http_req_param(req, "path");
    struct state_text t = {0};
    node_read_state(r->node, state_to_text, &t);
    json_t *root = t.text ? json_loads(t.text, 0, NULL) : NULL;
    free(t.text);
    if (!root) {
        reply_oom(req);
        return;
    }
    char buf[1024], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path ? path : "");
    json_t *cur = root;
    for (char *key = strtok_r(buf, "/", &save); key && cur; key = strtok_r(NULL, "/", &save)) {
        if (json_is_object(cur)) {
            cur = json_object_get(cur, key);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(key, &end, 10);
            cur = *key && !*end ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
    }
    char *text = cur ? json_dumps(cur, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    if (!cur)
        http_reply_error(req, 404, "not_found", "state has no %s", path ? path : "");
    else if (!text)
        reply_oom(req);
    else
        http_reply_bytes(req, 200, "application/json", text, strlen(text));
    free(text);
    json_decref(root);
}

/* ---- events ---- */

struct collect {
    json_t *arr;
    bool bad;
};

static int collect_one(void *ctx, const char *json, size_t len)
{
    struct collect *c = ctx;
    json_t *j = json_loadb(json, len, 0, NULL);
    if (!j || json_array_append_new(c->arr, j)) {
        c->bad = true;
        return 1;
    }
    return 0;
}

/* Releases the streams that have closed (their subscriptions first). */
static void sweep(struct routes_cluster *r, bool all)
{
    pthread_mutex_lock(&r->mu);
    for (struct ev_stream **pp = &r->streams; *pp;) {
        struct ev_stream *e = *pp;
        if (!all && !http_stream_closed(e->s)) {
            pp = &e->next;
            continue;
        }
        *pp = e->next;
        r->n_streams--;
        node_unsubscribe(r->node, e->token);
        http_stream_release(e->s);
        free(e);
    }
    pthread_mutex_unlock(&r->mu);
}

static void on_event(void *ctx, const char *json, size_t len, int64_t term, int64_t index)
{
    struct ev_stream *e = ctx;
    (void)len;
    char id[64];
    snprintf(id, sizeof id, "%lld:%lld", (long long)term, (long long)index);
    if (!http_stream_closed(e->s))
        sse_send(e->s, NULL, id, json); /* a full queue closes the stream; sweep frees it */
}

static bool wants_stream(struct http_request *req)
{
    const char *q = http_req_query(req, "stream");
    if (q && (!strcmp(q, "1") || !strcmp(q, "true")))
        return true;
    const char *accept = http_req_header(req, "Accept");
    return accept && strstr(accept, "text/event-stream");
}

static void h_events_stream(struct http_request *req, struct routes_cluster *r)
{
    sweep(r, false);
    pthread_mutex_lock(&r->mu);
    size_t n = r->n_streams;
    pthread_mutex_unlock(&r->mu);
    if (n >= ROUTES_MAX_STREAMS) { /* below the server's connection cap: streams never take them all */
        http_reply_header(req, "Retry-After", "5");
        http_reply_error(req, 503, "unavailable", "this node serves %d event streams already", ROUTES_MAX_STREAMS);
        return;
    }
    struct ev_stream *e = calloc(1, sizeof *e);
    if (!e) {
        reply_oom(req);
        return;
    }
    if (sse_start(req, &e->s)) {
        free(e);
        return;
    }
    if (node_subscribe(r->node, on_event, e, &e->token)) {
        sse_comment(e->s, "too many event streams");
        http_stream_release(e->s);
        free(e);
        return;
    }
    pthread_mutex_lock(&r->mu);
    e->next = r->streams;
    r->streams = e;
    r->n_streams++;
    pthread_mutex_unlock(&r->mu);
}

static bool query_int(struct http_request *req, const char *name, long long lo, long long hi,
                      long long *out)
{
    const char *v = http_req_query(req, name);
    if (!v)
        return true;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        http_reply_error(req, 400, "invalid_request", "%s: must be an integer in [%lld, %lld]",
                         name, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* Fills what kv does not say (ctx, k, v: which) from this node's defaults. */
static void place_kv_defaults(struct cluster_kv *kv, const struct cluster_kv *def, bool ctx, bool k, bool v)
{
    if (ctx)
        kv->ctx_len = def->ctx_len;
    if (k)
        memcpy(kv->type_k, def->type_k, sizeof kv->type_k);
    if (v)
        memcpy(kv->type_v, def->type_v, sizeof kv->type_v);
}

/* The KV cache asked in the query (ctx_len, cache_type_k, cache_type_v), filled from
 * this node's defaults where it says nothing; false when refused (answered). */
static bool query_kv(struct http_request *req, const struct node *node, struct cluster_kv *kv)
{
    long long ctx_len = 0;
    if (!query_int(req, "ctx_len", 1, CLUSTER_MAX_CTX, &ctx_len))
        return false;
    json_t *j = json_object();
    const char *tk = http_req_query(req, "cache_type_k"), *tv = http_req_query(req, "cache_type_v");
    bool ok = j && (!ctx_len || json_object_set_new(j, "ctx_len", json_integer(ctx_len)) == 0) &&
              (!tk || json_object_set_new(j, "cache_type_k", json_string(tk)) == 0) &&
              (!tv || json_object_set_new(j, "cache_type_v", json_string(tv)) == 0);
    char err[256];
    int rc = ok ? cluster_kv_from_json(j, "", kv, err, sizeof err) : CAIRN_ENOMEM;
    json_decref(j);
    if (rc) {
        if (rc == CAIRN_ENOMEM)
            reply_oom(req);
        else
            http_reply_error(req, 400, "invalid_request", "%s", err);
        return false;
    }
    place_kv_defaults(kv, node_place_kv(node), !ctx_len, !tk, !tv);
    return true;
}

static void h_events(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    if (wants_stream(req)) {
        h_events_stream(req, r);
        return;
    }
    long long term = 0, index = 0, limit = ROUTES_EVENTS_LIMIT;
    if (!query_int(req, "since_term", 0, IDS_COUNTER_MAX, &term) ||
        !query_int(req, "since_index", 0, IDS_COUNTER_MAX, &index) ||
        !query_int(req, "limit", 1, ROUTES_EVENTS_MAX, &limit))
        return;
    char err[512] = "";
    struct collect c = {.arr = json_array()};
    int reset = 0;
    int rc = c.arr ? node_read_events(r->node, term, index, (size_t)limit, collect_one, &c, &reset, err, sizeof err)
                   : cairn_fail(err, sizeof err, CAIRN_ENOMEM, "out of memory");
    if (rc == CAIRN_ERANGE) {
        json_decref(c.arr);
        http_reply_error(req, 400, "invalid_request", "since: %s", err);
        return;
    }
    if (rc || !c.arr || c.bad) {
        json_decref(c.arr);
        http_reply_error(req, 500, "server_error", "event log: %s", rc ? err : "out of memory");
        return;
    }
    http_reply_json(req, 200, json_pack("{s:o, s:b}", "events", c.arr, "reset", reset));
}

/* ---- instances ---- */

struct find_instance {
    const char *id;
    json_t *out;
};

static void find_instance(void *ctx, const struct cluster_state *s)
{
    struct find_instance *f = ctx;
    const struct cluster_instance *in = cluster_state_find_instance(s, f->id);
    f->out = in ? cluster_instance_to_json(in) : NULL;
}

static json_t *instance_json(struct routes_cluster *r, const char *id)
{
    struct find_instance f = {.id = id};
    if (id && id[0])
        node_read_state(r->node, find_instance, &f);
    return f.out;
}

/* Runs a command built from the request and answers for it. */
/* Runs a command made from body (NULL: the request's) and answers with its result. A
 * place command for a hub model whose header the master is still reading is asked
 * again, for up to ROUTES_HUB_HEADER_MS. */
static void run_command_body(struct http_request *req, struct routes_cluster *r, enum command_kind kind,
                             const char *instance_id, const char *done, const json_t *given, bool hub_model)
{
    struct command c;
    char err[COMMAND_MESSAGE_MAX];
    const json_t *body = given ? given : http_req_json(req);
    size_t len = 0;
    http_req_body(req, &len);
    if (kind != COMMAND_DELETE_INSTANCE && !body) {
        http_reply_error(req, 400, "invalid_request",
                         len ? "body: not JSON" : "body: a JSON object is required");
        return;
    }
    int rc = command_from_request(kind, body, instance_id, &c, err, sizeof err);
    if (rc) {
        reply_code(req, rc == CAIRN_ENOMEM ? rc : CAIRN_EFORMAT, err);
        return;
    }
    if (kind == COMMAND_PLACE_INSTANCE)
        place_kv_defaults(&c.place_instance.kv, node_place_kv(r->node), !json_opt_get(body, "ctx_len", NULL),
                          !json_opt_get(body, "cache_type_k", NULL), !json_opt_get(body, "cache_type_v", NULL));
    struct command_result res;
    rc = node_command(r->node, &c, r->timeout_ms, &res);
    for (int waited = 0; hub_model && rc == CAIRN_ENOTFOUND && waited < ROUTES_HUB_HEADER_MS; waited += 500) {
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
        rc = node_command(r->node, &c, r->timeout_ms, &res);
    }
    command_clear(&c);
    if (rc) {
        reply_code(req, rc, res.message);
        return;
    }
    json_t *in = kind == COMMAND_DELETE_INSTANCE ? NULL : instance_json(r, res.instance_id);
    char msg[256];
    snprintf(msg, sizeof msg, "instance %s %s", res.instance_id, done);
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:o, s:o}", "message", msg, "command_id",
                              res.command_id, "instance_id",
                              ids_json_string_or_null(res.instance_id, true), "instance",
                              in ? in : json_null()));
}

static void run_command(struct http_request *req, struct routes_cluster *r, enum command_kind kind,
                        const char *instance_id, const char *done)
{
    run_command_body(req, r, kind, instance_id, done, NULL, false);
}

/* A model id as typed, for placement: a hub reference becomes the id its header (read
 * here now, when this node has not yet) gives; anything else stays. 0, or an error
 * already answered. */
static int placeable_id(struct http_request *req, struct routes_cluster *r, const char *model, char *id, bool *hub)
{
    *hub = false;
    char canon[HUBREF_TEXT_MAX], err[512];
    if (!hubref_canonical(model, canon)) {
        snprintf(id, HUBREF_TEXT_MAX, "%s", model);
        return 0;
    }
    *hub = true;
    struct catalog_card card;
    int rc = node_card(r->node, canon, &card, err, sizeof err); /* pulled here already */
    catalog_card_clear(&card);
    if (!rc) {
        snprintf(id, HUBREF_TEXT_MAX, "%s", canon);
        return 0;
    }
    rc = node_hub_header(r->node, model, ROUTES_HUB_HEADER_MS, id, err, sizeof err);
    if (rc)
        http_reply_error(req, rc == CAIRN_ENOTFOUND ? 404 : rc == CAIRN_EPERM ? 403 : rc == CAIRN_EINVAL ? 400 : 502,
                         "hub_error", "model %s: %s", model, err);
    return rc;
}

static void h_place(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    const json_t *body = http_req_json(req);
    const char *model = json_string_value(json_object_get(body, "model_id"));
    char id[HUBREF_TEXT_MAX];
    bool hub = false;
    if (!model || !hubref_looks_like(model)) {
        run_command(req, ctx, COMMAND_PLACE_INSTANCE, NULL, "placed");
        return;
    }
    if (placeable_id(req, r, model, id, &hub))
        return;
    json_t *copy = json_deep_copy(body);
    if (!copy || json_object_set_new(copy, "model_id", json_string(id))) {
        json_decref(copy);
        reply_oom(req);
        return;
    }
    run_command_body(req, r, COMMAND_PLACE_INSTANCE, NULL, "placed", copy, hub);
    json_decref(copy);
}

static void h_create(struct http_request *req, void *ctx)
{
    run_command(req, ctx, COMMAND_CREATE_INSTANCE, NULL, "created");
}

static void h_delete(struct http_request *req, void *ctx)
{
    run_command(req, ctx, COMMAND_DELETE_INSTANCE, http_req_param(req, "id"), "deleted");
}

static void h_draft(struct http_request *req, void *ctx)
{
    run_command(req, ctx, COMMAND_SET_INSTANCE_DRAFT_MODEL, http_req_param(req, "id"),
                "has its draft model set");
}

static void h_instance(struct http_request *req, void *ctx)
{
    const char *id = http_req_param(req, "id");
    json_t *in = ids_valid_id(id) ? instance_json(ctx, id) : NULL;
    if (!in)
        http_reply_error(req, 404, "not_found", "instance %s not found", id);
    else
        http_reply_json(req, 200, in);
}

static void h_previews(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    const char *typed = http_req_query(req, "model_id");
    const char *sharding = http_req_query(req, "sharding");
    const char *draft = http_req_query(req, "draft_model");
    long long min_nodes = 1;
    char id[HUBREF_TEXT_MAX];
    bool hub = false;
    if (typed && hubref_looks_like(typed) && placeable_id(req, r, typed, id, &hub))
        return;
    const char *model = hub ? id : typed;
    if (!model || !ids_valid_model(model)) {
        http_reply_error(req, 400, "invalid_request", "model_id: %s",
                         model ? "not a valid model id" : "required");
        return;
    }
    if (draft && draft[0] && !ids_valid_model(draft)) {
        http_reply_error(req, 400, "invalid_request", "draft_model: not a valid model id");
        return;
    }
    enum cluster_sharding sh = CLUSTER_SHARDING_PIPELINE;
    if (sharding && !strcmp(sharding, "tensor"))
        sh = CLUSTER_SHARDING_TENSOR;
    else if (sharding && strcmp(sharding, "pipeline")) {
        http_reply_error(req, 400, "invalid_request",
                         "sharding: \"%.32s\" is not one of pipeline, tensor", sharding);
        return;
    }
    if (!query_int(req, "min_nodes", 1, CLUSTER_MAX_SHARDS, &min_nodes))
        return;
    struct cluster_kv kv;
    if (!query_kv(req, r->node, &kv))
        return;
    /* Placement reads model files: on a copy, so the node thread never waits for it. */
    struct cluster_state *s = node_state_copy(r->node);
    if (!s) {
        reply_oom(req);
        return;
    }
    struct place_result pr;
    char err[512];
    int64_t ctx_len = 0;
    int rc = master_previews(s, node_master_env(r->node), model, sh, (int)min_nodes, draft, &kv, &ctx_len, &pr,
                             err, sizeof err);
    if (rc) {
        cluster_state_release(s);
        place_result_free(&pr);
        reply_code(req, rc == CAIRN_EINVAL ? CAIRN_EFORMAT : rc, err);
        return;
    }
    json_t *j = place_result_to_json(&pr);
    if (j && master_preview_estimates(s, node_master_env(r->node), model, &pr, j, err, sizeof err))
        j = (json_decref(j), NULL);
    cluster_state_release(s);
    place_result_free(&pr);
    if (j && json_object_set_new(j, "ctx_len", json_integer(ctx_len)))
        j = (json_decref(j), NULL);
    if (!j)
        reply_oom(req);
    else
        http_reply_json(req, 200, j);
}

static void h_models(struct http_request *req, void *ctx)
{
    struct routes_cluster *r = ctx;
    json_t *arr = node_models_json(r->node);
    if (!arr)
        reply_oom(req);
    else
        http_reply_json(req, 200, json_pack("{s:o}", "models", arr));
}

/* GET /catalog[?q=TEXT]: the built-in cards (node/cards.h) whose words match. */
static void h_catalog(struct http_request *req, void *ctx)
{
    (void)ctx;
    const char *q = http_req_query(req, "q");
    if (q && strlen(q) > HUB_QUERY_MAX) {
        http_reply_error(req, 400, "invalid_request_error", "q: at most %d bytes", HUB_QUERY_MAX);
        return;
    }
    json_t *found = cards_search(q, cards_count());
    if (!found)
        reply_oom(req);
    else
        http_reply_json(req, 200, json_pack("{s:o}", "models", found));
}

/* GET /hub/search?q=TEXT[&limit=N]: repos of the Hugging Face hub with GGUF files. */
static void h_hub_search(struct http_request *req, void *ctx)
{
    (void)ctx;
    const char *q = http_req_query(req, "q"), *lim = http_req_query(req, "limit");
    char *end = NULL;
    long limit = lim ? strtol(lim, &end, 10) : 20;
    if (!q || !q[0] || strlen(q) > HUB_QUERY_MAX || (lim && (*end || limit < 1 || limit > HUB_SEARCH_MAX))) {
        http_reply_error(req, 400, "invalid_request_error", "q: 1..%d bytes to search for; limit: 1..%d", HUB_QUERY_MAX,
                         HUB_SEARCH_MAX);
        return;
    }
    struct hub_config cfg = {.models_dir = "."};
    json_t *found = NULL;
    char err[512];
    int rc = hub_search(&cfg, q, (int)limit, &found, err, sizeof err);
    if (rc)
        http_reply_error(req, rc == CAIRN_EINVAL ? 400 : rc == CAIRN_EPERM ? 403 : 502, "hub_error", "%s", err);
    else
        http_reply_json(req, 200, json_pack("{s:o}", "models", found));
}

/* ---- setup ---- */

int routes_cluster_create(struct routes_cluster **out, struct http_server *srv,
                          struct node *node, int command_timeout_ms, char *err,
                          size_t errlen)
{
    static const struct {
        const char *method, *pattern;
        http_handler_fn fn;
    } routes[] = {
        {"GET", "/node_id", h_node_id},
        {"GET", "/state", h_state},
        {"GET", "/state/*path", h_state_path},
        {"GET", "/events", h_events},
        {"GET", "/instance/previews", h_previews},
        {"POST", "/place_instance", h_place},
        {"POST", "/instance", h_create},
        {"GET", "/instance/:id", h_instance},
        {"DELETE", "/instance/:id", h_delete},
        {"PUT", "/instance/:id/draft_model", h_draft},
        {"GET", "/models", h_models},
        {"GET", "/hub/search", h_hub_search},
        {"GET", "/catalog", h_catalog},
    };
    *out = NULL;
    if (!srv || !node || command_timeout_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "routes: a server and a node are required");
    struct routes_cluster *r = calloc(1, sizeof *r);
    if (!r)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    r->node = node;
    r->timeout_ms = command_timeout_ms ? command_timeout_ms : ROUTES_COMMAND_TIMEOUT_MS;
    pthread_mutex_init(&r->mu, NULL);
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int rc = http_route(srv, routes[i].method, routes[i].pattern, routes[i].fn, r);
        if (rc) {
            routes_cluster_release(r);
            return cairn_fail(err, errlen, rc, "route %s %s: %s", routes[i].method,
                              routes[i].pattern, cairn_strerror(rc));
        }
    }
    int rc = routes_download_register(srv, node, err, errlen);
    if (rc) {
        routes_cluster_release(r);
        return rc;
    }
    *out = r;
    return 0;
}

void routes_cluster_release(struct routes_cluster *r)
{
    if (!r)
        return;
    sweep(r, true);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
