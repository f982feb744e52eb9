/* A small HTTP/1.1 server on libevent bufferevents. It exists (rather than
 * evhttp) so that every limit answers with the daemon's own JSON error shape
 * and so that streamed responses and client disconnects are under our
 * control: a client that goes away must cancel the backend work it caused. */
#ifndef TOKI_HTTP_SERVER_H
#define TOKI_HTTP_SERVER_H

#include <stddef.h>
#include <event2/event.h>

struct http_server;
struct http_request;

struct http_server_limits {
	size_t max_header_bytes; /* a longer head gets 431 */
	size_t max_body_bytes;   /* a longer body gets 413 */
	int max_connections;     /* past this, new connections get 503 and are closed */
	int idle_timeout_s;      /* an idle or slow client (no full head or body) is closed */
};

void http_server_default_limits(struct http_server_limits *limits);

/* The handler owns nothing of req; it must eventually answer it with
 * http_respond() or http_stream_end(), possibly later from other callbacks.
 * A handler that answers later must register a close callback: if the client
 * goes away first, that callback runs, and afterwards req is freed. */
typedef void (*http_handler_fn)(struct http_request *req, void *ctx);
typedef void (*http_close_fn)(struct http_request *req, void *arg);
/* Formats an error body for a status the server itself produces (limits,
 * malformed requests), so that the daemon's error shape is used throughout. */
typedef char *(*http_error_body_fn)(int status, const char *message, const char *path);

struct http_server *http_server_new(struct event_base *base, const struct http_server_limits *limits,
				    http_handler_fn handler, void *ctx, http_error_body_fn error_body);
int http_server_listen(struct http_server *server, const char *host, int port, char *err,
		       size_t errlen);
/* Serves HTTPS instead of HTTP: connections accepted from now on speak TLS
 * (1.2 or later) with this certificate chain and private key, both PEM. Call
 * before listening. 0, or -1 with a message naming the file and OpenSSL's
 * reason. */
int http_server_set_tls(struct http_server *server, const char *cert_path, const char *key_path,
			char *err, size_t errlen);
int http_server_is_tls(const struct http_server *server);
/* CORS as llama-server does it: a preflight (OPTIONS with Origin and
 * Access-Control-Request-Method) is answered 200 before the handler runs,
 * allowing GET, POST, DELETE and OPTIONS with any header; every other answer
 * to a request with an Origin carries Access-Control-Allow-Origin: that
 * origin. The handler still sees, and may refuse, every other request. */
void http_server_set_cors(struct http_server *server, int on);
int http_server_port(const struct http_server *server);
int http_server_connection_count(const struct http_server *server);
/* Stops accepting; open streams keep going. */
void http_server_stop_listening(struct http_server *server);
void http_server_free(struct http_server *server);

const char *http_request_method(const struct http_request *req);
const char *http_request_path(const struct http_request *req);
const char *http_request_query(const struct http_request *req);
const char *http_request_header(const struct http_request *req, const char *name);
/* The body, NUL-terminated for convenience (len excludes the NUL). */
const char *http_request_body(const struct http_request *req, size_t *len);
const char *http_request_peer(const struct http_request *req);

/* Adds a response header (before responding or beginning a stream). */
void http_response_header(struct http_request *req, const char *name, const char *value);
void http_respond(struct http_request *req, int status, const char *content_type, const char *body,
		  size_t len);
void http_respond_error(struct http_request *req, int status, const char *message);
void http_stream_begin(struct http_request *req, int status, const char *content_type);
void http_stream_write(struct http_request *req, const char *data, size_t len);
void http_stream_end(struct http_request *req);
/* Bytes written but not yet taken by the client (a slow reader). */
size_t http_stream_pending(const struct http_request *req);
void http_request_on_close(struct http_request *req, http_close_fn fn, void *arg);

const char *http_status_text(int status);

#endif
