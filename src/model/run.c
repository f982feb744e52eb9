#include "model/run.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"
#include "util/paths.h"

static int run_dir(const char *name, char *out, size_t n)
{
	char sub[300];
	if (!paths_is_safe_name(name))
		return -1;
	snprintf(sub, sizeof sub, "run/%s", name);
	return paths_state_sub(out, n, sub);
}

static int read_info(const char *dir, struct run_info *ri)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/serve.json", dir);
	json_error_t jerr;
	json_t *o = json_load_file(path, 0, &jerr);
	if (!json_is_object(o)) {
		json_decref(o);
		return -1;
	}
	memset(ri, 0, sizeof *ri);
	ri->pid = (pid_t)json_integer_value(json_object_get(o, "pid"));
	ri->llama_pid = (pid_t)json_integer_value(json_object_get(o, "llama_pid"));
	ri->port = (int)json_integer_value(json_object_get(o, "port"));
	ri->llama_port = (int)json_integer_value(json_object_get(o, "llama_port"));
	ri->ctx = (long)json_integer_value(json_object_get(o, "ctx"));
	ri->max_output = (long)json_integer_value(json_object_get(o, "max_output"));
	ri->slots = (int)json_integer_value(json_object_get(o, "slots"));
	const char *s;
	if ((s = json_string_value(json_object_get(o, "name"))))
		snprintf(ri->name, sizeof ri->name, "%s", s);
	if ((s = json_string_value(json_object_get(o, "model"))))
		snprintf(ri->model, sizeof ri->model, "%s", s);
	if ((s = json_string_value(json_object_get(o, "host"))))
		snprintf(ri->host, sizeof ri->host, "%s", s);
	if ((s = json_string_value(json_object_get(o, "mode"))))
		snprintf(ri->mode, sizeof ri->mode, "%s", s);
	json_decref(o);
	return plat_alive(ri->pid) ? 0 : -1;
}

int run_file_path(const char *name, const char *file, char *out, size_t n)
{
	char dir[4096];
	if (run_dir(name, dir, sizeof dir) != 0)
		return -1;
	int len = snprintf(out, n, "%s/%s", dir, file);
	return len < 0 || (size_t)len >= n ? -1 : 0;
}

int run_get(const char *name, struct run_info *info)
{
	char dir[4096];
	if (run_dir(name, dir, sizeof dir) != 0)
		return -1;
	return read_info(dir, info);
}

struct membuf {
	char *p;
	size_t n;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct membuf *m = arg;
	size_t add = size * nmemb;
	char *np = realloc(m->p, m->n + add + 1);
	if (!np)
		return 0;
	m->p = np;
	memcpy(m->p + m->n, data, add);
	m->n += add;
	m->p[m->n] = '\0';
	return add;
}

char *run_http_get(const char *host, int port, const char *path, long *status, int timeout_s)
{
	return run_http_post(host, port, path, NULL, status, timeout_s);
}

char *run_http_post(const char *host, int port, const char *path, const char *body, long *status,
                    int timeout_s)
{
	CURL *c = curl_easy_init();
	if (!c)
		return NULL;
	char url[512];
	snprintf(url, sizeof url, "http://%s:%d%s", host, port, path);
	struct membuf m = {0};
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)timeout_s);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	/* The local token (when the daemon asks for one) goes with every call. */
	char tokpath[4096], token[256] = "", hdr[300];
	struct curl_slist *hl = NULL;
	const char *envtok = getenv("TOKI_TOKEN");
	if (envtok && *envtok) {
		snprintf(token, sizeof token, "%s", envtok);
	} else if (paths_state_sub(tokpath, sizeof tokpath, "token") == 0) {
		FILE *f = fopen(tokpath, "r");
		if (f) {
			if (fgets(token, sizeof token, f))
				token[strcspn(token, "\r\n")] = '\0';
			fclose(f);
		}
	}
	if (*token) {
		snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", token);
		hl = curl_slist_append(hl, hdr);
	}
	if (body) {
		hl = curl_slist_append(hl, "Content-Type: application/json");
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	}
	if (hl)
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	CURLcode rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
	curl_slist_free_all(hl);
	curl_easy_cleanup(c);
	if (rc != CURLE_OK) {
		free(m.p);
		return NULL;
	}
	if (!m.p)
		m.p = calloc(1, 1);
	return m.p;
}

int run_check_port(const char *host, int port, char *err, size_t errlen)
{
	if (port <= 0)
		return 0; /* any free port */
	const char *h = host && *host ? host : "127.0.0.1";
	struct addrinfo hints = {0}, *ai = NULL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", port);
	int rc = getaddrinfo(h, portstr, &hints, &ai);
	if (rc) {
		snprintf(err, errlen, "cannot resolve %s: %s", h, gai_strerror(rc));
		return -1;
	}
	int fd = plat_socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
	int r = 0;
	if (fd < 0) {
		snprintf(err, errlen, "cannot open a socket: %s", strerror(errno));
		r = -1;
	} else {
		/* The option toki serve listens with (libevent's REUSEABLE): a
		 * port held only by closed connections is free to it. */
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
			int e = errno;
			r = -1;
			if (e != EADDRINUSE) {
				snprintf(err, errlen, "cannot listen on %s:%d: %s", h, port,
				         strerror(e));
			} else {
				/* Name the run that holds it, when it is one of ours. */
				struct run_info *runs = NULL;
				int nr = 0;
				const char *who = NULL;
				run_list(&runs, &nr);
				for (int i = 0; i < nr && !who; i++)
					if (runs[i].port == port)
						who = runs[i].name;
				if (who)
					snprintf(
					    err, errlen,
					    "port %d is in use by the run '%s' (toki down %s stops "
					    "it); pass --port",
					    port, who, who);
				else
					snprintf(err, errlen, "port %d is in use; pass --port",
					         port);
				free(runs);
			}
		}
		close(fd);
	}
	freeaddrinfo(ai);
	return r;
}

/* Stops everything a failed start left: toki serve first (it stops its
 * llama-server in order), then whatever of its session outlives it. */
static void stop_failed_start(pid_t pid)
{
	plat_stop(pid, 0, 10000);
	if (!plat_session_signal(pid, SIGTERM))
		return;
	for (int i = 0; i < 50 && plat_session_signal(pid, 0); i++)
		usleep(100000);
	plat_session_signal(pid, SIGKILL);
}

/* The last line toki serve wrote to its log after offset (where this start
 * began: the log keeps earlier runs) that says why it stopped ("toki serve:
 * ..."), or "" when there is none. */
static void last_serve_error(const char *log, long offset, char *out, size_t n)
{
	out[0] = '\0';
	FILE *f = fopen(log, "r");
	if (!f)
		return;
	if (fseek(f, offset, SEEK_SET) != 0) {
		fclose(f);
		return;
	}
	char line[1024];
	while (fgets(line, sizeof line, f)) {
		/* Its errors; not the line that says it listens (stdout goes to
		 * the same log). */
		if (strncmp(line, "toki serve: ", 12) != 0 ||
		    !strncmp(line + 12, "listening on ", 13))
			continue;
		line[strcspn(line, "\r\n")] = '\0';
		snprintf(out, n, "%.500s", line + 12);
	}
	fclose(f);
}

int run_start(const struct run_spec *spec, int wait_s, char *endpoint, size_t n, char *err,
	      size_t errlen)
{
	char dir[4096];
	if (run_dir(spec->name, dir, sizeof dir) != 0) {
		snprintf(err, errlen, "'%s' cannot be a run name", spec->name);
		return -1;
	}
	struct run_info ri;
	if (read_info(dir, &ri) == 0) {
		snprintf(err, errlen, "'%s' already runs (pid %d, http://%s:%d); stop it with toki down %s",
			 spec->name, (int)ri.pid, ri.host, ri.port, spec->name);
		return -1;
	}
	/* Before anything starts: a port that is taken would only be found
	 * after llama-server has loaded the model. */
	if (run_check_port(spec->host, spec->port, err, errlen) != 0)
		return -1;
	if (paths_mkdir_p(dir, 0700) != 0) {
		snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
		return -1;
	}
	char info[4200], log[4200];
	snprintf(info, sizeof info, "%s/serve.json", dir);
	snprintf(log, sizeof log, "%s/serve.log", dir);
	unlink(info);

	char self[4096];
	if (plat_self_exe(self, sizeof self) != 0) {
		snprintf(err, errlen, "cannot find the toki binary: %s", strerror(errno));
		return -1;
	}
	char *argv[200];
	int a = 0;
	char port[16], ctx[32], slots[16], maxo[32], body_mb[16], ct[16];
	snprintf(port, sizeof port, "%d", spec->port);
	snprintf(body_mb, sizeof body_mb, "%d", spec->max_body_mb);
	snprintf(ct, sizeof ct, "%d", spec->client_timeout_s);
	snprintf(ctx, sizeof ctx, "%ld", spec->ctx);
	snprintf(slots, sizeof slots, "%d", spec->slots > 0 ? spec->slots : 2);
	snprintf(maxo, sizeof maxo, "%ld", spec->max_output);
	argv[a++] = self;
	argv[a++] = "serve";
	if (spec->endpoint) {
		argv[a++] = "--registry";
	} else {
		argv[a++] = "--model";
		argv[a++] = (char *)spec->model_path;
		argv[a++] = "--slots";
		argv[a++] = slots;
	}
	argv[a++] = "--name";
	argv[a++] = (char *)spec->name;
	argv[a++] = "--port";
	argv[a++] = port;
	if (spec->host) {
		argv[a++] = "--host";
		argv[a++] = (char *)spec->host;
	}
	if (spec->max_body_mb > 0) {
		argv[a++] = "--max-body-mb";
		argv[a++] = body_mb;
	}
	if (spec->client_timeout_s > 0) {
		argv[a++] = "--client-timeout";
		argv[a++] = ct;
	}
	if (spec->ctx > 0) {
		argv[a++] = "--ctx";
		argv[a++] = ctx;
	}
	if (spec->max_output > 0) {
		argv[a++] = "--max-output";
		argv[a++] = maxo;
	}
	if (spec->binary && !spec->endpoint) {
		argv[a++] = "--llama-server";
		argv[a++] = (char *)spec->binary;
	}
	if (spec->mode) {
		argv[a++] = "--reuse";
		argv[a++] = (char *)spec->mode;
	}
	for (int i = 0; i < spec->n_llama_args && a < 190; i++) {
		argv[a++] = "--llama-arg";
		argv[a++] = spec->llama_args[i];
	}
	for (int i = 0; i < spec->n_llama_env && a < 196; i++) {
		argv[a++] = "--llama-env";
		argv[a++] = spec->llama_env[i];
	}
	argv[a] = NULL;

	struct stat log_st;
	long log_start = stat(log, &log_st) == 0 ? (long)log_st.st_size : 0;
	if (spec->foreground) {
		/* This process becomes toki serve, with the pid the service
		 * manager watches and toki down signals; its output goes to the
		 * run's log as a detached one's does. */
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (fd < 0) {
			snprintf(err, errlen, "cannot open %s: %s", log, strerror(errno));
			return -1;
		}
		char pidpath[4200], pidtxt[32];
		snprintf(pidpath, sizeof pidpath, "%s/serve.pid", dir);
		int l = snprintf(pidtxt, sizeof pidtxt, "%d\n", (int)getpid());
		if (plat_replace_file(pidpath, pidtxt, (size_t)l, 0600) != 0) {
			snprintf(err, errlen, "cannot write %s: %s", pidpath, strerror(errno));
			close(fd);
			return -1;
		}
		fprintf(stderr, "toki: %s runs in the foreground as toki serve (pid %d); log: %s\n",
		        spec->name, (int)getpid(), log);
		fflush(NULL);
		dup2(fd, 1);
		dup2(fd, 2);
		close(fd);
		execv(self, argv);
		int e = errno;
		unlink(pidpath);
		snprintf(err, errlen, "cannot run %s: %s", self, strerror(e));
		return -1;
	}
	/* Detached: a session of its own, outliving this command. */
	int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	struct plat_spawn sp = {
	    .argv = argv,
	    .file = self,
	    .fd_in = -1,
	    .fd_out = logfd,
	    .fd_err = logfd,
	    .detach = PLAT_NEW_SESSION,
	};
	pid_t pid = plat_spawn(&sp, err, errlen);
	if (logfd >= 0)
		close(logfd);
	if (pid < 0)
		return -1;
	char pidpath[4200], pidtxt[32];
	snprintf(pidpath, sizeof pidpath, "%s/serve.pid", dir);
	int pf = open(pidpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (pf >= 0) {
		int l = snprintf(pidtxt, sizeof pidtxt, "%d\n", (int)pid);
		if (write(pf, pidtxt, (size_t)l) < 0)
			(void)0;
		close(pf);
	}
	time_t deadline = time(NULL) + wait_s;
	int last_dot = 0;
	while (time(NULL) < deadline) {
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			/* It may have started llama-server before it failed (a port
			 * taken since the check): that one must not outlive it. */
			stop_failed_start(pid);
			unlink(pidpath);
			char why[600];
			last_serve_error(log, log_start, why, sizeof why);
			if (strstr(why, "Address already in use"))
				snprintf(err, errlen, "port %d is in use; pass --port (see %s)",
				         spec->port, log);
			else if (*why)
				snprintf(err, errlen, "toki serve could not start: %s (see %s)",
				         why, log);
			else if (WIFSIGNALED(status))
				snprintf(err, errlen,
				         "toki serve was killed at start (signal %d); see %s",
				         WTERMSIG(status), log);
			else
				snprintf(err, errlen,
				         "toki serve exited at start (status %d); see %s",
				         WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
			return -1;
		}
		if (read_info(dir, &ri) == 0) {
			long st = 0;
			char *body = run_http_get(ri.host, ri.port, "/health", &st, 2);
			free(body);
			if (st == 200) {
				snprintf(endpoint, n, "http://%s:%d", ri.host, ri.port);
				return 0;
			}
		}
		usleep(200000);
		if (isatty(2) && time(NULL) - last_dot >= 2) {
			fputc('.', stderr);
			last_dot = (int)time(NULL);
		}
	}
	/* A start that fails leaves nothing running: a half-loaded model would
	 * hold its memory while toki status reports nothing ready. */
	stop_failed_start(pid);
	unlink(pidpath);
	unlink(info);
	snprintf(err, errlen,
	         "the model did not become ready within %d s, so toki stopped it (--wait S gives "
	         "it longer); see %s and %s/llama-server.log",
	         wait_s, log, dir);
	return -1;
}

int run_stop(const char *name, int timeout_s, char *err, size_t errlen)
{
	struct run_info ri;
	if (run_get(name, &ri) != 0) {
		snprintf(err, errlen, "'%s' is not running", name);
		return -1;
	}
	/* A daemon this process started (toki diff's) is its child: plat_stop
	 * reaps it, since a zombie still answers kill(pid, 0) (toki diff
	 * waited the whole timeout). */
	if (plat_stop(ri.pid, 0, timeout_s * 1000) == 1) {
		if (ri.llama_pid > 0)
			kill(ri.llama_pid, SIGKILL);
		/* A detached run leads its own session: what it started (the
		 * endpoint's models and their llama-servers) goes with it. */
		plat_session_signal(ri.pid, SIGKILL);
	}
	return 0;
}

int run_list(struct run_info **out, int *n)
{
	*out = NULL;
	*n = 0;
	char base[4096];
	if (paths_state_sub(base, sizeof base, "run") != 0)
		return -1;
	DIR *d = opendir(base);
	if (!d)
		return 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!paths_is_safe_name(de->d_name))
			continue;
		char dir[4400];
		snprintf(dir, sizeof dir, "%s/%s", base, de->d_name);
		struct run_info ri;
		if (read_info(dir, &ri) != 0)
			continue;
		struct run_info *nr = realloc(*out, sizeof **out * (size_t)(*n + 1));
		if (!nr)
			break;
		*out = nr;
		(*out)[(*n)++] = ri;
	}
	closedir(d);
	return 0;
}

void run_info_url(const struct run_info *ri, char *url, size_t n)
{
	const char *h = ri->host;
	if (!*h || !strcmp(h, "0.0.0.0"))
		h = "127.0.0.1";
	else if (!strcmp(h, "::"))
		h = "::1";
	if (strchr(h, ':'))
		snprintf(url, n, "http://[%s]:%d", h, ri->port);
	else
		snprintf(url, n, "http://%s:%d", h, ri->port);
}
