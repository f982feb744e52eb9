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

/* A copy of check_types() in src/api/proxy.c, which is static: the checks
 * every routed request body goes through before anything else reads it.
 * Keep in step with proxy.c. */
enum fuzz_route_kind { FUZZ_KIND_CHAT, FUZZ_KIND_COMPLETION, FUZZ_KIND_ANTHROPIC, FUZZ_KIND_RESPONSES };

static inline const char *fuzz_check_types(json_t *body, enum fuzz_route_kind kind)
{
	if (!json_is_object(body))
		return "the request body must be a JSON object";
	json_t *v;
	if ((v = json_object_get(body, "stream")) && !json_is_boolean(v) && !json_is_null(v))
		return "'stream' must be a boolean";
	if ((v = json_object_get(body, "max_tokens")) && !json_is_integer(v) && !json_is_null(v))
		return "'max_tokens' must be an integer";
	if ((v = json_object_get(body, "max_completion_tokens")) && !json_is_integer(v) &&
	    !json_is_null(v))
		return "'max_completion_tokens' must be an integer";
	if ((v = json_object_get(body, "n_predict")) && !json_is_integer(v))
		return "'n_predict' must be an integer";
	if ((v = json_object_get(body, "temperature")) && !json_is_number(v) && !json_is_null(v))
		return "'temperature' must be a number";
	if ((v = json_object_get(body, "model")) && !json_is_string(v) && !json_is_null(v))
		return "'model' must be a string";
	if ((v = json_object_get(body, "id_slot")) && !json_is_integer(v))
		return "'id_slot' must be an integer";
	if (kind == FUZZ_KIND_ANTHROPIC || kind == FUZZ_KIND_RESPONSES)
		return NULL;
	if (kind == FUZZ_KIND_CHAT) {
		v = json_object_get(body, "messages");
		if (!json_is_array(v) || json_array_size(v) == 0)
			return "'messages' must be a non-empty array";
		size_t i;
		json_t *m;
		json_array_foreach(v, i, m)
		{
			if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
				return "each message must be an object with a string 'role'";
		}
	} else {
		v = json_object_get(body, "prompt");
		if (!v)
			return "'prompt' is required";
		if (!json_is_string(v) && !json_is_array(v))
			return "'prompt' must be a string or an array";
	}
	return NULL;
}

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
	json_t *back = json_loads(s, 0, &e);
	FUZZ_CHECK(back != NULL);
	FUZZ_CHECK(json_equal(back, (json_t *)chat));
	json_decref(back);
	free(s);
}

#endif
