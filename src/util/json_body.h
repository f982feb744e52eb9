/* The two things every caller of a backend does with an answer's body: parse
 * it when the status says it is an answer, and read the error message when
 * it is a refusal. */
#ifndef TOKI_UTIL_JSON_BODY_H
#define TOKI_UTIL_JSON_BODY_H

#include <jansson.h>
#include <stddef.h>

/* The body parsed, when status is 200 and it is JSON of the given type
 * (JSON_OBJECT, JSON_ARRAY; -1: any); else NULL. flags are jansson's
 * decoding flags (JSON_ALLOW_NUL for what a model generated). */
json_t *json_body(int status, const char *body, size_t len, int type, size_t flags);
/* The "error.message" of an error answer (llama-server's and OpenAI's
 * shape), or NULL; it points into obj. */
const char *json_error_message(const json_t *obj);
/* The same read from a body's text; copied into out (n bytes), or fallback
 * there when the body has none. Returns out. */
const char *json_body_error(const char *body, size_t len, const char *fallback, char *out,
                            size_t n);

#endif
