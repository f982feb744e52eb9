/* llama.cpp release builds: choosing, fetching, unpacking, checking and
 * finding them.
 *
 * Releases come from the GitHub API ({endpoint}/repos/ggml-org/llama.cpp/
 * releases/latest or /releases/tags/{tag}; endpoint $TOKI_LLAMA_RELEASES_URL,
 * default https://api.github.com). llama.cpp names its binary assets
 *   llama-<tag>-bin-<os>[-<backend>[-<version>]]-<arch>.<zip|tar.gz>
 * (.github/workflows/release.yml), e.g. llama-b6000-bin-ubuntu-x64.zip
 * (older), llama-b7400-bin-ubuntu-x64.tar.gz, ...-ubuntu-vulkan-x64.tar.gz,
 * ...-ubuntu-rocm-7.2-x64.tar.gz, ...-ubuntu-openvino-2026.0-x64.tar.gz,
 * ...-ubuntu-sycl-fp32-x64.tar.gz, ...-macos-arm64.tar.gz (with Metal),
 * ...-ubuntu-cuda-13.4-x64.tar.gz, ...-ubuntu-cuda-12.8-arm64.tar.gz,
 * ...-win-cuda-12.4-x64.zip. Linux and macOS builds have moved from .zip to
 * .tar.gz (which keeps the libraries' symbolic links); both are understood.
 *
 * A CUDA build comes without the CUDA runtime (libcudart, libcublas); the
 * release carries it beside the build as a companion archive, named after
 * the build with a "cudart-" prefix: cudart-llama-<tag>-bin-ubuntu-cuda-13.4-
 * x64.tar.gz on Linux, cudart-llama-bin-win-cuda-12.4-x64.zip (no tag) on
 * Windows. Its files are put beside llama-server, where the build's
 * libraries look for them (RPATH $ORIGIN on Linux; the executable's folder
 * on Windows), so the launcher needs no library path.
 *
 * Before an install is registered its llama-server is run with --version
 * and --list-devices: a build that does not start, or that sees no device
 * of its backend, is removed and reported, never registered.
 *
 * An install lives in $state/llama/<name>/ (the archive's tree as is), with a
 * build.json beside the llama-server binary:
 *   {"tag", "backend", "asset", "url", "sha256", "sha256_verified",
 *    "cudart": null or {"asset", "url", "sha256", "sha256_verified"},
 *    "version", "devices", "llama_server", "gfx", "installed_at"}
 * version is the first line of `llama-server --version`; devices the
 * --list-devices entries ("CUDA0: NVIDIA H100 80GB HBM3") seen at install.
 * gfx is the HSA_OVERRIDE_GFX_VERSION the launcher must set for that server
 * (ROCm on a GPU the build has no kernels for), or null. */
#ifndef TOKI_MODEL_RELEASE_H
#define TOKI_MODEL_RELEASE_H

#include <stddef.h>

#include "platform/platform.h"

#define RELEASE_DEFAULT_ENDPOINT "https://api.github.com"
#define RELEASE_REPO "ggml-org/llama.cpp"

struct release_asset {
	char *name;
	char *url;       /* browser_download_url */
	long long size;  /* -1 when absent */
	char sha256[65]; /* from the API's "digest": "sha256:<hex>", else "" */
};

struct release_info {
	char *tag;
	struct release_asset *assets;
	size_t n;
};

/* Fetches the release tagged tag, or the latest when tag is NULL.
 * $GITHUB_TOKEN, when set, is sent to the API (higher rate limits). */
int release_fetch(const char *tag, struct release_info *out, char *err, size_t errlen);
/* Reads the API's answer (a release object) into out; what release_fetch
 * does with the body. what names its source in messages. 0, or -1. */
int release_parse(const char *body, size_t len, const char *what, struct release_info *out,
                  char *err, size_t errlen);
void release_info_free(struct release_info *r);

/* This machine as llama.cpp's asset names say it: os "ubuntu" (any Linux) or
 * "macos"; arch "x64", "arm64" or "s390x". -1 with a message elsewhere. */
int release_platform(const char **os, const char **arch, char *err, size_t errlen);

/* The backends a machine can use, best first, always ending in "cpu":
 * nvidia-smi → cuda, rocminfo (with a gfx agent) → rocm, sycl-ls (with a GPU)
 * → sycl, vulkaninfo (with a GPU) → vulkan, Apple silicon → metal. Each tool
 * is run only if it is on PATH, and killed after a few seconds. Fills list
 * (up to max entries, static strings) and returns the count. When rocminfo
 * names a gfx target it is copied to gfx (else gfx is ""). */
int release_detect_backends(const char **list, int max, char *gfx, size_t gfxlen);

/* The CUDA version the NVIDIA driver supports, from the header of plain
 * `nvidia-smi` output ("| NVIDIA-SMI 580.65.06  Driver Version: 580.65.06
 * CUDA Version: 13.0 |"): 0 with out "13.0", or -1 when it says none. */
int release_parse_cuda_version(const char *nvidia_smi, char *out, size_t n);
/* Runs nvidia-smi (when on PATH; killed after a few seconds) and parses its
 * header as above. 0, or -1 (no nvidia-smi, no answer, no version). */
int release_cuda_driver_version(char *out, size_t n);

/* The backends llama.cpp builds for: cpu cuda rocm sycl openvino vulkan metal. */
int release_backend_is_known(const char *backend);

/* The backend to try when a build of backend does not work on this machine:
 * cuda, rocm, sycl, openvino → vulkan; vulkan, metal → cpu; cpu → NULL. */
const char *release_next_backend(const char *backend);

/* The index of the asset for os/arch/backend (a .tar.gz before a .zip; of
 * several versions, e.g. two CUDA builds, the highest), or -1 with a message
 * that lists the builds the release has for this platform and in all.
 * As release_choose_build with no driver version. */
int release_choose_asset(const struct release_info *r, const char *os, const char *arch,
                         const char *backend, char *err, size_t errlen);

/* As release_choose_asset; for cuda with cuda_driver (the driver's "X.Y",
 * or NULL or "" when unknown): the newest CUDA build the driver supports,
 * i.e. the highest version <= X.Y; else the highest of major X (CUDA's
 * minor version compatibility lets a 12.8 runtime run on a 12.4 driver);
 * else -1 with a message naming the driver's version and the builds'. Of
 * two SYCL builds, fp32 (llama.cpp's default) wins over fp16. */
int release_choose_build(const struct release_info *r, const char *os, const char *arch,
                         const char *backend, const char *cuda_driver, char *err, size_t errlen);

/* The companion archive of the build at index asset: the release's
 * "cudart-" archive for the same platform, with the build's tag
 * (cudart-llama-b7000-bin-ubuntu-cuda-13.4-x64.tar.gz) or without one
 * (cudart-llama-bin-win-cuda-12.4-x64.zip); of several, the one with the
 * tag, then the one of the build's archive type. Its index; -1 when the
 * build is not a CUDA build and the release has none for it; -2 for a CUDA
 * build the release has no companion for. */
int release_companion_asset(const struct release_info *r, size_t asset);

/* Whether a --list-devices listing has a device of backend (CUDA0 for cuda,
 * ROCm0 rocm, Vulkan0 vulkan, SYCL0 sycl, OPENVINO0 openvino, MTL0 or Metal
 * metal). Software devices (llvmpipe, lavapipe) count only when
 * count_software (the backend was asked for by name). cpu needs none.
 * Returns how many there are (cpu: 1); when 0, why says what was listed. */
int release_backend_devices(const char *backend, const struct plat_gpus *g, int count_software,
                            char *why, size_t n);

struct release_install_opts {
	const char *name;    /* install name (paths_is_safe_name) */
	const char *backend; /* recorded in build.json; its devices are checked */
	const char *gfx;     /* "X.Y.Z" or NULL */
	int force;           /* replace an install of the same name */
	int count_software;  /* a software device (llvmpipe) satisfies the check */
	const struct release_asset *companion; /* the cudart archive, or NULL */
};

/* Downloads the asset and its companion (each checked against its digest
 * when the API gave one), unpacks them safely into a temporary directory
 * (the companion's files flat beside llama-server), runs llama-server
 * --version and --list-devices there, and only when it starts and lists a
 * device of the backend writes build.json and renames the directory to
 * $state/llama/<name>/ (an install of that name is replaced only then).
 * server gets the path of llama-server. 0; -1 with a message when it could
 * not be fetched or unpacked; -2 when the build does not work on this
 * machine (err: why, with the tail of what llama-server printed). Nothing
 * is left behind on failure. */
int release_install(const struct release_info *r, size_t asset,
                    const struct release_install_opts *o, char *server, size_t n, char *err,
                    size_t errlen);

/* Unpacks a zip or tar(.gz) archive into dir, which must exist: no absolute
 * paths, no "..", no links that point outside dir, no devices or FIFOs.
 * 0, or -1 with a message (dir may then hold part of the archive). */
int release_unpack(const char *archive, const char *dir, char *err, size_t errlen);

/* An installed build, as its build.json says. */
struct release_build {
	char name[160];
	char dir[4096];          /* $state/llama/<name> */
	char llama_server[4096]; /* the binary */
	char tag[64];
	char backend[32];
	char gfx[32]; /* "" when none */
	long long installed_at;
};

/* The build installed under name, or, when name is NULL, the newest install.
 * 0, or -1 (err says why: no such install, none at all, a broken build.json). */
int release_find_build(const char *name, struct release_build *b, char *err, size_t errlen);

/* The build a llama-server binary belongs to, from the build.json beside it
 * (name and dir are left ""): for a registered model whose `binary` is an
 * installed build, so that its gfx is applied too. -1 when there is none. */
int release_build_of_server(const char *llama_server, struct release_build *b, char *err,
                            size_t errlen);

/* The llama-server to run: the install called name; when name is NULL, the
 * newest install, else the first llama-server on PATH. 0 with its path, or -1
 * (with name given: no such install; without: none installed and none on
 * PATH). */
int release_find_llama_server(const char *name, char *path, size_t n);

#endif
