/* Unit tests for the HTTP request-head parser and the chunked-body decoder
 * (src/http/http_parse.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/http_parse.h"

/* ---------------------------------------------------------------- heads */

static int parse_str(struct http_head *h, const char *s)
{
	return http_head_parse(h, s, strlen(s));
}

/* Parses s, expects the status `want`, and frees whatever the parser kept
 * (the head is freed on every path, as the server does). */
static void expect_status(const char *s, int want)
{
	struct http_head h;
	int rc = parse_str(&h, s);
	if (rc != want)
		fprintf(stderr, "head %s: got %d, want %d\n", s, rc, want);
	assert_int_equal(rc, want);
	http_head_free(&h);
}

static void test_get_with_query(void **state)
{
	struct http_head h;
	const char *s = "GET /v1/models?x=1&y=two HTTP/1.1\r\n"
	                "Host: localhost:8080\r\n"
	                "Accept: */*\r\n"
	                "\r\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_string_equal(h.method, "GET");
	assert_string_equal(h.target, "/v1/models?x=1&y=two");
	assert_string_equal(h.path, "/v1/models");
	assert_string_equal(h.query, "x=1&y=two");
	assert_int_equal(h.minor, 1);
	assert_int_equal(h.n_headers, 2);
	assert_string_equal(h.headers[0].name, "Host");
	assert_string_equal(h.headers[0].value, "localhost:8080");
	assert_string_equal(h.headers[1].name, "Accept");
	assert_string_equal(h.headers[1].value, "*/*");
	http_head_free(&h);
	/* Freed heads are zeroed: freeing twice is harmless. */
	assert_null(h.target);
	assert_int_equal(h.n_headers, 0);
	http_head_free(&h);
}

static void test_post_without_query(void **state)
{
	struct http_head h;
	const char *s = "POST /v1/chat/completions HTTP/1.1\r\n"
	                "Content-Type: application/json\r\n"
	                "Content-Length: 17\r\n"
	                "\r\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_string_equal(h.method, "POST");
	assert_string_equal(h.target, "/v1/chat/completions");
	assert_string_equal(h.path, "/v1/chat/completions");
	assert_non_null(h.query);
	assert_string_equal(h.query, "");
	assert_int_equal(h.n_headers, 2);
	assert_string_equal(http_head_get(&h, "Content-Length"), "17");
	http_head_free(&h);
}

static void test_query_edge_cases(void **state)
{
	struct http_head h;
	/* An empty query after '?', and a second '?' kept in the query. */
	assert_int_equal(parse_str(&h, "GET /a? HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.path, "/a");
	assert_string_equal(h.query, "");
	assert_string_equal(h.target, "/a?");
	http_head_free(&h);
	assert_int_equal(parse_str(&h, "GET /a?b?c=d HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.path, "/a");
	assert_string_equal(h.query, "b?c=d");
	http_head_free(&h);
	assert_int_equal(parse_str(&h, "GET / HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.path, "/");
	assert_int_equal(h.n_headers, 0);
	http_head_free(&h);
}

/* A query's parameter, as the endpoint reads model= and toki serve's
 * /toki/idle wait_ms=. */
static void test_query_param(void **state)
{
	(void)state;
	char out[32];
	assert_int_equal(http_query_param("model=a&wait_ms=250", "wait_ms", out, sizeof out), 1);
	assert_string_equal(out, "250");
	assert_int_equal(http_query_param("model=a&wait_ms=250", "model", out, sizeof out), 1);
	assert_string_equal(out, "a");
	/* Percent-decoded, '+' a space; a '%' without two hex digits stays. */
	assert_int_equal(http_query_param("model=qwen%2Fcoder+7b%zz%4", "model", out, sizeof out),
	                 1);
	assert_string_equal(out, "qwen/coder 7b%zz%4");
	/* A key is matched whole, the first one wins, junk before it is skipped. */
	assert_int_equal(http_query_param("x&amodel=b&model=c&model=d", "model", out, sizeof out),
	                 1);
	assert_string_equal(out, "c");
	/* Absent, empty, cut to fit. */
	assert_int_equal(http_query_param("models=x", "model", out, sizeof out), 0);
	assert_string_equal(out, "");
	assert_int_equal(http_query_param("", "model", out, sizeof out), 0);
	assert_int_equal(http_query_param(NULL, "model", out, sizeof out), 0);
	assert_int_equal(http_query_param("model=", "model", out, sizeof out), 1);
	assert_string_equal(out, "");
	char small[4];
	assert_int_equal(http_query_param("model=abcdef", "model", small, sizeof small), 1);
	assert_string_equal(small, "abc");
}

static void test_bare_lf(void **state)
{
	struct http_head h;
	const char *s = "PUT /x?q HTTP/1.1\nHost: h\nX-Other: y\n\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_string_equal(h.method, "PUT");
	assert_string_equal(h.path, "/x");
	assert_string_equal(h.query, "q");
	assert_int_equal(h.n_headers, 2);
	assert_string_equal(h.headers[0].value, "h");
	assert_string_equal(h.headers[1].name, "X-Other");
	assert_string_equal(h.headers[1].value, "y");
	http_head_free(&h);

	/* Mixed line endings. */
	assert_int_equal(parse_str(&h, "GET / HTTP/1.1\r\nA: 1\nB: 2\r\n\n"), 0);
	assert_int_equal(h.n_headers, 2);
	assert_string_equal(http_head_get(&h, "a"), "1");
	assert_string_equal(http_head_get(&h, "b"), "2");
	http_head_free(&h);
}

static void test_leading_empty_lines(void **state)
{
	struct http_head h;
	assert_int_equal(parse_str(&h, "\r\n\r\nGET /p HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
	assert_string_equal(h.method, "GET");
	assert_string_equal(h.path, "/p");
	assert_int_equal(h.n_headers, 1);
	http_head_free(&h);
	assert_int_equal(parse_str(&h, "\n\nGET /q HTTP/1.0\n\n"), 0);
	assert_string_equal(h.path, "/q");
	assert_int_equal(h.minor, 0);
	http_head_free(&h);
}

static void test_value_whitespace_trimmed(void **state)
{
	struct http_head h;
	const char *s = "GET / HTTP/1.1\r\n"
	                "X-A:   spaced  inner  value \t \r\n"
	                "X-B:\t\ttabbed\r\n"
	                "X-C:nospace\r\n"
	                "X-Empty:    \r\n"
	                "X-Tab: a\tb\r\n"
	                "X-High: caf\xc3\xa9\r\n"
	                "\r\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_int_equal(h.n_headers, 6);
	assert_string_equal(http_head_get(&h, "X-A"), "spaced  inner  value");
	assert_string_equal(http_head_get(&h, "X-B"), "tabbed");
	assert_string_equal(http_head_get(&h, "X-C"), "nospace");
	assert_string_equal(http_head_get(&h, "X-Empty"), "");
	assert_string_equal(http_head_get(&h, "X-Tab"), "a\tb");
	assert_string_equal(http_head_get(&h, "X-High"), "caf\xc3\xa9");
	http_head_free(&h);
}

static void test_get_case_insensitive(void **state)
{
	struct http_head h;
	const char *s = "GET / HTTP/1.1\r\n"
	                "Content-Length: 5\r\n"
	                "x-custom: first\r\n"
	                "X-CUSTOM: second\r\n"
	                "\r\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_string_equal(http_head_get(&h, "content-length"), "5");
	assert_string_equal(http_head_get(&h, "CONTENT-LENGTH"), "5");
	assert_string_equal(http_head_get(&h, "Content-Length"), "5");
	/* The first of repeated headers wins; names keep their case. */
	assert_string_equal(http_head_get(&h, "X-Custom"), "first");
	assert_string_equal(h.headers[2].name, "X-CUSTOM");
	assert_null(http_head_get(&h, "Content-Type"));
	assert_null(http_head_get(&h, "Content-Lengt"));
	assert_null(http_head_get(&h, "Content-Length2"));
	assert_null(http_head_get(&h, ""));
	http_head_free(&h);
}

static void test_versions(void **state)
{
	struct http_head h;
	assert_int_equal(parse_str(&h, "GET / HTTP/1.0\r\n\r\n"), 0);
	assert_int_equal(h.minor, 0);
	http_head_free(&h);
	assert_int_equal(parse_str(&h, "GET / HTTP/1.1\r\n\r\n"), 0);
	assert_int_equal(h.minor, 1);
	http_head_free(&h);

	expect_status("GET / HTTP/2.0\r\n\r\n", 505);
	expect_status("GET / HTTP/1.2\r\n\r\n", 505);
	expect_status("GET / HTTP/1.9\r\n\r\n", 505);
	expect_status("GET / HTTP/0.9\r\n\r\n", 505);
	expect_status("GET / HTTP/3\r\n\r\n", 505);
	expect_status("GET / HTTP/1.10\r\n\r\n", 505);
	/* Not a version at all. */
	expect_status("GET / http/1.1\r\n\r\n", 400);
	expect_status("GET / FTP/1.1\r\n\r\n", 400);
	expect_status("GET / HTTP\r\n\r\n", 400);
	expect_status("GET / HTTP/1.\r\n\r\n", 505);
}

static void test_missing_version(void **state)
{
	expect_status("GET /\r\n\r\n", 400);
	expect_status("GET /\n\n", 400);
	expect_status("GET / \r\n\r\n", 400);
	expect_status("GET\r\n\r\n", 400);
	/* Two spaces: an empty target. */
	expect_status("GET  / HTTP/1.1\r\n\r\n", 400);
	/* No line end at all, and nothing but blank lines. */
	expect_status("GET / HTTP/1.1", 400);
	expect_status("", 400);
	expect_status("\r\n\r\n", 400);
	/* Trailing garbage after the version is refused. */
	struct http_head h;
	assert_int_not_equal(parse_str(&h, "GET / HTTP/1.1 extra\r\n\r\n"), 0);
	http_head_free(&h);
}

static void test_bad_method(void **state)
{
	expect_status("G(T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE:T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE/T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE\"T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE\x01T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE\x7fT / HTTP/1.1\r\n\r\n", 400);
	expect_status("G\xc3\x89T / HTTP/1.1\r\n\r\n", 400);
	expect_status("GE\tT / HTTP/1.1\r\n\r\n", 400);
	/* An empty method. */
	expect_status(" / HTTP/1.1\r\n\r\n", 400);
	/* Odd but legal token characters are kept as sent. */
	struct http_head h;
	assert_int_equal(parse_str(&h, "M-SEARCH! / HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.method, "M-SEARCH!");
	http_head_free(&h);
}

static void test_method_length(void **state)
{
	struct http_head h;
	/* 15 characters fit (the array holds 16 with the terminator). */
	assert_int_equal(parse_str(&h, "ABCDEFGHIJKLMNO / HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.method, "ABCDEFGHIJKLMNO");
	assert_int_equal(strlen(h.method), 15);
	http_head_free(&h);
	expect_status("ABCDEFGHIJKLMNOP / HTTP/1.1\r\n\r\n", 400);
	expect_status("ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\n\r\n", 400);
}

static void test_target(void **state)
{
	expect_status("GET foo HTTP/1.1\r\n\r\n", 400);
	expect_status("GET http://host/ HTTP/1.1\r\n\r\n", 400);
	expect_status("GET ?a=b HTTP/1.1\r\n\r\n", 400);
	expect_status("GET * HTTP/1.1\r\n\r\n", 400);
	/* OPTIONS * is the one target allowed not to start with '/'. */
	struct http_head h;
	assert_int_equal(parse_str(&h, "OPTIONS * HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.target, "*");
	http_head_free(&h);
	/* Control characters and DEL in the target. */
	expect_status("GET /a\x01 HTTP/1.1\r\n\r\n", 400);
	expect_status("GET /a\x7f HTTP/1.1\r\n\r\n", 400);
	expect_status("GET /a\tb HTTP/1.1\r\n\r\n", 400);
	expect_status("GET /a\rb HTTP/1.1\r\n\r\n", 400);
	expect_status("GET /a\x1f HTTP/1.1\r\n\r\n", 400);
	/* A space splits the target: what is left is no version. */
	expect_status("GET /a b HTTP/1.1\r\n\r\n", 400);
	/* Bytes above 127 are not control characters. */
	assert_int_equal(parse_str(&h, "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n"), 0);
	assert_string_equal(h.path, "/caf\xc3\xa9");
	http_head_free(&h);
}

static void test_obs_fold(void **state)
{
	expect_status("GET / HTTP/1.1\r\nX-A: one\r\n two\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nX-A: one\r\n\ttwo\r\n\r\n", 400);
	/* Whitespace before the first header too. */
	expect_status("GET / HTTP/1.1\r\n Host: x\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\n \n\n", 400);
}

static void test_bad_header_lines(void **state)
{
	/* No colon. */
	expect_status("GET / HTTP/1.1\r\nHost\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nHost: a\r\nJunk line\r\n\r\n", 400);
	/* Empty name. */
	expect_status("GET / HTTP/1.1\r\n: value\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\n:\r\n\r\n", 400);
	/* Space in or after the name. */
	expect_status("GET / HTTP/1.1\r\nBad Name: v\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nHost : v\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nHost\t: v\r\n\r\n", 400);
	/* Separators and control characters in the name. */
	expect_status("GET / HTTP/1.1\r\nX(a): v\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nX/a: v\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nX\x01: v\r\n\r\n", 400);
	/* Control characters in the value (tab is allowed). */
	expect_status("GET / HTTP/1.1\r\nX-A: a\x01z\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nX-A: a\rz\r\n\r\n", 400);
	expect_status("GET / HTTP/1.1\r\nX-A: a\x1bz\r\n\r\n", 400);
	/* A header line cut off before its line end. */
	expect_status("GET / HTTP/1.1\r\nHost: a", 400);
	/* A colon inside the value is fine. */
	struct http_head h;
	assert_int_equal(parse_str(&h, "GET / HTTP/1.1\r\nHost: a:8080\r\n\r\n"), 0);
	assert_string_equal(http_head_get(&h, "host"), "a:8080");
	http_head_free(&h);
}

static void test_stops_at_blank_line(void **state)
{
	struct http_head h;
	const char *s = "POST /x HTTP/1.1\r\nA: 1\r\n\r\nnot: a header\r\n\r\n";
	assert_int_equal(parse_str(&h, s), 0);
	assert_int_equal(h.n_headers, 1);
	assert_null(http_head_get(&h, "not"));
	http_head_free(&h);
	/* Only the bytes given are read: a NUL-free buffer without terminator. */
	const char buf[] = "GET /abc HTTP/1.1\r\nA: 1\r\n\r\nGARBAGE";
	assert_int_equal(http_head_parse(&h, buf, strlen("GET /abc HTTP/1.1\r\nA: 1\r\n\r\n")), 0);
	assert_string_equal(http_head_get(&h, "A"), "1");
	http_head_free(&h);
}

static char *many_headers(int n)
{
	size_t cap = 64 + (size_t)n * 32;
	char *s = malloc(cap);
	assert_non_null(s);
	size_t len = (size_t)snprintf(s, cap, "GET / HTTP/1.1\r\n");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, "X-H%d: v%d\r\n", i, i);
	snprintf(s + len, cap - len, "\r\n");
	return s;
}

static void test_header_count_limit(void **state)
{
	struct http_head h;
	char *s = many_headers(HTTP_MAX_HEADERS);
	assert_int_equal(parse_str(&h, s), 0);
	assert_int_equal(h.n_headers, HTTP_MAX_HEADERS);
	assert_string_equal(http_head_get(&h, "x-h0"), "v0");
	assert_string_equal(http_head_get(&h, "X-H99"), "v99");
	http_head_free(&h);
	free(s);

	s = many_headers(HTTP_MAX_HEADERS + 1);
	expect_status(s, 431);
	free(s);
	s = many_headers(HTTP_MAX_HEADERS + 50);
	expect_status(s, 431);
	free(s);
}

/* -------------------------------------------------------------- chunked */

struct body {
	char *data;
	size_t len, cap;
};

static void body_free(struct body *b)
{
	free(b->data);
	memset(b, 0, sizeof *b);
}

/* Feeds in[0..len) in one call. */
static int decode_once(const char *in, size_t len, size_t max, struct body *b, size_t *consumed)
{
	struct chunked_decoder d;
	memset(&d, 0, sizeof d);
	*consumed = (size_t)-1;
	return chunked_decode(&d, in, len, consumed, &b->data, &b->len, &b->cap, max);
}

static int decode_str(const char *in, size_t max, struct body *b, size_t *consumed)
{
	return decode_once(in, strlen(in), max, b, consumed);
}

/* Feeds in[0..len) in pieces: the first `first` bytes, then one byte at a
 * time when `bytewise`, else the rest in one call. Returns the first non-zero
 * status and sets *total_consumed; checks that every call reporting "need
 * more" consumed all it was given. */
static int decode_split(const char *in, size_t len, size_t first, int bytewise, size_t max,
                        struct body *b, size_t *total_consumed)
{
	struct chunked_decoder d;
	memset(&d, 0, sizeof d);
	size_t pos = 0;
	*total_consumed = 0;
	while (pos < len || (pos == 0 && len == 0)) {
		size_t n;
		if (pos == 0 && first > 0)
			n = first;
		else
			n = bytewise ? 1 : len - pos;
		if (n > len - pos)
			n = len - pos;
		size_t used = (size_t)-1;
		int rc = chunked_decode(&d, in + pos, n, &used, &b->data, &b->len, &b->cap, max);
		if (rc != 0) {
			if (rc == 1) {
				assert_true(used <= n);
				*total_consumed += used;
			}
			return rc;
		}
		assert_int_equal(used, n);
		pos += n;
		*total_consumed += used;
		if (len == 0)
			break;
	}
	return 0;
}

static void test_chunked_single(void **state)
{
	const char *in = "5\r\nhello\r\n0\r\n\r\n";
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_int_equal(used, strlen(in));
	assert_int_equal(b.len, 5);
	assert_memory_equal(b.data, "hello", 5);
	assert_int_equal(b.data[5], '\0');
	assert_true(b.cap > b.len);
	body_free(&b);
}

static void test_chunked_many(void **state)
{
	const char *in = "1\r\na\r\n2\r\nbc\r\nA\r\n0123456789\r\nb\r\nABCDEFGHIJK\r\n"
	                 "1f\r\n0123456789abcdef0123456789abcde\r\n0\r\n\r\n";
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_int_equal(used, strlen(in));
	const char *want = "abc0123456789ABCDEFGHIJK0123456789abcdef0123456789abcde";
	assert_int_equal(b.len, strlen(want));
	assert_string_equal(b.data, want);
	body_free(&b);

	/* Upper- and lower-case hex, leading zeros. */
	in = "0000A\r\n0123456789\r\n00f\r\nfffffffffffffff\r\n0\r\n\r\n";
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_int_equal(b.len, 25);
	assert_string_equal(b.data, "0123456789fffffffffffffff");
	body_free(&b);
}

static void test_chunked_large_chunk(void **state)
{
	/* A chunk bigger than the initial buffer makes it grow. */
	size_t n = 10000;
	char *in = malloc(n + 64);
	assert_non_null(in);
	size_t len = (size_t)sprintf(in, "%zx\r\n", n);
	for (size_t i = 0; i < n; i++)
		in[len + i] = (char)('a' + i % 26);
	len += n;
	memcpy(in + len, "\r\n0\r\n\r\n", 7);
	len += 7;
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_once(in, len, 1 << 20, &b, &used), 1);
	assert_int_equal(used, len);
	assert_int_equal(b.len, n);
	assert_true(b.cap > n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(b.data[i], 'a' + i % 26);
	assert_int_equal(b.data[n], '\0');
	body_free(&b);
	free(in);
}

static void test_chunked_extensions(void **state)
{
	const char *in = "5;name=value\r\nhello\r\n6 ; a=\"b\"\r\n world\r\n0;last\r\n\r\n";
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_int_equal(used, strlen(in));
	assert_string_equal(b.data, "hello world");
	body_free(&b);
	in = "3\t;x\r\nabc\r\n0\r\n\r\n";
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_string_equal(b.data, "abc");
	body_free(&b);
}

static void test_chunked_trailers(void **state)
{
	const char *in = "5\r\nhello\r\n0\r\nX-Trailer: a\r\nX-Other: b\r\n\r\n";
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 1);
	assert_int_equal(used, strlen(in));
	assert_string_equal(b.data, "hello");
	body_free(&b);

	/* A trailer line longer than the line buffer is skipped, not refused. */
	char buf[512];
	int k = snprintf(buf, sizeof buf, "3\r\nabc\r\n0\r\nX-Long: ");
	memset(buf + k, 'z', 300);
	k += 300;
	k += snprintf(buf + k, sizeof buf - (size_t)k, "\r\nX-Short: 1\r\n\r\n");
	assert_int_equal(decode_once(buf, (size_t)k, 1 << 20, &b, &used), 1);
	assert_int_equal(used, (size_t)k);
	assert_string_equal(b.data, "abc");
	body_free(&b);
}

static void test_chunked_bare_lf_and_empty(void **state)
{
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str("5\nhello\n0\n\n", 1 << 20, &b, &used), 1);
	assert_int_equal(used, 11);
	assert_string_equal(b.data, "hello");
	body_free(&b);

	/* An empty body: nothing is allocated, nothing appended. */
	assert_int_equal(decode_str("0\r\n\r\n", 1 << 20, &b, &used), 1);
	assert_int_equal(used, 5);
	assert_int_equal(b.len, 0);
	body_free(&b);
}

static void test_chunked_stops_at_end(void **state)
{
	/* Bytes after the body (a pipelined request) are left unconsumed. */
	const char *in = "3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
	struct body b = {0};
	struct chunked_decoder d;
	memset(&d, 0, sizeof d);
	size_t used = 0;
	assert_int_equal(
	    chunked_decode(&d, in, strlen(in), &used, &b.data, &b.len, &b.cap, 1 << 20), 1);
	assert_int_equal(used, strlen("3\r\nabc\r\n0\r\n\r\n"));
	assert_int_equal(d.state, CHUNK_DONE);
	/* A finished decoder consumes nothing more and stays finished. */
	used = 99;
	assert_int_equal(
	    chunked_decode(&d, "5\r\nxxxxx\r\n", 10, &used, &b.data, &b.len, &b.cap, 1 << 20), 1);
	assert_int_equal(used, 0);
	assert_string_equal(b.data, "abc");
	body_free(&b);
}

static void test_chunked_needs_more(void **state)
{
	const char *in = "5\r\nhel";
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str(in, 1 << 20, &b, &used), 0);
	assert_int_equal(used, strlen(in));
	assert_int_equal(b.len, 3);
	assert_memory_equal(b.data, "hel", 3);
	body_free(&b);
	/* Nothing at all. */
	assert_int_equal(decode_once("", 0, 1 << 20, &b, &used), 0);
	assert_int_equal(used, 0);
	body_free(&b);
	/* Missing only the final blank line. */
	assert_int_equal(decode_str("5\r\nhello\r\n0\r\n", 1 << 20, &b, &used), 0);
	assert_string_equal(b.data, "hello");
	body_free(&b);
}

static const char *const split_inputs[] = {
    "5\r\nhello\r\n0\r\n\r\n",
    "1\r\na\r\n2\r\nbc\r\nA\r\n0123456789\r\n0\r\n\r\n",
    "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n",
    "3\nabc\n0\n\n",
    "10\r\n0123456789abcdef\r\n0\r\n\r\n",
};
static const char *const split_bodies[] = {
    "hello", "abc0123456789", "hello world", "abc", "0123456789abcdef",
};

static void test_chunked_every_split(void **state)
{
	for (size_t t = 0; t < sizeof split_inputs / sizeof *split_inputs; t++) {
		const char *in = split_inputs[t];
		size_t len = strlen(in);
		/* One byte at a time. */
		struct body b = {0};
		size_t used;
		assert_int_equal(decode_split(in, len, 0, 1, 1 << 20, &b, &used), 1);
		assert_int_equal(used, len);
		assert_int_equal(b.len, strlen(split_bodies[t]));
		assert_string_equal(b.data, split_bodies[t]);
		body_free(&b);
		/* Two pieces, split at every position. */
		for (size_t k = 1; k < len; k++) {
			assert_int_equal(decode_split(in, len, k, 0, 1 << 20, &b, &used), 1);
			assert_int_equal(used, len);
			assert_string_equal(b.data, split_bodies[t]);
			body_free(&b);
			/* The first k bytes, then the rest one byte at a time. */
			assert_int_equal(decode_split(in, len, k, 1, 1 << 20, &b, &used), 1);
			assert_int_equal(used, len);
			assert_string_equal(b.data, split_bodies[t]);
			body_free(&b);
		}
	}
}

static void test_chunked_errors_bytewise(void **state)
{
	/* Errors are found the same when bytes trickle in. */
	struct body b = {0};
	size_t used;
	const char *in = "5\r\nhelloX\r\n0\r\n\r\n";
	assert_int_equal(decode_split(in, strlen(in), 0, 1, 1 << 20, &b, &used), 400);
	body_free(&b);
	in = "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
	assert_int_equal(decode_split(in, strlen(in), 0, 1, 6, &b, &used), 413);
	body_free(&b);
	in = "zz\r\n";
	assert_int_equal(decode_split(in, strlen(in), 0, 1, 1 << 20, &b, &used), 400);
	body_free(&b);
}

static void test_chunked_bad_hex(void **state)
{
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str("zz\r\nhello\r\n0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("5x\r\nhello\r\n0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("-5\r\nhello\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("0x5\r\nhello\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str(" 5\r\nhello\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str(";ext\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	/* A CR inside the size line is not a line end. */
	assert_int_equal(decode_str("5\rX\nhello\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	/* Bad hex in the second chunk, after good data. */
	assert_int_equal(decode_str("1\r\na\r\ng\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
}

static void test_chunked_size_line_too_long(void **state)
{
	struct body b = {0};
	size_t used;
	char buf[256];
	/* 63 bytes including the CR fit in the line buffer. */
	int k = snprintf(buf, sizeof buf, "5;");
	memset(buf + k, 'e', 60);
	k += 60;
	k += snprintf(buf + k, sizeof buf - (size_t)k, "\r\nhello\r\n0\r\n\r\n");
	assert_int_equal(decode_once(buf, (size_t)k, 1 << 20, &b, &used), 1);
	assert_string_equal(b.data, "hello");
	body_free(&b);
	/* One more does not. */
	k = snprintf(buf, sizeof buf, "5;");
	memset(buf + k, 'e', 61);
	k += 61;
	k += snprintf(buf + k, sizeof buf - (size_t)k, "\r\nhello\r\n0\r\n\r\n");
	assert_int_equal(decode_once(buf, (size_t)k, 1 << 20, &b, &used), 400);
	body_free(&b);
	/* A long line is refused before its end arrives. */
	memset(buf, '1', 200);
	assert_int_equal(decode_once(buf, 200, 1 << 20, &b, &used), 400);
	body_free(&b);
	/* Leading zeros count too. */
	memset(buf, '0', 100);
	memcpy(buf + 100, "5\r\nhello\r\n0\r\n\r\n", 15);
	assert_int_equal(decode_once(buf, 115, 1 << 20, &b, &used), 400);
	body_free(&b);
}

static void test_chunked_missing_crlf_after_data(void **state)
{
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str("5\r\nhelloX\r\n0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	assert_int_equal(decode_str("5\r\nhello\rX\n0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	/* Data longer than its declared size: the extra byte is where the CRLF
	 * belongs. */
	assert_int_equal(decode_str("4\r\nhello\r\n0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
	/* The next size line straight after the data. */
	assert_int_equal(decode_str("5\r\nhello0\r\n\r\n", 1 << 20, &b, &used), 400);
	body_free(&b);
}

static void test_chunked_over_max(void **state)
{
	struct body b = {0};
	size_t used;
	/* A single chunk larger than max. */
	assert_int_equal(decode_str("5\r\nhello\r\n0\r\n\r\n", 4, &b, &used), 413);
	assert_int_equal(b.len, 0);
	body_free(&b);
	/* Exactly max is fine. */
	assert_int_equal(decode_str("5\r\nhello\r\n0\r\n\r\n", 5, &b, &used), 1);
	assert_string_equal(b.data, "hello");
	body_free(&b);
	/* The sum of chunks over max. */
	assert_int_equal(decode_str("3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n", 6, &b, &used), 413);
	assert_int_equal(b.len, 3);
	body_free(&b);
	assert_int_equal(decode_str("3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", 6, &b, &used), 1);
	assert_string_equal(b.data, "abcdef");
	body_free(&b);
	/* The size is judged before the data arrives. */
	assert_int_equal(decode_str("100000\r\n", 1000, &b, &used), 413);
	body_free(&b);
	/* max 0 refuses any data but accepts an empty body. */
	assert_int_equal(decode_str("1\r\na\r\n0\r\n\r\n", 0, &b, &used), 413);
	body_free(&b);
	assert_int_equal(decode_str("0\r\n\r\n", 0, &b, &used), 1);
	body_free(&b);
}

static void test_chunked_size_overflow(void **state)
{
	struct body b = {0};
	size_t used;
	assert_int_equal(decode_str("ffffffffffffffffff\r\nx\r\n", 1 << 20, &b, &used), 413);
	body_free(&b);
	/* With no limit at all the overflow itself must be caught. */
	assert_int_equal(decode_str("ffffffffffffffffff\r\nx\r\n", SIZE_MAX, &b, &used), 413);
	body_free(&b);
	assert_int_equal(decode_str("10000000000000000\r\nx\r\n", SIZE_MAX, &b, &used), 413);
	body_free(&b);
	assert_int_equal(
	    decode_str("fffffffffffffffffffffffffffffffffffff\r\n", SIZE_MAX, &b, &used), 413);
	body_free(&b);
	/* Fed one byte at a time. */
	const char *in = "ffffffffffffffffff\r\nx\r\n";
	assert_int_equal(decode_split(in, strlen(in), 0, 1, SIZE_MAX, &b, &used), 413);
	body_free(&b);
	/* The largest size that fits is not an overflow: it just needs data. */
	if (SIZE_MAX == 0xffffffffffffffffULL) {
		assert_int_equal(decode_str("ffffffffffffffff\r\nab", SIZE_MAX, &b, &used), 0);
		assert_int_equal(used, 20);
		assert_int_equal(b.len, 2);
		body_free(&b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_get_with_query),
	    cmocka_unit_test(test_post_without_query),
	    cmocka_unit_test(test_query_edge_cases),
	    cmocka_unit_test(test_query_param),
	    cmocka_unit_test(test_bare_lf),
	    cmocka_unit_test(test_leading_empty_lines),
	    cmocka_unit_test(test_value_whitespace_trimmed),
	    cmocka_unit_test(test_get_case_insensitive),
	    cmocka_unit_test(test_versions),
	    cmocka_unit_test(test_missing_version),
	    cmocka_unit_test(test_bad_method),
	    cmocka_unit_test(test_method_length),
	    cmocka_unit_test(test_target),
	    cmocka_unit_test(test_obs_fold),
	    cmocka_unit_test(test_bad_header_lines),
	    cmocka_unit_test(test_stops_at_blank_line),
	    cmocka_unit_test(test_header_count_limit),
	    cmocka_unit_test(test_chunked_single),
	    cmocka_unit_test(test_chunked_many),
	    cmocka_unit_test(test_chunked_large_chunk),
	    cmocka_unit_test(test_chunked_extensions),
	    cmocka_unit_test(test_chunked_trailers),
	    cmocka_unit_test(test_chunked_bare_lf_and_empty),
	    cmocka_unit_test(test_chunked_stops_at_end),
	    cmocka_unit_test(test_chunked_needs_more),
	    cmocka_unit_test(test_chunked_every_split),
	    cmocka_unit_test(test_chunked_errors_bytewise),
	    cmocka_unit_test(test_chunked_bad_hex),
	    cmocka_unit_test(test_chunked_size_line_too_long),
	    cmocka_unit_test(test_chunked_missing_crlf_after_data),
	    cmocka_unit_test(test_chunked_over_max),
	    cmocka_unit_test(test_chunked_size_overflow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
