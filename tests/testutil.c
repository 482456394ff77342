#include "testutil.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int test_passed, test_failed;

const char *test_data_path(const char *rel)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/testdata/%s", CAIRN_SHARED_DIR, rel);
    return buf;
}

uint64_t test_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float test_rand_float(uint64_t *s)
{
    return (float)((double)(test_rand_u64(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static bool listing;
static char **wanted; /* case names asked for, NULL = all */
static int n_wanted;
static unsigned char *seen;

void test_begin(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            listing = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--list | CASE...]\n", argv[0]);
            exit(2);
        }
    }
    if (!listing && argc > 1) {
        wanted = argv + 1;
        n_wanted = argc - 1;
        seen = calloc((size_t)n_wanted, 1);
    }
}

static const char *case_name(const char *fn_name)
{
    return strncmp(fn_name, "test_", 5) ? fn_name : fn_name + 5;
}

bool test_case_wanted(const char *fn_name)
{
    const char *name = case_name(fn_name);
    if (listing) {
        printf("%s\n", name);
        return false;
    }
    bool run = !wanted;
    for (int i = 0; !run && i < n_wanted; i++) {
        if (!strcmp(wanted[i], name)) {
            seen[i] = 1;
            run = true;
        }
    }
    /* unbuffered, so a test killed by ctest's timeout still shows the case it was in */
    if (run)
        fprintf(stderr, "case %s\n", name);
    return run;
}

bool test_listing(void) { return listing; }

int test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("skipped: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    return TEST_SKIPPED;
}

int test_main_end(void)
{
    if (listing)
        return 0;
    int rc = 0;
    for (int i = 0; i < n_wanted; i++) {
        if (!seen[i]) {
            fprintf(stderr, "no case %s (--list shows them)\n", wanted[i]);
            rc = 2;
        }
    }
    free(seen);
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : rc;
}
