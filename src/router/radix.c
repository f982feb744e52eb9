/* Compressed radix tree over token sequences; see radix.h for the contract.
 *
 * Shape: the root has an empty label; every other node has a label of at
 * least one token, the tokens on the edge from its parent. A node's children
 * are kept in an array sorted by the first token of their labels, which is
 * copied into the array so a binary search touches one cache line instead of
 * one node per probe. Owners whose sequence ends at a node are kept in a
 * small unordered array on that node.
 *
 * Invariant (the "compressed" property): a node other than the root either
 * has owners or has at least two children. Insert keeps it by splitting an
 * edge where a new sequence leaves it; remove keeps it by pruning nodes left
 * empty and merging a node left with one child into that child. The one
 * exception is a merge that cannot get memory: the two nodes then stay apart,
 * which the lookups do not mind, until a later removal below them retries.
 *
 * Nodes point to their parents so that removal can prune upward and subtree
 * walks can climb back without a stack: nothing here needs memory it might
 * not get, except the insertions, which allocate everything before they
 * change anything, so a failure leaves the tree as it was.
 */
#include "router/radix.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The allocator, overridable as redis's rax_malloc.h does it, so the unit
 * test can compile this file with an allocator that counts bytes and fails
 * on request. */
#ifndef RADIX_MALLOC
#define RADIX_MALLOC(size) malloc(size)
#define RADIX_REALLOC(ptr, size) realloc(ptr, size)
#define RADIX_FREE(ptr) free(ptr)
#endif

/* Tokens compared per memcmp call when matching along an edge: long enough
 * for libc's vectorised memcmp to pay off, short enough that the token-wise
 * scan of the block that differs stays cheap. */
#define RADIX_BLOCK 64

struct radix_edge {
	token_t first; /* == node->label[0], kept here for the binary search */
	struct radix_node *node;
};

struct radix_node {
	struct radix_node *parent;   /* NULL only for the root */
	token_t *label;              /* owned; NULL for the root only */
	size_t len;                  /* tokens in label; >= 1 except for the root */
	struct radix_edge *children; /* owned; sorted by first, distinct */
	void **owners;               /* owned; sequences ending here, any order */
	uint32_t nchildren, children_cap;
	uint32_t nowners, owners_cap;
};

struct radix {
	struct radix_node root; /* embedded: an empty tree costs one allocation */
	size_t owners;          /* sequences held */
	size_t nodes;           /* nodes, not counting the root */
	size_t bytes;           /* bytes allocated, this struct included */
};

/* --- Allocation, with every byte accounted in r->bytes. --- */

static void *rx_alloc(struct radix *r, size_t size)
{
	void *p = RADIX_MALLOC(size);

	if (p)
		r->bytes += size;
	return p;
}

/* Like realloc, old_size being what p was allocated with. new_size must not
 * be 0: realloc's behaviour there is implementation-defined. */
static void *rx_resize(struct radix *r, void *p, size_t old_size, size_t new_size)
{
	void *q = RADIX_REALLOC(p, new_size);

	if (q)
		r->bytes = r->bytes - old_size + new_size;
	return q;
}

static void rx_release(struct radix *r, void *p, size_t size)
{
	if (!p)
		return;
	RADIX_FREE(p);
	r->bytes -= size;
}

/* A copy of tokens[0..n), n >= 1, or NULL when out of memory. */
static token_t *rx_tokens_dup(struct radix *r, const token_t *tokens, size_t n)
{
	token_t *copy;

	if (n > SIZE_MAX / sizeof(token_t))
		return NULL;
	copy = rx_alloc(r, n * sizeof(token_t));
	if (copy)
		memcpy(copy, tokens, n * sizeof(token_t));
	return copy;
}

/* A detached node labelled with a copy of label[0..len), len >= 1. */
static struct radix_node *rx_node_new(struct radix *r, const token_t *label, size_t len)
{
	struct radix_node *x = rx_alloc(r, sizeof(*x));

	if (!x)
		return NULL;
	memset(x, 0, sizeof(*x));
	x->label = rx_tokens_dup(r, label, len);
	if (!x->label) {
		rx_release(r, x, sizeof(*x));
		return NULL;
	}
	x->len = len;
	r->nodes++;
	return x;
}

/* Frees x's own allocations, not its children: they belong to the caller by
 * then (moved elsewhere, or freed one by one). */
static void rx_node_free(struct radix *r, struct radix_node *x)
{
	rx_release(r, x->label, x->len * sizeof(token_t));
	rx_release(r, x->children, x->children_cap * sizeof(*x->children));
	rx_release(r, x->owners, x->owners_cap * sizeof(*x->owners));
	rx_release(r, x, sizeof(*x));
	r->nodes--;
}

/* Makes room for one more owner on x. Doubling keeps appends amortised O(1)
 * for the rare node many owners share. */
static int rx_owners_reserve(struct radix *r, struct radix_node *x)
{
	uint32_t cap;
	void **owners;

	if (x->nowners < x->owners_cap)
		return 0;
	if (x->owners_cap > UINT32_MAX / 2)
		return -1;
	cap = x->owners_cap ? x->owners_cap * 2 : 1;
	owners = rx_resize(r, x->owners, x->owners_cap * sizeof(*owners), cap * sizeof(*owners));
	if (!owners)
		return -1;
	x->owners = owners;
	x->owners_cap = cap;
	return 0;
}

static int rx_children_reserve(struct radix *r, struct radix_node *x, uint32_t want)
{
	uint32_t cap = x->children_cap;
	struct radix_edge *children;

	if (want <= cap)
		return 0;
	/* Two to start: a node is created with a child only by a split, which
	 * gives it two at once. */
	if (cap == 0)
		cap = 2;
	while (cap < want) {
		if (cap > UINT32_MAX / 2)
			return -1;
		cap *= 2;
	}
	children =
	    rx_resize(r, x->children, x->children_cap * sizeof(*children), cap * sizeof(*children));
	if (!children)
		return -1;
	x->children = children;
	x->children_cap = cap;
	return 0;
}

/* Gives back most of an array that has emptied out: only below a quarter
 * full, so that add/remove at the boundary cannot thrash. Best effort: if the
 * smaller block cannot be had, the larger one is simply kept. */
static void rx_owners_shrink(struct radix *r, struct radix_node *x)
{
	void **owners;

	if (x->nowners == 0) {
		rx_release(r, x->owners, x->owners_cap * sizeof(*x->owners));
		x->owners = NULL;
		x->owners_cap = 0;
		return;
	}
	if (x->nowners > x->owners_cap / 4)
		return;
	owners = rx_resize(r, x->owners, x->owners_cap * sizeof(*owners),
	                   x->owners_cap / 2 * sizeof(*owners));
	if (owners) {
		x->owners = owners;
		x->owners_cap /= 2;
	}
}

static void rx_children_shrink(struct radix *r, struct radix_node *x)
{
	struct radix_edge *children;

	if (x->nchildren == 0) {
		rx_release(r, x->children, x->children_cap * sizeof(*x->children));
		x->children = NULL;
		x->children_cap = 0;
		return;
	}
	if (x->children_cap <= 2 || x->nchildren > x->children_cap / 4)
		return;
	children = rx_resize(r, x->children, x->children_cap * sizeof(*children),
	                     x->children_cap / 2 * sizeof(*children));
	if (children) {
		x->children = children;
		x->children_cap /= 2;
	}
}

/* --- Searching. --- */

/* Index of x's child whose label starts with t, with *found set; or, when
 * there is none, the index where such a child would be inserted. */
static uint32_t rx_child_index(const struct radix_node *x, token_t t, bool *found)
{
	uint32_t lo = 0, hi = x->nchildren;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		token_t first = x->children[mid].first;

		if (first < t) {
			lo = mid + 1;
		} else if (first > t) {
			hi = mid;
		} else {
			*found = true;
			return mid;
		}
	}
	*found = false;
	return lo;
}

static struct radix_node *rx_child(const struct radix_node *x, token_t t)
{
	bool found;
	uint32_t i = rx_child_index(x, t, &found);

	return found ? x->children[i].node : NULL;
}

/* The length of the common prefix of a[0..n) and b[0..n). Whole blocks go
 * through memcmp, which libc vectorises; only the block that differs is
 * scanned token by token. Shared prompts run to tens of thousands of tokens,
 * so this loop is where lookups spend their time. */
static size_t rx_common_prefix(const token_t *a, const token_t *b, size_t n)
{
	size_t i = 0;

	while (n - i >= RADIX_BLOCK && memcmp(a + i, b + i, RADIX_BLOCK * sizeof(token_t)) == 0)
		i += RADIX_BLOCK;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

static size_t rx_min(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* An owner somewhere in x's subtree, preferring one at x itself; NULL only
 * for an empty root. Going down the first child always ends at an owner,
 * since every leaf other than the root has one. */
static void *rx_any_owner(const struct radix_node *x)
{
	while (x->nowners == 0 && x->nchildren > 0)
		x = x->children[0].node;
	return x->nowners ? x->owners[0] : NULL;
}

/* Calls fn(owner, matched) for every owner in top's subtree. Iterative, with
 * the parent pointers standing in for a stack: the depth can reach the
 * number of owners, and the lookups must not allocate. */
static void rx_visit_subtree(const struct radix_node *top, size_t matched, radix_visit_fn fn,
                             void *ctx)
{
	const struct radix_node *x = top;

	for (;;) {
		for (uint32_t i = 0; i < x->nowners; i++)
			fn(x->owners[i], matched, ctx);
		if (x->nchildren > 0) {
			x = x->children[0].node;
			continue;
		}
		/* A leaf: climb to the nearest ancestor with a next sibling. */
		for (;;) {
			const struct radix_node *p;
			bool found;
			uint32_t i;

			if (x == top)
				return;
			p = x->parent;
			i = rx_child_index(p, x->label[0], &found);
			if (i + 1 < p->nchildren) {
				x = p->children[i + 1].node;
				break;
			}
			x = p;
		}
	}
}

/* --- Public API. --- */

struct radix *radix_new(void)
{
	struct radix *r = RADIX_MALLOC(sizeof(*r));

	if (!r)
		return NULL;
	memset(r, 0, sizeof(*r));
	r->bytes = sizeof(*r);
	return r;
}

void radix_free(struct radix *r)
{
	struct radix_node *x;

	if (!r)
		return;
	/* Post-order without a stack: always descend into the last child, and
	 * free a node once it has none left, detaching it from its parent by
	 * dropping the parent's child count. */
	x = &r->root;
	for (;;) {
		struct radix_node *p;

		if (x->nchildren > 0) {
			x = x->children[x->nchildren - 1].node;
			continue;
		}
		if (x == &r->root)
			break;
		p = x->parent;
		p->nchildren--;
		rx_node_free(r, x);
		x = p;
	}
	RADIX_FREE(r->root.children);
	RADIX_FREE(r->root.owners);
	RADIX_FREE(r);
}

/* Adds a leaf for the rest of a sequence, seq[0..n) with n >= 1, under
 * parent at child index i. */
static int rx_insert_leaf(struct radix *r, struct radix_node *parent, uint32_t i,
                          const token_t *seq, size_t n, void *owner)
{
	struct radix_node *leaf = rx_node_new(r, seq, n);

	if (!leaf)
		return -1;
	if (rx_owners_reserve(r, leaf) < 0 ||
	    rx_children_reserve(r, parent, parent->nchildren + 1) < 0) {
		rx_node_free(r, leaf);
		return -1;
	}
	leaf->owners[leaf->nowners++] = owner;
	leaf->parent = parent;
	memmove(parent->children + i + 1, parent->children + i,
	        (parent->nchildren - i) * sizeof(*parent->children));
	parent->children[i] = (struct radix_edge){seq[0], leaf};
	parent->nchildren++;
	r->owners++;
	return 0;
}

/* The sequence leaves the edge to parent's child i after m tokens, 0 < m <
 * label length: a new node takes the first m tokens and gets the old child
 * (keeping the rest of its label) and either the owner itself, when the
 * sequence ends there (rest_n == 0), or a leaf for rest[0..rest_n). */
static int rx_insert_split(struct radix *r, struct radix_node *parent, uint32_t i, size_t m,
                           const token_t *rest, size_t rest_n, void *owner)
{
	struct radix_node *child = parent->children[i].node;
	struct radix_node *mid, *leaf = NULL;
	size_t suffix_n = child->len - m;
	token_t *suffix;

	/* Everything that can fail, first. */
	mid = rx_node_new(r, child->label, m);
	if (!mid)
		return -1;
	suffix = rx_tokens_dup(r, child->label + m, suffix_n);
	if (!suffix)
		goto fail_mid;
	if (rx_children_reserve(r, mid, 2) < 0)
		goto fail_suffix;
	if (rest_n > 0) {
		leaf = rx_node_new(r, rest, rest_n);
		if (!leaf)
			goto fail_suffix;
		if (rx_owners_reserve(r, leaf) < 0)
			goto fail_leaf;
	} else if (rx_owners_reserve(r, mid) < 0) {
		goto fail_suffix;
	}

	/* Then the changes, none of which can. */
	rx_release(r, child->label, child->len * sizeof(token_t));
	child->label = suffix;
	child->len = suffix_n;
	child->parent = mid;
	mid->parent = parent;
	/* The edge's first token is unchanged: mid's label starts as child's did. */
	parent->children[i].node = mid;
	mid->children[0] = (struct radix_edge){suffix[0], child};
	mid->nchildren = 1;
	if (leaf) {
		struct radix_edge e = {rest[0], leaf};

		/* rest[0] != suffix[0]: that is where the sequence left the edge. */
		if (e.first < suffix[0]) {
			mid->children[1] = mid->children[0];
			mid->children[0] = e;
		} else {
			mid->children[1] = e;
		}
		mid->nchildren = 2;
		leaf->parent = mid;
		leaf->owners[leaf->nowners++] = owner;
	} else {
		mid->owners[mid->nowners++] = owner;
	}
	r->owners++;
	return 0;

fail_leaf:
	rx_node_free(r, leaf);
fail_suffix:
	rx_release(r, suffix, suffix_n * sizeof(token_t));
fail_mid:
	rx_node_free(r, mid);
	return -1;
}

int radix_insert(struct radix *r, const token_t *seq, size_t n, void *owner)
{
	struct radix_node *x = &r->root;
	size_t pos = 0;

	for (;;) {
		struct radix_node *child;
		bool found;
		uint32_t i;
		size_t m;

		if (pos == n) {
			if (rx_owners_reserve(r, x) < 0)
				return -1;
			x->owners[x->nowners++] = owner;
			r->owners++;
			return 0;
		}
		i = rx_child_index(x, seq[pos], &found);
		if (!found)
			return rx_insert_leaf(r, x, i, seq + pos, n - pos, owner);
		child = x->children[i].node;
		m = rx_common_prefix(child->label, seq + pos, rx_min(child->len, n - pos));
		if (m < child->len)
			return rx_insert_split(r, x, i, m, seq + pos + m, n - pos - m, owner);
		x = child;
		pos += m;
	}
}

/* x, not the root, has no owners and one child: x's label is prepended to the
 * child's and the child takes x's place. */
static void rx_merge_into_child(struct radix *r, struct radix_node *x)
{
	struct radix_node *child = x->children[0].node;
	struct radix_node *p = x->parent;
	size_t len = x->len + child->len;
	token_t *label;
	bool found;
	uint32_t i;

	/* Grow x's label rather than the child's: the tokens are then appended,
	 * not shifted, and realloc may extend the block in place. */
	if (len > SIZE_MAX / sizeof(token_t))
		return;
	label = rx_resize(r, x->label, x->len * sizeof(token_t), len * sizeof(token_t));
	if (!label)
		return; /* stays split: still correct, one node more */
	memcpy(label + x->len, child->label, child->len * sizeof(token_t));
	rx_release(r, child->label, child->len * sizeof(token_t));
	child->label = label;
	child->len = len;
	child->parent = p;
	i = rx_child_index(p, label[0], &found);
	p->children[i].node = child;
	x->label = NULL;
	x->len = 0;
	x->nchildren = 0;
	rx_node_free(r, x);
}

/* Restores the invariant on the path from x up to the root after an owner
 * left x: a node left with nothing is pruned, and a node left with no owners
 * and a single child is merged into it. Pruning can cascade (the parent may
 * have been holding a merge that found no memory), and climbing all the way
 * up costs no more than the descent that found x, so every ancestor is looked
 * at: a merge that failed earlier is retried by any removal below it. */
static void rx_compress_upward(struct radix *r, struct radix_node *x)
{
	while (x != &r->root) {
		struct radix_node *p = x->parent;

		if (x->nowners == 0 && x->nchildren == 0) {
			bool found;
			uint32_t i = rx_child_index(p, x->label[0], &found);

			memmove(p->children + i, p->children + i + 1,
			        (p->nchildren - i - 1) * sizeof(*p->children));
			p->nchildren--;
			rx_children_shrink(r, p);
			rx_node_free(r, x);
		} else if (x->nowners == 0 && x->nchildren == 1) {
			rx_merge_into_child(r, x);
		}
		x = p;
	}
}

int radix_remove(struct radix *r, const token_t *seq, size_t n, void *owner)
{
	struct radix_node *x = &r->root;
	size_t pos = 0;
	uint32_t i;

	/* Find the node where exactly seq[0..n) ends. */
	while (pos < n) {
		struct radix_node *child = rx_child(x, seq[pos]);

		if (!child || child->len > n - pos ||
		    memcmp(child->label, seq + pos, child->len * sizeof(token_t)) != 0)
			return -1;
		x = child;
		pos += child->len;
	}
	for (i = 0; i < x->nowners && x->owners[i] != owner; i++)
		;
	if (i == x->nowners)
		return -1;
	/* Order among a node's owners means nothing: fill the hole from the end. */
	x->owners[i] = x->owners[--x->nowners];
	rx_owners_shrink(r, x);
	r->owners--;
	rx_compress_upward(r, x);
	return 0;
}

size_t radix_longest_prefix(const struct radix *r, const token_t *q, size_t n, void **best_owner)
{
	const struct radix_node *x = &r->root;
	size_t pos = 0;

	/* Descend while the query runs through whole edges. Where it stops, at
	 * x or part-way along the edge to a child, every owner below shares
	 * exactly pos tokens with it. */
	while (pos < n) {
		const struct radix_node *child = rx_child(x, q[pos]);
		size_t m;

		if (!child)
			break;
		m = rx_common_prefix(child->label, q + pos, rx_min(child->len, n - pos));
		pos += m;
		x = child;
		if (m < child->len)
			break;
	}
	if (best_owner)
		*best_owner = rx_any_owner(x);
	return pos;
}

void radix_match_each(const struct radix *r, const token_t *q, size_t n, radix_visit_fn fn,
                      void *ctx)
{
	const struct radix_node *x = &r->root;
	size_t pos = 0;

	/* Walk the query path. At each node, its own owners share pos tokens
	 * with the query, and so does everything under the children the query
	 * does not continue into; only the one it continues into is descended. */
	for (;;) {
		const struct radix_node *next = NULL;
		size_t m;

		for (uint32_t i = 0; i < x->nowners; i++)
			fn(x->owners[i], pos, ctx);
		for (uint32_t i = 0; i < x->nchildren; i++) {
			if (pos < n && x->children[i].first == q[pos])
				next = x->children[i].node;
			else
				rx_visit_subtree(x->children[i].node, pos, fn, ctx);
		}
		if (!next)
			return;
		m = rx_common_prefix(next->label, q + pos, rx_min(next->len, n - pos));
		if (m < next->len) {
			rx_visit_subtree(next, pos + m, fn, ctx);
			return;
		}
		x = next;
		pos += m;
	}
}

size_t radix_owner_count(const struct radix *r)
{
	return r->owners;
}

size_t radix_node_count(const struct radix *r)
{
	return r->nodes;
}

size_t radix_memory_bytes(const struct radix *r)
{
	return r->bytes;
}
