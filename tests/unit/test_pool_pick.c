/* The endpoint's pure decisions (src/pool/pool_pick.c): names and aliases,
 * whom to stop, what an unknown name is told, in each API's error shape;
 * and the registry keys they read (aliases, ttl, max_loaded, groups). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api_error.h"
#include "model/launch.h"
#include "model/llama_args.h"
#include "model/registry.h"
#include "pool/pool_pick.h"

/* Loads YAML text as a registry: 0, or -1 with err. */
static int load(const char *yaml, struct registry *r, char *err, size_t n)
{
	char path[] = "/tmp/toki-pool-pick-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
	close(fd);
	int rc = registry_load_file(path, r, err, n);
	unlink(path);
	return rc;
}

static const char *const two =
    "models:\n"
    "  a:\n    path: /m/a.gguf\n    aliases: [\"gpt-4o-mini\", \"claude-haiku\"]\n    ttl: 60\n"
    "  b:\n    path: /m/b.gguf\n"
    "active: b\nmax_loaded: 2\nttl: 600\n";

static void test_keys_and_resolution(void **state)
{
	struct registry r;
	char err[512];
	assert_int_equal(load(two, &r, err, sizeof err), 0);
	assert_int_equal(r.models[0].n_aliases, 2);
	assert_int_equal(r.models[0].ttl, 60);
	assert_int_equal(r.max_loaded, 2);
	assert_int_equal(r.ttl, 600);
	assert_int_equal(pool_resolve(&r, "a"), 0);
	assert_int_equal(pool_resolve(&r, "claude-haiku"), 0);
	assert_int_equal(pool_resolve(&r, "/m/b.gguf"), 1);
	/* No name: the active model. */
	assert_int_equal(pool_resolve(&r, NULL), 1);
	assert_int_equal(pool_resolve(&r, ""), 1);
	assert_int_equal(pool_resolve(&r, "gpt-4"), -1);
	free(r.active);
	r.active = NULL;
	assert_int_equal(pool_resolve(&r, NULL), 0); /* none active: the first */
	char msg[256];
	pool_unknown_message(&r, "gpt-4", msg, sizeof msg);
	assert_string_equal(msg, "no model 'gpt-4' here; the models are: a (aliases gpt-4o-mini, "
	                         "claude-haiku), b");
	/* Cut short, still a string. */
	pool_unknown_message(&r, "gpt-4", msg, 20);
	assert_int_equal(strlen(msg), 19);
	registry_free(&r);
	assert_int_equal(pool_resolve(&r, NULL), -1);
}

/* A write (toki model use sets active) keeps the endpoint's keys. */
static void test_keys_survive_a_write(void **state)
{
	char path[] = "/tmp/toki-pool-reg-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, two, strlen(two)), (ssize_t)strlen(two));
	close(fd);
	setenv("TOKI_MODEL_REGISTRY", path, 1);
	char err[512];
	assert_int_equal(registry_set_active("a", err, sizeof err), 0);
	struct registry r;
	assert_int_equal(registry_load_file(path, &r, err, sizeof err), 0);
	assert_string_equal(r.active, "a");
	assert_int_equal(r.models[0].n_aliases, 2);
	assert_string_equal(r.models[0].aliases[1], "claude-haiku");
	assert_int_equal(r.models[0].ttl, 60);
	assert_int_equal(r.max_loaded, 2);
	assert_int_equal(r.ttl, 600);
	registry_free(&r);
	unlink(path);
	char lock[64];
	snprintf(lock, sizeof lock, "%s.lock", path);
	unlink(lock);
}

static void test_bad_aliases_are_refused(void **state)
{
	struct registry r;
	char err[512];
	assert_int_equal(load("models:\n  a:\n    path: /a\n    aliases: [\"b\"]\n"
	                      "  b:\n    path: /b\n",
	                      &r, err, sizeof err),
	                 -1);
	assert_non_null(strstr(err, "'b' is a model's name"));
	assert_int_equal(load("models:\n  a:\n    path: /a\n    aliases: [\"x\"]\n"
	                      "  b:\n    path: /b\n    aliases: [\"x\"]\n",
	                      &r, err, sizeof err),
	                 -1);
	assert_non_null(strstr(err, "also an alias of a"));
	assert_int_equal(
	    load("models:\n  a:\n    path: /a\n    ttl: \"60\"\n", &r, err, sizeof err), -1);
	assert_int_equal(load("max_loaded: 0\n", &r, err, sizeof err), -1);
}

static void test_pick(void **state)
{
	struct pool_view v[3] = {
	    {.running = 1, .stoppable = 1, .last_used = 30, .used = 100},
	    {.running = 1, .stoppable = 1, .last_used = 10, .used = 100},
	    {.running = 0, .used = 0},
	};
	/* Room for it: start. */
	assert_int_equal(pool_pick(v, 3, 2, 100, 300, 0), POOL_FITS);
	/* No room: the least recently used idle one goes. */
	assert_int_equal(pool_pick(v, 3, 2, 150, 300, 0), 1);
	/* A cap on models: the same. */
	assert_int_equal(pool_pick(v, 3, 2, 10, 1000, 2), 1);
	assert_int_equal(pool_pick(v, 3, 2, 10, 1000, 3), POOL_FITS);
	/* A busy model is never chosen. */
	v[1].stoppable = 0;
	assert_int_equal(pool_pick(v, 3, 2, 150, 300, 0), 0);
	v[0].stoppable = 0;
	assert_int_equal(pool_pick(v, 3, 2, 150, 300, 0), POOL_WAIT);
	/* Too big even alone. */
	assert_int_equal(pool_pick(v, 3, 2, 301, 300, 0), POOL_NEVER);
}

static void test_pick_drain(void **state)
{
	/* a and b are a group (1), c is in none, d is the one to start; all busy. */
	struct pool_view v[4] = {
	    {.running = 1, .ready = 1, .last_used = 10, .group = 1},
	    {.running = 1, .ready = 1, .last_used = 20, .group = 1},
	    {.running = 1, .ready = 1, .last_used = 30},
	    {.running = 0, .group = 1},
	};
	/* The least recently used outside d's group drains: c, not a. */
	assert_int_equal(pool_pick_drain(v, 4, 3), 2);
	v[3].group = 0;
	assert_int_equal(pool_pick_drain(v, 4, 3), 0);
	/* Only ready ones: a starting or stopping model is not drained. */
	v[0].ready = 0;
	assert_int_equal(pool_pick_drain(v, 4, 3), 1);
	v[3].group = 1;
	v[2].ready = 0;
	assert_int_equal(pool_pick_drain(v, 4, 3), -1);
}

static void test_cpu_turn(void **state)
{
	/* a and b compute on the CPU, g on a GPU; all take requests. */
	struct pool_view v[3] = {
	    {.cpu = 1, .takes = 1},
	    {.cpu = 1, .takes = 1},
	    {.cpu = 0, .takes = 1},
	};
	assert_true(pool_turn_free(v, 3, 0, 8));
	v[1].busy = 1;
	/* b computes: a waits, b goes on, g never waits. */
	assert_false(pool_turn_free(v, 3, 0, 8));
	assert_true(pool_turn_free(v, 3, 1, 8));
	assert_true(pool_turn_free(v, 3, 2, 8));
	v[2].busy = 1;
	v[1].busy = 0;
	assert_true(pool_turn_free(v, 3, 0, 8)); /* a GPU model's work is not the CPU's */

	/* The queue, b computing: a's request waits, and so does b's after
	 * it (the turn passes in order); g's goes; a GET of a's goes. */
	struct pool_view w[3] = {
	    {.cpu = 1, .takes = 1},
	    {.cpu = 1, .takes = 1, .busy = 1},
	    {.cpu = 0, .takes = 1},
	};
	struct pool_queue_view q[5] = {{1, 1}, {0, 1}, {1, 1}, {2, 1}, {0, 0}};
	unsigned char go[5];
	assert_int_equal(pool_turn_queue(w, 3, q, 5, 8, go), 3);
	assert_int_equal(go[0], 1); /* b's, ahead of a's: b has the turn */
	assert_int_equal(go[1], 0);
	assert_int_equal(go[2], 0);
	assert_int_equal(go[3], 1);
	assert_int_equal(go[4], 1);
	/* b's requests end: a's go, and b's waits for them. */
	w[1].busy = 0;
	struct pool_queue_view q2[2] = {{0, 1}, {1, 1}};
	assert_int_equal(pool_turn_queue(w, 3, q2, 2, 8, go), 1);
	assert_int_equal(go[0], 1);
	assert_int_equal(go[1], 0);
	assert_int_equal(w[0].busy, 1); /* set by the one that went */
	/* Two of a's together: the same model's requests go together. */
	w[0].busy = 0;
	struct pool_queue_view q3[3] = {{0, 1}, {0, 1}, {1, 1}};
	assert_int_equal(pool_turn_queue(w, 3, q3, 3, 8, go), 2);
	assert_int_equal(go[2], 0);
	/* A CPU model that starts (takes nothing yet) holds back the CPU
	 * waiters after it, not a GPU model's. */
	w[0].busy = 0;
	w[0].takes = 0;
	struct pool_queue_view q4[3] = {{0, 1}, {1, 1}, {2, 1}};
	assert_int_equal(pool_turn_queue(w, 3, q4, 3, 8, go), 1);
	assert_int_equal(go[1], 0);
	assert_int_equal(go[2], 1);
	/* A model whose start is a GPU's holds nothing back. */
	w[0].cpu = 0;
	assert_int_equal(pool_turn_queue(w, 3, q4, 3, 8, go), 2);
	assert_int_equal(go[1], 1);
}

/* Models whose threads are counted share the turn where they fit the CPUs. */
static void test_cpu_turn_shared(void **state)
{
	/* a: -t 2, b: -t 1, c: llama.cpp's choice; 4 CPUs. */
	struct pool_view v[3] = {
	    {.cpu = 1, .takes = 1, .threads = 2},
	    {.cpu = 1, .takes = 1, .threads = 1},
	    {.cpu = 1, .takes = 1, .threads = 0},
	};
	v[0].busy = 1;
	assert_true(pool_turn_free(v, 3, 1, 4));   /* 2 + 1 <= 4 */
	assert_true(pool_turn_free(v, 3, 1, 3));   /* 2 + 1 <= 3 */
	assert_false(pool_turn_free(v, 3, 1, 2));  /* 2 + 1 > 2 */
	assert_false(pool_turn_free(v, 3, 2, 64)); /* c: a thread per core */
	v[1].busy = 1;
	assert_false(pool_turn_free(v, 3, 0, 2)); /* a beside b, on 2 */
	assert_true(pool_turn_free(v, 3, 0, 3));
	/* c computing: no one shares with it, whatever their threads. */
	v[0].busy = v[1].busy = 0;
	v[2].busy = 1;
	assert_false(pool_turn_free(v, 3, 1, 64));
	/* Alone, a model takes the turn with more threads than CPUs. */
	v[2].busy = 0;
	v[0].threads = 16;
	assert_true(pool_turn_free(v, 3, 0, 4));
	v[0].threads = 2;

	/* The queue on 3 CPUs: a's and b's requests go together; c's waits,
	 * and b's after c's waits behind it (the turn passes in order). */
	struct pool_queue_view q[4] = {{0, 1}, {1, 1}, {2, 1}, {1, 1}};
	unsigned char go[4];
	assert_int_equal(pool_turn_queue(v, 3, q, 4, 3, go), 2);
	assert_int_equal(go[0], 1);
	assert_int_equal(go[1], 1);
	assert_int_equal(go[2], 0);
	assert_int_equal(go[3], 0);
	assert_true(v[0].busy && v[1].busy && !v[2].busy);
	/* On 2 CPUs, b's waits for a's: 2 + 1 do not fit. */
	v[0].busy = v[1].busy = 0;
	assert_int_equal(pool_turn_queue(v, 3, q, 4, 2, go), 1);
	assert_int_equal(go[1], 0);
}

/* A model's threads as its llama-server reads them from its arguments. */
static void test_threads_from_args(void **state)
{
	char *none[] = {"--jinja"};
	assert_int_equal(launch_threads(none, 1, NULL, NULL), 0);
	char *t[] = {"-c", "4096", "-t", "3"};
	assert_int_equal(launch_threads(t, 4, NULL, NULL), 3);
	char *tb[] = {"--threads", "2", "--threads-batch", "6"};
	assert_int_equal(launch_threads(tb, 4, NULL, NULL), 6);
	char *tb_less[] = {"-tb", "1", "-t", "4"};
	assert_int_equal(launch_threads(tb_less, 4, NULL, NULL), 4);
	/* -tb alone leaves -t to llama.cpp: a thread per core. */
	char *tb_only[] = {"-tb", "4"};
	assert_int_equal(launch_threads(tb_only, 2, NULL, NULL), 0);
	/* -1 (and 0) are llama.cpp's choice; a later option wins. */
	char *auto_t[] = {"-t", "-1"};
	assert_int_equal(launch_threads(auto_t, 2, NULL, NULL), 0);
	char *twice[] = {"-t", "8", "-t", "2"};
	assert_int_equal(launch_threads(twice, 4, NULL, NULL), 2);
	char *junk[] = {"-t", "4x"};
	assert_int_equal(launch_threads(junk, 2, NULL, NULL), 0);
	char *dangling[] = {"-t"};
	assert_int_equal(launch_threads(dangling, 1, NULL, NULL), 0);
	/* llama-server reads a long option's underscores as dashes; a short
	 * one, or --threads=N (which it refuses), is no option of these. */
	char *underscores[] = {"--threads", "2", "--threads_batch", "6"};
	assert_int_equal(launch_threads(underscores, 4, NULL, NULL), 6);
	char *not_options[] = {"-t", "2", "--threads=8", "-t_b", "6"};
	assert_int_equal(launch_threads(not_options, 5, NULL, NULL), 2);
	assert_true(llama_arg_is("--cache_type_k", "--cache-type-k"));
	assert_true(llama_arg_is("--n-gpu_layers", "--n-gpu-layers"));
	assert_false(llama_arg_is("--cache-type-k", "--cache-type-v"));
	assert_false(llama_arg_is("--cache-type", "--cache-type-k"));
	assert_false(llama_arg_is("--cache-type-k-x", "--cache-type-k"));
	assert_false(llama_arg_is("-ct_k", "-ctk"));
	assert_false(llama_arg_is("--threads", "--threads_batch"));
	/* The environment, below the command line. */
	assert_int_equal(launch_threads(none, 1, "2", NULL), 2);
	assert_int_equal(launch_threads(none, 1, "2", "3"), 3);
	assert_int_equal(launch_threads(t, 4, "2", NULL), 3);
	assert_int_equal(launch_threads(t, 4, NULL, "5"), 5);
	assert_int_equal(launch_threads(none, 1, "", NULL), 0);
}

static void test_offloads(void **state)
{
	char *none[] = {"--jinja"};
	assert_int_equal(launch_offloads(none, 1, NULL), -1);
	assert_int_equal(launch_offloads(none, 1, ""), -1);
	char *ngl[] = {"-ngl", "99"};
	assert_int_equal(launch_offloads(ngl, 2, NULL), 1);
	char *zero[] = {"--n_gpu_layers", "0"};
	assert_int_equal(launch_offloads(zero, 2, "99"), 0);
	char *later[] = {"-ngl", "0", "--gpu-layers", "auto"};
	assert_int_equal(launch_offloads(later, 4, NULL), 1);
	assert_int_equal(launch_offloads(none, 1, "0"), 0);
	assert_int_equal(launch_offloads(none, 1, "all"), 1);
	char *dangling[] = {"-ngl"};
	assert_int_equal(launch_offloads(dangling, 1, NULL), -1);
	/* As llama-server b11669 prints it, and as older builds did. */
	const char *auto_help =
	    "-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, "
	    "either "
	    "an exact number,\n"
	    "                                        'auto', or 'all' (default: auto)\n"
	    "                                        (env: LLAMA_ARG_N_GPU_LAYERS)\n"
	    "-sm,   --split-mode {none,layer,row,tensor}\n"
	    "                                        (default: layer)\n";
	assert_int_equal(launch_help_offloads(auto_help), 1);
	const char *old_help =
	    "-ngl,  --gpu-layers, --n-gpu-layers N   number of layers to store in VRAM\n"
	    "                                        (env: LLAMA_ARG_N_GPU_LAYERS)\n"
	    "-sm,   --split-mode {none,layer,row}    how to split the model (default: auto)\n";
	assert_int_equal(launch_help_offloads(old_help), 0);
	assert_int_equal(launch_help_offloads("usage: llama-server\n"), 0);
	assert_int_equal(launch_help_offloads(NULL), 0);
	assert_int_equal(launch_help_offloads("--n-gpu-layers N (default: all)"), 1);
}

static void test_pick_groups(void **state)
{
	/* a and b are a group (1), c is in none, d is the one to start. */
	struct pool_view v[4] = {
	    {.running = 1, .stoppable = 1, .last_used = 10, .used = 100, .group = 1},
	    {.running = 1, .stoppable = 1, .last_used = 20, .used = 100, .group = 1},
	    {.running = 1, .stoppable = 1, .last_used = 30, .used = 100},
	    {.running = 0, .group = 1},
	};
	/* b is older than c, but a member: c goes, never a or b. */
	assert_int_equal(pool_pick(v, 4, 3, 100, 300, 0), 2);
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 3), 2);
	/* Outside the group, the least recently used goes (a), as without one. */
	v[3].group = 0;
	assert_int_equal(pool_pick(v, 4, 3, 100, 300, 0), 0);
	v[3].group = 2;
	assert_int_equal(pool_pick(v, 4, 3, 100, 300, 0), 0);
	v[3].group = 1;
	/* c busy: wait, rather than stop a member. */
	v[2].stoppable = 0;
	assert_int_equal(pool_pick(v, 4, 3, 100, 300, 0), POOL_WAIT);
	/* It fits alone, not beside a and b even with c stopped: never. */
	assert_int_equal(pool_pick(v, 4, 3, 101, 300, 0), POOL_NEVER_GROUP);
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 2), POOL_NEVER_GROUP);
	/* Too big alone is still the sizing refusal. */
	assert_int_equal(pool_pick(v, 4, 3, 301, 300, 0), POOL_NEVER);
	/* A member on its way out is waited for, not a reason to refuse. */
	v[2].stoppable = 0;
	v[1].stoppable = 0;
	v[1].stopping = 1;
	assert_int_equal(pool_pick(v, 4, 3, 101, 300, 0), POOL_WAIT);
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 2), POOL_WAIT);
	v[1].stopping = 0;
	/* A member that is not running holds nothing. */
	v[1].running = v[1].stoppable = 0;
	v[2].stoppable = 1;
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 2), 2);
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 1), POOL_NEVER_GROUP);
	assert_int_equal(pool_pick(v, 4, 3, 10, 1000, 3), POOL_FITS);
}

/* The registry's groups become the views' group ids as pool.c fills them. */
static void test_group_ids_from_registry(void **state)
{
	struct registry r;
	char err[512] = "";
	if (load("models:\n  a:\n    path: /a\n  b:\n    path: /b\n  c:\n    path: /c\n"
	         "groups:\n  coding: [b, a]\n",
	         &r, err, sizeof err) != 0)
		fail_msg("%s", err);
	struct pool_view v[3] = {{0}};
	for (int i = 0; i < 3; i++) {
		v[i].running = i != 1;
		v[i].stoppable = 1;
		v[i].used = 100;
		v[i].last_used = i * 10;
		v[i].group = registry_group_of(&r, r.models[i].name) + 1;
	}
	assert_int_equal(v[0].group, 1);
	assert_int_equal(v[1].group, 1);
	assert_int_equal(v[2].group, 0);
	/* b makes c stop, though a was used longer ago. */
	assert_int_equal(pool_pick(v, 3, 1, 100, 200, 0), 2);
	registry_free(&r);
}

static void test_error_shapes(void **state)
{
	/* The endpoint answers an unknown name with http_respond_error, which
	 * writes api_error_body for the route. */
	char *o = api_error_body(404, "no model 'x' here", "/v1/chat/completions");
	json_t *j = json_loads(o, 0, NULL);
	assert_string_equal(
	    json_string_value(json_object_get(json_object_get(j, "error"), "message")),
	    "no model 'x' here");
	json_decref(j);
	free(o);
	o = api_error_body(404, "no model 'x' here", "/anthropic/v1/messages");
	j = json_loads(o, 0, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
	                    "not_found_error");
	json_decref(j);
	free(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_keys_and_resolution),
	    cmocka_unit_test(test_keys_survive_a_write),
	    cmocka_unit_test(test_bad_aliases_are_refused),
	    cmocka_unit_test(test_pick),
	    cmocka_unit_test(test_pick_groups),
	    cmocka_unit_test(test_pick_drain),
	    cmocka_unit_test(test_cpu_turn),
	    cmocka_unit_test(test_cpu_turn_shared),
	    cmocka_unit_test(test_threads_from_args),
	    cmocka_unit_test(test_offloads),
	    cmocka_unit_test(test_group_ids_from_registry),
	    cmocka_unit_test(test_error_shapes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
