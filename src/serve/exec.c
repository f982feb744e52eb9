/* The executor: a request's plan run one backend call at a time, and the
 * record of what its slot holds.
 *
 * The router chose a slot and how much of its content to reuse; plan_build
 * (router/sched.h) made the steps: save the slot's content, restore a saved
 * state, cut the slot back, evaluate the prompt chunk by chunk, generate.
 * run_step starts the next one; each step's end runs the one after. Every
 * step that evaluates tokens is checked against the plan: what the server
 * reused must be what toki planned, or exact mode's rows would not be the
 * schedule's. After the answer (or a cancel) two more calls may run on the
 * slot, the tail cut and the settle poll, before it is given back.
 *
 * The step table below names every backend call a request makes and what a
 * cancel does in it (the cancel matrix, exec_cancel_action, unit-tested).
 * settle() is the only writer of what a slot holds on the request path;
 * slot_take and slot_free are the only ones that hold and release it. */
#include "serve/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/prompt_probe.h"
#include "backend/slot_store.h"
#include "daemon.h"
#include "prompt/prompt.h"
#include "serve/req.h"
#include "util/clock.h"
#include "util/json_body.h"
#include "util/log.h"
#include "util/strbuf.h"

static void run_step(struct serve_req *r);
static void next_step(struct serve_req *r);
static int start_tail_cut(struct serve_req *r);
static int start_error_cut(struct serve_req *r);
static int start_settle(struct serve_req *r);
/* What the keep after an answer did. */
enum keep_outcome {
	KEEP_NONE, /* nothing to keep: the tail cut goes instead */
	KEEP_SENT, /* the keep is out: it ends the slot and the request */
	KEEP_HELD, /* the slot holds the rows it would keep: recorded, nothing sent */
};
static enum keep_outcome start_keep(struct serve_req *r);

/* ---- the step table ---- */

/* What a cancel does in each step (exec_cancel_action). */
enum cancel_rule {
	ON_CANCEL_END,     /* nothing on the slot to keep */
	ON_CANCEL_CUT,     /* a cut in flight may or may not have run: the reuse is there */
	ON_CANCEL_PREFILL, /* exact: the step runs on; fast: what it reached */
	ON_CANCEL_REACHED, /* what the evaluation reached (the whole prompt once a token came) */
};

struct step_row {
	const char *name;
	/* Starts the step (the plan's steps: upto is the step's end); NULL
	 * for the calls that req.c (the prompt) and the answer's end start. */
	void (*start)(struct serve_req *r, size_t upto);
	enum cancel_rule on_cancel;
};

static void step_save(struct serve_req *r, size_t upto);
static void step_restore(struct serve_req *r, size_t upto);
static void step_cut(struct serve_req *r, size_t upto);
static void step_prefill(struct serve_req *r, size_t upto);
static void step_generate(struct serve_req *r, size_t upto);

static const struct step_row step_table[RS_COUNT] = {
    [RS_TEMPLATE] = {"template", NULL, ON_CANCEL_END},
    [RS_TOKENIZE] = {"tokenize", NULL, ON_CANCEL_END},
    [RS_WAITING] = {"wait", NULL, ON_CANCEL_END},
    [RS_SAVE] = {"save", step_save, ON_CANCEL_END},
    [RS_RESTORE] = {"restore", step_restore, ON_CANCEL_END},
    [RS_CUT] = {"cut", step_cut, ON_CANCEL_CUT},
    [RS_PREFILL] = {"prefill", step_prefill, ON_CANCEL_PREFILL},
    [RS_GENERATE] = {"generate", step_generate, ON_CANCEL_REACHED},
    [RS_SETTLE] = {"settle", NULL, ON_CANCEL_END},
    [RS_TAILCUT] = {"tail cut", NULL, ON_CANCEL_END},
    [RS_DONE] = {"done", NULL, ON_CANCEL_END},
};

/* The plan's step kinds (router/sched.h) as rows of the table. */
static enum req_state row_of(enum plan_step_kind k)
{
	switch (k) {
	case STEP_SAVE:
		return RS_SAVE;
	case STEP_RESTORE:
		return RS_RESTORE;
	case STEP_CUT:
		return RS_CUT;
	case STEP_PREFILL:
		return RS_PREFILL;
	case STEP_GENERATE:
		break;
	}
	return RS_GENERATE;
}

const char *exec_step_name(int step)
{
	return step >= 0 && step < RS_COUNT && step_table[step].name ? step_table[step].name : "?";
}

int exec_step_startable(int step)
{
	return step >= 0 && step < RS_COUNT && step_table[step].start != NULL;
}

enum cancel_action exec_cancel_action(const struct cancel_case *c, size_t *keep,
                                      size_t *keep_reused)
{
	*keep = *keep_reused = 0;
	if (c->step < 0 || c->step >= RS_COUNT || !c->slot_live || !c->routable || c->replanning)
		return CANCEL_END;
	enum cancel_rule rule = step_table[c->step].on_cancel;
	if (rule == ON_CANCEL_END)
		return CANCEL_END;
	/* A prefill step is at most a batch of llama-server's, which it would
	 * finish before stopping anyway: exact mode lets it end and keeps its
	 * rows, which are on the schedule. */
	if (rule == ON_CANCEL_PREFILL && c->exact && c->call_out)
		return CANCEL_LET_STEP_END;
	int whole = rule == ON_CANCEL_REACHED && c->gen_started;
	size_t got;
	if (whole)
		got = c->n_tokens;
	else if (!c->exact)
		/* Fast mode: at least what it reused. */
		got = c->reuse > c->done_upto ? c->reuse : c->done_upto;
	else
		got = rule == ON_CANCEL_CUT ? c->reuse : c->done_upto;
	*keep = got;
	*keep_reused = c->exact ? got : got < c->reuse ? got : c->reuse;
	return CANCEL_KEEP;
}

/* ---- the slot's record ---- */

enum slot_fact_kind {
	SLOT_HOLDS,       /* tokens[0..n), of which `reused` came from the cache (fast) */
	SLOT_ON_SCHEDULE, /* tokens[0..n), every row on the request's schedule (exact) */
	SLOT_CUT,         /* the cut's kept prefix and its throw-away token */
	SLOT_RESTORED,    /* the saved state restored into it */
	SLOT_LOADED,  /* a cut loaded a state of the server's RAM cache: the cut's kept prefix */
	SLOT_UNKNOWN, /* nothing known: forgotten */
	SLOT_KEPT,    /* the keep after an answer: run.kept[0..n), the answer's rows to n */
};

/* After a keep: the slot holds exactly the prompt and the answer's tokens
 * (run.kept, with a throw-away token when run.kept_junk), the prompt's rows
 * on its schedule and the answer's up to aligned one at a time, as
 * generation computed them: each its own chunk (a step, router/sched.h). */
static void settle_kept(struct daemon *d, struct router_slot *s, const struct serve_req *r,
                        size_t aligned, int64_t now)
{
	size_t n = r->prompt.n_tokens, nb = r->prompt.n_bounds;
	size_t steps = aligned > n ? aligned - n : 0;
	size_t *b = malloc((nb + steps) * sizeof *b);
	if (!b) {
		router_slot_forget(d->router, s);
		return;
	}
	memcpy(b, r->prompt.bounds, nb * sizeof *b);
	for (size_t i = 0; i < steps; i++)
		b[nb + i] = n + i;
	router_slot_kept(d->router, s, r->run.kept, r->run.n_kept + (size_t)r->run.kept_junk, n,
	                 r->run.kept_junk, b, nb + steps, aligned, now);
	free(b);
}

/* The one writer of what a slot holds on the request path: every outcome of
 * every step ends here. r gives the prompt (NULL for SLOT_UNKNOWN). */
static void settle_slot(struct daemon *d, struct router_slot *s, const struct serve_req *r,
                        enum slot_fact_kind kind, size_t n, size_t reused)
{
	int64_t now = clock_now_us();
	if (!s)
		return;
	switch (kind) {
	case SLOT_HOLDS:
		router_slot_commit(d->router, s, r->prompt.tokens, n, reused, now);
		break;
	case SLOT_ON_SCHEDULE:
		router_slot_commit_sched(d->router, s, r->prompt.tokens, n, r->prompt.bounds,
		                         r->prompt.n_bounds, n, now);
		break;
	case SLOT_CUT:
		router_slot_cut(d->router, s, r->prompt.tokens, r->run.cut_keep, r->run.cut_junk,
		                now);
		break;
	case SLOT_RESTORED:
		router_slot_restored(d->router, s, r->run.choice.restore, now);
		break;
	case SLOT_LOADED:
		router_slot_loaded(d->router, s, r->prompt.tokens, r->run.cut_keep, r->run.cut_junk,
		                   r->prompt.bounds, r->prompt.n_bounds, now);
		break;
	case SLOT_UNKNOWN:
		router_slot_forget(d->router, s);
		break;
	case SLOT_KEPT:
		settle_kept(d, s, r, n, now);
		break;
	}
}

/* The request's own slot. */
static void settle(struct serve_req *r, enum slot_fact_kind kind, size_t n, size_t reused)
{
	settle_slot(r->d, r->run.slot, r, kind, n, reused);
}

/* Holds the slot for the request (busy until slot_free). */
static void slot_take(struct serve_req *r, struct router_slot *s, double est_s)
{
	router_slot_begin(r->d->router, s, clock_now_us(), est_s);
	r->run.slot = s;
}

/* Gives the slot back: it is free (and exact mode's backend too), and the
 * requests that wait for its backend go now. */
static void slot_free(struct serve_req *r)
{
	struct router_slot *s = r->run.slot;
	if (!s)
		return;
	router_slot_end(r->d->router, s, clock_now_us());
	r->run.slot = NULL;
	daemon_slots_changed(r->d, s->backend->index);
}

static void unpin_restore(struct serve_req *r)
{
	if (r->run.choice.restore) {
		r->run.choice.restore->pinned--;
		r->run.choice.restore = NULL;
	}
}

void exec_drop_slot(struct serve_req *r)
{
	unpin_restore(r);
	settle(r, SLOT_UNKNOWN, 0, 0);
	slot_free(r);
}

void exec_pin_slot(struct serve_req *r, struct router_slot *s, double est_s)
{
	/* The client pinned a slot itself: respect it, but then the router
	 * cannot know what that slot holds... */
	settle_slot(r->d, s, NULL, SLOT_UNKNOWN, 0, 0);
	/* ...and it is busy until the answer ends, so that no routed request
	 * is sent to wait behind it (req_finish ends it). */
	if (!s->busy)
		slot_take(r, s, est_s);
}

void exec_slot_overwritten(struct daemon *d, struct router_slot *s)
{
	settle_slot(d, s, NULL, SLOT_UNKNOWN, 0, 0);
}

void exec_cancel_call(struct serve_req *r)
{
	if (r->run.call) {
		backend_call_cancel(r->run.call);
		r->run.call = NULL;
	}
}

/* ---- the request's counts ---- */

/* What the whole request cost, all its backend steps together: the prompt
 * tokens it took from the cache, and those the server evaluated for it
 * (chunks, cuts and the last step). */
long long exec_cached(const struct serve_req *r)
{
	return r->run.steps ? (long long)r->run.plan.reuse : r->reply.t.cache_n;
}

long long exec_evaluated(const struct serve_req *r)
{
	return r->run.steps_prompt_n + r->reply.t.prompt_n;
}

void exec_totals(const struct serve_req *r, struct answer_totals *t)
{
	t->steps = r->reply.t.seen ? r->run.steps : 0;
	t->cached = exec_cached(r);
	t->evaluated = exec_evaluated(r);
	t->prompt_ms = r->run.steps_prompt_ms + r->reply.t.prompt_ms;
}

/* Steps before the last evaluated tokens whatever became of it. */
static void count_evaluated(struct serve_req *r)
{
	if (r->run.counted || !r->run.slot)
		return;
	r->run.slot->backend->evaluated_tokens += (uint64_t)exec_evaluated(r);
	r->d->stats.evaluated_tokens += (uint64_t)exec_evaluated(r);
	r->run.counted = 1;
}

/* ---- after the answer ---- */

/* Exact mode and a request with adapter scales of its own ("lora"):
 * llama-server reuses a slot's rows, and loads its RAM cache's, whatever
 * scales computed them (measured on 11669), so rows of other scales would
 * change the answer. Such a request reuses nothing, computes every row with
 * its scales (append_lora), and leaves nothing to reuse. */
static int lora_apart(const struct serve_req *r)
{
	return r->ask.lora && req_exact(r);
}

/* Fast mode leaves the slot to a server that loads states from its RAM
 * cache only into a slot it picks itself (router.h, self_cached), and to
 * one that has such a cache when toki has no slot files for it (ram_cache):
 * what toki evicts goes to that RAM, which toki cannot see, so the server's
 * own choice is the better one. Exact mode always picks: its steps need
 * one slot. */
static int server_picks_slot(const struct serve_req *r)
{
	const struct router_backend *b = r->run.slot ? r->run.slot->backend : NULL;
	return b && !req_exact(r) && r->prompt.routable &&
	       (b->self_cached || (b->ram_cache && !b->can_save));
}

/* The server reused more of the prompt than the slot could lend (what it
 * matched, and past a whole match the last answer's tokens): it loaded a
 * state of its RAM cache into the slot. Said once per backend. */
static void note_ram_load(struct serve_req *r, const struct router_slot *s)
{
	struct router_backend *b = s->backend;
	size_t could = r->run.choice.matched;
	if (could && could >= s->n_tokens)
		could = s->n_tokens + s->generated + 1;
	/* A few tokens more (a BOS, a header toki did not count) are no load. */
	if (b->ram_cache || r->reply.t.cache_n <= (long long)could + 32)
		return;
	b->ram_cache = 1;
	log_info("backend %s loaded a state from its RAM cache into slot %d (it reused %lld "
	         "tokens, the slot could lend %zu): it has --cache-ram on. %s",
	         b->url, s->id, r->reply.t.cache_n, could,
	         b->can_save ? "toki keeps choosing slots: its slot files do more"
	                     : "Without slot files toki lets it pick slots from now on (fast "
	                       "mode), as it does alone; --slot-save-path and --slot-dir would "
	                       "let toki do better");
}

/* The slot's KV now holds what this request sent, if the backend's own count
 * agrees with ours; otherwise what it holds is unknown. */
static void record_answer(struct serve_req *r, int success)
{
	struct daemon *d = r->d;
	struct router_slot *s = r->run.slot;
	const struct answer_timings *t = &r->reply.t;
	if (!s)
		return;
	if (lora_apart(r)) {
		/* Rows of other adapter scales: no later request may reuse them,
		 * from the slot or from the server's RAM cache, where the next
		 * task moves them (the server keys both by tokens alone). */
		settle(r, SLOT_UNKNOWN, 0, 0);
		router_ram_clear(&s->backend->ram);
	} else if (success && t->seen && r->prompt.routable) {
		long long n_server = t->cache_n + t->prompt_n;
		if (n_server == (long long)r->prompt.n_tokens && req_exact(r)) {
			/* The plan ran as checked step by step: every row of the
			 * prompt is on the request's schedule. */
			settle(r, SLOT_ON_SCHEDULE, r->prompt.n_tokens, 0);
			/* Until the tail cut, the answer follows the prompt there. */
			s->generated = t->predicted_n > 0 ? (size_t)t->predicted_n : 0;
			if ((size_t)t->cache_n != r->run.plan.final_cache)
				log_warn("exact mode: backend reused %lld tokens, expected %zu",
				         t->cache_n, r->run.plan.final_cache);
		} else if (server_picks_slot(r)) {
			/* The server picked its own slot: nothing here to know. */
			settle(r, SLOT_UNKNOWN, 0, 0);
		} else if (n_server == (long long)r->prompt.n_tokens) {
			note_ram_load(r, s);
			if (t->cache_n < (long long)r->run.choice.reuse && r->run.backend)
				/* The slot held less than toki knew: emptied by the
				 * server itself? (backend.c, self_cleared) */
				backend_check_slots_now(r->run.backend);
			else if (r->run.backend)
				backend_answer_ended(r->run.backend);
			settle(r, SLOT_HOLDS, r->prompt.n_tokens, (size_t)t->cache_n);
			s->generated = t->predicted_n > 0 ? (size_t)t->predicted_n : 0;
		} else {
			log_warn("slot %d: backend counted %lld prompt tokens, toki %zu; "
			         "forgetting slot",
			         s->id, n_server, r->prompt.n_tokens);
			settle(r, SLOT_UNKNOWN, 0, 0);
		}
		router_backend_note_prefill(s->backend, (uint64_t)exec_evaluated(r),
		                            r->run.steps_prompt_ms + t->prompt_ms);
		router_backend_note_decode(s->backend, (uint64_t)t->predicted_n, t->predicted_ms);
		s->backend->cached_tokens += (uint64_t)exec_cached(r);
		s->backend->requests++;
		d->stats.cached_tokens += (uint64_t)exec_cached(r);
	} else {
		settle(r, SLOT_UNKNOWN, 0, 0);
	}
	count_evaluated(r);
}

/* The slot's record after the answer, then the request's end; in exact mode
 * a cut of the slot's tail may still run, and finishes the request. */
void exec_answered(struct serve_req *r, int success)
{
	unpin_restore(r);
	if (r->run.slot) {
		record_answer(r, success);
		struct router_slot *s = r->run.slot;
		int after = req_exact(r) && success && s->n_tokens && !s->retired &&
		            r->run.backend && backend_is_up(r->run.backend);
		enum keep_outcome k = after ? start_keep(r) : KEEP_NONE;
		if (k == KEEP_SENT || (after && k == KEEP_NONE && start_tail_cut(r)))
			return;
		if (!success && start_error_cut(r))
			return;
		slot_free(r);
	}
	req_finish(r);
}

/* req_finish: whatever is still held goes back, content unknown. */
void exec_release(struct serve_req *r)
{
	exec_cancel_call(r);
	count_evaluated(r);
	exec_drop_slot(r);
}

/* ---- a cancel ---- */

/* What a cancelled request's slot keeps. Not in exact mode on a model
 * whose states llama-server does not restore exactly (router.h,
 * restore_inexact): the next request starts from an empty slot. */
static void keep_what_was_reached(struct serve_req *r, enum slot_fact_kind kind, size_t keep,
                                  size_t reused)
{
	struct router_slot *s = r->run.slot;
	if (req_exact(r) && s->backend->restore_inexact) {
		settle(r, SLOT_UNKNOWN, 0, 0);
		log_info("slot %d keeps 0 tokens of the cancelled request (a sliding-window model: "
		         "its state would not be restored exactly)",
		         s->id);
		return;
	}
	settle(r, kind, keep, reused);
	log_info("slot %d keeps %zu tokens of the cancelled request", s->id, keep);
}

/* A request cancelled on its slot leaves there what llama-server really
 * holds: the prompt up to where its evaluation got (exec_cancel_action).
 * Exact mode then waits for llama-server to stop the cancelled task before
 * the backend takes another request (start_settle). Returns 1 when the
 * request goes on. */
int exec_client_gone(struct serve_req *r)
{
	struct router_slot *s = r->run.slot;
	struct cancel_case c = {
	    .step = r->state,
	    .exact = req_exact(r),
	    .routable = r->prompt.routable,
	    .slot_live = s && !s->retired,
	    .replanning = r->tries.replanning,
	    .call_out = r->run.call != NULL,
	    .gen_started = r->reply.gen_started,
	    .n_tokens = r->prompt.n_tokens,
	    .reuse = r->run.plan.reuse,
	    .done_upto = r->run.done_upto,
	};
	size_t keep, reused;
	switch (exec_cancel_action(&c, &keep, &reused)) {
	case CANCEL_END:
		return 0;
	case CANCEL_LET_STEP_END:
		r->run.abandoned = 1;
		r->run.abandoned_at = r->run.done_upto;
		return 1;
	case CANCEL_KEEP:
		break;
	}
	/* The backend sees its connection close and stops. */
	exec_cancel_call(r);
	keep_what_was_reached(r, c.exact ? SLOT_ON_SCHEDULE : SLOT_HOLDS, keep, reused);
	count_evaluated(r); /* what its steps evaluated, cancelled or not */
	if (!c.exact) {
		slot_free(r);
		return 0;
	}
	if (start_settle(r))
		return 1;
	settle(r, SLOT_UNKNOWN, 0, 0);
	return 0;
}

/* The client went away while a prefill step ran: the steps it still ran
 * have ended, so the slot is idle and holds the prompt up to done_upto, on
 * the schedule. */
static void keep_abandoned(struct serve_req *r)
{
	keep_what_was_reached(r, SLOT_ON_SCHEDULE, r->run.done_upto, 0);
	count_evaluated(r);
	slot_free(r);
	req_finish(r);
}

/* A step found the slot holding something else than planned (llama-server
 * may load a state of its own RAM cache into it): the request is planned
 * again from an empty slot, which cannot go wrong that way. */
static void step_went_wrong(struct serve_req *r, const char *why)
{
	if (r->run.abandoned) {
		/* Nobody waits for a replan: what the slot holds is unknown. */
		log_warn("cancelled request's step on slot %d: %s", r->run.slot->id, why);
		req_finish(r);
		return;
	}
	req_replan(r, why, 1);
}

/* ---- the steps' calls ---- */

/* The server's own counts of one of its answers (its timings). */
struct step_counts {
	long long cache_n, prompt_n, predicted_n;
	double prompt_ms, predicted_ms;
};

/* Reads an answer's timings into c; -1 when it has none. */
static int read_counts(const json_t *o, struct step_counts *c)
{
	json_t *t = json_object_get(o, "timings");
	c->cache_n = json_integer_value(json_object_get(t, "cache_n"));
	c->prompt_n = json_integer_value(json_object_get(t, "prompt_n"));
	c->predicted_n = json_integer_value(json_object_get(t, "predicted_n"));
	c->prompt_ms = json_number_value(json_object_get(t, "prompt_ms"));
	c->predicted_ms = json_number_value(json_object_get(t, "predicted_ms"));
	return json_is_object(t) ? 0 : -1;
}

/* The timings of a step's answer: how many prompt tokens the server reused
 * and evaluated, and in how many ms. 0, or -1 when there are none. */
static int step_timings(int status, const char *body, size_t len, long long *cache_n,
                        long long *prompt_n, double *ms)
{
	json_t *o = json_body(status, body, len, -1);
	struct step_counts c;
	int rc = read_counts(o, &c);
	json_decref(o);
	*cache_n = c.cache_n;
	*prompt_n = c.prompt_n;
	*ms = c.prompt_ms;
	return rc;
}

/* tokens[0..n) as a JSON array's elements, after `before` of them. */
static void append_tokens(struct strbuf *b, const token_t *tokens, size_t n, size_t before)
{
	for (size_t i = 0; i < n; i++) {
		char num[24];
		int k = snprintf(num, sizeof num, "%s%d", i + before ? "," : "", tokens[i]);
		strbuf_append(b, num, (size_t)k);
	}
}

/* The client's adapter scales (req_ask.lora) on a step's body, before its
 * closing brace: every row of the request is computed with them. */
static void append_lora(struct strbuf *b, const char *lora)
{
	if (!lora)
		return;
	strbuf_appends(b, ",\"lora\":");
	strbuf_appends(b, lora);
}

/* A /completion body that evaluates tokens[0..n) (then `junk`, when
 * with_junk) on the slot and generates nothing, with the adapter scales
 * lora (NULL: the server's). Written as text: a long prompt is resent for
 * every chunk. */
static char *prefill_body(const token_t *tokens, size_t n, int with_junk, token_t junk, int slot,
                          int cache_prompt, const char *lora)
{
	struct strbuf b = {0};
	strbuf_append(&b, "{\"prompt\":[", 11);
	append_tokens(&b, tokens, n, 0);
	if (with_junk)
		append_tokens(&b, &junk, 1, n);
	char tail[96];
	int k = snprintf(tail, sizeof tail, "],\"n_predict\":0,\"cache_prompt\":%s,\"id_slot\":%d",
	                 cache_prompt ? "true" : "false", slot);
	strbuf_append(&b, tail, (size_t)k);
	append_lora(&b, lora);
	strbuf_append(&b, "}", 1);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* A /completion body for a run of k one-token steps from `done` (router/
 * sched.h, plan_forced_run): the prompt to tokens[done] inclusive, whose
 * row alone is new, as a step's; then a generation of k tokens forced, by
 * a grammar of token ids, to tokens[done+1 .. done+k), then to an end of
 * generation (a complete grammar allows only those). Generation decodes
 * each sampled token alone, as the steps would evaluate it and as the
 * answer's own generation did; the last one it samples is not decoded, so
 * it need not be the prompt's next (which may be a special token that a
 * grammar does not allow before its end), and the rows are those of
 * tokens[done .. done+k), the steps'. One request instead of k, and the
 * prompt sent once. */
static char *forced_body(const token_t *tokens, size_t done, size_t k, int slot, const char *lora)
{
	struct strbuf b = {0};
	strbuf_append(&b, "{\"prompt\":[", 11);
	append_tokens(&b, tokens, done + 1, 0);
	char head[160];
	int n = snprintf(head, sizeof head,
	                 "],\"n_predict\":%zu,\"cache_prompt\":true,\"id_slot\":%d,"
	                 "\"samplers\":[\"top_k\"],\"top_k\":1,\"return_tokens\":true,"
	                 "\"grammar\":\"root ::=",
	                 k, slot);
	strbuf_append(&b, head, (size_t)n);
	for (size_t j = 1; j < k; j++) {
		char id[32];
		n = snprintf(id, sizeof id, " <[%d]>", tokens[done + j]);
		strbuf_append(&b, id, (size_t)n);
	}
	strbuf_append(&b, "\"", 1);
	append_lora(&b, lora);
	strbuf_append(&b, "}", 1);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* The token a cut puts after the kept prefix of tokens[0..n): one they do
 * not have there, so that the next step's common prefix with the slot ends
 * exactly at the cut. */
static token_t junk_after(const token_t *tokens, size_t n, size_t keep)
{
	token_t next = keep < n ? tokens[keep] : 0;
	return next > 0 ? next - 1 : next + 1;
}

/* Counts a step's evaluated tokens as the request's. */
static void note_step(struct serve_req *r, long long prompt_n, double ms)
{
	r->run.steps++;
	r->run.steps_prompt_n += prompt_n;
	r->run.steps_prompt_ms += ms;
}

/* A step the backend refused (or answered with no timings): its status
 * and message reach the client, as the answer's own would. */
static void step_refused(struct serve_req *r, const char *what, int status, const char *body,
                         size_t len)
{
	char msg[300];
	json_body_error(body, len, what, msg, sizeof msg);
	log_warn("%s on slot %d failed (%d): %s", what, r->run.slot->id, status, msg);
	req_fail(r, status >= 400 ? status : 502, msg);
}

void exec_call_failed(struct serve_req *r, enum backend_error err)
{
	if (req_try_elsewhere(r, err))
		return;
	if (err == BACKEND_ERR_CONNECT && r->run.backend)
		backend_mark_down(r->run.backend, backend_error_text(err));
	log_warn("request on %s failed: %s", r->run.backend ? r->run.backend->rb->url : "?",
	         backend_error_text(err));
	req_fail(r, err == BACKEND_ERR_TIMEOUT ? 504 : 502, backend_error_text(err));
}

static void on_step_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	exec_call_failed(r, err);
}

/* A completion task of n_task tokens (the prompt's first n_known, and a
 * cut's throw-away one) goes to the request's slot: what the server's RAM
 * cache does with the slot's content (router/ram.h). */
static void ram_task(struct serve_req *r, size_t n_known, size_t n_task)
{
	struct router_slot *s = r->run.slot;
	if (s && router_ram_active(r->d->router, s->backend))
		router_ram_task(&s->backend->ram, s, r->prompt.tokens, n_known, n_task);
}

/* Sends a cut: the slot is left holding tokens[0..keep) (of n, the
 * prompt's first, or the prompt and a kept answer) and one token that
 * differs from their next, so that the server reuses exactly keep tokens
 * next (it reuses the longest common prefix). Returns 0, or -1 when out of
 * memory. */
static int send_cut_of(struct serve_req *r, const token_t *tokens, size_t n, size_t keep,
                       const struct backend_call_handlers *h)
{
	r->run.cut_keep = keep;
	r->run.cut_junk = junk_after(tokens, n, keep);
	ram_task(r, keep < r->prompt.n_tokens ? keep : r->prompt.n_tokens, keep + 1);
	char *body =
	    prefill_body(tokens, keep, 1, r->run.cut_junk, r->run.slot->id, 1, r->ask.lora);
	r->run.call = body ? backend_call_start(r->run.backend->http, "POST", "/completion", body,
	                                        strlen(body), h, r)
	                   : NULL;
	free(body);
	return r->run.call ? 0 : -1;
}

static int send_cut(struct serve_req *r, size_t keep, const struct backend_call_handlers *h)
{
	return send_cut_of(r, r->prompt.tokens, r->prompt.n_tokens, keep, h);
}

/* ---- save and restore: slot files ---- */

static void on_slot_saved(struct router_saved *e, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	r->run.saving = 0;
	if (!r->reply.client && r->state == RS_DONE) {
		req_free(r);
		return;
	}
	run_step(r);
}

static void step_save(struct serve_req *r, size_t upto)
{
	r->run.saving = 1;
	if (slot_store_save(r->d, r->run.backend, r->run.slot, on_slot_saved, r) != 0) {
		r->run.saving = 0;
		run_step(r);
	}
}

/* The restore failed or the file is damaged: forget the slot, whose content
 * is unknown now, and evaluate the whole prompt instead. */
static void restore_instead_recompute(struct serve_req *r)
{
	settle(r, SLOT_UNKNOWN, 0, 0);
	r->run.choice.reuse = 0;
	r->run.choice.matched = 0;
	r->run.choice.must_trim = 0;
	r->run.choice.kind = "miss";
	r->run.done_upto = 0;
	plan_free(&r->run.plan);
	if (plan_build(&r->run.plan, r->prompt.bounds, r->prompt.n_bounds, r->prompt.n_tokens, 0, 0,
	               0, 0, sched_max_step(r->run.slot->backend->n_ubatch),
	               r->run.slot->backend->n_ubatch) != 0) {
		req_fail(r, 500, "out of memory");
		return;
	}
	run_step(r);
}

static void on_restore_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct serve_req *r = arg;
	struct daemon *d = r->d;
	struct router_saved *e = r->run.choice.restore;
	r->run.call = NULL;
	slot_store_restored(d, e);
	json_t *o = json_body(status, body, len, JSON_OBJECT);
	long long n_read = json_integer_value(json_object_get(o, "n_read"));
	double ms = json_number_value(json_object_get(json_object_get(o, "timings"), "restore_ms"));
	json_decref(o);
	if (!o) {
		int shown = (int)(len > 200 ? 200 : len);
		if (e->backend != r->run.slot->backend) {
			/* Another backend's state: the file may well be sound, and
			 * this server not reading the folder its writer does. */
			log_warn(
			    "restore of %s (saved by %s) into slot %d of %s failed (%d): %.*s; "
			    "is --slot-dir this backend's --slot-save-path? Only its own "
			    "states are restored there from now on",
			    e->name, e->backend->url, r->run.slot->id, r->run.slot->backend->url,
			    status, shown, body);
			r->run.slot->backend->foreign_restore_failed = 1;
			unpin_restore(r);
		} else {
			/* The file is gone or refused: forget it, and the slot. */
			log_warn("restore of %s into slot %d failed (%d): %.*s", e->name,
			         r->run.slot->id, status, shown, body);
			unpin_restore(r);
			slot_store_delete(d, e);
		}
		restore_instead_recompute(r);
		return;
	}
	router_backend_note_restore(r->run.slot->backend, (uint64_t)n_read, ms);
	settle(r, SLOT_RESTORED, 0, 0);
	d->stats.restores++;
	d->stats.disk_hits++;
	log_info("restored %s (%zu tokens, %lld bytes, %.1f ms) into slot %d%s%s", e->name,
	         e->n_tokens, n_read, ms, r->run.slot->id,
	         e->backend != r->run.slot->backend ? " of " : "",
	         e->backend != r->run.slot->backend ? r->run.slot->backend->url : "");
	snprintf(r->run.restored_name, sizeof r->run.restored_name, "%s", e->name);
	unpin_restore(r);
	r->run.restored = 1;
	/* A save may have gone over the cap while this state was pinned. */
	slot_store_enforce_budget(d);
	run_step(r);
}

static const struct backend_call_handlers restore_handlers = {
    .on_done = on_restore_done,
    .on_error = on_step_error,
};

static void step_restore(struct serve_req *r, size_t upto)
{
	struct router_saved *e = r->run.choice.restore;
	if (!e) {
		run_step(r);
		return;
	}
	if (slot_store_verify(r->d, e) != 0) {
		/* Deleted as damaged: recompute instead. */
		r->run.choice.restore = NULL;
		restore_instead_recompute(r);
		return;
	}
	char path[64];
	snprintf(path, sizeof path, "/slots/%d?action=restore", r->run.slot->id);
	char filename[128];
	snprintf(filename, sizeof filename, "%s.bin", e->name);
	json_t *req = json_pack("{s:s}", "filename", filename);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	r->run.call = body ? backend_call_start(r->run.backend->http, "POST", path, body,
	                                        strlen(body), &restore_handlers, r)
	                   : NULL;
	free(body);
	if (!r->run.call)
		req_fail(r, 500, "out of memory");
}

/* ---- cut and prefill ---- */

static void on_cut_done(struct backend_call *call, int status, const char *body, size_t len,
                        void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	long long cache_n, prompt_n;
	double ms;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) != 0) {
		step_refused(r, "the backend refused to cut the slot back", status, body, len);
		return;
	}
	note_step(r, prompt_n, ms);
	struct router_ram *ram = &r->run.slot->backend->ram;
	if ((size_t)cache_n != r->run.cut_keep) {
		char why[160];
		snprintf(
		    why, sizeof why, "a cut to %zu tokens kept %lld%s", r->run.cut_keep, cache_n,
		    r->run.choice.from_ram ? " (the state was no longer in the server's RAM)" : "");
		ram->misses += r->run.choice.from_ram;
		step_went_wrong(r, why);
		return;
	}
	if (r->run.choice.from_ram) {
		ram->loads++;
		settle(r, SLOT_LOADED, 0, 0);
	} else {
		settle(r, SLOT_CUT, 0, 0);
	}
	r->run.done_upto = r->run.cut_keep;
	if (r->run.cut_keep)
		r->d->stats.trim_tokens++;
	run_step(r);
}

static const struct backend_call_handlers cut_handlers = {
    .on_done = on_cut_done,
    .on_error = on_step_error,
};

static void step_cut(struct serve_req *r, size_t keep)
{
	if (send_cut(r, keep, &cut_handlers) != 0)
		req_fail(r, 500, "out of memory");
}

static void on_prefill_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	long long cache_n, prompt_n;
	double ms;
	size_t upto = r->run.plan.steps[r->run.plan.next - 1].upto;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) != 0) {
		step_refused(r, "the backend refused a prefill step", status, body, len);
		return;
	}
	note_step(r, prompt_n, ms);
	if (upto == r->run.done_upto + 1 && prompt_n == 1) {
		/* A chunk of one token: an earlier answer's, evaluated as its
		 * generation did (router/sched.h, steps). */
		r->run.replayed++;
		r->d->stats.replayed_tokens++;
	}
	if ((size_t)cache_n != r->run.done_upto || (size_t)(cache_n + prompt_n) != upto) {
		char why[160];
		snprintf(why, sizeof why,
		         "a chunk to %zu reused %lld tokens and evaluated %lld, not %zu", upto,
		         cache_n, prompt_n, r->run.done_upto);
		step_went_wrong(r, why);
		return;
	}
	r->run.done_upto = upto;
	r->d->stats.prefill_steps++;
	next_step(r);
}

/* After a prefill step: the next one. Once the client went away,
 * llama-server alone would have run on to the end of the batch it was in
 * (up to one max step from where the step in flight began): so do the
 * steps that fit there, no more, and keep what they evaluated. */
static void next_step(struct serve_req *r)
{
	if (r->run.abandoned) {
		const struct plan_step *next = &r->run.plan.steps[r->run.plan.next];
		if (r->run.plan.next < r->run.plan.n && next->kind == STEP_PREFILL &&
		    next->upto - r->run.abandoned_at <=
		        sched_max_step(r->run.slot->backend->n_ubatch)) {
			run_step(r);
			return;
		}
		keep_abandoned(r);
		return;
	}
	run_step(r);
}

static const struct backend_call_handlers prefill_handlers = {
    .on_done = on_prefill_done,
    .on_error = on_step_error,
};

static void prefill_plain(struct serve_req *r, size_t upto);

/* A step's POST /completion of body (which it frees; NULL when making it
 * ran out of memory). */
static void start_completion(struct serve_req *r, char *body, const struct backend_call_handlers *h)
{
	r->run.call = body ? backend_call_start(r->run.backend->http, "POST", "/completion", body,
	                                        strlen(body), h, r)
	                   : NULL;
	free(body);
	if (!r->run.call)
		req_fail(r, 500, "out of memory");
}

/* Where the forced run went otherwise than asked, the server cannot be
 * trusted with one: the steps go one request each from here. */
static void forced_refused(struct serve_req *r, const char *why)
{
	struct backend *b = r->run.backend;
	if (!b->forced_refused)
		log_warn(
		    "slot %d: a forced generation of an earlier answer's tokens went wrong (%s): "
		    "one request per token on this backend from now on",
		    r->run.slot->id, why);
	b->forced_refused = 1;
}

static void on_forced_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	(void)call;
	struct serve_req *r = arg;
	r->run.call = NULL;
	size_t k = r->run.forced, done = r->run.done_upto;
	r->run.forced = 0;
	json_t *o = json_body(status, body, len, -1);
	struct step_counts c;
	if (read_counts(o, &c) != 0 || status != 200) {
		/* Not answered: a server without grammars of token ids (older
		 * than the pinned one) refuses the run (400, nothing of it ran);
		 * one that fails it while sampling answers 500 (below). */
		char msg[200], why[260];
		json_body_error(body, len, "no timings", msg, sizeof msg);
		snprintf(why, sizeof why, "%d: %s", status, msg);
		json_decref(o);
		if (status == 500) {
			/* The server's grammar matches tokens as text: one whose
			 * piece is empty, or bytes that are not UTF-8 (a random
			 * model's answer), cannot be forced, and the sampler
			 * fails, after the server evaluated the run's first
			 * token (which it counts). This run goes one request per
			 * token, from that token again. */
			note_step(r, 1, 0);
			log_info(
			    "slot %d: a forced run of %zu tokens from %zu failed on the server "
			    "(%s): one request per token for it",
			    r->run.slot->id, k, done, why);
			r->run.forced_failed = done + k;
		} else {
			forced_refused(r, why);
		}
		prefill_plain(r, done + 1);
		return;
	}
	long long cache_n = c.cache_n, prompt_n = c.prompt_n, predicted_n = c.predicted_n;
	double ms = c.prompt_ms + c.predicted_ms;
	/* The tokens decoded (all but the last sampled, which may be an end
	 * of generation the answer does not list) must be the prompt's. */
	json_t *got = json_object_get(o, "tokens");
	int same = json_array_size(got) + 1 >= k;
	for (size_t j = 0; same && j + 1 < k; j++)
		same = json_integer_value(json_array_get(got, j)) == r->prompt.tokens[done + 1 + j];
	json_decref(o);
	/* The rows it decoded are evaluated tokens of this prompt like the
	 * rest (cached + evaluated is the prompt), though the server counts
	 * them as predicted: the stats say how many (replay_forced_tokens). */
	long long decoded = predicted_n > 0 ? predicted_n - 1 : 0;
	note_step(r, prompt_n + decoded, ms);
	r->d->stats.replay_forced_tokens += (uint64_t)decoded;
	if (!same || predicted_n != (long long)k || cache_n != (long long)done || prompt_n != 1) {
		char why[200];
		snprintf(
		    why, sizeof why,
		    "a forced run of %zu tokens from %zu reused %lld, evaluated %lld, generated "
		    "%lld%s",
		    k, done, cache_n, prompt_n, predicted_n, same ? "" : ", other tokens");
		if (!same || predicted_n != (long long)k)
			forced_refused(r, why);
		step_went_wrong(r, why);
		return;
	}
	r->run.replayed += k;
	r->d->stats.replayed_tokens += k;
	r->d->stats.prefill_steps++;
	r->run.done_upto = done + k;
	r->run.plan.next += k - 1;
	next_step(r);
}

static const struct backend_call_handlers forced_handlers = {
    .on_done = on_forced_done,
    .on_error = on_step_error,
};

/* Starts a run of one-token steps from the one to `upto` as one forced
 * generation, where there is such a run of at least two and the server
 * takes them. Returns 1 when it did. */
static int start_forced(struct serve_req *r, size_t upto)
{
	size_t done = r->run.done_upto;
	if (upto != done + 1 || r->run.backend->forced_refused || done < r->run.forced_failed)
		return 0;
	size_t k = plan_forced_run(&r->run.plan, r->run.plan.next - 1, done);
	if (!k)
		return 0;
	log_debug("slot %d: a forced run of %zu tokens from %zu (%d .. %d)", r->run.slot->id, k,
	          done, r->prompt.tokens[done], r->prompt.tokens[done + k - 1]);
	ram_task(r, upto, upto);
	r->run.forced = k;
	start_completion(r, forced_body(r->prompt.tokens, done, k, r->run.slot->id, r->ask.lora),
	                 &forced_handlers);
	return 1;
}

/* Evaluates the prompt up to a chunk end. The first evaluation of a
 * request that reuses nothing starts from an empty slot (cache_prompt
 * false), as an uncached run does. */
static void step_prefill(struct serve_req *r, size_t upto)
{
	if (!start_forced(r, upto))
		prefill_plain(r, upto);
}

static void prefill_plain(struct serve_req *r, size_t upto)
{
	ram_task(r, upto, upto);
	start_completion(r,
	                 prefill_body(r->prompt.tokens, upto, 0, 0, r->run.slot->id,
	                              r->run.done_upto > 0, r->ask.lora),
	                 &prefill_handlers);
}

/* ---- generate: the request itself ---- */

/* Whether the keep after this answer may need the generated tokens' ids:
 * exact mode's steps on a chat answer. */
static int wants_ids(const struct serve_req *r)
{
	return req_exact(r) && r->prompt.routable && r->prompt.n_bounds && r->run.slot &&
	       r->run.slot->backend->steps && !r->run.slot->backend->cut_to_checkpoint &&
	       !strcmp(r->ask.backend_path, "/v1/chat/completions") &&
	       !answer_probs_asked(r->ask.body);
}

/* The server's sampling defaults, which a request's parameters override
 * (/props, default_generation_settings). */
static const json_t *default_sampling(const struct backend *b)
{
	return json_object_get(json_object_get(b->props, "default_generation_settings"), "params");
}

/* The body of this attempt: the request as made, with what this call adds
 * (the slot, exact mode's cache_prompt, the progress events toki reads).
 * The request's own body is never changed, so a retry or a replan has
 * nothing to undo. */
static json_t *attempt_body(struct serve_req *r)
{
	json_t *b = json_copy(r->ask.body); /* shallow: only the top keys are its own */
	if (!b)
		return NULL;
	if (server_picks_slot(r)) {
		json_object_del(b, "id_slot");
	} else if (r->run.slot) {
		json_object_set_new(b, "id_slot", json_integer(r->run.slot->id));
		/* Exact mode: with nothing evaluated or reused yet, the server
		 * starts from position 0, as an uncached run does, whatever the
		 * slot holds; after the earlier chunks it must reuse them (even
		 * for a client that asked for an uncached run: they were its
		 * uncached run). */
		if (r->prompt.routable && req_exact(r))
			json_object_set_new(b, "cache_prompt", json_boolean(r->run.done_upto > 0));
	}
	/* The first progress event lets toki check its plan before the answer
	 * starts (req_check_plan); events the client did not ask for are
	 * dropped. */
	r->run.added_progress =
	    r->ask.stream && r->prompt.routable && r->ask.kind != KIND_RESPONSES &&
	    (r->prompt.local || req_exact(r)) && !json_object_get(r->ask.body, "return_progress");
	if (r->run.added_progress)
		json_object_set_new(b, "return_progress", json_true());
	/* The keep after the answer (below) keeps the tokens generation made
	 * by their ids, where the answer lists them. */
	r->run.added_probs = wants_ids(r) &&
	                     answer_ids_cheap(r->ask.body, default_sampling(r->run.backend)) &&
	                     answer_ids_ask(b) == 0;
	req_apply_cap(r, b);
	return b;
}

static void step_generate(struct serve_req *r, size_t upto)
{
	r->state = RS_GENERATE;
	json_t *ob = attempt_body(r);
	char *body = ob ? json_dumps(ob, JSON_COMPACT) : NULL;
	json_decref(ob);
	if (!body) {
		req_fail(r, 500, "out of memory");
		return;
	}
	r->run.progress_checked = 0;
	r->run.t_forward_us = clock_now_us();
	if (r->prompt.routable && !server_picks_slot(r))
		ram_task(r, r->prompt.n_tokens, r->prompt.n_tokens);
	reply_start_attempt(r);
	/* Every request gets one line when it ends; this one, as it starts,
	 * only when its prefill will be long enough to wait for. */
	if (r->prompt.routable)
		log_write(r->run.choice.est_prefill_s >= 1.0 ? LOG_INFO : LOG_DEBUG,
		          "%s slot=%d route=%s prompt=%zu matched=%zu reuse=%zu est_prefill=%.0fms",
		          r->ask.client_path, r->run.slot ? r->run.slot->id : -1,
		          r->run.choice.kind, r->prompt.n_tokens, r->run.choice.matched,
		          r->run.choice.reuse, r->run.choice.est_prefill_s * 1000.0);
	r->run.call = backend_call_start(
	    r->run.backend->http, "POST", r->ask.backend_path, body, strlen(body),
	    r->ask.stream ? &reply_stream_handlers : &reply_handlers, r);
	free(body);
	if (!r->run.call)
		req_fail(r, 500, "out of memory");
}

void exec_generate(struct serve_req *r)
{
	step_generate(r, 0);
}

static void run_step(struct serve_req *r)
{
	if (r->run.plan.next >= r->run.plan.n) {
		req_fail(r, 500, "the request's plan ended without an answer");
		return;
	}
	struct plan_step *st = &r->run.plan.steps[r->run.plan.next++];
	reply_arm_stream(r);
	r->state = row_of(st->kind);
	step_table[r->state].start(r, st->upto);
}

/* ---- after a cancel (exact mode): wait until the slot is really free ----
 *
 * llama-server stops a cancelled task only at its next check (after the
 * prefill it is in), and a request that ran beside it would share its
 * batches: exact mode keeps the slot, and so its backend, busy until GET
 * /slots says the slot is idle. The slot's record then says what it holds,
 * and the next request cuts it back on its own path, as after any answer.
 * (Cutting here instead, off that path, was taken out on a wrong diagnosis:
 * the differences blamed on it were number rewriting, fixed in
 * answer_rewrite. docs/exact.md says so; it may come back.) */

/* After the answer (or a cancel): the slot's content is unknown, it is
 * free, and the request is over. */
static void forget_and_finish(struct serve_req *r)
{
	settle(r, SLOT_UNKNOWN, 0, 0);
	slot_free(r);
	req_finish(r);
}

/* A call made after the answer failed: what the slot holds is unknown. */
static void on_after_answer_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	forget_and_finish(r);
}

static void poll_idle(evutil_socket_t fd, short what, void *arg);

static void on_idle_poll_done(struct backend_call *call, int status, const char *body, size_t len,
                              void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	json_t *a = json_body(status, body, len, JSON_ARRAY);
	int known = 0, busy = 0;
	size_t i;
	json_t *e;
	json_array_foreach(a, i, e)
	{
		if (json_integer_value(json_object_get(e, "id")) == r->run.slot->id) {
			known = 1;
			busy = json_is_true(json_object_get(e, "is_processing"));
		}
	}
	json_decref(a);
	if (!known) {
		forget_and_finish(r);
		return;
	}
	if (busy) {
		struct timeval tv = {0, 20000};
		if (!r->run.idle_ev)
			r->run.idle_ev = evtimer_new(r->d->base, poll_idle, r);
		if (r->run.idle_ev && evtimer_add(r->run.idle_ev, &tv) == 0)
			return;
		forget_and_finish(r);
		return;
	}
	/* Stopped after its whole prompt: its tail goes, as after an answer. */
	if (start_tail_cut(r))
		return;
	slot_free(r);
	req_finish(r);
}

static const struct backend_call_handlers idle_poll_handlers = {
    .on_done = on_idle_poll_done,
    .on_error = on_after_answer_error,
};

static void poll_idle(evutil_socket_t fd, short what, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = backend_call_start(r->run.backend->http, "GET", "/slots", NULL, 0,
	                                 &idle_poll_handlers, r);
	if (!r->run.call)
		forget_and_finish(r);
}

static int start_settle(struct serve_req *r)
{
	r->state = RS_SETTLE;
	r->run.call = backend_call_start(r->run.backend->http, "GET", "/slots", NULL, 0,
	                                 &idle_poll_handlers, r);
	return r->run.call != NULL;
}

/* ---- after the answer (exact mode): the slot's useless tail ----
 *
 * The slot holds the prompt and the answer's tokens, computed one at a
 * time; exact mode can reuse neither those nor the rows of the prompt's
 * last micro-batch (the generation prompt: in a longer prompt the chunk
 * there is longer). Cutting them off now, after the answer was sent,
 * takes the cut off the next request's path: a resend evaluates only its
 * generation prompt. Until the cut is done the slot, and exact mode's
 * backend, stays busy, so nothing shares a batch with it. (This cut was
 * once removed on a wrong diagnosis: answers after it differed from the
 * uncached run in their last logprob digits, which was the 15-digit
 * rewrite of multi-step answers, fixed since; test_exact_identity compares
 * every resend after such a cut with the uncached answer.) */

/* A cut after an answer, done: its tokens counted (no request's cache
 * block counts them: /toki/stats does). Returns the server's cache_n, -1
 * when its answer has none. */
static long long cut_counted(struct serve_req *r, int status, const char *body, size_t len)
{
	long long cache_n = -1, prompt_n = 0;
	double ms;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) == 0) {
		r->run.slot->backend->evaluated_tokens += (uint64_t)prompt_n;
		r->d->stats.evaluated_tokens += (uint64_t)prompt_n;
		r->d->stats.tail_cuts++;
		r->d->stats.tail_cut_tokens += (uint64_t)prompt_n;
	}
	return cache_n;
}

static void on_tail_cut_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	long long cache_n = cut_counted(r, status, body, len);
	settle(r, cache_n == (long long)r->run.cut_keep ? SLOT_CUT : SLOT_UNKNOWN, 0, 0);
	slot_free(r);
	req_finish(r);
}

static const struct backend_call_handlers tail_cut_handlers = {
    .on_done = on_tail_cut_done,
    .on_error = on_after_answer_error,
};

/* ---- after the answer (exact mode): the answer's rows kept ----
 *
 * Generation computed the answer's rows one token at a time, as exact
 * mode's schedule evaluates an earlier answer's tokens (its steps,
 * prompt/prompt.c): the next turn of the conversation can reuse them as
 * they are, and then evaluates what llama-server alone would. The keep
 * sends the prompt and the answer's tokens (n_predict 0): generation's
 * own, by the ids the answer lists (toki asks for them where they cost
 * nothing, serve/answer.h), else the text's; the server's own counts say
 * how many of them the slot held: it reuses the common prefix and
 * evaluates the rest. The slot holds the prompt and all but the last generated token
 * (sampled, never evaluated). When the text's tokens are more than that
 * (the answer hit its length), the keep evaluates the last one alone, a
 * step as generation's own; when they are not (it ended on an end of turn,
 * not in the text), it evaluates a throw-away token after them, which
 * needs no cut back (a recurrent state cannot be cut back but to a
 * checkpoint). Where the tokens differ (text that re-tokenizes another
 * way, a tool call the template writes otherwise) the rows from the first
 * difference on are a batch: a cut right after takes them off, and only
 * those before it are kept. An answer with reasoning or tool calls is kept
 * by its tokens as the template writes it (answer_tokens), which is how a
 * model of the family writes it. One token evaluated, as the tail cut it
 * replaces, off the next request's path; none where the ids are sure to be
 * the generated tokens (ids_sure): the slot holds their rows already, and
 * the keep only records them (KEEP_HELD). */

/* After a keep whose tokens parted from generation's (an answer that does
 * not come back as generated): the slot's rows from there on are a
 * batch's. The next turn would have to cut them off before reusing the
 * rows before them; cut now, while the agent runs its tool, and the next
 * turn evaluates what llama-server alone does. */
static void on_kept_cut_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	long long cache_n = cut_counted(r, status, body, len);
	size_t at = r->run.cut_keep;
	if (cache_n == (long long)at) {
		r->run.kept[at] = r->run.cut_junk;
		r->run.n_kept = at;
		r->run.kept_junk = 1;
		settle(r, SLOT_KEPT, at, 0);
	} else {
		settle(r, SLOT_UNKNOWN, 0, 0);
	}
	slot_free(r);
	req_finish(r);
}

static const struct backend_call_handlers kept_cut_handlers = {
    .on_done = on_kept_cut_done,
    .on_error = on_after_answer_error,
};

/* Cuts the kept tokens back to at (< n_kept): 1 when the cut is out. */
static int start_kept_cut(struct serve_req *r, size_t at)
{
	return send_cut_of(r, r->run.kept, r->run.n_kept, at, &kept_cut_handlers) == 0;
}

/* A keep that leaves the slot's rows to `aligned` as generation made them. */
static void count_kept(struct serve_req *r, size_t aligned)
{
	struct daemon_stats *st = &r->d->stats;
	size_t n = r->prompt.n_tokens;
	if (aligned <= n)
		return;
	st->answers_kept++;
	st->answer_rows_kept += aligned - n;
	st->answers_kept_by_ids += (uint64_t)r->run.kept_by_ids;
}

static void on_keep_done(struct backend_call *call, int status, const char *body, size_t len,
                         void *arg)
{
	struct serve_req *r = arg;
	struct daemon *d = r->d;
	r->run.call = NULL;
	long long cache_n = -1, prompt_n = 0;
	double ms;
	size_t n = r->prompt.n_tokens, end = r->run.n_kept;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) == 0) {
		r->run.slot->backend->evaluated_tokens += (uint64_t)prompt_n;
		d->stats.evaluated_tokens += (uint64_t)prompt_n;
		d->stats.tail_cuts++;
		d->stats.tail_cut_tokens += (uint64_t)prompt_n;
	}
	log_debug(
	    "slot %d: the keep after an answer: prompt %zu, answer %zu tokens (by their %s)%s; "
	    "the server reused %lld, evaluated %lld",
	    r->run.slot->id, n, end - n, r->run.kept_by_ids ? "ids" : "text",
	    r->run.kept_junk ? " and a throw-away one" : "", cache_n, prompt_n);
	if (cache_n < 0 || prompt_n < 1 ||
	    cache_n + prompt_n != (long long)(end + (size_t)r->run.kept_junk)) {
		settle(r, SLOT_UNKNOWN, 0, 0);
	} else {
		/* Rows before cache_n are the slot's; one evaluated alone is a
		 * step too; a batch is not. */
		size_t c = (size_t)cache_n, aligned = prompt_n == 1 && c < end ? c + 1 : c;
		if (aligned > end)
			aligned = end;
		if (c < n)
			aligned = sched_floor(r->prompt.bounds, r->prompt.n_bounds, n, c,
			                      r->run.slot->backend->n_ubatch);
		count_kept(r, aligned);
		if (aligned >= n && aligned < end && start_kept_cut(r, aligned))
			return;
		settle(r, SLOT_KEPT, aligned, 0);
	}
	slot_free(r);
	req_finish(r);
}

static const struct backend_call_handlers keep_handlers = {
    .on_done = on_keep_done,
    .on_error = on_after_answer_error,
};

/* The tokens of the prompt and the answer after it into t: a plain text's
 * own tokens; an answer with reasoning or tool calls as the template
 * writes it as the latest turn, which is the format a model of the
 * family generates (bench/bench_families.py), up to the end of the turn.
 * 0, or -1 when there are none to keep. */
static int answer_tokens(struct serve_req *r, const struct vocab *v, struct token_list *t)
{
	const struct answer_msg *m = &r->reply.msg;
	size_t n = r->prompt.n_tokens, g = r->run.slot->generated;
	/* The generated tokens themselves, where the answer lists them: all of
	 * them, or all but one, which is then the last (a stream's end of
	 * generation, or a one-token stop string, whose text never came out:
	 * one missing elsewhere makes the server's counts below disagree, and
	 * the keep is cut back to what they agree on). Not where the server
	 * cannot cut the slot back to any position: the next turn's prompt
	 * has the text's tokens, and a slot that holds others there could
	 * only go back to a checkpoint before the answer. */
	if (m->n_ids <= g && m->n_ids + 1 >= g && !r->run.slot->backend->cut_to_checkpoint) {
		if (token_list_append(t, r->prompt.tokens, n) != 0 ||
		    token_list_append(t, m->ids, m->n_ids) != 0)
			return -1;
		r->run.kept_by_ids = 1;
		t->n = vocab_find_control(v, t->v, n, t->n);
		return t->n > n ? 0 : -1;
	}
	if (!answer_msg_structured(m))
		return m->text.len && token_list_append(t, r->prompt.tokens, n) == 0 &&
		               vocab_tokenize_fragment(v, m->text.p, m->text.len, 0, t) == 0 &&
		               t->n > n
		           ? 0
		           : -1;
	json_t *msg = answer_msg_json(m);
	char why[256];
	enum chat_result cr = msg ? prompt_engine_chat_answer(
	                                r->prompt.engine_backend->prompt,
	                                r->ask.template_body ? r->ask.template_body : r->ask.body,
	                                msg, time(NULL), t, why, sizeof why)
	                          : CHAT_ERROR;
	json_decref(msg);
	if (cr != CHAT_OK || t->n <= n || memcmp(t->v, r->prompt.tokens, n * sizeof *t->v) != 0) {
		log_debug("slot %d: no keep for the answer: %s", r->run.slot->id,
		          cr != CHAT_OK ? why : "its rendering does not follow the prompt");
		return -1;
	}
	size_t e = vocab_find_control(v, t->v, n, t->n);
	t->n = e;
	return e > n ? 0 : -1;
}

/* Whether the ids the answer listed are the generated tokens the slot
 * holds: all of them were listed; or, in a stream that ended on its own
 * (not at its length), all but one, the last listed no end of generation.
 * A stream lists a token with the event of its text, so its end of
 * generation (no text) never; any other unlisted token (one that ends
 * inside a UTF-8 character, text the chat parser holds back, a stop
 * string's) would be a second. Elsewhere one unlisted may be any: a token
 * that ends inside a character is listed with the next one's text, which
 * then carries both, so the listed text spells the answer either way; the
 * keep's own counts tell. */
static int ids_sure(const struct serve_req *r, const struct vocab *v)
{
	const struct answer_msg *m = &r->reply.msg;
	size_t g = r->run.slot->generated;
	if (m->n_ids == g)
		return 1;
	return r->ask.stream && m->finished && !m->cut_at_length && m->n_ids && m->n_ids + 1 == g &&
	       vocab_find_control(v, m->ids, m->n_ids - 1, m->n_ids) == m->n_ids;
}

static enum keep_outcome start_keep(struct serve_req *r)
{
	struct router_slot *s = r->run.slot;
	size_t n = r->prompt.n_tokens, nb = r->prompt.n_bounds;
	struct backend *eb = r->prompt.engine_backend;
	if (!r->prompt.routable || !nb || !s->backend->steps || s->n_tokens != n ||
	    s->aligned != n || !s->generated || r->reply.msg.failed || !eb || !eb->prompt)
		return KEEP_NONE;
	/* The rows of the prompt's last chunk were computed as an open chunk
	 * (the grid from its start); kept answer rows after it close it, and
	 * a closed chunk whose tail splits would mean other rows. */
	if (sched_tail_split(r->prompt.bounds[nb - 1], n, s->backend->n_ubatch))
		return KEEP_NONE;
	const struct vocab *v = prompt_engine_vocab(eb->prompt);
	struct token_list t = {0};
	if (answer_tokens(r, v, &t) != 0) {
		token_list_free(&t);
		return KEEP_NONE;
	}
	/* What the slot holds: the prompt and the generated tokens but the
	 * last. */
	size_t held = n + s->generated - 1;
	if (r->run.kept_by_ids && t.n >= held && ids_sure(r, v)) {
		/* They are the tokens, and generation's rows: nothing to send.
		 * The last one, where it is no end of turn, is the next turn's
		 * to evaluate, as alone. */
		free(r->run.kept);
		r->run.kept = t.v;
		r->run.n_kept = held;
		r->run.kept_junk = 0;
		log_debug(
		    "slot %d: the keep after an answer: prompt %zu, answer %zu tokens, by their "
		    "ids, held as generation left them",
		    s->id, n, held - n);
		count_kept(r, held);
		settle(r, SLOT_KEPT, held, 0);
		return KEEP_HELD;
	}
	token_t last = t.v[t.n - 1], bos = vocab_bos(v);
	token_t junk = bos >= 0 && bos != last ? bos : last > 0 ? last - 1 : last + 1;
	r->run.kept_junk = t.n <= held;
	if (r->run.kept_junk && token_list_push(&t, junk) != 0) {
		token_list_free(&t);
		return KEEP_NONE;
	}
	free(r->run.kept);
	r->run.kept = t.v;
	r->run.n_kept = t.n - (size_t)r->run.kept_junk;
	ram_task(r, n, t.n);
	char *body = prefill_body(t.v, t.n, 0, 0, s->id, 1, r->ask.lora);
	r->run.call = body ? backend_call_start(r->run.backend->http, "POST", "/completion", body,
	                                        strlen(body), &keep_handlers, r)
	                   : NULL;
	free(body);
	if (!r->run.call)
		return KEEP_NONE;
	r->state = RS_TAILCUT;
	return KEEP_SENT;
}

/* Returns 1 when the cut is out (it ends the slot and the request), 0 when
 * there is nothing to cut or it could not be sent. */
static int start_tail_cut(struct serve_req *r)
{
	struct router_slot *s = r->run.slot;
	if (!r->prompt.routable || s->n_tokens != r->prompt.n_tokens || !r->prompt.n_tokens)
		return 0;
	/* Where the micro-batch holding the prompt's last token starts. */
	size_t keep = sched_floor(s->bounds, s->n_bounds, s->aligned, r->prompt.n_tokens - 1,
	                          s->backend->n_ubatch);
	if (!keep || send_cut(r, keep, &tail_cut_handlers) != 0)
		return 0;
	r->state = RS_TAILCUT;
	return 1;
}

/* An error answer (the server's 4xx or 5xx, or a stream that ends in an
 * error event instead of its timings, such as llama-server's for an answer
 * its chat parser rejects, sent after the whole generation):
 * the slot holds the prompt as far as the earlier steps or the reuse took
 * it (done_upto), then whatever the failed call left there, unseen: the
 * rest of the prompt and an answer, or nothing. Cutting it back to
 * done_upto makes toki's record true again, and the cut's own count
 * checks that (on_tail_cut_done); forgetting the slot would lose what it
 * holds. Returns 1 when the cut is out (it ends the slot and the
 * request). */
static int start_error_cut(struct serve_req *r)
{
	struct router_slot *s = r->run.slot;
	size_t keep = r->run.done_upto;
	if (r->reply.status <= 0 || !r->prompt.routable || !keep || keep >= r->prompt.n_tokens ||
	    s->retired || !r->run.backend || !backend_is_up(r->run.backend) || server_picks_slot(r))
		return 0;
	settle(r, req_exact(r) ? SLOT_ON_SCHEDULE : SLOT_HOLDS, keep, keep);
	if (send_cut(r, keep, &tail_cut_handlers) != 0) {
		settle(r, SLOT_UNKNOWN, 0, 0);
		return 0;
	}
	r->state = RS_TAILCUT;
	return 1;
}

/* ---- routing ---- */

/* Exact mode's schedule evaluates earlier answers one token at a time
 * (steps) only where the self-test found that this gives generation's
 * rows (router.h, steps). Where a backend the request may go to did not,
 * the request takes its schedule without steps, whichever backend it
 * lands on: one schedule for the request, as its uncached reference. */
static void without_steps_where_they_fail(struct serve_req *r)
{
	struct daemon *d = r->d;
	if (!r->prompt.plain_bounds)
		return;
	uint64_t allowed = r->ask.allowed & ~r->tries.excluded;
	for (int i = 0; i < d->n_backends; i++) {
		const struct router_backend *rb = d->backends[i]->rb;
		if (!rb->up || rb->steps || (i < 64 && !(allowed >> i & 1)))
			continue;
		free(r->prompt.bounds);
		r->prompt.bounds = r->prompt.plain_bounds;
		r->prompt.n_bounds = r->prompt.n_plain_bounds;
		r->prompt.plain_bounds = NULL;
		r->prompt.n_plain_bounds = 0;
		return;
	}
}

/* Routes the request (or queues it), takes its slot, plans, and runs the
 * first step. */
void exec_route(struct serve_req *r)
{
	struct daemon *d = r->d;
	if (!r->prompt.routable) {
		/* A client-pinned slot is on the backend it was pinned on. */
		struct backend *b = r->run.slot ? r->run.backend : req_any_backend(r);
		if (!b) {
			/* As below: a supervised llama-server comes back. */
			if (r->state == RS_WAITING)
				return;
			if (d->supervisor)
				wait_add(r);
			else
				req_fail(r, 503, "no backend is up");
			return;
		}
		wait_remove(r);
		r->run.backend = b;
		exec_generate(r);
		return;
	}
	struct route_choice ch;
	int64_t now_us = clock_now_us();
	if (!r->run.t_route_us)
		r->run.t_route_us = now_us;
	if (req_exact(r))
		without_steps_where_they_fail(r);
	enum route_status st = router_choose_sched(d->router, r->prompt.tokens, r->prompt.n_tokens,
	                                           r->prompt.bounds, r->prompt.n_bounds, now_us,
	                                           r->ask.allowed & ~r->tries.excluded, &ch);
	if (st == ROUTE_NO_BACKEND && !d->supervisor) {
		wait_remove(r);
		req_fail(r, 503, "no backend is up");
		return;
	}
	if (st == ROUTE_NO_BACKEND)
		st = ROUTE_WAIT; /* the supervised llama-server is restarting */
	if (st == ROUTE_WAIT) {
		if (r->state != RS_WAITING)
			wait_add(r);
		return;
	}
	wait_remove(r);
	struct router_backend *rb = ch.slot->backend;
	if (req_clamp_output(r, rb->n_ctx_slot) != 0)
		return;
	if (r->ask.client_uncached || r->tries.force_cold || lora_apart(r)) {
		/* The client asked for a full evaluation (a raw run), or a plan
		 * went wrong, or its adapters are its own: nothing is reused, so
		 * there is nothing to cut back or restore; in exact mode the
		 * prompt is evaluated on its schedule from an empty slot. */
		ch.reuse = 0;
		ch.must_trim = 0;
		ch.restore = NULL;
		ch.kind = "miss";
		ch.est_prefill_s = router_estimate_prefill_s(ch.slot->backend, r->prompt.n_tokens);
	}
	r->run.choice = ch;
	r->run.backend = d->backends[rb->index];
	slot_take(r, ch.slot, ch.est_prefill_s);
	int kind = router_route_kind(ch.kind);
	d->stats.routed++;
	if (kind == ROUTE_HIT)
		d->stats.hits++;
	else if (kind == ROUTE_PARTIAL)
		d->stats.partials++;
	else
		d->stats.misses++;
	d->stats.prompt_tokens += r->prompt.n_tokens;
	rb->routes[kind]++;
	if (r->ask.kind < KIND_COUNT && !r->tries.replans)
		r->run.backend->routed_by_api[r->ask.kind]++;
	if (req_exact(r) && !r->tries.replans)
		r->run.backend->exact_schedule[r->prompt.n_bounds ? 0 : 1]++;
	if (req_exact(r) && r->tries.force_cold)
		r->run.backend->exact_cold_replans++;
	router_histogram_observe(&rb->wait, (double)(now_us - r->run.t_route_us) / 1e6);
	if (ch.restore)
		ch.restore->pinned++;
	/* Fast mode evaluates the prompt in one step, from whatever matches. */
	int exact = req_exact(r);
	plan_free(&r->run.plan);
	if (plan_build(&r->run.plan, exact ? r->prompt.bounds : NULL,
	               exact ? r->prompt.n_bounds : 0, r->prompt.n_tokens, ch.reuse,
	               ch.save_first && r->run.slot->n_tokens, ch.restore != NULL, ch.must_trim,
	               exact ? sched_max_step(r->run.slot->backend->n_ubatch) : 0,
	               r->run.slot->backend->n_ubatch) != 0) {
		req_fail(r, 500, "out of memory");
		return;
	}
	r->run.done_upto = ch.must_trim ? 0 : ch.reuse;
	run_step(r);
}
