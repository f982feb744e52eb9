/* Unit tests for evaluation schedules (src/router/sched.c): which cached
 * rows exact mode may reuse, how small chunks merge, and the plans. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/sched.h"

#define N(a) (sizeof(a) / sizeof *(a))

/* The grid (no chunk starts) is llama-server's own schedule: full
 * micro-batches from 0 are shared; the last partial one is not. */
static void test_grid(void **state)
{
	/* A 1,117-token prompt cached; a longer one reuses 1,024 at -ub 512. */
	assert_int_equal(sched_common(NULL, 0, 1117, NULL, 0, 1500, 1117, 512), 1024);
	/* The same prompt again: at least one token is evaluated (limit n-1). */
	assert_int_equal(sched_common(NULL, 0, 1117, NULL, 0, 1117, 1116, 512), 1024);
	/* Under one micro-batch: nothing. */
	assert_int_equal(sched_common(NULL, 0, 300, NULL, 0, 400, 300, 512), 0);
	/* A match shorter than the rows computed bounds the reuse. */
	assert_int_equal(sched_common(NULL, 0, 2048, NULL, 0, 3000, 1600, 512), 1536);
}

/* Chunks that end where messages start: a resend evaluates only the last
 * chunk; the next turn reuses every chunk up to the previous answer. */
static void test_message_chunks(void **state)
{
	size_t turn1[] = {900, 1000}; /* system | user | generation prompt (1000..1005) */
	/* Resend: the generation prompt's start is shared, its own micro-batch
	 * [1000,1005) cannot be (limit 1004). */
	assert_int_equal(sched_common(turn1, N(turn1), 1005, turn1, N(turn1), 1005, 1004, 512),
	                 1000);
	/* Next turn: the answer (from 1000) now runs to 1100, then a user
	 * message, then the generation prompt. The rows up to 1000 are shared;
	 * the old [1000,1005) micro-batch is not (the new chunk is longer). */
	size_t turn2[] = {900, 1000, 1100, 1180};
	assert_int_equal(sched_common(turn1, N(turn1), 1005, turn2, N(turn2), 1185, 1184, 512),
	                 1000);
	/* A schedule with a chunk start the other lacks stops there. */
	size_t other[] = {950, 1000};
	assert_int_equal(sched_common(turn1, N(turn1), 1005, other, N(other), 1005, 1004, 512),
	                 512);
	/* Long chunks are split into micro-batches from their own start. */
	size_t a[] = {100};
	size_t b[] = {100, 2000};
	assert_int_equal(sched_common(a, 1, 1500, b, 2, 2100, 2099, 512), 1124);
	/* ...and the grid's micro-batches are not those. */
	assert_int_equal(sched_common(NULL, 0, 1500, b, 2, 2100, 2099, 512), 0);
}

/* The result never depends on which side is the request. */
static void test_symmetric(void **state)
{
	size_t a[] = {64, 200, 333, 900}, b[] = {64, 200, 400, 900};
	for (size_t lim = 0; lim < 1200; lim += 37)
		assert_int_equal(sched_common(a, 4, 1000, b, 4, 1100, lim, 128),
		                 sched_common(b, 4, 1100, a, 4, 1000, lim, 128));
}

static void test_floor(void **state)
{
	size_t b[] = {900, 1000};
	/* The micro-batch holding token 1004 starts at 1000. */
	assert_int_equal(sched_floor(b, 2, 1005, 1004, 512), 1000);
	assert_int_equal(sched_floor(b, 2, 1005, 1005, 512), 1005);
	assert_int_equal(sched_floor(b, 2, 1005, 950, 512), 900);
	assert_int_equal(sched_floor(b, 2, 1005, 600, 512), 512);
	assert_int_equal(sched_floor(NULL, 0, 1117, 1100, 512), 1024);
	assert_int_equal(sched_floor(NULL, 0, 1117, 10, 512), 0);
}

/* The rule is left to right and content-defined: a longer prompt with the
 * same beginning keeps the same starts there. */
static void test_chunks_left_to_right(void **state)
{
	size_t *s = malloc(6 * sizeof *s);
	assert_non_null(s);
	size_t s0[] = {30, 50, 120, 130, 200, 205};
	memcpy(s, s0, sizeof s0);
	unsigned char pin[] = {0, 0, 0, 1, 0, 1};
	size_t n = sched_chunks(&s, pin, N(s0));
	size_t want[] = {128, 130, 205}; /* 130 splits at 128 */
	assert_int_equal(n, N(want));
	assert_memory_equal(s, want, sizeof want);
	free(s);

	/* The same starts, extended: the kept ones up to 205 are the same. */
	size_t *t = malloc(9 * sizeof *t);
	assert_non_null(t);
	size_t t0[] = {30, 50, 120, 130, 200, 205, 230, 400, 410};
	memcpy(t, t0, sizeof t0);
	unsigned char tp[] = {0, 0, 0, 1, 0, 1, 0, 0, 1};
	size_t m = sched_chunks(&t, tp, N(t0));
	assert_int_equal(m, 4);
	assert_memory_equal(t, want, sizeof want);
	assert_int_equal(t[3], 410);
	free(t);

	/* Starts that do not increase are dropped. */
	size_t *v = malloc(4 * sizeof *v);
	assert_non_null(v);
	size_t v0[] = {100, 100, 90, 300};
	memcpy(v, v0, sizeof v0);
	unsigned char vp[] = {1, 1, 1, 1};
	assert_int_equal(sched_chunks(&v, vp, N(v0)), 2);
	assert_int_equal(v[0], 100);
	assert_int_equal(v[1], 300);
	free(v);
}

static void test_split_first(void **state)
{
	/* The first chunk [0, 300) gains starts at 128 and 256. */
	size_t b[8] = {300, 400, 1000};
	assert_int_equal(sched_split_first(b, 3, 8, 128), 5);
	size_t want[] = {128, 256, 300, 400, 1000};
	for (size_t i = 0; i < N(want); i++)
		assert_int_equal(b[i], want[i]);
	/* A first chunk of exactly one step, or shorter, is left alone; so is
	 * the grid (no starts). */
	size_t c[4] = {128, 500};
	assert_int_equal(sched_split_first(c, 2, 4, 128), 2);
	assert_int_equal(c[0], 128);
	size_t g[2] = {0};
	assert_int_equal(sched_split_first(g, 0, 2, 128), 0);
	/* No room: as many as fit. */
	size_t d[3] = {1000};
	assert_int_equal(sched_split_first(d, 1, 3, 128), 3);
	assert_int_equal(d[0], 128);
	assert_int_equal(d[1], 256);
	assert_int_equal(d[2], 1000);
}

/* Two prompts that share a long first message up to a point inside it get
 * the same starts up to there: what exact mode may reuse between them. */
static void test_chunks_share_inside_the_first_message(void **state)
{
	size_t *a = malloc(3 * sizeof *a), *b = malloc(3 * sizeof *b);
	assert_non_null(a);
	assert_non_null(b);
	a[0] = 1015, a[1] = 1100, a[2] = 1180; /* system ends at 1015 */
	b[0] = 1090, b[1] = 1200, b[2] = 1290; /* a longer system message */
	unsigned char pa[3] = {0, 1, 1}, pb[3] = {0, 1, 1};
	size_t na = sched_chunks(&a, pa, 3), nb = sched_chunks(&b, pb, 3);
	assert_int_equal(na, 7 + 3);
	assert_int_equal(nb, 8 + 3);
	for (size_t i = 0; i < 7; i++) {
		assert_int_equal(a[i], (i + 1) * SCHED_FIRST_STEP);
		assert_int_equal(b[i], a[i]);
	}
	/* What they share is whole micro-batches up to 896 (7 x 128), not 512. */
	assert_int_equal(sched_common(a, na, 1185, b, nb, 1295, 1015, 512), 896);
	free(a);
	free(b);
	/* A first message under SCHED_MIN_CHUNK is no start, and nothing is
	 * split; user turns and tool outputs are no starts; assistant starts
	 * and the generation prompt are, however short (a first start that is
	 * the generation prompt too). */
	size_t *c = malloc(5 * sizeof *c);
	assert_non_null(c);
	c[0] = 10, c[1] = 40, c[2] = 300, c[3] = 310, c[4] = 900;
	unsigned char pc[5] = {0, 1, 0, 1, 1};
	assert_int_equal(sched_chunks(&c, pc, 5), 3);
	assert_int_equal(c[0], 40);
	assert_int_equal(c[1], 310);
	assert_int_equal(c[2], 900);
	free(c);
	size_t *h = malloc(sizeof *h);
	assert_non_null(h);
	h[0] = 7;
	unsigned char ph[1] = {1};
	assert_int_equal(sched_chunks(&h, ph, 1), 1);
	assert_int_equal(h[0], 7);
	free(h);
}

static void test_plan(void **state)
{
	size_t b[] = {900, 1000, 1100, 1180};
	struct plan p;
	/* Reuse 1000 after a cut: prefill to 1100 and 1180, then generate. */
	assert_int_equal(plan_build(&p, b, N(b), 1185, 1000, 0, 0, 1, 2048), 0);
	assert_int_equal(p.n, 4);
	assert_int_equal(p.steps[0].kind, STEP_CUT);
	assert_int_equal(p.steps[0].upto, 1000);
	assert_int_equal(p.steps[1].kind, STEP_PREFILL);
	assert_int_equal(p.steps[1].upto, 1100);
	assert_int_equal(p.steps[2].kind, STEP_PREFILL);
	assert_int_equal(p.steps[2].upto, 1180);
	assert_int_equal(p.steps[3].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 1180);
	assert_int_equal(p.reuse, 1000);
	plan_free(&p);

	/* Save, restore, everything reused but the last chunk. */
	assert_int_equal(plan_build(&p, b, N(b), 1185, 1180, 1, 1, 0, 2048), 0);
	assert_int_equal(p.n, 3);
	assert_int_equal(p.steps[0].kind, STEP_SAVE);
	assert_int_equal(p.steps[1].kind, STEP_RESTORE);
	assert_int_equal(p.steps[2].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 1180);
	plan_free(&p);

	/* Fast mode (no starts): one step. */
	assert_int_equal(plan_build(&p, NULL, 0, 500, 0, 0, 0, 0, 0), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.steps[0].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 0);
	plan_free(&p);

	/* Long chunks are evaluated max_step at a time from where the
	 * evaluation resumes (reuse 128, on the micro-batch grid of the chunk
	 * from 0): 128+512, +512, then the chunk's end; the second chunk from
	 * its own start. */
	size_t c[] = {1500, 2100};
	assert_int_equal(plan_build(&p, c, N(c), 2110, 128, 0, 0, 0, 512), 0);
	assert_int_equal(p.n, 6);
	size_t want[] = {640, 1152, 1500, 2012, 2100};
	for (size_t i = 0; i < N(want); i++) {
		assert_int_equal(p.steps[i].kind, STEP_PREFILL);
		assert_int_equal(p.steps[i].upto, want[i]);
	}
	assert_int_equal(p.steps[5].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 2100);
	plan_free(&p);

	/* Exactly max_step to go is one step; 0 is no limit. */
	assert_int_equal(plan_build(&p, c, 1, 1600, 988, 0, 0, 0, 512), 0);
	assert_int_equal(p.n, 2);
	plan_free(&p);
	assert_int_equal(plan_build(&p, c, N(c), 2110, 0, 0, 0, 0, 0), 0);
	assert_int_equal(p.n, 3);
	plan_free(&p);

	/* The step size: llama-server's default batch in whole micro-batches. */
	assert_int_equal(sched_max_step(512), 2048);
	assert_int_equal(sched_max_step(100), 2000);
	assert_int_equal(sched_max_step(4096), 4096);
	plan_free(&p); /* twice is harmless */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_grid),
	    cmocka_unit_test(test_message_chunks),
	    cmocka_unit_test(test_symmetric),
	    cmocka_unit_test(test_floor),
	    cmocka_unit_test(test_chunks_left_to_right),
	    cmocka_unit_test(test_plan),
	    cmocka_unit_test(test_split_first),
	    cmocka_unit_test(test_chunks_share_inside_the_first_message),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
