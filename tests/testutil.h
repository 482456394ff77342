/* Minimal test helpers: each CHECK prints what it compared when it fails and counts
 * the failure; test_main_end() prints "N passed, N failed" and returns the exit code.
 *
 * Cases: a test's main starts with test_begin(argc, argv) and runs each case as
 * RUN(test_name, args...). Then `test_x --list` prints the case names (the function
 * names without "test_") and `test_x NAME...` runs only those cases; with no argument
 * every case runs. A test that cannot run here returns test_skip("why"): exit code 77,
 * which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. */
#ifndef CAIRN_TESTUTIL_H
#define CAIRN_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern int test_passed, test_failed;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (cond) {                                                          \
            test_passed++;                                                   \
        } else {                                                             \
            test_failed++;                                                   \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                   \
    CHECK((long long)(a) == (long long)(b), "%s = %lld, %s = %lld", #a, (long long)(a), #b, (long long)(b))

/* Path of a file under ../shared/testdata (static buffer, valid until the next call). */
const char *test_data_path(const char *rel);

/* Deterministic random numbers for tests (splitmix64). */
uint64_t test_rand_u64(uint64_t *state);
float test_rand_float(uint64_t *state); /* uniform in [-1, 1) */

#define TEST_SKIPPED 77

/* Reads the command line: --list, or names of cases to run. Exits 2 on a bad option. */
void test_begin(int argc, char **argv);
/* Whether the case of function fn_name runs now (under --list: prints it, false). */
bool test_case_wanted(const char *fn_name);
/* True under --list: a main skips the fixtures its cases would need. */
bool test_listing(void);
#define RUN(fn, ...)                         \
    do {                                     \
        if (test_case_wanted(#fn))           \
            fn(__VA_ARGS__);                 \
    } while (0)

/* Prints "skipped: " and the reason, returns TEST_SKIPPED for main to return. */
int test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints the summary line and returns the process exit code (2 when a case asked for
 * by name does not exist). */
int test_main_end(void);

#endif
