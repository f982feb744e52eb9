/* A scratch directory for a unit test's files: made under $TMPDIR (else
 * /tmp) before the tests, removed with its files after them. Header-only
 * (each test is its own executable). */
#ifndef TOKI_TESTS_TMPDIR_H
#define TOKI_TESTS_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* 0, or -1 when the directory could not be made. */
static inline int tmpdir_make(const char *prefix)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/%s-XXXXXX", base && *base ? base : "/tmp", prefix);
	return mkdtemp(tmpdir) ? 0 : -1;
}

static inline void tmpdir_remove(void)
{
	DIR *d = opendir(tmpdir);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			char p[512];
			snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
			unlink(p);
		}
		closedir(d);
	}
	rmdir(tmpdir);
}

#endif
