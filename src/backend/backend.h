/* One llama-server backend: its HTTP client, what discovery learned from it
 * (/props, /slots, /v1/models), and a periodic health check that takes it
 * out of the pool when it dies and puts it back, rediscovered, when it
 * returns. */
#ifndef TOKI_BACKEND_H
#define TOKI_BACKEND_H

#include <jansson.h>

#include "backend/backend_http.h"
#include "backend/selftest.h"
#include "backend/slot_store.h"
#include "router/router.h"

struct daemon;
struct supervisor;

struct backend {
	struct daemon *d;
	struct backend_http *http;
	struct router_backend *rb;
	struct event *health_timer;
	struct backend_call *health_call;
	int discovering;
	int ever_up;
	char *build_info;
	char *model_id;   /* id reported by /v1/models */
	json_t *models;   /* the backend's /v1/models answer */
	char *model_path; /* /props model_path */
	json_t *props;    /* the last /props answer */
	/* The server's LoRA adapters and their scales (GET /lora-adapters, as
	 * compact JSON), which its rows are computed with: part of its saved
	 * states' fingerprint. NULL: it has none. */
	char *adapters;
	/* Taken out of routing while toki changes its adapter scales (POST
	 * /lora-adapters, routes.c): no health check discovers it until the
	 * change is answered. */
	int adapters_changing;
	/* Its settings changed during a discovery: discovery runs again when
	 * this one ends (backend_rediscover). */
	int rediscover;
	/* Discovered again at toki's own request (backend_rediscover): what
	 * needs a backend waits for it until that discovery ends. */
	int returning;
	/* Without --slot-dir: bytes written under each name toki used in the
	 * server's own folder (0: never used), what that folder holds of toki's. */
	uint64_t remote_bytes[SLOT_REMOTE_MAX_NAMES];
	/* Answers after which toki looks at /slots at once (the first few of a
	 * discovery): a server that empties its idle slots shows it after its
	 * second request, before toki has pinned many (router.h, self_cached). */
	int early_checks;
	/* The RAM cache probe (backend.c, ram_probe): its slot, its step, and
	 * how many tokens its first prompt has. */
	int ram_probe_slot, ram_probe_step, ram_probe_tokens;
	/* Prompts made in toki (backend/prompt_probe.h): the engine, what of it
	 * matched the server, and how it has done since. */
	struct prompt_engine *prompt;
	int prompt_tokens_ok, prompt_chat_ok;
	char prompt_status[200];
	struct prompt_probe *probe;
	/* Exact mode's renderings of message prefixes by the server
	 * (backend/prefix_render.h), and how often they were dropped. */
	struct prefix_render_cache *renders;
	unsigned renders_gen;
	struct prompt_audit *audits; /* in flight */
	uint64_t prompt_local, prompt_server, prompt_audits, prompt_mismatches;
	uint64_t prompt_local_us, prompt_server_us; /* time spent making prompts, each way */
	/* Message prefixes exact mode wanted rendered by the server, and those
	 * it asked for (the rest were kept from earlier requests). */
	uint64_t prompt_prefixes, prompt_prefixes_rendered;
	/* For /metrics: routed requests by API (enum route_kind, request_check.h);
	 * exact mode's by schedule (0: messages, 1: grid) and those planned again
	 * from an empty slot after the server disagreed. */
	uint64_t routed_by_api[4];
	uint64_t exact_schedule[2], exact_cold_replans;
	/* Exact mode's self-test (backend/selftest.h), run at every discovery. */
	struct selftest selftest;
	/* The server answered a forced generation (serve/exec.c, forced_body)
	 * otherwise than asked: an earlier answer's steps go one request each
	 * until the next discovery. */
	int forced_refused;
	/* The llama-server behind it when toki started it (toki serve
	 * --model): a failed self-test may restart it with a remedy. */
	struct supervisor *managed;
	/* Why the last discovery failed, so that a backend that keeps failing
	 * the same way is logged once, not at every health check. */
	char last_failure[320];
};

struct backend *backend_new(struct daemon *d, const char *url, char *err, size_t errlen);
void backend_free(struct backend *b);
/* The key llama-server was started with (--api-key): sent as
 * Authorization: Bearer on every call to it from now on. 0, or -1 when out
 * of memory. */
int backend_set_key(struct backend *b, const char *key);
/* Starts discovery now and health checks every interval. */
void backend_start(struct backend *b);
int backend_is_up(const struct backend *b);
/* The first healthy backend, for routes that need no slot (NULL: none). */
struct backend *backend_any_up(struct daemon *d);
/* 1 when a backend that is not up will be soon: toki holds it out for a
 * moment (adapters_changing) or discovers it again (returning). What needs
 * a backend waits for it then, rather than failing. */
int backend_any_returning(struct daemon *d);
/* A call failed to connect: take the backend out until a health check
 * succeeds again. */
void backend_mark_down(struct backend *b, const char *why);
/* The process behind it died and is being restarted: down now, and polled
 * often until it is back. */
void backend_expect_restart(struct backend *b);
/* The backend's KV means something else now (why): down at once, its slots
 * and RAM cache forgotten, and discovered again (its settings read into its
 * saved states' fingerprint); requests wait for it. */
void backend_rediscover(struct backend *b, const char *why);
/* Discovery could not finish (why): the backend is down until a health
 * check starts it again. */
void backend_discovery_failed(struct backend *b, const char *why);
/* Looks at the server's slots now rather than at the next health check: a
 * request found its slot holding less than toki thought. */
void backend_check_slots_now(struct backend *b);
/* An answer ended: one of the first few of a discovery makes toki look at
 * the slots at once (early_checks). */
void backend_answer_ended(struct backend *b);

#endif
