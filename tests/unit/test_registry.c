/* The model registry: round trips through the real YAML file, strict reading
 * (broken YAML, wrong types, unknown keys, unsafe names: each an error naming
 * the line), refusal to overwrite a broken file, concurrent writers, and the
 * run-state and purge helpers `toki model remove` uses. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/registry.h"

/* --- Helpers ------------------------------------------------------------- */

static char tmpdir[256];
static char regfile[512];

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

static int setup(void **state)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/toki-reg-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(regfile, sizeof regfile, "%s/cfg/models.yaml", tmpdir);
	char st[512];
	snprintf(st, sizeof st, "%s/state", tmpdir);
	setenv("TOKI_MODEL_REGISTRY", regfile, 1);
	setenv("TOKI_STATE_DIR", st, 1);
	return 0;
}

static int teardown(void **state)
{
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

static void tmp_path(char *out, size_t len, const char *rel)
{
	snprintf(out, len, "%s/%s", tmpdir, rel);
}

static void mkdirs(const char *rel)
{
	char p[512];
	tmp_path(p, sizeof p, rel);
	for (char *s = p + strlen(tmpdir) + 1; *s; s++) {
		if (*s == '/') {
			*s = '\0';
			mkdir(p, 0700);
			*s = '/';
		}
	}
	mkdir(p, 0700);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
	assert_int_equal(fclose(f), 0);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[65536];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

/* Writes the registry text and loads it; returns load's result, err filled. */
static int load_text(const char *text, struct registry *r, char *err, size_t errlen)
{
	mkdirs("cfg");
	write_file(regfile, text);
	return registry_load(r, err, errlen);
}

/* Loading text must fail with a message that starts "<file>:<line>:" and
 * contains `needle`. */
static void expect_error_at(const char *text, int line, const char *needle)
{
	struct registry r;
	char err[1024] = "";
	int rc = load_text(text, &r, err, sizeof err);
	char want[600];
	snprintf(want, sizeof want, "%s:%d:", regfile, line);
	if (rc != -1 || strncmp(err, want, strlen(want)) != 0 || !strstr(err, needle))
		fail_msg("text:\n%s\nwanted an error at line %d with '%s', got rc %d: %s", text,
		         line, needle, rc, err);
	assert_int_equal(r.n, 0);
	assert_null(r.models);
	assert_null(r.active);
}

static struct registry_model model(const char *path)
{
	struct registry_model m = {0};
	m.path = (char *)path;
	return m;
}

/* --- Reading --------------------------------------------------------------- */

static void test_missing_file(void **state)
{
	struct registry r;
	char err[256] = "";
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 0);
	assert_null(r.active);
	assert_null(registry_find(&r, "x"));
	registry_free(&r);
	/* Nothing was created by reading. */
	struct stat st;
	assert_int_equal(stat(regfile, &st), -1);
}

static void test_empty_and_null(void **state)
{
	const char *empty[] = {"",          "# only a comment\n",    "~\n",
	                       "models:\n", "models: {}\nactive:\n", "models: ~\nactive: null\n"};
	for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
		struct registry r;
		char err[512] = "";
		if (load_text(empty[i], &r, err, sizeof err) != 0)
			fail_msg("'%s': %s", empty[i], err);
		assert_int_equal(r.n, 0);
		assert_null(r.active);
		registry_free(&r);
	}
	/* Optional fields written empty are absent. */
	struct registry r;
	char err[512] = "";
	assert_int_equal(load_text("models:\n  a:\n    path: /m/a.gguf\n    repo: ~\n    ctx:\n"
	                           "    args: null\n",
	                           &r, err, sizeof err),
	                 0);
	assert_int_equal(r.n, 1);
	assert_null(r.models[0].repo);
	assert_int_equal(r.models[0].ctx, 0);
	assert_int_equal(r.models[0].n_args, 0);
	registry_free(&r);
}

/* The example from the issue, comments and all, reads as written. */
static void test_hand_written(void **state)
{
	const char *text =
	    "models:\n"
	    "  qwen3-4b:\n"
	    "    path: /home/u/.local/state/tokirecur/models/qwen3-4b/Qwen3-4B-Q4_K_M.gguf\n"
	    "    repo: Qwen/Qwen3-4B-GGUF\n"
	    "    file: Qwen3-4B-Q4_K_M.gguf\n"
	    "    binary: /opt/llama/bin/llama-server   # optional: any llama-server\n"
	    "    ctx: 16384                            # optional: asked-for context\n"
	    "    max_output: 4096                      # optional: output cap\n"
	    "    args: [\"-ngl\", \"99\", \"--jinja\"]       # optional: extra args\n"
	    "  tiny:\n"
	    "    path: /m/tiny.gguf\n"
	    "    args:\n"
	    "      - --temp\n"
	    "      - 0\n"
	    "active: qwen3-4b                          # optional\n";
	struct registry r;
	char err[512] = "";
	if (load_text(text, &r, err, sizeof err) != 0)
		fail_msg("%s", err);
	assert_int_equal(r.n, 2);
	const struct registry_model *m = registry_find(&r, "qwen3-4b");
	assert_non_null(m);
	assert_string_equal(m->path,
	                    "/home/u/.local/state/tokirecur/models/qwen3-4b/Qwen3-4B-Q4_K_M.gguf");
	assert_string_equal(m->repo, "Qwen/Qwen3-4B-GGUF");
	assert_string_equal(m->file, "Qwen3-4B-Q4_K_M.gguf");
	assert_string_equal(m->binary, "/opt/llama/bin/llama-server");
	assert_int_equal(m->ctx, 16384);
	assert_int_equal(m->max_output, 4096);
	assert_int_equal(m->n_args, 3);
	assert_string_equal(m->args[0], "-ngl");
	assert_string_equal(m->args[1], "99");
	assert_string_equal(m->args[2], "--jinja");
	m = registry_find(&r, "tiny");
	assert_non_null(m);
	assert_null(m->repo);
	assert_null(m->binary);
	assert_int_equal(m->n_args, 2);
	assert_string_equal(m->args[1], "0"); /* a plain number in args is its text */
	assert_string_equal(r.active, "qwen3-4b");
	assert_ptr_equal(registry_find(&r, "qwen3-4b"), &r.models[0]);
	assert_null(registry_find(&r, "qwen3"));
	assert_null(registry_find(&r, NULL));
	assert_null(registry_find(NULL, "tiny"));
	registry_free(&r);
	registry_free(&r); /* freeing twice is harmless: free leaves it empty */
	registry_free(NULL);
}

static void test_broken_yaml(void **state)
{
	/* A tab where indentation is expected: libyaml stops at line 4. */
	expect_error_at("models:\n  a:\n    path: /x\n\trepo: y\n", 4,
	                "found a tab character that violates indentation");
	/* "key: a: b" on line 3. */
	expect_error_at("models:\n  a:\n    path: /x: y: z\n", 3, "mapping values are not allowed");
	/* An unclosed flow list is found at the next key, on line 5. */
	expect_error_at("models:\n  a:\n    path: /x\n    args: [\"-ngl\", \"99\"\nactive: a\n", 5,
	                "did not find expected ',' or ']'");
	/* A bad indent under a mapping. */
	expect_error_at("models:\n  a:\n    path: /x\n   repo: y\n", 4,
	                "did not find expected key");
	/* Invalid UTF-8 on line 3 (a reader error: an offset, turned into a line). */
	expect_error_at("models:\n  a:\n    path: /x\xff\n", 3, "invalid");
	/* An unterminated quoted string. */
	expect_error_at("models:\n  a:\n    path: \"/x\n", 4, "found unexpected end of stream");
	/* An alias to nothing. */
	expect_error_at("models:\n  a:\n    path: *nope\n", 3, "undefined alias");
	/* A second document would be ignored by a one-document reader. */
	expect_error_at("models: {}\n---\nmodels: {}\n", 3, "second YAML document");
}

static void test_wrong_types(void **state)
{
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: abc\n", 4,
	                "models.a.ctx: expected a positive integer");
	/* Quoted, "16384" is a string in YAML. */
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: \"16384\"\n", 4,
	                "models.a.ctx: expected a positive integer");
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: -1\n", 4, "models.a.ctx");
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: 0\n", 4, "models.a.ctx");
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: 1.5\n", 4, "models.a.ctx");
	expect_error_at("models:\n  a:\n    path: /x\n    ctx: 99999999999999999999\n", 4,
	                "models.a.ctx");
	expect_error_at("models:\n  a:\n    path: /x\n    max_output: [1]\n", 4,
	                "models.a.max_output: expected a positive integer, got a list");
	expect_error_at("models:\n  a:\n    path: /x\n    args: -ngl 99\n", 4,
	                "models.a.args: expected a list of strings, got a scalar");
	expect_error_at("models:\n  a:\n    path: /x\n    args:\n      - ok\n      - [a]\n", 6,
	                "models.a.args[1]: expected a string, got a list");
	expect_error_at("models:\n  a:\n    path: {a: b}\n", 3,
	                "models.a.path: expected a string, got a mapping");
	expect_error_at("models:\n  a:\n    path: \"/x\\0y\"\n", 3, "contains a NUL byte");
	expect_error_at("models:\n  a:\n    repo: r\n", 2, "models.a: missing 'path'");
	expect_error_at("models:\n  a:\n    path: \"\"\n", 3, "models.a.path: must not be empty");
	expect_error_at("models:\n  a:\n    path: ~\n", 3, "models.a.path: must not be empty");
	expect_error_at("models:\n  a: /x.gguf\n", 2, "models.a: expected a mapping");
	expect_error_at("models:\n  - a\n  - b\n", 2, "models: expected a mapping of model names");
	expect_error_at("- a\n", 1, "expected a mapping with 'models:' at the top");
	expect_error_at("models: {}\nactive: [a]\n", 2, "active: expected a string, got a list");
	expect_error_at("models:\n  [a]: {path: /x}\n", 2, "a model name must be a string");
	expect_error_at("models:\n  a:\n    [k]: v\n", 3, "keys must be plain names");
	expect_error_at("? [a]\n: b\n", 1, "top-level keys must be plain names");
}

static void test_unknown_keys(void **state)
{
	expect_error_at("models:\n  a:\n    path: /x\n    cxt: 8192\n", 4, "unknown key 'cxt'");
	expect_error_at("models:\n  a:\n    path: /x\nactiv: a\n", 4, "unknown key 'activ'");
	expect_error_at("model:\n  a:\n    path: /x\n", 1, "unknown key 'model'");
	expect_error_at("models:\n  a:\n    path: /x\n    path: /y\n", 4, "duplicate key 'path'");
	expect_error_at("models:\n  a:\n    path: /x\n  a:\n    path: /y\n", 4, "listed twice");
	expect_error_at("models: {}\nmodels: {}\n", 2, "duplicate key 'models'");
	expect_error_at("active: a\nactive: b\n", 2, "duplicate key 'active'");
}

static void test_unsafe_names_in_file(void **state)
{
	expect_error_at("models:\n  ../x:\n    path: /x\n", 2, "'../x' is not a valid model name");
	expect_error_at("models:\n  a/b:\n    path: /x\n", 2, "'a/b' is not a valid model name");
	expect_error_at("models:\n  \"\":\n    path: /x\n", 2, "'' is not a valid model name");
	expect_error_at("models:\n  .:\n    path: /x\n", 2, "'.' is not a valid model name");
	expect_error_at("models:\n  \"a\\0b\":\n    path: /x\n", 2, "is not a valid model name");
	expect_error_at("models: {}\nactive: ../x\n", 2, "active: '../x' is not a valid");
}

static void test_read_errors(void **state)
{
	struct registry r;
	char err[512] = "";
	/* The registry path is a directory. */
	mkdirs("cfg/models.yaml");
	assert_int_equal(registry_load(&r, err, sizeof err), -1);
	assert_non_null(strstr(err, "is a directory"));
	assert_non_null(strstr(err, regfile));
	/* Too large to be a registry (a sparse file: no disk used). */
	char big[512];
	tmp_path(big, sizeof big, "big.yaml");
	int fd = open(big, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 17 << 20), 0);
	close(fd);
	assert_int_equal(registry_load_file(big, &r, err, sizeof err), -1);
	assert_non_null(strstr(err, "too large"));
	/* Not readable as a file at all: a path through a regular file. */
	char through[600];
	snprintf(through, sizeof through, "%s/x", big);
	assert_int_equal(registry_load_file(through, &r, err, sizeof err), -1);
	assert_non_null(strstr(err, "Not a directory"));
	/* A path that does not fit. */
	char longp[5000];
	memset(longp, 'a', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	setenv("TOKI_MODEL_REGISTRY", longp, 1);
	assert_int_equal(registry_load(&r, err, sizeof err), -1);
	assert_non_null(strstr(err, "too long"));
	struct registry_model m = model("/x");
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "too long"));
	setenv("TOKI_MODEL_REGISTRY", regfile, 1);
}

/* groups: read, refused when a member is unknown or in two groups, kept
 * across a write, and a removed model leaves its group. */
static void test_groups(void **state)
{
	const char *models = "models:\n  a:\n    path: /a\n  b:\n    path: /b\n"
	                     "  c:\n    path: /c\n";
	char text[512];
	struct registry r;
	char err[512] = "";
	/* groups: before models: is fine; a model in none is in none. */
	snprintf(text, sizeof text, "groups:\n  coding: [a, b]\n%s", models);
	if (load_text(text, &r, err, sizeof err) != 0)
		fail_msg("%s", err);
	assert_int_equal(r.n_groups, 1);
	assert_string_equal(r.groups[0].name, "coding");
	assert_int_equal(r.groups[0].n_members, 2);
	assert_string_equal(r.groups[0].members[1], "b");
	assert_int_equal(registry_group_of(&r, "a"), 0);
	assert_int_equal(registry_group_of(&r, "b"), 0);
	assert_int_equal(registry_group_of(&r, "c"), -1);
	assert_int_equal(registry_group_of(&r, NULL), -1);
	registry_free(&r);
	assert_null(r.groups);

	snprintf(text, sizeof text, "%sgroups:\n  coding: [a, bb]\n", models);
	expect_error_at(text, 9, "groups.coding: 'bb' is not a model of the registry");
	snprintf(text, sizeof text, "%sgroups:\n  x: [a, b]\n  y: [c, a]\n", models);
	expect_error_at(text, 10, "groups.y: 'a' is already in group x");
	snprintf(text, sizeof text, "%sgroups:\n  x: [a, a]\n", models);
	expect_error_at(text, 9, "groups.x: 'a' is listed twice");
	snprintf(text, sizeof text, "%sgroups:\n  x: []\n", models);
	expect_error_at(text, 9, "groups.x: a group lists its models");
	snprintf(text, sizeof text, "%sgroups:\n  x: a\n", models);
	expect_error_at(text, 9, "groups.x: expected a list of strings");
	snprintf(text, sizeof text, "%sgroups:\n  x: [a]\n  x: [b]\n", models);
	expect_error_at(text, 10, "groups: 'x' is listed twice");
	snprintf(text, sizeof text, "%sgroups: [a, b]\n", models);
	expect_error_at(text, 8, "groups: expected a mapping of group names");
	snprintf(text, sizeof text, "%sgroups: {}\ngroups: {}\n", models);
	expect_error_at(text, 9, "duplicate key 'groups'");

	/* A `toki model` write keeps the groups; removing a member takes it out
	 * of its group, and a group left empty goes. */
	snprintf(text, sizeof text, "%sgroups:\n  x: [a, b]\n  y: [c]\n", models);
	write_file(regfile, text);
	struct registry_model d = model("/d");
	assert_int_equal(registry_set_model("d", &d, err, sizeof err), 0);
	assert_int_equal(registry_remove_model("a", err, sizeof err), 0);
	assert_int_equal(registry_remove_model("c", err, sizeof err), 0);
	if (registry_load(&r, err, sizeof err) != 0)
		fail_msg("%s", err);
	assert_int_equal(r.n, 2);
	assert_int_equal(r.n_groups, 1);
	assert_string_equal(r.groups[0].name, "x");
	assert_int_equal(r.groups[0].n_members, 1);
	assert_string_equal(r.groups[0].members[0], "b");
	registry_free(&r);
	char *written = read_file(regfile);
	assert_non_null(written);
	assert_non_null(strstr(written, "\ngroups:\n  x: [\"b\"]\n"));
	free(written);
}

/* --- Writing --------------------------------------------------------------- */

static void test_round_trip(void **state)
{
	char err[512] = "";
	char *args[] = {"-ngl", "99", "--jinja", "", "a b: #c", "true"};
	struct registry_model q = {
	    .path = "/home/u/.local/state/tokirecur/models/qwen3-4b/Qwen3-4B-Q4_K_M.gguf",
	    .repo = "Qwen/Qwen3-4B-GGUF",
	    .file = "Qwen3-4B-Q4_K_M.gguf",
	    .binary = "/opt/llama/bin/llama-server",
	    .ctx = 16384,
	    .max_output = 4096,
	    .args = args,
	    .n_args = 6,
	};
	/* Strings YAML would otherwise read as null, booleans or numbers, and
	 * ones that need quoting, all come back as the same strings. */
	struct registry_model odd = {
	    .path = "/weird: path #1/ü.gguf",
	    .repo = "null",
	    .file = "123",
	    .binary = "yes",
	};
	assert_int_equal(registry_set_model("qwen3-4b", &q, err, sizeof err), 0);
	assert_int_equal(registry_set_model("odd.name_2-x", &odd, err, sizeof err), 0);
	struct registry_model c = model("/m/c.gguf");
	assert_int_equal(registry_set_model("c", &c, err, sizeof err), 0);
	assert_int_equal(registry_set_active("odd.name_2-x", err, sizeof err), 0);

	struct registry r;
	if (registry_load(&r, err, sizeof err) != 0)
		fail_msg("%s", err);
	assert_int_equal(r.n, 3);
	assert_string_equal(r.models[0].name, "qwen3-4b");
	assert_string_equal(r.models[1].name, "odd.name_2-x");
	assert_string_equal(r.models[2].name, "c");
	const struct registry_model *m = &r.models[0];
	assert_string_equal(m->path, q.path);
	assert_string_equal(m->repo, q.repo);
	assert_string_equal(m->file, q.file);
	assert_string_equal(m->binary, q.binary);
	assert_int_equal(m->ctx, 16384);
	assert_int_equal(m->max_output, 4096);
	assert_int_equal(m->n_args, 6);
	for (int i = 0; i < 6; i++)
		assert_string_equal(m->args[i], args[i]);
	m = &r.models[1];
	assert_string_equal(m->path, odd.path);
	assert_string_equal(m->repo, "null");
	assert_string_equal(m->file, "123");
	assert_string_equal(m->binary, "yes");
	assert_int_equal(m->ctx, 0);
	assert_int_equal(m->n_args, 0);
	m = &r.models[2];
	assert_null(m->repo);
	assert_null(m->file);
	assert_null(m->binary);
	assert_null(m->args);
	assert_string_equal(r.active, "odd.name_2-x");
	registry_free(&r);

	/* The file is the documented shape: a flow list of quoted args, plain
	 * integers, non-ASCII kept as is, no temporary left behind. */
	char *text = read_file(regfile);
	assert_non_null(text);
	assert_non_null(strstr(text, "args: [\"-ngl\", \"99\", \"--jinja\", \"\", \"a b: #c\", "
	                             "\"true\"]"));
	assert_non_null(strstr(text, "    ctx: 16384\n"));
	assert_non_null(strstr(text, "repo: \"null\""));
	assert_non_null(strstr(text, "ü.gguf"));
	assert_non_null(strstr(text, "\nactive: odd.name_2-x\n"));
	free(text);
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp", regfile);
	struct stat st;
	assert_int_equal(stat(tmp, &st), -1);

	/* Replacing keeps the position; the other entries are untouched. */
	struct registry_model q2 = model("/new/q.gguf");
	q2.ctx = 8192;
	assert_int_equal(registry_set_model("qwen3-4b", &q2, err, sizeof err), 0);
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 3);
	assert_string_equal(r.models[0].name, "qwen3-4b");
	assert_string_equal(r.models[0].path, "/new/q.gguf");
	assert_int_equal(r.models[0].ctx, 8192);
	assert_null(r.models[0].repo);
	assert_int_equal(r.models[0].n_args, 0);
	assert_string_equal(r.models[1].repo, "null");
	registry_free(&r);
}

static void test_remove_and_active(void **state)
{
	char err[512] = "";
	struct registry_model m = model("/m/x.gguf");
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), 0);
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), 0);
	assert_int_equal(registry_set_model("c", &m, err, sizeof err), 0);
	assert_int_equal(registry_set_active("b", err, sizeof err), 0);

	/* Only a registered model can be active. */
	assert_int_equal(registry_set_active("zz", err, sizeof err), -1);
	assert_non_null(strstr(err, "no model named 'zz'"));
	assert_non_null(strstr(err, regfile));

	/* Removing another model keeps active; removing the active clears it. */
	assert_int_equal(registry_remove_model("a", err, sizeof err), 0);
	struct registry r;
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 2);
	assert_string_equal(r.active, "b");
	registry_free(&r);
	assert_int_equal(registry_remove_model("b", err, sizeof err), 0);
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 1);
	assert_string_equal(r.models[0].name, "c");
	assert_null(r.active);
	registry_free(&r);

	assert_int_equal(registry_remove_model("b", err, sizeof err), -1);
	assert_non_null(strstr(err, "no model named 'b'"));

	assert_int_equal(registry_set_active("c", err, sizeof err), 0);
	assert_int_equal(registry_set_active(NULL, err, sizeof err), 0);
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_null(r.active);
	registry_free(&r);

	/* The last model removed leaves a valid, empty registry. */
	assert_int_equal(registry_remove_model("c", err, sizeof err), 0);
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 0);
	registry_free(&r);
}

static void test_refuse_broken(void **state)
{
	const char *broken = "models:\n  a:\n    path: /x\n    cxt: 1\n";
	mkdirs("cfg");
	write_file(regfile, broken);
	char err[1024] = "";
	struct registry_model m = model("/m/b.gguf");
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "not changing the registry"));
	assert_non_null(strstr(err, "models.yaml:4:"));
	assert_non_null(strstr(err, "unknown key 'cxt'"));
	assert_int_equal(registry_remove_model("a", err, sizeof err), -1);
	assert_non_null(strstr(err, "unknown key 'cxt'"));
	assert_int_equal(registry_set_active("a", err, sizeof err), -1);
	assert_int_equal(registry_set_active(NULL, err, sizeof err), -1);
	char *text = read_file(regfile);
	assert_string_equal(text, broken);
	free(text);

	/* Broken YAML (not just a bad key) is refused the same way. */
	const char *bad_yaml = "models:\n  a:\n\tpath: /x\n";
	write_file(regfile, bad_yaml);
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "models.yaml:3:1:"));
	text = read_file(regfile);
	assert_string_equal(text, bad_yaml);
	free(text);
}

static void test_unsafe_names(void **state)
{
	const char *bad[] = {"../x", "a/b", "", ".", "..", "a b", "x\n", NULL};
	char err[512];
	struct registry_model m = model("/m/x.gguf");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		err[0] = '\0';
		assert_int_equal(registry_set_model(bad[i], &m, err, sizeof err), -1);
		assert_non_null(strstr(err, "is not a valid model name"));
		assert_int_equal(registry_remove_model(bad[i], err, sizeof err), -1);
		assert_non_null(strstr(err, "is not a valid model name"));
		if (bad[i]) /* NULL means: clear active */
			assert_int_equal(registry_set_active(bad[i], err, sizeof err), -1);
		assert_int_equal(registry_running_pid(bad[i]), 0);
		struct registry_purge pr;
		assert_int_equal(registry_purge_files(bad[i], NULL, &pr, err, sizeof err), -1);
	}
	/* 128 bytes is the longest name. */
	char name[130];
	memset(name, 'n', 129);
	name[129] = '\0';
	assert_int_equal(registry_set_model(name, &m, err, sizeof err), -1);
	name[128] = '\0';
	assert_int_equal(registry_set_model(name, &m, err, sizeof err), 0);
	/* Nothing unsafe reached the file. */
	struct registry r;
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 1);
	registry_free(&r);
}

static void test_bad_models(void **state)
{
	char err[512];
	struct registry_model m = model(NULL);
	assert_int_equal(registry_set_model("a", NULL, err, sizeof err), -1);
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "path to the GGUF file is required"));
	m.path = "";
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	m.path = "/x";
	m.ctx = -1;
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "ctx and max_output"));
	m.ctx = 0;
	m.max_output = (1L << 30) + 1;
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	m.max_output = 0;
	m.n_args = 2;
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "bad argument list"));
	char *args[] = {"x", NULL};
	m.args = args;
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "argument 1 is missing"));
	m.n_args = -1;
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	struct stat st;
	assert_int_equal(stat(regfile, &st), -1); /* none of these wrote anything */
}

static void test_write_errors(void **state)
{
	char err[512] = "";
	struct registry_model m = model("/x");
	/* The registry's directory cannot be created: its parent is a file. */
	char file[512], reg[600];
	tmp_path(file, sizeof file, "plainfile");
	write_file(file, "x");
	snprintf(reg, sizeof reg, "%s/sub/models.yaml", file);
	setenv("TOKI_MODEL_REGISTRY", reg, 1);
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot create"));
	/* The temporary cannot be written: a directory is in its place. The
	 * registry stays as it was. */
	setenv("TOKI_MODEL_REGISTRY", regfile, 1);
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), 0);
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp", regfile);
	assert_int_equal(mkdir(tmp, 0700), 0);
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, ".tmp"));
	struct registry r;
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, 1);
	registry_free(&r);
	rmdir(tmp);
	/* The lock cannot be opened: a directory is in its place. */
	char lock[600];
	snprintf(lock, sizeof lock, "%s.lock", regfile);
	unlink(lock);
	assert_int_equal(mkdir(lock, 0700), 0);
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, ".lock"));
	rmdir(lock);
	/* The rename fails: the registry is a non-empty directory. */
	unlink(regfile);
	mkdirs("cfg/models.yaml/x");
	assert_int_equal(registry_set_model("b", &m, err, sizeof err), -1);
	assert_non_null(strstr(err, "is a directory"));
}

/* A registry that is a symbolic link (dotfile managers) stays a link; the
 * file it points to is what changes. Its permissions are kept. */
static void test_symlink_and_mode(void **state)
{
	char err[512] = "";
	char real[512];
	mkdirs("dotfiles");
	mkdirs("cfg");
	tmp_path(real, sizeof real, "dotfiles/models.yaml");
	write_file(real, "models: {}\n");
	assert_int_equal(chmod(real, 0640), 0);
	assert_int_equal(symlink(real, regfile), 0);
	struct registry_model m = model("/x");
	assert_int_equal(registry_set_model("a", &m, err, sizeof err), 0);
	struct stat st;
	assert_int_equal(lstat(regfile, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(stat(real, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0640);
	struct registry r;
	assert_int_equal(registry_load_file(real, &r, err, sizeof err), 0);
	assert_int_equal(r.n, 1);
	registry_free(&r);
}

/* Eight processes each add their own model at once, a few times over: with
 * the lock every write sees the one before it, so all eight land. */
static void test_concurrent_writers(void **state)
{
	enum { N = 8, ROUNDS = 5 };
	pid_t pids[N];
	int go[2];
	assert_int_equal(pipe(go), 0);
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			close(go[1]);
			char c;
			/* Wait for the parent so all start together. */
			if (read(go[0], &c, 1) < 0)
				_exit(3);
			char name[32], path[64], err[512];
			snprintf(name, sizeof name, "model-%d", i);
			for (int k = 0; k < ROUNDS; k++) {
				snprintf(path, sizeof path, "/m/%d-%d.gguf", i, k);
				struct registry_model m = model(path);
				m.ctx = 1000 + k;
				if (registry_set_model(name, &m, err, sizeof err) != 0) {
					fprintf(stderr, "child %d: %s\n", i, err);
					_exit(1);
				}
			}
			_exit(0);
		}
	}
	close(go[0]);
	close(go[1]); /* EOF releases every child at once */
	for (int i = 0; i < N; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	struct registry r;
	char err[512];
	assert_int_equal(registry_load(&r, err, sizeof err), 0);
	assert_int_equal(r.n, N);
	for (int i = 0; i < N; i++) {
		char name[32], path[64];
		snprintf(name, sizeof name, "model-%d", i);
		snprintf(path, sizeof path, "/m/%d-%d.gguf", i, ROUNDS - 1);
		const struct registry_model *m = registry_find(&r, name);
		assert_non_null(m);
		assert_string_equal(m->path, path);
		assert_int_equal(m->ctx, 1000 + ROUNDS - 1);
	}
	registry_free(&r);
}

/* --- Run state and purge ----------------------------------------------------- */

static void write_pid(const char *name, const char *text)
{
	char rel[256], p[1024];
	snprintf(rel, sizeof rel, "state/run/%s", name);
	mkdirs(rel);
	snprintf(p, sizeof p, "%s/%s/serve.pid", tmpdir, rel);
	write_file(p, text);
}

static void test_running_pid(void **state)
{
	assert_int_equal(registry_running_pid("a"), 0); /* no file */
	char buf[32];
	snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
	write_pid("a", buf);
	assert_int_equal(registry_running_pid("a"), getpid());
	snprintf(buf, sizeof buf, "  %ld  ", (long)getpid());
	write_pid("a", buf);
	assert_int_equal(registry_running_pid("a"), getpid());
	/* A process that has exited (and been reaped). */
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(0);
	assert_int_equal(waitpid(child, NULL, 0), child);
	snprintf(buf, sizeof buf, "%ld\n", (long)child);
	write_pid("a", buf);
	assert_int_equal(registry_running_pid("a"), 0);
	const char *junk[] = {"", "abc", "-5", "0", "12x", "99999999999", "1 2"};
	for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
		write_pid("a", junk[i]);
		assert_int_equal(registry_running_pid("a"), 0);
	}
}

static void test_purge(void **state)
{
	char err[512] = "";
	struct registry_purge pr;
	/* Nothing downloaded: not an error. */
	assert_int_equal(registry_purge_files("m", NULL, &pr, err, sizeof err), 0);
	assert_int_equal(pr.deleted_dir, 0);
	assert_non_null(strstr(pr.dir, "/state/models/m"));

	/* toki's directory with a model, a partial download, a subdirectory,
	 * and a link to a user's file, which must survive. */
	mkdirs("state/models/m/sub");
	mkdirs("home");
	char p[512], user[512], link[512];
	tmp_path(p, sizeof p, "state/models/m/model.gguf");
	write_file(p, "0123456789");
	tmp_path(p, sizeof p, "state/models/m/model.gguf.part");
	write_file(p, "01234");
	tmp_path(p, sizeof p, "state/models/m/sub/x");
	write_file(p, "x");
	tmp_path(user, sizeof user, "home/mine.gguf");
	write_file(user, "users");
	tmp_path(link, sizeof link, "state/models/m/link.gguf");
	assert_int_equal(symlink(user, link), 0);
	tmp_path(p, sizeof p, "state/models/m/model.gguf");
	assert_int_equal(registry_purge_files("m", p, &pr, err, sizeof err), 0);
	assert_int_equal(pr.deleted_dir, 1);
	assert_int_equal(pr.kept_outside, 0);
	assert_int_equal(pr.n_files, 4);
	assert_int_equal(pr.bytes, 16);
	struct stat st;
	tmp_path(p, sizeof p, "state/models/m");
	assert_int_equal(lstat(p, &st), -1);
	assert_int_equal(stat(user, &st), 0);

	/* A registered file outside toki's directory is kept and reported. */
	mkdirs("state/models/m");
	assert_int_equal(registry_purge_files("m", user, &pr, err, sizeof err), 0);
	assert_int_equal(pr.deleted_dir, 1);
	assert_int_equal(pr.kept_outside, 1);
	assert_int_equal(stat(user, &st), 0);
	/* ... also when the path reaches outside through "..". */
	char sneaky[600];
	snprintf(sneaky, sizeof sneaky, "%s/state/models/m/../../../home/mine.gguf", tmpdir);
	mkdirs("state/models/m");
	assert_int_equal(registry_purge_files("m", sneaky, &pr, err, sizeof err), 0);
	assert_int_equal(pr.kept_outside, 1);
	assert_int_equal(stat(user, &st), 0);
	/* A missing outside file is nothing to keep. */
	assert_int_equal(registry_purge_files("m", "/nonexistent/x.gguf", &pr, err, sizeof err), 0);
	assert_int_equal(pr.kept_outside, 0);

	/* models/<name> itself a link to a user's directory: only the link goes. */
	char udir[512];
	mkdirs("home/models");
	tmp_path(udir, sizeof udir, "home/models");
	tmp_path(p, sizeof p, "home/models/keep.gguf");
	write_file(p, "keep");
	tmp_path(link, sizeof link, "state/models/m");
	assert_int_equal(symlink(udir, link), 0);
	assert_int_equal(registry_purge_files("m", NULL, &pr, err, sizeof err), 0);
	assert_int_equal(lstat(link, &st), -1);
	assert_int_equal(stat(p, &st), 0);

	/* Deeper than any download directory: refused, with a message. */
	mkdirs("state/models/m/1/2/3/4/5/6/7/8/9/10/11/12/13/14/15/16/17");
	assert_int_equal(registry_purge_files("m", NULL, &pr, err, sizeof err), -1);
	assert_non_null(strstr(err, "nested more than"));

	/* The state directory path does not fit. */
	char longp[5000];
	memset(longp, 'a', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	setenv("TOKI_STATE_DIR", longp, 1);
	assert_int_equal(registry_purge_files("m", NULL, &pr, err, sizeof err), -1);
	assert_non_null(strstr(err, "too long"));
	assert_int_equal(registry_running_pid("m"), 0);
	char st_dir[512];
	tmp_path(st_dir, sizeof st_dir, "state");
	setenv("TOKI_STATE_DIR", st_dir, 1);
	/* The models directory unreadable as such: a file in the way. */
	tmp_path(p, sizeof p, "state/models");
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && echo x > '%s'", p, p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(registry_purge_files("m", NULL, &pr, err, sizeof err), -1);
	assert_non_null(strstr(err, "Not a directory"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_empty_and_null, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_hand_written, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_broken_yaml, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_wrong_types, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unknown_keys, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unsafe_names_in_file, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_read_errors, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_groups, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_remove_and_active, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_refuse_broken, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unsafe_names, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_models, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_symlink_and_mode, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent_writers, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_running_pid, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
