#include "model/launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/llama_args.h"
#include "model/memsize.h"
#include "model/release.h"
#include "model/run.h"
#include "platform/platform.h"

int launch_find_llama_server(char *path, size_t n, char *gfx, size_t gfxn)
{
	gfx[0] = '\0';
	const char *env = getenv("TOKI_LLAMA_SERVER");
	if (env && *env && access(env, X_OK) == 0) {
		snprintf(path, n, "%s", env);
		return 0;
	}
	struct release_build b;
	char err[256];
	if (release_find_build(NULL, &b, err, sizeof err) == 0) {
		snprintf(path, n, "%s", b.llama_server);
		snprintf(gfx, gfxn, "%s", b.gfx);
		return 0;
	}
	if (release_find_llama_server(NULL, path, n) == 0)
		return 0;
	/* What scripts/provision-llama-server.sh left (Debian 12's route). */
	const char *cache = getenv("TOKI_CACHE_DIR");
	const char *xdg = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");
	if (cache && *cache)
		snprintf(path, n, "%s/llama-server/bin/llama-server", cache);
	else if (xdg && *xdg)
		snprintf(path, n, "%s/tokirecur/llama-server/bin/llama-server", xdg);
	else
		snprintf(path, n, "%s/.cache/tokirecur/llama-server/bin/llama-server",
		         home ? home : "");
	return access(path, X_OK) == 0 ? 0 : -1;
}

/* The KV cache type from llama-server's arguments (-ctk/--cache-type-k). */
/* One KV cache's type as llama-server reads it: its option (a later one
 * winning), else its environment, else f16. */
static const char *cache_type(char *const *args, int n, const char *shrt, const char *lng,
                              const char *env_name)
{
	const char *t = getenv(env_name);
	t = t && *t ? t : "f16";
	for (int i = 0; i + 1 < n; i++)
		if (llama_arg_is(args[i], shrt) || llama_arg_is(args[i], lng))
			t = args[++i];
	return t;
}

/* The K and V caches' types for memsize_fit_context: "q8_0", or "q8_0/f16"
 * where they differ (-ctk alone leaves V at f16). out holds it. */
static const char *kv_type_of(char *const *args, int n, char *out, size_t outn)
{
	const char *k = cache_type(args, n, "-ctk", "--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K");
	const char *v = cache_type(args, n, "-ctv", "--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V");
	if (strcasecmp(k, v) == 0)
		snprintf(out, outn, "%s", k);
	else
		snprintf(out, outn, "%s/%s", k, v);
	return out;
}

int launch_offloads(char *const *args, int n, const char *env_ngl)
{
	const char *v = env_ngl && *env_ngl ? env_ngl : NULL;
	for (int i = 0; i + 1 < n; i++)
		if (llama_arg_is(args[i], "-ngl") || llama_arg_is(args[i], "--n-gpu-layers") ||
		    llama_arg_is(args[i], "--gpu-layers"))
			v = args[++i]; /* a later one wins */
	if (!v)
		return -1;
	return strcmp(v, "0") != 0;
}

int launch_help_offloads(const char *help)
{
	const char *at = help ? strstr(help, "--n-gpu-layers") : NULL;
	if (!at)
		return 0;
	/* The option's description runs to the next option's line. */
	const char *end = at;
	while ((end = strchr(end, '\n')) && end[1] && end[1] != '-')
		end++;
	size_t len = end ? (size_t)(end - at) : strlen(at);
	static const char *const offloading[] = {"(default: auto)", "(default: all)",
	                                         "(default: -1)"};
	for (size_t k = 0; k < sizeof offloading / sizeof *offloading; k++) {
		const char *d = strstr(at, offloading[k]);
		if (d && (size_t)(d - at) < len)
			return 1;
	}
	return 0;
}

/* llama-server's own default for -ngl, from its help: 1 where it puts
 * layers on a GPU unasked. */
static int default_offloads(const char *binary, char *const env_extra[])
{
	char *const argv[] = {(char *)binary, "--help", NULL};
	struct plat_cmd c = {.argv = argv, .env_extra = env_extra, .merge_stderr = 1};
	size_t n = 512 * 1024;
	char *out = malloc(n);
	if (!out)
		return 0;
	int on = plat_run(&c, out, n, NULL, NULL) == 0 && launch_help_offloads(out);
	free(out);
	return on;
}

/* A thread count as llama-server reads one; 0 for none or not a number. */
static long thread_count(const char *s)
{
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	return errno || *end || v < 0 || v > 4096 ? 0 : v;
}

int launch_threads(char *const *args, int n, const char *env_t, const char *env_tb)
{
	long t = thread_count(env_t), tb = thread_count(env_tb);
	for (int i = 0; i + 1 < n; i++) {
		if (llama_arg_is(args[i], "-t") || llama_arg_is(args[i], "--threads"))
			t = thread_count(args[++i]);
		else if (llama_arg_is(args[i], "-tb") || llama_arg_is(args[i], "--threads-batch"))
			tb = thread_count(args[++i]);
	}
	if (t <= 0)
		return 0;
	return (int)(tb > t ? tb : t);
}

int launch_plan(const struct launch_opts *o, uint64_t held_bytes, struct launch_plan *p, char *err,
                size_t errlen)
{
	memset(p, 0, sizeof *p);
	char gfx[32] = "";
	if (o->binary) {
		snprintf(p->binary, sizeof p->binary, "%s", o->binary);
		/* A registry binary: that is an installed build carries its gfx. */
		struct release_build b;
		char berr[256];
		if (release_build_of_server(o->binary, &b, berr, sizeof berr) == 0)
			snprintf(gfx, sizeof gfx, "%s", b.gfx);
	} else if (launch_find_llama_server(p->binary, sizeof p->binary, gfx, sizeof gfx) != 0) {
		snprintf(err, errlen,
		         "no llama-server found: install one with `toki model install-llama`, put "
		         "llama-server on PATH, or set TOKI_LLAMA_SERVER");
		return -1;
	}
	struct gguf_error gerr;
	struct gguf *g = gguf_open(o->model_path, &gerr);
	struct gguf_model_info mi;
	if (!g || !gguf_model_info_read(g, &mi)) {
		snprintf(err, errlen, "cannot read %s: %s", o->model_path,
		         g ? "no architecture in its header" : gerr.text);
		gguf_close(g);
		return -1;
	}
	gguf_close(g);
	/* The user's own server arguments may give the model a longer context
	 * than its file states (--override-kv, RoPE/YaRN scaling): llama-server
	 * runs it with that one, so it is the one the context is checked and
	 * sized against. */
	long ctx_train =
	    memsize_ctx_train_from_args((long)mi.context_length, o->llama_args, o->n_llama_args,
	                                p->ctx_args, sizeof p->ctx_args);
	if (ctx_train > 0)
		mi.context_length = (uint64_t)ctx_train;
	p->ctx_train = ctx_train;

	/* TOKI_MEMORY_MB pretends the machine has that much (free) memory:
	 * for trying what a smaller machine would get, and for tests. It is
	 * taken before the machine is read, so that a machine toki cannot read
	 * can still be started with it. */
	struct mem_budget budget = {0};
	const char *sim = getenv("TOKI_MEMORY_MB");
	/* llama-server's environment: asked for its devices with it too. */
	char *envs[2] = {NULL, NULL};
	if (*gfx) {
		snprintf(p->gfx_env, sizeof p->gfx_env, "HSA_OVERRIDE_GFX_VERSION=%s", gfx);
		envs[0] = p->gfx_env;
	}
	if (sim && atol(sim) > 0) {
		budget.total = budget.available = (uint64_t)atol(sim) << 20;
	} else if (memsize_read_machine(&budget) != 0) {
		snprintf(err, errlen,
		         "cannot read this machine's memory (%s); set TOKI_MEMORY_MB to the "
		         "megabytes the model may use",
		         strerror(errno));
		return -1;
	} else {
		budget.available += held_bytes;
		/* Where the layers go: -ngl as given, else llama-server's own
		 * default, which is "auto" in the builds of the last year (every
		 * layer that fits, on whatever GPU it lists). Apple silicon:
		 * llama.cpp's Metal build offloads every layer by default, and
		 * Metal may wire only its working set (about 2/3 to 3/4 of RAM),
		 * so that is the memory to size against. */
		int offload = launch_offloads(o->llama_args, o->n_llama_args,
		                              getenv("LLAMA_ARG_N_GPU_LAYERS"));
		int asked = offload >= 0;
		if (!asked)
			offload = plat_is_apple_silicon() || default_offloads(p->binary, envs);
		struct mem_budget gpu = budget;
		/* Unasked, only a GPU the server itself lists counts: a CPU build
		 * lists none, whatever nvidia-smi sees. */
		if ((offload || plat_is_apple_silicon()) &&
		    memsize_read_gpu(&gpu, p->binary, envs) == 0 &&
		    (asked || plat_is_apple_silicon() ||
		     !strcmp(gpu.gpu_source, "llama-server --list-devices"))) {
			budget = gpu;
			budget.vram_free += held_bytes;
		}
	}
	int slots = o->slots > 0 ? o->slots : 2;
	struct memsize_report rep;
	char kv_types[64];
	long fit = memsize_fit_context(
	    &mi, &budget, kv_type_of(o->llama_args, o->n_llama_args, kv_types, sizeof kv_types),
	    slots, &rep);
	if (fit < 0) {
		snprintf(err, errlen,
		         "cannot size the context for %s (unknown KV cache type, or no "
		         "layer/head counts in its header)",
		         o->model_path);
		return -1;
	}
	if (o->ctx > 0 && rep.ctx_train > 0 && o->ctx > rep.ctx_train) {
		snprintf(
		    err, errlen,
		    "refused: asked for a context of %ld tokens, but %s was trained on %ld%s%s%s; "
		    "ask for at most %ld, or give llama-server arguments that extend its context "
		    "(--override-kv ARCH.context_length=int:N, --rope-scale N)",
		    o->ctx, o->name, rep.ctx_train, *p->ctx_args ? " (with " : "", p->ctx_args,
		    *p->ctx_args ? ")" : "", fit);
		return -1;
	}
	if (fit == 0 || (o->ctx > 0 && o->ctx > fit)) {
		memsize_explain(&rep, o->ctx, p->why, sizeof p->why);
		snprintf(err, errlen, "refused: %s does not fit this machine: %s", o->name, p->why);
		return -1;
	}
	p->ctx = o->ctx > 0 ? o->ctx : fit;
	p->slots = slots;
	p->used = rep.weights + rep.kv_per_token * (uint64_t)p->ctx * (uint64_t)slots;
	p->capacity = rep.memory > rep.margin ? rep.memory - rep.margin : 0;
	p->gpu = rep.gpu;
	p->threads = launch_threads(o->llama_args, o->n_llama_args, getenv("LLAMA_ARG_THREADS"),
	                            getenv("LLAMA_ARG_THREADS_BATCH"));
	memsize_explain(&rep, o->ctx, p->why, sizeof p->why);
	return 0;
}

int launch_model(const struct launch_opts *o, char *endpoint, size_t n, char *err, size_t errlen)
{
	/* A taken port is found before a model is read or loaded (run_start
	 * checks again, just before it starts anything). */
	if (run_check_port(o->host, o->port > 0 ? o->port : 8787, err, errlen) != 0)
		return -1;
	struct launch_plan *p = malloc(sizeof *p);
	if (!p) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (launch_plan(o, 0, p, err, errlen) != 0) {
		free(p);
		return -1;
	}
	long ctx = p->ctx;
	int slots = p->slots;
	char *envs[2] = {*p->gfx_env ? p->gfx_env : NULL, NULL};
	int n_env = *p->gfx_env ? 1 : 0;
	if (memsize_write_ctx(o->name, ctx) != 0) {
		snprintf(err, errlen, "cannot record the context: %s", strerror(errno));
		free(p);
		return -1;
	}
	fprintf(stderr, "toki: %s: context %ld tokens per slot, %d slots (%s)\n", o->name, ctx,
	        slots, p->why);
	if (*p->ctx_args)
		fprintf(stderr, "toki: %s: a training context of %ld tokens, from %s\n", o->name,
		        p->ctx_train, p->ctx_args);

	/* The run's name is the model id llama-server serves (--alias), so the
	 * id agents put in their configs, sessions and telemetry is "qwen3-4b",
	 * not the GGUF's absolute path with the user's home directory in it.
	 * An --alias of the user's own (or -a) wins. */
	int has_alias = 0;
	for (int i = 0; i < o->n_llama_args; i++)
		has_alias |= llama_arg_is(o->llama_args[i], "--alias") ||
		             llama_arg_is(o->llama_args[i], "-a");
	char **args = calloc((size_t)o->n_llama_args + 3, sizeof *args);
	if (!args) {
		snprintf(err, errlen, "out of memory");
		free(p);
		return -1;
	}
	int n_args = 0;
	for (int i = 0; i < o->n_llama_args; i++)
		args[n_args++] = o->llama_args[i];
	if (!has_alias) {
		args[n_args++] = "--alias";
		args[n_args++] = (char *)o->name;
	}
	struct run_spec spec = {
	    .name = o->name,
	    .model_path = o->model_path,
	    .binary = p->binary,
	    .ctx = ctx,
	    .slots = slots,
	    .max_output = o->max_output,
	    .port = o->port > 0 ? o->port : 8787,
	    .host = o->host,
	    .mode = o->mode,
	    .llama_args = args,
	    .n_llama_args = n_args,
	    .llama_env = envs,
	    .n_llama_env = n_env,
	    .foreground = o->foreground,
	    .max_body_mb = o->max_body_mb,
	    .client_timeout_s = o->client_timeout_s,
	};
	int r = run_start(&spec, o->wait_s > 0 ? o->wait_s : 600, endpoint, n, err, errlen);
	free(args);
	free(p);
	return r;
}
