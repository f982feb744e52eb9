/* Parsing of HTTP/1.1 request heads and chunked bodies, kept free of I/O so
 * that the fuzzers can drive it with arbitrary bytes. */
#ifndef TOKI_HTTP_PARSE_H
#define TOKI_HTTP_PARSE_H

#include <stddef.h>

#define HTTP_MAX_HEADERS 100

struct http_header {
	char *name;
	char *value;
};

struct http_head {
	char method[16];
	char *target; /* path + query as sent */
	char *path;   /* decoded-free path, without the query */
	char *query;  /* after '?', or "" */
	int minor;    /* HTTP/1.<minor> */
	struct http_header headers[HTTP_MAX_HEADERS];
	int n_headers;
};

/* Parses the request head in buf[0..len) (ending in CRLFCRLF or LFLF, which
 * the caller found). Returns 0, or the HTTP status to answer with: 400 for a
 * malformed head, 431 for too many headers, 501 for an unsupported method,
 * 505 for an unsupported version. On success the head owns its strings. */
int http_head_parse(struct http_head *head, const char *buf, size_t len);
void http_head_free(struct http_head *head);
/* The value of the first `key=` parameter of a query (what follows '?'),
 * percent-decoded and '+' as a space, into out (n bytes, cut to fit): 1, or
 * 0 (out "") when the query has none. */
int http_query_param(const char *query, const char *key, char *out, size_t n);
const char *http_head_get(const struct http_head *head, const char *name);

/* Decodes a chunked body incrementally. Feed it bytes; it appends decoded
 * data to out (growing it, bounded by max) and reports how much input it
 * consumed. */
enum chunked_state { CHUNK_SIZE, CHUNK_DATA, CHUNK_DATA_END, CHUNK_TRAILER, CHUNK_DONE };
struct chunked_decoder {
	enum chunked_state state;
	size_t remaining; /* bytes left in the current chunk */
	size_t line_len;  /* bytes of the current size/trailer line seen */
	char line[64];
};
/* Returns 0 (needs more), 1 (body complete), or an HTTP status on error
 * (400 malformed, 413 over max). *consumed is how much of in was used. */
int chunked_decode(struct chunked_decoder *d, const char *in, size_t len, size_t *consumed,
                   char **out, size_t *out_len, size_t *out_cap, size_t max);

#endif
