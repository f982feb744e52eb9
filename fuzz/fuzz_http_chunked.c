/* Chunked request bodies (src/http/http_parse.c chunked_decode). The same
 * body is decoded whole and in the pieces a socket might deliver it in; the
 * results must agree (status, consumed bytes, decoded data). */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "http/http_parse.h"

struct result {
	int rc;
	size_t consumed;
	char *out;
	size_t out_len;
};

static void decode(const char *in, size_t len, size_t max, const uint8_t *cuts, size_t n_cuts,
		   struct result *r)
{
	struct chunked_decoder d;
	memset(&d, 0, sizeof d);
	/* As http_server.c sets up a chunked request's body. */
	size_t cap = 1;
	r->out = malloc(1);
	r->out[0] = '\0';
	r->out_len = 0;
	r->consumed = 0;
	r->rc = 0;
	size_t pos = 0, ci = 0;
	while (pos < len) {
		size_t piece = len - pos;
		if (ci < n_cuts) {
			size_t want = (size_t)cuts[ci++] % 17 + 1;
			if (want < piece)
				piece = want;
		}
		size_t used = (size_t)-1;
		int rc = chunked_decode(&d, in + pos, piece, &used, &r->out, &r->out_len, &cap, max);
		if (rc > 1) {
			r->rc = rc;
			return; /* the connection fails; consumed is not reported */
		}
		FUZZ_CHECK(used <= piece);
		FUZZ_CHECK(r->out_len <= max);
		FUZZ_CHECK(r->out_len < cap);
		FUZZ_CHECK(r->out[r->out_len] == '\0');
		pos += used;
		if (rc == 1) {
			r->rc = 1;
			break;
		}
		FUZZ_CHECK(used == piece); /* needing more means it took everything */
	}
	r->consumed = pos;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	/* Byte 0: the body limit (small ones reach the 413 paths); byte 1: how
	 * many of the following bytes are cut points. */
	static const size_t maxes[] = {0, 1, 7, 64, 4096, 1 << 20, (size_t)-1 / 2};
	size_t max = maxes[data[0] % (sizeof maxes / sizeof maxes[0])];
	size_t n_cuts = data[1] % 32;
	if (n_cuts > size - 2)
		n_cuts = size - 2;
	const uint8_t *cuts = data + 2;
	const char *in = (const char *)data + 2 + n_cuts;
	size_t len = size - 2 - n_cuts;

	struct result whole, split;
	decode(in, len, max, NULL, 0, &whole);
	decode(in, len, max, cuts, n_cuts, &split);
	FUZZ_CHECK(whole.rc == split.rc);
	if (whole.rc <= 1) {
		FUZZ_CHECK(whole.consumed == split.consumed);
		FUZZ_CHECK(whole.out_len == split.out_len);
		FUZZ_CHECK(!memcmp(whole.out, split.out, whole.out_len));
	}
	free(whole.out);
	free(split.out);
	return 0;
}
