/* The generation backend of a node (gen.h's ops over the cluster): a request becomes a
 * TextGeneration command for a ready instance of its model (the one with the fewest
 * requests of this node in flight); when the cluster has the model but no instance of
 * it, the best placement is made first and waited for. The runner's output lines come
 * back through the node's task sink (node_set_task_sink) and become gen events. A
 * request whose task leaves the state, fails, or whose instance goes away without a
 * final line ends with an ERROR event (checked every GEN_NODE_CHECK_MS), and so does one
 * whose task runs on a node this node has had no link to for GEN_NODE_UNLINKED_MS (its
 * output could not come back; the cluster would only notice at --node-timeout).
 *
 * It also keeps the serving figures for GET /metrics (Prometheus text) and says whether
 * any instance is ready for GET /health. */
#ifndef CAIRN_API_GEN_NODE_H
#define CAIRN_API_GEN_NODE_H

#include <stdbool.h>
#include <stddef.h>

#include "api/gen.h"
#include "api/http.h"
#include "node/node.h"

#define GEN_NODE_CHECK_MS 500
#define GEN_NODE_LOST_MS 5000          /* a task gone from the state this long without a done line */
#define GEN_NODE_UNLINKED_MS 500       /* no link to the node running a task this long: it failed */
#define GEN_NODE_MAX_LIVE 1024         /* requests in flight on this node; more get 503 */
#define GEN_NODE_READY_WAIT_MS 300000  /* longest wait for an instance to become ready */
#define GEN_NODE_COMMAND_MS 15000

struct gen_node;

/* Creates the backend over node (which must outlive it) and sets the node's task sink.
 * CAIRN_ENOMEM, CAIRN_EIO (no thread). */
int gen_node_create(struct gen_node **out, struct node *node, char *err, size_t errlen);

/* Ends every request in flight with an ERROR, stops the thread, frees; accepts NULL.
 * Call after the HTTP server stopped. */
void gen_node_release(struct gen_node *g);

/* The ops for the front-ends. */
struct gen gen_node_gen(struct gen_node *g);

/* Adds GET /health (200 {"status":"ok"} when an instance is ready, else 503) and
 * GET /metrics to srv. */
int gen_node_routes(struct gen_node *g, struct http_server *srv, char *err, size_t errlen);

#endif
