#include "api/api_error.h"

#include <jansson.h>
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

char *api_error_body(int status, const char *message, const char *path)
{
	json_t *err = json_pack("{s:s, s:s, s:n, s:i}", "message", message, "type",
				api_error_type(status), "param", "code", status);
	json_t *root = json_pack("{s:o}", "error", err);
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}
