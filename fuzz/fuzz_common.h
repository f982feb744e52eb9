/* Shared bits of the fuzz targets. */
#ifndef TOKI_FUZZ_COMMON_H
#define TOKI_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* An invariant a target checks: a failure is a finding, like a crash. */
#define FUZZ_CHECK(cond)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__,       \
				#cond);                                                            \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* The checks every routed request body goes through (src/api/request_check.c). */
#include "api/request_check.h"
#define fuzz_check_types request_check_types
#define FUZZ_KIND_CHAT KIND_CHAT
#define FUZZ_KIND_COMPLETION KIND_COMPLETION
#define FUZZ_KIND_ANTHROPIC KIND_ANTHROPIC
#define FUZZ_KIND_RESPONSES KIND_RESPONSES

/* A converted chat body: what the proxy then serialises for /apply-template
 * and the backend. It must be an object whose messages are objects with a
 * string role, and it must serialise. */
static inline void fuzz_check_chat_body(const json_t *chat)
{
	FUZZ_CHECK(json_is_object(chat));
	const json_t *msgs = json_object_get(chat, "messages");
	FUZZ_CHECK(json_is_array(msgs));
	size_t i;
	const json_t *m;
	json_array_foreach(msgs, i, m)
	{
		FUZZ_CHECK(json_is_object(m));
		FUZZ_CHECK(json_is_string(json_object_get(m, "role")));
	}
	char *s = json_dumps(chat, JSON_COMPACT);
	FUZZ_CHECK(s != NULL);
	json_error_t e;
	json_t *back = json_loads(s, JSON_ALLOW_NUL, &e);
	FUZZ_CHECK(back != NULL);
	FUZZ_CHECK(json_equal(back, (json_t *)chat));
	json_decref(back);
	free(s);
}

#endif
