/* The endpoint (pool.h): the registry's models as child `toki serve`
 * processes, started on demand, taking turns in memory, and the requests
 * relayed to them. */
#include "pool/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "api/api_error.h"
#include "api/auth.h"
#include "backend/backend_http.h"
#include "http/http_server.h"
#include "model/launch.h"
#include "model/memsize.h"
#include "model/registry.h"
#include "model/run.h"
#include "platform/platform.h"
#include "pool/pool_pick.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/paths.h"

enum pm_state { PM_UNLOADED, PM_STARTING, PM_LOADED, PM_STOPPING };

static const char *const state_names[] = {"unloaded", "loading", "loaded", "stopping"};

/* The client of one child: shared by the requests relayed to it, so that a
 * child that exits under them leaves their calls to end on their own
 * (freeing it would free their calls without a word to them). */
struct pool_conn {
	struct backend_http *http;
	int users;   /* relays using it */
	int retired; /* its child is gone: freed when the last relay ends */
};

static void conn_release(struct pool_conn *c)
{
	if (c && --c->users == 0 && c->retired) {
		backend_http_free(c->http);
		free(c);
	}
}

/* One registry model, by name: kept across registry re-reads, so that a
 * running child stays known. */
struct pool_model {
	struct pool *pool;
	char name[160];
	enum pm_state state;
	pid_t pid;
	int port;
	long ctx; /* the context it was sized to at its first start (kept, so
	             that its slot files' fingerprint holds across swaps) */
	long max_output;
	uint64_t used;      /* its memory at ctx */
	int in_flight;      /* requests relayed to it and not ended */
	int draining;       /* chosen to stop: new requests queue instead */
	int64_t last_used;  /* when its last request ended (us) */
	int64_t started_us; /* when its start began */
	int starts;
	long log_offset;        /* where its serve.log stood when it last started */
	int polls;              /* of its start */
	struct pool_conn *conn; /* while it runs */
	struct event *poll;     /* while starting: is it listening and healthy yet */
	struct backend_call *probe;
	char error[1200]; /* why its last start failed, for the waiters */
};

struct pool_waiter;

struct pool {
	struct event_base *base;
	struct pool_config cfg;
	struct http_server *http;
	char reg_path[4096];
	struct registry reg;
	struct timespec reg_mtime;
	off_t reg_size;
	struct pool_model **models;
	int n_models;
	struct pool_waiter *head, *tail; /* requests waiting for their model, in order */
	struct plat_child_watch *watch;
	struct event *tick, *sigint, *sigterm, *shutdown_poll;
	int shutting_down;
	int64_t shutdown_deadline;
	char self[4096]; /* the toki binary the children run */
	char info_path[4200];
};

/* A request waiting for its model; or `toki model use`'s load, which is
 * answered once the model is ready instead of relayed. */
struct pool_waiter {
	struct pool *p;
	struct pool_model *m;
	struct http_request *req;
	int load_only;
	int stream;    /* the client asked for a stream: keep-alives while it waits */
	int progress;  /* and for progress (return_progress): load events too */
	int64_t since; /* when it began to wait */
	int began;     /* the stream began with those keep-alives */
	int64_t deadline;
	struct event *keepalive;
	struct pool_waiter *next;
};

/* A request relayed to a child, as the child answers it. */
struct relay {
	struct pool *p;
	struct pool_model *m;
	struct pool_conn *conn;
	struct http_request *req;
	struct backend_call *call;
	int began;     /* the client's stream began (keep-alives, or the child's stream) */
	int streaming; /* the child answers with a stream: bytes go on as they come */
	int status;
	char ct[128];
	char *buf; /* a whole answer, until it ends */
	size_t len, cap;
};

static void pump(struct pool *p);

/* ---- the models ---- */

static struct pool_model *model_get(struct pool *p, const char *name)
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

static struct pool_model *model_by_pid(struct pool *p, pid_t pid)
{
	for (int i = 0; i < p->n_models; i++)
		if (p->models[i]->pid == pid && p->models[i]->state != PM_UNLOADED)
			return p->models[i];
	return NULL;
}

static int model_has_waiters(struct pool *p, const struct pool_model *m)
{
	for (struct pool_waiter *w = p->head; w; w = w->next)
		if (w->m == m)
			return 1;
	return 0;
}

static long model_ttl(struct pool *p, const struct pool_model *m)
{
	const struct registry_model *rm = registry_find(&p->reg, m->name);
	if (rm && rm->ttl > 0)
		return rm->ttl;
	return p->reg.ttl;
}

static long max_loaded(struct pool *p)
{
	return p->cfg.max_loaded > 0 ? p->cfg.max_loaded : p->reg.max_loaded;
}

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

/* ---- the waiters ---- */

static void waiter_unlink(struct pool *p, struct pool_waiter *w)
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

static void waiter_free(struct pool_waiter *w)
{
	if (w->keepalive)
		event_free(w->keepalive);
	free(w);
}

static void on_waiter_close(struct http_request *req, void *arg)
{
	struct pool_waiter *w = arg;
	struct pool *p = w->p;
	waiter_unlink(p, w);
	waiter_free(w);
	pump(p); /* a model it held back may now stop or start */
}

/* Ends a waiter with an error, in the stream when one began. */
static void waiter_fail(struct pool_waiter *w, int status, const char *msg)
{
	http_request_on_close(w->req, NULL, NULL);
	if (w->began) {
		char *body = api_error_body(status, msg, http_request_path(w->req));
		http_stream_write(w->req, "data: ", 6);
		if (body)
			http_stream_write(w->req, body, strlen(body));
		http_stream_write(w->req, "\n\n", 2);
		free(body);
		http_stream_end(w->req);
	} else {
		http_respond_error(w->req, status, msg);
	}
	waiter_free(w);
}

/* A streaming request that waits for its model gets SSE comments, so that
 * its client's idle timeout does not fire during the load. */
static void on_keepalive(evutil_socket_t fd, short what, void *arg)
{
	struct pool_waiter *w = arg;
	if (!w->began) {
		http_stream_begin(w->req, 200, "text/event-stream");
		w->began = 1;
	}
	char line[512];
	int n = snprintf(line, sizeof line, ": toki loading %s\n\n", w->m->name);
	http_stream_write(w->req, line, (size_t)n);
	if (w->progress) {
		/* A client that asked for llama-server's progress events gets the
		 * load's too, as an object of its own kind. */
		n = snprintf(line, sizeof line,
		             "data: {\"object\":\"toki.model.load\",\"model\":\"%s\",\"state\":"
		             "\"%s\",\"elapsed_ms\":%lld}\n\n",
		             w->m->name, state_names[w->m->state],
		             (long long)((clock_now_us() - w->since) / 1000));
		http_stream_write(w->req, line, (size_t)n);
	}
	struct timeval tv = {w->p->cfg.keepalive_ms / 1000, (w->p->cfg.keepalive_ms % 1000) * 1000};
	event_add(w->keepalive, &tv);
}

/* ---- the relay ---- */

static void relay_end(struct relay *r)
{
	struct pool_model *m = r->m;
	struct pool *p = r->p;
	m->in_flight--;
	m->last_used = clock_now_us();
	conn_release(r->conn);
	free(r->buf);
	free(r);
	pump(p);
}

static void on_relay_close(struct http_request *req, void *arg)
{
	struct relay *r = arg;
	backend_call_cancel(r->call);
	relay_end(r);
}

static void on_relay_head(struct backend_call *call, int status, void *arg)
{
	struct relay *r = arg;
	const char *ct = backend_call_header(call, "Content-Type");
	r->status = status;
	snprintf(r->ct, sizeof r->ct, "%s", ct ? ct : "application/json");
	if (strstr(r->ct, "text/event-stream")) {
		r->streaming = 1;
		if (!r->began)
			http_stream_begin(r->req, status, r->ct);
		r->began = 1;
	}
}

static void on_relay_data(struct backend_call *call, const char *data, size_t len, void *arg)
{
	struct relay *r = arg;
	if (r->streaming) {
		http_stream_write(r->req, data, len);
		return;
	}
	if (r->len + len + 1 > r->cap) {
		size_t cap = r->cap ? r->cap : 4096;
		while (cap < r->len + len + 1)
			cap *= 2;
		char *nb = realloc(r->buf, cap);
		if (!nb)
			return; /* the answer ends short; the client sees bad JSON */
		r->buf = nb;
		r->cap = cap;
	}
	memcpy(r->buf + r->len, data, len);
	r->len += len;
}

static void on_relay_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg)
{
	struct relay *r = arg;
	http_request_on_close(r->req, NULL, NULL);
	if (r->streaming) {
		http_stream_end(r->req);
	} else if (r->began) {
		/* Keep-alives began a stream and the child answered whole (an
		 * error, mostly): its body goes out as the stream's one event. */
		http_stream_write(r->req, "data: ", 6);
		http_stream_write(r->req, r->buf ? r->buf : "", r->len);
		http_stream_write(r->req, "\n\n", 2);
		http_stream_end(r->req);
	} else {
		http_respond(r->req, status, r->ct[0] ? r->ct : "application/json",
		             r->buf ? r->buf : "", r->len);
	}
	relay_end(r);
}

static void on_relay_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct relay *r = arg;
	int status = err == BACKEND_ERR_TIMEOUT ? 504 : 502;
	char msg[300];
	snprintf(msg, sizeof msg, "model %s: %s", r->m->name, backend_error_text(err));
	http_request_on_close(r->req, NULL, NULL);
	if (r->began) {
		char *body = api_error_body(status, msg, http_request_path(r->req));
		http_stream_write(r->req, "data: ", 6);
		if (body)
			http_stream_write(r->req, body, strlen(body));
		http_stream_write(r->req, "\n\n", 2);
		free(body);
		http_stream_end(r->req);
	} else {
		http_respond_error(r->req, status, msg);
	}
	relay_end(r);
}

static const struct backend_call_handlers relay_handlers = {
    .on_head = on_relay_head,
    .on_data = on_relay_data,
    .on_done = on_relay_done,
    .on_error = on_relay_error,
};

/* Sends the request on to its model's child, as it came. */
static void relay_start(struct pool *p, struct pool_model *m, struct http_request *req, int began)
{
	struct relay *r = calloc(1, sizeof *r);
	if (!r) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	r->p = p;
	r->m = m;
	r->req = req;
	r->began = began;
	const char *path = http_request_path(req);
	const char *q = http_request_query(req);
	char *target = malloc(strlen(path) + strlen(q) + 2);
	if (!target) {
		free(r);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	sprintf(target, "%s%s%s", path, *q ? "?" : "", q);
	const char *method = http_request_method(req);
	size_t len = 0;
	const char *body = http_request_body(req, &len);
	int has_body = strcmp(method, "GET") && strcmp(method, "HEAD");
	m->in_flight++;
	r->conn = m->conn;
	r->conn->users++;
	r->call =
	    backend_call_start(m->conn->http, !strcmp(method, "HEAD") ? "GET" : method, target,
	                       has_body ? body : NULL, has_body ? len : 0, &relay_handlers, r);
	free(target);
	if (!r->call) {
		m->in_flight--;
		conn_release(r->conn);
		free(r);
		http_respond_error(req, 500, "out of memory");
		return;
	}
	http_request_on_close(req, on_relay_close, r);
}

/* A waiter whose model is ready: relayed, or (a load) answered. */
static void waiter_serve(struct pool *p, struct pool_waiter *w)
{
	http_request_on_close(w->req, NULL, NULL);
	if (w->load_only) {
		json_t *o = json_pack("{s:s, s:s, s:I}", "model", w->m->name, "state", "loaded",
		                      "context_length", (json_int_t)w->m->ctx);
		char *s = json_dumps(o, 0);
		http_respond(w->req, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2);
		free(s);
		json_decref(o);
	} else {
		relay_start(p, w->m, w->req, w->began);
	}
	waiter_free(w);
}

/* ---- starting and stopping children ---- */

static void model_reset(struct pool_model *m)
{
	if (m->poll) {
		event_free(m->poll);
		m->poll = NULL;
	}
	if (m->probe) {
		backend_call_cancel(m->probe);
		m->probe = NULL;
	}
	if (m->conn) {
		m->conn->retired = 1;
		m->conn->users++;
		conn_release(m->conn);
		m->conn = NULL;
	}
	m->state = PM_UNLOADED;
	m->pid = 0;
	m->port = 0;
	m->draining = 0;
}

/* Every waiter of m ends with this error (a start that failed). */
static void fail_waiters(struct pool *p, struct pool_model *m, int status, const char *msg)
{
	struct pool_waiter *w = p->head;
	while (w) {
		struct pool_waiter *next = w->next;
		if (w->m == m) {
			waiter_unlink(p, w);
			waiter_fail(w, status, msg);
		}
		w = next;
	}
}

static void model_stop(struct pool *p, struct pool_model *m, const char *why)
{
	if (m->state != PM_LOADED && m->state != PM_STARTING)
		return;
	log_info("pool: stopping %s (pid %d): %s", m->name, (int)m->pid, why);
	if (m->probe) {
		backend_call_cancel(m->probe);
		m->probe = NULL;
	}
	if (m->poll) {
		event_free(m->poll);
		m->poll = NULL;
	}
	m->state = PM_STOPPING;
	kill(m->pid, SIGTERM);
}

static void on_probe_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg)
{
	struct pool_model *m = arg;
	m->probe = NULL;
	if (status != 200 || m->state != PM_STARTING)
		return; /* the next poll asks again */
	m->state = PM_LOADED;
	m->last_used = clock_now_us();
	if (m->poll) {
		event_free(m->poll);
		m->poll = NULL;
	}
	log_info("pool: %s is ready on port %d (%.1f s)", m->name, m->port,
	         (double)(clock_now_us() - m->started_us) / 1e6);
}

static void on_probe_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct pool_model *m = arg;
	m->probe = NULL;
}

static const struct backend_call_handlers probe_handlers = {
    .on_done = on_probe_done,
    .on_error = on_probe_error,
};

static void fail_waiters(struct pool *p, struct pool_model *m, int status, const char *msg);

/* How many times the child's llama-server exited since the child started
 * (its supervisor's log lines), and the last line llama-server wrote. A
 * server that cannot load its model is restarted by the child for ever;
 * the endpoint gives up on it after two. */
static int llama_exits(const struct pool_model *m, char *last, size_t n)
{
	int exits = 0;
	char path[4200], line[1024];
	last[0] = '\0';
	if (run_file_path(m->name, "serve.log", path, sizeof path) == 0) {
		FILE *f = fopen(path, "r");
		if (f && fseek(f, m->log_offset, SEEK_SET) == 0)
			while (fgets(line, sizeof line, f))
				exits += strstr(line, "toki error: llama-server (pid ") != NULL;
		if (f)
			fclose(f);
	}
	if (exits && run_file_path(m->name, "llama-server.log", path, sizeof path) == 0) {
		FILE *f = fopen(path, "r");
		while (f && fgets(line, sizeof line, f)) {
			line[strcspn(line, "\r\n")] = '\0';
			if (*line)
				snprintf(last, n, "%.400s", line);
		}
		if (f)
			fclose(f);
	}
	return exits;
}

/* While a child starts: once its serve.json names its pid and port, its
 * /health is asked until it answers 200 (its llama-server is up). */
static void on_start_poll(evutil_socket_t fd, short what, void *arg)
{
	struct pool_model *m = arg;
	if (m->state != PM_STARTING)
		return;
	if (++m->polls % 10 == 0) {
		char last[420];
		if (llama_exits(m, last, sizeof last) >= 2) {
			snprintf(
			    m->error, sizeof m->error,
			    "%s could not start: its llama-server exited while loading, twice; "
			    "it said: %s (see toki logs %s --llama)",
			    m->name, *last ? last : "nothing", m->name);
			log_error("pool: %s", m->error);
			struct pool *p = m->pool;
			model_stop(p, m, "its llama-server cannot start");
			fail_waiters(p, m, 503, m->error);
			return;
		}
	}
	if (!m->conn) {
		struct run_info ri;
		if (run_get(m->name, &ri) == 0 && ri.pid == m->pid && ri.port > 0) {
			char url[64], err[256], auth[200];
			m->port = ri.port;
			snprintf(url, sizeof url, "http://127.0.0.1:%d", ri.port);
			/* The child takes the same local token as the endpoint. */
			snprintf(auth, sizeof auth, "Bearer %s", m->pool->cfg.token);
			struct pool_conn *c = calloc(1, sizeof *c);
			if (c)
				c->http = backend_http_new(event_get_base(m->poll), url,
				                           m->pool->cfg.backend_timeout_s, err,
				                           sizeof err);
			if (c && c->http &&
			    backend_http_set_header(c->http, "Authorization", auth) == 0) {
				m->conn = c;
			} else if (c) {
				backend_http_free(c->http);
				free(c);
			}
		}
	}
	if (m->conn && !m->probe)
		m->probe = backend_call_start(m->conn->http, "GET", "/health", NULL, 0,
		                              &probe_handlers, m);
	struct timeval tv = {0, 100000};
	event_add(m->poll, &tv);
}

/* The reason a child gave for stopping: the last "toki serve: " line its
 * log got since offset, else "". */
static void child_error(const char *name, long offset, char *out, size_t n)
{
	out[0] = '\0';
	char log[4200];
	if (run_file_path(name, "serve.log", log, sizeof log) != 0)
		return;
	FILE *f = fopen(log, "r");
	if (!f)
		return;
	if (fseek(f, offset, SEEK_SET) == 0) {
		char line[1024];
		while (fgets(line, sizeof line, f)) {
			if (strncmp(line, "toki serve: ", 12) ||
			    !strncmp(line + 12, "listening", 9))
				continue;
			line[strcspn(line, "\r\n")] = '\0';
			snprintf(out, n, "%.600s", line + 12);
		}
	}
	fclose(f);
}

/* Sizes and starts m's child. 0, or -1 with m->error (its waiters are
 * failed by the caller). */
static int model_start(struct pool *p, struct pool_model *m, const struct registry_model *rm,
                       const struct launch_plan *plan)
{
	struct run_info ri;
	if (run_get(m->name, &ri) == 0) {
		snprintf(m->error, sizeof m->error,
		         "%s already runs as a run of its own (pid %d, port %d); stop it with toki "
		         "down %s",
		         m->name, (int)ri.pid, ri.port, m->name);
		return -1;
	}
	if (memsize_write_ctx(m->name, plan->ctx) != 0) {
		snprintf(m->error, sizeof m->error, "cannot record %s's context: %s", m->name,
		         strerror(errno));
		return -1;
	}
	char log[4200], pidpath[4200];
	if (run_file_path(m->name, "serve.log", log, sizeof log) != 0 ||
	    run_file_path(m->name, "serve.pid", pidpath, sizeof pidpath) != 0) {
		snprintf(m->error, sizeof m->error, "'%s' cannot be a run name", m->name);
		return -1;
	}
	char *argv[300];
	int a = 0;
	char ctx[32], slots[16], maxo[32], body_mb[32], ct[32];
	snprintf(ctx, sizeof ctx, "%ld", plan->ctx);
	snprintf(slots, sizeof slots, "%d", plan->slots);
	snprintf(maxo, sizeof maxo, "%ld", rm->max_output);
	snprintf(body_mb, sizeof body_mb, "%zu", p->cfg.max_body_bytes >> 20);
	snprintf(ct, sizeof ct, "%d", p->cfg.client_timeout_s);
	argv[a++] = p->self;
	argv[a++] = "serve";
	argv[a++] = "--model";
	argv[a++] = rm->path;
	argv[a++] = "--name";
	argv[a++] = m->name;
	argv[a++] = "--host";
	argv[a++] = "127.0.0.1";
	argv[a++] = "--port";
	argv[a++] = "0";
	argv[a++] = "--ctx";
	argv[a++] = ctx;
	argv[a++] = "--slots";
	argv[a++] = slots;
	argv[a++] = "--llama-server";
	argv[a++] = (char *)plan->binary;
	argv[a++] = "--max-body-mb";
	argv[a++] = body_mb;
	argv[a++] = "--client-timeout";
	argv[a++] = ct;
	if (rm->max_output > 0) {
		argv[a++] = "--max-output";
		argv[a++] = maxo;
	}
	if (p->cfg.mode) {
		argv[a++] = "--reuse";
		argv[a++] = (char *)p->cfg.mode;
	}
	/* The model id its server answers with is its registry name, as
	 * `toki model use` starts it (unless its own args give an --alias). */
	int has_alias = 0;
	for (int i = 0; i < rm->n_args && a < 280; i++) {
		has_alias |= !strcmp(rm->args[i], "--alias") || !strcmp(rm->args[i], "-a");
		argv[a++] = "--llama-arg";
		argv[a++] = rm->args[i];
	}
	if (!has_alias) {
		argv[a++] = "--llama-arg";
		argv[a++] = "--alias";
		argv[a++] = "--llama-arg";
		argv[a++] = m->name;
	}
	if (*plan->gfx_env) {
		argv[a++] = "--llama-env";
		argv[a++] = (char *)plan->gfx_env;
	}
	argv[a] = NULL;
	char dir[4200];
	snprintf(dir, sizeof dir, "%s", log);
	*strrchr(dir, '/') = '\0';
	if (paths_mkdir_p(dir, 0700) != 0) {
		snprintf(m->error, sizeof m->error, "cannot create %.600s: %s", dir,
		         strerror(errno));
		return -1;
	}
	int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	struct stat st;
	m->log_offset = logfd >= 0 && fstat(logfd, &st) == 0 ? (long)st.st_size : 0;
	struct plat_spawn sp = {
	    .argv = argv,
	    .file = p->self,
	    .fd_in = -1,
	    .fd_out = logfd,
	    .fd_err = logfd,
	    .detach = PLAT_SAME_GROUP,
	};
	char err[256];
	pid_t pid = plat_spawn(&sp, err, sizeof err);
	if (logfd >= 0)
		close(logfd);
	if (pid < 0) {
		snprintf(m->error, sizeof m->error, "cannot start toki serve for %s: %s", m->name,
		         err);
		return -1;
	}
	char pidtxt[32];
	int l = snprintf(pidtxt, sizeof pidtxt, "%d\n", (int)pid);
	plat_replace_file(pidpath, pidtxt, (size_t)l, 0600);
	m->pid = pid;
	m->ctx = plan->ctx;
	m->used = plan->used;
	m->max_output = rm->max_output;
	m->state = PM_STARTING;
	m->started_us = clock_now_us();
	m->starts++;
	m->polls = 0;
	m->error[0] = '\0';
	m->poll = event_new(p->base, -1, 0, on_start_poll, m);
	struct timeval tv = {0, 100000};
	if (m->poll)
		event_add(m->poll, &tv);
	log_info("pool: starting %s (start %d, pid %d): context %ld tokens per slot, %d slots, "
	         "log %s",
	         m->name, m->starts, (int)pid, plan->ctx, plan->slots, log);
	return 0;
}

/* Makes progress on the queue, in order: waiters whose model is ready are
 * served; the first whose model is not makes it start, or makes room for
 * it (stopping the least recently used idle model), or waits for room.
 * Later waiters for other unready models wait behind it. */
static void pump(struct pool *p)
{
	if (p->shutting_down)
		return;
	struct pool_model *blocked = NULL; /* the model at the head of the line */
	struct pool_waiter *w = p->head;
	while (w) {
		struct pool_waiter *next = w->next;
		struct pool_model *m = w->m;
		if (m->state == PM_LOADED && !m->draining) {
			waiter_unlink(p, w);
			waiter_serve(p, w);
		} else if (!blocked) {
			blocked = m;
		}
		w = next;
	}
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
		fail_waiters(p, m, 404, "that model left the registry");
		pump(p);
		return;
	}
	uint64_t held = 0;
	struct pool_view *v = calloc((size_t)p->n_models, sizeof *v);
	if (!v)
		return;
	int target = -1;
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *o = p->models[i];
		if (o == m)
			target = i;
		v[i].running = o->state != PM_UNLOADED;
		v[i].stoppable = o->state == PM_LOADED && o->in_flight == 0;
		v[i].last_used = o->last_used;
		v[i].used = o->used;
		if (v[i].running && o != m)
			held += o->used;
	}
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
		fail_waiters(p, m, 503, plan ? m->error : "out of memory");
		pump(p);
		return;
	}
	int pick = pool_pick(v, p->n_models, target, plan->used, plan->capacity, max_loaded(p));
	free(v);
	if (pick == POOL_FITS) {
		if (model_start(p, m, rm, plan) != 0) {
			log_error("pool: %s", m->error);
			fail_waiters(p, m, 503, m->error);
			free(plan);
			pump(p);
			return;
		}
	} else if (pick >= 0) {
		model_stop(p, p->models[pick], "making room");
	} else if (pick == POOL_NEVER) {
		snprintf(err, sizeof err, "refused: %s does not fit this machine: %s", m->name,
		         plan->why);
		fail_waiters(p, m, 503, err);
		free(plan);
		pump(p);
		return;
	} else {
		/* Every running model is busy: the least recently used takes no
		 * new requests, and stops once its last one ends. */
		struct pool_model *lru = NULL;
		for (int i = 0; i < p->n_models; i++) {
			struct pool_model *c = p->models[i];
			if (c != m && c->state == PM_LOADED &&
			    (!lru || c->last_used < lru->last_used))
				lru = c;
		}
		if (lru && !lru->draining) {
			lru->draining = 1;
			log_info("pool: %s waits for %s to finish its requests", m->name,
			         lru->name);
		}
	}
	free(plan);
}

static void on_child_exit(pid_t pid, int status, void *arg)
{
	struct pool *p = arg;
	struct pool_model *m = model_by_pid(p, pid);
	if (!m)
		return;
	enum pm_state was = m->state;
	log_info("pool: %s (pid %d) exited (%s %d)%s", m->name, (int)pid,
	         WIFSIGNALED(status) ? "signal" : "status",
	         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
	         was == PM_STOPPING ? "" : ", unasked");
	model_reset(m);
	char path[4200];
	if (was != PM_STOPPING && run_file_path(m->name, "serve.json", path, sizeof path) == 0) {
		/* A child that died without stopping its llama-server (killed,
		 * crashed) leaves it holding the model's memory: it goes too. */
		json_t *o = json_load_file(path, 0, NULL);
		pid_t lp = (pid_t)json_integer_value(json_object_get(o, "llama_pid"));
		if (lp > 0 && json_integer_value(json_object_get(o, "pid")) == pid)
			kill(lp, SIGKILL);
		json_decref(o);
		unlink(path);
	}
	if (run_file_path(m->name, "serve.pid", path, sizeof path) == 0)
		unlink(path);
	if (was == PM_STARTING) {
		char why[700];
		child_error(m->name, m->log_offset, why, sizeof why);
		snprintf(m->error, sizeof m->error, "%s could not start: %.600s (see toki logs %s)",
		         m->name, *why ? why : "its toki serve exited", m->name);
		log_error("pool: %s", m->error);
		fail_waiters(p, m, 503, m->error);
	}
	pump(p);
}

/* ---- the registry ---- */

/* Reads the registry again when its file changed; one that does not parse
 * is reported and the old one kept. */
static void registry_refresh(struct pool *p, int first)
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
		model_get(p, p->reg.models[i].name);
	if (!first)
		log_info("pool: registry read again: %d models", p->reg.n);
}

/* ---- the endpoint's own routes ---- */

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
		struct pool_model *m = model_get(p, rm->name);
		long ctx = model_ctx(m, rm);
		json_t *e = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", rm->name, "object",
		                      "model", "created", (json_int_t)0, "owned_by", "toki",
		                      "state", state_names[m ? m->state : PM_UNLOADED]);
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
		                      m->name, "state", state_names[m->state], "registered",
		                      registry_find(&p->reg, m->name) != NULL, "pid", (int)m->pid,
		                      "port", m->port, "ctx", (json_int_t)m->ctx, "memory_bytes",
		                      (json_int_t)m->used, "in_flight", m->in_flight, "starts",
		                      m->starts, "draining", m->draining);
		json_object_set_new(e, "idle_s",
		                    m->state == PM_LOADED && m->in_flight == 0
		                        ? json_real((double)(now - m->last_used) / 1e6)
		                        : json_null());
		json_object_set_new(e, "ttl", json_integer(model_ttl(p, m)));
		if (m->error[0])
			json_object_set_new(e, "error", json_string(m->error));
		json_array_append_new(models, e);
	}
	json_t *o = json_pack("{s:b, s:o, s:i, s:I}", "endpoint", 1, "models", models, "waiting",
	                      waiting, "max_loaded", (json_int_t)max_loaded(p));
	reply_json_obj(req, 200, o);
	json_decref(o);
}

/* The endpoint's own series (each model's own stay on its run's /metrics
 * for now); answered here, so that a scrape does not start a model. */
static void handle_metrics(struct pool *p, struct http_request *req)
{
	size_t cap = 512 + (size_t)p->n_models * 600, len = 0;
	char *out = malloc(cap);
	if (!out) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
#define PUT(...) len += (size_t)snprintf(out + len, cap - len, __VA_ARGS__)
	PUT("# TYPE toki_endpoint_model_loaded gauge\n");
	for (int i = 0; i < p->n_models; i++)
		PUT("toki_endpoint_model_loaded{model=\"%s\"} %d\n", p->models[i]->name,
		    p->models[i]->state == PM_LOADED);
	PUT("# TYPE toki_endpoint_model_starts_total counter\n");
	for (int i = 0; i < p->n_models; i++)
		PUT("toki_endpoint_model_starts_total{model=\"%s\"} %d\n", p->models[i]->name,
		    p->models[i]->starts);
	PUT("# TYPE toki_endpoint_model_in_flight gauge\n");
	for (int i = 0; i < p->n_models; i++)
		PUT("toki_endpoint_model_in_flight{model=\"%s\"} %d\n", p->models[i]->name,
		    p->models[i]->in_flight);
#undef PUT
	http_respond(req, 200, "text/plain; version=0.0.4", out, len < cap ? len : cap - 1);
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
		json_t *o = json_loadb(body, len, 0, &jerr);
		const char *s = json_string_value(json_object_get(o, "model"));
		if (s)
			snprintf(out, n, "%s", s);
		*stream = json_is_true(json_object_get(o, "stream"));
		*progress = json_is_true(json_object_get(o, "return_progress"));
		json_decref(o);
		if (*out)
			return;
	}
	const char *q = http_request_query(req);
	for (const char *k = q; k && *k;) {
		if (!strncmp(k, "model=", 6)) {
			size_t o = 0;
			for (const char *c = k + 6; *c && *c != '&' && o + 1 < n; c++) {
				unsigned hex;
				if (*c == '%' && c[1] && c[2] && sscanf(c + 1, "%2x", &hex) == 1) {
					out[o++] = (char)hex;
					c += 2;
				} else {
					out[o++] = *c == '+' ? ' ' : *c;
				}
			}
			out[o] = '\0';
			return;
		}
		k = strchr(k, '&');
		if (k)
			k++;
	}
}

static void pool_handle(struct http_request *req, void *ctx)
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
		registry_refresh(p, 0);
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
	registry_refresh(p, 0);
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
	struct pool_model *m = model_get(p, p->reg.models[idx].name);
	if (!m) {
		http_respond_error(req, 500, "out of memory");
		return;
	}
	/* Ready, and nobody queued ahead: straight on. */
	if (m->state == PM_LOADED && !m->draining && !p->head && !load_only) {
		relay_start(p, m, req, 0);
		return;
	}
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
		w->keepalive = event_new(p->base, -1, 0, on_keepalive, w);
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
	pump(p);
}

/* ---- time ---- */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pool *p = arg;
	if (p->shutting_down)
		return;
	registry_refresh(p, 0);
	int64_t now = clock_now_us();
	for (struct pool_waiter *w = p->head; w;) {
		struct pool_waiter *next = w->next;
		if (now > w->deadline) {
			waiter_unlink(p, w);
			char msg[300];
			snprintf(msg, sizeof msg, "timed out waiting for model %s", w->m->name);
			waiter_fail(w, 504, msg);
		}
		w = next;
	}
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *m = p->models[i];
		long ttl = model_ttl(p, m);
		if (m->state == PM_LOADED && m->in_flight == 0 && ttl > 0 &&
		    now - m->last_used > (int64_t)ttl * 1000000 && !model_has_waiters(p, m))
			model_stop(p, m, "idle past its ttl");
		else if (m->state == PM_LOADED && m->draining && m->in_flight == 0)
			model_stop(p, m, "making room");
		else if (m->state == PM_LOADED && m->in_flight == 0 &&
		         !registry_find(&p->reg, m->name) && !model_has_waiters(p, m))
			model_stop(p, m, "it left the registry");
	}
	pump(p);
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
		waiter_unlink(p, w);
		waiter_fail(w, 503, "toki is shutting down");
	}
	/* All at once: each saves its slots in its own time (up to 30 s). */
	for (int i = 0; i < p->n_models; i++) {
		struct pool_model *m = p->models[i];
		if (m->state == PM_LOADED || m->state == PM_STARTING)
			model_stop(p, m, "the endpoint stops");
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
	registry_refresh(p, 1);
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
	p->watch = plat_child_watch_new(p->base, on_child_exit, p);
	p->sigint = evsignal_new(p->base, SIGINT, on_signal, p);
	p->sigterm = evsignal_new(p->base, SIGTERM, on_signal, p);
	p->tick = event_new(p->base, -1, EV_PERSIST, on_tick, p);
	p->shutdown_poll = event_new(p->base, -1, 0, on_shutdown_poll, p);
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
		model_reset(p->models[i]);
		free(p->models[i]);
	}
	free(p->models);
	while (p->head) {
		struct pool_waiter *w = p->head;
		waiter_unlink(p, w);
		waiter_free(w);
	}
	plat_child_watch_free(p->watch);
	http_server_free(p->http);
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
