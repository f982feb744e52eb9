/* What a client gets once its request names a model: while it waits for
 * the model, a stream's keep-alives (and, for a client that asked for
 * progress, the load's events) or the error that ends its wait; once the
 * model is ready, the request relayed to its child as it came and the
 * answer sent back as the child gives it, streams as they come. Which
 * waiter goes when is pool.c's (pool_pump). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "api/api_error.h"
#include "backend/backend_http.h"
#include "http/http_server.h"
#include "pool/pool_impl.h"
#include "util/clock.h"

/* A request relayed to a child, as the child answers it. */
struct relay {
	struct pool *p;
	struct pool_model *m;
	struct pool_conn *conn;
	struct http_request *req;
	struct backend_call *call;
	int began;     /* the client's stream began (keep-alives, or the child's stream) */
	int computes;  /* counted in m->computing */
	int streaming; /* the child answers with a stream: bytes go on as they come */
	int failed;    /* the child did not answer (a timeout, gone): nothing to settle */
	int status;
	char ct[128];
	char *buf; /* a whole answer, until it ends */
	size_t len, cap;
};

/* Ends a waiter with an error, in the stream when one began. */
void pool_waiter_fail(struct pool_waiter *w, int status, const char *msg)
{
	http_request_on_close(w->req, NULL, NULL);
	if (w->began) {
		char *body = api_error_body(status, msg, http_request_path(w->req));
		http_stream_write(w->req, "data: ", 6);
		if (body)
			http_stream_write(w->req, body, strlen(body));
		http_stream_write(w->req, "\n\n", 2);
		free(body);
		http_stream_end(w->req);
	} else {
		http_respond_error(w->req, status, msg);
	}
	pool_waiter_free(w);
}

/* A streaming request that waits for its model gets SSE comments, so that
 * its client's idle timeout does not fire during the load. */
void pool_on_keepalive(evutil_socket_t fd, short what, void *arg)
{
	struct pool_waiter *w = arg;
	if (!w->began) {
		http_stream_begin(w->req, 200, "text/event-stream");
		w->began = 1;
	}
	char line[512];
	/* A model that takes requests keeps this one waiting for the CPU
	 * turn (pool_pick.h); any other is on its way to taking them. */
	int turn = w->m->state == PM_LOADED && !w->m->draining;
	int n = snprintf(line, sizeof line,
	                 turn ? ": toki %s waits for the CPU\n\n" : ": toki loading %s\n\n",
	                 w->m->name);
	http_stream_write(w->req, line, (size_t)n);
	if (w->progress) {
		/* A client that asked for llama-server's progress events gets the
		 * load's too, as an object of its own kind. */
		n = snprintf(line, sizeof line,
		             "data: {\"object\":\"toki.model.load\",\"model\":\"%s\",\"state\":"
		             "\"%s\",\"elapsed_ms\":%lld}\n\n",
		             w->m->name, pool_state_names[w->m->state],
		             (long long)((clock_now_us() - w->since) / 1000));
		http_stream_write(w->req, line, (size_t)n);
	}
	struct timeval tv = {w->p->cfg.keepalive_ms / 1000, (w->p->cfg.keepalive_ms % 1000) * 1000};
	event_add(w->keepalive, &tv);
}

static void relay_end(struct relay *r)
{
	struct pool_model *m = r->m;
	struct pool *p = r->p;
	m->in_flight--;
	m->computing -= r->computes;
	m->last_used = clock_now_us();
	/* A child that timed out or went away is not asked what it still
	 * does: a model that hangs holds the turn no longer than a timeout. */
	if (r->computes && !r->failed)
		pool_model_settle(m);
	pool_conn_release(r->conn);
	free(r->buf);
	free(r);
	pool_pump(p);
}

static void on_relay_close(struct http_request *req, void *arg)
{
	struct relay *r = arg;
	backend_call_cancel(r->call);
	relay_end(r);
}

static void on_relay_head(struct backend_call *call, int status, void *arg)
{
	struct relay *r = arg;
	const char *ct = backend_call_header(call, "Content-Type");
	r->status = status;
	snprintf(r->ct, sizeof r->ct, "%s", ct ? ct : "application/json");
	if (strstr(r->ct, "text/event-stream")) {
		r->streaming = 1;
		if (!r->began)
			http_stream_begin(r->req, status, r->ct);
		r->began = 1;
	}
}

static void on_relay_data(struct backend_call *call, const char *data, size_t len, void *arg)
{
	struct relay *r = arg;
	if (r->streaming) {
		http_stream_write(r->req, data, len);
		return;
	}
	if (r->len + len + 1 > r->cap) {
		size_t cap = r->cap ? r->cap : 4096;
		while (cap < r->len + len + 1)
			cap *= 2;
		char *nb = realloc(r->buf, cap);
		if (!nb)
			return; /* the answer ends short; the client sees bad JSON */
		r->buf = nb;
		r->cap = cap;
	}
	memcpy(r->buf + r->len, data, len);
	r->len += len;
}

static void on_relay_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg)
{
	struct relay *r = arg;
	http_request_on_close(r->req, NULL, NULL);
	if (r->streaming) {
		http_stream_end(r->req);
	} else if (r->began) {
		/* Keep-alives began a stream and the child answered whole (an
		 * error, mostly): its body goes out as the stream's one event. */
		http_stream_write(r->req, "data: ", 6);
		http_stream_write(r->req, r->buf ? r->buf : "", r->len);
		http_stream_write(r->req, "\n\n", 2);
		http_stream_end(r->req);
	} else {
		http_respond(r->req, status, r->ct[0] ? r->ct : "application/json",
		             r->buf ? r->buf : "", r->len);
	}
	relay_end(r);
}

static void on_relay_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct relay *r = arg;
	int status = err == BACKEND_ERR_TIMEOUT ? 504 : 502;
	r->failed = 1;
	char msg[300];
	snprintf(msg, sizeof msg, "model %s: %s", r->m->name, backend_error_text(err));
	http_request_on_close(r->req, NULL, NULL);
	if (r->began) {
		char *body = api_error_body(status, msg, http_request_path(r->req));
		http_stream_write(r->req, "data: ", 6);
		if (body)
			http_stream_write(r->req, body, strlen(body));
		http_stream_write(r->req, "\n\n", 2);
		free(body);
		http_stream_end(r->req);
	} else {
		http_respond_error(r->req, status, msg);
	}
	relay_end(r);
}

static const struct backend_call_handlers relay_handlers = {
    .on_head = on_relay_head,
    .on_data = on_relay_data,
    .on_done = on_relay_done,
    .on_error = on_relay_error,
};

/* Sends the request on to its model's child, as it came. */
void pool_relay_start(struct pool *p, struct pool_model *m, struct http_request *req, int began)
{
	struct relay *r = calloc(1, sizeof *r);
	if (!r) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	r->p = p;
	r->m = m;
	r->req = req;
	r->began = began;
	const char *path = http_request_path(req);
	const char *q = http_request_query(req);
	char *target = malloc(strlen(path) + strlen(q) + 2);
	if (!target) {
		free(r);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	sprintf(target, "%s%s%s", path, *q ? "?" : "", q);
	const char *method = http_request_method(req);
	size_t len = 0;
	const char *body = http_request_body(req, &len);
	/* What has a body computes (pool_request_computes). */
	int has_body = r->computes = pool_request_computes(req);
	m->in_flight++;
	m->computing += r->computes;
	if (r->computes)
		pool_model_settle_pause(m);
	r->conn = m->conn;
	r->conn->users++;
	r->call =
	    backend_call_start(m->conn->http, !strcmp(method, "HEAD") ? "GET" : method, target,
	                       has_body ? body : NULL, has_body ? len : 0, &relay_handlers, r);
	free(target);
	if (!r->call) {
		m->in_flight--;
		m->computing -= r->computes;
		pool_conn_release(r->conn);
		free(r);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_request_on_close(req, on_relay_close, r);
}

/* A waiter whose model is ready: relayed, or (a load) answered. */
void pool_waiter_serve(struct pool *p, struct pool_waiter *w)
{
	http_request_on_close(w->req, NULL, NULL);
	if (w->load_only) {
		json_t *o = json_pack("{s:s, s:s, s:I}", "model", w->m->name, "state", "loaded",
		                      "context_length", (json_int_t)w->m->ctx);
		char *s = json_dumps(o, 0);
		http_respond(w->req, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2);
		free(s);
		json_decref(o);
	} else {
		pool_relay_start(p, w->m, w->req, w->began);
	}
	pool_waiter_free(w);
}
