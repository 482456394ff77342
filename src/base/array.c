#include "base/array.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int array_reserve(void *arr, size_t *cap, size_t need, size_t elem, size_t min)
{
    assert(elem > 0);
    if (need <= *cap)
        return 0;
    size_t limit = PTRDIFF_MAX / elem; /* elements the array may ever hold */
    if (need > limit)
        return CAIRN_ENOMEM;
    size_t nc = *cap ? *cap : (min ? min : 1);
    while (nc < need)
        nc = nc > limit / 2 ? need : nc * 2;
    if (nc > limit) /* a min past the limit */
        nc = need;
    /* arr points at a T *, whatever T is: the pointer is copied out and back as bytes,
     * since a T ** may not be read through a void **. */
    void *old, *p;
    memcpy(&old, arr, sizeof old);
    p = realloc(old, nc * elem);
    if (!p)
        return CAIRN_ENOMEM;
    memcpy(arr, &p, sizeof p);
    *cap = nc;
    return 0;
}
