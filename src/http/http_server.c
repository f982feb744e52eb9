#include "http/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <netdb.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>

#include "http/http_parse.h"
#include "util/log.h"

/* CONN_LINGER: the answer is out and our side is shut; what the client
 * still sends is read and dropped for a moment, so that closing does not
 * reset the connection before the client has read an early error (413). */
enum conn_state { CONN_HEAD, CONN_BODY, CONN_HANDLING, CONN_CLOSING, CONN_LINGER };

struct http_conn;

struct http_request {
	struct http_conn *conn;
	struct http_head head;
	char *body;
	size_t body_len, body_cap;
	int keep_alive;
	int streaming; /* the head of a chunked response is out */
	int answered;  /* the response is complete */
	struct evbuffer *resp_headers;
	http_close_fn close_fn;
	void *close_arg;
};

struct http_conn {
	struct http_server *server;
	struct bufferevent *bev;
	enum conn_state state;
	struct http_request *req;
	size_t content_length;
	size_t lingered; /* bytes dropped while lingering */
	int chunked;
	struct chunked_decoder chunker;
	char peer[64];
	/* A request's head must arrive whole within the idle timeout, and its
	 * body at a minimum rate: the read timeout alone restarts with every
	 * byte, so a client trickling one byte at a time (slow loris) kept its
	 * connection forever. */
	struct event *deadline;
	LIST_ENTRY(http_conn) link;
};

struct http_server {
	struct event_base *base;
	struct http_server_limits limits;
	http_handler_fn handler;
	void *ctx;
	http_error_body_fn error_body;
	struct evconnlistener *listener;
	int port;
	int n_conns;
	LIST_HEAD(, http_conn) conns;
	SSL_CTX *ssl_ctx; /* NULL: plain HTTP */
	int cors;         /* answer browsers' preflights, as llama-server does */
};

static void conn_read_cb(struct bufferevent *bev, void *arg);
static void conn_write_cb(struct bufferevent *bev, void *arg);
static void conn_event_cb(struct bufferevent *bev, short what, void *arg);

void http_server_default_limits(struct http_server_limits *limits)
{
	limits->max_header_bytes = 64 * 1024;
	limits->max_body_bytes = 64 * 1024 * 1024;
	limits->max_connections = 1024;
	limits->idle_timeout_s = 60;
}

const char *http_status_text(int status)
{
	switch (status) {
	case 100:
		return "Continue";
	case 200:
		return "OK";
	case 201:
		return "Created";
	case 204:
		return "No Content";
	case 400:
		return "Bad Request";
	case 401:
		return "Unauthorized";
	case 403:
		return "Forbidden";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 408:
		return "Request Timeout";
	case 409:
		return "Conflict";
	case 411:
		return "Length Required";
	case 413:
		return "Content Too Large";
	case 429:
		return "Too Many Requests";
	case 431:
		return "Request Header Fields Too Large";
	case 499:
		return "Client Closed Request";
	case 500:
		return "Internal Server Error";
	case 501:
		return "Not Implemented";
	case 502:
		return "Bad Gateway";
	case 503:
		return "Service Unavailable";
	case 504:
		return "Gateway Timeout";
	case 505:
		return "HTTP Version Not Supported";
	default:
		return "Unknown";
	}
}

static void request_free(struct http_request *req)
{
	if (!req)
		return;
	http_head_free(&req->head);
	free(req->body);
	if (req->resp_headers)
		evbuffer_free(req->resp_headers);
	free(req);
}

static void conn_free(struct http_conn *c)
{
	struct http_server *s = c->server;
	if (c->req) {
		struct http_request *req = c->req;
		c->req = NULL;
		/* The client left before its answer was complete: let the handler
		 * cancel what it started, then forget the request. */
		if (!req->answered && req->close_fn)
			req->close_fn(req, req->close_arg);
		request_free(req);
	}
	LIST_REMOVE(c, link);
	s->n_conns--;
	if (c->deadline)
		event_free(c->deadline);
	bufferevent_free(c->bev);
	free(c);
}

static void set_timeouts(struct http_conn *c)
{
	struct timeval idle = {c->server->limits.idle_timeout_s, 0};
	/* While a request is being handled the client owes us nothing, so only a
	 * stalled write (a client that stopped reading) times out. */
	if (c->state == CONN_HANDLING)
		bufferevent_set_timeouts(c->bev, NULL, &idle);
	else
		bufferevent_set_timeouts(c->bev, &idle, &idle);
}

static void conn_fail(struct http_conn *c, int status, const char *message);

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct http_conn *c = arg;
	if (c->state == CONN_BODY ||
	    (c->state == CONN_HEAD && evbuffer_get_length(bufferevent_get_input(c->bev)))) {
		bufferevent_set_timeouts(c->bev, NULL, NULL);
		conn_fail(c, 408, "request timed out");
		struct timeval t = {5, 0};
		bufferevent_set_timeouts(c->bev, NULL, &t);
	} else if (c->state == CONN_HEAD) {
		conn_free(c); /* an idle keep-alive connection: close it quietly */
	}
}

/* Arms the deadline for what the connection reads next: a head (from now),
 * or a body of body_bytes (0: unknown) at no less than 256 KiB/s. */
static void deadline_arm(struct http_conn *c, size_t body_bytes)
{
	if (!c->deadline)
		c->deadline = evtimer_new(c->server->base, deadline_cb, c);
	if (!c->deadline)
		return; /* out of memory: the read timeout still applies */
	long secs = c->server->limits.idle_timeout_s;
	if (c->state == CONN_BODY)
		secs += (long)((body_bytes ? body_bytes : c->server->limits.max_body_bytes) >> 18);
	struct timeval tv = {secs, 0};
	evtimer_add(c->deadline, &tv);
}

static void deadline_clear(struct http_conn *c)
{
	if (c->deadline)
		evtimer_del(c->deadline);
}

/* The request's Origin when CORS is on and it is one that can go back in a
 * header as it is (visible ASCII only), else NULL. */
static const char *cors_origin(const struct http_request *req)
{
	if (!req || !req->conn->server->cors)
		return NULL;
	const char *o = http_request_header(req, "Origin");
	if (!o || !*o)
		return NULL;
	for (const char *p = o; *p; p++)
		if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
			return NULL;
	return o;
}

/* Sends a complete response on a connection without a request object (errors
 * found while parsing), then closes it. */
static void conn_fail(struct http_conn *c, int status, const char *message)
{
	/* Refused before a handler saw it (too large, malformed): logged too. */
	log_warn("%d from %s: %s", status, c->peer, message);
	struct evbuffer *out = bufferevent_get_output(c->bev);
	char *body = c->server->error_body
	                 ? c->server->error_body(status, message, c->req ? c->req->head.path : "")
	                 : NULL;
	const char *b = body ? body : message;
	const char *origin = cors_origin(c->req);
	evbuffer_add_printf(out,
	                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
	                    "Content-Length: %zu\r\n%s%s%sConnection: close\r\n\r\n%s",
	                    status, http_status_text(status), strlen(b),
	                    origin ? "Access-Control-Allow-Origin: " : "", origin ? origin : "",
	                    origin ? "\r\n" : "", b);
	free(body);
	if (c->req) {
		c->req->answered = 1;
		request_free(c->req);
		c->req = NULL;
	}
	c->state = CONN_CLOSING;
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

/* A browser asks before a cross-origin request that carries a token or a
 * JSON body: OPTIONS with Origin and Access-Control-Request-Method, and
 * never a token of its own. It is answered here, before any route and its
 * token check, the way llama-server answers it; the request that follows
 * still needs the token. 1 when answered. */
static int answer_preflight(struct http_request *req)
{
	const char *origin = cors_origin(req);
	if (!origin || strcmp(req->head.method, "OPTIONS") != 0 ||
	    !http_request_header(req, "Access-Control-Request-Method"))
		return 0;
	/* write_head adds Access-Control-Allow-Origin. */
	http_response_header(req, "Access-Control-Allow-Credentials", "true");
	http_response_header(req, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
	http_response_header(req, "Access-Control-Allow-Headers", "*");
	http_respond(req, 200, "text/html", "", 0);
	return 1;
}

static void start_request(struct http_conn *c)
{
	c->state = CONN_HANDLING;
	deadline_clear(c);
	set_timeouts(c);
	if (answer_preflight(c->req))
		return;
	/* Keep reading so that a client's disconnect is seen mid-stream; bytes
	 * of a pipelined next request wait in the input buffer. */
	c->server->handler(c->req, c->server->ctx);
}

/* Returns 1 when the body is complete, 0 when more is needed, -1 when the
 * connection has been failed. */
static int read_body(struct http_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	struct http_request *req = c->req;
	size_t max = c->server->limits.max_body_bytes;
	if (!c->chunked) {
		size_t want = c->content_length - req->body_len;
		size_t have = evbuffer_get_length(in);
		size_t n = have < want ? have : want;
		if (n) {
			evbuffer_remove(in, req->body + req->body_len, n);
			req->body_len += n;
			req->body[req->body_len] = '\0';
		}
		return req->body_len == c->content_length;
	}
	while (evbuffer_get_length(in)) {
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		size_t used = 0;
		int rc = chunked_decode(&c->chunker, v.iov_base, v.iov_len, &used, &req->body,
		                        &req->body_len, &req->body_cap, max);
		evbuffer_drain(in, used);
		if (rc == 1)
			return 1;
		if (rc > 1) {
			conn_fail(c, rc,
			          rc == 413 ? "request body too large" : "malformed chunked body");
			return -1;
		}
	}
	return 0;
}

static void parse_input(struct http_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	const struct http_server_limits *lim = &c->server->limits;
	while (c->state == CONN_HEAD || c->state == CONN_BODY) {
		if (c->state == CONN_HEAD) {
			size_t have = evbuffer_get_length(in);
			if (!have)
				return;
			struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
			size_t head_len;
			if (end.pos >= 0) {
				head_len = (size_t)end.pos + 4;
			} else {
				struct evbuffer_ptr lf = evbuffer_search(in, "\n\n", 2, NULL);
				if (lf.pos < 0) {
					if (have > lim->max_header_bytes)
						conn_fail(c, 431, "request head too large");
					return;
				}
				head_len = (size_t)lf.pos + 2;
			}
			if (head_len > lim->max_header_bytes) {
				conn_fail(c, 431, "request head too large");
				return;
			}
			char *raw = malloc(head_len);
			if (!raw) {
				conn_fail(c, 500, "out of memory");
				return;
			}
			evbuffer_remove(in, raw, head_len);
			struct http_request *req = calloc(1, sizeof *req);
			if (!req) {
				free(raw);
				conn_fail(c, 500, "out of memory");
				return;
			}
			req->conn = c;
			c->req = req;
			int st = http_head_parse(&req->head, raw, head_len);
			free(raw);
			if (st) {
				conn_fail(c, st,
				          st == 431 ? "too many headers" : "malformed request");
				return;
			}
			const char *conn_h = http_head_get(&req->head, "Connection");
			req->keep_alive = req->head.minor >= 1;
			if (conn_h && !strcasecmp(conn_h, "close"))
				req->keep_alive = 0;
			if (conn_h && !strcasecmp(conn_h, "keep-alive"))
				req->keep_alive = 1;
			const char *te = http_head_get(&req->head, "Transfer-Encoding");
			const char *cl = http_head_get(&req->head, "Content-Length");
			c->chunked = 0;
			c->content_length = 0;
			if (te) {
				if (cl || strcasecmp(te, "chunked") != 0) {
					conn_fail(c, 400, "unsupported transfer encoding");
					return;
				}
				c->chunked = 1;
				memset(&c->chunker, 0, sizeof c->chunker);
			} else if (cl) {
				char *e;
				errno = 0;
				unsigned long long n = strtoull(cl, &e, 10);
				if (*cl < '0' || *cl > '9' || *e || errno) {
					conn_fail(c, 400, "bad Content-Length");
					return;
				}
				if (n > lim->max_body_bytes) {
					conn_fail(c, 413, "request body too large");
					return;
				}
				c->content_length = (size_t)n;
			}
			req->body_cap = c->chunked ? 0 : c->content_length + 1;
			req->body = malloc(c->chunked ? 1 : req->body_cap);
			if (!req->body) {
				conn_fail(c, 500, "out of memory");
				return;
			}
			req->body[0] = '\0';
			if (c->chunked)
				req->body_cap = 1;
			const char *expect = http_head_get(&req->head, "Expect");
			if (expect && !strcasecmp(expect, "100-continue") &&
			    (c->chunked || c->content_length))
				evbuffer_add_printf(bufferevent_get_output(c->bev),
				                    "HTTP/1.1 100 Continue\r\n\r\n");
			c->state = CONN_BODY;
			deadline_arm(c, c->chunked ? 0 : c->content_length);
		}
		if (c->state == CONN_BODY) {
			int rc = read_body(c);
			if (rc <= 0)
				return;
			start_request(c);
			return;
		}
	}
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
	struct http_conn *c = arg;
	if (c->state == CONN_LINGER || c->state == CONN_CLOSING) {
		struct evbuffer *in = bufferevent_get_input(bev);
		c->lingered += evbuffer_get_length(in);
		evbuffer_drain(in, evbuffer_get_length(in));
		if (c->lingered > c->server->limits.max_body_bytes + (1u << 20))
			conn_free(c);
		return;
	}
	if (c->state == CONN_HEAD || c->state == CONN_BODY)
		parse_input(c);
	else if (c->state == CONN_HANDLING &&
	         evbuffer_get_length(bufferevent_get_input(bev)) >
	             c->server->limits.max_header_bytes + c->server->limits.max_body_bytes)
		/* A client that floods pipelined bytes while we answer: stop reading. */
		bufferevent_disable(bev, EV_READ);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
	struct http_conn *c = arg;
	if (c->state == CONN_CLOSING && evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
		c->state = CONN_LINGER;
		SSL *ssl = c->server->ssl_ctx ? bufferevent_openssl_get_ssl(bev) : NULL;
		if (ssl)
			SSL_shutdown(ssl); /* close_notify before the TCP half-close */
		shutdown(bufferevent_getfd(bev), SHUT_WR);
		struct timeval t = {2, 0};
		bufferevent_set_timeouts(bev, &t, NULL);
		bufferevent_enable(bev, EV_READ);
	}
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct http_conn *c = arg;
	if (what & BEV_EVENT_CONNECTED)
		return; /* a TLS handshake completed: nothing to do */
	if ((what & BEV_EVENT_TIMEOUT) && (what & BEV_EVENT_READING) && c->state == CONN_CLOSING &&
	    evbuffer_get_length(bufferevent_get_output(bev)))
		return; /* the deadline answered 408 in the same loop turn: send it */
	if (what & BEV_EVENT_TIMEOUT) {
		if (c->state == CONN_BODY ||
		    (c->state == CONN_HEAD && evbuffer_get_length(bufferevent_get_input(bev)))) {
			/* A slow client mid-request: say so, then close. */
			bufferevent_set_timeouts(bev, NULL, NULL);
			conn_fail(c, 408, "request timed out");
			struct timeval t = {5, 0};
			bufferevent_set_timeouts(bev, NULL, &t);
			return;
		}
	}
	if (what & BEV_EVENT_EOF && c->state == CONN_CLOSING &&
	    evbuffer_get_length(bufferevent_get_output(bev)))
		return; /* the client half-closed; finish writing the answer */
	conn_free(c);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
	struct http_server *s = arg;
	struct bufferevent *bev;
	if (s->ssl_ctx) {
		SSL *ssl = SSL_new(s->ssl_ctx);
		if (!ssl) {
			evutil_closesocket(fd);
			return;
		}
		bev =
		    bufferevent_openssl_socket_new(s->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
		                                   BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
		if (bev)
			/* A client that closes without close_notify has still sent a
			 * complete request or nothing: treat it as a plain EOF. */
			bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	} else {
		bev = bufferevent_socket_new(s->base, fd,
		                             BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	}
	if (!bev) {
		evutil_closesocket(fd);
		return;
	}
	struct http_conn *c = calloc(1, sizeof *c);
	if (!c) {
		bufferevent_free(bev);
		return;
	}
	c->server = s;
	c->bev = bev;
	c->state = CONN_HEAD;
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, c->peer, sizeof c->peer);
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, c->peer,
		          sizeof c->peer);
	LIST_INSERT_HEAD(&s->conns, c, link);
	s->n_conns++;
	bufferevent_setcb(bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
	set_timeouts(c);
	deadline_arm(c, 0);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
	if (s->n_conns > s->limits.max_connections) {
		conn_fail(c, 503, "too many connections");
		return;
	}
}

struct http_server *http_server_new(struct event_base *base,
                                    const struct http_server_limits *limits,
                                    http_handler_fn handler, void *ctx,
                                    http_error_body_fn error_body)
{
	struct http_server *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->base = base;
	if (limits)
		s->limits = *limits;
	else
		http_server_default_limits(&s->limits);
	s->handler = handler;
	s->ctx = ctx;
	s->error_body = error_body;
	LIST_INIT(&s->conns);
	return s;
}

int http_server_listen(struct http_server *s, const char *host, int port, char *err, size_t errlen)
{
	struct addrinfo hints = {0}, *ai = NULL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", port);
	int rc = getaddrinfo(host, portstr, &hints, &ai);
	if (rc) {
		snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(rc));
		return -1;
	}
	s->listener = evconnlistener_new_bind(s->base, accept_cb, s,
	                                      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 512,
	                                      ai->ai_addr, (int)ai->ai_addrlen);
	freeaddrinfo(ai);
	if (!s->listener) {
		snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
		return -1;
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&ss, &sl);
	s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
	                                        : ((struct sockaddr_in6 *)&ss)->sin6_port);
	return 0;
}

static void tls_error(char *err, size_t errlen, const char *what, const char *path)
{
	char reason[256] = "unknown error";
	unsigned long e = ERR_peek_last_error();
	if (e)
		ERR_error_string_n(e, reason, sizeof reason);
	ERR_clear_error();
	snprintf(err, errlen, "%s %s: %s", what, path, reason);
}

int http_server_set_tls(struct http_server *s, const char *cert_path, const char *key_path,
                        char *err, size_t errlen)
{
	const char *paths[2] = {cert_path, key_path};
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(paths[i], "r");
		if (!f) {
			snprintf(err, errlen, "cannot read the TLS %s %s: %s",
			         i ? "key" : "certificate", paths[i], strerror(errno));
			return -1;
		}
		fclose(f);
	}
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		tls_error(err, errlen, "cannot set up TLS", "");
		return -1;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1) {
		tls_error(err, errlen, "cannot load the TLS certificate", cert_path);
		SSL_CTX_free(ctx);
		return -1;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1) {
		tls_error(err, errlen, "cannot load the TLS key", key_path);
		SSL_CTX_free(ctx);
		return -1;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		tls_error(err, errlen, "the TLS key does not match the certificate", key_path);
		SSL_CTX_free(ctx);
		return -1;
	}
	if (s->ssl_ctx)
		SSL_CTX_free(s->ssl_ctx);
	s->ssl_ctx = ctx;
	return 0;
}

void http_server_set_cors(struct http_server *s, int on)
{
	s->cors = on != 0;
}

int http_server_is_tls(const struct http_server *s)
{
	return s->ssl_ctx != NULL;
}

int http_server_port(const struct http_server *s)
{
	return s->port;
}

int http_server_connection_count(const struct http_server *s)
{
	return s->n_conns;
}

void http_server_stop_listening(struct http_server *s)
{
	if (s->listener) {
		evconnlistener_free(s->listener);
		s->listener = NULL;
	}
}

void http_server_free(struct http_server *s)
{
	if (!s)
		return;
	http_server_stop_listening(s);
	while (!LIST_EMPTY(&s->conns))
		conn_free(LIST_FIRST(&s->conns));
	if (s->ssl_ctx)
		SSL_CTX_free(s->ssl_ctx);
	free(s);
}

const char *http_request_method(const struct http_request *req)
{
	return req->head.method;
}

const char *http_request_path(const struct http_request *req)
{
	return req->head.path;
}

const char *http_request_query(const struct http_request *req)
{
	return req->head.query;
}

const char *http_request_header(const struct http_request *req, const char *name)
{
	return http_head_get(&req->head, name);
}

const char *http_request_body(const struct http_request *req, size_t *len)
{
	if (len)
		*len = req->body_len;
	return req->body;
}

const char *http_request_peer(const struct http_request *req)
{
	return req->conn->peer;
}

void http_request_on_close(struct http_request *req, http_close_fn fn, void *arg)
{
	req->close_fn = fn;
	req->close_arg = arg;
}

void http_response_header(struct http_request *req, const char *name, const char *value)
{
	if (!req->resp_headers)
		req->resp_headers = evbuffer_new();
	if (req->resp_headers)
		evbuffer_add_printf(req->resp_headers, "%s: %s\r\n", name, value);
}

static void write_head(struct http_request *req, int status, const char *content_type,
                       long long content_length)
{
	struct evbuffer *out = bufferevent_get_output(req->conn->bev);
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, http_status_text(status));
	if (content_type)
		evbuffer_add_printf(out, "Content-Type: %s\r\n", content_type);
	if (content_length >= 0)
		evbuffer_add_printf(out, "Content-Length: %lld\r\n", content_length);
	else
		evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
	if (req->resp_headers)
		evbuffer_add_buffer(out, req->resp_headers);
	/* As llama-server does: a browser page may read any answer, errors
	 * included; what it may do is still decided by the token. */
	const char *origin = cors_origin(req);
	if (origin)
		evbuffer_add_printf(out, "Access-Control-Allow-Origin: %s\r\n", origin);
	evbuffer_add_printf(out, "Connection: %s\r\n\r\n",
	                    req->keep_alive ? "keep-alive" : "close");
}

/* Sends what the output buffer holds now, on a plain connection, rather than
 * on the next turn of the loop: the answer leaves before whatever work the
 * caller does after it, and without waiting for the socket to be reported
 * writable (it almost always is). What the socket does not take stays in
 * the buffer for the bufferevent to send as usual; TLS connections always
 * go through it. */
static void send_now(struct http_conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	if (c->server->ssl_ctx || !evbuffer_get_length(out))
		return;
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	if (fd >= 0)
		evbuffer_write(out, fd); /* -1 with EAGAIN: the rest goes later */
}

/* The answer is complete: free the request, then either close or go on with
 * the next (possibly pipelined) request. */
static void finish_request(struct http_request *req)
{
	struct http_conn *c = req->conn;
	int keep = req->keep_alive;
	req->answered = 1;
	c->req = NULL;
	request_free(req);
	if (!keep) {
		c->state = CONN_CLOSING;
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
			conn_write_cb(c->bev, c);
		return;
	}
	c->state = CONN_HEAD;
	set_timeouts(c);
	deadline_arm(c, 0);
	bufferevent_enable(c->bev, EV_READ);
	parse_input(c);
}

void http_respond(struct http_request *req, int status, const char *content_type, const char *body,
                  size_t len)
{
	if (req->answered || req->streaming)
		return;
	write_head(req, status, content_type, (long long)len);
	if (len && strcmp(req->head.method, "HEAD") != 0)
		evbuffer_add(bufferevent_get_output(req->conn->bev), body, len);
	send_now(req->conn);
	finish_request(req);
}

/* s with control characters as '?', at most n - 1 bytes: for the log. */
static void log_safe(char *out, size_t n, const char *s)
{
	size_t k = 0;
	for (; s && s[k] && k + 1 < n; k++)
		out[k] = (unsigned char)s[k] < 0x20 || s[k] == 0x7f ? '?' : s[k];
	out[k] = '\0';
}

/* What credentials a refused request carried, by kind and length only: the
 * value itself (a wrong token may be a real one, for another service) never
 * goes to the log. */
static void describe_credentials(const struct http_request *req, char *out, size_t n)
{
	const char *authz = http_request_header(req, "Authorization");
	const char *key = http_request_header(req, "x-api-key");
	size_t len = 0;
	if (authz && !strncasecmp(authz, "Bearer ", 7)) {
		const char *t = authz + 7;
		while (*t == ' ')
			t++;
		len = snprintf(out, n, "a Bearer token of %zu characters", strlen(t));
	} else if (authz) {
		char scheme[24];
		log_safe(scheme, sizeof scheme, authz);
		scheme[strcspn(scheme, " ")] = '\0';
		len = snprintf(out, n, "Authorization of scheme '%s' (not Bearer)", scheme);
	}
	if (key && len < n)
		snprintf(out + len, n - len, "%san x-api-key of %zu characters", len ? " and " : "",
		         strlen(key));
	else if (!authz)
		snprintf(out, n, "no token");
}

void http_respond_error(struct http_request *req, int status, const char *message)
{
	struct http_server *s = req->conn->server;
	/* Every error answer is logged with its reason, the route and who asked
	 * (address, user agent): before, a client refused with 401, 404 or 400
	 * left no trace in the log. The query string stays out (some clients
	 * put keys there). */
	if (!req->answered && !req->streaming) {
		char ua[96], msg[400], creds[160] = "";
		log_safe(ua, sizeof ua, http_request_header(req, "User-Agent"));
		log_safe(msg, sizeof msg, message);
		if (status == 401) {
			char what[140];
			describe_credentials(req, what, sizeof what);
			snprintf(creds, sizeof creds, " (sent %s)", what);
		}
		log_warn("%d %s %.200s from %s%s%s: %s%s", status, req->head.method, req->head.path,
		         req->conn->peer, *ua ? ", " : "", ua, msg, creds);
	}
	char *body = s->error_body ? s->error_body(status, message, req->head.path) : NULL;
	if (body) {
		http_respond(req, status, "application/json", body, strlen(body));
		free(body);
	} else {
		http_respond(req, status, "text/plain", message, strlen(message));
	}
}

void http_stream_begin(struct http_request *req, int status, const char *content_type)
{
	if (req->answered || req->streaming)
		return;
	req->streaming = 1;
	write_head(req, status, content_type, -1);
}

void http_stream_write(struct http_request *req, const char *data, size_t len)
{
	if (req->answered || !req->streaming || !len)
		return;
	struct evbuffer *out = bufferevent_get_output(req->conn->bev);
	evbuffer_add_printf(out, "%zx\r\n", len);
	evbuffer_add(out, data, len);
	evbuffer_add(out, "\r\n", 2);
	send_now(req->conn);
}

void http_stream_end(struct http_request *req)
{
	if (req->answered || !req->streaming)
		return;
	evbuffer_add(bufferevent_get_output(req->conn->bev), "0\r\n\r\n", 5);
	send_now(req->conn);
	finish_request(req);
}

size_t http_stream_pending(const struct http_request *req)
{
	return evbuffer_get_length(bufferevent_get_output(req->conn->bev));
}
