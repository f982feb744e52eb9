/* toki model remove: forget a model, and with --purge delete what toki
 * downloaded for it (never a user's own file elsewhere). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/cmd.h"
#include "model/memsize.h"
#include "model/registry.h"
#include "util/paths.h"

static const char remove_usage[] =
    "usage: toki model remove NAME [--purge] [--force]\n"
    "\n"
    "Removes NAME from the model registry. A running model is refused unless\n"
    "--force (it keeps running; `toki down` stops it).\n"
    "\n"
    "  --purge   also delete $TOKI_STATE_DIR/models/NAME/, where `toki model pull`\n"
    "            downloads; a registered file outside it is yours and is kept.\n"
    "            Works on a leftover directory of a model no longer registered.\n"
    "  --force   remove a model even while it runs\n";

static int purge(const char *name, const char *path)
{
	struct registry_purge pr;
	char err[1024];
	int rc = registry_purge_files(name, path, &pr, err, sizeof err);
	if (pr.deleted_dir) {
		char h[32];
		memsize_human(pr.bytes, h, sizeof h);
		printf("deleted %s (%lu file%s, %s)\n", pr.dir, pr.n_files,
		       pr.n_files == 1 ? "" : "s", h);
	} else if (rc == 0) {
		printf("nothing to delete: %s does not exist\n", pr.dir);
	}
	if (pr.kept_outside)
		printf("kept %s: it is outside %s, and toki deletes only what it downloaded\n",
		       path, pr.dir);
	if (rc != 0) {
		fprintf(stderr, "toki model remove: %s\n", err);
		return 1;
	}
	return 0;
}

int cmd_model_remove(int argc, char **argv)
{
	const char *name = NULL;
	int do_purge = 0, force = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--purge")) {
			do_purge = 1;
		} else if (!strcmp(a, "--force") || !strcmp(a, "-f")) {
			force = 1;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(remove_usage, stdout);
			return 0;
		} else if (a[0] == '-' && strcmp(a, "-") != 0) {
			fprintf(stderr, "toki model remove: unknown option '%s'\n\n%s", a,
			        remove_usage);
			return 2;
		} else if (name) {
			fprintf(stderr, "toki model remove: one model at a time ('%s' and '%s')\n",
			        name, a);
			return 2;
		} else {
			name = a;
		}
	}
	if (!name) {
		fputs(remove_usage, stderr);
		return 2;
	}
	if (!paths_is_safe_name(name)) {
		fprintf(stderr,
		        "toki model remove: '%s' is not a valid model name (letters, digits, "
		        "'.', '_', '-')\n",
		        name);
		return 2;
	}

	char regpath[4096], err[1024];
	if (paths_registry_file(regpath, sizeof regpath) != 0) {
		fprintf(stderr, "toki model remove: the registry path is too long\n");
		return 1;
	}
	struct registry r;
	if (registry_load(&r, err, sizeof err) != 0) {
		fprintf(stderr, "toki model remove: %s\n", err);
		return 1;
	}
	const struct registry_model *m = registry_find(&r, name);
	if (!m) {
		registry_free(&r);
		if (do_purge) {
			/* Not registered, but a leftover download directory can
			 * still be cleaned up. */
			printf("'%s' is not in %s\n", name, regpath);
			return purge(name, NULL);
		}
		fprintf(stderr, "toki model remove: no model named '%s' in %s\n", name, regpath);
		return 1;
	}
	char *path = strdup(m->path);
	int was_active = r.active && !strcmp(r.active, name);
	registry_free(&r);
	if (!path) {
		fprintf(stderr, "toki model remove: out of memory\n");
		return 1;
	}

	pid_t pid = registry_running_pid(name);
	if (pid && !force) {
		fprintf(stderr,
		        "toki model remove: '%s' is running (pid %ld); stop it with `toki down`, "
		        "or pass --force to remove it anyway\n",
		        name, (long)pid);
		free(path);
		return 1;
	}
	if (registry_remove_model(name, err, sizeof err) != 0) {
		fprintf(stderr, "toki model remove: %s\n", err);
		free(path);
		return 1;
	}
	printf("removed '%s' from %s%s\n", name, regpath,
	       was_active ? " (it was the active model)" : "");
	if (pid)
		printf("warning: '%s' is still running (pid %ld); `toki down` stops it\n", name,
		       (long)pid);

	int rc = 0;
	if (do_purge) {
		rc = purge(name, path);
	} else {
		char dir[4096], sub[256];
		struct stat st;
		snprintf(sub, sizeof sub, "models/%s", name);
		if (paths_state_sub(dir, sizeof dir, sub) == 0 && stat(dir, &st) == 0)
			printf("its files are still in %s (`toki model remove %s --purge` deletes "
			       "them)\n",
			       dir, name);
	}
	free(path);
	return rc;
}
