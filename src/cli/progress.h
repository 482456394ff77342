/* A download's progress on stderr, for cairn pull and for the pulls cairn run asks of a
 * node: a bar redrawn in place on a terminal, one line every few seconds otherwise. */
#ifndef CAIRN_CLI_PROGRESS_H
#define CAIRN_CLI_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/hub.h"

#define PROGRESS_LINE_EVERY_S 5 /* progress lines when stderr is not a terminal */

struct progress_bar {
    bool tty;
    int64_t t0, last;
    uint64_t done0; /* bytes already here when the transfer started */
    bool started;   /* a byte moved: a line is open on a terminal until "success" */
};

/* bytes as "1.5 GiB" into out. */
void progress_human(double bytes, char *out, size_t cap);

/* Shows p (a hub_progress_fn; ctx is a struct progress_bar, zeroed but for tty). */
void progress_show(void *ctx, const struct hub_progress *p);

/* Ends an open bar's line (after a failure, which sends no "success"). */
void progress_end(struct progress_bar *b);

#endif
