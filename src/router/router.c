#include "router/router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *reuse_mode_name(enum reuse_mode mode)
{
	return mode == REUSE_EXACT ? "exact" : "fast";
}

int reuse_mode_parse(const char *s, enum reuse_mode *mode)
{
	if (!strcmp(s, "exact"))
		*mode = REUSE_EXACT;
	else if (!strcmp(s, "fast"))
		*mode = REUSE_FAST;
	else
		return -1;
	return 0;
}

struct router *router_new(enum reuse_mode mode)
{
	struct router *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->tree = radix_new();
	if (!r->tree) {
		free(r);
		return NULL;
	}
	r->mode = mode;
	r->cold_weight = 0.25;
	r->hot_weight = 1.0;
	r->stale_half_life_s = 600;
	return r;
}

static void backend_free_slots(struct router *r, struct router_backend *b)
{
	for (int i = 0; i < b->n_slots; i++) {
		struct router_slot *s = &b->slots[i];
		if (s->n_tokens)
			radix_remove(r->tree, s->tokens, s->n_tokens, s);
		free(s->tokens);
	}
	free(b->slots);
	b->slots = NULL;
	b->n_slots = 0;
}

void router_free(struct router *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n_backends; i++) {
		backend_free_slots(r, r->backends[i]);
		free(r->backends[i]->url);
		free(r->backends[i]);
	}
	free(r->backends);
	radix_free(r->tree);
	free(r);
}

struct router_backend *router_add_backend(struct router *r, const char *url)
{
	struct router_backend **nb = realloc(r->backends, sizeof *nb * (size_t)(r->n_backends + 1));
	if (!nb)
		return NULL;
	r->backends = nb;
	struct router_backend *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	b->url = strdup(url);
	if (!b->url) {
		free(b);
		return NULL;
	}
	b->index = r->n_backends;
	b->n_ubatch = 512;
	r->backends[r->n_backends++] = b;
	return b;
}

int router_backend_set_slots(struct router *r, struct router_backend *b, int n_slots,
			     int n_ctx_slot, int n_ubatch)
{
	backend_free_slots(r, b);
	b->slots = calloc((size_t)n_slots, sizeof *b->slots);
	if (!b->slots)
		return -1;
	b->n_slots = n_slots;
	for (int i = 0; i < n_slots; i++) {
		b->slots[i].backend = b;
		b->slots[i].id = i;
	}
	b->n_ctx_slot = n_ctx_slot;
	b->n_ubatch = n_ubatch > 0 ? n_ubatch : 512;
	b->in_flight = 0;
	return 0;
}

void router_backend_set_up(struct router *r, struct router_backend *b, int up)
{
	if (b->up && !up) {
		/* A backend that went away lost its KV: forget what it held. */
		for (int i = 0; i < b->n_slots; i++)
			router_slot_forget(r, &b->slots[i]);
	}
	b->up = up;
}

size_t router_exact_reuse(size_t matched, size_t aligned, size_t n, int n_ubatch)
{
	if (n == 0 || n_ubatch <= 0)
		return 0;
	size_t r = matched < aligned ? matched : aligned;
	/* At least one token must be evaluated to get logits. */
	if (r > n - 1)
		r = n - 1;
	return r / (size_t)n_ubatch * (size_t)n_ubatch;
}

double router_estimate_prefill_s(const struct router_backend *b, size_t tokens)
{
	double tps = b->prefill_tps > 0 ? b->prefill_tps : 500.0;
	return (double)tokens / tps;
}

static void ewma(double *v, double sample)
{
	*v = *v > 0 ? 0.7 * *v + 0.3 * sample : sample;
}

void router_backend_note_prefill(struct router_backend *b, uint64_t tokens, double ms)
{
	/* Tiny prefills are dominated by fixed costs; they would understate the
	 * rate that matters for long prompts. */
	if (tokens >= 16 && ms > 0)
		ewma(&b->prefill_tps, (double)tokens * 1000.0 / ms);
}

void router_backend_note_decode(struct router_backend *b, uint64_t tokens, double ms)
{
	if (tokens >= 4 && ms > 0)
		ewma(&b->decode_tps, (double)tokens * 1000.0 / ms);
}

struct match_ctx {
	struct router *r;
	size_t *matched; /* indexed by backend then slot, via offsets */
	int *offsets;
};

static void note_match(void *owner, size_t matched, void *arg)
{
	struct match_ctx *m = arg;
	struct router_slot *s = owner;
	m->matched[m->offsets[s->backend->index] + s->id] = matched;
}

/* How much losing a slot's content costs, in prompt tokens: what it holds
 * beyond the request's match, weighted by how likely it is to be reused. */
static double loss_of(const struct router *r, const struct router_slot *s, size_t matched,
		      int64_t now_us)
{
	if (s->n_tokens <= matched)
		return 0;
	double w = s->hits ? r->hot_weight : r->cold_weight;
	double age_s = (double)(now_us - s->last_used_us) / 1e6;
	if (age_s > 0 && r->stale_half_life_s > 0)
		w *= pow(0.5, age_s / r->stale_half_life_s);
	return (double)(s->n_tokens - matched) * w;
}

/* Between slots of equal cost: the one that already holds more of this
 * prefix (so the others keep theirs), then the less loaded backend, then the
 * least recently used slot. */
static int better_tie(const struct router_slot *s, size_t m, const struct router_slot *best,
		      size_t best_m)
{
	if (!best)
		return 1;
	if (m != best_m)
		return m > best_m;
	if (s->backend->in_flight != best->backend->in_flight)
		return s->backend->in_flight < best->backend->in_flight;
	return s->last_used_us < best->last_used_us;
}

enum route_status router_choose(struct router *r, const token_t *tokens, size_t n, int64_t now_us,
				int only_backend, struct route_choice *out)
{
	int total = 0;
	int offsets_small[16];
	int *offsets = r->n_backends <= 16 ? offsets_small : malloc(sizeof(int) * (size_t)r->n_backends);
	if (!offsets)
		return ROUTE_NO_BACKEND;
	for (int i = 0; i < r->n_backends; i++) {
		offsets[i] = total;
		total += r->backends[i]->n_slots;
	}
	size_t *matched = calloc(total ? (size_t)total : 1, sizeof *matched);
	if (!matched) {
		if (offsets != offsets_small)
			free(offsets);
		return ROUTE_NO_BACKEND;
	}
	struct match_ctx mc = {r, matched, offsets};
	radix_match_each(r->tree, tokens, n, note_match, &mc);

	int any_up = 0;
	double best_cost = INFINITY;
	struct route_choice best = {0};
	int best_busy = 0;
	for (int bi = 0; bi < r->n_backends; bi++) {
		struct router_backend *b = r->backends[bi];
		if (!b->up || (only_backend >= 0 && bi != only_backend))
			continue;
		any_up = 1;
		/* Exact mode runs one request per backend at a time: llama.cpp
		 * batches the tokens of all active slots together, which moves
		 * the micro-batch boundaries and with them the bits. */
		int backend_busy = r->mode == REUSE_EXACT && b->in_flight > 0;
		for (int si = 0; si < b->n_slots; si++) {
			struct router_slot *s = &b->slots[si];
			size_t m = matched[offsets[bi] + si];
			if (m > s->n_tokens)
				m = s->n_tokens;
			size_t reuse = r->mode == REUSE_EXACT
					       ? router_exact_reuse(m, s->aligned, n, b->n_ubatch)
					       : (m < n ? m : (n ? n - 1 : 0));
			double cost = (double)(n - reuse) + loss_of(r, s, m, now_us);
			int busy = s->busy || backend_busy;
			if (busy) {
				double wait_s = (double)(s->busy_until_us - now_us) / 1e6;
				if (wait_s < 0.05)
					wait_s = 0.05;
				double tps = b->prefill_tps > 0 ? b->prefill_tps : 500.0;
				cost += wait_s * tps;
			}
			/* Ties go to the less loaded backend, then the least recently
			 * used slot. */
			if (cost < best_cost - 1e-9 ||
			    (cost <= best_cost + 1e-9 && better_tie(s, m, best.slot, best.matched))) {
				best_cost = cost;
				best_busy = busy;
				best.slot = s;
				best.matched = m;
				best.reuse = reuse;
				/* The server reuses its own longest common prefix, which
				 * may run past what the router knows (generated tokens
				 * follow the prompt in the KV); exact mode cuts it back
				 * whenever it could exceed the grid-aligned reuse. */
				best.must_trim = r->mode == REUSE_EXACT && reuse > 0 &&
						 (m > reuse || m == s->n_tokens);
				best.est_prefill_s = router_estimate_prefill_s(b, n - reuse);
				best.kind = m == 0 ? "miss" : (m >= s->n_tokens ? "hit" : "partial");
			}
		}
	}
	free(matched);
	if (offsets != offsets_small)
		free(offsets);
	if (!any_up || !best.slot)
		return any_up ? ROUTE_WAIT : ROUTE_NO_BACKEND;
	*out = best;
	return best_busy ? ROUTE_WAIT : ROUTE_CHOSEN;
}

void router_slot_begin(struct router *r, struct router_slot *s, int64_t now_us, double est_s)
{
	s->busy = 1;
	s->backend->in_flight++;
	s->busy_until_us = now_us + (int64_t)(est_s * 1e6);
	s->last_used_us = now_us;
}

void router_slot_end(struct router *r, struct router_slot *s, int64_t now_us)
{
	if (s->busy) {
		s->busy = 0;
		s->backend->in_flight--;
	}
	s->last_used_us = now_us;
}

void router_slot_forget(struct router *r, struct router_slot *s)
{
	if (s->n_tokens)
		radix_remove(r->tree, s->tokens, s->n_tokens, s);
	free(s->tokens);
	s->tokens = NULL;
	s->n_tokens = s->cap = 0;
	s->aligned = 0;
	s->hits = 0;
}

void router_slot_truncate(struct router *r, struct router_slot *s, size_t n)
{
	if (n >= s->n_tokens)
		return;
	if (n == 0) {
		router_slot_forget(r, s);
		return;
	}
	radix_remove(r->tree, s->tokens, s->n_tokens, s);
	s->n_tokens = n;
	if (s->aligned > n)
		s->aligned = n;
	if (radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0)
		router_slot_forget(r, s);
}

int router_slot_commit(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
		       size_t reused, int64_t now_us)
{
	size_t ub = (size_t)s->backend->n_ubatch;
	/* How much of the old content matches: that part of the KV is unchanged. */
	size_t same = 0;
	while (same < s->n_tokens && same < n && s->tokens[same] == tokens[same])
		same++;
	size_t base = s->aligned < same ? s->aligned : same;
	size_t aligned;
	if (reused <= base && reused % ub == 0)
		/* Evaluation began on the grid: every full micro-batch after it
		 * was computed exactly as an uncached run computes it. */
		aligned = reused + (n - reused) / ub * ub;
	else
		aligned = (reused < base ? reused : base) / ub * ub;
	/* The content is hot when a request continued all of it (a conversation
	 * turn); sharing only a system prompt makes a new, cold conversation. */
	if (reused > 0 && s->n_tokens > 0 && same == s->n_tokens)
		s->hits++;
	else
		s->hits = 0;

	if (s->n_tokens)
		radix_remove(r->tree, s->tokens, s->n_tokens, s);
	s->n_tokens = 0;
	if (n == 0) {
		s->aligned = 0;
		s->last_used_us = now_us;
		return 0;
	}
	if (n > s->cap) {
		token_t *t = realloc(s->tokens, n * sizeof *t);
		if (!t) {
			free(s->tokens);
			s->tokens = NULL;
			s->n_tokens = s->cap = 0;
			s->aligned = 0;
			return -1;
		}
		s->tokens = t;
		s->cap = n;
	}
	if (n)
		memcpy(s->tokens, tokens, n * sizeof *tokens);
	s->n_tokens = n;
	s->aligned = aligned;
	s->last_used_us = now_us;
	if (radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	return 0;
}
