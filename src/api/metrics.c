#include "api/metrics.h"

#include "api/request_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_http.h"
#include "backend/selftest.h"
#include "daemon.h"
#include "http/http_server.h"
#include "router/router.h"
#include "util/grow.h"

#ifndef TOKI_VERSION
#define TOKI_VERSION "dev"
#endif

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- merging expositions ---- */

struct family {
	char *name;
	struct strbuf meta; /* its HELP and TYPE lines, first seen */
	int has_help, has_type;
	struct strbuf samples; /* every exposition's, in the order added */
};

struct metrics_merge {
	struct family *f;
	size_t n, cap;
};

struct metrics_merge *metrics_merge_new(void)
{
	return calloc(1, sizeof(struct metrics_merge));
}

void metrics_merge_free(struct metrics_merge *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++) {
		free(m->f[i].name);
		strbuf_free(&m->f[i].meta);
		strbuf_free(&m->f[i].samples);
	}
	free(m->f);
	free(m);
}

static struct family *family_get(struct metrics_merge *m, const char *name, size_t len)
{
	for (size_t i = 0; i < m->n; i++)
		if (strlen(m->f[i].name) == len && !memcmp(m->f[i].name, name, len))
			return &m->f[i];
	if (GROW(m->f, m->cap, m->n + 1, 32) != 0)
		return NULL;
	struct family *f = &m->f[m->n];
	memset(f, 0, sizeof *f);
	f->name = malloc(len + 1);
	if (!f->name)
		return NULL;
	memcpy(f->name, name, len);
	f->name[len] = '\0';
	m->n++;
	return f;
}

static int name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == ':';
}

int metrics_label_value(struct strbuf *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			strbuf_appends(out, "\\\\");
		else if (*s == '"')
			strbuf_appends(out, "\\\"");
		else if (*s == '\n')
			strbuf_appends(out, "\\n");
		else
			strbuf_append(out, s, 1);
	}
	return out->failed ? -1 : 0;
}

/* One sample line with backend="..." put first among its labels. */
static void relabel(struct strbuf *out, const char *line, size_t len, size_t name_len,
                    const char *backend)
{
	strbuf_append(out, line, name_len);
	strbuf_appends(out, "{backend=\"");
	metrics_label_value(out, backend);
	strbuf_appends(out, "\"");
	const char *rest = line + name_len;
	size_t rest_len = len - name_len;
	if (rest_len && rest[0] == '{') {
		/* Its own labels follow, unless there were none ({}). */
		if (rest_len > 1 && rest[1] != '}')
			strbuf_appends(out, ",");
		strbuf_append(out, rest + 1, rest_len - 1);
	} else {
		strbuf_appends(out, "}");
		strbuf_append(out, rest, rest_len);
	}
	strbuf_appends(out, "\n");
}

int metrics_merge_add(struct metrics_merge *m, const char *text, size_t len, const char *backend)
{
	/* The family the last HELP or TYPE line named: its samples may carry
	 * suffixes (_bucket, _sum, _count) after the name. */
	struct family *cur = NULL;
	const char *p = text, *end = text + len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;
		size_t ll = (size_t)(le - p);
		if (ll && p[ll - 1] == '\r')
			ll--;
		if (ll > 7 && (!strncmp(p, "# HELP ", 7) || !strncmp(p, "# TYPE ", 7))) {
			const char *name = p + 7;
			size_t nlen = 0;
			while (7 + nlen < ll && name_char(name[nlen]))
				nlen++;
			if (nlen) {
				struct family *f = family_get(m, name, nlen);
				if (!f)
					return -1;
				int *seen = p[2] == 'H' ? &f->has_help : &f->has_type;
				if (!*seen) {
					*seen = 1;
					strbuf_append(&f->meta, p, ll);
					strbuf_appends(&f->meta, "\n");
				}
				cur = f;
			}
		} else if (ll && p[0] != '#') {
			size_t nlen = 0;
			while (nlen < ll && name_char(p[nlen]))
				nlen++;
			if (nlen && nlen < ll && (p[nlen] == '{' || p[nlen] == ' ')) {
				struct family *f = cur;
				size_t cl = f ? strlen(f->name) : 0;
				if (!f || nlen < cl || memcmp(p, f->name, cl) != 0)
					f = family_get(m, p, nlen);
				if (!f)
					return -1;
				relabel(&f->samples, p, ll, nlen, backend);
			}
		}
		p = nl ? nl + 1 : end;
	}
	for (size_t i = 0; i < m->n; i++)
		if (m->f[i].meta.failed || m->f[i].samples.failed)
			return -1;
	return 0;
}

int metrics_merge_write(const struct metrics_merge *m, struct strbuf *out)
{
	for (size_t i = 0; i < m->n; i++) {
		if (m->f[i].meta.len)
			strbuf_append(out, m->f[i].meta.p, m->f[i].meta.len);
		if (m->f[i].samples.len)
			strbuf_append(out, m->f[i].samples.p, m->f[i].samples.len);
	}
	return out->failed ? -1 : 0;
}

/* ---- toki's own series ---- */

static void family(struct strbuf *o, const char *name, const char *type, const char *help)
{
	char line[512];
	snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	strbuf_appends(o, line);
}

static void value(struct strbuf *o, double v)
{
	char num[64];
	if (v == (double)(uint64_t)v && v < 1e18)
		snprintf(num, sizeof num, " %llu\n", (unsigned long long)v);
	else
		snprintf(num, sizeof num, " %.9g\n", v);
	strbuf_appends(o, num);
}

/* name{backend="url"} v, or with a key name{backend="url",key="val"} v. */
static void per_backend(struct strbuf *o, const char *name, const struct backend *b,
                        const char *key, const char *val, double v)
{
	strbuf_appends(o, name);
	strbuf_appends(o, "{backend=\"");
	metrics_label_value(o, b->rb->url);
	if (key) {
		strbuf_appends(o, "\",");
		strbuf_appends(o, key);
		strbuf_appends(o, "=\"");
		metrics_label_value(o, val);
	}
	strbuf_appends(o, "\"}");
	value(o, v);
}

static void global(struct strbuf *o, const char *name, const char *type, const char *help, double v)
{
	family(o, name, type, help);
	strbuf_appends(o, name);
	value(o, v);
}

int metrics_write_toki(struct daemon *d, const int *backend_metrics_up, struct strbuf *o)
{
	family(o, "toki_build_info", "gauge", "toki's version, and its reuse mode.");
	strbuf_appends(o, "toki_build_info{version=\"");
	metrics_label_value(o, TOKI_VERSION);
	strbuf_appends(o, "\",mode=\"");
	metrics_label_value(o, reuse_mode_name(d->router->mode));
	strbuf_appends(o, "\"} 1\n");

	struct {
		const char *name, *type, *help;
	} const fam[] = {
	    {"toki_backend_up", "gauge", "1 while the backend is up and discovered."},
	    {"toki_backend_metrics_up", "gauge",
	     "1 when this scrape got the backend's own /metrics (llama-server --metrics)."},
	    {"toki_backend_slots", "gauge", "Slots the backend has."},
	    {"toki_backend_in_flight", "gauge", "Requests running on the backend now."},
	    {"toki_backend_discoveries_total", "counter",
	     "Times the backend was discovered: each start or restart toki saw."},
	    {"toki_backend_exact_verified", "gauge",
	     "1 when exact mode's self-test verified the backend (docs/exact.md)."},
	};
	for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
		family(o, fam[k].name, fam[k].type, fam[k].help);
		for (int i = 0; i < d->n_backends; i++) {
			struct backend *b = d->backends[i];
			struct router_backend *rb = b->rb;
			const double vs[] = {rb->up,
			                     backend_metrics_up ? backend_metrics_up[i] : 0,
			                     rb->n_slots,
			                     rb->in_flight,
			                     (double)rb->discoveries,
			                     b->selftest.state == SELFTEST_VERIFIED};
			per_backend(o, fam[k].name, b, NULL, NULL, vs[k]);
		}
	}

	family(o, "toki_routes_total", "counter",
	       "Requests routed to a slot, by route: hit (the slot held the whole match), "
	       "partial, miss, disk (a saved state restored).");
	for (int i = 0; i < d->n_backends; i++)
		for (int k = 0; k < ROUTE_KINDS; k++)
			per_backend(o, "toki_routes_total", d->backends[i], "route",
			            router_route_kind_names[k],
			            (double)d->backends[i]->rb->routes[k]);

	struct {
		const char *name, *help;
	} const counters[] = {
	    {"toki_requests_total", "Routed requests that ended on the backend."},
	    {"toki_evaluated_tokens_total",
	     "Prompt tokens the backend evaluated for toki's requests (its timings.prompt_n)."},
	    {"toki_cached_tokens_total", "Prompt tokens the backend reused from its cache."},
	    {"toki_slot_saves_total", "Slot states saved to files."},
	    {"toki_slot_save_bytes_total", "Bytes of slot states saved."},
	    {"toki_slot_save_seconds_total", "Seconds the backend spent saving slots."},
	    {"toki_slot_restores_total", "Saved states restored into a slot."},
	    {"toki_slot_restore_bytes_total", "Bytes of saved states restored."},
	    {"toki_slot_restore_seconds_total", "Seconds the backend spent restoring slots."},
	};
	for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
		family(o, counters[k].name, "counter", counters[k].help);
		for (int i = 0; i < d->n_backends; i++) {
			struct router_backend *rb = d->backends[i]->rb;
			const double vs[] = {(double)rb->requests,
			                     (double)rb->evaluated_tokens,
			                     (double)rb->cached_tokens,
			                     (double)rb->saves,
			                     (double)rb->save_bytes,
			                     rb->save_s,
			                     (double)rb->restores,
			                     (double)rb->restore_bytes,
			                     rb->restore_s};
			_Static_assert(sizeof vs / sizeof vs[0] ==
			                   sizeof counters / sizeof counters[0],
			               "a counter without a value");
			per_backend(o, counters[k].name, d->backends[i], NULL, NULL, vs[k]);
		}
	}

	static const char *const apis[4] = {"chat", "completion", "messages", "responses"};
	_Static_assert(KIND_COUNT == 4, "an API without a label");
	family(o, "toki_routed_requests_total", "counter",
	       "Requests routed to the backend, by API: chat (OpenAI chat completions), "
	       "completion (completions), messages (Anthropic), responses (OpenAI responses).");
	for (int i = 0; i < d->n_backends; i++)
		for (int k = 0; k < 4; k++)
			per_backend(o, "toki_routed_requests_total", d->backends[i], "api", apis[k],
			            (double)d->backends[i]->routed_by_api[k]);

	static const char *const made_by[2] = {"toki", "server"};
	family(o, "toki_prompts_total", "counter",
	       "Prompts made for requests routed through the backend, by who made them: toki "
	       "(its own template and tokenizer) or the server (/apply-template, /tokenize).");
	for (int i = 0; i < d->n_backends; i++) {
		const struct backend *b = d->backends[i];
		const double n[2] = {(double)b->prompt_local, (double)b->prompt_server};
		for (int k = 0; k < 2; k++)
			per_backend(o, "toki_prompts_total", b, "made_by", made_by[k], n[k]);
	}
	family(o, "toki_prompt_seconds_total", "counter",
	       "Seconds spent making those prompts, by who made them.");
	for (int i = 0; i < d->n_backends; i++) {
		const struct backend *b = d->backends[i];
		const double sec[2] = {(double)b->prompt_local_us / 1e6,
		                       (double)b->prompt_server_us / 1e6};
		for (int k = 0; k < 2; k++)
			per_backend(o, "toki_prompt_seconds_total", b, "made_by", made_by[k],
			            sec[k]);
	}

	static const char *const schedules[2] = {"messages", "grid"};
	family(o, "toki_exact_requests_total", "counter",
	       "Exact mode's routed requests by schedule: messages (chunks where messages start), "
	       "or grid (llama-server's own micro-batches: a raw prompt, or a chat prompt toki "
	       "could not make itself, which reuses less).");
	for (int i = 0; i < d->n_backends; i++)
		for (int k = 0; k < 2; k++)
			per_backend(o, "toki_exact_requests_total", d->backends[i], "schedule",
			            schedules[k], (double)d->backends[i]->exact_schedule[k]);
	family(o, "toki_exact_cold_replans_total", "counter",
	       "Exact-mode requests evaluated again from an empty slot after the server reused "
	       "other than planned (the answer stays exact; the reuse is lost).");
	for (int i = 0; i < d->n_backends; i++)
		per_backend(o, "toki_exact_cold_replans_total", d->backends[i], NULL, NULL,
		            (double)d->backends[i]->exact_cold_replans);

	family(o, "toki_queue_wait_seconds", "histogram",
	       "Time a routed request waited for its slot, from its first routing try.");
	for (int i = 0; i < d->n_backends; i++) {
		const struct router_histogram *h = &d->backends[i]->rb->wait;
		for (int k = 0; k <= ROUTER_HISTOGRAM_BOUNDS; k++) {
			char le[32] = "+Inf";
			if (k < ROUTER_HISTOGRAM_BOUNDS)
				snprintf(le, sizeof le, "%g", router_histogram_bounds[k]);
			per_backend(o, "toki_queue_wait_seconds_bucket", d->backends[i], "le", le,
			            (double)(k < ROUTER_HISTOGRAM_BOUNDS ? h->le[k] : h->count));
		}
		per_backend(o, "toki_queue_wait_seconds_sum", d->backends[i], NULL, NULL, h->sum);
		per_backend(o, "toki_queue_wait_seconds_count", d->backends[i], NULL, NULL,
		            (double)h->count);
	}

	const struct daemon_stats *s = &d->stats;
	global(o, "toki_http_requests_total", "counter", "HTTP requests toki received, any route.",
	       (double)s->requests);
	global(o, "toki_errors_total", "counter", "Requests that ended in an error.",
	       (double)s->errors);
	global(o, "toki_replans_total", "counter",
	       "Requests planned again after the server disagreed with toki's plan.",
	       (double)s->replans);
	global(o, "toki_prefill_steps_total", "counter",
	       "Chunks of exact mode's schedule evaluated as steps of their own.",
	       (double)s->prefill_steps);
	global(o, "toki_tail_cuts_total", "counter",
	       "Exact mode's cuts of a slot's tail after an answer.", (double)s->tail_cuts);
	global(o, "toki_answers_kept_total", "counter",
	       "Exact mode's answers whose rows stayed in their slot for the next turn.",
	       (double)s->answers_kept);
	global(o, "toki_answer_rows_kept_total", "counter",
	       "Rows of answers kept in their slot for the next turn.",
	       (double)s->answer_rows_kept);
	global(o, "toki_answers_kept_by_ids_total", "counter",
	       "Answers kept by the ids of the tokens generation made, which the answer listed.",
	       (double)s->answers_kept_by_ids);
	global(o, "toki_replayed_tokens_total", "counter",
	       "Tokens of earlier answers evaluated one at a time (exact mode's steps).",
	       (double)s->replayed_tokens);
	global(
	    o, "toki_replay_forced_tokens_total", "counter",
	    "Of those, rows a forced generation decoded (llama-server counts them as predicted).",
	    (double)s->replay_forced_tokens);
	global(o, "toki_saved_files", "gauge", "Saved slot states toki keeps.",
	       (double)d->router->n_saved);
	global(o, "toki_saved_bytes", "gauge", "Bytes of the saved slot states.",
	       (double)d->router->saved_bytes);
	global(o, "toki_saved_evictions_total", "counter",
	       "Saved states deleted to stay under --slot-disk-mb.", (double)s->saved_evictions);
	global(o, "toki_discarded_files_total", "counter",
	       "Slot files deleted as damaged or made under other settings.",
	       (double)s->discarded_files);
	global(o, "toki_waiting_requests", "gauge", "Requests waiting for a slot now.",
	       (double)d->n_waiting);
	return o->failed ? -1 : 0;
}

/* ---- the scrape ---- */

struct scrape;

struct scrape_call {
	struct scrape *s;
	int index;
	struct backend_call *call;
	char *body;
	size_t len;
};

struct scrape {
	struct daemon *d;
	struct http_request *client;
	int pending;
	struct scrape_call *calls;
};

static void scrape_free(struct scrape *s)
{
	for (int i = 0; i < s->d->n_backends; i++) {
		if (s->calls[i].call)
			backend_call_cancel(s->calls[i].call);
		free(s->calls[i].body);
	}
	free(s->calls);
	free(s);
}

static void scrape_finish(struct scrape *s)
{
	struct daemon *d = s->d;
	int *up = calloc((size_t)d->n_backends, sizeof *up);
	struct metrics_merge *m = metrics_merge_new();
	struct strbuf out = {0};
	int rc = up && m ? 0 : -1;
	for (int i = 0; rc == 0 && i < d->n_backends; i++) {
		if (!s->calls[i].body)
			continue;
		up[i] = 1;
		rc = metrics_merge_add(m, s->calls[i].body, s->calls[i].len,
		                       d->backends[i]->rb->url);
	}
	if (rc == 0)
		rc = metrics_write_toki(d, up, &out);
	if (rc == 0)
		rc = metrics_merge_write(m, &out);
	http_request_on_close(s->client, NULL, NULL);
	if (rc == 0)
		http_respond(s->client, 200, CONTENT_TYPE, out.p ? out.p : "", out.len);
	else
		http_respond_error(s->client, 500, "out of memory");
	strbuf_free(&out);
	metrics_merge_free(m);
	free(up);
	scrape_free(s);
}

static void on_backend_metrics(struct backend_call *call, int status, const char *body, size_t len,
                               void *arg)
{
	struct scrape_call *c = arg;
	c->call = NULL;
	/* llama-server without --metrics answers 501: that backend is left out. */
	if (status == 200 && (c->body = malloc(len + 1)) != NULL) {
		memcpy(c->body, body, len);
		c->body[len] = '\0';
		c->len = len;
	}
	if (--c->s->pending == 0)
		scrape_finish(c->s);
}

static void on_backend_metrics_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct scrape_call *c = arg;
	c->call = NULL;
	if (--c->s->pending == 0)
		scrape_finish(c->s);
}

static const struct backend_call_handlers metrics_handlers = {
    .on_done = on_backend_metrics,
    .on_error = on_backend_metrics_error,
};

static void on_client_close(struct http_request *req, void *arg)
{
	scrape_free(arg);
}

void metrics_handle(struct daemon *d, struct http_request *req)
{
	struct scrape *s = calloc(1, sizeof *s);
	if (s)
		s->calls = calloc((size_t)d->n_backends + 1, sizeof *s->calls);
	if (!s || !s->calls) {
		free(s);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	s->d = d;
	s->client = req;
	/* One count held while the calls start, so that none that ends at
	 * once finishes the scrape early. */
	s->pending = 1;
	for (int i = 0; i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		s->calls[i].s = s;
		s->calls[i].index = i;
		if (!b->rb->up)
			continue;
		s->pending++;
		s->calls[i].call = backend_call_start(b->http, "GET", "/metrics", NULL, 0,
		                                      &metrics_handlers, &s->calls[i]);
		if (!s->calls[i].call)
			s->pending--;
	}
	if (--s->pending == 0) {
		scrape_finish(s);
		return;
	}
	http_request_on_close(req, on_client_close, s);
}
