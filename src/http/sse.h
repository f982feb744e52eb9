/* Splits a server-sent-events byte stream into whole events, so that the
 * proxy forwards events intact and can amend the last one. No I/O: the
 * fuzzers feed it arbitrary bytes. */
#ifndef TOKI_SSE_H
#define TOKI_SSE_H

#include <stddef.h>

struct sse_parser {
	char *buf;
	size_t len, cap;
	size_t max_event; /* an event longer than this is an error */
};

/* fn gets each complete event's raw bytes, blank-line terminator included. */
typedef void (*sse_event_fn)(const char *raw, size_t len, void *arg);

void sse_parser_init(struct sse_parser *p, size_t max_event);
void sse_parser_free(struct sse_parser *p);
/* Returns 0, or -1 when an event grows past max_event (or memory runs out). */
int sse_parser_feed(struct sse_parser *p, const char *data, size_t len, sse_event_fn fn, void *arg);
/* Bytes of an unfinished event held back. */
size_t sse_parser_pending(const struct sse_parser *p);

/* The event's data: its `data:` lines joined by '\n', into a new buffer the
 * caller frees. Returns NULL when the event has no data field. */
char *sse_event_data(const char *raw, size_t len, size_t *data_len);

#endif
