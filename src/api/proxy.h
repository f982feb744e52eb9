/* The request path of `toki serve`: the OpenAI-compatible routes that go
 * through the prefix router, and the llama-server routes passed through. */
#ifndef TOKI_PROXY_H
#define TOKI_PROXY_H

struct daemon;
struct http_request;

/* The HTTP server's handler: ctx is the daemon. */
void proxy_handle(struct http_request *req, void *ctx);
/* Retries every request waiting for a slot. */
void proxy_retry_waiting(struct daemon *d);
/* Ends every request in flight (daemon shutdown): streams get a clean end. */
void proxy_abort_all(struct daemon *d, const char *why);

#endif
