/* Asynchronous HTTP calls to one llama-server, on libevent's evhttp client
 * with a pool of keep-alive connections. Every call ends in exactly one of
 * on_done or on_error, unless the caller cancels it first. */
#ifndef TOKI_BACKEND_HTTP_H
#define TOKI_BACKEND_HTTP_H

#include <stddef.h>
#include <event2/event.h>

struct backend_http;
struct backend_call;

enum backend_error {
	BACKEND_ERR_CONNECT,  /* refused, unreachable: the backend is down */
	BACKEND_ERR_RESET,    /* the connection broke mid-response */
	BACKEND_ERR_TIMEOUT,  /* no byte for TOKI_BACKEND_TIMEOUT */
	BACKEND_ERR_OTHER,
};
const char *backend_error_text(enum backend_error err);

struct backend_call_handlers {
	/* Status line and headers have arrived (optional). */
	void (*on_head)(struct backend_call *call, int status, void *arg);
	/* Body bytes as they arrive (optional); when set, on_done gets no body. */
	void (*on_data)(struct backend_call *call, const char *data, size_t len, void *arg);
	void (*on_done)(struct backend_call *call, int status, const char *body, size_t len,
			void *arg);
	void (*on_error)(struct backend_call *call, enum backend_error err, void *arg);
};

/* url: http://host:port[/base]. timeout_s: per-read idle limit. */
struct backend_http *backend_http_new(struct event_base *base, const char *url, int timeout_s,
				      char *err, size_t errlen);
void backend_http_free(struct backend_http *bh);
/* Adds a header to every call this client makes from now on (a client of a
 * toki daemon sends its token this way). name and value are copied; a second
 * call with the same name replaces the value. 0, or -1 when out of memory. */
int backend_http_set_header(struct backend_http *bh, const char *name, const char *value);
const char *backend_http_url(const struct backend_http *bh);
/* At most n connections open at once (0: no limit); calls beyond wait, in
 * order, for one to come free. llama-server serves each connection on a
 * thread of a small pool for as long as the connection stays open, so a
 * client that opens more than the pool has starves itself. */
void backend_http_set_max_connections(struct backend_http *bh, int n);

/* Starts a call. method: "GET" or "POST". body may be NULL. The handlers
 * struct must outlive the call. Returns NULL only on allocation failure. */
struct backend_call *backend_call_start(struct backend_http *bh, const char *method,
					const char *path, const char *body, size_t len,
					const struct backend_call_handlers *h, void *arg);
/* Cancels a call in flight: no handler runs afterwards, and the backend sees
 * the connection close (llama-server then stops generating). Safe from any
 * callback, including the call's own. */
void backend_call_cancel(struct backend_call *call);
const char *backend_call_header(const struct backend_call *call, const char *name);

#endif
