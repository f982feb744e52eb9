/* The daemon context: the one place that holds mutable state for `toki
 * serve`. Every module gets what it needs from here; nothing is global. */
#ifndef TOKI_DAEMON_H
#define TOKI_DAEMON_H

#include <stdint.h>
#include <event2/event.h>

#include "router/router.h"

struct http_server;
struct backend;
struct serve_state;

struct daemon_config {
	const char *host;
	int port;
	const char **backend_urls;
	int n_backends;
	enum reuse_mode mode;
	int n_ubatch;          /* the backends' micro-batch size (-ub), for exact mode */
	int backend_timeout_s; /* TOKI_BACKEND_TIMEOUT */
	int keepalive_ms;      /* SSE keep-alive comment interval while the backend is silent */
	int health_interval_ms;
	size_t max_body_bytes;
	int client_timeout_s;     /* a client's time for a request head (and body), or idle */
	int allow_remote;         /* binding beyond loopback was asked for explicitly */
	const char *slot_dir;     /* the backends' --slot-save-path, shared with toki */
	long max_output;          /* cap on a request's output tokens (0: none) */
	char token[128];          /* the local token every route but /health needs */
	uint64_t slot_disk_bytes; /* cap on the saved slot files */
	int save_idle_ms;         /* save a slot idle this long (0: only on eviction and exit) */
	int slot_compress;        /* zstd level for slot files (0: stored as they are) */
	const char *kv_settings;  /* llama-server settings that shape KV, for fingerprints */
	int local_prompts; /* template and tokenize in toki when the probes match (--tokenize) */
	const char *backend_key; /* the backends' --api-key (--backend-key, TOKI_BACKEND_KEY) */
};

struct daemon_stats {
	uint64_t requests, routed, hits, partials, misses, errors;
	uint64_t prompt_tokens, evaluated_tokens, cached_tokens, trim_tokens;
	uint64_t saves, restores, disk_hits, saved_evictions, discarded_files;
	uint64_t replans;       /* requests planned again after the server disagreed */
	uint64_t prefill_steps; /* chunks evaluated as steps of their own */
	/* Exact mode: cuts of a slot's tail after an answer, and the tokens
	 * they evaluated (one each), which no request's cache block counts:
	 * /toki/stats evaluated_tokens does. */
	uint64_t tail_cuts, tail_cut_tokens;
	/* ... of which keeps: answers whose rows stay in their slot for the
	 * next turn, and how many rows (exec.c, the keep after an answer). */
	uint64_t answers_kept, answer_rows_kept;
	uint64_t answers_kept_by_ids; /* ... by the generated tokens' ids */
	uint64_t replayed_tokens;     /* prefill steps of one token: earlier answers' steps */
	/* ... of which rows a forced generation decoded (exec.c, forced_body):
	 * llama-server counts them as predicted tokens, not prompt tokens. */
	uint64_t replay_forced_tokens;
};

struct daemon {
	struct event_base *base;
	struct daemon_config cfg;
	struct http_server *http;
	struct router *router;
	struct backend **backends;
	int n_backends;
	struct serve_state *serve; /* the request path's queue and requests (src/serve/) */
	int n_waiting;             /* requests waiting for a slot or a backend */
	/* Told which backends' slots changed (bit i: backend i), on the loop
	 * turn after the change: the request path's queue sets it (serve_init),
	 * so that nothing here calls up into it. */
	void (*on_slots_changed)(struct daemon *d, uint64_t backends);
	uint64_t changed; /* backends changed since the hook last ran */
	struct daemon_stats stats;
	struct event *sigint, *sigterm;
	struct supervisor *supervisor; /* the llama-server toki started, if any */
	int64_t started_us;
	uint64_t save_counter;
	int saving;                /* an idle save is running */
	struct save_all *save_all; /* the shutdown saves */
	int shutting_down;
	struct event *wake; /* retries the waiting requests on the next loop turn */
	int exit_code;      /* what toki serve exits with once its loop ends */
};

/* A slot of backend `index` ended, or the backend came up or finished its
 * probes: the waiting requests that may run there are retried on the next
 * turn of the loop, never inside the caller's own callback (a retry can
 * finish requests, and the caller may be in the middle of one). */
void daemon_slots_changed(struct daemon *d, int index);
void daemon_free_events(struct daemon *d);

#endif
