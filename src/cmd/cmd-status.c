/* toki status [--json]: what runs, where, with which context, how much
 * memory, and how well the cache has done so far. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "model/run.h"
#include "platform/platform.h"

static json_t *status_of(const struct run_info *ri)
{
	json_t *o =
	    json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:I, s:i, s:s}", "name", ri->name,
	              "endpoint", "", "pid", (int)ri->pid, "port", ri->port, "llama_pid",
	              (int)ri->llama_pid, "llama_port", ri->llama_port, "model", ri->model, "ctx",
	              (json_int_t)ri->ctx, "slots", ri->slots, "mode", ri->mode);
	char ep[128];
	snprintf(ep, sizeof ep, "http://%s:%d/v1", ri->host, ri->port);
	json_object_set_new(o, "endpoint", json_string(ep));
	char log[4400];
	if (run_file_path(ri->name, "serve.log", log, sizeof log) == 0)
		json_object_set_new(o, "log", json_string(log));
	if (run_file_path(ri->name, "llama-server.log", log, sizeof log) == 0)
		json_object_set_new(o, "llama_log", json_string(log));
	json_object_set_new(o, "toki_rss_kib", json_integer(plat_rss_kib(ri->pid)));
	json_object_set_new(o, "llama_rss_kib", json_integer(plat_rss_kib(ri->llama_pid)));
	long st = 0;
	char *body = run_http_get(ri->host, ri->port, "/toki/stats", &st, 3);
	json_error_t jerr;
	json_t *stats = body && st == 200 ? json_loads(body, 0, &jerr) : NULL;
	free(body);
	if (stats) {
		json_t *b0 = json_array_get(json_object_get(stats, "backends"), 0);
		json_object_set(o, "backend_up", json_object_get(b0, "up"));
		json_object_set(o, "effective_ctx", json_object_get(b0, "n_ctx_slot"));
		json_object_set(o, "llama_restarts", json_object_get(stats, "llama_restarts"));
		json_object_set(o, "exact",
		                json_object_get(json_object_get(b0, "exact"), "verdict"));
		json_object_set_new(o, "stats", stats);
	}
	return o;
}

/* Bytes as an operator reads them: B, KiB or MiB. */
static void put_bytes(char *out, size_t n, long long b)
{
	if (b >= 1048576)
		snprintf(out, n, "%.1f MiB", (double)b / 1048576.0);
	else if (b >= 1024)
		snprintf(out, n, "%.1f KiB", (double)b / 1024.0);
	else
		snprintf(out, n, "%lld B", b);
}

/* The endpoint for the registry (toki up without --model): its models and
 * what each is doing; each running model is listed as a run of its own. */
static void print_endpoint(json_t *o, json_t *stats)
{
	printf("  registry     %s\n", json_string_value(json_object_get(o, "model")));
	long long cap = json_integer_value(json_object_get(stats, "max_loaded"));
	size_t i;
	json_t *m;
	/* A line per model: its state, and what its swaps did so far. */
	json_array_foreach(json_object_get(stats, "models"), i, m)
	{
		printf("  model        %s %s", json_string_value(json_object_get(m, "name")),
		       json_string_value(json_object_get(m, "state")));
		if (json_integer_value(json_object_get(m, "in_flight")))
			printf(" (%lld in flight)",
			       json_integer_value(json_object_get(m, "in_flight")));
		printf(": loads %lld, unloads %lld",
		       json_integer_value(json_object_get(m, "loads")),
		       json_integer_value(json_object_get(m, "unloads")));
		if (json_integer_value(json_object_get(m, "exits")))
			printf(", exits %lld", json_integer_value(json_object_get(m, "exits")));
		/* Its requests and starts that waited for another model on the
		 * CPU (pool/pool_pick.h, the CPU turn). */
		if (json_integer_value(json_object_get(m, "threads")))
			printf(", threads %lld", json_integer_value(json_object_get(m, "threads")));
		if (json_integer_value(json_object_get(m, "turn_waits")))
			printf(", CPU turn waits %lld",
			       json_integer_value(json_object_get(m, "turn_waits")));
		char saved[32], restored[32];
		put_bytes(saved, sizeof saved,
		          json_integer_value(json_object_get(m, "saved_bytes")));
		put_bytes(restored, sizeof restored,
		          json_integer_value(json_object_get(m, "restored_bytes")));
		printf(", last start %.1f s, last stop %.1f s, saved %s, restored %s\n",
		       json_number_value(json_object_get(m, "last_start_s")),
		       json_number_value(json_object_get(m, "last_stop_s")), saved, restored);
	}
	printf("  waiting      %lld requests\n",
	       json_integer_value(json_object_get(stats, "waiting")));
	const char *turn = json_string_value(json_object_get(stats, "cpu_turn"));
	if (turn && strchr(turn, ','))
		printf("  cpu turn     %s (their threads fit the %lld CPUs together; the others "
		       "on the CPU wait)\n",
		       turn, json_integer_value(json_object_get(stats, "cpus")));
	else if (turn)
		printf("  cpu turn     %s (the others on the CPU wait for it)\n", turn);
	if (cap > 0)
		printf("  max loaded   %lld\n", cap);
	printf("  memory       toki %.1f MiB\n",
	       json_integer_value(json_object_get(o, "toki_rss_kib")) / 1024.0);
	const char *log = json_string_value(json_object_get(o, "log"));
	if (log)
		printf("  log          %s (toki logs %s [-f])\n", log,
		       json_string_value(json_object_get(o, "name")));
}

int cmd_status(int argc, char **argv)
{
	int as_json = argc > 1 && !strcmp(argv[1], "--json");
	if (argc > 1 && !as_json) {
		printf("usage: toki status [--json]\n");
		return strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? 2 : 0;
	}
	struct run_info *runs;
	int n;
	run_list(&runs, &n);
	json_t *all = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(all, status_of(&runs[i]));
	free(runs);
	if (as_json) {
		char *s = json_dumps(all, JSON_INDENT(2));
		printf("%s\n", s ? s : "[]");
		free(s);
		json_decref(all);
		return 0;
	}
	if (n == 0)
		printf(
		    "nothing is running (start a model with toki model use NAME or toki up --model "
		    "FILE)\n");
	size_t i;
	json_t *o;
	json_array_foreach(all, i, o)
	{
		json_t *stats = json_object_get(o, "stats");
		printf("%s  %s\n", json_string_value(json_object_get(o, "name")),
		       json_string_value(json_object_get(o, "endpoint")));
		if (json_is_true(json_object_get(stats, "endpoint"))) {
			print_endpoint(o, stats);
			continue;
		}
		printf("  model        %s\n", json_string_value(json_object_get(o, "model")));
		printf("  llama-server pid %lld, port %lld, %s, restarts %lld\n",
		       json_integer_value(json_object_get(o, "llama_pid")),
		       json_integer_value(json_object_get(o, "llama_port")),
		       json_is_true(json_object_get(o, "backend_up")) ? "up" : "not up (loading?)",
		       json_integer_value(json_object_get(o, "llama_restarts")));
		printf("  context      %lld tokens per slot, %lld slots, reuse %s\n",
		       json_integer_value(json_object_get(o, "effective_ctx"))
		           ? json_integer_value(json_object_get(o, "effective_ctx"))
		           : json_integer_value(json_object_get(o, "ctx")),
		       json_integer_value(json_object_get(o, "slots")),
		       json_string_value(json_object_get(o, "mode")));
		if (json_is_string(json_object_get(o, "exact")))
			printf("  exact        %s\n",
			       json_string_value(json_object_get(o, "exact")));
		printf("  memory       toki %.1f MiB, llama-server %.1f MiB\n",
		       json_integer_value(json_object_get(o, "toki_rss_kib")) / 1024.0,
		       json_integer_value(json_object_get(o, "llama_rss_kib")) / 1024.0);
		const char *log = json_string_value(json_object_get(o, "log"));
		if (log)
			printf("  log          %s (toki logs %s [-f]; llama-server's: --llama)\n",
			       log, json_string_value(json_object_get(o, "name")));
		if (stats) {
			long long routed = json_integer_value(json_object_get(stats, "routed"));
			long long hits = json_integer_value(json_object_get(stats, "hits")) +
			                 json_integer_value(json_object_get(stats, "partials"));
			long long cached =
			    json_integer_value(json_object_get(stats, "cached_tokens"));
			long long evald =
			    json_integer_value(json_object_get(stats, "evaluated_tokens"));
			printf("  cache        %lld requests, %lld reused a prefix (%.0f%%); %lld "
			       "tokens "
			       "reused, %lld evaluated (%.0f%% of prompt tokens from cache)\n",
			       routed, hits, routed ? 100.0 * (double)hits / (double)routed : 0.0,
			       cached, evald,
			       cached + evald ? 100.0 * (double)cached / (double)(cached + evald)
			                      : 0.0);
		}
	}
	json_decref(all);
	return 0;
}
