/* Minimal test helpers: each CHECK prints what it compared when it fails and counts
 * the failure; test_main_end() prints "N passed, N failed" and returns the exit code. */
#ifndef CAIRN_TESTUTIL_H
#define CAIRN_TESTUTIL_H

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

/* Prints the summary line and returns the process exit code. */
int test_main_end(void);

#endif
