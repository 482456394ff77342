/* Growable arrays: the one place that doubles a capacity and reallocs, with the size
 * checked for overflow. An array is a T *, a count the caller keeps, and a size_t
 * capacity in elements. */
#ifndef CAIRN_BASE_ARRAY_H
#define CAIRN_BASE_ARRAY_H

#include <stddef.h>

/* Makes room for need elements of elem bytes in the array whose pointer lives at arr
 * (the address of a T *, e.g. &v->items), now *cap elements: *cap doubles, from min
 * when it is 0, until it holds need (at most PTRDIFF_MAX bytes). 0 (also when need <=
 * *cap), or CAIRN_ENOMEM when the size overflows or realloc fails; then the array and
 * *cap are as they were. The array stays owned by the caller (release with free). */
int array_reserve(void *arr, size_t *cap, size_t need, size_t elem, size_t min);

#endif
