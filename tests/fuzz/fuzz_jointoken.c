/* libFuzzer harness of join tokens (net/jointoken.c), which a person pastes from
 * anywhere: arbitrary text decodes or is refused with a reason; a token that decodes
 * encodes back to the same text (one spelling per token). Built and run by
 * tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/jointoken.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4 * JOINTOKEN_TEXT_MAX)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    struct jointoken t;
    char err[256] = "", again[JOINTOKEN_TEXT_MAX];
    if (jointoken_decode(text, &t, err, sizeof err)) {
        if (!err[0] || t.secret[0])
            abort(); /* a refusal says why and keeps nothing */
    } else if (jointoken_encode(&t, again, err, sizeof err) || strcmp(again, text)) {
        abort();
    }
    free(text);
    return 0;
}
