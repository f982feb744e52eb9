#include "backend/selftest.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <event2/event.h>

#include "backend/backend.h"
#include "backend/supervise.h"
#include "daemon.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/paths.h"
#include "platform/platform.h"
#include "util/json_body.h"

/* Step lengths 99, 77, 85 and 9: each of the first three is one
 * micro-batch at the default -ub 512, longer than a 64-column tile and not a
 * multiple of 8 (the sizes ggml-vulkan's cooperative-matrix product got
 * wrong on lavapipe, docs/exact.md); the last is a generation request's
 * few new tokens. At a smaller -ub they are split as exact mode splits
 * them. */
const int selftest_step_ends[SELFTEST_STEPS] = {99, 176, 261, SELFTEST_PROMPT};

/* Text to tokenize for the test's tokens: any vocabulary gives several
 * hundred of them. */
static const char selftest_text[] =
    "The river town woke slowly. Fishermen pulled their boats onto the gravel, "
    "bakers opened shutters, and a dog barked at the gulls that circled the market. "
    "By nine the square was full: farmers sold apples and onions, a woman mended "
    "nets beside the fountain, and children ran between the stalls with bread in "
    "their hands. The clock on the church tower had been wrong for eleven years, "
    "and nobody minded.\n\n"
    "In the workshop behind the mill, Ada measured twice and cut once. She built "
    "clocks, tables, and once a small boat that still floated in the harbour. Her "
    "notebook listed every job: 3 chairs for the inn, 1 gate for the school, 14 "
    "pegs for the tailor, a new wheel for the cart of old Tomas. She priced them in "
    "coins and in favours, and kept both accounts honest.\n\n"
    "def schedule(jobs, hours):\n    done = []\n    for job in sorted(jobs, key=len):\n"
    "        if hours <= 0:\n            break\n        done.append(job)\n"
    "        hours -= len(job) / 10\n    return done\n\n"
    "When the storm came in October, the river rose over the lower road. Water "
    "reached the steps of the bakery and the tailor moved his cloth to the attic. "
    "Ada and Tomas carried sandbags until their arms shook; the mayor brought soup; "
    "the dog, for once, was quiet. Three days later the sky cleared, the water fell "
    "back between its banks, and the town counted what it had lost: two fences, a "
    "shed, one of the fishing boats, and the patience of the mayor.\n\n"
    "Spring brought visitors. A painter rented the room above the inn and drew the "
    "bridge at every hour of the day. A student of birds counted herons in the reeds "
    "and wrote the numbers on the back of her hand: 7, 12, 9, 21. Merchants from the "
    "coast asked for Ada's clocks, and she taught two apprentices to cut gears, to "
    "file them smooth, and to wait for the glue to dry before they tried the hands.\n\n"
    "Years later, when people spoke of the town, they spoke of the clock on the "
    "tower, which Ada finally repaired, and which has kept good time ever since.";

const char *selftest_state_name(enum selftest_state s)
{
	switch (s) {
	case SELFTEST_OFF:
		return "off";
	case SELFTEST_RUNNING:
		return "running";
	case SELFTEST_VERIFIED:
		return "verified";
	case SELFTEST_FAILED:
		return "failed";
	case SELFTEST_UNKNOWN:
		break;
	}
	return "unknown";
}

void selftest_verdict(const struct selftest *t, char *out, size_t n)
{
	const char *with = t->remedy ? " with " : "";
	const char *remedy = t->remedy ? t->remedy : "";
	switch (t->state) {
	case SELFTEST_VERIFIED:
		snprintf(out, n, "verified on this backend%s%s%s%s", with, remedy,
		         t->shared_kv ? ", on its first slot (its slots share one KV cache)" : "",
		         t->kept ? " (at an earlier start of the same server)" : "");
		break;
	case SELFTEST_FAILED:
		snprintf(out, n, "not verified on this backend%s%s: %s", with, remedy, t->detail);
		break;
	case SELFTEST_RUNNING:
		snprintf(out, n, "not verified yet: the self-test is running");
		break;
	case SELFTEST_OFF:
		snprintf(out, n, "not tested (fast mode promises no identity)");
		break;
	case SELFTEST_UNKNOWN:
		snprintf(out, n, "unknown on this backend: the self-test could not run (%s)",
		         t->detail);
		break;
	}
}

int selftest_expected_cache(int step)
{
	return step <= 1 ? 0 : selftest_step_ends[step - 2];
}

json_t *selftest_request(const int32_t *toks, int run, int step, int slot)
{
	json_t *prompt = json_array();
	int n = step == 0 ? SELFTEST_HISTORY : selftest_step_ends[step - 1];
	int reversed = run == 1 || run == 2;
	for (int i = 0; prompt && i < n; i++) {
		int32_t id = step == 0 ? toks[reversed ? SELFTEST_HISTORY - 1 - i : i]
		                       : toks[SELFTEST_HISTORY + i];
		if (json_array_append_new(prompt, json_integer(id)) != 0) {
			json_decref(prompt);
			prompt = NULL;
		}
	}
	if (!prompt)
		return NULL;
	int last = step == SELFTEST_STEPS;
	/* The history and the first step from an empty slot, as exact mode
	 * evaluates an uncached prompt; each later step reuses the one
	 * before. */
	return json_pack("{s:o, s:i, s:i, s:b, s:i, s:f}", "prompt", prompt, "n_predict",
	                 last ? 1 : 0, "id_slot", slot, "cache_prompt", step >= 2, "n_probs",
	                 last ? 10 : 0, "temperature", 0.0);
}

/* Ten tokens: enough to free the cells that a shared KV cache then gives
 * run 1's next step (the replaced prompt was 270), and nothing run 1 holds. */
enum { INSERT_TOKENS = 10 };

json_t *selftest_insert_request(const int32_t *toks, int slot)
{
	json_t *prompt = json_array();
	for (int i = 0; prompt && i < INSERT_TOKENS; i++) {
		if (json_array_append_new(prompt, json_integer(toks[SELFTEST_TOKENS - 1 - i])) !=
		    0) {
			json_decref(prompt);
			prompt = NULL;
		}
	}
	if (!prompt)
		return NULL;
	/* At temperature 0 like every request of the test, so that the token
	 * the server samples after it is the same in every run. */
	return json_pack("{s:o, s:i, s:i, s:b, s:f}", "prompt", prompt, "n_predict", 0, "id_slot",
	                 slot, "cache_prompt", 0, "temperature", 0.0);
}

/* The first place where a and b differ, as a path. */
/* The steps check's requests (selftest.h). */
enum { GEN_LAST = SELFTEST_GEN + 2 };

int selftest_gen_expected_cache(int which)
{
	if (which == 0 || which == 2)
		return 0;
	if (which == 1 || which == GEN_LAST)
		return SELFTEST_GEN_PROMPT + SELFTEST_GEN - 1;
	return SELFTEST_GEN_PROMPT + which - 3;
}

json_t *selftest_gen_request(const int32_t *toks, const json_t *gen, int which, int slot)
{
	/* The prompt, then how many generated tokens, then the next ones. */
	int n_gen = which == 1 || which == GEN_LAST ? SELFTEST_GEN - 1 : which >= 3 ? which - 2 : 0;
	int n_next = which == 1 || which == GEN_LAST ? SELFTEST_GEN_NEXT : 0;
	if (n_gen && json_array_size(gen) < (size_t)n_gen)
		return NULL;
	json_t *prompt = json_array();
	for (int i = 0; prompt && i < SELFTEST_GEN_PROMPT + n_gen + n_next; i++) {
		json_t *id =
		    i < SELFTEST_GEN_PROMPT ? json_integer(toks[SELFTEST_HISTORY + i])
		    : i < SELFTEST_GEN_PROMPT + n_gen
		        ? json_incref(json_array_get(gen, (size_t)(i - SELFTEST_GEN_PROMPT)))
		        : json_integer(toks[i - SELFTEST_GEN_PROMPT - n_gen]);
		if (json_array_append_new(prompt, id) != 0) {
			json_decref(prompt);
			prompt = NULL;
		}
	}
	if (!prompt)
		return NULL;
	int answer = which == 1 || which == GEN_LAST;
	return json_pack("{s:o, s:i, s:i, s:b, s:i, s:f, s:b, s:b}", "prompt", prompt, "n_predict",
	                 which == 0 ? SELFTEST_GEN
	                 : answer   ? 1
	                            : 0,
	                 "id_slot", slot, "cache_prompt", which != 0 && which != 2, "n_probs",
	                 answer ? 10 : 0, "temperature", 0.0, "ignore_eos", which == 0,
	                 "return_tokens", which == 0);
}

static int differ(json_t *a, json_t *b, char *path, size_t cap, size_t used)
{
	if (json_typeof(a) != json_typeof(b) && !(json_is_number(a) && json_is_number(b))) {
		return 1;
	}
	if (json_is_array(a)) {
		size_t na = json_array_size(a), nb = json_array_size(b);
		for (size_t i = 0; i < na && i < nb; i++) {
			int w = snprintf(path + used, cap - used, "[%zu]", i);
			size_t u = used + (w > 0 && (size_t)w < cap - used ? (size_t)w : 0);
			if (differ(json_array_get(a, i), json_array_get(b, i), path, cap, u))
				return 1;
		}
		path[used] = '\0';
		return na != nb;
	}
	if (json_is_object(a)) {
		const char *k;
		json_t *v;
		json_object_foreach(a, k, v)
		{
			int w = snprintf(path + used, cap - used, ".%s", k);
			size_t u = used + (w > 0 && (size_t)w < cap - used ? (size_t)w : 0);
			json_t *o = json_object_get(b, k);
			if (!o || differ(v, o, path, cap, u))
				return 1;
		}
		path[used] = '\0';
		return json_object_size(a) != json_object_size(b);
	}
	if (json_is_number(a)) {
		double x = json_number_value(a), y = json_number_value(b);
		return memcmp(&x, &y, sizeof x) != 0 || json_typeof(a) != json_typeof(b);
	}
	if (json_is_string(a))
		return strcmp(json_string_value(a), json_string_value(b)) != 0;
	return !json_equal(a, b);
}

int selftest_compare(json_t *a, json_t *b, char *why, size_t n)
{
	char path[160] = "";
	if (!differ(a, b, path, sizeof path, 0))
		return 0;
	/* The path names the value; both values say by how much. */
	char va[64] = "absent", vb[64] = "absent";
	json_t *x = a, *y = b;
	const char *p = path;
	while (*p && (x || y)) {
		char key[64];
		size_t idx = 0;
		if (*p == '[') {
			idx = strtoul(p + 1, NULL, 10);
			x = json_array_get(x, idx);
			y = json_array_get(y, idx);
			p = strchr(p, ']');
			p = p ? p + 1 : "";
		} else {
			size_t k = strcspn(p + 1, ".[");
			snprintf(key, sizeof key, "%.*s", (int)(k < 63 ? k : 63), p + 1);
			x = json_object_get(x, key);
			y = json_object_get(y, key);
			p += 1 + k;
		}
	}
	if (json_is_number(x))
		snprintf(va, sizeof va, "%.17g", json_number_value(x));
	else if (json_is_string(x))
		snprintf(va, sizeof va, "\"%.40s\"", json_string_value(x));
	if (json_is_number(y))
		snprintf(vb, sizeof vb, "%.17g", json_number_value(y));
	else if (json_is_string(y))
		snprintf(vb, sizeof vb, "\"%.40s\"", json_string_value(y));
	snprintf(why, n,
	         "the same prompt in the same steps gave %s %s after one earlier prompt and %s "
	         "after another",
	         *path ? path : "the answer", va, vb);
	return 1;
}

void selftest_clear(struct selftest *t)
{
	free(t->tokens);
	t->tokens = NULL;
	free(t->task);
	t->task = NULL;
	t->n_task = 0;
	free(t->held_body);
	t->held_body = NULL;
	t->checking = 0;
	if (t->idle_timer)
		event_free(t->idle_timer);
	t->idle_timer = NULL;
	json_decref(t->gen);
	json_decref(t->gen_answer);
	t->gen = t->gen_answer = NULL;
	for (int i = 0; i < SELFTEST_RUNS; i++) {
		json_decref(t->answer[i]);
		t->answer[i] = NULL;
	}
}

/* The SHA-256 of o (taken; NULL: out of memory) as compact JSON with
 * sorted keys, as 64 hex digits in out. 0, or -1 with out "". */
static int hash_json(json_t *o, char out[65])
{
	out[0] = '\0';
	char *text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	if (!text)
		return -1;
	bytes_sha256_hex(text, strlen(text), out);
	free(text);
	return 0;
}

int selftest_bits(const json_t *answer, const json_t *gen_answer, char out[65])
{
	return hash_json(
	    json_pack("{s:O, s:O?}", "answer", (json_t *)answer, "steps", (json_t *)gen_answer),
	    out);
}

/* --- the run ----------------------------------------------------------- */

static void on_done(struct backend_call *call, int status, const char *body, size_t len, void *arg);
static void on_error(struct backend_call *call, enum backend_error err, void *arg);
static const struct backend_call_handlers handlers = {.on_done = on_done, .on_error = on_error};

/* Before run 0, -3 reads the slots (and waits for an idle server), -2
 * asks whether the server serves embeddings and -1 tokenizes; between the
 * runs, on a server with one slot, 5 erases it; in run 1 on two slots, 6
 * replaces run 0's slot between steps 1 and 2. */
enum {
	STEP_IDLE = -3,
	STEP_EMBEDDINGS = -2,
	STEP_TOKENIZE = -1,
	STEP_ERASE = SELFTEST_STEPS + 1,
	STEP_INSERT = SELFTEST_STEPS + 2,
	STEP_CLEAR = SELFTEST_STEPS + 3, /* after runs 2 and 3: erases every slot */
	STEP_GEN = SELFTEST_STEPS + 4    /* the steps check's requests from here */
};

static void finish(struct backend *b, enum selftest_state state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- verdicts kept across restarts of a server toki manages ----
 *
 * The test costs about 1,100 tokens of prompt at every start: next to
 * nothing on a GPU, seconds for a large model on a CPU, and the endpoint
 * (src/pool/) starts a model's server again at every swap. The verdict is
 * the server's: its binary, its arguments and environment, its model file,
 * its slots, the machine's drivers. So a server toki manages keeps a
 * "verified" in $TOKI_STATE_DIR/selftest-verdicts.json under a key made of
 * exactly those (the binary's size and mtime, the build it reports, the
 * model file's path, size and mtime, the boot of the machine: a driver
 * update takes a reboot), and a start with the same key takes it instead
 * of testing again. Anything but "verified" is never kept: a failure or an
 * unknown is asked again at every start. A server toki does not manage is
 * always tested: toki cannot know what it runs. */

enum { VERDICTS_KEEP = 64 };
#define VERDICTS_FILE "selftest-verdicts.json"

/* The key of b's server, as 64 hex digits; -1 when it has none (not
 * managed, or what it runs cannot be read). */
static int verdict_key(struct backend *b, char out[65])
{
	char boot[128];
	struct stat st;
	if (!b->managed || !b->model_path || plat_boot_id(boot, sizeof boot) != 0 ||
	    stat(b->model_path, &st) != 0)
		return -1;
	json_t *server = supervisor_describe(b->managed);
	json_t *k = json_pack("{s:o*, s:s, s:s, s:I, s:I, s:i, s:i, s:i, s:s, s:s, s:i}", "server",
	                      server, "build", b->build_info ? b->build_info : "?", "model",
	                      b->model_path, "model_size", (json_int_t)st.st_size, "model_mtime",
	                      (json_int_t)st.st_mtime, "n_slots", b->rb->n_slots, "n_ctx_slot",
	                      b->rb->n_ctx_slot, "n_ubatch", b->rb->n_ubatch, "kv_settings",
	                      b->d->cfg.kv_settings ? b->d->cfg.kv_settings : "", "boot", boot,
	                      "test", SELFTEST_TOKENS);
	return hash_json(k, out);
}

static json_t *verdicts_load(char *path, size_t n)
{
	if (paths_state_sub(path, n, VERDICTS_FILE) != 0)
		return NULL;
	json_t *all = json_load_file(path, 0, NULL);
	if (!json_is_object(all)) {
		json_decref(all);
		all = json_object();
	}
	return all;
}

/* A kept verdict for b: 1 (t->shared_kv set as it was), else 0. */
static int verdict_lookup(struct backend *b, const char *key)
{
	char path[4096];
	json_t *all = verdicts_load(path, sizeof path);
	json_t *e = json_object_get(all, key);
	/* One kept before the steps check, or the bits, existed has no
	 * "steps" or "bits": asked again. */
	const char *bits = json_string_value(json_object_get(e, "bits"));
	int found = json_is_true(json_object_get(e, "verified")) &&
	            json_is_boolean(json_object_get(e, "steps")) && bits &&
	            strlen(bits) < sizeof b->rb->bits;
	if (found) {
		snprintf(b->rb->bits, sizeof b->rb->bits, "%s", bits);
		b->selftest.shared_kv = json_is_true(json_object_get(e, "shared_kv"));
		b->selftest.steps = json_is_true(json_object_get(e, "steps"));
		snprintf(b->selftest.steps_why, sizeof b->selftest.steps_why, "%s",
		         b->selftest.steps ? "verified at an earlier start"
		                           : "not verified at an earlier start");
	}
	json_decref(all);
	return found;
}

/* Keeps b's "verified" (best effort: a lost write costs one test). The
 * file keeps the VERDICTS_KEEP newest. */
static void verdict_record(struct backend *b, const char *key)
{
	char path[4096], dir[4096];
	json_t *all = verdicts_load(path, sizeof path);
	if (!all || paths_state_dir(dir, sizeof dir) != 0 || paths_mkdir_p(dir, 0700) != 0) {
		json_decref(all);
		return;
	}
	json_object_set_new(all, key,
	                    json_pack("{s:b, s:b, s:b, s:s, s:I}", "verified", 1, "shared_kv",
	                              b->selftest.shared_kv, "steps", b->selftest.steps, "bits",
	                              b->rb->bits, "at", (json_int_t)time(NULL)));
	while (json_object_size(all) > VERDICTS_KEEP) {
		const char *oldest = NULL, *k;
		json_int_t at = INT64_MAX;
		json_t *v;
		json_object_foreach(all, k, v)
		{
			json_int_t a = json_integer_value(json_object_get(v, "at"));
			if (a < at) {
				at = a;
				oldest = k;
			}
		}
		if (!oldest)
			break;
		json_object_del(all, oldest);
	}
	char *text = json_dumps(all, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(all);
	if (text && plat_replace_file(path, text, strlen(text), 0600) != 0)
		log_warn("cannot keep the self-test's verdict in %s", path);
	free(text);
}

static void finish(struct backend *b, enum selftest_state state, const char *fmt, ...)
{
	struct selftest *t = &b->selftest;
	t->state = state;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->detail, sizeof t->detail, fmt, ap);
	va_end(ap);
	t->seconds = (double)(clock_now_us() - t->t0_us) / 1e6;
	/* The bits: run 0's answer and, where steps hold, the steps check's
	 * answer as generation left the slot. Not where the slots share one
	 * KV cache: run 0's answer there depends on what the others held. */
	if (state == SELFTEST_VERIFIED && !t->kept && !t->shared_kv && t->answer[0])
		selftest_bits(t->answer[0], t->steps ? t->gen_answer : NULL, b->rb->bits);
	char key[65];
	if (state == SELFTEST_VERIFIED && !t->kept && verdict_key(b, key) == 0)
		verdict_record(b, key);
	selftest_clear(t);
	t->done(b);
}

/* POSTs req (taken) to path as the call in flight. */
static int post(struct backend *b, const char *path, json_t *req)
{
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	b->health_call =
	    body ? backend_call_start(b->http, "POST", path, body, strlen(body), &handlers, b)
	         : NULL;
	free(body);
	return b->health_call ? 0 : -1;
}

static int send_step(struct backend *b)
{
	struct selftest *t = &b->selftest;
	if (t->step == STEP_EMBEDDINGS) {
		/* Without touching a slot: a server started with --embeddings
		 * answers this with 400, any other with 501. llama-server 11669
		 * crashes on a completion there, so it gets none. */
		b->health_call =
		    backend_call_start(b->http, "POST", "/embeddings", "{}", 2, &handlers, b);
		return b->health_call ? 0 : -1;
	}
	if (t->step == STEP_TOKENIZE)
		return post(b, "/tokenize", json_pack("{s:s}", "content", selftest_text));
	if (t->step == STEP_INSERT)
		return post(b, "/completion", selftest_insert_request(t->tokens, t->slot[0]));
	if (t->step == STEP_ERASE || t->step == STEP_CLEAR) {
		char path[64];
		snprintf(path, sizeof path, "/slots/%d?action=erase",
		         t->step == STEP_CLEAR ? t->clear : t->slot[0]);
		b->health_call = backend_call_start(b->http, "POST", path, "{}", 2, &handlers, b);
		return b->health_call ? 0 : -1;
	}
	if (t->step >= STEP_GEN)
		return post(
		    b, "/completion",
		    selftest_gen_request(t->tokens, t->gen, t->step - STEP_GEN, t->slot[0]));
	return post(b, "/completion",
	            selftest_request(t->tokens, t->run, t->step, t->slot[t->run]));
}

/* ---- another client ----
 *
 * The test reads what the server computes, so another client's request
 * during it changes what it sees: one batched with the test's gives other
 * bits (a "failed" the server does not deserve), one on the test's slot
 * other cache counts ("unknown"). An agent still pointed at the server
 * when toki starts does that, and the verdict then sets exact mode's
 * schedule, and so its answers, for as long as toki runs. So a try waits
 * until no slot runs a task (SELFTEST_IDLE_WAIT_S at most; then it runs,
 * and sees), reads /slots after each request of its own, and ends early
 * where a slot other than the one that request used has run a task since
 * or runs one. That, or a cause that may pass (a count other than the
 * slot's, an error status, a timeout), is tried once more; the second
 * try's verdict stands, and says what ended the first. */
enum { SELFTEST_TRIES = 2, SELFTEST_IDLE_POLL_MS = 100, SELFTEST_IDLE_WAIT_S = 30 };

static int get_slots(struct backend *b)
{
	b->health_call = backend_call_start(b->http, "GET", "/slots", NULL, 0, &handlers, b);
	return b->health_call ? 0 : -1;
}

/* A /slots entry's last task (-1: none yet). */
static long long slot_task(const json_t *e)
{
	json_t *task = json_object_get(e, "id_task");
	return json_is_integer(task) ? json_integer_value(task) : -1;
}

/* The slot the request just answered ran on. */
static int step_slot(const struct selftest *t)
{
	if (t->step == STEP_CLEAR)
		return t->clear;
	if (t->step == STEP_ERASE || t->step == STEP_INSERT || t->step >= STEP_GEN)
		return t->slot[0];
	return t->slot[t->run];
}

static void begin_try(struct backend *b);

/* The try ended early for a cause that may pass: the next try, or
 * "unknown" after the last. */
static void try_again(struct backend *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void try_again(struct backend *b, const char *fmt, ...)
{
	struct selftest *t = &b->selftest;
	char why[sizeof t->first_try];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	if (t->tries >= SELFTEST_TRIES) {
		finish(b, SELFTEST_UNKNOWN, "%s", why);
		return;
	}
	memcpy(t->first_try, why, sizeof why);
	log_info("backend %s: exact: the self-test ended early, %s; it runs again once no slot "
	         "runs a task",
	         b->rb->url, why);
	begin_try(b);
}

static void idle_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct backend *b = arg;
	if (get_slots(b) != 0)
		finish(b, SELFTEST_UNKNOWN, "out of memory");
}

/* /slots before a try: again in a moment while a slot runs a task (of
 * another client: toki sends none before the backend is up), else each
 * slot's last task is kept and the try begins. A server whose /slots does
 * not answer is tested without the checks. */
static void idle_read(struct backend *b, int status, const char *body, size_t len)
{
	struct selftest *t = &b->selftest;
	json_t *a = json_body(status, body, len, JSON_ARRAY);
	size_t n = json_array_size(a), i;
	json_t *e;
	int busy = 0;
	json_array_foreach(a, i, e) busy += json_is_true(json_object_get(e, "is_processing"));
	if (busy && clock_now_us() - t->idle_since_us < SELFTEST_IDLE_WAIT_S * 1000000LL) {
		json_decref(a);
		if (!t->idle_told)
			log_info("backend %s: exact: the self-test waits until no slot runs a task "
			         "(%d do: another client's)",
			         b->rb->url, busy);
		t->idle_told = 1;
		struct timeval tv = {0, SELFTEST_IDLE_POLL_MS * 1000};
		if (!t->idle_timer)
			t->idle_timer = evtimer_new(b->d->base, idle_tick, b);
		if (!t->idle_timer || evtimer_add(t->idle_timer, &tv) != 0)
			finish(b, SELFTEST_UNKNOWN, "out of memory");
		return;
	}
	t->task = n ? calloc(n, sizeof *t->task) : NULL;
	t->n_task = t->task ? (int)n : 0;
	for (i = 0; t->task && i < n; i++)
		t->task[i] = slot_task(json_array_get(a, i));
	json_decref(a);
	t->step = STEP_EMBEDDINGS;
	if (send_step(b) != 0)
		finish(b, SELFTEST_UNKNOWN, "out of memory");
}

static void step_done(struct backend *b, int status, const char *body, size_t len);

/* /slots after a request of the test: the request's answer (held) is
 * handled now, unless a slot other than its own ran a task meanwhile. */
static void slots_checked(struct backend *b, int status, const char *body, size_t len)
{
	struct selftest *t = &b->selftest;
	t->checking = 0;
	json_t *a = json_body(status, body, len, JSON_ARRAY);
	size_t i;
	json_t *e;
	int other = -1;
	json_array_foreach(a, i, e)
	{
		long long now = slot_task(e);
		if ((int)i >= t->n_task)
			break;
		if ((int)i != t->own_slot &&
		    (now != t->task[i] || json_is_true(json_object_get(e, "is_processing"))))
			other = (int)i;
		t->task[i] = now;
	}
	json_decref(a);
	char *held = t->held_body;
	t->held_body = NULL;
	if (other >= 0)
		try_again(b, "another client's request ran on slot %d during it", other);
	else
		step_done(b, t->held_status, held, t->held_len);
	free(held);
}

/* The run verified the schedule: the steps check follows, on the slot the
 * run used (the first, where the slots share one KV cache), and the
 * verdict is told when it ends. */
static void verified(struct backend *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void verified(struct backend *b, const char *fmt, ...)
{
	struct selftest *t = &b->selftest;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->verified, sizeof t->verified, fmt, ap);
	va_end(ap);
	if (t->shared_kv)
		t->slot[0] = 0;
	t->step = STEP_GEN;
	if (send_step(b) != 0)
		finish(b, SELFTEST_UNKNOWN, "out of memory");
}

/* The steps check ended: steps verified or not, and why. */
static void steps_checked(struct backend *b, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void steps_checked(struct backend *b, int ok, const char *fmt, ...)
{
	struct selftest *t = &b->selftest;
	t->steps = ok;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->steps_why, sizeof t->steps_why, fmt, ap);
	va_end(ap);
	finish(b, SELFTEST_VERIFIED, "%s", t->verified);
}

/* One answer of the steps check (r, taken) came: 0 when the check goes
 * on. */
static void gen_step_done(struct backend *b, json_t *r)
{
	struct selftest *t = &b->selftest;
	int which = t->step - STEP_GEN;
	json_t *timings = json_object_get(r, "timings");
	json_int_t cache_n = json_integer_value(json_object_get(timings, "cache_n"));
	int want = selftest_gen_expected_cache(which);
	json_t *probs = json_object_get(r, "completion_probabilities");
	if (!json_is_object(timings) || cache_n != want) {
		if (t->tries < SELFTEST_TRIES)
			try_again(b,
			          "the steps check's request %d reused %lld tokens where the slot "
			          "held %d",
			          which, (long long)cache_n, want);
		else
			steps_checked(b, 0,
			              "its request %d reused %lld tokens where the slot held %d",
			              which, (long long)cache_n, want);
	} else if (which == 0 && json_array_size(json_object_get(r, "tokens")) != SELFTEST_GEN) {
		steps_checked(b, 0, "the generation gave %zu tokens, not %d",
		              json_array_size(json_object_get(r, "tokens")), SELFTEST_GEN);
	} else if ((which == 1 || which == GEN_LAST) && !json_array_size(probs)) {
		steps_checked(b, 0, "an answer had no completion_probabilities");
	} else if (which == GEN_LAST) {
		char why[300];
		if (selftest_compare(t->gen_answer, probs, why, sizeof why))
			steps_checked(b, 0,
			              "an answer's tokens evaluated one at a time gave other rows "
			              "than its generation: %s",
			              why);
		else
			steps_checked(b, 1,
			              "%d generated tokens evaluated one at a time gave "
			              "generation's rows",
			              SELFTEST_GEN - 1);
	} else {
		if (which == 0)
			t->gen = json_incref(json_object_get(r, "tokens"));
		if (which == 1)
			t->gen_answer = json_incref(probs);
		t->step++;
		if (send_step(b) != 0)
			finish(b, SELFTEST_UNKNOWN, "out of memory");
	}
	json_decref(r);
}

static void next(struct backend *b)
{
	struct selftest *t = &b->selftest;
	int two_slots = t->slot[1] != t->slot[0];
	if (t->step == SELFTEST_STEPS && t->run == 1) {
		if (!selftest_compare(t->answer[0], t->answer[1], t->why, sizeof t->why)) {
			verified(b,
			         "a prompt in %d steps gave the same logprobs after two different "
			         "earlier prompts",
			         SELFTEST_STEPS);
			return;
		}
		if (!two_slots) {
			finish(b, SELFTEST_FAILED, "%s", t->why);
			return;
		}
		/* A shared KV cache, or a backend that remembers: runs 2
		 * and 3 tell them apart. */
		t->run = 2;
		t->step = 0;
	} else if (t->step == SELFTEST_STEPS && t->run == 3) {
		char why[300];
		if (selftest_compare(t->answer[2], t->answer[3], why, sizeof why)) {
			finish(b, SELFTEST_FAILED, "%s", why);
			return;
		}
		/* A shared KV cache. Exact mode keeps to the first slot, and
		 * the others must hold nothing: what they hold moves where the
		 * first slot's tokens go, and so its answers. */
		t->shared_kv = 1;
		t->step = STEP_CLEAR;
		t->clear = 0;
	} else if (t->step == SELFTEST_STEPS && t->run == 2) {
		t->run = 3;
		t->step = 0;
	} else if (t->step == SELFTEST_STEPS && !two_slots) {
		t->step = STEP_ERASE;
	} else if (t->step == SELFTEST_STEPS || t->step == STEP_ERASE) {
		t->run = 1;
		t->step = 0;
	} else if (t->run == 1 && t->step == 1 && two_slots && !b->rb->self_cached) {
		/* Not where the server empties idle slots at every task
		 * (self_cached: shared, known already): the prompt would empty
		 * run 1's slot. */
		t->step = STEP_INSERT;
	} else if (t->step == STEP_INSERT) {
		t->step = 2;
	} else {
		t->step++;
	}
	if (send_step(b) != 0)
		finish(b, SELFTEST_UNKNOWN, "out of memory");
}

static void on_error(struct backend_call *call, enum backend_error err, void *arg)
{
	(void)call;
	struct backend *b = arg;
	struct selftest *t = &b->selftest;
	b->health_call = NULL;
	if (err == BACKEND_ERR_CONNECT || err == BACKEND_ERR_RESET) {
		/* The server went away: discovery failed, and runs again (with
		 * the test) when it is back. */
		selftest_clear(t);
		t->state = SELFTEST_UNKNOWN;
		snprintf(t->detail, sizeof t->detail, "%s", backend_error_text(err));
		backend_discovery_failed(b, backend_error_text(err));
		return;
	}
	try_again(b, "%s", backend_error_text(err));
}

static void on_done(struct backend_call *call, int status, const char *body, size_t len, void *arg)
{
	(void)call;
	struct backend *b = arg;
	struct selftest *t = &b->selftest;
	b->health_call = NULL;
	if (t->step == STEP_IDLE) {
		idle_read(b, status, body, len);
		return;
	}
	if (t->checking) {
		slots_checked(b, status, body, len);
		return;
	}
	if (t->task && t->step >= 0) {
		/* A request on a slot: its answer waits for a look at the
		 * others ("another client"). */
		t->held_body = malloc(len + 1);
		if (!t->held_body) {
			finish(b, SELFTEST_UNKNOWN, "out of memory");
			return;
		}
		if (len)
			memcpy(t->held_body, body, len);
		t->held_body[len] = '\0';
		t->held_status = status;
		t->held_len = len;
		t->own_slot = step_slot(t);
		t->checking = 1;
		if (get_slots(b) != 0)
			finish(b, SELFTEST_UNKNOWN, "out of memory");
		return;
	}
	step_done(b, status, body, len);
}

/* The answer to the test's request. */
static void step_done(struct backend *b, int status, const char *body, size_t len)
{
	struct selftest *t = &b->selftest;
	if (t->step == STEP_CLEAR) {
		if (status != 200) {
			/* Nothing else empties a slot: a prompt leaves one token
			 * at least, whose cell is wherever the history put it. */
			finish(b, SELFTEST_FAILED,
			       "its slots share one KV cache, where an answer depends on what the "
			       "other slots hold, and without --slot-save-path toki cannot erase "
			       "them (POST /slots/%d?action=erase answered %d)",
			       t->clear, status);
			return;
		}
		if (++t->clear < b->rb->n_slots) {
			if (send_step(b) != 0)
				finish(b, SELFTEST_UNKNOWN, "out of memory");
			return;
		}
		verified(b,
		         "on its first slot, the others erased: %s when another slot's content "
		         "changed, the same bits on one slot",
		         t->why);
		return;
	}
	if (t->step == STEP_ERASE) {
		/* llama-server erases only with --slot-save-path (501
		 * otherwise). Without, the prompt stays in the slot, and with a
		 * RAM cache the server may load it back in run 1: the cache_n
		 * checks then say "unknown". */
		if (status != 200)
			log_debug("backend %s: erasing slot %d for the self-test answered %d",
			          b->rb->url, t->slot[0], status);
		next(b);
		return;
	}
	if (t->step == STEP_EMBEDDINGS) {
		if (status != 501) {
			finish(b, SELFTEST_UNKNOWN, "it serves embeddings");
			return;
		}
		t->step = STEP_TOKENIZE;
		if (send_step(b) != 0)
			finish(b, SELFTEST_UNKNOWN, "out of memory");
		return;
	}
	/* What the model generated may hold any byte, NUL included: a
	 * random-weight model's byte tokens do. Refusing it made the verdict
	 * "unknown", and so exact mode's schedule (no steps), depend on what a
	 * model happened to write. */
	json_error_t jerr;
	json_t *r = status == 200 && body ? json_loadb(body, len, JSON_BODY_FLAGS, &jerr) : NULL;
	if (!r) {
		try_again(b, "POST %s answered %d%s%s",
		          t->step == STEP_TOKENIZE ? "/tokenize" : "/completion", status,
		          status == 200 ? ", and no JSON: " : "", status == 200 ? jerr.text : "");
		return;
	}
	if (t->step == STEP_INSERT) {
		json_decref(r);
		next(b);
		return;
	}
	if (t->step >= STEP_GEN) {
		gen_step_done(b, r);
		return;
	}
	if (t->step == STEP_TOKENIZE) {
		json_t *toks = json_object_get(r, "tokens");
		size_t n = json_array_size(toks);
		t->tokens = n ? calloc(SELFTEST_TOKENS, sizeof *t->tokens) : NULL;
		/* Fewer tokens than the test needs (a vocabulary of whole words):
		 * they repeat. */
		for (size_t i = 0; t->tokens && i < SELFTEST_TOKENS; i++)
			t->tokens[i] = (int32_t)json_integer_value(json_array_get(toks, i % n));
		json_decref(r);
		if (!t->tokens) {
			finish(b, SELFTEST_UNKNOWN,
			       n ? "out of memory" : "/tokenize gave no tokens");
			return;
		}
		t->run = 0;
		t->step = -1;
		next(b);
		return;
	}
	json_t *timings = json_object_get(r, "timings");
	json_int_t cache_n = json_integer_value(json_object_get(timings, "cache_n"));
	int want = t->step == 0 ? 0 : selftest_expected_cache(t->step);
	if (!json_is_object(timings) || cache_n != want) {
		json_decref(r);
		try_again(b,
		          "step %d reused %lld tokens where the slot held %d (a RAM cache, or "
		          "another client)",
		          t->step, (long long)cache_n, want);
		return;
	}
	if (t->step == SELFTEST_STEPS) {
		json_t *probs = json_object_get(r, "completion_probabilities");
		t->answer[t->run] = json_array_size(probs) ? json_incref(probs) : NULL;
		if (!t->answer[t->run]) {
			json_decref(r);
			finish(b, SELFTEST_UNKNOWN, "the answer had no completion_probabilities");
			return;
		}
	}
	json_decref(r);
	next(b);
}

/* The one remedy known (docs/exact.md, "GPU backends"): ggml-vulkan's
 * matrix products on cooperative-matrix hardware read memory past their
 * input; without them (GGML_VK_DISABLE_COOPMAT) the test held on lavapipe.
 * Tried once, on a server toki started and whose device list has a
 * Vulkan device. */
int selftest_try_remedy(struct backend *b)
{
	struct selftest *t = &b->selftest;
	static const char remedy[] = "GGML_VK_DISABLE_COOPMAT=1";
	if (!b->managed || t->remedy_tried || !supervisor_devices_mention(b->managed, "Vulkan"))
		return 0;
	t->remedy_tried = 1;
	log_warn("backend %s: exact: not verified on this backend: %s; restarting its "
	         "llama-server with %s (ggml-vulkan without cooperative-matrix products)",
	         b->rb->url, t->detail, remedy);
	char err[256];
	if (supervisor_restart_with(b->managed, remedy, err, sizeof err) != 0) {
		log_error("backend %s: restarting llama-server failed: %s", b->rb->url, err);
		return 0;
	}
	t->remedy = remedy;
	backend_expect_restart(b);
	return 1;
}

void selftest_start(struct backend *b, void (*done)(struct backend *b))
{
	struct selftest *t = &b->selftest;
	selftest_clear(t);
	t->shared_kv = 0;
	t->kept = 0;
	t->steps = 0;
	snprintf(t->steps_why, sizeof t->steps_why, "not checked");
	t->done = done;
	t->t0_us = clock_now_us();
	b->rb->bits[0] = '\0';
	if (!reuse_mode_is_exact(b->d->router->mode)) {
		t->state = SELFTEST_OFF;
		done(b);
		return;
	}
	if (b->rb->n_ctx_slot < SELFTEST_TOKENS + 8) {
		finish(b, SELFTEST_UNKNOWN, "its slots hold %d tokens, the test needs %d",
		       b->rb->n_ctx_slot, SELFTEST_TOKENS + 8);
		return;
	}
	char key[65];
	if (verdict_key(b, key) == 0 && verdict_lookup(b, key)) {
		t->kept = 1;
		finish(b, SELFTEST_VERIFIED,
		       "verified at an earlier start of this server (the same binary, build, "
		       "arguments, model, slots and boot)");
		return;
	}
	t->state = SELFTEST_RUNNING;
	t->tries = 0;
	t->first_try[0] = '\0';
	begin_try(b);
}

static void begin_try(struct backend *b)
{
	struct selftest *t = &b->selftest;
	selftest_clear(t);
	t->tries++;
	t->shared_kv = 0;
	t->steps = 0;
	snprintf(t->steps_why, sizeof t->steps_why, "not checked");
	t->run = 0;
	/* The slot that held least, and for run 1 another: a run leaves its
	 * prompt in its slot, where a server with a RAM cache could load it
	 * back into the other run's slot if they were one (then, with one
	 * slot, erased between the runs where the server allows it). */
	t->slot[0] = b->ram_probe_slot;
	t->slot[1] = (b->ram_probe_slot + 1) % b->rb->n_slots;
	/* Runs 2 and 3 on the slot exact mode keeps to where slots share one
	 * KV cache (router.c, usable_slots). */
	t->slot[2] = t->slot[3] = 0;
	t->step = STEP_IDLE;
	t->idle_since_us = clock_now_us();
	t->idle_told = 0;
	if (get_slots(b) != 0)
		finish(b, SELFTEST_UNKNOWN, "out of memory");
}
