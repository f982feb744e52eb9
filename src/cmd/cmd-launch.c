/* toki launch [<agent>] [--model RUN] [--small MODEL] [--config] [-- <agent args>]: a coding
 * agent pinned to the local model. The agents, and how each is pinned, are
 * the table in src/launch/agents.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/auth.h"
#include "cmd/cmd.h"
#include "launch/agents.h"
#include "platform/platform.h"
#include "util/paths.h"

extern char **environ;

/* `toki tui`, once it exists, is linked into this binary: a weak reference
 * tells whether it is. */
int cmd_tui(int argc, char **argv) __attribute__((weak));

static const char *api_name(enum agent_api api)
{
	switch (api) {
	case AGENT_API_OPENAI_CHAT:
		return "OpenAI chat";
	case AGENT_API_OPENAI_RESPONSES:
		return "OpenAI Responses";
	case AGENT_API_ANTHROPIC:
		return "Anthropic";
	case AGENT_API_TOKI:
		return "toki";
	}
	return "?";
}

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: toki launch [<agent>] [--model RUN] [--small MODEL] [--config]\n"
	    "                   [-- <agent args>]\n"
	    "\n"
	    "Starts a coding agent pinned to the local model: the running model (the active\n"
	    "one, or the only run), or the run named by --model. Each agent is pointed at\n"
	    "toki through its own documented mechanism; its override files are written\n"
	    "owner-only under $TOKI_STATE_DIR/agents/<agent>/ and your own configuration\n"
	    "files are never edited. Without an agent, lists the agents and whether each\n"
	    "is installed.\n"
	    "\n"
	    "  --model RUN   pin to this run (toki status lists them)\n"
	    "  --small MODEL point the agent's background/small/fast model at another\n"
	    "                registry model, through the same endpoint (toki up without\n"
	    "                --model): Claude Code, Codex (its profile 'small': codex\n"
	    "                --profile small), OpenCode, Qwen Code, MiMo Code, Kilo Code, OMP\n"
	    "  --config      write the configuration and print where and how to use it,\n"
	    "                without starting the agent\n"
	    "  -- ARGS       passed to the agent after the arguments toki adds\n"
	    "\n"
	    "Claude Code knobs (environment): TOKI_CLAUDE_BARE=1 (--bare), TOKI_CLAUDE_MCP=none\n"
	    "(no MCP servers), TOKI_CLAUDE_EFFORT=low|medium|high|xhigh|max,\n"
	    "TOKI_CLAUDE_TIMEOUT_MS=N (API and stream-idle timeouts).\n"
	    "Request timeouts: 30 min on a machine without a GPU for every agent that has\n"
	    "one (Claude Code, Codex, OpenCode, Kilo Code, MiMo Code, OpenClaw);\n"
	    "TOKI_AGENT_TIMEOUT_MS=N sets them on any machine. TOKI_PROFILE=cpu|gpu skips\n"
	    "the GPU probe.\n"
	    "docs/agents.md says how each agent is pinned and where that is documented.\n");
}

static int installed(const struct agent_def *a, char **path)
{
	*path = NULL;
	if (a->api == AGENT_API_TOKI)
		return cmd_tui != NULL;
	*path = agents_which(a->binary);
	return *path != NULL;
}

static int list_agents(void)
{
	size_t n;
	const struct agent_def *all = agents_all(&n);
	printf("%-9s %-19s %-17s %-9s %s\n", "AGENT", "NAME", "API", "INSTALLED",
	       "PATH / HOW TO INSTALL");
	for (size_t i = 0; i < n; i++) {
		char *path;
		int ok = installed(&all[i], &path);
		printf("%-9s %-19s %-17s %-9s %s\n", all[i].name, all[i].display,
		       api_name(all[i].api), ok ? "yes" : "no",
		       ok ? (path ? path : "toki tui") : all[i].install);
		free(path);
	}
	printf("\ntoki launch <agent> [-- args] starts one; aliases: claude-code, qwen-code, "
	       "kilo-code, ... (docs/agents.md)\n");
	return 0;
}

/* Prints a value with the token masked, for the --config summary. */
static void print_masked(const char *value, const char *token)
{
	const char *hit = *token ? strstr(value, token) : NULL;
	if (!hit) {
		printf("%s", value);
		return;
	}
	printf("%.*s<the local token>", (int)(hit - value), value);
	print_masked(hit + strlen(token), token);
}

static void print_config(const struct agent_def *a, const struct agent_plan *plan,
                         const char *token, char *const *user_args, size_t n_user, int have_binary)
{
	printf("%s is pinned to the local model; toki wrote:\n", a->display);
	for (size_t i = 0; i < plan->n_files; i++)
		printf("  %s\n", plan->files[i]);
	if (plan->n_env_set || plan->n_env_unset) {
		printf("environment:\n");
		for (size_t i = 0; i < plan->n_env_unset; i++)
			printf("  unset %s\n", plan->env_unset[i]);
		for (size_t i = 0; i < plan->n_env_set; i++) {
			printf("  ");
			print_masked(plan->env_set[i], token);
			printf("\n");
		}
	}
	printf("start it with:\n  ");
	if (plan->dir)
		printf(". %s/env.sh && ", plan->dir);
	printf("%s", plan->exe);
	for (size_t i = 0; i < plan->n_args; i++)
		printf(" %s", plan->args[i]);
	for (size_t i = 0; i < n_user; i++)
		printf(" %s", user_args[i]);
	printf("\n");
	if (!have_binary)
		printf("(%s is not installed: %s)\n", a->binary, a->install);
}

int cmd_launch(int argc, char **argv)
{
	const char *agent_name = NULL, *run = NULL, *small = NULL;
	int config_only = 0;
	char **user_args = NULL;
	size_t n_user = 0;
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (!strcmp(s, "--")) {
			user_args = argv + i + 1;
			n_user = (size_t)(argc - i - 1);
			break;
		} else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(s, "--config")) {
			config_only = 1;
		} else if (!strcmp(s, "--model") && i + 1 < argc) {
			run = argv[++i];
		} else if (!strncmp(s, "--model=", 8)) {
			run = s + 8;
		} else if (!strcmp(s, "--small") && i + 1 < argc) {
			small = argv[++i];
		} else if (!strncmp(s, "--small=", 8)) {
			small = s + 8;
		} else if (s[0] != '-' && !agent_name) {
			agent_name = s;
		} else {
			fprintf(stderr, "toki launch: unexpected argument '%s'\n", s);
			usage(stderr);
			return 2;
		}
	}
	if (!agent_name) {
		if (run || small || config_only || n_user) {
			fprintf(stderr, "toki launch: name the agent (toki launch lists them)\n");
			return 2;
		}
		return list_agents();
	}
	const struct agent_def *a = agents_find(agent_name);
	if (!a) {
		fprintf(stderr, "toki launch: no agent '%s'; toki launch lists them\n", agent_name);
		return 2;
	}
	if (small && (!*small || !a->small_setting)) {
		char names[256];
		agents_small_names(names, sizeof names);
		if (!*small)
			fprintf(stderr, "toki launch: --small needs a registry model's name\n");
		else
			fprintf(stderr,
			        "toki launch: %s has no setting for a second model, so --small "
			        "cannot pin one; agents that take --small: %s (docs/agents.md)\n",
			        a->display, names);
		return 2;
	}
	char *bin_path = NULL;
	int have_binary = installed(a, &bin_path);
	if (!have_binary && a->api == AGENT_API_TOKI) {
		fprintf(stderr, "toki launch: %s (toki tui) is not built into this toki\n",
		        a->display);
		return 1;
	}
	if (!have_binary && !config_only) {
		fprintf(stderr,
		        "toki launch: %s is not installed (no '%s' on PATH); install it with:\n"
		        "  %s\n",
		        a->display, a->binary, a->install);
		return 1;
	}

	struct agent_target t = {0};
	char state[4096], endpoint[512], run_name[200], token[256], err[2048];
	char self[4096];
	if (paths_state_dir(state, sizeof state) != 0) {
		fprintf(stderr, "toki launch: the state directory's path is too long\n");
		free(bin_path);
		return 1;
	}
	if (agents_resolve_run(run, endpoint, sizeof endpoint, run_name, sizeof run_name, err,
	                       sizeof err) != 0 ||
	    auth_load_token(token, sizeof token, err, sizeof err) != 0) {
		fprintf(stderr, "toki launch: %s\n", err);
		free(bin_path);
		return 1;
	}
	char *model_id = NULL;
	if (agents_fetch_model(endpoint, run_name, &model_id, &t.context_length, &t.max_output, err,
	                       sizeof err) != 0) {
		fprintf(stderr, "toki launch: %s\n", err);
		free(bin_path);
		return 1;
	}
	char *small_id = NULL;
	if (small && agents_fetch_small(endpoint, small, &small_id, &t.small_context_length,
	                                &t.small_max_output, err, sizeof err) != 0) {
		fprintf(stderr, "toki launch: %s\n", err);
		free(model_id);
		free(bin_path);
		return 1;
	}
	t.small_model_id = small_id;
	int have_self = plat_self_exe(self, sizeof self) == 0;
	t.endpoint = endpoint;
	/* The run's name is the model id agents are given: it is what a run
	 * serves (llama-server's --alias), and toki routes an id it does not
	 * know (a run started before that, which serves the GGUF's path) to the
	 * run's backend all the same. The path, with the user's home directory
	 * in it, stays out of agents' configs, sessions and telemetry. */
	t.model_id = run_name;
	t.token = token;
	t.state_dir = state;
	t.toki_exe = have_self ? self : NULL;
	/* Every agent with a request timeout gets a longer one on a machine
	 * without a GPU (docs/agents.md lists them). */
	t.cpu_profile = a->api != AGENT_API_TOKI ? agents_detect_cpu_profile() : 0;
	agents_target_knobs(&t);

	struct agent_plan plan;
	if (agents_build(a, &t, user_args, n_user, &plan, err, sizeof err) != 0) {
		fprintf(stderr, "toki launch: %s\n", err);
		free(small_id);
		free(model_id);
		free(bin_path);
		return 1;
	}
	for (size_t i = 0; i < plan.n_warnings; i++)
		fprintf(stderr, "toki launch: warning: %s\n", plan.warnings[i]);
	int rc = 0;
	if (config_only) {
		print_config(a, &plan, token, user_args, n_user, have_binary);
	} else {
		char **av = agents_argv(&plan, user_args, n_user);
		char **ev = agents_envp(&plan, environ);
		const char *path = bin_path ? bin_path : plan.exe;
		if (!av || !ev) {
			fprintf(stderr, "toki launch: out of memory\n");
		} else {
			fprintf(stderr, "toki launch: %s on %s%s%s (%s)\n", a->display, run_name,
			        small_id ? ", small model " : "", small_id ? small_id : "",
			        endpoint);
			fflush(NULL);
			execve(path, av, ev);
			fprintf(stderr, "toki launch: cannot run %s: %s\n", path, strerror(errno));
		}
		free(av);
		free(ev);
		rc = 1;
	}
	agent_plan_free(&plan);
	free(small_id);
	free(model_id);
	free(bin_path);
	return rc;
}
