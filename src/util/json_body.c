#include "util/json_body.h"

#include <stdio.h>

json_t *json_body(int status, const char *body, size_t len, int type)
{
	if (status != 200 || !body)
		return NULL;
	json_error_t jerr;
	json_t *o = json_loadb(body, len, JSON_BODY_FLAGS, &jerr);
	if (o && type >= 0 && json_typeof(o) != (json_type)type) {
		json_decref(o);
		return NULL;
	}
	return o;
}

const char *json_error_message(const json_t *obj)
{
	return json_string_value(json_object_get(json_object_get(obj, "error"), "message"));
}

const char *json_body_error(const char *body, size_t len, const char *fallback, char *out, size_t n)
{
	json_error_t jerr;
	json_t *o = body ? json_loadb(body, len, JSON_BODY_FLAGS, &jerr) : NULL;
	const char *m = json_error_message(o);
	snprintf(out, n, "%s", m ? m : fallback);
	json_decref(o);
	return out;
}
