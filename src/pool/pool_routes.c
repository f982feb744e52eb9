/* The endpoint's routes: /health before the token check, the token check,
 * the endpoint's own answers (/v1/models, /toki/stats, /metrics: answered
 * here, so that asking starts no model), and every other request's model,
 * named by its body's "model" (or a GET's model=) and resolved by
 * pool_pick.c, to be relayed (pool_relay.c) or queued (pool.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "http/http_parse.h"
#include "http/http_server.h"
#include "model/memsize.h"
#include "model/registry.h"
#include "pool/pool_impl.h"
#include "pool/pool_pick.h"
#include "util/clock.h"
#include "util/json_body.h"
#include "util/log.h"
#include "util/strbuf.h"

/* The context the model has now or had last: its child's, else the one
 * recorded by its last start, else the registry's. */
static long model_ctx(const struct pool_model *m, const struct registry_model *rm)
{
	if (m && m->ctx > 0)
		return m->ctx;
	long c = rm ? memsize_read_ctx(rm->name) : -1;
	if (c > 0)
		return c;
	return rm ? rm->ctx : 0;
}

static void reply_json_obj(struct http_request *req, int status, json_t *o)
{
	char *s = json_dumps(o, JSON_COMPACT);
	if (!s) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_respond(req, status, "application/json", s, strlen(s));
	free(s);
}

static void handle_models(struct pool *p, struct http_request *req)
{
	json_t *data = json_array();
	for (int i = 0; i < p->reg.n; i++) {
		const struct registry_model *rm = &p->reg.models[i];
		struct pool_model *m = pool_model_get(p, rm->name);
		long ctx = model_ctx(m, rm);
		json_t *e = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", rm->name, "object",
		                      "model", "created", (json_int_t)0, "owned_by", "toki",
		                      "state", pool_state_names[m ? m->state : PM_UNLOADED]);
		json_t *al = json_array();
		for (int a = 0; a < rm->n_aliases; a++)
			json_array_append_new(al, json_string(rm->aliases[a]));
		json_object_set_new(e, "aliases", al);
		json_object_set_new(e, "context_length", ctx > 0 ? json_integer(ctx) : json_null());
		json_object_set_new(e, "max_output",
		                    rm->max_output > 0 ? json_integer(rm->max_output)
		                                       : json_null());
		json_object_set_new(
		    e, "active", json_boolean(p->reg.active && !strcmp(p->reg.active, rm->name)));
		json_array_append_new(data, e);
	}
	json_t *o = json_pack("{s:s, s:o}", "object", "list", "data", data);
	reply_json_obj(req, 200, o);
	json_decref(o);
}

/* The endpoint's own numbers: what each model is doing. Answered here, so
 * that toki status does not start the active model by asking. */
static void handle_stats(struct pool *p, struct http_request *req)
{
	json_t *models = json_array();
	int64_t now = clock_now_us();
	int waiting = 0;
	for (struct pool_waiter *w = p->head; w; w = w->next)
		waiting++;
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *m = p->models[i];
		json_t *e = json_pack("{s:s, s:s, s:b, s:i, s:i, s:I, s:I, s:i, s:i, s:b}", "name",
		                      m->name, "state", pool_state_names[m->state], "registered",
		                      registry_find(&p->reg, m->name) != NULL, "pid", (int)m->pid,
		                      "port", m->port, "ctx", (json_int_t)m->ctx, "memory_bytes",
		                      (json_int_t)m->used, "in_flight", m->in_flight, "starts",
		                      m->starts, "draining", m->draining);
		json_object_set_new(e, "idle_s",
		                    m->state == PM_LOADED && m->in_flight == 0
		                        ? json_real((double)(now - m->last_used) / 1e6)
		                        : json_null());
		json_object_set_new(e, "ttl", json_integer(pool_model_ttl(p, m)));
		int queued = 0;
		for (struct pool_waiter *w = p->head; w; w = w->next)
			queued += w->m == m;
		json_object_set_new(e, "queued", json_integer(queued));
		json_object_set_new(e, "loads", json_integer(m->loads));
		json_object_set_new(e, "unloads", json_integer(m->unloads));
		json_object_set_new(e, "exits", json_integer(m->exits));
		json_object_set_new(e, "last_start_s", json_real(m->last_start_s));
		json_object_set_new(e, "total_start_s", json_real(m->total_start_s));
		json_object_set_new(e, "last_stop_s", json_real(m->last_stop_s));
		json_object_set_new(e, "saved_bytes", json_integer((json_int_t)m->saved_bytes));
		json_object_set_new(e, "restored_bytes",
		                    json_integer((json_int_t)m->restored_bytes));
		json_object_set_new(e, "cpu", json_boolean(m->cpu));
		json_object_set_new(e, "threads",
		                    m->threads ? json_integer(m->threads) : json_null());
		json_object_set_new(e, "computing", json_integer(m->computing));
		json_object_set_new(e, "turn_waits", json_integer(m->turn_waits));
		/* Its child's work after an answer, which holds the turn too. */
		json_object_set_new(e, "settling", json_boolean(m->settle != NULL));
		json_object_set_new(e, "settle_s", json_real(m->settle_s));
		if (m->error[0])
			json_object_set_new(e, "error", json_string(m->error));
		json_array_append_new(models, e);
	}
	json_t *o = json_pack("{s:b, s:o, s:i, s:I}", "endpoint", 1, "models", models, "waiting",
	                      waiting, "max_loaded", (json_int_t)pool_max_loaded(p));
	/* Who has the CPU turn (pool_pick.h): the model on the CPU that starts
	 * or computes, or the models that share it, their names joined by
	 * ", ". */
	struct strbuf turn = {0};
	for (int i = 0; i < p->n_models; i++) {
		const struct pool_model *m = p->models[i];
		if (m->cpu && pool_model_busy(m)) {
			if (turn.len)
				strbuf_appends(&turn, ", ");
			strbuf_appends(&turn, m->name);
		}
	}
	json_object_set_new(
	    o, "cpu_turn", turn.len && !turn.failed ? json_stringn(turn.p, turn.len) : json_null());
	strbuf_free(&turn);
	json_object_set_new(o, "cpus", json_integer(p->cpus));
	reply_json_obj(req, 200, o);
	json_decref(o);
}

/* The endpoint's own series (each model's own stay on its run's /metrics
 * for now); answered here, so that a scrape does not start a model. */
static void handle_metrics(struct pool *p, struct http_request *req)
{
	size_t cap = 2048 + (size_t)p->n_models * 3600, len = 0;
	char *out = malloc(cap);
	if (!out) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	int *queued = calloc((size_t)p->n_models + 1, sizeof *queued);
	if (!queued) {
		free(out);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	for (struct pool_waiter *w = p->head; w; w = w->next)
		for (int i = 0; i < p->n_models; i++)
			queued[i] += w->m == p->models[i];
#define PUT(...) len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, __VA_ARGS__)
/* One family: its TYPE line, then a line per model. */
#define FAMILY(fam, type, fmt, expr)                                                               \
	do {                                                                                       \
		PUT("# TYPE toki_endpoint_model_" fam " " type "\n");                              \
		for (int i = 0; i < p->n_models; i++) {                                            \
			const struct pool_model *m = p->models[i];                                 \
			PUT("toki_endpoint_model_" fam "{model=\"%s\"} " fmt "\n", m->name, expr); \
		}                                                                                  \
	} while (0)
	FAMILY("loaded", "gauge", "%d", m->state == PM_LOADED);
	FAMILY("starts_total", "counter", "%d", m->starts);
	FAMILY("in_flight", "gauge", "%d", m->in_flight);
	FAMILY("queued", "gauge", "%d", queued[i]);
	FAMILY("loads_total", "counter", "%d", m->loads);
	FAMILY("unloads_total", "counter", "%d", m->unloads);
	FAMILY("exits_total", "counter", "%d", m->exits);
	FAMILY("last_start_seconds", "gauge", "%.3f", m->last_start_s);
	FAMILY("start_seconds_total", "counter", "%.3f", m->total_start_s);
	FAMILY("last_stop_seconds", "gauge", "%.3f", m->last_stop_s);
	FAMILY("saved_bytes_total", "counter", "%llu", (unsigned long long)m->saved_bytes);
	FAMILY("restored_bytes_total", "counter", "%llu", (unsigned long long)m->restored_bytes);
	FAMILY("turn_waits_total", "counter", "%d", m->turn_waits);
#undef FAMILY
#undef PUT
	http_respond(req, 200, "text/plain; version=0.0.4", out, len < cap ? len : cap - 1);
	free(queued);
	free(out);
}

static void handle_health(struct pool *p, struct http_request *req)
{
	int loaded = 0;
	for (int i = 0; i < p->n_models; i++)
		loaded += p->models[i]->state == PM_LOADED;
	json_t *o =
	    json_pack("{s:s, s:i, s:i}", "status", "ok", "models", p->reg.n, "loaded", loaded);
	reply_json_obj(req, 200, o);
	json_decref(o);
}

/* The "model" a request names: its JSON body's, or for a GET its query's
 * model=. *out is "" when it names none. */
static void request_model(struct http_request *req, char *out, size_t n, int *stream, int *progress)
{
	out[0] = '\0';
	*stream = *progress = 0;
	size_t len = 0;
	const char *body = http_request_body(req, &len);
	if (body && len) {
		json_error_t jerr;
		json_t *o = json_loadb(body, len, JSON_BODY_FLAGS, &jerr);
		const char *s = json_string_value(json_object_get(o, "model"));
		if (s)
			snprintf(out, n, "%s", s);
		*stream = json_is_true(json_object_get(o, "stream"));
		*progress = json_is_true(json_object_get(o, "return_progress"));
		json_decref(o);
		if (*out)
			return;
	}
	http_query_param(http_request_query(req), "model", out, n);
}

void pool_handle(struct http_request *req, void *ctx)
{
	struct pool *p = ctx;
	const char *path = http_request_path(req);
	const char *method = http_request_method(req);
	if (!strcmp(path, "/health") || !strcmp(path, "/v1/health")) {
		handle_health(p, req);
		return;
	}
	if (!auth_check(p->cfg.token, http_request_header(req, "Authorization"),
	                http_request_header(req, "x-api-key"))) {
		http_response_header(req, "WWW-Authenticate", "Bearer realm=\"toki\"");
		http_respond_error(
		    req, 401,
		    "missing or wrong token: send the local token as Authorization: "
		    "Bearer <token> or x-api-key (see $TOKI_STATE_DIR/token, or TOKI_TOKEN)");
		return;
	}
	if (p->shutting_down) {
		http_respond_error(req, 503, "toki is shutting down");
		return;
	}
	if (!strcmp(path, "/v1/models") || !strcmp(path, "/models")) {
		if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
			http_respond_error(req, 405, "use GET");
			return;
		}
		pool_registry_refresh(p, 0);
		handle_models(p, req);
		return;
	}
	if (!strcmp(path, "/toki/stats")) {
		handle_stats(p, req);
		return;
	}
	if (!strcmp(path, "/metrics")) {
		handle_metrics(p, req);
		return;
	}
	int load_only = !strcmp(path, "/toki/load");
	if (load_only && strcmp(method, "POST")) {
		http_respond_error(req, 405, "use POST");
		return;
	}
	pool_registry_refresh(p, 0);
	char name[512];
	int stream, progress;
	request_model(req, name, sizeof name, &stream, &progress);
	int idx = pool_resolve(&p->reg, name);
	if (idx < 0) {
		char msg[2048];
		pool_unknown_message(&p->reg, name, msg, sizeof msg);
		log_info("pool: 404 %s %s: %s", method, path, msg);
		http_respond_error(req, 404, msg);
		return;
	}
	struct pool_model *m = pool_model_get(p, p->reg.models[idx].name);
	if (!m) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	/* Ready, and nobody queued ahead: straight on. */
	if (m->state == PM_LOADED && !m->draining && !p->head && !load_only &&
	    (!pool_request_computes(req) || pool_turn_free_for(p, m))) {
		pool_relay_start(p, m, req, 0);
		return;
	}
	pool_wait(p, m, req, load_only, stream, progress);
}
