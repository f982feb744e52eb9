/* Unit tests for the token radix tree (src/router/radix.c).
 *
 * The tree's source is compiled into this test, rather than taken from the
 * library, with an allocator that counts live bytes and can be told to fail:
 * that lets the tests check radix_memory_bytes to the byte, find leaks, and
 * check that an insertion which runs out of memory leaves the tree exactly
 * as it was. The linker then never pulls radix.o out of libtokicore.a, as
 * every symbol it defines is already here. Including the source also gives
 * the invariant checker the node layout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

/* --- The counting, failing allocator. --- */

/* Each block carries its size in front, so free knows what to subtract. */
#define T_HDR sizeof(max_align_t)

static size_t t_live_bytes;    /* bytes handed out and not yet freed */
static uint64_t t_fail_state;  /* PRNG state for random failures */
static unsigned t_fail_permil; /* chance, per thousand, that an allocation fails */

static int t_should_fail(void)
{
	if (t_fail_permil == 0)
		return 0;
	t_fail_state = t_fail_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (t_fail_state >> 33) % 1000 < t_fail_permil;
}

static void *t_malloc(size_t size)
{
	unsigned char *p;

	if (t_should_fail())
		return NULL;
	p = malloc(T_HDR + size);
	if (!p)
		return NULL;
	memcpy(p, &size, sizeof(size));
	t_live_bytes += size;
	return p + T_HDR;
}

static void t_free(void *ptr)
{
	unsigned char *p = ptr;
	size_t size;

	if (!p)
		return;
	p -= T_HDR;
	memcpy(&size, p, sizeof(size));
	t_live_bytes -= size;
	free(p);
}

static void *t_realloc(void *ptr, size_t size)
{
	unsigned char *p = ptr, *q;
	size_t old;

	if (!p)
		return t_malloc(size);
	if (t_should_fail())
		return NULL;
	p -= T_HDR;
	memcpy(&old, p, sizeof(old));
	q = realloc(p, T_HDR + size);
	if (!q)
		return NULL;
	memcpy(q, &size, sizeof(size));
	t_live_bytes = t_live_bytes - old + size;
	return q + T_HDR;
}

#define RADIX_MALLOC(size) t_malloc(size)
#define RADIX_REALLOC(ptr, size) t_realloc(ptr, size)
#define RADIX_FREE(ptr) t_free(ptr)
#include "router/radix.c"

/* --- Helpers. --- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	/* xorshift64*: deterministic across libcs, unlike rand(). */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static size_t rng_below(size_t n)
{
	return (size_t)(rng_next() % n);
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t lcp(const token_t *a, size_t an, const token_t *b, size_t bn)
{
	size_t i = 0;

	while (i < an && i < bn && a[i] == b[i])
		i++;
	return i;
}

/* Walks the whole tree checking its shape; returns the number of owners in
 * x's subtree and adds its nodes (x included unless root) to *nodes. With
 * strict set, the compressed property must hold too; without it, a node may
 * keep a single child (a merge that found no memory), never zero. */
static size_t check_node(const struct radix *r, const struct radix_node *x, int strict,
                         size_t *nodes)
{
	size_t owners = x->nowners;

	assert_true(x->nowners <= x->owners_cap);
	assert_true(x->nchildren <= x->children_cap);
	assert_true((x->owners_cap == 0) == (x->owners == NULL));
	assert_true((x->children_cap == 0) == (x->children == NULL));
	if (x != &r->root) {
		(*nodes)++;
		assert_non_null(x->parent);
		assert_non_null(x->label);
		assert_true(x->len >= 1);
		if (x->nowners == 0)
			assert_true(x->nchildren >= (strict ? 2u : 1u));
	} else {
		assert_null(x->parent);
		assert_null(x->label);
		assert_int_equal(x->len, 0);
	}
	for (uint32_t i = 0; i < x->nchildren; i++) {
		const struct radix_node *c = x->children[i].node;

		assert_ptr_equal(c->parent, x);
		assert_int_equal(x->children[i].first, c->label[0]);
		if (i > 0)
			assert_true(x->children[i - 1].first < x->children[i].first);
		owners += check_node(r, c, strict, nodes);
	}
	return owners;
}

/* Nodes left holding a merge that was refused memory. */
static size_t count_unmerged(const struct radix *r, const struct radix_node *x)
{
	size_t n = x != &r->root && x->nowners == 0 && x->nchildren == 1;

	for (uint32_t i = 0; i < x->nchildren; i++)
		n += count_unmerged(r, x->children[i].node);
	return n;
}

static void check_tree(const struct radix *r, int strict)
{
	size_t nodes = 0;

	assert_int_equal(check_node(r, &r->root, strict, &nodes), radix_owner_count(r));
	assert_int_equal(nodes, radix_node_count(r));
	/* Only one tree is alive at a time in these tests, so the allocator's
	 * count is the tree's. */
	assert_int_equal(radix_memory_bytes(r), t_live_bytes);
	/* Compression bounds the nodes by twice the owners. */
	if (strict)
		assert_true(nodes <= 2 * radix_owner_count(r));
}

/* Collects radix_match_each's calls per owner, owners being slots of an
 * array of ints. */
struct collect {
	int *base;
	size_t count;
	size_t *matched;
	int *visits;
};

static void collect_fn(void *owner, size_t matched, void *ctx)
{
	struct collect *c = ctx;
	size_t i = (size_t)((int *)owner - c->base);

	assert_true(i < c->count);
	c->matched[i] = matched;
	c->visits[i]++;
}

static int slots[16];
#define O(i) ((void *)&slots[i])

static size_t match_one(const struct radix *r, const token_t *q, size_t n, int owner)
{
	size_t matched[16];
	int visits[16] = {0};
	struct collect c = {slots, 16, matched, visits};

	radix_match_each(r, q, n, collect_fn, &c);
	assert_int_equal(visits[owner], 1);
	return matched[owner];
}

/* --- Tests. --- */

static void test_empty(void **state)
{
	struct radix *r = radix_new();
	token_t q[] = {1, 2, 3};
	void *best = O(0);
	int visits[16] = {0};
	size_t matched[16];
	struct collect c = {slots, 16, matched, visits};

	assert_non_null(r);
	assert_int_equal(radix_owner_count(r), 0);
	assert_int_equal(radix_node_count(r), 0);
	assert_int_equal(radix_longest_prefix(r, q, 3, &best), 0);
	assert_null(best);
	assert_int_equal(radix_longest_prefix(r, NULL, 0, NULL), 0);
	radix_match_each(r, q, 3, collect_fn, &c);
	for (int i = 0; i < 16; i++)
		assert_int_equal(visits[i], 0);
	assert_int_equal(radix_remove(r, q, 3, O(0)), -1);
	assert_int_equal(radix_remove(r, NULL, 0, O(0)), -1);
	check_tree(r, 1);
	assert_int_equal(radix_memory_bytes(r), sizeof(struct radix));
	radix_free(r);
	radix_free(NULL);
	assert_int_equal(t_live_bytes, 0);
}

static void test_single(void **state)
{
	struct radix *r = radix_new();
	token_t s[] = {10, 20, 30, 40};
	token_t q1[] = {10, 20, 99};
	token_t q2[] = {10, 20, 30, 40, 50};
	token_t q3[] = {7};
	void *best = NULL;

	assert_int_equal(radix_insert(r, s, 4, O(1)), 0);
	assert_int_equal(radix_owner_count(r), 1);
	assert_int_equal(radix_node_count(r), 1);
	check_tree(r, 1);

	assert_int_equal(radix_longest_prefix(r, s, 4, &best), 4);
	assert_ptr_equal(best, O(1));
	assert_int_equal(radix_longest_prefix(r, q1, 3, &best), 2);
	assert_ptr_equal(best, O(1));
	assert_int_equal(radix_longest_prefix(r, q2, 5, &best), 4);
	assert_int_equal(radix_longest_prefix(r, s, 2, &best), 2);
	assert_int_equal(radix_longest_prefix(r, q3, 1, &best), 0);
	/* Every owner shares the empty prefix: one is still named. */
	assert_ptr_equal(best, O(1));
	assert_int_equal(match_one(r, q1, 3, 1), 2);
	assert_int_equal(match_one(r, q2, 5, 1), 4);
	assert_int_equal(match_one(r, q3, 1, 1), 0);
	assert_int_equal(match_one(r, NULL, 0, 1), 0);

	assert_int_equal(radix_remove(r, s, 4, O(1)), 0);
	assert_int_equal(radix_owner_count(r), 0);
	assert_int_equal(radix_node_count(r), 0);
	check_tree(r, 1);
	assert_int_equal(radix_memory_bytes(r), sizeof(struct radix));
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_branching(void **state)
{
	struct radix *r = radix_new();
	token_t a[] = {1, 2, 3, 4, 5, 6};
	token_t b[] = {1, 2, 3, 7, 8};
	token_t c[] = {1, 2, 9};
	token_t d[] = {5, 5};
	token_t q[] = {1, 2, 3, 7, 0};
	void *best = NULL;

	assert_int_equal(radix_insert(r, a, 6, O(0)), 0);
	assert_int_equal(radix_insert(r, b, 5, O(1)), 0);
	/* [1 2 3] -> {[4 5 6], [7 8]} */
	assert_int_equal(radix_node_count(r), 3);
	assert_int_equal(radix_insert(r, c, 3, O(2)), 0);
	/* [1 2] -> {[3] -> {[4 5 6], [7 8]}, [9]} */
	assert_int_equal(radix_node_count(r), 5);
	assert_int_equal(radix_insert(r, d, 2, O(3)), 0);
	assert_int_equal(radix_node_count(r), 6);
	assert_int_equal(radix_owner_count(r), 4);
	check_tree(r, 1);

	assert_int_equal(radix_longest_prefix(r, q, 5, &best), 4);
	assert_ptr_equal(best, O(1));
	assert_int_equal(radix_longest_prefix(r, a, 6, &best), 6);
	assert_ptr_equal(best, O(0));
	assert_int_equal(radix_longest_prefix(r, c, 3, &best), 3);
	assert_ptr_equal(best, O(2));
	assert_int_equal(radix_longest_prefix(r, d, 1, &best), 1);
	assert_ptr_equal(best, O(3));

	assert_int_equal(match_one(r, q, 5, 0), 3);
	assert_int_equal(match_one(r, q, 5, 1), 4);
	assert_int_equal(match_one(r, q, 5, 2), 2);
	assert_int_equal(match_one(r, q, 5, 3), 0);
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_identical_sequences(void **state)
{
	struct radix *r = radix_new();
	token_t s[] = {4, 8, 15, 16, 23, 42};
	void *best = NULL;

	assert_int_equal(radix_insert(r, s, 6, O(0)), 0);
	assert_int_equal(radix_insert(r, s, 6, O(1)), 0);
	assert_int_equal(radix_node_count(r), 1);
	assert_int_equal(radix_owner_count(r), 2);
	check_tree(r, 1);
	assert_int_equal(match_one(r, s, 6, 0), 6);
	assert_int_equal(match_one(r, s, 6, 1), 6);
	assert_int_equal(radix_longest_prefix(r, s, 6, &best), 6);
	assert_true(best == O(0) || best == O(1));

	assert_int_equal(radix_remove(r, s, 6, O(0)), 0);
	assert_int_equal(radix_node_count(r), 1);
	assert_int_equal(radix_longest_prefix(r, s, 6, &best), 6);
	assert_ptr_equal(best, O(1));
	/* O(0) is gone now, and was never held twice. */
	assert_int_equal(radix_remove(r, s, 6, O(0)), -1);
	assert_int_equal(radix_remove(r, s, 6, O(1)), 0);
	assert_int_equal(radix_node_count(r), 0);
	check_tree(r, 1);
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_prefix_of_another(void **state)
{
	struct radix *r = radix_new();
	token_t s[] = {1, 2, 3, 4, 5, 6, 7, 8};
	void *best = NULL;

	/* Longer first, then its prefix: the edge is split at the end of the
	 * prefix, and the new node ends a sequence. */
	assert_int_equal(radix_insert(r, s, 8, O(0)), 0);
	assert_int_equal(radix_insert(r, s, 3, O(1)), 0);
	assert_int_equal(radix_node_count(r), 2);
	check_tree(r, 1);
	assert_int_equal(radix_longest_prefix(r, s, 3, &best), 3);
	/* Both achieve 3; the one whose sequence ends there is preferred. */
	assert_ptr_equal(best, O(1));
	assert_int_equal(radix_longest_prefix(r, s, 5, &best), 5);
	assert_ptr_equal(best, O(0));
	assert_int_equal(match_one(r, s, 8, 1), 3);
	assert_int_equal(match_one(r, s, 2, 0), 2);
	assert_int_equal(match_one(r, s, 2, 1), 2);

	/* Shorter first, then the longer: a leaf below it, no split. */
	assert_int_equal(radix_insert(r, s, 5, O(2)), 0);
	assert_int_equal(radix_node_count(r), 3);
	check_tree(r, 1);
	assert_int_equal(radix_insert(r, s, 6, O(3)), 0);
	assert_int_equal(radix_node_count(r), 4);
	assert_int_equal(match_one(r, s, 8, 3), 6);
	assert_int_equal(match_one(r, s, 8, 2), 5);
	check_tree(r, 1);
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_remove_remerges(void **state)
{
	struct radix *r = radix_new();
	token_t a[] = {1, 2, 3, 4};
	token_t b[] = {1, 2, 5, 6};
	token_t c[] = {1, 2};
	token_t d[] = {1, 2, 3, 4, 7};
	void *best = NULL;

	assert_int_equal(radix_insert(r, a, 4, O(0)), 0);
	assert_int_equal(radix_node_count(r), 1); /* [1 2 3 4] */
	assert_int_equal(radix_insert(r, b, 4, O(1)), 0);
	assert_int_equal(radix_node_count(r), 3); /* [1 2] -> {[3 4], [5 6]} */
	assert_int_equal(radix_insert(r, c, 2, O(2)), 0);
	assert_int_equal(radix_node_count(r), 3); /* owner on [1 2] */
	assert_int_equal(radix_insert(r, d, 5, O(3)), 0);
	assert_int_equal(radix_node_count(r), 4); /* [3 4] -> {[7]} */
	check_tree(r, 1);

	/* [1 2] keeps two children: stays. */
	assert_int_equal(radix_remove(r, c, 2, O(2)), 0);
	assert_int_equal(radix_node_count(r), 4);
	check_tree(r, 1);
	/* [5 6] pruned; [1 2] left alone with [3 4]: merged into [1 2 3 4]. */
	assert_int_equal(radix_remove(r, b, 4, O(1)), 0);
	assert_int_equal(radix_node_count(r), 2);
	check_tree(r, 1);
	assert_int_equal(r->root.children[0].node->len, 4);
	/* [1 2 3 4] loses its owner, keeps [7]: merged into [1 2 3 4 7]. */
	assert_int_equal(radix_remove(r, a, 4, O(0)), 0);
	assert_int_equal(radix_node_count(r), 1);
	check_tree(r, 1);
	assert_int_equal(r->root.children[0].node->len, 5);
	assert_int_equal(radix_longest_prefix(r, d, 5, &best), 5);
	assert_ptr_equal(best, O(3));
	assert_int_equal(radix_longest_prefix(r, b, 4, &best), 2);
	assert_ptr_equal(best, O(3));

	assert_int_equal(radix_remove(r, d, 5, O(3)), 0);
	assert_int_equal(radix_node_count(r), 0);
	assert_int_equal(radix_owner_count(r), 0);
	check_tree(r, 1);
	assert_int_equal(radix_memory_bytes(r), sizeof(struct radix));
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_remove_missing(void **state)
{
	struct radix *r = radix_new();
	token_t a[] = {1, 2, 3, 4};
	token_t other[] = {1, 2, 3, 5};
	size_t bytes;

	assert_int_equal(radix_insert(r, a, 4, O(0)), 0);
	assert_int_equal(radix_insert(r, a, 2, O(1)), 0);
	bytes = radix_memory_bytes(r);
	assert_int_equal(radix_remove(r, a, 4, O(5)), -1);     /* owner not there */
	assert_int_equal(radix_remove(r, a, 4, O(1)), -1);     /* wrong sequence */
	assert_int_equal(radix_remove(r, a, 3, O(0)), -1);     /* ends mid-edge */
	assert_int_equal(radix_remove(r, other, 4, O(0)), -1); /* diverges */
	assert_int_equal(radix_remove(r, a, 0, O(0)), -1);     /* empty */
	token_t longer[] = {1, 2, 3, 4, 5};
	assert_int_equal(radix_remove(r, longer, 5, O(0)), -1); /* runs past */
	assert_int_equal(radix_owner_count(r), 2);
	assert_int_equal(radix_node_count(r), 2);
	assert_int_equal(radix_memory_bytes(r), bytes);
	check_tree(r, 1);
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_empty_sequences(void **state)
{
	struct radix *r = radix_new();
	token_t a[] = {3, 1, 4};
	void *best = NULL;

	assert_int_equal(radix_insert(r, NULL, 0, O(0)), 0);
	assert_int_equal(radix_insert(r, a, 0, O(1)), 0);
	assert_int_equal(radix_owner_count(r), 2);
	assert_int_equal(radix_node_count(r), 0); /* they live on the root */
	assert_int_equal(radix_longest_prefix(r, a, 3, &best), 0);
	assert_true(best == O(0) || best == O(1));
	assert_int_equal(match_one(r, a, 3, 0), 0);
	assert_int_equal(match_one(r, NULL, 0, 1), 0);

	assert_int_equal(radix_insert(r, a, 3, O(2)), 0);
	assert_int_equal(radix_longest_prefix(r, a, 3, &best), 3);
	assert_ptr_equal(best, O(2));
	/* An empty query matches nothing; an owner at the root is preferred. */
	assert_int_equal(radix_longest_prefix(r, NULL, 0, &best), 0);
	assert_true(best == O(0) || best == O(1));
	check_tree(r, 1);

	assert_int_equal(radix_remove(r, NULL, 0, O(0)), 0);
	assert_int_equal(radix_remove(r, NULL, 0, O(0)), -1);
	assert_int_equal(radix_remove(r, NULL, 0, O(1)), 0);
	assert_int_equal(radix_node_count(r), 1);
	/* The root never merges, even when left with one child and no owner. */
	check_tree(r, 1);
	assert_int_equal(radix_remove(r, a, 3, O(2)), 0);
	assert_int_equal(radix_memory_bytes(r), sizeof(struct radix));
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_long_sequence(void **state)
{
	enum { N = 100000 };
	struct radix *r = radix_new();
	token_t *s = malloc(N * sizeof(*s));
	token_t *q = malloc(N * sizeof(*q));
	void *best = NULL;
	double t0, elapsed;
	size_t got = 0;

	assert_non_null(s);
	assert_non_null(q);
	rng_state = 0x5eed10f9;
	for (size_t i = 0; i < N; i++)
		s[i] = (token_t)rng_below(150000);
	memcpy(q, s, N * sizeof(*q));

	assert_int_equal(radix_insert(r, s, N, O(0)), 0);
	/* A second owner sharing the first 60001 tokens, then diverging. */
	q[60001] = -1;
	assert_int_equal(radix_insert(r, q, N, O(1)), 0);
	assert_int_equal(radix_node_count(r), 3);
	check_tree(r, 1);
	q[60001] = s[60001];
	q[N - 1] = -2;

	t0 = now_seconds();
	for (int i = 0; i < 100; i++)
		got += radix_longest_prefix(r, q, N, &best);
	elapsed = (now_seconds() - t0) / 100;
	assert_int_equal(got, 100 * (size_t)(N - 1));
	assert_ptr_equal(best, O(0));
	assert_int_equal(match_one(r, q, N, 1), 60001);
	assert_int_equal(match_one(r, q, N, 0), N - 1);
	/* Generous, for sanitizers and loaded CI machines: the real figure is
	 * some tens of microseconds. */
	assert_true(elapsed < 0.05);
	print_message("radix: 100k-token lookup %.1f us\n", elapsed * 1e6);

	assert_int_equal(radix_remove(r, s, N, O(0)), 0);
	assert_int_equal(radix_node_count(r), 1);
	q[60001] = -1;
	q[N - 1] = s[N - 1];
	assert_int_equal(radix_remove(r, q, N, O(1)), 0);
	assert_int_equal(radix_node_count(r), 0);
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
	free(s);
	free(q);
}

/* --- Randomised comparison against brute force. --- */

enum {
	R_OWNERS = 200,
	R_BASES = 6,
	R_BASE_LEN = 400,
	R_ALPHABET = 4,
	R_TAIL = 40,
};

struct model {
	token_t bases[R_BASES][R_BASE_LEN];
	token_t *seq[R_OWNERS];
	size_t len[R_OWNERS];
	int held[R_OWNERS];
	int ids[R_OWNERS]; /* the owners: their addresses */
	size_t matched[R_OWNERS];
	int visits[R_OWNERS];
};

/* A sequence drawn to share prefixes often: a prefix of one of a few base
 * "prompts", then a short random tail, all over a tiny alphabet so that
 * tails collide too. Returns its length; out has room for R_BASE_LEN +
 * R_TAIL tokens. */
static size_t random_sequence(struct model *m, token_t *out)
{
	size_t n = 0, cut, tail;

	switch (rng_below(8)) {
	case 0:
		return 0;
	case 1:
		/* Often an exact copy, or a prefix, of one already stored. */
		{
			size_t o = rng_below(R_OWNERS);

			if (m->seq[o]) {
				n = rng_below(4) ? m->len[o] : rng_below(m->len[o] + 1);
				memcpy(out, m->seq[o], n * sizeof(*out));
				return n;
			}
		}
		break;
	default:
		break;
	}
	cut = rng_below(R_BASE_LEN + 1);
	memcpy(out, m->bases[rng_below(R_BASES)], cut * sizeof(*out));
	n = cut;
	tail = rng_below(R_TAIL + 1);
	for (size_t i = 0; i < tail; i++)
		out[n++] = (token_t)rng_below(R_ALPHABET);
	return n;
}

static void model_check_query(struct model *m, const struct radix *r, const token_t *q, size_t n)
{
	struct collect c = {m->ids, R_OWNERS, m->matched, m->visits};
	size_t best_len = 0, got;
	void *best = NULL;
	int any = 0;

	memset(m->visits, 0, sizeof(m->visits));
	radix_match_each(r, q, n, collect_fn, &c);
	for (size_t o = 0; o < R_OWNERS; o++) {
		if (!m->held[o]) {
			assert_int_equal(m->visits[o], 0);
			continue;
		}
		size_t want = lcp(m->seq[o], m->len[o], q, n);

		assert_int_equal(m->visits[o], 1);
		assert_int_equal(m->matched[o], want);
		if (want > best_len)
			best_len = want;
		any = 1;
	}
	got = radix_longest_prefix(r, q, n, &best);
	assert_int_equal(got, best_len);
	if (!any) {
		assert_null(best);
		return;
	}
	assert_non_null(best);
	size_t o = (size_t)((int *)best - m->ids);

	assert_true(o < R_OWNERS);
	assert_true(m->held[o]);
	assert_int_equal(lcp(m->seq[o], m->len[o], q, n), best_len);
}

static void model_record(struct model *m, size_t o, const token_t *seq, size_t n)
{
	free(m->seq[o]);
	m->seq[o] = malloc((n ? n : 1) * sizeof(token_t));
	assert_non_null(m->seq[o]);
	memcpy(m->seq[o], seq, n * sizeof(token_t));
	m->len[o] = n;
	m->held[o] = 1;
}

/* Runs ops random operations against r and the model, checking the tree
 * after each. With fail_permil set, allocations fail at that rate: a failed
 * insert must leave the tree as it was. Unless strict is set, the compressed
 * property is only checked loosely: a merge may have been refused memory. */
static void run_random(struct model *m, struct radix *r, int ops, unsigned fail_permil, int strict)
{
	token_t buf[R_BASE_LEN + R_TAIL];
	int failed_inserts = 0;

	for (int op = 0; op < ops; op++) {
		size_t o = rng_below(R_OWNERS);
		unsigned kind = (unsigned)rng_below(10);

		t_fail_permil = fail_permil;
		if (kind < 4 && !m->held[o]) {
			size_t n = random_sequence(m, buf);

			if (radix_insert(r, buf, n, &m->ids[o]) == 0) {
				model_record(m, o, buf, n);
			} else {
				assert_true(fail_permil > 0);
				failed_inserts++;
			}
		} else if (kind < 7 && m->held[o]) {
			/* Sometimes the wrong tokens first: must be refused. */
			if (rng_below(4) == 0 && m->len[o] > 0) {
				memcpy(buf, m->seq[o], m->len[o] * sizeof(token_t));
				buf[rng_below(m->len[o])] = R_ALPHABET + 1;
				assert_int_equal(radix_remove(r, buf, m->len[o], &m->ids[o]), -1);
				assert_int_equal(
				    radix_remove(r, m->seq[o], m->len[o] - 1, &m->ids[o]), -1);
			}
			assert_int_equal(radix_remove(r, m->seq[o], m->len[o], &m->ids[o]), 0);
			m->held[o] = 0;
		} else if (kind < 7) {
			size_t n = random_sequence(m, buf);

			assert_int_equal(radix_remove(r, buf, n, &m->ids[o]), -1);
		} else {
			size_t n = random_sequence(m, buf);

			t_fail_permil = 0;
			model_check_query(m, r, buf, n);
		}
		t_fail_permil = 0;
		check_tree(r, strict);
	}
	if (fail_permil)
		print_message("radix: %d inserts refused memory, tree intact\n", failed_inserts);
}

static void model_init(struct model *m, uint64_t seed)
{
	memset(m, 0, sizeof(*m));
	rng_state = seed;
	for (int b = 0; b < R_BASES; b++) {
		/* Bases share their first tokens with each other too. */
		for (int i = 0; i < R_BASE_LEN; i++)
			m->bases[b][i] =
			    i < 20 * b ? m->bases[0][i] : (token_t)rng_below(R_ALPHABET);
	}
}

static void model_finish(struct model *m, struct radix *r)
{
	/* Drain everything: the tree must come back to nothing. */
	for (size_t o = 0; o < R_OWNERS; o++) {
		if (m->held[o])
			assert_int_equal(radix_remove(r, m->seq[o], m->len[o], &m->ids[o]), 0);
		free(m->seq[o]);
	}
	assert_int_equal(radix_owner_count(r), 0);
	assert_int_equal(radix_node_count(r), 0);
	assert_int_equal(radix_memory_bytes(r), sizeof(struct radix));
	radix_free(r);
	assert_int_equal(t_live_bytes, 0);
}

static void test_randomized(void **state)
{
	struct model *m = malloc(sizeof(*m));
	struct radix *r;

	assert_non_null(m);
	model_init(m, 0x70c1eec0ffeeULL);
	r = radix_new();
	assert_non_null(r);
	run_random(m, r, 6000, 0, 1);
	print_message("radix: random run ended with %zu owners, %zu nodes\n", radix_owner_count(r),
	              radix_node_count(r));
	model_finish(m, r);
	free(m);
}

static void test_out_of_memory(void **state)
{
	struct model *m = malloc(sizeof(*m));
	struct radix *r;
	int refused = 0;

	assert_non_null(m);
	/* radix_new itself. */
	t_fail_permil = 1000;
	assert_null(radix_new());
	t_fail_permil = 0;
	assert_int_equal(t_live_bytes, 0);

	model_init(m, 0xdeadbeefULL);
	t_fail_state = 42;
	r = radix_new();
	assert_non_null(r);
	/* One allocation in five fails. After every operation the tree must
	 * agree with the model (inserts that failed left no trace) and the
	 * memory count must stay exact. */
	run_random(m, r, 4000, 200, 0);
	print_message("radix: %zu merges left pending by refused memory\n",
	              count_unmerged(r, &r->root));
	/* Then with memory back, removals below a refused merge retry it, and
	 * draining must still free everything. */
	run_random(m, r, 500, 0, 0);
	/* With no memory at all, every insertion that needs some is refused
	 * and leaves the tree exactly as it was, down to the byte. */
	for (size_t o = 0; o < R_OWNERS; o++) {
		token_t buf[R_BASE_LEN + R_TAIL];
		size_t n, bytes = radix_memory_bytes(r), nodes = radix_node_count(r);
		int rc;

		if (m->held[o])
			continue;
		n = random_sequence(m, buf);
		t_fail_permil = 1000;
		rc = radix_insert(r, buf, n, &m->ids[o]);
		t_fail_permil = 0;
		assert_int_equal(radix_memory_bytes(r), bytes);
		assert_int_equal(radix_node_count(r), nodes);
		if (rc == 0) {
			/* It ended on a node with room for one more owner. */
			model_record(m, o, buf, n);
		} else {
			assert_int_equal(rc, -1);
			refused++;
		}
		model_check_query(m, r, buf, n);
	}
	assert_true(refused > 0);
	check_tree(r, 0);
	model_finish(m, r);
	free(m);
}

/* --- Benchmark (printed, not asserted). --- */

static void test_benchmark(void **state)
{
	enum { OWNERS = 16, LEN = 32768, SHARED = 2048, ITER = 2000 };
	struct radix *r = radix_new();
	token_t *seqs = malloc((size_t)OWNERS * LEN * sizeof(token_t));
	token_t *q = malloc(LEN * sizeof(token_t));
	size_t stored, sink = 0, counted = 0;
	double t0, lp, me;
	void *best = NULL;

	assert_non_null(seqs);
	assert_non_null(q);
	/* Sixteen slots sharing a system prompt, each then on its own
	 * conversation; the query is one conversation carried on by a turn.
	 * That walks the full 32k tokens: the worst case for a hit. */
	rng_state = 0xbe7c4;
	for (size_t i = 0; i < LEN; i++)
		seqs[i] = (token_t)rng_below(32000);
	for (size_t o = 1; o < OWNERS; o++) {
		memcpy(seqs + o * LEN, seqs, SHARED * sizeof(token_t));
		for (size_t i = SHARED; i < LEN; i++)
			seqs[o * LEN + i] = (token_t)rng_below(32000);
	}
	for (size_t o = 0; o < OWNERS; o++)
		assert_int_equal(radix_insert(r, seqs + o * LEN, LEN - 512, &slots[o]), 0);
	memcpy(q, seqs + 7 * LEN, LEN * sizeof(token_t));

	t0 = now_seconds();
	for (int i = 0; i < ITER; i++)
		sink += radix_longest_prefix(r, q, LEN, &best);
	lp = (now_seconds() - t0) / ITER;
	assert_int_equal(sink, (size_t)ITER * (LEN - 512));
	assert_ptr_equal(best, &slots[7]);

	t0 = now_seconds();
	for (int i = 0; i < ITER; i++) {
		size_t matched[16];
		int visits[16] = {0};
		struct collect c = {slots, 16, matched, visits};

		radix_match_each(r, q, LEN, collect_fn, &c);
		counted += (size_t)visits[0];
	}
	me = (now_seconds() - t0) / ITER;
	assert_int_equal(counted, ITER);

	stored = SHARED + OWNERS * (LEN - 512 - SHARED);
	print_message("radix bench: 32k-token query, 16 owners: longest_prefix %.2f us, "
	              "match_each %.2f us\n",
	              lp * 1e6, me * 1e6);
	print_message("radix bench: %zu nodes, %zu bytes for %zu distinct tokens "
	              "(%.4f bytes/token; %.4f over the 4 of the token itself)\n",
	              radix_node_count(r), radix_memory_bytes(r), stored,
	              (double)radix_memory_bytes(r) / (double)stored,
	              (double)radix_memory_bytes(r) / (double)stored - 4.0);
	radix_free(r);
	free(seqs);
	free(q);
	assert_int_equal(t_live_bytes, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_empty),
	    cmocka_unit_test(test_single),
	    cmocka_unit_test(test_branching),
	    cmocka_unit_test(test_identical_sequences),
	    cmocka_unit_test(test_prefix_of_another),
	    cmocka_unit_test(test_remove_remerges),
	    cmocka_unit_test(test_remove_missing),
	    cmocka_unit_test(test_empty_sequences),
	    cmocka_unit_test(test_long_sequence),
	    cmocka_unit_test(test_randomized),
	    cmocka_unit_test(test_out_of_memory),
	    cmocka_unit_test(test_benchmark),
	};

	return cmocka_run_group_tests_name("radix", tests, NULL, NULL);
}
