/* toki model pull: download a GGUF (all shards of a split one) from the
 * Hugging Face hub into $state/models/<name>/ and register it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"

#include "model/download.h"
#include "model/hub.h"
#include "model/registry.h"
#include "util/paths.h"

#define ME "toki model pull"

static const char pull_usage[] =
    "usage: toki model pull ORG/REPO [--file PATH | --quant Q] [--name NAME]\n"
    "                       [--revision REV]\n"
    "\n"
    "Downloads a GGUF model from the Hugging Face hub into\n"
    "$TOKI_STATE_DIR/models/NAME/, checks it against the hub's SHA-256 and adds\n"
    "it to the model registry. An interrupted download resumes where it stopped\n"
    "when the same command runs again. A split model (x-00001-of-00003.gguf) is\n"
    "fetched whole; the registry points at its first file.\n"
    "\n"
    "  --file PATH    the file in the repository (any shard of a split model)\n"
    "  --quant Q      the GGUF whose name contains Q, e.g. Q4_K_M (any case)\n"
    "                 without either: the repository's only model\n"
    "  --name NAME    the registry name (default: the file's name without .gguf)\n"
    "  --revision R   branch, tag or commit (default main)\n"
    "\n"
    "Environment: HF_ENDPOINT (default " HUB_DEFAULT_ENDPOINT "), HF_TOKEN (for\n"
    "private or gated repositories).\n"
    "Prints the model's path on stdout; progress and notes go to stderr.\n";

static const char *base_of(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* The value of "--opt VALUE" or "--opt=VALUE"; advances *i past it. */
static void warn_if_not_gguf(const char *path)
{
	char magic[4];
	FILE *f = fopen(path, "rb");
	if (!f)
		return;
	size_t got = fread(magic, 1, 4, f);
	fclose(f);
	if (got != 4 || memcmp(magic, "GGUF", 4) != 0)
		fprintf(stderr, "toki: warning: %s does not begin with the GGUF magic\n", path);
}

/* The model's entry in the registry: path, repo and file are the pull's; a
 * model of that name that is already registered keeps its ctx, args and the
 * rest, so pulling a new quant does not undo a user's tuning. */
static int register_model(const char *name, const char *path, const char *repo, const char *file)
{
	char err[1024];
	struct registry r = {0};
	struct registry_model m = {0};
	int have = registry_load(&r, err, sizeof err) == 0;
	if (!have) {
		fprintf(stderr, "toki: cannot read the registry: %s\n", err);
	} else {
		const struct registry_model *old = registry_find(&r, name);
		if (old)
			m = *old;
	}
	m.name = (char *)name;
	m.path = (char *)path;
	m.repo = (char *)repo;
	m.file = (char *)file;
	int rc = have ? registry_set_model(name, &m, err, sizeof err) : -1;
	registry_free(&r);
	if (rc != 0) {
		if (have)
			fprintf(stderr, "toki: cannot register %s: %s\n", name, err);
		char reg[4096];
		paths_registry_file(reg, sizeof reg);
		fprintf(stderr,
		        "toki: the model is downloaded; add it to %s by hand:\n"
		        "models:\n  %s:\n    path: %s\n    repo: %s\n    file: %s\n",
		        reg, name, path, repo, file);
		return -1;
	}
	char reg[4096];
	paths_registry_file(reg, sizeof reg);
	fprintf(stderr, "toki: registered %s in %s\n", name, reg);
	return 0;
}

int cmd_model_pull(int argc, char **argv)
{
	const char *repo = NULL, *file = NULL, *quant = NULL, *name = NULL;
	const char *revision = "main";
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		int r;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(pull_usage, stdout);
			return 0;
		}
		if ((r = cmd_option_value(ME, argc, argv, &i, "--file", &v)) != 0) {
			if (r < 0)
				return 2;
			file = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--quant", &v)) != 0) {
			if (r < 0)
				return 2;
			quant = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--name", &v)) != 0) {
			if (r < 0)
				return 2;
			name = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--revision", &v)) != 0) {
			if (r < 0)
				return 2;
			revision = v;
		} else if (argv[i][0] == '-') {
			fprintf(stderr, "toki model pull: unknown option '%s'\n\n%s", argv[i],
			        pull_usage);
			return 2;
		} else if (!repo) {
			repo = argv[i];
		} else {
			fprintf(stderr, "toki model pull: one repository at a time ('%s' too)\n",
			        argv[i]);
			return 2;
		}
	}
	if (!repo) {
		fputs(pull_usage, stderr);
		return 2;
	}
	if (file && quant) {
		fprintf(stderr, "toki model pull: give --file or --quant, not both\n");
		return 2;
	}
	if (!hub_repo_is_valid(repo)) {
		fprintf(stderr, "toki model pull: '%s' is not a repository of the form org/name\n",
		        repo);
		return 2;
	}
	if (!*revision || strlen(revision) > 256) {
		fprintf(stderr, "toki model pull: --revision must be 1 to 256 characters\n");
		return 2;
	}
	if (name && !paths_is_safe_name(name)) {
		fprintf(stderr,
		        "toki model pull: --name '%s' must be 1-128 of A-Z a-z 0-9 . _ - "
		        "(it becomes a directory name)\n",
		        name);
		return 2;
	}

	const char *endpoint = hub_endpoint();
	const char *token = getenv("HF_TOKEN");
	if (token && !*token)
		token = NULL;
	char err[4096];
	struct hub_listing l;
	if (hub_list_files(endpoint, repo, revision, token, &l, err, sizeof err) != 0) {
		fprintf(stderr, "toki model pull: %s\n", err);
		return 1;
	}
	size_t *picked = NULL, npicked = 0;
	if (hub_choose(&l, file, quant, &picked, &npicked, err, sizeof err) != 0) {
		fprintf(stderr, "toki model pull: %s: %s\n", repo, err);
		hub_listing_free(&l);
		return 1;
	}
	int rc = 1;
	char auto_name[160];
	const struct hub_file *first = &l.files[picked[0]];
	if (!name) {
		hub_default_name(first->path, auto_name, sizeof auto_name);
		name = auto_name;
	}
	char dir[4096], sub[256];
	snprintf(sub, sizeof sub, "models/%s", name);
	if (paths_state_sub(dir, sizeof dir, sub) != 0) {
		fprintf(stderr, "toki model pull: the state directory path is too long\n");
		goto out;
	}
	if (paths_mkdir_p(dir, 0755) != 0) {
		fprintf(stderr, "toki model pull: cannot create %s: %s\n", dir, strerror(errno));
		goto out;
	}
	long long total = 0;
	for (size_t k = 0; k < npicked; k++)
		total += l.files[picked[k]].size > 0 ? l.files[picked[k]].size : 0;
	if (npicked > 1)
		fprintf(stderr, "toki: %s is split into %zu files, %.1f MiB in all\n", first->path,
		        npicked, (double)total / (1024.0 * 1024.0));
	char model_path[8192] = "";
	for (size_t k = 0; k < npicked; k++) {
		const struct hub_file *f = &l.files[picked[k]];
		char url[8192], dest[8192];
		const char *base = base_of(f->path);
		/* The repository's name for the file becomes a local name: it must
		 * not climb out of the model directory. */
		if (!paths_is_safe_name(base)) {
			fprintf(stderr, "toki model pull: refusing the file name '%s'\n", f->path);
			goto out;
		}
		if (hub_resolve_url(endpoint, repo, revision, f->path, url, sizeof url) != 0 ||
		    (size_t)snprintf(dest, sizeof dest, "%s/%s", dir, base) >= sizeof dest) {
			fprintf(stderr, "toki model pull: the URL or path for %s is too long\n",
			        f->path);
			goto out;
		}
		if (!f->sha256[0])
			fprintf(stderr,
			        "toki: warning: the hub gives no SHA-256 for %s (not stored in "
			        "LFS); it cannot be verified\n",
			        f->path);
		struct download_opts o = {.url = url,
		                          .dest = dest,
		                          .expect_sha256 = f->sha256[0] ? f->sha256 : NULL,
		                          .bearer_token = token,
		                          .label = base,
		                          .progress = 1};
		if (download_file(&o, err, sizeof err) != 0) {
			fprintf(stderr, "toki model pull: %s\n", err);
			goto out;
		}
		if (k == 0)
			snprintf(model_path, sizeof model_path, "%s", dest);
	}
	warn_if_not_gguf(model_path);
	printf("%s\n", model_path);
	fflush(stdout);
	rc = register_model(name, model_path, repo, first->path) == 0 ? 0 : 1;
out:
	free(picked);
	hub_listing_free(&l);
	return rc;
}
