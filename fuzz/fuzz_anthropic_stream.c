/* The Anthropic stream translator (src/api/anthropic.c) fed whatever a
 * backend streams: the input is a raw SSE byte stream, split into events
 * (src/http/sse.c) and each event's data parsed as a chat chunk, exactly as
 * serve/reply.c does for /v1/messages. What comes out must be well-formed
 * Anthropic SSE: whole "event: T\ndata: {...,"type":"T"}\n\n" events, nothing
 * after message_stop or an error. Each chunk also goes through
 * anthropic_from_chat (a non-streamed answer) and anthropic_dump_json. */
#include <stdint.h>
#include <string.h>

#include "api/anthropic.h"
#include "fuzz_common.h"
#include "http/sse.h"
#include "util/json_body.h"

struct ctx {
	struct anthropic_stream *s;
	struct strbuf out;
	int finished;
};

/* Checks that out[from..] is a sequence of whole, well-formed events. */
static void check_events(const char *p, size_t len)
{
	size_t i = 0;
	while (i < len) {
		FUZZ_CHECK(len - i > 7 && !memcmp(p + i, "event: ", 7));
		const char *nl = memchr(p + i, '\n', len - i);
		FUZZ_CHECK(nl != NULL);
		size_t tlen = (size_t)(nl - (p + i)) - 7;
		const char *type = p + i + 7;
		i = (size_t)(nl - p) + 1;
		FUZZ_CHECK(len - i > 6 && !memcmp(p + i, "data: ", 6));
		const char *end = memchr(p + i, '\n', len - i);
		FUZZ_CHECK(end != NULL && (size_t)(end - p) + 1 < len && end[1] == '\n');
		json_error_t e;
		json_t *d = json_loadb(p + i + 6, (size_t)(end - (p + i + 6)), JSON_ALLOW_NUL, &e);
		FUZZ_CHECK(json_is_object(d));
		const char *dt = json_string_value(json_object_get(d, "type"));
		FUZZ_CHECK(dt && strlen(dt) == tlen && !memcmp(dt, type, tlen));
		json_decref(d);
		i = (size_t)(end - p) + 2;
	}
}

static void feed_chunk(struct ctx *c, const char *data, size_t dl)
{
	size_t before = c->out.len;
	if (!strcmp(data, "[DONE]")) {
		json_t *cache = json_pack("{s:s, s:i}", "route", "hit", "cached", 12);
		FUZZ_CHECK(anthropic_stream_finish(c->s, cache, &c->out) == 0);
		json_decref(cache);
		c->finished = 1;
	} else {
		json_error_t e;
		json_t *chunk = json_loadb(data, dl, JSON_BODY_FLAGS, &e);
		if (!chunk)
			return;
		int was_done = anthropic_stream_done(c->s);
		FUZZ_CHECK(anthropic_stream_feed(c->s, chunk, &c->out) == 0);
		if (was_done)
			FUZZ_CHECK(c->out.len == before);

		/* The same bytes as a whole non-streamed answer. */
		json_t *msg = anthropic_from_chat(chunk, "claude-fuzz", -1, -1);
		if (msg) {
			FUZZ_CHECK(json_is_object(msg));
			char *s = json_dumps(msg, JSON_COMPACT);
			FUZZ_CHECK(s != NULL);
			free(s);
			json_decref(msg);
		}
		msg = anthropic_from_chat(chunk, NULL, 3, 5);
		json_decref(msg);

		/* nlohmann-style dump: must parse back to the same value. */
		char *dump = anthropic_dump_json(chunk);
		FUZZ_CHECK(dump != NULL);
		json_t *back = json_loads(dump, JSON_ALLOW_NUL, &e);
		FUZZ_CHECK(back != NULL);
		FUZZ_CHECK(json_equal(back, chunk));
		json_decref(back);
		free(dump);
		json_decref(chunk);
	}
	check_events(c->out.p ? c->out.p + before : "", c->out.len - before);
}

static void on_event(const char *raw, size_t len, void *arg)
{
	struct ctx *c = arg;
	size_t dl = 0;
	char *data = sse_event_data(raw, len, &dl);
	if (data)
		feed_chunk(c, data, dl);
	free(data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The low bits of the size pick how the stream opens and ends, so the
	 * seeds stay plain SSE captures. */
	struct ctx c = {0};
	c.s = anthropic_stream_new((size & 4) ? "claude-fuzz" : "", (long long)(size % 7) - 1,
				   (long long)(size % 5));
	if (!c.s)
		return 0;
	strbuf_init(&c.out);
	if (size & 1)
		FUZZ_CHECK(anthropic_stream_start(c.s, &c.out) == 0);
	struct sse_parser p;
	sse_parser_init(&p, 64 * 1024 * 1024);
	sse_parser_feed(&p, (const char *)data, size, on_event, &c);
	sse_parser_free(&p);
	size_t before = c.out.len;
	if (!anthropic_stream_done(c.s)) {
		/* The backend went away without [DONE], or ended cleanly. */
		if (size & 2)
			FUZZ_CHECK(anthropic_stream_error(c.s, "api_error", "backend died", &c.out) == 0);
		else
			FUZZ_CHECK(anthropic_stream_finish(c.s, NULL, &c.out) == 0);
		FUZZ_CHECK(anthropic_stream_done(c.s));
	} else {
		/* Over: nothing more may be appended. */
		FUZZ_CHECK(anthropic_stream_finish(c.s, NULL, &c.out) == 0);
		FUZZ_CHECK(c.out.len == before);
	}
	check_events(c.out.p ? c.out.p + before : "", c.out.len - before);
	/* The whole output, start to end. */
	check_events(c.out.p ? c.out.p : "", c.out.len);
	anthropic_stream_free(c.s);
	strbuf_free(&c.out);
	return 0;
}
