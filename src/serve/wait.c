/* The requests waiting for a slot or a backend, and every request in
 * flight. A waiter is retried when something changes on a backend it may
 * run on: the daemon says which backends changed (daemon_slots_changed),
 * and a waiter whose allowed backends are all unchanged is not routed again
 * for nothing, as it was when every slot change re-routed every waiter. One
 * FIFO keeps the order they came in. */
#include <stdlib.h>

#include "daemon.h"
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
	if (ss->drained && TAILQ_EMPTY(&ss->active))
		drained(ss);
}

/* Retries the waiters that may run on a changed backend (bit i: backend
 * i). Each retry may finish or re-queue the request: a snapshot is walked,
 * up to the last waiter there was. */
static void retry_waiting(struct daemon *d, uint64_t changed)
{
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
	d->on_slots_changed = retry_waiting;
	return 0;
}

void serve_free(struct daemon *d)
{
	if (d->serve && d->serve->drain_timeout)
		event_free(d->serve->drain_timeout);
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
