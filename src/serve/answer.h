/* Rewriting the backend's answers: pure functions from facts and bytes to
 * bytes. Every byte the server wrote (its logprobs above all) stays as it
 * was, but for four things toki owns: the cache block it adds, the counts
 * of a request that ran in several backend steps (which must describe the
 * whole request), the last event of a stream, held back until toki knows
 * it is the last, and the probabilities toki asked for, for the token ids,
 * which the client did not. No I/O and no daemon state:
 * tests/unit/test_answer.c runs them on their own. */
#ifndef TOKI_SERVE_ANSWER_H
#define TOKI_SERVE_ANSWER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/strbuf.h"

/* What the backend says one answer (or step) cost. */
struct answer_timings {
	int seen; /* the answer had timings (or usage) */
	long long cache_n, prompt_n, predicted_n;
	double prompt_ms, predicted_ms;
};

/* A request that ran in several steps: what the whole request reused from
 * before it, what the server evaluated for it, in how long. steps 0: one
 * step, whose own counts are the request's (nothing is rewritten). */
struct answer_totals {
	int steps;
	long long cached, evaluated;
	double prompt_ms;
};

/* The facts the cache block reports (docs/api.md, "The cache block"). */
struct cache_facts {
	const char *backend; /* its URL */
	int slot;            /* -1: none (written as null) */
	const char *route;   /* hit, partial, miss, disk, unrouted */
	const char *mode;
	long long prompt_tokens, matched, reuse;
	int have_counts; /* the answer's timings were seen: cached and evaluated are known */
	long long cached, evaluated;
	int exact;                /* exact mode, routed: the schedule fields follow */
	const char *schedule;     /* messages or grid */
	const char *schedule_why; /* who rendered the messages, or why the grid */
	long long chunks, steps;
	long long replayed;  /* tokens evaluated one at a time (an earlier answer's steps) */
	const char *verdict; /* the backend's self-test verdict (NULL: none) */
	int trimmed;
	long max_tokens;
	int max_tokens_clamped;
	const char *restored; /* the slot file restored for it (NULL: none) */
	double est_prefill_ms;
	const char *tokenized; /* toki or server */
	const char *templated; /* toki, server, or NULL (a completion has no template) */
	double tokenize_ms;    /* 0: not measured */
};

/* The block as JSON text (malloc'd), or NULL when out of memory. Written as
 * text rather than through jansson: it goes into every answer, and building
 * it as objects was a tenth of the daemon's work per request. */
char *answer_cache_text(const struct cache_facts *f);
/* The same as a jansson object (an empty one when out of memory). */
json_t *answer_cache_json(const struct cache_facts *f);

/* Whether a client that filters the answer (llama-server's
 * response_fields) asked for the cache block. */
int answer_cache_wanted(const json_t *body);

/* The whole answer (or a stream's event) for the client: counts of a
 * multi-step request rewritten (totals; NULL or steps 0: none), then the
 * cache block (cache_text; NULL: not wanted) put before the final '}' of
 * its JSON object. A new buffer (NUL-terminated after out_len bytes), or
 * NULL when nothing changes (or out of memory: the caller then sends the
 * text as it is). */
char *answer_rewrite(const char *text, size_t len, const struct answer_totals *totals,
                     const char *cache_text, size_t *out_len);

/* The timings of a parsed answer or event (usage where there are none: the
 * Responses API without streaming). Leaves t as it was when there are
 * neither. */
void answer_timings_of(const json_t *obj, struct answer_timings *t);
/* The timings object at p, a flat object of keys and numbers, read from the
 * text: 1, or 0 when it is anything else (the caller parses it as JSON). */
int answer_scan_timings(const char *p, const char *end, struct answer_timings *t);
/* A whole (non-streamed) answer's timings: llama-server writes "timings"
 * last, so only that object is read when it can be; else the whole answer
 * is parsed. */
void answer_timings_in_body(const char *body, size_t len, struct answer_timings *t);

/* A progress event (its parsed data) with its prompt_progress set to
 * cache, processed and time_ms: the event's JSON text (malloc'd), or NULL
 * when out of memory. After earlier steps, the last step's events must
 * describe the whole request as one stream (reply.c, on_progress). */
char *answer_progress_event(json_t *event, long long cache, long long processed, double time_ms);

/* When toki's output cap cut an answer below what the client asked for, an
 * Anthropic client is told the turn ended (finish_reason "stop", not
 * "length"): Claude Code treats a hit max_tokens as an error. */
void answer_end_turn_at_cap(json_t *chat);

/* An answer as the message a next turn sends back, gathered from a whole
 * answer or from a stream's events: its text (a chat message's or delta's
 * content, a completion's text, /completion's content), its reasoning and
 * its tool calls, merged by index as deltas split them. Exact mode keeps
 * an answer's rows for the next turn by the tokens of this message
 * (serve/exec.c, the keep after an answer). */
struct answer_call {
	struct strbuf id, type, name, arguments;
};
struct answer_msg {
	struct strbuf text, reasoning;
	struct answer_call *calls;
	size_t n_calls;
	/* The generated tokens' ids, in order, where the answer lists them
	 * (its probabilities: the client's, or those toki asked for, below).
	 * llama-server lists a token only once its text is out: those of a
	 * stop string, a split UTF-8 character, or, in a stream, one whose
	 * text the chat parser holds back (an end of generation, a tool
	 * call's syntax) may be missing. */
	int32_t *ids;
	size_t n_ids, cap_ids;
	int finished;      /* a finish_reason came ... */
	int cut_at_length; /* ... and it was "length" */
	int failed;        /* out of memory, or a tool call delta it cannot place */
};

/* Adds what one answer (or stream event) carries. */
void answer_msg_add(struct answer_msg *m, const json_t *obj);
/* 1 when it has more than text (tool calls, reasoning): a next turn renders
 * those through the template, in ways the text alone does not tell. */
int answer_msg_structured(const struct answer_msg *m);
/* The assistant message (a new reference), or NULL when out of memory. */
json_t *answer_msg_json(const struct answer_msg *m);
void answer_msg_reset(struct answer_msg *m);
void answer_msg_free(struct answer_msg *m);

/* The answer's token ids, asked of the server where the client did not ask
 * for probabilities: llama-server lists each generated token's id with
 * them, and no other part of a chat answer does (return_tokens is
 * /completion's only). Asked as n_probs 1 after sampling, they cost a scan
 * of the sampler's last candidates per token; before sampling they would
 * cost a sort of the vocabulary per token, and after a chain that keeps
 * the whole vocabulary (top_k 0, even greedy), a sort of it (bench/
 * ids_cost.py, docs/benchmarks.md). So they are asked only where the sampling
 * chain (the request's parameters over the server's defaults, /props'
 * default_generation_settings params) has a top_k of at most
 * ANSWER_IDS_MAX_TOP_K. Nothing sampled changes: the same chain runs. */
#define ANSWER_IDS_MAX_TOP_K 1000
/* 1 when the client asked for the answer's probabilities (its ids come
 * with them). */
int answer_probs_asked(const json_t *body);
/* 1 when toki may add ANSWER_IDS_PARAMS to a chat request's body. */
int answer_ids_cheap(const json_t *body, const json_t *defaults);
/* Adds the parameters that ask for the ids to a request's body. */
int answer_ids_ask(json_t *body);
/* The answer (or a stream's event) as it would be without the
 * probabilities toki asked for: every "logprobs" member removed from the
 * JSON text, which llama-server otherwise leaves out. A new buffer
 * (NUL-terminated after out_len bytes), or NULL when there is none to
 * remove (or out of memory: the caller then sends the text as it is). */
char *answer_drop_probs(const char *text, size_t len, size_t *out_len);

/* The kinds of a stream's events that matter to toki. */
enum answer_event {
	ANSWER_EVENT_OTHER,
	ANSWER_EVENT_PROGRESS, /* a prompt_progress event */
	ANSWER_EVENT_TIMINGS,  /* a chunk with timings that may be the answer's last */
	ANSWER_EVENT_DONE,     /* data: [DONE] */
};
enum answer_event answer_event_kind(const char *data);

/* The event held back: llama-server puts timings in its last chunk, and
 * the cache block goes there; the chunk is known to be the last only when
 * the next event ([DONE]) or the end of the stream comes. Only a chunk that
 * may be the last is held: with timings_per_token every token's chunk has
 * timings, and holding those would send each token one event late. */
struct answer_hold {
	char *p;
	size_t len;
};
/* Holds raw (an event), appending the one held before it to out as it was.
 * -1 when out of memory (raw is then appended to out as it is). */
int answer_hold_keep(struct answer_hold *h, const char *raw, size_t len, struct strbuf *out);
/* Appends the held event to out, rewritten with totals and cache_text as
 * answer_rewrite does (both NULL: as it was), and holds nothing. */
void answer_hold_release(struct answer_hold *h, const struct answer_totals *totals,
                         const char *cache_text, struct strbuf *out);
void answer_hold_free(struct answer_hold *h);

#endif
