/* The requests waiting for a slot or a backend, and every request in
 * flight. A waiter is retried when something changes on a backend it may
 * run on: the daemon says which backends changed (daemon_slots_changed),
 * and a waiter whose allowed backends are all unchanged is not routed again
 * for nothing, as it was when every slot change re-routed every waiter. One
 * FIFO keeps the order they came in. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "http/http_server.h"
#include "util/clock.h"
#include "serve/req.h"
#include "serve/serve.h"

void wait_add(struct serve_req *r)
{
	struct daemon *d = r->d;
	r->state = RS_WAITING;
	TAILQ_INSERT_TAIL(&d->serve->waiting, r, wait_link);
	d->n_waiting++;
}

void wait_remove(struct serve_req *r)
{
	struct daemon *d = r->d;
	if (r->state != RS_WAITING)
		return;
	TAILQ_REMOVE(&d->serve->waiting, r, wait_link);
	d->n_waiting--;
	/* Out of the queue: no longer waiting. A request that left it still
	 * marked waiting was never queued again when it had to wait once more
	 * (routed after the prompt probes, its backend busy in exact mode),
	 * and hung. */
	r->state = RS_TOKENIZE;
}

static void unpark(struct serve_parked *p)
{
	TAILQ_REMOVE(&p->d->serve->parked, p, link);
	p->d->n_waiting--;
}

/* The client left while its route was parked: nothing was sent anywhere. */
static void on_parked_close(struct http_request *req, void *arg)
{
	struct serve_parked *p = arg;
	unpark(p);
	free(p);
}

void wait_park(struct daemon *d, struct http_request *req, serve_route_fn handler)
{
	struct serve_parked *p = calloc(1, sizeof *p);
	if (!p) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	p->d = d;
	p->client = req;
	p->handler = handler;
	p->t_start_us = clock_now_us();
	TAILQ_INSERT_TAIL(&d->serve->parked, p, link);
	d->n_waiting++;
	http_request_on_close(req, on_parked_close, p);
}

/* Ends a parked route with an error answer (the deadline, a shutdown). */
static void parked_fail(struct serve_parked *p, int status, const char *message)
{
	unpark(p);
	http_request_on_close(p->client, NULL, NULL);
	http_respond_error(p->client, status, message);
	free(p);
}

/* Once a backend is up, every parked route runs again, in the order they
 * came; the handler owns the request from there (and may park it again). */
static void retry_parked(struct daemon *d)
{
	if (TAILQ_EMPTY(&d->serve->parked) || !backend_any_up(d))
		return;
	struct serve_parked_list ready = TAILQ_HEAD_INITIALIZER(ready);
	TAILQ_CONCAT(&ready, &d->serve->parked, link);
	struct serve_parked *p;
	while ((p = TAILQ_FIRST(&ready))) {
		TAILQ_REMOVE(&ready, p, link);
		d->n_waiting--;
		struct http_request *req = p->client;
		serve_route_fn handler = p->handler;
		http_request_on_close(req, NULL, NULL);
		free(p);
		handler(d, req);
	}
}

void active_add(struct serve_req *r)
{
	TAILQ_INSERT_HEAD(&r->d->serve->active, r, active_link);
}

static void drained(struct serve_state *ss)
{
	void (*done)(void *) = ss->drained;
	ss->drained = NULL;
	if (ss->drain_timeout)
		event_del(ss->drain_timeout);
	if (done)
		done(ss->drained_arg);
}

void active_remove(struct serve_req *r)
{
	/* Once only: req_finish runs once, but a request freed by a save that
	 * was still out has left already. */
	struct serve_state *ss = r->d->serve;
	if (r->active_link.tqe_prev) {
		TAILQ_REMOVE(&ss->active, r, active_link);
		r->active_link.tqe_prev = NULL;
	}
	/* The idle waiters hear of the last end on the next loop turn, not
	 * inside the request's own end. */
	if (TAILQ_EMPTY(&ss->active) && !TAILQ_EMPTY(&ss->idle) && ss->idle_check)
		event_active(ss->idle_check, EV_TIMEOUT, 0);
	if (ss->drained && TAILQ_EMPTY(&ss->active))
		drained(ss);
}

/* ---- GET /toki/idle ----
 *
 * The endpoint (src/pool/) lets one model on the CPU compute at a time, and
 * a model's answer is not the end of its work: exact mode's keep, tail cut
 * or settle after a cancel run after it, on the same cores. The endpoint
 * asks here when its relay ends and passes the turn on once this answers.
 * An idle save that starts later is not waited for (it runs after
 * save_idle_ms of quiet, and is mostly the disk's). */

/* Nothing runs here (req.h, wait_idle). */
static int serve_idle(const struct daemon *d)
{
	return TAILQ_EMPTY(&d->serve->active) && !d->saving;
}

static void idle_answer(struct serve_idle_waiter *w)
{
	struct daemon *d = w->d;
	int n = 0;
	struct serve_req *r;
	TAILQ_FOREACH(r, &d->serve->active, active_link)
	{
		n++;
	}
	json_t *o =
	    json_pack("{s:b, s:i, s:b}", "idle", serve_idle(d), "requests", n, "saving", d->saving);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	TAILQ_REMOVE(&d->serve->idle, w, link);
	http_request_on_close(w->client, NULL, NULL);
	if (s)
		http_respond(w->client, 200, "application/json", s, strlen(s));
	else
		http_respond_error(w->client, 500, "out of memory");
	free(s);
	free(w);
}

static void on_idle_close(struct http_request *req, void *arg)
{
	struct serve_idle_waiter *w = arg;
	(void)req;
	TAILQ_REMOVE(&w->d->serve->idle, w, link);
	free(w);
}

/* Every 20 ms while someone waits (an idle save's end says nothing to this
 * layer), and at once after the last request's end. */
static void idle_check(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	struct serve_state *ss = d->serve;
	int64_t now = clock_now_us();
	int idle = serve_idle(d);
	struct serve_idle_waiter *w, *next;
	for (w = TAILQ_FIRST(&ss->idle); w; w = next) {
		next = TAILQ_NEXT(w, link);
		if (idle || now >= w->deadline_us)
			idle_answer(w);
	}
	if (TAILQ_EMPTY(&ss->idle))
		event_del(ss->idle_check);
}

void wait_idle(struct daemon *d, struct http_request *req, long wait_ms)
{
	struct serve_state *ss = d->serve;
	struct serve_idle_waiter *w = calloc(1, sizeof *w);
	if (!w) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	w->d = d;
	w->client = req;
	w->deadline_us = clock_now_us() + (int64_t)wait_ms * 1000;
	TAILQ_INSERT_TAIL(&ss->idle, w, link);
	if (serve_idle(d) || wait_ms <= 0) {
		idle_answer(w);
		return;
	}
	if (!ss->idle_check)
		ss->idle_check = event_new(d->base, -1, EV_PERSIST, idle_check, d);
	struct timeval tv = {0, 20000};
	if (!ss->idle_check || event_add(ss->idle_check, &tv) != 0) {
		idle_answer(w); /* out of memory: the state as it is */
		return;
	}
	http_request_on_close(req, on_idle_close, w);
}

/* Retries the waiters that may run on a changed backend (bit i: backend
 * i). Each retry may finish or re-queue the request: a snapshot is walked,
 * up to the last waiter there was. */
static void retry_waiting(struct daemon *d, uint64_t changed)
{
	retry_parked(d);
	struct serve_req *r = TAILQ_FIRST(&d->serve->waiting);
	struct serve_req *stop = TAILQ_LAST(&d->serve->waiting, serve_req_list);
	while (r) {
		struct serve_req *next = TAILQ_NEXT(r, wait_link);
		int last = r == stop;
		if (changed & r->ask.allowed & ~r->tries.excluded) {
			if (r->needs_begin) {
				struct backend *b = req_any_backend(r);
				if (b) {
					wait_remove(r);
					r->needs_begin = 0;
					req_begin(r, b);
				}
			} else {
				exec_route(r);
			}
		}
		if (last)
			break;
		r = next;
	}
}

int serve_init(struct daemon *d)
{
	d->serve = calloc(1, sizeof *d->serve);
	if (!d->serve)
		return -1;
	TAILQ_INIT(&d->serve->waiting);
	TAILQ_INIT(&d->serve->active);
	TAILQ_INIT(&d->serve->parked);
	TAILQ_INIT(&d->serve->idle);
	d->on_slots_changed = retry_waiting;
	return 0;
}

void serve_free(struct daemon *d)
{
	if (!d->serve)
		return;
	if (d->serve->drain_timeout)
		event_free(d->serve->drain_timeout);
	if (d->serve->idle_check)
		event_free(d->serve->idle_check);
	/* The HTTP server, freed first, closed their clients: none are left;
	 * any that are have no client to answer. */
	struct serve_parked *p;
	while ((p = TAILQ_FIRST(&d->serve->parked))) {
		unpark(p);
		free(p);
	}
	struct serve_idle_waiter *w;
	while ((w = TAILQ_FIRST(&d->serve->idle))) {
		TAILQ_REMOVE(&d->serve->idle, w, link);
		free(w);
	}
	free(d->serve);
	d->serve = NULL;
	d->on_slots_changed = NULL;
}

void serve_expire_waiting(struct daemon *d, int64_t now_us)
{
	int64_t limit = (int64_t)d->cfg.backend_timeout_s * 1000000;
	struct serve_req *r = TAILQ_FIRST(&d->serve->waiting);
	while (r) {
		struct serve_req *next = TAILQ_NEXT(r, wait_link);
		if (now_us - r->ask.t_start_us > limit) {
			wait_remove(r);
			req_fail(r, 504, "no slot or backend became free in time");
		}
		r = next;
	}
	struct serve_parked *p, *pnext;
	for (p = TAILQ_FIRST(&d->serve->parked); p; p = pnext) {
		pnext = TAILQ_NEXT(p, link);
		if (now_us - p->t_start_us > limit)
			parked_fail(p, 504, "no slot or backend became free in time");
	}
}

/* An answered request ends where it is: what its slot holds is unknown. */
static void drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	struct serve_req *r;
	while ((r = TAILQ_FIRST(&d->serve->active)))
		req_finish(r);
	drained(d->serve);
}

/* A stream in flight gets an error event, then the end of its chunked
 * body; any other request with a client its error answer. */
void serve_drain(struct daemon *d, const char *why, int timeout_ms, void (*done)(void *arg),
                 void *arg)
{
	struct serve_state *ss = d->serve;
	struct serve_req *r, *next;
	for (r = TAILQ_FIRST(&ss->active); r; r = next) {
		next = TAILQ_NEXT(r, active_link);
		/* A request's end ends only itself: next stays valid. */
		if (r->reply.client || (r->state != RS_TAILCUT && r->state != RS_SETTLE))
			req_fail(r, 503, why);
	}
	struct serve_parked *p;
	while ((p = TAILQ_FIRST(&ss->parked)))
		parked_fail(p, 503, why);
	/* Whoever waits for the end of this server's work hears it now. */
	while (!TAILQ_EMPTY(&ss->idle))
		idle_answer(TAILQ_FIRST(&ss->idle));
	ss->drained = done;
	ss->drained_arg = arg;
	if (TAILQ_EMPTY(&ss->active)) {
		drained(ss);
		return;
	}
	if (!ss->drain_timeout)
		ss->drain_timeout = evtimer_new(d->base, drain_timeout, d);
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	if (!ss->drain_timeout || evtimer_add(ss->drain_timeout, &tv) != 0)
		drain_timeout(-1, 0, d);
}
