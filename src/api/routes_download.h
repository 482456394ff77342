/* Downloads on a given node, as exo's API has them:
 *   POST /download/start   {"model": REF or id, "node_id": ID}  202: a hub reference is
 *        pulled whole, another model id fetched from a peer that has it; the progress is
 *        the node's download in /state and /events
 *   POST /download/cancel  {"model", "node_id"}  200: the node's hub jobs of the model stop
 *        (their partial files stay, for a later resume); 404 when none runs
 *   POST /download/delete  {"model", "node_id"}  200: the model's files on the node go
 *        (a whole copy, partial files, a rank's layers); 404 when it has none
 * node_id (optional) names the node; when it is another, the request is sent on to that
 * node's API (once: a request sent on is never sent further) with the caller's
 * Authorization, and its answer returned. */
#ifndef CAIRN_API_ROUTES_DOWNLOAD_H
#define CAIRN_API_ROUTES_DOWNLOAD_H

#include <stddef.h>

#include "api/http.h"
#include "node/node.h"

int routes_download_register(struct http_server *srv, struct node *n, char *err, size_t errlen);

#endif
