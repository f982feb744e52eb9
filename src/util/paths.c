#include "util/paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "platform/platform.h"

static int fit(char *out, size_t n, int w)
{
	if (w < 0 || (size_t)w >= n) {
		if (n)
			out[0] = '\0';
		return -1;
	}
	return 0;
}

/* $HOME, else the password database (a service manager may start toki
 * without HOME), else "/". */
static void home(char *h, size_t n)
{
	if (plat_home_dir(h, n) != 0)
		snprintf(h, n, "/");
}

int paths_config_dir(char *out, size_t n)
{
	const char *x = getenv("XDG_CONFIG_HOME");
	if (x && *x)
		return fit(out, n, snprintf(out, n, "%s/tokirecur", x));
	char h[2048];
	home(h, sizeof h);
	return fit(out, n, snprintf(out, n, "%s/.config/tokirecur", h));
}

int paths_registry_file(char *out, size_t n)
{
	const char *r = getenv("TOKI_MODEL_REGISTRY");
	if (r && *r)
		return fit(out, n, snprintf(out, n, "%s", r));
	char dir[3072];
	if (paths_config_dir(dir, sizeof dir) != 0)
		return fit(out, n, -1);
	return fit(out, n, snprintf(out, n, "%s/models.yaml", dir));
}

int paths_state_dir(char *out, size_t n)
{
	const char *s = getenv("TOKI_STATE_DIR");
	if (s && *s)
		return fit(out, n, snprintf(out, n, "%s", s));
	const char *x = getenv("XDG_STATE_HOME");
	if (x && *x)
		return fit(out, n, snprintf(out, n, "%s/tokirecur", x));
	char h[2048];
	home(h, sizeof h);
	return fit(out, n, snprintf(out, n, "%s/.local/state/tokirecur", h));
}

int paths_state_sub(char *out, size_t n, const char *sub)
{
	char dir[3072];
	if (paths_state_dir(dir, sizeof dir) != 0)
		return fit(out, n, -1);
	return fit(out, n, snprintf(out, n, "%s/%s", dir, sub));
}

int paths_mkdir_p(const char *dir, unsigned mode)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, mode) != 0 && errno != EEXIST)
		return -1;
	return 0;
}

int paths_is_safe_name(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > 128 || !strcmp(name, ".") || !strcmp(name, ".."))
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}
