/* Unit tests for choosing a llama.cpp release build (src/model/release.c):
 * the asset for a platform and backend, the CUDA build the driver runs, a
 * CUDA build's runtime companion, and whether a --list-devices listing has
 * a device of the backend. Pure: recorded API answers and tool outputs, no
 * network, no processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/release.h"
#include "platform/platform.h"

/* One asset of a GitHub release answer, as api.github.com gives it. */
#define ASSET(name, digest)                                                                        \
	"{\"url\": \"https://api.github.com/repos/ggml-org/llama.cpp/releases/assets/1\", "        \
	"\"id\": 1, \"name\": \"" name "\", \"label\": \"\", \"content_type\": "                   \
	"\"application/octet-stream\", \"state\": \"uploaded\", \"size\": 1000, "                  \
	"\"digest\": \"sha256:" digest "\", \"browser_download_url\": "                            \
	"\"https://github.com/ggml-org/llama.cpp/releases/download/b11462/" name "\"}"
#define D0 "00000000000000000000000000000000000000000000000000000000000000a0"
#define D1 "ABCDEF00000000000000000000000000000000000000000000000000000000a1"

/* llama.cpp b11462's assets (names as its release workflow writes them:
 * .github/workflows/release.yml's ubuntu-cuda, windows-cuda, ubuntu-22-rocm,
 * ubuntu-24-sycl, ubuntu-24-openvino, ubuntu-vulkan, ubuntu-cpu, macos-cpu,
 * windows* jobs), in the API's order (by name). The Linux CUDA runtime
 * archives carry the tag, Windows's do not. */
static const char
    b11462_json[] = "{\"url\": \"https://api.github.com/repos/ggml-org/llama.cpp/releases/1\", "
                    "\"tag_name\": \"b11462\", \"name\": \"b11462\", \"draft\": false, "
                    "\"prerelease\": false, "
                    "\"assets\": [" ASSET("cudart-llama-b11462-bin-ubuntu-cuda-12.8-arm64.tar.gz", D0) ", " ASSET("cudart-llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz",
                                                                                                                  D0) ", " ASSET("cudart-llama-b11462-bin-ubuntu-cuda-13.4-arm64.tar.gz",
                                                                                                                                 D0) ", " ASSET("cudart-llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz", D1) ", " ASSET("cudart-llama-bin-win-cuda-12.4-x64.zip", D0) ", " ASSET("cudart-llama-bin-win-cuda-13.4-x64.zip", D0) ", " ASSET("llama-b11462-bin-android-arm64.tar.gz", D0) ", " ASSET("llama-b11462-bin-macos-arm64.tar.gz", D0) ", " ASSET("llama-b11462-bin-macos-x64.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                      D0) ", " ASSET("llama-b11462-bin-ubuntu-arm64.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                     D0) ", " ASSET("llama-b11462-bin-ubuntu-cuda-12.8-arm64.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                    D0) ", " ASSET("llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-cuda-13.4-arm64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-openvino-2026.0-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-rocm-10.0-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-s390x.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                      D0) ", " ASSET("llama-b11462-bin-ubuntu-sycl-fp16-x64.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                     D0) ", " ASSET("llama-b11462-bin-ubuntu-sycl-fp32-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-vulkan-arm64.tar.gz", D0) ", " ASSET("llama-b11462-bin-ubuntu-vulkan-x64.tar.gz",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 D0) ", " ASSET("llama-b11462-bin-ubuntu-x64.tar.gz", D0) ", " ASSET("llama-b11462-bin-win-cpu-arm64.zip", D0) ", " ASSET("llama-b11462-bin-win-cpu-x64.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                          D0) ", " ASSET("llama-b11462-bin-win-cuda-12.4-x64.zip", D0) ", " ASSET("llama-b11462-bin-win-cuda-13.4-x64.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                  D0) ", " ASSET("llama-b11462-bin-win-openvino-2026.4.1-x64.zip", D0) ", " ASSET("llama-b11462-bin-win-rocm-10.0-x64.zip", D0) ", " ASSET("llama-b11462-bin-win-sycl-x64.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                           D0) ", " ASSET("llama-b11462-bin-win-vulkan-arm64.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                          D0) ", " ASSET("llama-b11462-bin-win-vulkan-x64.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                         D0) ", " ASSET("llama-b11462-ui.tar.gz", D0) ", " ASSET("llama-b11462-xcframework.zip",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 D0) "]}";

static struct release_info r;

static int setup(void **state)
{
	(void)state;
	char err[512];
	return release_parse(b11462_json, strlen(b11462_json), "b11462.json", &r, err, sizeof err);
}

static int teardown(void **state)
{
	(void)state;
	release_info_free(&r);
	return 0;
}

static const char *pick(const struct release_info *rel, const char *os, const char *arch,
                        const char *backend, const char *driver, char *err, size_t n)
{
	int i = release_choose_build(rel, os, arch, backend, driver, err, n);
	return i < 0 ? "none" : rel->assets[i].name;
}

static const char *companion(const struct release_info *rel, const char *main_name)
{
	for (size_t i = 0; i < rel->n; i++)
		if (!strcmp(rel->assets[i].name, main_name)) {
			int c = release_companion_asset(rel, i);
			return c == -1 ? "not needed" : c == -2 ? "missing" : rel->assets[c].name;
		}
	return "no such asset";
}

static void test_parse_the_api_answer(void **state)
{
	(void)state;
	assert_string_equal(r.tag, "b11462");
	assert_int_equal(r.n, 33);
	assert_string_equal(r.assets[3].name,
	                    "cudart-llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(r.assets[3].url, "https://github.com/ggml-org/llama.cpp/releases/"
	                                     "download/b11462/"
	                                     "cudart-llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	/* Digests are kept in lower case, as sha256_file writes them. */
	assert_string_equal(r.assets[3].sha256, "abcdef00000000000000000000000000000000000000000"
	                                        "000000000000000a1");
	assert_int_equal(r.assets[3].size, 1000);

	struct release_info bad;
	char err[512];
	assert_int_equal(
	    release_parse("{\"message\": \"Not Found\"}", 24, "x", &bad, err, sizeof err), -1);
	assert_non_null(strstr(err, "not a release"));
	assert_int_equal(release_parse("not json", 8, "x", &bad, err, sizeof err), -1);
	const char *evil = "{\"tag_name\": \"../b1\", \"assets\": []}";
	assert_int_equal(release_parse(evil, strlen(evil), "x", &bad, err, sizeof err), -1);
	assert_non_null(strstr(err, "not usable as a name"));
	/* An asset without a name or download URL is skipped, no digest is "". */
	const char *odd = "{\"tag_name\": \"b1\", \"assets\": [{\"name\": \"a\"}, {\"name\": "
	                  "\"b\", \"browser_download_url\": \"u\", \"digest\": \"md5:x\"}]}";
	assert_int_equal(release_parse(odd, strlen(odd), "x", &bad, err, sizeof err), 0);
	assert_int_equal(bad.n, 1);
	assert_string_equal(bad.assets[0].sha256, "");
	assert_int_equal(bad.assets[0].size, -1);
	release_info_free(&bad);
}

static void test_every_backend_today(void **state)
{
	(void)state;
	char err[4096];
	assert_string_equal(pick(&r, "ubuntu", "x64", "cpu", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "arm64", "cpu", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-arm64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "s390x", "cpu", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-s390x.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "vulkan", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-vulkan-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "arm64", "vulkan", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-vulkan-arm64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "rocm", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-rocm-10.0-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "openvino", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-openvino-2026.0-x64.tar.gz");
	/* Two SYCL builds: fp32, llama.cpp's default precision. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "sycl", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-sycl-fp32-x64.tar.gz");
	assert_string_equal(pick(&r, "macos", "arm64", "metal", NULL, err, sizeof err),
	                    "llama-b11462-bin-macos-arm64.tar.gz");
	assert_string_equal(pick(&r, "macos", "x64", "cpu", NULL, err, sizeof err),
	                    "llama-b11462-bin-macos-x64.tar.gz");
	/* CUDA on Linux, both CPUs: without a driver version, the newest. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "arm64", "cuda", NULL, err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-arm64.tar.gz");
	/* Windows: the CUDA, ROCm, OpenVINO, SYCL and Vulkan zips. */
	assert_string_equal(pick(&r, "win", "x64", "cuda", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-cuda-13.4-x64.zip");
	assert_string_equal(pick(&r, "win", "x64", "rocm", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-rocm-10.0-x64.zip");
	assert_string_equal(pick(&r, "win", "x64", "openvino", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-openvino-2026.4.1-x64.zip");
	assert_string_equal(pick(&r, "win", "x64", "sycl", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-sycl-x64.zip");
	assert_string_equal(pick(&r, "win", "arm64", "vulkan", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-vulkan-arm64.zip");
	assert_string_equal(pick(&r, "win", "arm64", "cpu", NULL, err, sizeof err),
	                    "llama-b11462-bin-win-cpu-arm64.zip");

	/* What there is not: refused with the builds there are, never a
	 * CUDA runtime archive, the UI or the xcframework. */
	assert_string_equal(pick(&r, "ubuntu", "arm64", "rocm", NULL, err, sizeof err), "none");
	assert_non_null(strstr(err, "has no rocm build for ubuntu arm64"));
	assert_non_null(strstr(err, "cuda 13.4 (llama-b11462-bin-ubuntu-cuda-13.4-arm64.tar.gz)"));
	assert_non_null(strstr(err, "ubuntu-cuda-12.8-x64"));
	assert_null(strstr(err, "cudart"));
	assert_null(strstr(err, "xcframework"));
	assert_null(strstr(err, "-ui"));
	assert_string_equal(pick(&r, "ubuntu", "x64", "metal", NULL, err, sizeof err), "none");
	assert_string_equal(pick(&r, "macos", "x64", "metal", NULL, err, sizeof err), "none");
}

static void test_cuda_build_the_driver_runs(void **state)
{
	(void)state;
	char err[4096];
	/* The newest CUDA at or below the driver's. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "13.4", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "13.10", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "14.0", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "13.0", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "12.9", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz");
	assert_string_equal(pick(&r, "ubuntu", "arm64", "cuda", "12.8", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-12.8-arm64.tar.gz");
	/* Below every build: one of the driver's major version (CUDA's minor
	 * version compatibility), never another major's. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "12.4", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz");
	assert_string_equal(pick(&r, "win", "x64", "cuda", "12.2", err, sizeof err),
	                    "llama-b11462-bin-win-cuda-12.4-x64.zip");
	assert_string_equal(pick(&r, "win", "x64", "cuda", "13.0", err, sizeof err),
	                    "llama-b11462-bin-win-cuda-12.4-x64.zip");
	assert_string_equal(pick(&r, "ubuntu", "x64", "cuda", "11.8", err, sizeof err), "none");
	assert_non_null(strstr(err, "runs CUDA 11.8 at most"));
	assert_non_null(strstr(err, "for CUDA 12.8, 13.4"));
	assert_non_null(strstr(err, "newer NVIDIA driver"));
	/* The driver's version means nothing to other backends. */
	assert_string_equal(pick(&r, "ubuntu", "x64", "vulkan", "11.8", err, sizeof err),
	                    "llama-b11462-bin-ubuntu-vulkan-x64.tar.gz");
	/* release_choose_asset is the choice without a driver. */
	int i = release_choose_asset(&r, "ubuntu", "x64", "cuda", err, sizeof err);
	assert_true(i >= 0);
	assert_string_equal(r.assets[i].name, "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
}

static void test_cuda_runtime_companions(void **state)
{
	(void)state;
	/* Linux: the runtime of the same CUDA, CPU and tag. */
	assert_string_equal(companion(&r, "llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz"),
	                    "cudart-llama-b11462-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(companion(&r, "llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz"),
	                    "cudart-llama-b11462-bin-ubuntu-cuda-12.8-x64.tar.gz");
	assert_string_equal(companion(&r, "llama-b11462-bin-ubuntu-cuda-12.8-arm64.tar.gz"),
	                    "cudart-llama-b11462-bin-ubuntu-cuda-12.8-arm64.tar.gz");
	/* Windows: the runtime zip without a tag. */
	assert_string_equal(companion(&r, "llama-b11462-bin-win-cuda-12.4-x64.zip"),
	                    "cudart-llama-bin-win-cuda-12.4-x64.zip");
	assert_string_equal(companion(&r, "llama-b11462-bin-win-cuda-13.4-x64.zip"),
	                    "cudart-llama-bin-win-cuda-13.4-x64.zip");
	/* Other builds need none. */
	assert_string_equal(companion(&r, "llama-b11462-bin-ubuntu-vulkan-x64.tar.gz"),
	                    "not needed");
	assert_string_equal(companion(&r, "llama-b11462-bin-win-rocm-10.0-x64.zip"), "not needed");
	assert_string_equal(companion(&r, "llama-b11462-ui.tar.gz"), "not needed");

	/* Either naming style on either OS; the tagged one first, then the
	 * build's archive type; another build's runtime never; a CUDA build
	 * without one is told apart from a build that needs none. */
	static const char json[] =
	    "{\"tag_name\": \"b7000\", \"assets\": ["
	    "{\"name\": \"llama-b7000-bin-ubuntu-cuda-13.4-x64.tar.gz\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-bin-ubuntu-cuda-13.4-x64.zip\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-bin-ubuntu-cuda-13.4-x64.tar.gz\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-b7000-bin-win-cuda-12.4-x64.zip\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-bin-win-cuda-12.4-x64.zip\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"llama-b7000-bin-win-cuda-12.4-x64.zip\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"llama-b7000-bin-ubuntu-cuda-12.8-arm64.tar.gz\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-b6999-bin-ubuntu-cuda-12.8-arm64.tar.gz\", "
	    "\"browser_download_url\": \"u\"}, "
	    "{\"name\": \"cudart-llama-b7000-bin-ubuntu-cuda-12.8-x64.tar.gz\", "
	    "\"browser_download_url\": \"u\"}]}";
	struct release_info x;
	char err[512];
	assert_int_equal(release_parse(json, strlen(json), "x", &x, err, sizeof err), 0);
	assert_string_equal(companion(&x, "llama-b7000-bin-ubuntu-cuda-13.4-x64.tar.gz"),
	                    "cudart-llama-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_string_equal(companion(&x, "llama-b7000-bin-win-cuda-12.4-x64.zip"),
	                    "cudart-llama-b7000-bin-win-cuda-12.4-x64.zip");
	assert_string_equal(companion(&x, "llama-b7000-bin-ubuntu-cuda-12.8-arm64.tar.gz"),
	                    "missing");
	/* The runtime archives are never builds of their own. */
	assert_string_equal(pick(&x, "ubuntu", "x64", "cuda", NULL, err, sizeof err),
	                    "llama-b7000-bin-ubuntu-cuda-13.4-x64.tar.gz");
	assert_int_equal(release_companion_asset(&x, 99), -1);
	release_info_free(&x);
}

static void test_nvidia_smi_cuda_version(void **state)
{
	(void)state;
	char v[16];
	const char *smi =
	    "Tue Sep 30 10:12:01 2026       \n"
	    "+-------------------------------------------------------------------------------------"
	    "----+\n"
	    "| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0 "
	    " "
	    "   |\n"
	    "|-----------------------------------------+------------------------+------------------"
	    "----+\n"
	    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. "
	    "ECC |\n"
	    "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                  "
	    "  0 |\n";
	assert_int_equal(release_parse_cuda_version(smi, v, sizeof v), 0);
	assert_string_equal(v, "13.0");
	assert_int_equal(release_parse_cuda_version("CUDA Version: 12.10 |", v, sizeof v), 0);
	assert_string_equal(v, "12.10");
	/* No CUDA in the driver, no header, no room. */
	assert_int_equal(release_parse_cuda_version("| CUDA Version: N/A |", v, sizeof v), -1);
	assert_int_equal(release_parse_cuda_version("CUDA Version: 12 |", v, sizeof v), -1);
	assert_int_equal(
	    release_parse_cuda_version("GPU 0: NVIDIA H100 (UUID: GPU-1)", v, sizeof v), -1);
	assert_int_equal(release_parse_cuda_version(NULL, v, sizeof v), -1);
	assert_int_equal(release_parse_cuda_version("CUDA Version: 12.4", v, 4), -1);
}

static int devices(const char *backend, const char *listing, int count_software, char *why,
                   size_t n)
{
	struct plat_gpus g;
	assert_true(plat_parse_list_devices(listing, &g) >= 0);
	return release_backend_devices(backend, &g, count_software, why, n);
}

static void test_devices_of_a_backend(void **state)
{
	(void)state;
	char why[1024];
	const char *cuda = "ggml_cuda_init: found 2 CUDA devices:\n"
	                   "load_backend: loaded CUDA backend from /x/libggml-cuda.so\n"
	                   "Available devices:\n"
	                   "  CUDA0: NVIDIA H100 80GB HBM3 (81559 MiB, 80000 MiB free)\n"
	                   "  CUDA1: NVIDIA H100 80GB HBM3 (81559 MiB, 80000 MiB free)\n";
	assert_int_equal(devices("cuda", cuda, 0, why, sizeof why), 2);
	assert_string_equal(why, "");
	/* A CUDA build that found no GPU, e.g. with an old driver. */
	const char *none = "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is "
	                   "insufficient for CUDA runtime version\n"
	                   "Available devices:\n"
	                   "  (none)\n";
	assert_int_equal(devices("cuda", none, 1, why, sizeof why), 0);
	assert_string_equal(why, "it lists no CUDA device (no device at all)");
	/* Vulkan on llvmpipe: a GPU only when asked for by name. */
	const char *llvmpipe = "Available devices:\n"
	                       "  Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (24105 MiB, 23767 MiB "
	                       "free)\n";
	assert_int_equal(devices("vulkan", llvmpipe, 0, why, sizeof why), 0);
	assert_non_null(strstr(why, "no Vulkan device but a software renderer"));
	assert_non_null(strstr(why, "only Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits)"));
	assert_int_equal(devices("vulkan", llvmpipe, 1, why, sizeof why), 1);
	/* A CUDA build whose CUDA is missing lists only what else it has. */
	assert_int_equal(devices("cuda", llvmpipe, 1, why, sizeof why), 0);
	assert_non_null(strstr(why, "it lists no CUDA device; only Vulkan0: llvmpipe"));
	const char *others = "Available devices:\n"
	                     "  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24462 MiB free)\n"
	                     "  Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 "
	                     "MiB free)\n"
	                     "  SYCL0: Intel(R) Arc(TM) A770 Graphics (15473 MiB, 15000 MiB free)\n"
	                     "  OPENVINO0: GGML_OPENVINO_DEVICE=GPU (15473 MiB, 15000 MiB free)\n"
	                     "  MTL0: Apple M3 Max (98304 MiB, 98304 MiB free)\n"
	                     "  Metal: Apple M1 (10922 MiB, 10922 MiB free)\n";
	assert_int_equal(devices("rocm", others, 0, why, sizeof why), 1);
	assert_int_equal(devices("vulkan", others, 0, why, sizeof why), 1);
	assert_int_equal(devices("sycl", others, 0, why, sizeof why), 1);
	assert_int_equal(devices("openvino", others, 0, why, sizeof why), 1);
	assert_int_equal(devices("metal", others, 0, why, sizeof why), 2);
	assert_int_equal(devices("cuda", others, 0, why, sizeof why), 0);
	/* The CPU needs no device. */
	assert_int_equal(devices("cpu", none, 0, why, sizeof why), 1);
	/* A name that only begins like a backend's is not one of its devices. */
	const char *odd = "Available devices:\n"
	                  "  CUDA_Host: pinned memory (100 MiB, 100 MiB free)\n"
	                  "  CUDAX0: something (100 MiB, 100 MiB free)\n";
	assert_int_equal(devices("cuda", odd, 1, why, sizeof why), 0);
	assert_int_equal(devices("cuda", cuda, 0, NULL, 0), 2);
}

static void test_next_backend(void **state)
{
	(void)state;
	assert_string_equal(release_next_backend("cuda"), "vulkan");
	assert_string_equal(release_next_backend("rocm"), "vulkan");
	assert_string_equal(release_next_backend("sycl"), "vulkan");
	assert_string_equal(release_next_backend("openvino"), "vulkan");
	assert_string_equal(release_next_backend("vulkan"), "cpu");
	assert_string_equal(release_next_backend("metal"), "cpu");
	assert_null(release_next_backend("cpu"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parse_the_api_answer),
	    cmocka_unit_test(test_every_backend_today),
	    cmocka_unit_test(test_cuda_build_the_driver_runs),
	    cmocka_unit_test(test_cuda_runtime_companions),
	    cmocka_unit_test(test_nvidia_smi_cuda_version),
	    cmocka_unit_test(test_devices_of_a_backend),
	    cmocka_unit_test(test_next_backend),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
