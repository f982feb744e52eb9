#include "api/proxy.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_error.h"
#include "api/anthropic.h"
#include "api/auth.h"
#include "api/metrics.h"
#include "api/request_check.h"
#include "api/responses.h"
#include "backend/backend.h"
#include "backend/prompt_probe.h"
#include "backend/slot_store.h"
#include "backend/supervise.h"
#include "daemon.h"
#include "http/http_server.h"
#include "http/sse.h"
#include "prompt/prompt.h"
#include "router/router.h"
#include "util/clock.h"
#include "util/dtoa.h"
#include "util/log.h"

/* The route kinds (enum route_kind, api/request_check.h): CHAT and
 * COMPLETION pass through; ANTHROPIC is translated to a chat request and
 * back (llama-server's own /v1/messages cannot be pinned to a slot);
 * RESPONSES goes to llama-server's /v1/responses, routed by the tokens of
 * its chat equivalent. */
enum proxy_state {
	PS_TEMPLATE, /* waiting for /apply-template */
	PS_TOKENIZE, /* waiting for /tokenize */
	PS_WAITING,  /* queued for a slot */
	PS_SAVE,     /* saving the slot's content to a file before it is replaced */
	PS_RESTORE,  /* restoring a saved state into the slot */
	PS_TRIM,     /* cutting the slot back to the reuse point (exact mode) */
	PS_PREFILL,  /* evaluating a chunk of the prompt (exact mode's schedule) */
	PS_FORWARD,  /* the request is on the backend */
	PS_SETTLE,   /* cancelled; waiting for the server to free the slot (exact mode) */
	PS_TAILCUT,  /* answered; cutting the slot back to what exact mode can reuse */
	PS_DONE,
};

struct proxy_req {
	struct daemon *d;
	struct http_request *client; /* NULL once the client has gone */
	enum route_kind kind;
	enum proxy_state state;
	char backend_path[64];
	json_t *body;          /* what goes to the backend */
	json_t *template_body; /* the chat request whose template gives the tokens (RESPONSES) */
	char *client_model;    /* the model name the client sent (ANTHROPIC echoes it) */
	struct anthropic_stream *astream;
	int stream;
	token_t *tokens;
	size_t n_tokens;
	int routable; /* one prompt, tokenized: the router can place it */
	struct backend *backend;
	struct backend_call *call;
	struct route_choice choice;
	struct router_slot *slot; /* held (busy) while set */
	/* Exact mode: the chunk starts of the request's schedule (none: the
	 * grid), the plan the executor runs, and how far the slot holds the
	 * prompt evaluated on that schedule (router/sched.h). */
	size_t *bounds, n_bounds;
	struct plan plan;
	size_t done_upto;
	int client_uncached;      /* the client sent cache_prompt: false */
	int force_cold;           /* a step found the slot not as planned: start from empty */
	int prompt_fault;         /* the server's prompt is not toki's: toki's is dropped */
	int gen_started;          /* the last step's prompt was evaluated (a token came) */
	int steps;                /* backend calls before GENERATE that evaluated tokens */
	long long steps_prompt_n; /* ... and what they evaluated */
	double steps_prompt_ms;
	token_t cut_junk;      /* the token a cut leaves after the kept prefix */
	size_t cut_keep;       /* ... and how much of the prompt it keeps */
	int counted;           /* its evaluated tokens are in the stats */
	int abandoned;         /* the client went away during a prefill step, left to end */
	size_t abandoned_at;   /* where the step in flight then began */
	int stream_begun;      /* the client's SSE response has begun (200 sent) */
	struct event *idle_ev; /* after a cancel: the next look at the slot */
	char client_path[64];
	char save_name[96];
	char restored_name[96];
	int restored;
	int saving;        /* a slot save is out: it holds pr, and frees it if pr ended meanwhile */
	int needs_begin;   /* waiting for a backend before tokenizing */
	uint64_t allowed;  /* backends serving the requested model (bit i: backend i) */
	uint64_t excluded; /* backends that failed this request before it streamed */
	int set_cache_prompt; /* toki added cache_prompt: false (exact mode, nothing reused) */
	int local_prompt;     /* toki tokenized the prompt itself */
	int local_template;   /* ... and applied the chat template too */
	int force_server;     /* ... and then found it wrong: the server does it now */
	int added_progress;   /* toki asked for return_progress (its events are dropped) */
	int progress_checked; /* the first progress event was checked against the plan */
	int replans;          /* times the request was planned again (bounded) */
	int replanning;       /* a replan is scheduled: the old call's events are ignored */
	struct event *replan_ev;
	struct backend *prompt_backend;     /* whose engine made the prompt */
	struct backend *tokenize_backend;   /* who was asked for the tokens (or whose engine) */
	int64_t t_tokenize_us, tokenize_us; /* when tokenizing began; what it took */
	int retries;
	int count_only;     /* count_tokens: answer with the count, generate nothing */
	long max_tokens;    /* the output cap sent to the backend */
	int output_clamped; /* the client asked for more than fits */
	int status;         /* the backend's HTTP status */
	struct sse_parser sse;
	char *held; /* the last event, held back until we know it is the last */
	size_t held_len;
	int done_sent;
	int timings_seen;
	long long cache_n, prompt_n, predicted_n;
	double prompt_ms, predicted_ms;
	struct evbuffer *errbuf; /* a non-200 backend body during a stream */
	struct event *keepalive;
	struct event *begin_timer; /* begins a streamed answer if the backend is slow to */
	int64_t t_start_us, t_last_write_us, t_forward_us, t_first_byte_us;
	int64_t t_route_us;      /* its first routing try: a wait for a slot starts there */
	int64_t t_first_data_us; /* the first body bytes of a 200 stream from the backend */
	struct proxy_req *wait_next, *wait_prev;
	struct proxy_req *act_next, *act_prev;
};

static void pr_finish(struct proxy_req *pr);
static void pr_try_route(struct proxy_req *pr);
static void begin_client_stream(struct proxy_req *pr);
static void arm_client_stream(struct proxy_req *pr);
static void save_slot(struct proxy_req *pr);
static void pr_begin(struct proxy_req *pr, struct backend *b);
static void tokens_ready(struct proxy_req *pr);
static int local_text(struct proxy_req *pr, struct backend *b, const char *text, size_t len);
static void unpin_restore(struct proxy_req *pr);

/* ---- small helpers ---- */

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

static struct backend *any_allowed_backend(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	uint64_t ok = pr->allowed & ~pr->excluded;
	for (int i = 0; i < d->n_backends; i++)
		if ((i >= 64 || (ok >> i) & 1) && backend_is_up(d->backends[i]))
			return d->backends[i];
	return NULL;
}

static void respond_json(struct http_request *req, int status, json_t *obj)
{
	char *s = json_dumps(obj, JSON_COMPACT);
	if (!s) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_respond(req, status, "application/json", s, strlen(s));
	free(s);
}

static void active_add(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	pr->act_next = d->active;
	if (d->active)
		d->active->act_prev = pr;
	d->active = pr;
}

static void active_remove(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	if (pr->act_prev)
		pr->act_prev->act_next = pr->act_next;
	else if (d->active == pr)
		d->active = pr->act_next;
	if (pr->act_next)
		pr->act_next->act_prev = pr->act_prev;
	pr->act_next = pr->act_prev = NULL;
}

static void wait_add(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	pr->state = PS_WAITING;
	pr->wait_prev = d->waiting_tail;
	pr->wait_next = NULL;
	if (d->waiting_tail)
		d->waiting_tail->wait_next = pr;
	else
		d->waiting_head = pr;
	d->waiting_tail = pr;
	d->n_waiting++;
}

static void wait_remove(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	if (pr->state != PS_WAITING)
		return;
	if (pr->wait_prev)
		pr->wait_prev->wait_next = pr->wait_next;
	else
		d->waiting_head = pr->wait_next;
	if (pr->wait_next)
		pr->wait_next->wait_prev = pr->wait_prev;
	else
		d->waiting_tail = pr->wait_prev;
	pr->wait_next = pr->wait_prev = NULL;
	d->n_waiting--;
	/* Out of the queue: no longer waiting. A request that left it still
	 * marked PS_WAITING was never queued again when it had to wait once
	 * more (routed after the prompt probes, its backend busy in exact
	 * mode), and hung. */
	pr->state = PS_TOKENIZE;
}

static void client_write(struct proxy_req *pr, const char *data, size_t len)
{
	if (!pr->client)
		return;
	http_stream_write(pr->client, data, len);
	pr->t_last_write_us = clock_now_us();
}

static void client_write_strbuf(struct proxy_req *pr, struct strbuf *b)
{
	if (b->len)
		client_write(pr, b->p, b->len);
	strbuf_reset(b);
}

/* An error for the client: a JSON answer if nothing was sent yet, else an
 * error event that ends the stream. */
static void fail(struct proxy_req *pr, int status, const char *message)
{
	pr->d->stats.errors++;
	if (pr->client && pr->astream && pr->stream_begun) {
		struct strbuf b;
		strbuf_init(&b);
		anthropic_stream_error(pr->astream, status == 504 ? "timeout_error" : "api_error",
		                       message, &b);
		client_write_strbuf(pr, &b);
		strbuf_free(&b);
		http_stream_end(pr->client);
		pr->client = NULL;
	}
	if (pr->client) {
		if (pr->stream && pr->stream_begun) {
			char *body = api_error_body(status, message, http_request_path(pr->client));
			if (body) {
				client_write(pr, "data: ", 6);
				client_write(pr, body, strlen(body));
				client_write(pr, "\n\n", 2);
				free(body);
			}
			http_stream_end(pr->client);
		} else {
			http_respond_error(pr->client, status, message);
		}
		pr->client = NULL;
	}
	pr_finish(pr);
}

/* What the backend sends is parsed allowing NUL in strings: a model can
 * emit a NUL byte (its <0x00> token), which llama-server writes as \u0000;
 * without the flag jansson refuses the whole answer. */
#define BACKEND_JSON JSON_ALLOW_NUL

/* ---- the cache block ---- */

/* The cache block as JSON text, written here rather than through jansson:
 * it goes into every answer, and building and dumping it as objects was a
 * tenth of the daemon's work per request. Numbers that are estimates or
 * times use the shortest form that reads back exactly (util/dtoa.h). */
static void text_put(struct strbuf *t, const char *s, size_t n)
{
	strbuf_append(t, s, n);
}

static void text_printf(struct strbuf *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void text_printf(struct strbuf *t, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof buf)
		t->failed = 1;
	else
		text_put(t, buf, (size_t)n);
}

/* ,"key": (no comma before the first key). */
static void text_key(struct strbuf *t, const char *key)
{
	if (t->len > 1)
		text_put(t, ",", 1);
	text_put(t, "\"", 1);
	text_put(t, key, strlen(key));
	text_put(t, "\":", 2);
}

/* ,"key":"value" with value escaped as JSON requires. */
static void text_key_string(struct strbuf *t, const char *key, const char *v)
{
	text_key(t, key);
	text_put(t, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)(v ? v : ""); *c; c++) {
		if (*c == '"' || *c == '\\') {
			char e[2] = {'\\', (char)*c};
			text_put(t, e, 2);
		} else if (*c < 0x20) {
			text_printf(t, "\\u%04x", *c);
		} else {
			text_put(t, (const char *)c, 1);
		}
	}
	text_put(t, "\"", 1);
}

static void text_key_int(struct strbuf *t, const char *key, long long v)
{
	char num[24], *e = num + sizeof num, *p = e;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
	do
		*--p = (char)('0' + u % 10);
	while (u /= 10);
	if (v < 0)
		*--p = '-';
	text_key(t, key);
	text_put(t, p, (size_t)(e - p));
}

static void text_key_real(struct strbuf *t, const char *key, double v)
{
	char num[40];
	size_t n;
	if (v != v || v - v != 0) /* NaN or infinite: JSON has no such number */
		n = (size_t)snprintf(num, sizeof num, "null");
	else
		n = dtoa_nlohmann(v, num);
	text_key(t, key);
	text_put(t, num, n);
}

static void text_key_raw(struct strbuf *t, const char *key, const char *raw)
{
	text_key(t, key);
	text_put(t, raw, strlen(raw));
}

/* What the whole request cost, all its backend steps together: the
 * prompt tokens it took from the cache, and those the server evaluated for
 * it (chunks, cuts and the last step). */
static long long req_cached(const struct proxy_req *pr)
{
	return pr->steps ? (long long)pr->plan.reuse : pr->cache_n;
}

static long long req_evaluated(const struct proxy_req *pr)
{
	return pr->steps_prompt_n + pr->prompt_n;
}

static int exact_mode(const struct proxy_req *pr)
{
	return reuse_mode_is_exact(pr->d->router->mode);
}

/* The block's text (malloc'd), or NULL when out of memory. */
static char *cache_block_text(struct proxy_req *pr)
{
	struct router_slot *s = pr->choice.slot;
	struct strbuf t = {0};
	text_put(&t, "{", 1);
	text_key_string(&t, "backend", pr->backend ? pr->backend->rb->url : "");
	if (s)
		text_key_int(&t, "slot", s->id);
	else
		text_key_raw(&t, "slot", "null");
	text_key_string(&t, "route", pr->routable ? pr->choice.kind : "unrouted");
	text_key_string(&t, "mode", reuse_mode_name(pr->d->router->mode));
	text_key_int(&t, "prompt_tokens", (long long)pr->n_tokens);
	text_key_int(&t, "matched", (long long)pr->choice.matched);
	text_key_int(&t, "reuse", (long long)pr->choice.reuse);
	if (pr->timings_seen) {
		text_key_int(&t, "cached", req_cached(pr));
		text_key_int(&t, "evaluated", req_evaluated(pr));
	}
	if (exact_mode(pr) && pr->routable) {
		/* "messages": chunks that end where messages start; "grid":
		 * llama-server's own schedule (--reuse grid, or no prompt of
		 * toki's own to find messages in). */
		text_key_string(&t, "schedule", pr->n_bounds ? "messages" : "grid");
		text_key_int(&t, "chunks", (long long)pr->n_bounds + 1);
		text_key_int(&t, "steps", (long long)pr->steps + 1);
		if (pr->backend) {
			/* Whether the promise holds on this backend (its self-test). */
			char verdict[400];
			selftest_verdict(&pr->backend->selftest, verdict, sizeof verdict);
			text_key_string(&t, "exact", verdict);
		}
	}
	text_key_raw(&t, "trimmed", pr->choice.must_trim ? "true" : "false");
	text_key_int(&t, "max_tokens", pr->max_tokens);
	if (pr->output_clamped)
		text_key_raw(&t, "max_tokens_clamped", "true");
	if (pr->restored)
		text_key_string(&t, "restored", pr->restored_name);
	text_key_real(&t, "est_prefill_ms", pr->choice.est_prefill_s * 1000.0);
	text_key_string(&t, "tokenized", pr->local_prompt ? "toki" : "server");
	if (pr->kind != KIND_COMPLETION)
		text_key_string(&t, "templated", pr->local_template ? "toki" : "server");
	if (pr->tokenize_us)
		text_key_real(&t, "tokenize_ms", (double)pr->tokenize_us / 1000.0);
	text_put(&t, "}", 1);
	if (t.failed) {
		free(t.p);
		return NULL;
	}
	return t.p;
}

static json_t *cache_block(struct proxy_req *pr)
{
	char *text = cache_block_text(pr);
	json_error_t jerr;
	json_t *c = text ? json_loads(text, 0, &jerr) : NULL;
	free(text);
	return c ? c : json_object();
}

/* Where the JSON object in text (an event's "data:" or a whole body)
 * opens and closes; 0 when there is none. */
static int object_span(const char *text, size_t len, size_t *open_at, size_t *close_at)
{
	size_t open = 0;
	const char *data = memmem(text, len, "data:", 5);
	if (data && (data == text || data[-1] == '\n' || data[-1] == '\r'))
		open = (size_t)(data - text) + 5;
	while (open < len && (text[open] == ' ' || text[open] == '\n' || text[open] == '\r' ||
	                      text[open] == '\t'))
		open++;
	size_t close = len;
	while (close > open && text[close - 1] != '}')
		close--;
	if (open >= len || text[open] != '{' || close <= open + 1)
		return 0;
	*open_at = open;
	*close_at = close;
	return 1;
}

/* When a request ran in several backend steps, the last step's timings and
 * usage describe only that step: they are rewritten to describe the whole
 * request (what it reused from before it, what the server evaluated for
 * it, in how long). Returns a new buffer, or NULL when nothing changes. */
/* text with text[at..end) replaced by repl (rl bytes), in a new buffer. */
static char *splice(const char *text, size_t len, size_t at, size_t end, const char *repl,
                    size_t rl, size_t *out_len)
{
	size_t n = len - (end - at) + rl;
	char *out = malloc(n + 1);
	if (!out)
		return NULL;
	memcpy(out, text, at);
	memcpy(out + at, repl, rl);
	memcpy(out + at + rl, text + end, len - end);
	out[n] = 0;
	*out_len = n;
	return out;
}

static char *whole_request_counts(struct proxy_req *pr, const char *text, size_t len,
                                  size_t *out_len)
{
	/* Only the counts change: every other byte (the logprobs above all)
	 * stays as the server wrote it. */
	if (!pr->steps || !pr->timings_seen)
		return NULL;
	long long cached = req_cached(pr), evaluated = req_evaluated(pr);
	double ms = pr->steps_prompt_ms + pr->prompt_ms;
	char *cur = NULL;
	size_t cur_len = len;
	const char *src = text;
	/* The last "timings":{...}, a flat object. */
	static const char tk[] = "\"timings\":";
	const char *at = NULL;
	for (const char *q = src; (q = memmem(q, cur_len - (size_t)(q - src), tk, sizeof tk - 1));
	     q++)
		at = q;
	const char *ob = at ? at + sizeof tk - 1 : NULL;
	const char *cb = ob && ob < src + cur_len && *ob == '{'
	                     ? memchr(ob, '}', cur_len - (size_t)(ob - src))
	                     : NULL;
	if (cb) {
		json_error_t jerr;
		json_t *t = json_loadb(ob, (size_t)(cb - ob) + 1, 0, &jerr);
		if (json_is_object(t)) {
			json_object_set_new(t, "cache_n", json_integer(cached));
			json_object_set_new(t, "prompt_n", json_integer(evaluated));
			json_object_set_new(t, "prompt_ms", json_real(ms));
			if (evaluated > 0 && ms > 0) {
				json_object_set_new(t, "prompt_per_token_ms",
				                    json_real(ms / (double)evaluated));
				json_object_set_new(t, "prompt_per_second",
				                    json_real(1000.0 * (double)evaluated / ms));
			}
			char *js = json_dumps(t, JSON_COMPACT);
			if (js) {
				size_t nl = 0;
				char *next = splice(src, cur_len, (size_t)(ob - src),
				                    (size_t)(cb - src) + 1, js, strlen(js), &nl);
				if (next) {
					free(cur);
					cur = next;
					src = cur;
					cur_len = nl;
				}
				free(js);
			}
		}
		json_decref(t);
	}
	/* usage's cached_tokens (prompt_tokens_details, input_tokens_details). */
	static const char ck[] = "\"cached_tokens\":";
	char num[32];
	int nn = snprintf(num, sizeof num, "%lld", cached);
	for (size_t from = 0;;) {
		const char *q = memmem(src + from, cur_len - from, ck, sizeof ck - 1);
		if (!q)
			break;
		size_t v = (size_t)(q - src) + sizeof ck - 1, e = v;
		while (e < cur_len && ((src[e] >= '0' && src[e] <= '9') || src[e] == '-'))
			e++;
		if (e == v) {
			from = v;
			continue;
		}
		size_t nl = 0;
		char *next = splice(src, cur_len, v, e, num, (size_t)nn, &nl);
		if (!next)
			break;
		free(cur);
		cur = next;
		src = cur;
		cur_len = nl;
		from = v + (size_t)nn;
	}
	if (cur)
		*out_len = cur_len;
	return cur;
}

/* Inserts ,"cache":{...} before the final '}' of a JSON object held in
 * text, so that every byte the backend sent is kept as it was (but for the
 * counts of a request that ran in several steps). Returns a new buffer, or
 * NULL when the text is not an object. */
static char *inject_cache_text(struct proxy_req *pr, const char *text, size_t len, size_t *out_len);

/* A client that filters the answer (llama-server's response_fields) gets
 * the cache block only if it asked for it. */
static int cache_wanted(const struct proxy_req *pr)
{
	json_t *f = json_object_get(pr->body, "response_fields");
	if (!json_is_array(f))
		return 1;
	size_t i;
	json_t *v;
	json_array_foreach(f, i, v)
	{
		const char *name = json_string_value(v);
		if (name && (!strcmp(name, "cache") || !strncmp(name, "cache/", 6)))
			return 1;
	}
	return 0;
}

static char *inject_cache(struct proxy_req *pr, const char *text, size_t len, size_t *out_len)
{
	size_t wl = 0;
	char *whole = whole_request_counts(pr, text, len, &wl);
	if (!cache_wanted(pr)) {
		if (whole)
			*out_len = wl;
		return whole;
	}
	char *out = whole ? inject_cache_text(pr, whole, wl, out_len)
	                  : inject_cache_text(pr, text, len, out_len);
	free(whole);
	return out;
}

static char *inject_cache_text(struct proxy_req *pr, const char *text, size_t len, size_t *out_len)
{
	/* The object starts after the event's "data:" (in a stream) or at the
	 * first non-blank byte (a plain body); it ends at the last '}'. */
	size_t open, close;
	if (!object_span(text, len, &open, &close))
		return NULL;
	char *cs = cache_block_text(pr);
	if (!cs)
		return NULL;
	/* An empty object must not get a leading comma. */
	size_t k = close - 1;
	while (k > open + 1 && (text[k - 1] == ' ' || text[k - 1] == '\n' || text[k - 1] == '\t' ||
	                        text[k - 1] == '\r'))
		k--;
	int empty = k == open + 1;
	size_t cl = strlen(cs);
	size_t n = len + cl + 12;
	char *out = malloc(n);
	if (!out) {
		free(cs);
		return NULL;
	}
	size_t pos = close - 1;
	memcpy(out, text, pos);
	int w = snprintf(out + pos, n - pos, "%s\"cache\":%s", empty ? "" : ",", cs);
	memcpy(out + pos + (size_t)w, text + pos, len - pos);
	*out_len = pos + (size_t)w + (len - pos);
	free(cs);
	return out;
}

static void note_timings(struct proxy_req *pr, json_t *obj)
{
	json_t *t = json_object_get(obj, "timings");
	if (!json_is_object(t)) {
		/* No timings (the Responses API without streaming): usage has the
		 * same two numbers, as total and cached input tokens. */
		json_t *u = json_object_get(obj, "usage");
		if (!json_is_object(u) && json_is_object(json_object_get(obj, "response")))
			u = json_object_get(json_object_get(obj, "response"), "usage");
		json_t *total = json_object_get(u, "input_tokens");
		json_t *cached =
		    json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens");
		if (!json_is_integer(total)) {
			total = json_object_get(u, "prompt_tokens");
			cached = json_object_get(json_object_get(u, "prompt_tokens_details"),
			                         "cached_tokens");
		}
		if (!json_is_integer(total))
			return;
		pr->timings_seen = 1;
		pr->cache_n = json_integer_value(cached);
		pr->prompt_n = json_integer_value(total) - pr->cache_n;
		pr->prompt_ms = 0;
		pr->predicted_n = 0;
		pr->predicted_ms = 0;
		return;
	}
	pr->timings_seen = 1;
	pr->cache_n = json_integer_value(json_object_get(t, "cache_n"));
	pr->prompt_n = json_integer_value(json_object_get(t, "prompt_n"));
	pr->prompt_ms = json_number_value(json_object_get(t, "prompt_ms"));
	pr->predicted_n = json_integer_value(json_object_get(t, "predicted_n"));
	pr->predicted_ms = json_number_value(json_object_get(t, "predicted_ms"));
}

/* llama-server's timings object is flat: keys and numbers. This reads the
 * five toki uses straight from the text; 0 when the text is anything else
 * (the caller then parses it as JSON). Numbers toki does not use are
 * skipped, not converted. */
static int scan_timings(struct proxy_req *pr, const char *p, const char *end)
{
	long long cache_n = -1, prompt_n = -1, predicted_n = 0;
	double prompt_ms = 0, predicted_ms = 0;
#define SKIP_WS()                                                                                  \
	while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))                   \
	p++
	SKIP_WS();
	if (p >= end || *p++ != '{')
		return 0;
	for (;;) {
		SKIP_WS();
		if (p < end && *p == '}')
			break;
		if (p >= end || *p++ != '"')
			return 0;
		const char *key = p;
		while (p < end && *p != '"' && *p != '\\')
			p++;
		if (p >= end || *p != '"')
			return 0;
		size_t klen = (size_t)(p++ - key);
		SKIP_WS();
		if (p >= end || *p++ != ':')
			return 0;
		SKIP_WS();
		char num[48];
		size_t n = 0;
		while (p < end && n < sizeof num - 1 &&
		       ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' ||
		        *p == 'e' || *p == 'E'))
			num[n++] = *p++;
		if (!n || n == sizeof num - 1)
			return 0;
		num[n] = 0;
#define IS(k) (klen == sizeof k - 1 && !memcmp(key, k, klen))
		if (IS("cache_n"))
			cache_n = strtoll(num, NULL, 10);
		else if (IS("prompt_n"))
			prompt_n = strtoll(num, NULL, 10);
		else if (IS("predicted_n"))
			predicted_n = strtoll(num, NULL, 10);
		else if (IS("prompt_ms"))
			prompt_ms = strtod(num, NULL);
		else if (IS("predicted_ms"))
			predicted_ms = strtod(num, NULL);
#undef IS
		SKIP_WS();
		if (p < end && *p == ',') {
			p++;
			continue;
		}
		if (p < end && *p == '}')
			break;
		return 0;
	}
#undef SKIP_WS
	if (cache_n < 0 || prompt_n < 0)
		return 0;
	pr->timings_seen = 1;
	pr->cache_n = cache_n;
	pr->prompt_n = prompt_n;
	pr->prompt_ms = prompt_ms;
	pr->predicted_n = predicted_n;
	pr->predicted_ms = predicted_ms;
	return 1;
}

/* The timings of a whole (non-streamed) answer. llama-server writes
 * "timings" as the answer's last key, after everything generated: the last
 * occurrence of the key is the real one, and reading only that object
 * spares parsing the whole answer (most of the daemon's work on a short
 * request). Anything else is parsed whole. */
static void note_timings_in_body(struct proxy_req *pr, const char *body, size_t len)
{
	static const char key[] = "\"timings\":";
	const char *at = NULL;
	for (const char *p = body; (p = memmem(p, len - (size_t)(p - body), key, sizeof key - 1));
	     p++)
		at = p;
	if (at && scan_timings(pr, at + sizeof key - 1, body + len))
		return;
	json_error_t jerr;
	json_t *obj = json_loadb(body, len, BACKEND_JSON, &jerr);
	if (obj)
		note_timings(pr, obj);
	json_decref(obj);
}

/* ---- finishing ---- */

static void end_slot(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	struct router_slot *s = pr->slot;
	if (!s)
		return;
	router_slot_end(d->router, s, clock_now_us());
	pr->slot = NULL;
	/* The slot is free (and exact mode's backend too): requests that
	 * waited for it go now. */
	daemon_slots_changed(d);
}

static int start_tail_cut(struct proxy_req *pr);

/* Fast mode leaves the slot to a server that loads states from its RAM
 * cache only into a slot it picks itself (router.h, self_cached), and to
 * one that has such a cache when toki has no slot files for it (ram_cache):
 * what toki evicts goes to that RAM, which toki cannot see, so the server's
 * own choice is the better one. Exact mode always picks: its steps need
 * one slot. */
static int server_picks_slot(const struct proxy_req *pr)
{
	const struct router_backend *b = pr->slot ? pr->slot->backend : NULL;
	return b && !exact_mode(pr) && pr->routable &&
	       (b->self_cached || (b->ram_cache && !b->can_save));
}

/* The server reused more of the prompt than the slot could lend (what it
 * matched, and past a whole match the last answer's tokens): it loaded a
 * state of its RAM cache into the slot. Said once per backend. */
static void note_ram_load(struct proxy_req *pr, const struct router_slot *s)
{
	struct router_backend *b = s->backend;
	size_t could = pr->choice.matched;
	if (could && could >= s->n_tokens)
		could = s->n_tokens + s->generated + 1;
	/* A few tokens more (a BOS, a header toki did not count) are no load. */
	if (b->ram_cache || pr->cache_n <= (long long)could + 32)
		return;
	b->ram_cache = 1;
	log_info("backend %s loaded a state from its RAM cache into slot %d (it reused %lld "
	         "tokens, the slot could lend %zu): it has --cache-ram on. %s",
	         b->url, s->id, pr->cache_n, could,
	         b->can_save ? "toki keeps choosing slots: its slot files do more"
	                     : "Without slot files toki lets it pick slots from now on (fast "
	                       "mode), as it does alone; --slot-save-path and --slot-dir would "
	                       "let toki do better");
}

/* The slot's KV now holds what this request sent, if the backend's own count
 * agrees with ours; otherwise what it holds is unknown. */
static void commit_slot(struct proxy_req *pr, int success)
{
	struct daemon *d = pr->d;
	struct router_slot *s = pr->slot;
	if (!s)
		return;
	int64_t now = clock_now_us();
	if (success && pr->timings_seen && pr->routable) {
		long long n_server = pr->cache_n + pr->prompt_n;
		if (n_server == (long long)pr->n_tokens && exact_mode(pr)) {
			/* The plan ran as checked step by step: every row of the
			 * prompt is on the request's schedule. */
			router_slot_commit_sched(d->router, s, pr->tokens, pr->n_tokens, pr->bounds,
			                         pr->n_bounds, pr->n_tokens, now);
			if ((size_t)pr->cache_n != pr->plan.final_cache)
				log_warn("exact mode: backend reused %lld tokens, expected %zu",
				         pr->cache_n, pr->plan.final_cache);
		} else if (server_picks_slot(pr)) {
			/* The server picked its own slot: nothing here to know. */
			router_slot_forget(d->router, s);
		} else if (n_server == (long long)pr->n_tokens) {
			note_ram_load(pr, s);
			if (pr->cache_n < (long long)pr->choice.reuse && pr->backend)
				/* The slot held less than toki knew: emptied by the
				 * server itself? (backend.c, self_cleared) */
				backend_check_slots_now(pr->backend);
			else if (pr->backend)
				backend_answer_ended(pr->backend);
			router_slot_commit(d->router, s, pr->tokens, pr->n_tokens,
			                   (size_t)pr->cache_n, now);
			s->generated = pr->predicted_n > 0 ? (size_t)pr->predicted_n : 0;
		} else {
			log_warn("slot %d: backend counted %lld prompt tokens, toki %zu; "
			         "forgetting slot",
			         s->id, n_server, pr->n_tokens);
			router_slot_forget(d->router, s);
		}
		router_backend_note_prefill(s->backend, (uint64_t)req_evaluated(pr),
		                            pr->steps_prompt_ms + pr->prompt_ms);
		router_backend_note_decode(s->backend, (uint64_t)pr->predicted_n, pr->predicted_ms);
		s->backend->cached_tokens += (uint64_t)req_cached(pr);
		s->backend->requests++;
		d->stats.cached_tokens += (uint64_t)req_cached(pr);
	} else {
		router_slot_forget(d->router, s);
	}
	/* Steps before the last evaluated tokens whatever became of it. */
	if (!pr->counted) {
		s->backend->evaluated_tokens += (uint64_t)req_evaluated(pr);
		d->stats.evaluated_tokens += (uint64_t)req_evaluated(pr);
		pr->counted = 1;
	}
	if (exact_mode(pr) && success && s->n_tokens && !s->retired && pr->backend &&
	    backend_is_up(pr->backend) && start_tail_cut(pr))
		return; /* the cut ends the slot */
	end_slot(pr);
}

static void pr_free(struct proxy_req *pr)
{
	free(pr->bounds);
	plan_free(&pr->plan);
	json_decref(pr->body);
	json_decref(pr->template_body);
	free(pr->client_model);
	anthropic_stream_free(pr->astream);
	free(pr->tokens);
	sse_parser_free(&pr->sse);
	free(pr->held);
	if (pr->errbuf)
		evbuffer_free(pr->errbuf);
	if (pr->keepalive)
		event_free(pr->keepalive);
	if (pr->begin_timer)
		event_free(pr->begin_timer);
	if (pr->replan_ev)
		event_free(pr->replan_ev);
	if (pr->idle_ev)
		event_free(pr->idle_ev);
	free(pr);
}

static void pr_finish(struct proxy_req *pr)
{
	if (pr->call) {
		backend_call_cancel(pr->call);
		pr->call = NULL;
	}
	unpin_restore(pr);
	if (pr->slot)
		commit_slot(pr, 0);
	wait_remove(pr);
	active_remove(pr);
	if (pr->client) {
		/* Not answered yet (should not happen): answer rather than hang. */
		http_request_on_close(pr->client, NULL, NULL);
		http_respond_error(pr->client, 500, "request ended without an answer");
		pr->client = NULL;
	}
	pr->state = PS_DONE;
	/* A slot save still out holds a pointer to pr: it frees pr when done. */
	if (!pr->saving)
		pr_free(pr);
}

static int end_slot_when_idle(struct proxy_req *pr);

/* A request cancelled on its slot leaves there what llama-server really
 * holds: the prompt up to where its evaluation got (the whole prompt once
 * a token came; in exact mode the last chunk end reached, whose rows are on
 * the schedule; in fast mode at least what it reused). Exact mode then
 * cuts the slot to that, which also waits for llama-server to stop the
 * cancelled task before the backend takes another request. Returns 1 when
 * the cut finishes the request. */
static int keep_after_cancel(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	struct router_slot *s = pr->slot;
	if (!s || !pr->routable || s->retired || pr->replanning ||
	    (pr->state != PS_TRIM && pr->state != PS_PREFILL && pr->state != PS_FORWARD))
		return 0;
	if (exact_mode(pr) && pr->state == PS_PREFILL && pr->call) {
		/* A prefill step is at most a batch of llama-server's, which it
		 * would finish before stopping anyway: let it end, and keep its
		 * rows, which are on the schedule (on_prefill_done). */
		pr->abandoned = 1;
		pr->abandoned_at = pr->done_upto;
		return 1;
	}
	if (pr->call) {
		/* The backend sees its connection close and stops. */
		backend_call_cancel(pr->call);
		pr->call = NULL;
	}
	int64_t now = clock_now_us();
	int whole = pr->state == PS_FORWARD && pr->gen_started;
	size_t n = pr->n_tokens;
	if (!exact_mode(pr)) {
		size_t got = whole                            ? n
		             : pr->plan.reuse > pr->done_upto ? pr->plan.reuse
		                                              : pr->done_upto;
		router_slot_commit(d->router, s, pr->tokens, got,
		                   got < pr->plan.reuse ? got : pr->plan.reuse, now);
		log_info("slot %d keeps %zu tokens of the cancelled request", s->id, got);
		end_slot(pr);
		return 0;
	}
	/* A cut in flight may or may not have run: the reused part is there
	 * either way. */
	size_t got = whole ? n : pr->state == PS_TRIM ? pr->plan.reuse : pr->done_upto;
	router_slot_commit_sched(d->router, s, pr->tokens, got, pr->bounds, pr->n_bounds, got, now);
	log_info("slot %d keeps %zu tokens of the cancelled request", s->id, got);
	if (end_slot_when_idle(pr))
		return 1;
	router_slot_forget(d->router, s);
	return 0;
}

static void on_client_close(struct http_request *req, void *arg)
{
	struct proxy_req *pr = arg;
	pr->client = NULL;
	log_info("%s: client went away; cancelling its backend request", pr->client_path);
	if (!keep_after_cancel(pr))
		pr_finish(pr);
}

/* ---- streaming from the backend ---- */

static void flush_held(struct proxy_req *pr, int with_cache)
{
	if (!pr->held)
		return;
	char *out = NULL;
	size_t out_len = 0;
	if (with_cache)
		out = inject_cache(pr, pr->held, pr->held_len, &out_len);
	if (out) {
		client_write(pr, out, out_len);
		free(out);
	} else {
		client_write(pr, pr->held, pr->held_len);
	}
	free(pr->held);
	pr->held = NULL;
	pr->held_len = 0;
}

/* When toki's max_output (the model's output policy) cut the answer below
 * what the client asked for, an Anthropic client is told the turn ended:
 * "max_tokens" would claim its own limit was hit, and Claude Code treats
 * that as an error. The cache block still says max_tokens_clamped. */
static void end_turn_at_model_cap(struct proxy_req *pr, json_t *chat)
{
	if (!pr->output_clamped)
		return;
	size_t i;
	json_t *ch;
	json_array_foreach(json_object_get(chat, "choices"), i, ch)
	{
		const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
		if (fr && !strcmp(fr, "length"))
			json_object_set_new(ch, "finish_reason", json_string("stop"));
	}
}

/* ANTHROPIC: each chat chunk becomes Anthropic events; [DONE] ends the
 * message with the cache block on message_stop. */
static void on_chat_chunk_for_anthropic(struct proxy_req *pr, const char *data, size_t dl)
{
	struct strbuf b;
	strbuf_init(&b);
	if (!strcmp(data, "[DONE]")) {
		json_t *c = cache_block(pr);
		anthropic_stream_finish(pr->astream, c, &b);
		json_decref(c);
		pr->done_sent = 1;
	} else {
		json_error_t jerr;
		json_t *chunk = json_loadb(data, dl, BACKEND_JSON, &jerr);
		if (chunk) {
			note_timings(pr, chunk);
			end_turn_at_model_cap(pr, chunk);
			anthropic_stream_feed(pr->astream, chunk, &b);
			json_decref(chunk);
		}
	}
	client_write_strbuf(pr, &b);
	strbuf_free(&b);
}

static void schedule_replan(struct proxy_req *pr, const char *why);

/* The first progress event tells what the server is about to do: how many
 * prompt tokens it has (toki's count must agree) and how many it reuses
 * (exact mode: exactly the reuse toki planned, or the text may differ from
 * an uncached run). It comes before any token is generated, so a wrong plan
 * can still be replaced before the client sees any of its answer. Returns 1
 * when a replan was scheduled. */
static int check_plan(struct proxy_req *pr, long long total, long long cache)
{
	if (!pr->routable || pr->replans >= 2)
		return 0;
	int exact = exact_mode(pr);
	char why[200];
	if (total != (long long)pr->n_tokens) {
		snprintf(why, sizeof why, "the server has %lld prompt tokens, toki %zu", total,
		         pr->n_tokens);
		if (pr->local_prompt && pr->prompt_backend)
			prompt_engine_disable(pr->prompt_backend, PROMPT_FAULT_ALL, why);
		pr->prompt_fault = 1;
		if (exact) {
			schedule_replan(pr, why);
			return 1;
		}
		return 0;
	}
	if (exact && cache != (long long)pr->plan.final_cache) {
		snprintf(why, sizeof why,
		         "exact mode planned to reuse %zu tokens, the server reuses %lld",
		         pr->plan.final_cache, cache);
		pr->force_cold = 1; /* a slot that surprised once is not trusted again */
		schedule_replan(pr, why);
		return 1;
	}
	return 0;
}

static void on_sse_event(const char *raw, size_t len, void *arg)
{
	struct proxy_req *pr = arg;
	if (pr->replanning)
		return; /* the rest of an answer being replaced */
	size_t dl = 0;
	char *data = sse_event_data(raw, len, &dl);
	if (data && strstr(data, "\"prompt_progress\"")) {
		json_error_t jerr;
		json_t *obj = json_loadb(data, dl, BACKEND_JSON, &jerr);
		json_t *pp = json_object_get(obj, "prompt_progress");
		int replanned = 0;
		long long total = json_integer_value(json_object_get(pp, "total"));
		long long cache = json_integer_value(json_object_get(pp, "cache"));
		if (!pr->progress_checked && json_is_object(pp)) {
			pr->progress_checked = 1;
			replanned = check_plan(pr, total, cache);
		}
		/* "processed" counts the reused tokens too. */
		if (!replanned && json_is_object(pp) &&
		    json_integer_value(json_object_get(pp, "processed")) >= total)
			pr->gen_started = 1; /* the whole prompt is in the slot */
		if (!replanned && !pr->added_progress && pr->steps && json_is_object(pp) &&
		    !pr->astream) {
			/* The client asked for progress: after earlier steps, the last
			 * one's events describe the whole request (what it reused
			 * before it, the time its chunks took). */
			json_object_set_new(pp, "cache", json_integer(req_cached(pr)));
			json_object_set_new(
			    pp, "time_ms",
			    json_real(json_number_value(json_object_get(pp, "time_ms")) +
			              pr->steps_prompt_ms));
			char *js = json_dumps(obj, JSON_COMPACT);
			if (js) {
				if (!pr->t_first_data_us)
					pr->t_first_data_us = clock_now_us();
				client_write(pr, "data: ", 6);
				client_write(pr, js, strlen(js));
				client_write(pr, "\n\n", 2);
				free(js);
				json_decref(obj);
				free(data);
				return;
			}
		}
		json_decref(obj);
		if (replanned || pr->added_progress) {
			free(data);
			return;
		}
	}
	if (!pr->t_first_data_us)
		pr->t_first_data_us = clock_now_us();
	if (!data || !strstr(data, "\"prompt_progress\""))
		pr->gen_started = 1; /* an answer's first event follows its prompt */
	if (pr->astream) {
		if (data)
			on_chat_chunk_for_anthropic(pr, data, dl);
		free(data);
		return;
	}
	if (data && !strcmp(data, "[DONE]")) {
		flush_held(pr, 1);
		client_write(pr, raw, len);
		pr->done_sent = 1;
	} else if (data && strstr(data, "\"timings\"")) {
		/* llama-server puts timings in its final chunk: hold it back, the
		 * cache block goes there. */
		json_error_t jerr;
		json_t *obj = json_loadb(data, dl, BACKEND_JSON, &jerr);
		if (obj)
			note_timings(pr, obj);
		json_decref(obj);
		flush_held(pr, 0);
		pr->held = malloc(len);
		if (pr->held) {
			memcpy(pr->held, raw, len);
			pr->held_len = len;
		}
	} else {
		flush_held(pr, 0);
		client_write(pr, raw, len);
	}
	free(data);
}

static void keepalive_tick(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_req *pr = arg;
	int64_t now = clock_now_us();
	if (pr->client && now - pr->t_last_write_us >= (int64_t)pr->d->cfg.keepalive_ms * 1000) {
		if (pr->astream) {
			const char *ping = anthropic_ping_event();
			client_write(pr, ping, strlen(ping));
		} else {
			client_write(pr, ": keep-alive\n\n", 14);
		}
	}
}

static void on_forward_head(struct backend_call *call, int status, void *arg)
{
	struct proxy_req *pr = arg;
	pr->status = status;
	pr->t_first_byte_us = clock_now_us();
	if (status == 200)
		begin_client_stream(pr);
}

static void on_forward_data(struct backend_call *call, const char *data, size_t len, void *arg)
{
	struct proxy_req *pr = arg;
	if (pr->status != 200) {
		if (!pr->errbuf)
			pr->errbuf = evbuffer_new();
		if (pr->errbuf)
			evbuffer_add(pr->errbuf, data, len);
		return;
	}
	if (sse_parser_feed(&pr->sse, data, len, on_sse_event, pr) != 0) {
		pr->call = NULL;
		backend_call_cancel(call);
		fail(pr, 502, "backend sent an oversized or broken event stream");
	}
}

static void log_done(struct proxy_req *pr)
{
	double total_ms = (double)(clock_now_us() - pr->t_start_us) / 1000.0;
	log_info("%s slot=%d route=%s prompt=%zu matched=%zu reuse=%zu cached=%lld evaluated=%lld "
	         "steps=%d prefill=%.0fms total=%.0fms",
	         pr->client_path, pr->choice.slot ? pr->choice.slot->id : -1,
	         pr->routable ? pr->choice.kind : "unrouted", pr->n_tokens, pr->choice.matched,
	         pr->choice.reuse, req_cached(pr), req_evaluated(pr), pr->steps + 1,
	         pr->steps_prompt_ms + pr->prompt_ms, total_ms);
}

/* Plans the request again, from routing (or, when toki's own prompt was the
 * fault, from the server's template and tokenizer), on the next turn of the
 * loop: it runs from inside the old answer's callbacks. What the failed
 * plan did to its slot is unknown, so the slot is forgotten. */
static void replan_now(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_req *pr = arg;
	struct daemon *d = pr->d;
	pr->replanning = 0;
	if (!pr->client) {
		pr_finish(pr);
		return;
	}
	if (pr->local_prompt && pr->prompt_fault) {
		free(pr->tokens);
		pr->tokens = NULL;
		pr->n_tokens = 0;
		free(pr->bounds);
		pr->bounds = NULL;
		pr->n_bounds = 0;
		pr->routable = 0;
		pr->local_prompt = 0;
		pr->local_template = 0;
		pr->force_server = 1;
	}
	json_object_del(pr->body, "id_slot");
	if (pr->set_cache_prompt)
		json_object_del(pr->body, "cache_prompt");
	pr->set_cache_prompt = 0;
	if (pr->added_progress)
		json_object_del(pr->body, "return_progress");
	pr->added_progress = 0;
	pr->progress_checked = 0;
	free(pr->held);
	pr->held = NULL;
	pr->held_len = 0;
	pr->timings_seen = 0;
	pr->t_first_data_us = 0;
	pr->restored = 0;
	memset(&pr->choice, 0, sizeof pr->choice);
	if (pr->routable) {
		pr->state = PS_TOKENIZE; /* routed again with the same tokens */
		pr_try_route(pr);
	} else {
		struct backend *b = any_allowed_backend(pr);
		if (!b) {
			pr->needs_begin = 1;
			wait_add(pr);
			return;
		}
		pr_begin(pr, b);
	}
	(void)d;
}

static void schedule_replan(struct proxy_req *pr, const char *why)
{
	struct daemon *d = pr->d;
	log_warn("slot %d: %s; planning the request again%s", pr->slot ? pr->slot->id : -1, why,
	         pr->local_prompt ? " with the server's prompt" : "");
	pr->replans++;
	pr->replanning = 1;
	d->stats.replans++;
	if (pr->call) {
		backend_call_cancel(pr->call);
		pr->call = NULL;
	}
	if (pr->slot) {
		unpin_restore(pr);
		router_slot_forget(d->router, pr->slot);
		router_slot_end(d->router, pr->slot, clock_now_us());
		pr->slot = NULL;
		daemon_slots_changed(d);
	}
	if (!pr->replan_ev)
		pr->replan_ev = evtimer_new(d->base, replan_now, pr);
	struct timeval now = {0, 0};
	if (!pr->replan_ev || evtimer_add(pr->replan_ev, &now) != 0) {
		pr->replanning = 0;
		fail(pr, 500, "out of memory");
	}
}

/* A request whose prompt toki made is, now and then, made by the server too
 * (off the request's path) and compared. */
static void audit_prompt(struct proxy_req *pr)
{
	if (!pr->local_prompt || !pr->prompt_backend)
		return;
	int chat = pr->kind != KIND_COMPLETION;
	prompt_audit_start(pr->prompt_backend, pr->template_body ? pr->template_body : pr->body,
	                   chat, pr->tokens, pr->n_tokens);
}

/* A whole answer was sent (or could not be): the slot's new content, the
 * log line, perhaps an audit of toki's prompt. */
static void after_answer(struct proxy_req *pr, int status)
{
	if (status == 200)
		audit_prompt(pr);
	commit_slot(pr, status == 200 && pr->timings_seen);
	log_done(pr);
	/* A cut of the slot's tail may still run: it finishes the request. */
	if (pr->state != PS_TAILCUT)
		pr_finish(pr);
}

static void on_forward_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	pr->status = status;
	if (pr->stream) {
		if (status != 200) {
			/* The backend refused the request: pass its message on. */
			size_t el = pr->errbuf ? evbuffer_get_length(pr->errbuf) : 0;
			char *msg =
			    el ? strndup((const char *)evbuffer_pullup(pr->errbuf, -1), el) : NULL;
			json_error_t jerr;
			json_t *ej = msg ? json_loads(msg, 0, &jerr) : NULL;
			const char *m = json_string_value(
			    json_object_get(json_object_get(ej, "error"), "message"));
			fail(pr, status, m ? m : "backend error");
			json_decref(ej);
			free(msg);
			return;
		}
		if (!pr->done_sent && pr->astream)
			on_chat_chunk_for_anthropic(pr, "[DONE]", 6);
		else if (!pr->done_sent)
			flush_held(pr, 1);
		if (pr->local_prompt && pr->timings_seen && pr->routable &&
		    pr->cache_n + pr->prompt_n != (long long)pr->n_tokens && pr->prompt_backend) {
			char why[160];
			snprintf(why, sizeof why, "the server counted %lld prompt tokens, toki %zu",
			         pr->cache_n + pr->prompt_n, pr->n_tokens);
			prompt_engine_disable(pr->prompt_backend, PROMPT_FAULT_ALL, why);
		}
		if (pr->client) {
			http_stream_end(pr->client);
			pr->client = NULL;
		}
		after_answer(pr, pr->timings_seen ? 200 : 0);
		return;
	}
	json_error_t jerr;
	if (status == 200)
		note_timings_in_body(pr, body, len);
	if (status == 200 && pr->timings_seen && pr->routable && pr->client) {
		/* The same checks as a stream's first progress event, after the
		 * fact: a wrong exact-mode plan is thrown away and done again. */
		long long n_server = pr->cache_n + pr->prompt_n;
		if (check_plan(pr, n_server, pr->cache_n))
			return;
		if (pr->local_prompt && n_server != (long long)pr->n_tokens && pr->prompt_backend) {
			char why[160];
			snprintf(why, sizeof why, "the server counted %lld prompt tokens, toki %zu",
			         n_server, pr->n_tokens);
			prompt_engine_disable(pr->prompt_backend, PROMPT_FAULT_ALL, why);
		}
	}
	/* The answer goes first; the bookkeeping after it (the slot's new
	 * content, the log line, an audit) is not the client's wait. */
	if (pr->client && pr->kind == KIND_ANTHROPIC) {
		json_t *chat = status == 200 ? json_loadb(body, len, BACKEND_JSON, &jerr) : NULL;
		if (chat)
			end_turn_at_model_cap(pr, chat);
		/* Anthropic's usage splits the prompt: read from the cache, and
		 * the rest (a cut's throw-away token is no part of the input). */
		json_t *msg = chat ? anthropic_from_chat(chat, pr->client_model, req_cached(pr),
		                                         pr->routable ? (long long)pr->n_tokens -
		                                                            req_cached(pr)
		                                                      : req_evaluated(pr))
		                   : NULL;
		json_decref(chat);
		http_request_on_close(pr->client, NULL, NULL);
		if (msg) {
			json_object_set_new(msg, "cache", cache_block(pr));
			respond_json(pr->client, 200, msg);
			json_decref(msg);
		} else {
			json_t *ej = json_loadb(body, len, 0, &jerr);
			const char *m = json_string_value(
			    json_object_get(json_object_get(ej, "error"), "message"));
			http_respond_error(pr->client, status == 200 ? 502 : status,
			                   m ? m : "the backend's answer could not be translated");
			json_decref(ej);
		}
		pr->client = NULL;
		after_answer(pr, status);
		return;
	}
	if (pr->client) {
		size_t out_len = 0;
		char *out = status == 200 ? inject_cache(pr, body, len, &out_len) : NULL;
		const char *ct = backend_call_header(call, "Content-Type");
		http_request_on_close(pr->client, NULL, NULL);
		http_respond(pr->client, status, ct ? ct : "application/json", out ? out : body,
		             out ? out_len : len);
		free(out);
		pr->client = NULL;
	}
	after_answer(pr, status);
}

/* A backend failed before any of its answer reached the client: the request
 * goes to another backend serving the model, if there is one. Returns 1 when
 * it was re-routed. The backend's response head does not count (llama-server
 * sends it before the prompt is even queued); its first body bytes do, and a
 * non-streamed body reaches the client only when complete. */
static int try_elsewhere(struct proxy_req *pr, enum backend_error err)
{
	struct daemon *d = pr->d;
	if (pr->t_first_data_us || err == BACKEND_ERR_TIMEOUT || !pr->backend ||
	    pr->retries >= d->n_backends || d->shutting_down)
		return 0;
	int index = pr->backend->rb->index;
	uint64_t excluded = pr->excluded | (index < 64 ? (uint64_t)1 << index : 0);
	int other = 0;
	for (int i = 0; i < d->n_backends; i++)
		if (i != index && (i >= 64 || ((pr->allowed & ~excluded) >> i) & 1) &&
		    backend_is_up(d->backends[i]))
			other = 1;
	if (!other)
		return 0;
	/* Whatever the failed backend did to the slot is unknown now. */
	if (pr->slot) {
		unpin_restore(pr);
		router_slot_forget(d->router, pr->slot);
		router_slot_end(d->router, pr->slot, clock_now_us());
		pr->slot = NULL;
	}
	backend_mark_down(pr->backend, backend_error_text(err));
	pr->excluded = excluded;
	pr->retries++;
	log_warn("request on %s failed before streaming (%s): retrying on another backend",
	         pr->backend->rb->url, backend_error_text(err));
	pr->restored = 0;
	if (pr->routable)
		json_object_del(pr->body, "id_slot");
	if (pr->set_cache_prompt)
		json_object_del(pr->body, "cache_prompt");
	pr->set_cache_prompt = 0;
	pr->state = PS_TOKENIZE; /* routed again right now (or queued) */
	pr_try_route(pr);
	return 1;
}

static void on_forward_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	if (try_elsewhere(pr, err))
		return;
	if (err == BACKEND_ERR_CONNECT && pr->backend)
		backend_mark_down(pr->backend, backend_error_text(err));
	log_warn("request on %s failed: %s", pr->backend ? pr->backend->rb->url : "?",
	         backend_error_text(err));
	fail(pr, err == BACKEND_ERR_TIMEOUT ? 504 : 502, backend_error_text(err));
}

static const struct backend_call_handlers forward_stream_handlers = {
    .on_head = on_forward_head,
    .on_data = on_forward_data,
    .on_done = on_forward_done,
    .on_error = on_forward_error,
};
static const struct backend_call_handlers forward_handlers = {
    .on_head = on_forward_head,
    .on_done = on_forward_done,
    .on_error = on_forward_error,
};

static void forward(struct proxy_req *pr)
{
	pr->state = PS_FORWARD;
	if (server_picks_slot(pr)) {
		json_object_del(pr->body, "id_slot");
	} else if (pr->slot) {
		json_object_set_new(pr->body, "id_slot", json_integer(pr->slot->id));
		/* Exact mode: with nothing evaluated or reused yet, the server
		 * starts from position 0, as an uncached run does, whatever the
		 * slot holds; after the earlier chunks it must reuse them (even
		 * for a client that asked for an uncached run: they were its
		 * uncached run). */
		if (pr->routable && exact_mode(pr)) {
			json_object_set_new(pr->body, "cache_prompt",
			                    json_boolean(pr->done_upto > 0));
			pr->set_cache_prompt = 1;
		}
	}
	/* The first progress event lets toki check its plan before the answer
	 * starts (check_plan); events the client did not ask for are dropped. */
	if (pr->stream && pr->routable && pr->kind != KIND_RESPONSES &&
	    (pr->local_prompt || exact_mode(pr)) && !json_object_get(pr->body, "return_progress")) {
		json_object_set_new(pr->body, "return_progress", json_true());
		pr->added_progress = 1;
	}
	pr->progress_checked = 0;
	char *body = json_dumps(pr->body, JSON_COMPACT);
	if (!body) {
		fail(pr, 500, "out of memory");
		return;
	}
	pr->t_forward_us = clock_now_us();
	if (pr->stream) {
		/* Each attempt parses its backend's stream from the start. */
		sse_parser_free(&pr->sse);
		sse_parser_init(&pr->sse, 64 * 1024 * 1024);
	}
	arm_client_stream(pr);
	/* Every request gets one line when it ends (log_done); this one, as it
	 * starts, only when its prefill will be long enough to wait for. */
	if (pr->routable)
		log_write(pr->choice.est_prefill_s >= 1.0 ? LOG_INFO : LOG_DEBUG,
		          "%s slot=%d route=%s prompt=%zu matched=%zu reuse=%zu est_prefill=%.0fms",
		          pr->client_path, pr->slot ? pr->slot->id : -1, pr->choice.kind,
		          pr->n_tokens, pr->choice.matched, pr->choice.reuse,
		          pr->choice.est_prefill_s * 1000.0);
	pr->call =
	    backend_call_start(pr->backend->http, "POST", pr->backend_path, body, strlen(body),
	                       pr->stream ? &forward_stream_handlers : &forward_handlers, pr);
	free(body);
	if (!pr->call)
		fail(pr, 500, "out of memory");
}

/* A streamed request's response begins when the backend starts its answer
 * (200), so that a refusal keeps its own status, as from llama-server
 * alone; or, when the backend takes longer (a long prefill, exact mode's
 * chunks, a restore or a save come first), after 250 ms: the client then
 * sees the route, then keep-alives (Anthropic pings), rather than silence,
 * and a later refusal comes as an error event. */
static void begin_timer_fired(evutil_socket_t fd, short what, void *arg)
{
	begin_client_stream(arg);
}

static void arm_client_stream(struct proxy_req *pr)
{
	if (!pr->stream || !pr->client || pr->stream_begun || pr->begin_timer)
		return;
	/* llama-server refuses a request as it takes it (milliseconds): a
	 * quarter second keeps those statuses and costs a waiting client
	 * nothing it would see. */
	int ms = pr->d->cfg.keepalive_ms / 2 < 250 ? pr->d->cfg.keepalive_ms / 2 : 250;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	pr->begin_timer = evtimer_new(pr->d->base, begin_timer_fired, pr);
	if (!pr->begin_timer || evtimer_add(pr->begin_timer, &tv) != 0)
		begin_client_stream(pr); /* out of memory: now, as before */
}

static void begin_client_stream(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	if (pr->stream && pr->client && !pr->stream_begun) {
		pr->stream_begun = 1;
		http_response_header(pr->client, "Cache-Control", "no-cache");
		http_stream_begin(pr->client, 200, "text/event-stream");
		/* The first event says how long the prefill should take, so that
		 * a slow turn is a number rather than a silence. */
		char note[256];
		int n =
		    snprintf(note, sizeof note,
		             ": toki route=%s slot=%d prompt=%zu reuse=%zu evaluate=%zu "
		             "est_prefill_ms=%.0f\n\n",
		             pr->routable ? pr->choice.kind : "unrouted",
		             pr->slot ? pr->slot->id : -1, pr->n_tokens, pr->choice.reuse,
		             pr->n_tokens - pr->choice.reuse, pr->choice.est_prefill_s * 1000.0);
		client_write(pr, note, (size_t)n);
		if (pr->kind == KIND_ANTHROPIC) {
			long long evaluate = (long long)(pr->n_tokens - pr->choice.reuse);
			pr->astream = anthropic_stream_new(pr->client_model, evaluate,
			                                   (long long)pr->choice.reuse);
			struct strbuf b;
			strbuf_init(&b);
			if (pr->astream)
				anthropic_stream_start(pr->astream, &b);
			client_write_strbuf(pr, &b);
			strbuf_free(&b);
		}
		pr->keepalive = event_new(d->base, -1, EV_PERSIST, keepalive_tick, pr);
		int ms = d->cfg.keepalive_ms > 100 ? d->cfg.keepalive_ms / 2 : 50;
		struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
		if (pr->keepalive)
			event_add(pr->keepalive, &tv);
	}
}

/* ---- the executor: a request's plan, one backend step at a time ----
 *
 * The router chose a slot and how much of its content to reuse; plan_build
 * (router/sched.h) made the steps: save the slot's content, restore a saved
 * state, cut the slot back, evaluate the prompt chunk by chunk, generate.
 * run_step starts the next one; each step's end runs the one after. Every
 * step that evaluates tokens is checked against the plan: what the server
 * reused must be what toki planned, or exact mode's rows would not be the
 * schedule's. */

static void run_step(struct proxy_req *pr);

/* The client went away while a prefill step ran (keep_after_cancel): the
 * steps it still ran have ended, so the slot is idle and holds the prompt
 * up to done_upto, on the schedule. */
static void keep_abandoned(struct proxy_req *pr)
{
	struct router_slot *s = pr->slot;
	router_slot_commit_sched(pr->d->router, s, pr->tokens, pr->done_upto, pr->bounds,
	                         pr->n_bounds, pr->done_upto, clock_now_us());
	log_info("slot %d keeps %zu tokens of the cancelled request", s->id, pr->done_upto);
	if (!pr->counted) {
		s->backend->evaluated_tokens += (uint64_t)req_evaluated(pr);
		pr->d->stats.evaluated_tokens += (uint64_t)req_evaluated(pr);
		pr->counted = 1;
	}
	end_slot(pr);
	pr_finish(pr);
}

/* A step found the slot holding something else than planned (llama-server
 * may load a state of its own RAM cache into it): the request is planned
 * again from an empty slot, which cannot go wrong that way. */
static void step_went_wrong(struct proxy_req *pr, const char *why)
{
	if (pr->abandoned) {
		/* Nobody waits for a replan: what the slot holds is unknown. */
		log_warn("cancelled request's step on slot %d: %s", pr->slot->id, why);
		pr_finish(pr);
		return;
	}
	pr->force_cold = 1;
	schedule_replan(pr, why);
}

/* The timings of a step's answer: how many prompt tokens the server reused
 * and evaluated, and in how many ms. 0, or -1 when there are none. */
static int step_timings(int status, const char *body, size_t len, long long *cache_n,
                        long long *prompt_n, double *ms)
{
	json_error_t jerr;
	json_t *o = status == 200 ? json_loadb(body, len, BACKEND_JSON, &jerr) : NULL;
	json_t *t = json_object_get(o, "timings");
	int rc = json_is_object(t) ? 0 : -1;
	*cache_n = json_integer_value(json_object_get(t, "cache_n"));
	*prompt_n = json_integer_value(json_object_get(t, "prompt_n"));
	*ms = json_number_value(json_object_get(t, "prompt_ms"));
	json_decref(o);
	return rc;
}

/* A /completion body that evaluates tokens[0..n) (then `junk`, when
 * with_junk) on the slot and generates nothing. Written as text: a long
 * prompt is resent for every chunk. */
static char *prefill_body(const token_t *tokens, size_t n, int with_junk, token_t junk, int slot,
                          int cache_prompt)
{
	struct strbuf b = {0};
	strbuf_append(&b, "{\"prompt\":[", 11);
	for (size_t i = 0; i < n + (with_junk ? 1 : 0); i++) {
		char num[24];
		int k = snprintf(num, sizeof num, "%s%d", i ? "," : "", i < n ? tokens[i] : junk);
		strbuf_append(&b, num, (size_t)k);
	}
	char tail[96];
	int k = snprintf(tail, sizeof tail, "],\"n_predict\":0,\"cache_prompt\":%s,\"id_slot\":%d}",
	                 cache_prompt ? "true" : "false", slot);
	strbuf_append(&b, tail, (size_t)k);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* The token a cut puts after the kept prefix: one the prompt does not have
 * there, so that the next step's common prefix with the slot ends exactly
 * at the cut. */
static token_t junk_after(const struct proxy_req *pr, size_t keep)
{
	token_t next = keep < pr->n_tokens ? pr->tokens[keep] : 0;
	return next > 0 ? next - 1 : next + 1;
}

/* Counts a step's evaluated tokens as the request's. */
static void note_step(struct proxy_req *pr, long long prompt_n, double ms)
{
	pr->steps++;
	pr->steps_prompt_n += prompt_n;
	pr->steps_prompt_ms += ms;
}

/* A step the backend refused (or answered with no timings): its status
 * and message reach the client, as the answer's own would. */
static void step_refused(struct proxy_req *pr, const char *what, int status, const char *body,
                         size_t len)
{
	json_error_t jerr;
	json_t *ej = json_loadb(body, len, 0, &jerr);
	const char *m = json_string_value(json_object_get(json_object_get(ej, "error"), "message"));
	char msg[300];
	snprintf(msg, sizeof msg, "%s", m ? m : what);
	json_decref(ej);
	log_warn("%s on slot %d failed (%d): %s", what, pr->slot->id, status, msg);
	fail(pr, status >= 400 ? status : 502, msg);
}

static void on_trim_done(struct backend_call *call, int status, const char *body, size_t len,
                         void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	long long cache_n, prompt_n;
	double ms;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) != 0) {
		step_refused(pr, "the backend refused to cut the slot back", status, body, len);
		return;
	}
	note_step(pr, prompt_n, ms);
	if ((size_t)cache_n != pr->cut_keep) {
		char why[160];
		snprintf(why, sizeof why, "a cut to %zu tokens kept %lld", pr->cut_keep, cache_n);
		step_went_wrong(pr, why);
		return;
	}
	router_slot_cut(pr->d->router, pr->slot, pr->tokens, pr->cut_keep, pr->cut_junk,
	                clock_now_us());
	pr->done_upto = pr->cut_keep;
	if (pr->cut_keep)
		pr->d->stats.trim_tokens++;
	run_step(pr);
}

static void on_step_error(struct backend_call *call, enum backend_error err, void *arg)
{
	on_forward_error(call, err, arg);
}

static const struct backend_call_handlers trim_handlers = {
    .on_done = on_trim_done,
    .on_error = on_step_error,
};

/* Sends a cut: the slot is left holding tokens[0..keep) and one token that
 * differs from the prompt's next, so that the server reuses exactly keep
 * tokens next (it reuses the longest common prefix). Returns 0, or -1 when
 * out of memory. */
static int send_cut(struct proxy_req *pr, size_t keep, const struct backend_call_handlers *h)
{
	pr->cut_keep = keep;
	pr->cut_junk = junk_after(pr, keep);
	char *body = prefill_body(pr->tokens, keep, 1, pr->cut_junk, pr->slot->id, 1);
	pr->call = body ? backend_call_start(pr->backend->http, "POST", "/completion", body,
	                                     strlen(body), h, pr)
	                : NULL;
	free(body);
	return pr->call ? 0 : -1;
}

static void trim(struct proxy_req *pr, size_t keep)
{
	pr->state = PS_TRIM;
	if (send_cut(pr, keep, &trim_handlers) != 0)
		fail(pr, 500, "out of memory");
}

static void on_prefill_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	long long cache_n, prompt_n;
	double ms;
	size_t upto = pr->plan.steps[pr->plan.next - 1].upto;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) != 0) {
		step_refused(pr, "the backend refused a prefill step", status, body, len);
		return;
	}
	note_step(pr, prompt_n, ms);
	if ((size_t)cache_n != pr->done_upto || (size_t)(cache_n + prompt_n) != upto) {
		char why[160];
		snprintf(why, sizeof why,
		         "a chunk to %zu reused %lld tokens and evaluated %lld, not %zu", upto,
		         cache_n, prompt_n, pr->done_upto);
		step_went_wrong(pr, why);
		return;
	}
	pr->done_upto = upto;
	pr->d->stats.prefill_steps++;
	if (pr->abandoned) {
		/* llama-server alone would have run on to the end of the batch
		 * it was in (up to one max step from where the step in flight
		 * began): so do the steps that fit there, no more. */
		const struct plan_step *next = &pr->plan.steps[pr->plan.next];
		if (pr->plan.next < pr->plan.n && next->kind == STEP_PREFILL &&
		    next->upto - pr->abandoned_at <= sched_max_step(pr->slot->backend->n_ubatch)) {
			run_step(pr);
			return;
		}
		keep_abandoned(pr);
		return;
	}
	run_step(pr);
}

static const struct backend_call_handlers prefill_handlers = {
    .on_done = on_prefill_done,
    .on_error = on_step_error,
};

/* Evaluates the prompt up to a chunk end. The first evaluation of a
 * request that reuses nothing starts from an empty slot (cache_prompt
 * false), as an uncached run does. */
static void prefill(struct proxy_req *pr, size_t upto)
{
	pr->state = PS_PREFILL;
	char *body = prefill_body(pr->tokens, upto, 0, 0, pr->slot->id, pr->done_upto > 0);
	pr->call = body ? backend_call_start(pr->backend->http, "POST", "/completion", body,
	                                     strlen(body), &prefill_handlers, pr)
	                : NULL;
	free(body);
	if (!pr->call)
		fail(pr, 500, "out of memory");
}

/* ---- slot files: save before evicting, restore instead of recomputing ---- */

static void unpin_restore(struct proxy_req *pr)
{
	if (pr->choice.restore) {
		pr->choice.restore->pinned--;
		pr->choice.restore = NULL;
	}
}

static json_t *load_object(int status, const char *body, size_t len)
{
	json_error_t jerr;
	json_t *o = status == 200 ? json_loadb(body, len, 0, &jerr) : NULL;
	if (o && !json_is_object(o)) {
		json_decref(o);
		o = NULL;
	}
	return o;
}

/* The restore failed or the file is damaged: forget the slot, whose content
 * is unknown now, and evaluate the whole prompt instead. */
static void restore_instead_recompute(struct proxy_req *pr)
{
	router_slot_forget(pr->d->router, pr->slot);
	pr->choice.reuse = 0;
	pr->choice.matched = 0;
	pr->choice.must_trim = 0;
	pr->choice.kind = "miss";
	pr->done_upto = 0;
	plan_free(&pr->plan);
	if (plan_build(&pr->plan, pr->bounds, pr->n_bounds, pr->n_tokens, 0, 0, 0, 0,
	               sched_max_step(pr->slot->backend->n_ubatch),
	               pr->slot->backend->n_ubatch) != 0) {
		fail(pr, 500, "out of memory");
		return;
	}
	run_step(pr);
}

static void on_restore_done(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct proxy_req *pr = arg;
	struct daemon *d = pr->d;
	struct router_saved *e = pr->choice.restore;
	pr->call = NULL;
	slot_store_restored(d, e);
	json_t *o = load_object(status, body, len);
	long long n_read = json_integer_value(json_object_get(o, "n_read"));
	double ms = json_number_value(json_object_get(json_object_get(o, "timings"), "restore_ms"));
	json_decref(o);
	if (!o) {
		int shown = (int)(len > 200 ? 200 : len);
		if (e->backend != pr->slot->backend) {
			/* Another backend's state: the file may well be sound, and
			 * this server not reading the folder its writer does. */
			log_warn(
			    "restore of %s (saved by %s) into slot %d of %s failed (%d): %.*s; "
			    "is --slot-dir this backend's --slot-save-path? Only its own "
			    "states are restored there from now on",
			    e->name, e->backend->url, pr->slot->id, pr->slot->backend->url, status,
			    shown, body);
			pr->slot->backend->foreign_restore_failed = 1;
			unpin_restore(pr);
		} else {
			/* The file is gone or refused: forget it, and the slot. */
			log_warn("restore of %s into slot %d failed (%d): %.*s", e->name,
			         pr->slot->id, status, shown, body);
			unpin_restore(pr);
			daemon_saved_delete(d, e);
		}
		restore_instead_recompute(pr);
		return;
	}
	router_backend_note_restore(pr->slot->backend, (uint64_t)n_read, ms);
	router_slot_restored(d->router, pr->slot, e, clock_now_us());
	d->stats.restores++;
	d->stats.disk_hits++;
	log_info("restored %s (%zu tokens, %lld bytes, %.1f ms) into slot %d%s%s", e->name,
	         e->n_tokens, n_read, ms, pr->slot->id,
	         e->backend != pr->slot->backend ? " of " : "",
	         e->backend != pr->slot->backend ? pr->slot->backend->url : "");
	snprintf(pr->restored_name, sizeof pr->restored_name, "%s", e->name);
	unpin_restore(pr);
	pr->restored = 1;
	/* A save may have gone over the cap while this state was pinned. */
	daemon_saved_enforce_budget(d);
	run_step(pr);
}

static const struct backend_call_handlers restore_handlers = {
    .on_done = on_restore_done,
    .on_error = on_step_error,
};

static void restore_slot(struct proxy_req *pr)
{
	struct router_saved *e = pr->choice.restore;
	if (!e) {
		run_step(pr);
		return;
	}
	pr->state = PS_RESTORE;
	if (slot_store_verify(pr->d, e) != 0) {
		/* Deleted as damaged: recompute instead. */
		pr->choice.restore = NULL;
		restore_instead_recompute(pr);
		return;
	}
	char path[64];
	snprintf(path, sizeof path, "/slots/%d?action=restore", pr->slot->id);
	char filename[128];
	snprintf(filename, sizeof filename, "%s.bin", e->name);
	json_t *req = json_pack("{s:s}", "filename", filename);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	pr->call = body ? backend_call_start(pr->backend->http, "POST", path, body, strlen(body),
	                                     &restore_handlers, pr)
	                : NULL;
	free(body);
	if (!pr->call)
		fail(pr, 500, "out of memory");
}

static void on_slot_saved(struct router_saved *e, void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	pr->saving = 0;
	if (!pr->client && pr->state == PS_DONE) {
		pr_free(pr);
		return;
	}
	run_step(pr);
}

static void save_slot(struct proxy_req *pr)
{
	pr->state = PS_SAVE;
	pr->saving = 1;
	if (slot_store_save(pr->d, pr->backend, pr->slot, on_slot_saved, pr) != 0) {
		pr->saving = 0;
		run_step(pr);
	}
}

static void run_step(struct proxy_req *pr)
{
	if (pr->plan.next >= pr->plan.n) {
		fail(pr, 500, "the request's plan ended without an answer");
		return;
	}
	struct plan_step *st = &pr->plan.steps[pr->plan.next++];
	arm_client_stream(pr);
	switch (st->kind) {
	case STEP_SAVE:
		save_slot(pr);
		break;
	case STEP_RESTORE:
		restore_slot(pr);
		break;
	case STEP_CUT:
		trim(pr, st->upto);
		break;
	case STEP_PREFILL:
		prefill(pr, st->upto);
		break;
	case STEP_GENERATE:
		forward(pr);
		break;
	}
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
 * whole_request_counts. docs/exact.md says so; it may come back.) */
/* After the answer (or a cancel): the slot's content is unknown, it is
 * free, and the request is over. */
static void forget_and_finish(struct proxy_req *pr)
{
	router_slot_forget(pr->d->router, pr->slot);
	end_slot(pr);
	pr_finish(pr);
}

/* A call made after the answer failed: what the slot holds is unknown. */
static void on_after_answer_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	forget_and_finish(pr);
}

static void poll_idle(evutil_socket_t fd, short what, void *arg);

static void on_idle_poll_done(struct backend_call *call, int status, const char *body, size_t len,
                              void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	json_error_t jerr;
	json_t *a = status == 200 ? json_loadb(body, len, 0, &jerr) : NULL;
	int known = 0, busy = 0;
	size_t i;
	json_t *e;
	json_array_foreach(a, i, e)
	{
		if (json_integer_value(json_object_get(e, "id")) == pr->slot->id) {
			known = 1;
			busy = json_is_true(json_object_get(e, "is_processing"));
		}
	}
	json_decref(a);
	if (!known) {
		forget_and_finish(pr);
		return;
	}
	if (busy) {
		struct timeval tv = {0, 20000};
		if (!pr->idle_ev)
			pr->idle_ev = evtimer_new(pr->d->base, poll_idle, pr);
		if (pr->idle_ev && evtimer_add(pr->idle_ev, &tv) == 0)
			return;
		forget_and_finish(pr);
		return;
	}
	/* Stopped after its whole prompt: its tail goes, as after an answer. */
	if (start_tail_cut(pr))
		return;
	end_slot(pr);
	pr_finish(pr);
}

static const struct backend_call_handlers idle_poll_handlers = {
    .on_done = on_idle_poll_done,
    .on_error = on_after_answer_error,
};

static void poll_idle(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = backend_call_start(pr->backend->http, "GET", "/slots", NULL, 0,
	                              &idle_poll_handlers, pr);
	if (!pr->call) {
		forget_and_finish(pr);
	}
}

static int end_slot_when_idle(struct proxy_req *pr)
{
	pr->state = PS_SETTLE;
	pr->call = backend_call_start(pr->backend->http, "GET", "/slots", NULL, 0,
	                              &idle_poll_handlers, pr);
	return pr->call != NULL;
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

static void on_tail_cut_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct proxy_req *pr = arg;
	struct daemon *d = pr->d;
	pr->call = NULL;
	long long cache_n = -1, prompt_n = 0;
	double ms;
	if (step_timings(status, body, len, &cache_n, &prompt_n, &ms) == 0) {
		/* No request's cache block counts these: /toki/stats does. */
		pr->slot->backend->evaluated_tokens += (uint64_t)prompt_n;
		d->stats.evaluated_tokens += (uint64_t)prompt_n;
		d->stats.tail_cuts++;
		d->stats.tail_cut_tokens += (uint64_t)prompt_n;
	}
	if (cache_n == (long long)pr->cut_keep)
		router_slot_cut(d->router, pr->slot, pr->tokens, pr->cut_keep, pr->cut_junk,
		                clock_now_us());
	else
		router_slot_forget(d->router, pr->slot);
	end_slot(pr);
	pr_finish(pr);
}

static const struct backend_call_handlers tail_cut_handlers = {
    .on_done = on_tail_cut_done,
    .on_error = on_after_answer_error,
};

/* Returns 1 when the cut is out (it ends the slot and the request), 0 when
 * there is nothing to cut or it could not be sent. */
static int start_tail_cut(struct proxy_req *pr)
{
	struct router_slot *s = pr->slot;
	if (!pr->routable || s->n_tokens != pr->n_tokens || !pr->n_tokens)
		return 0;
	/* Where the micro-batch holding the prompt's last token starts. */
	size_t keep =
	    sched_floor(s->bounds, s->n_bounds, s->aligned, pr->n_tokens - 1, s->backend->n_ubatch);
	if (!keep || send_cut(pr, keep, &tail_cut_handlers) != 0)
		return 0;
	pr->state = PS_TAILCUT;
	return 1;
}

/* ---- the context every part agrees on ---- */

/* The prompt must fit the slot's context with room for at least one output
 * token, or the request is refused (llama-server would otherwise cut the
 * prompt silently). The output is capped by the space left and by the
 * model's max_output: a client asking for 32,000 tokens gets what fits. */
static int clamp_output(struct proxy_req *pr, int n_ctx_slot)
{
	if (n_ctx_slot <= 0)
		return 0;
	if (pr->n_tokens >= (size_t)n_ctx_slot) {
		/* In the shape each API's clients key on (Claude Code compacts the
		 * conversation on the Messages API's wording). */
		char *body =
		    api_context_error_body(pr->client_path, (long long)pr->n_tokens, n_ctx_slot);
		log_info("%s: 400: the prompt has %zu tokens, the context holds %d",
		         pr->client_path, pr->n_tokens, n_ctx_slot);
		if (!body) {
			fail(pr, 400, "the prompt does not fit the context");
			return -1;
		}
		pr->d->stats.errors++;
		if (pr->client) {
			http_request_on_close(pr->client, NULL, NULL);
			http_respond(pr->client, 400, "application/json", body, strlen(body));
			pr->client = NULL;
		}
		free(body);
		pr_finish(pr);
		return -1;
	}
	long space = n_ctx_slot - (long)pr->n_tokens;
	long cap = space;
	if (pr->d->cfg.max_output > 0 && pr->d->cfg.max_output < cap)
		cap = pr->d->cfg.max_output;
	const char *field = !strcmp(pr->backend_path, "/completion")     ? "n_predict"
	                    : !strcmp(pr->backend_path, "/v1/responses") ? "max_output_tokens"
	                                                                 : "max_tokens";
	/* The client's cap is the smallest it sent of the names llama-server
	 * reads (n_predict, then max_tokens; max_completion_tokens on chat):
	 * /completion takes max_tokens too, chat takes n_predict too. Where it
	 * is over what fits, every one it sent is set to what fits. */
	static const char *const names[] = {"n_predict", "max_tokens", "max_completion_tokens"};
	int responses = !strcmp(field, "max_output_tokens");
	long asked = -1;
	for (size_t i = 0; i < (responses ? 1 : 3); i++) {
		json_t *v = json_object_get(pr->body, responses ? field : names[i]);
		long a = json_is_integer(v) ? (long)json_integer_value(v) : -1;
		if (a >= 0 && (asked < 0 || a < asked))
			asked = a; /* n_predict -1 is "no cap" */
	}
	pr->max_tokens = asked;
	if (asked < 0 || asked > cap) {
		json_object_set_new(pr->body, field, json_integer(cap));
		for (size_t i = 0; !responses && i < 3; i++)
			if (json_is_integer(json_object_get(pr->body, names[i])))
				json_object_set_new(pr->body, names[i], json_integer(cap));
		pr->max_tokens = cap;
		pr->output_clamped = asked >= 0;
	}
	return 0;
}

/* ---- routing ---- */

static void pr_try_route(struct proxy_req *pr)
{
	struct daemon *d = pr->d;
	if (!pr->routable) {
		/* A client-pinned slot is on the backend it was pinned on. */
		struct backend *b = pr->slot ? pr->backend : any_allowed_backend(pr);
		if (!b) {
			if (pr->state != PS_WAITING)
				fail(pr, 503, "no backend is up");
			return;
		}
		wait_remove(pr);
		pr->backend = b;
		forward(pr);
		return;
	}
	struct route_choice ch;
	int64_t now_us = clock_now_us();
	if (!pr->t_route_us)
		pr->t_route_us = now_us;
	enum route_status st =
	    router_choose_sched(d->router, pr->tokens, pr->n_tokens, pr->bounds, pr->n_bounds,
	                        now_us, pr->allowed & ~pr->excluded, &ch);
	if (st == ROUTE_NO_BACKEND && !d->supervisor) {
		wait_remove(pr);
		fail(pr, 503, "no backend is up");
		return;
	}
	if (st == ROUTE_NO_BACKEND)
		st = ROUTE_WAIT; /* the supervised llama-server is restarting */
	if (st == ROUTE_WAIT) {
		if (pr->state != PS_WAITING)
			wait_add(pr);
		return;
	}
	wait_remove(pr);
	struct router_backend *rb = ch.slot->backend;
	if (clamp_output(pr, rb->n_ctx_slot) != 0)
		return;
	if (pr->client_uncached || pr->force_cold) {
		/* The client asked for a full evaluation (a raw run), or a plan
		 * went wrong: nothing is reused, so there is nothing to cut back
		 * or restore; in exact mode the prompt is evaluated on its
		 * schedule from an empty slot. */
		ch.reuse = 0;
		ch.must_trim = 0;
		ch.restore = NULL;
		ch.kind = "miss";
		ch.est_prefill_s = router_estimate_prefill_s(ch.slot->backend, pr->n_tokens);
	}
	pr->choice = ch;
	pr->slot = ch.slot;
	pr->backend = d->backends[rb->index];
	router_slot_begin(d->router, pr->slot, clock_now_us(), ch.est_prefill_s);
	int kind = router_route_kind(ch.kind);
	d->stats.routed++;
	if (kind == ROUTE_HIT)
		d->stats.hits++;
	else if (kind == ROUTE_PARTIAL)
		d->stats.partials++;
	else
		d->stats.misses++;
	d->stats.prompt_tokens += pr->n_tokens;
	rb->routes[kind]++;
	if (pr->kind < KIND_COUNT && !pr->replans)
		pr->backend->routed_by_api[pr->kind]++;
	if (exact_mode(pr) && !pr->replans)
		pr->backend->exact_schedule[pr->n_bounds ? 0 : 1]++;
	if (exact_mode(pr) && pr->force_cold)
		pr->backend->exact_cold_replans++;
	router_histogram_observe(&rb->wait, (double)(now_us - pr->t_route_us) / 1e6);
	if (ch.restore)
		ch.restore->pinned++;
	/* Fast mode evaluates the prompt in one step, from whatever matches. */
	int exact = exact_mode(pr);
	plan_free(&pr->plan);
	if (plan_build(&pr->plan, exact ? pr->bounds : NULL, exact ? pr->n_bounds : 0, pr->n_tokens,
	               ch.reuse, ch.save_first && pr->slot->n_tokens, ch.restore != NULL,
	               ch.must_trim, exact ? sched_max_step(pr->slot->backend->n_ubatch) : 0,
	               pr->slot->backend->n_ubatch) != 0) {
		fail(pr, 500, "out of memory");
		return;
	}
	pr->done_upto = ch.must_trim ? 0 : ch.reuse;
	run_step(pr);
}

void proxy_retry_waiting(struct daemon *d)
{
	/* Each retry may finish or re-queue the request; walk a snapshot. */
	struct proxy_req *pr = d->waiting_head;
	struct proxy_req *stop = d->waiting_tail;
	while (pr) {
		struct proxy_req *next = pr->wait_next;
		int last = pr == stop;
		if (pr->needs_begin) {
			struct backend *b = any_allowed_backend(pr);
			if (b) {
				wait_remove(pr);
				pr->needs_begin = 0;
				pr_begin(pr, b);
			}
		} else {
			pr_try_route(pr);
		}
		if (last)
			break;
		pr = next;
	}
}

/* ---- tokenization ---- */

static void on_tokenize_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	json_error_t jerr;
	json_t *obj = status == 200 ? json_loadb(body, len, 0, &jerr) : NULL;
	json_t *toks = json_object_get(obj, "tokens");
	if (!json_is_array(toks)) {
		json_decref(obj);
		fail(pr, status >= 400 ? status : 502, "tokenization failed");
		return;
	}
	size_t n = json_array_size(toks);
	pr->tokens = malloc((n ? n : 1) * sizeof *pr->tokens);
	if (!pr->tokens) {
		json_decref(obj);
		fail(pr, 500, "out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		pr->tokens[i] = (token_t)json_integer_value(json_array_get(toks, i));
	pr->n_tokens = n;
	pr->routable = n > 0;
	json_decref(obj);
	tokens_ready(pr);
}

static void on_aux_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	if (err == BACKEND_ERR_CONNECT && pr->backend)
		backend_mark_down(pr->backend, backend_error_text(err));
	/* Tokenizing failed on a backend that went away: another one of the
	 * same model tokenizes the same. */
	struct backend *other = err != BACKEND_ERR_TIMEOUT ? any_allowed_backend(pr) : NULL;
	if (other && other != pr->backend && pr->retries < pr->d->n_backends) {
		pr->retries++;
		pr_begin(pr, other);
		return;
	}
	fail(pr, err == BACKEND_ERR_TIMEOUT ? 504 : 502, backend_error_text(err));
}

static const struct backend_call_handlers tokenize_handlers = {
    .on_done = on_tokenize_done,
    .on_error = on_aux_error,
};

static void tokenize_text(struct proxy_req *pr, const char *text)
{
	pr->state = PS_TOKENIZE;
	json_t *req =
	    json_pack("{s:s, s:b, s:b}", "content", text, "add_special", 1, "parse_special", 1);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!body) {
		fail(pr, 500, "out of memory");
		return;
	}
	pr->call = backend_call_start(pr->backend->http, "POST", "/tokenize", body, strlen(body),
	                              &tokenize_handlers, pr);
	free(body);
	if (!pr->call)
		fail(pr, 500, "out of memory");
}

static void on_template_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct proxy_req *pr = arg;
	pr->call = NULL;
	json_error_t jerr;
	json_t *obj = json_loadb(body, len, 0, &jerr);
	const char *prompt = json_string_value(json_object_get(obj, "prompt"));
	if (status != 200 || !prompt) {
		/* The backend's own 4xx explains what is wrong with the messages. */
		const char *m =
		    json_string_value(json_object_get(json_object_get(obj, "error"), "message"));
		char msg[512];
		snprintf(msg, sizeof msg, "%s", m ? m : "the chat template could not be applied");
		json_decref(obj);
		/* The backend's own status where it answered one (an image sent
		 * to a text-only model is its 500), 502 only for an answer that
		 * is none. */
		fail(pr, status >= 400 ? status : 502, msg);
		return;
	}
	if (!local_text(pr, pr->backend, prompt,
	                json_string_length(json_object_get(obj, "prompt"))))
		tokenize_text(pr, prompt);
	json_decref(obj);
}

static const struct backend_call_handlers template_handlers = {
    .on_done = on_template_done,
    .on_error = on_aux_error,
};

static void start_request(struct daemon *d, struct http_request *req, enum route_kind kind,
                          const char *backend_path, int count_only);

static void start_routed(struct daemon *d, struct http_request *req, enum route_kind kind,
                         const char *backend_path)
{
	start_request(d, req, kind, backend_path, 0);
}

/* Anthropic's count_tokens: the same translation and tokenization as a
 * message, then the count instead of a generation. */
static void count_tokens(struct daemon *d, struct http_request *req)
{
	start_request(d, req, KIND_ANTHROPIC, "/v1/chat/completions", 1);
}

static void start_request(struct daemon *d, struct http_request *req, enum route_kind kind,
                          const char *backend_path, int count_only)
{
	size_t len;
	const char *raw = http_request_body(req, &len);
	json_error_t jerr;
	json_t *body = json_loadb(raw, len, 0, &jerr);
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
	struct backend *b = daemon_any_backend(d);
	if (!b && !d->supervisor) {
		json_decref(template_body);
		free(client_model);
		json_decref(body);
		http_respond_error(req, 503, "no backend is up");
		return;
	}
	struct proxy_req *pr = calloc(1, sizeof *pr);
	if (!pr) {
		json_decref(body);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	pr->d = d;
	pr->client = req;
	pr->kind = kind;
	pr->body = body;
	pr->template_body = template_body;
	pr->client_model = client_model;
	pr->count_only = count_only;
	pr->allowed = backends_for_model(
	    d, client_model ? client_model : json_string_value(json_object_get(body, "model")));
	pr->stream = json_is_true(json_object_get(body, "stream"));
	pr->client_uncached = json_is_false(json_object_get(body, "cache_prompt"));
	snprintf(pr->client_path, sizeof pr->client_path, "%s", http_request_path(req));
	pr->t_start_us = pr->t_last_write_us = clock_now_us();
	snprintf(pr->backend_path, sizeof pr->backend_path, "%s", backend_path);
	active_add(pr);
	http_request_on_close(req, on_client_close, pr);
	if (!b) {
		/* The llama-server that toki supervises is (re)starting: wait for
		 * it rather than fail. */
		pr->needs_begin = 1;
		wait_add(pr);
		return;
	}
	/* Tokenize on a backend of the requested model. */
	b = any_allowed_backend(pr);
	if (!b) {
		pr->needs_begin = 1;
		wait_add(pr);
		return;
	}
	pr_begin(pr, b);
}

/* The tokens are known: answer a count, or route. */
static void tokens_ready(struct proxy_req *pr)
{
	struct backend *tb = pr->tokenize_backend;
	if (pr->t_tokenize_us && tb) {
		pr->tokenize_us = clock_now_us() - pr->t_tokenize_us;
		if (!pr->tokenize_us)
			pr->tokenize_us = 1;
		if (pr->local_prompt) {
			tb->prompt_local++;
			tb->prompt_local_us += (uint64_t)pr->tokenize_us;
		} else {
			tb->prompt_server++;
			tb->prompt_server_us += (uint64_t)pr->tokenize_us;
		}
	}
	if (pr->count_only) {
		json_t *o = json_pack("{s:I}", "input_tokens", (json_int_t)pr->n_tokens);
		http_request_on_close(pr->client, NULL, NULL);
		respond_json(pr->client, 200, o);
		json_decref(o);
		pr->client = NULL;
		pr_finish(pr);
		return;
	}
	pr_try_route(pr);
}

static void take_tokens(struct proxy_req *pr, struct backend *b, struct token_list *t,
                        int templated)
{
	pr->local_template = templated;
	pr->tokens = t->v;
	pr->n_tokens = t->n;
	pr->routable = t->n > 0;
	pr->local_prompt = 1;
	pr->prompt_backend = b;
	t->v = NULL;
	t->n = t->cap = 0;
}

/* The chat request templated and tokenized here, when b's engine matched
 * the server (backend/prompt_probe.h) and the request is one it renders.
 * Returns 1 when the request went on from here. */
static int local_chat(struct proxy_req *pr, struct backend *b)
{
	if (pr->force_server || !b->prompt || !b->prompt_chat_ok)
		return 0;
	char why[256], *prompt = NULL;
	size_t plen = 0;
	struct token_list t = {0};
	/* Exact mode evaluates the prompt in chunks that end where messages
	 * start (router/sched.h): their positions come with the tokens. */
	struct prompt_starts st = {0};
	enum chat_result r = prompt_engine_chat_starts(
	    b->prompt, pr->template_body ? pr->template_body : pr->body, time(NULL), &prompt, &plen,
	    &t, pr->d->router->mode == REUSE_EXACT ? &st : NULL, why, sizeof why);
	free(prompt);
	if (r != CHAT_OK) {
		log_debug("prompt by the server: %s", why);
		token_list_free(&t);
		free(st.pos);
		free(st.kind);
		return 0;
	}
	free(pr->bounds);
	pr->n_bounds = sched_chunks(st.pos, st.kind, st.n);
	pr->bounds = st.pos;
	free(st.kind);
	take_tokens(pr, b, &t, 1);
	tokens_ready(pr);
	return 1;
}

/* A text prompt (a completion's, or a chat prompt the server templated)
 * tokenized here when b's tokenizer matched the server. */
static int local_text(struct proxy_req *pr, struct backend *b, const char *text, size_t len)
{
	if (pr->force_server || !b->prompt || !b->prompt_tokens_ok)
		return 0;
	struct token_list t = {0};
	if (prompt_engine_tokenize(b->prompt, text, len, &t) != 0) {
		token_list_free(&t);
		return 0;
	}
	take_tokens(pr, b, &t, 0);
	tokens_ready(pr);
	return 1;
}

/* How long a client-pinned request will hold its slot, for the router's
 * wait estimate: its output cap (or the slot's context) at the backend's
 * measured decode rate; 10 s before there is one. Its prompt is unknown. */
static double pinned_busy_s(struct proxy_req *pr, struct backend *b)
{
	json_t *v = json_object_get(pr->body, "max_tokens");
	if (!json_is_integer(v))
		v = json_object_get(pr->body, "n_predict");
	long long n = json_is_integer(v) && json_integer_value(v) > 0 ? json_integer_value(v)
	                                                              : b->rb->n_ctx_slot;
	return b->rb->decode_tps > 0 ? (double)n / b->rb->decode_tps : 10.0;
}

/* Tokenizes (here, or through backend b), then routes. */
static void pr_begin(struct proxy_req *pr, struct backend *b)
{
	struct daemon *d = pr->d;
	json_t *body = pr->body;
	enum route_kind kind = pr->kind;
	/* Exact mode's schedule follows the messages where toki makes the
	 * prompt, and is the grid where the server does: while the probes that
	 * decide which it is still run, a chat request waits (milliseconds,
	 * after a backend starts), so that its answer does not depend on when
	 * it came. */
	if (b->probe && exact_mode(pr) && kind != KIND_COMPLETION &&
	    !json_object_get(body, "id_slot")) {
		pr->needs_begin = 1;
		wait_add(pr);
		return;
	}
	pr->backend = b; /* for tokenization; routing picks the real one */
	pr->tokenize_backend = b;
	pr->t_tokenize_us = clock_now_us();
	if (json_object_get(body, "id_slot")) {
		/* The client pinned a slot itself: respect it, but then the router
		 * cannot know what that slot holds. */
		json_int_t id = json_integer_value(json_object_get(body, "id_slot"));
		if (id >= 0 && id < b->rb->n_slots) {
			struct router_slot *s = &b->rb->slots[id];
			router_slot_forget(d->router, s);
			/* ...and it is busy until the answer ends, so that no routed
			 * request is sent to wait behind it (pr_finish ends it). */
			if (!s->busy) {
				router_slot_begin(d->router, s, clock_now_us(),
				                  pinned_busy_s(pr, b));
				pr->slot = s;
			}
		}
		pr_try_route(pr);
		return;
	}
	if (kind != KIND_COMPLETION) {
		if (local_chat(pr, b))
			return;
		pr->state = PS_TEMPLATE;
		char *raw = json_dumps(pr->template_body ? pr->template_body : body, JSON_COMPACT);
		pr->call = raw ? backend_call_start(b->http, "POST", "/apply-template", raw,
		                                    strlen(raw), &template_handlers, pr)
		               : NULL;
		free(raw);
		if (!pr->call)
			fail(pr, 500, "out of memory");
		return;
	}
	json_t *prompt = json_object_get(body, "prompt");
	if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
	    json_is_string(json_array_get(prompt, 0)))
		prompt = json_array_get(prompt, 0);
	if (json_is_string(prompt)) {
		if (!local_text(pr, b, json_string_value(prompt), json_string_length(prompt)))
			tokenize_text(pr, json_string_value(prompt));
		return;
	}
	/* A prompt of token ids is routed as it is; several prompts are not. */
	size_t n = json_array_size(prompt), i;
	json_t *t;
	int all_ints = n > 0;
	json_array_foreach(prompt, i, t) if (!json_is_integer(t)) all_ints = 0;
	if (all_ints) {
		pr->tokens = malloc(n * sizeof *pr->tokens);
		if (!pr->tokens) {
			fail(pr, 500, "out of memory");
			return;
		}
		json_array_foreach(prompt, i, t) pr->tokens[i] = (token_t)json_integer_value(t);
		pr->n_tokens = n;
		pr->routable = 1;
	}
	pr_try_route(pr);
}

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

static void pass_through(struct daemon *d, struct http_request *req)
{
	struct backend *b = daemon_any_backend(d);
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
			router_slot_forget(d->router, &b->rb->slots[id]);
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
	respond_json(req, up ? 200 : 503, o);
	json_decref(o);
}

static void handle_stats(struct daemon *d, struct http_request *req)
{
	struct daemon_stats *s = &d->stats;
	json_t *o = json_object();
	json_object_set_new(o, "mode", json_string(reuse_mode_name(d->router->mode)));
	json_object_set_new(o, "uptime_s",
	                    json_real((double)(clock_now_us() - d->started_us) / 1e6));
	json_object_set_new(o, "requests", json_integer((json_int_t)s->requests));
	json_object_set_new(o, "routed", json_integer((json_int_t)s->routed));
	json_object_set_new(o, "hits", json_integer((json_int_t)s->hits));
	json_object_set_new(o, "partials", json_integer((json_int_t)s->partials));
	json_object_set_new(o, "misses", json_integer((json_int_t)s->misses));
	json_object_set_new(o, "errors", json_integer((json_int_t)s->errors));
	json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)s->prompt_tokens));
	json_object_set_new(o, "evaluated_tokens", json_integer((json_int_t)s->evaluated_tokens));
	json_object_set_new(o, "cached_tokens", json_integer((json_int_t)s->cached_tokens));
	json_object_set_new(o, "cut_backs", json_integer((json_int_t)s->trim_tokens));
	json_object_set_new(o, "saves", json_integer((json_int_t)s->saves));
	json_object_set_new(o, "llama_restarts",
	                    json_integer(d->supervisor ? supervisor_restarts(d->supervisor) : 0));
	json_object_set_new(o, "restores", json_integer((json_int_t)s->restores));
	json_object_set_new(o, "saved_files", json_integer((json_int_t)d->router->n_saved));
	json_object_set_new(o, "saved_bytes", json_integer((json_int_t)d->router->saved_bytes));
	json_object_set_new(o, "saved_evictions", json_integer((json_int_t)s->saved_evictions));
	json_object_set_new(o, "discarded_files", json_integer((json_int_t)s->discarded_files));
	json_t *bs = json_array();
	for (int i = 0; i < d->n_backends; i++) {
		struct router_backend *rb = d->backends[i]->rb;
		json_t *slots = json_array();
		for (int k = 0; k < rb->n_slots; k++) {
			struct router_slot *sl = &rb->slots[k];
			json_array_append_new(slots,
			                      json_pack("{s:i, s:I, s:I, s:b, s:i}", "id", sl->id,
			                                "tokens", (json_int_t)sl->n_tokens,
			                                "aligned", (json_int_t)sl->aligned, "busy",
			                                sl->busy, "hits", (int)sl->hits));
		}
		json_array_append_new(
		    bs, json_pack("{s:s, s:b, s:s?, s:i, s:i, s:f, s:f, s:o}", "url", rb->url, "up",
		                  rb->up, "model", d->backends[i]->model_id, "n_ctx_slot",
		                  rb->n_ctx_slot, "n_ubatch", rb->n_ubatch, "prefill_tps",
		                  rb->prefill_tps, "decode_tps", rb->decode_tps, "slots", slots));
	}
	for (int i = 0; i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		json_t *e = json_array_get(bs, (size_t)i);
		json_object_set_new(e, "discoveries", json_integer(b->rb->discoveries));
		json_object_set_new(e, "self_cached", json_boolean(b->rb->self_cached));
		json_object_set_new(e, "ram_cache", json_boolean(b->rb->ram_cache));
		char verdict[400];
		selftest_verdict(&b->selftest, verdict, sizeof verdict);
		json_object_set_new(e, "exact",
		                    json_pack("{s:s, s:s, s:s?, s:f}", "selftest",
		                              selftest_state_name(b->selftest.state), "verdict",
		                              verdict, "remedy", b->selftest.remedy, "seconds",
		                              b->selftest.seconds));
		struct prompt_engine_stats ps = {0};
		if (b->prompt)
			prompt_engine_get_stats(b->prompt, &ps);
		json_object_set_new(
		    e, "prompts",
		    json_pack(
		        "{s:s, s:b, s:b, s:I, s:f, s:I, s:f, s:I, s:I, s:I, s:I, s:I}", "status",
		        b->prompt_status, "local_tokenizer", b->prompt_tokens_ok, "local_template",
		        b->prompt_chat_ok, "local", (json_int_t)b->prompt_local, "local_ms",
		        (double)b->prompt_local_us / 1000.0, "server", (json_int_t)b->prompt_server,
		        "server_ms", (double)b->prompt_server_us / 1000.0, "audits",
		        (json_int_t)b->prompt_audits, "mismatches",
		        (json_int_t)b->prompt_mismatches, "fragments", (json_int_t)ps.fragments,
		        "fragment_hits", (json_int_t)ps.fragment_hits, "cached_tokens",
		        (json_int_t)ps.cached_tokens));
	}
	json_object_set_new(o, "replans", json_integer((json_int_t)s->replans));
	json_object_set_new(o, "prefill_steps", json_integer((json_int_t)s->prefill_steps));
	json_object_set_new(o, "tail_cuts", json_integer((json_int_t)s->tail_cuts));
	json_object_set_new(o, "tail_cut_tokens", json_integer((json_int_t)s->tail_cut_tokens));
	json_object_set_new(o, "backends", bs);
	json_int_t waiting = 0;
	for (struct proxy_req *w = d->waiting_head; w; w = w->wait_next)
		waiting++;
	json_object_set_new(o, "waiting", json_integer(waiting));
	respond_json(req, 200, o);
	json_decref(o);
}

/* The backend's model list, with the context that every part of toki uses
 * (a slot's context) and the output cap advertised on each model. */
static void handle_models(struct daemon *d, struct http_request *req)
{
	struct backend *b = daemon_any_backend(d);
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
	respond_json(req, 200, m);
	json_decref(m);
}

static int is_passthrough(const char *method, const char *path)
{
	static const char *const routes[] = {
	    "/tokenize",
	    "/detokenize",
	    "/props",
	    "/slots",
	    "/apply-template",
	    "/embedding",
	    "/embeddings",
	    "/v1/embeddings",
	    "/infill",
	    "/rerank",
	    "/reranking",
	    "/v1/rerank",
	    "/v1/reranking",
	    "/lora-adapters",
	    /* A prompt's token count, without running it (llama-server 11669). */
	    "/chat/completions/input_tokens",
	    "/v1/chat/completions/input_tokens",
	    "/responses/input_tokens",
	    "/v1/responses/input_tokens",
	    /* Ends a running request's reasoning: the request is on the backend
	     * these go to when there is one backend. */
	    "/v1/chat/completions/control",
	    "/audio/transcriptions",
	    "/v1/audio/transcriptions",
	};
	for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
		if (!strcmp(path, routes[i]))
			return 1;
	return !strncmp(path, "/slots/", 7) && !strcmp(method, "POST");
}

void proxy_handle(struct http_request *req, void *ctx)
{
	struct daemon *d = ctx;
	const char *method = http_request_method(req);
	const char *path = http_request_path(req);
	d->stats.requests++;
	if (d->shutting_down) {
		http_respond_error(req, 503, "toki is shutting down");
		return;
	}
	int post = !strcmp(method, "POST");
	/* /v1/health is llama-server's other name for it, public as well. */
	int health = !strcmp(path, "/health") || !strcmp(path, "/v1/health");
	if (!health && !auth_check(d->cfg.token, http_request_header(req, "Authorization"),
	                           http_request_header(req, "x-api-key"))) {
		http_response_header(req, "WWW-Authenticate", "Bearer realm=\"toki\"");
		http_respond_error(
		    req, 401,
		    "missing or wrong token: send the local token as Authorization: "
		    "Bearer <token> or x-api-key (see $TOKI_STATE_DIR/token, or TOKI_TOKEN)");
		return;
	}
	if (health) {
		handle_health(d, req);
	} else if (!strcmp(path, "/toki/stats")) {
		handle_stats(d, req);
	} else if (!strcmp(path, "/metrics")) {
		/* Every backend's series and toki's own, in one scrape. */
		metrics_handle(d, req);
	} else if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/chat/completions")) {
		if (!post)
			http_respond_error(req, 405, "use POST");
		else
			start_routed(d, req, KIND_CHAT, "/v1/chat/completions");
	} else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/completions") ||
	           !strcmp(path, "/completion")) {
		if (!post)
			http_respond_error(req, 405, "use POST");
		else
			/* llama-server serves /completions with its own /completion
			 * (native answers); only /v1/completions is OpenAI's. */
			start_routed(d, req, KIND_COMPLETION,
			             strcmp(path, "/v1/completions") ? "/completion"
			                                             : "/v1/completions");
	} else if (!strcmp(path, "/anthropic/v1/messages") || !strcmp(path, "/v1/messages")) {
		/* llama-server (and Ollama) serve the Messages API at the root: a
		 * client pointed at toki instead of the server sends it there. */
		if (!post)
			http_respond_error(req, 405, "use POST");
		else
			start_routed(d, req, KIND_ANTHROPIC, "/v1/chat/completions");
	} else if (!strcmp(path, "/anthropic/v1/messages/count_tokens") ||
	           !strcmp(path, "/v1/messages/count_tokens")) {
		if (!post)
			http_respond_error(req, 405, "use POST");
		else
			count_tokens(d, req);
	} else if (!strcmp(path, "/v1/responses") || !strcmp(path, "/responses")) {
		if (!post)
			http_respond_error(req, 405, "use POST");
		else
			start_routed(d, req, KIND_RESPONSES, "/v1/responses");
	} else if (!strcmp(path, "/v1/models") || !strcmp(path, "/models")) {
		/* POST and DELETE /models are a router-mode server's downloads
		 * and deletions, which toki does not pass on. */
		if (strcmp(method, "GET") && strcmp(method, "HEAD"))
			http_respond_error(req, 405, "use GET");
		else
			handle_models(d, req);
	} else if (is_passthrough(method, path)) {
		pass_through(d, req);
	} else {
		char msg[300];
		snprintf(msg, sizeof msg, "no route for %s %.200s", method, path);
		http_respond_error(req, 404, msg);
	}
}

void proxy_expire_waiting(struct daemon *d, int64_t now_us)
{
	int64_t limit = (int64_t)d->cfg.backend_timeout_s * 1000000;
	struct proxy_req *pr = d->waiting_head;
	while (pr) {
		struct proxy_req *next = pr->wait_next;
		if (now_us - pr->t_start_us > limit) {
			wait_remove(pr);
			fail(pr, 504, "no slot or backend became free in time");
		}
		pr = next;
	}
}

void proxy_abort_all(struct daemon *d, const char *why)
{
	while (d->active) {
		struct proxy_req *pr = d->active;
		if (pr->client && pr->stream && pr->state == PS_FORWARD) {
			/* A clean end for a stream in flight: an error event, then
			 * the end of the chunked body. */
			fail(pr, 503, why);
		} else {
			fail(pr, 503, why);
		}
	}
}
