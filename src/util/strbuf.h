#ifndef TOKI_UTIL_STRBUF_H
#define TOKI_UTIL_STRBUF_H

#include <stddef.h>

/* A growable byte buffer that stays NUL-terminated. All-zero is a valid empty
 * buffer; p is NULL until the first append. */
struct strbuf {
	char *p;
	size_t len, cap;
	int failed; /* an append ran out of memory: every later one fails too */
};

void strbuf_init(struct strbuf *b);
/* 0, or -1 when out of memory (the buffer is left as it was, and marked
 * failed, so that a caller may append many pieces and check once). */
int strbuf_append(struct strbuf *b, const char *s, size_t n);
int strbuf_appends(struct strbuf *b, const char *s);
/* Empties the buffer but keeps its memory. */
void strbuf_reset(struct strbuf *b);
void strbuf_free(struct strbuf *b);

#endif
