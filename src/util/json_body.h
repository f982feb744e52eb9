/* The two things every caller of a backend does with an answer's body: parse
 * it when the status says it is an answer, and read the error message when
 * it is a refusal. */
#ifndef TOKI_UTIL_JSON_BODY_H
#define TOKI_UTIL_JSON_BODY_H

#include <jansson.h>
#include <stddef.h>

/* jansson's decoding flags for every body toki reads, a client's request
 * or a backend's answer: a string may hold a NUL. A model writes one (the
 * byte token <0x00>), a tool's result carries a binary file's bytes, and
 * llama-server takes and gives both; refusing them would refuse a request
 * the server serves, or lose an answer it gave. Whatever reads a string
 * from such a body uses json_string_length, never strlen. */
#define JSON_BODY_FLAGS JSON_ALLOW_NUL

/* The body parsed (JSON_BODY_FLAGS), when status is 200 and it is JSON of
 * the given type (JSON_OBJECT, JSON_ARRAY; -1: any); else NULL. */
json_t *json_body(int status, const char *body, size_t len, int type);
/* The "error.message" of an error answer (llama-server's and OpenAI's
 * shape), or NULL; it points into obj. */
const char *json_error_message(const json_t *obj);
/* The same read from a body's text; copied into out (n bytes), or fallback
 * there when the body has none. Returns out. */
const char *json_body_error(const char *body, size_t len, const char *fallback, char *out,
                            size_t n);

#endif
