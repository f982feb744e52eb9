/* The local token: every route but /health needs it, so that nobody else on
 * the machine can use the daemon (or the model behind it). */
#ifndef TOKI_AUTH_H
#define TOKI_AUTH_H

#include <stddef.h>

/* Loads the token: $TOKI_TOKEN if set, else $TOKI_STATE_DIR/token, created
 * (mode 0600, 32 random bytes as hex) when missing. 0, or -1 with err. */
int auth_load_token(char *token, size_t n, char *err, size_t errlen);
/* Whether the request's Authorization: Bearer or x-api-key header carries
 * the token. The comparison takes the same time wherever a difference is,
 * and whatever the lengths. */
int auth_check(const char *token, const char *authorization, const char *x_api_key);

#endif
