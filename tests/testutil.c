#include "testutil.h"

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

int test_main_end(void)
{
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}
