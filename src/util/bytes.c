#include "util/bytes.h"

#include <string.h>

const char *bytes_rfind(const char *hay, size_t hl, const char *needle, size_t nl)
{
	if (nl > hl)
		return NULL;
	for (size_t i = hl - nl + 1; i-- > 0;)
		if (!memcmp(hay + i, needle, nl))
			return hay + i;
	return NULL;
}
