/* The model registry (src/model/registry.c): a YAML file people edit by hand.
 * The input is written to a temporary file and read with
 * registry_load_file. A registry that reads is then written back by
 * registry_set_active (the real read-modify-write under the lock, through
 * TOKI_MODEL_REGISTRY) and read again: the write must keep every model and
 * field exactly (the emitter's quoting must round-trip). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "model/registry.h"
#include "util/paths.h"

static char in_path[256], rt_path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	char dir[200];
	snprintf(dir, sizeof dir, "%s/toki-fuzz-registry-XXXXXX", base);
	FUZZ_CHECK(mkdtemp(dir) != NULL);
	snprintf(in_path, sizeof in_path, "%s/in.yaml", dir);
	snprintf(rt_path, sizeof rt_path, "%s/models.yaml", dir);
	setenv("TOKI_MODEL_REGISTRY", rt_path, 1);
	setenv("TOKI_STATE_DIR", dir, 1);
	return 0;
}

static int same_str(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static void check_same(const struct registry *a, const struct registry *b)
{
	FUZZ_CHECK(a->n == b->n);
	FUZZ_CHECK(same_str(a->active, b->active));
	for (int i = 0; i < a->n; i++) {
		const struct registry_model *x = &a->models[i], *y = &b->models[i];
		FUZZ_CHECK(same_str(x->name, y->name));
		FUZZ_CHECK(same_str(x->path, y->path));
		FUZZ_CHECK(same_str(x->repo, y->repo));
		FUZZ_CHECK(same_str(x->file, y->file));
		FUZZ_CHECK(same_str(x->binary, y->binary));
		FUZZ_CHECK(x->ctx == y->ctx && x->max_output == y->max_output);
		FUZZ_CHECK(x->n_args == y->n_args);
		for (int k = 0; k < x->n_args; k++)
			FUZZ_CHECK(same_str(x->args[k], y->args[k]));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FILE *f = fopen(in_path, "wb");
	FUZZ_CHECK(f != NULL);
	FUZZ_CHECK(fwrite(data, 1, size, f) == size);
	fclose(f);

	struct registry r;
	char err[1024];
	err[0] = '\0';
	if (registry_load_file(in_path, &r, err, sizeof err) != 0) {
		FUZZ_CHECK(err[0] != '\0');
		FUZZ_CHECK(r.n == 0 && r.models == NULL && r.active == NULL);
		registry_free(&r);
		return 0;
	}
	for (int i = 0; i < r.n; i++) {
		const struct registry_model *m = &r.models[i];
		/* Names become directory names: never anything but one safe
		 * path component. */
		FUZZ_CHECK(m->name && paths_is_safe_name(m->name));
		FUZZ_CHECK(!strchr(m->name, '/') && strcmp(m->name, "..") && strcmp(m->name, "."));
		FUZZ_CHECK(m->path && m->path[0]);
		FUZZ_CHECK(m->ctx >= 0 && m->max_output >= 0);
		FUZZ_CHECK(m->n_args >= 0 && (m->n_args == 0 || m->args));
		FUZZ_CHECK(registry_find(&r, m->name) == m);
	}
	FUZZ_CHECK(!r.active || paths_is_safe_name(r.active));

	/* Round trip through the writer. */
	if (!r.active || registry_find(&r, r.active)) {
		unlink(rt_path);
		FUZZ_CHECK(rename(in_path, rt_path) == 0);
		char werr[1024];
		int rc = registry_set_active(r.active, werr, sizeof werr);
		if (rc != 0) {
			fprintf(stderr, "write failed: %s\n", werr);
			FUZZ_CHECK(rc == 0);
		}
		struct registry back;
		char rerr[1024];
		if (registry_load_file(rt_path, &back, rerr, sizeof rerr) != 0) {
			fprintf(stderr, "the written registry does not read back: %s\n", rerr);
			FUZZ_CHECK(0);
		}
		check_same(&r, &back);
		registry_free(&back);
	}
	registry_free(&r);
	return 0;
}
