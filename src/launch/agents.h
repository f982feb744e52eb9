/* Coding agents pinned to the local model: `toki launch`.
 *
 * Every agent this knows is one entry in a table (agents.c): its names, the
 * binary it runs, how to install it, which API it speaks, and a function that
 * builds what pins it to toki -- environment variables, arguments, and
 * override files. The user's own configuration files are never edited: each
 * agent's overrides are written fresh, owner-only (files 0600, directories
 * 0700), under $TOKI_STATE_DIR/agents/<agent>/, and the agent is pointed at
 * them through its own documented mechanism (docs/agents.md says which, and
 * where that is documented). Where an agent can only be pointed at a whole
 * configuration directory (Codex's CODEX_HOME, Hermes' HERMES_HOME, ...), that
 * directory is a private one under the same place, with nothing of the user's
 * copied into it.
 *
 * The local token travels in an environment variable (TOKI_API_KEY, or the
 * agent's own variable) wherever the agent can read one, so that most files
 * hold no secret; where an agent's format only takes the key inline, the file
 * holds it and is 0600 like the rest.
 *
 * Ownership: a struct agent_plan owns every string in it; agent_plan_free()
 * releases them. Nothing here keeps global state. */
#ifndef TOKI_LAUNCH_AGENTS_H
#define TOKI_LAUNCH_AGENTS_H

#include <stddef.h>

/* The API an agent speaks to toki. */
enum agent_api {
	AGENT_API_OPENAI_CHAT,      /* <endpoint>/v1/chat/completions */
	AGENT_API_OPENAI_RESPONSES, /* <endpoint>/v1/responses */
	AGENT_API_ANTHROPIC,        /* <endpoint>/anthropic/v1/messages */
	AGENT_API_TOKI,             /* toki's own client (the TUI) */
};

/* How well an agent's mechanism is established. */
enum agent_doc {
	AGENT_DOC_DOCUMENTED, /* the vendor documents it */
	AGENT_DOC_PARTIAL,    /* documented in parts; the rest follows a fork or a
	                         third-party integration (docs/agents.md says which) */
	AGENT_DOC_UNKNOWN,    /* not found: generic OpenAI variables, with a warning */
};

/* What an agent is pinned to. */
struct agent_target {
	const char *endpoint;  /* toki's base URL, "http://127.0.0.1:8787" (no slash at the end) */
	const char *model_id;  /* what /v1/models says: data[0].id */
	const char *token;     /* the local token */
	const char *state_dir; /* $TOKI_STATE_DIR */
	long context_length;   /* tokens per slot; 0 when unknown */
	long max_output;       /* the run's output cap; 0 when unknown */
	int cpu_profile;       /* 1: no usable GPU (longer request timeouts) */
	/* Knobs read from the environment by agents_target_knobs(), NULL when
	 * unset: TOKI_CLAUDE_BARE, TOKI_CLAUDE_MCP, TOKI_CLAUDE_EFFORT,
	 * TOKI_CLAUDE_TIMEOUT_MS, TOKI_AGENT_TIMEOUT_MS. */
	const char *claude_bare, *claude_mcp, *claude_effort, *claude_timeout_ms;
	const char *agent_timeout_ms;
	/* The toki binary (for Toki Chat), or NULL. */
	const char *toki_exe;
	/* `toki launch --small MODEL`: the registry model the agent's
	 * background/small/fast model is pointed at, through the same endpoint,
	 * with its context and output cap (0 when unknown); NULL when not
	 * asked for. Only agents with a small_setting take one. */
	const char *small_model_id;
	long small_context_length, small_max_output;
};

/* Everything one launch needs. */
struct agent_plan {
	char *dir;   /* $state/agents/<name> (created 0700), or NULL when unused */
	char *exe;   /* the program to run (the binary's name, or a path) */
	char **args; /* arguments before the user's (after argv[0]) */
	size_t n_args;
	char **env_set; /* "NAME=value" to set in the child */
	size_t n_env_set;
	char **env_unset; /* names to remove from the child's environment */
	size_t n_env_unset;
	char **files; /* files written (absolute paths) */
	size_t n_files;
	char **warnings; /* printed to stderr before the launch */
	size_t n_warnings;
};

struct agent_pin;

struct agent_def {
	const char *name;           /* canonical, as typed: "claude" */
	const char *display;        /* "Claude Code" */
	const char *const *aliases; /* NULL-terminated, may be NULL */
	const char *binary;         /* looked up on PATH */
	const char *install;        /* how to install it */
	enum agent_api api;
	enum agent_doc doc;
	const char *mechanism; /* one line: how it is pinned */
	/* The agent's own setting that --small fills ("small_model"), or NULL
	 * for an agent that has no second-model setting (--small is then
	 * refused). */
	const char *small_setting;
	/* Fills the plan of pin (agents.c's: the agent, its target, the user's
	 * arguments after `--`, for a builder that leaves out an argument of
	 * its own the user also gave, the plan, whose dir is already set and
	 * created and exe set to binary, and err). 0, or -1 with err. */
	int (*build)(struct agent_pin *pin);
};

/* The table, in display order. */
const struct agent_def *agents_all(size_t *n);
/* By name or alias (case-insensitive), or NULL. */
const struct agent_def *agents_find(const char *name);

/* The names of the agents that take --small, ", "-separated
 * ("claude, codex, ..."), into buf. */
void agents_small_names(char *buf, size_t n);

/* Fills the TOKI_CLAUDE_* knobs of t from the environment. */
void agents_target_knobs(struct agent_target *t);

/* Creates $state/agents/<name>/ (0700; an existing one is chmod'ed 0700) and
 * builds the plan into it. user_args (may be NULL when n_user is 0) are the
 * arguments after `--`; a builder may leave out an argument of its own that
 * the user gave (a second --model). 0, or -1 with err (plan is then empty). */
int agents_build(const struct agent_def *a, const struct agent_target *t, char *const *user_args,
                 size_t n_user, struct agent_plan *plan, char *err, size_t errlen);
void agent_plan_free(struct agent_plan *plan);

/* argv for the launch: exe, the plan's args, then user_args; NULL-terminated,
 * owned by the caller (free the array, not the strings, which stay owned by
 * plan and the caller). NULL when out of memory. */
char **agents_argv(const struct agent_plan *plan, char *const *user_args, size_t n_user);
/* envp for the launch: environ minus env_unset, with env_set applied (a set
 * name replaces an inherited one). Same ownership as agents_argv. */
char **agents_envp(const struct agent_plan *plan, char *const *environ_in);

/* The path of binary on $PATH (an executable regular file), or NULL. The
 * result is owned by the caller. A binary with a slash is checked as is. */
char *agents_which(const char *binary);

/* The run to pin to: want (a run's name; it must be running), else the
 * registry's active model when it runs, else the only run there is; with the
 * endpoint running (toki up without --model), the endpoint, with name the
 * registry model asked for or the active one. Fills
 * endpoint ("http://host:port", for a wildcard bind the loopback address) and
 * the run's name. 0, or -1 with a message that says what runs. */
int agents_resolve_run(const char *want, char *endpoint, size_t n, char *name, size_t namelen,
                       char *err, size_t errlen);

/* GET <endpoint>/v1/models with the local token: the entry whose id is
 * want_id (the endpoint lists every registry model), else data[0]: its id (a
 * new string, owned by the caller), context_length and max_output (0 when
 * absent). 0, or -1 with a message. */
int agents_fetch_model(const char *endpoint, const char *want_id, char **model_id,
                       long *context_length, long *max_output, char *err, size_t errlen);

/* For --small: endpoint must be the endpoint `toki up` without --model runs
 * (one run serves one model, so it cannot serve a second); small is then
 * looked up in its /v1/models by id or alias. Fills the model's id (a new
 * string, owned by the caller), context_length and max_output. 0; -1 with a
 * message (saying to run `toki up` when no endpoint runs, listing the
 * registry's names when small is not one of them). */
int agents_fetch_small(const char *endpoint, const char *small, char **model_id,
                       long *context_length, long *max_output, char *err, size_t errlen);

/* 1 when no GPU answers (nvidia-smi -L and rocminfo both fail or are absent,
 * each given a few seconds, and this is no Apple silicon Mac, whose Metal
 * build runs on the GPU), 0 when one does. $TOKI_PROFILE=cpu|gpu decides
 * without probing. */
int agents_detect_cpu_profile(void);

/* Writes data to path atomically (a temporary file in the same directory,
 * fsync, rename), mode 0600 whatever the umask; refuses to follow a symbolic
 * link at path. 0, or -1 with err. */
int agents_write_private(const char *path, const char *data, size_t len, char *err, size_t errlen);

/* Quoting for the text formats the builders write. Each returns a new string
 * (owned by the caller) or NULL when out of memory. */
char *agents_toml_string(const char *s); /* "..." with TOML basic-string escapes */
char *agents_yaml_string(const char *s); /* "..." with YAML double-quoted escapes */
char *agents_shell_quote(const char *s); /* '...' for a POSIX shell */

#endif
