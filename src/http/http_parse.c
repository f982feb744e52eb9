#include "http/http_parse.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/grow.h"

static char *dup_range(const char *s, size_t n)
{
	char *p = malloc(n + 1);
	if (!p)
		return NULL;
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

void http_head_free(struct http_head *head)
{
	free(head->target);
	free(head->path);
	free(head->query);
	for (int i = 0; i < head->n_headers; i++) {
		free(head->headers[i].name);
		free(head->headers[i].value);
	}
	memset(head, 0, sizeof *head);
}

static int hex_value(int c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
	                              : -1;
}

int http_query_param(const char *query, const char *key, char *out, size_t n)
{
	size_t kl = strlen(key);
	if (n)
		out[0] = '\0';
	for (const char *k = query; k && *k;) {
		if (!strncmp(k, key, kl) && k[kl] == '=') {
			size_t o = 0;
			for (const char *c = k + kl + 1; *c && *c != '&' && o + 1 < n; c++) {
				int hi = *c == '%' ? hex_value((unsigned char)c[1]) : -1;
				int lo = hi >= 0 ? hex_value((unsigned char)c[2]) : -1;
				if (lo >= 0) {
					out[o++] = (char)(hi * 16 + lo);
					c += 2;
				} else {
					out[o++] = *c == '+' ? ' ' : *c;
				}
			}
			if (n)
				out[o] = '\0';
			return 1;
		}
		k = strchr(k, '&');
		if (k)
			k++;
	}
	return 0;
}

static int is_token_char(int c)
{
	return c > 32 && c < 127 && !strchr("()<>@,;:\\\"/[]?={}", c);
}

/* Finds the end of the line starting at p; sets *next past the line break. */
static const char *line_end(const char *p, const char *end, const char **next)
{
	const char *nl = memchr(p, '\n', (size_t)(end - p));
	if (!nl)
		return NULL;
	*next = nl + 1;
	return (nl > p && nl[-1] == '\r') ? nl - 1 : nl;
}

int http_head_parse(struct http_head *head, const char *buf, size_t len)
{
	memset(head, 0, sizeof *head);
	const char *p = buf, *end = buf + len, *next;
	/* Tolerate empty lines before the request line (RFC 9112 2.2). */
	while (p < end && (*p == '\r' || *p == '\n'))
		p++;
	const char *eol = line_end(p, end, &next);
	if (!eol)
		return 400;

	const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
	if (!sp1 || sp1 == p || (size_t)(sp1 - p) >= sizeof head->method)
		return 400;
	for (const char *c = p; c < sp1; c++)
		if (!is_token_char((unsigned char)*c))
			return 400;
	memcpy(head->method, p, (size_t)(sp1 - p));
	const char *target = sp1 + 1;
	const char *sp2 = memchr(target, ' ', (size_t)(eol - target));
	if (!sp2 || sp2 == target)
		return 400;
	const char *version = sp2 + 1;
	if (eol - version != 8 || memcmp(version, "HTTP/1.", 7) != 0)
		return (eol - version >= 5 && !memcmp(version, "HTTP/", 5)) ? 505 : 400;
	if (version[7] != '0' && version[7] != '1')
		return 505;
	head->minor = version[7] - '0';
	for (const char *c = target; c < sp2; c++)
		if ((unsigned char)*c <= 32 || *c == 127)
			return 400;
	if (*target != '/' && strcmp(head->method, "OPTIONS") != 0)
		return 400;

	head->target = dup_range(target, (size_t)(sp2 - target));
	const char *q = memchr(target, '?', (size_t)(sp2 - target));
	const char *path_end = q ? q : sp2;
	head->path = dup_range(target, (size_t)(path_end - target));
	head->query = q ? dup_range(q + 1, (size_t)(sp2 - q - 1)) : dup_range("", 0);
	if (!head->target || !head->path || !head->query)
		goto oom;

	p = next;
	while (p < end) {
		eol = line_end(p, end, &next);
		if (!eol)
			return 400;
		if (eol == p)
			break; /* the blank line that ends the head */
		if (*p == ' ' || *p == '\t')
			return 400; /* obsolete line folding: refused, as RFC 9112 allows */
		const char *colon = memchr(p, ':', (size_t)(eol - p));
		if (!colon || colon == p)
			return 400;
		for (const char *c = p; c < colon; c++)
			if (!is_token_char((unsigned char)*c))
				return 400;
		const char *v = colon + 1, *ve = eol;
		while (v < ve && (*v == ' ' || *v == '\t'))
			v++;
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			ve--;
		for (const char *c = v; c < ve; c++)
			if ((unsigned char)*c < 32 && *c != '\t')
				return 400;
		if (head->n_headers == HTTP_MAX_HEADERS)
			return 431;
		struct http_header *h = &head->headers[head->n_headers];
		h->name = dup_range(p, (size_t)(colon - p));
		h->value = dup_range(v, (size_t)(ve - v));
		head->n_headers++;
		if (!h->name || !h->value)
			goto oom;
		p = next;
	}
	return 0;
oom:
	return 500;
}

const char *http_head_get(const struct http_head *head, const char *name)
{
	for (int i = 0; i < head->n_headers; i++)
		if (!strcasecmp(head->headers[i].name, name))
			return head->headers[i].value;
	return NULL;
}

static int append(char **out, size_t *len, size_t *cap, const char *data, size_t n, size_t max)
{
	if (*len + n > max)
		return 413;
	if (GROW(*out, *cap, *len + n + 1, 4096) != 0)
		return 500;
	memcpy(*out + *len, data, n);
	*len += n;
	(*out)[*len] = '\0';
	return 0;
}

int chunked_decode(struct chunked_decoder *d, const char *in, size_t len, size_t *consumed,
                   char **out, size_t *out_len, size_t *out_cap, size_t max)
{
	size_t i = 0;
	int rc;
	while (i < len && d->state != CHUNK_DONE) {
		switch (d->state) {
		case CHUNK_SIZE:
		case CHUNK_TRAILER: {
			char c = in[i++];
			if (c != '\n') {
				if (d->line_len + 1 >= sizeof d->line) {
					if (d->state == CHUNK_SIZE)
						return 400;
					continue; /* long trailer lines are skipped, not stored */
				}
				d->line[d->line_len++] = c;
				continue;
			}
			if (d->line_len && d->line[d->line_len - 1] == '\r')
				d->line_len--;
			d->line[d->line_len] = '\0';
			size_t line_len = d->line_len;
			d->line_len = 0;
			if (d->state == CHUNK_TRAILER) {
				if (line_len == 0)
					d->state = CHUNK_DONE;
				continue;
			}
			/* chunk-size [; extensions] */
			size_t size = 0;
			size_t k = 0;
			for (; k < line_len && isxdigit((unsigned char)d->line[k]); k++) {
				if (size > (SIZE_MAX >> 4))
					return 413;
				int v = isdigit((unsigned char)d->line[k])
				            ? d->line[k] - '0'
				            : (tolower((unsigned char)d->line[k]) - 'a' + 10);
				size = (size << 4) | (size_t)v;
			}
			if (k == 0 || (k < line_len && d->line[k] != ';' && d->line[k] != ' ' &&
			               d->line[k] != '\t'))
				return 400;
			if (size > max || *out_len + size > max)
				return 413;
			d->remaining = size;
			d->state = size ? CHUNK_DATA : CHUNK_TRAILER;
			break;
		}
		case CHUNK_DATA: {
			size_t n = len - i < d->remaining ? len - i : d->remaining;
			if ((rc = append(out, out_len, out_cap, in + i, n, max)))
				return rc;
			i += n;
			d->remaining -= n;
			if (!d->remaining)
				d->state = CHUNK_DATA_END;
			break;
		}
		case CHUNK_DATA_END: {
			char c = in[i++];
			if (c == '\r')
				continue;
			if (c != '\n')
				return 400;
			d->state = CHUNK_SIZE;
			break;
		}
		case CHUNK_DONE:
			break;
		}
	}
	*consumed = i;
	return d->state == CHUNK_DONE ? 1 : 0;
}
