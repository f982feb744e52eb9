/* toki model use NAME: the explicit start of a registered model. */
#include <getopt.h>
#include <jansson.h>
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

static int use_in_endpoint(const struct run_info *ri, const char *name, int wait_s)
{
	json_t *req = json_pack("{s:s}", "model", name);
	char *body = json_dumps(req, 0);
	json_decref(req);
	long status = 0;
	const char *host = !*ri->host || !strcmp(ri->host, "0.0.0.0") ? "127.0.0.1" : ri->host;
	char *resp =
	    body ? run_http_post(host, ri->port, "/toki/load", body, &status, wait_s) : NULL;
	free(body);
	json_t *o = resp ? json_loads(resp, 0, NULL) : NULL;
	char err[1024];
	int rc = 0;
	if (status != 200) {
		const char *msg =
		    json_string_value(json_object_get(json_object_get(o, "error"), "message"));
		fprintf(stderr, "toki model use: %s\n",
		        msg    ? msg
		        : resp ? resp
		               : "the endpoint did not answer");
		rc = 1;
	} else {
		if (registry_set_active(name, err, sizeof err) != 0)
			fprintf(stderr, "toki model use: warning: %s\n", err);
		char url[300];
		run_info_url(ri, url, sizeof url);
		printf("%s is loaded in the endpoint (context %lld): %s/v1 (OpenAI), %s/anthropic "
		       "(Anthropic); it is the active model\n",
		       name, (long long)json_integer_value(json_object_get(o, "context_length")),
		       url, url);
	}
	json_decref(o);
	free(resp);
	return rc;
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
	if (run_get("endpoint", &ri) == 0) {
		/* The endpoint runs: the model loads into it, and becomes the
		 * active one (what a request without "model" gets). */
		registry_free(&reg);
		return use_in_endpoint(&ri, name, o.wait_s > 0 ? o.wait_s : 600);
	}
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
