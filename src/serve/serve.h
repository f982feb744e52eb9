/* The request path of `toki serve`: the routes (routes.c) and the life of a
 * routed request (req.c, exec.c, reply.c, wait.c). src/serve/README.md maps
 * where each part lives. */
#ifndef TOKI_SERVE_H
#define TOKI_SERVE_H

#include <stdint.h>

struct daemon;
struct http_request;

/* The queue and the requests in flight, hung on the daemon, and the hook by
 * which the daemon tells the queue that slots changed. 0, or -1 when out of
 * memory. */
int serve_init(struct daemon *d);
void serve_free(struct daemon *d);
/* The HTTP server's handler: ctx is the daemon. */
void serve_handle(struct http_request *req, void *ctx);
/* Fails requests that waited for a slot longer than the backend timeout. */
void serve_expire_waiting(struct daemon *d, int64_t now_us);
/* Daemon shutdown: every request with a client ends (a stream gets a clean
 * end); those already answered (exact mode's tail cut, the settle after a
 * cancel) finish their backend call, so that their slot's record stays
 * true for the saves that follow; then done(arg) runs. Those still out
 * after timeout_ms are ended too. */
void serve_drain(struct daemon *d, const char *why, int timeout_ms, void (*done)(void *arg),
                 void *arg);

#endif
