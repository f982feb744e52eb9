/* put / put_copy, the two jansson helpers both halves of the Anthropic
 * translation build their objects with: the request's (anthropic.c) and the
 * answer's (anthropic_answer.c). Private to those two files. */
#ifndef TOKI_API_ANTHROPIC_PUT_H
#define TOKI_API_ANTHROPIC_PUT_H

#include <jansson.h>

/* Sets key to a new reference; returns -1 (and drops v) on failure, so call
 * sites can chain without leaking. */
static inline int put(json_t *obj, const char *key, json_t *v)
{
	if (!v)
		return -1;
	return json_object_set_new(obj, key, v) ? -1 : 0;
}

static inline int put_copy(json_t *obj, const char *key, const json_t *v)
{
	/* json_deep_copy takes a const pointer; a shallow reference would tie
	 * the result's lifetime to the request's. */
	return put(obj, key, json_deep_copy(v));
}

#endif
