/* Error bodies in the shape each API's clients expect. The route decides the
 * shape, so that even errors found before routing (limits, bad JSON, a bad
 * token) speak the client's dialect. */
#ifndef TOKI_API_ERROR_H
#define TOKI_API_ERROR_H

/* A new NUL-terminated JSON body; the caller frees it. */
char *api_error_body(int status, const char *message, const char *path);
const char *api_error_type(int status);
/* A prompt that does not fit the context, in each API's own shape: the
 * Messages API's "prompt is too long: N tokens > M maximum", the Responses
 * API's context_length_exceeded, llama-server's exceed_context_size_error
 * (with n_prompt_tokens and n_ctx) on the other routes. */
char *api_context_error_body(const char *path, long long n_prompt, long long n_ctx);
/* Routes under /anthropic/ (and /v1/messages) speak Anthropic's error shape. */
int api_path_is_anthropic(const char *path);

#endif
