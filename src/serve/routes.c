/* The routes of `toki serve`: a table of paths and what serves them, the
 * token check, the daemon's own routes (health, stats, models, metrics) and
 * the llama-server routes passed through as they are. A routed request's
 * life starts in req.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "api/metrics.h"
#include "backend/prefix_render.h"
#include "backend/prompt_probe.h"
#include "prompt/prompt.h"
#include "backend/selftest.h"
#include "backend/supervise.h"
#include "daemon.h"
#include "http/http_parse.h"
#include "http/http_server.h"
#include "serve/adapters.h"
#include "serve/req.h"
#include "serve/serve.h"
#include "util/clock.h"

/* ---- pass-through ---- */

struct passthrough {
	struct http_request *client;
	struct backend_call *call;
};

static void on_pass_close(struct http_request *req, void *arg)
{
	struct passthrough *p = arg;
	backend_call_cancel(p->call);
	free(p);
}

static void on_pass_done(struct backend_call *call, int status, const char *body, size_t len,
                         void *arg)
{
	struct passthrough *p = arg;
	const char *ct = backend_call_header(call, "Content-Type");
	http_request_on_close(p->client, NULL, NULL);
	http_respond(p->client, status, ct ? ct : "application/json", body, len);
	free(p);
}

static void on_pass_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct passthrough *p = arg;
	http_request_on_close(p->client, NULL, NULL);
	http_respond_error(p->client, err == BACKEND_ERR_TIMEOUT ? 504 : 502,
	                   backend_error_text(err));
	free(p);
}

static const struct backend_call_handlers pass_handlers = {
    .on_done = on_pass_done,
    .on_error = on_pass_error,
};

void routes_pass_through(struct daemon *d, struct http_request *req)
{
	struct backend *b = backend_any_up(d);
	if (!b && (d->supervisor || backend_any_returning(d))) {
		/* The managed llama-server is restarting, or a backend is being
		 * discovered: the request waits for it, as a routed one does,
		 * rather than being lost. */
		wait_park(d, req, routes_pass_through);
		return;
	}
	if (!b) {
		http_respond_error(req, 503, "no backend is up");
		return;
	}
	const char *path = http_request_path(req);
	/* Slot actions change what a slot holds behind the router's back. */
	if (!strncmp(path, "/slots/", 7)) {
		int id = atoi(path + 7);
		if (id >= 0 && id < b->rb->n_slots) {
			if (b->rb->slots[id].busy) {
				http_respond_error(req, 409,
				                   "that slot is busy with a routed request");
				return;
			}
			exec_slot_overwritten(d, &b->rb->slots[id]);
		}
	}
	struct passthrough *p = calloc(1, sizeof *p);
	if (!p) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	p->client = req;
	char target[2048];
	const char *q = http_request_query(req);
	snprintf(target, sizeof target, "%s%s%s", path, *q ? "?" : "", q);
	size_t len;
	const char *body = http_request_body(req, &len);
	int has_body = strcmp(http_request_method(req), "GET") != 0;
	p->call = backend_call_start(b->http, http_request_method(req), target,
	                             has_body ? body : NULL, has_body ? len : 0, &pass_handlers, p);
	if (!p->call) {
		free(p);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_request_on_close(req, on_pass_close, p);
}

/* ---- the daemon's own routes ---- */

static void handle_health(struct daemon *d, struct http_request *req)
{
	int up = 0;
	for (int i = 0; i < d->n_backends; i++)
		up += backend_is_up(d->backends[i]);
	json_t *o = json_pack("{s:s, s:i, s:i}", "status", up ? "ok" : "no backend", "backends_up",
	                      up, "backends", d->n_backends);
	reply_json(req, up ? 200 : 503, o);
	json_decref(o);
}

static json_t *backend_stats(struct backend *b)
{
	struct router_backend *rb = b->rb;
	json_t *slots = json_array();
	for (int k = 0; k < rb->n_slots; k++) {
		struct router_slot *sl = &rb->slots[k];
		json_array_append_new(slots, json_pack("{s:i, s:I, s:I, s:b, s:i}", "id", sl->id,
		                                       "tokens", (json_int_t)sl->n_tokens,
		                                       "aligned", (json_int_t)sl->aligned, "busy",
		                                       sl->busy, "hits", (int)sl->hits));
	}
	json_t *e =
	    json_pack("{s:s, s:b, s:s?, s:i, s:i, s:f, s:f, s:o}", "url", rb->url, "up", rb->up,
	              "model", b->model_id, "n_ctx_slot", rb->n_ctx_slot, "n_ubatch", rb->n_ubatch,
	              "prefill_tps", rb->prefill_tps, "decode_tps", rb->decode_tps, "slots", slots);
	json_object_set_new(e, "discoveries", json_integer(rb->discoveries));
	json_object_set_new(e, "self_cached", json_boolean(rb->self_cached));
	json_object_set_new(e, "shared_kv", json_boolean(rb->shared_kv));
	json_object_set_new(e, "ram_cache", json_boolean(rb->ram_cache));
	/* Exact mode's use of that RAM cache (router/ram.h): whether it counts
	 * on it, the states of its own it knows are there, and the "ram" routes
	 * whose cut loaded one, or found it gone. */
	json_object_set_new(
	    e, "ram_states",
	    json_pack("{s:b, s:I, s:I, s:I, s:I}", "used", router_ram_active(b->d->router, rb),
	              "states", (json_int_t)rb->ram.n_states, "tokens", (json_int_t)rb->ram.tokens,
	              "loads", (json_int_t)rb->ram.loads, "misses", (json_int_t)rb->ram.misses));
	char verdict[400];
	selftest_verdict(&b->selftest, verdict, sizeof verdict);
	json_object_set_new(e, "exact",
	                    json_pack("{s:s, s:s, s:s?, s:f, s:i, s:s?, s:b, s:s, s:s}", "selftest",
	                              selftest_state_name(b->selftest.state), "verdict", verdict,
	                              "remedy", b->selftest.remedy, "seconds", b->selftest.seconds,
	                              "tries", b->selftest.tries, "first_try",
	                              b->selftest.tries > 1 ? b->selftest.first_try : NULL, "steps",
	                              b->rb->steps, "steps_why", b->selftest.steps_why, "bits",
	                              rb->bits));
	struct prompt_engine_stats ps = {0};
	if (b->prompt)
		prompt_engine_get_stats(b->prompt, &ps);
	json_object_set_new(
	    e, "prompts",
	    json_pack("{s:s, s:b, s:b, s:I, s:f, s:I, s:f, s:I, s:I, s:I, s:I, s:I}", "status",
	              b->prompt_status, "local_tokenizer", b->prompt_tokens_ok, "local_template",
	              b->prompt_chat_ok, "local", (json_int_t)b->prompt_local, "local_ms",
	              (double)b->prompt_local_us / 1000.0, "server", (json_int_t)b->prompt_server,
	              "server_ms", (double)b->prompt_server_us / 1000.0, "audits",
	              (json_int_t)b->prompt_audits, "mismatches", (json_int_t)b->prompt_mismatches,
	              "fragments", (json_int_t)ps.fragments, "fragment_hits",
	              (json_int_t)ps.fragment_hits, "cached_tokens", (json_int_t)ps.cached_tokens));
	/* Exact mode's message prefixes rendered by the server (a template it
	 * renders its own way): wanted, asked for, and the renderings kept. */
	struct prefix_render_stats rs;
	prefix_render_cache_stats(b, &rs);
	json_object_set_new(json_object_get(e, "prompts"), "server_prefixes",
	                    json_pack("{s:I, s:I, s:I, s:I, s:I}", "wanted",
	                              (json_int_t)b->prompt_prefixes, "rendered",
	                              (json_int_t)b->prompt_prefixes_rendered, "kept",
	                              (json_int_t)rs.entries, "kept_bytes", (json_int_t)rs.bytes,
	                              "stale", (json_int_t)rs.stale));
	return e;
}

static void handle_stats(struct daemon *d, struct http_request *req)
{
	struct daemon_stats *s = &d->stats;
	json_t *o = json_object();
#define N(key, v) json_object_set_new(o, key, json_integer((json_int_t)(v)))
	json_object_set_new(o, "mode", json_string(reuse_mode_name(d->router->mode)));
	json_object_set_new(o, "uptime_s",
	                    json_real((double)(clock_now_us() - d->started_us) / 1e6));
	N("requests", s->requests);
	N("routed", s->routed);
	N("hits", s->hits);
	N("partials", s->partials);
	N("misses", s->misses);
	N("errors", s->errors);
	N("prompt_tokens", s->prompt_tokens);
	N("evaluated_tokens", s->evaluated_tokens);
	N("cached_tokens", s->cached_tokens);
	N("cut_backs", s->trim_tokens);
	N("saves", s->saves);
	N("llama_restarts", d->supervisor ? supervisor_restarts(d->supervisor) : 0);
	N("restores", s->restores);
	N("saved_files", d->router->n_saved);
	N("saved_bytes", d->router->saved_bytes);
	N("saved_evictions", s->saved_evictions);
	N("discarded_files", s->discarded_files);
	N("replans", s->replans);
	N("prefill_steps", s->prefill_steps);
	N("tail_cuts", s->tail_cuts);
	N("tail_cut_tokens", s->tail_cut_tokens);
	N("answers_kept", s->answers_kept);
	N("answer_rows_kept", s->answer_rows_kept);
	N("answers_kept_by_ids", s->answers_kept_by_ids);
	N("replayed_tokens", s->replayed_tokens);
	N("replay_forced_tokens", s->replay_forced_tokens);
	json_t *bs = json_array();
	for (int i = 0; i < d->n_backends; i++)
		json_array_append_new(bs, backend_stats(d->backends[i]));
	json_object_set_new(o, "backends", bs);
	N("waiting", d->n_waiting);
#undef N
	reply_json(req, 200, o);
	json_decref(o);
}

/* The backend's model list, with the context that every part of toki uses
 * (a slot's context) and the output cap advertised on each model. */
static void handle_models(struct daemon *d, struct http_request *req)
{
	struct backend *b = backend_any_up(d);
	if (!b && (d->supervisor || backend_any_returning(d))) {
		wait_park(d, req, handle_models); /* coming back, as above */
		return;
	}
	if (!b || !b->models) {
		http_respond_error(req, 503, "no backend is up");
		return;
	}
	json_t *m = json_deep_copy(b->models);
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(m, "data"), i, e)
	{
		json_object_set_new(e, "context_length", json_integer(b->rb->n_ctx_slot));
		if (d->cfg.max_output > 0)
			json_object_set_new(e, "max_output", json_integer(d->cfg.max_output));
		json_t *meta = json_object_get(e, "meta");
		if (json_is_object(meta))
			json_object_set_new(meta, "n_ctx", json_integer(b->rb->n_ctx_slot));
	}
	reply_json(req, 200, m);
	json_decref(m);
}

/* ---- the table ---- */

enum method_rule {
	ANY,  /* every method */
	POST, /* POST, else 405 */
	GET,  /* GET or HEAD, else 405 */
};

struct route {
	const char *path;
	enum method_rule method;
	int public; /* served without the token (as llama-server serves it with --api-key) */
	/* A routed request (kind, backend path), or one of the daemon's own. */
	int routed;
	enum route_kind kind;
	const char *backend_path;
	int count_only;
	void (*handler)(struct daemon *d, struct http_request *req);
};

/* Answered once nothing runs here (wait.c), or after ?wait_ms=N
 * (SERVE_IDLE_WAIT_MS at most, and without one). */
static void handle_idle(struct daemon *d, struct http_request *req)
{
	char v[32];
	long ms = http_query_param(http_request_query(req), "wait_ms", v, sizeof v)
	              ? strtol(v, NULL, 10)
	              : SERVE_IDLE_WAIT_MS;
	wait_idle(d, req, ms < 0 ? 0 : ms > SERVE_IDLE_WAIT_MS ? SERVE_IDLE_WAIT_MS : ms);
}

static void handle_metrics(struct daemon *d, struct http_request *req)
{
	/* Every backend's series and toki's own, in one scrape. */
	metrics_handle(d, req);
}

#define ROUTED(p, k, bp)                                                                           \
	{                                                                                          \
		p, POST, 0, 1, k, bp, 0, NULL                                                      \
	}
#define OWN(p, m, pub, h)                                                                          \
	{                                                                                          \
		p, m, pub, 0, KIND_CHAT, NULL, 0, h                                                \
	}
#define PASS(p)                                                                                    \
	{                                                                                          \
		p, ANY, 0, 0, KIND_CHAT, NULL, 0, routes_pass_through                              \
	}

static const struct route routes[] = {
    /* /v1/health is llama-server's other name for it, public as well. */
    OWN("/health", ANY, 1, handle_health),
    OWN("/v1/health", ANY, 1, handle_health),
    OWN("/toki/stats", ANY, 0, handle_stats),
    OWN("/toki/idle", GET, 0, handle_idle),
    OWN("/metrics", ANY, 0, handle_metrics),
    ROUTED("/v1/chat/completions", KIND_CHAT, "/v1/chat/completions"),
    ROUTED("/chat/completions", KIND_CHAT, "/v1/chat/completions"),
    /* llama-server serves /completions with its own /completion (native
     * answers); only /v1/completions is OpenAI's. */
    ROUTED("/v1/completions", KIND_COMPLETION, "/v1/completions"),
    ROUTED("/completions", KIND_COMPLETION, "/completion"),
    ROUTED("/completion", KIND_COMPLETION, "/completion"),
    /* llama-server (and Ollama) serve the Messages API at the root: a client
     * pointed at toki instead of the server sends it there. */
    ROUTED("/anthropic/v1/messages", KIND_ANTHROPIC, "/v1/chat/completions"),
    ROUTED("/v1/messages", KIND_ANTHROPIC, "/v1/chat/completions"),
    /* Anthropic's count_tokens: the same translation and tokenization as a
     * message, then the count instead of a generation. */
    {"/anthropic/v1/messages/count_tokens", POST, 0, 1, KIND_ANTHROPIC, "/v1/chat/completions", 1,
     NULL},
    {"/v1/messages/count_tokens", POST, 0, 1, KIND_ANTHROPIC, "/v1/chat/completions", 1, NULL},
    ROUTED("/v1/responses", KIND_RESPONSES, "/v1/responses"),
    ROUTED("/responses", KIND_RESPONSES, "/v1/responses"),
    /* POST and DELETE /models are a router-mode server's downloads and
     * deletions, which toki does not pass on. */
    OWN("/v1/models", GET, 0, handle_models),
    OWN("/models", GET, 0, handle_models),
    PASS("/tokenize"),
    PASS("/detokenize"),
    PASS("/props"),
    PASS("/slots"),
    PASS("/apply-template"),
    PASS("/embedding"),
    PASS("/embeddings"),
    PASS("/v1/embeddings"),
    PASS("/infill"),
    PASS("/rerank"),
    PASS("/reranking"),
    PASS("/v1/rerank"),
    PASS("/v1/reranking"),
    /* GET passes through; a change of scales is made on every backend. */
    {"/lora-adapters", ANY, 0, 0, KIND_CHAT, NULL, 0, adapters_route},
    /* A prompt's token count, without running it (llama-server 11669). */
    PASS("/chat/completions/input_tokens"),
    PASS("/v1/chat/completions/input_tokens"),
    PASS("/responses/input_tokens"),
    PASS("/v1/responses/input_tokens"),
    /* Ends a running request's reasoning: the request is on the backend
     * these go to when there is one backend. */
    PASS("/v1/chat/completions/control"),
    PASS("/audio/transcriptions"),
    PASS("/v1/audio/transcriptions"),
};

static const struct route slot_action = PASS("/slots/");

static const struct route *find_route(const char *method, const char *path)
{
	for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
		if (!strcmp(path, routes[i].path))
			return &routes[i];
	/* A slot action (save, restore, erase) on a slot. */
	if (!strncmp(path, "/slots/", 7) && !strcmp(method, "POST"))
		return &slot_action;
	return NULL;
}

void serve_handle(struct http_request *req, void *ctx)
{
	struct daemon *d = ctx;
	const char *method = http_request_method(req);
	const char *path = http_request_path(req);
	d->stats.requests++;
	if (d->shutting_down) {
		http_respond_error(req, 503, "toki is shutting down");
		return;
	}
	const struct route *rt = find_route(method, path);
	if (!(rt && rt->public) &&
	    !auth_check(d->cfg.token, http_request_header(req, "Authorization"),
	                http_request_header(req, "x-api-key"))) {
		http_response_header(req, "WWW-Authenticate", "Bearer realm=\"toki\"");
		http_respond_error(
		    req, 401,
		    "missing or wrong token: send the local token as Authorization: "
		    "Bearer <token> or x-api-key (see $TOKI_STATE_DIR/token, or TOKI_TOKEN)");
		return;
	}
	if (!rt) {
		char msg[300];
		snprintf(msg, sizeof msg, "no route for %s %.200s", method, path);
		http_respond_error(req, 404, msg);
		return;
	}
	if (rt->method == POST && strcmp(method, "POST")) {
		http_respond_error(req, 405, "use POST");
		return;
	}
	if (rt->method == GET && strcmp(method, "GET") && strcmp(method, "HEAD")) {
		http_respond_error(req, 405, "use GET");
		return;
	}
	if (rt->routed)
		req_start(d, req, rt->kind, rt->backend_path, rt->count_only);
	else
		rt->handler(d, req);
}
