/* The request path of `toki serve`: the OpenAI-compatible routes that go
 * through the prefix router, and the llama-server routes passed through. */
#ifndef TOKI_PROXY_H
#define TOKI_PROXY_H

#include <stdint.h>

struct daemon;
struct http_request;

/* The HTTP server's handler: ctx is the daemon. */
void proxy_handle(struct http_request *req, void *ctx);
/* Retries every request waiting for a slot. */
void proxy_retry_waiting(struct daemon *d);
/* Fails requests that waited for a slot longer than the backend timeout. */
void proxy_expire_waiting(struct daemon *d, int64_t now_us);
/* Ends every request in flight (daemon shutdown): streams get a clean end. */
void proxy_abort_all(struct daemon *d, const char *why);

#endif
