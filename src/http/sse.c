#include "http/sse.h"

#include <stdlib.h>
#include <string.h>

#include "util/grow.h"

void sse_parser_init(struct sse_parser *p, size_t max_event)
{
	memset(p, 0, sizeof *p);
	p->max_event = max_event;
}

void sse_parser_free(struct sse_parser *p)
{
	free(p->buf);
	memset(p, 0, sizeof *p);
}

size_t sse_parser_pending(const struct sse_parser *p)
{
	return p->len;
}

/* Finds the end of the first event in buf: the index just past the blank
 * line, or 0 when no event is complete. Lines end in \n, \r\n or \r. */
static size_t event_end(const char *buf, size_t len, size_t from)
{
	for (size_t i = from; i < len; i++) {
		if (buf[i] == '\n') {
			if (i + 1 < len && buf[i + 1] == '\n')
				return i + 2;
			if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n')
				return i + 3;
		} else if (buf[i] == '\r') {
			if (i + 1 < len && buf[i + 1] == '\r')
				return i + 2;
		}
	}
	return 0;
}

int sse_parser_feed(struct sse_parser *p, const char *data, size_t len, sse_event_fn fn, void *arg)
{
	if (GROW(p->buf, p->cap, p->len + len + 1, 4096) != 0)
		return -1;
	/* Only the new bytes (and the two before them) can complete an event. */
	size_t scan_from = p->len > 2 ? p->len - 2 : 0;
	memcpy(p->buf + p->len, data, len);
	p->len += len;
	size_t start = 0;
	for (;;) {
		size_t from = scan_from > start ? scan_from : start;
		size_t end = event_end(p->buf + start, p->len - start, from - start);
		if (!end)
			break;
		fn(p->buf + start, end, arg);
		start += end;
	}
	if (start) {
		memmove(p->buf, p->buf + start, p->len - start);
		p->len -= start;
	}
	if (p->max_event && p->len > p->max_event)
		return -1;
	return 0;
}

char *sse_event_data(const char *raw, size_t len, size_t *data_len)
{
	char *out = NULL;
	size_t out_len = 0;
	size_t i = 0;
	while (i < len) {
		size_t j = i;
		while (j < len && raw[j] != '\n' && raw[j] != '\r')
			j++;
		/* One line is raw[i..j). */
		if (j - i >= 5 && !memcmp(raw + i, "data", 4) && (raw[i + 4] == ':')) {
			size_t v = i + 5;
			if (v < j && raw[v] == ' ')
				v++;
			size_t n = j - v;
			int sep =
			    out != NULL; /* not the first data line, even if those were empty */
			char *nb = realloc(out, out_len + n + 2);
			if (!nb) {
				free(out);
				return NULL;
			}
			out = nb;
			if (sep)
				out[out_len++] = '\n';
			memcpy(out + out_len, raw + v, n);
			out_len += n;
			out[out_len] = '\0';
		} else if (j - i == 4 && !memcmp(raw + i, "data", 4)) {
			int sep = out != NULL;
			char *nb = realloc(out, out_len + 2);
			if (!nb) {
				free(out);
				return NULL;
			}
			out = nb;
			if (sep)
				out[out_len++] = '\n';
			out[out_len] = '\0';
		}
		if (j < len && raw[j] == '\r' && j + 1 < len && raw[j + 1] == '\n')
			j++;
		i = j + 1;
	}
	if (out && data_len)
		*data_len = out_len;
	if (!out && data_len)
		*data_len = 0;
	return out;
}
