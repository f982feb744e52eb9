/* toki model install-llama: fetch the llama.cpp release build that fits this
 * machine (OS, CPU, GPU backend) into $state/llama/<name>/. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"

#include "model/release.h"
#include "util/paths.h"

#define ME "toki model install-llama"

static const char install_usage[] =
    "usage: toki model install-llama [--backend B] [--gfx X.Y.Z] [--tag bNNNN]\n"
    "                                [--name NAME] [--force]\n"
    "\n"
    "Downloads a llama.cpp release build (llama-server and its libraries) for\n"
    "this OS and CPU, checks it against the release's SHA-256 digest, and unpacks\n"
    "it into $TOKI_STATE_DIR/llama/NAME/. A CUDA build comes with the release's\n"
    "CUDA runtime archive (cudart-...), checked the same way and unpacked beside\n"
    "llama-server. The build is installed only if its llama-server starts\n"
    "(--version) and lists a device of its backend (--list-devices); else it is\n"
    "removed and the reason shown, with the next backend to try.\n"
    "\n"
    "  --backend B   cpu, cuda, rocm, sycl, openvino, vulkan or metal (default:\n"
    "                detected with nvidia-smi, rocminfo, sycl-ls, vulkaninfo; a\n"
    "                detected backend the release has no build for, or whose\n"
    "                build sees no GPU here, falls back to the next, down to cpu).\n"
    "                Of several CUDA builds, the newest the driver runs (nvidia-smi's\n"
    "                \"CUDA Version\"). Named here, a backend's software device\n"
    "                (Vulkan on llvmpipe) is accepted; detected, it is not.\n"
    "  --gfx X.Y.Z   HSA_OVERRIDE_GFX_VERSION for this build's llama-server (ROCm\n"
    "                on a GPU the build has no kernels for, e.g. 10.3.0)\n"
    "  --tag bNNNN   a release tag (default: the latest release)\n"
    "  --name NAME   the install's name (default: <tag>-<backend>)\n"
    "  --force       replace an install of the same name (once the new one works)\n"
    "\n"
    "Environment: TOKI_LLAMA_RELEASES_URL (the GitHub API, default\n" RELEASE_DEFAULT_ENDPOINT
    "), GITHUB_TOKEN (a higher API rate limit).\n"
    "Prints the installed llama-server's path on stdout.\n";

/* HSA_OVERRIDE_GFX_VERSION is three dot-separated numbers. */
static int gfx_is_valid(const char *s)
{
	int parts = 0;
	while (*s) {
		if (!isdigit((unsigned char)*s))
			return 0;
		int digits = 0;
		while (isdigit((unsigned char)*s)) {
			s++;
			if (++digits > 3)
				return 0;
		}
		parts++;
		if (*s == '.')
			s++;
		else if (*s)
			return 0;
		else
			break;
	}
	return parts == 3 && s[-1] != '.';
}

int cmd_model_install_llama(int argc, char **argv)
{
	const char *backend = NULL, *gfx = NULL, *tag = NULL, *name = NULL;
	int force = 0;
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		int r;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(install_usage, stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--force")) {
			force = 1;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--backend", &v)) != 0) {
			if (r < 0)
				return 2;
			backend = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--gfx", &v)) != 0) {
			if (r < 0)
				return 2;
			gfx = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--tag", &v)) != 0) {
			if (r < 0)
				return 2;
			tag = v;
		} else if ((r = cmd_option_value(ME, argc, argv, &i, "--name", &v)) != 0) {
			if (r < 0)
				return 2;
			name = v;
		} else {
			fprintf(stderr, "toki model install-llama: unexpected '%s'\n\n%s", argv[i],
			        install_usage);
			return 2;
		}
	}
	if (backend && !release_backend_is_known(backend)) {
		fprintf(stderr,
		        "toki model install-llama: unknown backend '%s' (cpu, cuda, rocm, sycl, "
		        "openvino, vulkan, metal)\n",
		        backend);
		return 2;
	}
	if (gfx && !gfx_is_valid(gfx)) {
		fprintf(stderr,
		        "toki model install-llama: --gfx '%s' is not of the form X.Y.Z (e.g. "
		        "10.3.0, as HSA_OVERRIDE_GFX_VERSION takes it)\n",
		        gfx);
		return 2;
	}
	if (tag && !paths_is_safe_name(tag)) {
		fprintf(stderr,
		        "toki model install-llama: '%s' is not a release tag (e.g. b6000)\n", tag);
		return 2;
	}
	if (name && !paths_is_safe_name(name)) {
		fprintf(stderr,
		        "toki model install-llama: --name '%s' must be 1-128 of A-Z a-z 0-9 . _ - "
		        "(it becomes a directory name)\n",
		        name);
		return 2;
	}

	char err[4096];
	const char *os, *arch;
	if (release_platform(&os, &arch, err, sizeof err) != 0) {
		fprintf(stderr, "toki model install-llama: %s\n", err);
		return 1;
	}
	const char *candidates[8];
	int ncand;
	char detected_gfx[32] = "";
	if (backend) {
		candidates[0] = backend;
		ncand = 1;
	} else {
		ncand = release_detect_backends(candidates, 8, detected_gfx, sizeof detected_gfx);
		fprintf(stderr, "toki: backends this machine can use, best first:");
		for (int i = 0; i < ncand; i++)
			fprintf(stderr, " %s", candidates[i]);
		if (detected_gfx[0])
			fprintf(stderr, " (ROCm GPU %s)", detected_gfx);
		fprintf(stderr, "\n");
	}
	if (gfx && strcmp(backend ? backend : candidates[0], "rocm") != 0)
		fprintf(stderr,
		        "toki: note: --gfx only matters to ROCm builds; it is recorded anyway\n");

	/* Of several CUDA builds, the driver's CUDA version decides. */
	char cuda_driver[16] = "";
	for (int i = 0; i < ncand; i++)
		if (!strcmp(candidates[i], "cuda")) {
			if (release_cuda_driver_version(cuda_driver, sizeof cuda_driver) == 0)
				fprintf(
				    stderr,
				    "toki: the NVIDIA driver runs CUDA %s at most (nvidia-smi)\n",
				    cuda_driver);
			else
				fprintf(stderr,
				        "toki: nvidia-smi states no CUDA version; the newest "
				        "CUDA build is chosen\n");
			break;
		}

	struct release_info rel;
	if (release_fetch(tag, &rel, err, sizeof err) != 0) {
		fprintf(stderr, "toki model install-llama: %s\n", err);
		return 1;
	}
	int rc = 1, tried = 0;
	char first_err[4096] = "";
	for (int i = 0; i < ncand; i++) {
		const char *b = candidates[i];
		int asset = release_choose_build(&rel, os, arch, b, cuda_driver, err, sizeof err);
		if (asset < 0) {
			if (i == 0)
				snprintf(first_err, sizeof first_err, "%s", err);
			else if (tried)
				fprintf(stderr, "toki: %s\n", err);
			continue;
		}
		if (i > 0 && !tried)
			fprintf(stderr,
			        "toki: %s\ntoki: using the %s build instead (--backend chooses)\n",
			        first_err, b);
		tried = 1;
		int companion = release_companion_asset(&rel, (size_t)asset);
		if (companion == -2)
			fprintf(
			    stderr,
			    "toki: warning: llama.cpp %s has no CUDA runtime archive (cudart-...) "
			    "for %s; its llama-server needs libcudart and libcublas from "
			    "elsewhere\n",
			    rel.tag, rel.assets[asset].name);
		char default_name[160];
		const char *install_name = name;
		if (!install_name) {
			snprintf(default_name, sizeof default_name, "%s-%s", rel.tag, b);
			install_name = default_name;
		}
		fprintf(stderr, "toki: installing llama.cpp %s (%s, %s %s) as %s: %s%s%s\n",
		        rel.tag, b, os, arch, install_name, rel.assets[asset].name,
		        companion >= 0 ? " with its CUDA runtime " : "",
		        companion >= 0 ? rel.assets[companion].name : "");
		/* A backend asked for by name may run on a software device
		 * (Vulkan on llvmpipe, to test a setup); one detected here must
		 * find a real GPU, else the next does better. */
		struct release_install_opts o = {
		    .name = install_name,
		    .backend = b,
		    .gfx = gfx,
		    .force = force,
		    .count_software = backend != NULL,
		    .companion = companion >= 0 ? &rel.assets[companion] : NULL};
		char server[8192];
		int r = release_install(&rel, (size_t)asset, &o, server, sizeof server, err,
		                        sizeof err);
		if (r == 0) {
			if (gfx)
				fprintf(stderr,
				        "toki: installed %s; its llama-server runs with "
				        "HSA_OVERRIDE_GFX_VERSION=%s\n",
				        install_name, gfx);
			else
				fprintf(stderr, "toki: installed %s\n", install_name);
			printf("%s\n", server);
			rc = 0;
			goto out;
		}
		fprintf(stderr, "toki model install-llama: %s\n", err);
		if (r != -2)
			goto out;
		/* The build does not work here: it was removed, not registered. */
		const char *next = release_next_backend(b);
		if (backend) {
			if (next)
				fprintf(stderr,
				        "toki: %s was not installed; the next backend to try: toki "
				        "model install-llama --backend %s\n",
				        install_name, next);
			else
				fprintf(stderr, "toki: %s was not installed\n", install_name);
			goto out;
		}
		fprintf(stderr, "toki: %s was not installed%s\n", install_name,
		        i + 1 < ncand ? "; trying the next backend" : "");
	}
	if (!tried)
		fprintf(stderr, "toki model install-llama: %s\n", first_err);
out:
	release_info_free(&rel);
	return rc;
}
