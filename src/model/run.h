/* Background runs: `toki model use` and `toki up` start `toki serve --model`
 * as a detached process that supervises its llama-server; `toki down` stops
 * it; `toki status` lists what runs. A run lives in $TOKI_STATE_DIR/run/<name>/:
 * serve.json (written by the daemon once it listens), serve.log, serve.pid,
 * llama-server.log, ctx (the effective context) and slots/. */
#ifndef TOKI_RUN_H
#define TOKI_RUN_H

#include <stddef.h>
#include <sys/types.h>

struct run_spec {
	const char *name;
	const char *model_path;
	const char *binary; /* llama-server */
	long ctx;	    /* per slot */
	int slots;
	long max_output;
	int port; /* toki's */
	const char *host;
	const char *mode; /* exact|fast, or NULL for the default */
	char *const *llama_args;
	int n_llama_args;
	char *const *llama_env; /* "K=V" */
	int n_llama_env;
	/* Become toki serve (exec) instead of starting it detached: what a
	 * service manager runs (toki service). run_start then returns only on
	 * failure. */
	int foreground;
	/* The endpoint for the registry (toki serve --registry) instead of one
	 * model: model_path, binary, ctx, slots and the llama fields unused. */
	int endpoint;
	int max_body_mb;      /* toki serve --max-body-mb, 0: its default */
	int client_timeout_s; /* toki serve --client-timeout, 0: its default */
};

struct run_info {
	char name[160];
	pid_t pid, llama_pid;
	int port, llama_port;
	long ctx, max_output;
	int slots;
	char model[4096];
	char host[64];
	char mode[16];
};

/* Whether toki serve could listen on host:port (host NULL: 127.0.0.1; port
 * 0: any, always free): 0, or -1 with why ("port 8787 is in use; pass
 * --port", naming the run that holds it when it is one of toki's). */
int run_check_port(const char *host, int port, char *err, size_t errlen);
/* Starts the run and waits (up to wait_s) until its /health answers 200.
 * endpoint gets "http://host:port". Fails if a run of that name is alive or
 * the port is taken. A start that fails leaves nothing running: toki serve
 * and the llama-server it started are stopped. */
int run_start(const struct run_spec *spec, int wait_s, char *endpoint, size_t n, char *err,
	      size_t errlen);
/* Stops a run (SIGTERM, then SIGKILL after timeout_s). */
int run_stop(const char *name, int timeout_s, char *err, size_t errlen);
/* The path of a file in a run's directory ($TOKI_STATE_DIR/run/NAME/FILE),
 * whether the run is alive or not: 0, or -1 for a name that cannot be a
 * run's or a path too long. */
int run_file_path(const char *name, const char *file, char *out, size_t n);
/* The live runs; *out is owned by the caller. */
int run_list(struct run_info **out, int *n);
/* One run's info if it is alive: 0, else -1. */
int run_get(const char *name, struct run_info *info);
/* The run's daemon as a client reaches it, "http://host:port": a wildcard
 * bind is reached on loopback, an IPv6 address goes in brackets. */
void run_info_url(const struct run_info *ri, char *url, size_t n);
/* GET http://127.0.0.1:port/path into a new buffer (or NULL). */
char *run_http_get(const char *host, int port, const char *path, long *status, int timeout_s);
/* The same as a POST of a JSON body. */
char *run_http_post(const char *host, int port, const char *path, const char *body, long *status,
                    int timeout_s);

#endif
