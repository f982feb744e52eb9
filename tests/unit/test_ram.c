/* Unit tests for exact mode's model of llama-server's RAM cache
 * (src/router/ram.c) and the router's "ram" route (src/router/router.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/ram.h"
#include "router/router.h"

#define UB 64

/* Stream id's tokens: id * 100000 + i, so that two streams share nothing. */
static token_t *seq(int id, size_t n)
{
	token_t *t = malloc((n ? n : 1) * sizeof *t);
	assert_non_null(t);
	for (size_t i = 0; i < n; i++)
		t[i] = (token_t)(id * 100000 + (int)i);
	return t;
}

/* A router in exact mode with one backend of two slots, whose server has a
 * RAM cache. */
static struct router *mkrouter(struct router_backend **out)
{
	struct router *r = router_new(REUSE_EXACT);
	assert_non_null(r);
	struct router_backend *b = router_add_backend(r, "http://b");
	assert_non_null(b);
	assert_int_equal(router_backend_set_slots(r, b, 2, 8192, UB), 0);
	router_backend_set_up(r, b, 1);
	b->ram_cache = 1;
	*out = b;
	return r;
}

/* The slot holds t[0..n) on the grid (rows aligned to n). */
static void hold(struct router *r, struct router_slot *s, const token_t *t, size_t n)
{
	assert_int_equal(router_slot_commit_sched(r, s, t, n, NULL, 0, n, 0), 0);
}

static void test_unrelated_task_caches_the_slot(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 300), *c = seq(2, 300);
	struct router_slot *s = &b->slots[0];
	hold(r, s, a, 300);
	/* A task sharing nothing: the content goes in, nothing better comes out. */
	assert_int_equal(router_ram_task(&b->ram, s, c, 200, 200), 0);
	assert_int_equal(b->ram.n_states, 1);
	const struct router_ram_state *e = TAILQ_FIRST(&b->ram.states);
	assert_int_equal(e->n, 300);
	assert_int_equal(e->size, 300);
	assert_int_equal(e->aligned, 300);
	assert_memory_equal(e->tokens, a, 300 * sizeof *a);
	/* The slot now holds c; a cut of a's conversation to 256 loads a. */
	hold(r, s, c, 200);
	assert_ptr_equal(router_ram_would_load(&b->ram, s, 0, a, 300, 256), e);
	assert_int_equal(router_ram_task(&b->ram, s, a, 256, 257), 1);
	/* a came out; c went in. */
	assert_int_equal(b->ram.n_states, 1);
	assert_memory_equal(TAILQ_FIRST(&b->ram.states)->tokens, c, 200 * sizeof *c);
	router_free(r);
	free(a);
	free(c);
}

static void test_a_task_that_keeps_half_caches_nothing(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 400);
	struct router_slot *s = &b->slots[0];
	hold(r, s, a, 200);
	/* Keeps 100 of 200 (half), and 100 of 400 is over a tenth of the task. */
	token_t *a2 = seq(1, 400);
	a2[100] = -1;
	assert_int_equal(router_ram_task(&b->ram, s, a2, 400, 400), 0);
	assert_int_equal(b->ram.n_states, 0);
	/* Keeps 99 of 200: under half, cached. */
	a2[99] = -1;
	assert_int_equal(router_ram_task(&b->ram, s, a2, 400, 400), 0);
	assert_int_equal(b->ram.n_states, 1);
	router_free(r);
	free(a);
	free(a2);
}

static void test_a_small_share_of_the_task_caches_the_slot(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 1000);
	struct router_slot *s = &b->slots[0];
	hold(r, s, a, 70);
	/* All 70 kept, but 70 of 1000 is at most a tenth of the task: the
	 * server counts the slot as kept by nothing, and caches it. */
	assert_int_equal(router_ram_task(&b->ram, s, a, 1000, 1000), 0);
	assert_int_equal(b->ram.n_states, 1);
	/* 70 of 699 is over a tenth: not cached. */
	router_ram_clear(&b->ram);
	assert_int_equal(router_ram_task(&b->ram, s, a, 699, 699), 0);
	assert_int_equal(b->ram.n_states, 0);
	router_free(r);
	free(a);
}

static void test_an_answer_counts_in_the_slot(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 100);
	struct router_slot *s = &b->slots[0];
	hold(r, s, a, 100);
	s->generated = 300; /* an answer of 300 tokens, before its tail cut */
	/* The tail cut keeps 97 of the server's 400: under half, cached. */
	assert_int_equal(router_ram_task(&b->ram, s, a, 97, 98), 0);
	assert_int_equal(b->ram.n_states, 1);
	assert_int_equal(TAILQ_FIRST(&b->ram.states)->size, 400);
	assert_int_equal(TAILQ_FIRST(&b->ram.states)->n, 100);
	router_free(r);
	free(a);
}

static void test_empty_slot_and_small_shares(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 400), *c = seq(2, 400);
	struct router_slot *s0 = &b->slots[0], *s1 = &b->slots[1];
	hold(r, s0, a, 400);
	assert_int_equal(router_ram_task(&b->ram, s0, c, 400, 400), 0); /* a cached */
	/* An empty slot never loads. */
	assert_null(router_ram_would_load(&b->ram, s1, 0, a, 400, 320));
	assert_int_equal(router_ram_task(&b->ram, s1, a, 320, 321), 0);
	assert_int_equal(b->ram.n_states, 1);
	/* A state kept to less than a quarter of itself is not loaded. */
	hold(r, s0, c, 400);
	assert_null(router_ram_would_load(&b->ram, s0, 0, a, 400, 99));
	assert_non_null(router_ram_would_load(&b->ram, s0, 0, a, 400, 100));
	router_free(r);
	free(a);
	free(c);
}

static void test_a_longer_state_replaces_what_it_contains(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *a = seq(1, 600), *c = seq(2, 600);
	struct router_slot *s = &b->slots[0];
	hold(r, s, a, 200);
	assert_int_equal(router_ram_task(&b->ram, s, c, 300, 300), 0);
	hold(r, s, a, 500);
	assert_int_equal(router_ram_task(&b->ram, s, c, 300, 300), 0);
	/* a[0..200) is contained in a[0..500): one state, the longer. */
	assert_int_equal(b->ram.n_states, 1);
	assert_int_equal(TAILQ_FIRST(&b->ram.states)->n, 500);
	/* As many states as counted on, no more: the oldest go. */
	for (int i = 0; i < ROUTER_RAM_MAX_STATES + 8; i++) {
		token_t *t = seq(10 + i, 64);
		hold(r, s, t, 64);
		assert_int_equal(router_ram_task(&b->ram, s, c, 300, 300), 0);
		free(t);
	}
	assert_int_equal(b->ram.n_states, ROUTER_RAM_MAX_STATES);
	router_free(r);
	free(a);
	free(c);
}

static void test_router_takes_the_ram_route(void **state)
{
	(void)state;
	struct router_backend *b;
	struct router *r = mkrouter(&b);
	token_t *x = seq(1, 700), *y = seq(2, 600), *z = seq(3, 500);
	struct router_slot *s0 = &b->slots[0], *s1 = &b->slots[1];
	/* x ran on slot 0 (its rows to 640 on the grid), then y took slot 0 and
	 * z slot 1: x is in the server's RAM. */
	assert_int_equal(router_slot_commit_sched(r, s0, x, 650, NULL, 0, 640, 0), 0);
	assert_int_equal(router_ram_task(&b->ram, s0, y, 600, 600), 0);
	hold(r, s0, y, 600);
	hold(r, s1, z, 500);
	/* x's next turn: reuse 640 from RAM through a cut on a slot that holds
	 * something else. */
	struct route_choice ch;
	assert_int_equal(router_choose_sched(r, x, 700, NULL, 0, 1000000, ~(uint64_t)0, &ch),
	                 ROUTE_CHOSEN);
	assert_string_equal(ch.kind, "ram");
	assert_true(ch.from_ram);
	assert_true(ch.must_trim);
	assert_int_equal(ch.reuse, 640);
	assert_int_equal(ch.matched, 650);
	assert_null(ch.restore);
	/* The cut loads it; the slot then holds x's rows on the request's
	 * schedule. */
	assert_int_equal(router_ram_task(&b->ram, ch.slot, x, 640, 641), 1);
	assert_int_equal(router_slot_loaded(r, ch.slot, x, 640, -7, NULL, 0, 2000000), 0);
	assert_int_equal(ch.slot->n_tokens, 641);
	assert_int_equal(ch.slot->aligned, 640);
	assert_true(ch.slot->junk_tail);
	/* Not with slot files (they serve instead), nor on a sliding-window
	 * model, nor in fast mode, nor after loads kept missing. */
	assert_int_equal(router_ram_task(&b->ram, ch.slot, y, 600, 600), 0); /* x back in RAM */
	hold(r, ch.slot, y, 600);
	int *flags[] = {&b->can_save, &b->restore_inexact};
	for (size_t i = 0; i < 2; i++) {
		*flags[i] = 1;
		assert_int_equal(
		    router_choose_sched(r, x, 700, NULL, 0, 3000000, ~(uint64_t)0, &ch),
		    ROUTE_CHOSEN);
		assert_string_not_equal(ch.kind, "ram");
		*flags[i] = 0;
	}
	b->ram.misses = 3;
	assert_false(router_ram_active(r, b));
	b->ram.misses = 0;
	assert_int_equal(router_choose_sched(r, x, 700, NULL, 0, 3000000, ~(uint64_t)0, &ch),
	                 ROUTE_CHOSEN);
	assert_string_equal(ch.kind, "ram");
	/* A restart of the server empties its RAM. */
	router_backend_set_up(r, b, 0);
	assert_int_equal(b->ram.n_states, 0);
	router_free(r);
	free(x);
	free(y);
	free(z);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_unrelated_task_caches_the_slot),
	    cmocka_unit_test(test_a_task_that_keeps_half_caches_nothing),
	    cmocka_unit_test(test_a_small_share_of_the_task_caches_the_slot),
	    cmocka_unit_test(test_an_answer_counts_in_the_slot),
	    cmocka_unit_test(test_empty_slot_and_small_shares),
	    cmocka_unit_test(test_a_longer_state_replaces_what_it_contains),
	    cmocka_unit_test(test_router_takes_the_ram_route),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
