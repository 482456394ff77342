/* The master's event log: events numbered (term, index) and stored as opaque JSON text
 * in an SQLite file (WAL, synchronous=NORMAL). Positions order by term, then index.
 * Within a term indices are consecutive; every term starts with a state snapshot (kind
 * EVENTLOG_SNAPSHOT_KIND), so a non-empty log always starts with one and its latest
 * snapshot lies in its last term. Compaction drops what lies before the latest
 * snapshot. A handle serves one thread at a time; several handles (threads or
 * processes) may share one file, one of them appending: readers see whole
 * transactions only, and never block the writer. */
#ifndef CAIRN_NODE_EVENTLOG_H
#define CAIRN_NODE_EVENTLOG_H

#include <stddef.h>
#include <stdint.h>

#define EVENTLOG_SNAPSHOT_KIND "StateSnapshot"
#define EVENTLOG_SCHEMA_VERSION 1
#define EVENTLOG_MAX_KIND 64                  /* bytes of a kind: [A-Za-z0-9_]{1,64} */
#define EVENTLOG_MAX_JSON ((size_t)64 << 20) /* bytes of one event's JSON text */

struct eventlog;

/* One event. In a read callback the strings point into the log's row buffers and are
 * valid until the callback returns; json is NUL-terminated after len bytes. On append,
 * created_ms is ignored (the log stamps the wall-clock time). */
struct eventlog_event {
    int64_t term;       /* >= 1 */
    int64_t index;      /* >= 0; consecutive within a term, free at a term's start */
    const char *kind;   /* e.g. "InstanceCreated", or EVENTLOG_SNAPSHOT_KIND */
    const char *json;   /* opaque text, no NUL bytes; may be NULL when len is 0 */
    size_t len;         /* bytes of json, at most EVENTLOG_MAX_JSON */
    int64_t created_ms; /* Unix time in milliseconds when appended */
};

/* Read callback: return 0 for the next event, > 0 to stop quietly, < 0 to stop and make
 * eventlog_read_since return that value. It must not use the same handle. */
typedef int (*eventlog_fn)(void *ctx, const struct eventlog_event *ev);

/* Opens or creates the log at path (creating its schema); *out is owned by the caller
 * and released with eventlog_close. CAIRN_EFORMAT when the file is not an SQLite
 * database, is corrupt, or holds something other than an event log; CAIRN_EUNSUPPORTED
 * for a schema newer than EVENTLOG_SCHEMA_VERSION; CAIRN_EIO when it cannot be opened. */
int eventlog_open(struct eventlog **out, const char *path, char *err, size_t errlen);

/* Closes the handle; accepts NULL. */
void eventlog_close(struct eventlog *log);

/* Appends one event. CAIRN_ESTATE, with the log unchanged, when the event does not
 * follow the last one: a term below the last term, an index other than last + 1 within
 * the last term, or a new term that does not start with a snapshot. CAIRN_EINVAL for a
 * bad kind, a term < 1, an index < 0 or NUL bytes in json; CAIRN_ERANGE for json
 * longer than EVENTLOG_MAX_JSON. */
int eventlog_append(struct eventlog *log, int64_t term, int64_t index, const char *kind,
                    const char *json, size_t len, char *err, size_t errlen);

/* Appends n events in one transaction, each checked as by eventlog_append against the
 * one before it: all are appended, or none (the message names the refused event). */
int eventlog_append_batch(struct eventlog *log, const struct eventlog_event *evs, size_t n,
                          char *err, size_t errlen);

/* Position of the last event; (0, 0) for an empty log. */
int eventlog_last(struct eventlog *log, int64_t *term, int64_t *index, char *err, size_t errlen);

/* Position of the latest snapshot; CAIRN_ENOTFOUND when the log is empty. */
int eventlog_last_snapshot(struct eventlog *log, int64_t *term, int64_t *index, char *err,
                           size_t errlen);

/* Number of events stored (after compaction, from the latest snapshot on). */
int eventlog_count(struct eventlog *log, int64_t *n, char *err, size_t errlen);

/* Calls fn for up to max events (0: no limit) strictly after (term, index), in order,
 * from one consistent view of the log. When (term, index) lies before the latest
 * snapshot (compacted away, or in a term that was superseded) the events start at that
 * snapshot instead and *reset (may be NULL) is set to 1: the reader must replace its
 * state with the snapshot. (0, 0) asks for everything, so it resets too unless the log
 * is empty. CAIRN_ERANGE when (term, index) lies after the last event: the reader has
 * seen a log this one does not hold. */
int eventlog_read_since(struct eventlog *log, int64_t term, int64_t index, eventlog_fn fn,
                        void *ctx, size_t max, int *reset, char *err, size_t errlen);

/* Deletes the events before the latest snapshot, keeping the snapshot, and returns
 * their number in *removed (may be NULL). Readers on other handles keep the view they
 * started with. */
int eventlog_compact(struct eventlog *log, int64_t *removed, char *err, size_t errlen);

#endif
