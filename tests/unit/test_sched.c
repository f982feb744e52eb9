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

enum {
	M = SCHED_START_MESSAGE,
	A = SCHED_START_ANSWER,
	S = SCHED_START_SECTION,
	T = SCHED_START_STEP,
	P = SCHED_START_PLAIN,
};

/* A joined header (prompt/prompt.h): the step at the header's last token
 * stands for the message's start, which only the schedule without steps
 * keeps. The generating request's last chunk is then its prompt's last
 * token, and the next turn's schedule has the same chunks up to there. */
static void test_joined_header(void **state)
{
	(void)state;
	/* The first turn: its generation prompt at 300, 303 tokens. */
	size_t t1[] = {200, 300, 302};
	unsigned char k1[] = {M, P, T};
	size_t n1 = sched_chunks(t1, k1, N(t1));
	size_t want1[] = {200, 302};
	assert_int_equal(n1, N(want1));
	assert_memory_equal(t1, want1, sizeof want1);
	/* The next turn: that answer at 300, its steps from 302. */
	size_t t2[] = {200, 300, 302, 303, 304, 305, 310, 340, 342};
	unsigned char k2[] = {M, P, T, T, T, T, M, P, T};
	size_t n2 = sched_chunks(t2, k2, N(t2));
	size_t want2[] = {200, 302, 303, 304, 305, 342};
	assert_int_equal(n2, N(want2));
	assert_memory_equal(t2, want2, sizeof want2);
	/* The slot after the first turn, its answer kept: the next turn
	 * reuses all of it; a resend all but the last token. */
	size_t slot[] = {200, 302, 303, 304};
	assert_int_equal(sched_common(slot, N(slot), 305, t2, n2, 343, 342, 512), 305);
	assert_int_equal(sched_common(slot, N(slot), 305, t1, n1, 303, 302, 512), 302);
	/* A plain start is never a chunk start, and ends the first message
	 * as any kind but a section does. */
	size_t t3[] = {100, 250};
	unsigned char k3[] = {P, M};
	assert_int_equal(sched_chunks(t3, k3, N(t3)), 0);
}

/* An earlier answer's tokens are one-token chunks (steps), all kept: a
 * slot whose answer generation computed one token at a time (the prompt's
 * starts, then one start per answer row) lends all of them to the next
 * turn, whose own schedule has the same steps; a request without them
 * reuses only what comes before the answer. */
static void test_steps(void **state)
{
	(void)state;
	/* The next turn: an answer at 300 whose header ends at 303, its
	 * tokens 303..307 and its end of turn at 308; a user turn at 310;
	 * the generation prompt at 340. */
	size_t s[] = {200, 300, 303, 304, 305, 306, 307, 308, 310, 340};
	unsigned char k[] = {M, A, T, T, T, T, T, T, M, A};
	size_t n = sched_chunks(s, k, N(s));
	size_t want[] = {200, 300, 303, 304, 305, 306, 307, 308, 340};
	assert_int_equal(n, N(want));
	assert_memory_equal(s, want, sizeof want);
	/* The slot after the turn before (prompt 303 tokens, its last chunk
	 * the generation prompt at 300) and its kept answer rows 303..307. */
	size_t slot[] = {200, 300, 303, 304, 305, 306, 307};
	assert_int_equal(sched_common(slot, N(slot), 308, s, n, 343, 343, 512), 308);
	/* Without steps the answer's rows are no use to it: 300 is all. */
	size_t grid[] = {200, 300, 340};
	assert_int_equal(sched_common(slot, N(slot), 308, grid, N(grid), 343, 343, 512), 300);
	/* Fewer rows kept (the text's tokens differed after 305): as far. */
	assert_int_equal(sched_common(slot, 4, 305, s, n, 343, 343, 512), 305);

	/* Cold, the plan's one-token steps 304..308 are one run (the
	 * executor's forced generation), and nothing else is. */
	struct plan p;
	assert_int_equal(plan_build(&p, s, n, 343, 0, 0, 0, 0, 0, 512), 0);
	size_t at = p.n;
	for (size_t i = 0; i < p.n; i++)
		if (p.steps[i].kind == STEP_PREFILL && p.steps[i].upto == 304 && at == p.n)
			at = i;
	assert_true(at < p.n);
	assert_int_equal(p.steps[at - 1].upto, 303);
	assert_int_equal(plan_ones_from(&p, at, 303, 100), 5);
	assert_int_equal(plan_ones_from(&p, at, 303, 3), 3);
	assert_int_equal(plan_ones_from(&p, at + 1, 304, 100), 4);
	assert_int_equal(plan_ones_from(&p, at - 1, 300, 100), 0);  /* 3 tokens */
	assert_int_equal(plan_ones_from(&p, at, 302, 100), 0);      /* not where it starts */
	assert_int_equal(plan_ones_from(&p, p.n - 1, 342, 100), 0); /* GENERATE */
	/* One request each run: none for a run of one. */
	assert_int_equal(plan_forced_run(&p, at, 303), 5);
	assert_int_equal(plan_forced_run(&p, at + 3, 306), 2);
	assert_int_equal(plan_forced_run(&p, at + 4, 307), 0);
	assert_int_equal(plan_forced_run(&p, at - 1, 300), 0);
	plan_free(&p);

	/* A long answer: runs of PLAN_RUN_MAX, then the rest; none from an
	 * empty slot. */
	size_t l[200];
	unsigned char lk[200];
	size_t nl = 0;
	l[nl] = 100, lk[nl++] = A;
	for (size_t t = 103; t < 103 + 150; t++)
		l[nl] = t, lk[nl++] = T;
	l[nl] = 260, lk[nl++] = A;
	nl = sched_chunks(l, lk, nl);
	assert_int_equal(plan_build(&p, l, nl, 263, 0, 0, 0, 0, 0, 512), 0);
	for (at = 0; at < p.n && p.steps[at].upto != 104; at++)
		;
	assert_true(at < p.n);
	assert_int_equal(plan_forced_run(&p, at, 103), PLAN_RUN_MAX);
	assert_int_equal(plan_forced_run(&p, at + PLAN_RUN_MAX, 103 + PLAN_RUN_MAX), PLAN_RUN_MAX);
	assert_int_equal(plan_forced_run(&p, at + 2 * PLAN_RUN_MAX, 103 + 2 * PLAN_RUN_MAX),
	                 149 - 2 * PLAN_RUN_MAX); /* 103..251: 252 starts the last chunk */
	assert_int_equal(plan_forced_run(&p, 0, 0), 0);
	plan_free(&p);
}

/* The rule is left to right and content-defined: a longer prompt with the
 * same beginning keeps the same starts there. */
static void test_chunks_left_to_right(void **state)
{
	/* Sections at 30 and 150 (the first under SCHED_MIN_SECTION, merged),
	 * the first message ends at 200; a user turn at 230 is no start. */
	size_t s[] = {30, 150, 200, 230, 300, 305};
	unsigned char k[] = {S, S, M, M, A, A};
	size_t n = sched_chunks(s, k, N(s));
	size_t want[] = {150, 300, 305}; /* 200 is 50 after 150: merged */
	assert_int_equal(n, N(want));
	assert_memory_equal(s, want, sizeof want);

	/* The same starts, extended: the kept ones up to 305 are the same. */
	size_t t[] = {30, 150, 200, 230, 300, 305, 330, 400, 410};
	unsigned char tk[] = {S, S, M, M, A, A, M, M, A};
	assert_int_equal(sched_chunks(t, tk, N(t)), 4);
	assert_memory_equal(t, want, sizeof want);
	assert_int_equal(t[3], 410);

	/* Starts that do not increase are dropped. */
	size_t v[] = {100, 100, 90, 300};
	unsigned char vk[] = {A, A, A, A};
	assert_int_equal(sched_chunks(v, vk, N(v)), 2);
	assert_int_equal(v[0], 100);
	assert_int_equal(v[1], 300);
}

/* Two prompts that share a long first message up to a section where they
 * differ get the same starts up to there, the section's start included:
 * exact mode reuses all they share. */
static void test_chunks_share_inside_the_first_message(void **state)
{
	/* Sections at 700 and 1010 ("Session context:"); system ends at 1015
	 * in a, at 1090 in b. */
	size_t a[] = {700, 1010, 1015, 1100, 1180};
	size_t b[] = {700, 1010, 1090, 1200, 1290};
	unsigned char ka[] = {S, S, M, A, A}, kb[] = {S, S, M, A, A};
	size_t na = sched_chunks(a, ka, N(a)), nb = sched_chunks(b, kb, N(b));
	size_t wa[] = {700, 1010, 1100, 1180}; /* 1015 is 5 after 1010: merged */
	size_t wb[] = {700, 1010, 1090, 1200, 1290};
	assert_int_equal(na, N(wa));
	assert_memory_equal(a, wa, sizeof wa);
	assert_int_equal(nb, N(wb));
	assert_memory_equal(b, wb, sizeof wb);
	/* What they share is everything before the section they differ in. */
	assert_int_equal(sched_common(a, na, 1185, b, nb, 1295, 1010, 512), 1010);

	/* A first message under SCHED_MIN_CHUNK is no start, nor is a section
	 * in it; user turns and tool outputs are no starts; assistant starts
	 * and the generation prompt are, however short. */
	size_t c[] = {5, 10, 40, 300, 310, 900};
	unsigned char kc[] = {S, M, A, M, A, A};
	assert_int_equal(sched_chunks(c, kc, N(c)), 3);
	assert_int_equal(c[0], 40);
	assert_int_equal(c[1], 310);
	assert_int_equal(c[2], 900);
	/* A first start that is the generation prompt too. */
	size_t h[] = {7};
	unsigned char kh[] = {A};
	assert_int_equal(sched_chunks(h, kh, 1), 1);
	assert_int_equal(h[0], 7);
	/* A long first message of short sections: never more than one start
	 * per SCHED_MIN_SECTION tokens. */
	size_t l[64];
	unsigned char kl[64];
	for (size_t i = 0; i < 63; i++)
		l[i] = (i + 1) * 20, kl[i] = S;
	l[63] = 1300, kl[63] = M;
	size_t nl = sched_chunks(l, kl, 64);
	assert_true(nl <= 1300 / SCHED_MIN_SECTION);
	for (size_t i = 0; i + 1 < nl; i++)
		assert_true(l[i + 1] - l[i] >= SCHED_MIN_SECTION);
	/* Sections every 140 tokens; the message's end, 40 after the last, merges. */
	assert_int_equal(nl, 9);
	assert_int_equal(l[nl - 1], 1260);
}

/* A closed chunk whose last micro-batch would be short gives it 64 rows of
 * the one before; an open one (the last chunk, the grid) does not. */
static void test_tail_split(void **state)
{
	(void)state;
	/* 543 rows: 512 + 31 on the grid; 448 + 95. */
	assert_int_equal(sched_tail_split(0, 543, 512), 448);
	assert_int_equal(sched_tail_split(1000, 1543, 512), 1448);
	/* 1,060 rows: 512, then 448 + 100. */
	assert_int_equal(sched_tail_split(0, 1060, 512), 960);
	/* At -ub 128: 300 rows are 128, 64, 108. */
	assert_int_equal(sched_tail_split(0, 300, 128), 192);
	/* A last micro-batch of SCHED_MIN_BATCH or more, a whole one, or a
	 * chunk of at most one: the grid stands. */
	assert_int_equal(sched_tail_split(0, 512 + SCHED_MIN_BATCH, 512), 0);
	assert_int_equal(sched_tail_split(0, 1024, 512), 0);
	assert_int_equal(sched_tail_split(0, 500, 512), 0);
	/* Micro-batches too small to halve. */
	assert_int_equal(sched_tail_split(0, 100, 64), 0);

	size_t a[] = {543};
	/* The plan ends a request at the split: llama-server would cut one
	 * request of 543 rows into 512 and 31. */
	struct plan p;
	size_t c[] = {543, 600};
	assert_int_equal(plan_build(&p, c, 2, 605, 0, 0, 0, 0, 2048, 512), 0);
	assert_int_equal(p.n, 4);
	assert_int_equal(p.steps[0].upto, 448);
	assert_int_equal(p.steps[1].upto, 543);
	assert_int_equal(p.steps[2].upto, 600);
	assert_int_equal(p.steps[3].kind, STEP_GENERATE);
	plan_free(&p);
	/* Resumed at the split: its second half, then on. */
	assert_int_equal(plan_build(&p, c, 2, 605, 448, 0, 0, 0, 2048, 512), 0);
	assert_int_equal(p.n, 3);
	assert_int_equal(p.steps[0].upto, 543);
	plan_free(&p);

	/* The split is a micro-batch end: a cut at 500 keeps 448, one at 300
	 * nothing. */
	assert_int_equal(sched_floor(a, 1, 600, 500, 512), 448);
	assert_int_equal(sched_floor(a, 1, 600, 542, 512), 448);
	assert_int_equal(sched_floor(a, 1, 600, 300, 512), 0);
	assert_int_equal(sched_floor(a, 1, 600, 543, 512), 543);
	/* The grid over the same rows made other micro-batches. */
	assert_int_equal(sched_common(a, 1, 600, NULL, 0, 600, 599, 512), 0);
	/* The same chunk in a longer prompt is shared whole. */
	size_t b[] = {543, 700};
	assert_int_equal(sched_common(a, 1, 600, b, 2, 710, 709, 512), 543);
	/* Rows kept up to the split after a cut (the chunk's end forgotten, so
	 * the chunk reads as open) are still the split's micro-batch. */
	assert_int_equal(sched_common(NULL, 0, 448, b, 2, 710, 709, 512), 448);
	/* An open last chunk of 543 rows is on the grid, [0,512) and
	 * [512,543): a request that closes the chunk there shares neither. */
	assert_int_equal(sched_common(NULL, 0, 543, a, 1, 600, 599, 512), 0);
}

/* Whatever the schedule, the plan's requests, each cut by llama-server
 * into ub micro-batches from its own start, make exactly the micro-batches
 * the schedule says (those sched_floor stops at), from the reuse on. */
static void test_plan_makes_the_schedule(void **state)
{
	(void)state;
	unsigned seed = 12345;
	for (int round = 0; round < 300; round++) {
		int ub = round % 3 == 0 ? 128 : 512;
		size_t n = 50 + (seed = seed * 1103515245u + 12345u) % 4000;
		size_t b[16], nb = 0, pos = 0;
		while (nb < 16) {
			pos += 1 + (seed = seed * 1103515245u + 12345u) % 1200;
			if (pos >= n)
				break;
			b[nb++] = pos;
		}
		size_t x = (seed = seed * 1103515245u + 12345u) % n;
		size_t reuse = sched_floor(b, nb, n, x, ub);
		struct plan p;
		assert_int_equal(plan_build(&p, b, nb, n, reuse, 0, 0, 0, sched_max_step(ub), ub),
		                 0);
		/* The micro-batch ends llama-server makes of the plan. */
		static unsigned char made[5000];
		memset(made, 0, sizeof made);
		size_t from = reuse;
		for (size_t i = 0; i < p.n; i++) {
			size_t upto = p.steps[i].upto;
			if (p.steps[i].kind == STEP_GENERATE)
				assert_int_equal(from, p.final_cache);
			assert_true(upto > from);
			for (size_t e = from; e < upto;) {
				e = e + (size_t)ub < upto ? e + (size_t)ub : upto;
				made[e] = 1;
			}
			from = upto;
		}
		assert_int_equal(from, n);
		for (size_t e = reuse + 1; e <= n; e++)
			assert_int_equal(made[e], sched_floor(b, nb, n, e, ub) == e);
		plan_free(&p);
	}
}

static void test_plan(void **state)
{
	size_t b[] = {900, 1000, 1100, 1180};
	struct plan p;
	/* Reuse 1000 after a cut: prefill to 1100 and 1180, then generate. */
	assert_int_equal(plan_build(&p, b, N(b), 1185, 1000, 0, 0, 1, 2048, 512), 0);
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
	assert_int_equal(plan_build(&p, b, N(b), 1185, 1180, 1, 1, 0, 2048, 512), 0);
	assert_int_equal(p.n, 3);
	assert_int_equal(p.steps[0].kind, STEP_SAVE);
	assert_int_equal(p.steps[1].kind, STEP_RESTORE);
	assert_int_equal(p.steps[2].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 1180);
	plan_free(&p);

	/* Fast mode (no starts): one step. */
	assert_int_equal(plan_build(&p, NULL, 0, 500, 0, 0, 0, 0, 0, 512), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.steps[0].kind, STEP_GENERATE);
	assert_int_equal(p.final_cache, 0);
	plan_free(&p);

	/* Long chunks are evaluated max_step at a time from where the
	 * evaluation resumes (reuse 128, on the micro-batch grid of the chunk
	 * from 0): 128+512, +512, then the chunk's end; the second chunk from
	 * its own start. */
	size_t c[] = {1500, 2100};
	assert_int_equal(plan_build(&p, c, N(c), 2110, 128, 0, 0, 0, 512, 512), 0);
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
	assert_int_equal(plan_build(&p, c, 1, 1600, 988, 0, 0, 0, 512, 512), 0);
	assert_int_equal(p.n, 2);
	plan_free(&p);
	assert_int_equal(plan_build(&p, c, N(c), 2110, 0, 0, 0, 0, 0, 512), 0);
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
	    cmocka_unit_test(test_steps),
	    cmocka_unit_test(test_joined_header),
	    cmocka_unit_test(test_plan),
	    cmocka_unit_test(test_tail_split),
	    cmocka_unit_test(test_plan_makes_the_schedule),
	    cmocka_unit_test(test_chunks_share_inside_the_first_message),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
