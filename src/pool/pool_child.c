/* A model's child: `toki serve --model` started for it (sized by the
 * pool's plan, on a private port, with the endpoint's token), polled until
 * its /health answers, stopped with SIGTERM (it saves its slots to
 * run/NAME/slots, and its next start restores them), and its exit: why it
 * did not start, and the llama-server it may leave behind. What starts and
 * stops whom is pool.c's (pool_pump). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "backend/backend_http.h"
#include "model/launch.h"
#include "model/llama_args.h"
#include "model/memsize.h"
#include "model/registry.h"
#include "model/run.h"
#include "platform/platform.h"
#include "pool/pool_impl.h"
#include "util/clock.h"
#include "util/json_body.h"
#include "util/log.h"
#include "util/paths.h"

void pool_conn_release(struct pool_conn *c)
{
	if (c && --c->users == 0 && c->retired) {
		/* Not freed here: the last user is often a relay's end, called from
		 * this client's own done or error callback, which frees its call
		 * after the handler returns (backend_http_free would free it first:
		 * a double free when a child dies under a request). */
		c->next_dead = c->pool->dead;
		c->pool->dead = c;
		event_active(c->pool->reap, 0, 0);
	}
}

void pool_conn_reap(struct pool *p)
{
	while (p->dead) {
		struct pool_conn *c = p->dead;
		p->dead = c->next_dead;
		backend_http_free(c->http);
		free(c);
	}
}

static struct pool_model *model_by_pid(struct pool *p, pid_t pid)
{
	for (int i = 0; i < p->n_models; i++)
		if (p->models[i]->pid == pid && p->models[i]->state != PM_UNLOADED)
			return p->models[i];
	return NULL;
}

/* The bytes of m's slot files (run/NAME/slots, where its toki serve saves
 * them: the data files, not their small index) written at or after since;
 * every one when since is NULL. */
static uint64_t slot_bytes(const char *name, const struct timespec *since)
{
	char dir[4200], path[4600];
	if (run_file_path(name, "slots", dir, sizeof dir) != 0)
		return 0;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	uint64_t sum = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (strncmp(de->d_name, "toki-", 5) != 0 || l < 9 ||
		    (strcmp(de->d_name + l - 4, ".bin") != 0 &&
		     strcmp(de->d_name + l - 4, ".zst") != 0))
			continue;
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
		if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (since &&
		    (st.st_mtim.tv_sec < since->tv_sec ||
		     (st.st_mtim.tv_sec == since->tv_sec && st.st_mtim.tv_nsec < since->tv_nsec)))
			continue;
		sum += (uint64_t)st.st_size;
	}
	closedir(d);
	return sum;
}

/* No more waiting for the child's idle: the turn is free of it. */
static void settle_cancel(struct pool_model *m)
{
	if (m->settle) {
		pool_model_settle_pause(m);
		backend_call_cancel(m->settle);
		m->settle = NULL;
	}
}

void pool_model_reset(struct pool_model *m)
{
	if (m->poll) {
		event_free(m->poll);
		m->poll = NULL;
	}
	if (m->probe) {
		backend_call_cancel(m->probe);
		m->probe = NULL;
	}
	settle_cancel(m);
	if (m->conn) {
		m->conn->retired = 1;
		m->conn->users++;
		pool_conn_release(m->conn);
		m->conn = NULL;
	}
	m->state = PM_UNLOADED;
	m->pid = 0;
	m->port = 0;
	m->draining = 0;
}

void pool_model_stop(struct pool *p, struct pool_model *m, const char *why)
{
	if (m->state != PM_LOADED && m->state != PM_STARTING)
		return;
	log_info("pool: stopping %s (pid %d): %s", m->name, (int)m->pid, why);
	if (m->probe) {
		backend_call_cancel(m->probe);
		m->probe = NULL;
	}
	settle_cancel(m);
	if (m->poll) {
		event_free(m->poll);
		m->poll = NULL;
	}
	/* Only a ready child's stop is an unload (a start given up on is not);
	 * its time runs to the exit, the slot save included. */
	m->stop_unloads = m->state == PM_LOADED;
	m->stop_began_us = clock_now_us();
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
	m->loads++;
	m->last_start_s = (double)(m->last_used - m->started_us) / 1e6;
	m->total_start_s += m->last_start_s;
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

/* ---- the work after an answer ----
 *
 * A child's answer is not the end of its work on the cores: in exact mode
 * a keep, a tail cut or (after a client left) the settle until llama-server
 * stops run after it, a token or a prefill's end each. A model on the CPU
 * keeps the turn until its child's GET /toki/idle says that nothing runs
 * there (the child holds the call until then, a second at most, and is
 * asked again while it still works), so that the next model does
 * not compute beside it (ggml's threads spin: two servers on the same
 * cores stall each other many times over). A child that stays busy longer
 * than the backend timeout, or does not answer, lets the turn go. */

static void settle_send(struct pool_model *m);

void pool_model_settle_pause(struct pool_model *m)
{
	if (m->settle && m->settle_from) {
		m->settle_s += (double)(clock_now_us() - m->settle_from) / 1e6;
		m->settle_from = 0;
	}
}

/* The turn is free of m's answers: the time it was held counted, the queue
 * run. */
static void settle_end(struct pool_model *m)
{
	pool_model_settle_pause(m);
	m->settle = NULL;
	pool_pump(m->pool);
}

static void on_settle_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct pool_model *m = arg;
	json_t *o = status == 200 ? json_loadb(body, len, JSON_BODY_FLAGS, NULL) : NULL;
	int idle = !o || !json_is_false(json_object_get(o, "idle"));
	json_decref(o);
	if (!idle &&
	    clock_now_us() - m->settle_since <= (int64_t)m->pool->cfg.backend_timeout_s * 1000000) {
		settle_send(m); /* still working: ask again */
		if (m->settle)
			return;
	} else if (!idle) {
		log_warn("pool: %s still works %d s after its last answer: the CPU turn goes on "
		         "without it",
		         m->name, m->pool->cfg.backend_timeout_s);
	}
	settle_end(m);
}

static void on_settle_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct pool_model *m = arg;
	log_debug("pool: %s: GET /toki/idle: %s", m->name, backend_error_text(err));
	settle_end(m);
}

static const struct backend_call_handlers settle_handlers = {
    .on_done = on_settle_done,
    .on_error = on_settle_error,
};

static void settle_send(struct pool_model *m)
{
	m->settle = backend_call_start(m->conn->http, "GET", "/toki/idle?wait_ms=1000", NULL, 0,
	                               &settle_handlers, m);
}

void pool_model_settle(struct pool_model *m)
{
	if (!m->cpu || m->state != PM_LOADED || !m->conn)
		return;
	int64_t now = clock_now_us();
	m->settle_since = now;
	if (!m->computing && !m->settle_from)
		m->settle_from = now;
	/* One call out covers every answer before it: the child answers it
	 * only once nothing runs there. */
	if (!m->settle)
		settle_send(m);
	if (!m->settle)
		m->settle_from = 0;
}

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
			pool_model_stop(p, m, "its llama-server cannot start");
			pool_fail_waiters(p, m, 503, m->error);
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
			if (c) {
				c->pool = m->pool;
				c->http = backend_http_new(event_get_base(m->poll), url,
				                           m->pool->cfg.backend_timeout_s, err,
				                           sizeof err);
			}
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
int pool_model_start(struct pool *p, struct pool_model *m, const struct registry_model *rm,
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
		has_alias |=
		    llama_arg_is(rm->args[i], "--alias") || llama_arg_is(rm->args[i], "-a");
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
	/* Restored bytes are the slot files this child finds: what it restores
	 * returning conversations from. Counted here rather than from the
	 * child's own restores because those are known only to the child
	 * (its /toki/stats, gone with it when it stops) and the endpoint must
	 * not start or ask a model to answer its own stats; a file no
	 * conversation comes back for is counted too. */
	m->restored_bytes += slot_bytes(m->name, NULL);
	clock_gettime(CLOCK_REALTIME, &m->start_wall);
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

void pool_on_child_exit(pid_t pid, int status, void *arg)
{
	struct pool *p = arg;
	struct pool_model *m = model_by_pid(p, pid);
	if (!m)
		return;
	enum pm_state was = m->state;
	/* Its saves: the slot files written since its start, the last ones at
	 * its SIGTERM (a killed child's saves before it died count too). */
	m->saved_bytes += slot_bytes(m->name, &m->start_wall);
	if (was == PM_STOPPING) {
		m->last_stop_s = (double)(clock_now_us() - m->stop_began_us) / 1e6;
		m->unloads += m->stop_unloads;
	} else {
		m->exits++;
	}
	log_info("pool: %s (pid %d) exited (%s %d)%s", m->name, (int)pid,
	         WIFSIGNALED(status) ? "signal" : "status",
	         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
	         was == PM_STOPPING ? "" : ", unasked");
	pool_model_reset(m);
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
		pool_fail_waiters(p, m, 503, m->error);
	}
	pool_pump(p);
}
