/* A request's life, from the client's body to its end: translation, making
 * the prompt (here or by the server), the output cap, the decisions to plan
 * again or try another backend, and the request's failure and end. Routing
 * and the backend steps are exec.c's; the answer is reply.c's. */
#include "serve/req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/anthropic.h"
#include "api/api_error.h"
#include "api/request_check.h"
#include "api/responses.h"
#include "backend/prefix_render.h"
#include "backend/prompt_probe.h"
#include "daemon.h"
#include "http/http_server.h"
#include "prompt/prompt.h"
#include "util/clock.h"
#include "util/json_body.h"
#include "util/log.h"

static void tokens_ready(struct serve_req *r);
static int local_text(struct serve_req *r, struct backend *b, const char *text, size_t len);

int req_exact(const struct serve_req *r)
{
	return reuse_mode_is_exact(r->d->router->mode);
}

/* The backends that serve the model a request names: those whose model id
 * or an alias equals it. A name no backend has (clients send "gpt-4" or
 * "claude-..." to a local model) allows every backend. */
static uint64_t backends_for_model(struct daemon *d, const char *model)
{
	uint64_t mask = 0;
	if (model && *model) {
		for (int i = 0; i < d->n_backends && i < 64; i++) {
			struct backend *b = d->backends[i];
			int match = b->model_id && !strcmp(b->model_id, model);
			size_t k;
			json_t *e;
			json_array_foreach(json_object_get(b->models, "data"), k, e)
			{
				size_t a;
				json_t *alias;
				json_array_foreach(json_object_get(e, "aliases"), a, alias)
				{
					if (json_is_string(alias) &&
					    !strcmp(json_string_value(alias), model))
						match = 1;
				}
			}
			if (match)
				mask |= (uint64_t)1 << i;
		}
	}
	return mask ? mask : ~(uint64_t)0;
}

struct backend *req_any_backend(struct serve_req *r)
{
	struct daemon *d = r->d;
	uint64_t ok = r->ask.allowed & ~r->tries.excluded;
	for (int i = 0; i < d->n_backends; i++)
		if ((i >= 64 || (ok >> i) & 1) && backend_is_up(d->backends[i]))
			return d->backends[i];
	return NULL;
}

/* ---- the end ---- */

void req_free(struct serve_req *r)
{
	free(r->prompt.bounds);
	free(r->prompt.plain_bounds);
	free(r->run.kept);
	plan_free(&r->run.plan);
	json_decref(r->ask.body);
	json_decref(r->ask.template_body);
	free(r->ask.client_model);
	free(r->ask.lora);
	free(r->prompt.tokens);
	reply_free(&r->reply);
	if (r->tries.replan_ev)
		event_free(r->tries.replan_ev);
	if (r->run.idle_ev)
		event_free(r->run.idle_ev);
	free(r);
}

void req_finish(struct serve_req *r)
{
	prefix_render_cancel(r->prompt.render);
	r->prompt.render = NULL;
	exec_release(r);
	wait_remove(r);
	active_remove(r);
	if (r->reply.client) {
		/* Not answered yet (should not happen): answer rather than hang. */
		http_request_on_close(r->reply.client, NULL, NULL);
		http_respond_error(r->reply.client, 500, "request ended without an answer");
		r->reply.client = NULL;
	}
	r->state = RS_DONE;
	/* A slot save still out holds a pointer to r: it frees r when done. */
	if (!r->run.saving)
		req_free(r);
}

/* An error for the client: a JSON answer if nothing was sent yet, else an
 * error event that ends the stream. */
void req_fail(struct serve_req *r, int status, const char *message)
{
	r->d->stats.errors++;
	reply_error(r, status, message);
	req_finish(r);
}

static void log_done(struct serve_req *r)
{
	double total_ms = (double)(clock_now_us() - r->ask.t_start_us) / 1000.0;
	log_info("%s slot=%d route=%s prompt=%zu matched=%zu reuse=%zu cached=%lld evaluated=%lld "
	         "steps=%d prefill=%.0fms total=%.0fms",
	         r->ask.client_path, r->run.choice.slot ? r->run.choice.slot->id : -1,
	         r->prompt.routable ? r->run.choice.kind : "unrouted", r->prompt.n_tokens,
	         r->run.choice.matched, r->run.choice.reuse, exec_cached(r), exec_evaluated(r),
	         r->run.steps + 1, r->run.steps_prompt_ms + r->reply.t.prompt_ms, total_ms);
}

/* A request whose prompt toki made is, now and then, made by the server too
 * (off the request's path) and compared. */
static void audit_prompt(struct serve_req *r)
{
	if (!r->prompt.local || !r->prompt.engine_backend)
		return;
	int chat = r->ask.kind != KIND_COMPLETION;
	prompt_audit_start(r->prompt.engine_backend,
	                   r->ask.template_body ? r->ask.template_body : r->ask.body, chat,
	                   r->prompt.tokens, r->prompt.n_tokens);
}

void req_answered(struct serve_req *r, int status)
{
	if (status == 200)
		audit_prompt(r);
	log_done(r);
	exec_answered(r, status == 200 && r->reply.t.seen);
}

/* ---- planning again, trying elsewhere ---- */

void req_prompt_disagrees(struct serve_req *r, long long n_server)
{
	if (!r->prompt.local || !r->reply.t.seen || !r->prompt.routable ||
	    n_server == (long long)r->prompt.n_tokens || !r->prompt.engine_backend)
		return;
	char why[160];
	snprintf(why, sizeof why, "the server counted %lld prompt tokens, toki %zu", n_server,
	         r->prompt.n_tokens);
	prompt_engine_disable(r->prompt.engine_backend, PROMPT_FAULT_ALL, why);
}

/* Plans the request again, from routing (or, when toki's own prompt was the
 * fault, from the server's template and tokenizer), on the next turn of the
 * loop: it runs from inside the old answer's callbacks. */
static void replan_now(evutil_socket_t fd, short what, void *arg)
{
	struct serve_req *r = arg;
	r->tries.replanning = 0;
	if (!r->reply.client) {
		req_finish(r);
		return;
	}
	if (r->prompt.local && r->prompt.fault) {
		free(r->prompt.tokens);
		r->prompt.tokens = NULL;
		r->prompt.n_tokens = 0;
		free(r->prompt.bounds);
		r->prompt.bounds = NULL;
		r->prompt.n_bounds = 0;
		free(r->prompt.plain_bounds);
		r->prompt.plain_bounds = NULL;
		r->prompt.n_plain_bounds = 0;
		r->prompt.routable = 0;
		r->prompt.local = 0;
		r->prompt.local_template = 0;
		r->prompt.starts_by = NULL;
		r->prompt.force_server = 1;
	}
	reply_new_attempt(r);
	r->run.restored = 0;
	memset(&r->run.choice, 0, sizeof r->run.choice);
	if (r->prompt.routable) {
		r->state = RS_TOKENIZE; /* routed again with the same tokens */
		exec_route(r);
		return;
	}
	struct backend *b = req_any_backend(r);
	if (!b) {
		r->needs_begin = 1;
		wait_add(r);
		return;
	}
	req_begin(r, b);
}

/* What the failed plan did to its slot is unknown, so the slot is
 * forgotten. A plan that went wrong on its slot is made again from an empty
 * one (cold), which cannot go wrong that way. */
void req_replan(struct serve_req *r, const char *why, int cold)
{
	struct daemon *d = r->d;
	if (cold)
		r->tries.force_cold = 1; /* a slot that surprised once is not trusted again */
	log_warn("slot %d: %s; planning the request again%s", r->run.slot ? r->run.slot->id : -1,
	         why, r->prompt.local ? " with the server's prompt" : "");
	r->tries.replans++;
	r->tries.replanning = 1;
	d->stats.replans++;
	exec_cancel_call(r);
	exec_drop_slot(r);
	if (!r->tries.replan_ev)
		r->tries.replan_ev = evtimer_new(d->base, replan_now, r);
	struct timeval now = {0, 0};
	if (!r->tries.replan_ev || evtimer_add(r->tries.replan_ev, &now) != 0) {
		r->tries.replanning = 0;
		req_fail(r, 500, "out of memory");
	}
}

/* The first progress event tells what the server is about to do: how many
 * prompt tokens it has (toki's count must agree) and how many it reuses
 * (exact mode: exactly the reuse toki planned, or the text may differ from
 * an uncached run). It comes before any token is generated, so a wrong plan
 * can still be replaced before the client sees any of its answer. */
int req_check_plan(struct serve_req *r, long long total, long long cache)
{
	if (!r->prompt.routable || r->tries.replans >= 2)
		return 0;
	int exact = req_exact(r);
	char why[200];
	if (total != (long long)r->prompt.n_tokens) {
		snprintf(why, sizeof why, "the server has %lld prompt tokens, toki %zu", total,
		         r->prompt.n_tokens);
		if (r->prompt.local && r->prompt.engine_backend)
			prompt_engine_disable(r->prompt.engine_backend, PROMPT_FAULT_ALL, why);
		r->prompt.fault = 1;
		if (exact) {
			req_replan(r, why, 0);
			return 1;
		}
		return 0;
	}
	if (exact && cache != (long long)r->run.plan.final_cache) {
		snprintf(why, sizeof why,
		         "exact mode planned to reuse %zu tokens, the server reuses %lld",
		         r->run.plan.final_cache, cache);
		req_replan(r, why, 1);
		return 1;
	}
	return 0;
}

/* A backend failed before any of its answer reached the client: the request
 * goes to another backend serving the model, if there is one. The backend's
 * response head does not count (llama-server sends it before the prompt is
 * even queued); its first body bytes do, and a non-streamed body reaches
 * the client only when complete. */
int req_try_elsewhere(struct serve_req *r, enum backend_error err)
{
	struct daemon *d = r->d;
	if (r->reply.t_first_data_us || err == BACKEND_ERR_TIMEOUT || !r->run.backend ||
	    r->tries.retries >= d->n_backends || d->shutting_down)
		return 0;
	int index = r->run.backend->rb->index;
	uint64_t excluded = r->tries.excluded | (index < 64 ? (uint64_t)1 << index : 0);
	int other = 0;
	for (int i = 0; i < d->n_backends; i++)
		if (i != index && (i >= 64 || ((r->ask.allowed & ~excluded) >> i) & 1) &&
		    backend_is_up(d->backends[i]))
			other = 1;
	if (!other)
		return 0;
	/* Whatever the failed backend did to the slot is unknown now. */
	exec_drop_slot(r);
	backend_mark_down(r->run.backend, backend_error_text(err));
	r->tries.excluded = excluded;
	r->tries.retries++;
	log_warn("request on %s failed before streaming (%s): retrying on another backend",
	         r->run.backend->rb->url, backend_error_text(err));
	r->run.restored = 0;
	r->state = RS_TOKENIZE; /* routed again right now (or queued) */
	exec_route(r);
	return 1;
}

/* ---- the output cap ---- */

/* The names llama-server reads a cap from (n_predict, then max_tokens;
 * max_completion_tokens on chat): /completion takes max_tokens too, chat
 * takes n_predict too. */
static const char *const cap_names[] = {"n_predict", "max_tokens", "max_completion_tokens"};

static const char *cap_field(const struct serve_req *r)
{
	return !strcmp(r->ask.backend_path, "/completion")     ? "n_predict"
	       : !strcmp(r->ask.backend_path, "/v1/responses") ? "max_output_tokens"
	                                                       : "max_tokens";
}

/* The prompt must fit the slot's context with room for at least one output
 * token, or the request is refused (llama-server would otherwise cut the
 * prompt silently). The output is capped by the space left and by the
 * model's max_output: a client asking for 32,000 tokens gets what fits. */
int req_clamp_output(struct serve_req *r, int n_ctx_slot)
{
	if (n_ctx_slot <= 0)
		return 0;
	if (r->prompt.n_tokens >= (size_t)n_ctx_slot) {
		/* In the shape each API's clients key on (Claude Code compacts the
		 * conversation on the Messages API's wording). */
		char *body = api_context_error_body(r->ask.client_path,
		                                    (long long)r->prompt.n_tokens, n_ctx_slot);
		log_info("%s: 400: the prompt has %zu tokens, the context holds %d",
		         r->ask.client_path, r->prompt.n_tokens, n_ctx_slot);
		if (!body) {
			req_fail(r, 400, "the prompt does not fit the context");
			return -1;
		}
		r->d->stats.errors++;
		if (r->reply.client) {
			http_request_on_close(r->reply.client, NULL, NULL);
			http_respond(r->reply.client, 400, "application/json", body, strlen(body));
			r->reply.client = NULL;
		}
		free(body);
		req_finish(r);
		return -1;
	}
	long space = n_ctx_slot - (long)r->prompt.n_tokens;
	long cap = space;
	if (r->d->cfg.max_output > 0 && r->d->cfg.max_output < cap)
		cap = r->d->cfg.max_output;
	/* The client's cap is the smallest it sent of the names; where it is
	 * over what fits, every one it sent is set to what fits. */
	const char *field = cap_field(r);
	int responses = !strcmp(field, "max_output_tokens");
	long asked = -1;
	for (size_t i = 0; i < (responses ? 1 : 3); i++) {
		json_t *v = json_object_get(r->ask.body, responses ? field : cap_names[i]);
		long a = json_is_integer(v) ? (long)json_integer_value(v) : -1;
		if (a >= 0 && (asked < 0 || a < asked))
			asked = a; /* n_predict -1 is "no cap" */
	}
	r->tries.max_tokens = asked;
	r->tries.set_cap = asked < 0 || asked > cap;
	r->tries.output_clamped = 0;
	if (r->tries.set_cap) {
		r->tries.max_tokens = cap;
		r->tries.output_clamped = asked >= 0;
	}
	return 0;
}

void req_apply_cap(const struct serve_req *r, json_t *body)
{
	if (!r->tries.set_cap)
		return;
	const char *field = cap_field(r);
	int responses = !strcmp(field, "max_output_tokens");
	json_object_set_new(body, field, json_integer(r->tries.max_tokens));
	for (size_t i = 0; !responses && i < 3; i++)
		if (json_is_integer(json_object_get(body, cap_names[i])))
			json_object_set_new(body, cap_names[i], json_integer(r->tries.max_tokens));
}

/* ---- making the prompt ---- */

/* A call for the prompt (template, tokenize) failed on a backend that went
 * away: another one of the same model makes the same prompt. */
static void on_prompt_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	if (err == BACKEND_ERR_CONNECT && r->run.backend)
		backend_mark_down(r->run.backend, backend_error_text(err));
	struct backend *other = err != BACKEND_ERR_TIMEOUT ? req_any_backend(r) : NULL;
	if (other && other != r->run.backend && r->tries.retries < r->d->n_backends) {
		r->tries.retries++;
		req_begin(r, other);
		return;
	}
	req_fail(r, err == BACKEND_ERR_TIMEOUT ? 504 : 502, backend_error_text(err));
}

static void on_tokenize_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	json_t *obj = json_body(status, body, len, -1);
	json_t *toks = json_object_get(obj, "tokens");
	if (!json_is_array(toks)) {
		json_decref(obj);
		req_fail(r, status >= 400 ? status : 502, "tokenization failed");
		return;
	}
	size_t n = json_array_size(toks);
	r->prompt.tokens = malloc((n ? n : 1) * sizeof *r->prompt.tokens);
	if (!r->prompt.tokens) {
		json_decref(obj);
		req_fail(r, 500, "out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		r->prompt.tokens[i] = (token_t)json_integer_value(json_array_get(toks, i));
	r->prompt.n_tokens = n;
	r->prompt.routable = n > 0;
	json_decref(obj);
	tokens_ready(r);
}

static const struct backend_call_handlers tokenize_handlers = {
    .on_done = on_tokenize_done,
    .on_error = on_prompt_error,
};

/* The server tokenizes text (a JSON string: it may hold a NUL). */
static void tokenize_text(struct serve_req *r, json_t *text)
{
	r->state = RS_TOKENIZE;
	json_t *req =
	    json_pack("{s:O, s:b, s:b}", "content", text, "add_special", 1, "parse_special", 1);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!body) {
		req_fail(r, 500, "out of memory");
		return;
	}
	r->run.call = backend_call_start(r->run.backend->http, "POST", "/tokenize", body,
	                                 strlen(body), &tokenize_handlers, r);
	free(body);
	if (!r->run.call)
		req_fail(r, 500, "out of memory");
}

/* The server could not template the request: its answer (obj, perhaps
 * NULL) says why. */
static void template_failed(struct serve_req *r, int status, json_t *obj)
{
	/* The backend's own 4xx explains what is wrong with the messages. */
	const char *m = json_error_message(obj);
	char msg[512];
	snprintf(msg, sizeof msg, "%s", m ? m : "the chat template could not be applied");
	/* The backend's own status where it answered one (an image sent to a
	 * text-only model is its 500), 502 only for an answer that is none. */
	req_fail(r, status >= 400 ? status : 502, msg);
}

static void on_template_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct serve_req *r = arg;
	r->run.call = NULL;
	json_error_t jerr;
	json_t *obj = json_loadb(body, len, JSON_BODY_FLAGS, &jerr);
	const char *prompt = json_string_value(json_object_get(obj, "prompt"));
	if (status != 200 || !prompt)
		template_failed(r, status, obj);
	else if (!local_text(r, r->run.backend, prompt,
	                     json_string_length(json_object_get(obj, "prompt"))))
		tokenize_text(r, json_object_get(obj, "prompt"));
	json_decref(obj);
}

static const struct backend_call_handlers template_handlers = {
    .on_done = on_template_done,
    .on_error = on_prompt_error,
};

/* The tokens are known: answer a count, or route. */
static void tokens_ready(struct serve_req *r)
{
	struct backend *tb = r->prompt.tokenize_backend;
	if (r->prompt.t_tokenize_us && tb) {
		r->prompt.tokenize_us = clock_now_us() - r->prompt.t_tokenize_us;
		if (!r->prompt.tokenize_us)
			r->prompt.tokenize_us = 1;
		if (r->prompt.local) {
			tb->prompt_local++;
			tb->prompt_local_us += (uint64_t)r->prompt.tokenize_us;
		} else {
			tb->prompt_server++;
			tb->prompt_server_us += (uint64_t)r->prompt.tokenize_us;
		}
	}
	if (r->ask.count_only) {
		json_t *o = json_pack("{s:I}", "input_tokens", (json_int_t)r->prompt.n_tokens);
		http_request_on_close(r->reply.client, NULL, NULL);
		reply_json(r->reply.client, 200, o);
		json_decref(o);
		r->reply.client = NULL;
		req_finish(r);
		return;
	}
	exec_route(r);
}

static void take_tokens(struct serve_req *r, struct backend *b, struct token_list *t, int templated)
{
	r->prompt.local_template = templated;
	r->prompt.tokens = t->v;
	r->prompt.n_tokens = t->n;
	r->prompt.routable = t->n > 0;
	r->prompt.local = 1;
	r->prompt.engine_backend = b;
	t->v = NULL;
	t->n = t->cap = 0;
}

/* A chat prompt made here: its tokens, and exact mode's chunk starts (taken
 * over from st) from the messages as `by` rendered them (toki, or the
 * server); then on. */
static void chat_tokens_ready(struct serve_req *r, struct backend *b, struct token_list *t,
                              struct prompt_starts *st, const char *by)
{
	/* Without steps: the same starts but those (prompt.c, step regions),
	 * a joined header's start back where its message starts. */
	size_t k = 0;
	for (size_t i = 0; i < st->n; i++)
		k += st->kind[i] == SCHED_START_STEP;
	free(r->prompt.plain_bounds);
	r->prompt.plain_bounds = NULL;
	r->prompt.n_plain_bounds = 0;
	if (k) {
		size_t *plain = malloc((st->n - k) * sizeof *plain + 1);
		unsigned char *kind = malloc(st->n - k + 1);
		if (!plain || !kind) {
			free(plain);
			free(kind);
			free(st->pos);
			free(st->kind);
			token_list_free(t);
			req_fail(r, 500, "out of memory");
			return;
		}
		k = 0;
		for (size_t i = 0; i < st->n; i++)
			if (st->kind[i] != SCHED_START_STEP) {
				plain[k] = st->pos[i];
				kind[k++] = st->kind[i] == SCHED_START_PLAIN ? SCHED_START_ANSWER
				                                             : st->kind[i];
			}
		r->prompt.n_plain_bounds = sched_chunks(plain, kind, k);
		r->prompt.plain_bounds = plain;
		free(kind);
	}
	free(r->prompt.bounds);
	r->prompt.n_bounds = sched_chunks(st->pos, st->kind, st->n);
	r->prompt.bounds = st->pos;
	r->prompt.starts_by = by;
	free(st->kind);
	take_tokens(r, b, t, !strcmp(by, "toki"));
	tokens_ready(r);
}

/* The chat request templated and tokenized here, when b's engine matched
 * the server (backend/prompt_probe.h) and the request is one it renders.
 * Returns 1 when the request went on from here. */
static int local_chat(struct serve_req *r, struct backend *b)
{
	if (r->prompt.force_server || !b->prompt || !b->prompt_chat_ok)
		return 0;
	char why[256], *prompt = NULL;
	size_t plen = 0;
	struct token_list t = {0};
	/* Exact mode evaluates the prompt in chunks that end where messages
	 * start (router/sched.h): their positions come with the tokens. */
	struct prompt_starts st = {0};
	enum chat_result cr = prompt_engine_chat_starts(
	    b->prompt, r->ask.template_body ? r->ask.template_body : r->ask.body, time(NULL),
	    &prompt, &plen, &t, r->d->router->mode == REUSE_EXACT ? &st : NULL, why, sizeof why);
	free(prompt);
	if (cr != CHAT_OK) {
		log_debug("prompt by the server: %s", why);
		token_list_free(&t);
		free(st.pos);
		free(st.kind);
		return 0;
	}
	chat_tokens_ready(r, b, &t, &st, "toki");
	return 1;
}

/* A text prompt (a completion's, or a chat prompt the server templated)
 * tokenized here when b's tokenizer matched the server. */
static int local_text(struct serve_req *r, struct backend *b, const char *text, size_t len)
{
	if (r->prompt.force_server || !b->prompt || !b->prompt_tokens_ok)
		return 0;
	struct token_list t = {0};
	if (prompt_engine_tokenize(b->prompt, text, len, &t) != 0) {
		token_list_free(&t);
		return 0;
	}
	take_tokens(r, b, &t, 0);
	tokens_ready(r);
	return 1;
}

/* Exact mode on a chat request the server templates: the server's
 * renderings of the whole prompt and of its message prefixes came
 * (backend/prefix_render.h); the prompt is tokenized here, with the starts
 * the renderings gave. */
static void on_render_done(struct prefix_render_result *res, void *arg)
{
	struct serve_req *r = arg;
	r->prompt.render = NULL;
	struct backend *b = r->run.backend;
	json_t *p = json_object_get(res->answer, "prompt");
	if (res->status != 200 || !json_is_string(p)) {
		free(res->offsets);
		free(res->kind);
		template_failed(r, res->status, res->answer);
		return;
	}
	b->prompt_prefixes += res->prefixes;
	b->prompt_prefixes_rendered += res->rendered;
	/* The engine may have gone since (the backend restarted): the server
	 * tokenizes then, on the grid. */
	if (!b->prompt || !b->prompt_tokens_ok) {
		free(res->offsets);
		free(res->kind);
		tokenize_text(r, p);
		return;
	}
	struct token_list t = {0};
	struct prompt_starts st = {0};
	int rc =
	    prompt_engine_tokenize_starts(b->prompt, json_string_value(p), json_string_length(p),
	                                  res->offsets, res->kind, res->n, res->header, 0, &t, &st);
	if (rc != 0) {
		token_list_free(&t);
		free(st.pos);
		free(st.kind);
		if (rc == -2)
			tokenize_text(r, p);
		else
			req_fail(r, 500, "out of memory");
		return;
	}
	chat_tokens_ready(r, b, &t, &st, "server");
}

static void on_render_error(enum backend_error err, void *arg)
{
	struct serve_req *r = arg;
	r->prompt.render = NULL;
	on_prompt_error(NULL, err, r);
}

static const struct prefix_render_handlers render_handlers = {.on_done = on_render_done,
                                                              .on_error = on_render_error};

/* A chat request the server templates gets exact mode's message schedule
 * where toki tokenizes the server's prompt: the server renders the message
 * prefixes too. Returns 1 when the request went on from here. */
static int server_chat_starts(struct serve_req *r, struct backend *b)
{
	if (r->d->router->mode != REUSE_EXACT || r->prompt.force_server || !b->prompt ||
	    !b->prompt_tokens_ok || vocab_adds_eos(prompt_engine_vocab(b->prompt)))
		return 0;
	r->prompt.render = prefix_render_start(
	    b, r->ask.template_body ? r->ask.template_body : r->ask.body, &render_handlers, r);
	if (!r->prompt.render)
		req_fail(r, 500, "out of memory");
	return 1;
}

/* How long a client-pinned request will hold its slot, for the router's
 * wait estimate: its output cap (or the slot's context) at the backend's
 * measured decode rate; 10 s before there is one. Its prompt is unknown. */
static double pinned_busy_s(struct serve_req *r, struct backend *b)
{
	json_t *v = json_object_get(r->ask.body, "max_tokens");
	if (!json_is_integer(v))
		v = json_object_get(r->ask.body, "n_predict");
	long long n = json_is_integer(v) && json_integer_value(v) > 0 ? json_integer_value(v)
	                                                              : b->rb->n_ctx_slot;
	return b->rb->decode_tps > 0 ? (double)n / b->rb->decode_tps : 10.0;
}

void req_begin(struct serve_req *r, struct backend *b)
{
	json_t *body = r->ask.body;
	enum route_kind kind = r->ask.kind;
	/* Exact mode's schedule follows the messages where toki makes the
	 * prompt, and is the grid where the server does: while the probes that
	 * decide which it is still run, a chat request waits (milliseconds,
	 * after a backend starts), so that its answer does not depend on when
	 * it came. */
	if (b->probe && req_exact(r) && kind != KIND_COMPLETION &&
	    !json_object_get(body, "id_slot")) {
		r->needs_begin = 1;
		wait_add(r);
		return;
	}
	r->run.backend = b; /* for tokenization; routing picks the real one */
	r->prompt.tokenize_backend = b;
	r->prompt.t_tokenize_us = clock_now_us();
	if (json_object_get(body, "id_slot")) {
		json_int_t id = json_integer_value(json_object_get(body, "id_slot"));
		if (id >= 0 && id < b->rb->n_slots)
			exec_pin_slot(r, &b->rb->slots[id], pinned_busy_s(r, b));
		exec_route(r);
		return;
	}
	if (kind != KIND_COMPLETION) {
		if (local_chat(r, b))
			return;
		r->state = RS_TEMPLATE;
		if (server_chat_starts(r, b))
			return;
		char *raw =
		    json_dumps(r->ask.template_body ? r->ask.template_body : body, JSON_COMPACT);
		r->run.call = raw ? backend_call_start(b->http, "POST", "/apply-template", raw,
		                                       strlen(raw), &template_handlers, r)
		                  : NULL;
		free(raw);
		if (!r->run.call)
			req_fail(r, 500, "out of memory");
		return;
	}
	json_t *text = request_prompt_text(body);
	if (text) {
		if (!local_text(r, b, json_string_value(text), json_string_length(text)))
			tokenize_text(r, text);
		return;
	}
	/* A prompt of token ids is routed as it is; several prompts, or one
	 * with media, are not. */
	json_t *prompt = json_object_get(body, "prompt");
	size_t n = json_array_size(prompt), i;
	json_t *t;
	int all_ints = n > 0;
	json_array_foreach(prompt, i, t) if (!json_is_integer(t)) all_ints = 0;
	if (all_ints) {
		r->prompt.tokens = malloc(n * sizeof *r->prompt.tokens);
		if (!r->prompt.tokens) {
			req_fail(r, 500, "out of memory");
			return;
		}
		json_array_foreach(prompt, i, t) r->prompt.tokens[i] =
		    (token_t)json_integer_value(t);
		r->prompt.n_tokens = n;
		r->prompt.routable = 1;
	}
	exec_route(r);
}

/* ---- the start: translation ---- */

static void on_client_close(struct http_request *req, void *arg)
{
	struct serve_req *r = arg;
	r->reply.client = NULL;
	log_info("%s: client went away; cancelling its backend request", r->ask.client_path);
	if (!exec_client_gone(r))
		req_finish(r);
}

void req_start(struct daemon *d, struct http_request *req, enum route_kind kind,
               const char *backend_path, int count_only)
{
	size_t len;
	const char *raw = http_request_body(req, &len);
	json_error_t jerr;
	json_t *body = json_loadb(raw, len, JSON_BODY_FLAGS, &jerr);
	if (!body) {
		char msg[300];
		snprintf(msg, sizeof msg, "malformed JSON: %s (line %d, column %d)", jerr.text,
		         jerr.line, jerr.column);
		http_respond_error(req, 400, msg);
		return;
	}
	const char *bad = request_check_types(body, kind);
	if (bad) {
		json_decref(body);
		http_respond_error(req, 400, bad);
		return;
	}
	request_drop_unset(body);
	json_t *template_body = NULL;
	char *client_model = NULL;
	if (kind == KIND_ANTHROPIC || kind == KIND_RESPONSES) {
		char cerr[512];
		json_t *chat = kind == KIND_RESPONSES ? responses_to_chat(body, cerr, sizeof cerr)
		               : count_only
		                   ? anthropic_count_tokens_request_to_chat(body, cerr, sizeof cerr)
		                   : anthropic_to_chat(body, cerr, sizeof cerr);
		if (!chat) {
			json_decref(body);
			http_respond_error(req, 400, cerr);
			return;
		}
		const char *model = json_string_value(json_object_get(body, "model"));
		client_model = strdup(model ? model : "");
		if (kind == KIND_ANTHROPIC) {
			/* The chat request is what goes to the backend. */
			json_decref(body);
			body = chat;
		} else {
			template_body = chat;
		}
	}
	struct backend *b = backend_any_up(d);
	if (!b && !d->supervisor && !backend_any_returning(d)) {
		json_decref(template_body);
		free(client_model);
		json_decref(body);
		http_respond_error(req, 503, "no backend is up");
		return;
	}
	struct serve_req *r = calloc(1, sizeof *r);
	if (!r) {
		json_decref(template_body);
		free(client_model);
		json_decref(body);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	r->d = d;
	r->state = RS_TOKENIZE;
	r->reply.client = req;
	r->ask.kind = kind;
	r->ask.body = body;
	r->ask.template_body = template_body;
	r->ask.client_model = client_model;
	r->ask.count_only = count_only;
	r->ask.allowed = backends_for_model(
	    d, client_model ? client_model : json_string_value(json_object_get(body, "model")));
	r->ask.stream = json_is_true(json_object_get(body, "stream"));
	r->ask.client_uncached = json_is_false(json_object_get(body, "cache_prompt"));
	snprintf(r->ask.client_path, sizeof r->ask.client_path, "%s", http_request_path(req));
	r->ask.t_start_us = r->reply.t_last_write_us = clock_now_us();
	snprintf(r->ask.backend_path, sizeof r->ask.backend_path, "%s", backend_path);
	active_add(r);
	http_request_on_close(req, on_client_close, r);
	json_t *lora = json_object_get(body, "lora");
	if (json_is_array(lora) && json_array_size(lora) &&
	    !(r->ask.lora = json_dumps(lora, JSON_COMPACT))) {
		req_fail(r, 500, "out of memory");
		return;
	}
	/* Tokenize on a backend of the requested model; while none is up (the
	 * llama-server that toki supervises is (re)starting), wait for one
	 * rather than fail. */
	b = b ? req_any_backend(r) : NULL;
	if (!b) {
		r->needs_begin = 1;
		wait_add(r);
		return;
	}
	req_begin(r, b);
}
