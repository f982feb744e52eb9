/* The executor's decisions that need no I/O, for its unit test
 * (tests/unit/test_exec.c): the step table's names and the cancel matrix. */
#ifndef TOKI_SERVE_EXEC_H
#define TOKI_SERVE_EXEC_H

#include <stddef.h>

/* What a request's cancel does to its slot, by the step it is in. */
enum cancel_action {
	CANCEL_END,          /* nothing of the slot to keep: the request just ends */
	CANCEL_LET_STEP_END, /* a prefill step runs on (llama-server would finish its batch) */
	CANCEL_KEEP,         /* the slot keeps `keep` tokens; exact mode then waits for it */
};

struct cancel_case {
	int step; /* enum req_state (serve/req.h) */
	int exact;
	int routable, slot_live, replanning; /* a slot whose record can be trusted */
	int call_out;                        /* the step's backend call is in flight */
	int gen_started;                     /* the whole prompt was evaluated (a token came) */
	size_t n_tokens, reuse, done_upto;
};

/* The cancel matrix: the action, and for CANCEL_KEEP how many tokens of the
 * prompt the slot holds and how many of them it had reused. */
enum cancel_action exec_cancel_action(const struct cancel_case *c, size_t *keep,
                                      size_t *keep_reused);
/* A step's name (its row of the table), "?" for none. */
const char *exec_step_name(int step);
/* Whether the table has a start function for the step (the plan's steps and
 * the request's own calls do). */
int exec_step_startable(int step);

#endif
