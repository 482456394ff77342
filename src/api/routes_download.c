/* Downloads on a given node, as exo's API has them (routes_download.h). */
#include "api/routes_download.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/gen_pull.h"
#include "base/err.h"
#include "base/log.h"
#include "base/version.h"
#include "node/download.h"
#include "node/hubref.h"

#define FORWARDED_HEADER "X-Cairn-Forwarded"
#define FORWARD_TIMEOUT_S 30
#define FORWARD_REPLY_MAX 65536

/* The request's body: {"model": id or reference, "node_id": id (optional: this node)}. */
static bool read_body(struct http_request *req, struct node *n, const char **model, const char **node)
{
    const json_t *body = http_req_json(req);
    *model = json_string_value(json_object_get(body, "model"));
    *node = json_string_value(json_object_get(body, "node_id"));
    if (!*model || !(*model)[0] || strlen(*model) >= HUBREF_TEXT_MAX) {
        http_reply_error(req, 400, "invalid_request", "model: a model id or hub reference is required");
        return false;
    }
    if (*node && !ids_valid_id(*node)) {
        http_reply_error(req, 400, "invalid_request", "node_id: not a valid node id");
        return false;
    }
    if (!*node || !(*node)[0])
        *node = node_id(n);
    return true;
}

struct reply_buf {
    char *b;
    size_t n;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct reply_buf *r = arg;
    size_t k = size * nmemb;
    if (r->n + k > FORWARD_REPLY_MAX)
        return 0;
    char *b = realloc(r->b, r->n + k + 1);
    if (!b)
        return 0;
    memcpy(b + r->n, data, k);
    r->n += k;
    b[r->n] = 0;
    r->b = b;
    return k;
}

/* Sends the request to node target's API (its addresses from the state, in turn) and
 * answers with what it answered. Forwarded once: a forwarded request is never sent on. */
static void forward(struct http_request *req, struct node *n, const char *target, const char *route,
                    const char *model)
{
    if (http_req_header(req, FORWARDED_HEADER)) {
        http_reply_error(req, 409, "conflict", "node %s is not this node (%s)", target, node_id(n));
        return;
    }
    struct cluster_state *s = node_state_copy(n);
    struct download_source *src = calloc(DOWNLOAD_MAX_SOURCES, sizeof *src);
    size_t k = s && src ? download_sources(s, node_id(n), "_", src, DOWNLOAD_MAX_SOURCES) : 0;
    cluster_state_release(s);
    const struct download_source *to = NULL;
    for (size_t i = 0; i < k && !to; i++)
        if (!strcmp(src[i].node_id, target))
            to = &src[i];
    if (!to) {
        free(src);
        http_reply_error(req, 404, "not_found", "node %s: not in the cluster, or it has no API address", target);
        return;
    }
    json_t *body = json_pack("{s:s, s:s}", "model", model, "node_id", target);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, FORWARDED_HEADER ": 1");
    const char *auth = http_req_header(req, "Authorization");
    char line[1024];
    if (auth && strlen(auth) < sizeof line - 32) {
        snprintf(line, sizeof line, "Authorization: %s", auth);
        h = curl_slist_append(h, line);
    }
    long status = 0;
    struct reply_buf r = {0};
    char why[CURL_ERROR_SIZE] = "";
    for (size_t u = 0; text && u < to->n_urls && !status; u++) {
        char url[DOWNLOAD_URL_MAX + 64];
        snprintf(url, sizeof url, "%s%s", to->urls[u], route);
        CURL *c = curl_easy_init();
        if (!c)
            break;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)FORWARD_TIMEOUT_S);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)DOWNLOAD_CONNECT_MS);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "cairn/" CAIRN_VERSION);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, why);
        free(r.b);
        r = (struct reply_buf){0};
        if (curl_easy_perform(c) == CURLE_OK)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
    }
    curl_slist_free_all(h);
    free(text);
    free(src);
    json_t *answer = r.b ? json_loads(r.b, 0, NULL) : NULL;
    free(r.b);
    if (!status || !json_is_object(answer)) {
        json_decref(answer);
        http_reply_error(req, 502, "bad_gateway", "node %s did not answer%s%s", target, why[0] ? ": " : "", why);
        return;
    }
    http_reply_json(req, (int)status, answer);
}

/* The request's model when it is for this node; a request for another node is sent on
 * (and answered) here, a bad one refused: NULL then. */
static const char *for_this_node(struct http_request *req, struct node *n, const char *route)
{
    const char *model, *target;
    if (!read_body(req, n, &model, &target))
        return NULL;
    if (strcmp(target, node_id(n))) {
        forward(req, n, target, route, model);
        return NULL;
    }
    return model;
}

static void done(struct http_request *req, int status, const char *message, const char *model, struct node *n)
{
    http_reply_json(req, status, json_pack("{s:s, s:s, s:s}", "message", message, "model", model, "node_id",
                                           node_id(n)));
}

/* POST /download/start: a hub reference is pulled (a whole copy); another model id is
 * fetched from a peer that has it. Progress is in /state's downloads. */
static void h_start(struct http_request *req, void *ctx)
{
    struct node *n = ctx;
    const char *model = for_this_node(req, n, "/download/start");
    if (!model)
        return;
    char why[512];
    int rc;
    if (hubref_looks_like(model)) {
        rc = node_hub_pull(n, model, why, sizeof why);
    } else if (!ids_valid_model(model)) {
        http_reply_error(req, 400, "invalid_request", "model: not a model id or hub reference");
        return;
    } else {
        struct cluster_state *s = node_state_copy(n);
        rc = !node_downloads(n) ? cairn_fail(why, sizeof why, CAIRN_ESTATE, "this node has no models folder")
             : !s               ? cairn_fail(why, sizeof why, CAIRN_ENOMEM, "out of memory")
                                : download_mgr_ensure(node_downloads(n), s, model, why, sizeof why);
        cluster_state_release(s);
    }
    if (rc)
        http_reply_error(req, rc == CAIRN_EINVAL ? 400 : rc == CAIRN_ENOTFOUND ? 404 : rc == CAIRN_ESTATE ? 409 : 502,
                         "download_error", "%s", why);
    else
        done(req, 202, "download started; its progress is in /state", model, n);
}

/* POST /download/cancel: the node's hub jobs of the model stop (partial files stay). */
static void h_cancel(struct http_request *req, void *ctx)
{
    struct node *n = ctx;
    const char *model = for_this_node(req, n, "/download/cancel");
    if (!model)
        return;
    char id[HUBREF_TEXT_MAX];
    if (!hubref_canonical(model, id))
        snprintf(id, sizeof id, "%s", model);
    if (node_hub_cancel(n, id))
        http_reply_error(req, 404, "not_found", "no download of %s runs on node %s that can be cancelled", id,
                         node_id(n));
    else
        done(req, 200, "cancelled", id, n);
}

/* POST /download/delete: the model's files on the node (whole, partial or a rank's layers). */
static void h_delete(struct http_request *req, void *ctx)
{
    struct node *n = ctx;
    const char *model = for_this_node(req, n, "/download/delete");
    if (!model)
        return;
    char err[512];
    int status = gen_pull_remove(n, model, err, sizeof err);
    if (status)
        http_reply_error(req, status, status == 404 ? "not_found" : "delete_error", "%s", err);
    else
        done(req, 200, "deleted", model, n);
}

int routes_download_register(struct http_server *srv, struct node *n, char *err, size_t errlen)
{
    static const struct {
        const char *pattern;
        http_handler_fn fn;
    } routes[] = {{"/download/start", h_start}, {"/download/cancel", h_cancel}, {"/download/delete", h_delete}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int rc = http_route(srv, "POST", routes[i].pattern, routes[i].fn, n);
        if (rc)
            return cairn_fail(err, errlen, rc, "route POST %s: %s", routes[i].pattern, cairn_strerror(rc));
    }
    return 0;
}
