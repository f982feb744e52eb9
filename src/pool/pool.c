/* The endpoint (pool.h): the registry's models as child `toki serve`
 * processes, started on demand, taking turns in memory, and the requests
 * relayed to them. This file is the pool itself: its models (kept across
 * registry re-reads), the queue of requests waiting for their model, the
 * pump that serves, starts and stops for it, time (deadlines, ttls), and
 * the endpoint's start and stop. The map of the rest is src/pool/README.md. */
#include "pool/pool.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "api/api_error.h"
#include "http/http_server.h"
#include "model/launch.h"
#include "model/registry.h"
#include "model/run.h"
#include "platform/platform.h"
#include "pool/pool_impl.h"
#include "pool/pool_pick.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/paths.h"

const char *const pool_state_names[] = {"unloaded", "loading", "loaded", "stopping"};

/* ---- the models ---- */

struct pool_model *pool_model_get(struct pool *p, const char *name)
{
	for (int i = 0; i < p->n_models; i++)
		if (!strcmp(p->models[i]->name, name))
			return p->models[i];
	struct pool_model *m = calloc(1, sizeof *m);
	struct pool_model **grown = realloc(p->models, sizeof *grown * (size_t)(p->n_models + 1));
	if (!m || !grown) {
		free(m);
		if (grown)
			p->models = grown;
		return NULL;
	}
	p->models = grown;
	snprintf(m->name, sizeof m->name, "%s", name);
	m->pool = p;
	p->models[p->n_models++] = m;
	return m;
}

static int model_has_waiters(struct pool *p, const struct pool_model *m)
{
	for (struct pool_waiter *w = p->head; w; w = w->next)
		if (w->m == m)
			return 1;
	return 0;
}

long pool_model_ttl(struct pool *p, const struct pool_model *m)
{
	const struct registry_model *rm = registry_find(&p->reg, m->name);
	if (rm && rm->ttl > 0)
		return rm->ttl;
	return p->reg.ttl;
}

long pool_max_loaded(struct pool *p)
{
	return p->cfg.max_loaded > 0 ? p->cfg.max_loaded : p->reg.max_loaded;
}

/* ---- the waiters ---- */

void pool_waiter_unlink(struct pool *p, struct pool_waiter *w)
{
	struct pool_waiter **pp = &p->head;
	struct pool_waiter *prev = NULL;
	while (*pp && *pp != w) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = w->next;
	if (p->tail == w)
		p->tail = prev;
	w->next = NULL;
}

void pool_waiter_free(struct pool_waiter *w)
{
	if (w->keepalive)
		event_free(w->keepalive);
	free(w);
}

static void on_waiter_close(struct http_request *req, void *arg)
{
	struct pool_waiter *w = arg;
	struct pool *p = w->p;
	pool_waiter_unlink(p, w);
	pool_waiter_free(w);
	pool_pump(p); /* a model it held back may now stop or start */
}

/* Queues a request for its model, in order. */
void pool_wait(struct pool *p, struct pool_model *m, struct http_request *req, int load_only,
               int stream, int progress)
{
	struct pool_waiter *w = calloc(1, sizeof *w);
	if (!w) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	w->p = p;
	w->m = m;
	w->req = req;
	w->load_only = load_only;
	w->stream = stream && !load_only;
	w->progress = progress;
	w->since = clock_now_us();
	w->deadline = clock_now_us() + (int64_t)p->cfg.backend_timeout_s * 1000000;
	if (w->stream) {
		w->keepalive = event_new(p->base, -1, 0, pool_on_keepalive, w);
		struct timeval tv = {0, 250000};
		if (w->keepalive)
			event_add(w->keepalive, &tv);
	}
	if (p->tail)
		p->tail->next = w;
	else
		p->head = w;
	p->tail = w;
	http_request_on_close(req, on_waiter_close, w);
	pool_pump(p);
}

/* Every waiter of m ends with this error (a start that failed). */
void pool_fail_waiters(struct pool *p, struct pool_model *m, int status, const char *msg)
{
	struct pool_waiter *w = p->head;
	while (w) {
		struct pool_waiter *next = w->next;
		if (w->m == m) {
			pool_waiter_unlink(p, w);
			pool_waiter_fail(w, status, msg);
		}
		w = next;
	}
}

int pool_request_computes(const struct http_request *req)
{
	const char *method = http_request_method(req);
	return strcmp(method, "GET") && strcmp(method, "HEAD");
}

int pool_model_busy(const struct pool_model *m)
{
	return m->state == PM_STARTING || m->computing > 0 || m->settle;
}

/* Every model as pool_pick.h's choices see it. */
static void views_of(struct pool *p, struct pool_view *v)
{
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *o = p->models[i];
		v[i] = (struct pool_view){
		    .running = o->state != PM_UNLOADED,
		    .stoppable = o->state == PM_LOADED && o->in_flight == 0,
		    .last_used = o->last_used,
		    .used = o->used,
		    .stopping = o->state == PM_STOPPING,
		    .ready = o->state == PM_LOADED,
		    .group = registry_group_of(&p->reg, o->name) + 1,
		    .cpu = o->cpu,
		    .threads = o->threads,
		    .busy = pool_model_busy(o),
		    .takes = o->state == PM_LOADED && !o->draining,
		};
	}
}

static int model_index(struct pool *p, const struct pool_model *m)
{
	for (int i = 0; i < p->n_models; i++)
		if (p->models[i] == m)
			return i;
	return -1;
}

int pool_turn_free_for(struct pool *p, const struct pool_model *m)
{
	struct pool_view *v = calloc((size_t)p->n_models, sizeof *v);
	if (!v)
		return 0; /* it queues, and the pump decides */
	views_of(p, v);
	int i = model_index(p, m), free_now = i >= 0 && pool_turn_free(v, p->n_models, i, p->cpus);
	free(v);
	return free_now;
}

/* Serves the waiters whose model takes requests, where the CPU turn lets
 * them (pool_turn_queue). Returns the model of the first waiter whose
 * model does not take requests, or NULL. -1 when out of memory. */
static int serve_waiters(struct pool *p, struct pool_model **blocked)
{
	*blocked = NULL;
	int k = 0;
	for (struct pool_waiter *w = p->head; w; w = w->next)
		k++;
	if (!k)
		return 0;
	struct pool_view *v = calloc((size_t)p->n_models, sizeof *v);
	struct pool_queue_view *q = calloc((size_t)k, sizeof *q);
	unsigned char *go = calloc((size_t)k, 1);
	struct pool_waiter **ws = calloc((size_t)k, sizeof *ws);
	if (!v || !q || !go || !ws) {
		free(v);
		free(q);
		free(go);
		free(ws);
		return -1;
	}
	views_of(p, v);
	int j = 0;
	for (struct pool_waiter *w = p->head; w; w = w->next, j++) {
		ws[j] = w;
		q[j].model = model_index(p, w->m);
		q[j].computes = !w->load_only && pool_request_computes(w->req);
	}
	pool_turn_queue(v, p->n_models, q, k, p->cpus, go);
	for (j = 0; j < k; j++) {
		struct pool_waiter *w = ws[j];
		if (go[j]) {
			pool_waiter_unlink(p, w);
			pool_waiter_serve(p, w);
			continue;
		}
		if (!*blocked && !v[q[j].model].takes)
			*blocked = w->m;
		if (!v[q[j].model].takes && !w->m->turn_held)
			continue;
		/* It waits for the CPU turn (its model takes requests, or its
		 * start waits for the turn), which passes when the requests
		 * ahead end, each within a backend timeout of its own: that
		 * wait does not count against its own. */
		w->deadline = clock_now_us() + (int64_t)p->cfg.backend_timeout_s * 1000000;
		if (v[q[j].model].takes && !w->turn_waited) {
			w->turn_waited = 1;
			w->m->turn_waits++;
		}
	}
	free(v);
	free(q);
	free(go);
	free(ws);
	return 0;
}

/* Makes progress on the queue, in order: waiters whose model is ready are
 * served where the CPU turn lets them; the first whose model is not makes
 * it start (once the CPU turn is free, for a model on the CPU), or makes
 * room for it (stopping the least recently used idle model), or waits for
 * room. Later waiters for other unready models wait behind it. */
void pool_pump(struct pool *p)
{
	if (p->shutting_down)
		return;
	struct pool_model *blocked = NULL; /* the model at the head of the line */
	if (serve_waiters(p, &blocked) != 0)
		return;
	/* A start held for the CPU turn is the head of the line's only: one
	 * whose waiters left is logged and counted again when it next waits. */
	for (int i = 0; i < p->n_models; i++)
		if (p->models[i] != blocked)
			p->models[i]->turn_held = 0;
	if (!blocked || blocked->state != PM_UNLOADED) {
		/* Nobody waits for room: models held back to make some take
		 * requests again. */
		if (!blocked || blocked->state == PM_LOADED)
			for (int i = 0; i < p->n_models; i++)
				if (p->models[i]->draining && !model_has_waiters(p, p->models[i])) {
					log_info("pool: %s takes requests again",
					         p->models[i]->name);
					p->models[i]->draining = 0;
				}
		return;
	}
	struct pool_model *m = blocked;
	const struct registry_model *rm = registry_find(&p->reg, m->name);
	if (!rm) {
		pool_fail_waiters(p, m, 404, "that model left the registry");
		pool_pump(p);
		return;
	}
	uint64_t held = 0;
	struct pool_view *v = calloc((size_t)p->n_models, sizeof *v);
	if (!v)
		return;
	int target = model_index(p, m);
	views_of(p, v);
	for (int i = 0; i < p->n_models; i++)
		if (v[i].running && i != target)
			held += v[i].used;
	struct launch_opts o = {
	    .name = rm->name,
	    .model_path = rm->path,
	    .binary = rm->binary,
	    .ctx = m->ctx > 0 ? m->ctx : rm->ctx,
	    .max_output = rm->max_output,
	    .llama_args = rm->args,
	    .n_llama_args = rm->n_args,
	};
	struct launch_plan *plan = malloc(sizeof *plan);
	char err[768];
	if (!plan || launch_plan(&o, held, plan, err, sizeof err) != 0) {
		if (plan)
			snprintf(m->error, sizeof m->error, "%s", err);
		free(plan);
		free(v);
		pool_fail_waiters(p, m, 503, plan ? m->error : "out of memory");
		pool_pump(p);
		return;
	}
	int pick =
	    pool_pick(v, p->n_models, target, plan->used, plan->capacity, pool_max_loaded(p));
	m->cpu = v[target].cpu = !plan->gpu;
	m->threads = v[target].threads = plan->threads;
	if (pick == POOL_FITS && !pool_turn_free(v, p->n_models, target, p->cpus)) {
		/* Its load and self-test compute: it starts when the model on
		 * the CPU ends its requests (later ones on the CPU wait behind
		 * it). */
		if (!m->turn_held) {
			m->turn_held = 1;
			m->turn_waits++;
			log_info("pool: %s starts once the CPU is free (another model computes)",
			         m->name);
		}
	} else if (pick == POOL_FITS) {
		m->turn_held = 0;
		if (pool_model_start(p, m, rm, plan) != 0) {
			log_error("pool: %s", m->error);
			pool_fail_waiters(p, m, 503, m->error);
			free(plan);
			free(v);
			pool_pump(p);
			return;
		}
	} else if (pick >= 0) {
		pool_model_stop(p, p->models[pick], "making room");
	} else if (pick == POOL_NEVER) {
		snprintf(err, sizeof err, "refused: %s does not fit this machine: %s", m->name,
		         plan->why);
		pool_fail_waiters(p, m, 503, err);
		free(plan);
		free(v);
		pool_pump(p);
		return;
	} else if (pick == POOL_NEVER_GROUP) {
		/* Stopping a member would break the group, so it is refused
		 * rather than left waiting for room that never comes. */
		const struct registry_group *g = &p->reg.groups[v[target].group - 1];
		int off = snprintf(err, sizeof err,
		                   "refused: %s does not fit beside the running models of its "
		                   "group %s (",
		                   m->name, g->name);
		long k = 0;
		for (int i = 0; i < p->n_models && off > 0 && off < (int)sizeof err; i++)
			if (i != target && v[i].running && v[i].group == v[target].group)
				off += snprintf(err + off, sizeof err - (size_t)off, "%s%s",
				                k++ ? ", " : "", p->models[i]->name);
		long max = pool_max_loaded(p);
		char why[600];
		if (max > 0 && k >= max)
			snprintf(why, sizeof why, "max_loaded is %ld", max);
		else
			snprintf(why, sizeof why, "%s", plan->why);
		if (off > 0 && off < (int)sizeof err)
			snprintf(err + off, sizeof err - (size_t)off,
			         "): the group does not fit together: %s", why);
		pool_fail_waiters(p, m, 503, err);
		free(plan);
		free(v);
		pool_pump(p);
		return;
	} else {
		/* Every running model is busy: the least recently used takes no
		 * new requests, and stops once its last one ends. */
		int drain = pool_pick_drain(v, p->n_models, target);
		struct pool_model *lru = drain >= 0 ? p->models[drain] : NULL;
		if (lru && !lru->draining) {
			lru->draining = 1;
			log_info("pool: %s waits for %s to finish its requests", m->name,
			         lru->name);
		}
	}
	free(plan);
	free(v);
}

/* ---- the registry ---- */

/* Reads the registry again when its file changed; one that does not parse
 * is reported and the old one kept. */
void pool_registry_refresh(struct pool *p, int first)
{
	struct stat st;
	int exists = stat(p->reg_path, &st) == 0;
	if (!first && exists && st.st_mtim.tv_sec == p->reg_mtime.tv_sec &&
	    st.st_mtim.tv_nsec == p->reg_mtime.tv_nsec && st.st_size == p->reg_size)
		return;
	if (exists) {
		p->reg_mtime = st.st_mtim;
		p->reg_size = st.st_size;
	}
	struct registry r;
	char err[1024];
	if (registry_load_file(p->reg_path, &r, err, sizeof err) != 0) {
		log_error("pool: the registry has an error, keeping the one read before: %s", err);
		return;
	}
	registry_free(&p->reg);
	p->reg = r;
	for (int i = 0; i < p->reg.n; i++)
		pool_model_get(p, p->reg.models[i].name);
	if (!first)
		log_info("pool: registry read again: %d models", p->reg.n);
}

/* ---- time ---- */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pool *p = arg;
	if (p->shutting_down)
		return;
	pool_registry_refresh(p, 0);
	int64_t now = clock_now_us();
	for (struct pool_waiter *w = p->head; w;) {
		struct pool_waiter *next = w->next;
		if (now > w->deadline) {
			pool_waiter_unlink(p, w);
			char msg[300];
			snprintf(msg, sizeof msg, "timed out waiting for model %s", w->m->name);
			pool_waiter_fail(w, 504, msg);
		}
		w = next;
	}
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *m = p->models[i];
		long ttl = pool_model_ttl(p, m);
		if (m->state == PM_LOADED && m->in_flight == 0 && ttl > 0 &&
		    now - m->last_used > (int64_t)ttl * 1000000 && !model_has_waiters(p, m))
			pool_model_stop(p, m, "idle past its ttl");
		else if (m->state == PM_LOADED && m->draining && m->in_flight == 0)
			pool_model_stop(p, m, "making room");
		else if (m->state == PM_LOADED && m->in_flight == 0 &&
		         !registry_find(&p->reg, m->name) && !model_has_waiters(p, m))
			pool_model_stop(p, m, "it left the registry");
	}
	pool_pump(p);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	pool_conn_reap(arg);
}

static void on_shutdown_poll(evutil_socket_t fd, short what, void *arg)
{
	struct pool *p = arg;
	int left = 0;
	for (int i = 0; i < p->n_models; i++)
		left += p->models[i]->state != PM_UNLOADED;
	if (!left) {
		event_base_loopexit(p->base, NULL);
		return;
	}
	if (clock_now_us() > p->shutdown_deadline) {
		for (int i = 0; i < p->n_models; i++)
			if (p->models[i]->state != PM_UNLOADED && p->models[i]->pid > 0) {
				log_warn("pool: %s did not stop in time: killed",
				         p->models[i]->name);
				kill(p->models[i]->pid, SIGKILL);
			}
		p->shutdown_deadline = clock_now_us() + 5000000;
	}
	struct timeval tv = {0, 100000};
	event_add(p->shutdown_poll, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct pool *p = arg;
	if (p->shutting_down) {
		event_base_loopexit(p->base, NULL);
		return;
	}
	log_info("signal %d: stopping every model, then the endpoint", (int)sig);
	p->shutting_down = 1;
	http_server_stop_listening(p->http);
	while (p->head) {
		struct pool_waiter *w = p->head;
		pool_waiter_unlink(p, w);
		pool_waiter_fail(w, 503, "toki is shutting down");
	}
	/* All at once: each saves its slots in its own time (up to 30 s). */
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *m = p->models[i];
		if (m->state == PM_LOADED || m->state == PM_STARTING)
			pool_model_stop(p, m, "the endpoint stops");
	}
	p->shutdown_deadline = clock_now_us() + 40000000;
	on_shutdown_poll(-1, 0, p);
}

static void write_info(struct pool *p)
{
	char dir[4200];
	if (run_file_path(p->cfg.run_name, "serve.json", p->info_path, sizeof p->info_path) != 0)
		return;
	snprintf(dir, sizeof dir, "%s", p->info_path);
	*strrchr(dir, '/') = '\0';
	paths_mkdir_p(dir, 0700);
	json_t *o = json_pack("{s:i, s:s, s:i, s:s, s:s, s:b}", "pid", (int)getpid(), "host",
	                      p->cfg.host, "port", http_server_port(p->http), "name",
	                      p->cfg.run_name, "model", p->reg_path, "endpoint", 1);
	char *s = json_dumps(o, JSON_INDENT(2));
	if (s)
		plat_replace_file(p->info_path, s, strlen(s), 0600);
	free(s);
	json_decref(o);
}

int pool_serve(const struct pool_config *cfg)
{
	struct pool *p = calloc(1, sizeof *p);
	if (!p) {
		fprintf(stderr, "toki serve: out of memory\n");
		return 1;
	}
	p->cfg = *cfg;
	p->cpus = plat_cpus();
	if (paths_registry_file(p->reg_path, sizeof p->reg_path) != 0 ||
	    plat_self_exe(p->self, sizeof p->self) != 0) {
		fprintf(stderr, "toki serve: cannot find the registry or the toki binary\n");
		free(p);
		return 1;
	}
	char err[1024];
	if (registry_load_file(p->reg_path, &p->reg, err, sizeof err) != 0) {
		fprintf(stderr, "toki serve: %s\n", err);
		free(p);
		return 1;
	}
	pool_registry_refresh(p, 1);
	signal(SIGPIPE, SIG_IGN);
	p->base = event_base_new();
	struct http_server_limits limits;
	http_server_default_limits(&limits);
	limits.max_body_bytes = cfg->max_body_bytes;
	limits.idle_timeout_s = cfg->client_timeout_s;
	p->http =
	    p->base ? http_server_new(p->base, &limits, pool_handle, p, api_error_body) : NULL;
	if (p->http)
		http_server_set_cors(p->http, 1);
	if (!p->http || http_server_listen(p->http, cfg->host, cfg->port, err, sizeof err) != 0) {
		fprintf(stderr, "toki serve: %s\n", p->http ? err : "out of memory");
		return 1;
	}
	p->watch = plat_child_watch_new(p->base, pool_on_child_exit, p);
	p->sigint = evsignal_new(p->base, SIGINT, on_signal, p);
	p->sigterm = evsignal_new(p->base, SIGTERM, on_signal, p);
	p->tick = event_new(p->base, -1, EV_PERSIST, on_tick, p);
	p->shutdown_poll = event_new(p->base, -1, 0, on_shutdown_poll, p);
	p->reap = event_new(p->base, -1, 0, on_reap, p);
	struct timeval one_s = {1, 0};
	event_add(p->sigint, NULL);
	event_add(p->sigterm, NULL);
	event_add(p->tick, &one_s);
	write_info(p);
	log_info("endpoint for %d registry models (%s) on http://%s:%d", p->reg.n, p->reg_path,
	         cfg->host, http_server_port(p->http));
	printf("toki serve: listening on http://%s:%d\n", cfg->host, http_server_port(p->http));
	fflush(stdout);

	event_base_dispatch(p->base);

	unlink(p->info_path);
	for (int i = 0; i < p->n_models; i++) {
		pool_model_reset(p->models[i]);
		free(p->models[i]);
	}
	free(p->models);
	while (p->head) {
		struct pool_waiter *w = p->head;
		pool_waiter_unlink(p, w);
		pool_waiter_free(w);
	}
	plat_child_watch_free(p->watch);
	http_server_free(p->http);
	pool_conn_reap(p); /* the clients the lines above released */
	event_free(p->reap);
	event_free(p->sigint);
	event_free(p->sigterm);
	event_free(p->tick);
	event_free(p->shutdown_poll);
	event_base_free(p->base);
	registry_free(&p->reg);
	free(p);
	log_info("stopped");
	return 0;
}
