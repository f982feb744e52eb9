/* The Hugging Face hub: listing a model repository and choosing its GGUFs.
 *
 * Uses the hub's own HTTP API, so any mirror that speaks it works
 * (HF_ENDPOINT):
 *   GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true
 *       a JSON array of {type, path, size, oid, lfs: {oid, size}}, paged
 *       with a Link: <...>; rel="next" header
 *   GET {endpoint}/{repo}/resolve/{revision}/{path}
 *       the file itself (usually a redirect to a CDN)
 * For files stored with LFS (every GGUF), lfs.oid is the SHA-256 of the
 * content, which is what downloads are checked against.
 *
 * Split GGUFs (llama.cpp's gguf-split: name-00001-of-00003.gguf) are one
 * model: choosing any shard, or a quant that names them, chooses them all. */
#ifndef TOKI_MODEL_HUB_H
#define TOKI_MODEL_HUB_H

#include <stddef.h>

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"

struct hub_file {
	char *path;      /* inside the repository, e.g. "Q4_K_M/x-00001-of-00002.gguf" */
	long long size;  /* bytes; -1 when the hub did not say */
	char sha256[65]; /* lowercase hex from lfs.oid; "" for a file not in LFS */
};

struct hub_listing {
	struct hub_file *files;
	size_t n;
};

/* The endpoint to use: $HF_ENDPOINT without trailing slashes, else the
 * default. Points into the environment or a static string. */
const char *hub_endpoint(void);

/* "org/name" with both parts [A-Za-z0-9._-] and neither "." nor "..". */
int hub_repo_is_valid(const char *repo);

/* Lists every file of repo at revision. token (may be NULL) is sent as a
 * bearer token. 0, or -1 with a message that says what to do (a missing
 * repository, a gated one and a refused token read differently). */
int hub_list_files(const char *endpoint, const char *repo, const char *revision, const char *token,
                   struct hub_listing *out, char *err, size_t errlen);
void hub_listing_free(struct hub_listing *l);

/* The download URL of one file, with revision and path percent-encoded. */
int hub_resolve_url(const char *endpoint, const char *repo, const char *revision, const char *path,
                    char *out, size_t n);

/* If the basename of path is a gguf-split shard "<stem>-NNNNN-of-MMMMM.gguf",
 * returns 1 and sets *index and *count (index 1-based) and, when prefix is not
 * NULL, the path up to the "-NNNNN" (the group's key). Else 0. */
int hub_split_shard(const char *path, int *index, int *count, char *prefix, size_t n);

/* Chooses the files of one model from a listing:
 *   file:  an exact path in the repo, or a basename that only one path has;
 *   quant: the .gguf whose path contains it, case-insensitive (mmproj
 *          projector files are never chosen by quant);
 *   neither: the repository's only model, if it has one.
 * A split model gives all its shards, first shard first; a missing shard is an
 * error. On success *picked is a malloc'd array of *npicked indexes into l
 * (the caller frees it). No match or more than one gives -1 and a message that
 * lists the candidates. */
int hub_choose(const struct hub_listing *l, const char *file, const char *quant, size_t **picked,
               size_t *npicked, char *err, size_t errlen);

/* A model name made from a chosen path: the basename without ".gguf" and
 * without the shard suffix, reduced to [A-Za-z0-9._-]. */
void hub_default_name(const char *path, char *out, size_t n);

#endif
