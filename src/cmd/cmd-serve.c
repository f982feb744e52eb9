/* toki serve: the cache-routing daemon. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <event2/event.h>

#include "api/api_error.h"
#include "api/auth.h"
#include "backend/backend.h"
#include "cmd/cmd.h"
#include "daemon.h"
#include "http/http_server.h"
#include "model/llama_args.h"
#include "platform/platform.h"
#include "pool/pool.h"
#include "serve/serve.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/net.h"
#include "util/paths.h"
#include "backend/supervise.h"
#include "backend/slot_store.h"

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: toki serve --backend URL [--backend URL ...] [options]\n"
	        "\n"
	        "Runs the cache-routing daemon: an OpenAI-compatible API that sends each\n"
	        "request to the llama-server slot holding its longest token prefix.\n"
	        "\n"
	        "  --backend URL      a llama-server base URL (repeatable)\n"
	        "  --backend-key KEY  the key the backends run with (llama-server --api-key),\n"
	        "                     sent as Authorization: Bearer on every call to them\n"
	        "                     (default $TOKI_BACKEND_KEY; a managed backend started\n"
	        "                     with --llama-arg --api-key uses that key)\n"
	        "  --host ADDR        address to bind (default 127.0.0.1)\n"
	        "  --port N           port to bind (default 8787; 0 picks a free one)\n"
	        "  --allow-remote     allow binding to a non-loopback address\n"
	        "  --reuse MODE       exact (default): the answer is a function of the request\n"
	        "                     alone, byte-identical to the same request uncached\n"
	        "                     through toki (prompts evaluated in chunks that end\n"
	        "                     where messages start); fast: reuse every matching\n"
	        "                     token; grid: exact on llama-server's own schedule,\n"
	        "                     identical to llama-server's uncached answer\n"
	        "  --ubatch N         the backends' micro-batch size, -ub (default 512)\n"
	        "  --tokenize WHERE   local (default): toki applies the chat template and\n"
	        "                     tokenizes itself, for backends whose model file it can\n"
	        "                     read and whose probes match the server; server: always\n"
	        "                     ask the server (/apply-template, /tokenize)\n"
	        "  --keepalive-ms N   SSE keep-alive interval while the backend is silent\n"
	        "                     (default 5000)\n"
	        "  --max-body-mb N    largest request body accepted (default 64)\n"
	        "  --client-timeout S seconds a client has to send a request's head, then as\n"
	        "                     long for its body (plus one a 256 KiB), else 408; an\n"
	        "                     idle connection is closed after as long (default 60)\n"
	        "  --slot-dir DIR     the backends' --slot-save-path: toki saves a slot's\n"
	        "                     content there before evicting it and restores it later\n"
	        "  --slot-disk-mb N   cap on the files in --slot-dir (default: a quarter of the\n"
	        "                     free space there, at most 32 GiB)\n"
	        "  --slot-save-idle-ms N  save a slot's content once it has been idle this\n"
	        "                     long, so it survives a restart (default 5000; 0: only on\n"
	        "                     eviction and shutdown)\n"
	        "  --slot-compress L  store slot files zstd-compressed at level L (default 0:\n"
	        "                     off; f16 KV shrank 16%% at 1/9 the save speed here)\n"
	        "  --kv-settings S    for --backend: the llama-server settings that shape its KV\n"
	        "                     (e.g. \"-ctk q8_0 -fa on\"): part of the saved states'\n"
	        "                     fingerprint\n"
	        "\n"
	        "  --max-output N     cap on a request's output tokens (default: the context)\n"
	        "\n"
	        "Managed backend: instead of (or besides) --backend, toki starts llama-server\n"
	        "itself, restarts it if it dies, and stops it on exit:\n"
	        "  --model FILE       the GGUF to serve\n"
	        "  --llama-server BIN the llama-server to run (default $TOKI_LLAMA_SERVER,\n"
	        "                     else llama-server on PATH)\n"
	        "  --ctx N            context per slot (default: the model's training context)\n"
	        "  --slots N          parallel slots, -np (default 2)\n"
	        "  --llama-arg ARG    an extra llama-server argument (repeatable)\n"
	        "  --llama-env K=V    an extra environment variable for it (repeatable)\n"
	        "  --run-dir DIR      logs, slot files and serve.json (default\n"
	        "                     $TOKI_STATE_DIR/run/<model name>)\n"
	        "\n"
	        "Endpoint: one port for every model in the registry (what toki up runs\n"
	        "without --model):\n"
	        "  --registry         start each registry model's own toki serve --model on\n"
	        "                     its first request, route requests by their \"model\",\n"
	        "                     stop the least recently used idle one when another\n"
	        "                     does not fit (TOKI_MAX_LOADED, the registry's\n"
	        "                     max_loaded and ttl); its run is --name (endpoint)\n"
	        "\n"
	        "Every route but /health needs the local token (Authorization: Bearer, or\n"
	        "x-api-key): $TOKI_TOKEN, else $TOKI_STATE_DIR/token, created on first start.\n"
	        "\n"
	        "environment: TOKI_BACKEND_TIMEOUT (seconds, default 1800), TOKI_BACKEND_KEY,\n"
	        "TOKI_LOG, TOKI_LLAMA_SERVER, TOKI_STATE_DIR, TOKI_TOKEN\n");
}

static void on_llama_exit(void *arg)
{
	struct daemon *d = arg;
	/* The managed backend is the last one added. */
	backend_expect_restart(d->backends[d->n_backends - 1]);
}

static void every_second(evutil_socket_t fd, short what, void *arg)
{
	serve_expire_waiting(arg, clock_now_us());
	slot_store_tick(arg);
}

static void saved_then_exit(void *arg)
{
	struct daemon *d = arg;
	/* One more turn of the loop lets the last bytes reach the clients. */
	struct timeval tv = {0, 200000};
	event_base_loopexit(d->base, &tv);
}

/* A llama-server that this daemon starts and supervises. */
struct managed {
	const char *model, *binary, *run_dir, *name;
	long ctx;
	int slots;
	char *args[64];
	int n_args;
	char *env[64];
	int n_env;
	int port;
	char run_dir_buf[4096];
	char log_path[4200];
	char info_path[4200];
	char name_buf[160];
	char model_abs[4096];
};

/* The run name: --name, else the model file's name without .gguf, made safe
 * to use as a directory name. */
static void derive_name(struct managed *m)
{
	if (m->name) {
		snprintf(m->name_buf, sizeof m->name_buf, "%s", m->name);
		return;
	}
	const char *base = strrchr(m->model, '/');
	base = base ? base + 1 : m->model;
	if (snprintf(m->name_buf, sizeof m->name_buf, "%s", base) >= (int)sizeof m->name_buf)
		m->name_buf[128] = '\0'; /* a long file name: its start names the run */
	char *dot = strstr(m->name_buf, ".gguf");
	if (dot)
		*dot = '\0';
	for (char *p = m->name_buf; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
			*p = '_';
}

/* The settings of a managed llama-server that change what its KV holds or
 * how it is laid out, for the saved states' fingerprint: each option, and
 * the values it takes (LoRA adapters are read from the server itself,
 * backend.c; control vectors have no such route). */
static char *managed_kv_settings(const struct managed *m)
{
	static const struct {
		const char *name;
		int values;
	} kv_flags[] = {
	    {"-ctk", 1},
	    {"--cache-type-k", 1},
	    {"-ctv", 1},
	    {"--cache-type-v", 1},
	    {"-fa", 1},
	    {"--flash-attn", 1},
	    {"--rope-scaling", 1},
	    {"--rope-scale", 1},
	    {"--rope-freq-base", 1},
	    {"--rope-freq-scale", 1},
	    {"--yarn-orig-ctx", 1},
	    {"--yarn-ext-factor", 1},
	    {"--yarn-attn-factor", 1},
	    {"--yarn-beta-slow", 1},
	    {"--yarn-beta-fast", 1},
	    {"-ngl", 1},
	    {"--n-gpu-layers", 1},
	    {"--swa-full", 0},
	    {"--override-kv", 1},
	    {"--control-vector", 1},
	    {"--control-vector-scaled", 1},
	    {"--control-vector-layer-range", 2},
	};
	/* The same settings as llama-server reads them from its environment
	 * (toki serve's, with --llama-env over it). */
	static const char *const kv_env[] = {
	    "LLAMA_ARG_CACHE_TYPE_K",      "LLAMA_ARG_CACHE_TYPE_V",   "LLAMA_ARG_FLASH_ATTN",
	    "LLAMA_ARG_ROPE_SCALING_TYPE", "LLAMA_ARG_ROPE_SCALE",     "LLAMA_ARG_ROPE_FREQ_BASE",
	    "LLAMA_ARG_ROPE_FREQ_SCALE",   "LLAMA_ARG_YARN_ORIG_CTX",  "LLAMA_ARG_YARN_EXT_FACTOR",
	    "LLAMA_ARG_YARN_ATTN_FACTOR",  "LLAMA_ARG_YARN_BETA_SLOW", "LLAMA_ARG_YARN_BETA_FAST",
	    "LLAMA_ARG_N_GPU_LAYERS",      "LLAMA_ARG_SWA_FULL",
	};
	const char *env_val[sizeof kv_env / sizeof kv_env[0]];
	size_t cap = 64;
	for (size_t k = 0; k < sizeof kv_env / sizeof kv_env[0]; k++) {
		size_t nl = strlen(kv_env[k]);
		env_val[k] = getenv(kv_env[k]);
		for (int e = 0; e < m->n_env; e++)
			if (!strncmp(m->env[e], kv_env[k], nl) && m->env[e][nl] == '=')
				env_val[k] = m->env[e] + nl + 1; /* a later one wins */
		if (env_val[k])
			cap += nl + strlen(env_val[k]) + 2;
	}
	for (int i = 0; i < m->n_args; i++)
		cap += strlen(m->args[i]) + 1;
	char *s = calloc(1, cap);
	if (!s)
		return NULL;
	snprintf(s, cap, "ctx=%ld", m->ctx);
	for (int i = 0; i < m->n_args; i++) {
		for (size_t k = 0; k < sizeof kv_flags / sizeof kv_flags[0]; k++) {
			if (!llama_arg_is(m->args[i], kv_flags[k].name))
				continue;
			strcat(s, " ");
			strcat(s, kv_flags[k].name); /* as written with dashes */
			for (int v = 0; v < kv_flags[k].values && i + 1 < m->n_args; v++) {
				strcat(s, " ");
				strcat(s, m->args[++i]);
			}
			break;
		}
	}
	for (size_t k = 0; k < sizeof kv_env / sizeof kv_env[0]; k++) {
		if (!env_val[k])
			continue;
		strcat(s, " ");
		strcat(s, kv_env[k]);
		strcat(s, "=");
		strcat(s, env_val[k]);
	}
	return s;
}

/* The key a managed llama-server is started with (--api-key K among its
 * extra arguments), or NULL. llama-server takes several keys separated by
 * commas; toki needs one of them, the first. out holds it. */
static const char *managed_api_key(const struct managed *m, char *out, size_t n)
{
	for (int i = 0; i + 1 < m->n_args; i++) {
		if (!llama_arg_is(m->args[i], "--api-key"))
			continue;
		size_t len = strcspn(m->args[i + 1], ",");
		if (len == 0 || len >= n)
			return NULL;
		memcpy(out, m->args[i + 1], len);
		out[len] = '\0';
		return out;
	}
	return NULL;
}

/* A key goes into a header line: it must not break it. */
static int key_is_valid(const char *key)
{
	if (!*key)
		return 0;
	for (const char *p = key; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return 0;
	return 1;
}

static int prepare_managed(struct managed *m, struct daemon *d, char *url, size_t urllen,
                           char *slot_dir, size_t slotlen)
{
	/* serve.json and the logs name the model by its absolute path. */
	if (!realpath(m->model, m->model_abs)) {
		fprintf(stderr, "toki serve: %s: %s\n", m->model, strerror(errno));
		return -1;
	}
	m->model = m->model_abs;
	derive_name(m);
	if (!paths_is_safe_name(m->name_buf)) {
		fprintf(stderr, "toki serve: '%s' cannot be a run name\n", m->name_buf);
		return -1;
	}
	if (!m->run_dir) {
		char sub[300];
		snprintf(sub, sizeof sub, "run/%s", m->name_buf);
		if (paths_state_sub(m->run_dir_buf, sizeof m->run_dir_buf, sub) != 0) {
			fprintf(stderr, "toki serve: state directory path too long\n");
			return -1;
		}
		m->run_dir = m->run_dir_buf;
	}
	if (snprintf(slot_dir, slotlen, "%s/slots", m->run_dir) >= (int)slotlen ||
	    snprintf(m->log_path, sizeof m->log_path, "%s/llama-server.log", m->run_dir) >=
	        (int)sizeof m->log_path ||
	    snprintf(m->info_path, sizeof m->info_path, "%s/serve.json", m->run_dir) >=
	        (int)sizeof m->info_path) {
		fprintf(stderr, "toki serve: run directory path too long\n");
		return -1;
	}
	if (paths_mkdir_p(slot_dir, 0700) != 0) {
		fprintf(stderr, "toki serve: cannot create %s: %s\n", slot_dir, strerror(errno));
		return -1;
	}
	if (!m->binary) {
		const char *env = getenv("TOKI_LLAMA_SERVER");
		m->binary = env && *env ? env : "llama-server";
	}
	m->port = plat_free_port();
	if (m->port <= 0) {
		fprintf(stderr, "toki serve: no free port for llama-server\n");
		return -1;
	}
	snprintf(url, urllen, "http://127.0.0.1:%d", m->port);
	/* Toki's own slot files take the place of llama-server's RAM cache,
	 * which exact mode cannot see into. */
	(void)d;
	return 0;
}

static int start_managed(struct managed *m, struct daemon *d)
{
	char *argv[160];
	int n = 0;
	char port[16], np[16], ctx[32], ub[16], slot_dir[4200];
	snprintf(port, sizeof port, "%d", m->port);
	snprintf(np, sizeof np, "%d", m->slots);
	snprintf(ctx, sizeof ctx, "%ld", m->ctx * m->slots);
	snprintf(ub, sizeof ub, "%d", d->cfg.n_ubatch);
	if (snprintf(slot_dir, sizeof slot_dir, "%s/slots", m->run_dir) >= (int)sizeof slot_dir)
		return -1;
	argv[n++] = (char *)m->binary;
	argv[n++] = "-m";
	argv[n++] = (char *)m->model;
	argv[n++] = "--host";
	argv[n++] = "127.0.0.1";
	argv[n++] = "--port";
	argv[n++] = port;
	argv[n++] = "-np";
	argv[n++] = np;
	if (m->ctx > 0) {
		argv[n++] = "-c";
		argv[n++] = ctx;
	}
	argv[n++] = "-ub";
	argv[n++] = ub;
	argv[n++] = "--cache-ram";
	argv[n++] = "0";
	argv[n++] = "--slot-save-path";
	argv[n++] = slot_dir;
	/* Its series, labelled, in toki's /metrics (docs/metrics.md). */
	argv[n++] = "--metrics";
	for (int i = 0; i < m->n_args; i++)
		argv[n++] = m->args[i];
	argv[n] = NULL;
	m->env[m->n_env] = NULL;
	d->supervisor = supervisor_new(d->base, argv, m->log_path, m->n_env ? m->env : NULL);
	char err[256];
	if (!d->supervisor || supervisor_start(d->supervisor, err, sizeof err) != 0) {
		fprintf(stderr, "toki serve: cannot start llama-server: %s\n",
		        d->supervisor ? err : "out of memory");
		return -1;
	}
	supervisor_on_exit(d->supervisor, on_llama_exit, d);
	log_info("managing llama-server for %s on port %d (log %s)", m->model, m->port,
	         m->log_path);
	return 0;
}

/* serve.json: what runs, for toki status and toki down. */
static void write_serve_info(struct managed *m, struct daemon *d)
{
	json_t *o =
	    json_pack("{s:i, s:s, s:i, s:i, s:s, s:s, s:I, s:i, s:s, s:s}", "pid", (int)getpid(),
	              "host", d->cfg.host, "port", http_server_port(d->http), "llama_port", m->port,
	              "model", m->model, "name", m->name_buf, "ctx", (json_int_t)m->ctx, "slots",
	              m->slots, "mode", reuse_mode_name(d->cfg.mode), "llama_log", m->log_path);
	json_object_set_new(o, "llama_pid", json_integer(supervisor_pid(d->supervisor)));
	json_object_set_new(o, "max_output", json_integer(d->cfg.max_output));
	char tmp[4300];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", m->info_path) < (int)sizeof tmp &&
	    json_dump_file(o, tmp, JSON_INDENT(2)) == 0)
		rename(tmp, m->info_path);
	json_decref(o);
}

static void save_then_exit(void *arg)
{
	struct daemon *d = arg;
	slot_store_save_all(d, 30, saved_then_exit, d);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;
	if (d->shutting_down) {
		event_base_loopexit(d->base, NULL);
		return;
	}
	log_info("signal %d: shutting down", (int)sig);
	d->shutting_down = 1;
	http_server_stop_listening(d->http);
	/* What the slots hold is saved, so that it survives the restart: once
	 * the answered requests' last calls (exact mode's tail cuts) are done,
	 * and the slots' records say what they hold. */
	serve_drain(d, "toki is shutting down", 5000, save_then_exit, d);
}

/* --reuse: the mode, and whether it was given (the endpoint passes it on). */
struct reuse_arg {
	enum reuse_mode *mode;
	int set;
};

/* toki serve --registry: the endpoint (src/pool/). Only the options that
 * concern a front end apply; each model's own come from the registry. */
static int serve_registry(const struct daemon_config *c, const char *name, const char *mode,
                          int argc, char **argv)
{
	if (optind < argc || c->port < 0 || c->port > 65535 || c->max_body_bytes == 0 ||
	    c->client_timeout_s <= 0 || c->keepalive_ms <= 0) {
		usage(stderr);
		return 2;
	}
	if (!net_host_is_loopback(c->host) && !c->allow_remote) {
		fprintf(stderr,
		        "toki serve: refusing to bind %s, which is not loopback: anyone who can "
		        "reach it could use your models. Pass --allow-remote to do it anyway.\n",
		        c->host);
		return 2;
	}
	char token[128], terr[512];
	if (auth_load_token(token, sizeof token, terr, sizeof terr) != 0) {
		fprintf(stderr, "toki serve: %s\n", terr);
		return 1;
	}
	const char *env_max = getenv("TOKI_MAX_LOADED");
	struct pool_config pc = {
	    .host = c->host,
	    .port = c->port,
	    .run_name = name ? name : "endpoint",
	    .max_body_bytes = c->max_body_bytes,
	    .client_timeout_s = c->client_timeout_s,
	    .keepalive_ms = c->keepalive_ms,
	    .backend_timeout_s = c->backend_timeout_s,
	    .mode = mode,
	    .token = token,
	    .max_loaded = env_max ? atol(env_max) : 0,
	};
	if (!paths_is_safe_name(pc.run_name)) {
		fprintf(stderr, "toki serve: '%s' cannot be a run name\n", pc.run_name);
		return 2;
	}
	return pool_serve(&pc);
}

/* --backend URL: collected in order, at most 64. */
struct backend_urls {
	const char **v;
	int n;
};

static int backend_opt(const char *value, void *ctx)
{
	struct backend_urls *u = ctx;
	if (u->n == 64) {
		fprintf(stderr, "toki serve: at most 64 backends\n");
		return 2;
	}
	u->v[u->n++] = value;
	return 0;
}

static int reuse_opt(const char *value, void *ctx)
{
	struct reuse_arg *a = ctx;
	a->set = 1;
	if (reuse_mode_parse(value, a->mode) != 0) {
		fprintf(stderr, "toki serve: --reuse takes exact, fast or grid\n");
		return 2;
	}
	return 0;
}

static int max_body_opt(const char *value, void *ctx)
{
	*(size_t *)ctx = (size_t)atoi(value) << 20;
	return 0;
}

static int slot_disk_opt(const char *value, void *ctx)
{
	*(uint64_t *)ctx = (uint64_t)atoll(value) << 20;
	return 0;
}

static int tokenize_opt(const char *value, void *ctx)
{
	if (strcmp(value, "local") && strcmp(value, "server")) {
		fprintf(stderr, "toki serve: --tokenize is local or server\n");
		return 2;
	}
	*(int *)ctx = !strcmp(value, "local");
	return 0;
}

/* --llama-arg and --llama-env: passed on in order, at most 63 of each. The
 * value is an argv string, so not const underneath. */
static int llama_push(char **v, int *nv, const char *value)
{
	if (*nv == 63) {
		fprintf(stderr, "toki serve: too many --llama-arg/--llama-env\n");
		return 2;
	}
	v[(*nv)++] = (char *)value;
	return 0;
}

static int llama_arg_opt(const char *value, void *ctx)
{
	struct managed *m = ctx;
	return llama_push(m->args, &m->n_args, value);
}

static int llama_env_opt(const char *value, void *ctx)
{
	struct managed *m = ctx;
	return llama_push(m->env, &m->n_env, value);
}

int cmd_serve(int argc, char **argv)
{
	struct daemon d = {0};
	d.cfg.host = "127.0.0.1";
	d.cfg.port = 8787;
	d.cfg.mode = REUSE_EXACT;
	d.cfg.n_ubatch = 512;
	d.cfg.keepalive_ms = 5000;
	d.cfg.health_interval_ms = 2000;
	d.cfg.max_body_bytes = 64u << 20;
	d.cfg.client_timeout_s = 60;
	d.cfg.backend_timeout_s = 1800;
	d.cfg.save_idle_ms = 5000;
	d.cfg.local_prompts = 1;
	const char *urls[64];
	struct managed m = {0};
	m.slots = 2;
	int registry = 0;

	log_init();
	const char *env_timeout = getenv("TOKI_BACKEND_TIMEOUT");
	if (env_timeout && atoi(env_timeout) > 0)
		d.cfg.backend_timeout_s = atoi(env_timeout);
	/* The environment keeps the key out of `ps`; --backend-key overrides. */
	const char *env_key = getenv("TOKI_BACKEND_KEY");
	if (env_key && *env_key)
		d.cfg.backend_key = env_key;

	struct backend_urls bu = {urls, 0};
	struct reuse_arg ra = {&d.cfg.mode, 0};
	const struct cmd_opt opts[] = {
	    {"backend", CMD_OPT_FN, {.ctx = &bu}, backend_opt},
	    {"backend-key", CMD_OPT_STR, {.s = &d.cfg.backend_key}, NULL},
	    {"host", CMD_OPT_STR, {.s = &d.cfg.host}, NULL},
	    {"port", CMD_OPT_INT, {.i = &d.cfg.port}, NULL},
	    {"allow-remote", CMD_OPT_FLAG, {.i = &d.cfg.allow_remote}, NULL},
	    {"reuse", CMD_OPT_FN, {.ctx = &ra}, reuse_opt},
	    {"ubatch", CMD_OPT_INT, {.i = &d.cfg.n_ubatch}, NULL},
	    {"keepalive-ms", CMD_OPT_INT, {.i = &d.cfg.keepalive_ms}, NULL},
	    {"max-body-mb", CMD_OPT_FN, {.ctx = &d.cfg.max_body_bytes}, max_body_opt},
	    {"client-timeout", CMD_OPT_INT, {.i = &d.cfg.client_timeout_s}, NULL},
	    {"slot-dir", CMD_OPT_STR, {.s = &d.cfg.slot_dir}, NULL},
	    {"slot-disk-mb", CMD_OPT_FN, {.ctx = &d.cfg.slot_disk_bytes}, slot_disk_opt},
	    {"max-output", CMD_OPT_LONG, {.l = &d.cfg.max_output}, NULL},
	    {"slot-save-idle-ms", CMD_OPT_INT, {.i = &d.cfg.save_idle_ms}, NULL},
	    {"kv-settings", CMD_OPT_STR, {.s = &d.cfg.kv_settings}, NULL},
	    {"slot-compress", CMD_OPT_INT, {.i = &d.cfg.slot_compress}, NULL},
	    {"tokenize", CMD_OPT_FN, {.ctx = &d.cfg.local_prompts}, tokenize_opt},
	    {"model", CMD_OPT_STR, {.s = &m.model}, NULL},
	    {"llama-server", CMD_OPT_STR, {.s = &m.binary}, NULL},
	    {"ctx", CMD_OPT_LONG, {.l = &m.ctx}, NULL},
	    {"slots", CMD_OPT_INT, {.i = &m.slots}, NULL},
	    {"llama-arg", CMD_OPT_FN, {.ctx = &m}, llama_arg_opt},
	    {"llama-env", CMD_OPT_FN, {.ctx = &m}, llama_env_opt},
	    {"run-dir", CMD_OPT_STR, {.s = &m.run_dir}, NULL},
	    {"name", CMD_OPT_STR, {.s = &m.name}, NULL},
	    {"registry", CMD_OPT_FLAG, {.i = &registry}, NULL},
	    {0},
	};
	int r = cmd_parse_options(argc, argv, opts, usage);
	if (r >= 0)
		return r;
	if (registry)
		return serve_registry(&d.cfg, m.name, ra.set ? reuse_mode_name(d.cfg.mode) : NULL,
		                      argc, argv);
	int n_urls = bu.n;
	if (optind < argc || (n_urls == 0 && !m.model) || d.cfg.n_ubatch <= 0 || m.slots <= 0 ||
	    m.ctx < 0 || d.cfg.max_output < 0 || d.cfg.keepalive_ms <= 0 || d.cfg.port < 0 ||
	    d.cfg.port > 65535 || d.cfg.max_body_bytes == 0 || d.cfg.client_timeout_s <= 0) {
		if (n_urls == 0 && !m.model)
			fprintf(stderr, "toki serve: give --backend URL or --model FILE\n");
		usage(stderr);
		return 2;
	}
	if (!net_host_is_loopback(d.cfg.host) && !d.cfg.allow_remote) {
		fprintf(stderr,
		        "toki serve: refusing to bind %s, which is not loopback: anyone who can "
		        "reach it could use your model. Pass --allow-remote to do it anyway.\n",
		        d.cfg.host);
		return 2;
	}
	if (d.cfg.backend_key && !key_is_valid(d.cfg.backend_key)) {
		fprintf(stderr,
		        "toki serve: the backend key is empty or holds control characters\n");
		return 2;
	}
	char managed_url[64], slot_dir[4096], managed_key[512];
	const char *managed_key_p =
	    m.model ? managed_api_key(&m, managed_key, sizeof managed_key) : NULL;
	if (managed_key_p && !key_is_valid(managed_key_p)) {
		fprintf(stderr, "toki serve: --llama-arg --api-key holds control characters\n");
		return 2;
	}
	char *kv_settings = NULL;
	if (m.model) {
		if (n_urls == 64) {
			fprintf(stderr, "toki serve: at most 64 backends\n");
			return 2;
		}
		if (prepare_managed(&m, &d, managed_url, sizeof managed_url, slot_dir,
		                    sizeof slot_dir) != 0)
			return 1;
		urls[n_urls++] = managed_url;
		if (!d.cfg.slot_dir)
			d.cfg.slot_dir = slot_dir;
		kv_settings = managed_kv_settings(&m);
		d.cfg.kv_settings = kv_settings;
	}
	if (d.cfg.slot_dir) {
		struct statvfs vfs;
		if (access(d.cfg.slot_dir, W_OK) != 0 || statvfs(d.cfg.slot_dir, &vfs) != 0) {
			fprintf(stderr, "toki serve: --slot-dir %s is not a writable directory\n",
			        d.cfg.slot_dir);
			return 2;
		}
		if (!d.cfg.slot_disk_bytes) {
			uint64_t quarter = (uint64_t)vfs.f_bavail * vfs.f_frsize / 4;
			d.cfg.slot_disk_bytes = quarter < (32ull << 30) ? quarter : (32ull << 30);
		}
	} else if (!d.cfg.slot_disk_bytes) {
		/* A server's own --slot-save-path, whose free space toki cannot
		 * see (slot_store.h). */
		d.cfg.slot_disk_bytes = 8ull << 30;
	}
	char terr[512];
	if (auth_load_token(d.cfg.token, sizeof d.cfg.token, terr, sizeof terr) != 0) {
		fprintf(stderr, "toki serve: %s\n", terr);
		return 1;
	}
	d.cfg.backend_urls = urls;
	d.cfg.n_backends = n_urls;

	signal(SIGPIPE, SIG_IGN);
	d.base = event_base_new();
	d.router = router_new(d.cfg.mode);
	d.backends = calloc((size_t)n_urls, sizeof *d.backends);
	if (!d.base || !d.router || !d.backends) {
		fprintf(stderr, "toki serve: out of memory\n");
		return 1;
	}
	/* --slot-dir is every backend's --slot-save-path (docs/fleet.md). */
	d.router->shared_saved = d.cfg.slot_dir != NULL;
	d.started_us = clock_now_us();
	char err[256];
	for (int i = 0; i < n_urls; i++) {
		d.backends[i] = backend_new(&d, urls[i], err, sizeof err);
		if (!d.backends[i]) {
			fprintf(stderr, "toki serve: %s\n", err);
			return 2;
		}
		d.n_backends++;
	}
	/* The managed backend (the last one) runs with the key its own arguments
	 * give it, whatever key the other backends have. */
	if (managed_key_p && backend_set_key(d.backends[d.n_backends - 1], managed_key_p) != 0) {
		fprintf(stderr, "toki serve: out of memory\n");
		return 1;
	}
	if (m.model && start_managed(&m, &d) != 0)
		return 1;
	if (d.supervisor)
		d.backends[d.n_backends - 1]->managed = d.supervisor;
	struct http_server_limits limits;
	http_server_default_limits(&limits);
	limits.max_body_bytes = d.cfg.max_body_bytes;
	limits.idle_timeout_s = d.cfg.client_timeout_s;
	if (serve_init(&d) != 0) {
		fprintf(stderr, "toki serve: out of memory\n");
		return 1;
	}
	d.http = http_server_new(d.base, &limits, serve_handle, &d, api_error_body);
	/* Browser clients that worked against llama-server preflight: answer
	 * them as it does. Every route still needs the token, which a page
	 * from another origin does not have. */
	if (d.http)
		http_server_set_cors(d.http, 1);
	if (!d.http || http_server_listen(d.http, d.cfg.host, d.cfg.port, err, sizeof err) != 0) {
		fprintf(stderr, "toki serve: %s\n", d.http ? err : "out of memory");
		return 1;
	}
	d.sigint = evsignal_new(d.base, SIGINT, on_signal, &d);
	d.sigterm = evsignal_new(d.base, SIGTERM, on_signal, &d);
	event_add(d.sigint, NULL);
	event_add(d.sigterm, NULL);
	struct event *sweeper = event_new(d.base, -1, EV_PERSIST, every_second, &d);
	struct timeval one_s = {1, 0};
	event_add(sweeper, &one_s);
	for (int i = 0; i < d.n_backends; i++)
		backend_start(d.backends[i]);
	log_info("listening on http://%s:%d (reuse %s, ubatch %d, %d backend%s)", d.cfg.host,
	         http_server_port(d.http), reuse_mode_name(d.cfg.mode), d.cfg.n_ubatch,
	         d.n_backends, d.n_backends == 1 ? "" : "s");
	if (!d.cfg.slot_dir)
		/* Said once: the one server flag that changes what toki can do. */
		log_info("no --slot-dir: a conversation whose slot another one takes is recomputed "
		         "when it comes back, unless its server has a --slot-save-path (toki then "
		         "uses it within a few names) or loads it from its own --cache-ram (which "
		         "toki cannot see into, so exact mode recomputes it). Start llama-server "
		         "with -np N --slot-save-path DIR and toki with --slot-dir DIR to save, "
		         "check and keep them (docs/benchmarks.md, e and n)");
	if (m.model)
		write_serve_info(&m, &d);
	/* Tests and scripts read the chosen port from this line. */
	printf("toki serve: listening on http://%s:%d\n", d.cfg.host, http_server_port(d.http));
	fflush(stdout);

	event_base_dispatch(d.base);

	if (d.supervisor) {
		supervisor_stop(d.supervisor, 10);
		supervisor_free(d.supervisor);
	}
	if (m.model)
		unlink(m.info_path);
	slot_store_free_pending(&d);
	free(kv_settings);
	log_info("stopped");
	http_server_free(d.http);
	for (int i = 0; i < d.n_backends; i++)
		backend_free(d.backends[i]);
	free(d.backends);
	router_free(d.router);
	daemon_free_events(&d);
	serve_free(&d);
	event_free(sweeper);
	event_free(d.sigint);
	event_free(d.sigterm);
	event_base_free(d.base);
	return d.exit_code;
}
