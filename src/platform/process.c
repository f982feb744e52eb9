/* POSIX processes, the same on Linux, macOS and FreeBSD: spawn, wait, stop,
 * run-and-capture, and the child-exit watcher. Before this file toki forked
 * and waited in five places, each with its own timeout loop. */
#include "platform/os.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* In the child: never returns. Only async-signal-safe calls until exec
 * (dup2, open, setpgid, setsid, signal), then putenv, which is fine in a
 * child of a single-threaded caller and harmless otherwise: the copy of the
 * environment it touches is the child's own. */
static void child_exec(const struct plat_spawn *s)
{
	if (s->detach == PLAT_NEW_SESSION)
		setsid();
	else if (s->detach == PLAT_NEW_GROUP)
		setpgid(0, 0);
	int nul = open("/dev/null", O_RDWR);
	int in = s->fd_in >= 0 ? s->fd_in : nul;
	int out = s->fd_out >= 0 ? s->fd_out : nul;
	int er = s->fd_err >= 0 ? s->fd_err : nul;
	if (in >= 0)
		dup2(in, 0);
	if (out >= 0)
		dup2(out, 1);
	if (er >= 0)
		dup2(er, 2);
	for (int i = 0; s->env_extra && s->env_extra[i]; i++)
		putenv(s->env_extra[i]);
	/* The daemon ignores SIGPIPE; its children must not inherit that. */
	signal(SIGPIPE, SIG_DFL);
	if (s->file)
		execv(s->file, s->argv);
	else
		execvp(s->argv[0], s->argv);
	int e = errno;
	char msg[512];
	int len = snprintf(msg, sizeof msg, "toki: cannot run %s: %s\n",
	                   s->file ? s->file : s->argv[0], strerror(e));
	if (len > 0 && write(2, msg, (size_t)len) < 0)
		(void)0;
	_exit(127);
}

pid_t plat_spawn(const struct plat_spawn *s, char *err, size_t errlen)
{
	if (!s->argv || !s->argv[0]) {
		snprintf(err, errlen, "nothing to run");
		errno = EINVAL;
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0)
		child_exec(s);
	/* Both sides set the group, so a kill(-pid) right after the fork finds
	 * it whichever runs first. */
	if (s->detach == PLAT_NEW_GROUP)
		setpgid(pid, pid);
	return pid;
}

int plat_wait(pid_t pid, int timeout_ms, int *status)
{
	int st = 0;
	if (timeout_ms < 0) {
		pid_t r;
		while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
			;
		if (r != pid)
			return -1;
		if (status)
			*status = st;
		return 1;
	}
	int64_t deadline = now_ms() + timeout_ms;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			if (status)
				*status = st;
			return 1;
		}
		if (r < 0 && errno != EINTR)
			return -1;
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return 0;
		sleep_ms(left < 20 ? (int)left : 20);
	}
}

int plat_alive(pid_t pid)
{
	if (pid <= 0)
		return 0;
	/* A child of ours that exited is a zombie until reaped, and kill(pid,
	 * 0) still finds a zombie. */
	int st;
	if (waitpid(pid, &st, WNOHANG) == pid)
		return 0;
	if (kill(pid, 0) != 0 && errno != EPERM)
		return 0;
	/* One that another process has not reaped yet (toki serve in the
	 * foreground under a service manager or a shell) has exited all the
	 * same: toki down waited its whole timeout for it. */
	if (!plat_os_zombie(pid))
		return 1;
	/* Ours may have become a zombie since the waitpid above: reaped now,
	 * so that none is left behind. */
	(void)waitpid(pid, &st, WNOHANG);
	return 0;
}

int plat_stop(pid_t pid, int group, int timeout_ms)
{
	if (pid <= 0)
		return 0;
	pid_t target = group ? -pid : pid;
	if (kill(target, SIGTERM) != 0 && errno == ESRCH) {
		(void)plat_alive(pid); /* reaps it, when it is a zombie child */
		return 0;
	}
	int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	while (plat_alive(pid)) {
		if (now_ms() >= deadline) {
			kill(target, SIGKILL);
			/* Reap it, when it is ours; otherwise init does. */
			int st;
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			return 1;
		}
		sleep_ms(20);
	}
	return 0;
}

int plat_run(const struct plat_cmd *c, char *out, size_t n, int *overflow, int *timed_out)
{
	if (overflow)
		*overflow = 0;
	if (timed_out)
		*timed_out = 0;
	if (out && n)
		out[0] = '\0';
	int fds[2];
	if (plat_pipe(fds, 0) != 0)
		return -1;
	struct plat_spawn s = {
	    .argv = c->argv,
	    .env_extra = c->env_extra,
	    .fd_in = -1,
	    .fd_out = fds[1],
	    .fd_err = c->merge_stderr ? fds[1] : -1,
	    .detach = PLAT_NEW_GROUP,
	};
	char err[256];
	pid_t pid = plat_spawn(&s, err, sizeof err);
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return -1;
	}
	int timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 10000;
	int64_t deadline = now_ms() + timeout_ms;
	size_t got = 0;
	int late = 0, over = 0;
	for (;;) {
		int64_t left = deadline - now_ms();
		if (left <= 0) {
			late = 1;
			break;
		}
		struct pollfd p = {.fd = fds[0], .events = POLLIN};
		int pr = poll(&p, 1, (int)left);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			break;
		if (pr == 0)
			continue; /* the deadline check above ends it */
		char buf[4096];
		ssize_t r = read(fds[0], buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		/* Drained to the end so the child can finish, but kept only as
		 * far as it fits: a cut-off line could parse as a wrong number,
		 * so the caller is told. */
		size_t room = out && n ? n - 1 - got : 0;
		size_t take = (size_t)r < room ? (size_t)r : room;
		if (take) {
			memcpy(out + got, buf, take);
			got += take;
			out[got] = '\0';
		}
		if (take < (size_t)r && out)
			over = 1;
	}
	close(fds[0]);
	if (late)
		kill(-pid, SIGKILL);
	int st = 0;
	if (plat_wait(pid, -1, &st) != 1)
		return -1;
	if (overflow)
		*overflow = over;
	if (timed_out)
		*timed_out = late;
	if (late || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

struct plat_child_watch {
	struct event *ev;
	void (*fn)(pid_t pid, int status, void *arg);
	void *arg;
};

static void sigchld_cb(evutil_socket_t sig, short what, void *arg)
{
	struct plat_child_watch *w = arg;
	int status;
	pid_t p;
	while ((p = waitpid(-1, &status, WNOHANG)) > 0)
		w->fn(p, status, w->arg);
}

struct plat_child_watch *plat_child_watch_new(struct event_base *base,
                                              void (*fn)(pid_t pid, int status, void *arg),
                                              void *arg)
{
	struct plat_child_watch *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->fn = fn;
	w->arg = arg;
	w->ev = evsignal_new(base, SIGCHLD, sigchld_cb, w);
	if (!w->ev || event_add(w->ev, NULL) != 0) {
		plat_child_watch_free(w);
		return NULL;
	}
	return w;
}

void plat_child_watch_free(struct plat_child_watch *w)
{
	if (!w)
		return;
	if (w->ev)
		event_free(w->ev);
	free(w);
}
