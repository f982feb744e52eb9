/* Unit tests for the server-sent-events splitter (src/http/sse.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/sse.h"

/* Collects every event the parser hands out, as copies. */
#define MAX_EVENTS 64
struct events {
	char *raw[MAX_EVENTS];
	size_t len[MAX_EVENTS];
	int n;
};

static void on_event(const char *raw, size_t len, void *arg)
{
	struct events *ev = arg;
	assert_true(ev->n < MAX_EVENTS);
	assert_true(len > 0);
	ev->raw[ev->n] = malloc(len + 1);
	assert_non_null(ev->raw[ev->n]);
	memcpy(ev->raw[ev->n], raw, len);
	ev->raw[ev->n][len] = '\0';
	ev->len[ev->n] = len;
	ev->n++;
}

static void events_free(struct events *ev)
{
	for (int i = 0; i < ev->n; i++)
		free(ev->raw[i]);
	memset(ev, 0, sizeof *ev);
}

static int feed_str(struct sse_parser *p, const char *s, struct events *ev)
{
	return sse_parser_feed(p, s, strlen(s), on_event, ev);
}

static void expect_events(const struct events *ev, const char *const *want, int n_want)
{
	if (ev->n != n_want) {
		fprintf(stderr, "got %d events, want %d\n", ev->n, n_want);
		for (int i = 0; i < ev->n; i++)
			fprintf(stderr, "  [%d] %zu bytes\n", i, ev->len[i]);
	}
	assert_int_equal(ev->n, n_want);
	for (int i = 0; i < n_want; i++) {
		assert_int_equal(ev->len[i], strlen(want[i]));
		assert_memory_equal(ev->raw[i], want[i], ev->len[i]);
	}
}

static void test_split_lf(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	assert_int_equal(feed_str(&p, "data: one\n\n", &ev), 0);
	const char *want1[] = {"data: one\n\n"};
	expect_events(&ev, want1, 1);
	assert_int_equal(sse_parser_pending(&p), 0);
	/* A lone line end ends a line, not the event. */
	assert_int_equal(feed_str(&p, "event: x\ndata: two\n", &ev), 0);
	assert_int_equal(ev.n, 1);
	assert_int_equal(sse_parser_pending(&p), strlen("event: x\ndata: two\n"));
	assert_int_equal(feed_str(&p, "\n", &ev), 0);
	const char *want2[] = {"data: one\n\n", "event: x\ndata: two\n\n"};
	expect_events(&ev, want2, 2);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	sse_parser_free(&p);
	assert_null(p.buf);
	assert_int_equal(sse_parser_pending(&p), 0);
}

static void test_split_crlf(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	assert_int_equal(feed_str(&p, "data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", &ev), 0);
	const char *want[] = {"data: a\r\ndata: b\r\n\r\n", "data: c\r\n\r\n"};
	expect_events(&ev, want, 2);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_split_cr(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	assert_int_equal(feed_str(&p, "data: a\rdata: b\r\rdata: c\r\r", &ev), 0);
	const char *want[] = {"data: a\rdata: b\r\r", "data: c\r\r"};
	expect_events(&ev, want, 2);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_mixed_line_ends(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	/* A CRLF line followed by a LF blank line, and the other way round. */
	assert_int_equal(feed_str(&p, "data: a\r\n\ndata: b\n\r\n", &ev), 0);
	const char *want[] = {"data: a\r\n\n", "data: b\n\r\n"};
	expect_events(&ev, want, 2);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_many_events_one_feed(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	const char *in = "data: {\"a\":1}\n\n"
			 ": keep-alive\n\n"
			 "event: done\ndata: [DONE]\n\n"
			 "data: partial";
	assert_int_equal(feed_str(&p, in, &ev), 0);
	const char *want[] = {"data: {\"a\":1}\n\n", ": keep-alive\n\n",
			      "event: done\ndata: [DONE]\n\n"};
	expect_events(&ev, want, 3);
	/* The unfinished event is held back, and completes later. */
	assert_int_equal(sse_parser_pending(&p), strlen("data: partial"));
	assert_int_equal(feed_str(&p, " end\n\ndata: x\n\n", &ev), 0);
	const char *want2[] = {"data: {\"a\":1}\n\n", ": keep-alive\n\n",
			       "event: done\ndata: [DONE]\n\n", "data: partial end\n\n", "data: x\n\n"};
	expect_events(&ev, want2, 5);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_empty_feed(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 16);
	assert_int_equal(sse_parser_feed(&p, "", 0, on_event, &ev), 0);
	assert_int_equal(ev.n, 0);
	assert_int_equal(sse_parser_pending(&p), 0);
	assert_int_equal(feed_str(&p, "data: a\n", &ev), 0);
	assert_int_equal(sse_parser_feed(&p, "", 0, on_event, &ev), 0);
	assert_int_equal(ev.n, 0);
	assert_int_equal(sse_parser_pending(&p), 8);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_large_event(void **state)
{
	/* An event bigger than the initial buffer arrives intact. */
	size_t n = 20000;
	char *in = malloc(n + 16);
	assert_non_null(in);
	memcpy(in, "data: ", 6);
	for (size_t i = 6; i < n; i++)
		in[i] = (char)('a' + i % 26);
	memcpy(in + n, "\n\n", 2);
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	for (size_t off = 0; off < n + 2; off += 1000) {
		size_t k = n + 2 - off < 1000 ? n + 2 - off : 1000;
		assert_int_equal(sse_parser_feed(&p, in + off, k, on_event, &ev), 0);
	}
	assert_int_equal(ev.n, 1);
	assert_int_equal(ev.len[0], n + 2);
	assert_memory_equal(ev.raw[0], in, n + 2);
	events_free(&ev);
	sse_parser_free(&p);
	free(in);
}

/* Each stream, fed whole, in two pieces split anywhere, in three pieces, and
 * byte by byte, must give the same events. */
struct stream_case {
	const char *in;
	const char *events[6];
	int n_events;
	size_t pending;
};

static const struct stream_case streams[] = {
	{"data: one\n\ndata: two\n\n", {"data: one\n\n", "data: two\n\n"}, 2, 0},
	{"data: one\r\n\r\nevent: e\r\ndata: two\r\n\r\n",
	 {"data: one\r\n\r\n", "event: e\r\ndata: two\r\n\r\n"},
	 2,
	 0},
	{"data: one\r\rdata: two\rdata: 2b\r\r", {"data: one\r\r", "data: two\rdata: 2b\r\r"}, 2, 0},
	{"a\n\nb\n\nc\n\n", {"a\n\n", "b\n\n", "c\n\n"}, 3, 0},
	{"data: x\r\n\r\n: c\r\n\r\ndata: y\r\n\r\ndata: tail", {"data: x\r\n\r\n", ": c\r\n\r\n", "data: y\r\n\r\n"},
	 3,
	 10},
	{"\n\ndata: z\n\n", {"\n\n", "data: z\n\n"}, 2, 0},
};

static void run_pieces(const struct stream_case *sc, const size_t *cuts, int n_cuts)
{
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 0);
	size_t len = strlen(sc->in), pos = 0;
	for (int c = 0; c <= n_cuts; c++) {
		size_t end = c < n_cuts ? cuts[c] : len;
		assert_int_equal(sse_parser_feed(&p, sc->in + pos, end - pos, on_event, &ev), 0);
		pos = end;
	}
	expect_events(&ev, sc->events, sc->n_events);
	assert_int_equal(sse_parser_pending(&p), sc->pending);
	events_free(&ev);
	sse_parser_free(&p);
}

static void test_every_split_position(void **state)
{
	for (size_t t = 0; t < sizeof streams / sizeof *streams; t++) {
		const struct stream_case *sc = &streams[t];
		size_t len = strlen(sc->in);
		run_pieces(sc, NULL, 0);
		for (size_t i = 0; i <= len; i++) {
			size_t cut[1] = {i};
			run_pieces(sc, cut, 1);
			for (size_t j = i; j <= len; j++) {
				size_t cuts[2] = {i, j};
				run_pieces(sc, cuts, 2);
			}
		}
		/* Byte by byte. */
		size_t *all = malloc(len * sizeof *all + 1);
		assert_non_null(all);
		for (size_t i = 0; i < len; i++)
			all[i] = i + 1;
		run_pieces(sc, all, (int)len);
		free(all);
	}
}

static void test_max_event(void **state)
{
	struct sse_parser p;
	struct events ev = {0};
	/* Up to max_event bytes may wait for the rest of an event. */
	sse_parser_init(&p, 16);
	assert_int_equal(sse_parser_feed(&p, "0123456789abcdef", 16, on_event, &ev), 0);
	assert_int_equal(sse_parser_pending(&p), 16);
	assert_int_equal(sse_parser_feed(&p, "g", 1, on_event, &ev), -1);
	assert_int_equal(ev.n, 0);
	sse_parser_free(&p);

	/* Growing past it in one feed. */
	sse_parser_init(&p, 16);
	assert_int_equal(sse_parser_feed(&p, "0123456789abcdefg", 17, on_event, &ev), -1);
	sse_parser_free(&p);

	/* Growing past it over several feeds. */
	sse_parser_init(&p, 16);
	assert_int_equal(feed_str(&p, "data: 1234", &ev), 0);
	assert_int_equal(feed_str(&p, "567", &ev), 0);
	assert_int_equal(feed_str(&p, "89ab", &ev), -1);
	sse_parser_free(&p);

	/* Complete events leave the buffer: many short events are fine even
	 * when together they pass the limit. */
	sse_parser_init(&p, 16);
	for (int i = 0; i < 20; i++)
		assert_int_equal(feed_str(&p, "data: 123456\n\n", &ev), 0);
	assert_int_equal(ev.n, 20);
	assert_int_equal(sse_parser_pending(&p), 0);
	events_free(&ev);
	/* What counts is what is left after the complete events. */
	assert_int_equal(feed_str(&p, "data: 1\n\n0123456789abcdef", &ev), 0);
	assert_int_equal(ev.n, 1);
	assert_int_equal(sse_parser_pending(&p), 16);
	assert_int_equal(feed_str(&p, "x", &ev), -1);
	events_free(&ev);
	sse_parser_free(&p);

	/* max_event 0: no limit. */
	sse_parser_init(&p, 0);
	char big[10000];
	memset(big, 'x', sizeof big);
	assert_int_equal(sse_parser_feed(&p, big, sizeof big, on_event, &ev), 0);
	assert_int_equal(sse_parser_pending(&p), sizeof big);
	assert_int_equal(ev.n, 0);
	sse_parser_free(&p);
}

/* ----------------------------------------------------------- event data */

static void expect_data(const char *raw, const char *want)
{
	size_t n = 12345;
	char *d = sse_event_data(raw, strlen(raw), &n);
	if (!want) {
		assert_null(d);
		assert_int_equal(n, 0);
		return;
	}
	assert_non_null(d);
	assert_int_equal(n, strlen(want));
	assert_memory_equal(d, want, n);
	assert_int_equal(d[n], '\0');
	free(d);
}

static void test_data_one_line(void **state)
{
	expect_data("data: {\"x\":1}\n\n", "{\"x\":1}");
	expect_data("data: {\"x\":1}\r\n\r\n", "{\"x\":1}");
	expect_data("data: {\"x\":1}\r\r", "{\"x\":1}");
	/* Without a trailing line end. */
	expect_data("data: tail", "tail");
	/* Other fields around it. */
	expect_data("event: message\nid: 7\ndata: hi\nretry: 10\n\n", "hi");
}

static void test_data_many_lines(void **state)
{
	expect_data("data: a\ndata: b\ndata: c\n\n", "a\nb\nc");
	expect_data("data: a\r\ndata: b\r\n\r\n", "a\nb");
	expect_data("data: a\rdata: b\r\r", "a\nb");
	expect_data("data: first\nevent: x\ndata: second\n\n", "first\nsecond");
	/* Empty data lines keep their place. */
	expect_data("data: a\ndata:\ndata: b\n\n", "a\n\nb");
	expect_data("data\ndata: b\n\n", "\nb");
	expect_data("data: a\ndata\n\n", "a\n");
}

static void test_data_space(void **state)
{
	expect_data("data:nospace\n\n", "nospace");
	expect_data("data: one space\n\n", "one space");
	/* Only one space is taken off. */
	expect_data("data:  two\n\n", " two");
	expect_data("data:\tx\n\n", "\tx");
	expect_data("data: \n\n", "");
	expect_data("data:\n\n", "");
	expect_data("data\n\n", "");
	/* Colons after the first belong to the value. */
	expect_data("data: a: b\n\n", "a: b");
}

static void test_data_comments_and_none(void **state)
{
	expect_data(": comment\ndata: x\n: another\n\n", "x");
	expect_data(": data: not data\ndata: y\n\n", "y");
	/* No data field at all. */
	expect_data(": keep-alive\n\n", NULL);
	expect_data("event: ping\nid: 3\n\n", NULL);
	expect_data("\n\n", NULL);
	expect_data("", NULL);
	/* Fields that only start like data. */
	expect_data("datum: x\n\n", NULL);
	expect_data("data-x: y\n\n", NULL);
	expect_data("Data: x\n\n", NULL);
	expect_data(" data: x\n\n", NULL);
	expect_data("dat\n\n", NULL);
	/* data_len may be NULL. */
	char *d = sse_event_data("data: q\n\n", 9, NULL);
	assert_non_null(d);
	assert_string_equal(d, "q");
	free(d);
	assert_null(sse_event_data(": c\n\n", 5, NULL));
}

static void test_data_respects_length(void **state)
{
	/* Only raw[0..len) is read. */
	const char raw[] = "data: abcdef\n\n";
	size_t n;
	char *d = sse_event_data(raw, 9, &n);
	assert_non_null(d);
	assert_int_equal(n, 3);
	assert_string_equal(d, "abc");
	free(d);
	d = sse_event_data(raw, 4, &n);
	assert_non_null(d);
	assert_int_equal(n, 0);
	free(d);
	assert_null(sse_event_data(raw, 3, &n));
	assert_int_equal(n, 0);
}

static void test_parser_then_data(void **state)
{
	/* The raw bytes an event hands out parse to the data sent. */
	struct sse_parser p;
	struct events ev = {0};
	sse_parser_init(&p, 1024);
	assert_int_equal(feed_str(&p, "data: {\"choices\":[]}\r\n\r\ndata: [DONE]\r\n\r\n", &ev), 0);
	assert_int_equal(ev.n, 2);
	size_t n;
	char *d = sse_event_data(ev.raw[0], ev.len[0], &n);
	assert_non_null(d);
	assert_string_equal(d, "{\"choices\":[]}");
	free(d);
	d = sse_event_data(ev.raw[1], ev.len[1], &n);
	assert_non_null(d);
	assert_string_equal(d, "[DONE]");
	free(d);
	events_free(&ev);
	sse_parser_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split_lf),
		cmocka_unit_test(test_split_crlf),
		cmocka_unit_test(test_split_cr),
		cmocka_unit_test(test_mixed_line_ends),
		cmocka_unit_test(test_many_events_one_feed),
		cmocka_unit_test(test_empty_feed),
		cmocka_unit_test(test_large_event),
		cmocka_unit_test(test_every_split_position),
		cmocka_unit_test(test_max_event),
		cmocka_unit_test(test_data_one_line),
		cmocka_unit_test(test_data_many_lines),
		cmocka_unit_test(test_data_space),
		cmocka_unit_test(test_data_comments_and_none),
		cmocka_unit_test(test_data_respects_length),
		cmocka_unit_test(test_parser_then_data),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
