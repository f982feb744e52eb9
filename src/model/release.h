/* llama.cpp release builds: choosing, fetching, unpacking and finding them.
 *
 * Releases come from the GitHub API ({endpoint}/repos/ggml-org/llama.cpp/
 * releases/latest or /releases/tags/{tag}; endpoint $TOKI_LLAMA_RELEASES_URL,
 * default https://api.github.com). llama.cpp names its binary assets
 *   llama-<tag>-bin-<os>[-<backend>[-<version>]]-<arch>.<zip|tar.gz>
 * e.g. llama-b6000-bin-ubuntu-x64.zip (older), llama-b7400-bin-ubuntu-x64.tar.gz,
 * ...-ubuntu-vulkan-x64.tar.gz, ...-ubuntu-rocm-7.2-x64.tar.gz,
 * ...-ubuntu-openvino-2026.0-x64.tar.gz, ...-macos-arm64.tar.gz (with Metal),
 * ...-win-cuda-12.4-x64.zip. Linux and macOS builds have moved from .zip to
 * .tar.gz (which keeps the libraries' symbolic links); both are understood.
 *
 * An install lives in $state/llama/<name>/ (the archive's tree as is), with a
 * build.json beside the llama-server binary:
 *   {"tag", "backend", "asset", "url", "sha256", "sha256_verified",
 *    "llama_server", "gfx", "installed_at"}
 * gfx is the HSA_OVERRIDE_GFX_VERSION the launcher must set for that server
 * (ROCm on a GPU the build has no kernels for), or null. */
#ifndef TOKI_MODEL_RELEASE_H
#define TOKI_MODEL_RELEASE_H

#include <stddef.h>

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

/* The backends llama.cpp builds for: cpu cuda rocm sycl openvino vulkan metal. */
int release_backend_is_known(const char *backend);

/* The index of the asset for os/arch/backend (a .tar.gz before a .zip; of
 * several versions, e.g. two CUDA builds, the highest), or -1 with a message
 * that lists the builds the release has for this platform and in all. */
int release_choose_asset(const struct release_info *r, const char *os, const char *arch,
                         const char *backend, char *err, size_t errlen);

struct release_install_opts {
	const char *name;    /* install name (paths_is_safe_name) */
	const char *backend; /* recorded in build.json */
	const char *gfx;     /* "X.Y.Z" or NULL */
	int force;           /* replace an install of the same name */
};

/* Downloads the asset (checked against its digest when the API gave one),
 * unpacks it safely into $state/llama/<name>/ (via a temporary directory and
 * rename), finds llama-server and writes build.json. server gets the path of
 * llama-server. 0, or -1 with a message. */
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
