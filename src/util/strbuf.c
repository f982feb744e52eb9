#include "util/strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/grow.h"

void strbuf_init(struct strbuf *b)
{
	b->p = NULL;
	b->len = 0;
	b->cap = 0;
	b->failed = 0;
}

int strbuf_append(struct strbuf *b, const char *s, size_t n)
{
	if (b->failed || n > SIZE_MAX - b->len - 1) {
		b->failed = 1;
		return -1;
	}
	if (GROW(b->p, b->cap, b->len + n + 1, 256) != 0) {
		b->failed = 1;
		return -1;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

int strbuf_appends(struct strbuf *b, const char *s)
{
	return strbuf_append(b, s, strlen(s));
}

void strbuf_reset(struct strbuf *b)
{
	b->len = 0;
	if (b->p)
		b->p[0] = '\0';
}

void strbuf_free(struct strbuf *b)
{
	free(b->p);
	strbuf_init(b);
}
