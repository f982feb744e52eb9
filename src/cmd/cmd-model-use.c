/* toki model use NAME: a registered model loaded into the endpoint (started
 * when none runs), and made the active model. */
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
	        "usage: toki model use NAME [--port N] [--reuse MODE] [--wait S]\n"
	        "                      [--max-body-mb N] [--client-timeout S]\n"
	        "\n"
	        "Loads the registered model NAME into the endpoint (toki up: one port for\n"
	        "every registry model), starting the endpoint first when none runs (on\n"
	        "--port, default 8787, with --reuse, --max-body-mb and --client-timeout),\n"
	        "waits until NAME answers, and makes it the active model: the one a request\n"
	        "without \"model\" gets and launchers pin by default. The endpoint sizes NAME\n"
	        "from the registry (its ctx:, else the largest context that fits beside the\n"
	        "models running); a model that does not fit makes an idle one stop, its\n"
	        "slots saved. A model already running as its own run (toki up --model NAME)\n"
	        "is left as it is and made active. To run NAME alone with a context or slot\n"
	        "count of your own: toki up --model NAME --ctx N --slots N.\n");
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
	if (optind != argc - 1 || o.port < 0) {
		usage(stderr);
		return 2;
	}
	const char *name = argv[optind];
	/* The endpoint sizes each model from the registry, so that its context
	 * (and its slot files' fingerprint) stays the same across swaps: one
	 * load's own --ctx would change it under the model's saved states. */
	if (o.ctx || o.slots || o.foreground) {
		fprintf(stderr,
		        "toki model use: %s sizes a model's own run: toki up --model %s%s%s (the "
		        "endpoint sizes %s from the registry's ctx:)\n",
		        o.foreground ? "--foreground"
		        : o.ctx      ? "--ctx"
		                     : "--slots",
		        name, o.ctx ? " --ctx N" : "", o.slots ? " --slots N" : "", name);
		return 2;
	}
	struct registry reg;
	char err[1024];
	if (registry_load(&reg, err, sizeof err) != 0) {
		fprintf(stderr, "toki model use: %s\n", err);
		return 1;
	}
	int known = registry_find(&reg, name) != NULL;
	registry_free(&reg);
	if (!known) {
		fprintf(
		    stderr,
		    "toki model use: no model '%s' in the registry (toki model list shows them; "
		    "toki model pull adds one)\n",
		    name);
		return 1;
	}
	int wait_s = o.wait_s > 0 ? o.wait_s : 600;
	struct run_info ri;
	if (run_get("endpoint", &ri) == 0)
		return use_in_endpoint(&ri, name, wait_s);
	if (run_get(name, &ri) == 0) {
		char url[300];
		run_info_url(&ri, url, sizeof url);
		if (registry_set_active(name, err, sizeof err) != 0)
			fprintf(stderr, "toki model use: warning: %s\n", err);
		printf("%s already runs as its own run: %s/v1; it is the active model\n", name,
		       url);
		return 0;
	}
	/* No endpoint yet: start it, then load NAME into it. A load that fails
	 * stops the endpoint it started, so that a failed use leaves nothing
	 * running, as a failed toki up does. */
	if (cmd_up_endpoint(&o) != 0)
		return 1;
	if (run_get("endpoint", &ri) != 0) {
		fprintf(stderr, "toki model use: the endpoint started but is not running\n");
		return 1;
	}
	int rc = use_in_endpoint(&ri, name, wait_s);
	if (rc != 0 && run_stop("endpoint", 60, err, sizeof err) != 0)
		fprintf(stderr, "toki model use: %s\n", err);
	return rc;
}
