#include "node/eventlog.h"
#include "base/clock.h"
#include "base/err.h"
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SNAP EVENTLOG_SNAPSHOT_KIND

static char dir[64];
static char err[512];

/* A fresh path in the test's temporary folder. */
static const char *tmp_path(const char *name)
{
    static char buf[8][400];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static void remove_db(const char *path)
{
    char p[512];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

static void remove_dir(void)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlink(tmp_path(de->d_name));
    }
    closedir(d);
    rmdir(dir);
}

/* The JSON text of event (t, i) in these tests. */
static size_t mkjson(char *buf, size_t n, int64_t t, int64_t i, const char *kind)
{
    return (size_t)snprintf(buf, n, "{\"kind\":\"%s\",\"term\":%lld,\"index\":%lld,\"note\":\"caf\\u00e9 \xe2\x9c\x93\"}",
                            kind, (long long)t, (long long)i);
}

static int add(struct eventlog *log, int64_t t, int64_t i, const char *kind)
{
    char j[256];
    size_t n = mkjson(j, sizeof j, t, i, kind);
    err[0] = 0;
    return eventlog_append(log, t, i, kind, j, n, err, sizeof err);
}

/* Collects what a read delivers, checking each event's JSON against mkjson. */
struct got {
    int n;
    int64_t term[4096], index[4096];
    char kind[4096][EVENTLOG_MAX_KIND + 1];
    int bad_json;
    int stop_after; /* return 1 after this many, when > 0 */
    int fail_after; /* return CAIRN_EIO after this many, when > 0 */
    int64_t min_ms, max_ms;
};

static int collect(void *ctx, const struct eventlog_event *ev)
{
    struct got *g = ctx;
    if (g->n < 4096) {
        g->term[g->n] = ev->term;
        g->index[g->n] = ev->index;
        snprintf(g->kind[g->n], sizeof g->kind[0], "%s", ev->kind);
    }
    char j[256];
    size_t n = mkjson(j, sizeof j, ev->term, ev->index, ev->kind);
    if (n != ev->len || memcmp(j, ev->json, n) != 0 || ev->json[ev->len] != 0)
        g->bad_json++;
    if (g->n == 0 || ev->created_ms < g->min_ms)
        g->min_ms = ev->created_ms;
    if (g->n == 0 || ev->created_ms > g->max_ms)
        g->max_ms = ev->created_ms;
    g->n++;
    if (g->stop_after && g->n >= g->stop_after)
        return 1;
    if (g->fail_after && g->n >= g->fail_after)
        return CAIRN_EIO;
    return 0;
}

static int read_all(struct eventlog *log, int64_t t, int64_t i, size_t max, struct got *g, int *reset)
{
    memset(g, 0, sizeof *g);
    err[0] = 0;
    return eventlog_read_since(log, t, i, collect, g, max, reset, err, sizeof err);
}

/* Checks that g holds exactly the events of (term, first..last), in order. */
static void check_seq(const struct got *g, int64_t term, int64_t first, int64_t last, const char *what)
{
    CHECK(g->n == last - first + 1, "%s: %d events, expected %lld", what, g->n, (long long)(last - first + 1));
    int bad = 0;
    for (int k = 0; k < g->n && k < 4096; k++)
        bad += g->term[k] != term || g->index[k] != first + k;
    CHECK(bad == 0, "%s: %d events out of place (first is (%lld, %lld))", what, bad,
          g->n ? (long long)g->term[0] : -1LL, g->n ? (long long)g->index[0] : -1LL);
    CHECK(g->bad_json == 0, "%s: %d events with other JSON than appended", what, g->bad_json);
}

static int64_t count_of(struct eventlog *log)
{
    int64_t n = -1;
    CHECK_EQ_INT(eventlog_count(log, &n, err, sizeof err), 0);
    return n;
}

static void check_last(struct eventlog *log, int64_t t, int64_t i, const char *what)
{
    int64_t lt = -1, li = -1;
    int rc = eventlog_last(log, &lt, &li, err, sizeof err);
    CHECK(rc == 0 && lt == t && li == i, "%s: last (%lld, %lld) rc %d, expected (%lld, %lld)", what, (long long)lt,
          (long long)li, rc, (long long)t, (long long)i);
}

static void test_round_trip(void)
{
    const char *path = tmp_path("rt.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open %s: %d %s", path, rc, err);
    if (rc)
        return;
    struct got g;
    int reset = -1;
    check_last(log, 0, 0, "empty");
    CHECK_EQ_INT(read_all(log, 0, 0, 0, &g, &reset), 0);
    CHECK(g.n == 0 && reset == 0, "empty log read: %d events, reset %d", g.n, reset);
    CHECK_EQ_INT(read_all(log, 1, 0, 0, &g, &reset), CAIRN_ERANGE);
    CHECK_EQ_INT(eventlog_last_snapshot(log, NULL, NULL, err, sizeof err), CAIRN_ENOTFOUND);

    int64_t before = (int64_t)time(NULL) * 1000 - 1000;
    CHECK(add(log, 1, 0, SNAP) == 0, "snapshot: %s", err);
    for (int i = 1; i < 10; i++)
        CHECK(add(log, 1, i, i % 2 ? "InstanceCreated" : "TaskStatusUpdated") == 0, "append %d: %s", i, err);
    int64_t after = (int64_t)time(NULL) * 1000 + 1000;
    check_last(log, 1, 9, "after 10");
    CHECK_EQ_INT(count_of(log), 10);

    CHECK_EQ_INT(read_all(log, 0, 0, 0, &g, &reset), 0);
    check_seq(&g, 1, 0, 9, "read from (0,0)");
    CHECK(reset == 1, "read from nothing must start from the snapshot: reset %d", reset);
    CHECK(strcmp(g.kind[0], SNAP) == 0 && strcmp(g.kind[1], "InstanceCreated") == 0 &&
              strcmp(g.kind[2], "TaskStatusUpdated") == 0,
          "kinds %s %s %s", g.kind[0], g.kind[1], g.kind[2]);
    CHECK(g.min_ms >= before && g.max_ms <= after, "created_ms %lld..%lld outside %lld..%lld", (long long)g.min_ms,
          (long long)g.max_ms, (long long)before, (long long)after);

    CHECK_EQ_INT(read_all(log, 1, 4, 0, &g, &reset), 0);
    check_seq(&g, 1, 5, 9, "read since (1,4)");
    CHECK(reset == 0, "continuation flagged reset");
    CHECK_EQ_INT(read_all(log, 1, 0, 3, &g, &reset), 0);
    check_seq(&g, 1, 1, 3, "read since (1,0) max 3");
    CHECK_EQ_INT(read_all(log, 1, 9, 0, &g, &reset), 0);
    CHECK(g.n == 0 && reset == 0, "read since the last: %d events reset %d", g.n, reset);
    CHECK_EQ_INT(read_all(log, 1, 10, 0, &g, &reset), CAIRN_ERANGE);
    CHECK(strstr(err, "(1, 9)") != NULL, "ERANGE message names the log's end: %s", err);
    CHECK_EQ_INT(read_all(log, 2, 0, 0, &g, &reset), CAIRN_ERANGE);
    CHECK_EQ_INT(read_all(log, -1, 0, 0, &g, &reset), CAIRN_EINVAL);

    /* The callback stops the read quietly (> 0) or with its error (< 0). */
    memset(&g, 0, sizeof g);
    g.stop_after = 2;
    CHECK_EQ_INT(eventlog_read_since(log, 1, 0, collect, &g, 0, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(g.n, 2);
    memset(&g, 0, sizeof g);
    g.fail_after = 3;
    CHECK_EQ_INT(eventlog_read_since(log, 1, 0, collect, &g, 0, NULL, err, sizeof err), CAIRN_EIO);
    CHECK_EQ_INT(g.n, 3);

    /* Empty JSON is stored as empty text. */
    CHECK(eventlog_append(log, 1, 10, "Marker", NULL, 0, err, sizeof err) == 0, "empty json: %s", err);
    check_last(log, 1, 10, "after empty json");
    eventlog_close(log);
    eventlog_close(NULL);
    remove_db(path);
}

static void check_refused(struct eventlog *log, int rc, int want, int64_t t, int64_t i, int64_t n, const char *what)
{
    CHECK(rc == want, "%s: rc %d (%s), expected %d", what, rc, err, want);
    CHECK(err[0] != 0, "%s: refused without a message", what);
    check_last(log, t, i, what);
    CHECK(count_of(log) == n, "%s: the log changed size", what);
}

struct reenter {
    struct eventlog *log;
    int rc_append, rc_last, rc_compact;
};

static int reenter_cb(void *ctx, const struct eventlog_event *ev)
{
    struct reenter *re = ctx;
    char e[128];
    int64_t t, i;
    re->rc_append = eventlog_append(re->log, ev->term, ev->index + 100, "X", "{}", 2, e, sizeof e);
    re->rc_last = eventlog_last(re->log, &t, &i, e, sizeof e);
    re->rc_compact = eventlog_compact(re->log, NULL, e, sizeof e);
    return 0;
}

static void test_ordering(void)
{
    const char *path = tmp_path("order.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    check_refused(log, add(log, 1, 0, "InstanceCreated"), CAIRN_ESTATE, 0, 0, 0, "first event not a snapshot");
    CHECK(strstr(err, SNAP) != NULL, "message names the snapshot: %s", err);
    check_refused(log, add(log, 0, 0, SNAP), CAIRN_EINVAL, 0, 0, 0, "term 0");
    check_refused(log, add(log, 1, -1, SNAP), CAIRN_EINVAL, 0, 0, 0, "negative index");
    CHECK(add(log, 3, 100, SNAP) == 0, "first snapshot at (3, 100): %s", err);
    for (int i = 101; i <= 105; i++)
        CHECK(add(log, 3, i, "RunnerStatusUpdated") == 0, "append: %s", err);
    check_refused(log, add(log, 3, 107, "RunnerStatusUpdated"), CAIRN_ESTATE, 3, 105, 6, "gap");
    CHECK(strstr(err, "(3, 107)") && strstr(err, "(3, 105)"), "gap message names both positions: %s", err);
    check_refused(log, add(log, 3, 105, "RunnerStatusUpdated"), CAIRN_ESTATE, 3, 105, 6, "repeat");
    check_refused(log, add(log, 3, 104, "RunnerStatusUpdated"), CAIRN_ESTATE, 3, 105, 6, "going back");
    check_refused(log, add(log, 2, 106, SNAP), CAIRN_ESTATE, 3, 105, 6, "stale term");
    CHECK(strstr(err, "stale term") != NULL, "message: %s", err);
    check_refused(log, add(log, 4, 0, "InstanceCreated"), CAIRN_ESTATE, 3, 105, 6, "new term without a snapshot");
    check_refused(log, add(log, 3, 106, ""), CAIRN_EINVAL, 3, 105, 6, "empty kind");
    check_refused(log, add(log, 3, 106, "Has Space"), CAIRN_EINVAL, 3, 105, 6, "kind with a space");
    char longkind[EVENTLOG_MAX_KIND + 2];
    memset(longkind, 'K', sizeof longkind - 1);
    longkind[sizeof longkind - 1] = 0;
    check_refused(log, add(log, 3, 106, longkind), CAIRN_EINVAL, 3, 105, 6, "kind too long");
    longkind[EVENTLOG_MAX_KIND] = 0;
    CHECK(add(log, 3, 106, longkind) == 0, "kind of the longest length: %s", err);
    check_refused(log, eventlog_append(log, 3, 107, "X", "{\"a\":\0}", 7, err, sizeof err), CAIRN_EINVAL, 3, 106,
                  7, "NUL in JSON");
    check_refused(log, eventlog_append(log, 3, 107, "X", NULL, 3, err, sizeof err), CAIRN_EINVAL, 3, 106, 7,
                  "NULL JSON with a length");

    /* A batch with one bad event appends nothing and names the event. */
    struct eventlog_event evs[5];
    char js[5][256];
    const char *kinds[5] = {"A", "B", SNAP, "C", "D"};
    int64_t pos[5][2] = {{3, 107}, {3, 108}, {5, 0}, {5, 1}, {5, 3}};
    for (int k = 0; k < 5; k++) {
        size_t n = mkjson(js[k], sizeof js[k], pos[k][0], pos[k][1], kinds[k]);
        evs[k] = (struct eventlog_event){.term = pos[k][0], .index = pos[k][1], .kind = kinds[k], .json = js[k], .len = n};
    }
    err[0] = 0;
    check_refused(log, eventlog_append_batch(log, evs, 5, err, sizeof err), CAIRN_ESTATE, 3, 106, 7, "bad batch");
    CHECK(strstr(err, "event 4 of 5") != NULL, "batch message names the event: %s", err);
    evs[4].index = 2;
    err[0] = 0;
    CHECK(eventlog_append_batch(log, evs, 5, err, sizeof err) == 0, "good batch: %s", err);
    check_last(log, 5, 2, "after the batch");
    CHECK_EQ_INT(eventlog_append_batch(log, evs, 0, err, sizeof err), 0);
    CHECK_EQ_INT(eventlog_append_batch(NULL, evs, 1, err, sizeof err), CAIRN_EINVAL);

    /* Reentry from a read callback is refused. */
    struct reenter re = {log, 1, 1, 1};
    CHECK_EQ_INT(eventlog_read_since(log, 5, 0, reenter_cb, &re, 1, NULL, err, sizeof err), 0);
    CHECK(re.rc_append == CAIRN_ESTATE && re.rc_last == CAIRN_ESTATE && re.rc_compact == CAIRN_ESTATE,
          "reentry from a callback: append %d last %d compact %d", re.rc_append, re.rc_last, re.rc_compact);
    check_last(log, 5, 2, "after reentry");
    eventlog_close(log);
    remove_db(path);
}

/* Terms 1 and 2 with a snapshot in the middle of term 2, then compaction. */
static void test_terms_and_compaction(void)
{
    const char *path = tmp_path("terms.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    CHECK(add(log, 1, 0, SNAP) == 0, "%s", err);
    for (int i = 1; i <= 20; i++)
        CHECK(add(log, 1, i, "NodeGatheredInfo") == 0, "%s", err);
    /* Term 2 numbers on from term 1; term 4 restarts at 0: both are allowed. */
    CHECK(add(log, 2, 21, SNAP) == 0, "%s", err);
    for (int i = 22; i <= 30; i++)
        CHECK(add(log, 2, i, "TaskCreated") == 0, "%s", err);
    struct got g;
    int reset;
    /* (1, 15) lies in a superseded term: the read starts at (2, 21). */
    CHECK_EQ_INT(read_all(log, 1, 15, 0, &g, &reset), 0);
    check_seq(&g, 2, 21, 30, "read since a superseded position");
    CHECK(reset == 1 && strcmp(g.kind[0], SNAP) == 0, "reset %d, first kind %s", reset, g.kind[0]);
    /* (1, 25) was never written in term 1 (another master's?): also a reset. */
    CHECK_EQ_INT(read_all(log, 1, 25, 0, &g, &reset), 0);
    CHECK(reset == 1 && g.n == 10 && g.term[0] == 2 && g.index[0] == 21, "reset %d n %d", reset, g.n);
    CHECK_EQ_INT(read_all(log, 2, 21, 0, &g, &reset), 0);
    check_seq(&g, 2, 22, 30, "read since the snapshot itself");
    CHECK_EQ_INT(reset, 0);

    /* A snapshot within term 2. */
    CHECK(add(log, 2, 31, SNAP) == 0, "mid-term snapshot: %s", err);
    for (int i = 32; i <= 35; i++)
        CHECK(add(log, 2, i, "TaskStatusUpdated") == 0, "%s", err);
    int64_t st = 0, si = 0;
    CHECK(eventlog_last_snapshot(log, &st, &si, err, sizeof err) == 0 && st == 2 && si == 31, "snapshot (%lld, %lld)",
          (long long)st, (long long)si);
    CHECK_EQ_INT(read_all(log, 2, 25, 0, &g, &reset), 0);
    check_seq(&g, 2, 31, 35, "read since before the mid-term snapshot");
    CHECK_EQ_INT(reset, 1);
    CHECK_EQ_INT(read_all(log, 2, 33, 0, &g, &reset), 0);
    check_seq(&g, 2, 34, 35, "read after the mid-term snapshot");
    CHECK_EQ_INT(reset, 0);

    /* Compaction keeps the latest snapshot and what follows; reads see the same. */
    struct got before;
    CHECK_EQ_INT(read_all(log, 0, 0, 0, &before, &reset), 0);
    int64_t removed = -1;
    CHECK_EQ_INT(count_of(log), 36);
    CHECK(eventlog_compact(log, &removed, err, sizeof err) == 0, "compact: %s", err);
    CHECK_EQ_INT(removed, 31);
    CHECK_EQ_INT(count_of(log), 5);
    check_last(log, 2, 35, "after compaction");
    CHECK_EQ_INT(read_all(log, 0, 0, 0, &g, &reset), 0);
    CHECK(g.n == before.n && memcmp(g.index, before.index, sizeof g.index[0] * (size_t)g.n) == 0 && reset == 1,
          "read from nothing differs after compaction (%d vs %d events)", g.n, before.n);
    CHECK_EQ_INT(read_all(log, 1, 3, 0, &g, &reset), 0);
    check_seq(&g, 2, 31, 35, "read since a compacted position");
    CHECK_EQ_INT(reset, 1);
    CHECK(eventlog_compact(log, &removed, err, sizeof err) == 0 && removed == 0, "second compaction removed %lld",
          (long long)removed);

    /* A new term after compaction; the old one is then superseded. */
    CHECK(add(log, 4, 0, SNAP) == 0, "%s", err);
    CHECK(add(log, 4, 1, "InstanceDeleted") == 0, "%s", err);
    CHECK_EQ_INT(read_all(log, 2, 35, 0, &g, &reset), 0);
    check_seq(&g, 4, 0, 1, "read since the end of a finished term");
    CHECK_EQ_INT(reset, 1);
    CHECK_EQ_INT(read_all(log, 3, 7, 0, &g, &reset), 0);
    CHECK(reset == 1 && g.n == 2, "a term this log never had: reset %d n %d", reset, g.n);
    CHECK_EQ_INT(read_all(log, 4, 2, 0, &g, &reset), CAIRN_ERANGE);
    CHECK_EQ_INT(read_all(log, 5, 0, 0, &g, &reset), CAIRN_ERANGE);
    CHECK(eventlog_compact(log, &removed, err, sizeof err) == 0 && removed == 5, "compaction removed %lld",
          (long long)removed);
    eventlog_close(log);

    /* Durability: a reopened file holds the same events and accepts the next one. */
    rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "reopen: %s", err);
    if (rc)
        return;
    check_last(log, 4, 1, "reopened");
    CHECK_EQ_INT(read_all(log, 0, 0, 0, &g, &reset), 0);
    check_seq(&g, 4, 0, 1, "reopened");
    CHECK(add(log, 4, 2, "TaskDeleted") == 0, "append after reopen: %s", err);
    CHECK(add(log, 4, 4, "TaskDeleted") == CAIRN_ESTATE, "gap after reopen accepted");
    eventlog_close(log);
    remove_db(path);
}

/* Many events survive close/open; compaction shrinks the file. */
static void test_durability(void)
{
    const char *path = tmp_path("durable.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    CHECK(add(log, 7, 0, SNAP) == 0, "%s", err);
    struct eventlog_event evs[100];
    char js[100][256];
    int64_t next = 1;
    for (int b = 0; b < 30; b++) {
        for (int k = 0; k < 100; k++, next++) {
            size_t n = mkjson(js[k], sizeof js[k], 7, next, "NodeDownloadProgress");
            evs[k] = (struct eventlog_event){.term = 7, .index = next, .kind = "NodeDownloadProgress", .json = js[k],
                                             .len = n};
        }
        rc = eventlog_append_batch(log, evs, 100, err, sizeof err);
        CHECK(rc == 0, "batch %d: %s", b, err);
    }
    eventlog_close(log);
    rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "reopen: %s", err);
    if (rc)
        return;
    check_last(log, 7, 3000, "reopened");
    struct got *g = malloc(sizeof *g);
    int reset;
    CHECK_EQ_INT(read_all(log, 7, 0, 0, g, &reset), 0);
    check_seq(g, 7, 1, 3000, "reopened");
    free(g);

    struct stat sb0, sb1;
    stat(path, &sb0);
    CHECK(add(log, 7, 3001, SNAP) == 0, "%s", err);
    int64_t removed;
    CHECK(eventlog_compact(log, &removed, err, sizeof err) == 0 && removed == 3001, "removed %lld: %s",
          (long long)removed, err);
    eventlog_close(log); /* the last close checkpoints the WAL into the file */
    stat(path, &sb1);
    CHECK(sb1.st_size < sb0.st_size / 4, "compaction left the file at %lld bytes (was %lld)", (long long)sb1.st_size,
          (long long)sb0.st_size);
    remove_db(path);
}

/* Two handles on one file: the reader sees the writer's events; a reader in the middle
 * of a read keeps its view while the writer appends and compacts. */
struct mid_read {
    struct eventlog *writer;
    int n, seen_compact_rc, bad;
};

static int mid_cb(void *ctx, const struct eventlog_event *ev)
{
    struct mid_read *m = ctx;
    char e[256];
    if (ev->index != m->n)
        m->bad++;
    if (m->n == 2) {
        char j[256];
        size_t n = mkjson(j, sizeof j, 2, 50, SNAP);
        int rc = eventlog_append(m->writer, 2, 50, SNAP, j, n, e, sizeof e);
        if (rc == 0)
            rc = eventlog_compact(m->writer, NULL, e, sizeof e);
        m->seen_compact_rc = rc;
        if (rc)
            fprintf(stderr, "writer during a read: %s\n", e);
    }
    m->n++;
    return 0;
}

struct race {
    const char *path;
    _Atomic int done;
    _Atomic int64_t last_term, last_index;
    int errors;
    char msg[600];
};

static void *writer_main(void *arg)
{
    struct race *r = arg;
    struct eventlog *log;
    char e[400];
    uint64_t seed = 42;
    if (eventlog_open(&log, r->path, e, sizeof e) != 0) {
        snprintf(r->msg, sizeof r->msg, "writer open: %s", e);
        r->errors++;
        atomic_store(&r->done, 1);
        return NULL;
    }
    struct eventlog_event evs[40];
    char js[40][256];
    for (int64_t term = 1; term <= 4 && !r->errors; term++) {
        int64_t idx = 0;
        for (int round = 0; round < 25 && !r->errors; round++) {
            int n = 1 + (int)(test_rand_u64(&seed) % 40);
            for (int k = 0; k < n; k++, idx++) {
                const char *kind = idx == 0 || test_rand_u64(&seed) % 97 == 0 ? SNAP : "RunnerStatusUpdated";
                size_t len = mkjson(js[k], sizeof js[k], term, idx, kind);
                evs[k] = (struct eventlog_event){.term = term, .index = idx, .kind = kind, .json = js[k], .len = len};
            }
            if (eventlog_append_batch(log, evs, (size_t)n, e, sizeof e) != 0 ||
                (round % 5 == 4 && eventlog_compact(log, NULL, e, sizeof e) != 0)) {
                snprintf(r->msg, sizeof r->msg, "writer: %s", e);
                r->errors++;
            }
            atomic_store(&r->last_term, term);
            atomic_store(&r->last_index, idx - 1);
        }
    }
    eventlog_close(log);
    atomic_store(&r->done, 1);
    return NULL;
}

/* A follower applying what it reads: a continuation must follow its position, a reset
 * must start with a snapshot; either way indices are consecutive within one term. */
struct follower {
    int64_t term, index;
    int reset, first, bad, events, resets;
    char msg[256];
};

static int follow_cb(void *ctx, const struct eventlog_event *ev)
{
    struct follower *f = ctx;
    int ok;
    if (f->first && f->reset) {
        ok = strcmp(ev->kind, SNAP) == 0;
        f->resets++;
    } else {
        ok = ev->term == f->term && ev->index == f->index + 1;
    }
    if (!ok && !f->bad)
        snprintf(f->msg, sizeof f->msg, "(%lld, %lld) %s after (%lld, %lld) reset %d", (long long)ev->term,
                 (long long)ev->index, ev->kind, (long long)f->term, (long long)f->index, f->reset);
    f->bad += !ok;
    f->term = ev->term;
    f->index = ev->index;
    f->first = 0;
    f->events++;
    return 0;
}

static void test_two_handles(void)
{
    const char *path = tmp_path("two.db");
    struct eventlog *w, *r;
    int rc = eventlog_open(&w, path, err, sizeof err);
    CHECK(rc == 0, "writer open: %s", err);
    if (rc)
        return;
    rc = eventlog_open(&r, path, err, sizeof err);
    CHECK(rc == 0, "reader open: %s", err);
    if (rc) {
        eventlog_close(w);
        return;
    }
    CHECK(add(w, 1, 0, SNAP) == 0, "%s", err);
    for (int i = 1; i < 10; i++)
        CHECK(add(w, 1, i, "TaskAcknowledged") == 0, "%s", err);
    struct got g;
    int reset;
    CHECK_EQ_INT(read_all(r, 1, 5, 0, &g, &reset), 0);
    check_seq(&g, 1, 6, 9, "reader sees the writer's events");
    check_last(r, 1, 9, "reader's last");

    struct mid_read m = {.writer = w};
    CHECK_EQ_INT(eventlog_read_since(r, 0, 0, mid_cb, &m, 0, &reset, err, sizeof err), 0);
    CHECK(m.seen_compact_rc == 0 && m.n == 10 && m.bad == 0,
          "reader during append+compact: rc %d, %d events, %d out of place", m.seen_compact_rc, m.n, m.bad);
    CHECK_EQ_INT(read_all(r, 0, 0, 0, &g, &reset), 0);
    check_seq(&g, 2, 50, 50, "reader after the compaction");
    eventlog_close(w);
    eventlog_close(r);
    remove_db(path);

    /* A writer thread appends, snapshots and compacts while this thread follows. */
    struct race race = {.path = tmp_path("race.db")};
    rc = eventlog_open(&r, race.path, err, sizeof err); /* create the schema before the race */
    CHECK(rc == 0, "race open: %s", err);
    if (rc)
        return;
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &race);
    struct follower f = {0};
    int reads = 0, read_errors = 0;
    for (;;) {
        int done = atomic_load(&race.done);
        f.reset = 0;
        f.first = 1;
        rc = eventlog_read_since(r, f.term, f.index, follow_cb, &f, 64, &f.reset, err, sizeof err);
        reads++;
        if (rc != 0 && read_errors++ == 0)
            fprintf(stderr, "follower read: %s\n", err);
        if (done && f.term == atomic_load(&race.last_term) && f.index == atomic_load(&race.last_index))
            break;
        if (done && rc != 0)
            break;
    }
    pthread_join(th, NULL);
    CHECK(race.errors == 0, "%s", race.msg);
    CHECK(read_errors == 0 && f.bad == 0, "follower: %d read errors, %d events out of order: %s", read_errors, f.bad,
          f.msg);
    CHECK(f.term == 4 && f.index == atomic_load(&race.last_index), "follower ended at (%lld, %lld)",
          (long long)f.term, (long long)f.index);
    printf("follower: %d reads, %d events, %d resets\n", reads, f.events, f.resets);
    eventlog_close(r);
    remove_db(race.path);
}

struct huge_check {
    const char *want;
    size_t n;
    int seen, same;
};

static int huge_cb(void *ctx, const struct eventlog_event *ev)
{
    struct huge_check *hc = ctx;
    hc->seen++;
    hc->same = ev->len == hc->n && memcmp(ev->json, hc->want, hc->n) == 0 && ev->json[ev->len] == 0 &&
               strcmp(ev->kind, SNAP) == 0;
    return 0;
}

static void test_huge(void)
{
    const char *path = tmp_path("huge.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    size_t n = (size_t)1 << 20;
    char *big = malloc(n);
    uint64_t seed = 7;
    big[0] = '"';
    for (size_t k = 1; k + 1 < n; k++)
        big[k] = (char)(' ' + 1 + test_rand_u64(&seed) % 90); /* printable, no quote or backslash issues */
    for (size_t k = 1; k + 1 < n; k++)
        if (big[k] == '"' || big[k] == '\\')
            big[k] = 'x';
    big[n - 1] = '"';
    CHECK(eventlog_append(log, 1, 0, SNAP, big, n, err, sizeof err) == 0, "1 MiB snapshot: %s", err);
    CHECK(add(log, 1, 1, "TaskCreated") == 0, "%s", err);
    for (int pass = 0; pass < 2; pass++) {
        struct huge_check hc = {big, n, 0, 0};
        int reset;
        CHECK_EQ_INT(eventlog_read_since(log, 0, 0, huge_cb, &hc, 1, &reset, err, sizeof err), 0);
        CHECK(hc.seen == 1 && hc.same == 1, "pass %d: 1 MiB JSON round trip: seen %d same %d", pass, hc.seen, hc.same);
        eventlog_close(log);
        rc = eventlog_open(&log, path, err, sizeof err);
        CHECK(rc == 0, "reopen: %s", err);
        if (rc)
            break;
    }
    /* Over the limit: refused before anything is read. */
    size_t over = EVENTLOG_MAX_JSON + 1;
    char *huge = malloc(over);
    if (huge && log) {
        memset(huge, 'a', over);
        CHECK_EQ_INT(eventlog_append(log, 1, 2, "TooBig", huge, over, err, sizeof err), CAIRN_ERANGE);
        check_last(log, 1, 1, "after the refused huge event");
    }
    free(huge);
    free(big);
    eventlog_close(log);
    remove_db(path);
}

/* ---- damaged files ---- */

static int write_file(const char *path, const void *data, size_t n)
{
    remove_db(path);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static int valid_code(int rc)
{
    return rc == 0 || (rc >= CAIRN_EINVAL && rc <= CAIRN_ESTATE);
}

static int count_cb(void *ctx, const struct eventlog_event *ev)
{
    (void)ev;
    (*(int *)ctx)++;
    return 0;
}

/* Opens a damaged file and, when that succeeds, uses it. Returns the open's code; any
 * code outside CAIRN_E* or a message missing is a failure. */
static int probe(const char *path, const char *what, int *later_errors)
{
    struct eventlog *log = NULL;
    err[0] = 0;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(valid_code(rc), "%s: open returned %d", what, rc);
    if (rc != 0) {
        CHECK(log == NULL && err[0] && strstr(err, path), "%s: refusal without the path in its message: %s", what,
              err);
        return rc;
    }
    int64_t t = 0, i = 0, n = 0;
    int seen = 0, codes[5];
    codes[0] = eventlog_last(log, &t, &i, err, sizeof err);
    codes[1] = eventlog_count(log, &n, err, sizeof err);
    codes[2] = eventlog_read_since(log, 0, 0, count_cb, &seen, 0, NULL, err, sizeof err);
    codes[3] = eventlog_append(log, t, i + 1, "After", "{}", 2, err, sizeof err);
    codes[4] = eventlog_compact(log, NULL, err, sizeof err);
    for (int k = 0; k < 5; k++) {
        CHECK(valid_code(codes[k]), "%s: operation %d returned %d", what, k, codes[k]);
        *later_errors += codes[k] != 0 && k != 3;
    }
    eventlog_close(log);
    return 0;
}

static void test_damaged(void)
{
    const char *src = tmp_path("src.db"), *copy = tmp_path("copy.db");
    struct eventlog *log;
    int rc = eventlog_open(&log, src, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    CHECK(add(log, 1, 0, SNAP) == 0, "%s", err);
    struct eventlog_event evs[400];
    char js[400][256];
    for (int k = 0; k < 400; k++) {
        size_t n = mkjson(js[k], sizeof js[k], 1, k + 1, "NodeGatheredInfo");
        evs[k] = (struct eventlog_event){.term = 1, .index = k + 1, .kind = "NodeGatheredInfo", .json = js[k], .len = n};
    }
    CHECK(eventlog_append_batch(log, evs, 400, err, sizeof err) == 0, "%s", err);
    eventlog_close(log);

    FILE *f = fopen(src, "rb");
    static unsigned char data[1 << 20];
    size_t size = f ? fread(data, 1, sizeof data, f) : 0;
    if (f)
        fclose(f);
    CHECK(size > 8192 && size < sizeof data, "source database of %zu bytes", size);
    if (size <= 8192 || size >= sizeof data)
        return;
    int later = 0;

    /* An intact copy opens (the WAL was folded into the file at close). */
    write_file(copy, data, size);
    CHECK_EQ_INT(probe(copy, "intact copy", &later), 0);
    CHECK_EQ_INT(later, 0);

    const char *text = "This is a plain text file, not a database.\nLine two.\n";
    write_file(copy, text, strlen(text));
    CHECK_EQ_INT(probe(copy, "text file", &later), CAIRN_EFORMAT);
    CHECK(strstr(err, "not a database") || strstr(err, "not an event log"), "text file message: %s", err);

    unsigned char noise[8192];
    uint64_t seed = 1234;
    for (size_t k = 0; k < sizeof noise; k++)
        noise[k] = (unsigned char)test_rand_u64(&seed);
    write_file(copy, noise, sizeof noise);
    CHECK_EQ_INT(probe(copy, "random bytes", &later), CAIRN_EFORMAT);

    /* The header magic damaged. */
    memcpy(noise, data, sizeof noise);
    noise[3] ^= 0x20;
    write_file(copy, noise, sizeof noise);
    CHECK_EQ_INT(probe(copy, "damaged magic", &later), CAIRN_EFORMAT);

    /* Page 2 onwards overwritten with noise: quick_check finds it. */
    memcpy(noise, data, sizeof noise);
    for (size_t k = 4096; k < sizeof noise; k++)
        noise[k] = (unsigned char)test_rand_u64(&seed);
    write_file(copy, noise, sizeof noise);
    CHECK_EQ_INT(probe(copy, "page 2 overwritten", &later), CAIRN_EFORMAT);

    size_t cuts[] = {1, 50, 99, 100, 1000, 4096, 4097, 8192, size / 2, size - 4096, size - 1};
    int refused = 0;
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        char what[64];
        snprintf(what, sizeof what, "truncated to %zu of %zu", cuts[k], size);
        write_file(copy, data, cuts[k]);
        rc = probe(copy, what, &later);
        refused += rc != 0;
        if (cuts[k] == size / 2 || cuts[k] < 100)
            CHECK(rc == CAIRN_EFORMAT, "%s: opened (rc %d)", what, rc);
    }

    /* Random bytes written over random places, anywhere, 60 times. */
    static unsigned char bad[1 << 20];
    int opened = 0;
    later = 0;
    for (int s = 0; s < 60; s++) {
        memcpy(bad, data, size);
        int flips = 1 + (int)(test_rand_u64(&seed) % 64);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(test_rand_u64(&seed) % size);
            size_t run = 1 + (size_t)(test_rand_u64(&seed) % 16);
            for (size_t b = at; b < at + run && b < size; b++)
                bad[b] = (unsigned char)test_rand_u64(&seed);
        }
        write_file(copy, bad, size);
        char what[64];
        snprintf(what, sizeof what, "random damage %d", s);
        opened += probe(copy, what, &later) == 0;
    }
    printf("damaged files: %d of 11 truncations refused; random damage: %d of 60 opened, %d later errors\n",
           refused, opened, later);

    /* A future schema version, and a stranger's SQLite database. */
    sqlite3 *db;
    write_file(copy, data, size);
    CHECK(sqlite3_open(copy, &db) == SQLITE_OK, "sqlite3_open");
    CHECK(sqlite3_exec(db, "UPDATE eventlog_schema SET version = 99", NULL, NULL, NULL) == SQLITE_OK, "update");
    sqlite3_close(db);
    CHECK_EQ_INT(probe(copy, "future schema", &later), CAIRN_EUNSUPPORTED);
    CHECK(strstr(err, "99") && strstr(err, "newer"), "future schema message: %s", err);

    remove_db(copy);
    CHECK(sqlite3_open(copy, &db) == SQLITE_OK, "sqlite3_open");
    CHECK(sqlite3_exec(db, "CREATE TABLE notes(x TEXT); INSERT INTO notes VALUES('mine')", NULL, NULL, NULL) ==
              SQLITE_OK,
          "create");
    sqlite3_close(db);
    CHECK_EQ_INT(probe(copy, "someone else's database", &later), CAIRN_EFORMAT);
    CHECK(strstr(err, "something else"), "stranger message: %s", err);

    /* Paths that cannot be opened. */
    CHECK_EQ_INT(probe(tmp_path("no/such/dir/x.db"), "missing folder", &later), CAIRN_EIO);
    CHECK(eventlog_open(&log, dir, err, sizeof err) < 0, "a folder opened as a log");
    CHECK_EQ_INT(eventlog_open(&log, "", err, sizeof err), CAIRN_EINVAL);
    CHECK_EQ_INT(eventlog_open(NULL, src, err, sizeof err), CAIRN_EINVAL);
    remove_db(copy);
    remove_db(src);
}

static size_t read_file(const char *path, unsigned char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* A writer that dies without closing leaves its events in the WAL: the next open finds
 * them. Damage to that WAL loses a tail of the events, never their order. */
static void test_crash_and_wal(void)
{
    const char *path = tmp_path("crash.db"), *copy = tmp_path("crashcopy.db");
    char wal[512], copy_wal[512];
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(copy_wal, sizeof copy_wal, "%s-wal", copy);
    struct eventlog *log;
    int rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc)
        return;
    CHECK(add(log, 1, 0, SNAP) == 0, "%s", err);
    eventlog_close(log);

    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (eventlog_open(&log, path, err, sizeof err) != 0)
            _exit(2);
        for (int i = 1; i <= 200; i++)
            if (add(log, 1, i, "TaskStatusUpdated") != 0)
                _exit(3);
        _exit(0); /* no close: the events stay in the WAL */
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer child ended with status %d", status);

    static unsigned char db_bytes[1 << 20], wal_bytes[4 << 20], bad[4 << 20];
    size_t db_n = read_file(path, db_bytes, sizeof db_bytes);
    size_t wal_n = read_file(wal, wal_bytes, sizeof wal_bytes);
    CHECK(db_n > 0 && wal_n > 32 && wal_n < sizeof wal_bytes, "after the crash: file %zu bytes, WAL %zu bytes", db_n,
          wal_n);
    if (db_n == 0 || wal_n <= 32 || wal_n >= sizeof wal_bytes)
        return;

    rc = eventlog_open(&log, path, err, sizeof err);
    CHECK(rc == 0, "open after the crash: %s", err);
    if (rc == 0) {
        check_last(log, 1, 200, "after the crash");
        struct got g;
        int reset;
        CHECK_EQ_INT(read_all(log, 0, 0, 0, &g, &reset), 0);
        check_seq(&g, 1, 0, 200, "after the crash");
        eventlog_close(log);
    }

    uint64_t seed = 99;
    int opened = 0, shortest = 201;
    for (int s = 0; s < 30; s++) {
        memcpy(bad, wal_bytes, wal_n);
        int flips = 1 + (int)(test_rand_u64(&seed) % 8);
        for (int k = 0; k < flips; k++)
            bad[test_rand_u64(&seed) % wal_n] ^= (unsigned char)(1 + test_rand_u64(&seed) % 255);
        write_file(copy, db_bytes, db_n);
        FILE *f = fopen(copy_wal, "wb");
        if (f) {
            fwrite(bad, 1, wal_n, f);
            fclose(f);
        }
        err[0] = 0;
        rc = eventlog_open(&log, copy, err, sizeof err);
        CHECK(valid_code(rc), "damaged WAL %d: open returned %d", s, rc);
        if (rc != 0)
            continue;
        opened++;
        struct got g;
        int reset;
        rc = read_all(log, 0, 0, 0, &g, &reset);
        CHECK(valid_code(rc), "damaged WAL %d: read returned %d", s, rc);
        if (rc == 0) {
            int64_t lt = 0, li = 0;
            eventlog_last(log, &lt, &li, err, sizeof err);
            check_seq(&g, 1, 0, li, "damaged WAL");
            if (li < shortest)
                shortest = (int)li;
        }
        eventlog_close(log);
    }
    printf("damaged WAL: %d of 30 opened, shortest prefix kept (1, %d)\n", opened, shortest);
    remove_db(copy);
    remove_db(path);
}

/* CAIRN_BENCH=1: events appended per second, one per transaction and in batches. */
static void bench(void)
{
    const char *path = tmp_path("bench.db");
    struct eventlog *log;
    if (eventlog_open(&log, path, err, sizeof err) != 0) {
        printf("bench open: %s\n", err);
        return;
    }
    char j[256];
    memset(j, 'x', sizeof j);
    size_t jn = 200;
    memcpy(j, "{\"kind\":\"RunnerStatusUpdated\",\"pad\":\"", 37);
    j[jn - 2] = '"';
    j[jn - 1] = '}';
    int rc = eventlog_append(log, 1, 0, SNAP, j, jn, err, sizeof err);
    int64_t idx = 1, n1 = 20000;
    double t0 = clock_sec();
    for (int64_t k = 0; k < n1 && rc == 0; k++, idx++)
        rc = eventlog_append(log, 1, idx, "RunnerStatusUpdated", j, jn, err, sizeof err);
    double t1 = clock_sec();
    enum { B = 1000 };
    static struct eventlog_event evs[B];
    int64_t nb = 200;
    for (int64_t b = 0; b < nb && rc == 0; b++) {
        for (int k = 0; k < B; k++, idx++)
            evs[k] = (struct eventlog_event){.term = 1, .index = idx, .kind = "RunnerStatusUpdated", .json = j, .len = jn};
        rc = eventlog_append_batch(log, evs, B, err, sizeof err);
    }
    double t2 = clock_sec();
    int seen = 0, reset;
    if (rc == 0)
        rc = eventlog_read_since(log, 0, 0, count_cb, &seen, 0, &reset, err, sizeof err);
    double t3 = clock_sec();
    if (rc != 0)
        printf("bench: %s\n", err);
    printf("bench: %.0f events/s appended one per transaction (%lld events of %zu bytes)\n", (double)n1 / (t1 - t0),
           (long long)n1, jn);
    printf("bench: %.0f events/s appended in batches of %d (%lld events)\n", (double)(nb * B) / (t2 - t1), B,
           (long long)(nb * B));
    printf("bench: %.0f events/s read (%d events)\n", seen / (t3 - t2), seen);
    eventlog_close(log);
    struct stat sb;
    stat(path, &sb);
    double t4 = clock_sec();
    rc = eventlog_open(&log, path, err, sizeof err);
    double t5 = clock_sec();
    printf("bench: open (with its integrity check) of a %.1f MB log: %.1f ms%s%s\n", (double)sb.st_size / 1e6,
           (t5 - t4) * 1e3, rc ? ": " : "", rc ? err : "");
    eventlog_close(log);
    remove_db(path);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    snprintf(dir, sizeof dir, "/tmp/cairn-eventlog-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_round_trip);
    RUN(test_ordering);
    RUN(test_terms_and_compaction);
    RUN(test_durability);
    RUN(test_two_handles);
    RUN(test_huge);
    RUN(test_damaged);
    RUN(test_crash_and_wal);
    const char *b = getenv("CAIRN_BENCH");
    if (b && strcmp(b, "1") == 0)
        bench();
    remove_dir();
    return test_main_end();
}
