/* llama-server's RAM cache (--cache-ram, on by default), as exact mode uses
 * it. No I/O: the rule the server follows, applied to toki's records.
 *
 * When a completion task reaches a slot whose content it would mostly lose,
 * llama-server (build 11669, pinned tasks included) first copies that
 * content into a cache in host RAM, then loads from that cache the state
 * that suits the task better, if one does, and takes the loaded state out
 * of the cache. "Mostly lose": the task's longest common prefix with the
 * slot's content is under half of that content, or at most a tenth of the
 * task. "Better": a longer common prefix, both as a share of the state (at
 * least a quarter) and of the task, than the slot's own. An empty slot
 * never loads. (Measured: a slot holding 700 other tokens, sent a cut to
 * 500 tokens of a conversation that task moved there earlier, reused the
 * 500; see docs/exact.md.)
 *
 * Exact mode sends every task through router_ram_task, so toki knows which
 * of its own states the server keeps. Each was computed by toki on its
 * request's schedule (in exact mode nothing else uses the backend), so a
 * request may take its rows: a cut sent to a slot holding something else
 * makes the server load it (router_ram_would_load, the router's "ram"
 * route), and the cut's own count checks that it did. */
#ifndef TOKI_ROUTER_RAM_H
#define TOKI_ROUTER_RAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "router/radix.h"

struct router_slot;

/* At most this many states are counted on (the server keeps more, up to
 * its own limits, which toki cannot see). */
#define ROUTER_RAM_MAX_STATES 32

/* One state in the server's RAM cache: what toki recorded of the slot it
 * came from. */
struct router_ram_state {
	token_t *tokens; /* the tokens toki knows (the slot's record) */
	size_t n;
	size_t size; /* the server's count: n, and an answer's tokens after them */
	size_t aligned;
	size_t *bounds, n_bounds; /* the schedule rows [0, aligned) were computed on */
	TAILQ_ENTRY(router_ram_state) link;
};

TAILQ_HEAD(router_ram_list, router_ram_state);

/* A backend's RAM cache as toki knows it. All-zero, then router_ram_init. */
struct router_ram {
	struct router_ram_list states; /* oldest first, as the server keeps them */
	size_t n_states, tokens;
	uint64_t loads;  /* "ram" routes whose cut reused what was planned */
	uint64_t misses; /* ... and those that did not (the server had dropped it) */
};

void router_ram_init(struct router_ram *m);
/* Forgets every state (the server restarted, or its slots were redeclared). */
void router_ram_clear(struct router_ram *m);

/* A completion task goes to slot s: n_task tokens, of which the first
 * n_known are t[0..n_known) (a cut's last token is its throw-away one).
 * Applies the server's rule to toki's record of s: the state s holds goes
 * into the cache, and the one the server loads instead, if any, comes out.
 * Returns 1 when the server loads a state into s, 0 when s keeps its
 * content, -1 when out of memory (the model may then miss a state: a route
 * to it is never planned, which costs reuse, never an answer). */
int router_ram_task(struct router_ram *m, const struct router_slot *s, const token_t *t,
                    size_t n_known, size_t n_task);

/* The state the server would load into slot s for a cut of a request
 * tokens[0..n) back to keep tokens (keep + 1 tokens, the last a throw-away
 * one); m_s: the request's common prefix with s's content. NULL: none,
 * s keeps its content. */
const struct router_ram_state *router_ram_would_load(const struct router_ram *m,
                                                     const struct router_slot *s, size_t m_s,
                                                     const token_t *tokens, size_t n, size_t keep);

/* The common prefix of a state's tokens and tokens[0..n). */
size_t router_ram_match(const struct router_ram_state *e, const token_t *tokens, size_t n);

#endif
