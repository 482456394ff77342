/* bwcache: a node's kept bandwidth reading is taken only for the same CPU, threads and
 * block within its age, and a damaged file is refused, never trusted. */
#include "base/err.h"
#include "node/bwcache.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path[256];

static struct bwcache_entry entry(void)
{
    struct bwcache_entry e = {.key = {.cpu = "Test CPU 9000", .threads = 2, .block_mib = 2032},
                              .bytes_per_s = 61.25e9, .style = "8 streams", .taken_at = 1000000};
    return e;
}

static void write_text(const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(text, 1, n, f) == n, "wrote %zu bytes to %s", n, path);
    if (f)
        fclose(f);
}

static void test_round_trip(void)
{
    struct bwcache_entry e = entry(), got;
    char err[256] = "";
    remove(path);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), CAIRN_ENOTFOUND);
    CHECK_EQ_INT(bwcache_write(path, &e, err, sizeof err), 0);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at + 60, &got, err, sizeof err), 0);
    CHECK(got.bytes_per_s == e.bytes_per_s, "bytes/s %.17g, wrote %.17g", got.bytes_per_s, e.bytes_per_s);
    CHECK(!strcmp(got.style, e.style) && got.taken_at == e.taken_at, "style '%s' taken at %lld", got.style,
          (long long)got.taken_at);
}

/* Each way a reading stops counting: another CPU, other threads, another block, too old,
 * from the future. */
static void test_misses(void)
{
    struct bwcache_entry e = entry(), got;
    char err[256] = "";
    CHECK_EQ_INT(bwcache_write(path, &e, err, sizeof err), 0);
    struct bwcache_key k = e.key;
    snprintf(k.cpu, sizeof k.cpu, "Other CPU");
    CHECK_EQ_INT(bwcache_read(path, &k, e.taken_at, &got, err, sizeof err), CAIRN_ESTATE);
    k = e.key;
    k.threads = 4;
    CHECK_EQ_INT(bwcache_read(path, &k, e.taken_at, &got, err, sizeof err), CAIRN_ESTATE);
    k = e.key;
    k.block_mib = 64;
    CHECK_EQ_INT(bwcache_read(path, &k, e.taken_at, &got, err, sizeof err), CAIRN_ESTATE);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at + BWCACHE_MAX_AGE_S + 1, &got, err, sizeof err), CAIRN_ESTATE);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at + BWCACHE_MAX_AGE_S, &got, err, sizeof err), 0);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at - 1, &got, err, sizeof err), CAIRN_ESTATE);
}

/* Every truncation of a good file, and files with a field of the wrong type or an
 * impossible value, are refused as malformed. */
static void test_damaged(void)
{
    struct bwcache_entry e = entry(), got;
    char err[256] = "";
    const char *good = "{\"cpu\": \"Test CPU 9000\", \"threads\": 2, \"block_mib\": 2032, "
                       "\"bytes_per_s\": 61250000000.0, \"style\": \"8 streams\", \"taken_at\": 1000000}";
    write_text(good, strlen(good));
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), 0);
    int refused = 0;
    for (size_t n = 0; n < strlen(good); n++) {
        write_text(good, n);
        int rc = bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err);
        refused += rc == CAIRN_EFORMAT;
        CHECK(rc == CAIRN_EFORMAT, "the first %zu bytes: %d (%s)", n, rc, err);
    }
    CHECK_EQ_INT(refused, (int)strlen(good));
    /* each with one field wrong (6e10 is a good bandwidth) */
    const char *bad[] = {
        "[]",
        "{\"cpu\": 7, \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 6e10, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 0, \"block_mib\": 2032, \"bytes_per_s\": 6e10, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": -1, \"bytes_per_s\": 6e10, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": -5.0, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 1e300, \"style\": \"x\", \"taken_at\": 1}",
        /* figures that would become 0 ("not measured") or a few bytes a second */
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 1e-300, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 0.5, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 1.0, \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": \"fast\", \"style\": \"x\", \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 6e10, \"taken_at\": 1}",
        "{\"cpu\": \"c\", \"cpu\": \"d\", \"threads\": 2, \"block_mib\": 2032, \"bytes_per_s\": 6e10, \"style\": \"x\", "
        "\"taken_at\": 1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(bad[i], strlen(bad[i]));
        int rc = bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT, "bad file %zu: %d (%s)", i, rc, err);
    }
}

/* What is not a small regular file is refused without being read: a FIFO (whose open or
 * read would block the node's shut-down), a directory, a file larger than any reading. */
static void test_not_a_file(void)
{
    struct bwcache_entry e = entry(), got;
    char err[256] = "";
    remove(path);
    CHECK_EQ_INT(mkfifo(path, 0600), 0);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), CAIRN_EFORMAT);
    remove(path);
    CHECK_EQ_INT(mkdir(path, 0700), 0);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), CAIRN_EFORMAT);
    rmdir(path);
    /* a good reading padded with spaces past the limit */
    char big[8192];
    int n = snprintf(big, sizeof big, "{\"cpu\": \"Test CPU 9000\", \"threads\": 2, \"block_mib\": 2032, "
                     "\"bytes_per_s\": 61250000000.0, \"style\": \"8 streams\", \"taken_at\": 1000000}");
    write_text(big, (size_t)n);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), 0);
    memset(big + n, ' ', sizeof big - (size_t)n);
    write_text(big, sizeof big);
    CHECK_EQ_INT(bwcache_read(path, &e.key, e.taken_at, &got, err, sizeof err), CAIRN_EFORMAT);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    snprintf(path, sizeof path, "/tmp/cairn-test-bwcache-%d.json", (int)getpid());
    RUN(test_round_trip);
    RUN(test_misses);
    RUN(test_damaged);
    RUN(test_not_a_file);
    remove(path);
    return test_main_end();
}
