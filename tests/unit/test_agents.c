/* toki launch's agent table: for every agent, the configuration is generated
 * into a temporary state directory and checked against that agent's format
 * (JSON parsed with jansson, TOML and YAML checked line by line for the exact
 * keys), the modes are owner-only, and nothing outside the state directory is
 * written (HOME is a temporary directory that must stay empty). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch/agents.h"

#define EP "http://127.0.0.1:8787"
#define MODEL "qwen3-4b \"q4\""
#define TOKEN "tok-0123456789abcdef"

static char state[256], home[256];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path);
}

static int setup(void **ctx)
{
	(void)ctx;
	snprintf(state, sizeof state, "/tmp/toki-agents-state-XXXXXX");
	snprintf(home, sizeof home, "/tmp/toki-agents-home-XXXXXX");
	if (!mkdtemp(state) || !mkdtemp(home))
		return -1;
	setenv("HOME", home, 1);
	setenv("XDG_CONFIG_HOME", home, 1);
	unsetenv("TOKI_CLAUDE_BARE");
	unsetenv("TOKI_CLAUDE_MCP");
	unsetenv("TOKI_CLAUDE_EFFORT");
	unsetenv("TOKI_CLAUDE_TIMEOUT_MS");
	unsetenv("TOKI_AGENT_TIMEOUT_MS");
	return 0;
}

static int teardown(void **ctx)
{
	(void)ctx;
	nftw(state, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	nftw(home, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

static struct agent_target target(void)
{
	struct agent_target t = {0};
	t.endpoint = EP;
	t.model_id = MODEL;
	t.token = TOKEN;
	t.state_dir = state;
	t.context_length = 32768;
	t.max_output = 4096;
	t.cpu_profile = 0;
	t.toki_exe = "/usr/local/bin/toki";
	return t;
}

static void build(const char *name, const struct agent_target *t, char *const *user, size_t n_user,
                  struct agent_plan *p)
{
	const struct agent_def *a = agents_find(name);
	assert_non_null(a);
	char err[512] = "";
	int r = agents_build(a, t, user, n_user, p, err, sizeof err);
	if (r != 0)
		fail_msg("building %s: %s", name, err);
}

/* The value of NAME in the plan's environment, or NULL. */
static const char *env_of(const struct agent_plan *p, const char *name)
{
	size_t l = strlen(name);
	for (size_t i = 0; i < p->n_env_set; i++)
		if (!strncmp(p->env_set[i], name, l) && p->env_set[i][l] == '=')
			return p->env_set[i] + l + 1;
	return NULL;
}

/* The file of the plan whose path ends in suffix. */
static const char *file_of(const struct agent_plan *p, const char *suffix)
{
	size_t sl = strlen(suffix);
	for (size_t i = 0; i < p->n_files; i++) {
		size_t l = strlen(p->files[i]);
		if (l >= sl && !strcmp(p->files[i] + l - sl, suffix))
			return p->files[i];
	}
	fail_msg("no file ending in %s", suffix);
	return NULL;
}

/* The index of an argument, or -1. */
static int arg_at(const struct agent_plan *p, const char *a)
{
	for (size_t i = 0; i < p->n_args; i++)
		if (!strcmp(p->args[i], a))
			return (int)i;
	return -1;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char buf[65536];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static int has_line(const char *path, const char *line)
{
	char *text = slurp(path);
	for (char *s = strtok(text, "\n"); s; s = strtok(NULL, "\n"))
		if (!strcmp(s, line))
			return 1;
	return 0;
}

static json_t *load_json(const char *path)
{
	json_error_t e;
	json_t *j = json_load_file(path, 0, &e);
	if (!j)
		fail_msg("%s does not parse: %s (line %d)", path, e.text, e.line);
	return j;
}

static const char *jstr(json_t *root, const char *path)
{
	/* A dotted path; a segment in [...] is a key with dots in it. */
	char buf[512];
	snprintf(buf, sizeof buf, "%s", path);
	json_t *cur = root;
	for (char *s = buf; s && *s;) {
		char *key = s, *next;
		if (*s == '[') {
			key = s + 1;
			char *end = strchr(key, ']');
			*end = '\0';
			next = end[1] == '.' ? end + 2 : NULL;
		} else {
			next = strchr(s, '.');
			if (next)
				*next++ = '\0';
		}
		cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(key))
		                         : json_object_get(cur, key);
		s = next;
	}
	return json_string_value(cur);
}

/* Every file 0600, every directory 0700, all under the state dir; HOME
 * untouched. */
static void check_private(const struct agent_plan *p)
{
	struct stat st;
	if (p->dir) {
		assert_int_equal(stat(p->dir, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0700);
		assert_int_equal(strncmp(p->dir, state, strlen(state)), 0);
	}
	for (size_t i = 0; i < p->n_files; i++) {
		assert_int_equal(strncmp(p->files[i], state, strlen(state)), 0);
		assert_int_equal(lstat(p->files[i], &st), 0);
		assert_true(S_ISREG(st.st_mode));
		assert_int_equal(st.st_mode & 07777, 0600);
		/* Its directory, and each one up to the agent's, is 0700. */
		char d[1024];
		snprintf(d, sizeof d, "%s", p->files[i]);
		for (char *slash = strrchr(d, '/'); slash && p->dir && strlen(d) > strlen(p->dir);
		     slash = strrchr(d, '/')) {
			*slash = '\0';
			assert_int_equal(stat(d, &st), 0);
			assert_int_equal(st.st_mode & 07777, 0700);
		}
	}
	DIR *h = opendir(home);
	assert_non_null(h);
	struct dirent *e;
	while ((e = readdir(h)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			fail_msg("HOME was written to: %s", e->d_name);
	closedir(h);
}

static void test_every_agent_is_private(void **ctx)
{
	(void)ctx;
	size_t n;
	const struct agent_def *all = agents_all(&n);
	assert_true(n >= 17);
	for (size_t i = 0; i < n; i++) {
		struct agent_target t = target();
		struct agent_plan p;
		build(all[i].name, &t, NULL, 0, &p);
		check_private(&p);
		assert_non_null(p.exe);
		if (all[i].api != AGENT_API_TOKI) {
			/* env.sh: the same environment, for a launch by hand. */
			const char *sh = file_of(&p, "/env.sh");
			for (size_t k = 0; k < p.n_env_set; k++) {
				char line[2048], name[256];
				const char *eq = strchr(p.env_set[k], '=');
				snprintf(name, sizeof name, "%.*s", (int)(eq - p.env_set[k]),
				         p.env_set[k]);
				char *q = agents_shell_quote(eq + 1);
				snprintf(line, sizeof line, "export %s=%s", name, q);
				free(q);
				assert_true(has_line(sh, line));
			}
		}
		/* The install hint, the mechanism and the binary are set. */
		assert_true(all[i].install && *all[i].install);
		assert_true(all[i].mechanism && *all[i].mechanism);
		assert_true(all[i].binary && *all[i].binary);
		agent_plan_free(&p);
	}
}

static void test_names_and_aliases(void **ctx)
{
	(void)ctx;
	static const char *const pairs[][2] = {
	    {"claude-code", "claude"}, {"Claude", "claude"},       {"qwen-code", "qwen"},
	    {"kilo-code", "kilo"},     {"factory-droid", "droid"}, {"deepseek-harness", "dsh"},
	    {"grok-build", "grok"},    {"copilot-cli", "copilot"}, {"kimi-code", "kimi"},
	    {"oh-my-pi", "omp"},       {"mimo-code", "mimo"},      {"hermes-agent", "hermes"},
	    {"cline-cli", "cline"},    {"toki-chat", "toki"},      {"open-code", "opencode"},
	};
	for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
		const struct agent_def *a = agents_find(pairs[i][0]);
		assert_non_null(a);
		assert_string_equal(a->name, pairs[i][1]);
	}
	assert_null(agents_find("emacs"));
	/* No name or alias is used twice. */
	size_t n;
	const struct agent_def *all = agents_all(&n);
	for (size_t i = 0; i < n; i++)
		assert_ptr_equal(agents_find(all[i].name), &all[i]);
	/* Install hints that work: OpenClaw's Node requirement, Kilo pinned to
	 * the release that installs. */
	assert_non_null(strstr(agents_find("openclaw")->install, "Node >=24.16 <25 or >=26.1"));
	assert_string_equal(agents_find("kilo")->install, "npm install -g @kilocode/cli@7.7.7");
}

static void test_claude(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("claude", &t, NULL, 0, &p);
	const char *settings = file_of(&p, "/settings.json");
	int i = arg_at(&p, "--settings");
	assert_true(i >= 0);
	assert_string_equal(p.args[i + 1], settings);
	i = arg_at(&p, "--model");
	assert_true(i >= 0);
	assert_string_equal(p.args[i + 1], MODEL);
	assert_int_equal(arg_at(&p, "--bare"), -1);
	assert_int_equal(arg_at(&p, "--mcp-config"), -1);
	json_t *s = load_json(settings);
	assert_string_equal(jstr(s, "env.ANTHROPIC_BASE_URL"), EP "/anthropic");
	assert_string_equal(jstr(s, "env.ANTHROPIC_AUTH_TOKEN"), TOKEN);
	assert_null(json_object_get(json_object_get(s, "env"), "ANTHROPIC_API_KEY"));
	assert_string_equal(jstr(s, "env.ANTHROPIC_MODEL"), MODEL);
	assert_string_equal(jstr(s, "env.ANTHROPIC_SMALL_FAST_MODEL"), MODEL);
	assert_string_equal(jstr(s, "env.ANTHROPIC_DEFAULT_HAIKU_MODEL"), MODEL);
	assert_string_equal(jstr(s, "env.ANTHROPIC_DEFAULT_SONNET_MODEL"), MODEL);
	assert_string_equal(jstr(s, "env.ANTHROPIC_DEFAULT_OPUS_MODEL"), MODEL);
	assert_string_equal(jstr(s, "env.CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"), "1");
	assert_string_equal(jstr(s, "env.CLAUDE_CODE_MAX_CONTEXT_TOKENS"), "32768");
	/* The daemon caps output; Claude Code must not (it errors at its cap). */
	assert_null(jstr(s, "env.CLAUDE_CODE_MAX_OUTPUT_TOKENS"));
	assert_string_equal(jstr(s, "model"), MODEL);
	/* A GPU machine keeps Claude Code's own timeouts. */
	assert_null(jstr(s, "env.API_TIMEOUT_MS"));
	assert_null(jstr(s, "env.CLAUDE_STREAM_IDLE_TIMEOUT_MS"));
	assert_null(jstr(s, "env.CLAUDE_CODE_EFFORT_LEVEL"));
	json_decref(s);

	/* The child's environment: no ANTHROPIC_API_KEY, the rest inherited. */
	assert_int_equal(p.n_env_unset, 1);
	assert_string_equal(p.env_unset[0], "ANTHROPIC_API_KEY");
	char *environ_in[] = {"ANTHROPIC_API_KEY=sk-real", "PATH=/bin", "ANTHROPIC_API_KEYX=1",
	                      NULL};
	char **ev = agents_envp(&p, environ_in);
	assert_non_null(ev);
	int saw_path = 0, saw_x = 0;
	for (char **e = ev; *e; e++) {
		assert_int_not_equal(strncmp(*e, "ANTHROPIC_API_KEY=", 18), 0);
		saw_path |= !strcmp(*e, "PATH=/bin");
		saw_x |= !strcmp(*e, "ANTHROPIC_API_KEYX=1");
	}
	assert_true(saw_path && saw_x);
	free(ev);
	char *user[] = {"-p", "say hi"};
	char **av = agents_argv(&p, user, 2);
	assert_string_equal(av[0], "claude");
	assert_string_equal(av[p.n_args + 1], "-p");
	assert_string_equal(av[p.n_args + 2], "say hi");
	assert_null(av[p.n_args + 3]);
	free(av);
	agent_plan_free(&p);
}

static void test_claude_cpu_timeouts(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	t.cpu_profile = 1;
	struct agent_plan p;
	build("claude", &t, NULL, 0, &p);
	json_t *s = load_json(file_of(&p, "/settings.json"));
	assert_string_equal(jstr(s, "env.API_TIMEOUT_MS"), "1800000");
	assert_string_equal(jstr(s, "env.CLAUDE_STREAM_IDLE_TIMEOUT_MS"), "1800000");
	json_decref(s);
	agent_plan_free(&p);

	/* TOKI_CLAUDE_TIMEOUT_MS wins, on a GPU machine too. */
	for (int cpu = 0; cpu < 2; cpu++) {
		setenv("TOKI_CLAUDE_TIMEOUT_MS", "123456", 1);
		t = target();
		t.cpu_profile = cpu;
		agents_target_knobs(&t);
		build("claude", &t, NULL, 0, &p);
		s = load_json(file_of(&p, "/settings.json"));
		assert_string_equal(jstr(s, "env.API_TIMEOUT_MS"), "123456");
		assert_string_equal(jstr(s, "env.CLAUDE_STREAM_IDLE_TIMEOUT_MS"), "123456");
		json_decref(s);
		agent_plan_free(&p);
	}
	/* Not a number: refused, with the variable's name. */
	setenv("TOKI_CLAUDE_TIMEOUT_MS", "30m", 1);
	t = target();
	agents_target_knobs(&t);
	char err[256];
	assert_int_equal(agents_build(agents_find("claude"), &t, NULL, 0, &p, err, sizeof err), -1);
	assert_non_null(strstr(err, "TOKI_CLAUDE_TIMEOUT_MS"));
	unsetenv("TOKI_CLAUDE_TIMEOUT_MS");
}

/* The request timeout each agent was given in its files: ms, or 0 when it
 * keeps its own default. */
static long agent_timeout(const char *name, const struct agent_target *t)
{
	struct agent_plan p;
	build(name, t, NULL, 0, &p);
	long ms = 0;
	if (!strcmp(name, "openclaw")) {
		json_t *j = load_json(file_of(&p, "/openclaw.json"));
		json_t *v = json_object_get(
		    json_object_get(json_object_get(json_object_get(j, "models"), "providers"),
		                    "toki"),
		    "timeoutSeconds");
		ms = v ? (long)json_integer_value(v) * 1000 : 0;
		json_decref(j);
	} else if (!strcmp(name, "codex")) {
		const char *cfg = file_of(&p, "/home/config.toml");
		for (const char *line = strstr(slurp(cfg), "stream_idle_timeout_ms = "); line;
		     line = NULL)
			ms = atol(line + strlen("stream_idle_timeout_ms = "));
	} else {
		const char *file = !strcmp(name, "opencode") ? "/opencode.json"
		                   : !strcmp(name, "kilo")   ? "/kilo.json"
		                                             : "/mimocode.json";
		json_t *j = load_json(file_of(&p, file));
		json_t *opts = json_object_get(
		    json_object_get(json_object_get(j, "provider"), "toki"), "options");
		json_t *h = json_object_get(opts, "headerTimeout");
		json_t *c = json_object_get(opts, "chunkTimeout");
		assert_true((h == NULL) == (c == NULL));
		ms = h ? (long)json_integer_value(h) : 0;
		if (h)
			assert_int_equal(json_integer_value(c), ms);
		json_decref(j);
	}
	agent_plan_free(&p);
	return ms;
}

/* Every agent with a request timeout gets 30 min on the CPU profile (OpenClaw
 * aborted every request at its 300 s and retried it from scratch) and
 * TOKI_AGENT_TIMEOUT_MS on any machine; on a GPU they keep their own. */
static void test_cpu_timeouts_every_agent(void **ctx)
{
	(void)ctx;
	static const char *const names[] = {"openclaw", "codex", "opencode", "kilo", "mimo"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		struct agent_target t = target();
		assert_int_equal(agent_timeout(names[i], &t), 0);
		t.cpu_profile = 1;
		assert_int_equal(agent_timeout(names[i], &t), 1800000);
		setenv("TOKI_AGENT_TIMEOUT_MS", "120000", 1);
		t = target();
		agents_target_knobs(&t);
		assert_int_equal(agent_timeout(names[i], &t), 120000);
		setenv("TOKI_AGENT_TIMEOUT_MS", "2h", 1);
		agents_target_knobs(&t);
		struct agent_plan p;
		char err[256];
		assert_int_equal(
		    agents_build(agents_find(names[i]), &t, NULL, 0, &p, err, sizeof err), -1);
		assert_non_null(strstr(err, "TOKI_AGENT_TIMEOUT_MS"));
		unsetenv("TOKI_AGENT_TIMEOUT_MS");
	}
	/* Claude Code: TOKI_CLAUDE_TIMEOUT_MS, else TOKI_AGENT_TIMEOUT_MS. */
	setenv("TOKI_AGENT_TIMEOUT_MS", "120000", 1);
	struct agent_target t = target();
	agents_target_knobs(&t);
	struct agent_plan p;
	build("claude", &t, NULL, 0, &p);
	json_t *s = load_json(file_of(&p, "/settings.json"));
	assert_string_equal(jstr(s, "env.API_TIMEOUT_MS"), "120000");
	json_decref(s);
	agent_plan_free(&p);
	unsetenv("TOKI_AGENT_TIMEOUT_MS");
}

static void test_claude_knobs(void **ctx)
{
	(void)ctx;
	setenv("TOKI_CLAUDE_BARE", "1", 1);
	setenv("TOKI_CLAUDE_MCP", "none", 1);
	setenv("TOKI_CLAUDE_EFFORT", "low", 1);
	struct agent_target t = target();
	agents_target_knobs(&t);
	struct agent_plan p;
	build("claude", &t, NULL, 0, &p);
	assert_true(arg_at(&p, "--bare") >= 0);
	int i = arg_at(&p, "--mcp-config");
	assert_true(i >= 0);
	assert_true(arg_at(&p, "--strict-mcp-config") > i);
	json_t *m = load_json(p.args[i + 1]);
	assert_true(json_is_object(json_object_get(m, "mcpServers")));
	assert_int_equal(json_object_size(json_object_get(m, "mcpServers")), 0);
	assert_int_equal(json_object_size(m), 1);
	json_decref(m);
	json_t *s = load_json(file_of(&p, "/settings.json"));
	assert_string_equal(jstr(s, "env.CLAUDE_CODE_EFFORT_LEVEL"), "low");
	assert_string_equal(jstr(s, "effortLevel"), "low");
	assert_string_equal(jstr(s, "env.MAX_THINKING_TOKENS"), "1024");
	json_decref(s);
	check_private(&p);
	agent_plan_free(&p);

	/* A higher effort sets the level but leaves the thinking budget alone;
	 * TOKI_CLAUDE_BARE=0 is off. */
	setenv("TOKI_CLAUDE_EFFORT", "high", 1);
	setenv("TOKI_CLAUDE_BARE", "0", 1);
	unsetenv("TOKI_CLAUDE_MCP");
	t = target();
	agents_target_knobs(&t);
	build("claude", &t, NULL, 0, &p);
	assert_int_equal(arg_at(&p, "--bare"), -1);
	s = load_json(file_of(&p, "/settings.json"));
	assert_string_equal(jstr(s, "env.CLAUDE_CODE_EFFORT_LEVEL"), "high");
	assert_null(jstr(s, "env.MAX_THINKING_TOKENS"));
	json_decref(s);
	agent_plan_free(&p);

	char err[256];
	setenv("TOKI_CLAUDE_EFFORT", "extreme", 1);
	t = target();
	agents_target_knobs(&t);
	assert_int_equal(agents_build(agents_find("claude"), &t, NULL, 0, &p, err, sizeof err), -1);
	assert_non_null(strstr(err, "TOKI_CLAUDE_EFFORT"));
	unsetenv("TOKI_CLAUDE_EFFORT");
	setenv("TOKI_CLAUDE_MCP", "all", 1);
	t = target();
	agents_target_knobs(&t);
	assert_int_equal(agents_build(agents_find("claude"), &t, NULL, 0, &p, err, sizeof err), -1);
	assert_non_null(strstr(err, "TOKI_CLAUDE_MCP"));
	unsetenv("TOKI_CLAUDE_MCP");
	unsetenv("TOKI_CLAUDE_BARE");

	/* A --model of the user's own is not doubled. */
	t = target();
	char *user[] = {"--model", "other"};
	build("claude", &t, user, 2, &p);
	assert_int_equal(arg_at(&p, "--model"), -1);
	agent_plan_free(&p);
}

static void test_codex(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("codex", &t, NULL, 0, &p);
	const char *cfg = file_of(&p, "/home/config.toml");
	char want_home[600];
	snprintf(want_home, sizeof want_home, "%s/agents/codex/home", state);
	assert_string_equal(env_of(&p, "CODEX_HOME"), want_home);
	assert_string_equal(env_of(&p, "TOKI_API_KEY"), TOKEN);
	assert_true(has_line(cfg, "model = \"qwen3-4b \\\"q4\\\"\""));
	assert_true(has_line(cfg, "model_provider = \"toki\""));
	assert_true(has_line(cfg, "model_context_window = 32768"));
	assert_true(has_line(cfg, "model_max_output_tokens = 4096"));
	assert_true(has_line(cfg, "[model_providers.toki]"));
	assert_true(has_line(cfg, "base_url = \"" EP "/v1\""));
	assert_true(has_line(cfg, "env_key = \"TOKI_API_KEY\""));
	assert_true(has_line(cfg, "wire_api = \"responses\""));
	assert_null(strstr(slurp(cfg), TOKEN));
	/* Nothing of the user's was copied: the home holds config.toml alone. */
	DIR *d = opendir(want_home);
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	assert_int_equal(n, 1);
	agent_plan_free(&p);
}

static void check_opencode_family(const char *agent, const char *file, const char *env,
                                  const char *key)
{
	struct agent_target t = target();
	struct agent_plan p;
	build(agent, &t, NULL, 0, &p);
	const char *cfg = file_of(&p, file);
	assert_string_equal(env_of(&p, env), cfg);
	json_t *j = load_json(cfg);
	assert_string_equal(jstr(j, "provider.toki.npm"), "@ai-sdk/openai-compatible");
	assert_string_equal(jstr(j, "provider.toki.options.baseURL"), EP "/v1");
	assert_string_equal(jstr(j, "provider.toki.options.apiKey"), key);
	assert_string_equal(jstr(j, "provider.toki.models.[" MODEL "].name"), MODEL);
	json_t *lim = json_object_get(
	    json_object_get(
	        json_object_get(json_object_get(json_object_get(j, "provider"), "toki"), "models"),
	        MODEL),
	    "limit");
	assert_int_equal(json_integer_value(json_object_get(lim, "context")), 32768);
	assert_int_equal(json_integer_value(json_object_get(lim, "output")), 4096);
	assert_string_equal(jstr(j, "model"), "toki/" MODEL);
	assert_string_equal(jstr(j, "small_model"), "toki/" MODEL);
	json_decref(j);
	agent_plan_free(&p);
}

static void test_opencode_family(void **ctx)
{
	(void)ctx;
	check_opencode_family("opencode", "/opencode.json", "OPENCODE_CONFIG",
	                      "{env:TOKI_API_KEY}");
	check_opencode_family("kilo", "/kilo.json", "KILO_CONFIG", TOKEN);
	check_opencode_family("mimo", "/mimocode.json", "MIMOCODE_CONFIG", TOKEN);
	struct agent_target t = target();
	struct agent_plan p;
	build("opencode", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "TOKI_API_KEY"), TOKEN);
	assert_null(strstr(slurp(file_of(&p, "/opencode.json")), TOKEN));
	agent_plan_free(&p);
	/* Kilo's PostHog telemetry is off unless KILO_TELEMETRY_LEVEL is "all". */
	build("kilo", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "KILO_TELEMETRY_LEVEL"), "off");
	agent_plan_free(&p);
}

static void test_qwen(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("qwen", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "OPENAI_BASE_URL"), EP "/v1");
	assert_string_equal(env_of(&p, "OPENAI_API_KEY"), TOKEN);
	assert_string_equal(env_of(&p, "OPENAI_MODEL"), MODEL);
	int i = arg_at(&p, "--auth-type");
	assert_true(i >= 0);
	assert_string_equal(p.args[i + 1], "openai");
	i = arg_at(&p, "--model");
	assert_true(i >= 0);
	assert_string_equal(p.args[i + 1], MODEL);
	agent_plan_free(&p);
	/* Qwen Code refuses a repeated flag: the user's own wins. */
	char *user[] = {"-m=mine", "--authType", "openai", "-p", "x"};
	build("qwen", &t, user, 5, &p);
	assert_int_equal(arg_at(&p, "--model"), -1);
	assert_int_equal(arg_at(&p, "--auth-type"), -1);
	agent_plan_free(&p);
}

/* --small: each agent with a second-model setting points it at the small
 * model, through the same endpoint and provider, with the small model's own
 * limits; the main model stays as it was. Agents without one refuse. */
#define SMALL "tiny \"fast\""
static void test_small_model(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	t.small_model_id = SMALL;
	t.small_context_length = 8192;
	t.small_max_output = 512;
	struct agent_plan p;

	build("claude", &t, NULL, 0, &p);
	json_t *j = load_json(file_of(&p, "/settings.json"));
	assert_string_equal(jstr(j, "env.ANTHROPIC_SMALL_FAST_MODEL"), SMALL);
	assert_string_equal(jstr(j, "env.ANTHROPIC_DEFAULT_HAIKU_MODEL"), SMALL);
	assert_string_equal(jstr(j, "env.ANTHROPIC_MODEL"), MODEL);
	assert_string_equal(jstr(j, "env.ANTHROPIC_DEFAULT_SONNET_MODEL"), MODEL);
	assert_string_equal(jstr(j, "env.CLAUDE_CODE_SUBAGENT_MODEL"), MODEL);
	assert_string_equal(jstr(j, "model"), MODEL);
	json_decref(j);
	check_private(&p);
	agent_plan_free(&p);

	build("codex", &t, NULL, 0, &p);
	const char *prof = file_of(&p, "/home/small.config.toml");
	assert_true(has_line(prof, "model = \"tiny \\\"fast\\\"\""));
	assert_true(has_line(prof, "model_context_window = 8192"));
	assert_null(strstr(slurp(prof), "model_max_output_tokens"));
	/* The profile only layers the model over config.toml's provider. */
	assert_null(strstr(slurp(prof), "model_provider"));
	const char *cfg = file_of(&p, "/home/config.toml");
	assert_true(has_line(cfg, "model = \"qwen3-4b \\\"q4\\\"\""));
	check_private(&p);
	agent_plan_free(&p);

	static const char *const oc[][2] = {
	    {"opencode", "/opencode.json"}, {"kilo", "/kilo.json"}, {"mimo", "/mimocode.json"}};
	for (size_t i = 0; i < 3; i++) {
		build(oc[i][0], &t, NULL, 0, &p);
		j = load_json(file_of(&p, oc[i][1]));
		assert_string_equal(jstr(j, "model"), "toki/" MODEL);
		assert_string_equal(jstr(j, "small_model"), "toki/" SMALL);
		assert_string_equal(jstr(j, "provider.toki.models.[" SMALL "].name"), SMALL);
		json_t *lim = json_object_get(
		    json_object_get(
		        json_object_get(json_object_get(json_object_get(j, "provider"), "toki"),
		                        "models"),
		        SMALL),
		    "limit");
		assert_int_equal(json_integer_value(json_object_get(lim, "context")), 8192);
		assert_int_equal(json_integer_value(json_object_get(lim, "output")), 512);
		json_decref(j);
		agent_plan_free(&p);
	}

	build("qwen", &t, NULL, 0, &p);
	const char *qs = file_of(&p, "/settings.json");
	assert_string_equal(env_of(&p, "QWEN_CODE_SYSTEM_SETTINGS_PATH"), qs);
	assert_string_equal(env_of(&p, "OPENAI_MODEL"), MODEL);
	j = load_json(qs);
	assert_string_equal(jstr(j, "fastModel"), SMALL);
	/* Qwen Code ignores a fastModel that modelProviders does not list. */
	assert_string_equal(jstr(j, "modelProviders.openai.0.id"), MODEL);
	assert_string_equal(jstr(j, "modelProviders.openai.1.id"), SMALL);
	assert_string_equal(jstr(j, "modelProviders.openai.1.baseUrl"), EP "/v1");
	assert_string_equal(jstr(j, "modelProviders.openai.1.envKey"), "OPENAI_API_KEY");
	assert_null(strstr(slurp(qs), TOKEN));
	json_decref(j);
	check_private(&p);
	agent_plan_free(&p);

	build("omp", &t, NULL, 0, &p);
	const char *m = file_of(&p, "/agent/models.yml");
	assert_true(has_line(m, "      - id: \"qwen3-4b \\\"q4\\\"\""));
	assert_true(has_line(m, "      - id: \"tiny \\\"fast\\\"\""));
	assert_true(has_line(m, "        contextWindow: 8192"));
	assert_true(has_line(m, "        maxTokens: 512"));
	const char *oc_cfg = file_of(&p, "/agent/config.yml");
	assert_true(has_line(oc_cfg, "setupVersion: 1"));
	assert_true(has_line(oc_cfg, "modelRoles:"));
	assert_true(has_line(oc_cfg, "  smol: \"toki/tiny \\\"fast\\\"\""));
	assert_string_equal(p.args[arg_at(&p, "--model") + 1], "toki/" MODEL);
	agent_plan_free(&p);

	/* Hermes: its text side tasks on the small model at the endpoint; the
	 * main model block unchanged, no vision or compression block. */
	build("hermes", &t, NULL, 0, &p);
	const char *hc = file_of(&p, "/home/config.yaml");
	assert_true(has_line(hc, "  default: \"qwen3-4b \\\"q4\\\"\""));
	assert_true(has_line(hc, "auxiliary:"));
	static const char *const aux[] = {"web_extract", "session_search", "title_generation"};
	for (size_t i = 0; i < 3; i++) {
		char head[64];
		snprintf(head, sizeof head, "  %s:", aux[i]);
		const char *at = strstr(slurp(hc), head);
		assert_non_null(at);
		assert_non_null(strstr(at, "    provider: \"custom\"\n"
		                           "    model: \"tiny \\\"fast\\\"\"\n"
		                           "    base_url: \"" EP "/v1\"\n"
		                           "    api_key: \"" TOKEN "\"\n"));
	}
	assert_null(strstr(slurp(hc), "  vision:"));
	assert_null(strstr(slurp(hc), "  compression:"));
	agent_plan_free(&p);

	/* OpenClaw: sub-agents on the small model, listed in the provider. */
	build("openclaw", &t, NULL, 0, &p);
	j = load_json(file_of(&p, "/openclaw.json"));
	assert_string_equal(jstr(j, "agents.defaults.model.primary"), "toki/" MODEL);
	assert_non_null(jstr(j, "agents.defaults.subagents.model.primary"));
	assert_string_equal(jstr(j, "agents.defaults.subagents.model.primary"), "toki/" SMALL);
	assert_string_equal(jstr(j, "models.providers.toki.models.0.id"), MODEL);
	assert_string_equal(jstr(j, "models.providers.toki.models.1.id"), SMALL);
	json_t *sm = json_array_get(
	    json_object_get(
	        json_object_get(json_object_get(json_object_get(j, "models"), "providers"), "toki"),
	        "models"),
	    1);
	assert_int_equal(json_integer_value(json_object_get(sm, "contextWindow")), 8192);
	assert_int_equal(json_integer_value(json_object_get(sm, "maxTokens")), 512);
	json_decref(j);
	agent_plan_free(&p);

	/* Without --small, Qwen Code gets no settings file and OMP no role. */
	t.small_model_id = NULL;
	build("qwen", &t, NULL, 0, &p);
	assert_int_equal(p.n_files, 1); /* env.sh */
	assert_null(env_of(&p, "QWEN_CODE_SYSTEM_SETTINGS_PATH"));
	agent_plan_free(&p);
	build("omp", &t, NULL, 0, &p);
	assert_null(strstr(slurp(file_of(&p, "/agent/config.yml")), "modelRoles"));
	agent_plan_free(&p);
	build("hermes", &t, NULL, 0, &p);
	assert_null(strstr(slurp(file_of(&p, "/home/config.yaml")), "auxiliary"));
	agent_plan_free(&p);
	build("openclaw", &t, NULL, 0, &p);
	assert_null(strstr(slurp(file_of(&p, "/openclaw.json")), "subagents"));
	agent_plan_free(&p);

	/* The rest have no second-model setting: the build refuses, naming the
	 * agents that take --small. */
	char names[256];
	agents_small_names(names, sizeof names);
	assert_string_equal(names,
	                    "claude, codex, opencode, qwen, mimo, hermes, openclaw, kilo, omp");
	t.small_model_id = SMALL;
	size_t n;
	const struct agent_def *all = agents_all(&n);
	size_t refused = 0;
	for (size_t i = 0; i < n; i++) {
		if (all[i].small_setting)
			continue;
		char err[512] = "";
		assert_int_equal(agents_build(&all[i], &t, NULL, 0, &p, err, sizeof err), -1);
		assert_non_null(strstr(err, "no setting for a second model"));
		assert_non_null(strstr(err, names));
		assert_int_equal(p.n_files, 0);
		refused++;
	}
	assert_int_equal(refused, n - 9);
}

static void test_droid(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("droid", &t, NULL, 0, &p);
	const char *cfg = file_of(&p, "/settings.json");
	int i = arg_at(&p, "--settings");
	assert_true(i >= 0);
	assert_string_equal(p.args[i + 1], cfg);
	json_t *j = load_json(cfg);
	assert_string_equal(jstr(j, "customModels.0.model"), MODEL);
	assert_string_equal(jstr(j, "customModels.0.baseUrl"), EP "/v1");
	assert_string_equal(jstr(j, "customModels.0.apiKey"), "${TOKI_API_KEY}");
	assert_string_equal(jstr(j, "customModels.0.provider"), "generic-chat-completion-api");
	assert_string_equal(jstr(j, "sessionDefaultSettings.model"), jstr(j, "customModels.0.id"));
	json_t *m0 = json_array_get(json_object_get(j, "customModels"), 0);
	assert_int_equal(json_integer_value(json_object_get(m0, "maxOutputTokens")), 4096);
	/* Droid knows the context, less the output budget. */
	assert_int_equal(json_integer_value(json_object_get(m0, "maxContextLimit")), 32768 - 4096);
	json_decref(j);
	assert_string_equal(env_of(&p, "TOKI_API_KEY"), TOKEN);
	assert_string_equal(env_of(&p, "FACTORY_AIRGAP_ENABLED"), "1"); /* no Sentry */
	assert_string_equal(env_of(&p, "FACTORY_DROID_AUTO_UPDATE_ENABLED"), "false");
	agent_plan_free(&p);
	/* A run without max_output: a quarter of the context (Droid's own
	 * 32000 would not fit it); one that is most of the context: half. */
	long outs[][2] = {{0, 8192}, {30000, 16384}};
	for (size_t k = 0; k < 2; k++) {
		t = target();
		t.max_output = outs[k][0];
		build("droid", &t, NULL, 0, &p);
		j = load_json(file_of(&p, "/settings.json"));
		m0 = json_array_get(json_object_get(j, "customModels"), 0);
		assert_int_equal(json_integer_value(json_object_get(m0, "maxOutputTokens")),
		                 outs[k][1]);
		assert_int_equal(json_integer_value(json_object_get(m0, "maxContextLimit")),
		                 32768 - outs[k][1]);
		json_decref(j);
		agent_plan_free(&p);
	}
}

static void test_cline(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("cline", &t, NULL, 0, &p);
	const char *cfg = file_of(&p, "/data/settings/providers.json");
	int i = arg_at(&p, "--data-dir");
	assert_true(i >= 0);
	char want[600];
	snprintf(want, sizeof want, "%s/agents/cline/data", state);
	assert_string_equal(p.args[i + 1], want);
	i = arg_at(&p, "--provider");
	assert_string_equal(p.args[i + 1], "openai-compatible");
	json_t *j = load_json(cfg);
	assert_string_equal(jstr(j, "lastUsedProvider"), "openai-compatible");
	assert_string_equal(jstr(j, "providers.openai-compatible.settings.provider"),
	                    "openai-compatible");
	assert_string_equal(jstr(j, "providers.openai-compatible.settings.baseUrl"), EP "/v1");
	assert_string_equal(jstr(j, "providers.openai-compatible.settings.model"), MODEL);
	assert_string_equal(jstr(j, "providers.openai-compatible.settings.apiKey"), TOKEN);
	/* Telemetry off, in its global settings next to the providers. */
	json_t *g = load_json(file_of(&p, "/data/settings/global-settings.json"));
	assert_true(json_is_true(json_object_get(g, "telemetryOptOut")));
	assert_true(json_is_false(json_object_get(g, "autoUpdateEnabled")));
	json_decref(g);
	/* What `cline auth` writes next to the settings, and Cline requires: an
	 * ISO datetime in UTC ("2026-12-01T13:31:41.130Z"). */
	const char *at = jstr(j, "providers.openai-compatible.updatedAt");
	assert_non_null(at);
	assert_int_equal(strlen(at), 24);
	assert_int_equal(strspn(at, "0123456789"), 4);
	assert_true(at[4] == '-' && at[7] == '-' && at[10] == 'T' && at[13] == ':' &&
	            at[16] == ':' && at[19] == '.' && at[23] == 'Z');
	assert_string_equal(jstr(j, "providers.openai-compatible.tokenSource"), "manual");
	json_decref(j);
	agent_plan_free(&p);
}

static void test_hermes(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("hermes", &t, NULL, 0, &p);
	const char *cfg = file_of(&p, "/home/config.yaml");
	char want[600];
	snprintf(want, sizeof want, "%s/agents/hermes/home", state);
	assert_string_equal(env_of(&p, "HERMES_HOME"), want);
	assert_true(has_line(cfg, "model:"));
	assert_true(has_line(cfg, "  default: \"qwen3-4b \\\"q4\\\"\""));
	assert_true(has_line(cfg, "  provider: \"custom\""));
	assert_true(has_line(cfg, "  base_url: \"" EP "/v1\""));
	assert_true(has_line(cfg, "  api_key: \"" TOKEN "\""));
	assert_true(has_line(cfg, "  context_length: 32768"));
	agent_plan_free(&p);
}

static void test_openclaw(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("openclaw", &t, NULL, 0, &p);
	const char *cfg = file_of(&p, "/openclaw.json");
	assert_string_equal(env_of(&p, "OPENCLAW_CONFIG_PATH"), cfg);
	assert_string_equal(env_of(&p, "TOKI_API_KEY"), TOKEN);
	json_t *j = load_json(cfg);
	assert_string_equal(jstr(j, "models.providers.toki.baseUrl"), EP "/v1");
	assert_string_equal(jstr(j, "models.providers.toki.api"), "openai-completions");
	assert_string_equal(jstr(j, "models.providers.toki.apiKey"), "${TOKI_API_KEY}");
	assert_string_equal(jstr(j, "models.providers.toki.models.0.id"), MODEL);
	assert_string_equal(jstr(j, "agents.defaults.model.primary"), "toki/" MODEL);
	json_decref(j);
	agent_plan_free(&p);
}

static void test_pi_and_omp(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("pi", &t, NULL, 0, &p);
	char want[600];
	snprintf(want, sizeof want, "%s/agents/pi/agent", state);
	assert_string_equal(env_of(&p, "PI_CODING_AGENT_DIR"), want);
	assert_string_equal(env_of(&p, "TOKI_API_KEY"), TOKEN);
	json_t *j = load_json(file_of(&p, "/agent/models.json"));
	assert_string_equal(jstr(j, "providers.toki.baseUrl"), EP "/v1");
	assert_string_equal(jstr(j, "providers.toki.api"), "openai-completions");
	assert_string_equal(jstr(j, "providers.toki.apiKey"), "TOKI_API_KEY");
	assert_string_equal(jstr(j, "providers.toki.models.0.id"), MODEL);
	json_decref(j);
	j = load_json(file_of(&p, "/agent/settings.json"));
	assert_string_equal(jstr(j, "defaultProvider"), "toki");
	assert_string_equal(jstr(j, "defaultModel"), MODEL);
	json_decref(j);
	int i = arg_at(&p, "--provider");
	assert_string_equal(p.args[i + 1], "toki");
	agent_plan_free(&p);

	build("omp", &t, NULL, 0, &p);
	snprintf(want, sizeof want, "%s/agents/omp/agent", state);
	assert_string_equal(env_of(&p, "PI_CODING_AGENT_DIR"), want);
	const char *m = file_of(&p, "/agent/models.yml");
	assert_true(has_line(m, "providers:"));
	assert_true(has_line(m, "  toki:"));
	assert_true(has_line(m, "    baseUrl: \"" EP "/v1\""));
	assert_true(has_line(m, "    api: \"openai-completions\""));
	assert_true(has_line(m, "    apiKey: \"TOKI_API_KEY\""));
	assert_true(has_line(m, "      - id: \"qwen3-4b \\\"q4\\\"\""));
	assert_true(has_line(file_of(&p, "/agent/config.yml"), "setupVersion: 1"));
	i = arg_at(&p, "--model");
	assert_string_equal(p.args[i + 1], "toki/" MODEL);
	agent_plan_free(&p);
}

static void test_dsh(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("dsh", &t, NULL, 0, &p);
	const char *s = file_of(&p, "/settings.yaml");
	assert_true(has_line(s, "agent-default-model:"));
	assert_true(has_line(s, "  provider: \"toki\""));
	assert_true(has_line(s, "llm-pi-ai:"));
	assert_true(has_line(s, "      apiKeyEnv: \"TOKI_API_KEY\""));
	assert_true(has_line(s, "      api: \"openai-completions\""));
	assert_true(has_line(s, "      baseURL: \"" EP "/v1\""));
	const char *patch = file_of(&p, "/toki.cordis.yml");
	assert_true(has_line(patch, "- id: settings"));
	char want[700];
	snprintf(want, sizeof want, "    path: \"%s\"", s);
	assert_true(has_line(patch, want));
	int i = arg_at(&p, "--patch");
	assert_string_equal(p.args[i + 1], patch);
	/* No arguments: the web profile, as `dsh web`. */
	i = arg_at(&p, "--profile");
	assert_string_equal(p.args[i + 1], "web");
	agent_plan_free(&p);
	char *user[] = {"--profile", "headless", "job"};
	build("dsh", &t, user, 3, &p);
	assert_int_equal(arg_at(&p, "--profile"), -1);
	agent_plan_free(&p);
}

static void test_env_only_agents(void **ctx)
{
	(void)ctx;
	struct agent_target t = target();
	struct agent_plan p;
	build("grok", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "GROK_MODELS_BASE_URL"), EP "/v1");
	assert_string_equal(env_of(&p, "GROK_DEFAULT_MODEL"), MODEL);
	assert_string_equal(env_of(&p, "XAI_API_KEY"), TOKEN);
	agent_plan_free(&p);
	build("copilot", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_BASE_URL"), EP "/v1");
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_TYPE"), "openai");
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_API_KEY"), TOKEN);
	assert_string_equal(env_of(&p, "COPILOT_MODEL"), MODEL);
	assert_string_equal(env_of(&p, "COPILOT_OFFLINE"), "true");
	/* The prompt cap leaves the output budget free: 32768 - 4096. */
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_MAX_PROMPT_TOKENS"), "28672");
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS"), "4096");
	agent_plan_free(&p);
	/* No max_output on the run: a quarter of the context. */
	struct agent_target t2 = target();
	t2.max_output = 0;
	build("copilot", &t2, NULL, 0, &p);
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_MAX_PROMPT_TOKENS"), "24576");
	assert_string_equal(env_of(&p, "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS"), "8192");
	agent_plan_free(&p);
	build("kimi", &t, NULL, 0, &p);
	assert_string_equal(env_of(&p, "KIMI_MODEL_NAME"), MODEL);
	assert_string_equal(env_of(&p, "KIMI_MODEL_API_KEY"), TOKEN);
	assert_string_equal(env_of(&p, "KIMI_MODEL_PROVIDER_TYPE"), "openai");
	assert_string_equal(env_of(&p, "KIMI_MODEL_BASE_URL"), EP "/v1");
	assert_string_equal(env_of(&p, "KIMI_MODEL_MAX_CONTEXT_SIZE"), "32768");
	agent_plan_free(&p);
	build("toki", &t, NULL, 0, &p);
	assert_string_equal(p.exe, "/usr/local/bin/toki");
	assert_string_equal(p.args[0], "tui");
	assert_string_equal(p.args[1], "--url");
	assert_string_equal(p.args[2], EP);
	assert_null(p.dir);
	assert_int_equal(p.n_files, 0);
	agent_plan_free(&p);
}

static void test_quoting_and_private_write(void **ctx)
{
	(void)ctx;
	char *q = agents_toml_string("a\"b\\c\nd");
	assert_string_equal(q, "\"a\\\"b\\\\c\\u000ad\"");
	free(q);
	q = agents_shell_quote("it's");
	assert_string_equal(q, "'it'\\''s'");
	free(q);
	char path[600], link_path[600], err[256];
	snprintf(path, sizeof path, "%s/f", state);
	assert_int_equal(agents_write_private(path, "x", 1, err, sizeof err), 0);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	/* A symbolic link at the path is not followed. */
	snprintf(link_path, sizeof link_path, "%s/l", state);
	assert_int_equal(symlink(path, link_path), 0);
	assert_int_equal(agents_write_private(link_path, "y", 1, err, sizeof err), -1);
	assert_non_null(strstr(err, "not a regular file"));
	assert_string_equal(slurp(path), "x");
	/* A missing target is refused before anything is written. */
	struct agent_target t = target();
	t.model_id = NULL;
	struct agent_plan p;
	assert_int_equal(agents_build(agents_find("codex"), &t, NULL, 0, &p, err, sizeof err), -1);
	assert_null(p.dir);
}

static void test_which(void **ctx)
{
	(void)ctx;
	char *p = agents_which("sh");
	assert_non_null(p);
	free(p);
	assert_null(agents_which("no-such-agent-binary-xyz"));
	const char *old = getenv("PATH");
	char *saved = old ? strdup(old) : NULL;
	setenv("PATH", state, 1);
	assert_null(agents_which("sh"));
	if (saved)
		setenv("PATH", saved, 1);
	free(saved);
	setenv("TOKI_PROFILE", "cpu", 1);
	assert_int_equal(agents_detect_cpu_profile(), 1);
	setenv("TOKI_PROFILE", "gpu", 1);
	assert_int_equal(agents_detect_cpu_profile(), 0);
	unsetenv("TOKI_PROFILE");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_every_agent_is_private, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_names_and_aliases, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_claude, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_claude_cpu_timeouts, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cpu_timeouts_every_agent, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_claude_knobs, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_codex, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_opencode_family, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_qwen, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_small_model, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_droid, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cline, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_hermes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_openclaw, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pi_and_omp, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_dsh, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_env_only_agents, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_quoting_and_private_write, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_which, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
