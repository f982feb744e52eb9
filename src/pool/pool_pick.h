/* The endpoint's decisions that need no I/O, so that they are unit-tested
 * (tests/unit/test_pool_pick.c): which registry model a request's "model"
 * names, which running model makes room for another, and what an unknown
 * name is told. pool.c does the rest. */
#ifndef TOKI_POOL_PICK_H
#define TOKI_POOL_PICK_H

#include <stddef.h>
#include <stdint.h>

struct registry;

/* The registry model a request names: its name, one of its aliases, or its
 * GGUF's path (clients that worked against one llama-server send that). No
 * name (NULL or "") is the active model, else the first one. The model's
 * index, or -1 when the name is unknown (or the registry is empty). */
int pool_resolve(const struct registry *r, const char *model);

/* "no model 'x' here; the models are: a (aliases b, c), d": what a 404 for
 * an unknown name says. Returns what snprintf returns. */
int pool_unknown_message(const struct registry *r, const char *model, char *buf, size_t n);

/* A model as the choice of whom to stop sees it. */
struct pool_view {
	int running;       /* its server runs, starts or stops: it holds memory */
	int stoppable;     /* running, ready, no request in flight or queued */
	int64_t last_used; /* when its last request ended (any clock) */
	uint64_t used;     /* the memory it holds */
	int stopping;      /* running, and on its way out: a member's memory is freed soon */
	int ready;         /* running and serving (in flight or not) */
	/* its registry group, 1-based (registry_group_of + 1), so that a view
	 * left zeroed is in none: 0 */
	int group;
	/* The CPU turn (pool_turn_queue): */
	int cpu;     /* computes on the CPU (no GPU sized for it), as its last start found */
	int threads; /* the CPU threads its server computes with; 0: a thread per core */
	int busy;    /* starting, or answering a request that computes */
	int takes;   /* ready and not held back: takes requests */
};

enum {
	POOL_FITS = -1,  /* the model fits beside the running ones: start it */
	POOL_WAIT = -2,  /* it does not, and no running one can stop now */
	POOL_NEVER = -3, /* it does not even with every other model stopped */
	/* it fits alone, not beside its group's running members, which are
	 * never stopped for it: the group does not fit together */
	POOL_NEVER_GROUP = -4,
};
/* Whether model `target` (not running) can start beside the others within
 * capacity bytes and max_loaded models (0: no cap): POOL_FITS; else the
 * index of the least recently used stoppable model to stop first, never one
 * of the target's group; else POOL_WAIT, POOL_NEVER or POOL_NEVER_GROUP. */
int pool_pick(const struct pool_view *v, int n, int target, uint64_t need, uint64_t capacity,
              long max_loaded);

/* When pool_pick says POOL_WAIT (every other model busy): the least
 * recently used ready model, never one of the target's group, to take no
 * new requests and stop once its last one ends; -1 when there is none. */
int pool_pick_drain(const struct pool_view *v, int n, int target);

/* The CPU turn. llama.cpp's CPU threads wait for each other by spinning,
 * each server with a thread per core by default, so two
 * models that compute on the CPU at once do not share the cores: they
 * stall each other (two 24M models generating 200 tokens each, on 2
 * cores: 0.95 s one after the other, 32 s at once; docs/benchmarks.md).
 * So models on the CPU take turns: one at a time starts (its load and
 * self-test compute) or answers requests that compute (any but GET and
 * HEAD); requests to the same model go together, as its llama-server
 * batches them. A model on a GPU never waits for the turn.
 *
 * Models whose threads are counted (-t, and -tb if more) share it when
 * their threads together fit the CPUs this process may use: each thread
 * then has a CPU of its own, and none spins waiting for one that is not
 * running. A model left to llama.cpp's choice (a thread per core) shares
 * with none. */

/* Whether model `target` may take the turn now: it is not on the CPU, or
 * no other model on the CPU is busy, or every busy one's threads and its
 * own are counted and fit in cpus. */
int pool_turn_free(const struct pool_view *v, int n, int target, int cpus);

/* A waiter of the queue, as the turn sees it. */
struct pool_queue_view {
	int model;    /* its model's index in the views */
	int computes; /* a request that computes (not a load, a GET or HEAD) */
};
/* Which waiters go now, in queue order: go[k] = 1 where waiter k's model
 * takes requests and, for a request that computes on a CPU model, the
 * turn is free, its own or shared (pool_turn_free). A CPU model's waiter that cannot go (its model
 * starts, waits for room or for the turn) holds back every later waiter
 * of a CPU model, whatever its model: the turn passes in queue order, so
 * a model whose requests keep coming does not keep it. v[].busy is set
 * for the models of the requests that go. Returns how many go. */
int pool_turn_queue(struct pool_view *v, int n, const struct pool_queue_view *q, int k, int cpus,
                    unsigned char *go);

#endif
