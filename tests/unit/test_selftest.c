/* Unit tests for exact mode's self-test, the parts that do no I/O
 * (src/backend/selftest.c): the requests it sends, the cache_n each step must
 * report, the comparison of the two answers, and the verdicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/selftest.h"

static int32_t toks[SELFTEST_TOKENS];

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i < SELFTEST_TOKENS; i++)
		toks[i] = 1000 + i;
	return 0;
}

static json_t *prompt_of(json_t *req)
{
	json_t *p = json_object_get(req, "prompt");
	assert_true(json_is_array(p));
	return p;
}

static void test_history_then_reversed(void **state)
{
	(void)state;
	json_t *a = selftest_request(toks, 0, 0, 3);
	json_t *b = selftest_request(toks, 1, 0, 3);
	assert_int_equal(json_array_size(prompt_of(a)), SELFTEST_HISTORY);
	assert_int_equal(json_array_size(prompt_of(b)), SELFTEST_HISTORY);
	for (int i = 0; i < SELFTEST_HISTORY; i++) {
		assert_int_equal(json_integer_value(json_array_get(prompt_of(a), (size_t)i)),
		                 1000 + i);
		assert_int_equal(json_integer_value(json_array_get(prompt_of(b), (size_t)i)),
		                 1000 + SELFTEST_HISTORY - 1 - i);
	}
	/* From an empty slot, nothing generated. */
	assert_true(json_is_false(json_object_get(a, "cache_prompt")));
	assert_int_equal(json_integer_value(json_object_get(a, "n_predict")), 0);
	assert_int_equal(json_integer_value(json_object_get(a, "id_slot")), 3);
	json_decref(a);
	json_decref(b);
	/* Runs 2 and 3 (one slot, after runs 0 and 1 differed on two): the
	 * histories of runs 1 and 0, so that run 3 repeats run 0 there. */
	json_t *c = selftest_request(toks, 2, 0, 0);
	json_t *d = selftest_request(toks, 3, 0, 0);
	json_t *a0 = selftest_request(toks, 0, 0, 0);
	json_t *b0 = selftest_request(toks, 1, 0, 0);
	assert_true(json_equal(c, b0));
	assert_true(json_equal(d, a0));
	json_decref(c);
	json_decref(d);
	json_decref(a0);
	json_decref(b0);
}

/* The tiny prompt that replaces run 0's slot in the middle of run 1: fresh,
 * on that slot, nothing generated, and nothing run 1 holds at its start (the
 * prompt's first tokens). */
static void test_insert_request(void **state)
{
	(void)state;
	json_t *r = selftest_insert_request(toks, 2);
	json_t *p = prompt_of(r);
	assert_true(json_array_size(p) > 0 && json_array_size(p) < 64);
	assert_int_not_equal(json_integer_value(json_array_get(p, 0)), 1000 + SELFTEST_HISTORY);
	assert_true(json_is_false(json_object_get(r, "cache_prompt")));
	assert_int_equal(json_integer_value(json_object_get(r, "n_predict")), 0);
	assert_int_equal(json_integer_value(json_object_get(r, "id_slot")), 2);
	json_decref(r);
}

static void test_steps_grow_the_same_prompt(void **state)
{
	(void)state;
	int before = 0;
	for (int step = 1; step <= SELFTEST_STEPS; step++) {
		json_t *r0 = selftest_request(toks, 0, step, 1);
		json_t *r1 = selftest_request(toks, 1, step, 1);
		/* Both runs send the same prompt: only the history differs. */
		assert_true(json_equal(r0, r1));
		json_t *p = prompt_of(r0);
		int n = (int)json_array_size(p);
		assert_int_equal(n, selftest_step_ends[step - 1]);
		assert_true(n > before);
		assert_int_equal(json_integer_value(json_array_get(p, 0)), 1000 + SELFTEST_HISTORY);
		/* The first step from an empty slot, each later one on the one
		 * before, which is what the slot then holds. */
		assert_int_equal(json_is_true(json_object_get(r0, "cache_prompt")), step >= 2);
		assert_int_equal(selftest_expected_cache(step), before);
		int last = step == SELFTEST_STEPS;
		assert_int_equal(json_integer_value(json_object_get(r0, "n_predict")), last);
		assert_int_equal(json_integer_value(json_object_get(r0, "n_probs")), last ? 10 : 0);
		before = n;
		json_decref(r0);
		json_decref(r1);
	}
	assert_int_equal(before, SELFTEST_PROMPT);
	assert_int_equal(selftest_expected_cache(0), 0);
}

static void test_step_sizes_leave_partial_tiles(void **state)
{
	(void)state;
	/* Each step but the last is one micro-batch at -ub 512 that is longer
	 * than a 64-column tile and not a multiple of 8: the sizes whose
	 * products ggml-vulkan got wrong on lavapipe (docs/exact.md). */
	int from = 0;
	for (int i = 0; i < SELFTEST_STEPS - 1; i++) {
		int n = selftest_step_ends[i] - from;
		assert_true(n > 64 && n < 512);
		assert_true(n % 8 != 0);
		from = selftest_step_ends[i];
	}
}

static json_t *answer(double lp0, double lp1, int id)
{
	json_t *a = json_loads("[{\"id\":5,\"token\":\"a\",\"logprob\":-0.5,\"top_logprobs\":"
	                       "[{\"id\":5,\"token\":\"a\",\"logprob\":-0.5},"
	                       "{\"id\":7,\"token\":\"b\",\"logprob\":-1.25}]}]",
	                       0, NULL);
	json_t *top = json_object_get(json_array_get(a, 0), "top_logprobs");
	json_object_set_new(json_array_get(top, 0), "logprob", json_real(lp0));
	json_object_set_new(json_array_get(top, 1), "logprob", json_real(lp1));
	json_object_set_new(json_array_get(top, 1), "id", json_integer(id));
	return a;
}

static void test_compare_same_bits(void **state)
{
	(void)state;
	json_t *a = answer(-0.5, -1.25, 7), *b = answer(-0.5, -1.25, 7);
	char why[300] = "";
	assert_int_equal(selftest_compare(a, b, why, sizeof why), 0);
	json_decref(a);
	json_decref(b);
}

static void test_compare_last_bit(void **state)
{
	(void)state;
	/* One ulp apart: a difference no tolerance may hide. */
	double x = -1.25, y = -1.2500000000000002;
	json_t *a = answer(-0.5, x, 7), *b = answer(-0.5, y, 7);
	char why[300] = "";
	assert_int_equal(selftest_compare(a, b, why, sizeof why), 1);
	assert_non_null(strstr(why, "[0].top_logprobs[1].logprob"));
	assert_non_null(strstr(why, "-1.25 after one earlier prompt"));
	assert_non_null(strstr(why, "-1.2500000000000002 after another"));
	json_decref(a);
	json_decref(b);
}

/* The bits two servers compare before one restores the other's states:
 * the same answers give the same hash, one ulp or the steps check's answer
 * another. */
static void test_bits(void **state)
{
	(void)state;
	json_t *a = answer(-0.5, -1.25, 7), *b = answer(-0.5, -1.25, 7);
	json_t *ulp = answer(-0.5, -1.2500000000000002, 7), *g = answer(-0.25, -2.0, 9);
	char ha[65], hb[65], hu[65], hg[65];
	assert_int_equal(selftest_bits(a, NULL, ha), 0);
	assert_int_equal(selftest_bits(b, NULL, hb), 0);
	assert_int_equal(strlen(ha), 64);
	assert_string_equal(ha, hb);
	assert_int_equal(selftest_bits(ulp, NULL, hu), 0);
	assert_string_not_equal(ha, hu);
	assert_int_equal(selftest_bits(a, g, hg), 0);
	assert_string_not_equal(ha, hg);
	assert_int_equal(selftest_bits(b, g, hb), 0);
	assert_string_equal(hg, hb);
	json_decref(a);
	json_decref(b);
	json_decref(ulp);
	json_decref(g);
}

static void test_compare_other_token(void **state)
{
	(void)state;
	json_t *a = answer(-0.5, -1.25, 7), *b = answer(-0.5, -1.25, 9);
	char why[300] = "";
	assert_int_equal(selftest_compare(a, b, why, sizeof why), 1);
	assert_non_null(strstr(why, "[0].top_logprobs[1].id 7"));
	json_decref(a);
	json_decref(b);
	/* And a shorter answer is a difference too. */
	a = json_loads("[{\"id\":1},{\"id\":2}]", 0, NULL);
	b = json_loads("[{\"id\":1}]", 0, NULL);
	assert_int_equal(selftest_compare(a, b, why, sizeof why), 1);
	json_decref(a);
	json_decref(b);
}

/* The steps check: the generation, then the next request on what it left;
 * from an empty slot the prompt, each generated token but the last alone,
 * and the same next request. Each request reuses exactly what the one
 * before left in the slot. */
static void test_steps_check(void **state)
{
	(void)state;
	json_t *gen = json_array();
	for (int i = 0; i < SELFTEST_GEN; i++)
		json_array_append_new(gen, json_integer(7 + i));
	assert_null(selftest_gen_request(toks, NULL, 1, 0)); /* nothing generated yet */
	json_t *g = selftest_gen_request(toks, NULL, 0, 2);
	assert_int_equal(json_array_size(prompt_of(g)), SELFTEST_GEN_PROMPT);
	assert_int_equal(json_integer_value(json_object_get(g, "n_predict")), SELFTEST_GEN);
	assert_true(json_is_true(json_object_get(g, "ignore_eos")));
	assert_true(json_is_false(json_object_get(g, "cache_prompt")));
	assert_int_equal(json_integer_value(json_object_get(g, "id_slot")), 2);
	assert_int_equal(selftest_gen_expected_cache(0), 0);
	json_decref(g);
	int last = SELFTEST_GEN + 2;
	size_t next = SELFTEST_GEN_PROMPT + SELFTEST_GEN - 1 + SELFTEST_GEN_NEXT;
	json_t *hot = selftest_gen_request(toks, gen, 1, 2);
	json_t *step = selftest_gen_request(toks, gen, last, 2);
	assert_int_equal(json_array_size(prompt_of(hot)), next);
	assert_true(json_equal(prompt_of(hot), prompt_of(step)));
	assert_int_equal(json_integer_value(json_object_get(hot, "n_probs")), 10);
	assert_int_equal(json_integer_value(json_array_get(prompt_of(hot), SELFTEST_GEN_PROMPT)),
	                 7);
	/* The generated tokens but the last, then the next ones. */
	assert_int_equal(json_integer_value(json_array_get(prompt_of(hot),
	                                                   SELFTEST_GEN_PROMPT + SELFTEST_GEN - 1)),
	                 toks[0]);
	assert_int_equal(selftest_gen_expected_cache(1), SELFTEST_GEN_PROMPT + SELFTEST_GEN - 1);
	assert_int_equal(selftest_gen_expected_cache(last), SELFTEST_GEN_PROMPT + SELFTEST_GEN - 1);
	json_decref(hot);
	json_decref(step);
	json_t *cold = selftest_gen_request(toks, gen, 2, 2);
	assert_true(json_is_false(json_object_get(cold, "cache_prompt")));
	assert_int_equal(json_array_size(prompt_of(cold)), SELFTEST_GEN_PROMPT);
	json_decref(cold);
	for (int w = 3; w < last; w++) {
		json_t *one = selftest_gen_request(toks, gen, w, 2);
		assert_int_equal(json_array_size(prompt_of(one)), SELFTEST_GEN_PROMPT + w - 2);
		assert_int_equal(json_integer_value(json_object_get(one, "n_predict")), 0);
		assert_true(json_is_true(json_object_get(one, "cache_prompt")));
		/* It evaluates one token: the one before it is in the slot. */
		assert_int_equal(selftest_gen_expected_cache(w), SELFTEST_GEN_PROMPT + w - 3);
		json_decref(one);
	}
	json_decref(gen);
}

static void test_verdicts(void **state)
{
	(void)state;
	struct selftest t = {0};
	char v[400];
	t.state = SELFTEST_VERIFIED;
	selftest_verdict(&t, v, sizeof v);
	assert_string_equal(v, "verified on this backend");
	t.remedy = "GGML_VK_DISABLE_COOPMAT=1";
	selftest_verdict(&t, v, sizeof v);
	assert_string_equal(v, "verified on this backend with GGML_VK_DISABLE_COOPMAT=1");
	t.remedy = NULL;
	t.shared_kv = 1;
	selftest_verdict(&t, v, sizeof v);
	assert_string_equal(v, "verified on this backend, on its first slot (its slots share one "
	                       "KV cache)");
	t.shared_kv = 0;
	t.state = SELFTEST_FAILED;
	snprintf(t.detail, sizeof t.detail, "it differed");
	selftest_verdict(&t, v, sizeof v);
	assert_string_equal(v, "not verified on this backend: it differed");
	t.state = SELFTEST_UNKNOWN;
	selftest_verdict(&t, v, sizeof v);
	assert_non_null(strstr(v, "unknown on this backend"));
	assert_non_null(strstr(v, "it differed"));
	assert_string_equal(selftest_state_name(SELFTEST_FAILED), "failed");
	assert_string_equal(selftest_state_name(SELFTEST_OFF), "off");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_history_then_reversed),
	    cmocka_unit_test(test_insert_request),
	    cmocka_unit_test(test_steps_grow_the_same_prompt),
	    cmocka_unit_test(test_step_sizes_leave_partial_tiles),
	    cmocka_unit_test(test_compare_same_bits),
	    cmocka_unit_test(test_compare_last_bit),
	    cmocka_unit_test(test_compare_other_token),
	    cmocka_unit_test(test_bits),
	    cmocka_unit_test(test_verdicts),
	    cmocka_unit_test(test_steps_check),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
