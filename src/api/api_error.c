#include "api/api_error.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

const char *api_error_type(int status)
{
	switch (status) {
	case 400:
	case 405:
	case 408:
	case 411:
	case 413:
	case 431: return "invalid_request_error";
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 429: return "rate_limit_error";
	case 502:
	case 503:
	case 504: return "server_error";
	default: return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

/* Anthropic's shape: {"type":"error","error":{"type":...,"message":...}}. */
static const char *anthropic_error_type(int status)
{
	switch (status) {
	case 400:
	case 405:
	case 408:
	case 411:
	case 431: return "invalid_request_error";
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 413: return "request_too_large";
	case 429: return "rate_limit_error";
	case 503:
	case 529: return "overloaded_error";
	case 504: return "timeout_error";
	default: return status >= 500 ? "api_error" : "invalid_request_error";
	}
}

int api_path_is_anthropic(const char *path)
{
	return path && (!strncmp(path, "/anthropic/", 11) || !strcmp(path, "/v1/messages") ||
			!strcmp(path, "/v1/messages/count_tokens"));
}

char *api_error_body(int status, const char *message, const char *path)
{
	if (api_path_is_anthropic(path)) {
		json_t *root = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
					 anthropic_error_type(status), "message", message);
		char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
		json_decref(root);
		return s;
	}
	json_t *err = json_pack("{s:s, s:s, s:n, s:i}", "message", message, "type",
				api_error_type(status), "param", "code", status);
	json_t *root = json_pack("{s:o}", "error", err);
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}

char *api_context_error_body(const char *path, long long n_prompt, long long n_ctx)
{
	char msg[300];
	json_t *root;
	if (api_path_is_anthropic(path)) {
		/* The Messages API's own words, which Claude Code parses. */
		snprintf(msg, sizeof msg, "prompt is too long: %lld tokens > %lld maximum", n_prompt,
			 n_ctx);
		root = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
				 "invalid_request_error", "message", msg);
	} else if (path && (!strcmp(path, "/v1/responses") || !strcmp(path, "/responses"))) {
		snprintf(msg, sizeof msg,
			 "Your input exceeds the context window of this model: %lld tokens > %lld "
			 "maximum.",
			 n_prompt, n_ctx);
		root = json_pack("{s:{s:s, s:s, s:s, s:s}}", "error", "message", msg, "type",
				 "invalid_request_error", "param", "input", "code",
				 "context_length_exceeded");
	} else {
		/* llama-server's own error for this, field for field. */
		snprintf(msg, sizeof msg,
			 "request (%lld tokens) exceeds the available context size (%lld tokens), try "
			 "increasing it",
			 n_prompt, n_ctx);
		root = json_pack("{s:{s:i, s:s, s:s, s:I, s:I}}", "error", "code", 400, "message", msg,
				 "type", "exceed_context_size_error", "n_prompt_tokens",
				 (json_int_t)n_prompt, "n_ctx", (json_int_t)n_ctx);
	}
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}
