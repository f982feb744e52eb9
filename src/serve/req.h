/* A request on its way through toki: the parts of its state, each written by
 * one module of src/serve/ (the map is src/serve/README.md), and the calls
 * between those modules. Nothing outside src/serve/ includes this. */
#ifndef TOKI_SERVE_REQ_H
#define TOKI_SERVE_REQ_H

#include <event2/event.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/queue.h>

#include "api/request_check.h"
#include "backend/backend.h"
#include "http/sse.h"
#include "router/router.h"
#include "router/sched.h"
#include "serve/answer.h"

struct daemon;
struct http_request;
struct anthropic_stream;
struct prefix_render;

/* Where a request is: the step it runs (exec.c's table: each backend call
 * is one), or waiting in the queue. */
enum req_state {
	RS_TEMPLATE, /* the server applies the chat template (/apply-template) */
	RS_TOKENIZE, /* the server tokenizes the prompt (/tokenize), or nothing is out */
	RS_WAITING,  /* queued for a slot or a backend (wait.c) */
	RS_SAVE,     /* saving the slot's content to a file before it is replaced */
	RS_RESTORE,  /* restoring a saved state into the slot */
	RS_CUT,      /* cutting the slot back to the reuse point */
	RS_PREFILL,  /* evaluating a chunk of the prompt (exact mode's schedule) */
	RS_GENERATE, /* the request itself is on the backend */
	RS_SETTLE,   /* cancelled: waiting for the server to free the slot (exact mode) */
	RS_TAILCUT,  /* answered: cutting the slot back to what exact mode can reuse */
	RS_DONE,
	RS_COUNT,
};

/* What the client asked, translated for the backend (req.c). The body is
 * never changed once made: each backend call is written from it with what
 * that call adds (exec.c), so that a retry or a replan starts clean. */
struct req_ask {
	enum route_kind kind;
	char backend_path[64];
	char client_path[64];
	json_t *body;          /* the request for the backend */
	json_t *template_body; /* the chat request whose template gives the tokens (RESPONSES) */
	char *client_model;    /* the model name the client sent (ANTHROPIC echoes it) */
	int stream;
	int client_uncached; /* the client sent cache_prompt: false */
	/* The client's per-request adapter scales ("lora", a non-empty array),
	 * as compact JSON, which every step of its evaluation carries; NULL
	 * for the server's own scales. */
	char *lora;
	int count_only;   /* count_tokens: answer with the count, generate nothing */
	uint64_t allowed; /* backends serving the requested model (bit i: backend i) */
	int64_t t_start_us;
};

/* The prompt as tokens, and who made it (req.c). */
struct req_prompt {
	token_t *tokens;
	size_t n_tokens;
	int routable; /* one prompt, tokenized: the router can place it */
	/* Exact mode: the chunk starts of the request's schedule (none: the
	 * grid; router/sched.h). */
	size_t *bounds, n_bounds;
	/* ... and the same without steps (router/sched.h), for a backend
	 * where they do not give generation's rows (NULL: the same). */
	size_t *plain_bounds, n_plain_bounds;
	int local;                      /* toki tokenized the prompt itself */
	int local_template;             /* ... and applied the chat template too */
	int force_server;               /* ... and then found it wrong: the server does it now */
	int fault;                      /* the server's prompt is not toki's: toki's is dropped */
	struct backend *engine_backend; /* whose engine made the prompt */
	struct prefix_render *render;   /* the server's renderings in flight (RS_TEMPLATE) */
	const char *starts_by; /* who rendered the messages the starts came from: toki, server */
	struct backend *tokenize_backend;   /* who was asked for the tokens (or whose engine) */
	int64_t t_tokenize_us, tokenize_us; /* when tokenizing began; what it took */
};

/* The decisions about where it runs and how often it is tried (req.c). */
struct req_tries {
	uint64_t excluded; /* backends that failed this request before it streamed */
	int retries;
	int replans;    /* times the request was planned again (bounded) */
	int replanning; /* a replan is scheduled: the old call's events are ignored */
	int force_cold; /* a step found the slot not as planned: start from empty */
	struct event *replan_ev;
	long max_tokens;    /* the output cap sent to the backend */
	int output_clamped; /* the client asked for more than fits */
	int set_cap;        /* the cap goes into the body (the client's was none or too big) */
};

/* The plan and its execution on one slot (exec.c). */
struct req_run {
	struct backend *backend;
	struct backend_call *call;
	struct route_choice choice;
	struct router_slot *slot; /* held (busy) while set */
	struct plan plan;
	size_t done_upto;         /* how far the slot holds the prompt, on its schedule */
	int steps;                /* backend calls before GENERATE that evaluated tokens */
	size_t replayed;          /* ... of which one token each: an earlier answer's steps */
	size_t forced;            /* the run of such steps in flight as one forced generation */
	size_t forced_failed;     /* ... and where one that failed on the server ends */
	long long steps_prompt_n; /* ... and what they evaluated */
	double steps_prompt_ms;
	token_t cut_junk; /* the token a cut leaves after the kept prefix */
	size_t cut_keep;  /* ... and how much of the prompt it keeps */
	token_t *kept;    /* exact mode's keep after an answer: the prompt, the answer */
	size_t n_kept;    /* ... (then a throw-away token, when kept_junk) */
	int kept_junk;
	int kept_by_ids;     /* ... the tokens by the ids the answer listed */
	int counted;         /* its evaluated tokens are in the stats */
	int abandoned;       /* the client went away during a prefill step, left to end */
	size_t abandoned_at; /* where the step in flight then began */
	int saving; /* a slot save is out: it holds the request, and frees it if it ended */
	int restored;
	char restored_name[96];
	int added_progress; /* toki asked for return_progress (its events are dropped) */
	int added_probs; /* toki asked for the answer's token ids (its probabilities are dropped) */
	int progress_checked; /* the first progress event was checked against the plan */
	int64_t t_route_us;   /* its first routing try: a wait for a slot starts there */
	int64_t t_forward_us;
	struct event *idle_ev; /* after a cancel: the next look at the slot */
};

/* The answer on its way to the client (reply.c). */
struct req_reply {
	struct http_request *client; /* NULL once the client has gone (or was answered) */
	int stream_begun;            /* the client's SSE response has begun (200 sent) */
	struct anthropic_stream *astream;
	int status; /* the backend's HTTP status */
	struct sse_parser sse;
	struct answer_hold hold;
	int done_sent;
	int gen_started; /* the last step's prompt was evaluated (a token came) */
	/* The client's progress stream after earlier steps: begun, and the
	 * last `processed` it was sent (on_progress). */
	int progress_started;
	long long progress_sent;
	struct answer_timings t;
	/* Exact mode: the answer as a message, whose tokens the slot's rows
	 * may be kept for (exec.c, the keep after an answer). */
	struct answer_msg msg;
	struct evbuffer *errbuf; /* a non-200 backend body during a stream */
	struct event *keepalive;
	struct event *begin_timer; /* begins a streamed answer if the backend is slow to */
	int64_t t_last_write_us, t_first_byte_us;
	int64_t t_first_data_us; /* the first body bytes of a 200 stream from the backend */
};

struct serve_req {
	struct daemon *d;
	enum req_state state;
	int needs_begin; /* queued for a backend to make its prompt on (wait.c) */
	struct req_ask ask;
	struct req_prompt prompt;
	struct req_tries tries;
	struct req_run run;
	struct req_reply reply;
	TAILQ_ENTRY(serve_req) wait_link;   /* in the wait queue (wait.c) */
	TAILQ_ENTRY(serve_req) active_link; /* every request in flight (wait.c) */
};

TAILQ_HEAD(serve_req_list, serve_req);

/* A route that only needs some backend up (a pass-through, /v1/models),
 * parked while the supervised llama-server restarts: handled again once a
 * backend is up (wait.c). */
typedef void (*serve_route_fn)(struct daemon *d, struct http_request *req);
struct serve_parked {
	struct daemon *d;
	struct http_request *client;
	serve_route_fn handler;
	int64_t t_start_us;
	TAILQ_ENTRY(serve_parked) link;
};
TAILQ_HEAD(serve_parked_list, serve_parked);

/* A client of GET /toki/idle, answered once nothing runs here (wait.c,
 * wait_idle): the endpoint holds a model's CPU turn until then. */
struct serve_idle_waiter {
	struct daemon *d;
	struct http_request *client;
	int64_t deadline_us;
	TAILQ_ENTRY(serve_idle_waiter) link;
};
TAILQ_HEAD(serve_idle_list, serve_idle_waiter);

/* The queue of waiting requests and the list of those in flight; the daemon
 * holds it as an opaque pointer (daemon.h, serve). */
struct serve_state {
	struct serve_req_list waiting;
	struct serve_req_list active;
	struct serve_parked_list parked;
	struct serve_idle_list idle;
	struct event *idle_check; /* while idle waiters wait: a poll, and the last end */
	/* Shutdown: run when the last request in flight has ended. */
	void (*drained)(void *arg);
	void *drained_arg;
	struct event *drain_timeout;
};

/* ---- req.c: a request's life ---- */
void req_fail(struct serve_req *r, int status, const char *message);
void req_finish(struct serve_req *r);
void req_free(struct serve_req *r);
/* A routed request's start: the client's body translated for the backend
 * (kind, backend_path), then the prompt made. count_only: count_tokens. */
void req_start(struct daemon *d, struct http_request *req, enum route_kind kind,
               const char *backend_path, int count_only);
/* The whole answer was sent (status: the backend's, 0 without timings):
 * the audit, the log line, the slot's record. */
void req_answered(struct serve_req *r, int status);
/* Makes the prompt (here, or through backend b), then routes. */
void req_begin(struct serve_req *r, struct backend *b);
/* The output cap for a slot of n_ctx_slot (answers and finishes a prompt
 * that does not fit: -1). */
int req_clamp_output(struct serve_req *r, int n_ctx_slot);
/* Writes the output cap into an attempt's body. */
void req_apply_cap(const struct serve_req *r, json_t *body);
/* The server's first words on a plan (its prompt's total and reuse):
 * 1 when a replan was scheduled. */
int req_check_plan(struct serve_req *r, long long total, long long cache);
/* A plan went wrong: planned again on the next loop turn (from empty when
 * cold). */
void req_replan(struct serve_req *r, const char *why, int cold);
/* A backend failed before any of the answer reached the client: 1 when the
 * request went to another backend. */
int req_try_elsewhere(struct serve_req *r, enum backend_error err);
/* The first up backend the request's model allows, or NULL. */
struct backend *req_any_backend(struct serve_req *r);
/* Said when the server's prompt count differs from toki's prompt. */
void req_prompt_disagrees(struct serve_req *r, long long n_server);
int req_exact(const struct serve_req *r);

/* ---- exec.c: routing, the plan's steps, and the slot's record ---- */
void exec_route(struct serve_req *r);
/* The client went away: 1 when the request goes on to settle its slot. */
int exec_client_gone(struct serve_req *r);
/* The answer ended (status 200 and timings seen: success): the slot's
 * record, then the request's end. */
void exec_answered(struct serve_req *r, int success);
/* Gives the slot back with its content unknown (a replan, a retry). */
void exec_drop_slot(struct serve_req *r);
/* A client-pinned slot: its record forgotten, held if free. */
void exec_pin_slot(struct serve_req *r, struct router_slot *s, double est_s);
/* A slot changed behind the router's back (a pass-through slot action). */
void exec_slot_overwritten(struct daemon *d, struct router_slot *s);
/* The request's end: its call ended, its slot given back unknown. */
void exec_release(struct serve_req *r);
/* A backend call of the request failed: tried elsewhere, or failed. */
void exec_call_failed(struct serve_req *r, enum backend_error err);
/* Sends the request itself (a request with no plan: not routable). */
void exec_generate(struct serve_req *r);
/* Ends whatever backend call is out. */
void exec_cancel_call(struct serve_req *r);
/* The whole request's counts, all its steps together. */
long long exec_cached(const struct serve_req *r);
long long exec_evaluated(const struct serve_req *r);
/* What the answer's counts are rewritten to (exec.c knows the steps). */
void exec_totals(const struct serve_req *r, struct answer_totals *t);

/* ---- reply.c: the answer to the client ---- */
void reply_write(struct serve_req *r, const char *data, size_t len);
void reply_json(struct http_request *req, int status, json_t *obj);
/* A streamed answer begins after 250 ms without the backend's (arm), or
 * when the backend's begins. */
void reply_arm_stream(struct serve_req *r);
void reply_begin_stream(struct serve_req *r);
/* The facts of the cache block. */
void reply_cache_facts(const struct serve_req *r, struct cache_facts *f, char *verdict, size_t vn);
/* The backend call of the GENERATE step: its handlers. */
extern const struct backend_call_handlers reply_stream_handlers, reply_handlers;
void reply_start_attempt(struct serve_req *r);
void reply_free(struct req_reply *p);
/* An error for the client: a JSON answer if nothing was sent yet, else an
 * error event that ends the stream. */
void reply_error(struct serve_req *r, int status, const char *message);
/* A replan throws away what the old attempt's answer left. */
void reply_new_attempt(struct serve_req *r);

/* ---- routes.c ---- */
/* Passes req on to a backend that is up, as it is; parked while the managed
 * llama-server restarts. */
void routes_pass_through(struct daemon *d, struct http_request *req);

/* ---- wait.c: the queue ---- */
void wait_add(struct serve_req *r);
void wait_remove(struct serve_req *r);
/* Parks req until a backend is up, then runs handler(d, req) again; it
 * counts as waiting, under the same deadline as the queue's requests. */
void wait_park(struct daemon *d, struct http_request *req, serve_route_fn handler);
void active_add(struct serve_req *r);
void active_remove(struct serve_req *r);
/* GET /toki/idle: answers req once nothing runs here (no request in its
 * life, the work after an answer included: the keep, the tail cut, the
 * settle after a cancel; no idle save), or after wait_ms (0: at once), with
 * {"idle", "requests", "saving"}. */
void wait_idle(struct daemon *d, struct http_request *req, long wait_ms);
#define SERVE_IDLE_WAIT_MS 10000 /* the longest, and a client's default */

#endif
