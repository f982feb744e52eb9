/* Error bodies in the shape each API's clients expect. The route decides the
 * shape, so that even errors found before routing (limits, bad JSON, a bad
 * token) speak the client's dialect. */
#ifndef TOKI_API_ERROR_H
#define TOKI_API_ERROR_H

/* A new NUL-terminated JSON body; the caller frees it. */
char *api_error_body(int status, const char *message, const char *path);
const char *api_error_type(int status);
/* Routes under /anthropic/ speak Anthropic's error shape. */
int api_path_is_anthropic(const char *path);

#endif
