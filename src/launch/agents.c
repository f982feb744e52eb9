/* The agent table and what it takes to pin each agent to toki. Which
 * mechanism each agent uses, and where it is documented, is in
 * docs/agents.md; the comment above each builder says the same in short. */
#include "launch/agents.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "model/registry.h"
#include "model/run.h"
#include "platform/platform.h"
#include "util/paths.h"

/* The variable that carries the local token to agents whose configuration can
 * name one (so that their files hold no secret). */
#define TOKEN_ENV "TOKI_API_KEY"
/* Agents' request timeouts on a machine without a GPU: 30 minutes instead of
 * their defaults (5 or 10), since a long prompt on a CPU can take that long
 * to prefill, and an agent that gives up and retries starts it over. */
#define CPU_TIMEOUT_MS 1800000L

/* --- small owned-string helpers ------------------------------------------- */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	int r = vasprintf(&s, fmt, ap);
	va_end(ap);
	return r < 0 ? NULL : s;
}

/* Appends s (taking ownership) to *v; frees s and returns -1 when s is NULL
 * or the array cannot grow. */
static int strv_push(char ***v, size_t *n, char *s)
{
	if (!s)
		return -1;
	char **nv = realloc(*v, (*n + 1) * sizeof *nv);
	if (!nv) {
		free(s);
		return -1;
	}
	nv[(*n)++] = s;
	*v = nv;
	return 0;
}

static void strv_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static int arg(struct agent_plan *p, const char *s)
{
	return strv_push(&p->args, &p->n_args, s ? strdup(s) : NULL);
}

static int env_set(struct agent_plan *p, const char *name, const char *value)
{
	return strv_push(&p->env_set, &p->n_env_set, xasprintf("%s=%s", name, value));
}

static int env_setl(struct agent_plan *p, const char *name, long value)
{
	return strv_push(&p->env_set, &p->n_env_set, xasprintf("%s=%ld", name, value));
}

static int env_unset(struct agent_plan *p, const char *name)
{
	return strv_push(&p->env_unset, &p->n_env_unset, strdup(name));
}

static int warn(struct agent_plan *p, const char *msg)
{
	return strv_push(&p->warnings, &p->n_warnings, strdup(msg));
}

static int oom(char *err, size_t errlen)
{
	snprintf(err, errlen, "out of memory");
	return -1;
}

/* The request timeout to give an agent, in ms: the variable's value when it
 * is set (TOKI_CLAUDE_TIMEOUT_MS for Claude Code, TOKI_AGENT_TIMEOUT_MS for
 * every agent), else CPU_TIMEOUT_MS on the CPU profile, else 0 (the agent's
 * own default). -1 with err when the variable is not a number. */
static long timeout_ms_of(const char *name, const char *value, int cpu_profile, char *err,
                          size_t errlen)
{
	if (!value || !*value)
		return cpu_profile ? CPU_TIMEOUT_MS : 0;
	const char *c = value;
	while (isdigit((unsigned char)*c))
		c++;
	if (*c || strlen(value) > 10 || atol(value) <= 0) {
		snprintf(err, errlen, "%s must be a number of milliseconds, not '%s'", name, value);
		return -1;
	}
	return atol(value);
}

static long agent_timeout_ms(const struct agent_target *t, char *err, size_t errlen)
{
	return timeout_ms_of("TOKI_AGENT_TIMEOUT_MS", t->agent_timeout_ms, t->cpu_profile, err,
	                     errlen);
}

/* The output budget an agent is given: the run's max_output, but at most
 * half the context; without one, a quarter of the context up to 32000 (what
 * agents ask for by themselves, at most). 0 when the context is unknown too.
 * An agent that counts its prompt against the whole context (Copilot's
 * MAX_PROMPT_TOKENS, Droid's maxContextLimit) gets the context minus this,
 * so that a full prompt still leaves room for the answer. */
static long output_budget(const struct agent_target *t)
{
	long ctx = t->context_length;
	if (t->max_output > 0)
		return ctx > 0 && t->max_output > ctx / 2 ? ctx / 2 : t->max_output;
	if (ctx <= 0)
		return 0;
	return ctx / 4 < 32000 ? ctx / 4 : 32000;
}

/* --- file writing ------------------------------------------------------- */

int agents_write_private(const char *path, const char *data, size_t len, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s exists and is not a regular file; not replacing it",
		         path);
		return -1;
	}
	char *tmp = xasprintf("%s.%d.tmp", path, (int)getpid());
	if (!tmp)
		return oom(err, errlen);
	unlink(tmp);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
		free(tmp);
		return -1;
	}
	int ok = fchmod(fd, 0600) == 0;
	for (size_t off = 0; ok && off < len;) {
		ssize_t w = write(fd, data + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			ok = 0;
		else
			off += (size_t)w;
	}
	ok = ok && fsync(fd) == 0;
	int saved = errno;
	close(fd);
	if (!ok || rename(tmp, path) != 0) {
		if (ok)
			saved = errno;
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(saved));
		unlink(tmp);
		free(tmp);
		return -1;
	}
	free(tmp);
	return 0;
}

/* Writes text to <dir>/<name> and records it in the plan. */
static int write_file(struct agent_plan *p, const char *dir, const char *name, const char *text,
                      char *err, size_t errlen)
{
	char *path = xasprintf("%s/%s", dir, name);
	if (!path)
		return oom(err, errlen);
	if (agents_write_private(path, text, strlen(text), err, errlen) != 0) {
		free(path);
		return -1;
	}
	return strv_push(&p->files, &p->n_files, path) == 0 ? 0 : oom(err, errlen);
}

static int write_json(struct agent_plan *p, const char *dir, const char *name, json_t *doc,
                      char *err, size_t errlen)
{
	char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	char *full = text ? xasprintf("%s\n", text) : NULL;
	free(text);
	if (!full)
		return oom(err, errlen);
	int r = write_file(p, dir, name, full, err, errlen);
	free(full);
	return r;
}

/* A private directory <plan dir>/<sub> (0700). Returns it, owned. */
static char *private_dir(struct agent_plan *p, const char *sub, char *err, size_t errlen)
{
	char *d = xasprintf("%s/%s", p->dir, sub);
	if (!d) {
		oom(err, errlen);
		return NULL;
	}
	if (paths_mkdir_p(d, 0700) != 0 || chmod(d, 0700) != 0) {
		snprintf(err, errlen, "cannot create %s: %s", d, strerror(errno));
		free(d);
		return NULL;
	}
	return d;
}

/* --- quoting -------------------------------------------------------------- */

/* "..." with \", \\ and \uXXXX for control characters: valid as a TOML basic
 * string and as a YAML double-quoted scalar. */
static char *dquote(const char *s)
{
	size_t n = 3;
	for (const char *c = s; *c; c++)
		n += 6;
	char *out = malloc(n);
	if (!out)
		return NULL;
	char *o = out;
	*o++ = '"';
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '"' || *c == '\\') {
			*o++ = '\\';
			*o++ = (char)*c;
		} else if (*c < 0x20 || *c == 0x7f) {
			o += sprintf(o, "\\u%04x", *c);
		} else {
			*o++ = (char)*c;
		}
	}
	*o++ = '"';
	*o = '\0';
	return out;
}

char *agents_toml_string(const char *s)
{
	return dquote(s);
}

char *agents_yaml_string(const char *s)
{
	return dquote(s);
}

char *agents_shell_quote(const char *s)
{
	size_t n = 3;
	for (const char *c = s; *c; c++)
		n += *c == '\'' ? 4 : 1;
	char *out = malloc(n);
	if (!out)
		return NULL;
	char *o = out;
	*o++ = '\'';
	for (const char *c = s; *c; c++) {
		if (*c == '\'') {
			memcpy(o, "'\\''", 4);
			o += 4;
		} else {
			*o++ = *c;
		}
	}
	*o++ = '\'';
	*o = '\0';
	return out;
}

/* --- the arguments a user gave -------------------------------------------- */

/* Whether user_args hold the option long (or short, may be NULL), as "--x v"
 * or "--x=v". */
static int user_has(char *const *user_args, size_t n_user, const char *lng, const char *shrt)
{
	for (size_t i = 0; i < n_user; i++) {
		const char *a = user_args[i];
		if (!strcmp(a, "--"))
			return 0;
		for (int k = 0; k < 2; k++) {
			const char *o = k ? shrt : lng;
			size_t l = o ? strlen(o) : 0;
			if (o && !strncmp(a, o, l) && (a[l] == '\0' || a[l] == '='))
				return 1;
		}
	}
	return 0;
}

/* --- shared pieces -------------------------------------------------------- */

/* What every builder works from: the agent and its target, the user's
 * arguments after `--`, the plan it fills, the two base URLs (made once in
 * agents_build for all of them) and where an error goes. */
struct agent_pin {
	const struct agent_def *a;
	const struct agent_target *t;
	char *const *user_args;
	size_t n_user;
	struct agent_plan *p;
	const char *v1;   /* <endpoint>/v1 */
	const char *anth; /* <endpoint>/anthropic */
	char *err;
	size_t errlen;
};

/* Where an entry of a variable table takes its value from. */
enum pin_from { PIN_LIT, PIN_V1, PIN_TOKEN, PIN_MODEL, PIN_LAST_FILE };

/* One variable an agent is pinned with. Most agents' variables are a fixed
 * list of these, so they are written as data; lists end with a NULL name. */
struct env_pin {
	const char *name;
	enum pin_from from;
	const char *lit; /* PIN_LIT's value */
};

/* The file the builder wrote last (what a variable or flag then names). */
static const char *last_file(const struct agent_plan *p)
{
	return p->files[p->n_files - 1];
}

static const char *pin_value(const struct agent_pin *c, const struct env_pin *e)
{
	switch (e->from) {
	case PIN_V1:
		return c->v1;
	case PIN_TOKEN:
		return c->t->token;
	case PIN_MODEL:
		return c->t->model_id;
	case PIN_LAST_FILE:
		return last_file(c->p);
	case PIN_LIT:
		break;
	}
	return e->lit;
}

/* Sets the list's variables in its order (env.sh keeps that order). 0, or -1
 * when out of memory. */
static int env_pins(struct agent_pin *c, const struct env_pin *e)
{
	for (; e->name; e++)
		if (env_set(c->p, e->name, pin_value(c, e)) != 0)
			return oom(c->err, c->errlen);
	return 0;
}

/* Adds `flag value` unless the user gave the flag (long or short form) after
 * `--`: the agents that take one refuse it twice, or let the first win. */
static int arg_unless_user(struct agent_pin *c, const char *lng, const char *shrt,
                           const char *value)
{
	if (user_has(c->user_args, c->n_user, lng, shrt))
		return 0;
	return arg(c->p, lng) == 0 && arg(c->p, value) == 0 ? 0 : oom(c->err, c->errlen);
}

/* Writes doc as <dir>/<name>, taking its reference (NULL: out of memory). */
static int write_doc(struct agent_pin *c, const char *dir, const char *name, json_t *doc)
{
	int r = write_json(c->p, dir, name, doc, c->err, c->errlen);
	json_decref(doc);
	return r;
}

/* Writes text (owned; NULL: out of memory) as <plan dir>/home/<name>, a
 * private configuration directory, and sets var to that directory: for the
 * agents that can only be pointed at a whole directory. */
static int write_home(struct agent_pin *c, const char *name, char *text, const char *var)
{
	char *home = private_dir(c->p, "home", c->err, c->errlen);
	int r = -1;
	if (!home)
		r = -1;
	else if (!text)
		r = oom(c->err, c->errlen);
	else if (write_file(c->p, home, name, text, c->err, c->errlen) == 0)
		r = env_set(c->p, var, home) == 0 ? 0 : oom(c->err, c->errlen);
	free(text);
	free(home);
	return r;
}

/* The context and output limits as lines of a TOML or YAML text
 * ("<key><n>\n", the key with its indent and separator), each left out when
 * unknown. */
static void limit_lines(const struct agent_target *t, const char *ctx_key, const char *out_key,
                        char *buf, size_t n)
{
	buf[0] = '\0';
	if (t->context_length > 0)
		snprintf(buf, n, "%s%ld\n", ctx_key, t->context_length);
	if (t->max_output > 0)
		snprintf(buf + strlen(buf), n - strlen(buf), "%s%ld\n", out_key, t->max_output);
}

/* The same limits as a JSON model's contextWindow and maxTokens (Pi's and
 * OpenClaw's names). model may be NULL. */
static void json_limits(json_t *model, const struct agent_target *t)
{
	if (model && t->context_length > 0)
		json_object_set_new(model, "contextWindow", json_integer(t->context_length));
	if (model && t->max_output > 0)
		json_object_set_new(model, "maxTokens", json_integer(t->max_output));
}

/* The provider block the OpenCode family (OpenCode, Kilo Code, MiMo Code)
 * reads: an @ai-sdk/openai-compatible provider "toki" with one model. With
 * timeout_ms, the provider's headerTimeout and chunkTimeout (OpenCode's
 * defaults: 300000 each, which a long prefill on a CPU outlasts). */
/* One model of an OpenCode provider: its name and, when both are known,
 * its limits. */
static json_t *opencode_model(const char *id, long ctx, long out)
{
	json_t *model = json_pack("{s:s}", "name", id);
	if (model && ctx > 0 && out > 0)
		json_object_set_new(
		    model, "limit",
		    json_pack("{s:I, s:I}", "context", (json_int_t)ctx, "output", (json_int_t)out));
	return model;
}

static json_t *opencode_doc(const struct agent_target *t, const char *v1, const char *api_key,
                            const char *schema, long timeout_ms)
{
	json_t *models = json_object();
	if (models)
		json_object_set_new(models, t->model_id,
		                    opencode_model(t->model_id, t->context_length, t->max_output));
	/* --small: the second model beside it, OpenCode's small_model (titles
	 * and other light tasks). */
	const char *small = t->small_model_id ? t->small_model_id : t->model_id;
	if (models && t->small_model_id && strcmp(small, t->model_id))
		json_object_set_new(
		    models, small,
		    opencode_model(small, t->small_context_length, t->small_max_output));
	char *ref = xasprintf("toki/%s", t->model_id);
	char *small_ref = xasprintf("toki/%s", small);
	json_t *doc = NULL;
	if (models && ref && small_ref)
		doc = json_pack("{s:s, s:{s:{s:s, s:s, s:{s:s, s:s}, s:o}}, s:s, s:s}", "$schema",
		                schema, "provider", "toki", "npm", "@ai-sdk/openai-compatible",
		                "name", "Toki Recur", "options", "baseURL", v1, "apiKey", api_key,
		                "models", models, "model", ref, "small_model", small_ref);
	else
		json_decref(models);
	free(ref);
	free(small_ref);
	json_t *options =
	    json_object_get(json_object_get(json_object_get(doc, "provider"), "toki"), "options");
	if (options && timeout_ms > 0) {
		json_object_set_new(options, "headerTimeout", json_integer(timeout_ms));
		json_object_set_new(options, "chunkTimeout", json_integer(timeout_ms));
	}
	return doc;
}

/* --- builders --------------------------------------------------------------- */

/* Toki Chat: toki's own TUI, given the run's endpoint with --url (unless the
 * user gave one) and the token in TOKI_TOKEN. */
static int build_toki(struct agent_pin *c)
{
	struct agent_plan *p = c->p;
	free(p->exe);
	p->exe = strdup(c->t->toki_exe ? c->t->toki_exe : "toki");
	if (!p->exe || arg(p, "tui") != 0)
		return oom(c->err, c->errlen);
	if (arg_unless_user(c, "--url", NULL, c->t->endpoint) != 0)
		return -1;
	return env_set(p, "TOKI_TOKEN", c->t->token) == 0 ? 0 : oom(c->err, c->errlen);
}

/* Claude Code: an owner-only settings file given with --settings whose env
 * block carries ANTHROPIC_BASE_URL (<endpoint>/anthropic),
 * ANTHROPIC_AUTH_TOKEN (sent as a Bearer token, without the approval an API
 * key needs), the model for every tier (the Haiku tier the --small one),
 * and telemetry off. ANTHROPIC_API_KEY
 * is removed from the child's environment. */
static int build_claude(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	struct agent_plan *p = c->p;
	char *err = c->err;
	size_t errlen = c->errlen;
	/* --small: the Haiku tier and its older name, the small fast model
	 * (titles, summaries, quick checks); the main and sub-agent models stay
	 * the main one. */
	const char *small = t->small_model_id ? t->small_model_id : t->model_id;
	json_t *env = json_pack(
	    "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "ANTHROPIC_BASE_URL",
	    c->anth, "ANTHROPIC_AUTH_TOKEN", t->token, "ANTHROPIC_MODEL", t->model_id,
	    "ANTHROPIC_SMALL_FAST_MODEL", small, "ANTHROPIC_DEFAULT_HAIKU_MODEL", small,
	    "ANTHROPIC_DEFAULT_SONNET_MODEL", t->model_id, "ANTHROPIC_DEFAULT_OPUS_MODEL",
	    t->model_id, "CLAUDE_CODE_SUBAGENT_MODEL", t->model_id,
	    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1", "DISABLE_TELEMETRY", "1",
	    "DISABLE_ERROR_REPORTING", "1", "DISABLE_AUTOUPDATER", "1");
	if (!env)
		return oom(err, errlen);
	char num[32];
	if (t->context_length > 0) {
		snprintf(num, sizeof num, "%ld", t->context_length);
		json_object_set_new(env, "CLAUDE_CODE_MAX_CONTEXT_TOKENS", json_string(num));
	}
	/* No CLAUDE_CODE_MAX_OUTPUT_TOKENS from max_output: Claude Code treats
	 * reaching its own max_tokens as an error, while a cut made by toki's
	 * max_output ends the turn ("end_turn"). It asks for its default, and
	 * the daemon caps the reply. */
	/* Timeouts: TOKI_CLAUDE_TIMEOUT_MS, else TOKI_AGENT_TIMEOUT_MS, else 30
	 * min on a CPU-only machine, else Claude Code's own defaults. */
	long timeout =
	    t->claude_timeout_ms && *t->claude_timeout_ms
	        ? timeout_ms_of("TOKI_CLAUDE_TIMEOUT_MS", t->claude_timeout_ms, 0, err, errlen)
	        : agent_timeout_ms(t, err, errlen);
	if (timeout < 0) {
		json_decref(env);
		return -1;
	}
	if (timeout > 0) {
		snprintf(num, sizeof num, "%ld", timeout);
		json_object_set_new(env, "API_TIMEOUT_MS", json_string(num));
		json_object_set_new(env, "CLAUDE_STREAM_IDLE_TIMEOUT_MS", json_string(num));
	}
	json_t *settings = json_pack("{s:o, s:s}", "env", env, "model", t->model_id);
	if (!settings)
		return oom(err, errlen);
	/* Effort: Claude Code's effort level (CLAUDE_CODE_EFFORT_LEVEL, which
	 * wins over --effort and /effort, and the effortLevel setting); "low"
	 * also caps the extended-thinking budget (MAX_THINKING_TOKENS) at the
	 * API's minimum, 1024. */
	const char *effort = t->claude_effort;
	if (effort && *effort) {
		static const char *const levels[] = {"low", "medium", "high", "xhigh", "max"};
		int ok = 0;
		for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
			ok |= !strcmp(effort, levels[i]);
		if (!ok) {
			json_decref(settings);
			snprintf(
			    err, errlen,
			    "TOKI_CLAUDE_EFFORT must be low, medium, high, xhigh or max, not '%s'",
			    effort);
			return -1;
		}
		json_object_set_new(env, "CLAUDE_CODE_EFFORT_LEVEL", json_string(effort));
		json_object_set_new(settings, "effortLevel", json_string(effort));
		if (!strcmp(effort, "low"))
			json_object_set_new(env, "MAX_THINKING_TOKENS", json_string("1024"));
	}
	if (write_doc(c, p->dir, "settings.json", settings) != 0)
		return -1;
	if (arg(p, "--settings") != 0 || arg(p, last_file(p)) != 0)
		return oom(err, errlen);
	if (arg_unless_user(c, "--model", NULL, t->model_id) != 0)
		return -1;
	const char *bare = t->claude_bare;
	if (bare && *bare && strcmp(bare, "0") && arg(p, "--bare") != 0)
		return oom(err, errlen);
	const char *mcp = t->claude_mcp;
	if (mcp && *mcp) {
		if (strcmp(mcp, "none")) {
			snprintf(err, errlen, "TOKI_CLAUDE_MCP knows only 'none', not '%s'", mcp);
			return -1;
		}
		if (write_doc(c, p->dir, "mcp-none.json", json_pack("{s:{}}", "mcpServers")) != 0)
			return -1;
		if (arg(p, "--mcp-config") != 0 || arg(p, last_file(p)) != 0 ||
		    arg(p, "--strict-mcp-config") != 0)
			return oom(err, errlen);
	}
	return env_unset(p, "ANTHROPIC_API_KEY") == 0 ? 0 : oom(err, errlen);
}

/* Codex has no background model of its own: --small writes a profile,
 * small.config.toml beside config.toml, which `codex --profile small`
 * layers over it (Codex >= 0.134 reads a profile from
 * $CODEX_HOME/<name>.config.toml), so that a run or `codex exec` can be put
 * on the small model through the same provider. */
static int codex_small_profile(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	char *model = agents_toml_string(t->small_model_id);
	/* The context only: Codex 0.171.0 ignores model_max_output_tokens (it
	 * says so at start), and toki's max_output cuts the answer anyway. */
	char limits[64] = "";
	if (t->small_context_length > 0)
		snprintf(limits, sizeof limits, "model_context_window = %ld\n",
		         t->small_context_length);
	char *toml = model ? xasprintf("# Written by toki launch: `codex --profile small` runs on "
	                               "the small model.\n"
	                               "model = %s\n"
	                               "%s",
	                               model, limits)
	                   : NULL;
	free(model);
	char *home = private_dir(c->p, "home", c->err, c->errlen);
	int r = -1;
	if (!toml)
		r = oom(c->err, c->errlen);
	else if (home)
		r = write_file(c->p, home, "small.config.toml", toml, c->err, c->errlen);
	free(toml);
	free(home);
	return r;
}

/* Codex: a private CODEX_HOME holding a fresh config.toml with a "toki"
 * model provider (Responses API, key from $TOKI_API_KEY via env_key); with
 * --small, a "small" profile beside it. */
static int build_codex(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	/* Codex gives up on a stream that is idle for stream_idle_timeout_ms
	 * (300000 by default), a long prefill on a CPU included. */
	long timeout = agent_timeout_ms(t, c->err, c->errlen);
	if (timeout < 0)
		return -1;
	char idle[64] = "";
	if (timeout > 0)
		snprintf(idle, sizeof idle, "stream_idle_timeout_ms = %ld\n", timeout);
	char *model = agents_toml_string(t->model_id);
	char *base = agents_toml_string(c->v1);
	char limits[128];
	limit_lines(t, "model_context_window = ", "model_max_output_tokens = ", limits,
	            sizeof limits);
	char *toml = model && base ? xasprintf("# Written by toki launch: Codex pinned to the "
	                                       "local model.\n"
	                                       "model = %s\n"
	                                       "model_provider = \"toki\"\n"
	                                       "%s"
	                                       "\n"
	                                       "[model_providers.toki]\n"
	                                       "name = \"Toki Recur\"\n"
	                                       "base_url = %s\n"
	                                       "env_key = \"" TOKEN_ENV "\"\n"
	                                       "wire_api = \"responses\"\n"
	                                       "%s",
	                                       model, limits, base, idle)
	                           : NULL;
	free(model);
	free(base);
	if (write_home(c, "config.toml", toml, "CODEX_HOME") != 0)
		return -1;
	if (t->small_model_id && codex_small_profile(c) != 0)
		return -1;
	return env_set(c->p, TOKEN_ENV, t->token) == 0 ? 0 : oom(c->err, c->errlen);
}

/* What tells the OpenCode family's members apart: their file, its $schema,
 * whether the key is written into it, the document keys that turn updates and
 * sharing off, and the variables (the first names the file). */
struct opencode_kind {
	const char *file, *schema;
	int key_in_file; /* else {env:TOKI_API_KEY}, OpenCode's substitution */
	int autoupdate_off, share_off;
	const struct env_pin *env;
};

static int build_opencode_kind(struct agent_pin *c, const struct opencode_kind *k)
{
	long timeout = agent_timeout_ms(c->t, c->err, c->errlen);
	if (timeout < 0)
		return -1;
	json_t *doc = opencode_doc(
	    c->t, c->v1, k->key_in_file ? c->t->token : "{env:" TOKEN_ENV "}", k->schema, timeout);
	if (doc && k->autoupdate_off)
		json_object_set_new(doc, "autoupdate", json_false());
	if (doc && k->share_off)
		json_object_set_new(doc, "share", json_string("disabled"));
	if (write_doc(c, c->p->dir, k->file, doc) != 0)
		return -1;
	return env_pins(c, k->env);
}

/* OpenCode: OPENCODE_CONFIG names a config file with a "toki" provider and
 * the default models set to it; the key is read from $TOKI_API_KEY through
 * OpenCode's {env:...} substitution. */
static int build_opencode(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"OPENCODE_CONFIG", PIN_LAST_FILE, NULL},
	    {TOKEN_ENV, PIN_TOKEN, NULL},
	    {"OPENCODE_DISABLE_AUTOUPDATE", PIN_LIT, "1"},
	    {NULL, PIN_LIT, NULL},
	};
	static const struct opencode_kind k = {
	    "opencode.json", "https://opencode.ai/config.json", 0, 1, 1, env};
	return build_opencode_kind(c, &k);
}

/* Kilo Code (an OpenCode fork): KILO_CONFIG names a config file in the same
 * format. The key is written into the file (0600). Telemetry: Kilo 7.7.7
 * sends PostHog events unless KILO_TELEMETRY_LEVEL, read once at start, is
 * something other than "all". */
static int build_kilo(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"KILO_CONFIG", PIN_LAST_FILE, NULL},
	    {"KILO_DISABLE_AUTOUPDATE", PIN_LIT, "1"},
	    {"KILO_TELEMETRY_LEVEL", PIN_LIT, "off"},
	    {NULL, PIN_LIT, NULL},
	};
	static const struct opencode_kind k = {
	    "kilo.json", "https://app.kilo.ai/config.json", 1, 0, 0, env};
	return build_opencode_kind(c, &k);
}

/* MiMo Code (Xiaomi's OpenCode fork): MIMOCODE_CONFIG names a config file in
 * OpenCode's format. The key is written into the file (0600). */
static int build_mimo(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"MIMOCODE_CONFIG", PIN_LAST_FILE, NULL},
	    {"MIMOCODE_DISABLE_AUTOUPDATE", PIN_LIT, "1"},
	    {NULL, PIN_LIT, NULL},
	};
	static const struct opencode_kind k = {
	    "mimocode.json", "https://mimo.xiaomi.com/config.json", 1, 1, 0, env};
	return build_opencode_kind(c, &k);
}

/* A Qwen Code provider entry: the model on toki's endpoint, its key read
 * from $OPENAI_API_KEY (Qwen Code keeps no credential in settings). */
static json_t *qwen_model(const char *id, const char *v1)
{
	return json_pack("{s:s, s:s, s:s, s:s}", "id", id, "name", id, "baseUrl", v1, "envKey",
	                 "OPENAI_API_KEY");
}

/* --small for Qwen Code: its fastModel setting (prompt suggestions,
 * speculation, tool-use summaries, the Explore sub-agent's "fast"), in a
 * settings file named by QWEN_CODE_SYSTEM_SETTINGS_PATH, the one scope that
 * wins over the user's and the project's settings. Qwen Code uses a
 * fastModel only when modelProviders lists it, so both models are listed
 * there, on toki's endpoint. */
static int qwen_fast_model(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	json_t *list = json_array();
	if (list) {
		json_array_append_new(list, qwen_model(t->model_id, c->v1));
		if (strcmp(t->small_model_id, t->model_id))
			json_array_append_new(list, qwen_model(t->small_model_id, c->v1));
	}
	json_t *doc = list ? json_pack("{s:s, s:{s:o}}", "fastModel", t->small_model_id,
	                               "modelProviders", "openai", list)
	                   : NULL;
	if (write_doc(c, c->p->dir, "settings.json", doc) != 0)
		return -1;
	return env_set(c->p, "QWEN_CODE_SYSTEM_SETTINGS_PATH", last_file(c->p)) == 0
	           ? 0
	           : oom(c->err, c->errlen);
}

/* Qwen Code: OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL, with
 * --auth-type openai and --model in front so that a provider chosen earlier
 * in ~/.qwen/settings.json does not win (Qwen Code reads the command line
 * first). Neither flag is added when the user gave it (Qwen Code refuses a
 * repeated one). With --small, a settings file with its fastModel. */
static int build_qwen(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"OPENAI_BASE_URL", PIN_V1, NULL},
	    {"OPENAI_API_KEY", PIN_TOKEN, NULL},
	    {"OPENAI_MODEL", PIN_MODEL, NULL},
	    {NULL, PIN_LIT, NULL},
	};
	if (env_pins(c, env) != 0 || arg_unless_user(c, "--auth-type", "--authType", "openai") != 0)
		return -1;
	if (c->t->small_model_id && qwen_fast_model(c) != 0)
		return -1;
	return arg_unless_user(c, "--model", "-m", c->t->model_id);
}

/* Factory Droid: --settings names a runtime settings file (merged for this
 * process only) with one custom model on the Chat Completions API, selected
 * as the session default; the key is ${TOKI_API_KEY}, expanded by Droid.
 * Telemetry: Droid 0.215.0 starts its Sentry reporting unless in airgap mode
 * (FACTORY_AIRGAP_ENABLED, which also keeps it off Factory's cloud: nothing a
 * run on the local model needs); no auto-update either. */
static int build_droid(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {TOKEN_ENV, PIN_TOKEN, NULL},
	    {"FACTORY_AIRGAP_ENABLED", PIN_LIT, "1"},
	    {"FACTORY_DROID_AUTO_UPDATE_ENABLED", PIN_LIT, "false"},
	    {NULL, PIN_LIT, NULL},
	};
	const struct agent_target *t = c->t;
	json_t *model = json_pack("{s:s, s:s, s:i, s:s, s:s, s:s, s:s, s:b}", "model", t->model_id,
	                          "id", "custom:toki-0", "index", 0, "displayName", "toki",
	                          "baseUrl", c->v1, "apiKey", "${" TOKEN_ENV "}", "provider",
	                          "generic-chat-completion-api", "supportsImages", 0);
	/* Droid sends maxOutputTokens as max_tokens as it is (32000 without
	 * it), and without maxContextLimit it does not know when its prompt has
	 * left too little of the context for an answer. */
	long budget = output_budget(t);
	if (model && budget > 0)
		json_object_set_new(model, "maxOutputTokens", json_integer(budget));
	if (model && t->context_length > 0)
		json_object_set_new(model, "maxContextLimit",
		                    json_integer(t->context_length - budget));
	json_t *doc = model ? json_pack("{s:[o], s:{s:s}, s:b}", "customModels", model,
	                                "sessionDefaultSettings", "model", "custom:toki-0",
	                                "cloudSessionSync", 0)
	                    : NULL;
	if (write_doc(c, c->p->dir, "settings.json", doc) != 0)
		return -1;
	if (arg(c->p, "--settings") != 0 || arg(c->p, last_file(c->p)) != 0)
		return oom(c->err, c->errlen);
	return env_pins(c, env);
}

/* Now as an ISO 8601 UTC time with milliseconds ("2026-12-01T13:31:41.130Z"),
 * the form JavaScript's Date.toISOString() writes. */
static void iso_now(char *out, size_t n)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char sec[32];
	strftime(sec, sizeof sec, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, n, "%s.%03ldZ", sec, ts.tv_nsec / 1000000);
}

/* Cline CLI: --data-dir names a private state directory whose
 * settings/providers.json selects the openai-compatible provider (the file
 * `cline auth -p openai-compatible -k KEY -m MODEL -b URL` writes);
 * --provider/--model select it for the run. The key is in the file (0600).
 * Each provider entry needs its updatedAt (an ISO datetime): Cline 3.0.65
 * validates the file and, without it, discards the whole file and falls back
 * to its own provider. */
static int build_cline(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	struct agent_plan *p = c->p;
	char now[64];
	iso_now(now, sizeof now);
	json_t *doc = json_pack("{s:i, s:s, s:{}, s:{s:{s:{s:s, s:s, s:s, s:s}, s:s, s:s}}}",
	                        "version", 1, "lastUsedProvider", "openai-compatible", "modes",
	                        "providers", "openai-compatible", "settings", "provider",
	                        "openai-compatible", "apiKey", t->token, "model", t->model_id,
	                        "baseUrl", c->v1, "updatedAt", now, "tokenSource", "manual");
	char *data = private_dir(p, "data", c->err, c->errlen);
	char *settings = data ? private_dir(p, "data/settings", c->err, c->errlen) : NULL;
	/* Its global settings in the same directory: telemetry and auto-update
	 * off (telemetryOptOut, autoUpdateEnabled in Cline 3.0.65's schema). */
	json_t *global = json_pack("{s:b, s:b}", "telemetryOptOut", 1, "autoUpdateEnabled", 0);
	int r = -1;
	if (!doc || !global)
		r = oom(c->err, c->errlen);
	else if (settings && write_json(p, settings, "providers.json", doc, c->err, c->errlen) == 0)
		r = write_json(p, settings, "global-settings.json", global, c->err, c->errlen);
	json_decref(doc);
	json_decref(global);
	free(settings);
	if (r == 0 && (arg(p, "--data-dir") != 0 || arg(p, data) != 0))
		r = oom(c->err, c->errlen);
	free(data);
	if (r != 0)
		return -1;
	if (arg_unless_user(c, "--provider", "-P", "openai-compatible") != 0)
		return -1;
	return arg_unless_user(c, "--model", "-m", t->model_id);
}

/* --small for Hermes: its auxiliary side tasks, each an auxiliary.<task>
 * block with the small model at the same endpoint (a base_url makes the
 * task use that endpoint directly, whatever its provider). Not vision
 * (it needs a multimodal model) nor compression: Hermes drops the middle
 * turns unsummarized when the summary model's window is smaller than the
 * main one's, which a small model's may well be. NULL on OOM. */
static char *hermes_auxiliary(const char *small, const char *base, const char *key)
{
	static const char *const tasks[] = {"web_extract", "session_search", "title_generation"};
	char *yaml = strdup("auxiliary:\n");
	for (size_t i = 0; yaml && i < sizeof tasks / sizeof tasks[0]; i++) {
		char *more = xasprintf("%s  %s:\n"
		                       "    provider: \"custom\"\n"
		                       "    model: %s\n"
		                       "    base_url: %s\n"
		                       "    api_key: %s\n",
		                       yaml, tasks[i], small, base, key);
		free(yaml);
		yaml = more;
	}
	return yaml;
}

/* Hermes Agent: a private HERMES_HOME with a config.yaml whose model block
 * is a custom endpoint (provider: custom, base_url, api_key, default); with
 * --small, the auxiliary tasks on the small model. */
static int build_hermes(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	char *model = agents_yaml_string(t->model_id);
	char *base = agents_yaml_string(c->v1);
	char *key = agents_yaml_string(t->token);
	char *small = t->small_model_id ? agents_yaml_string(t->small_model_id) : NULL;
	char *aux = small && base && key ? hermes_auxiliary(small, base, key) : NULL;
	char ctx[64] = "";
	if (t->context_length > 0)
		snprintf(ctx, sizeof ctx, "  context_length: %ld\n", t->context_length);
	char *yaml = model && base && key && (!t->small_model_id || aux)
	                 ? xasprintf("# Written by toki launch: Hermes pinned to "
	                             "the local model.\n"
	                             "model:\n"
	                             "  default: %s\n"
	                             "  provider: \"custom\"\n"
	                             "  base_url: %s\n"
	                             "  api_key: %s\n"
	                             "%s%s",
	                             model, base, key, ctx, aux ? aux : "")
	                 : NULL;
	free(model);
	free(base);
	free(key);
	free(small);
	free(aux);
	return write_home(c, "config.yaml", yaml, "HERMES_HOME");
}

/* --small for OpenClaw: agents.defaults.subagents.model, the model its
 * sub-agents run on unless a spawn names one (the same {primary} shape as
 * agents.defaults.model), the small model added to the "toki" provider
 * beside the main one. */
static int openclaw_small(json_t *doc, const struct agent_target *t)
{
	const char *small = t->small_model_id;
	json_t *list = json_object_get(
	    json_object_get(json_object_get(json_object_get(doc, "models"), "providers"), "toki"),
	    "models");
	if (strcmp(small, t->model_id)) {
		json_t *m = json_pack("{s:s, s:s}", "id", small, "name", small);
		if (m && t->small_context_length > 0)
			json_object_set_new(m, "contextWindow",
			                    json_integer(t->small_context_length));
		if (m && t->small_max_output > 0)
			json_object_set_new(m, "maxTokens", json_integer(t->small_max_output));
		if (!m || json_array_append_new(list, m) != 0)
			return -1;
	}
	char *ref = xasprintf("toki/%s", small);
	json_t *sub = ref ? json_pack("{s:{s:s}}", "model", "primary", ref) : NULL;
	free(ref);
	return sub ? json_object_set_new(
	                 json_object_get(json_object_get(doc, "agents"), "defaults"), "subagents",
	                 sub)
	           : -1;
}

/* OpenClaw: OPENCLAW_CONFIG_PATH names a config file with a "toki" provider
 * under models.providers (OpenAI completions API, key ${TOKI_API_KEY}) and
 * agents.defaults.model.primary set to it. */
static int build_openclaw(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"OPENCLAW_CONFIG_PATH", PIN_LAST_FILE, NULL},
	    {TOKEN_ENV, PIN_TOKEN, NULL},
	    {NULL, PIN_LIT, NULL},
	};
	const struct agent_target *t = c->t;
	/* OpenClaw aborts a model request after its provider's timeoutSeconds
	 * (300 by default) and retries it from the start. */
	long timeout = agent_timeout_ms(t, c->err, c->errlen);
	if (timeout < 0)
		return -1;
	json_t *model = json_pack("{s:s, s:s}", "id", t->model_id, "name", t->model_id);
	json_limits(model, t);
	char *ref = xasprintf("toki/%s", t->model_id);
	json_t *doc = NULL;
	/* json_pack takes the "o" reference, on failure too (jansson >= 2.11). */
	if (ref)
		doc = json_pack("{s:{s:{s:{s:s, s:s, s:s, s:[o]}}}, s:{s:{s:{s:s}}}}", "models",
		                "providers", "toki", "baseUrl", c->v1, "apiKey", "${" TOKEN_ENV "}",
		                "api", "openai-completions", "models", model, "agents", "defaults",
		                "model", "primary", ref);
	else
		json_decref(model);
	free(ref);
	if (doc && t->small_model_id && openclaw_small(doc, t) != 0) {
		json_decref(doc);
		doc = NULL;
	}
	if (doc && timeout > 0)
		json_object_set_new(
		    json_object_get(json_object_get(json_object_get(doc, "models"), "providers"),
		                    "toki"),
		    "timeoutSeconds", json_integer((timeout + 999) / 1000));
	if (write_doc(c, c->p->dir, "openclaw.json", doc) != 0)
		return -1;
	return env_pins(c, env);
}

/* The provider entry of Pi's models.json (and OMP's models.yml): the key is
 * the name of the variable that holds it, which both resolve. */
static json_t *pi_provider(const struct agent_target *t, const char *v1)
{
	json_t *model = json_pack("{s:s, s:s, s:b, s:[s]}", "id", t->model_id, "name", t->model_id,
	                          "reasoning", 0, "input", "text");
	json_limits(model, t);
	return model ? json_pack("{s:s, s:s, s:s, s:{s:b, s:b}, s:[o]}", "baseUrl", v1, "api",
	                         "openai-completions", "apiKey", TOKEN_ENV, "compat",
	                         "supportsDeveloperRole", 0, "supportsReasoningEffort", 0, "models",
	                         model)
	             : NULL;
}

/* Pi: PI_CODING_AGENT_DIR names a private agent directory whose models.json
 * adds a "toki" provider and whose settings.json makes it the default;
 * --provider/--model select it too. */
static int build_pi(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	struct agent_plan *p = c->p;
	json_t *prov = pi_provider(t, c->v1);
	json_t *models = prov ? json_pack("{s:{s:o}}", "providers", "toki", prov) : NULL;
	json_t *settings =
	    json_pack("{s:s, s:s}", "defaultProvider", "toki", "defaultModel", t->model_id);
	char *dir = private_dir(p, "agent", c->err, c->errlen);
	int r = -1;
	if (!models || !settings)
		r = oom(c->err, c->errlen);
	else if (dir && write_json(p, dir, "models.json", models, c->err, c->errlen) == 0 &&
	         write_json(p, dir, "settings.json", settings, c->err, c->errlen) == 0)
		r = env_set(p, "PI_CODING_AGENT_DIR", dir) == 0 &&
		            env_set(p, TOKEN_ENV, t->token) == 0 &&
		            env_set(p, "PI_OFFLINE", "1") == 0
		        ? 0
		        : oom(c->err, c->errlen);
	json_decref(models);
	json_decref(settings);
	free(dir);
	if (r != 0)
		return -1;
	if (!user_has(c->user_args, c->n_user, "--provider", NULL) &&
	    !user_has(c->user_args, c->n_user, "--model", NULL) &&
	    (arg(p, "--provider") != 0 || arg(p, "toki") != 0 || arg(p, "--model") != 0 ||
	     arg(p, t->model_id) != 0))
		return oom(c->err, c->errlen);
	return 0;
}

/* One model of OMP's models.yml, id already quoted: its lines under the
 * provider's models list. */
static char *omp_model(const char *qid, long ctx, long out)
{
	char lim[128];
	limit_lines(&(struct agent_target){.context_length = ctx, .max_output = out},
	            "        contextWindow: ", "        maxTokens: ", lim, sizeof lim);
	return xasprintf("      - id: %s\n"
	                 "        name: %s\n"
	                 "        reasoning: false\n"
	                 "        input: [\"text\"]\n"
	                 "%s",
	                 qid, qid, lim);
}

/* OMP (oh-my-pi, a Pi fork): PI_CODING_AGENT_DIR names a private agent
 * directory with models.yml (a "toki" provider, Pi's format) and config.yml
 * (setup done; with --small, modelRoles.smol); --model toki/<id> selects
 * it. */
static int build_omp(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	struct agent_plan *p = c->p;
	char *base = agents_yaml_string(c->v1);
	char *id = agents_yaml_string(t->model_id);
	char *main_entry = id ? omp_model(id, t->context_length, t->max_output) : NULL;
	/* --small: the second model in the provider, and OMP's "smol" role
	 * (its fast model for light tasks) set to it in config.yml. */
	const char *small = t->small_model_id;
	int second = small && strcmp(small, t->model_id);
	char *sid = small ? agents_yaml_string(small) : NULL;
	char *small_ref = sid ? xasprintf("toki/%s", small) : NULL;
	char *qref = small_ref ? agents_yaml_string(small_ref) : NULL;
	char *small_entry =
	    second && sid ? omp_model(sid, t->small_context_length, t->small_max_output) : NULL;
	char *config = !small ? strdup("setupVersion: 1\n")
	               : qref ? xasprintf("setupVersion: 1\nmodelRoles:\n  smol: %s\n", qref)
	                      : NULL;
	/* JSON is YAML: the same document Pi reads, as YAML for OMP. */
	char *yaml = base && main_entry && (!second || small_entry)
	                 ? xasprintf("# Written by toki launch: OMP pinned to the local "
	                             "model.\n"
	                             "providers:\n"
	                             "  toki:\n"
	                             "    baseUrl: %s\n"
	                             "    api: \"openai-completions\"\n"
	                             "    apiKey: \"" TOKEN_ENV "\"\n"
	                             "    models:\n"
	                             "%s%s",
	                             base, main_entry, small_entry ? small_entry : "")
	                 : NULL;
	free(base);
	free(id);
	free(main_entry);
	free(sid);
	free(small_ref);
	free(qref);
	free(small_entry);
	char *dir = private_dir(p, "agent", c->err, c->errlen);
	int r = -1;
	if (!yaml || !config)
		r = oom(c->err, c->errlen);
	else if (dir && write_file(p, dir, "models.yml", yaml, c->err, c->errlen) == 0 &&
	         write_file(p, dir, "config.yml", config, c->err, c->errlen) == 0)
		r = env_set(p, "PI_CODING_AGENT_DIR", dir) == 0 &&
		            env_set(p, TOKEN_ENV, t->token) == 0
		        ? 0
		        : oom(c->err, c->errlen);
	free(yaml);
	free(config);
	free(dir);
	if (r != 0)
		return -1;
	char *ref = xasprintf("toki/%s", t->model_id);
	if (!ref)
		return oom(c->err, c->errlen);
	r = arg_unless_user(c, "--model", NULL, ref);
	free(ref);
	return r;
}

/* DeepSeek Harness: a --patch overlay (the launcher's last configuration
 * layer) that points the "settings" plugin at a settings.yaml with a "toki"
 * provider (openai-completions, key from $TOKI_API_KEY) as the default
 * model. Without arguments it starts the web profile, as `dsh web` does. */
static int build_dsh(struct agent_pin *c)
{
	const struct agent_target *t = c->t;
	struct agent_plan *p = c->p;
	char *base = agents_yaml_string(c->v1);
	char *id = agents_yaml_string(t->model_id);
	char lim[128];
	limit_lines(t, "          contextWindow: ", "          maxTokens: ", lim, sizeof lim);
	char *settings = base && id ? xasprintf("# Written by toki launch: DeepSeek Harness "
	                                        "pinned to the local model.\n"
	                                        "agent-default-model:\n"
	                                        "  provider: \"toki\"\n"
	                                        "  model: %s\n"
	                                        "llm-pi-ai:\n"
	                                        "  providers:\n"
	                                        "    toki:\n"
	                                        "      displayName: \"Toki Recur\"\n"
	                                        "      apiKeyEnv: \"" TOKEN_ENV "\"\n"
	                                        "      api: \"openai-completions\"\n"
	                                        "      baseURL: %s\n"
	                                        "      models:\n"
	                                        "        - id: %s\n"
	                                        "          name: %s\n"
	                                        "          input: [\"text\"]\n"
	                                        "%s",
	                                        id, base, id, id, lim)
	                            : NULL;
	free(base);
	free(id);
	int r = -1;
	if (!settings)
		r = oom(c->err, c->errlen);
	else
		r = write_file(p, p->dir, "settings.yaml", settings, c->err, c->errlen);
	free(settings);
	if (r != 0)
		return -1;
	char *spath = agents_yaml_string(last_file(p));
	char *patch = spath ? xasprintf("# Written by toki launch: use the settings next to "
	                                "this file.\n"
	                                "- id: settings\n"
	                                "  config:\n"
	                                "    path: %s\n",
	                                spath)
	                    : NULL;
	free(spath);
	r = patch ? write_file(p, p->dir, "toki.cordis.yml", patch, c->err, c->errlen)
	          : oom(c->err, c->errlen);
	free(patch);
	if (r != 0)
		return -1;
	if (c->n_user == 0 && (arg(p, "--profile") != 0 || arg(p, "web") != 0))
		return oom(c->err, c->errlen);
	return arg(p, "--patch") == 0 && arg(p, last_file(p)) == 0 &&
	               env_set(p, TOKEN_ENV, t->token) == 0
	           ? 0
	           : oom(c->err, c->errlen);
}

/* Grok Build: its documented variables -- GROK_MODELS_BASE_URL (a custom
 * inference base URL), GROK_DEFAULT_MODEL, XAI_API_KEY -- and no updater. */
static int build_grok(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"GROK_MODELS_BASE_URL", PIN_V1, NULL},
	    {"GROK_DEFAULT_MODEL", PIN_MODEL, NULL},
	    {"XAI_API_KEY", PIN_TOKEN, NULL},
	    {"GROK_DISABLE_AUTOUPDATER", PIN_LIT, "1"},
	    {NULL, PIN_LIT, NULL},
	};
	return env_pins(c, env);
}

/* GitHub Copilot CLI: its BYOK variables (COPILOT_PROVIDER_BASE_URL,
 * _TYPE=openai, _API_KEY, _WIRE_API=completions, COPILOT_MODEL, the token
 * limits) and COPILOT_OFFLINE, so it talks to nothing but toki. */
static int build_copilot(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"COPILOT_PROVIDER_BASE_URL", PIN_V1, NULL},
	    {"COPILOT_PROVIDER_TYPE", PIN_LIT, "openai"},
	    {"COPILOT_PROVIDER_API_KEY", PIN_TOKEN, NULL},
	    {"COPILOT_PROVIDER_WIRE_API", PIN_LIT, "completions"},
	    {"COPILOT_MODEL", PIN_MODEL, NULL},
	    {"COPILOT_OFFLINE", PIN_LIT, "true"},
	    {NULL, PIN_LIT, NULL},
	};
	const struct agent_target *t = c->t;
	int ok = env_pins(c, env) == 0;
	/* The prompt cap is what the context holds once the output budget is
	 * set aside: the whole context left a full prompt no room to answer. */
	long budget = output_budget(t);
	if (ok && t->context_length > 0)
		ok = env_setl(c->p, "COPILOT_PROVIDER_MAX_PROMPT_TOKENS",
		              t->context_length - budget) == 0;
	if (ok && budget > 0)
		ok = env_setl(c->p, "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS", budget) == 0;
	return ok ? 0 : oom(c->err, c->errlen);
}

/* Kimi Code: the KIMI_MODEL_* variables, which define a temporary provider
 * and model in memory (nothing is written to its config.toml), and no
 * telemetry. */
static int build_kimi(struct agent_pin *c)
{
	static const struct env_pin env[] = {
	    {"KIMI_MODEL_NAME", PIN_MODEL, NULL},
	    {"KIMI_MODEL_API_KEY", PIN_TOKEN, NULL},
	    {"KIMI_MODEL_PROVIDER_TYPE", PIN_LIT, "openai"},
	    {"KIMI_MODEL_BASE_URL", PIN_V1, NULL},
	    {"KIMI_MODEL_CAPABILITIES", PIN_LIT, ""},
	    {"KIMI_DISABLE_TELEMETRY", PIN_LIT, "1"},
	    {NULL, PIN_LIT, NULL},
	};
	int ok = env_pins(c, env) == 0;
	if (ok && c->t->context_length > 0)
		ok = env_setl(c->p, "KIMI_MODEL_MAX_CONTEXT_SIZE", c->t->context_length) == 0;
	return ok ? 0 : oom(c->err, c->errlen);
}

/* --- the table ---------------------------------------------------------- */

static const char *const toki_aliases[] = {"toki-chat", "chat", "tui", NULL};
static const char *const opencode_aliases[] = {"open-code", NULL};
static const char *const mimo_aliases[] = {"mimo-code", "mimocode", NULL};
static const char *const hermes_aliases[] = {"hermes-agent", NULL};
static const char *const openclaw_aliases[] = {"clawdbot", "moltbot", NULL};
static const char *const codex_aliases[] = {"codex-cli", NULL};
static const char *const qwen_aliases[] = {"qwen-code", NULL};
static const char *const droid_aliases[] = {"factory", "factory-droid", NULL};
static const char *const cline_aliases[] = {"cline-cli", NULL};
static const char *const dsh_aliases[] = {"deepseek-harness", "deepseek", NULL};
static const char *const grok_aliases[] = {"grok-build", NULL};
static const char *const kilo_aliases[] = {"kilo-code", "kilocode", NULL};
static const char *const pi_aliases[] = {"pi-coding-agent", NULL};
static const char *const copilot_aliases[] = {"copilot-cli", "github-copilot", NULL};
static const char *const kimi_aliases[] = {"kimi-code", NULL};
static const char *const omp_aliases[] = {"oh-my-pi", NULL};
static const char *const claude_aliases[] = {"claude-code", NULL};

static const struct agent_def agents[] = {
    {"toki", "Toki Chat", toki_aliases, "toki", "part of toki (toki tui)", AGENT_API_TOKI,
     AGENT_DOC_DOCUMENTED, "toki tui --url <endpoint>, TOKI_TOKEN", NULL, build_toki},
    {"claude", "Claude Code", claude_aliases, "claude", "npm install -g @anthropic-ai/claude-code",
     AGENT_API_ANTHROPIC, AGENT_DOC_DOCUMENTED,
     "--settings file (env: ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_MODEL)",
     "ANTHROPIC_SMALL_FAST_MODEL and ANTHROPIC_DEFAULT_HAIKU_MODEL", build_claude},
    {"codex", "Codex", codex_aliases, "codex", "npm install -g @openai/codex",
     AGENT_API_OPENAI_RESPONSES, AGENT_DOC_DOCUMENTED,
     "private CODEX_HOME, config.toml model_providers.toki (wire_api = responses)",
     "profile small (small.config.toml; codex --profile small)", build_codex},
    {"opencode", "OpenCode", opencode_aliases, "opencode", "npm install -g opencode-ai",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED, "OPENCODE_CONFIG file, provider.toki",
     "small_model", build_opencode},
    {"qwen", "Qwen Code", qwen_aliases, "qwen", "npm install -g @qwen-code/qwen-code",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED,
     "OPENAI_BASE_URL/OPENAI_API_KEY/OPENAI_MODEL, --auth-type openai --model",
     "fastModel (QWEN_CODE_SYSTEM_SETTINGS_PATH file)", build_qwen},
    {"mimo", "MiMo Code", mimo_aliases, "mimo", "npm install -g @mimo-ai/cli",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_PARTIAL, "MIMOCODE_CONFIG file, OpenCode-format provider",
     "small_model", build_mimo},
    {"hermes", "Hermes Agent", hermes_aliases, "hermes",
     "curl -fsSL https://raw.githubusercontent.com/NousResearch/hermes-agent/main/scripts/"
     "install.sh | bash",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED,
     "private HERMES_HOME, config.yaml model.provider custom",
     "auxiliary.{web_extract,session_search,title_generation}", build_hermes},
    {"openclaw", "OpenClaw", openclaw_aliases, "openclaw",
     "npm install -g openclaw@latest (needs Node >=24.16 <25 or >=26.1)", AGENT_API_OPENAI_CHAT,
     AGENT_DOC_DOCUMENTED, "OPENCLAW_CONFIG_PATH file, models.providers.toki",
     "agents.defaults.subagents.model", build_openclaw},
    {"droid", "Factory Droid", droid_aliases, "droid", "npm install -g droid",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED, "--settings file, customModels (BYOK)", NULL,
     build_droid},
    {"cline", "Cline CLI", cline_aliases, "cline", "npm install -g cline", AGENT_API_OPENAI_CHAT,
     AGENT_DOC_PARTIAL, "private --data-dir, settings/providers.json openai-compatible", NULL,
     build_cline},
    {"dsh", "DeepSeek-Harness", dsh_aliases, "dsh", "npm install -g @deepseek-ai/dsh",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_PARTIAL, "--patch overlay, settings.yaml provider toki", NULL,
     build_dsh},
    {"grok", "Grok Build", grok_aliases, "grok", "curl -fsSL https://x.ai/cli/install.sh | bash",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_PARTIAL,
     "GROK_MODELS_BASE_URL, GROK_DEFAULT_MODEL, XAI_API_KEY", NULL, build_grok},
    /* 7.7.7: 7.8.1, the latest when this was written, fails to install its
     * platform package. */
    {"kilo", "Kilo Code", kilo_aliases, "kilo", "npm install -g @kilocode/cli@7.7.7",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_PARTIAL, "KILO_CONFIG file, OpenCode-format provider",
     "small_model", build_kilo},
    {"pi", "Pi", pi_aliases, "pi", "npm install -g @mariozechner/pi-coding-agent",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED,
     "private PI_CODING_AGENT_DIR, models.json provider toki", NULL, build_pi},
    {"copilot", "GitHub Copilot CLI", copilot_aliases, "copilot", "npm install -g @github/copilot",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_DOCUMENTED,
     "COPILOT_PROVIDER_BASE_URL/_API_KEY, COPILOT_MODEL, COPILOT_OFFLINE", NULL, build_copilot},
    {"kimi", "Kimi Code", kimi_aliases, "kimi",
     "curl -LsSf https://code.kimi.com/install.sh | bash", AGENT_API_OPENAI_CHAT,
     AGENT_DOC_DOCUMENTED, "KIMI_MODEL_* variables (type openai)", NULL, build_kimi},
    {"omp", "OMP", omp_aliases, "omp", "bun install -g @oh-my-pi/pi-coding-agent",
     AGENT_API_OPENAI_CHAT, AGENT_DOC_PARTIAL,
     "private PI_CODING_AGENT_DIR, models.yml provider toki", "modelRoles.smol", build_omp},
};

const struct agent_def *agents_all(size_t *n)
{
	*n = sizeof agents / sizeof agents[0];
	return agents;
}

const struct agent_def *agents_find(const char *name)
{
	for (size_t i = 0; i < sizeof agents / sizeof agents[0]; i++) {
		if (!strcasecmp(agents[i].name, name))
			return &agents[i];
		for (const char *const *al = agents[i].aliases; al && *al; al++)
			if (!strcasecmp(*al, name))
				return &agents[i];
	}
	return NULL;
}

void agents_small_names(char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof agents / sizeof agents[0] && len < n; i++)
		if (agents[i].small_setting)
			len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "",
			                        agents[i].name);
}

void agents_target_knobs(struct agent_target *t)
{
	t->claude_bare = getenv("TOKI_CLAUDE_BARE");
	t->claude_mcp = getenv("TOKI_CLAUDE_MCP");
	t->claude_effort = getenv("TOKI_CLAUDE_EFFORT");
	t->claude_timeout_ms = getenv("TOKI_CLAUDE_TIMEOUT_MS");
	t->agent_timeout_ms = getenv("TOKI_AGENT_TIMEOUT_MS");
}

/* --- building and launching ------------------------------------------------ */

void agent_plan_free(struct agent_plan *p)
{
	free(p->dir);
	free(p->exe);
	strv_free(p->args, p->n_args);
	strv_free(p->env_set, p->n_env_set);
	strv_free(p->env_unset, p->n_env_unset);
	strv_free(p->files, p->n_files);
	strv_free(p->warnings, p->n_warnings);
	memset(p, 0, sizeof *p);
}

/* env.sh: the plan's environment as shell commands, so that the agent can be
 * started by hand the same way (`. env.sh && <agent> <args>`). */
static int write_env_sh(struct agent_plan *p, char *err, size_t errlen)
{
	char *text = strdup("# Written by toki launch: source this, then start the agent.\n");
	int ok = text != NULL;
	for (size_t i = 0; ok && i < p->n_env_unset; i++) {
		char *next = xasprintf("%sunset %s\n", text, p->env_unset[i]);
		free(text);
		ok = (text = next) != NULL;
	}
	for (size_t i = 0; ok && i < p->n_env_set; i++) {
		const char *eq = strchr(p->env_set[i], '=');
		char *q = agents_shell_quote(eq + 1);
		char *next = q ? xasprintf("%sexport %.*s=%s\n", text, (int)(eq - p->env_set[i]),
		                           p->env_set[i], q)
		               : NULL;
		free(q);
		free(text);
		ok = (text = next) != NULL;
	}
	int r = ok ? write_file(p, p->dir, "env.sh", text, err, errlen) : oom(err, errlen);
	free(text);
	return r;
}

int agents_build(const struct agent_def *a, const struct agent_target *t, char *const *user_args,
                 size_t n_user, struct agent_plan *p, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	p->exe = strdup(a->binary);
	if (!p->exe)
		return oom(err, errlen);
	if (!t->endpoint || !t->model_id || !t->token || !t->state_dir) {
		snprintf(err, errlen, "no endpoint, model, token or state directory to pin %s to",
		         a->display);
		agent_plan_free(p);
		return -1;
	}
	if (t->small_model_id && !a->small_setting) {
		char names[256];
		agents_small_names(names, sizeof names);
		snprintf(err, errlen,
		         "%s has no setting for a second model, so --small cannot pin one; "
		         "agents that take --small: %s",
		         a->display, names);
		agent_plan_free(p);
		return -1;
	}
	if (a->api != AGENT_API_TOKI) {
		p->dir = xasprintf("%s/agents/%s", t->state_dir, a->name);
		if (!p->dir) {
			agent_plan_free(p);
			return oom(err, errlen);
		}
		if (paths_mkdir_p(p->dir, 0700) != 0 || chmod(p->dir, 0700) != 0) {
			snprintf(err, errlen, "cannot create %s: %s", p->dir, strerror(errno));
			agent_plan_free(p);
			return -1;
		}
	}
	if (a->doc == AGENT_DOC_PARTIAL) {
		char msg[256];
		snprintf(msg, sizeof msg,
		         "part of how toki pins %s is not in its vendor's documentation "
		         "(docs/agents.md says which part)",
		         a->display);
		if (warn(p, msg) != 0) {
			agent_plan_free(p);
			return oom(err, errlen);
		}
	}
	if (a->doc == AGENT_DOC_UNKNOWN) {
		char msg[256];
		snprintf(msg, sizeof msg,
		         "%s documents no way to use a custom endpoint that toki could find; "
		         "trying the OpenAI variables (OPENAI_BASE_URL, OPENAI_API_KEY, "
		         "OPENAI_MODEL)",
		         a->display);
		if (warn(p, msg) != 0) {
			agent_plan_free(p);
			return oom(err, errlen);
		}
	}
	struct agent_pin c = {a, t, user_args, n_user, p, NULL, NULL, err, errlen};
	char *v1 = xasprintf("%s/v1", t->endpoint);
	char *anth = xasprintf("%s/anthropic", t->endpoint);
	c.v1 = v1;
	c.anth = anth;
	int r = v1 && anth ? a->build(&c) : oom(err, errlen);
	free(v1);
	free(anth);
	if (r != 0 || (p->dir && write_env_sh(p, err, errlen) != 0)) {
		agent_plan_free(p);
		return -1;
	}
	return 0;
}

char **agents_argv(const struct agent_plan *p, char *const *user_args, size_t n_user)
{
	char **v = calloc(p->n_args + n_user + 2, sizeof *v);
	if (!v)
		return NULL;
	size_t k = 0;
	v[k++] = p->exe;
	for (size_t i = 0; i < p->n_args; i++)
		v[k++] = p->args[i];
	for (size_t i = 0; i < n_user; i++)
		v[k++] = user_args[i];
	v[k] = NULL;
	return v;
}

static int name_is(const char *entry, const char *name, size_t len)
{
	return !strncmp(entry, name, len) && entry[len] == '=';
}

char **agents_envp(const struct agent_plan *p, char *const *environ_in)
{
	size_t n = 0;
	while (environ_in && environ_in[n])
		n++;
	char **v = calloc(n + p->n_env_set + 1, sizeof *v);
	if (!v)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const char *e = environ_in[i];
		int drop = 0;
		for (size_t j = 0; !drop && j < p->n_env_unset; j++)
			drop = name_is(e, p->env_unset[j], strlen(p->env_unset[j]));
		for (size_t j = 0; !drop && j < p->n_env_set; j++)
			drop = name_is(e, p->env_set[j],
			               (size_t)(strchr(p->env_set[j], '=') - p->env_set[j]));
		if (!drop)
			v[k++] = (char *)e;
	}
	for (size_t j = 0; j < p->n_env_set; j++)
		v[k++] = p->env_set[j];
	v[k] = NULL;
	return v;
}

char *agents_which(const char *binary)
{
	if (!binary || !*binary)
		return NULL;
	struct stat st;
	if (strchr(binary, '/'))
		return stat(binary, &st) == 0 && S_ISREG(st.st_mode) && access(binary, X_OK) == 0
		           ? strdup(binary)
		           : NULL;
	const char *path = getenv("PATH");
	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (const char *s = path;;) {
		const char *e = strchr(s, ':');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		char *cand =
		    len ? xasprintf("%.*s/%s", (int)len, s, binary) : xasprintf("./%s", binary);
		if (cand && stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
			return cand;
		free(cand);
		if (!e)
			return NULL;
		s = e + 1;
	}
}

/* Runs tool (with one argument, or none), output discarded, killed after
 * timeout_ms: its exit status, or -1 when it cannot run or is killed. */
static int run_quiet(const char *tool, const char *arg1, int timeout_ms)
{
	char *path = agents_which(tool);
	if (!path)
		return -1;
	char *const argv[] = {path, (char *)arg1, NULL};
	struct plat_cmd c = {.argv = argv, .timeout_ms = timeout_ms};
	int st = plat_run(&c, NULL, 0, NULL, NULL);
	free(path);
	return st;
}

int agents_detect_cpu_profile(void)
{
	const char *forced = getenv("TOKI_PROFILE");
	if (forced && !strcmp(forced, "cpu"))
		return 1;
	if (forced && !strcmp(forced, "gpu"))
		return 0;
	if (run_quiet("nvidia-smi", "-L", 5000) == 0)
		return 0;
	/* Apple silicon: llama.cpp's Metal build runs every layer on the GPU. */
	if (plat_is_apple_silicon())
		return 0;
	if (run_quiet("rocminfo", NULL, 5000) == 0)
		return 0;
	return 1;
}

/* --- which run, which model --------------------------------------------- */

int agents_resolve_run(const char *want, char *endpoint, size_t n, char *name, size_t namelen,
                       char *err, size_t errlen)
{
	struct run_info ri;
	/* The endpoint (toki up without --model) serves every registry model:
	 * agents go through it, pinned to the model asked for or the active
	 * one, so that a swap does not leave them at a stopped model's port. */
	if (run_get("endpoint", &ri) == 0 && (!want || strcmp(want, "endpoint"))) {
		struct registry reg;
		char rerr[512];
		int found = 0;
		if (registry_load(&reg, rerr, sizeof rerr) == 0) {
			const char *pick = want         ? want
			                   : reg.active ? reg.active
			                   : reg.n      ? reg.models[0].name
			                                : NULL;
			found = pick && registry_find(&reg, pick);
			if (found) {
				run_info_url(&ri, endpoint, n);
				snprintf(name, namelen, "%s", pick);
			}
			registry_free(&reg);
		}
		if (found)
			return 0;
	}
	if (want) {
		if (!paths_is_safe_name(want) || run_get(want, &ri) != 0) {
			snprintf(err, errlen,
			         "no run named '%s' is running (toki status lists the runs; toki "
			         "model use %s starts it)",
			         want, paths_is_safe_name(want) ? want : "NAME");
			return -1;
		}
		run_info_url(&ri, endpoint, n);
		snprintf(name, namelen, "%s", ri.name[0] ? ri.name : want);
		return 0;
	}
	struct registry reg;
	char rerr[512];
	if (registry_load(&reg, rerr, sizeof rerr) == 0) {
		int found = reg.active && run_get(reg.active, &ri) == 0;
		if (found) {
			run_info_url(&ri, endpoint, n);
			snprintf(name, namelen, "%s", ri.name[0] ? ri.name : reg.active);
		}
		registry_free(&reg);
		if (found)
			return 0;
	}
	struct run_info *runs = NULL;
	int nr = 0;
	run_list(&runs, &nr);
	if (nr == 1) {
		run_info_url(&runs[0], endpoint, n);
		snprintf(name, namelen, "%s", runs[0].name);
		free(runs);
		return 0;
	}
	if (nr == 0) {
		snprintf(err, errlen,
		         "no model is running; start one with toki model use NAME or toki up "
		         "--model FILE");
	} else {
		size_t len = (size_t)snprintf(err, errlen,
		                              "%d runs and no active one among them; choose with "
		                              "--model:",
		                              nr);
		for (int i = 0; i < nr && len < errlen; i++)
			len += (size_t)snprintf(err + len, errlen - len, " %s", runs[i].name);
	}
	free(runs);
	return -1;
}

/* GET <endpoint>/v1/models: the parsed document (owned by the caller), or
 * NULL with err. */
static json_t *models_doc(const char *endpoint, char *err, size_t errlen)
{
	/* endpoint is what agents_resolve_run made: http://host:port. */
	char host[300];
	int port = 0;
	const char *h = endpoint + strlen("http://");
	const char *colon = strrchr(h, ':');
	if (strncmp(endpoint, "http://", 7) || !colon || (size_t)(colon - h) >= sizeof host) {
		snprintf(err, errlen, "cannot read the endpoint %s", endpoint);
		return NULL;
	}
	snprintf(host, sizeof host, "%.*s", (int)(colon - h), h);
	port = atoi(colon + 1);
	if (host[0] == '[') { /* run_http_get takes the bare address */
		memmove(host, host + 1, strlen(host));
		host[strcspn(host, "]")] = '\0';
	}
	long status = 0;
	char *body = run_http_get(host, port, "/v1/models", &status, 10);
	if (!body) {
		snprintf(err, errlen,
		         "toki at %s does not answer (is the run still up? toki status)", endpoint);
		return NULL;
	}
	json_error_t jerr;
	json_t *doc = status == 200 ? json_loads(body, 0, &jerr) : NULL;
	if (!json_is_array(json_object_get(doc, "data"))) {
		snprintf(err, errlen, "%s/v1/models answered %ld without a model list: %.200s",
		         endpoint, status, body);
		json_decref(doc);
		doc = NULL;
	}
	free(body);
	return doc;
}

int agents_fetch_model(const char *endpoint, const char *want_id, char **model_id,
                       long *context_length, long *max_output, char *err, size_t errlen)
{
	*model_id = NULL;
	*context_length = *max_output = 0;
	json_t *doc = models_doc(endpoint, err, errlen);
	if (!doc)
		return -1;
	/* The endpoint lists every registry model: the one asked for. */
	json_t *m0 = json_array_get(json_object_get(doc, "data"), 0);
	size_t k;
	json_t *e;
	json_array_foreach(json_object_get(doc, "data"), k, e)
	{
		const char *eid = json_string_value(json_object_get(e, "id"));
		if (want_id && eid && !strcmp(eid, want_id))
			m0 = e;
	}
	const char *id = json_string_value(json_object_get(m0, "id"));
	if (!id || !*id) {
		snprintf(err, errlen, "%s/v1/models lists no model id", endpoint);
		json_decref(doc);
		return -1;
	}
	*model_id = strdup(id);
	*context_length = (long)json_integer_value(json_object_get(m0, "context_length"));
	*max_output = (long)json_integer_value(json_object_get(m0, "max_output"));
	json_decref(doc);
	return *model_id ? 0 : oom(err, errlen);
}

/* Whether entry (of the endpoint's /v1/models) is name: its id or one of
 * its aliases. */
static int entry_is(json_t *entry, const char *name)
{
	const char *id = json_string_value(json_object_get(entry, "id"));
	if (id && !strcmp(id, name))
		return 1;
	size_t k;
	json_t *al;
	json_array_foreach(json_object_get(entry, "aliases"), k, al)
	{
		const char *a = json_string_value(al);
		if (a && !strcmp(a, name))
			return 1;
	}
	return 0;
}

int agents_fetch_small(const char *endpoint, const char *small, char **model_id,
                       long *context_length, long *max_output, char *err, size_t errlen)
{
	*model_id = NULL;
	*context_length = *max_output = 0;
	/* A run started with --model serves that one model; only the endpoint
	 * (toki up without --model) routes a request to another by "model". */
	struct run_info ri;
	char url[512] = "";
	if (run_get("endpoint", &ri) == 0)
		run_info_url(&ri, url, sizeof url);
	if (!url[0] || strcmp(url, endpoint)) {
		snprintf(err, errlen,
		         "--small needs the endpoint that serves every registry model, and %s "
		         "serves one model; start it with toki up (without --model), then "
		         "toki launch AGENT --small MODEL",
		         endpoint);
		return -1;
	}
	json_t *doc = models_doc(endpoint, err, errlen);
	if (!doc)
		return -1;
	json_t *data = json_object_get(doc, "data"), *found = NULL, *e;
	size_t k;
	json_array_foreach(data, k, e)
	{
		if (!found && entry_is(e, small))
			found = e;
	}
	const char *id = json_string_value(json_object_get(found, "id"));
	if (!id) {
		size_t len = (size_t)snprintf(
		    err, errlen, "no registry model '%s' for --small; the registry has:", small);
		json_array_foreach(data, k, e)
		{
			const char *eid = json_string_value(json_object_get(e, "id"));
			if (eid && len < errlen)
				len += (size_t)snprintf(err + len, errlen - len, "%s %s",
				                        k ? "," : "", eid);
		}
		json_decref(doc);
		return -1;
	}
	*model_id = strdup(id);
	*context_length = (long)json_integer_value(json_object_get(found, "context_length"));
	*max_output = (long)json_integer_value(json_object_get(found, "max_output"));
	json_decref(doc);
	return *model_id ? 0 : oom(err, errlen);
}
