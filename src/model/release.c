/* llama.cpp release builds: choose, fetch, unpack, check, find (release.h). */
#include "model/release.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>

#include "model/download.h"
#include "platform/platform.h"
#include "util/paths.h"
#include "util/err.h"

/* A detection tool that has not answered by then is taken as absent: a hung
 * driver must not hang the install. */
#define PROBE_TIMEOUT_MS 5000
#define PROBE_OUTPUT_MAX 65536
/* How deep below an install's root llama-server and build.json may sit
 * (archives put it at llama-<tag>/ or build/bin/). */
#define SEARCH_DEPTH 5

/* --- the release API ----------------------------------------------------- */

static const char *releases_endpoint(char *buf, size_t n)
{
	const char *e = getenv("TOKI_LLAMA_RELEASES_URL");
	if (!e || !*e)
		e = RELEASE_DEFAULT_ENDPOINT;
	snprintf(buf, n, "%s", e);
	size_t l = strlen(buf);
	while (l > 1 && buf[l - 1] == '/')
		buf[--l] = '\0';
	return buf;
}

static int is_hex64(const char *s)
{
	if (strlen(s) != 64)
		return 0;
	for (int i = 0; i < 64; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return 1;
}

void release_info_free(struct release_info *r)
{
	for (size_t i = 0; i < r->n; i++) {
		free(r->assets[i].name);
		free(r->assets[i].url);
	}
	free(r->assets);
	free(r->tag);
	memset(r, 0, sizeof *r);
}

static void api_message(const char *body, char *out, size_t n)
{
	json_t *j = json_loads(body ? body : "", 0, NULL);
	const char *m = json_string_value(json_object_get(j, "message"));
	snprintf(out, n, "%s", m ? m : body ? body : "");
	json_decref(j);
	for (char *p = out; *p; p++)
		if ((unsigned char)*p < 0x20)
			*p = ' ';
	if (strlen(out) > 200)
		strcpy(out + 197, "...");
}

int release_fetch(const char *tag, struct release_info *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (tag && !paths_is_safe_name(tag)) {
		err_set(err, errlen, "'%s' is not a release tag (expected e.g. b6000)", tag);
		return -1;
	}
	char ep[2048], url[4096];
	releases_endpoint(ep, sizeof ep);
	if (tag)
		snprintf(url, sizeof url, "%s/repos/%s/releases/tags/%s", ep, RELEASE_REPO, tag);
	else
		snprintf(url, sizeof url, "%s/repos/%s/releases/latest", ep, RELEASE_REPO);
	const char *token = getenv("GITHUB_TOKEN");
	char *body = NULL;
	size_t len = 0;
	long status = 0;
	if (download_to_memory(url, token && *token ? token : NULL, &body, &len, &status, err,
	                       errlen) != 0)
		return -1;
	if (status != 200) {
		char msg[256];
		api_message(body, msg, sizeof msg);
		free(body);
		if (status == 404 && tag)
			err_set(err, errlen, "llama.cpp has no release tagged %s (%s: HTTP 404)",
			        tag, url);
		else if (status == 403 || status == 429)
			err_set(err, errlen, "the release API refused the request (HTTP %ld: %s)%s",
			        status, msg,
			        token && *token ? ""
			                        : "; a GITHUB_TOKEN raises GitHub's rate limit");
		else
			err_set(err, errlen, "fetching %s failed: HTTP %ld: %s", url, status, msg);
		return -1;
	}
	int rc = release_parse(body, len, url, out, err, errlen);
	free(body);
	return rc;
}

int release_parse(const char *body, size_t len, const char *what, struct release_info *out,
                  char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	json_error_t je;
	json_t *j = json_loadb(body, len, 0, &je);
	const char *tag_name = json_string_value(json_object_get(j, "tag_name"));
	json_t *assets = json_object_get(j, "assets");
	if (!tag_name || !json_is_array(assets)) {
		json_decref(j);
		err_set(err, errlen, "the answer from %s is not a release (no tag_name or assets)",
		        what);
		return -1;
	}
	if (!paths_is_safe_name(tag_name)) {
		/* tag_name belongs to j: said before j goes. */
		err_set(err, errlen, "the release's tag '%s' is not usable as a name", tag_name);
		json_decref(j);
		return -1;
	}
	out->tag = strdup(tag_name);
	out->assets = calloc(json_array_size(assets) + 1, sizeof *out->assets);
	if (!out->tag || !out->assets)
		goto oom;
	size_t i;
	json_t *a;
	json_array_foreach(assets, i, a)
	{
		const char *name = json_string_value(json_object_get(a, "name"));
		const char *dl = json_string_value(json_object_get(a, "browser_download_url"));
		if (!name || !dl)
			continue;
		struct release_asset *x = &out->assets[out->n];
		x->name = strdup(name);
		x->url = strdup(dl);
		if (!x->name || !x->url) {
			free(x->name);
			free(x->url);
			goto oom;
		}
		out->n++;
		json_t *size = json_object_get(a, "size");
		x->size = json_is_integer(size) ? (long long)json_integer_value(size) : -1;
		const char *digest = json_string_value(json_object_get(a, "digest"));
		if (digest && !strncmp(digest, "sha256:", 7) && is_hex64(digest + 7))
			for (int k = 0; k <= 64; k++)
				x->sha256[k] = (char)tolower((unsigned char)digest[7 + k]);
	}
	json_decref(j);
	return 0;
oom:
	json_decref(j);
	release_info_free(out);
	err_set(err, errlen, "out of memory");
	return -1;
}

/* --- this machine -------------------------------------------------------- */

int release_platform(const char **os, const char **arch, char *err, size_t errlen)
{
	struct utsname u;
	if (uname(&u) != 0) {
		err_set(err, errlen, "uname failed: %s", strerror(errno));
		return -1;
	}
	if (!strcmp(u.sysname, "Linux")) {
		*os = "ubuntu"; /* llama.cpp's Linux builds are named for Ubuntu */
	} else if (!strcmp(u.sysname, "Darwin")) {
		*os = "macos";
	} else {
		err_set(err, errlen, "llama.cpp publishes no builds toki can use for %s",
		        u.sysname);
		return -1;
	}
	if (!strcmp(u.machine, "x86_64") || !strcmp(u.machine, "amd64")) {
		*arch = "x64";
	} else if (!strcmp(u.machine, "aarch64") || !strcmp(u.machine, "arm64")) {
		*arch = "arm64";
	} else if (!strcmp(u.machine, "s390x")) {
		*arch = "s390x";
	} else {
		err_set(err, errlen, "llama.cpp publishes no builds for the %s CPU", u.machine);
		return -1;
	}
	return 0;
}

static int on_path(const char *tool, char *out, size_t n)
{
	const char *path = getenv("PATH");
	if (!path || !*path)
		return 0;
	const char *p = path;
	while (*p) {
		const char *colon = strchr(p, ':');
		size_t len = colon ? (size_t)(colon - p) : strlen(p);
		if (len > 0 && (size_t)snprintf(out, n, "%.*s/%s", (int)len, p, tool) < n) {
			struct stat st;
			if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
				return 1;
		}
		if (!colon)
			break;
		p = colon + 1;
	}
	return 0;
}

/* Runs tool (found on PATH) with one argument, collecting stdout; killed
 * with its process group after PROBE_TIMEOUT_MS. Returns the exit status,
 * or -1 when it could not run or did not finish. */
static int probe(const char *tool, const char *arg, char *out, size_t n)
{
	char exe[4096];
	out[0] = '\0';
	if (!on_path(tool, exe, sizeof exe))
		return -1;
	char *const args[] = {exe, (char *)arg, NULL};
	struct plat_cmd c = {.argv = args, .timeout_ms = PROBE_TIMEOUT_MS};
	int timed_out = 0;
	int st = plat_run(&c, out, n, NULL, &timed_out);
	if (timed_out)
		fprintf(stderr, "toki: %s did not answer within %d s; ignoring it\n", tool,
		        PROBE_TIMEOUT_MS / 1000);
	return st;
}

/* The first "gfxNNNN" agent name in rocminfo's output. */
static void first_gfx(const char *s, char *gfx, size_t n)
{
	for (const char *p = strstr(s, "gfx"); p; p = strstr(p + 3, "gfx")) {
		size_t k = 3;
		while (isalnum((unsigned char)p[k]))
			k++;
		if (k > 3 && k < n) {
			memcpy(gfx, p, k);
			gfx[k] = '\0';
			return;
		}
	}
}

int release_detect_backends(const char **list, int max, char *gfx, size_t gfxlen)
{
	int n = 0;
	char *out = malloc(PROBE_OUTPUT_MAX);
	if (gfx && gfxlen)
		gfx[0] = '\0';
	if (out) {
		if (n < max - 1 && probe("nvidia-smi", "-L", out, PROBE_OUTPUT_MAX) == 0 &&
		    strstr(out, "GPU"))
			list[n++] = "cuda";
		if (n < max - 1 && probe("rocminfo", NULL, out, PROBE_OUTPUT_MAX) == 0 &&
		    strstr(out, "gfx")) {
			list[n++] = "rocm";
			if (gfx && gfxlen)
				first_gfx(out, gfx, gfxlen);
		}
		if (n < max - 1 && probe("sycl-ls", NULL, out, PROBE_OUTPUT_MAX) == 0 &&
		    strstr(out, ":gpu"))
			list[n++] = "sycl";
		/* llvmpipe is a Vulkan device too, but a CPU one. */
		if (n < max - 1 && probe("vulkaninfo", "--summary", out, PROBE_OUTPUT_MAX) == 0 &&
		    (strstr(out, "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU") ||
		     strstr(out, "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU")))
			list[n++] = "vulkan";
		free(out);
	}
	struct utsname u;
	if (n < max - 1 && uname(&u) == 0 && !strcmp(u.sysname, "Darwin") &&
	    !strcmp(u.machine, "arm64"))
		list[n++] = "metal";
	if (n < max)
		list[n++] = "cpu";
	return n;
}

int release_parse_cuda_version(const char *nvidia_smi, char *out, size_t n)
{
	/* The header's "CUDA Version: 13.0" is the newest CUDA the driver
	 * runs; "CUDA Version: N/A" (a driver with no CUDA) is not a version. */
	const char *p = nvidia_smi ? strstr(nvidia_smi, "CUDA Version:") : NULL;
	if (!p || !n)
		return -1;
	p += strlen("CUDA Version:");
	while (*p == ' ' || *p == '\t')
		p++;
	size_t k = 0;
	while (isdigit((unsigned char)p[k]))
		k++;
	if (k == 0 || p[k] != '.' || !isdigit((unsigned char)p[k + 1]))
		return -1;
	k++;
	while (isdigit((unsigned char)p[k]))
		k++;
	if (k >= n)
		return -1;
	memcpy(out, p, k);
	out[k] = '\0';
	return 0;
}

int release_cuda_driver_version(char *out, size_t n)
{
	char *text = malloc(PROBE_OUTPUT_MAX);
	if (!text)
		return -1;
	int rc = probe("nvidia-smi", NULL, text, PROBE_OUTPUT_MAX) == 0
	             ? release_parse_cuda_version(text, out, n)
	             : -1;
	free(text);
	return rc;
}

const char *release_next_backend(const char *backend)
{
	/* Vulkan drives NVIDIA, AMD and Intel GPUs alike, so it is what a GPU
	 * whose own stack does not work here falls back to before the CPU. */
	if (!strcmp(backend, "cuda") || !strcmp(backend, "rocm") || !strcmp(backend, "sycl") ||
	    !strcmp(backend, "openvino"))
		return "vulkan";
	if (!strcmp(backend, "vulkan") || !strcmp(backend, "metal"))
		return "cpu";
	return NULL;
}

static const char *const known_backends[] = {"cpu",      "cuda",   "rocm", "sycl",
                                             "openvino", "vulkan", "metal"};

int release_backend_is_known(const char *backend)
{
	for (size_t i = 0; i < sizeof known_backends / sizeof known_backends[0]; i++)
		if (!strcmp(backend, known_backends[i]))
			return 1;
	return 0;
}

/* --- asset names --------------------------------------------------------- */

struct asset_kind {
	char os[64];
	char arch[64];
	char backend[64];   /* "cpu" when the name has none */
	char version[64];   /* e.g. "12.4", "7.2", "fp32"; "" when none */
	int tar;            /* .tar.gz rather than .zip */
	char platform[128]; /* the name between "-bin-" and the extension */
};

/* Parses llama-<tag>-bin-<os>[-<backend>[-<version>...]]-<arch>.<ext>.
 * 0 for a binary build, -1 for anything else (cudart, xcframework, ui). */
static int parse_asset(const char *name, struct asset_kind *k)
{
	memset(k, 0, sizeof *k);
	if (strncmp(name, "llama-", 6) != 0)
		return -1;
	const char *bin = strstr(name, "-bin-");
	if (!bin)
		return -1;
	const char *p = bin + 5;
	size_t len = strlen(p);
	if (len > 7 && !strcmp(p + len - 7, ".tar.gz")) {
		len -= 7;
		k->tar = 1;
	} else if (len > 4 && !strcmp(p + len - 4, ".tgz")) {
		len -= 4;
		k->tar = 1;
	} else if (len > 4 && !strcmp(p + len - 4, ".zip")) {
		len -= 4;
	} else {
		return -1;
	}
	if (len == 0 || len >= sizeof k->platform)
		return -1;
	memcpy(k->platform, p, len);
	k->platform[len] = '\0';
	char parts[8][64];
	int np = 0;
	char tmp[128];
	snprintf(tmp, sizeof tmp, "%s", k->platform);
	char *save = NULL;
	for (char *t = strtok_r(tmp, "-", &save); t; t = strtok_r(NULL, "-", &save)) {
		if (np == 8 || strlen(t) >= 64)
			return -1;
		snprintf(parts[np++], 64, "%s", t);
	}
	if (np < 2)
		return -1;
	/* Same sizes, and each part is NUL-terminated within its 64 bytes. */
	memcpy(k->os, parts[0], sizeof k->os);
	memcpy(k->arch, parts[np - 1], sizeof k->arch);
	if (np == 2) {
		snprintf(k->backend, sizeof k->backend, "cpu");
		return 0;
	}
	/* Windows names its ROCm builds "hip-radeon". */
	if (!strcmp(parts[1], "hip"))
		strcpy(k->backend, "rocm");
	else
		memcpy(k->backend, parts[1], sizeof k->backend);
	size_t o = 0;
	for (int i = 2; i < np - 1; i++)
		o += (size_t)snprintf(k->version + o, sizeof k->version - o, "%s%s", o ? "-" : "",
		                      parts[i]);
	return 0;
}

/* On macOS the plain arm64 build is the Metal build (the x64 one is built
 * with -DGGML_METAL=OFF). */
static int backend_matches(const struct asset_kind *k, const char *backend)
{
	if (!strcmp(backend, "metal"))
		return !strcmp(k->os, "macos") && !strcmp(k->arch, "arm64") &&
		       !strcmp(k->backend, "cpu");
	return !strcmp(k->backend, backend);
}

/* Of two builds of one backend for one platform, whether a is to be
 * preferred: the higher version (two CUDA builds: the newer; SYCL's fp32,
 * llama.cpp's default, over fp16, as strverscmp orders them), then .tar.gz
 * (it keeps the libraries' symbolic links) over .zip. */
static int better_build(const struct asset_kind *a, const struct asset_kind *b)
{
	int c = plat_strverscmp(a->version, b->version);
	return c > 0 || (c == 0 && a->tar && !b->tar);
}

static long version_major(const char *v)
{
	return isdigit((unsigned char)v[0]) ? strtol(v, NULL, 10) : -1;
}

int release_choose_asset(const struct release_info *r, const char *os, const char *arch,
                         const char *backend, char *err, size_t errlen)
{
	return release_choose_build(r, os, arch, backend, NULL, err, errlen);
}

int release_choose_build(const struct release_info *r, const char *os, const char *arch,
                         const char *backend, const char *cuda_driver, char *err, size_t errlen)
{
	int best = -1, fit = -1, compat = -1;
	struct asset_kind bk = {0}, fk = {0}, ck = {0};
	int by_driver = !strcmp(backend, "cuda") && cuda_driver && *cuda_driver;
	long driver_major = by_driver ? version_major(cuda_driver) : -1;
	for (size_t i = 0; i < r->n; i++) {
		struct asset_kind k;
		if (parse_asset(r->assets[i].name, &k) != 0)
			continue;
		if (strcmp(k.os, os) != 0 || strcmp(k.arch, arch) != 0 ||
		    !backend_matches(&k, backend))
			continue;
		if (best < 0 || better_build(&k, &bk)) {
			best = (int)i;
			bk = k;
		}
		if (!by_driver)
			continue;
		if (plat_strverscmp(k.version, cuda_driver) <= 0) {
			if (fit < 0 || better_build(&k, &fk)) {
				fit = (int)i;
				fk = k;
			}
		} else if (version_major(k.version) == driver_major) {
			if (compat < 0 || better_build(&k, &ck)) {
				compat = (int)i;
				ck = k;
			}
		}
	}
	if (best >= 0 && !by_driver)
		return best;
	if (fit >= 0)
		return fit;
	if (compat >= 0)
		return compat;
	if (best >= 0) {
		char versions[512] = "";
		size_t vo = 0;
		for (size_t i = 0; i < r->n && vo < sizeof versions; i++) {
			struct asset_kind k;
			if (parse_asset(r->assets[i].name, &k) == 0 && !strcmp(k.os, os) &&
			    !strcmp(k.arch, arch) && backend_matches(&k, backend))
				vo += (size_t)snprintf(versions + vo, sizeof versions - vo, "%s%s",
				                       vo ? ", " : "", k.version);
		}
		err_set(err, errlen,
		        "the NVIDIA driver here runs CUDA %s at most (nvidia-smi says so), and "
		        "llama.cpp %s's CUDA builds for %s %s are for CUDA %s: a newer NVIDIA "
		        "driver runs them",
		        cuda_driver, r->tag, os, arch, versions);
		return -1;
	}
	char here[1024] = "", all[2048] = "";
	size_t ho = 0, ao = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct asset_kind k;
		if (parse_asset(r->assets[i].name, &k) != 0)
			continue;
		if (!strcmp(k.os, os) && !strcmp(k.arch, arch) && ho < sizeof here)
			ho += (size_t)snprintf(here + ho, sizeof here - ho, "%s%s%s%s (%s)",
			                       ho ? ", " : "", k.backend, k.version[0] ? " " : "",
			                       k.version, r->assets[i].name);
		if (ao < sizeof all && !strstr(all, k.platform))
			ao += (size_t)snprintf(all + ao, sizeof all - ao, "%s%s", ao ? ", " : "",
			                       k.platform);
	}
	err_set(err, errlen,
	        "llama.cpp %s has no %s build for %s %s. Builds for %s %s in this release: %s. "
	        "All its builds: %s",
	        r->tag, backend, os, arch, os, arch, here[0] ? here : "none",
	        all[0] ? all : "none");
	return -1;
}

/* The tag part of a build's name: "b7000" in llama-b7000-bin-..., "" in
 * Windows's cudart-llama-bin-... . */
static void asset_tag(const char *name, char *out, size_t n)
{
	const char *p = name + strlen("llama-");
	const char *bin = strstr(name, "-bin-");
	size_t len = bin && bin >= p ? (size_t)(bin - p) : 0;
	snprintf(out, n, "%.*s", (int)len, p);
}

int release_companion_asset(const struct release_info *r, size_t asset)
{
	struct asset_kind main_k;
	if (asset >= r->n || parse_asset(r->assets[asset].name, &main_k) != 0)
		return -1;
	char main_tag[128];
	asset_tag(r->assets[asset].name, main_tag, sizeof main_tag);
	int best = -1, best_score = -1;
	for (size_t i = 0; i < r->n; i++) {
		const char *name = r->assets[i].name;
		struct asset_kind k;
		if (strncmp(name, "cudart-", 7) != 0 || parse_asset(name + 7, &k) != 0 ||
		    strcmp(k.platform, main_k.platform) != 0)
			continue;
		char tag[128];
		asset_tag(name + 7, tag, sizeof tag);
		if (tag[0] && strcmp(tag, main_tag) != 0)
			continue; /* another build's runtime */
		int score = (tag[0] ? 2 : 0) + (k.tar == main_k.tar);
		if (score > best_score) {
			best = (int)i;
			best_score = score;
		}
	}
	if (best >= 0)
		return best;
	return strcmp(main_k.backend, "cuda") == 0 ? -2 : -1;
}

/* The names a backend's devices have in --list-devices: ggml's device
 * names (CUDA0; ROCm0 from ggml-cuda built for HIP; MTL0, "Metal" before
 * ggml-metal's rename; OPENVINO0). */
static const char *const *device_prefixes(const char *backend)
{
	static const char *const cuda[] = {"CUDA", NULL}, *const rocm[] = {"ROCm", "HIP", NULL},
	                         *const vulkan[] = {"Vulkan", NULL}, *const sycl[] = {"SYCL", NULL},
	                         *const openvino[] = {"OPENVINO", NULL},
	                         *const metal[] = {"MTL", "Metal", NULL};
	if (!strcmp(backend, "cuda"))
		return cuda;
	if (!strcmp(backend, "rocm"))
		return rocm;
	if (!strcmp(backend, "vulkan"))
		return vulkan;
	if (!strcmp(backend, "sycl"))
		return sycl;
	if (!strcmp(backend, "openvino"))
		return openvino;
	if (!strcmp(backend, "metal"))
		return metal;
	return NULL;
}

/* "CUDA0" is a device of "CUDA"; "CUDAX" or "CUDA_Host" are not. */
static int device_of(const char *name, const char *const *prefixes)
{
	for (; *prefixes; prefixes++) {
		size_t l = strlen(*prefixes);
		if (!strncmp(name, *prefixes, l)) {
			const char *p = name + l;
			while (isdigit((unsigned char)*p))
				p++;
			if (*p == '\0')
				return 1;
		}
	}
	return 0;
}

int release_backend_devices(const char *backend, const struct plat_gpus *g, int count_software,
                            char *why, size_t n)
{
	if (why && n)
		why[0] = '\0';
	const char *const *prefixes = device_prefixes(backend);
	if (!prefixes)
		return 1; /* cpu: the CPU is always there */
	int found = 0, software = 0;
	for (int i = 0; i < g->n; i++) {
		if (!device_of(g->dev[i].name, prefixes))
			continue;
		if (plat_gpu_is_software(&g->dev[i]) && !count_software)
			software++;
		else
			found++;
	}
	if (found || !why || !n)
		return found;
	if (g->n == 0) {
		snprintf(why, n, "it lists no %s device (no device at all)", prefixes[0]);
		return 0;
	}
	size_t o = (size_t)snprintf(why, n, "it lists no %s device%s", prefixes[0],
	                            software ? " but a software renderer, which is no GPU "
	                                       "(named with --backend it would do)"
	                                     : "");
	for (int i = 0; i < g->n && o < n; i++)
		o += (size_t)snprintf(why + o, n - o, "%s%s: %s", i ? ", " : "; only ",
		                      g->dev[i].name, g->dev[i].desc);
	return 0;
}

/* --- unpacking ----------------------------------------------------------- */

/* Cleans an archive path into out: strips "./" and leading "./" parts,
 * refuses absolute paths, "..", empty names. Returns the depth of its
 * directory (components before the last), or -1. */
static int clean_member(const char *path, char *out, size_t n)
{
	if (!path || !*path || path[0] == '/')
		return -1;
	size_t o = 0;
	int parts = 0;
	const char *p = path;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);
		if (len == 2 && p[0] == '.' && p[1] == '.')
			return -1;
		if (len > 0 && !(len == 1 && p[0] == '.')) {
			if (o + len + 2 > n)
				return -1;
			if (o)
				out[o++] = '/';
			memcpy(out + o, p, len);
			o += len;
			parts++;
		}
		if (!slash)
			break;
		p = slash + 1;
	}
	out[o] = '\0';
	if (!parts)
		return -1;
	return parts - 1;
}

/* A symbolic link at a member whose directory is depth levels deep may point
 * to target only if resolving it by name stays inside the root. */
static int link_stays_inside(int depth, const char *target)
{
	if (!target || !*target || target[0] == '/')
		return 0;
	const char *p = target;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);
		if (len == 2 && p[0] == '.' && p[1] == '.') {
			if (--depth < 0)
				return 0;
		} else if (len > 0 && !(len == 1 && p[0] == '.')) {
			depth++;
		}
		if (!slash)
			break;
		p = slash + 1;
	}
	return 1;
}

static int copy_data(struct archive *in, struct archive *out)
{
	for (;;) {
		const void *buf;
		size_t size;
		la_int64_t offset;
		int r = archive_read_data_block(in, &buf, &size, &offset);
		if (r == ARCHIVE_EOF)
			return ARCHIVE_OK;
		if (r < ARCHIVE_WARN)
			return r;
		if (archive_write_data_block(out, buf, size, offset) < ARCHIVE_WARN)
			return ARCHIVE_FATAL;
	}
}

static int unpack_here(const char *archive, char *err, size_t errlen)
{
	struct archive *in = archive_read_new();
	struct archive *out = archive_write_disk_new();
	struct archive_entry *e;
	int rc = -1;
	if (!in || !out) {
		err_set(err, errlen, "out of memory");
		goto done;
	}
	archive_read_support_filter_all(in);
	archive_read_support_format_zip(in);
	archive_read_support_format_tar(in);
	archive_read_support_format_gnutar(in);
	/* Our own checks come first; these are libarchive's second line. */
	archive_write_disk_set_options(
	    out, ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
	             ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
	if (archive_read_open_filename(in, archive, 65536) != ARCHIVE_OK) {
		err_set(err, errlen,
		        "cannot open the archive %s (a .zip or .tar.gz was expected): %s", archive,
		        archive_error_string(in));
		goto done;
	}
	int members = 0;
	for (;;) {
		int r = archive_read_next_header(in, &e);
		if (r == ARCHIVE_EOF)
			break;
		if (r < ARCHIVE_WARN) {
			err_set(err, errlen, "the archive %s is damaged: %s", archive,
			        archive_error_string(in));
			goto done;
		}
		const char *raw = archive_entry_pathname(e);
		char path[4096];
		int depth = clean_member(raw, path, sizeof path);
		if (depth < 0) {
			err_set(err, errlen,
			        "the archive has a member with an unsafe path '%s' (absolute or "
			        "with ..); refusing to unpack it",
			        raw ? raw : "");
			goto done;
		}
		mode_t type = archive_entry_filetype(e);
		const char *hard = archive_entry_hardlink(e);
		if (hard) {
			char target[4096];
			if (clean_member(hard, target, sizeof target) < 0) {
				err_set(err, errlen,
				        "the archive's hard link %s points to an unsafe path '%s'; "
				        "refusing to unpack it",
				        raw, hard);
				goto done;
			}
			archive_entry_set_hardlink(e, target);
		} else if (type == AE_IFLNK) {
			const char *target = archive_entry_symlink(e);
			if (!link_stays_inside(depth, target)) {
				err_set(
				    err, errlen,
				    "the archive's symbolic link %s points outside it (to '%s'); "
				    "refusing to unpack it",
				    raw, target ? target : "");
				goto done;
			}
		} else if (type != AE_IFREG && type != AE_IFDIR) {
			err_set(err, errlen,
			        "the archive member %s is not a file, directory or link; refusing "
			        "to unpack it",
			        raw);
			goto done;
		}
		archive_entry_set_pathname(e, path);
		/* No set-id bits from a downloaded archive; directories stay
		 * writable by us so that a failed install can be removed. */
		mode_t perm = archive_entry_perm(e) & 0777;
		if (type == AE_IFDIR)
			perm |= 0700;
		archive_entry_set_perm(e, perm);
		r = archive_write_header(out, e);
		if (r < ARCHIVE_WARN) {
			err_set(err, errlen, "cannot unpack %s: %s", path,
			        archive_error_string(out));
			goto done;
		}
		if (archive_entry_size(e) > 0 && copy_data(in, out) != ARCHIVE_OK) {
			err_set(err, errlen, "cannot unpack %s: %s", path,
			        archive_error_string(out) ? archive_error_string(out)
			                                  : archive_error_string(in));
			goto done;
		}
		if (archive_write_finish_entry(out) < ARCHIVE_WARN) {
			err_set(err, errlen, "cannot finish %s: %s", path,
			        archive_error_string(out));
			goto done;
		}
		members++;
	}
	if (!members) {
		err_set(err, errlen, "the archive %s is empty", archive);
		goto done;
	}
	rc = 0;
done:
	if (in)
		archive_read_free(in);
	if (out)
		archive_write_free(out);
	return rc;
}

int release_unpack(const char *archive, const char *dir, char *err, size_t errlen)
{
	/* libarchive's symlink checks look at every component of a member's
	 * path; relative to dir they cover only what the archive creates, not
	 * symlinks the user has above the state directory. Hence the chdir. */
	char abs_archive[4096];
	if (archive[0] != '/') {
		char cwd[2048];
		if (!getcwd(cwd, sizeof cwd)) {
			err_set(err, errlen, "getcwd: %s", strerror(errno));
			return -1;
		}
		snprintf(abs_archive, sizeof abs_archive, "%s/%s", cwd, archive);
		archive = abs_archive;
	}
	int saved = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (saved < 0) {
		err_set(err, errlen, "cannot open the current directory: %s", strerror(errno));
		return -1;
	}
	if (chdir(dir) != 0) {
		err_set(err, errlen, "cannot enter %s: %s", dir, strerror(errno));
		close(saved);
		return -1;
	}
	int rc = unpack_here(archive, err, errlen);
	if (fchdir(saved) != 0 && rc == 0) {
		err_set(err, errlen, "cannot return to the working directory: %s", strerror(errno));
		rc = -1;
	}
	close(saved);
	return rc;
}

/* --- checking a build ---------------------------------------------------- */

/* How long `llama-server --version` or `--list-devices` may take: loading
 * a GPU backend initialises its driver (seconds on a machine with several
 * GPUs), and a wedged driver must not hang the install.
 * $TOKI_LIST_DEVICES_TIMEOUT_MS, which context sizing's --list-devices
 * heeds too, sets another limit. */
#define VERIFY_TIMEOUT_MS 60000
#define VERIFY_OUTPUT_MAX (256 * 1024)
/* How much of what a failing llama-server printed the report quotes: the
 * loader's or the backend's complaint is in its last lines. */
#define TAIL_LINES 12
#define TAIL_BYTES 2000

/* The last lines of text (at most TAIL_LINES and TAIL_BYTES), each
 * indented, into out; control characters from the downloaded program are
 * shown as '?' so that they cannot drive the terminal. */
static void tail_lines(const char *text, char *out, size_t n)
{
	size_t len = strlen(text);
	while (len > 0 && isspace((unsigned char)text[len - 1]))
		len--;
	if (len == 0) {
		snprintf(out, n, "    (nothing)");
		return;
	}
	const char *end = text + len, *start = end;
	int lines = 0;
	while (start > text && (size_t)(end - start) < TAIL_BYTES) {
		if (start[-1] == '\n' && ++lines == TAIL_LINES)
			break;
		start--;
	}
	size_t o = 0;
	int bol = 1;
	for (const char *p = start; p < end && o + 6 < n; p++) {
		if (bol) {
			memcpy(out + o, "    ", 4);
			o += 4;
			bol = 0;
		}
		unsigned char ch = (unsigned char)*p;
		if (ch == '\n')
			bol = 1;
		else if (ch == '\r')
			continue;
		else if (ch < 0x20 && ch != '\t')
			ch = '?';
		else if (ch == 0x7f)
			ch = '?';
		out[o++] = (char)ch;
	}
	out[o] = '\0';
}

/* Runs `server arg` as the launcher will run it (the same environment, and
 * the build's HSA_OVERRIDE_GFX_VERSION), stdout and stderr together into
 * out. 0 when it exited 0, else -1 with why. */
static int run_server(const char *server, const char *arg, char *const env[], char *out, size_t n,
                      char *why, size_t whylen)
{
	char *const argv[] = {(char *)server, (char *)arg, NULL};
	const char *t = getenv("TOKI_LIST_DEVICES_TIMEOUT_MS");
	int timeout_ms = t && atoi(t) > 0 ? atoi(t) : VERIFY_TIMEOUT_MS;
	struct plat_cmd c = {
	    .argv = argv, .env_extra = env, .timeout_ms = timeout_ms, .merge_stderr = 1};
	int timed_out = 0;
	int st = plat_run(&c, out, n, NULL, &timed_out);
	if (st == 0)
		return 0;
	char tail[TAIL_BYTES + TAIL_LINES * 8];
	tail_lines(out, tail, sizeof tail);
	if (timed_out)
		err_set(why, whylen,
		        "`llama-server %s` did not finish within %.1f s (a hung GPU driver?); it "
		        "printed:\n%s",
		        arg, timeout_ms / 1000.0, tail);
	else if (st < 0)
		err_set(
		    why, whylen,
		    "`llama-server %s` could not run or was killed by a signal; it printed:\n%s",
		    arg, tail);
	else
		err_set(why, whylen, "`llama-server %s` failed (exit status %d); it printed:\n%s",
		        arg, st, tail);
	return -1;
}

struct server_check {
	char version[256];    /* the "version: ..." line */
	struct plat_gpus gpu; /* what --list-devices listed */
	int listed;           /* whether --list-devices answered */
};

/* Whether the unpacked build runs here and sees a device of its backend.
 * 0, or -1 with why. */
static int check_server(const char *server, const struct release_install_opts *o,
                        struct server_check *c, char *why, size_t whylen)
{
	memset(c, 0, sizeof *c);
	char *out = malloc(VERIFY_OUTPUT_MAX);
	if (!out) {
		err_set(why, whylen, "out of memory");
		return -1;
	}
	char env_gfx[64];
	char *env[2] = {NULL, NULL};
	if (o->gfx) {
		snprintf(env_gfx, sizeof env_gfx, "HSA_OVERRIDE_GFX_VERSION=%s", o->gfx);
		env[0] = env_gfx;
	}
	int cpu = !strcmp(o->backend, "cpu");
	int rc = -1;
	if (run_server(server, "--version", env, out, VERIFY_OUTPUT_MAX, why, whylen) != 0)
		goto done;
	const char *v = strstr(out, "version:");
	if (v) {
		size_t l = strcspn(v, "\r\n");
		snprintf(c->version, sizeof c->version, "%.*s", (int)l, v);
		for (char *p = c->version; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
	}
	char lerr[TAIL_BYTES + 512] = "";
	int ran = run_server(server, "--list-devices", env, out, VERIFY_OUTPUT_MAX, lerr,
	                     sizeof lerr) == 0;
	if (!ran || plat_parse_list_devices(out, &c->gpu) < 0) {
		if (cpu) {
			/* Builds from before --list-devices (early 2025) still
			 * run on the CPU; --version showed that they start. */
			rc = 0;
			goto done;
		}
		if (ran) {
			char tail[TAIL_BYTES + TAIL_LINES * 8];
			tail_lines(out, tail, sizeof tail);
			err_set(lerr, sizeof lerr,
			        "`llama-server --list-devices` printed no device listing:\n%s",
			        tail);
		}
		err_set(why, whylen, "%s", lerr);
		goto done;
	}
	c->listed = 1;
	char what[1024];
	if (release_backend_devices(o->backend, &c->gpu, o->count_software, what, sizeof what) ==
	    0) {
		char tail[TAIL_BYTES + TAIL_LINES * 8];
		tail_lines(out, tail, sizeof tail);
		err_set(why, whylen, "%s; `llama-server --list-devices` printed:\n%s", what, tail);
		goto done;
	}
	rc = 0;
done:
	free(out);
	return rc;
}

/* --- installing ---------------------------------------------------------- */

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* rm -rf that never follows a link out of dir. */
static void remove_tree(const char *dir)
{
	nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The shallowest regular file called name under dir, at most SEARCH_DEPTH
 * levels down; links are not followed. *best is the depth of the best so
 * far (-1: none yet); returns whether one was found. */
static int find_file(const char *dir, const char *name, int depth, char *out, size_t n, int *best)
{
	if (*best >= 0 && depth >= *best)
		return 1;
	DIR *d = opendir(dir);
	if (!d)
		return *best >= 0;
	struct dirent *de;
	char sub[4096];
	struct stat st;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, name) != 0 ||
		    (size_t)snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) >= sizeof sub)
			continue;
		if (lstat(sub, &st) == 0 && S_ISREG(st.st_mode)) {
			snprintf(out, n, "%s", sub);
			*best = depth;
		}
	}
	if (depth < SEARCH_DEPTH && (*best < 0 || depth + 1 < *best)) {
		rewinddir(d);
		while ((de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
			    (size_t)snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) >=
			        sizeof sub)
				continue;
			if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
				find_file(sub, name, depth + 1, out, n, best);
		}
	}
	closedir(d);
	return *best >= 0;
}

/* Moves every file and symbolic link under dir (SEARCH_DEPTH levels at
 * most) into dest, flat: the CUDA runtime's libraries must sit beside
 * llama-server and its libggml-cuda, whatever folders their archive has. A
 * link keeps only its target's last component, which the flattening puts
 * beside it (unpacking let no link point outside the archive). A name dest
 * has already keeps the build's own file (a LICENSE, say). Returns the
 * number moved, or -1 with a message. */
static int move_flat(const char *dir, const char *dest, int depth, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	if (!d) {
		err_set(err, errlen, "cannot read %s: %s", dir, strerror(errno));
		return -1;
	}
	int moved = 0;
	struct dirent *de;
	char from[4096], to[4096], target[4096];
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		struct stat st;
		if ((size_t)snprintf(from, sizeof from, "%s/%s", dir, de->d_name) >= sizeof from ||
		    (size_t)snprintf(to, sizeof to, "%s/%s", dest, de->d_name) >= sizeof to ||
		    lstat(from, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			int k = depth < SEARCH_DEPTH ? move_flat(from, dest, depth + 1, err, errlen)
			                             : 0;
			if (k < 0) {
				closedir(d);
				return -1;
			}
			moved += k;
			continue;
		}
		if (lstat(to, &st) == 0) {
			fprintf(stderr,
			        "toki: note: the build has its own %s; the CUDA runtime archive's "
			        "copy is left out\n",
			        de->d_name);
			continue;
		}
		int r;
		ssize_t tl;
		if (lstat(from, &st) == 0 && S_ISLNK(st.st_mode) &&
		    (tl = readlink(from, target, sizeof target - 1)) > 0) {
			target[tl] = '\0';
			const char *base = strrchr(target, '/');
			r = symlink(base ? base + 1 : target, to);
		} else {
			r = rename(from, to);
		}
		if (r != 0) {
			err_set(err, errlen, "cannot move %s to %s: %s", from, to, strerror(errno));
			closedir(d);
			return -1;
		}
		moved++;
	}
	closedir(d);
	return moved;
}

static json_t *asset_json(const struct release_asset *a, int verified)
{
	return json_pack("{s:s, s:s, s:s?, s:b}", "asset", a->name, "url", a->url, "sha256",
	                 a->sha256[0] ? a->sha256 : NULL, "sha256_verified", verified);
}

static int write_build_json(const char *path, const char *tag, const struct release_asset *a,
                            int verified, const struct release_asset *cudart, int cudart_verified,
                            const struct server_check *c, const char *server,
                            const struct release_install_opts *o, char *err, size_t errlen)
{
	json_t *devices = json_array();
	for (int i = 0; devices && i < c->gpu.n; i++) {
		char d[200];
		snprintf(d, sizeof d, "%s: %s", c->gpu.dev[i].name, c->gpu.dev[i].desc);
		json_array_append_new(devices, json_string(d));
	}
	json_t *rt = cudart ? asset_json(cudart, cudart_verified) : json_null();
	json_t *j =
	    devices && rt
	        ? json_pack("{s:s, s:s, s:s, s:s, s:s?, s:b, s:o, s:s?, s:o, s:s, s:s?, s:I}",
	                    "tag", tag, "backend", o->backend, "asset", a->name, "url", a->url,
	                    "sha256", a->sha256[0] ? a->sha256 : NULL, "sha256_verified", verified,
	                    "cudart", rt, "version", c->version[0] ? c->version : NULL, "devices",
	                    devices, "llama_server", server, "gfx", o->gfx, "installed_at",
	                    (json_int_t)time(NULL))
	        : NULL;
	if (!j) {
		if (!devices || !rt) {
			json_decref(devices);
			json_decref(rt);
		}
		err_set(err, errlen, "cannot build build.json (out of memory?)");
		return -1;
	}
	int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS);
	json_decref(j);
	if (rc != 0) {
		err_set(err, errlen, "cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Downloads a into dest, checked against its digest when the release
 * gives one (*verified says whether it did). 0, or -1. */
static int fetch_archive(const struct release_asset *a, const char *dest, int *verified, char *err,
                         size_t errlen)
{
	*verified = a->sha256[0] != '\0';
	if (!*verified)
		fprintf(stderr,
		        "toki: warning: the release gives no SHA-256 digest for %s; it cannot be "
		        "verified\n",
		        a->name);
	struct download_opts d = {.url = a->url,
	                          .dest = dest,
	                          .expect_sha256 = *verified ? a->sha256 : NULL,
	                          .label = a->name,
	                          .progress = 1};
	if (download_file(&d, err, errlen) != 0)
		return -1;
	if (*verified)
		fprintf(stderr, "toki: %s matches the release's SHA-256 %s\n", a->name, a->sha256);
	return 0;
}

int release_install(const struct release_info *r, size_t asset,
                    const struct release_install_opts *o, char *server, size_t n, char *err,
                    size_t errlen)
{
	const struct release_asset *a = &r->assets[asset];
	const struct release_asset *rt = o->companion;
	if (!paths_is_safe_name(o->name)) {
		err_set(err, errlen, "'%s' is not a usable install name", o->name);
		return -1;
	}
	if (!paths_is_safe_name(a->name) || (rt && !paths_is_safe_name(rt->name))) {
		err_set(err, errlen, "the asset name '%s' is not usable as a file name",
		        paths_is_safe_name(a->name) ? rt->name : a->name);
		return -1;
	}
	char root[4096], final[4096], downloads[4096], archive[4096], tmp[4096];
	char rt_archive[4096] = "", rt_tmp[4096] = "";
	if (paths_state_sub(root, sizeof root, "llama") != 0 ||
	    (size_t)snprintf(final, sizeof final, "%s/%s", root, o->name) >= sizeof final ||
	    (size_t)snprintf(downloads, sizeof downloads, "%s/.downloads", root) >=
	        sizeof downloads ||
	    (size_t)snprintf(archive, sizeof archive, "%s/%s", downloads, a->name) >=
	        sizeof archive ||
	    (size_t)snprintf(tmp, sizeof tmp, "%s/.unpack-%s-XXXXXX", root, o->name) >=
	        sizeof tmp ||
	    (rt && ((size_t)snprintf(rt_archive, sizeof rt_archive, "%s/%s", downloads, rt->name) >=
	                sizeof rt_archive ||
	            (size_t)snprintf(rt_tmp, sizeof rt_tmp, "%s/.cudart-%s-XXXXXX", root,
	                             o->name) >= sizeof rt_tmp))) {
		err_set(err, errlen, "the state directory path is too long");
		return -1;
	}
	struct stat st;
	if (lstat(final, &st) == 0 && !o->force) {
		err_set(err, errlen, "a build is already installed as %s (%s); --force replaces it",
		        o->name, final);
		return -1;
	}
	if (paths_mkdir_p(downloads, 0755) != 0) {
		err_set(err, errlen, "cannot create %s: %s", downloads, strerror(errno));
		return -1;
	}
	/* A download the network broke keeps what arrived (and a finished,
	 * checked archive), so that the next try resumes. */
	int verified = 0, rt_verified = 0;
	if (fetch_archive(a, archive, &verified, err, errlen) != 0)
		return -1;
	if (rt && fetch_archive(rt, rt_archive, &rt_verified, err, errlen) != 0)
		return -1;
	if (!mkdtemp(tmp)) {
		err_set(err, errlen, "cannot create a directory in %s: %s", root, strerror(errno));
		return -1;
	}
	int rc = -1, rt_made = 0;
	char found[4096];
	int found_depth = -1;
	if (release_unpack(archive, tmp, err, errlen) != 0)
		goto fail;
	if (!find_file(tmp, "llama-server", 0, found, sizeof found, &found_depth)) {
		err_set(err, errlen, "the archive %s has no llama-server in it", a->name);
		goto fail;
	}
	/* A zip made without Unix modes loses the executable bit. */
	if (stat(found, &st) == 0 && !(st.st_mode & S_IXUSR))
		chmod(found, (st.st_mode & 0777) | 0755);
	char bindir[4096];
	snprintf(bindir, sizeof bindir, "%s", found);
	*strrchr(bindir, '/') = '\0';
	if (rt) {
		if (!mkdtemp(rt_tmp)) {
			err_set(err, errlen, "cannot create a directory in %s: %s", root,
			        strerror(errno));
			goto fail;
		}
		rt_made = 1;
		char why[1024];
		int moved;
		if (release_unpack(rt_archive, rt_tmp, why, sizeof why) != 0 ||
		    (moved = move_flat(rt_tmp, bindir, 0, why, sizeof why)) < 0) {
			err_set(err, errlen, "the CUDA runtime archive %s: %s", rt->name, why);
			goto fail;
		}
		remove_tree(rt_tmp);
		rt_made = 0;
		fprintf(stderr, "toki: %s: %d files put beside llama-server\n", rt->name, moved);
	}

	struct server_check check;
	char why[TAIL_BYTES * 2];
	if (check_server(found, o, &check, why, sizeof why) != 0) {
		err_set(err, errlen, "the %s build (%s) does not work on this machine: %s",
		        o->backend, a->name, why);
		rc = -2;
		goto fail;
	}
	if (check.version[0])
		fprintf(stderr, "toki: llama-server %s\n", check.version);
	for (int i = 0; i < check.gpu.n; i++)
		fprintf(stderr, "toki: it sees %s: %s (%llu MiB)\n", check.gpu.dev[i].name,
		        check.gpu.dev[i].desc, (unsigned long long)(check.gpu.dev[i].total >> 20));
	if (check.listed && check.gpu.n == 0)
		fprintf(stderr, "toki: it sees no GPU; it runs on the CPU\n");

	const char *rel = found + strlen(tmp); /* "/.../llama-server" */
	char final_server[8192], json_path[8192];
	snprintf(final_server, sizeof final_server, "%s%s", final, rel);
	snprintf(json_path, sizeof json_path, "%s/build.json", bindir);
	if (write_build_json(json_path, r->tag, a, verified, rt, rt_verified, &check, final_server,
	                     o, err, errlen) != 0)
		goto fail;
	if (lstat(final, &st) == 0) {
		char old[4400];
		if ((size_t)snprintf(old, sizeof old, "%s/.old-%s-XXXXXX", root, o->name) >=
		        sizeof old ||
		    !mkdtemp(old) || rename(final, old) != 0) {
			/* mkdtemp made a directory; rename over an empty one is fine,
			 * so only a real failure lands here. */
			err_set(err, errlen, "cannot move the old %s aside: %s", final,
			        strerror(errno));
			goto fail;
		}
		if (rename(tmp, final) != 0) {
			err_set(err, errlen, "cannot move the build into %s: %s", final,
			        strerror(errno));
			rename(old, final);
			goto fail;
		}
		remove_tree(old);
	} else if (rename(tmp, final) != 0) {
		err_set(err, errlen, "cannot move the build into %s: %s", final, strerror(errno));
		goto fail;
	}
	unlink(archive);
	if (rt)
		unlink(rt_archive);
	snprintf(server, n, "%s", final_server);
	return 0;
fail:
	/* The archives matched their digests (or had none) yet did not make a
	 * working install: downloading them again would give the same bytes,
	 * so they go too. */
	unlink(archive);
	remove_tree(tmp);
	if (rt)
		unlink(rt_archive);
	if (rt_made)
		remove_tree(rt_tmp);
	return rc;
}

/* --- finding installs ---------------------------------------------------- */

/* Fills b from the build.json at json_path (name and dir as given). */
static int parse_build(const char *json_path, const char *name, const char *dir,
                       struct release_build *b, char *err, size_t errlen)
{
	memset(b, 0, sizeof *b);
	json_error_t je;
	json_t *j = json_load_file(json_path, 0, &je);
	if (!json_is_object(j)) {
		json_decref(j);
		err_set(err, errlen, "%s is not valid JSON: %s (line %d)", json_path, je.text,
		        je.line);
		return -1;
	}
	snprintf(b->name, sizeof b->name, "%s", name);
	snprintf(b->dir, sizeof b->dir, "%s", dir);
	const char *s;
	if ((s = json_string_value(json_object_get(j, "tag"))))
		snprintf(b->tag, sizeof b->tag, "%s", s);
	if ((s = json_string_value(json_object_get(j, "backend"))))
		snprintf(b->backend, sizeof b->backend, "%s", s);
	if ((s = json_string_value(json_object_get(j, "gfx"))))
		snprintf(b->gfx, sizeof b->gfx, "%s", s);
	json_t *t = json_object_get(j, "installed_at");
	b->installed_at = json_is_integer(t) ? (long long)json_integer_value(t) : 0;
	json_decref(j);
	/* The binary beside build.json, not the recorded absolute path: the
	 * state directory may have moved since. */
	snprintf(b->llama_server, sizeof b->llama_server, "%s", json_path);
	char *slash = strrchr(b->llama_server, '/');
	snprintf(slash + 1, sizeof b->llama_server - (size_t)(slash + 1 - b->llama_server),
	         "llama-server");
	if (access(b->llama_server, X_OK) != 0) {
		err_set(err, errlen, "the install %s is broken: %s is missing or not executable",
		        name, b->llama_server);
		return -1;
	}
	return 0;
}

static int read_build(const char *dir, const char *name, struct release_build *b, char *err,
                      size_t errlen)
{
	char json_path[4096];
	int depth = -1;
	if (!find_file(dir, "build.json", 0, json_path, sizeof json_path, &depth)) {
		memset(b, 0, sizeof *b);
		err_set(err, errlen,
		        "%s has no build.json; reinstall it with toki model install-llama", dir);
		return -1;
	}
	return parse_build(json_path, name, dir, b, err, errlen);
}

int release_build_of_server(const char *llama_server, struct release_build *b, char *err,
                            size_t errlen)
{
	char json_path[4096];
	if ((size_t)snprintf(json_path, sizeof json_path, "%s", llama_server) >= sizeof json_path) {
		err_set(err, errlen, "the path %s is too long", llama_server);
		return -1;
	}
	char *slash = strrchr(json_path, '/');
	size_t at = slash ? (size_t)(slash + 1 - json_path) : 0;
	if (at + sizeof "build.json" > sizeof json_path) {
		err_set(err, errlen, "the path %s is too long", llama_server);
		return -1;
	}
	memcpy(json_path + at, "build.json", sizeof "build.json");
	if (access(json_path, R_OK) != 0) {
		memset(b, 0, sizeof *b);
		err_set(err, errlen, "%s is not a build toki installed (no %s)", llama_server,
		        json_path);
		return -1;
	}
	return parse_build(json_path, "", "", b, err, errlen);
}

int release_find_build(const char *name, struct release_build *b, char *err, size_t errlen)
{
	char root[4096], dir[4096];
	if (paths_state_sub(root, sizeof root, "llama") != 0) {
		err_set(err, errlen, "the state directory path is too long");
		return -1;
	}
	if (name) {
		if (!paths_is_safe_name(name)) {
			err_set(err, errlen, "'%s' is not a valid install name", name);
			return -1;
		}
		struct stat st;
		if ((size_t)snprintf(dir, sizeof dir, "%s/%s", root, name) >= sizeof dir ||
		    stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
			err_set(err, errlen,
			        "no llama.cpp build is installed as %s (in %s); toki model "
			        "install-llama --name %s installs one",
			        name, root, name);
			return -1;
		}
		return read_build(dir, name, b, err, errlen);
	}
	DIR *d = opendir(root);
	if (!d) {
		err_set(err, errlen, "no llama.cpp build is installed (%s does not exist)", root);
		return -1;
	}
	struct dirent *de;
	int found = 0;
	struct release_build cur;
	char why[512];
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' || !paths_is_safe_name(de->d_name))
			continue;
		struct stat st;
		if ((size_t)snprintf(dir, sizeof dir, "%s/%s", root, de->d_name) >= sizeof dir ||
		    lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		if (read_build(dir, de->d_name, &cur, why, sizeof why) != 0)
			continue;
		if (!found || cur.installed_at > b->installed_at ||
		    (cur.installed_at == b->installed_at && strcmp(cur.name, b->name) > 0)) {
			*b = cur;
			found = 1;
		}
	}
	closedir(d);
	if (!found) {
		err_set(err, errlen, "no llama.cpp build is installed in %s", root);
		return -1;
	}
	return 0;
}

int release_find_llama_server(const char *name, char *path, size_t n)
{
	struct release_build *b = malloc(sizeof *b);
	char err[512];
	if (!b)
		return -1;
	int rc = release_find_build(name, b, err, sizeof err);
	if (rc == 0)
		snprintf(path, n, "%s", b->llama_server);
	free(b);
	if (rc == 0 || name)
		return rc;
	char exe[4096];
	if (on_path("llama-server", exe, sizeof exe)) {
		snprintf(path, n, "%s", exe);
		return 0;
	}
	return -1;
}
