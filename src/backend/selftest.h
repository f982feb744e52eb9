/* Exact mode's self-test: does this backend's answer to a prompt evaluated
 * in steps depend on what the server computed before it? Exact mode's
 * promise rests on it not doing so (docs/exact.md, "GPU backends"). It
 * held on llama.cpp's CPU backend in every test; on ggml-vulkan with a
 * cooperative-matrix device it does not (a matrix product whose token count
 * leaves a partial tile reads memory past its input), and other GPU
 * backends are unknown until asked. So every discovery of a backend in
 * exact (or grid) mode asks, before the backend takes requests: one slot
 * evaluates a prompt of 300 tokens, then a prompt in four steps (99, 77,
 * 85 and 9 tokens, the last generating one token with its top 10
 * logprobs); then another slot (the same on a one-slot server) evaluates
 * 300 other tokens and the same prompt in the same steps. The two answers
 * must be the same bits. Every step's cache_n is checked, so that a server
 * that reused something else (its RAM cache) makes the test say "unknown",
 * never "verified". About 1,100 tokens on the server, once a start (a
 * server toki manages keeps a "verified" across its restarts: selftest.c,
 * "verdicts kept across restarts"). A
 * server that serves embeddings gets no prompt (one crashes on it).
 *
 * Where the two runs have slots of their own, a tiny prompt replaces the
 * first run's slot between run 1's first and second steps. On a server
 * whose slots share one KV cache (llama-server without -np, or -kvu), the
 * cells it frees take run 1's next tokens, ahead of its earlier ones, and
 * the answer changes (every model tried: stories260K, random llama,
 * qwen35, gemma3, gpt-oss; on -np 2 it never did). Then runs 2 and 3, on
 * the first slot with the others left as they are, tell a shared KV cache
 * (the same bits after the two histories: the answer depends only on the
 * other slots, so exact mode keeps to one: shared_kv) from a backend whose
 * answers depend on what it computed before (they differ: failed). Another
 * 1,100 tokens, only on servers that fail the first comparison. On a shared
 * KV cache every slot is then erased (POST /slots/N?action=erase), so that
 * the first slot's tokens go where they would on an empty server: verified.
 * Without --slot-save-path the server erases nothing, and no prompt leaves
 * a slot empty (a one-token prompt's cell lands where the history put it:
 * tried, the answers still differed), so the test fails, shared_kv set. */
#ifndef TOKI_BACKEND_SELFTEST_H
#define TOKI_BACKEND_SELFTEST_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct backend;
struct event;

/* Runs 0 and 1, and where they differ on two slots runs 2 and 3. */
enum { SELFTEST_RUNS = 4 };

enum selftest_state {
	SELFTEST_OFF,      /* fast mode: nothing is promised, nothing asked */
	SELFTEST_RUNNING,  /* during discovery */
	SELFTEST_VERIFIED, /* the two answers were the same bits */
	SELFTEST_FAILED,   /* they differed: the promise does not hold here */
	SELFTEST_UNKNOWN,  /* the test could not run to its end (detail says why) */
};

struct selftest {
	enum selftest_state state;
	char detail[320]; /* why not verified, or how it was */
	/* A remedy toki applied to the server it manages after a failure
	 * ("GGML_VK_DISABLE_COOPMAT=1"), or NULL. */
	const char *remedy;
	int remedy_tried;
	double seconds; /* how long the last run took */
	/* The verdict is one kept from an earlier start of the same server
	 * (selftest.c, "verdicts kept across restarts"), not tested now. */
	int kept;
	/* Runs 2 and 3 found that the slots share one KV cache: verified on
	 * the first slot where the others were erased, failed where the server
	 * cannot erase them. */
	int shared_kv;
	/* After a verified run, the steps check: an answer's rows as
	 * generation computed them are the rows of its tokens evaluated one at
	 * a time (exact mode's steps, router/sched.h). 1 verified, 0 not (or
	 * not asked); steps_why says how it went. */
	int steps;
	char steps_why[200];
	json_t *gen;        /* the check's generated tokens */
	json_t *gen_answer; /* the answer after them, as generation left the slot */
	char verified[320]; /* the verdict the run reached, told when the check ends */
	/* The run in flight. */
	int run, step, slot[SELFTEST_RUNS]; /* each run's slot: runs 0 and 1 on two
	                                       where the server has them */
	int clear;                          /* the slot being erased after runs 2 and 3 */
	int32_t *tokens;                    /* SELFTEST_TOKENS of them */
	json_t *answer[SELFTEST_RUNS];      /* each run's completion_probabilities */
	char why[300];                      /* how runs 0 and 1 differed */
	int64_t t0_us;
	void (*done)(struct backend *b);
	/* Another client on the server (selftest.c, "another client"): the
	 * tries begun, what the first one saw where it ended early, each
	 * slot's last task as the test last read /slots (NULL: not read, no
	 * checks), the slot the request just answered ran on, that answer
	 * while the slots are read after it, and the wait for an idle server
	 * before a try. */
	int tries;
	char first_try[200];
	long long *task;
	int n_task;
	int own_slot;
	int checking;
	int held_status;
	char *held_body;
	size_t held_len;
	int64_t idle_since_us;
	int idle_told;
	struct event *idle_timer;
};

/* Runs the test on b (discovery's step before the backend is up), then
 * calls done(b), whatever the outcome; in fast mode at once. The call in
 * flight is b->health_call, so that discovery's own cancels stop it. */
void selftest_start(struct backend *b, void (*done)(struct backend *b));
/* After a failure: on a server toki manages, applies the remedy known for
 * its backend and restarts it (1: discovery runs again when it is back). */
int selftest_try_remedy(struct backend *b);
/* Frees what a run holds. */
void selftest_clear(struct selftest *t);
/* "verified", "failed", "unknown", "off", "running". */
const char *selftest_state_name(enum selftest_state s);
/* The verdict in words, as the cache block and the start-up line say it:
 * "verified on this backend", "not verified on this backend: ...". */
void selftest_verdict(const struct selftest *t, char *out, size_t n);

/* The steps check (after a verified run, on the run's slot): a prompt of
 * SELFTEST_GEN_PROMPT tokens generates SELFTEST_GEN tokens; the next
 * request (the prompt, all generated tokens but the last, and
 * SELFTEST_GEN_NEXT more) reuses the slot as generation left it and
 * answers with its top 10 logprobs. Then, from an empty slot, the prompt,
 * each of those generated tokens alone (n_predict 0), and the same next
 * request: the two answers must be the same bits. SELFTEST_GEN + 3
 * requests, about 100 tokens. Where they differ exact mode evaluates no
 * answer one token at a time on this backend, and keeps no answer's rows:
 * its schedule is the one before steps (docs/exact.md). */
enum { SELFTEST_GEN_PROMPT = 64, SELFTEST_GEN = 8, SELFTEST_GEN_NEXT = 3 };
/* The body of the check's request `which`: 0 the generation, 1 the next
 * request after it, 2 the prompt from an empty slot, 3 + i the prompt and
 * gen[0..i] (i < SELFTEST_GEN - 1), SELFTEST_GEN + 2 the next request
 * after those. NULL when out of memory. */
json_t *selftest_gen_request(const int32_t *toks, const json_t *gen, int which, int slot);
/* The cache_n request `which` must report. */
int selftest_gen_expected_cache(int which);

/* The pieces, pure, for tests. */
enum { SELFTEST_HISTORY = 300, SELFTEST_PROMPT = 270, SELFTEST_STEPS = 4 };
enum { SELFTEST_TOKENS = SELFTEST_HISTORY + SELFTEST_PROMPT };
/* Where each step of the prompt ends, in tokens of the prompt. */
extern const int selftest_step_ends[SELFTEST_STEPS];
/* The /completion body of a run's step (0: the history, 1..4: the
 * prompt's steps), on slot, from toks (SELFTEST_TOKENS of them: the first
 * SELFTEST_HISTORY are the history of runs 0 and 3, reversed for runs 1 and
 * 2; the other SELFTEST_PROMPT are the prompt). NULL when out of memory. */
json_t *selftest_request(const int32_t *toks, int run, int step, int slot);
/* The tiny prompt that replaces run 0's slot in the middle of run 1 (on
 * slot), from the same toks. NULL when out of memory. */
json_t *selftest_insert_request(const int32_t *toks, int slot);
/* The cache_n a step must report: what the step before left in the slot. */
int selftest_expected_cache(int step);
/* The backend's bits (router_backend.bits): the hash, as 64 hex digits in
 * out, of run 0's answer and (NULL where steps do not hold) the steps
 * check's answer as generation left the slot. Servers whose tests gave the
 * same bits compute the same rows: in exact mode one restores the other's
 * saved states. 0, or -1 with out "" (out of memory). */
int selftest_bits(const json_t *answer, const json_t *gen_answer, char out[65]);
/* Compares two answers (completion_probabilities arrays); 0 when they are
 * the same bits, else 1 with the first difference in why. */
int selftest_compare(json_t *a, json_t *b, char *why, size_t n);

#endif
