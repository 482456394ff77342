/* The dispatched activation quantizer gives the reference's bits, special values included. */
#include "kern/kern.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    const int types[] = {DT_Q8_0, DT_Q4_K};
    uint64_t seed = 9;
    enum { N = 2048 };
    float x[N];
    for (int t = 0; t < 2; t++) {
        size_t bytes = kern_act_row_bytes(types[t], N);
        unsigned char *a = malloc(bytes), *b = malloc(bytes);
        int bad = 0;
        for (int rep = 0; rep < 300; rep++) {
            float scale = powf(10.0f, (float)(int)(test_rand_u64(&seed) % 9) - 4.0f);
            for (int i = 0; i < N; i++)
                x[i] = test_rand_float(&seed) * scale;
            if (rep % 5 == 1) /* exact halves: ties to even */
                for (int i = 0; i < N; i++)
                    x[i] = (float)((int)(test_rand_u64(&seed) % 255) - 127) * 0.5f;
            if (rep % 7 == 2) { /* specials in some blocks */
                x[test_rand_u64(&seed) % N] = NAN;
                x[test_rand_u64(&seed) % N] = INFINITY;
                x[test_rand_u64(&seed) % N] = -INFINITY;
                x[test_rand_u64(&seed) % N] = -0.0f;
                for (int i = 256; i < 512; i++)
                    x[i] = 0.0f;
            }
            memset(a, 0xAA, bytes);
            memset(b, 0x55, bytes);
            kern_act_quantize(types[t], x, a, N);
            kern_act_quantize_ref(types[t], x, b, N);
            bad += memcmp(a, b, bytes) != 0;
        }
        CHECK(bad == 0, "%s activations: %d of 300 rows differ from the reference", dtype_name(types[t]), bad);
        free(a);
        free(b);
    }
    return test_main_end();
}
