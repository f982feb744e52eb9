#include "util/bytes.h"

#include <string.h>

#include <openssl/sha.h>

const char *bytes_rfind(const char *hay, size_t hl, const char *needle, size_t nl)
{
	if (nl > hl)
		return NULL;
	for (size_t i = hl - nl + 1; i-- > 0;)
		if (!memcmp(hay + i, needle, nl))
			return hay + i;
	return NULL;
}

void bytes_hex(const unsigned char *raw, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[raw[i] >> 4];
		out[2 * i + 1] = digits[raw[i] & 15];
	}
	out[2 * n] = '\0';
}

void bytes_sha256_hex(const void *data, size_t n, char out[65])
{
	unsigned char dig[SHA256_DIGEST_LENGTH];
	SHA256(data, n, dig);
	bytes_hex(dig, sizeof dig, out);
}
