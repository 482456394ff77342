/* libFuzzer harness of http_host_allowed (api/hosts.c) on arbitrary Host values: no
 * crash, no read past the value, and the answer agrees with itself under case changes
 * and is stable. Built and run by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include "api/hosts.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 400)
        return 0;
    char *host = malloc(size + 1);
    if (!host)
        return 0;
    memcpy(host, data, size);
    host[size] = 0; /* a header value is a C string; embedded NULs end it */
    const char *names[] = {"my.box", "Other.Name."};
    bool a = http_host_allowed(host, "machine", names, 2);
    bool b = http_host_allowed(host, "machine", names, 2);
    for (char *p = host; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    bool c = http_host_allowed(host, "machine", names, 2);
    if (a != b || a != c)
        abort(); /* deterministic and case-insensitive */
    free(host);
    return 0;
}
