/* A small blocking client for a toki daemon (or any OpenAI-compatible server,
 * llama-server included), on libcurl: finding the daemon, the local token,
 * plain requests, and streamed chat completions with their timings (time to
 * the first token, llama-server's prompt_n/cache_n, toki's `cache` block).
 *
 * Shared by `toki tui`, `toki diff` and `toki web`. Every call blocks the
 * calling thread; a streamed call can be cancelled from another thread
 * through an atomic flag. A struct client is read-only once made, so one may
 * serve several threads at once (each call uses its own curl handle).
 * curl_global_init() must have run before threads start: client_global_init()
 * does it and is idempotent (call it from the main thread first). */
#ifndef TOKI_UI_CLIENT_H
#define TOKI_UI_CLIENT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>

#define CLIENT_DEFAULT_URL "http://127.0.0.1:8787"

struct client {
	char *base_url; /* "http://host:port", no trailing slash, no /v1 */
	char *token;    /* sent as Authorization: Bearer; NULL: none */
	long connect_timeout_ms;
};

/* Where the base URL came from. */
enum client_url_source {
	CLIENT_URL_GIVEN,   /* the caller's --url */
	CLIENT_URL_RUN,     /* a run `toki model use` / `toki up` started */
	CLIENT_URL_DEFAULT, /* nothing runs: CLIENT_DEFAULT_URL */
};

/* What a probe or a call found. */
enum client_status {
	CLIENT_OK = 0,
	CLIENT_DOWN = -1, /* nothing answers at the URL (connection refused, no route, timeout) */
	CLIENT_HTTP_ERROR = -2, /* it answered with an error status */
	CLIENT_ERROR = -3,      /* anything else: bad URL, out of memory, a broken stream */
	CLIENT_CANCELLED = -4,  /* the cancel flag was set */
};

/* curl_global_init once. 0, or -1 with err. */
int client_global_init(char *err, size_t errlen);

/* The run to talk to when no URL is given: the registry's active model when
 * several run, else the first (also when the active one is not among them).
 * One choice for toki tui, toki diff and toki web. Fills ri and *nr (how many
 * run); returns the picked run's index, or -1 when none runs. */
struct run_info;
int client_pick_run(struct run_info *ri, int *nr);

/* Finds the daemon: `url` when given (normalised: http:// added when there is
 * no scheme, a trailing "/" or "/v1" dropped); else the live run (the
 * registry's active model when several run, else the first); else
 * CLIENT_DEFAULT_URL. out gets the base URL; run_name (may be NULL) gets the
 * run's name, or "". */
enum client_url_source client_find_daemon(const char *url, char *out, size_t n, char *run_name,
                                          size_t run_name_len);

/* Makes a client for base_url (normalised as above) with the local token
 * (auth_load_token: $TOKI_TOKEN, else $TOKI_STATE_DIR/token). A token that
 * cannot be loaded is not an error here: requests go without one, and a
 * daemon that wants one answers 401, which the error text explains. 0, or -1
 * when out of memory. */
int client_init(struct client *c, const char *base_url);
void client_free(struct client *c);

/* One request. body may be NULL (then none is sent); a body is sent as
 * application/json. *status gets the HTTP status (0 when none came);
 * *resp (may be NULL) gets the body, NUL-terminated, owned by the caller.
 * timeout_ms 0: no limit. Returns CLIENT_OK for any HTTP answer; CLIENT_DOWN
 * or CLIENT_ERROR with err otherwise. */
int client_request(const struct client *c, const char *method, const char *path, const char *body,
                   long timeout_ms, long *status, char **resp, char *err, size_t errlen);

/* Whether the daemon answers, and its model: GET /v1/models. model (may be
 * NULL) gets the first model's id. CLIENT_OK; CLIENT_DOWN with a message
 * that says how to start one; CLIENT_HTTP_ERROR with the server's message
 * (401 says where the token comes from). */
int client_probe(const struct client *c, char *model, size_t model_len, char *err, size_t errlen);

/* --- Streamed chat --------------------------------------------------------- */

enum client_delta_kind {
	CLIENT_DELTA_CONTENT,
	CLIENT_DELTA_REASONING, /* reasoning_content (thinking models) */
};

/* Called on the calling thread while the stream runs; any may be NULL. */
struct client_stream_handlers {
	/* An SSE comment line, without the leading ':' and space (toki's
	 * ": toki route=... est_prefill_ms=..." and ": keep-alive"). */
	void (*on_comment)(const char *text, void *arg);
	/* A piece of the answer, as it arrives (UTF-8; a piece may end inside
	 * a character only if the server split one, which llama-server does not). */
	void (*on_delta)(enum client_delta_kind kind, const char *text, size_t len, void *arg);
	/* Every data event's JSON (borrowed), after the fields above were taken. */
	void (*on_chunk)(json_t *chunk, void *arg);
};

struct client_stream_result {
	long status;         /* HTTP status; 0 when no answer came */
	double ttft_ms;      /* request start to the first non-empty delta; -1: none came */
	double total_ms;     /* request start to the end of the stream */
	long prompt_tokens;  /* the whole prompt; -1: unknown */
	long evaluated;      /* tokens llama-server evaluated (timings.prompt_n); -1: unknown */
	long cached;         /* tokens it reused (timings.cache_n); -1: unknown */
	long predicted;      /* output tokens (timings.predicted_n); -1: unknown */
	double prompt_ms;    /* llama-server's prefill time; -1: unknown */
	double predicted_ms; /* its generation time; -1: unknown */
	char route[16]; /* from toki's first comment or cache block: hit|partial|miss|disk; "" */
	long reuse;     /* toki's planned reuse; -1: unknown */
	double est_prefill_ms;  /* toki's estimate; -1: unknown */
	char finish_reason[32]; /* "" when none came */
	char *text;             /* the answer's content, NUL-terminated (owned) */
	size_t text_len;
	char *reasoning; /* reasoning_content, NUL-terminated (owned) */
	size_t reasoning_len;
	json_t *timings; /* llama-server's timings (owned), or NULL */
	json_t *cache;   /* toki's cache block (owned), or NULL (not toki) */
	char err[512];   /* set when the call does not return CLIENT_OK */
};

/* POSTs body (a JSON object; "stream": true is added to a copy, the caller's
 * object is not changed) to path (NULL: /v1/chat/completions) and reads the
 * event stream to its end. cancel (may be NULL) is polled: set it to stop.
 * Returns CLIENT_OK when the stream ended with [DONE] (or closed cleanly after
 * data); CLIENT_DOWN, CLIENT_HTTP_ERROR (r->status and the server's message
 * in r->err), CLIENT_ERROR (an error event in the stream, or a stream cut
 * short) or CLIENT_CANCELLED otherwise. *r is always filled (what arrived
 * before a failure stays in it); free it with client_stream_result_free(). */
int client_chat_stream(const struct client *c, const char *path, json_t *body,
                       const struct client_stream_handlers *h, void *arg, const atomic_int *cancel,
                       struct client_stream_result *r);
void client_stream_result_free(struct client_stream_result *r);

/* Builds a chat request body: {"messages": messages (borrowed, copied by
 * reference), "temperature": temperature (< 0: not set), "max_tokens":
 * max_tokens (<= 0: not set), "cache_prompt": false when raw}. New reference,
 * or NULL when out of memory. */
json_t *client_chat_body(json_t *messages, double temperature, long max_tokens, int raw);

#endif
