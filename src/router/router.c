#include "router/router.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *reuse_mode_name(enum reuse_mode mode)
{
	return mode == REUSE_EXACT ? "exact" : mode == REUSE_GRID ? "grid" : "fast";
}

int reuse_mode_is_exact(enum reuse_mode mode)
{
	return mode == REUSE_EXACT || mode == REUSE_GRID;
}

int reuse_mode_parse(const char *s, enum reuse_mode *mode)
{
	if (!strcmp(s, "exact"))
		*mode = REUSE_EXACT;
	else if (!strcmp(s, "fast"))
		*mode = REUSE_FAST;
	else if (!strcmp(s, "grid"))
		*mode = REUSE_GRID;
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
	r->spare_weight = 4.0;
	r->stale_half_life_s = 600;
	r->think_half_lives = 0.5;
	r->think_floor_s = 0.25;
	r->fresh_s = 0.5;
	r->fresh_weight = 0.5;
	r->save_min_tokens = 256;
	return r;
}

struct retired_slots {
	struct router_slot *slots;
	int n;
	struct retired_slots *next;
};

static void backend_free_slots(struct router *r, struct router_backend *b)
{
	for (int i = 0; i < b->n_slots; i++) {
		struct router_slot *s = &b->slots[i];
		if (s->n_tokens)
			radix_remove(r->tree, s->tokens, s->n_tokens, s);
		free(s->tokens);
		free(s->bounds);
	}
	free(b->slots);
	b->slots = NULL;
	b->n_slots = 0;
}

void router_free(struct router *r)
{
	if (!r)
		return;
	/* Saved states first: removing one looks at every backend's slots. */
	while (r->saved_head)
		router_saved_remove(r, r->saved_head);
	for (int i = 0; i < r->n_backends; i++) {
		backend_free_slots(r, r->backends[i]);
		router_ram_clear(&r->backends[i]->ram);
		free(r->backends[i]->url);
		free(r->backends[i]);
	}
	while (r->retired) {
		struct retired_slots *rs = r->retired;
		r->retired = rs->next;
		for (int i = 0; i < rs->n; i++)
			free(rs->slots[i].bounds);
		free(rs->slots);
		free(rs);
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
	router_ram_init(&b->ram);
	r->backends[r->n_backends++] = b;
	return b;
}

int router_backend_set_slots(struct router *r, struct router_backend *b, int n_slots,
                             int n_ctx_slot, int n_ubatch)
{
	if (b->slots && b->n_slots == n_slots) {
		/* Rediscovered with as many slots: requests in flight still point
		 * at these, so the array stays; only the content is forgotten. */
		for (int i = 0; i < n_slots; i++)
			router_slot_forget(r, &b->slots[i]);
	} else {
		struct router_slot *fresh = calloc((size_t)n_slots, sizeof *fresh);
		struct retired_slots *rs = b->slots ? calloc(1, sizeof *rs) : NULL;
		if (!fresh || (b->slots && !rs)) {
			free(fresh);
			free(rs);
			return -1;
		}
		if (b->slots) {
			/* Requests in flight may point at the old slots: they are
			 * emptied and retired, and freed with the router. */
			for (int i = 0; i < b->n_slots; i++) {
				router_slot_forget(r, &b->slots[i]);
				b->slots[i].retired = 1;
			}
			rs->slots = b->slots;
			rs->n = b->n_slots;
			rs->next = r->retired;
			r->retired = rs;
		}
		b->slots = fresh;
		b->n_slots = n_slots;
		for (int i = 0; i < n_slots; i++) {
			b->slots[i].kind = OWNER_SLOT;
			b->slots[i].backend = b;
			b->slots[i].id = i;
		}
	}
	/* A server found again may have restarted: its RAM cache with it. */
	router_ram_clear(&b->ram);
	b->n_ctx_slot = n_ctx_slot;
	b->n_ubatch = n_ubatch > 0 ? n_ubatch : 512;
	b->in_flight = 0;
	for (int i = 0; i < n_slots; i++)
		b->in_flight += b->slots[i].busy;
	return 0;
}

void router_backend_set_up(struct router *r, struct router_backend *b, int up)
{
	if (b->up && !up) {
		/* A backend that went away lost its KV: forget what it held. Its
		 * saved files may come back with a different model or settings,
		 * so they are forgotten too (the caller deletes them). */
		for (int i = 0; i < b->n_slots; i++)
			router_slot_forget(r, &b->slots[i]);
		router_ram_clear(&b->ram);
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

struct saved_match {
	struct router_saved *e;
	size_t matched;
};

struct match_ctx {
	struct router *r;
	size_t *matched; /* indexed by backend then slot, via offsets */
	int *offsets;
	struct saved_match *saved; /* saved states that share a prefix */
	size_t n_saved, cap_saved;
};

static void note_match(void *owner, size_t matched, void *arg)
{
	struct match_ctx *m = arg;
	if (*(enum owner_kind *)owner == OWNER_SLOT) {
		struct router_slot *s = owner;
		m->matched[m->offsets[s->backend->index] + s->id] = matched;
		return;
	}
	if (matched == 0)
		return;
	if (m->n_saved == m->cap_saved) {
		size_t nc = m->cap_saved ? m->cap_saved * 2 : 16;
		struct saved_match *ns = realloc(m->saved, nc * sizeof *ns);
		if (!ns)
			return; /* a state not considered: only a missed chance */
		m->saved = ns;
		m->cap_saved = nc;
	}
	m->saved[m->n_saved].e = owner;
	m->saved[m->n_saved].matched = matched;
	m->n_saved++;
}

/* Seconds of prefill that a number of seconds of other work is worth. */
static double in_tokens(const struct router_backend *b, double seconds)
{
	double tps = b->prefill_tps > 0 ? b->prefill_tps : 500.0;
	return seconds * tps;
}

static double restore_tokens(const struct router_backend *b, uint64_t bytes)
{
	/* Until measured: a fresh file is read back from the page cache. */
	double bps = b->restore_bps > 0 ? b->restore_bps : 1e9;
	return in_tokens(b, 0.005 + (double)bytes / bps);
}

static uint64_t estimate_bytes(const struct router_backend *b, size_t n_tokens)
{
	/* Until the first file tells: 64 KiB a token, between a small model's
	 * few KiB and a 70B model's few hundred. */
	double bytes =
	    (double)n_tokens * (b->kv_bytes_per_token > 0 ? b->kv_bytes_per_token : 65536.0);
	/* A damaged slot-file index can claim any size: saturate, never overflow. */
	return bytes < 18446744073709551616.0 ? (uint64_t)bytes : UINT64_MAX;
}

static double save_tokens(const struct router_backend *b, size_t n_tokens)
{
	double bps = b->save_bps > 0 ? b->save_bps : 1e9;
	return in_tokens(b, 0.005 + (double)estimate_bytes(b, n_tokens) / bps);
}

/* How much losing a slot's content costs, in prompt tokens: what it holds
 * beyond the request's match, weighted by how likely it is to be reused.
 *
 * spare: an empty slot could take the request instead. Then a
 * conversation's own part is not overwritten for the sake of a prefix it
 * shares with the request (a system prompt, tool definitions) unless that
 * part is small beside what the request would reuse: sessions that share a
 * system prompt otherwise funnel onto one slot, each turn overwriting
 * another session's turn, which that session recomputes in its own turn
 * (benchmark b found all 15 main-agent turns of three sessions on one of
 * four slots). A one-off's few tokens (a title request) still give way. */
static double loss_of(const struct router *r, const struct router_slot *s, size_t matched,
                      int64_t now_us, int spare, int *save_first)
{
	*save_first = 0;
	if (s->n_tokens <= matched)
		return 0;
	/* A request that continues the prompt a kept answer followed: a resend,
	 * the next turn, another answer in its place. */
	if (s->answer_at && matched >= s->answer_at)
		return 0;
	double age_s = (double)(now_us - s->last_used_us) / 1e6;
	/* Content never continued may be a one-off (a title request) or a
	 * conversation's first turn, whose next turn, if it has one, comes
	 * within the usual think time (the router's think_s, every
	 * conversation's averaged, at least fresh_s): for two of those it
	 * weighs fresh_weight, an even chance. Two new conversations
	 * otherwise took turns overwriting each other while an older one,
	 * hot and longer, kept its slot (issue 24, three conversations on
	 * two slots). */
	double usual = r->think_s > r->fresh_s ? r->think_s : r->fresh_s;
	double w = s->hits ? r->hot_weight : age_s <= 2 * usual ? r->fresh_weight : r->cold_weight;
	if (spare && w < r->spare_weight)
		w = r->spare_weight;
	/* How likely the content is to be used again. Its weight halves every
	 * stale_half_life_s it is not used; a conversation whose think time
	 * is known (the wait between an answer and its next turn on this
	 * slot) halves every one of its think times (at least think_floor_s)
	 * once it has let one go by: one that has ended gives way to those
	 * still taking turns (one that ended a minute ago otherwise kept its
	 * slot while two in use took turns overwriting each other on the
	 * other: issue 24, 2.03x llama-server alone's tokens). */
	if (age_s > 0 && r->stale_half_life_s > 0)
		w *= pow(0.5, age_s / r->stale_half_life_s);
	if (s->hits && s->think_s > 0 && r->think_half_lives > 0) {
		double due = s->think_s > r->think_floor_s ? s->think_s : r->think_floor_s;
		if (age_s > due)
			w *= pow(0.5, (age_s - due) / (due * r->think_half_lives));
	}
	double recompute = (double)(s->n_tokens - matched) * w;
	const struct router_backend *b = s->backend;
	/* With the server's RAM cache (exact mode), content a request mostly
	 * drops goes there, and a cut loads it back (router/ram.h). */
	if (router_ram_active(r, b) && 2 * matched < s->n_tokens + s->generated) {
		double kept = w * (1.0 + restore_tokens(b, estimate_bytes(b, s->n_tokens)));
		return kept < recompute ? kept : recompute;
	}
	if (!b->can_save || s->n_tokens < r->save_min_tokens ||
	    (reuse_mode_is_exact(r->mode) && b->restore_inexact))
		return recompute;
	/* With slot files, losing the content costs a save now (unless it is
	 * already on disk) and perhaps a restore later. */
	double kept = w * restore_tokens(b, estimate_bytes(b, s->n_tokens));
	if (!s->saved)
		kept += save_tokens(b, s->n_tokens);
	if (kept < recompute) {
		*save_first = !s->saved;
		return kept;
	}
	return recompute;
}

/* On a server whose slots share one KV cache (shared_kv), an answer
 * depends on what the other slots hold; exact mode keeps to the first, so
 * that nothing changes in them (a server with a RAM cache empties idle ones
 * at every new task anyway, and that cache brings its states back into the
 * first), as on a server with one slot. */
static int usable_slots(const struct router *r, const struct router_backend *b)
{
	return reuse_mode_is_exact(r->mode) && (b->shared_kv || b->self_cached) && b->n_slots > 1
	           ? 1
	           : b->n_slots;
}

int router_ram_active(const struct router *r, const struct router_backend *b)
{
	/* A sliding-window model's restored state does not continue as the
	 * live one did (restore_inexact); a server whose loads keep missing
	 * (another version's rule, a smaller cache) is left alone. */
	return reuse_mode_is_exact(r->mode) && b->ram_cache && !b->can_save &&
	       !b->restore_inexact && !(b->ram.misses >= 3 && b->ram.misses > b->ram.loads);
}

/* What a state of the server's RAM cache lends the request being routed. */
struct ram_lend {
	const struct router_ram_state *e;
	size_t matched, reuse;
};

/* The request being routed: its tokens' schedule (exact mode). */
struct req_sched {
	const size_t *b;
	size_t nb, n;
};

/* What a slot or saved state (rows [0, aligned) on chunk starts sb) lends a
 * request that matches m of its tokens: in exact mode, the rows computed on
 * the same micro-batches as the request's own schedule would compute them;
 * at least one token is left to evaluate (its logits start the answer). */
static size_t reuse_for(const struct router *r, const struct req_sched *q, size_t m,
                        const size_t *sb, size_t nsb, size_t aligned, int ub)
{
	size_t n = q->n;
	if (!reuse_mode_is_exact(r->mode))
		return m < n ? m : (n ? n - 1 : 0);
	size_t limit = m < n ? m : n;
	if (limit > n - 1)
		limit = n ? n - 1 : 0;
	return sched_common(q->b, q->nb, n, sb, nsb, aligned, limit, ub);
}

/* In fast mode requests run side by side on a backend; in exact mode a busy
 * backend is waited for instead (its wait is priced separately). */
static double fast_load_penalty(const struct router *r, const struct router_backend *b,
                                size_t to_evaluate)
{
	if (reuse_mode_is_exact(r->mode) || b->in_flight <= 0)
		return 0;
	return 0.5 * b->in_flight * (double)(to_evaluate ? to_evaluate : 1);
}

/* Whether a saved state can be restored into backend b: its own, or with
 * shared files (--slot-dir, which every backend's --slot-save-path must
 * be) one made under b's fingerprint on another backend, so that a
 * conversation whose backend is busy continues on an idle one instead of
 * being evaluated again there.
 *
 * In exact mode a state's rows are the arithmetic of the machine that
 * computed them, and the fingerprint names the build, not the CPU or GPU.
 * So there the state must also have been made with b's bits (the
 * self-test's answers, bit for bit): another backend's state then holds
 * the rows b would have computed, and b's own state from before a change
 * of its arithmetic (a driver, a device) is not used. Where either's bits
 * are unknown, a backend restores only its own. */
static int restorable_on(const struct router *r, const struct router_saved *e,
                         const struct router_backend *b)
{
	int exact = reuse_mode_is_exact(r->mode);
	if (exact && b->restore_inexact)
		return 0;
	int known = e->bits[0] && b->bits[0];
	int same_bits = known && strcmp(e->bits, b->bits) == 0;
	if (exact && known && !same_bits)
		return 0;
	if (e->backend == b)
		return 1;
	return r->shared_saved && (!exact || same_bits) && b->can_save &&
	       !b->foreign_restore_failed && b->fingerprint[0] &&
	       strcmp(e->fingerprint, b->fingerprint) == 0;
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
	uint64_t allowed = only_backend < 0    ? ~(uint64_t)0
	                   : only_backend < 64 ? (uint64_t)1 << only_backend
	                                       : 0;
	return router_choose_among(r, tokens, n, now_us, allowed, out);
}

static int backend_allowed(uint64_t allowed, int index)
{
	return index >= 64 || (allowed >> index) & 1;
}

enum route_status router_choose_among(struct router *r, const token_t *tokens, size_t n,
                                      int64_t now_us, uint64_t allowed, struct route_choice *out)
{
	return router_choose_sched(r, tokens, n, NULL, 0, now_us, allowed, out);
}

enum route_status router_choose_sched(struct router *r, const token_t *tokens, size_t n,
                                      const size_t *bounds, size_t nb, int64_t now_us,
                                      uint64_t allowed, struct route_choice *out)
{
	struct req_sched q = {bounds, nb, n};
	int total = 0;
	int offsets_small[16];
	int *offsets =
	    r->n_backends <= 16 ? offsets_small : malloc(sizeof(int) * (size_t)r->n_backends);
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
	struct match_ctx mc = {r, matched, offsets, NULL, 0, 0};
	radix_match_each(r->tree, tokens, n, note_match, &mc);

	/* Is there an empty slot this request could take right away? */
	int spare = 0;
	for (int bi = 0; bi < r->n_backends && !spare; bi++) {
		struct router_backend *b = r->backends[bi];
		if (!b->up || !backend_allowed(allowed, bi) ||
		    (reuse_mode_is_exact(r->mode) && b->in_flight > 0))
			continue;
		for (int si = 0; si < usable_slots(r, b) && !spare; si++)
			spare = !b->slots[si].busy && b->slots[si].n_tokens == 0;
	}

	int any_up = 0;
	double best_cost = INFINITY;
	struct route_choice best = {0};
	int best_busy = 0;
	for (int bi = 0; bi < r->n_backends; bi++) {
		struct router_backend *b = r->backends[bi];
		if (!b->up || !backend_allowed(allowed, bi))
			continue;
		any_up = 1;
		/* Exact mode runs one request per backend at a time: llama.cpp
		 * batches the tokens of all active slots together, which moves
		 * the micro-batch boundaries and with them the bits. */
		int backend_busy = reuse_mode_is_exact(r->mode) && b->in_flight > 0;
		/* What each state of the server's RAM cache lends the request. */
		struct ram_lend ram[ROUTER_RAM_MAX_STATES];
		size_t n_ram = 0;
		if (router_ram_active(r, b)) {
			const struct router_ram_state *e;
			TAILQ_FOREACH(e, &b->ram.states, link)
			{
				size_t me = router_ram_match(e, tokens, n);
				size_t ru = me ? reuse_for(r, &q, me, e->bounds, e->n_bounds,
				                           e->aligned, b->n_ubatch)
				               : 0;
				if (ru && n_ram < ROUTER_RAM_MAX_STATES)
					ram[n_ram++] = (struct ram_lend){e, me, ru};
			}
		}
		for (int si = 0; si < usable_slots(r, b); si++) {
			struct router_slot *s = &b->slots[si];
			size_t m = matched[offsets[bi] + si];
			if (m > s->n_tokens)
				m = s->n_tokens;
			int busy = s->busy || backend_busy;
			double wait = 0;
			if (busy) {
				double wait_s = (double)(s->busy_until_us - now_us) / 1e6;
				if (wait_s < 0.05)
					wait_s = 0.05;
				wait = in_tokens(b, wait_s);
			}
			/* The slot with its own content... */
			size_t reuse =
			    reuse_for(r, &q, m, s->bounds, s->n_bounds, s->aligned, b->n_ubatch);
			int save_first;
			/* Requests running on a backend share its compute: each one
			 * there slows this prefill. That spreads new conversations
			 * over idle backends, yet a conversation keeps to the backend
			 * that holds it unless that one is crowded. */
			double load = fast_load_penalty(r, b, n - reuse);
			double cost = (double)(n - reuse) +
			              loss_of(r, s, m, now_us, spare, &save_first) + wait + load;
			if (cost < best_cost - 1e-9 ||
			    (cost <= best_cost + 1e-9 &&
			     better_tie(s, m, best.slot, best.matched))) {
				best_cost = cost;
				best_busy = busy;
				best.slot = s;
				best.matched = m;
				best.reuse = reuse;
				best.restore = NULL;
				best.from_ram = 0;
				best.save_first = save_first;
				/* The server reuses its own longest common prefix, which
				 * may run past what the router knows (generated tokens
				 * follow the prompt in the KV); exact mode cuts it back
				 * whenever it could exceed the grid-aligned reuse. Of a
				 * prompt the slot holds whole, the server evaluates the
				 * last token again: a resend after a joined header
				 * (prompt/prompt.h) needs no cut. */
				size_t server = m < n ? m : n - 1;
				best.must_trim =
				    reuse_mode_is_exact(r->mode) && reuse > 0 &&
				    (server > reuse || (m == s->n_tokens && !s->whole));
				best.est_prefill_s = router_estimate_prefill_s(b, n - reuse);
				/* A hit: the prompt continues all the slot held, or
				 * the prompt a kept answer followed (a resend). */
				int hit = m + (size_t)(s->junk_tail != 0) >= s->n_tokens ||
				          (s->answer_at && m >= s->answer_at);
				best.kind = m == 0 ? "miss" : hit ? "hit" : "partial";
			}
			/* ...or with a saved state restored into it. */
			for (size_t k = 0; k < mc.n_saved; k++) {
				struct router_saved *e = mc.saved[k].e;
				if (!restorable_on(r, e, b))
					continue;
				size_t me = mc.saved[k].matched;
				size_t ereuse = reuse_for(r, &q, me, e->bounds, e->n_bounds,
				                          e->aligned, b->n_ubatch);
				if (ereuse <= reuse)
					continue;
				double ecost =
				    (double)(n - ereuse) + restore_tokens(b, e->bytes) +
				    loss_of(r, s, m < me ? m : me, now_us, spare, &save_first) +
				    wait + fast_load_penalty(r, b, n - ereuse);
				if (ecost < best_cost - 1e-9) {
					best_cost = ecost;
					best_busy = busy;
					best.slot = s;
					best.matched = me;
					best.reuse = ereuse;
					best.restore = e;
					best.save_first = save_first;
					best.must_trim = reuse_mode_is_exact(r->mode) &&
					                 (me > ereuse || me == e->n_tokens);
					best.est_prefill_s =
					    router_estimate_prefill_s(b, n - ereuse);
					best.kind = "disk";
					best.from_ram = 0;
				}
			}
			/* ...or with a state of the server's RAM cache, which a cut
			 * to its reuse makes the server load in place of the slot's
			 * content (which goes there in turn). */
			for (size_t k = 0; k < n_ram; k++) {
				if (ram[k].reuse <= reuse ||
				    router_ram_would_load(&b->ram, s, m, tokens, n, ram[k].reuse) !=
				        ram[k].e)
					continue;
				double rcost = (double)(n - ram[k].reuse) + 1.0 +
				               loss_of(r, s, m, now_us, spare, &save_first) + wait;
				if (rcost < best_cost - 1e-9) {
					best_cost = rcost;
					best_busy = busy;
					best.slot = s;
					best.matched = ram[k].matched;
					best.reuse = ram[k].reuse;
					best.restore = NULL;
					best.save_first = 0;
					best.must_trim = 1;
					best.from_ram = 1;
					best.est_prefill_s =
					    router_estimate_prefill_s(b, n - ram[k].reuse);
					best.kind = "ram";
				}
			}
		}
	}
	free(matched);
	free(mc.saved);
	if (offsets != offsets_small)
		free(offsets);
	if (!any_up || !best.slot)
		return any_up ? ROUTE_WAIT : ROUTE_NO_BACKEND;
	*out = best;
	return best_busy ? ROUTE_WAIT : ROUTE_CHOSEN;
}

/* A turn that continued the slot's content: the wait before it is the
 * conversation's think time. */
static void note_turn(struct router *r, struct router_slot *s)
{
	if (s->pending_gap_s < 0)
		return;
	s->think_s = s->think_s > 0 ? 0.5 * s->think_s + 0.5 * s->pending_gap_s : s->pending_gap_s;
	r->think_s = r->think_s > 0 ? 0.8 * r->think_s + 0.2 * s->pending_gap_s : s->pending_gap_s;
	if (s->think_s <= 0)
		s->think_s = 1e-3;
	s->pending_gap_s = -1; /* one turn, counted once */
}

void router_slot_begin(struct router *r, struct router_slot *s, int64_t now_us, double est_s)
{
	s->pending_gap_s =
	    s->n_tokens && s->last_used_us ? (double)(now_us - s->last_used_us) / 1e6 : -1;
	s->busy = 1;
	s->backend->in_flight++;
	s->busy_until_us = now_us + (int64_t)(est_s * 1e6);
	s->last_used_us = now_us;
	/* A new task there empties the server's other idle slots into its RAM
	 * cache (router.h, self_cached): they hold nothing toki can route to. */
	if (s->backend->self_cached) {
		struct router_backend *b = s->backend;
		for (int i = 0; i < b->n_slots; i++)
			if (&b->slots[i] != s && !b->slots[i].busy && b->slots[i].n_tokens)
				router_slot_forget(r, &b->slots[i]);
	}
}

void router_slot_end(struct router *r, struct router_slot *s, int64_t now_us)
{
	if (s->busy) {
		s->busy = 0;
		if (!s->retired) /* the backend's count began again without it */
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
	free(s->bounds);
	s->bounds = NULL;
	s->n_bounds = 0;
	s->junk_tail = 0;
	s->whole = 0;
	s->answer_at = 0;
	s->generated = 0;
	s->hits = 0;
	s->think_s = 0;
	s->saved = NULL;
}

/* Drops the chunk starts past n, where the rows kept end. A start at n
 * stays: it closes the chunk before it, and a closed chunk's last
 * micro-batches depend on where it ends (sched_tail_split). */
static void bounds_keep_upto(size_t *b, size_t *nb, size_t n)
{
	while (*nb && b[*nb - 1] > n)
		(*nb)--;
}

static int bounds_copy(size_t **dst, size_t *ndst, const size_t *src, size_t n)
{
	size_t *c = NULL;
	if (n) {
		c = malloc(n * sizeof *c);
		if (!c)
			return -1;
		memcpy(c, src, n * sizeof *c);
	}
	free(*dst);
	*dst = c;
	*ndst = n;
	return 0;
}

void router_slot_truncate(struct router *r, struct router_slot *s, size_t n)
{
	if (s->retired || n >= s->n_tokens)
		return;
	if (n == 0) {
		router_slot_forget(r, s);
		return;
	}
	radix_remove(r->tree, s->tokens, s->n_tokens, s);
	s->n_tokens = n;
	s->saved = NULL;
	s->junk_tail = 0;
	s->whole = 0;
	s->answer_at = 0;
	/* Only whole micro-batches of what was computed stay reusable. */
	s->aligned = sched_floor(s->bounds, s->n_bounds, s->aligned, n, s->backend->n_ubatch);
	bounds_keep_upto(s->bounds, &s->n_bounds, s->aligned);
	if (radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0)
		router_slot_forget(r, s);
}

int router_slot_commit(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
                       size_t reused, int64_t now_us)
{
	if (s->retired)
		return 0; /* its backend was rediscovered: nobody routes here */
	size_t ub = (size_t)s->backend->n_ubatch;
	/* How much of the old content matches: that part of the KV is unchanged. */
	size_t same = 0;
	while (same < s->n_tokens && same < n && s->tokens[same] == tokens[same])
		same++;
	size_t base = s->aligned < same ? s->aligned : same;
	if (s->n_bounds)
		base = 0; /* rows of another schedule are none of the grid's */
	size_t aligned;
	if (reused <= base && reused % ub == 0)
		/* Evaluation began on the grid: every full micro-batch after it
		 * was computed exactly as an uncached run computes it. */
		aligned = reused + (n - reused) / ub * ub;
	else
		aligned = (reused < base ? reused : base) / ub * ub;
	/* The content is hot when a request continued all of it (a conversation
	 * turn; a cut's throw-away last token aside); sharing only a system
	 * prompt makes a new, cold conversation. */
	if (reused > 0 && s->n_tokens > 0 && same + (s->junk_tail != 0) >= s->n_tokens) {
		s->hits++;
		note_turn(r, s);
	} else {
		s->hits = 0;
		s->think_s = 0;
	}

	if (s->n_tokens)
		radix_remove(r->tree, s->tokens, s->n_tokens, s);
	/* The slot's saved copy stays exact only if nothing was added. */
	if (s->saved && !(n == s->n_tokens && same == n))
		s->saved = NULL;
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
	/* Grid arithmetic above: the rows are on the grid's schedule. */
	s->junk_tail = 0;
	free(s->bounds);
	s->bounds = NULL;
	s->n_bounds = 0;
	s->last_used_us = now_us;
	if (radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	return 0;
}

/* Replaces the slot's content with tokens[0..n) (+ junk when have_junk). */
static int slot_set(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
                    int have_junk, token_t junk)
{
	size_t total = n + (have_junk ? 1 : 0);
	if (s->n_tokens)
		radix_remove(r->tree, s->tokens, s->n_tokens, s);
	s->n_tokens = 0;
	s->whole = 0;
	s->answer_at = 0;
	if (total > s->cap) {
		token_t *t = malloc(total * sizeof *t);
		if (!t) {
			router_slot_forget(r, s);
			return -1;
		}
		if (n)
			memcpy(t, tokens, n * sizeof *t);
		free(s->tokens);
		s->tokens = t;
		s->cap = total;
	} else if (n && s->tokens != tokens) {
		memmove(s->tokens, tokens, n * sizeof *tokens);
	}
	if (have_junk)
		s->tokens[n] = junk;
	s->junk_tail = have_junk;
	s->n_tokens = total;
	if (total && radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	return 0;
}

int router_slot_commit_sched(struct router *r, struct router_slot *s, const token_t *tokens,
                             size_t n, const size_t *bounds, size_t nb, size_t aligned,
                             int64_t now_us)
{
	if (s->retired)
		return 0;
	size_t same = 0;
	while (same < s->n_tokens && same < n && s->tokens[same] == tokens[same])
		same++;
	/* Hot when the request continued all of the old content: all but a
	 * cut's throw-away token, which exact mode's tail cut leaves after every
	 * answer (counted as new content, no exact-mode conversation was ever
	 * hot). */
	if (same > 0 && same + (s->junk_tail != 0) >= s->n_tokens) {
		s->hits++;
		note_turn(r, s);
	} else {
		s->hits = 0;
		s->think_s = 0;
	}
	if (s->saved && !(n == s->n_tokens && same == n))
		s->saved = NULL;
	s->last_used_us = now_us;
	s->generated = 0; /* an answer's, set after it (exact mode) */
	if (bounds_copy(&s->bounds, &s->n_bounds, bounds, nb) != 0 ||
	    slot_set(r, s, tokens, n, 0, 0) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	s->aligned = aligned < n ? aligned : n;
	bounds_keep_upto(s->bounds, &s->n_bounds, s->aligned);
	return 0;
}

int router_slot_kept(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
                     size_t n_prompt, int junk_tail, const size_t *bounds, size_t nb,
                     size_t aligned, int64_t now_us)
{
	if (s->retired)
		return 0;
	if (router_slot_commit_sched(r, s, tokens, n, bounds, nb, aligned, now_us) != 0)
		return -1;
	s->junk_tail = junk_tail && n > 0;
	s->whole = 1;
	s->answer_at = n_prompt < n ? n_prompt : 0;
	return 0;
}

int router_slot_cut(struct router *r, struct router_slot *s, const token_t *tokens, size_t keep,
                    token_t junk, int64_t now_us)
{
	if (s->retired)
		return 0;
	s->saved = NULL;
	s->last_used_us = now_us;
	s->generated = 0;
	if (slot_set(r, s, tokens, keep, 1, junk) != 0)
		return -1;
	s->aligned = sched_floor(s->bounds, s->n_bounds, s->aligned, keep, s->backend->n_ubatch);
	bounds_keep_upto(s->bounds, &s->n_bounds, s->aligned);
	return 0;
}

int router_slot_loaded(struct router *r, struct router_slot *s, const token_t *tokens, size_t keep,
                       token_t junk, const size_t *bounds, size_t nb, int64_t now_us)
{
	if (s->retired)
		return 0;
	/* A conversation the server kept for it: in use again. */
	s->saved = NULL;
	s->last_used_us = now_us;
	s->generated = 0;
	s->hits = 1;
	s->think_s = 0;
	if (bounds_copy(&s->bounds, &s->n_bounds, bounds, nb) != 0 ||
	    slot_set(r, s, tokens, keep, 1, junk) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	s->aligned = keep;
	bounds_keep_upto(s->bounds, &s->n_bounds, s->aligned);
	return 0;
}

/* ---- saved states ---- */

static void saved_unlink(struct router *r, struct router_saved *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		r->saved_head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		r->saved_tail = e->prev;
	e->prev = e->next = NULL;
}

static void saved_push_front(struct router *r, struct router_saved *e)
{
	e->prev = NULL;
	e->next = r->saved_head;
	if (r->saved_head)
		r->saved_head->prev = e;
	r->saved_head = e;
	if (!r->saved_tail)
		r->saved_tail = e;
}

void router_saved_remove(struct router *r, struct router_saved *e)
{
	for (int i = 0; i < r->n_backends; i++)
		for (int k = 0; k < r->backends[i]->n_slots; k++)
			if (r->backends[i]->slots[k].saved == e)
				r->backends[i]->slots[k].saved = NULL;
	if (e->n_tokens)
		radix_remove(r->tree, e->tokens, e->n_tokens, e);
	saved_unlink(r, e);
	r->n_saved--;
	r->saved_bytes -= e->bytes;
	free(e->tokens);
	free(e->bounds);
	free(e);
}

struct router_saved *router_saved_add_tokens(struct router *r, struct router_backend *b,
                                             const char *name, const token_t *tokens, size_t n,
                                             size_t aligned, uint64_t bytes, unsigned hits,
                                             int64_t now_us)
{
	if (!n)
		return NULL;
	struct router_saved *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->tokens = malloc(n * sizeof *e->tokens);
	if (!e->tokens) {
		free(e);
		return NULL;
	}
	e->kind = OWNER_SAVED;
	e->backend = b;
	snprintf(e->name, sizeof e->name, "%s", name);
	memcpy(e->tokens, tokens, n * sizeof *e->tokens);
	e->n_tokens = n;
	e->aligned = aligned;
	e->bytes = bytes;
	e->hits = hits;
	e->last_used_us = now_us;
	if (radix_insert(r->tree, e->tokens, e->n_tokens, e) != 0) {
		free(e->tokens);
		free(e);
		return NULL;
	}
	saved_push_front(r, e);
	r->n_saved++;
	r->saved_bytes += bytes;
	if (bytes)
		b->kv_bytes_per_token = (double)bytes / (double)n;
	return e;
}

struct router_saved *router_saved_add(struct router *r, struct router_slot *from, const char *name,
                                      uint64_t bytes, int64_t now_us)
{
	struct router_saved *e =
	    router_saved_add_tokens(r, from->backend, name, from->tokens, from->n_tokens,
	                            from->aligned, bytes, from->hits, now_us);
	if (e && router_saved_set_bounds(e, from->bounds, from->n_bounds) != 0) {
		router_saved_remove(r, e);
		return NULL;
	}
	if (e) {
		e->verified = 1; /* written and checked by this daemon */
		from->saved = e;
	}
	return e;
}

int router_saved_set_bounds(struct router_saved *e, const size_t *bounds, size_t nb)
{
	if (bounds_copy(&e->bounds, &e->n_bounds, bounds, nb) != 0)
		return -1;
	bounds_keep_upto(e->bounds, &e->n_bounds, e->aligned);
	return 0;
}

struct router_saved *router_saved_find(struct router *r, const char *name)
{
	for (struct router_saved *e = r->saved_head; e; e = e->next)
		if (!strcmp(e->name, name))
			return e;
	return NULL;
}

int router_slot_restored(struct router *r, struct router_slot *s, struct router_saved *e,
                         int64_t now_us)
{
	if (s->retired)
		return -1;
	if (s->n_tokens)
		radix_remove(r->tree, s->tokens, s->n_tokens, s);
	s->n_tokens = 0;
	if (e->n_tokens > s->cap) {
		token_t *t = realloc(s->tokens, e->n_tokens * sizeof *t);
		if (!t) {
			router_slot_forget(r, s);
			return -1;
		}
		s->tokens = t;
		s->cap = e->n_tokens;
	}
	memcpy(s->tokens, e->tokens, e->n_tokens * sizeof *s->tokens);
	s->aligned = e->aligned;
	if (bounds_copy(&s->bounds, &s->n_bounds, e->bounds, e->n_bounds) != 0) {
		router_slot_forget(r, s); /* not in the tree yet: n_tokens is 0 */
		return -1;
	}
	s->n_tokens = e->n_tokens;
	s->junk_tail = 0;
	s->hits = e->hits;
	s->saved = e;
	s->last_used_us = now_us;
	e->last_used_us = now_us;
	e->hits++;
	saved_unlink(r, e);
	saved_push_front(r, e);
	if (radix_insert(r->tree, s->tokens, s->n_tokens, s) != 0) {
		router_slot_forget(r, s);
		return -1;
	}
	return 0;
}

struct router_saved *router_saved_victim(struct router *r)
{
	return router_saved_victim_on(r, NULL);
}

struct router_saved *router_saved_victim_on(struct router *r, const struct router_backend *b)
{
	/* The least valuable goes first: value is the prefill a file saves per
	 * byte it takes, more for a state that was restored before, halving
	 * with every hour unused. A state in use is skipped. */
	struct router_saved *victim = NULL;
	double worst = INFINITY;
	int64_t now = 0;
	for (struct router_saved *e = r->saved_head; e; e = e->next)
		if (e->last_used_us > now)
			now = e->last_used_us;
	for (struct router_saved *e = r->saved_tail; e; e = e->prev) {
		if (e->pinned || (b && e->backend != b))
			continue;
		double age_h = (double)(now - e->last_used_us) / 3.6e9;
		double value = (double)e->n_tokens / (double)(e->bytes ? e->bytes : 1) *
		               (1.0 + e->hits) * pow(0.5, age_h);
		if (value < worst) {
			worst = value;
			victim = e;
		}
	}
	return victim;
}

const char *const router_route_kind_names[ROUTE_KINDS] = {"hit", "partial", "miss", "disk", "ram"};

int router_route_kind(const char *kind)
{
	for (int i = 0; i < ROUTE_KINDS; i++)
		if (kind && !strcmp(kind, router_route_kind_names[i]))
			return i;
	return ROUTE_MISS;
}

/* From a hit's few milliseconds to a queue behind long prefills. */
const double router_histogram_bounds[ROUTER_HISTOGRAM_BOUNDS] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

void router_histogram_observe(struct router_histogram *h, double seconds)
{
	if (!(seconds >= 0))
		seconds = 0;
	for (int i = 0; i < ROUTER_HISTOGRAM_BOUNDS; i++)
		if (seconds <= router_histogram_bounds[i])
			h->le[i]++;
	h->count++;
	h->sum += seconds;
}

void router_backend_note_restore(struct router_backend *b, uint64_t bytes, double ms)
{
	b->restores++;
	b->restore_bytes += bytes;
	if (ms > 0)
		b->restore_s += ms / 1000.0;
	if (bytes >= (1u << 20) && ms > 0)
		ewma(&b->restore_bps, (double)bytes * 1000.0 / ms);
}

void router_backend_note_save(struct router_backend *b, uint64_t bytes, double ms)
{
	b->saves++;
	b->save_bytes += bytes;
	if (ms > 0)
		b->save_s += ms / 1000.0;
	if (bytes >= (1u << 20) && ms > 0)
		ewma(&b->save_bps, (double)bytes * 1000.0 / ms);
}
