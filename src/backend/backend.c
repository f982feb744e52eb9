#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "backend/prompt_probe.h"
#include "backend/slot_store.h"
#include "model/gguf.h"
#include "util/log.h"
#include "util/json_body.h"

struct backend *backend_new(struct daemon *d, const char *url, char *err, size_t errlen)
{
	struct backend *b = calloc(1, sizeof *b);
	if (!b) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	b->d = d;
	b->http = backend_http_new(d->base, url, d->cfg.backend_timeout_s, err, errlen);
	if (!b->http) {
		free(b);
		return NULL;
	}
	b->rb = router_add_backend(d->router, backend_http_url(b->http));
	if (!b->rb) {
		backend_http_free(b->http);
		free(b);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	b->rb->n_ubatch = d->cfg.n_ubatch;
	b->rb->can_save = d->cfg.slot_dir != NULL;
	if (d->cfg.backend_key && backend_set_key(b, d->cfg.backend_key) != 0) {
		backend_free(b);
		snprintf(err, errlen, "the backend key cannot be sent in a header");
		return NULL;
	}
	return b;
}

int backend_set_key(struct backend *b, const char *key)
{
	/* One client carries every call to this backend (discovery, health,
	 * probes, requests, slot saves), so one header covers them all. */
	size_t n = strlen(key) + sizeof "Bearer ";
	char *v = malloc(n);
	if (!v)
		return -1;
	snprintf(v, n, "Bearer %s", key);
	int rc = backend_http_set_header(b->http, "Authorization", v);
	free(v);
	return rc;
}

void backend_free(struct backend *b)
{
	if (!b)
		return;
	if (b->health_call)
		backend_call_cancel(b->health_call);
	if (b->health_timer)
		event_free(b->health_timer);
	prompt_probe_stop(b);
	selftest_clear(&b->selftest);
	json_decref(b->props);
	backend_http_free(b->http);
	free(b->build_info);
	free(b->model_path);
	free(b->model_id);
	free(b->adapters);
	json_decref(b->models);
	free(b);
}

int backend_is_up(const struct backend *b)
{
	return b->rb->up;
}

void backend_mark_down(struct backend *b, const char *why)
{
	/* Its saved states stay on disk: when it comes back, discovery checks
	 * them against its fingerprint. */
	if (b->rb->up)
		log_warn("backend %s is down: %s", b->rb->url, why);
	/* It may come back with another model: its prompts are probed again. */
	prompt_probe_stop(b);
	router_backend_set_up(b->d->router, b->rb, 0);
}

/* Discovery runs as a chain: /props, then /slots, then /v1/models. A
 * failure is logged when its reason is new: a backend that fails the same
 * way at every health check (200 ms apart until it is first up) says why
 * once, instead of sitting silently at 503 or flooding the log. */
static void discovery_failed_at(struct backend *b, enum log_level level, const char *why)
{
	b->discovering = 0;
	b->rediscover = 0; /* the next one reads everything anew */
	b->returning = 0;  /* nothing waits for it any more */
	if (strcmp(b->last_failure, why) != 0) {
		snprintf(b->last_failure, sizeof b->last_failure, "%s", why);
		log_write(level, "backend %s: discovery failed: %s", b->rb->url, why);
	}
	backend_mark_down(b, why);
}

static void discovery_failed(struct backend *b, const char *why)
{
	discovery_failed_at(b, LOG_WARN, why);
}

void backend_discovery_failed(struct backend *b, const char *why)
{
	discovery_failed(b, why);
}

/* An answer discovery cannot use: its status and the start of its body, on
 * one line, so that the log shows what the server said. */
static void discovery_bad_answer(struct backend *b, const char *path, int status, const char *body,
                                 size_t len)
{
	char shown[161];
	size_t n = len < sizeof shown - 1 ? len : sizeof shown - 1;
	for (size_t i = 0; i < n; i++)
		shown[i] = (unsigned char)body[i] < 0x20 ? ' ' : body[i];
	shown[n] = '\0';
	char why[320];
	snprintf(why, sizeof why, "GET %s answered %d%s: %s%s%s", path, status,
	         status == 200 ? " with no usable JSON" : "", shown, len > n ? "..." : "",
	         status == 401 ? " (llama-server runs with --api-key: give toki the key with "
	                         "--backend-key or TOKI_BACKEND_KEY)"
	                       : "");
	discovery_failed(b, why);
}

/* llama-server started with --no-slots hides /slots. Toki cannot route
 * without it: it is the only way to learn how many slots the server has and
 * what each holds. As the only backend it would leave toki at 503 forever,
 * so toki stops, saying why; beside other backends it is left out. */
static void discovery_no_slots(struct backend *b)
{
	static const char why[] =
	    "llama-server runs with --no-slots: toki routes each request to the slot "
	    "that holds its prefix, which only GET /slots tells, so it cannot use this "
	    "server; restart llama-server without --no-slots";
	if (b->d->n_backends == 1) {
		log_error("backend %s: %s; it is toki's only backend: stopping", b->rb->url, why);
		b->discovering = 0;
		b->d->exit_code = 1;
		event_base_loopexit(b->d->base, NULL);
		return;
	}
	discovery_failed_at(b, LOG_ERROR, why);
}

static void on_models_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg);
static void on_slots_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg);
static void on_discovery_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	discovery_failed(b, backend_error_text(err));
}

static const struct backend_call_handlers models_handlers = {.on_done = on_models_done,
                                                             .on_error = on_discovery_error};
static void on_adapters_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg);
static void discover(struct backend *b);
static const struct backend_call_handlers adapters_handlers = {.on_done = on_adapters_done,
                                                               .on_error = on_discovery_error};
static const struct backend_call_handlers slots_handlers = {.on_done = on_slots_done,
                                                            .on_error = on_discovery_error};
static void on_save_probe_done(struct backend_call *call, int status, const char *body, size_t len,
                               void *arg);
static const struct backend_call_handlers save_probe_handlers = {.on_done = on_save_probe_done,
                                                                 .on_error = on_discovery_error};
static void ram_probe(struct backend *b);
static void on_ram_probe_done(struct backend_call *call, int status, const char *body, size_t len,
                              void *arg);
static void on_ram_probe_error(struct backend_call *call, enum backend_error err, void *arg);
static const struct backend_call_handlers ram_probe_handlers = {.on_done = on_ram_probe_done,
                                                                .on_error = on_ram_probe_error};

static void on_props_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	json_t *props = json_body(status, body, len, -1);
	if (!json_is_object(props)) {
		json_decref(props);
		discovery_bad_answer(b, "/props", status, body, len);
		return;
	}
	if (json_is_false(json_object_get(props, "endpoint_slots"))) {
		json_decref(props);
		discovery_no_slots(b);
		return;
	}
	const char *build = json_string_value(json_object_get(props, "build_info"));
	/* When the model file is on this host, its header tells how large a
	 * token's KV is, which prices saving a slot before the first save has
	 * been measured. */
	const char *model_path = json_string_value(json_object_get(props, "model_path"));
	free(b->model_path);
	b->model_path = model_path ? strdup(model_path) : NULL;
	if (model_path) {
		struct gguf_error gerr;
		struct gguf *g = gguf_open(model_path, &gerr);
		struct gguf_model_info mi;
		if (g && gguf_model_info_read(g, &mi)) {
			if (b->rb->kv_bytes_per_token <= 0)
				b->rb->kv_bytes_per_token =
				    (double)gguf_kv_bytes_per_token(&mi, 2.0);
			/* A sliding window: see router.h, restore_inexact. */
			char key[128];
			uint64_t window = 0;
			snprintf(key, sizeof key, "%s.attention.sliding_window", mi.architecture);
			int swa = gguf_get_u64(g, key, &window) && window > 0;
			if (swa && !b->rb->restore_inexact)
				log_info(
				    "backend %s: %s has a sliding window (%llu tokens): exact "
				    "mode restores no slot file there and keeps nothing of a "
				    "cancelled request (llama-server's restore of such a state "
				    "continues with other logprobs)",
				    b->rb->url, mi.architecture, (unsigned long long)window);
			b->rb->restore_inexact = swa;
			/* A recurrent state: the keys of its size. */
			static const char *const state_keys[] = {"ssm.state_size", "wkv.head_size",
			                                         "shortconv.l_cache"};
			int recurrent = 0;
			for (size_t i = 0; i < sizeof state_keys / sizeof *state_keys; i++) {
				uint64_t size = 0;
				snprintf(key, sizeof key, "%s.%s", mi.architecture, state_keys[i]);
				recurrent |= gguf_get_u64(g, key, &size) && size > 0;
			}
			b->rb->cut_to_checkpoint = swa || recurrent;
		}
		gguf_close(g);
	}
	free(b->build_info);
	b->build_info = strdup(build ? build : "unknown");
	json_decref(b->props);
	b->props = props;
	b->health_call = backend_call_start(b->http, "GET", "/slots", NULL, 0, &slots_handlers, b);
	if (!b->health_call)
		discovery_failed(b, "out of memory");
}

/* Discovery's last step: the model's name. */
static void discover_models(struct backend *b)
{
	b->health_call =
	    backend_call_start(b->http, "GET", "/v1/models", NULL, 0, &models_handlers, b);
	if (!b->health_call)
		discovery_failed(b, "out of memory");
}

static void on_slots_done(struct backend_call *call, int status, const char *body, size_t len,
                          void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	json_t *slots = json_body(status, body, len, -1);
	if (!json_is_array(slots) || json_array_size(slots) == 0) {
		json_decref(slots);
		/* 501 is how llama-server refuses /slots under --no-slots (/props
		 * says so first on builds that report endpoint_slots). */
		if (status == 501)
			discovery_no_slots(b);
		else
			discovery_bad_answer(b, "/slots", status, body, len);
		return;
	}
	int n = (int)json_array_size(slots);
	int n_ctx = (int)json_integer_value(json_object_get(json_array_get(slots, 0), "n_ctx"));
	/* The RAM probe's slot: the one whose last prompt was the shortest,
	 * which loses least if the server has no RAM cache to keep it in. */
	b->ram_probe_slot = 0;
	json_int_t fewest = -1;
	for (int i = 0; i < n; i++) {
		json_t *js = json_array_get(slots, (size_t)i);
		json_int_t k = json_integer_value(json_object_get(js, "n_prompt_tokens"));
		if (!json_is_true(json_object_get(js, "is_processing")) &&
		    (fewest < 0 || k < fewest)) {
			fewest = k;
			b->ram_probe_slot = (int)json_integer_value(json_object_get(js, "id"));
		}
	}
	json_decref(slots);
	if (router_backend_set_slots(b->d->router, b->rb, n, n_ctx, b->d->cfg.n_ubatch) != 0) {
		discovery_failed(b, "out of memory");
		return;
	}
	/* llama-server's HTTP pool has at least n_slots + 2 threads, and each
	 * open connection holds one until it closes. One connection a slot and
	 * one for tokenizing leaves it a thread for everyone else; 64 clients
	 * through toki stalled for minutes when every call had its own. */
	backend_http_set_max_connections(b->http, n + 1);
	if (!b->d->cfg.slot_dir) {
		/* Does it have a --slot-save-path toki could save into? A restore
		 * of a name llama-server refuses before it looks at the slot
		 * tells, without touching anything: 501 without one, 400 with. */
		static const char probe[] = "{\"filename\":\"../toki-probe\"}";
		b->health_call =
		    backend_call_start(b->http, "POST", "/slots/0?action=restore", probe,
		                       sizeof probe - 1, &save_probe_handlers, b);
		if (!b->health_call)
			discovery_failed(b, "out of memory");
	} else {
		ram_probe(b);
	}
}

static void on_save_probe_done(struct backend_call *call, int status, const char *body, size_t len,
                               void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	int can = status == 400;
	if (can && !b->rb->can_save)
		log_info("backend %s has a --slot-save-path: toki saves a conversation it evicts "
		         "there (toki-<settings>-n<k>.bin, at most %d files and %llu MiB of "
		         "them), and restores it when it comes back. With --slot-dir <that "
		         "folder> toki would also check, compress and keep them across its "
		         "restarts",
		         b->rb->url, SLOT_REMOTE_MAX_NAMES,
		         (unsigned long long)(b->d->cfg.slot_disk_bytes >> 20));
	b->rb->can_save = can;
	ram_probe(b);
}

/* Its slots share one KV cache (llama-server without -np): said once, with
 * how toki saw it and what it does about it. */
static void warn_shared_kv(const struct backend *b, const char *seen, const char *then)
{
	log_warn("backend %s: its slots share one KV cache (llama-server started without -np)%s. "
	         "%s Start llama-server with -np N (and --slot-save-path DIR, toki --slot-dir "
	         "DIR) to keep conversations in slots of their own",
	         b->rb->url, seen, then);
}

/* Exact mode's self-test found that an answer on one slot depends on what
 * the others hold, and none on its own history (selftest.h): the slots
 * share one KV cache, which the server does not say (with --cache-ram 0 it
 * empties nothing either: bench n, no -np, --cache-ram 0 gave 19 of 24
 * identical answers when exact mode used every slot). The test erased the
 * other slots where the server allows it (verified); where it does not, what
 * they hold stays, and the answers depend on it (failed). */
static void mark_shared_kv(struct backend *b)
{
	if (!b->rb->shared_kv && !b->rb->self_cached)
		warn_shared_kv(
		    b, ": the self-test's answer on one slot changed with what another slot held",
		    b->selftest.state == SELFTEST_VERIFIED
		        ? "Exact mode uses only its first slot from now on, one conversation at "
		          "a time; toki erased the others."
		        : "Exact mode uses only its first slot from now on, one conversation at "
		          "a time, but without --slot-save-path toki cannot erase what the others "
		          "hold, and its answers depend on that: exact mode's promise does not "
		          "hold on this server.");
	b->rb->shared_kv = 1;
}

/* The server empties its idle slots into its RAM at every new task
 * (router.h, self_cached): said once. */
static void mark_self_cached(struct backend *b)
{
	if (b->rb->self_cached)
		return;
	b->rb->self_cached = 1;
	b->rb->shared_kv = 1;
	/* toki cannot choose the slot there: no slot files either. What it
	 * empties goes to its RAM cache, which exact mode loads back. */
	b->rb->can_save = 0;
	b->rb->ram_cache = 1;
	warn_shared_kv(b, ", and it empties its idle slots into its RAM cache at every new task",
	               reuse_mode_is_exact(b->d->router->mode)
	                   ? "There an answer depends on what the other slots hold. Exact mode "
	                     "uses only its first slot from now on, one conversation at a time, "
	                     "and loads its states back from that RAM."
	                   : "toki lets it pick the slot from now on, which is all the caching "
	                     "it allows.");
}

/* Does the server keep slot states in its RAM (--cache-ram, on by default)?
 * toki cannot see that cache, and in fast mode without slot files the
 * server's own slot choice is then the better one (serve/exec.c,
 * server_picks_slot): replacing a slot's content whole saves it there, where
 * a partial reuse that toki would pick cuts it and loses the rest. Learning
 * it only from the first load out of that RAM came too late: the requests
 * pinned before it had already cut what the server would have kept (bench
 * n, -np 2 --cache-ram 8192: 12,408 evaluated against 10,854 alone).
 *
 * So three tiny prompts ask it directly, in one slot: A, then B (nothing in
 * common after the first token), then A again. A server with a RAM cache
 * saved A when B replaced it and loads it back: the third reuses all of A
 * but the token it must evaluate (on a sliding-window or hybrid model, as
 * far as a context checkpoint). One without reuses what A and B share, a
 * token or two. The slot is the one that held least; only its content is
 * at stake, and only on a server without a RAM cache. A server with one is
 * then sent B into another slot: if that empties the first slot (its idle
 * A went to RAM), its slots share one KV cache and are emptied at every new
 * task, llama-server's default without -np (self_cached), which /slots
 * shows. Asked only where the answer changes what toki does: no slot files,
 * two slots or more in fast mode (with one, the server and toki pick the
 * same slot); in fast mode the server then picks slots, in exact mode toki
 * loads its own states back from that RAM (router/ram.h), on one slot too:
 * a cut there for a conversation that another's turn evicted swaps the two
 * (bench n, -np 1 --cache-ram 8192: exact evaluated 1.97x alone's tokens
 * without). One slot skips step 3: no other slot to empty. Exact mode asks
 * with slot files too: a shared KV cache must be known before the first
 * request, which would otherwise run on any slot (bench n, no -np, with
 * slot files: 1.09x alone's tokens, 1.02 without them).
 *
 * Steps (ram_probe_step): -1 the /embeddings check, 0 A, 1 B, 2 A again,
 * 3 B in another slot, 4 the look at /slots. */
static const char *const ram_probe_bodies[2] = {
    "toki probe: does this server keep the states of its slots in a cache in RAM? "
    "one two three four five six seven eight nine ten eleven twelve",
    "Zebra quartz violin: an unrelated second prompt to take the same slot, "
    "with nothing in common after its first token; red green blue",
};

static int ram_probe_send(struct backend *b)
{
	if (b->ram_probe_step < 0) {
		/* First, without touching a slot: a server started with
		 * --embeddings answers this with 400, any other with 501. The
		 * prompts are not sent to the former: llama-server 11669 crashes
		 * on a completion there. */
		b->health_call = backend_call_start(b->http, "POST", "/embeddings", "{}", 2,
		                                    &ram_probe_handlers, b);
		return b->health_call ? 0 : -1;
	}
	if (b->ram_probe_step == 4) {
		b->health_call =
		    backend_call_start(b->http, "GET", "/slots", NULL, 0, &ram_probe_handlers, b);
		return b->health_call ? 0 : -1;
	}
	int step = b->ram_probe_step;
	int slot = step == 3 ? (b->ram_probe_slot + 1) % b->rb->n_slots : b->ram_probe_slot;
	/* Temperature 0: the token the server samples after the prompt, which
	 * the answer holds, is the same every time. */
	json_t *req =
	    json_pack("{s:s, s:i, s:i, s:b, s:f}", "prompt", ram_probe_bodies[step % 2],
	              "n_predict", 0, "id_slot", slot, "cache_prompt", 1, "temperature", 0.0);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!body)
		return -1;
	b->health_call = backend_call_start(b->http, "POST", "/completion", body, strlen(body),
	                                    &ram_probe_handlers, b);
	free(body);
	return b->health_call ? 0 : -1;
}

static void ram_probe(struct backend *b)
{
	b->ram_probe_step = -1;
	if ((!reuse_mode_is_exact(b->d->router->mode) && (b->rb->can_save || b->rb->n_slots < 2)) ||
	    ram_probe_send(b) != 0)
		discover_models(b);
}

/* The probe could not tell (an error, a refusal): toki goes on without
 * knowing, and learns of a RAM cache at its first load instead
 * (note_ram_load). */
static void ram_probe_unknown(struct backend *b, const char *why)
{
	log_info("backend %s: could not tell whether it has a RAM cache (%s); toki will see it "
	         "at its first load from it",
	         b->rb->url, why);
	discover_models(b);
}

static void ram_probe_found(struct backend *b, int ram, int self_cleared)
{
	if (self_cleared)
		mark_self_cached(b);
	else if (ram && !b->rb->ram_cache && reuse_mode_is_exact(b->d->router->mode) &&
	         !b->rb->can_save)
		log_info(
		    "backend %s keeps the states of its slots in RAM (--cache-ram): exact mode "
		    "loads its own states back from there when a conversation returns to "
		    "another slot%s",
		    b->rb->url,
		    b->rb->restore_inexact ? " (not on this sliding-window model: a restored "
		                             "state does not continue exactly)"
		                           : "");
	else if (ram && !b->rb->ram_cache)
		log_info(
		    "backend %s keeps the states of its slots in RAM (--cache-ram): without slot "
		    "files toki lets it pick slots (fast mode), as it does alone; "
		    "--slot-save-path and --slot-dir would let toki do better",
		    b->rb->url);
	b->rb->ram_cache = ram;
	discover_models(b);
}

static void on_ram_probe_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	/* Not discovery's failure: the server answered everything discovery
	 * needs. If it is gone, the next step says so. */
	ram_probe_unknown(b, backend_error_text(err));
}

static void on_ram_probe_done(struct backend_call *call, int status, const char *body, size_t len,
                              void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	if (b->ram_probe_step < 0) {
		if (status != 501) {
			ram_probe_unknown(b, "it serves embeddings");
			return;
		}
		b->ram_probe_step = 0;
		if (ram_probe_send(b) != 0)
			discovery_failed(b, "out of memory");
		return;
	}
	/* That token may be any byte, NUL included (a random-weight model's). */
	json_t *r = json_body(status, body, len, -1);
	if (b->ram_probe_step == 4) {
		/* Is the first slot, idle since A, empty now? */
		size_t i;
		json_t *js;
		int emptied = 0;
		json_array_foreach(r, i, js)
		{
			if (json_integer_value(json_object_get(js, "id")) == b->ram_probe_slot)
				emptied =
				    json_integer_value(json_object_get(js, "n_prompt_tokens")) <= 0;
		}
		json_decref(r);
		ram_probe_found(b, 1, emptied);
		return;
	}
	json_t *t = json_object_get(r, "timings");
	json_int_t cache_n = json_integer_value(json_object_get(t, "cache_n"));
	json_int_t prompt_n = json_integer_value(json_object_get(t, "prompt_n"));
	int ok = json_is_object(t);
	json_decref(r);
	if (!ok) {
		char why[64];
		snprintf(why, sizeof why, "POST /completion answered %d", status);
		ram_probe_unknown(b, why);
		return;
	}
	if (b->ram_probe_step == 0)
		b->ram_probe_tokens = (int)(cache_n + prompt_n);
	else if (b->ram_probe_step == 2) {
		if (b->ram_probe_tokens < 16) {
			ram_probe_unknown(b, "its probe prompt was too short");
			return;
		}
		/* Less than half of A: only what A and B share (a token or
		 * two). A RAM cache gives back nearly all of it: all but the
		 * token evaluated, or on a sliding-window or hybrid model as
		 * far as its last context checkpoint (46 or 47 of 51 tokens:
		 * the whole but two read that as no cache, issue 24). */
		if (2 * cache_n < b->ram_probe_tokens) {
			ram_probe_found(b, 0, 0);
			return;
		}
		/* One slot: no other to empty (step 3). */
		if (b->rb->n_slots < 2) {
			ram_probe_found(b, 1, 0);
			return;
		}
	}
	b->ram_probe_step++;
	if (ram_probe_send(b) != 0)
		discovery_failed(b, "out of memory");
}

/* Discovery's end: the self-test has run (or was not needed). */
static void discovered(struct backend *b)
{
	struct selftest *t = &b->selftest;
	b->discovering = 0;
	if (b->rediscover) {
		/* Its settings changed while the self-test ran. */
		b->rediscover = 0;
		discover(b);
		return;
	}
	b->returning = 0;
	/* The Vulkan remedy is for answers that depend on what the server
	 * computed before, not for slots that share one KV cache. */
	if (t->state == SELFTEST_FAILED && !t->shared_kv && selftest_try_remedy(b))
		return; /* restarting; discovery runs again when it is back */
	if (t->shared_kv)
		mark_shared_kv(b);
	else
		b->rb->shared_kv = b->rb->self_cached;
	b->rb->steps = t->state == SELFTEST_VERIFIED && t->steps;
	if (t->state == SELFTEST_VERIFIED && !t->steps)
		log_warn("backend %s: exact: earlier answers are evaluated as batches here, and "
		         "their rows not kept after them: %s (docs/exact.md, \"Steps\")",
		         b->rb->url, t->steps_why);
	char verdict[400];
	selftest_verdict(t, verdict, sizeof verdict);
	slot_store_backend_ready(b->d, b, b->model_path);
	router_backend_set_up(b->d->router, b->rb, 1);
	prompt_probe_start(b, b->props);
	b->rb->discoveries++;
	b->ever_up = 1;
	b->early_checks = 8;
	b->last_failure[0] = '\0'; /* a later failure is news again */
	log_info("backend %s up: %s, %d slots of %d tokens, build %s", b->rb->url, b->model_id,
	         b->rb->n_slots, b->rb->n_ctx_slot, b->build_info);
	if (t->kept)
		log_info("backend %s: exact: %s", b->rb->url, verdict);
	else if (t->state == SELFTEST_VERIFIED || t->state == SELFTEST_UNKNOWN)
		log_info("backend %s: exact: %s (self-test, %.1f s%s%s)", b->rb->url, verdict,
		         t->seconds,
		         t->tries > 1 ? "; at the second try, the first ended early: " : "",
		         t->tries > 1 ? t->first_try : "");
	else if (t->state == SELFTEST_FAILED && !t->shared_kv)
		log_warn(
		    "backend %s: exact: %s. Answers on this server depend on what it "
		    "computed before them, cached or not, so no cache can make them a function "
		    "of the request alone. %s (docs/exact.md, \"GPU backends\")",
		    b->rb->url, verdict,
		    t->remedy ? "The remedy toki knows did not help"
		              : "On ggml-vulkan, start llama-server with "
		                "GGML_VK_DISABLE_COOPMAT=1");
	daemon_slots_changed(b->d, b->rb->index);
}

static void on_models_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	json_t *models = json_body(status, body, len, -1);
	const char *id = json_string_value(
	    json_object_get(json_array_get(json_object_get(models, "data"), 0), "id"));
	free(b->model_id);
	b->model_id = strdup(id ? id : "unknown");
	json_decref(b->models);
	b->models = models;
	b->health_call =
	    backend_call_start(b->http, "GET", "/lora-adapters", NULL, 0, &adapters_handlers, b);
	if (!b->health_call)
		discovery_failed(b, "out of memory");
}

/* The adapters the server computes with: a server without the route (an
 * older one) or without adapters has none. */
static void on_adapters_done(struct backend_call *call, int status, const char *body, size_t len,
                             void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	json_t *list = json_body(status, body, len, -1);
	free(b->adapters);
	b->adapters = json_is_array(list) && json_array_size(list)
	                  ? json_dumps(list, JSON_COMPACT | JSON_SORT_KEYS)
	                  : NULL;
	json_decref(list);
	/* Before the backend takes requests: nothing else runs on it. */
	b->forced_refused = 0;
	selftest_start(b, discovered);
}

static const struct backend_call_handlers props_handlers = {.on_done = on_props_done,
                                                            .on_error = on_discovery_error};

static void discover(struct backend *b)
{
	b->discovering = 1;
	b->health_call = backend_call_start(b->http, "GET", "/props", NULL, 0, &props_handlers, b);
	if (!b->health_call)
		discovery_failed(b, "out of memory");
}

void backend_rediscover(struct backend *b, const char *why)
{
	backend_mark_down(b, why);
	b->returning = 1;
	if (b->discovering) {
		/* Its calls are discovery's (the self-test's among them): it
		 * starts over when it ends. */
		b->rediscover = 1;
		return;
	}
	if (b->health_call) {
		backend_call_cancel(b->health_call); /* a health check: it has no state */
		b->health_call = NULL;
	}
	discover(b);
}

/* Slots toki filled are empty, yet each still names the task it last ran:
 * the server emptied them itself, without a task (a restart leaves a slot
 * with no task at all). llama-server does that to its idle slots at every
 * new task when its slots share one KV cache (no -np) and --cache-ram is
 * on: it moves them into its RAM cache. Marks the backend so, says once
 * what that means, and forgets what the slots held. Returns 1 then. */
static int self_cleared(struct backend *b, json_t *slots)
{
	size_t i;
	json_t *js;
	int cleared = 0, kept = 0;
	/* The slot that ran the latest task keeps its content. */
	json_int_t latest = -1;
	json_array_foreach(slots, i, js)
	{
		json_t *task = json_object_get(js, "id_task");
		if (json_is_integer(task) && json_integer_value(task) > latest)
			latest = json_integer_value(task);
	}
	json_array_foreach(slots, i, js)
	{
		struct router_slot *s = &b->rb->slots[i];
		json_t *task = json_object_get(js, "id_task");
		json_int_t n = json_integer_value(json_object_get(js, "n_prompt_tokens"));
		if (s->busy || !s->n_tokens || !json_is_integer(task) ||
		    json_integer_value(task) < 0 || json_integer_value(task) == latest)
			continue;
		if (n <= 0)
			cleared++;
		else
			kept++;
	}
	/* Every other idle slot emptied, not one here and there (a client
	 * erasing a slot by hand). */
	if (!cleared || kept)
		return 0;
	mark_self_cached(b);
	json_array_foreach(slots, i, js)
	{
		struct router_slot *s = &b->rb->slots[i];
		if (!s->busy && s->n_tokens &&
		    json_integer_value(json_object_get(js, "n_prompt_tokens")) <= 0)
			router_slot_forget(b->d->router, s);
	}
	return 1;
}

/* Compares what the server's slots hold with what the router thinks they
 * hold. A slot that holds fewer tokens than the router knows was used or
 * erased by someone else (a client talking to llama-server directly): the
 * router forgets that slot. When every slot the router thought full is
 * empty, the server restarted between two checks: what the router knew is
 * gone, and the server may have come back with other settings. Returns 1
 * for a restart. */
static int restarted_behind_our_back(struct backend *b, json_t *slots)
{
	if (json_array_size(slots) != (size_t)b->rb->n_slots)
		return 1;
	size_t i;
	json_t *js;
	int known = 0, empty = 0;
	json_array_foreach(slots, i, js)
	{
		struct router_slot *s = &b->rb->slots[i];
		if (s->busy || !s->n_tokens)
			continue;
		known++;
		json_t *held = json_object_get(js, "n_prompt_tokens");
		json_int_t n = json_is_integer(held) ? json_integer_value(held) : 0;
		if (n <= 0)
			empty++;
		else if ((size_t)n < s->n_tokens) {
			log_info("backend %s slot %zu holds %lld tokens, not the %zu toki sent: "
			         "someone else used it; forgetting what it held",
			         b->rb->url, i, (long long)n, s->n_tokens);
			router_slot_forget(b->d->router, s);
		}
	}
	if (empty && self_cleared(b, slots))
		return 0;
	if (empty && empty == known)
		return 1;
	if (empty) {
		json_array_foreach(slots, i, js)
		{
			struct router_slot *s = &b->rb->slots[i];
			json_int_t n = json_integer_value(json_object_get(js, "n_prompt_tokens"));
			if (!s->busy && s->n_tokens && n <= 0) {
				log_info("backend %s slot %zu is empty: erased by someone else; "
				         "forgetting what it held",
				         b->rb->url, i);
				router_slot_forget(b->d->router, s);
			}
		}
	}
	return 0;
}

static void on_health_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	if (status != 200) {
		/* 503 while loading the model: not up yet, not dead either. */
		backend_mark_down(b, "health check answered not ready");
		return;
	}
	if (b->rb->up) {
		json_error_t jerr;
		json_t *slots = json_loadb(body, len, JSON_BODY_FLAGS, &jerr);
		int restarted = json_is_array(slots) && restarted_behind_our_back(b, slots);
		json_decref(slots);
		if (!restarted)
			return;
		backend_mark_down(b, "it restarted (its slots are empty)");
	}
	discover(b);
}

static void on_health_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct backend *b = arg;
	b->health_call = NULL;
	backend_mark_down(b, backend_error_text(err));
}

static const struct backend_call_handlers health_handlers = {.on_done = on_health_done,
                                                             .on_error = on_health_error};

static void health_tick(evutil_socket_t fd, short what, void *arg)
{
	struct backend *b = arg;
	/* Until a backend is first up (a model loading) it is asked often, so
	 * that it serves as soon as it can; after that, at the set interval. */
	int ms = b->ever_up ? b->d->cfg.health_interval_ms : 200;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	event_add(b->health_timer, &tv);
	if (b->health_call || b->discovering || b->adapters_changing)
		return; /* the previous check is still out, or toki holds it out */
	/* /slots rather than /health: it answers only when the server is ready,
	 * and shows whether the slots still hold what the router thinks. */
	b->health_call = backend_call_start(b->http, "GET", b->rb->up ? "/slots" : "/health", NULL,
	                                    0, &health_handlers, b);
}

void backend_start(struct backend *b)
{
	b->health_timer = evtimer_new(b->d->base, health_tick, b);
	health_tick(-1, 0, b);
}

void backend_check_slots_now(struct backend *b)
{
	if (b->health_call || b->discovering || !b->rb->up)
		return; /* a check is out, or discovery will look anyway */
	b->health_call = backend_call_start(b->http, "GET", "/slots", NULL, 0, &health_handlers, b);
}

void backend_answer_ended(struct backend *b)
{
	if (b->early_checks > 0 && !b->rb->self_cached) {
		b->early_checks--;
		backend_check_slots_now(b);
	}
}

void backend_expect_restart(struct backend *b)
{
	backend_mark_down(b, "its llama-server died");
	b->ever_up = 0;
}

int backend_any_returning(struct daemon *d)
{
	for (int i = 0; i < d->n_backends; i++) {
		const struct backend *b = d->backends[i];
		if (!b->rb->up && (b->returning || b->adapters_changing))
			return 1;
	}
	return 0;
}

struct backend *backend_any_up(struct daemon *d)
{
	for (int i = 0; i < d->n_backends; i++)
		if (backend_is_up(d->backends[i]))
			return d->backends[i];
	return NULL;
}
