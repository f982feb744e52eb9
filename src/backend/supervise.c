#include "backend/supervise.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"
#include "util/log.h"

extern char **environ;

struct supervisor {
	struct event_base *base;
	char **argv;
	char **env_extra;
	char *log_path;
	pid_t pid;
	int restarts;
	int stopping;
	int backoff_s;
	time_t started_at;
	struct plat_child_watch *children;
	struct event *restart_timer;
	void (*on_exit)(void *arg);
	void *on_exit_arg;
};

void supervisor_on_exit(struct supervisor *s, void (*fn)(void *arg), void *arg)
{
	s->on_exit = fn;
	s->on_exit_arg = arg;
}

static char **copy_strv(char *const v[])
{
	int n = 0;
	while (v && v[n])
		n++;
	char **c = calloc((size_t)n + 1, sizeof *c);
	if (!c)
		return NULL;
	for (int i = 0; i < n; i++) {
		c[i] = strdup(v[i]);
		if (!c[i]) {
			while (i--)
				free(c[i]);
			free(c);
			return NULL;
		}
	}
	return c;
}

static void free_strv(char **v)
{
	for (int i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

static int spawn(struct supervisor *s, char *err, size_t errlen)
{
	int fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", s->log_path, strerror(errno));
		return -1;
	}
	/* A process group of its own, so a terminal's ^C reaches only the
	 * daemon, which then stops it in order. */
	struct plat_spawn sp = {
	    .argv = s->argv,
	    .env_extra = s->env_extra,
	    .fd_in = -1,
	    .fd_out = fd,
	    .fd_err = fd,
	    .detach = PLAT_NEW_GROUP,
	};
	pid_t pid = plat_spawn(&sp, err, errlen);
	if (pid < 0) {
		close(fd);
		return -1;
	}
	close(fd);
	s->pid = pid;
	s->started_at = time(NULL);
	log_info("started llama-server (pid %d): %s", (int)pid, s->argv[0]);
	return 0;
}

static void restart_cb(evutil_socket_t fd, short what, void *arg)
{
	struct supervisor *s = arg;
	char err[256];
	if (s->stopping)
		return;
	if (spawn(s, err, sizeof err) != 0) {
		log_error("restarting llama-server failed: %s", err);
		struct timeval tv = {s->backoff_s, 0};
		evtimer_add(s->restart_timer, &tv);
		if (s->on_exit)
			s->on_exit(s->on_exit_arg);
	}
}

static void child_exited(pid_t p, int status, void *arg)
{
	struct supervisor *s = arg;
	if (p != s->pid)
		return;
	s->pid = 0;
	if (s->stopping)
		return;
	/* A server that ran for a while gets a quick restart; one that
	 * keeps dying backs off up to 30 s. */
	if (time(NULL) - s->started_at > 60)
		s->backoff_s = 1;
	else
		s->backoff_s = s->backoff_s ? (s->backoff_s * 2 > 30 ? 30 : s->backoff_s * 2) : 1;
	s->restarts++;
	if (WIFSIGNALED(status))
		log_error("llama-server (pid %d) was killed by signal %d; restarting in %d s "
		          "(restart %d)",
		          (int)p, WTERMSIG(status), s->backoff_s, s->restarts);
	else
		log_error("llama-server (pid %d) exited with status %d; restarting in %d s "
		          "(restart %d)",
		          (int)p, WEXITSTATUS(status), s->backoff_s, s->restarts);
	struct timeval tv = {s->backoff_s, 0};
	evtimer_add(s->restart_timer, &tv);
	if (s->on_exit)
		s->on_exit(s->on_exit_arg);
}

struct supervisor *supervisor_new(struct event_base *base, char *const argv[], const char *log_path,
                                  char *const env_extra[])
{
	struct supervisor *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->base = base;
	s->argv = copy_strv(argv);
	s->env_extra = env_extra ? copy_strv(env_extra) : NULL;
	s->log_path = strdup(log_path);
	s->restart_timer = evtimer_new(base, restart_cb, s);
	if (!s->argv || !s->log_path || !s->restart_timer || (env_extra && !s->env_extra)) {
		supervisor_free(s);
		return NULL;
	}
	return s;
}

int supervisor_start(struct supervisor *s, char *err, size_t errlen)
{
	if (!s->children) {
		s->children = plat_child_watch_new(s->base, child_exited, s);
		if (!s->children) {
			snprintf(err, errlen, "cannot watch for SIGCHLD");
			return -1;
		}
	}
	return spawn(s, err, errlen);
}

void supervisor_stop(struct supervisor *s, int timeout_s)
{
	s->stopping = 1;
	evtimer_del(s->restart_timer);
	if (!s->pid)
		return;
	if (plat_stop(s->pid, 0, timeout_s * 1000))
		log_warn("llama-server (pid %d) ignored SIGTERM; killed it", (int)s->pid);
	s->pid = 0;
}

int supervisor_restart_with(struct supervisor *s, const char *env, char *err, size_t errlen)
{
	int n = 0;
	while (s->env_extra && s->env_extra[n])
		n++;
	char **v = realloc(s->env_extra, ((size_t)n + 2) * sizeof *v);
	char *e = strdup(env);
	if (!v || !e) {
		if (v)
			s->env_extra = v;
		free(e);
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	v[n] = e;
	v[n + 1] = NULL;
	s->env_extra = v;
	supervisor_stop(s, 10);
	s->stopping = 0;
	return spawn(s, err, errlen);
}

json_t *supervisor_describe(const struct supervisor *s)
{
	json_t *argv = json_array(), *env = json_array();
	/* The port it listens on is picked at each start and says nothing
	 * of its answers. */
	for (int i = 0; argv && s->argv[i]; i++)
		json_array_append_new(
		    argv,
		    json_string(i > 0 && !strcmp(s->argv[i - 1], "--port") ? "*" : s->argv[i]));
	for (int i = 0; env && s->env_extra && s->env_extra[i]; i++)
		json_array_append_new(env, json_string(s->env_extra[i]));
	struct stat st;
	int have = stat(s->argv[0], &st) == 0;
	return json_pack("{s:o*, s:o*, s:I, s:I}", "argv", argv, "env", env, "size",
	                 (json_int_t)(have ? st.st_size : -1), "mtime",
	                 (json_int_t)(have ? st.st_mtime : -1));
}

int supervisor_devices_mention(const struct supervisor *s, const char *text)
{
	char *const argv[] = {s->argv[0], "--list-devices", NULL};
	struct plat_cmd c = {
	    .argv = argv,
	    .env_extra = s->env_extra,
	    .timeout_ms = 30000, /* loading a GPU backend takes seconds */
	    .merge_stderr = 1,
	};
	/* Its output is a few lines: a device a line. */
	char buf[16384];
	plat_run(&c, buf, sizeof buf, NULL, NULL);
	return strstr(buf, text) != NULL;
}

void supervisor_free(struct supervisor *s)
{
	if (!s)
		return;
	if (s->pid)
		supervisor_stop(s, 10);
	plat_child_watch_free(s->children);
	if (s->restart_timer)
		event_free(s->restart_timer);
	free_strv(s->argv);
	free_strv(s->env_extra);
	free(s->log_path);
	free(s);
}

pid_t supervisor_pid(const struct supervisor *s)
{
	return s->pid;
}

int supervisor_restarts(const struct supervisor *s)
{
	return s->restarts;
}
