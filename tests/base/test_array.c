/* array_reserve: doubling from the minimum, sizes that overflow refused, and the array
 * left as it was when it cannot grow. */
#include "base/array.h"
#include "base/err.h"
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif

struct pair {
    int32_t a;
    double b;
};

static void test_growth(void)
{
    struct pair *v = NULL;
    size_t n = 0, cap = 0;
    size_t seen[8], n_seen = 0;
    for (int i = 0; i < 100; i++) {
        int rc = array_reserve(&v, &cap, n + 1, sizeof *v, 16);
        CHECK(rc == 0, "push %d: rc %d", i, rc);
        if (rc)
            break;
        if (!n_seen || seen[n_seen - 1] != cap)
            seen[n_seen++] = cap;
        v[n++] = (struct pair){i, i * 0.5};
    }
    static const size_t want[] = {16, 32, 64, 128};
    CHECK(n_seen == 4, "%zu capacities for 100 pushes, want 4", n_seen);
    for (size_t i = 0; i < n_seen && i < 4; i++)
        CHECK(seen[i] == want[i], "capacity %zu is %zu, want %zu", i, seen[i], want[i]);
    for (size_t i = 0; i < n; i++)
        CHECK(v[i].a == (int32_t)i && v[i].b == (double)i * 0.5, "element %zu is {%d, %g}", i, v[i].a, v[i].b);

    /* need within cap: nothing moves; a jump: doubles until it holds need. */
    struct pair *before = v;
    CHECK(array_reserve(&v, &cap, 128, sizeof *v, 16) == 0 && v == before && cap == 128,
          "reserving 128 of 128 moved the array or changed cap to %zu", cap);
    CHECK(array_reserve(&v, &cap, 1000, sizeof *v, 16) == 0 && cap == 1024, "reserving 1000 of 128 gave cap %zu",
          cap);
    CHECK(v[99].a == 99, "element 99 lost on growth: %d", v[99].a);
    free(v);

    /* min 0 starts from 1; byte arrays. */
    char *s = NULL;
    size_t scap = 0;
    CHECK(array_reserve(&s, &scap, 1, 1, 0) == 0 && scap == 1, "min 0 gave cap %zu", scap);
    CHECK(array_reserve(&s, &scap, 3, 1, 0) == 0 && scap == 4, "3 bytes from 1 gave cap %zu", scap);
    free(s);
}

static void test_overflow_refused(void)
{
    int32_t *v = NULL;
    size_t cap = 0;
    CHECK(array_reserve(&v, &cap, 4, sizeof *v, 4) == 0, "first reserve failed");
    if (!v)
        return;
    for (int i = 0; i < 4; i++)
        v[i] = 10 + i;
    int32_t *before = v;
    /* need * elem past SIZE_MAX, and past PTRDIFF_MAX: refused before any realloc. */
    static const size_t needs[] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / sizeof *v + 1, (size_t)PTRDIFF_MAX / sizeof *v + 1};
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++) {
        int rc = array_reserve(&v, &cap, needs[i], sizeof *v, 4);
        CHECK(rc == CAIRN_ENOMEM, "need %zu: rc %d, want CAIRN_ENOMEM", needs[i], rc);
        CHECK(v == before && cap == 4, "need %zu: the array moved or cap became %zu", needs[i], cap);
    }
    /* A min past the limit falls back to need. */
    char *s = NULL;
    size_t scap = 0;
    CHECK(array_reserve(&s, &scap, 8, 1, SIZE_MAX) == 0 && scap == 8, "min SIZE_MAX gave cap %zu", scap);
    free(s);
    for (int i = 0; i < 4; i++)
        CHECK(v[i] == 10 + i, "element %d is %d after refusals", i, v[i]);
    free(v);
}

static void test_failure_keeps_array(void)
{
#if defined(ASAN_BUILD)
    printf("skipped under AddressSanitizer (it reports an oversized malloc instead of failing it)\n");
#else
    /* 2^62 bytes: within the limits, so realloc is asked, and no address space holds it. */
    char *s = NULL;
    size_t cap = 0;
    CHECK(array_reserve(&s, &cap, 16, 1, 16) == 0, "first reserve failed");
    if (!s)
        return;
    memcpy(s, "kept as it was", 15);
    char *before = s;
    int rc = array_reserve(&s, &cap, (size_t)1 << 62, 1, 16);
    CHECK(rc == CAIRN_ENOMEM, "2^62 bytes: rc %d, want CAIRN_ENOMEM", rc);
    CHECK(s == before && cap == 16, "failed realloc moved the array or set cap %zu", cap);
    CHECK(!strcmp(s, "kept as it was"), "contents now \"%s\"", s);
    free(s);
#endif
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_growth);
    RUN(test_overflow_refused);
    RUN(test_failure_keeps_array);
    return test_main_end();
}
