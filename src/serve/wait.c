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

void active_remove(struct serve_req *r)
{
	/* Once only: req_finish runs once, but a request freed by a save that
	 * was still out has left already. */
	if (r->active_link.tqe_prev) {
		TAILQ_REMOVE(&r->d->serve->active, r, active_link);
		r->active_link.tqe_prev = NULL;
	}
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

/* A stream in flight gets an error event, then the end of its chunked
 * body; any other request its error answer. */
void serve_abort_all(struct daemon *d, const char *why)
{
	struct serve_req *r;
	while ((r = TAILQ_FIRST(&d->serve->active)))
		req_fail(r, 503, why);
}
