#include "backend/backend_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "util/log.h"

/* A connection in the pool is owned by at most one call at a time. */
struct pooled_conn {
	struct evhttp_connection *evcon;
	struct pooled_conn *next;
	int used; /* it has carried a request before: the peer may have closed it */
};

struct backend_http {
	struct event_base *base;
	char *url;
	char *host;
	int port;
	char *base_path; /* "" or "/prefix" */
	int timeout_s;
	struct pooled_conn *idle;
	int n_open;
	int max_open; /* 0: no limit */
	/* Calls waiting for a connection, oldest first. */
	TAILQ_HEAD(, backend_call) waiting;
	struct event *kick;              /* starts waiting calls outside libevent's callbacks */
	LIST_HEAD(, backend_call) calls; /* every call not yet freed, for backend_http_free */
	struct evkeyvalq extra_headers;  /* added to every call */
};

struct backend_call {
	struct backend_http *bh;
	struct pooled_conn *conn;
	struct evhttp_request *req; /* owned by libevent until it completes */
	const struct backend_call_handlers *h;
	void *arg;
	struct evbuffer *body;
	enum backend_error err;
	int status;
	int cancelled;
	int finished;
	int retried;
	int queued; /* on the waiting list, no connection yet */
	LIST_ENTRY(backend_call) call_link;
	TAILQ_ENTRY(backend_call) wait_link; /* on bh->waiting while queued */
	struct event *deferred;              /* for cancellation outside libevent's callbacks */
	/* What was sent, kept to send it again once (see on_done_cb). */
	enum evhttp_cmd_type type;
	char *uri;
	char *payload;
	size_t payload_len;
	int has_payload;
};

const char *backend_error_text(enum backend_error err)
{
	switch (err) {
	case BACKEND_ERR_CONNECT:
		return "backend unreachable";
	case BACKEND_ERR_RESET:
		return "backend connection broke";
	case BACKEND_ERR_TIMEOUT:
		return "backend timed out";
	default:
		return "backend error";
	}
}

struct backend_http *backend_http_new(struct event_base *base, const char *url, int timeout_s,
                                      char *err, size_t errlen)
{
	struct evhttp_uri *uri = evhttp_uri_parse(url);
	if (!uri || !evhttp_uri_get_host(uri) || !evhttp_uri_get_scheme(uri) ||
	    strcmp(evhttp_uri_get_scheme(uri), "http") != 0) {
		snprintf(err, errlen, "bad backend URL '%s' (want http://host:port)", url);
		if (uri)
			evhttp_uri_free(uri);
		return NULL;
	}
	struct backend_http *bh = calloc(1, sizeof *bh);
	if (!bh) {
		evhttp_uri_free(uri);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	bh->base = base;
	bh->url = strdup(url);
	bh->host = strdup(evhttp_uri_get_host(uri));
	bh->port = evhttp_uri_get_port(uri) > 0 ? evhttp_uri_get_port(uri) : 80;
	const char *p = evhttp_uri_get_path(uri);
	bh->base_path = strdup(p ? p : "");
	size_t bl = strlen(bh->base_path);
	while (bl && bh->base_path[bl - 1] == '/')
		bh->base_path[--bl] = '\0';
	bh->timeout_s = timeout_s;
	TAILQ_INIT(&bh->extra_headers);
	TAILQ_INIT(&bh->waiting);
	LIST_INIT(&bh->calls);
	evhttp_uri_free(uri);
	/* Strip the trailing slash from the URL we report. */
	size_t ul = strlen(bh->url);
	while (ul && bh->url[ul - 1] == '/')
		bh->url[--ul] = '\0';
	return bh;
}

static void call_free(struct backend_call *call);

void backend_http_free(struct backend_http *bh)
{
	if (!bh)
		return;
	/* Calls still out (a health check at shutdown, a cancel whose deferred
	 * end has not run): their connections go, with the requests libevent
	 * holds on them, and no handler runs. */
	struct backend_call *call;
	while ((call = LIST_FIRST(&bh->calls))) {
		if (call->conn) {
			evhttp_connection_free(call->conn->evcon);
			free(call->conn);
			call->conn = NULL;
			call->req = NULL;
		}
		call_free(call);
	}
	while (bh->idle) {
		struct pooled_conn *c = bh->idle;
		bh->idle = c->next;
		evhttp_connection_free(c->evcon);
		free(c);
	}
	if (bh->kick)
		event_free(bh->kick);
	evhttp_clear_headers(&bh->extra_headers);
	free(bh->url);
	free(bh->host);
	free(bh->base_path);
	free(bh);
}

const char *backend_http_url(const struct backend_http *bh)
{
	return bh->url;
}

int backend_http_set_header(struct backend_http *bh, const char *name, const char *value)
{
	evhttp_remove_header(&bh->extra_headers, name);
	return evhttp_add_header(&bh->extra_headers, name, value) == 0 ? 0 : -1;
}

static struct pooled_conn *conn_take(struct backend_http *bh)
{
	if (bh->idle) {
		struct pooled_conn *c = bh->idle;
		bh->idle = c->next;
		return c;
	}
	struct pooled_conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->evcon = evhttp_connection_base_new(bh->base, NULL, bh->host, (unsigned short)bh->port);
	if (!c->evcon) {
		free(c);
		return NULL;
	}
	evhttp_connection_set_timeout(c->evcon, bh->timeout_s);
	evhttp_connection_set_retries(c->evcon, 0);
	bh->n_open++;
	return c;
}

static void conn_give_back(struct backend_http *bh, struct pooled_conn *c, int reusable)
{
	if (!reusable) {
		evhttp_connection_free(c->evcon);
		free(c);
		bh->n_open--;
	} else {
		c->used = 1;
		c->next = bh->idle;
		bh->idle = c;
	}
	if (!TAILQ_EMPTY(&bh->waiting) && bh->kick)
		event_active(bh->kick, 0, 0);
}

static int conn_available(const struct backend_http *bh)
{
	return bh->idle || !bh->max_open || bh->n_open < bh->max_open;
}

static void call_free(struct backend_call *call)
{
	LIST_REMOVE(call, call_link);
	if (call->body)
		evbuffer_free(call->body);
	if (call->deferred)
		event_free(call->deferred);
	free(call->uri);
	free(call->payload);
	free(call);
}

static int call_send(struct backend_call *call, struct pooled_conn *conn);

static int on_header_cb(struct evhttp_request *req, void *arg)
{
	struct backend_call *call = arg;
	call->status = evhttp_request_get_response_code(req);
	if (call->h->on_head && !call->cancelled)
		call->h->on_head(call, call->status, call->arg);
	return 0;
}

static void on_chunk_cb(struct evhttp_request *req, void *arg)
{
	struct backend_call *call = arg;
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	if (call->cancelled) {
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	if (call->h->on_data) {
		size_t n = evbuffer_get_length(in);
		if (n) {
			const char *p = (const char *)evbuffer_pullup(in, -1);
			call->h->on_data(call, p, n, call->arg);
		}
		evbuffer_drain(in, n);
	} else {
		evbuffer_add_buffer(call->body, in);
	}
}

static void on_error_cb(enum evhttp_request_error e, void *arg)
{
	struct backend_call *call = arg;
	switch (e) {
	case EVREQ_HTTP_TIMEOUT:
		call->err = BACKEND_ERR_TIMEOUT;
		break;
	case EVREQ_HTTP_EOF:
		call->err = call->status ? BACKEND_ERR_RESET : BACKEND_ERR_CONNECT;
		break;
	case EVREQ_HTTP_INVALID_HEADER:
	case EVREQ_HTTP_DATA_TOO_LONG:
		call->err = BACKEND_ERR_OTHER;
		break;
	default:
		call->err = call->status ? BACKEND_ERR_RESET : BACKEND_ERR_CONNECT;
		break;
	}
}

static void on_done_cb(struct evhttp_request *req, void *arg)
{
	struct backend_call *call = arg;
	struct backend_http *bh = call->bh;
	call->req = NULL;
	call->finished = 1;
	int ok = req != NULL && evhttp_request_get_response_code(req) > 0;
	if (ok) {
		struct evbuffer *in = evhttp_request_get_input_buffer(req);
		if (evbuffer_get_length(in))
			on_chunk_cb(req, call);
	}
	/* A connection goes back to the pool rather than being freed: after a
	 * success libevent still uses it once this callback returns (keep-alive
	 * bookkeeping).
	 *
	 * llama-server closes some keep-alive connections right after a
	 * response (after every streamed one, in the builds we test) without
	 * saying so; the next request on that connection meets EOF before a
	 * status line. That says nothing about the backend, and the server
	 * never saw the request: send it once more. libevent has reset the
	 * connection before this callback (and touches it no more after), so
	 * sending on it again opens a new one. A timeout is not retried (the
	 * server may be working on it). */
	if (!ok && !call->cancelled && call->conn->used && !call->retried && call->status == 0 &&
	    call->err != BACKEND_ERR_TIMEOUT && call->err != BACKEND_ERR_OTHER) {
		struct pooled_conn *again = call->conn;
		call->conn = NULL;
		call->retried = 1;
		call->finished = 0;
		call->err = BACKEND_ERR_CONNECT;
		again->used = 0;
		if (call_send(call, again) == 0)
			return;
		call->finished = 1;
	} else {
		conn_give_back(bh, call->conn, 1);
		call->conn = NULL;
	}
	if (call->cancelled) {
		call_free(call);
		return;
	}
	if (ok) {
		size_t len = evbuffer_get_length(call->body);
		const char *p = len ? (const char *)evbuffer_pullup(call->body, -1) : "";
		call->h->on_done(call, evhttp_request_get_response_code(req), p, len, call->arg);
	} else {
		call->h->on_error(call, call->err, call->arg);
	}
	call_free(call);
}

/* Builds the request from what the call keeps and sends it, on conn when
 * given (the call's own, after a failure), else on a pooled connection or,
 * at the limit, after the calls that wait for one. 0, or -1 (nothing in
 * flight). */
static int call_send(struct backend_call *call, struct pooled_conn *conn)
{
	struct backend_http *bh = call->bh;
	if (!conn && (!conn_available(bh) || (!call->queued && !TAILQ_EMPTY(&bh->waiting)))) {
		/* At the limit (or others wait first): wait for a connection. */
		call->queued = 1;
		TAILQ_INSERT_TAIL(&bh->waiting, call, wait_link);
		return 0;
	}
	call->queued = 0;
	call->conn = conn ? conn : conn_take(bh);
	if (!call->conn)
		return -1;
	call->req = evhttp_request_new(on_done_cb, call);
	if (!call->req)
		goto fail;
	evhttp_request_set_header_cb(call->req, on_header_cb);
	evhttp_request_set_chunked_cb(call->req, on_chunk_cb);
	evhttp_request_set_error_cb(call->req, on_error_cb);
	struct evkeyvalq *hdr = evhttp_request_get_output_headers(call->req);
	char hostport[300];
	snprintf(hostport, sizeof hostport, "%s:%d", bh->host, bh->port);
	evhttp_add_header(hdr, "Host", hostport);
	evhttp_add_header(hdr, "Connection", "keep-alive");
	struct evkeyval *kv;
	TAILQ_FOREACH(kv, &bh->extra_headers, next)
	evhttp_add_header(hdr, kv->key, kv->value);
	if (call->has_payload) {
		char cl[32];
		snprintf(cl, sizeof cl, "%zu", call->payload_len);
		evhttp_add_header(hdr, "Content-Type", "application/json");
		evhttp_add_header(hdr, "Content-Length", cl);
		evbuffer_add(evhttp_request_get_output_buffer(call->req), call->payload,
		             call->payload_len);
	}
	if (evhttp_make_request(call->conn->evcon, call->req, call->type, call->uri) != 0) {
		/* evhttp_make_request frees the request on failure. */
		call->req = NULL;
		goto fail;
	}
	return 0;
fail:
	if (call->req)
		evhttp_request_free(call->req);
	call->req = NULL;
	conn_give_back(bh, call->conn, 0);
	call->conn = NULL;
	return -1;
}

/* A queued call leaves the list when it is sent or cancelled. */
static void waiting_remove(struct backend_http *bh, struct backend_call *call)
{
	TAILQ_REMOVE(&bh->waiting, call, wait_link);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct backend_http *bh = arg;
	struct backend_call *call;
	while ((call = TAILQ_FIRST(&bh->waiting)) && conn_available(bh)) {
		waiting_remove(bh, call);
		if (call_send(call, NULL) != 0) {
			call->finished = 1;
			call->h->on_error(call, BACKEND_ERR_OTHER, call->arg);
			call_free(call);
		}
	}
}

void backend_http_set_max_connections(struct backend_http *bh, int n)
{
	bh->max_open = n > 0 ? n : 0;
	if (!TAILQ_EMPTY(&bh->waiting) && bh->kick)
		event_active(bh->kick, 0, 0);
}

struct backend_call *backend_call_start(struct backend_http *bh, const char *method,
                                        const char *path, const char *body, size_t len,
                                        const struct backend_call_handlers *h, void *arg)
{
	struct backend_call *call = calloc(1, sizeof *call);
	if (!call)
		return NULL;
	call->bh = bh;
	call->h = h;
	call->arg = arg;
	LIST_INSERT_HEAD(&bh->calls, call, call_link);
	call->err = BACKEND_ERR_CONNECT;
	if (!bh->kick)
		bh->kick = event_new(bh->base, -1, 0, kick_cb, bh);
	call->type = !strcmp(method, "GET")      ? EVHTTP_REQ_GET
	             : !strcmp(method, "DELETE") ? EVHTTP_REQ_DELETE
	                                         : EVHTTP_REQ_POST;
	call->body = evbuffer_new();
	call->uri = malloc(strlen(bh->base_path) + strlen(path) + 1);
	if (body) {
		call->has_payload = 1;
		call->payload_len = len;
		call->payload = malloc(len ? len : 1);
		if (call->payload)
			memcpy(call->payload, body, len);
	}
	if (!call->body || !call->uri || (body && !call->payload))
		goto fail;
	strcpy(call->uri, bh->base_path);
	strcat(call->uri, path);
	if (call_send(call, NULL) != 0)
		goto fail;
	return call;
fail:
	call_free(call);
	return NULL;
}

static void deferred_cancel_cb(evutil_socket_t fd, short what, void *arg)
{
	struct backend_call *call = arg;
	if (call->finished) {
		/* It completed between the cancel and now; on_done_cb freed nothing
		 * because cancelled was set... it freed the call. Not reached. */
		return;
	}
	if (call->req)
		evhttp_cancel_request(call->req);
	call->req = NULL;
	/* A cancelled request leaves the connection in an unknown state. */
	if (call->conn)
		conn_give_back(call->bh, call->conn, 0);
	call->conn = NULL;
	call_free(call);
}

void backend_call_cancel(struct backend_call *call)
{
	if (!call || call->cancelled)
		return;
	call->cancelled = 1;
	if (call->finished)
		return;
	if (call->queued) {
		waiting_remove(call->bh, call);
		call_free(call);
		return;
	}
	/* evhttp_cancel_request must not run inside the request's own
	 * callbacks, so it runs on the next loop turn. Until then, the
	 * cancelled flag keeps any handler from running; if the request
	 * completes first, on_done_cb frees the call and deletes this event. */
	call->deferred = event_new(call->bh->base, -1, 0, deferred_cancel_cb, call);
	if (call->deferred)
		event_active(call->deferred, 0, 0);
}

const char *backend_call_header(const struct backend_call *call, const char *name)
{
	if (!call->req)
		return NULL;
	return evhttp_find_header(evhttp_request_get_input_headers(call->req), name);
}
