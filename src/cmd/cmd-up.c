/* toki up: the endpoint for every registry model; toki up --model FILE|NAME:
 * one model in its own run (a raw GGUF, or a registered model with the
 * registry's settings under the options given). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "model/launch.h"
#include "model/registry.h"
#include "model/run.h"
#include "util/paths.h"

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: toki up [--port N] [--reuse MODE] [--foreground]\n"
	    "       toki up --model FILE.gguf|NAME [options] [-- llama-server args]\n"
	    "\n"
	    "Without --model: one endpoint for every model in the registry. Each model's\n"
	    "llama-server starts on its first request (the \"model\" it names; none: the\n"
	    "active one); a model that does not fit beside the running ones makes the\n"
	    "least recently used idle one stop, its slots saved for its return\n"
	    "(TOKI_MAX_LOADED and the registry's max_loaded and ttl: keys cap them).\n"
	    "\n"
	    "With --model: that model in its own run, on its own port: llama-server for\n"
	    "the file (or the registered model NAME, with its registry settings: path,\n"
	    "ctx, max_output, binary, args; options given here win, and the arguments\n"
	    "after -- come after its args) with toki serve in front, in the background,\n"
	    "and waits until it answers. The context is the largest that fits this\n"
	    "machine's memory (never above the model's training context).\n"
	    "\n"
	    "  --name N          the run's name (default: NAME, or the file name without\n"
	    "                    .gguf)\n"
	    "  --ctx N           context per slot; refused, with the numbers, if it does not fit\n"
	    "  --slots N         parallel slots (default 2)\n"
	    "  --max-output N    cap on a request's output tokens\n"
	    "  --port N          toki's port (default 8787)\n"
	    "  --reuse MODE      exact (default), fast or grid (see toki serve --help)\n"
	    "  --llama-server B  the llama-server binary (default: see toki model use)\n"
	    "  --wait S          seconds to wait for the model to load (default 600)\n"
	    "  --foreground      become toki serve here instead of starting it in the\n"
	    "                    background (what a service manager runs: toki service)\n"
	    "  --max-body-mb N, --client-timeout S   as toki serve takes them\n");
}

/* toki up without --model: the endpoint for the registry (src/pool/). */
int cmd_up_endpoint(const struct launch_opts *o)
{
	struct run_info ri;
	if (run_get("endpoint", &ri) == 0) {
		char url[300];
		run_info_url(&ri, url, sizeof url);
		printf("the endpoint already runs: %s/v1 (OpenAI), %s/anthropic (Anthropic)\n", url,
		       url);
		return 0;
	}
	struct registry reg;
	char err[1024];
	if (registry_load(&reg, err, sizeof err) != 0) {
		fprintf(stderr, "toki up: %s\n", err);
		return 1;
	}
	int n = reg.n;
	registry_free(&reg);
	if (n == 0) {
		fprintf(stderr,
		        "toki up: the registry has no models: add one with toki model pull, "
		        "or start a file with toki up --model FILE.gguf\n");
		return 1;
	}
	struct run_spec spec = {
	    .name = "endpoint",
	    .endpoint = 1,
	    .port = o->port > 0 ? o->port : 8787,
	    .host = o->host,
	    .mode = o->mode,
	    .foreground = o->foreground,
	    .max_body_mb = o->max_body_mb,
	    .client_timeout_s = o->client_timeout_s,
	};
	char endpoint[256];
	if (run_start(&spec, o->wait_s > 0 ? o->wait_s : 60, endpoint, sizeof endpoint, err,
	              sizeof err) != 0) {
		fprintf(stderr, "toki up: %s\n", err);
		return 1;
	}
	printf("the endpoint is up for %d registry model%s: %s/v1 (OpenAI), %s/anthropic "
	       "(Anthropic); each model starts on its first request; stop it all with toki down\n",
	       n, n == 1 ? "" : "s", endpoint, endpoint);
	return 0;
}

/* One model in its own run; registered: make it the active model. */
static int up_model(const struct launch_opts *op, int registered)
{
	struct launch_opts o = *op;
	char name[160];
	if (!o.name) {
		const char *base = strrchr(o.model_path, '/');
		base = base ? base + 1 : o.model_path;
		snprintf(name, sizeof name, "%s", base);
		char *dot = strstr(name, ".gguf");
		if (dot)
			*dot = '\0';
		for (char *p = name; *p; p++)
			if (!strchr(
			        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
			        *p))
				*p = '_';
		o.name = name;
	}
	if (!paths_is_safe_name(o.name)) {
		fprintf(stderr, "toki up: '%s' cannot be a name (letters, digits, . _ - only)\n",
		        o.name);
		return 2;
	}
	char model_abs[4096];
	if (!realpath(o.model_path, model_abs)) {
		fprintf(stderr, "toki up: %s: no such file\n", o.model_path);
		return 1;
	}
	o.model_path = model_abs;
	char endpoint[256], err[1024];
	if (launch_model(&o, endpoint, sizeof endpoint, err, sizeof err) != 0) {
		fprintf(stderr, "toki up: %s\n", err);
		return 1;
	}
	if (registered && registry_set_active(o.name, err, sizeof err) != 0)
		fprintf(stderr, "toki up: warning: %s\n", err);
	printf("%s is up: %s/v1 (OpenAI), %s/anthropic (Anthropic); stop it with toki down %s\n",
	       o.name, endpoint, endpoint, o.name);
	return 0;
}

int cmd_up(int argc, char **argv)
{
	struct launch_opts o = {0};
	int r = cmd_launch_options(argc, argv, 1, &o, usage);
	if (r >= 0)
		return r;
	if (!o.model_path && optind == argc && !o.name && !o.ctx && !o.slots && !o.binary &&
	    !o.max_output && o.port >= 0)
		return cmd_up_endpoint(&o);
	if (!o.model_path || o.ctx < 0 || o.slots < 0 || o.port < 0) {
		usage(stderr);
		return 2;
	}
	o.llama_args = argv + optind;
	o.n_llama_args = argc - optind;
	/* A registered model's name (not a file here): its registry settings,
	 * under the options given, its args before the ones after --. */
	struct registry reg = {0};
	char **args = NULL;
	const struct registry_model *rm = NULL;
	char err[1024];
	if (!strchr(o.model_path, '/') && access(o.model_path, F_OK) != 0) {
		if (registry_load(&reg, err, sizeof err) != 0) {
			fprintf(stderr, "toki up: %s\n", err);
			return 1;
		}
		rm = registry_find(&reg, o.model_path);
		if (!rm) {
			fprintf(stderr,
			        "toki up: %s is neither a file nor a registered model (toki model "
			        "list shows them)\n",
			        o.model_path);
			registry_free(&reg);
			return 1;
		}
		args = calloc((size_t)(rm->n_args + o.n_llama_args) + 1, sizeof *args);
		if (!args) {
			fprintf(stderr, "toki up: out of memory\n");
			registry_free(&reg);
			return 1;
		}
		for (int i = 0; i < rm->n_args; i++)
			args[i] = rm->args[i];
		for (int i = 0; i < o.n_llama_args; i++)
			args[rm->n_args + i] = o.llama_args[i];
		o.llama_args = args;
		o.n_llama_args += rm->n_args;
		if (!o.name)
			o.name = rm->name;
		o.model_path = rm->path;
		if (!o.ctx)
			o.ctx = rm->ctx;
		if (!o.max_output)
			o.max_output = rm->max_output;
		if (!o.binary)
			o.binary = rm->binary;
	}
	int rc = up_model(&o, rm != NULL);
	free(args);
	registry_free(&reg);
	return rc;
}
