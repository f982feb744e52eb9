/* POST /lora-adapters changes the scales a server computes every later row
 * with (those of a request without its own `lora`). llama-server reuses a
 * slot's rows, restores a saved state and loads its RAM cache by tokens
 * alone, whatever scales computed them, so after a change every row toki
 * knows of means something else: what the slots hold, what the RAM cache
 * holds, the saved states (their fingerprint names the adapters and their
 * scales, slot_store.c). So the change is made on a backend with nothing
 * running on it, none routed there until it has answered, and then the
 * backend is discovered again, as after a restart. Every backend of a fleet
 * gets it, as a fleet is one server to its clients. */
#include "serve/adapters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_http.h"
#include "daemon.h"
#include "http/http_server.h"
#include "router/router.h"
#include "serve/req.h"
#include "serve/serve.h"

struct adapters_op;

struct adapters_call {
	struct adapters_op *op;
	struct backend *b;
	struct backend_call *call;
};

struct adapters_op {
	struct http_request *client; /* NULL once it left: the change goes on */
	int pending;
	/* What the client gets: the first refusal, else the last answer. */
	int status;
	char *body;
	size_t len;
	char *content_type;
	int n;
	struct adapters_call calls[];
};

static void keep_answer(struct adapters_op *op, int status, const char *ct, const char *body,
                        size_t len)
{
	if (op->body && op->status / 100 != 2)
		return; /* a refusal is already kept */
	char *copy = malloc(len + 1);
	if (!copy)
		return;
	memcpy(copy, body, len);
	copy[len] = '\0';
	free(op->body);
	free(op->content_type);
	op->body = copy;
	op->len = len;
	op->status = status;
	op->content_type = strdup(ct ? ct : "application/json");
}

static void op_free(struct adapters_op *op)
{
	free(op->body);
	free(op->content_type);
	free(op);
}

/* Every backend answered: the client gets the answer kept. */
static void op_end(struct adapters_op *op)
{
	if (op->client) {
		http_request_on_close(op->client, NULL, NULL);
		if (op->body)
			http_respond(op->client, op->status, op->content_type, op->body, op->len);
		else
			http_respond_error(op->client, 500, "out of memory");
	}
	op_free(op);
}

static void one_answered(struct adapters_call *c)
{
	struct adapters_op *op = c->op;
	c->call = NULL;
	c->b->adapters_changing = 0;
	/* Whatever it answered (a refusal changes nothing, but the request
	 * may have been read in part): what it holds is found anew. */
	backend_rediscover(c->b, "its adapter scales changed (POST /lora-adapters): discovering it "
	                         "again, its slots and RAM cache forgotten");
	if (--op->pending == 0)
		op_end(op);
}

static void on_done(struct backend_call *call, int status, const char *body, size_t len, void *arg)
{
	struct adapters_call *c = arg;
	keep_answer(c->op, status, backend_call_header(call, "Content-Type"), body, len);
	one_answered(c);
}

static void on_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct adapters_call *c = arg;
	char msg[256];
	snprintf(
	    msg, sizeof msg,
	    "{\"error\":{\"code\":%d,\"message\":\"backend %s: %s\",\"type\":\"server_error\"}}",
	    err == BACKEND_ERR_TIMEOUT ? 504 : 502, c->b->rb->url, backend_error_text(err));
	keep_answer(c->op, err == BACKEND_ERR_TIMEOUT ? 504 : 502, NULL, msg, strlen(msg));
	one_answered(c);
}

static const struct backend_call_handlers handlers = {.on_done = on_done, .on_error = on_error};

/* The client left: the change goes on (it may be made already), and the
 * backends come back when they have answered. */
static void on_client_close(struct http_request *req, void *arg)
{
	struct adapters_op *op = arg;
	op->client = NULL;
}

static int busy(const struct backend *b)
{
	for (int i = 0; i < b->rb->n_slots; i++)
		if (b->rb->slots[i].busy)
			return 1;
	return 0;
}

void adapters_route(struct daemon *d, struct http_request *req)
{
	if (strcmp(http_request_method(req), "POST") != 0) {
		routes_pass_through(d, req);
		return;
	}
	int up = 0;
	for (int i = 0; i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		if (!backend_is_up(b))
			continue;
		up++;
		if (busy(b)) {
			char msg[300];
			snprintf(
			    msg, sizeof msg,
			    "a request is running on backend %s: adapter scales change what its "
			    "rows mean; change them when it is idle",
			    b->rb->url);
			http_respond_error(req, 409, msg);
			return;
		}
	}
	if (!up && (d->supervisor || backend_any_returning(d))) {
		wait_park(d, req, adapters_route); /* coming back: the change waits */
		return;
	}
	if (!up) {
		http_respond_error(req, 503, "no backend is up");
		return;
	}
	struct adapters_op *op = calloc(1, sizeof *op + (size_t)up * sizeof op->calls[0]);
	if (!op) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	op->client = req;
	size_t len;
	const char *body = http_request_body(req, &len);
	for (int i = 0; i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		if (!backend_is_up(b))
			continue;
		/* Out of routing before the change: a request routed while it is
		 * made would run at either scales. */
		b->adapters_changing = 1;
		backend_mark_down(b, "its adapter scales change (POST /lora-adapters)");
		struct adapters_call *c = &op->calls[op->n++];
		c->op = op;
		c->b = b;
		op->pending++;
	}
	http_request_on_close(req, on_client_close, op);
	/* Every backend is held before the first call goes: one that fails at
	 * once answers (and may free op) only after the others were counted. */
	int n = op->n;
	op->pending++;
	for (int i = 0; i < n; i++) {
		struct adapters_call *c = &op->calls[i];
		c->call = backend_call_start(c->b->http, "POST", "/lora-adapters", body, len,
		                             &handlers, c);
		if (!c->call) {
			const char *oom =
			    "{\"error\":{\"code\":500,\"message\":\"out of memory\"}}";
			keep_answer(op, 500, NULL, oom, strlen(oom));
			one_answered(c);
		}
	}
	if (--op->pending == 0)
		op_end(op);
}
