/* Growing a malloc'd array by doubling, the one way every growable buffer
 * and list here grows: amortised O(1) appends, and one place for the
 * overflow checks that a hand-written `cap * 2` tends to leave out. */
#ifndef TOKI_UTIL_GROW_H
#define TOKI_UTIL_GROW_H

#include <stddef.h>

/* Makes room for need elements of elem bytes in *arr, whose capacity is
 * *cap: nothing when need <= *cap, else *cap (first when 0) doubled until it
 * holds need, and *arr realloc'd to that. 0, or -1 with *arr and *cap as they
 * were (out of memory, or the size overflows). */
int grow(void **arr, size_t *cap, size_t need, size_t elem, size_t first);

/* grow() for an array lvalue and its size_t capacity lvalue. */
#define GROW(arr, cap, need, first) grow((void **)&(arr), &(cap), (need), sizeof *(arr), (first))

#endif
