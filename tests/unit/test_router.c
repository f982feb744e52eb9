/* Unit tests for the router's policy (src/router/router.c), through its
 * public API only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/router.h"

#define SEC(s) ((int64_t)((s)*1000000.0))
#define UB 512

/* ------------------------------------------------------------- helpers */

/* Token sequences: position i of stream `id` is id * 1000000 + i, so that two
 * streams share nothing, except the first `shared` tokens, which come from a
 * common stream 0 (a shared system prompt). A shorter sequence of one stream
 * is a prefix of a longer one. */
#define MAX_SEQS 64
static token_t *seqs[MAX_SEQS];
static int n_seqs;

static const token_t *mk(int id, size_t n, size_t shared)
{
	assert_true(n_seqs < MAX_SEQS);
	token_t *t = malloc((n ? n : 1) * sizeof *t);
	assert_non_null(t);
	for (size_t i = 0; i < n; i++)
		t[i] = (token_t)(i < shared ? 77000000 + (int64_t)i
		                            : (int64_t)id * 1000000 + (int64_t)i);
	seqs[n_seqs++] = t;
	return t;
}

static const token_t *conv(int id, size_t n)
{
	return mk(id, n, 0);
}

static int teardown_seqs(void **state)
{
	for (int i = 0; i < n_seqs; i++)
		free(seqs[i]);
	n_seqs = 0;
	return 0;
}

/* A router with n_backends backends of n_slots slots each, all up. */
static struct router *mkrouter(enum reuse_mode mode, int n_backends, int n_slots, int ub,
                               struct router_backend **bs)
{
	struct router *r = router_new(mode);
	assert_non_null(r);
	assert_int_equal(r->mode, mode);
	for (int i = 0; i < n_backends; i++) {
		char url[64];
		snprintf(url, sizeof url, "http://127.0.0.1:%d", 8080 + i);
		struct router_backend *b = router_add_backend(r, url);
		assert_non_null(b);
		assert_int_equal(b->index, i);
		assert_string_equal(b->url, url);
		assert_int_equal(router_backend_set_slots(r, b, n_slots, 8192, ub), 0);
		router_backend_set_up(r, b, 1);
		if (bs)
			bs[i] = b;
	}
	return r;
}

static struct router_slot *slot_of(struct router_backend *b, int i)
{
	return &b->slots[i];
}

/* A whole request as the proxy runs it: choose, begin, cut back when asked,
 * commit with the reuse the router expected, end. The request takes half a
 * second. */
static struct route_choice serve_at(struct router *r, const token_t *t, size_t n, int64_t now)
{
	struct route_choice c;
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose(r, t, n, now, -1, &c), ROUTE_CHOSEN);
	assert_non_null(c.slot);
	router_slot_begin(r, c.slot, now, c.est_prefill_s);
	assert_int_equal(c.slot->busy, 1);
	if (c.must_trim)
		router_slot_truncate(r, c.slot, c.reuse);
	assert_int_equal(router_slot_commit(r, c.slot, t, n, c.reuse, now + SEC(0.5)), 0);
	router_slot_end(r, c.slot, now + SEC(0.5));
	assert_int_equal(c.slot->busy, 0);
	assert_int_equal(c.slot->n_tokens, n);
	return c;
}

static enum route_status choose(struct router *r, const token_t *t, size_t n, int64_t now,
                                struct route_choice *c)
{
	memset(c, 0, sizeof *c);
	return router_choose(r, t, n, now, -1, c);
}

/* ------------------------------------------------------ exact reuse table */

static void test_exact_reuse_table(void **state)
{
	static const struct {
		size_t matched, aligned, n;
		int ub;
		size_t want;
	} rows[] = {
	    {0, 0, 100, 512, 0},
	    {0, 2048, 3000, 512, 0},
	    {2048, 0, 3000, 512, 0},
	    {511, 1024, 2000, 512, 0},
	    {512, 1024, 2000, 512, 512},
	    {1000, 1024, 2000, 512, 512},
	    {1024, 1024, 2000, 512, 1024},
	    {2000, 1024, 3000, 512, 1024},
	    {1500, 2048, 3000, 512, 1024},
	    {3000, 2048, 3000, 512, 2048},
	    /* At least one token is left to evaluate. */
	    {2048, 2048, 2048, 512, 1536},
	    {2048, 2048, 2049, 512, 2048},
	    {5000, 5000, 1025, 512, 1024},
	    {5000, 5000, 1024, 512, 512},
	    {5000, 5000, 512, 512, 0},
	    {5000, 5000, 1, 512, 0},
	    /* n = 0: nothing to reuse. */
	    {100, 100, 0, 64, 0},
	    {0, 0, 0, 512, 0},
	    /* Other grids. */
	    {100, 100, 200, 64, 64},
	    {128, 128, 200, 64, 128},
	    {1117, 1117, 2000, 256, 1024},
	    {1117, 1117, 2000, 100, 1100},
	    {10, 10, 11, 1, 10},
	    {10, 10, 10, 1, 9},
	    {1, 1, 1, 1, 0},
	    /* No grid: no exact reuse. */
	    {1000, 1000, 2000, 0, 0},
	    {1000, 1000, 2000, -1, 0},
	};
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		size_t got =
		    router_exact_reuse(rows[i].matched, rows[i].aligned, rows[i].n, rows[i].ub);
		if (got != rows[i].want)
			fprintf(stderr,
			        "row %zu: matched %zu aligned %zu n %zu ub %d: got %zu want %zu\n",
			        i, rows[i].matched, rows[i].aligned, rows[i].n, rows[i].ub, got,
			        rows[i].want);
		assert_int_equal(got, rows[i].want);
	}
}

static void test_exact_reuse_invariants(void **state)
{
	static const int ubs[] = {1, 2, 3, 7, 16, 64};
	for (size_t u = 0; u < sizeof ubs / sizeof *ubs; u++) {
		size_t ub = (size_t)ubs[u];
		for (size_t n = 0; n <= 70; n++)
			for (size_t matched = 0; matched <= 75; matched += 3)
				for (size_t aligned = 0; aligned <= 75; aligned += 5) {
					size_t got =
					    router_exact_reuse(matched, aligned, n, ubs[u]);
					if (n == 0) {
						assert_int_equal(got, 0);
						continue;
					}
					/* Never everything, never past what matches or what
					 * is on the grid, always a multiple of the grid. */
					assert_true(got < n);
					assert_true(got <= matched);
					assert_true(got <= aligned);
					assert_int_equal(got % ub, 0);
					/* And the largest such: one more micro-batch would
					 * break one of the bounds. */
					size_t lim = matched < aligned ? matched : aligned;
					if (lim > n - 1)
						lim = n - 1;
					assert_true(got + ub > lim);
				}
	}
}

static void test_mode_names(void **state)
{
	enum reuse_mode m = REUSE_FAST;
	assert_int_equal(reuse_mode_parse("exact", &m), 0);
	assert_int_equal(m, REUSE_EXACT);
	assert_int_equal(reuse_mode_parse("fast", &m), 0);
	assert_int_equal(m, REUSE_FAST);
	m = REUSE_EXACT;
	assert_int_equal(reuse_mode_parse("Fast", &m), -1);
	assert_int_equal(reuse_mode_parse("", &m), -1);
	assert_int_equal(reuse_mode_parse("exactly", &m), -1);
	assert_int_equal(m, REUSE_EXACT);
	assert_string_equal(reuse_mode_name(REUSE_EXACT), "exact");
	assert_string_equal(reuse_mode_name(REUSE_FAST), "fast");
}

static void test_rates(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 1, UB, &b);
	/* Unmeasured: 500 tokens a second. */
	assert_true(router_estimate_prefill_s(b, 1000) > 1.999 &&
	            router_estimate_prefill_s(b, 1000) < 2.001);
	assert_true(router_estimate_prefill_s(b, 0) == 0.0);
	/* Tiny prefills and zero times are ignored. */
	router_backend_note_prefill(b, 15, 1.0);
	router_backend_note_prefill(b, 1000, 0.0);
	assert_true(b->prefill_tps == 0.0);
	/* The first sample is taken as is, later ones are averaged in. */
	router_backend_note_prefill(b, 1000, 1000.0);
	assert_true(b->prefill_tps > 999.9 && b->prefill_tps < 1000.1);
	assert_true(router_estimate_prefill_s(b, 1000) > 0.999 &&
	            router_estimate_prefill_s(b, 1000) < 1.001);
	router_backend_note_prefill(b, 2000, 1000.0);
	assert_true(b->prefill_tps > 1299.9 && b->prefill_tps < 1300.1);
	router_backend_note_decode(b, 3, 10.0);
	assert_true(b->decode_tps == 0.0);
	router_backend_note_decode(b, 100, 1000.0);
	assert_true(b->decode_tps > 99.9 && b->decode_tps < 100.1);
	router_free(r);
}

/* ------------------------------------------------------------ routing */

static void test_continuation_hits_fast(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	struct route_choice c = serve_at(r, conv(1, 1000), 1000, SEC(1));
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	assert_int_equal(c.reuse, 0);
	struct router_slot *s = c.slot;

	/* Another conversation takes the other slot. */
	c = serve_at(r, conv(2, 900), 900, SEC(2));
	assert_ptr_not_equal(c.slot, s);

	assert_int_equal(choose(r, conv(1, 1500), 1500, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 1000);
	assert_int_equal(c.reuse, 1000);
	assert_int_equal(c.must_trim, 0);
	/* 500 tokens at the default 500 tokens a second. */
	assert_true(c.est_prefill_s > 0.999 && c.est_prefill_s < 1.001);

	/* The very same prompt again: everything but the last token. */
	assert_int_equal(choose(r, conv(1, 1000), 1000, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 1000);
	assert_int_equal(c.reuse, 999);
	/* A prefix of what the slot holds. */
	assert_int_equal(choose(r, conv(1, 600), 600, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 600);
	assert_int_equal(c.reuse, 599);
	router_free(r);
}

static void test_continuation_hits_exact(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_EXACT, 1, 2, UB, &b);
	struct route_choice c = serve_at(r, conv(1, 1117), 1117, SEC(1));
	struct router_slot *s = c.slot;
	assert_int_equal(s->aligned, 1024);
	c = serve_at(r, conv(2, 700), 700, SEC(2));
	assert_ptr_not_equal(c.slot, s);

	assert_int_equal(choose(r, conv(1, 1700), 1700, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 1117);
	assert_int_equal(c.reuse, 1024);
	assert_int_equal(c.must_trim, 1);
	assert_true(c.est_prefill_s > (676 / 500.0) - 1e-6 &&
	            c.est_prefill_s < (676 / 500.0) + 1e-6);

	/* Served: trimmed to 1024, then 1700 held with 1536 on the grid. */
	c = serve_at(r, conv(1, 1700), 1700, SEC(3));
	assert_ptr_equal(c.slot, s);
	assert_int_equal(s->aligned, 1536);
	assert_int_equal(s->hits, 1);
	assert_int_equal(choose(r, conv(1, 2000), 2000, SEC(4), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_int_equal(c.reuse, 1536);
	router_free(r);
}

static void test_partial_system_prompt(void **state)
{
	/* One slot: a request sharing only the system prompt is a partial hit. */
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 1, UB, &b);
	serve_at(r, mk(1, 500, 200), 500, SEC(1));
	struct route_choice c;
	assert_int_equal(choose(r, mk(2, 600, 200), 600, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(b, 0));
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 200);
	assert_int_equal(c.reuse, 200);
	router_free(r);

	/* With an empty slot too: a first turn's own 300 tokens are not
	 * overwritten for 200 shared ones (sessions sharing a system prompt
	 * would funnel onto one slot); the new one takes the empty slot. */
	r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	c = serve_at(r, mk(1, 500, 200), 500, SEC(1));
	struct router_slot *s = c.slot;
	assert_int_equal(s->hits, 0);
	assert_int_equal(choose(r, mk(2, 600, 200), 600, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, s);
	assert_string_equal(c.kind, "miss");
	router_free(r);

	/* But a one-off whose own part is small beside the shared prefix (a
	 * title request after a long system prompt) gives way. */
	r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	c = serve_at(r, mk(1, 1040, 1000), 1040, SEC(1));
	s = c.slot;
	assert_int_equal(choose(r, mk(2, 1600, 1000), 1600, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 1000);
	router_free(r);

	/* Without an empty slot the shared prefix wins over a cold slot. */
	r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	c = serve_at(r, mk(1, 500, 200), 500, SEC(1));
	s = c.slot;
	struct router_slot *other = serve_at(r, conv(9, 900), 900, SEC(1.5)).slot;
	assert_ptr_not_equal(other, s);
	assert_int_equal(choose(r, mk(2, 600, 200), 600, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 200);
	router_free(r);

	/* But a hot conversation is kept: the new one goes to the empty slot. */
	r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	c = serve_at(r, mk(1, 400, 200), 400, SEC(1));
	s = c.slot;
	c = serve_at(r, mk(1, 500, 200), 500, SEC(2));
	assert_ptr_equal(c.slot, s);
	assert_int_equal(s->hits, 1);
	assert_int_equal(choose(r, mk(2, 600, 200), 600, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, s);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	router_free(r);
}

static void check_miss_takes_empty(enum reuse_mode mode)
{
	struct router_backend *b;
	struct router *r = mkrouter(mode, 1, 2, UB, &b);
	struct route_choice c = serve_at(r, conv(1, 1000), 1000, SEC(1));
	struct router_slot *hot = c.slot;
	c = serve_at(r, conv(1, 1500), 1500, SEC(2));
	assert_ptr_equal(c.slot, hot);
	assert_true(hot->hits > 0);

	assert_int_equal(choose(r, conv(2, 800), 800, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, hot);
	assert_int_equal(c.slot->n_tokens, 0);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	assert_int_equal(c.reuse, 0);
	assert_int_equal(c.must_trim, 0);
	serve_at(r, conv(2, 800), 800, SEC(3));

	/* The conversation is still where it was. */
	assert_int_equal(hot->n_tokens, 1500);
	assert_int_equal(choose(r, conv(1, 1600), 1600, SEC(4), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, hot);
	assert_string_equal(c.kind, "hit");
	router_free(r);
}

static void test_miss_takes_empty_slot(void **state)
{
	check_miss_takes_empty(REUSE_FAST);
	check_miss_takes_empty(REUSE_EXACT);
}

/* Both slots full; the hot conversation is the least recently used, so
 * neither LRU nor slot order would spare it: only the policy does. Its
 * turns came 2 s apart and its next one is due; the cold content may be a
 * one-off, and it goes. */
static void check_evicts_cold(enum reuse_mode mode, int hot_first)
{
	struct router_backend *b;
	struct router *r = mkrouter(mode, 1, 2, UB, &b);
	struct router_slot *hot, *cold;
	if (hot_first) {
		hot = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
		assert_ptr_equal(serve_at(r, conv(1, 1500), 1500, SEC(3.5)).slot, hot);
		cold = serve_at(r, conv(2, 1500), 1500, SEC(4)).slot;
	} else {
		cold = serve_at(r, conv(2, 1500), 1500, SEC(0.5)).slot;
		hot = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
		assert_ptr_equal(serve_at(r, conv(1, 1500), 1500, SEC(3.5)).slot, hot);
		/* Touch the cold one last. */
		struct route_choice c;
		assert_int_equal(choose(r, conv(2, 1500), 1500, SEC(4), &c), ROUTE_CHOSEN);
		assert_ptr_equal(c.slot, cold);
		router_slot_begin(r, cold, SEC(4), 0.1);
		router_slot_end(r, cold, SEC(4.5));
	}
	assert_ptr_not_equal(hot, cold);
	assert_true(hot->hits > 0);
	assert_int_equal(cold->hits, 0);
	assert_true(hot->last_used_us < cold->last_used_us);

	struct route_choice c;
	assert_int_equal(choose(r, conv(3, 500), 500, SEC(6), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, cold);
	assert_string_equal(c.kind, "miss");
	router_free(r);
}

/* Issue 24, three conversations and more on two slots: a resent prompt,
 * a finished conversation of 4 turns, then two new ones taking turns.
 * The second new one must not overwrite the first, fresh and still
 * without a hit, while the finished one keeps the other slot: the two
 * took turns overwriting each other, every turn a miss. With think times
 * of 0.25 s (llama-server's LRU happens to get this right) and of 3 s
 * (the new conversation is then older than any fixed window). */
static void check_new_conversations_keep_slots(enum reuse_mode mode, double think)
{
	struct router_backend *b;
	struct router *r = mkrouter(mode, 1, 2, UB, &b);
	double t = 0, step = 0.5 + think; /* serve_at's request takes 0.5 s */
	serve_at(r, conv(0, 2000), 2000, SEC(t));
	serve_at(r, conv(0, 2000), 2000, SEC(t += step));
	for (int k = 0; k < 4; k++)
		serve_at(r, conv(1, 300 * (size_t)(k + 1)), 300 * (size_t)(k + 1), SEC(t += step));
	struct route_choice a = serve_at(r, conv(2, 800), 800, SEC(t += step));
	struct route_choice bc = serve_at(r, conv(3, 800), 800, SEC(t += step));
	assert_ptr_not_equal(a.slot, bc.slot);
	for (int k = 1; k < 3; k++) {
		size_t n = 800 + 500 * (size_t)k;
		struct route_choice c = serve_at(r, conv(2, n), n, SEC(t += step));
		assert_ptr_equal(c.slot, a.slot);
		assert_string_equal(c.kind, "hit");
		c = serve_at(r, conv(3, n), n, SEC(t += step));
		assert_ptr_equal(c.slot, bc.slot);
		assert_string_equal(c.kind, "hit");
	}
	router_free(r);
}

static void test_new_conversations_keep_slots(void **state)
{
	for (int m = 0; m < 2; m++) {
		enum reuse_mode mode = m ? REUSE_EXACT : REUSE_FAST;
		const double thinks[] = {0.25, 3, 30};
		for (int k = 0; k < 3; k++) {
			check_new_conversations_keep_slots(mode, thinks[k]);
			teardown_seqs(state);
		}
	}
}

/* Issue 24: a conversation that stopped taking turns gives way to two in
 * use, which otherwise took turns overwriting each other on the other slot
 * while the finished one, hot and longer, kept its own. Its turns came a
 * second apart (a think time of 2 s at least, the floor); idle 8.5 s, it
 * has let four go by. */
static void check_finished_gives_way(enum reuse_mode mode)
{
	struct router_backend *b;
	struct router *r = mkrouter(mode, 1, 2, UB, &b);
	struct router_slot *done = NULL;
	for (int t = 0; t < 4; t++) /* 4 turns, half a second apart */
		done =
		    serve_at(r, conv(1, 500 * (size_t)(t + 1)), 500 * (size_t)(t + 1), SEC(t)).slot;
	assert_true(done->hits >= 2);
	struct route_choice a = serve_at(r, conv(2, 1000), 1000, SEC(10));
	assert_ptr_not_equal(a.slot, done); /* the empty slot */
	struct route_choice bc = serve_at(r, conv(3, 1000), 1000, SEC(12));
	assert_ptr_equal(bc.slot, done); /* not the conversation in use */
	for (int t = 1; t < 3; t++) {
		struct route_choice c = serve_at(r, conv(2, 1000 + 500 * (size_t)t),
		                                 1000 + 500 * (size_t)t, SEC(10 + 4 * t));
		assert_ptr_equal(c.slot, a.slot);
		assert_string_equal(c.kind, "hit");
		c = serve_at(r, conv(3, 1000 + 500 * (size_t)t), 1000 + 500 * (size_t)t,
		             SEC(12 + 4 * t));
		assert_ptr_equal(c.slot, bc.slot);
		assert_string_equal(c.kind, "hit");
	}
	router_free(r);
}

static void test_finished_conversation_gives_way(void **state)
{
	check_finished_gives_way(REUSE_FAST);
	check_finished_gives_way(REUSE_EXACT);
}

static void test_full_evicts_cold(void **state)
{
	check_evicts_cold(REUSE_FAST, 1);
	check_evicts_cold(REUSE_FAST, 0);
	check_evicts_cold(REUSE_EXACT, 1);
	check_evicts_cold(REUSE_EXACT, 0);
}

static void test_stale_hot_loses_value(void **state)
{
	/* A hot conversation unused for hours is worth less than a cold one
	 * used just now. */
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	struct router_slot *hot = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
	serve_at(r, conv(1, 1500), 1500, SEC(2));
	assert_true(hot->hits > 0);
	struct router_slot *cold = serve_at(r, conv(2, 1500), 1500, SEC(3 * 3600)).slot;
	assert_ptr_not_equal(hot, cold);
	struct route_choice c;
	assert_int_equal(choose(r, conv(3, 500), 500, SEC(3 * 3600 + 1), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, hot);
	router_free(r);
}

static void test_busy_prefers_free(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	struct route_choice c;
	/* Two empty slots; the first busy: the other one, at once. */
	assert_int_equal(choose(r, conv(1, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	struct router_slot *first = c.slot;
	router_slot_begin(r, first, SEC(1), 5.0);
	assert_int_equal(b->in_flight, 1);
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, first);
	assert_int_equal(c.slot->busy, 0);
	/* Long past its estimated end, a busy slot still costs a wait: the
	 * overdue estimate must not make it look cheaper than a free one. */
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(100), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, first);
	router_slot_end(r, first, SEC(2));
	assert_int_equal(b->in_flight, 0);
	assert_int_equal(first->busy, 0);
	/* Ending twice does not drive in_flight negative. */
	router_slot_end(r, first, SEC(2));
	assert_int_equal(b->in_flight, 0);

	/* A busy slot always costs at least 50 ms of wait, even when it is
	 * about to end or long past its estimated end: a 10-token head start
	 * is not worth waiting for. */
	assert_int_equal(router_slot_commit(r, first, conv(3, 10), 10, 0, SEC(3)), 0);
	router_slot_begin(r, first, SEC(3), 0.01);
	assert_int_equal(choose(r, conv(3, 100), 100, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, first);
	assert_int_equal(choose(r, conv(3, 100), 100, SEC(100), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, first);
	assert_string_equal(c.kind, "miss");
	router_slot_end(r, first, SEC(101));
	assert_int_equal(choose(r, conv(3, 100), 100, SEC(101), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, first);
	assert_string_equal(c.kind, "hit");
	router_free(r);
}

static void test_busy_wait_or_go_elsewhere(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	/* Two hot conversations of 4000 tokens. */
	struct router_slot *sa = serve_at(r, conv(1, 3000), 3000, SEC(1)).slot;
	assert_ptr_equal(serve_at(r, conv(1, 4000), 4000, SEC(2)).slot, sa);
	struct router_slot *sb = serve_at(r, conv(2, 3000), 3000, SEC(3)).slot;
	assert_ptr_equal(serve_at(r, conv(2, 4000), 4000, SEC(4)).slot, sb);
	assert_ptr_not_equal(sa, sb);
	assert_true(sa->hits > 0 && sb->hits > 0);

	/* A's slot is busy for about a second: waiting (500 tokens' worth)
	 * beats prefilling 4100 tokens and losing B's 4000. */
	struct route_choice c;
	int64_t t = SEC(10);
	router_slot_begin(r, sa, t, 1.0);
	assert_int_equal(choose(r, conv(1, 4100), 4100, t, &c), ROUTE_WAIT);
	assert_ptr_equal(c.slot, sa);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.reuse, 4000);
	/* Past its estimated end it is still busy: still worth the wait. */
	assert_int_equal(choose(r, conv(1, 4100), 4100, t + SEC(30), &c), ROUTE_WAIT);
	assert_ptr_equal(c.slot, sa);
	router_slot_end(r, sa, t + SEC(1));
	assert_int_equal(choose(r, conv(1, 4100), 4100, t + SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, sa);

	/* Busy for 100 s: the wait costs more than going elsewhere. */
	t = SEC(20);
	router_slot_begin(r, sa, t, 100.0);
	assert_int_equal(choose(r, conv(1, 4100), 4100, t, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, sb);
	assert_string_equal(c.kind, "miss");
	router_slot_end(r, sa, t + SEC(1));

	/* Busy for 10 s: 5000 tokens' worth at the default rate (wait), but
	 * 10000 at a measured 1000 tokens a second (go elsewhere). */
	t = SEC(30);
	router_slot_begin(r, sa, t, 10.0);
	assert_int_equal(choose(r, conv(1, 4100), 4100, t, &c), ROUTE_WAIT);
	assert_ptr_equal(c.slot, sa);
	router_backend_note_prefill(b, 1000, 1000.0);
	assert_int_equal(choose(r, conv(1, 4100), 4100, t, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, sb);
	router_slot_end(r, sa, t + SEC(1));
	router_free(r);
}

static void test_exact_backend_busy(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_EXACT, 1, 2, UB, &b);
	struct route_choice c;
	assert_int_equal(choose(r, conv(1, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	struct router_slot *s = c.slot;
	router_slot_begin(r, s, SEC(1), 1.0);
	/* The other slot is free, but the backend runs one request at a time. */
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(1), &c), ROUTE_WAIT);
	assert_non_null(c.slot);
	assert_int_equal(choose(r, conv(1, 200), 200, SEC(1), &c), ROUTE_WAIT);
	router_slot_end(r, s, SEC(2));
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(2), &c), ROUTE_CHOSEN);
	router_free(r);

	/* Fast mode lets the other slot run alongside. */
	r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	assert_int_equal(choose(r, conv(1, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	s = c.slot;
	router_slot_begin(r, s, SEC(1), 1.0);
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_not_equal(c.slot, s);
	router_free(r);

	/* Exact mode with two backends: the idle one. */
	struct router_backend *bs[2];
	r = mkrouter(REUSE_EXACT, 2, 2, UB, bs);
	assert_int_equal(choose(r, conv(1, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[0]);
	router_slot_begin(r, c.slot, SEC(1), 1.0);
	assert_int_equal(choose(r, conv(2, 100), 100, SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[1]);
	router_slot_begin(r, c.slot, SEC(1), 1.0);
	assert_int_equal(choose(r, conv(3, 100), 100, SEC(1), &c), ROUTE_WAIT);
	router_free(r);
}

static void test_no_backend(void **state)
{
	struct route_choice c;
	struct router *r = router_new(REUSE_EXACT);
	assert_non_null(r);
	assert_int_equal(choose(r, conv(1, 10), 10, SEC(1), &c), ROUTE_NO_BACKEND);
	struct router_backend *b0 = router_add_backend(r, "http://a");
	struct router_backend *b1 = router_add_backend(r, "http://b");
	assert_non_null(b0);
	assert_non_null(b1);
	assert_int_equal(r->n_backends, 2);
	assert_int_equal(router_backend_set_slots(r, b0, 1, 4096, 256), 0);
	assert_int_equal(router_backend_set_slots(r, b1, 1, 4096, 0), 0);
	assert_int_equal(b0->n_ubatch, 256);
	assert_int_equal(b1->n_ubatch, 512);
	/* Declared but not up. */
	assert_int_equal(choose(r, conv(1, 10), 10, SEC(1), &c), ROUTE_NO_BACKEND);
	router_backend_set_up(r, b1, 1);
	assert_int_equal(choose(r, conv(1, 10), 10, SEC(1), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, b1);
	/* Restricted to a backend that is down. */
	c.slot = NULL;
	assert_int_equal(router_choose(r, conv(1, 10), 10, SEC(1), 0, &c), ROUTE_NO_BACKEND);
	assert_int_equal(router_choose(r, conv(1, 10), 10, SEC(1), 1, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, b1);
	router_backend_set_up(r, b1, 0);
	assert_int_equal(choose(r, conv(1, 10), 10, SEC(1), &c), ROUTE_NO_BACKEND);
	router_free(r);

	/* Up but with no slots yet: wait for discovery. */
	r = router_new(REUSE_FAST);
	b0 = router_add_backend(r, "http://a");
	router_backend_set_up(r, b0, 1);
	assert_int_equal(choose(r, conv(1, 10), 10, SEC(1), &c), ROUTE_WAIT);
	router_free(r);
	router_free(NULL);
}

/* A backend rediscovered with another slot count while a request runs on
 * one of its old slots: that request still ends and commits on the old slot
 * (freed memory before, under ASan a use-after-free), nothing routes to it,
 * and the new slots' counts are right. */
static void test_rediscovered_with_other_slot_count(void **state)
{
	struct router_backend *bs[1];
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, bs);
	serve_at(r, conv(1, 800), 800, SEC(1));
	struct route_choice c;
	assert_int_equal(router_choose(r, conv(2, 900), 900, SEC(2), -1, &c), ROUTE_CHOSEN);
	struct router_slot *old = c.slot;
	router_slot_begin(r, old, SEC(2), c.est_prefill_s);
	assert_int_equal(bs[0]->in_flight, 1);

	assert_int_equal(router_backend_set_slots(r, bs[0], 3, 8192, UB), 0);
	assert_int_equal(bs[0]->n_slots, 3);
	assert_int_equal(bs[0]->in_flight, 0);
	assert_int_equal(old->retired, 1);
	assert_int_equal(old->n_tokens, 0);

	/* The old request ends: nothing of it reaches the tree or the counts. */
	assert_int_equal(router_slot_commit(r, old, conv(2, 900), 900, 0, SEC(3)), 0);
	router_slot_end(r, old, SEC(3));
	assert_int_equal(old->n_tokens, 0);
	assert_int_equal(bs[0]->in_flight, 0);
	assert_int_equal(router_choose(r, conv(2, 900), 900, SEC(4), -1, &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 0);
	assert_false(c.slot->retired);
	struct route_choice again = serve_at(r, conv(2, 900), 900, SEC(5));
	assert_ptr_equal(again.slot->backend, bs[0]);
	router_free(r);
}

static void test_only_backend(void **state)
{
	struct router_backend *bs[2];
	struct router *r = mkrouter(REUSE_FAST, 2, 1, UB, bs);
	struct route_choice c = serve_at(r, conv(1, 1000), 1000, SEC(1));
	assert_ptr_equal(c.slot->backend, bs[0]);
	assert_int_equal(router_choose(r, conv(1, 1200), 1200, SEC(2), 1, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[1]);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(router_choose(r, conv(1, 1200), 1200, SEC(2), 0, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[0]);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(router_choose(r, conv(1, 1200), 1200, SEC(2), -1, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[0]);
	router_free(r);
}

static void test_backend_down_forgets(void **state)
{
	struct router_backend *bs[2];
	struct router *r = mkrouter(REUSE_EXACT, 2, 1, UB, bs);
	struct router_slot *s = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
	assert_ptr_equal(serve_at(r, conv(1, 1200), 1200, SEC(2)).slot, s);
	assert_ptr_equal(s->backend, bs[0]);
	assert_true(s->hits > 0);
	assert_int_equal(s->aligned, 1024);

	/* Going up again while up changes nothing. */
	router_backend_set_up(r, bs[0], 1);
	assert_int_equal(s->n_tokens, 1200);

	router_backend_set_up(r, bs[0], 0);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->aligned, 0);
	assert_int_equal(s->hits, 0);
	assert_null(s->tokens);
	struct route_choice c;
	assert_int_equal(choose(r, conv(1, 1300), 1300, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[1]);
	assert_string_equal(c.kind, "miss");

	/* Back up: it holds nothing the router would count on. */
	router_backend_set_up(r, bs[0], 1);
	assert_int_equal(router_choose(r, conv(1, 1300), 1300, SEC(3), 0, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	assert_int_equal(c.reuse, 0);
	router_free(r);
}

static void test_set_slots_forgets(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	struct router_slot *s = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
	router_slot_begin(r, s, SEC(2), 1.0);
	assert_int_equal(b->in_flight, 1);
	assert_int_equal(router_backend_set_slots(r, b, 3, 4096, 128), 0);
	assert_int_equal(b->n_slots, 3);
	assert_int_equal(b->n_ctx_slot, 4096);
	assert_int_equal(b->n_ubatch, 128);
	assert_int_equal(b->in_flight, 0);
	for (int i = 0; i < 3; i++) {
		assert_ptr_equal(b->slots[i].backend, b);
		assert_int_equal(b->slots[i].id, i);
		assert_int_equal(b->slots[i].n_tokens, 0);
		assert_int_equal(b->slots[i].busy, 0);
	}
	struct route_choice c;
	assert_int_equal(choose(r, conv(1, 1100), 1100, SEC(3), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	router_free(r);
}

/* ------------------------------------------------------------ commits */

static struct router_slot *one_slot(enum reuse_mode mode, int ub, struct router **rp)
{
	struct router_backend *b;
	*rp = mkrouter(mode, 1, 1, ub, &b);
	return slot_of(b, 0);
}

static void test_commit_aligned(void **state)
{
	struct router *r;
	struct router_slot *s = one_slot(REUSE_EXACT, UB, &r);
	const token_t *a = conv(1, 4000);

	/* Evaluated from 0: the full micro-batches are on the grid. */
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	assert_int_equal(s->n_tokens, 1117);
	assert_int_equal(s->aligned, 1024);
	assert_int_equal(s->hits, 0);
	assert_int_equal(s->last_used_us, SEC(1));
	assert_memory_equal(s->tokens, a, 1117 * sizeof *a);

	/* A continuation from the grid point. */
	assert_int_equal(router_slot_commit(r, s, a, 1700, 1024, SEC(2)), 0);
	assert_int_equal(s->n_tokens, 1700);
	assert_int_equal(s->aligned, 1536);
	assert_int_equal(s->hits, 1);

	/* Fast-mode style reuse off the grid: evaluation started at 1100, so
	 * nothing past the last grid point below it is known to be aligned. */
	assert_int_equal(router_slot_commit(r, s, a, 1800, 1100, SEC(3)), 0);
	size_t bound = (1100 < 1536 ? 1100 : 1536) / UB * UB;
	assert_true(s->aligned <= bound);
	assert_int_equal(s->aligned, 1024);
	assert_int_equal(s->hits, 2);

	/* From the grid again: aligned grows. */
	assert_int_equal(router_slot_commit(r, s, a, 3000, 1024, SEC(4)), 0);
	assert_int_equal(s->aligned, 1024 + (3000 - 1024) / UB * UB);
	assert_int_equal(s->aligned, 2560);

	/* Reuse past what is known to be aligned is not trusted. */
	assert_int_equal(router_slot_commit(r, s, a, 3200, 2560 + 512, SEC(5)), 0);
	assert_int_equal(s->aligned, 2560);

	/* The whole prompt reused. */
	assert_int_equal(router_slot_commit(r, s, a, 2560, 2560, SEC(6)), 0);
	assert_int_equal(s->aligned, 2560);
	assert_int_equal(s->n_tokens, 2560);

	/* A prompt that diverges at 800: only what still matches counts. */
	const token_t *d = mk(1, 2000, 0);
	token_t *dm = (token_t *)d;
	for (size_t i = 800; i < 2000; i++)
		dm[i] = -(token_t)i;
	assert_int_equal(router_slot_commit(r, s, d, 2000, 512, SEC(7)), 0);
	assert_int_equal(s->aligned, 512 + (2000 - 512) / UB * UB);
	assert_int_equal(s->aligned, 1536);
	/* Now 2000 tokens of the a-stream: they match d for 800 only, so
	 * a reuse of 1024 reaches past the match and is not trusted. */
	assert_int_equal(router_slot_commit(r, s, a, 2000, 1024, SEC(8)), 0);
	assert_int_equal(s->aligned, 512);

	/* Nothing reused: only the new content's own grid. */
	assert_int_equal(router_slot_commit(r, s, a, 1000, 0, SEC(9)), 0);
	assert_int_equal(s->aligned, 512);
	assert_int_equal(s->hits, 0);

	/* An empty commit leaves nothing. */
	assert_int_equal(router_slot_commit(r, s, a, 0, 0, SEC(10)), 0);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->aligned, 0);
	struct route_choice c;
	assert_int_equal(choose(r, a, 100, SEC(11), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "miss");
	router_free(r);
}

static void test_commit_other_grids(void **state)
{
	struct router *r;
	struct router_slot *s = one_slot(REUSE_EXACT, 256, &r);
	const token_t *a = conv(1, 4000);
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 1024);
	assert_int_equal(router_slot_commit(r, s, a, 1300, 1024, SEC(2)), 0);
	assert_int_equal(s->aligned, 1280);
	router_free(r);

	s = one_slot(REUSE_EXACT, 100, &r);
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 1100);
	/* 1050 is not on a grid of 100. */
	assert_int_equal(router_slot_commit(r, s, a, 1500, 1050, SEC(2)), 0);
	assert_int_equal(s->aligned, 1000);
	router_free(r);

	/* Shorter than one micro-batch: nothing aligned. */
	s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 511, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 0);
	assert_int_equal(router_slot_commit(r, s, a, 512, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 512);
	router_free(r);
}

static void test_commit_hits(void **state)
{
	struct router *r;
	struct router_slot *s = one_slot(REUSE_FAST, UB, &r);
	const token_t *a = conv(1, 4000);
	assert_int_equal(router_slot_commit(r, s, a, 1000, 0, SEC(1)), 0);
	assert_int_equal(s->hits, 0);
	/* Each extension that reused the content counts. */
	assert_int_equal(router_slot_commit(r, s, a, 1200, 1000, SEC(2)), 0);
	assert_int_equal(s->hits, 1);
	assert_int_equal(router_slot_commit(r, s, a, 1500, 1199, SEC(3)), 0);
	assert_int_equal(s->hits, 2);
	/* The server reused more than the router knew of (the generated tokens
	 * that follow the prompt in its KV): all the known content was reused,
	 * so it still counts. */
	assert_int_equal(router_slot_commit(r, s, a, 2000, 1700, SEC(4)), 0);
	assert_int_equal(s->hits, 3);
	assert_int_equal(s->n_tokens, 2000);
	/* Content that does not continue all of the old content is a new
	 * conversation: cold, even though the server reused a prefix. */
	const token_t *d = mk(1, 2500, 0);
	token_t *dm = (token_t *)d;
	for (size_t i = 1000; i < 2500; i++)
		dm[i] = -(token_t)i - 1;
	assert_int_equal(router_slot_commit(r, s, d, 2500, 1500, SEC(5)), 0);
	assert_int_equal(s->hits, 0);
	/* Evaluated from scratch: new content, no history. */
	assert_int_equal(router_slot_commit(r, s, a, 800, 0, SEC(6)), 0);
	assert_int_equal(s->hits, 0);
	/* After the slot is forgotten, a reuse of unknown content is no hit. */
	router_slot_forget(r, s);
	assert_int_equal(router_slot_commit(r, s, a, 900, 500, SEC(7)), 0);
	assert_int_equal(s->hits, 0);
	router_free(r);
}

/* Exact mode cuts a slot's tail after every answer, leaving a throw-away
 * token: the next turn continues all the rest, and is a turn (its think
 * time measured), not new content. */
static void test_turn_after_a_tail_cut_is_a_hit(void **state)
{
	struct router *r;
	struct router_slot *s = one_slot(REUSE_EXACT, UB, &r);
	const token_t *a = conv(1, 4000);
	router_slot_begin(r, s, SEC(1), 0.1);
	assert_int_equal(router_slot_commit_sched(r, s, a, 1000, NULL, 0, 1000, SEC(1.5)), 0);
	assert_int_equal(router_slot_cut(r, s, a, 512, 7, SEC(1.6)), 0);
	router_slot_end(r, s, SEC(1.6));
	assert_true(s->junk_tail);
	assert_int_equal(s->hits, 0);
	router_slot_begin(r, s, SEC(3.6), 0.1); /* 2 s after the answer */
	assert_int_equal(router_slot_commit_sched(r, s, a, 1300, NULL, 0, 1300, SEC(4)), 0);
	router_slot_end(r, s, SEC(4));
	assert_int_equal(s->hits, 1);
	assert_true(s->think_s > 1.9 && s->think_s < 2.1);
	router_free(r);
}

/* A slot whose answer's rows exact mode kept (router_slot_kept): it holds
 * exactly what the router knows, so the next turn, which matches all of it,
 * needs no cut first; a resend of its prompt is a hit there, and weighs
 * nothing of the answer it would replace, even with an empty slot beside. */
static void test_kept_answer(void **state)
{
	(void)state;
	struct router_backend *be;
	struct router *r = mkrouter(REUSE_EXACT, 1, 2, UB, &be);
	struct router_slot *s = slot_of(be, 0);
	const token_t *a = conv(3, 4000);
	/* The prompt's last chunk starts at 1000; its 1010 tokens, then an
	 * answer of 20 kept as steps. */
	size_t b[22] = {1000};
	for (int i = 0; i < 20; i++)
		b[1 + i] = 1010 + (size_t)i;
	assert_int_equal(router_slot_kept(r, s, a, 1030, 1010, 0, b, 21, 1030, SEC(1)), 0);
	assert_int_equal(s->whole, 1);
	assert_int_equal(s->answer_at, 1010);
	/* The next turn: the answer's steps, its end at 1030, more. */
	size_t nb[] = {1000, 1010, 1011, 1012, 1013, 1014, 1015, 1016, 1017, 1018, 1019, 1020,
	               1021, 1022, 1023, 1024, 1025, 1026, 1027, 1028, 1029, 1030, 1100};
	struct route_choice c;
	assert_int_equal(
	    router_choose_sched(r, a, 1105, nb, sizeof nb / sizeof *nb, SEC(2), ~0ULL, &c),
	    ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_int_equal(c.matched, 1030);
	assert_int_equal(c.reuse, 1030);
	assert_int_equal(c.must_trim, 0);
	/* The same prompt again: the generation prompt's chunk is evaluated
	 * again, after a cut, on this slot. */
	size_t rb[] = {1000};
	assert_int_equal(router_choose_sched(r, a, 1010, rb, 1, SEC(3), ~0ULL, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.reuse, 1000);
	assert_int_equal(c.must_trim, 1);
	/* Any other record of the slot is not whole. */
	assert_int_equal(router_slot_commit_sched(r, s, a, 1010, rb, 1, 1010, SEC(4)), 0);
	assert_int_equal(s->whole, 0);
	assert_int_equal(s->answer_at, 0);

	/* A joined header (prompt/prompt.h): the generation prompt's last
	 * token, 1009, is a step of its own. A resend reuses everything
	 * before it, and the server's own reuse stops there too (it
	 * evaluates the last token of a prompt it holds whole): no cut. */
	size_t jb[22] = {1000, 1009};
	for (int i = 0; i < 20; i++)
		jb[2 + i] = 1010 + (size_t)i;
	assert_int_equal(router_slot_kept(r, s, a, 1030, 1010, 0, jb, 22, 1030, SEC(5)), 0);
	size_t jr[] = {1000, 1009};
	assert_int_equal(router_choose_sched(r, a, 1010, jr, 2, SEC(6), ~0ULL, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 1010);
	assert_int_equal(c.reuse, 1009);
	assert_int_equal(c.must_trim, 0);
	/* A slot that may hold more than the router knows is still cut. */
	assert_int_equal(router_slot_commit_sched(r, s, a, 1010, jr, 2, 1010, SEC(7)), 0);
	assert_int_equal(router_choose_sched(r, a, 1010, jr, 2, SEC(8), ~0ULL, &c), ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 1009);
	assert_int_equal(c.must_trim, 1);
	router_free(r);
}

static void test_must_trim(void **state)
{
	struct router *r;
	struct route_choice c;
	const token_t *a = conv(1, 4000);

	/* The slot's known content entirely matched: the server may hold more
	 * (generated tokens), so it is cut back to the reuse. */
	struct router_slot *s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	assert_int_equal(choose(r, a, 1700, SEC(2), &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1117);
	assert_int_equal(c.reuse, 1024);
	assert_int_equal(c.must_trim, 1);
	/* Even when the match is on the grid. */
	assert_int_equal(router_slot_commit(r, s, a, 1024, 0, SEC(3)), 0);
	assert_int_equal(s->aligned, 1024);
	assert_int_equal(choose(r, a, 1700, SEC(4), &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1024);
	assert_int_equal(c.reuse, 1024);
	assert_int_equal(c.must_trim, 1);
	/* The same prompt again: one token must be evaluated. */
	assert_int_equal(choose(r, a, 1024, SEC(4), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.reuse, 512);
	assert_int_equal(c.must_trim, 1);
	router_free(r);

	/* Matched past the reuse, content not entirely matched. */
	s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	const token_t *d = mk(1, 1500, 0);
	token_t *dm = (token_t *)d;
	for (size_t i = 1100; i < 1500; i++)
		dm[i] = -(token_t)i - 1;
	assert_int_equal(choose(r, d, 1500, SEC(2), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 1100);
	assert_int_equal(c.reuse, 1024);
	assert_int_equal(c.must_trim, 1);
	router_free(r);

	/* Matched exactly the reuse, content not entirely matched: the
	 * server's own prefix stops there too. */
	s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 2048, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 2048);
	d = mk(1, 1500, 0);
	dm = (token_t *)d;
	for (size_t i = 1024; i < 1500; i++)
		dm[i] = -(token_t)i - 1;
	assert_int_equal(choose(r, d, 1500, SEC(2), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "partial");
	assert_int_equal(c.matched, 1024);
	assert_int_equal(c.reuse, 1024);
	assert_int_equal(c.must_trim, 0);
	router_free(r);

	/* No reuse: nothing to cut back to. */
	s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 300, 0, SEC(1)), 0);
	assert_int_equal(s->aligned, 0);
	assert_int_equal(choose(r, a, 600, SEC(2), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 300);
	assert_int_equal(c.reuse, 0);
	assert_int_equal(c.must_trim, 0);
	router_free(r);

	/* Fast mode never cuts back. */
	s = one_slot(REUSE_FAST, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 1117, 0, SEC(1)), 0);
	assert_int_equal(choose(r, a, 1700, SEC(2), &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1117);
	assert_int_equal(c.reuse, 1117);
	assert_int_equal(c.must_trim, 0);
	router_free(r);
}

static void test_truncate(void **state)
{
	struct router *r;
	struct route_choice c;
	const token_t *a = conv(1, 4000);
	struct router_slot *s = one_slot(REUSE_EXACT, UB, &r);
	assert_int_equal(router_slot_commit(r, s, a, 1000, 0, SEC(1)), 0);
	assert_int_equal(router_slot_commit(r, s, a, 1700, 512, SEC(2)), 0);
	assert_int_equal(s->aligned, 1536);
	assert_int_equal(s->hits, 1);

	/* Past the end, or at it: nothing changes. */
	router_slot_truncate(r, s, 5000);
	assert_int_equal(s->n_tokens, 1700);
	router_slot_truncate(r, s, 1700);
	assert_int_equal(s->n_tokens, 1700);
	assert_int_equal(s->aligned, 1536);

	/* Off the grid, below aligned: aligned is cut to fit, and exact reuse
	 * falls back to the grid point below. */
	router_slot_truncate(r, s, 1100);
	assert_int_equal(s->n_tokens, 1100);
	assert_true(s->aligned <= 1100);
	assert_int_equal(s->hits, 1);
	assert_int_equal(choose(r, a, 1800, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, s);
	assert_string_equal(c.kind, "hit");
	assert_int_equal(c.matched, 1100);
	assert_int_equal(c.reuse, 1024);

	/* On the grid. */
	router_slot_truncate(r, s, 1024);
	assert_int_equal(s->n_tokens, 1024);
	assert_int_equal(s->aligned, 1024);
	assert_int_equal(choose(r, a, 1800, SEC(3), &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1024);
	assert_int_equal(c.reuse, 1024);
	assert_string_equal(c.kind, "hit");
	/* The tree no longer knows the cut tokens. */
	const token_t *d = mk(1, 1800, 0);
	token_t *dm = (token_t *)d;
	for (size_t i = 1050; i < 1800; i++)
		dm[i] = -(token_t)i - 1;
	assert_int_equal(choose(r, d, 1800, SEC(3), &c), ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1024);

	/* A commit after a truncation continues from the truncated content. */
	assert_int_equal(router_slot_commit(r, s, a, 1800, 1024, SEC(4)), 0);
	assert_int_equal(s->aligned, 1536);
	assert_int_equal(s->hits, 2);

	/* To nothing: forgotten. */
	router_slot_truncate(r, s, 0);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->aligned, 0);
	assert_int_equal(s->hits, 0);
	assert_int_equal(choose(r, a, 1800, SEC(5), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	router_free(r);
}

static void test_forget(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 2, UB, &b);
	const token_t *a = conv(1, 2000);
	struct router_slot *s = serve_at(r, a, 1000, SEC(1)).slot;
	struct router_slot *other = serve_at(r, conv(2, 1000), 1000, SEC(2)).slot;
	router_slot_forget(r, s);
	assert_int_equal(s->n_tokens, 0);
	assert_null(s->tokens);
	router_slot_forget(r, s); /* twice is harmless */
	struct route_choice c;
	assert_int_equal(choose(r, a, 1200, SEC(3), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "miss");
	assert_int_equal(c.matched, 0);
	/* The other slot is untouched. */
	assert_int_equal(choose(r, conv(2, 1200), 1200, SEC(3), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, other);
	assert_string_equal(c.kind, "hit");
	router_free(r);
}

/* A server that empties its idle slots at every new task (self_cached):
 * a request beginning on one slot leaves the others holding nothing. */
static void test_self_cached_begin_forgets_the_others(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 3, UB, &b);
	struct router_slot *s0 = serve_at(r, conv(1, 1000), 1000, SEC(1)).slot;
	struct router_slot *s1 = serve_at(r, conv(2, 1000), 1000, SEC(2)).slot;
	assert_ptr_not_equal(s0, s1);
	/* Not self-cached: beginning on one slot leaves the other alone. */
	router_slot_begin(r, s1, SEC(3), 0.1);
	router_slot_end(r, s1, SEC(3));
	assert_int_equal(s0->n_tokens, 1000);
	b->self_cached = 1;
	router_slot_begin(r, s1, SEC(4), 0.1);
	assert_int_equal(s0->n_tokens, 0);
	assert_int_equal(s1->n_tokens, 1000); /* its own content stays */
	router_slot_end(r, s1, SEC(4));
	struct route_choice c;
	assert_int_equal(choose(r, conv(1, 1200), 1200, SEC(5), &c), ROUTE_CHOSEN);
	assert_string_equal(c.kind, "miss");
	router_free(r);
}

/* Slots sharing one KV cache (shared_kv, found by exact mode's self-test):
 * an answer depends on what the other slots hold, so exact mode keeps every
 * conversation on the first slot, empty ones beside it or not; fast mode,
 * which promises no identity, uses them all. */
static void test_shared_kv_exact_keeps_to_the_first_slot(void **state)
{
	for (int exact = 0; exact < 2; exact++) {
		struct router_backend *b;
		struct router *r = mkrouter(exact ? REUSE_EXACT : REUSE_FAST, 1, 3, UB, &b);
		b->shared_kv = 1;
		struct route_choice c1 = serve_at(r, conv(1, 1000), 1000, SEC(1));
		struct route_choice c2 = serve_at(r, conv(2, 1000), 1000, SEC(2));
		struct route_choice c3 = serve_at(r, conv(3, 1000), 1000, SEC(3));
		if (exact) {
			assert_ptr_equal(c1.slot, slot_of(b, 0));
			assert_ptr_equal(c2.slot, slot_of(b, 0));
			assert_ptr_equal(c3.slot, slot_of(b, 0));
			assert_int_equal(slot_of(b, 1)->n_tokens, 0);
			assert_int_equal(slot_of(b, 2)->n_tokens, 0);
		} else {
			assert_ptr_not_equal(c1.slot, c2.slot);
			assert_ptr_not_equal(c2.slot, c3.slot);
			assert_ptr_not_equal(c1.slot, c3.slot);
		}
		router_free(r);
	}
}

static void test_same_content_two_slots(void **state)
{
	/* Two slots hold the same prompt: both are seen, and the request goes
	 * to one of them, not to the empty third. */
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_FAST, 1, 3, UB, &b);
	const token_t *a = conv(1, 2000);
	assert_int_equal(router_slot_commit(r, slot_of(b, 0), a, 1000, 0, SEC(1)), 0);
	assert_int_equal(router_slot_commit(r, slot_of(b, 1), a, 1000, 0, SEC(1)), 0);
	struct route_choice c;
	assert_int_equal(choose(r, a, 1500, SEC(2), &c), ROUTE_CHOSEN);
	assert_true(c.slot == slot_of(b, 0) || c.slot == slot_of(b, 1));
	assert_int_equal(c.matched, 1000);
	/* One of them busy: the other. */
	router_slot_begin(r, slot_of(b, 0), SEC(2), 1.0);
	assert_int_equal(choose(r, a, 1500, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(b, 1));
	assert_string_equal(c.kind, "hit");
	router_slot_end(r, slot_of(b, 0), SEC(3));
	router_free(r);
}

static void test_two_backends_balance(void **state)
{
	struct router_backend *bs[2];
	struct router *r = mkrouter(REUSE_FAST, 2, 2, UB, bs);
	struct route_choice c;
	struct router_backend *order[4];
	for (int i = 0; i < 4; i++) {
		assert_int_equal(choose(r, conv(10 + i, 300), 300, SEC(1), &c), ROUTE_CHOSEN);
		assert_int_equal(c.slot->busy, 0);
		order[i] = c.slot->backend;
		router_slot_begin(r, c.slot, SEC(1), 1.0);
	}
	/* Each new request goes to the backend with fewer in flight. */
	assert_ptr_not_equal(order[0], order[1]);
	assert_ptr_not_equal(order[2], order[3]);
	assert_int_equal(bs[0]->in_flight, 2);
	assert_int_equal(bs[1]->in_flight, 2);
	router_free(r);

	/* Whichever backend is loaded, the other one gets the request. */
	for (int loaded = 0; loaded < 2; loaded++) {
		r = mkrouter(REUSE_FAST, 2, 2, UB, bs);
		router_slot_begin(r, slot_of(bs[loaded], 1), SEC(1), 1.0);
		assert_int_equal(choose(r, conv(1, 300), 300, SEC(1), &c), ROUTE_CHOSEN);
		assert_ptr_equal(c.slot->backend, bs[!loaded]);
		router_free(r);
	}

	/* But a cache hit outweighs the load. */
	r = mkrouter(REUSE_FAST, 2, 2, UB, bs);
	assert_int_equal(router_slot_commit(r, slot_of(bs[0], 0), conv(1, 1000), 1000, 0, SEC(1)),
	                 0);
	router_slot_begin(r, slot_of(bs[0], 1), SEC(1), 1.0);
	assert_int_equal(choose(r, conv(1, 1200), 1200, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(bs[0], 0));
	assert_string_equal(c.kind, "hit");
	router_free(r);
}

/* A conversation saved by one backend whose slot is busy now: with shared
 * files (--slot-dir) and the same fingerprint, fast mode restores it into an
 * idle backend, and exact mode where both servers' self-tests gave the same
 * bits; not without shared files, under another fingerprint, in exact mode
 * with other or unknown bits, or on a backend where such a restore
 * failed. */
static struct router *saved_on_busy_backend(enum reuse_mode mode, int shared, const char *fp1,
                                            struct router_backend **bs, struct router_saved **saved)
{
	struct router *r = mkrouter(mode, 2, 1, UB, bs);
	r->shared_saved = shared;
	for (int i = 0; i < 2; i++) {
		bs[i]->can_save = 1;
		snprintf(bs[i]->fingerprint, sizeof bs[i]->fingerprint, "%s", i ? fp1 : "fp-a");
	}
	const token_t *t = conv(1, 1000);
	*saved =
	    router_saved_add_tokens(r, bs[0], "toki-a-1", t, 1000, 1000, 1000 * 1000, 1, SEC(1));
	assert_non_null(*saved);
	snprintf((*saved)->fingerprint, sizeof(*saved)->fingerprint, "%s", "fp-a");
	/* Backend 0's only slot runs another conversation for a while. */
	assert_int_equal(router_slot_commit(r, slot_of(bs[0], 0), conv(2, 500), 500, 0, SEC(1)), 0);
	router_slot_begin(r, slot_of(bs[0], 0), SEC(1), 10.0);
	return r;
}

static void test_saved_restored_on_another_backend(void **state)
{
	struct router_backend *bs[2];
	struct router_saved *e;
	struct route_choice c;
	const token_t *next = conv(1, 1100);

	/* Exact mode, where both servers' tests gave the same bits: the same. */
	struct router *r = saved_on_busy_backend(REUSE_EXACT, 1, "fp-a", bs, &e);
	snprintf(bs[0]->bits, sizeof bs[0]->bits, "bits-a");
	snprintf(bs[1]->bits, sizeof bs[1]->bits, "bits-a");
	snprintf(e->bits, sizeof e->bits, "bits-a");
	assert_int_equal(choose(r, next, 1100, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(bs[1], 0));
	assert_ptr_equal(c.restore, e);
	router_free(r);

	r = saved_on_busy_backend(REUSE_FAST, 1, "fp-a", bs, &e);
	assert_int_equal(choose(r, next, 1100, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(bs[1], 0));
	assert_ptr_equal(c.restore, e);
	assert_string_equal(c.kind, "disk");
	assert_int_equal(c.reuse, 1000);
	/* Restored there, the slot holds it like a state of its own. */
	router_slot_begin(r, c.slot, SEC(2), 0.1);
	assert_int_equal(router_slot_restored(r, c.slot, e, SEC(2)), 0);
	assert_ptr_equal(c.slot->saved, e);
	assert_int_equal(router_slot_commit(r, c.slot, next, 1100, 1000, SEC(3)), 0);
	router_slot_end(r, c.slot, SEC(3));
	assert_int_equal(choose(r, conv(1, 1200), 1200, SEC(4), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(bs[1], 0));
	assert_string_equal(c.kind, "hit");
	router_free(r);

	/* Where it cannot be restored, backend 1 never gets it from disk. */
	struct {
		enum reuse_mode mode;
		int shared;
		const char *fp;
		int failed;
		const char *bits1, *bits_e; /* backend 1's and the state's */
	} no[] = {
	    {REUSE_FAST, 0, "fp-a", 0, "", ""},        /* each server its own folder */
	    {REUSE_FAST, 1, "fp-b", 0, "", ""},        /* another model, build or KV setting */
	    {REUSE_FAST, 1, "", 0, "", ""},            /* not discovered yet */
	    {REUSE_EXACT, 1, "fp-a", 0, "", ""},       /* bits unknown: the machine's */
	    {REUSE_EXACT, 1, "fp-a", 0, "bits-a", ""}, /* the state's unknown */
	    {REUSE_EXACT, 1, "fp-a", 0, "", "bits-a"}, /* backend 1's unknown */
	    {REUSE_EXACT, 1, "fp-a", 0, "bits-b", "bits-a"}, /* another arithmetic */
	    {REUSE_EXACT, 1, "fp-b", 0, "bits-a", "bits-a"}, /* the same bits, another build */
	    {REUSE_FAST, 1, "fp-a", 1, "", ""}, /* a restore of another's state failed there */
	};
	for (size_t k = 0; k < sizeof no / sizeof no[0]; k++) {
		r = saved_on_busy_backend(no[k].mode, no[k].shared, no[k].fp, bs, &e);
		bs[1]->foreign_restore_failed = no[k].failed;
		snprintf(bs[0]->bits, sizeof bs[0]->bits, "%s", no[k].bits_e);
		snprintf(bs[1]->bits, sizeof bs[1]->bits, "%s", no[k].bits1);
		snprintf(e->bits, sizeof e->bits, "%s", no[k].bits_e);
		enum route_status st = choose(r, next, 1100, SEC(2), &c);
		assert_true(st == ROUTE_CHOSEN || st == ROUTE_WAIT);
		assert_false(c.slot == slot_of(bs[1], 0) && c.restore);
		/* Its own backend still restores it (waiting for its slot). */
		if (c.restore) {
			assert_ptr_equal(c.slot, slot_of(bs[0], 0));
			assert_int_equal(st, ROUTE_WAIT);
		}
		router_free(r);
	}

	/* Exact mode: a backend whose bits changed since it saved a state (a
	 * driver, a device) does not restore that state, its own; where its
	 * bits or the state's are unknown, it does, as before bits. */
	const char *own[][2] = {{"bits-b", "bits-a"}, {"bits-a", "bits-a"}, {"", "bits-a"}};
	for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) {
		r = saved_on_busy_backend(REUSE_EXACT, 0, "fp-a", bs, &e);
		router_slot_end(r, slot_of(bs[0], 0), SEC(1)); /* its slot idle again */
		snprintf(bs[0]->bits, sizeof bs[0]->bits, "%s", own[k][0]);
		snprintf(e->bits, sizeof e->bits, "%s", own[k][1]);
		assert_int_equal(choose(r, next, 1100, SEC(2), &c), ROUTE_CHOSEN);
		if (k == 0) {
			assert_null(c.restore);
		} else {
			assert_ptr_equal(c.slot, slot_of(bs[0], 0));
			assert_ptr_equal(c.restore, e);
		}
		router_free(r);
	}
}

/* A sliding-window model (restore_inexact): exact mode restores no state
 * there, its own included (llama-server's restore continues with other
 * logprobs); fast mode does. */
static void test_no_exact_restore_where_inexact(void **state)
{
	for (int exact = 0; exact < 2; exact++) {
		struct router *r = mkrouter(exact ? REUSE_EXACT : REUSE_FAST, 1, 2, UB, NULL);
		struct router_backend *b = r->backends[0];
		b->can_save = 1;
		b->restore_inexact = 1;
		const token_t *t = conv(1, 1000);
		struct router_saved *e = router_saved_add_tokens(r, b, "toki-a-1", t, 1000, 1000,
		                                                 1000 * 1000, 1, SEC(1));
		assert_non_null(e);
		struct route_choice c;
		assert_int_equal(choose(r, conv(1, 1100), 1100, SEC(2), &c), ROUTE_CHOSEN);
		if (exact) {
			assert_null(c.restore);
			assert_string_equal(c.kind, "miss");
		} else {
			assert_ptr_equal(c.restore, e);
			assert_string_equal(c.kind, "disk");
		}
		router_free(r);
	}
}

static void test_many_backends(void **state)
{
	/* More backends than the router's small on-stack table. */
	struct router_backend *bs[20];
	struct router *r = mkrouter(REUSE_FAST, 20, 2, UB, bs);
	struct route_choice c;
	assert_int_equal(router_slot_commit(r, slot_of(bs[17], 1), conv(5, 800), 800, 0, SEC(1)),
	                 0);
	assert_int_equal(choose(r, conv(5, 900), 900, SEC(2), &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot, slot_of(bs[17], 1));
	assert_int_equal(c.matched, 800);
	assert_int_equal(router_choose(r, conv(5, 900), 900, SEC(2), 19, &c), ROUTE_CHOSEN);
	assert_ptr_equal(c.slot->backend, bs[19]);
	router_free(r);
}

/* Exact mode on a message schedule: a conversation's next turn reuses the
 * slot's rows up to its last answer's start, a slot made on another schedule
 * lends only the micro-batches the two share, and a cut after the answer
 * (prompt kept to the generation prompt's start, then a throw-away token)
 * keeps that reuse without a cut on the next request's path. */
static void test_message_schedule(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_EXACT, 1, 1, UB, &b);
	struct router_slot *s = slot_of(b, 0);
	const token_t *t2 = conv(1, 1185);
	size_t turn1[] = {900, 1000}, turn2[] = {900, 1000, 1100, 1180};
	struct route_choice c;
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t2, 1005, turn1, 2, SEC(1), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 0);
	router_slot_begin(r, s, SEC(1), 0);
	assert_int_equal(router_slot_commit_sched(r, s, t2, 1005, turn1, 2, 1005, SEC(2)), 0);
	assert_int_equal(s->aligned, 1005);
	assert_int_equal(s->n_bounds, 2);
	/* The answer's tail is cut: the slot keeps 1000 tokens and junk. */
	assert_int_equal(router_slot_cut(r, s, t2, 1000, -7, SEC(2)), 0);
	router_slot_end(r, s, SEC(2));
	assert_int_equal(s->n_tokens, 1001);
	assert_int_equal(s->aligned, 1000);
	assert_int_equal(s->tokens[1000], -7);

	/* Resend of turn 1: reuses 1000, no cut needed (the junk differs). */
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t2, 1005, turn1, 2, SEC(3), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.matched, 1000);
	assert_int_equal(c.reuse, 1000);
	assert_int_equal(c.must_trim, 0);
	/* Turn 2 (same first 1000 tokens): the same. */
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t2, 1185, turn2, 4, SEC(3), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 1000);
	assert_int_equal(c.must_trim, 0);
	/* The same tokens on llama-server's own schedule (the grid): only the
	 * first full micro-batch is on both. */
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t2, 1185, NULL, 0, SEC(3), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 512);
	assert_int_equal(c.must_trim, 1);
	/* A grid commit over the message-schedule rows trusts none of them. */
	router_slot_begin(r, s, SEC(4), 0);
	assert_int_equal(router_slot_commit(r, s, t2, 1185, 700, SEC(5)), 0);
	router_slot_end(r, s, SEC(5));
	assert_int_equal(s->n_bounds, 0);
	assert_int_equal(s->aligned, 0);
	router_free(r);
}

/* A cut that keeps a slot's rows up to a chunk start (the answer's tail
 * cut keeps the prompt up to its generation prompt) keeps that start: the
 * chunk before it is still closed, so its short tail's micro-batches (448 +
 * 95 rows here, sched_tail_split) still read as computed, not as the grid's
 * 512 + 31. */
static void test_cut_keeps_the_closing_start(void **state)
{
	struct router_backend *b;
	struct router *r = mkrouter(REUSE_EXACT, 1, 1, UB, &b);
	struct router_slot *s = slot_of(b, 0);
	const token_t *t = conv(3, 1200);
	size_t turn1[] = {543}; /* a 543-token chunk, then the generation prompt */
	router_slot_begin(r, s, SEC(1), 0);
	assert_int_equal(router_slot_commit_sched(r, s, t, 546, turn1, 1, 546, SEC(2)), 0);
	assert_int_equal(router_slot_cut(r, s, t, 543, -7, SEC(2)), 0);
	router_slot_end(r, s, SEC(2));
	assert_int_equal(s->aligned, 543);
	assert_int_equal(s->n_bounds, 1);
	assert_int_equal(s->bounds[0], 543);
	struct route_choice c;
	/* The next turn closes the chunk at 543 too: all of it is shared. */
	size_t turn2[] = {543, 700};
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t, 705, turn2, 2, SEC(3), ~0ULL, &c), ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 543);
	/* A request whose chunk from 0 runs past 543 makes [0,512) a
	 * micro-batch, which the slot never computed: nothing is shared. */
	size_t other[] = {1100};
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t, 1105, other, 1, SEC(3), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 0);
	/* Cut inside the tail, at its split: the rows before it are one
	 * micro-batch [0,448), whichever way the chunk reads. */
	router_slot_begin(r, s, SEC(4), 0);
	assert_int_equal(router_slot_cut(r, s, t, 500, -7, SEC(4)), 0);
	router_slot_end(r, s, SEC(4));
	assert_int_equal(s->aligned, 448);
	assert_int_equal(s->n_bounds, 0);
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t, 705, turn2, 2, SEC(5), ~0ULL, &c), ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 448);
	memset(&c, 0, sizeof c);
	assert_int_equal(router_choose_sched(r, t, 1105, other, 1, SEC(5), ~0ULL, &c),
	                 ROUTE_CHOSEN);
	assert_int_equal(c.reuse, 0);
	router_free(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_teardown(test_exact_reuse_table, teardown_seqs),
	    cmocka_unit_test_teardown(test_cut_keeps_the_closing_start, teardown_seqs),
	    cmocka_unit_test_teardown(test_exact_reuse_invariants, teardown_seqs),
	    cmocka_unit_test_teardown(test_mode_names, teardown_seqs),
	    cmocka_unit_test_teardown(test_rates, teardown_seqs),
	    cmocka_unit_test_teardown(test_continuation_hits_fast, teardown_seqs),
	    cmocka_unit_test_teardown(test_continuation_hits_exact, teardown_seqs),
	    cmocka_unit_test_teardown(test_partial_system_prompt, teardown_seqs),
	    cmocka_unit_test_teardown(test_miss_takes_empty_slot, teardown_seqs),
	    cmocka_unit_test_teardown(test_full_evicts_cold, teardown_seqs),
	    cmocka_unit_test_teardown(test_stale_hot_loses_value, teardown_seqs),
	    cmocka_unit_test_teardown(test_finished_conversation_gives_way, teardown_seqs),
	    cmocka_unit_test_teardown(test_new_conversations_keep_slots, teardown_seqs),
	    cmocka_unit_test_teardown(test_turn_after_a_tail_cut_is_a_hit, teardown_seqs),
	    cmocka_unit_test_teardown(test_no_exact_restore_where_inexact, teardown_seqs),
	    cmocka_unit_test_teardown(test_busy_prefers_free, teardown_seqs),
	    cmocka_unit_test_teardown(test_busy_wait_or_go_elsewhere, teardown_seqs),
	    cmocka_unit_test_teardown(test_exact_backend_busy, teardown_seqs),
	    cmocka_unit_test_teardown(test_no_backend, teardown_seqs),
	    cmocka_unit_test_teardown(test_rediscovered_with_other_slot_count, teardown_seqs),
	    cmocka_unit_test_teardown(test_only_backend, teardown_seqs),
	    cmocka_unit_test_teardown(test_backend_down_forgets, teardown_seqs),
	    cmocka_unit_test_teardown(test_set_slots_forgets, teardown_seqs),
	    cmocka_unit_test_teardown(test_commit_aligned, teardown_seqs),
	    cmocka_unit_test_teardown(test_commit_other_grids, teardown_seqs),
	    cmocka_unit_test_teardown(test_commit_hits, teardown_seqs),
	    cmocka_unit_test_teardown(test_must_trim, teardown_seqs),
	    cmocka_unit_test_teardown(test_kept_answer, teardown_seqs),
	    cmocka_unit_test_teardown(test_self_cached_begin_forgets_the_others, teardown_seqs),
	    cmocka_unit_test_teardown(test_shared_kv_exact_keeps_to_the_first_slot, teardown_seqs),
	    cmocka_unit_test_teardown(test_truncate, teardown_seqs),
	    cmocka_unit_test_teardown(test_forget, teardown_seqs),
	    cmocka_unit_test_teardown(test_same_content_two_slots, teardown_seqs),
	    cmocka_unit_test_teardown(test_two_backends_balance, teardown_seqs),
	    cmocka_unit_test_teardown(test_many_backends, teardown_seqs),
	    cmocka_unit_test_teardown(test_saved_restored_on_another_backend, teardown_seqs),
	    cmocka_unit_test_teardown(test_message_schedule, teardown_seqs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
