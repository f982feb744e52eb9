#include "router/ram.h"

#include <stdlib.h>
#include <string.h>

#include "router/router.h"

/* The server's own limits on its cache (its size in MiB and a token count)
 * are not visible from here; beyond these toki stops counting on a state,
 * and a state the server dropped sooner is found out by the cut that asked
 * for it (a miss). */
#define RAM_MAX_STATES ROUTER_RAM_MAX_STATES
#define RAM_MAX_TOKENS (1u << 20)

/* llama-server's thresholds (server_context::get_available_slot and
 * server_prompt_cache::load, build 11669). */
#define SIM_MIN 0.1f   /* --slot-prompt-similarity's default */
#define KEEP_MIN 0.5f  /* under this share of its content kept, a slot's content is cached */
#define LOAD_MIN 0.25f /* a state is loaded only if it keeps at least this share of itself */

void router_ram_init(struct router_ram *m)
{
	memset(m, 0, sizeof *m);
	TAILQ_INIT(&m->states);
}

static void state_free(struct router_ram *m, struct router_ram_state *e)
{
	TAILQ_REMOVE(&m->states, e, link);
	m->n_states--;
	m->tokens -= e->n;
	free(e->tokens);
	free(e->bounds);
	free(e);
}

void router_ram_clear(struct router_ram *m)
{
	while (!TAILQ_EMPTY(&m->states))
		state_free(m, TAILQ_FIRST(&m->states));
}

static size_t common(const token_t *a, size_t na, const token_t *b, size_t nb)
{
	size_t i = 0, n = na < nb ? na : nb;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

size_t router_ram_match(const struct router_ram_state *e, const token_t *tokens, size_t n)
{
	return common(e->tokens, e->n, tokens, n);
}

/* The server's count of what slot s holds: its prompt, and the answer
 * after it until exact mode's tail cut takes it off. */
static size_t slot_size(const struct router_slot *s)
{
	return s->n_tokens ? s->n_tokens + s->generated : 0;
}

/* Whether a task of n_task tokens sharing lcp with a slot of size tokens
 * makes the server cache the slot's content and look for a better one. */
static int caches_slot(size_t lcp, size_t n_task, size_t size)
{
	if (!size || !n_task)
		return 0; /* an empty slot: the server's share is not a number */
	float sim = (float)lcp / (float)n_task;
	float keep = sim > SIM_MIN ? (float)lcp / (float)size : 0.0f;
	return keep < KEEP_MIN;
}

/* The state the server loads for a task of n_task tokens whose common
 * prefix with state e is lcp_of(e), given the slot's own (lcp_slot of
 * size_slot): the first, oldest first, that keeps more of both. */
static struct router_ram_state *pick(const struct router_ram *m, size_t lcp_slot, size_t size_slot,
                                     size_t n_task, const token_t *t, size_t n_known)
{
	float keep_best = (float)lcp_slot / (float)size_slot;
	float sim_best = (float)lcp_slot / (float)n_task;
	struct router_ram_state *best = NULL, *e;
	TAILQ_FOREACH(e, &m->states, link)
	{
		size_t lcp = common(e->tokens, e->n, t, n_known);
		float keep = (float)lcp / (float)e->size;
		float sim = (float)lcp / (float)n_task;
		if (keep < LOAD_MIN)
			continue;
		if (keep_best < keep && sim_best < sim) {
			keep_best = keep;
			sim_best = sim;
			best = e;
		}
	}
	return best;
}

int router_ram_task(struct router_ram *m, const struct router_slot *s, const token_t *t,
                    size_t n_known, size_t n_task)
{
	size_t size = slot_size(s);
	size_t lcp = common(s->tokens, s->n_tokens, t, n_known);
	if (!caches_slot(lcp, n_task, size))
		return 0;
	int rc = 0;
	/* The slot's content goes in; what it contains goes, as the server
	 * drops the cached prompts a new one contains. */
	struct router_ram_state *e, *next;
	for (e = TAILQ_FIRST(&m->states); e; e = next) {
		next = TAILQ_NEXT(e, link);
		if (e->n == e->size && e->n <= s->n_tokens &&
		    common(e->tokens, e->n, s->tokens, s->n_tokens) == e->n)
			state_free(m, e);
	}
	struct router_ram_state *in = calloc(1, sizeof *in);
	if (in) {
		in->tokens = malloc((s->n_tokens ? s->n_tokens : 1) * sizeof *in->tokens);
		in->bounds = s->n_bounds ? malloc(s->n_bounds * sizeof *in->bounds) : NULL;
	}
	if (!in || !in->tokens || (s->n_bounds && !in->bounds)) {
		if (in) {
			free(in->tokens);
			free(in->bounds);
		}
		free(in);
		in = NULL;
		rc = -1;
	} else {
		memcpy(in->tokens, s->tokens, s->n_tokens * sizeof *in->tokens);
		if (s->n_bounds)
			memcpy(in->bounds, s->bounds, s->n_bounds * sizeof *in->bounds);
		in->n = s->n_tokens;
		in->size = size;
		in->aligned = s->aligned;
		in->n_bounds = s->n_bounds;
	}
	/* The load looks at the cache with the slot's content in it: that
	 * one keeps no more than the slot itself, so it is never the pick. */
	struct router_ram_state *got = pick(m, lcp, size, n_task, t, n_known);
	if (in) {
		TAILQ_INSERT_TAIL(&m->states, in, link);
		m->n_states++;
		m->tokens += in->n;
	}
	if (got) {
		state_free(m, got);
		rc = rc < 0 ? rc : 1;
	}
	while (m->n_states > RAM_MAX_STATES || m->tokens > RAM_MAX_TOKENS)
		state_free(m, TAILQ_FIRST(&m->states));
	return rc;
}

const struct router_ram_state *router_ram_would_load(const struct router_ram *m,
                                                     const struct router_slot *s, size_t m_s,
                                                     const token_t *tokens, size_t n, size_t keep)
{
	size_t size = slot_size(s);
	size_t lcp = m_s < keep ? m_s : keep;
	if (keep >= n || !caches_slot(lcp, keep + 1, size))
		return NULL;
	return pick(m, lcp, size, keep + 1, tokens, keep);
}
