/* The data-plane connections of one pipelined runner (issue 7): it listens for its
 * previous rank, connects to its next one, and hands both to runner/pipeline.h.
 *
 * Ranks form a ring (runner/dataplane.h): rank r connects to rank (r+1) % W, which
 * carries its activations forward (or, from the last rank, the results back to rank 0),
 * and accepts rank (r-1+W) % W. Where the next rank listens comes from the node in a
 * "peers" message (proto/runner_proto.h): its port, as the state records it, and the
 * addresses to try in order. */
#ifndef CAIRN_RUNNER_RUNNER_LINK_H
#define CAIRN_RUNNER_RUNNER_LINK_H

#include <stddef.h>

#include "runner/dataplane.h"
#include "proto/runner_proto.h"

struct runner_link {
    struct dp_listener *listener;
    struct dp_conn *next, *prev;
};

/* Listens on an ephemeral port of bind_addr ("" or NULL: every IPv4 address); the node
 * reports the port. */
int runner_link_listen(struct runner_link *l, const char *bind_addr, char *err, size_t errlen);
int runner_link_port(const struct runner_link *l);

/* Connects to the next rank (each host of p in turn) and accepts the previous one, at
 * once, within timeout_ms; tick(ctx) runs every 100 ms or so meanwhile (heartbeats and
 * messages from the node) and may ask to give up by returning nonzero. Returns 0 with
 * l->next and l->prev open, or CAIRN_EIO (err names the rank and why). */
int runner_link_connect(struct runner_link *l, const struct runner_config *cfg, const struct runner_peers *p,
                        int timeout_ms, int (*tick)(void *ctx), void *ctx, char *err, size_t errlen);

/* Closes both connections (saying why) and the listener. */
void runner_link_close(struct runner_link *l, const char *reason);

#endif
