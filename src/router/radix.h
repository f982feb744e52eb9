/* A compressed radix tree (patricia trie) over token sequences.
 *
 * The router keeps one of these per model: each backend slot (and later each
 * KV state saved on disk) is an opaque owner whose sequence is the token
 * prefix its KV cache holds. Asking the tree for the longest common prefix
 * of an incoming prompt tells the router which slot can reuse the most of
 * its cache.
 *
 * Several owners may hold the same or overlapping sequences; one owner holds
 * at most one sequence in a given tree. Sequences are long (up to ~128k
 * tokens) while owners are few (a few to a few thousand), so the tree is
 * built for long edges and short fan-out: every edge label is a token array,
 * and every node other than the root either ends some owner's sequence or
 * branches, which bounds the nodes by twice the number of owners.
 *
 * Costs, for a query or sequence of n tokens: radix_longest_prefix is
 * O(n + depth * log fanout), and radix_match_each adds the owners and nodes
 * off the query path; neither allocates. Insert and remove cost the same
 * walk plus, when they split or merge an edge, a copy of that one edge's
 * label (a memcpy, however long the edge). Memory is the distinct tokens
 * (4 bytes each, shared prefixes stored once) plus 60 to 100 bytes a node.
 * Not thread-safe: the caller serialises access.
 */
#ifndef TOKI_ROUTER_RADIX_H
#define TOKI_ROUTER_RADIX_H

#include <stddef.h>
#include <stdint.h>

#ifndef TOKI_TOKEN_T
#define TOKI_TOKEN_T
typedef int32_t token_t;
#endif

struct radix;

/* A new empty tree, or NULL when out of memory. Free with radix_free. */
struct radix *radix_new(void);

/* Frees the tree and everything it allocated; the owners are not touched.
 * NULL is accepted. */
void radix_free(struct radix *r);

/* Stores seq[0..n) for owner; n may be 0 (seq may then be NULL). The caller
 * must first remove any earlier sequence of that owner: an owner inserted
 * twice is held twice. Returns 0, or -1 when out of memory, in which case the
 * tree is left exactly as it was. */
int radix_insert(struct radix *r, const token_t *seq, size_t n, void *owner);

/* Removes owner's sequence; the caller passes the same tokens it inserted.
 * Returns 0, or -1 when owner holds no sequence equal to seq[0..n). Empty
 * nodes are pruned and a node left with one child and no owners is merged
 * into that child, so the tree stays compressed. Never fails for lack of
 * memory: should a merge find none, the two nodes simply stay apart, which
 * costs a node but changes no answer. */
int radix_remove(struct radix *r, const token_t *seq, size_t n, void *owner);

/* The length of the longest common prefix of q[0..n) with any stored
 * sequence. If best_owner is not NULL it is set to an owner whose sequence
 * achieves that length, preferring one whose sequence ends exactly there
 * (nothing of its cache would be discarded), or to NULL if the tree holds no
 * sequence at all. */
size_t radix_longest_prefix(const struct radix *r, const token_t *q, size_t n, void **best_owner);

/* Called once per owner by radix_match_each, with the length of the common
 * prefix of the query and that owner's sequence. It must not modify the
 * tree. */
typedef void (*radix_visit_fn)(void *owner, size_t matched, void *ctx);

/* Visits every owner in the tree with its common prefix length against
 * q[0..n), in no particular order. Owners off the query path are reached by
 * walking their subtrees, not by comparing their tokens, so the cost is
 * O(n + nodes off the query path), not O(owners * n). */
void radix_match_each(const struct radix *r, const token_t *q, size_t n, radix_visit_fn fn,
                      void *ctx);

/* How many sequences the tree holds. */
size_t radix_owner_count(const struct radix *r);

/* How many nodes the tree holds, not counting the root: 0 when empty, 1 for a
 * single sequence, and at most twice the number of owners. */
size_t radix_node_count(const struct radix *r);

/* Bytes the tree has allocated for itself: nodes, labels and arrays, as
 * requested from the allocator (its own bookkeeping overhead is not seen). */
size_t radix_memory_bytes(const struct radix *r);

#endif
