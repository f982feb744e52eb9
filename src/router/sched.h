/* Evaluation schedules: which micro-batches compute a prompt's KV rows.
 *
 * llama.cpp's result for a row depends on the micro-batch it was computed
 * in (its start and length), not only on the tokens. A prompt evaluated in
 * one request is split into micro-batches of n_ubatch rows from where the
 * evaluation starts. A schedule here is a list of chunk starts: the prompt
 * is evaluated chunk by chunk, each chunk its own request, so each chunk is
 * split into micro-batches from its own start. No chunk starts (an empty
 * list) is llama-server's own schedule: one chunk from position 0, the grid.
 *
 * Inside a chunk the micro-batches are n_ubatch rows from its start, as
 * llama-server cuts a request, except at the end of a closed chunk (one the
 * next chunk start ends) whose last micro-batch would be short: that one
 * takes SCHED_MIN_BATCH rows from the one before (sched_tail_split), each
 * its own request. The last chunk is open (a later turn extends it), so it
 * keeps the plain grid.
 *
 * Two evaluations of a prefix give the same bits when every micro-batch
 * covering it has the same start and end in both schedules (and the same
 * tokens). That is all exact mode needs: a cached row may stand in for a
 * computed one exactly when the schedule that made it and the request's own
 * schedule agree on the micro-batches up to it. The answer is then a
 * function of the request alone (its tokens and its schedule), whatever was
 * cached before.
 *
 * Everything here is arithmetic on positions; no I/O. */
#ifndef TOKI_ROUTER_SCHED_H
#define TOKI_ROUTER_SCHED_H

#include <stddef.h>

/* The longest prefix [0, c) whose micro-batches are the same in schedule A
 * (chunk starts a[0..na), rows computed up to aend) and schedule B (b[0..nb),
 * up to bend), with c at most limit. c is a micro-batch end in both, so an
 * evaluation resumed at c continues either schedule exactly. */
size_t sched_common(const size_t *a, size_t na, size_t aend, const size_t *b, size_t nb,
                    size_t bend, size_t limit, int ub);

/* The largest micro-batch end of schedule (b, nb) over rows [0, end) that is
 * at most x: what of a computed prefix survives a cut at x. */
size_t sched_floor(const size_t *b, size_t nb, size_t end, size_t x, int ub);

/* The version of the rule that makes micro-batches of chunk starts (1: the
 * grid from each chunk's start; 2: halves at closed chunks' short tails,
 * never released; 3: the last micro-batch takes 64 rows). A saved state's
 * chunk starts mean its rows only under the rule it was made by, so slot
 * files carry this in their fingerprint. */
#define SCHED_LAYOUT 3

/* llama.cpp's CPU backend computes attention in tiles of this many rows of
 * a micro-batch, and row by row in a smaller one, which costs about as much
 * as a whole tile (bench/ubatch_cost.py, 24M model, 6,144 rows in: 56 rows
 * 522 ms, 64 rows 314 ms; 256 rows 1,113 ms, 257 rows 1,399 ms). */
#define SCHED_MIN_BATCH 64

/* Where the last two micro-batches of the closed chunk [cs, ce) meet, when
 * the grid from cs would leave the last one r < SCHED_MIN_BATCH rows: at
 * ce - SCHED_MIN_BATCH - r, so that the one before keeps whole tiles and
 * the last has SCHED_MIN_BATCH + r rows (543 at -ub 512: 448 + 95, where
 * the grid gives 512 + 31). 0 when the grid stands (no short last
 * micro-batch, a chunk of at most ub rows, or ub under 2 *
 * SCHED_MIN_BATCH). */
size_t sched_tail_split(size_t cs, size_t ce, int ub);

/* What starts at a position of a chat prompt (prompt/chat.h gives them;
 * sched_chunks keeps some as chunk starts). */
enum sched_start {
	SCHED_START_MESSAGE = 0, /* a message: the first one's end, or a user turn or tool output */
	SCHED_START_ANSWER = 1,  /* an assistant message, or the generation prompt */
	SCHED_START_SECTION = 2, /* a paragraph (after an empty line) of the first message */
	/* A token of an earlier answer, evaluated alone: its own chunk of one
	 * row, as generation computed it (prompt/prompt.h, step regions). */
	SCHED_START_STEP = 3,
	/* An assistant message's start, or the generation prompt's, in the
	 * schedule without steps only: with steps, the one-token chunk of its
	 * header's last token stands for it (prompt/prompt.h, the joined
	 * header), so that the generation prompt's last token is evaluated
	 * alone, as llama-server evaluates it on a resend. */
	SCHED_START_PLAIN = 4,
};

/* The first message's end is a chunk start when the chunk it ends has at
 * least this many tokens: a round trip and a small batch cost more than
 * reusing fewer tokens saves. */
#define SCHED_MIN_CHUNK 64

/* A section start inside the first message is a chunk start when the chunk
 * it ends has at least this many tokens. Sessions of one agent, and its
 * sub-agents, share a long system prompt up to a section where they differ
 * (the environment, the date, a task after shared tool definitions); a start
 * there lets them share all of it. Short sections merge, so a first message
 * never has more starts than one per SCHED_MIN_SECTION tokens: each start
 * costs a decode call when the prompt is evaluated cold (bench g). */
#define SCHED_MIN_SECTION 128

/* A prompt's chunk starts from its starts *starts[0..n) (malloc'd,
 * increasing; kind[i] an enum sched_start), left to right: every
 * SCHED_START_ANSWER; the first message's end (its first
 * SCHED_START_MESSAGE) and the section starts before it, each where the
 * chunk it ends has at least SCHED_MIN_CHUNK or SCHED_MIN_SECTION tokens.
 * Every SCHED_START_STEP is kept too (a chunk of one token of an earlier
 * answer); a SCHED_START_PLAIN never (the schedule without steps makes it
 * a SCHED_START_ANSWER). Later message starts (user turns, tool outputs) are not chunk
 * starts: an agent's next turn appends to its conversation and reuses everything before
 * the answer it continues (a SCHED_START_ANSWER), whatever lies between, and
 * every start costs a decode call when a prompt is evaluated cold. Each
 * decision looks only at what comes before the start, so a longer prompt
 * that begins the same way keeps the same starts there. Returns how many
 * (in *starts). */
size_t sched_chunks(size_t *starts, const unsigned char *kind, size_t n);

/* Steps of a request's plan, in the order they run. */
enum plan_step_kind {
	STEP_SAVE,     /* save the slot's content to a file first */
	STEP_RESTORE,  /* restore a saved state into the slot */
	STEP_CUT,      /* leave exactly `upto` tokens of the prompt in the slot */
	STEP_PREFILL,  /* evaluate the prompt up to `upto` (a chunk end), generate nothing */
	STEP_GENERATE, /* the client's request itself: the last chunk, then the answer */
};

struct plan_step {
	enum plan_step_kind kind;
	size_t upto;
};

/* What a request does on its backend, in order: the executor (serve/exec.c)
 * runs one step at a time and the next when it ends. */
struct plan {
	struct plan_step *steps;
	size_t n, next;
	size_t reuse;       /* prompt tokens taken from the cache */
	size_t final_cache; /* what the server reuses in GENERATE: the last chunk's start */
};

/* The most tokens one prefill step evaluates, for micro-batches of ub:
 * llama-server's default batch (2048) rounded down to whole micro-batches,
 * at least one. A longer chunk is evaluated in several steps of this size
 * from its start; the micro-batches are the same (each step starts on one
 * of the chunk's micro-batch boundaries), so the rows are too, and a
 * client that goes away waits for at most one step, as llama-server itself
 * stops a cancelled prompt only after its current batch. */
size_t sched_max_step(int ub);

/* A request of n tokens with chunk starts b[0..nb) (empty: one chunk), to
 * run after reusing `reuse` tokens (a micro-batch end of the schedule, for
 * micro-batches of ub): save and restore first when asked, a cut when the
 * slot may hold more than reuse matching tokens, a prefill for each chunk
 * start past reuse (and at a chunk's tail split, and every max_step tokens
 * inside a longer chunk, when max_step is not 0), then GENERATE. Returns 0,
 * or -1 when out of memory. */
int plan_build(struct plan *p, const size_t *b, size_t nb, size_t n, size_t reuse, int save_first,
               int restore, int cut, size_t max_step, int ub);
/* How many of p's steps from steps[i] on are one-token prefills in a row
 * (an earlier answer's steps), the first evaluating the token at `done`:
 * at most max. */
size_t plan_ones_from(const struct plan *p, size_t i, size_t done, size_t max);

/* The most one-token steps one request evaluates: a cancel lets the
 * request in flight end, as it lets a prefill step end. */
#define PLAN_RUN_MAX 64

/* The run of one-token steps from steps[i] (the slot holding the prompt up
 * to done) that one request evaluates: a generation forced to those
 * tokens, which computes each row alone as the steps do (serve/exec.c,
 * forced_body). Returns how many steps it covers (2 to PLAN_RUN_MAX), or 0
 * where steps[i] goes alone: not a one-token step, a run of one, or one
 * from an empty slot. */
size_t plan_forced_run(const struct plan *p, size_t i, size_t done);
void plan_free(struct plan *p);

#endif
