/* The answer on its way to the client: the streamed response's start and
 * keep-alives, each event of the backend's stream, the whole answer of a
 * non-streamed request, and errors in the shape each API's clients read.
 * The rewriting of the bytes is answer.c's (pure functions); this module
 * decides what to rewrite with, from the request's facts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "api/anthropic.h"
#include "api/api_error.h"
#include "backend/selftest.h"
#include "daemon.h"
#include "http/http_server.h"
#include "serve/req.h"
#include "util/clock.h"
#include "util/json_body.h"
#include "util/log.h"

void reply_json(struct http_request *req, int status, json_t *obj)
{
	char *s = json_dumps(obj, JSON_COMPACT);
	if (!s) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_respond(req, status, "application/json", s, strlen(s));
	free(s);
}

void reply_write(struct serve_req *r, const char *data, size_t len)
{
	if (!r->reply.client)
		return;
	http_stream_write(r->reply.client, data, len);
	r->reply.t_last_write_us = clock_now_us();
}

static void write_strbuf(struct serve_req *r, struct strbuf *b)
{
	if (b->len)
		reply_write(r, b->p, b->len);
	strbuf_reset(b);
}

void reply_error(struct serve_req *r, int status, const char *message)
{
	struct req_reply *p = &r->reply;
	if (p->client && p->astream && p->stream_begun) {
		struct strbuf b;
		strbuf_init(&b);
		anthropic_stream_error(p->astream, status == 504 ? "timeout_error" : "api_error",
		                       message, &b);
		write_strbuf(r, &b);
		strbuf_free(&b);
		http_stream_end(p->client);
		p->client = NULL;
	}
	if (p->client) {
		if (r->ask.stream && p->stream_begun) {
			/* The chunk held back came from the server before the failure:
			 * the client gets it, as it was, before the error. */
			struct strbuf b = {0};
			answer_hold_release(&p->hold, NULL, NULL, &b);
			write_strbuf(r, &b);
			strbuf_free(&b);
			char *body = api_error_body(status, message, http_request_path(p->client));
			if (body) {
				reply_write(r, "data: ", 6);
				reply_write(r, body, strlen(body));
				reply_write(r, "\n\n", 2);
				free(body);
			}
			http_stream_end(p->client);
		} else {
			http_respond_error(p->client, status, message);
		}
		p->client = NULL;
	}
}

void reply_free(struct req_reply *p)
{
	anthropic_stream_free(p->astream);
	sse_parser_free(&p->sse);
	answer_hold_free(&p->hold);
	answer_msg_free(&p->msg);
	if (p->errbuf)
		evbuffer_free(p->errbuf);
	if (p->keepalive)
		event_free(p->keepalive);
	if (p->begin_timer)
		event_free(p->begin_timer);
}

/* A replan throws away what the old attempt's answer left. */
void reply_new_attempt(struct serve_req *r)
{
	r->run.added_progress = 0;
	r->run.progress_checked = 0;
	answer_hold_free(&r->reply.hold);
	answer_msg_reset(&r->reply.msg);
	r->reply.t.seen = 0;
	r->reply.t_first_data_us = 0;
}

/* ---- the cache block ---- */

/* Why exact mode's schedule is what it is (the cache block's schedule_why). */
static const char *schedule_why(const struct serve_req *r)
{
	if (r->prompt.n_bounds)
		return r->prompt.starts_by && !strcmp(r->prompt.starts_by, "server")
		           ? "message prefixes rendered by the server"
		           : "messages rendered by toki";
	if (r->d->router->mode == REUSE_GRID)
		return "--reuse grid";
	if (r->ask.kind == KIND_COMPLETION)
		return "a raw prompt";
	if (!r->prompt.local)
		return "the server tokenizes this model's prompts";
	if (!r->prompt.starts_by)
		return "no message starts known for this prompt";
	return "no message start in the prompt";
}

void reply_cache_facts(const struct serve_req *r, struct cache_facts *f, char *verdict, size_t vn)
{
	const struct route_choice *ch = &r->run.choice;
	int exact = req_exact(r) && r->prompt.routable;
	*f = (struct cache_facts){
	    .backend = r->run.backend ? r->run.backend->rb->url : "",
	    .slot = ch->slot ? ch->slot->id : -1,
	    .route = r->prompt.routable ? ch->kind : "unrouted",
	    .mode = reuse_mode_name(r->d->router->mode),
	    .prompt_tokens = (long long)r->prompt.n_tokens,
	    .matched = (long long)ch->matched,
	    .reuse = (long long)ch->reuse,
	    .have_counts = r->reply.t.seen,
	    .cached = exec_cached(r),
	    .evaluated = exec_evaluated(r),
	    .exact = exact,
	    .schedule = r->prompt.n_bounds ? "messages" : "grid",
	    .schedule_why = schedule_why(r),
	    .chunks = (long long)r->prompt.n_bounds + 1,
	    .steps = (long long)r->run.steps + 1,
	    .replayed = (long long)r->run.replayed,
	    .trimmed = ch->must_trim,
	    .max_tokens = r->tries.max_tokens,
	    .max_tokens_clamped = r->tries.output_clamped,
	    .restored = r->run.restored ? r->run.restored_name : NULL,
	    .est_prefill_ms = ch->est_prefill_s * 1000.0,
	    .tokenized = r->prompt.local ? "toki" : "server",
	    .templated = r->ask.kind == KIND_COMPLETION ? NULL
	                 : r->prompt.local_template     ? "toki"
	                                                : "server",
	    .tokenize_ms = (double)r->prompt.tokenize_us / 1000.0,
	};
	if (exact && r->run.backend) {
		selftest_verdict(&r->run.backend->selftest, verdict, vn);
		f->verdict = verdict;
	}
}

static char *cache_text(const struct serve_req *r)
{
	struct cache_facts f;
	char verdict[400];
	reply_cache_facts(r, &f, verdict, sizeof verdict);
	return answer_cache_text(&f);
}

static json_t *cache_json(const struct serve_req *r)
{
	struct cache_facts f;
	char verdict[400];
	reply_cache_facts(r, &f, verdict, sizeof verdict);
	return answer_cache_json(&f);
}

/* What the whole answer (or the held last event) is rewritten with: the
 * counts of the whole request, and the cache block unless the client
 * filtered it out (the text returned, malloc'd; NULL then). */
static char *final_parts(const struct serve_req *r, struct answer_totals *t)
{
	exec_totals(r, t);
	return answer_cache_wanted(r->ask.body) ? cache_text(r) : NULL;
}

/* The whole answer as the client gets it. NULL: send it as it is. */
static char *rewritten(const struct serve_req *r, const char *text, size_t len, size_t *out_len)
{
	struct answer_totals t;
	char *cs = final_parts(r, &t);
	char *out = answer_rewrite(text, len, &t, cs, out_len);
	free(cs);
	return out;
}

/* The held event goes out, as the last one (with the cache block) or not. */
static void flush_held(struct serve_req *r, int last)
{
	struct strbuf b = {0};
	struct answer_totals t;
	char *cs = last ? final_parts(r, &t) : NULL;
	answer_hold_release(&r->reply.hold, last ? &t : NULL, cs, &b);
	free(cs);
	write_strbuf(r, &b);
	strbuf_free(&b);
}

/* ---- the stream ---- */

/* ANTHROPIC: each chat chunk becomes Anthropic events; [DONE] ends the
 * message with the cache block on message_stop. */
static void on_chat_chunk_for_anthropic(struct serve_req *r, const char *data, size_t dl)
{
	struct strbuf b;
	strbuf_init(&b);
	if (!strcmp(data, "[DONE]")) {
		json_t *c = cache_json(r);
		anthropic_stream_finish(r->reply.astream, c, &b);
		json_decref(c);
		r->reply.done_sent = 1;
	} else {
		json_error_t jerr;
		json_t *chunk = json_loadb(data, dl, JSON_BODY_FLAGS, &jerr);
		if (chunk) {
			answer_timings_of(chunk, &r->reply.t);
			if (r->tries.output_clamped)
				answer_end_turn_at_cap(chunk);
			anthropic_stream_feed(r->reply.astream, chunk, &b);
			json_decref(chunk);
		}
	}
	write_strbuf(r, &b);
	strbuf_free(&b);
}

/* Writes one event of JSON text js (and frees it); nothing when out of
 * memory. */
static void write_event(struct serve_req *r, char *js)
{
	if (!js)
		return;
	reply_write(r, "data: ", 6);
	reply_write(r, js, strlen(js));
	reply_write(r, "\n\n", 2);
	free(js);
}

/* A progress event. Returns 1 when it was dealt with (sent rewritten, or
 * dropped: toki asked for it, or a replan throws the answer away). */
static int on_progress(struct serve_req *r, const char *data, size_t dl)
{
	json_error_t jerr;
	json_t *obj = json_loadb(data, dl, JSON_BODY_FLAGS, &jerr);
	json_t *pp = json_object_get(obj, "prompt_progress");
	int replanned = 0;
	long long total = json_integer_value(json_object_get(pp, "total"));
	long long cache = json_integer_value(json_object_get(pp, "cache"));
	if (!r->run.progress_checked && json_is_object(pp)) {
		r->run.progress_checked = 1;
		replanned = req_check_plan(r, total, cache);
	}
	/* "processed" counts the reused tokens too. */
	if (!replanned && json_is_object(pp) &&
	    json_integer_value(json_object_get(pp, "processed")) >= total)
		r->reply.gen_started = 1; /* the whole prompt is in the slot */
	if (!replanned && !r->run.added_progress && r->run.steps && json_is_object(pp) &&
	    !r->reply.astream) {
		/* The client asked for progress, and earlier steps evaluated part
		 * of the prompt: it sees one stream, as from llama-server alone.
		 * The stream starts where the request's reuse ends (cache ==
		 * processed, time 0), then goes on from where this last step's
		 * evaluation is, the steps' time included; events that would go
		 * back are not sent. */
		long long cached = exec_cached(r);
		long long processed = json_integer_value(json_object_get(pp, "processed"));
		double ms =
		    r->run.steps_prompt_ms + json_number_value(json_object_get(pp, "time_ms"));
		if (!r->reply.t_first_data_us)
			r->reply.t_first_data_us = clock_now_us();
		if (!r->reply.progress_started) {
			r->reply.progress_started = 1;
			r->reply.progress_sent = cached;
			write_event(r, answer_progress_event(obj, cached, cached, 0));
		}
		if (processed > r->reply.progress_sent) {
			r->reply.progress_sent = processed;
			write_event(r, answer_progress_event(obj, cached, processed, ms));
		}
		json_decref(obj);
		return 1;
	}
	json_decref(obj);
	return replanned || r->run.added_progress;
}

/* Exact mode keeps the answer as a message for what follows it (exec.c). */
static int wants_msg(const struct serve_req *r)
{
	return req_exact(r) && r->prompt.routable && r->prompt.n_bounds && !r->reply.msg.failed;
}

static void note_msg(struct serve_req *r, const char *data, size_t dl)
{
	json_error_t jerr;
	json_t *obj = json_loadb(data, dl, JSON_BODY_FLAGS, &jerr);
	if (obj)
		answer_msg_add(&r->reply.msg, obj);
	json_decref(obj);
}

static void on_sse_event(const char *raw, size_t len, void *arg)
{
	struct serve_req *r = arg;
	if (r->tries.replanning)
		return; /* the rest of an answer being replaced */
	size_t dl = 0;
	char *data = sse_event_data(raw, len, &dl);
	enum answer_event kind = answer_event_kind(data);
	if (kind == ANSWER_EVENT_PROGRESS && on_progress(r, data, dl)) {
		free(data);
		return;
	}
	if (!r->reply.t_first_data_us)
		r->reply.t_first_data_us = clock_now_us();
	if (kind != ANSWER_EVENT_PROGRESS)
		r->reply.gen_started = 1; /* an answer's first event follows its prompt */
	if (data && kind != ANSWER_EVENT_DONE && wants_msg(r))
		note_msg(r, data, dl);
	if (r->reply.astream) {
		if (data)
			on_chat_chunk_for_anthropic(r, data, dl);
		free(data);
		return;
	}
	/* The token ids toki asked for are not the client's. */
	size_t sl = 0;
	char *stripped = r->run.added_probs ? answer_drop_probs(raw, len, &sl) : NULL;
	if (stripped) {
		raw = stripped;
		len = sl;
	}
	if (kind == ANSWER_EVENT_DONE) {
		flush_held(r, 1);
		reply_write(r, raw, len);
		r->reply.done_sent = 1;
	} else if (kind == ANSWER_EVENT_TIMINGS) {
		/* llama-server puts timings in its final chunk: hold it back, the
		 * cache block goes there. */
		json_error_t jerr;
		json_t *obj = json_loadb(data, dl, JSON_BODY_FLAGS, &jerr);
		if (obj)
			answer_timings_of(obj, &r->reply.t);
		json_decref(obj);
		struct strbuf b = {0};
		answer_hold_keep(&r->reply.hold, raw, len, &b);
		write_strbuf(r, &b);
		strbuf_free(&b);
	} else {
		flush_held(r, 0);
		reply_write(r, raw, len);
	}
	free(stripped);
	free(data);
}

static void keepalive_tick(evutil_socket_t fd, short what, void *arg)
{
	struct serve_req *r = arg;
	int64_t now = clock_now_us();
	if (r->reply.client &&
	    now - r->reply.t_last_write_us >= (int64_t)r->d->cfg.keepalive_ms * 1000) {
		if (r->reply.astream) {
			const char *ping = anthropic_ping_event();
			reply_write(r, ping, strlen(ping));
		} else {
			reply_write(r, ": keep-alive\n\n", 14);
		}
	}
}

/* A streamed request's response begins when the backend starts its answer
 * (200), so that a refusal keeps its own status, as from llama-server
 * alone; or, when the backend takes longer (a long prefill, exact mode's
 * chunks, a restore or a save come first), after 250 ms: the client then
 * sees the route, then keep-alives (Anthropic pings), rather than silence,
 * and a later refusal comes as an error event. */
static void begin_timer_fired(evutil_socket_t fd, short what, void *arg)
{
	reply_begin_stream(arg);
}

void reply_arm_stream(struct serve_req *r)
{
	if (!r->ask.stream || !r->reply.client || r->reply.stream_begun || r->reply.begin_timer)
		return;
	/* llama-server refuses a request as it takes it (milliseconds): a
	 * quarter second keeps those statuses and costs a waiting client
	 * nothing it would see. */
	int ms = r->d->cfg.keepalive_ms / 2 < 250 ? r->d->cfg.keepalive_ms / 2 : 250;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	r->reply.begin_timer = evtimer_new(r->d->base, begin_timer_fired, r);
	if (!r->reply.begin_timer || evtimer_add(r->reply.begin_timer, &tv) != 0)
		reply_begin_stream(r); /* out of memory: now, as before */
}

void reply_begin_stream(struct serve_req *r)
{
	struct daemon *d = r->d;
	struct req_reply *p = &r->reply;
	if (!r->ask.stream || !p->client || p->stream_begun)
		return;
	p->stream_begun = 1;
	http_response_header(p->client, "Cache-Control", "no-cache");
	http_stream_begin(p->client, 200, "text/event-stream");
	/* The first event says how long the prefill should take, so that a
	 * slow turn is a number rather than a silence. */
	const struct route_choice *ch = &r->run.choice;
	char note[256];
	int n = snprintf(note, sizeof note,
	                 ": toki route=%s slot=%d prompt=%zu reuse=%zu evaluate=%zu "
	                 "est_prefill_ms=%.0f\n\n",
	                 r->prompt.routable ? ch->kind : "unrouted",
	                 r->run.slot ? r->run.slot->id : -1, r->prompt.n_tokens, ch->reuse,
	                 r->prompt.n_tokens - ch->reuse, ch->est_prefill_s * 1000.0);
	reply_write(r, note, (size_t)n);
	if (r->ask.kind == KIND_ANTHROPIC) {
		long long evaluate = (long long)(r->prompt.n_tokens - ch->reuse);
		p->astream =
		    anthropic_stream_new(r->ask.client_model, evaluate, (long long)ch->reuse);
		struct strbuf b;
		strbuf_init(&b);
		if (p->astream)
			anthropic_stream_start(p->astream, &b);
		write_strbuf(r, &b);
		strbuf_free(&b);
	}
	p->keepalive = event_new(d->base, -1, EV_PERSIST, keepalive_tick, r);
	int ms = d->cfg.keepalive_ms > 100 ? d->cfg.keepalive_ms / 2 : 50;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (p->keepalive)
		event_add(p->keepalive, &tv);
}

void reply_start_attempt(struct serve_req *r)
{
	if (r->ask.stream) {
		/* Each attempt parses its backend's stream from the start. */
		sse_parser_free(&r->reply.sse);
		sse_parser_init(&r->reply.sse, 64 * 1024 * 1024);
	}
	reply_arm_stream(r);
}

/* ---- the backend's answer ---- */

static void on_forward_head(struct backend_call *call, int status, void *arg)
{
	struct serve_req *r = arg;
	r->reply.status = status;
	r->reply.t_first_byte_us = clock_now_us();
	if (status == 200)
		reply_begin_stream(r);
}

static void on_forward_data(struct backend_call *call, const char *data, size_t len, void *arg)
{
	struct serve_req *r = arg;
	if (r->reply.status != 200) {
		if (!r->reply.errbuf)
			r->reply.errbuf = evbuffer_new();
		if (r->reply.errbuf)
			evbuffer_add(r->reply.errbuf, data, len);
		return;
	}
	if (sse_parser_feed(&r->reply.sse, data, len, on_sse_event, r) != 0) {
		r->run.call = NULL;
		backend_call_cancel(call);
		req_fail(r, 502, "backend sent an oversized or broken event stream");
	}
}

static void on_stream_done(struct serve_req *r, int status)
{
	struct req_reply *p = &r->reply;
	if (status != 200) {
		/* The backend refused the request: pass its message on. */
		size_t el = p->errbuf ? evbuffer_get_length(p->errbuf) : 0;
		char msg[512];
		json_body_error(el ? (const char *)evbuffer_pullup(p->errbuf, -1) : NULL, el,
		                "backend error", msg, sizeof msg);
		req_fail(r, status, msg);
		return;
	}
	if (!p->done_sent && p->astream)
		on_chat_chunk_for_anthropic(r, "[DONE]", 6);
	else if (!p->done_sent)
		flush_held(r, 1);
	req_prompt_disagrees(r, p->t.cache_n + p->t.prompt_n);
	if (p->client) {
		http_stream_end(p->client);
		p->client = NULL;
	}
	req_answered(r, p->t.seen ? 200 : 0);
}

/* ANTHROPIC, not streamed: the chat answer translated. */
static void answer_anthropic(struct serve_req *r, int status, const char *body, size_t len)
{
	json_error_t jerr;
	json_t *chat = status == 200 ? json_loadb(body, len, JSON_BODY_FLAGS, &jerr) : NULL;
	if (chat && r->tries.output_clamped)
		answer_end_turn_at_cap(chat);
	/* Anthropic's usage splits the prompt: read from the cache, and the
	 * rest (a cut's throw-away token is no part of the input). */
	long long cached = exec_cached(r);
	json_t *msg =
	    chat ? anthropic_from_chat(chat, r->ask.client_model, cached,
	                               r->prompt.routable ? (long long)r->prompt.n_tokens - cached
	                                                  : exec_evaluated(r))
	         : NULL;
	json_decref(chat);
	http_request_on_close(r->reply.client, NULL, NULL);
	if (msg) {
		json_object_set_new(msg, "cache", cache_json(r));
		reply_json(r->reply.client, 200, msg);
		json_decref(msg);
	} else {
		char m[512];
		json_body_error(body, len, "the backend's answer could not be translated", m,
		                sizeof m);
		http_respond_error(r->reply.client, status == 200 ? 502 : status, m);
	}
	r->reply.client = NULL;
}

static void on_forward_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct serve_req *r = arg;
	struct req_reply *p = &r->reply;
	r->run.call = NULL;
	p->status = status;
	if (r->ask.stream) {
		on_stream_done(r, status);
		return;
	}
	if (status == 200)
		answer_timings_in_body(body, len, &p->t);
	if (status == 200 && wants_msg(r))
		note_msg(r, body, len);
	if (status == 200 && p->t.seen && r->prompt.routable && p->client) {
		/* The same checks as a stream's first progress event, after the
		 * fact: a wrong exact-mode plan is thrown away and done again. */
		long long n_server = p->t.cache_n + p->t.prompt_n;
		if (req_check_plan(r, n_server, p->t.cache_n))
			return;
		req_prompt_disagrees(r, n_server);
	}
	/* The answer goes first; the bookkeeping after it (the slot's new
	 * content, the log line, an audit) is not the client's wait. */
	if (p->client && r->ask.kind == KIND_ANTHROPIC) {
		answer_anthropic(r, status, body, len);
	} else if (p->client) {
		size_t sl = 0, out_len = 0;
		char *stripped =
		    status == 200 && r->run.added_probs ? answer_drop_probs(body, len, &sl) : NULL;
		if (stripped) {
			body = stripped;
			len = sl;
		}
		char *out = status == 200 ? rewritten(r, body, len, &out_len) : NULL;
		const char *ct = backend_call_header(call, "Content-Type");
		http_request_on_close(p->client, NULL, NULL);
		http_respond(p->client, status, ct ? ct : "application/json", out ? out : body,
		             out ? out_len : len);
		free(out);
		free(stripped);
		p->client = NULL;
	}
	req_answered(r, status);
}

static void on_forward_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	exec_call_failed(r, err);
}

const struct backend_call_handlers reply_stream_handlers = {
    .on_head = on_forward_head,
    .on_data = on_forward_data,
    .on_done = on_forward_done,
    .on_error = on_forward_error,
};
const struct backend_call_handlers reply_handlers = {
    .on_head = on_forward_head,
    .on_done = on_forward_done,
    .on_error = on_forward_error,
};
