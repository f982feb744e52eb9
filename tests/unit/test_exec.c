/* Unit tests for the executor's decisions (src/serve/exec.c): the step
 * table, and the cancel matrix (what a request's slot keeps when its client
 * leaves, by the step it is in and the mode). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "serve/exec.h"
#include "serve/req.h"

static void test_every_step_has_a_row(void **state)
{
	for (int s = 0; s < RS_COUNT; s++) {
		assert_string_not_equal(exec_step_name(s), "?");
		for (int t = 0; t < s; t++)
			assert_string_not_equal(exec_step_name(s), exec_step_name(t));
	}
	assert_string_equal(exec_step_name(RS_COUNT), "?");
	assert_string_equal(exec_step_name(-1), "?");
	/* The plan's steps start from the table; the others are started by the
	 * prompt's making and the answer's end. */
	int startable[RS_COUNT] = {
	    [RS_SAVE] = 1, [RS_RESTORE] = 1, [RS_CUT] = 1, [RS_PREFILL] = 1, [RS_GENERATE] = 1};
	for (int s = 0; s < RS_COUNT; s++)
		assert_int_equal(exec_step_startable(s), startable[s]);
}

static struct cancel_case base(int step, int exact)
{
	return (struct cancel_case){
	    .step = step,
	    .exact = exact,
	    .routable = 1,
	    .slot_live = 1,
	    .call_out = 1,
	    .n_tokens = 1000,
	    .reuse = 300,
	    .done_upto = 512,
	};
}

static enum cancel_action act(struct cancel_case c, size_t *keep, size_t *reused)
{
	return exec_cancel_action(&c, keep, reused);
}

static void test_steps_with_nothing_to_keep(void **state)
{
	static const int none[] = {RS_TEMPLATE, RS_TOKENIZE, RS_WAITING, RS_SAVE,
	                           RS_RESTORE,  RS_SETTLE,   RS_TAILCUT, RS_DONE};
	size_t keep = 7, reused = 7;
	for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
		for (int exact = 0; exact < 2; exact++) {
			assert_int_equal(act(base(none[i], exact), &keep, &reused), CANCEL_END);
			assert_int_equal(keep, 0);
		}
}

static void test_untrusted_slots_keep_nothing(void **state)
{
	size_t keep, reused;
	struct cancel_case c = base(RS_GENERATE, 1);
	c.routable = 0;
	assert_int_equal(act(c, &keep, &reused), CANCEL_END);
	c = base(RS_GENERATE, 0);
	c.slot_live = 0; /* no slot, or a retired one */
	assert_int_equal(act(c, &keep, &reused), CANCEL_END);
	c = base(RS_PREFILL, 1);
	c.replanning = 1; /* the slot was forgotten for the replan */
	assert_int_equal(act(c, &keep, &reused), CANCEL_END);
}

static void test_exact_prefill_runs_on(void **state)
{
	size_t keep, reused;
	assert_int_equal(act(base(RS_PREFILL, 1), &keep, &reused), CANCEL_LET_STEP_END);
	/* No call out (between steps): what the steps reached. */
	struct cancel_case c = base(RS_PREFILL, 1);
	c.call_out = 0;
	assert_int_equal(act(c, &keep, &reused), CANCEL_KEEP);
	assert_int_equal(keep, 512);
	assert_int_equal(reused, 512);
	/* Fast mode does not wait for a step. */
	assert_int_equal(act(base(RS_PREFILL, 0), &keep, &reused), CANCEL_KEEP);
	assert_int_equal(keep, 512);
	assert_int_equal(reused, 300);
}

static void test_cut_keeps_the_reuse(void **state)
{
	size_t keep, reused;
	/* Exact: a cut in flight may or may not have run; the reuse is there. */
	assert_int_equal(act(base(RS_CUT, 1), &keep, &reused), CANCEL_KEEP);
	assert_int_equal(keep, 300);
	/* Fast: at least what it reused, or what the steps reached. */
	assert_int_equal(act(base(RS_CUT, 0), &keep, &reused), CANCEL_KEEP);
	assert_int_equal(keep, 512);
	assert_int_equal(reused, 300);
	struct cancel_case c = base(RS_CUT, 0);
	c.done_upto = 0;
	act(c, &keep, &reused);
	assert_int_equal(keep, 300);
	assert_int_equal(reused, 300);
}

static void test_generate_keeps_what_was_reached(void **state)
{
	size_t keep, reused;
	for (int exact = 0; exact < 2; exact++) {
		/* A token came: the whole prompt is in the slot. */
		struct cancel_case c = base(RS_GENERATE, exact);
		c.gen_started = 1;
		assert_int_equal(act(c, &keep, &reused), CANCEL_KEEP);
		assert_int_equal(keep, 1000);
		assert_int_equal(reused, exact ? 1000 : 300);
		/* Before: the last chunk end reached (exact), at least the reuse
		 * (fast). */
		c.gen_started = 0;
		c.done_upto = 200;
		act(c, &keep, &reused);
		assert_int_equal(keep, exact ? 200 : 300);
		assert_int_equal(reused, exact ? 200 : 300);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_every_step_has_a_row),
	    cmocka_unit_test(test_steps_with_nothing_to_keep),
	    cmocka_unit_test(test_untrusted_slots_keep_nothing),
	    cmocka_unit_test(test_exact_prefill_runs_on),
	    cmocka_unit_test(test_cut_keeps_the_reuse),
	    cmocka_unit_test(test_generate_keeps_what_was_reached),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
