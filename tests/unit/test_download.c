/* Unit tests for choosing what to download: GGUFs from a hub listing
 * (src/model/hub.c) and llama.cpp release assets (src/model/release.c),
 * plus sha256_file (src/model/download.c). No network. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/download.h"
#include "model/hub.h"
#include "model/release.h"
#include "util/paths.h"

/* A listing of the given paths (every one with a made-up SHA-256). */
static struct hub_listing listing(const char *const *paths)
{
	struct hub_listing l = {0};
	while (paths[l.n])
		l.n++;
	l.files = calloc(l.n, sizeof *l.files);
	assert_non_null(l.files);
	for (size_t i = 0; i < l.n; i++) {
		l.files[i].path = strdup(paths[i]);
		l.files[i].size = 1;
		memset(l.files[i].sha256, 'a', 64);
	}
	return l;
}

/* Chooses and returns the chosen paths joined by spaces, or "ERR: <msg>". */
static char *choose(const char *const *paths, const char *file, const char *quant)
{
	struct hub_listing l = listing(paths);
	size_t *picked = NULL, n = 0;
	char err[2048];
	char *out = calloc(1, 4096);
	assert_non_null(out);
	if (hub_choose(&l, file, quant, &picked, &n, err, sizeof err) != 0) {
		snprintf(out, 4096, "ERR: %s", err);
	} else {
		for (size_t i = 0; i < n; i++) {
			strcat(out, i ? " " : "");
			strcat(out, l.files[picked[i]].path);
		}
	}
	free(picked);
	hub_listing_free(&l);
	return out;
}

static const char *const quants[] = {"README.md",
                                     "Model-Q4_K_M.gguf",
                                     "Model-Q4_K_S.gguf",
                                     "Model-IQ4_XS.gguf",
                                     "Model-Q8_0.gguf",
                                     "mmproj-Model-Q8_0.gguf",
                                     "BF16/Model-BF16-00002-of-00002.gguf",
                                     "BF16/Model-BF16-00001-of-00002.gguf",
                                     NULL};

static void test_quant_choice(void **state)
{
	(void)state;
	char *s = choose(quants, NULL, "q4_k_m");
	assert_string_equal(s, "Model-Q4_K_M.gguf");
	free(s);
	/* The projector is never a quant's model. */
	s = choose(quants, NULL, "Q8_0");
	assert_string_equal(s, "Model-Q8_0.gguf");
	free(s);
	/* Two substring matches, neither whole: ambiguous, both listed. */
	s = choose(quants, NULL, "Q4_K");
	assert_non_null(strstr(s, "ERR: quant Q4_K matches more than one"));
	assert_non_null(strstr(s, "Model-Q4_K_M.gguf"));
	assert_non_null(strstr(s, "Model-Q4_K_S.gguf"));
	free(s);
	/* A split model is one candidate, first shard first. */
	s = choose(quants, NULL, "bf16");
	assert_string_equal(s, "BF16/Model-BF16-00001-of-00002.gguf "
	                       "BF16/Model-BF16-00002-of-00002.gguf");
	free(s);
	s = choose(quants, NULL, "Q2_K");
	assert_non_null(strstr(s, "ERR: no GGUF in the repository matches quant Q2_K"));
	free(s);
}

static void test_whole_word_quant_wins(void **state)
{
	(void)state;
	static const char *const p[] = {"m-Q4_0.gguf", "m-IQ4_0.gguf", NULL};
	char *s = choose(p, NULL, "Q4_0");
	assert_string_equal(s, "m-Q4_0.gguf");
	free(s);
}

static void test_file_choice(void **state)
{
	(void)state;
	char *s = choose(quants, "Model-BF16-00002-of-00002.gguf", NULL);
	assert_string_equal(s, "BF16/Model-BF16-00001-of-00002.gguf "
	                       "BF16/Model-BF16-00002-of-00002.gguf");
	free(s);
	s = choose(quants, "Model-Q8_0.gguf", NULL);
	assert_string_equal(s, "Model-Q8_0.gguf");
	free(s);
	s = choose(quants, "README.md", NULL);
	assert_non_null(strstr(s, "ERR: README.md is not a .gguf file"));
	free(s);
	s = choose(quants, "Nope.gguf", NULL);
	assert_non_null(strstr(s, "ERR: the repository has no file Nope.gguf"));
	free(s);
	/* Neither: only a repository with one model has a default. */
	s = choose(quants, NULL, NULL);
	assert_non_null(strstr(s, "ERR: the repository has 5 models"));
	free(s);
	static const char *const one[] = {"a.gguf", "mmproj-a.gguf", "x.txt", NULL};
	s = choose(one, NULL, NULL);
	assert_string_equal(s, "a.gguf");
	free(s);
}

static void test_missing_shard(void **state)
{
	(void)state;
	static const char *const p[] = {"m-00001-of-00003.gguf", "m-00003-of-00003.gguf", NULL};
	char *s = choose(p, NULL, NULL);
	assert_non_null(strstr(s, "lacks shard(s) 00002"));
	free(s);
}

static void test_split_names(void **state)
{
	(void)state;
	int i, n;
	char prefix[256];
	assert_int_equal(hub_split_shard("d/x-00002-of-00010.gguf", &i, &n, prefix, sizeof prefix),
	                 1);
	assert_int_equal(i, 2);
	assert_int_equal(n, 10);
	assert_string_equal(prefix, "d/x");
	assert_int_equal(hub_split_shard("x-00000-of-00002.gguf", &i, &n, NULL, 0), 0);
	assert_int_equal(hub_split_shard("x-00003-of-00002.gguf", &i, &n, NULL, 0), 0);
	assert_int_equal(hub_split_shard("x-0001-of-0002.gguf", &i, &n, NULL, 0), 0);
	assert_int_equal(hub_split_shard("x.gguf", &i, &n, NULL, 0), 0);

	char name[160];
	hub_default_name("BF16/Model-BF16-00001-of-00002.gguf", name, sizeof name);
	assert_string_equal(name, "Model-BF16");
	hub_default_name("a b+c.gguf", name, sizeof name);
	assert_string_equal(name, "a-b-c");
}

static void test_urls_and_repos(void **state)
{
	(void)state;
	char url[512];
	assert_int_equal(
	    hub_resolve_url("https://hf.co", "o/r", "refs/pr/1", "d/a b.gguf", url, sizeof url), 0);
	assert_string_equal(url, "https://hf.co/o/r/resolve/refs%2Fpr%2F1/d/a%20b.gguf");
	assert_int_equal(hub_resolve_url("https://hf.co", "o/r", "main", "x.gguf", url, 20), -1);
	assert_true(hub_repo_is_valid("Qwen/Qwen3-4B-GGUF"));
	assert_false(hub_repo_is_valid("Qwen"));
	assert_false(hub_repo_is_valid("a/b/c"));
	assert_false(hub_repo_is_valid("../x"));
	assert_false(hub_repo_is_valid("a/.."));
	assert_false(hub_repo_is_valid("a/b c"));
}

/* Asset names as llama.cpp publishes them (release.yml, late 2025 on), and
 * the older .zip names. */
static const char *const b7400[] = {"cudart-llama-bin-win-cuda-12.4-x64.zip",
                                    "llama-b7400-bin-macos-arm64.tar.gz",
                                    "llama-b7400-bin-macos-x64.tar.gz",
                                    "llama-b7400-bin-ubuntu-arm64.tar.gz",
                                    "llama-b7400-bin-ubuntu-rocm-7.2-x64.tar.gz",
                                    "llama-b7400-bin-ubuntu-s390x.tar.gz",
                                    "llama-b7400-bin-ubuntu-vulkan-arm64.tar.gz",
                                    "llama-b7400-bin-ubuntu-vulkan-x64.tar.gz",
                                    "llama-b7400-bin-ubuntu-x64.tar.gz",
                                    "llama-b7400-bin-ubuntu-x64.zip",
                                    "llama-b7400-bin-ubuntu-openvino-2026.0-x64.tar.gz",
                                    "llama-b7400-bin-win-cpu-x64.zip",
                                    "llama-b7400-bin-win-cuda-12.4-x64.zip",
                                    "llama-b7400-bin-win-cuda-13.3-x64.zip",
                                    "llama-b7400-bin-win-hip-radeon-x64.zip",
                                    "llama-b7400-xcframework.zip",
                                    "llama-b7400-ui.tar.gz",
                                    NULL};

static struct release_info release_of(const char *const *names)
{
	struct release_info r = {0};
	r.tag = strdup("b7400");
	while (names[r.n])
		r.n++;
	r.assets = calloc(r.n, sizeof *r.assets);
	assert_non_null(r.assets);
	for (size_t i = 0; i < r.n; i++) {
		r.assets[i].name = strdup(names[i]);
		r.assets[i].url = strdup("http://x/");
	}
	return r;
}

static const char *pick(const struct release_info *r, const char *os, const char *arch,
                        const char *backend, char *err, size_t n)
{
	int i = release_choose_asset(r, os, arch, backend, err, n);
	return i < 0 ? "none" : r->assets[i].name;
}

static void test_release_assets(void **state)
{
	(void)state;
	struct release_info r = release_of(b7400);
	char err[4096];
	/* .tar.gz before .zip for the same build. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "cpu", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "vulkan", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-vulkan-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "arm64", "vulkan", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-vulkan-arm64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "rocm", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-rocm-7.2-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "openvino", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-openvino-2026.0-x64.tar.gz");
	assert_string_equal(pick(&r, "macos", "arm64", "metal", err, sizeof err),
	                    "llama-b7400-bin-macos-arm64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "s390x", "cpu", err, sizeof err),
	                    "llama-b7400-bin-ubuntu-s390x.tar.gz");
	/* Two CUDA builds: the newer; "hip" is ROCm. */
	assert_string_equal(pick(&r, "win", "x64", "cuda", err, sizeof err),
	                    "llama-b7400-bin-win-cuda-13.3-x64.zip");
	assert_string_equal(pick(&r, "win", "x64", "rocm", err, sizeof err),
	                    "llama-b7400-bin-win-hip-radeon-x64.zip");
	/* No Linux CUDA build: refused, with what there is. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", err, sizeof err), "none");
	assert_non_null(strstr(err, "no cuda build for ubuntu x64"));
	assert_non_null(strstr(err, "vulkan (llama-b7400-bin-ubuntu-vulkan-x64.tar.gz)"));
	assert_non_null(strstr(err, "rocm 7.2"));
	assert_null(strstr(err, "cudart"));
	assert_null(strstr(err, "xcframework"));
	assert_string_equal(pick(&r, "ubuntu", "x64", "metal", err, sizeof err), "none");
	release_info_free(&r);

	static const char *const b4000[] = {"llama-b4000-bin-ubuntu-x64.zip",
	                                    "llama-b4000-bin-ubuntu-vulkan-x64.zip",
	                                    "llama-b4000-bin-macos-arm64.zip", NULL};
	r = release_of(b4000);
	assert_string_equal(pick(&r, "ubuntu", "x64", "cpu", err, sizeof err),
	                    "llama-b4000-bin-ubuntu-x64.zip");
	assert_string_equal(pick(&r, "macos", "arm64", "cpu", err, sizeof err),
	                    "llama-b4000-bin-macos-arm64.zip");
	release_info_free(&r);
}

static void test_sha256_file(void **state)
{
	(void)state;
	char path[] = "/tmp/toki-sha-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "abc", 3), 3);
	close(fd);
	char hex[65];
	assert_int_equal(sha256_file(path, hex), 0);
	assert_string_equal(hex,
	                    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	unlink(path);
	assert_int_equal(sha256_file(path, hex), -1);
}

/* A fake install: $state/llama/<name>/<sub>/{llama-server,build.json}. */
static void fake_install(const char *state, const char *name, const char *sub, long long at,
                         const char *gfx)
{
	char dir[1024], path[1200];
	snprintf(dir, sizeof dir, "%s/llama/%s/%s", state, name, sub);
	assert_int_equal(paths_mkdir_p(dir, 0755), 0);
	snprintf(path, sizeof path, "%s/llama-server", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("#!/bin/sh\n", f);
	fclose(f);
	chmod(path, 0755);
	snprintf(path, sizeof path, "%s/build.json", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "{\"tag\": \"b1\", \"backend\": \"rocm\", \"installed_at\": %lld%s%s%s}\n", at,
	        gfx ? ", \"gfx\": \"" : "", gfx ? gfx : "", gfx ? "\"" : "");
	fclose(f);
}

static void test_find_installed_builds(void **state)
{
	(void)state;
	char root[] = "/tmp/toki-find-XXXXXX";
	assert_non_null(mkdtemp(root));
	setenv("TOKI_STATE_DIR", root, 1);
	char *old_path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	setenv("PATH", "/nonexistent", 1);
	char path[4096], err[512];
	struct release_build b;

	/* Nothing installed, nothing on PATH. */
	assert_int_equal(release_find_llama_server(NULL, path, sizeof path), -1);
	assert_int_equal(release_find_build(NULL, &b, err, sizeof err), -1);

	fake_install(root, "old", "llama-b1", 100, NULL);
	fake_install(root, "new", "build/bin", 200, "10.3.0");
	assert_int_equal(release_find_build(NULL, &b, err, sizeof err), 0);
	assert_string_equal(b.name, "new");
	assert_string_equal(b.gfx, "10.3.0");
	assert_string_equal(b.backend, "rocm");
	char want[2048];
	snprintf(want, sizeof want, "%s/llama/new/build/bin/llama-server", root);
	assert_string_equal(b.llama_server, want);

	assert_int_equal(release_build_of_server(b.llama_server, &b, err, sizeof err), 0);
	assert_string_equal(b.gfx, "10.3.0");
	assert_int_equal(release_build_of_server("/bin/sh", &b, err, sizeof err), -1);

	assert_int_equal(release_find_llama_server("old", path, sizeof path), 0);
	snprintf(want, sizeof want, "%s/llama/old/llama-b1/llama-server", root);
	assert_string_equal(path, want);
	assert_int_equal(release_find_build("old", &b, err, sizeof err), 0);
	assert_string_equal(b.gfx, "");

	assert_int_equal(release_find_llama_server("missing", path, sizeof path), -1);
	assert_int_equal(release_find_build("missing", &b, err, sizeof err), -1);
	assert_non_null(strstr(err, "no llama.cpp build is installed as missing"));
	assert_int_equal(release_find_build("../etc", &b, err, sizeof err), -1);

	/* Without a usable install, the PATH's llama-server. */
	fake_install(root, "x", "bin", 1, NULL);
	char bindir[1100];
	snprintf(bindir, sizeof bindir, "%s/llama/x/bin", root);
	setenv("PATH", bindir, 1);
	snprintf(want, sizeof want, "%s/llama-server", bindir);
	/* Installs without build.json do not count. */
	snprintf(path, sizeof path, "%s/llama/old/llama-b1/build.json", root);
	assert_int_equal(unlink(path), 0);
	snprintf(path, sizeof path, "%s/llama/new/build/bin/build.json", root);
	assert_int_equal(unlink(path), 0);
	snprintf(path, sizeof path, "%s/build.json", bindir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(release_find_llama_server(NULL, path, sizeof path), 0);
	assert_string_equal(path, want);

	if (old_path) {
		setenv("PATH", old_path, 1);
		free(old_path);
	}
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	assert_int_equal(system(cmd), 0);
	unsetenv("TOKI_STATE_DIR");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_quant_choice),
	    cmocka_unit_test(test_whole_word_quant_wins),
	    cmocka_unit_test(test_file_choice),
	    cmocka_unit_test(test_missing_shard),
	    cmocka_unit_test(test_split_names),
	    cmocka_unit_test(test_urls_and_repos),
	    cmocka_unit_test(test_release_assets),
	    cmocka_unit_test(test_sha256_file),
	    cmocka_unit_test(test_find_installed_builds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
