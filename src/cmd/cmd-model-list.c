/* toki model list: the registered models, whether their files are there, how
 * they are configured, which is active and what context a running one got. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <jansson.h>

#include "cmd/cmd.h"
#include "model/memsize.h"
#include "model/registry.h"
#include "util/paths.h"

static const char list_usage[] =
    "usage: toki model list [--json]\n"
    "\n"
    "Lists the models in the registry ($TOKI_MODEL_REGISTRY, else\n"
    "~/.config/tokirecur/models.yaml): name, file size (or 'missing'), the\n"
    "context asked for, the context the running model got, the output cap,\n"
    "where it came from and its path. '*' marks the active model.\n"
    "\n"
    "  --json   one JSON object: {\"registry\", \"active\", \"models\": [...]}\n";

/* What we learn about one model beyond its registry entry. */
struct facts {
	int exists;
	uint64_t size;
	pid_t pid;
	long eff_ctx; /* -1: not recorded */
};

static void gather(const struct registry_model *m, struct facts *f)
{
	struct stat st;
	f->exists = stat(m->path, &st) == 0 && S_ISREG(st.st_mode);
	f->size = f->exists ? (uint64_t)st.st_size : 0;
	f->pid = registry_running_pid(m->name);
	f->eff_ctx = memsize_read_ctx(m->name);
}

/* Registry strings are valid UTF-8 (libyaml checks), but a hand-written one
 * may carry control characters; they must not reach a terminal as is. */
static void put_clean(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		putchar(*p < 0x20 || *p == 0x7f ? '?' : *p);
}

/* Columns counted in characters, not bytes, so UTF-8 names line up. */
static int width(const char *s)
{
	int w = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		w += (*p & 0xc0) != 0x80;
	return w;
}

static int max_width(int w, const char *s)
{
	int x = width(s);
	return x > w ? x : w;
}

static void put_cell(const char *s, int w)
{
	put_clean(s);
	for (int i = width(s); i < w; i++)
		putchar(' ');
	fputs("  ", stdout);
}

/* One row of the text table, formatted. */
struct row {
	struct facts f;
	char size[32], ctx[24], eff[32], mo[24];
};

static int list_text(const struct registry *r, const char *regpath)
{
	if (r->n == 0) {
		printf("no models registered in %s\n(`toki model pull` adds one)\n", regpath);
		return 0;
	}
	struct row *rows = calloc((size_t)r->n, sizeof *rows);
	if (!rows) {
		fprintf(stderr, "toki model list: out of memory\n");
		return 1;
	}
	int wn = 4, ws = 4, wc = 3, we = 7, wm = 7, wr = 4;
	for (int i = 0; i < r->n; i++) {
		const struct registry_model *m = &r->models[i];
		struct row *w = &rows[i];
		gather(m, &w->f);
		if (w->f.exists)
			memsize_human(w->f.size, w->size, sizeof w->size);
		else
			snprintf(w->size, sizeof w->size, "missing");
		if (m->ctx > 0)
			snprintf(w->ctx, sizeof w->ctx, "%ld", m->ctx);
		else
			snprintf(w->ctx, sizeof w->ctx, "auto");
		/* The recorded context outlives the process; say when it is stale. */
		if (w->f.eff_ctx > 0)
			snprintf(w->eff, sizeof w->eff, "%ld%s", w->f.eff_ctx,
			         w->f.pid ? "" : " (stopped)");
		else
			snprintf(w->eff, sizeof w->eff, "%s", w->f.pid ? "yes" : "-");
		if (m->max_output > 0)
			snprintf(w->mo, sizeof w->mo, "%ld", m->max_output);
		else
			snprintf(w->mo, sizeof w->mo, "-");
		wn = max_width(wn, m->name);
		ws = max_width(ws, w->size);
		wc = max_width(wc, w->ctx);
		we = max_width(we, w->eff);
		wm = max_width(wm, w->mo);
		wr = max_width(wr, m->repo ? m->repo : "-");
	}
	fputs("  ", stdout);
	put_cell("NAME", wn);
	put_cell("SIZE", ws);
	put_cell("CTX", wc);
	put_cell("RUNNING", we);
	put_cell("MAX_OUT", wm);
	put_cell("REPO", wr);
	puts("PATH");
	for (int i = 0; i < r->n; i++) {
		const struct registry_model *m = &r->models[i];
		const struct row *w = &rows[i];
		int active = r->active && !strcmp(r->active, m->name);
		fputs(active ? "* " : "  ", stdout);
		put_cell(m->name, wn);
		put_cell(w->size, ws);
		put_cell(w->ctx, wc);
		put_cell(w->eff, we);
		put_cell(w->mo, wm);
		put_cell(m->repo ? m->repo : "-", wr);
		put_clean(m->path);
		putchar('\n');
	}
	free(rows);
	if (r->active && !registry_find(r, r->active)) {
		printf("\nactive: ");
		put_clean(r->active);
		printf(" (not in the registry)\n");
	}
	printf("\nCTX: asked for (auto: sized to memory); RUNNING: the context the running\n"
	       "model got; * marks the active model. registry: ");
	put_clean(regpath);
	putchar('\n');
	return 0;
}

/* json_string() refuses invalid UTF-8; registry strings have passed libyaml's
 * UTF-8 check, but a path from the environment may not have. */
static json_t *jstr(const char *s)
{
	if (!s)
		return json_null();
	json_t *j = json_string(s);
	return j ? j : json_string("(not UTF-8)");
}

static json_t *jlong(long v)
{
	return v > 0 ? json_integer(v) : json_null();
}

static int list_json(const struct registry *r, const char *regpath)
{
	json_t *root = json_object();
	json_t *arr = json_array();
	if (!root || !arr) {
		json_decref(root);
		json_decref(arr);
		fprintf(stderr, "toki model list: out of memory\n");
		return 1;
	}
	json_object_set_new(root, "registry", jstr(regpath));
	json_object_set_new(root, "active", jstr(r->active));
	json_object_set_new(root, "models", arr);
	for (int i = 0; i < r->n; i++) {
		const struct registry_model *m = &r->models[i];
		struct facts f;
		gather(m, &f);
		json_t *o = json_object();
		json_t *args = json_array();
		for (int k = 0; args && k < m->n_args; k++)
			json_array_append_new(args, jstr(m->args[k]));
		json_object_set_new(o, "name", jstr(m->name));
		json_object_set_new(o, "path", jstr(m->path));
		json_object_set_new(o, "exists", json_boolean(f.exists));
		json_object_set_new(o, "size",
		                    f.exists ? json_integer((json_int_t)f.size) : json_null());
		json_object_set_new(o, "repo", jstr(m->repo));
		json_object_set_new(o, "file", jstr(m->file));
		json_object_set_new(o, "binary", jstr(m->binary));
		json_object_set_new(o, "ctx", jlong(m->ctx));
		json_object_set_new(o, "max_output", jlong(m->max_output));
		json_object_set_new(o, "args", args ? args : json_array());
		json_object_set_new(o, "active",
		                    json_boolean(r->active && !strcmp(r->active, m->name)));
		json_object_set_new(o, "running", json_boolean(f.pid != 0));
		json_object_set_new(o, "pid", f.pid ? json_integer(f.pid) : json_null());
		json_object_set_new(o, "effective_ctx", jlong(f.eff_ctx));
		if (json_array_append_new(arr, o) != 0) {
			json_decref(root);
			fprintf(stderr, "toki model list: out of memory\n");
			return 1;
		}
	}
	char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!text) {
		fprintf(stderr, "toki model list: out of memory\n");
		return 1;
	}
	puts(text);
	free(text);
	return 0;
}

int cmd_model_list(int argc, char **argv)
{
	int json = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(list_usage, stdout);
			return 0;
		} else {
			fprintf(stderr, "toki model list: unexpected '%s'\n\n%s", argv[i],
			        list_usage);
			return 2;
		}
	}
	char regpath[4096];
	if (paths_registry_file(regpath, sizeof regpath) != 0) {
		fprintf(stderr, "toki model list: the registry path is too long\n");
		return 1;
	}
	struct registry r;
	char err[1024];
	if (registry_load(&r, err, sizeof err) != 0) {
		fprintf(stderr, "toki model list: %s\n", err);
		return 1;
	}
	int rc = json ? list_json(&r, regpath) : list_text(&r, regpath);
	registry_free(&r);
	return rc;
}
