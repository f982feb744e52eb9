#include "backend/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
	struct event *sigchld;
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
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (pid == 0) {
		/* The child: its own process group, so a terminal's ^C reaches
		 * only the daemon, which then stops it in order. */
		setpgid(0, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		for (int i = 0; s->env_extra && s->env_extra[i]; i++)
			putenv(s->env_extra[i]);
		signal(SIGPIPE, SIG_DFL);
		execvp(s->argv[0], s->argv);
		dprintf(2, "toki: cannot run %s: %s\n", s->argv[0], strerror(errno));
		_exit(127);
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

static void sigchld_cb(evutil_socket_t sig, short what, void *arg)
{
	struct supervisor *s = arg;
	int status;
	pid_t p;
	while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
		if (p != s->pid)
			continue;
		s->pid = 0;
		if (s->stopping)
			continue;
		/* A server that ran for a while gets a quick restart; one that
		 * keeps dying backs off up to 30 s. */
		if (time(NULL) - s->started_at > 60)
			s->backoff_s = 1;
		else
			s->backoff_s =
			    s->backoff_s ? (s->backoff_s * 2 > 30 ? 30 : s->backoff_s * 2) : 1;
		s->restarts++;
		if (WIFSIGNALED(status))
			log_error(
			    "llama-server (pid %d) was killed by signal %d; restarting in %d s "
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
	s->sigchld = evsignal_new(base, SIGCHLD, sigchld_cb, s);
	s->restart_timer = evtimer_new(base, restart_cb, s);
	if (!s->argv || !s->log_path || !s->sigchld || !s->restart_timer ||
	    (env_extra && !s->env_extra)) {
		supervisor_free(s);
		return NULL;
	}
	return s;
}

int supervisor_start(struct supervisor *s, char *err, size_t errlen)
{
	event_add(s->sigchld, NULL);
	return spawn(s, err, errlen);
}

void supervisor_stop(struct supervisor *s, int timeout_s)
{
	s->stopping = 1;
	evtimer_del(s->restart_timer);
	if (!s->pid)
		return;
	kill(s->pid, SIGTERM);
	for (int i = 0; i < timeout_s * 10; i++) {
		int status;
		if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
			s->pid = 0;
			return;
		}
		usleep(100000);
	}
	log_warn("llama-server (pid %d) ignored SIGTERM; killing it", (int)s->pid);
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
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

int supervisor_devices_mention(const struct supervisor *s, const char *text)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0)
		return 0;
	pid_t pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return 0;
	}
	if (pid == 0) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		for (int i = 0; s->env_extra && s->env_extra[i]; i++)
			putenv(s->env_extra[i]);
		char *const argv[] = {s->argv[0], "--list-devices", NULL};
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	/* Its output is a few lines: a device a line. */
	char buf[16384];
	size_t len = 0;
	ssize_t got;
	while (len < sizeof buf - 1 && (got = read(fds[0], buf + len, sizeof buf - 1 - len)) != 0) {
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			break;
		len += (size_t)got;
	}
	close(fds[0]);
	buf[len] = '\0';
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return strstr(buf, text) != NULL;
}

void supervisor_free(struct supervisor *s)
{
	if (!s)
		return;
	if (s->pid)
		supervisor_stop(s, 10);
	if (s->sigchld)
		event_free(s->sigchld);
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
