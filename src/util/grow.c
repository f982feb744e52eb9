#include "util/grow.h"

#include <stdint.h>
#include <stdlib.h>

int grow(void **arr, size_t *cap, size_t need, size_t elem, size_t first)
{
	if (need <= *cap)
		return 0;
	size_t ncap = *cap ? *cap : first ? first : 1;
	while (ncap < need)
		ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
	if (elem && ncap > SIZE_MAX / elem)
		return -1;
	void *p = realloc(*arr, ncap * elem);
	if (!p)
		return -1;
	*arr = p;
	*cap = ncap;
	return 0;
}
