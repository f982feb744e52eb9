#include "tokenizer/unicode.h"

#include <stdlib.h>

uint16_t unicode_flags(uint32_t cpt)
{
	if (cpt < 256)
		return unicode_latin1[cpt];
	if (cpt >= 0x110000)
		return UNICODE_UNDEFINED;
	/* The last run whose start is <= cpt. */
	size_t lo = 0, hi = unicode_n_runs;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (unicode_runs[mid].start <= cpt)
			lo = mid;
		else
			hi = mid;
	}
	return unicode_runs[lo].flags;
}

size_t unicode_sequence_length(unsigned char c)
{
	static const unsigned char by_high_bits[16] = {1, 1, 1, 1, 1, 1, 1, 1,
						       1, 1, 1, 1, 2, 2, 3, 4};
	return by_high_bits[c >> 4];
}

static int continuation(const char *s, size_t len, size_t i)
{
	return i < len && ((unsigned char)s[i] & 0xC0) == 0x80;
}

uint32_t unicode_decode(const char *s, size_t len, size_t *pos)
{
	size_t i = *pos;
	unsigned char c = (unsigned char)s[i];
	if (c < 0x80) {
		*pos = i + 1;
		return c;
	}
	if ((c & 0xE0) == 0xC0 && continuation(s, len, i + 1)) {
		*pos = i + 2;
		return ((uint32_t)(c & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
	}
	if ((c & 0xF0) == 0xE0 && continuation(s, len, i + 1) && continuation(s, len, i + 2)) {
		*pos = i + 3;
		return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 6) |
		       ((unsigned char)s[i + 2] & 0x3F);
	}
	if ((c & 0xF8) == 0xF0 && continuation(s, len, i + 1) && continuation(s, len, i + 2) &&
	    continuation(s, len, i + 3)) {
		*pos = i + 4;
		return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 12) |
		       ((uint32_t)((unsigned char)s[i + 2] & 0x3F) << 6) |
		       ((unsigned char)s[i + 3] & 0x3F);
	}
	*pos = i + 1;
	return 0xFFFD;
}

uint32_t *unicode_decode_all(const char *s, size_t len, size_t *n)
{
	uint32_t *out = malloc((len ? len : 1) * sizeof *out);
	if (!out)
		return NULL;
	size_t k = 0;
	for (size_t pos = 0; pos < len;)
		out[k++] = unicode_decode(s, len, &pos);
	*n = k;
	return out;
}

size_t unicode_encode(uint32_t cpt, char out[4])
{
	if (cpt < 0x80) {
		out[0] = (char)cpt;
		return 1;
	}
	if (cpt < 0x800) {
		out[0] = (char)(0xC0 | (cpt >> 6));
		out[1] = (char)(0x80 | (cpt & 0x3F));
		return 2;
	}
	if (cpt < 0x10000) {
		out[0] = (char)(0xE0 | (cpt >> 12));
		out[1] = (char)(0x80 | ((cpt >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cpt & 0x3F));
		return 3;
	}
	if (cpt < 0x110000) {
		out[0] = (char)(0xF0 | (cpt >> 18));
		out[1] = (char)(0x80 | ((cpt >> 12) & 0x3F));
		out[2] = (char)(0x80 | ((cpt >> 6) & 0x3F));
		out[3] = (char)(0x80 | (cpt & 0x3F));
		return 4;
	}
	return 0;
}
