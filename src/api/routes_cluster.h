/* The cluster's HTTP endpoints over a node (node/node.h):
 *   GET    /node_id                     {"node_id"}
 *   GET    /state                       the whole state (state.h's JSON), and "open": true
 *                                       when this node's cluster has no secret
 *   GET    /state/<key>/<key>...        a part of it by key path (array parts by index)
 *   GET    /events                      this node's log: {"events": [...], "reset"}
 *          ?since_term=T&since_index=I&limit=N (1000, at most 10000); with
 *          Accept: text/event-stream or ?stream=1, an SSE stream of the events applied
 *          from now on (data: the event's JSON, id: "term:index")
 *   GET    /instance/previews?model_id=M[&sharding=S&min_nodes=K&draft_model=D]
 *                                       every placement considered (place.h's JSON)
 *   POST   /place_instance              {"model_id", "sharding", "min_nodes",
 *                                        "draft_model", "num_draft_tokens"}
 *   POST   /instance                    an explicit instance ({"instance": {...}})
 *   GET    /instance/<id>               the instance
 *   DELETE /instance/<id>
 *   PUT    /instance/<id>/draft_model   {"draft_model": id|null, "num_draft_tokens"}
 *   GET    /models                      {"models": [card with "nodes"]}
 * Commands answer {"message", "command_id", "instance_id", "instance": object|null} once
 * this node's state shows their effect. Errors are JSON (http.h) with the status:
 * 400 naming the bad field, 404 unknown instance or model, 409 an id in use or no
 * placement that fits, 503 (Retry-After) when no master answers. */
#ifndef CAIRN_API_ROUTES_CLUSTER_H
#define CAIRN_API_ROUTES_CLUSTER_H

#include <stddef.h>

#include "api/http.h"
#include "node/node.h"

#define ROUTES_COMMAND_TIMEOUT_MS 15000
#define ROUTES_EVENTS_LIMIT 1000
#define ROUTES_EVENTS_MAX 10000
#define ROUTES_MAX_STREAMS 64 /* /events streams at once (the server holds 256 connections) */

struct routes_cluster;

/* Adds the routes above to srv (before http_server_start) for node, which must outlive
 * the routes. *out (caller-owned) holds the event streams; release it after
 * http_server_stop. command_timeout_ms 0 = ROUTES_COMMAND_TIMEOUT_MS. */
int routes_cluster_create(struct routes_cluster **out, struct http_server *srv,
                          struct node *node, int command_timeout_ms, char *err,
                          size_t errlen);

/* Unsubscribes and releases every event stream, frees r; accepts NULL. Call after
 * http_server_stop. */
void routes_cluster_release(struct routes_cluster *r);

/* HTTP status for a CAIRN_E* code of a command or lookup (404, 400, 409, 503, 500). */
int routes_cluster_status(int code);

#endif
