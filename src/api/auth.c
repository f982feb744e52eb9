#include "api/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/bytes.h"
#include "util/paths.h"

static int read_token_file(const char *path, char *token, size_t n)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fgets(token, (int)n, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	token[strcspn(token, "\r\n")] = '\0';
	return *token ? 0 : -1;
}

int auth_load_token(char *token, size_t n, char *err, size_t errlen)
{
	const char *env = getenv("TOKI_TOKEN");
	if (env && *env) {
		if (strlen(env) >= n) {
			snprintf(err, errlen, "TOKI_TOKEN is too long");
			return -1;
		}
		snprintf(token, n, "%s", env);
		return 0;
	}
	char dir[4096], path[4200];
	if (paths_state_dir(dir, sizeof dir) != 0 || paths_mkdir_p(dir, 0700) != 0) {
		snprintf(err, errlen, "cannot create the state directory %s: %s", dir,
		         strerror(errno));
		return -1;
	}
	snprintf(path, sizeof path, "%s/token", dir);
	if (read_token_file(path, token, n) == 0)
		return 0;
	unsigned char raw[32];
	if (RAND_bytes(raw, sizeof raw) != 1 || n < 65) {
		snprintf(err, errlen, "cannot make a random token");
		return -1;
	}
	bytes_hex(raw, sizeof raw, token);
	/* O_EXCL: if another daemon wrote one meanwhile, use that one. */
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
		return -1;
	}
	size_t len = strlen(token);
	int ok = write(fd, token, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
	close(fd);
	if (!ok || link(tmp, path) != 0) {
		unlink(tmp);
		if (read_token_file(path, token, n) == 0)
			return 0;
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	unlink(tmp);
	return 0;
}

/* A comparison whose time depends only on the length of what the client
 * sent: every byte of b is compared (against a repeated as needed), and a
 * length difference counts as a difference. No early exit, and no hashing:
 * SHA-256 through OpenSSL 3 fetched its digest anew for every request, a
 * tenth of the daemon's time per request. */
static int same_secret(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (!la)
		return 0;
	volatile unsigned char diff = (unsigned char)(la != lb);
	size_t j = 0;
	for (size_t i = 0; i < lb; i++) {
		diff |= (unsigned char)(a[j] ^ b[i]);
		j = j + 1 == la ? 0 : j + 1;
	}
	return diff == 0;
}

int auth_check(const char *token, const char *authorization, const char *x_api_key)
{
	int ok = 0;
	if (authorization && !strncasecmp(authorization, "Bearer ", 7)) {
		const char *t = authorization + 7;
		while (*t == ' ')
			t++;
		ok |= same_secret(token, t);
	}
	if (x_api_key)
		ok |= same_secret(token, x_api_key);
	return ok;
}
