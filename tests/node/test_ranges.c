/* The record of which byte ranges of a file are there (node/ranges.h), against a bitmap
 * of the same adds: the ranges stay sorted and apart, missing counts and holes are the
 * bitmap's, a stored record loads back the same, and a record that is not valid (out of
 * order, past the size, another size, not JSON) loads as empty. */
#include "node/ranges.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZE 4096

static uint64_t missing_ref(const unsigned char *bit, uint64_t a, uint64_t b)
{
    uint64_t n = 0;
    for (uint64_t i = a; i < b; i++)
        n += !bit[i];
    return n;
}

static void check_against(const struct ranges *h, const unsigned char *bit, int round)
{
    for (size_t i = 0; i < h->n; i++) {
        CHECK(h->r[i][0] < h->r[i][1] && h->r[i][1] <= SIZE, "round %d: range %zu empty or past the end", round, i);
        if (i)
            CHECK(h->r[i][0] > h->r[i - 1][1], "round %d: ranges %zu and %zu touch", round, i - 1, i);
    }
    uint64_t s = 7;
    for (int k = 0; k < 20; k++) {
        uint64_t a = test_rand_u64(&s) % SIZE, b = a + test_rand_u64(&s) % (SIZE - a) + 1;
        CHECK(ranges_missing(h, a, b) == missing_ref(bit, a, b), "round %d: missing [%llu, %llu)", round,
              (unsigned long long)a, (unsigned long long)b);
    }
    uint64_t holes = 0, hole, end;
    for (uint64_t at = 0; ranges_next_hole(h, at, SIZE, &hole, &end); at = end) {
        CHECK(hole < end && !bit[hole] && !bit[end - 1] && (end == SIZE || bit[end]) && (hole == 0 || bit[hole - 1]),
              "round %d: hole [%llu, %llu)", round, (unsigned long long)hole, (unsigned long long)end);
        holes += end - hole;
    }
    CHECK(holes == missing_ref(bit, 0, SIZE), "round %d: holes sum to the missing bytes", round);
}

static void load_text(const char *path, const char *text, struct ranges *h)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    ranges_load(path, SIZE, h);
}

int main(void)
{
    static unsigned char bit[SIZE];
    struct ranges h = {.size = SIZE};
    uint64_t s = 42;
    for (int round = 0; round < 200; round++) {
        uint64_t a = test_rand_u64(&s) % SIZE, len = 1 + test_rand_u64(&s) % 64;
        uint64_t b = a + len > SIZE ? SIZE : a + len;
        CHECK(ranges_add(&h, a, b), "add");
        memset(bit + a, 1, b - a);
        check_against(&h, bit, round);
    }
    char path[] = "/tmp/cairn_ranges_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    char err[256];
    CHECK(ranges_store(path, &h, true, err, sizeof err) == 0, "store: %s", err);
    struct ranges back;
    ranges_load(path, SIZE, &back);
    CHECK(back.n == h.n && !memcmp(back.r, h.r, h.n * sizeof *h.r), "loaded back: %zu ranges of %zu", back.n, h.n);
    ranges_free(&back);
    ranges_load(path, SIZE + 1, &back);
    CHECK(back.n == 0, "a record of another size loads empty");
    ranges_free(&back);
    const char *bad[] = {"{\"size\": 4096, \"ranges\": [[10, 20], [5, 8]]}", "{\"size\": 4096, \"ranges\": [[0, 4097]]}",
                         "{\"size\": 4096, \"ranges\": [[9, 9]]}", "{\"size\": 4096, \"ranges\": [[1, 2, 3]]}",
                         "{\"size\": 4096, \"ranges\": [[-1, 2]]}", "not json", "{\"size\": 4096}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        load_text(path, bad[i], &back);
        CHECK(back.n == 0, "record %zu loads empty: %zu ranges", i, back.n);
        ranges_free(&back);
    }
    load_text(path, "{\"size\": 4096, \"ranges\": [[0, 10], [20, 4096]]}", &back);
    CHECK(back.n == 2 && ranges_missing(&back, 0, SIZE) == 10, "a valid record");
    ranges_free(&back);
    char tmp[sizeof path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(path);
    unlink(tmp);
    ranges_free(&h);
    return test_main_end();
}
