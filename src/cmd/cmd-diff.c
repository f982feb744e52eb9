/* toki diff "<prompt>": a one-off A/B of the cache. The prompt runs raw
 * (cache_prompt: false: toki evaluates all of it, from an empty slot, on the
 * same schedule as any run of this request, so that exact mode's cached
 * answer must equal it), then cached
 * (through the router, which reuses what the raw run left in the slot), at
 * temperature 0 with the same max_tokens; the table compares prompt tokens,
 * evaluated tokens, time to the first token and total time, and says whether
 * the two answers are byte-identical. */
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "model/launch.h"
#include "model/registry.h"
#include "model/run.h"
#include "ui/client.h"
#include "util/paths.h"

static atomic_int diff_cancel;

static void on_sigint(int sig)
{
	atomic_store(&diff_cancel, 1);
}

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: toki diff [--url URL] [--model FILE|NAME] [--system TEXT] [--max-tokens N] "
	    "[--json] PROMPT\n"
	    "\n"
	    "Runs PROMPT twice against the daemon at temperature 0: raw (cache_prompt off:\n"
	    "the whole prompt is evaluated from an empty slot, on exact mode's schedule),\n"
	    "then cached (through toki's router, which reuses what the raw run computed),\n"
	    "and compares prompt tokens, evaluated tokens, time to first token (TTFT), total\n"
	    "time, and the two answers (in exact mode they must be byte-identical).\n"
	    "\n"
	    "  --url URL         the daemon (default: the running model, else %s)\n"
	    "  --model FILE|NAME a GGUF file or a registered model: when no daemon runs, one is\n"
	    "                    started for it (as toki up / toki model use) and stopped after\n"
	    "  --system TEXT     a system message; a long one makes the prefill visible\n"
	    "  --max-tokens N    output tokens per run (default 64)\n"
	    "  --json            one JSON object instead of the table\n"
	    "\n"
	    "In toki's exact mode only whole micro-batches (-ub, default 512 tokens) are\n"
	    "reused, so a prompt shorter than one is evaluated in full both times.\n",
	    CLIENT_DEFAULT_URL);
}

/* The port of a base URL ("http://h:p"), or 8787. */
static int url_port(const char *url)
{
	const char *h = strstr(url, "://");
	h = h ? h + 3 : url;
	const char *end = h + strcspn(h, "/");
	const char *br = memchr(h, ']', (size_t)(end - h));
	const char *colon = NULL;
	for (const char *p = br ? br : h; p < end; p++)
		if (*p == ':')
			colon = p;
	int port = colon ? atoi(colon + 1) : 0;
	return port > 0 && port < 65536 ? port : 8787;
}

/* A live run of this model (a registered name, or a GGUF path): 0 with *ri. */
static int find_run_of(const char *model, const char *model_abs, struct run_info *ri)
{
	struct run_info *runs = NULL;
	int n = 0, found = -1;
	if (run_list(&runs, &n) != 0)
		return -1;
	for (int i = 0; i < n && found < 0; i++)
		if (!strcmp(runs[i].name, model) ||
		    (*model_abs && !strcmp(runs[i].model, model_abs)))
			found = i;
	if (found >= 0)
		*ri = runs[found];
	free(runs);
	return found >= 0 ? 0 : -1;
}

/* Starts a run for --model on the port of url. name gets the run's name. */
static int start_model(const char *model, const char *url, char *name, size_t name_len,
                       char *endpoint, size_t endpoint_len, char *err, size_t errlen)
{
	struct launch_opts o = {0};
	struct registry reg = {0};
	char model_abs[4096];
	int have_reg = registry_load(&reg, err, errlen) == 0;
	const struct registry_model *m = have_reg ? registry_find(&reg, model) : NULL;
	if (m) {
		snprintf(name, name_len, "%s", m->name);
		o.model_path = m->path;
		o.binary = m->binary;
		o.ctx = m->ctx;
		o.max_output = m->max_output;
		o.llama_args = m->args;
		o.n_llama_args = m->n_args;
	} else if (realpath(model, model_abs)) {
		const char *base = strrchr(model_abs, '/');
		base = base ? base + 1 : model_abs;
		snprintf(name, name_len, "%.120s", base);
		char *dot = strstr(name, ".gguf");
		if (dot)
			*dot = '\0';
		for (char *p = name; *p; p++)
			if (!strchr(
			        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
			        *p))
				*p = '_';
		if (!paths_is_safe_name(name))
			snprintf(name, name_len, "diff");
		o.model_path = model_abs;
	} else {
		snprintf(err, errlen,
		         "--model %s: neither a GGUF file nor a registered model (toki model list "
		         "shows them)",
		         model);
		if (have_reg)
			registry_free(&reg);
		return -1;
	}
	o.name = name;
	o.port = url_port(url);
	fprintf(stderr, "toki diff: no daemon runs; starting %s on port %d\n", name, o.port);
	int rc = launch_model(&o, endpoint, endpoint_len, err, errlen);
	if (have_reg)
		registry_free(&reg);
	return rc;
}

struct run_numbers {
	long evaluated, cached;
	double ttft_ms, total_ms;
};

static struct run_numbers numbers_of(const struct client_stream_result *r)
{
	struct run_numbers n = {r->evaluated, r->cached, r->ttft_ms, r->total_ms};
	/* No token before the end (an answer that stopped at once): the first
	 * token is the end. */
	if (n.ttft_ms < 0)
		n.ttft_ms = n.total_ms;
	return n;
}

static json_t *run_json(const struct client_stream_result *r)
{
	struct run_numbers n = numbers_of(r);
	json_t *o =
	    json_pack("{s:I, s:I, s:f, s:f, s:I, s:s, s:s}", "evaluated", (json_int_t)n.evaluated,
	              "cached", (json_int_t)n.cached, "ttft_ms", n.ttft_ms, "total_ms", n.total_ms,
	              "output_tokens", (json_int_t)r->predicted, "finish_reason", r->finish_reason,
	              "text", r->text ? r->text : "");
	if (o && *r->route)
		json_object_set_new(o, "route", json_string(r->route));
	if (o && r->cache)
		json_object_set(o, "cache", r->cache);
	return o;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static void print_table(const char *url, const char *model, long max_tokens,
                        const struct client_stream_result *raw,
                        const struct client_stream_result *cached, int identical)
{
	struct run_numbers a = numbers_of(raw), b = numbers_of(cached);
	printf("toki diff: %s at %s, temperature 0, max_tokens %ld\n\n", *model ? model : "model",
	       url, max_tokens);
	printf("%-8s %8s %10s %7s %9s %9s %7s\n", "", "prompt", "evaluated", "cached", "TTFT",
	       "total", "output");
	printf("%-8s %8ld %10ld %7ld %7.0fms %7.0fms %7ld\n", "raw", raw->prompt_tokens,
	       a.evaluated, a.cached, a.ttft_ms, a.total_ms, raw->predicted);
	printf("%-8s %8ld %10ld %7ld %7.0fms %7.0fms %7ld\n", "cached", cached->prompt_tokens,
	       b.evaluated, b.cached, b.ttft_ms, b.total_ms, cached->predicted);
	printf("\nspeed-up: TTFT %.1fx, total %.1fx; outputs byte-identical: %s\n",
	       ratio(a.ttft_ms, b.ttft_ms), ratio(a.total_ms, b.total_ms),
	       identical ? "yes" : "no");
	if (*cached->route)
		printf("route: %s, reused %ld of %ld prompt tokens\n", cached->route,
		       b.cached >= 0 ? b.cached : 0, cached->prompt_tokens);
	if (b.evaluated >= 0 && a.evaluated >= 0 && b.evaluated >= a.evaluated)
		printf(
		    "note: nothing was reused; on llama-server's own schedule (--reuse grid, or a "
		    "prompt toki could not make itself) only whole micro-batches (-ub) are reused, "
		    "so give a longer prompt or --system\n");
	if (!identical)
		printf("\nraw:    %s\ncached: %s\n", raw->text, cached->text);
}

int cmd_diff(int argc, char **argv)
{
	const char *url_opt = NULL, *model = NULL, *system = NULL;
	long max_tokens = 64;
	int as_json = 0;
	const struct cmd_opt opts[] = {
	    {"url", CMD_OPT_STR, {.s = &url_opt}, NULL},
	    {"model", CMD_OPT_STR, {.s = &model}, NULL},
	    {"system", CMD_OPT_STR, {.s = &system}, NULL},
	    {"max-tokens", CMD_OPT_LONG, {.l = &max_tokens}, NULL},
	    {"json", CMD_OPT_FLAG, {.i = &as_json}, NULL},
	    {0},
	};
	int r = cmd_parse_options(argc, argv, opts, usage);
	if (r >= 0)
		return r;
	if (optind != argc - 1 || !*argv[optind] || max_tokens <= 0) {
		usage(stderr);
		return 2;
	}
	const char *prompt = argv[optind];
	char err[1024];
	if (client_global_init(err, sizeof err) != 0) {
		fprintf(stderr, "toki diff: %s\n", err);
		return 1;
	}

	/* Where: --url, else a run of --model, else the running daemon. */
	char url[1024], run_name[160] = "", started[160] = "";
	struct run_info ri;
	int found_run = 0;
	char model_abs[4096] = "";
	if (model && !realpath(model, model_abs))
		model_abs[0] = '\0';
	if (!url_opt && model && find_run_of(model, model_abs, &ri) == 0) {
		run_info_url(&ri, url, sizeof url);
		snprintf(run_name, sizeof run_name, "%s", ri.name);
		found_run = 1;
	} else {
		client_find_daemon(url_opt, url, sizeof url, run_name, sizeof run_name);
	}
	struct client cl;
	if (client_init(&cl, url) != 0) {
		fprintf(stderr, "toki diff: out of memory\n");
		return 1;
	}
	/* Ctrl+C stops the runs, and a daemon started here is still stopped. */
	struct sigaction sa = {0}, old_int, old_term;
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	int ret = 1;
	struct client_stream_result raw = {0}, cached = {0};
	json_t *messages = NULL, *body_raw = NULL, *body_cached = NULL;
	char model_id[256];
	int rc = client_probe(&cl, model_id, sizeof model_id, err, sizeof err);
	if (rc == CLIENT_DOWN && model) {
		char endpoint[256];
		if (start_model(model, url, started, sizeof started, endpoint, sizeof endpoint, err,
		                sizeof err) != 0) {
			fprintf(stderr, "toki diff: %s\n", err);
			started[0] = '\0';
			goto out;
		}
		client_free(&cl);
		if (client_init(&cl, endpoint) != 0) {
			fprintf(stderr, "toki diff: out of memory\n");
			goto out;
		}
		snprintf(url, sizeof url, "%s", cl.base_url);
		rc = client_probe(&cl, model_id, sizeof model_id, err, sizeof err);
	} else if (rc == CLIENT_OK && model && !found_run) {
		if (*run_name)
			fprintf(
			    stderr,
			    "toki diff: note: %s already runs at %s; using it, not starting %s\n",
			    run_name, url, model);
		else
			fprintf(
			    stderr,
			    "toki diff: note: a daemon answers at %s; using it, not starting %s\n",
			    url, model);
	}
	if (rc != CLIENT_OK) {
		fprintf(stderr, "toki diff: %s\n", err);
		goto out;
	}
	if (atomic_load(&diff_cancel)) {
		fprintf(stderr, "toki diff: interrupted\n");
		goto out;
	}

	messages = json_array();
	if (!messages ||
	    (system && json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system",
	                                                         "content", system)) != 0) ||
	    json_array_append_new(
	        messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt)) != 0 ||
	    !(body_raw = client_chat_body(messages, 0.0, max_tokens, 1)) ||
	    !(body_cached = client_chat_body(messages, 0.0, max_tokens, 0))) {
		fprintf(stderr, "toki diff: out of memory (or the prompt is not UTF-8)\n");
		goto out;
	}
	rc = client_chat_stream(&cl, NULL, body_raw, NULL, NULL, &diff_cancel, &raw);
	if (rc == CLIENT_OK)
		rc = client_chat_stream(&cl, NULL, body_cached, NULL, NULL, &diff_cancel, &cached);
	if (rc != CLIENT_OK) {
		fprintf(stderr, "toki diff: %s run: %s\n", raw.err[0] ? "raw" : "cached",
		        raw.err[0] ? raw.err : cached.err);
		goto out;
	}
	int identical =
	    raw.text_len == cached.text_len && !memcmp(raw.text, cached.text, raw.text_len);
	struct run_numbers a = numbers_of(&raw), b = numbers_of(&cached);
	if (as_json) {
		json_t *o = json_object();
		json_object_set_new(o, "url", json_string(url));
		json_object_set_new(o, "model", json_string(model_id));
		json_object_set_new(o, "max_tokens", json_integer(max_tokens));
		json_object_set_new(o, "prompt_tokens",
		                    json_integer(cached.prompt_tokens >= 0 ? cached.prompt_tokens
		                                                           : raw.prompt_tokens));
		json_object_set_new(o, "raw", run_json(&raw));
		json_object_set_new(o, "cached", run_json(&cached));
		json_object_set_new(o, "identical", json_boolean(identical));
		json_object_set_new(o, "speedup",
		                    json_pack("{s:f, s:f}", "ttft", ratio(a.ttft_ms, b.ttft_ms),
		                              "total", ratio(a.total_ms, b.total_ms)));
		char *s =
		    json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
		json_decref(o);
		if (!s) {
			fprintf(stderr, "toki diff: out of memory\n");
			goto out;
		}
		printf("%s\n", s);
		free(s);
	} else {
		print_table(url, model_id, max_tokens, &raw, &cached, identical);
	}
	ret = 0;
out:
	client_stream_result_free(&raw);
	client_stream_result_free(&cached);
	json_decref(body_raw);
	json_decref(body_cached);
	json_decref(messages);
	client_free(&cl);
	if (*started) {
		fprintf(stderr, "toki diff: stopping %s\n", started);
		if (run_stop(started, 30, err, sizeof err) != 0)
			fprintf(stderr, "toki diff: %s\n", err);
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	return ret;
}
