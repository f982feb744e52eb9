/* Exact mode's message starts for a chat request that llama-server
 * templates (a template it renders through a handler of its own, such as
 * GPT-OSS's, or one toki's engine does not match): the server renders the
 * whole prompt (/apply-template) and, at the same time, the prefixes of the
 * messages that can start a chunk (prompt/chat.h, chat_server_prefixes),
 * each without a generation prompt. A prefix's rendering that is a prefix of
 * the whole prompt gives a start where it ends, as toki's own renderings do
 * (chat_starts_add): the same prefix-stability rule.
 *
 * Each backend keeps the prefixes' renderings (an LRU of 1,024, 64 MiB) under
 * a hash of the request without its messages and of the messages before the
 * start, so that a conversation's next turn asks for the whole prompt and
 * one new prefix. A kept rendering that is no prefix of the whole prompt is
 * rendered again before it counts as none (the server's date may have
 * changed): a start is missing only where the server's own rendering says
 * so, so the schedule stays a function of the request. The kept renderings
 * go with the backend's prompt engine (a restart, a new discovery). */
#ifndef TOKI_BACKEND_PREFIX_RENDER_H
#define TOKI_BACKEND_PREFIX_RENDER_H

#include <stddef.h>

#include <jansson.h>

#include "backend/backend_http.h"

struct backend;
struct prefix_render;
struct prefix_render_cache;

/* What a request's renders gave. */
struct prefix_render_result {
	int status;     /* the whole prompt's /apply-template status */
	json_t *answer; /* ... and its answer (NULL: none that parses); borrowed */
	/* The starts as byte offsets in answer's "prompt" (chat_starts_finish;
	 * malloc'd, the callee takes them), none where the prompt did not come. */
	size_t *offsets;
	unsigned char *kind;
	size_t n;
	int header;
	/* Prefixes wanted, found kept, and asked of the server. */
	size_t prefixes, kept, rendered;
};

struct prefix_render_handlers {
	void (*on_done)(struct prefix_render_result *res, void *arg);
	/* The whole prompt's call failed (the backend's error). */
	void (*on_error)(enum backend_error err, void *arg);
};

/* Starts the renders of request (a chat request, as /apply-template takes
 * it) on b. Exactly one handler runs, on a later turn of the loop or from a
 * call's callback, unless cancelled first. NULL when out of memory. */
struct prefix_render *prefix_render_start(struct backend *b, json_t *request,
                                          const struct prefix_render_handlers *h, void *arg);
/* Ends the renders in flight; no handler runs. */
void prefix_render_cancel(struct prefix_render *pr);

/* The backend's kept renderings dropped (its prompt engine went). */
void prefix_render_cache_free(struct backend *b);

struct prefix_render_stats {
	unsigned long long entries, bytes, hits, misses, stale;
};
void prefix_render_cache_stats(const struct backend *b, struct prefix_render_stats *st);

#endif
