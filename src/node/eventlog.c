#include "node/eventlog.h"

#include "base/err.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* "cair" in the database header, so a stranger's SQLite file is recognised as such. */
#define EVENTLOG_APP_ID 1667328370 /* 0x63616972 */
#define STR_(x) #x
#define STR(x) STR_(x)
#define BUSY_TIMEOUT_MS 5000

enum stmt_id {
    ST_BEGIN_READ,
    ST_BEGIN_WRITE,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_LAST,
    ST_SNAPSHOT,
    ST_COUNT,
    ST_INSERT,
    ST_READ,
    ST_DELETE_BEFORE,
    ST_N
};

static const char *const stmt_sql[ST_N] = {
    [ST_BEGIN_READ] = "BEGIN DEFERRED",
    [ST_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_LAST] = "SELECT term, idx FROM events ORDER BY term DESC, idx DESC LIMIT 1",
    /* The literal matches the partial index events_snapshots, which serves this query. */
    [ST_SNAPSHOT] = "SELECT term, idx FROM events WHERE kind = 'StateSnapshot' "
                    "ORDER BY term DESC, idx DESC LIMIT 1",
    [ST_COUNT] = "SELECT count(*) FROM events",
    [ST_INSERT] = "INSERT INTO events(term, idx, kind, created_ms, body) VALUES(?1, ?2, ?3, ?4, ?5)",
    [ST_READ] = "SELECT term, idx, kind, created_ms, body FROM events "
                "WHERE (term, idx) > (?1, ?2) ORDER BY term, idx LIMIT ?3",
    [ST_DELETE_BEFORE] = "DELETE FROM events WHERE (term, idx) < (?1, ?2)",
};

static const char schema_sql[] =
    "CREATE TABLE eventlog_schema(version INTEGER NOT NULL) STRICT;"
    "INSERT INTO eventlog_schema(version) VALUES(1);"
    "CREATE TABLE events("
    " term INTEGER NOT NULL,"
    " idx INTEGER NOT NULL,"
    " kind TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " body TEXT NOT NULL,"
    " UNIQUE(term, idx)) STRICT;"
    "CREATE INDEX events_snapshots ON events(term, idx) WHERE kind = 'StateSnapshot';"
    "PRAGMA application_id = " STR(EVENTLOG_APP_ID) ";";

_Static_assert(EVENTLOG_SCHEMA_VERSION == 1, "version in schema_sql");

struct eventlog {
    sqlite3 *db;
    sqlite3_stmt *st[ST_N];
    int busy; /* inside a read callback: the handle refuses reentry */
    char path[];
};

static int code_of(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_NOMEM:
        return CAIRN_ENOMEM;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_FORMAT:
    case SQLITE_SCHEMA:
        return CAIRN_EFORMAT;
    case SQLITE_FULL:
        return CAIRN_EFULL;
    case SQLITE_TOOBIG:
        return CAIRN_ERANGE;
    default:
        return CAIRN_EIO;
    }
}

static int fail_db(sqlite3 *db, const char *path, int rc, const char *what, char *err, size_t errlen)
{
    int code = code_of(rc);
    return cairn_fail(err, errlen, code, "event log %s: %s: %s%s", path, what,
                      db ? sqlite3_errmsg(db) : sqlite3_errstr(rc),
                      code == CAIRN_EFORMAT ? " (not an event log, or corrupt)" : "");
}

static int fail_log(struct eventlog *log, int rc, const char *what, char *err, size_t errlen)
{
    return fail_db(log->db, log->path, rc, what, err, errlen);
}

/* Runs a statement that returns no rows (BEGIN, COMMIT, ...). */
static int run(struct eventlog *log, enum stmt_id id)
{
    sqlite3_stmt *s = log->st[id];
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void rollback(struct eventlog *log)
{
    if (!sqlite3_get_autocommit(log->db))
        run(log, ST_ROLLBACK);
}

/* Reads a (term, index) row from a one-row query; *found = 0 when it has none. */
static int query_pos(struct eventlog *log, enum stmt_id id, int *found, int64_t *term, int64_t *index)
{
    sqlite3_stmt *s = log->st[id];
    int rc = sqlite3_step(s);
    *found = 0;
    if (rc == SQLITE_ROW) {
        *found = 1;
        *term = sqlite3_column_int64(s, 0);
        *index = sqlite3_column_int64(s, 1);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_reset(s);
    return rc;
}

static int pos_cmp(int64_t t1, int64_t i1, int64_t t2, int64_t i2)
{
    if (t1 != t2)
        return t1 < t2 ? -1 : 1;
    return i1 < i2 ? -1 : i1 > i2;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- open / close ---- */

static int exec_db(sqlite3 *db, const char *path, const char *sql, const char *what, char *err, size_t errlen)
{
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : fail_db(db, path, rc, what, err, errlen);
}

/* Runs a query whose first row's first column is text, copied into buf ("" if none). */
static int query_text(sqlite3 *db, const char *path, const char *sql, char *buf, size_t buflen,
                      char *err, size_t errlen)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        buf[0] = 0;
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(s, 0);
            snprintf(buf, buflen, "%s", t ? (const char *)t : "");
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc == SQLITE_OK ? 0 : fail_db(db, path, rc, sql, err, errlen);
}

static int query_int(sqlite3 *db, const char *path, const char *sql, int64_t *v, int *rows,
                     char *err, size_t errlen)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    *rows = 0;
    *v = 0;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if ((*rows)++ == 0)
            *v = sqlite3_column_type(s, 0) == SQLITE_INTEGER ? sqlite3_column_int64(s, 0) : -1;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE || rc == SQLITE_OK ? 0 : fail_db(db, path, rc, sql, err, errlen);
}

/* Inside a write transaction: creates the schema in an empty database, or checks that
 * an existing one is an event log this code can read. */
static int check_schema(sqlite3 *db, const char *path, char *err, size_t errlen)
{
    int64_t v, app;
    int rows, e;
    if ((e = query_int(db, path, "PRAGMA application_id", &app, &rows, err, errlen)) < 0)
        return e;
    if ((e = query_int(db, path, "SELECT count(*) FROM sqlite_schema WHERE name = 'eventlog_schema'",
                       &v, &rows, err, errlen)) < 0)
        return e;
    if (v == 0) {
        if ((e = query_int(db, path, "SELECT count(*) FROM sqlite_schema", &v, &rows, err, errlen)) < 0)
            return e;
        if (v != 0 || (app != 0 && app != EVENTLOG_APP_ID))
            return cairn_fail(err, errlen, CAIRN_EFORMAT,
                              "event log %s: an SQLite database of something else (no eventlog_schema table)",
                              path);
        return exec_db(db, path, schema_sql, "creating the schema", err, errlen);
    }
    if (app != EVENTLOG_APP_ID)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "event log %s: application id %lld is not cairn's",
                          path, (long long)app);
    if ((e = query_int(db, path, "SELECT version FROM eventlog_schema", &v, &rows, err, errlen)) < 0)
        return e;
    if (rows != 1 || v < 1)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "event log %s: bad schema version table (%d rows, version %lld)",
                          path, rows, (long long)v);
    if (v > EVENTLOG_SCHEMA_VERSION)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED,
                          "event log %s: schema version %lld is newer than this cairn reads (%d); "
                          "written by a newer cairn?",
                          path, (long long)v, EVENTLOG_SCHEMA_VERSION);
    return 0;
}

int eventlog_open(struct eventlog **out, const char *path, char *err, size_t errlen)
{
    if (!out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "eventlog_open: out is NULL");
    *out = NULL;
    if (!path || !path[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "eventlog_open: empty path");
    size_t plen = strlen(path);
    struct eventlog *log = calloc(1, sizeof *log + plen + 1);
    if (!log)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "event log %s: out of memory", path);
    memcpy(log->path, path, plen + 1);

    /* SQLite takes a file shorter than one page for a new database and would write
     * over it; a real database is always whole pages long. */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size % 512 != 0) {
        free(log);
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "event log %s: %lld bytes is not a whole number of pages (truncated, or not a database)",
                          path, (long long)sb.st_size);
    }

    int e, rc = sqlite3_open_v2(path, &log->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        e = fail_log(log, rc, "cannot open", err, errlen);
        goto err;
    }
    sqlite3 *db = log->db;
    sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
    /* The file may come from anywhere: no schema tricks, triggers or views run. */
    sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_VIEW, 0, (int *)NULL);
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, (int)EVENTLOG_MAX_JSON + 1024);
    if ((e = exec_db(db, path, "PRAGMA cell_size_check = ON", "cell_size_check", err, errlen)) < 0)
        goto err;

    /* Reading the whole file first turns a corrupt or foreign file into a clear error
     * here rather than a surprise at some later read. */
    char buf[256];
    if ((e = query_text(db, path, "PRAGMA quick_check(1)", buf, sizeof buf, err, errlen)) < 0)
        goto err;
    if (strcmp(buf, "ok") != 0) {
        e = cairn_fail(err, errlen, CAIRN_EFORMAT, "event log %s: corrupt: %s", path, buf);
        goto err;
    }

    /* A new file only (the setting takes effect before the first table, outside a
     * transaction): pages freed by compaction go back to the file system. */
    int64_t pages;
    int rows;
    if ((e = query_int(db, path, "PRAGMA page_count", &pages, &rows, err, errlen)) < 0)
        goto err;
    if (pages == 0 && (e = exec_db(db, path, "PRAGMA auto_vacuum = INCREMENTAL", "auto_vacuum", err, errlen)) < 0)
        goto err;
    if ((e = exec_db(db, path, "BEGIN IMMEDIATE", "locking", err, errlen)) < 0)
        goto err;
    if ((e = check_schema(db, path, err, errlen)) < 0) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        goto err;
    }
    if ((e = exec_db(db, path, "COMMIT", "creating the schema", err, errlen)) < 0)
        goto err;

    if ((e = query_text(db, path, "PRAGMA journal_mode = WAL", buf, sizeof buf, err, errlen)) < 0)
        goto err;
    if (strcmp(buf, "wal") != 0) {
        e = cairn_fail(err, errlen, CAIRN_EIO, "event log %s: cannot use write-ahead logging (journal mode %s)",
                       path, buf);
        goto err;
    }
    if ((e = exec_db(db, path, "PRAGMA synchronous = NORMAL", "synchronous", err, errlen)) < 0)
        goto err;

    for (int i = 0; i < ST_N; i++) {
        rc = sqlite3_prepare_v3(db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &log->st[i], NULL);
        if (rc != SQLITE_OK) {
            e = fail_log(log, rc, "preparing statements", err, errlen);
            goto err;
        }
    }
    *out = log;
    return 0;
err:
    eventlog_close(log);
    return e;
}

void eventlog_close(struct eventlog *log)
{
    if (!log)
        return;
    for (int i = 0; i < ST_N; i++)
        sqlite3_finalize(log->st[i]);
    sqlite3_close(log->db);
    free(log);
}

/* ---- append ---- */

static int check_kind(const char *kind)
{
    if (!kind)
        return 0;
    size_t n = 0;
    for (; kind[n]; n++) {
        char c = kind[n];
        if (n >= EVENTLOG_MAX_KIND ||
            !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return n > 0;
}

/* Checks ev on its own and as the successor of (*lt, *li), which it then becomes. */
static int check_next(int64_t *lt, int64_t *li, const struct eventlog_event *ev, char *err, size_t errlen)
{
    long long t = ev->term, i = ev->index;
    if (!check_kind(ev->kind))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "event (%lld, %lld): kind must be 1 to %d of [A-Za-z0-9_]",
                          t, i, EVENTLOG_MAX_KIND);
    if (t < 1 || i < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "event (%lld, %lld) %s: term must be >= 1 and index >= 0", t,
                          i, ev->kind);
    if (ev->len > EVENTLOG_MAX_JSON)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "event (%lld, %lld) %s: %zu bytes of JSON, limit %zu", t, i,
                          ev->kind, ev->len, EVENTLOG_MAX_JSON);
    if (ev->len && (!ev->json || memchr(ev->json, 0, ev->len)))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "event (%lld, %lld) %s: JSON text is NULL or holds NUL bytes",
                          t, i, ev->kind);
    int snapshot = strcmp(ev->kind, EVENTLOG_SNAPSHOT_KIND) == 0;
    if (t < *lt)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "event (%lld, %lld) %s: stale term, the log is at (%lld, %lld)",
                          t, i, ev->kind, (long long)*lt, (long long)*li);
    if (t == *lt && (*li == INT64_MAX || i != *li + 1))
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "event (%lld, %lld) %s: index does not follow the last event (%lld, %lld)", t, i,
                          ev->kind, (long long)*lt, (long long)*li);
    if (t > *lt && !snapshot)
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "event (%lld, %lld) %s: term %lld must start with a " EVENTLOG_SNAPSHOT_KIND
                          " (the log is at (%lld, %lld))",
                          t, i, ev->kind, t, (long long)*lt, (long long)*li);
    *lt = t;
    *li = i;
    return 0;
}

int eventlog_append_batch(struct eventlog *log, const struct eventlog_event *evs, size_t n, char *err,
                          size_t errlen)
{
    if (!log || (n && !evs))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "eventlog_append_batch: NULL argument");
    if (log->busy)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "event log %s: append from inside a read callback", log->path);
    if (n == 0)
        return 0;
    int rc = run(log, ST_BEGIN_WRITE);
    if (rc != SQLITE_OK)
        return fail_log(log, rc, "locking for append", err, errlen);
    int64_t lt = 0, li = 0;
    int found, e = 0;
    if ((rc = query_pos(log, ST_LAST, &found, &lt, &li)) != SQLITE_OK) {
        e = fail_log(log, rc, "reading the last event", err, errlen);
        goto out;
    }
    int64_t created = now_ms();
    sqlite3_stmt *s = log->st[ST_INSERT];
    for (size_t k = 0; k < n; k++) {
        const struct eventlog_event *ev = &evs[k];
        if ((e = check_next(&lt, &li, ev, err, errlen)) < 0) {
            if (n > 1 && err && errlen) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", err);
                cairn_fail(err, errlen, e, "batch event %zu of %zu refused, none appended: %s", k, n, msg);
            }
            goto out;
        }
        sqlite3_bind_int64(s, 1, ev->term);
        sqlite3_bind_int64(s, 2, ev->index);
        sqlite3_bind_text(s, 3, ev->kind, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, created);
        rc = sqlite3_bind_text64(s, 5, ev->len ? ev->json : "", ev->len, SQLITE_STATIC, SQLITE_UTF8);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
        if (rc != SQLITE_DONE) {
            e = fail_log(log, rc, "appending", err, errlen);
            goto out;
        }
    }
    if ((rc = run(log, ST_COMMIT)) != SQLITE_OK)
        e = fail_log(log, rc, "committing", err, errlen);
out:
    if (e < 0)
        rollback(log);
    return e;
}

int eventlog_append(struct eventlog *log, int64_t term, int64_t index, const char *kind, const char *json,
                    size_t len, char *err, size_t errlen)
{
    struct eventlog_event ev = {.term = term, .index = index, .kind = kind, .json = json, .len = len};
    return eventlog_append_batch(log, &ev, 1, err, errlen);
}

/* ---- queries ---- */

static int enter(struct eventlog *log, const char *fn, char *err, size_t errlen)
{
    if (!log)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%s: NULL log", fn);
    if (log->busy)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "event log %s: %s from inside a read callback", log->path, fn);
    return 0;
}

int eventlog_last(struct eventlog *log, int64_t *term, int64_t *index, char *err, size_t errlen)
{
    int e, found;
    int64_t t = 0, i = 0;
    if ((e = enter(log, "eventlog_last", err, errlen)) < 0)
        return e;
    int rc = query_pos(log, ST_LAST, &found, &t, &i);
    if (rc != SQLITE_OK)
        return fail_log(log, rc, "reading the last event", err, errlen);
    if (term)
        *term = t;
    if (index)
        *index = i;
    return 0;
}

int eventlog_last_snapshot(struct eventlog *log, int64_t *term, int64_t *index, char *err, size_t errlen)
{
    int e, found;
    int64_t t = 0, i = 0;
    if ((e = enter(log, "eventlog_last_snapshot", err, errlen)) < 0)
        return e;
    int rc = query_pos(log, ST_SNAPSHOT, &found, &t, &i);
    if (rc != SQLITE_OK)
        return fail_log(log, rc, "finding the latest snapshot", err, errlen);
    if (!found)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "event log %s: no snapshot (empty log)", log->path);
    if (term)
        *term = t;
    if (index)
        *index = i;
    return 0;
}

int eventlog_count(struct eventlog *log, int64_t *n, char *err, size_t errlen)
{
    int e;
    if ((e = enter(log, "eventlog_count", err, errlen)) < 0)
        return e;
    sqlite3_stmt *s = log->st[ST_COUNT];
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && n)
        *n = sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : fail_log(log, rc, "counting events", err, errlen);
}

/* Inside the read transaction of eventlog_read_since. */
static int read_rows(struct eventlog *log, int64_t term, int64_t index, eventlog_fn fn, void *ctx, size_t max,
                     int *reset, char *err, size_t errlen)
{
    int64_t lt, li, st, si;
    int found, rc;
    if ((rc = query_pos(log, ST_LAST, &found, &lt, &li)) != SQLITE_OK)
        return fail_log(log, rc, "reading the last event", err, errlen);
    if (!found) {
        if (term == 0 && index == 0)
            return 0;
        return cairn_fail(err, errlen, CAIRN_ERANGE, "event log %s: (%lld, %lld) asked for, the log is empty",
                          log->path, (long long)term, (long long)index);
    }
    if (pos_cmp(term, index, lt, li) > 0)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "event log %s: (%lld, %lld) asked for, the log ends at (%lld, %lld)",
                          log->path, (long long)term, (long long)index, (long long)lt, (long long)li);
    if ((rc = query_pos(log, ST_SNAPSHOT, &found, &st, &si)) != SQLITE_OK)
        return fail_log(log, rc, "finding the latest snapshot", err, errlen);
    if (!found)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "event log %s: events but no snapshot", log->path);
    if (pos_cmp(term, index, st, si) < 0) {
        *reset = 1;
        term = st;
        index = si - 1; /* si >= 0, and the read is strictly after */
    }

    sqlite3_stmt *s = log->st[ST_READ];
    sqlite3_bind_int64(s, 1, term);
    sqlite3_bind_int64(s, 2, index);
    sqlite3_bind_int64(s, 3, max == 0 || max > INT64_MAX ? -1 : (int64_t)max);
    int e = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct eventlog_event ev = {
            .term = sqlite3_column_int64(s, 0),
            .index = sqlite3_column_int64(s, 1),
            .kind = (const char *)sqlite3_column_text(s, 2),
            .created_ms = sqlite3_column_int64(s, 3),
            .json = (const char *)sqlite3_column_text(s, 4),
        };
        ev.len = (size_t)sqlite3_column_bytes(s, 4);
        if (!ev.kind || !ev.json) {
            rc = sqlite3_errcode(log->db);
            if (rc == SQLITE_NOMEM)
                e = fail_log(log, rc, "reading", err, errlen);
            else
                e = cairn_fail(err, errlen, CAIRN_EFORMAT, "event log %s: event (%lld, %lld) has a NULL field",
                               log->path, (long long)ev.term, (long long)ev.index);
            break;
        }
        log->busy = 1;
        int r = fn(ctx, &ev);
        log->busy = 0;
        if (r != 0) {
            e = r < 0 ? r : 0;
            rc = SQLITE_DONE;
            break;
        }
    }
    if (e == 0 && rc != SQLITE_DONE)
        e = fail_log(log, rc, "reading events", err, errlen);
    sqlite3_reset(s);
    return e;
}

int eventlog_read_since(struct eventlog *log, int64_t term, int64_t index, eventlog_fn fn, void *ctx, size_t max,
                        int *reset, char *err, size_t errlen)
{
    int dummy, e;
    if (!reset)
        reset = &dummy;
    *reset = 0;
    if ((e = enter(log, "eventlog_read_since", err, errlen)) < 0)
        return e;
    if (!fn || term < 0 || index < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "eventlog_read_since: NULL callback or negative position");
    /* One read transaction: the snapshot found and the rows read come from one view. */
    int rc = run(log, ST_BEGIN_READ);
    if (rc != SQLITE_OK)
        return fail_log(log, rc, "beginning a read", err, errlen);
    e = read_rows(log, term, index, fn, ctx, max, reset, err, errlen);
    rollback(log); /* nothing was written: ending the read this way cannot fail */
    return e;
}

/* ---- compaction ---- */

int eventlog_compact(struct eventlog *log, int64_t *removed, char *err, size_t errlen)
{
    int e, found;
    if (removed)
        *removed = 0;
    if ((e = enter(log, "eventlog_compact", err, errlen)) < 0)
        return e;
    int rc = run(log, ST_BEGIN_WRITE);
    if (rc != SQLITE_OK)
        return fail_log(log, rc, "locking for compaction", err, errlen);
    int64_t st, si;
    if ((rc = query_pos(log, ST_SNAPSHOT, &found, &st, &si)) != SQLITE_OK) {
        e = fail_log(log, rc, "finding the latest snapshot", err, errlen);
        goto out;
    }
    if (found) {
        sqlite3_stmt *s = log->st[ST_DELETE_BEFORE];
        sqlite3_bind_int64(s, 1, st);
        sqlite3_bind_int64(s, 2, si);
        rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE) {
            e = fail_log(log, rc, "deleting old events", err, errlen);
            goto out;
        }
        if (removed)
            *removed = sqlite3_changes64(log->db);
        /* Give the freed pages back to the file system (auto_vacuum is incremental). */
        rc = sqlite3_exec(log->db, "PRAGMA incremental_vacuum", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            e = fail_log(log, rc, "vacuuming", err, errlen);
            goto out;
        }
    }
    if ((rc = run(log, ST_COMMIT)) != SQLITE_OK)
        e = fail_log(log, rc, "committing compaction", err, errlen);
out:
    if (e < 0)
        rollback(log);
    return e;
}
