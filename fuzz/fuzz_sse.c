/* The backend's server-sent-events stream (src/http/sse.c): llama-server's
 * bytes arrive in arbitrary pieces. The events must not depend on where the
 * pieces were cut; each must end with a blank line; the events plus what is
 * pending must be the input; sse_event_data must be safe on every event. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "http/sse.h"

struct collected {
	char *all; /* every event's bytes, concatenated */
	size_t len, cap;
	size_t n_events;
	uint64_t hash; /* of the event boundaries */
};

static void on_event(const char *raw, size_t len, void *arg)
{
	struct collected *c = arg;
	FUZZ_CHECK(len >= 2);
	char last = raw[len - 1];
	FUZZ_CHECK(last == '\n' || last == '\r');
	if (c->len + len > c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 256;
		while (ncap < c->len + len)
			ncap *= 2;
		c->all = realloc(c->all, ncap);
		FUZZ_CHECK(c->all != NULL);
		c->cap = ncap;
	}
	memcpy(c->all + c->len, raw, len);
	c->len += len;
	c->n_events++;
	c->hash = c->hash * 1000003u + len;

	size_t dl = 12345;
	char *d = sse_event_data(raw, len, &dl);
	if (d) {
		FUZZ_CHECK(dl <= len);
		FUZZ_CHECK(d[dl] == '\0');
		/* The proxy's checks on it. */
		(void)strcmp(d, "[DONE]");
		(void)strstr(d, "\"timings\"");
		free(d);
	} else {
		FUZZ_CHECK(dl == 0);
	}
}

static void run(const char *in, size_t len, const uint8_t *cuts, size_t n_cuts, size_t max_event,
		struct collected *c, size_t *pending, int *failed)
{
	struct sse_parser p;
	sse_parser_init(&p, max_event);
	memset(c, 0, sizeof *c);
	*failed = 0;
	size_t pos = 0, ci = 0;
	while (pos < len) {
		size_t piece = len - pos;
		if (ci < n_cuts) {
			size_t want = (size_t)cuts[ci++] % 23 + 1;
			if (want < piece)
				piece = want;
		}
		if (sse_parser_feed(&p, in + pos, piece, on_event, c) != 0) {
			*failed = 1;
			break;
		}
		pos += piece;
	}
	*pending = sse_parser_pending(&p);
	if (!*failed) {
		/* Nothing lost, nothing invented. */
		FUZZ_CHECK(c->len + *pending == len);
		FUZZ_CHECK(c->len == 0 || !memcmp(c->all, in, c->len));
		FUZZ_CHECK(*pending == 0 || !memcmp(p.buf, in + c->len, *pending));
	}
	sse_parser_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t n_cuts = data[0] % 48;
	if (n_cuts > size - 1)
		n_cuts = size - 1;
	const uint8_t *cuts = data + 1;
	const char *in = (const char *)data + 1 + n_cuts;
	size_t len = size - 1 - n_cuts;

	struct collected whole, split;
	size_t pw, ps;
	int fw, fs;
	run(in, len, NULL, 0, 0, &whole, &pw, &fw);
	run(in, len, cuts, n_cuts, 0, &split, &ps, &fs);
	FUZZ_CHECK(!fw && !fs);
	FUZZ_CHECK(whole.n_events == split.n_events);
	FUZZ_CHECK(whole.hash == split.hash);
	FUZZ_CHECK(pw == ps);
	free(whole.all);
	free(split.all);

	/* With a small event limit: only the error path must be safe. */
	struct collected lim;
	size_t pl;
	int fl;
	run(in, len, cuts, n_cuts, 64, &lim, &pl, &fl);
	free(lim.all);
	return 0;
}
