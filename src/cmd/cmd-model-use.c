/* toki model use NAME: the explicit start of a registered model. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "model/launch.h"
#include "model/registry.h"
#include "model/run.h"

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: toki model use NAME [--ctx N] [--slots N] [--port N] [--reuse MODE] "
	        "[--wait S]\n"
	        "                      [--foreground]\n"
	        "\n"
	        "Starts the registered model: llama-server (the registry's binary:, else an\n"
	        "installed build, else llama-server on PATH) with toki serve in front, in the\n"
	        "background. The context is the registry's ctx: if it fits memory, else the\n"
	        "largest that fits; asking for more than fits is refused with the numbers.\n"
	        "A model already running elsewhere is left alone; stop it with toki down.\n"
	        "--foreground makes this process toki serve instead (what toki service runs).\n");
}

int cmd_model_use(int argc, char **argv)
{
	struct launch_opts o = {0};
	int r = cmd_launch_options(argc, argv, 0, &o, usage);
	if (r >= 0)
		return r;
	if (optind != argc - 1 || o.ctx < 0 || o.slots < 0 || o.port < 0) {
		usage(stderr);
		return 2;
	}
	const char *name = argv[optind];
	struct registry reg;
	char err[1024];
	if (registry_load(&reg, err, sizeof err) != 0) {
		fprintf(stderr, "toki model use: %s\n", err);
		return 1;
	}
	const struct registry_model *m = registry_find(&reg, name);
	if (!m) {
		fprintf(
		    stderr,
		    "toki model use: no model '%s' in the registry (toki model list shows them; "
		    "toki model pull adds one)\n",
		    name);
		registry_free(&reg);
		return 1;
	}
	struct run_info ri;
	if (run_get(name, &ri) == 0) {
		printf("%s already runs: http://%s:%d/v1\n", name, ri.host, ri.port);
		registry_free(&reg);
		return 0;
	}
	o.name = m->name;
	o.model_path = m->path;
	o.binary = m->binary;
	if (!o.ctx)
		o.ctx = m->ctx;
	o.max_output = m->max_output;
	o.llama_args = m->args;
	o.n_llama_args = m->n_args;
	char endpoint[256];
	int rc = launch_model(&o, endpoint, sizeof endpoint, err, sizeof err);
	if (rc != 0) {
		fprintf(stderr, "toki model use: %s\n", err);
	} else {
		if (registry_set_active(name, err, sizeof err) != 0)
			fprintf(stderr, "toki model use: warning: %s\n", err);
		printf("%s is up: %s/v1 (OpenAI), %s/anthropic (Anthropic); stop it with toki down "
		       "%s\n",
		       name, endpoint, endpoint, name);
	}
	registry_free(&reg);
	return rc ? 1 : 0;
}
