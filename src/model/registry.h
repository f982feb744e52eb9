/* The model registry: a YAML file listing the models toki knows, where their
 * weights are, how to run them, and which one `toki model use` started last.
 *
 *   models:
 *     qwen3-4b:
 *       path: /home/u/.local/state/tokirecur/models/qwen3-4b/Qwen3-4B-Q4_K_M.gguf
 *       repo: Qwen/Qwen3-4B-GGUF                # optional: where it came from
 *       file: Qwen3-4B-Q4_K_M.gguf              # optional: the file in that repo
 *       binary: /opt/llama/bin/llama-server     # optional: any llama-server
 *       ctx: 16384                              # optional: asked-for context
 *       max_output: 4096                        # optional: cap on max_tokens
 *       args: ["-ngl", "99", "--jinja"]         # optional: extra llama-server args
 *       aliases: ["gpt-4o-mini"]                # optional: other names requests may use
 *       ttl: 600                                # optional: seconds idle before the
 *                                               # endpoint stops it
 *   active: qwen3-4b                            # optional
 *   max_loaded: 2                               # optional: models the endpoint runs at once
 *   ttl: 1800                                   # optional: every model's default ttl
 *   groups:                                     # optional: models that run together
 *     coding: [qwen3-4b, qwen3-0.6b]            # loading one never stops another
 *
 * The file is at paths_registry_file(). A missing file is an empty registry.
 * Reading is strict: a key this version does not know, a value of the wrong
 * type, or a model name that is not paths_is_safe_name() is an error naming the
 * file and line, because a typo that is silently ignored ("cxt: 8192") is worse
 * than one that is reported.
 *
 * Writes are read-modify-write under an exclusive flock on <registry>.lock (so
 * two `toki model` commands at once serialise rather than lose an update), go
 * to <registry>.tmp, are fsynced and renamed over the registry (so a reader or
 * a crash sees the old file or the new one, never half of one). A registry that
 * does not parse is never overwritten: the write is refused with the parse
 * error, so a hand edit with a typo is not replaced by an empty file. Comments
 * in a hand-edited file do not survive a write (libyaml does not keep them).
 *
 * Ownership: a struct registry owns every string and array reachable from it;
 * registry_free() releases them all. */
#ifndef TOKI_MODEL_REGISTRY_H
#define TOKI_MODEL_REGISTRY_H

#include <stddef.h>
#include <sys/types.h>

struct registry_model {
	char *name;      /* the key under models: */
	char *path;      /* the GGUF file (required) */
	char *repo;      /* NULL when absent */
	char *file;      /* NULL when absent */
	char *binary;    /* NULL when absent: the default llama-server */
	long ctx;        /* 0 when absent */
	long max_output; /* 0 when absent */
	char **args;     /* n_args strings; NULL when n_args is 0 */
	int n_args;
	/* Other names the endpoint (toki up without --model) answers to for it;
	 * no alias is another model's name or another model's alias. */
	char **aliases; /* n_aliases strings; NULL when n_aliases is 0 */
	int n_aliases;
	long ttl; /* seconds idle before the endpoint stops it; 0 when absent */
};

/* Models that run together (a coding model and its small fast model): the
 * endpoint never stops one member to make room for another. Every member is
 * a model of the registry, and no model is in two groups. */
struct registry_group {
	char *name;     /* the key under groups: */
	char **members; /* n_members model names, at least one */
	int n_members;
};

struct registry {
	struct registry_model *models; /* in file order */
	int n;
	char *active;                  /* NULL when absent */
	long max_loaded;               /* models the endpoint runs at once; 0 when absent */
	long ttl;                      /* the models' default ttl; 0 when absent */
	struct registry_group *groups; /* in file order; NULL when n_groups is 0 */
	int n_groups;
};

/* Reads the registry at paths_registry_file(). Returns 0 (a missing file
 * gives an empty registry), or -1 with *r empty and a message in err that
 * names the file, and the line and column when the file is broken. */
int registry_load(struct registry *r, char *err, size_t errlen);
/* The same for an explicit path. */
int registry_load_file(const char *path, struct registry *r, char *err, size_t errlen);
/* Frees everything *r owns and leaves it empty (safe on an empty one). */
void registry_free(struct registry *r);

/* The model of that name, or NULL. Valid until registry_free(). */
const struct registry_model *registry_find(const struct registry *r, const char *name);

/* The index in r->groups of the group the model `name` is in, or -1. */
int registry_group_of(const struct registry *r, const char *name);

/* Inserts or replaces the model `name` (m->name is ignored) in the registry
 * file, keeping the other models and their order; a new model goes last.
 * m->path must be non-empty, ctx and max_output >= 0, args non-NULL strings.
 * Creates the registry's directory if needed. 0, or -1 with a message. */
int registry_set_model(const char *name, const struct registry_model *m, char *err, size_t errlen);
/* Removes the model `name`; clears `active` if it named that model, and
 * takes it out of its group (a group left empty goes). -1 with a
 * message if there is no such model. */
int registry_remove_model(const char *name, char *err, size_t errlen);
/* Sets `active` to a registered model, or removes it when name is NULL. */
int registry_set_active(const char *name, char *err, size_t errlen);

/* --- Run state and weights of a registered model ------------------------- */

/* The pid in $state/run/<name>/serve.pid when that process is alive, else 0
 * (no file, unreadable, not a number, or no such process). A process that
 * exists but belongs to another user (kill gives EPERM) counts as alive. */
pid_t registry_running_pid(const char *name);

/* What registry_purge_files() did. */
struct registry_purge {
	int deleted_dir;       /* 1: $state/models/<name>/ existed and was removed */
	unsigned long n_files; /* files (and links) removed from it */
	unsigned long long bytes;
	int kept_outside; /* 1: model_path is outside that directory and was left alone */
	char dir[1024];   /* $state/models/<name> */
};

/* Deletes $state/models/<name>/ (the directory `toki model pull` downloads
 * into) and everything in it, never following a symbolic link out of it. A
 * model_path (may be NULL) outside that directory is a user's own file: it is
 * not touched, and out->kept_outside says so. A missing directory is not an
 * error. 0, or -1 with a message (what was deleted before the failure is in
 * *out). */
int registry_purge_files(const char *name, const char *model_path, struct registry_purge *out,
                         char *err, size_t errlen);

#endif
