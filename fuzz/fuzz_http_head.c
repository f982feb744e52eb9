/* HTTP/1.1 request heads (src/http/http_parse.c): what any local process can
 * send to toki's port. */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "fuzz_common.h"
#include "http/http_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The server hands over a heap copy of exactly the head's bytes. */
	char *buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	struct http_head h;
	int st = http_head_parse(&h, buf, size);
	FUZZ_CHECK(st == 0 || st == 400 || st == 431 || st == 500 || st == 501 || st == 505);
	FUZZ_CHECK(h.n_headers >= 0 && h.n_headers <= HTTP_MAX_HEADERS);
	if (st == 0) {
		FUZZ_CHECK(h.method[0] != '\0');
		FUZZ_CHECK(h.target && h.path && h.query);
		FUZZ_CHECK(h.minor == 0 || h.minor == 1);
		/* The path is the target up to the query. */
		FUZZ_CHECK(strncmp(h.target, h.path, strlen(h.path)) == 0);
		for (int i = 0; i < h.n_headers; i++) {
			FUZZ_CHECK(h.headers[i].name && h.headers[i].value);
			FUZZ_CHECK(h.headers[i].name[0] != '\0');
			FUZZ_CHECK(!strchr(h.headers[i].name, ':'));
			/* A value never carries a line break (no header injection
			 * when it is logged or passed on). */
			FUZZ_CHECK(!strpbrk(h.headers[i].value, "\r\n"));
		}
		/* What the server looks up next. */
		(void)http_head_get(&h, "Content-Length");
		(void)http_head_get(&h, "transfer-encoding");
		(void)http_head_get(&h, "Authorization");
		(void)http_head_get(&h, "x-api-key");
		/* The query parameters the routes read (the endpoint's model=,
		 * /toki/idle's wait_ms=), into a buffer that must hold them. */
		char v[8];
		if (http_query_param(h.query, "model", v, sizeof v))
			FUZZ_CHECK(strlen(v) < sizeof v);
		else
			FUZZ_CHECK(v[0] == '\0');
		(void)http_query_param(h.query, "wait_ms", v, sizeof v);
	}
	/* The caller frees the head whatever the result (http_server.c does). */
	http_head_free(&h);
	free(buf);
	return 0;
}
